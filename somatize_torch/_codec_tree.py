"""Nested answers: the shape of a ``tree`` of tensors, written, checked and built again.

The ``tensor`` codec (:mod:`somatize_torch.codec`) writes one tensor, or a flat
tuple, list or str-keyed dict of them, as it always did; any other value it takes —
``None`` in it, nesting, an ``OrderedDict``, a namedtuple, a structseq, a dataclass —
is a tree. Its tensors are written as a flat tuple's are, in the order they are met, and
its shape (containers, keys, ``None`` and which tensor goes where) as JSON in the
header's ``__metadata__``. :func:`_shape` writes that JSON, refusing (:class:`_Refused`)
anything but a tensor the codec writes (:func:`_is_tensor`), ``None`` and those
containers; :func:`_tree` reads it back from a header and checks it before anything
is built from it, since a header is what a store hands back; :func:`_built` builds
the value again. The three live together because they are one grammar: what one
writes, the others must read.

A namedtuple, a structseq (``torch.return_types.max``) and a dataclass (Hugging Face's
``ModelOutput``, a dataclass that is an ``OrderedDict`` of its fields not None) are
named by their module and qualified name and found again among the modules already
loaded, never imported (:func:`_class_at`), so no module's code runs for what a store
says. A dataclass is written only where its class's constructor, handed its fields,
makes it again as it is (:func:`_differs`; a ``ModelOutput`` fills in its keys there).
No code of the class runs to read one: a namedtuple is made as the tuple it is; a
structseq by the interpreter's own constructor; a dataclass has its fields and keys set
as they were kept (:func:`_assembled`). One whose class is not loaded where the answer is
read, or has other fields, is :class:`~somatize.codecs.Unreadable`, an answer computed
again. Nothing is unpickled.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import json
import types
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from somatize.catalog import held_at
from somatize.catalog._project import qualified
from somatize.catalog._rebuild import held_as_named
from somatize.codecs import Unreadable
from somatize_torch.digest import DTYPES

_MAX_DEPTH = 32
"""How deep containers may nest in one answer."""


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and _unwritable(value) is None


def _unwritable(value: torch.Tensor) -> str | None:
    """What ``value`` is, when it is a tensor the codec does not write; None when it does.
    A tensor of another class than ``torch.Tensor`` would come back as a plain one: a
    Parameter without requires_grad, a subclass without its class and the state it
    carries (torchvision's ``BoundingBoxes`` its format and canvas size), which no
    reader can rebuild without running the class's code. A meta tensor has no bytes, a
    nested one no single shape, and a dimension past 2**48 is one the header's reader
    takes for damage."""
    kind = type(value)
    if kind is not torch.Tensor:
        if issubclass(kind, torch.nn.Parameter):
            named = "torch.nn.Parameter" if kind is torch.nn.Parameter else _kind_name(kind)
            return (
                f"a `{named}`, which would come back as a plain tensor that does "
                "not require grad: hand its values, `p.detach()`"
            )
        return (
            f"a `{_kind_name(kind)}`, a subclass of `torch.Tensor` that would come back as a "
            "plain tensor, without its class and what it carries: hand a plain one, "
            "`x.as_subclass(torch.Tensor)`, and what else it carries beside it"
        )
    if value.is_nested:
        return f"a nested {value.dtype} tensor"
    # Each says what to hand instead: the layout and dtype alone leave a user whose value
    # is a tensor to wonder what "return a tensor" asks of it.
    if value.layout is not torch.strided:
        layout = str(value.layout).removeprefix("torch.")
        return f"a {layout} {value.dtype} tensor, not a dense one: hand `x.to_dense()`"
    if value.is_quantized:
        return (
            f"a quantized {value.dtype} tensor, whose scale and zero point no reader "
            "keeps: hand its values, `x.dequantize()`"
        )
    if value.dtype not in DTYPES:
        return (
            f"a {value.dtype} tensor, of a dtype of no whole bytes per element "
            "(sub-byte or bit-packed): hand its bytes, `x.view(torch.uint8)`"
        )
    if value.is_meta:
        return f"a {value.dtype} tensor on the meta device, which holds no values"
    if any(n >= 1 << 48 for n in value.shape):
        return f"a tensor of shape {tuple(value.shape)}, a dimension past 2**48"
    return None


class _Refused(Exception):
    """An item of a value the codec does not write: where it is, and what it is."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(where, what)
        self.where = where
        self.what = what


def _kind_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _shape(
    value: Any,
    leaves: list[torch.Tensor],
    where: str,
    depth: int,
    ordered: bool,
    rebuilt: bool = True,
) -> Any:
    """The JSON shape of a nested ``value``, its tensors appended to ``leaves`` in the
    order they are met (a dict's items in the order it was filled in when ``ordered``,
    sorted otherwise): a tensor is its index in ``leaves``, None is null, a container is
    ``{"tuple" | "list": [...]}``, ``{"dict" | "OrderedDict": [[key, ...], ...]}``,
    ``{"namedtuple" | "structseq": "module:qualname", "fields": [...], "items": [...]}``
    or ``{"dataclass": "module:qualname", "fields": [...], "items": [...], "keys": [...]
    | null}`` (the fields that are keys, in their order, for a dataclass that is a dict).
    _Refused for anything else. ``rebuilt``: whether each dataclass is made again by its
    constructor to see it comes back as it is (not for one already kept, being read)."""
    if isinstance(value, torch.Tensor):
        unwritable = _unwritable(value)
        if unwritable is not None:
            raise _Refused(where, unwritable)
        leaves.append(value)
        return len(leaves) - 1
    if value is None:
        return None
    if depth >= _MAX_DEPTH:
        raise _Refused(where, f"nested more than {_MAX_DEPTH} containers deep")
    kind = type(value)
    if kind is tuple or kind is list:
        items = [
            _shape(v, leaves, f"{where}[{i}]", depth + 1, ordered, rebuilt)
            for i, v in enumerate(value)
        ]
        return {kind.__name__: items}
    if kind is dict or kind is OrderedDict:
        for key in value:
            if type(key) is not str:
                raise _Refused(f"{where}[{key!r}]", f"under a `{_kind_name(type(key))}` key")
        keys = list(value) if ordered or kind is OrderedDict else sorted(value)
        pairs = [
            [k, _shape(value[k], leaves, f"{where}[{k!r}]", depth + 1, ordered, rebuilt)]
            for k in keys
        ]
        return {kind.__name__: pairs}
    form, fields = _layout(kind)
    if form is None:
        raise _Refused(where, f"a `{_kind_name(kind)}`")
    if fields is None:  # a dataclass its constructor alone cannot make
        raise _Refused(where, f"a `{_kind_name(kind)}` dataclass, {_UNMADE}")
    named = qualified(kind)
    if _class_at(form, named, fields) is not kind:
        raise _Refused(where, f"a `{_kind_name(kind)}` {form}, {_unfound(named)}")
    values = _field_values(value, form, fields)
    field_keys = _keys(value, kind, values, where) if form == "dataclass" else None
    if (
        rebuilt
        and form != "namedtuple"
        and _differs(_made(kind, form, values), kind, values, field_keys)
    ):
        raise _Refused(
            where,
            f"a `{_kind_name(kind)}` {form} that its class, made again from its fields, "
            "does not give back as it is",
        )
    items = [
        _shape(v, leaves, f"{where}.{field}", depth + 1, ordered, rebuilt)
        for field, v in values.items()
    ]
    shape = {form: named, "fields": list(fields), "items": items}
    return {**shape, "keys": field_keys} if form == "dataclass" else shape


def _unfound(named: str) -> str:
    """Why the class ``named`` (``module:qualname``) of a value cannot be found again by
    that name where the answer is read."""
    module, _, qualname = named.partition(":")
    why = "whose class cannot be found again by its name: "
    if "<locals>" in qualname:
        return why + "it is defined inside a function"
    if held_at(module, qualname) is None:
        # exec() of a namespace, runpy.run_path: its classes name a module that is not it.
        return why + (
            f"module `{module}` holds no such class, as for code run by `exec` or `runpy` in "
            "a namespace of its own. Define the class in a module, or in the script or "
            "notebook itself"
        )
    return why + "another class took its name"


_FORMS = ("namedtuple", "structseq", "dataclass")
"""The containers kept as their own class, found again by name: a namedtuple, a structseq
(``torch.return_types.max``, what ``h.max(dim=1)`` answers) and a dataclass (Hugging
Face's ``ModelOutput``, a dataclass that is an ``OrderedDict`` of its fields not None)."""

_UNMADE = (
    "which its constructor does not make from its fields alone (a field with `init=False`, "
    "a slot beside its fields, a field set through a property, a base such as `str` or "
    "`set` that holds values of its own), "
    "so it could not be made again as it is"
)


class Dataclass(abc.ABC):  # noqa: B024  # an ABC for its subclass hook alone: nothing to implement
    """Every dataclass, for ``isinstance`` and ``issubclass``: a type a codec names among
    the types it may take (:attr:`somatize.codecs.Codec.types`)."""

    @classmethod
    def __subclasshook__(cls, kind: type) -> bool:
        return dataclasses.is_dataclass(kind) or NotImplemented


_LAYOUTS: weakref.WeakKeyDictionary[type, tuple[str | None, tuple[str, ...] | None]] = (
    weakref.WeakKeyDictionary()
)
"""Each class's :func:`_layout`, found once: a cached module's answer is walked at every
call, a hit's too, and finding it asks the class for its attributes many times over."""


def _layout(kind: type) -> tuple[str | None, tuple[str, ...] | None]:
    """Which of :data:`_FORMS` class ``kind`` is and its fields (:func:`_form`,
    :func:`_fields`): what it is, fixed when the class was made, found once."""
    found = _LAYOUTS.get(kind)
    if found is None:
        form = _form(kind)
        found = (form, None if form is None else _fields(form, kind))
        _LAYOUTS[kind] = found
    return found


def _form(kind: type) -> str | None:
    """Which of :data:`_FORMS` class ``kind`` is, or None. A dataclass that is a tuple or a
    list is none: its items are not its fields."""
    if issubclass(kind, tuple):
        if _named_tuple(kind) is not None:
            return "namedtuple"
        return "structseq" if _structseq(kind) is not None else None
    if dataclasses.is_dataclass(kind) and not issubclass(kind, list):
        return "dataclass"
    return None


def _fields(form: str, kind: type) -> tuple[str, ...] | None:
    """The fields of ``kind``, a class of ``form``; None when it is not one, or is a
    dataclass with a field its constructor does not take."""
    if form == "namedtuple":
        return _named_tuple(kind)
    if form == "structseq":
        return _structseq(kind)
    if not dataclasses.is_dataclass(kind) or issubclass(kind, (tuple, list)):
        return None
    fields = dataclasses.fields(kind)
    names = tuple(f.name for f in fields)
    return names if all(f.init for f in fields) and _held_in_fields(kind, names) else None


_PLAIN_BASES = (object, dict, OrderedDict)
"""The classes written in C a dataclass kept may derive from: no state of theirs goes
unrecorded (a dict's is its keys, each a field)."""

_HEAP_TYPE = 1 << 9
"""``Py_TPFLAGS_HEAPTYPE``: a class made by a ``class`` statement, not written in C."""


def _held_in_fields(kind: type, fields: tuple[str, ...]) -> bool:
    """Whether all that an instance of dataclass ``kind`` holds is in its fields (and, for a
    dict, its keys): no base written in C but :data:`_PLAIN_BASES` (a ``str`` or a
    ``set`` holds what no field says), no slot beside its fields, no field set through a
    property (its code would run for each value a store hands)."""
    if any(_set_by_code(inspect.getattr_static(kind, field, None)) for field in fields):
        return False
    for base in kind.__mro__:
        if base not in _PLAIN_BASES and not base.__flags__ & _HEAP_TYPE:
            return False
        slots = vars(base).get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else slots
        if any(slot not in fields and slot not in ("__dict__", "__weakref__") for slot in slots):
            return False
    return True


def _set_by_code(attribute: Any) -> bool:
    """Whether ``attribute`` of a class is set through code of its own: a data descriptor
    (a property) that is no slot."""
    settable = inspect.getattr_static(type(attribute), "__set__", None) is not None
    return settable and not isinstance(attribute, types.MemberDescriptorType)


def _structseq(kind: type) -> tuple[str, ...] | None:
    """The fields of ``kind`` when it is a structseq all of whose fields are items, named
    (``torch.return_types.max``) and made by the interpreter's own constructor, which runs
    no Python code; None otherwise."""
    count = inspect.getattr_static(kind, "n_sequence_fields", None)
    names = inspect.getattr_static(kind, "__match_args__", None)
    if (
        type(count) is int
        and inspect.getattr_static(kind, "n_fields", None) == count
        and inspect.getattr_static(kind, "n_unnamed_fields", None) == 0
        and type(vars(kind).get("__new__")) is types.BuiltinFunctionType
        and type(names) is tuple
        and len(names) == count
        and all(type(n) is str for n in names)
    ):
        return names
    return None


def _field_values(value: Any, form: str, fields: Sequence[str]) -> dict[str, Any]:
    """The value of each field of ``value``, a container of ``form``."""
    if form == "dataclass":
        return {field: getattr(value, field) for field in fields}
    return dict(zip(fields, value, strict=True))


def _keys(value: Any, kind: type, values: dict[str, Any], where: str) -> list[str] | None:
    """The keys of ``value``, a dataclass, when it is a dict — each a field holding the
    value of the attribute of its name, as in a ``ModelOutput`` — or None when it is no
    dict; _Refused for an attribute or a key that is no field, which no constructor call
    from its fields makes again."""
    extra = sorted(set(getattr(value, "__dict__", {})) - set(values))
    if extra:
        raise _Refused(where, f"a `{_kind_name(kind)}` dataclass holding `{extra[0]}`, no field")
    if not isinstance(value, dict):
        return None
    keys = list(value)
    for key in keys:
        if type(key) is not str or key not in values or value[key] is not values[key]:
            raise _Refused(
                f"{where}[{key!r}]",
                f"a key of a `{_kind_name(kind)}` dataclass that is not the field of its name",
            )
    return keys


def _made(kind: type, form: str, values: dict[str, Any]) -> Any:
    """A ``kind`` made again from the ``values`` of its fields, by its constructor (a
    ``ModelOutput`` fills in its keys from its fields there); None where it raises."""
    try:
        return kind(tuple(values.values())) if form == "structseq" else kind(**values)
    except Exception:  # any constructor's error: what it makes is not the value
        return None


def _differs(made: Any, kind: type, values: dict[str, Any], keys: list[str] | None) -> bool:
    """Whether ``made`` is other than the ``kind`` whose fields hold ``values`` and, where
    it is a dict, whose ``keys`` are those: another class, a field or a key another value,
    an attribute besides its fields."""
    if type(made) is not kind:
        return True
    if isinstance(made, tuple):
        return len(made) != len(values) or any(
            a is not b for a, b in zip(made, values.values(), strict=False)
        )
    if any(getattr(made, field) is not v for field, v in values.items()):
        return True
    if set(getattr(made, "__dict__", {})) - set(values):
        return True
    if keys is None:
        return isinstance(made, dict)
    held: Any = made  # a dict, or no value made again as it was kept
    return (
        not isinstance(held, dict)
        or list(held) != keys
        or any(held[key] is not values[key] for key in keys)
    )


def tree_of(value: Any) -> tuple[Any, list[torch.Tensor]] | None:
    """The shape of ``value`` and its tensors in the order they are met, going into every
    container the codec writes (a dataclass too, which torch's pytree does not go into),
    or None where the codec does not write ``value``. Asked of every answer of a cached
    module, a hit's too, so its dataclasses are not made again by their constructor here:
    one computed was checked so before it was kept, and one recalled was kept so."""
    leaves: list[torch.Tensor] = []
    try:
        shape = _shape(value, leaves, "", 0, ordered=True, rebuilt=False)
    except _Refused:
        return None
    return shape, leaves


def built_with(shape: Any, tensors: list[torch.Tensor]) -> Any:
    """The value of ``shape`` (:func:`tree_of`) made again as a recall makes it, with
    ``tensors`` in the places of its own."""
    return _built(shape, tensors)


def _named_tuple(kind: type) -> tuple[str, ...] | None:
    """The fields of namedtuple class ``kind``, or None when it is not one."""
    fields = inspect.getattr_static(kind, "_fields", None)
    if (
        isinstance(fields, tuple)
        and all(type(f) is str for f in fields)
        and inspect.getattr_static(kind, "_make", None) is not None
    ):
        return fields
    return None


def _class_at(form: str, named: str, fields: Sequence[str]) -> type | None:
    """The class of ``form`` (:data:`_FORMS`) named ``module:qualname``, with ``fields``,
    among the modules this process has loaded — never importing one — or None."""
    module, _, qualname = named.partition(":")
    if "<locals>" in qualname:
        return None
    found = held_as_named(module, qualname)  # no code runs for a name a store gave
    if isinstance(found, type) and _layout(found) == (form, tuple(fields)):
        return found
    return None


def _read_json(raw: Any) -> Any:
    """The JSON ``raw`` of a header, or of a string in its ``__metadata__``: ValueError for
    an object that names a key twice, which the codec never writes (one reader keeps the
    first, another the last)."""
    return json.loads(raw, object_pairs_hook=_object)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError(f"a JSON object names a key twice: {str(pairs)[:80]}")
    return found


def _tree(raw: Any, count: int) -> Any:
    """The shape of a tree answer, as its header records it, checked: every container
    well formed, and each of its ``count`` tensors in it exactly once."""
    try:
        shape = _read_json(raw)
    except (ValueError, TypeError) as why:
        raise ValueError(f"the shape of a tensor answer cannot be read ({why})") from None
    seen: list[int] = []
    _check_tree(shape, seen, 0)
    if sorted(seen) != list(range(count)):
        raise ValueError(f"the shape of a tensor answer places tensors {seen[:8]} of {count}")
    return shape


def _check_tree(shape: Any, seen: list[int], depth: int) -> None:
    if shape is None:
        return
    if type(shape) is int:
        seen.append(shape)
        return
    bad = ValueError(f"the shape of a tensor answer is damaged at {str(shape)[:80]}")
    if type(shape) is not dict or depth >= _MAX_DEPTH:
        raise bad
    if len(shape) == 1:
        ((kind, items),) = shape.items()
        if kind in ("tuple", "list") and type(items) is list:
            for item in items:
                _check_tree(item, seen, depth + 1)
            return
        if kind in ("dict", "OrderedDict") and type(items) is list:
            keys = []
            for pair in items:
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
                    raise bad
                keys.append(pair[0])
                _check_tree(pair[1], seen, depth + 1)
            if len(set(keys)) != len(keys):
                raise bad
            return
        raise bad
    form = next((f for f in _FORMS if f in shape), None)
    named, fields, items = (shape.get(k) for k in (form, "fields", "items"))
    if (
        len(shape) != (4 if form == "dataclass" else 3)
        or type(named) is not str
        or type(fields) is not list
        or not all(type(f) is str for f in fields)
        or len(set(fields)) != len(fields)
        or type(items) is not list
        or len(items) != len(fields)
        or (form == "dataclass" and not _keys_well_formed(shape.get("keys", 0), fields))
    ):
        raise bad
    for item in items:
        _check_tree(item, seen, depth + 1)


def _keys_well_formed(keys: Any, fields: list[str]) -> bool:
    """Whether ``keys``, a dataclass's as its shape records them, are None (no dict) or
    fields, each once."""
    return keys is None or (
        type(keys) is list
        and all(type(k) is str and k in fields for k in keys)
        and len(set(keys)) == len(keys)
    )


def _built(shape: Any, tensors: list[torch.Tensor]) -> Any:
    """The value of a checked tree ``shape`` whose tensors are ``tensors``."""
    if shape is None:
        return None
    if type(shape) is int:
        return tensors[shape]
    form = next((f for f in _FORMS if f in shape), None)
    if form is not None:
        return _built_class(form, shape, tensors)
    ((kind_name, items),) = shape.items()
    if kind_name == "tuple":
        return tuple(_built(item, tensors) for item in items)
    if kind_name == "list":
        return [_built(item, tensors) for item in items]
    pairs = ((key, _built(item, tensors)) for key, item in items)
    return OrderedDict(pairs) if kind_name == "OrderedDict" else dict(pairs)


def _built_class(form: str, shape: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    """The namedtuple, structseq or dataclass of a checked ``shape``: Unreadable where its
    class is not loaded, has other fields, or is other than it was (:func:`_assembled`)."""
    named, fields = shape[form], shape["fields"]
    kind = _class_at(form, named, fields)
    if kind is None:
        raise Unreadable(
            f"a tensor answer is a `{named}` {form} with fields {fields}, and no such class "
            "is loaded in this process: it is not imported to read an answer, so the answer "
            "is computed again",
            named=named,
        )
    values = {f: _built(item, tensors) for f, item in zip(fields, shape["items"], strict=True)}
    if form == "namedtuple":
        # Made as the tuple it is, so no code of the class runs for what a store says.
        return tuple.__new__(kind, list(values.values()))
    if form == "dataclass":
        return _assembled(kind, named, values, shape["keys"])
    made = _made(kind, form, values)  # a structseq: the interpreter's constructor, no Python
    if _differs(made, kind, values, None):
        raise Unreadable(
            f"a tensor answer is a `{named}` {form}, which its class, made again from the "
            "fields kept, does not give back as it was kept: "
            "the class changed, so the answer is computed again"
        )
    return made


def _assembled(kind: type, named: str, values: dict[str, Any], keys: list[str] | None) -> Any:
    """The dataclass ``kind`` holding ``values`` in its fields and, where it is a dict, the
    fields ``keys`` as its keys: set in place, as its constructor set them when the value
    was written (checked then), so no code of a class a store names runs, as none of a
    namedtuple's does. Unreadable where its class is a dict now and was not, or the
    reverse."""
    base: Any = next(b for b in kind.__mro__ if b in _PLAIN_BASES)  # the C class it is made of
    if (keys is not None) is not issubclass(base, dict):
        raise Unreadable(
            f"a tensor answer is a `{named}` dataclass kept as {'a' if keys is not None else 'no'}"
            " dict, and its class is not so now: the class changed, so the answer is computed "
            "again"
        )
    made = base.__new__(kind)
    for field, value in values.items():
        object.__setattr__(made, field, value)  # past a frozen or Hugging Face __setattr__
    for key in keys or ():
        base.__setitem__(made, key, values[key])  # past a ModelOutput's __setitem__
    return made
