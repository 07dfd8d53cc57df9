"""The embedded broker: workers in this process, the default, with no dependency.

A **local** worker is a thread that runs the node object itself, handed the
Python values as they are: placement without distribution, for concurrency of
independent branches and for trying ``.at()`` out.

A **network** worker behaves as if a wire stood between it and the client:
every input is encoded by its codec, the node is rebuilt from its blueprint
through the broker's catalog, the answer is encoded back and decoded on the client, and
each crossing is a ``crossed`` fact with its bytes. A frozen node that holds
state (a module made with ``somatize.torch.ModuleNode.build``) is
rebuilt there and loaded with its state once, as on a cluster
(:mod:`somatize.broker.host`): the forward that sends it has a ``crossed`` fact
with ``"way": "state"``, later forwards send none. The worker opens the
forward's store itself from its address, as a Ray actor does, and keeps the
answer of a cached node there — when the store has an address and, for a signed
one, this process holds its key (:mod:`somatize.broker.host`); otherwise the
client keeps it. A graph that runs on network workers here runs on a cluster,
because nothing else crosses there — with one allowance: these workers share the
interpreter, so a class defined in ``__main__`` (a notebook's) is found there,
where a Ray worker would refuse it and ask for the class to be moved into a
module or registered.

With ``timeout_s``, a network worker's calls run on a thread of their own (a
:class:`_Runner`), and the worker's thread waits for each that long at most. A
thread cannot be stopped from outside, so one that does not answer in time is let go
rather than stopped: its node is sent KeyboardInterrupt (it lands at the next Python
instruction the node runs), the host it runs on begins nothing more and keeps
nothing, and the worker's next call gets a fresh host, which builds its nodes and
loads their state again, on a fresh thread. A local worker runs the caller's own
node object, which a call let go would go on changing beside the next one: a timeout
is refused there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from somatize._threads import start_thread
from somatize.catalog import Blueprint, Catalog, own_state
from somatize.node import Context, running_here

from .base import Broker, Done, WorkerTimeout, _check_timeout
from .host import Host, NeedState, callers_modes, crossings, job_for, state_for, unpacker
from .worker import BadWorker, Worker

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["EmbeddedBroker"]


class EmbeddedBroker(Broker):
    """Workers in this process; see the module docstring."""

    def __init__(
        self,
        workers: Mapping[str, Worker],
        *,
        catalog: Catalog | None = None,
        timeout_s: float | None = None,
    ) -> None:
        super().__init__(workers)
        if catalog is not None and not isinstance(catalog, Catalog):
            raise TypeError(
                f"catalog= takes a `somatize.Catalog`, got a `{type(catalog).__name__}`; "
                "make one with `Catalog(in_process=True)` and register on it the classes no "
                "import can find, or leave it out"
            )
        _check_timeout(timeout_s)
        if timeout_s is not None:
            local = [name for name, w in self.workers.items() if not w.crosses]
            if local:
                raise BadWorker(
                    f'worker `{local[0]}` is `mode="local"`: it runs the node object itself '
                    "on a thread of this process, and a thread cannot be stopped from outside, "
                    "so a call that did not answer in time would go on changing that object "
                    "beside the next call of it. `timeout_s=` is for network workers, which "
                    'run a copy the broker can let go: describe it with `mode="network"`, or '
                    "leave `timeout_s=` out"
                )
        self.catalog = catalog if catalog is not None else Catalog(in_process=True)
        self.timeout_s = timeout_s
        self._hosts = {name: self._host(name) for name, w in workers.items() if w.crosses}
        self._runners: dict[str, _Runner] = {}
        """Worker → the thread its timed calls run on (:meth:`_within`)."""

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (``copy.deepcopy``, or the broker pickled to a spawned process: a
        DataLoader worker, a ``multiprocessing`` one) is a broker with the same workers,
        catalog and timeout, started afresh, as one in a forked child: its threads, and
        the nodes its hosts rebuilt and loaded, stay with the original."""
        return (_started, (self.workers, self.catalog, self.timeout_s))

    def _host(self, worker: str) -> Host:
        """A fresh host for network worker ``worker``."""
        return Host(worker, self.catalog, stoppable=self.stoppable)

    def close(self) -> None:
        """Lets the workers go, as :meth:`Broker.close` says, and the nodes their hosts
        rebuilt and loaded with them (weights included): the next forward builds them
        again on fresh hosts, and sends their state again. A node still running finishes
        on the host it started on."""
        with self._lock:
            self._hosts = {name: self._host(name) for name in self._hosts}
            runners, self._runners = self._runners, {}
        for runner in runners.values():
            runner.let_go()
        super().close()

    def _forked(self) -> None:
        """In a forked child, fresh hosts: the parent's may have been building or running a
        node as it forked, and the child's copy of that node is left half changed."""
        self._hosts = {name: self._host(name) for name in self._hosts}
        self._runners = {}

    def _admit(
        self, node: str, worker: str, blueprint: Blueprint, fingerprint: str | None, holds: bool
    ) -> None:
        """The worker's host builds the node now, as it will build it for the first job —
        it keeps what it built — so a node it cannot rebuild, or one whose code there is
        not the graph's, is refused before anything runs."""
        self._hosts[worker].admit(blueprint.to_bytes(), fingerprint, name=node, holds=holds)

    def _send(
        self, graph: Graph, node: str, worker: str, inputs: list[Any], ctx: Context, keep: bool
    ) -> Callable[[], Done]:
        if not self.workers[worker].crosses:
            here = graph.node(node)
            modes = callers_modes()  # the caller's, read on its thread

            def run_here() -> Done:
                start = time.perf_counter_ns()
                own = own_state(graph._code_watch, here.implementing_classes())
                with running_here(here), own, modes(), self.stoppable():  # its own changes
                    value = here.forward(*inputs, ctx)
                # Not kept where it changed what it declares as it ran, as with no broker.
                moved = here.changed_as_it_ran()
                return Done(value, (time.perf_counter_ns() - start) // 1000, moved=moved)

            return run_here
        blueprint = self._blueprint(graph, node)
        job, sent = job_for(
            graph, node, worker, blueprint, inputs, ctx, keep=keep, holder=self._holder(graph)
        )
        unpack = unpacker(node, worker)  # in the caller's inference mode, read on its thread

        def run_there(host: Host) -> Done:
            start = time.perf_counter_ns()
            reply = host.run(job, sent)
            carried = 0
            if isinstance(reply, NeedState):
                state = state_for(graph.node(node))
                carried = len(state)
                reply = host.run(job, sent, state=state)
            assert not isinstance(reply, NeedState)
            value = unpack(reply.codec, reply.data)
            sizes = [len(data) for data in sent]
            facts = crossings(graph, node, worker, sizes, len(reply.data), carried)
            took = (time.perf_counter_ns() - start) // 1000
            return Done(value, took, facts, reply.kept, reply.moved)

        if self.timeout_s is None:
            return lambda: run_there(self._hosts[worker])
        return lambda: self._within(node, worker, run_there)

    def _within(self, node: str, worker: str, run: Callable[[Host], Done]) -> Done:
        """Runs ``run`` on ``worker``'s host of now, on the worker's runner, and waits for
        it :attr:`timeout_s` at most; on the worker's thread, for the call running there.
        One that does not answer in time is let go (the module docstring says how), and is
        a :class:`WorkerTimeout`."""
        assert self.timeout_s is not None
        call, held = self._here.future, self._here.held
        with self._lock:
            host, runner = self._hosts[worker], self._runners.get(worker)
        if runner is None:  # only this worker's thread makes one
            runner = _Runner(worker)
            with self._lock:
                self._runners[worker] = runner
        outcome: SimpleQueue[tuple[Done | None, BaseException | None]] = SimpleQueue()

        def there() -> None:
            self._here.future, self._here.held = call, held  # for the forwards it runs
            try:
                outcome.put((run(host), None))
            except BaseException as error:
                outcome.put((None, error))
            finally:
                self._here.future, self._here.held = None, ()
                self._left(call)

        runner.run(there)
        try:
            done, error = outcome.get(timeout=self.timeout_s)
        except Empty:
            with self._lock:
                if self._hosts.get(worker) is host:
                    self._hosts[worker] = self._host(worker)
                if self._runners.get(worker) is runner:
                    del self._runners[worker]
            host.let_go = True
            runner.let_go()
            self.interrupted([call])
            raise WorkerTimeout(node, worker, self.timeout_s, thread=True) from None
        if error is not None:
            raise error
        assert done is not None
        return done


class _Runner:
    """The thread a timed worker's calls run on, one after another, while the worker's own
    thread waits for each (:meth:`EmbeddedBroker._within`). A daemon that no one joins:
    one let go with a call stuck in C does not keep the process from exiting; it ends
    once that call returns."""

    def __init__(self, worker: str) -> None:
        self._calls: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        thread = threading.Thread(target=self._serve, name=f"somatize-{worker}-call", daemon=True)
        start_thread(thread.start)

    def run(self, call: Callable[[], None]) -> None:
        """Runs ``call`` once the calls handed before it have run."""
        self._calls.put(call)

    def let_go(self) -> None:
        """Ends the thread once the calls handed to it have run."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
            del call  # not held while it waits for the next


def _started(
    workers: Mapping[str, Worker], catalog: Catalog, timeout_s: float | None = None
) -> EmbeddedBroker:
    """A broker of ``workers`` rebuilding through ``catalog``, timing calls out after
    ``timeout_s``, none of them started yet: what a copy is made from
    (:meth:`EmbeddedBroker.__reduce__`)."""
    return EmbeddedBroker(workers, catalog=catalog, timeout_s=timeout_s)
