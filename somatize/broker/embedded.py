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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from somatize.catalog import Blueprint, Catalog, own_state
from somatize.node import Context, running_here

from .base import Broker, Done
from .host import Host, NeedState, crossings, job_for, unpack
from .worker import Worker

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["EmbeddedBroker"]


class EmbeddedBroker(Broker):
    """Workers in this process; see the module docstring."""

    def __init__(self, workers: Mapping[str, Worker], *, catalog: Catalog | None = None) -> None:
        super().__init__(workers)
        if catalog is not None and not isinstance(catalog, Catalog):
            raise TypeError(
                f"catalog= takes a `somatize.Catalog`, got a `{type(catalog).__name__}`; "
                "make one with `Catalog(in_process=True)` and register on it the classes no "
                "import can find, or leave it out"
            )
        self.catalog = catalog if catalog is not None else Catalog(in_process=True)
        self._hosts = {
            name: Host(name, self.catalog, stoppable=self.stoppable)
            for name, w in workers.items()
            if w.crosses
        }

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (``copy.deepcopy``, or the broker pickled to a spawned process: a
        DataLoader worker, a ``multiprocessing`` one) is a broker with the same workers and
        catalog, started afresh, as one in a forked child: its threads, and the nodes its
        hosts rebuilt and loaded, stay with the original."""
        return (_started, (self.workers, self.catalog))

    def close(self) -> None:
        """Lets the workers go, as :meth:`Broker.close` says, and the nodes their hosts
        rebuilt and loaded with them (weights included): the next forward builds them
        again on fresh hosts, and sends their state again. A node still running finishes
        on the host it started on."""
        with self._lock:
            self._hosts = {
                name: Host(name, self.catalog, stoppable=self.stoppable) for name in self._hosts
            }
        super().close()

    def _forked(self) -> None:
        """In a forked child, fresh hosts: the parent's may have been building or running a
        node as it forked, and the child's copy of that node is left half changed."""
        self._hosts = {
            name: Host(name, self.catalog, stoppable=self.stoppable) for name in self._hosts
        }

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
        host = self._hosts.get(worker)
        if host is None:
            here = graph.node(node)

            def run_here() -> Done:
                start = time.perf_counter_ns()
                own = own_state(graph._code_watch, here.implementing_classes())
                with running_here(here), own, self.stoppable():  # what it changes is its own
                    value = here.forward(*inputs, ctx)
                return Done(value, (time.perf_counter_ns() - start) // 1000)

            return run_here
        blueprint = self._blueprint(graph, node)
        job, sent = job_for(
            graph, node, worker, blueprint, inputs, ctx, keep=keep, holder=self._holder(graph)
        )

        def run_there() -> Done:
            start = time.perf_counter_ns()
            reply = host.run(job, sent)
            carried = 0
            if isinstance(reply, NeedState):
                state = graph.node(node).state_bytes()
                carried = len(state)
                reply = host.run(job, sent, state=state)
            assert not isinstance(reply, NeedState)
            value = unpack(reply.codec, reply.data)
            sizes = [len(data) for data in sent]
            facts = crossings(graph, node, worker, sizes, len(reply.data), carried)
            return Done(value, (time.perf_counter_ns() - start) // 1000, facts, reply.kept)

        return run_there


def _started(workers: Mapping[str, Worker], catalog: Catalog) -> EmbeddedBroker:
    """A broker of ``workers`` rebuilding through ``catalog``, none of them started yet:
    what a copy is made from (:meth:`EmbeddedBroker.__reduce__`)."""
    return EmbeddedBroker(workers, catalog=catalog)
