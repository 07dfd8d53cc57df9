"""A notebook cell whose module's forward calls a module of torch's own classes held in a
global of the cell (``NORM = nn.LayerNorm(3)``), or in a list or dict a global holds, or
that a partial the module keeps binds, or in a plain list or dict the module or a part of
it keeps (``self.extra = [nn.LayerNorm(3)]``), for the tests of what keys such a module's weights,
settings and mode: those of a per-row cache, of a module node in a graph and of a wrapped
model."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

NORMED_CELL = """
import functools

from torch import nn

NORM = nn.LayerNorm(3)
DROP = nn.Dropout(1.0).eval()  # in train mode, it answers zeros: drawing nothing
NORMS = [nn.LayerNorm(3)]
BY_NAME = {"norm": nn.LayerNorm(3)}
LAZY = nn.LazyLinear(3)


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):
        return NORM(self.linear(x))


class HeadOnNormed(nn.Module):
    def __init__(self, encoder=None):
        super().__init__()
        self.encoder = Normed() if encoder is None else encoder
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.encoder(x))


class Dropped(Normed):
    def forward(self, x):
        return DROP(self.linear(x))


class ListNormed(Normed):
    def forward(self, x):
        x = self.linear(x)
        for norm in NORMS:
            x = norm(x)
        return BY_NAME["norm"](x)


class Lazy(Normed):
    def forward(self, x):
        return LAZY(self.linear(x))


def applied(parts, x):
    for part in parts:
        x = part(x)
    return x


class Bound(Normed):
    def __init__(self, parts):
        super().__init__()
        self.then = functools.partial(applied, parts)

    def forward(self, x):
        return self.then(self.linear(x))


class Kept(Normed):
    def __init__(self):
        super().__init__()
        self.extra = [nn.LayerNorm(3)]
        self.by_name = {"drop": nn.Dropout(1.0).eval()}

    def forward(self, x):
        return self.by_name["drop"](applied(self.extra, self.linear(x)))


class KeptInAPart(Normed):
    def __init__(self):
        super().__init__()
        self.inner = Kept()

    def forward(self, x):
        return self.inner(x)
"""


NAMED_AS_ATTRIBUTES_CELL = """
import torch
from torch import nn


class Enc(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Towered(nn.Module):
    def __init__(self, encoder, tower):
        super().__init__()
        self.encoder = encoder
        self.tower = tower

    def forward(self, x, t):
        return self.encoder(x) + self.tower(t)


class Encoded(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Linear(4, 4)
        self.enc = Enc()

    def forward(self, x):
        return self.enc(self.tower(x))


encoder = Enc()
enc = Enc()
lin = nn.Linear(3, 3)
"""


def normed_cell(monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """The cell run as the module ``name``: ``Normed``'s forward calls ``NORM``, a global of
    the cell, and ``HeadOnNormed`` holds a ``Normed`` as its encoder."""
    return run_cell(monkeypatch, name, NORMED_CELL)


def named_as_attributes_cell(monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """The cell run as the module ``name``: it holds modules in globals bearing the names of
    attributes its classes' forwards read (``encoder``, ``enc``, ``lin``), which no forward
    reads as a global."""
    return run_cell(monkeypatch, name, NAMED_AS_ATTRIBUTES_CELL)


def run_cell(monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Any:
    """``text`` run as a notebook's cell, as the module ``name`` (its classes found there
    by name, as a kernel's are), for the test's time."""
    cell = types.ModuleType(name)
    exec(compile(text, "<cell>", "exec"), vars(cell))
    monkeypatch.setitem(sys.modules, cell.__name__, cell)
    return cell


def scaled(norm: torch.nn.Module, by: float) -> None:
    """Scales ``norm``'s weight in place, as a hand or an optimizer would."""
    with torch.no_grad():
        norm.weight.mul_(by)


def _bound(cell: Any) -> nn.Module:
    return cell.Bound(nn.ModuleList([nn.Linear(3, 3)]))


def _kept(
    change: Callable[[nn.Module], object],
) -> tuple[Callable[[Any], nn.Module], Callable[[Any, nn.Module], object]]:
    """A change to a module made as the cell's ``Kept``, which keeps modules in a plain list
    and a plain dict of its own."""
    return (lambda cell: cell.Kept(), lambda _, module: change(module))


CHANGES: dict[str, tuple[Callable[[Any], nn.Module], Callable[[Any, nn.Module], object]]] = {
    "setting": (lambda cell: cell.Normed(), lambda cell, _: setattr(cell.NORM, "eps", 1.0)),
    "mode": (lambda cell: cell.Dropped(), lambda cell, _: cell.DROP.train()),
    "in a list": (lambda cell: cell.ListNormed(), lambda cell, _: scaled(cell.NORMS[0], 2.0)),
    "replaced in a list": (
        lambda cell: cell.ListNormed(),
        lambda cell, _: cell.NORMS.__setitem__(0, nn.LayerNorm(3, eps=1.0)),
    ),
    "added to a list": (
        lambda cell: cell.ListNormed(),
        lambda cell, _: cell.NORMS.append(nn.Tanh()),
    ),
    "in a dict": (
        lambda cell: cell.ListNormed(),
        lambda cell, _: scaled(cell.BY_NAME["norm"], 2.0),
    ),
    "bound by a partial": (_bound, lambda _, module: scaled(module.then.args[0][0], 2.0)),
    "replaced in what a partial binds": (
        _bound,
        lambda _, module: module.then.args[0].__setitem__(0, nn.Linear(3, 3)),
    ),
    "in a list the module keeps": _kept(lambda module: scaled(module.extra[0], 2.0)),
    "setting in a list the module keeps": _kept(
        lambda module: setattr(module.extra[0], "eps", 1.0)
    ),
    "mode in a dict the module keeps": _kept(lambda module: module.by_name["drop"].train()),
    "replaced in a list the module keeps": _kept(
        lambda module: module.extra.__setitem__(0, nn.LayerNorm(3, eps=1.0))
    ),
    "added to a list the module keeps": _kept(lambda module: module.extra.append(nn.Tanh())),
    "taken out of a list the module keeps": _kept(lambda module: module.extra.pop()),
    "in a list a part keeps": (
        lambda cell: cell.KeptInAPart(),
        lambda _, module: scaled(module.inner.extra[0], 2.0),
    ),
}
"""Each way a module the module computes with beyond its own parts changes what it
answers: how the module is made from the cell, and what is changed after its answers were
kept."""
