"""What the pack indexes of a local store cost once loaded, and who loads them.

A store holding ``--packs`` packs of ``--rows`` rows each (16 bytes a row) and one
record kept after them (a wrapped model's answer) is opened afresh three times:

- the record is looked up and recalled: how long that takes, and how many pack
  indexes it loaded (target: none);
- a packed row is looked up, which loads every index: how long, and how many bytes
  the loaded table holds per row (tracemalloc);
- with the table loaded, ``recall_many`` of 64 rows (``borrow=True``, as a per-row
  cache reads them): the median time of a call.

    python bench/pack_index_memory.py [--packs 1000] [--rows 200]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from timing import median_us

from somatize.store import LocalStore


def key_of(number: int) -> str:
    return f"blake3:{number:064x}"


def filled(root: Path, packs: int, rows: int) -> LocalStore:
    """A store at ``root`` of ``packs`` packs of ``rows`` rows, and a record kept after."""
    store = LocalStore(root)
    for pack in range(packs):
        keys = [key_of(pack * rows + row) for row in range(rows)]
        store.keep_joined(keys, bytes(16 * rows), [16] * rows, "plain")
    old = time.time_ns() - 3600 * 10**9  # the packs were written an hour before the record
    os.utime(root / "packs", ns=(old, old))
    store.keep(key_of(-1 % 2**256), b"the model's answer", "plain")
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packs", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    total = args.packs * args.rows
    with tempfile.TemporaryDirectory() as where:
        root = Path(where) / "store"
        filled(root, args.packs, args.rows)

        fresh = LocalStore(root)
        start = time.perf_counter()
        fresh.recall(key_of(-1 % 2**256))
        taken = time.perf_counter() - start
        print(
            f"record, first recall:  {taken * 1e3:8.2f} ms, {len(fresh._packs)} pack indexes loaded"
        )

        fresh = LocalStore(root)
        tracemalloc.start()
        start = time.perf_counter()
        fresh.have([key_of(total // 2)])
        taken = time.perf_counter() - start
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"row, first lookup:     {taken * 1e3:8.2f} ms, {held / total:.0f} B a row held")

        keys = [key_of(row * (total // 64)) for row in range(64)]
        fresh.recall_many(keys, borrow=True)
        spent = median_us(lambda: fresh.recall_many(keys, borrow=True), 2000)
        print(f"recall_many, 64 rows:  {spent:8.1f} us")


if __name__ == "__main__":
    main()
