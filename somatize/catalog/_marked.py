"""What is noted of an object marked by which object it is, for a graph's watch to see it
changed at the next forward (:class:`_Marked`).

Each dict, list and set read of it (:func:`_state_read`), bounded: one holding more than a
watch compares is taken as changed at every look, and the user told (:func:`_too_large`).
One noting is shared by every graph watching the object (:func:`_marked`), so that a new
mark seen by one is seen by all.
"""

from __future__ import annotations

import array
import collections
import functools
import sys
import warnings
import weakref
from collections.abc import Callable
from types import (
    BuiltinFunctionType,
    FunctionType,
    MemberDescriptorType,
    MethodType,
    ModuleType,
)
from typing import Any

from somatize._arrays import COPIED, Written
from somatize.catalog._functions import _cells_read, _closed_objects
from somatize.catalog._held import _SEQUENCES, _array, _items_base, _library_bytes
from somatize.catalog._marks import (
    _MARKED,
    _forget_held,
    _moved_on,
    _reference,
    _token_of,
    _version_of,
)
from somatize.catalog._members import (
    _CONTAINERS,
    _EMPTY,
    _exactly_plain,
    _left_out,
    _Slots,
    _slots_of,
)
from somatize.errors import SomatizeWarning


def _plain_table(value: Any, leaf: Callable[[Any], bool] = _exactly_plain) -> bool:
    """Whether ``value`` is a dict, list or set holding only plain values, or such tables, of
    fewer than :data:`_STATE_ITEMS` entries in all: one a graph's watch reads whole. ``leaf``
    says which values, besides such tables, it may hold (plain functions too, for a table a
    node's code only reads: :func:`_read_table`)."""
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
            elif not leaf(item):
                return False
    return True


_STATE_ITEMS = 4096
"""How many entries, nearest first, of the dicts, lists and sets an object marked by which
object it is holds are read for a graph's watch (:func:`_state_read`): each is compared at
every forward. One holding more cannot be watched so: it is taken as changed at every look
(:class:`_Unseen`), never as unchanged."""


class _Marked:
    """What is noted of an object marked by which object it is, shared by every graph's
    watch of it: its mark now (``version``, a list a watch copies: a new mark seen by one
    graph is seen by all), each dict, list and set read of it (:func:`_state_read`) with a
    copy of each — one copy for all, so that what a node's code changes as it runs is its
    state for every graph (:func:`state_taken`) —, its class and the functions read of it,
    with their code and defaults. ``keyed`` are the addresses of objects whose state a
    watch's taker keys itself (the modules of a model, :func:`watch_code`): one reached
    through it is compared only by which object it is, in what holds it, never read.
    ``reaches`` says whether it reached one."""

    __slots__ = (
        "__weakref__",
        "copies",
        "keyed",
        "kind",
        "label",
        "lives",
        "made",
        "reaches",
        "version",
    )

    def __init__(self, held: Any, label: str, keyed: frozenset[int] = frozenset()) -> None:
        self.label = label  # ``Kind.name`` of what first held it, to tell the user
        self.keyed = keyed
        self.reaches = False
        self.version = [_version_of(held)]
        self.lives: list[Any] = []
        self.copies: list[Any] = []
        self.read(held)

    def read(self, held: Any, whole: bool = True) -> None:
        """Reads ``held`` again, in place; with ``whole``, its class and functions too. One
        holding more than a watch reads is read with an :class:`_Unseen` last, so it is
        taken as changed at every look."""
        from somatize.catalog._watch import _copied  # the watch imports this module

        state, made, read_all, self.reaches = _state_read(held, self.keyed)
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


class _Versions:
    """A tensor's count of changes made to it in place (torch's ``_version``) and where its
    values lie, and, a tensor on the CPU of at most :data:`~somatize._arrays.COPIED` bytes,
    its bytes (:func:`_host_view`), read as they are now: equal to a list of what they were
    — so that a tensor changed in place (``Kind.part.mul_(5)``), given other memory
    (``T.data = ...``) or written past its count (``T.data[0] = 5.0``, ``T.numpy()[0] =
    5.0``, which torch does not count) is seen, though what a watch copies holds that same
    tensor. A larger one, or one on a device (whose bytes would be copied to the host at
    every look), is told by its count and its memory alone: a write past its count is not
    seen. So is one an object holds (``by_bytes`` False: a module's weights, which would be
    compared at every look, each of them)."""

    __slots__ = ("held", "view")

    def __init__(self, held: Any, by_bytes: bool = True) -> None:
        self.held = held
        self.view = _host_view(held) if by_bytes else None

    def __len__(self) -> int:
        return 1

    def values(self) -> list[Any]:
        """The count, where the values lie, and the bytes (None where not read), now."""
        held, view = self.held, self.view
        return [held._version, held.data_ptr(), None if view is None else view.tobytes("A")]

    def __eq__(self, other: object) -> bool:
        if type(other) is not list or len(other) != 3:
            return False
        held, view = self.held, self.view
        version, at, was = other
        if held._version != version or held.data_ptr() != at:
            return False
        if view is None:
            return was is None
        # the view is this watch's own: its dtype, shape and strides are those it had
        return bool(view.tobytes("A") == was)

    __hash__ = None  # type: ignore[assignment]


def _host_view(tensor: Any) -> Any:
    """A numpy array over the memory of ``tensor`` (no copy: a write through ``.data`` or
    ``.numpy()`` shows in it), where it lies on the CPU and holds at most
    :data:`~somatize._arrays.COPIED` bytes, as bytes where numpy has not its dtype
    (``bfloat16``); None for any other, or one numpy cannot view (torch built without it,
    a conjugate view)."""
    if tensor.device.type != "cpu" or tensor.nbytes > COPIED:
        return None
    values = tensor.detach()
    try:
        return values.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy has not: as bytes, where they lie so
        try:
            return values.view(sys.modules["torch"].uint8).numpy()
        except (TypeError, RuntimeError):
            return None


def _written_array(value: Any) -> bool:
    """Whether ``value`` is a numpy array named by its values (:func:`_array`: not one of
    objects), which a watch compares by its bytes (:class:`~somatize._arrays.Written`)."""
    numpy = sys.modules.get("numpy")  # not imported: nothing read is one of its arrays
    return numpy is not None and isinstance(value, numpy.ndarray) and _array(value)


class _Cells:
    """What the cells a function closes over hold, read as they are now: equal to a list of
    what they held — so that a cell set by the function sharing it (``nonlocal scale; scale
    = 5``) is seen, though the function is the same."""

    __slots__ = ("cells",)

    def __init__(self, held: FunctionType) -> None:
        self.cells = _cells_read(held)  # not those it sets itself as it runs: its state

    def __len__(self) -> int:
        return len(self.cells)

    def values(self) -> list[Any]:
        """What each cell holds now (:data:`_EMPTY` where it holds nothing yet)."""
        found = []
        for cell in self.cells:
            try:
                found.append(cell.cell_contents)
            except ValueError:
                found.append(_EMPTY)
        return found

    def __eq__(self, other: object) -> bool:
        return bool(self.values() == other)

    __hash__ = None  # type: ignore[assignment]


def _counted(value: Any) -> bool:
    """Whether ``value`` is a tensor named by its values (:func:`_array`) that counts the
    changes made to it in place (:class:`_Versions`)."""
    return _array(value) and type(getattr(value, "_version", None)) is int


def _state_read(
    held: Any, keyed: frozenset[int] = frozenset()
) -> tuple[list[Any], tuple[tuple[FunctionType, Any, Any], ...], bool, bool]:
    """What a watch reads of ``held``, an object marked by which object it is: each dict,
    list and set it holds, or holds through what it holds (an object's ``__dict__`` and
    its slots, :class:`_Slots`; a function's closure and keyword defaults, a bound
    method's object, a partial's arguments), and the namespaces of the classes of the
    objects read (short of the library's), nearest first, as far as :data:`_STATE_ITEMS`
    entries in all; each function read, with its code and defaults; and whether all was
    read (False where a dict, list or set did not fit: it is left out, and what it holds,
    and the object is taken as changed at every look). A tensor is read by its count of
    changes in place, and ``held`` itself, a small one on the CPU, by its bytes too
    (:class:`_Versions`), a numpy array by its bytes (:class:`~somatize._arrays.Written`),
    each one entry; what another
    class written in C holds but its ``__dict__`` is not read, nor what an object of the
    library's named whole holds (:func:`_library_bytes`: a lock; a logger, which holds
    every logger of the process): what the code computes with it does not change with it.
    Nor is what an object of ``keyed`` holds (a module of a model, whose weights and modes
    its taker keys): it is compared by which object it is, in the dict or list that holds
    it; the last of what is answered says whether one was reached."""
    read: list[Any] = []
    functions: list[tuple[FunctionType, Any, Any]] = []
    seen: set[int] = set()
    kinds: dict[type, list[MemberDescriptorType]] = {}  # each class read → its slots
    left = _STATE_ITEMS
    read_all = True
    reaches = False
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
        if id(value) in keyed and value is not held:
            reaches = True
            continue
        kind = type(value)
        if isinstance(value, (type, ModuleType, BuiltinFunctionType)):
            continue
        if _counted(value):  # a tensor: changed in place, by its count of changes (and,
            # the one held itself, by its bytes: not each weight of a module it holds)
            see(_Versions(value, by_bytes=value is held))
            continue
        if _written_array(value):  # a numpy array: changed in place, by its bytes
            see(Written(value))
            continue
        if _library_bytes(value) is not None:  # the library's, said whole (a logger): not read
            continue
        if kind in _CONTAINERS or kind in _SEQUENCES or kind is array.array:  # as a dict, a list
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
        if _items_base(kind) is not None and see(value):  # `Params(dict)`: its items too
            queue += list(value.values()) if isinstance(value, dict) else list(value)
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except Exception:  # none, or one that cannot be read: what it holds is not read
            continue
        if type(attributes) is dict and see(attributes):
            queue += list(attributes.values())
    return read, tuple(functions), read_all, reaches
