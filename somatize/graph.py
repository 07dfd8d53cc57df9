"""The graph: which nodes exist and who reads whom.

``Graph.somatize(a >> b >> c)`` turns an expression into a graph. Building it is
also where **hash-consing** happens: a settled node — frozen, with an identity
and a declaration that stays as it is, and a state if it holds one or says one
(``settled_state()``) — is interned
on its key parts (identity, declaration, salt, mapped, placement, and the nodes it
reads), on the classes whose code computes it (two classes given one identity stay two
nodes) and on what it holds (its public attributes with a canonical form, by
value, in its ``__dict__`` or in ``__slots__``). The same frozen computation
written twice is therefore one node, computed once; no merge pass exists, and
equality of settled nodes is identity. A node built with a list or a dict is
never interned: whoever holds the list can change it after the build, and two
nodes equal now would then be two computations. Nor is a node that sees its own
state change (:meth:`~somatize.node.Node.restate`: a torch module), for the same
reason: a checkpoint loaded into one since it was settled, before the build or
after it, is heard at a forward, where one interned into another does not run.
Sharing the computation changes nothing for what reads it: a node gets one
argument per edge, in order, even when two edges come from one interned node
(and its key reads that node's key twice), and each declared output keeps its
slot.

Building a graph settles what was said about its nodes: the graph copies it into
its memory and placement, and the nodes refuse to be told anything new
(:class:`~somatize.node.AlreadyBuilt`).

Every node gets a name: the one it was given with ``.named()``, or one derived
from its class (``Clean`` → ``clean``, then ``clean_2``). Names are how facts,
errors and figures speak of nodes; they are not part of any key.

The graph knows nothing of when it runs or where answers live; ``forward`` hands
it to the engine.
"""

from __future__ import annotations

import inspect
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from somatize._threads import ProcessLock
from somatize.catalog import (
    defined_again,
    fingerprint_of,
    identity_of,
    marks_moved,
    watch_code,
)
from somatize.engine import run
from somatize.errors import SomatizeError
from somatize.memory import Memory
from somatize.node import (
    Expr,
    Marks,
    Node,
    Undeclared,
    digest_of,
    held_by,
    holds_state,
    keyed_by_state,
    says_state,
    slots_of,
    state_held,
    tells_state,
)
from somatize.placement import Placement
from somatize.store import Store
from somatize.store.base import current_directory

if TYPE_CHECKING:
    from somatize.engine import Record
    from somatize.figure import Figure

__all__ = ["Cycle", "Graph", "GraphError", "UnknownNode"]


class GraphError(SomatizeError, ValueError):
    """A graph that cannot be built or asked about as written."""


class Cycle(GraphError):
    """The expression feeds a node into itself."""


class UnknownNode(GraphError, KeyError):
    """A node name the graph does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower() or "node"


class Graph:
    """Nodes and who reads whom, with what is remembered about each (``memory``) and
    where each runs (``placement``)."""

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._preds: dict[str, tuple[str, ...]] = {}
        self._succs: dict[str, list[str]] = {}
        self._aliases: dict[str, str] = {}
        self._outputs: tuple[str, ...] = ()
        self._undeclared: dict[str, Undeclared] = {}
        # Nodes built with a list or dict, and nodes that can see their own state change:
        # looked at again at the start of every forward (plan.look_again).
        self._unfixed: dict[str, Node] = {}
        self._restated: dict[str, Node] = {}
        self._followed: dict[str, int] = {}
        """Each node of :attr:`_restated`, by name, with the count of changes it told
        (:attr:`~somatize.node.Marks.moved`) this graph last followed."""
        self._settled_watches: dict[str, Callable[[], str | None]] = {}
        """Nodes ``somatize.data.settle`` settled by their ``settled_state()`` that hold
        state a library watches (a torch module's weights), by name, with the watch: asked
        at every forward, since the node's own method is heard only when settling."""
        self._changed_since_settled: dict[str, str] = {}
        """Such nodes a watch found changed, with what changed, in words: refused where they
        are keyed until they are settled again, or hold the state settled again
        (plan.look_again)."""
        self._refused_settled: dict[str, tuple[str, Callable[[], str | None] | None]] = {}
        """Each node of :attr:`_changed_since_settled`, with the digest it was settled at
        and a watch of what it holds taken when it was last found changed: once that watch
        finds it touched, it is asked whether it holds the settled state again."""
        self._kept: dict[str, tuple[Node, list[tuple[str, Any]]]] = {}
        """Nodes keeping constructor arguments as attributes, by name, with what they were
        handed (see :meth:`~somatize.node.Node.kept_arguments`); an interned node's other
        names too, whose nodes no longer run."""
        self._named_like: dict[str, tuple[Node, list[tuple[str, Any, str | None]]]] = {}
        """Nodes holding attributes named like a constructor parameter that are not the
        argument (see :meth:`~somatize.node.Node.named_like_arguments`), or public ones their
        constructor set (:meth:`~somatize.node.Node.set_up_attributes`), by name, an interned
        node's other names too: each attribute with the object it holds, and the canonical
        digest of what it held when the graph was built (None when it had none)."""
        self._remade: dict[str, Undeclared] = {}
        """Nodes such an attribute of which was replaced by what neither it held when the
        graph was built nor a build from the node's arguments holds, with why: refused where
        they are keyed until it holds one of them again (_look_again._looked_at_named_like)."""
        self._unfollowed: dict[str, Undeclared] = {}
        """Nodes an argument of which was replaced by what their key cannot follow, with
        why: refused where they are keyed until it is replaced again (_look_again._retaken)."""
        self._made_stale: dict[str, Any] = {}
        """Nodes an argument of which was replaced where their constructor made more from
        it, with what a build from the new value holds: refused at every forward that finds
        them holding what was made from the old value, and only then (plan.look_again)."""
        self._in_place: dict[str, str] = {}
        """Nodes built with a list or a dict, by name, with the declaration each was last
        looked at with for a change in place (_look_again._changed_in_place)."""
        self._kept_watch: tuple[
            list[dict[str, Any]],
            list[str],
            list[Any],
            list[tuple[Any, Node, Any]],
            list[tuple[Marks, int]],
        ] = ([], [], [], [], [])
        """The same, flat, for one look at every forward: each node's attributes, the name
        of each kept argument, and the object it should still be; for an argument kept
        in a slot, the slot's descriptor, the node and that object; and each node's marks
        with the count of its arguments taken (:attr:`~somatize.node.Marks.retaken`), by
        this graph or another built with it, when this one last looked."""
        self.memory = Memory()
        self.placement = Placement()
        self.record: Record | None = None
        """What happened in the forward that ended last, or None before the first: set as a
        forward ends, or fails, so a forward that a node's forward started on this graph, or
        one another thread started later and that ended first, does not stand for it."""
        self._stores: dict[str, tuple[Store, bytes | None]] = {}
        """Each store ``store=`` named by a path or URL, by what that names from anywhere,
        with the path of a local one as the bytes :func:`os.access` takes."""
        self._numbered: dict[str, int] = {}
        """For each name derived from a class, the number the next one is tried at."""
        self._static: Any = None
        self._unkeyed: Any = None
        self._looking = ProcessLock()
        """Held by a forward as it looks at the graph again and derives what its keys need
        from that look (engine.run): one thread's forward keys its nodes by what it saw,
        not partly by what another thread's forward saw after it."""
        self._code_watch = watch_code(())
        """What the fingerprints of the nodes' code were worked out from, laid out for one
        look at every forward (plan.look_again): a method set on a class since is seen."""

    def __getstate__(self) -> dict[str, Any]:
        """What a copy is made from: all but what is watched of the nodes' classes, which
        a copy watches afresh (a class's namespace cannot be copied) — once the
        fingerprints it copies are those of the code as it is now."""
        if not self._code_watch.looks_same():
            self._written_again()
        state = dict(vars(self))
        del state["_code_watch"]
        del state["_looking"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Fills in a copy (``copy.deepcopy``, an unpickled graph): its nodes, copies too, are
        in this graph, which took what was said about them, so they refuse to be told
        anything new, as the original's do (a node copied on its own is in no graph). The
        attributes it watches for a replaced argument are the copied nodes' own: a node's
        ``__dict__`` is filled in afresh when it is copied, not the dict the original's watch
        was copied to."""
        # A graph pickled before nodes settled by their `settled_state()` were watched.
        state.setdefault("_settled_watches", {})
        state.setdefault("_changed_since_settled", {})
        state.setdefault("_refused_settled", {})
        vars(self).update(state)
        self._looking = ProcessLock()
        for node in (
            *self._nodes.values(),
            *(node for node, _ in self._kept.values()),
            *(node for node, _ in self._named_like.values()),
        ):
            node._smz.built = True
        self.watch_kept()
        self.watch_code()

    # -- building -------------------------------------------------------------------------

    @classmethod
    def somatize(cls, expr: Node | Expr | Sequence[Any]) -> Graph:
        """The graph of ``expr``: nodes chained with ``>>``, tuples for fan-out and fan-in.
        A node whose forward is ``async def`` (and does not yield) is refused: a forward is
        called, and what it returns handed on, never awaited. One a decorator hides is
        refused when it answers its own coroutine (NodeFailed)."""
        expr = Expr.of(expr)
        graph = cls()
        order = _topological(expr)
        preds_of: dict[int, list[Node]] = {id(n): [] for n in expr.nodes}
        for source, target in expr.edges:
            preds_of[id(target)].append(source)

        taken = graph._explicit_names(order)
        placed: dict[int, str] = {}
        interned: dict[tuple[Any, ...], str] = {}
        for node in order:
            # One per edge, duplicates kept: a node given twice (`(a, a) >> j`), or two
            # nodes interned to one, hand it two arguments, and its key reads that
            # predecessor twice.
            preds = tuple(placed[id(p)] for p in preds_of[id(node)])
            marks = node._smz
            declaration: str | None = None
            try:
                declaration = node.declaration(marks.name)
            except Undeclared as why:
                undeclared: Undeclared | None = why
            else:
                undeclared = None
            identity = marks.identity or identity_of(type(node))
            intern = None
            if (
                marks.frozen
                and identity is not None
                and declaration is not None
                and (not keyed_by_state(node) or marks.state is not None)
                and node.is_declaration_fixed()
                and not node.replaced_since_made()  # its declaration follows at the first forward
                # One that sees its own state change (a torch module, a checkpoint loaded into
                # it) may hold other weights already than its state says, or come to: its class
                # says so, or a library that knows a kind it is (a node that is an nn.Module).
                and not tells_state(node)
            ):
                intern = (
                    identity,
                    # The classes too: two a factory made, given one name (`.identified`),
                    # are keyed alike and still run other code, each its own.
                    node.implementing_classes(),
                    declaration,
                    marks.state,
                    marks.cached,
                    marks.salt,
                    marks.mapped,
                    marks.worker,
                    preds,
                    held_by(node),
                )
                same = interned.get(intern)
                if same is not None:
                    placed[id(node)] = same
                    name = marks.name
                    if name and name != same:
                        held = graph._aliases.get(name, name if name in graph._nodes else same)
                        if held != same:
                            raise graph._named_twice(name, node)
                        graph._aliases[name] = same
                    kept = node.kept_arguments()
                    if kept:  # changed later, it would not be heard: it no longer runs
                        graph._kept[f"{same}\0{len(graph._kept)}"] = (node, kept)
                    like = node.named_like_arguments() + node.set_up_attributes()
                    if like:
                        graph._named_like[f"{same}\0{len(graph._named_like)}"] = (
                            node,
                            _watched(like),
                        )
                    continue
            name = marks.name if marks.name else graph._derived_name(node, taken)
            if name in graph._nodes or name in graph._aliases:
                raise graph._named_twice(name, node)
            placed[id(node)] = name
            if intern is not None:
                interned[intern] = name
            graph._add(name, node, preds, identity, declaration, undeclared)
        graph.watch_kept()
        graph.watch_code()
        # A node written twice among the outputs is one output (`(a >> j, b >> j)` ends in
        # `j`); two nodes interned to one keep a slot each.
        graph._outputs = tuple(placed[i] for i in dict.fromkeys(map(id, expr.outputs)))
        for node in order:
            node._smz.built = True
        return graph

    def watch_kept(self) -> None:
        """Lays out :attr:`_kept` flat, for the look at every forward."""
        held: list[dict[str, Any]] = []
        names: list[str] = []
        values: list[Any] = []
        slotted: list[tuple[Any, Node, Any]] = []
        taken = [(node._smz, node._smz.retaken) for node, _ in self._kept.values()]
        watched = [
            *self._kept.values(),
            *((node, [(a, v) for a, v, _ in like]) for node, like in self._named_like.values()),
        ]
        for node, arguments in watched:
            slots = dict(slots_of(type(node)))
            for name, value in arguments:
                if name in slots:
                    slotted.append((slots[name], node, value))
                    continue
                held.append(vars(node))
                names.append(name)
                values.append(value)
        self._kept_watch = (held, names, values, slotted, taken)

    def watch_code(self) -> None:
        """Lays out what the fingerprints of the nodes' code were worked out from, for the
        look at every forward (:func:`~somatize.catalog.watch_code`)."""
        self._code_watch = watch_code(
            kind for node in self._nodes.values() for kind in node.implementing_classes()
        )

    def _written_again(self) -> None:
        """Notes in the memory each node's code fingerprint as it is now, where it changed
        since it was worked out (a method set on a class, or deleted from it), and watches
        the code as it is now. A changed fingerprint makes a new state of the memory."""
        memory = self.memory
        marks_moved(self._code_watch.marks)  # an object marked by which it is, changed: marked anew
        # Taken first: what is set while the fingerprints are worked out is seen next time.
        watch = watch_code(
            kind for node in self._nodes.values() for kind in node.implementing_classes()
        )
        for name, node in self._nodes.items():
            now = fingerprint_of(*node.implementing_classes())
            if now != memory.fingerprint_of(name):
                memory.written_as(name, now)
        self._code_watch = watch

    def _named_twice(self, name: str, node: Node) -> GraphError:
        other = self._nodes[self._aliases.get(name, name)]
        return GraphError(
            f"two different nodes are named `{name}` ({other!r} and {node!r}); names are how "
            "facts and errors tell nodes apart. Rename one"
        )

    def _explicit_names(self, order: Sequence[Node]) -> set[str]:
        return {n._smz.name for n in order if n._smz.name}

    def _derived_name(self, node: Node, taken: set[str]) -> str:
        base = _snake(type(node).__name__)
        # Names are only ever taken, so the count a base's last name was found at is where
        # the next one starts: a thousand nodes of one class are named in as many looks.
        numbered = self._numbered
        at = numbered.get(base, 1)
        name = base if at == 1 else f"{base}_{at}"
        while name in taken or name in self._nodes:
            at += 1
            name = f"{base}_{at}"
        numbered[base] = at + 1
        taken.add(name)
        return name

    def _add(
        self,
        name: str,
        node: Node,
        preds: tuple[str, ...],
        identity: str | None,
        declaration: str | None,
        undeclared: Undeclared | None,
    ) -> None:
        marks = node._smz
        forward = getattr(node, "forward", None)
        # An object whose `__call__` is `async def` makes a coroutine as one does; an
        # `async def` that yields hands on its stream, as a generator is handed on.
        if inspect.iscoroutinefunction(forward) or (
            not inspect.isroutine(forward)
            and inspect.iscoroutinefunction(inspect.getattr_static(type(forward), "__call__", None))
        ):
            kind = type(node).__qualname__
            raise GraphError(
                f"`{name}` ({kind}) has an `async def forward`: a graph calls a node's forward "
                "and hands on what it returns, without awaiting it, so it would hand on a "
                "coroutine, not its answer. Write `def forward(self, x, ctx)`; to await inside "
                "it, run its own loop (`asyncio.run(...)`), or, where the forward is called "
                "inside a running loop (a notebook, an async server), call the forward "
                "through `asyncio.to_thread`"
            )
        self._nodes[name] = node
        self._preds[name] = preds
        self._succs[name] = []
        for pred in dict.fromkeys(preds):
            self._succs[pred].append(name)
        memory = self.memory
        if identity is not None:
            memory.identify(name, identity)
        if declaration is not None:
            memory.declared_as(name, declaration)
        if undeclared is not None:
            self._undeclared[name] = undeclared
        if not node.is_declaration_fixed():
            self._unfixed[name] = node
        if tells_state(node):
            self._restated[name] = node
            self._followed[name] = marks.moved
        kept = node.kept_arguments()
        if kept:
            self._kept[name] = (node, kept)
        like = node.named_like_arguments() + node.set_up_attributes()
        if like:
            self._named_like[name] = (node, _watched(like))
        if marks.frozen:
            memory.freeze(name, marks.state)
        if marks.cached:
            memory.cache(name, marks.salt)
        if marks.mapped:
            memory.map(name)
        memory.written_as(name, fingerprint_of(*node.implementing_classes()))
        if marks.worker is not None:
            self.placement.place(name, marks.worker)

    # -- asking -----------------------------------------------------------------------------

    def nodes(self) -> tuple[str, ...]:
        """Every node's name, each after everything it reads."""
        return tuple(self._nodes)

    def node(self, name: str) -> Node:
        """The node called ``name``."""
        return self._nodes[self.resolve(name)]

    __getitem__ = node

    def resolve(self, name: str) -> str:
        """The graph's own name for ``name`` (an alias of an interned node resolves to it)."""
        if isinstance(name, str):
            if name in self._nodes:
                return name
            if name in self._aliases:
                return self._aliases[name]
        known = ", ".join(f"`{n}`" for n in self._nodes)
        if isinstance(name, Node):
            asked = "a graph is asked about a node by its name"
            raise UnknownNode(f"{asked}; {self._by_name(name)}; it has {known}")
        raise UnknownNode(f"this graph has no node named `{name}`; it has {known}")

    def _by_name(self, node: Node) -> str:
        """What ``node`` itself, given where its name is asked for, should have been."""
        name = next((n for n, held in self._nodes.items() if held is node), node._smz.name)
        named = f"its name, `{name!r}`" if name else "its name (`g.nodes()` lists them)"
        return f"got the node {node!r} itself: pass {named}"

    def predecessors(self, name: str) -> tuple[str, ...]:
        """What ``name`` reads, in the order its forward receives them."""
        return self._preds[self.resolve(name)]

    def successors(self, name: str) -> tuple[str, ...]:
        """What reads ``name``."""
        return tuple(self._succs[self.resolve(name)])

    def roots(self) -> tuple[str, ...]:
        """The nodes handed the graph's input."""
        return tuple(n for n in self._nodes if not self._preds[n])

    @property
    def outputs(self) -> tuple[str, ...]:
        """The nodes whose values ``forward`` returns, in order."""
        return self._outputs

    def holds_state(self, name: str) -> bool:
        """Whether ``name`` holds state a frozen declaration must be settled at."""
        return holds_state(self.node(name))

    def keyed_by_state(self, name: str) -> bool:
        """Whether ``name``, frozen, is keyed by a state it is settled at
        (:func:`somatize.node.keyed_by_state`)."""
        return keyed_by_state(self.node(name))

    def state_held(self, name: str) -> str | None:
        """What ``name`` holds, in words, where a library says so and its class does not
        (:func:`somatize.node.state_held`)."""
        return state_held(self.node(name))

    def changed_since_settled(self, name: str) -> str | None:
        """What changed in ``name`` since ``somatize.data.settle`` settled it, in words, when
        a forward found it changed; None otherwise."""
        return self._changed_since_settled.get(name)

    def settled_with(self, name: str) -> tuple[str | None, Callable[[], str | None] | None]:
        """The digest ``name`` was last settled at by its ``settled_state()`` (refused since
        or not), with the watch taken then; None for either this graph does not hold."""
        refused = self._refused_settled.get(name)
        state = refused[0] if refused is not None else self.memory.state_of(name)
        return state, self._settled_watches.get(name)

    def watch_settled(self, name: str, watch: Callable[[], str | None] | None) -> None:
        """Watches what ``name`` holds with ``watch`` (taken as it was settled), from its
        next forward on; None: nothing it holds is watched."""
        self._changed_since_settled.pop(name, None)
        self._refused_settled.pop(name, None)
        if watch is None:
            self._settled_watches.pop(name, None)
        else:
            self._settled_watches[name] = watch

    def settles(self, name: str) -> bool:
        """Whether ``name`` says the state it is frozen at itself (``settled_state()``, as a
        data source does), so that ``somatize.data.settle`` settles it."""
        return says_state(self.node(name))

    def kind_of(self, name: str) -> str:
        """What ``name`` is, for people: its class (see :meth:`Node.kind_name`)."""
        return self.node(name).kind_name()

    def defined_again(self, name: str) -> bool:
        """Whether the class of ``name`` was defined again after it was made (a notebook's
        cell run again), so that its name leads to another class now."""
        return defined_again(type(self.node(name)))

    def freezable(self, name: str) -> bool:
        """Whether ``name`` can be declared frozen at all: not a node that answers whatever
        is newest (a stream), whose class says ``freezable = False``."""
        return getattr(self.node(name), "freezable", True) is not False

    def undeclared(self, name: str) -> Undeclared | None:
        """Why ``name`` has no declaration, if it has none."""
        return self._undeclared.get(self.resolve(name))

    def items(self) -> Iterator[tuple[str, Node]]:
        """``(name, node)`` pairs, in order."""
        return iter(self._nodes.items())

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[str]:
        """Every node's name, in order (:meth:`nodes`), as a graph is looked into by name."""
        return iter(tuple(self._nodes))

    def __contains__(self, name: object) -> bool:
        if isinstance(name, Node):
            raise TypeError(f"`in` asks a graph for a node's name; {self._by_name(name)}")
        return isinstance(name, str) and (name in self._nodes or name in self._aliases)

    # -- running ----------------------------------------------------------------------------

    def forward(
        self,
        x: Any,
        store: Store | str | os.PathLike[str] | None = None,
        watching: Callable[[dict[str, Any]], Any] | None = None,
        broker: Any = None,
        *,
        strict: bool = False,
        outputs: str | Sequence[str] | None = None,
    ) -> Any:
        """Runs the graph on ``x`` and returns its output (a tuple when it has several).

        With a ``store`` (a :class:`~somatize.Store`, a directory or a bucket URL), cached nodes
        whose answers are kept are recalled and what only they needed is spared;
        what runs and is cached is kept. ``watching`` is called with a copy of each fact,
        in order; if it raises, the forward finishes without it, keeping what it runs,
        then raises :class:`~somatize.WatcherFailed`. ``broker`` runs placed nodes on
        their workers. ``strict`` recomputes an answer whose code fingerprint differs
        instead of warning. ``outputs`` asks for other nodes' values than the graph's
        outputs — a name (its value is handed back), or names in a list or tuple (a tuple
        of their values in that order, one name too); a node they do not need is spared
        too.
        """
        return run(
            self,
            x,
            store=self._store(store),
            watching=watching,
            broker=broker,
            strict=strict,
            outputs=outputs,
        )

    def _store(self, store: Store | str | os.PathLike[str] | None) -> Store | None:
        """The store ``store=`` names; one opened from a path is kept for the next forward
        that names the same directory — a relative path taken from where the program is
        now, and one removed since (a cache cleared with ``rm -rf``) opened afresh, as
        ``Store(path)`` would."""
        if not isinstance(store, (str, Path)):
            return Store.of(store)
        where = store if type(store) is str else str(store)
        # Kept under what the text names from anywhere: an absolute path or a URL is that
        # already, and found as given; a relative path is anchored first.
        kept = self._stores.get(where)
        named = where
        if kept is None:
            named = _anchored(where)
            kept = self._stores.get(named)
        if kept is not None:
            found, path = kept
            # Looked for at each forward (one call, the least the filesystem answers, with
            # the path already as the bytes it takes): a directory removed since is made
            # again, as the path names no store now.
            if path is None or os.access(path, os.F_OK):
                return found
        opened = Store.of(where)
        assert opened is not None
        self._stores[named] = (opened, os.fsencode(named) if _local(where) else None)
        return opened

    # -- showing ----------------------------------------------------------------------------

    def figure(self, record: Record | None = None) -> Figure:
        """A picture of this graph; with a ``record`` (``g.record``), of what happened."""
        from somatize.show import figure_of

        return figure_of(self, record)

    def __str__(self) -> str:
        from somatize.show import listing

        return listing(self)

    def __repr__(self) -> str:
        return f"<Graph of {len(self._nodes)} nodes: {', '.join(self._nodes)}>"


def _watched(like: list[tuple[str, Any]]) -> list[tuple[str, Any, str | None]]:
    """Attributes named like an argument (``(name, value)``), each with the canonical digest
    of its value, or None when it has none."""
    return [(name, value, digest_of(value)) for name, value in like]


def _local(where: str) -> bool:
    """Whether ``store=where`` names a local directory (not a bucket's URL)."""
    return bool(where) and "://" not in where


def _anchored(where: str) -> str:
    """The path ``store=where`` names from anywhere, as ``Store(path)`` anchors it: `~`
    expanded, then from the current directory, and `..` left to the filesystem (past a
    link, `a/../b` is not `b`); a URL, or an absolute path, as it is."""
    if not _local(where) or where.startswith(os.sep):
        return where
    tilde = where.startswith("~")
    return os.path.join(current_directory(where), os.path.expanduser(where) if tilde else where)


def _topological(expr: Expr) -> list[Node]:
    """The expression's nodes, each after everything that feeds it; Cycle if impossible."""
    waiting = {id(n): 0 for n in expr.nodes}
    after: dict[int, list[Node]] = {id(n): [] for n in expr.nodes}
    linked: set[tuple[int, int]] = set()
    for source, target in expr.edges:
        pair = (id(source), id(target))
        if pair not in linked:
            linked.add(pair)
            after[id(source)].append(target)
            waiting[id(target)] += 1
    ready = deque(n for n in expr.nodes if waiting[id(n)] == 0)
    order: list[Node] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for successor in after[id(node)]:
            waiting[id(successor)] -= 1
            if waiting[id(successor)] == 0:
                ready.append(successor)
    if len(order) != len(expr.nodes):
        raise _cycle_in(expr, {id(n) for n in expr.nodes if waiting[id(n)] > 0})
    return order


def _cycle_in(expr: Expr, stuck: set[int]) -> Cycle:
    """The refusal of ``expr``, whose nodes ``stuck`` (by id) never come to be ready: it
    names one cycle among them, in the order values would flow round it from the node
    written first, and counts the
    rest, which only wait below it. Each stuck node reads a stuck node (what it waits
    for), so walking up from one along those comes round to a node seen before."""
    reads: dict[int, list[Node]] = {}
    for source, target in expr.edges:
        reads.setdefault(id(target), []).append(source)
    node = next(n for n in expr.nodes if id(n) in stuck)
    path: list[Node] = []
    seen: dict[int, int] = {}
    while id(node) not in seen:
        seen[id(node)] = len(path)
        path.append(node)
        node = next(p for p in reads[id(node)] if id(p) in stuck)
    loop = path[seen[id(node)] :][::-1]
    place = {id(n): i for i, n in enumerate(expr.nodes)}
    first = min(range(len(loop)), key=lambda i: place[id(loop[i])])
    loop = loop[first:] + loop[:first]  # from the node written first
    below = len(stuck) - len(loop)
    waiting = (
        ""
        if not below
        else " (1 node below it waits on it)"
        if below == 1
        else f" ({below} nodes below it wait on it)"
    )
    return Cycle(
        "the graph feeds a node into itself: "
        + " → ".join(repr(n) for n in (*loop, loop[0]))
        + f"{waiting}. A pipeline is a graph without cycles: use two separate nodes where "
        "one value feeds the next step"
    )
