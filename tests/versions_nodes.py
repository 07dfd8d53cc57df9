"""Node classes written with what each Python version parses alike but writes otherwise
(:func:`ast.unparse`), or makes otherwise for a dataclass: their fingerprints are pinned
by ``tests/test_python_versions.py``."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from somatize import Node


class Unpacks(Node):
    """Tuple targets: 3.10 writes them back in parentheses, 3.11 on without."""

    def forward(self, x: Any, ctx: Any) -> Any:
        low, high = x
        pairs = {name: value for name, value in [("low", low), ("high", high)]}
        for name, value in pairs.items():
            low, high = high, f"{name}={value}"
        return low, high


class Formats(Node):
    """f-strings with quotes inside and a format of their own: 3.12 writes the quotes
    otherwise, and 3.12.1 parses an empty text into the format."""

    def forward(self, x: Any, ctx: Any) -> Any:
        width = 8
        return f"{x['name']!r:>{width}}|{', '.join(x['tags'])}|{x['n']:{width}.2f}"


@dataclasses.dataclass
class Settled(Node):
    """A dataclass node: 3.13 lends it dataclasses' own `__replace__`."""

    by: int = 2
    tags: tuple[str, ...] = ("a",)

    def forward(self, x: Any, ctx: Any) -> Any:
        first, *rest = self.tags
        return x * self.by, first, rest


class Speed(enum.Enum):
    """An enum: `enum` sets its own `_generate_next_value_` on it, written otherwise by each
    Python version (a plain function in 3.11, a static method over other text in 3.12)."""

    FAST = 1
    SLOW = 2


class Chooses(Node):
    """A node naming an enum of its module."""

    def forward(self, x: Any, ctx: Any) -> Any:
        return x * Speed.FAST.value
