"""Residency: memory tiers within their budgets, and a writer that loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import inspect
import io
import json
import logging
import math
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import types
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from somatize import CodecError, Graph, Node, SomatizeWarning, Store, StoreError
from somatize._threads import ProcessLock
from somatize.data import Parquet
from somatize.node import Context
from somatize.store import _local_joined as local_joined
from somatize.store import records
from somatize.store._packed import frozen, steady
from somatize.store.local import LocalStore
from somatize_torch import writer as writer_module
from somatize_torch._native import PinnedPool
from somatize_torch._row_codec import decode_rows, encode_batch, encode_rows, row_order
from somatize_torch.codec import TENSOR
from somatize_torch.residency import ROW_INDEX_BYTES, Bank, Tier
from somatize_torch.rows import cache_rows
from somatize_torch.writer import WaitsForItself, WriteFailed, Writer, store_lock
from tests.conftest_s3 import s3_options, s3_url
from tests.forked import in_child, in_forked_child
from tests.test_data_parquet import CountingStore, bound, numbers
from tests.test_torch_rows import (
    HalfOfMap,
    Magnitudes,
    expected,
    laid_out_otherwise,
    rows_as_bytes,
)

ROOT = Path(__file__).resolve().parent.parent


def mlp() -> nn.Module:
    """A module every process names and builds the same way (torch classes, fixed seed)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def rows(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 16, generator=torch.Generator().manual_seed(seed))


SHARED = "import torch\nfrom torch import nn\n" + inspect.getsource(mlp) + inspect.getsource(rows)
"""The two functions above, for a child process (which must not import pytest or this file)."""


def truth(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = mlp()(x)
    return out


def test_the_device_tier_keeps_within_its_byte_budget(store: Store) -> None:
    """A device tier with room for 10 rows keeps 10; the rest go to the host tier, and
    every row is recalled from the nearest copy with its right value."""
    row_bytes = 8 * 4 + ROW_INDEX_BYTES  # a row and its entry in the tier's dict
    cached = cache_rows(mlp(), store, device_bytes=10 * row_bytes + 7, host_bytes=1 << 20)
    device, host = cached.tiers
    x = rows(32)
    cached(x)
    assert device.rows == 10 and device.used <= device.budget
    assert host.rows == 22
    order = torch.randperm(32)
    assert torch.equal(cached(x[order]), truth(x[order]))
    stats = cached.stats
    assert (stats.from_device, stats.from_host, stats.from_store) == (10, 22, 0)
    cached.close()


def test_a_tier_never_evicts_and_holds_each_row_once() -> None:
    """A full tier admits nothing more and drops nothing it holds; a row is kept once."""
    tier = Tier("device", "cpu", budget=4 * (16 + ROW_INDEX_BYTES))
    assert tier.admit(["a", "b", "c"], torch.ones(3, 4)) == 3
    assert tier.admit(["d", "e"], torch.zeros(2, 4)) == 1
    assert tier.admit(["f"], torch.zeros(1, 4)) == 0
    assert tier.rows == 4 and tier.used == tier.budget
    pieces, rest = tier.find(["e", "a", "d"], [0, 1, 2])
    assert rest == [0]
    assert pieces[0][0] == [1, 2]
    assert torch.equal(pieces[0][1], torch.tensor([[1.0] * 4, [0.0] * 4]))
    with pytest.raises(ValueError, match="budget must be 0 or more"):
        Tier("host", "cpu", -1)


def test_rows_are_written_as_the_tensor_codec_writes_each_row() -> None:
    """encode_rows gives each row the codec's own bytes; decode_rows stacks them back, and
    damaged bytes are refused."""
    x = torch.randn(5, 3, 2).to(torch.bfloat16)
    encoded = encode_rows(x)
    for row, pieces in zip(x, encoded, strict=True):
        assert b"".join(bytes(p) for p in pieces) == b"".join(bytes(p) for p in TENSOR.encode(row))
    # The header is made once for each dtype, shape and order of dims, never taken for another.
    for other in (x.float(), x[:, :2], x.transpose(1, 2).contiguous(), x.float()):
        batch, step = encode_batch(other)
        assert bytes(batch) == b"".join(bytes(p) for row in other for p in TENSOR.encode(row))
        assert step * len(other) == len(batch)
    datas = [memoryview(b"".join(bytes(p) for p in pieces)) for pieces in encoded]
    assert torch.equal(decode_rows(datas), x)
    assert torch.equal(decode_rows(datas[2:]), x[2:])  # its header was read before
    with pytest.raises(ValueError, match="claims bytes"):
        decode_rows([datas[0], datas[1][:-2]])
    # A row of another dtype with a header of the same length, and one of another shape.
    other = b"".join(bytes(p) for p in TENSOR.encode(x[1].to(torch.float16)))
    assert len(other) == len(datas[1])
    with pytest.raises(ValueError, match=r"row answer 1 is not a torch\.bfloat16 row of shape"):
        decode_rows([datas[0], memoryview(other), datas[2]])
    wider = b"".join(bytes(p) for p in TENSOR.encode(torch.zeros(3, 3, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="row answer 2 is not"):
        decode_rows([datas[0], datas[1], memoryview(wider)])


def test_a_row_whose_header_is_nested_past_what_is_read_is_damaged() -> None:
    """A row whose header nests JSON deeper than this process parses (bytes under a digest
    they match, written by no codec) is a ValueError, a row computed again, as the codec's
    decode of such an answer is: it was a RecursionError out of the row cache's forward."""
    deep = b'{"a":' * 200_000 + b"1" + b"}" * 200_000
    row = memoryview(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(ValueError, match="nested too deep"):
        decode_rows([row])
    with pytest.raises(ValueError, match="nested too deep"):
        TENSOR.decode(row)


@pytest.mark.parametrize("bad", [0, 3])
def test_bool_rows_of_bytes_other_than_0_and_1_are_not_written(bad: int) -> None:
    """A batch of bool rows holding a byte torch never writes (a uint8 mask viewed as bool,
    copied to the host as it lies) is refused whichever row holds it, as the codec refuses
    the row alone: only the first row was checked, and a later one was written, to be read
    back as damaged and computed again at every read."""
    masks = torch.zeros(5, 6, dtype=torch.uint8)
    masks[bad, 2] = 4
    x = masks.view(torch.bool)
    with pytest.raises(CodecError, match="bytes other than 0 and 1"):
        TENSOR.encode(x[bad])
    for _ in range(2):  # the header of such rows, once made, checks nothing
        with pytest.raises(CodecError, match=r"bytes other than 0 and 1 .*`mask != 0`"):
            encode_batch(x)
    made = x != 0
    assert torch.equal(decode_rows([memoryview(b"".join(p)) for p in encode_rows(made)]), made)


def test_encoded_rows_are_hashed_and_written_as_they_are() -> None:
    """The pieces encode_rows makes are taken by a store as bytes are: hashed and written
    with no copy of its own (a buffer that could change is copied first), read-only, and
    never written into again, so a view of them that a store keeps reads the same bytes
    after later batches are encoded."""
    x = torch.randn(4, 64, 256)  # rows of 64 KiB: each written as it is, none gathered
    pieces = [piece for row in encode_rows(x) for piece in row]
    assert frozen(pieces) is pieces
    whole = [encode_batch(x)[0]]  # what the writer keeps: the batch's one buffer
    assert frozen(whole) is whole and whole[0].readonly
    assert all(piece.readonly for piece in pieces)
    held = [bytes(piece) for piece in pieces]
    for _ in range(3):
        encode_rows(torch.randn(4, 64, 256))
    assert [bytes(piece) for piece in pieces] == held
    # What the store does copy: a buffer of the same bytes that its owner may write into.
    writable = [memoryview(bytearray(held[0]))]
    assert not steady(writable[0])
    assert frozen(writable) is not writable and type(frozen(writable)[0]) is bytes


@pytest.mark.parametrize("kind", ["channels_last", "transposed"])
def test_rows_in_another_order_of_their_dims_are_written_as_their_memory_holds_them(
    kind: str,
) -> None:
    """A batch dense in another order of its dims than C order is written with no copy,
    each row as the tensor codec writes it (so any reader of the codec reads it, with its
    strides), and read back as one batch with the strides it had; a row written in C
    order among them is read too. One in that order with gaps (every other of its rows'
    elements along a dim) is written dense in it, each row as the codec writes it, and
    read back so; one that overlaps, or in C order with gaps, is written in C order."""
    x = torch.randn(5, 3, 4, 2)
    x = x.to(memory_format=torch.channels_last) if kind == "channels_last" else x.transpose(1, 3)
    order = row_order(x)
    assert order is not None
    encoded = encode_rows(x.permute(order), order)
    datas = [memoryview(b"".join(bytes(p) for p in pieces)) for pieces in encoded]
    for row, data in zip(x, datas, strict=True):
        assert bytes(data) == b"".join(bytes(p) for p in TENSOR.encode(row))
        assert TENSOR.decode(data).stride() == row.stride()
    read = decode_rows(datas)
    assert torch.equal(read, x) and read.stride() == x.stride()
    in_c_order = [memoryview(b"".join(bytes(p) for p in row)) for row in encode_rows(x)]
    mixed = decode_rows([datas[0], in_c_order[1], datas[2]])
    assert torch.equal(mixed, x[:3]) and mixed.stride() == x.stride()
    assert decode_rows(in_c_order).is_contiguous()
    gaps = x[:, :, ::2]
    assert row_order(gaps) == order
    encoded = encode_rows(gaps.permute(order), order)
    datas = [memoryview(b"".join(bytes(p) for p in pieces)) for pieces in encoded]
    for row, data in zip(gaps, datas, strict=True):
        assert bytes(data) == b"".join(bytes(p) for p in TENSOR.encode(row))
    read = decode_rows(datas)
    assert torch.equal(read, gaps) and read.permute(order).is_contiguous()
    assert row_order(x.contiguous()) is None and row_order(x.contiguous()[:, :, ::2]) is None
    assert row_order(x[:, :, :1].expand(-1, -1, 3, -1)) is None


def _row(value: torch.Tensor, change: Any = None, data: bytes | None = None) -> memoryview:
    """The codec's bytes of ``value``, its JSON header changed by ``change``, its data
    replaced by ``data``."""
    raw = b"".join(bytes(p) for p in TENSOR.encode(value))
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    if change is not None:
        change(header)
    text = json.dumps(header).encode()
    text += b" " * (-(len(text) + 8) % 8)
    return memoryview(
        struct.pack("<Q", len(text)) + text + (raw[8 + size :] if data is None else data)
    )


def test_rows_are_read_only_as_the_codec_reads_them() -> None:
    """A batch of rows is read as the codec reads each row, never otherwise: a row whose
    header gives its tensor other bytes than those after the header, or that holds bytes
    past them, a bool row of a byte other than 0 or 1, rows of no element behind a damaged
    one, are refused as damaged (a ValueError: the rows are computed again) — and the
    codec refuses each of them alone too."""
    row = torch.tensor([1.0, 2.0, 3.0, 4.0])
    body = row.numpy().tobytes()
    later = _row(row, lambda h: h["tensor"].update(data_offsets=[8, 24]))
    skipped = _row(row, lambda h: h["tensor"].update(data_offsets=[8, 24]), bytes(8) + body)
    trailing = _row(row, data=body + bytes(8))
    flags = _row(torch.tensor([True, False, True]), data=bytes([1, 2, 1]))
    empty = _row(torch.zeros(0, 3))
    for damaged in (later, skipped, trailing, flags):
        with pytest.raises(ValueError):
            TENSOR.decode(damaged)
        with pytest.raises(ValueError):
            decode_rows([damaged, damaged])
        with pytest.raises(ValueError):
            decode_rows(
                [_row(torch.tensor([True, True, False]) if damaged is flags else row), damaged]
            )
    assert decode_rows([empty, empty]).shape == (2, 0, 3)
    for damaged in (memoryview(bytes(empty) + bytes(4)), memoryview(b"damaged")):
        with pytest.raises(ValueError):
            decode_rows([empty, damaged])


def test_rows_are_not_made_before_their_bytes_are_known_to_be_there() -> None:
    """A row header claiming more bytes than the row holds is refused before anything is
    allocated for the rows (a ValueError, not torch failing to allocate 256 GiB), and so
    are rows of no element that torch could not stack."""
    body = torch.arange(4.0).numpy().tobytes()
    for elements in (2**36, 2**45):
        claims = _row(
            torch.arange(4.0),
            lambda h, n=elements: h["tensor"].update(shape=[n], data_offsets=[0, 4 * n]),
            body,
        )
        with pytest.raises(ValueError, match="claims bytes"):
            decode_rows([claims])
    # Alone, a row of shape (2**40, 2**23, 0) is a tensor torch makes; 4 of them are not.
    flat = _row(torch.zeros(0), lambda h: h["tensor"].update(shape=[2**40, 2**23, 0]), b"")
    assert TENSOR.decode(flat).shape == (2**40, 2**23, 0)
    with pytest.raises(ValueError, match="cannot be stacked"):
        decode_rows([flat] * 4)


def test_flush_puts_every_computed_row_in_the_store(store: Store) -> None:
    """After flush, the store has every row the forward computed, under its key; the stats
    count the rows, their bytes and the writer's time, until they are reset."""
    cached = cache_rows(mlp(), store)
    x = rows(100)
    keys = cached.row_keys(x)
    cached(x)
    cached.flush()
    assert store.have(keys) == set(keys)
    assert cached.stats.rows_kept == 100 and cached.stats.bytes_kept > 100 * 32
    assert cached.stats.write_s > 0
    assert cached.reset_stats().write_s > 0 and cached.stats.write_s == 0.0
    cached(rows(10, seed=3))
    cached.flush()
    assert cached.stats.rows_kept == 10 and cached.stats.write_s > 0
    cached.close()


def _keep_in_child(cached: Any) -> list[str]:
    x = rows(20, seed=7)
    cached(x)
    cached.flush()
    keys: list[str] = cached.row_keys(x)
    return keys


@contextlib.contextmanager
def _held_by_another_thread(lock: ProcessLock) -> Iterator[None]:
    """``lock`` held by a thread of this process other than the caller (as the writer
    holds the store's lock while it keeps rows) until the block ends."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        holder.join()


def test_a_forked_child_keeps_its_own_rows(store: Store) -> None:
    """A child forked while the parent's writer thread runs and the store's lock is held
    by another of the parent's threads computes, keeps and flushes its own rows: it
    neither waits for the parent's thread nor for a lock no thread of its own holds."""
    cached = cache_rows(mlp(), store)
    cached(rows(10))  # the writer thread is running now
    with _held_by_another_thread(store_lock(cached.store)):
        keys = in_forked_child(_keep_in_child, cached)
    cached.flush()
    assert Store(store.root).have(keys) == set(keys)
    cached.close()


def _two_threads_enter(lock: ProcessLock) -> tuple[bool, int]:
    """In a forked child: whether ``lock`` was held as the child started, and how many
    times two threads entering it at once were both inside."""
    held = not _unheld(lock)
    inside, both = [0], [0]
    start = threading.Barrier(2)

    def enter() -> None:
        start.wait()
        for _ in range(20):
            with lock:
                inside[0] += 1
                both[0] += inside[0] > 1
                time.sleep(0.001)
                inside[0] -= 1

    threads = [threading.Thread(target=enter) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return held, both[0]


def _unheld(lock: ProcessLock) -> bool:
    """Whether another thread can take ``lock`` at once (no thread holds it)."""
    taken: list[bool] = []

    def take() -> None:
        taken.append(lock.acquire(blocking=False))
        if taken[0]:
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return taken == [True]


def test_an_interrupt_never_leaves_a_process_lock_held() -> None:
    """A KeyboardInterrupt (Ctrl-C) landing at any moment of blocks that enter and leave a
    ProcessLock leaves it unheld, where one landing between taking the lock and entering
    the block, or between leaving it and letting go, left it held for good (every later
    store call, flush and the exit's flush waited on it)."""
    lock = ProcessLock()

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    draw = random.Random(0)
    try:
        for _ in range(300):
            try:
                signal.setitimer(signal.ITIMER_REAL, draw.uniform(1e-6, 2e-4))
                try:
                    while True:
                        with lock:
                            pass
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                pass
            assert not lock.held_here() and _unheld(lock)
    finally:
        signal.signal(signal.SIGALRM, before)


def test_a_lock_held_at_a_fork_is_afresh_in_the_child_before_any_thread_enters() -> None:
    """A ProcessLock held by another of the parent's threads as it forks is unheld in the
    child from its start, not only once a thread there enters it (two threads entering it
    at once could then each make it afresh and both be inside): the child's threads
    exclude each other."""
    lock = ProcessLock()
    with _held_by_another_thread(lock):
        held, both = in_forked_child(_two_threads_enter, lock)
    assert (held, both) == (False, 0)


def _leave_and_enter_again(lock: ProcessLock) -> bool:
    """In a forked child whose forking thread held ``lock``: leaves that block, as user
    code that forked inside it would, then has another thread enter it."""
    entered = threading.Event()

    def enter() -> None:
        with lock:
            entered.set()

    with lock:  # entered again inside the block entered before the fork
        pass
    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(timeout=10)
    return entered.is_set() and _unheld(lock)


def _forked_inside(lock: ProcessLock) -> tuple[int, bytes]:
    """Forks while holding ``lock``; the child leaves the block and runs
    :func:`_leave_and_enter_again`, and never returns from here. Returns the child's exit
    status and what it wrote."""
    read, write = os.pipe()
    pid = -1
    try:
        with lock:
            pid = os.fork()
    except BaseException:
        if pid == 0:  # the child failed to leave the block
            os.write(write, b"raised")
            os._exit(1)
        raise
    if pid == 0:
        try:
            said = b"ok" if _leave_and_enter_again(lock) else b"held"
        except BaseException:
            said = b"raised"
        os.write(write, said)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    return os.waitpid(pid, 0)[1], said


def test_a_child_forked_inside_a_lock_leaves_its_block_without_error() -> None:
    """A thread that forks while it holds a ProcessLock goes on, in the child, inside the
    block, holding the lock there too (no other thread of the child enters meanwhile):
    leaving the block lets it go without error, and the lock works there after; the
    parent leaves its block as usual."""
    lock = ProcessLock()
    status, said = _forked_inside(lock)
    assert (status, said) == (0, b"ok")
    assert _unheld(lock)


def _compute_in_child(cached: Any) -> list[str]:
    x = rows(20, seed=8)
    cached(x)  # no flush: the rows are still the child's writer's when it returns
    keys: list[str] = cached.row_keys(x)
    return keys


def test_a_forked_child_publishes_its_rows_when_it_exits(store: Store) -> None:
    """A forked worker that computes rows and returns without flushing publishes them as it
    ends, though it ends with ``os._exit`` and so runs no ``atexit`` handler."""
    cached = cache_rows(mlp(), store)
    cached(rows(10))  # the parent's writer thread is running
    keys = in_forked_child(_compute_in_child, cached)
    assert Store(store.root).have(keys) == set(keys)
    cached.close()


def _linger_in_child(cached: Any) -> float:
    cached(rows(4, seed=9))
    linger: float = cached._writer.linger
    return linger


def test_a_worker_process_gathers_rows_for_a_moment_only(store: Store) -> None:
    """A worker process may be ended by its parent's exit with no chance to flush (a
    persistent DataLoader worker is terminated): there rows are gathered for a fifth of a
    second at most before they are written, not the second the main process waits."""
    cached = cache_rows(mlp(), store)
    cached(rows(4))
    assert cached._writer is not None and cached._writer.linger > writer_module.WORKER_LINGER
    assert in_forked_child(_linger_in_child, cached) == writer_module.WORKER_LINGER
    cached.close()


def test_a_spawned_worker_process_gathers_rows_for_a_moment_only(store: Store) -> None:
    """So does a worker started by spawn, whose cache is made as the child unpickles what
    it is handed, before it knows it has a parent: there rows were gathered for a second,
    and a quarter of what a persistent worker computed was lost at its parent's exit."""
    cached = cache_rows(mlp(), store)
    assert in_child("spawn", _linger_in_child, cached) == writer_module.WORKER_LINGER
    cached.close()


class _Answers(Dataset[torch.Tensor]):
    """Samples a cached module answers in the DataLoader worker that loads them."""

    def __init__(self, cached: Any, x: torch.Tensor) -> None:
        self.cached, self.x = cached, x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        with torch.no_grad():
            answer: torch.Tensor = self.cached(self.x[index : index + 1])[0]
        return answer


def test_rows_computed_in_dataloader_workers_are_published(store: Store) -> None:
    """Rows computed in forked DataLoader workers are in the store once the epoch is over
    and the workers have ended, though no worker flushed."""
    cached = cache_rows(mlp(), store)
    x = rows(32, seed=5)
    loader = DataLoader(
        _Answers(cached, x), batch_size=8, num_workers=2, multiprocessing_context="fork"
    )
    assert torch.allclose(torch.cat(list(loader)), truth(x), atol=1e-6)
    keys = cached.row_keys(x)
    assert Store(store.root).have(keys) == set(keys)
    cached.close()


def _answered_in_workers(store: Store, x: torch.Tensor) -> list[str]:
    """Answers ``x`` a sample at a time in two forked, persistent DataLoader workers, as a
    Dataset caching in ``__getitem__`` does; the loader is deleted, its workers ended, on
    return."""
    cached = cache_rows(mlp(), store)
    loader = DataLoader(
        _Answers(cached, x),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
    )
    assert torch.allclose(torch.cat(list(loader)), truth(x), atol=1e-6)
    del loader
    keys: list[str] = cached.row_keys(x)
    cached.close()
    return keys


def test_rows_cached_per_sample_in_workers_are_packed_many_per_blob(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker gathers the rows it computes a sample at a time before it writes them, and
    writes what it gathered as it ends, a persistent one when its loader is deleted: each
    worker's 32 rows land in one pack (its window made longer than the epoch here), not a
    file or two a sample, and a fresh process recalls every row once the loader is gone."""
    monkeypatch.setattr(writer_module, "WORKER_LINGER", 600.0)
    x = rows(64, seed=11)
    keys = _answered_in_workers(store, x)
    root = Path(store.root)
    assert len(list((root / "packs").iterdir())) == 2
    assert not list(root.glob("answers/*/*")), "a row was written alone"
    code = SHARED + textwrap.dedent(
        f"""
        from somatize import Store
        from somatize_torch.rows import cache_rows
        assert Store({str(root)!r}).have({keys!r}) == set({keys!r})
        cached = cache_rows(mlp(), Store({str(root)!r}))
        cached(rows(64, seed=11))
        print("recalled", cached.stats.from_store, cached.stats.computed)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["recalled", "64", "0"]


def _writer_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "somatize-writer"}


def _pools() -> int:
    return sum(type(thing) is PinnedPool for thing in gc.get_objects())


def test_a_dropped_cache_writes_what_it_held_and_lets_its_writer_go(store: Store) -> None:
    """Caches dropped without a flush still publish every row they computed, and nothing
    of theirs outlives that: their writers are collected, their threads end and their
    staging pools are freed."""
    gc.collect()
    threads, pools = _writer_threads(), _pools()
    writers: list[weakref.ref[Writer]] = []
    keys: list[str] = []
    for seed in range(3):
        cached = cache_rows(mlp(), store)
        x = rows(40, seed=seed)
        cached(x)  # staged, not yet written: the writer waits for more rows to pack
        keys += cached.row_keys(x)
        assert cached._writer is not None
        writers.append(weakref.ref(cached._writer))
        del cached
    gc.collect()
    assert [writer() for writer in writers] == [None] * 3, "a dropped cache's writer lives on"
    for thread in _writer_threads() - threads:
        thread.join(timeout=60)
    assert not _writer_threads() - threads
    assert Store(store.root).have(keys) == set(keys)
    gc.collect()
    assert _pools() <= pools


_ENCODER_CELL = """
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.inner = nn.Linear(16, width)
        self.outer = nn.Linear(width, 8)

    def forward(self, x):
        return self.outer(torch.relu(self.inner(x)))
"""


def test_an_encoder_class_of_a_cell_run_again_is_freed_with_its_dropped_cache(
    store: Store,
) -> None:
    """An encoder class a notebook's cell defines, run again, each time cached and dropped
    once it ran, is freed with its encoder: the digest of how it is written, worked out for
    the rows' fingerprint, does not hold the class its constructor's ``super()`` closes
    over."""
    made: list[weakref.ref[type]] = []
    x = rows(8)
    for seed in range(3):
        cell = types.ModuleType("tests.encoder_cell")
        exec(compile(_ENCODER_CELL, "<cell>", "exec"), cell.__dict__)
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, cell.__name__, cell)
            torch.manual_seed(seed)
            cached = cache_rows(cell.Encoder(), store)
            assert torch.equal(cached(x), cached(x))
            cached.flush()
        made.append(weakref.ref(cell.Encoder))
        del cached, cell
    gc.collect()
    assert sum(kind() is not None for kind in made) == 0


def test_a_writer_let_go_on_its_own_thread_writes_what_was_queued(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last reference to a writer let go on its own thread (a collection may run there)
    neither waits on that thread nor loses the rows queued behind the write in progress."""
    first, second = (f"blake3:{digit * 64}" for digit in "cd")
    threads = _writer_threads()
    holder = [Writer(store, linger=0.0)]
    writer = weakref.ref(holder[0])
    writing, queued, let_go = threading.Event(), threading.Event(), threading.Event()
    keep_joined = store.keep_joined

    def let_go_while_writing(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        assert queued.wait(timeout=30)
        holder.clear()
        let_go.set()
        return keep_joined(*args, **kwargs)

    monkeypatch.setattr(store, "keep_joined", let_go_while_writing)
    holder[0].submit([first], torch.ones(1, 4))
    assert writing.wait(timeout=30)
    holder[0].submit([second], torch.full((1, 4), 2.0))
    (thread,) = _writer_threads() - threads
    queued.set()
    assert let_go.wait(timeout=30)
    assert writer() is None, "the writer's own thread keeps it alive"
    thread.join(timeout=60)
    assert not thread.is_alive()
    monkeypatch.undo()
    assert store.have([first, second]) == {first, second}
    _, data = store.recall(second)
    assert decode_rows([data])[0].tolist() == [2.0] * 4


def test_a_failing_write_is_reported_not_swallowed(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that fails with ENOSPC is logged, raised at flush and at the next forward,
    and nothing is published."""

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "keep_joined", full)
    cached = cache_rows(mlp(), store)
    x = rows(16)
    with caplog.at_level(logging.ERROR, logger="somatize.torch"):
        cached(x)
        with pytest.raises(WriteFailed, match="16 computed rows could not be written") as caught:
            cached.flush()
    assert "Free space" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    assert "could not be written" in caplog.text
    assert cached.stats.rows_failed == 16
    cached(rows(4, seed=2))
    writer = cached._writer
    assert writer is not None
    writer.drain()
    with pytest.raises(WriteFailed, match="No space left"):
        cached(rows(4, seed=3))
    monkeypatch.undo()
    assert store.have(cached.row_keys(x)) == set()
    cached.close()


def _fail_reads(reader: Store, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes ``reader`` fail to hand over the answers it has, ``how`` says which way."""
    blobs = [blob for blob in (Path(reader.root) / "blobs").rglob("*") if blob.is_file()]
    assert blobs
    if how == "damaged":
        for blob in blobs:
            data = bytearray(blob.read_bytes())
            data[-1] ^= 0xFF
            blob.write_bytes(data)
        return
    if how == "removed":  # between the lookup and the read
        have = reader.have

        def have_then_remove(keys: Any) -> set[str]:
            found = have(keys)
            for blob in blobs:
                blob.unlink(missing_ok=True)
            return found

        monkeypatch.setattr(reader, "have", have_then_remove)
        return
    failure = (
        OSError(errno.EIO, "Input/output error")
        if how == "io error"
        else StoreError("cannot read blobs/ (Permission denied)")
    )

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr(reader, "_read_blob", failing)


@pytest.mark.parametrize("how", ["io error", "not readable", "damaged", "removed"])
def test_a_store_read_that_fails_computes_the_rows_again_and_says_so(
    store: Store, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the store has but cannot hand over — a read failing with an I/O error, a blob
    this process may not read, bytes damaged since they were kept, a blob removed between
    the lookup and the read — are computed again, the module's own answer, never the
    store's error or a wrong row; they are counted in ``rows_unread`` and warned of once."""
    x = rows(16)
    first = cache_rows(mlp(), store)
    first(x)
    first.flush()
    reader = Store(store.root)  # reads every file afresh: nothing of the first is held
    _fail_reads(reader, how, monkeypatch)
    cached = cache_rows(mlp(), reader)
    with pytest.warns(SomatizeWarning, match="could not be read back.*computed again"):
        out = cached(x)
    assert torch.equal(out, truth(x))
    stats = cached.stats
    assert (stats.computed, stats.from_store, stats.rows_unread) == (16, 0, 16)
    assert torch.equal(cached(x), truth(x))  # from memory now: nothing more to say
    assert cached.stats.rows_unread == 16
    cached.close()


@pytest.mark.parametrize(
    ("how", "says", "not_says"),
    [("removed", "after they were looked up (a gc", "verify"), ("damaged", "verify", "a gc")],
)
def test_rows_a_gc_took_after_their_lookup_are_said_let_go_not_damaged(
    store: Store, how: str, says: str, not_says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows a lookup found and the read no longer did (a gc in another process removed them
    in between, as happens while one runs beside training) are said to be let go of, not
    sent to `verify` as if the store were damaged; rows found damaged still are."""
    x = rows(16)
    first = cache_rows(mlp(), store)
    first(x)
    first.flush()
    reader = Store(store.root)
    _fail_reads(reader, how, monkeypatch)
    cached = cache_rows(mlp(), reader)
    with pytest.warns(SomatizeWarning, match="could not be read back") as warned:
        assert torch.equal(cached(x), truth(x))
    [message] = [str(w.message) for w in warned if "could not be read back" in str(w.message)]
    assert says in message and not_says not in message
    cached.close()


@pytest.mark.parametrize("home", ["local", "bucket"])
def test_a_damaged_pack_is_read_once_and_its_rows_written_again(
    tmp_path: Path, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack of rows whose blob was changed in the store since it was kept is read once:
    found damaged, its rows are misses from then on, not read again at each batch that
    needs one (a bucket downloaded it at every such batch), computed and written again,
    so that another store object recalls them."""
    where = str(tmp_path / "store") if home == "local" else s3_url()

    def opened() -> Store:
        """A store object of its own, holding nothing another one read."""
        if home == "local":
            return Store(where)
        return Store.on_bucket(where, **s3_options(), skip_instance_cache=True)

    x = rows(16)
    first = cache_rows(mlp(), opened())
    first(x)
    first.flush()
    first.close()
    reader = opened()
    [pack] = reader.recall_many(first.row_keys(x)[:1]).values()
    assert not isinstance(pack, Exception)
    blob = pack[0].value
    whole = bytes(reader.get(blob))
    damaged = whole[:-1] + bytes([whole[-1] ^ 0xFF])
    if isinstance(reader, LocalStore):
        Path(reader._blob_file(blob)).write_bytes(damaged)
    else:
        reader.fs.pipe_file(reader._blob_path(blob), damaged)
    reader = opened()
    reads: list[str] = []
    read_blob = reader._read_blob

    def counted(digest: str, *args: Any, **kwargs: Any) -> memoryview:
        reads.append(digest)
        return read_blob(digest, *args, **kwargs)

    monkeypatch.setattr(reader, "_read_blob", counted)
    cached = cache_rows(mlp(), reader)
    with pytest.warns(SomatizeWarning, match="could not be read back"):
        assert torch.equal(cached(x[:4]), truth(x[:4]))
    for start in range(4, 16, 4):
        assert torch.equal(cached(x[start : start + 4]), truth(x[start : start + 4]))
    assert reads.count(blob) == 1
    stats = cached.stats
    assert (stats.computed, stats.from_store, stats.rows_unread) == (16, 0, 4)
    cached.flush()
    cached.close()
    again = cache_rows(mlp(), opened())
    assert torch.equal(again(x), truth(x))
    assert again.stats.from_store == 16
    again.close()


def _fail_packs_listing(
    reader: Store, monkeypatch: pytest.MonkeyPatch, code: int = errno.EIO
) -> None:
    """Makes every listing of ``reader``'s ``packs/`` fail with error ``code`` (an I/O
    error unless told)."""
    packs = str(Path(reader.root) / "packs")
    listdir = os.listdir

    def failing(path: Any = ".") -> list[str]:
        if os.fspath(path) == packs:
            raise OSError(code, os.strerror(code), packs)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", failing)


def test_a_store_lookup_that_fails_computes_the_rows_and_says_so(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a batch whose lookup in the store fails (its ``packs/`` listing failing with
    an I/O error) are computed, the module's own answer, never the store's error raised to
    the training loop; they are counted in ``rows_unread`` and warned of once, with the
    store's reason."""
    x = rows(16)
    first = cache_rows(mlp(), store)
    first(x)
    first.flush()
    reader = Store(store.root)  # reads every file afresh: nothing of the first is held
    _fail_packs_listing(reader, monkeypatch)
    cached = cache_rows(mlp(), reader, device_bytes=0, host_bytes=0)
    with pytest.warns(SomatizeWarning, match=r"could not be looked up in.*packs.*computed again"):
        out = cached(x)
    assert torch.equal(out, truth(x))
    assert (cached.stats.computed, cached.stats.from_store, cached.stats.rows_unread) == (16, 0, 16)
    other = rows(4, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned of once
        assert torch.equal(cached(other), truth(other))
    assert cached.stats.rows_unread == 20
    cached.flush()
    monkeypatch.undo()
    assert torch.equal(cached(x), truth(x))  # the store answers again
    assert cached.stats.from_store == 16 and cached.stats.rows_unread == 20
    cached.close()


def test_a_lookup_failing_for_want_of_open_files_blames_the_process_not_the_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup failing because the process holds as many files open as it may computes
    the rows, and its warning says to raise the limit, not to look the store over with
    ``verify``, which would find nothing wrong."""
    x = rows(16)
    first = cache_rows(mlp(), store)
    first(x)
    first.flush()
    reader = Store(store.root)
    _fail_packs_listing(reader, monkeypatch, errno.EMFILE)
    cached = cache_rows(mlp(), reader, device_bytes=0, host_bytes=0)
    with pytest.warns(SomatizeWarning) as said:
        assert torch.equal(cached(x), truth(x))
    warned = str(said[0].message)
    assert "ulimit -n" in warned and "the store is not at fault" in warned
    assert "verify" not in warned
    monkeypatch.undo()
    cached.close()
    first.close()


def test_every_flush_that_waited_for_a_failed_write_raises_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads flushing while a write fails both raise it (neither takes it from the
    other); a flush after that, waiting for no rows that failed, returns, and so does a
    forward; a flush waiting for a write that fails later raises that one."""
    begun, fail = threading.Event(), threading.Event()

    def full_once_told(*args: Any, **kwargs: Any) -> Any:
        begun.set()
        assert fail.wait(timeout=60)
        raise OSError(errno.ENOSPC, "No space left on device")

    keep_joined = store.keep_joined
    monkeypatch.setattr(store, "keep_joined", full_once_told)
    cached = cache_rows(mlp(), store)
    writer = cached._writer
    assert writer is not None
    cached(rows(16))
    said: dict[str, str] = {}

    def flush(name: str) -> None:
        try:
            cached.flush()
        except WriteFailed:
            said[name] = "WriteFailed"
        else:
            said[name] = "returned"

    # A flush wakes the writer (a put into its queue) holding the lock it then waits on:
    # once two have, both are waiting for the write.
    backlog = writer._backlog
    queued, woken = backlog.queue, []

    class Counted:
        def put(self, item: Any) -> None:
            woken.append(item)
            queued.put(item)

        def __getattr__(self, name: str) -> Any:
            return getattr(queued, name)

    monkeypatch.setattr(backlog, "queue", Counted())
    flushers = [threading.Thread(target=flush, args=(name,)) for name in "AB"]
    for thread in flushers:
        thread.start()
    assert begun.wait(timeout=60)
    while len(woken) < 2:
        time.sleep(0.01)
    fail.set()
    for thread in flushers:
        thread.join(timeout=60)
    assert said == {"A": "WriteFailed", "B": "WriteFailed"}
    cached.flush()  # it waited for no rows that failed: raised already
    cached(rows(4, seed=2))  # a forward: raised already
    with pytest.raises(WriteFailed, match="4 computed rows could not be written"):
        cached.flush()  # the rows of the forward just before failed too
    monkeypatch.setattr(store, "keep_joined", keep_joined)
    cached(rows(4, seed=3))
    cached.flush()
    cached.close()


_TERMINATED = SHARED + textwrap.dedent(
    f"""
    import os, signal, sys, time
    sys.path.insert(0, {str(ROOT)!r})
    from somatize import Store
    from somatize_torch.rows import cache_rows

    if sys.argv[2] == "made an exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cached = cache_rows(mlp(), Store(sys.argv[1]))
    cached(rows(300))
    os.kill(os.getpid(), signal.SIGTERM)  # as a cluster preempting the job
    time.sleep(30)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name == "nt", reason="POSIX signals")
@pytest.mark.parametrize("handled", ["made an exit", "left as it is"])
def test_rows_of_a_terminated_process_are_kept_where_the_signal_is_made_an_exit(
    tmp_path: Path, handled: str
) -> None:
    """A SIGTERM, as the documentation says, loses the rows not yet written unless the
    script makes it an exit (then exit flushes); either way a later run recalls only rows
    that are right, and computes the rest."""
    store = tmp_path / "store"
    done = _ran_or_failed([_TERMINATED, str(store), handled], "a terminated process hung")
    assert done.returncode == (143 if handled == "made an exit" else -signal.SIGTERM), done.stderr[
        -2000:
    ]
    again = cache_rows(mlp(), Store(store))
    x = rows(300)
    assert torch.equal(again(x), truth(x))
    if handled == "made an exit":
        assert again.stats.from_store == 300
    again.close()


@pytest.mark.parametrize("ending", ["kept", "dropped", "one of two dropped", "two dropped"])
def test_rows_not_flushed_are_written_at_interpreter_exit(tmp_path: Path, ending: str) -> None:
    """A process that computes rows and exits without flushing — the cache still held, or
    dropped just before, alone or beside a second cache over the store opened again —
    still publishes every one, and its writer thread is stopped before the interpreter
    finalizes (a thread stopped there inside native code can abort the process)."""
    script = SHARED + textwrap.dedent(
        f"""
        import atexit, sys, threading
        sys.path.insert(0, {str(ROOT)!r})
        from somatize import Store
        from somatize_torch.rows import cache_rows

        def writers_left():  # registered first, so it runs after the cache's own
            print([t.name for t in threading.enumerate() if t.name == "somatize-writer"])

        atexit.register(writers_left)
        cached = cache_rows(mlp(), Store(sys.argv[1]))
        cached(rows(300))
        if "two" in sys.argv[2]:
            second = cache_rows(mlp(), Store(sys.argv[1]))
            second(rows(50, seed=2))
        if "dropped" in sys.argv[2]:
            del cached
        if sys.argv[2] == "two dropped":
            del second
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store"), ending],
        check=True,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "[]"
    again = cache_rows(mlp(), Store(tmp_path / "store"))
    x = rows(300)
    assert torch.equal(again(x), truth(x))
    assert again.stats.from_store == 300
    if "two" in ending:
        more = rows(50, seed=2)
        assert torch.equal(again(more), truth(more))
        assert again.stats.from_store == 350
    again.close()


_IN_A_COLLECTION_INSIDE_THE_STORE = SHARED + textwrap.dedent(
    f"""
    import gc, sys
    sys.path.insert(0, {str(ROOT)!r})
    from somatize import Store
    from somatize_torch.rows import cache_rows
    from somatize_torch.writer import store_lock

    cached = cache_rows(mlp(), Store(sys.argv[1]))
    cached._writer.pending_bytes = 1  # a forward waits for every row before its own
    cached(rows(8))

    class Later:
        def __del__(self):
            try:
                cached(rows(8, seed=2))  # past what may be pending
                print("computed", flush=True)
                getattr(cached, sys.argv[2])()
            except BaseException as error:
                print("raised", type(error).__name__, flush=True)

    later = Later()
    later.me = later
    del later
    with store_lock(cached.store):  # as a forward reading the store holds it
        gc.collect()
    cached.flush()
    print("flushed", flush=True)
    """
)


@pytest.mark.parametrize("call", ["flush", "close"])
def test_a_forward_and_a_flush_a_collection_runs_inside_a_store_call_wait_for_nothing(
    tmp_path: Path, call: str
) -> None:
    """Code a collection runs (a ``__del__``) while its thread holds the lock the writer
    thread takes to write — inside a forward's call into the store — waits for nothing
    that thread must do: a forward there computes its rows past what may be pending, and
    a flush (or close) says it would wait for itself (``WaitsForItself``), where each
    waited for ever. Every row is written all the same."""
    store = tmp_path / "store"
    done = _ran_or_failed(
        [_IN_A_COLLECTION_INSIDE_THE_STORE, str(store), call],
        "a forward or flush inside a call into the store waited for ever",
    )
    assert done.stdout.splitlines() == ["computed", "raised WaitsForItself", "flushed"], (
        done.stdout + done.stderr[-2000:]
    )
    again = cache_rows(mlp(), Store(store))
    x = torch.cat([rows(8), rows(8, seed=2)])
    assert torch.equal(again(x), truth(x))
    assert again.stats.from_store == 16
    again.close()


def _ran_or_failed(script_and_args: list[str], hung_means: str) -> subprocess.CompletedProcess[str]:
    """A script (with its arguments) run in a new interpreter; the test fails saying
    ``hung_means``, with what the script printed, where it has not ended in a minute."""
    try:
        return subprocess.run(
            [sys.executable, "-c", *script_and_args], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as hung:
        said = hung.stdout.decode() if isinstance(hung.stdout, bytes) else hung.stdout
        pytest.fail(f"{hung_means}: {said}")


_IN_A_SIGNAL_HANDLER_INSIDE_THE_STORE = SHARED + textwrap.dedent(
    f"""
    import os, signal, sys
    sys.path.insert(0, {str(ROOT)!r})
    from somatize import Store
    from somatize_torch.rows import cache_rows

    cached = cache_rows(mlp(), Store(sys.argv[1]))

    def on_signal(*_):  # as a checkpoint saved on a requeue signal flushes
        try:
            cached.flush()
            print("flushed in the handler", flush=True)
        except BaseException as error:
            print("raised", type(error).__name__, flush=True)

    signal.signal(signal.SIGUSR1, on_signal)
    cached(rows(8))
    with cached.store._lock:  # as a forward's call into the store holds it
        os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs here, inside the block
    cached.flush()
    print("flushed", flush=True)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_a_flush_in_a_signal_handler_inside_a_store_call_says_so_rather_than_hang(
    tmp_path: Path,
) -> None:
    """A signal handler that flushes (a checkpoint saved on a cluster's requeue signal),
    run while its thread is inside a call into a directory's store that holds the store's
    own lock, says it would wait for itself (``WaitsForItself``), where it waited for ever
    for the writer thread, which waits for that lock to publish. Every row is written all
    the same."""
    store = tmp_path / "store"
    done = _ran_or_failed(
        [_IN_A_SIGNAL_HANDLER_INSIDE_THE_STORE, str(store)],
        "a flush in a signal handler inside a store call waited for ever",
    )
    assert done.stdout.splitlines() == ["raised WaitsForItself", "flushed"], (
        done.stdout + done.stderr[-2000:]
    )
    again = cache_rows(mlp(), Store(store))
    x = rows(8)
    assert torch.equal(again(x), truth(x))
    assert again.stats.from_store == 8


_IN_A_COLLECTION_INSIDE_THE_LOOKUP = SHARED + textwrap.dedent(
    """
    import gc
    from somatize_torch.rows import cache_rows

    cached = cache_rows(mlp())
    cached(rows(4))

    class Later:
        def __del__(self):
            try:
                cached(rows(4, seed=2))
            except BaseException as error:
                print("raised", type(error).__name__, flush=True)
            print("rows", cached.stats.rows, flush=True)

    later = Later()
    later.me = later
    del later
    with cached._tiers_lock:  # as a lookup holds it
        gc.collect()
    print("after", cached(rows(4, seed=2)).shape[0], cached.stats.computed, flush=True)
    """
)


def test_a_forward_a_collection_runs_inside_the_cache_s_lookup_is_refused() -> None:
    """A forward run by code a collection runs (a ``__del__``) while its thread is inside
    the same cache's lookup — its memory tiers half updated — is refused (``RowsError``),
    where it waited for ever for the lock its own thread held; its counts can be read
    there. The cache goes on answering afterwards."""
    done = _ran_or_failed(
        [_IN_A_COLLECTION_INSIDE_THE_LOOKUP], "a forward inside the cache's lookup waited for ever"
    )
    assert done.stdout.splitlines() == ["raised RowsError", "rows 4", "after 4 8"], (
        done.stdout + done.stderr[-2000:]
    )


def _exits(script: str, store: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run in a new interpreter over ``store``, which must exit, and cleanly."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(store)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def test_rows_not_flushed_are_written_at_exit_when_the_store_hashes_on_a_pool(
    tmp_path: Path,
) -> None:
    """Rows still unwritten at interpreter exit, in a pack large enough that the store
    hashes it on a thread pool, are all published: the writer is flushed before the
    interpreter's pools stop taking work, and nothing is said to have failed."""
    script = SHARED + textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from somatize import Store
        from somatize.store import _local_files
        from somatize_torch.rows import cache_rows

        _local_files._OVERLAP = 1 << 10  # every pack is hashed on the pool, as 16 MiB ones are
        cached = cache_rows(mlp(), Store(sys.argv[1]))
        cached(rows(300))
        """
    )
    done = _exits(script, tmp_path / "store")
    assert "could not be written" not in done.stderr
    again = cache_rows(mlp(), Store(tmp_path / "store"))
    x = rows(300)
    assert torch.equal(again(x), truth(x))
    assert again.stats.from_store == 300
    again.close()


KILLED = """
import sys, time
sys.path.insert(0, {root!r})
from somatize import Store
from somatize.store import _local_joined as local_joined
from somatize.store._packed import frozen, steady
from somatize.store.local import LocalStore
from somatize_torch.rows import cache_rows

store = Store(sys.argv[1])
keep_joined = store.keep_joined

def slowly(keys, data, lengths, codec, fingerprint=None):
    whole = b"".join(data)
    begin = 0
    for start in range(0, len(keys), 8):
        some = lengths[start : start + 8]
        end = begin + sum(some)
        keep_joined(keys[start : start + 8], whole[begin:end], some, codec, fingerprint)
        begin = end
        print("published", flush=True)
        time.sleep(0.05)

store.keep_joined = slowly
cached = cache_rows(mlp(), store)
x = rows(512)
for start in range(0, 512, 64):
    cached(x[start : start + 64])
print("computed", flush=True)
time.sleep(60)
"""


def test_a_process_killed_mid_write_loses_no_published_row(tmp_path: Path) -> None:
    """SIGKILL while the writer is busy: a fresh process recalls every published row
    correctly, recomputes the rest, and finds no half-written answer."""
    where = tmp_path / "store"
    script = SHARED + KILLED.format(root=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(where)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    seen: list[str] = []
    try:
        while "computed" not in seen or "published" not in seen:
            line = child.stdout.readline().strip()
            assert line, f"the child ended early: {seen}"
            seen.append(line)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    store = Store(where)
    x = rows(512)
    fresh = cache_rows(mlp(), store)
    assert torch.equal(fresh(x), truth(x))
    stats = fresh.stats
    assert stats.from_store >= 8 * seen.count("published")
    assert stats.computed > 0
    assert stats.from_store + stats.computed == 512
    fresh.close()
    assert not store.verify().damaged


def test_a_closed_writer_starts_again_and_loses_nothing(store: Store) -> None:
    """A cache used after ``close()`` writes what it computes, as before: no row is kept in
    memory and left out of the store."""
    cached = cache_rows(mlp(), store)
    cached(rows(4))
    cached.close()
    x = rows(6, seed=2)
    assert torch.equal(cached(x), truth(x))
    cached.close()
    fresh = cache_rows(mlp(), store)
    assert torch.equal(fresh(x), truth(x))
    assert fresh.stats.from_store == 6 and fresh.stats.computed == 0
    fresh.close()


def test_a_close_beside_a_submit_leaves_no_row_behind(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread closes the writer while another submits: the submitted rows are written
    (by the thread going away or a new one), never queued behind the stop signal where
    no thread would take them and every later flush would wait for ever."""
    warm, late = (f"blake3:{digit * 64}" for digit in "ab")
    writer = Writer(store, linger=0.0)
    writer.submit([warm], torch.ones(1, 4))
    writer.flush()
    flushed, started = threading.Event(), threading.Event()
    flush, start = Writer.flush, Writer._start

    def flush_then_wait(self: Writer) -> None:
        flush(self)
        if threading.current_thread() is closer:  # flushed: now let the submit see the thread
            flushed.set()
            started.wait(timeout=5)

    def start_then_let_close(self: Writer) -> None:
        start(self)
        started.set()
        closer.join(timeout=0.5)  # the close stops the thread before the job is queued

    monkeypatch.setattr(Writer, "flush", flush_then_wait)
    monkeypatch.setattr(Writer, "_start", start_then_let_close)
    closer = threading.Thread(target=writer.close)
    closer.start()
    assert flushed.wait(timeout=5)
    writer.submit([late], torch.full((1, 4), 2.0))
    closer.join(timeout=30)
    later = threading.Thread(target=writer.flush, daemon=True)
    later.start()
    later.join(timeout=30)
    assert not later.is_alive(), "a submitted row was left where no thread takes it"
    assert writer.kept_rows == 2
    _, data = store.recall(late)
    assert decode_rows([data])[0].tolist() == [2.0] * 4
    monkeypatch.undo()
    writer.close()


def _within(call: Any, seconds: float = 30) -> BaseException | None:
    """What ``call()`` raised (None if nothing), run on another thread; fails the test if
    it is still waiting after ``seconds``."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as why:
            raised[0] = why

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"{call} still waits after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("where", ["staging", "starting"])
def test_a_submit_interrupted_before_its_rows_are_queued_leaves_nothing_to_wait_for(
    store: Store, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A submit interrupted before it queued its rows (Ctrl-C during the copy to the host,
    a thread that could not start) raises that, and the flush after it neither waits for
    those rows nor publishes them; rows submitted later are written as ever."""
    first, lost, later = (f"blake3:{digit * 64}" for digit in "abc")
    writer = Writer(store, linger=0.0, pending_bytes=64)
    writer.submit([first], torch.ones(1, 4))
    writer.flush()

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    backlog = writer._backlog
    if where == "starting":
        writer.close()  # the next submit starts the thread again
        monkeypatch.setattr(Writer, "_start", interrupted)
    elif backlog.pool is not None:
        monkeypatch.setattr(backlog.pool, "to_host", interrupted)
    else:
        monkeypatch.setattr(writer_module, "_Plain", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            writer.submit([lost], torch.full((1, 4), 2.0))
        assert _within(writer.flush) is None
        monkeypatch.undo()
        writer.submit([later], torch.full((1, 16), 3.0))  # fits only if nothing is still counted
        assert _within(writer.flush) is None
        assert store.have([first, lost, later]) == {first, later}
        assert writer.kept_rows == 2 and writer.failed_rows == 0
        writer.close()
    finally:
        backlog.closed = True  # should this fail, the exit of the test run does not wait


def _part_grown_past(store: Store, size: int) -> int:
    """The bytes of the one file the store's writer is writing in ``tmp/``, once more than
    ``size``; fails the test if it is not within 30 seconds."""
    tmp = Path(store.root) / "tmp"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parts = list(tmp.glob("*.part")) if tmp.exists() else []
        with contextlib.suppress(FileNotFoundError):
            grown = sum(part.stat().st_size for part in parts)
            if len(parts) == 1 and grown > size:
                return grown
        time.sleep(0.01)
    raise AssertionError(f"no file in {tmp} grew past {size} bytes")


def test_the_writer_writes_each_batch_as_it_comes_and_publishes_the_pack_at_the_end(
    store: Store,
) -> None:
    """Rows gathered for one pack are written to the store's ``tmp/`` batch by batch as
    they are submitted, while the thread lingers for more, found by no lookup there; a
    flush publishes them, leaving only the rename and the index to do."""
    writer = Writer(store, linger=60.0)
    keys = [f"blake3:{i:064x}" for i in range(128)]
    writer.submit(keys[:64], torch.randn(64, 256))
    first = _part_grown_past(store, 0)
    assert first > 64 * 256 * 4  # the rows, each with its header
    writer.submit(keys[64:], torch.randn(64, 256))
    assert _part_grown_past(store, first) == 2 * first
    assert Store(store.root).have(keys) == set()  # type: ignore[attr-defined]
    assert _within(writer.flush) is None
    assert not list((Path(store.root) / "tmp").iterdir())  # type: ignore[attr-defined]
    fresh = Store(store.root)  # type: ignore[attr-defined]
    assert fresh.have(keys) == set(keys)
    assert len({fresh.answer(key).value for key in keys}) == 1  # type: ignore[union-attr]
    writer.close()


def test_a_batch_written_gives_its_staging_buffer_back_and_is_recalled_from_its_encoding(
    store: Store,
) -> None:
    """Once a batch is in the pack being written, its staging buffer goes back to the pool
    (the next batch of its size takes it, where a first epoch made a new one a batch until
    the pack was out), and its rows, not yet published, are recalled from the buffer they
    were encoded into, as they were computed."""
    writer = Writer(store, linger=60.0)
    pool = writer._backlog.pool
    assert pool is not None
    keys = [f"blake3:{i:064x}" for i in range(6 * 32)]
    batches = [torch.randn(32, 8, 4).permute(0, 2, 1) for _ in range(6)]  # laid out otherwise
    written = 0
    for at, batch in enumerate(batches):
        writer.submit(keys[at * 32 : (at + 1) * 32], batch)
        written = _part_grown_past(store, written)
        # The writer gives the buffer back just after the batch's bytes reach the file.
        deadline = time.monotonic() + 30
        while pool.in_use_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
    assert pool.stats.allocations == 1 and pool.stats.reuses == 5
    asked = {position: keys[slot] for position, slot in enumerate([40, 3, 191, 100])}
    found = writer.recall(asked)
    assert found is not None
    positions, recalled = found
    whole = torch.cat(batches)
    assert torch.equal(recalled, whole[[[40, 3, 191, 100][p] for p in positions]])
    assert Store(store.root).have(keys) == set()  # type: ignore[attr-defined]
    assert _within(writer.flush) is None
    assert Store(store.root).have(keys) == set(keys)  # type: ignore[attr-defined]
    writer.close()


def _full_at_batch(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Has a directory's joined write find the disk full as it writes its ``count``-th batch."""
    written = 0
    real = local_joined.steady_runs

    def full_then(*args: Any, **kwargs: Any) -> Any:
        nonlocal written
        written += 1
        if written == count:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(local_joined, "steady_runs", full_then)


def test_a_batch_that_fails_to_write_fails_every_row_gathered_with_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose write fails (the disk full) after earlier ones of its pack were written
    to ``tmp/`` fails them all, as one write: flush raises for every row, none is kept or
    left in ``tmp/``, and the thread goes on to write later rows."""
    _full_at_batch(2, monkeypatch)
    writer = Writer(store, linger=60.0)
    keys = [f"blake3:{i:064x}" for i in range(80)]
    writer.submit(keys[:64], torch.randn(64, 256))
    _part_grown_past(store, 0)
    writer.submit(keys[64:72], torch.randn(8, 256))
    raised = _within(writer.flush)
    assert isinstance(raised, WriteFailed), raised
    assert "72 computed rows could not be written" in str(raised)
    assert "Free space" in str(raised)
    assert not list((Path(store.root) / "tmp").iterdir())  # type: ignore[attr-defined]
    writer.submit(keys[72:], torch.randn(8, 256))
    assert _within(writer.flush) is None
    assert Store(store.root).have(keys) == set(keys[72:])  # type: ignore[attr-defined]
    writer.close()


def test_rows_of_packs_published_before_a_write_failed_are_counted_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write cut into packs (where one fills) publishes each whole as it goes: where the
    disk fills on a later one, the rows of those published are in the store, and are
    counted kept, not failed; only the rest are raised as not written."""
    monkeypatch.setattr(records, "PACK_BYTES", 12 << 10)
    _full_at_batch(3, monkeypatch)
    writer = Writer(store, linger=60.0)
    keys = [f"blake3:{i:064x}" for i in range(24)]
    for at in range(0, 24, 8):
        writer.submit(keys[at : at + 8], torch.randn(8, 256))
    raised = _within(writer.flush)
    kept = Store(store.root).have(keys)  # type: ignore[attr-defined]
    assert 0 < len(kept) < len(keys)  # the packs published before the disk filled
    assert isinstance(raised, WriteFailed), raised
    assert f"{len(keys) - len(kept)} computed rows could not be written" in str(raised)
    assert (writer.kept_rows, writer.failed_rows) == (len(kept), len(keys) - len(kept))
    writer.close()


class _WouldWait(Exception):
    """Raised where a submit would wait for the writer to catch up."""


def test_unwritten_rows_count_with_their_keys(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows not yet written hold their keys as well as their bytes: rows of no bytes count
    a key's worth each, so behind a write that does not end, a submit waits once the
    unwritten rows and keys pass ``pending_bytes`` rather than queue them without end."""
    writing, release = threading.Event(), threading.Event()
    keep = store.keep_joined

    def slow(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        release.wait()
        return keep(*args, **kwargs)

    def would_wait(*args: Any, **kwargs: Any) -> bool:
        raise _WouldWait

    monkeypatch.setattr(store, "keep_joined", slow)
    writer = Writer(store, linger=0.0, pending_bytes=64 << 10)
    keys = [f"blake3:{i:064x}" for i in range(2000)]
    writer.submit(keys[:1000], torch.empty(1000, 0))
    try:
        assert writing.wait(timeout=60)  # the writer is in keep_joined with those rows
        with monkeypatch.context() as waits:
            waits.setattr(writer._backlog.changed, "wait", would_wait)
            with pytest.raises(_WouldWait):
                writer.submit(keys[1000:], torch.empty(1000, 0))
    finally:
        release.set()
    assert _within(writer.flush) is None
    assert store.have(keys) == set(keys[:1000])
    writer.close()


def test_a_forward_interrupted_while_it_queues_its_rows_writes_them_when_run_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while a forward waits to queue its computed rows for the store (the writer
    behind) leaves them in no memory tier: the forward run again computes and queues them,
    and the flush after puts them in the store, not only in memory."""
    cached = cache_rows(mlp(), store)
    queue = Writer.submit

    def interrupted(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(Writer, "submit", queue)  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(Writer, "submit", interrupted)
    x = rows(8)
    with pytest.raises(KeyboardInterrupt):
        cached(x)
    assert torch.equal(cached(x), truth(x))
    cached.flush()
    assert store.have(cached.row_keys(x)) == set(cached.row_keys(x))
    cached.close()


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_a_write_ended_by_a_base_exception_fails_like_any_other(
    store: Store, monkeypatch: pytest.MonkeyPatch, error: type[BaseException]
) -> None:
    """A ``keep_joined`` that raises what is no ``Exception`` (an async bucket's
    CancelledError, a store's KeyboardInterrupt or SystemExit) fails that write as an
    error does: flush raises WriteFailed and the thread goes on to write later rows."""
    failed, later = (f"blake3:{digit * 64}" for digit in "de")

    def ended(*args: Any, **kwargs: Any) -> Any:
        raise error("the write was ended")

    writer = Writer(store, linger=0.0)
    monkeypatch.setattr(store, "keep_joined", ended)
    try:
        writer.submit([failed], torch.ones(1, 4))
        raised = _within(writer.flush)
        assert isinstance(raised, WriteFailed), raised
        assert isinstance(raised.__cause__, error)
        assert "1 computed rows could not be written" in str(raised)
        assert "Free space" not in str(raised)  # nothing says the disk is full
        assert writer.failed_rows == 1
        monkeypatch.undo()
        writer.submit([later], torch.ones(1, 4))
        assert _within(writer.flush) is None
        assert store.have([failed, later]) == {later}
        writer.close()
    finally:
        writer._backlog.closed = True  # should this fail, the exit of the test run does not wait


def test_a_process_whose_write_was_cancelled_exits(tmp_path: Path) -> None:
    """A process whose rows could not be written because the store's call was cancelled
    (asyncio.CancelledError, from an async bucket) exits rather than waiting for them, and
    says at exit that they were not written."""
    script = SHARED + textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from somatize import Store
        from somatize_torch.rows import cache_rows

        def cancelled(*args, **kwargs):
            raise asyncio.CancelledError()

        store = Store(sys.argv[1])
        store.keep_joined = cancelled
        cached = cache_rows(mlp(), store)
        cached(rows(16))
        """
    )
    done = _exits(script, tmp_path / "store")
    assert "16 computed rows could not be written" in done.stderr


def test_a_tier_allocates_no_more_than_its_budget() -> None:
    """Rows of many shapes (sequences of many lengths) each get a bank; together the banks
    allocate no more than the tier's budget, however they grow."""
    tier = Tier("device", "cpu", budget=1 << 20)
    for length in range(1, 41):
        tier.admit([("a", length), ("b", length)], torch.ones(2, length, 64))
    assert 0 < tier.used <= tier.allocated <= tier.budget
    for step in range(200):
        tier.admit([("c", step)], torch.ones(1, 8, 64))
    assert tier.allocated <= tier.budget


def test_rows_of_many_shapes_fill_the_budget() -> None:
    """Banks reserve room in proportion to the rows they hold, and give back what they do
    not use when the budget runs short: rows of 20 shapes, a quarter of the budget, are
    all kept, and rows admitted past it fill it to within a row, never beyond."""
    tier = Tier("device", "cpu", budget=1 << 20)
    for length in range(1, 21):
        keys = [(length, i) for i in range(5)]
        assert tier.admit(keys, torch.ones(5, length, 64)) == 5
    assert tier.rows == 100 and tier.allocated <= tier.budget
    for step in range(10_000):
        row = torch.ones(1, 1 + step % 20, 64)
        if not tier.admit([("more", step)], row):
            break
    else:
        raise AssertionError("a tier of 1 MiB took 10,000 rows of up to 5 KiB")
    assert tier.budget - row.nbytes - ROW_INDEX_BYTES < tier.used <= tier.allocated <= tier.budget


def test_a_tier_of_small_rows_keeps_their_index_within_its_budget() -> None:
    """A row of one float is 4 bytes and the dict entry it is found by many times that: a
    tier counts both, so its rows and their entries (the keys as a cache makes them, a tag
    and a row's digest) take no more memory than its budget."""
    budget = 1 << 20
    tier = Tier("host", "cpu", budget=budget)
    tracemalloc.start()
    try:
        for step in range(1000):
            keys = [(1, (step * 512 + i).to_bytes(32, "little")) for i in range(512)]
            if tier.admit(keys, torch.ones(512, 1)) < 512:
                break
        held, _ = tracemalloc.get_traced_memory()  # the bank's tensor is not traced
    finally:
        tracemalloc.stop()
    assert tier.rows > 1000
    assert held + sum(bank.tensor.nbytes for bank in tier.banks) <= budget
    assert tier.used <= tier.allocated <= tier.budget
    assert tier.used == tier.rows * (4 + ROW_INDEX_BYTES)


class _Interrupting:
    """A key whose hashing raises KeyboardInterrupt, as a Ctrl-C landing there would."""

    def __hash__(self) -> int:
        raise KeyboardInterrupt


class _CountedSlots(dict[Any, int]):
    """A tier's slots that count the rows looked up in them."""

    looked = 0

    def get(self, key: Any, default: Any = None) -> Any:
        type(self).looked += 1
        return super().get(key, default)


def test_a_tier_looks_each_row_up_once_in_a_bank() -> None:
    """A batch some of whose rows a bank holds is looked up there a row once, not once for
    the whole batch and again for the rows found: the rows held and the positions missing
    come back as before."""
    tier = Tier("device", "cpu", budget=1 << 20)
    tier.admit(["a", "b"], torch.arange(8.0).reshape(2, 4))
    tier.slots = _CountedSlots(tier.slots)
    pieces, missing = tier.find(["x", "b", "y", "a"])
    assert _CountedSlots.looked == 4
    assert missing == [0, 2]
    ((positions, got),) = pieces
    assert positions == [1, 3]
    assert torch.equal(got, torch.arange(8.0).reshape(2, 4).flip(0))
    pieces, missing = tier.find(["x", "b", "y", "a"], [1, 3])
    assert missing == [] and pieces[0][0] == [1, 3]


class _HashCounted:
    """A key that counts how many times it is hashed: once a dict lookup."""

    hashed = 0

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        type(self).hashed += 1
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _HashCounted) and other.name == self.name


def test_a_tier_of_many_shapes_looks_each_row_up_once() -> None:
    """Rows of many shapes (sequences padded each batch to its own length) are looked up a
    key once, not once a bank: a batch costs the same however many shapes came before it,
    and its rows come back as they were kept, from one bank or from several."""
    tier = Tier("host", "cpu", budget=1 << 24)
    kept: dict[str, torch.Tensor] = {}
    for length in range(1, 41):
        rows = torch.arange(3.0 * length).reshape(3, length) + 1000 * length
        names = [f"{length}.{i}" for i in range(3)]
        assert tier.admit([_HashCounted(name) for name in names], rows) == 3
        kept.update(zip(names, rows, strict=True))
    assert len(tier.banks) == 40
    for names in (["40.2", "40.0"], ["1.1", "x", "40.0", "17.2", "1.0"]):
        keys = [_HashCounted(name) for name in names]
        _HashCounted.hashed = 0
        pieces, missing = tier.find(keys)
        assert _HashCounted.hashed == len(keys)
        found = {}
        for at, rows in pieces:
            found.update(zip(range(len(keys)) if at is None else at, rows, strict=True))
        assert missing == [p for p, name in enumerate(names) if name not in kept]
        for p, row in found.items():
            assert torch.equal(row, kept[names[p]])
        assert sorted([*found, *missing]) == list(range(len(keys)))


def test_a_full_tier_of_many_shapes_trims_each_bank_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tier short of room has its other banks give back the room they do not use once,
    not again at every batch that does not fit; what it counts as allocated stays what its
    banks hold room for, and within its budget."""
    trimmed: list[Bank] = []
    trim = Bank.trim

    def counted_trim(bank: Bank) -> int:
        trimmed.append(bank)
        return trim(bank)

    monkeypatch.setattr(Bank, "trim", counted_trim)
    tier = Tier("host", "cpu", budget=40 * 8 * (4 * 40 + ROW_INDEX_BYTES))
    for length in range(1, 41):
        tier.admit([(length, i) for i in range(8)], torch.ones(8, length))
    refused = 0
    for turn in range(5):
        refused += 16 - tier.admit([("more", turn, i) for i in range(16)], torch.ones(16, 40))
    assert refused > 0  # the tier was short of room at every batch but the first
    assert len(trimmed) == len(set(map(id, trimmed))) <= 40
    assert tier.allocated == sum(bank.tensor.shape[0] * bank.row_bytes for bank in tier.banks)
    assert tier.used <= tier.allocated <= tier.budget


def test_rows_interrupted_while_admitted_are_never_recalled_wrong() -> None:
    """A Ctrl-C while a tier records the keys of rows it admits leaves none of those keys
    pointing at a row: rows admitted after are recalled as themselves, and the keys of the
    interrupted rows are found nowhere (computed again) rather than recalled as others."""
    tier = Tier("device", "cpu", budget=1 << 20)
    tier.admit([("a", 0)], torch.zeros(1, 4))
    keys: list[Any] = [("a", 1), ("a", 2), _Interrupting(), ("a", 4)]
    with pytest.raises(KeyboardInterrupt):
        tier.admit(keys, torch.ones(4, 4))
    later = [("b", i) for i in range(4)]
    assert tier.admit(later, torch.arange(16.0).reshape(4, 4) + 2) == 4
    for key, slot in tier.slots.items():
        bank = [bank for bank in tier.banks if bank.base <= slot][-1]
        assert slot < bank.base + bank.used, key
    pieces, missing = tier.find([("a", 0), ("a", 1), ("a", 2), *later])
    assert missing == [1, 2]
    found = {at: row for positions, got in pieces for at, row in zip(positions, got, strict=True)}
    assert torch.equal(found[0], torch.zeros(4))
    for i in range(4):
        assert torch.equal(found[3 + i], torch.arange(4.0) + 4 * i + 2)


def test_rows_of_no_elements_are_kept_and_recalled(store: Store) -> None:
    """A module whose rows have no elements answers every batch, new or recalled."""
    empty = cache_rows(_Nothing(), store)
    for seed in (1, 2, 1):
        assert empty(rows(3, seed=seed)).shape == (3, 0)
    assert empty.stats.computed == 6 and empty.stats.from_device == 3
    empty.close()


class _Nothing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :0]


def test_rows_computed_under_inference_mode_leave_the_cache_usable(store: Store) -> None:
    """A validation pass under ``torch.inference_mode`` (Lightning's default) that makes or
    grows a bank does not leave tensors behind that a later forward outside it cannot
    append to."""
    cached = cache_rows(mlp(), store)
    with torch.inference_mode():
        assert torch.equal(cached(rows(8)), truth(rows(8)))
    x = rows(8, seed=2)
    assert torch.equal(cached(x), truth(x))
    with torch.inference_mode():
        big = rows(300, seed=3)  # grows the bank past its first size
        assert torch.equal(cached(big), truth(big))
    y = rows(5, seed=4)
    assert torch.equal(cached(y), truth(y))
    assert cached.stats.computed == 8 + 8 + 300 + 5
    cached.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_epoch_two_stays_on_the_device(store: Store) -> None:
    """On CUDA the device tier lives on the GPU, recalls stay there, and the rows staged
    through pinned memory reach the store intact."""
    module = mlp().cuda()
    cached = cache_rows(module, store)
    x = rows(64).cuda()
    first = cached(x)
    again = cached(x)
    assert cached.tiers[0].device.type == "cuda" and again.is_cuda
    assert torch.equal(first, again)
    cached.flush()
    fresh = cache_rows(mlp().cuda(), Store(store.root))  # type: ignore[attr-defined]
    assert torch.equal(fresh(x), first)
    assert fresh.stats.from_store == 64
    cached.close()
    fresh.close()


def _staged_rows_recalled(store: Store, device: str) -> None:
    """Six batches computed on ``device`` by a cache whose writer lingers: once each is in
    the pack being written, its staging buffer goes back to the pool (one or two made
    in all), and a batch not yet published is recalled from the writer onto ``device``
    as it was computed, then from the store by a fresh cache."""
    cached = cache_rows(mlp().to(device), store, device_bytes=0, host_bytes=0)
    writer = cached._writer
    assert writer is not None and writer._backlog.pool is not None
    writer.linger = 60.0
    batches = [rows(64, seed=seed).to(device) for seed in range(6)]
    firsts, written = [], 0
    for x in batches:
        firsts.append(cached(x))
        written = _part_grown_past(store, written)
    assert writer._backlog.pool.stats.allocations <= 2
    again = cached(batches[3])
    assert cached.stats.from_pending == 64 and again.device == firsts[3].device
    assert torch.equal(again, firsts[3])
    cached.flush()
    fresh = cache_rows(mlp().to(device), Store(store.root))  # type: ignore[attr-defined]
    assert torch.equal(fresh(batches[5]), firsts[5]) and fresh.stats.from_store == 64
    cached.close()
    fresh.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_staged_rows_give_their_pinned_buffer_back_and_are_recalled_whole(
    store: Store,
) -> None:
    """On CUDA, rows staged through pinned memory give their buffer back once encoded: a
    first epoch page-locks one or two, not one a batch; rows not yet published are
    recalled onto the device whole (:func:`_staged_rows_recalled`)."""
    _staged_rows_recalled(store, "cuda")


class _SlowOnTheDevice(nn.Module):
    """Doubles its rows after keeping the device busy a while: rows copied to the host
    without waiting for it would be read before they are written."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(200_000_000)
        return x * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_rows_spilled_to_the_host_tier_are_recalled_whole(store: Store) -> None:
    """Rows computed on the GPU that do not fit in the device tier are kept in the host
    tier as the device wrote them, however long the device takes to write them."""
    row_bytes = 1024 * 4 + ROW_INDEX_BYTES  # a row and its entry in the tier's dict
    cached = cache_rows(_SlowOnTheDevice().cuda(), None, device_bytes=4 * row_bytes)
    cached(torch.randn(4, 1024, device="cuda"))  # fills the device tier; its rows are checked
    x = torch.randn(64, 1024, device="cuda")
    first = cached(x)  # no check waits for these: they go to the host tier as they come
    device, host = cached.tiers
    assert device.rows == 4 and host.rows == 64 and host.device.type == "cpu"
    again = cached(x)
    assert cached.stats.from_host == 64
    assert torch.equal(first, x * 2) and torch.equal(again, x * 2)
    cached.close()


def test_one_cache_called_from_two_threads_recalls_each_rows_own_answer() -> None:
    """Two threads calling one cache at once (a threaded server): the tiers are looked up
    and grown under the cache's lock, so no row is kept at a slot the other thread writes,
    nothing raises, and every row recalled afterwards is the module's answer for it."""
    module = nn.Sequential(nn.Linear(16, 256))
    cached = cache_rows(module, device_bytes=1 << 30, host_bytes=0)
    cached(rows(4))
    raised: list[BaseException] = []
    batches = {seed: [rows(128, seed * 100 + i) for i in range(16)] for seed in (1, 2)}

    def work(seed: int) -> None:
        try:
            for x in batches[seed]:
                cached(x)
        except BaseException as error:  # seen in the test's thread, below
            raised.append(error)

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: the window a race needs is small
    try:
        threads = [threading.Thread(target=work, args=(seed,)) for seed in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
    assert raised == []
    before = cached.stats.computed
    for xs in batches.values():
        for x in xs:
            with torch.no_grad():
                torch.testing.assert_close(cached(x), module(x))
    assert cached.stats.computed == before  # all of them from memory
    assert cached.tiers[0].rows == 4 + 2 * 16 * 128


@contextlib.contextmanager
def _writes_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every write of every writer waits, its rows staged and queued, until the event
    yielded is set (at the latest when the block ends)."""
    release = threading.Event()
    write = writer_module._Backlog.write

    def held(backlog: Any, jobs: Any) -> None:
        assert release.wait(timeout=60)
        write(backlog, jobs)

    monkeypatch.setattr(writer_module._Backlog, "write", held)
    try:
        yield release
    finally:
        release.set()


def _tally_computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each run of a cached module was handed, in a list filled as they run."""
    from somatize_torch import _row_lookup

    ran: list[int] = []
    compute = _row_lookup._compute

    def counted(cache: Any, x: Any, once: Any, *how: Any) -> torch.Tensor:
        ran.append(len(once))
        return compute(cache, x, once, *how)

    monkeypatch.setattr(_row_lookup, "_compute", counted)
    return ran


def test_rows_still_to_be_written_are_recalled_not_computed_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows in no memory tier (budgets of 0) whose write has not landed yet are recalled
    from the writer's staged copy, counted as ``from_pending``: the module runs on none of
    them, and they answer the same bits. Rows among them that are new run alone, and a
    flush then puts every row in the store."""
    ran = _tally_computed(monkeypatch)
    cached = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x, more = rows(8), rows(4, seed=2)
    with _writes_held(monkeypatch):
        first = cached(x)
        shuffled = torch.tensor([3, 1, 4, 0, 5, 2, 7, 6])
        again = cached(x[shuffled])
        assert sum(ran) == 8
        assert torch.equal(again, first[shuffled])
        mixed = cached(torch.cat([x[:3], more]))
        assert sum(ran) == 12
        assert torch.equal(mixed, torch.cat([first[:3], truth(more)]))
        stats = cached.stats
        assert (stats.from_pending, stats.computed, stats.recalled) == (11, 12, 11)
        assert store.have(cached.row_keys(x)) == set()
        # Rows of two writes, interleaved in one batch.
        later = rows(4, seed=3)
        both = torch.cat([cached(later), first[:4]])
        interleaved = torch.tensor([4, 0, 5, 1, 6, 2, 7, 3])
        assert torch.equal(cached(torch.cat([later, x[:4]])[interleaved]), both[interleaved])
        assert sum(ran) == 16 and cached.stats.from_pending == 19
    cached.flush()
    keys = cached.row_keys(torch.cat([x, more, later]))
    assert store.have(keys) == set(keys)
    assert torch.equal(cached(x), first) and sum(ran) == 16  # from the store now
    assert cached.stats.from_store == 8
    cached.close()


def test_rows_recalled_before_their_write_fails_are_reported_then_computed_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows recalled while their write is under way answer right even if the write then
    fails; the failure is raised at the flush as any other, the rows are not recalled from
    the copy that never landed, and the next forward computes them again and writes them."""
    ran = _tally_computed(monkeypatch)
    keep = store.keep_joined

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "keep_joined", full)
    cached = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x = rows(8)
    keys = cached.row_keys(x)
    with _writes_held(monkeypatch):
        first = cached(x)
        assert torch.equal(cached(x), first) and sum(ran) == 8
    with pytest.raises(WriteFailed, match="8 computed rows could not be written") as caught:
        cached.flush()
    said = str(caught.value)
    assert "in no memory tier are computed and written again" in said
    assert "still correct in memory" not in said  # these are in no memory tier
    monkeypatch.setattr(store, "keep_joined", keep)
    assert store.have(keys) == set()
    assert torch.equal(cached(x), first) and sum(ran) == 16
    cached.flush()
    assert store.have(keys) == set(keys)
    cached.close()


@pytest.mark.parametrize("kind", ["channels_last", "pooled", "transposed"])
def test_rows_still_to_be_written_are_recalled_laid_out_as_computed(
    store: Store, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Rows recalled from the writer's staged copy (staged as the module laid them out) come
    back with the strides the module gave them, whole or beside rows computed."""

    module, data, strides = laid_out_otherwise(kind)
    cached = cache_rows(module, store, device_bytes=0, host_bytes=0)
    with _writes_held(monkeypatch):
        cached(data[:8])
        for batch in (data[:8], data[2:10]):  # whole, then beside rows computed
            out = cached(batch)
            assert out.stride() == strides
            assert torch.equal(out, module(batch))
        assert cached.stats.from_pending == 14
    cached.flush()
    cached.close()


def test_rows_with_gaps_still_to_be_written_are_recalled_dense_in_their_order(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows a module answers in channels_last with gaps (a half of a channels_last map)
    are staged dense in channels_last, and recalled from there so, whole or beside rows
    computed: a conv reading them answers as it does the computed ones."""
    torch.manual_seed(0)
    module = HalfOfMap()
    after = nn.Conv2d(8, 4, 3, padding=1)
    data = torch.randn(12, 3, 6, 6).to(memory_format=torch.channels_last)
    cached = cache_rows(module, store, device_bytes=0, host_bytes=0)
    with _writes_held(monkeypatch), torch.no_grad():
        cached(data[:8])
        for batch in (data[:8], data[2:10]):  # whole, then beside rows computed
            out, computed = cached(batch), module(batch)
            assert out.is_contiguous(memory_format=torch.channels_last)
            answered, again = after(computed), after(out)
            assert torch.equal(out, computed)
            assert again.stride() == answered.stride() and torch.equal(again, answered)
        assert cached.stats.from_pending == 14
    cached.flush()
    cached.close()


def test_unwritten_rows_hold_no_more_than_they_count(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the writer holds for a row not yet written — its key as a cache makes it, and
    the entry a lookup finds it by — is no more than the row counts against
    ``pending_bytes``: rows of no bytes behind a write that does not end hold at most
    ``KEY_BYTES`` each."""
    count = 43691  # just past a resize of the dict: the most room per entry
    with _writes_held(monkeypatch):
        writer = Writer(store, linger=0.0)
        writer.submit(["blake3:" + "0" * 64], torch.empty(1, 0))  # the thread, held
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            keys = [f"blake3:{i:064x}" for i in range(count)]
            writer.submit(keys, torch.empty(count, 0))
            del keys
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert held - before <= count * writer_module.KEY_BYTES
    writer.close()


def test_a_forward_of_rows_still_staged_does_not_wait_for_the_store(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows staged for the store and in no memory tier are recalled without asking the
    store: a forward of them returns while another write holds the store."""
    cached = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x = rows(8)
    with _writes_held(monkeypatch):
        first = cached(x)
        got: list[torch.Tensor] = []
        with _held_by_another_thread(store_lock(store)):
            assert _within(lambda: got.append(cached(x))) is None
        assert torch.equal(got[0], first) and cached.stats.from_pending == 8
    cached.flush()
    cached.close()


def test_a_forward_reading_the_store_does_not_wait_for_a_write_in_progress(
    store: Store,
) -> None:
    """Rows the store has and no memory tier holds are read from it while the writer
    thread writes other rows through the same store object (here: holds the lock it
    writes under): a store of somatize's own may be read while it is written, so a
    forward waits for no write, as it otherwise would at each batch of a first epoch."""
    assert store.shared_by_threads
    cached = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x = rows(8)
    first = cached(x)
    cached.flush()
    got: list[torch.Tensor] = []
    with _held_by_another_thread(store_lock(store)):
        assert _within(lambda: got.append(cached(x)), seconds=20) is None
    assert torch.equal(got[0], first) and cached.stats.from_store == 8
    cached.close()


class _OneThreadStore(LocalStore):
    """A store that says one thread may not read it while another writes through it."""

    shared_by_threads = False


def test_a_store_not_shared_by_threads_is_read_under_the_lock_its_writes_hold(
    tmp_path: Path,
) -> None:
    """A store that may not be read while another thread writes through it is read by a
    forward only under the lock the writer thread holds as it writes: the forward waits
    for the write in progress, then reads."""
    store = _OneThreadStore(tmp_path / "store")
    cached = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x = rows(8)
    first = cached(x)
    cached.flush()
    got: list[torch.Tensor] = []
    reader = threading.Thread(target=lambda: got.append(cached(x)), daemon=True)
    with _held_by_another_thread(store_lock(store)):
        reader.start()
        reader.join(timeout=0.5)
        assert reader.is_alive() and not got  # waiting for the lock, not reading
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert torch.equal(got[0], first) and cached.stats.from_store == 8
    cached.close()


class _CallsOutsideLock(_OneThreadStore):
    """A store not shared by threads that notes each answer call made without its lock."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.unlocked: list[str] = []

    def _note(self, method: str) -> None:
        if not store_lock(self).held_here():
            self.unlocked.append(method)

    def have(self, keys: Any) -> set[str]:
        self._note("have")
        return super().have(keys)

    def recall(self, key: str) -> Any:
        self._note("recall")
        return super().recall(key)

    def recall_many(self, keys: Any, *, borrow: bool = False) -> Any:
        self._note("recall_many")
        return super().recall_many(keys, borrow=borrow)

    def keep(self, key: str, data: Any, codec: str, fingerprint: str | None = None) -> Any:
        self._note("keep")
        return super().keep(key, data, codec, fingerprint)

    def keep_many(self, items: Any, codec: str, fingerprint: str | None = None) -> Any:
        self._note("keep_many")
        return super().keep_many(items, codec, fingerprint)


class _Squares(Node):
    def forward(self, xs: list[int], ctx: Any) -> list[int]:
        return [x * x for x in xs]


class _Total(Node):
    def forward(self, xs: list[int], ctx: Any) -> int:
        return sum(xs)


def test_a_graph_forward_calls_a_store_not_shared_by_threads_under_its_lock(
    tmp_path: Path,
) -> None:
    """A graph's forward over a store that may not be read while another thread writes
    through it (a row cache's writer, over the same store) calls it only under the lock
    that writer holds as it writes: its calls never overlap a write in progress."""
    store = _CallsOutsideLock(tmp_path / "store")
    cached = cache_rows(mlp(), store)
    cached(rows(8))  # a writer thread for this store, writing behind the forwards
    graph = Graph.somatize(
        _Squares().named("squares").frozen().mapped().cached()
        >> _Total().named("total").frozen().cached()
    )
    for handed in ([1, 2], [1, 2], [1, 2, 3]):  # kept, recalled, then partly recalled
        assert graph.forward(handed, store=store) == sum(x * x for x in handed)
    cached.flush()
    cached.close()
    assert store.unlocked == []


class _ComparedByHome(CountingStore):
    """A store of a user's own, not shared by threads, that compares by the store it
    reads, as a dataclass compares by its fields: equal stores, and no hash."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ComparedByHome) and other.inner is self.inner

    __hash__ = None  # type: ignore[assignment]


def test_a_store_of_one_s_own_compared_by_value_is_locked_as_its_own_object(
    tmp_path: Path,
) -> None:
    """A store not shared by threads that compares by value, and so has no hash, is called
    by a graph and a row cache under a lock of its own object: the forwards run (where
    they stopped on `unhashable type`), and an equal store is another object, locked apart."""
    store = _ComparedByHome(LocalStore(tmp_path / "store"))
    twin = _ComparedByHome(store.inner)
    cached = cache_rows(mlp(), store)
    first = cached(rows(8))
    graph = Graph.somatize(_Total().named("total").frozen().cached())
    assert graph.forward([1, 2], store=store) == graph.forward([1, 2], store=twin) == 3
    cached.flush()
    again = cache_rows(mlp(), twin)
    assert torch.equal(again(rows(8)), first)
    assert store_lock(store) is store_lock(store) is not store_lock(twin)
    cached.close()
    again.close()
    held = weakref.ref(twin)
    del again, twin
    gc.collect()
    assert held() is None  # its lock holds no store alive


def test_stats_reset_during_a_forward_count_its_rows_once_and_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reset_stats`` on another thread while a forward runs (a threaded server's metrics)
    counts that forward's rows in one period or the other, whole: none is lost, and each
    period's rows are its recalled rows and its computed ones."""
    from somatize_torch import _row_lookup

    cached = cache_rows(mlp(), store)
    x = rows(8)
    cached(x[:4])
    compute = _row_lookup._compute
    periods: list[Any] = []

    def reset_meanwhile(cache: Any, *args: Any) -> torch.Tensor:
        resetter = threading.Thread(target=lambda: periods.append(cached.reset_stats()))
        resetter.start()
        resetter.join()
        return compute(cache, *args)

    monkeypatch.setattr(_row_lookup, "_compute", reset_meanwhile)
    cached(x)  # 4 rows from memory, 4 computed
    periods.append(cached.stats)
    assert [p.rows for p in periods] in ([4, 8], [12, 0])
    for period in periods:
        assert period.rows == period.recalled + period.computed
    cached.close()


def test_rows_kept_while_stats_are_reset_are_counted_in_one_period(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that ends while ``reset_stats`` runs (the writer thread keeps rows between
    two reads of its counts) is counted in one period or the other: the rows kept of the
    two add up to every row the writer kept."""
    cached = cache_rows(mlp(), store)
    cached(rows(8))
    cached.flush()
    account = cached._writer._account  # type: ignore[union-attr]
    plain = Writer.kept_rows
    landed: list[bool] = []

    def read(writer: Writer) -> int:
        value: int = plain.fget(writer)  # type: ignore[attr-defined]
        if not landed:  # the writer thread keeps 4 more rows right after this read
            landed.append(True)
            account.kept_rows += 4
        return value

    monkeypatch.setattr(Writer, "kept_rows", property(read))
    before = cached.reset_stats()
    monkeypatch.undo()
    after = cached.stats
    assert before.rows_kept + after.rows_kept == account.kept_rows == 12
    cached.close()


def test_a_period_reset_while_its_rows_are_written_counts_them_kept(store: Store) -> None:
    """``reset_stats`` at an epoch's end, its rows still being written behind the steps,
    counts them kept in that epoch: not as rows the next epoch kept while it computed none."""
    cached = cache_rows(mlp(), store)
    cached(rows(4))
    cached.flush()
    cached.reset_stats()
    # The writer gathers rows until a flush or a long pause: these are not written yet.
    cached._writer.linger = 3600.0  # type: ignore[union-attr]
    for seed in (2, 3, 4):
        cached(rows(4, seed=seed))
    epoch = cached.reset_stats()
    assert (epoch.computed, epoch.rows_kept, epoch.rows_failed) == (12, 12, 0)
    assert epoch.bytes_kept >= 12 * 8 * 4  # 8 float32 a row, and their headers
    cached.flush()
    assert (cached.stats.rows_kept, cached.stats.bytes_kept) == (0, 0)
    cached.close()


@pytest.mark.parametrize("opened", ["same object", "opened again"])
def test_two_caches_of_one_store_recall_each_others_unwritten_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch, opened: str
) -> None:
    """Two caches over one store (the same module cached twice, a training and a validation
    cache) share its writer: rows one computed and staged, not yet written, the other
    recalls from that staged copy (``from_pending``) instead of computing them again, and
    a flush of either puts them in the store."""
    ran = _tally_computed(monkeypatch)
    other = store if opened == "same object" else Store(store.root)
    first = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    second = cache_rows(mlp(), other, device_bytes=0, host_bytes=0)
    x = rows(8)
    with _writes_held(monkeypatch):
        answered = first(x)
        out = second(x[[3, 1, 0]])
        assert sum(ran) == 8, "rows staged by the other cache were computed again"
        assert (second.stats.from_pending, second.stats.computed) == (3, 0)
        assert torch.equal(out, answered[[3, 1, 0]])
    second.flush()
    keys = first.row_keys(x)
    assert Store(store.root).have(keys) == set(keys)
    assert (first.stats.rows_kept, second.stats.rows_kept) == (8, 0)
    first.close()
    second.close()


class Halves(nn.Module):
    """A module of this file's own: a fingerprint of its own code, which torch's lack."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :4] * 0.5


def test_a_failed_write_is_told_to_the_cache_whose_rows_failed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two caches of two modules share their store's writer: a write of one's rows that
    fails is raised by that one's flush and forward, not by the other's, whose rows are
    written; flushes of both on two threads at once both return."""
    first = cache_rows(mlp(), store)
    second = cache_rows(Halves(), store)
    keep = store.keep_joined

    def refuses_the_first(
        keys: Any, data: Any, lengths: Any, codec: str, fingerprint: str | None = None
    ) -> None:
        if fingerprint == first._fingerprint:
            raise OSError(errno.ENOSPC, "No space left on device")
        keep(keys, data, lengths, codec, fingerprint)

    assert first._fingerprint != second._fingerprint
    monkeypatch.setattr(store, "keep_joined", refuses_the_first)
    x, y = rows(8), rows(6, seed=2)
    with _writes_held(monkeypatch):
        first(x)
        second(y)
        raised: dict[str, BaseException | None] = {}
        flushers = [
            threading.Thread(target=lambda c=cache, n=name: raised.update({n: _within(c.flush)}))
            for name, cache in (("first", first), ("second", second))
        ]
        for thread in flushers:
            thread.start()
    for thread in flushers:
        thread.join(timeout=60)
    assert isinstance(raised["first"], WriteFailed), raised
    assert "8 computed rows could not be written" in str(raised["first"])
    assert raised["second"] is None
    assert (first.stats.rows_failed, second.stats.rows_failed) == (8, 0)
    assert (first.stats.rows_kept, second.stats.rows_kept) == (0, 6)
    assert store.have(second.row_keys(y)) == set(second.row_keys(y))
    assert store.have(first.row_keys(x)) == set()
    second(rows(2, seed=3))  # nothing of its own failed
    monkeypatch.setattr(store, "keep_joined", keep)
    first.flush()  # raised already
    second.flush()
    first.close()
    second.close()


def test_rows_recalled_from_another_caches_failed_write_are_reported_by_the_recaller(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows one cache recalled from the staged copy of another cache's write answer right,
    but when that write fails they never reach the store: the recalling cache's flush says
    so (those rows are its answers too), and so does the other's, for its own."""
    keep = store.keep_joined

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    first = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    second = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    x = rows(8)
    monkeypatch.setattr(store, "keep_joined", full)
    with _writes_held(monkeypatch):
        first(x)
        second(x[[3, 1, 0]])
        assert (second.stats.from_pending, second.stats.computed) == (3, 0)
    with pytest.raises(WriteFailed, match="3 rows recalled from another cache") as caught:
        second.flush()
    assert "computed rows" not in str(caught.value)
    with pytest.raises(WriteFailed, match="8 computed rows could not be written"):
        first.flush()
    assert (first.stats.rows_failed, second.stats.rows_failed) == (8, 0)
    monkeypatch.setattr(store, "keep_joined", keep)
    second.flush()  # raised already
    second(x[[3, 1, 0]])  # computed again, and written this time
    second.flush()
    keys = first.row_keys(x)
    assert store.have(keys) == {keys[3], keys[1], keys[0]}
    first.close()
    second.close()


def test_a_recalling_cache_is_told_of_a_failure_at_its_next_forward(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write of rows another cache recalled is raised at that cache's next forward,
    as a failure of its own rows is, when no flush has raised it yet."""

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    first = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    second = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    monkeypatch.setattr(store, "keep_joined", full)
    with _writes_held(monkeypatch):
        first(rows(8))
        second(rows(8)[:2])
    with pytest.raises(WriteFailed):
        first.flush()
    with pytest.raises(WriteFailed, match="2 rows recalled from another cache"):
        second(rows(1, seed=5))
    first.close()
    with contextlib.suppress(WriteFailed):
        second.close()


def test_a_cache_dropped_beside_another_of_its_store_leaves_it_writing(store: Store) -> None:
    """One of two caches over a store dropped while the other goes on: what the dropped one
    computed is written, and so is what the other computes after, its flush returning."""
    first = cache_rows(mlp(), store)
    second = cache_rows(mlp(), store)
    x, y = rows(8), rows(8, seed=2)
    first(x)
    keys = first.row_keys(x)
    del first
    gc.collect()
    for seed in range(3, 6):  # rows submitted after the dropped writer's signal
        second(rows(4, seed=seed))
    second(y)
    assert _within(second.flush) is None
    assert Store(store.root).have(keys) == set(keys)
    assert Store(store.root).have(second.row_keys(y)) == set(second.row_keys(y))
    assert second.stats.rows_kept == 20
    second.close()


def _two_caches_in_child(first: Any, second: Any) -> tuple[int, int, list[str]]:
    """In a forked child: ``first`` computes rows whose write is held, ``second`` asks for
    them; what ``second`` recalled from the staged copy and computed, and the rows' keys."""
    release = threading.Event()
    write = writer_module._Backlog.write

    def held(backlog: Any, jobs: Any) -> None:
        assert release.wait(timeout=60)
        write(backlog, jobs)

    writer_module._Backlog.write = held  # type: ignore[method-assign]
    try:
        before = second.stats
        x = rows(8, seed=11)
        first(x)
        second(x)
        after = second.stats
    finally:
        release.set()
        writer_module._Backlog.write = write  # type: ignore[method-assign]
    second.flush()
    keys: list[str] = first.row_keys(x)
    return after.from_pending - before.from_pending, after.computed - before.computed, keys


def test_caches_of_one_store_in_a_forked_worker_share_the_workers_writer(
    store: Store,
) -> None:
    """Two caches over one store handed to a forked worker share a writer of the worker's
    own: what one computed there the other recalls from its staged copy, and it is written
    from the worker, while the parent's writer thread runs on."""
    first = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    second = cache_rows(mlp(), Store(store.root), device_bytes=0, host_bytes=0)
    first(rows(4))  # the parent's writer thread is running
    pending, computed, keys = in_forked_child(_two_caches_in_child, first, second)
    assert (pending, computed) == (8, 0)
    assert Store(store.root).have(keys) == set(keys)
    first.close()
    second.close()


def _first_forwards_on_two_threads(cached: Any) -> tuple[str, int]:
    """In a forked child whose store refuses every write: two threads run their first
    forwards at once, the first to take up the child's writer slowed as it does; what a
    flush then raises, and how many rows the cache counts failed."""

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    cached.store.keep_joined = full
    afresh, slowed = writer_module._Account.afresh, [False]

    def slow(account: Any) -> Any:
        if not slowed[0]:
            slowed[0] = True
            time.sleep(0.5)  # the other thread starts meanwhile
        return afresh(account)

    writer_module._Account.afresh = slow  # type: ignore[method-assign]
    threads = [threading.Thread(target=cached, args=(rows(8, seed=seed),)) for seed in (21, 22)]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for thread in threads:
        thread.join()
    try:
        cached.flush()
    except WriteFailed as why:
        said = str(why)
    else:
        said = "returned"
    return said, cached.stats.rows_failed


def test_a_forked_workers_first_forwards_on_two_threads_lose_no_failure(store: Store) -> None:
    """Two threads of a forked worker making their first forwards at once take up one
    writer of the worker's: a write of either's rows that fails is counted and raised by
    the flush after, none of it lost with a second copy of the cache's counts."""
    cached = cache_rows(mlp(), store)
    cached(rows(4))
    cached.flush()
    said, failed = in_forked_child(_first_forwards_on_two_threads, cached)
    assert "16 computed rows could not be written" in said
    assert failed == 16
    cached.close()


def test_a_cache_stages_its_rows_in_a_pool_as_large_as_its_own_over_a_store_shared(
    store: Store,
) -> None:
    """A cache over a store whose writer a smaller one made first (a writer with a small
    budget of unwritten bytes) stages its rows in a pool grown to its own budget, not
    in transient pageable buffers the smaller pool cannot hold."""
    small = Writer(store, linger=0.0, pending_bytes=64)
    cached = cache_rows(mlp(), store)
    assert cached._writer is not None and cached._writer._backlog is small._backlog
    pool = small._backlog.pool
    assert pool is not None
    before = pool.stats.overflows
    for seed in range(3):
        cached(rows(512, seed=seed))
    cached.flush()
    assert pool.stats.overflows == before
    cached.close()
    small.close()


def test_a_writer_asking_other_settings_than_another_of_its_store_is_refused(
    store: Store,
) -> None:
    """``linger`` and ``pack_bytes`` are the store's, for every writer of it: a second
    writer asking for others than a live one asked for is refused, naming the setting,
    rather than change the first's under it or have its own ignored; asking for the same,
    or nothing, is taken, and so is a setting once the writer that asked is gone."""
    first = Writer(store, linger=0.0, pack_bytes=1 << 20)
    with pytest.raises(ValueError, match="linger"):
        Writer(Store(store.root), linger=5.0)
    with pytest.raises(ValueError, match="pack_bytes"):
        Writer(store, pack_bytes=2 << 20)
    assert (first.linger, first.pack_bytes) == (0.0, 1 << 20)
    same = Writer(store, linger=0.0, pack_bytes=1 << 20)
    plain = Writer(store)
    assert (plain.linger, plain.pack_bytes) == (0.0, 1 << 20)
    same.close()
    del first, same
    gc.collect()
    later = Writer(store, linger=0.5)
    assert plain.linger == 0.5
    later.close()
    plain.close()


def test_a_setting_is_held_while_any_writer_that_asked_for_it_lives(store: Store) -> None:
    """Two writers asking for the same ``linger`` both hold it: once the later is gone, a
    writer asking for another is still refused while the first lives, rather than change
    it under that one."""
    first = Writer(store, linger=0.0)
    second = Writer(store, linger=0.0)
    second.close()
    del second
    gc.collect()
    with pytest.raises(ValueError, match="linger"):
        Writer(store, linger=5.0)
    assert first.linger == 0.0
    first.linger = 0.25  # set on a writer: the store's, for all, asked by that one now
    with pytest.raises(ValueError, match="linger"):
        Writer(store, linger=0.0)
    first.close()


def test_a_writer_gathering_until_a_flush_writes_its_rows_at_the_flush(store: Store) -> None:
    """``linger=math.inf`` gathers rows until a flush (or a full pack) rather than for a
    while: the flush writes them, where a wait that long once ended the writer's thread
    and left the flush, and the interpreter's exit, waiting for ever."""
    key = f"blake3:{'c' * 64}"
    writer = Writer(store, linger=math.inf)
    writer.submit([key], torch.full((1, 4), 3.0))
    flush = threading.Thread(target=writer.flush, daemon=True)
    flush.start()
    flush.join(timeout=60)
    assert not flush.is_alive(), "the flush never ended: the writer's thread had died"
    assert writer.kept_rows == 1
    _, data = store.recall(key)
    assert decode_rows([data])[0].tolist() == [3.0] * 4
    writer.close()


@pytest.mark.parametrize("pending_bytes", [0, 1000])
def test_a_submit_past_the_budget_of_a_writer_gathering_until_a_flush_has_it_write(
    store: Store, pending_bytes: int
) -> None:
    """A submit waiting for the rows before it to be written, past ``pending_bytes``, has
    the thread write what it gathers, ``linger=math.inf`` as any other: it waited for ever
    there, the thread gathering until a flush that the waiting submit kept from coming."""
    keys = [f"blake3:{digit * 64}" for digit in "abc"]
    writer = Writer(store, linger=math.inf, pending_bytes=pending_bytes)

    def submits() -> None:
        for at, key in enumerate(keys):
            writer.submit([key], torch.full((1, 64), float(at)))

    assert _within(submits) is None
    assert _within(writer.flush) is None
    assert writer.kept_rows == 3
    for at, key in enumerate(keys):
        _, data = store.recall(key)
        assert decode_rows([data])[0].tolist() == [float(at)] * 64
    writer.close()


def test_a_submit_still_past_the_budget_after_rows_came_in_its_wait_has_them_written(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit waiting past ``pending_bytes``, where rows another thread submitted in its
    wait still keep it past the budget once the rows before were written, has the thread
    write those too, ``linger=math.inf`` as any other: it waited for ever there, the thread
    gathering the later rows until a flush that the waiting submit kept from coming."""
    first, later, big = (f"blake3:{digit * 64}" for digit in "abc")
    small = 16 * 4 + writer_module.KEY_BYTES  # what a row of 16 floats counts
    writer = Writer(store, linger=math.inf, pending_bytes=2 * small)
    writing = threading.Event()
    write = writer_module._Backlog.write
    release = threading.Event()

    def held(backlog: Any, groups: Any) -> None:
        writing.set()
        assert release.wait(timeout=60)
        write(backlog, groups)

    monkeypatch.setattr(writer_module._Backlog, "write", held)
    try:
        writer.submit([first], torch.full((1, 16), 1.0))
        # Past the budget beside the first row: it waits, and has the first row written.
        waiting = threading.Thread(
            target=writer.submit, args=([big], torch.full((1, 64), 3.0)), daemon=True
        )
        waiting.start()
        assert writing.wait(timeout=60)
        writer.submit([later], torch.full((1, 16), 2.0))  # fits beside the first row
    finally:
        release.set()
    assert _within(waiting.join) is None
    assert not waiting.is_alive(), "the submit past the budget still waits"
    assert _within(writer.flush) is None
    assert writer.kept_rows == 3
    for key, value, width in ((first, 1.0, 16), (later, 2.0, 16), (big, 3.0, 64)):
        _, data = store.recall(key)
        assert decode_rows([data])[0].tolist() == [value] * width
    writer.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("linger", math.nan),
        ("linger", -1.0),
        ("linger", "1s"),
        ("linger", "1"),
        ("linger", True),
        ("pack_bytes", -1),
        ("pack_bytes", "16M"),
        ("pack_bytes", math.inf),
        ("pending_bytes", -1),
    ],
)
def test_a_writer_refuses_a_setting_it_cannot_follow(
    store: Store, setting: str, value: object
) -> None:
    """A linger of NaN or below 0 would gather nothing, silently, and a count of bytes below
    0 or no number at all would be taken for another: each is a ValueError naming the
    setting and what it takes, at the writer's making and when set on a live writer."""
    with pytest.raises(ValueError, match=f"{setting}= is .* 0 or more"):
        Writer(store, **{setting: value})
    writer = Writer(store, linger=0.0)
    if setting != "pending_bytes":  # a writer's own, read as it is
        with pytest.raises(ValueError, match=f"{setting}= is .* 0 or more"):
            setattr(writer, setting, value)
        assert (writer.linger, writer.pack_bytes) == (0.0, writer_module.PACK_BYTES)
    writer.close()


def _doubled_halves(self: Halves, x: torch.Tensor) -> torch.Tensor:
    return x[:, :4]


def test_unwritten_rows_of_other_code_are_not_recalled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows another cache of the store staged, computed by other code of the same class (a
    method patched in since, a class redefined in a notebook: the same keys), are not
    recalled from that staged copy by a cache of the new code: it computes its own."""
    x = rows(8)
    with _writes_held(monkeypatch):
        old = cache_rows(Halves(), store, device_bytes=0, host_bytes=0)
        old(x)
        keys = old.row_keys(x)
        monkeypatch.setattr(Halves, "forward", _doubled_halves)
        new = cache_rows(Halves(), store, device_bytes=0, host_bytes=0, strict=True)
        assert new._fingerprint != old._fingerprint
        assert new.row_keys(x) == keys
        assert torch.equal(new(x), x[:, :4])
        assert (new.stats.from_pending, new.stats.computed) == (0, 8)
    new.close()
    old.close()


class _Mirrored(LocalStore):
    """A store that does something of its own with each write (a count, a copy elsewhere)."""

    kept: list[str]

    def keep_joined(self, keys: Any, *args: Any, **kwargs: Any) -> None:
        self.kept.extend(keys)
        super().keep_joined(keys, *args, **kwargs)


def test_a_store_opened_again_writes_its_caches_rows_itself(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caches over one store opened twice share its writer, yet each one's rows are written
    through its own store object: the keep of a subclass at the same address, or one a
    test patched in, runs for that cache's rows, and a refusal there fails them alone."""
    first = cache_rows(mlp(), store, device_bytes=0, host_bytes=0)
    first(rows(4))
    mirrored = _Mirrored(store.root)
    mirrored.kept = []
    second = cache_rows(mlp(), mirrored, device_bytes=0, host_bytes=0)
    assert second._writer is not None and first._writer is not None
    assert second._writer._backlog is first._writer._backlog
    x = rows(6, seed=2)
    second(x)
    second.flush()
    assert mirrored.kept == second.row_keys(x)
    refusing = Store(store.root)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(refusing, "keep_joined", full)
    third = cache_rows(mlp(), refusing, device_bytes=0, host_bytes=0)
    third(rows(3, seed=3))
    with pytest.raises(WriteFailed, match="3 computed rows could not be written"):
        third.flush()
    first.flush()
    for cached in (first, second, third):
        cached.close()


class _FlushesAnother(LocalStore):
    """A store whose write flushes another cache (a hook that makes sure its rows are in)."""

    other: Any
    call: str
    raised: list[BaseException | None]

    def keep_joined(self, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(self.other, self.call)()
            self.raised.append(None)
        except BaseException as why:
            self.raised.append(why)
        super().keep_joined(*args, **kwargs)


@pytest.mark.parametrize("call", ["flush", "close"])
def test_a_flush_on_the_writer_thread_says_so_rather_than_wait_for_itself(
    store: Store, call: str
) -> None:
    """A flush (or close) of a cache run by the store's writer thread itself — from inside a
    write (a store's hook) or a finalizer the garbage collector runs there — would wait
    for the write it is part of; it raises, saying where to flush from, and the write
    goes on."""
    other = cache_rows(mlp(), store)
    hooked = _FlushesAnother(store.root)
    hooked.other, hooked.call, hooked.raised = other, call, []
    cached = cache_rows(Halves(), hooked)
    x = rows(4)
    cached(x)
    assert _within(cached.flush) is None
    (raised,) = hooked.raised
    assert isinstance(raised, WaitsForItself)
    assert "on the store's writer thread" in str(raised)
    assert hooked.have(cached.row_keys(x)) == set(cached.row_keys(x))
    cached.close()
    other.close()


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("where", ["device", "pending"])
def test_rows_of_one_unsigned_value_are_recalled_from_memory_and_from_staging(
    store: Store, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, where: str
) -> None:
    """A module answering one value a row in an unsigned dtype past uint8 (a score, a code)
    has its rows recalled from a memory tier, or from the writer's staged copy, as their
    bits: torch gathers a CPU tensor of one such value a row by index for no such dtype."""
    module = nn.Sequential(nn.Linear(16, 1), nn.Flatten(0), Magnitudes(dtype))
    budget = 1 << 20 if where == "device" else 0
    cached = cache_rows(module, store, device_bytes=budget, host_bytes=0)
    x = rows(8)
    shuffled = torch.tensor([3, 1, 4, 0, 5, 2, 7, 6])
    with _writes_held(monkeypatch):
        first = cached(x)
        again = cached(x[shuffled])
        assert getattr(cached.stats, f"from_{where}") == 8
    assert again.dtype == dtype and again.shape == (8,)
    assert torch.equal(rows_as_bytes(again), rows_as_bytes(first)[shuffled])
    assert torch.equal(again.double(), expected(module, x[shuffled]).double())
    cached.close()


def _tier_of_three_banks() -> tuple[Tier, dict[str, torch.Tensor]]:
    """A tier whose three banks (rows of three shapes or dtypes) each hold some rows: the
    tier and each row it holds, by key."""
    tier = Tier("device", "cpu", budget=1 << 20)
    held: dict[str, torch.Tensor] = {}
    for bank, rows in enumerate(
        [
            torch.arange(12.0).reshape(3, 4),
            torch.arange(8.0, dtype=torch.float64).reshape(2, 4) + 100,
            torch.arange(6.0).reshape(3, 2) - 50,
        ]
    ):
        keys = [f"{bank}.{i}" for i in range(len(rows))]
        assert tier.admit(keys, rows) == len(keys)
        held.update(zip(keys, rows, strict=True))
    assert len(tier.banks) == 3
    return tier, held


def _check_found(
    tier: Tier,
    held: dict[str, torch.Tensor],
    keys: list[str],
    positions: list[int] | None,
) -> None:
    """Checks ``tier.find(keys, positions)`` against each key looked up alone: every
    position asked comes back once, with its own row, or among the missing, in the order
    asked."""
    pieces, missing = tier.find(keys, positions)
    asked = list(range(len(keys))) if positions is None else positions
    answered: list[int] = []
    for at, rows in pieces:
        if at is None:  # all of keys, in order
            at = list(range(len(keys)))
        assert len(at) == len(rows)
        for position, row in zip(at, rows, strict=True):
            assert torch.equal(row, held[keys[position]]), (keys, positions, position)
        answered += at
    assert missing == [p for p in asked if keys[p] not in held]
    assert sorted(answered + missing) == sorted(asked)


def test_a_tier_of_several_banks_finds_each_row_asked_as_it_holds_it() -> None:
    """Rows held in several banks, some held nowhere, keys given twice in a batch, and the
    positions asked a part of the batch in any order: each position comes back with its own
    row, or among those missing, as each key looked up alone says."""
    tier, held = _tier_of_three_banks()
    pool = [*held, "x", "y", "z"]
    chance = random.Random(6)
    for _ in range(300):
        keys = [chance.choice(pool) for _ in range(chance.randint(1, 12))]
        _check_found(tier, held, keys, None)
        positions = chance.sample(range(len(keys)), chance.randint(0, len(keys)))
        _check_found(tier, held, keys, sorted(positions))
        _check_found(tier, held, keys, positions)


def test_a_tier_answers_positions_asked_out_of_order_with_their_own_rows() -> None:
    """Every position of a batch, asked in another order than the keys', comes back
    with the positions' rows named, not as the batch in its order."""
    tier, held = _tier_of_three_banks()
    for bank in ("0", "2"):  # one bank holding them all, and rows found in one bank
        keys = [f"{bank}.0", f"{bank}.1", f"{bank}.2"]
        _check_found(tier, held, keys, [2, 0, 1])
        _check_found(tier, held, keys, [1, 1, 0])
    _check_found(tier, held, ["0.0", "1.1", "2.2"], [2, 1, 0])


def test_a_writer_recalls_its_staged_rows_among_rows_it_holds_none_of(store: Store) -> None:
    """Rows staged and not yet written are recalled at each position asked, a key asked
    twice at both, beside keys staged nowhere; a lookup of keys staged nowhere finds none."""
    writer = Writer(store, linger=60.0)
    keys = [f"blake3:{i:064x}" for i in range(4)]
    other = f"blake3:{99:064x}"
    assert writer.recall({0: keys[0]}) is None  # nothing staged yet
    staged = torch.randn(4, 3)
    writer.submit(keys, staged)
    found = writer.recall({0: keys[2], 1: other, 2: keys[2], 3: keys[0], 4: other})
    assert found is not None
    positions, recalled = found
    assert sorted(positions) == [0, 2, 3]
    wanted = {0: staged[2], 2: staged[2], 3: staged[0]}
    for position, row in zip(positions, recalled, strict=True):
        assert torch.equal(row, wanted[position])
    assert writer.recall({0: other, 1: f"blake3:{98:064x}"}) is None
    writer.close()
    assert writer.recall({0: keys[2]}) is None  # written: the store has it now
    assert Store(store.root).have(keys) == set(keys)  # type: ignore[attr-defined]


class _CallsOneAtATime(_OneThreadStore):
    """A store not shared by threads that notes each call made into it, or into a handle
    it handed out, without its lock held by any thread, or while another thread is in a
    call of it. It keeps no whole copy a reader could map (as a bucket keeps none), so a
    Parquet source reads its datasets in ranges through ``open_blob``'s handle."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.unlocked: list[str] = []
        self.overlapped: list[str] = []
        self._inside: dict[int, int] = {}  # thread id → how deep in calls of the store
        self._inside_lock = threading.Lock()

    @contextlib.contextmanager
    def call(self, method: str) -> Iterator[None]:
        lock = store_lock(self)
        # Held by the caller, or by another thread (the one a read ahead reads the handle
        # for): else it is free, and this call is made outside it.
        if not lock.held_here() and lock.acquire(blocking=False):
            lock.release()
            self.unlocked.append(method)
        me = threading.get_ident()
        with self._inside_lock:
            if any(depth for thread, depth in self._inside.items() if thread != me):
                self.overlapped.append(method)
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            with self._inside_lock:
                self._inside[me] -= 1

    def local_blob(self, digest: str) -> None:
        return None

    def open_blob(self, digest: str) -> Any:
        with self.call("open_blob"):
            return _NotedHandle(self, super().open_blob(digest))


def _noted(method: str) -> Any:
    def call(self: _CallsOneAtATime, *args: Any, **kwargs: Any) -> Any:
        with self.call(method):
            return getattr(LocalStore, method)(self, *args, **kwargs)

    return call


for _method in ("resolve", "have", "recall", "recall_many", "keep", "keep_many"):
    setattr(_CallsOneAtATime, _method, _noted(_method))


class _NotedHandle(io.RawIOBase):
    """A handle :class:`_CallsOneAtATime` handed out: each read of it is a call of the store."""

    def __init__(self, store: _CallsOneAtATime, inner: Any) -> None:
        super().__init__()
        self.store = store
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self.store.call("seek"):
            return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        with self.store.call("tell"):
            return int(self.inner.tell())

    def readinto(self, buffer: Any) -> int:
        with self.store.call("readinto"):
            return int(self.inner.readinto(buffer))

    def close(self) -> None:
        if not self.closed:
            with self.store.call("close"):
                self.inner.close()
        super().close()


def test_a_parquet_source_calls_a_store_not_shared_by_threads_under_its_lock(
    tmp_path: Path,
) -> None:
    """A Parquet source over a store that may not be read while another thread writes
    through it (a row cache's writer, over the same store) resolves, opens and reads its
    dataset only under the lock that writer holds as it writes: no call of the store, nor
    of the handle it opened, overlaps a write in progress."""
    store = _CallsOneAtATime(tmp_path / "store")
    bound(store, numbers(1000), row_group_size=100)
    cached = cache_rows(mlp(), store)
    cached(rows(8))  # a writer thread for this store, writing behind the reads
    source = Parquet(store, "data/n")
    for at in range(0, 1000, 150):
        cached(rows(8, seed=at + 2))  # more rows for the writer meanwhile
        frame = source.forward({"at": at, "take": 150}, Context(name="source"))
        assert frame.column("n") == list(range(at, min(at + 150, 1000)))
    assert source.count_rows() == 1000
    source.close()
    cached.flush()
    cached.close()
    assert store.unlocked == []
    assert store.overlapped == []
