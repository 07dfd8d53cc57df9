"""The ``tensor`` codec: tensors as safetensors bytes, written from and read into memory
in place.

A tensor answer is kept in the safetensors layout — an 8-byte little-endian
header length, a JSON header naming each tensor's dtype, shape and byte range,
then the raw bytes — because its reader cannot run code, any safetensors
reader can open it, and its bytes are the tensor's own memory: encoding is a
header plus a view of each tensor (no joined copy), and decoding builds each
tensor with ``torch.frombuffer`` over the store's memory map, so a recalled
19 MB batch is not copied on the host.

Values it takes: one tensor, or a tuple, list or dict (str keys) of tensors —
one level, no nesting. Every dense dtype of :data:`somatize_torch.digest.DTYPES`
round-trips (bf16, fp16, int8, bool included), a non-contiguous tensor is
written in C order, and a 0-dim or empty tensor keeps its shape.

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
:func:`~somatize_torch.digest.digest_named` (a collection), computed where each
tensor lives, so equal tensors are equal whatever the JSON writer did.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import struct
import warnings
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch

from somatize import CODECS, Codec
from somatize.errors import SomatizeWarning
from somatize_torch.digest import DTYPES, digest_named, digest_tensor, host_bytes

__all__ = ["TENSOR", "LandedOnHost", "TensorCodec", "register"]

_BY_CODE = {code: dtype for dtype, code in DTYPES.items()}
_ITEMSIZE = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in DTYPES}
_LEN = struct.Struct("<Q")
_FORMAT = "somatize/tensor/1"
_KINDS = ("tensor", "tuple", "list", "dict")
_MAX_HEADER = 100 << 20


class LandedOnHost(SomatizeWarning):
    """A tensor kept on a device this process does not have was recalled onto the CPU."""


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout is torch.strided
        and value.dtype in DTYPES
        and not value.is_quantized
    )


def _named(value: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """The kind of ``value`` and its tensors by name (``tensor``; ``0``, ``1`` …; dict keys)."""
    if isinstance(value, torch.Tensor):
        return "tensor", {"tensor": value}
    if isinstance(value, tuple):
        return "tuple", {str(i): t for i, t in enumerate(value)}
    if isinstance(value, list):
        return "list", {str(i): t for i, t in enumerate(value)}
    return "dict", dict(value)


class TensorCodec(Codec):
    """A tensor, or a tuple, list or str-keyed dict of tensors, as safetensors bytes."""

    name = "tensor"
    types = (torch.Tensor, tuple, list, dict)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return _is_tensor(value)
        if isinstance(value, dict):
            return (
                bool(value)
                and all(type(k) is str and k != "__metadata__" for k in value)
                and all(_is_tensor(v) for v in value.values())
            )
        return bool(value) and all(_is_tensor(v) for v in value)

    def encode(self, value: Any) -> Sequence[memoryview | bytes]:
        kind, tensors = _named(value)
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
        meta = {"format": _FORMAT, "kind": kind}
        if devices:
            meta["devices"] = json.dumps(devices, sort_keys=True)
        header["__metadata__"] = meta
        raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        raw += b" " * (-(len(raw) + 8) % 8)  # the data starts 8-aligned, as safetensors writes it
        return [_LEN.pack(len(raw)) + raw, *views]

    def decode(self, data: memoryview) -> Any:
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        head = _head(data)
        header = _header(bytes(data[8:head]))
        body = data[head:]
        if header.end > len(body):
            raise ValueError(
                f"a tensor answer's header claims bytes up to {header.end}, and the answer "
                f"holds {len(body)}: it is damaged"
            )
        out: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings() if body.readonly else contextlib.nullcontext():
            # Bytes that crossed from a worker may be read-only; the tensors view them on purpose.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            for name, dtype, shape, start, count in header.tensors:
                out[name] = (
                    torch.frombuffer(body, dtype=dtype, count=count, offset=start).reshape(shape)
                    if count
                    else torch.empty(shape, dtype=dtype)
                )
        for name, device in header.devices.items():
            out[name] = _to_device(out[name], device, name)
        kind = header.kind
        if kind == "tensor":
            return out["tensor"]
        if kind == "dict":
            return out
        ordered = [out[str(i)] for i in range(len(out))]
        return tuple(ordered) if kind == "tuple" else ordered

    def digest(self, value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return digest_tensor(value)
        kind, tensors = _named(value)
        return digest_named(tensors, kind)

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
    shape, first byte and element count, where the tensors lived, and how many bytes of
    data they need."""

    kind: str
    tensors: list[tuple[str, torch.dtype, list[int], int, int]]
    devices: dict[str, str]
    end: int


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
    return _Header(kind, tensors, devices, max((end for _, end in spans), default=0))


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
