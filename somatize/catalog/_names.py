"""What a node's functions name in their module (:func:`_named`): the plain functions
defined there, followed on, the plain values and tables as the module's text writes them,
helper classes of its package and their objects.

Each name looked up is noted with what it held (:data:`Looked`), so that a helper or a
value rebound since (a notebook's cell run again) is seen (:func:`_still`); a table the
code only reads is named as first seen and watched (:func:`_sighted`).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib
import importlib.util
import sys
import weakref
from types import (
    BuiltinFunctionType,
    CodeType,
    FunctionType,
    MethodType,
    ModuleType,
)
from typing import Any, NamedTuple

from somatize.catalog._bytecode import (
    _GLOBAL_LOADS,
    _attributes_read,
    _fillers,
    _names_in,
    _stored_in,
    _tables_changed_by,
    globals_read,
    imports_in,
)
from somatize.catalog._code import (
    _as_imported,
    _as_parsed,
    _assigned_now,
    _assignment,
    _class_body,
    _code_bytes,
    _constant_bytes,
    _imports_of,
    _made_by,
    _module_body,
    _module_named,
    _set_since,
    _written_at,
)
from somatize.catalog._functions import (
    _bound_in,
    _default_table_bytes,
    _default_tables,
    _function_bytes,
    _held_functions,
    _made_function_bytes,
    _made_of,
    _one_reading,
)
from somatize.catalog._held import (
    _HOLDERS,
    _array,
    _array_bytes,
    _arrays_bytes,
    _contained_bytes,
    _held_bytes,
    _library_bytes,
    _opaque_bytes,
)
from somatize.catalog._marked import _marked, _plain_table
from somatize.catalog._marks import _token_of, _version_of
from somatize.catalog._members import (
    _CONTAINERS,
    _PARTIALS,
    _dunder,
    _exactly_plain,
    _fillable,
    _functions_in,
    _joined,
    _left_out,
    _of_the_code,
    _of_the_standard_library,
    _plain,
    _read_through,
    _Same,
    _same_package,
    _somatize_own,
    _table,
    _value_base,
)
from somatize.catalog._project import key_named, qualified

Looked = tuple[tuple["weakref.ref[Any]", str, Any], ...]
"""Each global name a fingerprint looked up: a function that reads it (in whose module
it was looked up; or the module, one that defines no function), the name, and what it
found there (:func:`_found_as`). The functions are held weakly, so that what a class's
fingerprint notes keeps neither the class nor its module alive."""


_ABSENT = object()


_OTHER = object()


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
        named = b"written " + _as_parsed(made).encode()
    else:
        named = _held_bytes(table) or _contained_bytes(table) or b""
    token = _token_of(table)
    _SIGHTED[token] = named or token
    _marked(table, label, table=True)  # noted now: a change before a graph watches it is seen
    return _SIGHTED[token]


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


def _still(reader: weakref.ref[Any], name: str, was: Any) -> bool:
    """Whether ``name``, in the namespace of the function (or module) ``reader``, holds what
    a fingerprint found there (:data:`Looked`); False once that function is gone."""
    function = reader()
    if function is None:
        return False
    now = _space_of(function).get(name, _ABSENT)
    if isinstance(was, _FunctionSeen):  # the same function, holding what it held
        return isinstance(now, FunctionType) and now is was.held() and _made_of(now) == was.made
    if isinstance(was, _HelperSeen):  # the same wrapped helper, binding what it bound
        return (
            now is was.held()
            and tuple(_bound_in(now)) == was.bound
            and tuple(map(_made_of, _functions_in(now))) == was.made
        )
    if isinstance(was, weakref.ref):
        held = was()
        return held is not None and now is held
    if isinstance(was, _Same):  # the same object (of a helper class)
        return now is was.held
    if isinstance(was, _ArraySeen):  # the same array, holding the same values
        held = was.held() if isinstance(was.held, weakref.ref) else was.held.held
        return held is not None and now is held and _arrays_bytes(now) == was.values
    if isinstance(was, _HeldSeen):  # the same table or object, not changed since
        return now is was.held and _version_of(now) == was.version
    if isinstance(was, _ClassSeen):  # the same helper class, written as it was
        return isinstance(now, type) and now is was.held() and _helper_class_bytes(now) == was.code
    if was is _OTHER:
        module = function.__name__ if isinstance(function, ModuleType) else function.__module__
        return now is not _ABSENT and _found_as(now, module, name) is _OTHER
    return now is was


def _helper_function_bytes(name: str, function: FunctionType) -> bytes:
    """A plain function of a node's module its code names (``name``), as a method of its
    class is named: how it is written (:func:`_function_bytes`) and each table it takes by
    default (``def scaled(x, box=[2])``) by what it holds (:func:`_default_table_bytes`),
    so that one changed in place since is other code."""
    written = _function_bytes(function)
    tables = _default_tables(name, function)
    if not tables:
        return written
    return _joined(b"defaults", [written, *map(_default_table_bytes, tables)])


def _named(functions: list[FunctionType]) -> tuple[list[tuple[bytes, bytes]], Looked]:
    """What ``functions`` name in their module, and what the functions found there name in
    turn: each plain function defined in that module (by :func:`_function_bytes`), each
    plain value, and each dict, list or set as the module's text assigns it (not by what it
    holds: a log or a cache the code fills as it runs is the same code), by
    ``module:name`` — one of plain values they only read, as it was first seen
    (:func:`_sighted`), and watched (:class:`_HeldSeen`), so that one changed in place since is
    another. Nothing is followed out of the module a function was defined in but a
    function of the user's code it imports (:func:`_of_the_code`: of another module of its
    package, or of a package not installed), followed as one defined there, a module of
    that code whose names it reads, and a function of either that one of them closes over
    (what a decorator wraps) or takes by default: no class nor function of an installed
    package, whose upgrade would drift every answer. Also each name looked up, and what
    it held (:data:`Looked`). A name these functions assign (``global CALLS; CALLS += 1``,
    a table loaded on first use) is the module's state as it runs: it is taken as the
    module's text assigns it (``CALLS = 0``), not by what it holds, and not looked at
    again."""
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
        reader, code = weakref.ref(function), function.__code__
        stored.update((module, name) for name in _stored_in(code))
        names = globals_read(code)  # not `self.encoder`: no global `encoder` is read
        held = {n for n in names if type(space.get(n)) in _CONTAINERS}
        if held:
            changed = _tables_changed_by(code, held, _GLOBAL_LOADS)
            filled.update((module, name) for name in changed)
        reads = [(module, space, reader, name) for name in sorted(names)]
        modules: set[int] = set()  # each module of its package it reads names in, once
        for imported in _imported_as_it_runs(function):
            # `from .config import FACTOR` inside the function: what it takes imported is read,
            # as a name of its module is
            within = _reader_in(imported)
            if within is not None and id(vars(imported)) not in modules:
                modules.add(id(vars(imported)))
                taken = (imports_in(code)[1] | _attributes_read(code)) & vars(imported).keys()
                reads += ((imported.__name__, vars(imported), within, n) for n in sorted(taken))
        for closed in _held_functions(function):
            # what a decorator wraps (`functools.wraps`), a function taken by default: what
            # it names is followed too
            if id(closed) not in seen and _of_the_code(closed.__module__, module):
                seen.add(id(closed))
                queue.append(closed)
        for place, label, replaced_as, within, held in _torch_replaced(function):
            # a function of torch's set in place of torch's own (`F.relu = my_relu`): by
            # what it is, as a fake set in place of what a module imports is
            out[place] = (label, replaced_as)
            if within is not None:
                looked.setdefault(place, (within, place[1], _found_as(held, *place)))
            if isinstance(held, FunctionType) and id(held) not in seen:
                seen.add(id(held))
                queue.append(held)
        for module, space, reader, name in reads:
            place = (module, name)
            if name not in space:
                looked.setdefault(place, (reader, name, _ABSENT))
                continue
            value = space[name]
            if place not in looked:
                looked[place] = (reader, name, _found_as(value, module, name))
            label = f"{key_named(module)}:{name}".encode()
            if isinstance(value, FunctionType):
                if value.__module__ != module:
                    if not _as_imported(value, module, name):  # set there by hand (a fake)
                        out[place] = (b"other " + label, _elsewhere_bytes(value))
                        continue
                    if not _of_the_code(value.__module__, module):
                        continue  # an installed package's: its upgrade drifts nothing
                if id(value) in seen:
                    continue
                seen.add(id(value))
                unwrapped = _functions_in(value) if "__wrapped__" in vars(value) else []
                if not unwrapped:
                    out[place] = (b"uses " + label, _helper_function_bytes(name, value))
                    queue.append(value)
                    continue
                # a wrapper (`functools.wraps`): by what it wraps and the wrappers of the
                # user's code, not torch's nor an installed package's, whose upgrade would
                # drift every answer
                out[place] = (
                    b"uses " + label,
                    _joined(b"wrapped", _helper_bytes(value, unwrapped[0])),
                )
                for function in unwrapped:  # the wrapper itself, where it is the code's
                    if function is value or id(function) not in seen:
                        seen.add(id(function))
                        queue.append(function)
            elif (wrapped := _helper_in(value, module)) is not None:
                # a helper wrapped where it is defined: by the function and what is bound
                out[place] = (b"uses " + label, _joined(b"wrapped", _helper_bytes(value, wrapped)))
                for function in _functions_in(value):
                    if id(function) not in seen:
                        seen.add(id(function))
                        queue.append(function)
            elif _plain(value):
                text, as_named = _written_at(module, name, value)
                # where no text assigns it (imported from another package, patched over
                # by a test, or no text is known: `python -c`): by what it holds — not one
                # the interpreter sets (`__file__`, where the checkout is, is no code)
                assigned = _assigned_now(_module_named(module, space), text, as_named, value)
                if assigned is None and not _dunder(name):
                    assigned = _constant_bytes(value)
                if assigned is not None:
                    out[place] = (b"reads " + label, assigned)
            elif type(value) in _CONTAINERS:  # a table: as the module's text writes it
                tables[place] = value
            elif isinstance(value, type) and _helper_class(value, module, name):
                out[place] = (b"class " + label, _helper_class_bytes(value))
                # what its methods name in their module is followed as the code's own is
                for method in _class_functions(value):
                    if id(method) not in seen:
                        seen.add(id(method))
                        queue.append(method)
            elif _helper_object(value, module) or type(value) in _HOLDERS:
                # an object of a helper class (`SCALER = Scaler(2)`): by its class's code and
                # what it holds where that is named so, else by its mark, as one a class holds;
                # one of somatize's own (a codec) by its class's code, the same in every
                # process: a mark would have each worker take the library for other code
                kind = type(value)
                said = _held_bytes(value)
                if said is None:
                    said = _class_code(kind) if _somatize_own(kind) else _token_of(value)
                out[place] = (b"object " + label, said)
                # watched, as a table it only reads is: one changed in place is seen
                seen_as = _HeldSeen(value, _version_of(value), f"{key_named(module)}:{name}")
                looked[place] = (looked[place][0], name, seen_as)
                for method in _class_functions(kind):
                    if id(method) not in seen:
                        seen.add(id(method))
                        queue.append(method)
            elif (runs := _helper_method(value, module)) is not None:
                # a method of the code's bound to an object (`SCALE = SCALER.scale`): by its
                # function and the object, as a class holding it names it (else by its mark,
                # as an object of a helper class is), and watched
                out[place] = (b"object " + label, _held_bytes(value) or _token_of(value))
                seen_as = _HeldSeen(value, _version_of(value), f"{key_named(module)}:{name}")
                looked[place] = (looked[place][0], name, seen_as)
                if id(runs) not in seen:
                    seen.add(id(runs))
                    queue.append(runs)
            elif (said := _elsewhere_object_bytes(value, module, space, name)) is not None:
                # an object of the library's or of another package (`DTYPE = torch.float32`,
                # `PATTERN = re.compile("a")`): by what says it, else as the text writes it
                out[place] = (b"object " + label, said)
                noted = _held_weakly(value)
                if _array(value):  # by its values too: one written in place since is another
                    noted = _ArraySeen(noted, said)
                looked[place] = (looked[place][0], name, noted)
            elif isinstance(value, ModuleType) and _of_the_code(value.__name__, module):
                # a module of the user's code whose names the code reads (`tools.double(x)`),
                # of its package or of one not installed (`import shared.feats as feats`)
                there = vars(value)
                within = _reader_in(value)
                if within is not None and id(there) not in modules:
                    modules.add(id(there))
                    read = _attributes_read(code) & there.keys()  # `tools.double`
                    reads += ((value.__name__, there, within, n) for n in sorted(read))
    for place, value in tables.items():
        module, name = place
        made = _assignment(*_written_at(module, name, value))
        where = f"{key_named(module)}:{name}"
        if place in filled or place in stored or not _read_table(value):
            # filled as it runs (a log, a cache), holding objects, or more than a watch
            # reads: as written
            written = None if made is None else b"written " + _as_parsed(made).encode()
            values = None if place in filled or place in stored else _arrays_bytes(value)
            if values is not None:  # `TABLE = {"m": np.array(...)}`: its arrays by their values
                out[place] = (
                    b"reads " + where.encode(),
                    _joined(b"arrays", [written or b"", values]),
                )
                first, _, _ = looked[place]
                looked[place] = (first, name, _ArraySeen(_held_weakly(value), values))
            elif written is not None:
                out[place] = (b"reads " + where.encode(), written)
            continue
        # only read: as first seen, and watched (:func:`watch_code`)
        out[place] = (b"reads " + where.encode(), _sighted(value, made, where))
        first, _, _ = looked[place]
        looked[place] = (first, name, _HeldSeen(value, _version_of(value), where))
    named = [piece for place, piece in out.items() if place not in stored]
    for module, name in stored & looked.keys():
        made = _assignment(_module_body(module), name)
        if made is not None:
            named.append((f"state {key_named(module)}:{name}".encode(), _as_parsed(made).encode()))
    return sorted(named), tuple(entry for place, entry in looked.items() if place not in stored)


def _elsewhere_object_bytes(
    value: Any, module: str, space: dict[str, Any], name: str
) -> bytes | None:
    """An object of the standard library's, torch's or another package's that ``module``
    holds as ``name`` and a node's code reads, no class, module nor builtin: by its class's
    name and how the module's text makes it (``SCALER = Lib(2)``, with the values of the
    module it reads there), as a plain value computed as the module loads is — the same
    wherever the code is, whatever it makes there (``DEVICE = torch.device(...)``, a folder
    of the checkout) —, else (no text known) by what says it whole (:func:`_library_bytes`:
    a pattern by its text, a dtype by its name); None where neither does (it is not
    seen). An array or a tensor (:func:`_array`) by its values, whatever made them (a
    file the text loads). One set in place of what the text made (``mod.DTYPE =
    torch.float64``, a test's monkeypatch, ``CFG = Namespace(k=k)`` in the module's
    ``init(k)`` run as a script starts) by what says it, else by what it holds
    (:func:`_held_bytes`: alike in every process that sets it alike), else by a mark of
    that very object."""
    if _dunder(name) or isinstance(value, (type, ModuleType, BuiltinFunctionType)):
        return None
    if _array(value) and (values := _array_bytes(value)) is not None:
        return values  # `MEANS = np.load(path)`: by its values, as a class's, whatever made them
    text, as_named = _written_at(module, name, value)
    made = _assignment(text, as_named)
    owner = _module_named(module, space)
    set_since = made is not None and _set_since(
        owner, name, value, text if as_named == name else None
    )
    if made is None or set_since:
        library = _library_bytes(value)
        if library is None:
            return (_held_bytes(value) or _token_of(value)) if set_since else None
        return b"library " + library
    kind = type(value)
    written = b"made by " + _made_by(text, made, {as_named})
    return _joined(b"written", [qualified(kind).encode(), written])


def _held_weakly(value: Any) -> Any:
    """What :data:`Looked` notes of an object named by what says it or by the text that
    makes it (:func:`_elsewhere_object_bytes`), to tell it rebound: a weak reference to it,
    so that the fingerprint does not keep it alive (a model the module loaded, deleted
    since), else (one that cannot be referenced weakly) the object itself."""
    try:
        return weakref.ref(value)
    except TypeError:
        return _Same(value)


def _read_table(value: Any) -> bool:
    """Whether ``value``, a table of a module a node's code only reads, is named as first
    seen (:func:`_sighted`) and watched: one holding only plain values (:func:`_plain_table`)
    or plain functions besides (a dispatch table, ``OPS = {"double": double}``: named by how
    they are written), of fewer than a watch reads."""
    return _plain_table(value, leaf=_plain_or_function)


def _plain_or_function(value: Any) -> bool:
    """Whether ``value`` may stand in a table a node's code only reads (:func:`_read_table`):
    a plain value, or a plain function."""
    return _exactly_plain(value) or isinstance(value, FunctionType)


def _found_as(value: Any, module: str, name: str) -> Any:
    """What :data:`Looked` notes of ``value``, found under ``name`` of ``module``: where a
    fingerprint depends on it, the value itself (a plain value), a plain function, defined
    there or elsewhere — one set in place of what the module imported, :func:`_as_imported`
    — with what it is made of (:class:`_FunctionSeen`), one wrapped there
    (:func:`_helper_in`) with what it binds (:class:`_HelperSeen`), a helper
    class with how it is written (:class:`_ClassSeen`); else :data:`_OTHER` (a module,
    another class)."""
    if isinstance(value, FunctionType):
        return _FunctionSeen(weakref.ref(value), _made_of(value))
    if isinstance(value, type) and _helper_class(value, module, name):
        return _ClassSeen(weakref.ref(value), _helper_class_bytes(value))
    if _plain(value):
        return value
    if _helper_in(value, module) is not None:
        with contextlib.suppress(TypeError):
            made = tuple(map(_made_of, _functions_in(value)))
            return _HelperSeen(weakref.ref(value), tuple(_bound_in(value)), made)
    return _OTHER


def _helper_class(kind: type, module: str, name: str) -> bool:
    """Whether ``kind``, a class module ``module`` holds as ``name`` that a node's code
    names, is a helper of that code (``Helper().run(x)``): defined there, or in another
    module of the user's code it imports it from (:func:`_of_the_code`: of its package, or
    of a package not installed) — no node (one that reads another is keyed with it), nor
    the library's, nor an installed package's."""
    from somatize.node import Node

    if _left_out(kind) or issubclass(kind, Node):
        return False
    if kind.__module__ == module:
        return True
    return _of_the_code(kind.__module__, module) and _as_imported(kind, module, name)


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
    """Each function a helper class (:func:`_helper_class`), the classes it inherits from
    and its metaclass, short of the library's, hold (:func:`_read_through`) — not those
    made for it from a text of its own (a dataclass's methods) —, then each function a
    dataclass makes a field's default with (:func:`_factories`)."""
    return [
        function
        for above in _read_through(kind)
        for name, member in list(vars(above).items())
        for function in _functions_in(member)
        if not (_dunder(name) and function.__code__.co_filename == "<string>")
    ] + [factory for _, factory in _factories(kind) if isinstance(factory, FunctionType)]


def _factories(kind: type) -> list[tuple[str, Any]]:
    """Each field of ``kind``, a dataclass, that makes its default by calling a function or
    a class (``field(default_factory=...)``), with that; none for any other class."""
    fields = vars(kind).get("__dataclass_fields__")
    if type(fields) is not dict:
        return []
    found = []
    for name, field in list(fields.items()):
        factory = getattr(field, "default_factory", dataclasses.MISSING)
        if factory is not dataclasses.MISSING:
            found.append((name, factory))
    return found


def _class_code(kind: type) -> bytes:
    """A helper class (:func:`_helper_class`) by its name and how it is written: each
    function its classes and its metaclass's, short of the library's, hold
    (:func:`_function_bytes`; one made for them from a text of its own by its defaults,
    :func:`_made_function_bytes`), each plain value, and each dict, list or set of plain
    values as the class's text writes it — not what these name in turn."""
    pieces = [qualified(kind).encode()]
    for above in _read_through(kind):  # `Helper.by` finds a value on its metaclass too
        for name, member in sorted(vars(above).items(), key=lambda item: item[0]):
            for function in _functions_in(member):
                if _dunder(name) and function.__code__.co_filename == "<string>":
                    said = _made_function_bytes(function)  # made for it (a dataclass's methods)
                else:
                    said = _function_bytes(function)
                pieces.append(f"{above.__qualname__}.{name}".encode() + said)
            if _enum_own(above, name):
                continue
            if not _dunder(name) and _plain(member):
                pieces.append(f"{above.__qualname__}.{name}=".encode() + _constant_bytes(member))
            elif not _dunder(name) and _value_base(type(member)) and type(member) is not above:
                # `mode = Mode("a")`: by its class's code and what it is
                said = _held_bytes(member) or _token_of(member)
                pieces.append(f"{above.__qualname__}.{name}=".encode() + said)
            elif isinstance(member, enum.Enum) and type(member) is above:  # a member's value
                value = _member_value(above, name, member)
                pieces.append(f"{above.__qualname__}.{name}=".encode() + value)
            elif _table(name, member):  # as the class's text writes it: what fills it is state
                made = _assignment(_class_body(above), name)
                if made is not None:
                    written = b"written " + _as_parsed(made).encode()
                    pieces.append(f"{above.__qualname__}.{name}=".encode() + written)
    for name, factory in _factories(kind):  # `field(default_factory=...)`: how it is made
        if isinstance(factory, FunctionType):
            maker = _function_bytes(factory)
        elif isinstance(factory, type):
            maker = f"class {qualified(factory)}".encode()
        else:
            maker = _opaque_bytes(factory) or _token_of(factory)
        pieces.append(f"{kind.__qualname__}.{name}()=".encode() + maker)
    return _joined(b"class", pieces)


def _enum_own(kind: type, name: str) -> bool:
    """Whether ``name`` is one `enum` keeps on the enum ``kind`` as it makes it: a plain
    ``_sunder_`` value each Python version sets otherwise (`_use_args_` from 3.11 on)."""
    sunder = name.startswith("_") and name.endswith("_") and not _dunder(name)
    return sunder and issubclass(kind, enum.Enum) and _plain(vars(kind)[name])


def _helper_class_bytes(kind: type) -> bytes:
    """A helper class a node's code names (:func:`_helper_class`), or a class a node's class
    holds (``make = Double``), by how it is written (:func:`_class_code`) and each table and
    object its classes hold that its code reads (:func:`_class_objects`): a table as first
    seen (:func:`_sighted`), an object as a node's class names it (:func:`_opaque_bytes`) —
    so that another set in its place, or one changed in place between forwards
    (``Helper.table["k"] = 3``), is other code."""
    with _one_reading():  # a class its methods close over, read once for all of them
        code = _class_code(kind)
    held = []
    for above, name, member in _class_objects(kind):
        where = f"{above.__qualname__}.{name}"
        if _fillable(name, member):  # as first seen: what a node's forward adds is state
            said = _sighted(member, _assignment(_class_body(above), name), where)
        else:
            said = _opaque_bytes(member) or _token_of(member)
        held.append(where.encode() + b"=" + said)
    return _joined(b"helper", [code, *held]) if held else code


def _class_objects(kind: type) -> list[tuple[type, str, Any]]:
    """Each table (a dict, list or set; a ``deque`` too) and each object its code may read
    (:func:`_opaque_bytes`: ``cfg = Config(2)``) that ``kind``, the classes it inherits
    from and its metaclass, short of the library's, hold, with the class holding it and its
    name there — not a table their own code fills (a cache: their state, as the class's
    text writes it), nor a function, a class or a plain value, which :func:`_class_code`
    names, nor what is held under a name of Python's or the library's (``__dict__``, an
    enum's ``_member_map_``)."""
    kinds = _read_through(kind)
    filled = frozenset().union(*_fillers(kinds))
    found = []
    for above in kinds:
        for name, member in sorted(vars(above).items(), key=lambda item: item[0]):
            if (name.startswith("_") and name.endswith("_")) or name in filled:
                continue
            if _plain(member) or _functions_in(member) or isinstance(member, (type, enum.Enum)):
                continue
            if _fillable(name, member) or _opaque_bytes(member) is not None:
                found.append((above, name, member))
    return found


def _member_value(kind: type, name: str, member: enum.Enum) -> bytes:
    """The value of ``member``, ``name`` of the enum ``kind``: a plain one by what it is, any
    other as the enum's text writes it, else by a mark of that very member."""
    value = member._value_
    if _exactly_plain(value):
        return _constant_bytes(value)
    made = _assignment(_class_body(kind), name)
    return b"written " + _as_parsed(made).encode() if made is not None else _token_of(member)


class _ArraySeen(NamedTuple):
    """What :data:`Looked` notes of an array or a tensor a node's module holds
    (:func:`_array`), or of a dict, list or tuple holding some (:func:`_arrays_bytes`),
    named by their values."""

    held: Any
    """A weak reference to it, else (one that cannot be referenced weakly) it, held
    (:func:`_held_weakly`)."""
    values: bytes
    """What named it (:func:`_arrays_bytes`): written in place since, it is not it."""


class _FunctionSeen(NamedTuple):
    """What :data:`Looked` notes of a plain function."""

    held: weakref.ref[FunctionType]
    """A weak reference to it."""
    made: tuple[Any, ...]
    """What it was made of (:func:`_made_of`): one whose cell was set since (``nonlocal by;
    by = 3`` in a function sharing it), or given other code or defaults, is not it."""


class _HelperSeen(NamedTuple):
    """What :data:`Looked` notes of a helper wrapped where it is defined (:func:`_helper_in`)."""

    held: weakref.ref[Any]
    """A weak reference to it."""
    bound: tuple[bytes, ...]
    """What it binds (:func:`_bound_in`): a partial given other keywords in place since
    (``helper.keywords["by"] = 4``) is not it."""
    made: tuple[tuple[Any, ...], ...]
    """What each function it runs was made of (:func:`_made_of`): the one it wraps given
    other code in place since (as a reloader does) is not it."""


class _ClassSeen(NamedTuple):
    """What :data:`Looked` notes of a helper class (:func:`_helper_class`)."""

    held: weakref.ref[type]
    """A weak reference to it."""
    code: bytes
    """How it was written (:func:`_class_code`): one given another method since is not it."""


def _imported_as_it_runs(function: FunctionType) -> list[ModuleType]:
    """The modules of the user's code (:func:`_of_the_code`) that ``function`` imports as it
    runs: each module an import inside it names, each it takes from a package
    (``from . import config``), and each package above them (``import proj.config`` binds
    ``proj``)."""
    module = function.__module__
    named, taken = imports_in(function.__code__)
    if not named or not isinstance(module, str):  # none, or made with no module (`exec`)
        return []
    package = function.__globals__.get("__package__") or module.rpartition(".")[0]
    wholes = set()
    for name, level in named:
        try:
            whole = importlib.util.resolve_name("." * level + name, package) if level else name
        except (ImportError, ValueError):
            continue
        wholes.add(whole)
        wholes.update(f"{whole}.{name}" for name in taken)
    found = []
    for whole in sorted(wholes):
        parts = whole.split(".")
        for upto in range(1, len(parts) + 1):
            there = _loaded(".".join(parts[:upto]), module)
            if there is not None and there not in found:
                found.append(there)
    return found


def _loaded(name: str, module: str) -> ModuleType | None:
    """Module ``name`` where it is the user's code that ``module`` reads, loaded: one of
    the same package not yet imported is imported now, as the code would at its first run,
    so the first forward of a new process names what it reads as every later one does."""
    there = sys.modules.get(name)
    if there is None and _same_package(name, module):
        try:
            if importlib.util.find_spec(name) is not None:
                there = importlib.import_module(name)
        except Exception:  # one that cannot load now loads at no run either
            return None
    if isinstance(there, ModuleType) and _of_the_code(there.__name__, module):
        return there
    return None


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


def _elsewhere_bytes(function: FunctionType) -> bytes:
    """A function of another module that is not what that module holds under its name
    (:func:`_as_imported`), by that name and its code (:func:`_code_bytes`), the same in
    every process running the same code."""
    name = qualified(function).encode()
    return _joined(b"elsewhere", [name, _code_bytes(function.__code__)])


def _helper_in(value: Any, module: str) -> FunctionType | None:
    """The plain function of ``module`` that ``value``, a name of that module, runs where it
    is no plain function but wraps one — a decorator that says what it wraps
    (``functools.lru_cache``, ``functools.wraps``), a ``functools.partial`` — else None."""
    if isinstance(value, (FunctionType, type, ModuleType)) or _plain(value):
        return None
    if not isinstance(value, _PARTIALS) and not callable(value):
        return None
    functions = _functions_in(value)  # what it wraps first, then the code's wrappers of it
    if not functions or functions[0].__module__ != module:
        return None
    return functions[0]


def _helper_method(value: Any, module: str) -> FunctionType | None:
    """The plain function of ``module``, or of another module of its package, that
    ``value``, a name of that module, runs where it is a method bound to an object
    (``SCALE = SCALER.scale``), else None."""
    if not isinstance(value, MethodType) or not isinstance(value.__func__, FunctionType):
        return None
    function = value.__func__
    if function.__module__ != module and not _same_package(function.__module__, module):
        return None
    return function


def _helper_bytes(value: Any, wrapped: FunctionType) -> list[bytes]:
    """A helper ``value`` that wraps ``wrapped`` (:func:`_helper_in`), by how that function
    is written, what a partial binds (:func:`_bound_in`), and the wrapper's class."""
    kind = type(value)
    made = qualified(kind).encode()
    wrappers = _functions_in(value)[1:]  # a decorator of the code's, under `lru_cache`
    return [made, _function_bytes(wrapped), *map(_function_bytes, wrappers), *_bound_in(value)]


_Replaced = tuple[tuple[str, str], bytes, bytes, "weakref.ref[Any] | None", Any]
"""What :func:`_torch_replaced` finds of one function set in place of torch's own."""


def _torch_replaced(function: FunctionType) -> list[_Replaced]:
    """Each function (or class) of torch's that ``function`` names — as an attribute of a
    module of torch's it reads (``F.relu``, ``torch.nn.functional.gelu``), or imported from
    one (``from torch.nn.functional import relu``) — that is not what torch defines there
    (:func:`_torch_own`: a function set in its place, ``F.relu = lambda x: ...``): its place
    (the module and the name), a label, how it is written (:func:`_replaced_bytes`), a weak
    reference to a reader of that place (:func:`_reader_in`) and it. Torch's own functions
    are not in a fingerprint (a torch upgrade drifts nothing); one put in their place is the
    user's code. Looks at each name by identity and two attributes: about a microsecond a
    function named, its steps laid out only where one of its names is not torch's own."""
    code = function.__code__
    named = _NAMES_IN.get(code)
    if named is None:
        named = _NAMES_IN[code] = frozenset(_names_in(code))
    # each name the code has, global or attribute, first: no step of torch's own functions
    # laid out (a millisecond each) where none of them is another's
    if not _replaced_among(function, named, named):
        return []
    attributes = _ATTRIBUTES_READ.get(code)
    if attributes is None:
        attributes = _ATTRIBUTES_READ[code] = frozenset(_attributes_read(code))
    return _replaced_among(function, globals_read(code), attributes)


def _replaced_among(
    function: FunctionType, read: frozenset[str], attributes: frozenset[str]
) -> list[_Replaced]:
    """:func:`_torch_replaced`, of the globals ``read`` and the attributes ``attributes``
    ``function`` reads."""
    space = function.__globals__
    found: list[_Replaced] = []
    modules: list[ModuleType] = []
    for name in sorted(read):
        value = space.get(name, _ABSENT)
        if isinstance(value, ModuleType):
            if _torch_name(value.__name__):
                modules.append(value)
            continue
        if value is _ABSENT or not callable(value) or _torch_own(name, value):
            continue
        if isinstance(
            value, (type, FunctionType, BuiltinFunctionType)
        ) and _of_the_standard_library(value):
            continue  # `OrderedDict`, `chain`: set in no place of torch's, its text not read
        source = _imports_of(function.__module__).get(name)  # parsed once per module
        if source is not None and _torch_name(source[0]) and not _torch_own(source[1], value):
            label = f"other {key_named(function.__module__)}:{name}".encode()
            found.append(((function.__module__, name), label, _replaced_bytes(value), None, value))
    seen: set[int] = set()
    while modules:
        module = modules.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        there = vars(module)
        for name in sorted(attributes & there.keys()):
            value = there[name]
            if isinstance(value, ModuleType):
                if _torch_name(value.__name__):  # `torch.nn.functional.relu`
                    modules.append(value)
            elif callable(value) and not _torch_own(name, value):
                place = (module.__name__, name)
                label = f"other {module.__name__}:{name}".encode()
                found.append((place, label, _replaced_bytes(value), _reader_in(module), value))
    return found


_NAMES_IN: weakref.WeakKeyDictionary[CodeType, frozenset[str]] = weakref.WeakKeyDictionary()
"""A function's code → each name it has, global or attribute (:func:`_names_in`)."""

_ATTRIBUTES_READ: weakref.WeakKeyDictionary[CodeType, frozenset[str]] = weakref.WeakKeyDictionary()
"""A function's code → the names it reads as attributes (:func:`_attributes_read`), worked
out once: torch's own classes are looked through at each fingerprint worked out."""


def _torch_name(module: str) -> bool:
    """Whether ``module`` names torch or one of its modules."""
    return module.partition(".")[0] == "torch"


def _torch_own(name: str, value: Any) -> bool:
    """Whether ``value``, held under ``name`` by a module of torch's (or imported from one
    under that name), is torch's own: defined in torch (its ``__module__``), under that name
    or found again where its ``__module__`` and ``__qualname__`` say — not a function of
    the user's set in its place (``F.gelu = my_gelu``, a lambda), nor another of torch's
    (``F.relu = torch.sigmoid``)."""
    module = getattr(value, "__module__", None)
    if not isinstance(module, str) or not _torch_name(module):
        return False
    if getattr(value, "__name__", None) == name:
        return True
    qualname = getattr(value, "__qualname__", None)
    if isinstance(qualname, str) and "<" in qualname:
        return True  # a lambda or a function torch makes in one (`torch.cuda._is_in_bad_fork`)
    at: Any = sys.modules.get(module)
    for part in qualname.split(".") if isinstance(qualname, str) else ["<none>"]:
        at = getattr(at, part, None)
    if at is value:
        return True
    # an object of torch's class torch makes as it loads (`torch.distributions.transform_to`,
    # a registry), which no name finds again — never a layer of torch's set in a function's
    # place (`F.relu = nn.Sigmoid()`), which torch makes none of as it loads
    layer = getattr(getattr(sys.modules.get("torch"), "nn", None), "Module", ())
    return not isinstance(value, (FunctionType, BuiltinFunctionType, type, layer)) and module == (
        type(value).__module__
    )


def _replaced_bytes(value: Any) -> bytes:
    """What is set in place of torch's own function (:func:`_torch_replaced`): a plain
    function by its name and how it is written (:func:`_function_bytes`), another of torch's
    or a builtin by its name, a class by its name, anything else by what it holds where
    that is named (:func:`_opaque_bytes`), else by a mark of that very object — the same in
    every process setting the same, never torch's own."""
    module = getattr(value, "__module__", None)
    if isinstance(module, str):  # a script's as `__main__` where spawned too
        module = key_named(module)
    qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    name = f"{module}:{qualname}".encode()
    if isinstance(value, FunctionType):
        return _joined(b"replaced", [name, _function_bytes(value)])
    if isinstance(value, (type, BuiltinFunctionType)):
        return _joined(b"replaced", [name])
    return _joined(b"replaced", [name, _opaque_bytes(value) or _token_of(value)])
