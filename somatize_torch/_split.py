"""Tracing a model with torch.fx, and cutting the traced code at its declared submodules.

The model is traced by a tracer that keeps every declared submodule (and the
standard ``torch.nn`` layers) whole, with every module's training flag set to one
mode: fx bakes what ``forward`` reads of ``self.training`` into the code, so
:func:`somatize_torch.wrap.wrap` traces in both. The traced graph is then
partitioned at the declared calls, ``split_module``-style: a shim
(:mod:`somatize_torch._cached`) stands where each declared call was and holds its
node, and the code between them is a :class:`~somatize_torch.wrap.Segment` each,
with who reads whom. Cut in the other mode, each declared call is given the shim of
the same name, so one node stands for it in both. What the cut code holds of the
model by reference is listed too, for :mod:`somatize_torch._parts` to keep pointed
at what the model holds.

The modes the forward switches (``torch.no_grad()``, ``torch.autocast(...)``) are
recorded into the traced code as it is traced (:mod:`somatize_torch._modes`), and cut
with it: a block around a declared call is entered in the segment before it and left
in the one after.

**What fx cannot trace** gets :class:`Untraceable`, naming the call that
stopped it — a read fx would keep at its value then (``torch.is_grad_enabled()``,
``random.random()``) included. Declared submodules are never traced into, so
declaring the part that holds the data-dependent code is one way out; wrapping just
that submodule (``model.encoder = wrap(model.encoder, frozen=True, cached=True)``),
which needs no tracing at all, is the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import enum
import inspect
import linecache
import operator
import os
import random
import re
import sys
import threading
import traceback
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.fx._symbolic_trace
from torch import fx, nn
from torch.fx import _symbolic_trace
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_unflatten

from somatize import Node
from somatize_torch._cached import _Cached, _Declared, _Watched
from somatize_torch._errors import Untraceable, WrapError
from somatize_torch._modes import (
    _OURS,
    RECORDED,
    Fixed,
    in_torch,
    module_answering,
    put_back_in_child,
    recording,
    swapped,
)
from somatize_torch._parts import _MISSING, _part, _Read
from somatize_torch._values import Noted, reading
from somatize_torch.freeze import ModuleNode

if TYPE_CHECKING:
    from somatize_torch.wrap import Wrapped


class _KeepsKinds(fx.Tracer):
    """A tracer that writes a dict or list of a class of its own into the code as one of
    that class, or refuses it (:meth:`create_arg`)."""

    def create_arg(self, a: Any) -> Any:
        """What fx writes into the code for ``a``, the forward's answer or what it hands a
        call. fx makes a plain dict of any dict and a plain list of any list, so a subclass
        (Hugging Face's ``ModelOutput``, an ``OrderedDict``) would come back as a plain
        one: an ``OrderedDict`` is made as one in the code, a dataclass that is a dict
        holding its fields that are not None (a ``ModelOutput``) is made by its class from
        its fields, as fx makes any other dataclass, and any other subclass is refused."""
        kind = type(a)
        if kind is dict or kind is list or not isinstance(a, (dict, list)):
            return super().create_arg(a)
        if isinstance(
            a, (fx.immutable_collections.immutable_dict, fx.immutable_collections.immutable_list)
        ):
            return super().create_arg(a)
        if isinstance(a, dict) and kind is OrderedDict:
            pairs = [(self.create_arg(k), self.create_arg(v)) for k, v in a.items()]
            return self.create_node("call_function", OrderedDict, (pairs,), {})
        if isinstance(a, dict) and _made_of_fields(a):
            fields = dataclasses.fields(a)  # type: ignore[arg-type]  # a dataclass: just asked
            kwargs = {f.name: self.create_arg(getattr(a, f.name)) for f in fields}
            return self.create_node("call_function", kind, (), kwargs)
        base = "dict" if isinstance(a, dict) else "list"
        raise Fixed(
            f"hands back, or hands a call, a `{kind.__qualname__}`, a subclass of `{base}`, "
            f"which torch.fx makes a plain `{base}` of as it traces, so the wrapped model would "
            f"hand a plain `{base}` where the model hands a `{kind.__qualname__}`. Hand a "
            f"`{base}`, a tuple, an `OrderedDict`, a namedtuple or a dataclass instead"
        )


class _Tracer(_KeepsKinds):
    """Keeps declared submodules and the standard ``torch.nn`` layers whole, and reads the
    model's tensors as the code runs.

    fx's own tracer hands the forward a buffer, or a tensor kept as a plain attribute, as
    the tensor itself: what the forward computes from them alone
    (``self.std.clamp(min=1e-3)``, ``self.temperature.item()``) it computes once, as it
    traces, and keeps the answer as a constant, which a checkpoint loaded later never
    reaches. Here both are read in the code (``get_attr``), so that is computed as it
    runs; a branch on what one holds (``if self.flag:``) is then refused, as a branch on
    an input is."""

    def __init__(self, leaves: Iterable[str]) -> None:
        super().__init__()
        self.proxy_buffer_attributes = True
        self.leaves = frozenset(leaves)
        self.through: set[str] = {""}
        """The modules whose forward was traced into (the model's own, ``""``, included):
        what they read of ``self.training`` is in the code."""
        self._held: dict[str, fx.Proxy] = {}
        self.branched: frozenset[str] | None = None
        """The arguments of the forward that flowed into the value it last branched on or
        iterated over, which fx refuses (none for a value of the model's own)."""
        self.tensors: frozenset[str] = frozenset()
        """Those of :attr:`branched` the forward uses as tensors (`x.shape`, `x.size()`,
        `x.dim()`, `x.sum()`): a branch on a tensor's shape or value, which no value an
        argument is fixed at lifts."""
        self.containers: frozenset[str] = frozenset()
        """The arguments handed a list, tuple or dict, which fx stands in for: asked what
        kind they are, it would answer no."""
        self.iterated: str | None = None
        """What the forward last iterated over, made of what a module answers (``sum(out)``,
        ``[*out]``, ``out.items()``), which fx refuses, not knowing its length, as
        :func:`_iterated` says it; None for none."""
        self.dtyped = False
        """Whether the code keeps, as a constant fx made as it traced, a floating (or complex)
        tensor the forward made from numbers (``torch.ones(4)``, ``torch.linspace(0, 1, 4)``),
        or read the default dtype (``torch.get_default_dtype()``): either is what the
        default dtype in force as it traced made it, where a call under another computes
        otherwise."""
        self.thread = threading.get_ident()
        """The thread that traces. fx replaces how every module is called and read from,
        in every thread, while it traces: a module called in another thread then (a
        wrapped model's first call leaving an argument None traces while others run) is
        run and read as ever, not taken into this trace."""

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if threading.get_ident() != self.thread:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def held(self, path: str) -> fx.Proxy:
        """The read, in the code, of the tensor the model keeps as a plain attribute at
        ``path``."""
        found = self._held.get(path)
        if found is None:
            found = self._held[path] = self.create_proxy("get_attr", path, (), {})
        return found

    def create_arg(self, a: Any) -> Any:
        if not isinstance(a, torch.Tensor) or not (a.is_floating_point() or a.is_complex()):
            return super().create_arg(a)
        known = len(self.tensor_attrs)
        arg = super().create_arg(a)
        # fx stows away a tensor it finds nowhere in the model as a constant of its own.
        self.dtyped = self.dtyped or len(self.tensor_attrs) > known
        return arg

    def to_bool(self, obj: fx.Proxy) -> bool:
        self.iterated = None
        self.branched = _arguments_of(obj.node)
        self.tensors = _used_as_tensors(obj.node)
        return super().to_bool(obj)

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        self.iterated = _iterated(obj.node)
        if self.iterated is not None:
            # Made of what a module answers: no value an argument is fixed at lifts it.
            self.branched, self.tensors = frozenset(), frozenset()
        else:
            self.branched = _arguments_of(obj.node)
            self.tensors = _used_as_tensors(obj.node)
        return super().iter(obj)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        from somatize_torch.rows import CachedRows  # rows builds on wrap, which on this

        # A row cache is called, not traced into: it looks its rows up in its batch.
        return (
            module_qualified_name in self.leaves
            or isinstance(m, CachedRows)
            or super().is_leaf_module(m, module_qualified_name)
        )

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if threading.get_ident() != self.thread:
            return forward(*args, **kwargs)  # another thread's call: see `thread`
        try:
            name = self.path_of_module(m)
        except NameError:  # not part of the model: fx says so itself
            name = None
        if name is not None and not self.is_leaf_module(m, name):
            self.through.add(name)
        return super().call_module(m, forward, args, kwargs)


def _made_of_fields(a: dict[Any, Any]) -> bool:
    """Whether ``a``, a dict, is a dataclass made by its class from its fields alone, as
    Hugging Face's ``ModelOutput`` is: it holds, in their order, its fields that are not
    None, each the value of the attribute of its name, and every field is taken by its
    class's constructor."""
    if not dataclasses.is_dataclass(a):
        return False
    fields = dataclasses.fields(a)
    if not all(f.init for f in fields):
        return False
    held = [f.name for f in fields if getattr(a, f.name) is not None]
    return list(a.keys()) == held and all(a[name] is getattr(a, name) for name in held)


def _iterated(node: fx.Node) -> str | None:
    """What ``node`` is, said as what a module answers (a declared submodule, a layer fx
    does not trace into), or a value made of it; None where no module's answer goes into
    it."""
    called = module_answering(node)
    if called is not None:
        return f"what `{called.target}` answers"
    made_of = next(
        (one for one in _upstream(node.all_input_nodes) if one.op == "call_module"), None
    )
    return None if made_of is None else f"a value made of what `{made_of.target}` answers"


def _upstream(nodes: Iterable[fx.Node]) -> Iterator[fx.Node]:
    """``nodes`` and every node they are computed from, each once."""
    seen: set[fx.Node] = set()
    todo = list(nodes)
    while todo:
        one = todo.pop()
        if one in seen:
            continue
        seen.add(one)
        yield one
        todo.extend(one.all_input_nodes)


def _placeholders_of(node: fx.Node) -> list[fx.Node]:
    """The placeholders of the forward's arguments that ``node`` is computed from."""
    return [one for one in _upstream([node]) if one.op == "placeholder"]


def _arguments_of(node: fx.Node) -> frozenset[str]:
    """The arguments of the forward whose placeholders ``node`` is computed from."""
    return frozenset(str(one.target).lstrip("*") for one in _placeholders_of(node))


_TENSOR_ONLY = frozenset(dir(torch.Tensor)) - frozenset(
    name
    for kind in (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
    for name in dir(kind)
)
"""What a tensor has and no plain value or container does (`shape`, `size`, `dim`,
`ndim`, `sum`): an argument asked for one is used as a tensor."""


def _used_as_tensors(node: fx.Node) -> frozenset[str]:
    """The arguments of the forward whose placeholders ``node`` is computed from that the
    forward asks for what only a tensor has (anywhere in the code traced so far)."""
    return frozenset(
        str(one.target).lstrip("*")
        for one in _placeholders_of(node)
        if any(_tensor_use(user, one) for user in one.users)
    )


def _tensor_use(user: fx.Node, of: fx.Node) -> bool:
    """Whether ``user`` asks ``of`` for what only a tensor has: `of.shape` or
    `of.size()`."""
    if not user.args or user.args[0] is not of:
        return False
    if user.op == "call_method":
        return str(user.target) in _TENSOR_ONLY
    if user.op == "call_function" and user.target is getattr and len(user.args) > 1:
        return str(user.args[1]) in _TENSOR_ONLY
    return False


_WRAPPING = frozenset(
    os.path.join(os.path.dirname(__file__), f"{name}.py")
    for name in (
        "wrap",
        "_errors",
        "_parts",
        "_cached",
        "_split",
        "_tracing",
        "_modes",
        "_values",
    )
) | {contextlib.__file__, random.__file__}
"""The files wrapping is written in (and the ones its context managers and a refused
draw run in): a frame of theirs says nothing of where the model's forward stopped."""


def _traced(
    model: nn.Module,
    leaves: Iterable[str],
    training: bool,
    frozen: Iterable[str] = (),
    concrete: Mapping[str, Any] | None = None,
    containers: Iterable[str] = (),
) -> Traced:
    """``model``'s forward traced with every module's training flag set to ``training``
    (and put back after) — but the ``frozen`` submodules', which are in eval whenever
    they run: what it reads of ``self.training`` is baked into the code. With the
    modules traced into, and what the trace read from the model beyond its tensors
    (the modules whose training flag it read among it), which is baked into the code
    too. The arguments ``concrete`` names are traced fixed at the values it maps them to
    (None, or a plain value the forward branches on: fx's ``concrete_args``), the others
    as inputs."""
    if "forward" in vars(model):
        raise Untraceable(
            f"this `{type(model).__qualname__}` has a `forward` of its own, given to it in "
            "place of its class's (by a library that wraps it for mixed precision, or by "
            "hand): torch.fx traces the class's `forward`, so the wrapped model would not run "
            "the one it calls. Wrap the module before its `forward` is replaced, or wrap "
            "its parts"
        )
    held_eval = {id(module) for path in frozen for module in model.get_submodule(path).modules()}
    modes = [(module, module.training) for module in model.modules()]
    tracer = _Tracer(leaves)
    tracer.containers = frozenset(containers)
    noted: Noted | None = None

    def put_modes_back() -> None:
        for module, was in modes:
            object.__setattr__(module, "training", was)

    try:
        with recording(tracer, model), swapped(put_modes_back):
            for module, _ in modes:
                object.__setattr__(module, "training", training and id(module) not in held_eval)
            with (
                reading(model, tracer.held) as noted,
                warnings.catch_warnings(),
                _reached(concrete or {}) as reached,
                put_back_in_child(_fx_put_back()),
            ):
                # fx cannot check a value it fixes other than a plain one (an Enum member)
                # in the code, and says so; the wrapped model picks the code by the values.
                warnings.filterwarnings("ignore", "Was not able to add assertion")
                graph = tracer.trace(model, concrete_args=dict(concrete) if concrete else None)
    except Exception as error:
        refused = _refusal(error, model, tracer, training)
        refused.read = noted
        raise refused from error
    if noted.wrote:
        wrote, _ = next(iter(noted.wrote.values()))
        path, name = wrote.read.path, wrote.read.name
        raise _stops(
            Untraceable(
                f"`{type(model).__qualname__}.forward` assigns "
                f"`{f'{path}.{name}' if path else name}` "
                f"as it runs (at {wrote.where}): torch.fx runs the forward's Python once, as it "
                "traces, and keeps only what it does to tensors, so the wrapped model would never "
                "assign it (what the trace assigned is put back). Declared submodules are never "
                "traced into, so declare the submodule that does this, keep the value in a "
                "buffer written in place (`self.count.add_(1)`), or wrap just the submodule you "
                "want to remember — `model.encoder = somatize.torch.wrap(model.encoder, "
                "frozen=True, cached=True)` — which needs no tracing"
            )
        )
    asked = _type_asked(model, concrete or {})
    for code, inputs in reached.stood.items():
        if asked is not None:
            break
        asked = _type_compared(code, inputs)
    if asked is not None:
        name, where, line = asked
        refused = Untraceable(
            f"`{type(model).__qualname__}.forward` asks what type `{name}` is, or a value a "
            f"call makes of it, or compares an attribute of it by identity, at {where} "
            f"(`{line}`): fx stands in for it while it traces, and neither the type of the "
            "stand-in nor its attributes (stand-ins too) are what a call gives, so the branch "
            "kept would be the one for the stand-in in every call. Hand it a plain constant "
            "(the forward is traced at it), test it otherwise (`mask is None`), or declare the "
            "submodule that holds this code"
        )
        refused.branched = frozenset({name})
        raise refused
    for code in reached.made.keys() | reached.within.keys():
        made_asked = _type_compared(code, reached.made.get(code, {}), reached.within.get(code, ()))
        if made_asked is not None:
            name, where, line = made_asked
            raise _stops(
                Untraceable(
                    f"`{type(model).__qualname__}.forward` asks what type `{name}` is, or a "
                    "value it holds or a call makes of it, or compares an attribute of it by "
                    f"identity, at {where} "
                    f"(`{line}`): `{name}` is, or holds, a stand-in fx made for a value computed "
                    "as the forward runs, and neither the type of the stand-in nor its "
                    "attributes are the value's, so the branch kept would be the one for the "
                    "stand-in in every call. Declare the submodule that holds this code, or wrap "
                    "just the submodule you want to remember (`model.encoder = somatize.torch."
                    "wrap(model.encoder, frozen=True, cached=True)`), which needs no tracing"
                )
            )
    paths = {id(module): path for path, module in model.named_modules()}
    for code, modules in reached.modules.items():
        kept_asked = _kept_compared(code, modules, paths)
        if kept_asked is not None:
            name, where, line = kept_asked
            raise _stops(
                Untraceable(
                    f"`{type(model).__qualname__}.forward` compares an attribute of `{name}`, a "
                    f"tensor the model keeps, by identity at {where} (`{line}`): fx stands in "
                    "for the tensor while it traces, and for its attributes, and `is` answers "
                    "no for a stand-in whatever the tensor holds, so the branch kept would be "
                    "the one for the stand-in in every call. Compare it by value, declare the "
                    "submodule that holds this code, or wrap just the submodule you want to "
                    "remember (`model.encoder = somatize.torch.wrap(model.encoder, "
                    "frozen=True, cached=True)`), which needs no tracing"
                )
            )
    for key in held_eval & noted.modes.keys():  # in eval whenever they run: read right
        del noted.modes[key]
    forward = getattr(getattr(model.forward, "__func__", None), "__code__", None)
    tested = _none_tested(forward, tracer.containers) if forward is not None else frozenset()
    _items_checked(graph, tracer.containers, type(model).__qualname__, tested)
    _plain_code(graph, bool(concrete))
    compared = frozenset(
        name for code, held in reached.held.items() for name in _identity_compared(code, held)
    )
    traced = fx.GraphModule(model, graph, type(model).__name__)
    return Traced(traced, tracer.through, noted, compared, tracer.dtyped)


class Traced(NamedTuple):
    """A forward traced: the code, the modules traced into, what it read of the model,
    the arguments fixed at a tuple or dataclass that code the forward handed them to
    compared by identity (``opts is PRESET``), answered for the instance traced, and
    whether the code holds what the default dtype made as it traced
    (:attr:`_Tracer.dtyped`)."""

    code: fx.GraphModule
    through: set[str]
    noted: Noted
    identity: frozenset[str]
    dtyped: bool


_LOADS = frozenset(
    {
        "LOAD_GLOBAL",
        "LOAD_NAME",
        "LOAD_ATTR",
        "LOAD_METHOD",
        "LOAD_CONST",
        "LOAD_FAST",
        "LOAD_DEREF",
        "BUILD_TUPLE",
        "BUILD_LIST",
        "BUILD_SET",
        "LOAD_FAST_BORROW",
        "LOAD_FAST_CHECK",
        "LOAD_SMALL_INT",
        "PUSH_NULL",
        "PRECALL",
        "NOP",
    }
)
"""The instructions between a call of ``type`` and the comparison its answer is in, in
any Python the project runs on (3.10 to 3.14 name some of them apart)."""
_LOAD_ONE = frozenset({"LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_FAST_CHECK"})
"""The instructions loading one local, the argument handed to ``type``."""
_CALL_ONE = frozenset({"CALL", "CALL_FUNCTION"})
"""The instructions calling ``type`` with one argument (``CALL_FUNCTION`` in 3.10)."""


def identity_asked(model: nn.Module) -> frozenset[str]:
    """The arguments of ``model``'s forward its own code compares by identity with another
    value (``opts is PRESET``, ``PRESET is not opts``): one traced per value is answered
    there for the instance traced, not for another one equal to it."""
    function = getattr(type(model), "forward", None)
    code = getattr(inspect.unwrap(function) if callable(function) else None, "__code__", None)
    if code is None:
        return frozenset()
    names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
    return _identity_compared(code, {name: name for name in names})


def _identity_compared(code: CodeType, names: Mapping[str, str]) -> frozenset[str]:
    """Of ``names`` (locals of ``code``, each to the argument of the forward it holds),
    the arguments whose locals ``code`` compares by identity with another value, each as
    the argument's name, or with the attributes of it compared (``opts.act`` for ``opts.act
    is Act.FAST``, which a call answers alike for equal values where that is an Enum
    member: see :func:`identical_at`)."""
    found = list(dis.get_instructions(code))
    asked: set[str] = set()
    for at, one in enumerate(found):
        if one.opname != "IS_OP" or any(
            other.opname == "LOAD_CONST" and other.argval is None for other in found[at - 2 : at]
        ):
            continue  # `opts is None`: answered right for any value
        before = at - 1
        while before >= 0 and at - before <= 6 and found[before].opname in _LOADS:
            if found[before].opname in _LOAD_ONE and found[before].argval in names:
                chain = [names[str(found[before].argval)]]
                after = before + 1
                while after < at and found[after].opname == "LOAD_ATTR":
                    chain.append(str(found[after].argval))
                    after += 1
                if _operand_of(found, after) == at:  # not a value beside the comparison
                    asked.add(".".join(chain))
            before -= 1
    return frozenset(asked)


def identical_at(value: Any, compared: str) -> bool:
    """Whether what ``compared`` (an argument's name, with the attributes of it compared
    by identity, from :func:`_identity_compared`) names in ``value``, the argument's value
    in a call, is one object for every value equal to it (an Enum member, None, a bool, a
    ``torch.dtype``), so the code traced for an equal value answers the comparison alike."""
    _, *attributes = compared.split(".")
    if not attributes:
        return False  # the argument itself, another object for an equal value
    for attribute in attributes:
        value = getattr(value, attribute, _MISSING)
    return value is None or isinstance(value, (enum.Enum, bool, torch.dtype))


def _type_asked(model: nn.Module, concrete: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first argument of ``model``'s forward taken as an input (not in ``concrete``)
    whose type the forward's own code compares (``type(mask) is torch.Tensor``, ``type(n)
    in (int, float)``, ``mask.__class__ is torch.Tensor``), with where and the line; None
    for none. fx hands the code a stand-in for it, whose type is neither a tensor's nor a
    plain value's, and no branch on that comparison reaches fx: the code kept would be the
    one for the stand-in."""
    function = getattr(type(model), "forward", None)
    code = getattr(inspect.unwrap(function) if callable(function) else None, "__code__", None)
    if code is None:
        return None
    names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
    inputs = {name: name for name in names if name not in concrete}
    return _type_compared(code, inputs)


def _type_compared(
    code: CodeType, inputs: Mapping[str, str], within: Iterable[str] = ()
) -> tuple[str, str, str] | None:
    """The first of ``inputs`` (locals of ``code``, each to the argument of the forward it
    stands for) whose type ``code`` compares (``type(mask) is ...``, ``mask.__class__ is
    ...``), or an attribute of which it compares by identity (``mask.dtype is ...``), as
    the argument it stands for, with where and the line; None for none. Of those
    ``within`` (locals holding a stand-in in a list, tuple or dict), the same asked of an
    item (``type(items[0]) is ...``), as the local."""
    held = frozenset(within)
    if not inputs and not held:
        return None
    found = list(dis.get_instructions(code))
    for at, one in enumerate(found[:-2]):
        compared: tuple[str, ...] = ("IS_OP", "COMPARE_OP", "CONTAINS_OP")
        load = one
        if one.opname in ("LOAD_GLOBAL", "LOAD_NAME") and one.argval == "type":
            start = at + 1
            while start < len(found) and found[start].opname == "PUSH_NULL":
                start += 1
            if start >= len(found):
                continue
            load = found[start]
            steps, after = _steps(found, start + 1)
            while after < len(found) and found[after].opname in ("PRECALL", "PUSH_NULL"):
                after += 1
            if (
                not _stands_in(load, steps, inputs, held)
                or after >= len(found)
                or found[after].opname not in _CALL_ONE
                or found[after].arg != 1
            ):
                # Of a value made of a stand-in by a call (`type(h.sum())`), perhaps.
                made = _type_of_made(found, start, inputs, held)
                if made is None:
                    continue
                load, after = made
            after += 1
        elif one.opname in _LOAD_ONE:
            steps, _ = _steps(found, at + 1)
            if not _stands_in(one, steps, inputs, held):
                continue
            # Past the items taken out (`items[0]`), to the attributes read.
            items = max((n for n, (kind, _) in enumerate(steps) if kind == "item"), default=-1)
            attributes = steps[items + 1 :]
            if not attributes or attributes[0][0] != "attr":
                continue
            after = attributes[0][1]
            if found[after].argval == "__class__":
                after += 1  # `mask.__class__`: the stand-in's, as its type is
            else:
                # `mask.dtype is torch.float32`: an attribute of a stand-in is one too, and
                # `is` answers no for it whatever a call gives (`==` would reach fx).
                compared = ("IS_OP",)
        else:
            continue
        after = _operand_of(found, after)
        if after < len(found) and found[after].opname in compared:
            positions = getattr(one, "positions", None)
            line = getattr(positions, "lineno", None) or _line_at(found, at) or code.co_firstlineno
            text = linecache.getline(code.co_filename, line).strip()
            name = str(load.argval)
            return inputs.get(name, name), f"{code.co_filename}:{line}", text
    return None


def _type_of_made(
    found: list[dis.Instruction], start: int, inputs: Mapping[str, str], held: frozenset[str]
) -> tuple[dis.Instruction, int] | None:
    """Where ``type``, loaded just before ``found[start]``, is called on a value made of a
    stand-in (of ``inputs``, or one ``held`` in a list, tuple or dict) by an expression of
    calls, attributes and items (``type(h.sum())``, ``type(torch.split(h, 2))``): the load
    of the first stand-in it reads, and where the call of ``type`` is; None where it is no
    such call (the expression branches, or reads no stand-in). The stack is followed from
    the argument's first instruction to the call taking it, the one value it leaves."""
    depth = 0
    stood: dis.Instruction | None = None
    for at in range(start, min(len(found), start + 64)):
        one = found[at]
        if one.opcode in dis.hasjrel or one.opcode in dis.hasjabs or "RETURN" in one.opname:
            return None
        if depth == 1:
            call = at
            while call < len(found) and found[call].opname in ("PRECALL", "PUSH_NULL"):
                call += 1
            if call < len(found) and found[call].opname in _CALL_ONE and found[call].arg == 1:
                return (stood, call) if stood is not None else None
        if (
            stood is None
            and one.opname in _LOAD_ONE
            and (one.argval in inputs or one.argval in held)
        ):
            stood = one
        depth += dis.stack_effect(one.opcode, one.arg if one.opcode >= dis.HAVE_ARGUMENT else None)
        if depth < 0:
            return None
    return None


def _steps(found: list[dis.Instruction], at: int) -> tuple[list[tuple[str, int]], int]:
    """What the instructions from ``found[at]`` on take out of the value loaded before
    them: each attribute read (``("attr", where)``) and item taken by a constant or a
    local (``("item", where)``), and where the first instruction after them is."""
    steps: list[tuple[str, int]] = []
    while at < len(found):
        one = found[at]
        if one.opname == "LOAD_ATTR":
            steps.append(("attr", at))
            at += 1
        elif (
            one.opname in ("LOAD_CONST", "LOAD_SMALL_INT", *_LOAD_ONE)
            and at + 1 < len(found)
            and (
                found[at + 1].opname == "BINARY_SUBSCR"
                or (found[at + 1].opname == "BINARY_OP" and "[" in found[at + 1].argrepr)
            )
        ):
            steps.append(("item", at + 1))
            at += 2
        else:
            break
    return steps, at


def _stands_in(
    load: dis.Instruction,
    steps: list[tuple[str, int]],
    inputs: Mapping[str, str],
    held: frozenset[str],
) -> bool:
    """Whether ``load`` loads a local that is a stand-in (of ``inputs``), or, with an item
    taken out of it among ``steps``, one holding stand-ins (of ``held``)."""
    if load.opname not in _LOAD_ONE:
        return False
    if load.argval in inputs:
        return True
    return load.argval in held and any(kind == "item" for kind, _ in steps)


def _operand_of(found: list[dis.Instruction], after: int) -> int:
    """Where the instruction is that follows the loads from ``found[after]`` on, where
    they load at most one more value: what the value loaded before ``after`` is compared
    with, as in ``mask.dtype is torch.float32``; ``len(found)`` where they load more (the
    value is an argument of a call, ``torch.ones(x.shape, dtype=a if kind is K else b)``,
    and the comparison after it one of others)."""
    pushed = 0
    while after < len(found) and found[after].opname in _LOADS:
        pushed += dis.stack_effect(found[after].opcode, found[after].arg)
        if pushed < 0:
            return len(found)
        after += 1
    return after if pushed <= 1 else len(found)


def _kept_compared(
    code: CodeType, modules: Mapping[str, nn.Module], paths: Mapping[int, str]
) -> tuple[str, str, str] | None:
    """The first tensor a module of ``modules`` (locals of ``code``) keeps, or one of its
    parts keeps, an attribute of which ``code`` compares by identity
    (``self.gain.dtype is torch.float32``), by its path in the model (``paths``), with
    where and the line; None for none."""
    found = list(dis.get_instructions(code))
    for at, one in enumerate(found):
        if one.opname not in _LOAD_ONE or one.argval not in modules:
            continue
        part: Any = modules[str(one.argval)]
        names: list[str] = []
        after = at + 1
        while (
            after < len(found)
            and found[after].opname == "LOAD_ATTR"
            and isinstance(part, nn.Module)
        ):
            name = str(found[after].argval)
            tables = (part._modules, part._parameters, part._buffers, vars(part))
            part = next((table[name] for table in tables if name in table), None)
            if not isinstance(part, (nn.Module, torch.Tensor)):
                break
            names.append(name)
            after += 1
        if (
            not isinstance(part, torch.Tensor)
            or after >= len(found)
            or found[after].opname != "LOAD_ATTR"
        ):
            continue
        after = _operand_of(found, after)
        if after < len(found) and found[after].opname == "IS_OP":
            owner = paths.get(id(modules[str(one.argval)]), "")
            path = ".".join([owner, *names] if owner else names)
            positions = getattr(one, "positions", None)
            line = getattr(positions, "lineno", None) or _line_at(found, at) or code.co_firstlineno
            text = linecache.getline(code.co_filename, line).strip()
            return path, f"{code.co_filename}:{line}", text
    return None


_STDLIB = os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep
"""Python's own library, but for packages installed inside it."""


def _python_own(filename: str) -> bool:
    """Whether code in ``filename`` is Python's own library's (not a package installed
    beside it, as a system Python keeps them)."""
    if not filename.startswith(_STDLIB):
        return False
    rest = filename[len(_STDLIB) :].split(os.sep)
    return not ({"site-packages", "dist-packages"} & set(rest))


class _Reached(NamedTuple):
    """What :func:`_reached` noted: per function of the model's the trace ran, those of its
    arguments handed a stand-in for one of the forward's (``stood``), and those handed the
    very tuple or dataclass a forward's argument is fixed at (``held``), each to the
    forward's argument; those handed a module (``modules``); and those handed a stand-in
    for a value made as the forward ran (``made``)."""

    stood: dict[CodeType, dict[str, str]]
    held: dict[CodeType, dict[str, str]]
    modules: dict[CodeType, dict[str, nn.Module]]
    """Per function, those of its arguments handed a module (``self``): what it reads of
    their tensors fx stands in for too."""
    made: dict[CodeType, dict[str, str]]
    """Per function, those of its arguments handed a stand-in for a value made as the
    forward was traced (what a declared submodule answered), and those of its locals
    holding one as it returned, each to itself."""
    within: dict[CodeType, dict[str, str]]
    """Per function, those of its arguments and locals holding a stand-in inside a list,
    tuple or dict (``self.helper([x, y])``), each to itself."""


@contextlib.contextmanager
def _reached(concrete: Mapping[str, Any]) -> Iterator[_Reached]:
    """While a forward is traced in this thread, the code of the functions it runs that
    are the model's (not torch's, this package's or Python's own), each with those of its
    arguments handed a stand-in for one of the forward's, those handed the very tuple or
    dataclass one of ``concrete`` is fixed at (their names, each to the argument of the
    forward), those handed a module, and those handed a stand-in for a value made as the
    forward ran. fx hands a method of the model, a function or the forward of a block it
    traces into what the forward hands them, and what they compare the type of, or
    compare by identity, is read there as in the forward."""
    found = _Reached({}, {}, {}, {}, {})
    kept = [
        (name, value)
        for name, value in concrete.items()
        if isinstance(value, tuple) or dataclasses.is_dataclass(value)
    ]
    get, put = _free_hook()
    was = get()

    def stand_in(code: CodeType, name: str, value: Any) -> None:
        # `issubclass`, not `isinstance`, which the trace replaces to ask for the forward.
        if issubclass(type(value), fx.Proxy):
            if value.node.op == "placeholder":
                found.stood.setdefault(code, {})[name] = str(value.node.target).lstrip("*")
            else:
                found.made.setdefault(code, {})[name] = name
        elif _holds_a_stand_in(value):
            found.within.setdefault(code, {})[name] = name

    def note(frame: types.FrameType) -> None:
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        given = frame.f_locals
        for name in code.co_varnames[:count]:
            value: Any = given.get(name)
            stand_in(code, name, value)
            for argument, held in kept:
                if value is held:
                    found.held.setdefault(code, {})[name] = argument
            if issubclass(type(value), nn.Module):
                found.modules.setdefault(code, {})[name] = value

    if was is not None and not callable(was):
        # Neither hook free, nor the one set callable from here: it is not taken over.
        yield found
        return
    mine = _MINE
    """Per file a function met is written in, whether it is the model's: a hook called
    at every call the trace makes (of torch's code most) looks no further than this."""

    running: list[types.FrameType] = []
    """The model's functions running, innermost last: a return is looked at only where it
    is the innermost one's (calls and returns nest), at no more than a comparison for the
    many others."""

    def profile(frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            filename = frame.f_code.co_filename
            found_mine = mine.get(filename)
            if found_mine is None:
                found_mine = _model_own(filename)
            if found_mine:
                note(frame)
                running.append(frame)
        elif event == "return" and running and frame is running[-1]:
            running.pop()
            # Its locals as it returns: a value it made of a stand-in (`h = x * 2`), or an
            # item it took out of a list of them, is one too.
            code = frame.f_code
            asking = _ASKING.get(id(code))
            if asking is None or asking[0] is not code:
                asking = _asking(code)
            if asking[1]:
                for name, value in frame.f_locals.items():
                    stand_in(code, name, value)
        return None

    def profile_on(frame: types.FrameType, event: str, arg: Any) -> Any:
        # One set before, which no hook was free of: kept running (a tracer's own hook for
        # the frame is the answer).
        profile(frame, event, arg)
        return was(frame, event, arg)

    put(profile if was is None else profile_on)
    try:
        yield found
    finally:
        put(was)


def _fx_put_back() -> Callable[[], None]:
    """What puts back what fx changes for every thread as it traces, from here on: how
    every module is called and read (``nn.Module.__call__``, ``__getattr__``), the
    functions it wraps where the forward finds them (``math``'s), and its flag that it
    traces (``is_fx_tracing``). fx puts them back itself as its trace ends: this is for a
    child forked meanwhile (:func:`~somatize_torch._modes.put_back_in_child`)."""
    patcher, flag = (
        getattr(_symbolic_trace, "CURRENT_PATCHER", None),
        _symbolic_trace._is_fx_tracing_flag,
    )
    module_was = {name: vars(nn.Module)[name] for name in ("__call__", "__getattr__")}

    def put_back() -> None:
        now = getattr(_symbolic_trace, "CURRENT_PATCHER", None)
        if now is not None and now is not patcher:
            for patch in reversed(now.patches_made):
                with contextlib.suppress(KeyError):  # one that deletes, and deleted already
                    patch.revert()
            _symbolic_trace.CURRENT_PATCHER = patcher
        # torch 2.4 keeps no record of the patches of the trace under way: how every module
        # is called and read is put back all the same
        for name, was in module_was.items():
            setattr(nn.Module, name, was)
        _symbolic_trace._is_fx_tracing_flag = flag

    return put_back


def _holds_a_stand_in(value: Any, depth: int = 0) -> bool:
    """Whether ``value``, a list, tuple or dict (or one in one, a few deep), holds a value
    fx stands in for."""
    kind = type(value)
    if kind is dict:
        value = value.values()
    elif not issubclass(kind, (list, tuple)):
        return False
    for one in value:
        if issubclass(type(one), fx.Proxy):
            return True
        if depth < 3 and _holds_a_stand_in(one, depth + 1):
            return True
    return False


_ASKING: dict[int, tuple[CodeType, bool]] = {}
"""Per function's code (by id, kept with it), whether it could ask what type a value is
(:func:`_type_compared`): the locals of one that cannot are not looked at."""


def _asking(code: CodeType) -> tuple[CodeType, bool]:
    """``code`` with whether it calls ``type``, reads a ``__class__`` or compares by
    identity, noted in :data:`_ASKING`."""
    if len(_ASKING) >= 4096:
        _ASKING.clear()
    asks = any(
        (one.opname in ("LOAD_GLOBAL", "LOAD_NAME") and one.argval == "type")
        or (one.opname == "LOAD_ATTR" and one.argval == "__class__")
        or one.opname == "IS_OP"
        for one in dis.get_instructions(code)
    )
    found = _ASKING[id(code)] = (code, asks)
    return found


_MINE: dict[str, bool] = {}
"""Per file code runs from, whether it is a model's (:func:`_model_own`): a process meets
few files, and a trace runs the functions of each many times."""


def _model_own(filename: str) -> bool:
    """Whether code in ``filename`` is the model's (not torch's, this package's or Python's
    own), noted in :data:`_MINE`."""
    if len(_MINE) >= 4096:  # fx names the code of each module it makes a file of its own
        _MINE.clear()
    path = os.path.abspath(filename)
    own = _MINE[filename] = not (in_torch(path) or path.startswith(_OURS) or _python_own(path))
    return own


def _free_hook() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """How to read and set the hook :func:`_reached` notes the functions a trace runs
    through: the profiler's where none is set, else the tracer's where none is set, else
    the one whose hook set is a Python callable, called on (a profiler set in C, cProfile's
    before Python 3.12, is not callable, and ``sys.setprofile`` could not put it back)."""
    hooks = ((sys.getprofile, sys.setprofile), (sys.gettrace, sys.settrace))
    for get, put in hooks:
        if get() is None:
            return get, put
    return next(((get, put) for get, put in hooks if callable(get())), hooks[0])


def _line_at(found: list[dis.Instruction], at: int) -> int | None:
    """The line of the instruction ``found[at]``, in a Python whose instructions carry no
    positions (3.10): the last line one of them up to it starts."""
    for one in reversed(found[: at + 1]):
        if type(one.starts_line) is int:
            return one.starts_line
    return None


def _refusal(error: Exception, model: nn.Module, tracer: _Tracer, training: bool) -> Untraceable:
    """What refuses ``model``'s forward where fx stopped tracing it in mode ``training``
    with ``error``, saying where and what to do."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not in_torch(f.filename) and f.filename not in _WRAPPING
    ]
    where = (
        f" at {frames[-1].filename}:{frames[-1].lineno} (`{(frames[-1].line or '').strip()}`)"
        if frames
        else ""
    )
    mode = "train" if training else "eval"
    branched = tracer.branched if isinstance(error, torch.fx.proxy.TraceError) else None
    if isinstance(error, Fixed):
        return _stops(
            Untraceable(
                f"torch.fx cannot trace `{type(model).__qualname__}.forward` in {mode} mode"
                f"{where}: it {error}. Declared submodules are never traced into, so declare "
                "the submodule that holds this code, or wrap just the submodule you want to "
                "remember — `model.encoder = somatize.torch.wrap(model.encoder, frozen=True, "
                "cached=True)`, or `somatize.torch.cache_rows(model.encoder, ...)` — which "
                "needs no tracing and leaves this forward to run as it is written"
            )
        )
    if isinstance(error, torch.fx.proxy.TraceError) and tracer.iterated is not None:
        return _stops(
            Untraceable(
                f"torch.fx cannot trace `{type(model).__qualname__}.forward` in {mode} mode"
                f"{where}: it iterates over {tracer.iterated}, whose length fx does not "
                "know: it stands in for what a module answers while it traces. Take its "
                "items by index or key (`out[0] + out[1]`, `out['h']`), or unpack as many "
                "as it holds (`a, b = self.encoder(x)`), declare the submodule that holds "
                "this code, or wrap just the submodule you want to remember — `model.encoder = "
                "somatize.torch.wrap(model.encoder, frozen=True, cached=True)` — which "
                "needs no tracing"
            )
        )
    tensors = tracer.tensors if isinstance(error, torch.fx.proxy.TraceError) else frozenset()
    if tensors:
        shown = ", ".join(f"`{name}`" for name in sorted(tensors))
        refused = Untraceable(
            f"torch.fx cannot trace `{type(model).__qualname__}.forward` in {mode} mode"
            f"{where}: it branches on the shape, size or value of {shown}, a tensor "
            f"({type(error).__name__}: {error}), and fx cannot follow a branch on a "
            "tensor's shape, size or value: it stands in for the tensor as it traces, "
            "with no shape or values to pick a side by. Make the shape static (drop the "
            "check, or check it before calling the model), write the branch as tensor "
            "code (`torch.where`), declare the submodule that holds this code "
            "(`wrap(model, frozen=[...])`; declared submodules are never traced into), "
            "or wrap just the submodule you want to remember — `model.encoder = "
            "somatize.torch.wrap(model.encoder, frozen=True, cached=True)` — which needs "
            "no tracing"
        )
        refused.branched = branched
        refused.tensors = tensors
        refused.where = where
        return refused
    refused = Untraceable(
        f"torch.fx cannot trace `{type(model).__qualname__}.forward` in {mode} mode{where}: "
        f"{type(error).__name__}: {error}. Declared submodules are never traced into, so "
        "declare the submodule that holds this code (`wrap(model, frozen=[...])`), make the "
        "call traceable (no Python control flow on tensor values), or wrap just the "
        "submodule you want to remember — `model.encoder = somatize.torch.wrap("
        "model.encoder, frozen=True, cached=True)` — which needs no tracing"
    )
    refused.branched = branched
    refused.where = where
    return refused


def _stops(error: Untraceable) -> Untraceable:
    """``error``, one that no argument fixed at a value would lift (what fx would fix at
    the value it read, an assignment as the forward runs): refused as it is."""
    error.branched = frozenset()
    return error


_ASSERT_IS_NONE = getattr(torch.fx._symbolic_trace, "_assert_is_none", None)
_SPECIALIZED = re.compile(r"\w+ has been specialized to have value ")


def _plain_code(graph: fx.Graph, fixed: bool = False) -> None:
    """Leaves out of ``graph`` what would keep the module made of it from being pickled
    (``torch.save`` of a model holding the wrapped one, a copy sent to a worker), and is
    not needed to run it: the forward's annotations, which fx writes into the code and
    names as globals — one written as a string (``from __future__ import annotations``)
    a global holding that string — and the checks fx adds that an argument traced as
    None is None (its own wrapped function, named in a way its unpickling cannot find),
    and the checks it adds that one traced fixed at a value has it — which the wrapped model
    makes itself, picking the code by the arguments left None and the values given.

    fx writes an Enum member into the code by its class and name, which a flag value of
    members combined (`SCALE|SHIFT`) or of none (no name) does not make Python of: such
    a value is made in the code by its class from its value instead, and, in code traced
    with arguments ``fixed`` (at None or at values), which is called with every argument
    in its place, no placeholder keeps a default."""
    for node in list(graph.nodes):
        node.type = None
        if node.op == "placeholder" and fixed:
            node.args = ()
        elif node.op == "placeholder" and node.args and _unspellable(node.args[0]):
            raise _stops(
                Untraceable(
                    f"the forward's argument `{node.target}` is taken as an input and defaults "
                    f"to `{node.args[0]!r}`, a flag value with no name of its own: torch.fx "
                    "writes a default into its code by its class and name, which that value "
                    "does not make Python of. Give the argument a default with a name of its "
                    "own (a member, or None), or declare the submodule that takes it"
                )
            )
        elif node.op != "placeholder":
            _spelled(graph, node)
        if node.op == "call_function" and node.target is _ASSERT_IS_NONE:
            graph.erase_node(node)
        elif (
            node.op == "call_function"
            and node.target is torch._assert
            and len(node.args) == 2
            and isinstance(node.args[1], str)
            and _SPECIALIZED.match(node.args[1])
        ):
            # fx's check that an argument traced fixed at a plain value has it (a NaN
            # never would): the wrapped model picks the code by the values itself.
            compared = node.args[0]
            graph.erase_node(node)
            if isinstance(compared, fx.Node) and not compared.users:
                graph.erase_node(compared)
    codegen = graph._codegen
    if isinstance(codegen, torch.fx.graph._PyTreeCodeGen) and codegen.pytree_info is not None:
        info = codegen.pytree_info
        # The forward's own arguments, after the module it is bound to, whatever the
        # forward names that one (`self`, `this`, `m`).
        _one_place_each(graph, list(info.orig_args[1:]))
        if info.out_spec is not None:
            # What the forward returns, put back together as fx's code did.
            output = next(node for node in graph.nodes if node.op == "output")
            flat = output.args[0]
            assert isinstance(flat, (list, tuple))
            output.args = (tree_unflatten(list(flat), info.out_spec),)
        graph._codegen = fx.graph.CodeGen()


def _unspellable(value: Any) -> bool:
    """Whether fx would write ``value`` into code as no Python: an Enum member with no
    name, or with one of members combined."""
    return isinstance(value, enum.Enum) and not (value.name or "").isidentifier()


def _spelled(graph: fx.Graph, node: fx.Node) -> None:
    """Has ``node`` take each Enum member fx cannot write (:func:`_unspellable`) from a
    node making it by its class from its value."""
    made: dict[int, fx.Node] = {}

    def spell(value: Any) -> Any:
        if not _unspellable(value):
            return value
        if id(value) not in made:
            with graph.inserting_before(node):
                made[id(value)] = graph.call_function(type(value), (value._value_,))
        return made[id(value)]

    found: list[Any] = []
    fx.node.map_aggregate((node.args, node.kwargs), found.append)
    if any(_unspellable(one) for one in found):
        node.args = fx.node.map_aggregate(node.args, spell)
        node.kwargs = fx.node.map_aggregate(node.kwargs, spell)


def _one_place_each(graph: fx.Graph, names: Sequence[str]) -> None:
    """Gives ``graph`` one placeholder per argument ``names`` lists, in its order, as the
    code the model is cut into takes them. fx takes an argument fixed at a tuple apart, a
    placeholder per item, and writes code that takes them apart as it is called, which the
    cut code does not keep; the items are constants in the code, their placeholders
    unused once fx's checks of them are left out, so one stands for the tuple. Such code
    is called with every argument, in its place: no placeholder keeps its default, which
    one after it without would make no Python."""
    held = {str(node.target): node for node in graph.nodes if node.op == "placeholder"}
    for node in held.values():
        node.args = ()
    for target, node in list(held.items()):
        if target not in names and not node.users:
            graph.erase_node(node)
    previous: fx.Node | None = None
    for name in names:
        node = held.get(name)
        if node is None:
            if previous is None:
                with graph.inserting_before(next(iter(graph.nodes))):
                    node = graph.placeholder(f"{name}_fixed")
            else:
                with graph.inserting_after(previous):
                    node = graph.placeholder(f"{name}_fixed")
        previous = node


def _refuse_modules_handed(name: str, target: str, node: fx.Node, model: nn.Module) -> None:
    """Refuses a cached call of ``target`` handed a module of the model (``enc(x,
    self.embed)``): fx hands it on by its path, which the cut code reads, and the call is
    keyed by the tensors it is handed, which the module's weights are not among; so the
    answer computed through one module would be recalled for another, or for the same one
    once it trained or loaded a checkpoint. A part of ``target`` itself is keyed by its
    state, and is let be."""
    handed: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), handed.append)
    for value in handed:
        if value.op != "get_attr" or str(value.target).startswith(f"{target}."):
            continue
        try:
            module = model.get_submodule(str(value.target))
        except AttributeError:
            continue  # a parameter or a buffer: a tensor, handed and keyed as one
        raise WrapError(
            f"`{name}` is cached and is handed a module, `{value.target}`, a "
            f"`{type(module).__qualname__}`, by `{type(model).__qualname__}.forward`: a "
            "cached call is keyed by the tensors it is handed and the constants beside them, "
            "and a module is no constant: its weights are not in the key, so the answer "
            "computed through one module would be recalled for another, or for the same one "
            "once its weights changed. Have the submodule hold the module itself (it is then "
            "frozen with it, and keyed by its weights), hand it what the module computes, or "
            "drop it from `cached=`"
        )


def _describe_call(node: fx.Node, inner: nn.Module) -> Any:
    """The constant part of a declared call, as a canonical value (tensors are inputs).

    A cached call is keyed by this and by the inputs the cut code (``inner``) hands it,
    each once, in the order the call first reads them. Each input is ``"<input>"`` where
    that order is the one the description is keyed in (a dict's keys sorted), each read
    once, or where there is one input: the inputs then tell where each stands. Otherwise
    each is named by its place among them (``"<input 1>"``): `enc(q=x, k=c)` and `enc(k=x,
    q=c)`, or `enc(x, c, x)` and `enc(x, c, c)`, hand the same inputs, in the same order,
    to other places, and are keyed apart."""
    graph: fx.Graph | None = getattr(inner, "graph", None)
    handed = [] if graph is None else [n.name for n in graph.nodes if n.op == "placeholder"]
    places = {name: at for at, name in enumerate(handed)}
    met = [places.get(n.name) for n in _inputs_in_key_order((node.args, node.kwargs))]
    told = len(places) < 2 or None in met or met == list(range(len(places)))
    held = None if told else places
    # The arguments as a list, as they were described before tuples inside were told apart.
    args = [_constant(value, held) for value in node.args]
    return {"args": args, "kwargs": _constant(node.kwargs, held)}


def _inputs_in_key_order(value: Any) -> Iterator[fx.Node]:
    """The inputs of a declared call's arguments in the order :func:`_constant`'s value
    of them is keyed in: a dict's by its keys, sorted."""
    if isinstance(value, fx.Node):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _inputs_in_key_order(v)
    elif isinstance(value, dict):
        for _, v in sorted(
            ((_dict_key(k), v) for k, v in value.items()), key=operator.itemgetter(0)
        ):
            yield from _inputs_in_key_order(v)


def _constant(value: Any, places: Mapping[str, int] | None = None) -> Any:
    """An argument of a declared call as a canonical value: ``"<input>"`` for an input, or
    with ``places``, the place of each among the call's inputs (``"<input 1>"``).

    A submodule may answer a tuple and a list of the same items apart (``isinstance(how,
    tuple)``), a dtype and the string spelling it, or ``{1: ...}`` and ``{"1": ...}``: a
    tuple stays a tuple, a value of no plain kind is described by its repr as bytes, which
    no plain value is described as, and a dict key other than a str by its kind and repr."""
    if isinstance(value, fx.Node):
        return "<input>" if places is None else f"<input {places[value.name]}>"
    if isinstance(value, tuple):
        return tuple(_constant(v, places) for v in value)
    if isinstance(value, list):
        return [_constant(v, places) for v in value]
    if isinstance(value, dict):
        return {_dict_key(k): _constant(v, places) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value).encode()


def _dict_key(key: Any) -> str:
    """A dict key of a declared call's constant as the str a canonical dict is keyed by:
    a str as itself, any other as its kind and repr (``"<int 1>"``), apart from the str
    spelling it."""
    return key if isinstance(key, str) else f"<{type(key).__name__} {key!r}>"


def _same_constant(a: Any, b: Any) -> bool:
    """Whether two constants of declared calls are one, by kind and spelling as a trace
    per value tells them apart: `True`, `1` and `1.0`, `0.0` and `-0.0` are equal in
    Python and answer otherwise in a submodule that asks; every NaN is one."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool([_constant(a)] == [_constant(b)])


def _calls(calls: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"`{name}`" for name, _ in calls) or "none"


class _Split(NamedTuple):
    """A traced model cut at its declared submodules."""

    runner: fx.GraphModule
    nodes: dict[str, Node]
    edges: list[tuple[Node, Node]]
    outputs: list[Node]
    calls: list[tuple[str, Any]]
    """Each declared call, in order: its node's name and its constant arguments."""
    targets: dict[str, ModuleNode]
    """Each declared submodule called, by path, and the node of its first call."""
    shims: dict[str, _Cached | _Declared | _Adapted]
    """What stands where each declared call was, by its node's name."""
    reads: list[_Read]
    called: dict[str, _Call]
    """Each declared call, by its node's name, as the traced code makes it."""


def _split(
    gm: fx.GraphModule,
    model: nn.Module,
    frozen_names: Mapping[str, str | None],
    cached_names: Mapping[str, str | None],
    wrapped: Wrapped,
    first: _Split | None,
) -> _Split:
    """``gm`` cut at the declared submodules, ``split_module``-style. With the ``first``
    cut of the same model (traced in the other mode, or with arguments left None), each
    declared call is given the shim of the same name, so one node stands for it in both;
    a call handed None where that one was handed an input is given it through an
    :class:`_Adapted`, which hands the shim None there."""
    # Segment is public, and named by the module it is defined in (its identity is
    # ``somatize_torch.wrap:Segment``): it stays there, and that module imports this one.
    from somatize_torch.wrap import Segment

    _through_a_call(gm)
    calls: dict[str, int] = {}
    part: dict[fx.Node, int] = {}
    about: dict[int, tuple[str, str, fx.Node]] = {}
    at = 0
    for fx_node in gm.graph.nodes:
        if fx_node.op == "call_module" and fx_node.target in frozen_names.keys() | cached_names:
            target = str(fx_node.target)
            calls[target] = calls.get(target, 0) + 1
            name = target if calls[target] == 1 else f"{target}~{calls[target]}"
            at += 1
            part[fx_node] = at
            about[at] = (name, target, fx_node)
            at += 1
        else:
            part[fx_node] = at
    qualnames: dict[str, str] = {}
    runner = split_module(
        gm, model, lambda n: part[n], qualname_map=qualnames, keep_original_order=True
    )
    _reloaded_as_cut(runner)
    reads = _reads(gm, runner, qualnames, model, set(calls))
    made: dict[str, _Cached | _Declared | _Adapted] = {}
    called: dict[str, _Call] = {}
    targets: dict[str, ModuleNode] = {}
    said: list[tuple[str, Any]] = []
    nodes: dict[str, Node] = {}
    producers: dict[fx.Node, str] = {}
    edges: list[tuple[Node, Node]] = []
    for call in runner.graph.nodes:
        if call.op != "call_module":
            continue
        index = int(str(call.target).rsplit("_", 1)[1])
        inner = runner.get_submodule(str(call.target))
        if index in about:
            name, target, fx_node = about[index]
            if target in cached_names:
                _refuse_modules_handed(name, target, fx_node, model)
            called[name] = _call_of(fx_node)
            described = _describe_call(fx_node, inner)
            shim: _Cached | _Declared | _Adapted | None = None
            base: _Cached | _Declared | None = None
            if first is not None and name in first.shims:
                shim = first.shims[name]
                was = dict(first.calls)[name]
                places = _places(first, name, called[name], inner)
                if places is None:
                    # Other constants (a value traced per value handed on), or the same
                    # with its inputs handed in other places (one input in two): the
                    # first cut's shim cannot take them. A shim of its own runs this
                    # call, the same node, keyed apart by the call it makes; whether a
                    # trace may call it so is for the one that keeps the traces to say.
                    if described == was:
                        described = {"inputs": "handed otherwise", **described}
                    base = shim.shim if isinstance(shim, _Adapted) else shim
                    shim = None
                elif places != list(range(len(places))):
                    held = shim.shim if isinstance(shim, _Adapted) else shim
                    shim, described = _Adapted(held, places), was
                else:
                    described = was
            said.append((name, described))
            if shim is None:
                shim = _shim(
                    name,
                    model.get_submodule(target),
                    inner,
                    described,
                    wrapped,
                    frozen=target in frozen_names,
                    cached=(cached_names[target],) if target in cached_names else None,
                    base=base,
                )
            node: Node = shim.node if base is None else base.node
            targets.setdefault(target, shim.node)
            made[name] = shim
            setattr(runner, str(call.target), shim)
        else:
            name = f"fx_{sum(isinstance(n, Segment) for n in nodes.values())}"
            node = Segment(getattr(inner, "code", "")).named(name)
        nodes[name] = node
        producers[call] = name
        for source in _sources(call, producers):
            edges.append((nodes[source], node))
    outputs = [
        nodes[source]
        for out in runner.graph.nodes
        if out.op == "output"
        for source in _sources(out, producers)
    ]
    return _Split(
        runner,
        nodes,
        edges,
        outputs or list(nodes.values())[-1:],
        said,
        targets,
        made,
        reads,
        called,
    )


class _Reloading(_KeepsKinds):
    """Traces the code of a cut model again as a copy of it is loaded (``torch.load``):
    fx makes each of its modules anew from its code that way, keeping only what it does to
    tensors, and would run the calls recorded into it (the modes the forward switches, the
    checks of the items it takes out of a list or dict) once, as it loads, and keep none.
    Those are kept as calls."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        found = getattr(getattr(type(root), "forward", None), "__globals__", None)
        space: dict[str, Any] = found if isinstance(found, dict) else {}
        kept = {name: value for name, value in space.items() if id(value) in _KEPT}

        def recorded(target: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                return self.create_proxy("call_function", target, args, kwargs)

            return call

        for name, value in kept.items():
            space[name] = recorded(value)
        try:
            return super().trace(root, concrete_args)
        finally:
            space.update(kept)


def _reloaded_as_cut(runner: fx.GraphModule) -> None:
    """Has ``runner`` and the segments it calls traced by :class:`_Reloading` as a copy of
    them is loaded."""
    for module in (runner, *runner.children()):
        if isinstance(module, fx.GraphModule):
            module._tracer_cls = _Reloading


class _Adapted(nn.Module):
    """Stands where a declared call is handed None in place of an input the first cut
    handed it (an optional argument a call leaves None, handed on): calls that cut's shim,
    with None there, so the call is the same node, keyed by None where it stands."""

    shim: _Cached | _Declared

    def __init__(self, shim: _Cached | _Declared, places: list[int | None]) -> None:
        super().__init__()
        self.shim = shim
        self.places = places
        """For each input of the first cut's call, the place of this call's input handed
        there; None where this call is handed None."""

    @property
    def node(self) -> ModuleNode:
        return self.shim.node

    def forward(self, *inputs: Any) -> Any:
        return self.shim(*[None if at is None else inputs[at] for at in self.places])


class _Input(NamedTuple):
    """An input of a declared call, by the name of the node that makes it."""

    name: str


class _Call(NamedTuple):
    """A declared call as the traced code makes it: its target, and its arguments with
    each input an :class:`_Input` (kept apart from the graph, which a copy or a pickle of
    the wrapped model need not take along)."""

    target: str
    args: Any
    kwargs: Any


def _call_of(node: fx.Node) -> _Call:
    def plain(value: Any) -> Any:
        if isinstance(value, fx.Node):
            return _Input(value.name)
        if isinstance(value, tuple):
            return tuple(map(plain, value))
        if isinstance(value, list):  # fx's own lists among them
            return list(map(plain, value))
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, slice):  # `x[:, :n]` handed on, `n` an input
            return slice(plain(value.start), plain(value.stop), plain(value.step))
        return value

    return _Call(str(node.target), plain(node.args), plain(node.kwargs))


def _places(first: _Split, name: str, now: _Call, inner: nn.Module) -> list[int | None] | None:
    """How the inputs of declared call ``now`` (cut as ``inner``) are handed to the shim
    of the call ``name`` of the ``first`` cut, when ``now`` is that call with its inputs
    handed otherwise (None where it was handed one, one input in two places, inputs in
    other places): for each input of that call, the place of the input of ``now`` handed
    there, or None. None when the calls differ otherwise (constants, or two inputs of
    ``now`` where that call had one)."""
    was = first.called[name]
    pairs: list[tuple[_Input, _Input | None]] = []

    def walk(a: Any, b: Any) -> bool:
        if isinstance(a, _Input):
            if isinstance(b, _Input) or b is None:
                pairs.append((a, b))
                return True
            return False
        if isinstance(b, _Input):
            return False
        if isinstance(a, (tuple, list)):
            return (
                type(a) is type(b)
                and len(a) == len(b)
                and all(walk(x, y) for x, y in zip(a, b, strict=True))
            )
        if isinstance(a, dict):
            return isinstance(b, dict) and list(a) == list(b) and all(walk(a[k], b[k]) for k in a)
        if isinstance(a, slice):
            return isinstance(b, slice) and walk(
                (a.start, a.stop, a.step), (b.start, b.stop, b.step)
            )
        return _same_constant(a, b)

    # Keyword arguments are the same call in any order (`enc(x, a=p, b=q)`, `b=q, a=p`).
    named = was.kwargs.keys() == now.kwargs.keys() and all(
        walk(was.kwargs[k], now.kwargs[k]) for k in was.kwargs
    )
    if was.target != now.target or not (walk(was.args, now.args) and named):
        return None
    handed: dict[str, _Input | None] = {}
    for a, b in pairs:
        if handed.setdefault(a.name, b) != b:
            return None  # one input of that call handed two ways here
    shim = first.shims[name]
    base = shim.shim if isinstance(shim, _Adapted) else shim
    if not (isinstance(base.call, fx.GraphModule) and isinstance(inner, fx.GraphModule)):
        return None
    wanted = [n.name for n in base.call.graph.nodes if n.op == "placeholder"]
    given = [n.name for n in inner.graph.nodes if n.op == "placeholder"]
    places: list[int | None] = []
    for input_name in wanted:
        if input_name not in handed:
            return None
        b = handed[input_name]
        if b is not None and b.name not in given:
            return None
        places.append(None if b is None else given.index(b.name))
    if {at for at in places if at is not None} != set(range(len(given))):
        return None  # an input of this call handed nowhere
    return places


def _through_a_call(gm: fx.GraphModule) -> None:
    """Makes what the forward returns as it is held (``return h, self.scale``) pass
    through a call of :func:`_held`: a part handed straight to the output belongs to no
    segment, and cutting the code would find nothing that computes it."""
    output = next(node for node in gm.graph.nodes if node.op == "output")
    held = {node for node in output.all_input_nodes if node.op == "get_attr"}
    if not held:
        return
    with gm.graph.inserting_before(output):
        passed = {node: gm.graph.call_function(_held, (node,)) for node in held}
    output.args = fx.node.map_arg(output.args, lambda node: passed.get(node, node))
    gm.recompile()


def _held(value: Any) -> Any:
    """``value`` itself: what the forward returns as the model holds it."""
    return value


def _items_checked(
    graph: fx.Graph,
    containers: frozenset[str],
    model: str,
    tested: frozenset[tuple[str, Any]] = frozenset(),
) -> None:
    """Has each item ``graph`` takes out of an argument handed a list, tuple or dict
    (``batch.get("mask")``, ``items[1]``) checked as the code runs, where it computes with
    it (not only hands it to a module, which runs as it is written): fx stands in for the
    item, which is never None, so the code traced is the forward's for a value there
    (``mask is None`` answered no), and a call handing None there, or leaving the key out,
    would run it with None."""
    if not containers:
        return
    named: dict[fx.Node, str] = {}
    """Each item taken so far, as the call names it (``batch['inner']``): an item taken
    out of it in turn (``batch["inner"]["mask"]``) is one too."""
    for node in list(graph.nodes):
        taken = (node.op == "call_function" and node.target is operator.getitem) or (
            node.op == "call_method"
            and node.target == "get"
            and (len(node.args) < 3 or node.args[2] is None)
            and not node.kwargs
        )
        if not taken or len(node.args) < 2:
            continue
        source, key = node.args[0], node.args[1]
        if not isinstance(source, fx.Node) or isinstance(key, (fx.Node, slice)):
            continue
        if source.op == "placeholder" and str(source.target).lstrip("*") in containers:
            name = str(source.target).lstrip("*")
        elif source in named:
            name = named[source]
        else:
            continue
        shown = f"{name}[{key!r}]"
        named[node] = shown
        item = (name, key)
        if item not in tested and all(user.op in ("call_module", "output") for user in node.users):
            continue
        with graph.inserting_after(node):
            checked = graph.call_function(
                _taken, (node, model, name, key, node.op != "call_function")
            )
        named[checked] = shown
        users = [user for user in node.users if user is not checked]
        for user in users:
            user.replace_input_with(node, checked)


def _none_tested(code: CodeType, containers: frozenset[str]) -> frozenset[tuple[str, Any]]:
    """The items ``code`` takes out of an argument of ``containers`` by a constant
    (``batch.get("mask")``, ``extra[1]``) and tests against None (``mask is not None``),
    each as the argument's name and the key: handed on only to a module, such an item is
    still checked (:func:`_items_checked`), since the forward may hand it on only where it
    is there."""
    found = list(dis.get_instructions(code))
    stored: dict[str, tuple[str, Any]] = {}
    tested: set[tuple[str, Any]] = set()
    # The locals holding a container, each as a call names it: an argument, or an item
    # taken out of one (`inner = batch["inner"]`, named `batch['inner']`).
    sources = {name: name for name in containers}
    for at, one in enumerate(found):
        loads = one.opname in _LOAD_ONE
        taken = _taken_at(found, at + 1) if loads and one.argval in sources else None
        if taken is not None:
            name, (key, after) = sources[str(one.argval)], taken
            # An item of an item (`batch["inner"].get("mask")`): named by its path.
            while (deeper := _taken_at(found, after)) is not None:
                name, (key, after) = f"{name}[{key!r}]", deeper
            item = (name, key)
            if after < len(found) and found[after].opname.startswith("STORE_"):
                stored[str(found[after].argval)] = item
                sources[str(found[after].argval)] = f"{name}[{key!r}]"
            elif _none_test_at(found, after):
                tested.add(item)
        elif loads and one.argval in stored and _none_test_at(found, at + 1):
            tested.add(stored[str(one.argval)])
    return frozenset(tested)


def _taken_at(found: list[dis.Instruction], at: int) -> tuple[Any, int] | None:
    """The constant key an item is taken out of the value loaded before ``found[at]`` by
    (``.get(key)``, ``[key]``), with where the instruction after that is; None for none."""
    if at < len(found) and found[at].opname in ("LOAD_METHOD", "LOAD_ATTR"):
        if found[at].argval != "get":
            return None
        at += 1
        if at >= len(found) or found[at].opname not in ("LOAD_CONST", "LOAD_SMALL_INT"):
            return None
        key = found[at].argval
        at += 1
        while at < len(found) and found[at].opname in ("PRECALL", "CACHE"):
            at += 1
        if (
            at >= len(found)
            or found[at].opname not in ("CALL", "CALL_METHOD")
            or found[at].arg != 1
        ):
            return None
        return key, at + 1
    if (
        at + 1 < len(found)
        and found[at].opname in ("LOAD_CONST", "LOAD_SMALL_INT")
        and (
            found[at + 1].opname == "BINARY_SUBSCR"
            or (found[at + 1].opname == "BINARY_OP" and "[" in found[at + 1].argrepr)
        )
    ):
        return found[at].argval, at + 2
    return None


def _none_test_at(found: list[dis.Instruction], at: int) -> bool:
    """Whether the instructions from ``found[at]`` on test the value loaded before them
    against None (``is None``, ``is not None``)."""
    if at < len(found) and found[at].opname.endswith(("IF_NONE", "IF_NOT_NONE")):
        return True
    return (
        at + 1 < len(found)
        and found[at].opname == "LOAD_CONST"
        and found[at].argval is None
        and found[at + 1].opname == "IS_OP"
    )


def _taken(value: Any, model: str, name: str, key: Any, got: bool) -> Any:
    """``value``, the item ``key`` of the forward's argument ``name`` (taken by ``get``,
    ``got``): refused where it is None (:func:`_items_checked`)."""
    if value is None:
        left_out = f", or `{name}` has no {key!r}" if got else ""
        raise WrapError(
            f"`{name}[{key!r}]` is None in this call{left_out}: fx traced "
            f"`{model}.forward` with a stand-in for `{name}`, and for each item it takes out "
            "of it, which is never None, so the code traced is the forward's for a value "
            f"there (a test of it against None answered no), not for None. Hand a value "
            f"there in every call, or take it as an argument of its own that defaults to "
            f"None (`{key if isinstance(key, str) and key.isidentifier() else 'mask'}=None`), "
            "which is traced with it None too, or declare the submodule that takes it"
        )
    return value


_KEPT = frozenset(id(fn) for fn in (*RECORDED, _taken))
"""The functions :class:`_Reloading` keeps as calls."""


def _shim(
    name: str,
    module: nn.Module,
    inner: nn.Module,
    described: Any,
    wrapped: Wrapped,
    *,
    frozen: bool,
    cached: tuple[str | None] | None,
    base: _Cached | _Declared | None = None,
) -> _Cached | _Declared:
    """What stands where ``module`` is called as node ``name``: its node, frozen, and cached
    with the salt in ``cached`` when that is given. With the ``base`` shim of the first
    cut, one for the same node making another call (``described``, run as ``inner``): a
    frozen one calls it as the base's node; a cached one is keyed by the base node's
    declaration and state, and by this call, and runs it on a miss."""
    if base is not None and cached is None:
        return _Declared(base.node, inner, wrapped)
    watched = None if cached is None else _Watched(name, inner, module)
    node = ModuleNode(module, spread=True, call=watched or inner, declared=described)
    if watched is not None:
        watched.node = node
    node._keys_precision = False  # each cached call keys the precision it runs in
    node.named(name)
    if frozen:
        node.frozen()
    if cached is None:
        return _Declared(node, inner, wrapped)
    node.cached(cached[0])
    if isinstance(base, _Cached):
        return _Cached(
            node, inner, wrapped, base=base, made={"call": described, "code": code_of(inner)}
        )
    return _Cached(node, inner, wrapped)


def code_of(inner: nn.Module) -> str:
    """The code of a declared call as the cut holds it (its inputs by place)."""
    return str(getattr(inner, "code", "")).strip()


def _reads(
    gm: fx.GraphModule,
    runner: fx.GraphModule,
    qualnames: Mapping[str, str],
    model: nn.Module,
    declared: Iterable[str],
) -> list[_Read]:
    """The parts of ``model`` that ``runner``'s code holds by reference — those fx read as
    attributes (``get_attr``), placed on the runner under their own path, and those each
    segment holds under its own name (``split_module``'s ``qualnames``) — but the
    declared submodules, which are never replaced."""
    places = [(str(n.target), str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"]
    places += list(qualnames.items())
    skip = set(declared)
    found: dict[tuple[int, str], _Read] = {}
    for where, path in places:
        if path in skip:
            continue
        prefix, _, field = where.rpartition(".")
        try:
            holder = runner.get_submodule(prefix) if prefix else runner
        except AttributeError:
            continue
        held = getattr(holder, field, _MISSING)
        if held is not _MISSING and held is _part(model, path):
            found.setdefault((id(holder), field), _Read(holder, field, path))
    return list(found.values())


def _sources(call: fx.Node, producers: Mapping[fx.Node, str]) -> list[str]:
    """The partitions whose outputs ``call`` reads, in the order it reads them."""
    found: list[str] = []

    def visit(value: fx.Node) -> fx.Node:
        origin = value
        while origin.op == "call_function" and origin.target is operator.getitem:
            first = origin.args[0]
            if not isinstance(first, fx.Node):
                break
            origin = first
        name = producers.get(origin)
        if name is not None and name not in found:
            found.append(name)
        return value

    fx.node.map_arg((call.args, call.kwargs), visit)
    return found
