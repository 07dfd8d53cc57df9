"""A function named by how it is written: its source or code, its defaults and what it
closes over (:func:`_function_bytes`), worked out again once it is given other code or
defaults in place.

An object a function closes over, takes by default or a partial binds is named as an
object a class holds is (:mod:`~somatize.catalog._held`); an object of the library's by its
type; a table taken by default that its own code does not fill, by what it holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections.abc import Iterable, Iterator
from types import (
    BuiltinFunctionType,
    CellType,
    FunctionType,
    MethodType,
    ModuleType,
)
from typing import Any

from somatize.catalog._bytecode import _LOCAL_LOADS, _cells_set_by, _tables_changed_by
from somatize.catalog._code import _code_bytes, _constant_bytes, _source_of
from somatize.catalog._held import (
    _builtin_bytes,
    _contained_bytes,
    _held_bytes,
    _library_bytes,
    _opaque_bytes,
)
from somatize.catalog._marks import _token_of, _version_of
from somatize.catalog._members import (
    _CONTAINERS,
    _PARTIALS,
    _dunder,
    _exactly_plain,
    _functions_in,
    _left_out,
    _of_the_code,
    _of_the_standard_library,
    _plain,
    _put,
    _read_through,
    _Same,
    named_by_name,
)
from somatize.catalog._project import qualified
from somatize.catalog._rebuild import identity_of

_FUNCTIONS: weakref.WeakKeyDictionary[FunctionType, tuple[Any, bytes, bool]] = (
    weakref.WeakKeyDictionary()
)
"""A function → the code it ran and its defaults (:func:`_made_of`), the digest of them
(:func:`_function_bytes`), worked out again when it is given other code (``f.__code__
= ...``, as a reloader does) or other defaults (``f.__defaults__ = ...``), and whether
that digest reached no class a function closes over (:func:`_closed_class_bytes`), and
so is the same inside the code of such a class."""


class _Closed:
    """An object a function closes over or takes by default, in what :func:`_made_of` says of
    the function: equal to another only when it holds the same object, as :class:`_Same`
    is, but held weakly where it can be. The function holds it as long as it holds it, and
    held here it would hold the function's entry in :data:`_FUNCTIONS`, and so the function,
    alive for good: a method calling ``super()`` closes over its class, which holds the
    method, and a notebook's cell run again makes both anew."""

    __slots__ = ("held", "weakly")

    def __init__(self, held: Any) -> None:
        try:
            self.held, self.weakly = weakref.ref(held), True
        except TypeError:  # None, a number, a tuple: no weak reference to them
            self.held, self.weakly = held, False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Closed) or other.weakly is not self.weakly:
            return False
        if not self.weakly:
            return other.held is self.held
        held = self.held()
        return held is not None and held is other.held()

    __hash__ = None  # type: ignore[assignment]


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
    ``os.environ``, a lock, a bare ``object()`` sentinel, a logger): named by its type (one
    said whole by :func:`_library_bytes`, a pattern, a dtype, by that), the same in every
    process whatever it holds, and not watched — a mark of that very object
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
    if _of_the_standard_library(function):
        # Python's own (what `enum` sets on an enum: `_generate_next_value_`) is written
        # otherwise by each Python version, and is no code of the node's: named by its name.
        return b"standard " + qualified(function).encode()
    naming = _naming()
    met = naming.met
    made_of = _made_of(function)
    # one reaching a class a function closes over is named otherwise inside that class's
    # code, which names it by its name alone (:func:`_closed_class_bytes`): kept, and taken,
    # only outside any; one reaching none is the same everywhere
    outside = not naming.classes
    found = _FUNCTIONS.get(function)
    if found is not None and found[0] == made_of and (outside or found[2]):
        if not found[2]:
            naming.met += 1
        return found[1]
    source = _source_of(function)
    digest = hashlib.sha256()
    if source is not None:
        _put(digest, b"source", source)
    else:
        _put(digest, b"code", _code_bytes(function.__code__))
    within |= {id(function)}
    _put_defaults(digest, function, within)
    if function.__closure__:
        cells = zip(function.__code__.co_freevars, function.__closure__, strict=False)
        state = _cells_set_by(function)
        _put(
            digest,
            b"closes",
            *(
                n.encode()
                + b"\0"
                + (b"state" if n in state else _cell_bytes(n, c, within, function.__module__))
                for n, c in cells
            ),
        )
    written = digest.digest()
    alike = naming.met == met  # reached no class a function closes over
    if outside or alike:
        _FUNCTIONS[function] = (made_of, written, alike)
    return written


def _put_defaults(
    digest: Any, function: FunctionType, within: frozenset[int] = frozenset()
) -> None:
    """Puts into ``digest`` what ``function`` takes by default, positional and by keyword
    (``within``: the functions being digested around it, as :func:`_function_bytes` says)."""
    kwdefaults = sorted((function.__kwdefaults__ or {}).items())
    defaults = (_default_bytes(v, within) for v in function.__defaults__ or ())
    _put(digest, b"defaults", *defaults)
    keywords = (n.encode() + b"\0" + _default_bytes(v, within) for n, v in kwdefaults)
    _put(digest, b"keywords", *keywords)


def _made_function_bytes(function: FunctionType) -> bytes:
    """A function made for a class from a text of its own (a dataclass's ``__init__``, a
    named tuple's ``__new__``), by what it takes by default alone: its code is the Python
    version's as much as the class's, but a default set on it by hand
    (``Config.__init__.__defaults__ = (3,)``) is what a call leaving it out is given."""
    digest = hashlib.sha256(b"made\0")
    _put_defaults(digest, function)
    return digest.digest()


def _made_of(function: FunctionType, within: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    """What of ``function`` its digest is worked out from, to tell it changed since: its code,
    its defaults and what each of its cells holds, each by identity (a default replaced in
    place, ``f.__defaults__ = (50,)`` or ``f.__kwdefaults__["by"] = 70``, a cell set by the
    function that shares it, ``nonlocal scale; scale = 3``, is told apart), and each object
    it closes over that is named by what it holds (:func:`_held_bytes`) by that name, else
    by identity (one changed in place since it was named is marked from then on), and each
    table it takes by default (:func:`_default_tables`) by what it holds, each class of the
    user's code it closes over by how it is written now (:func:`_closed_class_bytes`:
    ``Box.k = 3`` is seen), and what each
    function it closes over or takes by default is made of in turn (what a decorator wraps,
    given other code in place; ``within``: the functions around it, which one that closes
    over itself names)."""
    keywords = function.__kwdefaults__ or {}
    within |= {id(function)}
    closed = tuple(
        _made_of(f, within) if id(f) not in within else None for f in _held_functions(function)
    )
    held = tuple(
        _held_bytes(value) or _contained_bytes(value) or (_Closed(value), _version_of(value))
        for value in _closed_objects(function)
    )
    return (
        _Same(function.__code__),
        _Same(function.__defaults__),
        tuple(map(_closed_class_bytes, _closed_classes(function))),
        tuple((name, _Closed(value)) for name, value in keywords.items()),
        held,
        _cells_now(function),
        tuple(map(_table_now, _default_tables(function.__name__, function))),
        closed,
    )


def _cells_read(function: FunctionType) -> list[Any]:
    """The cells ``function`` closes over, but those it sets itself as it runs (``nonlocal
    calls; calls += 1``, a model loaded on first use: :func:`_cells_set_by`): its state, as
    a global it assigns is, named as state and not by what it holds now."""
    closure = function.__closure__ or ()
    state = _cells_set_by(function) if closure else frozenset()
    names = function.__code__.co_freevars
    return [cell for name, cell in zip(names, closure, strict=False) if name not in state]


def _held_functions(function: FunctionType) -> list[FunctionType]:
    """The plain functions ``function`` closes over (what a decorator wraps; in its own
    cells read as it runs: :func:`_cells_read`), each filled, then those it takes by
    default (``step=lambda x: x + STEP``)."""
    found = []
    for cell in _cells_read(function):
        with contextlib.suppress(ValueError):  # not filled yet
            if isinstance(cell.cell_contents, FunctionType):
                found.append(cell.cell_contents)
    defaults = (*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values())
    return found + [value for value in defaults if isinstance(value, FunctionType)]


def _cells_now(function: FunctionType) -> tuple[_Closed, ...]:
    """What each cell ``function`` reads (:func:`_cells_read`) holds now, by identity (one not
    filled yet, as none)."""
    held = []
    for cell in _cells_read(function):
        try:
            held.append(_Closed(cell.cell_contents))
        except ValueError:  # not filled yet
            held.append(_Closed(None))
    return tuple(held)


def _closed_objects(function: FunctionType) -> list[Any]:
    """The objects ``function`` closes over, or takes as defaults, that :func:`_cell_bytes`
    may name by what they hold: no plain value, function, class nor module."""
    found = []
    for cell in _cells_read(function):
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


def _default_bytes(value: Any, within: frozenset[int] = frozenset()) -> bytes:
    """A default value of a function: a function by how it is written, as one it closes
    over is (``step=lambda x: x + STEP``; ``within``, as :func:`_function_bytes` says), an
    object (:func:`_default_object`) as one the function closes over (:func:`_cell_bytes`),
    so that one changed in place is seen; any other by :func:`_value_bytes`."""
    if isinstance(value, FunctionType):
        return b"itself" if id(value) in within else b"function " + _function_bytes(value, within)
    return _argument_bytes(value) if _default_object(value) else _value_bytes(value)


def _cell_bytes(name: str, cell: Any, within: frozenset[int], module: str = "") -> bytes:
    """What a function closes over, in the cell of its free variable ``name``: a plain
    value by what it is, a function by :func:`_function_bytes`, the class a method calling
    ``super()`` was defined in (``__class__``) by its name, another class by its name where
    that leads back to it (and how it is written, one of the user's code as ``module``, the
    function's, sees it: :func:`_written_class`), an object whose state is all named by
    what it is by that (:func:`_held_bytes`), a container holding objects by what it holds
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
        return f"class {qualified(value)}".encode()
    if isinstance(value, type) and identity_of(value) is not None:
        if _written_class(value, module):
            return _closed_class_bytes(value)
        return f"class {identity_of(value)}".encode()
    if isinstance(value, ModuleType):
        return f"module {value.__name__}".encode()
    if isinstance(value, BuiltinFunctionType) and (builtin := _builtin_bytes(value)):
        return builtin
    return _held_bytes(value) or _contained_bytes(value) or _token_of(value)


class _Naming(threading.local):
    """What this thread is naming of the classes functions close over
    (:func:`_closed_class_bytes`)."""

    def __init__(self) -> None:
        self.classes: set[int] = set()
        """The ids of the classes whose code it is naming."""
        self.met = 0
        """How many times such a class was named, to tell a function's digest that reached
        none (:func:`_function_bytes`)."""
        self.read: dict[int, tuple[type, Any]] | None = None
        """What each class was read to hold (:func:`_class_now`) in the naming under way
        (:func:`_one_reading`), where one is: none changes while it is named."""


_NAMING = _Naming()


def _naming() -> _Naming:
    """What this thread is naming of the classes functions close over."""
    return _NAMING


def _written_class(kind: type, module: str) -> bool:
    """Whether ``kind``, a class a function of ``module`` closes over, is named by how it
    is written (:func:`_closed_class_bytes`): one of the user's code (:func:`_of_the_code`:
    of that module's package, or of one not installed), not torch's, the standard
    library's nor an installed package's, whose upgrade would drift every answer. One
    deriving from an installed package's class (a pydantic model of one's own) is named by
    how it is written itself, and that class by its name (:func:`_installed_above`)."""
    return not _left_out(kind) and _of_the_code(kind.__module__, module)


def _installed_above(kind: type) -> list[type]:
    """The classes of an installed package ``kind``, a class of the user's code, derives
    from: named by their name, as a class of theirs closed over is, since what their code
    holds need not be named alike in every process (pydantic's sentinel defaults)."""
    return [
        above
        for above in _read_through(kind)
        if not _of_the_code(above.__module__, kind.__module__)
    ]


def _closed_classes(function: FunctionType) -> list[type]:
    """The classes ``function`` closes over, in cells it reads (:func:`_cells_read`), that
    its digest names by how they are written (:func:`_written_class`); not the class its
    code is written in (``__class__``)."""
    if not function.__closure__:
        return []
    state = _cells_set_by(function)
    found = []
    for name, cell in zip(function.__code__.co_freevars, function.__closure__, strict=False):
        if name in state or name == "__class__":
            continue
        with contextlib.suppress(ValueError):  # not filled yet
            value = cell.cell_contents
            named = isinstance(value, type) and identity_of(value) is not None
            if named and _written_class(value, function.__module__):
                found.append(value)
    return found


def _classes_reached(functions: Iterable[FunctionType]) -> list[type]:
    """The classes ``functions``, and the functions they close over or take by default in
    turn (:func:`_held_functions`), close over and name by how they are written
    (:func:`_closed_classes`), once each: what a watch looks into, so that ``Box.k = 3``
    is seen at the next forward."""
    queue, seen = list(functions), set()
    found: dict[type, None] = {}
    while queue:
        function = queue.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        found.update(dict.fromkeys(_closed_classes(function)))
        queue += _held_functions(function)
    return list(found)


def _closed_class_bytes(kind: type) -> bytes:
    """A class a function closes over (one a factory is handed: ``scaled_by(Box)``) that is
    of the user's code (:func:`_written_class`), by its name and how it is written, as a
    class a class holds is — so that the class edited, or given another value in place, is
    other code. One met again while its code is named (a class whose own method closes
    over it) is named by its name there."""
    name = f"class {identity_of(kind)}".encode()
    naming = _naming()
    naming.met += 1
    if id(kind) in naming.classes:
        return name
    # imported here: naming a class's code names its functions, by this module
    from somatize.catalog._names import _helper_class_bytes

    installed = _installed_above(kind)
    if installed:
        name += "".join(f" from {identity_of(above)}" for above in installed).encode()
    # kept only as named from outside any other such class, the same wherever it is asked
    outermost = not naming.classes
    with named_by_name(installed):
        with _one_reading():
            now = _class_now(kind) if outermost else None
        found = _CLASSES.get(kind) if outermost else None
        if found is not None and found[0] == now:
            return found[1]
        naming.classes.add(id(kind))
        try:
            written = name + b"\0" + _helper_class_bytes(kind)
        finally:
            naming.classes.discard(id(kind))
    if outermost:
        _CLASSES[kind] = (now, written)
    return written


_CLASSES: weakref.WeakKeyDictionary[type, tuple[Any, bytes]] = weakref.WeakKeyDictionary()
"""A class a function closes over → what it held when it was named (:func:`_class_now`)
and how it was named (:func:`_closed_class_bytes`): a class whose own methods close over
it is named once, not once for each of them."""


@contextlib.contextmanager
def _one_reading() -> Iterator[None]:
    """Reads each class a function closes over once (:func:`_class_now`) for what is named
    inside: a class whose methods close over it is read once, not once for each."""
    naming = _naming()
    if naming.read is not None:
        yield
        return
    naming.read = {}
    try:
        yield
    finally:
        naming.read = None


def _class_now(kind: type) -> tuple[Any, ...]:
    """What ``kind`` holds now (:func:`_class_read`), read once in a naming under way
    (:func:`_one_reading`)."""
    read = _naming().read
    if read is None:
        return _class_read(kind)
    found = read.get(id(kind))
    if found is None or found[0] is not kind:
        found = read[id(kind)] = (kind, _class_read(kind))
    return found[1]


def _class_read(kind: type) -> tuple[Any, ...]:
    """What ``kind`` and the classes its name reads through hold, read cheaply, to tell
    that it is named as it was (:func:`_closed_class_bytes`): each member by which object it
    is, a function also by its code, defaults and cells, any other object also by its mark
    and how a class holding it names it — a value set in place (``Box.k = 3``), a method
    given other code, a table or object changed in place since are each told."""
    now: list[Any] = []
    for above in _read_through(kind):
        now.append(_Closed(above))
        for name, member in list(vars(above).items()):
            functions = _functions_in(member)
            said: Any = None
            if functions:
                said = tuple(
                    (
                        _Same(f.__code__),
                        _Same(f.__defaults__),
                        tuple((k, _Closed(v)) for k, v in (f.__kwdefaults__ or {}).items()),
                        _cells_now(f),
                    )
                    for f in functions
                )
            elif not (_plain(member) or isinstance(member, type) or _dunder(name)):
                said = (_version_of(member), _opaque_bytes(member))
            now.append((name, _Closed(member), said))
    return tuple(now)


def _value_bytes(value: Any) -> bytes:
    """A value as the same bytes in every process: a plain one by what it is, one of the
    library's said whole by that (:func:`_library_bytes`: a pattern by its text, a dtype
    by its name), any other by its type."""
    if _plain(value):
        return _constant_bytes(value)
    library = _library_bytes(value)
    if library is not None:
        return b"library " + library
    if isinstance(value, (tuple, frozenset)):  # `(Mode("a"),)`: by what it holds
        held = _contained_bytes(value)
        if held is not None:
            return held
    kind = type(value)
    return f"a {qualified(kind)}".encode()
