"""Fetching a batch ahead and naming its rows on another thread (somatize_torch.ahead)."""

from __future__ import annotations

import threading
from collections import UserDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import somatize_torch._row_keys as row_keys
from somatize import Store
from somatize_torch.ahead import _UNUSED_LIMIT, Ahead, ahead
from somatize_torch.digest import RowsLater
from somatize_torch.rows import CachedRows, cache_rows
from tests.test_torch_rows import (
    MaskedTokens,
    PooledTokens,
    encoder,
    expected,
    images,
    loader,
    tokenized,
)


@pytest.fixture
def warm(store: Store) -> Iterator[CachedRows]:
    """A content-keyed cache that has seen every row of ``images(64)``."""
    made = cache_rows(encoder(), store)
    for x, _ in loader(images(64)):
        made(x)
    made.reset_stats()
    yield made
    made.close()


def test_items_come_through_in_the_loaders_order_with_its_length_and_attributes(
    warm: CachedRows,
) -> None:
    data = images(64)
    plain = torch.cat([index for _, index in loader(data, seed=3)])
    wrapped = ahead(loader(data, seed=3), warm)
    assert torch.equal(torch.cat([index for _, index in wrapped]), plain)
    assert len(wrapped) == 4
    assert wrapped.batch_size == 16 and isinstance(wrapped.dataset, TensorDataset)


def test_an_attribute_set_on_an_ahead_is_deleted_from_its_loader() -> None:
    """An attribute set on an Ahead lands on its loader, and ``del`` takes it off the
    loader again. It raised AttributeError, the attribute left on the loader."""
    plain = loader(images(8))
    wrapped = Ahead(plain, [])
    wrapped.note = "epoch 3"
    assert plain.note == "epoch 3"  # type: ignore[attr-defined]
    del wrapped.note
    assert not hasattr(plain, "note") and not hasattr(wrapped, "note")
    with pytest.raises(AttributeError):
        del wrapped.note


def test_a_loop_that_stops_at_the_length_sees_the_same_shuffles(warm: CachedRows) -> None:
    """A loop that takes ``len(loader)`` batches and stops (as Lightning's does) is never
    fetched past the end: an exhausted DataLoader would draw from its shuffling
    generator, and the epochs after would be shuffled otherwise than without ahead."""

    def orders(batches: Any) -> list[list[int]]:
        seen = []
        for _ in range(3):
            epoch = iter(batches)
            seen.append([int(i) for _ in range(len(batches)) for i in next(epoch)[1]])
        return seen

    assert orders(ahead(loader(images(64)), warm)) == orders(loader(images(64)))


def test_every_forward_finds_its_rows_named_ahead(
    warm: CachedRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 2 through ahead: the rows of every batch were named before its forward,
    which names none itself, and every answer is the encoder's."""
    in_forward = 0
    real = row_keys.raw_rows

    def counted(x: torch.Tensor) -> list[bytes]:
        nonlocal in_forward
        in_forward += 1
        return real(x)

    monkeypatch.setattr(row_keys, "raw_rows", counted)
    data = images(64)
    truth = expected(warm.module, data)
    for x, index in ahead(loader(data, seed=5), warm):
        assert torch.equal(warm(x), truth[index])
    assert warm.used_ahead == 4 and warm.stats.hit_rate == 1.0
    assert in_forward == 0


def test_a_batch_changed_in_place_after_naming_is_named_again(warm: CachedRows) -> None:
    """Names made ahead are for the tensor as the loader gave it: a change in place
    (which bumps its version counter) makes the forward name it again — no stale answer."""
    data = images(64)
    doubled = expected(warm.module, data * 2)
    for x, index in ahead(loader(data, seed=5), warm):
        x.mul_(2)
        assert torch.equal(warm(x), doubled[index])
    assert warm.used_ahead == 0
    assert warm.stats.computed == 64  # the doubled rows are new rows, all computed


@pytest.mark.parametrize("swap", ["grown", "shared"])
def test_a_batch_whose_memory_is_swapped_after_naming_is_named_again(
    warm: CachedRows, swap: str
) -> None:
    """A batch grown (`resize_`) or moved to shared memory (`share_memory_`) after it was
    named holds its values in other memory: its forward names it again and answers what
    it holds now. (The swap waits for the naming here: the memory it frees could be
    being read.)"""
    x = images(64)[:16].clone()
    assert warm.name_ahead(x)
    warm._named[id(x)][2].result()
    held = x.clone()
    if swap == "grown":
        x.resize_(24, *x.shape[1:])  # the rows past the 16th hold whatever the memory did
    else:
        x.share_memory_()
    assert torch.equal(warm(x)[:16], expected(warm.module, held))
    assert warm.used_ahead == 0


def test_weights_changed_after_naming_give_the_new_weights_answers(warm: CachedRows) -> None:
    data = images(64)
    batches = ahead(loader(data, seed=5), warm)
    for step, (x, index) in enumerate(batches):
        if step == 2:
            with torch.no_grad():
                warm.module[0].weight.add_(0.5)  # type: ignore[index, union-attr, operator]
        assert torch.equal(warm(x), expected(warm.module, data)[index])
    assert warm.used_ahead == 4  # the names are of the content, right under any weights


class Labelled(Dataset[dict[str, torch.Tensor]]):
    """Items whose image is not where a first guess looks (neither first nor `x`)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"label": torch.tensor(i % 3), "image": self.data[i], "index": torch.tensor(i)}


def test_which_tensor_is_the_input_is_learned_from_the_steps(warm: CachedRows) -> None:
    data = images(64)
    truth = expected(warm.module, data)
    items = DataLoader(Labelled(data), batch_size=8, shuffle=True)
    for item in ahead(items, warm):
        assert torch.equal(warm(item["image"]), truth[item["index"]])
    # The batch fetched before the first step could not be named; the rest were. (The
    # second is fetched after it: a first pass fetches in order until the loader is seen
    # to hand out fresh memory.)
    assert warm.used_ahead == 8 - 1


@pytest.mark.parametrize("module", [PooledTokens, MaskedTokens])
def test_a_tokenizer_s_dict_is_named_from_its_first_batch(
    store: Store, module: Callable[[], nn.Module]
) -> None:
    """A dict with no ``x`` or ``input`` (a tokenizer's ``input_ids`` and
    ``attention_mask``) is named by the tensor under the name of the module's forward's
    first parameter, as ``prefill`` takes it, from the first batch on: the first was left
    unnamed, to be learned from the step. A mask the forward takes too is no refusal
    here: the loop says what it hands the cache, and a wrong guess is learned away."""
    batches = tokenized(32)
    cached = cache_rows(module(), store)
    for batch in batches:
        cached(batch["input_ids"])
    cached.reset_stats()
    for batch in ahead(batches, cached):
        assert torch.equal(cached(batch["input_ids"]), cached.module(batch["input_ids"]))
    assert cached.used_ahead == len(batches) == 8
    cached.close()


def test_inputs_says_which_tensor_outright(warm: CachedRows) -> None:
    data = images(64)
    items = DataLoader(Labelled(data), batch_size=8, shuffle=True)
    for item in ahead(items, warm, inputs=lambda item: item["image"]):
        warm(item["image"])
    assert warm.used_ahead == 8


def test_a_cache_never_fed_what_was_named_is_no_longer_named_for(warm: CachedRows) -> None:
    data = images(256)
    batches = DataLoader(TensorDataset(data), batch_size=8)
    for (x,) in ahead(batches, warm, depth=1):
        warm(x.clone())  # another tensor than the one named: its names are never used
    assert warm.used_ahead == 0
    assert warm.named_ahead <= 1 + _UNUSED_LIMIT + 2


class Failing(Dataset[torch.Tensor]):
    def __init__(self, data: torch.Tensor, bad: int) -> None:
        self.data, self.bad = data, bad

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise KeyError(f"sample {i} is missing")
        return self.data[i]


def test_a_loader_error_is_raised_in_the_loop_after_the_batches_before_it(
    warm: CachedRows,
) -> None:
    seen = 0
    with pytest.raises(KeyError, match="sample 5 is missing"):
        for x in ahead(DataLoader(Failing(images(8), bad=5), batch_size=1), warm):
            warm(x)
            seen += 1
    assert seen == 5


def _skipping(batches: Any, cached: CachedRows) -> tuple[list[torch.Tensor], list[str]]:
    """A pass that skips every batch the loader fails on, as a loop over a loader with a
    corrupt sample does."""
    taken: list[torch.Tensor] = []
    skipped: list[str] = []
    fetching = iter(batches)
    while True:
        try:
            x = next(fetching)
        except StopIteration:
            return taken, skipped
        except KeyError as why:
            skipped.append(str(why))
            continue
        cached(x)
        taken.append(x)


@pytest.mark.parametrize("draws", [None, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_that_skips_a_batch_the_loader_fails_on_gets_every_other_batch(
    warm: CachedRows, workers: int, draws: bool | None
) -> None:
    """After a loader error the pass goes on at the next ``next()``, as on the loader's own
    iterator: a loop that skips a corrupt sample gets the same batches as without ahead,
    whether the pass is fetched ahead or in order with its draws watched."""

    def failing() -> DataLoader[torch.Tensor]:
        return DataLoader(Failing(images(16), bad=5), batch_size=2, num_workers=workers)

    wrapped = Ahead(failing(), [warm])
    wrapped.draws = draws
    taken, skipped = _skipping(wrapped, warm)
    plain, plain_skipped = _skipping(failing(), warm)
    assert skipped == plain_skipped and len(skipped) == 1
    assert len(taken) == 7 and all(torch.equal(a, b) for a, b in zip(taken, plain, strict=True))


def _failing_at(call: int) -> Callable[[Any], torch.Tensor]:
    """An ``inputs=`` taking each item's image, which finds none at its ``call``-th call."""
    calls = 0

    def inputs(item: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == call:
            raise LookupError("this item has no image")
        x: torch.Tensor = item[0]
        return x

    return inputs


def test_after_an_inputs_error_the_next_batch_comes(warm: CachedRows) -> None:
    """An error from ``inputs=`` costs its batch only: the next ``next()`` hands out the
    batch after it."""
    data = images(64)
    fetching = iter(ahead(loader(data, seed=2), warm, inputs=_failing_at(2)))
    indices = [next(fetching)[1]]
    with pytest.raises(LookupError, match="no image"):
        next(fetching)
    indices += [index for _, index in fetching]
    order = [index for _, index in loader(data, seed=2)]
    assert len(indices) == 3
    assert all(torch.equal(a, b) for a, b in zip(indices, order[:1] + order[2:], strict=True))


def test_an_inputs_error_is_raised_in_the_loop_at_its_batch(warm: CachedRows) -> None:
    seen = 0
    with pytest.raises(LookupError, match="no image"):
        for x, _ in ahead(loader(images(64)), warm, inputs=_failing_at(3)):
            warm(x)
            seen += 1
    assert seen == 2


def test_a_stop_iteration_from_inputs_is_raised_as_an_error_not_the_loops_end(
    warm: CachedRows,
) -> None:
    """``inputs=`` that picks the image out of an item with ``next()`` over its tensors
    raises StopIteration for an item that holds none: that is its error at that batch, not
    the end of the loader, which would end the loop there silently and lose every batch
    after it."""
    data = images(64)
    items = [(data[16 * k : 16 * (k + 1)], torch.tensor(k)) for k in range(4)]
    items[1] = (torch.tensor(1),)  # no image in it

    def image(item: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return next(t for t in item if t.dim() == 4)

    fetching = iter(ahead(items, warm, inputs=image))
    seen = [next(fetching)[1]]
    with pytest.raises(RuntimeError, match="StopIteration") as raised:
        next(fetching)
    assert isinstance(raised.value.__cause__, StopIteration)
    for x, k in fetching:
        torch.testing.assert_close(warm(x), expected(warm.module, x))
        seen.append(k)
    assert [int(k) for k in seen] == [0, 2, 3]


def test_naming_that_fails_on_the_other_thread_is_done_in_the_forward(
    warm: CachedRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(self: RowsLater) -> list[bytes]:
        raise MemoryError("no room to name these rows")

    monkeypatch.setattr(RowsLater, "result", fails)
    data = images(64)
    truth = expected(warm.module, data)
    for x, index in ahead(loader(data, seed=5), warm):
        assert torch.equal(warm(x), truth[index])
    assert warm.named_ahead == 4 and warm.used_ahead == 0
    assert warm.stats.hit_rate == 1.0


def test_naming_that_fails_as_it_starts_costs_no_batch(
    warm: CachedRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose naming ahead raises is handed out all the same, and its forward names
    its rows itself: the loop gets every batch and every answer is the encoder's."""

    def fails(self: CachedRows, x: torch.Tensor) -> bool:
        raise RuntimeError("these rows cannot be named here")

    monkeypatch.setattr(CachedRows, "name_ahead", fails)
    data = images(64)
    truth = expected(warm.module, data)
    seen = 0
    for x, index in ahead(loader(data, seed=5), warm):
        assert torch.equal(warm(x), truth[index])
        seen += 1
    assert seen == 4 and warm.stats.hit_rate == 1.0


def test_an_item_whose_first_tensor_is_sparse_comes_through(warm: CachedRows) -> None:
    """Items of a sparse tensor then the cache's input: before the first step the sparse
    tensor is the guess, which cannot be named ahead; the loop gets every item all the
    same, and the input is learned from the step."""
    data = images(64)
    truth = expected(warm.module, data)
    items = [
        (torch.eye(16).to_sparse(), data[16 * k : 16 * (k + 1)], torch.arange(16 * k, 16 * (k + 1)))
        for k in range(4)
    ]
    seen = 0
    for _, x, index in ahead(items, warm):
        assert torch.equal(warm(x), truth[index])
        seen += 1
    assert seen == 4


def test_leaving_the_loop_early_and_iterating_again(warm: CachedRows) -> None:
    data = images(64)
    batches = ahead(loader(data), warm)
    for step, (x, _) in enumerate(batches):
        warm(x)
        if step == 1:
            break
    again = [warm(x) for x, _ in batches]
    assert len(again) == 4 and warm.stats.hit_rate == 1.0


def test_names_no_forward_takes_are_let_go_when_the_pass_ends(warm: CachedRows) -> None:
    """A loop that feeds the cache another tensor than the batch (normalized, moved) never
    takes the names made ahead: the cache holds none of those batches once the loop is
    over, left early, or closed; an exhausted pass still held keeps only its last batch's."""
    data = images(256)
    batches = DataLoader(TensorDataset(data), batch_size=16)
    for (x,) in ahead(batches, warm):
        warm(x * 1.0)
    assert warm.named_ahead > 0 and warm.used_ahead == 0
    assert not warm._named
    for step, (x,) in enumerate(ahead(batches, warm)):
        warm(x * 1.0)
        if step == 1:
            break
    assert not warm._named
    fetching = iter(ahead(batches, warm))
    for _ in range(3):
        next(fetching)
    assert warm._named
    fetching.close()  # type: ignore[attr-defined]  # a pass closes as a generator does
    assert not warm._named
    fetching = iter(ahead(loader(images(64)), warm))  # few enough to be named all
    kept = [x for x, _ in fetching]
    assert list(warm._named) == [id(kept[-1])]


def test_a_pass_collected_inside_the_names_lock_does_not_wait_for_it(warm: CachedRows) -> None:
    """A pass collected while its own thread is inside the cache's lock over the names (a
    collection run in the middle of that block) leaves them, where waiting for the lock
    would hang for good."""
    fetching = iter(ahead(loader(images(64)), warm))
    next(fetching)
    with warm._named_lock:
        del fetching
    assert warm._named


def test_a_loop_that_fetches_before_its_step_finds_every_batch_named(warm: CachedRows) -> None:
    """A loop that asks for the next batch before it runs the step (Lightning's fetches
    one ahead) runs its last step after the pass is exhausted: that batch's names are
    kept for it."""
    fetching = iter(ahead(loader(images(64)), warm))
    x, _ = next(fetching)
    while True:
        after = next(fetching, None)
        warm(x)
        if after is None:
            break
        x, _ = after
    assert warm.used_ahead == 4


@pytest.mark.parametrize("draws", [None, False])
def test_a_pass_closed_or_over_lets_the_loaders_iterator_go(
    warm: CachedRows, draws: bool | None
) -> None:
    """A pass closed early, or run to its end, lets go of the loader's iterator (a
    DataLoader's workers end with it), as a generator over it does."""
    data = images(64)
    ended: list[int] = []

    class Tracked:
        def __len__(self) -> int:
            return 4

        def __iter__(self) -> Iterator[torch.Tensor]:
            try:
                for k in range(4):
                    yield data[16 * k : 16 * (k + 1)]
            finally:
                ended.append(1)

    batches = Ahead(Tracked(), [warm])
    batches.draws = draws
    fetching = iter(batches)
    warm(next(fetching))
    fetching.close()  # type: ignore[attr-defined]  # a pass closes as a generator does
    assert ended == [1]
    fetching = iter(batches)
    for x in fetching:
        warm(x)
    assert ended == [1, 1]


def test_an_index_keyed_cache_has_nothing_named(store: Store) -> None:
    data = images(32)
    by_index = cache_rows(encoder(), store, key="index", version="images@1")
    truth = expected(by_index.module, data)
    for x, index in ahead(loader(data), by_index):
        assert torch.equal(by_index(x, index=index), truth[index])
    assert by_index.named_ahead == 0
    by_index.close()


def test_bad_arguments_are_refused(warm: CachedRows) -> None:
    batches = loader(images(16))
    with pytest.raises(TypeError, match="cache_rows"):
        ahead(batches, torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth"):
        ahead(batches, warm, depth=0)
    with pytest.raises(TypeError, match="already fetched ahead"):
        ahead(ahead(batches, warm), warm)
    assert isinstance(ahead(batches), Ahead)


def _forward_in_child(cached: CachedRows, x: torch.Tensor) -> bool:
    return bool(torch.equal(cached(x), expected(cached.module, x)))


@pytest.mark.parametrize("native", [True, False])
def test_rows_named_before_a_fork_are_right_in_the_child(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """A child forked while its parent was naming a batch (the thread doing it stays in
    the parent) names the rows itself: its answers are the module's own, never the answer
    of rows left unnamed."""
    from somatize_torch import _native
    from tests.forked import in_forked_child

    if not native:
        monkeypatch.setattr(_native, "ready_host_library", lambda: None)
    cached = cache_rows(encoder(), None)
    x = torch.randn(4096, 3, 32, 32)  # 50 MB: still being named when the parent forks
    assert cached.name_ahead(x)
    assert in_forked_child(_forward_in_child, cached, x, timeout=60)
    assert torch.equal(cached(x), expected(cached.module, x))


@pytest.mark.parametrize("kind", ["jagged nested", "wrapper subclass", "freed storage"])
def test_a_batch_the_forward_refuses_is_not_named_ahead(kind: str) -> None:
    """A batch the forward refuses (a nested tensor, a subclass) or cannot read (storage
    freed) is not named ahead, with the native library loaded or not: the forward says
    what is wrong."""
    from torch.testing._internal.two_tensor import TwoTensor

    from somatize_torch import _native

    if kind == "jagged nested":
        x = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
    elif kind == "wrapper subclass":
        values = torch.randn(3, 4)
        x = TwoTensor(values, values.clone())
    else:
        x = torch.randn(8, 4)
        x.untyped_storage().resize_(0)
    cached = cache_rows(nn.Linear(4, 2), None)
    lib = _native.host_library()  # loaded (built if need be), as after a background build
    assert lib is not None
    assert cached.name_ahead(x) is False
    assert cached.named_ahead == 0
    with pytest.raises(TypeError):
        cached(x)


def test_a_child_forked_while_a_thread_holds_the_names_lock_does_not_wait_on_it() -> None:
    """A child forked while another thread of its parent held the lock over the rows named
    ahead (a thread that stays behind in the parent) gets that lock afresh: its forwards
    answer, where they waited for good on a lock nobody in the child would let go."""
    from tests.forked import held_elsewhere, in_forked_child

    cached = cache_rows(encoder(), None)
    x = torch.randn(8, 3, 32, 32)
    assert cached.name_ahead(x)
    with held_elsewhere(cached._named_lock):
        assert in_forked_child(_forward_in_child, cached, x, timeout=60)


def test_a_loop_under_inference_mode_names_in_the_forward(warm: CachedRows) -> None:
    """A loop run under ``torch.inference_mode`` (a validation loop) goes through ahead:
    its batches are inference tensors, with no version counter to tell a change in place,
    so none is named ahead, and each forward names its own rows and answers them right."""
    data = images(64)
    truth = expected(warm.module, data)
    with torch.inference_mode():
        for x, index in ahead(loader(data, seed=5), warm):
            assert x.is_inference()
            assert torch.equal(warm(x), truth[index])
    assert warm.named_ahead == 0 and warm.used_ahead == 0
    assert warm.stats.hit_rate == 1.0


@pytest.mark.parametrize("draws", [None, False, True])
def test_iter_makes_the_loaders_iterator_at_once(warm: CachedRows, draws: bool | None) -> None:
    """``iter()`` makes the loader's iterator there and then, as on the loader itself: a
    DataLoader draws its base seed from torch's generator as its iterator is made, and a
    loop over several loaders (Lightning's CombinedLoader) makes every iterator before it
    fetches from any — a draw put off to the first batch would give each loader another
    loader's numbers. Whether the pass is fetched ahead, in order, or checked for draws."""

    def unseeded() -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(TensorDataset(images(64), torch.arange(64)), batch_size=16, shuffle=True)

    def orders(first: Any, second: Any) -> list[list[int]]:
        torch.manual_seed(0)
        epochs = [iter(first), iter(second)]  # both made, then both fetched from
        return [[int(i) for batch in epoch for i in batch[1]] for epoch in epochs]

    wrapped = [Ahead(unseeded(), [warm]) for _ in range(2)]
    for one in wrapped:
        one.draws = draws  # None: checked in order; False: ahead; True: as the loader
    assert orders(*wrapped) == orders(unseeded(), unseeded())


def test_a_dropped_cache_is_named_for_no_more(warm: CachedRows) -> None:
    """``drop`` lets go of a cache (its module was put back uncached): the loader is then
    passed through as it is, and nothing holds the cache."""
    batches = Ahead(loader(images(64)), [warm])
    batches.drop(warm)
    assert batches.caches == [] and not batches._paths
    assert [index.tolist() for _, index in batches] == [
        index.tolist() for _, index in loader(images(64))
    ]
    assert warm.named_ahead == 0


class Counting:
    """Slices of one tensor (fresh batches), counting the fetches; each draws from torch's
    generator as it is fetched where ``draws``."""

    def __init__(self, data: torch.Tensor, draws: bool) -> None:
        self.data, self.draws = data, draws
        self.fetched = 0

    def __len__(self) -> int:
        return self.data.shape[0] // 16

    def __iter__(self) -> Iterator[torch.Tensor]:
        for k in range(len(self)):
            if self.draws:
                torch.rand(())
            self.fetched += 1
            yield self.data[16 * k : 16 * (k + 1)]


@pytest.mark.parametrize("draws", [False, True])
def test_check_draws_holds_for_a_loader_wrapped_anew_each_epoch(
    warm: CachedRows, draws: bool
) -> None:
    """``ahead(loader, cache, check_draws=True)`` made anew every epoch, as a loop written
    with ahead in it is: the first epoch is fetched in order, and the epochs after it are
    fetched ahead for a loader that drew nothing, in order for one that drew."""
    batches = Counting(images(64), draws)
    early = []  # per epoch: how many batches were fetched beyond each one the loop got
    for _ in range(3):
        batches.fetched = 0
        beyond = []
        for step, x in enumerate(ahead(batches, warm, check_draws=True)):
            beyond.append(batches.fetched - (step + 1))
            warm(x)
        early.append(max(beyond))
    assert early == ([0, 0, 0] if draws else [0, 1, 1])


def test_a_loader_seen_fresh_is_checked_again_deeper(warm: CachedRows) -> None:
    """A loader seen handing out fresh batches over one batch fetched ahead is known so to
    every Ahead over it that fetches one ahead; one that fetches further ahead checks it
    again (a loader taking turns between a few buffers refills them only further back)."""
    batches = Counting(images(64), draws=False)
    for x in ahead(batches, warm):
        warm(x)
    assert ahead(batches, warm).reuses is False
    assert ahead(batches, warm, depth=2).reuses is None


def test_what_is_known_of_a_loader_goes_with_it(warm: CachedRows) -> None:
    """The findings kept for a loader across its Aheads are let go with the loader."""
    from somatize_torch._ahead_passes import _FINDINGS

    batches = Counting(images(32), draws=False)
    for x in ahead(batches, warm, check_draws=True):
        warm(x)
    assert id(batches) in _FINDINGS
    gone = id(batches)
    del batches, x
    assert gone not in _FINDINGS


class Refilling:
    """A loader that hands out one buffer, filled again in place for every batch: through
    torch (``copy_``), or behind its back (numpy), wrapped as a new tensor each time."""

    def __init__(self, data: torch.Tensor, how: str) -> None:
        self.data, self.how = data, how
        self.buffer = torch.empty(16, *data.shape[1:])

    def __len__(self) -> int:
        return self.data.shape[0] // 16

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k in range(len(self)):
            rows = self.data[16 * k : 16 * (k + 1)]
            if self.how == "torch":
                self.buffer.copy_(rows)
                yield self.buffer, torch.arange(16 * k, 16 * (k + 1))
            else:
                self.buffer.numpy()[...] = rows.numpy()
                yield torch.from_numpy(self.buffer.numpy()), torch.arange(16 * k, 16 * (k + 1))


@pytest.mark.parametrize("how", ["torch", "numpy"])
@pytest.mark.parametrize("depth", [1, 2])
def test_a_loader_refilling_one_buffer_is_fetched_in_order(
    warm: CachedRows, how: str, depth: int
) -> None:
    """A loader that fills the batch it handed out again for the next: fetching ahead would
    hand the loop the next batch's inputs with this batch's labels. The first batches are
    fetched in order and seen to share memory, and every batch of every pass is the
    loader's own."""
    data = images(64)
    truth = expected(warm.module, data)
    batches = ahead(Refilling(data, how), warm, depth=depth)
    for _ in range(2):
        for x, index in batches:
            torch.testing.assert_close(x, data[index])
            torch.testing.assert_close(warm(x), truth[index])
    assert batches.reuses is True


class TakingTurns:
    """A loader that hands out its batches in ``buffers`` buffers in turn, each filled in
    place through torch: the batch before the one handed out last is filled again for the
    next."""

    def __init__(self, data: torch.Tensor, buffers: int) -> None:
        self.data = data
        self.buffers = [torch.empty(16, *data.shape[1:]) for _ in range(buffers)]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k in range(self.data.shape[0] // 16):
            buffer = self.buffers[k % len(self.buffers)]
            buffer.copy_(self.data[16 * k : 16 * (k + 1)])
            yield buffer, torch.arange(16 * k, 16 * (k + 1))


@pytest.mark.parametrize("depth", [1, 2])
def test_a_loop_that_fetches_before_its_step_gets_its_batch_unchanged(
    warm: CachedRows, depth: int
) -> None:
    """A loop that asks for the next batch before it runs the step on the one it has
    (Lightning's does, over a loader of no length) still holds that batch when a batch is
    fetched ahead: a loader taking turns between as many buffers as it works with when
    fetched in order (one more than ``depth``) is fetched in order, and every step gets
    its own batch."""
    data = images(128)
    truth = expected(warm.module, data)
    batches = ahead(TakingTurns(data, depth + 1), warm, depth=depth)
    for _ in range(3):
        fetching = iter(batches)
        held = next(fetching)
        while held is not None:
            following = next(fetching, None)  # before this batch's step
            x, index = held
            torch.testing.assert_close(x, data[index])
            torch.testing.assert_close(warm(x), truth[index])
            held = following
    assert batches.reuses is True


def test_a_loader_that_takes_turns_only_later_is_warned_of(
    warm: CachedRows, caplog: pytest.LogCaptureFixture
) -> None:
    """A loader seen handing out fresh batches that then fills two buffers in turn fills
    the buffer of the batch a loop fetching before its step still holds: that is warned
    of, as the loop gets the batch changed, and the loader is fetched in order from then
    on."""
    data = images(128)

    class Later:
        def __iter__(self) -> Iterator[torch.Tensor]:
            for k in range(4):
                yield data[16 * k : 16 * (k + 1)].clone()
            yield from (x for x, _ in TakingTurns(data[64:], 2))

    fetching = iter(ahead(Later(), warm))
    held = next(fetching)
    with caplog.at_level("INFO", logger="somatize.torch"):
        while held is not None:
            following = next(fetching, None)  # before this batch's step
            warm(held)
            held = following
    assert [r.levelname for r in caplog.records if "refill" in r.getMessage()] == ["WARNING"]
    assert fetching.ahead.reuses is True


class FreshThenOneBuffer:
    """A loader that hands out ``fresh`` batches of their own, then every batch after in one
    buffer it fills behind torch's back (numpy), wrapped as a new tensor each time: nothing
    of a batch handed out before says it was filled again."""

    def __init__(self, data: torch.Tensor, fresh: int) -> None:
        self.data, self.fresh = data, fresh
        self.buffer = torch.empty(16, *data.shape[1:])

    def __iter__(self) -> Iterator[torch.Tensor]:
        for k in range(self.data.shape[0] // 16):
            rows = self.data[16 * k : 16 * (k + 1)]
            if k < self.fresh:
                yield rows.clone()
            else:
                self.buffer.numpy()[...] = rows.numpy()
                yield torch.from_numpy(self.buffer.numpy())


@pytest.mark.parametrize("before_step", [False, True])
@pytest.mark.parametrize("fresh", [0, 4])
def test_a_batch_seen_filled_again_keeps_no_names_of_what_it_held(
    warm: CachedRows, before_step: bool, fresh: int
) -> None:
    """A batch whose memory the loader fills again for a later one, behind torch's back,
    holds that one's rows at its forward: the names made for what it held before are let
    go as the refill is seen, and none are made for what the loader hands out after, so the
    forward answers the rows it holds — not the rows kept for the batch it held, nor a
    computed row kept under their names. Seen fetching ahead (a loader fresh at first,
    warned of) and fetching in order before the loader is known (a loop fetching the next
    batch before its step)."""
    seen = images(64)  # every row seen by the cache: a stale name recalls its rows
    data = torch.cat([seen, seen.flip(0)])
    fetching = iter(ahead(FreshThenOneBuffer(data, fresh), warm))
    held = next(fetching)
    steps = 0
    while held is not None:
        following = next(fetching, None) if before_step else None
        torch.testing.assert_close(warm(held), expected(warm.module, held))
        steps += 1
        held = following if before_step else next(fetching, None)
    assert steps == 8
    assert fetching.ahead.reuses is True


def test_a_loader_of_fresh_or_constant_tensors_is_fetched_ahead(warm: CachedRows) -> None:
    """Slices of one tensor (memory that is never filled again) and a tensor handed in every
    item unchanged are no refilled buffer: batches are fetched and named ahead."""
    data = images(64)
    constant = torch.ones(3)

    def slices() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for k in range(4):
            yield data[16 * k : 16 * (k + 1)], torch.arange(16 * k, 16 * (k + 1)), constant

    class Slices:
        def __len__(self) -> int:
            return 4

        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            return slices()

    batches = ahead(Slices(), warm)
    for _ in range(2):
        for x, index, _ in batches:
            assert torch.equal(x, data[index])
            warm(x)
    assert batches.reuses is False
    assert warm.used_ahead == 8


def test_a_loader_with_workers_and_dict_items_gives_each_row_its_own_answer(
    warm: CachedRows,
) -> None:
    """Workers, a collate_fn making dicts whose input is not the first tensor, two loops
    left early: every answer is its own row's, and no thread is left behind."""
    data = images(64)
    truth = expected(warm.module, data)

    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {
            "index": torch.stack([index for _, index in samples]),
            "pixels": torch.stack([x for x, _ in samples]),
        }

    batches = DataLoader(
        TensorDataset(data, torch.arange(64)),
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=collate,
    )
    threads = len(threading.enumerate())
    for epoch in range(3):
        for step, item in enumerate(ahead(batches, warm)):
            assert torch.equal(warm(item["pixels"]), truth[item["index"]])
            if epoch < 2 and step == 3:
                break
    assert warm.used_ahead > 0
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread":
            thread.join(timeout=30)  # a worker queue's, ending as torch closes the queue
    assert len(threading.enumerate()) == threads


def test_ahead_refuses_a_tensor_a_dataset_and_settings_of_the_wrong_kind(
    warm: CachedRows,
) -> None:
    """ahead handed a batch tensor or a map-style dataset for a loader, an inputs= that is
    no function or a check_draws= that is no bool says which, where it went on to hand out
    single rows or samples (or turned on the check for a string "no")."""
    data = images(6)
    with pytest.raises(TypeError, match=r"ahead\(loader, \.\.\.\) takes a loader of batches"):
        ahead(data, warm)
    with pytest.raises(TypeError, match=r"a dataset.*DataLoader\(dataset"):
        ahead(TensorDataset(data), warm)
    with pytest.raises(TypeError, match=r"inputs= is a function of each loader item"):
        ahead(loader(data), warm, inputs=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"check_draws= is True or False, got 'no'"):
        ahead(loader(data), warm, check_draws="no")  # type: ignore[arg-type]


class Encoding(UserDict[str, torch.Tensor]):
    """A mapping that is no dict, as a tokenizer's ``BatchEncoding`` is."""


def test_which_tensor_of_a_mapping_is_the_input_is_learned_from_the_steps(
    warm: CachedRows,
) -> None:
    """A batch that is a mapping but no dict (a ``BatchEncoding``) is looked into as a
    dict is: its input is learned from the steps and named ahead. It was never named."""
    data = images(64)
    truth = expected(warm.module, data)
    items = DataLoader(Labelled(data), batch_size=8, shuffle=True, collate_fn=_as_encoding)
    for item in ahead(items, warm):
        assert torch.equal(warm(item["image"]), truth[item["index"]])
    assert warm.used_ahead == 8 - 1


def _as_encoding(samples: list[dict[str, torch.Tensor]]) -> Encoding:
    return Encoding(torch.utils.data.default_collate(samples))


class RefillingEncoding(Refilling):
    """``Refilling``, its batches handed out in a mapping that is no dict."""

    def __iter__(self) -> Iterator[Any]:
        for x, index in super().__iter__():
            yield Encoding(image=x, index=index)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_loader_refilling_one_buffer_in_a_mapping_is_fetched_in_order(
    warm: CachedRows, depth: int
) -> None:
    """A loader refilling one buffer it hands out in a mapping that is no dict is seen to,
    and fetched in order: every step gets its own batch. It was fetched ahead, and steps
    got the next batch's inputs beside their own indices."""
    data = images(64)
    truth = expected(warm.module, data)
    batches = ahead(RefillingEncoding(data, "torch"), warm, depth=depth)
    for _ in range(2):
        for item in batches:
            torch.testing.assert_close(item["image"], data[item["index"]])
            torch.testing.assert_close(warm(item["image"]), truth[item["index"]])
    assert batches.reuses is True
