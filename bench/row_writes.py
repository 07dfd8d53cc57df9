"""What keeping a first epoch's rows costs the store writer, against writing their bytes.

A per-row cache's writer thread keeps each batch's rows in the store behind the step;
a first epoch hands it every row once, and a flush at the epoch's end waits for what
it has not yet written. Its own work competes with the training loop for the
interpreter (a thread of Python), so what it does a row at a time counts twice.

For rows of 1 KiB (a CNN's pooled features: 256 floats) and of 64 KiB (a
Transformer's tokens: 64 x 256 floats), in batches of 64, this times on one thread:

- the writer's way: each batch encoded into one buffer (``encode_batch``) and added
  to one joined write of the store (``Store.open_joined``), closed once all are in: a
  directory writes each batch to ``tmp/`` as it is added, so that the close (what a
  flush at an epoch's end waits for) is left to publish the pack; its close is printed
  on its own;
- the same buffers kept at once with one ``Store.keep_joined`` (packed, as many rows a
  pack as fit), as the writer kept them before;
- the same rows kept as items, one (key, pieces) a row, with ``Store.keep_many`` — the
  way a store is handed rows one by one;
- the bound: the same bytes, already encoded and joined, written as one blob with
  ``Store.put`` (hashed, written, renamed: what keeping them costs at the least).

Each is the median of ``--repeats`` runs, each into a store of its own. Prints the
times and their ratios to the bound; target: the writer's way within 2x of it.

    python bench/row_writes.py [--rows 4096] [--repeats 5]    (--rows a multiple of 1024)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from somatize import Store
from somatize_torch._row_codec import encode_batch, encode_rows
from somatize_torch.codec import TENSOR

BATCH = 64


def timed(root: str, repeats: int, ways: dict[str, Callable[[Store], None]]) -> dict[str, float]:
    """Median seconds of each of ``ways`` into a fresh store under ``root``; the ways take
    turns, so that a machine's drifting load falls on them alike."""
    took: dict[str, list[float]] = {name: [] for name in ways}
    for turn in range(repeats):
        for name, keep in ways.items():
            store = Store(f"{root}/{len(took[name])}-{turn}-{keep.__name__}")
            start = time.perf_counter()
            keep(store)
            took[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in took.items()}


def compare(root: str, shape: tuple[int, ...], count: int, repeats: int) -> None:
    torch.manual_seed(0)
    batches = [torch.randn(BATCH, *shape) for _ in range(count // BATCH)]
    keys = [f"blake3:{i:064x}" for i in range(count)]
    encoded = b"".join(bytes(encode_batch(batch)[0]) for batch in batches)

    closes: list[float] = []

    def added(store: Store) -> None:
        joined = store.open_joined(TENSOR.name)
        for at, batch in enumerate(batches):
            buffer, step = encode_batch(batch)
            joined.add(keys[at * BATCH : (at + 1) * BATCH], buffer, [step] * len(batch))
        start = time.perf_counter()
        joined.close()
        closes.append(time.perf_counter() - start)

    def joined(store: Store) -> None:
        buffers, lengths = [], []
        for batch in batches:
            buffer, step = encode_batch(batch)
            buffers.append(buffer)
            lengths += [step] * len(batch)
        store.keep_joined(keys, buffers, lengths, TENSOR.name)

    def many(store: Store) -> None:
        items = [row for batch in batches for row in encode_rows(batch)]
        store.keep_many(list(zip(keys, items, strict=True)), TENSOR.name)

    def bound(store: Store) -> None:
        store.put(encoded)

    ways = {
        "joined write, an add a batch": added,
        "keep_joined, a buffer a batch": joined,
        "keep_many, an item a row": many,
        "bound: the bytes put as one blob": bound,
    }
    seconds = timed(root, repeats, ways)
    floor = seconds.pop("bound: the bytes put as one blob")
    row_bytes = len(encoded) // count
    print(f"{count} rows of {row_bytes:,} bytes ({len(encoded) / 2**20:.1f} MiB), batches of 64")
    for name, took in seconds.items():
        print(
            f"  {name:34s} {took * 1e3:8.1f} ms  {took / floor:5.2f}x bound  "
            f"({took / count * 1e6:.1f} us a row)"
        )
    close = statistics.median(closes)
    closing = "... of the joined write, its close"
    print(f"  {closing:34s} {close * 1e3:8.1f} ms  {close / floor:5.2f}x bound")
    print(f"  {'bound: the bytes put as one blob':34s} {floor * 1e3:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096, help="a multiple of 1024")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    # The 64 KiB rows are a sixteenth as many, and both come in whole batches of 64.
    if args.rows <= 0 or args.rows % (16 * BATCH):
        parser.error(f"--rows must be a positive multiple of {16 * BATCH}, got {args.rows}")
    if args.repeats <= 0:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    torch.set_num_threads(1)
    print("target: the joined write within 2x of the bound")
    with tempfile.TemporaryDirectory(prefix="somatize-bench-") as root:
        compare(root, (256,), args.rows, args.repeats)
        compare(root, (64, 256), args.rows // 16, args.repeats)


if __name__ == "__main__":
    main()
