"""Deferred inputs: an index-keyed cache loads the inputs of the rows it computes, no others."""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    RandomSampler,
    StackDataset,
)

from somatize import Store
from somatize.errors import SomatizeWarning
from somatize_torch import _row_lookup
from somatize_torch.deferred import Deferred, DeferredRows, NotLoadable
from somatize_torch.residency import ROW_INDEX_BYTES
from somatize_torch.rows import NeedsIndex, RowsError, cache_rows, prefill
from tests.test_torch_rows import MaskedX, PooledTokens

ROWS = 64


class Counted:
    """Images indexed by sample, counting which samples were loaded."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.loaded.append(i)
        return self.images[i]


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten())


def images(seed: int, rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


def batches(data: Deferred, size: int = 16, **options: Any) -> list[Any]:
    return list(DataLoader(data, batch_size=size, shuffle=True, **options))


def test_only_the_rows_computed_are_loaded(tmp_path: Path) -> None:
    """A batch of 61 answered rows and 3 new ones loads the 3 inputs, with the samples,
    and no other; the cache computes the 3 from them without loading anything itself,
    and the output is the module's on every row, in the batch's order."""
    x = images(1, 70)
    inputs = Counted(x)
    data = Deferred(inputs, torch.arange(70), version="toy@1")
    module = encoder()
    cached = cache_rows(module, tmp_path, key="index")
    cached(DeferredRows(data.name, torch.arange(61), "toy@1", torch.device("cpu")))
    assert sorted(inputs.loaded) == [0, *range(61)]  # loaded by the cache; 0 for the dtype
    inputs.loaded.clear()

    picks = [*range(0, 61, 2), 62, *range(1, 61, 2), 65, 69]
    (batch, labels), *_ = DataLoader(data, batch_size=64, sampler=picks)
    assert sorted(inputs.loaded) == [62, 65, 69] and batch.given_at == [31, 62, 63]
    out = cached(batch)

    assert sorted(inputs.loaded) == [62, 65, 69]
    assert cached.stats.computed == 61 + 3 and cached.stats.recalled == 61
    with torch.no_grad():
        assert torch.allclose(out, module(x[labels]), atol=1e-6)


def test_an_epoch_of_answered_rows_loads_nothing(tmp_path: Path) -> None:
    """Epoch 1 loads each input once, with its sample; epochs 2 and 3, shuffled, recall
    every row and load none — from memory, and from the store in a fresh cache."""
    inputs = Counted(images(2))
    data = Deferred(inputs, torch.zeros(ROWS), version="toy@2")
    cached = cache_rows(encoder(), tmp_path, key="index")
    for epoch in range(3):
        for x, _ in batches(data):
            assert len(x.given_at) == (len(x) if epoch == 0 else 0)
            cached(x)
        if epoch == 0:
            assert sorted(inputs.loaded) == list(range(ROWS))
    assert len(inputs.loaded) == ROWS
    assert cached.stats.recalled == 2 * ROWS
    cached.flush()

    fresh = cache_rows(encoder(), tmp_path, key="index")
    for x, _ in batches(data):
        fresh(x)
    assert fresh.stats.from_store == ROWS and len(inputs.loaded) == ROWS


def test_answered_is_a_hint_and_never_a_key(tmp_path: Path) -> None:
    """A cache that has not answered rows another cache answered (other weights) loads
    their inputs itself, since they no longer come with the samples, and answers them
    right."""
    x = images(12)
    inputs = Counted(x)
    data = Deferred(inputs, version="toy@12")
    for rows in batches(data):
        cache_rows(encoder(), tmp_path, key="index")(rows)
    inputs.loaded.clear()
    other = encoder()
    with torch.no_grad():
        other[0].weight.add_(1.0)
    cached = cache_rows(other, tmp_path, key="index")
    for rows in batches(data):
        assert rows.given is None
        with torch.no_grad():
            assert torch.allclose(cached(rows), other(x[rows.index]), atol=1e-5)
    assert sorted(inputs.loaded) == list(range(ROWS)) and cached.stats.computed == ROWS


def test_rows_in_the_store_stop_their_inputs_coming(tmp_path: Path) -> None:
    """A new Deferred over inputs whose rows an earlier run kept: the first batch comes
    loaded (nothing is answered yet); the cache then looks the store up for the others
    (on another thread) and their inputs stop coming, so the run recalls every row
    having loaded one batch of inputs."""
    x = images(13)
    first = cache_rows(encoder(), tmp_path, key="index")
    for rows in batches(Deferred(x, version="toy@13")):
        first(rows)
    first.flush()

    inputs = Counted(x)
    data = Deferred(inputs, version="toy@13")
    cached = cache_rows(encoder(), tmp_path, key="index")
    loader = iter(DataLoader(data, batch_size=16))
    rows = next(loader)
    assert len(rows.given_at) == 16
    cached(rows)
    for seeder in cached._seeders:
        seeder.join()
    assert bool(data.answered.all())
    for rows in loader:
        assert rows.given is None
        cached(rows)
    assert cached.stats.from_store == ROWS and cached.stats.computed == 0
    assert len(inputs.loaded) == 16


def test_a_store_without_the_rows_is_looked_up_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looking the store up for answered samples stops at the first chunk it has none of:
    a first run spends one lookup on it however large the dataset."""
    monkeypatch.setattr(_row_lookup, "_SEED_CHUNK", 8)
    store = Store(tmp_path / "store")
    asked: list[int] = []
    have = store.have

    def counted(keys: Any) -> set[str]:
        keys = list(keys)
        asked.append(len(keys))
        return have(keys)

    monkeypatch.setattr(store, "have", counted)
    cached = cache_rows(encoder(), store, key="index")
    data = Deferred(images(15), version="toy@15")
    cached(next(iter(DataLoader(data, batch_size=16, sampler=range(48, 64)))))
    for seeder in cached._seeders:
        seeder.join()
    seeded = [n for n in asked if n == 8]
    assert seeded == [8] and not bool(data.answered[:48].any())


def test_samples_answered_elsewhere_are_looked_up_again(tmp_path: Path) -> None:
    """Rows another process keeps after this one first looked the store up (another DDP
    rank's share) are found when it is asked to look again: their inputs stop coming."""
    x = images(16)
    data = Deferred(x, version="toy@16")
    cached = cache_rows(encoder(), tmp_path, key="index")
    cached(next(iter(DataLoader(data, batch_size=32))))  # samples 0-31; the store had none
    other = cache_rows(encoder(), tmp_path, key="index")
    other(DeferredRows(data.name, torch.arange(32, ROWS), "toy@16", torch.device("cpu")))
    other.flush()
    data.answered[32:] = False  # as in another process, whose record this one does not share
    cached.look_up_answered()
    cached(next(iter(DataLoader(data, batch_size=8))))
    for seeder in cached._seeders:
        seeder.join()
    assert bool(data.answered.all())
    assert cached.stats.computed == 32


def test_deferred_rows_and_indices_share_keys(tmp_path: Path) -> None:
    """Rows kept by ``cached(x, index=idx)`` are recalled for a Deferred of the same
    version, and rows of another version are not: its sample 0 is another image."""
    module = encoder()
    x = images(3)
    cached = cache_rows(module, tmp_path, key="index", version="toy@3")
    cached(x, index=torch.arange(ROWS))

    same = Deferred(Counted(x), version="toy@3")
    for rows in batches(same):
        cached(rows)
    assert cached.stats.recalled == ROWS and cached.stats.computed == ROWS

    other_images = images(4)
    other = Deferred(other_images, version="toy@4")
    for rows in batches(other):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(other_images[rows.index]), atol=1e-6)
    assert cached.stats.computed == 2 * ROWS


def test_a_training_and_a_validation_set_keep_apart(tmp_path: Path) -> None:
    """Two Deferreds with their own versions, one cache without one: each set's sample 0
    gets its own answer."""
    module = encoder()
    train, val = images(5), images(6)
    cached = cache_rows(module, tmp_path, key="index")
    for data, source in (
        (Deferred(train, version="t@1"), train),
        (Deferred(val, version="v@1"), val),
    ):
        for _ in range(2):
            for rows in batches(data):
                with torch.no_grad():
                    assert torch.allclose(cached(rows), module(source[rows.index]), atol=1e-6)
    assert cached.stats.computed == 2 * ROWS and cached.stats.recalled == 2 * ROWS


def test_one_deferred_without_a_version_takes_the_caches(tmp_path: Path) -> None:
    """A Deferred without a version of its own keys its rows under the cache's version; a
    second one is refused before any of its rows is keyed (its sample 0 would be recalled
    as the first's), while the first, and a Deferred with a version, go on."""
    module = encoder()
    train, val = images(5), images(6)
    cached = cache_rows(module, tmp_path, key="index", version="proj@1")
    first = Deferred(train)
    for rows in batches(first):
        cached(rows)
    with pytest.raises(NeedsIndex, match="second `Deferred` without a version of its own"):
        cached(batches(Deferred(val))[0])
    assert cached.stats.rows == ROWS
    for rows in batches(first):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(train[rows.index]), atol=1e-6)
    for rows in batches(Deferred(val, version="val@1")):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(val[rows.index]), atol=1e-6)
    assert cached.stats.computed == 2 * ROWS and cached.stats.recalled == ROWS
    cached.version = "proj@1|validate"  # another version of the cache's (a stage's): its own
    second = Deferred(val)
    for rows in batches(second):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(val[rows.index]), atol=1e-6)


@pytest.mark.parametrize("versionless_first", [True, False])
def test_a_version_lent_is_no_other_deferreds_own(tmp_path: Path, versionless_first: bool) -> None:
    """A Deferred with a version of its own equal to the cache's, and one without (which
    takes the cache's), are two datasets under one version: the second to come, either
    way round, was answered with the first's rows. It is refused before any row of it is
    keyed; the first goes on."""
    module = encoder()
    train, val = images(5), images(6)
    cached = cache_rows(module, tmp_path, key="index", version="proj@1")
    first, second = Deferred(train, version="proj@1"), Deferred(val)
    if versionless_first:
        (first, train), (second, val) = (second, val), (first, train)
    for rows in batches(first):
        cached(rows)
    with pytest.raises(NeedsIndex, match="without a version of its own"):
        cached(batches(second)[0])
    assert cached.stats.computed == ROWS
    for rows in batches(first):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(train[rows.index]), atol=1e-6)
    assert cached.stats.recalled == ROWS


@pytest.mark.parametrize("bad", ["", 0, 2.0, ["toy", 1]])
def test_a_version_written_is_checked_as_version_is(tmp_path: Path, bad: Any) -> None:
    """A version written to a Deferred (its data changed) is checked as ``version=`` is: an
    empty one (a setting read from an unset variable) passed as none given, so two such
    Deferreds under one cache were keyed under its version without the refusal of a second
    one, and one's sample 0 was answered with the other's. A version written that is a
    string keys the rows of the batches made after it."""
    module = encoder()
    train, val = images(5), images(6)
    cached = cache_rows(module, tmp_path, key="index", version="proj@1")
    first, second = Deferred(train), Deferred(val)
    with pytest.raises(ValueError, match="as a string"):
        first.version = bad
    with pytest.raises(ValueError, match="as a string"):
        second.version = bad
    assert first.version is None and second.version is None
    for rows in batches(first):
        cached(rows)
    with pytest.raises(NeedsIndex, match="second `Deferred` without a version of its own"):
        cached(batches(second)[0])
    second.version = "val@1"
    for rows in batches(second):
        with torch.no_grad():
            assert torch.allclose(cached(rows), module(val[rows.index]), atol=1e-6)
    assert cached.stats.computed == 2 * ROWS and cached.stats.recalled == 0


@pytest.mark.parametrize("persistent", [False, True], ids=["forked", "persistent"])
def test_workers_load_new_inputs_and_hand_over_indices(tmp_path: Path, persistent: bool) -> None:
    """In epoch 1 DataLoader workers load every input with its sample, as without the
    cache, and the loop loads none; from epoch 2 (workers kept or forked anew) batches
    reach the loop as indices and a name — a few hundred bytes, not the dataset — and
    nothing is loaded anywhere."""
    x = torch.randn(256, 3, 32, 32)
    inputs = Counted(x)
    data = Deferred(inputs, torch.arange(256), version="big@1")
    module = encoder()
    cached = cache_rows(module, tmp_path, key="index")
    loader = DataLoader(
        data, batch_size=32, shuffle=True, num_workers=2, persistent_workers=persistent
    )
    for epoch in range(2):
        for rows, labels in loader:
            assert isinstance(rows, DeferredRows) and torch.equal(rows.index, labels)
            assert len(rows.given_at) == (32 if epoch == 0 else 0)
            if epoch == 1:
                assert len(pickle.dumps(rows)) < 2000
            with torch.no_grad():
                assert torch.allclose(cached(rows), module(x[labels]), atol=1e-6)
    assert inputs.loaded == []  # every load was a worker's
    assert cached.stats.computed == 256 and cached.stats.recalled == 256


def test_prefill_takes_a_deferred_loader(tmp_path: Path) -> None:
    """prefill finds the deferred rows in the loader's items and keeps every row."""
    data = Deferred(images(7), torch.zeros(ROWS), version="toy@7")
    cached = cache_rows(encoder(), tmp_path, key="index")
    done = prefill(cached, DataLoader(data, batch_size=16), progress=False)
    assert done.computed == ROWS and done.rows_kept == ROWS


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_fetched_as_one_batch_are_collated(tmp_path: Path, workers: int) -> None:
    """A DataLoader with batch_size=None over a BatchSampler asks the Deferred for a whole
    batch of samples at once (``data[[3, 7, …]]``), as it may a TensorDataset: it gets
    them collated as a batch, and the cache answers each row of its sample. It failed
    with "'list' object cannot be interpreted as an integer"."""
    pictures = images(7)
    data = Deferred(pictures, torch.arange(ROWS), version="toy@7")
    sampler = BatchSampler(RandomSampler(data), batch_size=16, drop_last=False)
    loader = DataLoader(data, sampler=sampler, batch_size=None, num_workers=workers)
    cached = cache_rows(encoder(), tmp_path, key="index")
    for _ in range(2):
        for rows, labels in loader:
            assert isinstance(rows, DeferredRows)
            with torch.no_grad():
                assert torch.allclose(cached(rows), cached.module(pictures[labels]), atol=1e-6)
    assert cached.stats.computed == ROWS and cached.stats.recalled == ROWS


@pytest.mark.parametrize("change", ["inputs", "version"])
def test_a_loader_made_after_the_data_changed_has_its_workers_load_again(
    tmp_path: Path, change: str
) -> None:
    """Once a Deferred's data changed (given other inputs, or a new version), no sample
    is answered for it: a
    DataLoader made after has its workers load every input with its sample again, as the
    docs say. The flags of the old data stayed, so no input came with its sample and the
    loop loaded each itself, one batch at a time."""
    old, new = images(8), images(9)
    data = Deferred(old.clone(), version="d@1")
    cached = cache_rows(encoder(), tmp_path, key="index", version="c@1")
    for rows in DataLoader(data, batch_size=16, num_workers=2):
        cached(rows)
    assert bool(data.answered.all())
    if change == "inputs":
        data.inputs, data.version = new, "d@2"
    else:
        data.inputs.copy_(new)  # changed in place
        data.version = "d@2"
    came = 0
    for rows in DataLoader(data, batch_size=16, shuffle=True, num_workers=2):
        came += len(rows.given_at)
        with torch.no_grad():
            assert torch.allclose(cached(rows), cached.module(new[rows.index]), atol=1e-6)
    assert came == ROWS and cached.stats.computed == 2 * ROWS


def test_inputs_of_another_length_given_anew_are_refused(tmp_path: Path) -> None:
    """Inputs given to a Deferred anew are of its length, as what is handed out beside
    them is: more were never handed out (an epoch skipped them), fewer failed with
    torch's IndexError deep in the loader."""
    data = Deferred(images(8), torch.arange(ROWS), version="d@1")
    for length in (ROWS + 8, ROWS - 8):
        with pytest.raises(ValueError, match=rf"{ROWS} samples, got inputs of length {length}"):
            data.inputs = images(9, rows=length)
    assert len(data.inputs) == ROWS and data.generation == 1


def test_rows_stacked_in_a_collate_of_ones_own_are_refused_saying_how_to_collate() -> None:
    """A collate_fn of one's own that stacks a Deferred's samples (``torch.stack(xs)``)
    is refused saying to collate them with ``default_collate``, which makes the batch
    the cache takes; torch said only that it expected a tensor and got a Row."""
    data = Deferred(images(7), torch.arange(ROWS), version="toy@7")

    def stacked(samples: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = zip(*samples, strict=True)
        return torch.stack(inputs), torch.tensor(labels)

    with pytest.raises(TypeError, match=r"torch\.stack.*`Row`s.*default_collate\(rows\)"):
        next(iter(DataLoader(data, batch_size=4, collate_fn=stacked)))
    rows, labels = next(iter(DataLoader(data, batch_size=4)))
    assert isinstance(rows, DeferredRows) and labels.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["x", "input_ids"])
def test_prefill_takes_deferred_rows_at_a_dicts_x_or_named_as_the_input(
    tmp_path: Path, name: str
) -> None:
    """A loader of dicts whose ``x`` is deferred rows (a ``StackDataset(x=Deferred(...),
    y=labels)``), or whose rows go by the name of the forward's input
    (``StackDataset(input_ids=Deferred(...), y=labels)``), is prefilled, every row kept, as
    such a tensor is. Each was refused as holding no batch tensor."""
    ids = torch.randint(1, 50, (ROWS, 7))
    data = StackDataset(**{name: Deferred(ids, version="ids@1")}, y=torch.arange(ROWS))
    cached = cache_rows(PooledTokens(), tmp_path, key="index")
    done = prefill(cached, DataLoader(data, batch_size=16), progress=False)
    assert done.computed == ROWS and done.rows_kept == ROWS
    for item in DataLoader(data, batch_size=16, shuffle=True):
        with torch.no_grad():
            assert torch.equal(cached(item[name]), cached.module(ids[item["y"]]))
    assert cached.stats.recalled == ROWS


def test_prefill_refuses_a_mask_beside_deferred_rows_at_a_dicts_x(tmp_path: Path) -> None:
    """A mask beside a dict's deferred ``x`` that the forward takes is refused, as beside
    deferred rows named as the forward's input or a tensor ``x``: the cache hands the
    module the rows alone. It was left out without a word."""
    ids = torch.randint(1, 50, (ROWS, 7))
    data = StackDataset(x=Deferred(ids, version="ids@1"), mask=torch.ones_like(ids))
    cached = cache_rows(MaskedX(), tmp_path, key="index")
    with pytest.raises(TypeError, match=r"under 'x'.*'mask' beside it"):
        prefill(cached, DataLoader(data, batch_size=16), progress=False)
    assert cached.stats.computed == 0


def test_moving_rows_to_a_device_loads_them_there() -> None:
    """``.to(device)`` (what Lightning does to a batch) says where rows load; a dtype is
    ignored, since inputs load as their dataset makes them."""
    data = Deferred(images(8), version="toy@8")
    (rows,) = batches(data, size=ROWS)[:1]
    assert rows.to(torch.float16) is rows
    moved = rows.to("cpu")
    assert moved.device == torch.device("cpu") and moved.load([0]).dtype == torch.float32
    assert torch.equal(moved.load([2, 0]), data.inputs[rows.index[[2, 0]]])


def test_a_batch_fetched_at_once_holds_what_its_items_hold() -> None:
    """``__getitems__`` (the DataLoader's batch fetch) hands out, sample by sample, what
    ``data[i]`` does: the same references and the same labels, tensors and others."""
    labels, names = torch.arange(ROWS) * 10, [f"s{i}" for i in range(ROWS)]
    data = Deferred(images(11), labels, names, version="toy@11")
    picks = [5, 0, 63, 5]
    fetched, items = data.__getitems__(picks), [data[i] for i in picks]
    for got, (row, label, name) in zip(fetched, items, strict=True):
        assert (got[0].index, got[0].version) == (row.index, row.version)
        assert torch.equal(got[1], label) and got[2] == name
    (x, y, z), *_ = DataLoader(data, batch_size=4, sampler=picks)
    assert x.index.tolist() == picks and y.tolist() == [50, 0, 630, 50]
    assert list(z) == ["s5", "s0", "s63", "s5"]
    with pytest.raises(IndexError, match="sample 64 of"):
        data.__getitems__([1, ROWS])


def test_rows_load_from_what_came_and_from_the_dataset() -> None:
    """``load`` takes the inputs that came with the batch as they are and loads the
    others, in the order asked."""
    x = images(14)
    inputs = Counted(x)
    data = Deferred(inputs, version="toy@14")
    index = torch.tensor([9, 3, 7, 1])
    rows = DeferredRows(data.name, index, "toy@14", torch.device("cpu"), x[[3, 1]], [1, 3])
    assert torch.equal(rows.load(), x[index]) and sorted(inputs.loaded) == [7, 9]
    assert torch.equal(rows.load([3, 1]), x[[1, 3]]) and len(inputs.loaded) == 2
    assert torch.equal(rows.load([2, 3]), x[[7, 1]]) and inputs.loaded[2:] == [7]


def test_how_half_precision_products_run_on_a_gpu_is_in_the_keys(tmp_path: Path) -> None:
    """Rows of a module in float16 run on a GPU are keyed by how cuBLAS computes float16
    and bfloat16 products there, where it is not torch's default (accumulating in float16,
    or reducing in full precision only): an answer computed one way is not recalled for
    the other, as one computed with TF32 is not. torch's defaults keep the usual keys,
    and rows run on the host, which cuBLAS does not compute, keep theirs."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(3 * 6 * 6, 4)).to(torch.float16)
    cached = cache_rows(module, tmp_path, key="index")
    (rows,) = batches(Deferred(images(17), version="toy@17"), size=ROWS)
    on_gpu = rows.to("cuda")  # keyed only: nothing is loaded or run there
    usual, host = cached.row_keys(on_gpu), cached.row_keys(rows)
    matmul = torch.backends.cuda.matmul
    for setting, value in (
        ("allow_fp16_accumulation", True),
        ("allow_fp16_reduced_precision_reduction", False),
        ("allow_bf16_reduced_precision_reduction", False),
    ):
        if not hasattr(matmul, setting):  # a setting this torch lacks changes nothing
            continue
        was = getattr(matmul, setting)
        try:
            setattr(matmul, setting, value)
            assert cached.row_keys(on_gpu) != usual, setting
            assert cached.row_keys(rows) == host
        finally:
            setattr(matmul, setting, was)
    assert cached.row_keys(on_gpu) == usual


def test_floating_inputs_run_in_the_modules_dtype(tmp_path: Path) -> None:
    """A module held in bfloat16 gets float32 inputs of a Deferred in bfloat16 (as a
    trainer in true half precision converts a batch tensor), keyed as such: the same
    keys and answers as the batch converted by hand; inputs already in a floating dtype
    the module holds stay in it; integer inputs load as they are."""
    x = images(17)
    module = encoder().to(torch.bfloat16)
    cached = cache_rows(module, tmp_path, key="index")
    (rows,) = batches(Deferred(x, version="toy@17"), size=ROWS)
    out = cached(rows)
    by_hand = x[rows.index].to(torch.bfloat16)
    with torch.no_grad():
        assert out.dtype == torch.bfloat16 and torch.equal(out, module(by_hand))
    indexed = cache_rows(module, tmp_path, key="index", version="toy@17")
    assert cached.row_keys(rows) == indexed.row_keys(by_hand, index=rows.index)

    mixed = Scaled()  # a float32 scale registered before a bfloat16 body
    halves = Deferred(x.to(torch.bfloat16), version="toy@17-bf16")
    (rows,) = batches(halves, size=ROWS)
    out = cache_rows(mixed, key="index")(rows)
    with torch.no_grad():
        assert torch.equal(out, mixed(x[rows.index].to(torch.bfloat16)))

    tokens = Deferred(torch.randint(0, 50, (ROWS, 7)), version="tokens@1")
    embed = cache_rows(nn.Sequential(nn.Embedding(50, 4), nn.Flatten()), key="index")
    (ids,) = batches(tokens, size=ROWS)
    assert embed(ids).shape == (ROWS, 28)


class Scaled(nn.Module):
    """A float32 scale beside a bfloat16 body: inputs in bfloat16 are what it takes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.body = encoder().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale.to(x.dtype)


def test_bad_uses_are_refused(tmp_path: Path) -> None:
    data = Deferred(images(9), version="toy@9")
    rows = batches(data)[0]
    with pytest.raises(RowsError, match="keyed by index"):
        cache_rows(encoder())(rows)
    with pytest.raises(NeedsIndex, match="without index="):
        cache_rows(encoder(), key="index")(rows, index=rows.index)
    with pytest.raises(NeedsIndex, match="none was given"):
        cache_rows(encoder(), key="index")(images(9), index=torch.arange(ROWS))
    unversioned = batches(Deferred(images(9)))[0]
    with pytest.raises(NeedsIndex, match="or to the `Deferred`"):
        cache_rows(encoder(), key="index")(unversioned)
    with pytest.raises(NotLoadable, match="does not hold"):
        cache_rows(encoder(), key="index")(DeferredRows("gone", rows.index, "x", rows.device))
    with pytest.raises(ValueError, match="argument 2 is of length 3"):
        Deferred(images(9), torch.arange(3))
    with pytest.raises(ValueError, match="as a string"):
        Deferred(images(9), version="")
    with pytest.raises(IndexError):
        data[ROWS]
    with pytest.raises(TypeError, match="with a length"):
        Deferred(5)


def test_a_batch_from_two_deferreds_is_refused_and_one_over_both_works(tmp_path: Path) -> None:
    """A ConcatDataset of Deferreds mixes their rows in a batch, which is refused with a
    message that says what to do; one Deferred over the inputs concatenated caches them."""
    a, b = images(1, 9), images(2, 9)
    mixed = ConcatDataset([Deferred(a, version="a@9"), Deferred(b, version="b@9")])
    with pytest.raises(NotLoadable, match="one Deferred over the inputs concatenated"):
        next(iter(DataLoader(mixed, batch_size=18)))
    joined = Deferred(ConcatDataset([a, b]), version="a@9+b@9")
    cached = cache_rows(encoder(), tmp_path, key="index")
    (rows,) = batches(joined, size=18)
    with torch.no_grad():
        assert torch.equal(cached(rows), cached.module(torch.cat([a, b])[rows.index]))


def test_a_copied_deferred_is_a_dataset_of_its_own(tmp_path: Path) -> None:
    """``copy.deepcopy`` of a Deferred gives one whose batches load from it, whatever
    becomes of the original."""
    x = images(3, 9)
    twin = copy.deepcopy(Deferred(x, version="toy@9"))
    gc.collect()  # the original is gone
    cached = cache_rows(encoder(), tmp_path, key="index")
    (rows,) = batches(twin, size=9)
    with torch.no_grad():
        assert torch.equal(cached(rows), cached.module(x[rows.index]))


def test_a_shallow_copy_of_a_deferred_given_other_inputs_loads_its_own(tmp_path: Path) -> None:
    """``copy.copy`` of a Deferred (a second split made from the first, given other inputs
    under a version of their own) is a dataset of its own, whose batches load from it,
    and nothing the original's cache answered counts as answered there. It had the
    original's name and flags of answered samples: its samples came without their inputs
    once the original's were answered, the cache loaded them from the original and kept
    the original's answers under the copy's version."""
    first, second = images(10, 8), images(11, 8)
    data = Deferred(first, torch.arange(8), version="first@1")
    other = copy.copy(data)
    other.inputs, other.version = second, "second@1"
    assert other.name != data.name and other.beside == data.beside
    cached = cache_rows(encoder(), tmp_path, key="index")
    with torch.no_grad():
        for rows, _ in batches(data, size=4):
            cached(rows)
        for rows, index in batches(other, size=4):
            assert torch.equal(cached(rows), cached.module(second[index]))
    cached.close()


def test_a_deferred_loaded_where_the_one_saved_lives_loads_its_own(tmp_path: Path) -> None:
    """A Deferred saved whole (``torch.save``) once a cache answered its samples, and
    loaded in the process that still holds it, once that one was given other inputs under
    a new version, is a dataset of its own, whose batches load the inputs it was saved
    with. It had the name the live one holds: its samples, answered when saved, came
    without their inputs, and another cache loaded them from the live one and kept the
    new inputs' answers under the old version."""
    first, second = images(12, 8), images(13, 8)
    data = Deferred(first, torch.arange(8), version="data@1")
    with torch.no_grad():
        earlier = cache_rows(encoder(), key="index")
        for rows, _ in batches(data, size=4):
            earlier(rows)
        torch.save(data, tmp_path / "data.pt")
        data.inputs, data.version = second, "data@2"
        saved = torch.load(tmp_path / "data.pt", weights_only=False)
        assert saved.name != data.name and saved.version == "data@1"
        cached = cache_rows(nn.Sequential(encoder(), nn.Tanh()), key="index")
        for rows, index in batches(saved, size=4):
            assert torch.equal(cached(rows), cached.module(first[index]))
        for rows, index in batches(data, size=4):
            assert torch.equal(cached(rows), cached.module(second[index]))


def test_an_input_unlike_the_first_is_refused(tmp_path: Path) -> None:
    """Inputs of one Deferred are rows of one dtype and shape; another is refused as it
    loads, with nothing kept for it."""
    ragged = [torch.randn(3, 6, 6) for _ in range(8)] + [torch.randn(3, 5, 5)]
    data = Deferred(ragged, version="ragged@1")
    cached = cache_rows(encoder(), tmp_path, key="index")
    cached(DeferredRows(data.name, torch.arange(8), "ragged@1", torch.device("cpu")))
    with pytest.raises(NotLoadable, match=r"samples \[8\] are torch.float32 \[3, 5, 5\]"):
        cached(DeferredRows(data.name, torch.tensor([8]), "ragged@1", torch.device("cpu")))
    cached.flush()
    assert cached.stats.rows_kept == 8


def refused_as_loaded(data: Deferred, module: nn.Module, said: str, tmp_path: Path) -> None:
    """Checks that the inputs of ``data``'s first four samples are refused with a message
    matching ``said`` both as a DataLoader collates them and as a cache of ``module``
    loads them, nothing computed."""
    with pytest.raises(NotLoadable, match=said):
        next(iter(DataLoader(data, batch_size=4)))
    cached = cache_rows(module, tmp_path, key="index")
    with pytest.raises(NotLoadable, match=said):
        cached(DeferredRows(data.name, torch.arange(4), data.version, torch.device("cpu")))
    assert cached.stats.computed == 0
    cached.close()


@pytest.mark.parametrize("kind", ["tensor", "numpy", "list"])
def test_inputs_of_varying_shape_in_one_batch_are_refused_naming_them(
    tmp_path: Path, kind: str
) -> None:
    """Inputs of one Deferred of varying shapes in one batch (token ids of varying length),
    as tensors or as NumPy arrays (stacked as tensors by the default collate), are refused
    naming the samples and saying to pad them; read as lists, as a tokenizer answers them,
    they are refused as no tensor, saying to read each as one. Each failed with torch's
    own "stack expects each tensor to be equal size" (or "each element in list of batch
    should be of equal size"), as a DataLoader collated a batch and as a cache loaded its
    rows; nothing is computed for them."""
    lengths = (3, 5, 3, 4)
    made = {"tensor": torch.arange, "numpy": np.arange, "list": lambda a, b: list(range(a, b))}
    texts: list[Any] = [made[kind](1, n + 1) for n in lengths]
    data = Deferred(texts, version="texts@1")
    said = (
        rf"sample 0 is {'torch.' if kind == 'tensor' else ''}int64 \[3\], sample 1 is .*pad"
        if kind != "list"
        else r"one tensor per sample.*sample 0 is a `list`.*torch\.tensor\(ids\)"
    )
    refused_as_loaded(data, nn.Embedding(8, 2), said, tmp_path)


@pytest.mark.parametrize("kind", ["tuple", "dict"])
def test_a_dataset_of_whole_samples_is_refused_saying_to_hand_the_input_alone(
    tmp_path: Path, kind: str
) -> None:
    """A Deferred over a dataset handing whole samples (a `TensorDataset`'s or an
    `ImageFolder`'s (image, label), a Hugging Face dataset's dict) is refused saying to
    hand it the input alone and the labels beside it, naming where the input is. A tuple
    was refused saying to read token ids as a tensor padded to one length, and a dict
    with no word of what to do."""
    pictures = images(7, rows=8)
    samples: list[Any] = [
        (pictures[i], i % 3) if kind == "tuple" else {"label": i % 3, "pixel_values": pictures[i]}
        for i in range(8)
    ]
    data = Deferred(samples, version="whole@1")
    part = r"data\[i\]\[0\]" if kind == "tuple" else r"data\[i\]\['pixel_values'\]"
    said = rf"sample 0 is a `{kind}`.*input alone \(`{part}`\).*Deferred\(inputs, labels"
    refused_as_loaded(data, encoder(), said, tmp_path)


class Picture:
    """An image not read as an array yet, as an `ImageFolder` without a transform hands
    out (a PIL image)."""


@pytest.mark.parametrize("kind", ["tensor", "numpy"])
def test_token_ids_as_scalars_are_not_taken_for_whole_samples(tmp_path: Path, kind: str) -> None:
    """Token ids held one scalar each (``list(torch.tensor(ids))``) are one input, not a
    whole sample: they are refused saying to read them as one tensor, as a list of ints
    is. They were refused as a sample beside its label, saying to hand the Deferred
    ``data[i][0]``, the first token alone."""
    scalar = torch.tensor if kind == "tensor" else np.int64
    texts = [[scalar(t) for t in range(1, 5)] for _ in range(8)]
    data = Deferred(texts, version="ids@1")
    said = r"sample 0 is a `list`: have the Deferred read each as a tensor"
    refused_as_loaded(data, nn.Embedding(8, 2), said, tmp_path)


def test_an_image_beside_its_label_not_read_as_an_array_is_a_whole_sample() -> None:
    """An `ImageFolder` without a transform hands ``(image, label)`` with the image not
    an array: it is refused as a whole sample, naming where the input is, as the docs
    say. It was refused saying to read token ids as a tensor."""
    data = Deferred([(Picture(), i % 3) for i in range(8)], version="folder@1")
    said = r"sample 0 is a `tuple` of 2 items, a whole sample.*input alone \(`data\[i\]\[0\]`\)"
    with pytest.raises(NotLoadable, match=said):
        next(iter(DataLoader(data, batch_size=4)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rows_moved_to_the_gpu_load_and_stay_there(tmp_path: Path) -> None:
    """A batch moved with ``.to("cuda")`` loads the rows it computes onto the GPU, and the
    module there answers them; the next epoch recalls them from the device tier."""
    x = images(10)
    module = encoder().cuda()
    cached = cache_rows(module, tmp_path, key="index")
    data = Deferred(x, version="gpu@1")
    for _ in range(2):
        for rows in batches(data):
            out = cached(rows.to("cuda"))
            assert out.is_cuda
            with torch.no_grad():
                assert torch.allclose(out, module(x[rows.index].cuda()), atol=1e-5)
    assert cached.stats.from_device == ROWS and cached.tiers[0].device.type == "cuda"


def test_rows_kept_nowhere_are_not_marked_answered() -> None:
    """A cache with nowhere to keep a row (no store, its memory tiers full) does not mark
    its sample answered: that input goes on coming with its sample, loaded where the
    samples are (a DataLoader's workers), rather than by the cache itself every epoch;
    the samples of the rows it keeps come without theirs. Every row is answered right."""
    inputs = Counted(images(5))
    data = Deferred(inputs, torch.arange(ROWS), version="toy@5")
    row = 4 * 4 * 4 * 4 + ROW_INDEX_BYTES  # a row of the encoder's answer, and its entry
    module = encoder()
    cached = cache_rows(module, None, key="index", device_bytes=20 * row, host_bytes=0)
    for x, _ in batches(data):
        cached(x)
    assert cached.tiers[0].rows == 20 and int(data.answered.sum()) == 20
    given = 0
    for x, labels in batches(data):
        given += len(x.given_at)
        with torch.no_grad():
            assert torch.allclose(cached(x), module(inputs.images[labels]), atol=1e-6)
    assert given == ROWS - 20


def test_rows_handed_out_before_their_deferred_changed_version_are_not_loaded(
    tmp_path: Path,
) -> None:
    """Rows handed out under one version (by a DataLoader's persistent workers, which hold
    the Deferred as it was when they started, or made before) that came without their
    inputs, whose Deferred was given a new version since, are refused naming both versions,
    by a cache holding their rows too: the inputs loaded now are the new version's, and the
    old version's rows may be of data changed since in place. The new version's rows load
    its inputs."""
    first, second = images(14, 8), images(15, 8)
    data = Deferred(first, version="data@1")
    earlier = cache_rows(encoder(), tmp_path, key="index")
    with torch.no_grad():
        for rows in batches(data, size=4):
            earlier(rows)
        handed_out = batches(data, size=4)  # their samples answered: no input came
        assert all(rows.given is None for rows in handed_out)
        data.inputs, data.version = second, "data@2"
        cached = cache_rows(nn.Sequential(encoder(), nn.Tanh()), tmp_path, key="index")
        for each in (earlier, cached):
            with (
                pytest.warns(SomatizeWarning, match="DataLoader again"),
                pytest.raises(NotLoadable, match=r"handed out under version `data@1`.*`data@2`"),
            ):
                each(handed_out[0])
        for rows in batches(data, size=4):
            assert torch.equal(cached(rows), cached.module(second[rows.index]))


def test_rows_that_came_with_their_inputs_before_a_new_version_are_answered_from_them(
    tmp_path: Path,
) -> None:
    """Rows handed out under one version with their inputs (loaded by a worker holding the
    Deferred as it was) are computed from those inputs, though the Deferred holds another
    version now, and kept under neither: nothing of the new version is loaded for them, and
    a cache of the old version finds none of them. They count as what they are: batches
    whose rows were all computed, none recalled (``computed`` counts rows answered by
    running, kept or not), so the hit rate does not leave them out."""
    first, second = images(14, 8), images(15, 8)
    data = Deferred(first, version="data@1")
    with torch.no_grad():
        handed_out = batches(data, size=4)  # nothing answered yet: every input came
        assert all(rows.given is not None for rows in handed_out)
        data.inputs, data.version = second, "data@2"
        cached = cache_rows(encoder(), tmp_path, key="index")
        with pytest.warns(SomatizeWarning, match="DataLoader again"):
            for rows in handed_out:
                assert torch.equal(cached(rows), cached.module(first[rows.index]))
        stats = cached.stats
        assert (stats.batches, stats.rows, stats.computed) == (len(handed_out), 8, 8)
        assert stats.recalled == 0 and stats.hit_rate == 0.0
        assert cached.tiers[0].rows == 0  # computed, but not kept
        cached.flush()
        fresh = cache_rows(encoder(), tmp_path, key="index")
        for rows in batches(Deferred(first, version="data@1"), size=4):
            fresh(rows)
        assert fresh.stats.from_store == 0


def test_rows_answered_from_their_inputs_after_a_new_version_are_answered_in_eval(
    tmp_path: Path,
) -> None:
    """Rows handed out under a version their Deferred no longer holds are answered as the
    cache answers any row, by the module in eval: a part put in train mode directly (a
    dropout) is warned of and put back in eval first, not run in train mode."""
    from somatize_torch import StillChanging

    first = images(21, 8)
    data = Deferred(first, version="data@1")
    module = nn.Sequential(nn.Flatten(), nn.Dropout(0.5))
    cached = cache_rows(module, tmp_path, key="index")
    with torch.no_grad():
        handed_out = batches(data, size=8)  # nothing answered yet: every input came
        data.version = "data@2"
        module[1].train()
        with (
            pytest.warns(SomatizeWarning, match="DataLoader again"),
            pytest.warns(StillChanging),
        ):
            out = cached(handed_out[0])
    assert not module[1].training
    assert torch.equal(out, first[handed_out[0].index].flatten(1))


class _GradModes(nn.Module):
    """Notes whether gradients are on each time it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(torch.is_grad_enabled())
        return x.flatten(1)


def test_rows_answered_from_their_inputs_after_a_new_version_run_without_gradients(
    tmp_path: Path,
) -> None:
    """Rows handed out under a version their Deferred no longer holds run as the cache runs
    any row it computes, without gradients, not in the caller's grad mode (a training
    step's): nothing of theirs is recorded for a backward pass that cannot reach them."""
    data = Deferred(images(22, 8), version="data@1")
    module = _GradModes()
    cached = cache_rows(module, tmp_path, key="index")
    handed_out = batches(data, size=4)  # nothing answered yet: every input came
    cached(handed_out[0])  # computed under data@1, as any row is
    data.version = "data@2"
    with pytest.warns(SomatizeWarning, match="DataLoader again"):
        out = cached(handed_out[1])
    assert torch.is_grad_enabled() and module.modes and not any(module.modes)
    assert not out.requires_grad


@pytest.mark.parametrize("was", ["data@1", None], ids=["its-own", "the-cache's"])
def test_a_new_version_of_its_own_is_not_taken_from_workers_holding_the_old(
    tmp_path: Path, was: str | None
) -> None:
    """A Deferred given a version of its own as its inputs changed in place (a tensor in
    shared memory, as files rewritten on disk), its persistent DataLoader kept: the
    workers hand out batches under the version before (its own, or the cache's) with the
    new inputs. The cache answers them from the inputs they carry, recalling nothing kept
    under the old version and keeping nothing under it, with a warning saying to make the
    DataLoader again; a fresh cache recalls only the old data's rows under the old version."""
    first, second = images(19, 16), images(20, 16)
    lent = None if was else "data@1"  # the cache's version, where the Deferred has none
    data = Deferred(first.clone().share_memory_(), version=was)
    cached = cache_rows(encoder(), tmp_path, key="index", version=lent)
    loader = DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    with torch.no_grad():
        for n, rows in enumerate(loader):
            if n < 2:  # samples 0-7 kept under data@1, 8-15 not
                assert torch.equal(cached(rows), cached.module(first[rows.index]))
        data.inputs.copy_(second)
        data.version = "data@2"
        with pytest.warns(SomatizeWarning, match="DataLoader again") as warned:
            for rows in loader:
                assert len(rows.given_at) == len(rows)
                assert torch.equal(cached(rows), cached.module(rows.load()))
        assert len([w for w in warned if "DataLoader again" in str(w.message)]) == 1
        cached.flush()
        fresh = cache_rows(encoder(), tmp_path, key="index", version=lent)
        for rows in batches(Deferred(first, version=was), size=4):
            assert torch.allclose(fresh(rows), fresh.module(first[rows.index]), atol=1e-6)
        assert fresh.stats.from_store == 8


@pytest.mark.parametrize("in_place", [False, True], ids=["given", "in-place"])
@pytest.mark.parametrize("workers", [0, 1], ids=["made-before", "persistent"])
def test_inputs_loaded_before_new_inputs_are_not_kept_under_the_new_version(
    tmp_path: Path, workers: int, in_place: bool
) -> None:
    """A Deferred without a version of its own, given other inputs (or its inputs changed
    in place) under a new version of its cache: rows whose inputs were loaded from it as
    it was (by persistent workers, which hold it as it was when they started, or made
    before) are computed from its inputs as they are now, never kept under the new
    version from the old ones, so that a fresh loader and cache recall the new data's
    answers."""
    first, second = images(16, 8), images(17, 8)
    data = Deferred(first.clone())
    cached = cache_rows(encoder(), tmp_path, key="index", version="data@1")
    with torch.no_grad():
        loader = DataLoader(data, batch_size=4, num_workers=workers, persistent_workers=workers > 0)
        cached(next(iter(loader)))  # samples 0-3 answered under data@1
        pending = iter(loader)  # workers start; samples 4-7 come with the inputs of then
        if workers == 0:
            pending = iter(list(pending))
        if in_place:
            data.inputs.copy_(second)
        else:
            data.inputs = second
        cached.version = "data@2"
        given = 0
        for rows in pending:
            given += len(rows.given_at)
            assert torch.equal(cached(rows), cached.module(second[rows.index]))
        # Samples 4-7 came with the old inputs; more may, as workers see the flags cleared
        # by the new inputs (shared with them) while they load, each of the old data too.
        assert given >= 4
        cached.flush()
        fresh = cache_rows(encoder(), tmp_path, key="index", version="data@2")
        for rows in batches(data, size=4):
            assert torch.equal(fresh(rows), fresh.module(second[rows.index]))


def test_inputs_that_came_under_the_version_they_were_keyed_under_are_taken(
    tmp_path: Path,
) -> None:
    """The inputs persistent workers load are taken as they come while the cache keys them
    under the version it first keyed their Deferred's rows under, though its version was
    another meanwhile (a validation stage's, as the callback keys it); and a loader made
    after the cache's version changed has its workers' inputs taken: nothing is loaded in
    the loop's process."""
    x = images(18, 16)
    inputs = Counted(x)
    data = Deferred(inputs)
    cached = cache_rows(encoder(), tmp_path, key="index", version="data@1")
    first = DataLoader(data, batch_size=4, sampler=range(8), num_workers=1, persistent_workers=True)
    with torch.no_grad():
        pending = iter(first)
        for epoch in range(2):
            for n, rows in enumerate(pending):
                if epoch == 0 and n == 1:  # a stage of its own in between
                    cached.version = "data@1|validate"
                    cached.version = "data@1"
                assert torch.equal(cached(rows), cached.module(x[rows.index]))
            pending = iter(first)
        cached.version = "data@2"
        later = DataLoader(data, batch_size=4, sampler=range(8, 16), num_workers=1)
        for rows in later:
            assert len(rows.given_at) == 4
            assert torch.equal(cached(rows), cached.module(x[rows.index]))
    assert inputs.loaded == [] and cached.stats.computed == 16


def test_a_deferred_saved_before_its_inputs_could_be_given_anew_loads() -> None:
    """A Deferred saved (`torch.save`, pickle) as it was written before its inputs could be
    given anew, holding them as `inputs` and no generation, loads and hands out its
    samples, from generation 0."""
    images = torch.randn(6, 3)
    saved = dict(vars(Deferred(images, version="v1")))
    saved["inputs"] = saved.pop("_inputs")
    del saved["generation"], saved["_inputs_from"]
    loaded = Deferred.__new__(Deferred)
    loaded.__setstate__(saved)
    assert loaded.inputs is images and loaded.generation == 0
    assert torch.equal(loaded[2].value, images[2])


def test_samples_answered_under_the_caches_old_version_come_with_their_inputs_again(
    tmp_path: Path,
) -> None:
    """A Deferred without a version of its own whose cache is given a new one (its data
    changed in place): its samples answered under the old version are not answered under
    the new, so their inputs come with them again, loaded with the samples rather than
    one by one by the loop. A stage's version in between leaves them answered, and
    keying under the old version again finds them answered."""
    x = images(19, 16)
    inputs = Counted(x)
    data = Deferred(inputs)
    cached = cache_rows(encoder(), tmp_path, key="index", version="data@1")
    with torch.no_grad():
        for rows in batches(data, size=4):
            cached(rows)
        cached.version = "data@1|validate"  # a stage of its own, and back
        cached.version = "data@1"
        assert bool(data.answered.all())
        x.mul_(2)  # the data changed in place
        cached.version = "data@2"
        loaded = len(inputs.loaded)
        for rows in batches(data, size=4):
            assert len(rows.given_at) == 4
            assert torch.equal(cached(rows), cached.module(x[rows.index]))
        assert len(inputs.loaded) == loaded + 16 and bool(data.answered.all())
        cached.version = "data@1"
        assert bool(data.answered.all())


def test_caches_of_two_versions_reading_one_deferred_switch_its_marks_copying_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two caches of different versions reading one Deferred without a version of its own,
    batch by batch, each find the samples answered under their own version, and switching
    between them copies no marks: each switch cloned the marks held and copied the others
    in, a bool per sample of the dataset at every batch of each cache."""
    x = images(20, 40)
    data = Deferred(Counted(x))
    first = cache_rows(encoder(), tmp_path / "a", key="index", version="a@1")
    second = cache_rows(nn.Sequential(encoder(), nn.Tanh()), tmp_path / "b", key="index")
    second.version = "b@1"
    copied: list[str] = []

    def counting(name: str) -> Any:
        plain = getattr(torch.Tensor, name)

        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.dtype == torch.bool and tensor.shape == (len(data),):
                copied.append(name)
            return plain(tensor, *args, **kwargs)

        return counted

    with torch.no_grad():
        first(next(iter(batches(data, size=40))))  # the marks of both versions exist
        second(next(iter(batches(data, size=40))))
        monkeypatch.setattr(torch.Tensor, "clone", counting("clone"))
        monkeypatch.setattr(torch.Tensor, "copy_", counting("copy_"))
        for rows in batches(data, size=8):
            assert len(rows.given_at) == 0  # answered under b@1, held last
            assert torch.equal(first(rows), first.module(x[rows.index]))
            assert bool(data.answered.all())  # a@1's marks, held again
            assert torch.equal(second(rows), second.module(x[rows.index]))
            assert bool(data.answered.all())
    assert copied == []


def test_a_deferred_saved_with_the_marks_of_one_version_loads_them() -> None:
    """A Deferred saved (pickle) as it was written when it held the marks of one version
    at a time, and kept others' as copies, loads holding the marks it held."""
    data = Deferred(torch.randn(6, 3))
    saved = {k: v for k, v in vars(data).items() if k not in ("_marks", "_held", "_rows")}
    saved["answered"] = torch.tensor([True, False, True, False, False, False])
    saved["_marks_of"], saved["_marks_kept"] = "a@1", {None: torch.zeros(6, dtype=torch.bool)}
    saved["name"] = "saved elsewhere"
    loaded = Deferred.__new__(Deferred)
    loaded.__setstate__(saved)
    assert loaded.answered.tolist() == saved["answered"].tolist()
    assert loaded.answered.is_shared() and loaded[1].value is not None and loaded[0].value is None
    loaded.marks_under("b@1")
    assert not bool(loaded.answered.any())


def test_a_deferred_pickled_carries_the_marks_held_as_the_release_before_reads_them() -> None:
    """A Deferred pickled carries the marks of the version held as `answered` too: the
    release before this one (f43888e) reads its marks from that alone, and failed, loading
    one pickled here, with `AttributeError: ... no attribute 'answered'` at its first
    sample. Loaded here, it holds the marks it was saved with."""
    data = Deferred(torch.randn(6, 3), version="a@1")
    data.answered[[0, 2]] = True  # in place: the marks held
    handed = data.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2]
    assert handed["answered"].tolist() == [True, False, True, False, False, False]
    saved = pickle.dumps(data)
    del data, handed  # loaded as in another process, where the one saved is not
    loaded = pickle.loads(saved)
    assert loaded.answered.tolist() == [True, False, True, False, False, False]
    assert "answered" not in vars(loaded)  # read from the marks, as they change


def _bytes_taken(data: Deferred) -> int:
    """The bytes of memory the shared file under ``data``'s marks takes (its pages made)."""
    fd = getattr(data, "_marks_fd", None)
    if fd is None:
        fd, _ = data._marks.untyped_storage()._share_fd_cpu_()
    return int(os.fstat(fd).st_blocks) * 512


@pytest.mark.skipif(
    not hasattr(os, "memfd_create"), reason="marks take memory once written on Linux"
)
def test_the_marks_of_versions_not_used_take_no_memory() -> None:
    """A Deferred of a million samples takes no memory for the rows kept for versions it
    has not used: they reserved a bool per sample each, 9 times the dataset's count of
    shared memory (90 MB for 10 M samples, more than a container's /dev/shm holds)."""
    data = Deferred(torch.zeros(1_000_000, 1, dtype=torch.uint8))
    assert _bytes_taken(data) < 100_000
    data.answered[:1000] = True
    data.marks_under("b@1")
    assert _bytes_taken(data) < 100_000


def test_a_deferred_saved_carries_the_marks_of_the_versions_used_alone() -> None:
    """A Deferred saved (torch.save, pickle) carries the marks of the versions it holds,
    not the 9 rows kept for versions to come, read (and made in memory) to be written,
    twice over in a pickle; loaded, it holds each version's marks."""
    data = Deferred(torch.zeros(100_000, 1, dtype=torch.uint8), version="a@1")
    data.answered[:10] = True
    data.marks_under("b@1")
    data.answered[5:20] = True
    saved = io.BytesIO()
    torch.save(data, saved)
    assert len(pickle.dumps(data)) < 4 * 100_000 and len(saved.getvalue()) < 4 * 100_000
    saved.seek(0)
    del data
    loaded = torch.load(saved, weights_only=False)
    assert loaded.answered.nonzero().flatten().tolist() == list(range(5, 20))
    loaded.marks_under("a@1")
    assert loaded.answered.nonzero().flatten().tolist() == list(range(10))
    loaded.answered[40] = True
    assert int(loaded._marks.sum()) == 26


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts this process's files")
def test_a_deferred_holds_one_file_for_its_marks_and_the_row_held() -> None:
    """A Deferred's marks and the row of them held share one piece of memory, so it holds
    one file descriptor, as one shared tensor of marks did: a dataset made of many of them
    (one a shard) runs out of files no sooner than before."""
    before = len(os.listdir("/proc/self/fd"))
    made = [Deferred(torch.zeros(4, 1)) for _ in range(50)]
    assert len(os.listdir("/proc/self/fd")) - before <= len(made)
    made[7].marks_under("b@1")
    made[7].answered[2] = True
    assert made[7].answered.nonzero().flatten().tolist() == [2]


@pytest.mark.parametrize("start", ["fork", "spawn", "forkserver"])
def test_persistent_workers_of_every_start_method_see_marks_and_switches(start: str) -> None:
    """Persistent DataLoader workers, forked, spawned or started by a fork server, read
    the marks a cache writes after they started, of the version held as it switches."""
    data = Deferred(torch.arange(8.0).unsqueeze(1), version="a@1")
    loader = DataLoader(
        data, batch_size=8, num_workers=1, persistent_workers=True, multiprocessing_context=start
    )
    assert len(next(iter(loader)).given_at) == 8  # the workers started
    data.mark_answered(torch.tensor([1, 3]), "a@1")
    assert next(iter(loader)).given_at == [0, 2, 4, 5, 6, 7]
    data.marks_under("b@1")
    data.mark_answered(torch.tensor([0]), "b@1")
    assert next(iter(loader)).given_at == [1, 2, 3, 4, 5, 6, 7]
    data.marks_under("a@1")
    assert next(iter(loader)).given_at == [0, 2, 4, 5, 6, 7]


def test_marks_fall_back_to_torchs_shared_memory_where_a_memory_file_cannot_be_mapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the memory file of a Deferred's marks cannot be mapped (no /proc), they are
    made in torch's shared memory, and workers still share them."""

    def unmapped(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("unable to open /proc/self/fd")

    monkeypatch.setattr(torch.UntypedStorage, "from_file", unmapped)
    data = Deferred(torch.zeros(10, 1))
    assert data._marks_fd is None and data.answered.is_shared()
    data.answered[3] = True
    saved = pickle.dumps(data)
    del data  # loaded as in another process, where the one saved is not
    assert pickle.loads(saved).answered.nonzero().flatten().tolist() == [3]
