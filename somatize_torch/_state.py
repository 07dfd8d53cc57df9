"""A module's state: what it is digested as, and how to tell cheaply that it changed.

A module's state is its parameters and its buffers, persistent or not, by name
(BatchNorm running statistics change what it computes as much as its weights do).
:func:`digest_state` is :func:`somatize_torch.digest.digest_named` over the tensors by
name: each tensor's bytes digested where it lives, combined under a canonical header
of names (sorted), dtypes and shapes — the same tensors give the same digest in any
process, whatever order they were registered in and whatever device holds them. It is
never the digest of a serialised file, since a serialiser may write equal tensors in
more than one way.

A module whose code reads another module from a name of its module (``NORM =
nn.LayerNorm(3)``, called by its forward: a :class:`Read`), or from a list or dict such
a name holds, or that keeps a partial binding one, or one in a plain list, tuple or dict
(``self.extra = [nn.LayerNorm(3)]``, which torch does not register), computes with that
module's weights as much as with its own, so they are digested with its state, under the name read
(``cells:NORM.weight``), and watched with it (:class:`Reads`: what leads to each, too):
only where it has such, so the usual digest does not change. Its settings and modes are
in the module's declaration (:mod:`somatize_torch.freeze`).

Digesting reads every byte of the state. :class:`StateWatch` is what is asked at every
forward instead: it looks only at what torch keeps beside each tensor, so the state
is digested again only when it may have changed. :mod:`somatize_torch.freeze`, which
settles a frozen module at this digest, re-exports both.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from somatize.catalog import objects_read
from somatize_torch._settings import _TORCH_OWN, _same_items, stood_for
from somatize_torch._sharding import Originals, sharded_sources, sources_changed
from somatize_torch.codec import memory_order
from somatize_torch.digest import digest_named

__all__ = [
    "NO_READS",
    "Read",
    "Reads",
    "StateWatch",
    "digest_state",
    "modules_read",
    "own_parameters",
    "trainable_parameters",
]


class Read(NamedTuple):
    """A module that a module computes with beyond its own parts, found by
    :func:`modules_read`: its weights are that module's state too, and its settings and
    modes are in its declaration."""

    label: str
    """Where it is read: ``module:name`` for a name of a module (``cells:NORM``), with
    where in the list, tuple or dict that name holds (``cells:NORMS[0]``); for one a
    partial a part keeps binds, or a list, tuple or dict it keeps holds, the part's
    attribute and where in it (``f.args[0]``, ``inner.extra[0]``)."""
    module: nn.Module


class Reads:
    """The modules :func:`modules_read` found (``found``), and what leads to each, to be
    asked cheaply whether that moved since (:meth:`moved`): each name, or attribute of a
    part, that holds one or a container of them, by what it holds; each list or dict on
    the way, by its items, and each partial by its function, arguments and keywords — so
    that a module replaced, added or taken out (``NORMS[0] = other``, ``NORMS.append(...)``)
    is seen. A container that leads to no module yet (``NORMS = []``, ``self.extra = []``)
    is watched for one coming to be in it, or in what its name holds then: one filled
    with other values (a table a forward fills as it runs) is no move."""

    __slots__ = (
        "_contents",
        "_empty",
        "_held",
        "_names",
        "_owners",
        "_values",
        "_waiting",
        "found",
    )

    def __init__(self) -> None:
        self.found: tuple[Read, ...] = ()
        self._owners: list[dict[str, Any]] = []
        self._names: list[str] = []
        self._values: list[Any] = []
        self._held: list[Any] = []
        self._contents: list[tuple[Any, ...]] = []
        self._empty: list[_Filling] = []
        self._waiting: list[tuple[dict[str, Any], str, Any, bool, _Filling | None]] = []

    def moved(self) -> bool:
        """Whether a name or attribute, a container or a partial leading to a module found
        holds something else now, or one that led to none leads to one now."""
        if self._owners and (
            not all(map(operator.is_, map(dict.get, self._owners, self._names), self._values))
            or not all(map(_same_items, map(_items_of, self._held), self._contents))
        ):
            return True
        return any(map(_Filling.leads, self._empty)) or self._rebound()

    def _rebound(self) -> bool:
        """Whether a name or attribute holding a container that led to no module holds
        one that leads to one now: what it holds from then on is watched as the
        container was (:class:`_Filling`), so a name bound again (``self.seen = []``)
        does not cost a walk of what it holds at each look."""
        for at, (space, name, was, globally, filling) in enumerate(self._waiting):
            now = space.get(name)
            if now is not was:
                filling = _Filling(now) if type(now) in _FILLED else None
                if _leads(now, globally):
                    return True
                self._waiting[at] = (space, name, now, globally, filling)
            elif filling is not None and filling.leads():
                return True
        return False


class _Filling:
    """A container that led to no module when :class:`Reads` looked (an empty list or
    dict, a partial binding nothing), to be asked whether one came into it since. Only
    what came into a list or dict since the last look is walked (what was appended, or
    put under a new key), so one a forward fills as it runs (a list of each batch it
    was handed, a memo by shape) costs the same at each look however long it grows; one
    changed otherwise (an item taken out, or put before the last looked at) is walked
    whole. An item changed in place among those looked at is not seen, as an item of a
    container that held other values when watched is not."""

    __slots__ = ("held", "mark")

    def __init__(self, held: Any) -> None:
        self.held = held
        self.mark = _mark(held)

    def leads(self) -> bool:
        held, (looked, last) = self.held, self.mark
        if type(held) not in _FILLED:
            return _leads(held)
        size = len(held)
        if size == looked and _same_items(_last(held, size), last):
            return False
        mark = _mark(held)  # before the walk: what comes in during it is walked next time
        since = looked if looked <= size and _same_items(_last(held, looked), last) else 0
        if any(map(_leads_in, _values_since(held, since, size))):
            return True
        self.mark = mark
        return False


NO_READS = Reads()
"""What a module reading no module beyond its own parts reads."""

_DEPTH = 3
"""How deeply a list, tuple, dict or partial is followed to the modules it holds."""


def _items_of(held: Any) -> tuple[Any, ...]:
    """What a watch of :class:`Reads` compares of a container by identity."""
    if isinstance(held, functools.partial):
        return (held.func, held.args, held.keywords)
    if isinstance(held, dict):
        return (*held, *held.values())
    return tuple(held)


def _leads(value: Any, globally: bool = True) -> bool:
    """Whether ``value``, held by a name of a module (``globally``) or a part's attribute,
    leads to a module as :func:`modules_read` follows it."""
    return _reached(value, "", globally or _through(value), [], [], [], _DEPTH)


def _leads_in(item: Any) -> bool:
    """Whether ``item`` of a list, dict or partial that led to no module leads to one."""
    return type(item) not in _PLAIN and _reached(item, "", True, [], [], [], _DEPTH - 1)


def _mark(held: Any) -> tuple[int, tuple[Any, ...]]:
    """How many items a list or dict holds, and its last (a dict's last key and value):
    what :class:`_Filling` tells one filled since by."""
    if type(held) not in _FILLED:
        return 0, ()
    return len(held), _last(held, len(held))


def _last(held: list[Any] | dict[Any, Any], count: int) -> tuple[Any, ...]:
    """The last of the first ``count`` items of ``held`` (at most as many as it holds)."""
    if count == 0:
        return ()
    if isinstance(held, list):
        return (held[count - 1],)
    return next(itertools.islice(reversed(held.items()), len(held) - count, None))


def _values_since(held: list[Any] | dict[Any, Any], since: int, size: int) -> Iterable[Any]:
    """The items of ``held``, a list or dict of ``size`` items, from ``since`` on."""
    if isinstance(held, list):
        return held[since:]
    if since == 0:
        return list(held.values())
    return list(itertools.islice(reversed(held.values()), size - since))


def _through(value: Any) -> bool:
    """Whether the modules a part's attribute holding ``value`` leads to are read: those
    a plain list, tuple or dict holds, not only those a partial binds."""
    return type(value) in _CONTAINERS


def _reached(
    value: Any,
    label: str,
    through: bool,
    found: list[Read],
    held: list[Any],
    empty: list[Any],
    depth: int,
) -> bool:
    """Puts in ``found`` each module ``value`` is or holds (in a list, tuple or dict,
    ``depth`` deep, or bound by a partial) — where ``through``: else only those a partial
    binds — in ``held`` each list, dict and partial on the way to one, and in ``empty``
    each empty one where ``through`` (what it comes to hold is read); whether any was."""
    if isinstance(value, nn.Module):
        if through:
            found.append(Read(label, value))
        return through
    kind = type(value)
    items: Iterable[tuple[Any, Any]]
    if depth == 0:
        return False
    if isinstance(value, functools.partial):
        kind, through = functools.partial, True
        items = [(("args", at), one) for at, one in enumerate(value.args)]
        items += [(("keywords", key), one) for key, one in value.keywords.items()]
    elif kind is list or kind is tuple:
        items = enumerate(value)
    elif kind is dict:
        items = value.items()
    else:
        return False
    reaches, nothing = False, True
    for at, (key, one) in enumerate(items):
        nothing = False
        if type(one) not in _PLAIN:  # a table of plain values leads to no module
            where = label + _step(kind, at, key)
            reaches = _reached(one, where, through, found, held, empty, depth - 1) or reaches
    if kind is not tuple and reaches:
        held.append(value)
    elif kind is not tuple and through and nothing:
        empty.append(value)
    return reaches


def _step(kind: type, at: int, key: Any) -> str:
    """How the item ``at`` of a container of ``kind`` under ``key`` is named in a label."""
    if kind is functools.partial:
        return f".{key[0]}[{key[1]!r}]"
    if kind is dict:
        return f"[{key!r}]" if type(key) in (str, int) else f"[#{at}]"
    return f"[{key}]"


_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})
_CONTAINERS = frozenset({list, tuple, dict})
_FILLED = frozenset({list, dict})


def modules_read(module: nn.Module, classes: Iterable[type]) -> Reads:
    """Each module that ``module`` computes with and that is none of its own parts: one
    that the code of ``classes`` (``module``'s: its own and its parts') reads from a name
    of its module, or of a helper it calls, that no watch of that code looks into
    (:func:`~somatize.catalog.objects_read`: one of torch's own classes, or another
    package's, named by the text that makes it), or from a list, tuple or dict such a name
    holds (``NORMS = [nn.LayerNorm(3)]``, nested a little); and one that a
    ``functools.partial`` a part keeps binds (``self.f = functools.partial(apply,
    nn.Linear(3, 3))``), or a list, tuple or dict it binds holds, or a plain list, tuple
    or dict a part keeps holds (``self.extra = [nn.LayerNorm(3)]``)."""
    own = {id(one) for part in module.modules() for one in (part, stood_for(part))}
    reads = Reads()
    found: list[Read] = []

    def look(space: dict[str, Any], name: str, label: str, globally: bool) -> None:
        value = space.get(name)
        empty: list[Any] = []
        # A list, tuple or dict a part keeps (`self.extra = [nn.LayerNorm(3)]`, which torch
        # does not register) holds modules it computes with, as a partial it keeps does.
        through = globally or _through(value)
        if _reached(value, label, through, found, reads._held, empty, _DEPTH):
            reads._owners.append(space)
            reads._names.append(name)
            reads._values.append(value)
        elif empty:
            # A container that leads to no module yet (`NORMS = []`): what the name holds
            # is watched too.
            reads._waiting.append((space, name, value, globally, None))
        reads._empty += map(_Filling, empty)

    for space, name in objects_read(*classes):
        look(space, name, f"{space.get('__name__', '')}:{name}", True)
    for prefix, part in module.named_modules():
        table = vars(stood_for(part))  # a wrapped model's values are the model's
        for name in [name for name in table if name not in _TORCH_OWN]:
            look(table, name, f"{prefix}.{name}" if prefix else name, False)
    seen: set[int] = set()
    for one in found:
        if id(one.module) not in own and id(one.module) not in seen:
            seen.add(id(one.module))
            reads.found += (one,)
    reads._contents = list(map(_items_of, reads._held))
    return reads


def _state_tensors(module: nn.Module, read: Sequence[Read] = ()) -> dict[str, torch.Tensor]:
    """A module's parameters and buffers (persistent or not), by name: its state; and
    those of each module of ``read``, by the name it is read as (``cells:NORM.weight``)."""
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    for name, buffer in module.named_buffers():
        tensors[name] = buffer
    for one in read:
        for name, tensor in _state_tensors(one.module).items():
            tensors[f"{one.label}.{name}"] = tensor
    return tensors


def digest_state(module: nn.Module, read: Sequence[Read] = ()) -> str:
    """``blake3:<hex>`` of a module's parameters and buffers (persistent or not), by name,
    and of those of each module its code reads from a name of its module (``read``)."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"digest_state takes an nn.Module (its parameters and buffers are digested), got "
            f"a `{type(module).__name__}`; for named tensors, a `state_dict()`, use "
            "`digest_named(tensors)`"
        )
    tensors = _state_tensors(module, read)
    return digest_named(tensors, _state_kind(tensors))


def _state_kind(tensors: dict[str, torch.Tensor]) -> str:
    """What the state is named as: ``state``, plus the order in memory of each tensor
    laid out in another order of its dims than C order. A kernel picks its path by its
    weights' layout too (a conv whose weights are channels_last answers channels_last,
    and may round otherwise), so a module converted so
    (``model.to(memory_format=torch.channels_last)``) recalls none of the answers of its
    weights in C order. A state all in C order keeps the digest it always had."""
    orders = {name: order for name, t in tensors.items() if (order := memory_order(t))}
    if not orders:
        return "state"
    return "state laid out " + json.dumps(orders, sort_keys=True)


def _converted_ends(placed: list[torch.Tensor]) -> tuple[int, ...]:
    """Where the first and last tensors of ``placed`` lie that a conversion of dtype
    (``.half()``) gives other memory: floating ones. An integer buffer (a text encoder's
    ``position_ids``, a BatchNorm's count) is left where it is, so ends of them would tell
    nothing; the first and last of all where no tensor is floating."""
    floating = [at for at, t in enumerate(placed) if t.is_floating_point() or t.is_complex()]
    among = floating or list(range(len(placed)))
    return tuple(dict.fromkeys(among[:1] + among[-1:]))


class StateWatch:
    """Whether a module's state may have changed since it was digested, cheaply enough to
    ask at every forward: each parameter, buffer and submodule is looked at by identity
    (a tensor or child replaced: a checkpoint loaded by assignment, ``encoder[0] =
    conv``), each tensor by its version counter (bumped by every change in place:
    ``load_state_dict``, an optimizer step), each parameter by whether it requires grad
    (somebody unfroze it) and by the gradient it holds (a backward reached it, so an
    optimizer may have stepped it: a fused one, ``AdamW(fused=True)``, bumps no version
    counter), and each table by its length (a tensor or submodule added or removed).
    ``thorough`` also looks at each tensor's memory (``p.data = t``, a conversion of the
    module, ``.half()`` then ``.float()`` included): the memory a tensor held when
    watched is weakly referenced, so its address cannot be taken for the same memory
    once it was let go and given to another tensor. Once :meth:`unfrozen` found a
    parameter requiring grad, the watch says changed until it is made anew: what trained
    the module meanwhile may have bypassed every counter. A write that bypasses the
    version counter while no gradient is left behind — into ``p.data`` outside an
    optimizer's step — is not seen here; only digesting the state again sees it. (An
    optimizer's step moves the counters of the weights it stepped, a fused one's too:
    :mod:`somatize_torch._steps`.) Each module of ``read`` is watched as a part of
    the module is, and what leads to it (:meth:`Reads.moved`: ``NORM = nn.LayerNorm(3)``
    run again holds another, ``NORMS[0] = other``)."""

    __slots__ = (
        "_doubted",
        "_ends",
        "_gradients",
        "_held",
        "_memory",
        "_named",
        "_originals",
        "_param_versions",
        "_params",
        "_placed",
        "_read",
        "_requires",
        "_sharded",
        "_sizes",
        "_tables",
        "_tensors",
        "_trainable",
        "_versions",
        "_where",
    )

    def __init__(
        self, module: nn.Module, read: Reads = NO_READS, *, leaving: Collection[int] = ()
    ) -> None:
        """``leaving`` holds the ids of parts of ``module`` not to watch (another watch's)."""
        tables: list[dict[str, Any]] = []
        held, trainable = _Held(), _Held()
        originals = Originals()
        parts = [*module.modules(), *(part for one in read.found for part in one.module.modules())]
        if leaving:
            parts = [part for part in parts if id(part) not in leaving]
        for part in parts:
            for table in (part._parameters, part._buffers, part._modules):
                tables.append(table)
                place = part if table is part._parameters else None
                for name, value in table.items():
                    original = None if place is None else originals.of(place, name, value)
                    held.add(table, name, value, place, original)
                    if table is not part._buffers:
                        trainable.add(table, name, value, place, original)
        self._read = read
        self._tables = tables
        self._sizes = tuple(map(len, tables))
        self._held = held
        self._trainable = trainable
        self._originals = originals
        # FSDP1's views are cut anew at each forward from memory FSDP gives out anew: each
        # is watched by its version counter (its flat parameter's), and by the original it
        # stands for, whose version counter a change between forwards bumps.
        views = {id(view) for view in held.views}
        own = [v for v in held.values if isinstance(v, torch.Tensor) and id(v) not in views]
        self._tensors = [*own, *held.views, *held.originals]
        self._params = [t for t in self._tensors if isinstance(t, nn.Parameter)]
        self._versions = tuple(map(_VERSION, self._tensors))
        self._param_versions = tuple(map(_VERSION, self._params))
        # A tensor with no memory of its own to point at (a sparse one) is watched
        # otherwise only.
        self._placed = [tensor for tensor in own if _has_memory(tensor)]
        self._where = tuple(map(_WHERE, self._placed))
        self._ends = _converted_ends(self._placed)
        self._memory = _Memory(own)
        self._requires = tuple(map(_REQUIRES, self._params))
        self._gradients = tuple(map(_GRADIENT, self._params))
        # Under FSDP2 a change of the values shows on the shards only (see _sharding).
        self._sharded = sharded_sources(parts)
        self._doubted = False
        self._named = frozenset(name for name, _ in module.named_parameters())

    def changed(self, thorough: bool = False) -> bool:
        """Whether a weight, buffer or submodule changed, was replaced, added or removed,
        or a parameter came to require grad or got a gradient (and, ``thorough``, whether
        a tensor's memory changed)."""
        return (
            self._moved_or_changed()
            or tuple(map(_REQUIRES, self._params)) != self._requires
            or not all(map(operator.is_, map(_GRADIENT, self._params), self._gradients))
            or (
                thorough
                and (tuple(map(_WHERE, self._placed)) != self._where or self._memory.let_go())
            )
        )

    def held_in_place(self) -> bool:
        """Whether each tensor and part is the one watched, at its version, in its memory:
        what changed since, if anything, is only which parameters require grad and the
        gradients they hold (:meth:`follow_gradients`)."""
        return not (
            self._moved_or_changed()
            or tuple(map(_WHERE, self._placed)) != self._where
            or self._memory.let_go()
        )

    def _moved_or_changed(self) -> bool:
        """Whether a tensor changed in place, or a tensor or part was replaced, added or
        removed (the memory a tensor holds aside)."""
        return (
            self._doubted
            or tuple(map(_VERSION, self._tensors)) != self._versions
            or self._replaced()
            or self._read.moved()
            or sources_changed(self._sharded)
        )

    def follow_gradients(self) -> None:
        """Watches from here on which parameters require grad, and the gradients they hold."""
        self._requires = tuple(map(_REQUIRES, self._params))
        self._gradients = tuple(map(_GRADIENT, self._params))

    def ends_moved(self) -> bool:
        """Whether the first or the last floating tensor watched (:func:`_converted_ends`)
        points at other memory now. A conversion of the whole module
        (``encoder.half().float()``, asked of the module itself) gives each of its floating
        tensors other memory and moves no version counter;
        looking at two of them costs next to nothing at every call, where looking at each
        (``changed(thorough=True)``) costs as much again as the rest of the watch."""
        placed, where = self._placed, self._where
        return any(_WHERE(placed[at]) != where[at] for at in self._ends)

    def moved(self) -> bool:
        """Whether a tensor or submodule was replaced, added or removed, or a tensor's memory
        changed (``p.data = t``): where the numbers are, not what they are. A change in
        place, a gradient, or a parameter unfrozen is none of it."""
        return self._doubted or self._replaced() or tuple(map(_WHERE, self._placed)) != self._where

    def trained(self) -> bool:
        """Whether the parameters may have been trained since they were watched: one
        changed in place (an optimizer step) or got a gradient, :meth:`unfrozen` found one
        requiring grad, or a parameter or submodule was replaced, or a tensor or submodule
        added or removed. A buffer changed in place or replaced is none of it:
        ``torch.optim.swa_utils.update_bn`` resets BatchNorm's running statistics and
        estimates them anew, which trains nothing; nor is memory alone moving: a module
        moved to another device or dtype (``.to("cuda")``, which replaces its buffers and
        gives its parameters other memory) trains nothing either, and ``p.data = t`` is
        not seen."""
        return (
            self._doubted
            or tuple(map(_VERSION, self._params)) != self._param_versions
            or not all(map(operator.is_, map(_GRADIENT, self._params), self._gradients))
            or not self._trainable.kept(self._originals)
            or tuple(map(len, self._tables)) != self._sizes
        )

    def _replaced(self) -> bool:
        return (
            not self._held.kept(self._originals)
            or tuple(map(len, self._tables)) != self._sizes  # a part added (`enc.append(act)`)
        )

    def unfrozen(self, module: nn.Module) -> list[str]:
        """The parameters of ``module`` (frozen when watched) that now require grad: those
        unfrozen since, those that train under a name no parameter had then (an adapter
        put in), and a tensor no parameter that stands in a parameter's place (handed in
        by ``torch.func.functional_call``, the caller's to train, which freezing would
        change under the caller, or cannot change, where it was computed). One that took
        the place of a parameter of its name (``encoder.linear = nn.Linear(6, 4)``) is new
        weights, frozen as the module is. When there are some, the watch says changed
        from now on (see the class docstring)."""
        watched = set(map(id, self._params))
        names = [
            n
            for n, p in trainable_parameters(module)
            if id(p) in watched or n not in self._named or not isinstance(p, nn.Parameter)
        ]
        if names:
            self._doubted = True
        return names

    def __getstate__(self) -> dict[str, Any]:
        # A copy watches the copy's tensors, whose memory is other: it says changed, so
        # that the copy is digested again and watched afresh.
        # Nor where its ends are, which are worked out again from what it places: the release
        # before this one sets each name it is handed, and has no such slot.
        left_out = ("_memory", "_ends")
        state = {name: getattr(self, name) for name in self.__slots__ if name not in left_out}
        state["_doubted"] = True
        state["_sharded"] = ()  # FSDP's records are the process's
        state["_originals"] = Originals()
        # Nor the namespaces modules are read from: they hold modules, which do not copy.
        state["_read"] = NO_READS
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._memory = _Memory([])
        self._ends = _converted_ends(self._placed)  # a pickle of the release before has none


class _Held:
    """What a :class:`StateWatch` looks at by identity: each table entry (a part's
    parameter, buffer or submodule by name) and what it held; and, for an entry of a
    parameters table, the part, to tell a view FSDP1 cuts anew at each forward standing
    for the same original parameter (:class:`~somatize_torch._sharding.Originals`)."""

    __slots__ = ("names", "originals", "owners", "places", "standing", "values", "views")

    def __init__(self) -> None:
        self.owners: list[dict[str, Any]] = []
        self.names: list[str] = []
        self.values: list[Any] = []
        self.places: list[nn.Module | None] = []
        self.standing: list[Any] = []
        self.views: list[torch.Tensor] = []
        self.originals: list[torch.Tensor] = []

    def add(
        self,
        table: dict[str, Any],
        name: str,
        value: Any,
        place: nn.Module | None,
        original: torch.Tensor | None,
    ) -> None:
        """Watches ``table[name]``, holding ``value``: ``place``'s parameter, a view of
        ``original``, where given."""
        self.owners.append(table)
        self.names.append(name)
        self.values.append(value)
        self.places.append(place)
        self.standing.append(value if original is None else original)
        if original is not None:
            self.views.append(value)
            self.originals.append(original)

    def kept(self, originals: Originals) -> bool:
        """Whether each entry holds what it held, or what stands for the same original
        parameter: FSDP1's view of it in a forward, the original itself between forwards,
        or the other way round."""
        now = list(map(dict.get, self.owners, self.names))
        if all(map(operator.is_, now, self.values)):
            return True
        return all(
            one is was or (place is not None and _stands_for(originals, place, name, one, stands))
            for one, was, place, name, stands in zip(
                now, self.values, self.places, self.names, self.standing, strict=True
            )
        )


def _stands_for(
    originals: Originals, place: nn.Module, name: str, tensor: Any, original: Any
) -> bool:
    """Whether ``tensor``, ``place``'s parameter ``name``, is ``original`` or FSDP1's view
    of it."""
    if tensor is original:
        return True
    of = originals.of(place, name, tensor)
    return of is not None and of is original


def trainable_parameters(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The parameters of ``module`` that require grad, by name (:func:`own_parameters`)."""
    return [(name, p) for name, p in own_parameters(module) if p.requires_grad]


def own_parameters(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The parameters of ``module`` by name, less the views FSDP
    (``FullyShardedDataParallel(..., use_orig_params=True)``) puts in the place of frozen
    ones for a forward. Such a view requires grad only because the flat parameter it is
    cut from holds trainable ones beside it (a head in the same unit), and FSDP drops the
    gradient that reaches a frozen one, so no gradient reaches its weights, cached or not;
    nor can its flag be turned off, being no leaf."""
    originals = Originals()
    return [
        (name, p)
        for name, p in module.named_parameters()
        if not p.requires_grad or not originals.frozen(module, name, p)
    ]


class _Memory:
    """Weak references to the memory (the storages) of tensors: whether one was let go.

    A weak reference keeps a storage's record, not its bytes, so the watched memory is
    freed as it would be unwatched; but an address seen again is the same memory only
    while the memory first seen there was not let go."""

    __slots__ = ("_refs",)

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        refs: list[int] = []
        for tensor in tensors:
            try:
                refs.append(int(tensor.untyped_storage()._weak_ref()))  # type: ignore[call-overload]
            except (RuntimeError, NotImplementedError, TypeError):
                continue  # no storage of its own (sparse, a wrapper subclass)
        self._refs = refs

    def let_go(self) -> bool:
        return any(map(_EXPIRED, self._refs))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit torch may be gone
            for ref in self._refs:
                _FREE(ref)
            self._refs = []


def _has_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` points at memory of its own (a sparse one, or a lazy parameter
    not made yet, does not)."""
    try:
        tensor.data_ptr()
    except (RuntimeError, NotImplementedError, ValueError):
        return False
    return True


_VERSION = operator.attrgetter("_version")
_WHERE: Callable[[Any], int] = torch.Tensor.data_ptr
_REQUIRES = operator.attrgetter("requires_grad")
_GRADIENT = operator.attrgetter("grad")
_EXPIRED: Callable[[int], bool] = torch.UntypedStorage._expired  # type: ignore[assignment]
_FREE: Callable[[int], None] = torch.UntypedStorage._free_weak_ref
