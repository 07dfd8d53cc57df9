"""A first epoch on a device: a batch run whole before its rows' names come back.

Named on a CUDA device, a batch's rows reach the host only once the device has done
the work queued before them, so while a cache recalls nothing it queues the module's
run on the whole batch behind the names, and looks the rows up when they come
(:func:`somatize_torch._row_lookup._queue_names`). On the CPU the names are read at
once; the tests here stand a CPU in for the device (:func:`names_queued`), names read
before the module's run, as a device's stream orders them, and the lookup's logic
is the same. The test marked ``gpu`` runs it on CUDA, where it skips without one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from somatize import Store
from somatize_torch import _row_lookup
from somatize_torch.digest import raw_rows, raw_rows_queued
from somatize_torch.rows import RowsError, cache_rows
from tests.test_torch_rows import (
    Tally,
    _WritesIntoBatchesOf,
    count_rows,
    encoder,
    expected,
    images,
)

__all__ = ["count_rows"]  # a fixture the tests here take, from where it is defined


class _NamedNow:
    """Names read when they are queued: on the CPU, before the module runs."""

    def __init__(self, x: torch.Tensor) -> None:
        self.ids = raw_rows(x)
        self.rows = len(self.ids)

    def result(self) -> list[bytes]:
        return self.ids


@pytest.fixture
def names_queued(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Names a CPU batch as a CUDA one is named: queued, the module's run after them."""

    def queue(x: object) -> _NamedNow | None:
        return _NamedNow(x) if isinstance(x, torch.Tensor) else None

    monkeypatch.setattr(_row_lookup, "_queue_names", queue)
    yield


def _epoch(cached: nn.Module, data: torch.Tensor, answers: torch.Tensor, seed: int) -> None:
    """Four shuffled batches of 16 of ``data`` through ``cached``, each answered as
    ``answers`` (the module's on ``data``) say."""
    order = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(seed))
    for at in range(0, data.shape[0], 16):
        taken = order[at : at + 16]
        assert torch.allclose(cached(data[taken]), answers[taken], atol=1e-6)


def test_while_nothing_is_recalled_each_batch_runs_whole_before_it_is_named(
    store: Store, names_queued: None, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """A first epoch names its first batch first, then runs each batch after it whole
    behind its queued names, since the batch before recalled nothing. The second epoch's
    first batch runs whole too, is then found known and recalled, and every batch after it
    is named first and runs nothing."""
    module = encoder()
    data = images(64)
    answers = expected(module, data)
    cached = cache_rows(module, store)
    counter = count_rows(module)
    _epoch(cached, data, answers, seed=0)
    first = cached.reset_stats()
    # Its first and last rows run alone once more, to see that it answers each row alone.
    assert (first.computed, first.ran_ahead, counter.rows) == (64, 48, 64 + 2)
    counter.rows = 0
    _epoch(cached, data, answers, seed=1)
    second = cached.reset_stats()
    assert (second.recalled, second.computed, second.ran_ahead) == (64, 0, 16)
    assert counter.rows == 16  # the one batch run before it was known to be recalled
    _epoch(cached, data, answers, seed=2)
    assert cached.stats.ran_ahead == 0 and counter.rows == 16
    cached.close()


def test_a_batch_run_ahead_keeps_its_new_rows_and_recalls_its_known_ones(
    store: Store, names_queued: None, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """A batch of 3 new rows among 61 known, after a batch that recalled nothing, runs
    whole: its 61 known rows are recalled all the same, the 3 new ones kept. The next such
    batch runs exactly its new rows. A fresh cache recalls all of them from the store."""
    module = encoder()
    cached = cache_rows(module, store)
    known = images(61)
    cached(known)
    batch = torch.cat([known[:20], images(3, seed=9), known[20:]])[torch.randperm(64)]
    other = torch.cat([known, images(3, seed=10)])
    answers = [expected(module, batch), expected(module, other)]
    counter = count_rows(module)
    assert torch.equal(cached(batch), answers[0])
    stats = cached.stats
    assert (counter.rows, stats.ran_ahead, stats.computed, stats.recalled) == (64, 64, 64, 61)
    counter.rows = 0
    assert torch.equal(cached(other), answers[1])
    assert counter.rows == 3 and cached.stats.ran_ahead == 64
    cached.close()
    fresh = cache_rows(encoder(), Store(store.root))  # type: ignore[attr-defined]
    everything = torch.cat([known, images(3, seed=9), images(3, seed=10)])
    assert torch.equal(fresh(everything), expected(module, everything))
    assert fresh.stats.from_store == 67
    fresh.close()


def test_a_batch_run_ahead_with_a_row_twice_keeps_it_once(store: Store, names_queued: None) -> None:
    """A batch run whole that holds one row twice answers both, and keeps the row once."""
    module = encoder()
    cached = cache_rows(module, store)
    cached(images(8, seed=3))  # recalls nothing: the next batch runs ahead
    x = images(16, seed=4)
    x[5] = x[11]
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.ran_ahead == 16
    cached.flush()
    assert cached._writer is not None and cached._writer.kept_rows == 8 + 15
    cached.close()


def _refused_ahead(store: Store, device: str) -> None:
    """A module that writes into its batch, run whole on ``device`` behind the batch's
    queued names, is refused there as in a batch named first, nothing of that batch kept.
    It writes into batches of 32 rows only, so a first batch of 16 is answered and kept,
    and the next, which the cache runs ahead, is refused."""
    cached = cache_rows(_WritesIntoBatchesOf(32).to(device), store)
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0)).to(device)
    cached(x[:16])
    with pytest.raises(RowsError, match=r"wrote into the rows it was handed.*was written"):
        cached(x[16:].clone())
    cached.flush()
    assert cached.stats.rows_kept == 16
    cached.close()


def test_a_module_run_ahead_that_writes_into_its_batch_is_refused(
    store: Store, names_queued: None
) -> None:
    """A batch run whole before its rows are named is watched for a write as any other
    (:func:`_refused_ahead`)."""
    _refused_ahead(store, "cpu")


def test_a_cache_keyed_by_index_never_runs_ahead(
    store: Store, names_queued: None, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """Indices are on the host already: a cache keyed by them runs only its missing rows."""
    module = encoder()
    cached = cache_rows(module, store, key="index", version="v1")
    counter = count_rows(module)
    data = images(32)
    cached(data[:16], index=torch.arange(16))
    cached(data[8:24], index=torch.arange(8, 24))
    assert (counter.rows, cached.stats.ran_ahead) == (16 + 2 + 8, 0)  # 2: the rowwise check
    cached.close()


def test_names_are_queued_only_on_a_cuda_device() -> None:
    """On the CPU, or for a batch of no rows, there is nothing to queue: rows are named at once."""
    assert raw_rows_queued(torch.randn(4, 3)) is None
    assert raw_rows_queued(torch.randn(0, 3, device="meta")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_queued_names_are_the_rows_names_taken_before_later_work(
    store: Store,
) -> None:
    """On CUDA, names queued behind a busy device are the rows' own names, whatever the
    work queued after them writes into the batch; a module that does is refused in a batch
    run ahead (:func:`_refused_ahead`)."""
    x = torch.randn(64, 3, 17, device="cuda")
    torch.cuda._sleep(100_000_000)  # the digests wait behind this, and a write behind them
    queued = raw_rows_queued(x)
    x.mul_(2)
    assert queued is not None and queued.result() == raw_rows((x / 2).cpu())
    _refused_ahead(store, "cuda")
