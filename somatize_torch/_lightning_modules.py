"""The submodules the callback caches: found by name, checked, cached in place, put back.

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
is warned of (:class:`FrozeTrainable`). In a LightningModule with a ``setup()`` of its
own, which Lightning runs after the callbacks' and which may freeze it there, such a
module is looked at and cached once that has run (:func:`waits_for_own_setup`,
:func:`after_own_setup`), still before the strategy moves or wraps the model. Under a
fine-tuning callback it looks at the module as that callback leaves it
(:func:`freeze_first`), and leaves uncached, with
a warning (:class:`Uncached`), one left to train or in train mode. Without one, the
mode it would run in is known only as it is called, after the LightningModule's own hooks
(``self.encoder.eval()`` at each batch's start) have asked theirs: a forward that finds it
would run in train mode with parts that compute otherwise there (BatchNorm, dropout) puts
it back uncached before it answers (:func:`left_in_train_mode`), with the same warning;
so does one handed a batch that requires grad (a trainable part upstream of it), whose
answers a recalled row would cut (:func:`handed_grad`).

What ``setup()`` found is recorded as it caches each module in place
(:func:`cache_in_place`, :class:`Found`): every place the module sits
(:func:`places_of`: a module shared under two names is cached under both, by one
cache), the mode of each of its parts and whether each parameter required grad.
When the stage ends the modules are put back as they were (:func:`put_back_all`,
:meth:`Found.put_back`), so the model the trainer hands back is the plain model:
traced, exported, saved or fitted again without the callback as if it had never been
cached. A module whose parameters come to require grad (a fine-tuning schedule
unfroze it) is put back the same way at once (:func:`uncache`; its parameters left
as the schedule set them), and its cache let go (:func:`let_go`) by every loader
fetching ahead for it, which would otherwise hold it and its memory tiers for the
rest of the run.

A module that runs uncached — put back, replaced, or left uncached at ``setup()`` —
is still called as its cache would be: with a batch of
:class:`~somatize_torch.deferred.DeferredRows` (from a ``Deferred`` dataset) and
``index=`` (for index keys). While the stage runs it loads such a batch and drops
``index`` itself (:func:`pass_through`, a forward pre-hook, removed when the stage
ends), so it trains exactly as without the callback on the inputs themselves.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.utils import parametrizations
from torch.nn.utils.spectral_norm import SpectralNorm

from somatize_torch._lightning_errors import (
    CacheFrozenError,
    CompiledSubmodule,
    FrozeTrainable,
    NotASubmodule,
    Uncached,
)
from somatize_torch._lightning_options import cached_twice
from somatize_torch._row_keys import _floating_dtypes, _run_in
from somatize_torch.ahead import Ahead
from somatize_torch.deferred import DeferredRows
from somatize_torch.freeze import AsFound, ModuleNode, asked_changes, few, refuse_scripted
from somatize_torch.rows import CachedRows, cache_rows, never_called
from somatize_torch.wrap import Wrapped

if TYPE_CHECKING:
    from somatize_torch.lightning import CacheFrozen

__all__ = [
    "Found",
    "after_own_setup",
    "cache_in_place",
    "cached_elsewhere",
    "check_trainable",
    "find",
    "fixed_by_wrap",
    "freeze_first",
    "handed_grad",
    "left_in_train_mode",
    "let_go",
    "locate",
    "nested",
    "nothing_left",
    "own_cache_put_back",
    "own_setup_restored",
    "pass_through",
    "places_of",
    "put_back_all",
    "replaced",
    "twins",
    "uncache",
    "unwrapped",
    "waits_for_own_setup",
]


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
        if depth:  # a TorchScript module's parts are in no dict to look them up in
            refuse_scripted(".".join(atoms[:depth]), parent, CacheFrozenError)
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
    for a module made in ``configure_model()``, and a compiled submodule is refused, as
    is a TorchScript one, or one holding one."""
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
    refuse_scripted(name, found, CacheFrozenError)
    if type(found).__name__ == "OptimizedModule":
        raise CompiledSubmodule(
            f"`{name}` is compiled with torch.compile, and a compiled module cannot be "
            "cached row by row (its rows would be looked up inside the compiled "
            "graph). Compile the model or the head around it instead: the cached "
            f"`{name}` becomes a graph break and everything else compiles"
        )
    if never_called(found):
        parts = ", ".join(f"`{name}.{part}`" for part in found._modules) or "none"
        raise CacheFrozenError(
            f"`{name}` is a `{type(found).__qualname__}` with no forward of its own: it is "
            "never called, only its parts are, and those would run uncached. Name each "
            f"part that is called instead (it holds {parts})"
        )
    return parent, attribute, found


def cached_elsewhere(name: str) -> CacheFrozenError:
    """The refusal of submodule ``name``, found cached per row by something other than
    the callback (``cache_rows`` in the LightningModule, another ``CacheFrozen``)."""
    return CacheFrozenError(
        f"`{name}` is cached per row already (a `CachedRows` made by `cache_rows` in the "
        "LightningModule, or by another CacheFrozen callback), with options of its own — "
        "store, key, version, salt, budgets: caching it here would leave this callback's "
        "or those unused. Cache it in one place only: name it to one callback, or put the "
        f"module itself back in place of its cache before fitting (`model.{name} = "
        f"model.{name}.module`)"
    )


def nested(
    pl_module: pl.LightningModule, todo: list[tuple[str, nn.Module]]
) -> CacheFrozenError | None:
    """The refusal of the modules ``todo`` (each with its name) where one sits inside
    another: inside one of the others, under a name that does not say so (`encoder` held
    as `backbone.0` too), or inside or around a module cached per row already (by
    ``cache_rows`` in the LightningModule, or by another CacheFrozen); None where none
    does. A cache around another would key its rows by the inner one, whose counts change
    at every call, and never recall them."""
    for name, found in todo:
        for other, outer in todo:
            if outer is not found:
                path = next((n for n, part in outer.named_modules() if part is found), None)
                if path is not None:
                    return cached_twice(name, other, path)
        around = next(
            (
                path
                for path, part in pl_module.named_modules()
                if isinstance(part, CachedRows) and any(p is found for p in part.modules())
            ),
            None,
        )
        inside = next(
            (path for path, part in found.named_modules() if isinstance(part, CachedRows)), None
        )
        if around is not None or inside is not None:
            where = f"is inside `{around}`" if around is not None else f"holds `{name}.{inside}`"
            return CacheFrozenError(
                f"`{name}` {where}, cached per row already (a `CachedRows` made by "
                "`cache_rows` in the LightningModule, or by another CacheFrozen callback): "
                "one cache around another would key its rows by the inner one, whose counts "
                "change at every call, and never recall them. Cache one of the two only: "
                "name it to one callback, or put the module itself back in place of its "
                "cache before fitting"
            )
    return None


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """Whether modules ``a`` and ``b`` are of one class, holding equal weights and buffers
    under the same names."""
    if type(a) is not type(b):
        return False
    ours, theirs = a.state_dict(), b.state_dict()
    return ours.keys() == theirs.keys() and all(
        isinstance(t, torch.Tensor)
        and isinstance(ours[k], torch.Tensor)
        and ours[k].shape == t.shape
        and ours[k].dtype == t.dtype
        and ours[k].device == t.device
        and torch.equal(ours[k], t)
        for k, t in theirs.items()
    )


def keyed_alike(a: nn.Module, b: nn.Module) -> bool:
    """Whether modules ``a`` and ``b``, keyed by index, key their rows alike: of one class
    with the same weights and buffers (:func:`same_weights`), the same structure as
    ``repr`` shows it, and the same settings and hooks beside their weights. Copies apart
    in a setting their forward reads (a gain, a pooling) are keyed apart, as answered."""
    return (
        same_weights(a, b)
        and repr(a) == repr(b)
        and ModuleNode(a)._beside_weights() == ModuleNode(b)._beside_weights()
    )


def twins(todo: list[tuple[str, nn.Module]]) -> CacheFrozenError | None:
    """The refusal, keyed by index, of two of the modules ``todo`` (each with its name)
    that are copies of one encoder keyed alike (:func:`keyed_alike`: a query and a
    passage encoder loaded from one checkpoint); None where none are. For each sample
    the rows one computed would answer the other's input."""
    for place, (name, module) in enumerate(todo):
        other = next((o for o, m in todo[place + 1 :] if keyed_alike(module, m)), None)
        if other is not None:
            return CacheFrozenError(
                f"`{name}` and `{other}` are copies of one `{type(module).__qualname__}` "
                "with the same weights and settings: keyed by index, their rows are keyed "
                "alike, so for each sample the rows one computed would be answered for the "
                "other's input. Key this callback by content (`key='content'`)"
            )
    return None


def fixed_by_wrap(
    pl_module: pl.LightningModule, name: str, module: nn.Module
) -> CacheFrozenError | None:
    """The refusal of submodule ``name`` where a model made by ``somatize.torch.wrap``
    holds ``module`` fixed — declared there (frozen or cached, per batch), or traced into
    its code, or on the way to such a part — which that model refuses replaced; None
    where none does."""
    for parent, attribute in places_of(pl_module, module):
        parts = parent.__dict__.get("_parts") if isinstance(parent, Wrapped) else None
        if parts is not None and attribute in parts.tops:
            return CacheFrozenError(
                f"`{name}` is held fixed by a model made by `somatize.torch.wrap` (declared "
                "there, frozen or cached per batch, or traced into its code), which runs and "
                "keys the module it was made with: a per-row cache put in its place would "
                "never run. Cache it in one place only: leave it out of this callback's "
                "names (declared `cached` in `wrap`, it is cached already), or give this "
                "callback a module outside the wrapped model (wrap the model without it)"
            )
    return None


def own_cache_put_back(name: str, ours: str) -> CacheFrozenError:
    """The refusal of submodule ``name``, found holding the callback's own cache of
    ``ours``, put in the model by hand after a stage handed the plain module back."""
    return CacheFrozenError(
        f"`{name}` holds this callback's own cache of `{ours}` (`callback.cached"
        f"['{ours}']`), put in the model after a stage handed the plain module back. The "
        "callback puts its cache in place itself when a stage starts and hands the module "
        "back when it ends, so between stages the model holds the module itself: put it "
        f"back there (`model.{name} = model.{name}.module`), and the next stage caches it "
        "with this same cache, memory tiers and all. Called on its own, the cache answers "
        "without being in the model"
    )


def tuners_of(trainer: pl.Trainer) -> list[BaseFinetuning]:
    """The fine-tuning callbacks (``BaseFinetuning``) among the trainer's."""
    return [c for c in getattr(trainer, "callbacks", ()) if isinstance(c, BaseFinetuning)]


def freeze_first(trainer: pl.Trainer, callback: object, pl_module: pl.LightningModule) -> None:
    """Has each fine-tuning callback listed after ``callback`` freeze what it schedules
    now — what its own ``setup()``, called next, does again (Lightning calls it at every
    stage) — so that what is cached is looked at as that callback leaves it."""
    callbacks = list(getattr(trainer, "callbacks", ()))
    at = next((k for k, c in enumerate(callbacks) if c is callback), -1)
    for later in callbacks[at + 1 :]:
        if isinstance(later, BaseFinetuning):
            later.freeze_before_training(pl_module)


def _computes_otherwise(part: nn.Module) -> bool:
    """Whether ``part`` computes otherwise in train mode than in eval: a norm layer with
    running statistics (batch statistics in train mode, and updated), a dropout that
    drops, an attention or a stacked recurrent layer that drops, an ``RReLU`` that draws
    its slope, or a spectral norm (a power iteration in train mode, its vectors updated).
    Nothing else torch makes reads its mode."""
    if isinstance(part, _NormBase):
        return part.running_mean is not None
    if isinstance(part, _DropoutNd):
        return part.p > 0
    if isinstance(part, nn.MultiheadAttention):
        return bool(part.dropout > 0)
    if isinstance(part, nn.RNNBase):
        return part.dropout > 0 and part.num_layers > 1  # dropped between its layers only
    if isinstance(part, nn.RReLU):
        return part.lower != part.upper  # eval takes their mean, train draws between them
    return _spectral_norm(part)


def _spectral_norm(part: nn.Module) -> bool:
    """Whether ``part`` is a spectral norm: torch's parametrization (a part of the layer it
    normalizes), or the older hook ``nn.utils.spectral_norm`` registers on the layer."""
    if isinstance(part, _SPECTRAL_PARAMETRIZATION):
        return True
    hooks = part._forward_pre_hooks.values()
    return any(isinstance(hook, SpectralNorm) for hook in hooks)


# torch keeps the class of its spectral-norm parametrization private.
_SPECTRAL_PARAMETRIZATION: type = getattr(parametrizations, "_SpectralNorm", type(None))


def _moves(part: nn.Module) -> bool:
    """Whether ``part`` is in train mode now and computes otherwise there than in eval."""
    return part.training and _computes_otherwise(part)


def check_trainable(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    stage: str,
    todo: list[tuple[str, nn.Module, str, nn.Module]],
) -> set[str]:
    """Says so when a module about to be cached would have trained, or run in train mode,
    without the callback — caching freezes it and holds it in eval — and returns the
    names of those to leave uncached.

    With a fine-tuning callback (``BaseFinetuning``), which freezes what it schedules and
    unfreezes it later (the module then runs uncached), a module it leaves with
    parameters to train (``BackboneFinetuning`` leaves BatchNorm layers to train), or with parts in
    train mode that compute otherwise in eval (a fine-tuning callback puts nothing in
    eval), is left uncached, with a warning (:class:`Uncached`): it runs as without the
    callback. Without one, a module whose parameters require grad is frozen with a
    warning (:class:`FrozeTrainable`), and refused when it holds all that fitting would
    train (a head named by mistake).

    Called through the callback's ``setup()`` (one method down), so that the warning
    points at what called that hook."""
    if stage != "fit":
        return set()  # nothing trains in validate, test or predict
    trainable = {
        name: [n for n, p in found.named_parameters() if p.requires_grad]
        for name, _, _, found in todo
    }
    trainable = {name: params for name, params in trainable.items() if params}
    tuners = tuners_of(trainer)
    if tuners:
        return _left_to_tuners(tuners, todo, trainable)
    if not trainable:
        return set()
    named = {id(p) for _, _, _, found in todo for p in found.parameters()}
    listed = "; ".join(f"`{name}`: {few(params)}" for name, params in trainable.items())
    # A module `configure_model()` makes (a head), after this hook, is not there yet: what
    # is left to train is looked at when fitting starts (:func:`nothing_left`).
    later = type(pl_module).configure_model is not pl.LightningModule.configure_model
    if not later and not any(
        p.requires_grad and id(p) not in named for p in pl_module.parameters()
    ):
        raise _everything_named(listed)
    warnings.warn(
        f"parameters of modules named to be cached require grad ({listed}): caching "
        "freezes them (requires_grad_(False), held in eval), so they do not train here "
        "as they would without this callback. If a module is meant to train, do not "
        "name it; if it is meant to stay frozen, freeze it before fitting or in the "
        "LightningModule's own `setup()` (`requires_grad_(False)`) and this warning "
        "goes. A schedule that unfreezes it later gets it back uncached",
        FrozeTrainable,
        stacklevel=4,
    )
    return set()


def _everything_named(listed: str) -> CacheFrozenError:
    return CacheFrozenError(
        f"the modules named to be cached hold every parameter this LightningModule "
        f"trains ({listed}): caching freezes them (a cached module runs without "
        "gradients), so nothing would be left to train and the first backward would "
        "fail. Name only the frozen submodules whose answers stay the same (the "
        "encoder), not the part being trained (the head)"
    )


def nothing_left(pl_module: pl.LightningModule, found: dict[str, Found]) -> CacheFrozenError | None:
    """The refusal, when fitting starts, of modules cached that held parameters requiring
    grad where nothing else in ``pl_module`` requires grad: :func:`check_trainable` leaves
    it until then for a LightningModule that makes modules in ``configure_model()`` (which
    Lightning calls after the callbacks' ``setup()``), since the head may be made there.
    None where something is left to train, or the cached modules trained nothing."""
    trainable: dict[str, list[str]] = {}
    for name, place in found.items():
        required = {id(p) for p, was, _ in place.as_found.grads if was}
        params = [n for n, p in place.as_found.module.named_parameters() if id(p) in required]
        if params:
            trainable[name] = params
    if not trainable or any(p.requires_grad for p in pl_module.parameters()):
        return None
    return _everything_named("; ".join(f"`{n}`: {few(params)}" for n, params in trainable.items()))


def _left_to_tuners(
    tuners: list[BaseFinetuning],
    todo: list[tuple[str, nn.Module, str, nn.Module]],
    trainable: dict[str, list[str]],
) -> set[str]:
    """The modules to cache that the fine-tuning callbacks leave to train or in train
    mode, warned of (:class:`Uncached`)."""
    why: dict[str, str] = {}
    for name, _, _, found in todo:
        moving = [part or "the module itself" for part, m in found.named_modules() if _moves(m)]
        if name in trainable:
            why[name] = f"its parameters {few(trainable[name])} are left to train"
        elif moving:
            why[name] = (
                f"its parts {few(moving)} run in train mode (dropout drawing, BatchNorm on "
                "batch statistics, a spectral norm iterating)"
            )
    if why:
        listed = "; ".join(f"`{name}`: {reason}" for name, reason in why.items())
        kinds = ", ".join(sorted({type(t).__name__ for t in tuners}))
        warnings.warn(
            f"left uncached under the fine-tuning callback {kinds} ({listed}): cached, it "
            "would be frozen and held in eval, and so train or run otherwise than it does "
            "here without this callback; uncached, it runs exactly so. To cache it, have "
            "the fine-tuning callback freeze all of it — in its `freeze_before_training`, "
            "`self.freeze(pl_module.backbone, train_bn=False)`: BackboneFinetuning's own "
            "leaves the BatchNorm layers to train whatever its `train_bn`, which says only "
            "what unfreezing trains — and put it in eval before fitting "
            "(`model.backbone.eval()`), if that is how it is meant to run until it is unfrozen",
            Uncached,
            stacklevel=5,
        )
    return set(why)


def waits_for_own_setup(
    trainer: pl.Trainer, pl_module: pl.LightningModule, module: nn.Module
) -> bool:
    """Whether ``module``, about to be cached, is left as it is until the LightningModule's
    own ``setup()`` has run (:func:`after_own_setup`): one whose parameters require grad, in
    a LightningModule with a ``setup()`` of its own, which Lightning runs after the
    callbacks' and may freeze it there (``self.encoder.requires_grad_(False)``). Frozen now,
    it would be taken for one that trains without the callback, and handed back so. Not
    under a fine-tuning callback, which freezes what it schedules itself
    (:func:`freeze_first`)."""
    if type(pl_module).setup is pl.LightningModule.setup or tuners_of(trainer):
        return False
    return any(p.requires_grad for p in module.parameters())


def waiting_with(
    todo: list[tuple[str, nn.Module, str, nn.Module]],
    waiting: list[tuple[str, nn.Module, str, nn.Module]],
) -> list[tuple[str, nn.Module, str, nn.Module]]:
    """``waiting`` (the modules of ``todo`` left as they are until the LightningModule's own
    ``setup()`` has run: :func:`waits_for_own_setup`) with each other module of ``todo`` that
    shares a part with one of them (a stem), in the order of ``todo``: cached now, it would
    be frozen, its parts put in eval, before the one it shares them with is looked at, and
    that one would be taken as found so, and run so."""
    if not waiting:
        return waiting
    parts = {id(part) for one in waiting for part in one[3].modules()}
    held = [one for one in todo if all(one is not other for other in waiting)]
    found = True
    while found:  # a module sharing a part with one that shares a part with a waiting one
        found = False
        for one in held:
            mine = {id(part) for part in one[3].modules()}
            if not mine.isdisjoint(parts):
                parts |= mine
                held.remove(one)
                found = True
                break
    return [one for one in todo if all(one is not other for other in held)]


def after_own_setup(
    pl_module: pl.LightningModule, callback: CacheFrozen, then: Callable[[], None]
) -> None:
    """Has ``then`` called once the LightningModule's own ``setup()`` has run — the next
    hook Lightning calls after the callbacks' ``setup()``, before ``configure_model()``,
    the optimizers and the strategy's move or wrap of the model — and no more: the method is
    put on the LightningModule itself for that one call (:func:`own_setup_restored`
    takes it off a stage that failed first). Each callback waiting is called in turn, in
    the order they asked: a second CacheFrozen's wait does not take away the first's, whose
    modules would have been left uncached, unsaid; one callback asking again (a stage
    that failed left its wait there) replaces what it asked before."""
    waiting = vars(pl_module).get("setup")
    if not isinstance(waiting, _ThenLook):
        waiting = _ThenLook(pl_module)
        vars(pl_module)["setup"] = waiting
    waiting.thens[id(callback)] = then  # by id: a copy of the LightningModule copies no callback


class _ThenLook:
    """The ``setup()`` :func:`after_own_setup` puts on a LightningModule: its own, then the
    looks of the callbacks waiting for it."""

    def __init__(self, pl_module: pl.LightningModule) -> None:
        self.pl_module = pl_module
        self.own = pl_module.setup
        self.thens: dict[int, Callable[[], None]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        own_setup_restored(self.pl_module)
        done = self.own(*args, **kwargs)
        for then in self.thens.values():
            then()
        return done

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy of the LightningModule (torch.save of it whole, copy.deepcopy) made while
        # this waits gets its own ``setup()`` instead: the callbacks waiting, their trainer
        # and store are not copied with it, nor is what they would cache the copy's.
        return getattr, (self.pl_module, "setup")


def own_setup_restored(pl_module: pl.LightningModule) -> None:
    """Takes the ``setup()`` :func:`after_own_setup` put on ``pl_module`` off it, where it
    is still there (a stage that failed before Lightning called it)."""
    if isinstance(vars(pl_module).get("setup"), _ThenLook):
        del vars(pl_module)["setup"]


def places_of(root: nn.Module, module: nn.Module) -> list[tuple[nn.Module, str]]:
    """Every place ``module`` sits in ``root``: each parent holding it, with the attribute
    it is held as there (one module shared under two names sits in two places)."""
    return [
        (parent, attribute)
        for parent in root.modules()
        for attribute, child in parent._modules.items()
        if child is module
    ]


@dataclass
class Found:
    """A named submodule as ``setup()`` found it: every place it sits in the LightningModule
    (:func:`places_of`), and how it was frozen or not (:class:`AsFound`) — what it is put
    back as."""

    places: list[tuple[nn.Module, str]]
    as_found: AsFound
    root: nn.Module  # the LightningModule it was found in
    # Its parts that compute otherwise in train mode (:func:`_computes_otherwise`), each
    # by name, with its mode as found: those whose mode decides whether it may be cached.
    mode_dependent: list[tuple[str, nn.Module, bool]]
    # The last answer of :meth:`in_train_mode`, with the mode it was asked for and the
    # count of asks and holds it was worked out at (:func:`asked_changes`): asked at every
    # lookup, it is worked out again only once one of them moved.
    _last: tuple[int, bool, list[str]] | None = field(default=None, repr=False)

    @classmethod
    def at(cls, pl_module: nn.Module, module: nn.Module, *, fitting: bool) -> Found:
        """``module`` as it is now, in ``pl_module``: taken before it is cached (frozen).
        One found with parameters requiring grad when ``fitting`` is held in eval, having
        said so (:class:`FrozeTrainable`): none of its parts decides whether it may be
        cached. In validate, test or predict nothing trains and nothing is said: its parts
        decide, as a frozen module's do (a dropout put in train mode to sample predictions
        runs it uncached)."""
        # A part another callback's cache froze is taken as the model had it (a stem).
        as_found = AsFound.take(module, shared=True)
        trainable = fitting and any(required for _, required, _ in as_found.grads)
        modes = {id(part): training for part, training in as_found.modes}
        mode_dependent = [
            (name, part, modes[id(part)])
            for name, part in module.named_modules()
            if _computes_otherwise(part) and not trainable
        ]
        return cls(places_of(pl_module, module), as_found, pl_module, mode_dependent)

    def in_train_mode(self, mode: bool) -> list[str]:
        """The parts that compute otherwise in train mode and would run in it now without
        the cache (the module itself in ``mode``, the mode last asked of its cache): the
        modes they would be put back in (:meth:`put_back`), asked of them, of the module
        or of the model, since it was found. Empty for a module with no such part, which
        answers the same in either mode."""
        if not self.mode_dependent:
            return []
        changes = asked_changes()  # read before the asks are: a change after moves it
        last = self._last
        if last is not None and last[0] == changes and last[1] == mode:
            return last[2]
        parts = [(part, training) for _, part, training in self.mode_dependent]
        modes = self.as_found.unheld_modes(mode, parts)
        named = zip(self.mode_dependent, modes, strict=True)
        found = [name or "the module itself" for (name, _, _), on in named if on]
        self._last = (changes, mode, found)
        return found

    def install(self, cached: CachedRows) -> None:
        """Puts ``cached`` in every place the module sits."""
        for parent, attribute in self.places:
            setattr(parent, attribute, cached)

    def put_back(self, cached: CachedRows, *, grads: bool) -> None:
        """Puts the module back in every place ``cached`` still holds, as it was found — in
        the mode it would be in without the cache: the one asked of it while it was held
        (``self.encoder.eval()`` in a hook) — and, with ``grads``, each parameter
        requiring grad as when found. The cache is told (:meth:`CachedRows.hand_back`), so
        that, called on its own from here, it holds the module frozen only while the call
        runs."""
        self.as_found.put_back(cached.training, grads=grads)
        # Where it was found, and where the model holds it now: a LightningModule's own
        # `setup()`, which runs after the callback's, may have put it inside a module of
        # its own (`self.encoder = nn.Sequential(self.encoder, head)`).
        now = [place for place in places_of(self.root, cached) if place not in self.places]
        for parent, attribute in self.places + now:
            if parent._modules.get(attribute) is cached:
                setattr(parent, attribute, self.as_found.module)
        _move_hooks(cached, self.as_found.module)
        cached.hand_back()


def _move_hooks(cached: CachedRows, module: nn.Module) -> None:
    """Moves the forward hooks and pre-hooks registered on ``cached`` while it stood in
    the model (``self.encoder.register_forward_hook(...)`` in a hook of the fit) onto
    ``module``: without the cache they would have been registered there, and the model
    handed back runs them. They ran around the module's own, so its pre-hooks go first
    and its hooks last, in the order registered."""
    for table, first in _MOVED_HOOKS:
        theirs = getattr(cached, table)
        if not theirs:
            continue
        own = getattr(module, table)
        for hook_id in reversed(theirs) if first else theirs:
            own[hook_id] = theirs[hook_id]
            own.move_to_end(hook_id, last=not first)
        theirs.clear()


# A module's forward hook tables, each with whether the hooks in it run before the
# module's forward (pre-hooks) or after; the keyword and always-called tables only mark
# hooks whose ids are in the first two.
_MOVED_HOOKS = (
    ("_forward_pre_hooks", True),
    ("_forward_pre_hooks_with_kwargs", True),
    ("_forward_hooks", False),
    ("_forward_hooks_with_kwargs", False),
    ("_forward_hooks_always_called", False),
)


def let_go(cached: CachedRows, aheads: weakref.WeakSet[Ahead[Any]]) -> None:
    """Closes ``cached`` and lets go of its memory tiers, and has the loaders in ``aheads``
    (which would hold it, and its memory tiers — GiBs — for the rest of the run) drop it."""
    cached.close()
    for wrapper in aheads:
        wrapper.drop(cached)
    cached.forget()


def cache_in_place(callback: CacheFrozen, name: str, module: nn.Module, found: Found) -> None:
    """Caches ``module`` in every place ``found`` (how it was found, taken before it or
    any module sharing a part with it was frozen) says it sits; the cache ``callback``
    made for it before if there is one (a later stage of the same model), else a new
    one."""
    cached = callback._cached.get(name)
    if cached is not None and cached.module is module:
        cached.freeze_again()
    else:
        cached = cache_rows(
            module,
            callback.store,
            key=callback.key,
            version=callback.version,
            salt=callback.salt,
            device_bytes=callback.device_bytes,
            host_bytes=callback.host_bytes,
            strict=callback.strict,
        )
    # A forward that finds the module unfrozen (by a hook that runs after this
    # callback's, at any batch) puts it back uncached instead of refusing it; so does one
    # that finds it would run in train mode without the cache, its hooks' asks included;
    # one run by the trainer without this callback (a tuner's trials) answers uncached.
    cached.when_unfrozen = callback._unfrozen
    cached.runs_uncached = callback._runs_uncached
    # So does one handed a batch whose gradient or tangent its recalled rows would cut.
    cached.when_input_needs_grad = callback._input_needs_grad
    found.install(cached)
    callback._cached[name] = cached
    callback._found[name] = found


def _unhooked(cached: CachedRows) -> CachedRows:
    """``cached`` with none of the callback's handlers left on it: called on its own from
    here, it refuses what a cache of its own refuses."""
    cached.when_unfrozen = cached.runs_uncached = cached.when_input_needs_grad = None
    return cached


def _run_uncached(callback: CacheFrozen, name: str, cached: CachedRows, *, grads: bool) -> None:
    """Puts ``cached``'s module back as it was found (with ``grads``, each parameter
    requiring grad as found), in the mode asked of it, to run uncached from here on, and
    lets go of its cache."""
    _unhooked(cached)
    callback._found.pop(name).put_back(cached, grads=grads)
    pass_through(callback, cached.module)
    let_go(cached, callback._aheads)
    del callback._cached[name]


def uncache(
    callback: CacheFrozen, pl_module: pl.LightningModule, name: str, cached: CachedRows
) -> None:
    """Puts ``cached``'s module back as it was found, to train uncached from here on, and
    lets go of its cache; the warning that says so (:class:`Uncached`) points at what
    called this."""
    # Its parameters as the schedule set them: it trains from here, as without the cache.
    _run_uncached(callback, name, cached, grads=False)
    callback._uncached.add(name)
    warnings.warn(
        f"`{name}` was unfrozen (its parameters require grad: a fine-tuning schedule, "
        "say), so it is put back as it was and runs uncached from here on, training as "
        "without this callback; the rows kept while it was frozen stay in the store",
        Uncached,
        stacklevel=2,
    )


def left_in_train_mode(
    callback: CacheFrozen, name: str, cached: CachedRows, parts: list[str]
) -> None:
    """Puts ``cached``'s module back as it was found, in the mode asked of it, to run
    uncached for the rest of the stage: it would run in train mode without the cache, and
    its ``parts`` compute otherwise there. A later stage caches it anew (in an evaluation,
    Lightning puts it in eval). The warning that says so (:class:`Uncached`) points at
    what called this."""
    _run_uncached(callback, name, cached, grads=True)
    warnings.warn(
        f"`{name}` would run in train mode here without this callback, and its parts "
        f"{few(parts)} compute otherwise in train mode (dropout drawing, BatchNorm on batch "
        "statistics, a spectral norm iterating): cached, it would be held in eval and "
        "answer otherwise than it does without this callback, so it is put back as it was "
        "and runs uncached, in train mode, for the rest of this stage. Freezing a module "
        "with `requires_grad_(False)` leaves it in the mode it is in. If it is meant to "
        f"run in eval, put it in eval before fitting (`model.{name}.eval()`: Lightning "
        "keeps the modes it finds through a fit, and puts back those an evaluation "
        f"changes), or in the LightningModule's `on_train_batch_start` (`self.{name}."
        "eval()`), and it is cached",
        Uncached,
        stacklevel=2,
    )


def handed_grad(callback: CacheFrozen, name: str, cached: CachedRows, cut: str) -> None:
    """Puts ``cached``'s module back as it was found, in the mode asked of it, to run
    uncached for the rest of the stage: it is handed a batch that ``cut`` says a recalled
    row would cut the derivatives of (it requires grad: a trainable part upstream), so its
    answers cannot be recalled. A later stage caches it anew (in an evaluation, nothing
    requires grad). The warning that says so (:class:`Uncached`) points at what called
    this."""
    _run_uncached(callback, name, cached, grads=True)
    warnings.warn(
        f"`{name}` is handed a batch that {cut}, which a recalled row would not carry (it "
        "is a leaf): a trainable part upstream of it (an adapter, a learned normalization, "
        "an embedding) would train on the rows computed and silently stop on those "
        "recalled, so its answers cannot be recalled. It is put back as it was and runs "
        "uncached for the rest of this stage, what is upstream of it training as without "
        "this callback. To cache it, freeze the part upstream (`requires_grad_(False)`, "
        "or run it under `torch.no_grad()`), or cache something else: a frozen module "
        "whose input requires no grad",
        Uncached,
        stacklevel=2,
    )


def replaced(
    callback: CacheFrozen, pl_module: pl.LightningModule, name: str, cached: CachedRows
) -> bool:
    """Whether ``name`` in ``pl_module`` is no longer ``cached`` (a hook put another
    module there: a checkpoint loaded into a new encoder); if so, the module cached is put
    back as it was found, its cache let go of, and a warning (:class:`Uncached`) says the
    new one runs uncached until a later stage caches it."""
    try:
        now = locate(pl_module, name)[2]
    except NotASubmodule:
        now = None
    if now is cached:
        return False
    _unhooked(cached)
    callback._found.pop(name).put_back(cached, grads=True)
    if now is not None:
        pass_through(callback, now)
    let_go(cached, callback._aheads)
    del callback._cached[name]
    what = f"a `{type(now).__name__}`" if now is not None else "nothing"
    warnings.warn(
        f"`{name}` was replaced in the model by {what} after this callback cached it, so "
        "it runs uncached for the rest of this stage; a later stage (another `fit`, "
        "`validate` or `test`) caches it anew. Replace it before calling the trainer "
        "(Lightning runs the LightningModule's own `setup()` after this callback's, so a "
        "module put in there is one this callback never saw), or load new weights into the "
        "module in place (`self.encoder.load_state_dict(...)`)",
        Uncached,
        stacklevel=2,
    )
    return True


def put_back_all(callback: CacheFrozen, *, failed: bool) -> None:
    """Every module ``callback`` holds in place put back as it was found, then each cache
    closed (its writer stopped: a later forward starts it again) and kept. What a close
    raises (rows that could not be written) is raised once all are back, unless the
    stage ``failed`` already."""
    for handle in callback._passes.values():
        handle.remove()
    callback._passes = {}
    closing: list[CachedRows] = []
    for name, found in list(callback._found.items()):
        cached = _unhooked(callback._cached[name])
        del callback._found[name]
        found.put_back(cached, grads=True)
        closing.append(cached)
    errors: list[Exception] = []
    for cached in closing:
        try:
            cached.close()
        except Exception as error:
            errors.append(error)
    if errors and not failed:
        raise errors[0]


def pass_through(callback: CacheFrozen, module: nn.Module) -> None:
    """Has ``module``, running uncached until the stage ends, take what its cache would
    have been handed: a batch of :class:`DeferredRows` is loaded (in the module's
    floating dtype, as the cache loads it), by place or by name, and ``index=`` dropped
    unless the module's own forward takes it. Removed by :func:`put_back_all`, so the
    model handed back holds no hook of the callback's."""
    if id(module) in callback._passes or isinstance(module, CachedRows):
        return  # a row cache (one put in place of the module) takes its batches itself
    try:
        forward = inspect.signature(module.forward).parameters.values()
        takes_index = any(p.name == "index" or p.kind is p.VAR_KEYWORD for p in forward)
    except (TypeError, ValueError):  # no signature to read: passed on as it came
        takes_index = True
    callback._passes[id(module)] = module.register_forward_pre_hook(
        PassThrough(takes_index), with_kwargs=True, prepend=True
    )


class PassThrough:
    """The forward pre-hook :func:`pass_through` puts on a module running uncached. A
    copy of it (the module deep-copied, pickled or saved mid-stage: an EMA of the model)
    does nothing, so a copy never loads rows for a stage that is not its own; the
    callback removes the original when the stage ends."""

    def __init__(self, takes_index: bool, acting: bool = True) -> None:
        self.takes_index = takes_index
        self.acting = acting

    def __reduce__(self) -> tuple[type[PassThrough], tuple[bool, bool]]:
        return PassThrough, (self.takes_index, False)

    def __deepcopy__(self, memo: dict[int, Any]) -> PassThrough:
        return PassThrough(self.takes_index, acting=False)

    def __copy__(self) -> PassThrough:
        return PassThrough(self.takes_index, acting=False)

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not self.acting:
            return None
        dropped = "index" in kwargs and not self.takes_index
        named = [k for k, v in kwargs.items() if isinstance(v, DeferredRows)]
        if not (dropped or named or (args and isinstance(args[0], DeferredRows))):
            return None
        if args and isinstance(args[0], DeferredRows):
            args = (_loaded(module, args[0]), *args[1:])
        if named:  # handed by name (`self.encoder(x=rows)`) as well as by place
            kwargs = {k: _loaded(module, v) if k in named else v for k, v in kwargs.items()}
        if dropped:
            kwargs = {k: v for k, v in kwargs.items() if k != "index"}
        return args, kwargs


def _loaded(module: nn.Module, rows: DeferredRows) -> torch.Tensor:
    """The inputs of ``rows``, floating-point ones in ``module``'s floating dtype where it
    holds none of theirs (as a trainer in true half precision converts a batch)."""
    loaded = rows.load()
    if not loaded.is_floating_point():
        return loaded
    return loaded.to(_run_in(loaded.dtype, _floating_dtypes(module)))
