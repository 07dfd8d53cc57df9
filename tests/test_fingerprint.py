"""The code fingerprint kept beside an answer: what it covers, and what a drift names."""

from __future__ import annotations

import array
import collections
import copy
import dataclasses
import functools
import gc
import importlib
import itertools
import json
import logging
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import pytest

from somatize import Drifted, Graph, Node, SomatizeWarning, Store, catalog
from somatize.catalog import _marked, _marks, _members, _watch, fingerprint_of

_MODULE = "tests.fingerprinted"


def _load(path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module ``text`` makes, loaded from ``path`` (written first) under one name
    whatever it holds: as when a file is edited between two runs."""
    _write(path, text)
    loaded = types.ModuleType(_MODULE)
    loaded.__file__ = str(path)
    exec(compile(text, str(path), "exec"), loaded.__dict__)
    monkeypatch.setitem(sys.modules, _MODULE, loaded)
    return loaded


_WRITES = [0]


def _catalog_modules() -> list[types.ModuleType]:
    """The modules of the catalog's package, each loaded."""
    return [m for n, m in sorted(sys.modules.items()) if n.startswith("somatize.catalog.")]


def _defined(name: str) -> Any:
    """The function ``name`` of the catalog, from the module that defines it."""
    (found,) = {
        id(vars(m)[name]): vars(m)[name] for m in _catalog_modules() if name in vars(m)
    }.values()
    return found


def _patch_everywhere(monkeypatch: pytest.MonkeyPatch, name: str, value: Any) -> None:
    """Sets ``name`` to ``value`` in each module of the catalog that holds it — the one that
    defines it and each that imports it — so that every call of it, from any of them, is
    one of ``value``."""
    holders = [m for m in _catalog_modules() if name in vars(m)]
    assert holders, f"no module of the catalog holds `{name}`"
    for module in holders:
        monkeypatch.setattr(module, name, value)


def _write(path: Path, text: str) -> None:
    """Writes ``text`` to ``path``, each time with a later modification time, so what
    caches the file's lines sees that it changed."""
    path.write_text(textwrap.dedent(text))
    _WRITES[0] += 1
    stamp = 1_700_000_000_000_000_000 + _WRITES[0] * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def _printed(arguments: list[str], *paths: Path, **environment: str) -> str:
    """What ``python`` given ``arguments`` prints, run as a new process that imports from
    this checkout and from ``paths``, with ``environment`` set besides."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join([root, *map(str, paths)])
    done = subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **environment, "PYTHONPATH": path},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _package(root: Path, name: str, **modules: str) -> Path:
    """The folder of package ``name``, made under ``root``: an empty ``__init__`` (unless
    ``modules`` gives one) and each module of ``modules`` (its name → its text)."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, text in modules.items():
        _write(package / f"{module}.py", text)
    return package


def _fingerprints_in(
    root: Path, module: str, *kinds: str, also: tuple[Path, ...] = (), **environment: str
) -> list[str]:
    """The fingerprints of the classes ``kinds`` of ``module``, found under ``root`` (or
    under ``also``, imported from too), worked out in a new process with ``environment``
    set besides."""
    script = f"import {module} as m\nfrom somatize.catalog import fingerprint_of as f\n"
    script += f"print({', '.join(f'f(m.{kind})' for kind in kinds)})\n"
    return _printed(["-c", script], root, *also, **environment).split()


_BASES = """
from somatize import Node

class Src(Node):
    def forward(self, x, ctx):
        return x

class Base(Node):
    def forward(self, x, ctx):
        return x + STEP

class Inherits(Base):
    pass
"""


def test_an_edited_base_class_makes_a_recalled_answer_drifted(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint of a node covers the classes it inherits from: an answer kept before
    the ``forward`` it inherits was edited is recalled as drifted."""
    path = tmp_path / "fingerprinted.py"

    def graph(step: int) -> Graph:
        loaded = _load(path, _BASES.replace("STEP", str(step)), monkeypatch)
        return Graph.somatize(
            loaded.Src().named("src").frozen() >> loaded.Inherits().named("top").frozen().cached()
        )

    assert graph(1).forward(1, store=store) == 2
    edited = graph(2)
    with pytest.warns(Drifted, match="`top` was recalled"):
        assert edited.forward(1, store=store) == 2
    assert edited.record is not None and edited.record.outcome["top"] == "drifted"
    assert edited.forward(1, store=store, strict=True) == 3


def test_the_library_s_classes_are_not_in_a_fingerprint() -> None:
    """Node and the standard library's classes are left out of what a fingerprint covers."""

    class Plain(Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return x

    assert fingerprint_of(Plain) == fingerprint_of(Plain, Node, object, dict)
    assert fingerprint_of(Plain) != fingerprint_of(Node)


_ADD = """
from somatize import Node

class Add(Node):
    def forward(self, x, ctx):
        return x + STEP
"""


def test_a_file_edited_after_it_was_loaded_does_not_name_the_code_that_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class whose file was edited after it was loaded is fingerprinted by the code it
    runs, not by the file as it reads now: not as the edited class is."""
    path = tmp_path / "fingerprinted.py"
    running = _load(path, _ADD.replace("STEP", "1"), monkeypatch).Add
    _write(path, _ADD.replace("STEP", "100"))  # edited while the old code runs
    was = fingerprint_of(running)
    edited = _load(path, _ADD.replace("STEP", "100"), monkeypatch).Add
    assert fingerprint_of(edited) != was
    _write(path, _ADD.replace("STEP", "1"))
    assert fingerprint_of(_load(path, _ADD.replace("STEP", "1"), monkeypatch).Add) != (
        fingerprint_of(edited)
    )


_HELPED = """
import math
from somatize import Node

FACTOR = 5
OFFSET = 7
NAMES = ("a", "b")

def _inner(x):
    return x + OFFSET

def helper(x):
    return _inner(x) * 2

def unused(x):
    return x - 1

class UsesConst(Node):
    def forward(self, x, ctx):
        return x * FACTOR + len(NAMES) + math.floor(0.5)

class UsesHelper(Node):
    def forward(self, x, ctx):
        return helper(x)
"""


def test_module_helpers_and_constants_a_node_names_are_in_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain functions and constants of its module that a node's code names — and
    those the functions name in turn — are in its fingerprint; the rest of the module
    is not."""
    path = tmp_path / "fingerprinted.py"

    def fingerprints(old: str = "", new: str = "") -> tuple[str, str]:
        loaded = _load(path, _HELPED.replace(old, new) if old else _HELPED, monkeypatch)
        return fingerprint_of(loaded.UsesConst), fingerprint_of(loaded.UsesHelper)

    const, helped = fingerprints()
    factor = fingerprints("FACTOR = 5", "FACTOR = 6")
    assert factor[0] != const and factor[1] == helped
    offset = fingerprints("OFFSET = 7", "OFFSET = 8")  # named by a helper's helper
    assert offset[0] == const and offset[1] != helped
    inner = fingerprints("x + OFFSET", "x + OFFSET + 0")
    assert inner[0] == const and inner[1] != helped
    assert fingerprints("x - 1", "x - 2") == (const, helped)  # a function nothing names
    assert fingerprints() == (const, helped)


def test_a_helper_or_constant_rebound_after_its_class_was_fingerprinted_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's cell run again rebinds a helper or a constant that a node's code
    names, its class staying as it was: a graph built after that says the recalled
    answer drifted, and strict=True computes it with the helper as it is now."""
    loaded = _load(tmp_path / "fingerprinted.py", _HELPED, monkeypatch)
    const, helped = fingerprint_of(loaded.UsesConst), fingerprint_of(loaded.UsesHelper)
    monkeypatch.setattr(loaded, "FACTOR", 6)
    assert fingerprint_of(loaded.UsesConst) != const
    monkeypatch.setattr(loaded, "FACTOR", 5)
    assert fingerprint_of(loaded.UsesConst) == const
    assert fingerprint_of(loaded.UsesHelper) == helped

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesHelper().named("use").frozen().cached())

    assert graph().forward(5, store=store) == 24
    exec("def _inner(x):\n    return x + OFFSET + 100\n", loaded.__dict__)  # rebound
    assert fingerprint_of(loaded.UsesHelper) != helped
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted):
        assert graph().forward(5, store=store, watching=seen.append) == 24
    assert [fact["changed"] for fact in seen if fact["fact"] == "drifted"] == [["use"]]
    assert graph().forward(5, store=store, strict=True) == 224


_WRAPPED = """
import functools
from somatize import Node

@functools.lru_cache(maxsize=None)
def _doubled(x):
    return 2 * x

def _times(k, x):
    return k * x

_tripled = functools.partial(_times, 3)

class UsesWrapped(Node):
    def forward(self, x, ctx):
        return _doubled(x) + _tripled(x)
"""


def test_a_decorated_or_partial_helper_a_node_names_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper of a node's module that wraps a function of it (``functools.lru_cache``, a
    ``functools.partial``) is in the node's fingerprint as a plain helper is: by that
    function's code and what is bound — its source edited is another fingerprint, and
    one rebound (a notebook's cell run again) is seen by a graph built after, strict=True
    computing with it."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _WRAPPED, monkeypatch).UsesWrapped)
    edited = _load(path, _WRAPPED.replace("2 * x", "20 * x"), monkeypatch)
    assert fingerprint_of(edited.UsesWrapped) != was
    loaded = _load(path, _WRAPPED, monkeypatch)
    assert fingerprint_of(loaded.UsesWrapped) == was

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesWrapped().named("use").frozen().cached())

    assert graph().forward(1, store=store) == 5
    exec("@functools.lru_cache(maxsize=None)\ndef _doubled(x):\n    return 10 * x\n", vars(loaded))
    assert graph().forward(1, store=store, strict=True) == 13
    exec("_tripled = functools.partial(_times, 4)\n", vars(loaded))
    assert graph().forward(1, store=store, strict=True) == 14


_DECORATED = """
import functools
from somatize import Node

def logged(function):
    @functools.wraps(function)
    def wrapper(*args):
        return function(*args)
    return wrapper

STEP = 1

def _plus(x):
    return x + STEP

@logged
def _helped(x):
    return _plus(x)

class UsesDecorated(Node):
    def forward(self, x, ctx):
        return _helped(x)
"""


def test_what_a_helper_wrapped_by_a_decorator_of_its_module_names_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper of a node's module wrapped by a decorator that closes over it is followed
    into its module as a plain helper is: a constant or a function it names there, edited
    in the file, is another fingerprint (a new process never recalls the answer of the
    code before as its own), and one rebound is seen by a graph built after."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _DECORATED, monkeypatch).UsesDecorated)
    stepped = _load(path, _DECORATED.replace("STEP = 1", "STEP = 7"), monkeypatch)
    assert fingerprint_of(stepped.UsesDecorated) != was
    edited = _load(path, _DECORATED.replace("x + STEP", "x * STEP"), monkeypatch)
    assert fingerprint_of(edited.UsesDecorated) != was
    loaded = _load(path, _DECORATED, monkeypatch)
    assert fingerprint_of(loaded.UsesDecorated) == was

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesDecorated().named("use").frozen().cached())

    assert graph().forward(1, store=store) == 2
    monkeypatch.setattr(loaded, "STEP", 10)
    assert graph().forward(1, store=store, strict=True) == 11


_WRAPS_IN_ITS_PACKAGE = {
    "shifting": """
import functools

def shifted(function):
    @functools.wraps(function)
    def wrapper(*args):
        return function(*args) + 1
    return wrapper
""",
    "nodes": """
from somatize import Node

from wrapping.shifting import shifted

@shifted
def _helped(x):
    return x

class WrappedMethod(Node):
    @shifted
    def forward(self, x, ctx):
        return x

class WrappedHelper(Node):
    def forward(self, x, ctx):
        return _helped(x)
""",
}


def test_a_wrapper_a_decorator_of_its_package_makes_is_read_by_its_own_code(
    tmp_path: Path,
) -> None:
    """The wrapper a decorator of a node's package puts around its method or a helper it
    calls is read by its own code, not taken for the function it wraps (whose source is
    what Python says a wrapper's is): the wrapper edited is another fingerprint in a new
    process — never the answer of the code before recalled as its own."""
    _package(tmp_path, "wrapping", **_WRAPS_IN_ITS_PACKAGE)
    kinds = ("WrappedMethod", "WrappedHelper")
    first = _fingerprints_in(tmp_path, "wrapping.nodes", *kinds)
    assert _fingerprints_in(tmp_path, "wrapping.nodes", *kinds) == first
    edited = _WRAPS_IN_ITS_PACKAGE["shifting"].replace("+ 1", "* 2 + 1")
    _write(tmp_path / "wrapping" / "shifting.py", edited)
    now = _fingerprints_in(tmp_path, "wrapping.nodes", *kinds)
    assert [a != b for a, b in zip(now, first, strict=True)] == [True, True]


_SCALED_BY = """
def scaled_by(kind):
    def scale(x):
        return x * kind.k
    return scale

SCALE = scaled_by(Box)
"""
"""A helper a factory makes, closing over the class ``Box`` it is handed."""


_CLOSES_OVER_A_CLASS = {
    "boxes": """
class Box:
    k = 2
"""
    + _SCALED_BY
    + """
def registered(kind):
    def made():
        return kind()
    kind.make = staticmethod(made)
    return kind
""",
    "nodes": """
from somatize import Node

from . import boxes

class Scaled(Node):
    def forward(self, x, ctx):
        return boxes.SCALE(x)

@boxes.registered
class Remade(Node):
    def forward(self, x, ctx):
        return type(self).make()
""",
}


def test_a_class_a_helper_closes_over_is_named_by_how_it_is_written(tmp_path: Path) -> None:
    """A class a helper of a node's package closes over (one a factory is handed) is named
    by how it is written, as a class a class holds is: the class edited is another
    fingerprint in a new process, never the answer of the code before recalled as its own.
    A class whose own method closes over it is named so too, once."""
    _package(tmp_path, "boxing", **_CLOSES_OVER_A_CLASS)
    kinds = ("Scaled", "Remade")
    first = _fingerprints_in(tmp_path, "boxing.nodes", *kinds)
    assert _fingerprints_in(tmp_path, "boxing.nodes", *kinds) == first
    _write(tmp_path / "boxing" / "boxes.py", _CLOSES_OVER_A_CLASS["boxes"].replace("= 2", "= 3"))
    now = _fingerprints_in(tmp_path, "boxing.nodes", *kinds)
    assert [a != b for a, b in zip(now, first, strict=True)] == [True, False]


_CLOSES_OVER_A_CLASS_OF_A_PACKAGE = (
    """
from somatize import Node
from box_lib.boxes import Box
"""
    + _SCALED_BY
    + """
class Scaled(Node):
    def forward(self, x, ctx):
        return SCALE(x)
"""
)


@pytest.mark.parametrize("installed", [True, False])
def test_a_class_of_an_installed_package_a_helper_closes_over_is_named_by_its_name(
    installed: bool, tmp_path: Path
) -> None:
    """A class a helper of a node's module closes over that is an installed package's is
    named by its name alone, as a helper class of one is: the package upgraded (its class
    edited) leaves the fingerprint as it was, and the answers recalled. One of a package
    not installed (a shared checkout on ``$PYTHONPATH``) is the node's code: edited, it is
    another fingerprint."""
    boxes = "class Box:\n    k = 2\n"
    project, shared = _shared_checkout(
        tmp_path, _CLOSES_OVER_A_CLASS_OF_A_PACKAGE, "box_lib", boxes=boxes
    )
    if installed:
        _installed(shared, "box_lib")
    first = _fingerprints_in(project, "shared_nodes", "Scaled", also=(shared,))
    _write(shared / "box_lib" / "boxes.py", boxes.replace("= 2", "= 3"))
    now = _fingerprints_in(project, "shared_nodes", "Scaled", also=(shared,))
    assert (now == first) is installed


_CLOSES_OVER_A_CLASS_IN_PLACE = (
    """
from somatize import Node

class Box:
    k = 2
"""
    + _SCALED_BY
    + """
def forward_by(kind):
    def forward(self, x, ctx):
        return x * kind.k
    return forward

class Scaled(Node):
    def forward(self, x, ctx):
        return SCALE(x)

class Made(Node):
    forward = forward_by(Box)
"""
)


@pytest.mark.parametrize("kind", ["Scaled", "Made"])
def test_a_class_a_function_closes_over_given_another_value_in_place_is_seen(
    kind: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class a helper of a node's module closes over, or a method a factory made for the
    node closes over (``scaled_by(Box)``), given another value in place after a graph was
    built (``Box.k = 3``) is other code at that graph's next forward and for a graph built
    after: strict=True computes with it, never recalling what was computed before. Set
    back, it is the code of before again."""
    loaded = _load(tmp_path / "fingerprinted.py", _CLOSES_OVER_A_CLASS_IN_PLACE, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())

    built = graph()
    first = fingerprint_of(getattr(loaded, kind))
    assert _three_forwards(built, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded.Box, "k", 3)
    assert _three_forwards(built, store, "h", 3) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 3) == ["recalled", "recalled", "recalled"]
    assert fingerprint_of(getattr(loaded, kind)) != first
    loaded.Box.k = 2
    assert fingerprint_of(getattr(loaded, kind)) == first
    assert _three_forwards(built, store, "h", 2) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 2) == ["recalled", "recalled", "recalled"]


_CLOSES_OVER_A_CLASS_HOLDING_A_TABLE = """
from somatize import Node

class Box:
    table = {"k": 2}

    def by(self):
        return 1

def scaled_by(kind):
    def scale(x):
        return x * kind.table["k"] * kind().by()
    return scale

SCALE = scaled_by(Box)

class Scaled(Node):
    def forward(self, x, ctx):
        return SCALE(x)
"""


def test_a_table_or_method_of_a_class_a_helper_closes_over_changed_in_place_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of a class a helper closes over changed in place (``Box.table["k"] = 3``),
    then a method set on it (``Box.by = ...``), is other code at the next forward of a
    graph built before and of one built after: strict=True computes with it each time."""
    loaded = _load(tmp_path / "fingerprinted.py", _CLOSES_OVER_A_CLASS_HOLDING_A_TABLE, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.Scaled().named("h").frozen().cached())

    built = graph()
    assert _three_forwards(built, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.Box.table["k"] = 3
    assert _three_forwards(built, store, "h", 3) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 3) == ["recalled", "recalled", "recalled"]
    monkeypatch.setattr(loaded.Box, "by", lambda self: 5)
    assert _three_forwards(built, store, "h", 15) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 15) == ["recalled", "recalled", "recalled"]


_INSTALLED_BOX = """
class Unset:
    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__


UNSET = Unset()


class Box:
    k = 2

    def scaled(self, x, *, by=UNSET):
        return x * self.k
"""

_CLOSES_OVER_AN_INSTALLED_CLASS = """
from somatize import Node
from boxes_lib.box import Box

def made_with(kind):
    def make(x):
        return kind().scaled(x)
    return make

class Bigger(Box):
    k = 3

MAKE = made_with(Box)
MAKE_BIGGER = made_with(Bigger)

class MadeWithBox(Node):
    def forward(self, x, ctx):
        return MAKE(x)

class MadeWithBigger(Node):
    def forward(self, x, ctx):
        return MAKE_BIGGER(x)
"""


def test_a_class_of_an_installed_package_holding_a_sentinel_is_one_fingerprint_everywhere(
    tmp_path: Path,
) -> None:
    """A class of an installed package a helper closes over is named by its name, as a
    helper of such a package is: upgraded, it leaves the fingerprint as it was, and one
    whose code holds what no name says (a sentinel default, as pydantic's models hold) is
    the same fingerprint in every process. So is a class of the node's package deriving
    from it (a pydantic model of one's own). They were named by their code: another
    fingerprint in each process, so nothing was ever recalled."""
    project, shared = _shared_checkout(
        tmp_path, _CLOSES_OVER_AN_INSTALLED_CLASS, "boxes_lib", box=_INSTALLED_BOX
    )
    _installed(shared, "boxes_lib")
    kinds = ("MadeWithBox", "MadeWithBigger")
    first = _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,))
    assert _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,)) == first
    _write(shared / "boxes_lib" / "box.py", _INSTALLED_BOX.replace("k = 2", "k = 4"))
    assert _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,)) == first


_SHARED_DECORATORS = """
import functools

def _times(k, x):
    return k * x

def twice(function):
    @functools.wraps(function)
    def wrapper(*args):
        return _times(2, function(*args))
    return wrapper

def scaled(k):
    def decorator(function):
        @functools.wraps(function)
        def wrapper(*args):
            return k * function(*args)
        return wrapper
    return decorator

def doubled_forward(kind):
    forward = kind.forward
    @functools.wraps(forward)
    def wrapper(self, x, ctx):
        return 2 * forward(self, x, ctx)
    kind.forward = wrapper
    return kind
"""

_NODES_OF_SHARED = """
import functools
import os

import torch
from somatize import Node
from shared_lib.decorators import doubled_forward, scaled, twice

FACTOR = int(os.environ.get("FACTOR", "2"))

@twice
def _helped(x):
    return x

class Twice(Node):
    @twice
    def forward(self, x, ctx):
        return x

class WrappedHelper(Node):
    def forward(self, x, ctx):
        return _helped(x)

@doubled_forward
class ClassDecorated(Node):
    def forward(self, x, ctx):
        return x

class NoGradTwice(Node):
    @torch.no_grad()
    @twice
    def forward(self, x, ctx):
        return x

class Scaled(Node):
    @scaled(FACTOR)
    def forward(self, x, ctx):
        return x

class LibraryWrapped(Node):
    @functools.lru_cache(maxsize=None)
    def _cached(self, x):
        return x

    @torch.no_grad()
    def forward(self, x, ctx):
        return self._cached(x)
"""

_SHARED_KINDS = (
    "Twice",
    "WrappedHelper",
    "ClassDecorated",
    "NoGradTwice",
    "Scaled",
    "LibraryWrapped",
)


def _shared_checkout(
    tmp_path: Path, nodes: str = _NODES_OF_SHARED, package: str = "shared_lib", **modules: str
) -> tuple[Path, Path]:
    """A project folder holding a node module (``nodes``), and apart from it a folder
    holding the package it imports (a team's shared checkout on ``$PYTHONPATH``): of
    decorators, unless ``modules`` are given."""
    project, shared = tmp_path / "project", tmp_path / "shared"
    project.mkdir()
    shared.mkdir()
    _package(shared, package, **(modules or {"decorators": _SHARED_DECORATORS}))
    _write(project / "shared_nodes.py", nodes)
    return project, shared


def _installed(shared: Path, package: str) -> None:
    """Marks ``package``, in the folder ``shared``, installed there: a ``.dist-info``
    records each of its files, as ``pip install --target`` leaves."""
    info = shared / f"{package}-1.0.dist-info"
    info.mkdir()
    files = sorted(path.name for path in (shared / package).glob("*.py"))
    (info / "RECORD").write_text("".join(f"{package}/{name},,\n" for name in files))


def test_a_wrapper_of_a_package_not_installed_is_a_node_s_code(tmp_path: Path) -> None:
    """The wrapper a decorator of another package puts around a node's method, a helper it
    calls, or its class's method (a class decorator) is the node's code where that package
    is not installed (a shared checkout on ``$PYTHONPATH``): the decorator edited
    (``twice`` made to treble), or a helper it calls, is another fingerprint in a new
    process, so the old answers are never recalled as current. So is another value a
    decorator is given (``@scaled(FACTOR)``, read from the environment), which its
    wrapper closes over. The standard library's and torch's wrappers are still left out."""
    project, shared = _shared_checkout(tmp_path)
    first = _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,))
    assert _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,)) == first
    factor = _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,), FACTOR="3")
    assert [a != b for a, b in zip(factor, first, strict=True)] == [False] * 4 + [True, False]
    edited = _SHARED_DECORATORS.replace("_times(2,", "_times(3,")
    edited = edited.replace("k * function", "k * k * function").replace(
        "2 * forward", "3 * forward"
    )
    _write(shared / "shared_lib" / "decorators.py", edited)
    now = _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,))
    assert [a != b for a, b in zip(now, first, strict=True)] == [True] * 5 + [False]
    helper = edited.replace("return k * x", "return k * x + 1")
    _write(shared / "shared_lib" / "decorators.py", helper)
    again = _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,))
    assert [a != b for a, b in zip(again, now, strict=True)] == [
        True,
        True,
        False,
        True,
        False,
        False,
    ]


def test_a_wrapper_of_an_installed_package_is_not_a_node_s_code(tmp_path: Path) -> None:
    """The same decorators from a package installed (a ``.dist-info`` records it) are not
    the node's code: upgraded, they leave every fingerprint as it was, as torch's and the
    standard library's do."""
    project, shared = _shared_checkout(tmp_path)
    _installed(shared, "shared_lib")
    first = _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,))
    edited = _SHARED_DECORATORS.replace("_times(2,", "_times(3,").replace(
        "2 * forward", "3 * forward"
    )
    _write(shared / "shared_lib" / "decorators.py", edited.replace("k * function", "-k * function"))
    assert _fingerprints_in(project, "shared_nodes", *_SHARED_KINDS, also=(shared,)) == first


_SHARED_FEATS = """
_K = 2

def _times(x):
    return _K * x

def scale(x):
    return _times(x)

class Scaler:
    def run(self, x):
        return _times(x)
"""

_NODES_OF_SHARED_HELPERS = """
import shared_base.cfg
import shared_base.feats as feats
from shared_base.feats import Scaler, scale
from somatize import Node

def _apply(x, op=scale):
    return op(x)

class Imports(Node):
    def forward(self, x, ctx):
        return scale(x)

class ReadsTheModule(Node):
    def forward(self, x, ctx):
        return feats.scale(x)

class TakesItByDefault(Node):
    def forward(self, x, ctx):
        return _apply(x)

class UsesAClass(Node):
    def forward(self, x, ctx):
        return Scaler().run(x)

class ReadsAConstant(Node):
    def forward(self, x, ctx):
        return shared_base.cfg.FACTOR * x

class UsesNone(Node):
    def forward(self, x, ctx):
        return x
"""

_SHARED_HELPER_KINDS = (
    "Imports",
    "ReadsTheModule",
    "TakesItByDefault",
    "UsesAClass",
    "ReadsAConstant",
    "UsesNone",
)


def _shared_helpers(tmp_path: Path) -> tuple[Path, Path]:
    """:func:`_shared_checkout`, of a package of helpers and constants."""
    nodes = _NODES_OF_SHARED_HELPERS
    return _shared_checkout(tmp_path, nodes, "shared_base", feats=_SHARED_FEATS, cfg="FACTOR = 2\n")


def test_a_helper_of_a_package_not_installed_is_a_node_s_code(tmp_path: Path) -> None:
    """A plain function or a helper class of another package a node's code calls —
    imported from it, read off its module, or taken by default by a helper — is the
    node's code where that package is not installed (a shared checkout on
    ``$PYTHONPATH``), with the helpers and values of its module it reads in turn, and so
    is a constant of that package the node reads: edited, each is another fingerprint in
    a new process, so the old answers are never recalled as current. A node that uses
    none of them is left as it was."""
    project, shared = _shared_helpers(tmp_path)
    kinds = _SHARED_HELPER_KINDS
    first = _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,))
    assert _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,)) == first
    _write(shared / "shared_base" / "feats.py", _SHARED_FEATS.replace("_K = 2", "_K = 3"))
    now = _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,))
    assert [a != b for a, b in zip(now, first, strict=True)] == [True] * 4 + [False, False]
    _write(shared / "shared_base" / "cfg.py", "FACTOR = 3\n")
    again = _fingerprints_in(project, "shared_nodes", *kinds, also=(shared,))
    assert [a != b for a, b in zip(again, now, strict=True)] == [False] * 4 + [True, False]


def test_a_helper_of_an_installed_package_is_not_a_node_s_code(tmp_path: Path) -> None:
    """The same helpers and constant from a package installed (a ``.dist-info`` records
    it) are not the node's code: upgraded, they leave every fingerprint as it was, as
    numpy's do."""
    project, shared = _shared_helpers(tmp_path)
    _installed(shared, "shared_base")
    first = _fingerprints_in(project, "shared_nodes", *_SHARED_HELPER_KINDS, also=(shared,))
    _write(shared / "shared_base" / "feats.py", _SHARED_FEATS.replace("_K = 2", "_K = 3"))
    _write(shared / "shared_base" / "cfg.py", "FACTOR = 3\n")
    assert _fingerprints_in(project, "shared_nodes", *_SHARED_HELPER_KINDS, also=(shared,)) == first


_BESIDE_NODES = """
import beside_helpers
from somatize import Node
from beside_helpers import shift

class ImportsIt(Node):
    def forward(self, x, ctx):
        return shift(x)

class ReadsItsModule(Node):
    def forward(self, x, ctx):
        return beside_helpers.shift(x)
"""


def test_a_helper_of_a_module_beside_a_node_s_module_is_its_code(tmp_path: Path) -> None:
    """A helper a node's top-level module imports from a top-level module in the same
    folder (``helpers.py`` beside the module, no package holding them) is the node's code:
    edited, it is another fingerprint in a new process, so what the old helper computed is
    never recalled as the new one's without a drift."""
    _write(tmp_path / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _write(tmp_path / "beside_nodes.py", _BESIDE_NODES)
    kinds = ("ImportsIt", "ReadsItsModule")
    first = _fingerprints_in(tmp_path, "beside_nodes", *kinds)
    assert _fingerprints_in(tmp_path, "beside_nodes", *kinds) == first
    _write(tmp_path / "beside_helpers.py", "def shift(x):\n    return x + 2\n")
    now = _fingerprints_in(tmp_path, "beside_nodes", *kinds)
    assert [a != b for a, b in zip(now, first, strict=True)] == [True, True]


_SCRIPT_BESIDE = """
import sys
from somatize import Graph, Node
from beside_helpers import shift

class Shifted(Node):
    def forward(self, x, ctx):
        return shift(x)

facts = []
g = Graph.somatize(Shifted().named("shifted").frozen().cached())
print(g.forward(1, store=sys.argv[1], watching=facts.append), *(f["fact"] for f in facts))
"""


def test_a_script_s_helper_edited_beside_it_makes_its_recalled_answer_drifted(
    tmp_path: Path,
) -> None:
    """A script whose node calls a helper of the module beside it (``python train.py``,
    ``from helpers import shift``), run again after the helper was edited, recalls the
    answer kept before as drifted, never silently, and computes it anew under strict."""
    code = tmp_path / "code"
    code.mkdir()
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _write(code / "train.py", _SCRIPT_BESIDE)
    store = str(tmp_path / "store")
    script = str(code / "train.py")
    assert _printed([script, store]).split() == ["2", "ran", "kept", "finished"]
    assert _printed([script, store]).split() == ["2", "recalled", "finished"]
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 2\n")
    assert _printed(["-W", "ignore", script, store]).split() == [
        "2",
        "recalled",
        "drifted",
        "finished",
    ]


_SCRIPT_SPAWNING = """
import multiprocessing, sys
from somatize import Graph, Node
from beside_helpers import shift

SCALE = 3

def scaled(x):
    return x * SCALE

class Shifted(Node):
    def forward(self, x, ctx):
        return scaled(shift(x))

def answer(store):
    facts = []
    g = Graph.somatize(Shifted().named("shifted").frozen().cached())
    return [g.forward(1, store=store, watching=facts.append), *(f["fact"] for f in facts)]

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(*pool.apply(answer, (sys.argv[1],)), "|", *answer(sys.argv[1]))
"""


def test_a_script_s_node_kept_in_a_spawned_process_is_recalled_in_the_script(
    tmp_path: Path,
) -> None:
    """A process ``multiprocessing`` spawns (a pool's, a DataLoader's worker, a
    ``ddp_spawn`` rank) loads the script as ``__mp_main__``: a node the script defines,
    kept there, is the same node under the same key, of the same code, for the script
    itself — recalled, not computed again, and not drifted."""
    code = tmp_path / "code"
    code.mkdir()
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _write(code / "spawning.py", _SCRIPT_SPAWNING)
    store = str(tmp_path / "store")
    printed = _printed([str(code / "spawning.py"), store]).split()
    assert printed == ["6", "ran", "kept", "finished", "|", "6", "recalled", "finished"]


_SAYING_SPAWNED_AND_HERE = """
import multiprocessing
from somatize.catalog import fingerprint_of

def said():
    return fingerprint_of({node})

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(pool.apply(said), said())
"""


def _fingerprints_spawned_and_here(tmp_path: Path, script: str, node: str) -> list[str]:
    """The fingerprint of the class ``node`` of ``script``, run as a script: in a process
    ``multiprocessing`` spawns from it, which loads it as ``__mp_main__``, and in it."""
    path = tmp_path / "script.py"
    _write(path, script + _SAYING_SPAWNED_AND_HERE.format(node=node))
    return _printed([str(path)]).split()


_SCRIPT_SPAWNING_A_FACTORY = """
import dataclasses
from somatize import Node

class Bag:
    pass

@dataclasses.dataclass
class Holder:
    bag: Bag = dataclasses.field(default_factory=Bag)

class Uses(Node):
    def forward(self, x, ctx):
        return (Holder(), x)[1]
"""


def test_a_script_s_dataclass_default_made_by_its_class_is_the_same_code_when_spawned(
    tmp_path: Path,
) -> None:
    """A helper dataclass whose default a class of the script makes
    (``field(default_factory=Bag)``) is the same code in a process ``multiprocessing``
    spawns, which loads the script as ``__mp_main__``, as in the script."""
    spawned, here = _fingerprints_spawned_and_here(tmp_path, _SCRIPT_SPAWNING_A_FACTORY, "Uses")
    assert spawned == here


_SCRIPT_SPAWNING_A_COUNTER = """
from somatize import Node

CALLS = 0

def counted(x):
    global CALLS
    CALLS += 1
    return x

class Counts(Node):
    def forward(self, x, ctx):
        return counted(x)
"""


def test_a_script_s_global_its_code_sets_is_the_same_code_when_spawned(tmp_path: Path) -> None:
    """A global of the script its node's code sets as it runs (``global CALLS``), taken as
    the script's text assigns it, is the same code in a process ``multiprocessing``
    spawns, which loads the script as ``__mp_main__``, as in the script."""
    spawned, here = _fingerprints_spawned_and_here(tmp_path, _SCRIPT_SPAWNING_A_COUNTER, "Counts")
    assert spawned == here


_SCRIPT_SPAWNING_A_REPLACED_TORCH_FUNCTION = """
import torch.nn.functional as F

def plain(x):
    return x

F.relu = plain
from torch.nn.functional import relu
from somatize import Node

class Uses(Node):
    def forward(self, x, ctx):
        return relu(x)
"""


def test_a_torch_function_a_script_replaced_is_the_same_code_when_spawned(
    tmp_path: Path,
) -> None:
    """A function of torch's that a script sets to one of its own before importing it
    (``F.relu = plain``, then ``from torch.nn.functional import relu``) is the same code in
    a process ``multiprocessing`` spawns, which loads the script as ``__mp_main__``, as in
    the script."""
    spawned, here = _fingerprints_spawned_and_here(
        tmp_path, _SCRIPT_SPAWNING_A_REPLACED_TORCH_FUNCTION, "Uses"
    )
    assert spawned == here


_MODULE_NAMING = """
from somatize import Node
from somatize.catalog import fingerprint_of, identity_of

class Doubled(Node):
    def forward(self, x, ctx):
        return x * 2

def named():
    return [identity_of(Doubled), fingerprint_of(Doubled)]

if __name__ == "__main__":
    print(*named())
"""


def test_a_script_run_with_dash_m_is_recalled_where_its_module_is_imported(
    tmp_path: Path,
) -> None:
    """A script run as ``python -m pkg.script`` names its nodes by the module it is
    imported as (``pkg.script``), in it and in a process ``multiprocessing`` spawns from
    it: its answers are recalled where ``pkg.script`` is imported, and the other way."""
    code = tmp_path / "code"
    code.mkdir()
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _package(code, "pkg", script=_SCRIPT_SPAWNING)
    imported = "import sys, pkg.script as m; print(*m.answer(sys.argv[1]))"
    first = str(tmp_path / "first")
    assert _printed(["-m", "pkg.script", first], code).split() == [
        *("6", "ran", "kept", "finished", "|", "6", "recalled", "finished"),
    ]
    assert _printed(["-c", imported, first], code).split() == ["6", "recalled", "finished"]
    second = str(tmp_path / "second")
    assert _printed(["-c", imported, second], code).split() == ["6", "ran", "kept", "finished"]
    assert _printed(["-m", "pkg.script", second], code).split() == [
        *("6", "recalled", "finished", "|", "6", "recalled", "finished"),
    ]


def test_a_script_run_by_its_path_or_by_a_runner_stays_named_as_of_main(
    tmp_path: Path,
) -> None:
    """A script run by its path is named as of ``__main__``, and so is one a runner of the
    standard library runs (``python -m cProfile``): that runner is what ``-m`` ran, not the
    script. Run with ``-m`` itself, it is named by its module."""
    code = tmp_path / "code"
    code.mkdir()
    package = _package(code, "pkg", script=_MODULE_NAMING)
    path = str(package / "script.py")
    by_path = _printed([path], code).split()
    assert by_path[0] == "__main__:Doubled"
    profiled = _printed(["-m", "cProfile", "-o", str(tmp_path / "profile"), path], code)
    assert profiled.split()[1] == by_path[1]
    as_module = _printed(["-m", "pkg.script"], code).split()
    imported = "import pkg.script as m; print(*m.named())"
    assert as_module == _printed(["-c", imported], code).split()
    assert as_module[0] == "pkg.script:Doubled"


_MODULE_CROSSING = """
import sys
from somatize import Broker, Graph, Node, Worker

print("loaded", __name__)

class Doubled(Node):
    def forward(self, rows, ctx):
        return [r * 2 for r in rows]

if __name__ == "__main__":
    crossing = Graph.somatize(Doubled().named("doubled").at("w1"))
    worker = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen = []
    print(*crossing.forward([1, 2], broker=worker, watching=seen.append))
    print(*(f["fact"] for f in seen))
"""


def test_a_script_run_with_dash_m_crosses_to_a_network_worker_without_running_again(
    tmp_path: Path,
) -> None:
    """A node of a script run as ``python -m pkg.script``, named ``pkg.script:…``, is
    rebuilt on an embedded network worker from the script that runs: its module is not
    imported a second time, which would run its code again."""
    code = tmp_path / "code"
    code.mkdir()
    _package(code, "pkg", script=_MODULE_CROSSING)
    printed = _printed(["-m", "pkg.script"], code).splitlines()
    assert printed[0] == "loaded __main__"
    assert printed[1] == "2 4"
    assert sorted(printed[2].split()) == ["crossed", "crossed", "finished", "ran"]


_MODULE_TENSOR_TREE = """
import dataclasses, multiprocessing, sys
from typing import NamedTuple
import torch
import somatize.torch
from somatize import Broker, Graph, Node, Worker

class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor

@dataclasses.dataclass
class Out:
    pair: Pair

class Split(Node):
    def forward(self, x, ctx):
        return Out(Pair(torch.ones(2) * x, torch.zeros(2)))

def answer(store):
    g = Graph.somatize(Split().named("split").frozen().cached())
    out = g.forward(3, store=store)
    return [type(out).__name__, type(out.pair).__name__, g.record.outcome["split"]]

def crossed():
    g = Graph.somatize(Split().named("split").at("w1"))
    out = g.forward(3, broker=Broker.embedded({"w1": Worker.generic(mode="network")}))
    return type(out) is Out and type(out.pair) is Pair

if __name__ == "__main__":
    print(crossed(), end=" | ")
    print(*answer(sys.argv[1]), "|", *answer(sys.argv[1]), end=" | ")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(*pool.apply(answer, (sys.argv[1],)))
"""


@pytest.mark.parametrize("imported_besides", [False, True])
def test_a_tensor_tree_of_classes_of_a_script_run_with_dash_m_is_kept_and_recalled(
    tmp_path: Path, imported_besides: bool
) -> None:
    """A node of a script run as ``python -m pkg.script`` answering a dataclass or a
    namedtuple of tensors the script defines, named ``pkg.script:…``, was refused by the
    codec, which looked for the class in a module ``pkg.script`` not loaded, or loaded
    again by an import besides the script (holding other classes of the same names):
    nothing was kept, and one crossing back from a network worker was refused. The script
    that runs is where that module's classes are found, in it, in a process it spawns,
    and where ``pkg.script`` is imported."""
    code = tmp_path / "code"
    code.mkdir()
    script = _MODULE_TENSOR_TREE
    if imported_besides:  # a module of the package imports the script by its name
        script = script.replace(
            "import somatize.torch\n", "import somatize.torch\nimport pkg.uses\n"
        )
    _package(code, "pkg", script=script, uses="import pkg.script\n")
    store = str(tmp_path / "store")
    assert _printed(["-m", "pkg.script", store], code).split() == [
        *("True", "|", "Out", "Pair", "ran", "|", "Out", "Pair", "recalled"),
        *("|", "Out", "Pair", "recalled"),
    ]
    imported = "import sys, pkg.script as m; print(*m.answer(sys.argv[1]))"
    assert _printed(["-c", imported, store], code).split() == ["Out", "Pair", "recalled"]


def test_a_node_of_a_checkout_beside_the_library_is_the_same_code_from_any_folder(
    tmp_path: Path,
) -> None:
    """Nodes of a folder that holds somatize itself too (a checkout of it, its tests, run
    with ``python -c`` in it or from elsewhere): somatize's functions their module names are
    the library's, as where it is installed, never the node's code, and a package with no
    ``__init__`` found through the working directory and ``$PYTHONPATH`` alike is one
    folder: each node's fingerprint is the same from every folder it is run in."""
    root = str(Path(__file__).resolve().parent.parent)
    code = (
        "from pathlib import Path\n"
        "from somatize.catalog import fingerprint_of\n"
        "from tests.broker_nodes import spinning\n"
        "g = spinning(Path('.'))\n"
        "print(*(fingerprint_of(*g.node(n).implementing_classes()) for n in ('rows', 'fine')))\n"
    )
    printed = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=where,
            env={**os.environ, "PYTHONPATH": root},
            timeout=120,
            check=True,
        ).stdout
        for where in (root, str(tmp_path))
    ]
    assert printed[0] == printed[1]
    assert len(printed[0].split()) == 2


_BESIDE_INSTALLED = """
import beside_helpers, bundled_lib
from somatize import Node

class CallsBoth(Node):
    def forward(self, x, ctx):
        return bundled_lib.scale(beside_helpers.shift(x))
"""


def test_a_package_installed_beside_a_node_s_module_is_not_its_code(tmp_path: Path) -> None:
    """A package installed into the folder of a node's module (``pip install --target``,
    a bundle beside its handler: a ``.dist-info`` records it) is not the node's code, as one
    in ``site-packages`` is not: upgraded, it leaves the fingerprint as it was — numpy
    bundled so was another fingerprint in each process, every recall drifted — while a
    helper of the user's own beside it still is the node's code."""
    _write(tmp_path / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _package(tmp_path, "bundled_lib", __init__="def scale(x):\n    return x * 2\n")
    info = tmp_path / "bundled_lib-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("bundled_lib/__init__.py,,\nbundled_lib-1.0.dist-info/RECORD,,\n")
    _write(tmp_path / "beside_nodes.py", _BESIDE_INSTALLED)
    first = _fingerprints_in(tmp_path, "beside_nodes", "CallsBoth")
    _write(tmp_path / "bundled_lib" / "__init__.py", "def scale(x):\n    return x * 3\n")
    assert _fingerprints_in(tmp_path, "beside_nodes", "CallsBoth") == first
    _write(tmp_path / "beside_helpers.py", "def shift(x):\n    return x + 2\n")
    assert _fingerprints_in(tmp_path, "beside_nodes", "CallsBoth") != first


_SCRIPT_PRINTS = """
from somatize import Node
from somatize.catalog import fingerprint_of
from beside_helpers import shift

class Shifted(Node):
    def forward(self, x, ctx):
        return shift(x)

print(fingerprint_of(Shifted))
"""


def test_a_helper_beside_a_linked_script_s_file_is_its_code(tmp_path: Path) -> None:
    """A script run through a link to it from another folder (``~/bin/train.py``) imports
    its helpers from the folder of its file, where Python looks: a helper edited there is
    another fingerprint, as for the script run where it lies."""
    code = tmp_path / "code"
    code.mkdir()
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 1\n")
    _write(code / "train.py", _SCRIPT_PRINTS)
    link = tmp_path / "bin" / "train.py"
    link.parent.mkdir()
    link.symlink_to(code / "train.py")
    first = _printed([str(link)])
    assert _printed([str(code / "train.py")]) == first
    _write(code / "beside_helpers.py", "def shift(x):\n    return x + 2\n")
    assert _printed([str(link)]) != first


_COMMENTED = {
    "tools": """
def shift(x):
    \"\"\"Moves x on.\"\"\"
    # by one
    return x + 1
""",
    "nodes": """
from somatize import Node

from .tools import shift as moved

class Commented(Node):
    \"\"\"Scales.\"\"\"

    scale = lambda self, x: x * 2  # noqa: E731

    def forward(self, x, ctx):
        \"\"\"Answers x moved and scaled.\"\"\"
        def twice(y):
            return y * 2  # doubled

        # moved first
        return self.scale(twice(moved(x)))
""",
}


def test_a_comment_a_docstring_or_the_layout_edited_is_no_other_code(tmp_path: Path) -> None:
    """What a node's code computes is not in its comments, its docstrings nor how its lines
    are laid out: a package edited only there keeps the fingerprint in a new process, so an
    answer it kept is recalled as the code's own, not drifted (nor computed again under
    `strict`), while an edit of what it computes is still another fingerprint."""
    package = _package(tmp_path, "commented", **_COMMENTED)
    first = _fingerprints_in(tmp_path, "commented.nodes", "Commented")
    for module, old, new in [
        ("tools", "# by one", "# by one, always"),
        ("tools", "Moves x on.", "Moves x on by one."),
        ("nodes", "# doubled", "# times two"),
        ("nodes", "# moved first", "# moved first, then scaled"),
        ("nodes", "Answers x moved and scaled.", "Answers x, moved, scaled."),
        ("nodes", "x: x * 2  # noqa: E731", "x: (x * 2)  # noqa: E731"),
        (
            "nodes",
            "self.scale(twice(moved(x)))",
            "self.scale(\n            twice(moved(x))\n        )",
        ),
    ]:
        text = (package / f"{module}.py").read_text()
        _write(package / f"{module}.py", text.replace(old, new))
        assert _fingerprints_in(tmp_path, "commented.nodes", "Commented") == first, old
    text = (package / "tools.py").read_text()
    _write(package / "tools.py", text.replace("x + 1", "x + 2"))
    assert _fingerprints_in(tmp_path, "commented.nodes", "Commented") != first


_WRAPS_BY_AN_OBJECT = """
import functools

from somatize import Node

class Shifted:
    def __init__(self, function):
        functools.update_wrapper(self, function)
        self.function = function

    def __call__(self, *args):
        return self.function(*args) + 1

@Shifted
def _helped(x):
    return x

class ObjectWrappedHelper(Node):
    def forward(self, x, ctx):
        return _helped(x)

class ObjectWrappedMember(Node):
    @Shifted
    def step(x):
        return x

    def forward(self, x, ctx):
        return self.step(x)
"""


def test_the_call_of_a_decorator_object_of_its_module_is_in_a_node_s_fingerprint(
    tmp_path: Path,
) -> None:
    """A helper, or a member of a node's class, wrapped by an object of a decorator class of
    its module (``functools.update_wrapper(self, function)``) is read with the ``__call__``
    that runs around it: that method edited is another fingerprint in a new process —
    never the answer of the code before recalled as its own."""
    _write(tmp_path / "elsewhere.py", _WRAPS_BY_AN_OBJECT)
    kinds = ("ObjectWrappedHelper", "ObjectWrappedMember")
    first = _fingerprints_in(tmp_path, "elsewhere", *kinds)
    assert _fingerprints_in(tmp_path, "elsewhere", *kinds) == first
    _write(tmp_path / "elsewhere.py", _WRAPS_BY_AN_OBJECT.replace("+ 1", "* 2 + 1"))
    now = _fingerprints_in(tmp_path, "elsewhere", *kinds)
    assert [a != b for a, b in zip(now, first, strict=True)] == [True, True]


_MAKES_A_CONFIG = """
import dataclasses

from somatize import Node

SIZE = 2

def _sizes():
    return [SIZE]

@dataclasses.dataclass
class Config:
    scales: list = dataclasses.field(default_factory=lambda: [1, 2])
    sizes: list = dataclasses.field(default_factory=_sizes)

class MakesConfig(Node):
    def forward(self, x, ctx):
        config = Config()
        return x + sum(config.scales) + sum(config.sizes)

class HoldsConfigClass(Node):
    make = Config

    def forward(self, x, ctx):
        return x + sum(self.make().scales)
"""


def test_what_a_helper_dataclass_makes_its_fields_with_is_in_a_node_s_fingerprint(
    tmp_path: Path,
) -> None:
    """A function a helper dataclass of a node's module makes a field's default with
    (``field(default_factory=...)``) is in the node's fingerprint by how it is written,
    and what it names in its module too: the function, or a constant it names, edited is
    another fingerprint in a new process — never the answer computed with the old
    defaults recalled as its own."""
    _write(tmp_path / "elsewhere.py", _MAKES_A_CONFIG)
    kinds = ("MakesConfig", "HoldsConfigClass")
    first = _fingerprints_in(tmp_path, "elsewhere", *kinds)
    assert _fingerprints_in(tmp_path, "elsewhere", *kinds) == first
    _write(tmp_path / "elsewhere.py", _MAKES_A_CONFIG.replace("[1, 2]", "[1, 3]"))
    now = _fingerprints_in(tmp_path, "elsewhere", *kinds)
    assert [a != b for a, b in zip(now, first, strict=True)] == [True, True]
    _write(tmp_path / "elsewhere.py", _MAKES_A_CONFIG.replace("SIZE = 2", "SIZE = 3"))
    assert _fingerprints_in(tmp_path, "elsewhere", *kinds)[0] != first[0]


_TAKES_A_LAMBDA = """
from somatize import Node

STEP = 1

def _doubled(x):
    return 2 * x

class TakesLambda(Node):
    def forward(self, x, ctx, step=lambda x: x + STEP):
        return step(x)

class TakesHelper(Node):
    def forward(self, x, ctx, step=_doubled):
        return step(x)
"""


def test_what_a_function_a_method_takes_by_default_names_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function of a node's module a method takes by default (``step=lambda x: x +
    STEP``, ``step=_doubled``) is in its fingerprint by how it is written, and followed into
    its module as one it calls is: it, or a constant it names, edited in the file is another
    fingerprint (a new process never recalls the answer of the code before as its own), and
    one rebound is seen at the next forward."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _TAKES_A_LAMBDA, monkeypatch).TakesLambda)
    edited = _load(path, _TAKES_A_LAMBDA.replace("STEP = 1", "STEP = 7"), monkeypatch)
    assert fingerprint_of(edited.TakesLambda) != was
    helped = fingerprint_of(_load(path, _TAKES_A_LAMBDA, monkeypatch).TakesHelper)
    edited = _load(path, _TAKES_A_LAMBDA.replace("2 * x", "3 * x"), monkeypatch)
    assert fingerprint_of(edited.TakesHelper) != helped
    loaded = _load(path, _TAKES_A_LAMBDA, monkeypatch)
    assert fingerprint_of(loaded.TakesLambda) == was
    assert fingerprint_of(loaded.TakesHelper) == helped
    graph = Graph.somatize(loaded.TakesLambda().named("t").frozen().cached())
    assert graph.forward(1, store=store) == 2
    monkeypatch.setattr(loaded, "STEP", 10)
    with pytest.warns(Drifted, match="`t` was recalled"):
        assert graph.forward(1, store=store) == 2
    assert graph.forward(1, store=store, strict=True) == 11


_CALLS_A_BOUND_METHOD = """
from somatize import Node

class Scaler:
    def __init__(self, k):
        self.k = k

    def scale(self, x):
        return x * self.k

SCALER = Scaler(2)
SCALE = SCALER.scale

class CallsBound(Node):
    def forward(self, x, ctx):
        return SCALE(x)
"""


def test_a_method_bound_to_an_object_its_module_holds_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method of a helper class bound to an object a node's module holds (``SCALE =
    SCALER.scale``) that its code calls is in its fingerprint by that method's code and the
    object, as one its class holds is: the method edited in the file is another fingerprint
    (a new process never recalls the answer of the code before as its own), and the object
    changed in place is seen at the next forward."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _CALLS_A_BOUND_METHOD, monkeypatch).CallsBound)
    edited = _load(path, _CALLS_A_BOUND_METHOD.replace("x * self.k", "x * self.k + 1"), monkeypatch)
    assert fingerprint_of(edited.CallsBound) != was
    loaded = _load(path, _CALLS_A_BOUND_METHOD, monkeypatch)
    assert fingerprint_of(loaded.CallsBound) == was
    graph = Graph.somatize(loaded.CallsBound().named("b").frozen().cached())
    assert graph.forward(1, store=store) == 2
    loaded.SCALER.k = 5
    with pytest.warns(Drifted, match="`b` was recalled"):
        assert graph.forward(1, store=store) == 2
    assert graph.forward(1, store=store, strict=True) == 5


_WRAPPED_TWICE = """
import functools
from somatize import Node

def logged(function):
    @functools.wraps(function)
    def wrapper(*args):
        return function(*args)
    return wrapper

@logged
def _helped(x):
    return x + 1

@functools.lru_cache(maxsize=None)
def _cached(x):
    return x + 1

class UsesLogged(Node):
    def forward(self, x, ctx):
        return _helped(x)

class UsesCached(Node):
    def forward(self, x, ctx):
        return _cached(x)
"""


@pytest.mark.parametrize(("kind", "helper"), [("UsesLogged", "_helped"), ("UsesCached", "_cached")])
def test_what_a_decorated_helper_wraps_given_other_code_in_place_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, helper: str
) -> None:
    """The function a helper of a node's module wraps (by a decorator of its module, by
    ``functools.lru_cache``) given other code in place after its graph was built (as a
    reloader does) is seen at the next forward: an answer kept before is recalled as
    drifted, and strict=True computes it with the code as it is now."""
    loaded = _load(tmp_path / "fingerprinted.py", _WRAPPED_TWICE, monkeypatch)
    graph = Graph.somatize(getattr(loaded, kind)().named("w").frozen().cached())
    assert graph.forward(1, store=store) == 2
    wrapped = getattr(loaded, helper).__wrapped__
    monkeypatch.setattr(wrapped, "__code__", (lambda x: 10 * x).__code__)
    getattr(getattr(loaded, helper), "cache_clear", lambda: None)()
    with pytest.warns(Drifted, match="`w` was recalled"):
        assert graph.forward(1, store=store) == 2
    assert graph.forward(1, store=store, strict=True) == 10
    fresh = Graph.somatize(getattr(loaded, kind)().named("w").frozen().cached())
    assert fresh.forward(1, store=store, strict=True) == 10


_DECORATED_METHOD = """
import functools
from somatize import Node

EXTRA = 0

def shifted(function):
    @functools.wraps(function)
    def wrapper(self, x, ctx):
        return function(self, x, ctx) + EXTRA
    return wrapper

class Decorated(Node):
    @shifted
    def forward(self, x, ctx):
        return x + 1
"""


def test_the_wrapper_a_decorator_of_its_module_puts_around_a_method_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's method wrapped by a decorator of its module is its code with the wrapper
    that runs around it: the wrapper edited, or a constant it names, is another
    fingerprint (a new process never recalls the answer of the code before as its own),
    and one given other code in place is seen at the next forward."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _DECORATED_METHOD, monkeypatch).Decorated)
    edited = _load(path, _DECORATED_METHOD.replace("+ EXTRA", "* 2 + EXTRA"), monkeypatch)
    assert fingerprint_of(edited.Decorated) != was
    extra = _load(path, _DECORATED_METHOD.replace("EXTRA = 0", "EXTRA = 5"), monkeypatch)
    assert fingerprint_of(extra.Decorated) != was
    loaded = _load(path, _DECORATED_METHOD, monkeypatch)
    assert fingerprint_of(loaded.Decorated) == was
    graph = Graph.somatize(loaded.Decorated().named("d").frozen().cached())
    assert graph.forward(1, store=store) == 2

    def doubling(function: Callable[..., int]) -> Callable[..., int]:
        def wrapper(self: Any, x: int, ctx: Any) -> int:
            return 2 * function(self, x, ctx)

        return wrapper

    monkeypatch.setattr(loaded.Decorated.forward, "__code__", doubling(len).__code__)
    with pytest.warns(Drifted, match="`d` was recalled"):
        assert graph.forward(1, store=store) == 2
    assert graph.forward(1, store=store, strict=True) == 4


_TABLED = """
from somatize import Node

SCALE = {"by": 2}

def _scaled(x):
    return x * SCALE["by"]

class UsesTable(Node):
    def forward(self, x, ctx):
        return _scaled(x)
"""


def test_a_table_of_its_module_a_node_s_helper_reads_is_in_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict of a node's module that a helper it names reads is in the node's fingerprint
    as the module's text writes it: alike for a module loaded alike, another for a source
    that gives it another value — and not by what it holds, so that one the code fills as it
    runs (a log, a cache) is the same code."""
    path = tmp_path / "fingerprinted.py"
    loaded = _load(path, _TABLED, monkeypatch)
    was = fingerprint_of(loaded.UsesTable)
    loaded.SCALE["seen"] = 1
    assert fingerprint_of(_load(path, _TABLED, monkeypatch).UsesTable) == was
    edited = _load(path, _TABLED.replace('"by": 2', '"by": 5'), monkeypatch)
    assert fingerprint_of(edited.UsesTable) != was


_IMPORTING = """
from posixpath import basename
from somatize import Node

class Based(Node):
    def forward(self, x, ctx):
        return basename(x)
"""


def test_an_imported_function_a_node_names_replaced_by_a_fake_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function a node's module imports from another module, replaced there by another (a
    monkeypatch putting in a fake), is other code for a graph built after, strict=True
    computing with the fake; put back, the fingerprint is what it was."""
    loaded = _load(tmp_path / "fingerprinted.py", _IMPORTING, monkeypatch)
    was = fingerprint_of(loaded.Based)

    def graph() -> Graph:
        return Graph.somatize(loaded.Based().named("base").frozen().cached())

    assert graph().forward("a/b", store=store) == "b"
    with monkeypatch.context() as patched:
        patched.setattr(loaded, "basename", _shouted)
        assert fingerprint_of(loaded.Based) != was
        assert graph().forward("a/b", store=store, strict=True) == "A/B"
    assert fingerprint_of(loaded.Based) == was
    assert graph().forward("a/b", store=store, strict=True) == "b"


def _shouted(path: str) -> str:
    """A fake of ``basename``."""
    return path.upper()


def _whispered(path: str) -> str:
    """Another fake of ``basename``."""
    return path.lower()


def test_a_function_of_another_package_its_module_text_assigns_is_not_named_by_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function of another package that a node's module text assigns under a name of its
    own (``basename = other.basename``) is not in the node's fingerprint: that package's
    code given other code (an upgrade) is the same fingerprint."""
    other = types.ModuleType("elsewhere_package")
    exec("def basename(path):\n    return path.rsplit('/', 1)[-1]\n", vars(other))
    monkeypatch.setitem(sys.modules, "elsewhere_package", other)
    text = _IMPORTING.replace(
        "from posixpath import basename\n",
        "import elsewhere_package\nbasename = elsewhere_package.basename\n",
    )
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, text, monkeypatch).Based)
    monkeypatch.setattr(other.basename, "__code__", _whispered.__code__)
    assert fingerprint_of(_load(path, text, monkeypatch).Based) == was


def test_a_function_put_where_a_node_s_module_text_names_nothing_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function of another module put in a node's module under a name its text neither
    imports nor assigns (set from outside, as a test does), then replaced by another, is
    other code for a graph built after: strict=True computes with the one there now."""
    text = _IMPORTING.replace("from posixpath import basename\n", "")
    loaded = _load(tmp_path / "fingerprinted.py", text, monkeypatch)
    monkeypatch.setattr(loaded, "basename", _shouted, raising=False)

    def graph() -> Graph:
        return Graph.somatize(loaded.Based().named("base").frozen().cached())

    assert graph().forward("a/B", store=store) == "A/B"
    monkeypatch.setattr(loaded, "basename", _whispered)
    assert graph().forward("a/B", store=store, strict=True) == "a/b"


def test_a_helper_of_another_module_of_its_package_is_in_a_node_s_fingerprint(
    tmp_path: Path,
) -> None:
    """A function a node's module imports from another module of its package (``from
    proj.tools import double as twice``), or names in such a module it imports
    (``tools.double``), is in the node's fingerprint as a helper of its own module is, with
    the constants it reads there: the same in two fresh processes, another once that
    module's source gives it other code or other constants."""
    tools = "FACTOR = 2\n\ndef double(x):\n    return FACTOR * x\n"
    package = _package(
        tmp_path,
        "proj",
        tools=tools,
        nodes="""
        from somatize import Node
        from proj import tools
        from proj.tools import double as twice

        class Doubles(Node):
            def forward(self, x, ctx):
                return twice(x)

        class DoublesThere(Node):
            def forward(self, x, ctx):
                return tools.double(x)
        """,
    )

    def fingerprints() -> list[str]:
        return _fingerprints_in(tmp_path, "proj.nodes", "Doubles", "DoublesThere")

    was = fingerprints()
    assert fingerprints() == was
    for edited in (tools.replace("FACTOR = 2", "FACTOR = 3"), tools.replace("FACTOR *", "1 *")):
        _write(package / "tools.py", edited)
        now = fingerprints()
        assert now[0] != was[0] and now[1] != was[1], edited
    _write(package / "tools.py", tools)
    assert fingerprints() == was


def test_each_name_a_node_s_functions_read_in_a_module_of_its_package_is_in_its_fingerprint(
    tmp_path: Path,
) -> None:
    """A node whose forward reads a name of another module of its package
    (``tools.double``) and whose other method reads another there (``tools.triple``) has
    both in its fingerprint: either given other code in that module's source is another
    fingerprint, where only the names the first function looked at were followed, and an
    answer of the old code was recalled for the other's."""
    tools = "def double(x):\n    return 2 * x\n\ndef triple(x):\n    return 3 * x\n"
    package = _package(
        tmp_path,
        "twoproj",
        tools=tools,
        nodes="""
        from somatize import Node
        from twoproj import tools

        class ReadsTwo(Node):
            def forward(self, x, ctx):
                return tools.double(x) + self.other(x)

            def other(self, x):
                return tools.triple(x)
        """,
    )
    was = _fingerprints_in(tmp_path, "twoproj.nodes", "ReadsTwo")
    for edited in (tools.replace("2 *", "5 *"), tools.replace("3 *", "5 *")):
        _write(package / "tools.py", edited)
        assert _fingerprints_in(tmp_path, "twoproj.nodes", "ReadsTwo") != was, edited


def test_a_helper_of_its_package_replaced_by_a_fake_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function of another module of a node's package that its code names there
    (``tools.double``), replaced there by another (a monkeypatch putting in a fake), is other
    code for a graph built after: strict=True computes with the fake."""
    package = tmp_path / "fakedproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write(package / "tools.py", "def double(x):\n    return 2 * x\n")
    _write(
        package / "nodes.py",
        """
        from somatize import Node
        from fakedproj import tools

        class DoublesThere(Node):
            def forward(self, x, ctx):
                return tools.double(x)
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        nodes = importlib.import_module("fakedproj.nodes")

        def graph() -> Graph:
            return Graph.somatize(nodes.DoublesThere().named("d").frozen().cached())

        assert graph().forward(3, store=store) == 6
        monkeypatch.setattr(nodes.tools, "double", _hundredfold)
        assert graph().forward(3, store=store, strict=True) == 300
    finally:
        for name in ("fakedproj.nodes", "fakedproj.tools", "fakedproj"):
            sys.modules.pop(name, None)


def _hundredfold(x: int) -> int:
    """A fake of ``double``."""
    return 100 * x


_ATTRIBUTE_NAMED = """
import random

from somatize import Node

class Drawer:
    def __init__(self):
        self.draws = random.Random()

    def run(self, x):
        return x

class Doubler:
    def run(self, x):
        return 2 * x

class ReadsItsOwn(Node):
    def __init__(self):
        super().__init__()
        self.helper = Doubler()

    def forward(self, x, ctx):
        return self.helper.run(x)

helper = Drawer()
"""


def test_a_global_named_as_an_attribute_a_node_reads_is_not_in_its_fingerprint(
    tmp_path: Path,
) -> None:
    """A global of a node's module bearing the name of an attribute its code reads
    (``self.helper`` beside ``helper = Drawer()``, an object marked by which object it is)
    is no global that code reads: the node's fingerprint is the same in two fresh processes,
    and the same as with no such global — not one of each process, which kept answers were
    taken as computed by other code for."""
    without = _ATTRIBUTE_NAMED.replace("helper = Drawer()", "")
    for folder, text in [("with", _ATTRIBUTE_NAMED), ("without", without)]:
        (tmp_path / folder).mkdir()
        _package(tmp_path / folder, "named", nodes=text)
    first = _fingerprints_in(tmp_path / "with", "named.nodes", "ReadsItsOwn")
    assert _fingerprints_in(tmp_path / "with", "named.nodes", "ReadsItsOwn") == first
    assert _fingerprints_in(tmp_path / "without", "named.nodes", "ReadsItsOwn") == first


_HELPER_CLASS = """
from somatize import Node

class Helper:
    def run(self, x):
        return x * 2

class UsesHelperClass(Node):
    def forward(self, x, ctx):
        return Helper().run(x)
"""


def test_a_helper_class_of_its_module_a_node_names_is_in_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class of a node's module that its code names (``Helper().run(x)``), no node itself,
    is in the node's fingerprint by how its methods are written: alike for a module loaded
    alike, another once the source gives a method other code."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _HELPER_CLASS, monkeypatch).UsesHelperClass)
    assert fingerprint_of(_load(path, _HELPER_CLASS, monkeypatch).UsesHelperClass) == was
    edited = _load(path, _HELPER_CLASS.replace("x * 2", "x * 3"), monkeypatch)
    assert fingerprint_of(edited.UsesHelperClass) != was


_HELPER_CLASS_NAMING = """
from somatize import Node

STEP = 1

def _inner(x):
    return x * 2

class Other:
    def back(self):
        return Helper

class Helper:
    TABLE = {"by": 1}

    def run(self, x):
        return _inner(x) + STEP * self.TABLE["by"] + (Other().back() is Helper)

class UsesHelperClass(Node):
    def forward(self, x, ctx):
        return Helper().run(x)
"""


@pytest.mark.parametrize(
    ("was", "now"),
    [("x * 2", "x * 3"), ("STEP = 1", "STEP = 2"), ('TABLE = {"by": 1}', 'TABLE = {"by": 2}')],
)
def test_what_a_helper_class_s_methods_name_in_their_module_is_in_the_fingerprint(
    was: str, now: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function or constant of its module that a helper class's method names
    (``Helper().run(x)`` calling ``_inner(x)``), or a table the class holds, is in the node's
    fingerprint, as one its own code names: alike for a module loaded alike (two helpers
    naming each other among them), another once the source gives it other code or
    values."""
    path = tmp_path / "fingerprinted.py"
    first = fingerprint_of(_load(path, _HELPER_CLASS_NAMING, monkeypatch).UsesHelperClass)
    assert fingerprint_of(_load(path, _HELPER_CLASS_NAMING, monkeypatch).UsesHelperClass) == first
    edited = _load(path, _HELPER_CLASS_NAMING.replace(was, now), monkeypatch)
    assert fingerprint_of(edited.UsesHelperClass) != first


def test_a_helper_class_given_another_method_is_seen_by_a_graph_built_after(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper class a node's code names, given another method after its fingerprint was
    worked out (a monkeypatch), is other code for a graph built after: strict=True computes
    with the method it has now."""
    loaded = _load(tmp_path / "fingerprinted.py", _HELPER_CLASS, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesHelperClass().named("use").frozen().cached())

    assert graph().forward(3, store=store) == 6
    monkeypatch.setattr(loaded.Helper, "run", _plus_one)
    assert graph().forward(3, store=store, strict=True) == 4


def _plus_one(self: Any, x: int) -> int:
    """Another ``run`` for a helper class."""
    return x + 1


_STATEFUL = """
from somatize import Node

CALLS = 0
_TABLE = None

def _table():
    global _TABLE
    if _TABLE is None:
        _TABLE = {"scale": 3}
    return _TABLE

class Counts(Node):
    def forward(self, x, ctx):
        global CALLS
        CALLS += 1
        return x * _table()["scale"]
"""


def test_module_state_a_node_s_code_assigns_is_not_code(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counter a node's forward moves and a table a helper loads on first use are the
    module's state, taken as the module's text assigns them: a graph built after a
    forward moved them recalls what the first kept, not drifted (the fingerprint is the
    one a fresh process gets), and another value written in the text is a drift."""
    loaded = _load(tmp_path / "fingerprinted.py", _STATEFUL, monkeypatch)
    first = fingerprint_of(loaded.Counts)
    assert Graph.somatize(loaded.Counts().named("n").frozen().cached()).forward(2, store=store) == 6
    assert (loaded.CALLS, loaded._TABLE) == (1, {"scale": 3})
    assert fingerprint_of(loaded.Counts) == first
    again = Graph.somatize(loaded.Counts().named("n").frozen().cached())
    seen: list[dict[str, Any]] = []
    assert again.forward(2, store=store, watching=seen.append) == 6
    assert [fact["fact"] for fact in seen] == ["recalled", "finished"]
    # Taken as the module's text assigns it: another value written there is other code.
    edited = _load(
        tmp_path / "fingerprinted.py", _STATEFUL.replace("CALLS = 0", "CALLS = 5"), monkeypatch
    )
    assert fingerprint_of(edited.Counts) != first


def test_a_fingerprinted_class_is_not_kept_alive_by_what_its_fingerprint_noted() -> None:
    """A class fingerprinted from a namespace of its own (a plugin run with ``runpy``, a
    module loaded again) goes with that namespace: what its fingerprint notes about the
    module names its code looks up holds neither."""
    space: dict[str, Any] = {"__name__": "tests.fingerprint_plugin"}
    exec(compile(_HELPED, "<plugin>", "exec"), space)
    kind = weakref.ref(space["UsesHelper"])
    fingerprint_of(space["UsesHelper"], space["UsesConst"])
    del space
    gc.collect()
    assert kind() is None


_CELL = """
from somatize import Node

class Src(Node):
    def forward(self, x, ctx):
        return x

class Add(Node):
    def forward(self, x, ctx):
        return x + STEP
"""


def _cell(step: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A notebook cell defining ``Src`` and ``Add``, run with ``Add`` adding ``step``."""
    cell = types.ModuleType("tests.fingerprint_cell")
    exec(compile(_CELL.replace("STEP", str(step)), "<cell>", "exec"), cell.__dict__)
    monkeypatch.setitem(sys.modules, cell.__name__, cell)
    return cell


def test_a_drift_names_the_nodes_whose_code_changed_whatever_they_were_called(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes a drifted fact names are those whose code changed, though the fingerprint
    the answer was kept with was first worked out in a graph whose nodes had other
    names."""
    cell = _cell(1, monkeypatch)
    other = Graph.somatize(
        cell.Src().named("load").frozen() >> cell.Add().named("plus").frozen().cached()
    )
    other.forward(5, store=str(tmp_path / "elsewhere"))
    kept = Graph.somatize(cell.Src().frozen() >> cell.Add().frozen().cached())
    assert kept.forward(5, store=store) == 6
    cell = _cell(2, monkeypatch)
    edited = Graph.somatize(cell.Src().frozen() >> cell.Add().frozen().cached())
    seen: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Drifted)
        assert edited.forward(5, store=store, watching=seen.append) == 6
    drifted = [fact for fact in seen if fact["fact"] == "drifted"]
    assert [fact["changed"] for fact in drifted] == [["add"]]


def test_a_watcher_that_edits_the_nodes_a_drift_names_leaves_the_record_as_it_happened(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list of changed nodes in the ``drifted`` fact ``watching`` is handed is its own:
    emptying it leaves the record's fact naming them."""
    cell = _cell(1, monkeypatch)
    kept = Graph.somatize(cell.Src().frozen() >> cell.Add().frozen().cached())
    assert kept.forward(5, store=store) == 6
    cell = _cell(2, monkeypatch)
    edited = Graph.somatize(cell.Src().frozen() >> cell.Add().frozen().cached())
    handed: list[list[str]] = []

    def empty(fact: dict[str, Any]) -> None:
        if fact["fact"] == "drifted":
            handed.append(fact["changed"])
            fact["changed"].clear()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Drifted)
        assert edited.forward(5, store=store, watching=empty) == 6
    assert handed == [[]]
    assert edited.record is not None
    assert [f["changed"] for f in edited.record.facts if f["fact"] == "drifted"] == [["add"]]


_EVERYWHERE = """
import dataclasses
import os
import re
import time
from somatize import Node

LETTERS = frozenset({"a", "b", "c", "d"})
HERE = os.path.dirname(os.path.abspath(__file__))
STARTED = time.time()

def kept(xs):
    return [x for x in xs if x not in LETTERS]

class Base(Node):
    scale = 2.5

    root = os.path.expanduser("~")

    def forward(self, xs, ctx):
        assert HERE and STARTED and self.root
        return sum(len(x) for x in kept(xs)) * self.scale

@dataclasses.dataclass
class Total(Base):
    offset: int = 3

    @property
    def shifted(self):
        return self.offset + 1

print(__import__("somatize.catalog").catalog.fingerprint_of(Total))
"""


_COMPUTED_FROM_ANOTHER = """
from somatize import Node

EMBED = 128
WIDTH = EMBED
HIDDEN = 4 * WIDTH


class Widens(Node):
    def forward(self, x, ctx):
        return x * HIDDEN
"""


def test_a_constant_computed_from_others_of_its_module_is_named_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constant its module computes from others it assigns (``HIDDEN = 4 * WIDTH``,
    ``WIDTH = EMBED``) is named by how it is computed and by how those are: another value
    written for ``EMBED`` is another fingerprint, though the node reads only ``HIDDEN`` —
    never one fingerprint for both, which would recall across processes what was computed
    with the old width."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _COMPUTED_FROM_ANOTHER, monkeypatch).Widens)
    assert fingerprint_of(_load(path, _COMPUTED_FROM_ANOTHER, monkeypatch).Widens) == was
    wider = _COMPUTED_FROM_ANOTHER.replace("EMBED = 128", "EMBED = 256")
    assert fingerprint_of(_load(path, wider, monkeypatch).Widens) != was


_COMPUTED_AS_LOADED = """
import re
from somatize import Node

def compute():
    return 2.0

SCALE = compute()
PATTERN = re.compile("a+")

class Scales(Node):
    def forward(self, x, ctx):
        return x * SCALE

class Holds(Node):
    factor = compute()

    def forward(self, x, ctx):
        return x * self.factor

class Matches(Node):
    def forward(self, x, ctx):
        return len(PATTERN.findall(x))
"""


def test_a_computed_constant_set_by_hand_since_is_another_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value its module or class computes as it loads (``SCALE = compute()``), named by how
    it is computed, that a test or a user sets to another (``mod.SCALE = 3.0``) after an
    answer was kept is another fingerprint: the answer is recalled as drifted, strict=True
    computes with the new value, and the value set back is the old fingerprint again."""
    loaded = _load(tmp_path / "fingerprinted.py", _COMPUTED_AS_LOADED, monkeypatch)
    was = {k: fingerprint_of(getattr(loaded, k)) for k in ("Scales", "Holds", "Matches")}

    def graph() -> Graph:
        return Graph.somatize(loaded.Scales().named("scale").frozen().cached())

    assert graph().forward(3.0, store=store) == 6.0
    monkeypatch.setattr(loaded, "SCALE", 3.0)
    with pytest.warns(Drifted, match="`scale` was recalled"):
        assert graph().forward(3.0, store=store) == 6.0
    assert graph().forward(3.0, store=store, strict=True) == 9.0
    monkeypatch.setattr(loaded.Holds, "factor", 3.0)
    monkeypatch.setattr(loaded, "PATTERN", re.compile("b+"))
    now = {k: fingerprint_of(getattr(loaded, k)) for k in was}
    assert all(now[k] != was[k] for k in was)
    monkeypatch.setattr(loaded, "SCALE", 2.0)
    monkeypatch.setattr(loaded.Holds, "factor", 2.0)
    assert fingerprint_of(loaded.Scales) == was["Scales"]
    assert fingerprint_of(loaded.Holds) == was["Holds"]


def test_a_computed_constant_set_before_the_first_fingerprint_is_another_one(
    tmp_path: Path,
) -> None:
    """A computed constant set by hand after its module loaded but before its node was first
    fingerprinted (a test's monkeypatch in a new process) is told from the value the module
    computed: never the fingerprint of a process that left it as it was."""
    _package(tmp_path, "scaled", nodes=_COMPUTED_AS_LOADED)
    script = (
        "import sys, scaled.nodes as m\nfrom somatize.catalog import fingerprint_of as f\n"
        "if sys.argv[1] == 'set':\n    m.SCALE = 3.0\n    m.Holds.factor = 3.0\n"
        "print(f(m.Scales), f(m.Holds))\n"
    )
    kept = _printed(["-c", script, "keep"], tmp_path).split()
    assert _printed(["-c", script, "keep"], tmp_path).split() == kept
    changed = _printed(["-c", script, "set"], tmp_path).split()
    assert changed[0] != kept[0] and changed[1] != kept[1]


_REGISTERED_BELOW = """
import os
from somatize import Node

class Registering(Node):
    made = []

    def __init_subclass__(cls, **kwargs):
        Registering.made.append(cls.__name__)

class Tuned(Registering):
    SCALE = float(os.environ.get("SOMATIZE_TEST_UNSET", "2"))

class Scales(Tuned):
    def forward(self, x, ctx):
        return x * self.SCALE
"""


_REGISTERED_BY_A_MIXIN = """
import os
from somatize import Node

class Registering:
    made = []

    def __init_subclass__(cls, **kwargs):
        Registering.made.append(cls.__name__)

class Tuned(Registering, Node):
    SCALE = float(os.environ.get("SOMATIZE_TEST_UNSET", "2"))

class Scales(Tuned):
    def forward(self, x, ctx):
        return x * self.SCALE
"""


@pytest.mark.parametrize(
    "text", [_REGISTERED_BELOW, _REGISTERED_BY_A_MIXIN], ids=["node-base", "mixin"]
)
def test_a_constant_set_before_the_first_fingerprint_below_a_base_not_calling_super_is_seen(
    text: str, tmp_path: Path
) -> None:
    """A computed constant of a class made below a base whose ``__init_subclass__`` does not
    call ``super().__init_subclass__`` (a registry's, of a node class or of a mixin that is
    none, before ``Node`` in the classes it inherits from), set by hand before its node was
    first fingerprinted, is told from the value its text computed, as it is below any
    other base; the base's hook still runs for each class made."""
    _package(tmp_path, "registered", nodes=text)
    script = (
        "import sys, registered.nodes as m\nfrom somatize.catalog import fingerprint_of as f\n"
        "if sys.argv[1] == 'set':\n    m.Tuned.SCALE = 3.0\n"
        "print(f(m.Scales), *m.Registering.made)\n"
    )
    kept = _printed(["-c", script, "keep"], tmp_path).split()
    assert kept[1:] == ["Tuned", "Scales"]
    assert _printed(["-c", script, "keep"], tmp_path).split() == kept
    changed = _printed(["-c", script, "set"], tmp_path).split()
    assert changed[0] != kept[0]


_MODULE_OF_A_MIXIN_S_NODES = """
import os
from somatize import Node

SCALE = float(os.environ.get("SOMATIZE_TEST_UNSET", "2"))

class Registering:
    def __init_subclass__(cls, **kwargs):
        pass

class Scales(Registering, Node):
    def forward(self, x, ctx):
        return x * SCALE
"""


def test_a_module_constant_set_before_the_first_fingerprint_of_nodes_below_a_mixin_is_seen(
    tmp_path: Path,
) -> None:
    """A computed constant of a module whose node classes were all made below a mixin whose
    ``__init_subclass__`` does not call ``super().__init_subclass__`` (so none noted what the
    module held as it loaded), set by hand before a node was first fingerprinted, is told
    from the value its text computed; left as it was, the fingerprint is the same in every
    process."""
    _package(tmp_path, "registered", nodes=_MODULE_OF_A_MIXIN_S_NODES)
    script = (
        "import sys, registered.nodes as m\nfrom somatize.catalog import fingerprint_of as f\n"
        "if sys.argv[1] == 'set':\n    m.SCALE = 3.0\nprint(f(m.Scales))\n"
    )
    kept = _printed(["-c", script, "keep"], tmp_path).split()
    assert _printed(["-c", script, "keep"], tmp_path).split() == kept
    assert _printed(["-c", script, "set"], tmp_path).split() != kept


_ASSIGNED_AGAIN_BELOW = """
import types
from somatize import Node

CONFIG = None

class Configured(Node):
    def forward(self, x, ctx):
        return x * CONFIG.k

CONFIG = types.SimpleNamespace(k=2)
"""


def test_a_name_its_module_assigns_again_below_a_node_class_is_not_set_by_hand(
    tmp_path: Path,
) -> None:
    """A name a node's module assigns again below the class (``CONFIG = None``, the class,
    then ``CONFIG = Config()``) holds what its text made, not a value set by hand: it is
    named by that text, one fingerprint in every process, and another for other text."""
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    _package(tmp_path / "same", "configured", nodes=_ASSIGNED_AGAIN_BELOW)
    other = _ASSIGNED_AGAIN_BELOW.replace("(k=2)", "(k=3)")
    _package(tmp_path / "other", "configured", nodes=other)
    first = _fingerprints_in(tmp_path / "same", "configured.nodes", "Configured")
    assert _fingerprints_in(tmp_path / "same", "configured.nodes", "Configured") == first
    assert _fingerprints_in(tmp_path / "other", "configured.nodes", "Configured") != first


_SET_BY_ITS_INIT = """
import argparse
from somatize import Node

def _default():
    return argparse.Namespace(k=2)

CONFIG = _default()

def init(k):
    global CONFIG
    CONFIG = argparse.Namespace(k=k)

class Configured(Node):
    def forward(self, x, ctx):
        return x * CONFIG.k
"""


def test_an_object_its_module_sets_as_a_script_starts_is_named_by_what_it_holds(
    tmp_path: Path,
) -> None:
    """An object of the standard library's in place of what its module's text made, set the
    same as each run starts (``init(k)`` assigning ``CONFIG = Namespace(k=k)``), is named
    by what it holds: one fingerprint in every process that sets it alike (no answer
    drifts at every run), another for another value."""
    _package(tmp_path, "configured", nodes=_SET_BY_ITS_INIT)
    script = (
        "import sys, configured.nodes as m\nfrom somatize.catalog import fingerprint_of\n"
        "m.init(int(sys.argv[1]))\nprint(fingerprint_of(m.Configured))\n"
    )
    kept = _printed(["-c", script, "2"], tmp_path)
    assert _printed(["-c", script, "2"], tmp_path) == kept
    assert _printed(["-c", script, "3"], tmp_path) != kept


_CLOSING_OVER_CELLS = """
from somatize import Node

def _made():
    scale = 2

    def forward(self, x, ctx):
        return x * scale

    def set_scale(value):
        nonlocal scale
        scale = value

    return forward, set_scale

def _helper_made():
    by = 2

    def times(x):
        return x * by

    def set_by(value):
        nonlocal by
        by = value

    return times, set_by

_forward, set_scale = _made()
times, set_by = _helper_made()

class Scales(Node):
    forward = _forward

class UsesHelper(Node):
    def forward(self, x, ctx):
        return times(x)
"""


@pytest.mark.parametrize(("kind", "setter"), [("Scales", "set_scale"), ("UsesHelper", "set_by")])
def test_a_cell_set_since_by_the_function_sharing_it_is_another_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, setter: str
) -> None:
    """A plain value a node's method, or a helper of its module, closes over, set since by
    a function sharing its cell (``nonlocal scale; scale = 5``), is other code, for a graph
    built before and one built after: an answer kept before is recalled as drifted, and
    strict=True computes it with the value now."""
    loaded = _load(tmp_path / "fingerprinted.py", _CLOSING_OVER_CELLS, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(getattr(loaded, kind)().named("n").frozen().cached())

    built = graph()
    assert built.forward(3, store=store) == 6
    getattr(loaded, setter)(5)
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert built.forward(3, store=store) == 6
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert graph().forward(3, store=store) == 6
    assert graph().forward(3, store=store, strict=True) == 15
    getattr(loaded, setter)(7)
    assert built.forward(3, store=store, strict=True) == 21


_HELPERS_HOLDING_TABLES = """
import functools

from somatize import Node


def _made():
    settings = {"by": 2}

    def times(x):
        return x * settings["by"]

    return times, settings


closing, SETTINGS = _made()


def _scaled(box, x):
    return x * box[0]


BOX = [2]
binding = functools.partial(_scaled, BOX)


def defaulting(x, box=[2]):
    return x * box[0]


def keyed(x, *, by=2):
    return x * by


class Closes(Node):
    def forward(self, x, ctx):
        return closing(x)


class Binds(Node):
    def forward(self, x, ctx):
        return binding(x)


class Defaults(Node):
    def forward(self, x, ctx):
        return defaulting(x)


class Keys(Node):
    def forward(self, x, ctx):
        return keyed(x)
"""


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("Closes", lambda m: m.SETTINGS.__setitem__("by", 5)),
        ("Binds", lambda m: m.BOX.__setitem__(0, 5)),
        ("Defaults", lambda m: m.defaulting.__defaults__[0].__setitem__(0, 5)),
        ("Keys", lambda m: m.keyed.__kwdefaults__.__setitem__("by", 5)),
    ],
    ids=["closed-over", "bound", "default", "keyword-default"],
)
def test_what_a_helper_of_its_module_closes_over_or_binds_changed_in_place_is_seen(
    kind: str,
    change: Callable[[Any], None],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dict or list a helper of a node's module closes over, binds as a partial, or takes
    by default, or its keyword defaults, changed in place after a graph was built, is other
    code at that graph's next forward and for a graph built after: strict=True computes
    with what it holds now, never recalling what it computed before."""
    loaded = _load(tmp_path / "fingerprinted.py", _HELPERS_HOLDING_TABLES, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())

    built = graph()
    assert _three_forwards(built, store, "h", 2) == ["ran", "recalled", "recalled"]
    change(loaded)
    assert _three_forwards(built, store, "h", 5) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 5) == ["recalled", "recalled", "recalled"]


_SETTING_ITS_OWN_CELL = """
from somatize import Node

def _counting():
    calls = 0

    def times(x):
        nonlocal calls
        calls += 1
        return x * 2

    return times

times = _counting()

class Counts(Node):
    def forward(self, x, ctx):
        return times(x)
"""


def test_a_cell_a_helper_sets_itself_as_it_runs_is_its_state(tmp_path: Path) -> None:
    """A cell a helper of a node's module sets itself as it runs (``nonlocal calls; calls +=
    1``) is its state, as a global it assigns is: the second forward recalls what the first
    kept, and another process, whose helper ran other times, recalls it too."""
    _package(tmp_path, "counting", nodes=_SETTING_ITS_OWN_CELL)
    script = (
        "import sys, warnings\nwarnings.simplefilter('error')\nimport counting.nodes as m\n"
        "from somatize import Graph\nfor _ in range(int(sys.argv[2])):\n    m.times(1)\n"
        "for _ in range(2):\n    seen = []\n"
        "    g = Graph.somatize(m.Counts().named('n').frozen().cached())\n"
        "    g.forward(3, store=sys.argv[1], watching=seen.append)\n"
        "    print(*[f['fact'] for f in seen if f.get('node') == 'n'])\n"
    )
    store = str(tmp_path / "store")
    assert _printed(["-c", script, store, "0"], tmp_path).splitlines() == ["ran kept", "recalled"]
    assert _printed(["-c", script, store, "3"], tmp_path).splitlines() == ["recalled", "recalled"]


_HOLDING_TENSORS = """
import torch
from somatize import Node

class HoldsTensors(Node):
    parts = [torch.arange(4.0).reshape(2, 2), 3]
    by_name = {"w": (torch.ones(2, dtype=torch.float16),)}

    def forward(self, x, ctx):
        return x
"""


def test_tensors_in_what_a_class_holds_are_named_by_their_values_in_every_process(
    tmp_path: Path,
) -> None:
    """A tensor in a list, dict or tuple a class holds is named by its dtype, shape and
    values, as one the class holds itself: one fingerprint in every process running that
    code, and another for other values."""
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    _package(tmp_path / "same", "holding", nodes=_HOLDING_TENSORS)
    _package(
        tmp_path / "other",
        "holding",
        nodes=_HOLDING_TENSORS.replace("(2, 2), 3]", "(2, 2) * 2, 3]"),
    )
    # One new process for the package as written; a second for it again and then for
    # other values, each against the first's, so every comparison crosses processes.
    kinds = ["HoldsTensors"]
    (first,) = _fingerprints_of_elsewhere(tmp_path, ["same"], kinds, "holding.nodes")
    again, other = _fingerprints_of_elsewhere(tmp_path, ["same", "other"], kinds, "holding.nodes")
    assert len(first) == len(kinds)
    assert again == first
    assert other != first


_HOLDING_A_TENSOR = """
import torch
from somatize import Node

class HoldsATensor(Node):
    part = torch.ones(2)

    def forward(self, x, ctx):
        return float((x * self.part).sum())

class HoldsTensorsInAList(Node):
    parts = [torch.ones(2), 3]

    def forward(self, x, ctx):
        return float((x * self.parts[0]).sum())
"""


@pytest.mark.parametrize(
    ("kind", "held"), [("HoldsATensor", "part"), ("HoldsTensorsInAList", "parts")]
)
def test_a_tensor_a_class_holds_changed_in_place_is_seen_at_the_next_forward(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, held: str
) -> None:
    """A tensor a class holds, itself or in a list, changed in place after a graph ran
    (``Kind.part.mul_(5)``) is other code at the next forward of that graph and of one built
    after: the answer kept before is recalled as drifted, and strict=True computes it with
    the tensor as it is now."""
    import torch

    loaded = _load(tmp_path / "fingerprinted.py", _HOLDING_A_TENSOR, monkeypatch)
    built = Graph.somatize(getattr(loaded, kind)().named("n").frozen().cached())
    assert built.forward(1.0, store=store) == 2.0
    tensor = getattr(getattr(loaded, kind), held)
    with torch.no_grad():
        (tensor if held == "part" else tensor[0]).mul_(5)
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert built.forward(1.0, store=store) == 2.0
    after = Graph.somatize(getattr(loaded, kind)().named("n").frozen().cached())
    assert after.forward(1.0, store=store, strict=True) == 10.0
    assert built.forward(1.0, store=store, strict=True) == 10.0


_KEEPING_A_RUNNING_MEAN = """
import torch
from somatize import Node

class KeepsAMean(Node):
    mean = torch.zeros(2)

    def forward(self, x, ctx):
        KeepsAMean.mean.mul_(0.9).add_(0.1 * x)
        return x * 2
"""


_KEEPING_A_RUNNING_MEAN_IN_NUMPY = """
import numpy as np
from somatize import Node

class KeepsAMean(Node):
    mean = np.zeros(2)

    def forward(self, x, ctx):
        KeepsAMean.mean[:] = 0.9 * KeepsAMean.mean + 0.1 * x
        return x * 2
"""


def _added_in_place(held: Any) -> None:
    """Adds 5 to ``held``, a tensor or a numpy array, in place (a tensor outside autograd)."""
    if hasattr(held, "add_"):
        import torch

        with torch.no_grad():
            held.add_(5)
    else:
        held += 5


@pytest.mark.parametrize(
    ("needs", "source"),
    [("torch", _KEEPING_A_RUNNING_MEAN), ("numpy", _KEEPING_A_RUNNING_MEAN_IN_NUMPY)],
    ids=["tensor", "numpy"],
)
def test_a_tensor_a_class_holds_changed_by_its_own_forward_is_its_state(
    needs: str, source: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor or a numpy array a class holds that its node's own forward changes in place
    (a running mean) is its state, as an object in a list it holds is: the next forward of
    the graph recalls what the first kept, with no word of a change. Changed between
    forwards, it is seen."""
    pytest.importorskip(needs)
    loaded = _load(tmp_path / "fingerprinted.py", source, monkeypatch)
    built = Graph.somatize(loaded.KeepsAMean().named("n").frozen().cached())
    facts: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert built.forward(1.0, store=store, watching=facts.append) == 2.0
        assert built.forward(1.0, store=store, watching=facts.append) == 2.0
    assert [f["fact"] for f in facts if f.get("node") == "n"] == ["ran", "kept", "recalled"]
    _added_in_place(loaded.KeepsAMean.mean)
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert built.forward(1.0, store=store) == 2.0


_PARTIAL_HELPER = """
import functools
from somatize import Node

def _times(x, by):
    return x * by

helper = functools.partial(_times, by=2)

class UsesPartial(Node):
    def forward(self, x, ctx):
        return helper(x)
"""


def test_a_partial_helper_given_other_keywords_in_place_is_another_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``functools.partial`` of its module a node's code calls, given other keywords in
    place (``helper.keywords["by"] = 4``), is other code for a graph built before and one
    built after: the answer kept before is recalled as drifted, and strict=True computes
    it with the keywords now."""
    loaded = _load(tmp_path / "fingerprinted.py", _PARTIAL_HELPER, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesPartial().named("n").frozen().cached())

    built = graph()
    assert built.forward(3, store=store) == 6
    loaded.helper.keywords["by"] = 4
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert built.forward(3, store=store) == 6
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert graph().forward(3, store=store) == 6
    assert graph().forward(3, store=store, strict=True) == 12


_COMPUTED_AND_SET_OVER = """
import enum
import pathlib

from somatize import Node

SCALE = 2 * 3


class Mode(enum.IntEnum):
    A = 1
    B = 2


class Scales(Node):
    by = 2 * 5
    mode = Mode.A
    root = pathlib.Path("/data") / "a"

    def forward(self, x, ctx):
        return (self.root, x * SCALE * self.by * self.mode)
"""


def test_a_computed_value_set_over_after_its_text_was_read_is_named_by_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value its text computes (``by = 2 * 5``, ``SCALE = 2 * 3``, ``mode = Mode.A``, a
    path), named by that text, is named by what it holds once another is set over it (on
    the class, in its module): the text no longer says what the code computes with. Set
    back to one alike what the text made, it is named by the text again."""
    module = _load(tmp_path / "fingerprinted.py", _COMPUTED_AND_SET_OVER, monkeypatch)
    kind = module.Scales
    first = fingerprint_of(kind)
    seen = {first}
    for name, holder, value in (
        ("by", kind, 11),
        ("mode", kind, module.Mode.B),
        ("SCALE", module, 7),
        ("root", kind, Path("/elsewhere")),
    ):
        was = getattr(holder, name)
        setattr(holder, name, value)
        now = fingerprint_of(kind)
        assert now not in seen
        seen.add(now)
        setattr(holder, name, type(was)(was))
        assert fingerprint_of(kind) == first


def test_a_fingerprint_is_the_same_in_every_process(tmp_path: Path) -> None:
    """A class, what it inherits and what it names, read from its file, has one fingerprint
    in every process running that code — wherever the file is, whatever the values its
    module computes as it loads that say where the code is or when it runs (the folder of
    its file, the home folder, the time it started), which are named by how they are
    computed."""
    found = set()
    for seed, where in (("1", "here"), ("2", "there")):
        path = tmp_path / where / "everywhere.py"
        path.parent.mkdir()
        _write(path, _EVERYWHERE)
        home = str(tmp_path / where)
        found.add(_printed([str(path)], PYTHONHASHSEED=seed, HOME=home).strip())
    assert len(found) == 1 and found.pop().startswith("sha256:")


class Helped(Node):
    """Computes with a helper it inherits, which a patch may replace, shadow or remove."""

    def helper(self, x: int) -> int:
        return x + 1


class Patched(Helped):
    """The node whose class (and base class) the tests below patch."""

    factor = 1

    def forward(self, x: int, ctx: Any) -> int:
        return self.helper(x) * self.factor


def _plus_ten(self: Any, x: int) -> int:
    return x + 10


def _plus(self: Any, x: int, by: int) -> int:
    return x + by


def _forward_minus(self: Any, x: int, ctx: Any) -> int:
    return x - 1


_PATCHES: dict[str, tuple[Any, int]] = {
    "forward replaced": (lambda mp: mp.setattr(Patched, "forward", _forward_minus), 4),
    "a base class's helper replaced": (lambda mp: mp.setattr(Helped, "helper", _plus_ten), 15),
    "a helper added, shadowing the base's": (
        lambda mp: mp.setattr(Patched, "helper", _plus_ten, raising=False),
        15,
    ),
    "a lambda set": (lambda mp: mp.setattr(Helped, "helper", lambda self, x: x * 7), 35),
    "a partialmethod set": (
        lambda mp: mp.setattr(Helped, "helper", functools.partialmethod(_plus, by=20)),
        25,
    ),
    "a class value set": (lambda mp: mp.setattr(Patched, "factor", 3), 18),
}


@pytest.mark.parametrize("patch", list(_PATCHES), ids=list(_PATCHES))
def test_a_method_set_on_a_class_after_its_graph_was_built_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch, patch: str
) -> None:
    """A method or value set on a node's class, or on a class it inherits from, after its
    graph was built (a test's or a notebook's monkeypatch) is that node's code from the next
    forward on: an answer kept before is recalled as drifted, and strict=True computes it
    with the code set — never the old answer taken for the new code's. A graph built after,
    or a copy of the graph, sees it too."""
    graph = Graph.somatize(Patched().named("p").frozen().cached())
    copied = copy.deepcopy(graph)
    assert graph.forward(5, store=store) == 6
    change, now = _PATCHES[patch]
    change(monkeypatch)
    copied_after = copy.deepcopy(graph)
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted, match="`p` was recalled"):
        assert graph.forward(5, store=store, watching=seen.append) == 6
    assert [fact["changed"] for fact in seen if fact["fact"] == "drifted"] == [["p"]]
    with pytest.warns(Drifted):  # a copy made after the patch knows the new code too
        assert copied_after.forward(5, store=Store(store.root)) == 6
    assert graph.forward(5, store=store, strict=True) == now
    assert copied.forward(5, store=Store(store.root), strict=True) == now
    fresh = Graph.somatize(Patched().named("p").frozen().cached())
    assert fresh.forward(5, store=store, strict=True) == now
    # Put back, the code is what it was: the first answer is recalled as it was kept.
    monkeypatch.undo()
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert graph.forward(5, store=store, strict=True, watching=seen.append) == 6


def test_a_helper_deleted_from_a_class_after_its_graph_was_built_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method deleted from a node's class, so that the one it inherits runs, is seen at
    the next forward, as one set is."""
    monkeypatch.setattr(Patched, "helper", _plus_ten, raising=False)
    graph = Graph.somatize(Patched().named("p").frozen().cached())
    assert graph.forward(5, store=store) == 15
    monkeypatch.delattr(Patched, "helper")
    with pytest.warns(Drifted, match="`p` was recalled"):
        assert graph.forward(5, store=store) == 15
    assert graph.forward(5, store=store, strict=True) == 6


def test_a_function_given_other_code_in_place_is_seen_by_a_graph_built_after(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method whose code is replaced in place (``f.__code__ = ...``, as a reloader does)
    is other code for a graph built after: not taken for the code it was first read as."""
    before = fingerprint_of(Patched)
    assert Graph.somatize(Patched().named("p").frozen().cached()).forward(5, store=store) == 6
    monkeypatch.setattr(Helped.helper, "__code__", _plus_ten.__code__)
    assert fingerprint_of(Patched) != before
    fresh = Graph.somatize(Patched().named("p").frozen().cached())
    assert fresh.forward(5, store=store, strict=True) == 15


def test_a_partial_a_class_holds_is_fingerprinted_with_what_it_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A method made with ``functools.partialmethod`` (or a static ``partial``) is its
    function and the arguments it binds: another value bound is other code."""
    monkeypatch.setattr(Helped, "helper", functools.partialmethod(_plus, by=20))
    twenty = fingerprint_of(Patched)
    monkeypatch.setattr(Helped, "helper", functools.partialmethod(_plus, by=30))
    assert fingerprint_of(Patched) != twenty
    monkeypatch.setattr(Helped, "helper", staticmethod(functools.partial(_plus, None, by=30)))
    static = fingerprint_of(Patched)
    monkeypatch.setattr(Helped, "helper", staticmethod(functools.partial(_plus, None, by=40)))
    assert fingerprint_of(Patched) != static


class Counted(Node):
    """Counts its calls on its class, as a test or a notebook does."""

    calls = 0

    def forward(self, x: int, ctx: Any) -> int:
        type(self).calls += 1
        return x + 1


def test_a_class_value_its_own_code_sets_is_state_not_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A counter a node's forward moves on its class is the class's state, taken as its
    text assigns it: the forwards after one that moved it recall what was kept, not
    drifted, and the fingerprint is the one a fresh process gets."""
    monkeypatch.setattr(Counted, "calls", 0)
    first = fingerprint_of(Counted)
    graph = Graph.somatize(Counted().named("n").frozen().cached())
    assert graph.forward(1, store=store) == 2
    assert graph.forward(2, store=store) == 3
    assert Counted.calls == 2
    assert fingerprint_of(Counted) == first
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert graph.forward(1, store=store) == 2
    assert graph.record is not None and graph.record.outcome["n"] == "recalled"


class Scaled(Node):
    """Scales by a class default that an instance may override."""

    factor = 2

    def __init__(self, factor: int | None = None) -> None:
        if factor is not None:
            self.factor = factor

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.factor


def test_a_class_value_its_code_sets_on_an_instance_is_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class value whose name the class's code assigns on an instance
    (``self.factor = factor``) is not state: setting it on the class is other code, seen
    by a graph built before and by a fresh one."""
    monkeypatch.setattr(Scaled, "factor", 2)
    two = fingerprint_of(Scaled)
    graph = Graph.somatize(Scaled().named("s").frozen().cached())
    assert graph.forward(5, store=store) == 10
    monkeypatch.setattr(Scaled, "factor", 3)
    assert fingerprint_of(Scaled) != two
    assert graph.forward(5, store=store, strict=True) == 15
    fresh = Graph.somatize(Scaled().named("s").frozen().cached())
    assert fresh.forward(5, store=store, strict=True) == 15


class CountsOnBase(Node):
    """Declares the count its subclasses keep."""

    calls = 0


class CountsOnItself(CountsOnBase):
    """Counts on its own class, which gains the name its base declares."""

    def forward(self, x: int, ctx: Any) -> int:
        type(self).calls += 1
        return x + 1


class CountsOnItsBase(CountsOnBase):
    """Counts on its base class, named outright."""

    def forward(self, x: int, ctx: Any) -> int:
        CountsOnBase.calls += 1
        return x + 2


@pytest.mark.parametrize("kind", [CountsOnItself, CountsOnItsBase])
def test_a_count_declared_on_a_base_is_state_not_code(
    kind: type[Node], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count a subclass's code moves on a class of its lineage, declared on its base, is
    state: the forwards after the first recall, not drifted, even under strict, and the
    fingerprint is the one worked out before it counted."""
    monkeypatch.setattr(CountsOnBase, "calls", 0)
    if "calls" in vars(kind):  # what an earlier run counted
        delattr(kind, "calls")
    first = fingerprint_of(kind)
    graph = Graph.somatize(kind().named("n").frozen().cached())
    graph.forward(1, store=store)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        graph.forward(1, store=store)
        graph.forward(1, store=store, strict=True)
    assert graph.record is not None and graph.record.outcome["n"] == "recalled"
    assert fingerprint_of(kind) == first
    if "calls" in vars(kind):
        delattr(kind, "calls")


def test_a_count_a_class_with_no_source_keeps_on_itself_is_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class typed where no file holds its text (a notebook, ``python -``) that counts
    its calls on itself is fingerprinted alike whatever the count: the forwards after the
    first recall, not drifted."""
    cell = types.ModuleType("somatize_typed_cell")
    monkeypatch.setitem(sys.modules, cell.__name__, cell)
    text = textwrap.dedent(
        """
        from somatize import Node

        class Counted(Node):
            calls = 0

            def forward(self, x, ctx):
                type(self).calls += 1
                return x + 1
        """
    )
    exec(compile(text, "<typed>", "exec"), vars(cell))
    kind = cell.Counted
    first = fingerprint_of(kind)
    graph = Graph.somatize(kind().named("n").frozen().cached())
    assert graph.forward(1, store=store) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert graph.forward(1, store=store) == 2
    assert kind.calls == 1
    assert graph.record is not None and graph.record.outcome["n"] == "recalled"
    assert fingerprint_of(kind) == first


class Closing(Node):
    """Has its forward set by the tests below."""

    def forward(self, x: int, ctx: Any) -> int:
        return x


def _adding(by: int) -> Any:
    def forward(self: Node, x: int, ctx: Any) -> int:
        return x + by

    return forward


def _logged(function: Any) -> Any:
    def logging(*args: Any, **kwargs: Any) -> Any:  # says nothing of what it wraps
        return function(*args, **kwargs)

    return logging


class _Adder:
    def __init__(self, by: int) -> None:
        self.by = by

    def __call__(self, x: int) -> int:
        return x + self.by


def test_what_a_method_closes_over_is_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A method that closes over another value, or wraps another function in a decorator
    that does not say it wraps it, is other code."""
    monkeypatch.setattr(Closing, "forward", _adding(10))
    ten = fingerprint_of(Closing)
    monkeypatch.setattr(Closing, "forward", _adding(20))
    assert fingerprint_of(Closing) != ten
    monkeypatch.setattr(Closing, "forward", _adding(20))
    assert fingerprint_of(Closing) == fingerprint_of(Closing)
    monkeypatch.setattr(Closing, "forward", _logged(lambda self, x, ctx: x + 1))
    plus = fingerprint_of(Closing)
    monkeypatch.setattr(Closing, "forward", _logged(lambda self, x, ctx: x * 100))
    assert fingerprint_of(Closing) != plus


def test_a_callable_object_a_class_holds_is_never_taken_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A method replaced by a callable that is no plain function (a callable object, a
    mock) makes another fingerprint for each object, so a graph never recalls what the
    one it replaced computed."""
    monkeypatch.setattr(Closing, "helper", staticmethod(_Adder(1)), raising=False)
    one = fingerprint_of(Closing)
    assert fingerprint_of(Closing) == one
    monkeypatch.setattr(Closing, "helper", staticmethod(_Adder(50)))
    fifty = fingerprint_of(Closing)
    assert fifty != one
    with mock.patch.object(Closing, "forward", return_value=1):
        mocked = fingerprint_of(Closing)
    with mock.patch.object(Closing, "forward", return_value=2):
        assert fingerprint_of(Closing) not in (mocked, fifty)


class Defaulted(Node):
    """Adds what its defaults say."""

    def forward(self, x: int, ctx: Any, by: int = 1, *, more: int = 0) -> int:
        return x + by + more


def test_a_default_set_in_place_is_other_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method's defaults replaced in place (``__defaults__``, ``__kwdefaults__``) make
    another fingerprint, and a graph built after computes the new code's answer under
    strict."""
    function = Defaulted.forward
    monkeypatch.setattr(function, "__defaults__", (1,))
    monkeypatch.setattr(function, "__kwdefaults__", {"more": 0})
    first = fingerprint_of(Defaulted)
    Graph.somatize(Defaulted().named("d").frozen().cached()).forward(5, store=store)
    monkeypatch.setattr(function, "__defaults__", (50,))
    fifty = fingerprint_of(Defaulted)
    assert fifty != first
    fresh = Graph.somatize(Defaulted().named("d").frozen().cached())
    assert fresh.forward(5, store=store, strict=True) == 55
    function.__kwdefaults__["more"] = 7
    assert fingerprint_of(Defaulted) not in (first, fifty)


class CountsAmongValues(Node):
    """Counts its calls on its class, beside values and methods of its own."""

    calls = 0
    low = 1
    high = 2

    def forward(self, x: int, ctx: Any) -> int:
        type(self).calls += 1
        return self.lower(x) + self.high

    def lower(self, x: int) -> int:
        return x - self.low


def test_a_count_moved_as_a_class_runs_is_not_read_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count a class moves as it runs does not make its fingerprint be worked out again:
    the forwards after the first read neither its text nor its functions' bytecode (which
    for a class of many values and methods would be read again at every forward)."""
    monkeypatch.setattr(CountsAmongValues, "calls", 0)
    graph = Graph.somatize(CountsAmongValues().named("n").frozen().cached())
    graph.forward(1, store=store)
    read: list[str] = []
    for name in ("_class_body", "_stores_in", "_function_bytes"):
        done = _defined(name)
        _patch_everywhere(
            monkeypatch,
            name,
            lambda *a, _done=done, _name=name, **k: read.append(_name) or _done(*a, **k),
        )
    for x in (2, 3, 1):
        graph.forward(x, store=store)
    assert CountsAmongValues.calls == 3
    assert read == []


class _CalledEqual(_Adder):
    """A callable object that says it equals any other of its kind."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CalledEqual)

    def __hash__(self) -> int:
        return 0


def test_callable_objects_that_say_they_are_equal_are_told_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A callable object a class holds is marked by which object it is, not by what its
    ``==`` says: another that calls itself equal is still another fingerprint."""
    one = _CalledEqual(1)
    monkeypatch.setattr(Closing, "helper", staticmethod(one), raising=False)
    first = fingerprint_of(Closing)
    monkeypatch.setattr(Closing, "helper", staticmethod(_CalledEqual(50)))
    assert fingerprint_of(Closing) != first
    monkeypatch.setattr(Closing, "helper", staticmethod(one))
    assert fingerprint_of(Closing) == first


_HOLDING = """
import dataclasses
import functools
import random
import threading

import torch.nn as nn

from somatize import Node
from somatize.catalog import fingerprint_of


class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k


class Locked(Scale):
    def __init__(self, k):
        super().__init__(k)
        self.lock = threading.Lock()


class Seeded(Scale):
    def __init__(self, k):
        super().__init__(k)
        self.draws = random.Random(k)


class Equal(Scale):
    def __eq__(self, other):
        return isinstance(other, Equal)

    __hash__ = None


def hooked(module):
    module.register_forward_hook(lambda *called: None)
    return module


@dataclasses.dataclass
class Fields:
    k: int

    def __call__(self, x):
        return x * self.k


def holding(held):
    class Holds(Node):
        act = held

        def forward(self, x, ctx):
            return self.act(x)

    return fingerprint_of(Holds)


def closing(held):
    class Closes(Node):
        def forward(self, x, ctx):
            return held(x)

    return fingerprint_of(Closes)


for made in (
    "Scale(2)",
    "Scale(2)",
    "Scale(3)",
    "nn.ReLU()",
    "nn.GELU()",
    'nn.GELU(approximate="tanh")',
    "functools.partial(max, Scale(2))",
    "Fields(2)",
    "Fields(3)",
    "Locked(2)",
    "Locked(2)",
    "Locked(3)",
    "Seeded(2)",
    "Seeded(2)",
    "Equal(2)",
    "Equal(2)",
    "hooked(nn.ReLU())",
    "hooked(nn.ReLU())",
    '{"by": 2}',
    '{"by": 2}',
    '{"by": 3}',
    "[1, [2, 3]]",
):
    print(made, holding(eval(made)), closing(eval(made)), sep="|")
"""


def _fingerprints_in_a_fresh_process(path: Path, seed: str) -> dict[str, list[str]]:
    """Each object the script :data:`_HOLDING` makes → the fingerprints, in a fresh process,
    of a class holding it and of one whose method closes over it, each time it is made."""
    found: dict[str, list[str]] = {}
    for line in _printed([str(path)], PYTHONHASHSEED=seed).splitlines():
        made, held, closed = line.split("|")
        found.setdefault(made, []).extend([held, closed])
    return found


def test_an_object_held_by_what_it_holds_is_named_alike_in_every_process(tmp_path: Path) -> None:
    """A callable object a class holds, or a method closes over, whose state is all named by
    what it is (plain values, functions, torch modules holding no weights nor hooks, a lock
    by its type), and a table of plain values, is fingerprinted by its class and that
    state: the same in two fresh processes, and another for other state or another class.
    One holding what no name says (a random generator, a hook), or whose class says when it
    equals another, is marked by which object it is: never another's, in this process or
    another."""
    path = tmp_path / "holding.py"
    _write(path, _HOLDING)
    one = _fingerprints_in_a_fresh_process(path, "1")
    two = _fingerprints_in_a_fresh_process(path, "2")
    named = [made for made in one if not made.startswith(("Seeded", "Equal", "hooked"))]
    for made in named:
        assert one[made] == two[made], made
    held = {made: one[made][0] for made in named}
    closed = {made: one[made][1] for made in named}
    for made in ("Scale(2)", "Locked(2)"):
        assert one[made][:2] == one[made][2:]  # made twice: alike
    for by in (held, closed):
        assert len(set(by.values())) == len(by)  # other state, another class: apart
    for made in ("Seeded(2)", "Equal(2)", "hooked(nn.ReLU())"):
        marked = one[made] + two[made]
        assert len(set(marked)) == len(marked)


class _Scale:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: int) -> int:
        return x * self.k


class HoldsScale(Node):
    """Scales by what the object it holds says."""

    act = _Scale(2)

    def forward(self, x: int, ctx: Any) -> int:
        return self.act(x)


def test_an_object_named_by_what_it_holds_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds, named by what it holds, changed in place after a graph was
    built (``Kind.act.k = 3``) is other code from the next forward on: an answer kept
    before is recalled as drifted, and strict=True computes it anew — and it is marked by
    which object it is from then on, so what it computes is never kept under the name it
    had before, which another process making it as it was would share."""
    monkeypatch.setattr(HoldsScale, "act", _Scale(2))
    two = fingerprint_of(HoldsScale)
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store) == 10
    monkeypatch.setattr(HoldsScale.act, "k", 3)
    with pytest.warns(Drifted, match="`h` was recalled"):
        assert graph.forward(5, store=store) == 10
    assert graph.forward(5, store=store, strict=True) == 15
    assert fingerprint_of(HoldsScale) != two
    HoldsScale.act.k = 2  # set back in place: still marked, not taken for a fresh one
    assert fingerprint_of(HoldsScale) != two
    monkeypatch.setattr(HoldsScale, "act", _Scale(2))
    assert fingerprint_of(HoldsScale) == two


class _Counting(_Scale):
    """Counts its calls on itself as it runs."""

    def __call__(self, x: int) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        return x * self.k


class _Memo(_Scale):
    """Keeps what it computed, in a dict it holds."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.memo: dict[int, int] = {}

    def __call__(self, x: int) -> int:
        return self.memo.setdefault(x, x * self.k)


@pytest.mark.parametrize("held", [_Counting, _Memo])
def test_an_object_that_moves_its_own_state_as_it_runs_is_recalled(
    held: type[_Scale], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that changes what it holds as it runs (a count, a cache) does
    not make its node drift at every forward: it is marked by which object it is, from the
    start or from the first change, and the forwards after recall what was kept."""
    monkeypatch.setattr(HoldsScale, "act", held(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    for x in (1, 1, 2, 2):
        assert graph.forward(x, store=store) == 2 * x
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        for x in (1, 2, 3, 3):
            assert graph.forward(x, store=store, strict=True) == 2 * x
    assert graph.record is not None and graph.record.outcome["h"] == "recalled"


class _Logging(_Scale):
    """Notes each value it is called with, in a list it holds."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.seen: list[int] = []

    def __call__(self, x: int) -> int:
        self.seen.append(x)
        return x * self.k


def _three_forwards(graph: Graph, store: Store, node: str, answer: Any) -> list[str]:
    """Three forwards of ``graph`` on 1 under strict, each checked to answer ``answer``:
    what each did at ``node`` (``ran``, ``recalled``)."""
    ran = []
    for _ in range(3):
        assert graph.forward(1, store=store, strict=True) == answer
        assert graph.record is not None
        ran.append(graph.record.outcome[node])
    return ran


@pytest.mark.parametrize("held", [_Scale, _Counting, _Logging])
def test_an_object_a_class_holds_changed_in_place_again_is_seen(
    held: type[_Scale], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds changed in place after a graph was built, once and again
    (``Kind.act.k = 3``, then ``= 4``), is other code at the next forward each time: strict=True
    computes with what it holds now, never recalling what it computed before — one that
    changes its own state as it runs (a count, a log) too, and that change, made as the
    node runs, makes no forward after compute again: each change costs one compute."""
    monkeypatch.setattr(HoldsScale, "act", held(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    for x in (1, 1, 1):
        assert graph.forward(x, store=store, strict=True) == 2
    for k in (3, 4, 5):
        HoldsScale.act.k = k
        ran = _three_forwards(graph, store, "h", k)
        assert ran == ["ran", "recalled", "recalled"], k


def test_an_object_that_moves_its_own_state_is_recalled_by_two_graphs_in_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that counts its calls on itself, run by two graphs in turn,
    is state for both: what one graph's node changes as it runs does not make the other
    compute again, and a change in place after is seen by both."""
    monkeypatch.setattr(HoldsScale, "act", _Counting(2))
    graphs = [Graph.somatize(HoldsScale().named("h").frozen().cached()) for _ in range(2)]
    outcomes = []
    for x in (1, 1, 2, 2, 3, 3):
        for graph in graphs:
            assert graph.forward(x, store=store, strict=True) == 2 * x
            assert graph.record is not None
            outcomes.append(graph.record.outcome["h"])
    assert outcomes.count("ran") == 3, outcomes  # each input once, by the first graph
    HoldsScale.act.k = 3
    for graph in graphs:
        assert graph.forward(3, store=store, strict=True) == 9


class _CountingByArray(_Counting):
    """Counts its calls on itself, scaling by the number an ``array`` it holds says."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.by = array.array("i", [k])

    def __call__(self, x: int) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        return x * self.by[0]


def test_an_array_a_marked_object_holds_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``array.array`` held by an object marked by which object it is (it counts its
    calls), changed in place between forwards, is seen at the next forward: strict=True
    computes with what it holds now, never recalling the old answer."""
    monkeypatch.setattr(HoldsScale, "act", _CountingByArray(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    HoldsScale.act.by[0] = 5
    assert _three_forwards(graph, store, "h", 5) == ["ran", "recalled", "recalled"]


class _CountingItself(_Counting):
    """Counts its calls on itself, through a method bound to itself that it holds."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.run = self.scaled

    def scaled(self, x: int) -> int:
        return x * self.k

    def __call__(self, x: int) -> int:
        self.calls = getattr(self, "calls", 0) + 1
        return self.run(x)


def test_an_object_a_graph_watched_is_freed_and_seen_changed_after_the_graph_is_gone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a graph reads of an object a class holds, marked by which object it is, keeps
    it alive no longer than the graph, even one holding a method bound to itself; and one
    changed in place while no graph watched it is seen by a graph built after: strict=True
    computes with what it holds now."""
    made = _CountingItself(2)
    monkeypatch.setattr(HoldsScale, "act", made)
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == 10
    del graph
    gc.collect()
    made.k = 3
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == 15
    gone = weakref.ref(made)
    HoldsScale.act = _Scale(2)  # type: ignore[assignment]
    fingerprint_of(HoldsScale)  # the class as it is now
    del made, graph
    gc.collect()
    assert gone() is None


class _Passes(Node):
    """Hands on what it is handed."""

    def forward(self, x: int, ctx: Any) -> int:
        return x


def test_an_object_changed_in_place_as_a_forward_runs_before_its_node_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that counts its calls on itself, changed in place as a
    forward runs but before its node does (by a watcher), is not taken for state the node
    moved: what was computed with what it held before is not recalled after."""
    monkeypatch.setattr(HoldsScale, "act", _Counting(2))
    passes = _Passes().named("p").frozen()
    graph = Graph.somatize(passes >> HoldsScale().named("h").frozen().cached())
    assert graph.forward(1, store=store, strict=True) == 2

    def change(fact: dict[str, Any]) -> None:
        if fact["fact"] == "ran" and fact["node"] == "p":
            HoldsScale.act.k = 3

    assert graph.forward(2, store=store, strict=True, watching=change) == 6
    assert graph.forward(1, store=store, strict=True) == 3


class _Bumps(Node):
    """Hands on what it is handed, and changes what the object ``HoldsScale`` holds says."""

    def forward(self, x: int, ctx: Any) -> int:
        HoldsScale.act.k += 1
        return x


def test_an_object_changed_in_place_by_another_node_after_its_node_ran_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that counts its calls on itself, changed in place by another
    node's forward after its own node ran, is not taken for state its node moved: the next
    forward computes with what it holds now, never recalling what it computed before."""
    monkeypatch.setattr(HoldsScale, "act", _Counting(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached() >> _Bumps().named("b"))
    assert graph.forward(1, store=store, strict=True) == 2
    assert graph.forward(1, store=store, strict=True) == 3
    assert graph.forward(1, store=store, strict=True) == 4


def test_an_object_that_moves_its_own_state_on_an_embedded_worker_is_recalled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that counts its calls on itself, its node run on an
    embedded worker's thread (the graph's own node), moves its state there, as it does
    where the graph is called: the next forward recalls the answer, and a change in place
    between forwards is still seen."""
    from somatize import Broker, Worker

    monkeypatch.setattr(HoldsScale, "act", _Counting(2))
    node = HoldsScale().named("h").frozen().cached().at("w1")
    graph = Graph.somatize(node)
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    try:
        outcomes = []
        for _ in range(3):
            assert graph.forward(1, store=store, strict=True, broker=broker) == 2
            assert graph.record is not None
            outcomes.append(graph.record.outcome["h"])
        assert outcomes == ["ran", "recalled", "recalled"]
        HoldsScale.act.k = 3
        assert graph.forward(1, store=store, strict=True, broker=broker) == 3
    finally:
        broker.close()


class _SlottedCounting:
    """Counts its calls on itself, in slots."""

    __slots__ = ("__weakref__", "calls", "k")

    def __init__(self, k: int) -> None:
        self.k = k
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return x * self.k


def test_an_object_holding_slots_changed_in_place_again_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds that keeps what it holds in slots, and counts its calls in
    them as it runs, changed in place between forwards once and again is other code at the
    next forward each time: strict=True computes with what it holds now, and what it counts
    as it runs makes no forward after compute again."""
    monkeypatch.setattr(HoldsScale, "act", _SlottedCounting(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    for k in (2, 3, 4):
        HoldsScale.act.k = k
        ran = _three_forwards(graph, store, "h", k)
        assert ran[1:] == ["recalled", "recalled"], k


class _SlottedOnly:
    """Scales by what it holds in a slot; it cannot be referenced weakly."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: int) -> int:
        return x * self.k


def test_an_object_that_cannot_be_referenced_weakly_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds with ``__slots__`` and no ``__weakref__``, changed in place
    between forwards once and again, is other code at the next forward each time: strict=True
    computes with what it holds now; and a graph built after, of the object unchanged since,
    recalls what the first kept, without drift."""
    monkeypatch.setattr(HoldsScale, "act", _SlottedOnly(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2)[1:] == ["recalled", "recalled"]
    for k in (3, 4):
        HoldsScale.act.k = k
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k
    again = Graph.somatize(HoldsScale().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(again, store, "h", 4) == ["recalled"] * 3


@dataclasses.dataclass(slots=True)
class _SlottedConfig:
    """A config holding its field in a slot."""

    k: int


class _ItemsConfig(dict[str, Any]):
    """A config that is a dict."""


class _ListConfig(list[Any]):
    """A config that is a list."""


class HoldsConfig(Node):
    """Scales by the field ``k`` of the config it holds, read as an attribute or an item."""

    config: Any = None

    def forward(self, x: int, ctx: Any) -> int:
        config = self.config
        if isinstance(config, dict):
            return x * config["k"]
        return x * (config[0] if isinstance(config, list) else config.k)


def _set_field(config: Any, k: int) -> None:
    if isinstance(config, dict):
        config["k"] = k
    elif isinstance(config, list):
        config[0] = k
    else:
        config.k = k


_CONFIGS = [
    pytest.param(lambda k: _SlottedConfig(k), id="slots"),
    pytest.param(lambda k: _ItemsConfig(k=k), id="dict-subclass"),
    pytest.param(lambda k: _ListConfig([k]), id="list-subclass"),
]


@pytest.mark.parametrize("make", _CONFIGS)
def test_a_config_with_slots_or_made_from_a_table_changed_in_place_is_seen(
    make: Callable[[int], Any], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config a class holds that keeps its fields in slots, or is a dict or a list,
    changed in place between forwards once and again, is other code at the next forward
    each time: strict=True computes with what it holds now; and a graph built after, of the
    config unchanged since, recalls what the first kept, without drift."""
    monkeypatch.setattr(HoldsConfig, "config", make(2))
    graph = Graph.somatize(HoldsConfig().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    for k in (3, 4):
        _set_field(HoldsConfig.config, k)
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k
    again = Graph.somatize(HoldsConfig().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(again, store, "h", 4) == ["recalled"] * 3


@pytest.mark.parametrize("make", _CONFIGS)
def test_a_config_with_slots_or_made_from_a_table_is_named_by_what_it_holds(
    make: Callable[[int], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config a class holds that keeps its fields in slots, or is a dict or a list, is
    named by what it holds: two configs alike give the class one fingerprint, so that
    another process making it alike recalls what this one kept, and one holding another
    value another."""
    monkeypatch.setattr(HoldsConfig, "config", make(2))
    two = fingerprint_of(HoldsConfig)
    monkeypatch.setattr(HoldsConfig, "config", make(2))
    assert fingerprint_of(HoldsConfig) == two
    monkeypatch.setattr(HoldsConfig, "config", make(3))
    assert fingerprint_of(HoldsConfig) != two


@dataclasses.dataclass
class _Config:
    """A config holding its field in its ``__dict__``."""

    k: Any


@pytest.mark.parametrize(
    "make",
    [
        *_CONFIGS,
        pytest.param(lambda k: _Config(k), id="dataclass"),
        pytest.param(lambda k: {"k": k}, id="dict"),
    ],
)
@pytest.mark.parametrize(("was", "now"), [(2, 2.0), (0.0, -0.0)])
def test_a_field_set_to_an_equal_value_of_another_type_is_seen_by_a_graph_built_before(
    make: Callable[[Any], Any], was: Any, now: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A field of a config a class holds set in place to a value equal to it but of another
    type, or of another sign (``2`` to ``2.0``, ``0.0`` to ``-0.0``), which the node computes
    otherwise with, is other code at the next forward of a graph built before: strict=True
    computes with what it holds now."""
    monkeypatch.setattr(HoldsConfig, "config", make(was))
    graph = Graph.somatize(HoldsConfig().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", was)[1:] == ["recalled", "recalled"]
    _set_field(HoldsConfig.config, now)
    ran = []
    for _ in range(2):
        assert repr(graph.forward(1, store=store, strict=True)) == repr(now)
        assert graph.record is not None
        ran.append(graph.record.outcome["h"])
    assert ran == ["ran", "recalled"]


class HoldsScaleValue(Node):
    """Scales by the number its class holds."""

    scale: Any = 2

    def forward(self, x: int, ctx: Any) -> Any:
        return x * self.scale


def test_a_class_value_set_to_an_equal_value_of_another_type_is_seen_by_a_graph_built_before(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A number a class holds set to one equal to it but of another type (``2`` to ``2.0``)
    is other code at the next forward of a graph built before: strict=True computes with
    what it holds now, and recalls that after."""
    monkeypatch.setattr(HoldsScaleValue, "scale", 2)
    graph = Graph.somatize(HoldsScaleValue().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(HoldsScaleValue, "scale", 2.0)
    assert repr(graph.forward(1, store=store, strict=True)) == "2.0"
    assert graph.record is not None
    assert graph.record.outcome["h"] == "ran"


class HoldsScaleWithin(Node):
    """Scales by the number held in what its class holds: a set, a tuple or a frozenset,
    or one of these in a dict or a list."""

    held: Any = None

    def forward(self, x: int, ctx: Any) -> Any:
        held = self.held
        if isinstance(held, dict):
            held = held["k"]
        elif isinstance(held, list):
            held = held[0]
        return x * next(iter(held))


def _swap_in_set(table: Any, was: Any, now: Any) -> None:
    table.discard(was)
    table.add(now)


@pytest.mark.parametrize(
    ("make", "swap"),
    [
        pytest.param(lambda k: {k}, lambda t, w, n: _swap_in_set(t, w, n), id="set"),
        pytest.param(
            lambda k: {"k": (k,)}, lambda t, w, n: t.__setitem__("k", (n,)), id="tuple-in-dict"
        ),
        pytest.param(
            lambda k: [frozenset({k})],
            lambda t, w, n: t.__setitem__(0, frozenset({n})),
            id="frozenset-in-list",
        ),
    ],
)
@pytest.mark.parametrize(("was", "now"), [(2, 2.0), (0.0, -0.0)])
def test_an_item_swapped_for_an_equal_one_of_another_type_is_seen_by_a_graph_built_before(
    make: Callable[[Any], Any],
    swap: Callable[[Any, Any, Any], None],
    was: Any,
    now: Any,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A number a set a class holds holds swapped in place for one equal to it but of
    another type or sign (``{2}`` to ``{2.0}``), or a tuple or frozenset a table holds set
    to one of such a number, is other code at the next forward of a graph built before:
    strict=True computes with what it holds now, and recalls that after."""
    monkeypatch.setattr(HoldsScaleWithin, "held", make(was))
    graph = Graph.somatize(HoldsScaleWithin().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", was)[1:] == ["recalled", "recalled"]
    swap(HoldsScaleWithin.held, was, now)
    ran = []
    for _ in range(2):
        assert repr(graph.forward(1, store=store, strict=True)) == repr(now)
        assert graph.record is not None
        ran.append(graph.record.outcome["h"])
    assert ran == ["ran", "recalled"]


_MADE_FROM_VALUES = """
import collections
import enum
from somatize import Node

class Mode(str):
    def factor(self):
        return 2

class Caseless(str):
    def __eq__(self, other):
        return str.lower(self) == str.lower(other)

    __hash__ = str.__hash__

    def factor(self):
        return 2

class Width(int):
    def factor(self):
        return 2

class Dims(tuple):
    def factor(self):
        return 2

class Tags(frozenset):
    def factor(self):
        return 2

class Pair(collections.namedtuple("Pair", "a b")):
    __slots__ = ()

    def factor(self):
        return 2

class Level(enum.IntEnum):
    LOW = 1

    def factor(self):
        return 2

HELD = MADE

class Holds(Node):
    held = MADE

    def forward(self, x, ctx):
        return x * self.held.factor()

class Reads(Node):
    def forward(self, x, ctx):
        return x * HELD.factor()
"""


@pytest.mark.parametrize(
    "made",
    [
        'Mode("a")',
        'Caseless("a")',
        "Width(3)",
        "Dims((2, 3))",
        'Tags({"a"})',
        "Pair(1, 2)",
        "Level.LOW",
    ],
)
def test_a_value_of_a_subclass_of_a_plain_class_is_named_with_its_code(
    made: str, tmp_path: Path
) -> None:
    """A value of a class made from a string, a number, a tuple or a frozenset (``class
    Mode(str)``, one saying when it equals another, a named tuple, an ``IntEnum``) that a
    class or its module holds is named with its class's code: one fingerprint in every
    process running that code, and another once a method of its class reads otherwise."""
    text = _MADE_FROM_VALUES.replace("MADE", made)
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    _package(tmp_path / "same", "valued", nodes=text)
    _package(tmp_path / "other", "valued", nodes=text.replace("return 2", "return 3"))
    first = _fingerprints_in(tmp_path / "same", "valued.nodes", "Holds", "Reads")
    assert _fingerprints_in(tmp_path / "same", "valued.nodes", "Holds", "Reads") == first
    other = _fingerprints_in(tmp_path / "other", "valued.nodes", "Holds", "Reads")
    assert [a != b for a, b in zip(first, other, strict=True)] == [True, True]


class _Mode(str):
    """A string with a method its node reads."""

    def factor(self) -> int:
        return 2


class HoldsMode(Node):
    """Scales by what the string its class holds says, and what it is given besides."""

    mode: Any = _Mode("a")

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.mode.factor() * getattr(self.mode, "extra", 1)


def test_a_value_of_a_subclass_of_a_plain_class_changed_is_seen_by_a_graph_built_before(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string of a class of the node's own that a class holds is seen changed at the next
    forward of a graph built before, its class given another method or it given an
    attribute: strict=True computes with what it is now; and a graph built after recalls
    that."""
    monkeypatch.setattr(HoldsMode, "mode", _Mode("a"))
    graph = Graph.somatize(HoldsMode().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(_Mode, "factor", lambda self: 3)
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    HoldsMode.mode.extra = 5
    assert _three_forwards(graph, store, "h", 15) == ["ran", "recalled", "recalled"]
    again = Graph.somatize(HoldsMode().named("h").frozen().cached())
    assert _three_forwards(again, store, "h", 15) == ["recalled"] * 3


def _read_k(held: Any) -> Any:
    """The number ``k`` of what a node holds: an attribute, an item by that key, or the
    first item."""
    if isinstance(held, (types.SimpleNamespace, collections.abc.Mapping)):
        return held.k if isinstance(held, types.SimpleNamespace) else held["k"]
    return held[0]


class HoldsLibraryTable(Node):
    """Scales by the number ``k`` a namespace, a deque, an array or a view of a dict its
    class holds says."""

    held: Any = None

    def forward(self, x: int, ctx: Any) -> Any:
        return x * _read_k(self.held)


_DICT_VIEWED: dict[str, Any] = {}


_LIBRARY_TABLES = [
    pytest.param(
        lambda k: types.SimpleNamespace(k=k), lambda t, k: setattr(t, "k", k), id="namespace"
    ),
    pytest.param(lambda k: collections.deque([k]), lambda t, k: t.__setitem__(0, k), id="deque"),
    pytest.param(
        lambda k: collections.Counter(k=k), lambda t, k: t.__setitem__("k", k), id="counter"
    ),
    pytest.param(
        lambda k: collections.defaultdict(int, k=k),
        lambda t, k: t.__setitem__("k", k),
        id="defaultdict",
    ),
    pytest.param(lambda k: array.array("d", [k]), lambda t, k: t.__setitem__(0, k), id="array"),
    pytest.param(
        lambda k: types.MappingProxyType(_DICT_VIEWED.setdefault("k", {"k": k})),
        lambda t, k: _DICT_VIEWED["k"].__setitem__("k", k),
        id="mappingproxy",
    ),
]


@pytest.mark.parametrize(("make", "edit"), _LIBRARY_TABLES)
def test_a_table_of_the_standard_library_a_class_holds_changed_in_place_is_seen(
    make: Callable[[Any], Any],
    edit: Callable[[Any, Any], None],
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``SimpleNamespace``, a ``deque``, a ``Counter``, a ``defaultdict``, an ``array`` or a
    ``MappingProxyType`` a class holds, changed in place between forwards, is other code at
    the next forward of a graph built before: strict=True computes with what it holds now;
    it is named by what it holds, so a graph built after recalls that, and one holding
    another value has another fingerprint."""
    _DICT_VIEWED.clear()
    monkeypatch.setattr(HoldsLibraryTable, "held", make(2.0))
    two = fingerprint_of(HoldsLibraryTable)
    graph = Graph.somatize(HoldsLibraryTable().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2.0) == ["ran", "recalled", "recalled"]
    edit(HoldsLibraryTable.held, 3.0)
    assert _three_forwards(graph, store, "h", 3.0) == ["ran", "recalled", "recalled"]
    again = Graph.somatize(HoldsLibraryTable().named("h").frozen().cached())
    assert _three_forwards(again, store, "h", 3.0) == ["recalled"] * 3
    _DICT_VIEWED.clear()
    monkeypatch.setattr(HoldsLibraryTable, "held", make(2.0))
    assert fingerprint_of(HoldsLibraryTable) == two
    _DICT_VIEWED.clear()
    monkeypatch.setattr(HoldsLibraryTable, "held", make(4.0))
    assert fingerprint_of(HoldsLibraryTable) != two


_SETTINGS = types.SimpleNamespace(k=2)


_QUEUE = collections.deque([2])


class ReadsLibraryTables(Node):
    """Scales by what a namespace and a deque of its module hold."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * _SETTINGS.k * _QUEUE[0]


def test_a_table_of_the_standard_library_its_module_holds_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``SimpleNamespace`` or a ``deque`` a node's module holds, changed in place between
    forwards, is other code at the next forward of a graph built before: strict=True
    computes with what it holds now."""
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_SETTINGS", types.SimpleNamespace(k=2))
    monkeypatch.setattr(module, "_QUEUE", collections.deque([2]))
    graph = Graph.somatize(ReadsLibraryTables().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]
    _SETTINGS.k = 3
    assert _three_forwards(graph, store, "h", 6) == ["ran", "recalled", "recalled"]
    _QUEUE[0] = 5
    assert _three_forwards(graph, store, "h", 15) == ["ran", "recalled", "recalled"]


class _Cache(_Counting):
    """Counts its calls on itself, and scales by what a large table it holds says."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.table = dict.fromkeys(range(10_000), 1)

    def __call__(self, x: int) -> int:
        return super().__call__(x) * self.table[x]


def test_a_large_table_an_object_marked_by_which_it_is_holds_is_never_taken_as_unchanged(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a graph compares of an object a class holds, marked by which object it is, at
    every forward is bounded; one holding more (a table of 10,000 entries) is taken as
    changed at every forward, never as unchanged: a change in place in the table, or beside
    it, is computed with, never recalled for."""
    monkeypatch.setattr(HoldsScale, "act", _Cache(2))
    monkeypatch.setattr(_marked, "_TOLD", set())
    with pytest.warns(SomatizeWarning, match=r"`HoldsScale\.act`"):
        graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == 10
    read = [held for mark in graph._code_watch.marks for held in mark.noted.lives]
    assert read and all(len(held) <= 4096 for held in read if hasattr(held, "__len__"))
    HoldsScale.act.table[5] = 7
    assert _three_forwards_on(graph, store, 5, 70) == ["ran", "ran", "ran"]
    HoldsScale.act.k = 3
    assert graph.forward(5, store=store, strict=True) == 105


class _Wide(_Counting):
    """Counts its calls on itself, and holds 300 attributes, scaling by the last."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        for at in range(299):
            setattr(self, f"a{at}", at)
        self.last = k

    def __call__(self, x: int) -> int:
        super().__call__(x)
        return x * self.last


class _Numbers(_Counting):
    """Counts its calls on itself, and adds the last of the 1,000 numbers it holds."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.numbers = [0] * 999 + [k]

    def __call__(self, x: int) -> int:
        super().__call__(x)
        return x * self.numbers[-1]


def _three_forwards_on(graph: Graph, store: Store, x: int, answer: Any) -> list[str]:
    """Three forwards of ``graph`` on ``x`` under strict, each checked to answer ``answer``:
    what each did at ``h``."""
    ran = []
    for _ in range(3):
        assert graph.forward(x, store=store, strict=True) == answer
        assert graph.record is not None
        ran.append(graph.record.outcome["h"])
    return ran


@pytest.mark.parametrize(
    ("held", "edit"),
    [
        (_Wide, lambda act, k: setattr(act, "last", k)),
        (_Numbers, lambda act, k: act.numbers.__setitem__(-1, k)),
    ],
)
def test_an_object_marked_by_which_it_is_holding_hundreds_of_entries_changed_is_seen(
    held: type[_Scale],
    edit: Callable[[Any, int], None],
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object a class holds, marked by which object it is (it counts its calls), holding
    300 attributes or a list of 1,000 numbers, changed in place between forwards once and
    again, is other code at the next forward each time: strict=True computes with what it
    holds now, then recalls that."""
    monkeypatch.setattr(HoldsScale, "act", held(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2)[1:] == ["recalled", "recalled"]
    for k in (3, 4):
        edit(HoldsScale.act, k)
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k


class Tabled(Node):
    """Scales by what the table its class holds says."""

    table: ClassVar[dict[str, int]] = {"by": 2}

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.table["by"]


def test_a_table_a_class_holds_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict of plain values a class holds, changed in place between forwards once and
    again, is other code at the next forward each time — and for a graph built after:
    strict=True computes with what it holds now, then recalls that."""
    monkeypatch.setattr(Tabled, "table", {"by": 2})
    graph = Graph.somatize(Tabled().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    for k in (3, 4):
        Tabled.table["by"] = k
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k
    Tabled.table["by"] = 5
    after = Graph.somatize(Tabled().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 5) == ["ran", "recalled", "recalled"]


class Memoing(Node):
    """Doubles, keeping what it computed in a dict its class holds."""

    memo: ClassVar[dict[int, int]] = {}

    def forward(self, x: int, ctx: Any) -> int:
        return self.memo.setdefault(x, 2 * x)


def test_a_cache_a_class_holds_that_its_forward_fills_is_its_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict a class holds that the forward of its node fills as it runs (a cache) is its
    state: after the first fill, forwards recall without drift, those of a graph built after
    too — and a change in place between forwards is still seen."""
    monkeypatch.setattr(Memoing, "memo", {})
    graph = Graph.somatize(Memoing().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        for x in (1, 1, 2, 3):
            assert graph.forward(x, store=store) == 2 * x
        outcomes = []
        for x in (1, 2, 3, 3):
            assert graph.forward(x, store=store) == 2 * x
            assert graph.record is not None
            outcomes.append(graph.record.outcome["h"])
        assert outcomes == ["recalled"] * 4
        after = Graph.somatize(Memoing().named("h").frozen().cached())
        assert _three_forwards(after, store, "h", 2) == ["recalled"] * 3
    Memoing.memo[1] = 7
    assert graph.forward(1, store=store, strict=True) == 7


class _Scaling(type):
    """A metaclass whose classes scale by what it holds."""

    by = 2


class ScaledByMeta(Node, metaclass=_Scaling):
    """Scales by what its metaclass holds."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * type(self).by  # type: ignore[attr-defined]


def test_a_value_set_on_a_node_s_metaclass_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value a node's class finds on its metaclass (``type(self).by``), set anew after a
    graph was built, is other code at the next forward: strict=True computes with it."""
    graph = Graph.somatize(ScaledByMeta().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(_Scaling, "by", 3)
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


class _HelperScaling(type):
    """A metaclass whose classes scale by what it holds, or by what its method says."""

    by = 2

    def times(cls, x: int) -> int:
        return x * 1


class _ScalesByMeta(metaclass=_HelperScaling):
    """A helper class whose metaclass holds what it scales by."""


class NamesHelperByMeta(Node):
    """Scales by what the metaclass of a helper class it names holds."""

    def forward(self, x: int, ctx: Any) -> int:
        return _ScalesByMeta.times(x) * _ScalesByMeta.by  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "value", "answer"),
    [("by", 3, 3), ("times", lambda cls, x: x * 3, 6)],
    ids=["value", "method"],
)
def test_a_value_set_on_a_helper_class_s_metaclass_is_seen(
    name: str, value: Any, answer: int, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value or a method a helper class a node's code names finds on its metaclass
    (``Helper.by``), set anew after a graph was built, is other code at that graph's next
    forward and at a graph built after: strict=True computes with it."""
    graph = Graph.somatize(NamesHelperByMeta().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(_HelperScaling, name, value)
    assert _three_forwards(graph, store, "h", answer) == ["ran", "recalled", "recalled"]
    after = Graph.somatize(NamesHelperByMeta().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", answer) == ["recalled"] * 3


def _applied(act: Any, x: int) -> int:
    return int(act(x))


@pytest.mark.parametrize("held", [_Scale, _Counting])
def test_an_object_a_partial_a_class_holds_binds_replaced_or_changed_is_seen(
    held: type[_Scale], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial a class holds, bound to an object (``partial(apply, Scale(2))``), replaced by
    one bound to another, or its object changed in place, is other code at the next forward
    each time: strict=True computes with what it binds now — the object named by what it
    holds, or marked by which object it is, as one a method closes over."""
    monkeypatch.setattr(HoldsScale, "act", functools.partial(_applied, held(2)))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    HoldsScale.act = functools.partial(_applied, held(3))  # type: ignore[assignment]
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    HoldsScale.act.args[0].k = 4  # type: ignore[attr-defined]
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]


class DefaultsToScale(Node):
    """Scales by the object its forward takes by default."""

    def forward(self, x: int, ctx: Any, act: Any = None) -> int:
        return int(act(x))


@pytest.mark.parametrize("held", [_Scale, _Counting])
def test_an_object_a_method_takes_by_default_changed_in_place_is_seen(
    held: type[_Scale], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a node's method takes by default (``act=Scale(2)``), changed in place
    between forwards once and again, is other code at the next forward each time:
    strict=True computes with what it holds now, as for an object the method closes over."""
    monkeypatch.setattr(DefaultsToScale.forward, "__defaults__", (held(2),))
    graph = Graph.somatize(DefaultsToScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    for k in (3, 4):
        DefaultsToScale.forward.__defaults__[0].k = k  # type: ignore[index]
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k


class _Plus(_Scale):
    """Adds what it holds, for an object given it as its class in place of another."""

    def __call__(self, x: int) -> int:
        return x + self.k


@pytest.mark.parametrize("held", [_Scale, _Counting])
def test_an_object_a_class_holds_given_another_class_is_seen(
    held: type[_Scale], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds given another class in place after a graph was built
    (``obj.__class__ = Other``) is other code at the next forward: strict=True computes
    with the class it has now."""
    monkeypatch.setattr(HoldsScale, "act", held(2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == 10
    HoldsScale.act.__class__ = _Plus
    assert graph.forward(5, store=store, strict=True) == 7


class EditedBase(Node):
    """Adds what its subclass's helper says."""

    def forward(self, x: int, ctx: Any) -> int:
        return self.helper(x)  # type: ignore[attr-defined, no-any-return]


class EditedOther(Node):
    """Scales, for a class given it as its base in place of another."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * 100


class Edited(EditedBase):
    """Has its helper's code and defaults, and its bases, set in place by the tests below."""

    def helper(self, x: int, by: int = 1, *, more: int = 0) -> int:
        return x + by + more


def _helper_times(self: Any, x: int, by: int = 1, *, more: int = 0) -> int:
    return x * 10 + by + more


_IN_PLACE: dict[str, tuple[Any, int]] = {
    "code": (lambda mp: mp.setattr(Edited.helper, "__code__", _helper_times.__code__), 51),
    "defaults": (lambda mp: mp.setattr(Edited.helper, "__defaults__", (5,)), 10),
    "keyword defaults": (lambda mp: mp.setattr(Edited.helper, "__kwdefaults__", {"more": 9}), 15),
    "a keyword default": (lambda mp: mp.setitem(Edited.helper.__kwdefaults__, "more", 7), 13),
    "bases": (lambda mp: _rebased(Edited, (EditedOther,)), 500),
}


def _rebased(kind: type, bases: tuple[type, ...]) -> Any:
    """Gives ``kind`` ``bases``; returns what puts the ones it had back."""
    was = kind.__bases__
    kind.__bases__ = bases
    return lambda: setattr(kind, "__bases__", was)


@pytest.mark.parametrize("edit", list(_IN_PLACE), ids=list(_IN_PLACE))
def test_code_set_in_place_after_its_graph_was_built_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    """A method given other code or defaults in place (``f.__code__ = ...``, as a reloader
    does, ``f.__defaults__ = (5,)``, ``f.__kwdefaults__ = ...``, one keyword default set),
    or a node's class given other bases, after its graph was built is seen at the next
    forward: an answer kept before is recalled as drifted, and strict=True computes it
    with the code as it is now — never the old answer taken for the new code's."""
    graph = Graph.somatize(Edited().named("e").frozen().cached())
    assert graph.forward(5, store=store) == 6
    change, now = _IN_PLACE[edit]
    undo = change(monkeypatch)
    try:
        with pytest.warns(Drifted, match="`e` was recalled"):
            assert graph.forward(5, store=store) == 6
        assert graph.forward(5, store=store, strict=True) == now
        assert graph.record is not None and graph.record.outcome["e"] == "ran"
    finally:
        monkeypatch.undo()
        if callable(undo):
            undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert graph.forward(5, store=store, strict=True) == 6


_REFUSING = """
import sys

from somatize import Graph, Node


def refuse(event, args):
    if event == "sys.addaudithook":
        raise RuntimeError("no more hooks")


sys.addaudithook(refuse)


class Plus(Node):
    def forward(self, x, ctx):
        return x + 1


print(Graph.somatize(Plus().named("p")).forward(1))
print(__import__("somatize.catalog._watch").catalog._watch._HEARING[0])
"""


def test_a_process_that_refuses_audit_hooks_still_runs_graphs(tmp_path: Path) -> None:
    """Where a hook added before refuses the audit hook that counts code set in place, that
    is known, and a graph is still built and run (such sets are then seen by a graph
    built after); elsewhere the hook counts."""
    catalog.watch_code(())
    assert _watch._HEARING[0] is True
    path = tmp_path / "refusing.py"
    _write(path, _REFUSING)
    assert _printed([str(path)]).split() == ["2", "False"]


def test_classes_holding_each_other_s_objects_are_fingerprinted_alike_each_time() -> None:
    """Two classes each holding an object of the other (a callable registry pointing both
    ways) are fingerprinted the same each time they are asked, without end: an object
    reached again while it is read or looked at is marked there."""

    class Left:
        def __call__(self, x: int) -> int:
            return x

    class Right:
        def __call__(self, x: int) -> int:
            return x

    Left.peer = Right()  # type: ignore[attr-defined]
    Right.peer = Left()  # type: ignore[attr-defined]
    right = fingerprint_of(Right)
    left = fingerprint_of(Left)
    assert [fingerprint_of(Right), fingerprint_of(Left)] == [right, left]
    assert [fingerprint_of(Left), fingerprint_of(Right)] == [left, right]


def test_a_hook_put_on_a_torch_module_a_class_holds_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch module a class holds, named by what it holds, given a hook after a graph was
    built is other code from the next forward on: strict=True computes with the hook, and
    with another put on it after that."""
    import torch

    monkeypatch.setattr(Clamps, "act", torch.nn.ReLU(), raising=False)
    graph = Graph.somatize(Clamps().named("c").frozen().cached())
    assert graph.forward(-2.0, store=store) == 0.0
    Clamps.act.register_forward_hook(lambda module, given, made: made + 100)
    assert graph.forward(-2.0, store=store, strict=True) == 100.0
    assert graph.record is not None and graph.record.outcome["c"] == "ran"
    Clamps.act.register_forward_hook(lambda module, given, made: made * 2)  # and another
    assert graph.forward(-2.0, store=store, strict=True) == 200.0


class Clamps(Node):
    """Calls the torch module the test above sets on it."""

    def forward(self, x: float, ctx: Any) -> float:
        import torch

        return float(self.act(torch.tensor([x])))  # type: ignore[attr-defined]


_HELPER = """
STEP = 2


def helper(x):
    return x * STEP
"""


class _Calls:
    """Calls the function it holds."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def __call__(self, x: int) -> int:
        return self.function(x)  # type: ignore[no-any-return]


def _held_edited_between_runs(
    text: Callable[[int], str],
    held: Callable[[Any], Any],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loads the module ``text(by)`` makes for ``by`` in 2, 3, 3 (its file edited between
    runs), has ``HoldsScale`` hold ``held(module)`` — an object that multiplies by ``by`` —
    and checks each run computes ``5 * by`` under strict, and that the fingerprint moved
    with the edit and not without one."""
    path = tmp_path / "fingerprinted.py"
    found = []
    for by in (2, 3, 3):
        monkeypatch.setattr(HoldsScale, "act", held(_load(path, text(by), monkeypatch)))
        found.append(fingerprint_of(HoldsScale))
        graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
        assert graph.forward(5, store=store, strict=True) == 5 * by
    assert found[0] != found[1] == found[2]


def test_a_function_an_object_holds_is_named_with_what_it_names_in_its_module(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function an object held by a class holds is named with the helpers and constants
    it names in its module, as the class's own functions are: its module edited between
    two runs (``STEP = 2`` made 3) is other code, never recalled for the old one's answer."""
    _held_edited_between_runs(
        lambda by: _HELPER.replace("STEP = 2", f"STEP = {by}"),
        lambda loaded: _Calls(loaded.helper),
        store,
        tmp_path,
        monkeypatch,
    )


_TABLE = """
class Table:
    table = {"by": 2}

    def __call__(self, x):
        return x * self.table["by"]
"""


def test_what_the_class_of_an_object_a_class_holds_keeps_is_in_its_name(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds is named with what its own class keeps that is no plain
    value nor function (a table, ``table = {"by": 2}``): that class edited between two
    runs (``{"by": 3}``) is other code, never recalled for the old one's answer."""
    _held_edited_between_runs(
        lambda by: _TABLE.replace('"by": 2', f'"by": {by}'),
        lambda loaded: loaded.Table(),
        store,
        tmp_path,
        monkeypatch,
    )


def _int_times(k: int) -> Any:
    """An ``int`` that, called, multiplies by itself."""

    class By(int):
        def __call__(self, x: int) -> int:
            return x * int(self)

    return By(k)


def _int_plus(k: int) -> Any:
    """An ``int`` of a class of the same name that, called, adds itself."""

    class By(int):
        def __call__(self, x: int) -> int:
            return x + int(self)

    return By(k)


_AB = collections.namedtuple("Pair", "a b")
_BA = collections.namedtuple("Pair", "b a")


class _First:
    """Scales by the field ``a`` of the pair it holds."""

    def __init__(self, pair: Any) -> None:
        self.pair = pair

    def __call__(self, x: int) -> int:
        return x * self.pair.a  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "made",
    [
        (lambda: _Calls(_int_times(2)), lambda: _Calls(_int_plus(2))),
        (lambda: _First(_AB(2, 3)), lambda: _First(_BA(2, 3))),
    ],
    ids=["int subclass", "namedtuple"],
)
def test_a_value_of_a_subclass_of_a_plain_type_is_not_named_as_the_plain_value(
    made: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value an object a class holds, or a method closes over, of a subclass of a plain
    type (an ``int`` with methods, a namedtuple) is not named by its type's name and what
    it equals alone, which two such classes doing other things share: objects holding
    them, computing apart, are fingerprinted apart, as are methods closing over them."""
    one, other = made[0](), made[1]()
    assert one(5) != other(5)
    found = []
    for held in (one, other):
        monkeypatch.setattr(HoldsScale, "act", held)
        found.append(fingerprint_of(HoldsScale))
    assert found[0] != found[1]
    inners = [next(iter(vars(held).values())) for held in (one, other)]
    closing = [fingerprint_of(_closing_over(inner)) for inner in inners]
    assert closing[0] != closing[1]


def _closing_over(inner: Any) -> type:
    """A node class whose method closes over ``inner``."""

    class Closes(Node):
        def forward(self, x: int, ctx: Any) -> Any:
            return inner

    return Closes


_MAKER = """
class Layer:
    def __call__(self, x):
        return x * 2


class Maker:
    def __init__(self):
        self.make = Layer

    def __call__(self, x):
        return self.make()(x)
"""


def test_a_class_an_object_a_class_holds_holds_is_named_by_its_code(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class an object held by a class holds (``self.make = Layer``) is named by its code
    as well as its name: that class edited between two runs (``x * 2`` made ``x * 3``) is
    other code, never recalled for the old one's answer."""
    _held_edited_between_runs(
        lambda by: _MAKER.replace("x * 2", f"x * {by}"),
        lambda loaded: loaded.Maker(),
        store,
        tmp_path,
        monkeypatch,
    )


class _Signs:
    """Gives what it is called with the sign of the first number it holds."""

    def __init__(self, signs: list[float]) -> None:
        self.signs = signs

    def __call__(self, x: float) -> float:
        return math.copysign(x, self.signs[0])


def test_an_equal_value_set_in_place_in_an_object_a_class_holds_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value set in place in an object a class holds, named by what it holds, that equals
    the one it replaces but computes apart (``-0.0`` for ``0.0``) is a change: a graph built
    after computes with it, never recalling what the old value computed under its name."""
    signs = _Signs([0.0])
    monkeypatch.setattr(HoldsScale, "act", signs)
    before = fingerprint_of(HoldsScale)
    assert Graph.somatize(HoldsScale().named("h").frozen().cached()).forward(5, store=store) == 5
    signs.signs[0] = -0.0
    assert fingerprint_of(HoldsScale) != before
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == -5


def test_a_builtin_method_of_an_object_a_class_holds_is_never_taken_for_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A builtin method bound to an object a class holds (``re.compile("a").search``) is not
    named by its name alone, which another object's method shares: one searching another
    way (``re.I``) makes another fingerprint."""
    found = []
    for flags in (0, re.IGNORECASE):
        monkeypatch.setattr(HoldsScale, "act", re.compile("a", flags).search)
        found.append(fingerprint_of(HoldsScale))
    assert found[0] != found[1]


class _Itself:
    """Runs a method bound to itself, which it holds: a cycle through it."""

    def __init__(self) -> None:
        self.run = self.twice

    def twice(self, x: int) -> int:
        return 2 * x

    def __call__(self, x: int) -> int:
        return self.run(x)


def test_an_object_named_by_what_it_holds_is_not_kept_alive_by_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object a class holds, named by what it holds, is freed once nothing else holds it,
    even one that holds itself (a method bound to it): what was read of it to name it is
    not kept, so objects a class is given one after another do not pile up."""
    made = _Itself()
    gone = weakref.ref(made)
    monkeypatch.setattr(HoldsScale, "act", made)
    named = fingerprint_of(HoldsScale)
    HoldsScale.act = _Itself()  # type: ignore[assignment]  # put back as it was set
    assert fingerprint_of(HoldsScale) == named  # named by what it holds: alike
    del made
    gc.collect()
    assert gone() is None


def _calling(held: Any) -> Any:
    """A function that calls ``held``, which it closes over."""

    def run(x: int) -> Any:
        return held(x)

    return run


def test_an_object_closed_over_by_a_function_an_object_holds_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object closed over by a function that an object a class holds holds, changed in
    place after a graph was built (``scale.k = 3``), is other code from the next forward
    on, as the object itself changed would be: strict=True computes with it."""
    scale = _Scale(2)
    monkeypatch.setattr(HoldsScale, "act", _Calls(_calling(scale)))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store) == 10
    scale.k = 3
    assert graph.forward(5, store=store, strict=True) == 15


class _Strict:
    """Scales by what it holds; asked for any attribute it lacks, raises KeyError, not the
    AttributeError ``hasattr`` expects."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __getattr__(self, name: str) -> Any:
        raise KeyError(name)

    def __call__(self, x: int) -> int:
        return x * self.k


def test_an_object_whose_getattr_raises_another_error_is_fingerprinted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds whose ``__getattr__`` raises KeyError for what it lacks (as
    a dict-backed config does) is fingerprinted like any other, by what it holds: another
    value is another fingerprint, and the node computes and recalls."""
    monkeypatch.setattr(HoldsScale, "act", _Strict(2))
    before = fingerprint_of(HoldsScale)
    assert Graph.somatize(HoldsScale().named("h").frozen().cached()).forward(5, store=store) == 10
    monkeypatch.setattr(HoldsScale, "act", _Strict(3))
    assert fingerprint_of(HoldsScale) != before
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert graph.forward(5, store=store, strict=True) == 15


class HoldsMany(Node):
    """Scales by what the objects it holds in a container say."""

    acts: Any = None

    def forward(self, x: int, ctx: Any) -> int:
        acts = self.acts
        first = acts["a"] if isinstance(acts, dict) else next(iter(acts))
        if isinstance(first, (list, tuple)):  # held a level deeper
            first = first[0]
        return first(x)  # type: ignore[no-any-return]


_CONTAINED: dict[str, Any] = {
    "dict": lambda made: {"a": made, "n": 1},
    "list": lambda made: [made, 1],
    "tuple": lambda made: (made, 1),
    "set": lambda made: {made},
    "nested": lambda made: [(made, "x"), {"b": [1]}],
}


@pytest.mark.parametrize("held", [_Scale, _Counting, _SlottedCounting])
@pytest.mark.parametrize("container", list(_CONTAINED))
def test_an_object_a_class_holds_in_a_container_changed_in_place_is_seen(
    container: str, held: type[Any], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds in a dict, list, tuple or set (a level or two deep),
    changed in place between forwards once and again (``Kind.acts["a"].k = 3``), is other
    code at the next forward each time: strict=True computes with what it holds now, never
    recalling what it computed before — one that counts its calls on itself too, and that
    count, moved as its node runs, makes no forward after compute again."""
    made = held(2)
    monkeypatch.setattr(HoldsMany, "acts", _CONTAINED[container](made))
    graph = Graph.somatize(HoldsMany().named("h").frozen().cached())
    for k in (2, 3, 4):
        made.k = k
        ran = _three_forwards(graph, store, "h", k)
        assert ran[1:] == ["recalled", "recalled"], k


def test_an_object_a_class_holds_in_a_container_is_in_its_fingerprint(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds in a container is named in the class's fingerprint as one
    it holds itself is: another object there, or one changed in place, is another
    fingerprint, and an answer kept before is recalled as drifted; one set in the
    container in place of another (``Kind.acts["a"] = Scale(3)``) is seen at the next
    forward too."""
    monkeypatch.setattr(HoldsMany, "acts", {"a": _Scale(2)})
    two = fingerprint_of(HoldsMany)
    monkeypatch.setattr(HoldsMany, "acts", {"a": _Scale(2)})
    assert fingerprint_of(HoldsMany) == two  # named by what it holds: alike
    graph = Graph.somatize(HoldsMany().named("h").frozen().cached())
    assert graph.forward(5, store=store) == 10
    HoldsMany.acts["a"].k = 3
    with pytest.warns(Drifted, match="`h` was recalled"):
        assert graph.forward(5, store=store) == 10
    assert graph.forward(5, store=store, strict=True) == 15
    assert fingerprint_of(HoldsMany) != two
    HoldsMany.acts["a"] = _Scale(4)
    assert graph.forward(5, store=store, strict=True) == 20


class _LogsItself(Node):
    """Notes each value it is handed, as an object, in a list its class holds."""

    log: ClassVar[list[Any]] = [_Scale(0)]

    def forward(self, x: int, ctx: Any) -> int:
        self.log.append(_Scale(x))
        return x * 2


def test_an_object_its_own_node_adds_to_a_container_its_class_holds_is_state(
    store: Store,
) -> None:
    """A container a class holds, given another object by its own node's forward (a log),
    is its state: the forwards after recall what was kept; one set in it between forwards
    is seen."""
    graph = Graph.somatize(_LogsItself().named("l").frozen().cached())
    ran = _three_forwards(graph, store, "l", 2)
    assert ran == ["ran", "recalled", "recalled"]
    _LogsItself.log.append(_Scale(5))
    assert graph.forward(1, store=store, strict=True) == 2
    assert graph.record is not None and graph.record.outcome["l"] == "ran"


class _FillsWhatItHolds(Node):
    """Scales by the number ``k`` its class holds in a container its forward fills too (a
    log of what it was handed), counting its runs."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _FillsWhatItHolds.runs[0] += 1
        if isinstance(self.held, dict):
            self.held.update(seen=x)
            return x * self.held["k"]  # type: ignore[no-any-return]
        self.held.extend([x])
        return x * self.held[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(lambda: collections.deque([2]), id="deque"),
        pytest.param(lambda: collections.deque([2], maxlen=3), id="bounded-deque"),
        pytest.param(lambda: collections.Counter({"k": 2}), id="Counter"),
        pytest.param(lambda: collections.defaultdict(int, {"k": 2}), id="defaultdict"),
        pytest.param(lambda: array.array("i", [2]), id="array"),
    ],
)
def test_a_container_of_the_standard_library_its_own_node_fills_is_state(
    held: Callable[[], Any], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``deque``, a ``Counter``, a ``defaultdict`` or an ``array`` a class holds, filled by
    its own node's forward (a log), is its state, as a list it fills is: the node runs
    once, and the forwards after recall what it kept. One changed between forwards is
    seen: strict=True computes with what it holds now."""
    monkeypatch.setattr(_FillsWhatItHolds, "held", held())
    monkeypatch.setattr(_FillsWhatItHolds, "runs", [0])
    graph = Graph.somatize(_FillsWhatItHolds().named("f").frozen().cached())
    assert _three_forwards(graph, store, "f", 2) == ["ran", "recalled", "recalled"]
    assert _FillsWhatItHolds.runs == [1]
    if isinstance(_FillsWhatItHolds.held, dict):
        _FillsWhatItHolds.held["k"] = 3
    else:
        _FillsWhatItHolds.held[0] = 3
    assert _three_forwards(graph, store, "f", 3) == ["ran", "recalled", "recalled"]
    assert _FillsWhatItHolds.runs == [2]


class _SetsWhatItHolds(Node):
    """Scales by the number ``k`` of an object its class holds, on which its forward notes
    how many times it ran and what it was last handed, counting its runs."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _SetsWhatItHolds.runs[0] += 1
        self.held.calls += 1
        held = self.held
        held.last = x
        return x * self.held.k  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(lambda: types.SimpleNamespace(k=2, calls=0), id="namespace"),
        pytest.param(lambda: _Scale(2), id="helper-object"),
    ],
)
def test_an_object_whose_attributes_its_own_node_sets_is_state(
    held: Callable[[], Any], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds whose attributes its own node's forward sets (``self.ns.calls
    += 1``) is its state, as a container it fills is: the node runs once, and the forwards
    after, of that graph and of one built after, recall what it kept. One set between
    forwards is seen: strict=True computes with what it holds now."""
    made = held()
    made.calls = 0
    monkeypatch.setattr(_SetsWhatItHolds, "held", made)
    monkeypatch.setattr(_SetsWhatItHolds, "runs", [0])
    graph = Graph.somatize(_SetsWhatItHolds().named("s").frozen().cached())
    assert _three_forwards(graph, store, "s", 2) == ["ran", "recalled", "recalled"]
    assert _SetsWhatItHolds.runs == [1]
    after = Graph.somatize(_SetsWhatItHolds().named("s").frozen().cached())
    assert _three_forwards(after, store, "s", 2) == ["recalled"] * 3
    _SetsWhatItHolds.held.k = 3
    assert _three_forwards(graph, store, "s", 3) == ["ran", "recalled", "recalled"]
    assert _SetsWhatItHolds.runs == [2]


class _SetsWhatItHoldsBySetattr(Node):
    """As :class:`_SetsWhatItHolds`, noting its calls with ``setattr``."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _SetsWhatItHoldsBySetattr.runs[0] += 1
        setattr(self.held, "calls", self.held.calls + 1)  # noqa: B010 - the form under test
        return x * self.held.k  # type: ignore[no-any-return]


class _SetsWhatItHoldsThroughALocal(Node):
    """As :class:`_SetsWhatItHolds`, noting what it was handed with ``setattr`` on a local."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _SetsWhatItHoldsThroughALocal.runs[0] += 1
        held = self.held
        setattr(held, "last", x)  # noqa: B010 - the form under test
        return x * held.k  # type: ignore[no-any-return]


class _SetsWhatItHoldsByVars(Node):
    """As :class:`_SetsWhatItHolds`, noting what it was handed through ``vars``."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _SetsWhatItHoldsByVars.runs[0] += 1
        vars(self.held)["last"] = x
        return x * self.held.k  # type: ignore[no-any-return]


class _SetsWhatItHoldsByDict(Node):
    """As :class:`_SetsWhatItHolds`, noting what it was handed through ``__dict__``."""

    held: ClassVar[Any] = None
    runs: ClassVar[list[int]] = [0]

    def forward(self, x: int, ctx: Any) -> int:
        _SetsWhatItHoldsByDict.runs[0] += 1
        self.held.__dict__["last"] = x
        return x * self.held.k  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "kind",
    [
        _SetsWhatItHoldsBySetattr,
        _SetsWhatItHoldsThroughALocal,
        _SetsWhatItHoldsByVars,
        _SetsWhatItHoldsByDict,
    ],
)
def test_an_object_its_own_node_sets_by_name_is_state(
    kind: type[_SetsWhatItHoldsBySetattr], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a class holds whose attributes its own node's forward sets by name
    (``setattr(self.ns, "n", ...)``, ``vars(self.ns)["n"] = ...``, through ``__dict__``)
    is its state, as one it sets ``self.ns.n`` of is: the node runs once, and the forwards
    after recall what it kept; one set between forwards is still seen."""
    monkeypatch.setattr(kind, "held", types.SimpleNamespace(k=2, calls=0))
    monkeypatch.setattr(kind, "runs", [0])
    graph = Graph.somatize(kind().named("s").frozen().cached())
    assert _three_forwards(graph, store, "s", 2) == ["ran", "recalled", "recalled"]
    assert kind.runs == [1]
    kind.held.k = 3
    assert _three_forwards(graph, store, "s", 3) == ["ran", "recalled", "recalled"]
    assert kind.runs == [2]


def _first_of(acts: Any) -> Any:
    """A forward scaling by the first object ``acts`` holds."""

    def forward(self: Any, x: int, ctx: Any) -> int:
        return acts[0](x)  # type: ignore[no-any-return]

    return forward


_CLOSED: list[Any] = [_Counting(2)]


class ClosesOverMany(Node):
    """Scales by the first object of a list its forward closes over."""

    forward = _first_of(_CLOSED)


def test_an_object_in_a_container_a_method_closes_over_changed_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object in a list a method closes over, changed in place between forwards, is
    other code at the next forward, as one the method closes over itself is: strict=True
    computes with what it holds now; what it counts as its node runs is its state."""
    monkeypatch.setattr(_CLOSED[0], "k", 2)
    graph = Graph.somatize(ClosesOverMany().named("c").frozen().cached())
    for k in (2, 3):
        _CLOSED[0].k = k
        ran = _three_forwards(graph, store, "c", k)
        assert ran[1:] == ["recalled", "recalled"], k


class Vocabulary(Node):
    """Looks a word up in a table of 5,000 entries its class holds."""

    vocab: ClassVar[dict[str, int]] = {}

    def forward(self, x: int, ctx: Any) -> int:
        return self.vocab.get(f"w{x}", -1)


def test_a_table_too_large_to_watch_a_class_holds_is_told_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table a class holds larger than a graph compares at every forward (5,000 entries)
    is taken as changed at every forward, so its node never recalls: the user is told, once,
    which class and attribute, and what to do instead — and told when a table grows past
    that bound between forwards."""
    monkeypatch.setattr(Vocabulary, "vocab", {f"w{i}": i for i in range(5000)})
    monkeypatch.setattr(_marked, "_TOLD", set())
    with pytest.warns(SomatizeWarning, match=r"`Vocabulary\.vocab`.*instance.*input"):
        graph = Graph.somatize(Vocabulary().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        Graph.somatize(Vocabulary().named("h").frozen().cached())
        assert graph.forward(3, store=store, strict=True) == 3
    monkeypatch.setattr(Memoing, "memo", {x: 2 * x for x in range(4090)})
    graph = Graph.somatize(Memoing().named("h").frozen().cached())
    assert graph.forward(1, store=store, strict=True) == 2
    Memoing.memo.update((x, 2 * x) for x in range(4090, 4100))
    with pytest.warns(SomatizeWarning, match=r"`Memoing\.memo`"):
        assert graph.forward(4095, store=store, strict=True) == 8190


class _SlottedCounted(_SlottedOnly):
    """A :class:`_SlottedOnly` that says when it is freed."""

    __slots__ = ()
    freed: ClassVar[list[int]] = []

    def __del__(self) -> None:
        self.freed.append(self.k)


def _kept_alive() -> int:
    """How many objects that cannot be referenced weakly the fingerprints keep alive."""
    tables = (_marks._TOKENS, _marks._HELD, _marks._MARKED)
    return len({id(e[0]()) for t in tables for e in t.values() if type(e[0]) is _marks._Kept})


def test_objects_that_cannot_be_referenced_weakly_are_freed_once_nothing_else_holds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A table, or an object with ``__slots__`` and no ``__weakref__``, that a class holds is
    kept alive while it is fingerprinted, not for the whole process: graphs built in a loop,
    each of a class given a new one, keep no more alive than a few."""
    monkeypatch.setattr(_SlottedCounted, "freed", [])
    monkeypatch.setattr(Tabled, "table", Tabled.table)  # put back after
    monkeypatch.setattr(HoldsScale, "act", HoldsScale.act)
    before = _kept_alive()
    for k in range(300):
        Tabled.table = {"by": k}
        HoldsScale.act = _SlottedCounted(k)
        Graph.somatize(Tabled().named("t") >> HoldsScale().named("h"))
    gc.collect()
    assert len(_SlottedCounted.freed) > 250
    assert _kept_alive() - before < 50


class CountsBuilt(Node):
    """Doubles; counts, in a table its class holds, how many of it were built."""

    built: ClassVar[dict[str, int]] = {"n": 0}

    def __init__(self) -> None:
        self.built["n"] += 1

    def forward(self, x: int, ctx: Any) -> int:
        return 2 * x


def test_a_table_a_class_s_own_constructor_fills_is_its_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table a class holds that its own code fills outside a forward (a count of the nodes
    built, in ``__init__``) is its state, taken as the class's text writes it: a graph built
    after another node of it was built recalls without drift, in this process as in
    another."""
    monkeypatch.setattr(CountsBuilt, "built", {"n": 0})
    was = fingerprint_of(CountsBuilt)
    graph = Graph.somatize(CountsBuilt().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
        for _ in range(2):
            after = Graph.somatize(CountsBuilt().named("h").frozen().cached())
            assert _three_forwards(after, store, "h", 2) == ["recalled"] * 3
            assert _three_forwards(graph, store, "h", 2) == ["recalled"] * 3
    assert fingerprint_of(CountsBuilt) == was


def _times(x: int, k: int = 1) -> int:
    return x * k


def test_a_keyword_a_partial_a_class_holds_binds_set_in_place_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partial a class holds (``act = partial(times, k=2)``) whose keywords are set in place
    after a graph was built (``Kind.act.keywords["k"] = 3``), once and again, is other code
    at the next forward of that graph each time: strict=True computes with what it binds
    now, never recalling what it computed before."""
    monkeypatch.setattr(HoldsScale, "act", functools.partial(_times, k=2))
    graph = Graph.somatize(HoldsScale().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    for k in (3, 4):
        HoldsScale.act.keywords["k"] = k  # type: ignore[attr-defined]
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k


class ScalesByDefault(Node):
    """Scales by what the table its forward takes by default says."""

    def forward(self, x: int, ctx: Any, by: Any = None) -> int:
        return x * int(by["k"] if isinstance(by, dict) else by[0])


@pytest.mark.parametrize(
    ("table", "edit"),
    [
        ({"k": 2}, lambda by, k: by.__setitem__("k", k)),
        ([2], lambda by, k: by.__setitem__(0, k)),
    ],
)
def test_a_table_a_method_takes_by_default_changed_in_place_is_seen(
    table: Any, edit: Callable[[Any, int], None], store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict or list a node's forward takes by default (``by={"k": 2}``), changed in place
    between forwards once and again (``Kind.forward.__defaults__[0]["k"] = 3``), is other
    code at the next forward of a graph built before each time, and for a graph built
    after: strict=True computes with what it holds now, never recalling the old answer."""
    monkeypatch.setattr(ScalesByDefault.forward, "__defaults__", (table,))
    graph = Graph.somatize(ScalesByDefault().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    for k in (3, 4):
        edit(ScalesByDefault.forward.__defaults__[0], k)  # type: ignore[index]
        assert _three_forwards(graph, store, "h", k) == ["ran", "recalled", "recalled"], k
    edit(ScalesByDefault.forward.__defaults__[0], 5)  # type: ignore[index]
    after = Graph.somatize(ScalesByDefault().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 5) == ["ran", "recalled", "recalled"]


class MemoByDefault(Node):
    """Doubles, keeping what it computed in the dict its forward takes by default."""

    def forward(self, x: int, ctx: Any, memo: Any = None) -> int:
        return int(memo.setdefault(x, 2 * x))


def test_a_cache_a_forward_takes_by_default_and_fills_is_its_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict a node's forward takes by default and fills as it runs (``memo={}``, the
    memo-default idiom) is its state, taken as its text writes it: forwards recall without
    drift from the first, those of a graph built after too, and the class keeps its
    fingerprint however full the cache, so another process shares it."""
    monkeypatch.setattr(MemoByDefault.forward, "__defaults__", ({},))
    was = fingerprint_of(MemoByDefault)
    graph = Graph.somatize(MemoByDefault().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        outcomes = []
        for x in (1, 1, 2, 3, 3):
            assert graph.forward(x, store=store) == 2 * x
            assert graph.record is not None
            outcomes.append(graph.record.outcome["h"])
        assert outcomes == ["ran", "recalled", "ran", "ran", "recalled"]
        after = Graph.somatize(MemoByDefault().named("h").frozen().cached())
        assert _three_forwards(after, store, "h", 2) == ["recalled"] * 3
    assert MemoByDefault.forward.__defaults__ == ({1: 2, 2: 4, 3: 6},)
    assert fingerprint_of(MemoByDefault) == was


class ListsBuilt(Node):
    """Doubles; lists, in a list its class holds, each of it built."""

    registry: ClassVar[list[Any]] = []

    def __init__(self) -> None:
        type(self).registry.append(self)

    def forward(self, x: int, ctx: Any) -> int:
        return 2 * x


def test_a_list_of_nodes_a_class_s_own_constructor_fills_is_its_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list a class holds that its own constructor fills with the nodes built (a registry,
    ``type(self).registry.append(self)``) is its state, as a count of them is, taken as the
    class's text writes it: forwards recall without drift, those of a graph built after
    another node of it was built too, and the class keeps its fingerprint."""
    monkeypatch.setattr(ListsBuilt, "registry", [])
    was = fingerprint_of(ListsBuilt)
    graph = Graph.somatize(ListsBuilt().named("h").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
        for _ in range(2):
            after = Graph.somatize(ListsBuilt().named("h").frozen().cached())
            assert _three_forwards(after, store, "h", 2) == ["recalled"] * 3
            assert _three_forwards(graph, store, "h", 2) == ["recalled"] * 3
    assert len(ListsBuilt.registry) == 3
    assert fingerprint_of(ListsBuilt) == was


_DEFAULTS_OF_THE_LIBRARY = """
import collections
import functools
import os
import threading

from somatize import Node
from somatize.catalog import fingerprint_of

_LOCK = threading.Lock()


def _read(name, environ=os.environ, lock=_LOCK, missing=object()):
    return environ.get(name, missing)


Pair = collections.namedtuple("Pair", "left right")


def _making():
    tuple_new = tuple.__new__  # as namedtuple's _make closes over it

    def make(cls, items):
        return tuple_new(cls, items)

    return make


class Reads(Node):
    look = functools.partial(_read, environ=os.environ)
    make = _making()

    def forward(self, x, ctx, environ=os.environ, lock=_LOCK):
        return Pair._make([_read("HOME") is not None, x]).right


print(fingerprint_of(Reads))
"""


def test_a_method_defaulting_to_an_object_of_the_standard_library_is_named_alike_everywhere(
    tmp_path: Path,
) -> None:
    """A function taking the process's environment, a lock or a bare ``object()`` by
    default, or a partial binding one (``environ=os.environ``, the common way to let a
    test hand another), is named by that object's type, as the standard library's objects
    are, and a builtin a helper's method closes over (``tuple.__new__`` in a namedtuple's
    ``_make``) by its name: the same in every process, whatever the environment holds —
    not by a mark of that very object, which would make every new process, and every
    worker, take the node for other code."""
    path = tmp_path / "library_defaults.py"
    _write(path, _DEFAULTS_OF_THE_LIBRARY)
    printed = [_printed([str(path)], SOMATIZE_TEST_EXTRA=extra).strip() for extra in ("one", "two")]
    assert printed[0].startswith("sha256:")
    assert printed[0] == printed[1]


_FILLED_AS_IT_RUNS = """
import sys
import warnings
from typing import Any, ClassVar

from somatize import Drifted, Graph, Node, Store


class Memo(Node):
    _memo: ClassVar[dict[int, int]] = {}

    def forward(self, x, ctx):
        if x not in self._memo:
            self._memo[x] = 2 * x
        return self._memo[x]


class MemoThroughALocal(Node):
    _memo: ClassVar[dict[int, int]] = {}

    def forward(self, x, ctx):
        memo = type(self)._memo
        if x not in memo:
            memo[x] = 2 * x
        return memo[x]


class Registers(Node):
    _registry: ClassVar[dict[int, int]] = {}

    def __init__(self):
        registry = type(self)._registry
        registry[len(registry)] = 1

    def forward(self, x, ctx):
        return 2 * x


def _remember(table, x, y):
    table[x] = y
    return y


class MemoHandedOn(Node):
    _memo: ClassVar[dict[int, int]] = {}

    def forward(self, x, ctx):
        return self._memo.get(x) or _remember(self._memo, x, 2 * x)


class MemoHandedOnOverLines(Node):
    _memo: ClassVar[dict[int, int]] = {}

    def forward(self, x, ctx):
        return self._memo.get(x) or _remember(
            self._memo, x, 2 * x
        )


class RegistersAsItRuns(Node):
    _registry: ClassVar[dict[int, Any]] = {}

    def forward(self, x, ctx):
        registry = type(self)._registry
        registry.setdefault(x, self)
        return 2 * x


store = Store(sys.argv[1])
warnings.simplefilter("error", Drifted)
kinds = (Memo, MemoThroughALocal, MemoHandedOn, MemoHandedOnOverLines, Registers)
for kind in (*kinds, RegistersAsItRuns):
    graph = Graph.somatize(kind().named("h").frozen().cached())
    ran = []
    for x in (1, 2, 1):
        assert graph.forward(x, store=store) == 2 * x
        ran.append(graph.record.outcome["h"])
    print(kind.__name__, *ran)
"""


def test_a_table_a_class_s_own_code_fills_keeps_the_fingerprint_of_a_new_process(
    tmp_path: Path,
) -> None:
    """A dict a class holds that its own code fills as it runs — its forward (a memo,
    ``self._memo[x] = y``), or through a local it is read into (``memo =
    type(self)._memo; memo[x] = y``), or a function its forward hands it to, or its
    constructor (a registry) — is its state:
    a new process, starting with the table as the class's text writes it, recalls what
    another kept, without drift, and the first process keeps what its first forwards
    computed."""
    path = tmp_path / "filled_as_it_runs.py"
    _write(path, _FILLED_AS_IT_RUNS)
    printed = [_printed([str(path), str(tmp_path / "store")]).split("\n")[:6] for _ in range(2)]
    kinds = ("Memo", "MemoThroughALocal", "MemoHandedOn", "MemoHandedOnOverLines", "Registers")
    kinds += ("RegistersAsItRuns",)
    assert printed[0] == [f"{kind} ran ran recalled" for kind in kinds]
    assert printed[1] == [f"{kind} recalled recalled recalled" for kind in kinds]


class MemoOfItsForward(Node):
    """Doubles, keeping what it computed in a dict its class holds, read into a local."""

    memo: ClassVar[dict[int, int]] = {}

    def forward(self, x: int, ctx: Any) -> int:
        memo = type(self).memo
        if x not in memo:
            memo[x] = 2 * x
        return memo[x]


def test_a_memo_a_forward_fills_is_its_state_for_graphs_built_after_one_is_gone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph built after the last one watching a memo its node's forward fills is gone
    (one built in a function, called again) recalls what was kept without drift; a change
    made to the memo while no graph watched it is still seen by the next graph."""
    monkeypatch.setattr(MemoOfItsForward, "memo", {})

    def once(x: int, strict: bool = False) -> tuple[int, str]:
        graph = Graph.somatize(MemoOfItsForward().named("h").frozen().cached())
        answer = graph.forward(x, store=store, strict=strict)
        assert graph.record is not None
        return answer, graph.record.outcome["h"]

    ran = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        for x in (1, 2, 1, 2):
            ran.append(once(x))
            gc.collect()
    assert ran == [(2, "ran"), (4, "ran"), (2, "recalled"), (4, "recalled")]
    MemoOfItsForward.memo[1] = 7
    gc.collect()
    assert once(1, strict=True) == (7, "ran")


_READS_MODULE_TABLES = """
from somatize import Node

SCALE = {"by": 2}
ORDER = [1]
_CACHE = {}


def _scaled(x):
    return x * SCALE["by"]


def _remembered(x):
    if x not in _CACHE:
        _CACHE[x] = 3 * x
    return _CACHE[x]


class ReadsTables(Node):
    def forward(self, x, ctx):
        return _scaled(x) * ORDER[0]


class FillsCache(Node):
    def forward(self, x, ctx):
        return _remembered(x)
"""


def test_a_table_of_its_module_a_node_only_reads_changed_in_place_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict or list of a node's module that its code, or a helper it names, only reads,
    changed in place after a graph was built (``SCALE["by"] = 3``), is other code at the
    next forward of that graph and of one built after: strict=True computes with what it
    holds now, never recalling the old answer. One the code fills as it runs (a cache) is
    its state: forwards recall it without drift."""
    loaded = _load(tmp_path / "fingerprinted.py", _READS_MODULE_TABLES, monkeypatch)
    graph = Graph.somatize(loaded.ReadsTables().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.SCALE["by"] = 3
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    loaded.ORDER[0] = 5
    assert _three_forwards(graph, store, "h", 15) == ["ran", "recalled", "recalled"]
    loaded.SCALE["by"] = 4
    after = Graph.somatize(loaded.ReadsTables().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 20) == ["ran", "recalled", "recalled"]
    cached = Graph.somatize(loaded.FillsCache().named("c").frozen().cached())
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(cached, store, "c", 3) == ["ran", "recalled", "recalled"]


def test_a_table_of_its_module_not_as_its_text_writes_it_is_named_by_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of a node's module that its code only reads, changed before the node is
    first fingerprinted (``SCALE["by"] = int(sys.argv[1])`` as a script starts), or bound
    to another name of its module (``ORDER = ORDERED``), is named by what it holds: two
    runs setting it otherwise never share a fingerprint, so one never recalls what the
    other computed — and one holding what the text writes keeps the text's."""
    aliased = _READS_MODULE_TABLES.replace("ORDER = [1]", "ORDERED = [1]\nORDER = ORDERED")

    def fingerprint(text: str, by: int) -> str:
        loaded = _load(tmp_path / "fingerprinted.py", text, monkeypatch)
        loaded.SCALE["by"] = by
        return fingerprint_of(loaded.ReadsTables)

    assert fingerprint(_READS_MODULE_TABLES, 2) == fingerprint(_READS_MODULE_TABLES, 2)
    assert fingerprint(_READS_MODULE_TABLES, 3) != fingerprint(_READS_MODULE_TABLES, 2)
    assert fingerprint(aliased, 2) == fingerprint(aliased, 2)
    edited = aliased.replace("ORDERED = [1]", "ORDERED = [5]")
    assert fingerprint(edited, 2) != fingerprint(aliased, 2)


_READS_AS_IT_STORES = """
from somatize import Node

SCALE = {"by": 2}


class Builds(Node):
    def forward(self, x, ctx):
        out = {}
        out["y"] = x * SCALE["by"]
        return out["y"]


class Memo(Node):
    _memo = {}

    def forward(self, x, ctx):
        self._memo[x] = x * SCALE["by"]
        return self._memo[x]
"""


@pytest.mark.parametrize("kind", ["Builds", "Memo"])
def test_a_table_read_on_a_line_that_sets_another_is_watched(
    kind: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table of a node's module its code only reads on a line that sets an item of
    another table (``out["y"] = x * SCALE["by"]``, ``self._memo[x] = x * SCALE["by"]``)
    is read, not filled: changed in place after a graph was built, strict=True computes
    with what it holds now, never recalling the old answer."""
    loaded = _load(tmp_path / "fingerprinted.py", _READS_AS_IT_STORES, monkeypatch)
    graph = Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())
    assert graph.forward(1, store=store, strict=True) == 2
    loaded.SCALE["by"] = 3
    assert graph.forward(1, store=store, strict=True) == 3


def test_a_helper_or_constant_rebound_is_seen_by_a_graph_built_before(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's cell run again rebinds a constant or a helper a node's code names, or
    a table it reads, after a graph was built: that graph's next forward computes with
    it under strict=True, never recalling the old answer — and a cell run again that
    binds what the text writes (an equal table, a helper written alike) is no drift."""
    loaded = _load(tmp_path / "fingerprinted.py", _HELPED, monkeypatch)
    const = Graph.somatize(loaded.UsesConst().named("c").frozen().cached())
    helped = Graph.somatize(loaded.UsesHelper().named("h").frozen().cached())
    was = fingerprint_of(loaded.UsesHelper)
    assert _three_forwards(const, store, "c", 7) == ["ran", "recalled", "recalled"]
    assert _three_forwards(helped, store, "h", 16) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded, "FACTOR", 6)
    assert _three_forwards(const, store, "c", 8) == ["ran", "recalled", "recalled"]
    exec("def _inner(x):\n    return x + OFFSET + 100\n", vars(loaded))
    assert _three_forwards(helped, store, "h", 216) == ["ran", "recalled", "recalled"]
    exec("def _inner(x):\n    return x + OFFSET\n", vars(loaded))
    assert _three_forwards(helped, store, "h", 16) == ["ran", "recalled", "recalled"]
    assert fingerprint_of(loaded.UsesHelper) == was
    tabled = _load(tmp_path / "tabled.py", _READS_MODULE_TABLES, monkeypatch)
    graph = Graph.somatize(tabled.ReadsTables().named("t").frozen().cached())
    assert _three_forwards(graph, store, "t", 2) == ["ran", "recalled", "recalled"]
    exec('SCALE = {"by": 2}', vars(tabled))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        assert _three_forwards(graph, store, "t", 2) == ["recalled"] * 3
    tabled.SCALE["by"] = 3
    assert _three_forwards(graph, store, "t", 3) == ["ran", "recalled", "recalled"]


_NAMES_A_HELPER_CLASS = """
from somatize import Node


class Helper:
    by = 2
    calls = 0

    @staticmethod
    def scale(x):
        Helper.calls += 1
        return x * Helper.by

    @classmethod
    def shift(cls, x):
        cls.calls += 1
        return x + cls.by - 2


class UsesHelperClass(Node):
    def forward(self, x, ctx):
        return Helper.shift(Helper.scale(x))
"""


def test_a_helper_class_given_another_value_or_method_is_seen_by_a_graph_built_before(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper class a node's code names (``Helper.scale(x)``), given another value
    (``Helper.by = 3``) or another method after a graph was built, is other code at that
    graph's next forward: strict=True computes with what it holds now, never recalling what
    it computed before. A count its own methods move on it as they run is its state: the
    forwards after the first recall."""
    loaded = _load(tmp_path / "fingerprinted.py", _NAMES_A_HELPER_CLASS, monkeypatch)
    graph = Graph.somatize(loaded.UsesHelperClass().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.Helper.by = 3
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]
    loaded.Helper.scale = staticmethod(lambda x: x * 5)
    assert _three_forwards(graph, store, "h", 6) == ["ran", "recalled", "recalled"]


@dataclasses.dataclass
class _Defaulted:
    """A config whose field has a default."""

    k: int = 2


_Pointed = collections.namedtuple("_Pointed", ["k"], defaults=(2,))


class BuildsDefaulted(Node):
    """Scales by a config it builds with its defaults."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * _Defaulted().k


class BuildsPointed(Node):
    """Scales by a named tuple it builds with its defaults."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * _Pointed().k


@pytest.mark.parametrize(
    ("kind", "made"),
    [(BuildsDefaulted, _Defaulted.__init__), (BuildsPointed, _Pointed.__new__)],
    ids=["dataclass", "namedtuple"],
)
def test_a_default_set_on_a_helper_s_made_constructor_is_seen(
    kind: type[Node], made: Any, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defaults of a constructor made for a helper class from a text of its own (a
    dataclass's ``__init__``, a named tuple's ``__new__``), set by hand after a graph was
    built (``Config.__init__.__defaults__ = (3,)``), are other code at that graph's next
    forward and at a graph built after: strict=True computes with them."""
    graph = Graph.somatize(kind().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(made, "__defaults__", (3,))
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    after = Graph.somatize(kind().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 3) == ["recalled"] * 3


_HOLDS_OBJECTS_READING_THEIR_MODULE = """
from somatize import Node

FACTOR = 2


class Knob:
    def __get__(self, obj, owner):
        return FACTOR


class Scale:
    def __call__(self, x):
        return x * FACTOR


class UsesKnob(Node):
    k = Knob()

    def forward(self, x, ctx):
        return x * self.k


class UsesScale(Node):
    act = Scale()

    def forward(self, x, ctx):
        return self.act(x)


class UsesScaleInDict(Node):
    acts = {"scale": Scale()}

    def forward(self, x, ctx):
        return self.acts["scale"](x)


class UsesScaleInList(Node):
    acts = [(Scale(),)]

    def forward(self, x, ctx):
        return self.acts[0][0](x)
"""


@pytest.mark.parametrize("kind", ["UsesKnob", "UsesScale", "UsesScaleInDict", "UsesScaleInList"])
def test_a_constant_the_class_of_an_object_a_class_holds_reads_rebound_is_seen(
    kind: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constant of its module that the class of an object a node's class holds reads (a
    descriptor's ``__get__``, a callable's ``__call__``: ``FACTOR``), itself or in a dict,
    list or tuple, rebound after a graph was built (a notebook's cell run again), is other
    code at that graph's next forward and at a graph built after: strict=True computes with
    it, never recalling what it computed before."""
    loaded = _load(tmp_path / "fingerprinted.py", _HOLDS_OBJECTS_READING_THEIR_MODULE, monkeypatch)
    graph = Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded, "FACTOR", 3)
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    after = Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 3) == ["recalled"] * 3


_HELPER_CLASS_HOLDING_TABLES = """
from somatize import Node


class Config:
    def __init__(self, k):
        self.k = k


class Registry:
    seen = []
    memo = {}
    table = {"k": 2}
    config = Config(1)

    @staticmethod
    def remember(x):
        Registry.memo[x] = x * 2
        return Registry.memo[x]


class UsesRegistry(Node):
    def forward(self, x, ctx):
        Registry.seen.append(x)
        return Registry.remember(x) * Registry.table["k"] * Registry.config.k // 2
"""


def test_a_table_or_object_a_helper_class_holds_changed_in_place_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict or an object a helper class a node's code names holds (``Registry.table``,
    ``Registry.config``), changed in place after a graph was built, is other code, for that
    graph and one built after: strict=True computes with what it holds now. What the
    node's forward adds to a list it holds (a log), and what the class's own code fills (a
    memo), is state: the forwards after the first recall, and a new process shares the
    fingerprint."""
    loaded = _load(tmp_path / "fingerprinted.py", _HELPER_CLASS_HOLDING_TABLES, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.UsesRegistry().named("h").frozen().cached())

    built = graph()
    assert _three_forwards(built, store, "h", 2) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 2) == ["recalled", "recalled", "recalled"]
    loaded.Registry.table["k"] = 3
    assert _three_forwards(built, store, "h", 3) == ["ran", "recalled", "recalled"]
    loaded.Registry.config.k = 2
    assert _three_forwards(built, store, "h", 6) == ["ran", "recalled", "recalled"]
    assert _three_forwards(graph(), store, "h", 6) == ["recalled", "recalled", "recalled"]
    _write(tmp_path / "registry.py", _HELPER_CLASS_HOLDING_TABLES)
    first = _fingerprints_in(tmp_path, "registry", "UsesRegistry")
    assert first == _fingerprints_in(tmp_path, "registry", "UsesRegistry")


_HOLDS_A_HELPER = """
from somatize import Node


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


SCALER = Scaler(2)


class UsesHelperObject(Node):
    def forward(self, x, ctx):
        return SCALER.apply(x)
"""


def test_an_object_of_a_helper_class_its_module_holds_is_in_a_node_s_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of a helper class of a node's module that the node's code names
    (``SCALER = Scaler(2)``, ``SCALER.apply(x)``) is in its fingerprint by its class's code
    and what it holds: a method of that class edited is another fingerprint, the same
    text loaded alike the same; one rebound to another made otherwise (a cell run again,
    ``SCALER = Scaler(3)``) is seen at the next forward of a graph built before."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _HOLDS_A_HELPER, monkeypatch).UsesHelperObject)
    edited = _load(path, _HOLDS_A_HELPER.replace("x * self.k", "x * self.k + 1"), monkeypatch)
    assert fingerprint_of(edited.UsesHelperObject) != was
    loaded = _load(path, _HOLDS_A_HELPER, monkeypatch)
    assert fingerprint_of(loaded.UsesHelperObject) == was
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    exec("SCALER = Scaler(3)", vars(loaded))
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


def test_an_object_of_a_helper_class_holding_what_no_name_says_is_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of a helper class of a node's module holding what no name says (a random
    generator beside its factor) is in the node's fingerprint by a mark of that very
    object, as one a class holds is: the same text with another factor, or loaded again
    alike, is never taken for it — never by its class's code alone, which would recall
    across processes what was computed with another factor."""
    locked = _HOLDS_A_HELPER.replace(
        "        self.k = k\n", "        self.k = k\n        self.draws = random.Random(k)\n"
    )
    locked = "import random\n" + locked
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, locked, monkeypatch).UsesHelperObject)
    other = _load(path, locked.replace("Scaler(2)", "Scaler(3)"), monkeypatch)
    assert fingerprint_of(other.UsesHelperObject) != was
    again = _load(path, locked, monkeypatch)
    assert fingerprint_of(again.UsesHelperObject) != was
    assert fingerprint_of(again.UsesHelperObject) == fingerprint_of(again.UsesHelperObject)


def test_a_constant_or_table_of_another_module_of_its_package_is_in_a_node_s_fingerprint(
    tmp_path: Path,
) -> None:
    """A constant or a table a node's module imports from another module of its package
    (``from proj.config import FACTOR, SCALE``), or names in such a module that defines no
    function (``config.OFFSET``), is in the node's fingerprint as that module's text writes
    it: the same in two fresh processes, another once that text gives it another value."""
    config = 'FACTOR = 2\nSCALE = {"by": 2}\nOFFSET = [1]\n'
    package = _package(
        tmp_path,
        "configured",
        config=config,
        nodes="""
        from somatize import Node
        from configured import config
        from configured.config import FACTOR, SCALE

        class UsesFactor(Node):
            def forward(self, x, ctx):
                return x * FACTOR

        class UsesScale(Node):
            def forward(self, x, ctx):
                return x * SCALE["by"]

        class UsesOffset(Node):
            def forward(self, x, ctx):
                return x + config.OFFSET[0]
        """,
    )

    def fingerprints() -> list[str]:
        kinds = ("UsesFactor", "UsesScale", "UsesOffset")
        return _fingerprints_in(tmp_path, "configured.nodes", *kinds)

    was = fingerprints()
    assert fingerprints() == was
    edits = [("FACTOR = 2", "FACTOR = 3"), ('"by": 2', '"by": 3'), ("[1]", "[5]")]
    for at, (old, new) in enumerate(edits):
        _write(package / "config.py", config.replace(old, new))
        now = fingerprints()
        assert [a == b for a, b in zip(now, was, strict=True)] == [i != at for i in range(3)]
    _write(package / "config.py", config)
    assert fingerprints() == was


_IMPORTED_ON = {
    "star": ("", "FACTOR = 2\n", "from imported.config import *"),
    "re-exported": ("from .config import FACTOR\n", "FACTOR = 2\n", "from imported import FACTOR"),
    "chained": ("", "from .base import FACTOR\n", "from imported.config import FACTOR"),
}


@pytest.mark.parametrize("how", sorted(_IMPORTED_ON))
def test_a_constant_imported_on_through_its_package_is_in_a_node_s_fingerprint(
    how: str, tmp_path: Path
) -> None:
    """A constant a node's module imports from another module of its package by way of
    a third (``from proj import FACTOR``, ``__init__`` importing it from ``proj.config``), or
    all of whose names it imports (``from proj.config import *``), is in the node's
    fingerprint as the text that assigns it writes it: the same in two new processes,
    another once that text gives it another value."""
    init, config, imports = _IMPORTED_ON[how]
    node = f"from somatize import Node\n{imports}\n\nclass Uses(Node):\n"
    node += "    def forward(self, x, ctx):\n        return x * FACTOR\n"
    modules = {"__init__": init, "config": config, "base": "FACTOR = 2\n", "nodes": node}
    package = _package(tmp_path, "imported", **modules)
    was = _fingerprints_in(tmp_path, "imported.nodes", "Uses")
    assert _fingerprints_in(tmp_path, "imported.nodes", "Uses") == was
    where = "base.py" if how == "chained" else "config.py"
    _write(package / where, "FACTOR = 3\n")
    assert _fingerprints_in(tmp_path, "imported.nodes", "Uses") != was


_IMPORTS_A_CONSTANT = """
from math import tau as TURN

from somatize import Node


class Turns(Node):
    def forward(self, x, ctx):
        return x * TURN
"""


def test_a_constant_no_text_of_its_package_assigns_is_named_by_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain constant a node's code reads that no text of its package assigns (imported
    from another package, or put over the imported one by a test's monkeypatch) is named
    by what it holds: each value another fingerprint, never left out — which would give
    runs patching in other values one fingerprint, and recall one's answer for another."""
    loaded = _load(tmp_path / "fingerprinted.py", _IMPORTS_A_CONSTANT, monkeypatch)
    found = set()
    for turn in (math.tau, 2.0, 3.0):
        monkeypatch.setattr(loaded, "TURN", turn)
        found.add(fingerprint_of(loaded.Turns))
    assert len(found) == 3
    monkeypatch.setattr(loaded, "TURN", 2.0)
    assert fingerprint_of(loaded.Turns) in found


_TYPED_IN = """
from somatize import Node
from somatize.catalog import fingerprint_of

FACTOR = 2
SCALE = {"by": 2}


class Typed(Node):
    def forward(self, x, ctx):
        return x * FACTOR * SCALE["by"]


print(fingerprint_of(Typed))
"""


def test_a_constant_or_table_of_a_module_with_no_source_file_is_named_by_what_it_holds() -> None:
    """A constant or a table of plain values of a module whose text is not at hand (a
    script given to ``python -c``) that a node's code reads is named by what it holds: the
    same in two new processes, another where it holds another value — never left out,
    which would recall what was computed with the old value."""
    was = _printed(["-c", _TYPED_IN]).strip()
    assert was.startswith("sha256:")
    assert _printed(["-c", _TYPED_IN]).strip() == was
    for old, new in (("FACTOR = 2", "FACTOR = 3"), ('"by": 2', '"by": 3')):
        assert _printed(["-c", _TYPED_IN.replace(old, new)]).strip() != was, new


class _Busy(Node):
    """A node whose class another thread gives names and takes them back as it is read."""

    table: ClassVar[dict[str, int]] = {"by": 2}

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.table["by"]


def test_a_class_changed_on_another_thread_as_it_is_fingerprinted_is_read_whole() -> None:
    """A node's class given names and rid of them on another thread (a model traced there,
    whose trace sets and takes back methods on its classes) while its fingerprint is worked
    out, and its watch made and read, is read as it was at one moment: no error that its
    namespace changed as it was read."""
    stop = threading.Event()

    def churn() -> None:
        for step in itertools.count():
            if stop.is_set():
                return
            setattr(_Busy, f"extra{step % 40}", step)
            if step % 2:
                delattr(_Busy, f"extra{(step - 1) % 40}")

    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the other thread the interpreter as often as can be
    other = threading.Thread(target=churn)
    other.start()
    try:
        for _ in range(60):
            fingerprint_of(_Busy)
            catalog.code_changes(catalog.watch_code([_Busy]))
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(was)
        for name in [n for n in vars(_Busy) if n.startswith("extra")]:
            delattr(_Busy, name)


class _Memoizing(Node):
    """Doubles, keeping what it computed in a dict its class holds."""

    _memo: ClassVar[dict[int, int]] = {}

    def forward(self, x: int, ctx: Any) -> int:
        self._memo[x] = 2 * x
        return self._memo[x]

    def clear(self) -> None:
        self._memo.clear()


def test_a_class_s_code_is_read_for_the_tables_it_fills_once_however_many_graphs_use_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which tables a node's class fills is read from its functions' instructions once,
    not again at every graph built with it and every forward of such a graph: building a
    graph costs no more than looking up what was read."""
    read: list[Any] = []
    reads = _defined("_tables_changed_by")

    def counted(code: Any, *rest: Any) -> set[str]:
        read.append(code)
        return reads(code, *rest)

    _patch_everywhere(monkeypatch, "_tables_changed_by", counted)
    for _ in range(5):
        graph = Graph.somatize(_Memoizing().named("m").frozen().cached())
        assert graph.forward(3, store=store) == 6
    assert len(read) <= 2  # `forward` and `clear`, once each


_REGISTERS_ON_ASKING = """
from somatize import Node


class Scaled(Node):
    _scales = {}
    _made = {"n": 0}

    def __init__(self):
        self._count()

    def _count(self):
        self._made["n"] += 1

    @classmethod
    def register(cls, name, k):
        cls._scales[name] = k

    def forward(self, x, ctx):
        return x * self._scales["a"]
"""


def test_a_table_a_class_s_other_methods_fill_when_asked_is_watched(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table a node's class fills in a method its user calls (``Scaled.register("a",
    3)``), not as a node is made, is named by what it holds where that is not what its
    text writes, and watched: two runs registering other values never share a
    fingerprint, and one registered again after a graph was built is seen at its next
    forward under strict=True. One filled as a node is made (a count, in ``__init__`` or a
    method it calls) stays its state."""
    path = tmp_path / "fingerprinted.py"

    def registered(k: int) -> Any:
        loaded = _load(path, _REGISTERS_ON_ASKING, monkeypatch)
        loaded.Scaled.register("a", k)
        return loaded.Scaled

    assert fingerprint_of(registered(2)) == fingerprint_of(registered(2))
    assert fingerprint_of(registered(3)) != fingerprint_of(registered(2))
    scaled = registered(2)
    graph = Graph.somatize(scaled().named("s").frozen().cached())
    assert _three_forwards(graph, store, "s", 2) == ["ran", "recalled", "recalled"]
    scaled.register("a", 7)
    assert graph.forward(1, store=store, strict=True) == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        again = Graph.somatize(scaled().named("s").frozen().cached())
        assert _three_forwards(again, store, "s", 7) == ["recalled"] * 3


@pytest.mark.parametrize("text", ["plain", "locked"])
def test_an_object_of_a_helper_class_its_module_holds_changed_in_place_is_seen(
    text: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of a helper class a node's module holds, changed in place after a graph
    was built (``SCALER.k = 3``, a notebook's cell), and again, is other code at the next
    forward of that graph each time: strict=True computes with what it holds now, never
    recalling the old answer — as for an object a class holds; one holding a lock, a
    logger and a pattern too, whose pattern replaced is seen as well."""
    written = _HOLDS_A_HELPER if text == "plain" else _HOLDS_A_LOCKED_HELPER
    loaded = _load(tmp_path / "fingerprinted.py", written, monkeypatch)
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.SCALER.k = 3
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    loaded.SCALER.k = 4
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]
    if text == "locked":
        loaded.SCALER.pattern = re.compile("1")
        assert _three_forwards(graph, store, "h", 1) == ["ran", "recalled", "recalled"]


_HOLDS_A_CODEC = """
from somatize import Node
from somatize.data.codec import ArrowCodec

CODEC = ArrowCodec()

class Encodes(Node):
    def forward(self, x, ctx):
        return CODEC.name + str(x)
"""


def test_an_object_of_somatizes_own_a_module_holds_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """An object of one of somatize's own classes a node's module holds (a codec, as the
    data sources hold one) is named by its class's code: the same in every new process,
    so a worker in another process builds the node rather than taking it for other code.
    A mark of that very object would differ from one process to the next."""
    _write(tmp_path / "codec_node.py", _HOLDS_A_CODEC)
    script = (
        "from somatize.catalog import fingerprint_of as f\n"
        "from somatize.data.parquet import Parquet\n"
        "from somatize.data.parquet_dir import ParquetDir\n"
        "from somatize.data.sources import Table\n"
        "import codec_node\n"
        "print(f(Parquet), f(ParquetDir), f(Table), f(codec_node.Encodes))\n"
    )
    first = _printed(["-c", script], tmp_path).split()
    second = _printed(["-c", script], tmp_path).split()
    assert len(first) == 4
    assert first == second


_HOLDS_A_LOCKED_HELPER = """
import logging
import re
import sys
import threading

from somatize import Node


class Scaler:
    def __init__(self, k, pattern="a", logger="scaler"):
        self.k = k
        self.lock = threading.Lock()
        self.log = logging.getLogger(logger)
        self.sink = sys.__stderr__
        self.pattern = re.compile(pattern)

    def apply(self, x):
        with self.lock:
            return x * self.k if self.pattern.match(str(x)) is None else x


SCALER = Scaler(2)


class UsesHelperObject(Node):
    def forward(self, x, ctx):
        return SCALER.apply(x)
"""


def test_an_object_of_a_helper_class_holding_a_lock_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """An object of a helper class a node's module holds (``SCALER = Scaler(2)``) holding
    a lock, a logger, ``sys.stderr`` and a compiled pattern beside its factor is named by
    its class's code and what it holds, those by what the code computes with them depends
    on (a lock by its type, a logger by its name, a pattern by its text): the same in two
    new processes, so answers are recalled by the next run and a worker builds the node.
    Another factor, pattern or logger, or the class's code edited, is another
    fingerprint."""
    variants = {
        "same": _HOLDS_A_LOCKED_HELPER,
        "factor": _HOLDS_A_LOCKED_HELPER.replace("Scaler(2)", "Scaler(3)"),
        "pattern": _HOLDS_A_LOCKED_HELPER.replace("Scaler(2)", 'Scaler(2, pattern="b")'),
        "logger": _HOLDS_A_LOCKED_HELPER.replace("Scaler(2)", 'Scaler(2, logger="other")'),
        "edited": _HOLDS_A_LOCKED_HELPER.replace("x * self.k", "x * self.k + 1"),
    }
    for name, text in variants.items():  # one module, written otherwise in each folder
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "locked.py", text)
    # One new process for the module as written; a second for it again and then for each
    # variant in turn, each against the first's, so every comparison crosses processes.
    kinds = ["UsesHelperObject"]
    (first,) = _fingerprints_of_elsewhere(tmp_path, ["same"], kinds, "locked")
    again, *others = _fingerprints_of_elsewhere(tmp_path, list(variants), kinds, "locked")
    assert len(first) == len(kinds)
    assert again == first
    found = [found for (found,) in [first, *others]]
    assert len(set(found)) == len(found)


_HOLDS_A_SETTING = """
import logging
import re

from somatize import Node


class Setting:
    def __init__(self, k):
        self.k = k


class Configured(Node):
    setting = Setting(2)
    log = logging.getLogger("configured")
    pattern = re.compile("a")

    def forward(self, x, ctx):
        return x * self.setting.k
"""


def test_an_object_a_class_holds_that_runs_no_code_is_in_its_fingerprint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a node's class holds that is not callable (``setting = Setting(2)``, a
    pattern) is in its fingerprint by its class and what it holds: the text edited to
    ``Setting(3)`` or another pattern is another fingerprint — never the old answer
    recalled —, the same text loaded again the same, and alike in a new process; set in
    place after a graph was built (``Configured.setting.k = 4``), it is seen at the next
    forward."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _HOLDS_A_SETTING, monkeypatch).Configured)
    for edit in ("Setting(3)", 're.compile("b")'):
        made = "Setting(2)" if edit.startswith("Setting") else 're.compile("a")'
        edited = _load(path, _HOLDS_A_SETTING.replace(made, edit), monkeypatch)
        assert fingerprint_of(edited.Configured) != was, edit
    loaded = _load(path, _HOLDS_A_SETTING, monkeypatch)
    assert fingerprint_of(loaded.Configured) == was
    _write(tmp_path / "configured.py", _HOLDS_A_SETTING)
    first = _fingerprints_in(tmp_path, "configured", "Configured")
    assert first == _fingerprints_in(tmp_path, "configured", "Configured")
    graph = Graph.somatize(loaded.Configured().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.Configured.setting.k = 4
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]


_HOLDS_A_CLASS = """
from somatize import Node


class Double:
    def __call__(self, x):
        return x * 2


class Triple:
    def __call__(self, x):
        return x * 3


class Makes(Node):
    make = Double

    def forward(self, x, ctx):
        return self.make()(x)
"""


def test_a_class_a_node_s_class_holds_is_in_its_fingerprint_by_its_code(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class a node's class holds (``make = Double``) is in its fingerprint by its name and
    how it is written: another class held, or the held class's method edited, is another
    fingerprint — never the old answer recalled —, the same text loaded again the same,
    and alike in a new process; another class set on it after a graph was built is seen
    at the next forward."""
    path = tmp_path / "fingerprinted.py"
    was = fingerprint_of(_load(path, _HOLDS_A_CLASS, monkeypatch).Makes)
    for made, edit in (("make = Double", "make = Triple"), ("x * 2", "x * 5")):
        edited = _load(path, _HOLDS_A_CLASS.replace(made, edit), monkeypatch)
        assert fingerprint_of(edited.Makes) != was, edit
    loaded = _load(path, _HOLDS_A_CLASS, monkeypatch)
    assert fingerprint_of(loaded.Makes) == was
    _write(tmp_path / "makes.py", _HOLDS_A_CLASS)
    first = _fingerprints_in(tmp_path, "makes", "Makes")
    assert first == _fingerprints_in(tmp_path, "makes", "Makes")
    graph = Graph.somatize(loaded.Makes().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded.Makes, "make", loaded.Triple)
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


def test_a_class_a_node_s_class_holds_given_another_method_is_seen_by_a_graph_built_before(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class a node's class holds (``make = Double``), given another method in place after a
    graph was built (``Double.__call__ = ...``), is other code at that graph's next forward:
    strict=True computes with it, never recalling what the old method computed."""
    loaded = _load(tmp_path / "fingerprinted.py", _HOLDS_A_CLASS, monkeypatch)
    graph = Graph.somatize(loaded.Makes().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded.Double, "__call__", lambda self, x: x * 5)
    assert _three_forwards(graph, store, "h", 5) == ["ran", "recalled", "recalled"]


_HOLDS_AN_ENUM = """
import enum

from somatize import Node


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


class Scaler:
    def __init__(self, mode):
        self.mode = mode

    def apply(self, x):
        return x * self.mode.value


MODE = Mode.FAST
SCALER = Scaler(Mode.FAST)


class ReadsModule(Node):
    def forward(self, x, ctx):
        return x * MODE.value


class ReadsHelper(Node):
    def forward(self, x, ctx):
        return SCALER.apply(x)


class HoldsMode(Node):
    mode = Mode.FAST

    def forward(self, x, ctx):
        return x * self.mode.value


class ReadsClass(Node):
    def forward(self, x, ctx):
        return x * Mode.FAST.value
"""


def test_an_enum_member_is_named_by_its_class_s_code_and_name_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """A member of an enum of a node's module, read as a module's constant (``MODE =
    Mode.FAST``), held by a helper object or by the node's class, or named in its code
    (``Mode.FAST.value``), is named by its enum's code, with each member's value, and its
    name: the same in two new processes, so answers are recalled by the next run; another
    member, or another value written for it (``FAST = 3``), is another fingerprint."""
    kinds = ["ReadsModule", "ReadsHelper", "HoldsMode", "ReadsClass"]
    variants = {
        "same": _HOLDS_AN_ENUM,
        "member": _HOLDS_AN_ENUM.replace("= Mode.FAST", "= Mode.SLOW").replace(
            "(Mode.FAST)", "(Mode.SLOW)"
        ),
        "value": _HOLDS_AN_ENUM.replace("FAST = 1", "FAST = 3"),
    }
    for name, text in variants.items():  # one module, written otherwise in each folder
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "modes.py", text)
    # One new process for the module as written; a second for it again and then for each
    # variant in turn, each against the first's, so every comparison crosses processes.
    (first,) = _fingerprints_of_elsewhere(tmp_path, ["same"], kinds, "modes")
    again, *others = _fingerprints_of_elsewhere(tmp_path, list(variants), kinds, "modes")
    printed = {"same": first, **dict(zip(list(variants)[1:], others, strict=True))}
    assert len(printed["same"]) == len(kinds)
    assert again == printed["same"]
    for kind, same, value in zip(kinds, printed["same"], printed["value"], strict=True):
        assert same != value, kind
    for kind, same, member in zip(
        kinds[:3], printed["same"][:3], printed["member"][:3], strict=True
    ):
        assert same != member, kind


@pytest.mark.parametrize("kind", ["ReadsModule", "ReadsHelper", "HoldsMode", "ReadsClass"])
def test_an_enum_member_s_value_set_in_place_is_seen_by_a_graph_built_before(
    kind: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value of a member of an enum a node's code reads, set in place after a graph was
    built (``Mode.FAST._value_ = 3``), is other code at that graph's next forward and at a
    graph built after: strict=True computes with it."""
    loaded = _load(tmp_path / "fingerprinted.py", _HOLDS_AN_ENUM, monkeypatch)
    graph = Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 1) == ["ran", "recalled", "recalled"]
    monkeypatch.setattr(loaded.Mode.FAST, "_value_", 3)
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    after = Graph.somatize(getattr(loaded, kind)().named("h").frozen().cached())
    assert _three_forwards(after, store, "h", 3) == ["recalled"] * 3


_READS_A_TABLE_OF_FUNCTIONS = """
from somatize import Node


def double(x):
    return x * 2


def triple(x):
    return x * 3


OPS = {"op": double}
STEPS = [double]


class Dispatches(Node):
    def forward(self, x, ctx):
        return OPS["op"](x)


class Steps(Node):
    def forward(self, x, ctx):
        return STEPS[0](x)
"""


def test_a_table_of_functions_a_node_s_code_reads_is_named_by_those_functions(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dict or list of its module's functions a node's code reads (``OPS["op"](x)``, a
    dispatch table) is in its fingerprint by how those functions are written: one of them
    edited is another fingerprint — never the old answer recalled —, the same text loaded
    again the same, alike in a new process; another function set in it after a graph was
    built is seen at the next forward."""
    path = tmp_path / "fingerprinted.py"
    kinds = ("Dispatches", "Steps")
    first = _load(path, _READS_A_TABLE_OF_FUNCTIONS, monkeypatch)
    was = [fingerprint_of(getattr(first, kind)) for kind in kinds]
    edited = _load(path, _READS_A_TABLE_OF_FUNCTIONS.replace("x * 2", "x * 5"), monkeypatch)
    for kind, before in zip(kinds, was, strict=True):
        assert fingerprint_of(getattr(edited, kind)) != before, kind
    loaded = _load(path, _READS_A_TABLE_OF_FUNCTIONS, monkeypatch)
    assert [fingerprint_of(getattr(loaded, kind)) for kind in kinds] == was
    _write(tmp_path / "dispatches.py", _READS_A_TABLE_OF_FUNCTIONS)
    printed = _fingerprints_in(tmp_path, "dispatches", *kinds)
    assert printed == _fingerprints_in(tmp_path, "dispatches", *kinds)
    graph = Graph.somatize(loaded.Dispatches().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.OPS["op"] = loaded.triple
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


_READS_OBJECTS_FROM_ELSEWHERE = """
import decimal
import re

import torch
from otherlib import Lib

from somatize import Node

PATTERN = re.compile("a")
DTYPE = torch.float32
RATE = decimal.Decimal("1.5")
SCALER = Lib(2)


class Matches(Node):
    def forward(self, x, ctx):
        return PATTERN.match(x) is not None


class Casts(Node):
    def forward(self, x, ctx):
        return torch.tensor(x).to(DTYPE).dtype


class Rates(Node):
    def forward(self, x, ctx):
        return x * RATE


class Scales(Node):
    def forward(self, x, ctx):
        return SCALER.k * x
"""


def test_an_object_of_another_package_its_module_holds_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """An object of the standard library's, torch's or another package's that a node's
    module holds and its code reads (``PATTERN = re.compile("a")``, ``DTYPE =
    torch.float32``, ``SCALER = Lib(2)``) is in its fingerprint by what says it (a pattern
    by its text, a dtype by its name), else as the module's text writes it: another
    pattern, dtype, rate or argument written is another fingerprint — never the old answer
    recalled —, the same text alike in two new processes."""
    kinds = ["Matches", "Casts", "Rates", "Scales"]
    edits = {
        "same": ("", ""),
        "pattern": ('re.compile("a")', 're.compile("b")'),
        "dtype": ("torch.float32", "torch.float64"),
        "rate": ('Decimal("1.5")', 'Decimal("2.5")'),
        "scaler": ("Lib(2)", "Lib(3)"),
    }
    library = tmp_path / "otherlib"
    library.mkdir()
    _write(library / "__init__.py", "class Lib:\n    def __init__(self, k):\n        self.k = k\n")
    for name, (was, now) in edits.items():  # one module, written otherwise in each folder
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "elsewhere.py", _READS_OBJECTS_FROM_ELSEWHERE.replace(was, now))
    # One new process for the module as written; a second for it again and then for each
    # edit in turn, each against the first's, so every comparison crosses processes.
    printed = {"same": _fingerprints_of_elsewhere(tmp_path, ["same"], kinds)[0]}
    again, *edited = _fingerprints_of_elsewhere(tmp_path, list(edits), kinds)
    printed.update(zip(list(edits)[1:], edited, strict=True))
    assert len(printed["same"]) == len(kinds)
    assert again == printed["same"]
    for at, (name, kind) in enumerate(zip(list(edits)[1:], kinds, strict=True)):
        assert printed[name][at] != printed["same"][at], kind
        others = [i for i in range(len(kinds)) if i != at]
        assert [printed[name][i] for i in others] == [printed["same"][i] for i in others]


_READS_A_LOADED_ARRAY = """
import pathlib

import numpy as np

from somatize import Node

MEANS = np.load(pathlib.Path(__file__).with_name("means.npy"))


class Centers(Node):
    def forward(self, x, ctx):
        return x - MEANS
"""


def test_an_array_its_module_loads_is_named_by_its_values_in_every_process(
    tmp_path: Path,
) -> None:
    """An array a node's module loads from a file (``MEANS = np.load(...)``) that its code
    reads is in its fingerprint by its values, as one its class holds is, not by the text
    that loads it: another file loaded by the same text is another fingerprint in a new
    process — never the answer computed with the old values recalled as its own —, the
    same values alike in two."""
    numpy = pytest.importorskip("numpy")
    (tmp_path / "elsewhere.py").write_text(_READS_A_LOADED_ARRAY)
    numpy.save(tmp_path / "means.npy", numpy.ones(3))
    first = _fingerprints_in(tmp_path, "elsewhere", "Centers")
    assert _fingerprints_in(tmp_path, "elsewhere", "Centers") == first
    numpy.save(tmp_path / "means.npy", numpy.full(3, 5.0))
    assert _fingerprints_in(tmp_path, "elsewhere", "Centers") != first


_READS_TENSORS_NOT_ONE_RUN_OF_BYTES = """
import warnings

import torch

from somatize import Node

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # nested and sparse tensors say they are not stable yet
    NESTED = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    SPARSE = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,))


class Sums(Node):
    def forward(self, x, ctx):
        return x + float(NESTED.unbind()[1].sum()) + float(SPARSE.to_dense().sum())
"""


def test_a_tensor_whose_values_are_not_one_run_of_bytes_is_read_by_a_node_s_code(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nested or sparse tensor a node's module holds and its code reads is not named by
    its values as a dense one is (they are not one run of bytes): the graph is built, and
    the node computes, then recalls (building the graph failed on a nested tensor)."""
    loaded = _load(tmp_path / "elsewhere.py", _READS_TENSORS_NOT_ONE_RUN_OF_BYTES, monkeypatch)
    graph = Graph.somatize(loaded.Sums().named("s").frozen().cached())
    assert graph.forward(1.0, store=store) == 7.0
    seen: list[dict[str, Any]] = []
    assert graph.forward(1.0, store=store, watching=seen.append) == 7.0
    assert [fact["fact"] for fact in seen] == ["recalled", "finished"]


def test_an_array_its_module_holds_changed_in_place_is_seen_by_a_graph_built_after(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An array a node's module holds and its code reads, written in place after a graph was
    built (``MEANS[:] = ...``), is seen by a graph built after, as one its class holds is:
    strict=True computes with the values it holds now, never recalling the old answer."""
    numpy = pytest.importorskip("numpy")
    numpy.save(tmp_path / "means.npy", numpy.ones(3))
    text = _READS_A_LOADED_ARRAY.replace("x - MEANS", "x + float(MEANS.sum())")
    loaded = _load(tmp_path / "elsewhere.py", text, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.Centers().named("c").frozen().cached())

    assert graph().forward(1.0, store=store) == 4.0
    loaded.MEANS[:] = 5.0
    assert graph().forward(1.0, store=store, strict=True) == 16.0


_READS_ARRAYS = """
import numpy as np

from somatize import Node

MEANS = np.array([1.0, 2.0, 3.0])
WIDE = np.ones(1 << 20)
WIDE[:3] = MEANS
SCALES = np.array([1.0, 2.0, 3.0])


def total(x):
    return x + float(SCALES.sum())


class ReadsGlobal(Node):
    def forward(self, x, ctx):
        return x + float(MEANS.sum())


class ReadsWide(Node):
    def forward(self, x, ctx):
        return x + float(WIDE[:3].sum())


class ReadsOwn(Node):
    means = np.array([1.0, 2.0, 3.0])

    def forward(self, x, ctx):
        return x + float(self.means.sum())


class CallsHelper(Node):
    def forward(self, x, ctx):
        return total(x)
"""


_READS_HELD_ARRAYS = """
import numpy as np

from somatize import Node

TABLE = {"m": np.array([1.0, 2.0, 3.0])}
LISTED = [np.array([1.0, 2.0, 3.0])]
NESTED = {"a": [(np.array([1.0, 2.0, 3.0]),)]}
SCALES = {"m": np.array([1.0, 2.0, 3.0])}


def total(x):
    return x + float(SCALES["m"].sum())


class ReadsTable(Node):
    def forward(self, x, ctx):
        return x + float(TABLE["m"].sum())


class ReadsList(Node):
    def forward(self, x, ctx):
        return x + float(LISTED[0].sum())


class ReadsNested(Node):
    def forward(self, x, ctx):
        return x + float(NESTED["a"][0][0].sum())


class OwnsTable(Node):
    table = {"m": np.array([1.0, 2.0, 3.0])}

    def forward(self, x, ctx):
        return x + float(self.table["m"].sum())


class CallsHelper(Node):
    def forward(self, x, ctx):
        return total(x)
"""


_HELD_ARRAYS = [
    ("ReadsTable", lambda m: m.TABLE["m"]),
    ("ReadsList", lambda m: m.LISTED[0]),
    ("ReadsNested", lambda m: m.NESTED["a"][0][0]),  # in a tuple, in a list, in a dict
    ("OwnsTable", lambda m: m.OwnsTable.table["m"]),
    ("CallsHelper", lambda m: m.SCALES["m"]),
]


@pytest.mark.parametrize(("kind", "held"), _HELD_ARRAYS)
def test_an_array_in_a_table_a_node_s_code_reads_is_named_by_its_values(
    kind: str,
    held: Callable[[Any], Any],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A numpy array held in a dict, list or tuple a node's code reads is in its fingerprint
    by its values, not as the text writes it: written in place, a graph built after (as a
    new process would) computes with what it holds now, never recalling the old answer, and
    given back what it held, its fingerprint is the old one again."""
    pytest.importorskip("numpy")
    loaded = _load(tmp_path / "tables.py", _READS_HELD_ARRAYS, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(getattr(loaded, kind)().named("a").frozen().cached())

    before = fingerprint_of(getattr(loaded, kind))
    assert graph().forward(1.0, store=store) == 7.0
    held(loaded)[0] = 5.0
    assert fingerprint_of(getattr(loaded, kind)) != before
    assert graph().forward(1.0, store=store, strict=True) == 11.0
    held(loaded)[0] = 1.0
    assert fingerprint_of(getattr(loaded, kind)) == before
    assert graph().forward(1.0, store=store, strict=True) == 7.0


_READS_TENSORS = """
import torch

from somatize import Node

T = torch.tensor([1.0, 2.0, 3.0])
TABLE = {"t": [torch.tensor([1.0, 2.0, 3.0])]}


class ReadsTensor(Node):
    def forward(self, x, ctx):
        return x + float(T.sum())


class ReadsTable(Node):
    def forward(self, x, ctx):
        return x + float(TABLE["t"][0].sum())


class OwnsTensor(Node):
    t = torch.tensor([1.0, 2.0, 3.0])

    def forward(self, x, ctx):
        return x + float(self.t.sum())
"""


_HELPER_HOLDS_AN_ARRAY = """
import numpy as np

from somatize import Node


class Config:
    means = np.array([1.0, 2.0, 3.0])


class ReadsConfig(Node):
    def forward(self, x, ctx):
        return x + float(Config.means.sum())
"""


_AN_OBJECT_HOLDS_AN_ARRAY = """
import numpy as np

from somatize import Node


class Holder:
    def __init__(self):
        self.m = np.array([1.0, 2.0, 3.0])


class Outer:
    def __init__(self):
        self.inner = Holder()
        self.tables = {"m": [np.array([1.0, 2.0, 3.0])]}


H = Holder()
O = Outer()


class HoldsHolder(Node):
    s = Holder()

    def forward(self, x, ctx):
        return x + float(self.s.m.sum())


class ReadsHolder(Node):
    def forward(self, x, ctx):
        return x + float(H.m.sum())


class ReadsOuter(Node):
    def forward(self, x, ctx):
        return x + float(O.inner.m.sum())


class ReadsOuterTable(Node):
    def forward(self, x, ctx):
        return x + float(O.tables["m"][0].sum())
"""


_WRITTEN_IN_PLACE = [
    pytest.param("numpy", _READS_ARRAYS, kind, held, id=f"array-{kind}")
    for kind, held in [
        ("ReadsGlobal", lambda m: m.MEANS),
        ("ReadsWide", lambda m: m.WIDE),  # beyond the size compared by a copy
        ("ReadsOwn", lambda m: m.ReadsOwn.means),
        ("CallsHelper", lambda m: m.SCALES),
    ]
]
_WRITTEN_IN_PLACE += [
    pytest.param("numpy", _READS_HELD_ARRAYS, kind, held, id=f"held-array-{kind}")
    for kind, held in _HELD_ARRAYS
]
_WRITTEN_IN_PLACE += [
    pytest.param("torch", _READS_TENSORS, kind, held, id=f"tensor-{kind}")
    for kind, held in [
        ("ReadsTensor", lambda m: m.T),
        ("ReadsTable", lambda m: m.TABLE["t"][0]),
        ("OwnsTensor", lambda m: m.OwnsTensor.t),
    ]
]
_WRITTEN_IN_PLACE += [  # past the tensor's count of changes in place: `T.data[0] = 5.0`
    pytest.param("torch", _READS_TENSORS, kind, held, id=f"tensor-{kind}-{past}")
    for kind, past, held in [
        ("ReadsTensor", "data", lambda m: m.T.data),
        ("ReadsTensor", "numpy", lambda m: m.T.numpy()),
        ("ReadsTable", "data", lambda m: m.TABLE["t"][0].data),
        ("ReadsTable", "numpy", lambda m: m.TABLE["t"][0].numpy()),
        ("OwnsTensor", "data", lambda m: m.OwnsTensor.t.data),
        ("OwnsTensor", "numpy", lambda m: m.OwnsTensor.t.numpy()),
    ]
]
_WRITTEN_IN_PLACE += [
    pytest.param("numpy", _AN_OBJECT_HOLDS_AN_ARRAY, kind, held, id=f"held-by-an-object-{kind}")
    for kind, held in [
        ("HoldsHolder", lambda m: m.HoldsHolder.s.m),
        ("ReadsHolder", lambda m: m.H.m),
        ("ReadsOuter", lambda m: m.O.inner.m),  # an object an object holds
        ("ReadsOuterTable", lambda m: m.O.tables["m"][0]),  # in a table an object holds
    ]
]
_WRITTEN_IN_PLACE += [
    pytest.param(
        "numpy", _HELPER_HOLDS_AN_ARRAY, "ReadsConfig", lambda m: m.Config.means, id="helper-class"
    )
]


@pytest.mark.parametrize(("needs", "source", "kind", "held"), _WRITTEN_IN_PLACE)
def test_an_array_a_node_s_code_reads_changed_in_place_is_seen_by_a_graph_built_before(
    needs: str,
    source: str,
    kind: str,
    held: Callable[[Any], Any],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A numpy array a node's code reads — its module's (``MEANS[0] = 5.0``, a large one
    too), its class's, one a helper it calls reads, one a helper class it names holds
    (``Config.means``), one an object its class or module holds (``H.m[0] = 5.0``), or one
    held in a dict, list or tuple of those, however nested (``TABLE["m"][0] = 5.0``) — and
    a torch tensor its module or class holds, itself or in a table (``T[0] = 5.0``, and
    past its count of changes in place: ``T.data[0] = 5.0``, ``T.numpy()[0] = 5.0``),
    written in place after a graph was built, is other code at that graph's next forward:
    without strict the old answer is recalled as drifted, with strict=True the node computes
    with what it holds now (11.0), and given back what it held, with that again (7.0)."""
    pytest.importorskip(needs)
    loaded = _load(tmp_path / "written.py", source, monkeypatch)
    graph = Graph.somatize(getattr(loaded, kind)().named("a").frozen().cached())
    values = held(loaded)
    assert _three_forwards(graph, store, "a", 7.0) == ["ran", "recalled", "recalled"]
    values[0] = 5.0
    with pytest.warns(Drifted, match="another version of"):
        assert graph.forward(1, store=store) == 7.0
    assert _three_forwards(graph, store, "a", 11.0) == ["ran", "recalled", "recalled"]
    values[0] = 1.0
    assert _three_forwards(graph, store, "a", 7.0) == ["ran", "recalled", "recalled"]


@pytest.mark.parametrize(("needs", "source", "kind", "held"), _WRITTEN_IN_PLACE)
def test_an_array_a_node_s_code_reads_changed_in_place_is_seen_by_a_graph_built_after(
    needs: str,
    source: str,
    kind: str,
    held: Callable[[Any], Any],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each array and tensor of the test above, written in place after a graph was built,
    is seen by a graph built after it too (as in a new process): strict=True computes with
    what it holds now (11.0), and given back what it held, with that again (7.0)."""
    pytest.importorskip(needs)
    loaded = _load(tmp_path / "written.py", source, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(getattr(loaded, kind)().named("a").frozen().cached())

    values = held(loaded)
    assert _three_forwards(graph(), store, "a", 7.0) == ["ran", "recalled", "recalled"]
    values[0] = 5.0
    assert _three_forwards(graph(), store, "a", 11.0) == ["ran", "recalled", "recalled"]
    values[0] = 1.0
    assert _three_forwards(graph(), store, "a", 7.0) == ["ran", "recalled", "recalled"]


def test_a_tensor_a_node_s_code_reads_is_named_alike_where_torch_has_no_numpy(
    tmp_path: Path,
) -> None:
    """torch installed on its own needs no numpy. A tensor a node's module or class holds,
    itself or in a table, is named by its values there as where numpy is: a graph of such a
    node is built (rather than a RuntimeError of torch's, `Numpy is not available`, raised
    as it is fingerprinted), its fingerprints are those a process with numpy works out, and
    the tensor written in place gives another."""
    pytest.importorskip("numpy")
    (tmp_path / "reads.py").write_text(_READS_TENSORS)
    kinds = ("ReadsTensor", "ReadsTable", "OwnsTensor")
    prints = f"print(*(f(getattr(m, kind)) for kind in {kinds!r}))\n"
    script = (
        "import sys, warnings\n"
        "sys.modules['numpy'] = None  # as if it were not installed\n"
        "warnings.simplefilter('ignore')  # torch warns it found no numpy\n"
        "import reads as m\n"
        "from somatize import Graph\n"
        "from somatize.catalog import fingerprint_of as f\n"
        "Graph.somatize(m.ReadsTensor().frozen().cached())\n"
        f"{prints}"
        "m.T[0] = 5.0\n"
        "m.TABLE['t'][0][0] = 5.0\n"
        "m.OwnsTensor.t[0] = 5.0\n"
        f"{prints}"
    )
    before, after = _printed(["-c", script], tmp_path).splitlines()
    with_numpy = "import reads as m\nfrom somatize.catalog import fingerprint_of as f\n" + prints
    assert before.split() == _printed(["-c", with_numpy], tmp_path).split()
    assert all(was != now for was, now in zip(before.split(), after.split(), strict=True))


def _fingerprints_of_elsewhere(
    root: Path, folders: list[str], kinds: list[str], module: str = "elsewhere"
) -> list[list[str]]:
    """The fingerprints of ``kinds`` of ``module`` as each folder of ``folders`` under
    ``root`` writes it, worked out in one new process that imports it afresh from each in
    turn (``root`` holds the packages it imports), its package with it."""
    top = module.partition(".")[0]
    script = (
        "import importlib, sys\n"
        "from somatize.catalog import fingerprint_of as f\n"
        f"sys.path.append({str(root)!r})\n"
        f"for folder in {[str(root / name) for name in folders]!r}:\n"
        "    sys.path.insert(0, folder)\n"
        "    importlib.invalidate_caches()\n"
        f"    m = importlib.import_module({module!r})\n"
        f"    print({', '.join(f'f(m.{kind})' for kind in kinds)})\n"
        f"    for name in [n for n in sys.modules if n.partition('.')[0] == {top!r}]:\n"
        "        del sys.modules[name]\n"
        "    sys.path.remove(folder)\n"
    )
    return [line.split() for line in _printed(["-c", script]).splitlines()]


def test_a_marked_object_holding_a_logger_is_watched_without_every_logger(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of a helper class a node's module holds that is marked by which object it
    is (it holds a random generator) and holds a logger is watched without reading what the
    logger holds — every logger of the process, thousands once torch is imported — so it is
    not taken as too large to watch, changed at every forward: its answer is recalled."""
    many = {f"tests.many.{at}": logging.Logger(f"tests.many.{at}") for at in range(5000)}
    manager = logging.Logger.manager
    monkeypatch.setattr(manager, "loggerDict", {**manager.loggerDict, **many})
    text = _HOLDS_A_HELPER.replace(
        "        self.k = k\n",
        "        self.k = k\n        self.draws = random.Random(k)\n"
        '        self.log = logging.getLogger("scaler")\n',
    )
    loaded = _load(
        tmp_path / "fingerprinted.py", "import logging\nimport random\n" + text, monkeypatch
    )
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.SCALER.k = 3
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


_DEFAULTS_TO_A_PATTERN = """
import functools
import re

import torch

from somatize import Node

PATTERN = re.compile("a")
DTYPE = torch.float32


def _matches(x, pattern):
    return pattern.match(x) is not None


class Defaults(Node):
    def forward(self, x, ctx, pattern=PATTERN):
        return pattern.match(x) is not None


class Binds(Node):
    match = functools.partial(_matches, pattern=PATTERN)

    def forward(self, x, ctx):
        return self.match(x)


class Casts(Node):
    def forward(self, x, ctx, dtype=DTYPE):
        return torch.tensor(x).to(dtype).dtype
"""


def test_a_default_of_the_standard_library_s_that_says_its_value_is_named_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled pattern or a torch dtype a method takes by default, or a partial binds
    (``pattern=PATTERN``), is named by what says it — its text, its name — not by its type
    alone: another pattern or dtype written for the constant is another fingerprint, never
    the old answer recalled; the same text loaded again is the same."""
    path = tmp_path / "fingerprinted.py"
    kinds = ("Defaults", "Binds", "Casts")
    first = _load(path, _DEFAULTS_TO_A_PATTERN, monkeypatch)
    was = [fingerprint_of(getattr(first, kind)) for kind in kinds]
    again = _load(path, _DEFAULTS_TO_A_PATTERN, monkeypatch)
    assert [fingerprint_of(getattr(again, kind)) for kind in kinds] == was
    text = _DEFAULTS_TO_A_PATTERN.replace('compile("a")', 'compile("b")')
    edited = _load(path, text.replace("torch.float32", "torch.float64"), monkeypatch)
    for kind, before in zip(kinds, was, strict=True):
        assert fingerprint_of(getattr(edited, kind)) != before, kind


_PLACED_BY_THE_MACHINE = """
import os
import pathlib
import sys

import torch

from somatize import Node

DEVICE = torch.device(os.environ["SOMATIZE_TEST_DEVICE"])


class Printer:
    def __init__(self):
        self.out = sys.stdout

    def show(self, x):
        print(x, file=self.out)
        return x


PRINTER = Printer()


class Places(Node):
    root = pathlib.Path(os.environ["SOMATIZE_TEST_ROOT"])

    def forward(self, x, ctx, device=DEVICE):
        return PRINTER.show(torch.tensor(x, device=DEVICE).cpu().item())
"""


def test_where_a_node_runs_is_not_in_its_fingerprint(tmp_path: Path) -> None:
    """What a module computes from where it runs — a device, a folder, the encoding of
    stdout — is named as its text makes it, or by its type, not by what it makes there: a
    node's fingerprint is the same on a machine with other devices, another checkout or
    locale, so a worker there builds the node rather than refusing it as other code."""
    _write(tmp_path / "placed.py", _PLACED_BY_THE_MACHINE)
    printed = []
    for device, folder, encoding in (("cpu", "/one", "utf-8"), ("meta", "/two", "latin-1")):
        printed.extend(
            _fingerprints_in(
                tmp_path,
                "placed",
                "Places",
                SOMATIZE_TEST_DEVICE=device,
                SOMATIZE_TEST_ROOT=folder,
                PYTHONIOENCODING=encoding,
            )
        )
    assert printed[0].startswith("sha256:")
    assert printed[0] == printed[1]


_HOLDS_A_CODEC_ON_ITS_CLASS = """
from somatize import Node
from somatize.data.codec import ArrowCodec


class Encodes(Node):
    codec = ArrowCodec()

    def forward(self, x, ctx):
        return self.codec.name + str(x)
"""


def test_an_object_of_somatizes_own_a_class_holds_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """An object of one of somatize's own classes a node's class holds (``codec =
    ArrowCodec()``) is named by its class's code, as one its module holds is: the same in
    every new process, so the next run recalls the node's answers."""
    _write(tmp_path / "codec_held.py", _HOLDS_A_CODEC_ON_ITS_CLASS)
    first = _fingerprints_in(tmp_path, "codec_held", "Encodes")
    assert first == _fingerprints_in(tmp_path, "codec_held", "Encodes")


_HOLDS_A_NAMESPACE = """
import argparse
import types

from somatize import Node


class Scaler:
    def __init__(self, k):
        self.settings = types.SimpleNamespace(k=k)
        self.arguments = argparse.Namespace(offset=0)

    def apply(self, x):
        return x * self.settings.k + self.arguments.offset


SCALER = Scaler(2)


class UsesHelperObject(Node):
    def forward(self, x, ctx):
        return SCALER.apply(x)
"""


def test_a_namespace_a_helper_object_holds_is_named_by_what_it_holds(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``types.SimpleNamespace`` or an ``argparse.Namespace`` a helper object holds (its
    settings) is named by what it holds, as an object of a class of the node's is: the
    fingerprint is the same in two new processes and another for other settings; a setting
    changed in place after a graph was built is seen at the next forward."""
    printed = {}
    for name, text in (
        ("same", _HOLDS_A_NAMESPACE),
        ("other", _HOLDS_A_NAMESPACE.replace("Scaler(2)", "Scaler(3)")),
    ):
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "spaced.py", text)
        printed[name] = _fingerprints_in(tmp_path / name, "spaced", "UsesHelperObject")
    assert printed["same"] == _fingerprints_in(tmp_path / "same", "spaced", "UsesHelperObject")
    assert printed["same"] != printed["other"]
    loaded = _load(tmp_path / "fingerprinted.py", _HOLDS_A_NAMESPACE, monkeypatch)
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.SCALER.settings.k = 4
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]
    loaded.SCALER.arguments.offset = 1
    assert _three_forwards(graph, store, "h", 5) == ["ran", "recalled", "recalled"]


def test_an_object_of_another_package_its_module_holds_is_not_kept_alive_by_a_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of another package's class a node's module holds (a model loaded as the
    module loads) is not kept alive by the node's fingerprint having named it: deleted from
    the module, it is freed while the node's class lives."""
    library = tmp_path / "otherlib"
    library.mkdir()
    _write(library / "__init__.py", "class Lib:\n    def __init__(self, k):\n        self.k = k\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = _load(tmp_path / "fingerprinted.py", _READS_OBJECTS_FROM_ELSEWHERE, monkeypatch)
    assert fingerprint_of(loaded.Scales).startswith("sha256:")
    held = weakref.ref(loaded.SCALER)
    del loaded.SCALER
    gc.collect()
    assert held() is None


_HOLDS_VALUES_OF_THE_LIBRARY = """
import collections
import operator
import os
import typing

from somatize import Node


class Settings(typing.NamedTuple):
    k: int


Pair = collections.namedtuple("Pair", "left right")


class Scaler:
    def __init__(self, k):
        self.settings = Settings(k)
        self.pair = Pair(k, 1)
        self.counts = collections.Counter({"a": k})
        self.recent = collections.deque([k], maxlen=4)
        self.by_name = collections.defaultdict(list, {"a": [k]})
        self.first = operator.itemgetter(0)
        self.environ = os.environ

    def apply(self, x):
        shift = self.counts["a"] - self.recent[0] + len(self.by_name["a"])
        return x * self.settings.k * self.pair.right + shift


SCALER = Scaler(2)


class UsesHelperObject(Node):
    def forward(self, x, ctx):
        return SCALER.apply(x)
"""


def test_named_tuples_counts_and_getters_a_helper_holds_are_named_alike_in_every_process(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper object holding a named tuple (``typing.NamedTuple``,
    ``collections.namedtuple``), a ``Counter``, a ``deque``, a ``defaultdict``, an
    ``operator.itemgetter`` and ``os.environ`` is named by what they hold: the same in two
    new processes of other hash seeds, another for other values; one changed in place
    after a graph was built is seen at the next forward."""
    printed = {}
    other = _HOLDS_VALUES_OF_THE_LIBRARY.replace("Scaler(2)", "Scaler(3)")
    for name, text in (("same", _HOLDS_VALUES_OF_THE_LIBRARY), ("other", other)):
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "valued.py", text)
        printed[name] = _fingerprints_in(tmp_path / name, "valued", "UsesHelperObject")
    again = _fingerprints_in(tmp_path / "same", "valued", "UsesHelperObject", PYTHONHASHSEED="7")
    assert again == printed["same"]
    assert printed["same"] != printed["other"]
    loaded = _load(tmp_path / "fingerprinted.py", _HOLDS_VALUES_OF_THE_LIBRARY, monkeypatch)
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]
    loaded.SCALER.by_name["a"].append(0)  # changed in place: seen at the next forward
    assert _three_forwards(graph, store, "h", 4) == ["ran", "recalled", "recalled"]


def test_a_count_a_marked_helper_object_holds_changed_in_place_is_seen(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``Counter`` a helper object marked by which object it is holds (it holds a random
    generator too), changed in place after a graph was built, is seen at the next forward:
    strict=True computes with what it holds now, never recalling the old answer."""
    text = _HOLDS_A_HELPER.replace(
        "        self.k = k\n",
        "        self.k = k\n        self.draws = random.Random(k)\n"
        '        self.counts = collections.Counter({"a": 0})\n',
    ).replace("return x * self.k", 'return x * self.k + self.counts["a"]')
    text = "import collections\nimport random\n" + text
    loaded = _load(tmp_path / "fingerprinted.py", text, monkeypatch)
    graph = Graph.somatize(loaded.UsesHelperObject().named("h").frozen().cached())
    assert _three_forwards(graph, store, "h", 2) == ["ran", "recalled", "recalled"]
    loaded.SCALER.counts["a"] += 1
    assert _three_forwards(graph, store, "h", 3) == ["ran", "recalled", "recalled"]


_HOLDS_TYPE_ALIASES = """
import typing

from somatize import Node


class Typed(Node):
    Out = typing.Dict[str, int]
    Maybe = typing.Optional[int]
    Items = list[int]
    Either = int | None

    def forward(self, x, ctx):
        return x
"""


def test_a_type_alias_a_node_s_class_holds_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """A type alias a node's class holds (``Out = typing.Dict[str, int]``, ``list[int]``,
    ``int | None``) is named by how it reads: the same in two new processes, so the next
    run recalls the node's answers; another alias is another fingerprint."""
    printed = {}
    other = _HOLDS_TYPE_ALIASES.replace("list[int]", "list[str]")
    for name, text in (("same", _HOLDS_TYPE_ALIASES), ("other", other)):
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "typed.py", text)
        printed[name] = _fingerprints_in(tmp_path / name, "typed", "Typed")
    assert printed["same"] == _fingerprints_in(tmp_path / "same", "typed", "Typed")
    assert printed["same"] != printed["other"]


_HOLDS_AN_ABSTRACT_HELPER = """
import abc

from somatize import Node


class Scaling(abc.ABC):
    @abc.abstractmethod
    def apply(self, x): ...


class Scaler(Scaling):
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


SCALER = Scaler(2)


class UsesHelperObject(Node):
    scaler = Scaler(2)

    def forward(self, x, ctx):
        return SCALER.apply(x) + self.scaler.apply(x)
"""


def test_an_object_of_an_abstract_class_s_subclass_is_named_alike_in_every_process(
    tmp_path: Path,
) -> None:
    """An object of a subclass of an abstract class (``abc.ABC``), held by a node's module or
    class, is named by its class's code and what it holds — not marked for what ``abc``
    keeps on each such class —: the same in two new processes, another for another factor
    or the class's method edited."""
    variants = {
        "same": _HOLDS_AN_ABSTRACT_HELPER,
        "factor": _HOLDS_AN_ABSTRACT_HELPER.replace("SCALER = Scaler(2)", "SCALER = Scaler(3)"),
        "edited": _HOLDS_AN_ABSTRACT_HELPER.replace("x * self.k", "x * self.k + 1"),
    }
    printed = {}
    for name, text in variants.items():
        (tmp_path / name).mkdir()
        _write(tmp_path / name / "abstract.py", text)
        printed[name] = _fingerprints_in(tmp_path / name, "abstract", "UsesHelperObject")
    assert printed["same"] == _fingerprints_in(tmp_path / "same", "abstract", "UsesHelperObject")
    found = [found for (found,) in printed.values()]
    assert len(set(found)) == len(found)


_HOLDS_TABLES = """
import numpy as np
import torch

from somatize import Node


class Compared:
    def __init__(self, k):
        self.k = k

    def __eq__(self, other):
        return isinstance(other, Compared) and other.k == self.k

    def __hash__(self):
        return hash(self.k)


class Normal(Node):
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    eps = np.float32(1e-6)
    kind = np.dtype("float32")
    std = torch.tensor([0.229, 0.224, 0.225])

    def forward(self, x, ctx):
        return (x - self.mean) / self.std.numpy() + self.eps


class Settled(Node):
    settings = Compared(2)

    def forward(self, x, ctx):
        return x * self.settings.k
"""


def test_an_array_or_tensor_a_class_holds_is_named_by_its_values_alike_in_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A numpy array, a numpy scalar or dtype, or a tensor a node's class holds (a table of
    means) is in its fingerprint by its dtype, shape and values: alike in two new processes,
    and another for other values. An object whose class says when it equals another is not
    marked by which object it is: alike in two new processes."""
    _write(tmp_path / "tabled.py", _HOLDS_TABLES)
    first = _fingerprints_in(tmp_path, "tabled", "Normal", "Settled")
    assert first == _fingerprints_in(tmp_path, "tabled", "Normal", "Settled")
    path = tmp_path / "tabled_here.py"
    was = fingerprint_of(_load(path, _HOLDS_TABLES, monkeypatch).Normal)
    for made, edit in (
        ("0.485, 0.456", "0.485, 0.457"),
        ("dtype=np.float32)", "dtype=np.float64)"),
        ("np.float32(1e-6)", "np.float32(1e-7)"),
        ('np.dtype("float32")', 'np.dtype("float64")'),
        ("0.224, 0.225]", "0.224, 0.226]"),
    ):
        edited = _load(path, _HOLDS_TABLES.replace(made, edit), monkeypatch)
        assert fingerprint_of(edited.Normal) != was, edit
    assert fingerprint_of(_load(path, _HOLDS_TABLES, monkeypatch).Normal) == was


_HOLDS_A_FITTED = """
import numpy as np

from somatize import Node


class Scaler:
    def __init__(self, mean, std):
        self.mean = mean
        self.std = std

    def __call__(self, x):
        return (x - self.mean) / self.std


class Fitted(Node):
    scaler = Scaler(np.array([1.0, 2.0]), np.array([0.5, 0.5]))

    def forward(self, x, ctx):
        return (x - self.scaler.mean) / self.scaler.std


class Calls(Node):
    scale = Scaler(np.array([1.0, 2.0]), np.float64(0.5))

    def forward(self, x, ctx):
        return self.scale(x)
"""


def test_an_object_holding_arrays_a_class_holds_is_named_by_their_values_in_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object a node's class holds that holds numpy arrays (a fitted scaler's means),
    called or only read, is named by its class and the arrays' dtype, shape and values:
    alike in two new processes, and another for other values."""
    _write(tmp_path / "fitted.py", _HOLDS_A_FITTED)
    first = _fingerprints_in(tmp_path, "fitted", "Fitted", "Calls")
    assert first == _fingerprints_in(tmp_path, "fitted", "Fitted", "Calls")
    path = tmp_path / "fitted_here.py"
    was = [fingerprint_of(_load(path, _HOLDS_A_FITTED, monkeypatch).Fitted)]
    was.append(fingerprint_of(_load(path, _HOLDS_A_FITTED, monkeypatch).Calls))
    edited = _load(path, _HOLDS_A_FITTED.replace("[1.0, 2.0]", "[1.0, 3.0]"), monkeypatch)
    assert fingerprint_of(edited.Fitted) != was[0]
    assert fingerprint_of(edited.Calls) != was[1]


def test_an_array_a_class_holds_is_read_once_as_its_fingerprint_is_worked_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values of an array a node's class holds (a large table) are read once as its
    fingerprint is first worked out, and once again as it is asked again: to tell it is an
    array, or that a graph's watch need not mark it, its type alone is read."""
    from somatize.catalog import _held

    loaded = _load(tmp_path / "tabled_once.py", _HOLDS_TABLES, monkeypatch)
    reads: list[Any] = []
    read = _held._array_bytes

    def counted(value: Any) -> bytes | None:
        reads.append(value)
        return read(value)

    monkeypatch.setattr(_held, "_array_bytes", counted)
    fingerprint_of(loaded.Normal)
    assert sum(value is loaded.Normal.mean for value in reads) == 2  # its body, its name
    reads.clear()
    _watch.watch_code([loaded.Normal])
    assert not any(value is loaded.Normal.mean for value in reads)


_HOLDS_A_FIT = """
import numpy as np

from somatize import Node


class Scaler:
    def __init__(self):
        self.mean = None

    def fit(self, x):
        self.mean = x.mean(axis=0)
        return self


class FitOnce(Node):
    scaler = Scaler().fit(np.ones((4, 3)))

    def forward(self, x, ctx):
        return x - self.scaler.mean
"""


def test_an_object_fitted_by_its_own_code_a_class_holds_is_not_marked(tmp_path: Path) -> None:
    """An object a node's class holds whose class's code sets its attributes past its making
    (``Scaler().fit(x)``), which its node's code only reads, is not marked by which object it
    is: alike in two new processes."""
    _write(tmp_path / "fits.py", _HOLDS_A_FIT)
    first = _fingerprints_in(tmp_path, "fits", "FitOnce")
    assert first == _fingerprints_in(tmp_path, "fits", "FitOnce")


def test_a_class_read_again_cheaply_is_worked_out_again_once_changed_in_place() -> None:
    """A class holding only plain values and plain functions is told unchanged by a stamp of
    its body, not by reading it again: each change in place — code, defaults or keyword
    defaults given to a method, a value rebound, what a method wraps, an object a method
    closes over — is still another fingerprint, and the first comes back with the first
    body."""
    from somatize.catalog import _fingerprint

    def make() -> Any:
        held: Any = None

        class Cfg:
            width = 4

            def scale(self, x: Any, by: Any = 2) -> Any:
                return x * by * self.width

            def other(self, x: Any) -> Any:
                return held

        def close_over(value: Any) -> None:
            nonlocal held
            held = value

        return Cfg, close_over

    kind, close_over = make()
    first = fingerprint_of(kind)
    assert fingerprint_of(kind) == first
    assert kind in _fingerprint._STAMPS  # told unchanged by its stamp
    seen = {first}
    scale, code, defaults = kind.scale, kind.scale.__code__, kind.scale.__defaults__

    def changed() -> None:
        now = fingerprint_of(kind)
        assert now not in seen
        seen.add(now)

    kind.scale.__defaults__ = (3,)
    changed()
    kind.scale.__defaults__ = defaults
    assert fingerprint_of(kind) == first
    kind.scale.__code__ = (lambda self, x, by=2: x + by).__code__
    changed()
    kind.scale.__code__ = code
    assert fingerprint_of(kind) == first
    kind.scale.__kwdefaults__ = {"k": 1}
    changed()
    kind.scale.__kwdefaults__ = None
    assert fingerprint_of(kind) == first
    kind.width = 5
    changed()
    kind.width = 4
    assert fingerprint_of(kind) == first

    def wrapper(self: Any, x: Any) -> Any:
        return x

    wrapper.__wrapped__ = scale  # type: ignore[attr-defined]
    kind.scale = wrapper
    changed()  # the wrapper of its module runs around the method: other code
    wrapper.__wrapped__ = kind.other  # type: ignore[attr-defined]
    changed()
    kind.scale = scale
    assert fingerprint_of(kind) == first
    close_over(types.SimpleNamespace(k=1))  # closes over an object now
    changed()
    assert kind not in _fingerprint._STAMPS


def test_an_object_named_again_cheaply_is_read_again_once_changed_in_place() -> None:
    """An object of plain values a node's class holds is named again without being read
    again while it, and its class, are unchanged: an attribute set in place (to an equal
    value of another type too), or a method of its class given other code, is still
    another fingerprint of the node."""
    from somatize.catalog import _held

    def make() -> Any:
        class Config:
            def __init__(self) -> None:
                self.width = 8
                self.name = "a"

            def scaled(self, x: Any) -> Any:
                return x * self.width

        class Holds(Node):
            config = Config()

            def forward(self, x: Any, ctx: Any) -> Any:
                return self.config.scaled(x)

        return Config, Holds

    config_kind, kind = make()
    first = fingerprint_of(kind)
    assert fingerprint_of(kind) == first
    assert id(kind.config) in _held._AGAIN  # named again from what was noted of it
    seen = {first}

    def changed() -> None:
        now = fingerprint_of(kind)
        assert now not in seen
        seen.add(now)

    kind.config.width = 8.0
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    kind.config.name = "b"
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    config_kind.scaled.__code__ = (lambda self, x: x + self.width).__code__
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    config_kind.scaled = lambda self, x: x - self.width
    changed()


def test_a_class_holding_configs_is_told_unchanged_cheaply_and_changed_when_they_change() -> None:
    """A node's class holding objects of plain values (two dataclass configs) is told
    unchanged by its stamp, without reading its body or working out its lineage again: a
    field set in place (to an equal value of another type too), a config rebound, a method
    of its class given other code, or the class holding another value, is still another
    fingerprint of the node."""
    import dataclasses

    from somatize.catalog import _fingerprint

    def make() -> Any:
        @dataclasses.dataclass
        class Cfg:
            width: int

            def scaled(self, x: Any) -> Any:
                return x * self.width

        @dataclasses.dataclass
        class Other:
            depth: int
            name: str = "a"

        class Holds(Node):
            cfg = Cfg(2)
            other = Other(3)

            def forward(self, x: Any, ctx: Any) -> Any:
                return self.cfg.scaled(x) + self.other.depth

        return Cfg, Holds

    config_kind, kind = make()
    first = fingerprint_of(kind)
    assert fingerprint_of(kind) == first
    assert kind in _fingerprint._STAMPS  # told unchanged by its stamp
    assert kind in _fingerprint._KNOWN  # and its lineage by theirs
    seen = {first}

    def changed() -> None:
        now = fingerprint_of(kind)
        assert now not in seen
        seen.add(now)
        assert fingerprint_of(kind) == now

    kind.cfg.width = 2.0
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    kind.other.name = "b"
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    kind.cfg = config_kind(3)
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    config_kind.scaled.__code__ = (lambda self, x: x + self.width).__code__
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    config_kind.scaled = lambda self, x: x - self.width
    changed()
    config_kind, kind = make()
    assert fingerprint_of(kind) == first == fingerprint_of(kind)
    kind.limit = 4
    changed()
    kind.__qualname__ = "Renamed"
    changed()


def test_a_lineage_told_unchanged_by_stamps_is_another_fingerprint_once_a_config_changes() -> None:
    """A fingerprint taken as noted for a lineage told unchanged by stamps is another once a
    config it holds changes by a way no field of the node's class names: through another
    class holding the same config, on a base class, set on a frozen config by
    ``object.__setattr__``, given an attribute, given another class in place, or its
    class's base given another method."""
    import dataclasses

    from somatize.catalog import _fingerprint

    def make() -> Any:
        class Scales:
            def scaled(self, x: Any) -> Any:
                return x * self.width  # type: ignore[attr-defined]

        @dataclasses.dataclass(frozen=True)
        class Cfg(Scales):
            width: int

        @dataclasses.dataclass
        class Adds:
            width: int

            def scaled(self, x: Any) -> Any:
                return x + self.width

        shared = Cfg(2)

        class Base(Node):
            other = Adds(1)

        class Holds(Base):
            cfg = shared

            def forward(self, x: Any, ctx: Any) -> Any:
                return self.cfg.scaled(x) + self.other.scaled(x)

        class Also(Node):
            cfg = shared

        return Scales, Adds, Base, Holds, Also

    first = fingerprint_of(make()[3])
    changes = [
        lambda scales, adds, base, kind, also: object.__setattr__(also.cfg, "width", 3),
        lambda scales, adds, base, kind, also: setattr(base.other, "width", 4),
        lambda scales, adds, base, kind, also: setattr(base, "other", adds(5)),
        lambda scales, adds, base, kind, also: object.__setattr__(kind.cfg, "more", 1),
        lambda scales, adds, base, kind, also: object.__setattr__(kind.cfg, "__class__", adds),
        lambda scales, adds, base, kind, also: setattr(scales, "scaled", lambda self, x: x),
    ]
    for change in changes:
        made = make()
        kind = made[3]
        assert fingerprint_of(kind) == first == fingerprint_of(kind)
        assert kind in _fingerprint._KNOWN  # taken as noted, till the change
        change(*made)
        now = fingerprint_of(kind)
        assert now != first
        assert fingerprint_of(kind) == now


_DECLARED_AS_MADE = """
from somatize import Node

class Declaring(Node):
    made = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Declaring.made += 1
        cls.scale = 2

class Scaled(Declaring):
    def forward(self, x, ctx):
        return x * self.scale
"""


def test_a_value_init_subclass_sets_on_its_class_is_what_the_class_is(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value a base's ``__init_subclass__`` sets on the class made (``cls.scale = 2``) is
    named by its value, not taken as state: set since, an answer kept before is recalled
    as drifted, by a graph built before and one built after, and strict=True computes it
    with the value now."""
    loaded = _load(tmp_path / "declared.py", _DECLARED_AS_MADE, monkeypatch)

    def graph() -> Graph:
        return Graph.somatize(loaded.Scaled().named("n").frozen().cached())

    built = graph()
    before = catalog.fingerprint_of(loaded.Scaled)
    assert built.forward(3, store=store) == 6
    loaded.Scaled.scale = 7
    assert catalog.fingerprint_of(loaded.Scaled) != before
    with pytest.warns(Drifted, match="`n` was recalled"):
        assert graph().forward(3, store=store) == 6
    assert graph().forward(3, store=store, strict=True) == 21
    assert built.forward(3, store=store, strict=True) == 21


def test_a_count_init_subclass_moves_on_a_base_it_names_is_its_state(tmp_path: Path) -> None:
    """A count a base's ``__init_subclass__`` moves on the base it names (``Declaring.made
    += 1``) is state: the fingerprint is the same in two processes that make the classes
    below it in another order."""
    _package(tmp_path, "declaring", nodes=_DECLARED_AS_MADE)
    _write(
        tmp_path / "declaring" / "other.py",
        "from declaring.nodes import Declaring\n\n"
        "class Other(Declaring):\n    def forward(self, x, ctx):\n        return x\n",
    )
    first = _fingerprints_in(tmp_path, "declaring.nodes", "Declaring", "Scaled")
    script = (
        "import declaring.other\nimport declaring.nodes as m\n"
        "from somatize.catalog import fingerprint_of as f\nprint(f(m.Declaring), f(m.Scaled))\n"
    )
    assert _printed(["-c", script], tmp_path).split() == first


_LOADING_LAZILY = """
from somatize import Node

class Model:
    def __call__(self, x):
        return x * 2

def load():
    return Model()

class Lazy(Node):
    _model = None

    def forward(self, x, ctx):
        if type(self)._model is None:
            type(self)._model = load()
        return type(self)._model(x)
"""


def test_an_object_a_forward_sets_on_its_class_lazily_is_its_state(tmp_path: Path) -> None:
    """An object a node's forward sets on its class the first time it runs (a model
    loaded once, ``type(self)._model = load()``, declared ``_model = None``) is its state:
    the first forward keeps its answer, and another process recalls it, not drifted."""
    _package(tmp_path, "lazily", nodes=_LOADING_LAZILY)
    script = (
        "import sys, warnings\nwarnings.simplefilter('error')\nimport lazily.nodes as m\n"
        "from somatize import Graph\nfor _ in range(2):\n    seen = []\n"
        "    g = Graph.somatize(m.Lazy().named('n').frozen().cached())\n"
        "    assert g.forward(3, store=sys.argv[1], watching=seen.append) == 6\n"
        "    print(*[f['fact'] for f in seen if f.get('node') == 'n'])\n"
    )
    store = str(tmp_path / "store")
    assert _printed(["-c", script, store], tmp_path).splitlines() == ["ran kept", "recalled"]
    assert _printed(["-c", script, store], tmp_path).splitlines() == ["recalled", "recalled"]


_READ_AS_IT_LOADS = """
import os
import time

import torch.nn.functional as F
from torch import nn

from somatize import Node

K = int(os.environ.get("SOMATIZE_TEST_K", "2"))
STARTED = time.time()
PID = os.getpid()
HERE = os.path.dirname(os.path.abspath(__file__))


class Times(Node):
    def forward(self, x, ctx):
        assert STARTED and PID and HERE
        return x * K


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        assert STARTED and PID and HERE
        return F.relu(self.linear(x)) * K


class Activated(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.linear(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.encoder(x))
"""


_RUN_READ_AS_IT_LOADS = """
import sys
import warnings

import torch
import torch.nn.functional as F

import somatize.torch
from somatize import Drifted, Graph

how, store, relu = sys.argv[1:]
if relu == "sigmoid":
    F.relu = lambda x, inplace=False: torch.sigmoid(x)
from loaded.nodes import Activated, Encoder, Model, Times

torch.manual_seed(0)
x = torch.linspace(-2, 2, 8).reshape(2, 4)
with warnings.catch_warnings(record=True) as caught, torch.no_grad():
    warnings.simplefilter("always")
    if how == "node":
        out = Graph.somatize(Times().named("times").frozen().cached()).forward(3, store=store)
    elif how == "wrap":
        wrapped = somatize.torch.wrap(Model(), frozen=["encoder"], cached=["encoder"], store=store)
        somatize.torch.freeze(wrapped)
        out = wrapped(x).sum().item()
    else:
        module = Activated() if how == "rows-nn" else Encoder()
        cached = somatize.torch.cache_rows(module, store=store)
        out = cached(x).sum().item()
        cached.flush()
drifted = any(isinstance(w.message, Drifted) for w in caught)
print(round(float(out), 4), "drifted" if drifted else "as-kept")
"""


def _run_read_as_it_loads(
    root: Path, how: str, store: Path, relu: str = "relu", k: str = "2"
) -> list[str]:
    """What the script above prints, run in a new process on ``how`` (a graph node, a wrapped
    model's cached part, a row cache of a model calling ``F.relu`` or one holding
    ``nn.ReLU``) against ``store``, with ``F.relu`` replaced where ``relu`` says so and
    ``SOMATIZE_TEST_K`` set to ``k``."""
    script = root / "run_read_as_it_loads.py"
    if not script.exists():
        _write(script, _RUN_READ_AS_IT_LOADS)
    return _printed([str(script), how, str(store), relu], root, SOMATIZE_TEST_K=k).split()


@pytest.mark.parametrize("how", ["node", "wrap", "rows"])
def test_a_constant_the_module_reads_from_the_environment_as_it_loads_is_in_the_fingerprint(
    how: str, tmp_path: Path
) -> None:
    """A plain value a node's module computes from the environment as it loads (``K =
    int(os.environ.get("K", "2"))``), run again in a new process where the environment makes
    another value of it, recalls the answer kept with the old value as drifted, never
    silently: for a graph's node, a wrapped model's cached part and a row cache alike. The
    values that say when and where it runs (the time it started, its process id, the folder
    of its file) are named by how they are computed: a run with the same ``K`` recalls it
    as kept."""
    _package(tmp_path, "loaded", nodes=_READ_AS_IT_LOADS)
    store = tmp_path / "store"
    first = _run_read_as_it_loads(tmp_path, how, store)
    assert first[1] == "as-kept"
    assert _run_read_as_it_loads(tmp_path, how, store) == first
    again = _run_read_as_it_loads(tmp_path, how, store, k="3")
    assert again == [first[0], "drifted"]


@pytest.mark.parametrize("how", ["wrap", "rows", "rows-nn"])
def test_a_torch_function_replaced_by_the_user_makes_a_recalled_answer_drifted(
    how: str, tmp_path: Path
) -> None:
    """Torch's own functions are not in a fingerprint, but one set in their place by the
    user (``F.relu = lambda x: torch.sigmoid(x)``) is the user's code: a new process
    replacing it recalls the answers torch's ``relu`` computed as drifted, never silently —
    whether the model's code calls ``F.relu`` or holds an ``nn.ReLU`` that does; a process
    leaving torch's own recalls them as kept."""
    _package(tmp_path, "loaded", nodes=_READ_AS_IT_LOADS)
    store = tmp_path / "store"
    first = _run_read_as_it_loads(tmp_path, how, store)
    assert first[1] == "as-kept"
    assert _run_read_as_it_loads(tmp_path, how, store) == first
    assert _run_read_as_it_loads(tmp_path, how, store, relu="sigmoid") == [first[0], "drifted"]


_READ_FROM_A_FILE = """
import os
import pathlib

from somatize import Node

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = int(pathlib.Path(HERE, "width.txt").read_text())
NAME = pathlib.Path(HERE, "name.txt").read_text().strip()
LONG = "x" * int(pathlib.Path(HERE, "long.txt").read_text())

class Sized(Node):
    def forward(self, x, ctx):
        assert HERE
        return (x * WIDTH, NAME, len(LONG))
"""


def test_a_value_the_module_reads_from_a_file_as_it_loads_is_named_by_what_it_holds(
    tmp_path: Path,
) -> None:
    """A number or a text a node's module reads from a file beside it as it loads is named by
    what it holds (a long text by its digest): another in the file is another fingerprint
    in a new process, the same is the same — while the folder the module is in, from which
    it found the file, is no part of it."""
    package = _package(tmp_path, "filed", nodes=_READ_FROM_A_FILE)
    for name, text in (("width", "2"), ("name", "a"), ("long", "100000")):
        (package / f"{name}.txt").write_text(text)
    first = _fingerprints_in(tmp_path, "filed.nodes", "Sized")
    assert _fingerprints_in(tmp_path, "filed.nodes", "Sized") == first
    seen = {first[0]}
    for name, text in (("width", "3"), ("name", "b"), ("long", "100001")):
        was = (package / f"{name}.txt").read_text()
        (package / f"{name}.txt").write_text(text)
        now = _fingerprints_in(tmp_path, "filed.nodes", "Sized")
        assert now[0] not in seen
        seen.add(now[0])
        (package / f"{name}.txt").write_text(was)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = package.rename(elsewhere / "filed")
    assert moved.exists()
    assert _fingerprints_in(elsewhere, "filed.nodes", "Sized") == first


_OF_A_DISTRIBUTED_RUN = """
import os
from os import getpid as pid
from pathlib import Path
from secrets import token_hex

import torch

from somatize import Node

K = int(os.environ.get("SOMATIZE_TEST_K", "2"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
RANK = int(os.environ["RANK"])
WORLD = int(os.getenv("WORLD_SIZE", "1"))
PORT = os.environ.get("MASTER_PORT", "29500")
JOB = os.environ.get("SLURM_JOB_ID", "local")
RUN = f"run-{JOB}"
DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES", "")
PROCESS = pid()
TOKEN = token_hex(8)
DRAWN = float(torch.rand(1))
SEED = torch.initial_seed()
OWNER = os.getuid()
WORKERS = min(8, os.cpu_count() or 1)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FOLDER = Path.cwd().name


class Ranked(Node):
    rank = LOCAL_RANK

    def forward(self, x, ctx):
        assert RANK >= 0 and WORLD and PORT and RUN and PROCESS and TOKEN and DRAWN and SEED
        assert OWNER >= 0
        assert WORKERS and DEVICE and FOLDER and DEVICES is not None
        return x * K + self.rank * 0
"""


def test_values_of_a_distributed_run_its_module_reads_as_it_loads_are_no_other_fingerprint(
    tmp_path: Path,
) -> None:
    """The values a node's module reads as it loads that say which process of a distributed
    run it is (its rank and world size, the port, the job's id, the devices it is given),
    or draws by chance under another name (``from os import getpid as pid``, ``token_hex``,
    ``torch.rand``, ``torch.initial_seed()``), or reads from the machine (its CPUs, whether
    it has a GPU) or the name of the working folder, are named by how they are computed:
    each rank of a run sharing a store has the same fingerprint, so none sees the others'
    answers as drifted. A value read from the environment that is none of those still makes
    another fingerprint."""
    _package(tmp_path, "ranked", nodes=_OF_A_DISTRIBUTED_RUN)
    script = "import os, sys\nos.chdir(sys.argv[1])\nimport ranked.nodes as m\n"
    script += "from somatize.catalog import fingerprint_of as f\nprint(f(m.Ranked))\n"

    def printed(rank: str, port: str, job: str, k: str = "2") -> str:
        where = tmp_path / f"rank{rank}"
        where.mkdir(exist_ok=True)
        environment = {
            "LOCAL_RANK": rank,
            "RANK": rank,
            "WORLD_SIZE": str(2 + int(rank)),
            "MASTER_PORT": port,
            "SLURM_JOB_ID": job,
            "CUDA_VISIBLE_DEVICES": rank,
            "PYTHONHASHSEED": str(1 + int(rank)),
            "SOMATIZE_TEST_K": k,
        }
        return _printed(["-c", script, str(where)], tmp_path, **environment).strip()

    first = printed("0", "29500", "11")
    assert first.startswith("sha256:")
    assert printed("1", "12345", "22") == first
    assert printed("0", "29500", "11", k="3") != first


_TORCH_OBJECTS = """
import torch
from torch import distributions as D
from torch.distributions import biject_to

from somatize import Node


class Positive(Node):
    def forward(self, x, ctx):
        y = torch.distributions.transform_to(D.constraints.positive)(x)
        return y + biject_to(D.constraints.positive)(x) + D.identity_transform(x)
"""


def test_objects_torch_makes_as_it_loads_named_by_a_node_are_the_same_in_every_process(
    tmp_path: Path,
) -> None:
    """A node naming an object torch's module makes as it loads, rather than a function
    (``torch.distributions.transform_to``, ``biject_to``, ``identity_transform``), names
    torch's own: its fingerprint is the same in every process, never a mark of that object,
    which would make each recall in a new process drifted."""
    _package(tmp_path, "objects", nodes=_TORCH_OBJECTS)
    first = _fingerprints_in(tmp_path, "objects.nodes", "Positive", PYTHONHASHSEED="1")
    assert _fingerprints_in(tmp_path, "objects.nodes", "Positive", PYTHONHASHSEED="2") == first


_TORCH_PARTS = """
import torch.nn.functional as F
from torch import nn

from somatize import catalog
from somatize.catalog import _bytecode, _names


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(16, 2)
        self.head = nn.Sequential(nn.Linear(16, 16), nn.GELU())
        self.recurrent = nn.LSTM(16, 16)

    def forward(self, x):
        return F.relu(self.head(self.encoder(x)))


for kind in {type(part) for part in Net().modules()}:
    catalog.fingerprint_of(kind)
laid = [*_bytecode._GLOBALS_READ.keys(), *_names._ATTRIBUTES_READ.keys()]
print(sorted({code.co_qualname for code in laid if "torch" in code.co_filename.split("/")}))
"""


def test_a_model_of_torchs_own_parts_lays_out_none_of_their_steps(tmp_path: Path) -> None:
    """Fingerprinting a model whose parts are torch's own classes, none of whose functions is
    replaced, looks through their names alone: no step of torch's code is laid out (a
    millisecond a function, tenfold the fingerprint of a model of a dozen classes, each
    process)."""
    script = tmp_path / "parts.py"
    _write(script, _TORCH_PARTS)
    assert _printed([str(script)]).strip() == "[]"


class _LongestText(Node):
    def forward(self, frame: Any, ctx: Any) -> int:
        return max(len(text) for text in frame.column("text"))


def test_an_answer_read_from_a_parquet_source_is_not_drifted_by_other_somatize_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Somatize's own classes (a ``Parquet`` source, whose code reaches the store's) are
    the code a node is written against, as torch's are: an answer kept under a source
    of somatize's is recalled, not `drifted`, by a somatize whose store code is other
    (an upgrade; here a function of the local store's module replaced by another that
    does the same), where no code of the user's changed."""
    import pyarrow
    import pyarrow.parquet

    from somatize.data import Parquet, settle
    from somatize.store import local

    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(pyarrow.table({"text": ["a", "bb", "ccc"] * 10}), sink)
    store.bind("notes/train", store.put(sink.getvalue().to_pybytes()))

    def longest() -> Graph:
        graph = Graph.somatize(
            Parquet(store, "notes/train").named("notes").frozen()
            >> _LongestText().named("longest").frozen().cached()
        )
        settle(graph)
        return graph

    assert longest().forward({"at": 0, "take": 30}, store=store) == 3
    was = local._kind_at

    def kind_at(root: str) -> str | None:  # other code, doing the same
        return was(root)

    monkeypatch.setattr(local, "_kind_at", kind_at)
    facts: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        assert longest().forward({"at": 0, "take": 30}, store=store, watching=facts.append) == 3
    assert [f["fact"] for f in facts if f.get("node") == "longest"] == ["recalled"]


_CONFIGURED = """
import json
import os
import types
from pathlib import Path

import torch

from somatize import Node

from configured.settings import SETTINGS

HERE = Path(__file__).parent
CFG = types.SimpleNamespace(**json.loads((HERE / "config.json").read_text()))
VERSION = CFG.version
MODEL_VERSION = SETTINGS.version
SCALE = 2 if VERSION == "v2" else 1
SEED = CFG.seed
RELEASE = CFG.release
EXTRA = float(open(os.path.join(os.environ["HOME"], "extra.txt")).read())
RANK = CFG.local_rank
GENERATOR = torch.Generator()
DRAWN = GENERATOR.seed()


class Configured(Node):
    def forward(self, x, ctx):
        assert MODEL_VERSION and DRAWN
        return x * SCALE + SEED + RELEASE + EXTRA + RANK * 0
"""

_SETTINGS = """
import json
import types
from pathlib import Path

SETTINGS = types.SimpleNamespace(**json.loads(Path(__file__).with_name("model.json").read_text()))
"""


def test_a_config_the_module_reads_as_it_loads_is_named_by_what_it_holds(
    tmp_path: Path,
) -> None:
    """A value a node's module reads from its own config file as it loads is named by what it
    holds, though its key is a word a run's value is named by too (``CFG.version``,
    ``CFG.seed``, ``CFG.release``, and ``SCALE`` computed from one, or ``SETTINGS.version``
    of a config another module reads), and so is a number read
    from a file under ``$HOME``: another in the file is another fingerprint in a new process.
    A rank of the config (``CFG.local_rank``), a seed a generator draws (``GENERATOR.seed()``)
    and another home holding the same file, are not."""
    package = _package(tmp_path, "configured", nodes=_CONFIGURED, settings=_SETTINGS)
    homes = [tmp_path / "home", tmp_path / "other-home"]
    config = {"version": "v1", "seed": 1, "release": 5, "local_rank": 0}

    def fingerprint(
        extra: str = "1.0", home: Path = homes[0], model: str = "m1", **changed: object
    ) -> str:
        (package / "config.json").write_text(json.dumps({**config, **changed}))
        (package / "model.json").write_text(json.dumps({"version": model}))
        home.mkdir(exist_ok=True)
        (home / "extra.txt").write_text(extra)
        return _fingerprints_in(tmp_path, "configured.nodes", "Configured", HOME=str(home))[0]

    first = fingerprint()
    assert fingerprint(home=homes[1], local_rank=1) == first
    seen = {first}
    for now in (
        fingerprint(version="v2"),
        fingerprint(seed=2),
        fingerprint(release=6),
        fingerprint(extra="2.0"),
        fingerprint(model="m2"),
    ):
        assert now not in seen
        seen.add(now)


_SWAPPED_FOR_A_LAYER = """
import os

import torch
import torch.nn.functional as F

from somatize import Node

if os.environ.get("SOMATIZE_TEST_SWAP") == "layer":
    F.relu = torch.nn.Sigmoid()


class Act(Node):
    def forward(self, x, ctx):
        return F.relu(x)
"""


def test_a_layer_of_torchs_set_in_place_of_a_torch_function_is_in_the_fingerprint(
    tmp_path: Path,
) -> None:
    """A layer of torch's classes set in place of a torch function (``F.relu =
    nn.Sigmoid()``) is no object torch made as it loaded: a node calling that function is of
    another fingerprint than where torch's own is there, the same in every process."""
    _package(tmp_path, "swapped", nodes=_SWAPPED_FOR_A_LAYER)
    kept = _fingerprints_in(tmp_path, "swapped.nodes", "Act", SOMATIZE_TEST_SWAP="")
    swapped = _fingerprints_in(tmp_path, "swapped.nodes", "Act", SOMATIZE_TEST_SWAP="layer")
    assert swapped != kept
    assert _fingerprints_in(tmp_path, "swapped.nodes", "Act", SOMATIZE_TEST_SWAP="layer") == swapped


_NAMED_LIKE_PYTHON_S = """
from somatize import Node

def helper(x):
    return x + {added}

class Scales(Node):
    def forward(self, x, ctx):
        return helper(x) * {times}
"""


@pytest.mark.parametrize("name", ["mailbox", "calendar"])
def test_a_node_in_a_module_of_the_user_s_named_like_one_of_python_s_is_the_user_s_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A script of the user's named like a module of the standard library (`calendar.py`)
    holds the user's code: an edit of its node or of a function it calls drifts the node,
    where taken for Python's own it was read as nothing."""

    def loaded(added: int, times: int) -> Any:
        text = _NAMED_LIKE_PYTHON_S.format(added=added, times=times)
        path = tmp_path / f"{name}.py"
        _write(path, text)
        module = types.ModuleType(name)
        module.__file__ = str(path)
        exec(compile(text, str(path), "exec"), module.__dict__)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    prints = [
        fingerprint_of(loaded(added, times).Scales) for added, times in [(1, 1), (2, 1), (1, 2)]
    ]
    assert len(set(prints)) == 3
    # Python's own module of that name, loaded again, is Python's again.
    monkeypatch.delitem(sys.modules, name)
    standard = importlib.import_module(name)
    assert _members._of_the_standard_library(vars(standard)[_PYTHON_S_OWN[name]])


_PYTHON_S_OWN = {"mailbox": "Maildir", "calendar": "Calendar"}


_MADE_WITHOUT_MODULE = """
import types

from somatize import Node

made = types.FunctionType(compile("lambda x: x + STEP", "<made>", "eval").co_consts[0], {})

class UsesMade(Node):
    def forward(self, x, ctx):
        return made(x)
"""


def test_a_helper_made_with_globals_naming_no_module_is_named_by_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a function made by `types.FunctionType(code, {})` or `exec(text, {})` has no
    # `__module__`: a node naming it is still built, and its code is still covered
    seen = []
    for step in (1, 1, 5):
        loaded = _load(
            tmp_path / "made.py", _MADE_WITHOUT_MODULE.replace("STEP", str(step)), monkeypatch
        )
        assert loaded.made.__module__ is None
        graph = Graph.somatize(loaded.UsesMade().named("made").frozen().cached())
        assert graph.forward(2) == 2 + step
        seen.append(fingerprint_of(loaded.UsesMade))
    assert seen[0] == seen[1] != seen[2]


@pytest.mark.parametrize("said", [5, b"/elsewhere/mailbox.py", None])
def test_a_stand_in_under_a_standard_name_with_an_odd_file_is_looked_at_without_error(
    monkeypatch: pytest.MonkeyPatch, said: object
) -> None:
    """A stand-in a program put in `sys.modules` under a name of the standard library's,
    whose `__file__` is no path, is taken for no module of Python's, without an error."""
    module = types.ModuleType("mailbox")
    module.__file__ = said  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "mailbox", module)
    assert not _members.standard_module("mailbox")


def test_a_class_of_ones_own_deriving_from_an_installed_one_edited_is_other_code(
    tmp_path: Path,
) -> None:
    """A class of the node's package deriving from an installed package's class, closed
    over by a helper, was named by its name alone, like the installed class: edited (a
    value or a method of its own), the fingerprint stayed, and the answers of the code
    before were recalled. Its own code names it; the installed class is named by name."""
    project, shared = _shared_checkout(
        tmp_path, _CLOSES_OVER_AN_INSTALLED_CLASS, "boxes_lib", box=_INSTALLED_BOX
    )
    _installed(shared, "boxes_lib")
    first = _fingerprints_in(project, "shared_nodes", "MadeWithBigger", also=(shared,))
    edited = _CLOSES_OVER_AN_INSTALLED_CLASS.replace("k = 3", "k = 5")
    _write(project / "shared_nodes.py", edited)
    assert _fingerprints_in(project, "shared_nodes", "MadeWithBigger", also=(shared,)) != first


_IMPORTS_INSIDE = """
from somatize import Node

class FromModule(Node):
    def forward(self, x, ctx):
        from .config import FACTOR

        return x * FACTOR

class ModuleItself(Node):
    def forward(self, x, ctx):
        from . import config

        return x + config.OFFSET[0]

class ByHelper(Node):
    def forward(self, x, ctx):
        return scaled(x)

def scaled(x):
    from .config import SCALE

    return x * SCALE["by"]
"""


def test_what_a_node_imports_as_it_runs_is_in_its_fingerprint(tmp_path: Path) -> None:
    """A constant or a table a node, or a helper it calls, imports inside its code from
    another module of its package (``from .config import FACTOR`` in ``forward``, to put off
    a heavy import or break a cycle) is in the node's fingerprint as that module's text
    writes it: another once that text gives it another value."""
    config = 'FACTOR = 2\nSCALE = {"by": 2}\nOFFSET = [1]\n'
    package = _package(tmp_path, "lazily", config=config, nodes=_IMPORTS_INSIDE)

    def fingerprints() -> list[str]:
        kinds = ("FromModule", "ModuleItself", "ByHelper")
        return _fingerprints_in(tmp_path, "lazily.nodes", *kinds)

    was = fingerprints()
    assert fingerprints() == was
    edits = [("FACTOR = 2", "FACTOR = 3"), ("[1]", "[5]"), ('"by": 2', '"by": 3')]
    for at, (old, new) in enumerate(edits):
        _write(package / "config.py", config.replace(old, new))
        now = fingerprints()
        assert [a == b for a, b in zip(now, was, strict=True)] == [i != at for i in range(3)]


def test_a_value_a_node_imports_as_it_runs_set_since_is_seen_at_the_next_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constant a node imports inside its code from another module of its package, set
    there since (``config.FACTOR = 3``), is seen at the next forward of a graph built
    before: the answer kept for the old value is recalled as drifted, never as current."""
    _package(tmp_path, "lazier", config="FACTOR = 2\n", nodes=_IMPORTS_INSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    nodes = importlib.import_module("lazier.nodes")
    config = importlib.import_module("lazier.config")
    graph = Graph.somatize(nodes.FromModule().named("scaled").frozen().cached())
    store = str(tmp_path / "store")
    assert graph.forward(3, store=store) == 6
    monkeypatch.setattr(config, "FACTOR", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SomatizeWarning)
        assert graph.forward(3, store=store, strict=True) == 9
    assert graph.record.outcome == {"scaled": "ran"}
