"""The Python face of somatize's native code (the ``csrc/`` sources).

Two native builds exist, both made on first use and cached on disk:

* the **host library** (``csrc/blake3_host.cpp``), a small C ABI compiled with
  the system C++ compiler and loaded through :mod:`ctypes`. It is the reference
  for the tree logic the CUDA kernels share and runs everywhere;
* the **CUDA extension** (``csrc/blake3_cuda.cu`` + ``csrc/torch_ops.cpp`` +
  ``csrc/pinned_pool.cpp``), JIT-built with :func:`torch.utils.cpp_extension.load`
  when torch has CUDA and a device is present. It digests CUDA tensors in
  device memory and allocates exact-size page-locked host buffers;
* the **kernel emulator** (``csrc/blake3_kernel_emu.cpp``), the CUDA kernels
  compiled for the host and run on emulated threads, so tests exercise the
  device code without a GPU.

The environment variable ``SOMATIZE_NATIVE`` selects the policy: ``1`` forces
native code (building it or raising :class:`NativeUnavailableError`), ``0``
disables it (:func:`cuda_extension` returns ``None``, :func:`host_library`
raises), anything else tries and quietly falls back. Builds are cached under
``$SOMATIZE_EXT_CACHE`` or ``~/.cache/somatize/ext``, keyed by a digest of the
sources and the toolchain.

Importing this module touches neither torch nor CUDA; every check runs lazily
inside the functions.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import torch

    Buffer = bytes | bytearray | memoryview | torch.Tensor

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
    "host_digest",
    "host_digest_rows",
    "host_library",
    "kernel_emulator",
    "native_mode",
    "ready_host_library",
]

logger = logging.getLogger("somatize_torch.native")

ENV_MODE: Final = "SOMATIZE_NATIVE"
ENV_CACHE: Final = "SOMATIZE_EXT_CACHE"
DIGEST_SIZE: Final = 32

_HOST_SOURCES: Final = ("blake3_tree.h", "blake3_lanes.h", "blake3_host.cpp")
_HOST_FLAGS: Final = ("-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-Wno-psabi")
_EMU_SOURCES: Final = (
    "blake3_tree.h",
    "blake3_cuda.h",
    "blake3_kernels.cuh",
    "blake3_kernel_emu.cpp",
)
_EMU_FLAGS: Final = ("-O2", "-std=c++20", "-pthread", "-shared", "-fPIC", "-Wno-unknown-pragmas")
_CUDA_HEADERS: Final = ("blake3_tree.h", "blake3_cuda.h", "blake3_kernels.cuh")
_CUDA_UNITS: Final = ("blake3_cuda.cu", "torch_ops.cpp", "pinned_pool.cpp")

_lock = threading.RLock()
_logged: set[str] = set()
_host_libs: dict[Path, ctypes.CDLL] = {}
_background: dict[Path, threading.Thread] = {}
_ready: dict[tuple[str | None, ...], ctypes.CDLL] = {}
_background_lock = threading.Lock()
_emulators: dict[Path, ctypes.CDLL] = {}
_ext_tried = False
_ext_module: ModuleType | None = None
_ext_error: BaseException | None = None


def _after_fork_in_child() -> None:
    """A forked child starts with its own locks (one a parent's thread held during a build
    would stay held), with no build under way, and with no row-hashing worker (the
    parent's threads are not there)."""
    global _lock, _background_lock
    _lock = threading.RLock()
    _background_lock = threading.Lock()
    _background.clear()
    for lib in _host_libs.values():
        lib.smz_blake3_host_rows_forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class NativeUnavailableError(RuntimeError):
    """Native code was required but could not be built or loaded."""


class NativeDisabledError(NativeUnavailableError):
    """Native code is switched off with ``SOMATIZE_NATIVE=0``."""


def _log_once(key: str, message: str, *args: object) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.debug(message, *args)


def native_mode() -> str:
    """``"on"`` (``SOMATIZE_NATIVE=1``), ``"off"`` (``=0``) or ``"auto"``."""
    value = os.environ.get(ENV_MODE, "").strip()
    if value == "1":
        return "on"
    if value == "0":
        return "off"
    return "auto"


def csrc_dir() -> Path:
    """Directory holding the native sources: ``csrc/`` inside the package, where the
    wheel ships them."""
    found = Path(__file__).resolve().parent / "csrc"
    if (found / "blake3_tree.h").is_file():
        return found
    raise NativeUnavailableError(f"native sources not found in {found}")


def cache_dir() -> Path:
    """Build cache: ``$SOMATIZE_EXT_CACHE`` or ``~/.cache/somatize/ext``."""
    configured = os.environ.get(ENV_CACHE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "somatize" / "ext"


def _sources_key(src: Path, names: tuple[str, ...], *extra: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in names:
        h.update(name.encode())
        h.update(b"\0")
        h.update((src / name).read_bytes())
        h.update(b"\0")
    for item in extra:
        h.update(item.encode())
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- host library


def _host_compiler() -> str:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise NativeUnavailableError("no C++ compiler found (set CXX)")


def _build_shared(
    directory: Path | None, sources: tuple[str, ...], flags: tuple[str, ...], stem: str
) -> Path:
    """Compile ``sources[-1]`` (the other names are the headers it includes) into a
    shared library in ``directory`` unless a build of the same sources, flags and
    compiler is already there. The compiler writes a temporary file in the same
    directory that is then renamed into place, so concurrent builders never
    expose a partial file."""
    src = csrc_dir()
    cxx = _host_compiler()
    try:
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailableError(f"cannot run {cxx}: {exc}") from exc
    key = _sources_key(
        src, sources, cxx, version, " ".join(flags), platform.machine(), sys.platform
    )
    target_dir = directory if directory is not None else cache_dir()
    target = target_dir / f"{stem}-{key[:24]}.so"
    if target.is_file():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    _sweep(target_dir, stem)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [cxx, *flags, f"-I{src}", str(src / sources[-1]), "-o", str(tmp)]
        if shutil.which("sh"):
            # The shell moves the library into place itself, so that a build started in
            # the background lands even when this process exits before it ends.
            script = 'tmp="$1"; to="$2"; shift 2; "$@" && chmod 755 "$tmp" && mv -f "$tmp" "$to"'
            cmd = ["sh", "-c", script, "sh", str(tmp), str(target), *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise NativeUnavailableError(
                f"native build failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}"
            )
        if tmp.exists():
            tmp.chmod(0o755)
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _log_once(f"built:{target}", "built native library %s", target)
    return target


_STALE_BUILD_S: Final = 3600.0
"""A temporary file of a build this old was left by a build that never ended (a
process killed mid-compile); a build takes seconds."""


def _sweep(directory: Path, stem: str) -> None:
    """Removes what builds of ``stem`` killed mid-compile left in ``directory``."""
    now = time.time()
    for left in directory.glob(f".{stem}-*.tmp"):
        try:
            if now - left.stat().st_mtime > _STALE_BUILD_S:
                left.unlink()
        except OSError:
            pass  # gone already, or another builder's to deal with


def build_host_library(directory: Path | None = None) -> Path:
    """Build the host library into ``directory`` (default :func:`cache_dir`) unless an
    identical build is already there; return its path. Safe to run concurrently."""
    return _build_shared(directory, _HOST_SOURCES, _HOST_FLAGS, "libsmz_blake3_host")


def build_kernel_emulator(directory: Path | None = None) -> Path:
    """Build the host emulation of the CUDA kernels (``blake3_kernel_emu.cpp``, C++20);
    test support, see :func:`kernel_emulator`."""
    return _build_shared(directory, _EMU_SOURCES, _EMU_FLAGS, "libsmz_blake3_emu")


def _bind_host(lib: ctypes.CDLL) -> None:
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64
    lib.smz_blake3_host_abi_version.argtypes = []
    lib.smz_blake3_host_abi_version.restype = ctypes.c_int
    lib.smz_blake3_host_coop_selftest.argtypes = []
    lib.smz_blake3_host_coop_selftest.restype = ctypes.c_int
    for name in ("smz_blake3_host", "smz_blake3_host_levelwise"):
        fn = getattr(lib, name)
        fn.argtypes = [vp, u64, vp]
        fn.restype = None
    lib.smz_blake3_host_lane_width.argtypes = []
    lib.smz_blake3_host_lane_width.restype = ctypes.c_int
    lib.smz_blake3_host_rows_width.argtypes = [vp, u64, u64, vp, ctypes.c_int]
    lib.smz_blake3_host_rows_width.restype = ctypes.c_int
    lib.smz_blake3_host_rows_begin.argtypes = [vp, u64, u64, vp]
    lib.smz_blake3_host_rows_begin.restype = vp
    lib.smz_blake3_host_rows_wait.argtypes = [vp, ctypes.c_int]
    lib.smz_blake3_host_rows_wait.restype = None
    lib.smz_blake3_host_rows_forked.argtypes = []
    lib.smz_blake3_host_rows_forked.restype = None
    for name in (
        "smz_blake3_host_rows",
        "smz_blake3_host_streaming",
        "smz_blake3_host_emulate_rows",
    ):
        fn = getattr(lib, name)
        fn.argtypes = [vp, u64, u64, vp]
        fn.restype = None


def host_library() -> ctypes.CDLL:
    """The host library (built on first use, cached per cache directory).

    Raises :class:`NativeDisabledError` under ``SOMATIZE_NATIVE=0`` and
    :class:`NativeUnavailableError` when it cannot be built.
    """
    if native_mode() == "off":
        _log_once("host-off", "native host library disabled by %s=0", ENV_MODE)
        raise NativeDisabledError(f"native code disabled by {ENV_MODE}=0")
    directory = cache_dir()
    with _lock:
        lib = _host_libs.get(directory)
        if lib is None:
            try:
                path = build_host_library(directory)
                lib = ctypes.CDLL(str(path))
            except OSError as why:  # the cache not writable, the library not loadable
                raise NativeUnavailableError(
                    f"the native host library could not be built or loaded in {directory} "
                    f"({why}); set {ENV_CACHE} to a writable directory"
                ) from why
            _bind_host(lib)
            _host_libs[directory] = lib
            _log_once("host-on", "native host library active: %s", path)
    return lib


def ready_host_library() -> ctypes.CDLL | None:
    """The host library if it can be had without waiting for a compiler, else None.

    For callers on a hot path (digesting the rows of every batch), which must not stall
    on a first build: under the default policy the first call that finds no library
    starts building it on a background thread and returns None, so the caller takes
    its pure path until the build lands; later calls return it (a failed build is not
    retried, and leaves the pure path in place). ``SOMATIZE_NATIVE=1`` builds it here,
    and ``=0`` always returns None.
    """
    switches = tuple(os.environ.get(name) for name in (ENV_MODE, ENV_CACHE, "HOME"))
    lib = _ready.get(switches)
    if lib is not None:
        return lib
    mode = native_mode()
    if mode == "off":
        return None
    directory = cache_dir()
    lib = _host_libs.get(directory)
    if lib is not None or mode == "on":
        _ready[switches] = lib = lib if lib is not None else host_library()
        return lib
    with _background_lock:
        if directory not in _background:
            build = threading.Thread(
                target=_build_in_background, name="somatize-native-build", daemon=True
            )
            _background[directory] = build
            build.start()
    return None


def _build_in_background() -> None:
    try:
        host_library()
    except NativeUnavailableError as exc:
        _log_once("host-background", "native host library unavailable, pure path kept: %s", exc)


def kernel_emulator() -> ctypes.CDLL:
    """The CUDA kernels compiled for the host and run on emulated threads (slow;
    for tests of the device code on machines without a GPU). Exposes
    ``smz_blake3_emu_rows(data, rows, row_bytes, offset, max_tile_log2, out, int* width)``.
    Follows the same switches and cache as :func:`host_library`."""
    if native_mode() == "off":
        raise NativeDisabledError(f"native code disabled by {ENV_MODE}=0")
    directory = cache_dir()
    with _lock:
        lib = _emulators.get(directory)
        if lib is None:
            lib = ctypes.CDLL(str(build_kernel_emulator(directory)))
            fn = lib.smz_blake3_emu_rows
            vp, u64 = ctypes.c_void_p, ctypes.c_uint64
            fn.argtypes = [vp, u64, u64, u64, ctypes.c_uint32, vp, vp]
            fn.restype = ctypes.c_int
            _emulators[directory] = lib
    return lib


def _buffer_pointer(buffer: Buffer) -> tuple[object, int, object]:
    """(argument for a ``void*`` parameter, byte length, object to keep alive)."""
    if isinstance(buffer, bytes):
        return buffer, len(buffer), buffer
    if isinstance(buffer, (bytearray, memoryview)):
        view = memoryview(buffer)
    else:
        import torch

        if not isinstance(buffer, torch.Tensor):
            view = memoryview(buffer)  # any other buffer-protocol object, e.g. a NumPy array
        else:
            if buffer.device.type != "cpu":
                raise ValueError(f"host digest needs a CPU tensor, got {buffer.device}")
            if not buffer.is_contiguous():
                raise ValueError("host digest needs a contiguous tensor")
            nbytes = buffer.numel() * buffer.element_size()
            return (buffer.data_ptr() if nbytes else None), nbytes, buffer
    if not view.c_contiguous:
        raise ValueError("host digest needs a C-contiguous buffer")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if view.readonly:
        data = view.tobytes()
        return data, len(data), data
    array = (ctypes.c_char * view.nbytes).from_buffer(view)
    return array, view.nbytes, (array, view)


def host_digest(buffer: Buffer) -> bytes:
    """BLAKE3 digest (32 bytes) of a bytes-like object or contiguous CPU tensor."""
    lib = host_library()
    ptr, nbytes, keep = _buffer_pointer(buffer)
    out = ctypes.create_string_buffer(DIGEST_SIZE)
    lib.smz_blake3_host(ptr, nbytes, out)
    del keep
    return out.raw


def host_digest_rows(buffer: Buffer, rows: int, row_bytes: int) -> list[bytes]:
    """One BLAKE3 digest per row of ``rows`` back-to-back rows of ``row_bytes`` bytes.

    ``row_bytes`` may be 0 (every row is the empty input); the buffer must hold
    exactly ``rows * row_bytes`` bytes.
    """
    if rows < 0 or row_bytes < 0:
        raise ValueError("rows and row_bytes must be non-negative")
    lib = host_library()
    ptr, nbytes, keep = _buffer_pointer(buffer)
    if nbytes != rows * row_bytes:
        raise ValueError(f"buffer has {nbytes} bytes, expected {rows} x {row_bytes}")
    if rows == 0:
        return []
    out = ctypes.create_string_buffer(DIGEST_SIZE * rows)
    lib.smz_blake3_host_rows(ptr, rows, row_bytes, out)
    del keep
    raw = out.raw
    return [raw[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE] for i in range(rows)]


# --------------------------------------------------------------------------- CUDA extension


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
    with _lock:
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
    flat = _as_byte_vector(tensor)
    out = ext.blake3_digest_rows(flat.reshape(rows, flat.numel() // rows))
    raw = _cpu_bytes(out)
    return [raw[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE] for i in range(rows)]


# --------------------------------------------------------------------------- pinned staging


@dataclass
class PoolStats:
    """Counters of a :class:`PinnedPool`."""

    allocations: int = 0
    reuses: int = 0
    evictions: int = 0
    overflows: int = 0


class _Block:
    __slots__ = ("capacity", "event", "pinned", "pooled", "tensor")

    def __init__(self, tensor: torch.Tensor, pinned: bool, pooled: bool) -> None:
        self.tensor = tensor
        self.capacity = int(tensor.numel())
        self.pinned = pinned
        self.pooled = pooled
        self.event: torch.cuda.Event | None = None


class StagedCopy:
    """A copy in flight. :meth:`wait` returns the destination tensor;
    :meth:`release` hands the staging buffer back to the pool.

    For :meth:`PinnedPool.to_host` the returned host tensor *is* the staging
    buffer: it stays valid until :meth:`release` (clone it to keep it longer).
    For :meth:`PinnedPool.to_device`, :meth:`wait` makes the current stream wait
    for the copy and the device tensor is the caller's; releasing early is safe.
    """

    def __init__(
        self,
        pool: PinnedPool,
        result: torch.Tensor,
        block: _Block | None,
        event: torch.cuda.Event | None,
        *,
        keep: torch.Tensor | None = None,
    ) -> None:
        self._pool = pool
        self._result = result
        self._block = block
        self._event = event
        self._keep = keep  # a caller's pinned source, referenced until the copy ends

    @property
    def pinned(self) -> bool:
        """Whether the copy went through page-locked memory."""
        return self._block is not None and self._block.pinned

    def ready(self) -> bool:
        """True when the copy has finished (never blocks)."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self) -> torch.Tensor:
        """The destination tensor, once it may be used: a host result after the copy
        has finished, a device result with the current stream ordered after it."""
        if self._event is not None:
            if self._result.is_cuda:
                import torch

                torch.cuda.current_stream(self._result.device).wait_event(self._event)
            else:
                self._event.synchronize()
        return self._result

    def release(self) -> None:
        """Hand the staging buffer back to the pool (idempotent)."""
        block, self._block = self._block, None
        if block is not None:
            self._pool._release(block, self._event)
        self._keep = None

    def __enter__(self) -> StagedCopy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class PinnedPool:
    """Bounded pool of reusable, exactly sized host staging buffers.

    On a machine with CUDA the buffers are page-locked (exact-size
    ``cudaHostAlloc`` through the native extension, or torch's pinned allocator
    when the extension is not available) and copies run on a side stream per
    device, each recording an event the caller waits on. Without CUDA the pool
    hands out plain host buffers and copies synchronously.

    ``max_bytes`` bounds the bytes the pool holds (in use plus idle). A free
    buffer is reused for a request of at most its size and at least 7/8 of it;
    idle buffers are dropped oldest first to make room. A request that cannot
    fit is served from a transient pageable buffer (counted in
    ``stats.overflows``).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be non-negative")
        self.max_bytes = int(max_bytes)
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._free: list[_Block] = []  # oldest release first
        self._held = 0
        self._in_use = 0
        self._use_pinned: bool | None = None
        self._streams: dict[int, torch.cuda.Stream] = {}

    @property
    def held_bytes(self) -> int:
        """Bytes of pooled buffers, in use or idle."""
        return self._held

    @property
    def in_use_bytes(self) -> int:
        return self._in_use

    def clear(self) -> None:
        """Drop the idle buffers."""
        with self._lock:
            dropped, self._free = self._free, []
            for block in dropped:
                self._held -= block.capacity
        for block in dropped:
            if block.event is not None:
                block.event.synchronize()

    # -- buffers

    def _pinned_available(self) -> bool:
        if self._use_pinned is None:
            import torch

            self._use_pinned = bool(torch.version.cuda is not None and torch.cuda.is_available())
        return self._use_pinned

    @staticmethod
    def _allocate(nbytes: int, pinned: bool) -> torch.Tensor:
        import torch

        # An ordinary tensor even when asked for under `torch.inference_mode` (a validation
        # loop's): a block made there would be an inference tensor, and a later copy into
        # it, outside inference mode (a training step's rows), would be refused.
        with torch.inference_mode(False):
            if pinned:
                ext = cuda_extension()
                if ext is not None:
                    block: torch.Tensor = ext.pinned_empty(nbytes)
                    return block
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return torch.empty(nbytes, dtype=torch.uint8)

    def _acquire(self, nbytes: int) -> _Block:
        pinned = self._pinned_available()
        if nbytes == 0:
            return _Block(self._allocate(0, False), pinned=False, pooled=False)
        reused: _Block | None = None
        budgeted = False
        victims: list[_Block] = []
        with self._lock:
            for block in self._free:
                fits = nbytes <= block.capacity and block.capacity - block.capacity // 8 <= nbytes
                if fits and (reused is None or block.capacity < reused.capacity):
                    reused = block
            if reused is not None:
                self._free.remove(reused)
                self._in_use += reused.capacity
                self.stats.reuses += 1
            elif nbytes <= self.max_bytes:
                while self._free and self._held + nbytes > self.max_bytes:
                    victim = self._free.pop(0)
                    self._held -= victim.capacity
                    self.stats.evictions += 1
                    victims.append(victim)
                if self._held + nbytes <= self.max_bytes:
                    self._held += nbytes
                    self._in_use += nbytes
                    self.stats.allocations += 1
                    budgeted = True
            if reused is None and not budgeted:
                self.stats.overflows += 1
        for victim in victims:  # a copy may still be running into an idle buffer
            if victim.event is not None:
                victim.event.synchronize()
        victims.clear()
        if reused is not None:
            if reused.event is not None:
                reused.event.synchronize()
                reused.event = None
            return reused
        if not budgeted:
            return _Block(self._allocate(nbytes, False), pinned=False, pooled=False)
        try:
            tensor = self._allocate(nbytes, pinned)
        except Exception:
            with self._lock:
                self._held -= nbytes
                self._in_use -= nbytes
            raise
        return _Block(tensor, pinned=pinned, pooled=True)

    def _release(self, block: _Block, event: torch.cuda.Event | None) -> None:
        if not block.pooled:
            return
        block.event = event
        with self._lock:
            self._in_use -= block.capacity
            self._free.append(block)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]
                self._streams[index] = stream
        return stream

    # -- copies

    def to_host(self, tensor: torch.Tensor) -> StagedCopy:
        """Copy ``tensor`` into a staging buffer; a CUDA source is copied on the side
        stream after the work already queued on the current stream."""
        import torch

        # Outside inference mode whatever the caller's: the blocks are reused across
        # calls, and a view of one made under it could not be written outside it.
        with torch.inference_mode(False):
            src = tensor.detach().resolve_conj().resolve_neg()
            nbytes = src.numel() * src.element_size()
            block = self._acquire(nbytes)
            dst = block.tensor[:nbytes]
            event: torch.cuda.Event | None = None
            if src.is_cuda and nbytes > 0:
                current = torch.cuda.current_stream(src.device)
                src = src.contiguous()
                side = self._side_stream(src.device)
                side.wait_stream(current)
                with torch.cuda.stream(side):
                    dst.copy_(src.reshape(-1).view(torch.uint8), non_blocking=block.pinned)
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(side)
                src.record_stream(side)
            elif nbytes > 0:
                dst.copy_(src.contiguous().reshape(-1).view(torch.uint8))
            result = dst.view(src.dtype).view(src.shape)
        return StagedCopy(self, result, block, event)

    def to_device(
        self, host_tensor: torch.Tensor, device: torch.device | str | int | None = None
    ) -> StagedCopy:
        """Copy a host tensor to ``device`` (default: the current CUDA device) through
        a staging buffer, on the side stream; :meth:`StagedCopy.wait` orders the
        current stream after it. A CPU target gets a plain copy."""
        import torch

        if host_tensor.is_cuda:
            raise ValueError("to_device expects a host tensor")
        if device is None:
            target = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            target = torch.device("cuda", device)
        else:
            target = torch.device(device)
        src = host_tensor.detach().resolve_conj().resolve_neg().contiguous()
        if target.type != "cuda":
            return StagedCopy(self, src.to(target, copy=True), None, None)
        if target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        nbytes = src.numel() * src.element_size()
        current = torch.cuda.current_stream(target)
        result = torch.empty(src.shape, dtype=src.dtype, device=target)
        if nbytes == 0:
            return StagedCopy(self, result, None, None)
        block: _Block | None = None
        keep: torch.Tensor | None = None
        if src.is_pinned():
            staging = src.reshape(-1).view(torch.uint8)
            keep = src
        else:
            block = self._acquire(nbytes)
            with torch.inference_mode(False):  # a reused block, as in `to_host`
                staging = block.tensor[:nbytes]
                staging.copy_(src.reshape(-1).view(torch.uint8))
        side = self._side_stream(target)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            result.reshape(-1).view(torch.uint8).copy_(staging, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        result.record_stream(side)
        return StagedCopy(self, result, block, event, keep=keep)
