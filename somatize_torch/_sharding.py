"""How FSDP holds the parameters of a module it shards, as a frozen module's watch sees them.

FSDP puts tensors of its own in the place of a module's parameters for each forward, so
the watch of a frozen, cached module meets them there:

- FSDP1 (``FullyShardedDataParallel(..., use_orig_params=True)``) puts in views of its
  flat parameter. Where the flat parameter holds trainable parameters beside frozen ones
  (a head in the same unit as the encoder), every view requires grad, a frozen one's
  too, though FSDP drops the gradient that reaches it: :func:`sharded_frozen` tells
  such a view, which is frozen for all that trains through it.
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
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["sharded_frozen", "sharded_sources", "sources_changed"]


def sharded_frozen(module: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Whether ``tensor``, in the place of ``module``'s parameter ``name``, is a view FSDP1
    cut from its flat parameter for a forward, of an original parameter left frozen."""
    flat = tensor._base
    fsdp = sys.modules.get("torch.distributed.fsdp._flat_param")
    if fsdp is None or isinstance(tensor, nn.Parameter) or not isinstance(flat, fsdp.FlatParameter):
        return False
    if flat._params is None:  # use_orig_params=False: its views are all frozen, or all trained
        return False
    path, _, local = name.rpartition(".")
    owner = module.get_submodule(path)
    originals = zip(flat._param_infos, flat._params, strict=True)
    shared = zip(flat._shared_param_infos, flat._shared_params, strict=True)
    return any(
        info.module is owner and info.param_name == local and not original.requires_grad
        for info, original in itertools.chain(originals, shared)
    )


def sharded_sources(parts: Iterable[nn.Module]) -> tuple[tuple[Any, torch.Tensor, int], ...]:
    """For each parameter of ``parts`` that FSDP2 shards: FSDP's record of it, the sharded
    parameter its values are gathered from, and that one's version counter, to be looked
    at again by :func:`sources_changed`."""
    composable = sys.modules.get("torch.distributed._composable_state")
    fsdp = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_state")
    if composable is None or fsdp is None:
        return ()
    ids = set(map(id, parts))
    found = []
    for ref in list(composable._module_state_mapping.values()):
        state = ref()
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


def _sharded_params(state: Any) -> list[Any]:
    """The records of the parameters an FSDP2 state shards (its groups', in a torch that
    groups them, or its one group's)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return [param for group in groups for param in group.fsdp_params]
