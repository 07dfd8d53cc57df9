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

**Parts replaced after wrapping.** fx segments hold references to the parts
they read. A submodule, parameter or buffer replaced since (``wrapped.head =
nn.Linear(...)``, ``load_state_dict(sd, assign=True)``) is seen when it is
assigned on the wrapped model, and before every eager forward, and the segments
are pointed at the new one. A declared submodule cannot be replaced — its node
holds the module it was declared with — so that is refused: wrap the model
again.

A cached node is asked of the store through the somatize engine, keyed by what
it is handed::

    key = H(identity, declaration, state digest, salt, H(content of its inputs))

Its inputs are weighed like an ``Opaque`` tensor batch — by content, dtype and
shape — so the same batch recalls the same answer, whatever came before it.
(One key per batch here; one key per row is :mod:`somatize_torch.rows`.) The
precision it runs in is part of the declaration it is keyed by whenever it is
not torch's default — autocast on the inputs' device type, the default dtype,
the float32 matmul precision — so an answer computed under
``torch.autocast(dtype=torch.bfloat16)`` is never recalled for a float32 call;
a call in the default precision keeps the key it always had.

What a recalled answer could not repeat is refused when the answer is computed,
before it is kept: an input that requires grad (a recalled answer is a leaf, so
what produced the input would train on misses and silently stop on hits), a
module that writes into its inputs in place (a recall would not write), an
answer the store cannot write back as what it is. A recalled answer comes back
as the same kind of value — a namedtuple as its class, a dict in its order — and
on the device it was computed on, as a computed one is.

**torch.compile.** The cache lookup is a deliberate graph break: the call into
the store runs under ``torch.compiler.disable``, once per cached node, and reads
nothing that changes from batch to batch, so ``torch.compile(wrapped)`` compiles
the segments around it once and does not recompile per batch. The checks made
before an eager forward (frozen parts settled, parts replaced) are not made by
compiled code; assigning on the wrapped model and loading a checkpoint into it
still point the segments at new parts.

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
from typing import Any, NamedTuple

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_leaves, tree_map

from somatize import CODECS, Graph, Node, Opaque, Store, Unsettled, canonical
from somatize.codecs import CodecError
from somatize.engine import Record
from somatize.errors import SomatizeError
from somatize.memory import settled
from somatize.node import Expr
from somatize.plan import declared_again
from somatize_torch.codec import TENSOR
from somatize_torch.digest import digest_tensor
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
    """A model cannot be wrapped as asked, or was changed since in a way its wrapping
    cannot follow."""


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

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling() and is_held(self.node.module):
            check_still(self.node._smz.name or "?", self.node.module)
        return self.call(*args, **kwargs)


Precision = tuple[tuple[str, str], ...] | None
"""The precision a cached call runs in, where it is not torch's default (None)."""


class _Cached(nn.Module):
    """Stands where a cached submodule is called: the store is asked through the
    somatize engine, outside any compiled region.

    It asks through a one-node graph of its own per precision the call runs in, each
    keyed by the declaration the owner's graph holds for the node (and the precision,
    where it is not the default): when ``freeze`` says the node anew (a setting or a
    hook changed), or its state changes, they are built again."""

    node: ModuleNode
    owner: Wrapped
    call: nn.Module

    def __init__(
        self,
        node: ModuleNode,
        call: nn.Module,
        owner: Wrapped,
        signature: inspect.Signature | None = None,
    ) -> None:
        super().__init__()
        self.call = call
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "owner", owner)
        self._signature = signature
        self._solos: dict[Precision, Graph] = {}
        self._basis: tuple[str | None, str | None] = (None, None)
        """The declaration and state the graphs in ``_solos`` were built for."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _remember(self, *args, **kwargs)

    def bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``args`` and ``kwargs`` as the arguments in the order of the module's signature:
        a call keyed the same whether an argument is given by position or by name."""
        name = self.node._smz.name or "?"
        given = ", ".join(f"`{k}`" for k in kwargs)
        if self._signature is None:
            raise TypeError(
                f"`{name}` is cached and was called with {given} by name, and its signature "
                "cannot be read to put them in order: it is keyed by the tensors it is handed, "
                "in order. Pass them by position"
            )
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as why:
            raise TypeError(f"`{name}` {why}") from None
        if bound.kwargs:
            left = ", ".join(f"`{k}`" for k in bound.kwargs)
            raise TypeError(
                f"`{name}` is cached, and is keyed by the tensors it is handed in the order of "
                f"its signature; {left} has no place in that order (an argument before it is "
                "not given, or it is keyword-only). Give every argument before it too, or "
                "drop the module from `cached=`"
            )
        return bound.args

    def trimmed(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` without the trailing ones that are their parameter's default itself
        (``mask=None`` given): the call is the same without them, and keyed alike."""
        if self._signature is None:
            return args
        params = list(self._signature.parameters.values())
        end = len(args)
        while end and end <= len(params) and args[end - 1] is params[end - 1].default:
            end -= 1
        return args[:end]


class _Watched:
    """What a cached node runs on a miss: the submodule, and then a refusal of what a
    recalled answer could not repeat, before the answer is kept — a write into an input
    (a recall would not write it), an answer the store cannot give back as it is."""

    def __init__(self, name: str, call: Callable[..., Any]) -> None:
        self.name = name
        self.call = call

    def __call__(self, *args: torch.Tensor) -> Any:
        # An inference tensor keeps no version counter: its content is weighed instead,
        # before and after (on a miss only, which computes anyway).
        versions = [digest_tensor(a) if a.is_inference() else a._version for a in args]
        out = self.call(*args)
        for index, (value, version) in enumerate(zip(args, versions, strict=True)):
            now = digest_tensor(value) if value.is_inference() else value._version
            if now != version:
                raise WrapError(
                    f"`{self.name}` is cached, and it wrote into argument {index} it was "
                    "handed, in place: a recalled answer would not repeat the write, so what "
                    "reads that argument after it would see it changed when the answer is "
                    "computed and unchanged when it is recalled. Make the submodule work on a "
                    "copy (`x = x.clone()` before writing into it, or an out-of-place op), or "
                    "drop it from `cached=`"
                )
        try:
            CODECS.for_value(out)
        except CodecError:
            why = TENSOR.refusal(out) or f"it is a `{type(out).__qualname__}`"
            raise CodecError(
                f"`{self.name}` is cached, and its answer cannot be kept: {why}. The store "
                "gives back exactly what was computed, and writes tensors and None, nested in "
                "tuples, lists, str-keyed dicts, OrderedDicts and namedtuples defined at "
                "module level (or canonical values: numbers, strings and containers of "
                "them). Return those — make the item a tensor, or leave it out — or drop the "
                "submodule from `cached=`"
            ) from None
        return _unshared(out)


def _unshared(out: Any) -> Any:
    """``out`` with no two tensors sharing memory (``(h, h[:, 0])``): a recalled answer's
    tensors are each their own, so a computed one's are made so too, and a write into one
    changes the other neither on a miss nor on a hit."""
    leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if len(leaves) < 2:
        return out
    storages = [t.untyped_storage().data_ptr() for t in leaves]
    if len(set(storages)) == len(storages):
        return out
    seen: set[int] = set()

    def own(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        where = t.untyped_storage().data_ptr()
        if where in seen:
            return t.clone()
        seen.add(where)
        return t

    return tree_map(own, out)


def _recall_or_run(self: _Cached, *args: Any, **kwargs: Any) -> Any:
    """The cached call: refuse what cannot be keyed, then ask the engine."""
    node = self.node
    name = node._smz.name or "?"
    store = self.owner.store
    if store is None:
        return self.call(*args, **kwargs)
    if kwargs:
        args = self.bound(args, kwargs)
    args = self.trimmed(args)
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
    # Asked here too, since under torch.compile the wrapped forward's own look is compiled
    # away: a declared submodule replaced on the model is refused before it is keyed.
    self.owner._follow()
    memory = self.owner.graph.memory
    # Weights changed since the node was frozen (a checkpoint loaded, a part replaced): it
    # is keyed by its new state and what it declares now, said to the owner's graph here
    # so that the graphs below are built for them.
    if node.restate() is not None:
        memory.freeze(name, node._smz.state)
        declared_again(memory, name, node)
    basis = (memory.declaration_of(name), node._smz.state)
    if basis != self._basis:
        self._solos.clear()
        self._basis = basis
    precision = _precision(args)
    solo = self._solos.get(precision)
    if solo is None:
        solo = self._solos[precision] = _solo(node, name, basis[0], precision)
    with torch.no_grad():
        out = solo.forward(Opaque(tuple(args), TENSOR), store=store)
    self.owner._noted(name, solo.record)
    return _placed(out, args[0].device) if args else out


def _placed(out: Any, device: torch.device) -> Any:
    """``out`` with its tensors on ``device``, the first input's: where a recalled answer
    lies follows where the call is made, not where it was kept (a store filled on one
    GPU, or on the host, serves a model on another), and a computed one is put there too,
    so that a miss and a hit answer alike."""
    if isinstance(out, torch.Tensor):  # the usual answer, without walking a tree
        return out if out.device == device else out.to(device)
    leaves = tree_leaves(out)
    if all(not isinstance(t, torch.Tensor) or t.device == device for t in leaves):
        return out
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, out)


_remember: Callable[..., Any] = torch.compiler.disable(_recall_or_run)  # type: ignore[no-untyped-call]
"""The one deliberate graph break per cached node: the store is asked outside compiled code."""


def _precision(args: Sequence[torch.Tensor]) -> Precision:
    """The precision a call on ``args`` runs in, named only where it is not torch's default:
    autocast on the first argument's device type, the dtype tensors made in the forward
    get, and how float32 products are computed (TF32) — so the usual key does not change."""
    device = args[0].device.type if args else "cpu"
    said: list[tuple[str, str]] = []
    if torch.is_autocast_enabled(device):
        said.append(("autocast", _dtype_name(torch.get_autocast_dtype(device))))
    made = torch.get_default_dtype()
    if made != torch.float32:
        said.append(("default", _dtype_name(made)))
    matmul = torch.get_float32_matmul_precision()
    if device == "cuda" and not torch.backends.cudnn.allow_tf32:
        matmul = f"{matmul}, cudnn without tf32"
    if matmul != "highest":
        said.append(("matmul", matmul))
    return tuple(said) or None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _solo(node: ModuleNode, name: str, declaration: str | None, precision: Precision) -> Graph:
    """The one-node graph a cached call of ``node`` is asked through: keyed by
    ``declaration`` (the owner graph's), and by the precision too, where it is not the
    default."""
    solo = Graph.somatize(node)
    # The cached call asks the node whether its state changed before each lookup, and
    # says what changed to the owner's graph; the one-node graph need not ask again.
    solo._restated.clear()
    if declaration is not None:
        said = (
            declaration
            if precision is None
            else canonical.hex_of(
                {"declaration": declaration, "precision": dict(precision)},
                b"somatize/declaration\0",
            )
        )
        if solo.memory.declaration_of(name) != said:
            solo.memory.declared_as(name, said)
    return solo


# ------------------------------------------------------------------------------ parts


_MISSING: Any = object()


class _Read(NamedTuple):
    """A part of the model fx code holds by reference: ``holder.field`` is the model's
    ``path``."""

    holder: nn.Module
    field: str
    path: str


class _Parts:
    """The parts of the model the fx segments hold by reference, kept pointing at what the
    model holds now, and the declared submodules, which cannot be replaced.

    Whether any changed is asked cheaply — each table entry on the way to each part is
    looked at by identity — and only then is each looked up and re-pointed."""

    def __init__(self, reads: Sequence[_Read], declared: Mapping[str, ModuleNode]) -> None:
        self.reads = list(reads)
        self.declared = dict(declared)
        """Declared submodules by path in the model (none when the model itself is)."""
        self.tops = frozenset(path.split(".")[0] for path in declared)
        self._tables: list[dict[str, Any]] = []
        self._keys: list[str] = []
        self._values: list[Any] = []

    def watch(self, model: nn.Module) -> None:
        """Notes the table entries on the way to every part, as they are now."""
        seen: dict[tuple[int, str], tuple[dict[str, Any], Any]] = {}
        for path in [*self.declared, *(read.path for read in self.reads)]:
            owner: Any = model
            for atom in path.split("."):
                table = _table_of(owner, atom)
                if table is None:  # a plain attribute: a constant of the traced code
                    break
                owner = table[atom]
                seen[(id(table), atom)] = (table, owner)
        self._tables = [table for table, _ in seen.values()]
        self._keys = [key for _, key in seen]
        self._values = [value for _, value in seen.values()]

    def changed(self) -> bool:
        """Whether an entry on the way to a part holds another object than it did."""
        return not all(map(operator.is_, map(dict.get, self._tables, self._keys), self._values))

    def refuse(self, model: nn.Module, name: str, value: Any) -> None:
        """Refuses putting ``value`` in the model as ``name`` where that replaces a declared
        submodule (or what holds one) with another object."""
        for path, node in self.declared.items():
            if path.split(".")[0] == name and _part(model, name) is not value:
                raise _replaced(path, node)

    def follow(self, model: nn.Module) -> None:
        """Points every segment at the part the model holds now; WrapError when a declared
        submodule was replaced, or a part the code reads is gone."""
        for path, node in self.declared.items():
            if _part(model, path) is not node.module:
                raise _replaced(path, node)
        for read in self.reads:
            now = _part(model, read.path)
            if now is _MISSING:
                raise WrapError(
                    f"`{read.path}` was removed from the model after `wrap`, and the model's "
                    "forward reads it (fx traced the read into its code): there is nothing to "
                    "run in its place. Put it back, or wrap the model again"
                )
            if getattr(read.holder, read.field, _MISSING) is not now:
                _put(read.holder, read.field, now)
        self.watch(model)


def _replaced(path: str, node: ModuleNode) -> WrapError:
    kind = type(node.module).__qualname__
    return WrapError(
        f"`{path}` is declared (frozen or cached), and was replaced after `wrap`: its node "
        f"holds the `{kind}` it was declared with, which would go on running and be keyed "
        "in place of the new one. Wrap the model again after replacing a declared "
        "submodule (`somatize.torch.wrap(model, ...)`, then `freeze`), or load new weights "
        "into it instead (`load_state_dict`)"
    )


def _table_of(owner: Any, atom: str) -> dict[str, Any] | None:
    """The table of ``owner`` (a module) that registers ``atom``, or None."""
    if not isinstance(owner, nn.Module):
        return None
    for table in (owner._parameters, owner._buffers, owner._modules):
        if atom in table:
            return table
    # A tensor kept as a plain attribute (`self.scale = torch.ones(4)`), which fx reads
    # as a constant of the code by reference: replaced, the segments follow it too.
    if isinstance(owner.__dict__.get(atom), torch.Tensor):
        return owner.__dict__
    return None


def _part(model: nn.Module, path: str) -> Any:
    """What ``model`` holds at dotted ``path``, or ``_MISSING``."""
    found: Any = model
    for atom in path.split("."):
        found = getattr(found, atom, _MISSING)
        if found is _MISSING:
            break
    return found


def _put(holder: nn.Module, field: str, value: Any) -> None:
    """Puts ``value`` in ``holder`` as ``field``, in the table its kind goes in."""
    for table in (holder._parameters, holder._buffers, holder._modules, holder.__dict__):
        table.pop(field, None)
    if isinstance(value, nn.Module):
        holder._modules[field] = value
    elif isinstance(value, nn.Parameter):
        holder._parameters[field] = value
    elif isinstance(value, torch.Tensor):
        holder._buffers[field] = value
    else:
        object.__setattr__(holder, field, value)


# ------------------------------------------------------------------------------ the module


_TABLES = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules")


class Wrapped(nn.Module):
    """A model whose declared submodules are somatize nodes; see the module docstring.

    ``graph`` is the somatize graph, ``store`` where cached answers live (may be
    reassigned), ``model`` the model it wraps: it holds the model's own tables of
    children, parameters and buffers, so a part replaced on either is replaced on both.
    """

    graph: Graph
    store: Store | None
    model: nn.Module
    _in_train: nn.Module | None
    _in_eval: nn.Module | None
    _untraced: Untraceable | None
    _parts: _Parts
    _through: tuple[str, ...] = ("",)
    """The modules traced into, by path: their training flags pick the code that runs."""

    def __init__(
        self,
        model: nn.Module,
        runners: Mapping[bool, nn.Module | Untraceable],
        graph: Graph,
        store: Any,
        parts: _Parts,
    ) -> None:
        super().__init__()
        for table in _TABLES:
            self.__dict__[table] = model.__dict__[table]
        object.__setattr__(self, "training", model.training)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "store", Store.of(store))
        object.__setattr__(self, "_parts", parts)
        for mode, attribute in ((True, "_in_train"), (False, "_in_eval")):
            runner = runners[mode]
            object.__setattr__(self, attribute, runner if isinstance(runner, nn.Module) else None)
        untraced = [r for r in runners.values() if isinstance(r, Untraceable)]
        object.__setattr__(self, "_untraced", untraced[0] if untraced else None)
        parts.watch(model)
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

    @property
    def _runner(self) -> nn.Module | None:
        """What runs the model in the mode it is in now."""
        return self._in_train if self._mode() else self._in_eval

    def _mode(self) -> bool:
        """The mode the code traced into runs in: the training flags of the modules whose
        forward was traced — the model's own, put in a mode directly (``model.eval()``),
        not only through this wrapper. Where the code of the two modes differs, those
        modules must agree: code traced in one mode would run for a part in the other."""
        if self._in_train is self._in_eval:
            return bool(self.model.training)
        found = [(p, _part(self.model, p) if p else self.model) for p in self._through]
        modes = {p: bool(m.training) for p, m in found if isinstance(m, nn.Module)}
        if len(set(modes.values())) <= 1:
            return next(iter(modes.values()), bool(self.model.training))
        shown = ", ".join(
            f"`{p or 'the model itself'}` in {'train' if t else 'eval'}"
            for p, t in list(modes.items())[:6]
        )
        raise WrapError(
            "the code fx traced reads `self.training`, and the modules it traced into are in "
            f"different modes ({shown}): what was traced for one mode would run for a part "
            "in the other. Put them in one mode (`model.train()` or `model.eval()`), or "
            "declare the part that stays in another mode, so it is called whole and reads "
            "its own mode as it runs"
        )

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
        super().__setattr__(name, value)
        if isinstance(value, (nn.Module, torch.Tensor)):
            self._follow()

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

    def _follow(self) -> None:
        """Points the fx segments at the parts the model holds now, if any was replaced."""
        parts: _Parts | None = self.__dict__.get("_parts")
        if parts is not None and parts.changed():
            parts.follow(self.model)

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
        # a conversion replaces buffers, so those copies are converted too, and the
        # segments then pointed at the model's own.
        runners = {id(r): r for r in (self._in_train, self._in_eval) if r is not None}
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


def _forward(self: Wrapped, *args: Any, **kwargs: Any) -> Any:
    if not torch.compiler.is_compiling():
        self._follow()
        self._check()
    training = self._mode()
    runner = self._in_train if training else self._in_eval
    if runner is None:
        mode, other = ("train", "eval") if training else ("eval", "train")
        raise WrapError(
            f"this model was wrapped in {other} mode and is run in {mode} mode, and fx could "
            f"trace its forward in {other} mode only: what it traced may not be what the "
            f"forward does in {mode} mode (code that reads `self.training`), so it is not run "
            f"in its place. Run it in {other} mode, or make it traceable in {mode} mode as "
            f"well. {self._untraced}"
        )
    return runner(*args, **kwargs)


def _marks(graph: Graph, name: str) -> list[str]:
    out = []
    if graph.memory.is_frozen(name):
        out.append("frozen")
    if graph.memory.is_cached(name):
        out.append("cached")
    return out


def _signature_of(model: nn.Module) -> inspect.Signature | None:
    inner = _own_signature(model)
    if inner is None:
        return None
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inner.replace(parameters=[this, *inner.parameters.values()])


def _own_signature(model: nn.Module) -> inspect.Signature | None:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


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
        self.through: set[str] = {""}
        """The modules whose forward was traced into (the model's own, ``""``, included):
        what they read of ``self.training`` is in the code."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.leaves or super().is_leaf_module(
            m, module_qualified_name
        )

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        try:
            name = self.path_of_module(m)
        except NameError:  # not part of the model: fx says so itself
            name = None
        if name is not None and not self.is_leaf_module(m, name):
            self.through.add(name)
        return super().call_module(m, forward, args, kwargs)


_TORCH_DIR = os.path.dirname(torch.__file__)


def _traced(
    model: nn.Module, leaves: Iterable[str], training: bool
) -> tuple[fx.GraphModule, set[str]]:
    """``model``'s forward traced with every module's training flag set to ``training``
    (and put back after): what it reads of ``self.training`` is baked into the code. With
    the modules traced into."""
    modes = [(module, module.training) for module in model.modules()]
    tracer = _Tracer(leaves)
    try:
        for module, _ in modes:
            object.__setattr__(module, "training", training)
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
        mode = "train" if training else "eval"
        raise Untraceable(
            f"torch.fx cannot trace `{type(model).__qualname__}.forward` in {mode} mode{where}: "
            f"{type(error).__name__}: {error}. Declared submodules are never traced into, so "
            "declare the submodule that holds this code (`wrap(model, frozen=[...])`), make the "
            "call traceable (no Python control flow on tensor values), or wrap just the "
            "submodule you want to remember — `model.encoder = somatize.torch.wrap("
            "model.encoder, frozen=True, cached=True)` — which needs no tracing"
        ) from error
    finally:
        for module, was in modes:
            object.__setattr__(module, "training", was)
    return fx.GraphModule(model, graph, type(model).__name__), tracer.through


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

    wrapped = Wrapped.__new__(Wrapped)
    mode = model.training
    traced, through = _traced(model, declared, mode)
    first = _split(traced, model, frozen_names, cached_names, wrapped, None)
    for name in declared:
        if name not in first.targets:
            raise NotCalled(
                f"`{name}` is declared, and `{type(model).__qualname__}.forward` never calls it "
                "(it may be reached through a function fx cannot see into): nothing of it can "
                "be frozen or cached here. Drop it from the declarations, or call it in forward"
            )
    runners: dict[bool, nn.Module | Untraceable] = {mode: first.runner, not mode: first.runner}
    reads = list(first.reads)
    try:
        other, also = _traced(model, declared, not mode)
        through |= also
    except Untraceable as error:
        runners[not mode] = error
    else:
        if other.code != traced.code:
            second = _split(other, model, frozen_names, cached_names, wrapped, first.shims)
            if second.calls != first.calls:
                raise WrapError(
                    f"`{type(model).__qualname__}.forward` calls its declared submodules "
                    f"differently in train and eval mode ({_calls(first.calls)} in "
                    f"{'train' if mode else 'eval'} mode, {_calls(second.calls)} in the "
                    "other, or with other constant arguments): one graph cannot describe "
                    "both. Declare the submodule that "
                    "holds the code that reads `self.training`, or call the declared "
                    "submodules the same way in both modes"
                )
            runners[not mode] = second.runner
            reads += second.reads
    graph = Graph.somatize(Expr(list(first.nodes.values()), first.edges, first.outputs))
    parts = _Parts(reads, first.targets)
    Wrapped.__init__(wrapped, model, runners, graph, store, parts)
    object.__setattr__(wrapped, "_through", tuple(sorted(through)))
    return wrapped


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
    shims: dict[str, _Cached | _Declared]
    """What stands where each declared call was, by its node's name."""
    reads: list[_Read]


def _split(
    gm: fx.GraphModule,
    model: nn.Module,
    frozen_names: Mapping[str, str | None],
    cached_names: Mapping[str, str | None],
    wrapped: Wrapped,
    shims: Mapping[str, _Cached | _Declared] | None,
) -> _Split:
    """``gm`` cut at the declared submodules, ``split_module``-style. With ``shims`` (those
    of the same model traced in the other mode), each declared call is given the shim of
    the same name, so one node stands for it in both."""
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
    reads = _reads(gm, runner, qualnames, model, set(calls))
    made: dict[str, _Cached | _Declared] = {}
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
            described = _describe_call(fx_node)
            said.append((name, described))
            shim = shims.get(name) if shims is not None else None
            if shim is None:
                shim = _shim(
                    name,
                    model.get_submodule(target),
                    inner,
                    described,
                    wrapped,
                    frozen=target in frozen_names,
                    cached=(cached_names[target],) if target in cached_names else None,
                )
            node: Node = shim.node
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
        runner, nodes, edges, outputs or list(nodes.values())[-1:], said, targets, made, reads
    )


def _shim(
    name: str,
    module: nn.Module,
    inner: nn.Module,
    described: Any,
    wrapped: Wrapped,
    *,
    frozen: bool,
    cached: tuple[str | None] | None,
) -> _Cached | _Declared:
    """What stands where ``module`` is called as node ``name``: its node, frozen, and cached
    with the salt in ``cached`` when that is given."""
    node = ModuleNode(
        module,
        spread=True,
        call=inner if cached is None else _Watched(name, inner),
        declared=described,
    )
    node.named(name)
    if frozen:
        node.frozen()
    if cached is None:
        return _Declared(node, inner)
    node.cached(cached[0])
    return _Cached(node, inner, wrapped)


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


def _whole(
    model: nn.Module,
    frozen_names: Mapping[str, str | None],
    cached_names: Mapping[str, str | None],
    store: Any,
) -> Wrapped:
    """The model itself as one declared node; nothing is traced."""
    name = _snake(type(model).__name__)
    cached = "" in cached_names
    node = ModuleNode(
        model,
        spread=True,
        call=_Watched(name, model) if cached else None,
        declared={"args": "<inputs>"},
    )
    node.named(name)
    if "" in frozen_names:
        node.frozen()
    wrapped = Wrapped.__new__(Wrapped)
    call = _Bare(model)
    shim: nn.Module
    if cached:
        node.cached(cached_names[""])
        shim = _Cached(node, call, wrapped, _own_signature(model))
    else:
        shim = _Declared(node, call)
    graph = Graph.somatize(node)
    Wrapped.__init__(wrapped, model, {True: shim, False: shim}, graph, store, _Parts([], {}))
    return wrapped


class _Bare(nn.Module):
    """Calls a module's forward (its hooks included) without registering it again."""

    model: nn.Module

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def _snake(name: str) -> str:
    import re

    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower() or "model"
