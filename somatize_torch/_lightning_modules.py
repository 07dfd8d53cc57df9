"""The submodules the callback caches: found by name, checked, and put back when unfrozen.

:class:`~somatize_torch.lightning.CacheFrozen` is given dotted names
(``"encoder"``, ``"backbone.trunk"``), as ``named_modules()`` lists them, and
puts each module's cache at its attribute in its parent in ``setup()``, before the
strategy moves or wraps the model. :func:`locate` finds the parent and the attribute,
seeing through ``torch.compile`` wrappers on the way (:func:`unwrapped`), since a
model compiled whole still holds the encoder at the same path. :func:`find` says
what went wrong: a name a LightningModule makes in ``configure_model()`` (which
Lightning calls after the callbacks' ``setup()``) is not there yet, and a
submodule compiled itself cannot be cached row by row, since its rows would be
looked up inside the compiled graph (:class:`CompiledSubmodule`).

Caching freezes a module (a cached module runs without gradients), so
:func:`check_trainable` looks at what the fit would train first: naming all of it is
refused (a head named by mistake), and a named module whose parameters require grad
is warned of (:class:`FrozeTrainable`) unless a fine-tuning callback schedules it.

A cached module whose parameters come to require grad (a fine-tuning schedule
unfroze it) is put back by :func:`put_back`: released in the mode it would be in
without the callback, at its attribute again, and let go by every loader fetching
ahead for it, which would otherwise hold it and its memory tiers for the rest of
the run.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn

from somatize_torch._lightning_errors import (
    CacheFrozenError,
    CompiledSubmodule,
    FrozeTrainable,
    NotASubmodule,
)
from somatize_torch.ahead import Ahead
from somatize_torch.freeze import few, release
from somatize_torch.rows import CachedRows

__all__ = ["check_trainable", "find", "locate", "put_back", "unwrapped"]


def unwrapped(module: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper stands for (the module itself otherwise)."""
    inner = module._modules.get("_orig_mod")
    if inner is not None and type(module).__name__ == "OptimizedModule":
        return inner
    return module


def locate(root: nn.Module, name: str) -> tuple[nn.Module, str, nn.Module]:
    """The parent of submodule ``name``, its attribute there, and the submodule;
    compiled modules on the way are seen through to the modules they compile."""
    parent = root
    atoms = name.split(".")
    for depth, atom in enumerate(atoms):
        parent = unwrapped(parent)
        child = parent._modules.get(atom)
        if child is None:
            where = ".".join(atoms[:depth]) or "the LightningModule"
            known = ", ".join(f"`{n}`" for n in parent._modules) or "none"
            raise NotASubmodule(
                f"`{name}` names no submodule: {where} has no submodule `{atom}` (it has "
                f"{known}). Name the frozen submodule by its dotted attribute path, as "
                "`named_modules()` lists it"
            )
        if depth == len(atoms) - 1:
            return parent, atom, child
        parent = child
    raise AssertionError("unreachable: a name has at least one part")


def find(pl_module: pl.LightningModule, name: str) -> tuple[nn.Module, str, nn.Module]:
    """:func:`locate` in a LightningModule, for ``setup()``: a name not found says so
    for a module made in ``configure_model()``, and a compiled submodule is refused."""
    try:
        parent, attribute, found = locate(pl_module, name)
    except NotASubmodule as missing:
        if type(pl_module).configure_model is pl.LightningModule.configure_model:
            raise
        raise NotASubmodule(
            f"{missing} — this LightningModule makes modules in `configure_model()`, "
            "which Lightning calls after the callbacks' `setup()`, when they can no "
            "longer be put in place before the strategy wraps the model. Make the "
            "frozen encoder in `__init__`, or cache it yourself in `configure_model()` "
            "(`self.encoder = somatize.torch.cache_rows(encoder, store)`)"
        ) from None
    if type(found).__name__ == "OptimizedModule":
        raise CompiledSubmodule(
            f"`{name}` is compiled with torch.compile, and a compiled module cannot be "
            "cached row by row (its rows would be looked up inside the compiled "
            "graph). Compile the model or the head around it instead: the cached "
            f"`{name}` becomes a graph break and everything else compiles"
        )
    return parent, attribute, found


def check_trainable(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    stage: str,
    todo: list[tuple[str, nn.Module, str, nn.Module]],
) -> None:
    """Says so when a module about to be cached has parameters that require grad:
    caching freezes them, so they would not train as they do without the callback.
    Refused when they are all that fitting would train (a head named by mistake),
    warned otherwise (:class:`FrozeTrainable`) — unless a fine-tuning callback
    (``BaseFinetuning``) is there, which freezes what it schedules in its own
    ``setup`` and unfreezes it later (the module then runs uncached).

    Called by the callback's ``setup()`` itself, so that the warning points at what
    called that hook."""
    if stage != "fit":
        return  # nothing trains in validate, test or predict
    trainable = {
        name: [n for n, p in found.named_parameters() if p.requires_grad]
        for name, _, _, found in todo
    }
    trainable = {name: params for name, params in trainable.items() if params}
    if not trainable:
        return
    named = {id(p) for _, _, _, found in todo for p in found.parameters()}
    listed = "; ".join(f"`{name}`: {few(params)}" for name, params in trainable.items())
    if not any(p.requires_grad and id(p) not in named for p in pl_module.parameters()):
        raise CacheFrozenError(
            f"the modules named to be cached hold every parameter this LightningModule "
            f"trains ({listed}): caching freezes them (a cached module runs without "
            "gradients), so nothing would be left to train and the first backward would "
            "fail. Name only the frozen submodules whose answers stay the same (the "
            "encoder), not the part being trained (the head)"
        )
    if any(isinstance(c, BaseFinetuning) for c in getattr(trainer, "callbacks", ())):
        return
    warnings.warn(
        f"parameters of modules named to be cached require grad ({listed}): caching "
        "freezes them (requires_grad_(False), held in eval), so they do not train here "
        "as they would without this callback. If a module is meant to train, do not "
        "name it; if it is meant to stay frozen, freeze it before fitting "
        "(`requires_grad_(False)`) and this warning goes. A schedule that unfreezes it "
        "later gets it back uncached",
        FrozeTrainable,
        stacklevel=3,
    )


def put_back(
    pl_module: pl.LightningModule,
    name: str,
    cached: CachedRows,
    aheads: weakref.WeakSet[Ahead[Any]],
) -> None:
    """Puts the module ``cached`` holds back at ``name`` in ``pl_module``, as it was: its
    cache closed and forgotten, and dropped by the loaders in ``aheads``."""
    parent, attribute, _ = locate(pl_module, name)
    module = cached.module
    cached.when_unfrozen = None
    cached.close()
    # The loaders fetched ahead for it would hold it, and its memory tiers (GiBs), for
    # the rest of the run.
    for wrapper in aheads:
        wrapper.drop(cached)
    cached.forget()
    # In the mode asked of it while it was held in eval (`self.encoder.eval()` in a hook,
    # Lightning's `.train()`), which the cache recorded: the mode it would be in now
    # without this callback.
    release(module, cached.training)
    setattr(parent, attribute, module)
