"""The documentation's code runs: every ```python block of the README and docs/, and
prints what its comments say it prints."""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
LIMIT_S = 300


PRINT = re.compile(r"print\(.*\)(?:\s+#\s*(.*?))?\s*$")
COMMENT = re.compile(r"#\s?(.*?)\s*$")


def _said(code: str) -> list[str]:
    """What the comments of ``code`` say its prints print, in order: the comment after a
    ``print(...)`` line, or the comment lines under it, taken whole or up to a ``": "``
    that ends a Python literal (``# 10: the last span is short``). Only a literal is taken
    (``…`` standing for what changes from run to run); words are not."""
    said = []
    lines = code.splitlines()
    for at, line in enumerate(lines):
        found = PRINT.match(line.strip())
        if found is None:
            continue
        comment = found.group(1)
        if comment is None:
            under = []
            for below in lines[at + 1 :]:
                more = COMMENT.fullmatch(below.strip())
                if more is None:
                    break
                under.append(more.group(1).strip())
            comment = " ".join(under)
        cuts = [len(comment)] + [m.start() for m in re.finditer(": ", comment)]
        for cut in cuts:
            if _literal(comment[:cut]):
                said.append(comment[:cut])
                break
    return said


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text.replace("…", "0"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _unsaid(said: list[str], output: str) -> list[str]:
    """What of ``said`` is not printed in ``output``, each on a line of its own after the
    line the one before it matched (``…`` matching anything)."""
    lines = iter(output.splitlines())
    missing = []
    for text in said:
        shape = re.compile(".*".join(re.escape(part) for part in text.split("…")))
        if not any(shape.fullmatch(line.strip()) for line in lines):
            missing.append(text)
            lines = iter(output.splitlines())
    return missing


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for index, code in enumerate(BLOCK.findall(page.read_text())):
            found.append((f"{page.relative_to(ROOT)}#{index}", code))
    return found


_FORKS = r"""
import gc, json, os, signal, sys, types
import numpy, pyarrow, torch  # imported once, for every block: no submodule of their own

gc.freeze()  # what the imports made is not looked over (and so copied) by each child

for line in sys.stdin:
    job = json.loads(line)
    child = os.fork()
    if child == 0:
        break
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
else:
    sys.exit(0)

# The child runs the block as `python -c` would: in its own directory, as `__main__`,
# its output in a file, and to the interpreter's ordinary exit (atexit handlers run).
os.chdir(job["cwd"])
log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.dup2(log, 1)
os.dup2(log, 2)
os.close(log)
nothing = os.open(os.devnull, os.O_RDONLY)
os.dup2(nothing, 0)
os.close(nothing)
signal.alarm(job["limit"])
sys.argv = ["-c"]
main = types.ModuleType("__main__")
sys.modules["__main__"] = main
exec(compile(job["code"], "<string>", "exec"), main.__dict__)
"""
"""A process that imports the heavy libraries the blocks use (not somatize, and only what
importing each package loads, so that a block using a submodule it does not import fails
here as on its own), then forks a child per block: each block starts as a fresh
interpreter would, less the seconds those imports take."""


@pytest.fixture(scope="module")
def forks() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _FORKS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield process
    assert process.stdin is not None
    process.stdin.close()
    process.wait(timeout=60)


def _run(
    forks: subprocess.Popen[str], code: str, where: Path, limit: int = LIMIT_S
) -> tuple[int, str]:
    """How the block ``code`` exits when run in ``where`` (empty) for at most ``limit``
    seconds, and what it wrote."""
    assert forks.stdin is not None and forks.stdout is not None
    cwd = where / "run"
    cwd.mkdir()
    log = where / "output.log"
    job = {"code": code, "cwd": str(cwd), "log": str(log), "limit": limit}
    forks.stdin.write(json.dumps(job) + "\n")
    forks.stdin.flush()
    answer = forks.stdout.readline()
    assert answer, f"the process running the blocks ended (exit code {forks.wait()})"
    return int(answer), log.read_text(errors="replace")


@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_documented_code_runs(
    where: str, code: str, forks: subprocess.Popen[str], tmp_path: Path
) -> None:
    """The block runs to the end as a script of its own, in an empty directory, and prints
    what its comments say."""
    code_, output = _run(forks, code, tmp_path)
    assert code_ == 0, f"{where} failed (exit code {code_}):\n{output[-3000:]}"
    unsaid = _unsaid(_said(code), output)
    assert not unsaid, f"{where} does not print {unsaid}; it printed:\n{output[-3000:]}"


def test_there_is_documented_code() -> None:
    """The README shows code, so the test above checks something."""
    assert any(where.startswith("README.md") for where, _ in _blocks())


@pytest.mark.parametrize(
    ("code", "ends"),
    [
        ("import os\nassert os.listdir() == []\nprint('in', os.getcwd())", 0),
        ("import somatize\nx = 1\nraise ValueError('no')", 1),
        ("import sys\nsys.exit(3)", 3),
        ("import atexit, sys\natexit.register(lambda: sys.stderr.write('at exit'))", 0),
        ("class Here: pass\nimport pickle\nassert pickle.loads(pickle.dumps(Here()))", 0),
        ("import time\ntime.sleep(60)", -14),
        ("import pyarrow\npyarrow.parquet", 1),
    ],
    ids=[
        "fresh directory",
        "raises",
        "exits",
        "atexit runs",
        "main module",
        "cut off",
        "submodule not imported",
    ],
)
def test_blocks_run_as_scripts(
    code: str,
    ends: int,
    forks: subprocess.Popen[str],
    tmp_path: Path,
) -> None:
    """The runner reports how a block ended and what it wrote, as `python -c` would."""
    code_, output = _run(forks, code, tmp_path, limit=2 if "sleep" in code else LIMIT_S)
    assert code_ == ends, output
    if "ValueError" in code:
        assert "ValueError: no" in output
    if "parquet" in code:
        assert "has no attribute 'parquet'" in output
    if "atexit" in code:
        assert output == "at exit"
    if "getcwd" in code:
        assert output.strip() == f"in {tmp_path / 'run'}"


def test_what_comments_say_a_print_prints_is_taken() -> None:
    """A literal after a print, or in the comment lines under it, is what it prints; words
    are not taken, nor is a value the words go on to explain."""
    code = "\n".join(
        [
            "print(len(x))  # 2",
            "print(x)  # ['a', 'b']: plain values",
            "print(y)  # runs everything",
            "print(z)  # 16 + 17 = 33",
            "print(k)  # {'encoder': 'blake3:…'}",
            "print(seen)",
            "# [{'fact': 'spared'},",
            "#  {'fact': 'finished', 'took_us': …}]",
        ]
    )
    said = _said(code)
    assert said == [
        "2",
        "['a', 'b']",
        "{'encoder': 'blake3:…'}",
        "[{'fact': 'spared'}, {'fact': 'finished', 'took_us': …}]",
    ]
    printed = "2\n['a', 'b']\nwords\n{'encoder': 'blake3:ab12'}\n"
    facts = "[{'fact': 'spared'}, {'fact': 'finished', 'took_us': 9}]"
    assert _unsaid(said, printed + facts) == []
    assert _unsaid(said, printed + facts.replace("spared", "ran")) == [said[-1]]
    assert _unsaid(said, "3\n" + printed[2:] + facts) == ["2"]
    assert _unsaid(said[:2], "['a', 'b']\n2") == ["['a', 'b']"]  # in order


LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"```.*?```", re.DOTALL)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _headings(page: Path) -> set[str]:
    """The anchors GitHub makes of ``page``'s headings: lower case, spaces as dashes,
    punctuation other than dashes and underscores left out."""
    text = FENCED.sub("", page.read_text())
    titles = re.findall(r"^#+ (.*)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in titles}


def _broken_links(page: Path) -> list[str]:
    """The links of ``page`` (out of its code) to a file of the project that is not
    there, or to a heading its page does not have."""
    broken = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, heading = target.partition("#")
        there = (page.parent / path).resolve() if path else page
        if not there.exists() or (
            heading and there.suffix == ".md" and heading not in _headings(there)
        ):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_lead_somewhere(page: Path) -> None:
    """Each link of the README and docs/ leads to a file that is there and, into a page,
    to a heading it has."""
    assert _broken_links(page) == []


def test_data_errors_are_where_their_table_says() -> None:
    """Each error docs/data.md says somatize.data refuses with is importable from the
    module its row names, and is the builtins its row says it is."""
    text = (ROOT / "docs" / "data.md").read_text()
    table = text.split("## What is refused", 1)[1].split("\n\n", 2)[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert rows and all(len(row) == 4 for row in rows), table
    for name, home, kinds, _ in rows:
        module = importlib.import_module(home.strip("`"))
        error = getattr(module, name.strip("|` "))
        for kind in re.findall(r"`(\w+)`", kinds):
            assert issubclass(error, getattr(builtins, kind, None) or getattr(module, kind))
