"""What a function's instructions do to the tables and classes it names, read from its bytecode.

Which tables (:func:`~somatize.catalog._members._table`) a class's functions change in place
as a node is made, or as it runs, and which objects it holds they set attributes of
(:func:`_fillers`), which attributes they set on a class
as they run — its state, not its code (:func:`_state_of`) —, and which names they read
and assign. Each is worked out once per code object.
"""

from __future__ import annotations

import dis
import functools
import itertools
import weakref
from collections.abc import Iterable
from types import (
    CodeType,
    FunctionType,
)
from typing import Any

from somatize.catalog._members import _fillable, _functions_in, _settable

_FILLERS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove"}
    | {"discard", "clear", "sort", "reverse", "__setitem__", "__delitem__"}
    | {"appendleft", "extendleft", "popleft", "rotate", "subtract", "fromlist", "frombytes"}
)
"""What a dict, list or set, or a deque, a Counter or an array, is changed in place by,
called."""


def _fillers(lineage: Iterable[type]) -> tuple[frozenset[str], frozenset[str]]:
    """The names of the tables (:func:`~somatize.catalog._members._fillable`: a ``deque``
    too) the classes of ``lineage`` hold that a function of theirs run as a node is made
    changes in place (``self.built["n"] += 1``, ``type(self).names.add(name)`` in
    ``__init__`` or a method it calls), and of those the
    others do (``forward``, a method its user calls, ``Kind.register("a", 3)``), with the
    objects they hold that the others set an attribute of (``self.ns.n += 1``:
    :func:`_objects_set_by`). The first
    are their state, as a count a class moves on itself is, taken as the class's text
    writes it and not watched — changed as a node is made, it would make every graph built
    after drift. One only the others fill (a memo, ``self._memo[x] = y``; a registry of
    values) is named as the class's text writes it where it held that when first seen, the
    same in every process, else by what it holds (:func:`_sighted`), and watched, so that
    a change made to it between forwards is seen; what its node's forward changes in it is
    its state."""
    kinds = list(lineage)
    tables = frozenset(n for k in kinds for n, m in list(vars(k).items()) if _fillable(n, m))
    objects = frozenset(n for k in kinds for n, m in list(vars(k).items()) if _settable(n, m))
    if not tables and not objects:
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
            others |= _objects_set_by(function.__code__, objects)
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


def _item_read(instructions: list[dis.Instruction], at: int) -> bool:
    """Whether the steps from ``at`` read an item of what was read before them, by a key of
    one step (``self.acts["scale"]``, ``self.memo[x]``)."""
    ahead = instructions[at : at + 2]
    if len(ahead) < 2 or ahead[0].opname not in _KEY_LOADS:
        return False
    read = ahead[1]  # a subscript is a binary operation of its own from Python 3.14
    return read.opname == "BINARY_SUBSCR" or (read.opname == "BINARY_OP" and read.argrepr == "[]")


_STATEMENT_ENDS = frozenset(
    {"POP_TOP", "RETURN_VALUE", "RETURN_CONST", "STORE_FAST", "STORE_DEREF", "STORE_NAME"}
    | {"STORE_GLOBAL", "STORE_ATTR", "STORE_SUBSCR", "RAISE_VARARGS", "YIELD_VALUE"}
)
"""What ends a statement that reads a table, or hands it on other than to a call."""


def _tables_handed_by(code: CodeType, tables: set[str]) -> set[str]:
    """Which of ``tables`` the code ``code`` (and that nested in it) reads as an attribute
    and hands on to a call in the same statement (``_remember(self._memo, x, y)``, its
    arguments written over lines too): to a function that may fill it — not one it reads
    an item of there (``self.acts["scale"](x)``), which it hands nothing."""
    found: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for at, instruction in enumerate(instructions):
        if instruction.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            continue
        if instruction.argval not in tables or at + 1 == len(instructions):
            continue
        if instructions[at + 1].opname in _READ_ON or _item_read(instructions, at + 1):
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


_LOCAL_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_DEREF")
"""How a function's code reads one of its arguments, or a function nested in it the same."""


_GLOBAL_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")
"""How a function's code reads a name of its module."""


def _state_of(kinds: Iterable[type], members: Iterable[Any]) -> frozenset[str]:
    """The names the functions among ``members`` (what classes hold) assign or delete on a
    class of ``kinds`` as they run — their state, not their code: ``type(self).calls += 1``,
    ``self.__class__.x``, ``cls.x`` in a classmethod, or the class named outright
    (``Kind.x``). A name set on an instance (``self.factor = factor``) is not one of them,
    nor one ``__init_subclass__`` sets on the class it is made for (``cls.scale = 2``): that
    is what the class is, declared as it is made, and named by its value; one it sets on a
    class it names (a count of subclasses, ``Base.made += 1``) is state, so that the order
    classes are imported in does not move a fingerprint."""
    classes = {id(kind) for kind in kinds}
    names: set[str] = set()
    for member in members:
        on_class = isinstance(member, classmethod)
        for function in _functions_in(member):
            declares = function.__name__ == "__init_subclass__"
            for owner, name in _stores_by(function, on_class):
                named = owner is not None and id(function.__globals__.get(owner)) in classes
                if named or (owner is None and not declares):
                    names.add(name)
    return frozenset(names)


def _stores_by(function: FunctionType, on_class: bool) -> frozenset[tuple[str | None, str]]:
    """What ``function``'s code sets on a class (:func:`_stores_of`), kept by function
    (:data:`_STORES`) while it holds that code."""
    code = function.__code__
    found = _STORES.get(function)
    if found is None or found[0] is not code:
        found = _STORES[function] = (code, [None, None])
    stores = found[1][on_class]
    if stores is None:
        stores = found[1][on_class] = _stores_of(code, on_class)
    return stores


_STORES: weakref.WeakKeyDictionary[
    FunctionType, tuple[CodeType, list[frozenset[tuple[str | None, str]] | None]]
] = weakref.WeakKeyDictionary()
"""A function → its code and what that code sets on a class (:func:`_stores_of`), its first
argument taken as an instance, then as the class (None: not worked out yet), looked up
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
    if not _sets_attributes(code):  # no step to read: nothing found by reading them
        return frozenset()
    first = code.co_varnames[0] if code.co_argcount else None
    return _stores_in(code, first, on_class, nested=False)


_ATTRIBUTE_SETS = frozenset({dis.opmap["STORE_ATTR"], dis.opmap["DELETE_ATTR"]})


def _sets_attributes(code: CodeType) -> bool:
    """Whether ``code``, or code nested in it, may set or delete an attribute: one of its
    steps, each two bytes, the first saying what it does, is ``STORE_ATTR`` or
    ``DELETE_ATTR`` — told without laying out its steps (:func:`_stores_in`)."""
    if not _ATTRIBUTE_SETS.isdisjoint(code.co_code[::2]):
        return True
    return any(isinstance(c, CodeType) and _sets_attributes(c) for c in code.co_consts)


def _stores_in(
    code: CodeType, first: str | None, on_class: bool, nested: bool
) -> frozenset[tuple[str | None, str]]:
    steps = _steps_of(code)
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
        end = _target_end(steps, at)
        owner = target(end) if end > 0 else False
        if owner is not False:
            found.add((owner if isinstance(owner, str) else None, str(name)))
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _stores_in(constant, first, on_class, nested=True)
    return frozenset(found)


def _steps_of(code: CodeType) -> list[tuple[str, Any, bool]]:
    """The steps of ``code``, each by what it does, what it names and whether a jump lands
    on it."""
    return [
        (step.opname, step.argval if step.arg is not None else None, step.is_jump_target)
        for step in dis.get_instructions(code)
    ]


def _target_end(steps: list[tuple[str, Any, bool]], at: int) -> int:
    """Where the steps leave the object whose attribute the step ``at`` (``STORE_ATTR``,
    ``DELETE_ATTR``) sets on top of the stack: the step after the one that reads it, or
    -1 where that is not told. In an augmented assignment (``+=``) it is what was copied
    to read the attribute."""
    op, name, _ = steps[at]
    if op != "STORE_ATTR" or at < 1 or steps[at - 1][:2] not in _SWAPS:
        return at
    for back in range(at - 2, 0, -1):
        if steps[back][:2] == ("LOAD_ATTR", name) and steps[back - 1][:2] in _COPIES:
            return back - 1
    return -1


def _objects_set_by(code: CodeType, objects: frozenset[str]) -> frozenset[str]:
    """Which of ``objects``, names of objects a class holds, ``code`` (and that nested in
    it) reads as an attribute (``self.ns``, ``type(self).ns``), or into a local from there
    (``ns = self.ns``), and sets or deletes an attribute of (``self.ns.n += 1``), by name
    too (:func:`_set_by_name`), worked out once per code object (:data:`_OBJECTS_SET`)."""
    if not objects or not (_sets_attributes(code) or _names_any(code, _BY_NAME)):
        return frozenset()
    found = _OBJECTS_SET.setdefault(code, {})
    named = found.get(objects)
    if named is None:
        named = found[objects] = _objects_set_in(code, objects, {})
    return named


_OBJECTS_SET: weakref.WeakKeyDictionary[CodeType, dict[frozenset[str], frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)
"""A function's code → which of some objects it sets an attribute of (:func:`_objects_set_by`)."""


def _objects_set_in(
    code: CodeType, objects: frozenset[str], aliases: dict[str, str]
) -> frozenset[str]:
    """:func:`_objects_set_by`, read from the steps, with ``aliases``: a local of the code
    around it → the object it was read from."""
    steps = _steps_of(code)
    aliases = dict(aliases)
    for (op, name, _), (stored, local, _) in itertools.pairwise(steps):
        if op == "LOAD_ATTR" and name in objects and stored in _ALIAS_STORES:
            aliases[str(local)] = name

    def held_at(at: int) -> str | None:
        """The object of ``objects`` the step ``at`` reads, if it reads one."""
        read, name, _ = steps[at]
        if read == "LOAD_ATTR" and name in objects:
            return str(name)
        if read in _LOCAL_LOADS and name in aliases:
            return aliases[name]
        return None

    found: set[str] = set()
    for at, (op, _, _) in enumerate(steps):
        if op in ("STORE_ATTR", "DELETE_ATTR"):
            end = _target_end(steps, at)
            held = held_at(end - 1) if end >= 1 else None
        else:
            held = held_at(at) if _set_by_name(steps, at) else None
        if held is not None:
            found.add(held)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _objects_set_in(constant, objects, aliases)
    return frozenset(found)


_BY_NAME = frozenset({"setattr", "delattr", "vars", "__dict__"})
"""What code sets an object's attributes by name through: the builtins, and its table."""


_SIMPLE_READS = frozenset(
    {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF", "LOAD_GLOBAL"}
    | {"LOAD_ATTR", "PRECALL", "CALL", "PUSH_NULL"}
)
"""The steps that read an object a class holds (``self.ns``, ``type(self).ns``, a local)."""


def _set_by_name(steps: list[tuple[str, Any, bool]], at: int) -> bool:
    """Whether the object the step ``at`` leaves on top of the stack has an attribute set
    or deleted by name right after: handed first to ``setattr`` or ``delattr`` with a
    constant name (``setattr(self.ns, "n", 1)``), or an item of its ``vars`` or
    ``__dict__`` set, deleted or filled (``vars(self.ns)["n"] = 1``)."""
    following = steps[at + 1][:2] if at + 1 < len(steps) else (None, None)
    if following == ("LOAD_ATTR", "__dict__"):
        return _filled_at(steps, at + 2)
    called = None
    for back in range(at - 1, max(at - 6, -1), -1):  # the call the object is read for
        op, name, jumped = steps[back]
        if op in ("LOAD_GLOBAL", "LOAD_NAME") and name in _BY_NAME:
            called = name
            break
        if op not in _SIMPLE_READS or jumped:
            break
    if called in ("setattr", "delattr"):
        return following[0] == "LOAD_CONST" and isinstance(following[1], str)
    if called != "vars":
        return False
    after = at + 1
    if after < len(steps) and steps[after][0] == "PRECALL":
        after += 1
    return after < len(steps) and steps[after][0] == "CALL" and _filled_at(steps, after + 1)


def _filled_at(steps: list[tuple[str, Any, bool]], at: int) -> bool:
    """Whether the steps from ``at`` set or delete an item of the table on top of the
    stack, one key read away, or call a method of :data:`_FILLERS` on it."""
    if at >= len(steps):
        return False
    op, name, _ = steps[at]
    if op in ("LOAD_ATTR", "LOAD_METHOD"):
        return name in _FILLERS
    stores = ("STORE_SUBSCR", "DELETE_SUBSCR")
    return op in _KEY_LOADS and at + 1 < len(steps) and steps[at + 1][0] in stores


def _names_any(code: CodeType, names: frozenset[str]) -> bool:
    """Whether ``code``, or code nested in it, names one of ``names`` (a global, an
    attribute): told without laying out its steps."""
    if not names.isdisjoint(code.co_names):
        return True
    return any(isinstance(c, CodeType) and _names_any(c, names) for c in code.co_consts)


def _named_by(code: CodeType, opnames: tuple[str, ...]) -> set[str]:
    """The names the steps ``opnames`` of ``code``, and of its nested code, name."""
    names = {step.argval for step in dis.get_instructions(code) if step.opname in opnames}
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _named_by(constant, opnames)
    return names


def _cells_set_by(function: FunctionType) -> frozenset[str]:
    """The free variables ``function``'s code sets as it runs (:func:`_cells_set_in`), kept
    by function (:data:`_CELLS_SET`) while it holds that code."""
    code = function.__code__
    found = _CELLS_SET.get(function)
    if found is None or found[0] is not code:
        found = _CELLS_SET[function] = (code, _cells_set_in(code))
    return found[1]


_CELLS_SET: weakref.WeakKeyDictionary[FunctionType, tuple[CodeType, frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)
"""A function → its code and the free variables that code sets (:func:`_cells_set_in`),
looked up by the function rather than by its code, as :data:`_STORES` is."""


def _cells_set_in(code: CodeType) -> frozenset[str]:
    """The free variables ``code`` assigns or deletes, itself or in code nested in it that
    closes over the same cell (``nonlocal calls; calls += 1``): the state of the function
    as it runs, not what it is made of."""
    names = {
        step.argval
        for step in dis.get_instructions(code)
        if step.opname in ("STORE_DEREF", "DELETE_DEREF") and step.argval in code.co_freevars
    }
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _cells_set_in(constant) & set(code.co_freevars)
    return frozenset(names)


def _stored_in(code: CodeType) -> set[str]:
    """The global names ``code`` assigns or deletes, and its nested code too."""
    return _named_by(code, ("STORE_GLOBAL", "DELETE_GLOBAL"))


def _names_in(code: CodeType) -> set[str]:
    """The global and attribute names ``code`` uses, and its nested code too."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _names_in(constant)
    return names


def globals_read(code: CodeType) -> frozenset[str]:
    """The names ``code`` reads (or assigns, or deletes) as globals, and the code it holds
    (a lambda, a comprehension, a function defined in it) in turn — not those it reads as
    attributes (``self.encoder``, ``tools.double``: ``tools`` alone), which its code's
    names (``co_names``) hold too, so that a global of the same name is none it reads.
    Worked out once per code object (:data:`_GLOBALS_READ`)."""
    found = _GLOBALS_READ.get(code)
    if found is None:
        found = _GLOBALS_READ[code] = frozenset(_named_by(code, _GLOBAL_STEPS))
    return found


_GLOBAL_STEPS = (*_GLOBAL_LOADS, "LOAD_FROM_DICT_OR_GLOBALS", "STORE_GLOBAL", "DELETE_GLOBAL")
"""The steps that name a global: read (in a class body, or an annotation's scope from
Python 3.12, through its own names first), assigned or deleted."""


_GLOBALS_READ: weakref.WeakKeyDictionary[CodeType, frozenset[str]] = weakref.WeakKeyDictionary()
"""A code object → the names it reads as globals (:func:`globals_read`)."""


def _attributes_read(code: CodeType) -> set[str]:
    """The names ``code``, and its nested code, reads as attributes (``tools.double``:
    ``double``)."""
    return _named_by(code, ("LOAD_ATTR", "LOAD_METHOD"))


def imports_in(code: CodeType) -> tuple[frozenset[tuple[str, int]], frozenset[str]]:
    """What ``code``, and its nested code, imports as it runs (``from .config import
    FACTOR`` inside a function, to put off a heavy import or break a cycle): each module
    named, with how many levels up its package it is found (0: by its whole name), and the
    names taken from one (``FACTOR``). Worked out once per code object
    (:data:`_IMPORTS`)."""
    found = _IMPORTS.get(code)
    if found is None:
        found = _IMPORTS[code] = (
            frozenset(_modules_imported(code)),
            frozenset(_named_by(code, ("IMPORT_FROM",))),
        )
    return found


def _modules_imported(code: CodeType) -> set[tuple[str, int]]:
    """The modules ``code``, and its nested code, imports, each with its level."""
    steps = list(dis.get_instructions(code))
    found = set()
    for at, step in enumerate(steps):
        if step.opname == "IMPORT_NAME" and at >= 2 and steps[at - 2].opname in _CONSTANT_LOADS:
            level = steps[at - 2].argval
            found.add((step.argval, level if isinstance(level, int) else 0))
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _modules_imported(constant)
    return found


_CONSTANT_LOADS = ("LOAD_CONST", "LOAD_SMALL_INT")
"""The steps that load an import's level: a small number is loaded by its own from Python
3.14."""


_IMPORTS: weakref.WeakKeyDictionary[CodeType, tuple[frozenset[tuple[str, int]], frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)
"""A code object → what it imports as it runs (:func:`imports_in`)."""
