"""The code fingerprint of node classes (:func:`fingerprint_of`): a digest of how each
class of their lineage, short of the library's, is written.

A class's own body is digested once (:func:`_written`) and again only when its body, or a
name its functions looked up in their module, holds something else since
(:data:`_FINGERPRINTS`). A body of plain values, plain functions and objects of plain
values is told unchanged by a stamp read cheaply (:func:`_stamp_of`), and a fingerprint
whose lineage is all told unchanged so is taken as it was noted (:func:`_known`): a node's
class holding configs is fingerprinted again at each graph built, and that is the cost.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import weakref
from types import (
    FunctionType,
    GetSetDescriptorType,
    MemberDescriptorType,
)
from typing import Any

from somatize.catalog._bytecode import _fillers, _state_of, _stores_by
from somatize.catalog._code import (
    _as_parsed,
    _as_written,
    _assigned,
    _assigned_now,
    _assignment,
    _class_body,
    _constant_bytes,
    _note_unmade,
    _set_since,
)
from somatize.catalog._functions import (
    _bound_in,
    _cells_now,
    _closed_classes,
    _closed_objects,
    _default_table_bytes,
    _default_tables,
    _function_bytes,
    _made_of,
    _table_now,
)
from somatize.catalog._held import (
    _HOLDERS,
    _contained_bytes,
    _held_bytes,
    _named_state,
    _opaque_bytes,
    _runner,
)
from somatize.catalog._marks import _token_of, _version_of
from somatize.catalog._members import (
    _ancestry,
    _dunder,
    _exactly_plain,
    _fillable,
    _functions_in,
    _kept_in_place,
    _left_out,
    _plain,
    _put,
    _Same,
    _same_package,
    _table,
    _unwritten_lineage,
)
from somatize.catalog._names import (
    Looked,
    _class_functions,
    _helper_class_bytes,
    _named,
    _sighted,
    _still,
    _torch_name,
    _torch_replaced,
)
from somatize.catalog._project import qualified

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
            if not _unwritten_lineage(above):
                lineage[above] = None
    known = _known(kinds, list(lineage))
    if known is not None:
        return known
    for kind in lineage:  # made below a mixin not calling super: its module's text untrusted
        _note_unmade(kind)
    # A name the code of the lineage sets on one of its classes as it runs (a counter a
    # subclass moves on itself, declared on its base) is their state, not their code.
    state = _state_of(lineage, (member for k in lineage for member in list(vars(k).values())))
    filled, by_forward = _fillers(lineage)
    state |= filled
    kept = by_forward - state
    entries = sorted((qualified(k).encode(), _written(k, state, kept)) for k in lineage)
    digest = hashlib.sha256(b"somatize code 4\0")
    for name, written in entries:
        digest.update(len(name).to_bytes(8, "little") + name + written)
    replaced = _torch_replaced_by_torch(kinds)
    if replaced:  # none where torch runs its own: the fingerprints of before are the same
        digest.update(b"torch replaced\0" + b"".join(replaced))
    said = "sha256:" + digest.hexdigest()[:16]
    if kinds:
        _note_known(kinds, list(lineage), said)
    return said


def _made_for_dataclass(function: FunctionType) -> bool:
    """Whether ``function``, a method of a dataclass, is one dataclasses made or lent it."""
    return function.__code__.co_filename == "<string>" or function.__module__ == "dataclasses"


_KNOWN: weakref.WeakKeyDictionary[type, tuple[Any, ...]] = weakref.WeakKeyDictionary()
"""The first of classes fingerprinted together → a weak reference to each of them and to
each class of their lineage, the name and the entry of :data:`_FINGERPRINTS` of each of
those, and their fingerprint (:func:`_note_known`)."""


def _note_known(kinds: tuple[type, ...], lineage: list[type], said: str) -> None:
    """Notes ``said``, the fingerprint of ``kinds``, for :func:`_known`, where each class of
    their ``lineage`` is told unchanged by its stamp (:data:`_STAMPS`) and none of their
    code sets a value on a class it names in its module (``Kind.calls += 1``: that value is
    their state while the name holds one of them, :func:`_state_of`, which is not watched)."""
    entries = tuple(_FINGERPRINTS.get(kind) for kind in lineage)
    stamped = all(
        (stamp := _STAMPS.get(kind)) is not None and stamp[0] is entry
        for kind, entry in zip(lineage, entries, strict=True)
    )
    if not stamped or any(
        owner is not None
        for kind in lineage
        for member in list(vars(kind).values())
        for function in _functions_in(member)
        for owner, _ in _stores_by(function, False)
    ):
        _KNOWN.pop(kinds[0], None)
        return
    names = tuple(qualified(kind) for kind in lineage)
    _KNOWN[kinds[0]] = (tuple(map(weakref.ref, (*kinds, *lineage))), names, entries, said)


def _known(kinds: tuple[type, ...], lineage: list[type]) -> str | None:
    """The fingerprint of ``kinds`` noted by :func:`_note_known`, where it is theirs still:
    the same classes, of the same lineage, each named as it was and told unchanged by its
    stamp (:func:`_stamp_of`), with the same entry of :data:`_FINGERPRINTS`, whose names
    of their modules hold what they held — what :func:`_written` checks before it takes
    an entry, without working out again which names are state (a stamp holds no table
    and no class method, and their code sets nothing on a class it names). None otherwise."""
    found = _KNOWN.get(kinds[0]) if kinds else None
    if found is None:
        return None
    references, names, entries, said = found
    classes = (*kinds, *lineage)
    if len(references) != len(classes) or any(
        reference() is not kind for reference, kind in zip(references, classes, strict=True)
    ):
        return None
    for kind, name, entry in zip(lineage, names, entries, strict=True):
        stamp = _STAMPS.get(kind)
        if (
            stamp is None
            or stamp[0] is not entry
            or _FINGERPRINTS.get(kind) is not entry
            or qualified(kind) != name
            or _stamp_of(kind) != stamp[1]
            or not all(_still(*looked) for looked in stamp[0][1])
        ):
            return None
    known: str = said
    return known


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
    stamped = _STAMPS.get(kind)
    if (
        found is not None
        and stamped is not None
        and stamped[0] is found
        and found[3] == (state, kept)
        and _stamp_of(kind) == stamped[1]
        and all(_still(*name) for name in found[1])
    ):
        return found[0]
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
        if made and _dunder(name):  # made for the dataclass: from a text of its own, or
            # dataclasses' own function (3.13's `__replace__`), neither the class's code
            held = [f for f in held if not _made_for_dataclass(f)]
        for function in held:
            _put(digest, b"def " + name.encode(), _function_bytes(function))
            tables = _default_tables(name, function)
            if tables:  # by what they hold, or once changed in place, a mark
                _put(digest, b"defaults " + name.encode(), *map(_default_table_bytes, tables))
        bound = _bound_in(member) if held else []
        if bound:
            _put(digest, b"bound " + name.encode(), *bound)
        functions += held
        # a name its code sets on the class as it runs holds its state, whatever object
        # that is (`type(self)._model = load()`): named below as its text assigns it
        # one its node's forward fills (a log, `recent = deque()`) is named as first seen,
        # below, not by what it holds now
        fills = _kept_in_place(name, member) and name in kept
        ours = held or _dunder(name) or _plain(member) or name in state or fills
        opaque = None if ours else _opaque_bytes(member)
        library = _left_out(type(member)) and not callable(member) and type(member) not in _HOLDERS
        if opaque is not None and library and not opaque.startswith(b"tensor "):
            # the library's value (`pattern = re.compile("a")`, `root = Path(...)`): as the
            # text makes it, where it does, the same wherever the code is — not a tensor,
            # named by its values whatever made them (`torch.load(...)`), nor one set in
            # place of what the text made (`Kind.pattern = re.compile("b")`)
            if not texts:
                texts.append(_class_body(kind))
            if not _set_since(kind, name, member):
                opaque = _assigned(texts[0], name, member) or opaque
        if opaque is not None:
            _put(digest, b"object " + name.encode(), opaque)
        if isinstance(member, type) and not _dunder(name):  # `make = Double`, a nested class
            _put(digest, b"class " + name.encode(), _held_class_bytes(member))
            if _followed(member, kind):  # what its methods name, as the class's own do
                functions += _class_functions(member)
        filled = _fillable(name, member) and name in state
        if fills and not filled:
            if not texts:
                texts.append(_class_body(kind))
            where = f"{kind.__qualname__}.{name}"
            sighted = _sighted(member, _assignment(texts[0], name), where)
            _put(digest, b"table " + name.encode(), sighted)
            continue
        contained = None if _dunder(name) or name in state else _contained_bytes(member)
        if contained is not None:
            _put(digest, b"holds " + name.encode(), contained)
        elif filled:  # filled by its own code (with objects too, a registry): as written
            if not texts:
                texts.append(_class_body(kind))
            made_as = _assignment(texts[0], name)
            if made_as is not None:
                _put(digest, b"table " + name.encode(), b"written " + _as_parsed(made_as).encode())
            elif not any(name in vars(above) for above in kind.__mro__[1:]):
                _put(digest, b"table " + name.encode(), b"state")
        elif _table(name, member):  # by what it holds, or once changed in place, a mark
            _put(digest, b"table " + name.encode(), _held_bytes(member) or _token_of(member))
        if not held and not _dunder(name) and (_plain(member) or name in state):
            if not texts:
                texts.append(_class_body(kind))
            text = texts[0]
            if name in state and _assignment(text, name) is None:
                if not any(name in vars(above) for above in kind.__mro__[1:]):
                    # state no known text assigns (a class typed in a notebook): no value
                    _put(digest, b"let " + name.encode(), b"state")
                continue  # else state a class it inherits from declares
            value = _as_written(text, name, member) if name in state else member
            assigned = _assigned_now(None if name in state else kind, text, name, value)
            _put(digest, b"let " + name.encode(), assigned or _constant_bytes(value))
    named, looked = _named(functions)
    for label, piece in named:
        _put(digest, label, piece)
    written = digest.digest()
    if kept:  # a table first seen as it was worked out was marked: read as it is now
        body = _body_of(kind, state, kept)
    found = _FINGERPRINTS[kind] = (written, looked, body, (state, kept))
    stamp = _stamp_of(kind)
    if stamp is not None:
        _STAMPS[kind] = (found, stamp)
    else:
        _STAMPS.pop(kind, None)
    return written


_STAMPS: weakref.WeakKeyDictionary[type, tuple[Any, tuple[Any, ...]]] = weakref.WeakKeyDictionary()
"""A class whose body holds only what :func:`_stamp_of` reads → its entry of
:data:`_FINGERPRINTS` and that stamp, which, the same, says its body (:func:`_body_of`)
is the same without reading it again."""


_INERT = (GetSetDescriptorType, MemberDescriptorType)
"""What a class's body holds under a dunder name that its fingerprint names alike
whichever object it is (``__dict__``, ``__weakref__``: :func:`_body_of` notes None)."""


_DATACLASS_PARAMS: Any = getattr(dataclasses, "_DataclassParams", None)
"""The class of what a dataclass holds as ``__dataclass_params__``."""


def _stamp_of(kind: type) -> tuple[Any, ...] | None:
    """What ``kind``'s own body holds, read cheaply, where all of it is plain values (held
    here, by identity: never another at the same address), plain functions, as unwrapped,
    closing over no object (:func:`_closed_objects`) and taking plain values only by
    default (each by a weak reference, its code and its defaults, by identity), and,
    closing over no class of the user's but ``kind`` (:func:`_closed_classes`, read anew
    by :func:`_made_of`), and,
    under dunder names, what :func:`_body_of` notes as None whichever object it is (a
    slot's descriptor, a dataclass's parameters, a dict) — equal to an earlier stamp only where
    :func:`_body_of` would note the same body; None for any other class (one holding an
    object, a table, a property), whose body is read each time."""
    stamp: list[Any] = []
    for name, member in list(vars(kind).items()):
        kind_of = type(member)
        if kind_of is FunctionType:
            functions = []
            for function in _functions_in(member):  # as unwrapped (a dataclass's `__repr__`)
                if (
                    function.__kwdefaults__ is not None
                    or not _exactly_plain(function.__defaults__)
                    or _closed_objects(function)
                    or any(closed is not kind for closed in _closed_classes(function))
                ):
                    return None
                code, defaults = function.__code__, function.__defaults__
                cells = _cells_now(function)
                functions.append((weakref.ref(function), _Same(code), _Same(defaults), cells))
            stamp.append((name, tuple(functions)))
        elif _exactly_plain(member):
            stamp.append((name, _Same(member)))
        elif not _dunder(name) and (named := _named_state(member)) is not None:
            stamp.append((name, _Same(member), named))  # `cfg = Config(2)`, as it was named
        elif _dunder(name) and (
            kind_of in _INERT or kind_of is dict or kind_of is _DATACLASS_PARAMS
        ):
            stamp.append((name, kind_of))
        else:
            return None
    if "__dataclass_params__" in vars(kind):  # said by its fields' names too
        stamp.append(tuple(field.name for field in dataclasses.fields(kind)))
    return tuple(stamp)


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
        elif (
            _table(name, member)
            or (_fillable(name, member) and name in state)
            or (_kept_in_place(name, member) and name in kept)
        ):  # read again, as an object
            contained = None if name in state or name in kept else _contained_bytes(member)
            if name in kept and name not in state:  # as first seen, till changed elsewhere
                body.append((name, ("kept", _Same(member), _version_of(member))))
            elif name in state:  # a table its own code fills (a registry too): by its text
                body.append((name, ("state", _Same(member))))
            elif contained is None:  # a table: by what it holds, or its mark
                body.append((name, (_held_bytes(member), _Same(member), _version_of(member))))
            else:
                body.append((name, contained))
        elif isinstance(member, type) and not _dunder(name):  # another class, or edited
            body.append((name, (_Same(member), _held_class_bytes(member))))
        elif name in state:  # an object its code sets as it runs (a model loaded once)
            body.append((name, "state"))
        else:
            opaque = _opaque_bytes(member)
            if opaque is not None and opaque.startswith(b"object "):  # marked: by identity
                body.append((name, (_Same(member), _version_of(_runner(member)))))
            else:  # named by what it holds, read again: one changed in place is seen
                body.append((name, opaque))
    return tuple(body)


def _held_class_bytes(held: type) -> bytes:
    """A class a class holds (``make = Double``, a nested ``class Config``): one of the
    library's (:func:`_left_out`: ``nn.ReLU``) by its name, any other by its name and how it
    is written (:func:`_helper_class_bytes`: its functions and those of the classes it
    inherits from, its plain values, and the tables and objects it holds by what they hold),
    the same in every process running the same code — so that another class held, or the
    held class edited, is other code."""
    if _left_out(held):
        return f"library {qualified(held)}".encode()
    return _helper_class_bytes(held)


def _followed(held: type, kind: type) -> bool:
    """Whether what the functions of ``held``, a class ``kind`` holds, name in their module is
    followed as what ``kind``'s own name is: a class of ``kind``'s module or of another
    module of its package, no class of the library's."""
    if _left_out(held):
        return False
    return held.__module__ == kind.__module__ or _same_package(held.__module__, kind.__module__)


def _torch_replaced_by_torch(kinds: tuple[type, ...]) -> list[bytes]:
    """What torch's own classes among ``kinds`` and the classes they inherit from (short of
    ``nn.Module`` and the standard library's, whose code no fingerprint covers) name of
    torch's that is not torch's own (:func:`_torch_replaced`: ``nn.ReLU`` calling
    ``F.relu``, set to a function of the user's), each by its place and how it is written;
    none where torch's functions are its own."""
    said: set[bytes] = set()
    for kind in kinds:
        for above in _ancestry(kind):
            if not _torch_name(above.__module__) or above.__module__ == "torch.nn.modules.module":
                continue
            for member in list(vars(above).values()):
                for function in _functions_in(member):
                    for _, label, written, _, _ in _torch_replaced(function):
                        said.add(len(label).to_bytes(8, "little") + label + written)
    return sorted(said)
