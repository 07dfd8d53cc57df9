"""The canonical encoding: one byte string per value, the same in every process.

A key names what was computed, so everything that goes into a key must be
written down the same way by every process that will ever ask for it: a client,
a worker, next week's run. Python's own ``hash()`` is salted per process and
``pickle`` writes the same value in several ways, so neither will do; this module
is the one place that decides how a value becomes bytes.

Canonical values are None, bool, int, float, str, bytes, and lists, tuples and
dicts (with str keys) of them. The encoding is a tag byte per value followed by
its payload; lengths are 8-byte big-endian. It is exact about types: ``1``,
``1.0`` and ``True`` are three different values, and so are ``(1, 2)`` and
``[1, 2]``, because a node handed one of them may well answer differently than
when handed the other. Floats are written by their IEEE-754 bits, so ``0.0`` and
``-0.0`` differ too. Dict entries are sorted by key, so insertion order never
matters.

The encoding is versioned by :data:`VERSION`; the key formula mixes the version
in, so a change here changes every key on purpose rather than by accident.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import blake3

from somatize.errors import SomatizeError

__all__ = [
    "VERSION",
    "NotCanonical",
    "decode",
    "digest_of",
    "encode",
    "hex_of",
    "is_canonical",
    "parts_of",
]

VERSION = 1
"""Bumped whenever the bytes written for some value change."""

_LEN = struct.Struct(">Q")
_FLOAT = struct.Struct(">d")
_LARGE = 1 << 20
"""Above this many payload bytes, hashing uses every core."""


class NotCanonical(SomatizeError, TypeError):
    """A value that has no canonical form, so no key can be written for it."""


Parts = list[bytes | memoryview]
Where = tuple[Any, ...]
"""Where a value sits in what is being encoded, as (parent, key) pairs; turned into text
only when something has to be refused, so the common path pays nothing for it."""


def _render(where: Where) -> str:
    steps = []
    while len(where) == 2:
        where, key = where
        steps.append(f"[{key!r}]")
    return str(where[0]) + "".join(reversed(steps))


def _none(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"N")


def _bool(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"T" if value else b"F")


def _int(value: Any, parts: Parts, where: Where) -> None:
    size = (value.bit_length() + 8) // 8
    parts.append(b"i" + _LEN.pack(size) + value.to_bytes(size, "big", signed=True))


def _float(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"f" + _FLOAT.pack(value))


def _str(value: Any, parts: Parts, where: Where) -> None:
    raw = value.encode("utf-8", "surrogatepass")
    parts.append(b"s" + _LEN.pack(len(raw)) + raw)


def _bytes(value: Any, parts: Parts, where: Where) -> None:
    view = memoryview(value).cast("B")
    parts.append(b"b" + _LEN.pack(view.nbytes))
    parts.append(view)


def _sequence(tag: bytes) -> Callable[[Any, Parts, Where], None]:
    def write(value: Any, parts: Parts, where: Where) -> None:
        parts.append(tag + _LEN.pack(len(value)))
        for index, item in enumerate(value):
            _write(item, parts, (where, index))

    return write


def _dict(value: Any, parts: Parts, where: Where) -> None:
    for name in value:
        if type(name) is not str:
            raise NotCanonical(
                f"{_render(where)} has a key {name!r} of type `{type(name).__name__}`; canonical "
                "dicts have str keys only, so that every process sorts and writes them the same way"
            )
    # Sorting str by code point is sorting their UTF-8 bytes: UTF-8 keeps the order.
    parts.append(b"d" + _LEN.pack(len(value)))
    for name in sorted(value):
        raw = name.encode("utf-8", "surrogatepass")
        parts.append(b"s" + _LEN.pack(len(raw)) + raw)
        _write(value[name], parts, (where, name))


_WRITERS: dict[type, Callable[[Any, Parts, Where], None]] = {
    type(None): _none,
    bool: _bool,
    int: _int,
    float: _float,
    str: _str,
    bytes: _bytes,
    bytearray: _bytes,
    memoryview: _bytes,
    list: _sequence(b"l"),
    tuple: _sequence(b"t"),
    dict: _dict,
}


def _write(value: Any, parts: Parts, where: Where) -> None:
    writer = _WRITERS.get(type(value))
    if writer is None:
        raise NotCanonical(
            f"{_render(where)} is a `{type(value).__module__}.{type(value).__qualname__}`, which "
            "has no canonical form: a key must be written identically by every process, and only "
            "None, bool, int, float, str, bytes and lists, tuples and str-keyed dicts of them "
            "can be. Wrap the value in `somatize.Opaque(value)` so its codec digests it"
        )
    writer(value, parts, where)


def parts_of(value: Any, where: str = "value") -> Parts:
    """The canonical encoding of ``value`` as a list of byte pieces, in order.

    Large ``bytes`` payloads are referenced, not copied. ``where`` names the
    value in error messages (``input``, ``declaration of clean`` ...).
    """
    parts: Parts = []
    _write(value, parts, (where,))
    return parts


def encode(value: Any, where: str = "value") -> bytes:
    """The canonical encoding of ``value``; raises :class:`NotCanonical` if it has none."""
    return b"".join(parts_of(value, where))


def is_canonical(value: Any) -> bool:
    """Whether ``value`` has a canonical encoding."""
    try:
        parts_of(value)
    except NotCanonical:
        return False
    return True


def digest_of(prefix: bytes, parts: Parts) -> bytes:
    """BLAKE3-256 of ``prefix`` followed by ``parts``, using every core for large payloads."""
    size = sum(len(part) for part in parts)
    if size < _LARGE:
        return blake3.blake3(prefix + b"".join(parts)).digest()
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update(prefix)
    for part in parts:
        hasher.update(part)
    return hasher.digest()


def hex_of(value: Any, prefix: bytes = b"", where: str = "value") -> str:
    """``blake3:<hex>`` of the canonical encoding of ``value`` after ``prefix``."""
    return "blake3:" + digest_of(prefix, parts_of(value, where)).hex()


# ---------------------------------------------------------------- decoding


class _Reader:
    __slots__ = ("at", "data")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data).cast("B")
        self.at = 0

    def take(self, size: int) -> memoryview:
        end = self.at + size
        if end > len(self.data):
            raise ValueError("canonical bytes end in the middle of a value")
        piece = self.data[self.at : end]
        self.at = end
        return piece

    def length(self) -> int:
        (size,) = _LEN.unpack(self.take(8))
        return int(size)

    def value(self) -> Any:
        tag = bytes(self.take(1))
        if tag == b"N":
            return None
        if tag == b"T":
            return True
        if tag == b"F":
            return False
        if tag == b"i":
            return int.from_bytes(self.take(self.length()), "big", signed=True)
        if tag == b"f":
            return _FLOAT.unpack(self.take(8))[0]
        if tag == b"s":
            return str(self.take(self.length()), "utf-8", "surrogatepass")
        if tag == b"b":
            return bytes(self.take(self.length()))
        if tag == b"l":
            return [self.value() for _ in range(self.length())]
        if tag == b"t":
            return tuple(self.value() for _ in range(self.length()))
        if tag == b"d":
            out = {}
            for _ in range(self.length()):
                name = self.value()
                if type(name) is not str:
                    raise ValueError("a canonical dict key is not a str")
                out[name] = self.value()
            return out
        raise ValueError(f"unknown canonical tag {tag!r} at byte {self.at - 1}")


def decode(data: bytes | memoryview) -> Any:
    """The value whose canonical encoding is ``data``; ValueError if it is not one."""
    reader = _Reader(data)
    value = reader.value()
    if reader.at != len(reader.data):
        raise ValueError(f"{len(reader.data) - reader.at} stray bytes after a canonical value")
    return value
