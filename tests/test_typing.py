"""The documented calls type-check under ``mypy --strict``, as the py.typed marker promises,
and a wrong one does not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def mypy_errors(tmp_path: Path, code: str) -> list[str]:
    """The errors ``mypy --strict`` finds in ``code``, a user's program importing this
    checkout's somatize, each as ``line: message  [code]``."""
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache")),
            *("--no-error-summary", "--hide-error-context", str(program)),
        ],
        cwd=ROOT,  # the project's settings: how somatize itself is checked
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    prefix = f"{program}:"
    return [line[len(prefix) :] for line in done.stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_documented_store_calls_type_check(tmp_path: Path) -> None:
    """``Store(path)`` opens a store, which a checker must not refuse as an abstract class;
    ``keep_many`` takes each item's bytes whole, as ``keep`` does; and a forward's
    ``store=`` takes any path, as ``Store.of`` does."""
    errors = mypy_errors(
        tmp_path,
        """
        from pathlib import PurePosixPath

        from somatize import Answer, Graph, Store

        store = Store("features")
        key = "blake3:" + "ab" * 32
        answers: list[Answer] = store.keep_many([(key, b"an answer")], "plain")
        more: list[Answer] = store.keep_many([(key, [b"an ", b"answer"])], "plain")
        store.bind("data/v1", 3)

        def run(g: Graph) -> None:
            g.forward(1, store=PurePosixPath("features"))
        """,
    )
    assert errors == [
        '10: error: Argument 2 to "bind" of "Store" has incompatible type "int"; '
        'expected "str"  [arg-type]'
    ], errors


@pytest.mark.slow
def test_the_documented_store_of_ones_own_type_checks(tmp_path: Path) -> None:
    """The store subclass docs/store.md shows ("A store of your own") type-checks under
    ``mypy --strict``, its methods matching those of ``Store`` they override."""
    page = (ROOT / "docs" / "store.md").read_text()
    section = page[page.index("## A store of your own") :]
    code = section[section.index("```python\n") + len("```python\n") : section.index("```\n\n")]
    assert "class DictStore(Store)" in code
    assert mypy_errors(tmp_path, code) == []


@pytest.mark.slow
def test_contents_tells_what_each_section_holds(tmp_path: Path) -> None:
    """The docs' key rotation re-signs what ``contents`` reads, a digest from ``names`` and
    a record from ``answers``, once it has ruled out damage, as a checker follows it."""
    errors = mypy_errors(
        tmp_path,
        """
        from somatize.store import LocalStore
        from somatize.store.upkeep import contents

        old = LocalStore("rotating", signing_key="old secret")
        new = LocalStore("rotating", signing_key="new secret")
        for entry, digest in contents(old, "names"):
            if isinstance(digest, str):
                new.bind(entry.name, digest)
        for entry, answer in contents(old, "answers"):
            if not isinstance(answer, Exception):
                new.keep(answer.key, old.recall(answer.key)[1], answer.codec, answer.fingerprint)
        for entry, index in contents(old, "packs"):
            if not isinstance(index, Exception):
                new.bind(entry.name, index.key)
        """,
    )
    assert errors == ['15: error: "PackIndex" has no attribute "key"  [attr-defined]'], errors


@pytest.mark.slow
def test_saying_what_a_node_is_keeps_its_class(tmp_path: Path) -> None:
    """``.named()``, ``.frozen()``, ``.cached()`` and the rest hand back the node itself,
    and a checker sees it as what it is: its own attributes are there after them."""
    errors = mypy_errors(
        tmp_path,
        """
        from somatize import Context, Node

        class Scale(Node):
            def __init__(self, by: float) -> None:
                self.by = by

            def forward(self, x: float, ctx: Context) -> float:
                return x * self.by

        scale = Scale(2.0).named("scale").identified("m:Scale").frozen().cached().mapped()
        by: float = scale.at("w1").by
        scale.weight
        """,
    )
    assert errors == ['13: error: "Scale" has no attribute "weight"  [attr-defined]'], errors
