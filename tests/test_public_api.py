"""The public surface, locked so it changes only on purpose, and the package boundary."""

from __future__ import annotations

import subprocess
import sys

import somatize


def test_public_names() -> None:
    """somatize exports exactly these names."""
    assert sorted(somatize.__all__) == sorted(
        [
            "CODECS", "AlreadyBuilt", "Answer", "BadName", "Broker", "Catalog", "Codec",
            "CodecError", "Codecs", "Context", "Corrupt", "Cycle", "Drifted", "Expr", "Graph",
            "GraphError", "Memory",
            "Missing", "NameNotFound", "Nameless", "Node", "NodeFailed", "NotSettled", "Opaque",
            "Placement", "Record", "SomatizeError", "SomatizeWarning", "Store", "StoreError",
            "Unbuildable", "Undeclared", "UnknownNode", "Unsettled", "WatcherFailed", "Worker",
            "cacheable",
        ]
    )  # fmt: skip
    for name in somatize.__all__:
        assert hasattr(somatize, name), name


def test_errors_share_one_root_and_their_builtin() -> None:
    """Every error is a SomatizeError and the builtin it is."""
    assert issubclass(somatize.Unsettled, somatize.SomatizeError)
    assert issubclass(somatize.Unsettled, ValueError)
    assert issubclass(somatize.NameNotFound, KeyError)
    assert issubclass(somatize.CodecError, TypeError)
    assert issubclass(somatize.NodeFailed, RuntimeError)


def test_core_never_imports_torch() -> None:
    """Importing somatize and running a graph loads no torch."""
    code = (
        "import sys, somatize, tempfile\n"
        "from somatize import Graph\n"
        "from tests.nodes import Rows, Largest\n"
        "g = Graph.somatize(Rows().frozen() >> Largest().frozen().cached())\n"
        "g.forward({'at': 0, 'take': 4}, store=tempfile.mkdtemp())\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
