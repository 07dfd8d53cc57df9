"""Plain-Python nodes the tests share, defined in a module so they have identities."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from somatize import Node


class Rows(Node):
    """A source handed a coordinate ``{"at": i, "take": n}``: the integers of the span."""

    def __init__(self, size: int = 2000) -> None:
        self.size = size
        self.calls = 0

    def forward(self, span: dict[str, int], ctx: Any) -> list[int]:
        self.calls += 1
        return list(range(span["at"], min(span["at"] + span["take"], self.size)))


class Scale(Node):
    """Multiplies every item by ``by``."""

    def __init__(self, by: float = 2.0) -> None:
        self.by = by
        self.calls = 0

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        self.calls += 1
        return [v * self.by for v in values]


class Largest(Node):
    """The largest item."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, values: list[float], ctx: Any) -> float:
        self.calls += 1
        return float(max(values)) if values else 0.0


class Add(Node):
    """The sum of its inputs, whatever their number (a list input counts as its sum)."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, *inputs: Any) -> float:
        *values, _ctx = inputs
        self.calls += 1
        return float(sum(sum(v) if isinstance(v, list) else v for v in values))


class Square(Node):
    """Squares each item; declared mapped in the tests."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def forward(self, items: list[int], ctx: Any) -> list[int]:
        self.calls.append(list(items))
        return [i * i for i in items]


class Fails(Node):
    """Raises, always."""

    def forward(self, value: Any, ctx: Any) -> Any:
        raise ZeroDivisionError("on purpose")


class Echo(Node):
    """Hands its input on."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.calls = 0

    def forward(self, value: Any, ctx: Any) -> Any:
        self.calls += 1
        return value


class Slotted(Node):
    """Multiplies by ``by`` and adds ``offset``, both held in slots rather than a dict."""

    __slots__ = ("by", "offset")

    def __init__(self, by: float = 2.0) -> None:
        self.by = by
        self.offset = 0.0

    def forward(self, value: float, ctx: Any) -> float:
        return float(value * self.by + self.offset)


class Total(Node):
    """The sum of a frame's ``n`` column: plain Python, whatever precision torch is set to."""

    ignores_precision = True

    def forward(self, frame: Any, ctx: Any) -> int:
        return sum(frame.column("n"))


def host_float32_products() -> str:
    """How float32 products are computed on the host in this process: "tf32", "full", or
    another setting's name. Read from oneDNN's own setting where torch has one (2.9 on),
    from the float32 matmul precision before."""
    import torch

    mkldnn = torch.backends.mkldnn
    if hasattr(mkldnn, "matmul"):
        setting = str(mkldnn.matmul.fp32_precision)
        return "full" if setting in ("none", "ieee") else setting
    legacy = torch.get_float32_matmul_precision()
    return {"highest": "full", "high": "tf32"}.get(legacy, legacy)


@contextlib.contextmanager
def matmul_in_tf32() -> Iterator[None]:
    """float32 products computed in TF32 in this process for the block, as Lightning's
    warning asks (``torch.set_float32_matmul_precision("high")``); torch's default after."""
    import torch

    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision("highest")
