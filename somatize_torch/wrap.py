"""Wrapping a model: its declared submodules become somatize nodes, the rest stays torch.

``wrap(model, frozen=["encoder"], cached=["encoder"], store=...)`` traces the
model with ``torch.fx``, treating every declared submodule (and the standard
``torch.nn`` layers) as a leaf, and partitions the traced graph at the declared
submodules, ``split_module``-style:

- each declared submodule is one somatize node (a :class:`ModuleNode`): its
  identity is its class, its name is its qualified path in the model
  (``encoder``, ``backbone.stem``), its state — after :func:`somatize.torch.freeze`
  — the digest of its weights and buffers;
- the code between them stays fx segments: plain torch code, run as it is, which
  ``torch.compile`` compiles.

So the overhead is per declared node, not per fx operation. The result is an
``nn.Module`` with the model's forward signature, ``parameters()`` and
``state_dict()`` keys — it holds the model's own tables of children, parameters
and buffers, the very same ones — so optimizers and checkpoints work unchanged,
in both directions, and a part replaced on either is replaced on both.
``wrapped.graph`` is the somatize graph (segments and declared nodes, with who
reads whom): ``freeze(wrapped)`` settles it, ``g.figure()`` draws it,
``wrapped.graph.record`` says what the last cached call did.

**Train and eval.** fx bakes what ``forward`` reads of ``self.training``
(``F.dropout(x, training=self.training)``) into the code it traces, so the model
is traced in both modes, and where the code differs the wrapped model keeps one
runner per mode and runs the one ``self.training`` picks. ``wrapped.train()``
is the model's own ``train()``, which leaves frozen parts in eval.

**Optional arguments.** fx traces each argument as an input, so the model is traced
with every argument that defaults to None given (or, where fx cannot trace that, with
every one None), and again, at the first call that leaves other ones None, with those
fixed at None. An argument handed a plain constant (a flag, a count, a name) is traced
fixed at it — its default at ``wrap``, and again at the first call giving it another
one — since fx cannot trace a branch on it (``if pool:``) nor see every test of it
(``flag is True``); one handed a tensor is an input.

**What fx does not record.** fx records the operations a forward makes on tensors:
the grad-mode, autocast and inference-mode blocks the forward enters are recorded
into the code beside them, so they switch as it runs, and what fx would keep at the
value it read while tracing (``torch.is_grad_enabled()``, ``random.random()``) is
refused. A plain value read from the model (``self.temperature``) is traced as the
value it had: changed after wrapping, the next call is refused. One read from a plain
object a module holds (``self.config.flag``) is too: changed, the next call (a compiled
one too) traces the forward again for the values it holds then. A tensor the forward
makes from numbers (``torch.ones(4)``) is made once, as fx traces, in the default dtype
of then: where the code keeps one, a call under another default dtype traces the forward
again under it, once per default dtype.

**torch.compile.** The cache lookup is a deliberate graph break: the call into
the store runs under ``torch.compiler.disable``, once per cached node, and reads
nothing that changes from batch to batch, so ``torch.compile(wrapped)`` compiles
the segments around it once and does not recompile per batch. The checks made
before an eager forward (frozen parts settled) are not made by compiled code, but for
the forward's defaults and the plain values it read, changed after ``wrap``, which a
compiled call refuses (or, for a config's, traces again for) as an eager one does, and
for the parts the model holds: one replaced, on the wrapped model or on the model
itself, is the one a compiled call runs. A model whose forward switches grad mode,
autocast or inference mode is called through one more break: what leaves the
blocks a failed call left open runs eagerly, the code it calls compiled.

This module is the wrapper; what it is made of has a module each:

- :mod:`somatize_torch._split` traces the model and cuts it at its declared
  submodules — and says what to do about what fx cannot trace;
- :mod:`somatize_torch._tracing` keeps the model's traces, one per set of optional
  arguments a call leaves None and of values of those the forward branches on, and
  what they read, which the wrapped model watches;
- :mod:`somatize_torch._modes` records, as the model is traced, the modes its
  forward switches, and refuses what fx would fix at the value it read;
- :mod:`somatize_torch._cached` is the call of one declared submodule: how a
  cached one is keyed, and what a recalled answer could not repeat, refused;
- :mod:`somatize_torch._parts` keeps the segments pointing at the parts the model
  holds now, a part replaced after wrapping included, and refuses replacing a
  declared submodule;
- :mod:`somatize_torch._values` notes the plain values the trace read from the model,
  and refuses a call once one changed;
- :mod:`somatize_torch._errors` holds the errors, exported here.
"""

from __future__ import annotations

import inspect
import itertools
import os
import threading
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import is_dataclass
from typing import Any, NoReturn

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from somatize import Graph, Node, Store, Unsettled
from somatize._threads import ProcessLock
from somatize.engine import Record
from somatize.memory import settled
from somatize.node import Expr
from somatize_torch._cached import _Cached, _Declared, _Watched, traced
from somatize_torch._errors import (
    EXPORT,
    CachedInputNeedsGrad,
    NotCalled,
    UnknownSubmodule,
    Untraceable,
    WrapError,
    exporting,
)
from somatize_torch._modes import (
    load_compiler,
    marked_as_needed,
    outside_compiled,
    unmarked,
    unwinding,
)
from somatize_torch._parts import _HOOK_KINDS, _part, _Parts, hooked_error, hooks_of
from somatize_torch._settings import (
    any_global_hooks,
    global_hooks,
    its_own,
    its_own_held,
    stand_in_call,
)
from somatize_torch._split import identical_at
from somatize_torch._state import StateWatch
from somatize_torch._tracing import (
    INPUT,
    Key,
    Runners,
    Tracing,
    forward_signature,
    input_key,
    not_plain,
    not_stood_in,
    optional_of,
    stand_in_default,
    stand_in_handed,
    value_key,
)
from somatize_torch._values import Reread, Values
from somatize_torch.freeze import ModuleNode, module_of, refuse_scripted, refuse_tied

__all__ = [
    "CachedInputNeedsGrad",
    "NotCalled",
    "Segment",
    "UnknownSubmodule",
    "Untraceable",
    "WrapError",
    "Wrapped",
    "wrap",
]

Names = bool | str | Iterable[str] | Mapping[str, str | None]

_COUNTING = ProcessLock()
"""Held while a call counts its facts into ``counts`` and the graph's record: each adds
to what it reads there, and a call of another thread adding between the read and the
write would be lost. One for every wrapped model (a lock is not pickled), held for a
few dict writes a call; a child forked while a thread held it (a DataLoader worker) gets
it unheld, where it would wait for good on a thread that is not there."""


# ------------------------------------------------------------------------------ nodes


class Segment(Node):
    """The fx code between declared submodules. It runs inside the wrapped module,
    never on its own: ``wrapped.graph`` describes the model, the module runs it."""

    def __init__(self, code: str) -> None:
        self.code = code

    def forward(self, *inputs: Any) -> Any:
        raise TypeError(
            "a segment of a wrapped model runs inside the wrapped module: call "
            "`wrapped(*inputs)`, not `wrapped.graph.forward(...)`"
        )


# ------------------------------------------------------------------------------ the module


REGISTRIES = (
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_modules",
    # What `state_dict()` and `load_state_dict()` run besides: the hooks registered on
    # the model, so a checkpoint of the wrapper is one of the model, and loads as one.
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
"""A module's registries of parts and of state-dict hooks that a module standing for it
(a wrapped model, a row cache) holds as its own: the very dicts, not copies."""


class Wrapped(nn.Module):
    """A model whose declared submodules are somatize nodes; see the module docstring.

    ``graph`` is the somatize graph, ``store`` where cached answers live (may be
    reassigned), ``strict`` whether an answer kept by another version of a cached part's
    code is computed again (and kept anew) rather than recalled as drifted, ``model`` the
    model it wraps: it holds the model's own tables of
    children, parameters and buffers, so a part replaced on either is replaced on both.
    """

    graph: Graph
    store: Store | None
    strict: bool = False
    model: nn.Module
    _runners: dict[Key, Runners]
    """Per set of optional arguments a call leaves None and plain values it gives the
    others, the code each mode runs (or why fx could not trace it in that mode)."""
    TRACES_PER_VALUE: int = 32
    """How many sets of plain values of its forward's arguments a wrapped model is traced
    for, at most: a call giving one more is refused."""
    _fixed: tuple[tuple[str, int | None, Any, bool], ...] = ()
    """The forward's named arguments, each with its place among the positional ones (None
    for a keyword-only one), its default, and whether it is one the forward does not
    branch on, which takes what is no plain constant as an input: a call runs the code
    traced with them fixed at the plain values it gives."""
    _tracing: Tracing | None = None
    """The traces taken so far, which a call leaving other arguments None adds to (None
    for a model declared whole, which is not traced)."""
    _one_code: bool = True
    """Whether each trace runs the same code in both modes."""
    _ties: StateWatch | None = None
    """Where the model's tensors and submodules were when :meth:`_refuse_tied` last found
    no tie (None before): one moved since is looked at again."""
    _parts: _Parts
    _through: tuple[str, ...] = ("",)
    """The modules traced into, by path: their training flags pick the code that runs."""
    _switches: bool = False
    """Whether the code traced switches grad mode, autocast or inference mode, in blocks
    a failed call leaves open."""
    _enters: bool = False
    """Whether the code traced enters autocast or inference-mode blocks, whose calls are
    kept out of compiled code (:func:`somatize_torch._modes.enters_blocks`)."""
    _optional: tuple[tuple[str, int | None, bool], ...] = ()
    """The forward's named arguments, each with its place among the positional ones (None
    for a keyword-only one) and whether it defaults to None: a call that leaves some None
    runs the code traced with those None."""
    _values: Values = Values(None, "")
    """The plain values the code traced read from the model (none when nothing was
    traced): changed, the code would not be the model's."""
    _identity: frozenset[str] = frozenset()
    """The forward's arguments its code, or code a trace found it hands them to, compares
    by identity (``opts is PRESET``): one handed a tuple or a dataclass, traced per value,
    is refused."""
    _dtyped: bool = False
    """Whether the code traced holds what the default dtype made as it was traced (a
    tensor the forward made from numbers): a call under another default dtype runs the
    code traced under that one (:meth:`Tracing.check_dtype`)."""
    _varying: inspect.Signature | None = None
    """The forward's signature, where it takes `*args` or `**kwargs`: traced once, with a
    stand-in for every argument, so a call handing one a plain constant is refused."""

    def __init__(
        self,
        model: nn.Module,
        runners: dict[Key, Runners],
        graph: Graph,
        store: Any,
        parts: _Parts,
    ) -> None:
        super().__init__()
        # Before the model is in place: a `counts` of the model's would take it otherwise.
        self.counts: dict[str, dict[str, int]] = {}
        """Per cached node, how many times each fact (``ran``, ``recalled``, ``kept``) happened."""
        for table in REGISTRIES:
            self.__dict__[table] = model.__dict__[table]
        object.__setattr__(self, "training", model.training)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "_version", model._version)  # the layout a checkpoint records
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "store", Store.of(store))
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_runners", runners)
        parts.watch(model)
        self._sign_forward()

    def _sign_forward(self) -> None:
        """Gives ``forward`` the model's signature, where it has one."""
        signature = _signature_of(self.model)
        if signature is not None:
            forward = types.FunctionType(
                _forward.__code__, _forward.__globals__, "forward", None, _forward.__closure__
            )
            forward.__signature__ = signature  # type: ignore[attr-defined]
            object.__setattr__(self, "forward", types.MethodType(forward, self))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _forward(self, *args, **kwargs)

    def _mode(self) -> bool:
        """The mode the code traced into runs in: the training flags of the modules whose
        forward was traced — the model's own, put in a mode directly (``model.eval()``),
        not only through this wrapper. Where the code of the two modes differs, those
        modules must agree: code traced in one mode would run for a part in the other."""
        if self._one_code:
            return bool(self.model.training)
        found = [(p, _part(self.model, p) if p else self.model) for p in self._through]
        modes = {p: bool(m.training) for p, m in found if isinstance(m, nn.Module)}
        if len(set(modes.values())) <= 1:
            return next(iter(modes.values()), bool(self.model.training))
        if torch.compiler.is_compiling():
            # Refused eagerly: compiled, the refusal would not come out as it is raised.
            _refuse_modes_eagerly(modes)
        _refuse_modes(modes)

    def train(self, mode: bool = True) -> Wrapped:
        """Puts the model in ``mode`` through its own ``train``, which leaves its frozen
        parts in eval (a frozen module's own parts too, which going through them one by
        one would not)."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        object.__setattr__(self, "training", mode)
        self.model.train(mode)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        parts: _Parts | None = self.__dict__.get("_parts")
        if parts is not None and name in parts.tops:
            parts.refuse(self.model, name, value)
        model = self.__dict__.get("model")
        if model is not None and name in self._values.names:
            # A value the code read from the model is the model's: changed there, the next
            # call says it is not what the code was traced with.
            setattr(model, name, value)
            return
        if (
            model is not None
            and isinstance(value, torch.Tensor)
            and not isinstance(value, nn.Parameter)
            and isinstance(model.__dict__.get(name), torch.Tensor)
        ):
            # The model's own plain tensor attribute, which the code reads: replaced there.
            setattr(model, name, value)
            self._follow()
            return
        if model is not None and its_own(self, model, name):
            # A value the model holds (`wrapped.global_pool = "token"`), which its forward
            # reads: beside it, on the wrapper, it would change nothing the model answers.
            setattr(model, name, value)
            return
        super().__setattr__(name, value)
        if isinstance(value, (nn.Module, torch.Tensor)):
            self._follow()

    def __delattr__(self, name: str) -> None:
        """A value the model holds itself is deleted from the model, as it is written
        there (:meth:`__setattr__`) and read from there (:meth:`__getattr__`)."""
        model = self.__dict__.get("model")
        if model is not None and its_own_held(self, model, name):
            delattr(model, name)
            return
        super().__delattr__(name)

    def __getattr__(self, name: str) -> Any:
        """What the model holds beside its tensors and children — a plain value
        (``wrapped.global_pool``), a method (``wrapped.encode_image(x)``) — read from the
        model itself. Only calling the wrapped model is cached: a method called this way
        runs the model, uncached."""
        try:
            return super().__getattr__(name)  # parameters, buffers, children: the model's
        except AttributeError:
            model = self.__dict__.get("model")
            # A private name is the wrapper's (`__deepcopy__` is asked of it, not the model).
            if model is None or name.startswith("_"):
                raise
        try:
            return getattr(model, name)
        except AttributeError as missing:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}', nor has the "
                f"model it wraps (`{type(model).__name__}`)",
                name=name,
                obj=self,
            ) from missing

    def add_module(self, name: str, module: nn.Module | None) -> None:
        parts: _Parts | None = self.__dict__.get("_parts")
        if parts is not None and name in parts.tops:
            parts.refuse(self.model, name, module)
        super().add_module(name, module)
        self._follow()

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        super().register_parameter(name, param)
        self._follow()

    def register_buffer(
        self, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        super().register_buffer(name, tensor, persistent)
        self._follow()

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        loaded = super().load_state_dict(state_dict, strict, assign)
        self._follow()  # assigned tensors replace those the segments hold
        return loaded

    def __getstate__(self) -> dict[str, Any]:
        # The forward given the model's signature is made again where the copy is loaded:
        # pickled, it would be read back as the plain `forward`, with no signature, and
        # cloudpickle (a Ray task's arguments) would pickle its code by value, with the
        # globals of this module.
        state: dict[str, Any] = super().__getstate__()  # type: ignore[no-untyped-call]
        state.pop("forward", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        # A copy's tables are its own: what it watched of the model's were those of the
        # model copied, which a copied module does not keep (it fills a table of its own).
        self._parts.watch(self.model)
        self._sign_forward()

    def _follow(self) -> None:
        """Points the fx segments at the parts the model holds now, if any was replaced."""
        parts: _Parts | None = self.__dict__.get("_parts")
        if parts is not None and parts.changed():
            split = parts.follow(self.model)
            if split is not None:
                # Two names of a part the code holds under one hold two: traced again.
                assert self._tracing is not None  # a model declared whole holds no code
                self._tracing.untie(*split)

    def _check(self) -> None:
        settled(self.graph, self.graph.memory)

    def _refuse_tied(self) -> None:
        """Refuses the model while a part left to train holds a parameter over the numbers
        of a frozen part's (:func:`~somatize_torch.freeze.refuse_tied`): asked by ``freeze``,
        and again when a frozen part's state changed since (a tied checkpoint loaded with
        ``assign=True``, a trained parameter put in it), before it is held frozen again, or
        when the model's tensors moved (:meth:`_look_at_ties`); found with none, where they
        are is noted for that."""
        memory = self.graph.memory
        frozen = [n for n in self.graph.nodes() if memory.is_frozen(n)]
        refuse_tied(self.model, frozen)
        # A cached part's own watch, asked at each of its calls, sees what moves in it,
        # and has this asked then.
        held: set[int] = set()
        for name in frozen:
            module = module_of(self.graph.node(name))
            if module is not None and memory.is_cached(name):
                held.update(map(id, module.modules()))
        # A lazy tensor (`nn.LazyLinear`'s, before its first call) has no memory to watch,
        # and is given some in place: looked at again each call until it has it.
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        lazy = any(map(is_lazy, tensors))
        object.__setattr__(self, "_ties", None if lazy else StateWatch(self.model, leaving=held))

    def _look_at_ties(self) -> None:
        """:meth:`_refuse_tied` again if a tensor or submodule of the model was replaced,
        added or removed, or a tensor given other memory, since it was last asked (a part
        left to train given a frozen part's memory, ``head.weight = nn.Parameter(embed.
        weight.data)``, which its own watch does not see): asked before each cached call,
        it looks at each by identity and address only."""
        ties = self._ties
        if ties is None or ties.moved():
            self._refuse_tied()

    def _noted(self, name: str, record: Record | None) -> None:
        if record is None:
            return
        with _COUNTING:
            count = self.counts.setdefault(name, {})
            for fact in record.facts:
                if fact.get("node") == name:
                    count[fact["fact"]] = count.get(fact["fact"], 0) + 1
            # The graph's record keeps what the other declared nodes did last, and this
            # one's facts from its own run.
            previous = self.graph.record
            kept = (
                []
                if previous is None
                else [f for f in previous.facts if f.get("node") not in (None, name)]
            )
            self.graph.record = Record([*kept, *record.facts])

    # The model's own tensors are saved and loaded by the model, as unwrapped: its
    # overrides (extra state, keys renamed on load) take part.

    def _save_to_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.model._save_to_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.model._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Wrapped:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        # fx copied the references of attributes the code between declared nodes reads;
        # a conversion replaces buffers, so those copies are converted too, and the
        # segments then pointed at the model's own.
        runners = {
            id(runner): runner
            for each in self._runners.values()
            for runner in each.values()
            if isinstance(runner, nn.Module)
        }
        if self._tracing is not None:  # those for other values of the model's config too
            runners.update((id(runner), runner) for runner in self._tracing.every_runner())
        for runner in runners.values():
            runner._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._follow()
        return self

    def extra_repr(self) -> str:
        declared = [
            f"{name}[{', '.join(_marks(self.graph, name))}]"
            for name in self.graph.nodes()
            if isinstance(self.graph.node(name), ModuleNode)
        ]
        return f"somatize: {', '.join(declared) or 'nothing declared'}"


class _WrappedWhole(Wrapped):
    """A model declared whole, which runs it as one node: torch's global hooks run with
    the model, as it is called (or were run computing the answer recalled), and not once
    more with the module standing for it."""

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        if exporting():  # before the call kept out of compiled code, which export cannot make
            (name,) = self.graph.nodes()
            if self.graph.memory.is_cached(name):
                raise traced(name, EXPORT)
            # Nothing is kept, so nothing can go stale: the model is exported as it runs.
            return unmarked(stand_in_call)(self, args, kwargs, WrapError)
        return marked_as_needed(stand_in_call)(self, args, kwargs, WrapError)

    def _look_at_ties(self) -> None:
        """Nothing: the model is the one frozen part, whose own watch sees its tensors."""


def _forward(self: Wrapped, *args: Any, **kwargs: Any) -> Any:
    tracing = self._tracing
    if tracing is not None and not torch.compiler.is_compiling():
        # Not while another thread traces the model: its modules are in the mode traced.
        entered: set[int] = _gated.__dict__.setdefault("wrapped", set())
        if id(self) not in entered:
            tracing.gate.enter()
            entered.add(id(self))
            try:
                return _forward(self, *args, **kwargs)
            finally:
                entered.discard(id(self))
                tracing.gate.leave()
    none = _left_none(self._optional, args, kwargs) if self._optional else frozenset()
    values = _values_in(self, none, args, kwargs) if self._fixed else ()
    if self._varying is not None:
        refused = stand_in_handed(self.model, self._varying, args, kwargs)
        if refused is not None:
            raise refused
    if not torch.compiler.is_compiling():
        self._follow()
        if tracing is not None:  # before the code watch, which sees them too: named here
            tracing.check_defaults()
            if self._dtyped:
                tracing.check_dtype()
        try:
            self._values.check()
        except Reread as changed:
            if tracing is None:
                raise
            tracing.rekey(changed)  # traced again, for the values the config holds now
        self._check()
        if tracing is not None:
            _refuse_global_hooks(self.model)
    elif tracing is not None:
        if self._parts.changed():
            # A part replaced on the model itself: the segments are pointed at it.
            _follow_eagerly(self)
        if any_global_hooks():
            _refuse_global_hooks_eagerly(self.model)
        if not tracing.same_defaults():
            # A default changed after `wrap`: the code traced takes the old one.
            _check_defaults_eagerly(tracing)
        if self._dtyped and torch.get_default_dtype() is not tracing.world.dtype:
            # Another default dtype than the code was traced under (which torch.compile
            # guards on): the code traced under this one runs.
            _check_dtype_eagerly(tracing)
        if not self._values.same():
            # A value the code read changed: refused, or traced again for a config's.
            _check_values_eagerly(self, tracing)
    runners = self._runners.get((none, values))
    if runners is None:
        runners = _traced_without(self, none, args, kwargs)
        # The trace may have found more arguments the forward branches on.
        values = _values_in(self, none, args, kwargs) if self._fixed else ()
    training = self._mode()
    runner = runners[training]
    if not isinstance(runner, nn.Module):
        # Refused for what the config held when it was traced, which these traces may not
        # watch: those taken for what it holds now run, where there are any.
        elsewhere = (
            None
            if tracing is None
            else marked_as_needed(_traced_elsewhere_eagerly)(tracing, (none, values), training)
        )
        if elsewhere is None:
            _refuse_mode(self, runner, runners, training, none)
        runner = elsewhere[training]
        assert isinstance(runner, nn.Module)  # as traced_elsewhere finds it
    if none or any(value is not INPUT for value in values):  # a list handed too
        # Traced with those arguments fixed at None or at values: each in its place.
        assert self._tracing is not None and self._tracing.signature is not None
        args, kwargs = _in_order(self._tracing.signature, args, kwargs), {}
    if self._switches:
        if self._enters:
            load_compiler()  # before a block is entered: fx's code calls what enters it marked
        return marked_as_needed(_unwinding)(runner, *args, **kwargs)
    if tracing is None and any_global_hooks():
        # The model declared whole: torch's global hooks run with it, not once more with
        # the module standing for it in the graph. Compiled, the model's modules are
        # compiled in with the hooks registered then: asking how many there are has the
        # call compiled anew when that changes.
        return runner.forward(*args, **kwargs)
    return runner(*args, **kwargs)


def _refuse_mode(
    self: Wrapped, runner: Untraceable, runners: Runners, training: bool, none: frozenset[str]
) -> NoReturn:
    """Refuses a call in the mode ``training``, which fx could not trace (``runner`` says
    why; ``runners`` are those of both modes), with the arguments ``none`` None."""
    mode, other = ("train", "eval") if training else ("eval", "train")
    if not isinstance(runners[not training], nn.Module):
        raise runner
    branched = [name for name, *_, other in self._fixed if not other and name not in none]
    if branched:
        raise WrapError(
            f"fx could trace `{type(self.model).__qualname__}.forward` for the values "
            f"this call gives {', '.join(f'`{name}`' for name in branched)} "
            f"in {other} mode only, and this call is in {mode} mode: what it traced may "
            f"not be what the forward does in {mode} mode (code that reads "
            "`self.training`), so it is not run in its place. Make such calls in "
            f"{other} mode, or make the forward traceable in {mode} mode as well. {runner}"
        )
    if none:
        raise WrapError(
            f"fx could trace `{type(self.model).__qualname__}.forward` with "
            f"{', '.join(f'`{name}`' for name in sorted(none))} None in {other} mode only, "
            f"and this call, in {mode} mode, leaves the same None: what it traced may "
            f"not be what the forward does in {mode} mode "
            "(code that reads `self.training`), so it is not run in its place. Make such "
            f"calls in {other} mode, give what they leave None, or make the forward "
            f"traceable in {mode} mode as well. {runner}"
        )
    raise WrapError(
        f"this model was wrapped in {other} mode and is run in {mode} mode, and fx could "
        f"trace its forward in {other} mode only: what it traced may not be what the "
        f"forward does in {mode} mode (code that reads `self.training`), so it is not run "
        f"in its place. Run it in {other} mode, or make it traceable in {mode} mode as "
        f"well. {runner}"
    )


def _refuse_modes(modes: dict[str, bool]) -> NoReturn:
    """Refuses a call while the modules whose training flag the traced code holds (``modes``,
    each by path) are in different modes."""
    shown = ", ".join(
        f"`{p or 'the model itself'}` in {'train' if t else 'eval'}"
        for p, t in list(modes.items())[:6]
    )
    raise WrapError(
        "the code fx traced reads `self.training`, and the modules it traced into or read "
        "the flag of are in "
        f"different modes ({shown}): what was traced for one mode would run for a part "
        "in the other. Put them in one mode (`model.train()` or `model.eval()`), or "
        "declare the part that stays in another mode, so it is called whole and reads "
        "its own mode as it runs"
    )


def _refuse_global_hooks(model: nn.Module, when: str = "calling the wrapped model") -> None:
    """Refuses tracing ``model``, or calling it traced, while torch's global module hooks
    are registered: they run with every module called, and the code traced calls other
    modules than the model does (fx's segments between declared submodules), and not the
    blocks it traced into, whose code ran what those hooks did when it was traced."""
    hooks = global_hooks()
    if hooks:
        raise WrapError(
            f"torch's global module hooks are registered ({', '.join(hooks)}): they run "
            f"with every module a call runs, and the wrapped `{type(model).__qualname__}` "
            "runs code fx traced in place of the blocks it traced into (which runs what "
            "those hooks did as it was traced, if anything) and between its declared "
            "submodules (which they would run on too), so its answer would not be the "
            f"model's. Remove them while {when} (a `FlopCounterMode` or `ModuleTracker` "
            "registers them while it is open), or wrap just the submodule you want to "
            "remember (`somatize.torch.wrap(model.encoder, frozen=True, cached=True)`, or "
            "`somatize.torch.cache_rows`), which runs them as the module does"
        )


_gated = threading.local()
"""The wrapped models this thread's eager calls are in, each let in by its gate."""


def _left_none(
    optional: tuple[tuple[str, int | None, bool], ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> frozenset[str]:
    """The arguments this call leaves None: given so, or left to a default of None."""
    return frozenset(
        name
        for name, at, by_default in optional
        if (
            kwargs[name] is None
            if name in kwargs
            else (args[at] is None if at is not None and at < len(args) else by_default)
        )
    )


def _values_of(
    self: Wrapped, none: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """What this call gives the forward's named arguments, each as what picks a trace
    (:func:`value_key`, or :data:`INPUT`), but those it leaves None; refused naming one
    the forward branches on given what no trace can be fixed at."""
    found = []
    for name, at, default, other in self._fixed:
        if name in none:
            continue
        value = _given(name, at, default, args, kwargs)
        key = value_key(value)
        if key is None and other and value is not inspect.Parameter.empty:
            key = input_key(value)  # an input where the forward does not branch on it
            if key is None:
                raise not_stood_in(name, value, self.model)
        if key is None:
            if value is inspect.Parameter.empty:
                assert self._tracing is not None and self._tracing.signature is not None
                self._tracing.signature.bind(*args, **kwargs)  # says what is missing
            raise not_plain(
                name,
                value,
                self.model,
                None if self._tracing is None else self._tracing.reason(name),
            )
        compared = [one for one in self._identity if one.split(".")[0] == name]
        if (
            compared
            and (isinstance(value, tuple) or is_dataclass(value))
            and not all(identical_at(value, one) for one in compared)
        ):
            raise WrapError(
                f"`{name}` is a `{type(value).__qualname__}` in this call, traced per value, "
                f"and `{type(self.model).__qualname__}.forward`, or code it hands `{name}` to, "
                f"compares it by identity (`{name} is ...`): the code traced for an equal "
                "value would answer for the instance it was traced with. Compare it by value "
                "(`==`), hand an Enum member, or declare the submodule that compares it"
            )
        found.append(key)
    return tuple(found)


def _given(
    name: str, at: int | None, default: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """What a call hands the forward's argument ``name`` (at place ``at``, if it has one),
    or its default."""
    if name in kwargs:
        return kwargs[name]
    return args[at] if at is not None and at < len(args) else default


def _values_in(
    self: Wrapped, none: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """:func:`_values_of`, made eagerly in a compiled call: torch.compile would take a
    plain value it is handed as a constant, and check a later call's against it by
    equality (``-0.0 == 0.0``), where the value picks the code by its kind and spelling.
    A call handing each of them a tensor (or None) is read in the compiled code: each is
    an input."""
    if torch.compiler.is_compiling():
        inputs = _all_inputs(self, none, args, kwargs)
        if inputs is not None:
            return inputs
        values: tuple[Any, ...] = _values_eagerly(self, none, args, kwargs)
        return values
    return _values_of(self, none, args, kwargs)


def _all_inputs(
    self: Wrapped, none: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...] | None:
    """What picks the code for a call handing a tensor to each argument that picks it,
    but those it leaves None, which the forward does not branch on: each an input. None
    for any other call."""
    found = []
    for name, at, default, other in self._fixed:
        if name in none:
            continue
        value = _given(name, at, default, args, kwargs)
        if not (other and isinstance(value, torch.Tensor)):
            return None
        found.append(INPUT)
    return tuple(found)


def _in_order(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Every argument of a forward of ``signature``, each in its place, defaults filled in:
    how fx's code traced with some fixed at None takes them (it names those otherwise)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _traced_without(
    self: Wrapped, none: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Runners:
    """The code run when the optional arguments ``none`` are None and the others as this
    call gives them, traced now if no call left them None and gave the same values to
    those the forward branches on before."""
    tracing = self._tracing
    varying = (
        tracing is not None
        and tracing.signature is not None
        and any(
            p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            for p in tracing.signature.parameters.values()
        )
    )
    if tracing is None or varying or tracing.signature is None:
        name = sorted(none)[0] if none else "?"
        raise WrapError(
            f"`{name}` is None in this call (given so, or left to its default): `wrap` traced "
            f"`{type(self.model).__qualname__}.forward` with `{name}` as an input, a tensor, "
            f"and a forward that takes `*args` or `**kwargs` cannot be traced again with "
            f"`{name}` None. Give `{name}` in every call, declare the submodule that takes "
            "it, or wrap just the submodule you want to remember (`model.encoder = "
            "somatize.torch.wrap(model.encoder, frozen=True, cached=True)`), which needs no "
            "tracing"
        )
    runners: Runners = marked_as_needed(_trace_eagerly)(tracing, none, args, kwargs)
    return runners


_not_compiled: Callable[..., Callable[..., Any]] = outside_compiled
_unwinding = _not_compiled(unwinding, recursive=False)
""":func:`unwinding`, never compiled itself, the runner it calls compiled: so a compiled
call that fails leaves the modes as an eager one does. (torch.compile gives up on a
``try`` around code with graph breaks, after a failed attempt, and runs its frame eagerly
anyway.)"""
_trace_eagerly = _not_compiled(Tracing.runners_for)
"""A trace taken in a compiled call runs eagerly: fx cannot trace inside a compiled one."""
_traced_elsewhere_eagerly = _not_compiled(Tracing.traced_elsewhere)
"""The code traced for the values the config holds, looked for in a compiled call eagerly:
it enters and watches other traces, which torch.compile cannot follow."""
_refuse_global_hooks_eagerly = _not_compiled(_refuse_global_hooks)
"""Refuses a compiled call while global hooks are registered, naming them: compiled code
only asks how many there are (which torch.compile guards on, so one registered later has
the call compiled anew), and names them eagerly."""
_check_dtype_eagerly = _not_compiled(Tracing.check_dtype)
""":meth:`Tracing.check_dtype` in a compiled call, made eagerly."""
_check_defaults_eagerly = _not_compiled(Tracing.check_defaults)
"""Refuses a compiled call once a default of the forward changed, naming it: compiled
code only asks whether they are the ones traced with (:meth:`Tracing.same_defaults`)."""


def _check_values(self: Wrapped, tracing: Tracing) -> None:
    """Refuses a call once a value the code read of the model changed, naming it; where
    one read of a plain object a module holds (a config) changed, has the code traced for
    the values it holds now run, traced first if no call traced it."""
    try:
        self._values.check()
    except Reread as changed:
        tracing.rekey(changed)


_follow_eagerly = _not_compiled(Wrapped._follow)
"""Points the segments at the parts the model holds now in a compiled call, eagerly:
compiled code only asks whether any was replaced (:meth:`_Parts.changed`), which
torch.compile guards on."""
_refuse_modes_eagerly = _not_compiled(_refuse_modes)
""":func:`_refuse_modes` in a compiled call, made eagerly."""
_check_values_eagerly = _not_compiled(_check_values)
""":func:`_check_values` in a compiled call, made eagerly: compiled code only asks whether
the values are the very ones read (:meth:`Values.same`)."""
_values_eagerly = _not_compiled(_values_of)
"""What picks the code a compiled call runs, made eagerly: see :func:`_values_in`."""


def _marks(graph: Graph, name: str) -> list[str]:
    out = []
    if graph.memory.is_frozen(name):
        out.append("frozen")
    if graph.memory.is_cached(name):
        out.append("cached")
    return out


def _signature_of(model: nn.Module) -> inspect.Signature | None:
    inner = forward_signature(model)
    if inner is None:
        return None
    only = inspect.Parameter.POSITIONAL_ONLY
    # Before a forward's positional-only arguments (`def forward(self, x, /)`), it is one.
    kind = (
        only
        if any(p.kind is only for p in inner.parameters.values())
        else inspect.Parameter.POSITIONAL_OR_KEYWORD
    )
    this = inspect.Parameter("self", kind)
    return inner.replace(parameters=[this, *inner.parameters.values()])


# ------------------------------------------------------------------------------ declaring


def _names(what: Names, model: nn.Module, kind: str) -> dict[str, str | None]:
    """Declared qualified names → salt (None for none), checked against ``model``. The
    model itself is ``True``, or, in ``cached=``, ``""`` mapped to its salt."""
    if what is True:
        return {"": None}
    if what is False or what is None:
        return {}
    if isinstance(what, str):
        pairs: list[tuple[Any, Any]] = [(what, None)]
    elif isinstance(what, Mapping):
        pairs = list(what.items())
        if kind != "cached" and any(salt is not None for _, salt in pairs):
            raise TypeError(_takes(kind, "got a dict of salts: a salt goes in `cached=`"))
    elif isinstance(what, Iterable) and not isinstance(what, (bytes, bytearray)):
        pairs = [(name, None) for name in what]  # a list, a set, `salts.keys()`, a generator
    else:
        raise TypeError(_takes(kind, f"got a `{type(what).__name__}`"))
    for name, salt in pairs:
        if not isinstance(name, str):
            raise TypeError(_takes(kind, f"got `{name!r}`, a `{type(name).__name__}`"))
        if salt is not None and not isinstance(salt, str):
            raise TypeError(
                _takes(kind, f"got the salt `{salt!r}` for `{name}`, a `{type(salt).__name__}`")
            )
    found: dict[str, str | None] = dict(pairs)
    known = dict(model.named_modules())
    for name in found:
        if name == "" and isinstance(what, Mapping):
            continue  # the model itself, with its salt
        if name and name not in known:
            _refuse_other_name(name, model, known, kind)
        if name not in known or name == "":
            near = [n for n in known if n and (name in n or n in name)][:5] or [
                n for n in known if n and "." not in n
            ][:8]
            raise UnknownSubmodule(
                f"`{name}` in {kind}= is not a submodule of this `{type(model).__qualname__}`; "
                f"it has {', '.join(f'`{n}`' for n in near) or 'no submodules'}. Declare "
                "submodules by their qualified path, as `named_modules()` gives it"
            )
    return found


def _refuse_other_name(
    name: str, model: nn.Module, known: Mapping[str, nn.Module], kind: str
) -> None:
    """Refuses ``name`` where it leads to a submodule ``named_modules()`` lists under
    another name (``self.again = self.encoder``; T5's ``decoder.embed_tokens``, its
    ``shared``): fx calls such a module by that first name wherever the forward uses it,
    so its node, facts and counts go by that name, and it is declared by it."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return  # no submodule at all: refused as unknown
    first = next((path for path, one in known.items() if one is module), None)
    if first is None:
        return
    held = f"`{first}`" if first else "the model itself"
    declare = f"`{kind}=[{first!r}]`" if first else f"`{kind}=True`"
    raise WrapError(
        f"`{name}` in {kind}= is the submodule this `{type(model).__qualname__}` holds as "
        f"{held} too (one module under two names): fx traces every call of it, under "
        f"either name, as {held}, the name its node, facts and counts go by. Declare it "
        f"by that name: {declare}"
    )


def _takes(kind: str, got: str) -> str:
    """What ``frozen=`` or ``cached=`` takes, and what it got instead."""
    if kind == "cached":
        takes = (
            '`True` (the model itself), a submodule\'s qualified path (`"encoder"`), a list '
            'of them, or a dict of them to their salts (`{"encoder": "v2"}`; `{"": "v2"}` '
            "for the model itself)"
        )
    else:
        takes = (
            '`True` (the model itself), a submodule\'s qualified path (`"encoder"`) or a '
            "list of them"
        )
    return f"`{kind}=` takes {takes}; {got}"


def _refuse_wrapped_parts(model: nn.Module, declared: list[str]) -> None:
    """Refuses a submodule that is a wrapped model itself (an encoder wrapped on its own,
    put into a larger model) unless it is declared, or inside a declared one: fx would
    trace into it, through the machinery that calls its parts, and fail with a message
    about that machinery rather than about the model. Declared, it is called whole, and
    answers as it does on its own."""
    for name, part in model.named_modules():
        if not name or not isinstance(part, Wrapped):
            continue
        if any(name == one or not one or name.startswith(one + ".") for one in declared):
            continue
        raise WrapError(
            f"`{name}` is a wrapped model already (made by `somatize.torch.wrap`), and is "
            f'not declared, so it would be traced into: declare it (`frozen=["{name}"]`, '
            "and `cached=` too to keep its answers), so it is called whole; or put the "
            "plain module inside it (`wrapped.model`) in its place, and wrap the larger "
            "model once, declaring every submodule there"
        )


def _refuse_row_caches(model: nn.Module, cached: Iterable[str]) -> None:
    """Refuses a submodule declared cached that is, or holds, a part cached per row
    (``cache_rows``): that cache, its counts and memory with it, is part of what the
    submodule is, which moves at every call, so no batch would ever be kept or recalled.
    Undeclared, the wrapped model calls the row cache as it is, and it recalls its rows."""
    from somatize_torch.rows import CachedRows  # rows builds on wrap

    for name in cached:
        part = model.get_submodule(name) if name else model
        inner = next((p for p, one in part.named_modules() if isinstance(one, CachedRows)), None)
        if inner is None:
            continue
        where = ".".join(p for p in (name, inner) if p)
        what = (
            f"`{name}` in cached=" if name else f"This `{type(model).__qualname__}`, cached whole,"
        )
        held = "is" if not inner else f"holds `{where}`, which is"
        leave = f"leave `{name}` out of `cached=`" if name else "leave `cached=` off"
        back = f"`model.{where} = model.{where}.module`" if where else "wrap its `.module`"
        raise WrapError(
            f"{what} {held} cached per row already (made by `somatize.torch.cache_rows`): "
            "a cache per batch around it would key each batch by that cache too, whose "
            "counts change at every call, so it would never keep or recall one. Cache one of "
            f"the two: {leave} (undeclared, or in `frozen=` only, the row cache is called as "
            "it is, and recalls its rows itself), or cache per batch the module itself, put "
            f"back in place of its cache ({back})"
        )


def wrap(
    model: nn.Module,
    *,
    frozen: Names = (),
    cached: Names = (),
    store: Store | str | os.PathLike[str] | None = None,
    strict: bool = False,
) -> Wrapped:
    """``model`` with its declared submodules as somatize nodes; see the module docstring.

    ``frozen`` and ``cached`` name submodules by qualified path (``"encoder"``,
    ``["backbone.stem", "encoder"]``); ``cached`` may map a name to a salt
    (``{"encoder": "v2"}``). ``True`` declares the model itself, which is then
    not traced: ``wrap(encoder, frozen=True, cached=True)`` works for any module, and
    ``cached={"": "v2"}`` caches it with a salt.
    A cached submodule must be frozen too. ``store`` is a :class:`somatize.Store`
    or a directory; without one, nothing is kept. ``strict`` computes again an answer
    kept by another version of a cached part's code (an earlier somatize's too) instead
    of recalling it as drifted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"wrap takes an nn.Module, got a `{type(model).__name__}`")
    if not isinstance(strict, bool):
        raise WrapError(f"strict= is True or False, got {strict!r}")
    if isinstance(model, Wrapped):
        raise WrapError(
            f"this `{type(model.model).__name__}` is wrapped already (made by "
            "`somatize.torch.wrap`): wrap the model inside once, declaring every submodule "
            "there, `wrap(model, frozen=[...], cached=[...])`"
        )
    # Before any name is looked up: a TorchScript module's parts are found by no `get`.
    refuse_scripted(type(model).__name__, model, WrapError)
    frozen_names = _names(frozen, model, "frozen")
    cached_names = _names(cached, model, "cached")
    for name in cached_names:
        if name not in frozen_names:
            raise Unsettled(name or type(model).__name__, name or type(model).__name__)
    declared = list(dict.fromkeys([*frozen_names, *cached_names]))
    for name in declared:
        inside = [other for other in declared if other and name.startswith(other + ".")]
        if inside and name:
            raise WrapError(
                f"`{name}` is declared inside `{inside[0]}`, which is declared too: a declared "
                "submodule is one node, never traced into. Declare one or the other"
            )
    _refuse_wrapped_parts(model, declared)
    _refuse_row_caches(model, cached_names)
    if "" in declared:
        return _strict(_whole(model, frozen_names, cached_names, store), strict)

    _refuse_global_hooks(model, "wrapping it and calling the wrapped model")
    own = hooks_of(model)
    if any(own[:-1]):
        kinds = [kind for kind, keys in zip(_HOOK_KINDS, own, strict=False) if keys]
        raise hooked_error("", " and ".join(kinds), "registered on it")
    wrapped = Wrapped.__new__(Wrapped)
    tracing = Tracing(model, frozen_names, cached_names, wrapped)
    refused = stand_in_default(model, tracing.signature)
    if refused is not None:
        raise refused
    optional = optional_of(model)
    tracing.trace_first(name for name, _, by_default in optional if by_default)
    first = tracing.first
    assert first is not None
    graph = Graph.somatize(Expr(list(first.nodes.values()), first.edges, first.outputs))
    Wrapped.__init__(wrapped, model, tracing.runners, graph, store, _Parts([], {}))
    tracing.watch()
    object.__setattr__(wrapped, "_tracing", tracing)
    object.__setattr__(wrapped, "_optional", optional)
    if tracing.signature is not None and not tracing.named and tracing.signature.parameters:
        object.__setattr__(wrapped, "_varying", tracing.signature)
    return _strict(wrapped, strict)


def _strict(wrapped: Wrapped, strict: bool) -> Wrapped:
    """``wrapped``, holding ``strict`` where it is so (else the class's False)."""
    if strict:
        # Set past `__setattr__`: a `strict` the model's code reads is the model's own.
        object.__setattr__(wrapped, "strict", True)
    return wrapped


def _whole(
    model: nn.Module,
    frozen_names: Mapping[str, str | None],
    cached_names: Mapping[str, str | None],
    store: Any,
) -> Wrapped:
    """The model itself as one declared node; nothing is traced."""
    name = _snake(type(model).__name__)
    cached = "" in cached_names
    watched = _Watched(name, model, model) if cached else None
    node = ModuleNode(model, spread=True, call=watched, declared={"args": "<inputs>"})
    if watched is not None:
        watched.node = node
    node._keys_precision = False  # each cached call keys the precision it runs in
    node.named(name)
    if "" in frozen_names:
        node.frozen()
    wrapped = _WrappedWhole.__new__(_WrappedWhole)
    call = _Bare(model)
    shim: nn.Module
    if cached:
        node.cached(cached_names[""])
        shim = _Cached(node, call, wrapped, forward_signature(model))
    else:
        shim = _Declared(node, call, wrapped)
    graph = Graph.somatize(node)
    runners: dict[Key, Runners] = {(frozenset(), ()): {True: shim, False: shim}}
    Wrapped.__init__(wrapped, model, runners, graph, store, _Parts([], {}))
    return wrapped


class _Bare(nn.Module):
    """Calls a module's forward (its hooks included) without registering it again. It
    runs no hooks of its own: torch's global ones run with the module it calls, and run
    on it too, a hook that changes what a module answers would change it once more."""

    model: nn.Module

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower() or "model"
