"""A decoder layer that keeps the keys and values of the steps before as it runs (a KV
cache its forward appends to, emptied by ``reset()`` between generations), for the
tests that what a module's own forward changes of what it keeps keys the next call
anew: those of a module node in a graph and of a wrapped model."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class Remembers(nn.Module):
    """Attends over the keys and values of every step since ``reset()``, kept as tensors
    it makes anew (``self.keys = torch.cat(...)``) or, ``in_lists``, in lists it appends
    to."""

    def __init__(self, in_lists: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.in_lists = in_lists
        self.reset()

    def reset(self) -> None:
        self.keys: torch.Tensor | list[torch.Tensor] = [] if self.in_lists else torch.zeros(1, 0, 4)
        self.values: torch.Tensor | list[torch.Tensor] = (
            [] if self.in_lists else torch.zeros(1, 0, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, v = self.k(x), self.v(x)
        if isinstance(self.keys, list) and isinstance(self.values, list):
            self.keys.append(k)
            self.values.append(v)
            keys, values = torch.cat(self.keys, 1), torch.cat(self.values, 1)
        else:
            assert isinstance(self.keys, torch.Tensor) and isinstance(self.values, torch.Tensor)
            self.keys = keys = torch.cat([self.keys, k], 1)
            self.values = values = torch.cat([self.values, v], 1)
        weights = torch.softmax(self.q(x) @ keys.transpose(1, 2), -1)
        return weights @ values


class Decoder(nn.Module):
    def __init__(self, in_lists: bool = False) -> None:
        super().__init__()
        self.layer = Remembers(in_lists)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x))


GENERATIONS = ([0, 1, 2], [3, 1, 2], [0, 1, 2])
"""Three generations, the second at its second step handed the token the first was, the
third the first's again."""


def steps_alike(
    answer: Callable[[torch.Tensor], torch.Tensor],
    reset: Callable[[], None],
    reference: nn.Module,
) -> list[bool]:
    """For each step of :data:`GENERATIONS`, whether ``answer`` (``reset()`` before each
    generation) answers as ``reference`` run itself (reset too)."""
    torch.manual_seed(1)
    tokens = torch.randn(4, 1, 1, 4)
    alike = []
    for generation in GENERATIONS:
        reset()
        reference.layer.reset()
        for token in generation:
            with torch.no_grad():
                alike.append(torch.equal(answer(tokens[token]), reference(tokens[token])))
    return alike


class NotesWidth(nn.Module):
    """Notes the width of what it is handed at every call, as it was made to: the same
    value, a new ``int`` object each time (past those CPython keeps one of)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(300, 3)
        self.width = 300

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.width = x.shape[-1]
        out: torch.Tensor = self.lin(x)
        return out


class NotesWidthThenHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = NotesWidth()
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out
