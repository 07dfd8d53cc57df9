"""Tensor digests: the one place a tensor's content becomes a name.

Every digest of tensor data in somatize goes through this module — an
``Opaque(batch)`` input, a frozen module's weights, one row of a batch for a
per-sample key — so that the same bytes get the same name everywhere, and so
that one function can be backed by a device kernel where there is one.

A tensor's digest covers what it *is*, not where it lives::

    raw(t)          = BLAKE3(t's bytes, C order, little-endian)
    digest_tensor(t) = H("somatize/tensor", dtype, shape, raw(t))

BLAKE3 is a tree hash, so ``raw`` is the same on one CPU thread, on many, and in
the CUDA kernel of ``somatize_torch._native`` (used for CUDA tensors when that
extension is built): a key computed beside a GPU equals one computed on a
laptop. A collection of tensors (a state dict, a dict or tuple of tensors) is
named by a canonical header — each tensor's name, dtype, shape and raw digest,
names sorted — and never by serialising the collection, since a serialiser may
write equal tensors in more than one way.

The bytes are read in place: a contiguous CPU tensor is hashed through a
zero-copy view of its memory (:func:`memory_of`); only a
non-contiguous tensor is made contiguous first, and a CUDA tensor is copied to
the host only when no device kernel is available.

Rows: :func:`digest_rows` names each ``t[i]`` of a batch in one call. With the
CUDA extension that is one kernel for the whole batch. On the host it is one call
into the native host library, which hashes the chunks of many rows side by side on
SIMD lanes with the interpreter lock released, a run of rows per core; until that
library is built (on a background thread, the first time rows are digested) or
where it cannot be, it is one ``blake3`` call per row over a zero-copy slice of the
batch's memory. In every case ``digest_rows(t)[i] == digest_tensor(t[i])``.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import blake3
import numpy
import torch

from somatize import canonical
from somatize._threads import hash_threads, process_pool
from somatize_torch import _native
from somatize_torch._cuda_extension import _byte_rows

__all__ = [
    "DIGEST_VERSION",
    "DTYPES",
    "RowsLater",
    "RowsQueued",
    "check_batch",
    "digest_named",
    "digest_rows",
    "digest_tensor",
    "host_bytes",
    "memory_of",
    "plain",
    "raw_digest",
    "raw_rows",
    "raw_rows_later",
    "raw_rows_queued",
    "row_digest",
    "row_header",
]

DIGEST_VERSION = 1
"""Bumped whenever the digest of some tensor changes for the same content."""

_TENSOR = b"somatize/tensor/%d\0" % DIGEST_VERSION
_NAMED = b"somatize/tensors/%d\0" % DIGEST_VERSION
_LARGE = 1 << 20
"""Above this many bytes a host digest uses every core."""
_SPLIT_ROWS = 1 << 18
"""Above this many bytes a batch's rows are hashed on every core: each thread takes many
rows, so the hand-off pays for itself sooner than it does for one tensor."""
_NATIVE_SPLIT = 1 << 21
"""Above this many bytes the native library hashes a batch's rows on every core. Lower
than that, waking a second thread (which, in a training loop, competes with torch's own
threads for the core) costs about what it saves."""
_GIL_FREE = 1 << 14
"""Rows shorter than this are hashed on one thread: the ``blake3`` package holds the GIL
while it hashes a short input, so threads would only take turns."""

DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.complex64: "C64",
    torch.complex128: "C128",
    torch.complex32: "C32",
}
"""Each dtype a tensor may have here, by its safetensors name (``C128``, ``C32`` and the
``FNUZ`` float8s, which safetensors does not name, by a name in its manner). Left out:
the sub-byte and bit-packed dtypes (``uint1`` … ``int7``, ``bits*``, ``float4_e2m1fn_x2``)
and the quantized ones, whose elements are not each a whole number of bytes or not a
value alone."""
for _name, _code in (
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
    ("float8_e8m0fnu", "F8_E8M0"),
):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code

_BIG_ENDIAN = sys.byteorder != "little"


def plain(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is named by its content alone: a ``torch.Tensor`` itself or a
    parameter, not a subclass, whose class and what else it carries a module may read
    (its digest says neither)."""
    return type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter)


def host_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` in C order, as a flat memoryview of host memory.

    Zero-copy for a contiguous CPU tensor; a non-contiguous one is made contiguous
    and a device tensor is copied to the host first. The view keeps the memory it
    reads alive.
    """
    return memory_of(_host_tensor(tensor))


class _Memory:
    """Hands numpy the memory of a contiguous CPU tensor by address, holding the tensor:
    ``tensor.numpy()`` would mark the tensor's storage as never to be resized again, a
    change to the caller's tensor that outlives the view."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, tensor: torch.Tensor, writable: bool) -> None:
        _check_holds_data(tensor)
        self.tensor = tensor
        self.__array_interface__ = {
            "data": (tensor.data_ptr(), not writable),
            "shape": (tensor.numel() * tensor.element_size(),),
            "typestr": "|u1",
            "version": 3,
        }


def memory_of(
    tensor: torch.Tensor, writable: bool = False, kind: type[numpy.ndarray] | None = None
) -> memoryview:
    """The bytes of a contiguous CPU ``tensor`` as a flat memoryview, without a copy and
    without changing the tensor; read-only unless ``writable``; exported by an array of
    class ``kind`` where one is given (a store tells buffers it need not copy by their
    class). The view keeps the tensor object alive, not its memory as it is now: a
    tensor resized while the view is held leaves it over freed memory, so callers read
    it at once (a hash, a write to the store, a join into bytes) and hand it to nobody,
    unless the tensor is theirs alone."""
    flat: Any = _flat_bytes(tensor, writable)
    return memoryview(flat if kind is None else flat.view(kind))


def _flat_bytes(tensor: torch.Tensor, writable: bool) -> numpy.ndarray:
    """The bytes of a contiguous CPU ``tensor`` as a flat array of bytes, not copied."""
    if tensor.numel() == 0:
        # torch puts an empty tensor at address 0, which numpy before 2.3 refuses
        nothing = numpy.empty(0, numpy.uint8)
        nothing.flags.writeable = writable
        return nothing
    return numpy.asarray(_Memory(tensor, writable))


def _check_holds_data(tensor: torch.Tensor) -> None:
    """Refuses a tensor with elements but no memory to read them from: torch answers a
    data pointer of 0 for a nested tensor, for a wrapper subclass (one whose values live
    in tensors it holds) and for a tensor whose storage was freed (resized to 0), and
    reading there would fail or read another thing's memory."""
    if tensor.numel() > 0 and tensor.data_ptr() == 0:
        kind = "" if type(tensor) is torch.Tensor else f" (a `{type(tensor).__qualname__}`)"
        raise TypeError(
            f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}{kind} holds no data in "
            "memory: a nested tensor, a "
            "wrapper subclass, or freed storage. Digest a plain tensor that holds its values "
            "(`x.as_subclass(torch.Tensor)` for a subclass with storage of its own, "
            "`x.unbind()` for a nested one, the unsharded tensor for freed storage)"
        )


def dense(t: torch.Tensor) -> torch.Tensor:
    """A contiguous ``t`` with the strides of its shape: torch calls a tensor of one
    element contiguous whatever its stride (a column of a batch of one), and a flat view
    of it would keep that stride."""
    if t.numel() == 1 and t.dim() and t.stride() != (1,) * t.dim():
        return t.as_strided(t.shape, (1,) * t.dim())  # one element: it is where it is
    return t


def _host_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a contiguous CPU tensor whose memory holds its canonical bytes:
    itself where it already is one."""
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    t = dense(t)
    # The canonical byte order is little-endian, a complex number's two parts each.
    part = t.element_size() // (2 if t.is_complex() else 1)
    if _BIG_ENDIAN and part > 1:
        t = t.view(torch.uint8).reshape(-1, part).flip(-1).contiguous()
    _check_holds_data(t)
    return t


def _device_raw(tensor: torch.Tensor) -> bytes | None:
    """The raw digest computed where a CUDA tensor lives, or None where it cannot be."""
    if tensor.device.type != "cuda":
        return None
    try:
        from somatize_torch._native import device_digest
    except ImportError:
        return None
    return device_digest(tensor)


def _device_raw_rows(tensor: torch.Tensor) -> list[bytes] | None:
    if tensor.device.type != "cuda":
        return None
    try:
        from somatize_torch._native import device_digest_rows
    except ImportError:
        return None
    return device_digest_rows(tensor)


def _hash(view: memoryview) -> bytes:
    if view.nbytes >= _LARGE:
        return bytes(blake3.blake3(view, max_threads=hash_threads()).digest())
    return bytes(blake3.blake3(view).digest())


def raw_digest(tensor: torch.Tensor) -> bytes:
    """BLAKE3 (32 bytes) of the tensor's bytes alone — no dtype, no shape."""
    found = _device_raw(tensor)
    if found is not None:
        return found
    return _hash(host_bytes(tensor))


def _dtype_code(tensor: torch.Tensor) -> str:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"a tensor's content is digested from a torch.Tensor, got a "
            f"`{type(tensor).__name__}`: make one first (`torch.as_tensor(value)`, "
            "`torch.from_numpy(array)`), or digest each tensor of a collection on its own"
        )
    if tensor.is_nested:
        raise TypeError(
            f"a nested {tensor.dtype} tensor cannot be digested or written: its rows have no "
            "one shape, so it has no one canonical byte layout. Digest each of its "
            "`x.unbind()`, or pad it (`torch.nested.to_padded_tensor`)"
        )
    code = DTYPES.get(tensor.dtype)
    if code is None:
        known = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(
            f"a tensor of dtype {tensor.dtype} cannot be digested or written: its bytes have "
            f"no agreed layout here. Convert it to one of {known}"
        )
    if tensor.layout is not torch.strided:
        raise TypeError(
            f"a {tensor.layout} tensor cannot be digested or written: only dense (strided) "
            "tensors have one canonical byte layout. Convert it with `.to_dense()`"
        )
    if tensor.is_meta:
        raise TypeError(
            f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)} on the meta device "
            "cannot be digested or written: it holds no values. Give it its values first "
            "(a module built on the meta device: `load_state_dict(..., assign=True)`, or "
            "`to_empty(device=...)` and its weights loaded)"
        )
    return code


def _tensor_hex(code: str, shape: Iterable[int], raw: bytes) -> str:
    data = _TENSOR + canonical.encode([code, list(shape), raw])
    return "blake3:" + blake3.blake3(data).hexdigest()


def digest_tensor(tensor: torch.Tensor) -> str:
    """``blake3:<hex>`` of a tensor's dtype, shape and bytes; the same on every device."""
    code = _dtype_code(tensor)
    return _tensor_hex(code, tensor.shape, raw_digest(tensor))


def digest_rows(tensor: torch.Tensor) -> list[str]:
    """One digest per row ``tensor[i]``, computed in one call for the whole batch.

    ``digest_rows(t)[i] == digest_tensor(t[i])``. A 0-dim tensor has no rows and
    is refused.
    """
    header = row_header(tensor)
    return [row_digest(header, raw) for raw in raw_rows(tensor)]


def raw_rows(tensor: torch.Tensor) -> list[bytes]:
    """The raw digest of each row ``tensor[i]`` (BLAKE3 of its bytes alone), in one call.

    A raw digest does not say the row's dtype or shape, so it names a row only among
    rows of one dtype and shape; :func:`row_digest` adds them, giving the row's
    :func:`digest_tensor`. Per-sample caches key rows in memory by the raw digest and
    spend the second hash only on rows that go to the store.
    """
    check_batch(tensor)
    rows = int(tensor.shape[0])
    raws = _device_raw_rows(tensor)
    if raws is not None:
        return raws
    lib = _native.ready_host_library()
    if lib is not None:
        host = _host_tensor(tensor)
        return _native_rows(lib, host, rows)
    view = host_bytes(tensor)
    return _hash_rows(view, rows, view.nbytes // rows if rows else 0)


def check_batch(tensor: torch.Tensor) -> None:
    """Refuses what has no rows to digest: a 0-dim tensor, a dtype or layout without one
    canonical byte layout, a nested tensor, a tensor that holds no data in memory."""
    _dtype_code(tensor)
    if tensor.dim() == 0:
        raise ValueError(
            "rows are digested in a batch (a tensor with at least one dimension), got a 0-dim "
            "tensor; use digest_tensor for a single value"
        )
    _check_holds_data(tensor)


class RowsLater:
    """The raw digests of a batch's rows (:func:`raw_rows`), being computed on another
    thread; :meth:`result` waits for them. Made by :func:`raw_rows_later`."""

    __slots__ = ("_future", "_host", "_job", "_lib", "_out", "_pid", "_rows")

    def __init__(self, host: torch.Tensor, rows: int) -> None:
        self._host = host  # the bytes being read stay alive until the hashing is done
        self._rows = rows
        self._pid = os.getpid()
        self._job: int | None = None
        self._future: Future[list[bytes]] | None = None
        self._lib: Any = None
        self._out: Any = None

    def result(self) -> list[bytes]:
        """The rows' raw digests, once they are computed (raises what hashing raised); in a
        child forked since, which the hashing thread did not follow, computed here."""
        if os.getpid() != self._pid:
            view = host_bytes(self._host)
            rows = self._rows
            return _hash_rows(view, rows, view.nbytes // rows if rows else 0)
        if self._future is not None:
            return self._future.result()
        self._wait(take_rest=True)
        return _split(self._out.raw, self._rows)

    def _wait(self, take_rest: bool) -> None:
        """Returns once the native thread is done with this batch. With ``take_rest``, this
        thread hashes the rows it has not taken yet (on a busy machine it may have had
        little of the CPU); without, they are skipped."""
        job, self._job = self._job, None
        if job is not None and os.getpid() == self._pid:  # a forked child has no such thread
            self._lib.smz_blake3_host_rows_wait(job, int(take_rest))

    def __del__(self) -> None:
        self._wait(take_rest=False)  # the thread reads memory this object keeps alive


def raw_rows_later(tensor: torch.Tensor) -> RowsLater | None:
    """Starts computing :func:`raw_rows` of a CPU tensor on another thread and returns at
    once; None for a tensor on a device (hashed there, fast) or a 0-dim one. A tensor
    whose rows cannot be digested is refused as :func:`raw_rows` refuses it.

    With the native host library the rows are hashed on a thread of its own that never
    takes the GIL, so the caller's Python (a training step) runs beside it at full
    speed; without it, on one thread of a pool, with the ``blake3`` package."""
    if tensor.dim() == 0 or tensor.device.type != "cpu":
        return None
    check_batch(tensor)
    rows = int(tensor.shape[0])
    host = _host_tensor(tensor)
    later = RowsLater(host, rows)
    lib = _native.ready_host_library()
    nbytes = host.numel() * host.element_size()
    if lib is not None and rows:
        later._lib = lib
        later._out = ctypes.create_string_buffer(32 * rows)
        base = host.data_ptr() if nbytes else 0
        size = nbytes // rows
        later._job = lib.smz_blake3_host_rows_begin(base, rows, size, ctypes.addressof(later._out))
        if later._job is not None:
            return later
    view = host_bytes(host)
    size = view.nbytes // rows if rows else 0
    later._future = process_pool("somatize-rows", 1).submit(_hash_span, view, size, 0, rows)
    return later


class RowsQueued:
    """The raw digests of a CUDA batch's rows (:func:`raw_rows`), queued on the device and
    on their way to the host; :meth:`result` waits for them alone. Made by
    :func:`raw_rows_queued`."""

    __slots__ = ("_digested", "_done", "_host", "rows")

    def __init__(self, host: torch.Tensor, digested: bool, done: torch.cuda.Event) -> None:
        self._host = host  # page-locked: the digests, or the rows' bytes where none was had
        self._digested = digested
        self._done = done
        self.rows = int(host.shape[0])
        """How many rows the batch has."""

    def result(self) -> list[bytes]:
        """The rows' raw digests, once the device has made them (or copied the rows' bytes,
        hashed here then): not waiting for the work queued on its stream after them."""
        self._done.synchronize()
        if self._digested:
            return _split(bytes(memory_of(self._host)), self.rows)
        return raw_rows(self._host)


def raw_rows_queued(tensor: torch.Tensor) -> RowsQueued | None:
    """Queues :func:`raw_rows` of a CUDA batch on its device's current stream and returns
    at once; None for a batch elsewhere, or of no rows. A batch whose rows cannot be
    digested is refused as :func:`raw_rows` refuses it.

    The digests (without the CUDA extension, the rows' bytes, hashed on the host at
    :meth:`RowsQueued.result`) are copied into page-locked memory behind it, and an event
    marks the copy's end. Work queued on the stream afterwards — the module's run on the
    batch — neither delays the result nor changes what is digested, even if it writes
    into the batch: the stream runs it after the digests are taken. That is what lets a
    caller queue a batch's computation before it knows the batch's names."""
    if tensor.device.type != "cuda" or tensor.dim() == 0 or tensor.shape[0] == 0:
        return None
    check_batch(tensor)
    found = _native.device_digest_rows_queued(tensor)
    digested = found is not None
    if found is None:
        found = _byte_rows(tensor)
    host = torch.empty(found.shape, dtype=torch.uint8, pin_memory=True)
    host.copy_(found, non_blocking=True)
    done = torch.cuda.Event()  # type: ignore[no-untyped-call]
    done.record(torch.cuda.current_stream(tensor.device))
    return RowsQueued(host, digested, done)


def row_header(tensor: torch.Tensor) -> bytes:
    """What the digest of each row of ``tensor`` adds to its raw digest: the dtype and the
    shape of one row."""
    return _TENSOR + canonical.encode([_dtype_code(tensor), list(tensor.shape[1:]), b""])[:-9]


def row_digest(header: bytes, raw: bytes) -> str:
    """``digest_tensor`` of a row, from :func:`row_header` of its batch and its raw digest."""
    return "blake3:" + blake3.blake3(_row(header, raw)).hexdigest()


def _hash_span(view: memoryview, size: int, start: int, stop: int) -> list[bytes]:
    return [
        bytes(blake3.blake3(view[i * size : (i + 1) * size]).digest()) for i in range(start, stop)
    ]


def _hash_rows(view: memoryview, rows: int, size: int) -> list[bytes]:
    """The raw digest of each row of a batch's bytes, with the ``blake3`` package.

    The package releases the GIL while it hashes an input of ``_GIL_FREE`` bytes or
    more, so a large batch of such rows is split into one contiguous run of rows per
    core, hashed side by side: a row's digest does not depend on which thread
    computed it.
    """
    workers = 1 if view.nbytes < _SPLIT_ROWS else min(_cores(), rows)
    if size < _GIL_FREE or workers < 2:
        return _hash_span(view, size, 0, rows)
    bounds = [rows * k // workers for k in range(workers + 1)]
    pool = _pool()
    later = [
        pool.submit(_hash_span, view, size, bounds[k], bounds[k + 1]) for k in range(1, workers)
    ]
    out = _hash_span(view, size, bounds[0], bounds[1])
    for done in later:
        out.extend(done.result())
    return out


def _native_rows(lib: Any, host: torch.Tensor, rows: int) -> list[bytes]:
    """The raw digest of each row of a contiguous CPU tensor, from the native host
    library, which hashes many rows' chunks at once on SIMD lanes and holds no GIL:
    a batch of ``_NATIVE_SPLIT`` bytes or more is hashed on every core. On two cores
    that is this thread and the library's own worker, each taking the next few rows
    until none is left (:func:`_beside_worker`); on more, one run of rows per core."""
    if rows == 0:
        return []
    nbytes = host.numel() * host.element_size()
    size = nbytes // rows
    base = host.data_ptr() if nbytes else 0
    out = ctypes.create_string_buffer(32 * rows)
    into = ctypes.addressof(out)
    workers = 1 if nbytes < _NATIVE_SPLIT else min(_cores(), rows)
    if workers == 2 and _beside_worker(lib, host, rows, size, out):
        return _split(out.raw, rows)
    hash_rows = lib.smz_blake3_host_rows
    first, *rest = itertools.pairwise([rows * k // workers for k in range(workers + 1)])
    pool = _pool()
    later = [
        pool.submit(hash_rows, base + lo * size, hi - lo, size, into + 32 * lo) for lo, hi in rest
    ]
    hash_rows(base, first[1], size, into)
    for done in later:
        done.result()
    return _split(out.raw, rows)


def _beside_worker(lib: Any, host: torch.Tensor, rows: int, size: int, out: Any) -> bool:
    """Hashes the ``rows`` rows of ``size`` bytes of ``host`` into ``out`` (a buffer of
    their digests) on this thread and the native library's worker thread together, each
    taking the next few rows until none is left; False where the worker could not be
    started (nothing is written then). No Python thread is woken and no GIL handed over,
    and where the worker is busy (a batch named ahead) or gets little of the CPU, this
    thread hashes the rows it has not taken, rather than wait for an even share. The wait
    is one call into the library, which no interrupt stops halfway."""
    try:
        job = lib.smz_blake3_host_rows_begin(host.data_ptr(), rows, size, ctypes.addressof(out))
    except BaseException:
        # Interrupted as the job began (a Ctrl-C handled as the call returned), before it
        # could be waited for: the worker may still read the batch and write the digests,
        # so neither is ever let go.
        _BEGUN_UNWAITED.append((host, out))
        raise
    if job is None:
        return False
    lib.smz_blake3_host_rows_wait(job, 1)
    return True


_BEGUN_UNWAITED: list[tuple[torch.Tensor, Any]] = []
"""The batches and digest buffers of jobs begun on the library's worker whose wait an
interrupt stopped (:func:`_beside_worker`): kept for the process, as the worker may still
use them."""


def _split(raw: bytes, rows: int) -> list[bytes]:
    """The 32-byte digests of ``rows`` rows, written one after another in ``raw``."""
    return [raw[i : i + 32] for i in range(0, 32 * rows, 32)]


@functools.cache
def _cores() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _pool() -> ThreadPoolExecutor:
    """Threads for hashing rows side by side, made on first use and kept for the process."""
    return process_pool("somatize-digest", max(1, _cores() - 1))


def _row(head: bytes, raw: bytes) -> bytes:
    return before_raw(head, len(raw)) + raw


def before_raw(header: bytes, size: int) -> bytes:
    """What :func:`row_digest` hashes before a raw digest of ``size`` bytes, given
    :func:`row_header` of its batch: canonical.encode of ``[code, shape, raw]`` ends with
    ``b"b" + len(8) + raw``, and ``header`` is everything before that, so the whole equals
    ``_TENSOR + canonical.encode([code, shape, raw])``."""
    return header + b"b" + size.to_bytes(8, "big")


def keys_after_rows(inner: bytes, items: Sequence[bytes], outer: bytes) -> list[str] | None:
    """The key of each of ``items``, as a node keyed by one input names it from the input's
    key: ``key_after`` of a head whose :func:`~somatize.keys.before_one_key` is ``outer``,
    over ``"blake3:" + BLAKE3(inner + item).hex()``, in one call of the native host
    library, which holds no GIL as it hashes; None where that library is not loaded (yet)."""
    lib = _native.ready_host_library()
    make = getattr(lib, "smz_blake3_host_keys", None) if lib is not None else None
    if make is None or not items:
        return None
    count = len(items)
    offsets = (ctypes.c_uint64 * (count + 1))(*itertools.accumulate(map(len, items), initial=0))
    out = ctypes.create_string_buffer(71 * count)
    make(inner, len(inner), b"".join(items), offsets, count, outer, len(outer), out)
    made = out.raw.decode("ascii")
    return [made[i : i + 71] for i in range(0, 71 * count, 71)]


def digest_named(tensors: Mapping[str, torch.Tensor], kind: str = "dict") -> str:
    """``blake3:<hex>`` of named tensors: the canonical header of each one's name, dtype,
    shape and raw digest, names sorted — whatever order the mapping was filled in and
    wherever each tensor lives. ``kind`` says what the collection is (``dict``,
    ``tuple``, ``state``) so that a tuple and a dict of the same tensors differ."""
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"digest_named takes a mapping of names to tensors (a `state_dict()`, "
            f"`dict(module.named_parameters())`), got a `{type(tensors).__name__}`"
        )
    entries: dict[str, Any] = {}
    for name, tensor in tensors.items():
        entries[name] = [_dtype_code(tensor), list(tensor.shape), raw_digest(tensor)]
    data = _NAMED + canonical.encode([kind, entries])
    return "blake3:" + blake3.blake3(data).hexdigest()
