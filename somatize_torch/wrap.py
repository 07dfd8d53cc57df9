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
``state_dict()`` keys — it registers the model's own children, parameters and
buffers under their own names — so optimizers and checkpoints work unchanged, in
both directions. ``wrapped.graph`` is the somatize graph (segments and declared
nodes, with who reads whom): ``freeze(wrapped)`` settles it, ``g.figure()``
draws it, ``wrapped.graph.record`` says what the last cached call did.

A cached node is asked of the store through the somatize engine, keyed by what
it is handed::

    key = H(identity, declaration, state digest, salt, H(content of its inputs))

Its inputs are weighed like an ``Opaque`` tensor batch — by content, dtype and
shape — so the same batch recalls the same answer, whatever came before it.
(One key per batch here; one key per row is :mod:`somatize_torch.rows`.)
An input that requires grad is refused: a recalled answer is a leaf, so what
produced the input would train on misses and silently stop on hits.

**torch.compile.** The cache lookup is a deliberate graph break: the call into
the store runs under ``torch.compiler.disable``, once per cached node, and reads
nothing that changes from batch to batch, so ``torch.compile(wrapped)`` compiles
the segments around it once and does not recompile per batch.

**What fx cannot trace** gets :class:`Untraceable`, naming the call that
stopped it. Declared submodules are never traced into, so declaring the part
that holds the data-dependent code is one way out; wrapping just that
submodule (``model.encoder = wrap(model.encoder, frozen=True, cached=True)``),
which needs no tracing at all, is the other.
"""

from __future__ import annotations

import inspect
import operator
import os
import traceback
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from somatize import Graph, Node, Opaque, Store, Unsettled
from somatize.engine import Record
from somatize.errors import SomatizeError
from somatize.memory import settled
from somatize.node import Expr
from somatize_torch.codec import TENSOR
from somatize_torch.freeze import ModuleNode, check_still, is_held

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

Names = bool | str | Sequence[str] | Mapping[str, str | None]


class WrapError(SomatizeError, ValueError):
    """A model cannot be wrapped as asked."""


class UnknownSubmodule(WrapError, KeyError):
    """A declared name that is not a submodule of the model."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class NotCalled(WrapError):
    """A declared submodule that the model's forward never calls."""


class Untraceable(SomatizeError, TypeError):
    """torch.fx could not trace the model's forward."""


class CachedInputNeedsGrad(SomatizeError, ValueError):
    """A cached node was handed a tensor that requires grad."""


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


# ------------------------------------------------------------------------------ shims


class _Declared(nn.Module):
    """Stands where a declared submodule is called in the partitioned model."""

    node: ModuleNode
    call: nn.Module

    def __init__(self, node: ModuleNode, call: nn.Module) -> None:
        super().__init__()
        self.call = call
        object.__setattr__(self, "node", node)

    def forward(self, *args: Any) -> Any:
        if not torch.compiler.is_compiling() and is_held(self.node.module):
            check_still(self.node._smz.name or "?", self.node.module)
        return self.call(*args)


class _Cached(nn.Module):
    """Stands where a cached submodule is called: the store is asked through the
    somatize engine, outside any compiled region."""

    node: ModuleNode
    owner: Wrapped
    call: nn.Module

    def __init__(self, node: ModuleNode, call: nn.Module, owner: Wrapped) -> None:
        super().__init__()
        self.call = call
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "owner", owner)
        self._solo: Graph | None = None
        self._state: str | None = None

    def forward(self, *args: Any) -> Any:
        return _remember(self, *args)


def _recall_or_run(self: _Cached, *args: Any) -> Any:
    """The cached call: refuse what cannot be keyed, then ask the engine."""
    node = self.node
    name = node._smz.name or "?"
    store = self.owner.store
    if store is None:
        return self.call(*args)
    for index, value in enumerate(args):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"`{name}` is cached and is called with a `{type(value).__name__}` as "
                f"argument {index}: a cached submodule is keyed by the content of the "
                "tensors it is handed, so its arguments must be tensors. Make the value a "
                "constant of the model, or drop the submodule from `cached=`"
            )
        if value.requires_grad:
            raise CachedInputNeedsGrad(
                f"`{name}` is cached and argument {index} it is handed requires grad: a "
                "recalled answer is a leaf, so whatever produced that argument would train "
                "when the answer is computed and silently stop when it is recalled. Freeze "
                "what feeds it, or drop it from `cached=`"
            )
    solo = self._solo
    if solo is None or self._state != node._smz.state:  # frozen again since
        solo = self._solo = Graph.somatize(node)
        self._state = node._smz.state
    with torch.no_grad():
        # The forward asks the node first whether its weights changed since it was frozen
        # (a checkpoint loaded), and keys it by the new ones if so.
        out = solo.forward(Opaque(tuple(args), TENSOR), store=store)
    if node._smz.state != self._state:
        self._state = node._smz.state
        self.owner.graph.memory.freeze(name, self._state)
    self.owner._noted(name, solo.record)
    return _placed(out, args[0].device if args else None)


_remember: Callable[..., Any] = torch.compiler.disable(_recall_or_run)  # type: ignore[no-untyped-call]
"""The one deliberate graph break per cached node: the store is asked outside compiled code."""


def _placed(value: Any, device: torch.device | None) -> Any:
    """``value`` on ``device`` (a recalled answer is memory of its own: the caller may write
    into it)."""
    if isinstance(value, torch.Tensor):
        return value.to(device) if device is not None else value
    if isinstance(value, tuple):
        return tuple(_placed(v, device) for v in value)
    if isinstance(value, list):
        return [_placed(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _placed(v, device) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------ the module


def adopt(host: nn.Module, module: nn.Module) -> None:
    """Registers ``module``'s children, parameters and buffers on ``host`` under their own
    names, so that ``host.state_dict()`` has ``module``'s keys and a checkpoint of one
    loads into the other."""
    for name, child in module.named_children():
        host.add_module(name, child)
    for name, param in module.named_parameters(recurse=False):
        host.register_parameter(name, param)
    for name, buffer in module.named_buffers(recurse=False):
        persistent = name not in module._non_persistent_buffers_set
        host.register_buffer(name, buffer, persistent=persistent)


class Wrapped(nn.Module):
    """A model whose declared submodules are somatize nodes; see the module docstring.

    ``graph`` is the somatize graph, ``store`` where cached answers live (may be
    reassigned), ``model`` the model it wraps (sharing every parameter).
    """

    graph: Graph
    store: Store | None
    model: nn.Module
    _runner: nn.Module

    def __init__(self, model: nn.Module, runner: nn.Module, graph: Graph, store: Any) -> None:
        super().__init__()
        adopt(self, model)
        self.train(model.training)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "store", Store.of(store))
        self.counts: dict[str, dict[str, int]] = {}
        """Per cached node, how many times each fact (``ran``, ``recalled``, ``kept``) happened."""
        signature = _signature_of(model)
        if signature is not None:
            forward = types.FunctionType(
                _forward.__code__, _forward.__globals__, "forward", None, _forward.__closure__
            )
            forward.__signature__ = signature  # type: ignore[attr-defined]
            object.__setattr__(self, "forward", types.MethodType(forward, self))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _forward(self, *args, **kwargs)

    def _check(self) -> None:
        settled(self.graph, self.graph.memory)

    def _noted(self, name: str, record: Record | None) -> None:
        if record is None:
            return
        count = self.counts.setdefault(name, {})
        for fact in record.facts:
            if fact.get("node") == name:
                count[fact["fact"]] = count.get(fact["fact"], 0) + 1
        # The graph's record keeps what the other declared nodes did last, and this one's
        # facts from its own run.
        previous = self.graph.record
        kept = (
            []
            if previous is None
            else [f for f in previous.facts if f.get("node") not in (None, name)]
        )
        self.graph.record = Record([*kept, *record.facts])

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Wrapped:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        # fx copied the references of attributes the code between declared nodes reads;
        # a conversion replaces buffers, so those copies are converted too.
        self._runner._apply(fn, recurse)  # type: ignore[no-untyped-call]
        return self

    def extra_repr(self) -> str:
        declared = [
            f"{name}[{', '.join(_marks(self.graph, name))}]"
            for name in self.graph.nodes()
            if isinstance(self.graph.node(name), ModuleNode)
        ]
        return f"somatize: {', '.join(declared) or 'nothing declared'}"


def _forward(self: Wrapped, *args: Any, **kwargs: Any) -> Any:
    if not torch.compiler.is_compiling():
        self._check()
    return self._runner(*args, **kwargs)


def _marks(graph: Graph, name: str) -> list[str]:
    out = []
    if graph.memory.is_frozen(name):
        out.append("frozen")
    if graph.memory.is_cached(name):
        out.append("cached")
    return out


def _signature_of(model: nn.Module) -> inspect.Signature | None:
    try:
        inner = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inner.replace(parameters=[this, *inner.parameters.values()])


# ------------------------------------------------------------------------------ declaring


def _names(what: Names, model: nn.Module, kind: str) -> dict[str, str | None]:
    """Declared qualified names → salt (None for none), checked against ``model``."""
    if what is True:
        return {"": None}
    if what is False or what is None:
        return {}
    if isinstance(what, str):
        found: dict[str, str | None] = {what: None}
    elif isinstance(what, Mapping):
        found = dict(what)
    else:
        found = dict.fromkeys(what)
    known = dict(model.named_modules())
    for name in found:
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


class _Tracer(fx.Tracer):
    """Keeps declared submodules and the standard ``torch.nn`` layers whole."""

    def __init__(self, leaves: Iterable[str]) -> None:
        super().__init__()
        self.leaves = frozenset(leaves)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.leaves or super().is_leaf_module(
            m, module_qualified_name
        )


_TORCH_DIR = os.path.dirname(torch.__file__)


def _traced(model: nn.Module, leaves: Iterable[str]) -> fx.GraphModule:
    tracer = _Tracer(leaves)
    try:
        graph = tracer.trace(model)
    except Exception as error:
        frames = [
            f
            for f in traceback.extract_tb(error.__traceback__)
            if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__
        ]
        where = (
            f" at {frames[-1].filename}:{frames[-1].lineno} (`{(frames[-1].line or '').strip()}`)"
            if frames
            else ""
        )
        raise Untraceable(
            f"torch.fx cannot trace `{type(model).__qualname__}.forward`{where}: "
            f"{type(error).__name__}: {error}. Declared submodules are never traced into, so "
            "declare the submodule that holds this code (`wrap(model, frozen=[...])`), make the "
            "call traceable (no Python control flow on tensor values), or wrap just the "
            "submodule you want to remember — `model.encoder = somatize.torch.wrap("
            "model.encoder, frozen=True, cached=True)` — which needs no tracing"
        ) from error
    return fx.GraphModule(model, graph, type(model).__name__)


def _describe_call(node: fx.Node) -> Any:
    """The constant part of a declared call, as a canonical value (tensors are inputs)."""

    def plain(value: Any) -> Any:
        if isinstance(value, fx.Node):
            return "<input>"
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    return {"args": plain(node.args), "kwargs": plain(node.kwargs)}


def wrap(
    model: nn.Module,
    *,
    frozen: Names = (),
    cached: Names = (),
    store: Store | str | os.PathLike[str] | None = None,
) -> Wrapped:
    """``model`` with its declared submodules as somatize nodes; see the module docstring.

    ``frozen`` and ``cached`` name submodules by qualified path (``"encoder"``,
    ``["backbone.stem", "encoder"]``); ``cached`` may map a name to a salt
    (``{"encoder": "v2"}``). ``True`` declares the model itself, which is then
    not traced: ``wrap(encoder, frozen=True, cached=True)`` works for any module.
    A cached submodule must be frozen too. ``store`` is a :class:`somatize.Store`
    or a directory; without one, nothing is kept.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"wrap takes an nn.Module, got a `{type(model).__name__}`")
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
    if "" in declared:
        return _whole(model, frozen_names, cached_names, store)

    gm = _traced(model, declared)
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
    for name in declared:
        if name not in calls:
            raise NotCalled(
                f"`{name}` is declared, and `{type(model).__qualname__}.forward` never calls it "
                "(it may be reached through a function fx cannot see into): nothing of it can "
                "be frozen or cached here. Drop it from the declarations, or call it in forward"
            )
    qualnames: dict[str, str] = {}
    runner = split_module(
        gm, model, lambda n: part[n], qualname_map=qualnames, keep_original_order=True
    )
    wrapped = Wrapped.__new__(Wrapped)
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
            module = model.get_submodule(target)
            node: Node = ModuleNode(
                module, spread=True, call=inner, declared=_describe_call(fx_node)
            ).named(name)
            if target in frozen_names:
                node.frozen()
            if target in cached_names:
                node.cached(cached_names[target])
                shim: nn.Module = _Cached(node, inner, wrapped)  # type: ignore[arg-type]
            else:
                shim = _Declared(node, inner)  # type: ignore[arg-type]
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
    graph = Graph.somatize(Expr(list(nodes.values()), edges, outputs or list(nodes.values())[-1:]))
    Wrapped.__init__(wrapped, model, runner, graph, store)
    return wrapped


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


def _whole(
    model: nn.Module,
    frozen_names: Mapping[str, str | None],
    cached_names: Mapping[str, str | None],
    store: Any,
) -> Wrapped:
    """The model itself as one declared node; nothing is traced."""
    name = _snake(type(model).__name__)
    node = ModuleNode(model, spread=True, declared={"args": "<inputs>"}).named(name)
    if "" in frozen_names:
        node.frozen()
    wrapped = Wrapped.__new__(Wrapped)
    call = _Bare(model)
    shim: nn.Module
    if "" in cached_names:
        node.cached(cached_names[""])
        shim = _Cached(node, call, wrapped)  # type: ignore[arg-type]
    else:
        shim = _Declared(node, call)  # type: ignore[arg-type]
    graph = Graph.somatize(node)
    Wrapped.__init__(wrapped, model, shim, graph, store)
    return wrapped


class _Bare(nn.Module):
    """Calls a module's forward (its hooks included) without registering it again."""

    model: nn.Module

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)

    def forward(self, *args: Any) -> Any:
        return self.model(*args)


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower() or "model"
