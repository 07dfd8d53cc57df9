"""A module's state: what it is digested as, and how to tell cheaply that it changed.

A module's state is its parameters and its buffers, persistent or not, by name
(BatchNorm running statistics change what it computes as much as its weights do).
:func:`digest_state` is :func:`somatize_torch.digest.digest_named` over the tensors by
name: each tensor's bytes digested where it lives, combined under a canonical header
of names (sorted), dtypes and shapes — the same tensors give the same digest in any
process, whatever order they were registered in and whatever device holds them. It is
never the digest of a serialised file, since a serialiser may write equal tensors in
more than one way.

Digesting reads every byte of the state. :class:`StateWatch` is what is asked at every
forward instead: it looks only at what torch keeps beside each tensor, so the state
is digested again only when it may have changed. :mod:`somatize_torch.freeze`, which
settles a frozen module at this digest, re-exports both.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from somatize_torch.digest import digest_named

__all__ = ["StateWatch", "digest_state"]


def _state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """A module's parameters and buffers (persistent or not), by name: its state."""
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    for name, buffer in module.named_buffers():
        tensors[name] = buffer
    return tensors


def digest_state(module: nn.Module) -> str:
    """``blake3:<hex>`` of a module's parameters and buffers (persistent or not), by name."""
    return digest_named(_state_tensors(module), "state")


class StateWatch:
    """Whether a module's state may have changed since it was digested, cheaply enough to
    ask at every forward: each parameter, buffer and submodule is looked at by identity
    (a tensor or child replaced: a checkpoint loaded by assignment, ``encoder[0] =
    conv``), each tensor by its version counter (bumped by every change in place:
    ``load_state_dict``, an optimizer step), each parameter by whether it requires grad
    (somebody unfroze it), and each table by its length (a tensor or submodule added or
    removed). ``thorough`` also looks at each tensor's memory (``p.data = t``, a
    conversion of the module). A
    write that bypasses the version counter — into ``p.data``, or by a fused optimizer
    kernel — is not seen here; only digesting the state again sees it."""

    __slots__ = (
        "_grads",
        "_names",
        "_owners",
        "_params",
        "_sizes",
        "_tables",
        "_tensors",
        "_values",
        "_versions",
        "_where",
    )

    def __init__(self, module: nn.Module) -> None:
        tables: list[dict[str, Any]] = []
        owners: list[dict[str, Any]] = []
        names: list[str] = []
        values: list[Any] = []
        for part in module.modules():
            for table in (part._parameters, part._buffers, part._modules):
                tables.append(table)
                for name, value in table.items():
                    owners.append(table)
                    names.append(name)
                    values.append(value)
        self._tables = tables
        self._sizes = tuple(map(len, tables))
        self._owners = owners
        self._names = names
        self._values = values
        self._tensors = [value for value in values if isinstance(value, torch.Tensor)]
        self._params = [t for t in self._tensors if isinstance(t, nn.Parameter)]
        self._versions = tuple(map(_VERSION, self._tensors))
        self._where = tuple(map(_WHERE, self._tensors))
        self._grads = tuple(map(_GRAD, self._params))

    def changed(self, thorough: bool = False) -> bool:
        """Whether a weight, buffer or submodule changed, was replaced, added or removed,
        or a parameter came to require grad (and, ``thorough``, whether a tensor's memory
        changed)."""
        return (
            tuple(map(_VERSION, self._tensors)) != self._versions
            or not all(map(operator.is_, map(dict.get, self._owners, self._names), self._values))
            or tuple(map(len, self._tables)) != self._sizes  # a part added (`enc.append(act)`)
            or tuple(map(_GRAD, self._params)) != self._grads
            or (thorough and tuple(map(_WHERE, self._tensors)) != self._where)
        )

    def unfrozen(self, module: nn.Module) -> list[str]:
        """The parameters of ``module`` watched here (frozen then) that now require grad."""
        watched = set(map(id, self._params))
        return [n for n, p in module.named_parameters() if p.requires_grad and id(p) in watched]


_VERSION = operator.attrgetter("_version")
_WHERE: Callable[[Any], int] = torch.Tensor.data_ptr
_GRAD = operator.attrgetter("requires_grad")
