"""The broker's interface, the errors of running somewhere else, and what brokers share.

The engine speaks to a broker in three calls:

- ``check(graph)`` before anything runs: every worker a node is placed on is one
  this broker knows, and every node placed on a network worker can be rebuilt
  there — a node that holds state only when it can hand its state over and is
  frozen at a known digest — otherwise it refuses, and nothing has run;
- ``submit(graph, node, inputs, ctx, keep=...)`` → a ``concurrent.futures.Future``
  of a :class:`Done`: the node's value, how long the call took, the facts it
  produced (``crossed``), and the bytes the worker kept when it kept the answer
  itself. The engine submits every placed node whose inputs are there and
  waits on the futures, so independent branches placed on different workers run
  at the same time;
- ``call(graph, node, inputs, ctx, emit)`` → the value: ``submit`` and wait,
  for the places that need an answer at once (the items of a mapped node).

and, when a forward is interrupted (Ctrl-C) while calls it submitted still run,
``interrupted(futures)``: the broker stops them — a Ray actor is stopped; a node
running on an embedded worker's thread has KeyboardInterrupt raised in it
(:meth:`Broker.stoppable`), and so are those of the calls the interrupted thread
submitted and does not hold yet (interrupted as ``submit`` returned).

Each worker has one lane — a thread that carries its calls one after another,
as a Ray actor does — so a worker never runs two nodes at once. A node on a lane
may run another graph with the broker (a nested forward); the broker notes which
worker waits on which (``_waits``), and refuses (:class:`Reentrant`) a call that
would close a circle of workers waiting on each other, which would wait for ever.

Errors::

    SomatizeError
    ├── UnknownWorker (ValueError)   a node is placed on a name the broker does not know
    ├── WorkerLost (RuntimeError)    the worker died while it ran a node
    ├── WorkerTimeout (TimeoutError) the worker did not answer in time
    ├── NoRay (ImportError)          Broker.ray without ray installed
    ├── OtherCluster (ValueError)    Broker.ray(address) in a process connected to another cluster
    ├── StateMismatch (ValueError)   a worker loaded state of another digest than the graph's
    ├── GradientLost (ValueError)    a tensor that requires grad would cross to a network worker
    ├── BrokerClosed (RuntimeError)  the broker was closed while a node waited for its worker
    ├── Reentrant (RuntimeError)     a node asked the worker it runs on to run another node
    └── NodeFailed                   (somatize.engine)
        └── FailedOnWorker           a node raised inside another process
"""

from __future__ import annotations

import abc
import ctypes
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from somatize._numbers import finite
from somatize._threads import ProcessLock, StartedPool
from somatize.catalog import Blueprint, Catalog, Unbuildable, blueprint_of, state_crosses
from somatize.engine import Call, NodeFailed, wait_for
from somatize.errors import SomatizeError, _Befell, _Rebuilt
from somatize.node import Context, _check_worker_name, holding_of

from .worker import Worker

if TYPE_CHECKING:
    from somatize.graph import Graph

    from .embedded import EmbeddedBroker
    from .ray import RayBroker

__all__ = [
    "Broker",
    "BrokerClosed",
    "Done",
    "FailedOnWorker",
    "GradientLost",
    "NoRay",
    "OtherCluster",
    "Reentrant",
    "StateMismatch",
    "UnknownWorker",
    "WorkerLost",
    "WorkerTimeout",
]

Fact = dict[str, Any]


class UnknownWorker(SomatizeError, ValueError):
    """A node is placed on a worker name the broker does not know."""


class WorkerLost(_Rebuilt, _Befell, RuntimeError):
    """The worker a node ran on died before it answered."""

    def __init__(self, node: str, worker: str, attempts: int, cause: str) -> None:
        self.node, self.worker = node, worker
        super().__init__(
            f"`{node}` was running on worker `{worker}` when the worker died ({cause}); "
            f"tried {attempts} time(s). Nothing was kept for `{node}` or anything below it, and "
            f"the next call starts `{worker}` afresh. Set `retries=` on the broker to try again "
            "on a new worker automatically"
        )


class WorkerTimeout(_Rebuilt, _Befell, TimeoutError):
    """A worker did not answer within the broker's timeout."""

    def __init__(
        self,
        node: str,
        worker: str,
        timeout_s: float,
        *,
        starting: bool = False,
        thread: bool = False,
    ) -> None:
        self.node, self.worker = node, worker
        if thread:  # an embedded worker: its thread cannot be stopped, only let go
            message = (
                f"`{node}` on worker `{worker}` did not answer within {timeout_s:g} s, so the "
                f"worker was let go: its node was interrupted (a thread cannot be stopped from "
                "outside; a node in one long call into C runs on until that call returns), "
                f"and whatever it answers is neither handed back nor kept. Nothing was kept "
                f"for `{node}`, and the next call starts `{worker}` afresh. Raise `timeout_s=` "
                "on the broker if the node needs longer"
            )
        elif starting:
            message = (
                f"worker `{worker}` did not start within {timeout_s:g} s, so `{node}` did not run "
                "and nothing was kept for it. Check that the cluster has the resources the worker "
                "asks for (num_cpus, num_gpus, resources), and that the worker's environment can "
                "run it (a `runtime_env=` whose Python cannot import Ray and somatize never "
                "starts one; Ray's logs say why), or raise `start_timeout_s=`"
            )
        else:
            message = (
                f"`{node}` on worker `{worker}` did not answer within {timeout_s:g} s, so the "
                f"worker was stopped; nothing was kept for `{node}`, and the next call starts "
                f"`{worker}` afresh. Raise `timeout_s=` on the broker if the node needs longer"
            )
        super().__init__(message)


class NoRay(SomatizeError, ImportError):
    """``Broker.ray`` without Ray installed."""


class OtherCluster(SomatizeError, ValueError):
    """``Broker.ray(address)`` in a process already connected (``ray.init``) to a cluster
    that ``address`` does not name."""


class BrokerClosed(_Rebuilt, _Befell, RuntimeError):
    """The broker was closed while a node waited for its worker or ran there."""

    def __init__(self, node: str, worker: str) -> None:
        self.node, self.worker = node, worker
        super().__init__(
            f"`{node}` on worker `{worker}` did not finish: the broker was closed while it "
            f"waited for the worker or ran there, so nothing below `{node}` ran or was kept (a "
            f"`{node}` already running on a worker may still finish there and keep its answer, "
            "which is whole and right). Close the broker after the forwards that use it have "
            "returned"
        )


class Reentrant(SomatizeError, RuntimeError):
    """A node running on a worker asked a worker to run another node that would wait for
    the node that asks: its own worker, or one whose node waits for it — through the
    graphs it runs, or running at the same time on another branch — for ever; or code a
    collection ran inside one of the broker's own blocks asked for a node, which its
    worker could not begin until that block ended."""


class StateMismatch(SomatizeError, ValueError):
    """A worker loaded state whose digest is not the one the graph is frozen at."""


class GradientLost(SomatizeError, ValueError):
    """A tensor that requires grad would cross to a network worker, which is sent its values
    alone: the gradient through the node placed there would be lost without a word."""


class UnreadableCrossing(SomatizeError, ValueError):
    """A value that crossed to or from a network worker in another process cannot be read
    where it landed: it names a class not loaded in that process (a dataclass, a
    namedtuple), which is never imported to read a value."""


def state_mismatch(node: str, worker: str, loaded: str, frozen: str) -> StateMismatch:
    """The refusal of a worker that loaded state ``loaded`` for ``node`` frozen at ``frozen``."""
    return StateMismatch(
        f"`{node}` on worker `{worker}` was sent state whose digest is {loaded}, and the graph "
        f"is frozen at {frozen}: its weights changed after they were frozen, so answers "
        f"computed from them would be kept under a key that does not describe them. `{node}` "
        f"did not run and nothing was kept for it. Freeze the graph again after changing the "
        "weights (`somatize.torch.freeze(g)`)"
    )


class FailedOnWorker(NodeFailed):
    """A node's forward raised in another process; what it raised is named, not carried."""

    def __init__(self, node: str, kind: str, worker: str, raised: str, message: str) -> None:
        SomatizeError.__init__(
            self,
            f"`{node}` ({kind}) raised {raised} on worker `{worker}`: {message} — nothing was "
            f"kept for `{node}` or anything below it",
        )
        self.node, self.worker, self.raised = node, worker, raised
        self.raised_there = raised


@dataclass
class Done:
    """What one call on a worker produced."""

    value: Any
    took_us: int
    facts: list[Fact] = field(default_factory=list)
    """Facts to emit, in order (``crossed``)."""
    kept: int | None = None
    """Bytes the worker kept in the store for this answer, or None if it kept nothing."""
    moved: bool = False
    """Whether the node's code was changed as it ran there, or the node changed what it
    declares as it ran: its answer is not kept, by the worker or the client
    (:attr:`somatize.broker.host.Reply.moved`)."""


class Broker(abc.ABC):
    """Runs placed nodes on named workers. ``Broker.embedded({...})`` in this process,
    ``Broker.ray(...)`` on a Ray cluster."""

    _made_as = 'Broker.embedded({"w1": Worker.generic(mode="network")})'
    """How a broker of this kind is made with one worker, for the errors that say so."""

    def __init__(self, workers: Mapping[str, Worker]) -> None:
        if not isinstance(workers, Mapping) or not workers:
            raise TypeError(
                f"a broker is given its workers by name, e.g. `{self._made_as}`; got {workers!r}"
            )
        for name, worker in workers.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"a worker is named by a non-empty str, got {name!r}")
            _check_worker_name(name)  # as `.at()` refuses it: no node could be placed there
            if not isinstance(worker, Worker):
                raise TypeError(
                    f"worker `{name}` is a `{type(worker).__name__}`; describe it with "
                    '`Worker.generic(mode="local" | "network", ...)`'
                )
        self.workers: dict[str, Worker] = dict(workers)
        self._lanes: dict[str, _Lane] = {}
        self._retired: dict[str, list[_Lane]] = {}
        """Worker → lanes :meth:`close` let go of, whose node may still be running: the
        worker's next lane starts once they are idle, so it never runs two nodes at once."""
        self._pending: dict[Future[Done], tuple[str, str]] = {}
        """Each call not finished yet → (node, worker), for close() to fail."""
        self._callers: dict[Future[Done], int] = {}
        """Each call not finished yet → the thread that submitted it, noted before its node
        can start: a Ctrl-C landing in that thread as :meth:`submit` returns, before the
        forward holds the call, stops it still (:meth:`interrupted`)."""
        self._holders: weakref.WeakKeyDictionary[Graph, str] = weakref.WeakKeyDictionary()
        self._here = threading.local()
        """On a lane's thread, the workers busy with the node it runs: its own, and those
        whose nodes wait for it, through the forwards they run (``held``)."""
        self._waits: dict[str, dict[str, int]] = {}
        """Worker → the workers it waits on: how many calls the node running on it (or
        nodes below it, through the forwards they run) submitted to each and that have not
        finished. A call that would close a cycle here would wait for ever (``Reentrant``)."""
        self._forwarding: dict[Future[Done], list[Any]] = {}
        """Each call whose node's forward runs on a lane's thread now → [that thread's id,
        whether :meth:`interrupted` raised KeyboardInterrupt in it] (:meth:`stoppable`)."""
        self._halted: set[Future[Done]] = set()
        """Calls :meth:`interrupted` stopped before their node's forward began (decoding its
        inputs, loading its state): that forward is not begun."""
        self._asked: dict[Future[Done], Future[Done]] = {}
        """Each call not finished yet that a node on a lane asked for (a nested forward) →
        the call that runs that node: stopping one stops what it waits on."""
        self._lock = ProcessLock()
        """Made unheld in a forked child (:class:`~somatize._threads.ProcessLock`)."""
        self._pid = os.getpid()
        """The process whose threads :attr:`_lanes` are (:meth:`_in_this_process`)."""
        self._checked: weakref.WeakKeyDictionary[
            Graph, tuple[tuple[int, int], dict[str, Blueprint]]
        ] = weakref.WeakKeyDictionary()

    # -- making one ---------------------------------------------------------------------------

    @staticmethod
    def embedded(
        workers: Mapping[str, Worker],
        *,
        catalog: Catalog | None = None,
        timeout_s: float | None = None,
    ) -> EmbeddedBroker:
        """Workers in this process. Network workers rebuild their nodes through
        ``catalog`` (by default one that imports by ``module:qualname`` and finds classes
        of this process's ``__main__``; register on it a class that no import can find).
        ``timeout_s``: how long a call on a network worker may take before the worker is
        let go and started afresh (None: as long as it takes); refused with a local
        worker, whose node is the caller's own object."""
        from .embedded import EmbeddedBroker

        return EmbeddedBroker(workers, catalog=catalog, timeout_s=timeout_s)

    @staticmethod
    def ray(
        address: str | None = None,
        workers: Mapping[str, Worker] | None = None,
        *,
        retries: int = 0,
        timeout_s: float | None = None,
        start_timeout_s: float = 120.0,
        import_paths: Sequence[str | os.PathLike[str]] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> RayBroker:
        """Workers as Ray actors on the cluster at ``address`` (the one this process is
        connected to, or a new one on this machine, when None; in a process connected
        already, an address naming another cluster is refused, :class:`OtherCluster`).
        ``retries``: how many times a call is tried again on a fresh actor when its
        worker dies;
        ``timeout_s``: how long a call may take before its worker is stopped (None:
        as long as it takes); ``start_timeout_s``: how long a worker may take to start
        (a cluster without the resources it asks for never starts it);
        ``import_paths``: directories (str or :class:`os.PathLike`) the actors import
        node modules from, put first on their ``sys.path`` in this order (by default
        this process's ``sys.path``, right when the cluster is this machine);
        ``runtime_env``: Ray's, for a cluster elsewhere."""
        from .ray import RayBroker

        return RayBroker(
            address,
            workers or {},
            retries=retries,
            timeout_s=timeout_s,
            start_timeout_s=start_timeout_s,
            import_paths=import_paths,
            runtime_env=runtime_env,
        )

    # -- the engine's calls -------------------------------------------------------------------

    def check(self, graph: Graph) -> None:
        """Refuses, before anything runs, a node placed on an unknown worker or one that
        cannot be rebuilt on the network worker it is placed on. The blueprints it makes
        are those of the graph's memory as it is: a new state of it (a declaration said
        again because a list the node was built with changed, a state restated) makes
        them again, so a worker never rebuilds a node as it was. So does a node that holds
        other public values than when its blueprint was made (``p.k = 5``, not what it
        changed itself running here: :class:`~somatize._held.Holding`): what each holds is
        looked at again here, at the start of every forward, which costs a digest of its
        public attributes, next to a crossing."""
        self._in_this_process()
        found = self._checked.get(graph)
        if (
            found is not None
            and found[0] == (graph.memory.version, len(graph.placement))
            and all(_owed(graph, node) == made.held for node, made in found[1].items())
        ):
            return
        self._check(graph)

    def _check(self, graph: Graph) -> None:
        """Makes the blueprints of ``graph``'s nodes placed on network workers, refusing
        what :meth:`check` refuses."""
        version = (graph.memory.version, len(graph.placement))
        placed = list(graph.placement)
        unknown = [(node, worker) for node, worker in placed if worker not in self.workers]
        if unknown:
            listing = ", ".join(f"`{node}` on `{worker}`" for node, worker in unknown)
            known = ", ".join(f"`{name}`" for name in self.workers)
            raise UnknownWorker(
                f"this broker has no worker for {listing}; it has {known}. Nothing has run. "
                "Place the node with `.at(name)` on one of those, or give the broker a worker "
                "under that name"
            )
        blueprints: dict[str, Blueprint] = {}
        for node, worker in placed:
            if not self.workers[worker].crosses:
                continue
            try:
                blueprint = blueprint_of(graph.node(node), node, _owed(graph, node))
            except Unbuildable as why:
                raise _unsendable(node, worker, why) from None
            says = graph.settles(node)  # a copy there says its state, checked there
            holds = graph.keyed_by_state(node)
            if holds and not (says or state_crosses(graph.node(node))):
                raise Unbuildable(
                    f"`{node}` ({graph.kind_of(node)}) is placed on network worker `{worker}` "
                    "and holds state (weights, a dataset version) that its constructor does "
                    "not rebuild, so a copy made there would not be the same node. Nothing has "
                    'run. Place it on a `Worker.generic(mode="local")` worker or leave it '
                    "where the graph is called"
                )
            if holds and graph.memory.state_of(node) is None:
                raise Unbuildable(
                    f"`{node}` ({graph.kind_of(node)}) is placed on network worker `{worker}`, "
                    + (
                        "which rebuilds it and checks that the copy is at the state the graph "
                        "is settled at — and it is not settled at any: a copy made there "
                        "would read what it reads as it is then, which nobody can check. "
                        "Nothing has run. Declare it `.frozen()` and settle it "
                        "(`somatize.data.settle(g)`), or place it on a "
                        # A node saying its own state (a dataset) is settled by `settle`,
                        # whether or not it holds that state too; `freeze` refuses it.
                        if says
                        else "which rebuilds it and loads the state the graph is frozen at — "
                        "and it is not frozen at any: a worker would hold weights nobody can "
                        "check, and they would go stale as they train here. Nothing has run. "
                        "Declare it `.frozen()` and settle it (`somatize.torch.freeze(g)`), or "
                        "place it on a "
                    )
                    + '`Worker.generic(mode="local")` worker'
                )
            try:
                self._admit(node, worker, blueprint, graph.memory.fingerprint_of(node), holds)
            except Unbuildable as why:
                raise _unsendable(node, worker, why) from None
            blueprints[node] = blueprint
        self._checked[graph] = (version, blueprints)

    def submit(
        self, graph: Graph, node: str, inputs: list[Any], ctx: Context, *, keep: bool = False
    ) -> Future[Done]:
        """Starts ``node`` on its worker; the future holds its :class:`Done`. With
        ``keep``, a worker that can reach the store keeps the answer under ``ctx.key``.

        What crosses is encoded here, on the caller's thread, before this returns: a
        value the caller changes afterwards (a node here appending to a list it was
        also handed) is not what the worker is sent. Whatever stops the call — a value
        with no codec, a node asking the worker it runs on to run another, the broker
        closed — is the future's exception."""
        worker = graph.placement.worker_of(node)
        if worker is None:
            raise ValueError(f"`{node}` is placed on no worker; the engine runs it itself")
        self._in_this_process()
        future: Future[Done] = Call()  # one a Ctrl-C cannot leave locked
        future.add_done_callback(self._finished)  # first: whatever settles it, it is left
        try:
            if self._lock.held_here():
                # Code a collection runs (a `__del__`) in the middle of one of the broker's
                # blocks: the worker's thread takes that lock to run the node, and would
                # wait for this thread, which waits for it.
                raise Reentrant(
                    f"`{node}` was asked of worker `{worker}` by code run while this thread "
                    "was inside the broker (a `__del__` or weakref callback a garbage "
                    "collection ran there): the worker could not begin it until this thread "
                    "left, and this thread would wait for it, for ever. Nothing has run. "
                    "Run the forward after the collection instead (note what is to be done "
                    "in the finalizer, and do it from ordinary code)"
                )
            held: tuple[str, ...] = getattr(self._here, "held", ())
            if worker in held:
                where = (
                    "where the node asking for it already runs"
                    if held[-1] == worker
                    else "where a node waits for the node asking for it (through "
                    + " → ".join(f"`{w}`" for w in held[held.index(worker) :])
                    + ")"
                )
                raise Reentrant(
                    f"`{node}` is placed on worker `{worker}`, {where}: a worker runs one node "
                    f"at a time, so `{node}` would wait for the node that waits for it, for "
                    "ever. Place the nested graph's nodes on another worker of this broker, "
                    "or run it with another broker"
                )
            work = self._send(graph, node, worker, inputs, ctx, keep)
            asker = held[-1] if held else None
            with self._lock:
                if asker is not None:
                    cycle = self._path(worker, asker)
                    if cycle is not None:
                        raise Reentrant(
                            f"`{node}` is placed on worker `{worker}`, whose node waits for "
                            f"the node asking for it, on `{asker}` (through "
                            + " → ".join(f"`{w}`" for w in cycle)
                            + f"): a worker runs one node at a time, so `{node}` would wait "
                            "for a node that waits for it, for ever. Place the nested graphs' "
                            "nodes so that no two workers run graphs on each other, or run "
                            "one with another broker"
                        )
                    waits = self._waits.setdefault(asker, {})
                    waits[worker] = waits.get(worker, 0) + 1
                    future.add_done_callback(lambda _: self._waited(asker, worker))
                lane = self._lanes.get(worker)
                if lane is None:
                    # Handed the wait for the closed lanes first, then noted, then they are
                    # let go of: a Ctrl-C landing before leaves them noted, for the next.
                    lane = _Lane(worker)
                    retired = self._retired.get(worker)
                    if retired:
                        lane.submit(_idle, list(retired))  # before anything else on it
                    self._lanes[worker] = lane
                    self._retired.pop(worker, None)
                self._pending[future] = (node, worker)
                self._callers[future] = threading.get_ident()
                asking = getattr(self._here, "future", None)
                if asking is not None:
                    self._asked[future] = asking
                lane.submit(self._work, future, (*held, worker), work)
        except Exception as error:
            future.set_exception(error)
        return future

    def call(
        self,
        graph: Graph,
        node: str,
        inputs: list[Any],
        ctx: Context,
        emit: Callable[[Fact], Any],
    ) -> Any:
        """Runs ``node`` on its worker and returns its value, emitting what it crossed."""
        return self.called(graph, node, inputs, ctx, emit).value

    def called(
        self,
        graph: Graph,
        node: str,
        inputs: list[Any],
        ctx: Context,
        emit: Callable[[Fact], Any],
    ) -> Done:
        """:meth:`call`, returning all it is told of the run (:class:`Done`): a caller that
        keeps the answer itself needs to know besides the value whether the node's code,
        or what it declares, changed as it ran (``moved``)."""
        future: Future[Done] | None = None
        try:
            future = self.submit(graph, node, inputs, ctx)
            wait_for([future])
            done = future.result()
        except BaseException as error:
            stop = error  # interrupted while it waited (Ctrl-C): stopped, as the engine does
            while True:  # again when a second Ctrl-C cuts the stopping short
                try:
                    if not isinstance(stop, Exception):
                        self.interrupted([future] if future is not None else [])
                    break
                except KeyboardInterrupt as again:
                    stop = again
            if stop is not error:
                raise stop from None
            raise
        for fact in done.facts:
            emit(fact)
        return done

    def interrupted(self, futures: Iterable[Future[Done]]) -> None:
        """The forward waiting on ``futures`` was interrupted (Ctrl-C): the calls among them
        still running are stopped, so they do not go on running for nobody, holding their
        workers (and this process, which waits for its threads as it exits). A node whose
        forward runs on a worker's thread has KeyboardInterrupt raised in it there, as
        Ctrl-C raises it in the main thread: it lands at the next Python instruction the
        node runs, so one in a long call into C (a sleep, a large matrix product) first
        finishes that call. Its call fails with KeyboardInterrupt, nothing is kept for it,
        and the worker runs its next node. So are the calls those nodes' own forwards
        (nested ones) wait on, which they could not otherwise leave: a thread waiting on
        a call is in one such long C call."""
        with self._lock:
            stopping = self._stopping(futures)
            for future in stopping:
                running = self._forwarding.get(future)
                if running is None:
                    if not future.done():
                        self._halted.add(future)
                elif not running[1]:  # sent, then noted: a second Ctrl-C landing between
                    _raise_in(running[0], KeyboardInterrupt)  # leaves it sent, taken back
                    running[1] = True  # when its forward is left, rather than noted, unsent
        for future in stopping:  # one not started yet never starts
            future.cancel()

    def _stopping(self, futures: Iterable[Future[Done]]) -> set[Future[Done]]:
        """The calls :meth:`interrupted` stops for ``futures``: those, the calls this thread
        submitted that its forward lost hold of (a Ctrl-C landing as ``submit`` returned),
        and the calls any of them waits on (nested forwards). Called under the lock."""
        me = threading.get_ident()
        stopping = set(futures)
        stopping |= {f for f, caller in self._callers.items() if caller == me}
        while True:
            below = {f for f, asking in self._asked.items() if asking in stopping} - stopping
            if not below:
                return stopping
            stopping |= below

    def stoppable(self) -> AbstractContextManager[None]:
        """Around the forward of a node on a lane's thread: while it runs, :meth:`interrupted`
        may raise KeyboardInterrupt in it; one interrupted before it begins raises it at
        once, instead of running. Leaving it, an interrupt sent and not landed
        yet is taken back, so it lands nowhere else; a forward that was interrupted and
        returned anyway (it caught the KeyboardInterrupt) raises it, so its answer is not
        taken. Outside a call run by :meth:`_work`, it does nothing."""
        return _Stoppable(self)

    def _in_this_process(self) -> None:
        """In a process forked from the one that made the broker's lanes (a DataLoader
        worker, a multiprocessing worker), the broker starts afresh: the parent's lane
        threads stayed behind, and a call handed to one would wait for ever; so do the
        calls the parent was running, and what its threads noted of them. Its workers
        start again here, as after :meth:`close` (:meth:`_forked`)."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with self._lock:
            if self._pid == pid:
                return
            self._lanes, self._retired = {}, {}
            self._pending, self._callers, self._asked = {}, {}, {}
            self._waits, self._forwarding, self._halted = {}, {}, set()
            self._here = threading.local()
            self._forked()
            self._pid = pid

    def _forked(self) -> None:
        """What else a broker starts afresh in a forked child (:meth:`_in_this_process`),
        under its lock: nothing, by default."""
        return

    def _finished(self, future: Future[Done]) -> None:
        """``future``'s call has its outcome."""
        with self._lock:
            self._pending.pop(future, None)
            self._callers.pop(future, None)
            self._asked.pop(future, None)
            self._halted.discard(future)

    def _leave(self, future: Future[Done]) -> bool:
        """The forward of ``future``'s node has ended: whether it was interrupted."""
        with self._lock:
            running = self._forwarding.pop(future, None)
        if running is None:
            return False
        if running[1]:  # sent: one not landed yet lands here, now, and nowhere after
            _take_back()
        return bool(running[1])

    def close(self) -> None:
        """Lets the workers go; a later call starts them again. A node still waiting for
        its worker, or running there, fails at once with :class:`BrokerClosed` (one
        already running on an embedded worker finishes on its own: the caller is not handed
        its answer, which the worker may still keep in the store, and the worker starts
        its next node once it has)."""
        with self._lock:
            lanes, self._lanes = self._lanes, {}
            pending, self._pending = self._pending, {}
            for worker, lane in lanes.items():
                self._retired.setdefault(worker, []).append(lane)
        for lane in lanes.values():
            lane.shutdown(wait=False, cancel_futures=True)
        for future, (node, worker) in pending.items():
            _settle(future, BrokerClosed(node, worker))

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for brokers ----------------------------------------------------------------------------

    @abc.abstractmethod
    def _send(
        self, graph: Graph, node: str, worker: str, inputs: list[Any], ctx: Context, keep: bool
    ) -> Callable[[], Done]:
        """Makes, on the caller's thread, one call of ``node`` on ``worker``: everything
        that crosses is encoded here. What it returns runs the call on that worker's lane."""

    def _admit(
        self, node: str, worker: str, blueprint: Blueprint, fingerprint: str | None, holds: bool
    ) -> None:
        """Raises Unbuildable if ``worker`` cannot rebuild ``node`` from ``blueprint``: by
        default, if a process that registered nothing could not find its class, or — for
        a node that holds no state, which is cheap to build — if the node built here from
        its blueprint declares something else than the graph's (a constructor that does
        not make the same node from the same arguments)."""
        catalog = Catalog()
        catalog.admit(blueprint)
        if not holds:
            catalog.build(blueprint)

    def _blueprint(self, graph: Graph, node: str) -> Blueprint:
        """The blueprint ``check`` made for ``node`` from the graph's memory as it is now
        (what the node holds is looked at once per forward, by ``check``, not per call)."""
        found = self._checked.get(graph)
        if found is None or found[0] != (graph.memory.version, len(graph.placement)):
            self._check(graph)
            found = self._checked[graph]
        return found[1][node]

    def _path(self, start: str, end: str) -> list[str] | None:
        """The workers from ``start`` to ``end`` that each wait on the next (:attr:`_waits`),
        or None when ``start`` waits on ``end`` through none. Called under the lock."""
        before: dict[str, str] = {start: start}
        looking = [start]
        while looking:
            here = looking.pop()
            if here == end:
                path = [here]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return path[::-1]
            for there, count in self._waits.get(here, {}).items():
                if count and there not in before:
                    before[there] = here
                    looking.append(there)
        return None

    def _waited(self, asker: str, worker: str) -> None:
        """A call a node on ``asker`` submitted to ``worker`` finished."""
        with self._lock:
            waits = self._waits.get(asker)
            if waits is None or worker not in waits:
                return
            waits[worker] -= 1
            if not waits[worker]:
                del waits[worker]
            if not waits:
                del self._waits[asker]

    def _holder(self, graph: Graph) -> str:
        """An opaque name of ``graph`` that its jobs carry, so a worker holds state for each
        graph apart (:attr:`somatize.broker.host.Job.holder`)."""
        with self._lock:
            found = self._holders.get(graph)
            if found is None:
                found = self._holders[graph] = uuid.uuid4().hex
            return found

    def _work(self, future: Future[Done], held: tuple[str, ...], work: Callable[[], Done]) -> None:
        """Runs ``work`` on the lane of the last of ``held`` for ``future``, unless the
        future was cancelled or failed (the broker closed) while it waited."""
        try:
            if not future.set_running_or_notify_cancel():
                return
        except RuntimeError:  # settled by close() while it waited
            return
        self._here.held = held
        self._here.future = future
        try:
            done = work()
        except BaseException as error:
            _settle(future, error)
        else:
            _settle(future, done)
        finally:
            self._here.held = ()
            self._here.future = None
            self._left(future)

    def _left(self, future: Future[Done]) -> None:
        """The thread that ran ``future``'s node is done with it. An interrupt landed as the
        forward ended, before it was left, and one sent again since: it lands here, not in
        the thread's own loop, which it would end. A forward noted as running on another
        thread (a call an embedded broker times runs on a thread of its own) is
        that thread's to leave."""
        try:  # suppress's __enter__ is a call, where it could land outside
            with self._lock:
                running = self._forwarding.get(future)
                if running is None or running[0] != threading.get_ident():
                    return
                del self._forwarding[future]
            if running[1]:
                _take_back()
        except KeyboardInterrupt:
            pass

    def __repr__(self) -> str:
        listed = ", ".join(f"{name}: {w.mode}" for name, w in self.workers.items())
        return f"<{type(self).__name__} {listed}>"


class _Stoppable:
    """:meth:`Broker.stoppable`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.future: Future[Done] | None = None

    def __enter__(self) -> None:
        future = getattr(self.broker._here, "future", None)
        if future is not None:
            with self.broker._lock:
                if future in self.broker._halted:
                    self.broker._halted.discard(future)
                    raise KeyboardInterrupt  # stopped before its forward began
                self.broker._forwarding[future] = [threading.get_ident(), False]
            self.future = future

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.future is not None and self.broker._leave(self.future) and kind is None:
            raise KeyboardInterrupt  # the node caught the interrupt and answered anyway


_RAISE_THERE: Any = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
"""CPython's call that raises an exception in another thread, looked up once, here, rather
than where a second Ctrl-C may land in the Python code that looks it up; None elsewhere."""


def _raise_in(thread: int, error: type[BaseException]) -> None:
    """Raises ``error`` in the thread ``thread`` at the next Python instruction it runs.
    Outside CPython, nothing.

    One sent is taken back by letting it land (:func:`_take_back`), never by sending None:
    CPython then leaves the interpreter asked to look for one at every instruction it
    checks, in every thread, for the rest of the process — slower, and on Python 3.11 a
    profiler or tracer set after it (``cProfile``, a debugger, the one a trace of
    ``somatize.torch.wrap`` sets) hangs at the next call."""
    if _RAISE_THERE is not None:
        _RAISE_THERE(ctypes.c_ulong(thread), ctypes.py_object(error))


def _take_back() -> None:
    """Lets a KeyboardInterrupt sent to this thread by :func:`_raise_in`, and not landed
    yet, land here, where it is caught: the interpreter looks for one as a call begins."""
    try:  # noqa: SIM105 -- suppress's __enter__ is a call, where it could land outside
        _landing()
    except KeyboardInterrupt:
        pass


def _landing() -> None:
    """A call, where an interrupt sent to the thread lands (:func:`_take_back`)."""


def _owed(graph: Graph, name: str) -> tuple[tuple[str, str], ...]:
    """What a copy of node ``name`` of ``graph``, rebuilt on a worker, must hold now. An
    argument the node keeps is the argument it is rebuilt with, changed by itself too
    (``self.step += 1``: the graph takes it as the argument, its key follows it)."""
    node = graph.node(name)
    kept = graph._kept.get(name)
    return holding_of(node).owed(node, follows=[attr for attr, _ in kept[1]] if kept else ())


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a finite number of seconds > 0 (not a bool)."""
    return finite(value) and value > 0


def _check_timeout(timeout_s: Any) -> None:
    """Refuses a broker's ``timeout_s=`` that is neither None nor a number of seconds > 0."""
    if timeout_s is not None and not _seconds(timeout_s):
        raise ValueError(f"timeout_s is a number of seconds > 0 (or None), got {timeout_s!r}")


def _unsendable(node: str, worker: str, why: Unbuildable) -> Unbuildable:
    return Unbuildable(
        f"`{node}` cannot be sent to worker `{worker}`, which rebuilds what it runs: "
        f"{why}. Nothing has run"
    )


class _Lane(StartedPool):
    """A worker's lane: a pool of one thread, started as the lane is made
    (:class:`~somatize._threads.StartedPool`), not from ``submit`` on the caller's thread,
    where a Ctrl-C could leave ``threading``'s locks held or the thread unrecorded."""

    def __init__(self, worker: str) -> None:
        super().__init__(1, f"somatize-{worker}")


def _idle(retired: list[_Lane]) -> None:
    """Returns once every lane of ``retired`` has finished what it was running."""
    for lane in retired:
        lane.shutdown(wait=True)


def _settle(future: Future[Done], outcome: Done | BaseException) -> None:
    """Gives ``future`` its outcome, unless it already has one (the broker was closed)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass
