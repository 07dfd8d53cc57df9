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
"""

from __future__ import annotations

import hashlib
import numbers
import operator
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from somatize import canonical
from somatize import keys as keying
from somatize.catalog import Blueprint, Catalog, Unbuildable, identity_of
from somatize.errors import SomatizeError
from somatize.memory import Memory, cacheable, settled, upstream
from somatize.node import AlreadyBuilt, Node, Undeclared, attributes_of, held_by, in_slot

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
    late: frozenset[str]
    """Mapped keyed nodes whose item count is known only once their inputs ran."""
    fingerprint: dict[str, str]
    """Each node's code and the code of every node it reads, transitively, as one digest
    (:func:`code_fingerprints`): what an answer is kept with and compared against on a
    hit, so that an edited node above a cached one makes its answer ``drifted``."""
    steps: tuple[tuple[str, bytes, tuple[str, ...], bool], ...] = ()
    """For each keyed node in order: its name, the fixed head of its key
    (:func:`~somatize.keys.node_head`), its predecessors, and whether its item keys are
    computed before running."""
    whole: tuple[str, ...] = ()
    """Cached nodes answered whole (not mapped), whose keys the store is asked for."""
    itemized: tuple[str, ...] = ()
    """Cached mapped nodes whose item keys the store is asked for before running."""
    known: dict[str, tuple[dict[str, str], list[str]]] = field(default_factory=dict)
    """For a graph with no itemized node, the node keys and the keys asked of the store,
    by the input's key — they follow from it and from this graph state alone — for the
    last :data:`_KNOWN_INPUTS` inputs seen, so an input seen again is keyed in one hash."""


def static_of(graph: Graph) -> Static:
    """The input-independent part of ``graph``'s plans, checked and cached."""
    memory = graph.memory
    found: Static | None = graph._static
    if found is not None and found.version == memory.version:
        return found
    cacheable(graph, memory)
    cached = [n for n in graph.nodes() if memory.is_cached(n)]
    needed: set[str] = set()
    for node in cached:
        needed.update(upstream(graph, node))
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
    mapped = frozenset(n for n in keyed if memory.is_mapped(n))
    late = set()
    for node in graph.nodes():
        if node not in mapped:
            continue
        preds = graph.predecessors(node)
        if any(p not in mapped or p in late for p in preds):
            late.add(node)
    reads = {n: graph.predecessors(n) for n in graph.nodes()}
    written = {n: memory.fingerprint_of(n) for n in graph.nodes()}
    fingerprint = code_fingerprints(graph.nodes(), reads, written)
    for node in cached:
        _remember_code(fingerprint[node], written)
    static = Static(
        version=memory.version,
        order=graph.nodes(),
        preds=reads,
        keyed=keyed,
        prefix=prefix,
        cached=frozenset(cached),
        mapped=mapped,
        late=frozenset(late),
        fingerprint=fingerprint,
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
    )
    graph._static = static
    return static


_UNWRITTEN = "unwritten"
"""What a node with no code fingerprint (none noted in its graph's memory) contributes to
the fingerprints of the nodes below it."""

_KNOWN_CODE = 256
"""How many fingerprints of cached nodes :func:`changed_code` remembers the code behind."""

_CODE: dict[str, dict[str, str | None]] = {}
"""A fingerprint worked out in this process for a cached node (:attr:`Static.fingerprint`)
→ the own fingerprint of each node of the graph state it was worked out in (one dict,
shared by that state's nodes), so that a drifted answer kept by this process — a cell of
a notebook edited and run again — can name what changed. The last :data:`_KNOWN_CODE`
seen are remembered; for one older, or kept by another process, drift is said without
names."""


def code_fingerprints(
    order: Iterable[str],
    preds: dict[str, tuple[str, ...]],
    written: dict[str, str | None],
) -> dict[str, str]:
    """For each node of ``order`` (each after what it reads), a digest of its own code
    fingerprint (``written``; :data:`_UNWRITTEN` when it has none) and of those worked
    out for ``preds`` — what it reads, in the order its key reads them. The code of
    everything an answer depends on, and neither names nor keys: one computation under
    two names, or on another input, is kept with the same one."""
    out: dict[str, str] = {}
    for node in order:
        digest = hashlib.sha256(b"somatize code 1\0")
        digest.update((written[node] or _UNWRITTEN).encode())
        for pred in preds[node]:
            digest.update(b"\0" + out[pred].encode())
        out[node] = "sha256:" + digest.hexdigest()[:16]
    return out


def _remember_code(fingerprint: str, written: dict[str, str | None]) -> None:
    if fingerprint in _CODE:
        return
    while len(_CODE) >= _KNOWN_CODE:
        try:  # the oldest; threads building plans at once may have taken it already
            _CODE.pop(next(iter(_CODE)), None)
        except (StopIteration, RuntimeError):
            break
    _CODE[fingerprint] = written


def changed_code(graph: Graph, node: str, was: str | None) -> list[str] | None:
    """The nodes, of ``node`` and those it reads (nearest first), whose code is not now
    what it was when this process worked out the fingerprint ``was`` for ``node`` — None
    when it did not, or when what it remembers tells nothing apart."""
    then = _CODE.get(was) if was is not None else None
    if then is None:
        return None
    memory = graph.memory
    changed = [
        above
        for above in upstream(graph, node)
        if then.get(above, _UNWRITTEN) != memory.fingerprint_of(above)
    ]
    return changed or None


class Plan:
    """What one forward will do."""

    __slots__ = ("have", "items", "keys", "recall", "run", "spared", "static")

    def __init__(self, static: Static) -> None:
        self.static = static
        self.keys: dict[str, str] = {}
        self.items: dict[str, list[str]] = {}
        """Item keys of mapped keyed nodes known before running (not the late ones)."""
        self.have: set[str] = set()
        self.recall: list[str] = []
        """Nodes whose whole answer is recalled."""
        self.run: list[str] = []
        self.spared: list[str] = []

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
        self.recall, self.run, self.spared = recall, run, spared

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
) -> Plan:
    """The plan of one forward of ``graph`` on ``x`` against ``store``, for the graph as
    its memory says it is (:func:`look_again` first)."""
    if store is None:
        plan = Plan(_unkeyed(graph))
        plan.walk(outputs)
        return plan
    static = static_of(graph)
    plan = Plan(static)
    if static.keyed and not static.itemized and not static.mapped:
        root = keying.root_key(x)
        found = static.known.get(root)
        if found is None:
            plan.keys = _node_keys(static, root)
            asked = [plan.keys[n] for n in static.whole]
            known = static.known
            while len(known) >= _KNOWN_INPUTS:
                try:  # the oldest; threads planning at once may have taken it already
                    known.pop(next(iter(known)), None)
                except (StopIteration, RuntimeError):
                    break
            known[root] = (plan.keys, asked)
        else:
            plan.keys, asked = found  # read, never written, after planning
        plan.have = store.have(asked) if asked else set()
    elif static.keyed:
        keys = plan.keys
        root = None
        key_after = keying.key_after
        for node, head, preds, itemized in static.steps:
            if preds:
                inputs = [keys[p] for p in preds]
            else:
                if root is None:
                    root = keying.root_key(x)
                inputs = [root]
            keys[node] = key_after(head, inputs)
            if itemized:
                plan.items[node] = _item_keys(plan, node, x)
        asked = [keys[n] for n in static.whole]
        for node in static.itemized:
            asked.extend(plan.items[node])
        plan.have = store.have(asked) if asked else set()
    plan.walk(outputs)
    return plan


def look_again(graph: Graph) -> None:
    """Says to ``graph``'s memory what changed in its nodes since it was built: the
    declaration of a node built with a list or a dict changed in place since (see
    :meth:`~somatize.node.Node.is_declaration_fixed`), and the state of a frozen node
    that sees its own state changed (:meth:`~somatize.node.Node.restate`). A change makes
    a new state of the memory, so what was derived from the old one — a graph's
    :class:`Static`, a broker's blueprints — is derived again. Nothing is refused here: a
    node that can no longer be keyed is refused where its key is needed. Run at the start
    of every forward, before anything is keyed or sent; it costs nothing for a graph with
    no such node."""
    unfixed: dict[str, Node] = graph._unfixed
    restated: dict[str, Node] = graph._restated
    kept = graph._kept
    if not unfixed and not restated and not kept:
        return
    for name, made in graph._made_stale.items():
        # Refused while it holds what was made from the old value, and not once it holds
        # what a build from its arguments holds (set by hand), until they are replaced again.
        refused = made.check()
        if (refused is None) != (name not in graph._unfollowed):
            if refused is None:
                del graph._unfollowed[name]
            else:
                graph._unfollowed[name] = refused
            _declared_again(graph, name, made.node)
    memory = graph.memory
    held, names, values, slotted = graph._kept_watch
    if not all(map(operator.is_, map(dict.get, held, names), values)) or (
        slotted and not all(in_slot(slot, node) is value for slot, node, value in slotted)
    ):
        for name, (node, arguments) in list(kept.items()):
            now = attributes_of(node)
            changed = {a: now[a] for a, was in arguments if a in now and now[a] is not was}
            if changed:
                _retaken(graph, name, node, changed)
        graph.watch_kept()
    for name, node in unfixed.items():
        _declared_again(graph, name, node)
    for name, node in restated.items():
        if memory.is_frozen(name):
            state = node.restate()
            if state is not None:
                memory.freeze(name, state)
                # What changed may be more than its state (a part with no weights of its
                # own replaced: an activation), and what it declares says the rest.
                _declared_again(graph, name, node)


def _retaken(graph: Graph, name: str, node: Node, changed: dict[str, Any]) -> None:
    """Takes the attributes of ``node`` replaced since the build as its constructor
    arguments, and the graph's memory its declaration now. One replaced by a value no key
    can hold (a path made a ``Path``, a ``longdouble`` no float holds exactly) is taken
    too, and the node is refused where its key is needed, naming it, until it is replaced
    again: its key would otherwise go on naming the old value (:func:`_unkeyable`). So is
    one whose constructor made more from the old value than it keeps
    (:func:`_made_otherwise`)."""
    taken = {attr: _plain(value) for attr, value in changed.items()}
    keyable = [attr for attr, value in taken.items() if canonical.is_canonical(value)]
    if keyable and "\0" in name:  # a node interned into another, which runs in its place
        said = ", ".join(f"`{attr}`" for attr in keyable)
        raise AlreadyBuilt(
            f"{said} of a `{type(node).__qualname__}` was changed after the graph was built, "
            f"and that node runs there as `{name.split(chr(0))[0]}` (it was one computation "
            "with it when the graph was built), so the change would not be heard. Build the "
            "graph again"
        )
    if keyable and any(other.startswith(f"{name}\0") for other in graph._kept):
        said = ", ".join(f"`{attr}`" for attr in keyable)
        raise AlreadyBuilt(
            f"{said} of `{name}` was changed after the graph was built, and another node "
            f"built alike runs as `{name}` too (they were one computation when the graph was "
            "built), so the change would change that one's answers as well. Build the graph "
            "again"
        )
    if "\0" not in name:  # one interned into another is keyed, if at all, where it runs
        # A node holding no state is cheap to build, as a worker would; one holding state
        # (weights) is checked against the state it is settled at instead.
        before = None if node.holds_state else _recipe(node)
        node.retake(taken)
        unkeyable = [attr for attr in taken if attr not in keyable]
        refused: Undeclared | None = None
        graph._made_stale.pop(name, None)
        if unkeyable:
            refused = _unkeyable(name, node, unkeyable[0], taken[unkeyable[0]])
        elif before is not None:
            made = _made_otherwise(name, node, taken, before)
            if isinstance(made, _MadeOtherwise):
                graph._made_stale[name] = made
                refused = made.check()
            else:
                refused = made
        if refused is not None:
            graph._unfollowed[name] = refused
        else:
            graph._unfollowed.pop(name, None)
        _declared_again(graph, name, node)
        if not node.is_declaration_fixed():  # a list or a dict now: followed from here on
            graph._unfixed[name] = node
    # What the node keeps now is what is watched from here.
    now = attributes_of(node)
    graph._kept[name] = (node, [(attr, now.get(attr, was)) for attr, was in graph._kept[name][1]])


Recipe = tuple[str | None, tuple[Any, ...], dict[str, Any]]


def _recipe(node: Node) -> Recipe | Unbuildable:
    """How ``node`` is built (:meth:`~somatize.node.Node.recipe`), or why it cannot be."""
    try:
        return node.recipe()
    except Unbuildable as why:
        return why


class _MadeOtherwise:
    """A node whose arguments ``taken`` were replaced, built again from the arguments it had
    and from the new ones: :meth:`check` says why it does not hold what the new build holds
    — an attribute made from its arguments (the two builds hold it apart) still holding
    what was made from the old value, or a declaration other than the new build's — and
    None once it does (the attribute set to what the new value makes)."""

    def __init__(
        self,
        name: str,
        node: Node,
        taken: dict[str, Any],
        head: str,
        fix: str,
        old: Node,
        new: Node,
    ) -> None:
        self.name = name
        self.node = node
        self.taken = taken
        self.head = head
        self.fix = fix
        self.new = new
        was, self.fresh = dict(held_by(old)), dict(held_by(new))
        self.made = [
            a for a in sorted(was.keys() | self.fresh.keys()) if was.get(a) != self.fresh.get(a)
        ]

    def check(self) -> Undeclared | None:
        name, node, kind = self.name, self.node, type(self.node).__qualname__
        built = ", ".join(f"{attr}={value!r}" for attr, value in self.taken.items())
        now = dict(held_by(node))
        stale = [a for a in self.made if a not in self.taken and now.get(a) != self.fresh.get(a)]
        if stale:
            held = ", ".join(f"`{attr}`" for attr in stale)
            return Undeclared(
                f"{self.head}, and {held}, which its constructor makes from its arguments, "
                f"still {'holds' if len(stale) == 1 else 'hold'} what was made from the old "
                f"value: a `{kind}({built})` holds another. Keyed as built with the new value, "
                f"it would keep answers such a node does not compute, under that node's key. "
                f"{self.fix}"
            )
        try:
            declared = node.declaration(name) == self.new.declaration(name)
        except SomatizeError:
            declared = True  # refused where it is keyed, for that reason
        if not declared:
            return Undeclared(
                f"{self.head}, and a `{kind}({built})` declares something else than it does "
                f"now. {self.fix}"
            )
        return None


def _made_otherwise(
    name: str, node: Node, taken: dict[str, Any], before: Recipe | Unbuildable
) -> Undeclared | _MadeOtherwise | None:
    """Why ``node``, whose arguments ``taken`` were just replaced, is not what its class
    builds from its arguments now; None when it is.

    A constructor may make more than the argument it keeps (``self.factor = by * 2``):
    replacing the argument then leaves what was made from the old value, and the node,
    keyed as built with the new value, would keep answers such a node does not compute
    under that node's key, where another recalls them. So the class is built again, as a
    worker builds it, from the arguments the node had (``before``, its recipe then) and
    from the new ones: an attribute the two builds hold apart is made from the
    arguments, and the node must hold what the new build holds. An attribute both builds
    hold alike (a call counter) is the node's own business. Run once per replacement: what
    it finds (a :class:`_MadeOtherwise`) is checked again at every forward, so a node given
    what the new value makes is accepted."""
    kind = type(node).__qualname__
    said = ", ".join(f"`{attr}`" for attr in taken)
    built = ", ".join(f"{attr}={value!r}" for attr, value in taken.items())
    one = len(taken) == 1
    head = (
        f"`{name}` ({kind}) cannot be keyed: {said}, "
        + (
            "an argument it was built with and keeps, was"
            if one
            else "arguments it was built with and keeps, were"
        )
        + " replaced after the graph was built"
    )
    fix = f"Build a new `{kind}` with the new value (`{kind}({built})`) and the graph again"
    try:
        if isinstance(before, Unbuildable):
            raise before
        old = _built_again(node, before)
        new = _built_again(node, node.recipe())
    except Unbuildable as why:
        cause = why.__cause__
        reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(why)
        return Undeclared(
            f"{head}, and a `{kind}` could not be built again from its arguments to check "
            f"that nothing else it holds was made from the old value ({reason}). {fix}"
        )
    found = _MadeOtherwise(name, node, taken, head, fix, old, new)
    return found if found.check() is not None else None


def _built_again(node: Node, recipe: Recipe) -> Node:
    """A new node made by ``recipe`` in this process, of ``node``'s own class, as a worker
    builds one (:meth:`~somatize.catalog.Catalog.build`); Unbuildable when it cannot be."""
    maker, args, kwargs = recipe
    kind = type(node)
    catalog = Catalog(in_process=True)
    identity = node._smz.identity or identity_of(kind) or f"{kind.__module__}:{kind.__qualname__}"
    if maker is None:
        catalog.register(kind, identity)  # this very class, even one with no stable name
    return catalog.build(Blueprint(identity, tuple(args), dict(kwargs), None, maker))


def _unkeyable(name: str, node: Node, attr: str, value: Any) -> Undeclared:
    """Why ``node`` cannot be keyed once its argument ``attr`` was replaced by ``value``,
    which has no canonical form."""
    kind = type(node).__qualname__
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.floating):
        what = (
            f"it is a `numpy.{type(value).__name__}` ({value!r}) that no float holds "
            "exactly, and a key holds numbers only as Python's"
        )
    else:
        what = "it has no canonical form"
        try:
            canonical.encode(value, "it")
        except canonical.NotCanonical as why:
            what = str(why).rstrip(".")
    return Undeclared(
        f"`{name}` ({kind}) cannot be keyed: `{attr}`, an argument it was built with and "
        f"keeps, was replaced after the graph was built, and {what}. Its key would go on "
        "naming the old value while it computes with the new one. Replace it with a value "
        f"that has a canonical form, or build a new `{kind}` with what you mean; a node that "
        "tidies its own argument keeps what it makes under another name (`self._path`)"
    )


def _plain(value: Any) -> Any:
    """A number or a str of a subclass (numpy's ``float64``, an ``IntEnum``), or a numpy
    scalar (``float32``, ``bool_``, a ``longdouble`` a float holds exactly), as the plain
    value it stands for; anything else as it is."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, (int, numbers.Integral)):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    numpy = sys.modules.get("numpy")  # a numpy scalar exists only once numpy is imported
    if numpy is not None and isinstance(value, numpy.generic):
        held = value.item()
        if type(held) in (bool, int, float, bytes):
            return held
        if isinstance(value, numpy.floating):  # a longdouble: .item() hands it back
            near = float(value)
            if near == value or (near != near and value != value):
                return near
    return value


def _declared_again(graph: Graph, name: str, node: Node) -> None:
    """Tells the graph's memory what ``node`` declares now, if that changed. A node that
    cannot be declared any more (a list it was built with given an item with no canonical
    form, or an argument it keeps replaced by one: :func:`_retaken`) has its declaration
    taken back, and the graph holds why: it is refused where its
    key is needed (:func:`static_of`), and a forward without a store, or one that keys
    nothing it feeds, runs it as it is — the same as for a node undeclared when built."""
    memory = graph.memory
    was = memory.declaration_of(name)
    refused = graph._unfollowed.get(name)
    if refused is None:
        try:
            now = node.declaration(name)
        except Undeclared as why:
            refused = why.with_traceback(None)  # raised again where the node is keyed
    if refused is not None:
        graph._undeclared[name] = refused
        if was is not None:
            memory.undeclare(name)
        return
    if now != was:
        graph._undeclared.pop(name, None)
        memory.declared_as(name, now)


def declared_again(memory: Memory, name: str, node: Node) -> None:
    """Tells ``memory`` what ``node``, known there as ``name``, declares now, if that
    changed."""
    was = memory.declaration_of(name)
    try:
        now = node.declaration(name)
    except Undeclared:
        if was is None:
            return  # undeclared when built, and still: refused where it is keyed
        raise
    if now != was:
        memory.declared_as(name, now)


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
    found: Static | None = graph._unkeyed
    if found is not None and found.version == memory.version:
        return found
    static = Static(
        version=memory.version,
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
