"""Brokers: running nodes where they are placed.

A node placed with ``.at("w1")`` runs on the worker a broker knows as ``w1``;
a node placed nowhere runs where the graph is called. The graph, its keys and
its answers do not change with the broker — only where the work happens::

    from somatize import Broker, Worker

    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g.forward({"at": 0, "take": 32}, broker=broker)

Two brokers, one interface (:mod:`somatize.broker.base`):

- ``Broker.embedded({...})``, the default and free of dependencies: workers in
  this process. ``mode="local"`` hands Python objects across; ``mode="network"``
  sends every value through its codec and rebuilds the node from its blueprint
  through the catalog, exactly as if a wire were in between
  (:mod:`somatize.broker.embedded`).
- ``Broker.ray(address, {...})``, the ``ray`` extra: each worker is a Ray actor
  that keeps its nodes loaded, placed by name and resources, with the store
  shared (:mod:`somatize.broker.ray`).

A frozen node that holds state (a torch module made with
``somatize.torch.ModuleNode.build``) crosses to either kind of network worker:
its weights are sent once per worker and state, checked against the digest the
graph is frozen at, and kept loaded (:mod:`somatize.broker.host`).

Independent branches placed on different workers run at the same time: the
engine submits every placed node whose inputs are there and waits on what it
needs next.
"""

from somatize.broker.base import (
    Broker,
    BrokerClosed,
    Done,
    FailedOnWorker,
    GradientLost,
    NoRay,
    OtherCluster,
    Reentrant,
    StateMismatch,
    UnknownWorker,
    UnreadableCrossing,
    WorkerLost,
    WorkerTimeout,
)
from somatize.broker.embedded import EmbeddedBroker
from somatize.broker.worker import BadWorker, Worker

__all__ = [
    "BadWorker",
    "Broker",
    "BrokerClosed",
    "Done",
    "EmbeddedBroker",
    "FailedOnWorker",
    "GradientLost",
    "NoRay",
    "OtherCluster",
    "Reentrant",
    "StateMismatch",
    "UnknownWorker",
    "UnreadableCrossing",
    "Worker",
    "WorkerLost",
    "WorkerTimeout",
]
