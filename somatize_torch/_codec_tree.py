"""Nested answers: the shape of a ``tree`` of tensors, written, checked and built again.

The ``tensor`` codec (:mod:`somatize_torch.codec`) writes one tensor, or a flat
tuple, list or str-keyed dict of them, as it always did; any other value it takes —
``None`` in it, nesting, an ``OrderedDict``, a namedtuple — is a tree. Its tensors
are written as a flat tuple's are, in the order they are met, and its shape
(containers, keys, ``None`` and which tensor goes where) as JSON in the header's
``__metadata__``. :func:`_shape` writes that JSON, refusing (:class:`_Refused`)
anything but a tensor the codec writes (:func:`_is_tensor`), ``None`` and those
containers; :func:`_tree` reads it back from a header and checks it before anything
is built from it, since a header is what a store hands back; :func:`_built` builds
the value again. The three live together because they are one grammar: what one
writes, the others must read.

A namedtuple is named by its module and qualified name and found again among the
modules already loaded, never imported (:func:`_class_at`), and is made as the tuple
it is, so no code runs for what a store says; one whose class is not loaded where the
answer is read is :class:`~somatize.codecs.Unreadable`, an answer computed again.
"""

from __future__ import annotations

import inspect
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from somatize.catalog import held_at
from somatize.catalog._project import qualified
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
    if value.layout is not torch.strided or value.dtype not in DTYPES or value.is_quantized:
        return f"a {value.layout} {value.dtype} tensor"
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


def _shape(value: Any, leaves: list[torch.Tensor], where: str, depth: int, ordered: bool) -> Any:
    """The JSON shape of a nested ``value``, its tensors appended to ``leaves`` in the
    order they are met (a dict's items in the order it was filled in when ``ordered``,
    sorted otherwise): a tensor is its index in ``leaves``, None is null, a container is
    ``{"tuple" | "list": [...]}``, ``{"dict" | "OrderedDict": [[key, ...], ...]}`` or
    ``{"namedtuple": "module:qualname", "fields": [...], "items": [...]}``. _Refused
    for anything else."""
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
            _shape(v, leaves, f"{where}[{i}]", depth + 1, ordered) for i, v in enumerate(value)
        ]
        return {kind.__name__: items}
    if kind is dict or kind is OrderedDict:
        for key in value:
            if type(key) is not str:
                raise _Refused(f"{where}[{key!r}]", f"under a `{_kind_name(type(key))}` key")
        keys = list(value) if ordered or kind is OrderedDict else sorted(value)
        pairs = [[k, _shape(value[k], leaves, f"{where}[{k!r}]", depth + 1, ordered)] for k in keys]
        return {kind.__name__: pairs}
    fields = _named_tuple(kind) if issubclass(kind, tuple) else None
    if fields is not None:
        named = qualified(kind)
        if _class_at(named, fields) is not kind:
            raise _Refused(
                where,
                f"a `{_kind_name(kind)}` namedtuple, whose class cannot be found again by its "
                "name (it is defined inside a function, or another class took its name)",
            )
        items = [
            _shape(v, leaves, f"{where}.{field}", depth + 1, ordered)
            for field, v in zip(fields, value, strict=True)
        ]
        return {"namedtuple": named, "fields": list(fields), "items": items}
    raise _Refused(where, f"a `{_kind_name(kind)}`")


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


def _class_at(named: str, fields: Sequence[str]) -> type | None:
    """The namedtuple class ``module:qualname`` with ``fields`` among the modules this
    process has loaded — never importing one — or None."""
    module, _, qualname = named.partition(":")
    if "<locals>" in qualname:
        return None
    found = held_at(module, qualname)  # no code runs for a name a store gave
    if (
        isinstance(found, type)
        and issubclass(found, tuple)
        and _named_tuple(found) == tuple(fields)
    ):
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
    named, fields, items = (shape.get(k) for k in ("namedtuple", "fields", "items"))
    if (
        len(shape) != 3
        or type(named) is not str
        or type(fields) is not list
        or not all(type(f) is str for f in fields)
        or type(items) is not list
        or len(items) != len(fields)
    ):
        raise bad
    for item in items:
        _check_tree(item, seen, depth + 1)


def _built(shape: Any, tensors: list[torch.Tensor]) -> Any:
    """The value of a checked tree ``shape`` whose tensors are ``tensors``."""
    if shape is None:
        return None
    if type(shape) is int:
        return tensors[shape]
    if "namedtuple" in shape:
        kind = _class_at(shape["namedtuple"], shape["fields"])
        if kind is None:
            raise Unreadable(
                f"a tensor answer is a `{shape['namedtuple']}` namedtuple with fields "
                f"{shape['fields']}, and no such class is loaded in this process: it is not "
                "imported to read an answer, so the answer is computed again"
            )
        # Made as the tuple it is, so no code of the class runs for what a store says.
        return tuple.__new__(kind, [_built(item, tensors) for item in shape["items"]])
    ((kind_name, items),) = shape.items()
    if kind_name == "tuple":
        return tuple(_built(item, tensors) for item in items)
    if kind_name == "list":
        return [_built(item, tensors) for item in items]
    pairs = ((key, _built(item, tensors)) for key, item in items)
    return OrderedDict(pairs) if kind_name == "OrderedDict" else dict(pairs)
