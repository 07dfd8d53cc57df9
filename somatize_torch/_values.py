"""What the traced code read from the model beyond its tensors: watched, and refused
once changed.

fx runs ``forward`` once as it traces, with proxies for tensors only: a plain value
the forward reads from the model — ``self.temperature``, a function kept as
``self.act``, a list of scales, a flag — is traced into the code as the value it had
then, and so is the absence of one (``getattr(self, "gain", 1.0)``), a value the
class gives (``scale = 2.0`` in its body) and what a module's training flag said.
Changed after ``wrap``, the model would compute with the new value and the wrapped
one with the old, silently. So what each module's attributes give while it is traced
is noted (:func:`reading`), and :class:`Values` looks at it before every eager
forward — by identity, a list's, dict's or set's items too, and a function's defaults
and the values it closes over, which fx traced into the code with it — and refuses the
call once one changed (``WrapError``, naming it): the model is wrapped again, or the
value kept in a buffer, which the code reads as it runs.

The trace must not change the model either: the code fx keeps does not do what the
forward's Python did as it was traced. A forward that assigns an attribute
(``self.initialized = True``, ``self.features = h``, ``self.config.calls += 1``) is
refused (``Untraceable``), and what it assigned is put back: one assigned to a config
would otherwise differ from what the trace read at every call, and be traced again.

What the forward reads of a plain object a module holds (``self.config.flag``, a
config's own objects in turn, one held in a list, tuple or dict: ``self.stages[0].scale``)
is noted too, by its class's attribute lookup given a noting one for the trace: such a
value changed raises :class:`Reread`, and the wrapped model is traced again for the
values the config holds then (:meth:`somatize_torch._tracing.Tracing.rekey`).

Tensors and submodules are not noted here: the code reads them by reference, and
:mod:`somatize_torch._parts` keeps it pointed at what the model holds. A numpy array
read is watched by its bytes, which it is refused once written in place (numpy keeps
no version counter). Nor is a value read through a module's ``self.__dict__`` or
``vars(self)`` (a config's is noted as every value it holds read), a
global the forward reads, or what compiled code runs: those are traced as they were,
unseen.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import enum
import functools
import itertools
import math
import operator
import reprlib
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar, cast

import torch
from torch import nn

from somatize._arrays import looked_at as _looked_at
from somatize.catalog import (
    CodeWatch,
    code_changes,
    fingerprint_of,
    names_rebound,
    watch_code,
)
from somatize.catalog._members import standard_module
from somatize_torch._errors import WrapError
from somatize_torch._modes import _ABSENT, _put, in_torch, read_by, swapped
from somatize_torch._settings import (
    _NUMERIC,
    _PLAIN_TYPES,
    _TORCH_OWN,
    _bound_in,
    _dict_of,
    _dict_version,
    _items,
    _made_of,
    _same_items,
)


class _InOrder(reprlib.Repr):
    """``reprlib``'s short ``repr``, showing a dict in its own order: ``reprlib`` sorts
    it, so a dict reordered would be shown as it was."""

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        shown = [
            f"{self.repr1(key, level - 1)}: {self.repr1(x[key], level - 1)}"
            for key in itertools.islice(x, self.maxdict)
        ]
        if len(x) > self.maxdict:
            shown.append("...")
        return "{" + ", ".join(shown) + "}"


_SHOWN = _InOrder()
_SHOWN.maxstring = _SHOWN.maxother = 60

_TABLES = ("_parameters", "_buffers", "_modules")


class Reread(WrapError):
    """A value the code read from a plain object a module holds (``self.config.flag``)
    changed: the forward is traced again for the values it holds now."""


class Read(NamedTuple):
    """``name`` of ``module``, which is ``path`` in the model (``""`` for the model)."""

    path: str
    module: nn.Module
    name: str

    @property
    def where(self) -> str:
        """The value read, as the model names it (``block.scale``)."""
        return f"{self.path}.{self.name}" if self.path else self.name


class Wrote(NamedTuple):
    """``name`` of ``module`` assigned as the forward was traced, at ``where``."""

    read: Read
    where: str


class Noted:
    """What a trace read from the model's modules, and what it assigned."""

    def __init__(self, model: nn.Module) -> None:
        self.paths = {id(module): path for path, module in model.named_modules()}
        self.own: dict[tuple[int, str], Read] = {}
        """Values a module keeps as its own attributes."""
        self.elsewhere: dict[tuple[int, str], tuple[Read, Any]] = {}
        """Names read that a module does not keep itself, with what the class gave
        (``_ABSENT`` where nothing did): the class's value, a method, a default."""
        self.modes: dict[int, Read] = {}
        """Modules whose training flag was read."""
        self.children: dict[int, str] = {}
        """Submodules the forward read (``self.layers``), by path: fx unrolls a loop over
        what one holds, so the children each holds are the code's."""
        self.wrote: dict[tuple[int, str], tuple[Wrote, Any]] = {}
        """Attributes assigned, with what each held before (in its table)."""
        self.objects: dict[int, str] = {}
        """The plain objects the modules hold (a config), and those they hold in turn
        (``config.sub``), by path: what the forward reads of them is noted too."""
        self.seen: dict[tuple[int, str], Any] = {}
        """What each of :attr:`own` gave as it was read: the traces for other values of a
        config are watched, once run again, for those they read."""
        self.copies: dict[tuple[int, str], Any] = {}
        """What each list, dict or set of :attr:`own` held as it was read, for the same
        reason: changed in place, it is the same object."""
        self.got: dict[tuple[int, str], tuple[Read, Any]] = {}
        """Names read from such an object that neither it nor its class holds, with what
        the read gave (an ``__getattr__``'s answer, a name another maps to)."""

    def read(self, module: nn.Module, name: str, own: dict[str, Any], value: Any) -> None:
        path = self.paths.get(id(module))
        if path is None:
            return
        key = (id(module), name)
        if name in _LISTING:
            self.listing(module)
        if name == "training":
            self.modes.setdefault(id(module), Read(path, module, name))
        elif name in own["_modules"]:
            child = self.paths.get(id(own["_modules"][name]))
            if child is not None:
                self.children.setdefault(id(own["_modules"][name]), child)
        elif name in own:
            if own[name] is value and not isinstance(value, (torch.Tensor, nn.Module)):
                self.own.setdefault(key, Read(path, module, name))
                # What the traces for this set of config values read, set back to later.
                self.seen.setdefault(key, value)
                if isinstance(value, (list, dict, set)):
                    self.copies.setdefault(key, _copy(value))
        elif key not in self.elsewhere and not any(name in own[t] for t in _TABLES):
            self.elsewhere[key] = (Read(path, module, name), _class_value(type(module), name))

    def read_of(self, held: Any, name: str, value: Any) -> None:
        """Notes ``name`` read from ``held``, a plain object a module holds: kept by it, given
        by its class (a method, a property, whose own reads are noted), or made otherwise."""
        path = self.objects.get(id(held))
        key = (id(held), name)
        if path is None or key in self.own or key in self.elsewhere or key in self.got:
            return
        read = Read(path, held, name)
        own = object.__getattribute__(held, "__dict__")
        if name in own and own[name] is value:
            if not isinstance(value, (torch.Tensor, nn.Module)):
                self.own[key] = read
                self.seen[key] = value
                if isinstance(value, (list, dict, set)):
                    self.copies[key] = _copy(value)
            return
        given = _class_value(type(held), name)
        if value is _ABSENT or given is not _ABSENT:
            self.elsewhere[key] = (read, given)
        else:
            self.got[key] = (read, value)

    def read_all(self, held: Any) -> None:
        """Notes every attribute of ``held``, a plain object a module holds, as read."""
        for name, value in list(object.__getattribute__(held, "__dict__").items()):
            if isinstance(name, str):
                self.read_of(held, name, value)

    def listing(self, module: nn.Module) -> None:
        """Notes that the forward went through ``module``'s children."""
        path = self.paths.get(id(module))
        if path is not None:
            self.children.setdefault(id(module), path)

    def write(self, module: Any, name: str, where: str = "") -> None:
        """Notes ``name`` assigned to ``module``, or to a plain object a module holds (a
        config), with what it held before, at ``where`` (the caller's line unless
        given)."""
        path = self.paths.get(id(module), self.objects.get(id(module)))
        key = (id(module), name)
        if path is None or key in self.wrote:
            return
        if not where:
            frame = sys._getframe(2)
            if in_torch(frame.f_code.co_filename):
                return  # fx keeping a constant the code makes (`torch.tensor(self.offsets)`)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        held = object.__getattribute__(module, "__dict__")
        was = [table.get(name, _ABSENT) for table in _tables_of(held)]
        self.wrote[key] = (Wrote(Read(path, module, name), where), was)

    def merge(self, other: Noted) -> None:
        """Takes in what another trace of the same model read."""
        _taken_in(self.own, other.own)
        _taken_in(self.elsewhere, other.elsewhere)
        _taken_in(self.got, other.got)
        _taken_in(self.seen, other.seen)
        _taken_in(self.copies, other.copies)
        _taken_in(self.modes, other.modes)
        _taken_in(self.children, other.children)

    def put_back(self) -> None:
        """Puts back what the trace assigned."""
        for written, was in self.wrote.values():
            module, name = written.read.module, written.read.name
            held = object.__getattribute__(module, "__dict__")
            for table, value in zip(_tables_of(held), was, strict=True):
                if value is _ABSENT:
                    table.pop(name, None)
                else:
                    table[name] = value


_K = TypeVar("_K")
_V = TypeVar("_V")


def _taken_in(mine: dict[_K, _V], theirs: dict[_K, _V]) -> None:
    """Adds to ``mine`` what ``theirs`` notes of what ``mine`` does not: what was noted first
    stands (:meth:`Noted.merge`)."""
    for key, value in theirs.items():
        mine.setdefault(key, value)


def _tables_of(held: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a module (``held`` its ``__dict__``) keeps its attributes: its own table and
    torch's; a plain object, its own table alone."""
    return [held, *(held[t] for t in _TABLES if t in held)]


@contextlib.contextmanager
def reading(model: nn.Module, held: Callable[[str], Any] | None = None) -> Iterator[Noted]:
    """While in the block, what is read from ``model``'s modules' attributes and what is
    assigned to them is noted; after it, what was assigned is put back. With ``held``, a
    tensor a module keeps as a plain attribute reads as what ``held`` makes of its path in
    the model (the tracer's read of it in the code).

    Each module's class is given, for the block, an attribute lookup and an
    assignment that note what they do (the classes themselves, so a module's class is
    what it was: ``type(self) is Block`` holds), and what it had after; they note what
    the thread that entered the block does only, another thread's reads and writes go on
    as ever. A class that cannot be given them (one written in C) is not watched. It is
    entered inside :func:`~somatize_torch._modes.recording`, which lets one trace run at a
    time: two replacing one class's lookup at once would each put back what the other
    installed."""
    noted = Noted(model)
    walked = _walk(model)  # before any lookup notes what it reads
    noted.objects = {id(held): path for held, path in walked}
    objects = [held for held, _ in walked]
    held_kinds = list(dict.fromkeys(type(held) for held in objects))
    kinds = list(dict.fromkeys(type(module) for module in model.modules()))
    thread = threading.get_ident()  # another thread's reads and writes go on as ever
    # What each class's lookup and assignment were, before any was replaced: a class
    # that inherits them from another one replaced here calls the original.
    before = [
        (
            kind,
            vars(kind).get("__getattribute__", _ABSENT),
            vars(kind).get("__setattr__", _ABSENT),
            cast("Callable[[Any, str], Any]", kind.__getattribute__),
            cast("Callable[[Any, str, Any], None]", kind.__setattr__),
        )
        for kind in kinds
    ]
    replaced: list[tuple[type, Any, Any]] = []
    unwatched: list[tuple[Any, dict[str, Any]]] = []

    def put_back() -> None:
        for held, was in unwatched:
            _note_changed(noted, held, was)
        while replaced:  # noted before it is replaced: a fork may come between
            kind, own_read, own_write = replaced[-1]
            _put(kind, "__getattribute__", own_read)
            _put(kind, "__setattr__", own_write)
            replaced.pop()
        noted.put_back()

    with swapped(put_back):
        for kind, own_read, own_write, read, write in before:
            replaced.append((kind, own_read, own_write))
            try:
                kind.__getattribute__ = _noting_reads(read, noted, held, thread)  # type: ignore[method-assign]
                kind.__setattr__ = _noting_writes(write, noted, thread)  # type: ignore[method-assign,assignment]
            except TypeError:
                _put(kind, "__getattribute__", own_read)
                replaced.pop()
        unseen: set[type] = set()
        for kind in held_kinds:
            own_read = vars(kind).get("__getattribute__", _ABSENT)
            read = cast("Callable[[Any, str], Any]", kind.__getattribute__)
            own_write = vars(kind).get("__setattr__", _ABSENT)
            write = cast("Callable[[Any, str, Any], None]", kind.__setattr__)
            replaced.append((kind, own_read, own_write))
            try:
                setattr(kind, "__getattribute__", _noting_object_reads(read, noted, thread))  # noqa: B010
            except TypeError:  # nothing was set
                replaced.pop()
                unseen.add(kind)  # a class written in C (`types.SimpleNamespace`)
                continue
            kind.__setattr__ = _noting_writes(write, noted, thread)  # type: ignore[assignment]
        # What the objects whose assignments cannot be noted as they are made hold now.
        unwatched += [
            (held, dict(object.__getattribute__(held, "__dict__")))
            for held in objects
            if type(held) in unseen
        ]
        yield noted
        if unseen:
            _read_whole(noted, unseen)


def _noting_reads(
    read: Callable[[Any, str], Any],
    noted: Noted,
    held: Callable[[str], Any] | None,
    thread: int,
) -> Callable[[Any, str], Any]:
    def __getattribute__(self: Any, name: str) -> Any:
        if threading.get_ident() != thread:
            return read(self, name)
        if (
            name in _UNNOTED
            or (name.startswith("__") and name.endswith("__"))
            or in_torch(read_by(sys._getframe(1)))
        ):
            if name == "_modules" and not in_torch(read_by(sys._getframe(1))):
                noted.listing(self)
            return read(self, name)
        own = read(self, "__dict__")
        try:
            value = read(self, name)
        except AttributeError:
            noted.read(self, name, own, _ABSENT)
            raise
        noted.read(self, name, own, value)
        if held is not None and isinstance(value, torch.Tensor) and own.get(name) is value:
            path = noted.paths.get(id(self))
            if path is not None:
                return held(f"{path}.{name}" if path else name)
        return value

    return __getattribute__


def _note_changed(noted: Noted, held: Any, was: dict[str, Any]) -> None:
    """Notes as assigned each attribute of ``held`` that is not what ``was`` says it held:
    an object whose class is written in C (``types.SimpleNamespace``), whose assignments
    cannot be noted as they are made."""
    own = object.__getattribute__(held, "__dict__")
    for name in dict.fromkeys([*own, *was]):
        before = was.get(name, _ABSENT)
        if own.get(name, _ABSENT) is not before and (id(held), name) not in noted.wrote:
            read = Read(noted.objects[id(held)], held, name)
            where = f"a line of the forward: `{type(held).__qualname__}` is written in C"
            noted.wrote[(id(held), name)] = (Wrote(read, where), [before])


def _read_whole(noted: Noted, unseen: set[type]) -> None:
    """Notes every attribute of each object the forward read whose class's lookup could not
    note what it reads (``types.SimpleNamespace``, written in C), as if it read them all,
    and of those they hold in turn."""
    done: set[int] = set()
    while True:
        read = [
            value
            for seen in list(noted.seen.values())
            for value, _ in _held_in(seen, "")
            if type(value) in unseen and id(value) in noted.objects and id(value) not in done
        ]
        if not read:
            return
        for held in read:
            done.add(id(held))
            noted.read_all(held)


def _noting_object_reads(
    read: Callable[[Any, str], Any], noted: Noted, thread: int
) -> Callable[[Any, str], Any]:
    def __getattribute__(self: Any, name: str) -> Any:
        if (
            threading.get_ident() != thread
            or id(self) not in noted.objects
            or (name.startswith("__") and name.endswith("__") and name != "__dict__")
            or in_torch(read_by(sys._getframe(1)))
        ):
            return read(self, name)
        if name == "__dict__":  # `vars(config)`, a `to_dict()`: every value it holds read
            noted.read_all(self)
            return read(self, name)
        try:
            value = read(self, name)
        except AttributeError:
            noted.read_of(self, name, _ABSENT)
            raise
        noted.read_of(self, name, value)
        return value

    return __getattribute__


_NOT_FOLLOWED = (
    "builtins",
    "torch",
    "numpy",
    "random",
    "enum",
    "functools",
    "threading",
    "typing",
    "weakref",
    "collections",
    "somatize",
    "somatize_torch",
)
"""The packages whose objects a module holds are not followed: their values are no config
a forward reads."""

_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)
"""The standard library's kinds of config, followed."""


def _followed(value: Any) -> bool:
    """Whether ``value`` is a plain object whose attributes a forward may read (a config):
    one of a class written in Python, with attributes of its own."""
    skipped = (torch.Tensor, nn.Module, type, types.ModuleType, types.FunctionType, enum.Enum)
    if isinstance(value, (*skipped, types.MethodType)):
        return False
    kind = type(value)
    home = kind.__module__.split(".")[0]
    if isinstance(value, _NAMESPACES):
        pass  # the standard library's own configs
    elif home in _NOT_FOLLOWED or standard_module(home):  # a logger, a lock: no config
        return False
    try:
        return isinstance(object.__getattribute__(value, "__dict__"), dict)
    except AttributeError:
        return False


def _walk(model: nn.Module) -> list[tuple[Any, str]]:
    """The plain objects ``model``'s modules hold, and those they hold in turn (four
    levels down), each once, with its path in the model (``config.sub``): held directly,
    or in a list, tuple or dict (``stages[0]``, one config per stage), which the forward
    reads them out of as it reads one held directly."""
    found: dict[int, tuple[Any, str]] = {}
    todo: list[tuple[dict[str, Any], str, int]] = [
        (vars(module), path, 0) for path, module in model.named_modules()
    ]
    while todo:
        table, path, depth = todo.pop(0)
        for name, held in list(table.items()):
            # A module's own tables (its children, its hooks) hold no config; a config's
            # attribute of such a name (`config.training`) is one of its values.
            if not isinstance(name, str) or (depth == 0 and name in _TORCH_OWN):
                continue
            for value, where in _held_in(held, f"{path}.{name}" if path else name):
                if id(value) in found or not _followed(value):
                    continue
                found[id(value)] = (value, where)
                if depth < 4:
                    todo.append((object.__getattribute__(value, "__dict__"), where, depth + 1))
    return list(found.values())


def _held_in(value: Any, where: str) -> Iterator[tuple[Any, str]]:
    """``value``, held at ``where``, and what it holds in a list, tuple or dict however
    nested (each once, by its key: ``stages[0]``), each with its path; items of a plain
    kind (a vocabulary's words) are passed over at once."""
    todo = [(value, where)]
    seen: set[int] = set()
    while todo:
        value, where = todo.pop()
        yield value, where
        if not isinstance(value, (list, tuple, dict)) or id(value) in seen:
            continue
        seen.add(id(value))
        if _PLAIN_TYPES.issuperset(map(type, value.values() if isinstance(value, dict) else value)):
            continue  # at C speed, item by item: a table of numbers of a million
        items = value.items() if isinstance(value, dict) else enumerate(value)
        todo += reversed(
            [(item, f"{where}[{key!r}]") for key, item in items if type(item) not in _PLAIN_TYPES]
        )


def _noting_writes(
    write: Callable[[Any, str, Any], None], noted: Noted, thread: int
) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if threading.get_ident() == thread:
            noted.write(self, name)
        write(self, name, value)

    return __setattr__


def _class_value(kind: type, name: str) -> Any:
    """What ``kind`` holds as ``name`` itself (or a class it comes from), or ``_ABSENT``."""
    for base in kind.__mro__:
        if name in vars(base):
            return vars(base)[name]
    return _ABSENT


_LISTING = frozenset(["_modules", "children", "named_children", "modules", "named_modules"])
"""What a forward reads to go through a module's children (``for m in self.children()``):
the children that module holds are the code's then."""

_UNNOTED = _TORCH_OWN - {"training"} | {"train", "forward"}
"""torch's own tables; the stand-in for ``train`` freezing puts on a frozen module; and
``forward``, which calling any module reads (one replaced on an instance is in the
fingerprint of nothing the trace made, and is refused for the model itself)."""


class Values:
    """What the traced code read, as the model holds it now; asking whether any changed,
    which every eager forward does, costs a look by identity per value (and per item of a
    list, dict or set) and a few per name the modules did not hold themselves, made in C
    over tables worked out once (about 30 µs for 240 names read)."""

    def __init__(
        self,
        noted: Noted | None,
        model: str,
        traced: tuple[type, ...] = (),
        keyed: tuple[Any, ...] = (),
    ) -> None:
        self.model = model
        """The model's class, for messages."""
        self.traced = traced
        """The classes whose forward fx traced: the model's, and those of the blocks it went
        through."""
        self.keyed = keyed
        """The model's modules, weights and buffers, keyed as its state, not as code
        (:func:`~somatize_torch.freeze.keyed_with`)."""
        if traced:  # worked out before the watch too, which watches the names of their
            # modules it looked up (a global rebound) only once it is
            fingerprint_of(*traced)
        self._code: CodeWatch | None = self._watch() if traced else None
        self._fingerprint = fingerprint_of(*traced) if traced else ""
        """The fingerprint of the classes' code as fx traced it: a global or helper of their
        modules rebound since is a change where it is another now
        (:func:`~somatize.catalog.names_rebound`)."""
        self.reads: list[Read] = []
        self._values: list[Any] = []
        self._containers: list[int] = []
        self._items: list[tuple[Any, ...]] = []
        self._copies: dict[int, Any] = {}
        self._elsewhere: list[tuple[Read, Any]] = []
        self._got: list[list[Any]] = []
        """Names read from a plain object a module holds that neither it nor its class
        holds, each with what the read gave: read again at each call."""
        self._made: list[tuple[int, _Made]] = []
        """The functions and ``functools.partial`` read (by their place in :attr:`reads`),
        each with what it held: fx traced it into the code with the values it closes over,
        its defaults and what a partial binds."""
        self._arrays: list[tuple[int, tuple[Any, ...]]] = []
        """The numpy arrays read, each with its dtype, shape and bytes: numpy keeps no
        version counter, and what the code made of one is traced in as it was."""
        if noted is None:
            # Laid out now, reading nothing: the one a class holds as its default (a model
            # declared whole, traced by nobody) is not changed by the first look at it, which
            # a cache watching the class's code would take for code changed in place.
            self._quick = self._tables()
            return
        for key, read in noted.own.items():
            value = noted.seen.get(key, _ABSENT)
            if value is _ABSENT:
                value = vars(read.module).get(read.name, _ABSENT)
            if value is _ABSENT or isinstance(value, (torch.Tensor, nn.Module)):
                continue
            self.reads.append(read)
            self._values.append(value)
            if isinstance(value, (list, dict, set)):
                # As the trace read it: a config's, changed in place since, is another set
                # of the values it holds.
                was = noted.copies.get(key, value)
                self._containers.append(len(self._values) - 1)
                self._items.append(_items(was))
                self._copies[len(self._values) - 1] = _copy(was)
        self._elsewhere = list(noted.elsewhere.values())
        self._got = [[read, value] for read, value in noted.got.values()]
        self._made = [
            (i, _Made(_closed(value, keep=True)))
            for i, value in enumerate(self._values)
            if isinstance(value, (types.FunctionType, functools.partial, types.MethodType))
        ]
        numpy = sys.modules.get("numpy")  # not imported: nothing read is one of its arrays
        self._arrays = [
            (i, _looked_at(value))
            for i, value in enumerate(self._values)
            if numpy is not None
            and isinstance(value, numpy.ndarray)
            and value.dtype.kind in _NUMERIC
        ]
        if self._elsewhere:
            # Laid out now, for a compiled call's look (`same`) as for an eager one's.
            self._quick = self._tables()

    # What the quick look at each call reads, made from the reads when first asked (and
    # again in a copy, whose modules' tables are its own: see __getstate__).
    _quick: tuple[list[Any], ...] | None = None
    _read: tuple[Any, ...] = ()  # the module each read is from, whose tables _quick holds,
    _held: tuple[Any, ...] = ()  # and those tables

    def __getstate__(self) -> dict[str, Any]:
        # A class's namespace is not copied: a copy watches the classes as they are. Nor is
        # what a function or partial held (a code object does not pickle, and a partial is
        # copied with what it binds): whether it still holds it is, and the copy looks at
        # what its own holds (`__setstate__`).
        made = [(i, _same_closed(_closed(self._values[i]), was)) for i, was in self._made]
        return {
            **vars(self),
            "_quick": None,
            "_read": (),
            "_held": (),
            "_code": None,
            "_made": made,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # What the copy's functions and partials hold, as the model's held what was traced:
        # one changed before the copy was made is taken as changed in the copy too.
        self._made = [
            (i, _Made(_closed(self._values[i], keep=True)) if same else _CHANGED)
            for i, same in state["_made"]
        ]

    def _tables(self) -> tuple[list[Any], ...]:
        """The tables a call looks at: each module's own attributes with the name read from
        each; the tables a name read elsewhere must not appear in (the module's attributes,
        parameters, buffers, children, and its classes' tables before the one that gave
        it); the class table that gave each, with the value."""
        self._read = tuple(read.module for read in [*self.reads, *(r for r, _ in self._elsewhere)])
        self._held = tuple(map(vars, self._read))
        owners = list(self._held[: len(self.reads)])
        absent: list[Any] = []
        absent_names: list[str] = []
        givers: list[Any] = []
        given_names: list[str] = []
        given: list[Any] = []
        for read, was in self._elsewhere:
            held = vars(read.module)
            tables: list[Any] = [held, *(held[t] for t in _TABLES if t in held)]
            for base in type(read.module).__mro__:
                table = vars(base)
                if read.name in table:
                    givers.append(table)
                    given_names.append(read.name)
                    given.append(was)
                    break
                tables.append(table)
            absent += tables
            absent_names += [read.name] * len(tables)
        return owners, absent, absent_names, givers, given_names, given

    @property
    def names(self) -> frozenset[str]:
        """The names read from the model itself."""
        return frozenset(
            read.name for read in [*self.reads, *(r for r, _ in self._elsewhere)] if not read.path
        )

    def same(self) -> bool:
        """Whether each value the code read of a module or a plain object it holds is the
        very one it read, a list's, dict's or set's items too, and a value a class gave
        still the one it gives and given no module itself: read in compiled code too,
        which torch.compile guards on, so a change has the call compiled anew, and looked
        at as an eager call looks at it (:meth:`check`, made eagerly)."""
        for read, was in zip(self.reads, self._values, strict=True):
            if read.module.__dict__.get(read.name, _ABSENT) is not was:
                return False
        for at, items in zip(self._containers, self._items, strict=True):
            value = self._values[at]  # a list, dict or set, changed in place
            now = (*value, *value.values()) if isinstance(value, dict) else tuple(value)
            if len(now) != len(items) or not all(map(operator.is_, now, items)):
                return False
        if self._elsewhere:
            # A value a class gave: the tables laid out by the first look (`check`).
            if self._quick is None:
                return False
            _, absent, absent_names, givers, given_names, given = self._quick
            if any(map(operator.contains, absent, absent_names)) or not all(
                map(operator.is_, map(_get, givers, given_names), given)
            ):
                return False
        return True

    def _watch(self) -> CodeWatch:
        """The watch of the traced classes' code (:func:`~somatize.catalog.watch_code`) but
        of the classes it names (a cached part's, `self.encoder = Encoder()`): a cached part
        is called whole, not traced, and what it answers is keyed by its own code."""
        return watch_code(self.traced, self.keyed, named_classes=False)

    def check(self) -> None:
        """WrapError when something the code read holds another value now; a value put
        back as it was (the same number assigned again) is taken as it is."""
        if self._quick is None or not all(map(operator.is_, map(vars, self._read), self._held)):
            # First asked, or a module's table of attributes replaced whole since
            # (`model.block.__dict__ = {...}`): the tables are taken as they are now.
            self._quick = self._tables()
            if self._code is None and self.traced:
                self._code = self._watch()
        owners, absent, absent_names, givers, given_names, given = self._quick
        names = (read.name for read in self.reads)
        code = self._code
        if (
            (code is None or code.looks_same())
            and all(map(operator.is_, map(dict.get, owners, names), self._values))
            and all(
                map(_same_items, (_items(self._values[i]) for i in self._containers), self._items)
            )
            and not any(map(operator.contains, absent, absent_names))
            and all(map(operator.is_, map(_get, givers, given_names), given))
            and (not self._got or all(_got_again(got) is got[1] for got in self._got))
            and all(_same_closed(_closed(self._values[i]), made) for i, made in self._made)
            and all(_looked_at(self._values[i]) == was for i, was in self._arrays)
        ):
            return
        for i, was in self._arrays:
            if _looked_at(self._values[i]) == was:
                continue
            where = self.reads[i].where
            raise WrapError(
                f"the numpy array `{where}` was written in place (or reshaped) after `wrap` "
                f"traced `{self.model}.forward`, which read it: numpy keeps no version "
                "counter, and a tensor the forward made from it was traced into the code "
                "the wrapped model runs as it was then. Wrap the model again after changing "
                "it (`somatize.torch.wrap(model, ...)`, then `freeze`), or keep it in a "
                "buffer (`self.register_buffer(...)`), which the code reads as it runs"
            )
        for i, made in self._made:
            if _same_closed(_closed(self._values[i]), made):
                continue
            where = self.reads[i].where
            if isinstance(self._values[i], functools.partial):
                what = (
                    f"what the partial `{where}` ({_shown(self._values[i])}) binds, or what "
                    "its function closes over,"
                )
            elif isinstance(self._values[i], types.MethodType):
                what = (
                    f"an attribute of the object the method `{where}` "
                    f"({_shown(self._values[i])}) is bound to, or what its function closes "
                    "over,"
                )
            else:
                what = (
                    f"what the function `{where}` ({_shown(self._values[i])}) closes over, "
                    "or a default value of it,"
                )
            raise WrapError(
                f"{what} changed after `wrap` traced `{self.model}.forward`, which called it: "
                "fx traced the function into the code the wrapped model runs with the values "
                "it had then, and the wrapped model would go on computing with them. Wrap "
                "the model again after changing it (`somatize.torch.wrap(model, ...)`, then "
                "`freeze`), or keep the value in a buffer (`self.register_buffer(...)`), "
                "which the code reads as it runs"
            )
        reread: Reread | None = None  # raised last: the traces for other values are no
        # answer to a value of the model's own, or to code, that changed too
        for i, read in enumerate(self.reads):
            was = self._values[i]
            now = _own(read)
            if i in self._copies:
                slot = self._containers.index(i)
                if now is was and _same_items(_items(now), self._items[slot]):
                    continue
                if not _same(now, self._copies[i]):
                    reread = _refused(reread, self._changed(read, self._copies[i], now))
                    continue
                self._values[i] = now
                self._items[slot] = _items(now)
                self._copies[i] = _copy(now)
            elif now is not was:
                if not _same(now, was) or _followed(was):
                    # An object whose attributes the code read is watched as it is.
                    reread = _refused(reread, self._changed(read, was, now))
                    continue
                self._values[i] = now
        for got in self._got:
            read, was = got
            now = _got_again(got)
            if now is not was:
                if not _same(now, was):
                    reread = _refused(reread, self._changed(read, was, now))
                    continue
                got[1] = now
        for read, was in self._elsewhere:
            now = _held(read)
            if now is not None:
                reread = _refused(reread, self._changed(read, was, now[0], given=True))
                continue
            value = _class_value(type(read.module), read.name)
            if value is not was:
                reread = _refused(reread, self._changed(read, was, value, given=False))
        if code is not None and not code.looks_same():
            changed = code_changes(code)
            if changed:
                raise _code_changed(changed, self.model)
            rebound = names_rebound(code, self._fingerprint)
            if rebound:
                raise _rebound(rebound, self.model)
            self._code = self._watch()  # what no code reads (`__slotnames__`)
        if reread is not None:
            raise reread

    def _changed(self, read: Read, was: Any, now: Any, given: bool | None = None) -> WrapError:
        where = read.where
        kind = type(read.module).__qualname__
        if not isinstance(read.module, nn.Module) and was is _ABSENT:
            before = "was not set"
        elif given is None or not isinstance(read.module, nn.Module):
            before = f"was {_shown(was)}"
        elif was is _ABSENT:
            before = f"was not set (the `{kind}` had no `{read.name}`)"
        else:
            before = f"was {_shown(was)}, as the class `{kind}` gives it,"
        if now is _ABSENT:
            became = "was removed"
        elif given:
            became = f"is given {_shown(now)} now"
        else:
            became = f"is {_shown(now)} now"
        if not isinstance(read.module, nn.Module) or _followed(was):
            return Reread(
                f"`{where}` {before} when `wrap` traced `{self.model}.forward`, which read it, "
                f"and {became}"
            )
        return WrapError(
            f"`{where}` {before} when `wrap` traced `{self.model}.forward`, which read it, and "
            f"{became}: fx traced what it read into the code the wrapped model runs, which "
            "would go on computing with the old value. Wrap the model again after changing it "
            "(`somatize.torch.wrap(model, ...)`, then `freeze`), or keep the value in a buffer "
            "(`self.register_buffer(...)`), which the code reads as it runs"
        )


def _closed(function: Callable[..., Any], keep: bool = False) -> tuple[Any, ...]:
    """What a function or ``functools.partial`` read holds, looked at by identity: its
    code, defaults and what it closes over, a partial's function, arguments and keywords
    (and those of the functions and partials it holds in turn), each item of a list, dict
    or set among them (a plain dict by its CPython version first, where it is read: a
    vocabulary; its items kept too with ``keep``), and the bytes of each numeric numpy
    array: fx traced what the forward read of them into the code as it was."""
    functions, bound = _bound_in([function])
    numpy = sys.modules.get("numpy")  # not imported: nothing held is one of its arrays
    held: list[Any] = []
    for one in functions:
        held += _made_of(one)
    for value in (function, *bound):
        if isinstance(value, functools.partial):
            # What it binds, which `__setstate__` may replace whole.
            held += (value, value.func, value.args, value.keywords)
        elif isinstance(value, types.MethodType):
            # The object it is bound to, a config (`scaler.s`), by the table of what it
            # holds: its own values, which the code read, were traced in as they were.
            owner = value.__self__
            table = _dict_of(owner) if _followed(owner) else None
            held += (value, value.__func__, owner)
            if table is not None and _dict_version is not None:
                held += (table, _Versioned(_dict_version(table), _items(table) if keep else ()))
            elif table is not None:
                held += (table, *_items(table))
        elif type(value) is dict and _dict_version is not None:
            held += (value, _Versioned(_dict_version(value), _items(value) if keep else ()))
        elif isinstance(value, (list, dict, set)):
            held += (value, *_items(value))
        elif (
            numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in _NUMERIC
        ):
            held += (value, _Bytes(_looked_at(value)))
    return tuple(held)


class _Bytes(tuple[Any, ...]):
    """A numpy array's dtype, shape and bytes, among what a function holds: compared by
    what it says (:func:`_same_closed`), not by identity."""


class _Versioned(NamedTuple):
    """A plain dict's CPython version, and its items where kept: the same where the version
    did not move, or where the items are those kept (a value put back as it was)."""

    version: int
    items: tuple[Any, ...]


def _same_closed(now: tuple[Any, ...], was: tuple[Any, ...]) -> bool:
    if len(now) != len(was):
        return False
    for at, (a, b) in enumerate(zip(now, was, strict=True)):
        if a is b or (type(a) is _Bytes and a == b):
            continue
        versioned = type(b) is _Versioned and type(a) is _Versioned
        if versioned and (a.version == b.version or _same_items(_items(now[at - 1]), b.items)):
            continue
        return False
    return True


class _Made(tuple[Any, ...]):
    """What a function or partial held when it was traced (:func:`_closed`). Not copied
    with the model: a copy looks at what its own holds (:meth:`Values.__setstate__`)."""


_CHANGED = _Made((object(),))
"""What a copy holds for a function or partial that no longer held what was traced when
the copy was made: like nothing it holds, so its calls are refused as the model's are."""


def _refused(reread: Reread | None, error: WrapError) -> Reread | None:
    """Raises ``error`` where it refuses the call; else the first :class:`Reread`."""
    if not isinstance(error, Reread):
        raise error
    return reread or error


def _code_changed(changed: list[str], model: str) -> WrapError:
    """The refusal of a call after what ``changed`` names was set on the class."""
    said = ", ".join(f"`{name}`" for name in changed[:6])
    return WrapError(
        f"{said} {'was' if len(changed) == 1 else 'were'} set on the class, added or "
        f"deleted after `wrap` traced `{model}.forward` through it: fx traced the "
        "code of the model's class and of the blocks it went through into the code the "
        "wrapped model runs, which would go on computing with the old code. Wrap the "
        "model again after changing it (`somatize.torch.wrap(model, ...)`, then "
        "`freeze`), or set it back"
    )


def _rebound(rebound: list[str], model: str) -> WrapError:
    """The refusal of a call after the globals or helpers ``rebound`` names were rebound."""
    said = ", ".join(f"`{name}`" for name in rebound[:6])
    one = len(rebound) == 1
    return WrapError(
        f"{said} {'was' if one else 'were'} rebound in {'its module' if one else 'their modules'} "
        f"(a cell run again) after `wrap` traced `{model}.forward`: fx traced the values "
        "the model's code read and the helpers it called, as they were then, into the code "
        "the wrapped model runs, which would go on computing with them. Wrap the model "
        "again after changing it (`somatize.torch.wrap(model, ...)`, then `freeze`), or set "
        "it back"
    )


def _got_again(got: list[Any]) -> Any:
    """What reading the name of a :attr:`Values._got` read gives now."""
    read = got[0]
    try:
        return getattr(read.module, read.name, _ABSENT)
    except Exception:  # what the object's lookup raises now
        return _ABSENT


def _get(table: Any, name: str) -> Any:
    return table.get(name, _ABSENT)


def _own(read: Read) -> Any:
    return vars(read.module).get(read.name, _ABSENT)


def _held(read: Read) -> tuple[Any] | None:
    """What ``read.module`` holds as ``read.name`` itself now — an attribute, a
    parameter, a buffer, a submodule — or None."""
    held = vars(read.module)
    for table in (held, *(held[t] for t in _TABLES if t in held)):
        if read.name in table:
            return (table[read.name],)
    return None


def _shown(value: Any) -> str:
    """A value as a message shows it: a function by its name, anything else by a ``repr``
    cut short."""
    if isinstance(value, types.BuiltinFunctionType):
        return f"`{value.__module__ or '?'}.{value.__name__}`"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"`{getattr(value, '__module__', None) or '?'}.{value.__qualname__}`"
    return _SHOWN.repr(value)


def _copy(value: Any) -> Any:
    """A list, dict or set as it is now: its items are what the code read."""
    return copy.copy(value)


def _same(now: Any, was: Any, depth: int = 0) -> bool:
    """Whether ``now`` computes as ``was`` does: the same type and the same value, item
    by item, in order — so ``-0.0`` is not ``0.0``, ``4`` is not ``4.0``, a NaN is a NaN
    and a dict reordered is another dict. What compares otherwise (an array, whose
    comparison is no one bool) is taken as another value."""
    if now is was:
        return True
    if now is _ABSENT or type(now) is not type(was) or depth > 8:
        return False
    if isinstance(now, float):
        if math.isnan(now) or math.isnan(was):
            return math.isnan(now) and math.isnan(was)
        return now == was and math.copysign(1.0, now) == math.copysign(1.0, was)
    if isinstance(now, (list, tuple)):
        return len(now) == len(was) and all(
            _same(a, b, depth + 1) for a, b in zip(now, was, strict=True)
        )
    if isinstance(now, dict):
        return len(now) == len(was) and all(
            _same(k, j, depth + 1) and _same(v, w, depth + 1)
            for (k, v), (j, w) in zip(now.items(), was.items(), strict=True)
        )
    try:
        return bool(now == was)
    except Exception:  # an array's comparison, which is no one bool
        return False
