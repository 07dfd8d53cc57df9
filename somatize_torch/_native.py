"""The Python face of somatize's native code (the ``csrc/`` sources).

The native builds, each made on first use and cached on disk, are modules of
their own; every name other code uses is imported from here:

* the **host library**, with the kernel emulator that runs the CUDA kernels on
  the host for tests (:mod:`somatize_torch._host_library`);
* the **CUDA extension** (:mod:`somatize_torch._cuda_extension`), and the pinned
  staging pool over its page-locked buffers (:mod:`somatize_torch._pinned_pool`);
* what they share: the switches, where sources and builds live, the errors
  (:mod:`somatize_torch._native_env`).

The environment variable ``SOMATIZE_NATIVE`` selects the policy: ``1`` forces
native code (building it or raising :class:`NativeUnavailableError`), ``0``
disables it (:func:`cuda_extension` returns ``None``, :func:`host_library`
raises), anything else tries and quietly falls back. Builds are cached under
``$SOMATIZE_EXT_CACHE`` or ``~/.cache/somatize/ext`` (with no home directory,
``somatize-<uid>/ext`` in the temporary directory), keyed by a digest of the
sources and the toolchain.

Importing this module touches neither torch nor CUDA; every check runs lazily
inside the functions.
"""

from __future__ import annotations

from somatize_torch._cuda_extension import (
    cuda_extension,
    device_digest,
    device_digest_rows,
    device_digest_rows_queued,
)
from somatize_torch._host_library import (
    build_host_library,
    build_kernel_emulator,
    host_digest,
    host_digest_rows,
    host_library,
    kernel_emulator,
    ready_host_library,
)
from somatize_torch._native_env import (
    ENV_CACHE,
    ENV_MODE,
    NativeDisabledError,
    NativeUnavailableError,
    cache_dir,
    csrc_dir,
    native_mode,
)
from somatize_torch._pinned_pool import PinnedPool, PoolStats, StagedCopy

__all__ = [
    "ENV_CACHE",
    "ENV_MODE",
    "NativeDisabledError",
    "NativeUnavailableError",
    "PinnedPool",
    "PoolStats",
    "StagedCopy",
    "build_host_library",
    "build_kernel_emulator",
    "cache_dir",
    "csrc_dir",
    "cuda_extension",
    "device_digest",
    "device_digest_rows",
    "device_digest_rows_queued",
    "host_digest",
    "host_digest_rows",
    "host_library",
    "kernel_emulator",
    "native_mode",
    "ready_host_library",
]
