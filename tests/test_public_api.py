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


def test_somatize_torch_without_torch_says_how_to_install_it() -> None:
    """`import somatize.torch` where torch (or numpy) is missing says which, and names the
    extra that installs them."""
    for missing in ("torch", "numpy"):
        code = (
            "import sys\n"
            f"sys.modules[{missing!r}] = None  # as if it were not installed\n"
            "try:\n"
            "    import somatize.torch\n"
            "except ImportError as why:\n"
            "    print(why)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        said = done.stdout
        assert f"somatize.torch needs {missing}, which is not installed" in said, said
        assert "pip install 'somatize[torch]'" in said, said


def _raised_as_built() -> list[BaseException]:
    """One instance of each error (and warning) somatize exports, made as it raises it."""
    made: list[BaseException] = [
        somatize.NodeFailed("clean", "Clean", ZeroDivisionError("division by zero")),
        somatize.NodeFailed("rows", "Rows", ValueError("not a list"), raised=False, hint="map"),
        somatize.WatcherFailed({"fact": "ran", "node": "clean"}, ValueError("bad"), [1, 2]),
        somatize.Unsettled("head", "encoder"),
        somatize.Nameless("head", "encoder", "Encoder"),
        somatize.NotSettled("rows", "Rows", settles=True),
        somatize.NotSettled("enc", "Encoder", held="holds a module with weights"),
        # Built as raised, with a password in a URL it names: shown as ***, and so again.
        somatize.StoreError("cannot read ftp://user:secret@host/store: refused"),
    ]
    built = {type(error) for error in made}
    for name in somatize.__all__:
        kind = getattr(somatize, name)
        if isinstance(kind, type) and issubclass(kind, BaseException) and kind not in built:
            assert "__init__" not in vars(kind), f"{name} takes more than a message: add it above"
            made.append(kind(f"{name} happened"))
    return made


def test_errors_cross_a_process_boundary_whole() -> None:
    """Every error somatize exports, raised in a process pool's worker, is pickled to reach
    the caller: it comes back as the same type, message and attributes, rather than as a
    TypeError of its constructor that breaks (or hangs) the pool."""
    import pickle

    for error in _raised_as_built():
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error), type(error).__name__
        assert str(back) == str(error) and vars(back) == vars(error), type(error).__name__
