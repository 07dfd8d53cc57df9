"""What a recalled forward costs, against joblib.Memory's hit on the same input.

A 3-node graph whose last node is frozen and cached, handed a coordinate, against
a local store: the median time of a forward that recalls. The same question
through ``joblib.Memory`` (a cached function of the same input), and both again
with a 19 MB bytes input, where somatize's cost is weighing the batch. joblib's hit
on that input is not mostly hashing: it reads and parses the entry's
``metadata.json``, which holds the repr of the input (70 MB of JSON for these 19 MB
of bytes). So ``joblib.hash`` of the batch, joblib's weighing alone, is printed
beside it as a second peer (against somatize's whole recalled forward).

Prints microseconds and ratios; targets: ≤ 50 µs per recalled forward on a
coordinate, ≥ 10× faster than joblib's hit, and the 19 MB input weighed in ≤ 5 ms.
The same recalled forward against a bucket store (``memory://``, whose answers a
recall finds held in memory, as a local store's) is printed beside it: the two
should cost alike.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import joblib
from timing import median_us

from somatize import Graph, Node, Store


class Span(Node):
    def forward(self, span: Any, ctx: Any) -> Any:
        return span


class Clean(Node):
    def forward(self, span: Any, ctx: Any) -> int:
        return len(span) if isinstance(span, bytes) else span["take"]


class Widest(Node):
    def forward(self, count: int, ctx: Any) -> float:
        return float(count)


def widest(span: Any) -> float:
    return float(len(span) if isinstance(span, bytes) else span["take"])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="somatize-bench-") as scratch:
        compare(Path(scratch))


def compare(scratch: Path) -> None:
    where = str(scratch / "store")
    g = Graph.somatize(
        Span().named("span").frozen()
        >> Clean().named("clean").frozen()
        >> Widest().named("widest").frozen().cached()
    )
    memory = joblib.Memory(scratch / "joblib", verbose=0)
    cached = memory.cache(widest)

    coordinate = {"at": 4096, "take": 64}
    batch = bytes(range(256)) * (19 * 1024 * 1024 // 256)

    rows = []
    for label, x, repeats in [("a coordinate", coordinate, 5000), ("19 MB of bytes", batch, 40)]:
        ours = median_us(lambda x=x: g.forward(x, store=where), repeats)
        theirs = median_us(lambda x=x: cached(x), repeats)
        rows.append((label, ours, theirs, "joblib.Memory's hit"))
    weighing = median_us(lambda: joblib.hash(batch), 20, warm=2)
    rows.append(("19 MB of bytes", rows[1][1], weighing, "joblib.hash alone: weighing only"))

    print(f"{'input':>16} {'somatize':>12} {'joblib':>13} {'joblib/somatize':>16}  joblib's side")
    for label, ours, theirs, peer in rows:
        print(f"{label:>16} {ours:10.1f}µs {theirs:11.1f}µs {theirs / ours:15.1f}×  {peer}")
    print(
        "joblib's hit on 19 MB is mostly reading and parsing its metadata.json, which holds "
        "the input's repr, not hashing"
    )
    coordinate_us, batch_us = rows[0][1], rows[1][1]
    bucket = Store.on_bucket(f"memory://somatize-bench/{uuid.uuid4().hex}")
    on_bucket_us = median_us(lambda: g.forward(coordinate, store=bucket), 5000)
    print()
    print(f"recalled forward on a coordinate: {coordinate_us:.1f} µs (target ≤ 50 µs)")
    print(f"  the same on a bucket store:     {on_bucket_us:.1f} µs (memory://)")
    print(f"faster than joblib's hit on it:   {rows[0][2] / coordinate_us:.1f}× (target ≥ 10×)")
    print(f"19 MB input weighed and recalled: {batch_us / 1e3:.2f} ms (target ≤ 5 ms)")


if __name__ == "__main__":
    main()
