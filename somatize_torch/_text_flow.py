"""Where the text the model's code makes of a value fx stands in for goes, read from the
code that makes it.

The text of a stand-in (``str(x.dtype)``) is its name whatever a call gives, and a
:class:`~somatize_torch._modes._Text` refuses to be compared, looked up or read as the
forward is traced. Python's own code puts it into plain text the model's code can then ask
anything without a word: ``"{}!".format(...)``, ``"%s" % (...,)``, ``"-".join([...])``,
``f"a {...}"``. So where the model's code makes such text, the instructions after are
followed, the value and the text made of it on the stack, in locals, lists and tuples,
round loops, into the comprehensions and generator expressions handed it, and through
what the function returns, to what is done with it: compared, looked up, searched or
read (refused), or handed to a call (a message, a log record), stored on an object or
dropped (let be); what a call not of the model's hands back, handed it, is followed as
text, its code not read to tell what it makes of it. Each place is read once, when a
trace first makes text there, and never as the trace runs otherwise.
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import linecache
import sys
import types
from collections.abc import Iterable
from typing import Any, NamedTuple

__all__ = ["asked_at"]

_TEXT, _HOLDER, _KEYED = "text", "holder", "keyed"
"""What a followed value is: text, a list, tuple or dict holding text, or a dict keyed by
text (which compares its keys with what it is looked up by) or what else a dict may be
made of keyed so (a list of lists of pairs, a pair whose second is followed too)."""

_PAIR, _PAIRS = "pair", "pairs"
"""A pair whose first is text and whose second is not followed (``(name, 2.0)``), and a
list, tuple or iterator of such pairs: what a dict keyed by the text is made of, told
apart so that the text read out of a pair read out of the list (``pairs[0][0]``) is the
text, not an item read out of it."""

_TEXT_OR_KEYED = "text or keyed"
"""What an item read by place out of a value followed as keyed, or gone over in a loop,
is: text (a key, or a value the dict holds), or keyed by it (a list of pairs out of a
list of them), followed as each."""

_KINDS = frozenset({_TEXT, _HOLDER, _KEYED, _PAIR, _PAIRS})
_KEYED_KINDS = frozenset({_KEYED, _PAIR, _PAIRS})
"""What is looked up, or read by what is not a place, as a dict keyed by text would be."""

_MAKES_TEXT = frozenset(
    {"str", "repr", "ascii", "format", "format_map", "join", "__str__", "__repr__"}
    | {"__format__", "__add__", "__radd__", "__mod__", "__rmod__", "__mul__", "lower"}
    | {"upper", "strip", "lstrip", "rstrip", "replace", "casefold", "title", "capitalize"}
    | {"removeprefix", "removesuffix", "zfill", "center", "ljust", "rjust", "swapcase"}
)
_MAKES_TEXT |= {"dumps", "sub", "subn", "escape", "quote", "shorten", "fill", "dedent"}
_MAKES_TEXT |= {"indent", "basename", "dirname", "normpath", "expandtabs", "translate"}
"""Calls that make more text of text handed to them (those of ``json``, ``re``,
``textwrap`` and ``os.path`` among them)."""

TEXT_METHODS = frozenset(name for name in _MAKES_TEXT if hasattr(str, name) and name[0] != "_")
"""Methods of text that make more text of it (``name.upper()``): put into a message, let
be, as the text is."""

_TEXT_ONLY = frozenset(dir(str)).difference(*map(dir, (list, tuple, dict, set, type(iter(())))))
"""Attributes of text that no list, tuple, dict, set or iterator has."""

_ASKS = frozenset(
    {"get", "index", "count", "setdefault", "pop", "remove", "discard", "startswith"}
    | {"endswith", "find", "rfind", "rindex", "split", "rsplit", "partition", "__eq__"}
    | {"__ne__", "__contains__", "__getitem__", "__hash__", "len", "hash", "getattr"}
    | {"hasattr", "int", "float", "bool", "ord", "sorted", "set", "frozenset", "fromkeys"}
    | {"isdigit", "isalpha", "isnumeric", "fullmatch", "match", "search", "min", "max"}
    | {"Counter", "eq", "ne", "lt", "le", "gt", "ge", "contains", "countOf", "indexOf"}
)
"""Calls that ask something of text handed to them, or look something up by it (those of
``operator`` among them)."""

_COUNTS = frozenset({"len", "bool", "getattr", "hasattr"})
"""Calls of :data:`_ASKS` that ask nothing of the texts in a list, tuple or dict."""

_SEARCHES = frozenset({"index", "count", "remove", "discard", "sort", "__contains__", "__eq__"})
"""Methods of a list, set or dict holding text that compare its items (or keys)."""

_LOOKUPS = frozenset({"get", "pop", "setdefault", "__getitem__"})
"""Methods of a dict keyed by text that compare its keys with what they are handed."""

_ITEMS = _LOOKUPS | {"popitem"}
"""Methods of a list or dict holding text that hand out one of its items."""

_HOLDS = frozenset({"list", "tuple", "reversed", "iter", "map", "filter", "enumerate"})
"""Calls that make a list, tuple or iterator of what they are handed, or of what is made of
its items; handed text, they read it letter by letter."""

_REMAKES = frozenset({"map", "filter", "enumerate"})
"""Calls of :data:`_HOLDS` whose items are made of the items they are handed (numbered,
say), not those items."""

_TAKES = frozenset({"next"})
"""Calls that hand out an item of the iterator they are handed."""

_PUTS = frozenset({"append", "extend", "insert", "add", "update", "__setitem__"})
"""Methods that put what they are handed into the object they are called on."""

_PUTS_KEYED = frozenset({"add", "update"})
"""Methods of :data:`_PUTS` of a set, which compares what it is handed with what it holds
(or of a dict, keyed so where what it is handed is)."""

_ADDS = frozenset({"LIST_APPEND", "SET_ADD", "MAP_ADD", "LIST_EXTEND", "SET_UPDATE"})
_ADDS |= {"DICT_UPDATE", "DICT_MERGE"}
"""Instructions that put what they take into the list, set or dict their argument says
how deep on the stack it is (a comprehension's, ``[*names]``)."""

_GOES = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP"})
_GOES |= {"JUMP_ABSOLUTE", "JUMP_NO_INTERRUPT"}
"""Jumps taken whatever the stack holds: a loop's way back among them."""

_PEEKS = frozenset({"FOR_ITER", "GET_LEN", "MATCH_MAPPING", "MATCH_SEQUENCE", "MATCH_KEYS"})
"""Instructions that read what is on the stack and leave it there, putting what they make
of it above: an iterator's item, what a `match` statement asks of its subject."""

_MOVES = frozenset({"COPY", "SWAP", "DUP_TOP", "ROT_TWO"})
"""Instructions that copy or swap what is on the stack (a chained comparison's, a `match`
statement's, ``table[key] += ...``)."""

_MAKES_FUNCTION = frozenset({"MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE"})

_ASKED_OPS = frozenset({"COMPARE_OP", "CONTAINS_OP", "IS_OP", "BINARY_SUBSCR"})
_STORE_LOCAL = frozenset({"STORE_FAST", "STORE_NAME", "STORE_DEREF"})
_LOAD_LOCAL = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_NAME"})
_LOAD_LOCAL |= {"LOAD_DEREF", "LOAD_CLOSURE"}
_LOAD_GLOBAL = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_LOAD_ATTRIBUTE = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_CALLEE = _LOAD_ATTRIBUTE | _LOAD_GLOBAL | (_LOAD_LOCAL - {"LOAD_CLOSURE"})
"""Loads of what a call calls that name it."""
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_STEPS = 200000
"""The most instructions one reading follows (paths forked at each branch), to bound it."""

_READ: dict[tuple[Any, ...], tuple[Any, Any]] = {}
"""Per function's code (by id, kept with it) and place, what :func:`_follow` found."""


def _kept(kept: dict[Any, tuple[Any, Any]], key: Any, code: Any, make: Any, most: int) -> Any:
    """What ``make()`` makes, made once per ``key`` and kept in ``kept`` beside ``code``,
    whose id ``key`` names (another code at that id later is no hit); ``kept`` is emptied
    once it holds ``most``, to bound it."""
    found = kept.get(key)
    if found is not None and found[0] is code:
        return found[1]
    if len(kept) >= most:
        kept.clear()
    made = make()
    kept[key] = (code, made)
    return made


class _Slot:
    """A value on the stack: whether it is followed (text or a holder of it, else None),
    the instruction that put it there, and the local it was loaded from."""

    __slots__ = ("kind", "local", "pusher")

    def __init__(self, kind: str | None, pusher: dis.Instruction | None, local: str | None) -> None:
        self.kind, self.pusher, self.local = kind, pusher, local


_UNKNOWN = _Slot(None, None, None)

_Places = tuple[tuple[types.CodeType, int], ...]
"""Where a call is made: its code and offset there — the function's, or a comprehension's
in it, then the code and offset of the call that runs that comprehension, and so on out
to the function's."""


class _Handed(NamedTuple):
    """A call a followed value is handed to: the name called, the slot of what was loaded
    to call it, the value's place among the call's arguments, how many those are, its kind,
    the names of those given by keyword (the last ones), the local each argument was
    loaded from, and where it is made."""

    name: str
    by: _Slot
    at: int  # -1 where it is spread into the call (`pick(*names)`), -2 by name (`**notes`)
    arguments: int
    kind: str
    keywords: tuple[str, ...]
    loaded: tuple[str | None, ...]
    places: _Places

    def made_in(self, outward: _Places) -> _Handed:
        """The call, made in a comprehension that the call at ``outward`` runs."""
        return self._replace(places=self.places + outward)


_Filled = frozenset[tuple[str, str]]
"""Locals (or parameters) holding a list, tuple or dict followed values are put into, each
with what it is followed as once they are (holding text, or keyed by it)."""

_Found = tuple[str, Any, list[_Handed], _Filled]
"""What :func:`_follow` finds: where the value goes (where asked, the code and the
instruction that asks it), the calls it is handed to, and the parameters whose list,
tuple or dict it is put into (`names.append(...)`), with what each is followed as."""


_POPS: dict[tuple[str, int], tuple[None, int | None]] = {}
"""What :func:`_pops` found, per instruction's name and argument."""


def _pops(one: dis.Instruction) -> int | None:
    """How many values ``one`` takes off the stack, where it is known here."""
    key = (one.opname, one.arg or 0)
    return _kept(_POPS, key, None, lambda: _pops_of(*key), 4096)  # type: ignore[no-any-return]


def _pops_of(name: str, arg: int) -> int | None:
    """How many values the instruction ``name`` with argument ``arg`` takes off the stack,
    where it is known here: ``dis.stack_effect`` gives only what it puts back less that."""
    if name in ("LOAD_ATTR", "LOAD_METHOD", "FORMAT_SIMPLE", "CONVERT_VALUE", "TO_BOOL"):
        return 1
    if name.startswith("LOAD_") or name in ("PUSH_NULL", "NOP", "PRECALL", "KW_NAMES"):
        return 0
    if name in ("RESUME", "CACHE", "EXTENDED_ARG", "JUMP_FORWARD", "COPY_FREE_VARS"):
        return 0
    if name in _ASKED_OPS or name.startswith("BINARY_") or name == "FORMAT_WITH_SPEC":
        return 2
    if name in ("BUILD_LIST", "BUILD_TUPLE", "BUILD_SET", "BUILD_STRING"):
        return arg
    if name == "BUILD_MAP":
        return 2 * arg
    if name == "BUILD_CONST_KEY_MAP":
        return arg + 1
    if name in ("LIST_APPEND", "SET_ADD", "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE"):
        return 1
    if name == "FORMAT_VALUE":
        return 2 if arg & 0x04 else 1
    if name == "MAKE_FUNCTION":  # its code, up to 3.10 its name, and what its flags say
        if sys.version_info >= (3, 13):
            return 1
        return bin(arg & 0x0F).count("1") + (1 if sys.version_info >= (3, 11) else 2)
    if name == "SET_FUNCTION_ATTRIBUTE":
        return 2
    if name in ("CALL", "CALL_METHOD", "CALL_FUNCTION_KW"):
        return arg + 2
    if name == "CALL_FUNCTION":
        return arg + 1
    if name == "CALL_FUNCTION_EX":  # (a null,) what it calls, its arguments, by name too
        return (arg & 1) + (3 if sys.version_info >= (3, 11) else 2)
    if name == "CALL_KW":
        return arg + 3
    if name in _STORE_LOCAL or name in ("STORE_GLOBAL", "POP_TOP", "RETURN_VALUE"):
        return 1
    if name in ("YIELD_VALUE", "UNARY_NOT", "UNARY_NEGATIVE", "GET_ITER"):
        return 1
    if name in ("UNPACK_SEQUENCE", "UNPACK_EX"):
        return 1
    if name in _PEEKS:  # put back, with what is made of them
        return 2 if name == "MATCH_KEYS" else 1
    if name == "MATCH_CLASS" and sys.version_info >= (3, 11):  # its subject, class, names
        return 3
    if name.startswith(("POP_JUMP", "JUMP_IF")):
        return 1
    if name == "STORE_ATTR":
        return 2
    if name == "STORE_SUBSCR":
        return 3
    return None


def _callee(popped: list[_Slot]) -> tuple[str | None, _Slot | None, _Slot]:
    """The name of what a call whose stack was ``popped`` calls (``join``, ``print``), the
    slot of the object it is a method of, where one is, and the slot it was loaded as. A
    function of a module (``re.match``, ``collections.Counter``) is named by its own name,
    not the module's, which Python 3.11 loads with a null before it."""
    first, second = (popped[0].pusher, popped[1].pusher) if len(popped) > 1 else (None, None)
    nulled = first is not None and first.argrepr.startswith("NULL + ")
    if nulled and second is not None and second is not first and second.opname == "LOAD_ATTR":
        popped = popped[1:]
    for slot in popped[:2]:
        one = slot.pusher
        if one is not None and one.opname in _CALLEE and isinstance(one.argval, str):
            owner = slot if one.opname in _LOAD_ATTRIBUTE else None
            return one.argval, owner, slot
    return None, None, _UNKNOWN


def _nulled(name: str) -> bool:
    """Whether the call ``name`` takes a null, or the object a method is called on, below
    what it calls (Python 3.11 on, or a method called so up to 3.10)."""
    if name == "CALL_FUNCTION_EX":
        return sys.version_info >= (3, 11)
    return name != "CALL_FUNCTION"


def _in_place(one: dis.Instruction | None) -> bool:
    """Whether ``one`` is an in-place operation (``names += [...]``), which changes the
    list it is done on rather than making another."""
    if one is None:
        return False
    return one.opname.startswith("INPLACE_") or (
        one.opname == "BINARY_OP" and one.argrepr.endswith("=")
    )


def _method(one: dis.Instruction) -> bool:
    """Whether ``one`` loads a method to call (``LOAD_METHOD``, or ``LOAD_ATTR`` marked so
    from Python 3.12), not an attribute."""
    if one.opname == "LOAD_METHOD":
        return True
    return one.opname == "LOAD_ATTR" and sys.version_info >= (3, 12) and bool((one.arg or 0) & 1)


class _Step:
    """One instruction of a function's code, as :func:`_follow` reads it: how many values
    it takes off the stack and puts on, and where it may jump, with the stack's change
    there."""

    __slots__ = ("jump", "moved", "one", "pops", "pushes", "target")

    def __init__(self, one: dis.Instruction, place: dict[int, int]) -> None:
        self.one = one
        pops = _pops(one)
        try:
            net = dis.stack_effect(one.opcode, one.arg, jump=False)
        except ValueError:
            net = None
        # None where the stack's change is not known: a path stops there.
        self.pops = None if net is None else (max(0, -net) if pops is None else pops)
        self.pushes = 0 if net is None or self.pops is None else max(0, net + self.pops)
        if one.opname == "PRECALL":  # 3.11 counts a call's arguments off here
            self.pushes = 0
        elif one.opname.startswith("CALL"):
            self.pushes = 1
        self.target = one.is_jump_target
        self.jump: int | None = None
        self.moved = 0
        if one.opcode in _JUMPS and isinstance(one.argval, int) and one.argval in place:
            self.jump = place[one.argval]
            try:
                self.moved = dis.stack_effect(one.opcode, one.arg, jump=True)
            except ValueError:
                self.jump = None


_STEPPED: dict[int, tuple[types.CodeType, tuple[list[_Step], dict[int, int]]]] = {}
"""Per function's code (by id, kept with it), its instructions as :func:`_follow` reads
them, and each one's place by offset."""


def _steps(code: types.CodeType) -> tuple[list[_Step], dict[int, int]]:
    """The instructions of ``code`` as :func:`_follow` reads them, and each one's place by
    offset."""

    def stepped() -> tuple[list[_Step], dict[int, int]]:
        found = list(dis.get_instructions(code))
        place = {one.offset: at for at, one in enumerate(found)}
        return [_Step(one, place) for one in found], place

    return _kept(_STEPPED, id(code), code, stepped, 1024)  # type: ignore[no-any-return]


def _called_at(code: types.CodeType, offset: int) -> int | None:
    """The place among :func:`_steps` of the instruction of ``code`` at ``offset``; or,
    where a frame that called Python code (3.11) stands past its call's inline caches, of
    the last before it, the call; None where there is none."""
    steps, place = _steps(code)
    if offset in place:
        return place[offset]
    before = [at for at, step in enumerate(steps) if step.one.offset < offset]
    return before[-1] if before else None


def _parameters(code: types.CodeType) -> tuple[str, ...]:
    """The names of the parameters of ``code``, in order, those given by keyword only
    last."""
    return code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]


def _follow(
    code: types.CodeType,
    start: int,
    kind: str,
    entry: str | None = None,
    holding: _Filled = frozenset(),
) -> _Found:
    """Where the value made by the instruction of ``code`` at ``start`` (of ``kind``), or
    handed to it as its argument ``entry``, or the locals ``holding`` hold from the call at
    ``start`` on (a list a call put text or pairs keyed by it into, each with its kind),
    goes: ("asked", the code and instruction that ask it), ("returned", the kind
    returned), or ("let", None); with the calls it is handed to, which may be the model's,
    and the parameters it is put into, each with what it is followed as then."""
    steps, _ = _steps(code)
    handed: list[_Handed] = []
    parameters = set(_parameters(code))
    filled: dict[str, str] = {}
    first = -1 if entry is not None else _called_at(code, start)
    if first is None:
        return "let", None, handed, frozenset()
    taken = 0
    returned: str | None = None
    seen: set[tuple[int, frozenset[tuple[str, str]], bool, tuple[str | None, ...]]] = set()
    # Each path: where it is, the stack, the locals followed, whether it passed `start`.
    paths: list[tuple[int, list[_Slot], dict[str, str], bool]] = [
        (0, [], {}, False) if entry is None else (0, [], {entry: kind}, True)
    ]
    kw_names: tuple[str, ...] = ()
    while paths:
        at, stack, locals_, began = paths.pop()
        while at < len(steps) and taken < _STEPS:
            if began:
                if not locals_ and all(slot.kind is None for slot in stack):
                    break  # nothing followed left on this path
            elif at > first:
                break  # past the place the value is made, which this path skipped
            taken += 1
            step = steps[at]
            one = step.one
            if step.target:
                mark = (at, frozenset(locals_.items()), began, tuple(s.kind for s in stack))
                if mark in seen:
                    break
                seen.add(mark)
            pops = step.pops
            if pops is None:
                break
            name = one.opname
            held = stack if step.jump is None else list(stack)
            if pops:
                popped = stack[-pops:]
                if len(popped) < pops:
                    popped = [_UNKNOWN] * (pops - len(popped)) + popped
                del stack[-pops:]
            else:
                popped = []
            made: str | None = None
            either: str | None = None
            if any(slot.kind is not None for slot in popped):
                kinds = {slot.kind for slot in popped if slot.kind is not None}
                keywords = kw_names if name == "CALL" else ()
                verdict = _taken(one, name, popped, kinds, keywords)
                if verdict == "asked":
                    return "asked", (code, one), handed, frozenset(filled.items())
                if verdict == "returned":
                    # What any path returns it as, which asks the most of it.
                    returned = functools.reduce(_joined, kinds, returned)
                    break
                if verdict == _TEXT_OR_KEYED:
                    made, either = _TEXT, _KEYED
                elif verdict in _KINDS:
                    made = verdict
                elif isinstance(verdict, tuple) and verdict[0] == "puts":
                    _, into, put, calls = verdict
                    locals_ = {**locals_, into: _joined(locals_.get(into), put)}
                    if into.split(".")[0] in parameters:
                        filled[into] = _joined(filled.get(into), locals_[into])
                    _hand(handed, calls, ((code, one.offset),))
                elif isinstance(verdict, tuple):
                    _hand(handed, verdict[1], ((code, one.offset),))
            if name in _ADDS and any(slot.kind is not None for slot in popped):
                _holds_at(stack, one.arg or 0, _added(name, popped))
            inner = _comprehension(popped) if name.startswith("CALL") else None
            if inner is not None:
                into = _comprehended(inner, popped[1].kind, locals_)
                if into[0] == "asked":
                    return "asked", into[1], handed, frozenset(filled.items())
                made = into[1]
                _hand(handed, into[2], ((code, one.offset),))
            if name in _STORE_LOCAL:
                locals_ = _stored(locals_, one.argval, popped[-1].kind)
                added = popped[-1].kind
                if added is not None and one.argval in parameters and _in_place(popped[-1].pusher):
                    # `names += [...]`: the list handed in
                    filled[one.argval] = _held(filled.get(one.argval), added)
            if name == "STORE_ATTR" and popped[-1].local is not None:
                # `self.notes = ...`: followed, or no more, by its path.
                path = f"{popped[-1].local}.{one.argval}"
                locals_ = _stored(locals_, path, popped[0].kind)
            local = one.argval if name in _LOAD_LOCAL and isinstance(one.argval, str) else None
            if local is None and name in _LOAD_ATTRIBUTE and popped:
                # A method is of the object it is loaded off (`parts.append`); an attribute
                # is named by its path (`self.notes`), never as the object it is one of.
                local = popped[-1].local
                if local is not None and not _method(one):
                    local = f"{local}.{one.argval}"
            if local is not None and local in locals_ and not _method(one):
                made = locals_[local]
            if at == first and holding:
                locals_, began = {**locals_, **dict(holding)}, True
            elif at == first:
                made, began = kind, True
            if name == "KW_NAMES":  # the names, which `dis` of Python 3.11 leaves unknown
                named = code.co_consts[one.arg or 0]
                kw_names = named if isinstance(named, tuple) else ()
            elif name.startswith("CALL"):
                kw_names = ()
            if step.pushes:
                pusher: dis.Instruction | None = one
                if name in _MAKES_FUNCTION:  # named by the code it is made of
                    pusher = next((s.pusher for s in popped if _code_of(s)), one)
                slot = _Slot(made, pusher, local)
                if name in _PEEKS and step.pushes == len(popped) + 1:
                    stack.extend([*popped, slot])
                else:
                    stack.extend([slot] * step.pushes)
            if name in _MOVES:
                _move(stack, name, one.arg or 0)
            if either is not None:
                # Followed on as what else it may be too, on a path of its own.
                paths.append((at + 1, [*stack[:-1], _Slot(either, one, local)], locals_, began))
            if step.jump is not None and step.jump > at and name not in _GOES:
                # A branch, or a loop's way out: followed on both ways.
                moved = step.moved
                kept = held[: max(0, len(held) + moved)] if moved < 0 else held + [_UNKNOWN] * moved
                paths.append((step.jump, kept, locals_, began))
            if name in _GOES:
                # Taken, back round a loop too: what its body put into a list or local
                # is seen where the loop ends (each place once per state followed).
                if step.jump is None:
                    break
                at = step.jump
                continue
            if name in ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"):
                break
            at += 1
    if returned is not None:
        return "returned", returned, handed, frozenset(filled.items())
    return "let", None, handed, frozenset(filled.items())


def _move(stack: list[_Slot], name: str, arg: int) -> None:
    """Moves what is on ``stack`` as the instruction ``name`` of :data:`_MOVES` with
    argument ``arg`` does, the copy it put on top made of what it copies."""
    depth = {"DUP_TOP": 2, "ROT_TWO": 2}.get(name, arg + 1 if name == "COPY" else arg)
    if not 1 < depth <= len(stack):
        return
    if name in ("COPY", "DUP_TOP"):
        stack[-1] = stack[-depth]
    else:
        stack[-1], stack[-depth] = stack[-depth], stack[-1]


def _stored(locals_: dict[str, str], local: str, kind: str | None) -> dict[str, str]:
    """``locals_`` once a value followed as ``kind`` (None where it is not) is stored in
    ``local``."""
    if kind is not None:
        return {**locals_, local: kind}
    return {name: held for name, held in locals_.items() if name != local}


def _holds_at(stack: list[_Slot], depth: int, kind: str) -> None:
    """Marks the list, set or dict ``depth`` deep on ``stack``, which an instruction of
    :data:`_ADDS` put followed values into, as holding them (``kind``)."""
    if 0 < depth <= len(stack):
        into = stack[-depth]
        stack[-depth] = _Slot(_joined(into.kind, kind), into.pusher, into.local)


def _added(name: str, popped: list[_Slot]) -> str:
    """What the instruction ``name`` of :data:`_ADDS` puts into its list, set or dict,
    taking ``popped``: followed as a list of them would be."""
    if name == "MAP_ADD":  # a comprehension's dict: keyed by its key, else holding its value
        return _KEYED if popped[0].kind is not None else _holding(popped[1:])
    if name in ("SET_ADD", "SET_UPDATE"):  # a set compares what it holds, as a dict its keys
        return _KEYED
    if name == "LIST_APPEND":
        return _holding(popped)
    # The items of what it is handed (`[*names]`): of text, text it holds; of a pair,
    # a pair no more once the list holds more.
    extended = popped[0].kind or _HOLDER
    return {_TEXT: _HOLDER, _PAIR: _KEYED}.get(extended, extended)


def _joined(kind: str | None, other: str) -> str:
    """What a value followed as ``kind`` (None where it is not) on one path and as
    ``other`` on another, or once it holds what one followed as ``other`` holds too, is
    followed as: text where either is, which asks the most of it; keyed by text where they
    differ otherwise."""
    if kind is None or kind == other:
        return other
    return _TEXT if _TEXT in (kind, other) else _KEYED


def _held(kind: str | None, put: str) -> str:
    """What a list followed as ``kind`` is once the items of a value followed as ``put``
    are put into it (``names += [...]``, ``list(names)``): the characters of text are text
    it holds."""
    return _joined(kind, _HOLDER if put == _TEXT else put)


def _holding(slots: list[_Slot]) -> str:
    """What a list, tuple, set or iterator of ``slots`` (some followed) is followed as: a
    list of pairs keyed by text where each followed one is such a pair, holding text where
    each is text or holds it, else keyed by text (a list of lists of pairs)."""
    kinds = {slot.kind for slot in slots if slot.kind is not None}
    if kinds == {_PAIR}:
        return _PAIRS
    return _HOLDER if kinds <= {_TEXT, _HOLDER} else _KEYED


def _keyed_or_holder(slots: list[_Slot]) -> str:
    """What a dict made of ``slots`` (some followed) is followed as: keyed by text where
    one is keyed by it or a pair or list of pairs keyed so, else holding text."""
    return _HOLDER if _holding(slots) == _HOLDER else _KEYED


def _item_of(kind: str | None) -> str:
    """What an item of a value followed as ``kind`` is, read by place or gone over: a pair
    out of a list of pairs, text or what is keyed by it out of a value keyed by it, else
    text."""
    if kind == _PAIRS:
        return _PAIR
    return _TEXT_OR_KEYED if kind == _KEYED else _TEXT


def _code_of(slot: _Slot) -> types.CodeType | None:
    """The code ``slot`` was loaded as a constant, or a function made of it, where it is."""
    one = slot.pusher
    if one is not None and one.opname == "LOAD_CONST" and isinstance(one.argval, types.CodeType):
        return one.argval
    return None


def _comprehension(popped: list[_Slot]) -> types.CodeType | None:
    """The code of the comprehension or generator expression a call whose stack was
    ``popped`` runs, handed the iterator it goes over as its one argument (``.0``); None
    where it runs none."""
    code = _code_of(popped[0]) if len(popped) == 2 else None
    return code if code is not None and code.co_varnames[:1] == (".0",) else None


def _comprehended(code: types.CodeType, iterated: str | None, locals_: dict[str, str]) -> Any:
    """What the comprehension or generator expression ``code`` does with the iterator it
    is handed (followed as ``iterated``) and the followed ``locals_`` of the function it
    is made in that it reads: ("asked", where), or ("made", the kind of what it makes of
    them all, or None — a generator of them holds what it yields —, the calls it hands them to that
    the function's frame tells, by a global or a local of the function's)."""
    entries = {name: kind for name, kind in locals_.items() if name in code.co_freevars}
    if iterated is not None:
        entries[".0"] = iterated
    made = None
    handed: list[_Handed] = []
    for entry, kind in entries.items():
        found = _read(code, -1, kind, entry)
        if found[0] == "asked":
            return found[:2]
        if found[0] == "returned":  # what each it reads makes of it, which asks the most
            made = _joined(made, _made_by(code, found[1]))
        handed += [each for each in found[2] if _told_outside(each, code)]
    return "made", made, handed


def _made_by(code: types.CodeType, returned: str) -> str:
    """What the comprehension or generator expression ``code`` makes, returning (or
    yielding) a value followed as ``returned``: a generator holds what it yields."""
    if code.co_flags & inspect.CO_GENERATOR:
        return _holding([_Slot(returned, None, None)])
    return returned


def _told_outside(handed: _Handed, code: types.CodeType) -> bool:
    """Whether what the call ``handed``, made in the comprehension ``code``, calls is told
    by the frame of the function it is made in: loaded as a global, or off a local of that
    function's the comprehension reads (``self``), not one of its own, or off a global
    (``helpers``, a module)."""
    by = handed.by
    one = by.pusher
    if one is not None and one.opname in _LOAD_GLOBAL:
        return True
    if by.local is None and one is not None and one.opname in _LOAD_ATTRIBUTE:
        steps, place = _steps(code)
        chain = _chain(steps, place.get(one.offset, 0) - 1)
        return chain is not None and chain[0].opname in _LOAD_GLOBAL
    return by.local is not None and by.local.split(".")[0] in code.co_freevars


def _put(callee: str, positional: list[_Slot], args: list[_Slot]) -> str:
    """What a list, set or dict is followed as once its method ``callee`` of :data:`_PUTS`
    puts ``args`` (``positional`` not given by name) into it: holding them, or keyed by
    them where a set compares them (``seen.add(name)``) or a dict may be keyed by them —
    not where it is updated by name (``notes.update(dtype=name)``), or by a dict made there
    holding them as values alone (``notes.update({"dtype": name})``), whose keys a set so
    updated would hold."""
    if callee not in _PUTS_KEYED:
        return _holding(args)
    valued = all(
        slot.kind is None
        or (slot.kind == _HOLDER and slot.pusher is not None and slot.pusher.opname in _MAPS)
        for slot in positional
    )
    return _holding(args) if callee == "update" and valued else _KEYED


_MAPS = frozenset({"BUILD_MAP", "BUILD_CONST_KEY_MAP"})
"""Instructions that make a dict of what they take (``{"dtype": name}``)."""


def _handed_to(
    callee: str, by: _Slot, name: str, args: list[_Slot], keywords: tuple[str, ...]
) -> tuple[_Handed, ...]:
    """The call ``name`` of ``callee``, loaded as ``by``, handed ``args`` (the last given
    by the names ``keywords``), as handed each followed one of them."""
    spread = name == "CALL_FUNCTION_EX"  # `pick(*names)` at -1, `pick(**notes)` -2
    loaded = tuple(slot.local for slot in args)
    return tuple(
        _Handed(callee, by, -1 - at if spread else at, len(args), kind, keywords, loaded, ())
        for at, kind in enumerate(slot.kind for slot in args)
        if kind is not None
    )


def _hand(handed: list[_Handed], calls: Iterable[_Handed], outward: _Places) -> None:
    """Notes in ``handed`` the ``calls`` (made at ``outward``) a followed value is handed to,
    each once however many paths reach it."""
    for each in calls:
        made = each.made_in(outward)
        key = (made.places, made.at, made.kind)
        if all((other.places, other.at, other.kind) != key for other in handed):
            handed.append(made)


def _whole_number(one: dis.Instruction | None) -> bool:
    """Whether ``one`` loads a whole number as a constant: a place, not text."""
    return one is not None and one.opname == "LOAD_CONST" and type(one.argval) is int


def _taken(
    one: dis.Instruction,
    name: str,
    popped: list[_Slot],
    kinds: set[str],
    keywords: tuple[str, ...] = (),
) -> str | tuple[Any, ...] | None:
    """What ``one`` does with followed values it takes (``popped``, the last of a call's
    given by the names ``keywords``): "asked", "returned", the kind of what it makes of
    them, ("puts", local, kind, calls) where it puts values followed as ``kind`` into the
    list or dict ``local`` holds (by a method that may be the model's, called as ``calls``),
    ("handed", calls) where it hands them to a call, or None where it makes nothing
    followed."""
    text = _TEXT in kinds
    if name in ("COMPARE_OP", "CONTAINS_OP", "IS_OP"):
        return "asked"
    if name == "BINARY_SUBSCR":
        # Text looked up by, or read, item by item, or a dict keyed by it looked up; an
        # item read by place out of what is followed (`pairs[0]`) asks none of its keys.
        looked_up = popped[-1].kind is not None or popped[0].kind == _TEXT
        index = popped[-1].pusher
        by_place = _whole_number(index)
        if looked_up or (popped[0].kind in _KEYED_KINDS and not by_place):
            return "asked"
        if popped[0].kind == _PAIR:  # its text, or its second, not followed
            return _TEXT if index is not None and index.argval in (0, -2) else None
        return _item_of(popped[0].kind)
    if name.startswith("BINARY_"):
        # More text; or a list made of lists (`pairs + more`), a pair no more (`pair * 2`).
        if text or _PAIR in kinds:
            return _TEXT if text else _KEYED
        return functools.reduce(_joined, kinds, None)
    if name in _LOAD_ATTRIBUTE:
        # A method of a list of texts (`parts.append`) is followed as the list, one of
        # text that makes more of it (`name.upper`) as the text; one only text has, read
        # off what is followed as a list or pair (`first.startswith`), as of the text that
        # must be what it is.
        text = text or one.argval in _TEXT_ONLY
        if text and one.argval not in TEXT_METHODS:
            return "asked"
        return _TEXT if text else popped[-1].kind
    if name == "BUILD_MAP":
        keyed = any(slot.kind is not None for slot in popped[::2])
        return _KEYED if keyed else _holding(popped[1::2])
    if name in ("BUILD_TUPLE", "BUILD_LIST") and len(popped) == 2 and popped[0].kind == _TEXT:
        # A pair a dict is made of, keyed by the text; a list of two may be reordered.
        plain = name == "BUILD_TUPLE" and popped[1].kind is None
        return _PAIR if plain else _KEYED
    if name == "BUILD_SET":  # a set compares what it holds, as a dict its keys
        return _KEYED
    if name in ("BUILD_LIST", "BUILD_TUPLE", "BUILD_CONST_KEY_MAP"):
        return _holding(popped)
    if name == "BUILD_STRING" or name.startswith(("FORMAT_", "CONVERT_")):
        return _TEXT
    if name in ("LIST_APPEND", "SET_ADD", "LIST_EXTEND", "SET_UPDATE", "DICT_UPDATE"):
        return None
    if name == "STORE_SUBSCR":
        # Stored by it as a key (`table[name] = ...`): looked up by it; as a value, put
        # into the list or dict.
        if popped[-1].kind is not None:
            return "asked"
        into = popped[1].local
        put = _holding(popped[:1]) if popped[0].kind is not None else _HOLDER
        return ("puts", into, put, ()) if into is not None else None
    if name.startswith("CALL"):
        callee, owner, by = _callee(popped)
        args = popped[2:] if _nulled(name) else popped[1:]
        handed = any(slot.kind is not None for slot in args)
        if owner is not None and owner.kind is not None and callee in _SEARCHES:
            return "asked"
        # A lookup handed nothing (`words.pop()`) is a list's, which compares nothing; one
        # handed a whole number (`words.pop(0)`) a list's too, or a dict's that no text
        # it is keyed by is equal to.
        by_place = not handed and (not args or _whole_number(args[0].pusher))
        keyed = owner is not None and owner.kind in _KEYED_KINDS
        if keyed and callee in _LOOKUPS and not by_place:
            return "asked"
        if owner is not None and owner.kind == _TEXT:
            return _TEXT  # more text made of it, by a method of :data:`TEXT_METHODS`
        if not handed and owner is not None and owner.kind is not None:
            # An item taken out of a list or dict of texts (`table.get(key)`) is text, or
            # keyed by it (a list of pairs out of a list of them); what else its methods
            # make (`table.values()`, `gains.copy()`) holds them.
            return _item_of(owner.kind) if callee in _ITEMS else owner.kind
        if not handed:
            return None
        if callee in _ASKS:
            # The length or truth of a list of texts (`len(parts)`) asks nothing of them;
            # the length of a set or dict keyed by text counts what the text tells apart.
            counted = (_TEXT, _KEYED) if callee == "len" else (_TEXT,)
            texts = any(slot.kind in counted for slot in args)
            return "asked" if texts or callee not in _COUNTS else None
        if callee in _MAKES_TEXT:
            return _TEXT
        if callee in _HOLDS:
            if any(slot.kind == _TEXT for slot in args):
                return "asked"
            if callee in _REMAKES and any(slot.kind in _KEYED_KINDS for slot in args):
                return _KEYED  # its items made of pairs, not the pairs
            return functools.reduce(_held, [slot.kind for slot in args if slot.kind], None)
        if callee == "zip":
            # Pairs keyed by the first it zips, as the dict made of them is.
            if args[0].kind == _HOLDER and [slot.kind for slot in args[1:]] == [None]:
                return _PAIRS
            return _KEYED if args[0].kind is not None else _HOLDER
        if callee in ("dict", "OrderedDict", "defaultdict"):
            # Keyed by text where what it is made of is (`dict(pairs)`, `dict(**gains)`),
            # not by what it is given by name (`dict(dtype=...)`).
            return _keyed_or_holder(args[: len(args) - len(keywords)])
        if callee in _TAKES:
            return _item_of(args[0].kind)
        if callee in _PUTS and owner is not None and owner.local is not None:
            # Put into a list, or handed to a method of the model's of that name.
            put = _put(callee, args[: len(args) - len(keywords)], args)
            return ("puts", owner.local, put, _handed_to(callee, by, name, args, keywords))
        if callee == "isinstance":  # text made of a stand-in is text, whatever a call gives
            return None
        if callee is None:  # what it calls is not told by a name (a lambda): not followed
            return "asked"
        if not any(slot.kind is not None for slot in popped[:2]):
            # Handed to a function that may be the model's: followed into it where the
            # frame tells what it is (:func:`asked_at`), each argument followed.
            return "handed", _handed_to(callee, by, name, args, keywords)
        return None
    if name in ("RETURN_VALUE", "YIELD_VALUE"):
        return "returned"
    if name.startswith(("POP_JUMP", "JUMP_IF")) or name in ("UNARY_NOT", "TO_BOOL"):
        return "asked" if text else None
    if name == "GET_ITER":
        return "asked" if text else popped[0].kind
    if name == "FOR_ITER":
        return _item_of(popped[0].kind)
    if name in ("UNPACK_SEQUENCE", "UNPACK_EX"):
        # The parts of text, or of a pair; of what is keyed by text (a numbered pair,
        # `for _, pair in enumerate(pairs)`), keyed by it too, which any ask refuses.
        return _KEYED if popped[0].kind in (_KEYED, _PAIRS) else _TEXT
    if name == "GET_LEN":  # a `match` statement's: of text, or of what is keyed by it
        return "asked" if popped[0].kind in (_TEXT, _KEYED) else None
    if name == "MATCH_KEYS":  # the values a mapping pattern reads of its subject
        return "asked" if popped[0].kind in _KEYED_KINDS else _HOLDER
    if name == "MATCH_CLASS":  # the attributes a class pattern reads of its subject
        return _holding(popped[:1])
    return None


def _read(
    code: types.CodeType,
    start: int,
    kind: str,
    entry: str | None = None,
    holding: _Filled = frozenset(),
) -> _Found:
    """:func:`_follow`, read once per place."""
    key = (id(code), start, kind, entry, holding)
    follow = functools.partial(_follow, code, start, kind, entry, holding)
    return _kept(_READ, key, code, follow, 4096)  # type: ignore[no-any-return]


def _line(found: list[dis.Instruction], one: dis.Instruction) -> int | None:
    """The line of ``one``: where it is, else (Python 3.10) the last line an instruction
    up to it starts."""
    positions = getattr(one, "positions", None)
    if positions is not None and positions.lineno is not None:
        return int(positions.lineno)
    line = None
    for each in found:
        if type(each.starts_line) is int:
            line = each.starts_line
        if each is one or each.offset == one.offset:
            break
    return line


def _where(code: types.CodeType, one: dis.Instruction) -> str:
    """ "`file:line` (`source`)" of ``one`` in ``code``."""
    line = _line([step.one for step in _steps(code)[0]], one)
    filename = code.co_filename
    source = linecache.getline(filename, line).strip() if line else ""
    return f"{filename}:{line} (`{source}`)"


def _function_called(frame: _Frame, name: str, by: _Slot, code: types.CodeType) -> _Called:
    """The Python function a call in ``frame`` (made in ``code``, its own or a
    comprehension's) of ``name``, loaded as ``by`` says, calls, how many arguments it is
    handed before the call's own (a method's ``self``, none for a module's function), and
    the object it is bound to where it is; (None, 0, None) where that is not told without
    running code."""
    one = by.pusher
    found: Any = None
    if one is None:
        return _NONE_CALLED
    if one.opname in _LOAD_GLOBAL:
        found = _global(frame, name)
    elif one.opname in _LOAD_LOCAL:
        found = frame.f_locals.get(name)
    elif one.opname in _LOAD_ATTRIBUTE:
        # Off a local (`self.gains`), or a global (`helpers`, a module of the model's);
        # an attribute, not a method, is named by its path (`self._pick(*names)`).
        path = by.local
        if path is not None and not _method(one) and path.endswith(f".{name}"):
            path = path[: -len(name) - 1]
        owner = _resolved(frame, path) if path is not None else _loaded_off(frame, code, one)
        if owner is None:
            return _NONE_CALLED
        modules = getattr(owner, "__dict__", {}).get("_modules")
        if isinstance(modules, dict) and name in modules:
            found = modules[name]
        else:
            try:
                found = inspect.getattr_static(owner, name)
            except AttributeError:
                return _NONE_CALLED
            if isinstance(found, staticmethod):
                return _Called(found.__func__, 0, None)
            if isinstance(found, types.FunctionType) and not isinstance(owner, type):
                if isinstance(owner, types.ModuleType):
                    return _Called(found, 0, None)
                return _Called(found, 1, owner)
            return _NONE_CALLED
    if isinstance(found, types.FunctionType):
        return _Called(found, 0, None)
    if isinstance(found, types.MethodType) and isinstance(found.__func__, types.FunctionType):
        return _Called(found.__func__, 1, found.__self__)
    forward = getattr(type(found), "forward", None)
    if callable(found) and isinstance(forward, types.FunctionType):
        return _Called(forward, 1, found)  # a module of the model's, called: its forward
    return _NONE_CALLED


class _Called(NamedTuple):
    """What :func:`_function_called` tells of a call: the function, how many arguments it
    is handed ahead of the call's own, and the object it is bound to."""

    function: Any
    before: int
    bound: Any


_NONE_CALLED = _Called(None, 0, None)


class _Unrun(NamedTuple):
    """What is told of the frame a function of the model's handed a followed value will
    run in, which has not run yet: its code, globals, the object it is bound to as its
    first local, and the frame and places of the call into it, where what it returns is
    followed on; what it puts into lists its caller handed it (not followed back out
    through it) is refused at that call."""

    f_code: types.CodeType
    f_globals: dict[str, Any]
    f_locals: dict[str, Any]
    caller: _Frame
    places: _Places
    f_back: None = None


_Frame = types.FrameType | _Unrun
"""A frame that runs, or one told of a function of the model's before it runs."""


def _global(frame: _Frame, name: str) -> Any:
    """What the global, or else builtin, ``name`` is in ``frame``; None where neither."""
    return frame.f_globals.get(name, vars(builtins).get(name))


def _loaded_off(frame: _Frame, code: types.CodeType, one: dis.Instruction) -> Any:
    """The object the attribute or method ``one`` of ``code`` is loaded off, where the
    loads before it are a straight chain (`helpers.is_float64`): a module, say; None where
    that is not told without running code."""
    steps, place = _steps(code)
    at = place.get(one.offset)
    return _loaded(frame, steps, at - 1) if at else None


def _resolved(frame: _Frame, path: str) -> Any:
    """The object ``path`` names in ``frame``: a local (``self``), or an attribute of one
    the object holds itself (``self.logs``: a submodule, or a value in its ``__dict__``),
    found without running code; None where that is not told (a property, say)."""
    first, *names = path.split(".")
    return _resolved_off(frame.f_locals.get(first), names)


def _resolved_off(found: Any, names: list[str]) -> Any:
    """The object the attributes ``names`` of ``found``, in turn, are, where each is one
    the object holds itself (a submodule, or a value in its ``__dict__``); else None."""
    for name in names:
        if found is None:
            return None
        try:
            held = object.__getattribute__(found, "__dict__")
        except AttributeError:
            return None
        if not isinstance(held, dict):
            return None
        modules = held.get("_modules")
        found = modules[name] if isinstance(modules, dict) and name in modules else held.get(name)
    return found


def _handed_into(frame: _Frame, handed: list[_Handed], own: Any, depth: int = 8) -> str | None:
    """Where a function of the model's that ``frame``'s code hands a followed value to
    asks something of it — or, where it returns text made of it (``_named(str(x.dtype))``),
    ``frame``'s code asks that, or hands it on to another that does, up to ``depth``
    calls. What any other function handed it hands back (``unicodedata.normalize``'s
    text, ``json.loads``'s dict, which its code is not read to tell) is followed as text,
    which asks the most of it; where that is dropped (``print``'s, ``logger.debug``'s),
    nothing is asked."""
    for call in handed:
        places = call.places
        function, before, bound_to = _function_called(frame, call.name, call.by, places[0][0])
        if function is None or not own(function.__code__.co_filename):
            into = _handed_back(frame, _TEXT, places, own, depth) if depth else None
            if into is not None:
                return into
            continue
        code = function.__code__
        named = _parameters(code)
        bound = _bound(code, before, call)
        if bound is None:  # which parameter is which asks it
            return _where_called(places)
        for parameter, entered in bound:
            found = _read(code, -1, entered, parameter)
            if found[0] == "asked":
                return _where(*found[1])
            if found[3] and call.at < 0:  # put into a list it is spread into: which, not told
                return _where_called(places)
            for each, put in found[3]:  # put into a list handed to it: followed from the call
                held = _handed_as(each, call, named, before)
                if held is None and each.split(".")[0] in named[:before]:
                    return _where_called(places)  # its object's, which local holds, not told
                if held is None or len(places) > 1:
                    continue
                into = _asked_after(frame, places[0][1], frozenset({(held, put)}), own, depth)
                if into is not None:
                    return into
            if found[2] and depth:  # handed on from inside it: followed into what it calls
                itself = {named[0]: bound_to} if before and named else {}
                inner = _Unrun(code, function.__globals__, itself, frame, places)
                into = _handed_into(inner, found[2], own, depth - 1)
                if into is not None:
                    return into
            if found[0] == "returned" and depth:  # handed back: followed on from the call
                into = _handed_back(frame, found[1], places, own, depth)
                if into is not None:
                    return into
    return None


def _handed_as(path: str, call: _Handed, named: tuple[str, ...], before: int) -> str | None:
    """The path, in the code making ``call``, of what the parameter path ``path`` of the
    function called (``names``, ``self.names``; its parameters ``named``, ``before`` of them
    handed ahead of the call's own) holds: the local an argument was loaded from, or the
    object a method called off a local is of (``self`` of ``self._keep(...)``); None where
    that is not told."""
    root, dot, rest = path.partition(".")
    given = call.arguments - len(call.keywords)
    place = named.index(root) - before
    held: str | None = None
    if root in call.keywords:
        held = call.loaded[given + call.keywords.index(root)]
    elif 0 <= place < given:
        held = call.loaded[place]
    elif place < 0 and call.by.pusher is not None and _method(call.by.pusher):
        held = call.by.local
    return f"{held}{dot}{rest}" if held is not None else None


def _where_called(places: _Places) -> str:
    """:func:`_where` of the call made at ``places``."""
    made_in, offset = places[0]
    steps, placed = _steps(made_in)
    return _where(made_in, steps[placed[offset]].one)


def _bound(code: types.CodeType, before: int, call: _Handed) -> list[tuple[str, str]] | None:
    """The parameters of the function ``code``, handed ``before`` arguments ahead of the
    call's own, that the followed argument of ``call`` is bound to, each with what it is
    followed as there: its own, one of its items where it is spread into the call (any
    parameter may be), a tuple or dict holding it where it is gathered (``*names``,
    ``**notes``); None where the binding asks it (a dict keyed by text spread by name)."""
    named = _parameters(code)
    gathered = code.co_varnames[len(named) :]
    rest = gathered[0] if code.co_flags & inspect.CO_VARARGS else None
    more = gathered[bool(rest)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    held = _holding([_Slot(call.kind, None, None)])
    if call.at == -1:  # `pick(*names)`: any parameter may be an item of it
        item = _item_of(call.kind)
        items = [_TEXT, _KEYED] if item == _TEXT_OR_KEYED else [item]
        bound = [(each, kind) for each in named[before : code.co_argcount] for kind in items]
        return bound + ([(rest, _held(None, call.kind))] if rest else [])
    if call.at == -2:  # `pick(**notes)`: any parameter may be a value of it
        if call.kind != _HOLDER:
            return None
        return [(each, _TEXT) for each in named[before:]] + ([(more, held)] if more else [])
    given = call.arguments - len(call.keywords)
    if call.at >= given:
        parameter = call.keywords[call.at - given]
        if parameter in named:
            return [(parameter, call.kind)]
        return [(more, held)] if more else []
    if before + call.at < code.co_argcount:
        return [(named[before + call.at], call.kind)]
    return [(rest, held)] if rest else []


def _handed_back(frame: _Frame, kind: str, places: _Places, own: Any, depth: int) -> str | None:
    """Where ``frame``'s code asks something of what a call made at ``places`` hands back
    (followed as ``kind``), or hands it on to a function of the model's that does: followed
    on from the call, and out of each comprehension it is made in that returns it."""
    for at, (code, offset) in enumerate(places):
        back = _read(code, offset, kind)
        if back[0] == "asked":
            return _where(*back[1])
        outward = places[at + 1 :]
        on = [e.made_in(outward) for e in back[2] if not outward or _told_outside(e, code)]
        into = _handed_into(frame, on, own, depth - 1)
        if not outward and back[0] == "returned" and into is None and isinstance(frame, _Unrun):
            # returned by the function the caller's code called: followed on from that call
            return _handed_back(frame.caller, back[1], frame.places, own, depth - 1)
        if into is not None or back[0] != "returned" or not outward:
            return into
        kind = _made_by(code, back[1])
    return None


def _asked_after(frame: _Frame, offset: int, held: _Filled, own: Any, depth: int) -> str | None:
    """Where ``frame``'s code asks something of the lists its locals ``held`` hold once the
    call at ``offset`` has put text (or pairs keyed by it) into them, or hands them to a
    function of the model's that does."""
    found = _read(frame.f_code, offset, _HOLDER, None, held)
    if found[0] == "asked":
        return _where(*found[1])
    if not depth:
        return None
    code = frame.f_code
    parameters = set(_parameters(code))
    handed_on = frozenset(each for each in held if each[0].split(".")[0] in parameters)
    return _handed_into(frame, found[2], own, depth - 1) or _filled_at(
        frame, handed_on | found[3], own, depth - 1
    )


def _filled_at(frame: _Frame, filled: _Filled, own: Any, depth: int = 8) -> str | None:
    """Where the model's code that called ``frame`` asks something of the lists it handed
    ``frame``'s function as its parameters ``filled``, which that put text (or pairs keyed
    by it) into: followed
    on in the caller from the call, by the locals there that hold the same list."""
    if isinstance(frame, _Unrun):
        return _where_called(frame.places) if filled else None
    caller = frame.f_back
    if not filled or caller is None or not own(caller.f_code.co_filename):
        return None
    held: dict[str, str] = {}
    for each, kind in filled:
        _, *names = each.split(".")
        found = _resolved(frame, each)
        for name, value in caller.f_locals.items():
            if found is not None and _resolved_off(value, names) is found:
                path = ".".join([name, *names])
                held[path] = _joined(held.get(path), kind)
    if not held:
        return None
    return _asked_after(caller, caller.f_lasti, frozenset(held.items()), own, depth)


def asked_at(frame: types.FrameType, own: Any) -> str | None:
    """Where the model's code asks something of the value the instruction ``frame`` runs
    makes, which holds the text of a stand-in: "`file:line` (`source`)", or None where it
    is only handed on, printed, stored or dropped. ``own`` tells the model's files apart:
    a value returned is followed in the caller, and one handed to a function of the
    model's into it, where that is the model's."""
    kind = _TEXT
    for _ in range(8):
        found = _read(frame.f_code, frame.f_lasti, kind)
        if found[0] == "asked":
            return _where(*found[1])
        into = _handed_into(frame, found[2], own) or _filled_at(frame, found[3], own)
        if into is not None:
            return into
        caller = frame.f_back
        if found[0] != "returned" or caller is None or not own(caller.f_code.co_filename):
            return None
        frame, kind = caller, found[1]
    return None


def kept_per_argument_at(frame: types.FrameType) -> bool:
    """Whether the call ``frame`` runs calls a function cached per argument
    (``functools.lru_cache``, ``functools.cache``), by name (``ramp(n)``) or as a method,
    static or class method (``self._mask(n)``), where its code tells that in a straight
    line without running any; not a lookup (``gains.get(...)``, ``set(...)``)."""
    steps, _ = _steps(frame.f_code)
    at = _called_at(frame.f_code, frame.f_lasti)
    if at is None or steps[at].one.opname not in ("CALL", "CALL_FUNCTION"):
        return False
    need = steps[at].pops
    at -= 1
    while need and at >= 0:
        step = steps[at]
        if step.pops is None or step.target or step.jump is not None:
            return False
        if need <= step.pushes:
            return _per_argument(_loaded(frame, steps, at))
        need += step.pops - step.pushes
        at -= 1
    return False


def _loaded(frame: _Frame, steps: list[_Step], at: int) -> Any:
    """What the instruction ``steps[at]`` loads, where it and those before it are a
    straight chain of loads (``self._mask``, ``ramp``): a class's attribute as it is
    stored (a ``staticmethod``, say); None where that is not told without running code."""
    chain = _chain(steps, at)
    if chain is None:
        return None
    one, names = chain
    if one.opname in _LOAD_LOCAL:
        if one.argval not in frame.f_locals:
            return None
        found = frame.f_locals[one.argval]
    elif one.opname in _LOAD_GLOBAL:
        found = _global(frame, one.argval)
    else:
        return None
    if not names:
        return found
    *through, last = names
    found = _resolved_off(found, through)
    if found is None:
        return None
    try:
        return inspect.getattr_static(found, last)
    except AttributeError:
        return None


def _chain(steps: list[_Step], at: int) -> tuple[dis.Instruction, list[str]] | None:
    """The load a straight chain of loads ending at ``steps[at]`` starts at (``self`` of
    ``self._mask``) and the attributes it then loads, in turn; None where it is no such
    chain."""
    names: list[str] = []
    while at >= 0 and steps[at].one.opname in _LOAD_ATTRIBUTE:
        if steps[at].target or not isinstance(steps[at].one.argval, str):
            return None
        names.insert(0, steps[at].one.argval)
        at -= 1
    if at < 0 or steps[at].target or not isinstance(steps[at].one.argval, str):
        return None
    return steps[at].one, names


def _per_argument(found: Any) -> bool:
    """Whether ``found`` is a plain function cached per argument by ``functools``, or a
    method, static or class method of one — not a lookup kept so (``lru_cache(gains.get)``),
    which is asked the stand-in with no frame of its own to refuse it in."""
    if isinstance(found, (staticmethod, classmethod, types.MethodType)):
        found = found.__func__
    return isinstance(found, _CACHED) and isinstance(
        getattr(found, "__wrapped__", None), types.FunctionType
    )


_CACHED = type(functools.lru_cache(maxsize=None)(len))
"""The type of a function ``functools.lru_cache`` and ``functools.cache`` make."""
