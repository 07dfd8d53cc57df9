"""A module that draws nothing itself but runs while another thread draws from torch's
generator, for the tests that only a module's own draw refuses its answer: those of a
per-row cache, of a module node in a graph and of a wrapped model."""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch.nn import functional as F


class DrawnBeside(nn.Module):
    """A linear layer that draws nothing, run while another thread draws from torch's
    generator (a loader fetching the next batch ahead that draws a crop, another model
    sampling): its forward waits for that thread's draw."""

    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beside = threading.Thread(target=torch.rand, args=(3,))
        beside.start()
        beside.join()
        return self.linear(x)


class CountedBeside(DrawnBeside):
    """A :class:`DrawnBeside` that counts its calls, changing what it keeps at each."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


class AttendsBeside(DrawnBeside):
    """A :class:`DrawnBeside` that attends over its features with no dropout, as
    ``nn.MultiheadAttention(..., need_weights=False)`` does: torch tags the attention's
    kernel as one that may draw (for a dropout), though it draws nothing here."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)[:, None, :, None]  # one head of one token per feature
        attended = F.scaled_dot_product_attention(h, h, h, dropout_p=self.dropout)
        return attended[:, 0, :, 0]


class WritesBeside(DrawnBeside):
    """A :class:`DrawnBeside` that doubles its input in place before projecting it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.mul_(2))
