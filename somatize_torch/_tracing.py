"""The traces of one model: one per set of optional arguments a call leaves None and of
values it gives the arguments the forward branches on, each in both modes, and what all
of them read of the model, which the wrapped model watches.

fx hands every argument of the forward to the code as an input, and a branch on one
(``if mask is not None:``) takes the branch of a tensor. So ``wrap`` traces the forward
with every optional argument (one that defaults to None) given, and a call that leaves
some None runs code traced with those fixed at None (fx's ``concrete_args``), traced the
first time such a call comes. Every trace cuts the forward at the same declared calls,
each given the shim of the same name, so one node stands for it in all of them (a call
handed None where the first trace handed it the argument hands the shim None there; one
handed other constants, or its inputs otherwise, is given a shim of its own for the
same node, keyed apart by the call it makes): a forward that calls other declared
submodules, or in another order, when an argument is None is refused, naming it, as
one that calls them otherwise in train and eval mode is.

A forward that branches on (or iterates over) an argument's value — ``if pool:``,
``if mode == "max":``, ``range(n_layers)`` — cannot be traced with it as an input either:
such an argument is traced fixed at a value, the one a call gives (its default at
``wrap``), one trace per set of such values, kept by :func:`value_key` (kind and value,
so ``True`` and ``1`` are apart). Only the arguments fx stopped at are fixed, found from
the proxy it was asked to branch on, or, where it stopped otherwise, as the fewest of the
plain values given that let it trace; each is fixed in every later trace, and a value
that is no plain constant is refused naming it. Every other argument a call hands a
plain constant is traced fixed at it too: fx answers `flag is True`, `type(n) is int`,
`mode in {...}` or `f"{mode}"` for its stand-in without a branch it notices, and the
code it traced would keep one answer for every value, whether it uses the argument
beside or not, so no stand-in is handed one (a tensor, or what is no plain constant,
is an input). The traces per value are bounded (``Wrapped.TRACES_PER_VALUE``).

A tensor the forward makes from numbers (``torch.ones(4)``, ``torch.linspace(0, 1, 4)``)
is made once, as fx traces, and kept as a constant, in the default dtype of that moment
(``torch.set_default_dtype``), as is what the forward reads of it
(``torch.get_default_dtype()``). Where a trace kept such a floating tensor, or read it,
the traces are kept per default dtype, as per values of a config: a call under another
default dtype than the traces it would run were taken under runs those taken under its
own, traced first if no call was made under it. A model whose code keeps neither is
traced once for every default dtype, and a call compares nothing.

What each trace went through and read — the modules traced into, their children and
hooks, the plain values read, the parts the cut code holds — is taken in with the rest,
and the wrapped model watches all of it: a change that would make any of its traces
other than the model is refused at the next call, whichever of them that call runs.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from somatize._threads import ProcessLock
from somatize_torch._errors import NotCalled, Untraceable, WrapError
from somatize_torch._modes import enters_blocks, switches
from somatize_torch._parts import _Parts, _Read, aliases_of, hooks_of, untied, untied_said
from somatize_torch._split import Traced, _calls, _Split, _split, _traced, identity_asked
from somatize_torch._values import Noted, Reread, Values
from somatize_torch.freeze import keyed_with

if TYPE_CHECKING:
    from somatize_torch.wrap import Wrapped

__all__ = ["INPUT", "Key", "Runners", "Tracing", "input_key", "optional_of", "value_key"]

Runners = dict[bool, nn.Module | Untraceable]
"""The code run in train (True) and eval mode, or why the forward could not be traced in
that mode."""


Key = tuple[frozenset[str], tuple[Any, ...]]
"""What picks the code a call runs: the optional arguments it leaves None, and the
value (:func:`value_key`) of each named argument, :data:`INPUT` for one taken as an
input, in the signature's order, but those left None."""

PLAIN = (
    "a bool, an int, a float, a str, None, an Enum member, a torch.dtype, a tuple of them, "
    "or a frozen dataclass of them"
)
"""What an argument the forward branches on may be handed, for a message."""


def value_key(value: Any) -> Any:
    """``value`` as what picks a trace, kind first — ``True`` and ``1``, ``0.0`` and
    ``-0.0`` are equal in Python and may be traced apart; a NaN is one value — or None
    where it is not a plain constant a trace can be fixed at."""
    kind = type(value)
    if kind in (bool, int, str, bytes) or value is None:
        return (kind, value)
    if kind in (float, complex):
        return (kind, repr(value))
    if isinstance(value, enum.Enum):
        if value.name is not None:
            return (kind, value.name)
        # A flag's members combined, or bits no member names, have no name of their own
        # (`Option(4)`, `Option(8)`: both None): told apart by value.
        inner = value_key(value._value_)
        return None if inner is None else (kind, None, inner)
    if isinstance(value, torch.dtype):
        return (torch.dtype, str(value))
    if kind is tuple or (isinstance(value, tuple) and hasattr(kind, "_fields")):
        inner = tuple(value_key(one) for one in value)
        return None if any(one is None for one in inner) else (kind, inner)
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and params.frozen and dataclasses.is_dataclass(value):
        # A frozen dataclass of constants (options handed whole): by its fields' values.
        fields = tuple(
            (field.name, value_key(getattr(value, field.name)))
            for field in dataclasses.fields(value)
        )
        return None if any(one is None for _, one in fields) else (kind, fields)
    return None


def input_key(value: Any) -> Any:
    """What picks a trace for an argument taken as an input, handed ``value``: a tensor is
    :data:`INPUT`; a list, tuple or dict (of tensors) is an input of its kind, traced
    apart from a tensor, since the code traced for a stand-in answers what the forward asks
    of its kind for one kind only; anything else (an object, a sentinel) is None: fx would
    stand in for it, and answer `arg is DEFAULT` or `isinstance(arg, Options)` for the
    stand-in, whatever the call gives."""
    if isinstance(value, torch.Tensor):
        return INPUT
    if type(value) in (list, tuple, dict):
        return ("<input>", type(value).__name__)
    return None


def is_input(key: Any) -> bool:
    """Whether ``key`` picks a trace taking the argument as an input (:func:`input_key`)."""
    return key is INPUT or (type(key) is tuple and len(key) == 2 and key[0] == "<input>")


def not_stood_in(name: str, value: Any, model: nn.Module) -> WrapError:
    """The refusal of a call handing ``name`` what is neither a tensor, a list, tuple or dict
    of them, nor a plain constant."""
    return WrapError(
        f"`{name}` is a `{kind_of(value)}` in this call: fx traces "
        f"`{type(model).__qualname__}.forward` with a stand-in for what is no plain "
        f"constant, and answers what the forward asks of it (`{name} is DEFAULT`, "
        f"`isinstance({name}, ...)`) for the stand-in, whatever the call gives, so the code "
        "traced may not be the forward's for this value. Hand it a tensor, a list, tuple "
        f"or dict of tensors, or a plain constant ({PLAIN}: `bool({name})`, `{name}.item()`), "
        "at which the forward is traced, or declare the submodule that takes it, which is "
        "never traced into"
    )


def not_plain(name: str, value: Any, model: nn.Module, why: object = None) -> WrapError:
    """The refusal of a call handing ``name``, which the forward branches on, ``value``;
    with ``why``, where fx found it does."""
    return WrapError(
        f"`{name}` is a `{kind_of(value)}` in this call, and "
        f"`{type(model).__qualname__}.forward` branches on its value: fx cannot trace that, "
        f"so the forward is traced once per value of `{name}`, and that value must be a "
        f"plain constant ({PLAIN}). Hand it one (`bool({name})`, `{name}.item()`, a tuple "
        "for a list), or declare the submodule that branches on it, which is never traced "
        f"into{'' if why is None else f'. {why}'}"
    )


def kind_of(value: Any) -> str:
    """The kind of ``value`` for a message, with its module where it is not a builtin
    one: `numpy.bool`, not `bool`, which reads as a plain flag."""
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


INPUT = ("<input>",)
"""What picks a trace for an argument handed what is no plain constant (a tensor), one
the forward does not branch on: it is an input there."""


class _Grow(Exception):
    """A trace fixing more arguments at the values a call gives is needed: those the
    forward branches on."""

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__()
        self.names = tuple(names)


class _Gate:
    """Keeps the traces of one model and its wrapped model's eager calls apart. While fx
    traces the model, every module of it is put in the mode traced: a call of the wrapped
    model running in another thread then (a first call leaving arguments None traces while
    others run) would run in that mode. So a trace waits for the calls running in other
    threads to end, and a call waits for the trace; traces are taken one at a time, so
    threads making the same first call trace one after the other, and the second finds
    the first's. A copy of the wrapped model gets a gate of its own.

    A forked child (a DataLoader worker forked while a thread of its parent runs the
    model) has only the thread that forked: the calls and the trace of the parent's other
    threads are forgotten there (:meth:`_own`), and its lock is made unheld
    (:class:`~somatize._threads.ProcessLock`), or its first trace would wait for them for
    good."""

    def __init__(self) -> None:
        self._changed = threading.Condition(ProcessLock())
        self._pid = os.getpid()
        self._calls: dict[int, int] = {}
        """Per thread, the calls it is in (a wrapped model calling another: two)."""
        self._tracer: int | None = None
        self._waiting = 0
        """The threads waiting to trace: a call begun then waits too, so that calls made
        one after the other in a busy thread do not hold a trace off for good."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Gate, ())

    def _own(self, me: int) -> None:
        """In a forked child, keeps only what the thread that forked (``me``, the only one
        there) was doing: the other threads' calls, trace and waits are the parent's.
        Called with ``_changed`` held."""
        pid = os.getpid()
        if self._pid == pid:
            return
        self._pid = pid
        mine = self._calls.get(me)
        self._calls = {me: mine} if mine else {}
        if self._tracer != me:
            self._tracer = None
        self._waiting = 0  # the thread that forked was not waiting: it forked

    def enter(self) -> None:
        """A call begins: once no other thread traces or waits to."""
        me = threading.get_ident()
        with self._changed:
            self._own(me)
            if not self._calls.get(me):
                while self._tracer not in (None, me) or (self._waiting and self._tracer != me):
                    self._changed.wait()
            self._calls[me] = self._calls.get(me, 0) + 1

    def leave(self) -> None:
        """A call ends."""
        me = threading.get_ident()
        with self._changed:
            self._own(me)
            left = self._calls[me] - 1
            if left:
                self._calls[me] = left
            else:
                del self._calls[me]
            self._changed.notify_all()

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """A trace taken: once no other thread traces or runs a call. The calls this
        thread is in (the one that traces) do not hold it off, nor does a trace it takes
        already (one that finds the parts it reads given apart)."""
        me = threading.get_ident()
        with self._changed:
            self._own(me)
            within = self._tracer == me
        if within:
            yield
            return
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


class _World:
    """The traces taken for one set of values of what the forward read from the plain
    objects the model's modules hold (``self.config.flag``), and what they read; where the
    code holds what the default dtype made (:attr:`Tracing.dtyped`), under one default
    dtype; and while the parts they hold under two names are held so."""

    def __init__(self, runners: dict[Key, Runners], dtype: torch.dtype) -> None:
        self.runners = runners
        self.read: Noted | None = None
        self.dtype = dtype
        """The default dtype the traces were taken under."""
        self.aliases: dict[str, tuple[str, ...]] = {}
        """The other names of each part the traces hold that the model held under more
        than one as they were taken (:func:`aliases_of`): fx records such a part by one of
        them, wherever the forward reads it, so the traces are not the forward's once
        the names hold two parts."""
        self.reads: set[str] = set()
        """The paths of the parts the traces' code reads."""

    def note(self, model: nn.Module, paths: Iterable[str], reads: Iterable[_Read]) -> None:
        """Notes what a trace holding the parts at ``paths`` (those it calls and goes
        through) and ``reads`` reads, and the other names the model holds them under now."""
        read = [one.path for one in reads]
        self.reads.update(read)
        for path, names in aliases_of(model, [*paths, *read]).items():
            self.aliases[path] = tuple(dict.fromkeys([*self.aliases.get(path, ()), *names]))

    def holds(self, model: nn.Module) -> bool:
        """Whether ``model`` holds each part the traces hold under two names under all
        of them still."""
        return untied(model, self.aliases) is None


def _refused_only(world: _World) -> bool:
    """Whether ``world`` holds no trace fx took: none yet, or only a call refused in both
    modes (kept to refuse the same call at once): one to take the traces of other values in
    its place, not counted among those the model keeps."""
    return not any(
        isinstance(runner, nn.Module) for each in world.runners.values() for runner in each.values()
    )


class _Untraced(Values):
    """What a wrapped model watches while no trace was taken for the values the plain
    objects its modules hold hold now: any call looks for the traces for those it holds
    then."""

    def __init__(self, values: Values) -> None:
        self.__dict__.update(vars(values))

    def same(self) -> bool:
        return False

    def check(self) -> None:
        raise Reread("the values the model's config holds were not traced yet")


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
        self.defaults = defaults_of(model)
        """The defaults of the model's forward when it was traced, which the code traced
        takes an argument left out at: watched by :meth:`check_defaults`."""
        self.named: dict[str, tuple[int | None, Any]] = _named(self.signature)
        """The forward's named arguments, each with its place among the positional ones
        (None for a keyword-only one) and its default: those a trace may fix at the value
        a call gives (none where the forward takes `*args` or `**kwargs`)."""
        self.fixed: tuple[str, ...] = ()
        """The arguments the forward branches on, which fx cannot take as inputs: each
        trace has them fixed at the values a call gives, in the signature's order."""
        self.why: dict[str, str] = {}
        """Where fx found that the forward branches on an argument of :attr:`fixed`, for
        the refusal of a call handing it what is no plain constant, where a call did."""
        self.through: set[str] = set()
        self.identity: frozenset[str] = identity_asked(model)
        """The forward's arguments compared by identity (``opts is PRESET``), in its own
        code or in code a trace found it hands them to: one handed a tuple or a dataclass,
        traced per value, is refused."""
        self.read: Noted | None = None
        self.reads: list[_Read] = []
        self.switching = False
        self.entering = False
        self.first: _Split | None = None
        """The model traced in the mode it was wrapped in, every optional argument given
        (or every one None: :attr:`first_none`): the graph, and the shims every other
        trace is given."""
        self.first_none: frozenset[str] = frozenset()
        """The arguments the first trace took as None: none, or every optional one."""
        self.first_key: Key = (frozenset(), ())
        self.first_said = ""
        """What the first trace fixed, for a message ("" for nothing)."""
        self.gate = _Gate()
        """Keeps this model's traces and its wrapped model's eager calls apart."""
        self.runners: dict[Key, Runners] = {}
        """Per set of optional arguments left None and values of those :attr:`fixed`, the
        code each mode runs: those of :attr:`world`."""
        self.dtyped = False
        """Whether a trace kept what the default dtype made as it traced: a floating tensor
        the forward made from numbers (``torch.ones(4)``), which fx keeps as a constant, or
        the default dtype read. Each default dtype a call is made under then has traces of
        its own (:meth:`check_dtype`)."""
        self.world = _World(self.runners, torch.get_default_dtype())
        """The traces taken for the values the plain objects the model's modules hold (a
        config) hold now, as far as the forward read them."""
        self.worlds = [self.world]
        """Every set of traces taken for values of those objects, the first at ``wrap``."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # A copy's defaults are copies: the forward's own are what it holds now.
        self.defaults = defaults_of(self.model)

    def check_defaults(self) -> None:
        """Refuses a call once the defaults of the model's forward were changed after it
        was traced (its ``__defaults__`` or ``__kwdefaults__``): the code traced would
        take an argument left out at the old one."""
        if self.same_defaults():
            return
        old, new = dict(self.defaults), dict(defaults_of(self.model))
        changed = [
            name
            for name in dict.fromkeys([*old, *new])
            if old.get(name, _NONE) is not new.get(name, _NONE)
        ]
        name = changed[0] if changed else "?"
        raise WrapError(
            f"the default of `{name}` in `{type(self.model).__qualname__}.forward` changed "
            f"after `wrap` ({_shown(old.get(name, _NONE))} then, {_shown(new.get(name, _NONE))} "
            "now): the code traced takes an argument a call leaves out at the default it "
            "had then, and would not answer as the forward does now. Wrap the model again "
            "after changing its defaults, or put them back"
        )

    def check_dtype(self) -> None:
        """Has the wrapped model run the traces taken under the default dtype in force now,
        where the code holds what the default dtype made as it traced: those taken before
        under it, for the values the model's config holds, or none yet, so that the call
        traces the forward again."""
        if torch.get_default_dtype() is self.world.dtype:
            return
        with self.gate.tracing():
            made = torch.get_default_dtype()
            if made is not self.world.dtype:
                self._rekey(f"the default dtype is {made} in this call")

    def same_defaults(self) -> bool:
        """Whether the defaults of the model's forward are the very ones it was traced
        with: read in compiled code too, which torch.compile guards on, so a change has
        the call compiled anew, and refused (:meth:`check_defaults`, made eagerly)."""
        now = defaults_of(self.model)
        was = self.defaults
        return len(now) == len(was) and all(
            a is b and c is d for (a, c), (b, d) in zip(was, now, strict=True)
        )

    def key(self, none: frozenset[str], given: Mapping[str, Any]) -> Key:
        """What picks the code for a call leaving ``none`` None and giving ``given``."""
        values = []
        for name in self.keyed():
            if name not in none:
                # One the first trace takes as an input, with no value (an optional
                # argument), is one there.
                found = value_key(given[name]) if name in given else INPUT
                if found is None:
                    if name not in self.fixed:
                        found = input_key(given[name])
                        if found is None:
                            raise not_stood_in(name, given[name], self.model)
                    else:
                        raise not_plain(name, given[name], self.model, self.reason(name))
                values.append(found)
        return none, tuple(values)

    def reason(self, name: str) -> str | None:
        """Where fx found that the forward branches on ``name``, where it was said."""
        return getattr(self, "why", {}).get(name)

    def keyed(self) -> tuple[str, ...]:
        """The arguments whose values pick a trace, in the signature's order: every named
        one. Those :attr:`fixed` are traced at the value a call gives, which must be a
        plain constant; any other is traced at a plain constant a call hands it, and as
        an input otherwise: fx answers `flag is True`, `type(n) is int`, `mode in {...}`,
        `table.get(name)` and `f"{mode}"` for the stand-in it hands the forward without
        a branch it notices, so no code traced with a stand-in is the forward's for every
        plain value, whether it uses the argument beside or not."""
        return tuple(self.named)

    def by_value(self, key: Key) -> dict[str, Any]:
        """The arguments ``key`` picks a trace by the plain value of, with it (those left
        None and those taken as inputs aside)."""
        names = [name for name in self.keyed() if name not in key[0]]
        return {
            name: value for name, value in zip(names, key[1], strict=True) if not is_input(value)
        }

    def branched(self, key: Key) -> dict[str, Any]:
        """:meth:`by_value`, of the arguments the forward branches on only."""
        return {name: value for name, value in self.by_value(key).items() if name in self.fixed}

    def _keep_keyed(self) -> None:
        """Has the wrapped model pick the code by the arguments :meth:`keyed` names."""
        object.__setattr__(
            self.wrapped,
            "_fixed",
            tuple((name, *self.named[name], name not in self.fixed) for name in self.keyed()),
        )

    def trace(self, none: frozenset[str], given: Mapping[str, Any]) -> Runners:
        """The code run when the arguments ``none`` are None and the others are ``given``
        (those the forward branches on fixed at their values there), traced in both modes;
        the first trace raises Untraceable where the mode the model is in cannot be traced,
        any other keeps it as that mode's runner where the other mode was traced (one
        refused in both is kept only as :meth:`_keep_refused` says). What a trace went
        through and read is taken in once both modes are cut, not from a trace refused. A
        trace fx cannot take because the forward branches on (or iterates over) an argument
        a call gives a plain value is taken again with it fixed at that value, and so is
        every later one."""
        for _ in range(len(self.named) + 1):
            try:
                return self._trace(none, given)
            except _Grow as grow:
                wanted = {*self.fixed, *grow.names}
                self.fixed = tuple(name for name in self.named if name in wanted)
                self._keep_keyed()
        raise AssertionError("each retrace fixes one more argument")  # pragma: no cover

    def _trace(self, none: frozenset[str], given: Mapping[str, Any]) -> Runners:
        key = self.key(none, given)
        concrete: dict[str, Any] = {name: None for name in sorted(none)}
        concrete.update((name, given[name]) for name in self.fixed if name not in none)
        concrete.update(
            (name, given[name])
            for name in self.named
            if name not in none and name in given and value_key(given[name]) is not None
        )
        said = _said(concrete)
        if self.by_value(key) and self.first is not None:
            self._bound(key)
        attempts: list[tuple[bool, Traced | Untraceable]] = []
        for training in (self.mode, not self.mode):
            try:
                attempts.append(
                    (
                        training,
                        _traced(
                            self.model,
                            self.declared,
                            training,
                            self.frozen,
                            concrete,
                            [name for name in given if input_key(given[name]) not in (None, INPUT)],
                        ),
                    )
                )
            except Untraceable as error:
                grow = self._to_fix(error, training, concrete, given)
                if grow:
                    raise _Grow(grow) from None
                if self.first is None and training == self.mode:
                    raise
                attempts.append((training, _with_none(error, said)))
        runners: Runners = {}
        done: list[tuple[fx.GraphModule, nn.Module]] = []
        through: set[str] = set()
        noted: list[Noted] = []
        reads: list[_Read] = []
        switching = entering = False
        made: list[list[tuple[str, Any]]] = []
        for training, attempt in attempts:
            if isinstance(attempt, Untraceable):
                runners[training] = attempt
                continue
            traced, went, read, compared, dtyped = attempt
            self.identity |= compared
            if dtyped and not self.dtyped:
                # The traces before held nothing the default dtype made, and are right
                # under any: those of this world are now the ones for this default dtype.
                self.dtyped = True
                self.world.dtype = torch.get_default_dtype()
            through |= went
            noted.append(read)
            switching = switching or switches(traced.graph)
            entering = entering or enters_blocks(traced.graph)
            same = next((runner for code, runner in done if code.code == traced.code), None)
            if same is not None:
                runners[training] = same
                continue
            cut = _split(traced, self.model, self.frozen, self.cached, self.wrapped, self.first)
            self._check_calls(cut, none, training, key, said, made[0] if made else None)
            made.append(cut.calls)
            reads += cut.reads
            runners[training] = cut.runner
            done.append((traced, cut.runner))
        self.through |= through
        self.world.note(self.model, [*(self.first.targets if self.first else ()), *through], reads)
        for read in noted:
            if self.world.read is None:
                self.world.read = Noted(self.model)
            self.world.read.merge(read)
            if self.read is None:
                self.read = read
            else:
                self.read.merge(read)
        self.reads += reads
        self.switching = self.switching or switching
        self.entering = self.entering or entering
        if noted:
            self.runners[key] = runners
        else:
            self._keep_refused(key, runners)
        return runners

    def _keep_refused(self, key: Key, runners: Runners) -> None:
        """Keeps ``runners``, both refused by fx, for ``key`` in a set of traces that holds
        no other yet (one for values of the config traced for nothing yet), with what the
        refused traces read before fx stopped: watched so, a call while the config holds
        those values is refused at once, and one after it changed looks for the traces
        for its new values. Where what they read is not known, or that set holds other
        traces (whose watch it would widen), the refusal is not kept: the next call
        traces again, for the values it finds then."""
        world = self.world
        reads = [refused.read for refused in runners.values() if isinstance(refused, Untraceable)]
        if world.read is not None or self.runners or not all(reads):
            return
        world.read = Noted(self.model)
        for read in reads:
            world.read.merge(read)
        self.runners[key] = runners

    def _to_fix(
        self,
        error: Untraceable,
        training: bool,
        concrete: Mapping[str, Any],
        given: Mapping[str, Any],
    ) -> tuple[str, ...]:
        """The arguments to fix at the values ``given`` so that fx may trace the forward
        where ``error`` says it could not: those whose values it branched on or iterated
        over, when each is a plain value; where fx stopped otherwise (``range(n)``), the
        fewest of those given plain values that make it traceable. None when fixing any
        would not do."""
        branched = error.branched
        if branched is not None:
            wanted = [name for name in self.named if name in branched and name not in concrete]
            for name in wanted:
                if (
                    name in given
                    and value_key(given[name]) is None
                    and self.named[name][1] is not inspect.Parameter.empty
                ):
                    # An argument with a default, handed what no trace is fixed at: said
                    # so, and not kept for the calls that hand it a plain value. Known
                    # from here on as one the forward branches on, refused at once.
                    if self.first is not None:
                        known = {*self.fixed, name}
                        self.fixed = tuple(one for one in self.named if one in known)
                        self.why[name] = str(error)
                        self._keep_keyed()
                        raise not_plain(name, given[name], self.model, error) from error
                    kind = f"a `{kind_of(given[name])}`"
                    told = Untraceable(
                        f"`{name}` defaults to {kind}, and the forward branches on its value, "
                        "which is traced fixed at each value a call gives only where that is "
                        f"{PLAIN}: {error}"
                    )
                    told.branched = error.branched
                    raise told from error.__cause__
            if all(name in given and value_key(given[name]) is not None for name in wanted):
                return tuple(wanted)
            return ()
        candidates = [
            name
            for name in self.named
            if name in given and name not in concrete and value_key(given[name]) is not None
        ]

        def traces(names: list[str]) -> bool:
            fixed = {**concrete, **{name: given[name] for name in names}}
            try:
                _traced(self.model, self.declared, training, self.frozen, fixed)
            except Untraceable:
                return False
            return True

        if not candidates or not traces(candidates):
            return ()
        kept = list(candidates)
        for name in candidates:
            fewer = [other for other in kept if other != name]
            if traces(fewer):
                kept = fewer
        return tuple(kept)

    def _bound(self, key: Key) -> None:
        """Refuses one more trace for values once the model has as many as it keeps, but
        one taking as inputs (tensors) arguments a trace for the same arguments left None
        fixed, at values that trace had for the others: as bounded as those traces, and
        what the refusal tells a call to do."""
        limit: int = self.wrapped.TRACES_PER_VALUE
        valued = [one for one in self.runners if self.by_value(one)]
        if len(valued) < limit:
            return
        given = self.by_value(key).items()
        if any(one[0] == key[0] and given <= self.by_value(one).items() for one in valued):
            return
        # The arguments the traces were taken apart for: those given more than one value.
        seen: dict[str, set[Any]] = {}
        for one in valued:
            for name, value in self.by_value(one).items():
                seen.setdefault(name, set()).add(value)
        apart = [name for name in self.keyed() if len(seen.get(name, ())) > 1]
        names = ", ".join(f"`{name}`" for name in apart or list(seen))
        left = sorted({name for none, _ in valued for name in none})
        again = (
            f", and apart again for each set of arguments a call leaves None (here "
            f"{', '.join(f'`{name}`' for name in left)} left None or given)"
            if left
            else ""
        )
        raise WrapError(
            f"`{type(self.model).__qualname__}.forward` was traced {limit} times already for "
            f"values of {names}: a plain constant a call hands the forward (a flag, a count, "
            "a name) is traced as the constant it is, since fx cannot trace a branch on it "
            "(nor see one as `flag is True`), so each set of values a call gives is traced "
            f"apart{again}, and no more traces are taken, to keep them bounded. Give one of "
            "the values traced, hand a number that changes from call to call as a tensor "
            "(`torch.tensor(scale)`), which is an input, declare the submodule that "
            "branches on them (it is never traced into), write the branch as tensor code "
            "(`torch.where`), or raise `Wrapped.TRACES_PER_VALUE` on this wrapped model"
        )

    def trace_first(self, optional: Iterable[str]) -> None:
        """The first trace: with every optional argument given, and those with a default
        the forward branches on fixed at it; or, where fx cannot trace that (the forward
        branches on one's value), with every one None — a call giving them traces the
        forward then, with those it branches on fixed at its values."""
        given = {
            name: default
            for name, (_, default) in self.named.items()
            if default is not None and default is not inspect.Parameter.empty
        }
        try:
            self.trace(frozenset(), given)
        except Untraceable as error:
            every = frozenset(optional)
            if not every:
                raise self._without_default(error) from error.__cause__
            try:
                self.trace(every, given)
            except Untraceable as stopped:
                if error.branched and error.branched <= every and stopped.where != error.where:
                    # Taken with those None, the trace got past where the first stopped.
                    raise _past(stopped, error, every) from stopped.__cause__
                raise self._without_default(error) from error.__cause__
            if not self.named:
                # A forward taking `*args` or `**kwargs` is not traced for values.
                self.runners[(frozenset(), ())] = {True: error, False: error}

    def _without_default(self, error: Untraceable) -> Untraceable:
        """``error``, naming the arguments it branched on that have no default to trace
        them at."""
        assert self.signature is not None
        if error.tensors:
            # A branch on a tensor's shape or value: no default lifts it, and it says so.
            return error
        names = [
            name
            for name, (_, default) in self.named.items()
            if name in (error.branched or ())
            and default is inspect.Parameter.empty
            # Not one annotated as a tensor, whose value no trace is fixed at.
            and "Tensor" not in str(self.signature.parameters[name].annotation)
        ]
        if not names:
            return error
        shown = ", ".join(f"`{name}`" for name in names)
        told = Untraceable(
            f"the forward branches on the value of {shown}, which has no default: `wrap` "
            "traces an argument the forward branches on fixed at its default, and at each "
            "value a call gives after, where that is a plain constant. Where it takes such "
            f"values (a flag, a count, a name), give it a default (`{names[0]}: bool = "
            f"False`). {error}"
        )
        told.branched = error.branched
        return told

    def _check_calls(
        self,
        cut: _Split,
        none: frozenset[str],
        training: bool,
        key: Key,
        said: str,
        other: list[tuple[str, Any]] | None = None,
    ) -> None:
        """Refuses a trace that calls the declared submodules otherwise than the first. One
        for other arguments left None, or other values of those fixed at them, may hand
        them other constants (a value handed on, `self.encoder(x,
        return_dict=return_dict)`) or inputs in other places (an argument the first trace
        had None handed on): each such call is its own, keyed apart, so long as it calls
        the same submodules, in the same order, and as the trace in the ``other`` mode
        for the same arguments does."""
        if self.first is None:
            self.first, self.first_none, self.first_key, self.first_said = cut, none, key, said
            optional = [name for name, _, by_default in optional_of(self.model) if by_default]
            for name in self.declared:
                if name not in cut.targets:
                    valued = bool(self.by_value(key))
                    fixed = (
                        f"(where {said}: a plain value it is handed is traced as it is, and "
                        "it was traced at the defaults) "
                        if valued
                        else ""
                    )
                    raise NotCalled(
                        f"`{name}` is declared, and `{type(self.model).__qualname__}.forward`"
                        f"{_traced_as(optional, none)}{fixed}never calls it (it may be "
                        "reached through a function fx cannot see into"
                        f"{_otherwise(optional, none)}"
                        f"{', or called only for other values of those' if valued else ''}"
                        "): nothing of it can be frozen or cached here. Drop it from the "
                        "declarations, or call it in forward"
                        f"{' whatever the arguments' if optional else ''}"
                    )
            return
        if cut.calls == self.first.calls:
            return
        model = type(self.model).__qualname__
        # A trace for other values of the model's config is one for other values too.
        first_key = key == self.first_key and self.world is self.worlds[0]
        if (
            not first_key
            and [name for name, _ in cut.calls] == [name for name, _ in self.first.calls]
            and (other is None or other == cut.calls)
        ):
            return
        # The first mode's calls for these values, where they are not the first trace's.
        first_calls = self.first.calls if first_key else other
        if first_key or (first_calls is not None and first_calls != self.first.calls):
            raise WrapError(
                f"`{model}.forward` calls its declared submodules differently in train and "
                f"eval mode ({_calls(first_calls or [])} in "
                f"{'train' if self.mode else 'eval'} mode, {_calls(cut.calls)} in the "
                "other, or with other constant arguments, or other inputs in their places): one "
                "graph cannot describe both. "
                "Declare the submodule that holds the code that reads `self.training`, or "
                "call the declared submodules the same way in both modes"
            )
        split = untied(self.model, self.worlds[0].aliases)
        if split is not None:
            raise WrapError(
                f"{untied_said(*split)}, and `{model}.forward`, traced again, calls its "
                f"declared submodules otherwise ({_calls(cut.calls)} in "
                f"{'train' if training else 'eval'} mode, {_calls(self.first.calls)} when "
                "`wrap` traced it): fx called that part by one of its names wherever the "
                "forward did, and one graph cannot describe both. Give both names one part "
                "again, or wrap the model again after giving them parts of their own "
                "(`somatize.torch.wrap(model, ...)`, then `freeze`)"
            )
        if self.dtyped and self.world.dtype is not self.worlds[0].dtype:
            this, first, advice, whether = (
                f"the default dtype is {self.world.dtype}",
                f"the model was wrapped, under {self.worlds[0].dtype}",
                "Call it under the default dtype it was wrapped under",
                "whatever the default dtype",
            )
        elif self.world is not self.worlds[0]:
            this, first, advice, whether = (
                "what it read of the objects its modules hold (a config) changed",
                "the model was wrapped",
                "Set those values back",
                "whatever those hold",
            )
        elif self.by_value(key) != self.by_value(self.first_key):
            this, first, advice, whether = (
                said or "every argument is given",
                self.first_said or "every argument is given",
                "Give the same values in every call",
                "whatever they are",
            )
        elif self.first_none:
            # Traced first with every optional argument None: this call gives some.
            given = self.first_none - none
            this, first, advice, whether = (
                f"{_are(given, 'given')}",
                "every optional argument is None",
                "Leave them None in every call",
                "whether it is given or not",
            )
        else:
            this, first, advice, whether = (
                _are(none, "None"),
                "every argument is given",
                "Give every argument in every call",
                "whether it is given or not",
            )
        raise WrapError(
            f"`{model}.forward` calls its declared submodules differently when {this} "
            f"({_calls(cut.calls)} in {'train' if training else 'eval'} mode, "
            f"{_calls(self.first.calls)} when {first}, or with other constant arguments, or "
            "other inputs in their places): one graph cannot describe both. "
            f"{advice}, declare the submodule that holds the code that branches on it, or "
            f"call the declared submodules the same way {whether}"
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
        world = self.world
        parts = _Parts(
            self.reads, self.first.targets, traced_into, children, hooks, world.aliases, world.reads
        )
        parts.point(model)  # code traced before may have been left pointing at a part gone
        parts.watch(model)
        object.__setattr__(wrapped, "_parts", parts)
        # The modules whose training flag the code holds: those traced into, and those
        # whose flag it read.
        flags = self.through | {one.path for one in read.modes.values()}
        object.__setattr__(wrapped, "_through", tuple(sorted(flags)))
        object.__setattr__(wrapped, "_switches", self.switching)
        object.__setattr__(wrapped, "_enters", self.entering)
        object.__setattr__(wrapped, "_identity", self.identity)
        object.__setattr__(wrapped, "_dtyped", self.dtyped)
        traced = (type(model), *(type(module) for module in traced_into.values()))
        values = Values(self.world.read, type(model).__qualname__, traced, keyed_with(model))
        if self.world.read is None:
            # No trace for these values ran (fx refused each): what the config holds is
            # looked at again at each call, so that values set back run their traces.
            values = _Untraced(values)
        object.__setattr__(wrapped, "_values", values)
        object.__setattr__(
            wrapped,
            "_one_code",
            all(len({id(r) for r in runners.values()}) == 1 for runners in self.runners.values()),
        )
        self._keep_keyed()

    def runners_for(
        self, none: frozenset[str], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Runners:
        """The code run when the arguments ``none`` are None and the others are as ``args``
        and ``kwargs`` give them, traced now if no call left them None and gave the same
        values to those the forward branches on before; what the new trace reads is
        watched from then on."""
        assert self.signature is not None
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        with self.gate.tracing():
            found = self.runners.get(self.key(none, given))
            if found is None:
                # What a compiled call does not check before it comes here: the model is
                # checked as an eager call checks it, so what the other traces read of it
                # is what it holds, and is watched on as they read it, under the default
                # dtype the traces it runs were taken under.
                self.wrapped._follow()
                made = torch.get_default_dtype()
                if self.dtyped and made is not self.world.dtype:
                    self._rekey(f"the default dtype is {made} in this call")
                try:
                    self.wrapped._values.check()
                except Reread as changed:
                    self._rekey(changed)
                found = self.runners.get(self.key(none, given))
            if found is None:
                found = self.trace(none, given)
                self.watch()
            return found

    def traced_elsewhere(self, key: Key, training: bool) -> Runners | None:
        """The code another set of traces holds for ``key`` in mode ``training``, which fx
        refused in the traces run now, where every value those others read is as the
        model holds it now: a refusal may hang on a config value the traces of the other
        mode do not read (``self.training and config.flag``), and so watch, and a config
        set back has the traces taken for it run again. None where no other set does;
        the traces run now are then run still."""
        with self.gate.tracing():
            was = self.world
            found = self._enter_one_held(
                world
                for world in self._worlds_here()
                if world is not was
                and isinstance(world.runners.get(key, {}).get(training), nn.Module)
            )
            if found is None:
                if self.world is not was:  # another looked at: the traces run before again
                    self._enter(was)
                return None
            return found.runners[key]

    def rekey(self, changed: Reread) -> None:
        """Has the wrapped model run the traces taken for what the plain objects its
        modules hold (a config) hold now, where ``changed`` says a value the current ones
        read changed: those taken before for the same values, or none yet, so that a call
        traces the forward again."""
        with self.gate.tracing():
            self._rekey(changed)

    def untie(self, path: str, alias: str) -> None:
        """Has the wrapped model run traces taken while ``path`` and ``alias``, which held
        one part when the traces it runs were taken, hold two: those taken before with the
        parts the model holds now held so, or none yet, so that a call traces the forward
        again, which records each part under the name the forward reads it by."""
        with self.gate.tracing():
            if not self.world.holds(self.model):
                self._rekey(untied_said(path, alias))

    def _rekey(self, changed: Reread | str) -> None:
        was = self.world
        made = torch.get_default_dtype()
        worlds = self._worlds_here()
        if self._enter_one_held(world for world in worlds if world is not was) is not None:
            return
        limit: int = self.wrapped.TRACES_PER_VALUE
        if len([world for world in worlds if not _refused_only(world)]) >= limit:
            self._enter(was)
            if not was.holds(self.model):
                # Its traces are not the forward's: every call looks for others, refused.
                object.__setattr__(self.wrapped, "_values", _Untraced(self.wrapped._values))
            raise WrapError(
                f"{changed}: `{type(self.model).__qualname__}.forward` was traced {limit} "
                "times already for the values it read from the objects its modules hold (a "
                "config) and for the parts it holds under two names, and fx traces what it "
                "reads into the code, so each set of them is traced apart, and no more "
                "traces are taken, to keep them bounded. Set back a set of values traced "
                "(or give those names one part again), keep a value that changes from call "
                "to call in a buffer (`self.register_buffer(...)`) or hand it as a tensor, or "
                "raise `Wrapped.TRACES_PER_VALUE` on this wrapped model"
            ) from None
        empty = [one for one in worlds if _refused_only(one)]
        world = empty[0] if empty else _World({}, made)
        if not empty:
            self.worlds.append(world)
        # What fx refused there was refused for the values the config held then: the
        # values it holds now are traced afresh.
        world.runners.clear()
        world.read = None
        self._enter(world)

    def _worlds_here(self) -> list[_World]:
        """The sets of traces that may run under the default dtype now: where the code holds
        what the default dtype made, traces taken under another are not run."""
        made = torch.get_default_dtype()
        return [one for one in self.worlds if not self.dtyped or one.dtype is made]

    def _enter_one_held(self, worlds: Iterable[_World]) -> _World | None:
        """The first of ``worlds`` traced for the values the model holds now (each value its
        traces read as it is, each part they hold under two names held so), entered; None
        where none is, the last looked at entered then."""
        for world in worlds:
            if world.read is None or not world.holds(self.model):
                continue
            self._enter(world)
            try:
                self.wrapped._values.check()
            except Reread:
                continue
            return world
        return None

    def _enter(self, world: _World) -> None:
        """Makes ``world``'s traces the ones the wrapped model runs, and watches what they
        read."""
        self.world, self.runners = world, world.runners
        object.__setattr__(self.wrapped, "_runners", world.runners)
        self.watch()
        if world.read is None:
            # Nothing traced for these values yet (or the trace was refused): a call looks
            # for the traces taken for the values the config holds then, first.
            object.__setattr__(self.wrapped, "_values", _Untraced(self.wrapped._values))

    def every_runner(self) -> list[nn.Module]:
        """The code of every trace taken, for every set of values of the objects the
        model's modules hold."""
        found = {
            id(runner): runner
            for world in self.worlds
            for each in world.runners.values()
            for runner in each.values()
            if isinstance(runner, nn.Module)
        }
        return list(found.values())


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


def _said(concrete: Mapping[str, Any]) -> str:
    """What a trace fixed, for a message: "`a` is None", "`a`, `b` are None", "`a` is
    None, `b` is False" ("" for nothing)."""
    none = frozenset(name for name, value in concrete.items() if value is None)
    if len(none) == len(concrete):
        return _are_none(none) if none else ""
    return ", ".join(f"`{name}` is {value!r}" for name, value in concrete.items())


def _with_none(error: Untraceable, said: str) -> Untraceable:
    """``error``, saying what the trace fixed (which arguments it took as None)."""
    if not said:
        return error
    told = Untraceable(f"{said} in this call, and {error}")
    told.__cause__ = error.__cause__
    told.branched = error.branched
    told.tensors = error.tensors
    told.read = error.read
    return told


def _past(stopped: Untraceable, first: Untraceable, every: frozenset[str]) -> Untraceable:
    """``stopped``, where the trace with every optional argument None stopped, saying it
    was taken so because the trace with them given stopped at a branch on them (where
    ``first`` says), which this one gets past: what stops the model is ``stopped``'s."""
    branched = ", ".join(f"`{name}`" for name in sorted(first.branched or ()))
    told = Untraceable(
        f"{stopped}. This is the trace with every optional argument None "
        f"({_are(every, 'None')}), taken since the forward branches on {branched}"
        f"{first.where}, which is traced fixed at each value a call gives and needs no "
        "change: change the code named first"
    )
    told.branched = stopped.branched
    told.tensors = stopped.tensors
    told.where = stopped.where
    told.read = stopped.read
    return told


def _named(signature: inspect.Signature | None) -> dict[str, tuple[int | None, Any]]:
    """The named arguments of a forward of ``signature``, each with its place among the
    positional ones (None for a keyword-only one) and its default; none where the forward
    takes `*args` or `**kwargs`, which is traced once."""
    if signature is None:
        return {}
    varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    parameters = list(signature.parameters.values())
    if any(parameter.kind in varying for parameter in parameters):
        return {}
    return {
        parameter.name: (
            None if parameter.kind is inspect.Parameter.KEYWORD_ONLY else at,
            parameter.default,
        )
        for at, parameter in enumerate(parameters)
    }


def stand_in_refused(model: nn.Module, name: str, value: Any, left_out: bool) -> WrapError:
    """The refusal of ``value``, a plain constant, for argument ``name`` of a forward that
    takes `*args` or `**kwargs` (a call handing it, or, ``left_out``, the default a call
    leaving it out takes): such a forward is traced once, with a stand-in for every
    argument, and fx answers a test of a stand-in (`flag is True`, `type(n) is int`, `mode
    in {...}`) without a branch it notices, so the code traced may not be the forward's
    for that value."""
    how = "defaults to" if left_out else "is handed"
    return WrapError(
        f"`{name}` {how} the plain constant {value!r}, and `{type(model).__qualname__}."
        "forward` takes `*args` or `**kwargs`, so it is traced once, with a stand-in for "
        f"`{name}`: fx answers a test of a stand-in (`{name} is True`, `type({name}) is "
        f"int`, `{name} in {{...}}`) without a branch it notices, so the code traced may "
        "not be the forward's for this value. "
        f"{'Default it to None, or h' if left_out else 'H'}and it as a tensor "
        "(`torch.tensor(...)`), which is an input, give the forward named arguments only "
        "(it is then traced at "
        "each plain value a call gives), or wrap just the submodule you want to remember "
        "(`model.encoder = somatize.torch.wrap(model.encoder, frozen=True, cached=True)`), "
        "which needs no tracing"
    )


def stand_in_default(model: nn.Module, signature: inspect.Signature | None) -> WrapError | None:
    """The refusal of a forward that takes `*args` or `**kwargs` and defaults a named
    argument to a plain constant, which its one trace takes a stand-in for; None for any
    other."""
    if signature is None:
        return None
    varying = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if not any(parameter.kind in varying for parameter in signature.parameters.values()):
        return None
    for name, parameter in signature.parameters.items():
        default = parameter.default
        if default is not None and value_key(default) is not None:
            return stand_in_refused(model, name, default, left_out=True)
    return None


def stand_in_handed(
    model: nn.Module, signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> WrapError | None:
    """The refusal of a call handing a forward that takes `*args` or `**kwargs` a plain
    constant (but None), naming the argument; None for a call handing none."""
    if not any(
        value is not None and value_key(value) is not None for value in (*args, *kwargs.values())
    ):
        return None
    for name, value in signature.bind_partial(*args, **kwargs).arguments.items():
        kind = signature.parameters[name].kind
        given = (
            [(f"{name}[{at}]", one) for at, one in enumerate(value)]
            if kind is inspect.Parameter.VAR_POSITIONAL
            else list(value.items())
            if kind is inspect.Parameter.VAR_KEYWORD
            else [(name, value)]
        )
        for shown, one in given:
            if one is not None and value_key(one) is not None:
                return stand_in_refused(model, shown, one, left_out=False)
    return None  # pragma: no cover - a value found above is bound to an argument


_NONE = object()
"""No default, for a message."""


def _shown(value: Any) -> str:
    """A default as a message shows it: `None` for none."""
    return "none" if value is _NONE else f"`{value!r}`"


def defaults_of(model: nn.Module) -> tuple[tuple[str, Any], ...]:
    """The defaults of ``model``'s forward, by argument name, as its function holds
    them: the very values, compared by identity, which a call reads without a cost."""
    function = getattr(type(model), "forward", None)
    code = getattr(function, "__code__", None)
    if code is None:
        return ()
    positional = getattr(function, "__defaults__", None) or ()
    names = code.co_varnames[: code.co_argcount]
    found = list(zip(names[len(names) - len(positional) :], positional, strict=True))
    found += list((getattr(function, "__kwdefaults__", None) or {}).items())
    return tuple(found)


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
