"""The call of one declared submodule, in the model partitioned at it.

Where the traced code called a declared submodule, a shim stands in the partitioned
model and holds its node: :class:`_Declared` for a frozen one, which puts back in eval
what was set training and calls it, and :class:`_Cached` for a cached one.

A cached node is asked of the store through the somatize engine, keyed by what
it is handed (tensors, and None for an optional argument not given, where it stands)::

    key = H(identity, declaration, state digest, salt, H(content of its inputs))

Its inputs are weighed like an ``Opaque`` tensor batch — by content, dtype and
shape — so the same batch recalls the same answer, whatever came before it. An input
laid out in memory in another order of its dims than C order (channels_last, a
transpose) keys the call by that order too: a kernel picks its path by it (a conv fed
channels_last answers channels_last, and may round otherwise), so the answer kept for a
batch in one layout is not recalled for the same batch in another.
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
as the same kind of value — a namedtuple, a dataclass (Hugging Face's ``ModelOutput``)
or a ``torch.return_types`` structseq as its class, a dict in its order — and
on the device it was computed on, as a computed one is.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from somatize import CODECS, Graph, Opaque, canonical
from somatize.catalog._members import standard_module
from somatize.codecs import CodecError
from somatize.engine import NodeFailed, Record
from somatize.errors import SomatizeError
from somatize.plan import declared_again
from somatize_torch._codec_tree import built_with, tree_of
from somatize_torch._errors import (
    EXPORT,
    JIT_TRACE,
    CachedInputNeedsGrad,
    WrapError,
    exporting,
    gradient_cut,
    in_a_transform,
    jit_tracing,
    traced_by,
    transforming,
)
from somatize_torch._modes import marked_as_needed, outside_compiled
from somatize_torch._precision import precision_on
from somatize_torch._settings import _TORCH_OWN, _held_by, _slots_of
from somatize_torch._values import _NAMESPACES, _NOT_FOLLOWED, _followed
from somatize_torch.codec import TENSOR, memory_order
from somatize_torch.digest import DTYPES, digest_tensor, plain
from somatize_torch.freeze import (
    ModuleNode,
    check_still,
    drew_as_it_ran,
    drew_at_random,
    few,
    generator_states,
    held_for_call,
    is_held,
    keep_held,
    trained_since_released,
)

if TYPE_CHECKING:
    from somatize import Store
    from somatize_torch.wrap import Wrapped


class _Declared(nn.Module):
    """Stands where a declared submodule is called in the partitioned model."""

    node: ModuleNode
    call: nn.Module
    owner: Wrapped

    def __init__(self, node: ModuleNode, call: nn.Module, owner: Wrapped) -> None:
        super().__init__()
        self.call = call
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "owner", owner)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.node.module
        if not torch.compiler.is_compiling():
            _kept_frozen(self)
        elif any(part.training for part in module.modules()) and (
            is_held(module)
            or (
                self.node._watch is not None
                and not any(parameter.requires_grad for parameter in module.parameters())
            )
        ):
            # Compiled code asks only for the parts' training flags and whether the
            # parameters require grad, which torch.compile guards on (no graph break): a
            # part put in train mode has the call compiled anew, and it is looked at
            # eagerly, before it runs.
            _kept_frozen_eagerly(self)
        return self.call(*args, **kwargs)


def _kept_frozen(self: _Declared) -> None:
    """Before a frozen part of a wrapped model that is not cached runs: held, a part of it
    put in train mode is warned of and put back in eval. Nothing is recalled or kept for
    its call, nor keyed by its answer: released since it was frozen, it runs in the mode
    its user left it in (``update_bn`` re-estimating its BatchNorm in train mode), until
    it trained and its gradients are off again (:func:`trained_since_released`): it is
    then frozen again, held in eval and digested anew."""
    node = self.node
    module = node.module
    name = node._smz.name or "?"
    if is_held(module):
        check_still(name, module)
    elif node._watch is not None and trained_since_released(module):
        _restated(self.owner, name, node)
        keep_held(name, module)  # trained to the weights it was frozen at: held all the same


Precision = tuple[tuple[str, str], ...] | None
"""The precision a cached call runs in, where it is not torch's default (None)."""
Layouts = tuple[tuple[int, ...] | None, ...] | None
"""The order of the dims in memory of each input of a call, where one is not in C order
(None where every one is)."""


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
    base: _Cached | None
    """The first trace's shim of the same node, where this one makes another call of it:
    its node's state and declaration are this one's."""

    def __init__(
        self,
        node: ModuleNode,
        call: nn.Module,
        owner: Wrapped,
        signature: inspect.Signature | None = None,
        *,
        base: _Cached | None = None,
        made: Any = None,
    ) -> None:
        super().__init__()
        self.call = call
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "base", base)
        self.made = made
        """The call this shim makes, where it is not its base's (a trace per value handing
        the submodule other constants): keyed by it beside the base node's declaration."""
        self._signature = signature
        self._solos: dict[tuple[Precision, Layouts], Graph] = {}
        self._basis: tuple[str | None, str | None] = (None, None)
        """The declaration and state the graphs in ``_solos`` were built for."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if exporting():  # before the call kept out of compiled code, which export cannot make
            raise traced(self.node._smz.name or "?", EXPORT)
        return marked_as_needed(_remember)(self, *args, **kwargs)

    def bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``args`` and ``kwargs`` as the arguments in the order of the module's signature:
        a call keyed the same whether an argument is given by position or by name, one
        whose default is None left out before one given by name as None."""
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
        if not bound.kwargs:
            return bound.args
        # An optional argument left out before one given by name (`w(x, scale=s)` of
        # `forward(x, mask=None, scale=None)`) is handed as its default, None, as it would
        # be: the call is `w(x, None, s)`.
        arguments = bound.arguments
        ordered: list[Any] = []
        for param in self._signature.parameters.values():
            if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                break
            if param.name in arguments:
                ordered.append(arguments[param.name])
            elif param.default is None:
                ordered.append(None)
            else:
                break
        placed = {p for p, _ in zip(self._signature.parameters, ordered, strict=False)}
        left = [k for k in arguments if k not in placed]
        if left:
            said = ", ".join(f"`{k}`" for k in left)
            raise TypeError(
                f"`{name}` is cached, and is keyed by the tensors it is handed in the order of "
                f"its signature; {said} has no place in that order (an argument before it is "
                "not given and has a default other than None, or it is keyword-only). Give "
                "every argument before it too, or drop the module from `cached=`"
            )
        return tuple(ordered)

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
    or into the module's own parameters, buffers and tensors it keeps (a recall would not
    write it), a draw from torch's random number generator (a recall would repeat one
    draw), an answer the store cannot give back as it is — and the answer made its own
    memory, as a recalled one is."""

    def __init__(self, name: str, call: Callable[..., Any], module: nn.Module) -> None:
        self.name = name
        self.call = call
        self.module = module
        self.node: ModuleNode | None = None  # the node running it, once made

    def __call__(self, *args: torch.Tensor | None) -> Any:
        # An inference tensor keeps no version counter: its content is weighed instead,
        # before and after (on a miss only, which computes anyway).
        versions = [_version(a) for a in args]
        kept = _kept_versions(self.module)
        generators = generator_states(self.module, args)
        out = self.call(*args)
        written = [name for name, t, version in kept if t._version != version]
        if written:
            raise WrapError(
                f"`{self.name}` is cached, and it wrote into {few(written)}, of its own "
                "parameters, buffers and tensors it keeps, in place as it ran: a recalled "
                "answer would not repeat the write, so the module would hold other values, and "
                "answer the next call otherwise, when an answer is computed than when it is "
                "recalled (in another process filling from the same store too). Make its "
                "forward leave them as they are (a BatchNorm in eval mode does; a table it "
                "fills as it first runs can be made anew, `self.table = ...`, rather than "
                "written into), or drop it from `cached=`"
            )
        still = self.node.kept_as_keyed if self.node is not None else lambda: False
        if drew_as_it_ran(self.module, args, generators, lambda copy: self.call(*copy), still):
            raise WrapError(
                drew_at_random(
                    f"`{self.name}` is cached", "its answer", "the submodule from `cached=`"
                )
            )
        for index, (value, version) in enumerate(zip(args, versions, strict=True)):
            if _version(value) != version:
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
                "tuples, lists, str-keyed dicts, OrderedDicts, and namedtuples and dataclasses "
                "(a `ModelOutput`) defined at module level (or canonical values: numbers, "
                "strings and containers of them). Return those — make the item a tensor, or "
                "leave it out — or drop the submodule from `cached=`"
            ) from None
        return _unshared(out, [a for a in args if a is not None], self.module)


def _kept_versions(module: nn.Module) -> list[tuple[str, torch.Tensor, int]]:
    """Each parameter and buffer of ``module``, and each tensor it or a part of it keeps
    beside them (``self.table``, alone or in lists, tuples, sets, dicts and configs: see
    :func:`_kept_tensors`), by name, with its version counter; but inference tensors,
    which keep none (and which freezing refuses as state)."""
    named: list[tuple[str, torch.Tensor]] = [
        *module.named_parameters(),
        *module.named_buffers(),
    ]
    for prefix, part in module.named_modules():
        for name, kept in vars(part).items():
            if name not in _TORCH_OWN:
                where = f"{prefix}.{name}" if prefix else name
                named.extend((where, t) for t in _kept_tensors(kept))
    return [(name, t, t._version) for name, t in named if not t.is_inference()]


def _version(value: torch.Tensor | None) -> Any:
    """What changes when ``value`` is written in place: its version counter, or for an
    inference tensor, which keeps none, its digest; None for an argument not given."""
    if value is None:
        return None
    return digest_tensor(value) if value.is_inference() else value._version


def _unshared(out: Any, args: Sequence[torch.Tensor], module: nn.Module) -> Any:
    """``out`` with each tensor in memory of its own: none shared with another
    (``(h, h[:, 0])``), with an argument (an answer that is its input, or a view of it:
    ``x.flatten(1)``) or with what the module holds: its parameters, buffers and tensors
    kept as plain attributes (``self.table``), alone or in lists, tuples, sets, dicts and
    configs (``self.config.table``), of it and its submodules. A recalled answer's
    tensors are each their own, so a computed one's are made so too (copied), and a write
    into one changes nothing else, neither on a miss nor on a hit. Asked on a miss only,
    which computes anyway. A tensor held elsewhere (a global) is not known here."""
    leaves = _tensors(out)
    if not leaves:
        return out
    held = {_memory(t) for t in args}
    held.update(map(_memory, module.parameters()))
    held.update(map(_memory, module.buffers()))
    held.update(
        _memory(value)
        for part in module.modules()
        for kept in vars(part).values()
        for value in _kept_tensors(kept)
    )
    held.discard(0)
    wheres = [_memory(t) for t in leaves]
    if len(set(wheres)) == len(wheres) and held.isdisjoint(wheres):
        return out
    seen = held

    def own(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        where = _memory(t)
        if where in seen:
            return t.clone()
        if where:
            seen.add(where)
        return t

    return _mapped(own, out)


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of answer ``out``, in every container the codec keeps: a dataclass
    (Hugging Face's ``ModelOutput``) too, which torch's pytree does not go into."""
    tree = tree_of(out)
    if tree is not None:
        return tree[1]
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _mapped(change: Callable[[torch.Tensor], torch.Tensor], out: Any) -> Any:
    """Answer ``out`` with each of its tensors (:func:`_tensors`) changed by ``change``: one
    the codec keeps is made again as a recall makes it, so a computed answer and a
    recalled one are alike: the answer walked once, its shape built again."""
    tree = tree_of(out)
    if tree is not None:
        shape, kept = tree
        return built_with(shape, [change(t) for t in kept])
    return tree_map(lambda t: change(t) if isinstance(t, torch.Tensor) else t, out)


_CONTAINERS = (list, tuple, set, frozenset)
_HOLDING = (torch.Tensor, dict, *_CONTAINERS)


def _kept_tensors(value: Any, depth: int = 4) -> list[torch.Tensor]:
    """The tensors ``value``, kept as an attribute, is or holds in lists, tuples, sets,
    dicts and plain objects held as configs (``self.tables = [t]``, ``self.cache = {"cos":
    t}``, ``self.config.table``, a dataclass's field), ``depth`` levels deep: the module's
    memory as much as a tensor kept alone is. Gone over level by level, and no further
    than a level none of whose kinds holds one: on a miss, a 50,000-word vocabulary kept
    beside costs one or two ms, 50,000 lists of two numbers some seven."""
    found: list[torch.Tensor] = []
    level = [value]
    for _ in range(depth + 1):
        kinds = set(map(type, level))
        configs = {kind for kind in kinds if _config_kind(kind)}
        if not configs and not any(issubclass(kind, _HOLDING) for kind in kinds):
            break
        if not configs and all(issubclass(kind, _CONTAINERS) for kind in kinds):
            level = list(itertools.chain.from_iterable(level))  # lists of lists, at once
            continue
        inner: list[Any] = []
        for item in level:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, _CONTAINERS):
                inner.extend(item)
            elif isinstance(item, dict):
                inner.extend(item.values())
            elif type(item) in configs and (_followed(item) or _slots_of(item)):
                inner.extend(_held_by(item).values())
        level = inner
    return found


def _config_kind(kind: type) -> bool:
    """Whether objects of ``kind`` may be plain objects held as configs (of a class written
    in Python, a ``SimpleNamespace``), asked once per kind, not per object: as the key
    follows them (:func:`~somatize_torch._values._followed` says of each)."""
    if issubclass(kind, _NAMESPACES):
        return True
    if issubclass(kind, (*_HOLDING, nn.Module, type)):
        return False
    home = kind.__module__.split(".")[0]
    return home not in _NOT_FOLLOWED and not standard_module(home)


def _memory(t: torch.Tensor) -> int:
    """Where a tensor's numbers live (its storage, whatever view of it the tensor is); 0
    for none (an empty tensor, one without a storage of its own)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def _recall_or_run(self: _Cached, *args: Any, **kwargs: Any) -> Any:
    """The cached call: refuse what cannot be keyed, then ask the engine."""
    node = self.node
    name = node._smz.name or "?"
    store = self.owner.store
    held = node if self.base is None else self.base.node
    if jit_tracing():
        # With a store or not: a trace keeps what this call runs for every later call, so
        # it would bake a recalled answer in, or leave the part declared cached uncached
        # for good, silently. (An export is refused so, in `forward`.)
        raise traced(name, JIT_TRACE)
    if store is None or all(a is None for a in (*args, *kwargs.values())):
        # Handed no tensor (every argument None, left so in the call), there is nothing
        # the answer is keyed by beside the node: it is computed, as the model computes it,
        # and nothing is kept (a part of a held module put in train mode is put back in
        # eval, as it warns; a released one runs in the mode its user left it in).
        if not torch.compiler.is_compiling() and is_held(held.module):
            check_still(name, held.module)
        return self.call(*args, **kwargs)
    if held._watch is None:
        return _keyed_call(self, name, store, args, kwargs)
    # Released since it was frozen, the module is held in eval for this call, whose answer
    # is recalled or kept, and let go of after it in the mode its user left it in.
    with held_for_call(name, held.module) as looked:
        return _keyed_call(self, name, store, args, kwargs, looked)


def _keyed_call(
    self: _Cached,
    name: str,
    store: Store,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    looked: bool = False,
) -> Any:
    """:func:`_recall_or_run` of a call keyed by the tensors it is handed (``looked``: the
    modes of the module's parts were looked at just now, by :func:`held_for_call`)."""
    node = self.node
    if kwargs:
        args = self.bound(args, kwargs)
    args = self.trimmed(args)
    for index, value in enumerate(args):
        if value is None:  # an optional argument not given: keyed as None, where it stands
            continue
        if not isinstance(value, torch.Tensor):
            raise _not_a_tensor(self, name, index, value)
        if torch._C._functorch.is_functorch_wrapped_tensor(value) or transforming():
            raise in_a_transform(
                f"`{name}` is cached and", f"argument {index}", "drop it from `cached=`"
            )
        if value.is_nested or value.layout is not torch.strided:
            kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
            raise TypeError(
                f"`{name}` is cached and is called with a {kind} tensor as argument {index}: "
                "a cached submodule is keyed by the bytes of the tensors it is handed, and "
                "only a dense tensor has one layout of them. Hand it a dense one "
                "(`x.to_dense()`; a nested one padded, `x.to_padded_tensor(0.0)`), or drop "
                "it from `cached=`"
            )
        if value.is_meta:
            raise TypeError(
                f"`{name}` is cached and is called with a tensor on the meta device as "
                f"argument {index}: a cached submodule is keyed by the content of the "
                "tensors it is handed, and a meta tensor holds none. Work out shapes with "
                "the model unwrapped, or drop the submodule from `cached=`"
            )
        if value.dtype not in DTYPES or value.is_quantized:
            raise CodecError(
                f"`{name}` is cached and is called with a {value.dtype} tensor as argument "
                f"{index}: a cached submodule is keyed by the bytes of the tensors it is "
                "handed, and no codec writes a tensor of that dtype (a quantized, sub-byte "
                "or bit-packed one), so it cannot be keyed. Convert it to a dtype of whole "
                "bytes (`x.dequantize()`; a packed one viewed as bytes, "
                "`x.view(torch.uint8)`), or drop the submodule from `cached=`"
            )
        cut = gradient_cut(value)
        if cut:
            raise CachedInputNeedsGrad(
                f"`{name}` is cached and argument {index} it is handed {cut}: a recalled "
                "answer is a leaf, so whatever produced that argument would train when the "
                "answer is computed and silently stop when it is recalled. Freeze what feeds "
                "it, or drop it from `cached=`"
            )
        if not plain(value):
            raise TypeError(
                f"`{name}` is cached and is called with a `{type(value).__qualname__}`, a "
                f"subclass of `torch.Tensor`, as argument {index}: a cached submodule is "
                "keyed by the content of the tensors it is handed, not by their class or "
                "what else they carry, and its answer is kept as plain tensors. Hand it a "
                "plain tensor (`x.as_subclass(torch.Tensor)`), or drop it from `cached=`"
            )
    # A frozen parameter handed on (`self.decoder(self.queries)`) is keyed and handed as
    # its values, as the codec weighs and writes plain tensors only.
    # So is an argument that requires grad where no gradient is recorded (torch.no_grad):
    # the module answers it there with none, unless it turns gradients on itself.
    handed = args
    grads = any(a is not None and a.requires_grad for a in args)
    args = tuple(
        a.detach() if isinstance(a, nn.Parameter) or (a is not None and a.requires_grad) else a
        for a in args
    )
    tensors = [a for a in args if a is not None]
    # Asked here too, since under torch.compile the wrapped forward's own look is compiled
    # away: a declared submodule replaced on the model is refused before it is keyed.
    self.owner._follow()
    memory = self.owner.graph.memory
    # The node the owner's graph holds: this one, or, for a shim making another call of
    # it, its base's, whose state and declaration this call is keyed by too.
    held = node if self.base is None else self.base.node
    _restated(self.owner, name, held, looked)
    basis = (memory.declaration_of(name), held._smz.state)
    if basis != self._basis:
        self._solos.clear()
        self._basis = basis
        node._smz.state = held._smz.state
    if grads and getattr(self, "_records_none", None) != basis:
        _check_records_none(self, name, handed)
        self.__dict__["_records_none"] = basis  # checked for this state and declaration
    precision = _precision(tensors)
    layouts = _layouts(args)
    solo = self._solos.get((precision, layouts))
    if solo is None:
        solo = _solo(node, name, basis[0], precision, self.made, layouts)
        self._solos[(precision, layouts)] = solo
    # This call's own facts: `solo.record` is that of the forward that ended last, which
    # another thread's call may be, having ended since this one did.
    facts: list[dict[str, Any]] = []
    if held is not node:
        # Another call of the base's node: what the module keeps is watched there, and
        # what this call changes of it is said by that watch (not kept if it did).
        node._settings, node._declared = held._settings, held._declared
        node.keyed_as(held)
    raised: Exception | None = None
    try:
        with torch.no_grad():
            out = solo.forward(
                Opaque(tuple(args), TENSOR),
                store=store,
                watching=facts.append,
                strict=self.owner.strict,
            )
    except BaseException as failed:
        # What the call did, its failure included, is what the last call did.
        self.owner._noted(name, Record(facts))
        raised = _own_error(failed) if isinstance(failed, NodeFailed) else None
        if raised is None:
            raise
    if raised is not None:
        # Raised here, out of the handler: the module's error as it raised it, not chained
        # to the engine's report of it.
        raise raised
    if held is not node:
        held._settings = node._settings  # taken again where the call gave values anew as they were
    self.owner._noted(name, Record(facts))
    return _placed(out, tensors[0].device) if tensors else out


def _not_a_tensor(self: _Cached, name: str, index: int, value: Any) -> TypeError:
    """The refusal of a call handing ``value``, no tensor, as argument ``index``: named as
    the module's signature names it, since a flag is mostly given by name
    (`output_hidden_states=True`), and counted from 0 once put in order."""
    params = [
        one
        for one in (self._signature.parameters.values() if self._signature else ())
        if one.kind in (one.POSITIONAL_ONLY, one.POSITIONAL_OR_KEYWORD)
    ]
    param = params[index] if index < len(params) else None
    said = f"argument {index}" if param is None else f"argument {index} (`{param.name}`)"
    advice = "Make the value a constant of the model, or drop the submodule from `cached=`"
    if param is not None and param.default is None:
        # Hugging Face's flags: left None, the forward reads them from its config.
        advice = (
            f"Leave `{param.name}` out and set the value the module reads in its place (a "
            f"Hugging Face model's `model.config.{param.name}`), make it a constant of the "
            "model, or drop the submodule from `cached=`"
        )
    return TypeError(
        f"`{name}` is cached and is called with a `{type(value).__name__}` as {said}: a "
        "cached submodule is keyed by the content of the tensors it is handed, so its "
        f"arguments must be tensors (or None). {advice}"
    )


def _own_error(failed: NodeFailed) -> Exception | None:
    """The error the module raised that ``failed`` reports, where it is the module's own
    (torch's out-of-memory error on a batch too large, a hook's, a check of the input's):
    raised as the model raises it, so that a loop catching it (to run the batch in halves)
    catches it with the part cached as without. Nothing was kept for the call. None where
    the engine refused the call itself."""
    error = failed.__cause__
    if isinstance(error, Exception) and not isinstance(error, SomatizeError):
        return error
    return None


def _check_records_none(self: _Cached, name: str, args: tuple[Any, ...]) -> None:
    """Refuses arguments that require grad, taken where no gradient is recorded, for a
    module that records one anyway, turning gradients on inside its forward: its own
    answer would carry their gradient, and a recalled one carries none. It is run once,
    on them, to see (once per state and declaration)."""
    with torch.no_grad():
        out = self.call(*args)
    if any(t.requires_grad for t in _tensors(out)):
        raise CachedInputNeedsGrad(
            f"`{name}` is cached and turns gradients on inside its forward: handed an "
            "argument that requires grad, even under `torch.no_grad()`, it answers with "
            "that argument's gradient, and a recalled answer is a leaf, so whatever produced "
            "the argument would train when the answer is computed and silently stop when it "
            "is recalled. Hand it `x.detach()`, or drop it from `cached=`"
        )


def traced(name: str, tracer: str) -> TypeError:
    """The refusal of a call of cached node ``name`` that ``tracer`` records
    (:func:`~somatize_torch._errors.traced_by`)."""
    return traced_by(
        tracer, f"`{name}` is cached and", "the model itself (`wrapped.model`), which runs uncached"
    )


def _restated(owner: Wrapped, name: str, held: ModuleNode, looked: bool = False) -> None:
    """Weights changed since ``held`` was frozen (a checkpoint loaded, a part replaced, a
    fine-tuning), or a setting or hook it keeps: it is held frozen at its new state, which
    is said to the owner's graph with what it declares now, so that the graphs below are
    built for them."""
    memory = owner.graph.memory
    state = held.restate(owner._refuse_tied, looked=looked)
    owner._look_at_ties()  # a tie made outside the part
    if state is not None:
        memory.freeze(name, state)
    if held.declaration_moved() or state is not None:
        try:
            declared_again(memory, name, held)
        except BaseException:
            # Stopped before the owner's graph was told (a Ctrl-C as the declaration is
            # worked out): the next call looks again, rather than key by the old one.
            held.look_at_settings_again()
            raise


def _placed(out: Any, device: torch.device) -> Any:
    """``out`` with its tensors on ``device``, the first input's: where a recalled answer
    lies follows where the call is made, not where it was kept (a store filled on one
    GPU, or on the host, serves a model on another), and a computed one is put there too,
    so that a miss and a hit answer alike."""
    if isinstance(out, torch.Tensor):  # the usual answer, without walking a tree
        return out if out.device == device else out.to(device)
    if all(t.device == device for t in _tensors(out)):
        return out
    return _mapped(lambda t: t.to(device), out)


_remember: Callable[..., Any] = outside_compiled(_recall_or_run)
"""The one deliberate graph break per cached node: the store is asked outside compiled code."""
_kept_frozen_eagerly: Callable[..., Any] = outside_compiled(_kept_frozen)
""":func:`_kept_frozen` in a compiled call, made eagerly: compiled code cannot warn, and
a part put back in eval there would not be seen by the code after it, compiled for the
part in train mode."""


def _precision(args: Sequence[torch.Tensor]) -> Precision:
    """The precision a call on ``args`` runs in, named only where it is not torch's default
    (:func:`~somatize_torch._precision.precision_on` the first argument's device type)."""
    return precision_on(args[0].device.type if args else "cpu")


def _layouts(args: Sequence[torch.Tensor | None]) -> Layouts:
    """The order of the dims in memory of each of ``args`` (:func:`~somatize_torch.codec
    .memory_order`: None in C order, and for None), or None where every one is in C order:
    a kernel picks its path by it (a conv fed channels_last answers channels_last, and may
    round otherwise), so a call on inputs laid out otherwise is keyed apart, and the usual
    call keeps the key it always had."""
    orders = tuple(None if a is None else memory_order(a) for a in args)
    if all(order is None for order in orders):
        return None
    return tuple(None if order is None else tuple(order) for order in orders)


def _solo(
    node: ModuleNode,
    name: str,
    declaration: str | None,
    precision: Precision,
    made: Any = None,
    layouts: Layouts = None,
) -> Graph:
    """The one-node graph a cached call of ``node`` is asked through: keyed by
    ``declaration`` (the owner graph's), and by the precision too, where it is not the
    default, by the call ``made``, where it is another than the one declared, and by the
    order of its inputs' dims in memory, where one is not in C order (:func:`_layouts`)."""
    solo = Graph.somatize(node)
    # The cached call asks the node whether its state changed before each lookup, and
    # says what changed to the owner's graph; the one-node graph need not ask again.
    solo._restated.clear()
    if declaration is not None:
        more: dict[str, Any] = {}
        if precision is not None:
            more["precision"] = dict(precision)
        if made is not None:
            more["made"] = made
        if layouts is not None:
            more["layouts"] = [None if order is None else list(order) for order in layouts]
        said = (
            declaration
            if not more
            else canonical.hex_of({"declaration": declaration, **more}, b"somatize/declaration\0")
        )
        if solo.memory.declaration_of(name) != said:
            solo.memory.declared_as(name, said)
    return solo
