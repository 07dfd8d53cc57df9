"""Modules that read what they compute from a config they hold, as a Hugging Face block
reads ``self.config``, for `wrap`'s tests: kept apart from those tests so that a process a
test starts imports only these (and torch), not the whole test file and what it imports."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import types
from typing import Any

import torch
from torch import nn


class Plain:
    """A config as a class written in Python keeps it."""

    def __init__(self, flag: bool, inner: Any) -> None:
        self.flag = flag
        self.inner = inner


class Inner:
    def __init__(self, scale: float) -> None:
        self.scale = scale


@dataclasses.dataclass
class Kept:
    flag: bool
    inner: Any


def config_of(kind: str, flag: bool) -> Any:
    """A config of ``kind`` holding ``flag`` and, one object deeper, a scale."""
    if kind == "object":
        return Plain(flag, Inner(1.0))
    if kind == "namespace":
        return types.SimpleNamespace(flag=flag, inner=types.SimpleNamespace(scale=1.0))
    if kind == "argparse":
        return argparse.Namespace(flag=flag, inner=argparse.Namespace(scale=1.0))
    return Kept(flag, Inner(1.0))


class ReadsConfig(nn.Module):
    """Reads what it computes from a config it holds, as a Hugging Face block reads
    ``self.config``: neither its ``repr`` nor its weights show it."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.config = config
        self.log = logging.getLogger("configured")  # no config: named by nothing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.config.inner.scale
        return out.relu() if self.config.flag else out


class HoldsConfig(nn.Module):
    def __init__(self, kind: str = "namespace", flag: bool = False) -> None:
        super().__init__()
        self.encoder = ReadsConfig(config_of(kind, flag))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out
