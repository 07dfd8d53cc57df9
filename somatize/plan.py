"""The plan: for one input, which nodes run, which are recalled, which are spared.

Planning needs no data beyond the input's key: every other part of every key is
already known (identities, declarations, settled states, salts). So the keys of
all cached nodes are computed first, the store is asked **once** which it has,
and the graph is walked backward from the outputs — a cached node whose answer
is kept is recalled and does not need its inputs; the rest of what the outputs
need runs; a node they do not need is spared: it does not run, because only
recalled nodes read it, or because it is not above the outputs asked for at all
(``outputs=`` naming a node in the middle of the graph).

What does not depend on the input — the key prefixes, which nodes need keys —
is derived once per state of the graph's memory (:class:`Static`). Every forward
first looks at the graph again (:func:`look_again`): a node whose declaration may
change in place (one built with a list) has it derived again, and a frozen node
that can see its own state change (a torch module whose weights were loaded
since ``freeze``) is asked; a change is said to the memory, which makes a new
state — before anything is keyed or sent to a worker, with or without a store —
so a key, and a node rebuilt on a worker, name what the node is now.

The code an answer is kept with is not in its key (a cosmetic refactor would
invalidate half a store in silence; see :mod:`somatize.memory`), and it is more
than the node's own: the answer is what the node's code made of what the code of
every node above it made, so an edited node upstream makes it as stale as an
edited node itself. So the fingerprint kept beside an answer, and compared on a
hit, covers them all (:attr:`Static.fingerprint`), worked out once per graph
state, in the order the key reads its inputs.

A mapped node reading the graph's input (or another mapped node) has its item
keys known before anything runs. One reading a computed list learns how many
items there are only when that list exists, so its items are keyed, and asked
for, right after its inputs run (``late``).

This module holds the keys and the walk; its parts are the code an answer depends on —
:func:`code_fingerprints`, and :func:`changed_code` naming what changed — in
:mod:`somatize._code`, and what changed in a graph's nodes since it was built —
:func:`look_again`, :func:`declared_again` — in :mod:`somatize._look_again`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from somatize import keys as keying
from somatize._code import _remember_code, changed_code, code_fingerprints
from somatize._look_again import Recipe as Recipe
from somatize._look_again import declared_again as declared_again
from somatize._look_again import look_again
from somatize._precision import Precision, keyed_in_precision, precision_now
from somatize._threads import make_room
from somatize.memory import cacheable, settled, upstream
from somatize.store._serial import serially

if TYPE_CHECKING:
    from somatize.graph import Graph
    from somatize.store import Store

__all__ = [
    "Plan",
    "Static",
    "changed_code",
    "code_fingerprints",
    "compile",
    "look_again",
    "static_of",
]

_KNOWN_INPUTS = 256
"""How many inputs' node keys a graph state remembers (see :attr:`Static.known`)."""
_KNOWN_WALKS = 8
"""How many walks a remembered input keeps (see :attr:`Static.known`)."""
_PRECISIONS = 8
"""How many precisions a graph state keeps its keying in (see :attr:`Static.precisions`)."""

Walked = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], frozenset[str], frozenset[str]]
"""What :meth:`Plan.walk` decides: recall, run, spared, and the first two as sets."""


@dataclass
class Static:
    """What a graph's keys need that does not depend on the input."""

    version: int
    order: tuple[str, ...]
    preds: dict[str, tuple[str, ...]]
    keyed: tuple[str, ...]
    """Nodes whose key is needed (everything above a cached node), in order."""
    prefix: dict[str, bytes]
    cached: frozenset[str]
    mapped: frozenset[str]
    """Every mapped node, keyed or not: each is run item by item."""
    late: frozenset[str]
    """Mapped keyed nodes whose item count is known only once their inputs ran."""
    fingerprint: dict[str, str]
    """Each node's code and the code of every node it reads, transitively, as one digest
    (:func:`code_fingerprints`): what an answer is kept with and compared against on a
    hit, so that an edited node above a cached one makes its answer ``drifted``."""
    itemwise: bool = False
    """Whether a keyed node is mapped: keying an input then takes its item keys too, and
    the keys are not remembered by input (:attr:`known`)."""
    steps: tuple[tuple[str, bytes, tuple[str, ...], bool], ...] = ()
    """For each keyed node in order: its name, the fixed head of its key
    (:func:`~somatize.keys.node_head`), its predecessors, and whether its item keys are
    computed before running."""
    whole: tuple[str, ...] = ()
    """Cached nodes answered whole (not mapped), whose keys the store is asked for."""
    itemized: tuple[str, ...] = ()
    """Cached mapped nodes whose item keys the store is asked for before running."""
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Keyed nodes whose answer more than one node reads, a keyed one among them → the
    keyed nodes that read it: a node handed it may write into it as it runs (sort a list
    in place), and a keyed node handed it after would compute from what its key does not
    name, so the engine checks it unchanged there (:meth:`~somatize._run._Run.reads_shared`).
    Empty for a graph whose answers are each read by one node, which then pays nothing."""
    sharing: frozenset[str] = frozenset()
    """The nodes that read an answer of :attr:`shared`."""
    known: dict[
        str, tuple[dict[str, str], list[str], dict[tuple[tuple[str, ...], frozenset[str]], Walked]]
    ] = field(default_factory=dict)
    """For a graph with no keyed mapped node (:attr:`itemwise`), the node keys and the keys
    asked of the store, by the input's key — they follow from it and from this graph state
    alone — for the last :data:`_KNOWN_INPUTS` inputs seen, so an input seen again is keyed
    in one hash; and what the walk decided for it, by the outputs asked for and the keys
    the store had — it follows from those, the keys and this graph state alone — for up to
    :data:`_KNOWN_WALKS` of them."""
    precise: frozenset[str] = frozenset()
    """The keyed nodes whose keys name the precision a forward is called in where it is not
    the default (:func:`~somatize._precision.keyed_in_precision`): all but those whose
    declaration names it itself."""
    precisions: dict[Precision, Static] = field(default_factory=dict)
    """This graph state keyed in each of the last :data:`_PRECISIONS` precisions other than
    the default that a forward was called in (:meth:`under`)."""
    precision: Precision | None = None
    """The precision the keys of :attr:`precise` name, in this graph state as :meth:`under`
    derived it (None: the default): what a node is told it is keyed in
    (:attr:`~somatize.node.Context.precision`), and a worker runs it in."""

    def under(self, precision: Precision | None) -> Static:
        """This graph state as a forward called in ``precision`` keys it: itself in the
        default precision (None) or where no keyed node is keyed by it; else with the fixed
        parts of each node of :attr:`precise` naming it (:func:`~somatize.keys.in_precision`),
        derived once per precision, and inputs remembered apart (:attr:`known`)."""
        if precision is None or not self.precise:
            return self
        found = self.precisions.get(precision)
        if found is not None:
            return found
        prefix = {
            node: keying.in_precision(fixed, precision) if node in self.precise else fixed
            for node, fixed in self.prefix.items()
        }
        steps = tuple(
            (node, keying.node_head(prefix[node], max(len(preds), 1)), preds, itemized)
            for node, _, preds, itemized in self.steps
        )
        found = dataclasses.replace(
            self,
            prefix=prefix,
            steps=steps,
            known={},
            precise=frozenset(),
            precisions={},
            precision=precision,
        )
        make_room(self.precisions, _PRECISIONS)
        self.precisions[precision] = found
        return found


def static_of(graph: Graph) -> Static:
    """The input-independent part of ``graph``'s plans, checked and cached."""
    memory = graph.memory
    # Read before the memory it is derived from: a change another thread makes meanwhile
    # (`smt.freeze(g)` at a checkpoint) leaves this derivation stale, and taken for the
    # version after that change it would key every later forward by the state before.
    version = memory.version
    found: Static | None = graph._static
    if found is not None and found.version == version:
        return found
    cacheable(graph, memory)
    cached = [n for n in graph.nodes() if memory.is_cached(n)]
    needed = set(upstream(graph, *cached))
    settled(graph, memory, [n for n in graph.nodes() if n in needed])
    keyed = tuple(n for n in graph.nodes() if n in needed)
    prefix = {}
    for node in keyed:
        declaration = memory.declaration_of(node)
        if declaration is None:
            why = graph.undeclared(node)
            if why is not None:
                raise why
            raise AssertionError(f"`{node}` has neither a declaration nor a reason")
        identity = memory.identity_of(node)
        assert identity is not None  # cacheable() refused it otherwise
        prefix[node] = keying.node_prefix(
            identity,
            declaration,
            memory.state_of(node),
            memory.salt_of(node),
            mapped=memory.is_mapped(node),
        )
    mapped = frozenset(n for n in graph.nodes() if memory.is_mapped(n))
    late = set()
    for node in keyed:
        if node not in mapped:
            continue
        preds = graph.predecessors(node)
        if any(p not in mapped or p in late for p in preds):
            late.add(node)
    reads = {n: graph.predecessors(n) for n in graph.nodes()}
    shared = {
        node: tuple(r for r in readers if r in prefix)
        for node in keyed
        if len(readers := graph.successors(node)) > 1 and any(r in prefix for r in readers)
    }
    written = {n: memory.fingerprint_of(n) for n in graph.nodes()}
    fingerprint = code_fingerprints(graph.nodes(), reads, written)
    if cached:
        _remember_code(fingerprint, reads, written)
    static = Static(
        version=version,
        order=graph.nodes(),
        preds=reads,
        keyed=keyed,
        prefix=prefix,
        cached=frozenset(cached),
        mapped=mapped,
        late=frozenset(late),
        fingerprint=fingerprint,
        itemwise=not mapped.isdisjoint(keyed),
        steps=tuple(
            (
                n,
                keying.node_head(prefix[n], max(len(graph.predecessors(n)), 1)),
                graph.predecessors(n),
                n in mapped and n not in late,
            )
            for n in keyed
        ),
        whole=tuple(n for n in cached if n not in mapped),
        itemized=tuple(n for n in cached if n in mapped and n not in late),
        shared=shared,
        sharing=frozenset(r for node in shared for r in graph.successors(node)),
        precise=frozenset(n for n in keyed if keyed_in_precision(graph.node(n))),
    )
    graph._static = static
    return static


class Plan:
    """What one forward will do."""

    __slots__ = (
        "have",
        "items",
        "keys",
        "recall",
        "recalled",
        "root",
        "run",
        "running",
        "spared",
        "static",
    )

    def __init__(self, static: Static) -> None:
        self.static = static
        self.keys: dict[str, str] = {}
        self.root: str | None = None
        """The key of the input, when a keyed node reads it."""
        self.items: dict[str, list[str]] = {}
        """Item keys of mapped keyed nodes known before running (not the late ones)."""
        self.have: set[str] = set()
        self.recall: tuple[str, ...] = ()
        """Nodes whose whole answer is recalled."""
        self.run: tuple[str, ...] = ()
        self.spared: tuple[str, ...] = ()
        self.recalled: frozenset[str] = frozenset()
        """:attr:`recall`, as a set."""
        self.running: frozenset[str] = frozenset()
        """:attr:`run`, as a set."""

    def walk(self, outputs: Iterable[str]) -> None:
        """Decides recall / run / spared by walking backward from ``outputs``: spared is
        every node they do not need, whether only recalled nodes read it or none of them
        is below it."""
        static = self.static
        cached, preds = static.cached, static.preds
        needed: set[str] = set()
        recalled: set[str] = set()
        stack = list(outputs)
        while stack:
            node = stack.pop()
            if node in needed:
                continue
            needed.add(node)
            if node in cached and self._answered(node):
                recalled.add(node)
                continue
            stack.extend(preds[node])
        recall: list[str] = []
        run: list[str] = []
        spared: list[str] = []
        for node in static.order:
            if node in recalled:
                recall.append(node)
            elif node in needed:
                run.append(node)
            else:
                spared.append(node)
        self.recall, self.run, self.spared = tuple(recall), tuple(run), tuple(spared)
        self.recalled, self.running = frozenset(recall), frozenset(run)

    def walked(self) -> Walked:
        """What the last :meth:`walk` decided, to hand another plan (:meth:`walk_as`)."""
        return self.recall, self.run, self.spared, self.recalled, self.running

    def walk_as(self, walked: Walked) -> None:
        """Decides as a plan with the same keys, store's keys and outputs did."""
        self.recall, self.run, self.spared, self.recalled, self.running = walked

    def _answered(self, node: str) -> bool:
        if node in self.static.mapped:
            items = self.items.get(node)
            if not items:  # handed no items, it has nothing kept to recall: it runs, trivially
                return False
            return all(key in self.have for key in items)
        key = self.keys.get(node)
        return key is not None and key in self.have


def compile(
    graph: Graph,
    x: Any,
    store: Store | None,
    outputs: Iterable[str],
    static: Static | None = None,
) -> Plan:
    """The plan of one forward of ``graph`` on ``x`` against ``store``, for the graph as
    its memory says it is (:func:`look_again` first), or as ``static`` was derived from it
    (:func:`static_of`) as the forward looked at it."""
    if store is None:
        plan = Plan(_unkeyed(graph))
        plan.walk(outputs)
        return plan
    if static is None:
        static = static_of(graph)
    if static.precise:  # read in the thread that calls the forward: autocast is kept per thread
        static = static.under(precision_now())
    plan = Plan(static)
    if static.keyed and not static.itemwise:
        root = plan.root = keying.root_key(x)
        found = static.known.get(root)
        if found is None:
            plan.keys = _node_keys(static, root)
            asked = [plan.keys[n] for n in static.whole]
            walks: dict[tuple[tuple[str, ...], frozenset[str]], Walked] = {}
            make_room(static.known, _KNOWN_INPUTS)
            static.known[root] = (plan.keys, asked, walks)
        else:
            plan.keys, asked, walks = found  # read, never written, after planning
        plan.have = serially(store, store.have, asked) if asked else set()
        # The walk follows from the keys (this input's), what the store has of them and
        # the outputs asked for: the same three decide the same, and are remembered.
        wanted = outputs if type(outputs) is tuple else tuple(outputs)
        seen = (wanted, frozenset(plan.have))
        walked = walks.get(seen)
        if walked is not None:
            plan.walk_as(walked)
            return plan
        plan.walk(wanted)
        if len(walks) < _KNOWN_WALKS:
            walks[seen] = plan.walked()
        return plan
    elif static.keyed:
        keys = plan.keys
        root = None
        key_after = keying.key_after
        for node, head, preds, itemized in static.steps:
            if preds:
                inputs = [keys[p] for p in preds]
            else:
                if root is None:
                    root = plan.root = keying.root_key(x)
                inputs = [root]
            keys[node] = key_after(head, inputs)
            if itemized:
                plan.items[node] = _item_keys(plan, node, x)
        asked = [keys[n] for n in static.whole]
        for node in static.itemized:
            asked.extend(plan.items[node])
        plan.have = serially(store, store.have, asked) if asked else set()
    plan.walk(outputs)
    return plan


def _node_keys(static: Static, root: str) -> dict[str, str]:
    """The key of every keyed node of a graph with no mapped node, for an input keyed
    ``root``."""
    keys: dict[str, str] = {}
    key_after = keying.key_after
    for node, head, preds, _ in static.steps:
        keys[node] = key_after(head, [keys[p] for p in preds] if preds else [root])
    return keys


def _item_keys(plan: Plan, node: str, x: Any) -> list[str]:
    static = plan.static
    preds = static.preds[node]
    if not preds:
        if not isinstance(x, (list, tuple)):
            raise TypeError(
                f"`{node}` is mapped, so it is handed a list, and the input is a "
                f"`{type(x).__name__}`: pass a list (one item per element; items that must "
                "be weighed, such as tensors, each in an `Opaque`) or drop `.mapped()`"
            )
        columns = [keying.root_item_keys(x)]
    else:
        columns = [plan.items[p] for p in preds]
    return item_keys_from(static.prefix[node], columns, node)


def item_keys_from(prefix: bytes, columns: list[list[str]], node: str) -> list[str]:
    """Item keys of a mapped node from its inputs' item keys, one column per input."""
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise ValueError(
            f"`{node}` is mapped over inputs of different lengths {sorted(lengths)}; a mapped "
            "node pairs item i of each input, so they must be equally long"
        )
    return [keying.node_key(prefix, list(row)) for row in zip(*columns, strict=True)]


def _unkeyed(graph: Graph) -> Static:
    """A static plan with no keys, for a forward without a store."""
    memory = graph.memory
    version = memory.version  # read first, as static_of reads it
    found: Static | None = graph._unkeyed
    if found is not None and found.version == version:
        return found
    static = Static(
        version=version,
        order=graph.nodes(),
        preds={n: graph.predecessors(n) for n in graph.nodes()},
        keyed=(),
        prefix={},
        cached=frozenset(),
        mapped=frozenset(n for n in graph.nodes() if memory.is_mapped(n)),
        late=frozenset(),
        fingerprint={},
    )
    graph._unkeyed = static
    return static
