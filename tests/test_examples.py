"""The examples run as users run them, and print what they promise."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_remember(tmp_path: Path) -> None:
    """The plain-Python example keeps on the first forward and recalls on the second."""
    out = _run("examples/remember.py", cwd=tmp_path)
    assert "'fact': 'kept'" in out and "'fact': 'recalled'" in out
    assert "clean ran 1 time(s), widest 1" in out


def test_notebook(tmp_path: Path) -> None:
    """The notebook's cells run as a script: short span, spared/recalled facts, two
    versions, the unsettled refusal and the crossing to a network worker."""
    out = _run("examples/notebook.py", cwd=tmp_path)
    assert "11.0 · the last span is short" in out
    assert "{'fact': 'spared', 'node': 'sms'}" in out
    assert "clean ran 1 time(s), widest 1" in out
    assert "another dataset, another version" in out
    assert "Call `somatize.data.settle(g)`" in out
    assert "bytes crossed" in out


@pytest.mark.slow
@pytest.mark.parametrize("how", [[], ["--deferred"]], ids=["content", "deferred"])
def test_lightning_example(tmp_path: Path, how: list[str]) -> None:
    """The Lightning example trains a head; epochs after the first recall every row, keyed
    by content or, with deferred images, by index."""
    out = _run(
        "examples/lightning/train.py", "--epochs", "2", "--samples", "512", *how, cwd=tmp_path
    )
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    epochs = {int(row[0]): row for row in rows if len(row) >= 5 and row[0].isdigit()}
    assert epochs[1][2] == "0%" and epochs[2][2] == "100%"


@pytest.mark.slow
def test_lightning_example_again_over_its_store(tmp_path: Path) -> None:
    """Run again over the store it kept, the Lightning example recalls every row from
    epoch 1, and its summary says so rather than that epoch 1 computed them."""
    args = ("examples/lightning/train.py", "--epochs", "2", "--samples", "256")
    first = _run(*args, "--store", "features", cwd=tmp_path)
    assert "than epoch 1, which computed every feature" in first
    again = _run(*args, "--store", "features", cwd=tmp_path)
    rows = [line.split() for line in again.splitlines() if line.strip()[:1].isdigit()]
    epochs = {int(row[0]): row for row in rows if len(row) >= 5 and row[0].isdigit()}
    assert epochs[1][2] == "100%" and epochs[1][3] == "0"
    assert "computed every feature" not in again
    assert "than epoch 1, which recalled every feature" in again


def test_lightning_example_quiet_keeps_somatize_warnings() -> None:
    """The example's ``quiet()`` silences Lightning's own advice, not a somatize warning
    raised from a callback hook (attributed to Lightning's frame that called the hook)."""
    pytest.importorskip("lightning")
    from somatize_torch._lightning_errors import NeverHits

    spec = importlib.util.spec_from_file_location(
        "quiet_example", ROOT / "examples/lightning/train.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    hook_caller = "lightning.pytorch.trainer.call"
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            example.quiet()
            warnings.warn_explicit("advice", UserWarning, "call.py", 1, module=hook_caller)
            warnings.warn_explicit("never hits", NeverHits, "call.py", 2, module=hook_caller)
    finally:
        logger.setLevel(level)
    assert [str(w.message) for w in caught] == ["never hits"]
