"""How FSDP holds the parameters of a module it shards, as a frozen module's watch sees them.

FSDP puts tensors of its own in the place of a module's parameters for each forward, so
the watch of a frozen, cached module meets them there:

- FSDP1 (``FullyShardedDataParallel(..., use_orig_params=True)``) puts in views of its
  flat parameter, new tensors at each forward, and puts its original parameters back
  after it: :class:`Originals` tells the original each view stands for, so a watch sees
  the same weights in it, and their changes on the original (``load_state_dict``, a
  write in place between forwards), whose version counter FSDP leaves alone. Where the
  flat parameter holds trainable parameters beside frozen ones (a head in the same unit
  as the encoder), every view requires grad, a frozen one's too, though FSDP drops the
  gradient that reaches it: :meth:`Originals.frozen` tells such a view, which is frozen
  for all that trains through it.
- FSDP2 (``fully_shard``) gathers each parameter's values from its shard into the same
  parameter at each forward, and puts back the version counter it had, so a change of
  the values (``load_state_dict`` on the sharded model) shows nowhere on it: it shows on
  the sharded parameter, which :func:`sharded_sources` finds.

Both look at FSDP's own records, imported only where FSDP is in use: nothing is sharded
where it never was.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["Originals", "is_dtensor", "sharded_sources", "sources_changed"]


class Originals:
    """The original parameters FSDP1 (``use_orig_params=True``) keeps, by the module and
    name each is the parameter of, looked up for the views it puts in their place: each
    flat parameter's table made once, so that looking up all of a module's views costs
    as many lookups, not as many walks of the flat parameter's records."""

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        self._tables: dict[int, tuple[torch.Tensor, dict[tuple[int, str], torch.Tensor]]] = {}

    def of(self, owner: nn.Module, name: str, tensor: Any) -> torch.Tensor | None:
        """The original parameter that ``tensor``, in the place of ``owner``'s parameter
        ``name``, is a view of, cut from FSDP1's flat parameter for a forward; None where
        it is no such view."""
        flat = _flat_of(tensor)
        if flat is None:
            return None
        table = self._tables.get(id(flat))
        if table is None or table[0] is not flat:
            table = self._tables[id(flat)] = (flat, _originals_in(flat))
        return table[1].get((id(owner), name))

    def frozen(self, module: nn.Module, name: str, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``, in the place of ``module``'s parameter ``name`` (dotted), is a
        view FSDP1 cut from its flat parameter for a forward, of an original parameter left
        frozen."""
        if _flat_of(tensor) is None:  # no view: most models, TorchScript ones too
            return False
        path, _, local = name.rpartition(".")
        original = self.of(module.get_submodule(path), local, tensor)
        return original is not None and not original.requires_grad


def _flat_of(tensor: Any) -> torch.Tensor | None:
    """The flat parameter of FSDP1 (``use_orig_params=True``) that ``tensor`` is a view
    of, put in an original parameter's place for a forward; None where it is none."""
    fsdp = sys.modules.get("torch.distributed.fsdp._flat_param")
    if fsdp is None or not isinstance(tensor, torch.Tensor) or isinstance(tensor, nn.Parameter):
        return None
    flat = tensor._base
    if not isinstance(flat, fsdp.FlatParameter) or flat._params is None:
        return None  # use_orig_params=False: no original is kept, nor put back
    return tensor._base  # as torch types it: FSDP's class is looked up where it is in use


def _originals_in(flat: Any) -> dict[tuple[int, str], torch.Tensor]:
    """The original parameters a flat parameter holds (those shared by several modules
    too), by the id of the module each is a parameter of and its name there."""
    originals = zip(flat._param_infos, flat._params, strict=True)
    shared = zip(flat._shared_param_infos, flat._shared_params, strict=True)
    return {
        (id(info.module), info.param_name): original
        for info, original in itertools.chain(originals, shared)
    }


def sharded_sources(parts: Iterable[nn.Module]) -> tuple[tuple[Any, torch.Tensor, int], ...]:
    """For each parameter of ``parts`` that FSDP2 shards: FSDP's record of it, the sharded
    parameter its values are gathered from, and that one's version counter, to be looked
    at again by :func:`sources_changed`."""
    composable = sys.modules.get("torch.distributed._composable_state")
    fsdp = _loaded(_FSDP2_STATES)
    if composable is None or fsdp is None:
        return ()
    ids = set(map(id, parts))
    found = []
    for held in list(composable._module_state_mapping.values()):
        # torch 2.4 holds each state itself, a later torch a weak reference to it
        state = held() if isinstance(held, weakref.ref) else held
        if not isinstance(state, fsdp.FSDPState):
            continue
        for param in _sharded_params(state):
            info = param._module_info
            if any(id(owner) in ids for owner in (info.module, *info.shared_modules)):
                found.append((param, param.sharded_param, param.sharded_param._version))
    return tuple(found)


def sources_changed(sources: tuple[tuple[Any, torch.Tensor, int], ...]) -> bool:
    """Whether a sharded parameter :func:`sharded_sources` found changed in place or was
    replaced (``load_state_dict(..., assign=True)``) since."""
    return any(
        param.sharded_param is not sharded or sharded._version != version
        for param, sharded, version in sources
    )


_FSDP2_STATES = (
    "torch.distributed.fsdp._fully_shard._fsdp_state",
    "torch.distributed._composable.fsdp._fsdp_state",
)
"""Where FSDP2 writes its state: the first from torch 2.6 on, the second before."""

_DTENSORS = ("torch.distributed.tensor", "torch.distributed._tensor")
"""Where ``DTensor`` is written: the first from torch 2.5 on, the second before (torch 2.4
has a ``torch.distributed.tensor`` without it)."""


def _loaded(names: tuple[str, ...], holding: str | None = None) -> Any:
    """The first module of ``names`` that is loaded (and holds ``holding``, where named):
    a module not yet imported holds nothing in use."""
    for name in names:
        module = sys.modules.get(name)
        if module is not None and (holding is None or hasattr(module, holding)):
            return module
    return None


def is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a ``DTensor``, as FSDP2 (``fully_shard``) holds a parameter
    between forwards: this rank's shard of it."""
    distributed = _loaded(_DTENSORS, holding="DTensor")
    return distributed is not None and isinstance(tensor, distributed.DTensor)


def _sharded_params(state: Any) -> list[Any]:
    """The records of the parameters an FSDP2 state shards (its groups', in a torch that
    groups them, or its one group's)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return [param for group in groups for param in group.fsdp_params]
