"""The traces of one model: one per set of optional arguments a call leaves None, each in
both modes, and what all of them read of the model, which the wrapped model watches.

fx hands every argument of the forward to the code as an input, and a branch on one
(``if mask is not None:``) takes the branch of a tensor. So ``wrap`` traces the forward
with every optional argument (one that defaults to None) given, and a call that leaves
some None runs code traced with those fixed at None (fx's ``concrete_args``), traced the
first time such a call comes. Every trace cuts the forward at the same declared calls,
each given the shim of the same name, so one node stands for it in all of them (a call
handed None where the first trace handed it the argument hands the shim None there): a
forward that calls its declared submodules otherwise when an argument is None is
refused, naming it, as one that does so in train and eval mode is.

What each trace went through and read — the modules traced into, their children and
hooks, the plain values read, the parts the cut code holds — is taken in with the rest,
and the wrapped model watches all of it: a change that would make any of its traces
other than the model is refused at the next call, whichever of them that call runs.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch import fx, nn

from somatize_torch._errors import NotCalled, Untraceable, WrapError
from somatize_torch._modes import switches
from somatize_torch._parts import _Parts, _Read, hooks_of
from somatize_torch._split import _calls, _Split, _split, _traced
from somatize_torch._values import Noted, Values

if TYPE_CHECKING:
    from somatize_torch.wrap import Wrapped

__all__ = ["Runners", "Tracing", "optional_of"]

Runners = dict[bool, nn.Module | Untraceable]
"""The code run in train (True) and eval mode, or why the forward could not be traced in
that mode."""


class _Gate:
    """Keeps the traces of one model and its wrapped model's eager calls apart. While fx
    traces the model, every module of it is put in the mode traced: a call of the wrapped
    model running in another thread then (a first call leaving arguments None traces while
    others run) would run in that mode. So a trace waits for the calls running in other
    threads to end, and a call waits for the trace; traces are taken one at a time, so
    threads making the same first call trace one after the other, and the second finds
    the first's. A copy of the wrapped model gets a gate of its own."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._calls: dict[int, int] = {}
        """Per thread, the calls it is in (a wrapped model calling another: two)."""
        self._tracer: int | None = None
        self._waiting = 0
        """The threads waiting to trace: a call begun then waits too, so that calls made
        one after the other in a busy thread do not hold a trace off for good."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Gate, ())

    def enter(self) -> None:
        """A call begins: once no other thread traces or waits to."""
        me = threading.get_ident()
        with self._changed:
            if not self._calls.get(me):
                while self._tracer not in (None, me) or (self._waiting and self._tracer != me):
                    self._changed.wait()
            self._calls[me] = self._calls.get(me, 0) + 1

    def leave(self) -> None:
        """A call ends."""
        me = threading.get_ident()
        with self._changed:
            left = self._calls[me] - 1
            if left:
                self._calls[me] = left
            else:
                del self._calls[me]
            self._changed.notify_all()

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """A trace taken: once no other thread traces or runs a call. The calls this
        thread is in (the one that traces) do not hold it off."""
        me = threading.get_ident()
        with self._changed:
            mine = self._calls.pop(me, 0)
            self._waiting += 1
            try:
                while self._tracer is not None or self._calls:
                    self._changed.wait()
            except BaseException:
                if mine:
                    self._calls[me] = mine
                raise
            finally:
                self._waiting -= 1
                self._changed.notify_all()
            self._tracer = me
        try:
            yield
        finally:
            with self._changed:
                self._tracer = None
                if mine:
                    self._calls[me] = mine
                self._changed.notify_all()


class Tracing:
    """The traces of ``model`` taken so far, and what they read of it."""

    def __init__(
        self,
        model: nn.Module,
        frozen: Mapping[str, str | None],
        cached: Mapping[str, str | None],
        wrapped: Wrapped,
    ) -> None:
        self.model = model
        self.frozen = dict(frozen)
        self.cached = dict(cached)
        self.declared = list(dict.fromkeys([*frozen, *cached]))
        self.wrapped = wrapped
        self.mode = bool(model.training)
        """The mode the model was wrapped in, traced first."""
        self.signature = forward_signature(model)
        """The signature of the model's forward, read once."""
        self.through: set[str] = set()
        self.read: Noted | None = None
        self.reads: list[_Read] = []
        self.switching = False
        self.first: _Split | None = None
        """The model traced in the mode it was wrapped in, every optional argument given
        (or every one None: :attr:`first_none`): the graph, and the shims every other
        trace is given."""
        self.first_none: frozenset[str] = frozenset()
        """The arguments the first trace took as None: none, or every optional one."""
        self.gate = _Gate()
        """Keeps this model's traces and its wrapped model's eager calls apart."""
        self.runners: dict[frozenset[str], Runners] = {}
        """Per set of optional arguments left None, the code each mode runs."""

    def trace(self, none: frozenset[str]) -> Runners:
        """The code run when the arguments ``none`` are None, traced in both modes; the
        first trace raises Untraceable where the mode the model is in cannot be traced,
        any other keeps it as that mode's runner. What a trace went
        through and read is taken in once both modes are cut, not from a trace refused."""
        runners: Runners = {}
        done: list[tuple[fx.GraphModule, nn.Module]] = []
        through: set[str] = set()
        noted: list[Noted] = []
        reads: list[_Read] = []
        switching = False
        for training in (self.mode, not self.mode):
            try:
                traced, went, read = _traced(
                    self.model,
                    self.declared,
                    training,
                    self.frozen,
                    {name: None for name in sorted(none)},
                )
            except Untraceable as error:
                if self.first is None:
                    raise
                runners[training] = _with_none(error, none)
                continue
            through |= went
            noted.append(read)
            switching = switching or switches(traced.graph)
            same = next((runner for code, runner in done if code.code == traced.code), None)
            if same is not None:
                runners[training] = same
                continue
            cut = _split(traced, self.model, self.frozen, self.cached, self.wrapped, self.first)
            self._check_calls(cut, none, training)
            reads += cut.reads
            runners[training] = cut.runner
            done.append((traced, cut.runner))
        self.through |= through
        for read in noted:
            if self.read is None:
                self.read = read
            else:
                self.read.merge(read)
        self.reads += reads
        self.switching = self.switching or switching
        self.runners[none] = runners
        return runners

    def trace_first(self, optional: Iterable[str]) -> None:
        """The first trace: with every optional argument given, or, where fx cannot trace
        that (the forward branches on one's value), with every one None — a call giving
        them all is then refused with why that could not be traced."""
        try:
            self.trace(frozenset())
        except Untraceable as error:
            every = frozenset(optional)
            if not every:
                raise
            try:
                self.trace(every)
            except Untraceable:
                raise error from None
            self.runners[frozenset()] = {True: error, False: error}

    def _check_calls(self, cut: _Split, none: frozenset[str], training: bool) -> None:
        """Refuses a trace that calls the declared submodules otherwise than the first."""
        if self.first is None:
            self.first, self.first_none = cut, none
            optional = [name for name, _, by_default in optional_of(self.model) if by_default]
            for name in self.declared:
                if name not in cut.targets:
                    raise NotCalled(
                        f"`{name}` is declared, and `{type(self.model).__qualname__}.forward`"
                        f"{_traced_as(optional, none)}never calls it (it may be reached "
                        "through a function fx cannot see into"
                        f"{_otherwise(optional, none)}): nothing of it can be frozen or "
                        "cached here. Drop it from the declarations, or call it in forward"
                        f"{' whatever the arguments' if optional else ''}"
                    )
            return
        if cut.calls == self.first.calls:
            return
        model = type(self.model).__qualname__
        if not none:
            raise WrapError(
                f"`{model}.forward` calls its declared submodules differently in train and "
                f"eval mode ({_calls(self.first.calls)} in "
                f"{'train' if self.mode else 'eval'} mode, {_calls(cut.calls)} in the "
                "other, or with other constant arguments, or other inputs in their places): one "
                "graph cannot describe both. "
                "Declare the submodule that holds the code that reads `self.training`, or "
                "call the declared submodules the same way in both modes"
            )
        if self.first_none:
            # Traced first with every optional argument None: this call gives some.
            given = self.first_none - none
            this, first, advice = (
                f"{_are(given, 'given')}",
                "every optional argument is None",
                "Leave them None in every call",
            )
        else:
            this, first, advice = (
                _are(none, "None"),
                "every argument is given",
                "Give every argument in every call",
            )
        raise WrapError(
            f"`{model}.forward` calls its declared submodules differently when {this} "
            f"({_calls(cut.calls)} in {'train' if training else 'eval'} mode, "
            f"{_calls(self.first.calls)} when {first}, or with other constant arguments, or "
            "other inputs in their places): one graph cannot describe both. "
            f"{advice}, declare the submodule that holds the code that branches on it, or "
            "call the declared submodules the same way whether it is given or not"
        )

    def watch(self) -> None:
        """Has the wrapped model watch what every trace so far went through and read."""
        assert self.first is not None and self.read is not None
        model, wrapped, read = self.model, self.wrapped, self.read
        traced_into = {path: model.get_submodule(path) for path in sorted(self.through) if path}
        went = sorted({*read.children.values(), *traced_into})
        children = {
            path: tuple(model.get_submodule(path)._modules)
            for path in went
            if not any(path == name or path.startswith(name + ".") for name in self.declared)
        }
        hooks = {path: hooks_of(module) for path, module in [("", model), *traced_into.items()]}
        parts = _Parts(self.reads, self.first.targets, traced_into, children, hooks)
        parts.watch(model)
        object.__setattr__(wrapped, "_parts", parts)
        # The modules whose training flag the code holds: those traced into, and those
        # whose flag it read.
        flags = self.through | {one.path for one in read.modes.values()}
        object.__setattr__(wrapped, "_through", tuple(sorted(flags)))
        object.__setattr__(wrapped, "_switches", self.switching)
        object.__setattr__(wrapped, "_values", Values(read, type(model).__qualname__))
        object.__setattr__(
            wrapped,
            "_one_code",
            all(len({id(r) for r in runners.values()}) == 1 for runners in self.runners.values()),
        )

    def runners_without(self, none: frozenset[str]) -> Runners:
        """The code run when the arguments ``none`` are None, traced now if no call left
        them None before; what the new trace reads is watched from then on."""
        with self.gate.tracing():
            found = self.runners.get(none)
            if found is None:
                # What a compiled call does not check before it comes here: the model is
                # checked as an eager call checks it, so what the other traces read of it
                # is what it holds, and is watched on as they read it.
                self.wrapped._follow()
                self.wrapped._values.check()
                found = self.trace(none)
                self.watch()
            return found


def _are_none(none: frozenset[str]) -> str:
    """ "`a` is None", "`a`, `b` are None"."""
    return _are(none, "None")


def _are(names: frozenset[str], state: str) -> str:
    """ "`a` is {state}", "`a`, `b` are {state}"."""
    left = ", ".join(f"`{name}`" for name in sorted(names))
    return f"{left} {'is' if len(names) == 1 else 'are'} {state}"


def _traced_as(optional: list[str], none: frozenset[str]) -> str:
    """How the first trace took the optional arguments, for a message (" " for none)."""
    if not optional:
        return " "
    shown = ", ".join(f"`{name}`" for name in optional[:6])
    return f", traced with {shown} {'None' if none else 'given'}, "


def _otherwise(optional: list[str], none: frozenset[str]) -> str:
    """When else the forward may call a declared submodule, for a message."""
    if not optional:
        return ""
    return f", or called only when one of those is {'given' if none else 'None'}"


def _with_none(error: Untraceable, none: frozenset[str]) -> Untraceable:
    """``error``, saying which arguments the trace took as None."""
    if not none:
        return error
    said = Untraceable(f"{_are_none(none)} in this call, and {error}")
    said.__cause__ = error.__cause__
    return said


def forward_signature(model: nn.Module) -> inspect.Signature | None:
    """The signature of ``model``'s forward; None where it cannot be read."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def optional_of(model: nn.Module) -> tuple[tuple[str, int | None, bool], ...]:
    """The named arguments of ``model``'s forward, each with its place among the
    positional ones (None for a keyword-only one) and whether it defaults to None: a call
    may leave any of them None, given so, and one that defaults to None left out."""
    signature = forward_signature(model)
    if signature is None:
        return ()
    varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    # A forward taking `*args` or `**kwargs` is traced once: one of its arguments given
    # None where another default stands is handed to that code as it was before.
    once = any(parameter.kind in varying for parameter in signature.parameters.values())
    found: list[tuple[str, int | None, bool]] = []
    for at, (name, parameter) in enumerate(signature.parameters.items()):
        if parameter.kind in varying or (once and parameter.default is not None):
            continue
        positional = parameter.kind is not inspect.Parameter.KEYWORD_ONLY
        found.append((name, at if positional else None, parameter.default is None))
    return tuple(found)
