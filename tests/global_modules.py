"""A notebook cell whose module's forward calls a module of torch's own classes held in a
global of the cell (``NORM = nn.LayerNorm(3)``), for the tests of what keys that module's
weights: those of a per-row cache, of a module node in a graph and of a wrapped model."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

NORMED_CELL = """
from torch import nn

NORM = nn.LayerNorm(3)


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):
        return NORM(self.linear(x))


class HeadOnNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Normed()
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.encoder(x))
"""


def normed_cell(monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """The cell run as the module ``name``: ``Normed``'s forward calls ``NORM``, a global of
    the cell, and ``HeadOnNormed`` holds a ``Normed`` as its encoder."""
    cell = types.ModuleType(name)
    exec(compile(NORMED_CELL, "<cell>", "exec"), vars(cell))
    monkeypatch.setitem(sys.modules, cell.__name__, cell)
    return cell


def scaled(norm: torch.nn.Module, by: float) -> None:
    """Scales ``norm``'s weight in place, as a hand or an optimizer would."""
    with torch.no_grad():
        norm.weight.mul_(by)
