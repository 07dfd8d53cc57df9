"""Where the data comes from: a dataset read by span, cell by cell.

A source is a node like any other; what is different is what the graph is
handed — not a batch, a coordinate ``{"at": i, "take": n}``. Run it with

    python examples/notebook.py

It prints what each step shows: the dataset bound in a store, the graph, two
forwards (the second on a short span), what a forward costs on a coordinate
against a weighed batch, what the second forward on the same span spares, how
rebinding the dataset changes its version, the refusal when a frozen source is
not settled, rows crossing to a worker, and the stream sentence.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet

from somatize import Broker, Graph, Node, Opaque, Store, Worker
from somatize.data import Frame, Parquet, settle, to_arrow

SPAM = ["win", "free", "cash", "prize", "claim", "urgent", "winner", "txt"]
HAM = ["dinner", "tomorrow", "bus", "sorry", "meeting", "later", "mum", "ok"]


def cell(title: str) -> None:
    print(f"\n── {title} " + "─" * max(0, 70 - len(title)))


def message(rng: random.Random, spam: bool) -> str:
    words = SPAM if spam else HAM
    return " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))


class Clean(Node):
    """Rows in, one list of word lengths per message out. No dataframe library needed."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, frame: Frame, ctx: Any) -> list[list[float]]:
        self.calls += 1
        return [[float(len(word)) for word in one.split()] for one in frame.column("sms")]


class Widest(Node):
    """How many words the longest message of the span has."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, counts: list[list[float]], ctx: Any) -> float:
        self.calls += 1
        return float(max(len(one) for one in counts))


class Constant(Node):
    """Answers the same whatever it is handed: all a forward costs is asking."""

    def forward(self, x: Any, ctx: Any) -> float:
        return 1.0


def parquet_of(table: pyarrow.Table) -> bytes:
    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def median_ms(forward: Callable[[], Any], repeats: int = 15) -> float:
    for _ in range(3):
        forward()
    taken = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward()
        taken.append((time.perf_counter() - start) * 1e3)
    return statistics.median(taken)


def batches() -> tuple[str, list[tuple[str, Callable[[], Any]]]]:
    """The two batches to weigh, as tensors when `somatize.torch` is there, else bytes."""
    try:
        import torch

        import somatize.torch  # noqa: F401 - registers the codec that writes a tensor down
    except ImportError as why:
        small, large = os.urandom(1 << 20), os.urandom(32 * 3 * 224 * 224 * 4)
        said = (
            f"somatize.torch is not importable here ({why}); the batches are bytes of the "
            "same sizes"
        )
        return said, [
            ("a batch of 1 MB", lambda: Opaque(small)),
            ("a batch of 19 MB (32x3x224x224)", lambda: Opaque(large)),
        ]
    one, nineteen = torch.randn(262_144), torch.randn(32 * 3 * 224 * 224)
    return "the batches are float32 tensors, weighed by the tensor codec", [
        ("a batch of 1 MB", lambda: Opaque(one)),
        ("a batch of 19 MB (32x3x224x224)", lambda: Opaque(nineteen)),
    ]


def main() -> None:
    where = tempfile.mkdtemp(prefix="somatize-notebook-")
    store = Store(where)

    cell("A dataset is bytes in a store")
    rng = random.Random(0)
    labels = [1 if rng.random() < 0.13 else 0 for _ in range(2000)]
    table = pyarrow.table({"sms": [message(rng, bool(one)) for one in labels], "label": labels})
    digest = store.put(parquet_of(table))
    store.bind("sms/train", digest)
    print(f"`sms/train` → {digest}: {table.num_rows} rows, the digest is the hash of the bytes")
    print(table.slice(0, 3).to_pydict())

    cell("A source is a node")
    clean, widest = Clean(), Widest()
    g = Graph.somatize(
        Parquet(store, "sms/train").named("sms").frozen()
        >> clean.named("clean").frozen()
        >> widest.named("widest").frozen().cached()
    )
    settle(g)
    try:
        import somatize.figure  # noqa: F401
    except ImportError:
        print(g)
    else:
        picture = Path(tempfile.mkdtemp(prefix="somatize-figure-")) / "graph.svg"
        g.figure().save(picture)
        print(f"the figure of a graph that has never run: {picture}")
        print(g)
    print("nothing has been read yet: the graph only named the dataset")

    cell("And it is handed a coordinate")
    print(g.forward({"at": 0, "take": 64}))
    print(g.forward({"at": 1980, "take": 64}), "· the last span is short")
    last = g.forward({"at": 1980, "take": 64}, outputs="sms")
    print(f"the frame of that span has {len(last)} rows; past the end:",
          len(g.forward({"at": 5000, "take": 64}, outputs="sms")), "rows")  # fmt: skip
    print("as Arrow:", to_arrow(last).schema.names)

    cell("What the coordinate buys")
    said, weighed_batches = batches()
    print(said)
    weighed = Graph.somatize(Constant().named("n").frozen().cached())
    rows = []
    for name, make in [
        *weighed_batches,
        ("a coordinate", lambda: {"at": 0, "take": 64}),
    ]:
        ms = median_ms(lambda make=make: weighed.forward(make(), store=store))
        rows.append((name, ms))
        print(f"{name:>34}: {ms:8.3f} ms per forward")
    coordinate = rows[-1][1]
    for name, ms in rows[:-1]:
        print(f"{name:>34}: {ms / coordinate:8.1f}× a coordinate")
    print("every forward asks the store whether it has the answer: a batch must be weighed to")
    print("ask, a coordinate is named by its span and the dataset's version, both already known")

    cell("And what nobody needs is not computed")
    clean.calls = widest.calls = 0
    seen: list[dict[str, Any]] = []
    g.forward({"at": 0, "take": 64}, store=where)  # everything runs
    g.forward({"at": 0, "take": 64}, store=where, watching=seen.append)  # and now?
    for fact in seen:
        print(fact)
    print(f"\nclean ran {clean.calls} time(s), widest {widest.calls}")

    cell("The version, which the store had already worked out")
    source = Parquet(store, "sms/train")
    print(source.version)
    store.bind("sms/train", store.put(parquet_of(table.slice(0, 500))))
    print(Parquet(store, "sms/train").version, "· another dataset, another version")

    cell("Frozen and not settled is refused before anything runs")
    try:
        Graph.somatize(
            Parquet(store, "sms/train").named("sms").frozen()
            >> Widest().named("widest").frozen().cached()
        ).forward({"at": 0, "take": 8}, store=store)
    except ValueError as why:
        print(why)

    cell("The rows are read here, the work happens over there")
    counts = Widest()
    crossing = Graph.somatize(
        Parquet(store, "sms/train").named("sms")
        >> Clean().named("clean").at("w1")
        >> counts.named("widest")
    )
    worker = Broker.embedded({"w1": Worker.generic(mode="network")})
    crossed: list[dict[str, Any]] = []
    print(crossing.forward({"at": 0, "take": 32}, broker=worker, watching=crossed.append))
    for fact in crossed:
        if fact["fact"] == "crossed":
            print(f"  {fact.get('from', 'input')} → {fact['node']}: {fact['bytes']} bytes crossed")

    cell("And a stream is the same graph")
    print("A source that answers whatever is newest cannot be frozen, so nothing under it is")
    print("cached. The difference between training and deploying is how many rows the frame")
    print("brings: 4096 from a folder of Parquet while training, one from a topic in production.")


if __name__ == "__main__":
    main()
