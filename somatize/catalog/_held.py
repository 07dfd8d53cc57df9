"""An object named by what it holds: its class's name and fingerprint and its attributes,
each named in turn (:func:`_held_bytes`), the same in every process that makes it alike.

The standard library's objects that say nothing of what code computes with them are named
by their type, or by what says that in full (:func:`_library_bytes`: a lock is a lock, a
logger its name). What cannot be named so — another class written in C, one that moves
itself as it runs, one reached deeper or larger than a bound — is marked by which object
it is instead (:mod:`~somatize.catalog._marks`). A dict, list, tuple or set holding objects
is named by what it holds (:func:`_contained_bytes`).
"""

from __future__ import annotations

import abc
import argparse
import array
import collections
import ctypes
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import io
import logging
import operator
import os
import pathlib
import re
import sys
import threading
import types
import typing
import uuid
import weakref
from types import (
    BuiltinFunctionType,
    ClassMethodDescriptorType,
    FunctionType,
    GetSetDescriptorType,
    MemberDescriptorType,
    MethodDescriptorType,
    MethodType,
    ModuleType,
    WrapperDescriptorType,
)
from typing import Any

from somatize._arrays import Written
from somatize.catalog._bytecode import _stores_by
from somatize.catalog._code import _constant_bytes
from somatize.catalog._marks import _HELD, _forget_held, _reference, _token_of
from somatize.catalog._members import (
    _CONTAINERS,
    _EMPTY,
    _dunder,
    _exactly_plain,
    _functions_in,
    _joined,
    _left_out,
    _not_library,
    _plain,
    _Same,
    _Slots,
    _slots_of,
    _somatize_own,
    _unwritten_lineage,
    _value_base,
)
from somatize.catalog._project import qualified
from somatize.catalog._rebuild import identity_of

_NO_SELF = (ModuleType, type(None))
"""What a builtin function named by its name alone is bound to: a module, or nothing — not
an object whose state it computes with (``re.compile("a").search``)."""


def _builtin_bytes(function: BuiltinFunctionType) -> bytes | None:
    """A builtin function by its name, the same in every process, where it is one of a
    module (``math.sqrt``) or of a class its name leads back to (``tuple.__new__``, which
    ``namedtuple``'s methods close over); None for one bound to an object whose state it
    computes with (``re.compile("a").search``)."""
    bound = function.__self__
    if isinstance(bound, _NO_SELF):
        return f"builtin {qualified(function)}".encode()
    if isinstance(bound, type) and identity_of(bound) is not None:
        return f"builtin {identity_of(bound)}.{function.__name__}".encode()
    return None


def _opaque_bytes(member: Any) -> bytes | None:
    """How a class attribute that runs code but is no plain function (a callable object,
    a mock, a ``singledispatchmethod``), or an object its code reads (:func:`_runner`:
    ``setting = Setting(2)``), is fingerprinted: a builtin function of a module by
    its name, an object whose state is all named by what it is by that
    (:func:`_held_bytes`: the same in every process), one of somatize's own classes (a
    codec) by its class's code, any other (a builtin method of an
    object, ``re.compile("a").search``) by a mark of that very object (:func:`_token_of`),
    never another's — so one replaced by another is never taken for the old code. None
    for what runs no code of the class's (a class, a slot, a plain value)."""
    member = _runner(member)
    if member is None:
        return None
    if isinstance(member, BuiltinFunctionType) and (named := _builtin_bytes(member)):
        return named
    library = _library_bytes(member)  # a named tuple's field, `operator.itemgetter(0)`
    if library is not None:
        return library
    values = _array_bytes(member)  # a table of means: by its dtype, shape and values
    if values is not None:
        return values
    named = _held_bytes(member)
    if named is None and _somatize_own(type(member)):  # a codec: by its class's code
        # imported here: a class's code names what its functions name, by this module
        from somatize.catalog._names import _class_code

        return _class_code(type(member))
    return named or _token_of(member)


def _runner(member: Any) -> Any:
    """What of a class attribute :func:`_opaque_bytes` names: what a static or class method
    holds, else itself — one that runs code, or an object the code reads
    (:func:`_read_object`: ``setting = Setting(2)``); None for a class, a slot, a plain
    value, a table (named as such) and an object of the library's that says nothing of
    what the code computes (``_abc_impl``)."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, (type, MemberDescriptorType, GetSetDescriptorType, ModuleType)):
        return None
    if callable(member) or hasattr(type(member), "__get__"):
        return member
    return member if _read_object(member) else None


def _read_object(member: Any) -> bool:
    """Whether ``member``, a class attribute that runs no code, is an object the class's code
    may read (``setting = Setting(2)``, ``pattern = re.compile("a")``), which its
    fingerprint names (:func:`_opaque_bytes`): no plain value nor table, and no object of
    the library's (:func:`_left_out`: the standard library's, torch's) but one named by
    what the code computes with it depends on (:func:`_library_bytes`) — what another such
    object holds is taken as the library's, as before."""
    if _plain(member) or type(member) in _CONTAINERS:
        return False
    if _array(member):  # an array, a tensor: by its values
        return True
    kind = type(member)
    if _value_base(kind):  # `class Mode(str)`: named, else marked, never left unseen
        return True
    if not _left_out(kind):  # one no name may say (of a class in C, with `__eq__`): not seen
        named = isinstance(member, enum.Enum) or _named_tuple(kind) or _somatize_own(kind)
        # not one whose code sets what it holds as it runs (`Scaler().fit(x)`): not seen
        return named or (_readable(kind) and not _moves_itself(kind))
    return _library_bytes(member) is not None or kind in _HOLDERS


def _array(value: Any) -> bool:
    """Whether ``value`` is one :func:`_array_bytes` names by its values, told by its type
    alone (its values are not read)."""
    kind = type(value)
    top = kind.__module__.partition(".")[0]
    if top == "numpy" and (numpy := sys.modules.get("numpy")) is not None:
        if isinstance(value, numpy.dtype):
            return True
        return isinstance(value, (numpy.ndarray, numpy.generic)) and not value.dtype.hasobject
    torch = sys.modules.get("torch")
    if top != "torch" or torch is None or not isinstance(value, torch.Tensor):
        return False
    return _values_here(value, torch)


def _values_here(tensor: Any, torch: Any) -> bool:
    """Whether ``tensor``'s values are here to read as one run of bytes: not a sparse, meta,
    quantized or nested tensor, nor a subclass that holds its values in tensors of its own
    (whose memory torch says is at 0)."""
    if tensor.layout is not torch.strided or tensor.is_meta or tensor.is_quantized:
        return False
    if tensor.is_nested:
        return False
    try:
        return bool(tensor.numel() == 0 or tensor.data_ptr() != 0)
    except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
        return False


def _array_bytes(value: Any) -> bytes | None:
    """A numpy array, scalar or dtype, or a dense torch tensor, a class holds (a table of
    means) by its type, dtype, shape and values — the same in every process that makes it
    alike, another for other values; None for any other object, or one whose values are
    objects (an array of ``dtype=object``) or not here to read (a sparse, meta or nested
    tensor: :func:`_values_here`)."""
    kind = type(value)
    top = kind.__module__.partition(".")[0]
    if top == "numpy" and (numpy := sys.modules.get("numpy")) is not None:
        if isinstance(value, numpy.dtype):
            return f"dtype {value.str} {value!r}".encode()
        if not isinstance(value, (numpy.ndarray, numpy.generic)) or value.dtype.hasobject:
            return None
        values = numpy.ascontiguousarray(value)
        said = f"array {kind.__qualname__} {value.dtype.str} {value.shape}".encode()
        return said + b" " + hashlib.sha256(values.view(numpy.uint8).data).digest()
    torch = sys.modules.get("torch")
    if top != "torch" or torch is None or not isinstance(value, torch.Tensor):
        return None
    if not _values_here(value, torch):
        return None
    # Its bytes read where they lie, by address: torch installed without numpy has no
    # `.numpy()` (`Numpy is not available`). A conjugate or negative view by its values.
    values = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
    size = values.numel() * values.element_size()
    memory = (ctypes.c_char * size).from_address(values.data_ptr()) if size else b""
    said = f"tensor {kind.__qualname__} {value.dtype} {tuple(value.shape)}".encode()
    return said + b" " + hashlib.sha256(memory).digest()


def _held_arrays(table: Any) -> tuple[list[Any], list[Any]]:
    """Each array or tensor named by its values (:func:`_array`) that ``table``, a dict,
    list, tuple or set, holds, however nested in such tables (``{"m": [np.array(...)]}``),
    in the order they are read, and each dict and list read to find them (one given
    another array in place, ``TABLE["m"] = ...``, is seen by a watch of it); none where it
    holds none; :class:`_Unnamed` raised where it is deeper or larger than
    :data:`_HELD_DEPTH` and :data:`_HELD_ITEMS` say."""
    arrays: list[Any] = []
    read: list[Any] = []
    placed: set[int] = set()
    queue = [(table, 0)]
    count = 0
    while queue:
        held, depth = queue.pop()
        if id(held) in placed:  # shared, or a cycle: read once
            continue
        placed.add(id(held))
        items = list(held.values()) if isinstance(held, dict) else list(held)
        count += len(items) + 1
        if depth > _HELD_DEPTH or count > _HELD_ITEMS:
            raise _Unnamed
        if type(held) is not tuple and type(held) is not frozenset:
            read.append(held)
        for item in reversed(items):  # read first to last
            if type(item) in _CONTAINERS:
                queue.append((item, depth + 1))
            elif _array(item):
                arrays.append(item)
    return arrays, read if arrays else []


def _arrays_bytes(value: Any) -> bytes | None:
    """An array or a tensor a node's code reads (:func:`_array`) by its values
    (:func:`_array_bytes`), or a dict, list, tuple or set by the values of each array and
    tensor it holds (:func:`_held_arrays`), in order: another once one is written in place
    (``TABLE["m"][0] = 5.0``), the same in every process that makes them alike. None for
    one holding none, one too deep or too large to read (named as its text writes it, as
    such a table of plain values is), and for any other value."""
    if _array(value):
        return _array_bytes(value)
    if type(value) not in _CONTAINERS:
        return None
    try:
        arrays, _ = _held_arrays(value)
    except _Unnamed:
        return None
    if not arrays:
        return None
    return _joined(b"arrays", [_array_bytes(array) or b"" for array in arrays])


_HELD_DEPTH = 8


_HELD_ITEMS = 4096
"""How deep, and over how many values, an object is read to be named by what it holds
(:func:`_held_bytes`); one deeper or larger is marked by which object it is."""


_HEAPTYPE = 1 << 9


_C_MEMBERS = (
    BuiltinFunctionType,
    MethodDescriptorType,
    WrapperDescriptorType,
    ClassMethodDescriptorType,
)


_WALKING = threading.local()
"""What is being named by what it holds in this thread (objects, by id, and classes being
fingerprinted for one), so that an object reached again through a function it holds, or
its class's own body, is marked rather than read without end."""


class _Unnamed(Exception):
    """An object whose state is not all named by what it is."""


def _held_bytes(value: Any, containers: list[Any] | None = None) -> bytes | None:
    """``value`` named by what it is, the same in every process that makes it alike, or
    None where it cannot be (then it is marked by which object it is, :func:`_token_of`).

    An object is named by its class's name and fingerprint (:func:`fingerprint_of`), what
    its classes hold that their fingerprints do not name (:func:`_unwritten`: a table, a
    class), and its attributes, each named in turn: a plain value by what it is, a function
    by how it is written (:func:`_function_bytes`) and what it names in its module
    (:func:`_named`: a helper, a constant, as for a class's own functions) and the objects
    it closes over, a class by its name (where that leads back to it), its fingerprint and
    what it keeps, as an object's class is, a module by its name, an object of the
    standard library's that says nothing more (:func:`_library_bytes`: a lock by its type,
    a logger by its name), a numpy array or scalar by its dtype, shape and values
    (:func:`_array_bytes`), a list, tuple, dict or set by its items, a
    ``SimpleNamespace`` or an ``argparse.Namespace`` by what it holds, a
    partial by its function and what it binds, a bound method by its
    function and its object, another object the same way. An object is not named so — the
    whole is marked — where any part holds what no name says: a class written in C (a
    tensor, a random generator) but a dict, list or set an object's class is made from (its
    items named as such a table's), one whose class says when it equals another
    (``__eq__``, but as a dataclass does: a graph's watch compares what it holds with
    ``==``), a torch module holding hooks; one reached deeper or larger than a bound; one
    that cannot be referenced weakly (a bare list or dict), but one with slots, kept alive
    to be named; or one whose class's own code sets its attributes as it runs (a count, a
    cache). What an object holds in slots is named by each slot's name.

    An object is read each time it is asked of, and keeps the name it was first given while
    it reads so: one changed in place since (``Kind.act.k = 3``, ``-0.0`` for ``0.0``, a
    helper its function names rebound) is marked by which object it is from then on, so its
    old name is never taken for what it computes now. Nothing read of it is kept from one
    time to the next (a cycle through it would keep it alive). ``containers`` is given each
    dict, list and set read of it (its attributes among them), the namespaces of its
    classes and each numpy array it holds, as a :class:`~somatize._arrays.Written` (``H.m[0]
    = 5.0``, which changes no container), for a graph's watch to see such a change at the
    next forward."""
    forget = functools.partial(_forget_named, id(value))
    kind = type(value)
    if kind in _CONTAINERS or kind in _HOLDERS or _slots_of(kind) or _value_base(kind):
        # a table, a namespace, an object with slots or made from a tuple or a number: kept
        # alive
        reference = _reference(value, forget)
    else:  # where it cannot be referenced weakly, to be named
        try:
            reference = weakref.ref(value, forget)
        except TypeError:
            return None
    walking = _walking()
    if id(value) in walking:  # reached again as it is read or looked at: marked for good
        _HELD[id(value)] = (reference, None)
        return None
    found = _HELD.get(id(value))
    if found is not None and found[0]() is not value:  # noted of another, gone since
        del _HELD[id(value)]
        found = None
    if found is not None and found[1] is None:
        return None
    if found is not None and found[1] is not None and _named_state(value) is not None:
        if containers is not None:  # what a walk reads of it: its attributes, then the
            # namespace of each class of its lineage (:meth:`_Walk.written`)
            kinds = _not_library(type(value))
            containers += [object.__getattribute__(value, "__dict__"), *map(vars, kinds)]
        return found[1]
    walk = _Walk(walking)
    try:
        said = walk.name(value, 0)
    except (_Unnamed, RecursionError):
        said = None
    finally:
        walking.difference_update(walk.placed)
    named = None if said is None else b"held " + hashlib.sha256(said).digest()
    if _HELD.get(id(value)) is not found or (found is not None and found[1] != named):
        # reached again as it was read, or changed in place since it was named: marked
        named = None
    entry = _HELD[id(value)] = (reference if found is None else found[0], named)
    state = None if named is None else _plain_state(value)
    if state is not None:
        _AGAIN[id(value)] = (entry, state)
    else:
        _AGAIN.pop(id(value), None)
    if named is not None and containers is not None:
        containers += walk.read
    return named


_AGAIN: dict[int, tuple[Any, tuple[Any, ...]]] = {}
"""An object named by what it holds, all of it plain values, by its address → its entry of
:data:`_HELD` as it was named and what :func:`_plain_state` read of it then: the same
entry and state now, it is named the same without being read again. Forgotten with its
entry (:func:`_forget_held`: the entry's weak reference is gone with the object)."""


def _named_state(value: Any) -> tuple[Any, ...] | None:
    """What says ``value`` is named as :func:`_held_bytes` last named it, read cheaply, where
    :data:`_AGAIN` notes it so: its entry of :data:`_HELD` (another once it is marked) and
    its plain state (:func:`_plain_state`), both as they were then; None where it is read
    again."""
    entry = _HELD.get(id(value))
    again = _AGAIN.get(id(value))
    if entry is None or again is None or again[0] is not entry or entry[0]() is not value:
        return None
    state = _plain_state(value)
    if state is None or again[1] != state:
        return None
    return (_Same(entry), state)


def _forget_named(at: int, reference: weakref.ref[Any], again: dict[int, Any] = _AGAIN) -> None:
    """Forgets what :data:`_HELD` and :data:`_AGAIN` say of an object gone (not of another
    made since at its address). Reads no global: it may be called as the process ends."""
    _forget_held(at, reference)
    found = again.get(at)
    if found is not None and found[0][0] is reference:
        del again[at]


_NAMED_OTHERWISE = (
    type,
    ModuleType,
    FunctionType,
    MethodType,
    enum.Enum,
    BuiltinFunctionType,
    staticmethod,
    classmethod,
    functools.partial,
)
"""What :meth:`_Walk.name` names otherwise than by its class and attributes."""


def _plain_state(value: Any) -> tuple[Any, ...] | None:
    """What an object's name (:func:`_held_bytes`) is worked out from, read cheaply, where
    that is its class and the classes it inherits from (by weak references), each told
    unchanged by a stamp of its body (:func:`~somatize.catalog._fingerprint._stamp_of`),
    their fingerprint, and its attributes, all plain values (held here and compared by
    identity, never another at the same address); None for any other object, read each
    time. The same state says the same name."""
    # imported here: a fingerprint names the objects its class holds, by this module
    from somatize.catalog._fingerprint import _FINGERPRINTS, _STAMPS, fingerprint_of

    kind = type(value)
    if (
        kind in _CONTAINERS
        or kind in _NAMESPACES
        or kind in _SEQUENCES
        or isinstance(value, _NAMED_OTHERWISE)
        or kind.__module__.partition(".")[0] == "numpy"
        or _named_tuple(kind)
        or _torch_module(kind)
        or _library_bytes(value) is not None
    ):
        return None
    if _slots_of(kind) or _items_base(kind) or _value_base(kind):  # more than its `__dict__`
        return None
    try:
        attributes = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return None
    if type(attributes) is not dict:
        return None
    items = tuple(attributes.items())
    if not all(type(name) is str and _exactly_plain(held) for name, held in items):
        return None
    if getattr(_WALKING, "kinds", None):  # a class is being fingerprinted around this
        return None
    written = fingerprint_of(kind)  # its lineage's stamps checked, or their bodies read
    for above in kind.__mro__:  # each told unchanged by its stamp: no table, no object
        if not _unwritten_lineage(above):
            stamped = _STAMPS.get(above)
            if stamped is None or stamped[0] is not _FINGERPRINTS.get(above):
                return None
    return (
        weakref.ref(kind),  # weakly: what is noted of an object never keeps its class alive
        tuple(map(weakref.ref, kind.__mro__)),
        written,
        tuple((name, _Same(held)) for name, held in items),
    )


_BY_TYPE = frozenset(
    {
        type(threading.Lock()),
        type(threading.RLock()),
        threading.Condition,
        threading.Event,
        threading.Semaphore,
        threading.BoundedSemaphore,
        threading.Barrier,
        type(os.environ),
        type(vars(abc.ABC)["_abc_impl"]),  # what `abc` keeps on each abstract class
    }
)
"""The standard library's objects that say nothing of what code computes with them, named
by their type alone (:func:`_library_bytes`): a lock is a lock."""


_LOGGERS = (logging.Logger, logging.RootLogger)


_SEQUENCES = frozenset({collections.Counter, collections.deque, collections.defaultdict})
"""The standard library's containers of values named by their items, as a list or a dict
is (:meth:`_Walk.name`), and watched as one is."""


_GETTERS = frozenset(
    {
        operator.itemgetter,
        operator.attrgetter,
        type(vars(collections.namedtuple("_Pair", "a"))["a"]),  # a named tuple's field
    }
)
"""The standard library's getters (``operator.itemgetter(0)``, a named tuple's field), named
by what they get (:func:`_library_bytes`)."""


def _type_alias(kind: type) -> bool:
    """Whether ``kind`` is the class of a type alias of the standard library's
    (``list[int]``, ``typing.Optional[int]``, ``int | None``), named by how it reads."""
    if kind is types.UnionType:
        return True
    return kind.__module__ in ("typing", "types") and kind.__qualname__.endswith("Alias")


def _named_tuple(kind: type) -> bool:
    """Whether ``kind`` is a named tuple's class (``collections.namedtuple``,
    ``typing.NamedTuple``): a tuple of fields, whose instances hold nothing else."""
    fields = getattr(kind, "_fields", None)
    return (
        isinstance(fields, tuple)
        and all(isinstance(field, str) for field in fields)
        and "__dict__" not in dir(kind)
        and kind.__mro__[1:] in ((tuple, object), (tuple, typing.Generic, object))
    )


_NAMESPACES = frozenset({types.SimpleNamespace, argparse.Namespace})
"""The standard library's namespaces of settings, named by what they hold
(:meth:`_Walk.name`), as an object of a class of the node's is."""


_HOLDERS = _NAMESPACES | _SEQUENCES | {types.MappingProxyType, array.array}
"""The standard library's objects that hold values a node's code reads and may be changed
in place, named by what they hold (:meth:`_Walk.name`) and seen by a watch — a class
holding one is named by it, not by the text that made it."""


_BY_REPR = frozenset(
    {
        decimal.Decimal,
        fractions.Fraction,
        datetime.date,
        datetime.datetime,
        datetime.time,
        datetime.timedelta,
        datetime.timezone,
        uuid.UUID,
    }
)
"""The standard library's values whose ``repr`` says them in full, named by it
(:func:`_library_bytes`)."""


_TORCH_BY_REPR = frozenset({"dtype", "layout", "memory_format"})
"""The classes of torch's values named by their ``repr`` (``torch.float32``) — not a device,
which says where the code runs (``cuda`` on a worker, ``cpu`` on the client), not what it
computes."""


def _library_bytes(value: Any) -> bytes | None:
    """An object of the standard library's that an object holds, named the same in every
    process by what the code computes with it depends on, where that is said in full: a
    lock, a condition, an event or a semaphore (:data:`_BY_TYPE`) by its type; a decimal,
    a fraction, a time, a UUID (:data:`_BY_REPR`), a torch dtype by its ``repr``,
    which says it in full (a type alias, ``list[int]``, too; a time's zone too, where it is
    no zone of a class of elsewhere, whose ``repr`` may say less); a logger by
    its name (where it logs to, and above which level, changes no answer); a compiled
    pattern by its pattern and flags; a path by its type and what it says; a file open only
    for writing (a log, ``sys.stderr``) by its type. None for any
    other (a file open for reading, whose answers depend on where it was read to, a random
    generator, a ``StringIO``): it is not named so, and what holds it is marked by which
    object it is (:func:`_token_of`). Of these classes themselves only, not of one made
    from them elsewhere, whose code may say otherwise."""
    kind = type(value)
    if kind in _BY_TYPE:
        return f"a {qualified(kind)}".encode()
    if (kind in _BY_REPR and _tz_said(value)) or (
        kind.__module__ == "torch" and kind.__qualname__ in _TORCH_BY_REPR
    ):
        return f"value {qualified(kind)} {value!r}".encode()
    if _type_alias(kind):  # `Out = dict[str, int]`, `typing.Optional[int]`: as it reads
        said = repr(value)
        if " at 0x" not in said:  # no object of its own that says no more than where it is
            return b"alias " + said.encode()
    if kind in _GETTERS:
        got = value.__reduce__()[1]
        if _exactly_plain(got):
            return f"getter {kind.__qualname__} ".encode() + _constant_bytes(got)
    if kind in _LOGGERS and isinstance(value.name, str):
        return b"logger " + value.name.encode()
    if kind is re.Pattern:
        return b"pattern " + _constant_bytes((value.pattern, value.flags))
    if isinstance(value, pathlib.PurePath) and _left_out(kind):
        return f"path {kind.__qualname__} ".encode() + _constant_bytes(str(value))
    if isinstance(value, io.IOBase) and _left_out(kind):
        return _sink_bytes(value)
    return None


def _tz_said(value: Any) -> bool:
    """Whether the zone of ``value``, a time (or any other value of :data:`_BY_REPR`), is
    said in full by its ``repr``: none, or a fixed offset of the standard library's."""
    zone = getattr(value, "tzinfo", None)
    return zone is None or type(zone) is datetime.timezone


def _member_bytes(member: enum.Enum, value: bytes) -> bytes:
    """A member of an enum by its enum's name and code (:func:`_class_code`: with the value
    of each of its members), its name and its value (``value``, named): the same in every
    process running the same code, another for another member or value."""
    # imported here: a class's code names what its functions name, by this module
    from somatize.catalog._names import _class_code

    name = str(member._name_).encode()
    return _joined(b"member", [_class_code(type(member)), name, value])


def _sink_bytes(file: io.IOBase) -> bytes | None:
    """A file of the standard library's open only for writing (a log, ``sys.stdout``) by its
    type: what is written there changes no answer, and its name, mode and encoding are the
    machine's (stdout is another file, of another encoding, on a worker); None for one that
    can be read (what it answers is where it was read to), or closed."""
    try:
        if file.closed or file.readable() or not file.writable():
            return None
    except Exception:  # a file that cannot say (detached, or gone)
        return None
    kind = type(file)
    return f"file {qualified(kind)}".encode()


def _walking() -> set[int]:
    """The objects being named by what they hold in this thread, by id (:data:`_WALKING`)."""
    walking: set[int] | None = getattr(_WALKING, "ids", None)
    if walking is None:
        walking = _WALKING.ids = set()
        _WALKING.kinds = set()
    return walking


def _contained_bytes(
    member: Any,
    read: list[Any] | None = None,
    marked: list[Any] | None = None,
    objects: list[Any] | None = None,
    keyed: frozenset[int] = frozenset(),
) -> bytes | None:
    """A dict, list, tuple or set a class holds that holds an object, nested or not
    (``acts = {"a": Scale(2)}``, ``layers = [Scale(2)]``), named by what it holds as
    :func:`_held_bytes` reads a container, each object in it (no container, no plain
    value) as one the class held itself: an array or a tensor by its dtype, shape and
    values (:func:`_array_bytes`: the same in every process, another once changed in
    place), any other by what it holds where it can be (:func:`_held_bytes`), else by a
    mark of that very object (:func:`_token_of`). None for
    any other member, for one holding only plain values (a table, a cache its code fills),
    and for one deeper or larger than the walk's bound. ``read`` is given each dict, list
    and set read of the objects in it named by what they hold, and each numpy array they
    hold (:class:`~somatize._arrays.Written`), ``marked`` each object in it marked by
    which object it is, and ``objects`` each object in it, for a graph's
    watch (which reads the container itself as it reads a marked object,
    :class:`_Marked`) — but an object of ``keyed``, by address (a module of a model, whose
    state the watch's taker keys itself): it is neither read nor marked nor given to
    ``objects``, only placed by its mark, as the watch compares it by which object it is."""
    if type(member) not in _CONTAINERS or _plain(member):
        return None
    found: dict[int, Any] = {}  # each object in it, by id
    seen: list[Any] = []
    marks: list[Any] = []

    def leaf(value: Any) -> bytes:
        if id(value) in keyed:
            found[id(value)] = value
            return _token_of(value)
        values = _array_bytes(value)
        if values is not None:  # an array, a tensor: by its values, as one held itself is
            found[id(value)] = value
            return values
        if id(value) not in found:
            found[id(value)] = value
            if isinstance(value, BuiltinFunctionType) and (builtin := _builtin_bytes(value)):
                return builtin
            named = _held_bytes(value, seen)
            if named is not None:
                return named
            marks.append(value)
        return _token_of(value)

    walking = _walking()
    walk = _Walk(walking, leaf)
    try:
        said = walk.name(member, 0)
    except (_Unnamed, RecursionError):
        return None
    finally:
        walking.difference_update(walk.placed)
    if not found:
        return None
    if read is not None:
        read += seen
    if marked is not None:
        marked += marks
    if objects is not None:
        objects += (value for at, value in found.items() if at not in keyed)
    return b"holds " + hashlib.sha256(said).digest()


class _Walk:
    """One reading of an object for :func:`_held_bytes`."""

    def __init__(self, walking: set[int], leaf: Any = None) -> None:
        self.walking = walking
        self.leaf = leaf  # names each object, no container, in place of reading it
        self.placed: dict[int, int] = {}  # an object read → its place in the reading
        self.held: list[Any] = []  # what was read, alive while ids name it
        # each dict, list, set and class namespace read, and each numpy array named by its
        # values (:class:`Written`)
        self.read: list[Any] = []
        self.count = 0

    def name(self, value: Any, depth: int) -> bytes:
        self.count += 1
        if depth > _HELD_DEPTH or self.count > _HELD_ITEMS:
            raise _Unnamed
        if _exactly_plain(value):
            return _constant_bytes(value)
        at = self.placed.get(id(value))
        if at is not None:  # read before here (shared, or a cycle): by its place
            return b"again %d" % at
        if id(value) in self.walking:  # being read around this reading
            raise _Unnamed
        if self.leaf is not None and type(value) not in _CONTAINERS:
            return bytes(self.leaf(value))
        if isinstance(value, FunctionType):  # with what it names in its module
            # imported here: naming a function names what it closes over, by this module
            from somatize.catalog._functions import _closed_objects, _function_bytes
            from somatize.catalog._names import _named

            named, _ = _named([value])
            pieces = [label + b"\0" + piece for label, piece in named]
            # what it closes over read here too, for a watch to see it changed in place
            pieces += (self.name(held, depth + 1) for held in _closed_objects(value))
            return _joined(b"function " + _function_bytes(value), pieces)
        if isinstance(value, type) and identity_of(value) is None:
            raise _Unnamed
        if isinstance(value, type) and not value.__flags__ & _HEAPTYPE:  # written in C
            return f"class {identity_of(value)}".encode()  # (`pyarrow.Table`): by its name
        if isinstance(value, ModuleType):
            return f"module {value.__name__}".encode()
        if isinstance(value, BuiltinFunctionType):
            builtin = _builtin_bytes(value)
            if builtin is None:  # a method of an object in C
                raise _Unnamed
            return builtin
        library = _library_bytes(value)
        if library is not None:
            return library
        if type(value).__module__.partition(".")[0] == "numpy":  # a fitted scaler's means
            values = _array_bytes(value)  # by dtype, shape and values (no tensor: a weight)
            if values is not None:
                if isinstance(value, sys.modules["numpy"].ndarray):  # `H.m[0] = 5.0` since
                    self.see(Written(value))
                return values
        if isinstance(value, enum.Enum):  # by its enum's code and its name
            self.see(object.__getattribute__(value, "__dict__"))  # `Mode.A._value_ = 3`
            return _member_bytes(value, self.name(value._value_, depth + 1))
        self.placed[id(value)] = len(self.placed)
        self.walking.add(id(value))
        self.held.append(value)
        kind = type(value)
        deeper = depth + 1
        if isinstance(value, type):
            said, *kept = self.written(value, deeper)
            return _joined(b"class " + said, kept)
        if kind in _CONTAINERS:
            items: list[bytes]
            if isinstance(value, dict):
                items = [self.name(k, deeper) + self.name(v, deeper) for k, v in value.items()]
            else:
                items = [self.name(item, deeper) for item in value]
            if isinstance(value, (set, frozenset)):
                items.sort()
            if kind is not tuple and kind is not frozenset:
                self.see(value)
            return _joined(f"{kind.__name__}".encode(), items)
        if isinstance(value, (staticmethod, classmethod)):
            return _joined(kind.__name__.encode(), [self.name(value.__func__, deeper)])
        if isinstance(value, MethodType):
            parts = [self.name(value.__func__, deeper), self.name(value.__self__, deeper)]
            return _joined(b"method", parts)
        if kind is functools.partial:
            self.see(value.keywords)
            parts = [self.name(value.func, deeper), self.name(value.args, deeper)]
            parts.append(self.name(value.keywords, deeper))
            parts.append(self.name(self.attributes(value), deeper))
            return _joined(b"partial", parts)
        if kind in _NAMESPACES:  # settings: by what they hold, as an object's attributes
            spaced = self.attributes(value)
            pairs = [a.encode() + b"\0" + self.name(spaced[a], deeper) for a in sorted(spaced)]
            return _joined(f"namespace {qualified(kind)}".encode(), pairs)
        if kind is types.MappingProxyType:  # a view of a dict: by its items, and seen
            self.see(value)
            items = [self.name(k, deeper) + self.name(v, deeper) for k, v in value.items()]
            return _joined(b"mappingproxy", items)
        if kind is array.array:  # by its values, and seen
            self.see(value)
            return b"array " + _constant_bytes((value.typecode, value.tobytes()))
        if kind in _SEQUENCES:  # a count or a queue of values: by its items, and seen
            self.see(value)
            items = (
                [self.name(k, deeper) + self.name(v, deeper) for k, v in value.items()]
                if isinstance(value, dict)
                else [self.name(item, deeper) for item in value]
            )
            if kind is collections.defaultdict:  # what it makes for a key it lacks
                items.append(self.name(value.default_factory, deeper))
            bound = getattr(value, "maxlen", None)
            return _joined(f"{kind.__qualname__} {bound}".encode(), items)
        if isinstance(value, tuple) and _named_tuple(kind):  # a config: its class and items
            said, *kept = self.written(kind, deeper)
            items = [self.name(item, deeper) for item in value]
            return _joined(b"tuple " + said, kept + items)
        if not _readable(kind):
            raise _Unnamed
        attributes = self.attributes(value)
        if _torch_module(kind):
            for own in _TORCH_OWN.intersection(attributes):  # seen changed, not named
                if type(attributes[own]) in _CONTAINERS:
                    self.see(attributes[own])
            attributes = _torch_named(attributes)
        if _moves_itself(kind):
            raise _Unnamed  # what it holds is its state as it runs, not what it is
        said, *kept = self.written(kind, deeper)
        pairs = [a.encode() + b"\0" + self.name(attributes[a], deeper) for a in sorted(attributes)]
        return _joined(b"object " + said, kept + pairs + self.held_in_place(value, deeper))

    def held_in_place(self, value: Any, depth: int) -> list[bytes]:
        """What ``value`` holds but in its ``__dict__`` (seen for a watch): what each of its
        slots holds, by the slot's name, then, an object of a subclass of a number, a string,
        bytes, a tuple or a frozenset, what it is as one (:data:`_AS_MADE`), or of a subclass
        of dict, list or set (:data:`_ITEMS_BASES`), its items as such a table's."""
        parts = []
        slots = _slots_of(type(value))
        if slots:
            live = _Slots(value, slots)
            self.see(live)
            for slot, held in zip(slots, live.values(), strict=True):
                said = b"empty" if held is _EMPTY else self.name(held, depth)
                parts.append(b"slot " + slot.__name__.encode() + b"\0" + said)
        made = _value_base(type(value))
        if made is not None:  # `class Mode(str)`: what it is as that
            parts.append(_joined(b"value", [self.name(_AS_MADE[made](value), depth)]))
        base = _items_base(type(value))
        if base is not None:
            self.see(value)
            if base is dict:
                items = [self.name(k, depth) + self.name(v, depth) for k, v in value.items()]
            else:
                items = [self.name(item, depth) for item in value]
                if base is set:
                    items.sort()
            parts.append(_joined(f"items {base.__name__}".encode(), items))
        return parts

    def written(self, kind: type, depth: int) -> list[bytes]:
        """``kind`` by its name and fingerprint (:func:`fingerprint_of`), then each thing its
        classes keep that their fingerprints do not name (:func:`_unwritten`: a table, a
        class), each named in turn; their namespaces are seen."""
        # imported here: a fingerprint names the objects its class holds, by this module
        from somatize.catalog._fingerprint import fingerprint_of

        kinds: set[type] = _WALKING.kinds
        if kind in kinds:  # its fingerprint is being worked out, reading this
            raise _Unnamed
        kinds.add(kind)
        try:
            written = fingerprint_of(kind)
        finally:
            kinds.discard(kind)
        lineage = _not_library(kind)
        self.read += map(vars, lineage)
        parts = [f"{qualified(kind)} {written}".encode()]
        for above in lineage:
            for name, member in sorted(vars(above).items()):
                if _unwritten(name, member):
                    label = f"{above.__qualname__}.{name}".encode()
                    parts.append(label + b"\0" + self.name(member, depth))
        return parts

    def attributes(self, value: Any) -> dict[str, Any]:
        """What ``value`` holds in its ``__dict__`` (seen for a watch), or {} with none."""
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except AttributeError:
            return {}
        if type(attributes) is not dict or not all(isinstance(a, str) for a in attributes):
            raise _Unnamed
        self.see(attributes)
        return attributes

    def see(self, container: Any) -> None:
        self.read.append(container)


def _unwritten(name: str, member: Any) -> bool:
    """Whether a class's ``name`` holds what its fingerprint (:func:`_written`) does not
    name: no dunder, plain value, function nor callable object, but a list, a dict, a
    class, a module or another object (``table = {"by": 2}``, ``make = Layer``)."""
    if _dunder(name) or _plain(member) or _functions_in(member):
        return False
    if isinstance(member, (type, ModuleType)):
        return True
    return not callable(member) and not hasattr(type(member), "__get__")


def _readable(kind: type) -> bool:
    """Whether an instance of ``kind`` holds all its state where it can be read, in its
    ``__dict__``: every class it inherits from, short of ``object``, written in Python
    (no method written in C, no slot), and none that says when it equals another but as
    a dataclass does."""
    found = _READABLE.get(kind)
    if found is None:
        found = _READABLE[kind] = _read_in_python(kind)
    return found


_READABLE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _moves_itself(kind: type) -> bool:
    """Whether a function of ``kind``, or of a class it inherits from short of the
    library's (:func:`_left_out`), sets or deletes an attribute of its first argument
    (``self.calls += 1``) other than as it is made (``__init__``, ``__post_init__``,
    ``__new__``, ``__setstate__``)."""
    for above in kind.__mro__:
        if _left_out(above):
            continue
        for name, member in list(vars(above).items()):
            if name in ("__init__", "__post_init__", "__new__", "__setstate__"):
                continue
            for function in _functions_in(member):
                if any(owner is None for owner, _ in _stores_by(function, True)):
                    return True
    return False


def _dataclass_equal(kind: type) -> bool:
    """Whether ``kind`` says when it equals another by the ``__eq__`` a dataclass is made
    with: field by field, each by ``==``, as a watch compares what it holds anyway."""
    owner = next(above for above in kind.__mro__ if "__eq__" in vars(above))
    equals, params = vars(owner)["__eq__"], vars(owner).get("__dataclass_params__")
    return (
        getattr(params, "eq", False) is True
        and isinstance(equals, FunctionType)
        and equals.__code__.co_filename == "<string>"
    )


def _read_in_python(kind: type) -> bool:
    made = _value_base(kind)  # what it is as a string or a number no `__eq__` changes
    base = _items_base(kind) or made
    equals: Any = kind.__eq__
    said = equals is object.__eq__ or _dataclass_equal(kind) or (base and equals is base.__eq__)
    said = said or made is not None
    if not said or kind.__mro__[-1] is not object:
        return False
    for above in kind.__mro__[:-1]:
        if above is base:  # its items read as such a table's (:meth:`_Walk.held_in_place`)
            continue
        if not above.__flags__ & _HEAPTYPE or above.__itemsize__ != getattr(
            base, "__itemsize__", 0
        ):
            return False
        space = vars(above)
        declared = set(_slots(space.get("__slots__", ()))) - {"__dict__", "__weakref__"}
        for name, member in list(space.items()):
            if isinstance(member, _C_MEMBERS) and getattr(made, name, None) is not member:
                return False  # but its base's own (`__hash__ = str.__hash__`)
            if isinstance(member, GetSetDescriptorType) and name not in ("__dict__", "__weakref__"):
                return False
            if name == "__dict__" and not isinstance(member, GetSetDescriptorType):
                return False
            if isinstance(member, MemberDescriptorType) and name not in declared:
                return False  # a slot no `__slots__` declares: not read as one
    return True


def _slots(declared: Any) -> tuple[str, ...]:
    return (declared,) if isinstance(declared, str) else tuple(declared)


_ITEMS_BASES = (dict, list, set)
"""The classes written in C a class read in Python may be made from: what an object of it
holds as a dict, list or set is read as such a table (:meth:`_Walk.held_in_place`)."""


_AS_MADE: dict[type, Any] = {
    int: int.__int__,
    float: float.__float__,
    # by the getters and the slice of the class itself: `complex.__complex__` and
    # `bytes.__bytes__` are of Python 3.11 on
    complex: lambda value: complex(complex.real.__get__(value), complex.imag.__get__(value)),
    str: str.__str__,
    bytes: lambda value: bytes.__getitem__(value, slice(None)),
    tuple: lambda value: tuple(tuple.__iter__(value)),
    frozenset: lambda value: frozenset(frozenset.__iter__(value)),
}
"""Each class of :data:`~somatize.catalog._members._VALUE_BASES` → what gives an object of a
subclass of it as an object of that very class, by that class's own code (not the
subclass's ``__str__`` or ``__iter__``)."""


def _items_base(kind: type) -> type | None:
    """The one class of :data:`_ITEMS_BASES` ``kind`` is made from, where it is a subclass of
    it written in Python (``class Params(dict)``); else None."""
    if kind in _CONTAINERS:
        return None
    bases = [base for base in _ITEMS_BASES if issubclass(kind, base)]
    return bases[0] if len(bases) == 1 else None


_TORCH_OWN = frozenset(
    {
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_is_full_backward_hook",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)
"""What torch keeps on every module for itself: when it holds nothing (no weight, buffer
nor hook), it says nothing of what the module is, and is left out of its name, so that a
torch upgrade that keeps another such table does not rename every module."""


def _torch_named(attributes: dict[str, Any]) -> dict[str, Any]:
    """What of a torch module's attributes names it: all but :data:`_TORCH_OWN`, which must
    hold nothing — a weight or a buffer (a tensor, named by no value) or a hook (which runs
    around its forward) makes it no module named by what it holds."""
    for name in _TORCH_OWN.intersection(attributes):
        held = attributes[name]
        if name in ("_parameters", "_buffers"):
            if not isinstance(held, dict) or any(v is not None for v in held.values()):
                raise _Unnamed
        elif held and name != "_non_persistent_buffers_set":
            raise _Unnamed
    if any(attributes[a] for a in attributes if "hook" in a and a not in _TORCH_OWN):
        raise _Unnamed  # another table of hooks, of another version of torch
    return {a: v for a, v in attributes.items() if a not in _TORCH_OWN}


def _torch_module(kind: type) -> bool:
    """Whether ``kind`` is a torch module's class (torch itself is not imported here)."""
    return any(
        above.__module__ == "torch.nn.modules.module" and above.__qualname__ == "Module"
        for above in kind.__mro__
    )
