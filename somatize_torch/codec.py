"""The ``tensor`` codec: tensors as safetensors bytes, written from and read into memory
in place.

A tensor answer is kept in the safetensors layout — an 8-byte little-endian
header length, a JSON header naming each tensor's dtype, shape and byte range,
then the raw bytes — because its reader cannot run code, any safetensors
reader can open it (one of the dtypes it has no name for is written under a name
in its manner: ``C128``, ``C32``, ``F8_E4M3FNUZ``, ``F8_E5M2FNUZ``), and its bytes
are the tensor's own memory: encoding is a header plus a view of each tensor (no
joined copy). A recalled tensor starts 64-aligned, as torch's own CPU tensors do (CPU
kernels round differently over memory aligned less, so a hit would not answer what the
miss did to the last bit): a large answer's data is written 64-aligned and decoding
builds it with ``torch.frombuffer`` over the store's memory map, so a recalled 19 MB
batch is not copied on the host; a small one, or data aligned less (an answer kept
before), is copied into memory torch allocated.

Values it takes: one tensor, or a tuple, list or dict (str keys) of tensors,
which come back as the same kind — a dict in the order it was filled in; and,
nested in any way, tuples, lists, str-keyed dicts, ``collections.OrderedDict``
and namedtuples of tensors and ``None`` (``(hidden, None)``, ``(h, (a, b))``).
A namedtuple comes back as its own class, found by its module and qualified name
among the modules already loaded, never imported: one defined inside a function
is refused, and one whose class is not loaded (or has other fields) where the
answer is read is :class:`~somatize.codecs.Unreadable`, an answer the engine computes again (an
``unreadable`` fact). Every other type — a subclass of list or dict, a number beside a tensor
— is refused rather than written as something else: what is recalled is what was
computed, kind and order included. :meth:`TensorCodec.refusal` says which item
of a value is the one refused. Every dtype of :data:`somatize_torch.digest.DTYPES`
round-trips (all of whole bytes: bf16, fp16, the float8s, int8, bool, the complex ones
included); :meth:`~TensorCodec.encode` of any other is a ``CodecError`` naming it. A
non-contiguous tensor is written in C order, and a 0-dim or empty tensor keeps its shape.

The layout of the header: a flat tuple or list names its tensors ``0``, ``1``
…, a dict by its keys (the order it was filled in is recorded in the
``__metadata__`` when it is not the sorted one), one tensor ``tensor``; anything
else (``None`` in it, nesting, an ``OrderedDict``, a namedtuple) is kind
``tree``, its tensors named ``0``, ``1`` … in the order they are met, and its
shape — containers, keys, ``None`` and which tensor goes where — is recorded as
JSON in the ``__metadata__``. Answers written before either was recorded read as
they always did.

Devices: where each tensor lived is recorded in the header's ``__metadata__``
and a decoded tensor is moved back there. A CUDA tensor recalled in a process
without CUDA lands on the CPU with a :class:`LandedOnHost` warning — its value
is the same, and a run that can go on should not be stopped for where memory
is; move it yourself, or silence the warning, if that is what you want.

**A recalled tensor is memory of its own.** It views what the store handed
this read alone (a private, copy-on-write map of a large blob; a copy of a small
one), so writing into it in place (``x.add_(1)``, ``relu(inplace=True)``) changes
that tensor only: the blob, and every later recall, keep the kept value.

The digest of a value is not the digest of these bytes: it is
:func:`somatize_torch.digest.digest_tensor` (one tensor) or
:func:`~somatize_torch.digest.digest_named` (a collection; a tree's under its
shape, its dicts in sorted order), computed where each tensor lives, so equal
tensors are equal whatever the JSON writer did or the order a dict was filled in.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import math
import struct
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch

from somatize import CODECS, Codec, CodecError
from somatize.catalog import held_at
from somatize.codecs import Unreadable
from somatize.errors import SomatizeWarning
from somatize_torch.digest import DTYPES, digest_named, digest_tensor, host_bytes, memory_of

__all__ = ["TENSOR", "LandedOnHost", "TensorCodec", "register"]

_BY_CODE = {code: dtype for dtype, code in DTYPES.items()}
_ITEMSIZE = {dtype: dtype.itemsize for dtype in DTYPES}
_LEN = struct.Struct("<Q")
_FORMAT = "somatize/tensor/1"
_KINDS = ("tensor", "tuple", "list", "dict", "tree")
_MAX_HEADER = 100 << 20
_MAX_DEPTH = 32
"""How deep containers may nest in one answer."""
_ALIGN = 64
"""Where a recalled tensor's memory starts, as torch's own CPU allocations do: CPU kernels
take another path (and may round differently) over memory aligned less."""
_ALIGNED_ABOVE = 4096
"""From this many bytes of data on, an answer's data starts ``_ALIGN``-aligned in its bytes
(at most 56 bytes of padding, under 1.4%)."""


class LandedOnHost(SomatizeWarning):
    """A tensor kept on a device this process does not have was recalled onto the CPU."""


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout is torch.strided
        and value.dtype in DTYPES
        and not value.is_quantized
    )


def _is_flat(value: Any, empty: bool = False) -> bool:
    """Whether ``value`` is a plain tuple, list or str-keyed dict of tensors — non-empty,
    unless ``empty`` — the kinds written (and digested) as they were before nesting was."""
    kind = type(value)
    if kind is dict:
        return (
            (empty or bool(value))
            and all(type(k) is str and k != "__metadata__" for k in value)
            and all(_is_tensor(v) for v in value.values())
        )
    return (
        (kind is tuple or kind is list) and (empty or bool(value)) and all(map(_is_tensor, value))
    )


def _named(value: Any) -> tuple[str, dict[str, torch.Tensor], dict[str, str]]:
    """The kind of ``value``, its tensors by name (``tensor``; ``0``, ``1`` …; dict keys),
    and what the header's ``__metadata__`` must say besides to rebuild it."""
    if isinstance(value, torch.Tensor):
        return "tensor", {"tensor": value}, {}
    if _is_flat(value):
        if type(value) is dict:
            keys = list(value)
            order = {} if keys == sorted(keys) else {"order": json.dumps(keys)}
            return "dict", dict(value), order
        kind = "tuple" if type(value) is tuple else "list"
        return kind, {str(i): t for i, t in enumerate(value)}, {}
    leaves: list[torch.Tensor] = []
    shape = _shape(value, leaves, "", 0, ordered=True)
    tree = json.dumps(shape, separators=(",", ":"), ensure_ascii=False)
    return "tree", {str(i): t for i, t in enumerate(leaves)}, {"tree": tree}


class _Refused(Exception):
    """An item of a value the codec does not write: where it is, and what it is."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(where, what)
        self.where = where
        self.what = what


def _kind_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _shape(value: Any, leaves: list[torch.Tensor], where: str, depth: int, ordered: bool) -> Any:
    """The JSON shape of a nested ``value``, its tensors appended to ``leaves`` in the
    order they are met (a dict's items in the order it was filled in when ``ordered``,
    sorted otherwise): a tensor is its index in ``leaves``, None is null, a container is
    ``{"tuple" | "list": [...]}``, ``{"dict" | "OrderedDict": [[key, ...], ...]}`` or
    ``{"namedtuple": "module:qualname", "fields": [...], "items": [...]}``. _Refused
    for anything else."""
    if isinstance(value, torch.Tensor):
        if not _is_tensor(value):
            raise _Refused(where, f"a {value.layout} {value.dtype} tensor")
        leaves.append(value)
        return len(leaves) - 1
    if value is None:
        return None
    if depth >= _MAX_DEPTH:
        raise _Refused(where, f"nested more than {_MAX_DEPTH} containers deep")
    kind = type(value)
    if kind is tuple or kind is list:
        items = [
            _shape(v, leaves, f"{where}[{i}]", depth + 1, ordered) for i, v in enumerate(value)
        ]
        return {kind.__name__: items}
    if kind is dict or kind is OrderedDict:
        for key in value:
            if type(key) is not str:
                raise _Refused(f"{where}[{key!r}]", f"under a `{_kind_name(type(key))}` key")
        keys = list(value) if ordered or kind is OrderedDict else sorted(value)
        pairs = [[k, _shape(value[k], leaves, f"{where}[{k!r}]", depth + 1, ordered)] for k in keys]
        return {kind.__name__: pairs}
    fields = _named_tuple(kind) if issubclass(kind, tuple) else None
    if fields is not None:
        named = f"{kind.__module__}:{kind.__qualname__}"
        if _class_at(named, fields) is not kind:
            raise _Refused(
                where,
                f"a `{_kind_name(kind)}` namedtuple, whose class cannot be found again by its "
                "name (it is defined inside a function, or another class took its name)",
            )
        items = [
            _shape(v, leaves, f"{where}.{field}", depth + 1, ordered)
            for field, v in zip(fields, value, strict=True)
        ]
        return {"namedtuple": named, "fields": list(fields), "items": items}
    raise _Refused(where, f"a `{_kind_name(kind)}`")


def _named_tuple(kind: type) -> tuple[str, ...] | None:
    """The fields of namedtuple class ``kind``, or None when it is not one."""
    fields = inspect.getattr_static(kind, "_fields", None)
    if (
        isinstance(fields, tuple)
        and all(type(f) is str for f in fields)
        and inspect.getattr_static(kind, "_make", None) is not None
    ):
        return fields
    return None


def _class_at(named: str, fields: Sequence[str]) -> type | None:
    """The namedtuple class ``module:qualname`` with ``fields`` among the modules this
    process has loaded — never importing one — or None."""
    module, _, qualname = named.partition(":")
    if "<locals>" in qualname:
        return None
    found = held_at(module, qualname)  # no code runs for a name a store gave
    if (
        isinstance(found, type)
        and issubclass(found, tuple)
        and _named_tuple(found) == tuple(fields)
    ):
        return found
    return None


class TensorCodec(Codec):
    """A tensor, or tensors and None nested in tuples, lists, str-keyed dicts and
    namedtuples, as safetensors bytes; see the module docstring."""

    name = "tensor"
    types = (torch.Tensor, tuple, list, dict)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return _is_tensor(value)
        if _is_flat(value):
            return True
        return self.refusal(value) is None

    def refusal(self, value: Any) -> str | None:
        """Why this codec does not write ``value``, naming the item refused (``item [1][0]
        is a `builtins.int```), or None when it does."""
        if isinstance(value, torch.Tensor):
            return None if _is_tensor(value) else f"it is a {value.layout} {value.dtype} tensor"
        leaves: list[torch.Tensor] = []
        try:
            _shape(value, leaves, "", 0, ordered=True)
        except _Refused as refused:
            return (
                f"item {refused.where} is {refused.what}"
                if refused.where
                else f"it is {refused.what}"
            )
        return None if leaves else "it holds no tensor"

    def encode(self, value: Any) -> Sequence[memoryview | bytes]:
        refused = None if _is_flat(value) else self.refusal(value)
        if refused is not None:
            raise CodecError(f"the `tensor` codec does not write this value: {refused}")
        kind, tensors, shape = _named(value)
        # Larger elements first, so that every tensor starts at a multiple of its own size.
        order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
        header: dict[str, Any] = {}
        devices: dict[str, str] = {}
        views: list[memoryview] = []
        at = 0
        for name in order:
            tensor = tensors[name]
            view = host_bytes(tensor)
            header[name] = {
                "dtype": DTYPES[tensor.dtype],
                "shape": list(tensor.shape),
                "data_offsets": [at, at + view.nbytes],
            }
            if tensor.device.type != "cpu":
                devices[name] = str(tensor.device)
            at += view.nbytes
            views.append(view)
        meta = {"format": _FORMAT, "kind": kind, **shape}
        if devices:
            meta["devices"] = json.dumps(devices, sort_keys=True)
        header["__metadata__"] = meta
        raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        # The data starts 8-aligned, as safetensors asks; 64-aligned when it is large, so
        # that a memory-mapped answer is read in place with the alignment of torch's own
        # tensors (a small one is read by copy, into memory aligned so, where it is not).
        raw += b" " * (-(len(raw) + 8) % (_ALIGN if at >= _ALIGNED_ABOVE else 8))
        return [_LEN.pack(len(raw)) + raw, *views]

    def decode(self, data: memoryview) -> Any:
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        head = _head(data)
        try:
            header = _header(bytes(data[8:head]))
        except RecursionError:  # JSON nested past what this process reads: not ours
            raise ValueError("a tensor answer's header is nested too deep: it is damaged") from None
        body = data[head:]
        if header.end > len(body):
            raise ValueError(
                f"a tensor answer's header claims bytes up to {header.end}, and the answer "
                f"holds {len(body)}: it is damaged"
            )
        out: dict[str, torch.Tensor] = {}
        at = _address(body)
        with warnings.catch_warnings() if body.readonly else contextlib.nullcontext():
            # Bytes that crossed from a worker may be read-only; the tensors view them on purpose.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            for name, dtype, shape, start, count in header.tensors:
                if not count:
                    out[name] = torch.empty(shape, dtype=dtype)
                elif (at + start) % _ALIGN == 0 or _moves(header.devices.get(name)):
                    # In place: the memory is aligned as torch's own, or the tensor is
                    # moved to its device, into memory of its own, at once.
                    out[name] = torch.frombuffer(
                        body, dtype=dtype, count=count, offset=start
                    ).reshape(shape)
                else:
                    out[name] = _aligned(body[start : start + count * _ITEMSIZE[dtype]], dtype)
                    out[name] = out[name].reshape(shape)
        for name, device in header.devices.items():
            out[name] = _to_device(out[name], device, name)
        kind = header.kind
        if kind == "tensor":
            return out["tensor"]
        if kind == "dict":
            return out if header.order is None else {k: out[k] for k in header.order}
        ordered = [out[str(i)] for i in range(len(out))]
        if kind == "tree":
            try:
                return _built(header.tree, ordered)
            except RecursionError:
                raise ValueError(
                    "a tensor answer's shape is nested too deep: it is damaged"
                ) from None
        return tuple(ordered) if kind == "tuple" else ordered

    def digest(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return digest_tensor(value)
        if _is_flat(value, empty=True):
            kind = "dict" if type(value) is dict else type(value).__name__
            named = dict(value) if kind == "dict" else {str(i): t for i, t in enumerate(value)}
            return digest_named(named, kind)
        # The shape with dicts in sorted order: equal content, equal digest, whatever
        # order a dict was filled in.
        leaves: list[torch.Tensor] = []
        shape = _shape(value, leaves, "", 0, ordered=False)
        described = json.dumps(shape, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        return digest_named({str(i): t for i, t in enumerate(leaves)}, f"tree:{described}")

    def stamp(self, value: Any) -> Hashable | None:
        """The version counter (bumped by every change in place), memory, shape, strides,
        dtype and device of a tensor, or of each tensor of a tuple; None for a list or a
        dict, whose items can be replaced, and for an inference tensor, which has no
        version counter."""
        if isinstance(value, torch.Tensor):
            return None if value.is_inference() else stamp_of(value)
        if type(value) is tuple and all(
            isinstance(t, torch.Tensor) and not t.is_inference() for t in value
        ):
            return tuple(map(stamp_of, value))
        return None


class _Header(NamedTuple):
    """What a tensor answer's header says, checked: its kind, each tensor's name, dtype,
    shape, first byte and element count, where the tensors lived, how many bytes of
    data they need, a dict's keys in the order it was filled in (None: sorted), and the
    shape of a tree (see :func:`_shape`)."""

    kind: str
    tensors: list[tuple[str, torch.dtype, list[int], int, int]]
    devices: dict[str, str]
    end: int
    order: tuple[str, ...] | None = None
    tree: Any = None


_HEADERS: dict[bytes, _Header] = {}
"""Headers read, by their bytes: the answers of one node share theirs, so a recall of many
reads and checks each one once."""


def _header(raw: bytes) -> _Header:
    """The checked header whose bytes are ``raw``; ValueError when it is damaged."""
    found = _HEADERS.get(raw)
    if found is None:
        found = _read_header(raw)
        if len(_HEADERS) >= 256:
            _HEADERS.clear()
        _HEADERS[raw] = found
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


def row_layout(data: memoryview) -> tuple[bytes, torch.dtype, tuple[int, ...], int]:
    """For an answer of one tensor: the bytes before its data (its header's length and its
    header), and that tensor's dtype, shape and byte length, read once per distinct
    header. ValueError when the answer holds anything else, or is damaged."""
    head = _head(data)
    header = _header(bytes(data[8:head]))
    if header.kind != "tensor":
        raise ValueError("a row answer decodes to a collection of tensors, not to one row")
    ((_, dtype, shape, _, count),) = header.tensors
    return bytes(data[:head]), dtype, tuple(shape), count * _ITEMSIZE[dtype]


def _read_header(raw: bytes) -> _Header:
    try:
        header = json.loads(raw)
        meta = header.pop("__metadata__")
        kind = meta["kind"]
    except (ValueError, KeyError, TypeError, AttributeError) as why:
        raise ValueError(f"the header of a tensor answer cannot be read ({why})") from None
    if kind not in _KINDS or meta.get("format") != _FORMAT:
        raise ValueError(f"a tensor answer of an unknown kind or format: {meta!r}")
    names = sorted(header)
    expected = {"tensor": ["tensor"], "dict": names}.get(kind) or sorted(
        str(i) for i in range(len(header))
    )
    if names != expected:
        raise ValueError(f"a tensor answer of kind {kind!r} holds tensors {names[:8]}")
    devices = _devices(meta.get("devices", "{}"), names)
    order = _order(meta.get("order"), names) if kind == "dict" else None
    tree = _tree(meta.get("tree"), len(names)) if kind == "tree" else None
    tensors = []
    spans = []
    for name, entry in header.items():
        try:
            dtype = _BY_CODE[entry["dtype"]]
            shape = [int(n) for n in entry["shape"]]
            start, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as why:
            raise ValueError(f"tensor {name!r} of an answer is not described ({why})") from None
        if any(not 0 <= n < 1 << 48 for n in shape):
            raise ValueError(f"tensor {name!r} of an answer has shape {shape}: it is damaged")
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
    return _Header(kind, tensors, devices, max((end for _, end in spans), default=0), order, tree)


def _order(raw: Any, names: list[str]) -> tuple[str, ...] | None:
    """The order a dict answer was filled in, as its header records it (None: sorted)."""
    if raw is None:
        return None
    try:
        order = json.loads(raw)
    except (ValueError, TypeError) as why:
        raise ValueError(f"the order of a dict answer cannot be read ({why})") from None
    if not isinstance(order, list) or sorted(order) != names:
        raise ValueError(f"the order of a dict answer names other keys than its tensors: {raw!r}")
    return tuple(order)


def _tree(raw: Any, count: int) -> Any:
    """The shape of a tree answer, as its header records it, checked: every container
    well formed, and each of its ``count`` tensors in it exactly once."""
    try:
        shape = json.loads(raw)
    except (ValueError, TypeError) as why:
        raise ValueError(f"the shape of a tensor answer cannot be read ({why})") from None
    seen: list[int] = []
    _check_tree(shape, seen, 0)
    if sorted(seen) != list(range(count)):
        raise ValueError(f"the shape of a tensor answer places tensors {seen[:8]} of {count}")
    return shape


def _check_tree(shape: Any, seen: list[int], depth: int) -> None:
    if shape is None:
        return
    if type(shape) is int:
        seen.append(shape)
        return
    bad = ValueError(f"the shape of a tensor answer is damaged at {str(shape)[:80]}")
    if type(shape) is not dict or depth >= _MAX_DEPTH:
        raise bad
    if len(shape) == 1:
        ((kind, items),) = shape.items()
        if kind in ("tuple", "list") and type(items) is list:
            for item in items:
                _check_tree(item, seen, depth + 1)
            return
        if kind in ("dict", "OrderedDict") and type(items) is list:
            keys = []
            for pair in items:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
                    raise bad
                keys.append(pair[0])
                _check_tree(pair[1], seen, depth + 1)
            if len(set(keys)) != len(keys):
                raise bad
            return
        raise bad
    named, fields, items = (shape.get(k) for k in ("namedtuple", "fields", "items"))
    if (
        len(shape) != 3
        or type(named) is not str
        or type(fields) is not list
        or not all(type(f) is str for f in fields)
        or type(items) is not list
        or len(items) != len(fields)
    ):
        raise bad
    for item in items:
        _check_tree(item, seen, depth + 1)


def _built(shape: Any, tensors: list[torch.Tensor]) -> Any:
    """The value of a checked tree ``shape`` whose tensors are ``tensors``."""
    if shape is None:
        return None
    if type(shape) is int:
        return tensors[shape]
    if "namedtuple" in shape:
        kind = _class_at(shape["namedtuple"], shape["fields"])
        if kind is None:
            raise Unreadable(
                f"a tensor answer is a `{shape['namedtuple']}` namedtuple with fields "
                f"{shape['fields']}, and no such class is loaded in this process: it is not "
                "imported to read an answer, so the answer is computed again"
            )
        # Made as the tuple it is, so no code of the class runs for what a store says.
        return tuple.__new__(kind, [_built(item, tensors) for item in shape["items"]])
    ((kind_name, items),) = shape.items()
    if kind_name == "tuple":
        return tuple(_built(item, tensors) for item in items)
    if kind_name == "list":
        return [_built(item, tensors) for item in items]
    pairs = ((key, _built(item, tensors)) for key, item in items)
    return OrderedDict(pairs) if kind_name == "OrderedDict" else dict(pairs)


def _address(body: memoryview) -> int:
    """The address of the first byte of ``body`` (0 when it is empty)."""
    if not body.nbytes:
        return 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return int(torch.frombuffer(body, dtype=torch.uint8, count=1).data_ptr())


def _aligned(data: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of ``dtype`` holding a copy of ``data``, in memory torch allocated."""
    flat = torch.empty(data.nbytes, dtype=torch.uint8)
    memory_of(flat, writable=True)[:] = data
    return flat.view(dtype)


def stamp_of(x: torch.Tensor) -> tuple[Any, ...]:
    """What must be unchanged for ``x`` to hold what it held: its version counter (bumped
    by every change in place through torch), its memory, layout, dtype and device."""
    return (x._version, x.data_ptr(), x.shape, x.stride(), x.dtype, x.device)


def _devices(raw: Any, names: list[str]) -> dict[str, str]:
    """Where the tensors of an answer lived, by name, as the header records it."""
    try:
        devices = json.loads(raw)
        if not isinstance(devices, dict) or not set(devices) <= set(names):
            raise ValueError(f"devices {raw!r} name no tensor of the answer")
        for device in devices.values():
            if torch.device(device).type == "meta":  # a meta tensor holds no value
                raise ValueError(f"device {device!r}")
    except (ValueError, TypeError, RuntimeError) as why:
        raise ValueError(f"where the tensors of an answer lived cannot be read ({why})") from None
    return devices


def _moves(device: str | None) -> bool:
    """Whether a tensor kept from ``device`` (None: the CPU) is moved there when read."""
    if device is None:
        return False
    return torch.device(device).type != "cuda" or torch.cuda.is_available()


def _to_device(tensor: torch.Tensor, device: str, name: str) -> torch.Tensor:
    where = torch.device(device)
    if where.type == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            f"tensor {name!r} was kept from {device}, and this process has no CUDA device: it "
            "is recalled onto the CPU with the same value. Move it with `.to(...)` if it must "
            "be elsewhere",
            LandedOnHost,
            stacklevel=4,
        )
        return tensor
    return tensor.to(where)


TENSOR = TensorCodec()
"""The codec instance registered as ``tensor``."""


def register() -> None:
    """Registers the ``tensor`` codec with :data:`somatize.CODECS` (idempotent)."""
    CODECS.register(TENSOR)
