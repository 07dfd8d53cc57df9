"""Codecs: how one kind of value becomes bytes, and back, and what it weighs.

A codec knows one kind of value and nothing about graphs. It is used three
ways: to write a cached answer into a store and read it back, to carry a value
across to a worker exactly as it would cross a wire, and to digest an
:class:`Opaque` input — the one place where data, rather than a name, has to be
hashed. A codec may digest faster than it encodes (a tensor is digested where
it lives), so ``digest`` is its own method.

Nothing is ever unpickled: a store holds bytes in formats whose readers cannot
run code (the canonical encoding, Arrow IPC, safetensors).

Built in: ``plain`` (canonical values). ``somatize.data`` registers ``arrow``;
``somatize.torch`` registers ``tensor``.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import blake3

from somatize import canonical
from somatize._threads import hash_threads
from somatize.errors import SomatizeError

__all__ = [
    "CODECS",
    "Codec",
    "CodecError",
    "Codecs",
    "Opaque",
    "Plain",
    "Unreadable",
]

Buffer = bytes | bytearray | memoryview


class CodecError(SomatizeError, TypeError):
    """A value no codec can write, or bytes a codec cannot read."""


class Unreadable(ValueError):
    """Bytes that are whole, and that this process cannot turn back into their value: a
    class they name is not loaded here (it is never imported to read an answer). A forward
    reads it as a miss, says so with an ``unreadable`` fact, and computes the answer again;
    nothing is damaged, and nothing is set aside."""

    def __init__(self, message: str, named: str | None = None) -> None:
        super().__init__(message)
        self.named = named
        """The class not loaded here, as ``module:qualname``, where that is why."""


class Codec(abc.ABC):
    """One kind of value, as bytes.

    Contract: ``decode(join(encode(v)))`` equals ``v``; ``digest(v)`` depends on
    the value's content only (never on the process, the device or the order a
    dict was filled in), and equal content gives an equal digest in every
    process.
    """

    name: str
    """How stores and wires name this codec; recorded beside every answer."""

    types: tuple[type, ...] = ()
    """The Python types this codec may take; ``accepts`` makes the final call."""

    def accepts(self, value: Any) -> bool:
        """Whether this codec can write ``value`` (its type is already one of ``types``)."""
        return True

    def refusal(self, value: Any) -> str | None:
        """Why this codec does not write ``value`` (of one of its ``types``), naming what
        in it is refused, or None when it says no more than that it does not."""
        return None

    @abc.abstractmethod
    def encode(self, value: Any) -> Sequence[Buffer]:
        """The bytes of ``value``, as pieces written one after the other (no joining needed)."""

    @abc.abstractmethod
    def decode(self, data: memoryview) -> Any:
        """The value whose bytes are ``data``. May keep a view of ``data`` (zero-copy).
        ValueError (or TypeError) for bytes that are damaged; :class:`Unreadable` for bytes
        that are whole and name what this process does not have."""

    def digest(self, value: Any) -> str:
        """``blake3:<hex>`` of the value's content; by default, of its encoding."""
        hasher = blake3.blake3(max_threads=hash_threads())
        hasher.update(self.name.encode() + b"\0")
        for piece in self.encode(value):
            hasher.update(piece)
        return "blake3:" + hasher.hexdigest()

    def stamp(self, value: Any) -> Hashable | None:
        """Something far cheaper than ``digest`` that stays equal only while ``value``'s
        content cannot have changed, or None when nothing cheap can tell (the default).

        An :class:`Opaque` keeps its digest while the stamp stays equal, and weighs its
        value again otherwise: a value of an immutable kind may answer any constant; a
        mutable one answers what every change to it changes (a tensor's version counter),
        or None, so that it is weighed at every use. A stamp that stays equal across a
        change makes a cache answer for the old content.
        """
        return None


class Plain(Codec):
    """Canonical values (None, bool, int, float, str, bytes, lists, tuples, dicts)."""

    name = "plain"
    types = (type(None), bool, int, float, str, bytes, bytearray, memoryview, list, tuple, dict)

    def accepts(self, value: Any) -> bool:
        return self.refusal(value) is None

    def refusal(self, value: Any) -> str | None:
        # Exact, as answers are written: what comes back must be what was computed.
        try:
            canonical.parts_of(value, exact=True)
        except canonical.NotCanonical as why:
            return str(why)
        return None

    def encode(self, value: Any) -> Sequence[Buffer]:
        # Exact: a recalled dict has the order it was computed in, a bytearray stays one.
        return canonical.parts_of(value, exact=True)

    def decode(self, data: memoryview) -> Any:
        return canonical.decode(data)

    def digest(self, value: Any) -> str:
        return canonical.hex_of(value, b"somatize/plain\0")

    def stamp(self, value: Any) -> Hashable | None:
        return () if canonical.is_immutable(value) else None


_CODEC_HOMES = {"arrow": "somatize.data", "tensor": "somatize.torch"}
"""Where each codec the core does not hold is registered: importing the module registers
it (a process reading a tensor answer has to ``import somatize.torch``)."""


class Codecs:
    """Which codec writes which value: later registrations are asked first."""

    def __init__(self, codecs: Iterable[Codec] = ()) -> None:
        self._by_name: dict[str, Codec] = {}
        self._order: list[Codec] = []
        self._by_type: dict[type, list[Codec]] = {}
        for codec in codecs:
            self.register(codec)

    def register(self, codec: Codec) -> Codec:
        """Adds ``codec`` (replacing one of the same name) ahead of those already here."""
        old = self._by_name.get(codec.name)
        if old is not None:
            self._order.remove(old)
        self._by_name[codec.name] = codec
        self._order.insert(0, codec)
        self._by_type.clear()
        return codec

    def named(self, name: str) -> Codec:
        """The codec called ``name``; CodecError naming the known ones, and what registers
        ``name``, otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            home = _CODEC_HOMES.get(name)
            todo = (
                f"`import {home}` registers it"
                if home is not None
                else "register it with `somatize.CODECS.register(...)`"
            )
            raise CodecError(
                f"no codec is called `{name}` in this process (known: {known}): {todo}. What "
                f"was written with the `{name}` codec (an answer kept in a store, a value from "
                "a worker) cannot be read here until it is registered"
            ) from None

    def candidates(self, kind: type) -> list[Codec]:
        found = self._by_type.get(kind)
        if found is None:
            found = [
                codec
                for codec in self._order
                if any(issubclass(kind, accepted) for accepted in codec.types)
            ]
            self._by_type[kind] = found
        return found

    def for_value(self, value: Any, where: str = "value", *, weighed: bool = False) -> Codec:
        """The codec that writes ``value``; CodecError naming its type otherwise, saying what
        else to answer — or, for a value to be ``weighed`` (an Opaque input's), to wrap."""
        candidates = self.candidates(type(value))
        for codec in candidates:
            if codec.accepts(value):
                return codec
        kind = type(value)
        reasons = [why for why in (codec.refusal(value) for codec in candidates) if why]
        said = f" ({'; '.join(reasons)})" if reasons else ""
        written = (
            "so it cannot be weighed for a key. Wrap what a codec writes: a tensor "
            "(`torch.from_numpy(array)` for a numpy array, with `import somatize.torch`), an "
            "Arrow table or frame (`import somatize.data`), bytes"
            if weighed
            else "so it can be neither kept in a store nor sent to a worker. Return canonical "
            "values (None, bool, int, float, str, bytes, lists/tuples/dicts of them), a tensor "
            "(`import somatize.torch`), an Arrow table or frame (`import somatize.data`)"
        )
        raise CodecError(
            f"{where} is a `{kind.__module__}.{kind.__qualname__}` and no codec writes it{said}, "
            f"{written}, or register a codec for it with `somatize.CODECS.register(...)`"
        )

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


CODECS = Codecs([Plain()])
"""The codecs every graph uses unless told otherwise."""


class Opaque:
    """An input that is digested by its content, through its codec.

    Canonical values are keyed by their encoding; anything else — a tensor, an
    Arrow table — must be weighed, and saying ``Opaque(batch)`` is saying so on
    purpose. Its digest is kept only while the value demonstrably cannot have
    changed (see :meth:`Codec.stamp`): for good when it is immutable (bytes, str),
    while its version counter, memory, shape, strides and dtype are unchanged when it
    is a tensor. Anything else (a numpy array, a list, a bytearray, an Arrow table,
    whose memory may be a numpy array's) is weighed again at every use, so one
    ``Opaque`` wrapped around a buffer that is refilled in place keys each forward by
    what it holds then. An ``Opaque`` may also stand inside a list, tuple or dict
    input: each is keyed by its content and handed to the nodes unwrapped. A codec
    given, by name or as itself, must take the value as it would be picked for it (one
    of its types, and ``accepts``): a CodecError with its refusal otherwise.
    A tensor written behind torch's back (through ``.data``, ``.numpy()`` or DLPack,
    into the numpy array it was made from by ``torch.from_numpy``, into its storage with
    ``x.untyped_storage().copy_(...)`` or ``.fill_(...)``, or through another tensor
    ``set_`` onto that storage) keeps its version counter: wrap a new ``Opaque`` after
    such a write.
    """

    __slots__ = ("_weighed", "codec", "value")

    def __init__(self, value: Any, codec: Codec | str | None = None) -> None:
        self.value = value
        if isinstance(codec, str):
            codec = CODECS.named(codec)
        if codec is not None:
            _check_takes(codec, value)
        self.codec = (
            codec
            if codec is not None
            else CODECS.for_value(value, "the Opaque value", weighed=True)
        )
        self._weighed: tuple[Any, Codec, Hashable, str] | None = None
        """The value and codec last weighed, the stamp it had then, and its digest."""

    @property
    def digest(self) -> str:
        """``blake3:<hex>`` of the value's content: the one kept from the last use while the
        codec's stamp of the value is unchanged, computed afresh otherwise."""
        value, codec, weighed = self.value, self.codec, self._weighed
        stamp = codec.stamp(value)
        if (
            stamp is not None
            and weighed is not None
            and weighed[0] is value
            and weighed[1] is codec
            and weighed[2] == stamp
        ):
            return weighed[3]
        digest = codec.digest(value)
        self._weighed = None if stamp is None else (value, codec, stamp, digest)
        return digest

    def __repr__(self) -> str:
        return f"Opaque({type(self.value).__name__}, codec={self.codec.name!r})"


def _check_takes(codec: Codec, value: Any) -> None:
    """CodecError when ``codec``, given to weigh ``value``, would not pick it: ``value`` is
    of none of its types, or ``accepts`` says no. Named or not, a codec weighs only what it
    writes; a tensor subclass weighed by its values alone would key two values that carry
    other state (a box format) alike."""
    kind = type(value)
    named = f"`{kind.__module__}.{kind.__qualname__}`"
    if not isinstance(value, codec.types):
        takes = ", ".join(f"{t.__module__}.{t.__qualname__}" for t in codec.types) or "nothing"
        raise CodecError(
            f"the Opaque value is a {named}, and the `{codec.name}` codec it is given takes "
            f"{takes}: hand it a value of those types, or leave the codec out "
            "(`Opaque(value)`) so that the one that writes the value is picked"
        )
    if not codec.accepts(value):
        why = codec.refusal(value)
        said = f": {why}" if why else ""
        raise CodecError(
            f"the Opaque value is a {named} the `{codec.name}` codec it is given does not "
            f"weigh{said}"
        )
