"""The watch a graph takes of its nodes' classes, compared at every forward in one
comparison made in C (:func:`watch_code`, :class:`CodeWatch`).

A method patched in, a function given other code or defaults in place (counted by an
audit hook, :data:`_SETS`), a helper of a module rebound, an object a class holds changed in
place, a numpy array the code reads written in place (:class:`Written`): each is found by
:func:`code_changes`, and the fingerprints are worked out again.
What a node's own forward changes in an object it holds is its state, not a change
(:func:`own_state`).
"""

from __future__ import annotations

import array
import collections
import contextlib
import enum
import itertools
import numbers
import operator
import sys
from collections.abc import Iterable, Iterator
from types import (
    FunctionType,
    MappingProxyType,
)
from typing import Any, NamedTuple

from somatize._arrays import Written, looked_at
from somatize.catalog._bytecode import _fillers, _state_of
from somatize.catalog._code import _assignment, _class_body, _written_at
from somatize.catalog._fingerprint import _FINGERPRINTS, fingerprint_of
from somatize.catalog._functions import (
    _bound_objects,
    _classes_reached,
    _closed_objects,
    _default_tables,
    _function_bytes,
    _partial_keywords,
)
from somatize.catalog._held import (
    _array,
    _contained_bytes,
    _held_arrays,
    _held_bytes,
    _items_base,
    _opaque_bytes,
    _runner,
    _Unnamed,
)
from somatize.catalog._marked import (
    _Cells,
    _counted,
    _Marked,
    _marked,
    _plain_table,
    _Versions,
    _written_array,
)
from somatize.catalog._marks import _moved_on, _version_of
from somatize.catalog._members import (
    _CONTAINERS,
    _ancestry,
    _dunder,
    _fillable,
    _functions_in,
    _kept_in_place,
    _left_out,
    _not_library,
    _plain,
    _read_through,
    _Slots,
    _table,
)
from somatize.catalog._names import (
    _ABSENT,
    _OTHER,
    _ArraySeen,
    _class_objects,
    _ClassSeen,
    _found_as,
    _FunctionSeen,
    _HeldSeen,
    _HelperSeen,
    _sighted,
    _space_of,
)


class CodeWatch(NamedTuple):
    """What :func:`fingerprint_of` read of classes, laid out for one look at every forward
    (:func:`watch_code`): ``lives`` compared with ``copies`` in one comparison made in C."""

    lives: list[Any]
    """The namespace of each class of ``kinds``, then each dict, list or set read of an
    object named by what it holds (:func:`_held_bytes`), each dict of keyword defaults of
    a function of theirs and of keywords of a partial they hold, each numpy array their
    code reads (:class:`Written`) and the count of changes in place of each tensor of their
    modules' it reads (:class:`_Versions`), and last the count of code set in place
    (:data:`_SETS`)."""
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
    keyed: tuple[Any, ...] = ()
    """The objects whose state the watch's taker keys itself (:func:`watch_code`)."""

    def looks_same(self) -> bool:
        """Whether ``lives`` hold what ``copies`` do, in one comparison made in C: no where
        anything differs (what changed is :func:`code_changes`), or a value replaced says
        no bool to ``==`` (an array)."""
        try:
            return bool(self.lives == self.copies)
        except Exception:
            return False


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


def watch_code(
    kinds: Iterable[type], keyed: Iterable[Any] = (), named_classes: bool = True
) -> CodeWatch:
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
    it; the names of their modules their fingerprints looked up, each to the object it held
    (:class:`_Looked`: a helper or a value rebound since, a notebook's cell run again), and
    the namespaces of each helper class their code names or class they hold
    (:class:`_Bodies`: a value or a method set on it since, ``Config.by = 3``); each numpy
    array their classes hold, or their modules or a helper their code calls hold and it
    reads, itself or in a dict, list or tuple, or an object of those holds, by its bytes
    (:class:`Written`: ``MEANS[0] = 5.0``, ``H.m[0] = 5.0``), and each such tensor of
    their modules by its count of changes in place and, a small one on the CPU, its bytes
    (:class:`_Versions`: ``T[0] = 5.0``, ``T.data[0] = 5.0``), looked at only where one is
    read; and the count of functions given other code or defaults in place and classes
    given other bases, in this process (:data:`_SETS`: ``f.__code__ = ...``, as a reloader does,
    ``f.__defaults__ = (5,)``, ``Kind.__bases__ = ...``), which moves for any function or
    class, and sends the look to what the watch noted of these (:func:`code_changes`). The
    lives compare equal to the copies: each value by identity, else by ``==``, a number of a
    dict, list or slots only to the same number of the same type (:class:`_Exact`: ``2``
    replaced by ``2.0`` is seen); one whose ``==`` says no bool, an array, raises, and is
    taken as changed. The copies hold what they copy, so an old function cannot be followed
    by a new one at the same address.

    ``keyed`` are objects whose state the taker keys and watches itself (the modules of a
    model: their weights digested, their modes held or read where they are keyed): one that
    a function of theirs closes over, takes by default, a partial binds or their code reads
    from a name of their module (``self.encoder = SHARED``) is that very object, seen
    replaced by the watch of the cell, the defaults, the partial or the name, and what it
    holds is not read here — else freezing it (eval, no grad) would be taken for a change of
    the code of a class that merely reaches it (``def make(sub): class M: def
    __init__(s): s.encoder = sub``). One held in a list, tuple or dict (nested too), or in
    an object (a ``ModuleList``) that those reach, is compared there by which object it is
    and not read either: replaced in it, added or taken out (``parts[0] = other``), it is
    seen as a change of what holds it (:func:`_watch_objects`).

    ``named_classes`` False leaves out the namespaces of the helper classes their code names
    (:class:`_ClassSeen`), for a taker that runs their objects whole and keys what they
    compute by their own fingerprints (a wrapped model's cached parts)."""
    _hear_code_set()
    given = tuple(kinds)
    keyed = tuple(keyed)
    elsewhere = frozenset(id(held) for held in keyed)
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
    held_kinds: dict[type, None] = {}  # the classes of the objects they hold
    made: list[tuple[str, FunctionType, Any, Any, Any]] = []
    marks: list[Mark] = []
    arrays: dict[int, tuple[Any, str]] = {}  # the numpy arrays and tensors their code reads
    for kind in lineage:
        for name, member in list(vars(kind).items()):
            label = f"{kind.__qualname__}.{name}"
            if type(member) in _CONTAINERS and not _dunder(name):  # `{"m": np.array(...)}`
                _watch_arrays(member, label, arrays)
            fills = _kept_in_place(name, member) and name in kept  # changed by its node's forward
            holds = [] if fills else _held_in(member)
            if _counted(member) or _written_array(member):
                # a tensor or a numpy array, named by its values: changed in place between
                # forwards, seen at the next; by its node's own forward (a running mean), its
                # state
                noted = _Marked(member, label)
                marks.append(Mark(len(lives), member, noted, False, kind))
                lives += [noted.version, noted.lives]
                labels += [label, label]
            if fills:
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
            # `k = Knob()`, `acts = {"a": Scale()}`: what their classes' code looks up in
            # their module
            for held in _watch_objects(holds, label, kind, lives, labels, marks, elsewhere):
                held_kinds.update(dict.fromkeys(_not_library(type(held))))
            for function in _functions_in(member):
                keywords = function.__kwdefaults__
                made.append((label, function, function.__code__, function.__defaults__, keywords))
                if function.__closure__:  # a cell set by a function sharing it
                    lives.append(_Cells(function))
                    labels.append(label)
                if keywords:
                    lives.append(keywords)
                    labels.append(label)
            for keywords in _partial_keywords(member):  # `Kind.act.keywords["k"] = 3`
                lives.append(keywords)
                labels.append(label)
            if isinstance(member, type) and not _dunder(name) and not _left_out(member):
                # `make = Double`
                _watch_class(member, label, kind, lives, labels, marks, elsewhere)
    bodies: set[int] = set(map(id, lineage))
    for kind in lineage:  # `forward = scaled_by(Box)`: `Box.k = 3` since
        for name, member in list(vars(kind).items()):
            for closed in _classes_reached(_functions_in(member)):
                if id(closed) not in bodies:
                    bodies.add(id(closed))
                    at = f"{kind.__qualname__}.{name}"
                    _watch_class(closed, at, kind, lives, labels, marks, elsewhere)
    tables: set[int] = set()
    for kind in lineage:  # each table its code only reads, object of a helper class: marked
        found = _FINGERPRINTS.get(kind)
        for reads, name, was in found[1] if found is not None else ():
            by = reads()
            helper = was.held() if isinstance(was, _FunctionSeen) else None
            if helper is not None:  # what it closes over, takes by default: as a method's
                at = f"{helper.__module__}:{name}"
                holds = _closed_objects(helper) + _default_tables(name, helper)
                _watch_objects(holds, at, kind, lives, labels, marks, elsewhere)
                if helper.__closure__:  # a helper's cell set since
                    lives.append(_Cells(helper))
                    labels.append(at)
                if helper.__kwdefaults__:  # `helper.__kwdefaults__["by"] = 7`
                    lives.append(helper.__kwdefaults__)
                    labels.append(at)
                for closed in _classes_reached([helper]):  # `SCALE = scaled_by(Box)`
                    if id(closed) not in bodies:
                        bodies.add(id(closed))
                        _watch_class(closed, at, kind, lives, labels, marks, elsewhere)
            written = was.held() if isinstance(was, _ClassSeen) and named_classes else None
            if written is not None and id(written) not in bodies:  # `Config.by = 3` since
                bodies.add(id(written))
                at = f"{written.__module__}:{written.__qualname__}"
                _watch_class(written, at, kind, lives, labels, marks, elsewhere)
            wrapper = was.held() if isinstance(was, _HelperSeen) else None
            for keywords in _partial_keywords(wrapper):  # `helper.keywords["by"] = 4`
                lives.append(keywords)
                labels.append(name)
            if wrapper is not None:  # what it binds (`partial(scaled, BOX)`), changed in place
                _watch_objects(_bound_objects(wrapper), name, kind, lives, labels, marks, elsewhere)
            if isinstance(was, _ArraySeen) and by is not None:  # `MEANS[0] = 5.0` since
                space = _space_of(by)
                array = space.get(name, _ABSENT)
                at = f"{space.get('__name__', '')}:{name}"
                watched = _array_watch(array)  # `MEANS[0] = 5.0`, `T[0] = 5.0`
                if watched is not None:
                    arrays.setdefault(id(array), (watched, at))
                elif type(array) in _CONTAINERS:  # `TABLE["m"][0] = 5.0`, `TABLE["m"] = ...`
                    read = _watch_arrays(array, at, arrays)
                    lives += read
                    labels += [at] * len(read)
            if not isinstance(was, _HeldSeen) or by is None:
                continue
            table = _space_of(by).get(name, _ABSENT)
            if id(table) in tables or id(table) in elsewhere:
                continue  # a module of the model's (`self.encoder = SHARED`): keyed as its state
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
    looked = _Looked([*lineage, *held_kinds])
    if looked.names:  # a helper or a value of their modules rebound (a cell run again)
        lives.append(looked)
        labels.append("")
    for array, at in arrays.values():  # none read: nothing more to look at
        lives.append(array)
        labels.append(at)
    copies = list(map(_copied, lives))
    for mark in marks:  # one copy of what is read of it for all
        copies[mark.at + 1] = mark.noted.copies
        if mark.anew:  # marked anew as it is watched: the next look works fingerprints out
            copies[mark.at] = [None]
    lives.append(_SETS)
    copies.append(list(_SETS))
    mros = [(kind, kind.__mro__) for kind in lineage]
    return CodeWatch(lives, copies, lineage, given, labels, made, mros, marks, keyed)


def _watch_objects(
    holds: list[Any],
    label: str,
    kind: type,
    lives: list[Any],
    labels: list[str],
    marks: list[Mark],
    elsewhere: frozenset[int] = frozenset(),
) -> list[Any]:
    """Adds to a watch's ``lives`` (and ``labels``, ``marks``) what is read of each object of
    ``holds``, held by ``kind`` or by a helper its code names, where ``label`` says, but one
    whose state the watch's taker keys itself (``elsewhere``, by address: :func:`watch_code`): a
    container holding objects as a marked object is watched, each object in it as one held
    itself, so that what its node's forward changes in it (an object added to a log) is its
    state; one named by what it holds by each dict, list and set read of it; any other,
    marked by which object it is, by what is noted of it (:class:`_Marked`). An object of
    ``elsewhere`` in a container, or reached through an object (a ``ModuleList`` holding the
    model's modules), is compared there by which object it is and not read: a module of the
    model's put in eval is no change, one replaced, added or removed is. Returns the
    objects watched, those in such a container too."""
    read: list[Any] = []
    unnamed: list[Any] = []
    holds = [held for held in holds if id(held) not in elsewhere]
    watched = list(holds)
    for held in holds:
        if _contained_bytes(held, read, unnamed, watched, elsewhere) is not None:
            noted = _Marked(held, label, elsewhere)
            marks.append(Mark(len(lives), held, noted, False, kind))
            lives += [noted.version, noted.lives]
            labels += [label, label]
            continue
        reaching = _Marked(held, label, elsewhere) if elsewhere else None
        if reaching is not None and reaching.reaches:  # what of it is not keyed: read alone
            marks.append(Mark(len(lives), held, reaching, False, kind))
            lives += [reaching.version, reaching.lives]
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
    return watched


def _watch_class(
    helper: type,
    label: str,
    kind: type,
    lives: list[Any],
    labels: list[str],
    marks: list[Mark],
    elsewhere: frozenset[int] = frozenset(),
) -> None:
    """Adds to a watch's ``lives`` (and ``labels``, ``marks``) ``helper``, a class ``kind``'s
    code names or ``kind`` holds: its namespaces (:func:`_bodies`), and each table and
    object it and the classes it inherits from hold (:func:`_class_objects`) — a table
    marked from the start, as first seen (:func:`_sighted`), so that what ``kind``'s
    forward adds to it is its state; an object as one ``kind`` holds
    (:func:`_watch_objects`), a numpy array by its bytes too (:class:`Written`)."""
    read = _bodies(helper)
    lives += read
    labels += [label] * len(read)
    objects = []
    for _, name, held in _class_objects(helper):
        if _written_array(held):  # `Config.means[0] = 5.0`: by its bytes
            lives.append(Written(held))
            labels.append(label)
        if not _fillable(name, held):
            objects.append(held)
            continue
        noted, anew = _marked(held, label, table=True)
        marks.append(Mark(len(lives), held, noted, anew, kind))
        lives += [noted.version, noted.lives]
        labels += [label, label]
    _watch_objects(objects, label, kind, lives, labels, marks, elsewhere)


def _copied(live: Any) -> Any:
    """A copy of a dict, list, set, deque or array, or of a mappingproxy (a class's
    namespace) as a dict;
    of an object's slots (:class:`_Slots`), of names of modules (:class:`_Looked`) or of an
    enum's members (:class:`_MemberValues`), a list of what they hold. Each number a dict, a
    list, slots or cells hold is copied as an :class:`_Exact`, equal only to that number of
    that type."""
    if isinstance(live, (_Looked, _Versions, _MemberValues)):
        return live.values()
    if isinstance(live, Written):
        return looked_at(live.array)
    if isinstance(live, (_Slots, _Cells)):
        return list(map(_exact, live.values()))
    if isinstance(live, _Bodies):
        return list(map(_exact_items, live.values()))
    kind = type(live)
    if kind is collections.defaultdict:  # made with what it makes for a key it lacks
        return collections.defaultdict(live.default_factory, _exact_items(live))
    if kind is dict or kind is MappingProxyType or _items_base(kind) is dict:
        return _exact_items(live)  # `Params(dict)`'s as a dict
    if kind is list or _items_base(kind) is list:
        return list(map(_exact, list(live)))
    if kind is collections.deque:
        return collections.deque(map(_exact, list(live)), live.maxlen)
    if kind is array.array:
        return array.array(live.typecode, live)
    base = _items_base(kind) or kind
    if (base is set or base is frozenset) and not _all_text(live):
        return _ExactSet(live)
    return base(live)


class _Exact:
    """A number a watch copied (:func:`_copied`), or a tuple or frozenset of them, equal to
    what is read in its place only where that is the same number of the same type: ``==``
    alone takes ``2.0`` for ``2``, ``True`` for ``1`` and ``-0.0`` for ``0.0``, which code
    computes otherwise with. Only these are copied so, each costing a call at every look;
    one is told unchanged at once where it is the very value copied."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __eq__(self, other: object) -> bool:
        held = self.held
        return other is held or (type(other) is type(held) and repr(other) == repr(held))

    __hash__ = None  # type: ignore[assignment]


class _ExactSet:
    """A set a watch copied (:func:`_copied`), holding more than text: equal to what is read
    in its place only where that holds the same items, each said alike (``{2}`` is not
    ``{2.0}``, nor ``{0.0}`` ``{-0.0}``), as a set's ``==`` does not tell. Each look
    costs a reading of its items."""

    __slots__ = ("items", "said")

    def __init__(self, held: Any) -> None:
        self.items = set(held)
        self.said = sorted(map(repr, self.items))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, (set, frozenset))
            and other == self.items
            and sorted(map(repr, other)) == self.said
        )

    __hash__ = None  # type: ignore[assignment]


_TEXTS = frozenset({str, bytes})
"""The items a set a watch copies may hold and be copied as a set (:func:`_copied`): ``==``
takes no other for one of them."""


def _all_text(items: Any) -> bool:
    """Whether ``items`` (of a set, tuple or frozenset) are all text, which ``==`` takes
    nothing else for, so that a copy of them compared with ``==`` says whether they
    changed."""
    return all(type(item) in _TEXTS for item in items)


def _exact(value: Any) -> Any:
    """``value``, or an :class:`_Exact` of it where it is a number, or a tuple or frozenset
    holding more than text (``(2,)`` is not ``(2.0,)``)."""
    kind = type(value)
    if kind in _NUMBERS or (kind not in _NOT_NUMBERS and isinstance(value, numbers.Number)):
        return _Exact(value)
    if (kind is tuple or kind is frozenset) and not _all_text(value):
        return _Exact(value)
    return value


_NUMBERS = frozenset({int, float, complex, bool})


_NOT_NUMBERS = frozenset({str, bytes, type(None), FunctionType, type})
"""What :func:`_exact` tells is no number without asking :class:`numbers.Number`."""


def _exact_items(table: Any) -> dict[Any, Any]:
    """A dict of what ``table`` holds, each number as an :class:`_Exact` (:func:`_exact`),
    copied at once first (a class's namespace may be changed on another thread meanwhile)."""
    copied = dict(table)
    for key, value in copied.items():
        if type(value) not in _NOT_NUMBERS:
            copied[key] = _exact(value)
    return copied


def _unexact(value: Any) -> Any:
    """What :func:`_exact` made ``value`` of."""
    return value.held if type(value) is _Exact else value


_ABSENTS = itertools.repeat(_ABSENT)


def _watch_arrays(table: Any, label: str, arrays: dict[int, tuple[Any, str]]) -> list[Any]:
    """Adds to ``arrays`` each numpy array ``table``, a dict, list, tuple or set a node's
    code reads, holds, however nested (:func:`_held_arrays`), as :class:`Written`, and
    each tensor as its count of changes in place (:class:`_Versions`), held where ``label``
    says; returns each dict and list read to find them, none where it holds
    none (or is too large to read, named as its text writes it)."""
    try:
        found, read = _held_arrays(table)
    except _Unnamed:
        return []
    for held in found:
        watched = _array_watch(held)
        if watched is not None:
            arrays.setdefault(id(held), (watched, label))
    return read


def _array_watch(value: Any) -> Written | _Versions | None:
    """What watches ``value`` for a write in place: a numpy array by its bytes
    (:class:`Written`), a tensor by its count of changes in place (:class:`_Versions`);
    None for anything else."""
    if _written_array(value):
        return Written(value)
    if _counted(value):
        return _Versions(value)
    return None


class _Looked:
    """The names of their modules the fingerprints of classes looked up (:data:`Looked`),
    read as they are now: equal to a list of what they held, each the same object — so
    that a helper or a value rebound since (a notebook's cell run again) is seen by a
    graph built before, whose fingerprints are worked out again."""

    __slots__ = ("names", "spaces")

    def __init__(self, lineage: Iterable[type]) -> None:
        places = _places_looked(lineage)
        self.spaces = [space for space, _ in places]
        self.names = [name for _, name in places]

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


def _places_looked(
    lineage: Iterable[type], unwatched: bool = False
) -> list[tuple[dict[str, Any], str]]:
    """Each name of their modules the fingerprints of the classes ``lineage`` looked up
    (:data:`~somatize.catalog._names.Looked`), with the namespace it is read in, once each;
    ``unwatched``: only those holding what no watch looks into (:func:`objects_read`)."""
    places: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}
    for kind in lineage:
        found = _FINGERPRINTS.get(kind)
        for reads, name, was in found[1] if found is not None else ():
            by = reads()
            if by is not None and not (unwatched and isinstance(was, _HeldSeen)):
                space = _space_of(by)
                places.setdefault((id(space), name), (space, name))
    return list(places.values())


def objects_read(*kinds: type) -> list[tuple[dict[str, Any], str]]:
    """Each name of their modules that the code of ``kinds`` (and of the classes they inherit
    from, short of the library's) reads and that holds an object no watch looks into
    (:func:`watch_code`), with the namespace it is read in: one of the library's or of
    another package (``NORM = nn.LayerNorm(3)``, read by a forward or a helper it calls),
    which their fingerprint (:func:`fingerprint_of`, worked out here where it is not) names
    by the text that makes it, or by what says it, not by what it holds — and, with them,
    the names holding plain values, functions and classes, which a watch sees rebound. A
    taker that keys what such an object holds itself (a module's weights, changed in
    place) reads each name as it is now and picks its own; an object of a helper class of
    the code, or a table it only reads, is watched by its mark and not among them."""
    fingerprint_of(*kinds)
    lineage = dict.fromkeys(
        above for kind in kinds for above in _ancestry(kind) if not _left_out(above)
    )
    return _places_looked(lineage, unwatched=True)


def _bodies(helper: type) -> list[Any]:
    """What a watch compares of ``helper``, a helper class a node's code names
    (:class:`_ClassSeen`: ``Config.by``, ``Helper.scale(x)``) or a class a node's class holds
    (``make = Double``), so that a value or a method set on it since (``Config.by = 3``) is
    seen by a graph built before, whose fingerprints are worked out again: the namespace of
    it, of each class it inherits from and of its metaclass, short of the library's
    (:func:`_read_through`: ``Helper.by`` set on the metaclass too), compared in C with a
    copy — or, where their own code sets a name on one of them as it runs (a count: their
    state, not a change), a :class:`_Bodies` of them, which leaves it out; and the value
    of each member of an enum among them (:class:`_MemberValues`: ``Mode.A._value_ = 3``)."""
    kinds = _read_through(helper)
    state = _state_of(kinds, (member for kind in kinds for member in list(vars(kind).values())))
    spaces = [_Bodies(kinds, state)] if state else [vars(kind) for kind in kinds]
    members = {
        id(member): member
        for kind in kinds
        for member in list(vars(kind).values())
        if isinstance(member, enum.Enum) and type(member) is kind
    }
    return [*spaces, _MemberValues(list(members.values()))] if members else spaces


_VALUE = operator.attrgetter("_value_")


class _MemberValues:
    """The values of members of an enum (:func:`_bodies`), read as they are now: equal to a
    list of what they held, each the same object — so that one set in place
    (``Mode.A._value_ = 3``) is seen in one comparison made in C, however many members the
    enum has."""

    __slots__ = ("members",)

    def __init__(self, members: list[enum.Enum]) -> None:
        self.members = members

    def values(self) -> list[Any]:
        """The value of each member now."""
        return list(map(_VALUE, self.members))

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is list
            and len(other) == len(self.members)
            and all(map(operator.is_, map(_VALUE, self.members), other))
        )

    __hash__ = None  # type: ignore[assignment]


class _Bodies:
    """The namespaces of classes (:func:`_bodies`) read as they are now, but a name of
    ``state`` and a dunder that holds no function (``__slotnames__``, which a copy adds):
    equal to a list of what they held, each number that very number (:class:`_Exact`)."""

    __slots__ = ("spaces", "state")

    def __init__(self, kinds: list[type], state: frozenset[str]) -> None:
        self.spaces = [vars(kind) for kind in kinds]
        self.state = state

    def values(self) -> list[dict[str, Any]]:
        """What each namespace holds now, but what is left out of it."""
        return [
            {
                name: member
                for name, member in list(space.items())
                if name not in self.state and (not _dunder(name) or _holds_code(member))
            }
            for space in self.spaces
        ]

    def __eq__(self, other: object) -> bool:
        return bool(self.values() == other)

    __hash__ = None  # type: ignore[assignment]


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
        if runner is None or _array(runner):  # an array: by its values
            return []
        return [runner]
    held = [held for function in functions for held in _closed_objects(function)]
    return held + _bound_objects(member)


def code_changes(watch: CodeWatch) -> list[str]:
    """What changed in the classes ``watch`` (:func:`watch_code`) holds since it was taken,
    that a fingerprint reads: ``Kind.name`` for each name set, added or deleted — not a
    dunder that holds no function (``__slotnames__``, which a copy of an instance adds,
    ``__annotations__``, which reading it adds), nor a value, set, added or deleted, that
    the code of the classes sets on one of them as it runs (``type(self).calls += 1`` in a
    subclass, the counter declared on its base; a model loaded once, ``type(self)._model =
    load()``: their state), unless it holds a function — for each object it
    holds named by what it holds, changed in place, and for each function given other
    code or defaults in place; ``Kind.__bases__`` for a class given other bases."""
    changed = []
    stored: frozenset[str] | None = None
    kinds = watch.kinds
    spaces, copies = watch.lives[: len(kinds)], watch.copies[: len(kinds)]
    for space, copied, kind in zip(spaces, copies, kinds, strict=True):
        for name in dict.fromkeys([*space, *copied]):
            now, was = space.get(name, _ABSENT), _unexact(copied.get(name, _ABSENT))
            if now is was or (not _holds_code(now) and not _holds_code(was) and _dunder(name)):
                continue
            if not _holds_code(now) and not _holds_code(was):
                if stored is None:  # what the classes' own code sets on one of them: state
                    stored = _state_of(kinds, (_unexact(m) for c in copies for m in c.values()))
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


def names_rebound(watch: CodeWatch, fingerprint: str) -> list[str]:
    """``module:name`` for each name of their modules that the fingerprints of ``watch``'s
    classes looked up (:class:`_Looked`) and that holds another object since it was taken —
    a value or a helper rebound, a notebook's cell run again — where the fingerprint of those
    classes now is not ``fingerprint``, the one worked out with the watch: none for a helper
    defined again with the same code. :func:`code_changes` does not say them, as a graph
    works its fingerprints out again; a taker that keeps what the old code computed under
    one fingerprint, or runs it as it was traced, asks this after it."""
    for live, copied in zip(watch.lives, watch.copies, strict=True):
        if not isinstance(live, _Looked):
            continue
        rebound = [
            (space.get("__name__", ""), name, was, now)
            for space, name, was, now in zip(
                live.spaces, live.names, copied, live.values(), strict=True
            )
            if now is not was
        ]
        if rebound and fingerprint_of(*watch.given) != fingerprint:
            # A cell run again rebinds every name it defines: those the fingerprint notes
            # alike (the same number, a helper with the same code) are not what changed.
            said = [(module, name) for module, name, was, now in rebound]
            unlike = [
                (module, name)
                for module, name, was, now in rebound
                if not _noted_alike(was, now, module, name)
            ]
            return [f"{module}:{name}" for module, name in unlike or said]
    return []


def _noted_alike(was: Any, now: Any, module: str, name: str) -> bool:
    """Whether ``was`` and ``now``, what ``name`` of ``module`` held when a watch was taken
    and holds now, are noted alike by a fingerprint (:func:`_found_as`): the same plain
    value, a function or helper class written the same, a tensor of the same values. Any
    other (a module, a partial) is not taken as alike."""
    try:
        then, since = _found_as(was, module, name), _found_as(now, module, name)
        if then is _OTHER and since is _OTHER:  # a tensor is named by its values
            noted = _opaque_bytes(was)
            return (
                noted is not None and noted.startswith(b"tensor ") and noted == _opaque_bytes(now)
            )
        if then is _OTHER or since is _OTHER or type(then) is not type(since):
            return False
        if isinstance(then, _FunctionSeen):  # noted by identity: by how each is written
            return _function_bytes(was) == _function_bytes(now)
        if isinstance(then, _ClassSeen):
            return bool(then.code == since.code)
        if isinstance(then, _HelperSeen):
            return False
        return bool(then == since)
    except Exception:  # a value whose `==` says no bool
        return False


def watched_again(watch: CodeWatch) -> CodeWatch:
    """``watch`` (:func:`watch_code`) taken again of the same classes, as they are now."""
    return watch_code(watch.given, watch.keyed)


def _holds_code(member: Any) -> bool:
    return member is not _ABSENT and bool(_functions_in(member))
