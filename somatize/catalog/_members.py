"""What a class attribute is, read plainly: the predicates every part of a fingerprint asks.

Whether a value is plain (a constant of the types that name themselves), a table (a
dict, list or set), which plain functions an attribute runs (through static and class
methods, properties, partials and wrappers), and which classes are the library's rather
than the node's (:func:`_left_out`: no fingerprint covers them). Nothing here reads code
or keeps state.
"""

from __future__ import annotations

import array
import collections
import contextlib
import contextvars
import functools
import inspect
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import (
    FunctionType,
    GetSetDescriptorType,
    MemberDescriptorType,
    ModuleType,
)
from typing import Any

from somatize.catalog._project import main_named, project_of

_LEFT_OUT = frozenset({"torch"})
"""Packages whose classes no fingerprint covers, besides the standard library's: the
library a node is written against, not the node's code — an upgrade of torch does not
make every answer drifted."""


def _ancestry(kind: type) -> tuple[type, ...]:
    """The classes whose code and values ``kind``'s instances run and read: those it
    inherits from, and its metaclass and those that inherits from (``type(self).by`` finds
    a value set on the metaclass)."""
    meta: type = type(kind)
    return (*kind.__mro__, *meta.__mro__)


def _not_library(kind: type) -> list[type]:
    """``kind`` and the classes it inherits from, short of the library's (:func:`_left_out`)."""
    return [above for above in kind.__mro__ if not _left_out(above)]


def _read_through(kind: type) -> list[type]:
    """The classes a class's own name finds what it reads on (``Helper.by``, ``Helper.run``):
    ``kind``'s :func:`_ancestry`, its metaclass's classes too, short of the library's and
    of those named by their name alone as a class is named (:func:`named_by_name`)."""
    by_name = _BY_NAME.get()
    return [
        above
        for above in dict.fromkeys(_ancestry(kind))
        if not _left_out(above) and above not in by_name
    ]


_BY_NAME: contextvars.ContextVar[frozenset[type]] = contextvars.ContextVar(
    "by_name", default=frozenset()
)
"""The installed packages' classes a class of the user's code being named derives from,
named by their name alone (:func:`named_by_name`)."""


@contextlib.contextmanager
def named_by_name(classes: Iterable[type]) -> Iterator[None]:
    """Leaves ``classes`` out of what :func:`_read_through` finds while a class deriving
    from them is named: an installed package's classes, named by their name."""
    token = _BY_NAME.set(_BY_NAME.get() | frozenset(classes))
    try:
        yield
    finally:
        _BY_NAME.reset(token)


def _left_out(kind: type) -> bool:
    """Whether ``kind`` is the library's rather than the node's: Node, a class of the
    standard library (``object``), or one of a package of :data:`_LEFT_OUT`."""
    from somatize.node import Node

    top = kind.__module__.partition(".")[0]
    return kind is Node or top in _LEFT_OUT or standard_module(top)


def _of_the_standard_library(value: Any) -> bool:
    """Whether ``value`` is defined in Python's standard library (its ``__module__``, as
    :func:`standard_module` takes it)."""
    module = getattr(value, "__module__", None)
    return isinstance(module, str) and standard_module(module.partition(".")[0])


def standard_module(top: str) -> bool:
    """Whether the module loaded as ``top`` is Python's own: named as one of the standard
    library's, and built in or loaded from where Python keeps it. A user's own module
    named like one (``code.py``, ``mailbox.py``) is the user's code, whose edits drift the
    nodes it holds."""
    if top not in _STANDARD:
        return False
    loaded = sys.modules.get(top)
    found = _STANDARD_LOADED.get(top)
    if found is None or found[0] is not loaded:
        found = _STANDARD_LOADED[top] = (loaded, _loaded_from_python(top, loaded))
    return found[1]


_STANDARD = frozenset(sys.stdlib_module_names) | {"builtins"}

_STANDARD_LOADED: dict[str, tuple[Any, bool]] = {}
"""A top module's name in :data:`_STANDARD` → the module loaded under it when it was looked
at, and whether that one is Python's own."""


def _loaded_from_python(top: str, loaded: Any) -> bool:
    """Whether ``loaded``, the module loaded as ``top`` (None: none is), is Python's own:
    built in (no file), or read from the standard library's folder, not from a user's
    folder or from site-packages."""
    if loaded is None:
        return True  # no user's module under that name: Python's, loaded later or never
    where = getattr(loaded, "__file__", None)
    if isinstance(where, os.PathLike):
        where = os.fspath(where)
    if not isinstance(where, str):  # none, or what no module says (a stand-in's own)
        return top in sys.builtin_module_names or top == "builtins" or _frozen(loaded)
    where = os.path.realpath(where)
    return not _SITE.intersection(Path(where).parts) and any(
        os.path.commonpath((where, folder)) == folder for folder in _STANDARD_FOLDERS
    )


def _frozen(loaded: Any) -> bool:
    """Whether ``loaded`` is a module frozen into Python itself."""
    spec = getattr(loaded, "__spec__", None)
    return spec is not None and spec.origin in ("frozen", "built-in")


_STANDARD_FOLDERS = tuple(
    {
        *(os.path.realpath(sysconfig.get_paths()[which]) for which in ("stdlib", "platstdlib")),
        # A standard library shipped zipped (an embedded Python), on the path as one file.
        os.path.realpath(
            os.path.join(
                sys.base_prefix, "lib", f"python{sys.version_info[0]}{sys.version_info[1]}.zip"
            )
        ),
    }
)
"""Where Python keeps its standard library (in a virtual environment: the base Python's)."""

_SITE = frozenset({"site-packages", "dist-packages"})
"""The folders packages are installed in, which may lie in one of
:data:`_STANDARD_FOLDERS`."""


_SOMATIZE = ("somatize", "somatize_torch")
"""somatize's own packages: the library, not a node's code."""


def _somatize_own(kind: type) -> bool:
    """Whether ``kind`` is a class of somatize's own packages, which a node's module or class
    may hold an object of (a codec): written the same wherever the same version runs."""
    return kind.__module__.partition(".")[0] in _SOMATIZE


def _library_module(top: str) -> bool:
    """Whether the top-level module ``top`` is the library's a node is written against, not
    the node's code: torch's (:data:`_LEFT_OUT`), somatize's, or the standard library's
    (:func:`standard_module`), even run from a checkout beside the user's code."""
    return top in _LEFT_OUT or top in _SOMATIZE or standard_module(top)


def _unwritten_lineage(kind: type) -> bool:
    """Whether a fingerprint leaves ``kind`` out of the lineage it digests: a class of the
    library's (:func:`_left_out`), or of somatize's own packages (a source such as
    ``Parquet``, a node's class inherits from or is): the code a node is written against,
    not the node's, so an upgrade of somatize, whose store and sources its classes' code
    reaches, drifts no answer kept by the one before."""
    return _left_out(kind) or _somatize_own(kind)


class _Same:
    """An object a class body holds, equal to another only when it holds the same object."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.held is self.held

    __hash__ = None  # type: ignore[assignment]


_CONTAINERS = (list, dict, set, frozenset, tuple, collections.OrderedDict)


def _table(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds a dict, list or set of plain values (``table =
    {"by": 2}``, a cache its code fills): named by what it holds (:func:`_held_bytes`, read
    each time, so one changed in place is marked from then on, and watched as a marked
    object is: what its node's forward changes in it is its state)."""
    return not _dunder(name) and type(member) in _CONTAINERS and not _plain(member)


_FILLABLE = frozenset(
    {collections.deque, collections.Counter, collections.defaultdict, array.array}
)
"""The standard library's containers a class's code may fill in place as it fills a list or
a dict (:func:`_fillable`)."""


def _fillable(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds what its code may fill in place: a table
    (:func:`_table`), or a ``deque``, a ``Counter``, a ``defaultdict`` or an ``array`` — one
    its node's forward fills (a log, ``self.recent.append(x)``) is its state, as a list it
    fills is (:func:`~somatize.catalog._bytecode._fillers`), not a change to its code."""
    return _table(name, member) or (not _dunder(name) and type(member) in _FILLABLE)


def _settable(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds an object its code may set attributes of in place
    (a ``SimpleNamespace``, an object of a helper class): no table, plain value, function,
    class nor module, nor an object of torch's (a tensor, named by its values). One its
    node's forward sets an attribute of (``self.ns.n += 1``) is its state, as a table it
    fills is (:func:`~somatize.catalog._bytecode._fillers`)."""
    if _dunder(name) or _plain(member) or type(member) in _CONTAINERS or _fillable(name, member):
        return False
    if isinstance(member, (type, ModuleType)) or _functions_in(member):
        return False
    return type(member).__module__.partition(".")[0] not in _LEFT_OUT


def _kept_in_place(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds what its node's forward may change in place as its
    state: a table it fills (:func:`_fillable`), or an object it sets an attribute of
    (:func:`_settable`)."""
    return _fillable(name, member) or _settable(name, member)


def _joined(label: bytes, parts: list[bytes]) -> bytes:
    return label + b"(" + b"".join(len(p).to_bytes(8, "little") + p for p in parts) + b")"


def _put(digest: Any, *pieces: bytes) -> None:
    for piece in pieces:
        digest.update(len(piece).to_bytes(8, "little") + piece)


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _plain(value: Any) -> bool:
    """Whether ``value`` is a plain constant: None, a number, a string, bytes, or a tuple
    or frozenset of them, each of those very types or of a class of the library's
    (``re.IGNORECASE``) — not of a class of the node's own (``class Mode(str)``, a named
    tuple), whose code is named with it (:func:`_held_bytes`)."""
    kind = type(value)
    if kind not in _PLAIN_OR_OF_PLAIN and (
        not isinstance(value, _VALUE_BASES) or not _left_out(kind)
    ):
        return False
    if isinstance(value, (tuple, frozenset)):
        return all(_plain(member) for member in value)
    return True


_PLAIN_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_OR_OF_PLAIN = _PLAIN_TYPES | {tuple, frozenset}
"""The very types of plain constants (:func:`_plain`), those holding them included."""


_VALUE_BASES = (int, float, complex, str, bytes, tuple, frozenset)
"""The classes of plain constants a class may be made from (``class Mode(str)``)."""


def _value_base(kind: type) -> type | None:
    """The class of :data:`_VALUE_BASES` ``kind`` is made from, where it is a subclass of
    it; else None."""
    if kind in _PLAIN_OR_OF_PLAIN:
        return None
    return next((base for base in _VALUE_BASES if issubclass(kind, base)), None)


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
    it wraps (``functools.wraps``) — what it wraps first, then the wrappers around it of a
    decorator of the user's code (:func:`_wrappers_of`), which run too —, or a
    partial (``functools.partial``, ``partialmethod``) made of (:func:`_bound_in` says the
    arguments it binds)."""
    kind = type(member)
    if kind is FunctionType and "__wrapped__" not in member.__dict__:  # as unwrapping finds
        return [member]
    if kind in _PLAIN_TYPES or kind in _BARE:  # no function, nothing to unwrap
        return []
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    while isinstance(member, _PARTIALS):
        member = member.func
    if isinstance(member, functools.cached_property):
        member = member.func
    held = [member.fget, member.fset, member.fdel] if isinstance(member, property) else [member]
    out: list[FunctionType] = []
    for function in held:
        wrappers: list[FunctionType] = []
        # a decorator that wraps itself (ValueError), or an object whose own __getattr__
        # raises what hasattr does not take for "no such attribute": left as it is
        with contextlib.suppress(Exception):
            unwrapped = inspect.unwrap(function) if function is not None else None
            wrappers = _wrappers_of(function, unwrapped)
            function = unwrapped
        if isinstance(function, FunctionType):
            out.append(function)
            out += wrappers
    return out


def _wrappers_of(function: Any, unwrapped: Any) -> list[FunctionType]:
    """The plain functions ``function`` runs around ``unwrapped``, what it wraps (the
    ``wrapper`` a decorator of the code makes, ``functools.wraps``; the ``__call__`` of an
    object that wraps it, ``functools.update_wrapper(self, function)``), outermost first —
    each written in the user's code (:func:`_of_the_code`): a decorator of the
    library's or of an installed package (``torch.no_grad``, ``functools.lru_cache``) is
    not the node's code, and its upgrade drifts nothing."""
    if not isinstance(unwrapped, FunctionType) or not isinstance(unwrapped.__module__, str):
        return []
    module = unwrapped.__module__
    found = []
    while function is not unwrapped:
        runs = function
        if type(function) is not FunctionType:  # an object: the `__call__` its class runs
            kinds = type(function).__mro__
            runs = next((vars(k)["__call__"] for k in kinds if "__call__" in vars(k)), None)
        made_in = getattr(runs, "__globals__", {}).get("__name__")
        if type(runs) is FunctionType and _of_the_code(made_in, module):
            found.append(runs)
        function = function.__wrapped__
    return found


def _of_the_code(defined: Any, module: str) -> bool:
    """Whether what is defined in module ``defined`` (a function, a wrapper, a module), that
    the code of ``module`` runs or reads, is the user's code: written in that module or its
    package (:func:`_same_package`), or in another package that is not installed (a team's
    shared checkout on ``$PYTHONPATH``, :func:`project_of`), whose edits change what the
    node computes as the node's own do. Not one of the library's (the standard library's,
    torch's, somatize's) nor of an installed package, whose upgrade would drift every
    answer."""
    if not isinstance(defined, str):
        return False
    if defined == module or _same_package(defined, module):
        return True
    return _users_module(defined)


def _users_module(defined: str) -> bool:
    """Whether the module ``defined`` is the user's code, wherever it lies: not the
    library's nor an installed package's, whose upgrade would drift every answer."""
    top = main_named(defined.partition(".")[0])
    return not _library_module(top) and project_of(top) is not None


_PARTIALS = (functools.partial, functools.partialmethod)


_BARE = frozenset({list, dict, set, frozenset, tuple, GetSetDescriptorType, MemberDescriptorType})
"""Classes whose objects hold no attribute of their own (``__wrapped__``) and are no
function: :func:`_functions_in` finds none in them without unwrapping them."""


def _same_package(defined: str, module: str) -> bool:
    """Whether a function defined in module ``defined``, imported by module ``module``, is of
    the same package (``proj.tools`` for ``proj.nodes``), or of a top-level module found in
    the same folder of the user's code (``helpers`` beside the script ``train.py`` or the
    module ``nodes``, :func:`project_of`): the same project's code, written with it — not
    another package's (an upgrade of which would drift every answer), nor the standard
    library's or torch's. A function of no module (``exec(text, {})``) is of none."""
    if not isinstance(defined, str) or not isinstance(module, str):
        return False
    top = main_named(defined.partition(".")[0])
    if top == "__main__" or _library_module(top):
        return False
    reader = main_named(module.partition(".")[0])
    if top == reader:
        return True
    found = project_of(top)
    return found is not None and found == project_of(reader)


_EMPTY = object()
"""What an empty slot is read as (:class:`_Slots`)."""


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
        for above in _not_library(kind)
        for member in list(vars(above).values())
        if isinstance(member, MemberDescriptorType) and member.__objclass__ is above
    ]
