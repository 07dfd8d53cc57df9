"""The header of a tensor answer: where its data starts and what it says, read and checked
once per distinct header.

A tensor answer opens as a safetensors file does: an 8-byte little-endian length,
then a JSON header naming each tensor's dtype, shape and byte range, the codec's own
facts in its ``__metadata__`` (the format, the kind of value, where the tensors
lived, a dict's order, a tree's shape, the order of the dims of a tensor kept in the
order of its memory). A header is what a store hands back, so all
it says is checked before a byte of data is read as a tensor (:func:`_read_header`):
a known kind and format, the tensor names that kind implies, shapes and byte ranges
(lists of whole numbers) that agree with their dtypes, do not overlap and leave no
byte between them; a header that does not is a ValueError, a damaged answer.

The answers of one node share their header, so a header is read and checked once
per distinct bytes and kept (:func:`_header`): one of up to 64 KiB, and up to 4 MiB of
them, so that long headers are not held once their answers are gone.
:func:`row_layout` is what a row cache needs to read a whole batch of one-tensor
answers behind one header (:mod:`somatize_torch._row_codec`). The codec writes the header
(:meth:`somatize_torch.codec.TensorCodec.encode`), with the length and format named
here (:data:`_LEN`, :data:`_FORMAT`), so that what is written and what is read
agree.
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Any, NamedTuple

import torch

from somatize._threads import ProcessLock
from somatize.codecs import Unreadable
from somatize_torch._codec_tree import _read_json, _tree
from somatize_torch.digest import DTYPES

__all__ = ["row_layout"]

_BY_CODE = {code: dtype for dtype, code in DTYPES.items()}
_ITEMSIZE = {dtype: dtype.itemsize for dtype in DTYPES}
_LEN = struct.Struct("<Q")
_FORMAT = "somatize/tensor/1"
_KINDS = ("tensor", "tuple", "list", "dict", "tree")
_MAX_HEADER = 100 << 20


class _Header(NamedTuple):
    """What a tensor answer's header says, checked: its kind, each tensor's name, dtype,
    shape, first byte and element count, where the tensors lived, how many bytes of
    data they need, a dict's keys in the order it was filled in (None: sorted), the
    shape of a tree (see :func:`~somatize_torch._codec_tree._shape`), and, for each
    tensor kept in the order of its memory, the permutation of its dims that gives it
    back (None: all in C order)."""

    kind: str
    tensors: list[tuple[str, torch.dtype, list[int], int, int]]
    devices: dict[str, str]
    end: int
    order: tuple[str, ...] | None = None
    tree: Any = None
    dims: dict[str, list[int]] | None = None


_HEADERS: dict[bytes, _Header] = {}
"""Headers read, by their bytes: the answers of one node share theirs, so a recall of many
reads and checks each one once."""
_HEADERS_HELD = [0]
"""How many bytes the keys of :data:`_HEADERS` hold."""
_HEADERS_LOCK = ProcessLock()
"""Held while :data:`_HEADERS` is changed: unheld in a forked child (a DataLoader worker
forked as another thread reads an answer), which reads answers too."""
_KEPT_UP_TO = 64 << 10
"""The longest header kept: a row's, or an answer's of a few hundred tensors. A longer
one (only a value of very many tensors writes one) is read again at each recall."""
_KEPT_AT_MOST = (256, 4 << 20)
"""How many headers are kept, and how many bytes of them, before they are all let go."""


def _header(raw: bytes) -> _Header:
    """The checked header whose bytes are ``raw``; ValueError when it is damaged."""
    found = _HEADERS.get(raw)
    if found is None:
        try:
            found = _read_header(raw)
        except RecursionError:  # JSON nested past what this process reads: not the codec's
            raise ValueError("a tensor answer's header is nested too deep: it is damaged") from None
        if len(raw) <= _KEPT_UP_TO:
            with _HEADERS_LOCK:
                count, size = _KEPT_AT_MOST
                if len(_HEADERS) >= count or _HEADERS_HELD[0] + len(raw) > size:
                    _HEADERS.clear()
                    _HEADERS_HELD[0] = 0
                if raw not in _HEADERS:
                    _HEADERS[raw] = found
                    _HEADERS_HELD[0] += len(raw)
    return found


def _head(data: memoryview) -> int:
    """Where the data of the tensor answer ``data`` starts: past its header's length and
    its header. ValueError when the bytes are too few for them."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes are too few for a tensor answer")
    size = int(_LEN.unpack(data[:8])[0])
    if size > min(len(data) - 8, _MAX_HEADER):
        raise ValueError(f"a tensor answer's header says {size} bytes; there are not that many")
    return 8 + size


def row_layout(
    data: memoryview,
) -> tuple[bytes, torch.dtype, tuple[int, ...], int, list[int] | None]:
    """For an answer of one tensor: the bytes before its data (its header's length and its
    header), and that tensor's dtype, shape (as its memory holds it) and byte length, and
    the order its dims are put back in when it is kept in another order than C order
    (None when it is not), read once per distinct header; its data is the byte length
    that follows, from the first. ValueError when the answer holds anything else, or its
    header is damaged (the length of the answer is the caller's to check)."""
    head = _head(data)
    header = _header(bytes(data[8:head]))
    if header.kind != "tensor":
        raise ValueError("a row answer decodes to a collection of tensors, not to one row")
    ((_, dtype, shape, start, count),) = header.tensors
    if count and start:  # _read_header refuses it too: no byte before the first tensor's
        raise ValueError(f"a row answer's data starts {start} bytes in: it is damaged")
    back = header.dims["tensor"] if header.dims else None
    return bytes(data[:head]), dtype, tuple(shape), count * _ITEMSIZE[dtype], back


def _read_header(raw: bytes) -> _Header:
    try:
        header = _read_json(raw)
        meta = header.pop("__metadata__")
        kind = meta["kind"]
    except (ValueError, KeyError, TypeError, AttributeError) as why:
        raise ValueError(f"the header of a tensor answer cannot be read ({why})") from None
    if meta.get("format") != _FORMAT or kind not in _KINDS:
        _unknown_format(meta)
    names = sorted(header)
    expected = {"tensor": ["tensor"], "dict": names}.get(kind) or sorted(
        str(i) for i in range(len(header))
    )
    if names != expected:
        raise ValueError(f"a tensor answer of kind {kind!r} holds tensors {names[:8]}")
    devices = _devices(meta.get("devices", "{}"), names)
    dims = _dims(meta.get("dims", "{}"), header)
    order = _order(meta.get("order"), names) if kind == "dict" else None
    tree = _tree(meta.get("tree"), len(names)) if kind == "tree" else None
    tensors = []
    spans = []
    for name, entry in header.items():
        code = entry.get("dtype") if isinstance(entry, dict) else None
        if isinstance(code, str) and code not in _BY_CODE:
            raise Unreadable(
                f"tensor {name!r} of a tensor answer is of dtype {code[:40]!r}, which this "
                f"process (torch {torch.__version__}) has none of: a later torch or somatize "
                "wrote it. The answer is whole, and computed again here"
            )
        try:
            dtype = _BY_CODE[entry["dtype"]]
            shape = _whole_numbers(entry["shape"], "shape")
            start, end = _whole_numbers(entry["data_offsets"], "data_offsets", 2)
        except (KeyError, TypeError, ValueError) as why:
            raise ValueError(f"tensor {name!r} of an answer is not described ({why})") from None
        # A dimension past 2**48 is one the codec does not write; sizes whose product does
        # not fit in 63 bits are strides torch cannot compute, even for a tensor of no element.
        if any(not 0 <= n < 1 << 48 for n in shape) or _strides_overflow(shape):
            raise ValueError(f"tensor {name!r} of an answer has shape {shape[:8]}: it is damaged")
        count = math.prod(shape)
        if not 0 <= start <= end or end - start != count * _ITEMSIZE[dtype]:
            raise ValueError(
                f"tensor {name!r} of an answer claims bytes {start}..{end} for {count} elements "
                f"of {entry['dtype']}: it is damaged"
            )
        if count:
            spans.append((start, end))
        tensors.append((name, dtype, shape, start, count))
    spans.sort()
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        raise ValueError("tensors of a tensor answer claim the same bytes: it is damaged")
    # The codec writes the tensors' bytes one after the other from the first: a byte no
    # tensor claims (which safetensors forbids too) is not one it wrote.
    if spans and (spans[0][0] or any(a[1] != b[0] for a, b in itertools.pairwise(spans))):
        raise ValueError("a tensor answer holds bytes no tensor claims: it is damaged")
    end = max((end for _, end in spans), default=0)
    return _Header(kind, tensors, devices, end, order, tree, dims)


def _unknown_format(meta: dict[str, Any]) -> None:
    """Refuses a tensor answer whose header names a format or kind this somatize does not
    write: :class:`~somatize.codecs.Unreadable` where a later one wrote it (a later version
    of the format, a kind it names), so the answer is said whole and computed again;
    ValueError, damage, for anything else."""
    format, kind = meta.get("format"), meta.get("kind")
    prefix, _, version = format.rpartition("/") if isinstance(format, str) else ("", "", "")
    if prefix == _FORMAT.rpartition("/")[0] and version.isdigit() and version.isascii():
        if int(version) > int(_FORMAT.rpartition("/")[2]):
            raise Unreadable(
                f"a tensor answer was written by a later somatize, in format {format!r} (this "
                f"one reads {_FORMAT!r}): the answer is whole, and computed again here"
            )
        if format == _FORMAT and isinstance(kind, str):
            raise Unreadable(
                f"a tensor answer is of kind {kind[:40]!r}, which a later somatize writes and "
                "this one does not read: the answer is whole, and computed again here"
            )
    raise ValueError(f"a tensor answer of an unknown kind or format: {str(meta)[:200]}")


def _whole_numbers(raw: Any, what: str, length: int | None = None) -> list[int]:
    """``raw``, a JSON list of whole numbers (of ``length`` of them, when given), as the
    codec writes a shape or a byte range; TypeError for anything else (a string, a number
    that is not whole, ``true``)."""
    if (
        type(raw) is not list
        or not all(type(n) is int for n in raw)
        or (length is not None and len(raw) != length)
    ):
        raise TypeError(f"its {what} is {str(raw)[:80]}, not a list of whole numbers")
    return raw


def _strides_overflow(shape: list[int]) -> bool:
    """Whether the strides of a contiguous tensor of ``shape`` do not fit in 63 bits: the
    first is the product of the later sizes, a size of 0 counted as 1. It stops at the
    first product past that, however many sizes a header lists."""
    product = 1
    for n in shape[1:]:
        product *= max(n, 1)
        if product >= 1 << 63:
            return True
    return False


def _order(raw: Any, names: list[str]) -> tuple[str, ...] | None:
    """The order a dict answer was filled in, as its header records it (None: sorted)."""
    if raw is None:
        return None
    try:
        order = _read_json(raw)
    except (ValueError, TypeError) as why:
        raise ValueError(f"the order of a dict answer cannot be read ({why})") from None
    if not isinstance(order, list) or sorted(order) != names:
        raise ValueError(f"the order of a dict answer names other keys than its tensors: {raw!r}")
    return tuple(order)


def _dims(raw: Any, header: dict[str, Any]) -> dict[str, list[int]] | None:
    """The order the dims of each tensor kept in memory order are put back in, by name, as
    the header records it (a permutation of its dims; none for a tensor kept in C order,
    and for an answer written before the order was kept)."""
    try:
        dims = _read_json(raw)
        if not isinstance(dims, dict) or not set(dims) <= set(header):
            raise ValueError(f"{raw!r} names no tensor of the answer")
        for name, back in dims.items():
            shape = header[name].get("shape") if isinstance(header[name], dict) else None
            if (
                type(back) is not list
                or not all(type(d) is int for d in back)
                or type(shape) is not list
                or sorted(back) != list(range(len(shape)))
            ):
                raise ValueError(f"{str(back)[:80]} is no order of the dims of {name!r}")
    except (ValueError, TypeError) as why:
        raise ValueError(
            f"the order of the dims of a tensor answer cannot be read ({why})"
        ) from None
    return dims or None


def _devices(raw: Any, names: list[str]) -> dict[str, str]:
    """Where the tensors of an answer lived, by name, as the header records it."""
    try:
        devices = _read_json(raw)
        if not isinstance(devices, dict) or not set(devices) <= set(names):
            raise ValueError(f"devices {raw!r} name no tensor of the answer")
        for device in devices.values():
            # As the codec writes it, ``str(tensor.device)``: torch reads ``cuda:256`` as
            # ``cuda:0`` and ``cuda:128`` as ``cuda:-128``. A meta tensor holds no value.
            where = torch.device(device)
            if where.type == "meta" or str(where) != device:
                raise ValueError(f"device {device!r}")
    except (ValueError, TypeError, RuntimeError) as why:
        raise ValueError(f"where the tensors of an answer lived cannot be read ({why})") from None
    return devices
