"""What the tests of a cache inside Ray actors and tasks run there, in a module so a Ray
worker can import it."""

from __future__ import annotations

import torch
from torch import nn

from somatize_torch import cache_rows
from somatize_torch.rows import CachedRows
from somatize_torch.writer import Writer


class Encoder:
    """Stands for the actor class a `map_batches` job runs: a cache over a shared store."""

    def __init__(self, root: str) -> None:
        torch.manual_seed(0)
        self.cached = cache_rows(nn.Sequential(nn.Linear(8, 4), nn.ReLU()), root)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The batch's features, and how long the store's writer gathers rows here."""
        return self.cached(x), Writer(self.cached.store).linger


def linger_in_a_task(root: str) -> float:
    """How long the store's writer gathers rows, for a cache made in this task."""
    return Encoder(root).encode(torch.randn(4, 8))[1]


class Holder:
    """Stands for an actor class given a cache made in the driver, which Ray pickles to it."""

    def __init__(self, cached: CachedRows) -> None:
        self.cached = cached

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The batch's features, and how many of its rows came from the store."""
        return self.cached(x), self.cached.stats.from_store
