"""Plain values the traced code read from the model: watched, and refused once changed.

fx runs ``forward`` once as it traces, with proxies for tensors only: a plain value
the forward reads from the model — ``self.temperature``, a function kept as
``self.act``, a list of scales, a flag — is traced into the code as the value it had
then. Changed after ``wrap``, the model would compute with the new value and the
wrapped one with the old, silently. So the values each module's attributes give
while it is traced are noted (:func:`reading`), and :class:`Values` looks at each
before every eager forward — by identity, and a list's, dict's or set's items too —
and refuses the call once one changed (``WrapError``, naming it): the model is
wrapped again, or the value kept in a buffer, which the code reads as it runs.

Tensors and submodules are not noted here: the code reads them by reference, and
:mod:`somatize_torch._parts` keeps it pointed at what the model holds. Nor is what a
value holds deeper (an attribute of a config object the model keeps, a numpy array
written in place), a global the forward reads, or what compiled code runs: those are
traced as they were, unseen.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import operator
import reprlib
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from somatize_torch._errors import WrapError
from somatize_torch._settings import _TORCH_OWN

_ABSENT: Any = object()

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


class Read(NamedTuple):
    """``name`` of ``module``, which is ``path`` in the model (``""`` for the model)."""

    path: str
    module: nn.Module
    name: str


@contextlib.contextmanager
def reading(model: nn.Module) -> Iterator[list[Read]]:
    """While in the block, the plain values read from ``model``'s modules' own
    attributes are noted, in the list it gives, once each.

    Each module is given, for the block, a subclass of its class that notes what is
    read (same name, same module, nothing else changed), and its class back after.
    A module whose class cannot be so stood in for — a class that runs code when
    subclassed (``__init_subclass__``, a metaclass of its own), or whose instances
    cannot change class — is not watched."""
    paths = {id(module): path for path, module in model.named_modules()}
    noted: dict[tuple[int, str], Read] = {}

    def note(module: nn.Module, name: str) -> None:
        key = (id(module), name)
        if key not in noted and id(module) in paths:
            noted[key] = Read(paths[id(module)], module, name)

    stand_ins: dict[type, type | None] = {}
    swapped: list[tuple[nn.Module, type]] = []
    found: list[Read] = []
    try:
        for module in model.modules():
            kind = type(module)
            if kind not in stand_ins:
                stand_ins[kind] = _noting(kind, note)
            stand_in = stand_ins[kind]
            if stand_in is None:
                continue
            try:
                module.__class__ = stand_in
            except TypeError:
                continue
            swapped.append((module, kind))
        yield found
    finally:
        for module, kind in swapped:
            module.__class__ = kind
        found.extend(noted.values())


def _noting(kind: type, note: Any) -> type | None:
    """A subclass of ``kind`` whose attribute reads ``note`` each plain value an instance
    keeps as its own, or None where subclassing ``kind`` runs code of its own."""
    if type(kind) not in (type, abc.ABCMeta) or any(
        "__init_subclass__" in vars(base) for base in kind.__mro__[:-1]
    ):
        return None
    read = cast("Callable[[Any, str], Any]", kind.__getattribute__)

    def __getattribute__(self: Any, name: str) -> Any:
        value = read(self, name)
        if name not in _UNNOTED and not (name.startswith("__") and name.endswith("__")):
            own = read(self, "__dict__")
            if own.get(name, _ABSENT) is value and not isinstance(value, (torch.Tensor, nn.Module)):
                note(self, name)
        return value

    try:
        return type(
            kind.__name__,
            (kind,),
            {
                "__getattribute__": __getattribute__,
                "__module__": kind.__module__,
                "__qualname__": kind.__qualname__,
                "__slots__": (),
            },
        )
    except TypeError:
        return None


_UNNOTED = _TORCH_OWN | {"train"}
"""torch's own tables and flag (the training flag picks the code that runs, see
``Wrapped._mode``), and the stand-in for ``train`` freezing puts on a frozen module."""


class Values:
    """The plain values the traced code read, as the model holds them now; asking
    whether any changed, which every eager forward does, costs a look by identity per
    value (and per item of a list, dict or set)."""

    def __init__(self, reads: Iterable[Read], model: str) -> None:
        self.model = model
        """The model's class, for messages."""
        self.reads: list[Read] = []
        self._tables: list[dict[str, Any]] = []
        self._names: list[str] = []
        self._values: list[Any] = []
        self._containers: list[int] = []
        self._items: list[tuple[Any, ...]] = []
        for read in {(id(read.module), read.name): read for read in reads}.values():
            table = vars(read.module)
            value = table.get(read.name, _ABSENT)
            if value is _ABSENT or isinstance(value, (torch.Tensor, nn.Module)):
                continue
            self.reads.append(read)
            self._tables.append(table)
            self._names.append(read.name)
            self._values.append(value)
            if isinstance(value, (list, dict, set)):
                self._containers.append(len(self._values) - 1)
                self._items.append(_items(value))
        self._copies = {i: _copy(self._values[i]) for i in self._containers}

    @property
    def names(self) -> frozenset[str]:
        """The names read from the model itself."""
        return frozenset(read.name for read in self.reads if not read.path)

    def check(self) -> None:
        """WrapError when a value the code read holds another value now; a value put
        back equal (the same number assigned again) is taken as it is."""
        if all(map(operator.is_, map(dict.get, self._tables, self._names), self._values)) and all(
            map(_same_items, (_items(self._values[i]) for i in self._containers), self._items)
        ):
            return
        for i, read in enumerate(self.reads):
            was = self._values[i]
            now = self._tables[i].get(read.name, _ABSENT)
            if i in self._copies:
                slot = self._containers.index(i)
                if now is was and _same_items(_items(now), self._items[slot]):
                    continue
                if not _equal(now, self._copies[i]):
                    raise self._changed(read, self._copies[i], now)
                self._values[i] = now
                self._items[slot] = _items(now)
                self._copies[i] = _copy(now)
            elif now is not was:
                if not _equal(now, was):
                    raise self._changed(read, was, now)
                self._values[i] = now

    def _changed(self, read: Read, was: Any, now: Any) -> WrapError:
        where = f"{read.path}.{read.name}" if read.path else read.name
        became = "was removed" if now is _ABSENT else f"is {_shown(now)} now"
        return WrapError(
            f"`{where}` was {_shown(was)} when `wrap` traced `{self.model}.forward`, "
            f"which read it, and {became}: fx traced the value it read into the code the "
            "wrapped model runs, which would go on computing with the old one. Wrap the model "
            "again after changing it (`somatize.torch.wrap(model, ...)`, then `freeze`), or "
            "keep the value in a buffer (`self.register_buffer(...)`), which the code reads "
            "as it runs"
        )


def _shown(value: Any) -> str:
    """A value as a message shows it: a function by its name, anything else by a ``repr``
    cut short."""
    if isinstance(value, types.BuiltinFunctionType):
        return f"`{value.__module__ or '?'}.{value.__name__}`"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"`{getattr(value, '__module__', None) or '?'}.{value.__qualname__}`"
    return _SHOWN.repr(value)


def _items(value: Any) -> tuple[Any, ...]:
    """A list's or set's items, or a dict's keys and values, held (so that none is freed
    and its address taken by another)."""
    return (*value, *value.values()) if isinstance(value, dict) else tuple(value)


def _same_items(now: tuple[Any, ...], was: tuple[Any, ...]) -> bool:
    return len(now) == len(was) and all(map(operator.is_, now, was))


def _copy(value: Any) -> Any:
    """A list, dict or set as it is now: its items are what the code read."""
    return copy.copy(value)


def _equal(now: Any, was: Any) -> bool:
    """Whether ``now`` is the value ``was`` was: of the same type and equal (a value
    whose comparison fails or is not a bool is taken as another)."""
    if now is _ABSENT or type(now) is not type(was):
        return False
    if isinstance(now, float) and now != now and was != was:  # NaN again
        return True
    try:
        return bool(now == was)
    except Exception:  # an array's comparison, which is no one bool
        return False
