"""The host library: ``csrc/blake3_host.cpp``, a small C ABI compiled with the
system C++ compiler and loaded through :mod:`ctypes`. It is the reference for the
tree logic the CUDA kernels share and runs everywhere; :func:`host_digest` and
:func:`host_digest_rows` digest host memory with it. The **kernel emulator**
(``csrc/blake3_kernel_emu.cpp``), the CUDA kernels compiled for the host and run
on emulated threads so that tests exercise the device code without a GPU, is
built the same way, by the same compiler into the same cache.

The fork hook is here because what a forked child must not inherit is this
library's: a build under way, the lock it holds, the row-hashing worker.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import blake3

from somatize_torch import _native_env
from somatize_torch._native_env import (
    DIGEST_SIZE,
    ENV_CACHE,
    ENV_MODE,
    NativeDisabledError,
    NativeUnavailableError,
    _log_once,
    _sources_key,
    cache_dir,
    csrc_dir,
    native_mode,
)

if TYPE_CHECKING:
    import torch

    Buffer = bytes | bytearray | memoryview | torch.Tensor

__all__ = [
    "build_host_library",
    "build_kernel_emulator",
    "host_digest",
    "host_digest_rows",
    "host_library",
    "kernel_emulator",
    "ready_host_library",
]

_HOST_SOURCES: Final = ("blake3_tree.h", "blake3_lanes.h", "blake3_host.cpp")
_HOST_FLAGS: Final = ("-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-Wno-psabi")
_EMU_SOURCES: Final = (
    "blake3_tree.h",
    "blake3_cuda.h",
    "blake3_kernels.cuh",
    "blake3_kernel_emu.cpp",
)
_EMU_FLAGS: Final = ("-O2", "-std=c++20", "-pthread", "-shared", "-fPIC", "-Wno-unknown-pragmas")

_host_libs: dict[Path, ctypes.CDLL] = {}
_background: dict[Path, threading.Thread] = {}
_ready: dict[tuple[str | None, ...], ctypes.CDLL] = {}
_background_lock = threading.Lock()
_build_lock = threading.Lock()
"""Held while this process builds or loads a host build (one at a time). Not the lock
the CUDA extension takes (``_native_env._lock``), which is taken only to publish what
was built, so that the CUDA path never waits for a host compile."""
_emulators: dict[Path, ctypes.CDLL] = {}


def _after_fork_in_child() -> None:
    """A forked child starts with its own locks (one a parent's thread held during a build
    would stay held), with no build under way, and with no row-hashing worker (the
    parent's threads are not there)."""
    global _background_lock, _build_lock
    _native_env._lock = threading.RLock()
    _background_lock = threading.Lock()
    _build_lock = threading.Lock()
    _background.clear()
    for lib in _host_libs.values():
        lib.smz_blake3_host_rows_forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _host_compiler() -> str:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise NativeUnavailableError("no C++ compiler found (set CXX)")


_COMPILE_S: Final = 600.0
"""How long a compile may run before it is stopped and the library taken as unavailable:
a build takes seconds, and one that hangs (a compiler waiting on a lock, a full disk
retried) must not hold a process's first batches for good."""

_LAND: Final = """
import os, signal, subprocess, sys
import blake3
tmp, to, limit, *cmd = sys.argv[1:]
compiler = subprocess.Popen(cmd, start_new_session=True)
try:
    code = compiler.wait(timeout=float(limit))
except BaseException as exc:
    try:
        os.killpg(compiler.pid, signal.SIGKILL)  # the compiler and what it runs
    except ProcessLookupError:
        pass
    compiler.wait()
    if not isinstance(exc, subprocess.TimeoutExpired):
        raise
    sys.stderr.write("the compiler ran past %s s and was stopped\\n" % limit)
    sys.exit(124)
if code:
    sys.exit(code)
with open(tmp, "rb") as f:
    data = f.read()
    os.fsync(f.fileno())
os.chmod(tmp, 0o755)
os.replace(tmp, to)
folder = os.open(os.path.dirname(to), os.O_RDONLY)
side = tmp + ".ok"
with open(side, "w") as f:
    f.write("%d %s\\n" % (len(data), blake3.blake3(data).hexdigest()))
    f.flush()
    os.fsync(f.fileno())
os.replace(side, to + ".ok")
os.fsync(folder)
os.close(folder)
"""
"""Run in a process of its own after the compiler: makes the library durable (its bytes
on disk before its name is), moves it into place, then writes beside it the record that
says it is whole (:func:`_intact`), so that a build started in the background lands,
whole, even when the process that started it exits before it ends."""


def _record_of(library: Path) -> Path:
    """Where the record of ``library``'s size and BLAKE3 digest is kept."""
    return library.with_name(library.name + ".ok")


def _intact(library: Path) -> bool:
    """Whether ``library`` is there and is, to the byte, what its build wrote: the size and
    BLAKE3 digest recorded beside it after it landed. Loading a library cut short (a crash
    before its bytes reached the disk, a full disk) would kill the process (SIGBUS), so
    one without its record, or differing from it, is built again."""
    try:
        record = _record_of(library).read_text().split()
        data = library.read_bytes()
    except (OSError, UnicodeDecodeError):
        return False
    return record == [str(len(data)), blake3.blake3(data).hexdigest()]


def _build_shared(
    directory: Path | None, sources: tuple[str, ...], flags: tuple[str, ...], stem: str
) -> Path:
    """Compile ``sources[-1]`` (the other names are the headers it includes) into a
    shared library in ``directory`` unless a whole build of the same sources, flags and
    compiler is already there (:func:`_intact`). The compiler writes a temporary file in
    the same directory that is then synced and renamed into place (:data:`_LAND`), so
    concurrent builders never expose a partial file, and a crash never leaves one."""
    src = csrc_dir()
    cxx = _host_compiler()
    if not sys.executable:
        raise NativeUnavailableError(
            "the native build runs under a Python interpreter, and this process names none "
            "(sys.executable is empty)"
        )
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
    if _intact(target):
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    _sweep(target_dir, stem)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        compile_ = [cxx, *flags, f"-I{src}", str(src / sources[-1]), "-o", str(tmp)]
        limit = str(_COMPILE_S)
        cmd = [sys.executable, "-c", _LAND, str(tmp), str(target), limit, *compile_]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, check=False, timeout=_COMPILE_S + 60
            )
        except subprocess.TimeoutExpired as exc:
            raise NativeUnavailableError(
                f"native build ran past {_COMPILE_S:.0f} s and was stopped ({' '.join(compile_)})"
            ) from exc
        except OSError as exc:  # no interpreter to run it under (an embedded Python)
            raise NativeUnavailableError(
                f"the native build cannot be run under {sys.executable!r}: {exc}"
            ) from exc
        if proc.returncode != 0:
            raise NativeUnavailableError(
                f"native build failed ({' '.join(compile_)}):\n{proc.stderr[-4000:]}"
            )
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.ok").unlink(missing_ok=True)
    if not _intact(target):
        raise NativeUnavailableError(
            f"the native build of {target} did not land whole (another build may have "
            "replaced it meanwhile); it is built again next time"
        )
    _log_once(f"built:{target}", "built native library %s", target)
    return target


_STALE_BUILD_S: Final = 3600.0
"""A temporary file of a build this old was left by a build that never ended (a
process killed mid-compile); a build takes seconds."""


def _sweep(directory: Path, stem: str) -> None:
    """Removes what builds of ``stem`` killed mid-compile left in ``directory``."""
    now = time.time()
    for left in [*directory.glob(f".{stem}-*.tmp"), *directory.glob(f".{stem}-*.tmp.ok")]:
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
    text = ctypes.c_char_p
    lib.smz_blake3_host_keys.argtypes = [text, u64, text, ctypes.POINTER(u64), u64, text, u64, text]
    lib.smz_blake3_host_keys.restype = None
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
    lib = _host_libs.get(directory)
    if lib is not None:
        return lib
    with _build_lock:
        lib = _host_libs.get(directory)
        if lib is None:
            lib = _load_host(directory)
            with _native_env._lock:
                _host_libs[directory] = lib
    return lib


def _load_host(directory: Path) -> ctypes.CDLL:
    """The host library built (or found) in ``directory``, loaded and bound. A cached
    library that will not load, or lacks a function it should have (a damaged or a
    foreign file), is removed and built again, once."""
    path = _built_host(directory)
    try:
        return _open_host(path)
    except NativeUnavailableError as exc:
        _log_once(f"host-bad:{path}", "%s; it is removed and built again", exc)
    for stale in (path, _record_of(path)):
        stale.unlink(missing_ok=True)
    path = _built_host(directory)
    try:
        return _open_host(path)
    except NativeUnavailableError as exc:
        raise NativeUnavailableError(f"{exc}, even when built afresh") from exc


def _built_host(directory: Path) -> Path:
    try:
        return build_host_library(directory)
    except OSError as why:  # the cache not writable
        raise NativeUnavailableError(
            f"the native host library could not be built in {directory} ({why}); set "
            f"{ENV_CACHE} to a writable directory"
        ) from why


def _open_host(path: Path) -> ctypes.CDLL:
    """The library at ``path``, loaded and bound; :class:`NativeUnavailableError` naming
    the file where it will not load or lacks a function of the host library (which is
    then let go of, so that a library built again at that name is loaded afresh)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as why:
        raise NativeUnavailableError(
            f"the native host library {path} cannot be loaded ({why})"
        ) from why
    try:
        _bind_host(lib)
    except AttributeError as why:
        _unload(lib)
        raise NativeUnavailableError(
            f"{path} is not the native host library it is named for: {why}"
        ) from None
    _log_once("host-on", "native host library active: %s", path)
    return lib


def _unload(lib: ctypes.CDLL) -> None:
    """Lets go of a library loaded by mistake: while it stays loaded, loading its path
    again answers the same library, whatever the file there is now."""
    close = getattr(_ctypes, "dlclose", None)  # POSIX only
    if close is not None:
        close(lib._handle)


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
    try:
        directory = cache_dir()
    except NativeUnavailableError as exc:
        if mode == "on":
            raise
        _log_once("host-no-cache", "native host library unavailable, pure path kept: %s", exc)
        return None
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
    with _build_lock:
        lib = _emulators.get(directory)
        if lib is None:
            lib = ctypes.CDLL(str(build_kernel_emulator(directory)))
            fn = lib.smz_blake3_emu_rows
            vp, u64 = ctypes.c_void_p, ctypes.c_uint64
            fn.argtypes = [vp, u64, u64, u64, ctypes.c_uint32, vp, vp]
            fn.restype = ctypes.c_int
            with _native_env._lock:
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
