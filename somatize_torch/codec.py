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
builds it with ``torch.frombuffer`` over the memory the store read it into, so a
recalled 19 MB batch is not copied again on the host; a small one, or data aligned
less (an answer kept before), is copied into memory torch allocated.

Values it takes: one tensor, or a tuple, list or dict (str keys) of tensors,
which come back as the same kind — a dict in the order it was filled in; and,
nested in any way, tuples, lists, str-keyed dicts, ``collections.OrderedDict``,
namedtuples, ``torch.return_types`` structseqs (what ``h.max(dim=1)`` answers) and
dataclasses of tensors and ``None`` (``(hidden, None)``, ``(h, (a, b))``). A dataclass
may be a dict of its fields, as Hugging Face's ``ModelOutput`` is (an ``OrderedDict``
of its fields that are not None): its fields and which of them are keys are recorded.
Each of these comes back as its own class, found by its module and qualified name
among the modules already loaded, never imported: one defined inside a function
is refused, and one whose class is not loaded (or has other fields) where the
answer is read is :class:`~somatize.codecs.Unreadable`, an answer the engine computes again (an
``unreadable`` fact). A namedtuple is made as the tuple it is; a structseq by its class,
from its items; a dataclass has its fields and keys set as they were kept, running no
code of its class (a store naming a class gets none of its code run). A dataclass is
written only where its constructor, handed its fields, makes it again as it is (so the
value read is the value its constructor makes), and refused otherwise: a field with
``init=False``, a constructor that changes what it is handed, an attribute or a key
that is no field. Every other type — a subclass of list or dict, a number beside a tensor,
a tensor subclass or an ``nn.Parameter`` (a plain tensor is what would come back) — is
refused rather than written as something else: what is recalled is what was computed,
kind and order included. :meth:`TensorCodec.refusal` says which item
of a value is the one refused. A tensor that requires grad is neither written nor
weighed (a ``CodecError``): it would come back a leaf, and the gradient through what
made it would stop on a recall where it flowed on a miss. Every dtype of
:data:`somatize_torch.digest.DTYPES` round-trips (all of whole bytes: bf16, fp16, the
float8s, int8, bool, the complex ones included); :meth:`~TensorCodec.encode` of any
other is a ``CodecError`` naming it, as is that of a bool tensor holding a byte other
than 0 or 1, which the reader would take for damage. A tensor dense in memory in
another order of its dims than C order (channels_last, a transpose) is written as its
memory holds it, with no copy — its dims in that order in the header, so a safetensors
reader reads it right, and the order to put them back in under ``dims`` in the
``__metadata__`` — and comes back with the strides it had, so a kernel that picks its
path by memory format (a conv) answers the same bits on a hit as on a miss; one laid out
so with gaps (a half of a channels_last map split along its channels) is copied dense in
that order and comes back so, and any other non-contiguous tensor is written in C order.
A 0-dim or empty tensor keeps its shape.

The layout of the header: a flat tuple or list names its tensors ``0``, ``1``
…, a dict by its keys (the order it was filled in is recorded in the
``__metadata__`` when it is not the sorted one), one tensor ``tensor``; anything
else (``None`` in it, nesting, an ``OrderedDict``, a namedtuple, a structseq, a
dataclass) is kind
``tree``, its tensors named ``0``, ``1`` … in the order they are met, and its
shape — containers, keys, ``None`` and which tensor goes where — is recorded as
JSON in the ``__metadata__``. Answers written before either was recorded read as
they always did.

Devices: where each tensor lived is recorded in the header's ``__metadata__``
and a decoded tensor is moved back there. A tensor recalled in a process without
its device — a CUDA tensor where there is no CUDA or fewer devices, one kept on a
Mac (``mps``) read on Linux, any kind of device torch has no module for here —
lands on the CPU with a :class:`LandedOnHost` warning: its value is the same, and a
run that can go on should not be stopped for where memory is; move it yourself, or
silence the warning, if that is what you want. A device name that is no device at
all (or ``meta``, which holds no value) is a damaged answer.

**A recalled tensor is memory of its own.** It views what the store handed
this read alone (a private, copy-on-write map of a large blob; a copy of a small
one), so writing into it in place (``x.add_(1)``, ``relu(inplace=True)``) changes
that tensor only: the blob, and every later recall, keep the kept value.

The digest of a value is not the digest of these bytes: it is
:func:`somatize_torch.digest.digest_tensor` (one tensor) or
:func:`~somatize_torch.digest.digest_named` (a collection; a tree's under its
shape, its dicts in sorted order, each class by its name), computed where each tensor
lives, so equal tensors are equal whatever the JSON writer did or the order a dict was
filled in.

The codec's parts are modules of their own: the shape of a nested value, written,
checked and built again (:mod:`somatize_torch._codec_tree`), and the header, read and
checked once per distinct header (:mod:`somatize_torch._codec_header`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from somatize import CODECS, Codec, CodecError
from somatize.errors import SomatizeWarning
from somatize_torch._codec_header import _FORMAT, _ITEMSIZE, _LEN, _head, _header
from somatize_torch._codec_header import row_layout as row_layout
from somatize_torch._codec_tree import (
    Dataclass,
    _built,
    _is_tensor,
    _Refused,
    _shape,
    _unwritable,
)
from somatize_torch._errors import TANGENT, carries_tangent
from somatize_torch.digest import DTYPES, digest_named, digest_tensor, host_bytes, memory_of

__all__ = ["TENSOR", "LandedOnHost", "TensorCodec", "register"]

_ALIGN = 64
"""Where a recalled tensor's memory starts, as torch's own CPU allocations do: CPU kernels
take another path (and may round differently) over memory aligned less."""
_ALIGNED_ABOVE = 4096
"""From this many bytes of data on, an answer's data starts ``_ALIGN``-aligned in its bytes
(at most 56 bytes of padding, under 1.4%)."""


class LandedOnHost(SomatizeWarning):
    """A tensor kept on a device this process does not have (no CUDA, no such CUDA device,
    an ``mps`` or ``xpu`` tensor read elsewhere) was recalled onto the CPU."""


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
    if _is_flat(value, empty=True):
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


class TensorCodec(Codec):
    """A tensor, or tensors and None nested in tuples, lists, str-keyed dicts,
    namedtuples, structseqs and dataclasses, as safetensors bytes; see the module
    docstring."""

    name = "tensor"
    # A dataclass (Hugging Face's `ModelOutput`) may hold tensors, as the others may.
    types = (torch.Tensor, tuple, list, dict, Dataclass)

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
            unwritable = _unwritable(value)
            return None if unwritable is None else f"it is {unwritable}"
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
        # An empty tuple, list or dict is written as it is weighed, for a caller that hands
        # it here itself (the state of a module of no weights); an answer of one is left to
        # the plain codec, which `accepts` picks for it.
        refused = None if _is_flat(value, empty=True) else self.refusal(value)
        if refused is not None:
            raise CodecError(f"the `tensor` codec does not write this value: {refused}")
        kind, tensors, shape = _named(value)
        _refuse_grad(kind, tensors, "write")
        # Larger elements first, so that every tensor starts at a multiple of its own size.
        order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
        header: dict[str, Any] = {}
        devices: dict[str, str] = {}
        views: list[memoryview] = []
        at = 0
        dims: dict[str, list[int]] = {}
        for name in order:
            tensor = tensors[name]
            if tensor.dtype is torch.bool:
                _refuse_bools(kind, name, tensor)
            stored, back = _memory_order(tensor)
            if back is not None:
                dims[name] = back
            view = host_bytes(stored)
            header[name] = {
                "dtype": DTYPES[tensor.dtype],
                "shape": list(stored.shape),
                "data_offsets": [at, at + view.nbytes],
            }
            if tensor.device.type != "cpu":
                devices[name] = str(tensor.device)
            at += view.nbytes
            views.append(view)
        meta = {"format": _FORMAT, "kind": kind, **shape}
        if devices:
            meta["devices"] = json.dumps(devices, sort_keys=True)
        if dims:
            meta["dims"] = json.dumps(dims, sort_keys=True, separators=(",", ":"))
        header["__metadata__"] = meta
        raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        # The data starts 8-aligned, as safetensors asks; 64-aligned when it is large, so
        # that a large answer the store read is decoded in place with the alignment of torch's own
        # tensors (a small one is read by copy, into memory aligned so, where it is not).
        raw += b" " * (-(len(raw) + 8) % (_ALIGN if at >= _ALIGNED_ABOVE else 8))
        return [_LEN.pack(len(raw)) + raw, *views]

    def decode(self, data: memoryview) -> Any:
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        head = _head(data)
        header = _header(bytes(data[8:head]))
        body = data[head:]
        if header.end != len(body):  # nothing is written past the last tensor's bytes
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
                if dtype is torch.bool and count:
                    _check_bools(out[name], f"tensor {name!r} of an answer")
                if header.dims and name in header.dims:  # kept in memory order: no copy
                    out[name] = out[name].permute(header.dims[name])
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
            _refuse_grad("tensor", {"tensor": value}, "weigh")
            return digest_tensor(value)
        if _is_flat(value, empty=True):
            kind = "dict" if type(value) is dict else type(value).__name__
            named = dict(value) if kind == "dict" else {str(i): t for i, t in enumerate(value)}
            _refuse_grad(kind, named, "weigh")
            return digest_named(named, kind)
        # The shape with dicts in sorted order: equal content, equal digest, whatever
        # order a dict was filled in.
        leaves: list[torch.Tensor] = []
        try:
            shape = _shape(value, leaves, "", 0, ordered=False)
        except _Refused:
            raise CodecError(
                f"the `tensor` codec does not weigh this value: {self.refusal(value)}"
            ) from None
        described = json.dumps(shape, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        named = {str(i): t for i, t in enumerate(leaves)}
        _refuse_grad("tree", named, "weigh")
        return digest_named(named, f"tree:{described}")

    def stamp(self, value: Any) -> Hashable | None:
        """The version counter (bumped by every change in place), memory, shape, strides,
        dtype and device of a tensor, or of each tensor of a tuple; None for a list or a
        dict, whose items can be replaced, for an inference tensor, which has no version
        counter, and for a tensor that requires grad, which is refused at each weighing
        (turning it on moves no version counter)."""
        if isinstance(value, torch.Tensor):
            return None if value.is_inference() or value.requires_grad else stamp_of(value)
        if type(value) is tuple and all(
            isinstance(t, torch.Tensor) and not t.is_inference() and not t.requires_grad
            for t in value
        ):
            return tuple(map(stamp_of, value))
        return None


def _refuse_grad(kind: str, tensors: dict[str, torch.Tensor], action: str) -> None:
    """CodecError when a tensor of a value of ``kind`` (its ``tensors`` by name) requires
    grad, or carries a forward-mode tangent (:func:`~somatize_torch._errors.carries_tangent`).
    A written one would come back a leaf that does not, and a weighed one keys an answer
    that would: either way the gradient through what made the tensor (or its tangent)
    flows when the answer is computed and silently stops when it is recalled."""
    named = next((name for name, t in tensors.items() if t.requires_grad), None)
    if named is not None:
        what, flowing = f"{_which(kind, named)} a tensor that requires grad", "the gradient"
        do = (
            "Compute it under `torch.no_grad()`, or `.detach()` it, where no gradient is "
            "meant to pass; or do not cache a node that is trained through"
            if action == "write"
            else "Hand its values (`x.detach()`) where no gradient is meant to reach what "
            "made it; or do not cache the nodes it is handed to"
        )
    else:
        named = next((name for name, t in tensors.items() if carries_tangent(t)), None)
        if named is None:
            return
        what, flowing = f"{_which(kind, named)} a tensor that carries {TANGENT}", "its tangent"
        do = (
            "Hand its values (`x.detach()`, which drops the tangent, or "
            "`forward_ad.unpack_dual(x).primal`) where no tangent is meant to pass, or take "
            "the jvp through nodes that are not cached"
        )
    raise CodecError(
        f"the `tensor` codec does not {action} this value: {what}, and a recalled answer is a "
        f"leaf, so {flowing} through what made it would flow when the answer is computed "
        f"and silently stop when it is recalled. {do}"
    )


def _memory_order(tensor: torch.Tensor) -> tuple[torch.Tensor, list[int] | None]:
    """``tensor`` as it is written: itself when it is in C order (:func:`in_c_order`), or
    in no order of its dims (overlapping); one in another order of its dims (channels_last,
    a transpose, a channels_last map pooled to 1x1, which torch calls contiguous) with its
    dims in the order of its memory (:func:`memory_order`) — a contiguous view, so it is
    written with no copy, or a copy dense in that order where it has gaps — and the
    permutation that gives ``tensor`` back, with its strides (those of a dense one: no
    gaps), from what is read. A recalled answer then is laid out as the computed one was,
    and a kernel reading it (a conv, which picks its path by memory format) answers the
    same bits."""
    order = memory_order(tensor)
    if order is None:
        return tensor, None
    stored = tensor.permute(order)
    return (stored if stored.is_contiguous() else stored.contiguous()), inverse_order(order)


def memory_order(tensor: torch.Tensor) -> list[int] | None:
    """The order of the dims of ``tensor`` in its memory, outermost first, where it lies in
    another order of its dims than C order (channels_last, a transpose, a channels_last map
    pooled to 1x1), dense or with gaps (a half of a channels_last map split along its
    channels): a kernel reading it picks its path by that order. None for a tensor in C
    order, with gaps or not, and for one in no order of its dims (an expanded one, whose
    elements overlap)."""
    if tensor.dim() < 2 or in_c_order(tensor):
        return None
    strides = tensor.stride()
    order = sorted(range(tensor.dim()), key=lambda d: (-strides[d], d))
    # One whose memory order is C order is in C order, strides no order of its dims gives
    # back (a column of a batch) or not; so is one whose elements overlap.
    if order == sorted(order):
        return None
    stored = tensor.permute(order)
    return order if stored.is_contiguous() or _apart(stored) else None


def _apart(tensor: torch.Tensor) -> bool:
    """Whether the elements of ``tensor`` lie in memory in C order of its dims, none of
    them where another is (gaps between them allowed): each stride past what the dims
    after it span, those of size 1 left out."""
    spanned = 1
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride()), strict=True):
        if size == 1:
            continue
        if stride < spanned:
            return False
        spanned = stride * size
    return True


def in_c_order(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` has the strides of C order, those of its dims of size 1
    included: torch calls a tensor contiguous whatever the strides of those (a
    channels_last map pooled to 1x1, strides (C, 1, C, C)), and a kernel reading it picks
    its path by them all (a 1x1 conv after it answers other bits, and in C order, for
    strides (C, 1, 1, 1))."""
    if not tensor.numel():  # no element is anywhere
        return True
    step = 1
    for size, stride in zip(reversed(tensor.shape), reversed(tensor.stride()), strict=True):
        if stride != step:
            return False
        step *= size
    return True


def inverse_order(order: list[int]) -> list[int]:
    """The permutation that puts back what ``order`` permuted: ``t.permute(order)
    .permute(inverse_order(order))`` is ``t``."""
    back = [0] * len(order)
    for place, dim in enumerate(order):
        back[dim] = place
    return back


def _which(kind: str, name: str) -> str:
    """How a refusal names tensor ``name`` of a value of ``kind``: ``it is``, ``item [1]
    is``, or, in a tree, whose tensors are named by the order they are met, ``an item of
    it is``."""
    if kind == "tensor":
        return "it is"
    if kind == "tree":
        return "an item of it is"
    return f"item [{name!r}] is" if kind == "dict" else f"item [{name}] is"


def _refuse_bools(kind: str, name: str, tensor: torch.Tensor) -> None:
    """CodecError when bool ``tensor`` holds a byte other than 0 or 1 (a uint8 mask viewed as
    bool): torch writes no other, so the reader takes such bytes for damage, and an answer
    written with them would be computed again at every read."""
    if tensor.numel() and int(tensor.view(torch.uint8).max()) > 1:
        raise CodecError(
            f"the `tensor` codec does not write this value: {_which(kind, name)} a bool tensor "
            "holding bytes other than 0 and 1 (bytes viewed as bool, `mask.view(torch.bool)`), "
            "which torch never writes and which would read back as damaged. Make the bool by "
            "a comparison (`mask != 0`)"
        )


def _address(body: memoryview) -> int:
    """The address of the first byte of ``body`` (0 when it is empty)."""
    if not body.nbytes:
        return 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return int(torch.frombuffer(body, dtype=torch.uint8, count=1).data_ptr())


def _check_bools(tensor: torch.Tensor, what: str) -> None:
    """ValueError when a bool ``tensor`` (not empty) read from bytes holds a byte other than
    0 or 1: torch writes no other, and a bool of another byte answers ``t == True`` and
    ``t.int()`` differently."""
    if int(tensor.view(torch.uint8).max()) > 1:
        raise ValueError(f"{what} is a bool tensor with bytes other than 0 and 1: it is damaged")


def _aligned(data: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of ``dtype`` holding a copy of ``data``, in memory torch allocated."""
    flat = torch.empty(data.nbytes, dtype=torch.uint8)
    memory_of(flat, writable=True)[:] = data
    return flat.view(dtype)


def stamp_of(x: torch.Tensor) -> tuple[Any, ...]:
    """What must be unchanged for ``x`` to hold what it held: its version counter (bumped
    by every change in place through torch), its memory, layout, dtype and device."""
    return (x._version, x.data_ptr(), x.shape, x.stride(), x.dtype, x.device)


def _moves(device: str | None) -> bool:
    """Whether a tensor kept from ``device`` (None: the CPU) is moved there when read."""
    if device is None:
        return False
    where = torch.device(device)
    return where.type != "cpu" and _usable(where)


def _usable(where: torch.device) -> bool:
    """Whether this process has device ``where``: the CPU, or a device whose kind torch's
    module for it (``torch.cuda``, ``torch.backends.mps``, ``torch.xpu`` …) says is
    available, and of an index below the count of them; ``xla`` where ``torch_xla`` is
    loaded (it is not imported to read an answer). A kind with no such module here
    (``xla`` without it, ``hpu``, ``lazy`` …) is not usable: a tensor kept from it lands
    on the host."""
    if where.type == "cpu":
        return True
    if where.type == "xla":
        return "torch_xla" in sys.modules
    kind = getattr(torch, where.type, None)
    available = getattr(torch.backends.mps if where.type == "mps" else kind, "is_available", None)
    if not callable(available) or not available():
        return False
    count = getattr(kind, "device_count", None)
    return where.index is None or where.index < (count() if callable(count) else 1)


def _to_device(tensor: torch.Tensor, device: str, name: str) -> torch.Tensor:
    where = torch.device(device)
    if where.type != "cpu" and not _usable(where):
        index = "" if where.index is None else f" {where.index}"
        warnings.warn(
            f"tensor {name!r} was kept from {device}, and this process has no "
            f"{where.type.upper()} device{index}: it is recalled onto the CPU with the same "
            "value. Move it with `.to(...)` if it must be elsewhere",
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
