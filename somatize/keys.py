"""Keys: the name of exactly what was computed.

::

    key(root) = H(content of the input)          the only place data is hashed
    key(node) = H(identity, declaration, state, salt, [precision,] keys of its predecessors)

H is BLAKE3-256 over the canonical encoding (:mod:`somatize.canonical`), behind
a domain tag that carries :data:`KEY_VERSION`; keys are written
``blake3:<64 hex>``. A canonical input is keyed by its encoding — a coordinate
like ``{"at": 4096, "take": 64}`` costs a microsecond — while an
:class:`~somatize.Opaque` input is weighed by its codec.

A mapped node has one key per item: its key parts with the item keys of what it
reads, so an item's answer is found whatever list it came in. Its parts are
tagged as mapped: item ``v`` of a mapped node and the same node, unmapped,
handed ``v`` whole are two questions (a list of item answers against one answer
to the whole), and never share a key; an unmapped node's parts carry no tag.

A forward called in another precision than torch's default (under autocast, another
default dtype, TF32: :mod:`somatize._precision`) asks another question of each node
that computes: its key names that precision after its fixed parts
(:func:`in_precision`); one called in the default precision names none, and keeps the
key it always had.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import blake3

from somatize import canonical
from somatize._threads import make_room
from somatize.codecs import Opaque

__all__ = [
    "KEY_VERSION",
    "in_precision",
    "item_key",
    "node_key",
    "node_prefix",
    "root_item_keys",
    "root_key",
]

_LEN = struct.Struct(">Q")

KEY_VERSION = 1
"""Bumped whenever any key changes for the same question; pinned by a golden test."""

_ROOT = b"somatize/root/%d/%d\0" % (KEY_VERSION, canonical.VERSION)
_OPAQUE = b"somatize/opaque/%d\0" % KEY_VERSION
_NODE = b"somatize/node/%d/%d\0" % (KEY_VERSION, canonical.VERSION)
_MAPPED = b"somatize/mapped/%d/%d\0" % (KEY_VERSION, canonical.VERSION)
_ITEM = b"somatize/item/%d\0" % KEY_VERSION


_EXACT = frozenset((int, str))
"""The types of the values of a coordinate whose key is remembered (see :data:`_SEEN`)."""
_SEEN: dict[tuple[tuple[str, int | str], ...], str] = {}
"""The keys of coordinates seen, by their entries in order: dicts of str keys and int or
str values (of exactly these types, so that no equal value of another type — ``True``,
``1.0``, a subclass — finds another's key), written in at most :data:`_SEEN_BYTES` bytes;
the last :data:`_SEEN_MOST` of them."""
_SEEN_MOST = 4096
_SEEN_BYTES = 1024


def root_key(value: Any, where: str = "the input") -> str:
    """The key of an input: its canonical encoding, or its codec's digest when Opaque (an
    Opaque inside a list, tuple or dict is written as its codec's digest too)."""
    if type(value) is dict:  # a coordinate, on every forward: written without the walk
        entries = tuple(value.items())
        for name, item in entries:
            if type(name) is not str or type(item) not in _EXACT:
                flat = canonical.flat_dict(value)
                exact = False
                break
        else:
            found = _SEEN.get(entries)
            if found is not None:
                return found
            # Keyed from the entries read, not the dict, which another thread may change
            # meanwhile: what is remembered under them is their key. Their names are
            # distinct strs, so they sort by name alone.
            flat = canonical.flat_entries(sorted(entries))
            exact = True
        if flat is not None:
            key = "blake3:" + blake3.blake3(_ROOT + flat).hexdigest()
            if exact and len(flat) <= _SEEN_BYTES:
                make_room(_SEEN, _SEEN_MOST)
                _SEEN[entries] = key
            return key
    if isinstance(value, Opaque):
        return (
            "blake3:"
            + blake3.blake3(
                _OPAQUE + canonical.encode(value.codec.name) + canonical.encode(value.digest)
            )
            .digest()
            .hex()
        )
    parts = canonical.parts_of(value, where, weighs=True)
    return "blake3:" + canonical.digest_of(_ROOT, parts).hex()


def root_item_keys(values: Sequence[Any], where: str = "the input") -> list[str]:
    """One key per item of an input list, each from the item's content alone."""
    return [root_key(item, f"{where}[{index}]") for index, item in enumerate(values)]


def node_prefix(
    identity: str,
    declaration: str,
    state: str | None,
    salt: str | None,
    *,
    mapped: bool = False,
) -> bytes:
    """The part of a node's key that does not depend on its inputs; computed once.
    ``mapped`` for a node that maps over the items of its input, whose keys (one per
    item) must differ from those of the same node handed each item whole."""
    return (
        (_MAPPED if mapped else _NODE)
        + canonical.encode(identity)
        + canonical.encode(declaration)
        + canonical.encode(state)
        + canonical.encode(salt)
    )


def in_precision(prefix: bytes, precision: Sequence[tuple[str, str]]) -> bytes:
    """The fixed parts ``prefix`` (:func:`node_prefix`) of a node called in ``precision``,
    which is not the default: what differs from it, each as (what, its value), sorted,
    after them (where the input keys follow a prefix without it)."""
    return prefix + canonical.encode({"precision": sorted(map(list, precision))})


def node_key(prefix: bytes, inputs: Sequence[str]) -> str:
    """The key of a node whose fixed parts are ``prefix``, reading inputs keyed ``inputs``.

    Equal to H(``prefix + canonical.encode(list(inputs))``), written out by hand
    because it is on every forward's path (a test holds the two equal)."""
    data = prefix + _LEN.pack(len(inputs)).join((b"l", b""))
    for key in inputs:
        raw = key.encode()
        data += b"s" + _LEN.pack(len(raw)) + raw
    return "blake3:" + blake3.blake3(data).digest().hex()


_KEY = b"s" + _LEN.pack(71)
"""How one key is written inside a node key: every key is ``blake3:`` and 64 hex digits."""


def node_head(prefix: bytes, count: int) -> bytes:
    """``prefix`` and the start of a list of ``count`` input keys: all of a node's key but
    the keys themselves, for :func:`key_after`."""
    return prefix + b"l" + _LEN.pack(count)


def root_bytes(value: Any) -> bytes:
    """What :func:`root_key` hashes for a plain value (one no ``Opaque`` is in): the key is
    ``blake3:`` and the hex BLAKE3 of these bytes. For code that keys many such values at
    once (the indices of a batch's rows, natively)."""
    return _ROOT + canonical.encode(value)


def before_one_key(head: bytes) -> bytes:
    """What :func:`key_after` hashes, for a ``head`` made for one input, before that input's
    key: the node's key is ``blake3:`` and the hex BLAKE3 of this and the key's text. For
    code that names many such nodes at once (a batch of rows, natively)."""
    return head + _KEY


def key_after(head: bytes, inputs: Sequence[str]) -> str:
    """:func:`node_key` for a ``head`` made by :func:`node_head` with ``len(inputs)``:
    the same key, with the fixed parts joined once rather than on every forward."""
    if len(inputs) == 1 and len(inputs[0]) == 71:
        return "blake3:" + blake3.blake3(head + _KEY + inputs[0].encode()).digest().hex()
    data = head
    for key in inputs:
        raw = key.encode()
        data += b"s" + _LEN.pack(len(raw)) + raw
    return "blake3:" + blake3.blake3(data).digest().hex()


def item_key(key: str, index: int) -> str:
    """The key of item ``index`` of the list answered under ``key``."""
    return "blake3:" + blake3.blake3(_ITEM + canonical.encode([key, index])).digest().hex()
