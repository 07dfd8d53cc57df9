"""What a coordinate saves, and what reading by span costs against pyarrow.

1. Per-forward cost of a recalled forward (a frozen, cached node that answers
   the same whatever it is handed) when the input is a 1 MB batch, a 19 MB
   batch, or a coordinate: the batch must be weighed on every forward, hit or
   miss; the coordinate is named by itself. Tensors when ``somatize.torch`` is
   importable, bytes of the same sizes otherwise. Each forward gets a new
   ``Opaque``, as each training step gets a new batch.
2. Rows per second walking a 1,000,000-row Parquet dataset in spans of 4,096:
   ``Parquet`` through a graph, and the source alone, against pyarrow reading
   the same file batch by batch (``ParquetFile.iter_batches(4096)``), for a file
   of one row group and one of 64 Ki-row groups.

Prints milliseconds, rows per second and ratios.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pyarrow
import pyarrow.parquet
from timing import median_us

from somatize import Graph, Node, Opaque, Store
from somatize.data import Parquet, spans
from somatize.node import Context
from somatize.store import LocalStore

ROWS = 1_000_000
TAKE = 4096


class Constant(Node):
    """Answers the same whatever it is handed."""

    def forward(self, x: Any, ctx: Any) -> float:
        return 1.0


def batches() -> tuple[str, list[tuple[str, Callable[[], Any]]]]:
    try:
        import torch

        import somatize.torch  # noqa: F401 - registers the tensor codec
    except ImportError as why:
        small, large = os.urandom(1 << 20), os.urandom(32 * 3 * 224 * 224 * 4)
        return f"bytes (somatize.torch not importable: {why})", [
            ("a batch of 1 MB", lambda: Opaque(small)),
            ("a batch of 19 MB (32x3x224x224)", lambda: Opaque(large)),
        ]
    one, nineteen = torch.randn(262_144), torch.randn(32 * 3 * 224 * 224)
    return "float32 tensors through the tensor codec", [
        ("a batch of 1 MB", lambda: Opaque(one)),
        ("a batch of 19 MB (32x3x224x224)", lambda: Opaque(nineteen)),
    ]


def per_forward(store: Store) -> None:
    kind, weighed_batches = batches()
    print(f"per-forward cost of a recalled forward; batches are {kind}")
    g = Graph.somatize(Constant().named("n").frozen().cached())
    rows = []
    for name, make in [*weighed_batches, ("a coordinate", lambda: {"at": 0, "take": 64})]:
        ms = median_us(lambda make=make: g.forward(make(), store=store), 15, warm=3) / 1e3
        rows.append((name, ms))
        print(f"{name:>34}: {ms:8.3f} ms per forward")
    coordinate = rows[-1][1]
    for name, ms in rows[:-1]:
        print(f"{name:>34}: {ms / coordinate:8.1f}× the coordinate's cost")


def walk_rate(walk: Callable[[], int], repeats: int = 3) -> float:
    """Rows per second of the median of ``repeats`` walks (one warm-up walk first)."""
    walk()
    taken = []
    for _ in range(repeats):
        start = time.perf_counter()
        rows = walk()
        taken.append(time.perf_counter() - start)
        assert rows == ROWS, rows
    return ROWS / statistics.median(taken)


def reading(store: LocalStore) -> None:
    values = list(range(ROWS))
    table = pyarrow.table(
        {
            "n": values,
            "x": [v * 0.5 for v in values],
            "s": [f"message {v % 9973}" for v in values],
        }
    )
    print(f"\nwalking {ROWS:,} rows in spans of {TAKE:,} (n: int64, x: float64, s: string)")
    print(f"{'layout':>22} {'graph':>12} {'source':>12} {'pyarrow':>12} {'graph/pyarrow':>14}")
    for label, groups in [("one row group", None), ("64 Ki-row groups", 65_536)]:
        sink = pyarrow.BufferOutputStream()
        pyarrow.parquet.write_table(table, sink, row_group_size=groups)
        name = f"bench/{'one' if groups is None else groups}"
        digest = store.put(sink.getvalue().to_pybytes())
        store.bind(name, digest)
        path = str(store.blob_path(digest))

        def through_graph(name: str = name) -> int:
            source = Parquet(store, name)
            g = Graph.somatize(source.named("rows"))
            return sum(len(g.forward(span)) for span in spans(source, take=TAKE))

        def source_alone(name: str = name) -> int:
            source = Parquet(store, name)
            ctx = Context(name="rows")
            return sum(len(source.forward(span, ctx)) for span in spans(source, take=TAKE))

        def peer(path: str = path) -> int:
            file = pyarrow.parquet.ParquetFile(pyarrow.memory_map(path, "r"))
            return sum(batch.num_rows for batch in file.iter_batches(batch_size=TAKE))

        ours, alone, theirs = walk_rate(through_graph), walk_rate(source_alone), walk_rate(peer)
        print(
            f"{label:>22} {ours / 1e6:9.2f} M/s {alone / 1e6:9.2f} M/s {theirs / 1e6:9.2f} M/s "
            f"{ours / theirs:13.2f}×"
        )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="somatize-bench-data-") as where:
        store = LocalStore(where)
        per_forward(store)
        reading(store)


if __name__ == "__main__":
    main()
