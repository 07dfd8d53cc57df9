"""What a module keeps besides its weights that changes what it answers: its
settings and its hooks.

A :class:`~somatize_torch.freeze.ModuleNode` declares its module by its structure as
``repr`` shows it, and ``repr`` does not show all that a forward reads: a plain value
a submodule keeps (``self.temperature = 2.0``), a function it holds or is given in
place of its own (``self.act = F.gelu``), a forward hook. :func:`settings_of` and
:func:`hooks_of` name these in the node's declaration, so a module that keeps other
values or runs other hooks is keyed anew. Each is named as a value that reads the same
in any process — plain values as they are, tensors and arrays by digest, functions and
hooks by their code — and what cannot be named so is left unseen rather than named by
what it is in this one.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import fractions
import functools
import itertools
import operator
import pathlib
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules import module as _registry  # where torch keeps its global hooks
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils.hooks import RemovableHandle as _HANDLES  # it numbers every hook

from somatize import canonical
from somatize._arrays import looked_at as _looked_at
from somatize._arrays import same_array as _same_array
from somatize.canonical import NotCanonical
from somatize.catalog import code_digest, globals_read
from somatize.catalog._members import standard_module
from somatize.catalog._project import qualified
from somatize_torch._modes import outside_compiled
from somatize_torch.digest import digest_tensor

if TYPE_CHECKING:
    from somatize_torch._state import Reads
    from somatize_torch.wrap import Wrapped

__all__ = [
    "SettingsWatch",
    "any_global_hooks",
    "global_hooks",
    "hooks_of",
    "its_own",
    "its_own_held",
    "settings_of",
    "stand_in_call",
    "stood_for",
]


_TORCH_OWN = frozenset(vars(nn.Module())) | {"_compiled_call_impl"}
"""What torch itself keeps in every module (parameters, buffers, children, hooks, the
training flag, what ``Module.compile`` makes): seen elsewhere in the key, or not part
of what the module computes."""


def stood_for(part: nn.Module) -> nn.Module:
    """The module whose values, hooks and code ``part`` computes with: where ``part`` is a
    model made by :func:`somatize.torch.wrap`, the model it wraps, which it runs and whose
    parts it holds as its own; its own attributes are bookkeeping (its counts, graph,
    record and traces, which change as it runs) and say nothing of what it answers. Any
    other module stands for itself."""
    wrapped = _wrapped_class()
    while isinstance(part, wrapped):
        part = part.model
    return part


def its_own(stand_in: nn.Module, module: nn.Module, name: str) -> bool:
    """Whether ``name``, written through ``stand_in`` (a row cache, a wrapped model), is
    ``module``'s: a value it holds itself (``encoder.gain``), or its class holds as a
    default or a property. There its forward reads it; written beside it, on the stand-in,
    reading it back would show a value the forward never uses. What the stand-in holds
    itself, and a private name, are the stand-in's."""
    return (
        not name.startswith("_")
        and name not in stand_in.__dict__
        and (name in module.__dict__ or hasattr(type(module), name))
        and not hasattr(type(stand_in), name)
    )


def its_own_held(stand_in: nn.Module, module: nn.Module, name: str) -> bool:
    """Whether ``name``, deleted through ``stand_in``, is a value ``module`` holds itself
    (:func:`its_own`): deleted there, as it is written there."""
    return its_own(stand_in, module, name) and name in module.__dict__


@functools.cache
def _wrapped_class() -> type[Wrapped]:
    """:class:`~somatize_torch.wrap.Wrapped`, imported once: :func:`stood_for` is asked of
    every part of a module at each computed call (the generators it holds), and an import
    there costs as much as the rest of the look."""
    from somatize_torch.wrap import Wrapped  # it imports this module

    return Wrapped


def settings_of(module: nn.Module) -> dict[str, Any]:
    """The plain values each submodule keeps beside its weights, by dotted name: what a
    forward may read that neither ``repr`` nor the state shows (``self.temperature =
    2.0``, a tensor held as a plain attribute, ``self.act = F.gelu``). Numbers, strings,
    bools, None, complex numbers, fractions, decimals, ranges, slices, tuples, lists, sets
    and dicts of them (keyed by any of these), dataclass instances, dtypes, devices, paths
    and enums (a flag no member names, by its value) are taken as they are, each kind
    named apart from the others (a tuple from a list, an enum member from the string of
    its name), numpy's scalars as the numbers they hold, of their numpy type, tensors
    and numeric numpy arrays by digest (a tensor of a subclass by its class and the
    attributes it keeps too); functions (a
    ``forward`` replaced on the instance too) by their code, as hooks are, and a Python
    function by its defaults, the values it closes over and the globals it reads but
    modules (:func:`_globals_of`) too, built-in
    functions and classes by name, a ``functools.partial`` with the values it binds, a
    plain object held as a config (of a class written in Python, a ``SimpleNamespace``,
    an ``argparse.Namespace``: ``self.config.flag``) by its class and its attributes,
    and a method bound to such a config (``self.act = scaler.apply``) with it.
    Other objects a module holds (torch's, numpy's, the standard library's: a logger, a
    lock; one of a class written in C), and the object a method is bound to where it is
    no config, are not seen; one
    held inside a container is named by its type alone (``{"unseen": "module:Class"}``),
    so that the container's other items still key it. A container is followed however
    deep it is nested (one that holds itself names where it refers back to, ``{"cycle":
    1}``); one nested deeper than Python's recursion limit is refused. A model made by
    :func:`somatize.torch.wrap` is named by the values of the model it wraps
    (:func:`stood_for`)."""
    out: dict[str, Any] = {}
    for prefix, part in module.named_modules():
        sub = stood_for(part)
        if _compile_wrapper(sub):
            continue  # torch's bookkeeping; the module it compiles is a part, named below
        worked_out = _worked_out(sub)
        # And what it keeps in the slots its class declares (`__slots__`), as a config's.
        for name, value in {**vars(sub), **_slots_of(sub, part=True)}.items():
            if name in _TORCH_OWN or name in worked_out:
                continue
            where = f"{prefix}.{name}" if prefix else name
            try:
                seen = _setting(value, ())
            except RecursionError:
                raise NotCanonical(
                    f"`{where}` is nested deeper than Python's recursion limit "
                    f"({sys.getrecursionlimit()}) lets it be followed, so the module cannot be "
                    "keyed by it. Keep it flatter, or somewhere other than on the module"
                ) from None
            if seen is not _UNSEEN:
                out[where] = seen
    return out


def _compile_wrapper(part: nn.Module) -> bool:
    """Whether ``part`` is the wrapper ``torch.compile`` makes of a module, which runs the
    module it holds (its part ``_orig_mod``) with that module's own values: what it keeps
    itself is torch's bookkeeping, an id of its own among it, so that named, each compile
    of the module, in each process, would key it anew and recall nothing kept before."""
    return type(part).__name__ == "OptimizedModule" and "_orig_mod" in part._modules


_WORKED_OUT = (WeightNorm, SpectralNorm)
"""The forward pre-hooks of torch's older ``weight_norm`` and ``spectral_norm``, which work
out a module's weight from its state before each forward and set it as a plain tensor."""


def _worked_out(part: nn.Module) -> set[str]:
    """The attributes of ``part`` that a forward pre-hook of :data:`_WORKED_OUT` sets before
    each forward (``weight``): worked out from its state, which the state digest names (the
    ``weight_g`` and ``weight_v`` it is made from), not a setting. Declared, they named the
    random weights a copy is built with until its first forward. So too the weight a
    pruning hook of ``torch.nn.utils.prune`` works out from ``weight_orig`` and
    ``weight_mask``: declared, a mask or weight changed would key the call after anew
    twice (before and after the hook set the weight), keeping nothing of the first."""
    hooks = part._forward_pre_hooks.values()
    return {hook.name for hook in hooks if isinstance(hook, _WORKED_OUT)} | {
        hook._tensor_name for hook in hooks if isinstance(hook, BasePruningMethod)
    }


class SettingsWatch:
    """Whether what :func:`settings_of` and :func:`hooks_of` name may have changed since
    the watch was taken, cheaply enough to ask at every forward: each value a part of
    the module keeps beside torch's own is looked at by identity (``enc.temperature =
    5.0``, ``enc.act = F.relu``), a tensor so kept by its memory and version counter
    too (``t.data = ...``, a write in place), the items of a list, set or dict so kept (an
    ``OrderedDict`` too) by identity (``enc.scales[0] = 2.0``), all in one pass — a plain
    dict of many items by the version CPython keeps of it instead, where it can be read
    (:func:`_dict_versions`) —
    each value a config a part holds keeps (in a list, tuple, dict or set too), or the
    config a method it keeps is bound to (``scaler.s = 3.0``), and the
    configs it holds in turn, five deep (``enc.config.flag = True``,
    ``enc.configs[0].flag = True``) likewise, each function so kept by its code, its
    defaults, what each cell it closes over holds (``k = 4.0`` rebound,
    ``f.__defaults__ = ...``) and each global it reads (``SCALE = 2.0`` rebound), and
    what it closes over, holds as a default, reads as a global (:func:`_globals_of`) or a
    ``functools.partial`` binds as a value a part keeps is, each numeric numpy array so
    kept by its bytes (compared whole with a copy taken with the watch, in place beyond
    4 MiB: numpy keeps no version counter), each part's and
    config's table of attributes by its length (a value added or removed), and each table of forward
    hooks by its length and, once any hook was registered anywhere, by its handles (a
    hook registered, removed or put first). What it says may be nothing after all (the
    same value assigned again): it is asked so that the declaration is taken again only
    when it may have changed. A tensor or numpy array in a list, tuple, dict or set a part
    or config keeps, however nested, is looked at as one it keeps directly, and so is a
    list, dict or set so held (``config.layers[0][1] = 5``), and each part
    and config by its class (``config.__class__ = Other``) and its table of attributes
    (``config.__dict__ = {...}``). What an object held that is no config changes in
    place (its attribute) is not seen
    here, nor a write into a tensor made under ``torch.inference_mode``, which keeps no
    version counter; declaring again sees them (``freeze``, ``redeclare()``).

    What a module's own forward changes (a table a rotary embedding fills as it first
    runs, a count of its calls) is seen as any change is
    (:meth:`~somatize_torch.freeze.ModuleNode.changed_as_it_ran`).

    The modules of ``read``, which the module computes with beyond its own parts
    (:func:`~somatize_torch._state.modules_read`: ``NORM = nn.LayerNorm(3)`` read by its
    forward), are watched as its parts are, and their modes too (``NORM.train()``), which
    are theirs to set, not held; and what leads to them (``NORMS[0] = other``)."""

    __slots__ = (
        "_arrays",
        "_bytearrays",
        "_bytes",
        "_containers",
        "_counted",
        "_counts",
        "_dicts",
        "_functions",
        "_held_bytes",
        "_hooks",
        "_issued",
        "_items",
        "_kinds",
        "_lengths",
        "_made",
        "_marks",
        "_modes",
        "_names",
        "_objects",
        "_own",
        "_owners",
        "_places",
        "_plain_own",
        "_read",
        "_sizes",
        "_slots",
        "_slotted",
        "_tables",
        "_tables_in",
        "_tensors",
        "_training",
        "_values",
        "_versions",
        "_walked",
    )
    _read: Reads

    def __init__(
        self, module: nn.Module, before: SettingsWatch | None = None, read: Reads | None = None
    ) -> None:
        """``before``: the watch this one follows, whose look through the dicts the parts
        and configs keep is taken again where a dict's version did not move since, and
        whose ``read`` is taken where none is given."""
        if read is None:
            from somatize_torch._state import NO_READS  # it imports this module

            read = before._read if before is not None else NO_READS
        self._read = read
        self._modes = [part for one in read.found for part in one.module.modules()]
        self._training = tuple(map(_TRAINING, self._modes))
        # A model made by `wrap` by the model it wraps, but for its own hooks, which run too.
        wrappers = [part for part in module.modules() if stood_for(part) is not part]
        modules = [*map(stood_for, module.modules()), *self._modes]
        parts = [vars(part) for part in modules]
        # The plain objects the parts hold (a config), and those they hold in turn, in a
        # list, tuple, dict or set too: what each holds is watched as a part's own values
        # are (`enc.config.flag = True`, `enc.configs[0].flag = True`); and the tensors and
        # arrays found in those containers, looked at as one held directly is.
        within: list[Any] = []
        self._walked: dict[int, tuple[dict[Any, Any], int, list[Any]]] = {}
        walked = before._walked if before is not None else {}
        nested: list[Any] = []  # the lists, dicts and sets met on the way, however deep
        configs = _configs_in(parts, within, (walked, self._walked), nested)
        # What the functions the parts and configs keep close over or hold as defaults (a
        # tensor, a list, a config), looked at as what a part keeps itself is: the key
        # names each.
        kept = [v for table in parts for k, v in list(table.items()) if k not in _UNWATCHED]
        kept += [v for one in configs for v in list((_dict_of(one) or {}).values())]
        functions, bound = _bound_in(kept, globals_too=True)
        if bound:
            ids = set(map(id, configs))
            table = {str(at): one for at, one in enumerate(bound)}
            more = _configs_in([table], within, (walked, self._walked), nested)
            configs += [one for one in more if id(one) not in ids]
        # Each part's and config's class (`config.__class__ = Other`, as a library may).
        self._objects = [*modules, *configs]
        self._kinds = tuple(map(type, self._objects))
        # And each one's table of attributes, which may be replaced whole
        # (`config.__dict__ = {...}`): the values are looked at in the tables held here.
        self._own = tuple(map(_dict_of, self._objects))
        self._plain_own = None not in self._own  # each keeps one (a module, a config), as a rule
        held = [table for table in map(_dict_of, configs) if table is not None]
        # A config's slots (a class with `__slots__`), each looked at by identity too.
        slots = [(member, one) for one in configs for member in _members(one)]
        # And a part's, which its forward reads as a value it keeps (`self.gain`).
        slots += [(member, one) for one in modules for member in _members(one, part=True)]
        slotted = list(itertools.starmap(_slot, slots))
        owners: list[dict[str, Any]] = []
        names: list[str] = []
        values: list[Any] = []
        for at, table in enumerate(parts + held):
            for name, value in list(table.items()):
                if at >= len(parts) or name not in _UNWATCHED:
                    owners.append(table)
                    names.append(name)
                    values.append(value)
        # Each global a function so kept reads (`SCALE = 2.0`, `ACT = torch.tanh` rebound),
        # by identity: the key names those but modules (:func:`_globals_of`); torch's own
        # functions' are their own.
        for function in itertools.filterfalse(_library, functions):
            for name in globals_read(function.__code__):
                owners.append(function.__globals__)
                names.append(name)
                values.append(function.__globals__.get(name))
        hooks = [_registry._global_forward_pre_hooks, _registry._global_forward_hooks]
        hooks += [table[kind] for table in parts for kind in _HOOK_TABLES]
        hooks += [vars(part)[kind] for part in wrappers for kind in _HOOK_TABLES]
        self._slots = slots
        self._slotted = slotted
        values = [*values, *slotted]
        self._owners = owners
        self._names = names
        self._values = values
        self._tables: list[dict[Any, Any]] = [*parts, *held, *hooks]
        self._sizes = tuple(map(len, self._tables))
        self._hooks = hooks
        self._marks = tuple(map(tuple, hooks))
        self._issued = _HANDLES.next_id
        # What may change in place, looked at beyond its identity.
        found = {id(v): v for v in [*values, *within]}.values()
        # Each tensor by where its memory is (`t.data = ...`) and, but one made under
        # `torch.inference_mode`, which keeps none, its version counter (a write in place):
        # read by torch's own getters, mapped, not through a function of ours per tensor,
        # which cost a third more (a list of thousands of tensors, looked at every call).
        self._tensors = [v for v in found if isinstance(v, torch.Tensor)]
        self._places = tuple(map(_PLACE, self._tensors))
        self._counted = [v for v in self._tensors if not v.is_inference()]
        self._counts = tuple(map(_COUNT, self._counted))
        # Each list, dict or set a part or config keeps, or a function binds, and each one
        # held in those in turn (`config.layers[0][1] = 5`): its items by identity.
        held_in = [v for v in [*values, *bound] if isinstance(v, (list, dict, set))]
        containers = list({id(v): v for v in [*held_in, *nested]}.values())
        # A dict's version, where CPython keeps one, moves at every change to it: one
        # number looked at in place of each of its items (a vocabulary of 50,000 words).
        # A small one is looked at by its items with the lists and sets, which is cheaper
        # than reading its version (a table of 50,000 small dicts).
        versioned = [_versioned(v) for v in containers]
        self._dicts = list(itertools.compress(containers, versioned))
        self._versions = tuple(map(_dict_version or id, self._dicts))
        looked = [v for v, by in zip(containers, versioned, strict=True) if not by]
        self._containers = [v for v in looked if not isinstance(v, dict)]
        self._tables_in = [v for v in looked if isinstance(v, dict)]
        self._lengths = tuple(map(len, [*self._containers, *self._tables_in]))
        self._items = tuple(_contents(self._containers, self._tables_in))
        self._functions = functions
        self._made = tuple(map(_made_of, self._functions))
        # numpy keeps no version counter: a numeric array's bytes are looked at whole.
        numpy = sys.modules.get("numpy")  # not imported: nothing held is one of its arrays
        kind = numpy.ndarray if numpy is not None else ()
        self._arrays = [v for v in found if isinstance(v, kind) and v.dtype.kind in _NUMERIC]
        self._bytes = tuple(map(_looked_at, self._arrays))
        # A bytearray, keyed by its bytes, may be written in place too: its bytes, copied.
        self._bytearrays = [v for v in found if isinstance(v, bytearray)]
        self._held_bytes = tuple(map(bytes, self._bytearrays))

    def changed(self) -> bool:
        """Whether a value a part keeps, or a forward hook, may have changed."""
        return (
            not all(map(operator.is_, map(dict.get, self._owners, self._names), self._values))
            or tuple(map(len, self._tables)) != self._sizes
            # Any hook registered anywhere since: was one registered here?
            or (_HANDLES.next_id != self._issued and tuple(map(tuple, self._hooks)) != self._marks)
            or tuple(map(_PLACE, self._tensors)) != self._places
            # One given memory made under `torch.inference_mode` (`t.data = ...`), even at
            # the same place, keeps no count from then on: asked first.
            or any(map(_INFERENCE, self._counted))
            or tuple(map(_COUNT, self._counted)) != self._counts
            or tuple(map(_dict_version or id, self._dicts)) != self._versions
            or tuple(map(len, itertools.chain(self._containers, self._tables_in))) != self._lengths
            or not all(map(operator.is_, _contents(self._containers, self._tables_in), self._items))
            or not all(map(operator.is_, itertools.starmap(_slot, self._slots), self._slotted))
            or not all(map(_same_items, map(_made_of, self._functions), self._made))
            or not all(map(_same_array, self._arrays, self._bytes))
            or tuple(map(bytes, self._bytearrays)) != self._held_bytes
            or tuple(map(type, self._objects)) != self._kinds
            or not _same_tables(self._objects, self._own, self._plain_own)
            or (bool(self._modes) and tuple(map(_TRAINING, self._modes)) != self._training)
            or self._read.moved()
        )


_TRAINING = operator.attrgetter("training")


def _dict_of(value: Any) -> dict[str, Any] | None:
    try:
        held = object.__getattribute__(value, "__dict__")
    except AttributeError:  # a class with `__slots__`
        return None
    return held if isinstance(held, dict) else None


def _same_tables(objects: list[Any], own: tuple[Any, ...], plain: bool) -> bool:
    """Whether each of ``objects`` keeps the table of attributes ``own`` holds for it, as
    :func:`_dict_of` reads it. Where each kept a plain one (``plain``: the modules, and
    configs but slotted ones), read by ``object.__getattribute__`` itself, mapped over them
    all, rather than by a Python call each: half the time, at every cached call. One that
    keeps none now (or a table read otherwise) is one that changed."""
    if not plain:
        return all(map(operator.is_, map(_dict_of, objects), own))
    try:
        tables = map(object.__getattribute__, objects, itertools.repeat("__dict__"))
        return all(map(operator.is_, tables, own))
    except AttributeError:
        return False


_PLAIN_TYPES = frozenset({str, int, float, bool, bytes, type(None)})
"""Kinds an item is passed over as, at once, as configs are looked for (a vocabulary)."""

_CONFIG_DEPTH = 5
"""How many configs deep the watch follows configs (a config's config's...)."""


Walked = dict[int, tuple[dict[Any, Any], int, list[Any]]]
"""Each plain dict looked through (by ``id``), with its version then and its items of no
plain kind: the same items, where its version did not move since."""


def _configs_in(
    parts: list[dict[str, Any]],
    within: list[Any] | None = None,
    walked: tuple[Walked, Walked] | None = None,
    containers: list[Any] | None = None,
) -> list[Any]:
    """The plain objects (configs) the tables ``parts`` hold, directly or in a list,
    tuple, dict or set (however nested), and those they hold in turn, five configs deep,
    as the key names them: each once. torch's own tables (a hook object and what it
    keeps) are passed over, as the watch passes over them. The tensors (but parameters,
    which are state), numpy arrays and bytearrays met on the way are put in ``within``,
    if given.
    With ``walked`` (what a look before found, what this one finds), a plain dict whose
    version did not move since the look before is not looked through again item by item
    (a vocabulary of 50,000 words): its items of no plain kind are what they were. Each
    list, dict and set looked through (of those kinds exactly, or subclasses: an
    ``OrderedDict``) is put in ``containers``, if given."""
    from somatize_torch._values import _followed  # it imports this module

    numpy = sys.modules.get("numpy")  # not imported: nothing held is one of its arrays
    arrays = (numpy.ndarray,) if numpy is not None and within is not None else ()

    found: dict[int, Any] = {}
    seen: set[int] = set()  # containers already looked through
    todo: list[tuple[Any, int]] = [
        ([value for name, value in table.items() if name not in _UNWATCHED], 0) for table in parts
    ]
    while todo:
        items, depth = todo.pop()
        for value in list(items):
            kind = type(value)
            if kind in _PLAIN_TYPES or isinstance(value, nn.Module):
                continue
            if isinstance(value, (torch.Tensor, bytearray, *arrays)):
                if within is not None and not isinstance(value, nn.Parameter):
                    within.append(value)
                continue
            if isinstance(value, (list, tuple, set, frozenset, dict)):
                if id(value) not in seen:
                    seen.add(id(value))
                    if containers is not None and isinstance(value, (list, dict, set)):
                        containers.append(value)
                    if walked is not None and type(value) is dict and _dict_version:
                        todo.append((_dict_items(value, *walked), depth))
                    else:
                        todo.append((_items(value) if isinstance(value, dict) else value, depth))
            elif id(value) not in found and (_followed(value) or _slots_of(value)):
                found[id(value)] = value
                if depth + 1 < _CONFIG_DEPTH:
                    todo.append((_held_by(value).values(), depth + 1))
    return list(found.values())


def _bound_in(
    values: list[Any], globals_too: bool = False
) -> tuple[list[types.FunctionType], list[Any]]:
    """The Python functions among ``values``, and those they close over or bind in turn
    (a ``functools.partial``'s too), each once; and what they close over, hold as
    defaults or bind (a partial's function, arguments and keyword values, and the dict of
    its keywords, which may be written into). With ``globals_too``, the globals each
    reads that the key names (:func:`_globals_of`) are among what they bind, and
    functions among them followed."""
    functions: dict[int, types.FunctionType] = {}
    seen: set[int] = set()
    bound: list[Any] = []
    todo = list(values)
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        if isinstance(value, functools.partial):
            seen.add(id(value))
            # Each argument and keyword value too: a list it binds may be written into.
            keywords = value.keywords
            held: list[Any] = [value.func, *value.args, keywords, *keywords.values()]
        elif isinstance(value, types.MethodType) and _bound_to_config(value):
            seen.add(id(value))
            # The config it is bound to too, whose values it reads (`scaler.s`).
            held = [value.__func__, value.__self__]
        elif isinstance(value, types.FunctionType):
            seen.add(id(value))
            functions[id(value)] = value
            keywords = value.__kwdefaults__ or {}
            cells = [_cell_of(cell) for cell in value.__closure__ or ()]
            held = [*(value.__defaults__ or ()), *keywords.values(), *cells]
            if globals_too:
                held += _globals_of(value).values()
        else:
            continue
        bound += held
        todo += held
    return list(functions.values()), bound


def _dict_items(table: dict[Any, Any], before: Walked, now: Walked) -> list[Any]:
    """The keys and values of no plain kind ``table``, a plain dict, holds: as ``before``
    found them where its version did not move since (the dict is held there, so its
    ``id`` is no other's), else looked through. Noted in ``now``."""
    assert _dict_version is not None
    version = _dict_version(table)
    found = before.get(id(table))
    if found is None or found[0] is not table or found[1] != version:
        items = _items(table)
        kinds = map(type, items)
        held = [item for item, kind in zip(items, kinds, strict=True) if kind not in _PLAIN_TYPES]
        found = (table, version, held)
    now[id(table)] = found
    return found[2]


_GLOBAL_TABLES = (
    ("_global_forward_pre_hooks", "register_module_forward_pre_hook"),
    ("_global_forward_hooks", "register_module_forward_hook"),
    ("_global_backward_pre_hooks", "register_module_full_backward_pre_hook"),
    ("_global_backward_hooks", "register_module_full_backward_hook"),
)
"""torch's tables of hooks that run with every module's call, each with the function
that registers into it (``register_module_backward_hook`` fills the last one too)."""

_OWN_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def global_hooks() -> list[str]:
    """torch's global module hooks registered now, each named by the function that
    registered it and the hook's own name (``register_module_forward_hook(scale)``)."""
    return [
        f"`{register}({getattr(hook, '__qualname__', type(hook).__qualname__)})`"
        for table, register in _GLOBAL_TABLES
        for hook in getattr(_registry, table).values()
    ]


def any_global_hooks() -> bool:
    """Whether any of torch's global module hooks is registered now, asked by how many
    each table holds: compiled code that asks so is compiled anew when the count changes
    (torch.compile guards on it)."""
    return any(len(getattr(_registry, table)) > 0 for table, _ in _GLOBAL_TABLES)


def _stand_in_call(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    refuse: Callable[[str], Exception],
) -> Any:
    if not any_global_hooks():
        return nn.Module._call_impl(module, *args, **kwargs)  # type: ignore[no-untyped-call]
    if any(getattr(module, table, None) for table in _OWN_TABLES):
        raise refuse(
            f"torch's global module hooks ({', '.join(global_hooks())}) are registered, and "
            f"so are hooks on this `{type(module).__qualname__}` itself: it stands for the "
            "module it runs, which runs the global hooks as it is called, and torch runs a "
            "module's own hooks only together with the global ones, which would change its "
            "answer once more. Register the hook on the module it runs instead, or remove "
            "the global hooks while calling it"
        )
    return module.forward(*args, **kwargs)


stand_in_call: Callable[..., Any] = outside_compiled(_stand_in_call, recursive=False)
"""A call of ``module``, which stands for another module it runs (a model wrapped
whole, a row cache), without torch's global hooks: they run with the module it stands
for, when that runs, and a recalled answer was computed with them (they are in its key);
run on the stand-in too, a hook that changes what a module answers would change it once
more. Hooks registered on the stand-in itself run as torch runs them, where no global
hook is registered; with one registered, the call is refused (``refuse`` makes the
error from what it says): torch runs both kinds together or neither.

It looks at the hooks eagerly in a compiled call too (what it calls is compiled): a look
compiled in would keep what it saw when compiled where torch.compile does not guard on
it (the hooks of the stand-in itself), so that a hook registered later would run on the
stand-in as well, or not be refused."""


_UNWATCHED = _TORCH_OWN | {"train"}
"""What the watch passes over: torch's own tables, and the stand-in for ``train`` that
holds a frozen module in eval (put there and taken away by freezing, not a setting)."""

_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks")


_PLACE = torch.Tensor.data_ptr
"""Where a tensor's memory is: ``t.data = ...`` moves it."""

_INFERENCE = torch.Tensor.is_inference

_COUNT = operator.attrgetter("_version")
"""A tensor's version counter, which a write in place moves (but in one made under
``torch.inference_mode``, which keeps none)."""


def _items(value: list[Any] | dict[Any, Any] | set[Any]) -> tuple[Any, ...]:
    """A list's or set's items, or a dict's keys and values, held (so that none is freed and its
    address taken by another)."""
    return (*value, *value.values()) if isinstance(value, dict) else tuple(value)


_VERSIONED_FROM = 16
"""How many items a plain dict holds from which the watch looks at its version (where it
can be read) in place of its items."""


def _versioned(container: Any) -> bool:
    """Whether the watch looks at ``container`` by its version: a plain dict of many items."""
    return (
        type(container) is dict and _dict_version is not None and len(container) >= _VERSIONED_FROM
    )


def _contents(sequences: list[Any], tables: list[dict[Any, Any]]) -> Iterator[Any]:
    """The items of each list and set of ``sequences``, then the keys and the values of
    each dict of ``tables``, one after the other: looked at by identity, with each one's
    length, in a single pass (the items of 50,000 small lists held in a table)."""
    return itertools.chain(
        itertools.chain.from_iterable(sequences),
        itertools.chain.from_iterable(tables),
        itertools.chain.from_iterable(map(dict.values, tables)),
    )


_NUMERIC = frozenset("biufc")
"""The kinds of numpy array a key names by its bytes (bools, integers, floats, complex
numbers); others (strings, objects, dates) it does not name."""


def _made_of(function: types.FunctionType) -> tuple[Any, ...]:
    """What a function computes with, held to be looked at by identity: its code, its
    defaults, each keyword-only default, and what each cell it closes over holds (the cell
    itself where it is not filled yet), so that ``f.__defaults__ = ...``, a keyword default
    replaced or a closed-over value rebound is seen."""
    keywords = function.__kwdefaults__ or {}
    cells = tuple(_cell_of(cell) for cell in function.__closure__ or ())
    return (function.__code__, function.__defaults__, *keywords, *keywords.values(), *cells)


def _cell_of(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # not filled yet
        return cell


def _dict_versions() -> Callable[[dict[Any, Any]], int] | None:
    """What reads a dict's version (PEP 509's ``ma_version_tag``, which CPython keeps
    beside each dict and moves, from a counter of the whole interpreter, at every change
    to it: an item set, replaced or deleted, the dict cleared), or None where it cannot be
    read soundly. Python gives it no name, so it is read at its place in the dict's
    memory, after the object's header and the count of its items; it is used only on
    CPython 3.10 to 3.12 (3.13 changed how an object's attributes and the dict made of
    them are kept, and no probe here covers that; 3.14 keeps no version), with the GIL,
    where a probe finds the count at its place and the version moving at each kind of
    change. Other Pythons look at every item."""
    if sys.implementation.name != "cpython" or not (3, 10) <= sys.version_info[:2] <= (3, 12):
        return None
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    import ctypes

    used_at = object.__basicsize__  # `ma_used` follows the object's header
    version_at = used_at + ctypes.sizeof(ctypes.c_ssize_t)

    def used(table: dict[Any, Any]) -> int:
        return int(ctypes.c_ssize_t.from_address(id(table) + used_at).value)

    def version(table: dict[Any, Any]) -> int:
        return int(ctypes.c_uint64.from_address(id(table) + version_at).value)

    probe: dict[Any, Any] = {}
    steps: list[Callable[[], Any]] = [
        lambda: probe.__setitem__("a", 1),
        lambda: probe.__setitem__("a", 1.0),  # an equal value, another object
        lambda: probe.update(b=2, c=3),
        lambda: probe.pop("a"),
        lambda: probe.__delitem__("b"),
        lambda: probe.setdefault("d", 4),
        lambda: probe.popitem(),
        lambda: probe.__ior__({"e": 5}),
        lambda: probe.clear(),
    ]
    seen = [version(probe)]
    for step in steps:
        step()
        if used(probe) != len(probe):
            return None
        seen.append(version(probe))
    if len(set(seen)) != len(seen) or version(probe) != seen[-1]:
        return None
    return version


_dict_version = _dict_versions()


def _same_items(now: tuple[Any, ...], was: tuple[Any, ...]) -> bool:
    return len(now) == len(was) and all(map(operator.is_, now, was))


def hooks_of(module: nn.Module) -> dict[str, Any]:
    """The forward hooks and pre-hooks that run with each submodule, by dotted name
    (``"."`` for the module itself; torch's global ones under ``"*"``), in the order
    they run. A hook can change what the module answers, so each is named by its code:
    its qualified name and a digest of its bytecode (a bound method's or a callable
    object's by its class and the method it runs). The values a hook closes over,
    is given or keeps are not seen: a hook that counts or captures would change the
    key as it goes. A model made by :func:`somatize.torch.wrap` runs its own hooks around
    those of the model it wraps (:func:`stood_for`): named together, in that order."""
    out: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        inner = stood_for(sub)
        around = [sub] if inner is sub else [sub, inner]  # the outermost first
        found = _hooks(
            [hook for one in around for hook in one._forward_pre_hooks.values()],
            [hook for one in reversed(around) for hook in one._forward_hooks.values()],
        )
        if found:
            out[prefix or "."] = found
    everywhere = _hooks(
        list(_registry._global_forward_pre_hooks.values()),
        list(_registry._global_forward_hooks.values()),
    )
    if everywhere:
        out["*"] = everywhere
    return out


def _hooks(pre: list[Any], post: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if pre:
        found["pre"] = [_code_of(hook) for hook in pre]
    if post:
        found["post"] = [_code_of(hook) for hook in post]
    return found


def _code_of(hook: Any, depth: int = 0) -> Any:
    """What names a hook's code: a function's qualified name and bytecode digest; a
    ``functools.partial``, bound method or callable object by the function it runs."""
    if depth > 3:
        return "?"
    if isinstance(hook, functools.partial):
        return {"partial": _code_of(hook.func, depth + 1)}
    if isinstance(hook, types.MethodType):
        kind = type(hook.__self__)
        return {"method of": _name_of(kind), "runs": _code_of(hook.__func__, depth + 1)}
    code = getattr(hook, "__code__", None)
    if isinstance(code, types.CodeType):
        return [_name_of(hook), "sha256:" + code_digest(code).hex()[:16]]
    kind = type(hook)
    call = next((vars(base)["__call__"] for base in kind.__mro__ if "__call__" in vars(base)), None)
    runs = _code_of(call, depth + 1) if isinstance(call, types.FunctionType) else "?"
    return {"object": _name_of(kind), "runs": runs}


def _name_of(thing: Any) -> str:
    module = getattr(thing, "__module__", "?")
    if isinstance(module, str) and hasattr(thing, "__qualname__"):
        return qualified(thing)  # a script's as `__main__` where spawned too
    return f"{module}:{getattr(thing, '__qualname__', '?')}"  # a builtin of no module (None)


_UNSEEN = object()
"""What :func:`_setting` says of a value it cannot name the same way in every process."""

Path = tuple[int, ...]
"""The containers a value is held in, outermost first, by ``id``: one met again inside
itself is named by where it refers back to, not followed for ever."""


def _setting(value: Any, path: Path) -> Any:
    """What names ``value`` in a key. Plain values are themselves, a list a list and a tuple
    a tuple of what names their items (the canonical form tells the two apart); every
    other kind is a dict that says what kind it is (``{"enum": ...}``, ``{"dict": ...}``),
    so that no two kinds a forward can tell apart are named alike: a member of an enum
    and the string of its name, a dtype and its string, a dict and an ``OrderedDict``."""
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        if value.name is None:  # flags holding bits no member names: by what they hold
            return {"enum": [_name_of(type(value)), None], "value": _item(value._value_, path)}
        return {"enum": [_name_of(type(value)), value.name]}
    if isinstance(value, pathlib.PurePath):
        return {"path": [_name_of(type(value)), str(value)]}
    numpy = sys.modules.get("numpy")  # not imported: nothing held is one of its values
    if numpy is not None and isinstance(value, (numpy.generic, numpy.ndarray)):
        return _numpy_setting(numpy, value, path)  # numpy's float64 too, a float subclass
    # Subclasses (a str subclass, an int one) as the plain values they are.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, bytearray):
        return {"bytearray": bytes(value)}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    if isinstance(value, fractions.Fraction):
        return {"fraction": [value.numerator, value.denominator]}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}  # exact: its digits and exponent
    if isinstance(value, range):
        return {"range": [value.start, value.stop, value.step]}
    if isinstance(value, slice):  # the features a forward keeps, `x[..., self.keep]`
        return {"slice": [_item(part, path) for part in (value.start, value.stop, value.step)]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, nn.Parameter):
        # A parameter is state, digested with the others (an RNN keeps its own in a list,
        # `_flat_weights`): named here too, it would key the module by its weights twice,
        # and a module rebuilt from its class, before its weights are loaded, otherwise.
        return _UNSEEN
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor:
            return _subclass_setting(value, path)
        return {"tensor": digest_tensor(value)}
    if isinstance(value, (tuple, list, dict, set, frozenset)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        if id(value) in path:
            return {"cycle": len(path) - path.index(id(value))}
        return _container(value, (*path, id(value)))
    if _config(value) or _slots_of(value):
        if id(value) in path:
            return {"cycle": len(path) - path.index(id(value))}
        return _object(value, (*path, id(value)))
    return _callable(value, path)


def _bound_to_config(method: types.MethodType) -> bool:
    """Whether ``method`` is bound to a config (:func:`_config`, or an object whose class
    declares ``__slots__``): one a module keeps (``self.act = scaler.apply``) reads it as
    its forward would read it held."""
    owner = method.__self__
    return _config(owner) or bool(_slots_of(owner))


def _config(value: Any) -> bool:
    """Whether ``value`` is a plain object a forward may read values of (a config, a
    ``SimpleNamespace``): as :mod:`somatize_torch._values` follows them."""
    from somatize_torch._values import _followed  # it imports this module

    return _followed(value)


def _object(value: Any, path: Path) -> Any:
    """A plain object (a config) by its class and what names each of its own attributes
    (``self.config.output_hidden_states``): one that cannot be named is named by its type,
    as a container's item is. What its class gives (a class attribute, a property) is
    read through its code, not named here."""
    held = _held_by(value)
    attributes = {k: _item(v, path) for k, v in list(held.items()) if isinstance(k, str)}
    return {"object": _name_of(type(value)), "attributes": attributes}


def _held_by(value: Any) -> dict[str, Any]:
    """What a config holds: its ``__dict__``, and the slots its class declares that are
    set (a class with ``__slots__``), by name."""
    try:
        held = dict(object.__getattribute__(value, "__dict__"))
    except AttributeError:
        held = {}
    return {**held, **_slots_of(value)}


def _slots_of(value: Any, *, part: bool = False) -> dict[str, Any]:
    """The slots that ``value``, an object of a class written in Python that declares
    ``__slots__`` (not torch's, numpy's or the standard library's), holds set, by name;
    empty for any other. A module's only where ``part`` (one of the module keyed)."""
    out: dict[str, Any] = {}
    for member in _members(value, part=part):
        got = _slot(member, value)
        if got is not _UNSET:
            out[member.__name__] = got
    return out


def _members(value: Any, *, part: bool = False) -> list[Any]:
    """The slots ``value``'s class declares (its ``__slots__``'s descriptors), if it is a
    class written in Python and not torch's, numpy's or the standard library's (a
    module's only where ``part``: one of the module keyed, not one a config holds)."""
    from somatize_torch._values import _NOT_FOLLOWED  # it imports this module

    kind = type(value)
    if not hasattr(kind, "__slots__") or isinstance(value, (torch.Tensor, type)):
        return []
    if isinstance(value, nn.Module) is not part:
        return []
    home = kind.__module__.split(".")[0]
    if home in _NOT_FOLLOWED or standard_module(home):
        return []
    found: dict[str, Any] = {}
    for base in reversed(kind.__mro__):
        for name, member in list(vars(base).items()):
            if isinstance(member, types.MemberDescriptorType):
                found.setdefault(name, member)
    return list(found.values())


_UNSET = object()
"""What a slot not set holds, for :func:`_slot`."""


def _slot(member: Any, value: Any) -> Any:
    try:
        return member.__get__(value, type(value))
    except AttributeError:  # not set
        return _UNSET


def _item(value: Any, path: Path) -> Any:
    """What names an item held in a container: a value that cannot be named is named by
    its type, so that the container, its length and its other items still key the
    module (dropped, a change beside it would go unseen)."""
    seen = _setting(value, path)
    return {"unseen": _name_of(type(value))} if seen is _UNSEEN else seen


def _container(value: Any, path: Path) -> Any:
    """A list, tuple, dict, set or dataclass instance (its fields, and any other attribute
    it holds) by what names its items. A dict is
    named by its entries, whatever their keys (``{0: 1.0}``, ``{(1, 2): ...}``), each
    key named as a value is, in the order of their canonical encodings, with the order it
    was filled in where that differs (:func:`_dict_setting`); a set by its items in that order,
    which is the same in every process (the order of their hashes is not). A subclass (a
    namedtuple, an ``OrderedDict``) says its class too."""
    kind = type(value)
    if dataclasses.is_dataclass(value):
        fields = {f.name: _item(getattr(value, f.name), path) for f in dataclasses.fields(value)}
        kept: dict[str, Any] = {"dataclass": _name_of(kind), "fields": fields}
        # An attribute it holds that is no field (`config.flag = True` set on it later)
        # keys it too, as a config's attributes do; none, and it is named as before.
        try:
            held = object.__getattribute__(value, "__dict__")
        except AttributeError:  # slots: its fields are all it holds
            held = {}
        extra = {k: _item(v, path) for k, v in list(held.items()) if isinstance(k, str)}
        for name in fields:
            extra.pop(name, None)
        if extra:
            kept["attributes"] = extra
        return kept
    named: dict[str, Any]
    plain: type
    if isinstance(value, dict):
        named, plain = _dict_setting(value, path), dict
    elif isinstance(value, (set, frozenset)):
        plain = frozenset if isinstance(value, frozenset) else set
        named = {
            plain.__name__: sorted((_item(item, path) for item in value), key=canonical.encode)
        }
    else:
        items = [_item(item, path) for item in value]
        if kind is list:
            return items
        if kind is tuple:
            return tuple(items)
        plain = tuple if isinstance(value, tuple) else list
        named = {plain.__name__: items}
    if kind is not plain:
        named["class"] = _name_of(kind)
    return named


def _dict_setting(value: dict[Any, Any], path: Path) -> dict[str, Any]:
    """A dict by its entries in the order of their canonical encodings, so that every
    process names it alike, and, where it was filled in another order, by that order too
    (each entry's place among the sorted ones): a forward reading its values in turn
    (``torch.cat([h * w for w in self.weights.values()])``) answers otherwise for the
    same entries in another order. One filled in sorted order is named as it always was."""
    entries = [[_item(k, path), _item(v, path)] for k, v in value.items()]
    places = sorted(range(len(entries)), key=lambda at: _order(entries[at]))
    named: dict[str, Any] = {"dict": [entries[at] for at in places]}
    if places != sorted(places):
        named["filled"] = places
    return named


def _bound_by(function: types.FunctionType, path: Path, helpers: bool = True) -> dict[str, Any]:
    """What a function computes with beside its code: its default values, its keyword-only
    ones, and the values it closes over, by the name of each (``lambda t: t * k`` made by
    a factory with another ``k``, or with ``k`` rebound since), each named as a value a
    module keeps is; a cell not filled yet as ``{"empty": True}``; and the globals it
    reads (:func:`_globals_of`). Nothing for a function that has none, which is named as
    it was. A function it reads whose globals are named in turn (a helper of its module)
    is named there by its code, defaults and what it closes over, and with ``helpers``,
    each function so reached, however far, is named once in full beside (``"helpers"``,
    in the order of their canonical encodings, the same in every process): whatever the
    ways between them (helpers calling each other), each is named once."""
    named = _own_of(function, path)
    read = {}
    for name, value in _globals_of(function).items():
        if _helper(value):
            read[name] = {"function": _code_of(value), **_own_of(value, path)}
            continue
        seen = _setting(value, path)
        if seen is not _UNSEEN:
            read[name] = seen
    if read:  # only then, so a function that reads none is named as it was
        named["globals"] = read
    if helpers:
        reached = _helpers_of(function)
        if reached:
            full = ({"function": _code_of(one), **_bound_by(one, path, False)} for one in reached)
            named["helpers"] = sorted(full, key=canonical.encode)
    return named


def _own_of(function: types.FunctionType, path: Path) -> dict[str, Any]:
    """A function's default values, keyword-only ones and what it closes over, named (see
    :func:`_bound_by`)."""
    named: dict[str, Any] = {}
    if function.__defaults__:
        named["defaults"] = [_item(value, path) for value in function.__defaults__]
    if function.__kwdefaults__:
        keywords = sorted(function.__kwdefaults__.items())
        named["keywords"] = {name: _item(value, path) for name, value in keywords}
    if function.__closure__:
        closes: dict[str, Any] = {}
        cells = zip(function.__code__.co_freevars, function.__closure__, strict=False)
        for name, cell in cells:
            try:
                closes[name] = _item(cell.cell_contents, path)
            except ValueError:  # not filled yet
                closes[name] = {"empty": True}
        named["closes"] = closes
    return named


def _helper(value: Any) -> bool:
    """Whether ``value``, read as a global, is a function whose globals are named in turn."""
    return isinstance(value, types.FunctionType) and not _library(value)


def _helpers_of(function: types.FunctionType) -> list[types.FunctionType]:
    """The functions ``function`` reads as globals whose globals are named in turn, and
    those they read, however far, each once (``function`` itself too, if it is reached)."""
    found: dict[int, types.FunctionType] = {}
    todo = [function]
    while todo:
        for value in _globals_of(todo.pop()).values():
            if _helper(value) and id(value) not in found:
                found[id(value)] = value
                todo.append(value)
    return list(found.values())


def _globals_of(function: types.FunctionType) -> dict[str, Any]:
    """The globals ``function`` reads, by name, but modules: values (``SCALE = 2.0``, a
    list, a config, a tensor) and the functions, classes and built-ins a name is bound to
    (``ACT = torch.tanh``, a ``functools.partial``, a helper of its module, whose globals
    are named in turn), so that a name rebound to another keys its answers anew. A
    function of torch's, numpy's, the standard library's or an installed package's reads
    none that is named (:func:`_library`): what it runs is its own, named by its code."""
    if _library(function):
        return {}
    table = function.__globals__
    return {
        name: table[name]
        for name in sorted(globals_read(function.__code__))
        if name in table and not isinstance(table[name], types.ModuleType)
    }


def _library(function: types.FunctionType) -> bool:
    """Whether ``function`` is torch's, numpy's or the standard library's own, or an
    installed package's (its code in ``site-packages``): one whose module's values (a
    cache it fills as it runs) are that package's, not the caller's settings."""
    from somatize_torch._values import _NOT_FOLLOWED  # it imports this module

    home = str(function.__globals__.get("__name__") or "").split(".")[0]
    if home in _NOT_FOLLOWED or standard_module(home):
        return True
    return not _INSTALLED.isdisjoint(pathlib.PurePath(function.__code__.co_filename).parts)


_INSTALLED = frozenset({"site-packages", "dist-packages"})
"""Where installed packages' code lives."""


def _order(entry: list[Any]) -> bytes:
    """Where a dict's entry goes among its others: by its key's canonical encoding, which is
    the same in every process (a hash is not)."""
    return canonical.encode(entry[0])


def _subclass_setting(value: torch.Tensor, path: Path) -> Any:
    """A tensor of a subclass of ``torch.Tensor``, named by its class as well as its
    values, since a forward may answer one class otherwise than another holding the same
    values (boxes in one convention or another), and by the attributes it keeps, each
    named as a dataclass's fields are. A wrapper subclass, whose values live in the
    tensors it holds (those ``__tensor_flatten__`` names), is named by those."""
    flatten = getattr(value, "__tensor_flatten__", None)
    inner, context = flatten() if callable(flatten) else ((), None)
    held = {k: _item(v, path) for k, v in vars(value).items() if k not in inner}
    named: dict[str, Any] = {"tensor of": _name_of(type(value)), "attributes": held}
    if callable(flatten):
        named["dtype"], named["shape"] = str(value.dtype), list(value.shape)
        named["inner"] = {name: _item(getattr(value, name), path) for name in inner}
        named["context"] = _item(context, path)
    else:
        named["values"] = digest_tensor(value.as_subclass(torch.Tensor))
    return named


def _numpy_setting(numpy: Any, value: Any, path: Path) -> Any:
    """A numpy scalar as the plain value it holds and its numpy type (``np.float32(0.1)``
    is no ``float``, and Python's arithmetic with it is float32's: ``np.float32(0.1) * 3``
    is not ``0.1 * 3``, nor ``~np.bool_(True)`` ``~True``), a ``datetime64`` or
    ``timedelta64`` as its count of units (its type names the unit), a numeric array by
    its dtype and its digest as a tensor (one in another byte order turned to this
    machine's first, as torch holds none other); unseen for anything else."""
    if isinstance(value, numpy.generic):
        if isinstance(value, (numpy.datetime64, numpy.timedelta64)):
            # Its Python value is a date, a time, an int or None, by its unit.
            return {"numpy": [value.dtype.name, int(value.astype(numpy.int64))]}
        plain = value.item()
        seen = _UNSEEN if isinstance(plain, numpy.generic) else _setting(plain, path)
        return _UNSEEN if seen is _UNSEEN else {"numpy": [value.dtype.name, seen]}
    array = numpy.ascontiguousarray(value)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        tensor = torch.from_numpy(array)
    except (TypeError, ValueError):  # strings, objects: no tensor holds them
        return _UNSEEN
    return {"array": [value.dtype.str, digest_tensor(tensor)]}


def _callable(value: Any, path: Path) -> Any:
    """A function, class or built-in a module holds, named as what it runs (unseen for
    anything else): a function swapped for another keys the module's answers anew."""
    if isinstance(value, type):
        return {"class": _name_of(value)}
    if isinstance(value, functools.partial):
        return {
            "partial": _item(value.func, path),
            "args": [_item(arg, path) for arg in value.args],
            "keywords": {k: _item(v, path) for k, v in value.keywords.items()},
        }
    if isinstance(value, types.FunctionType):
        if id(value) in path:  # a function that closes over itself
            return {"cycle": len(path) - path.index(id(value))}
        return {"function": _code_of(value), **_bound_by(value, (*path, id(value)))}
    if isinstance(value, types.MethodType):
        if not _bound_to_config(value):
            return {"function": _code_of(value)}
        # Bound to a config (`self.act = scaler.apply`): named as the function it runs and
        # the config, which it reads as a forward reads one the module holds.
        return {"method": _item(value.__func__, path), "of": _item(value.__self__, path)}
    if isinstance(value, types.BuiltinFunctionType):
        owner = value.__self__
        if owner is None or isinstance(owner, (type, types.ModuleType)):
            return {"builtin": _name_of(value)}
        return {  # a tensor's method: which tensor, too
            "builtin": f"{_name_of(type(owner))}.{value.__name__}",
            "of": _item(owner, path),
        }
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return {"builtin": f"{_name_of(value.__objclass__)}.{value.__name__}"}
    return _UNSEEN
