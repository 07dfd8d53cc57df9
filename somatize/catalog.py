"""The catalog: who executes a node.

An identity is the name of what implements a node — ``module:qualname`` of its
class — so that any process can rebuild the node from ``(identity,
declaration)``: import the class, construct it with the declared arguments. A
class with no stable name (one made inside a function, a lambda) has no
identity unless it is given one, and what cannot be rebuilt says so.

What crosses to another process is a :class:`Blueprint`: the identity, the
constructor call that made the node (its arguments exactly as passed, which must
be canonical) and the digest of its declaration. The call is shipped rather than
the declaration because a node may write its own ``declare()``, which says what
decides its answers, not how to build it. The declaration's digest travels
beside the call so the rebuilt node is checked against the original: a worker
whose code or arguments differ refuses instead of answering under somebody
else's key. A class defined in ``__main__`` can be imported only by the process
that defined it, so it is rebuilt only where it is registered.

A node that stands for another class — a torch node stands for its module's
class, which is its identity — names a **maker** too: a classmethod of a node
class (``module:Class.method``) that is handed the class the identity names and
the arguments, and returns the node. :meth:`~somatize.node.Node.recipe` says how
a node is rebuilt, and refuses, saying what to do, for one that cannot be.

A blueprint also carries what the node holds in its public attributes when it is
sent (:attr:`Blueprint.held`): a copy rebuilt from the call that holds other values
there (a setting given after the node was made) would answer otherwise, and is
refused (:func:`check_held`).

A node that holds state (weights) is rebuilt by its constructor and then handed
its state, when it can hand it over (:func:`state_crosses`); the broker
(:mod:`somatize.broker.host`) carries the state and checks its digest, and compares
what the copy holds once that state is loaded — its state may be held in public
attributes too, which only the state makes equal.

The code fingerprint lives here too, since it is a fact about the
implementation (:func:`fingerprint_of`). It is metadata, never part of a key. It
covers the class and every class it inherits from, short of the library's (``Node``,
the standard library's, torch's — a torch upgrade does not make every answer
drifted; another package's classes count, so its upgrade does), and for a torch node
the classes of its module's submodules too. Each class is read as it was loaded, not
as its file reads now: each of its functions by its source where the file, compiled
now, still makes the code that runs (which keeps a fingerprint the same across Python
versions), else by that code (a class typed into an interpreter, a file edited since
it was imported), digested alike in every process; with its plain values (numbers,
strings, tuples of them), the functions' defaults and what they close over (a plain value,
a function by how it is written). Any other object a function closes over, and a
callable a class holds that is no plain function (a callable object, a mock), or any
object it holds, or a function closes over, in a dict, list, tuple or set
(``acts = {"a": Scale(2)}``, read as deep and
as far as such an object is, :func:`_contained_bytes`), is named
by its class and what it holds where all it holds is named so in turn (:func:`_held_bytes`:
the same in every process making it alike), else by a mark of that very object, the
same for no other object in any process (:func:`_token_of`): a replacement, or the
object changed in place, is never taken for the old code. Its functions' code is followed
into their module, one module only: the plain functions defined there that they
name (and those these name) and the plain constants, the objects of helper classes of its
package (by their class's code and what they hold), and its tables as its text writes
them — watched where the code only reads them and they hold only plain values (a change
in place after a graph was built is seen). A module or class from elsewhere, a
module-level table the code fills or that holds objects, a callable that is not a plain
function (a decorated helper), a value the code reads from an object are not seen.
A class's body is watched by a graph at every forward (:func:`watch_code`): a method set
on it after the graph was built (a monkeypatch), a method given other code or defaults
in place (``f.__code__ = ...``, as a reloader does), or the class given other bases is
that node's code from then on.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import dis
import functools
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import linecache
import operator
import os
import sys
import textwrap
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from types import (
    BuiltinFunctionType,
    CellType,
    ClassMethodDescriptorType,
    CodeType,
    FunctionType,
    GetSetDescriptorType,
    MappingProxyType,
    MemberDescriptorType,
    MethodDescriptorType,
    MethodType,
    ModuleType,
    WrapperDescriptorType,
)
from typing import TYPE_CHECKING, Any, NamedTuple

from somatize import canonical
from somatize.errors import SomatizeError, SomatizeWarning

if TYPE_CHECKING:
    from somatize.node import Node

__all__ = [
    "Blueprint",
    "Catalog",
    "Unbuildable",
    "blueprint_of",
    "check_held",
    "code_changes",
    "code_digest",
    "fingerprint_of",
    "held_at",
    "identity_of",
    "marks_moved",
    "own_state",
    "state_crosses",
    "state_taken",
    "watch_code",
    "watched_again",
]


class Unbuildable(SomatizeError, LookupError):
    """An identity that this process cannot turn back into an implementation."""


def identity_of(kind: type) -> str | None:
    """``module:qualname`` of ``kind``, or None when the name would not lead back to it.

    A class defined in ``__main__`` has an identity (a notebook's nodes are keyed
    like any other); one defined inside a function does not, since every call
    makes another class under the same name; nor does any class its module does not
    hold under its name — one made by ``type(...)`` in a function (a factory's
    ``type("Add", (Node,), {"k": k, "forward": ...})``), whose values (what it holds,
    what its methods close over) are in no key and differ from call to call. (A class
    its module holds, given a function later — a method patched in — keeps its name.)
    """
    explicit = kind.__dict__.get("identity")
    if isinstance(explicit, str):
        return explicit
    qualname = kind.__qualname__
    if "<locals>" in qualname or "<lambda>" in qualname:
        return None
    if not _held_under_its_name(kind):
        return None
    return f"{kind.__module__}:{qualname}"


def _held_under_its_name(kind: type) -> bool:
    """Whether ``kind``'s module holds it under its qualified name."""
    return held_at(kind.__module__, kind.__qualname__) is kind


def held_at(module: str, qualname: str) -> Any:
    """What loaded module ``module`` holds at ``qualname`` (``Outer.Inner``), or None —
    read from module and class namespaces only: nothing is imported, and no module
    ``__getattr__`` (which may import) or metaclass property runs for a name that came
    from elsewhere (a store)."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if not isinstance(found, (type(sys), type)):
            return None
        found = vars(found).get(part)
    return found


Looked = tuple[tuple["weakref.ref[Any]", str, Any], ...]
"""Each global name a fingerprint looked up: a function that reads it (in whose module
it was looked up; or the module, one that defines no function), the name, and what it
found there (:func:`_found_as`). The functions are held weakly, so that what a class's
fingerprint notes keeps neither the class nor its module alive."""

_ABSENT = object()
_OTHER = object()

Body = tuple[tuple[str, Any], ...]
"""What a class's own body held when its fingerprint was worked out (:func:`_body_of`)."""

_FINGERPRINTS: weakref.WeakKeyDictionary[
    type, tuple[bytes, Looked, Body, tuple[frozenset[str], frozenset[str]]]
] = weakref.WeakKeyDictionary()
"""A class → the digest of what its own body holds (:func:`_written`), the module names
it looked up for it, what its body held then and the names taken as state, worked out
again when other names are state (it is fingerprinted in another lineage), or when one of those
names holds another helper or value (a notebook's cell run again), or the body holds
another function or value (a method set on the class, or deleted from it, since)."""

_FUNCTIONS: weakref.WeakKeyDictionary[FunctionType, tuple[Any, bytes]] = weakref.WeakKeyDictionary()
"""A function → the code it ran and its defaults (:func:`_made_of`), and the digest of
them (:func:`_function_bytes`), worked out again when it is given other code (``f.__code__
= ...``, as a reloader does) or other defaults (``f.__defaults__ = ...``)."""

_LEFT_OUT = frozenset({"torch"})
"""Packages whose classes no fingerprint covers, besides the standard library's: the
library a node is written against, not the node's code — an upgrade of torch does not
make every answer drifted."""


def fingerprint_of(*kinds: type) -> str:
    """A digest of how the classes ``kinds`` are written: each of them and every class they inherit
    from, and their metaclasses (:func:`_ancestry`), short of the library's
    (:class:`~somatize.node.Node`, classes of the standard library and of torch), each by
    its code as it was loaded — the source of each of its functions, where the source found
    still compiles to the code that runs, else that code — the plain values it holds
    (numbers, strings, tuples of them), and the helpers its functions name in their module:
    the plain functions defined there (followed on to the ones they name) and the plain
    values, those these functions assign (``global``: the module's state as it runs) as the
    module's text assigns them. The same in every process running the same code. Each class
    is worked out once, when first asked, and again when a name its functions look up in
    their module holds another helper or value since (a notebook's cell run again), or a
    function or value of its body is set, added or deleted since (a method patched in:
    ``Kind.forward = other``)."""
    lineage: dict[type, None] = {}
    for kind in kinds:
        for above in _ancestry(kind):
            if not _left_out(above):
                lineage[above] = None
    # A name the code of the lineage sets on one of its classes as it runs (a counter a
    # subclass moves on itself, declared on its base) is their state, not their code.
    state = _state_of(lineage, (member for k in lineage for member in list(vars(k).values())))
    filled, by_forward = _fillers(lineage)
    state |= filled
    kept = by_forward - state
    entries = sorted(
        (f"{k.__module__}:{k.__qualname__}".encode(), _written(k, state, kept)) for k in lineage
    )
    digest = hashlib.sha256(b"somatize code 2\0")
    for name, written in entries:
        digest.update(len(name).to_bytes(8, "little") + name + written)
    return "sha256:" + digest.hexdigest()[:16]


def _ancestry(kind: type) -> tuple[type, ...]:
    """The classes whose code and values ``kind``'s instances run and read: those it
    inherits from, and its metaclass and those that inherits from (``type(self).by`` finds
    a value set on the metaclass)."""
    meta: type = type(kind)
    return (*kind.__mro__, *meta.__mro__)


def _left_out(kind: type) -> bool:
    """Whether ``kind`` is the library's rather than the node's: Node, a class of the
    standard library (``object``), or one of a package of :data:`_LEFT_OUT`."""
    from somatize.node import Node

    top = kind.__module__.partition(".")[0]
    return kind is Node or top in sys.stdlib_module_names or top in _LEFT_OUT


def _written(kind: type, state: frozenset[str], kept: frozenset[str] = frozenset()) -> bytes:
    """The digest of what ``kind``'s own body holds: each function (by
    :func:`_function_bytes`), each plain value, and what its functions name in their
    module (:func:`_named`), and each dict, list, tuple or set that holds an object, by
    what it holds (:func:`_contained_bytes`). A dataclass is said by its fields, not by
    the methods made for it (whose code is the Python version's as much as the class's). A
    name of
    ``state`` (what the code of its lineage sets on a class of it as it runs) is taken as
    the class's text assigns it, and not at all where the class does not assign it but a
    class it inherits from holds it (a counter declared on a base, moved on the subclass
    by ``type(self).calls += 1``): that class's value is the one written. Where no text
    of the class is known (typed into a notebook), such a name is digested by a mark
    alone, whatever it holds. A table of ``kept`` (one its node's forward fills) is named
    as it was first seen (:func:`_sighted`)."""
    found = _FINGERPRINTS.get(kind)
    body = _body_of(kind, state, kept)
    if (
        found is not None
        and found[2] == body
        and found[3] == (state, kept)
        and all(_still(*name) for name in found[1])
    ):
        return found[0]
    digest = hashlib.sha256()
    made = "__dataclass_params__" in vars(kind)
    if made:
        _put(digest, b"fields", *(field.name.encode() for field in dataclasses.fields(kind)))
    functions: list[FunctionType] = []
    members = sorted(vars(kind).items(), key=lambda item: item[0])
    helds = [_functions_in(member) for _, member in members]
    texts: list[list[ast.stmt] | None] = []  # the class's statements, read once if needed
    for (name, member), held in zip(members, helds, strict=True):
        if made and _dunder(name):  # made for the dataclass from a text of its own
            held = [f for f in held if f.__code__.co_filename != "<string>"]
        for function in held:
            _put(digest, b"def " + name.encode(), _function_bytes(function))
            tables = _default_tables(name, function)
            if tables:  # by what they hold, or once changed in place, a mark
                _put(digest, b"defaults " + name.encode(), *map(_default_table_bytes, tables))
        bound = _bound_in(member) if held else []
        if bound:
            _put(digest, b"bound " + name.encode(), *bound)
        functions += held
        opaque = None if held or _dunder(name) or _plain(member) else _opaque_bytes(member)
        if opaque is not None:
            _put(digest, b"object " + name.encode(), opaque)
        filled = _table(name, member) and name in state
        if _table(name, member) and name in kept and not filled:
            if not texts:
                texts.append(_class_body(kind))
            where = f"{kind.__qualname__}.{name}"
            sighted = _sighted(member, _assignment(texts[0], name), where)
            _put(digest, b"table " + name.encode(), sighted)
            continue
        contained = None if _dunder(name) or filled else _contained_bytes(member)
        if contained is not None:
            _put(digest, b"holds " + name.encode(), contained)
        elif filled:  # filled by its own code (with objects too, a registry): as written
            if not texts:
                texts.append(_class_body(kind))
            made_as = _assignment(texts[0], name)
            if made_as is not None:
                _put(digest, b"table " + name.encode(), b"written " + ast.unparse(made_as).encode())
            elif not any(name in vars(above) for above in kind.__mro__[1:]):
                _put(digest, b"table " + name.encode(), b"state")
        elif _table(name, member):  # by what it holds, or once changed in place, a mark
            _put(digest, b"table " + name.encode(), _held_bytes(member) or _token_of(member))
        if not held and not _dunder(name) and _plain(member):
            if not texts:
                texts.append(_class_body(kind))
            text = texts[0]
            if name in state and _assignment(text, name) is None:
                if not any(name in vars(above) for above in kind.__mro__[1:]):
                    # state no known text assigns (a class typed in a notebook): no value
                    _put(digest, b"let " + name.encode(), b"state")
                continue  # else state a class it inherits from declares
            value = _as_written(text, name, member) if name in state else member
            assigned = _assigned(text, name, value)
            _put(digest, b"let " + name.encode(), assigned or _constant_bytes(value))
    named, looked = _named(functions)
    for label, piece in named:
        _put(digest, label, piece)
    written = digest.digest()
    if kept:  # a table first seen as it was worked out was marked: read as it is now
        body = _body_of(kind, state, kept)
    _FINGERPRINTS[kind] = (written, looked, body, (state, kept))
    return written


def _body_of(kind: type, state: frozenset[str], kept: frozenset[str] = frozenset()) -> Body:
    """What of ``kind``'s own body its fingerprint reads, to tell whether it changed since:
    each name it holds, with weak references to the functions held there and their code
    (a function replaced by another is told apart, as is one given other code in place,
    and what is remembered keeps neither the class nor its functions alive), or the plain
    value held there, by type and value — not one of ``state``, which the fingerprint
    takes by the class's text, so that a count moved as the class runs is not a change
    to work out again — or None."""
    body: list[tuple[str, Any]] = []
    for name, member in list(vars(kind).items()):
        held = _functions_in(member)
        if held:
            functions = tuple(
                (weakref.ref(f), _made_of(f), tuple(map(_table_now, _default_tables(name, f))))
                for f in held
            )
            body.append((name, (functions, _bound_in(member))))
        elif _plain(member):
            body.append((name, "state" if name in state else (type(member), member)))
        elif type(member) in _CONTAINERS and not _dunder(name):  # read again, as an object
            contained = None if name in state or name in kept else _contained_bytes(member)
            if name in kept and name not in state:  # as first seen, till changed elsewhere
                body.append((name, ("kept", _Same(member), _version_of(member))))
            elif name in state:  # a table its own code fills (a registry too): by its text
                body.append((name, ("state", _Same(member))))
            elif contained is None:  # a table: by what it holds, or its mark
                body.append((name, (_held_bytes(member), _Same(member), _version_of(member))))
            else:
                body.append((name, contained))
        else:
            opaque = _opaque_bytes(member)
            if opaque is not None and opaque.startswith(b"object "):  # marked: by identity
                body.append((name, (_Same(member), _version_of(_runner(member)))))
            else:  # named by what it holds, read again: one changed in place is seen
                body.append((name, opaque))
    return tuple(body)


_SIGHTED: dict[bytes, bytes] = {}
"""The first mark (:func:`_token_of`) given a table its node's forward fills → how the table
was named when first seen (:func:`_sighted`); a mark given anew, the table changed
elsewhere since, is in none."""


def _sighted(table: Any, made: ast.expr | None, label: str) -> bytes:
    """A table its node's forward fills (:func:`_fillers`), or one of its module its
    code only reads (:func:`_named`), that the text assigns as ``made``, named as it was
    when first seen, and marked then: as the text writes it where it held that then
    (``_memo = {}``: the same in every process, however full its forward makes it), else
    by what it held (:func:`_held_bytes`: one set otherwise as a script starts, bound to
    another name, ``ORDER = ORDERED``, or whose text is not known, ``python -c``). By its
    mark alone once it is given a new one, changed between forwards (:func:`_moved_on`),
    so that what was computed with it before is never recalled for it. ``label`` says
    where it is held (``Kind.name``, ``module:name``)."""
    version = _version_of(table)
    if version is not None:
        return _SIGHTED.get(version, version)
    try:
        as_written = made is not None and ast.literal_eval(made) == table
    except Exception:  # not a literal, or one that does not compare
        as_written = False
    if as_written and made is not None:
        named = b"written " + ast.unparse(made).encode()
    else:
        named = _held_bytes(table) or _contained_bytes(table) or b""
    token = _token_of(table)
    _SIGHTED[token] = named or token
    _marked(table, label, table=True)  # noted now: a change before a graph watches it is seen
    return _SIGHTED[token]


def _plain_table(value: Any) -> bool:
    """Whether ``value`` is a dict, list or set holding only plain values, or such tables, of
    fewer than :data:`_STATE_ITEMS` entries in all: one a graph's watch reads whole."""
    count = 0
    queue = [value]
    while queue:
        table = queue.pop()
        count += len(table) + 1
        if count >= _STATE_ITEMS:
            return False
        for item in (*table.keys(), *table.values()) if isinstance(table, dict) else table:
            if type(item) in _CONTAINERS and not _exactly_plain(item):
                queue.append(item)
            elif not _exactly_plain(item):
                return False
    return True


class _HeldSeen(NamedTuple):
    """What :data:`Looked` notes of what a node's module holds that is watched by which
    object it is: a table its code only reads (:func:`_sighted`), an object of a helper
    class (``SCALER = Scaler(2)``)."""

    held: Any
    """The table."""
    version: bytes | None
    """Its mark when the fingerprint was worked out: given a new one since, it changed."""
    label: str
    """``module:name``."""


class _Same:
    """An object a class body holds, equal to another only when it holds the same object."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.held is self.held

    __hash__ = None  # type: ignore[assignment]


_NO_SELF = (ModuleType, type(None))
"""What a builtin function named by its name alone is bound to: a module, or nothing — not
an object whose state it computes with (``re.compile("a").search``)."""


def _builtin_bytes(function: BuiltinFunctionType) -> bytes | None:
    """A builtin function by its name, the same in every process, where it is one of a
    module (``math.sqrt``) or of a class its name leads back to (``tuple.__new__``, which
    ``namedtuple``'s methods close over); None for one bound to an object whose state it
    computes with (``re.compile("a").search``)."""
    bound = function.__self__
    if isinstance(bound, _NO_SELF):
        return f"builtin {function.__module__}:{function.__qualname__}".encode()
    if isinstance(bound, type) and identity_of(bound) is not None:
        return f"builtin {identity_of(bound)}.{function.__name__}".encode()
    return None


def _opaque_bytes(member: Any) -> bytes | None:
    """How a class attribute that runs code but is no plain function (a callable object,
    a mock, a ``singledispatchmethod``) is fingerprinted: a builtin function of a module by
    its name, an object whose state is all named by what it is by that
    (:func:`_held_bytes`: the same in every process), any other (a builtin method of an
    object, ``re.compile("a").search``) by a mark of that very object (:func:`_token_of`),
    never another's — so one replaced by another is never taken for the old code. None
    for what runs no code of the class's (a class, a slot, a plain value)."""
    member = _runner(member)
    if member is None:
        return None
    if isinstance(member, BuiltinFunctionType) and (named := _builtin_bytes(member)):
        return named
    return _held_bytes(member) or _token_of(member)


def _runner(member: Any) -> Any:
    """What of a class attribute :func:`_opaque_bytes` names: what a static or class method
    holds, else itself; None where it runs no code of the class's (a class, a slot, a
    plain value)."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, (type, MemberDescriptorType, GetSetDescriptorType, ModuleType)):
        return None
    return member if callable(member) or hasattr(type(member), "__get__") else None


_NONCE = os.urandom(16)
_TOKENS: dict[int, tuple[Callable[[], Any], bytes]] = {}
"""An object, by its address (not by ``==``, which may call two objects equal), → a weak
reference to it, which tells it from another at the same address later (a :class:`_Kept`
where it cannot be referenced weakly), and its mark."""
_COUNT = itertools.count()


def _token_of(held: Any) -> bytes:
    """A mark of the object ``held`` that no other object is given, in this process or any
    other: the same for it while it lives. One that cannot be referenced weakly (a class
    with ``__slots__`` and no ``__weakref__``, a bare list or dict) is kept alive for it
    (:class:`_Kept`), so that it keeps its mark and can be watched."""
    found = _TOKENS.get(id(held))
    if found is not None and found[0]() is held:
        return found[1]
    token = b"object " + _NONCE + next(_COUNT).to_bytes(8, "little")
    _TOKENS[id(held)] = (_reference(held), token)
    return token


class _Kept:
    """A reference to an object that cannot be referenced weakly, called as a weak one is:
    it answers the object, which it keeps alive, so that its address is never another's."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __call__(self) -> Any:
        return self.held


def _reference(held: Any, forget: Any = None) -> Any:
    """A weak reference to ``held`` (calling ``forget`` once it is gone), or a
    :class:`_Kept` where it cannot be referenced weakly."""
    try:
        return weakref.ref(held, forget)
    except TypeError:
        pass
    _KEPT[0] += 1
    if _KEPT[0] > _KEPT[1]:
        _let_go()
    return _Kept(held)


_KEPT = [0, 64]
"""How many :class:`_Kept` were made since the last :func:`_let_go`, and how many more
call for the next (twice as many as it left, at least 64: a sweep now and then, never
one for each)."""


def _let_go() -> None:
    """Forgets each object kept alive by a :class:`_Kept` that nothing else holds any more
    (a table a class held, replaced since, no graph watching it): it is freed, and nothing
    can ask for its mark again — so that graphs built in a loop, each of a class given a
    new one, do not keep every one for the whole process."""
    places: dict[int, list[tuple[dict[int, Any], int]]] = {}
    wrappers: dict[int, set[int]] = {}
    tables: tuple[dict[int, Any], ...] = (_TOKENS, _HELD, _MARKED)
    for table in tables:
        for at, entry in list(table.items()):
            kept = entry[0]
            if type(kept) is _Kept:
                places.setdefault(id(kept.held), []).append((table, at))
                wrappers.setdefault(id(kept.held), set()).add(id(kept))
    left = 0
    for key, found in places.items():
        first: Any = found[0][0].get(found[0][1])
        if first is None or type(first[0]) is not _Kept:
            continue
        held = first[0].held
        del first
        # held by its wrappers, `held` here and getrefcount's argument, and nothing else
        if sys.getrefcount(held) - 2 <= len(wrappers[key]):
            for table, at in found:
                there = table.get(at)
                if there is not None and type(there[0]) is _Kept and there[0].held is held:
                    table.pop(at, None)  # another thread may have let it go
        else:
            left += 1
        del held
    _KEPT[:] = [0, max(64, 2 * left)]


def _version_of(held: Any) -> bytes | None:
    """The mark ``held`` is given now (:func:`_token_of`), or None where it has none kept."""
    found = _TOKENS.get(id(held))
    return found[1] if found is not None and found[0]() is held else None


def _moved_on(held: Any) -> None:
    """Gives ``held``, marked by which object it is, a new mark: it was changed in place
    since, and what it computes now is never taken for what it computed before."""
    found = _TOKENS.get(id(held))
    if found is not None and found[0]() is held:
        _TOKENS[id(held)] = (found[0], b"object " + _NONCE + next(_COUNT).to_bytes(8, "little"))


_HELD_DEPTH = 8
_HELD_ITEMS = 4096
"""How deep, and over how many values, an object is read to be named by what it holds
(:func:`_held_bytes`); one deeper or larger is marked by which object it is."""

_STATE_ITEMS = 4096
"""How many entries, nearest first, of the dicts, lists and sets an object marked by which
object it is holds are read for a graph's watch (:func:`_state_read`): each is compared at
every forward. One holding more cannot be watched so: it is taken as changed at every look
(:class:`_Unseen`), never as unchanged."""

_CONTAINERS = (list, dict, set, frozenset, tuple, collections.OrderedDict)
_HEAPTYPE = 1 << 9
_C_MEMBERS = (
    BuiltinFunctionType,
    MethodDescriptorType,
    WrapperDescriptorType,
    ClassMethodDescriptorType,
)
_WALKING = threading.local()
"""What is being named by what it holds in this thread (objects, by id, and classes being
fingerprinted for one), so that an object reached again through a function it holds, or
its class's own body, is marked rather than read without end."""


class _Unnamed(Exception):
    """An object whose state is not all named by what it is."""


def _held_bytes(value: Any, containers: list[Any] | None = None) -> bytes | None:
    """``value`` named by what it is, the same in every process that makes it alike, or
    None where it cannot be (then it is marked by which object it is, :func:`_token_of`).

    An object is named by its class's name and fingerprint (:func:`fingerprint_of`), what
    its classes hold that their fingerprints do not name (:func:`_unwritten`: a table, a
    class), and its attributes, each named in turn: a plain value by what it is, a function
    by how it is written (:func:`_function_bytes`) and what it names in its module
    (:func:`_named`: a helper, a constant, as for a class's own functions) and the objects
    it closes over, a class by its name (where that leads back to it), its fingerprint and
    what it keeps, as an object's class is, a module by its name, a list, tuple, dict or set
    by its items, a partial by its function and what it binds, a bound method by its
    function and its object, another object the same way. An object is not named so — the
    whole is marked — where any part holds what no name says: a class written in C (a
    tensor, an array, a lock), an object with slots, one whose class says when it equals
    another (``__eq__``, but as a dataclass does: a graph's watch compares what it holds
    with ``==``), a torch module holding hooks; one reached deeper or larger than a bound;
    one that cannot be referenced weakly (a bare list or dict); or one whose class's own
    code sets its attributes as it runs (a count, a cache).

    An object is read each time it is asked of, and keeps the name it was first given while
    it reads so: one changed in place since (``Kind.act.k = 3``, ``-0.0`` for ``0.0``, a
    helper its function names rebound) is marked by which object it is from then on, so its
    old name is never taken for what it computes now. Nothing read of it is kept from one
    time to the next (a cycle through it would keep it alive). ``containers`` is given each
    dict, list and set read of it (its attributes among them) and the namespaces of its
    classes, for a graph's watch to see such a change at the next forward."""
    if type(value) in _CONTAINERS:  # a table a class holds: kept alive, to be named
        reference = _reference(value)
    else:
        try:
            reference = weakref.ref(value, functools.partial(_forget_held, id(value)))
        except TypeError:
            return None
    walking = _walking()
    if id(value) in walking:  # reached again as it is read or looked at: marked for good
        _HELD[id(value)] = (reference, None)
        return None
    found = _HELD.get(id(value))
    if found is not None and found[0]() is not value:  # noted of another, gone since
        del _HELD[id(value)]
        found = None
    if found is not None and found[1] is None:
        return None
    walk = _Walk(walking)
    try:
        said = walk.name(value, 0)
    except (_Unnamed, RecursionError):
        said = None
    finally:
        walking.difference_update(walk.placed)
    named = None if said is None else b"held " + hashlib.sha256(said).digest()
    if _HELD.get(id(value)) is not found or (found is not None and found[1] != named):
        # reached again as it was read, or changed in place since it was named: marked
        named = None
    _HELD[id(value)] = (reference if found is None else found[0], named)
    if named is not None and containers is not None:
        containers += walk.read
    return named


def _walking() -> set[int]:
    """The objects being named by what they hold in this thread, by id (:data:`_WALKING`)."""
    walking: set[int] | None = getattr(_WALKING, "ids", None)
    if walking is None:
        walking = _WALKING.ids = set()
        _WALKING.kinds = set()
    return walking


def _contained_bytes(
    member: Any, read: list[Any] | None = None, marked: list[Any] | None = None
) -> bytes | None:
    """A dict, list, tuple or set a class holds that holds an object, nested or not
    (``acts = {"a": Scale(2)}``, ``layers = [Scale(2)]``), named by what it holds as
    :func:`_held_bytes` reads a container, each object in it (no container, no plain
    value) as one the class held itself: by what it holds where it can be
    (:func:`_held_bytes`), else by a mark of that very object (:func:`_token_of`). None for
    any other member, for one holding only plain values (a table, a cache its code fills),
    and for one deeper or larger than the walk's bound. ``read`` is given each dict, list
    and set read of the objects in it named by what they hold, ``marked`` each object in
    it marked by which object it is, for a graph's watch (which reads the container itself
    as it reads a marked object, :class:`_Marked`)."""
    if type(member) not in _CONTAINERS or _plain(member):
        return None
    found: dict[int, Any] = {}  # each object in it, by id
    seen: list[Any] = []
    marks: list[Any] = []

    def leaf(value: Any) -> bytes:
        if id(value) not in found:
            found[id(value)] = value
            if isinstance(value, BuiltinFunctionType) and (builtin := _builtin_bytes(value)):
                return builtin
            named = _held_bytes(value, seen)
            if named is not None:
                return named
            marks.append(value)
        return _token_of(value)

    walking = _walking()
    walk = _Walk(walking, leaf)
    try:
        said = walk.name(member, 0)
    except (_Unnamed, RecursionError):
        return None
    finally:
        walking.difference_update(walk.placed)
    if not found:
        return None
    if read is not None:
        read += seen
    if marked is not None:
        marked += marks
    return b"holds " + hashlib.sha256(said).digest()


_HELD: dict[int, tuple[weakref.ref[Any], bytes | None]] = {}
"""An object named by what it holds, by its address → a weak reference to it and the name
it was first given (None: it is marked by which object it is, :func:`_token_of`); nothing
it holds, so that an object is never kept alive by having been named (:func:`_held_bytes`)."""


def _forget_held(at: int, reference: weakref.ref[Any], held: dict[int, Any] = _HELD) -> None:
    """Forgets what :data:`_HELD` says of an object gone (not of another made since at its
    address). Reads no global: it may be called as the process ends."""
    found = held.get(at)
    if found is not None and found[0] is reference:
        del held[at]


class _Walk:
    """One reading of an object for :func:`_held_bytes`."""

    def __init__(self, walking: set[int], leaf: Any = None) -> None:
        self.walking = walking
        self.leaf = leaf  # names each object, no container, in place of reading it
        self.placed: dict[int, int] = {}  # an object read → its place in the reading
        self.held: list[Any] = []  # what was read, alive while ids name it
        self.read: list[Any] = []  # each dict, list, set and class namespace read
        self.count = 0

    def name(self, value: Any, depth: int) -> bytes:
        self.count += 1
        if depth > _HELD_DEPTH or self.count > _HELD_ITEMS:
            raise _Unnamed
        if _exactly_plain(value):
            return _constant_bytes(value)
        at = self.placed.get(id(value))
        if at is not None:  # read before here (shared, or a cycle): by its place
            return b"again %d" % at
        if id(value) in self.walking:  # being read around this reading
            raise _Unnamed
        if self.leaf is not None and type(value) not in _CONTAINERS:
            return bytes(self.leaf(value))
        if isinstance(value, FunctionType):  # with what it names in its module
            named, _ = _named([value])
            pieces = [label + b"\0" + piece for label, piece in named]
            # what it closes over read here too, for a watch to see it changed in place
            pieces += (self.name(held, depth + 1) for held in _closed_objects(value))
            return _joined(b"function " + _function_bytes(value), pieces)
        if isinstance(value, type) and identity_of(value) is None:
            raise _Unnamed
        if isinstance(value, ModuleType):
            return f"module {value.__name__}".encode()
        if isinstance(value, BuiltinFunctionType):
            builtin = _builtin_bytes(value)
            if builtin is None:  # a method of an object in C
                raise _Unnamed
            return builtin
        self.placed[id(value)] = len(self.placed)
        self.walking.add(id(value))
        self.held.append(value)
        kind = type(value)
        deeper = depth + 1
        if isinstance(value, type):
            said, *kept = self.written(value, deeper)
            return _joined(b"class " + said, kept)
        if kind in _CONTAINERS:
            items: list[bytes]
            if isinstance(value, dict):
                items = [self.name(k, deeper) + self.name(v, deeper) for k, v in value.items()]
            else:
                items = [self.name(item, deeper) for item in value]
            if isinstance(value, (set, frozenset)):
                items.sort()
            if kind is not tuple and kind is not frozenset:
                self.see(value)
            return _joined(f"{kind.__name__}".encode(), items)
        if isinstance(value, (staticmethod, classmethod)):
            return _joined(kind.__name__.encode(), [self.name(value.__func__, deeper)])
        if isinstance(value, MethodType):
            parts = [self.name(value.__func__, deeper), self.name(value.__self__, deeper)]
            return _joined(b"method", parts)
        if kind is functools.partial:
            self.see(value.keywords)
            parts = [self.name(value.func, deeper), self.name(value.args, deeper)]
            parts.append(self.name(value.keywords, deeper))
            parts.append(self.name(self.attributes(value), deeper))
            return _joined(b"partial", parts)
        if not _readable(kind):
            raise _Unnamed
        attributes = self.attributes(value)
        if _torch_module(kind):
            for own in _TORCH_OWN.intersection(attributes):  # seen changed, not named
                if type(attributes[own]) in _CONTAINERS:
                    self.see(attributes[own])
            attributes = _torch_named(attributes)
        if _moves_itself(kind):
            raise _Unnamed  # what it holds is its state as it runs, not what it is
        said, *kept = self.written(kind, deeper)
        pairs = [a.encode() + b"\0" + self.name(attributes[a], deeper) for a in sorted(attributes)]
        return _joined(b"object " + said, kept + pairs)

    def written(self, kind: type, depth: int) -> list[bytes]:
        """``kind`` by its name and fingerprint (:func:`fingerprint_of`), then each thing its
        classes keep that their fingerprints do not name (:func:`_unwritten`: a table, a
        class), each named in turn; their namespaces are seen."""
        kinds: set[type] = _WALKING.kinds
        if kind in kinds:  # its fingerprint is being worked out, reading this
            raise _Unnamed
        kinds.add(kind)
        try:
            written = fingerprint_of(kind)
        finally:
            kinds.discard(kind)
        lineage = [above for above in kind.__mro__ if not _left_out(above)]
        self.read += map(vars, lineage)
        parts = [f"{kind.__module__}:{kind.__qualname__} {written}".encode()]
        for above in lineage:
            for name, member in sorted(vars(above).items()):
                if _unwritten(name, member):
                    label = f"{above.__qualname__}.{name}".encode()
                    parts.append(label + b"\0" + self.name(member, depth))
        return parts

    def attributes(self, value: Any) -> dict[str, Any]:
        """What ``value`` holds in its ``__dict__`` (seen for a watch), or {} with none."""
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except AttributeError:
            return {}
        if type(attributes) is not dict or not all(isinstance(a, str) for a in attributes):
            raise _Unnamed
        self.see(attributes)
        return attributes

    def see(self, container: Any) -> None:
        self.read.append(container)


def _unwritten(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds what its fingerprint (:func:`_written`) does not
    name: no dunder, plain value, function nor callable object, but a list, a dict, a
    class, a module or another object (``table = {"by": 2}``, ``make = Layer``)."""
    if _dunder(name) or _plain(member) or _functions_in(member):
        return False
    if isinstance(member, (type, ModuleType)):
        return True
    return not callable(member) and not hasattr(type(member), "__get__")


_FILLERS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove"}
    | {"discard", "clear", "sort", "reverse", "__setitem__", "__delitem__"}
)
"""What a dict, list or set is changed in place by, called."""


def _fillers(lineage: Iterable[type]) -> tuple[frozenset[str], frozenset[str]]:
    """The names of the tables (:func:`_table`) the classes of ``lineage`` hold that a
    function of theirs run as a node is made changes in place (``self.built["n"] += 1``,
    ``type(self).names.add(name)`` in ``__init__`` or a method it calls), and of those the
    others do (``forward``, a method its user calls, ``Kind.register("a", 3)``). The first
    are their state, as a count a class moves on itself is, taken as the class's text
    writes it and not watched — changed as a node is made, it would make every graph built
    after drift. One only the others fill (a memo, ``self._memo[x] = y``; a registry of
    values) is named as the class's text writes it where it held that when first seen, the
    same in every process, else by what it holds (:func:`_sighted`), and watched, so that
    a change made to it between forwards is seen; what its node's forward changes in it is
    its state."""
    kinds = list(lineage)
    tables = frozenset(n for k in kinds for n, m in list(vars(k).items()) if _table(n, m))
    if not tables:
        return frozenset(), frozenset()
    functions = [
        (name, function)
        for kind in kinds
        for name, member in list(vars(kind).items())
        for function in _functions_in(member)
    ]
    building = _run_as_made(functions)
    filled: set[str] = set()
    others: set[str] = set()
    for name, function in functions:
        if name in building:
            filled |= _changes_of(function.__code__, tables, False)
        else:  # a forward's, handed to a function that may fill it, too
            others |= _changes_of(function.__code__, tables, name == "forward")
    return frozenset(filled), frozenset(others)


_MAKERS = frozenset({"__new__", "__init__", "__post_init__", "__init_subclass__"})
"""The functions of a class that run as an object of it, or a class below it, is made."""


def _run_as_made(functions: list[tuple[str, FunctionType]]) -> set[str]:
    """The names of ``functions`` (each a class's name for it, and it) run as a node is
    made: :data:`_MAKERS`, and those of the others they name (``self._count()``), in turn."""
    names = {name for name, _ in functions}
    making = set(_MAKERS)
    grown = True
    while grown:
        grown = False
        for name, function in functions:
            if name in making:
                called = (_names_in(function.__code__) & names) - making
                making |= called
                grown = grown or bool(called)
    return making


_CHANGES: weakref.WeakKeyDictionary[CodeType, dict[tuple[frozenset[str], bool], frozenset[str]]]
_CHANGES = weakref.WeakKeyDictionary()
"""A function's code → which of some tables it changes in place (:func:`_changes_of`): its
instructions read once, not at every graph built with its class."""


def _changes_of(code: CodeType, tables: frozenset[str], forward: bool) -> frozenset[str]:
    """Which of ``tables`` the code ``code`` changes in place (:func:`_tables_changed_by`),
    or, a ``forward``'s, also hands on to a function that may (:func:`_tables_handed_by`)."""
    found = _CHANGES.setdefault(code, {})
    changed = found.get((tables, forward))
    if changed is None:
        changed = frozenset(_tables_changed_by(code, set(tables)))
        if forward:
            changed |= _tables_handed_by(code, set(tables))
        found[(tables, forward)] = changed
    return changed


_READ_ON = frozenset(
    {"LOAD_ATTR", "LOAD_METHOD", "BINARY_SUBSCR", "CONTAINS_OP", "COMPARE_OP", "IS_OP"}
    | {"GET_ITER", "STORE_FAST", "STORE_DEREF", "COPY", "POP_TOP", "RETURN_VALUE"}
)
"""What a table read as an attribute is used by, read where it is (:func:`_tables_handed_by`)."""


_STATEMENT_ENDS = frozenset(
    {"POP_TOP", "RETURN_VALUE", "RETURN_CONST", "STORE_FAST", "STORE_DEREF", "STORE_NAME"}
    | {"STORE_GLOBAL", "STORE_ATTR", "STORE_SUBSCR", "RAISE_VARARGS", "YIELD_VALUE"}
)
"""What ends a statement that reads a table, or hands it on other than to a call."""


def _tables_handed_by(code: CodeType, tables: set[str]) -> set[str]:
    """Which of ``tables`` the code ``code`` (and that nested in it) reads as an attribute
    and hands on to a call in the same statement (``_remember(self._memo, x, y)``, its
    arguments written over lines too): to a function that may fill it."""
    found: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for at, instruction in enumerate(instructions):
        if instruction.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            continue
        if instruction.argval not in tables or at + 1 == len(instructions):
            continue
        if instructions[at + 1].opname in _READ_ON:
            continue
        for later in instructions[at + 1 :]:  # the call it is an argument of, over lines too
            if later.opname in _CALLS:
                found.add(instruction.argval)
                break
            if later.opname in _STATEMENT_ENDS or later.opname.startswith(("JUMP", "POP_JUMP")):
                break  # the statement ends, or goes elsewhere: no call of it
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _tables_handed_by(constant, tables)
    return found


def _tables_changed_by(
    code: CodeType,
    tables: set[str],
    loads: tuple[str, ...] = ("LOAD_ATTR", "LOAD_METHOD"),
    aliases: dict[str, str] | None = None,
) -> set[str]:
    """Which of ``tables`` the code ``code`` (and that nested in it) reads as an attribute
    (or by ``loads``: a local, for a table a function takes by default) and changes in
    place on the same line — a subscript set or deleted there, or a method of
    :data:`_FILLERS` called right on it —, or reads into a local (``memo =
    type(self)._memo``, ``aliases``: a local → the table it holds) that it changes so."""
    found: set[str] = set()
    lines: dict[Any, list[dis.Instruction]] = {}
    line: Any = None
    aliases = dict(aliases or {})
    instructions = list(dis.get_instructions(code))
    for loaded, stored in itertools.pairwise(instructions):
        if loaded.opname in loads and loaded.argval in tables and stored.opname in _ALIAS_STORES:
            aliases[stored.argval] = loaded.argval
    for instruction in instructions:
        starts: Any = getattr(instruction, "line_number", None) or instruction.starts_line
        if starts is not None and not isinstance(starts, bool):  # carried on to the next
            line = starts
        lines.setdefault(line, []).append(instruction)
    for line in lines.values():
        into = _stored_into(line, loads, aliases)
        if into is not None:  # the table of each item set there is told: only these change
            found |= tables & into
        stores = into is None
        for at, instruction in enumerate(line):
            local = instruction.opname in _LOCAL_LOADS and instruction.opname not in loads
            if instruction.opname not in loads and not (local and aliases):
                continue
            # two locals loaded at once (LOAD_FAST_LOAD_FAST), the last on top
            read = (
                instruction.argval if type(instruction.argval) is tuple else (instruction.argval,)
            )
            if local:  # a local holding a table, by the table's name
                read = tuple(aliases.get(name, "") for name in read)
            if not tables.intersection(read):
                continue
            following = line[at + 1] if at + 1 < len(line) else None
            called = (
                following is not None
                and following.opname in ("LOAD_ATTR", "LOAD_METHOD")
                and following.argval in _FILLERS
                and read[-1] in tables
            )
            if stores:
                found.update(tables.intersection(read))
            elif called:
                found.add(read[-1])
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _tables_changed_by(constant, tables, loads, aliases)
    return found


_ALIAS_STORES = ("STORE_FAST", "STORE_DEREF")
"""How a function's code puts what it read into a local (a table, :func:`_tables_changed_by`)."""


_KEY_LOADS = frozenset(
    {"LOAD_CONST", "LOAD_SMALL_INT", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"}
    | {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"}
)
"""How a key of one instruction, put right on the table it is set in, is read."""


def _stored_into(
    line: list[dis.Instruction], loads: tuple[str, ...], aliases: dict[str, str]
) -> set[str] | None:
    """The names of the tables (read by ``loads``, or a local of ``aliases``) whose item
    ``line`` sets or deletes (``out["y"] = x * SCALE["by"]`` sets one of ``out``, not of
    ``SCALE``; ``self._memo[x] = ...`` none read by ``LOAD_GLOBAL``); None where the table
    of one of them is not told (its key, or the table itself, is more than one read:
    ``SCALE["a"]["b"] = 3``), so that all it reads count."""
    into: set[str] = set()
    for at, instruction in enumerate(line):
        if instruction.opname not in ("STORE_SUBSCR", "DELETE_SUBSCR"):
            continue
        key = line[at - 1] if at >= 1 else None
        if key is not None and key.opname == "LOAD_FAST_LOAD_FAST":  # the table, the key
            held, name = key, key.argval[0]
        elif key is not None and key.opname in _KEY_LOADS and at >= 2:
            held, name = line[at - 2], line[at - 2].argval
        else:
            return None
        if held.opname in loads:
            into.add(name)
        elif held.opname in _LOCAL_LOADS:
            into.add(aliases.get(name, ""))
        elif held.opname not in _KEY_LOADS | {"LOAD_ATTR", "LOAD_METHOD"}:
            return None  # a table that is itself an item, or made there: not told
    return into


def _table(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds a dict, list or set of plain values (``table =
    {"by": 2}``, a cache its code fills): named by what it holds (:func:`_held_bytes`, read
    each time, so one changed in place is marked from then on, and watched as a marked
    object is: what its node's forward changes in it is its state)."""
    return not _dunder(name) and type(member) in _CONTAINERS and not _plain(member)


def _joined(label: bytes, parts: list[bytes]) -> bytes:
    return label + b"(" + b"".join(len(p).to_bytes(8, "little") + p for p in parts) + b")"


def _readable(kind: type) -> bool:
    """Whether an instance of ``kind`` holds all its state where it can be read, in its
    ``__dict__``: every class it inherits from, short of ``object``, written in Python
    (no method written in C, no slot), and none that says when it equals another but as
    a dataclass does."""
    found = _READABLE.get(kind)
    if found is None:
        found = _READABLE[kind] = _read_in_python(kind)
    return found


_READABLE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _moves_itself(kind: type) -> bool:
    """Whether a function of ``kind``, or of a class it inherits from short of the
    library's (:func:`_left_out`), sets or deletes an attribute of its first argument
    (``self.calls += 1``) other than as it is made (``__init__``, ``__post_init__``,
    ``__new__``, ``__setstate__``)."""
    for above in kind.__mro__:
        if _left_out(above):
            continue
        for name, member in list(vars(above).items()):
            if name in ("__init__", "__post_init__", "__new__", "__setstate__"):
                continue
            for function in _functions_in(member):
                if any(owner is None for owner, _ in _stores_of(function.__code__, True)):
                    return True
    return False


def _dataclass_equal(kind: type) -> bool:
    """Whether ``kind`` says when it equals another by the ``__eq__`` a dataclass is made
    with: field by field, each by ``==``, as a watch compares what it holds anyway."""
    owner = next(above for above in kind.__mro__ if "__eq__" in vars(above))
    equals, params = vars(owner)["__eq__"], vars(owner).get("__dataclass_params__")
    return (
        getattr(params, "eq", False) is True
        and isinstance(equals, FunctionType)
        and equals.__code__.co_filename == "<string>"
    )


def _read_in_python(kind: type) -> bool:
    equals: Any = kind.__eq__
    if (equals is not object.__eq__ and not _dataclass_equal(kind)) or kind.__mro__[
        -1
    ] is not object:
        return False
    for above in kind.__mro__[:-1]:
        if not above.__flags__ & _HEAPTYPE or above.__itemsize__:
            return False
        space = vars(above)
        if any(s not in ("__dict__", "__weakref__") for s in _slots(space.get("__slots__", ()))):
            return False
        for name, member in list(space.items()):
            if isinstance(member, _C_MEMBERS):
                return False
            if isinstance(member, GetSetDescriptorType) and name not in ("__dict__", "__weakref__"):
                return False
            if name == "__dict__" and not isinstance(member, GetSetDescriptorType):
                return False
            if isinstance(member, MemberDescriptorType):
                return False
    return True


def _slots(declared: Any) -> tuple[str, ...]:
    return (declared,) if isinstance(declared, str) else tuple(declared)


_TORCH_OWN = frozenset(
    {
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_is_full_backward_hook",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)
"""What torch keeps on every module for itself: when it holds nothing (no weight, buffer
nor hook), it says nothing of what the module is, and is left out of its name, so that a
torch upgrade that keeps another such table does not rename every module."""


def _torch_named(attributes: dict[str, Any]) -> dict[str, Any]:
    """What of a torch module's attributes names it: all but :data:`_TORCH_OWN`, which must
    hold nothing — a weight or a buffer (a tensor, named by no value) or a hook (which runs
    around its forward) makes it no module named by what it holds."""
    for name in _TORCH_OWN.intersection(attributes):
        held = attributes[name]
        if name in ("_parameters", "_buffers"):
            if not isinstance(held, dict) or any(v is not None for v in held.values()):
                raise _Unnamed
        elif held and name != "_non_persistent_buffers_set":
            raise _Unnamed
    if any(attributes[a] for a in attributes if "hook" in a and a not in _TORCH_OWN):
        raise _Unnamed  # another table of hooks, of another version of torch
    return {a: v for a, v in attributes.items() if a not in _TORCH_OWN}


def _torch_module(kind: type) -> bool:
    """Whether ``kind`` is a torch module's class (torch itself is not imported here)."""
    return any(
        above.__module__ == "torch.nn.modules.module" and above.__qualname__ == "Module"
        for above in kind.__mro__
    )


class CodeWatch(NamedTuple):
    """What :func:`fingerprint_of` read of classes, laid out for one look at every forward
    (:func:`watch_code`): ``lives`` compared with ``copies`` in one comparison made in C."""

    lives: list[Any]
    """The namespace of each class of ``kinds``, then each dict, list or set read of an
    object named by what it holds (:func:`_held_bytes`), each dict of keyword defaults of
    a function of theirs and of keywords of a partial they hold, and last the count of code
    set in place (:data:`_SETS`)."""
    copies: list[Any]
    """A copy of each of ``lives``, taken with the watch."""
    kinds: list[type]
    """The classes whose namespaces lead ``lives``."""
    given: tuple[type, ...]
    """The classes the watch was taken of."""
    labels: list[str]
    """``Kind.name`` of what holds each of ``lives`` after the namespaces, but the last."""
    made: list[tuple[str, FunctionType, Any, Any, Any]]
    """Each function of the classes' namespaces, by ``Kind.name``, with its code and its
    defaults when the watch was taken."""
    mros: list[tuple[type, tuple[type, ...]]]
    """Each class of ``kinds`` with the classes it inherited from then (``__mro__``)."""
    marks: list[Mark]
    """Each object marked by which object it is (:func:`_token_of`) that the classes hold or
    their functions close over, with what is noted of it (:class:`_Marked`), whose version
    and state lie in ``lives`` at ``at``: changed since, it is given a new mark
    (:func:`marks_moved`)."""


class Mark(NamedTuple):
    """An object marked by which object it is, or a container holding objects a class holds
    (:func:`_contained_bytes`), as a watch (:class:`CodeWatch`) notes it."""

    at: int
    """Where its version, then what is read of it, lie in the watch's lives."""
    held: Any
    """The object."""
    noted: _Marked
    """What is noted of it, shared by every watch of it."""
    anew: bool
    """Whether it was given a new mark as the watch was taken (:func:`_marked`)."""
    kind: type
    """The class that holds it, or whose functions close over it."""


class _Marked:
    """What is noted of an object marked by which object it is, shared by every graph's
    watch of it: its mark now (``version``, a list a watch copies: a new mark seen by one
    graph is seen by all), each dict, list and set read of it (:func:`_state_read`) with a
    copy of each — one copy for all, so that what a node's code changes as it runs is its
    state for every graph (:func:`state_taken`) —, its class and the functions read of it,
    with their code and defaults."""

    __slots__ = ("__weakref__", "copies", "kind", "label", "lives", "made", "version")

    def __init__(self, held: Any, label: str) -> None:
        self.label = label  # ``Kind.name`` of what first held it, to tell the user
        self.version = [_version_of(held)]
        self.lives: list[Any] = []
        self.copies: list[Any] = []
        self.read(held)

    def read(self, held: Any, whole: bool = True) -> None:
        """Reads ``held`` again, in place; with ``whole``, its class and functions too. One
        holding more than a watch reads is read with an :class:`_Unseen` last, so it is
        taken as changed at every look."""
        state, made, read_all = _state_read(held)
        self.lives[:] = state
        self.copies[:] = map(_copied, state)
        if not read_all:
            self.lives.append(_Unseen())
            self.copies.append(_Unseen())
            _too_large(self.label)
        if whole:
            self.kind, self.made = type(held), made

    def changed(self, held: Any) -> bool:
        """Whether ``held`` changed since it was read: its state, its class, its functions."""
        if type(held) is not self.kind:
            return True
        if any(f.__code__ is not c or f.__defaults__ is not d for f, c, d in self.made):
            return True
        return self.state_changed()

    def state_changed(self) -> bool:
        """Whether a dict, list, set or slot read of it holds other values since."""
        try:
            return not bool(self.lives == self.copies)
        except Exception:  # a value replaced whose `==` says no bool (an array)
            return True


_TOLD: set[str] = set()
"""``Kind.name`` of each object a warning said was too large to watch (:func:`_too_large`)."""


def _too_large(label: str) -> None:
    """Tells the user, once in the process, that ``label`` (``Kind.name``) holds more than a
    watch reads: it is taken as changed at every forward, so nothing computed with it is
    recalled — silently, caching would seem to work and never would."""
    if label in _TOLD:
        return
    _TOLD.add(label)
    warnings.warn(
        f"`{label}` holds more than {_STATE_ITEMS} entries, more than a graph compares at "
        "every forward: it is taken as changed at every forward, so a node of that class "
        "computes anew each time (or recalls as drifted) and keeps nothing; hold it on the "
        "node's instance (set in `__init__` from its arguments) or pass it as an input "
        "instead",
        SomatizeWarning,
        stacklevel=2,
    )


class _Unseen:
    """Stands for what a watch left unread of an object marked by which object it is (more
    than :data:`_STATE_ITEMS` entries): equal to nothing, so the object is taken as changed
    at every look, and given a new mark — what was computed with it is never recalled as
    computed with what it holds now, which no look compared."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


_MARKED: dict[int, tuple[Callable[[], Any], weakref.ref[_Marked], list[Any] | None]] = {}
"""An object marked by which object it is and watched, by its address → a weak reference to
it (a :class:`_Kept` where it cannot be referenced weakly, which its mark keeps alive
anyway) and to what is noted of it (:class:`_Marked`), which the graphs' watches hold: what
is read of an object (its ``__dict__``, which may hold a method bound to it) never keeps it
alive once no graph watches it. For a table first seen as its text writes it
(:func:`_sighted`), also the copies of what was read of it, kept as no graph watches it, to
tell whether it changed meanwhile."""


def _marked(held: Any, label: str, table: bool = False) -> tuple[_Marked, bool]:
    """What is noted of ``held``, an object marked by which object it is, noted now if it was
    not, and whether it was given a new mark for it: it was watched before, by graphs gone
    since, and may have changed unseen since — a ``table`` (:func:`_sighted`), only where
    it holds other values than when it was last noted."""
    found = _MARKED.get(id(held))
    again = found is not None and found[0]() is held
    left = None
    if found is not None and again:
        noted = found[1]()
        if noted is not None:
            return noted, False
        left = found[2]
    else:
        _token_of(held)  # marked, if it was not yet
    made = _Marked(held, label)
    anew = again and not (left is not None and _same_values(made.lives, left))
    if anew:
        _moved_on(held)
        made.version[0] = _version_of(held)
    forget = functools.partial(_forget_held, id(held), held=_MARKED)
    _MARKED[id(held)] = (
        _reference(held, forget),
        weakref.ref(made),
        made.copies if table else None,
    )
    return made, anew


def _same_values(lives: list[Any], copies: list[Any]) -> bool:
    """Whether what is read of an object now holds what ``copies`` held when last noted."""
    try:
        return bool(lives == copies)
    except Exception:  # a value whose `==` says no bool (an array)
        return False


_CODE_SETS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__bases__", "__class__"})
_SETS = [0]
"""How many times, in this process, a function was given other code or defaults in place
(``f.__code__ = ...``, ``f.__defaults__ = ...``, ``f.__kwdefaults__ = ...``), a class
other bases (``Kind.__bases__ = ...``) or an object another class (``obj.__class__ =
Other``): counted by an audit hook (:func:`_heard`), each of
them being an ``object.__setattr__`` audit event, so that a watch sees them at the cost
of one more number compared."""
_HEARING: list[bool | None] = [None]
"""Whether :data:`_SETS` counts (None: no hook added yet; False: the process refused it)."""


def _heard(
    event: str, args: tuple[Any, ...], sets: list[int] = _SETS, names: frozenset[str] = _CODE_SETS
) -> None:
    """Counts in :data:`_SETS` the audit events that set code or bases in place. Reads no
    global (it is called to the end of the process) and raises nothing."""
    if event == "object.__setattr__":
        try:
            if args[1] in names:
                sets[0] += 1
        except Exception:  # an event of another shape: not one of them
            pass


def _hear_code_set() -> None:
    """Adds :func:`_heard` to the process's audit hooks, once, and notes whether it counts
    (a hook added before may refuse hooks added after)."""
    if _HEARING[0] is not None:
        return
    _HEARING[0] = False
    sys.addaudithook(_heard)
    before = _SETS[0]

    def probe() -> None:
        pass

    probe.__defaults__ = ()
    _HEARING[0] = _SETS[0] != before


def watch_code(kinds: Iterable[type]) -> CodeWatch:
    """What the fingerprints of ``kinds`` were worked out from, laid out so that a change
    is found in one comparison made in C: the namespace of each class of their lineages
    (as :func:`fingerprint_of` takes them) and a copy of it, which differ once a method
    is patched in, a base class's replaced, or one added or deleted; each dict, list or
    set read of an object a class holds (itself, or in a dict, list, tuple or set:
    :func:`_contained_bytes`, which are read too), or its functions close over, named by what it
    holds (:func:`_held_bytes`: an attribute of it set in place, ``Kind.act.k = 3``), the
    mark and what is read of each such object marked by which object it is instead
    (:class:`_Marked`: changed since, it is marked anew, :func:`marks_moved`), and
    each dict of keyword defaults of their functions (``f.__kwdefaults__["by"] = 7``), and
    of keywords of a partial they hold (``Kind.act.keywords["k"] = 3``), with a copy of
    it; the names of their modules their fingerprints looked up, each to the object it
    held (:class:`_Looked`: a helper or a value rebound since, a notebook's cell run
    again); and the count of functions given other code or defaults in place
    and classes given other bases, in this process (:data:`_SETS`: ``f.__code__ = ...``,
    as a reloader does, ``f.__defaults__ = (5,)``, ``Kind.__bases__ = ...``), which moves
    for any function or class, and sends the look to what the watch noted of these
    (:func:`code_changes`). The lives compare equal to the copies: each value by
    identity, else by ``==``, so a value replaced by an equal one, ``2`` by ``2.0``, is not
    seen; one whose ``==`` says no bool, an array, raises, and is taken as changed. The
    copies hold what they copy, so an old function cannot be followed by a new one at
    the same address."""
    _hear_code_set()
    given = tuple(kinds)
    lineage = list(
        dict.fromkeys(above for kind in given for above in _ancestry(kind) if not _left_out(above))
    )
    lives: list[Any] = [vars(kind) for kind in lineage]
    filled, by_forward = _fillers(lineage)
    kept = (
        by_forward
        - filled
        - _state_of(lineage, (m for k in lineage for m in list(vars(k).values())))
    )
    labels: list[str] = []
    made: list[tuple[str, FunctionType, Any, Any, Any]] = []
    marks: list[Mark] = []
    for kind in lineage:
        for name, member in list(vars(kind).items()):
            label = f"{kind.__qualname__}.{name}"
            read: list[Any] = []
            unnamed: list[Any] = []
            holds = _held_in(member)
            if not holds and _table(name, member) and name in kept:
                # filled by its node's forward: marked from the start, as first seen
                _sighted(member, _assignment(_class_body(kind), name), label)
                noted, anew = _marked(member, label, table=True)
                marks.append(Mark(len(lives), member, noted, anew, kind))
                lives += [noted.version, noted.lives]
                labels += [label, label]
            elif not holds and _table(name, member) and name not in filled:
                holds = [member]
            for function in _functions_in(member):  # `def forward(self, x, ctx, memo={})`
                holds += _default_tables(name, function)
            for held in holds:
                if _contained_bytes(held, read, unnamed) is not None:
                    # a container holding objects: each watched as one held itself, and
                    # the container as a marked object is, so what its node's forward
                    # changes in it (an object added to a log) is its state
                    noted = _Marked(held, label)
                    marks.append(Mark(len(lives), held, noted, False, kind))
                    lives += [noted.version, noted.lives]
                    labels += [label, label]
                elif _held_bytes(held, read) is None:
                    unnamed.append(held)
            lives += read
            labels += [label] * len(read)
            for held in unnamed:  # marked: what it holds watched
                noted, anew = _marked(held, label)
                marks.append(Mark(len(lives), held, noted, anew, kind))
                lives += [noted.version, noted.lives]
                labels += [label, label]
            for function in _functions_in(member):
                keywords = function.__kwdefaults__
                made.append((label, function, function.__code__, function.__defaults__, keywords))
                if keywords:
                    lives.append(keywords)
                    labels.append(label)
            for keywords in _partial_keywords(member):  # `Kind.act.keywords["k"] = 3`
                lives.append(keywords)
                labels.append(label)
    tables: set[int] = set()
    for kind in lineage:  # each table its code only reads, object of a helper class: marked
        found = _FINGERPRINTS.get(kind)
        for reads, name, was in found[1] if found is not None else ():
            by = reads()
            if not isinstance(was, _HeldSeen) or by is None:
                continue
            table = _space_of(by).get(name, _ABSENT)
            if id(table) in tables:
                continue
            if table is not was.held:  # rebound since: as first seen, as a graph built now
                if type(table) not in _CONTAINERS or not _plain_table(table):
                    continue  # an object of a helper class: seen rebound (:class:`_Looked`)
                module = was.label.partition(":")[0]
                text = _assignment(*_written_at(module, name, table))
                _sighted(table, text, was.label)
            tables.add(id(table))
            noted, anew = _marked(table, was.label, table=True)
            marks.append(Mark(len(lives), table, noted, anew, kind))
            lives += [noted.version, noted.lives]
            labels += [was.label, was.label]
    looked = _Looked(lineage)
    if looked.names:  # a helper or a value of their modules rebound (a cell run again)
        lives.append(looked)
        labels.append("")
    copies = list(map(_copied, lives))
    for mark in marks:  # one copy of what is read of it for all
        copies[mark.at + 1] = mark.noted.copies
        if mark.anew:  # marked anew as it is watched: the next look works fingerprints out
            copies[mark.at] = [None]
    lives.append(_SETS)
    copies.append(list(_SETS))
    mros = [(kind, kind.__mro__) for kind in lineage]
    return CodeWatch(lives, copies, lineage, given, labels, made, mros, marks)


def _copied(live: Any) -> Any:
    """A copy of a dict, list or set, or of a class's namespace (a mappingproxy), as a dict;
    of an object's slots (:class:`_Slots`) or of names of modules (:class:`_Looked`), a list
    of what they hold."""
    if isinstance(live, (_Slots, _Looked)):
        return live.values()
    return dict(live) if isinstance(live, MappingProxyType) else type(live)(live)


_EMPTY = object()
"""What an empty slot is read as (:class:`_Slots`)."""


_ABSENTS = itertools.repeat(_ABSENT)


class _Looked:
    """The names of their modules the fingerprints of classes looked up (:data:`Looked`),
    read as they are now: equal to a list of what they held, each the same object — so
    that a helper or a value rebound since (a notebook's cell run again) is seen by a
    graph built before, whose fingerprints are worked out again."""

    __slots__ = ("names", "spaces")

    def __init__(self, lineage: Iterable[type]) -> None:
        places: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}
        for kind in lineage:
            found = _FINGERPRINTS.get(kind)
            for reads, name, _ in found[1] if found is not None else ():
                by = reads()
                if by is not None:
                    space = _space_of(by)
                    places.setdefault((id(space), name), (space, name))
        self.spaces = [space for space, _ in places.values()]
        self.names = [name for _, name in places.values()]

    def values(self) -> list[Any]:
        """What each name holds now (:data:`_ABSENT` where it holds nothing)."""
        return list(map(dict.get, self.spaces, self.names, _ABSENTS))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is list
            and len(other) == len(self.names)
            and all(map(operator.is_, map(dict.get, self.spaces, self.names, _ABSENTS), other))
        )

    __hash__ = None  # type: ignore[assignment]


class _Slots:
    """The slots of an object, read as it is now: equal to a list of what they held."""

    __slots__ = ("held", "slots")

    def __init__(self, held: Any, slots: list[MemberDescriptorType]) -> None:
        self.held = held
        self.slots = slots

    def __len__(self) -> int:
        return len(self.slots)

    def values(self) -> list[Any]:
        """What each slot holds now (:data:`_EMPTY` where it holds nothing)."""
        found = []
        for slot in self.slots:
            try:
                found.append(slot.__get__(self.held, type(self.held)))
            except AttributeError:
                found.append(_EMPTY)
        return found

    def __eq__(self, other: object) -> bool:
        return bool(self.values() == other)

    __hash__ = None  # type: ignore[assignment]


def _slots_of(kind: type) -> list[MemberDescriptorType]:
    """The slots the instances of ``kind`` have, from each class it inherits from short of
    the library's (:func:`_left_out`)."""
    return [
        member
        for above in kind.__mro__
        if not _left_out(above)
        for member in list(vars(above).values())
        if isinstance(member, MemberDescriptorType) and member.__objclass__ is above
    ]


def _state_read(
    held: Any,
) -> tuple[list[Any], tuple[tuple[FunctionType, Any, Any], ...], bool]:
    """What a watch reads of ``held``, an object marked by which object it is: each dict,
    list and set it holds, or holds through what it holds (an object's ``__dict__`` and
    its slots, :class:`_Slots`; a function's closure and keyword defaults, a bound
    method's object, a partial's arguments), and the namespaces of the classes of the
    objects read (short of the library's), nearest first, as far as :data:`_STATE_ITEMS`
    entries in all; each function read, with its code and defaults; and whether all was
    read (False where a dict, list or set did not fit: it is left out, and what it holds,
    and the object is taken as changed at every look). What a class written in C holds
    but its ``__dict__`` (a tensor's values) is not read."""
    read: list[Any] = []
    functions: list[tuple[FunctionType, Any, Any]] = []
    seen: set[int] = set()
    kinds: dict[type, list[MemberDescriptorType]] = {}  # each class read → its slots
    left = _STATE_ITEMS
    read_all = True
    queue = collections.deque([held])

    def see(container: Any, kept: bool = True) -> bool:
        """Reads ``container`` (to compare with ``kept``) where it fits in what is left to
        read; else not (a cache grown large would be compared whole at every forward),
        and the object is not all read."""
        nonlocal left, read_all
        if len(container) >= left:
            read_all = False
            return False
        if kept:
            read.append(container)
        left -= len(container) + 1
        return True

    while queue:  # what is queued was let in by `see`, within the bound
        value = queue.popleft()
        if _exactly_plain(value) or id(value) in seen:
            continue
        seen.add(id(value))
        kind = type(value)
        if isinstance(value, (type, ModuleType, BuiltinFunctionType)):
            continue
        if kind in _CONTAINERS:
            if see(value, kind is not tuple and kind is not frozenset):
                queue += list(value.values()) if isinstance(value, dict) else list(value)
            continue
        if isinstance(value, FunctionType):
            functions.append((value, value.__code__, value.__defaults__))
            queue += _closed_objects(value)
            if value.__kwdefaults__:
                queue.append(value.__kwdefaults__)
            continue
        if isinstance(value, (staticmethod, classmethod)):
            queue.append(value.__func__)
        elif isinstance(value, MethodType):
            queue += [value.__func__, value.__self__]
        elif kind is functools.partial:
            queue += [value.func, value.args, value.keywords]
        if kind not in kinds:
            kinds[kind] = _slots_of(kind)
            for above in kind.__mro__:
                if not _left_out(above):
                    see(vars(above))
        slots = kinds[kind]
        if slots and see(live := _Slots(value, slots)):  # what it holds in slots
            queue += live.values()
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except Exception:  # none, or one that cannot be read: what it holds is not read
            continue
        if type(attributes) is dict and see(attributes):
            queue += list(attributes.values())
    return read, tuple(functions), read_all


def marks_moved(marks: Iterable[Mark]) -> None:
    """Gives each object of ``marks`` (:attr:`CodeWatch.marks`) a new mark where it changed
    since it was read (:class:`_Marked`): what it holds set in place (``Kind.act.k = 4``),
    a hook put on it, its class replaced (``obj.__class__ = Other``), or a function it
    holds given other code or defaults — so its fingerprint is another from then on, for
    every graph."""
    for mark in marks:
        noted = mark.noted
        if noted.changed(mark.held):
            _moved_on(mark.held)
            noted.version[0] = _version_of(mark.held)
            noted.read(mark.held)


def state_taken(marks: Iterable[Mark]) -> None:
    """Takes what changed in the objects of ``marks`` (:attr:`CodeWatch.marks`) since they
    were read (a count, a cache they keep as they run) as their state, not a change of
    them: called as their node's forward returns, so that what the node's own code changes
    as it runs does not give them a new mark (:func:`marks_moved`) at the next forward, of
    this graph or another. Their class replaced, or a function given other code, is not
    taken so."""
    for mark in marks:
        if mark.noted.state_changed():
            mark.noted.read(mark.held, whole=False)


@contextlib.contextmanager
def own_state(watch: CodeWatch, kinds: Iterable[type]) -> Iterator[None]:
    """Runs what is inside as a forward of a node of ``kinds``, on whatever thread: each
    object marked by which object it is that they, or the classes they inherit from, hold
    (of ``watch``) is given a new mark first where it changed since it was read (by a
    watcher, by a node run before), and what changes in it meanwhile is taken as its state
    (:func:`state_taken`). What another node's forward changes in it is not: it gives it
    a new mark at the next look, as a change made between forwards does."""
    lineage = {above for kind in kinds for above in _ancestry(kind)} if watch.marks else ()
    marks = [mark for mark in watch.marks if mark.kind in lineage]
    if marks:
        marks_moved(marks)
    try:
        yield
    finally:
        if marks:
            state_taken(marks)


def _held_in(member: Any) -> list[Any]:
    """The objects a class attribute holds that its fingerprint may name by what they hold
    (:func:`_held_bytes`): itself, when it is no function, else what its functions close
    over."""
    functions = _functions_in(member)
    if not functions:  # not named here just to learn it runs code: the caller names it
        runner = None if _plain(member) else _runner(member)
        return [] if runner is None else [runner]
    held = [held for function in functions for held in _closed_objects(function)]
    return held + _bound_objects(member)


def code_changes(watch: CodeWatch) -> list[str]:
    """What changed in the classes ``watch`` (:func:`watch_code`) holds since it was taken,
    that a fingerprint reads: ``Kind.name`` for each name set, added or deleted — not a
    dunder that holds no function (``__slotnames__``, which a copy of an instance adds,
    ``__annotations__``, which reading it adds), nor a plain value, set, added or deleted,
    that the code of the classes sets on one of them as it runs (``type(self).calls += 1``
    in a subclass, the counter declared on its base: their state) — for each object it
    holds named by what it holds, changed in place, and for each function given other
    code or defaults in place; ``Kind.__bases__`` for a class given other bases."""
    changed = []
    stored: frozenset[str] | None = None
    kinds = watch.kinds
    spaces, copies = watch.lives[: len(kinds)], watch.copies[: len(kinds)]
    for space, copied, kind in zip(spaces, copies, kinds, strict=True):
        for name in dict.fromkeys([*space, *copied]):
            now, was = space.get(name, _ABSENT), copied.get(name, _ABSENT)
            if now is was or (not _holds_code(now) and not _holds_code(was) and _dunder(name)):
                continue
            if (now is _ABSENT or _plain(now)) and (was is _ABSENT or _plain(was)):
                if stored is None:  # what the classes' own code sets on one of them: state
                    stored = _state_of(kinds, (m for c in copies for m in c.values()))
                if name in stored:
                    continue
            changed.append(f"{kind.__qualname__}.{name}")
    extra = zip(
        watch.lives[len(kinds) : -1], watch.copies[len(kinds) : -1], watch.labels, strict=True
    )
    for live, copied, label in extra:
        if isinstance(live, _Looked):  # worked out again: not said, as it may be the same
            continue
        try:
            same = bool(live == copied)
        except Exception:  # a value replaced whose `==` says no bool (an array)
            same = False
        if not same and label not in changed:
            changed.append(label)
    for label, function, code, defaults, keywords in watch.made:
        if (
            function.__code__ is not code
            or function.__defaults__ is not defaults
            or function.__kwdefaults__ is not keywords
        ) and label not in changed:
            changed.append(label)
    changed += (
        f"{kind.__qualname__}.__bases__" for kind, mro in watch.mros if kind.__mro__ is not mro
    )
    return changed


def watched_again(watch: CodeWatch) -> CodeWatch:
    """``watch`` (:func:`watch_code`) taken again of the same classes, as they are now."""
    return watch_code(watch.given)


def _holds_code(member: Any) -> bool:
    return member is not _ABSENT and bool(_functions_in(member))


def _still(reader: weakref.ref[Any], name: str, was: Any) -> bool:
    """Whether ``name``, in the namespace of the function (or module) ``reader``, holds what
    a fingerprint found there (:data:`Looked`); False once that function is gone."""
    function = reader()
    if function is None:
        return False
    now = _space_of(function).get(name, _ABSENT)
    if isinstance(was, weakref.ref):
        held = was()
        return held is not None and now is held
    if isinstance(was, _Same):  # the same object (of a helper class)
        return now is was.held
    if isinstance(was, _HeldSeen):  # the same table or object, not changed since
        return now is was.held and _version_of(now) == was.version
    if isinstance(was, _ClassSeen):  # the same helper class, written as it was
        return isinstance(now, type) and now is was.held() and _class_code(now) == was.code
    if was is _OTHER:
        module = function.__name__ if isinstance(function, ModuleType) else function.__module__
        return now is not _ABSENT and _found_as(now, module, name) is _OTHER
    return now is was


def _put(digest: Any, *pieces: bytes) -> None:
    for piece in pieces:
        digest.update(len(piece).to_bytes(8, "little") + piece)


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _plain(value: Any) -> bool:
    """Whether ``value`` is a plain constant: None, a number, a string, bytes, or a tuple
    or frozenset of them."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_plain(member) for member in value)
    return False


_PLAIN_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes})


def _exactly_plain(value: Any) -> bool:
    """Whether ``value`` is a plain constant (:func:`_plain`) of those very types, none of
    a subclass (an ``int`` with methods, a namedtuple) whose code :func:`_constant_bytes`
    does not name."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return True
    return (kind is tuple or kind is frozenset) and all(map(_exactly_plain, value))


def _functions_in(member: Any) -> list[FunctionType]:
    """The plain functions a class attribute runs: itself, what a static or class method,
    a property or a cached property holds, each unwrapped from a decorator that says what
    it wraps (``functools.wraps``), or a partial (``functools.partial``, ``partialmethod``)
    made of (:func:`_bound_in` says the arguments it binds)."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    while isinstance(member, _PARTIALS):
        member = member.func
    if isinstance(member, functools.cached_property):
        member = member.func
    held = [member.fget, member.fset, member.fdel] if isinstance(member, property) else [member]
    out: list[FunctionType] = []
    for function in held:
        # a decorator that wraps itself (ValueError), or an object whose own __getattr__
        # raises what hasattr does not take for "no such attribute": left as it is
        with contextlib.suppress(Exception):
            function = inspect.unwrap(function) if function is not None else None
        if isinstance(function, FunctionType):
            out.append(function)
    return out


_PARTIALS = (functools.partial, functools.partialmethod)


def _bound_in(member: Any) -> list[bytes]:
    """The arguments a partial held by a class (as :func:`_functions_in` finds it) binds, the
    partial's own first: a plain value by what it is, an object as one a method closes over
    is named (:func:`_cell_bytes`: by what it holds, else by a mark of that very object), so
    that a partial bound to another object, or to one changed in place, is not taken for
    the first."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    bound = []
    while isinstance(member, _PARTIALS):
        bound.append(b"partial")
        bound += map(_argument_bytes, member.args)
        bound += (
            n.encode() + b"\0" + _argument_bytes(v) for n, v in sorted(member.keywords.items())
        )
        member = member.func
    return bound


def _partial_keywords(member: Any) -> list[dict[str, Any]]:
    """The dict of keywords of each partial a class attribute is made of (:func:`_bound_in`),
    for a watch to see one set in place (``Kind.act.keywords["k"] = 3``); none for any
    other attribute."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    found = []
    while isinstance(member, _PARTIALS):
        if type(member.keywords) is dict:
            found.append(member.keywords)
        member = member.func
    return found


def _argument_bytes(value: Any) -> bytes:
    """An argument a partial binds (:func:`_bound_in`), named as a cell a function closes
    over is (:func:`_cell_bytes`); an object of the library's (:func:`_library_object`) by
    its type."""
    if _library_object(value):
        return _value_bytes(value)
    cell = CellType(value)
    return _cell_bytes("", cell, frozenset())


def _library_object(value: Any) -> bool:
    """Whether ``value``, bound by a partial or taken by default, is an object of a class of
    the standard library's or another the fingerprints leave out (:func:`_left_out`:
    ``os.environ``, a lock, a bare ``object()`` sentinel, a logger): named by its type, the
    same in every process whatever it holds, and not watched — a mark of that very object
    would have every new process, and every worker, take the code for other code."""
    if _plain(value) or type(value) in _CONTAINERS:
        return False
    if isinstance(value, (FunctionType, MethodType, type, ModuleType, *_PARTIALS)):
        return False
    return _left_out(type(value)) and not hasattr(value, "__wrapped__")  # lru_cache's


def _bound_objects(member: Any) -> list[Any]:
    """The objects a partial held by a class binds (:func:`_bound_in`), that a watch reads
    as it reads what a function closes over: no plain value, function, class, module nor
    object of the library's (:func:`_library_object`)."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    found: list[Any] = []
    while isinstance(member, _PARTIALS):
        for value in (*member.args, *member.keywords.values()):
            if not (
                _exactly_plain(value)
                or isinstance(value, (FunctionType, type, ModuleType))
                or _library_object(value)
            ):
                found.append(value)
        member = member.func
    return found


def _function_bytes(function: FunctionType, within: frozenset[int] = frozenset()) -> bytes:
    """How ``function`` is written: its source where the source found compiles to its
    code (the file may have been edited since it was loaded), else its code (digested
    alike in every process running the Python version), its default values, and what it
    closes over (:func:`_cell_bytes`; ``within``: the functions being digested around it,
    which one that closes over itself names)."""
    made_of = _made_of(function)
    found = _FUNCTIONS.get(function)
    if found is not None and found[0] == made_of:
        return found[1]
    source = _source_of(function)
    digest = hashlib.sha256()
    if source is not None:
        _put(digest, b"source", source)
    else:
        _put(digest, b"code", _code_bytes(function.__code__))
    defaults = function.__defaults__ or ()
    kwdefaults = sorted((function.__kwdefaults__ or {}).items())
    _put(digest, b"defaults", *map(_default_bytes, defaults))
    _put(digest, b"keywords", *(n.encode() + b"\0" + _default_bytes(v) for n, v in kwdefaults))
    if function.__closure__:
        within |= {id(function)}
        cells = zip(function.__code__.co_freevars, function.__closure__, strict=False)
        _put(
            digest,
            b"closes",
            *(n.encode() + b"\0" + _cell_bytes(n, c, within) for n, c in cells),
        )
    written = digest.digest()
    _FUNCTIONS[function] = (made_of, written)
    return written


def _made_of(function: FunctionType) -> tuple[Any, ...]:
    """What of ``function`` its digest is worked out from, to tell it changed since: its code
    and its defaults, each by identity (a default replaced in place, ``f.__defaults__ =
    (50,)`` or ``f.__kwdefaults__["by"] = 70``, is told apart), and each object it closes
    over that is named by what it holds (:func:`_held_bytes`) by that name, else by
    identity (one changed in place since it was named is marked from then on)."""
    keywords = function.__kwdefaults__ or {}
    held = tuple(
        _held_bytes(value) or _contained_bytes(value) or (_Same(value), _version_of(value))
        for value in _closed_objects(function)
    )
    return (
        _Same(function.__code__),
        _Same(function.__defaults__),
        tuple((name, _Same(value)) for name, value in keywords.items()),
        held,
    )


def _closed_objects(function: FunctionType) -> list[Any]:
    """The objects ``function`` closes over, or takes as defaults, that :func:`_cell_bytes`
    may name by what they hold: no plain value, function, class nor module."""
    found = []
    for cell in function.__closure__ or ():
        with contextlib.suppress(ValueError):  # not filled yet
            value = cell.cell_contents
            if _exactly_plain(value) or isinstance(value, (FunctionType, type, ModuleType)):
                continue
            found.append(value)
    defaults = (*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values())
    found += filter(_default_object, defaults)
    return found


def _default_object(value: Any) -> bool:
    """Whether ``value``, a default of a function, is an object named as one the function
    closes over (:func:`_default_bytes`): no plain value, function, class nor module, and
    no dict, list or set (a constructor's default argument, which the node's declaration
    follows)."""
    if _plain(value) or type(value) in _CONTAINERS or _library_object(value):
        return False
    return not isinstance(value, (FunctionType, type, ModuleType))


_CONSTRUCTORS = frozenset({"__init__", "__new__"})
"""The methods whose default arguments a node's declaration follows, not its code."""


def _default_tables(name: str, function: FunctionType) -> list[Any]:
    """Each dict, list, set or tuple holding more than plain values that ``function``, held
    by a class under ``name``, takes by default (``def forward(self, x, ctx, opts={"k": 2})``,
    ``by={"k": 2}``): named by what it holds in the class's fingerprint
    (:func:`_default_table_bytes`) and watched as a table the class holds is, so that one
    changed in place between forwards is seen. None for a constructor
    (:data:`_CONSTRUCTORS`), whose defaults are followed by the declaration of a node built
    with them, nor for one the function's own code changes in place (``memo[x] = ...``,
    ``memo.setdefault(x, y)``: a cache, the memo-default idiom), its state: taken as its
    text writes it, the same in every process, and not watched."""
    if name in _CONSTRUCTORS:
        return []
    code, defaults = function.__code__, function.__defaults__ or ()
    positional = code.co_varnames[: code.co_argcount]
    given = list(zip(positional[len(positional) - len(defaults) :], defaults, strict=False))
    given += (function.__kwdefaults__ or {}).items()
    tables = [(n, v) for n, v in given if type(v) in _CONTAINERS and not _plain(v)]
    if not tables:
        return []
    filled = _tables_changed_by(code, {n for n, _ in tables}, _LOCAL_LOADS)
    return [value for n, value in tables if n not in filled]


_LOCAL_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_DEREF")
"""How a function's code reads one of its arguments, or a function nested in it the same."""

_GLOBAL_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")
"""How a function's code reads a name of its module."""


def _default_table_bytes(value: Any) -> bytes:
    """A table a method takes by default (:func:`_default_tables`), named as one a class
    holds is: by what it holds, the same in every process that makes it alike, or once
    changed in place since, by a mark of that very object."""
    return _held_bytes(value) or _contained_bytes(value) or _token_of(value)


def _table_now(value: Any) -> Any:
    """What a fingerprint's digest of a table a method takes by default was worked out from
    (:func:`_default_table_bytes`), to tell that it changed since: by what it holds, else by
    which object it is and its mark."""
    return _held_bytes(value) or _contained_bytes(value) or (_Same(value), _version_of(value))


def _default_bytes(value: Any) -> bytes:
    """A default value of a function: an object (:func:`_default_object`) as one the
    function closes over (:func:`_cell_bytes`), so that one changed in place is seen; any
    other by :func:`_value_bytes`."""
    return _argument_bytes(value) if _default_object(value) else _value_bytes(value)


def _cell_bytes(name: str, cell: Any, within: frozenset[int]) -> bytes:
    """What a function closes over, in the cell of its free variable ``name``: a plain
    value by what it is, a function by :func:`_function_bytes`, the class a method calling
    ``super()`` was defined in (``__class__``) by its name, another class by its name where
    that leads back to it, an object whose state is all named by what it is by that
    (:func:`_held_bytes`), a container holding objects by what it holds
    (:func:`_contained_bytes`), else by a mark of that very object (:func:`_token_of`), so that
    a function closing over another object is never taken for one closing over the
    first."""
    try:
        value = cell.cell_contents
    except ValueError:  # not filled yet
        return b"empty"
    if _exactly_plain(value):
        return _constant_bytes(value)
    if isinstance(value, FunctionType):
        if id(value) in within:
            return b"itself"
        return b"function " + _function_bytes(value, within)
    if isinstance(value, type) and name == "__class__":  # the class the code is written in
        return f"class {value.__module__}:{value.__qualname__}".encode()
    if isinstance(value, type) and identity_of(value) is not None:
        return f"class {identity_of(value)}".encode()
    if isinstance(value, ModuleType):
        return f"module {value.__name__}".encode()
    if isinstance(value, BuiltinFunctionType) and (builtin := _builtin_bytes(value)):
        return builtin
    return _held_bytes(value) or _contained_bytes(value) or _token_of(value)


def _value_bytes(value: Any) -> bytes:
    """A value as the same bytes in every process: a plain one by what it is, any other
    by its type."""
    if _plain(value):
        return _constant_bytes(value)
    kind = type(value)
    return f"a {kind.__module__}:{kind.__qualname__}".encode()


def _code_bytes(code: CodeType) -> bytes:
    """:func:`code_digest`, and how the code is called: its arguments and flags."""
    shape = (
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_varnames,
    )
    return code_digest(code) + repr(shape).encode()


def _source_of(function: FunctionType) -> bytes | None:
    """The source of ``function`` as its file reads now, when the file, compiled now, makes
    the code the function runs at the same line — None when it does not (the file was
    edited since it was loaded, another definition is found there) or cannot be found (a
    function typed into an interpreter). The whole file is compiled, since how a line
    compiles depends on what is around it (its class, its module's imports)."""
    code = function.__code__
    try:
        lines, _ = inspect.getsourcelines(function)  # reads the file as it is now
    except (OSError, TypeError, SyntaxError):
        return None
    if (code.co_name, code.co_firstlineno, _code_bytes(code)) not in _source_file(
        code.co_filename
    ).compiled:
        return None
    return textwrap.dedent("".join(lines)).encode()


class _Source:
    """A source file as :mod:`linecache` holds its lines: what they compile to and what
    they parse to, each worked out once, when first asked."""

    def __init__(self, filename: str, lines: list[str]) -> None:
        self.filename = filename
        self.lines = lines
        self.text = "".join(lines)

    @cached_property
    def compiled(self) -> frozenset[tuple[str, int, bytes]]:
        """Each code object the file compiles to: its name, its first line and
        :func:`_code_bytes`."""
        shapes: set[tuple[str, int, bytes]] = set()
        try:
            codes = [compile(self.text, self.filename, "exec", dont_inherit=True)]
        except (SyntaxError, ValueError):
            codes = []
        while codes:
            at = codes.pop()
            shapes.add((at.co_name, at.co_firstlineno, _code_bytes(at)))
            codes += (c for c in at.co_consts if isinstance(c, CodeType))
        return frozenset(shapes)

    @cached_property
    def tree(self) -> ast.Module | None:
        """What the file parses to, or None."""
        try:
            return ast.parse(self.text) if self.lines else None
        except (SyntaxError, ValueError):
            return None


_SOURCES: dict[str, _Source] = {}
"""A source file → what was worked out from its lines, while :mod:`linecache` holds those
same lines (it reads a file changed since anew)."""


def _source_file(filename: str) -> _Source:
    lines = linecache.getlines(filename)
    found = _SOURCES.get(filename)
    if found is None or found.lines is not lines:
        found = _SOURCES[filename] = _Source(filename, lines)
    return found


def _named(functions: list[FunctionType]) -> tuple[list[tuple[bytes, bytes]], Looked]:
    """What ``functions`` name in their module, and what the functions found there name in
    turn: each plain function defined in that module (by :func:`_function_bytes`), each
    plain value, and each dict, list or set as the module's text assigns it (not by what it
    holds: a log or a cache the code fills as it runs is the same code), by
    ``module:name`` — one of plain values they only read, as it was first seen
    (:func:`_sighted`), and watched (:class:`_HeldSeen`), so that one changed in place since is
    another. Nothing is followed out of the module a function was defined in but a
    function imported from another module of its package (:func:`_same_package`), followed
    as one defined there: no module, no class, no function of another package. Also each
    name looked up, and what it held (:data:`Looked`). A name these functions assign
    (``global CALLS; CALLS += 1``, a table loaded on first use) is the module's state as it
    runs: it is taken as the module's text assigns it (``CALLS = 0``), not by what it holds,
    and not looked at again."""
    out: dict[tuple[str, str], tuple[bytes, bytes]] = {}
    looked: dict[tuple[str, str], tuple[weakref.ref[Any], str, Any]] = {}
    stored: set[tuple[str, str]] = set()
    tables: dict[tuple[str, str], Any] = {}  # each table of a module read → the table
    filled: set[tuple[str, str]] = set()  # those the code followed changes in place
    seen = set(map(id, functions))
    queue = list(functions)
    while queue:
        function = queue.pop()
        module, space = function.__module__, function.__globals__
        reader = weakref.ref(function)
        stored.update((module, name) for name in _stored_in(function.__code__))
        names = _names_in(function.__code__)
        held = {n for n in names if type(space.get(n)) in _CONTAINERS}
        if held:
            changed = _tables_changed_by(function.__code__, held, _GLOBAL_LOADS)
            filled.update((module, name) for name in changed)
        reads = [(module, space, reader, name) for name in sorted(names)]
        for module, space, reader, name in reads:
            place = (module, name)
            if name not in space:
                looked.setdefault(place, (reader, name, _ABSENT))
                continue
            value = space[name]
            if place not in looked:
                looked[place] = (reader, name, _found_as(value, module, name))
            label = f"{module}:{name}".encode()
            if isinstance(value, FunctionType):
                if value.__module__ != module:
                    if not _as_imported(value, module, name):  # set there by hand (a fake)
                        out[place] = (b"other " + label, _elsewhere_bytes(value))
                        continue
                    if not _same_package(value.__module__, module):
                        continue
                if id(value) in seen:
                    continue
                seen.add(id(value))
                out[place] = (b"uses " + label, _function_bytes(value))
                queue.append(value)
            elif (wrapped := _helper_in(value, module)) is not None:
                # a helper wrapped where it is defined: by the function and what is bound
                out[place] = (b"uses " + label, _joined(b"wrapped", _helper_bytes(value, wrapped)))
                if id(wrapped) not in seen:
                    seen.add(id(wrapped))
                    queue.append(wrapped)
            elif _plain(value):
                text, as_named = _written_at(module, name, value)
                # where no text assigns it (imported from another package, patched over
                # by a test, or no text is known: `python -c`): by what it holds — not one
                # the interpreter sets (`__file__`, where the checkout is, is no code)
                assigned = _assigned(text, as_named, value)
                if assigned is None and not _dunder(name):
                    assigned = _constant_bytes(value)
                if assigned is not None:
                    out[place] = (b"reads " + label, assigned)
            elif type(value) in _CONTAINERS:  # a table: as the module's text writes it
                tables[place] = value
            elif isinstance(value, type) and _helper_class(value, module, name):
                out[place] = (b"class " + label, _class_code(value))
                # what its methods name in their module is followed as the code's own is
                for method in _class_functions(value):
                    if id(method) not in seen:
                        seen.add(id(method))
                        queue.append(method)
            elif _helper_object(value, module):
                # an object of a helper class (`SCALER = Scaler(2)`): by its class's code and
                # what it holds where that is named so, else by its mark, as one a class holds
                kind = type(value)
                out[place] = (b"object " + label, _held_bytes(value) or _token_of(value))
                # watched, as a table it only reads is: one changed in place is seen
                seen_as = _HeldSeen(value, _version_of(value), f"{module}:{name}")
                looked[place] = (looked[place][0], name, seen_as)
                for method in _class_functions(kind):
                    if id(method) not in seen:
                        seen.add(id(method))
                        queue.append(method)
            elif isinstance(value, ModuleType) and _same_package(value.__name__, module):
                # a module of its package whose names the code reads (`tools.double(x)`)
                there = vars(value)
                within = _reader_in(value)
                if within is not None and id(there) not in seen:
                    seen.add(id(there))
                    reads += (
                        (value.__name__, there, within, n) for n in sorted(names & there.keys())
                    )
    for place, value in tables.items():
        module, name = place
        made = _assignment(*_written_at(module, name, value))
        where = f"{module}:{name}"
        if place in filled or place in stored or not _plain_table(value):
            # filled as it runs (a log, a cache), or more than a watch reads: as written
            if made is not None:
                out[place] = (b"reads " + where.encode(), b"written " + ast.unparse(made).encode())
            continue
        # only read: as first seen, and watched (:func:`watch_code`)
        out[place] = (b"reads " + where.encode(), _sighted(value, made, where))
        first, _, _ = looked[place]
        looked[place] = (first, name, _HeldSeen(value, _version_of(value), where))
    named = [piece for place, piece in out.items() if place not in stored]
    for module, name in stored & looked.keys():
        made = _assignment(_module_body(module), name)
        if made is not None:
            named.append((f"state {module}:{name}".encode(), ast.unparse(made).encode()))
    return sorted(named), tuple(entry for place, entry in looked.items() if place not in stored)


def _state_of(kinds: Iterable[type], members: Iterable[Any]) -> frozenset[str]:
    """The names the functions among ``members`` (what classes hold) assign or delete on a
    class of ``kinds`` as they run — their state, not their code: ``type(self).calls += 1``,
    ``self.__class__.x``, ``cls.x`` in a classmethod, or the class named outright
    (``Kind.x``). A name set on an instance (``self.factor = factor``) is not one of them."""
    classes = {id(kind) for kind in kinds}
    names: set[str] = set()
    for member in members:
        on_class = isinstance(member, classmethod)
        for function in _functions_in(member):
            code = function.__code__
            found = _STORES.get(function)
            if found is None or found[0] is not code or found[1] is not on_class:
                found = _STORES[function] = (code, on_class, _stores_of(code, on_class))
            for owner, name in found[2]:
                if owner is None or id(function.__globals__.get(owner)) in classes:
                    names.add(name)
    return frozenset(names)


_STORES: weakref.WeakKeyDictionary[
    FunctionType, tuple[CodeType, bool, frozenset[tuple[str | None, str]]]
] = weakref.WeakKeyDictionary()
"""A function → its code and what that code sets on a class (:func:`_stores_of`), looked up
by the function rather than by its code, whose hash is worked out from all it holds."""

_CALLS = frozenset({"CALL", "CALL_FUNCTION"})
_COPIES = {("COPY", 1), ("DUP_TOP", None)}
_SWAPS = {("SWAP", 2), ("ROT_TWO", None)}


@functools.lru_cache(maxsize=4096)
def _stores_of(code: CodeType, on_class: bool) -> frozenset[tuple[str | None, str]]:
    """Each attribute ``code``, and its nested code, assigns or deletes on a class, with
    the global name of that class (``Kind.x``), or None for the class the code runs for
    (``type(self).x``, ``self.__class__.x``, ``cls.x`` where ``on_class``: the first
    argument is the class), worked out once per code object from its bytecode. Only a
    target read for certain counts — the class loaded just before the store, or before
    the copy an augmented assignment (``+=``) makes of it, with no jump landing in
    between — so a store not read for certain is taken as an instance's, and a value set
    on the class by hand is then seen as a change, never missed."""
    first = code.co_varnames[0] if code.co_argcount else None
    return _stores_in(code, first, on_class, nested=False)


def _stores_in(
    code: CodeType, first: str | None, on_class: bool, nested: bool
) -> frozenset[tuple[str | None, str]]:
    steps = [
        (step.opname, step.argval if step.arg is not None else None, step.is_jump_target)
        for step in dis.get_instructions(code)
    ]
    loads = {"LOAD_DEREF"} if nested else {"LOAD_FAST", "LOAD_DEREF"}

    def is_first(at: int) -> bool:
        return at >= 0 and steps[at][0] in loads and steps[at][1] == first and first is not None

    def target(end: int) -> str | bool | None:
        """The class the steps before ``end`` leave on top of the stack: its global name,
        None for the class the code runs for, or False when it is not known to be one."""
        if end < 1 or any(steps[at][2] for at in range(max(end - 4, 0), end + 1)):
            return False
        op, arg, _ = steps[end - 1]
        if op == "LOAD_GLOBAL" and isinstance(arg, str):
            return arg
        if on_class and not nested and is_first(end - 1):
            return None
        if op == "LOAD_ATTR" and arg == "__class__" and is_first(end - 2):
            return None
        if op in _CALLS and steps[end - 1][1] == 1:
            at = end - 2
            if at >= 0 and steps[at][0] == "PRECALL":
                at -= 1
            if is_first(at) and at >= 1 and steps[at - 1][:2] == ("LOAD_GLOBAL", "type"):
                return None
        return False

    found: set[tuple[str | None, str]] = set()
    for at, (op, name, _) in enumerate(steps):
        if op not in ("STORE_ATTR", "DELETE_ATTR"):
            continue
        end = at
        if op == "STORE_ATTR" and at >= 1 and steps[at - 1][:2] in _SWAPS:
            end = -1  # an augmented assignment: the target is what was copied to read it
            for back in range(at - 2, 0, -1):
                if steps[back][:2] == ("LOAD_ATTR", name) and steps[back - 1][:2] in _COPIES:
                    end = back - 1
                    break
        owner = target(end) if end > 0 else False
        if owner is not False:
            found.add((owner if isinstance(owner, str) else None, str(name)))
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _stores_in(constant, first, on_class, nested=True)
    return frozenset(found)


def _named_by(code: CodeType, opnames: tuple[str, ...]) -> set[str]:
    """The names the steps ``opnames`` of ``code``, and of its nested code, name."""
    names = {step.argval for step in dis.get_instructions(code) if step.opname in opnames}
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _named_by(constant, opnames)
    return names


def _as_written(body: list[ast.stmt] | None, name: str, value: Any) -> Any:
    """The value ``body`` (a class's statements) gives ``name`` where it assigns it a
    literal, else ``value``."""
    made = _assignment(body, name)
    if made is None:
        return value
    try:
        return ast.literal_eval(made)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return value


def _stored_in(code: CodeType) -> set[str]:
    """The global names ``code`` assigns or deletes, and its nested code too."""
    return _named_by(code, ("STORE_GLOBAL", "DELETE_GLOBAL"))


def _found_as(value: Any, module: str, name: str) -> Any:
    """What :data:`Looked` notes of ``value``, found under ``name`` of ``module``: where a
    fingerprint depends on it, the value itself (a plain value) or a weak reference to
    it (a plain function, defined there or elsewhere — one set in place of what the module
    imported, :func:`_as_imported` — or one wrapped there: :func:`_helper_in`), a helper
    class with how it is written (:class:`_ClassSeen`); else :data:`_OTHER` (a module,
    another class)."""
    if isinstance(value, FunctionType):
        return weakref.ref(value)
    if isinstance(value, type) and _helper_class(value, module, name):
        return _ClassSeen(weakref.ref(value), _class_code(value))
    if _plain(value):
        return value
    if _helper_in(value, module) is not None:
        with contextlib.suppress(TypeError):
            return weakref.ref(value)
    return _OTHER


def _same_package(defined: str, module: str) -> bool:
    """Whether a function defined in module ``defined``, imported by module ``module``, is of
    the same package (``proj.tools`` for ``proj.nodes``): the same project's code, written
    with it — not another package's (an upgrade of which would drift every answer), nor
    the standard library's or torch's."""
    top = defined.partition(".")[0]
    return (
        top == module.partition(".")[0]
        and top != "__main__"
        and top not in sys.stdlib_module_names
        and top not in _LEFT_OUT
    )


def _helper_class(kind: type, module: str, name: str) -> bool:
    """Whether ``kind``, a class module ``module`` holds as ``name`` that a node's code
    names, is a helper of that code (``Helper().run(x)``): defined there, or in another
    module of its package it imports it from — no node (one that reads another is keyed
    with it), nor the library's."""
    from somatize.node import Node

    if _left_out(kind) or issubclass(kind, Node):
        return False
    if kind.__module__ == module:
        return True
    return _same_package(kind.__module__, module) and _as_imported(kind, module, name)


def _helper_object(value: Any, module: str) -> bool:
    """Whether ``value``, a name of ``module`` a node's code names, is an object of a helper
    class of that code (``SCALER = Scaler(2)``): of a class defined there or in another
    module of its package — no node, nor the library's —, itself no class, module,
    function, plain value nor table."""
    from somatize.node import Node

    kind = type(value)
    if isinstance(value, (type, ModuleType, FunctionType)) or _plain(value):
        return False
    if kind in _CONTAINERS or _left_out(kind) or issubclass(kind, Node):
        return False
    return kind.__module__ == module or _same_package(kind.__module__, module)


def _class_functions(kind: type) -> list[FunctionType]:
    """Each function a helper class (:func:`_helper_class`) and the classes it inherits
    from, short of the library's, hold — not those made for it from a text of its own (a
    dataclass's methods)."""
    return [
        function
        for above in kind.__mro__
        if not _left_out(above)
        for name, member in list(vars(above).items())
        for function in _functions_in(member)
        if not (_dunder(name) and function.__code__.co_filename == "<string>")
    ]


def _class_code(kind: type) -> bytes:
    """A helper class (:func:`_helper_class`) by its name and how it is written: each
    function its classes, short of the library's, hold (:func:`_function_bytes`), each
    plain value, and each dict, list or set of plain values as the class's text writes it
    — not what these name in turn."""
    pieces = [f"{kind.__module__}:{kind.__qualname__}".encode()]
    for above in kind.__mro__:
        if _left_out(above):
            continue
        for name, member in sorted(vars(above).items(), key=lambda item: item[0]):
            for function in _functions_in(member):
                if _dunder(name) and function.__code__.co_filename == "<string>":
                    continue  # made for it from a text of its own (a dataclass's methods)
                pieces.append(f"{above.__qualname__}.{name}".encode() + _function_bytes(function))
            if not _dunder(name) and _plain(member):
                pieces.append(f"{above.__qualname__}.{name}=".encode() + _constant_bytes(member))
            elif _table(name, member):  # as the class's text writes it: what fills it is state
                made = _assignment(_class_body(above), name)
                if made is not None:
                    written = b"written " + ast.unparse(made).encode()
                    pieces.append(f"{above.__qualname__}.{name}=".encode() + written)
    return _joined(b"class", pieces)


class _ClassSeen(NamedTuple):
    """What :data:`Looked` notes of a helper class (:func:`_helper_class`)."""

    held: weakref.ref[type]
    """A weak reference to it."""
    code: bytes
    """How it was written (:func:`_class_code`): one given another method since is not it."""


def _reader_in(module: ModuleType) -> weakref.ref[Any] | None:
    """A weak reference to a function defined in ``module``, reading its namespace, to note
    what a fingerprint looked up there by (:data:`Looked`), or to the module itself where it
    defines none (one of constants); None where it cannot be referenced weakly."""
    space = vars(module)
    for value in list(space.values()):
        if isinstance(value, FunctionType) and value.__globals__ is space:
            return weakref.ref(value)
    try:
        return weakref.ref(module)
    except TypeError:
        return None


def _space_of(reader: Any) -> dict[str, Any]:
    """The namespace a name noted in :data:`Looked` is read in: its reader's, a function's
    globals or a module's own."""
    space: dict[str, Any] = reader.__globals__ if isinstance(reader, FunctionType) else vars(reader)
    return space


def _written_at(module: str, name: str, value: Any) -> tuple[list[ast.stmt] | None, str]:
    """The statements of the module whose text assigns ``name`` of module ``module``, and
    the name there: ``module``'s own, or where its text assigns no such name, those of the
    module of its package it imports ``value`` from (``from proj.config import SCALE``),
    followed on through the modules of its package that import it in turn (``__init__``
    importing it from ``proj.config``) or import all of another's names (``from
    proj.config import *``)."""
    at, seen = (module, name), set()
    while at not in seen:  # a module importing from one that imports from it ends here
        seen.add(at)
        body = _module_body(at[0])
        if body is not None and _assignment(body, at[1]) is not None:
            return body, at[1]
        imports = _imports_of(at[0])
        sources = [imports[at[1]]] if at[1] in imports else []
        sources += [(every, at[1]) for every, _ in imports.get("*", [])]
        at = next((s for s in sources if _same_package(s[0], module) and held_at(*s) is value), at)
    return _module_body(module), name


def _as_imported(function: FunctionType | type, module: str, name: str) -> bool:
    """Whether ``function``, defined in another module than ``module``, which holds it as
    ``name``, is what ``module``'s text imports there (``from tools import double``): what
    the module imported from holds under that name — not a function set in its place by
    hand (a monkeypatch putting a fake where a node's module imported the real one), nor
    one the text neither imports nor assigns there. Where the text does not import it (no
    text, a name the text assigns, ``dumps = json.dumps``), what its own module holds
    under its name."""
    body = _module_body(module)
    imports = _imports_of(module)
    source = imports.get(name)
    if source is not None:
        return held_at(*source) is function
    if any(held_at(whole, name) is function for whole, _ in imports.get("*", ())):
        return True
    if body is not None and _assignment(body, name) is None:
        return False  # put there from outside the text
    return held_at(function.__module__, function.__qualname__) is function


def _imports_of(module: str) -> dict[str, Any]:
    """Each name the statements of ``module``'s text import a value under (``from tools
    import double as twice``), at its top or in an ``if``, ``try`` or ``with`` block there,
    → the module imported from and the name there (``"*"`` → each module all of whose names
    are imported); {} where the text is not known."""
    body = _module_body(module)
    if body is None:
        return {}
    found = _IMPORTS.get(id(body))
    if found is None or found[0] is not body:
        package = getattr(sys.modules.get(module), "__package__", None) or ""
        names: dict[str, Any] = {}
        statements = list(body)
        while statements:  # the module's, and those of its `if`, `try` and `with` blocks
            statement = statements.pop()
            if not isinstance(statement, ast.ImportFrom):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    if not isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                        statements += getattr(statement, field, None) or []
                continue
            try:
                source = importlib.util.resolve_name(
                    "." * statement.level + (statement.module or ""), package
                )
            except (ImportError, ValueError):
                continue
            for alias in statement.names:
                if alias.name == "*":
                    names.setdefault("*", []).append((source, "*"))
                else:
                    names[alias.asname or alias.name] = (source, alias.name)
        found = _IMPORTS[id(body)] = (body, names)
    return found[1]


_IMPORTS: dict[int, tuple[list[ast.stmt], dict[str, Any]]] = {}
"""A module's statements (by identity, held so it is not another's) → what they import
(:func:`_imports_of`), read once."""


def _elsewhere_bytes(function: FunctionType) -> bytes:
    """A function of another module that is not what that module holds under its name
    (:func:`_as_imported`), by that name and its code (:func:`_code_bytes`), the same in
    every process running the same code."""
    name = f"{function.__module__}:{function.__qualname__}".encode()
    return _joined(b"elsewhere", [name, _code_bytes(function.__code__)])


def _helper_in(value: Any, module: str) -> FunctionType | None:
    """The plain function of ``module`` that ``value``, a name of that module, runs where it
    is no plain function but wraps one — a decorator that says what it wraps
    (``functools.lru_cache``, ``functools.wraps``), a ``functools.partial`` — else None."""
    if isinstance(value, (FunctionType, type, ModuleType)) or _plain(value):
        return None
    if not isinstance(value, _PARTIALS) and not callable(value):
        return None
    functions = _functions_in(value)
    if len(functions) != 1 or functions[0].__module__ != module:
        return None
    return functions[0]


def _helper_bytes(value: Any, wrapped: FunctionType) -> list[bytes]:
    """A helper ``value`` that wraps ``wrapped`` (:func:`_helper_in`), by how that function
    is written, what a partial binds (:func:`_bound_in`), and the wrapper's class."""
    kind = type(value)
    made = f"{kind.__module__}:{kind.__qualname__}".encode()
    return [made, _function_bytes(wrapped), *_bound_in(value)]


def _assigned(body: list[ast.stmt] | None, name: str, value: Any) -> bytes | None:
    """What names the value ``name`` holds, as it is assigned in ``body`` (a module's or a
    class's statements): a literal (``FACTOR = 2``) by the value it holds now, which is
    the same in every process; one computed as the module loads (``HERE =
    os.path.dirname(__file__)``, a value read from the environment) by how it is
    computed, and how the names it reads there are (:func:`_made_by`), the same wherever
    the code is, whatever it makes there. None where
    nothing in ``body`` assigns it (it came from elsewhere), or ``body`` is not known."""
    made = _assignment(body, name)
    if made is None:
        return None
    try:
        ast.literal_eval(made)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return b"made by " + _made_by(body, made, {name})
    return _constant_bytes(value)


def _made_by(body: list[ast.stmt] | None, made: ast.expr, seen: set[str]) -> bytes:
    """How ``made``, a value ``body`` computes, is written, with how each name it reads that
    ``body`` assigns is (``HIDDEN = 4 * WIDTH``, ``WIDTH = EMBED``, ``EMBED = 128``): another
    value written for one of those is another value, though it is read nowhere else."""
    parts = [ast.unparse(made).encode()]
    for node in ast.walk(made):
        if isinstance(node, ast.Name) and node.id not in seen:
            seen.add(node.id)
            there = _assignment(body, node.id)
            if there is not None:
                parts.append(node.id.encode() + b" = " + _made_by(body, there, seen))
    return b"; ".join(parts)


def _assignment(body: list[ast.stmt] | None, name: str) -> ast.expr | None:
    """The value the last assignment to ``name`` in ``body`` gives it; None where there is
    none, or ``body`` is not known."""
    if body is None:
        return None
    found = _ASSIGNMENTS.get(id(body))
    if found is None or found[0] is not body:
        found = _ASSIGNMENTS[id(body)] = (body, _assignments_in(body))
    return found[1].get(name)


_ASSIGNMENTS: dict[int, tuple[list[ast.stmt], dict[str, ast.expr]]] = {}
"""A module's or a class's statements (by identity, held so the identity is not another's)
→ what each name is last assigned there (:func:`_assignments_in`): read once, not once a
name, which for a class of many values would be a scan of its body for each."""


def _assignments_in(body: list[ast.stmt]) -> dict[str, ast.expr]:
    made: dict[str, ast.expr] = {}
    for statement in body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    made[target.id] = statement.value
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.value is not None
        ):
            made[statement.target.id] = statement.value
    return made


def _module_body(module: str) -> list[ast.stmt] | None:
    """The top-level statements of loaded module ``module``'s source, or None."""
    filename = getattr(sys.modules.get(module), "__file__", None)
    tree = _source_file(filename).tree if isinstance(filename, str) else None
    return None if tree is None else tree.body


def _class_body(kind: type) -> list[ast.stmt] | None:
    """The statements of ``kind``'s body in its module's source, found by its qualified
    name (a class defined inside a function is not found), or None."""
    body = _module_body(kind.__module__)
    for part in kind.__qualname__.split("."):
        if body is None:
            return None
        classes = [s for s in body if isinstance(s, ast.ClassDef) and s.name == part]
        body = classes[-1].body if classes else None
    return body


def _names_in(code: CodeType) -> set[str]:
    """The global and attribute names ``code`` uses, and its nested code too."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _names_in(constant)
    return names


def code_digest(code: CodeType) -> bytes:
    """A digest of compiled ``code`` that every process compiling the same source agrees
    on: its bytecode, the names it uses and its constants. Nested code (a generator
    expression, a lambda, an inner function) is digested the same way, since its ``repr``
    holds its address in memory; a frozenset's members are taken in sorted order, since
    its order follows string hashes, which are salted per process."""
    digest = hashlib.sha256()
    for piece in (
        code.co_code,
        "\0".join(code.co_names).encode(),
        *map(_constant_bytes, code.co_consts),
    ):
        digest.update(len(piece).to_bytes(8, "little") + piece)
    return digest.digest()


def _constant_bytes(value: Any) -> bytes:
    """A constant of compiled code as bytes that are the same in every process."""
    if isinstance(value, CodeType):
        return b"code " + code_digest(value)
    if isinstance(value, (tuple, frozenset)):
        members = [_constant_bytes(member) for member in value]
        if isinstance(value, frozenset):
            members.sort()
        joined = b"".join(len(member).to_bytes(8, "little") + member for member in members)
        return f"{type(value).__name__} ".encode() + hashlib.sha256(joined).digest()
    return f"{type(value).__name__} {value!r}".encode()


def _dotted(name: str) -> bool:
    """Whether ``name`` is identifiers joined by dots (``pkg.mod``, ``Outer.Inner``): what
    the module and the qualname of an identity are."""
    return all(part.isidentifier() for part in name.split("."))


def _lookup(module: Any, qualname: str) -> Any:
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


class Catalog:
    """Identity → implementation, with registrations for what an import cannot find.

    ``in_process=True`` is for a catalog whose rebuilt nodes run in this very process
    (the embedded broker's workers): there, a class defined in ``__main__`` — a
    notebook's — is found in this process's ``__main__``, as it would be by a worker
    sharing the interpreter. A catalog for another process refuses such classes.
    """

    def __init__(self, *, in_process: bool = False) -> None:
        self._registered: dict[str, type] = {}
        self.in_process = in_process

    def register(self, kind: type, identity: str | None = None) -> str:
        """Makes ``kind`` findable under ``identity`` (by default its own) in this process."""
        name = identity or identity_of(kind)
        if name is None:
            raise Unbuildable(
                f"`{kind.__qualname__}` has no stable name; register it under one, "
                "e.g. `catalog.register(kind, 'mypackage.nodes:Clean')`"
            )
        self._registered[name] = kind
        return name

    def resolve(self, identity: str) -> type:
        """The class behind ``identity``: registered here, or imported by ``module:qualname``."""
        registered = self._registered.get(identity)
        if registered is not None:
            return registered
        module_name, _, qualname = identity.partition(":")
        if not _dotted(module_name) or not _dotted(qualname):
            raise Unbuildable(
                f"`{identity}` is not of the form `module:qualname` (each a dotted name of "
                "identifiers, with no leading dot)"
            )
        if module_name == "__main__":
            main = sys.modules.get("__main__") if self.in_process else None
            found_here = _lookup(main, qualname) if main is not None else None
            if isinstance(found_here, type):
                return found_here
            raise Unbuildable(
                f"`{identity}` is defined in `__main__` (a script or a notebook), which another "
                "process cannot import: move the class into a module that process can import, "
                "or register it there with `Catalog.register`"
            )
        try:
            found: Any = importlib.import_module(module_name)
        except (ImportError, ValueError, TypeError) as error:
            raise Unbuildable(
                f"`{identity}` cannot be rebuilt here: importing `{module_name}` failed ({error})"
            ) from error
        for part in qualname.split("."):
            found = getattr(found, part, None)
            if found is None:
                raise Unbuildable(f"`{module_name}` has no `{qualname}`, so `{identity}` is gone")
        if not isinstance(found, type):
            raise Unbuildable(f"`{identity}` names a `{type(found).__name__}`, not a class")
        return found

    def maker(self, name: str) -> Any:
        """The classmethod ``module:Class.method`` of a node class, which builds a node that
        stands for another class; Unbuildable when it is not one."""
        from somatize.node import Node

        owner, dot, method = name.rpartition(".")
        if not dot or ":" not in owner:
            raise Unbuildable(f"a maker is `module:Class.method`, got `{name}`")
        kind = self.resolve(owner)
        found = getattr(kind, method, None)
        if not issubclass(kind, Node) or getattr(found, "__self__", None) is not kind:
            raise Unbuildable(f"`{name}` is no classmethod of a Node class, so it builds no node")
        return found

    def admit(self, blueprint: Blueprint) -> None:
        """Raises Unbuildable when this catalog cannot find what ``blueprint`` names: its
        class and, when it has one, its maker."""
        self.resolve(blueprint.identity)
        if blueprint.maker is not None:
            self.maker(blueprint.maker)

    def rebuild(self, identity: str, arguments: dict[str, Any]) -> Any:
        """A new instance of ``identity`` built with the declared keyword ``arguments``."""
        kind = self.resolve(identity)
        positional = arguments.get("*args", ())
        named = {k: v for k, v in arguments.items() if k not in ("*args", "**kwargs")}
        named.update(arguments.get("**kwargs", {}))
        return kind(*positional, **named)

    def build(self, blueprint: Blueprint) -> Node:
        """The node ``blueprint`` describes, built afresh and checked against its declaration.

        Unbuildable when the class cannot be found here, when it is not a node, or
        when the rebuilt node declares something else than the original did (the
        code or its arguments differ here, so its answers would be kept under a key
        that does not describe them), or holds other values in its public attributes
        (:func:`check_held`; one that holds state is compared once it is loaded, by
        whoever loads it)."""
        from somatize.node import Node

        kind = self.resolve(blueprint.identity)
        made: Any
        if blueprint.maker is None:
            if not issubclass(kind, Node):
                raise Unbuildable(f"`{blueprint.identity}` is a `{kind.__qualname__}`, not a Node")
            make, args, own = kind, blueprint.args, identity_of(kind)
        else:
            make, args, own = self.maker(blueprint.maker), (kind, *blueprint.args), None
        try:
            made = make(*args, **blueprint.kwargs)
        except Exception as error:
            raise Unbuildable(
                f"rebuilding `{blueprint.identity}` with the arguments it was made with failed "
                f"({type(error).__name__}: {error}); its constructor must accept again what it "
                "was called with"
            ) from error
        if not isinstance(made, Node):
            raise Unbuildable(
                f"`{blueprint.maker}` made a `{type(made).__qualname__}`, not a Node, "
                f"from `{blueprint.identity}`"
            )
        node: Node = made
        if blueprint.maker is not None:
            own = node._smz.identity or identity_of(type(node))
        if blueprint.identity != (own or blueprint.identity):
            node.identified(blueprint.identity)
        if blueprint.declaration is not None:
            try:
                again = node.declaration()
            except SomatizeError:
                again = None
            if again != blueprint.declaration:
                raise Unbuildable(
                    f"`{blueprint.identity}` rebuilt here declares {again}, where it was made "
                    f"declaring {blueprint.declaration}: this process runs other code, or the "
                    "constructor does not make the same node from the same arguments. Install "
                    "the same version of the code everywhere the graph runs"
                )
        if blueprint.held is not None and not node.holds_state:
            check_held(blueprint, node)
        return node


def check_held(blueprint: Blueprint, node: Node) -> None:
    """Unbuildable when ``node``, rebuilt from ``blueprint`` (and, when it holds state,
    loaded with it), holds other values in its public attributes than the original held
    when it was sent (:attr:`Blueprint.held`)."""
    from somatize.node import held_by

    was, now = dict(blueprint.held or ()), dict(held_by(node))
    apart = sorted(a for a in was.keys() | now.keys() if was.get(a) != now.get(a))
    if apart:
        said = ", ".join(f"`{attr}`" for attr in apart)
        raise Unbuildable(
            f"`{blueprint.identity}` rebuilt here from its constructor call holds other "
            f"values in {said} than the node in the graph holds: this process runs other "
            "code, or the constructor does not make the same node from the same arguments "
            "(it draws a seed of its own, say), or the attribute was set after the node was "
            "made (`p.k = 3`, a counter that had already counted), and a copy rebuilt from "
            "its arguments would answer otherwise. Make it from its arguments alone (a seed "
            "an argument, a setting a constructor argument), or run it where the graph is "
            'called or on a `Worker.generic(mode="local")` worker'
        )


@dataclass(frozen=True)
class Blueprint:
    """What another process needs to rebuild a node: its identity, the constructor call
    that made it, and the digest of its declaration to check the result against — and
    what the node holds in its public attributes (:func:`~somatize.node.held_by`) when it
    is sent, which a copy rebuilt from the call must hold too."""

    identity: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    declaration: str | None
    maker: str | None = None
    """``module:Class.method`` that builds the node from the class ``identity`` names and
    the arguments, for a node that stands for another class; None: the class is the node's."""
    held: tuple[tuple[str, str], ...] | None = None
    """Each public attribute with a canonical form, by the digest of that form, as the
    node holds them when it is sent; None: not checked. A copy that holds state is
    checked once its state is loaded (:func:`check_held`)."""

    def to_bytes(self) -> bytes:
        """The bytes of this blueprint: what crosses a wire (worked out once). They are
        canonical bytes written exact, so that the arguments come back as they were made:
        each dict in the order it was built in, a bytearray as one — a node reads both
        (``for name in order``), and a copy built from them sorted or turned to bytes
        would compute otherwise. (A key takes them alike; a blueprint's bytes are no key.)"""
        return self._bytes

    @cached_property
    def _bytes(self) -> bytes:
        held = None if self.held is None else [list(pair) for pair in self.held]
        fields = [self.identity, self.args, self.kwargs, self.declaration, self.maker, held]
        return b"".join(canonical.parts_of(fields, "a blueprint", exact=True))

    @staticmethod
    def from_bytes(data: bytes | memoryview) -> Blueprint:
        """The blueprint whose bytes are ``data``; Unbuildable when they are not one."""
        try:
            identity, args, kwargs, declaration, maker, held = canonical.decode(data)
            if not isinstance(identity, str) or not isinstance(kwargs, dict):
                raise ValueError("fields of the wrong types")
            if maker is not None and not isinstance(maker, str):
                raise ValueError("a maker that is not a name")
            if held is not None:
                held = tuple((str(attr), str(digest)) for attr, digest in held)
            return Blueprint(identity, tuple(args), dict(kwargs), declaration, maker, held)
        except (ValueError, TypeError) as why:
            raise Unbuildable(f"these bytes are not a node's blueprint ({why})") from None


def blueprint_of(
    node: Node, name: str | None = None, held: tuple[tuple[str, str], ...] | None = None
) -> Blueprint:
    """How another process rebuilds ``node``; Unbuildable, saying what to do, when it cannot.

    ``name`` is what errors call the node (its name in a graph); ``held``, what it holds
    in its public attributes now (:func:`~somatize.node.held_by`), which the copy must hold
    too — a copy of a node that holds state once that state is loaded into it."""
    kind = type(node)
    called = f"`{name or node._smz.name or kind.__qualname__}` ({node.kind_name()})"
    identity = node._smz.identity or identity_of(kind)
    if identity is None:
        raise Unbuildable(
            f"{called} has no stable name — its class is made inside a function or at run "
            "time — so no other process can rebuild it. Define the class at module level in a "
            "module the worker can import"
        )
    try:
        maker, args, kwargs = node.recipe()
    except Unbuildable as why:
        raise Unbuildable(f"{called} cannot be rebuilt in another process: {why}") from None
    try:
        canonical.parts_of([tuple(args), dict(kwargs)], exact=True)
    except canonical.NotCanonical as why:
        raise Unbuildable(
            f"{called} cannot be rebuilt in another process: it was constructed with "
            f"arguments that cannot cross a wire ({why}). Construct it from canonical values "
            "(a path or a name rather than an open object), or run it where the graph is "
            'called or on a `Worker.generic(mode="local")` worker'
        ) from None
    try:
        declaration: str | None = node.declaration(name)
    except SomatizeError:
        declaration = None
    return Blueprint(identity, tuple(args), dict(kwargs), declaration, maker, held)


def state_crosses(node: Node) -> bool:
    """Whether ``node`` can hand its state to a copy of it rebuilt elsewhere: its class
    writes both :meth:`~somatize.node.Node.state_bytes` and
    :meth:`~somatize.node.Node.load_state`."""
    from somatize.node import Node

    kind = type(node)
    return kind.state_bytes is not Node.state_bytes and kind.load_state is not Node.load_state
