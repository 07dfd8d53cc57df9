"""What keeping and recalling cost, against copying the same bytes on the same disk.

- write and recall of 1 MB and 64 MB answers in a local store, against a raw file
  copy of the same bytes (write: ``open/write`` of the bytes; read: ``read`` of the
  file) — as a ratio raw/ours; target ≥ 0.8 for large values. Ours and raw are
  called in turn and medians compared, since a disk's write-back slows whichever
  writes later. Recall is timed in a fresh store object, so the digest check
  before first use is included.
- ``have()`` on 10,000 keys of which 2,550 are kept (2,500 by one ``keep_many``, 50
  one by one): µs per key, local and on a bucket on loopback (S3 through moto's
  server), from a fresh store object and again.
- ``keep_many`` of 100,000 small item answers, then their recall from a fresh store
  object: items per second for each.

Prints figures and ratios; timings on a shared machine are noisy.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import blake3

from somatize import Store
from somatize.store import LocalStore


def key_of(label: str) -> str:
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def paired_s(ours: Callable[[], Any], raw: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median seconds of ``ours`` and of ``raw``, called in turn: a disk's write-back
    throttling, which builds up as files are written, falls on both alike."""
    taken: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for call, into in ((ours, taken[0]), (raw, taken[1])):
            start = time.perf_counter()
            call()
            into.append(time.perf_counter() - start)
    return statistics.median(taken[0]), statistics.median(taken[1])


def throughput(where: str) -> None:
    print(f"{'value':>6} {'op':>7} {'somatize':>12} {'raw file':>12} {'raw/ours':>9}")
    store = LocalStore(os.path.join(where, "store"))
    for label, size, repeats in [("1 MB", 1 << 20, 21), ("64 MB", 64 << 20, 5)]:
        data = os.urandom(size)
        # A fresh value for each keep, made before the timing, so every keep writes (no
        # dedupe shortcut) and neither side pays for making it.
        values = [n.to_bytes(8, "big") + data[8:] for n in range(repeats)]
        counter = [0]

        def keep(
            label: str = label, values: list[bytes] = values, counter: list[int] = counter
        ) -> None:
            store.keep(key_of(f"{label}/{counter[0]}"), values[counter[0]], "plain")

        def raw_write(values: list[bytes] = values, counter: list[int] = counter) -> None:
            with open(os.path.join(where, f"raw-{counter[0]}"), "wb") as out:
                out.write(values[counter[0]])
            counter[0] += 1

        ours_w, raw_w = paired_s(keep, raw_write, repeats)
        key = key_of(f"{label}/0")
        raw_path = os.path.join(where, "raw-0")

        def recall(key: str = key) -> None:
            _, view = LocalStore(os.path.join(where, "store")).recall(key)
            bytes(view[-1:])

        def raw_read(path: str = raw_path) -> None:
            with open(path, "rb") as handle:
                handle.read()

        ours_r, raw_r = paired_s(recall, raw_read, repeats)
        for op, ours, raw in [("write", ours_w, raw_w), ("recall", ours_r, raw_r)]:
            print(
                f"{label:>6} {op:>7} {size / ours / 1e6:8.0f} MB/s {size / raw / 1e6:8.0f} MB/s "
                f"{raw / ours:8.2f}"
            )


def have_on(store: Store, label: str) -> None:
    keys = [key_of(f"have/{i}") for i in range(10_000)]
    store.keep_many([(k, b"v") for k in keys[:2500]], "plain")
    for k in keys[2500:5000:50]:
        store.keep(k, b"w", "plain")
    fresh = (
        Store(store.root)
        if isinstance(store, LocalStore)
        else Store.on_bucket(
            store.url,
            **store.storage_options,  # type: ignore[attr-defined]
        )
    )
    start = time.perf_counter()
    found = fresh.have(keys)
    taken = time.perf_counter() - start
    print(
        f"have() on 10,000 keys, {label:>16}: {taken * 1e6 / len(keys):8.1f} µs per key "
        f"({len(found)} had, fresh store object)"
    )
    start = time.perf_counter()
    fresh.have(keys)
    taken = time.perf_counter() - start
    print(
        f"have() on 10,000 keys, {label + ' again':>16}: {taken * 1e6 / len(keys):8.1f} µs per key"
    )


def packed(where: str) -> None:
    keys = [key_of(f"item/{i}") for i in range(100_000)]
    store = LocalStore(os.path.join(where, "packed"))
    start = time.perf_counter()
    store.keep_many([(k, k.encode()[:40]) for k in keys], "plain")
    kept = time.perf_counter() - start
    fresh = LocalStore(os.path.join(where, "packed"))
    start = time.perf_counter()
    got = fresh.recall_many(keys)
    taken = time.perf_counter() - start
    assert all(isinstance(got[k], tuple) for k in keys)
    print(f"keep_many of 100,000 items:   {len(keys) / kept:10.0f} items/s")
    print(f"recall of 100,000 packed items: {len(keys) / taken:8.0f} items/s (fresh store object)")


def main() -> None:
    where = tempfile.mkdtemp(prefix="somatize-store-bench-")
    try:
        throughput(where)
        print()
        have_on(LocalStore(os.path.join(where, "have")), "local")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        options = {
            "key": "x",
            "secret": "x",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
        }
        import s3fs

        s3fs.S3FileSystem(**options).mkdir("bench")
        have_on(Store.on_bucket("s3://bench/have", **options), "s3 on loopback")
        server.stop()
        print()
        packed(where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
