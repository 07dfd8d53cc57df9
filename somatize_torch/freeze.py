"""Freezing: making true what ``.frozen()`` says about a torch node.

A graph *declares* that a node's state does not change (``.frozen()``, or
``wrap(model, frozen=[...])``); :func:`freeze` is whoever knows what is inside
making it so, in three steps for each frozen torch node:

1. **settle** — digest its state, weights **and buffers** (BatchNorm running
   statistics change what it computes as much as its weights do), and record it
   with ``g.memory.freeze(name, digest)``, so it enters the node's key (what the
   digest is, and how a change to the state is seen after, is
   :mod:`somatize_torch._state`'s);
2. ``requires_grad_(False)`` on its parameters, and the gradients they kept dropped
   (an optimizer made before would still move them by momentum);
3. hold it in ``eval()``: an enclosing module's ``.train()`` leaves it in eval
   mode, so dropout stays off and BatchNorm statistics stay put.

A frozen module that would still change when it runs — a submodule put back into
train mode directly, a BatchNorm that would update its statistics, a dropout
that would draw — gets a :class:`StillChanging` warning, and is put back in eval
before it runs.

A torch node is a :class:`ModuleNode` (a node whose work is an ``nn.Module``;
``wrap`` makes one per declared submodule) or a node that is itself an
``nn.Module``. Freezing one that is not declared frozen is an error: the graph
would not know it is settled, and the declaration belongs in the graph.

**On a network worker.** A worker in another process rebuilds what it runs, and
a module *instance* cannot be rebuilt there. ``ModuleNode.build(Encoder,
width=32)`` makes a node that can: it records the module's class and its
canonical constructor arguments, so the worker constructs the same module
itself, then loads the frozen weights it is sent once — every parameter and
buffer by name, as ``tensor`` codec bytes (the safetensors layout, never a
pickle) — checks that their digest is the one the graph is frozen at, and holds
the module frozen there between forwards (see :mod:`somatize.broker.host`).
Its key is the key an instance-made node of the same module and weights has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize
from torch.utils._pytree import tree_leaves, tree_map

import somatize
from somatize import Graph, Node, Unbuildable, Undeclared
from somatize._precision import keyed_by_precision
from somatize._threads import ProcessLock
from somatize.canonical import NotCanonical
from somatize.catalog import identity_of, nameless_because
from somatize.errors import SomatizeError, SomatizeWarning
from somatize.node import restates, sees_state, watches_settled
from somatize_torch._modes import DrawsSeen
from somatize_torch._precision import Named, entered, precision_on, settings
from somatize_torch._settings import (
    SettingsWatch,
    _compile_wrapper,
    _configs_in,
    hooks_of,
    settings_of,
    stood_for,
)
from somatize_torch._settled import kept_weights, watch_kept_weights
from somatize_torch._sharding import is_dtensor
from somatize_torch._state import (
    Read,
    StateWatch,
    _state_tensors,
    digest_state,
    modules_read,
    own_parameters,
)
from somatize_torch.codec import TENSOR, LandedOnHost

if TYPE_CHECKING:
    from somatize_torch.wrap import Wrapped

__all__ = [
    "FreezeError",
    "ModuleNode",
    "NotATorchNode",
    "NotDeclaredFrozen",
    "NothingToFreeze",
    "StateDoesNotFit",
    "StillChanging",
    "Unfrozen",
    "classes_of",
    "digest_state",
    "freeze",
    "is_held",
    "module_of",
    "release",
]


class FreezeError(SomatizeError, ValueError):
    """What was asked to be frozen cannot be."""


class Unfrozen(FreezeError):
    """Parameters of a frozen, cached module came to require grad: somebody unfroze it."""


def few(names: list[str], shown: int = 3) -> str:
    """``names`` quoted, the first ``shown`` of them, and how many more."""
    listed = ", ".join(f"`{name}`" for name in names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def unfrozen_error(module: nn.Module, names: list[str]) -> Unfrozen:
    """The refusal of ``module``, frozen and cached, whose parameters ``names`` now
    require grad: unfrozen since it was frozen, or added to it since (an adapter), or
    tensors standing in their place that are no parameters, handed in for a call
    (``torch.func.functional_call``), which are the caller's and left as they are."""
    params = dict(module.named_parameters())
    handed = [name for name in names if not isinstance(params.get(name), nn.Parameter)]
    if handed:
        return Unfrozen(
            f"`{type(module).__name__}` is frozen and cached, and is called with weights "
            f"that require grad handed in for its parameters {few(handed)} "
            "(`torch.func.functional_call`): a cached module's answers are recalled "
            "without gradients, so none would reach them. Call the module itself, not the "
            "cache, to differentiate through those weights, or hand them in detached "
            "(`t.detach()`) to have its answers for them cached"
        )
    return Unfrozen(
        f"`{type(module).__name__}` is frozen and cached, and its parameters {few(names)} "
        "now require grad: somebody unfroze it, or put trainable parameters into it (an "
        "adapter), to train it, and a cached module's answers are recalled without "
        "gradients, so it would not train. To train it, release it "
        "(`somatize.torch.release(module)`: freezing holds it in eval, so `.train()` "
        "alone leaves BatchNorm on its running statistics and dropout off) and call the "
        "module itself, not the cache; or freeze them again (`requires_grad_(False)`) to "
        "go on caching: its weights are then digested again, so what training changed "
        "meanwhile is keyed anew"
    )


class NotDeclaredFrozen(FreezeError):
    """A node was asked to be frozen that the graph does not declare frozen."""


class NotATorchNode(FreezeError, TypeError):
    """A node was asked to be frozen that holds no torch module."""


class NothingToFreeze(FreezeError):
    """A graph with no frozen torch node was asked to be frozen."""


class StillChanging(SomatizeWarning):
    """A frozen module was found in train mode (dropout drawing, BatchNorm updating)."""


class StateDoesNotFit(FreezeError):
    """State sent for a module does not fit the module rebuilt to receive it."""


_asks = itertools.count(1)
"""Numbers each mode asked of a held module or a part of it, in the order asked."""

_holding = threading.local()
"""Set while the hold itself puts a module in eval: no ask of anybody's, so not recorded."""

_asked_changes = 0
"""Counts the changes of what :meth:`AsFound.unheld_modes` reads — an ask recorded, asks
undone, a hold taken or let go of — each counted once it is made: an answer worked out
after reading the count stands until the count moves (:func:`asked_changes`)."""


def asked_changes() -> int:
    """The count of the changes of the asks recorded and the holds (a mode asked of a held
    module or a part of it, asks undone, a module held or let go of), so far."""
    return _asked_changes


def _asks_changed() -> None:
    global _asked_changes
    _asked_changes += 1


def _in_eval(module: nn.Module) -> None:
    """Puts ``module`` and every part of it in eval, as the hold does, recording no ask:
    of its parts after one held on its own either, whose hold puts it in eval so too."""
    was = getattr(_holding, "on", False)
    _holding.on = True
    try:
        nn.Module.train(module, False)
    finally:
        _holding.on = was
    _wrappers_follow(module)


def _wrappers_follow(module: nn.Module) -> None:
    """Sets the mode torch 2.4's ``torch.compile`` wrapper keeps of its own to that of the
    module it runs. That torch's wrapper hands a mode set on it to that module and keeps
    its own flag as made, in train, though it runs the module in eval; later torch reads
    the module's flag for it, keeping none of its own."""
    for part in module.modules():
        runs = part._modules.get("_orig_mod") if _compile_wrapper(part) else None
        if runs is not None and "training" in vars(part):
            vars(part)["training"] = runs.training


class _Asked:
    """Stands in for the ``train`` of a part of a held module: it is put in the mode asked,
    as its class would put it, and the ask is recorded (numbered, in order), so that the
    module, let go of, puts the part in the mode it would be in had it never been held
    (``bn.eval()`` in a hook, a common recipe, is kept). Nothing runs per forward.

    A class rather than a closure so that a module holding one still pickles."""

    asked: tuple[int, bool] | None = None  # the number and mode of the last ask

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def note(self, mode: bool) -> None:
        if not getattr(_holding, "on", False):
            self.asked = (next(_asks), bool(mode))
            _asks_changed()

    def __call__(self, mode: bool = True) -> nn.Module:
        self.note(mode)
        return type(self.module).train(self.module, mode)


class _HeldInEval(_Asked):
    """Stands in for a frozen module's ``train``: whatever mode is asked, it stays in eval;
    the ask is recorded, the last of each mode by its number."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self.last: dict[bool, int] = {}

    def note(self, mode: bool) -> None:
        super().note(mode)
        if self.asked is not None:
            self.last[self.asked[1]] = self.asked[0]
            _asks_changed()

    def __call__(self, mode: bool = True) -> nn.Module:
        self.note(mode)
        _in_eval(self.module)
        return self.module


@dataclasses.dataclass
class AskedSoFar:
    """The modes last asked of a held module and of each of its parts (:class:`_Asked`),
    as they stand at one moment: :meth:`undo` sets the records back to them, as if no
    mode were asked after. Lightning takes each module's ``training`` flag before an
    evaluation's ``eval()`` and sets the flags back directly after it, so that the modes
    asked in between (``norm.eval()`` in ``on_validation_epoch_start``) are undone: a
    module held meanwhile puts its parts back as Lightning would have."""

    records: list[tuple[_Asked, tuple[int, bool] | None, dict[bool, int] | None]]

    @classmethod
    def of(cls, module: nn.Module) -> AskedSoFar:
        records = []
        for part in module.modules():
            asker = _asker(part)
            if asker is not None:
                last = dict(asker.last) if isinstance(asker, _HeldInEval) else None
                records.append((asker, asker.asked, last))
        return cls(records)

    def undo(self) -> None:
        """The modes asked since these were taken undone. A part added since has no
        record here and keeps its asks, as Lightning keeps the flag of a module it never
        took."""
        for asker, asked, last in self.records:
            asker.asked = asked
            if isinstance(asker, _HeldInEval) and last is not None:
                asker.last = dict(last)
        _asks_changed()


def _asker(module: nn.Module) -> _Asked | None:
    """What records the modes asked of ``module``, if something does."""
    train = module.__dict__.get("train")
    return train if isinstance(train, _Asked) else None


def is_held(module: nn.Module) -> bool:
    """Whether ``module`` is held in eval mode by :func:`freeze`."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"is_held takes an nn.Module, got a `{type(module).__name__}`")
    return isinstance(module.__dict__.get("train"), _HeldInEval)


def release(module: nn.Module, mode: bool = True) -> None:
    """Undoes :func:`freeze`'s hold on eval of ``module`` (one unfrozen to train it):
    ``train()`` is its class's again, and it is put in ``mode``, train mode by default.
    Gradients are the caller's to turn on (``requires_grad_(True)``). Trained and frozen
    again (``requires_grad_(False)``), the next forward of its cache or graph holds it in
    eval again and digests its weights anew; called there before it trained, it is held
    in eval for that call only (:func:`held_for_call`), or, a frozen part of a wrapped
    model not cached, runs in the mode it is in (:func:`trained_since_released`)."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"release takes an nn.Module (a frozen module unfrozen to train it), got a "
            f"`{type(module).__name__}`"
        )
    from somatize_torch.rows import CachedRows  # rows builds on this module

    if isinstance(module, CachedRows):
        raise TypeError(
            "release takes the module itself, not its row cache: the cache holds it frozen "
            "while it caches, and calling it trains nothing. Release the module and call "
            "it to train it: `somatize.torch.release(cached.module)`"
        )
    if not isinstance(mode, bool):
        raise TypeError(
            f"release(module, mode) puts the module in train mode (True, the default) or eval "
            f"mode (False), got {mode!r}; the module is still held as it was"
        )
    if is_held(module):
        _released[module] = StateWatch(module)
    _let_go(module, mode)


def _let_go(module: nn.Module, mode: bool) -> None:
    """:func:`release`'s work, which putting back a module as it was found does too."""
    if is_held(module):
        del module.__dict__["train"]
        for part in module.modules():
            if type(_asker(part)) is _Asked:  # a part held on its own stays held
                del part.__dict__["train"]
        _asks_changed()
    module.train(mode)


def trained_since_released(module: nn.Module) -> bool:
    """Whether ``module``, released (:func:`release`) since it was frozen, trained since
    and is to be frozen again, none of its parameters requiring grad: a parameter changed
    since it was released, got a gradient, or was replaced, or one required grad at a
    call asked this before (noted then). Its buffers alone changed (``torch.optim.
    swa_utils.update_bn``, which resets BatchNorm's running statistics and estimates them
    anew in train mode), or nothing (a sanity pass), it stays released; so does a copy
    of a released module (``AveragedModel``'s), which was never released itself."""
    watch = _released.get(module)
    if any(parameter.requires_grad for parameter in module.parameters()):
        if watch is None:
            watch = _released[module] = StateWatch(module)
        if not watch.trained():  # once it says so, for good: not walked at every step
            watch.unfrozen(module)  # it trains: the watch says so from here on
        return False
    return watch is not None and watch.trained()


_released: weakref.WeakKeyDictionary[nn.Module, StateWatch] = weakref.WeakKeyDictionary()
"""Each module released (:func:`release`) from a hold, by the watch of its state taken
then, which :func:`trained_since_released` asks."""


def hold(module: nn.Module) -> None:
    """Freezes ``module`` in place: no gradients, in eval, and kept in eval whatever
    ``train()`` is asked of it (parts of it added since included), each mode asked of it
    or of a part of it recorded, for :class:`AsFound` to put back. Gradients its
    parameters kept are dropped: an optimizer skips a parameter with none, where a zeroed
    one (``zero_grad(set_to_none=False)``) would still be moved by momentum."""
    for _, parameter in own_parameters(module):
        parameter.requires_grad_(False)
        parameter.grad = None
    with _for_calls_lock:
        shared = _for_calls.get(id(module))
        if shared is not None:  # held for calls only until now: for good from here
            shared[2] = True
    _in_eval(module)
    if not is_held(module):
        held = _HeldInEval(module)
        asked = getattr(_asker(module), "asked", None)  # a part of a held one, held on its own
        if asked is not None:
            held.asked, held.last[asked[1]] = asked, asked[0]
        object.__setattr__(module, "train", held)
    _hold_parts(module)


def _hold_parts(module: nn.Module) -> None:
    """Records each mode asked of a part of held ``module`` that does not yet (one put in
    since it was held included), for :class:`AsFound` to put back."""
    for part in module.modules():
        if part is not module and "train" not in part.__dict__:
            object.__setattr__(part, "train", _Asked(part))
    _asks_changed()


@dataclasses.dataclass
class AsFound:
    """How a module was found before it was frozen, to be put back so: whether it was
    held in eval already, the mode of each of its parts, and whether each of its
    parameters required grad, with the gradient it kept; ``since`` numbers the asks
    (:class:`_Asked`) made before it was taken, none of which it puts back."""

    module: nn.Module
    held: bool
    modes: list[tuple[nn.Module, bool]]
    grads: list[tuple[nn.Parameter, bool, torch.Tensor | None]]
    since: int = 0

    @classmethod
    def take(cls, module: nn.Module, *, shared: bool = False) -> AsFound:
        """``module`` as it is now, to be put back so. With ``shared`` (a module to be put
        back when the modules it may share a part with are: a stem), a part of it that the
        hold of another module taken so froze is taken as the model had it, as that one is
        to put it back (:func:`_as_had`); and it is kept until put back, for one taken so
        after."""
        held = is_held(module)
        modes = [(part, part.training) for part in module.modules()]
        grads = [(p, p.requires_grad, p.grad) for p in module.parameters()]
        if shared and not held:
            modes, grads = _as_had(module, modes, grads)
        found = cls(module, held, modes, grads, next(_asks))
        if shared:
            with _taken_lock:
                _taken[id(module)] = found
        return found

    def unheld_mode(self) -> bool:
        """The mode the module would be in now had it never been held: the one last asked
        of it while it was held, or the one it was found in."""
        held = _asker(self.module)
        whole = held.asked if held is not None else None
        return whole[1] if whole is not None and whole[0] > self.since else self.modes[0][1]

    def put_back(
        self, mode: bool | None = None, *, grads: bool = True, gradients: bool = False
    ) -> None:
        """Releases the module from its hold on eval, unless it was held when found, in
        ``mode`` — if ``None``, the mode last asked of it while it was held, or the one it
        was found in. Its parts are put in the modes they would be in had it never been
        held: as found (or all in ``mode``, when it is another than the one found), then
        each in the mode asked of it (or of a part it is in) while it was held, unless
        ``mode`` was asked of the whole module after. Held when found, its parts get their
        modes as found. With ``grads``, each parameter requires grad as when found; with
        ``gradients``, it has the gradient it kept then back."""
        with _taken_lock:
            if _taken.get(id(self.module)) is self:
                del _taken[id(self.module)]
        found = self.modes[0][1]
        held = _asker(self.module)
        if mode is None:
            mode = self.unheld_mode()
        if self.held:
            modes = self.modes
        else:
            modes = self.asked_modes(mode, found, held)
            _let_go(self.module, mode)
        for part, training in modes:
            part.training = training
        if grads:
            for parameter, required, _ in self.grads:
                parameter.requires_grad_(required)
        if gradients:
            for parameter, _, gradient in self.grads:
                parameter.grad = gradient

    def unheld_modes(self, mode: bool, parts: list[tuple[nn.Module, bool]]) -> list[bool]:
        """The mode each of ``parts`` (parts of the module, each with its mode as found,
        the module itself among them or not) would be in now had the module never been
        held, the module itself in ``mode``: the modes :meth:`put_back` in ``mode`` would
        leave them in. Held when found, they stay in the modes found."""
        if self.held:
            return [training for _, training in parts]
        inner = [(part, training) for part, training in parts if part is not self.module]
        asked = self.asked_modes(mode, self.modes[0][1], _asker(self.module), inner)
        modes = iter(training for _, training in asked)
        return [mode if part is self.module else next(modes) for part, _ in parts]

    def asked_modes(
        self,
        mode: bool,
        found: bool,
        held: _Asked | None,
        parts: list[tuple[nn.Module, bool]] | None = None,
    ) -> list[tuple[nn.Module, bool]]:
        """Each part's mode had the module never been held, the module itself in ``mode``
        (of ``parts``, each with its mode as found, where given; of every part but the
        module itself otherwise). ``mode`` asked of the whole module after a part's own
        ask overrides it; an ask of the other mode that ``mode`` is not (Lightning's
        ``eval()`` for validation, its flag then set back directly) is taken as undone."""
        last = held.last.get(mode, 0) if isinstance(held, _HeldInEval) else 0
        whole = last if last > self.since else None
        modes = []
        for part, training in self.modes[1:] if parts is None else parts:
            if is_held(part):  # held on its own: it stays in eval
                modes.append((part, training))
                continue
            base = mode if whole is not None or mode != found else training
            own = getattr(_asker(part), "asked", None)
            if own is not None and own[0] > max(self.since, whole or 0):
                base = own[1]
            modes.append((part, base))
        return modes


_taken: weakref.WeakValueDictionary[int, AsFound] = weakref.WeakValueDictionary()
"""Each module taken as found sharing parts (:meth:`AsFound.take`), by its id, until it is
put back."""

_taken_lock = ProcessLock()
"""Held while :data:`_taken` is changed or looked at: unheld in a forked child (a
DataLoader worker forked as another thread lets go of a frozen part), which holds and
lets go of parts too."""


def _as_had(
    module: nn.Module,
    modes: list[tuple[nn.Module, bool]],
    grads: list[tuple[nn.Parameter, bool, torch.Tensor | None]],
) -> tuple[list[tuple[nn.Module, bool]], list[tuple[nn.Parameter, bool, torch.Tensor | None]]]:
    """``modes`` and ``grads`` (each part of ``module`` with its mode now, each parameter
    with whether it requires grad and its gradient now) with those of a part another
    module held now was found with (taken as found before it was held, and not put back:
    a module sharing a part with ``module``) as the model had them: each part in the mode
    it is to be put back in were that module let go of now, each parameter as found."""
    with _taken_lock:
        others = [
            found
            for found in _taken.values()
            if found.module is not module and not found.held and is_held(found.module)
        ]
    for found in others:
        had = {id(part): training for part, training in found.modes}
        shared = [(k, part) for k, (part, _) in enumerate(modes) if id(part) in had]
        if shared:
            parts = [(part, had[id(part)]) for _, part in shared]
            unheld = found.unheld_modes(found.unheld_mode(), parts)
            for (k, part), training in zip(shared, unheld, strict=True):
                modes[k] = (part, training)
        required = {id(p): (was, gradient) for p, was, gradient in found.grads}
        grads = [(p, *required.get(id(p), (was, gradient))) for p, was, gradient in grads]
    return modes, grads


@contextlib.contextmanager
def held_while(module: nn.Module) -> Iterator[None]:
    """:func:`hold` for the duration of a ``with`` block only: ``module`` is frozen while
    the block runs, then left as it was found (:class:`AsFound`), its gradients too."""
    found = AsFound.take(module)
    hold(module)
    try:
        yield
    finally:
        found.put_back(gradients=True)


@contextlib.contextmanager
def held_for_call(name: str, module: nn.Module) -> Iterator[bool]:
    """For a call of a frozen ``module`` whose answer is recalled or kept, or keys answers
    that are: a part of it put in train mode directly is warned of and put back in eval
    (:func:`check_still`; the ``with`` block is handed whether its parts were looked at
    so, for :func:`restated` not to walk them again); the module released since it was
    frozen (:func:`release`, which puts it in train mode), none of its parameters
    requiring grad, is held in eval for the call only (:func:`held_while`), and let go of
    after it as it was found, its mode and ``train()`` the user's again. Left in train
    mode, it would run so where nothing is recalled (a BatchNorm on batch statistics,
    moving its running ones; a dropout drawing) and answer as in eval where something is.
    Calls at once (threads, or one inside another) share one hold, let go of as the last
    of them ends: the first to end would put the module back in train mode under the
    others."""
    with _for_calls_lock:
        shared = _for_calls.get(id(module))
        if shared is not None:
            shared[1] += 1
        elif not is_held(module) and not any(p.requires_grad for p in module.parameters()):
            found = AsFound.take(module)
            hold(module)
            shared = _for_calls[id(module)] = [found, 1, False]
    looked = shared is None and is_held(module)
    if looked:
        check_still(name, module)
    try:
        yield looked
    finally:
        if shared is not None:
            with _for_calls_lock:
                shared[1] -= 1
                if not shared[1]:
                    del _for_calls[id(module)]
                    if not shared[2]:
                        shared[0].put_back(gradients=True)


_for_calls: dict[int, list[Any]] = {}
"""Each module held for calls only (:func:`held_for_call`), by its id: how it was found,
to be put back so, how many calls share the hold, and whether it was held for good
meanwhile (:func:`hold`: its weights changed since it was frozen, and it is frozen again
at them), which no call lets go of."""

_for_calls_lock = ProcessLock()
"""Held while :data:`_for_calls` is changed or looked at."""


def keep_held(name: str, module: nn.Module) -> None:
    """Before a frozen ``module`` that is itself a graph's node runs or its answer is
    recalled (its forward its own, which nothing holds for the call): a part of it put in
    train mode directly is warned of and put back in eval (:func:`check_still`); the
    module released since it was frozen and frozen again, none of its parameters
    requiring grad, is held in eval again, as one trained and frozen again is."""
    if is_held(module):
        check_still(name, module)
    elif not any(parameter.requires_grad for parameter in module.parameters()):
        hold(module)


def check_still(name: str, module: nn.Module) -> None:
    """Warns (:class:`StillChanging`) and puts back in eval any part of a frozen module
    found in train mode, before it runs. A part put in since the module was held
    (``encoder.norm = nn.BatchNorm1d(5)``, made in train mode) was put in train mode by
    nobody: it is put in eval with the rest, without a warning."""
    training = [(part, sub) for part, sub in module.named_modules() if sub.training]
    if not training:
        return
    moving = [part for part, sub in training if "train" in vars(sub)]
    if len(moving) < len(training):
        _hold_parts(module)  # those put in since: a mode asked of them later is warned of
    if not moving:
        _in_eval(module)
        return
    shown = ", ".join(f"`{p}`" if p else "the module itself" for p in moving[:5])
    more = f" and {len(moving) - 5} more" if len(moving) > 5 else ""
    warnings.warn(
        f"`{name}` is frozen, and {shown}{more} of it was in train mode: it would still change "
        "as it runs (dropout drawing, BatchNorm updating its statistics), so its answers would "
        "not follow from its key. It was put back in eval. Something called `.train()` on a "
        "part of it directly; call `somatize.torch.freeze` again after changing it on purpose",
        StillChanging,
        stacklevel=outside_level(),
    )
    _in_eval(module)


_LIBRARIES = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (__file__, somatize.__file__ or "", torch.__file__)
)
"""The folders of somatize's and torch's own code, whose frames a warning skips."""


def outside_level() -> int:
    """The ``stacklevel`` at which a warning raised by this function's caller points at
    the first frame outside somatize and torch: the user's line that called a module,
    however deep in somatize's lookup (or torch's ``Module.__call__``) the warning is
    raised."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
        level += 1
    return level


class ModuleNode(Node):
    """A node whose work is an ``nn.Module``: ``forward(x, ctx)`` calls it on ``x``.

    Its identity is the module's class (``package.module:Encoder``), its
    declaration the module's structure as ``repr`` shows it plus how it is
    called, and its state — once frozen — the digest of its weights and buffers.
    ``spread=True`` calls the module with the items of a tuple input as separate
    arguments. ``call`` runs instead of the module itself (``wrap`` passes the fx
    code that calls it with its constant arguments), while the module stays what
    is frozen and named.

    ``ModuleNode(module)`` holds the instance it is given and runs where the graph
    is called or on a local worker. :meth:`build` makes one from the module's class
    and constructor arguments, which a network worker can rebuild.
    """

    holds_state = True
    _made: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    _built: tuple[dict[str, Any], dict[str, Any]] | None = None  # settings, hooks
    _watch: StateWatch | None = None
    _settings: SettingsWatch | None = None
    _declared: tuple[SettingsWatch | None, dict[str, Any]] | None = None
    """What the declaration taken last named of what the module keeps beside its weights
    (:meth:`_beside_weights`), with the watch of it taken before it was read: what a
    forward that ran since keeps beside its weights is compared with it
    (:meth:`changed_as_it_ran`)."""
    _keys_precision = True
    """Whether its declaration names the precision it runs in (where it is not torch's
    default): not where what calls it keys that itself (a wrapped model's cached part, a
    per-row cache), by the device of the inputs it is handed."""
    _precision_at: Named | None = None  # what its declaration last named

    def __init__(
        self,
        module: nn.Module,
        *,
        spread: bool = False,
        call: Any = None,
        declared: Any = None,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"a ModuleNode holds an nn.Module, got a `{type(module).__name__}`")
        self.module = module
        self.spread = spread
        self.call = call if call is not None else module
        self.declared = declared
        identity = identity_of(named_class(module))
        if identity is not None:
            self._smz.identity = identity

    @classmethod
    def build(cls, module: type[nn.Module], /, *args: Any, **kwargs: Any) -> ModuleNode:
        """A node holding ``module(*args, **kwargs)``, which another process rebuilds the
        same way: ``ModuleNode.build(Encoder, width=32)``.

        ``module`` is a class defined at module level (where a worker can import it)
        and the arguments are canonical values (numbers, strings, lists, dicts of
        them). Frozen and placed on a network worker (``.frozen().at("w1")`` and
        :func:`freeze`), the node is constructed there from its class and arguments
        and loaded with its frozen weights, sent once. Here it is a ModuleNode like
        any other: same key, same answers, as ``ModuleNode(module(*args, **kwargs))``.
        """
        if not (isinstance(module, type) and issubclass(module, nn.Module)):
            raise TypeError(
                "ModuleNode.build takes a module class and its constructor arguments, e.g. "
                f"`ModuleNode.build(Encoder, width=32)`; got a `{type(module).__name__}` "
                f"({module!r}). For a module you already have, use `ModuleNode(module)`"
            )
        node = cls(module(*args, **kwargs))
        node._made = (tuple(args), dict(kwargs))
        node._built = (settings_of(node.module), hooks_of(node.module))
        return node

    def recipe(self) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
        kind = type(self.module).__qualname__
        if self._made is None:
            raise Unbuildable(
                f"it holds a `{kind}` instance, and no other process can rebuild a module from "
                f"an object. Build the node from the module's class and its constructor "
                f"arguments — `ModuleNode.build({kind}, ...)` with canonical values — so the "
                "worker constructs the module itself and loads the frozen weights into it, "
                'or place it on a `Worker.generic(mode="local")` worker'
            )
        named = named_class(self.module)
        if identity_of(named) is None:
            why, fix = nameless_because(named)
            raise Unbuildable(
                f"`{kind}` {why}, so no other process can find it. {fix}, in a module the "
                "worker can import"
            )
        maker = identity_of(type(self))
        if maker is None:
            why, fix = nameless_because(type(self))
            raise Unbuildable(
                f"`{type(self).__qualname__}` {why}, so no other process can find it. {fix}"
            )
        _refuse_changed_since_built(self)
        _refuse_precision_not_sent(self)
        args, kwargs = self._made
        return f"{maker}.build", args, kwargs

    def restate(
        self, tied: Callable[[], None] | None = None, *, looked: bool = False
    ) -> str | None:
        """Once frozen: the digest of the module's state if it changed since (a checkpoint
        loaded, a submodule replaced, the module converted to another dtype; see
        :class:`StateWatch`, asked thoroughly), the module held frozen again and the
        node's state set to it; None if nothing changed.

        Asked before each lookup, it also warns (:class:`StillChanging`) of a part put in
        train mode directly (``encoder.drop.train()``) and puts it back in eval, as a run
        does: the answer recalled for it is the one it computes in eval. A part put
        in place of another (in train mode, as a module is made) is held in eval with the
        rest, without a warning. ``looked``: the call's :func:`held_for_call` looked at the
        parts' modes just now, and they are not walked again.

        ``tied``, where the module is a part of a larger model (a wrapped model's declared
        submodule), is called when the state changed, before the module is held frozen
        again: it refuses a parameter put in since that a part left to train shares."""
        name = self._smz.name or repr(self)
        state, self._watch = restated(name, self.module, self._watch, tied, looked=looked)
        if state is not None:
            self._smz.state = state
            # What the parts keep beside their weights is watched anew too, on the parts
            # held now: one put in since (`encoder[1] = bn`) is watched for a value set on
            # it later.
            self.look_at_settings_again()
        return state

    def state_bytes(self) -> bytes:
        """The module's parameters and buffers by name, as ``tensor`` codec bytes: their
        values, detached (the codec writes plain tensors, and :meth:`load_state` copies
        values into the module's own parameters); and those of each module it computes
        with beyond its own parts (:func:`~somatize_torch._state.modules_read`), which its
        state digest reads too, under the name it is read as."""
        tensors = _state_tensors(self.module, _modules_read(self.module))
        state = {name: t.detach() for name, t in tensors.items()}
        return b"".join(TENSOR.encode(state))

    def load_state(self, data: memoryview) -> str:
        """Copies the tensors :meth:`state_bytes` wrote into this node's module (rebuilt
        by :meth:`build`), holds it frozen in eval, and answers the digest of its state. A
        tensor sent in another floating-point (or complex) dtype than the module built here
        holds — the client's module was converted, ``encoder.double()`` — is converted
        here first, as ``module.to(dtype)`` would, and one laid out in another order of its
        dims (channels_last) is laid out so here; any other difference is StateDoesNotFit.
        The tensors of a module it computes with beyond its own parts are copied into the
        one it reads here (a global of its module, one a partial it keeps binds), which its
        constructor does not give the client's weights; whether they require grad is left
        as it is there (in this very process, they are the client's own)."""
        with warnings.catch_warnings():
            # Where the tensors lived does not matter: they are copied into the module.
            warnings.simplefilter("ignore", LandedOnHost)
            sent = TENSOR.decode(data)
        kind = type(self.module).__qualname__
        read = _modules_read(self.module)
        mine = _state_tensors(self.module, read)
        if not isinstance(sent, dict) or set(sent) != set(mine):
            got = sorted(sent) if isinstance(sent, dict) else type(sent).__name__
            raise StateDoesNotFit(
                f"the state sent for `{kind}` names {got}, and the `{kind}` built here has "
                f"{sorted(mine)}: the worker runs other code than the client. Install the "
                "same version of the code everywhere the graph runs"
            )
        for name, tensor in mine.items():
            came = sent[name]
            if came.shape == tensor.shape and _converted(tensor.dtype, came.dtype):
                continue  # the client's module was converted (`.double()`): taken below
            if came.shape != tensor.shape or came.dtype != tensor.dtype:
                raise StateDoesNotFit(
                    f"`{kind}`'s `{name}` was sent as {came.dtype} {tuple(came.shape)}, and the "
                    f"module built here holds {tensor.dtype} {tuple(tensor.shape)}: the worker "
                    "runs other code than the client. Install the same version of the code "
                    "everywhere the graph runs"
                )
        with torch.no_grad():
            for name, tensor in mine.items():
                came = sent[name]
                # As `module.to(dtype)` converts it, and laid out as the client's is
                # (`module.to(memory_format=torch.channels_last)`, which the codec keeps): a
                # kernel picks its path, and the layout of its answer, by it.
                if came.dtype != tensor.dtype or came.stride() != tensor.stride():
                    tensor.data = torch.empty_strided(
                        came.shape, came.stride(), dtype=came.dtype, device=tensor.device
                    )
                tensor.copy_(came)
        hold(self.module)
        # Watched from here, so a worker sees its forward change the state it loaded (a
        # buffer it counts in): :meth:`restate` says so, cheaply when nothing changed.
        digest, self._watch = watched_state(self.module)
        return digest

    def kind_name(self) -> str:
        return type(self.module).__qualname__

    def implementing_class(self) -> type:
        return type(self.module)

    def implementing_classes(self) -> tuple[type, ...]:
        return classes_of(self.module)

    def declare(self) -> Any:
        kind = named_class(self.module)
        if identity_of(kind) is None:
            why, fix = nameless_because(kind)
            raise Undeclared(
                f"`{kind.__qualname__}` {why}, so nothing names it the same way in another "
                f"process and its answers cannot be keyed. {fix}"
            )
        watch = self._settings  # taken before what it names is read: a change since is seen
        beside = self._beside_weights()
        self._declared = (watch, beside)
        self._keyed_here()
        declared = {
            "module": repr(self.module),
            "spread": self.spread,
            "call": self.declared,
            **beside,
        }
        if self._keys_precision:
            precision = _precision_of(self.module)
            if precision != self._precision_at:
                # Taken in another precision than the one named last (a second graph
                # built with the node out of the autocast the first ran under): each
                # graph that keys the node by the one named last is told, as of a
                # change told to the graph that asks first, and takes it again.
                self._smz.moved += 1
                self._precision_at = precision
            if precision is not None:  # only then, so the usual key does not change
                declared["precision"] = dict(precision)
        return declared

    def _beside_weights(self) -> dict[str, Any]:
        """What the declaration names of what the module keeps beside its weights: its
        settings, its forward hooks, and the modules it computes with beyond its own
        parts."""
        beside: dict[str, Any] = {"settings": settings_of(self.module)}
        hooks = hooks_of(self.module)
        if hooks:  # only then, so a module without hooks keeps the key it had
            beside["hooks"] = hooks
        read = _modules_read(self.module)
        if read:  # only then, so the usual key does not change
            beside["read"] = {one.label: _declared_read(one.module) for one in read}
        return beside

    def __getstate__(self) -> Any:
        # The watch is not copied (the copy's module is watched afresh: `__setstate__`); it
        # holds the code of the functions the module keeps, which does not pickle.
        # Nor are the calls each thread keyed (a thread's own, which does not pickle either).
        state = {name: value for name, value in vars(self).items() if name not in _UNCOPIED}
        if self._declared is not None:  # what it names, without the watch it was taken with
            state["_declared"] = (None, self._declared[1])
        return state

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        # The copy's module holds its values in tables of its own, not the ones a copied
        # watch would look at: it is watched afresh.
        for name in _UNCOPIED:
            vars(self).pop(name, None)

    def _here(self) -> threading.local:
        """What this thread's call of the node was keyed by (``keyed``: the watch of its
        weights, and the declaration of what it keeps beside them with the watch of that,
        as :meth:`_keyed_here` noted them) and whether its forward wrote into its weights
        (``state_moved``). One node called from several threads at once (a server's
        request threads calling one graph, wrapped model or row cache) has each call
        checked, after it ran, against what its own key was taken from: another thread's
        call taking the watches again meanwhile (a value or checkpoint given to the module
        since) would have a call keyed before the change compared with the module as it is
        after it, and its answer, computed with the new value, kept under the old key."""
        here: threading.local | None = vars(self).get("_threads")
        if here is None:
            here = vars(self).setdefault("_threads", threading.local())
        return here

    def _keyed_here(self) -> None:
        """Notes, for this thread, that the call it keys now is keyed by the weights
        :attr:`_watch` watches and by the declaration taken last (:attr:`_declared`): asked
        where a call is keyed (:meth:`declaration_moved`, after :meth:`restate`, and
        :meth:`declare`). Nothing where no declaration was taken with a watch (a worker's
        copy, rebuilt to run a call the client keyed): its call is checked against what it
        keeps as watched last."""
        declared = self._declared
        watched = declared is not None and declared[0] is not None
        self._here().keyed = (self._watch, declared) if watched else None

    def keyed_as(self, other: ModuleNode) -> None:
        """Has this thread's call of this node checked against what its call of ``other``
        was keyed by (a shim making another call of a wrapped model's node, keyed as that
        node)."""
        self._here().keyed = getattr(other._here(), "keyed", None)

    def declaration_moved(self) -> bool:
        """Whether a plain value or function the module keeps, or a forward hook, may have
        changed since this was last asked (:class:`~somatize_torch._settings.SettingsWatch`;
        yes when first asked), so that its declaration is taken again: one made from outside,
        or by the module's own forward as it ran (:meth:`changed_as_it_ran`). So is, where the
        node names the precision it runs in, when that is another now (autocast entered,
        ``torch.set_default_dtype``, TF32 turned on)."""
        watch = self._settings
        moved = (
            (self._keys_precision and _precision_of(self.module) != self._precision_at)
            or watch is None
            or watch.changed()
        )
        if moved:
            # Watched from here (where the precision moved too: a forward with no watch
            # taken keeps nothing).
            self._settings = self._watched(watch)
        self._keyed_here()
        return moved

    def _watched(self, watch: SettingsWatch | None) -> SettingsWatch:
        """A watch of what the module keeps beside its weights, taken now (from ``watch``,
        the one before)."""
        return SettingsWatch(self.module, watch, modules_read(self.module, classes_of(self.module)))

    def changed_as_it_ran(self) -> bool:
        """Whether the forward that just ended may have changed what the module keeps
        beside its weights (a cache of keys it appends to, a table it fills as it first
        runs, a count of its calls), or its weights and buffers (a running sum it adds
        into a buffer in place): its answer is then not kept, since a recall would not
        make the change and the module would answer the next call otherwise when an answer
        is computed than when it is recalled. The watches are left as they were, so the
        next call sees the change, as one made from outside, and is keyed by what the
        module keeps then (:meth:`declaration_moved`, :meth:`restate`). Yes where no watch
        of what it keeps beside its weights was taken yet. A value the forward gave anew
        as it was (``self.width = x.shape[-1]``, a new object at each call) is no change:
        where the watch saw one, what the declaration names is looked at, and the watch
        taken again where it names all as the declaration taken last did."""
        here = self._here()
        if getattr(here, "state_moved", False):
            return True
        keyed = getattr(here, "keyed", None)
        last = self._declared
        if keyed is not None:  # what this thread's call was keyed by
            watch, beside = keyed[1]
        else:  # a local worker's thread, which keys nothing: by what was keyed last
            watch, beside = self._settings, None if last is None else last[1]
        if watch is None:
            return True
        if not watch.changed():
            return False
        # Taken before the look, so a value given from another thread since is seen by one.
        again = self._watched(watch)
        try:
            if beside is None or self._beside_weights() != beside:
                return True
        except NotCanonical:  # refused as the declaration is taken again, naming it
            return True
        if last is not None and last[1] is beside:  # no declaration taken since
            self._settings = again
            self._declared = (again, last[1])
            self._keyed_here()
        return False

    def look_at_settings_again(self) -> None:
        """Has the next :meth:`declaration_moved` say yes: the one that said so last was
        stopped (a Ctrl-C) before what it was told of was taken in (the declaration worked
        out anew), and the change would otherwise never be told again."""
        self._settings = None

    def forward(self, x: Any, ctx: Any) -> Any:
        name = ctx.name if ctx is not None else repr(self)
        if self._watch is None:  # not frozen by `freeze`: its modes are its own
            if is_held(self.module):
                check_still(name, self.module)
            return self._run(x, ctx)
        # Its answer is kept, or keys those of the cached nodes below it: released since it
        # was frozen, the module runs in eval all the same, and is let go of after.
        with held_for_call(name, self.module):
            return self._run(x, ctx)

    def _run(self, x: Any, ctx: Any) -> Any:
        """:meth:`forward`, the module held as it is to run."""
        # Where the call is the module's own (not a wrapped model's cached part, which
        # refuses a draw itself), a frozen node's answer is refused if the module drew:
        # kept, or keying the answers of the cached nodes below it (by what it was handed,
        # as a frozen node's answer follows from that), a draw would be recalled.
        drawn = self._smz.frozen and self.call is self.module
        generators = generator_states(self.module, x) if drawn else None
        spread = self.spread and isinstance(x, (tuple, list))
        here = self._here()
        keyed = getattr(here, "keyed", None)
        if keyed is not None:
            # The weights this thread's call is keyed by: a change since it was keyed (a
            # checkpoint another thread loaded as this forward ran the nodes before it) is
            # one the answer may be computed with, and it is not kept.
            state, still = keyed[0], True
        else:  # a local worker's thread, which keys nothing: the weights as they are now
            state = self._watch
            still = state is not None and not state.changed()
        with self._keyed_autocast(ctx):
            out = self.call(*x) if spread else self.call(x)
        # Weights or buffers the forward wrote into (a running sum added into a buffer).
        here.state_moved = still and state is not None and state.changed()
        if generators is not None and drew_as_it_ran(
            self.module,
            x,
            generators,
            lambda y: self._call_again(y, spread, ctx),
            self.kept_as_keyed,
        ):
            raise FreezeError(
                drew_at_random(
                    f"{self!r} is frozen",
                    "its answer is taken to follow from what it is handed, so one kept, or one "
                    "a cached node below it answered from",
                    "`.frozen()`",
                )
            )
        return out

    def kept_as_keyed(self) -> bool:
        """Whether the module keeps what this thread's call was keyed by — its weights and
        buffers, and what it keeps beside them — as the forward that just ran left it: a
        call that changed none of it (a cache of keys it appends to, a count of its calls)
        may be run again, for what it draws. No where the call was keyed by nothing (a
        local worker's thread)."""
        keyed = getattr(self._here(), "keyed", None)
        if keyed is None:
            return False
        state, (watch, _) = keyed
        return not (state is None or state.changed() or watch is None or watch.changed())

    def _call_again(self, x: Any, spread: bool, ctx: Any) -> None:
        """Runs the call once more, as :meth:`forward` ran it, for what it draws."""
        with self._keyed_autocast(ctx):
            self.call(*x) if spread else self.call(x)

    def _keyed_autocast(self, ctx: Any) -> contextlib.AbstractContextManager[Any]:
        """Where the node names the precision it runs in, is frozen (its declaration then
        taken again at each call where that changed) and runs on a local worker (a thread,
        handed the autocast of the thread that called the forward, which may be another
        than the one its key named last): the autocast its key named, if another is in
        force there, so that the answer kept under the key is computed as it says.
        Where the graph is called, the caller's own autocast is the one its forward keyed
        the node by: the one named last may be another thread's, whose forward of the same
        graph in another precision took the node's declaration since. A node not frozen
        runs as it is called: nothing keys its answers."""
        if not self._keys_precision or not self._smz.frozen or ctx is None or ctx.worker is None:
            return contextlib.nullcontext()
        named = dict(self._precision_at or ()).get("autocast")
        device = _device_type(self.module)
        if dict(precision_on(device) or ()).get("autocast") == named:
            return contextlib.nullcontext()
        if named is None:
            return torch.autocast(device, enabled=False)
        return torch.autocast(device, dtype=getattr(torch, named))

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<ModuleNode {type(self.module).__qualname__}{f' {name!r}' if name else ''}>"


_UNCOPIED = ("_settings", "_threads")
"""What a copy of a :class:`ModuleNode` (``copy.deepcopy``, a pickle) does not take: the
watch of what its module keeps beside its weights, which the copy takes afresh of its own
module, and what each thread's call was keyed by."""


def _modules_read(module: nn.Module) -> tuple[Read, ...]:
    """The modules ``module`` computes with beyond its own parts
    (:func:`~somatize_torch._state.modules_read`)."""
    return modules_read(module, classes_of(module)).found


def _declared_read(module: nn.Module) -> dict[str, Any]:
    """What a module's declaration names of a module it computes with beyond its own
    parts (:func:`~somatize_torch._state.modules_read`), whose modes are not held as its
    parts' are: its structure, settings, forward hooks and the mode of each of its parts."""
    declared = {
        "module": repr(module),
        "settings": settings_of(module),
        "training": [part.training for part in module.modules()],
    }
    hooks = {name: found for name, found in hooks_of(module).items() if name != "*"}
    if hooks:
        declared["hooks"] = hooks
    return declared


def restated(
    name: str,
    module: nn.Module,
    watch: StateWatch | None,
    tied: Callable[[], None] | None = None,
    *,
    for_good: bool = False,
    looked: bool = False,
) -> tuple[str | None, StateWatch | None]:
    """What :meth:`ModuleNode.restate` answers of ``module``, frozen at a state ``watch``
    has watched since (named ``name`` in a warning), and the watch from here on: the
    digest of its state if it changed since, the module held frozen again; None if
    nothing changed, a part put in train mode directly put back in eval, with a warning.
    The module released since, called with its gradients off, is left as its user left
    it: the call holds it in eval for its run (:func:`held_for_call`); with ``for_good``
    (a node that is itself the module, whose forward nothing holds it for), it is held in
    eval again here (:func:`keep_held`). On a change, ``tied`` (if given) is called
    before the module is held: holding it would turn off the gradient of a parameter put
    in since that a part left to train holds too."""
    # Thoroughly: a conversion (`encoder.double()`) swaps each tensor's memory and
    # bumps no version counter, and the answers it computes after are others.
    if watch is None or not watch.changed(thorough=True):
        if watch is not None and for_good:  # frozen, and no parameter came to require grad since
            keep_held(name, module)
        elif is_held(module) and not looked:  # looked at just now otherwise
            check_still(name, module)
        return None, watch
    unfrozen = watch.unfrozen(module)
    if unfrozen:
        raise unfrozen_error(module, unfrozen)
    # Tensors put in since (`load_state_dict(..., assign=True)`) are looked at as
    # freezing looked at the first ones; only on a change, so it costs nothing otherwise.
    refuse_unseen_state(type(module).__name__, module)
    if tied is not None:
        tied()
    hold(module)
    return watched_state(module)


def watched_state(module: nn.Module) -> tuple[str, StateWatch]:
    """The digest of the state a frozen ``module`` is keyed by, and the watch of it from
    here (taken first: a change as the digest reads it is seen next): its weights and
    buffers, and those of each module its code reads from a name of its module
    (:func:`~somatize_torch._state.modules_read`: ``NORM = nn.LayerNorm(3)`` called by its
    forward), whose weights changed in place, or the name rebound, key its answers anew.
    Such a module whose state cannot be seen is refused as one of its parts would be
    (:func:`refuse_unseen_state`)."""
    read = modules_read(module, classes_of(module))
    for one in read.found:
        refuse_unseen_state(one.label, one.module)
    watch = StateWatch(module, read)
    return digest_state(module, read.found), watch


_WATCH = "_somatize_watch"
"""Where a node that is itself an ``nn.Module`` keeps the watch of its state, among its
attributes (a copy of the node watches its own, as a ModuleNode's copy does): named so
that no attribute of the module's own class is taken for it."""


def _restate_module(node: Any) -> str | None:
    """:meth:`~somatize.node.Node.restate` of a node that is itself an ``nn.Module``, whose
    class writes none (registered with :func:`~somatize.node.restates`): a ModuleNode's,
    of its own state, watched from ``freeze`` on. Its class says nothing of its weights,
    and a checkpoint loaded into it after ``freeze`` went on being keyed by the weights
    before."""
    name = node._smz.name or type(node).__qualname__
    state, watch = restated(name, node, vars(node).get(_WATCH), for_good=True)
    if watch is not None:
        vars(node)[_WATCH] = watch
    if state is not None:
        node._smz.state = state
    return state


restates(nn.Module, _restate_module)
# Every other node's key names the precision a forward is called in, where it is not the
# default; a ModuleNode's declaration names it itself, by the device its weights are on.
keyed_by_precision(settings, ModuleNode, entered)


def drew_at_random(who: str, recalled: str, drop: str) -> str:
    """What refuses a module that drew from torch's generator (:func:`generator_states`)
    where its answer would be ``recalled``: ``who`` it is, and ``drop`` what to drop."""
    return (
        f"{who}, and it drew from torch's random number generator (`torch.randn_like`, "
        "`F.dropout(x, training=True)`, a `torch.Generator` it holds): "
        f"{recalled} would be recalled with the one draw it "
        "was computed with, where a call draws anew. Draw only in training "
        f"(`training=self.training`: a frozen module runs in eval), or drop {drop}"
    )


def generator_states(
    module: nn.Module, args: Any, tables: list[dict[str, Any]] | None = None
) -> list[bytes]:
    """The states of the generators a call of ``module`` may draw from: each
    ``torch.Generator`` the module or a submodule holds as an attribute (or in a list,
    tuple or dict it holds), and torch's default ones: the host's, and each CUDA device's
    that an argument or a tensor of the module is on (CUDA is not initialised for this).
    ``tables``: the tables of attributes of the module's parts, as each stands for
    (:func:`part_tables`), where the caller keeps them listed for the parts the module
    has now; they are listed here otherwise."""
    states = [torch.random.get_rng_state().numpy().tobytes()]
    held = _held_generators(part_tables(module) if tables is None else tables)
    states.extend(generator.get_state().numpy().tobytes() for generator in held)
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # no CUDA draw
        return states
    tensors = [a for a in tree_leaves(args) if isinstance(a, torch.Tensor)]
    tensors.extend(_state_tensors(module).values())
    for device in sorted({t.device for t in tensors if t.is_cuda}, key=str):
        states.append(torch.cuda.get_rng_state(device).numpy().tobytes())
    return states


def drew_as_it_ran(
    module: nn.Module,
    args: Any,
    generators: list[bytes],
    again: Callable[[Any], object],
    still: Callable[[], bool],
    tables: list[dict[str, Any]] | None = None,
) -> bool:
    """Whether a call of ``module`` on ``args`` (one row of them, where it is handed rows)
    drew from torch's generator as it ran: the states of the generators it may draw from
    moved since ``generators`` (:func:`generator_states`, taken before it ran), and
    ``again``, the call run again on a copy of ``args`` (a forward that writes into what it
    is handed writes into the copy, not twice into the caller's), draws in this thread.
    Those generators are the
    process's: another thread drawing meanwhile (a loader fetching ahead that draws a
    crop, another model sampling) moves them as the module's own draw does, and only a
    draw of the call's own thread is the module's. A call that changed what the module
    keeps (``still`` says no: a cache of keys it appends to), which running it again
    would change once more, or one that cannot be run again so (it raises), is taken to
    have drawn: its draw cannot be told apart from another thread's. ``tables`` as
    :func:`generator_states` takes them."""
    if generator_states(module, args, tables) == generators:
        return False
    if not still():
        return True
    seen = DrawsSeen()
    try:
        with seen, torch.no_grad():
            again(tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, args))
    except Exception:
        return True
    return seen.drew


# What torch keeps on every module (its parameters, buffers, submodules, hooks): none of
# it a generator, so not looked through at each call.
_MODULE_OWN = frozenset(vars(nn.Module()))

_PLAIN = frozenset({int, float, bool, str, type(None)})
"""The kinds of most values a module keeps (a convolution's sizes, a norm's epsilon), none
of them a generator: passed over at once, as every part is looked through at each
computed call."""


def part_tables(module: nn.Module) -> list[dict[str, Any]]:
    """The table of attributes of each part of ``module`` (itself included), as the part
    stands for (:func:`~somatize_torch._settings.stood_for`): what
    :func:`generator_states` looks through. The tables themselves, not copies: an
    attribute set on a part later is in its table, so a list of them holds for as long as
    the module has the same parts, and a caller computing batch after batch lists them
    once for those parts rather than walk the module twice a batch."""
    return [vars(part) for part in map(stood_for, module.modules())]


def _held_generators(tables: list[dict[str, Any]]) -> Iterator[torch.Generator]:
    """The ``torch.Generator`` objects held in ``tables`` (:func:`part_tables`) as
    attributes, directly or in a list, tuple or dict (``self.noise = torch.Generator()``)."""
    for table in tables:
        for name, value in table.items():
            if name in _MODULE_OWN or type(value) in _PLAIN:
                continue
            if isinstance(value, dict):
                value = list(value.values())
            for item in value if isinstance(value, (list, tuple)) else (value,):
                # By its class's bases: `isinstance` goes through torch's Python hook.
                if type(item) not in _PLAIN and torch.Generator in type(item).__mro__:
                    yield item


def _precision_of(module: nn.Module) -> Named | None:
    """The precision ``module`` runs in now, on the device type its weights are on
    (:func:`_device_type`), named only where it is not torch's default
    (:func:`~somatize_torch._precision.precision_on`)."""
    return precision_on(_device_type(module))


def _device_type(module: nn.Module) -> str:
    """The device type ``module``'s first weight (or buffer) is on, the host's if it holds
    none."""
    held = next(itertools.chain(module.parameters(), module.buffers()), None)
    return held.device.type if held is not None else "cpu"


def _refuse_changed_since_built(node: ModuleNode) -> None:
    """Refuses to send a module whose settings or forward hooks were changed after
    :meth:`ModuleNode.build` made it (``enc.module.temperature = 5.0``): another process
    builds it from its class and arguments, and would compute without the change."""
    if node._built is None:
        return
    settings, hooks = settings_of(node.module), hooks_of(node.module)
    built, hooked = node._built
    keys = sorted(settings.keys() | built.keys())
    changed = [key for key in keys if settings.get(key, _GONE) != built.get(key, _GONE)]
    said = [few(changed)] if changed else []
    if hooks != hooked:
        said.append("its forward hooks")
    if said:
        kind = type(node.module).__qualname__
        raise Unbuildable(
            f"{' and '.join(said)} of the `{kind}` changed after `ModuleNode.build` made it, "
            "and a worker that rebuilds it from its class and arguments would compute "
            f"without the change. Pass the value to the constructor (`ModuleNode.build({kind}, "
            '...)`), or place the node on a `Worker.generic(mode="local")` worker'
        )


def _refuse_precision_not_sent(node: ModuleNode) -> None:
    """Refuses to send a module whose key names an autocast: autocast holds for the thread
    that entered it, and a worker in another process would compute in its own precision
    an answer the key does not describe. The settings of the whole process its key names
    (another default dtype, TF32) are the worker's to share or not: the copy rebuilt there
    declares them, and is refused there where they differ."""
    named = dict(_precision_of(node.module) or ()) if node._keys_precision else {}
    if "autocast" not in named:
        return
    kind = type(node.module).__qualname__
    raise Unbuildable(
        f"the `{kind}` is called under autocast ({named['autocast']}), which its key names, "
        "and a worker that rebuilds it in another process rebuilds and checks its copy out "
        "of autocast, in the precision of its own: the copy would not be the node the key "
        "describes. Call it outside "
        "`torch.autocast`, enter autocast inside the module's forward, or place the node on "
        'a `Worker.generic(mode="local")` worker'
    )


_GONE = object()


def _holds_weights(node: Node) -> bool | str:
    """Whether ``node`` holds weights its class does not say it holds: True when it is itself
    an ``nn.Module`` (a torch node, which ``freeze`` settles); what it keeps, in words, when it
    keeps a parameter, or a module with parameters or buffers, as an attribute or in a list,
    tuple or dict it keeps as one (:func:`~somatize_torch._settled.kept_weights`)."""
    if isinstance(node, nn.Module):
        return True
    for name, value, part in kept_weights(node):
        if isinstance(part, nn.Parameter):
            return f"keeps `self.{name}`, {'' if part is value else 'holding '}a parameter"
        held = "an nn.Module" if part is value else "holding an nn.Module"
        return f"keeps `self.{name}`, {held} with weights"
    return False


sees_state(_holds_weights)
watches_settled(watch_kept_weights)


def module_of(node: Node) -> nn.Module | None:
    """The module a torch node holds, or None for a node that is not one."""
    if isinstance(node, ModuleNode):
        return node.module
    if isinstance(node, nn.Module):
        return node
    return None


def named_class(module: nn.Module) -> type:
    """The class ``module`` is named by: its own, or the one it was made as where torch
    parametrized the module itself (``register_parametrization``, ``weight_norm``). torch
    moves such a module into a class it makes as it does so, ``Parametrized<Name>``, a
    subclass of the module's own that no module holds under its name; what it adds is
    the parametrizations, parts of the module (``parametrizations``) named in its
    declaration, their weights in its state, as a parametrized part's are. A model made by
    :func:`somatize.torch.wrap` is named by the class of the model it wraps
    (:func:`~somatize_torch._settings.stood_for`), and a module compiled by
    ``torch.compile`` by the class of the module it compiles (its declaration says it is
    compiled), not by torch's wrapper, whose attributes the key leaves out."""
    module = stood_for(module)
    while _compile_wrapper(module):
        module = stood_for(cast(nn.Module, module._modules["_orig_mod"]))
    kind = type(module)
    if kind.__module__ == parametrize.__name__ and parametrize.is_parametrized(module):
        return kind.__bases__[0]
    return kind


def classes_of(module: nn.Module) -> tuple[type, ...]:
    """The classes whose code computes what ``module`` answers: its own and those of its
    submodules, each once, in the order ``modules()`` finds them, then those of the
    configs they hold (a default their class gives, a property, is read through their
    code). The code fingerprint of a torch node covers them all (torch's own classes and
    the standard library's left out, by :func:`~somatize.catalog.fingerprint_of`), so an
    edited block of a model, or config class, is seen. A model made by
    :func:`somatize.torch.wrap` computes with the code of the model it wraps
    (:func:`~somatize_torch._settings.stood_for`)."""
    parts = list(map(stood_for, module.modules()))
    configs = _configs_in([vars(part) for part in parts])
    return tuple(dict.fromkeys([*map(type, parts), *map(type, configs)]))


def keyed_with(module: nn.Module) -> tuple[Any, ...]:
    """What of ``module`` is keyed and watched as its state, not as code: it and its
    submodules (their weights digested, their modes held or read where they run), their
    parameters and buffers. A class of theirs whose function closes over one of these,
    takes it by default or binds it in a partial (``def make(sub): class M: def
    __init__(s): s.encoder = sub``), or one that holds it in a list, tuple or dict (or a
    ``ModuleList`` the model does not hold: ``parts[0](x)``), reaches that very object,
    watched by identity (:func:`~somatize.catalog.watch_code`), so freezing it is no change
    of that code. A row cache among them holds its module's parts, not the module itself
    (it stands in its place), which is one of these too."""
    from somatize_torch.rows import CachedRows  # rows builds on this module

    parts = list(module.modules())
    parts += [part.module for part in parts if isinstance(part, CachedRows)]
    parts += [stood_for(part) for part in parts if stood_for(part) is not part]
    return (*parts, *module.parameters(), *module.buffers())


def freeze(target: Graph | Wrapped, *names: str) -> dict[str, str]:
    """Freezes the frozen torch nodes of ``target`` (a graph, or a module from
    :func:`somatize.torch.wrap`) — all of them, or only ``names`` — and returns each
    one's state digest by name. See the module docstring for what freezing does."""
    from somatize_torch.wrap import Wrapped

    graph = target.graph if isinstance(target, Wrapped) else target
    if not isinstance(graph, Graph):
        raise TypeError(
            f"freeze takes a somatize Graph or a module made by `somatize.torch.wrap`, got a "
            f"`{type(target).__name__}`. Wrap the model first: "
            "`somatize.torch.wrap(model, frozen=[...])`"
        )
    memory = graph.memory
    if names:
        chosen = [graph.resolve(name) for name in names]
        for name in chosen:
            if not memory.is_frozen(name):
                raise NotDeclaredFrozen(
                    f"`{name}` is not declared frozen, so freezing it would settle a node the "
                    "graph still treats as changing: its answers would be keyed as if it were "
                    f"settled while it trains. Declare it frozen (`.frozen()`, or "
                    f"`wrap(model, frozen=[{name!r}])`) and freeze again"
                )
            if module_of(graph.node(name)) is None:
                raise NotATorchNode(
                    f"`{name}` ({graph.kind_of(name)}) holds no torch module, so there are no "
                    "weights to freeze. A dataset is settled with `somatize.data.settle(g)`"
                )
    else:
        chosen = [
            name
            for name in graph.nodes()
            if memory.is_frozen(name) and module_of(graph.node(name)) is not None
        ]
        if not chosen:
            raise NothingToFreeze(
                "this graph declares no frozen torch node, so there is nothing to freeze: "
                "declare the modules whose weights do not change (`.frozen()`, or "
                "`wrap(model, frozen=['encoder'])`)"
            )
    for name in chosen:  # refused before anything is held
        refuse_unseen_state(name, module_of(graph.node(name)))
    if isinstance(target, Wrapped):
        target._refuse_tied()
    out: dict[str, str] = {}
    for name in chosen:
        node = graph.node(name)
        module = module_of(node)
        assert module is not None
        hold(module)
        digest, watch = watched_state(module)
        memory.freeze(name, digest)
        node._smz.state = digest
        if isinstance(node, ModuleNode):
            node._watch = watch
        else:
            vars(node)[_WATCH] = watch
        out[name] = digest
        # The values, functions and hooks it keeps may have changed since the graph was
        # built. One that cannot be declared is refused where its key is computed, as it
        # was then.
        with contextlib.suppress(Undeclared):
            memory.declared_as(name, node.declaration(name))
    return out


def refuse_unseen_state(name: str, module: nn.Module | None) -> None:
    """Refuses a module whose state its digest and watch cannot see: parameters a lazy
    module has not made yet, tensors made under
    ``torch.inference_mode()``, which keep no version counter, so a change to them (a
    checkpoint loaded in place) could never be seen, and weights a part keeps packed
    outside its parameters and buffers (torch.ao's quantized modules), which are not
    digested at all. Either way the answers kept for some weights would be recalled for
    others. A TorchScript module, or one holding one, is refused first
    (:func:`refuse_scripted`)."""
    if module is None:
        return
    refuse_scripted(name, module)
    tensors = [*module.named_parameters(), *module.named_buffers()]
    lazy = [part for part, tensor in tensors if is_lazy(tensor)]
    if lazy:
        raise FreezeError(
            f"`{name}` holds parameters or buffers not made yet ({few(lazy)}): a lazy "
            "module (`nn.LazyLinear`) makes them at its first call, so there are no "
            "weights to digest, and nothing to key its answers by. Call the module once "
            "on a batch of the shape it will be given before it is frozen or cached"
        )
    quantized = [part for part, tensor in tensors if tensor.is_quantized]
    if quantized:
        raise FreezeError(
            f"`{name}` holds quantized tensors ({few(quantized)}): their values have no "
            "agreed layout to digest, so nothing could key its answers by them. Keep them "
            "as plain tensors (`tensor.dequantize()`), or leave the module uncached"
        )
    made = [part for part, tensor in tensors if tensor.is_inference()]
    if made:
        raise FreezeError(
            f"`{name}` holds tensors made under `torch.inference_mode()` ({few(made)}): "
            "they keep no version counter, so a change to them (a checkpoint loaded in "
            "place) could not be seen, and answers kept for the old weights would be "
            "recalled for the new. Build or load the module outside `inference_mode` "
            "(`torch.no_grad()` keeps gradients off as well), or clone its tensors there "
            "(a checkpoint made under `inference_mode` and put in with `load_state_dict("
            "..., assign=True)`: load it without `assign`, which copies into the module's "
            "own tensors)"
        )
    packed = [
        f"{prefix}.{attribute}" if prefix else attribute
        for prefix, part in module.named_modules()
        for attribute, value in vars(part).items()
        if isinstance(value, torch.ScriptObject)
    ]
    if packed:
        raise FreezeError(
            f"`{name}` keeps weights packed in objects of torch's C++ side "
            f"({few(packed)}), as the quantized modules of `torch.ao` do "
            "(`quantize_dynamic`, `convert`): they are none of its parameters and "
            "buffers, so its state digest cannot read them, and a module of other weights, "
            "or this one with a checkpoint loaded, would be recalled the answers kept for "
            "these. Cache the module before it is quantized, or leave it uncached"
        )
    _refuse_subclassed(name, tensors)


def _refuse_subclassed(name: str, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Refuses parameters and buffers of a subclass of ``torch.Tensor``: the state digest
    reads their values alone, but what a module answers may hang on their class (its
    ``__torch_function__``) or on what else they carry (a scale kept beside packed
    values), so a module holding the same values as plain tensors, or with another
    scale, would be recalled the answers kept for these. FSDP2's ``DTensor`` is refused
    saying how to shard a model holding a cache instead: sharded whole, the model's
    weights meet the cache gathered, as plain tensors."""
    subclassed = {
        part: type(tensor).__qualname__
        for part, tensor in tensors
        if type(tensor) not in (torch.Tensor, nn.Parameter)
    }
    sharded = [part for part, tensor in tensors if is_dtensor(tensor)]
    if sharded:
        raise FreezeError(
            f"`{name}` holds parameters or buffers that FSDP2 (`fully_shard`) shards, "
            f"as `DTensor`s ({few(sharded)}): each holds only this rank's shard, so "
            "there are no whole weights to digest. Cache the module (`cache_rows`) or "
            "wrap the model (`somatize.torch.wrap`) before `fully_shard`, then shard the "
            "model holding the cache (under `wrap`, the whole wrapped model), not this "
            "module on its own: FSDP2 then gathers its weights before the cache reads them"
        )
    if subclassed:
        classes = ", ".join(f"`{kind}`" for kind in sorted(set(subclassed.values())))
        raise FreezeError(
            f"`{name}` holds parameters or buffers of a subclass of `torch.Tensor` "
            f"({few(list(subclassed))}, of {classes}): its "
            "state digest reads their values only, not their class nor what else they "
            "carry, so a module holding the same values otherwise would be recalled the "
            "answers kept for these. Hold them as plain tensors "
            "(`nn.Parameter(p.as_subclass(torch.Tensor))`) where the subclass changes "
            "nothing the module answers, or leave the module uncached"
        )


def scripted_parts(module: nn.Module) -> list[str]:
    """The paths of the TorchScript modules (``torch.jit.script``, ``torch.jit.trace``) in
    ``module``, the module itself ``""``, none inside another listed."""
    found: list[str] = []
    for path, part in module.named_modules():
        inside = any(path.startswith(f"{outer}.") or not outer for outer in found)
        if isinstance(part, torch.jit.ScriptModule) and not inside:
            found.append(path)
    return found


def refuse_scripted(
    name: str, module: nn.Module, error: Callable[[str], Exception] = FreezeError
) -> None:
    """Refuses ``module`` (called ``name``) if it is, or holds, a TorchScript module: what
    one computes is code compiled from the Python module, kept on torch's C++ side with
    its submodules, which somatize reads nothing of, so modules of other code would be
    keyed alike (two traces of one class, taken through other branches), and it keeps no
    Python attributes to be held frozen by, or watched. torch's own errors (no
    ``requires_grad_`` on a ScriptModule, its parts found by no ``get``) said none of it."""
    found = scripted_parts(module)
    if not found:
        return
    if found == [""]:
        made = getattr(module, "original_name", "")
        what = f"is a TorchScript module{f' (of `{made}`)' if made else ''}"
        do = "Pass the Python module it was made from instead"
    else:
        what = f"holds TorchScript modules ({few(found)})"
        do = "Put the Python modules they were made from in their place"
    raise error(
        f"`{name}` {what}, made by `torch.jit.script` or `torch.jit.trace`: what one "
        "computes is code TorchScript compiled, kept on torch's C++ side, which somatize "
        "cannot read, so modules of other code (two traces of one class, through other "
        "branches) would be keyed alike and share answers, and it cannot be held frozen "
        f"as a Python module is. {do}"
    )


_Span = tuple[tuple[str, int], int, int]
"""Where a tensor's numbers live: a place (the device, or the tensor itself where it has
no memory), and the first byte it spans and the one after its last, there."""


def refuse_tied(
    model: nn.Module,
    frozen: list[str],
    error: Callable[[str], Exception] = FreezeError,
    *,
    froze: Collection[int] = (),
) -> None:
    """Refuses freezing the parts ``frozen`` of ``model`` when their numbers are shared
    in a way a frozen part cannot see changed:

    - a part left to train holds a parameter over the same numbers as a frozen parameter
      or buffer (an output layer tied to a frozen embedding): freezing turns the gradient
      of the very same parameter off, and that part would silently stop training;
      another parameter over the same memory rewrites the frozen weights under their
      answers as it trains;
    - a frozen parameter or buffer shares bytes with another tensor of the model, not
      one a frozen part holds too (``txt.weight = nn.Parameter(img.weight.data)``): a
      change made in place through that one (a checkpoint loaded into it alone) moves
      its own version counter only, which torch cannot say is shared, so the frozen part
      would be recalled the answers kept for its numbers before. The very same tensor
      under two names, and views torch made of one tensor (which share its counter), are
      seen changed through either; tensors over separate bytes of one buffer (as FSDP
      makes them) share none.

    A frozen part is found wherever it sits (one module under two names is frozen under
    both). ``froze`` holds the ids of parameters that required grad until the parts were
    frozen: checked after freezing (a part made since), one of them held elsewhere is a
    part that would train without it."""
    parts = set()
    for name in frozen:
        try:
            parts.add(id(model.get_submodule(name)))
        except AttributeError:
            continue
    within = [
        (path, id(m)) for path, m in model.named_modules(remove_duplicate=False) if id(m) in parts
    ]
    if not within:
        return
    if any(not path for path, _ in within):
        return  # the whole model is frozen: nothing else trains
    tensors: dict[int, _TensorAt] = {}
    trained: list[tuple[str, _TensorAt]] = []
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for where, tensor in named:
        if is_lazy(tensor):
            continue  # not made yet (`nn.LazyLinear`): it holds no numbers to share
        held = tensors.get(id(tensor))
        if held is None:
            held = tensors[id(tensor)] = _TensorAt(tensor, where, _memory_of(tensor))
        parts_in = {part for path, part in within if where.startswith(f"{path}.")}
        if parts_in:
            held.parts |= parts_in
            held.frozen = held.frozen or where
        elif isinstance(tensor, nn.Parameter) and (tensor.requires_grad or id(tensor) in froze):
            trained.append((where, held))
    pairs = list(_sharing(list(tensors.values())))
    # By memory, not by object: `nn.Parameter(frozen.weight.data)` is another parameter
    # over the same numbers, and training it rewrites the frozen one; so does a parameter
    # over a frozen part's statistics (a BatchNorm's running mean), as it trains.
    for where, held in trained:
        sharing = [held, *(b for a, b in pairs if a is held), *(a for a, b in pairs if b is held)]
        owner = next((one.frozen for one in sharing if one.frozen), None)
        if owner is not None:
            raise error(
                f"`{owner}` is frozen, and `{where}`, in a part of the model that is not, "
                "holds the same numbers (tied weights): freezing would turn its gradient "
                f"off if it is the same parameter, so that `{where}` silently stops "
                "training, and training it would change the frozen weights under their "
                f"answers otherwise. Give that part its own copy (`nn.Parameter({where}"
                ".detach().clone())`), or turn its gradient off yourself "
                "(`requires_grad_(False)`) if it should not train either"
            )
    for one, other in pairs:
        if not one.parts - other.parts:
            one, other = other, one  # named first: the one a frozen part holds alone
        if one.parts == other.parts or _one_counter(one.tensor, other.tensor):
            continue  # watched alike, or seen changed through either
        owner, where = one.frozen, other.frozen or other.first
        raise error(
            f"`{owner}` is frozen, and `{where}` is another tensor over the same numbers "
            f"(as `nn.Parameter({owner}.data)` makes one): a change made in place through "
            f"`{where}` (a checkpoint loaded into its part alone) moves its own version "
            f"counter only, so the frozen part would not see its numbers change and would "
            f"be recalled the answers kept for the old ones. Give `{where}` its own copy "
            f"(`.detach().clone()`), or hold the very same tensor under both names "
            f"(`{where} = {owner}`)"
        )


@dataclasses.dataclass
class _TensorAt:
    """A tensor of a model, as :func:`refuse_tied` looks at it: the first name it has, where
    its numbers live, the first name it has in a frozen part (if it has one), and the
    frozen parts holding it, by id, each of which watches it."""

    tensor: torch.Tensor
    first: str
    span: _Span
    frozen: str = ""
    parts: set[int] = dataclasses.field(default_factory=set)


def _memory_of(tensor: torch.Tensor) -> _Span:
    """Where a tensor's numbers live: the bytes of its device's memory it spans, whatever
    view of whatever storage it is (two storages made over one buffer, as ``torch.
    from_numpy`` makes them of two views of an array, share them too); an empty tensor
    spans none, and one with no memory (on the meta device) or no storage (a sparse one)
    its own."""
    try:
        address = int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        address = 0  # a sparse tensor: no storage of its own to point at
    place = (str(tensor.device), 0) if address else ("", id(tensor))
    if tensor.numel() == 0:
        return place, 0, 0
    size = tensor.element_size()
    low = high = int(tensor.storage_offset())
    for extent, stride in zip(map(int, tensor.shape), map(int, tensor.stride()), strict=True):
        if stride < 0:
            low += (extent - 1) * stride
        else:
            high += (extent - 1) * stride
    return place, address + low * size, address + (high + 1) * size


def _overlap(one: _Span, other: _Span) -> bool:
    """Whether two spans of memory (as ``_memory_of`` gives them) share a byte."""
    return one[0] == other[0] and one[1] < other[2] and other[1] < one[2]


def _sharing(held: list[_TensorAt]) -> Iterator[tuple[_TensorAt, _TensorAt]]:
    """Each two of ``held`` whose memory has a byte in common: in the order of where they
    start, each looked at against those that start before it ends."""
    ordered = sorted((one for one in held if one.span[1] < one.span[2]), key=_start)
    for k, one in enumerate(ordered):
        for other in ordered[k + 1 :]:
            if not _overlap(one.span, other.span):
                break
            yield one, other


def _start(held: _TensorAt) -> tuple[tuple[str, int], int]:
    return held.span[0], held.span[1]


def _one_counter(one: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether two tensors are views torch made of one tensor (or one is a view of the
    other), which share its version counter: a change through either moves both."""
    return (one._base if one._base is not None else one) is (
        other._base if other._base is not None else other
    )


def _converted(built: torch.dtype, sent: torch.dtype) -> bool:
    """Whether a tensor built as ``built`` and sent as ``sent`` was converted as
    ``module.to(dtype)`` (``.double()``, ``.half()``) converts one: floating point to
    another floating point, complex to another complex."""
    return built != sent and (
        (built.is_floating_point and sent.is_floating_point)
        or (built.is_complex and sent.is_complex)
    )
