"""The CUDA extension: ``csrc/blake3_cuda.cu`` + ``csrc/torch_ops.cpp`` +
``csrc/pinned_pool.cpp``, JIT-built with :func:`torch.utils.cpp_extension.load`
when torch has CUDA and a device is present. It digests CUDA tensors in device
memory and allocates exact-size page-locked host buffers.

Where the extension is not to be had its functions answer ``None`` (unless
``SOMATIZE_NATIVE=1``), so each caller keeps a path of its own without it: the
digest on the host, torch's pinned allocator.
"""

from __future__ import annotations

import os
import platform
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Final

from somatize_torch import _native_env
from somatize_torch._native_env import (
    DIGEST_SIZE,
    ENV_MODE,
    NativeUnavailableError,
    _log_once,
    _sources_key,
    cache_dir,
    csrc_dir,
    native_mode,
)

if TYPE_CHECKING:
    import torch

__all__ = ["cuda_extension", "device_digest", "device_digest_rows", "device_digest_rows_queued"]

_CUDA_HEADERS: Final = ("blake3_tree.h", "blake3_cuda.h", "blake3_kernels.cuh")
_CUDA_UNITS: Final = ("blake3_cuda.cu", "torch_ops.cpp", "pinned_pool.cpp")

_ext_tried = False
_ext_module: ModuleType | None = None
_ext_error: BaseException | None = None


def _build_cuda_extension() -> ModuleType:
    import torch

    if torch.version.cuda is None:
        raise NativeUnavailableError("torch is built without CUDA")
    if not torch.cuda.is_available():
        raise NativeUnavailableError("no CUDA device available")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise NativeUnavailableError("CUDA toolkit not found (CUDA_HOME / nvcc)")
    src = csrc_dir()
    key = _sources_key(
        src,
        _CUDA_HEADERS + _CUDA_UNITS,
        torch.__version__,
        str(torch.version.cuda),
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        platform.machine(),
        os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
    )
    build_dir = cache_dir() / f"torch-{key[:16]}"
    build_dir.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=f"somatize_native_{key[:16]}",
        sources=[str(src / name) for name in _CUDA_UNITS],
        extra_include_paths=[str(src)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],
        build_directory=str(build_dir),
        verbose=False,
    )
    if not isinstance(module, ModuleType):
        raise NativeUnavailableError("cpp_extension.load did not return a module")
    return module


def cuda_extension() -> ModuleType | None:
    """The JIT-built CUDA extension, or ``None`` when it is disabled or unavailable.

    With ``SOMATIZE_NATIVE=1`` a failure raises :class:`NativeUnavailableError`
    instead. The first attempt's outcome is remembered for the process.
    """
    global _ext_tried, _ext_module, _ext_error
    mode = native_mode()
    if mode == "off":
        _log_once("ext-off", "native CUDA path disabled by %s=0; using the pure path", ENV_MODE)
        return None
    with _native_env._lock:
        if not _ext_tried:
            try:
                _ext_module = _build_cuda_extension()
                _ext_error = None
            except Exception as exc:  # any build/load failure means "fall back"
                _ext_module = None
                _ext_error = exc
            _ext_tried = True
        module, error = _ext_module, _ext_error
    if module is not None:
        _log_once("ext-on", "native CUDA extension active: %s", module.__name__)
        return module
    if mode == "on":
        raise NativeUnavailableError(
            f"{ENV_MODE}=1 but the CUDA extension is unavailable: {error}"
        ) from error
    _log_once("ext-none", "native CUDA extension unavailable (%s); using the pure path", error)
    return None


def _as_byte_vector(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in row-major order as a contiguous 1-D uint8 tensor."""
    import torch

    from somatize_torch.digest import dense

    t = dense(tensor.detach().resolve_conj().resolve_neg().contiguous())
    return t.reshape(-1).view(torch.uint8)


def _byte_rows(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a batch of at least one row as a contiguous 2-D ``uint8`` tensor, one
    row of bytes per ``tensor[i]``."""
    flat = _as_byte_vector(tensor)
    rows = int(tensor.shape[0])
    return flat.reshape(rows, flat.numel() // rows)


def _cpu_bytes(tensor: torch.Tensor) -> bytes:
    try:
        return bytes(tensor.contiguous().numpy().tobytes())
    except (ImportError, RuntimeError, TypeError):
        return bytes(tensor.reshape(-1).tolist())


def device_digest(tensor: torch.Tensor) -> bytes | None:
    """BLAKE3 of a CUDA tensor's bytes (row-major), computed on the device.

    ``None`` when the tensor is not on a CUDA device or the extension is not
    available; the caller then digests on the host.
    """
    if not tensor.is_cuda:
        return None
    ext = cuda_extension()
    if ext is None:
        return None
    out = ext.blake3_digest(_as_byte_vector(tensor))
    return _cpu_bytes(out)


def device_digest_rows(tensor: torch.Tensor) -> list[bytes] | None:
    """One BLAKE3 digest per ``tensor[i]`` (bytes in row-major order), on the device.

    ``None`` under the same conditions as :func:`device_digest`.
    """
    if not tensor.is_cuda:
        return None
    if tensor.dim() == 0:
        raise ValueError("device_digest_rows needs a tensor with at least one dimension")
    ext = cuda_extension()
    if ext is None:
        return None
    rows = int(tensor.shape[0])
    if rows == 0:
        return []
    out = ext.blake3_digest_rows(_byte_rows(tensor))
    raw = _cpu_bytes(out)
    return [raw[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE] for i in range(rows)]


def device_digest_rows_queued(tensor: torch.Tensor) -> torch.Tensor | None:
    """The digests of :func:`device_digest_rows` as a CUDA ``uint8`` tensor ``[rows, 32]``,
    queued on the current stream of the tensor's device and not waited for.

    ``None`` under the same conditions as :func:`device_digest`, and for a batch of no rows.
    """
    if not tensor.is_cuda or tensor.dim() == 0 or tensor.shape[0] == 0:
        return None
    ext = cuda_extension()
    if ext is None:
        return None
    out: torch.Tensor = ext.blake3_digest_rows_async(_byte_rows(tensor))
    return out
