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
``-0.0`` differ too. Two things a key takes alike, on purpose: dict entries are
sorted by key, so insertion order never matters, and bytes-like values (bytes, a
bytearray, a contiguous one-dimensional memoryview of unsigned bytes, format ``'B'``)
are their bytes — what a node reads of them: the same length, the same items.
(An answer, written to be read back as it was computed, keeps both: its dicts'
order, and a bytearray as one.) Anything else is refused with :class:`NotCanonical`,
and so are a value that contains itself, one nested deeper than Python's recursion
limit, a memoryview whose bytes are not contiguous, and a memoryview of anything but
bytes in one dimension — of typed items (``'i'``, ``'f'``), signed bytes (``'b'``),
characters (``'c'``), or in several dimensions — whose length and items are not those
of its bytes.

:func:`decode` reads a value only from the one form a writer makes of it: an int in
more bytes than it needs, or in none, and a dict naming a key twice are refused as
damaged bytes, as bytes that end too soon are. (Its dicts' keys may come in any order:
an answer's are written in the order they were filled in.)

The encoding is versioned by :data:`VERSION`; the key formula mixes the version
in, so a change here changes every key on purpose rather than by accident.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import blake3

from somatize._threads import hash_threads
from somatize.errors import SomatizeError

__all__ = [
    "VERSION",
    "NotCanonical",
    "decode",
    "digest_of",
    "encode",
    "flat_dict",
    "flat_entries",
    "hex_of",
    "int_bytes",
    "is_canonical",
    "is_immutable",
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


class Parts(list[bytes | memoryview]):
    """Byte pieces of an encoding, in order; ``large`` says a payload was referenced
    rather than copied (so hashing should stream the pieces instead of joining them)."""

    large = False
    weighs = False
    """Whether an :class:`~somatize.Opaque` inside is written as its codec and digest (an
    input's key); elsewhere (declarations, answers) it is refused."""
    exact = False
    """Whether dicts keep their order and a bytearray stays one: an answer written to be
    read back as it was computed. Keys and digests sort dicts and take bytes alike."""


Where = tuple[Any, ...]
"""Where a value sits in what is being encoded, as (parent, key) pairs; turned into text
only when something has to be refused, so the common path pays nothing for it."""


def _render(where: Where) -> str:
    steps = []
    while len(where) == 2:
        where, key = where
        steps.append(f"[{key!r}]")
    return str(where[0]) + "".join(reversed(steps))


# Small ints and short strs recur in every key (a coordinate's names and numbers), so
# their encodings are remembered. Bounded; only exact ints and strs are ever looked up.
_INTS: dict[int, bytes] = {}
_STRS: dict[str, bytes] = {}
_REMEMBER = 1 << 16


def _int_bytes(value: int) -> bytes:
    found = _INTS.get(value)
    if found is None:
        size = (value.bit_length() + 8) // 8
        found = b"i" + _LEN.pack(size) + value.to_bytes(size, "big", signed=True)
        if -_REMEMBER < value < _REMEMBER and len(_INTS) < _REMEMBER:
            _INTS[value] = found
    return found


def int_bytes(value: int) -> bytes:
    """``encode(value)`` of an int, without the walk of a value of any kind: for code that
    encodes many ints (the indices of a batch's rows, each keyed)."""
    return _int_bytes(value)


def _str_bytes(value: str) -> bytes:
    found = _STRS.get(value)
    if found is None:
        try:
            raw = value.encode()
        except UnicodeEncodeError:  # a lone surrogate: kept as its UTF-8 bit pattern
            raw = value.encode("utf-8", "surrogatepass")
        found = b"s" + _LEN.pack(len(raw)) + raw
        if len(raw) <= 64 and len(_STRS) < _REMEMBER:
            _STRS[value] = found
    return found


def _none(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"N")


def _bool(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"T" if value else b"F")


def _int(value: Any, parts: Parts, where: Where) -> None:
    parts.append(_int_bytes(value))


def _float(value: Any, parts: Parts, where: Where) -> None:
    parts.append(b"f" + _FLOAT.pack(value))


def _str(value: Any, parts: Parts, where: Where) -> None:
    parts.append(_str_bytes(value))


def _bytes(value: Any, parts: Parts, where: Where) -> None:
    if parts.exact and type(value) is memoryview:
        raise NotCanonical(
            f"{_render(where)} is a memoryview: it would be read back as bytes, another type "
            "(and, for a view of typed items, another length). Pass `bytes(view)` instead"
        )
    view = memoryview(value)
    if view.format != "B" or view.ndim != 1:
        raise NotCanonical(
            f"{_render(where)} is a memoryview of format {view.format!r} and shape "
            f"{view.shape}, not one of bytes (format 'B') in one dimension: a node reads "
            "another length and other items from it than from its bytes, so it cannot be "
            "keyed as them. Pass `bytes(view)` or `view.cast('B')` (its bytes), or "
            "`view.tolist()` (its items)"
        )
    if not view.c_contiguous:
        raise NotCanonical(
            f"{_render(where)} is a memoryview that is not contiguous (a strided slice, a "
            "transposed array): its bytes are not one run in memory, so it has no single "
            "canonical form. Pass `bytes(view)`, its bytes in C order, instead"
        )
    view = view.cast("B")
    tag = b"a" if parts.exact and type(value) is bytearray else b"b"
    parts.append(tag + _LEN.pack(view.nbytes))
    if view.nbytes < _LARGE:
        parts.append(bytes(view))
    else:
        parts.append(view)
        parts.large = True


def _sequence(tag: bytes) -> Callable[[Any, Parts, Where], None]:
    def write(value: Any, parts: Parts, where: Where) -> None:
        parts.append(tag + _LEN.pack(len(value)))
        for index, item in enumerate(value):
            _write(item, parts, (where, index))

    return write


def _dict(value: Any, parts: Parts, where: Where) -> None:
    try:
        # Sorting str by code point is sorting their UTF-8 bytes: UTF-8 keeps the order.
        names = list(value) if parts.exact else sorted(value)
    except TypeError:
        names = list(value)  # keys of several types: the loop below names the first bad one
    parts.append(b"d" + _LEN.pack(len(names)))
    for name in names:
        if type(name) is not str:
            raise NotCanonical(
                f"{_render(where)} has a key {name!r} of type `{type(name).__name__}`; canonical "
                "dicts have str keys only, so that every process sorts and writes them the same "
                "way. Pass a list of (key, value) pairs (`sorted(d.items())`), which keeps each "
                "key's type: keys made str (`{str(k): v}`) are another input, and a node "
                "handed them computes otherwise"
            )
        parts.append(_str_bytes(name))
        item = value[name]
        kind = type(item)
        if kind is int:
            parts.append(_int_bytes(item))
        elif kind is str:
            parts.append(_str_bytes(item))
        else:
            _write(item, parts, (where, name))


def flat_dict(value: dict[Any, Any]) -> bytes | None:
    """The key encoding (dicts sorted) of ``value``, a dict, when all its keys are str and
    its values exact ints, strs and floats — a coordinate — written without the general
    walk of :func:`parts_of`, whose bytes it equals (a test holds them equal); None for
    any other dict, which :func:`parts_of` then writes or refuses."""
    try:
        entries = sorted(value.items(), key=_name)
    except TypeError:
        return None
    return flat_entries(entries)


def _name(entry: tuple[Any, Any]) -> Any:
    return entry[0]


def flat_entries(entries: list[tuple[Any, Any]]) -> bytes | None:
    """:func:`flat_dict` of the dict of ``entries``, given sorted by name."""
    data = b"d" + _LEN.pack(len(entries))
    for name, item in entries:
        if type(name) is not str:
            return None
        kind = type(item)
        if kind is int:
            data += _str_bytes(name) + _int_bytes(item)
        elif kind is str:
            data += _str_bytes(name) + _str_bytes(item)
        elif kind is float:
            data += _str_bytes(name) + b"f" + _FLOAT.pack(item)
        else:
            return None
    return data


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
        if parts.weighs and _weighed(value, parts):
            return
        kind = type(value)
        if _is_scalar(value):
            advice = (
                " It holds one number, and computes as its library's type does: pass the "
                "Python number, `int(x)`, `float(x)` or `x.item()`"
            )
        elif parts.weighs:
            advice = " Wrap the value in `somatize.Opaque(value)` so its codec digests it"
        else:
            advice = ""
        raise NotCanonical(
            f"{_render(where)} is a `{kind.__module__}.{kind.__qualname__}`, which "
            "has no canonical form: a key must be written identically by every process, and only "
            "None, bool, int, float, str, bytes and lists, tuples and str-keyed dicts of them "
            f"can be.{advice}"
        )
    writer(value, parts, where)


def _is_scalar(value: Any) -> bool:
    """Whether ``value`` is one real number (or bool) of numpy or torch: a numpy scalar, a
    numpy array or a torch tensor of no dimensions. Either library is looked at only once
    it is imported: this module imports neither."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (numpy.integer, numpy.floating, numpy.bool_)):
            return True
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and isinstance(value, torch.Tensor)
        and value.dim() == 0
        and not value.is_complex()
    )


def _weighed(value: Any, parts: Parts) -> bool:
    """Writes an :class:`~somatize.Opaque` as its codec's name and its digest; False for
    anything else."""
    from somatize.codecs import Opaque  # canonical is below codecs; only asked off the fast path

    if not isinstance(value, Opaque):
        return False
    parts.append(b"o" + _str_bytes(value.codec.name) + _str_bytes(value.digest))
    return True


def parts_of(
    value: Any, where: str = "value", *, weighs: bool = False, exact: bool = False
) -> Parts:
    """The canonical encoding of ``value`` as a list of byte pieces, in order.

    Large ``bytes`` payloads are referenced, not copied. ``where`` names the
    value in error messages (``input``, ``declaration of clean`` ...). ``weighs``
    writes an :class:`~somatize.Opaque` found inside as its codec and content digest
    (an input's key); without it, one is refused like any other non-canonical value.
    ``exact`` keeps each dict's order and a bytearray's type (:attr:`Parts.exact`): the
    bytes are then no key, but :func:`decode` gives back the value as it was.
    """
    parts = Parts()
    parts.weighs = weighs
    parts.exact = exact
    try:
        _write(value, parts, (where,))
    except RecursionError:
        # Caught here, where the stack is shallow again, so that the common path pays nothing.
        if _contains_itself(value):
            raise NotCanonical(
                f"{where} contains itself (a list, tuple or dict that holds itself, directly "
                "or further down), so its encoding would never end. Pass a value without the "
                "cycle"
            ) from None
        raise NotCanonical(
            f"{where} is nested too deep to encode (deeper than Python's recursion limit, "
            f"{sys.getrecursionlimit()}, allows). Flatten it, or pass it as bytes you "
            "encode yourself"
        ) from None
    return parts


def _contains_itself(value: Any) -> bool:
    """Whether ``value`` holds itself somewhere below, looked for without recursion."""
    path: set[int] = set()
    stack: list[tuple[int, Iterator[Any]]] = [(id(value), iter((value,)))]
    while stack:
        item: Any = next(stack[-1][1], _DONE)
        if item is _DONE:
            path.discard(stack.pop()[0])
            continue
        if type(item) in (list, tuple, dict):
            if id(item) in path:
                return True
            path.add(id(item))
            stack.append((id(item), iter(item.values() if type(item) is dict else item)))
    return False


_DONE = object()


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


_IMMUTABLE = frozenset({type(None), bool, int, float, str, bytes})


def is_immutable(value: Any) -> bool:
    """Whether ``value`` can never change: None, a bool, int, float, str or bytes, or a
    tuple of them (of exactly these types: a subclass may add mutable state)."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is tuple:
            pending.extend(item)
        elif kind not in _IMMUTABLE:
            return False
    return True


def digest_of(prefix: bytes, parts: Parts) -> bytes:
    """BLAKE3-256 of ``prefix`` followed by ``parts``, using every core for large payloads."""
    if not parts.large:
        return blake3.blake3(prefix + b"".join(parts)).digest()
    hasher = blake3.blake3(max_threads=hash_threads())
    hasher.update(prefix)
    for part in parts:
        hasher.update(part)
    return hasher.digest()


def hex_of(value: Any, prefix: bytes = b"", where: str = "value") -> str:
    """``blake3:<hex>`` of the canonical encoding of ``value`` after ``prefix``."""
    return "blake3:" + digest_of(prefix, parts_of(value, where)).hex()


# ---------------------------------------------------------------- decoding


_UNPACK_LEN = _LEN.unpack_from
_UNPACK_FLOAT = _FLOAT.unpack_from


def _read(data: bytes | memoryview, at: int) -> tuple[Any, int]:
    """The value that starts at ``at`` in ``data``, and where the next one starts."""
    if at >= len(data):
        raise ValueError("canonical bytes end where a value should start")
    tag = data[at]
    at += 1
    if tag == 0x4E:  # N
        return None, at
    if tag == 0x54:  # T
        return True, at
    if tag == 0x46:  # F
        return False, at
    if tag == 0x66:  # f
        _need(data, at, 8)
        return _UNPACK_FLOAT(data, at)[0], at + 8
    if tag in (0x69, 0x73, 0x62, 0x61, 0x6C, 0x74, 0x64):  # i s b a l t d: a length follows
        _need(data, at, 8)
        (size,) = _UNPACK_LEN(data, at)
        at += 8
        if tag == 0x69:  # i
            _need(data, at, size)
            number = int.from_bytes(data[at : at + size], "big", signed=True)
            # Written in the fewest bytes that hold it and its sign (0 in one): any other
            # count (none, or a leading byte of only its sign) is bytes no writer makes.
            if size != (number.bit_length() + 8) // 8:
                raise ValueError(f"an int of {size} bytes is not canonical")
            return number, at + size
        if tag == 0x73:  # s
            _need(data, at, size)
            return str(data[at : at + size], "utf-8", "surrogatepass"), at + size
        if tag == 0x62:  # b
            _need(data, at, size)
            return bytes(data[at : at + size]), at + size
        if tag == 0x61:  # a: a bytearray, written exact
            _need(data, at, size)
            return bytearray(data[at : at + size]), at + size
        items = []
        if tag == 0x64:  # d
            out = {}
            for _ in range(size):
                name, at = _read(data, at)
                if type(name) is not str:
                    raise ValueError("a canonical dict key is not a str")
                if name in out:  # no writer names a key twice: the last value would win
                    raise ValueError(f"a dict naming the key {name[:64]!r} twice is not canonical")
                out[name], at = _read(data, at)
            return out, at
        for _ in range(size):
            item, at = _read(data, at)
            items.append(item)
        return (items if tag == 0x6C else tuple(items)), at
    raise ValueError(f"unknown canonical tag {bytes([tag])!r} at byte {at - 1}")


def _need(data: bytes | memoryview, at: int, size: int) -> None:
    if at + size > len(data):
        raise ValueError("canonical bytes end in the middle of a value")


def decode(data: bytes | memoryview) -> Any:
    """The value whose canonical encoding is ``data``; ValueError if it is not one.

    A large ``data`` (a recalled answer's bytes, as a view of the memory a store read
    them into) is read where it is: a copy would hold a third copy of a value of 2 GiB
    besides the bytes read and the value made from them."""
    raw: bytes | memoryview = data if isinstance(data, bytes) else memoryview(data)
    if type(raw) is memoryview:
        raw = raw.cast("B") if raw.nbytes >= _LARGE and raw.c_contiguous else bytes(raw)
    try:
        value, at = _read(raw, 0)
    except RecursionError:  # written by a process allowed to nest deeper than this one
        raise ValueError("a canonical value nested deeper than this process can read") from None
    if at != len(raw):
        raise ValueError(f"{len(raw) - at} stray bytes after a canonical value")
    return value
