"""What is remembered about each node: the fifth fact, beside the graph (what
exists), the catalog (who executes it), the placement (where) and the plan
(when).

Four maps, independent of each other — a node can be frozen without being
cached, identified without being frozen, and any combination of the rest — plus
what each node was built with (its declaration) and which version of its code
the graph was written against (its fingerprint)::

    key(root) = H(content)                        the only place data is hashed
    key(node) = H(identity, declaration, state, salt, keys of its predecessors)

The **identity** is in the key, or two different nodes called ``embed`` would
collide in a shared store; the **declaration** is in for the same reason one
step down, since ``Embed(512)`` and ``Embed(64)`` are one class and two answers.
The **fingerprint** of the code is deliberately not: a cosmetic refactor would
invalidate half the store in silence, so it is kept beside the answer and
compared on a hit. It is the fingerprint of the classes that do the node's work
(``Node.implementing_classes``), which for a node standing for another class — a
torch module's — are that class and its submodules'; what is kept beside an answer
also covers the fingerprints of the nodes it reads (:mod:`somatize.plan`), since an
answer is as stale after an edit above it as after an edit of its own node. The line
runs between what the caller *said* and how it is *written*: only the first can be
pinned down identically in every process, which a key computed on a client and
again on a worker must be.

**A frozen node's state does not change while the graph runs.** That is a
statement about whether an answer may be reused, held here as inert
information: :func:`cacheable` reasons over it, and somebody else makes it true
(``somatize.torch.freeze`` with ``requires_grad_(False)``, ``somatize.data.settle``
by resolving a dataset's version).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from somatize.errors import SomatizeError, _Rebuilt

__all__ = [
    "Memory",
    "MemoryError_",
    "Nameless",
    "NotSettled",
    "Unsettled",
    "cacheable",
    "settled",
    "upstream",
]

NodeId = str


class Shape(Protocol):
    """The little of a graph this module needs: who reads whom."""

    def nodes(self) -> Sequence[NodeId]:
        """Every node, each after everything it reads."""
        ...

    def predecessors(self, node: NodeId) -> Sequence[NodeId]: ...

    def keyed_by_state(self, node: NodeId) -> bool: ...

    def settles(self, node: NodeId) -> bool: ...

    def state_held(self, node: NodeId) -> str | None: ...

    def changed_since_settled(self, node: NodeId) -> str | None: ...

    def kind_of(self, node: NodeId) -> str: ...

    def defined_again(self, node: NodeId) -> bool: ...

    def freezable(self, node: NodeId) -> bool: ...


class Memory:
    """What is remembered about each node. A node not listed has nothing said about
    it, which is the same as nothing being kept."""

    __slots__ = (
        "_cached",
        "_declarations",
        "_fingerprints",
        "_frozen",
        "_identities",
        "_mapped",
        "version",
    )

    def __init__(self) -> None:
        self._frozen: dict[NodeId, str | None] = {}
        self._cached: dict[NodeId, str | None] = {}
        self._mapped: set[NodeId] = set()
        self._identities: dict[NodeId, str] = {}
        self._declarations: dict[NodeId, str] = {}
        self._fingerprints: dict[NodeId, str] = {}
        self.version = 0
        """Bumped on every change, once it is made, so what is derived from memory knows
        when to redo it: what read the version before reading memory (another thread
        deriving it as this one changes it) is redone, never taken as derived from the
        change."""

    # -- identity and declaration -------------------------------------------------

    def identify(self, node: NodeId, what: str) -> str | None:
        """Says what implements ``node``, returning what it was called before."""
        old = self._identities.get(node)
        self._identities[node] = what
        self.version += 1
        return old

    def identity_of(self, node: NodeId) -> str | None:
        """What implements it, if it was said."""
        return self._identities.get(node)

    def declared_as(self, node: NodeId, declaration: str) -> None:
        """Says what ``node`` was built with, as a digest of the arguments that made it.
        The class is half of what a node is; this is the other half. Said again when what
        it was built with changed in place (a list it holds), so its key follows."""
        self._declarations[node] = declaration
        self.version += 1

    def undeclare(self, node: NodeId) -> None:
        """Says ``node`` no longer has a declaration anybody can write: what it was built
        with changed after the build into something no key can hold. Its key is refused
        where it is computed, with the reason the graph holds."""
        self._declarations.pop(node, None)
        self.version += 1

    def declaration_of(self, node: NodeId) -> str | None:
        """What it was built with, if anybody could say. Absent is no reason to refuse
        a key by itself; the key is refused where it is computed."""
        return self._declarations.get(node)

    # -- frozen --------------------------------------------------------------------

    def freeze(self, node: NodeId, state: str | None = None) -> None:
        """Says ``node``'s state does not change from here on, with the digest of the
        state it is settled at. Said twice on purpose: ``.frozen()`` says it with no
        digest, and whoever can hash the weights or resolve the dataset says it
        again with one."""
        if state is None and self._frozen.get(node) is not None:
            self.version += 1
            return
        self._frozen[node] = state
        self.version += 1

    def is_frozen(self, node: NodeId) -> bool:
        """Whether ``node``'s state was said not to change."""
        return node in self._frozen

    def unsettle(self, node: NodeId) -> None:
        """Takes back the digest of the state a frozen ``node`` was settled at, which it no
        longer holds: it stays frozen, and is refused where its key is needed until it is
        settled again."""
        if self._frozen.get(node) is not None:
            self._frozen[node] = None
            self.version += 1

    def state_of(self, node: NodeId) -> str | None:
        """The digest of the state it is frozen at, if it is frozen and has one."""
        return self._frozen.get(node)

    # -- cached --------------------------------------------------------------------

    def cache(self, node: NodeId, salt: str | None = None) -> None:
        """Says ``node``'s output is worth keeping, with the caller's salt if any —
        how you tell apart two runs the key cannot."""
        self._cached[node] = salt
        self.version += 1

    def is_cached(self, node: NodeId) -> bool:
        """Whether ``node``'s output is kept. Not being kept is no break in the chain:
        its key is still computed and passed on."""
        return node in self._cached

    def salt_of(self, node: NodeId) -> str | None:
        """The salt it is cached under, if it is cached and has one."""
        return self._cached.get(node)

    # -- mapped --------------------------------------------------------------------

    def map(self, node: NodeId) -> None:
        """Says ``node`` maps over the items of its input: a list in, a list as long
        out, item ``i`` out from item ``i`` in. What makes a cache work item by item:
        one new document among a thousand runs once instead of missing all thousand.
        It is in the node's keys: item ``v`` of it is another question than the same
        node, unmapped, handed ``v`` whole."""
        self._mapped.add(node)
        self.version += 1

    def is_mapped(self, node: NodeId) -> bool:
        """Whether ``node`` was said to map over its items."""
        return node in self._mapped

    # -- fingerprints --------------------------------------------------------------

    def written_as(self, node: NodeId, fingerprint: str) -> str | None:
        """Notes which version of the code this graph was written against.
        **Metadata**: never in a key, only compared on a hit."""
        old = self._fingerprints.get(node)
        self._fingerprints[node] = fingerprint
        self.version += 1
        return old

    def fingerprint_of(self, node: NodeId) -> str | None:
        """Which version of the code it was written against, if it was noted."""
        return self._fingerprints.get(node)

    # -- as a whole ----------------------------------------------------------------

    def __len__(self) -> int:
        """How many nodes have anything said about them at all."""
        return len(
            set(self._frozen)
            | set(self._cached)
            | self._mapped
            | set(self._identities)
            | set(self._declarations)
            | set(self._fingerprints)
        )

    def is_empty(self) -> bool:
        """Whether nothing has been said about any node, which lets the engine skip all
        of this."""
        return len(self) == 0

    def cached(self) -> Iterator[NodeId]:
        """The nodes whose output is kept."""
        return iter(self._cached)

    def frozen(self) -> Iterator[NodeId]:
        """The nodes said not to change."""
        return iter(self._frozen)


# ------------------------------------------------------------------------- refusals


class MemoryError_(SomatizeError, ValueError):
    """What a graph says to keep cannot honestly be kept."""


class Unsettled(_Rebuilt, MemoryError_):
    """Something a cached node depends on can still change.

    ``never``: what the node that can change is (its class), when it can never be
    frozen (a stream, answering whatever is newest); the refusal then says to drop
    ``.cached()`` rather than to freeze it."""

    def __init__(self, cached: NodeId, moving: NodeId, never: str = "") -> None:
        self.cached, self.moving = cached, moving
        if never:
            message = (
                f"`{cached}` keeps its output and `{moving}`, which it reads, is not frozen: an "
                f"output is only reusable if nothing above it can change, and `{moving}` (a "
                f"`{never}`) can never be frozen, so nothing below it can be kept. Drop "
                f"`.cached()` from `{cached}`"
            )
        elif cached == moving:
            message = (
                f"`{cached}` keeps its output and is not frozen: what is worth keeping is what "
                "does not change, and a node that still trains gets a new key every run. "
                f"Declare it `.frozen()`, or drop `.cached()`"
            )
        else:
            message = (
                f"`{cached}` keeps its output and `{moving}`, which it reads, is not frozen: an "
                "output is only reusable if nothing above it can change. Declare "
                f"`{moving}` `.frozen()`, or drop `.cached()` from `{cached}`"
            )
        super().__init__(message)


class Nameless(_Rebuilt, MemoryError_):
    """Something a cached node depends on has no identity, so no key."""

    def __init__(
        self, cached: NodeId, nameless: NodeId, kind: str = "", again: bool = False
    ) -> None:
        self.cached, self.nameless, self.again = cached, nameless, again
        what = f" (a `{kind}`)" if kind else ""
        fix = (
            "Define it at module level rather than inside a function, or give it a stable "
            "name with `.identified('package.module:Name')`, a name of its class's own (each "
            "class a factory makes needs one: two classes under one name share their keys)"
        )
        if again:
            fix = (
                f"Its class was defined again after `{nameless}` was made (its notebook cell "
                "run again, or its module reloaded), and the class's name leads to the one "
                f"made then: make `{nameless}` again from its class as it is now"
            )
        if cached == nameless:
            message = (
                f"`{cached}`{what} keeps its output and nobody said what implements it, so "
                f"there is nothing to build its key out of. {fix}"
            )
        else:
            message = (
                f"`{cached}` keeps its output and nobody said what implements `{nameless}`"
                f"{what}, which it reads: a chain of keys with a hole in it reaches nothing "
                f"below. {fix}"
            )
        super().__init__(message)


class NotSettled(_Rebuilt, MemoryError_):
    """A node declared frozen holds state whose digest nobody has worked out.

    ``settles``: the node says its own state (``settled_state()``, as a data source
    does), so ``somatize.data.settle`` is what settles it. ``held``: what a library says
    the node keeps (a module with weights, as an attribute of a plain node), in words.
    ``changed``: what changed in the node since it was settled, in words."""

    def __init__(
        self,
        node: NodeId,
        kind: str,
        settles: bool = False,
        held: str | None = None,
        changed: str | None = None,
    ) -> None:
        self.node = node
        if changed is not None:
            message = (
                f"`{node}` is declared frozen and was settled, and since then {changed}. Its "
                "key names the state it was settled at, so an answer kept for that state would "
                "be handed back for this one, and one computed now kept as that state's. "
                "Call `somatize.data.settle(g)` again to key it by the state it holds now"
            )
        elif held is not None:
            message = (
                f"`{node}` is declared frozen and {held}, and nobody has settled it: those "
                "weights are its state, and without their digest in its key two instances of "
                f"`{kind}` keeping other weights would be kept under one name and you would "
                "get the other one's answer back. Make the module the node "
                "(`somatize.torch.ModuleNode(module)`, or a node class that is itself an "
                "`nn.Module`) and call `somatize.torch.freeze(g)`; or give "
                f"`{kind}` a `settled_state()` returning the digest of what it keeps "
                "(`somatize.torch.digest_named(module.state_dict())`) and call "
                "`somatize.data.settle(g)`"
            )
        elif settles:
            message = (
                f"`{node}` is declared frozen and has state, and nobody has settled it: the "
                "version of the dataset it reads is what puts it in its key, so without it "
                f"two different datasets read by `{kind}` would be kept under one name and you "
                "would get the other one's answers back. Call `somatize.data.settle(g)` before "
                "running"
            )
        else:
            message = (
                f"`{node}` is declared frozen and has state, and nobody has settled it: the "
                "digest of what it is settled at — weights, or the dataset it reads — is what "
                f"puts it in its key, so without it two different states of `{kind}` would be "
                "kept under one name and you would get the other one back. Call "
                "`somatize.torch.freeze(g)` before running — or `somatize.data.settle(g)` if "
                "what it holds is a dataset"
            )
        super().__init__(message)


def upstream(graph: Shape, *nodes: NodeId) -> list[NodeId]:
    """``nodes`` and everything they read, transitively, **nearest first** — so what an
    error names is the closest thing to the problem and not the furthest. Each node is
    walked once however many of ``nodes`` read it: what a graph's cached nodes need is
    one walk, not one per cached node (a chain of a thousand cached nodes would walk
    half a million)."""
    out = list(dict.fromkeys(nodes))
    seen = set(out)
    at = 0
    while at < len(out):
        for above in graph.predecessors(out[at]):
            if above not in seen:
                seen.add(above)
                out.append(above)
        at += 1
    return out


def cacheable(graph: Shape, memory: Memory) -> None:
    """Raises unless what ``graph`` says to keep can honestly be kept.

    A node's output can be kept if nothing upstream of it can change — itself
    included. Freezing the node alone is not enough: what is restored from a
    store is a leaf, so the backward pass stops there and everything above it
    quietly stops training. The same rule falls out without mentioning
    gradients — the state digest is in the key, so a node that keeps changing
    never hits and only fills the store. Being identified is checked in the same
    walk, since a chain of keys with a hole in it delivers no key below.
    """
    # Which nodes have an offender at or above them, in one pass (each node comes after
    # everything it reads): only the first cached one of those is walked, nearest first,
    # for the offender to name, so a graph of many cached nodes costs a walk of each edge,
    # not one walk of its whole upstream per cached node.
    doubtful: set[NodeId] = set()
    for node in graph.nodes():
        if (
            not memory.is_frozen(node)
            or memory.identity_of(node) is None
            or not doubtful.isdisjoint(graph.predecessors(node))
        ):
            doubtful.add(node)
    for node in graph.nodes():
        if node not in doubtful or not memory.is_cached(node):
            continue
        for above in upstream(graph, node):
            if not memory.is_frozen(above):
                never = "" if graph.freezable(above) else graph.kind_of(above)
                raise Unsettled(node, above, never)
            if memory.identity_of(above) is None:
                raise Nameless(node, above, graph.kind_of(above), graph.defined_again(above))


def settled(graph: Shape, memory: Memory, among: Iterable[NodeId] | None = None) -> None:
    """Raises :class:`NotSettled` for the first frozen node (of ``among``, or of the
    whole graph) that holds state with no digest: one that says so, or one that says its
    state itself (``settled_state()``, a source of one's own that never said
    ``holds_state``), whose key would otherwise name none — or no longer names the one it
    holds, changed since it was settled."""
    for node in graph.nodes() if among is None else among:
        if memory.is_frozen(node) and memory.state_of(node) is None and graph.keyed_by_state(node):
            raise NotSettled(
                node,
                graph.kind_of(node),
                graph.settles(node),
                graph.state_held(node),
                graph.changed_since_settled(node),
            )
