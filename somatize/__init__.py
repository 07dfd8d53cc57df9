"""somatize: pipelines that remember what does not change.

A pipeline is a graph of nodes. Frozen nodes (a pretrained encoder, a dataset
version) and cached nodes (outputs worth keeping) let the second epoch, the
second run, the second worker get answers back from a content-addressed store
instead of computing them — and never a stale one.

    from somatize import Graph, Node, Store

    g = Graph.somatize(Load().named("load").frozen() >> Embed(512).frozen().cached())
    g.forward({"at": 0, "take": 64}, store="features/")

``somatize`` itself never imports torch; ``import somatize.torch`` adds the
tensor side.
"""

from somatize.broker import Broker, Worker
from somatize.catalog import Catalog, Unbuildable
from somatize.codecs import CODECS, Codec, CodecError, Codecs, Opaque
from somatize.engine import Drifted, NodeFailed, Record, WatcherFailed
from somatize.errors import SomatizeError, SomatizeWarning
from somatize.graph import Cycle, Graph, GraphError, UnknownNode
from somatize.memory import Memory, Nameless, NotSettled, Unsettled, cacheable
from somatize.node import AlreadyBuilt, Context, Expr, Node, Undeclared
from somatize.placement import Placement
from somatize.store import Answer, BadName, Corrupt, Missing, NameNotFound, Store, StoreError

__version__ = "0.1.0"

__all__ = [
    "CODECS",
    "AlreadyBuilt",
    "Answer",
    "BadName",
    "Broker",
    "Catalog",
    "Codec",
    "CodecError",
    "Codecs",
    "Context",
    "Corrupt",
    "Cycle",
    "Drifted",
    "Expr",
    "Graph",
    "GraphError",
    "Memory",
    "Missing",
    "NameNotFound",
    "Nameless",
    "Node",
    "NodeFailed",
    "NotSettled",
    "Opaque",
    "Placement",
    "Record",
    "SomatizeError",
    "SomatizeWarning",
    "Store",
    "StoreError",
    "Unbuildable",
    "Undeclared",
    "UnknownNode",
    "Unsettled",
    "WatcherFailed",
    "Worker",
    "cacheable",
]
