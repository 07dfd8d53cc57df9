"""The documentation's code runs: every ```python block of the README and docs/."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for index, code in enumerate(BLOCK.findall(page.read_text())):
            found.append((f"{page.relative_to(ROOT)}#{index}", code))
    return found


@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_documented_code_runs(where: str, code: str, tmp_path: Path) -> None:
    """The block runs to the end in a fresh interpreter, in an empty directory."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"


def test_there_is_documented_code() -> None:
    """The README shows code, so the test above checks something."""
    assert any(where.startswith("README.md") for where, _ in _blocks())
