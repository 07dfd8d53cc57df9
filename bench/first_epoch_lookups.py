"""What a first epoch's lookups cost in a store that already holds many packs.

A per-row cache in its first epoch asks the store for every batch's rows, which it
does not have: each such lookup looks at ``packs/`` when that folder changed, and in
a first epoch the cache's own writer adds a pack to it every second. A store used
for many datasets and runs holds thousands of packs, so what that look costs, per
pack held, is what a first epoch pays at every batch.

A cheap module (a linear layer over rows of 16 tokens of 64 floats, so the cache's
own work shows) runs a first epoch of 64 batches of 64 rows, with no memory tiers,
over an empty store and over one holding ``--packs`` packs of other answers; the
cache's own time per batch (``stats.lookup_s``: naming, looking up, staging rows for
the writer) is the median of ``--repeats`` epochs, each over rows of its own.
Prints both and their ratio; target: the full store within 2x of the empty one
(each pack the writer adds still has ``packs/`` listed, its names all read, again).

    python bench/first_epoch_lookups.py [--packs 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

import somatize_torch.rows as rows_cache
from somatize import Store
from somatize.keys import root_key

BATCHES = 64


def first_epochs(root: str, module: nn.Module, repeats: int) -> float:
    """The cache's own seconds per batch, median over ``repeats`` first epochs."""
    per_batch = []
    for turn in range(repeats):
        cached = rows_cache.cache_rows(module, root, device_bytes=0, host_bytes=0)
        cached(torch.randn(1, 16, 64))  # started: the writer, the native hasher
        cached.reset_stats()
        generator = torch.Generator().manual_seed(turn)
        for _ in range(BATCHES):
            cached(torch.randn(64, 16, 64, generator=generator))
        per_batch.append(cached.stats.lookup_s / BATCHES)
        cached.flush()
        cached.close()
    return statistics.median(per_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = nn.Linear(64, 64).eval().requires_grad_(False)
    with tempfile.TemporaryDirectory(prefix="somatize-bench-") as scratch:
        full = Store(f"{scratch}/full")
        start = time.perf_counter()
        for pack in range(args.packs):
            full.keep_many(
                [(root_key({"pack": pack, "item": i}), b"x" * 100) for i in range(2)], "raw"
            )
        filled = time.perf_counter() - start
        empty = first_epochs(f"{scratch}/empty", module, args.repeats)
        held = first_epochs(f"{scratch}/full", module, args.repeats)
    print(f"torch {torch.__version__}; a store of {args.packs} packs made in {filled:.1f} s")

    def line(label: str, seconds: float) -> None:
        print(f"  {label:<56} {seconds * 1e3:7.2f} ms")

    line("cache's own time a batch, first epoch, empty store", empty)
    line(f"the same, the store holding {args.packs} packs", held)
    print(f"  {'full / empty':<56} {held / empty:7.2f}x   (target <= 2x)")


if __name__ == "__main__":
    main()
