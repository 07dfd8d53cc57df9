"""A pipeline that remembers: the second forward recalls instead of computing.

Run with `python examples/remember.py`. Three plain-Python nodes over a generated dataset; the last
one is frozen and cached. The first forward runs everything and keeps the
answer; the second asks the store once, recalls the answer, and spares the two
nodes that only it needed.
"""

from __future__ import annotations

import tempfile
import time

from somatize import Graph, Node


class Messages(Node):
    """A source handed a coordinate: which rows, not the rows themselves."""

    def __init__(self, rows: int, seed: int = 0) -> None:
        self.rows, self.seed = rows, seed

    def forward(self, span: dict[str, int], ctx: object) -> list[str]:
        words = ["win", "free", "dinner", "bus", "sorry", "meeting", "later", "ok"]
        end = min(span["at"] + span["take"], self.rows)
        return [
            " ".join(words[(i * 7 + j * 3 + self.seed) % len(words)] for j in range(4 + i % 9))
            for i in range(span["at"], end)
        ]


class Clean(Node):
    """One list of word lengths per message. Slow on purpose, like real work."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, messages: list[str], ctx: object) -> list[list[float]]:
        self.calls += 1
        time.sleep(0.2)
        return [[float(len(word)) for word in one.split()] for one in messages]


class Widest(Node):
    """How many words the longest message in the span had."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, lengths: list[list[float]], ctx: object) -> float:
        self.calls += 1
        return float(max(len(one) for one in lengths))


def main() -> None:
    clean, widest = Clean(), Widest()
    g = Graph.somatize(
        Messages(rows=2000).named("sms").frozen()
        >> clean.named("clean").frozen()
        >> widest.named("widest").frozen().cached()
    )
    print(g, end="\n\n")
    span = {"at": 0, "take": 64}

    with tempfile.TemporaryDirectory(prefix="somatize-demo-") as where:
        for attempt in ("first", "second"):
            seen: list[dict[str, object]] = []
            start = time.perf_counter()
            answer = g.forward(span, store=where, watching=seen.append)
            took = (time.perf_counter() - start) * 1e3
            print(f"{attempt} forward: {answer} in {took:.1f} ms")
            for fact in seen:
                print("   ", fact)
        print(
            f"\nclean ran {clean.calls} time(s), widest {widest.calls}; answers kept in {where}"
            " (a temporary directory, removed on exit)"
        )


if __name__ == "__main__":
    main()
