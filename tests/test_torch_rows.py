"""Per-sample caching of a frozen module: one key per row, only missing rows run."""

from __future__ import annotations

import array
import collections
import contextlib
import copy
import dataclasses
import errno
import functools
import logging
import os
import re
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from moto.core.authorization import enable_iam_authentication
from torch import nn
from torch.autograd import forward_ad
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import somatize.torch as smt
from somatize import Store
from somatize.canonical import NotCanonical
from somatize.engine import Drifted
from somatize.keys import node_key, node_prefix
from somatize.store import StoreError
from somatize_torch import _row_keys, _row_lookup, _state
from somatize_torch._native import host_library
from somatize_torch._precision import kernels_off
from somatize_torch.deferred import Deferred, DeferredRows
from somatize_torch.digest import digest_rows
from somatize_torch.freeze import FreezeError, StillChanging, digest_state, is_held, release
from somatize_torch.rows import (
    CachedRows,
    KeyMode,
    NeedsIndex,
    NotRowwise,
    RowsError,
    RowStats,
    Unfrozen,
    cache_rows,
    prefill,
)
from somatize_torch.wrap import CachedInputNeedsGrad, WrapError
from somatize_torch.writer import WriteFailed
from tests.conftest_s3 import READS, s3_url, user
from tests.decoding import NotesWidth
from tests.drawing import AttendsBeside, DrawnBeside
from tests.forked import in_forked_child
from tests.global_modules import CHANGES, named_as_attributes_cell, normed_cell, run_cell, scaled
from tests.layouts import answers_as_its_weights_are_laid_out
from tests.state_dict_hooks import add_load_state_dict_pre_hook, add_state_dict_post_hook
from tests.test_torch_wrap import Answers, AnswersAsHuggingFace


def encoder(seed: int = 0) -> nn.Module:
    """A small conv encoder with BatchNorm, so eval mode matters."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    return model


def images(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def loader(data: torch.Tensor, seed: int = 0) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(
        TensorDataset(data, torch.arange(data.shape[0])),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )


def expected(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    module.eval()
    with torch.no_grad():
        out: torch.Tensor = module(x)
    return out


class Tally:
    rows = 0


@pytest.fixture
def count_rows(monkeypatch: pytest.MonkeyPatch) -> Callable[[nn.Module], Tally]:
    """Counts the rows an encoder is handed, from ``nn.Sequential``'s own ``forward`` (a
    forward hook, or a forward replaced on the instance, would be part of its key)."""
    tallies: dict[int, Tally] = {}
    plain = nn.Sequential.forward

    # A wrapper that names what it wraps: a function closing over this fixture's values
    # would leave `nn.Sequential` without an identity (what it closes over is in no key).
    @functools.wraps(plain)
    def forward(self: nn.Sequential, x: torch.Tensor) -> Any:
        tally = tallies.get(id(self))
        if tally is not None:
            tally.rows += int(x.shape[0])
        return plain(self, x)

    monkeypatch.setattr(nn.Sequential, "forward", forward)

    def count(module: nn.Module) -> Tally:
        assert type(module) is nn.Sequential
        tally = tallies[id(module)] = Tally()
        return tally

    return count


@pytest.fixture
def cached(store: Store) -> Iterator[CachedRows]:
    made = cache_rows(encoder(), store)
    yield made
    made.close()


def test_epoch_two_of_a_shuffled_loader_recalls_every_row(cached: CachedRows) -> None:
    """Epoch 2 of a shuffled DataLoader recalls 100% of its rows, and the features equal
    the encoder's own."""
    data = images(64)
    for x, _ in loader(data):
        cached(x)
    first = cached.reset_stats()
    assert (first.rows, first.computed, first.recalled) == (64, 64, 0)
    truth = expected(cached.module, data)
    for x, index in loader(data, seed=7):
        assert torch.equal(cached(x), truth[index])
    second = cached.stats
    assert (second.rows, second.computed, second.from_device) == (64, 0, 64)
    assert second.hit_rate == 1.0


def test_only_new_rows_run_as_one_sub_batch(
    store: Store, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """A batch of 3 new rows among 61 known runs the encoder on exactly those 3, once,
    and the output is in the batch's order."""
    module = encoder()
    cached = cache_rows(module, store)
    known = images(61)
    cached(known)
    counter = count_rows(module)
    batch = torch.cat([known[:20], images(3, seed=9), known[20:]])[torch.randperm(64)]
    out = cached(batch)
    assert counter.rows == 3
    assert cached.stats.computed == 61 + 3
    assert torch.equal(out, expected(module, batch))
    cached.close()


class OnALinear(nn.Module):
    """A module whose weights are a seeded linear layer; its forward is each subclass's,
    else the layer's."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out


class Gain(OnALinear):
    """Reads a plain value kept beside its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.gain
        return out


def test_a_pruned_module_changed_keeps_the_rows_of_its_next_call(store: Store) -> None:
    """``torch.nn.utils.prune`` works a module's weight out of ``weight_orig`` and
    ``weight_mask`` before each forward, as a plain tensor: a mask or original changed
    keys the next call by them, and that call's rows are kept and recalled from then on,
    as a module with no pruning's are."""
    module = nn.Sequential(nn.Linear(6, 4), nn.Tanh())
    torch.nn.utils.prune.random_unstructured(module[0], "weight", 0.5)
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    cached(x)
    for change in (module[0].weight_mask.fill_, module[0].weight_orig.mul_):
        with torch.no_grad():
            change(2.0)
        computed = cached.stats.computed
        changed = cached(x)
        assert torch.equal(changed, expected(module, x))
        assert cached.stats.computed == computed + 5
        assert torch.equal(cached(x), changed) and cached.stats.computed == computed + 5


def test_a_setting_changed_after_rows_were_keyed_is_seen_at_the_next_forward(
    store: Store,
) -> None:
    """Changing a plain value the module reads, or a forward hook, keys every row anew at
    the next forward, which runs them with it; `redeclare` says so too. With nothing
    changed it says so, and the memory tier keeps answering."""
    module = Gain()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    assert cached.redeclare() is False
    assert torch.equal(cached(x), first) and cached.stats.from_device + cached.stats.from_host == 5
    module.gain = 2.0
    doubled = cached(x)
    assert cached.stats.computed == 5 + 5
    assert torch.equal(doubled, expected(module, x))
    assert not torch.equal(doubled, first)
    assert torch.equal(cached(x), doubled) and cached.stats.computed == 10
    module.gain = 3.0
    assert cached.redeclare() is True
    assert torch.equal(cached(x), expected(module, x)) and cached.stats.computed == 15
    handle = module.linear.register_forward_hook(_triple)
    assert torch.equal(cached(x), expected(module, x)) and cached.stats.computed == 20
    handle.remove()
    module.gain = 1.0
    assert torch.equal(cached(x), first) and cached.stats.computed == 20
    # Two hooks, and one of them swapped for another put first: as many hooks as before,
    # the same one last.
    first_hook = module.linear.register_forward_hook(_triple)
    module.linear.register_forward_hook(functools.partial(_scaled, 0.5))
    assert torch.equal(cached(x), expected(module, x)) and cached.stats.computed == 25
    first_hook.remove()
    module.linear.register_forward_hook(_quintuple, prepend=True)
    assert torch.equal(cached(x), expected(module, x)) and cached.stats.computed == 30
    cached.close()


def _interrupted_once(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step``, whose first call raises KeyboardInterrupt instead, as a Ctrl-C landing there
    would; later calls are ``step``'s own."""
    calls = [0]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    return interrupted


@pytest.mark.parametrize("change", ["weights", "setting"])
def test_a_change_whose_keying_anew_was_interrupted_is_seen_at_the_next_forward(
    store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A forward interrupted (Ctrl-C) as it keys rows anew for weights changed or a setting
    given since — dropping the keyings of the old ones, or working out what the module
    declares now — leaves the change to the next forward, which computes the rows with
    it: the watch of what changed was taken before, so the next forward found nothing
    changed and recalled, for good, the rows of the old weights or setting."""
    module = Gain()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    if change == "weights":
        with torch.no_grad():
            module.linear.weight.mul_(2.0)
        step = "_drop_keyings"
    else:
        module.gain = 2.0
        step = "_prefix"
    monkeypatch.setattr(_row_keys, step, _interrupted_once(getattr(_row_keys, step)))
    with pytest.raises(KeyboardInterrupt):
        cached(x)
    now = expected(module, x)
    assert not torch.equal(now, first)
    assert torch.equal(cached(x), now)
    assert torch.equal(cached(x), now) and cached.stats.computed == 10
    cached.close()


def test_settings_refused_as_rows_are_keyed_anew_are_refused_at_every_forward_after(
    store: Store,
) -> None:
    """Settings given since rows were keyed, one of which no key can hold (nested deeper
    than Python's recursion limit lets it be followed), are refused at the next forward
    and at every one after, until that one goes: refused once, the forward run again
    found nothing changed and recalled the rows of the settings before."""
    module = Gain()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    nested: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    module.gain = 2.0
    module.kept = nested
    for _ in range(2):
        with pytest.raises(NotCanonical, match=r"`kept` is nested deeper"):
            cached(x)
    del module.kept
    assert torch.equal(cached(x), expected(module, x))
    assert not torch.equal(cached(x), first) and cached.stats.computed == 10
    cached.close()


class Flagged(OnALinear):
    """Reads a flag from a config object it holds, as a Hugging Face block reads
    ``self.config``."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(flag=False, inner=types.SimpleNamespace(scale=1.0))
        self.config.log = logging.getLogger("flagged")  # no config: named by its type
        self.config.inner.outer = self.config  # a config that holds itself

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.config.inner.scale
        return out.relu() if self.config.flag else out


def test_a_config_value_changed_in_place_keys_rows_anew(store: Store) -> None:
    """A flag (or, one object deeper, a scale) the module reads from a config it holds,
    changed in place, keys every row anew at the next forward, which runs them with it;
    set back, the rows kept for it are recalled. A logger the config holds, and the
    config held by what it holds, key nothing apart."""
    module = Flagged()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    module.config.flag = True
    flagged = cached(x)
    assert cached.stats.computed == 10
    assert torch.equal(flagged, expected(module, x)) and not torch.equal(flagged, first)
    module.config.inner.scale = 2.0
    assert torch.equal(cached(x), expected(module, x)) and cached.stats.computed == 15
    module.config.flag, module.config.inner.scale = False, 1.0
    assert cached.redeclare() is True
    assert torch.equal(cached(x), first) and cached.stats.computed == 15
    cached.close()


class FlaggedInList(Flagged):
    """Keeps its config in a list, as a model with one config per head does."""

    def __init__(self) -> None:
        super().__init__()
        self.configs = [self.config]
        del self.config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out.relu() if self.configs[0].flag else out


def test_a_config_held_in_a_list_changed_in_place_keys_rows_anew(store: Store) -> None:
    """A flag the module reads from a config it keeps in a list, changed in place, keys
    every row anew at the next forward, without a redeclare."""
    module = FlaggedInList()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    module.configs[0].flag = True
    flagged = cached(x)
    assert cached.stats.computed == 10
    assert torch.equal(flagged, expected(module, x)) and not torch.equal(flagged, first)
    cached.close()


class Scaler:
    """Scales what it is given by ``s``: a plain object whose method a module keeps."""

    def __init__(self, s: float) -> None:
        self.s = s

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


class KeepsAMethod(OnALinear):
    """Keeps the method of an object it was given (``self.act = scaler.apply``), and calls
    it: the object is held through the method alone."""

    def __init__(self, scaler: Scaler) -> None:
        super().__init__()
        self.act = scaler.apply

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.linear(x))
        return out


def test_a_value_the_object_of_a_kept_method_holds_changed_in_place_keys_rows_anew(
    store: Store,
) -> None:
    """A value the object a module's kept method is bound to holds (``scaler.s``), changed
    in place, keys every row anew at the next forward, as a config the module holds does:
    computed as the module computes it now, never the rows kept for the old value; set
    back, those are recalled."""
    scaler = Scaler(2.0)
    module = KeepsAMethod(scaler)
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    first = cached(x)
    scaler.s = 3.0
    scaled = cached(x)
    assert cached.stats.computed == 10
    assert torch.equal(scaled, expected(module, x)) and not torch.equal(scaled, first)
    scaler.s = 2.0
    assert torch.equal(cached(x), first) and cached.stats.computed == 10
    cached.close()


class Corners(torch.Tensor):
    """Boxes given by two corners."""


class Centred(torch.Tensor):
    """Boxes given by their centre, width and height."""


class Boxed(nn.Module):
    """Answers by the class of the boxes it holds as well as by their values."""

    def __init__(self, box: torch.Tensor) -> None:
        super().__init__()
        self.box = box

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sign = 1.0 if isinstance(self.box, Corners) else -1.0
        return x * sign + self.box.as_subclass(torch.Tensor).sum()


def test_a_tensor_setting_of_another_subclass_keys_rows_anew(store: Store) -> None:
    """Two modules holding the same values as tensors of different subclasses, which the
    forward tells apart, key their rows apart: neither is answered with the other's rows.
    So do two holding the same subclass with other attributes."""
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    x = torch.randn(3, 4)
    corners = cache_rows(Boxed(values.as_subclass(Corners)), store)
    corners(x)
    corners.flush()
    centred = Boxed(values.as_subclass(Centred))
    cached = cache_rows(centred, store)
    assert torch.equal(cached(x), expected(centred, x))
    assert cached.stats.computed == 3
    assert cached.row_keys(x) != corners.row_keys(x)
    tagged = values.as_subclass(Corners)
    tagged.convention = "xyxy"  # type: ignore[attr-defined]
    assert cache_rows(Boxed(tagged), None).row_keys(x) != corners.row_keys(x)
    corners.close()
    cached.close()


class Counting(Gain):
    """Counts its calls and fills a table as it first runs: what its own forward changes
    of what it keeps, which changes nothing it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.table: torch.Tensor | None = None
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.append(x.shape[0])
        if self.table is None:
            self.table = torch.ones(1)
        else:
            self.table.mul_(1.0)  # written in place: its version moves
        return super().forward(x) * self.table


def test_what_a_forward_changes_of_what_it_keeps_keys_the_next_batch_anew(store: Store) -> None:
    """A module whose forward counts its calls, appends to a list and writes a table it
    keeps changes what it keeps at every batch: each batch is keyed by what it keeps
    then, and no row it computed is kept, since a recall would not make the change."""
    module = Counting()
    cached = cache_rows(module, store)
    x, y = torch.randn(5, 6), torch.randn(4, 6)
    first = cached(x)
    cached(y)
    assert torch.equal(cached(x), first) and cached.stats.computed == 14
    assert cached.stats.recalled == 0 and cached.tiers[0].rows == 0
    cached.close()


def test_a_module_keyed_anew_at_every_batch_holds_the_names_of_its_last_keyings_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module whose forward counts its calls keys every batch anew: a long run (a
    server) holds the memory tiers' names of only the last keyings, not one a batch
    forever; a setting given again recalls its rows while its keying's name is held,
    and computes them again once it is not, never recalling another keying's rows."""
    monkeypatch.setattr(_row_keys, "_TAGS_HELD", 4, raising=False)
    counting = cache_rows(Counting())
    x = torch.randn(3, 6)
    for _ in range(12):
        counting(x)
    assert counting.stats.computed == 12 * 3 and len(counting._tags) <= 4

    module = Gain()
    cached = cache_rows(module)
    for gain in (1.0, 2.0, 3.0, 1.0):  # 1.0 again, its name held: recalled
        module.gain = gain
        assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 3 * 3 and cached.stats.from_device == 3
    for gain in (4.0, 5.0, 6.0, 7.0, 2.0, 3.0, 1.0):  # 1.0, 2.0, 3.0 let go of since
        module.gain = gain
        assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 3 * 3 + 7 * 3 and len(cached._tags) <= 4


def test_a_forward_giving_a_value_anew_as_it_was_keeps_its_rows(store: Store) -> None:
    """A module whose forward sets a value it keeps to the very value it held (a width
    noted at every batch, a new object each time) changes nothing: its rows are kept,
    and the batch handed again is recalled."""
    torch.manual_seed(0)
    module = NotesWidth().eval()
    cached = cache_rows(module, store)
    x = torch.randn(5, 300)
    answers = [cached(x) for _ in range(3)]
    assert all(torch.equal(answer, expected(copy.deepcopy(module), x)) for answer in answers)
    assert cached.stats.computed == 5 and cached.stats.recalled == 10
    cached.close()


class Scaled(Gain):
    """Sets its gain from the first batch it is handed: what it answers for every batch
    after follows from that first one."""

    def __init__(self) -> None:
        super().__init__()
        self.gain: float | None = None  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gain is None:
            self.gain = float(x.abs().max())
        return super().forward(x)


def test_a_setting_the_first_batch_sets_keys_rows_by_what_it_was_set_to(store: Store) -> None:
    """A module that sets a value it keeps from the first batch it is handed answers in
    another process, handed other batches first, as it computes: the rows of the batch
    that set it were kept nowhere, and the rows after are keyed by the value it holds."""
    x, y = torch.randn(5, 6), torch.randn(4, 6) * 3
    cached = cache_rows(Scaled(), store)
    cached(x)
    cached(y)  # keyed by the gain set
    cached(y)
    assert cached.stats.computed == 9 and cached.stats.recalled == 4
    cached.close()
    module = Scaled()
    other = cache_rows(module, store)
    for batch in (y, x):
        assert torch.equal(other(batch), expected(copy.deepcopy(module), batch))
    assert other.stats.recalled == 0
    other.close()


def _triple(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 3


def _quintuple(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 5


def _scaled(factor: float, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * factor


def _linear_times_seven(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 7 if isinstance(module, nn.Linear) else output


class Halve:
    """A callable hook object."""

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        return (inputs[0] / 2,)


class Seen:
    """A hook that only looks, and counts what it saw."""

    def __init__(self) -> None:
        self.calls = 0

    def look(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self.calls += 1


def test_forward_hooks_are_in_the_key_by_their_code(store: Store) -> None:
    """A forward hook or pre-hook changes what a module answers: one registered, removed
    or replaced by other code (a function, a partial, a callable object, a global hook)
    keys rows anew at `redeclare`, and each answer is the module's with the hooks it has
    then; the same hooks again recall, from memory and from the store. A hook that
    counts what it sees does not change the key as it counts."""
    module = Gain()
    cached = cache_rows(module, store)
    x = torch.randn(5, 6)
    plain = cached(x)
    outcomes: list[torch.Tensor] = []
    first = module.linear.register_forward_hook(_triple)
    for change in (
        lambda: None,
        lambda: (first.remove(), module.linear.register_forward_hook(_quintuple)),
        lambda: module.register_forward_pre_hook(Halve()),
        lambda: module.register_forward_hook(functools.partial(_scaled, 0.5)),
    ):
        change()
        assert cached.redeclare() is True
        before = cached.stats.computed
        out = cached(x)
        assert cached.stats.computed == before + 5
        assert torch.equal(out, expected(module, x))
        assert all(not torch.equal(out, seen) for seen in [plain, *outcomes])
        outcomes.append(out)
    module._forward_pre_hooks.clear()
    module._forward_hooks.clear()
    module.linear._forward_hooks.clear()
    assert cached.redeclare() is True
    assert torch.equal(cached(x), plain) and cached.stats.computed == 4 * 5 + 5

    watcher = Seen()
    module.register_forward_hook(watcher.look)
    assert cached.redeclare() is True
    cached(x)
    # The batch, and its first and last rows alone: a new keying sees that rows are
    # answered alone.
    assert watcher.calls == 3 and cached.redeclare() is False
    cached.flush()

    same = Gain()
    same.linear.register_forward_hook(_triple)
    again = cache_rows(same, store)
    assert torch.equal(again(x), outcomes[0]) and again.stats.computed == 0
    handle = nn.modules.module.register_module_forward_hook(_linear_times_seven)
    try:
        assert again.redeclare() is True
        assert torch.equal(again(x), expected(same, x)) and again.stats.computed == 5
    finally:
        handle.remove()
    cached.close()
    again.close()


def _tensors_doubled(module: nn.Module, inputs: Any, output: Any) -> Any:
    return output * 2 if isinstance(output, torch.Tensor) else None


def test_a_global_hook_runs_with_the_module_not_with_its_row_cache(store: Store) -> None:
    """A global forward hook runs with every module called: with the module a row cache
    runs, and not once more with the cache standing for it, so the answer, computed or
    recalled, is the module's own under the hook. A hook of the cache's own beside a
    global one is refused, naming the global hook."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(5)
    handle = nn.modules.module.register_module_forward_hook(_tensors_doubled)
    try:
        plain = expected(module, x)
        assert torch.allclose(cached(x), plain) and cached.stats.computed == 5
        assert torch.allclose(cached(x), plain) and cached.stats.recalled == 5
        cached.register_forward_hook(_tensors_doubled)
        with pytest.raises(RowsError, match=r"register_module_forward_hook\(_tensors_doubled\)"):
            cached(x)
    finally:
        handle.remove()
    assert torch.allclose(cached(x), expected(module, x) * 2)
    cached.close()


class ScaleByLastDim(nn.Module):
    """Answers differ for the same bytes seen with another shape or dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).float() * x.shape[-1]


def test_the_same_bytes_in_another_shape_or_dtype_are_another_row(store: Store) -> None:
    """Rows are told apart by dtype and shape as well as bytes: the same bytes seen as
    (6,), (2, 3) or int32 rows each run, and each gets its own answer."""
    module = ScaleByLastDim()
    cached = cache_rows(module, store)
    flat = torch.randn(4, 6)
    for x in (flat, flat.reshape(4, 2, 3), flat.view(torch.int32)):
        assert torch.equal(cached(x), module(x))
        assert torch.equal(cached(x), module(x))  # and again, from memory
    assert (cached.stats.computed, cached.stats.recalled) == (12, 12)
    cached.close()


def test_trained_head_is_identical_with_and_without_caching() -> None:
    """A head trained for three shuffled epochs has bit-identical weights whether the
    frozen encoder's features are computed or recalled."""

    def train(cache: bool) -> torch.Tensor:
        frozen = encoder()
        frozen.eval().requires_grad_(False)
        features = cache_rows(frozen) if cache else frozen
        torch.manual_seed(3)
        head = nn.Linear(8, 4)
        optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
        for _ in range(3):
            for x, index in loader(images(96), seed=5):
                loss = nn.functional.cross_entropy(head(features(x)), index % 4)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        if isinstance(features, CachedRows):
            assert features.stats.computed == 96
        return head.weight.detach().clone()

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.equal(train(cache=False), train(cache=True))
    finally:
        torch.use_deterministic_algorithms(was)


def test_a_new_cache_over_the_same_store_recalls_from_it(
    store: Store, tmp_path: Path, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """Rows flushed by one cached module are recalled from the store by another with empty
    memory tiers, equal to the encoder's own answers."""
    data = images(40)
    first = cache_rows(encoder(), store)
    first(data)
    first.flush()
    assert first.stats.rows_kept == 40
    first.close()
    second = cache_rows(encoder(), Store(tmp_path / "store"))
    counter = count_rows(second.module)
    picked = torch.randperm(40)[:25]
    out = second(data[picked])
    # The module ran only to see how it lays out such a batch (docs/per-sample.md): once,
    # on two of its rows together, not again on each alone (its answer is not kept).
    assert counter.rows == 2 and second.stats.computed == 0
    assert second.stats.from_store == 25
    assert torch.equal(out, expected(second.module, data)[picked])
    second.close()


@pytest.mark.parametrize("key", ["content", "index"])
@pytest.mark.parametrize("native_first", [True, False])
def test_rows_keyed_natively_and_in_python_are_the_same_rows(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_first: bool, key: str
) -> None:
    """A batch's keys made in one native call and made a row at a time in Python (where the
    host library is not loaded) are the same keys, by content and by index: rows one
    cache kept are recalled from the store by another, whichever way each named them."""
    host_library()  # loaded, so that the native path is there to be taken
    made = _row_keys.keys_after_rows
    taken: list[int] = []

    def native(*args: Any) -> list[str] | None:
        taken.append(len(args[1]))
        return made(*args)

    def keyed(natively: bool) -> CachedRows:
        monkeypatch.setattr(_row_keys, "keys_after_rows", native if natively else lambda *_: None)
        kind: Any = {"key": "index", "version": "data@1"} if key == "index" else {}
        return cache_rows(encoder(), Store(tmp_path / "store"), **kind)

    data = images(40)
    every = torch.arange(40) * 1000  # indices past a byte
    first = keyed(native_first)
    first(data, index=every) if key == "index" else first(data)
    first.flush()
    assert first.stats.rows_kept == 40
    first.close()
    second = keyed(not native_first)
    picked = torch.randperm(40)
    out = second(data[picked], index=every[picked]) if key == "index" else second(data[picked])
    assert second.stats.from_store == 40 and second.stats.computed == 0
    assert torch.equal(out, expected(second.module, data)[picked])
    second.close()
    assert 40 in taken  # the native path was taken where asked


def test_recalled_rows_from_the_store_are_the_encoders(store: Store, tmp_path: Path) -> None:
    """Rows recalled from the store, mixed with rows computed now, come back in the
    batch's order and equal what the encoder computes."""
    data = images(48)
    first = cache_rows(encoder(), store)
    first(data[:30])
    first.close()
    second = cache_rows(encoder(), Store(tmp_path / "store"))
    order = torch.randperm(48)
    out = second(data[order])
    assert (second.stats.from_store, second.stats.computed) == (30, 18)
    assert torch.equal(out, expected(second.module, data[order]))
    second.close()


def _refused_as_read_only(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.EROFS, "Read-only file system")


def mount_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes every write into a local store fail as on a read-only filesystem (tests run as
    root, whom permissions would not stop, so the refusal is simulated)."""
    real = open

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if set(mode) & set("wax+"):
            _refused_as_read_only()
        return real(file, mode, *args, **kwargs)

    for module in ("local", "_local_files", "_local_upkeep"):  # the local store's modules
        for name in ("open", "open_file"):
            monkeypatch.setattr(f"somatize.store.{module}.{name}", opened, raising=False)
    for name in ("utime", "unlink", "replace", "rename", "mkdir"):
        monkeypatch.setattr(os, name, _refused_as_read_only)


def test_a_read_only_store_answers_what_it_holds_and_refuses_rows_before_running(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_rows: Callable[[nn.Module], Tally],
) -> None:
    """Over a store this process may not write, rows the store holds are recalled, and a
    batch with rows it does not hold is a StoreError saying the store is read-only before
    the module runs, not rows computed whose writes fail behind the step, raised at some
    later forward: nothing is computed, queued or left half-written, and the cache goes on
    answering what the store holds."""
    data = images(12)
    answers = expected(encoder(), data)
    first = cache_rows(encoder(), store)
    first(data[:8])
    first.close()
    mount_read_only(monkeypatch)
    cached = cache_rows(encoder(), Store(tmp_path / "store"))
    counter = count_rows(cached.module)
    assert torch.equal(cached(data[:8]), answers[:8])
    ran = counter.rows  # what it ran to see how it lays out a batch, nothing kept
    with pytest.raises(StoreError, match=r"4 of the 8 rows.*read-only for this process"):
        cached(data[4:])
    assert counter.rows == ran
    cached.flush()  # nothing was queued, so nothing failed
    assert torch.equal(cached(data[:8].flip(0)), answers[:8].flip(0))
    assert cached.stats.from_store == 8 and cached.stats.rows_failed == 0
    cached.close()
    monkeypatch.undo()
    assert not list((tmp_path / "store" / "tmp").iterdir())


def test_a_read_only_store_whose_lookup_fails_refuses_rows_before_running(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_rows: Callable[[nn.Module], Tally],
) -> None:
    """Over a store this process may not write, a batch whose lookup in the store fails
    (an I/O error listing its packs) is the StoreError saying the store is read-only,
    raised before the module runs, as for rows it does not hold: computed, they could
    not be kept."""
    data = images(8)
    first = cache_rows(encoder(), store)
    first(data)
    first.close()
    mount_read_only(monkeypatch)
    reader = Store(tmp_path / "store")

    def failing(keys: Any) -> set[str]:
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "store" / "packs"))

    monkeypatch.setattr(reader, "have", failing)
    cached = cache_rows(encoder(), reader)
    counter = count_rows(cached.module)
    with pytest.raises(StoreError, match=r"8 of the 8 rows.*read-only for this process"):
        cached(data)
    assert counter.rows == 0 and cached.stats.rows_unread == 0
    cached.close()


def test_a_bucket_that_refused_a_write_refuses_rows_before_running(
    count_rows: Callable[[nn.Module], Tally],
) -> None:
    """Over a bucket whose credentials may only read, rows it holds are recalled; the first
    rows computed fail to be written (WriteFailed at the flush), and from then on a batch
    with rows it does not hold is a StoreError saying the bucket refused writes, raised
    before the module runs, as over a read-only local store; what it holds is still
    answered."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    data = images(16)
    answers = expected(encoder(), data)
    with enable_iam_authentication():
        first = cache_rows(encoder(), Store.on_bucket(url, **admin))
        first(data[:8])
        first.close()
        cached = cache_rows(encoder(), Store.on_bucket(url, **reader, backoff=0.0))
        counter = count_rows(cached.module)
        assert torch.equal(cached(data[:8]), answers[:8])
        assert cached.stats.computed == 0
        assert torch.allclose(cached(data[8:12]), answers[8:12])  # no store told it yet
        ran = counter.rows
        assert ran >= 4 and cached.stats.computed == 4
        with pytest.raises(WriteFailed, match="could not be written"):
            cached.flush()
        with pytest.raises(StoreError, match=r"4 of the 4 rows.*the bucket refused writes"):
            cached(data[12:])
        assert counter.rows == ran and cached.stats.computed == 4
        assert torch.equal(cached(data[:8].flip(0)), answers[:8].flip(0))
        assert counter.rows == ran and cached.stats.computed == 4
        with contextlib.suppress(WriteFailed):
            cached.close()


def test_a_bucket_opened_read_only_refuses_rows_before_its_first_rows_run(
    count_rows: Callable[[nn.Module], Tally],
) -> None:
    """Over a bucket opened ``read_only=True`` (credentials that may only read), rows it
    holds are recalled, and the first batch with rows it lacks is a StoreError saying so
    before the module runs: no rows are computed to fail behind the step first."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    data = images(12)
    answers = expected(encoder(), data)
    with enable_iam_authentication():
        first = cache_rows(encoder(), Store.on_bucket(url, **admin))
        first(data[:8])
        first.close()
        cached = cache_rows(encoder(), Store.on_bucket(url, **reader, read_only=True))
        counter = count_rows(cached.module)
        assert torch.equal(cached(data[:8]), answers[:8])
        ran = counter.rows  # what it ran to see how it lays out a batch, nothing kept
        with pytest.raises(StoreError, match=r"4 of the 4 rows.*opened with read_only=True"):
            cached(data[8:])
        assert counter.rows == ran and cached.stats.computed == 0
        cached.close()


@pytest.mark.parametrize("home", ["bucket", "local"])
def test_rows_a_read_only_store_lacks_are_refused_saying_nothing_was_written(
    count_rows: Callable[[nn.Module], Tally], tmp_path: Path, home: str
) -> None:
    """Rows a store opened ``read_only=True`` (a bucket's, or a local one) lacks are
    refused before the module runs: the error says their writes would fail, never that
    writes failed, since none was tried."""
    where = f"memory://somatize/{os.urandom(6).hex()}" if home == "bucket" else str(tmp_path)
    data = images(12)
    first = cache_rows(encoder(), Store(where))
    first(data[:8])
    first.close()
    cached = cache_rows(encoder(), Store(where, read_only=True))
    assert torch.equal(cached(data[:8]), expected(encoder(), data)[:8])
    counter = count_rows(cached.module)
    with pytest.raises(StoreError, match=r"4 of the 12 rows") as refused:
        cached(data)
    said = str(refused.value)
    assert "would fail" in said and "writes failing" not in said, said
    assert counter.rows == 0 and cached.stats.computed == 0
    cached.close()


class Transposes(nn.Module):
    """Answers each row transposed: a batch whose rows are not in C order."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).transpose(1, 2)


def laid_out_otherwise(kind: str) -> tuple[nn.Module, torch.Tensor, tuple[int, ...]]:
    """A module (seeded) answering a batch in another order of its dims than C order (a
    conv fed ``channels_last``, the same pooled to 1x1, whose answer torch calls contiguous
    with the strides of channels_last, or one whose rows come ``transposed``), a batch for
    it, and the strides of its answer."""
    torch.manual_seed(0)
    if kind in ("channels_last", "pooled"):
        module: nn.Module = nn.Conv2d(3, 4, 3, padding=1).to(memory_format=torch.channels_last)
        data = torch.randn(12, 3, 6, 6).to(memory_format=torch.channels_last)
        if kind == "pooled":
            module = nn.Sequential(module, nn.AdaptiveAvgPool2d(1))
    else:
        module, data = Transposes(), torch.randn(12, 5, 3)
    with torch.no_grad():
        return module, data, module(data).stride()


@pytest.mark.parametrize("kind", ["channels_last", "pooled", "transposed"])
def test_recalled_rows_are_laid_out_in_memory_as_computed_ones(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """A module answering a batch in another order of its dims than C order (a conv fed
    channels_last) gets it back so on a hit — from memory, from the store, in part or
    whole, in this process or another — as computed: a kernel reading it then takes the
    path it takes on a miss, and answers the same bits."""
    module, data, strides = laid_out_otherwise(kind)
    first = cache_rows(module, store)
    computed = first(data[:8])
    assert computed.stride()[1:] == strides[1:]
    for batch in (data[:8], data[2:10]):  # from memory whole, then with rows computed
        assert first(batch).stride() == strides
        assert torch.equal(first(batch), module(batch))
    first.flush()
    first.close()
    second = cache_rows(module, Store(tmp_path / "store"), device_bytes=0, host_bytes=0)
    for batch in (data[:8], data[4:12]):  # from the store whole, then with rows computed
        out = second(batch)
        assert out.stride() == strides
        assert torch.equal(out, module(batch))
    second.close()


class HalfOfMap(nn.Module):
    """A conv fed channels_last, its answer split in two along its channels and the first
    half kept (a gated block's half): channels_last, with gaps where the other half's
    channels lie."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1).to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).chunk(2, dim=1)[0]


def test_recalled_rows_with_gaps_are_laid_out_as_computed_ones(
    store: Store, tmp_path: Path
) -> None:
    """Rows a module answers laid out in channels_last with gaps in their memory (a half of
    a channels_last map split along its channels) are recalled dense in channels_last —
    from memory, from the store, whole or beside rows computed — so a conv reading them
    takes the path it takes on a miss and answers the same bits, laid out alike: they were
    recalled in C order, and the conv answered in C order, other last bits."""
    torch.manual_seed(0)
    module = HalfOfMap()
    after = nn.Conv2d(8, 16, 3, padding=1)
    data = torch.randn(12, 3, 10, 10).to(memory_format=torch.channels_last)

    def read(rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return after(rows)

    with torch.no_grad():
        missed = {(0, 8): module(data[:8]), (2, 10): module(data[2:10]), (4, 12): module(data[4:])}
    assert not missed[(0, 8)].is_contiguous(memory_format=torch.channels_last)

    def same_as_missed(out: torch.Tensor, start: int, end: int) -> None:
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(out, missed[(start, end)])
        answered, again = read(missed[(start, end)]), read(out)
        assert again.stride() == answered.stride() and torch.equal(again, answered)

    first = cache_rows(module, store)
    first(data[:8])
    for start, end in ((0, 8), (2, 10)):  # from memory whole, then with rows computed
        same_as_missed(first(data[start:end]), start, end)
    first.flush()
    first.close()
    second = cache_rows(module, Store(tmp_path / "store"), device_bytes=0, host_bytes=0)
    for start, end in ((0, 8), (4, 12)):  # from the store whole, then with rows computed
        same_as_missed(second(data[start:end]), start, end)
    second.close()


def answers_as_the_module(cached: nn.Module, module: nn.Module, batch: torch.Tensor) -> None:
    """``cached`` answers ``batch`` as ``module`` does, laid out alike in memory. A row
    computed from an input in another layout may differ in the last bit from the same row
    computed from this one (another kernel); both have one key."""
    with torch.no_grad():
        expected = module(batch)
    out = cached(batch)
    assert out.stride() == expected.stride()
    assert torch.allclose(out, expected, atol=1e-6)


def test_recalled_rows_follow_the_layout_of_the_input_they_answer() -> None:
    """A conv answers a channels_last batch channels_last and a batch in C order in C
    order: a batch recalled is laid out as the module lays out the answers to inputs laid
    out as it is, not as the last batch computed — whichever way the inputs alternate."""
    torch.manual_seed(0)
    module = nn.Conv2d(3, 4, 3, padding=1)
    data = torch.randn(8, 3, 6, 6)
    last = data.to(memory_format=torch.channels_last)
    cached = cache_rows(module)
    cached(last[:4])
    cached(data[4:])  # computed last, in C order
    for batch in (last[:4], data[4:], last[2:6], data[:6]):  # recalled, whole or in part
        answers_as_the_module(cached, module, batch)
    assert cached.stats.computed == 8


@pytest.mark.parametrize("first_rows", [1, 4])
@pytest.mark.parametrize("source", ["memory", "store"])
@pytest.mark.parametrize("kept", ["C order", "channels_last"])
def test_rows_recalled_in_a_layout_no_batch_ran_in_are_laid_out_as_the_module_answers_it(
    store: Store, tmp_path: Path, kept: str, source: str, first_rows: int
) -> None:
    """A batch whose rows are all recalled, its input laid out otherwise than any batch the
    cache computed (rows kept from inputs in C order, asked channels_last, or the
    reverse; from memory, or by a new cache over the store), comes back laid out as the
    conv answers such an input: the module runs on one or two of its rows to see that,
    once, and those answers are neither counted as rows computed nor kept."""
    torch.manual_seed(0)
    module = nn.Conv2d(3, 4, 3, padding=1)
    data = torch.randn(6, 3, 5, 5)
    formats = {"C order": torch.contiguous_format, "channels_last": torch.channels_last}
    asked_as = formats["channels_last" if kept == "C order" else "C order"]
    cached = cache_rows(module, store)
    cached(data.contiguous(memory_format=formats[kept]))
    cached.flush()
    computed, kept_rows = cached.stats.computed, cached.stats.rows_kept
    if source == "store":
        cached.close()
        cached = cache_rows(module, Store(tmp_path / "store"), device_bytes=0, host_bytes=0)
        computed, kept_rows = 0, 0
    asked = data.contiguous(memory_format=asked_as)
    for batch in (asked[1 : 1 + first_rows], asked[:4], asked[2:6], asked[3:4]):
        answers_as_the_module(cached, module, batch)
    cached.flush()
    assert cached.stats.computed == computed and cached.stats.rows_kept == kept_rows
    assert sum(tier.rows for tier in cached.tiers) == (6 if source == "memory" else 0)
    cached.close()


class SequenceFirst(nn.Module):
    """A transformer layer whose dimension 0 is the sequence, handed and answering batches
    with the batch first: its answer is a view transposed back, each row's tokens a batch
    apart in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.transpose(0, 1)).transpose(0, 1)


class Projects(nn.Module):
    """Answers ``(W @ x.T).T``: a batch whose rows are the columns of its memory."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight @ x.T).T


@pytest.mark.parametrize("kind", ["sequence first", "projects", "transposed input"])
def test_recalled_rows_are_laid_out_with_the_batch_where_the_module_puts_it(kind: str) -> None:
    """A module answering a batch whose own dim is not outermost in its memory (a layer
    run along the sequence first and transposed back, a projection answered as
    ``(W @ x.T).T``, an identity handed a transposed batch) gets a batch recalled from
    memory, whole or beside rows computed, laid out so: a head reading it (a linear layer
    on columns in memory) then takes the path it takes on a miss, and answers the same
    bits. A batch of one row computed alone leaves the place learned as it is."""
    torch.manual_seed(0)
    module: nn.Module
    if kind == "sequence first":
        module, data = SequenceFirst().eval(), torch.randn(12, 5, 8)
    elif kind == "projects":
        module, data = Projects(), torch.randn(12, 5)
    else:
        module, data = nn.Identity(), torch.randn(12, 5)

    def batch_of(rows: torch.Tensor) -> torch.Tensor:
        return rows.T.contiguous().T if kind == "transposed input" else rows

    cached = cache_rows(module)
    cached(batch_of(data[:8]))
    cached(batch_of(data[8:9]))  # one row alone
    for rows in (data[:8], data[2:10], data[:9]):  # recalled whole, beside rows computed
        answers_as_the_module(cached, module, batch_of(rows))
    cached.close()


class Twice(nn.Module):
    """Doubles its input, answering it laid out as the input is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_rows_recalled_from_a_batch_transposed_are_laid_out_as_the_module_answers_it() -> None:
    """A batch whose own dim lies inside its memory (a sequence-first batch transposed),
    its rows all recalled from batches computed in C order, comes back laid out as the
    module answers that batch: the rows it runs to see how are handed to it laid out as
    the batch is, not in C order. So are rows computed beside rows recalled."""
    torch.manual_seed(0)
    module, data = Twice(), torch.randn(6, 5, 3)

    def transposed(rows: torch.Tensor) -> torch.Tensor:
        return rows.transpose(0, 1).contiguous().transpose(0, 1)  # (sequence, batch) in memory

    cached = cache_rows(module)
    cached(data[:4])  # computed from C order
    # Recalled whole, beside rows computed, then whole again after those.
    for rows in (data[:4], data[2:], data[1:5]):
        answers_as_the_module(cached, module, transposed(rows))
    assert cached.stats.computed == 6
    cached.close()


@pytest.mark.parametrize("kind", ["sequence first", "projects"])
def test_rows_a_new_cache_recalls_are_laid_out_with_the_batch_where_the_module_puts_it(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """A new cache recalling from the store every row of a batch of a module that puts the
    batch's own dim inside its answer's memory (see above) lays the batch out so too,
    having run the module on two of its rows to see where; rows kept before it are
    recalled as they were."""
    torch.manual_seed(0)
    module: nn.Module = SequenceFirst().eval() if kind == "sequence first" else Projects()
    data = torch.randn(8, 5, 8) if kind == "sequence first" else torch.randn(8, 5)
    first = cache_rows(module, store)
    first(data)
    first.close()
    cached = cache_rows(module, Store(tmp_path / "store"), device_bytes=0, host_bytes=0)
    answers_as_the_module(cached, module, data)
    assert cached.stats.computed == 0 and cached.stats.from_store == 8
    cached.close()


def test_bf16_autocast_and_fp32_have_different_keys() -> None:
    """The autocast state the encoder runs under is part of every row's key."""
    cached = cache_rows(encoder())
    x = images(4)
    plain = cached.row_keys(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = cached.row_keys(x)
        out = cached(x)
    assert set(plain).isdisjoint(mixed)
    assert out.dtype == torch.bfloat16
    assert cached(x).dtype == torch.float32
    assert cached.stats.computed == 8


def test_keys_are_built_like_the_cores(store: Store) -> None:
    """A row's key is node_key(node_prefix(identity, declaration, state, salt), [row digest]),
    and the salt and the weights each change it."""
    module = encoder()
    cached = cache_rows(module, store, salt="v1")
    x = images(3)
    keys = cached.row_keys(x)
    node = cached._node
    prefix = node_prefix(
        "torch.nn.modules.container:Sequential",
        node.declaration(),
        digest_state(module),
        "v1",
    )
    assert keys == [node_key(prefix, [digest]) for digest in digest_rows(x)]
    other = cache_rows(encoder(), store, salt="v2")
    assert set(other.row_keys(x)).isdisjoint(keys)
    reseeded = cache_rows(encoder(seed=5), store, salt="v1")
    assert set(reseeded.row_keys(x)).isdisjoint(keys)
    for made in (cached, other, reseeded):
        made.close()


def test_weights_changed_in_place_are_digested_again(store: Store) -> None:
    """Loading other weights into the frozen module changes its keys, so no answer computed
    with the old weights is recalled."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(8)
    before = cached(x)
    cached.load_state_dict(encoder(seed=4).state_dict())
    after = cached(x)
    assert cached.stats.computed == 16
    assert not torch.equal(before, after)
    assert torch.equal(after, expected(encoder(seed=4), x))
    cached.close()


def test_weights_changed_any_way_are_seen(store: Store) -> None:
    """A submodule replaced and a checkpoint loaded by assignment are seen at the next
    forward; weights replaced or written through ``.data``, or the inner module converted
    (nothing a version counter or identity sees), at the next ``redeclare()``. Each time the
    rows are the module's own, never the answers of the weights before."""
    x = images(6)
    module = encoder()
    cached = cache_rows(module, store)
    cached(x)
    changes = [
        lambda: module.__setitem__(0, nn.Conv2d(3, 8, 3, 2, 1)),
        lambda: cached.load_state_dict(encoder(seed=5).state_dict(), assign=True),
    ]
    for change in changes:
        change()
        assert torch.equal(cached(x), expected(module, x))
        assert not any(part.training for part in module.modules())
    unseen = [
        lambda: setattr(module[0].weight, "data", torch.randn(8, 3, 3, 3)),
        lambda: module[0].weight.data.copy_(torch.randn(8, 3, 3, 3)),
    ]
    for change in unseen:
        change()
        assert cached.redeclare()
        assert torch.equal(cached(x), expected(module, x))
    assert not cached.redeclare()  # nothing changed since
    module.double()
    assert cached.redeclare()
    assert torch.equal(cached(x.double()), expected(module, x.double()))
    assert cached.stats.computed == 6 * 6
    cached.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_module_converted_itself_and_back_is_seen_at_the_next_forward(
    store: Store, dtype: torch.dtype
) -> None:
    """The module converted in place itself, asked of no cache, and back
    (``module.half().float()``, which rounds its weights and moves no version counter): the
    next forward computes its rows with the rounded weights, and recalls none of the
    weights before. (A module with buffers is seen by them: they are replaced.)"""
    x = torch.randn(6, 8)
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    cached = cache_rows(module, store)
    before = cached(x)
    module.to(dtype).float()
    after = cached(x)
    assert cached.stats.computed == 6 + 6
    assert torch.equal(after, expected(module, x)) and not torch.equal(after, before)
    cached.close()


class _Counted(nn.Module):
    """A part holding only a count (an integer buffer), which no conversion of dtype moves."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Positioned(nn.Module):
    """An encoder whose first tensor is an integer buffer (the ``position_ids`` of a text
    encoder's embeddings) and whose last is one too."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("position_ids", torch.arange(8))
        self.linear = nn.Linear(8, 4)
        self.counted = _Counted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.counted(self.linear(x))
        return out


def test_a_module_converted_itself_and_back_is_seen_where_integers_lie_at_its_ends(
    store: Store,
) -> None:
    """The module converted itself and back (``module.half().float()``) where its first
    and last tensors are integer buffers, which a conversion of dtype leaves where they
    are: the weights between are rounded all the same, and the next forward recalls none
    of the rows of the weights before."""
    x = torch.randn(6, 8)
    module = _Positioned()
    cached = cache_rows(module, store)
    before = cached(x)
    module.half().float()
    after = cached(x)
    assert cached.stats.computed == 6 + 6
    assert torch.equal(after, expected(module, x)) and not torch.equal(after, before)
    cached.close()


def test_a_conversion_through_one_cache_is_seen_by_every_cache_of_the_module(
    store: Store,
) -> None:
    """A conversion asked of one cache (``.half().float()``, which rounds the weights in
    place; ``.double()``) is seen by the other caches of the same module, keyed or salted
    otherwise, and by a cache of a part of it or of a module holding it: none recalls rows
    of the weights before, and a deferred batch runs in the module's new dtype."""
    module = encoder()
    x, index = images(6), torch.arange(6)
    data = Deferred(x, version="toy@1")
    by_content = cache_rows(module, store)
    by_index = cache_rows(module, store, key="index", version="v1")
    salted = cache_rows(module, store, salt="apart")
    part = cache_rows(module[0], store)
    whole = nn.Sequential(module, nn.Tanh())
    holding = cache_rows(whole, store)
    deferred = cache_rows(module, store, key="index")

    def answers(dtype: torch.dtype) -> list[torch.Tensor]:
        rows = DeferredRows(data.name, index, "toy@1", torch.device("cpu"))
        y = x.to(dtype)
        cached = [by_content(y), by_index(y, index=index), salted(y), part(y), holding(y)]
        return [*cached, deferred(rows)]

    def wanted(dtype: torch.dtype) -> list[torch.Tensor]:
        y = x.to(dtype)
        parts = [expected(module[0], y), expected(whole, y)]
        return [*[expected(module, y)] * 3, *parts, expected(module, y)]

    answers(torch.float32)
    by_content.half().float()
    assert all(map(torch.equal, answers(torch.float32), wanted(torch.float32)))
    by_content.double()
    assert all(map(torch.equal, answers(torch.float64), wanted(torch.float64)))
    for cache in (by_content, by_index, salted, part, holding, deferred):
        cache.close()


def test_an_optimizer_made_before_caching_leaves_the_encoder_still(store: Store) -> None:
    """An optimizer made while the encoder trained, zeroing gradients rather than dropping
    them, with momentum: once the encoder is cached (frozen) it no longer moves it, and
    the second pass over the same rows recalls them all."""
    encoder, head = nn.Linear(8, 8), nn.Linear(8, 2)
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1, momentum=0.9)
    x = torch.randn(16, 8)

    def step(through: nn.Module) -> None:
        head(through(x)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    step(encoder)  # it trained one step: momentum kept, gradients zeroed
    before = encoder.weight.detach().clone()
    cached = cache_rows(encoder, store)
    for _ in range(3):
        step(cached)
    assert torch.equal(encoder.weight, before)
    assert cached.stats.computed == 16 and cached.stats.recalled == 32


def test_an_unfrozen_module_is_refused_not_silently_untrained(store: Store) -> None:
    """A cached module whose parameters come to require grad (unfrozen to train it) is
    refused at the next forward: it would run without gradients and never train."""
    module = encoder()
    cached = cache_rows(module, store)
    cached(images(4))
    module[0].weight.requires_grad_(True)
    with pytest.raises(Unfrozen, match=r"`0.weight` now require grad"):
        cached(images(4))
    module[0].weight.requires_grad_(False)
    assert torch.equal(cached(images(4)), expected(module, images(4)))
    cached.close()


class StepsThroughData(torch.optim.Optimizer):
    """An optimizer of one's own that writes through ``p.data``, moving no version counter."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


def _compiled_step(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """A fused AdamW whose step runs under ``torch.compile``."""
    optimizer = torch.optim.AdamW(params, lr=0.5, fused=True)
    optimizer.step = torch.compile(optimizer.step)  # type: ignore[method-assign]
    return optimizer


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda params: torch.optim.AdamW(params, lr=0.5, fused=True),
        lambda params: torch.optim.SGD(params, lr=0.5, fused=True),
        lambda params: StepsThroughData(params, lr=0.5),
        _compiled_step,
    ],
    ids=["adamw-fused", "sgd-fused", "through-data", "adamw-fused-compiled"],
)
def test_a_module_fine_tuned_by_an_optimizer_moving_no_version_is_computed_anew(
    store: Store, optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
) -> None:
    """A cached module released, fine-tuned by an optimizer whose step moves no version
    counter (a fused one, one writing through ``p.data``), its gradients dropped after
    each step, and frozen again: its rows of the old weights were recalled. They are
    computed anew with the weights it trained to."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(4)
    before = cached(x).clone()
    release(module, False)  # in eval: its BatchNorm statistics stay as they are
    module.requires_grad_(True)
    stepping = optimizer(module.parameters())
    for _ in range(2):
        module(images(4, seed=2)).sum().backward()
        stepping.step()
        stepping.zero_grad()
    module.requires_grad_(False)
    after = cached(x)
    assert torch.equal(after, expected(module, x))
    assert not torch.allclose(after, before)
    cached.close()


_STEPPED_AROUND_A_RELOAD = """
import importlib, torch, somatize.torch
from somatize_torch import _steps

def moved():
    weight = torch.nn.Parameter(torch.zeros(2))
    weight.grad = torch.ones(2)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    was = weight._version
    optimizer.step()
    return weight._version - was

first = moved()
importlib.reload(_steps)
_steps.see_optimizer_steps()
print(first, moved())
"""


def test_an_optimizer_step_is_counted_once_after_the_library_is_reloaded() -> None:
    """Reloaded in place (IPython's autoreload), the library registers no second hook on
    optimizer steps: each step moves each weight's counter by as much as before, at the
    same cost."""
    done = subprocess.run(
        [sys.executable, "-c", _STEPPED_AROUND_A_RELOAD], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    first, after = done.stdout.split()
    assert int(first) > 1  # torch's own step, and the library's count
    assert after == first


@pytest.mark.parametrize("handed", ["leaves", "computed"])
def test_weights_that_require_grad_handed_by_functional_call_are_refused_and_left_alone(
    store: Store, handed: str
) -> None:
    """`functional_call` handing a cached module weights of the caller's that require grad
    (an inner step of MAML, weights to train) is refused, saying so: the weights were frozen
    under the caller (their gradients dropped, none reaching them), or, computed, failed
    with torch's own RuntimeError. The weights are left as they were handed, and those
    handed detached are cached as the module's answers for them."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(4)
    cached(x)
    meta = {name: torch.randn_like(p).requires_grad_() for name, p in module.named_parameters()}
    weights = dict(meta) if handed == "leaves" else {n: t * 1.0 for n, t in meta.items()}
    with pytest.raises(Unfrozen, match=r"weights that require grad.*`0\.weight`.*functional_call"):
        torch.func.functional_call(cached, weights, (x,))
    assert all(t.requires_grad for t in weights.values())
    detached = {name: t.detach() for name, t in weights.items()}
    with torch.no_grad():
        assert torch.equal(
            torch.func.functional_call(cached, detached, (x,)),
            torch.func.functional_call(module, detached, (x,)),
        )
    assert torch.equal(cached(x), expected(module, x))
    cached.close()


def test_other_arguments_are_refused(cached: CachedRows) -> None:
    """A row is keyed by its input alone: an argument beside it is refused, not dropped."""
    with pytest.raises(RowsError, match="`mask=`"):
        cached(images(2), mask=torch.ones(2))


class Tokens(nn.Module):
    """A text encoder called as text encoders are, its inputs by name."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.embedding(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return h.sum(1)


def test_the_batch_goes_by_the_name_the_modules_forward_gives_it(store: Store) -> None:
    """A batch handed by the name the module's forward gives its input
    (``cached(input_ids=ids)``, as a text encoder is called) is the batch, keyed and
    recalled as one handed by place; another argument beside it, by name, is refused as
    one beside a batch handed by place is, and a call naming no input of the module's is
    refused with what to do (RowsError), where both failed with a TypeError naming the
    cache's own forward."""
    torch.manual_seed(0)
    module = Tokens()
    ids = torch.randint(0, 50, (4, 7))
    cached = cache_rows(module, store)
    assert torch.equal(cached(input_ids=ids), expected(module, ids))
    assert torch.equal(cached(ids), expected(module, ids))
    assert cached.stats.computed == 4 and cached.stats.recalled == 4
    mask = torch.ones_like(ids)
    with pytest.raises(RowsError, match="called with `attention_mask=` beside its batch"):
        cached(input_ids=ids, attention_mask=mask)
    with pytest.raises(RowsError, match=r"`tokens=`.*no batch.*`input_ids=`"):
        cached(tokens=ids)
    cached.close()


def test_a_mask_beside_the_batch_is_refused_saying_how_it_can_be_keyed(store: Store) -> None:
    """An attention mask handed beside token ids, by name or by place, holds a value for
    each row: it is refused saying to make it from the ids inside the module or to hand one
    batch holding both, whose rows are keyed whole — not to keep it in the module as a
    setting, which no per-row value can be. Nothing is kept."""
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (4, 7))
    mask = torch.ones_like(ids)
    cached = cache_rows(Tokens(), store)
    said = r"holds a value for each row.*inside the module.*torch\.stack\(\[ids, mask\], dim=1\)"
    with pytest.raises(RowsError, match=rf"`attention_mask=` {said}"):
        cached(input_ids=ids, attention_mask=mask)
    with pytest.raises(RowsError, match=rf"The argument after the batch {said}"):
        cached(ids, mask)
    assert cached.tiers[0].rows == 0 and cached.stats.computed == 0
    cached.close()


class ScaledTokens(Tokens):
    """``Tokens`` with a setting whose default is no None, and any keyword beside."""

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        scale: float | None = 1.0,
        **kwargs: Any,
    ) -> torch.Tensor:
        out = super().forward(input_ids, attention_mask)
        return out if scale is None else out * scale


def test_a_none_the_forward_takes_by_default_is_the_call_without_it(store: Store) -> None:
    """``attention_mask=None`` (as a caller with no mask writes), by name or by place, is
    the call without it: answered and recalled as that call. It was refused as a value
    to keep in the module. A None to a parameter whose default is another value, or to
    ``**kwargs``, is still refused."""
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (4, 7))
    cached = cache_rows(ScaledTokens(), store)
    alone = cached(ids)
    assert torch.equal(cached(ids, attention_mask=None), alone)
    assert torch.equal(cached(input_ids=ids, attention_mask=None), alone)
    assert torch.equal(cached(ids, None), alone)
    assert torch.equal(alone, expected(cached.module, ids))
    assert cached.stats.computed == 4 and cached.stats.recalled == 12
    for call in (
        lambda: cached(ids, scale=None),
        lambda: cached(ids, None, None),
        lambda: cached(ids, other=None),
        lambda: cached(ids, attention_mask=torch.ones_like(ids)),
    ):
        with pytest.raises(RowsError, match="beside its batch"):
            call()
    cached.close()


@dataclasses.dataclass
class Encoded:
    """A tokenizer's batch kept as a dataclass."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class Encoding(collections.UserDict):  # type: ignore[type-arg]
    """A tokenizer's batch kept as a mapping that is no dict, as transformers' own is."""


Pair = collections.namedtuple("Pair", ["input_ids", "attention_mask"])


@pytest.mark.parametrize(
    ("make", "hand"),
    [
        (lambda ids, mask: {"input_ids": ids, "attention_mask": mask}, r'batch\["input_ids"\]'),
        (lambda ids, mask: Encoding(input_ids=ids, attention_mask=mask), r'batch\["input_ids"\]'),
        (lambda ids, mask: Pair(ids, mask), r"batch\.input_ids"),
        (lambda ids, mask: Encoded(ids, mask), r"batch\.input_ids"),
        (lambda ids, mask: (ids, mask.sum(1)), r"batch\[0\]"),
        (lambda ids, mask: [ids, mask], r"batch\[0\]"),
    ],
)
def test_a_batch_of_several_tensors_is_refused_naming_the_one_to_hand(
    store: Store, make: Callable[[torch.Tensor, torch.Tensor], Any], hand: str
) -> None:
    """A tokenizer's batch handed whole (a dict, a mapping, a named tuple, a dataclass, a
    tuple of ids and lengths) is refused naming the tensor in it to hand, and how the rest
    may reach the module: made from it inside, or stacked with it into one batch."""
    ids = torch.randint(1, 50, (4, 7))
    cached = cache_rows(Tokens(), store)
    with pytest.raises(
        NotRowwise, match=rf"`cached\({hand}\)`.*inside the module.*torch\.stack\(\["
    ):
        cached(make(ids, torch.ones_like(ids)))
    cached.close()


@dataclasses.dataclass
class Unfilled:
    """A batch kept as a dataclass whose mask its constructor leaves unset."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor = dataclasses.field(init=False)


def test_a_dataclass_batch_with_a_field_left_unset_is_refused_naming_the_one_to_hand(
    store: Store,
) -> None:
    """A dataclass batch one of whose fields its constructor left unset is refused as any
    batch of several tensors is, naming the tensor it holds (it failed with the
    AttributeError of reading the unset field)."""
    cached = cache_rows(Tokens(), store)
    with pytest.raises(NotRowwise, match=r"`cached\(batch\.input_ids\)`"):
        cached(Unfilled(torch.randint(1, 50, (4, 7))))
    cached.close()


@pytest.mark.parametrize(
    ("make", "pad"),
    [
        (
            lambda rows: nn.utils.rnn.pack_sequence(rows, enforce_sorted=False),
            r"`pad_packed_sequence\(batch, batch_first=True\)`",
        ),
        (lambda rows: torch.nested.nested_tensor(rows), r"`batch\.to_padded_tensor\(0\)`"),
    ],
)
def test_a_batch_of_sequences_of_varying_length_is_refused_saying_how_to_pad_it(
    store: Store, make: Callable[[list[torch.Tensor]], Any], pad: str
) -> None:
    """Sequences of varying length packed (a ``PackedSequence``) or nested are refused
    saying how to pad them into a batch tensor, rows along dimension 0."""
    rows = [torch.randn(n, 4) for n in (3, 5, 2)]
    cached = cache_rows(nn.Linear(4, 2), store)
    with pytest.raises(NotRowwise, match=rf"pad it.*{pad}"):
        cached(make(rows))
    cached.close()


@pytest.mark.parametrize("make", [list, tuple])
def test_samples_of_varying_length_left_unstacked_are_refused_saying_to_pad_them(
    store: Store, make: Callable[[list[torch.Tensor]], Any]
) -> None:
    """A collate that leaves a batch's sequences of varying length unstacked (a list of
    its samples, or the tuple `zip` makes) is refused saying to pad them into one batch
    tensor; it said to hand the first tensor alone, which is one sample, not a batch."""
    rows = [torch.randn(n, 4) for n in (3, 5, 2)]
    cached = cache_rows(nn.Linear(4, 2), store)
    with pytest.raises(
        NotRowwise, match=r"pad them.*\.pad_sequence\(batch, batch_first=True\)`"
    ) as why:
        cached(make(rows))
    assert "cached(batch[0])" not in str(why.value)
    cached.close()


def test_numpy_arrays_are_refused_saying_to_hand_torch_from_numpy(store: Store) -> None:
    """A batch of numpy arrays (a Ray Data batch, a dict of columns), one array, or
    indices as an array are refused naming `torch.from_numpy` of the array to hand; the
    batch was refused as a `dict`, saying nothing of its arrays."""
    images = np.zeros((4, 8), np.float32)
    cached = cache_rows(nn.Linear(8, 2), store)
    with pytest.raises(NotRowwise, match=r'`cached\(torch\.from_numpy\(batch\["image"\]\)\)`'):
        cached({"id": np.arange(4), "image": images})
    with pytest.raises(NotRowwise, match=r"numpy float32 array.*`torch\.from_numpy\(array\)`"):
        cached(images)
    cached.close()
    by_index = cache_rows(nn.Linear(8, 2), store, key="index", version="toy@1")
    with pytest.raises(NeedsIndex, match=r"numpy int64 array.*`torch\.from_numpy\(array\)`"):
        by_index(torch.from_numpy(images), index=np.arange(4))
    by_index.close()


class Pixels(nn.Module):
    """An image encoder whose forward takes its input by name only."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, *, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.linear(pixel_values)


def test_a_module_taking_its_input_by_name_only_is_handed_its_batch_by_name(
    store: Store,
) -> None:
    """A module whose forward takes its input by name only (``forward(self, *,
    pixel_values)``), called by that name, is handed its batch by it — in the batch, the
    rows run alone to look for mixing and the rows computed beside recalled ones — and
    answers as itself, where every call failed with a TypeError from its forward."""
    torch.manual_seed(0)
    module = Pixels().eval()
    x = torch.randn(6, 8)
    cached = cache_rows(module, store)
    with torch.no_grad():
        want = module(pixel_values=x)
    assert torch.equal(cached(pixel_values=x[:4]), want[:4])
    assert torch.equal(cached(pixel_values=x), want)
    assert cached.stats.computed == 6 and cached.stats.recalled == 4
    assert torch.equal(cached(x), want)  # by place too, as prefill hands it
    cached.close()


class PerSample(nn.Module):
    """A frozen encoder whose forward takes its samples' indices itself (a table of one
    learned vector per sample, added to each row's features)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.table = nn.Embedding(16, 4)

    def forward(self, x: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        h: torch.Tensor = self.linear(x)
        return h if index is None else h + self.table(index)


def test_an_index_the_modules_own_forward_takes_is_refused(store: Store) -> None:
    """``cached(x, index=idx)`` keyed by index, of a module whose forward takes ``index``
    itself, is refused (RowsError) before anything is computed or kept: the cache takes
    the indices as the rows' keys and hands the module its batch alone, so every row was
    answered as without an index, not as ``module(x, index=idx)`` answers it. Keyed by
    content, it answers as the module does; a module whose input itself is named
    ``index`` is handed the batch there."""
    torch.manual_seed(0)
    module = PerSample().eval()
    x, index = torch.randn(5, 4), torch.tensor([3, 7, 1, 9, 2])
    cached = cache_rows(module, store, key="index", version="toy@1")
    with pytest.raises(RowsError, match="called with index=, which its forward takes too"):
        cached(x, index=index)
    assert cached.stats.rows == 0
    keyed_by_content = cache_rows(module, store)
    assert torch.equal(keyed_by_content(x), expected(module, x))
    cached.close()
    keyed_by_content.close()
    lookup = Lookup()
    ids = torch.tensor([[1, 2], [3, 4]])
    by_index = cache_rows(lookup, store, key="index", version="toy@1")
    assert torch.equal(by_index(ids, index=torch.arange(2)), expected(lookup, ids))
    by_index.close()


class Lookup(nn.Module):
    """A frozen table whose forward names its input, the batch, ``index``."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(8, 2)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.table(index)
        return out


@pytest.mark.parametrize("wrapper", ["torch.compile", "nn.DataParallel"])
def test_a_wrapped_module_is_called_as_the_module_it_wraps(store: Store, wrapper: str) -> None:
    """A module compiled (``torch.compile``) or wrapped in ``nn.DataParallel``, whose own
    forward takes ``(*args, **kwargs)`` and hands them on, is called as the module it
    wraps: one taking its input by name only is handed its batch by that name, where
    every call failed with a TypeError from its forward (or was refused as given no
    batch), and ``index=`` to one whose forward takes ``index`` is refused, where every
    row was answered as if no index were given."""

    def wrapped(module: nn.Module) -> nn.Module:
        if wrapper == "torch.compile":
            return torch.compile(module, backend="eager")  # type: ignore[return-value]
        return nn.DataParallel(module, device_ids=[])

    torch.manual_seed(0)
    pixels, x = Pixels().eval(), torch.randn(4, 8)
    cached = cache_rows(wrapped(pixels), store)
    with torch.no_grad():
        want = pixels(pixel_values=x)
    assert torch.equal(cached(pixel_values=x), want)
    assert torch.equal(cached(x), want)
    cached.close()
    per_sample = cache_rows(wrapped(PerSample().eval()), store, key="index", version="toy@1")
    with pytest.raises(RowsError, match="called with index=, which its forward takes too"):
        per_sample(torch.randn(5, 4), index=torch.tensor([3, 7, 1, 9, 2]))
    assert per_sample.stats.rows == 0
    per_sample.close()


def test_rows_of_a_compiled_module_are_recalled_through_another_compile_of_it(
    store: Store,
) -> None:
    """Rows a module compiled by ``torch.compile`` computed are recalled by a cache of the
    same module compiled again, as the next run of a script compiles it: the key named
    what the compile wrapper keeps, an id of its own among it, so each compile (each
    process) keyed every row anew and recalled nothing a run before it had kept."""
    torch.manual_seed(0)
    module, x = encoder(), images(6)
    first = cache_rows(torch.compile(module, backend="eager"), store)
    want = first(x)
    first.close()
    again = cache_rows(torch.compile(module, backend="eager"), store)
    assert torch.equal(again(x), want)
    assert (again.stats.computed, again.stats.from_store) == (0, 6)
    again.close()


def test_a_forward_replaced_later_is_read_anew(store: Store) -> None:
    """What a module's forward takes is read anew once the forward is replaced: an index
    refused while the forward takes one is taken by the cache once it no longer does, and
    a forward replaced by one taking its input by name only is handed the batch so."""
    torch.manual_seed(0)
    module, x, index = PerSample().eval(), torch.randn(5, 4), torch.tensor([3, 7, 1, 9, 2])
    cached = cache_rows(module, store, key="index", version="toy@1")
    with pytest.raises(RowsError, match="called with index=, which its forward takes too"):
        cached(x, index=index)

    def alone(self: PerSample, *, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(features)
        return out

    module.forward = types.MethodType(alone, module)  # type: ignore[method-assign]
    with torch.no_grad():
        want = module.linear(x)
    assert torch.equal(cached(features=x, index=index), want)
    cached.close()


def test_a_second_positional_argument_is_refused_not_taken_for_the_index(
    cached: CachedRows,
) -> None:
    """``cached(x, mask)`` — how a torch module is often called — is refused: the mask is
    no index (that one goes by keyword), and dropping it would answer every row wrongly."""
    with pytest.raises(RowsError, match="1 positional argument beside its batch: a row is keyed"):
        cached(images(2), torch.ones(2, 3, 8, 8))
    with pytest.raises(RowsError, match="2 positional arguments and `scale=`"):
        cached(images(2), torch.ones(2), torch.ones(2), scale=2.0)
    assert cached.stats.rows == 0


def test_an_index_is_refused_by_a_content_keyed_cache(cached: CachedRows) -> None:
    """A cache keyed by content names each row by its input: an index given to it would be
    ignored, so it is refused; prefill hands it none, whatever the loader's items hold."""
    with pytest.raises(RowsError, match="keyed by content and was called with index="):
        cached(images(2), index=torch.arange(2))
    items = [{"x": images(16), "index": torch.arange(16)}]
    assert prefill(cached, items, progress=False).computed == 16


def test_a_part_without_weights_replaced_keys_rows_anew(store: Store) -> None:
    """An activation replaced (no weights, so the same state) is another module: the
    forward after it computes every row with it instead of recalling the old answers."""
    module = nn.Sequential(nn.Linear(8, 4), nn.Identity())
    cached = cache_rows(module, store)
    x = torch.randn(16, 8)
    cached(x)
    module[1] = nn.Tanh()
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 2 * 16
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 2 * 16  # and its rows are recalled from there on
    cached.close()


@pytest.mark.parametrize("weights", ["equal", "other"])
def test_a_value_set_on_a_part_put_in_keys_rows_anew(
    store: Store, weights: str, sharp_norm: nn.Sequential
) -> None:
    """A BatchNorm put in place of one, then given another ``eps``: the value was looked
    for on the part replaced, and the rows of the old ``eps`` were recalled. Each forward
    after computes with the value the new part keeps."""
    module = sharp_norm
    cached = cache_rows(module, store)
    x = torch.randn(16, 8)
    cached(x)
    part = copy.deepcopy(module[1])
    if weights == "other":
        with torch.no_grad():
            part.running_mean.add_(1.0)
    module[1] = part
    assert torch.equal(cached(x), expected(module, x))
    module[1].eps = 0.5
    assert torch.equal(cached(x), expected(module, x))
    cached.close()


def test_parts_put_in_or_removed_through_a_cached_container_key_rows_anew(
    store: Store,
) -> None:
    """``cached[i] = part`` and ``del cached[i]`` are the container's own, and so is ``del``
    on the container itself: each forward after computes with the module as it is now,
    and the cache's children and ``state_dict()`` stay the module's."""
    module = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 3))
    cached = cache_rows(module, store)
    x = torch.randn(16, 8)
    cached(x)
    cached[1] = nn.Tanh()
    assert module[1] is cached[1] and isinstance(module[1], nn.Tanh)
    assert torch.equal(cached(x), expected(module, x))
    del cached[2]
    assert len(cached) == len(module) == 2
    assert torch.equal(cached(x), expected(module, x))
    del module[1]
    assert torch.equal(cached(x), expected(module, x))
    assert list(cached.children()) == list(module.children())
    assert cached.state_dict().keys() == module.state_dict().keys()
    assert cached.stats.computed == 4 * 16
    cached.close()


def test_a_part_removed_from_the_module_itself_is_gone_from_the_caches_state_dict(
    store: Store,
) -> None:
    """``del module[i]`` on the cached module itself, with no forward since: the cache's
    ``state_dict()``, its own or a parent's, has the module's keys as they are now, and
    a checkpoint of that layout loads back through the cache."""
    module = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    parent = nn.Module()
    parent.enc = cache_rows(module, store)
    parent.enc(torch.randn(16, 8))
    del module[0]
    assert parent.enc.state_dict().keys() == module.state_dict().keys()
    assert parent.state_dict().keys() == {f"enc.{k}" for k in module.state_dict()}
    fresh = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3))
    del module[1]
    parent.load_state_dict({f"enc.{k}": v for k, v in fresh[:1].state_dict().items()})
    assert torch.equal(module[0].weight, fresh[0].weight)
    parent.enc.close()


def test_an_unfrozen_module_is_handed_to_when_unfrozen(store: Store) -> None:
    """With ``when_unfrozen`` set, a forward that finds the module unfrozen tells it, and
    answers with the module itself (in the caller's grad mode) where it says it put the
    module back uncached; where it says no, the module is refused as without it."""
    module = encoder()
    cached = cache_rows(module, store)
    cached(images(4))
    told: list[CachedRows] = []

    def put_back(cache: CachedRows) -> bool:
        told.append(cache)
        return len(told) > 1  # no the first time, yes after

    cached.when_unfrozen = put_back
    module[0].weight.requires_grad_(True)
    with pytest.raises(Unfrozen, match=r"`0.weight` now require grad"):
        cached(images(4))
    out = cached(images(4))
    assert told == [cached, cached]
    assert out.requires_grad  # the module ran, so its unfrozen weight trains
    assert torch.allclose(out, expected(module, images(4)))
    cached.close()


def test_deferred_rows_of_an_unfrozen_module_are_loaded_for_it() -> None:
    """A batch from `Deferred` whose module was found unfrozen and put back uncached is
    loaded whole and handed to the module itself."""
    module = encoder()
    cached = cache_rows(module, key="index")
    data = images(8)
    (rows,) = DataLoader(Deferred(data, version="toy@1"), batch_size=8)
    cached.when_unfrozen = lambda cache: True
    module[0].weight.requires_grad_(True)
    assert torch.allclose(cached(rows), expected(module, data))


def test_forget_lets_go_of_the_rows_in_memory(store: Store) -> None:
    """``forget`` empties the memory tiers; the store keeps what was written, and a later
    forward recalls it from there."""
    cached = cache_rows(encoder(), store)
    x = images(8)
    cached(x)
    cached.flush()
    assert cached.tiers[0].rows == 8
    cached.forget()
    assert [tier.rows for tier in cached.tiers] == [0, 0]
    assert torch.equal(cached(x), expected(cached.module, x))
    assert cached.stats.from_store == 8
    cached.close()


def test_float32_matmul_precision_is_in_the_key(store: Store) -> None:
    """Rows computed with reduced-precision float32 products are not recalled for full
    precision ones (nor the other way)."""
    cached = cache_rows(nn.Linear(6, 3), store)
    x = torch.randn(4, 6)
    was = torch.get_float32_matmul_precision()
    try:
        cached(x)
        torch.set_float32_matmul_precision("medium")
        cached(x)
        torch.set_float32_matmul_precision("highest")
        cached(x)
    finally:
        torch.set_float32_matmul_precision(was)
    assert (cached.stats.computed, cached.stats.recalled) == (8, 4)
    cached.close()


def test_onednn_turned_off_is_in_the_key(store: Store) -> None:
    """Rows a convolution computed through oneDNN are not recalled with oneDNN turned off
    (`torch.backends.mkldnn.enabled = False`, as a user avoiding one of its kernels
    does), where torch's own kernel computes, and rounds, otherwise: each is the answer
    the module gives under the setting it is called in."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(8)
    cached(x)
    try:
        torch.backends.mkldnn.enabled = False
        without = expected(module, x)
        assert torch.equal(cached(x), without)
    finally:
        torch.backends.mkldnn.enabled = True
    assert not torch.equal(without, expected(module, x))  # the setting changes the answer
    assert torch.equal(cached(x), expected(module, x))
    assert (cached.stats.computed, cached.stats.recalled) == (16, 8)
    cached.close()


def test_cudnn_turned_off_is_in_the_key_of_a_cuda_call() -> None:
    """cuDNN turned off (`torch.backends.cudnn.enabled = False`) has torch's own kernels
    compute a convolution on CUDA, rounding otherwise: a call on CUDA is keyed apart then,
    and one on the host is not (the setting is read without a GPU)."""
    assert kernels_off("cuda") == ()
    try:
        torch.backends.cudnn.enabled = False
        assert kernels_off("cuda") == (("cudnn", "off"),)
        assert kernels_off("cpu") == ()
    finally:
        torch.backends.cudnn.enabled = True


def test_default_dtype_is_in_the_key(store: Store) -> None:
    """A module that makes tensors in its forward answers in the default dtype; rows
    computed under another default are not recalled for float32's."""
    cached = cache_rows(Ramp(), store)
    x = torch.ones(3, 4)
    assert cached(x).dtype == torch.float32
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert cached(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(was)
    assert cached(x).dtype == torch.float32
    assert cached.stats.computed == 6
    cached.close()


class Ramp(nn.Module):
    """Adds a ramp made in its forward, in the default dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.linspace(0, 1, x.shape[1])


def test_a_model_holding_a_cache_copies_and_saves(store: Store, tmp_path: Path) -> None:
    """``copy.deepcopy`` (an EMA or SWA model) and ``torch.save`` of a model holding a cache
    give one that caches the same way into the same store, with its own memory tiers."""
    model = nn.Sequential(cache_rows(encoder(), store), nn.Linear(8, 2))
    x = images(5)
    out = model(x)
    model[0].flush()
    twin = copy.deepcopy(model)
    assert isinstance(twin[0], CachedRows) and twin[0] is not model[0]
    assert twin[0].store is store and twin[0].tiers[0].rows == 0
    assert torch.equal(twin(x), out) and twin[0].stats.from_store == 5
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(loaded(x), out) and loaded[0].stats.from_store == 5
    averaged = torch.optim.swa_utils.AveragedModel(model)
    assert torch.equal(averaged(x), out)
    for cached in (model[0], twin[0], loaded[0]):
        cached.close()


_WATCH_SLOTS_BEFORE = frozenset(
    {
        *("_doubted", "_gradients", "_held", "_memory", "_named", "_originals"),
        *("_param_versions", "_params", "_placed", "_read", "_requires", "_sharded"),
        *("_sizes", "_tables", "_tensors", "_trainable", "_versions", "_where"),
    }
)
"""The slots of a state watch in the release before this one (f43888e), whose loading
sets each name a pickle hands it: one it has no slot for is an AttributeError."""


def test_a_state_watch_pickled_is_loaded_by_either_release() -> None:
    """A wrapped model saved (``torch.save``) pickles the watch of each frozen module's
    state. The release before this one, loading it, failed on the name of a slot it lacks
    (``AttributeError: '_ends'``): none is handed. A watch that release pickled, loaded
    here, works out its first and last floating tensors again, and so sees its module
    converted itself and back (``encoder.half().float()``)."""
    module = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    handed = _state.StateWatch(module).__getstate__()
    assert set(handed) <= _WATCH_SLOTS_BEFORE
    loaded = _state.StateWatch.__new__(_state.StateWatch)
    loaded.__setstate__({**handed, "_doubted": False})
    assert not loaded.ends_moved()
    module.half().float()
    assert loaded.ends_moved()


def test_a_model_whose_cache_recalled_rows_from_the_store_saves_and_copies(
    store: Store, tmp_path: Path
) -> None:
    """A model holding a cache that recalled its rows from the store (a second run over a
    store filled by the first, its pack's blob mapped as it was read) is saved whole and
    copied as one that has read nothing: ``torch.save`` raised ``TypeError: cannot pickle
    memoryview objects``. The copy answers as the model does, reading the store afresh."""
    torch.manual_seed(0)
    wide = nn.Linear(16, 1024)  # 20 rows of 4 KiB: a pack the store maps as it is read
    x = torch.randn(20, 16)
    first = cache_rows(wide, store)
    out = first(x)
    first.close()
    model = nn.Sequential(cache_rows(wide, store), nn.ReLU())
    assert torch.equal(model(x), out.relu()) and model[0].stats.from_store == 20
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    for copied in (loaded, copy.deepcopy(model)):
        assert torch.equal(copied(x), out.relu()) and copied[0].stats.from_store == 20
        copied[0].close()
    model[0].close()


def test_a_cache_handed_back_copies_with_its_model_leaving_the_module_as_the_model_has_it(
    tmp_path: Path,
) -> None:
    """A row cache handed back (``CacheFrozen`` keeps it so between stages), copied or
    pickled together with the model that trains its module (``strategy="ddp_spawn"``
    pickles the trainer, its callbacks and the model at once), copies as a cache handed
    back: its module is the copied model's, left in train mode and requiring grad, and a
    call of the copy answers as the module frozen in eval and leaves it so. The copy froze
    the model's module for good: held in eval, its parameters requiring no grad, so the
    copied model's optimizer never moved them."""
    module = encoder()
    model = nn.Sequential(module, nn.Linear(4, 2))
    cached = cache_rows(module)
    cached.hand_back()
    release(module)  # its model's again, in train mode, trained
    module.requires_grad_(True)
    x = images(3)
    torch.save((model, cached), tmp_path / "both.pt")
    for twin, copied in (
        copy.deepcopy((model, cached)),
        torch.load(tmp_path / "both.pt", weights_only=False),
    ):
        assert copied.module is twin[0]
        assert not is_held(twin[0]) and all(part.training for part in twin[0].modules())
        assert all(p.requires_grad for p in twin[0].parameters())
        with torch.no_grad():
            twin[0][0].weight.add_(1.0)  # the copy's model trains it
        assert torch.equal(copied(x), expected(copy.deepcopy(twin[0]), x))
        assert not is_held(twin[0]) and all(part.training for part in twin[0].modules())
        assert all(p.requires_grad for p in twin[0].parameters())
        assert not is_held(module) and module.training


def test_index_keys_miss_when_the_dataset_version_changes(store: Store, tmp_path: Path) -> None:
    """Keyed by index, rows recall under the same dataset version and miss under another."""
    data = images(32)
    first = cache_rows(encoder(), store, key="index", version="sms/train@1")
    prefill(first, loader(data), inputs=lambda item: (item[0], item[1]), progress=False)
    first.close()
    again = cache_rows(encoder(), Store(tmp_path / "store"), key="index", version="sms/train@1")
    changed = cache_rows(encoder(), Store(tmp_path / "store"), key="index", version="sms/train@2")
    index = torch.arange(32)
    assert torch.equal(again(data, index=index), expected(again.module, data))
    assert again.stats.from_store == 32
    changed(data, index=index)
    assert (changed.stats.computed, changed.stats.recalled) == (32, 0)
    again.close()
    changed.close()


def test_index_keys_need_indices_and_a_version() -> None:
    """An index-keyed cache refuses a version that is not a string, to key rows without a
    version (it may come from a `Deferred` instead), and calls without indices, with
    indices that do not match the batch, with a mask or complex numbers for indices, or
    with a negative index."""
    with pytest.raises(NeedsIndex, match="as a string"):
        cache_rows(encoder(), key="index", version="")
    unversioned = cache_rows(encoder(), key="index")
    with pytest.raises(NeedsIndex, match="pass version="):
        unversioned(images(4), index=torch.arange(4))
    assert unversioned.stats.rows == 0
    cached = cache_rows(encoder(), key="index", version="sms/train@1")
    with pytest.raises(NeedsIndex, match=r"cached\(x, index=idx\)"):
        cached(images(4))
    with pytest.raises(NeedsIndex, match="3 indices for a batch of 4"):
        cached(images(4), index=torch.arange(3))
    for mask in (torch.ones(4, dtype=torch.bool), torch.arange(4) * 1j):
        with pytest.raises(NeedsIndex, match="1-d integer tensor"):
            cached(images(4), index=mask)  # True would have named sample 1
    with pytest.raises(NeedsIndex, match="holds -1"):
        cached(images(4), index=torch.tensor([0, 1, 2, -1]))
    assert cached.stats.rows == 0
    with pytest.raises(RowsError, match="key= is `content`"):
        cache_rows(encoder(), key="rows")  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["meta", "sparse"])
def test_indices_that_hold_no_values_to_read_are_refused_saying_so(where: str) -> None:
    """Indices on the meta device (which hold none) or sparse ones (which are read as no
    dense tensor is) are refused as indices, saying what they are, not with torch's error
    from reading them."""
    cached = cache_rows(encoder(), key="index", version="sms/train@1")
    index = torch.arange(4, device="meta") if where == "meta" else torch.arange(4).to_sparse()
    said = "on the meta device" if where == "meta" else "sparse_coo"
    with pytest.raises(NeedsIndex, match=rf"1-d integer tensor .* got .*{said}"):
        cached(images(4), index=index)
    assert cached.stats.rows == 0


@pytest.mark.parametrize(
    ("index", "said"),
    [
        ([0, 1, 2, 3], r"of integers: hand `torch\.tensor\(index\)`"),
        (["s0000", "s0001", "s0002", "s0003"], r"of names: .*`__key__`.* key rows by content"),
    ],
)
def test_indices_in_a_list_are_refused_saying_what_to_hand(index: list[Any], said: str) -> None:
    """A list of sample indices (a collate of its own leaving them so) is refused saying
    to make it a tensor, and a list of sample names (a webdataset's string keys) saying
    that names are no indices: both were refused only as a `list`."""
    cached = cache_rows(encoder(), key="index", version="sms/train@1")
    with pytest.raises(NeedsIndex, match=rf"1-d integer tensor .* got a `list` {said}"):
        cached(images(4), index=index)
    assert cached.stats.rows == 0


def test_how_rows_are_keyed_is_fixed_when_the_cache_is_made(store: Store) -> None:
    """A salt or a key mode written after rows were keyed would be ignored by the keyings
    made already (a salt never changed a row's key) or would mix the keys (rows keyed by
    index without a version): both are refused, naming what to do, and the cache answers
    as it was made."""
    cached = cache_rows(nn.Linear(4, 2), store, salt="v1")
    x = torch.randn(6, 4)
    cached(x)
    keys = cached.row_keys(x)
    with pytest.raises(AttributeError, match=r"`salt` of a row cache is fixed.*salt='v2'"):
        cached.salt = "v2"
    with pytest.raises(AttributeError, match=r"`key_mode` of a row cache is fixed.*key='index'"):
        cached.key_mode = "index"
    assert (cached.salt, cached.key_mode) == ("v1", "content")
    assert cached.row_keys(x) == keys
    salted = cache_rows(cached.module, store, salt="v2")
    assert salted.row_keys(x) != keys
    cached.close()
    salted.close()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"salt": 5}, "salt= is a string"),
        ({"strict": "yes"}, "strict= is True or False"),
        ({"host_bytes": "4GB"}, "host_bytes= is the memory tier's budget"),
        ({"device_bytes": -1}, "device_bytes= is the memory tier's budget"),
    ],
)
def test_settings_of_the_wrong_kind_are_refused_naming_them(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(RowsError, match=named):
        cache_rows(encoder(), **options)


def test_budgets_take_any_whole_number() -> None:
    """A budget worked out with numpy (an ``int64``, which is no Python int) is a number
    of bytes all the same."""
    import numpy as np

    cached = cache_rows(encoder(), device_bytes=np.int64(1 << 20), host_bytes=np.int64(0))
    assert cached(images(4)).shape[0] == 4


def test_prefill_warms_the_cache_with_a_progress_bar(
    cached: CachedRows, capsys: pytest.CaptureFixture[str]
) -> None:
    """prefill runs every batch of a loader through the cache, shows tqdm's bar, flushes,
    and the epoch after it recalls everything."""
    data = images(48)
    done = prefill(cached, loader(data))
    assert isinstance(done, RowStats)
    assert (done.rows, done.computed, done.rows_kept) == (48, 48, 48)
    assert "3/3" in capsys.readouterr().err
    for x, _ in loader(data, seed=2):
        cached(x)
    assert cached.stats.from_device == 48


def test_prefill_without_tqdm_names_the_extra_that_brings_it(
    cached: CachedRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prefill with a progress bar and tqdm missing is an ImportError naming the extra
    that brings it (`pip install 'somatize[torch]'`), where it said `pip install tqdm`;
    without the bar it runs."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"`pip install 'somatize\[torch\]'`.*progress=False"):
        prefill(cached, loader(images(16)))
    assert prefill(cached, loader(images(16)), progress=False).rows == 16


def test_prefill_counts_as_kept_only_the_rows_it_kept(
    cached: CachedRows, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What prefill says it kept is what it computed and kept: rows computed before it, on
    their way to the store as it starts, are written by its flush but are not its own."""
    let_go = threading.Event()
    open_joined = store.open_joined

    def held_back(*args: Any, **kwargs: Any) -> Any:
        assert let_go.wait(10)
        return open_joined(*args, **kwargs)

    monkeypatch.setattr(store, "open_joined", held_back)
    cached(images(8, seed=3))  # its rows wait for the writer
    flush = CachedRows.flush

    def flushed(self: CachedRows) -> None:
        let_go.set()  # a flush waits for them: they go on
        flush(self)

    monkeypatch.setattr(CachedRows, "flush", flushed)

    class Releases(DataLoader[tuple[torch.Tensor, ...]]):
        def __iter__(self) -> Any:
            let_go.set()  # the prefill has started: they go on
            return super().__iter__()

    done = prefill(cached, Releases(TensorDataset(images(32)), batch_size=16), progress=False)
    assert (done.rows, done.computed, done.rows_kept) == (32, 32, 32)
    assert cached.stats.rows_kept == 40


class _Stream(IterableDataset[torch.Tensor]):
    """Samples with no length: a DataLoader over it has ``__len__``, which raises."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.data)


def test_prefill_over_a_loader_of_no_length_shows_a_bar_with_no_total(
    cached: CachedRows, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DataLoader over an IterableDataset cannot say its length (``len()`` raises
    TypeError): prefill's bar counts the batches without a total."""
    done = prefill(cached, DataLoader(_Stream(images(48)), batch_size=16))
    assert (done.rows, done.computed) == (48, 48)
    assert "3it" in capsys.readouterr().err


@pytest.mark.parametrize("items", [3, 1])
def test_prefill_refuses_inputs_answering_a_tuple_of_another_length(
    cached: CachedRows, items: int
) -> None:
    """``inputs=`` answers the batch, or ``(batch, indices)``: a tuple of another length
    (the loader item handed back whole) is refused saying so, before any row is
    computed."""
    data = images(32)
    with pytest.raises(TypeError, match=rf"inputs= answered a tuple of {items} items.*\(batch, "):
        prefill(cached, loader(data), inputs=lambda item: (item[0], item[1], item[1])[:items])
    assert cached.stats.computed == 0


class PooledTokens(nn.Module):
    """A text encoder taking token ids alone (padding masked by its id, 0), or the mask
    beside them where ``masked``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 4, padding_idx=0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(input_ids).sum(dim=1)
        return out


class MaskedTokens(PooledTokens):
    def forward(  # type: ignore[override]  # the mask beside the ids
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().forward(input_ids)


def tokenized(count: int) -> list[dict[str, torch.Tensor]]:
    """What a tokenizer's loader yields: batches of ids and their mask, by name."""
    ids = torch.randint(1, 50, (count, 7))
    return [{"input_ids": part, "attention_mask": torch.ones_like(part)} for part in ids.split(4)]


def test_prefill_takes_a_dict_s_tensor_named_as_the_forward_s_parameter() -> None:
    """A loader of dicts with no ``x`` (a tokenizer's ``input_ids`` and ``attention_mask``)
    is prefilled through the tensor named as the module's forward's first parameter, where
    no other tensor of it names one of its parameters."""
    batches = tokenized(12)
    cached = cache_rows(PooledTokens())
    done = prefill(cached, batches, progress=False)
    assert done.computed == 12
    for batch in batches:
        assert torch.equal(cached(batch["input_ids"]), cached.module(batch["input_ids"]))
    assert cached.stats.computed == 12


def test_prefill_takes_the_batch_from_a_mapping_that_is_no_dict() -> None:
    """A loader of mappings that are not dicts (a collator's ``BatchEncoding``) is prefilled
    as a loader of dicts is: through the tensor named as the forward's first parameter."""
    batches = [Encoding(input_ids=batch["input_ids"]) for batch in tokenized(12)]
    cached = cache_rows(PooledTokens())
    assert prefill(cached, batches, progress=False).computed == 12
    for batch in batches:
        assert torch.equal(cached(batch["input_ids"]), cached.module(batch["input_ids"]))


class NamedTokens(PooledTokens):
    def forward(self, *, input_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(input_ids)


@pytest.mark.parametrize(
    "make",
    [NamedTokens, lambda: nn.DataParallel(PooledTokens())],
    ids=["keyword-only", "data-parallel"],
)
def test_prefill_names_the_batch_as_the_cache_hands_it(make: Callable[[], nn.Module]) -> None:
    """The dict's tensor is named by the forward the cache calls: one taking it by keyword
    only, or that of the module a ``DataParallel`` wraps, as a cache hands it the batch."""
    batches = tokenized(12)
    cached = cache_rows(make())
    assert prefill(cached, batches, progress=False).computed == 12
    plain = PooledTokens()  # of the same weights, its seed set as it is made
    for batch in batches:
        assert torch.equal(cached(batch["input_ids"]), expected(plain, batch["input_ids"]))


def test_prefill_refuses_a_mask_the_wrapped_module_takes() -> None:
    """The mask a ``DataParallel``'s module takes beside the ids is seen through it."""
    cached = cache_rows(nn.DataParallel(MaskedTokens()))
    with pytest.raises(TypeError, match=r"'input_ids'.*`MaskedTokens.forward`.*'attention_mask'"):
        prefill(cached, tokenized(8), progress=False)


class HandsOn(PooledTokens):
    """A wrapper handing what its forward takes by keyword on to the model it wraps."""

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return super().forward(input_ids)


def test_prefill_refuses_a_mask_a_forward_taking_any_keyword_takes() -> None:
    """A forward taking ``**kwargs`` takes the mask beside the ids as surely as one naming
    it: refused alike, where the dict's ``index`` alone beside them is not."""
    cached = cache_rows(HandsOn())
    with pytest.raises(TypeError, match=r"'input_ids'.*'attention_mask'"):
        prefill(cached, tokenized(8), progress=False)
    assert cached.stats.computed == 0
    indexed = [{"input_ids": b["input_ids"], "index": torch.arange(4)} for b in tokenized(8)]
    assert prefill(cached, indexed, progress=False).computed == 8


class MaskedX(PooledTokens):
    """A text encoder taking its ids as ``x``, and a mask beside them, or anything by
    keyword where ``HandsOnX``."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x if mask is None else x * mask)


class HandsOnX(PooledTokens):
    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)


def test_prefill_refuses_a_mask_beside_a_dict_s_x_that_the_forward_takes() -> None:
    """A dict's ``x`` is its batch; a mask beside it that the forward takes is refused, as
    beside a batch named by the forward: the cache would hand the module ``x`` alone.
    It was left out without a word. Labels beside ``x`` are taken as they were, even by a
    forward taking any keyword."""
    masked = [{"x": b["input_ids"], "mask": b["attention_mask"]} for b in tokenized(8)]
    cached = cache_rows(MaskedX())
    with pytest.raises(TypeError, match=r"under 'x'.*'mask' beside it.*torch\.stack"):
        prefill(cached, masked, progress=False)
    assert cached.stats.computed == 0
    labelled = [{"x": b["input_ids"], "y": torch.arange(4)} for b in tokenized(8)]
    assert prefill(cache_rows(HandsOnX()), labelled, progress=False).computed == 8


class IndexedX(PooledTokens):
    """A text encoder whose forward takes the samples' indices beside its ids."""

    def forward(self, x: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)


def test_prefill_never_takes_a_dict_s_index_for_a_mask(tmp_path: Path) -> None:
    """A dict's ``index`` is the samples' indices, never a mask, even where the forward
    names a parameter ``index``: keyed by content it is left out, as every call of the
    cache leaves it; keyed by index, the cache refuses a forward taking it, and says so.
    It was refused as a mask left out, with advice that led to the other refusal."""
    items = [
        {"x": b["input_ids"], "index": torch.arange(4) + 4 * i} for i, b in enumerate(tokenized(8))
    ]
    assert prefill(cache_rows(IndexedX()), items, progress=False).computed == 8
    by_index = cache_rows(IndexedX(), tmp_path, key="index", version="ids@1")
    with pytest.raises(RowsError, match="which its forward takes too"):
        prefill(by_index, items, progress=False)


class StackedTokens(PooledTokens):
    """A text encoder handed its ids and their mask as one tensor, taken apart here."""

    def forward(self, both: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(both[:, 0] * both[:, 1])


def test_prefill_s_advice_on_a_mask_works_as_given_keyed_by_index() -> None:
    """Each ``inputs=`` the refusal of a mask advises, taken as written, prefills a cache
    keyed by index with the dict's indices. It advised the batch alone there, which that
    cache refuses (``NeedsIndex``) for want of them."""
    batches = [{**batch, "index": torch.arange(4) + 4 * k} for k, batch in enumerate(tokenized(8))]
    refused = cache_rows(MaskedTokens(), key="index", version="toy@1")
    with pytest.raises(TypeError) as said:
        prefill(refused, batches, progress=False)
    advised = re.findall(r"inputs=(lambda item: .*?)(?=, taken apart|, which)", str(said.value))
    alone, stacked = [eval(advice) for advice in advised]  # the advice as written
    for module, inputs in ((StackedTokens(), stacked), (MaskedTokens(), alone)):
        cached = cache_rows(module, key="index", version="toy@1")
        assert prefill(cached, batches, inputs=inputs, progress=False).computed == 8
        for batch in batches:
            x, index = inputs(batch)
            assert torch.equal(index, batch["index"])
            assert torch.equal(cached(x, index=index), expected(module, x))
        assert cached.stats.computed == 8


@pytest.mark.parametrize("kind", [dict, Encoding])
def test_prefill_refuses_a_dict_whose_tensors_name_two_parameters_of_the_forward(
    kind: Callable[..., Any],
) -> None:
    """Where another tensor of the dict names a parameter of the forward too (a mask), the
    cache would hand the module the ids without it: refused, naming both, saying that
    answers without it differ where batches are padded, and how to keep it."""
    cached = cache_rows(MaskedTokens())
    with pytest.raises(TypeError) as refused:
        prefill(cached, [kind(batch) for batch in tokenized(8)], progress=False)
    said = str(refused.value)
    assert re.search(r"'input_ids'.*'attention_mask'", said)
    assert "input_ids != pad_id" in said and "torch.stack" in said
    # The mask made in the forward, the dict's mask is still there: the inputs= to pass.
    assert re.search(r"input_ids != pad_id.*and pass inputs=lambda item: item\['input_ids'\]", said)
    assert "inputs=lambda item" in said
    assert cached.stats.computed == 0


def test_an_input_that_requires_grad_is_refused(cached: CachedRows) -> None:
    """A batch that requires grad is refused: recalled rows would cut its gradient."""
    with pytest.raises(CachedInputNeedsGrad, match="requires grad"):
        cached(images(2).requires_grad_())


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_an_input_that_requires_grad_is_taken_where_no_gradient_flows(
    store: Store, context: Callable[[], Any]
) -> None:
    """A batch that requires grad, handed over where no gradient is recorded (a teacher run
    under ``torch.no_grad()`` on what a trained module produced), cuts no gradient: it is
    answered as the module answers it there, computed and then recalled."""
    cached = cache_rows(encoder(), store)
    trained = nn.Parameter(torch.ones(()))
    x = images(4) * trained
    with torch.no_grad():
        truth = encoder().eval()(x)
    with context():
        first = cached(x)
        again = cached(x)
    assert not first.requires_grad
    assert torch.allclose(first, truth, atol=1e-6) and torch.equal(again, first)
    assert (cached.stats.computed, cached.stats.recalled) == (4, 4)
    with pytest.raises(CachedInputNeedsGrad, match="requires grad"):
        cached(x)
    cached.close()


@pytest.mark.parametrize("context", [contextlib.nullcontext, torch.no_grad])
def test_an_input_carrying_a_forward_mode_tangent_is_refused(
    store: Store, context: Callable[[], Any]
) -> None:
    """A batch made a dual tensor (``forward_ad.make_dual``) carries its tangent through
    the module, under ``torch.no_grad()`` too, and a recalled row carries none: the jvp
    would be there on misses and silently missing on hits. Refused, computed or not, and
    the same batch without its tangent is answered as ever."""
    cached = cache_rows(encoder(), store)
    x = images(3)
    cached(x)
    for _ in range(2):
        with forward_ad.dual_level(), context():
            dual = forward_ad.make_dual(x, torch.ones_like(x))
            with pytest.raises(CachedInputNeedsGrad, match="forward-mode tangent"):
                cached(dual)
            with pytest.raises(CachedInputNeedsGrad, match="forward-mode tangent"):
                cached(forward_ad.make_dual(images(2) + 5, torch.ones(2, 3, 8, 8)))
    assert torch.equal(cached(x), cached(x))
    cached.close()


@pytest.mark.parametrize("cut", ["requires grad", "forward-mode tangent", "turns gradients on"])
def test_a_batch_a_recalled_row_would_cut_is_handed_to_when_input_needs_grad(
    store: Store, cut: str
) -> None:
    """With ``when_input_needs_grad`` set, a forward handed a batch whose gradient or
    tangent a recalled row would cut — it requires grad, it carries a forward-mode tangent,
    or the module turns gradients on for it under ``torch.no_grad()`` — tells it what is
    cut, and answers with the module itself, the gradient or tangent flowing, where it says
    it put the module back uncached; where it says no, the batch is refused as without it."""
    grads_inside = cut == "turns gradients on"
    torch.manual_seed(0)
    module, x = (_GradsInside(), torch.randn(4, 4)) if grads_inside else (encoder(), images(4))
    cached = cache_rows(module, store)
    call: Callable[[torch.Tensor], torch.Tensor] = cached
    told: list[str] = []

    def put_back(cache: CachedRows, what: str) -> bool:
        assert cache is cached
        told.append(what)
        return len(told) > 1  # no the first time, yes after

    def answer() -> tuple[torch.Tensor, torch.Tensor]:
        """The cache's answer on ``x`` and its derivative along ``x`` (the plain
        module's, with ``cached`` the module itself)."""
        if cut == "forward-mode tangent":
            with forward_ad.dual_level():
                out = call(forward_ad.make_dual(x, torch.ones_like(x)))
                primal, tangent = forward_ad.unpack_dual(out)
            return primal, tangent
        batch = x.clone().requires_grad_()
        with torch.no_grad() if grads_inside else contextlib.nullcontext():
            out = call(batch)
        (derivative,) = torch.autograd.grad(out.sum(), batch)
        return out.detach(), derivative

    cached.when_input_needs_grad = put_back
    with pytest.raises(CachedInputNeedsGrad, match=cut):
        answer()
    got = answer()
    assert [cut in what for what in told] == [True, True]
    assert cached.stats.computed == 0  # nothing kept that would be recalled
    cached.close()
    call = module.eval()
    for value, truth in zip(got, answer(), strict=True):
        assert torch.allclose(value, truth, atol=1e-6)


class _CentredInPlace(nn.Module):
    """Centres its batch in place (as ``Normalize(inplace=True)`` does), then projects it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x.sub_(1.0))
        return out


class _Doubles(_CentredInPlace):
    """Doubles its batch in place (``x.mul_(2)``), then projects it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x.mul_(2))
        return out


def _relu_first() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 3))


WRITE = r"wrote into the rows it was handed, in place.*Nothing of this batch was kept"


@pytest.mark.parametrize("key", ["content", "index"])
@pytest.mark.parametrize(
    "writer", [_Doubles, _relu_first, _CentredInPlace], ids=["mul_", "relu", "centred"]
)
def test_a_module_that_writes_into_its_batch_is_refused_and_keeps_nothing(
    store: Store, key: KeyMode, writer: Callable[[], nn.Module]
) -> None:
    """A module that writes into the batch it is handed (``x.mul_(2)``, an
    ``nn.ReLU(inplace=True)`` first, centring in place) wrote into the caller's batch
    where every row was computed, and not where rows were recalled, so the batch read
    after the call held other values in a second epoch than in the first. It is refused
    (``RowsError``, saying what to do) at every batch, prefilled or not, and nothing is
    kept; under ``torch.inference_mode`` too, whose tensors keep no version counter."""
    cached = cache_rows(writer(), store, key=key, version="x@1" if key == "index" else None)
    x = torch.randn(5, 4)
    index = torch.arange(5) if key == "index" else None
    for _ in range(2):  # again: nothing was kept to be recalled
        with pytest.raises(RowsError, match=rf"{WRITE}.*was written.*x = x.clone\(\)"):
            cached(x.clone(), index=index)
    with torch.inference_mode(), pytest.raises(RowsError, match=WRITE):
        cached(x.clone(), index=index)
    items = DataLoader(TensorDataset(x.clone(), torch.arange(5)), batch_size=5)
    inputs = (lambda item: (item[0], item[1])) if key == "index" else None
    with pytest.raises(RowsError, match=WRITE):
        prefill(cached, items, inputs=inputs, progress=False)
    cached.flush()
    assert cached.tiers[0].rows == 0 and cached.stats.rows_kept == 0
    cached.close()


class _WritesIntoBatchesOf(nn.Module):
    """Projects its batch, doubling it in place first where it holds ``size`` rows: a
    write that batches of other sizes do not show."""

    def __init__(self, size: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.size = size
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) == self.size:
            x.mul_(2)
        out: torch.Tensor = self.linear(x)
        return out


@pytest.mark.parametrize(
    "size", [1, 2], ids=["into a row checked alone", "into rows run beside recalled ones"]
)
def test_a_write_into_a_copy_of_rows_of_the_batch_is_refused(store: Store, size: int) -> None:
    """A module is handed a copy of rows of the batch where it computes some rows and
    recalls others, and where a row is run again alone to see that it answers each row on
    its own: a write into such a copy is refused too, the batch handed to the cache left
    as it was, and none of the rows it wrote into kept."""
    cached = cache_rows(_WritesIntoBatchesOf(size), store)
    x = torch.randn(5, 4)
    batches = [x[:3].clone(), x.clone()]  # three rows (two of them also run alone), then five
    with pytest.raises(RowsError, match=rf"{WRITE}.*is as it was: the module ran on a copy"):
        for batch in batches:
            cached(batch)
    assert torch.equal(batch, x[: len(batch)])
    cached.flush()
    assert cached.stats.rows_kept == (0 if size == 1 else 3)
    cached.close()


def test_a_batch_that_requires_grad_is_refused_for_a_module_that_writes_into_it(
    store: Store,
) -> None:
    """A batch that requires grad, taken under ``torch.no_grad()``, has a copy of its first
    row run once to see that the module records no gradient: a module that writes into
    its input is refused there, the batch left as it was handed, and nothing kept."""
    cached = cache_rows(_CentredInPlace(), store)
    trained = nn.Parameter(torch.ones(()))
    data = torch.randn(3, 4)
    x = data * trained
    with torch.no_grad(), pytest.raises(RowsError, match=rf"{WRITE}.*is as it was"):
        cached(x)
    assert torch.equal(x.detach(), data)
    cached.flush()
    assert cached.tiers[0].rows == 0 and cached.stats.rows_kept == 0
    cached.close()


def test_rows_loaded_from_a_deferred_dataset_are_not_written_into() -> None:
    """Keyed by index, a batch from ``Deferred`` is loaded for the module: a module that
    writes into what it is handed is refused there too, the dataset left as it was."""
    data = torch.randn(8, 4)
    held = data.clone()
    cached = cache_rows(_Doubles(), key="index")
    (rows,) = DataLoader(Deferred(data, version="toy@1"), batch_size=8)
    with pytest.raises(RowsError, match=rf"{WRITE}.*is as it was"):
        cached(rows)
    assert torch.equal(data, held)
    assert cached.tiers[0].rows == 0


class _GradsInside(nn.Module):
    """A module that turns gradients back on inside its forward (as one answering with a
    gradient of its input does)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            out: torch.Tensor = self.linear(x) * 2
        return out


def test_an_input_that_requires_grad_is_refused_where_the_module_records_a_gradient_itself(
    store: Store,
) -> None:
    """Under ``torch.no_grad()``, a module that turns gradients back on in its forward still
    answers a batch that requires grad with that batch's gradient, and a recalled row would
    carry none: such a batch is refused, whether its rows would be recalled or computed."""
    torch.manual_seed(0)
    module = _GradsInside()
    cached = cache_rows(module, store)
    trained = nn.Parameter(torch.ones(()))
    seen = torch.randn(4, 4)
    hits, misses = seen * trained, torch.randn(4, 4) * trained
    with torch.no_grad():
        assert module(hits).requires_grad  # what the frozen module itself answers
        cached(seen)  # computed from a batch that requires none, and kept
        with pytest.raises(CachedInputNeedsGrad, match="turns gradients on"):
            cached(hits)
        with pytest.raises(CachedInputNeedsGrad, match="turns gradients on"):
            cached(misses)
    assert cached.stats.computed == 4
    with torch.no_grad(), pytest.raises(CachedInputNeedsGrad, match="turns gradients on"):
        cached(nn.Parameter(torch.randn(4, 4)))  # a trainable parameter handed on
    cached.close()


class _HeldTrainable(nn.Module):
    """Holds a tensor that requires grad and is none of its parameters (so freezing them
    leaves it trainable), and turns gradients on to answer through it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.scale = torch.randn(4, 3, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            return x @ self.scale


def test_an_answer_that_records_a_gradient_is_refused_and_kept_nowhere() -> None:
    """A module whose answer requires grad, though its batch does not (a tensor it holds
    and trains, not among its frozen parameters), is refused: a recalled row is a leaf, so
    that tensor would train on misses and stop on hits, and a row kept in memory would
    carry the graph of the batch it was computed in."""
    module = _HeldTrainable()
    cached = cache_rows(module)
    with pytest.raises(RowsError, match=r"`_HeldTrainable` answered rows that require grad"):
        cached(torch.randn(5, 4))
    assert cached.tiers[0].rows == 0 and cached.stats.rows == 0


class _Samples(IterableDataset):  # type: ignore[type-arg]
    """A stream of samples of 8 features each, as a shard reader yields them."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield from torch.randn(3, 8)


def test_samples_handed_one_at_a_time_are_refused_saying_to_batch_them() -> None:
    """A loader of `batch_size=None` hands the cache one sample, whose features it takes
    for rows of one value each: refused saying so and how to batch the samples, where it
    said only to cache the module per batch."""
    cached = cache_rows(nn.Linear(8, 4))
    sample = next(iter(DataLoader(_Samples(), batch_size=None)))
    with pytest.raises(
        NotRowwise, match=r"8 rows of one value each.*batch_size=None.*batch_size=64"
    ):
        cached(sample)
    assert cached(sample.unsqueeze(0)).shape == (1, 4)


def test_an_output_that_is_not_one_row_per_input_row_is_refused(store: Store) -> None:
    """A module that does not answer row by row is refused with what it returned, and one
    whose rows a store cannot keep (quantized, sparse) when it runs, not when a write
    fails later."""
    summed = cache_rows(nn.Sequential(nn.Flatten(0)))
    with pytest.raises(NotRowwise, match="one row per input row"):
        summed(images(2))
    quantized_rows = cache_rows(Quantized(), store)
    with pytest.raises(RowsError, match="qint8, which a store cannot keep"):
        quantized_rows(torch.randn(2, 3))
    assert quantized_rows.tiers[0].rows == 0
    quantized_rows.close()
    kept = cache_rows(AsDtype(torch.complex128), store)  # a dtype a store keeps
    assert kept(torch.randn(2, 3)).dtype == torch.complex128
    with pytest.raises(NotRowwise, match="to_dense"):
        cache_rows(Sparse())(torch.randn(2, 3))


@pytest.mark.parametrize("dtype", [torch.qint8, torch.uint4])
def test_rows_of_a_dtype_no_tier_holds_are_refused_without_a_store(dtype: torch.dtype) -> None:
    """A module answering rows no memory tier can hold (quantized, sub-byte) is refused
    with what to do on a cache without a store too, as on one with a store, rather than
    failing inside torch as its rows are copied into a tier; nothing is kept."""
    cached = cache_rows(Quantized() if dtype == torch.qint8 else AsBytesOf(dtype))
    with pytest.raises(RowsError, match=rf"rows of {dtype}, which a store cannot keep, nor"):
        cached(torch.randn(2, 4))
    assert cached.tiers[0].rows == 0 and cached.stats.rows == 0


class Dequantizing(_CentredInPlace):
    """Projects a quantized batch (inputs kept quantized to take less memory)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x.dequantize())
        return out


def _quantized_rows_by_index() -> list[bool]:
    """In a child: a quantized batch, keyed by index, answered by a cache as by its module,
    computed, recalled, and with an index repeated; the repeat of a row of other values
    under one index refused."""
    module = Dequantizing()
    cached = cache_rows(module, key="index", version="quantized@1")
    x = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
    twice = torch.tensor([0, 1, 0])
    with torch.no_grad():
        answers = [module(x), module(x), module(x[twice])]
    got = [
        cached(x, index=torch.arange(4)),
        cached(x, index=torch.arange(4)),
        cached(x[twice], index=twice),
    ]
    same = [torch.equal(a, b) for a, b in zip(got, answers, strict=True)]
    try:
        cached(x[[0, 1, 2]], index=twice)
    except NeedsIndex:
        same.append(True)
    return [*same, cached.stats.computed == 4]


def test_a_quantized_batch_keyed_by_index_is_answered_not_a_crash() -> None:
    """A quantized batch, keyed by index (which reads no input to key it), runs through
    the module as without the cache: the checks that look at its rows' bytes (copies of
    one row, one index naming two inputs) read its values, never bytes torch views it as
    that crash the process when read."""
    assert in_forked_child(_quantized_rows_by_index) == [True] * 5


def test_rows_cached_inside_vmap_are_refused_saying_so(store: Store) -> None:
    """`torch.func.vmap` hands a row cache a batched tensor of its own, with no memory to
    key its rows by: refused, saying what to do, and the batch outside it is cached."""
    torch.manual_seed(0)
    cached = cache_rows(nn.Linear(3, 3), store)
    x = torch.randn(4, 2, 3)
    with pytest.raises(TypeError, match=r"inside a `torch\.func` transform.*outside the transform"):
        torch.func.vmap(cached)(x)
    with torch.no_grad():
        assert torch.equal(cached(x[0]), cached(x[0]))


@pytest.mark.parametrize("key", ["content", "index"])
@pytest.mark.parametrize("transformed", ["a batch made outside", "its weights"])
def test_rows_cached_inside_grad_are_refused_saying_so(
    store: Store, key: str, transformed: str
) -> None:
    """Inside `torch.func.grad` a batch made outside the transform is made its own as soon as
    it is read, and `functional_call` hands the module weights of its own: either call is
    refused, saying what to do, as a call handed the transform's batch is (it failed with
    torch's own RuntimeError: no data pointer to name a row by, or `requires_grad_` on
    weights of the transform's)."""
    torch.manual_seed(0)
    module = nn.Linear(3, 3)
    options: dict[str, Any] = {} if key == "content" else {"key": "index", "version": "v1"}
    cached = cache_rows(module, store, **options)
    head = nn.Linear(3, 1)
    x = torch.randn(4, 3)
    more = {} if key == "content" else {"index": torch.arange(4)}
    cached(x, **more)
    if transformed == "its weights":
        weights = {name: p.detach().clone() for name, p in module.named_parameters()}

        def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(cached, p, (x,), more).sum()
    else:
        weights = {name: p.detach().clone() for name, p in head.named_parameters()}

        def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(head, p, (cached(x, **more),)).sum()

    with pytest.raises(TypeError, match=r"inside a `torch\.func` transform.*outside the transform"):
        torch.func.grad(loss)(weights)
    with torch.no_grad():
        assert torch.equal(cached(x, **more), module(x))
    cached.close()


@pytest.mark.parametrize(
    "recorded",
    ["jit.trace", "export", "strict export", "export of the cache"],
    ids=["torch.jit.trace", "torch.export", "strict torch.export", "torch.export of the cache"],
)
@pytest.mark.parametrize("key", ["content", "index"])
def test_rows_traced_by_torch_jit_trace_or_export_are_refused(
    store: Store, key: str, recorded: str
) -> None:
    """`torch.jit.trace` or `torch.export.export` of a row cache (or a model holding one)
    keeps what a call runs as the code of every later call, and a recalled row runs nothing:
    the trace answered any batch with the rows recalled for the traced one (content-keyed,
    a batch of token ids), or with the memory they were put in (keyed by index); the export
    failed with torch's own "Non-recursive torch.compiler.disable is not supported with
    torch.export". Each is refused, saying to trace (or export) the module itself, a strict
    export too (torch's compiler, which traces it, reports the refusal it met); the cache
    answers as before."""
    torch.manual_seed(0)
    module = nn.Embedding(10, 3)
    options: dict[str, Any] = {} if key == "content" else {"key": "index", "version": "v1"}
    cached = cache_rows(module, store, **options)

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cached = cached

        def forward(self, ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            more = {} if key == "content" else {"index": index}
            out: torch.Tensor = self.cached(ids, **more)
            return out

    ids, index = torch.tensor([1, 2, 3]), torch.arange(3)
    holder = Holder()
    holder(ids, index)
    if recorded == "jit.trace":
        with pytest.raises(
            TypeError,
            match=r"`torch\.jit\.trace` traces it.*Trace the module itself \(`cached\.module`\)",
        ):
            torch.jit.trace(holder, (ids, index), check_trace=False)
    else:
        exported: nn.Module = cached if recorded == "export of the cache" else holder
        arguments = (ids, index) if exported is holder else (ids,)
        kwargs = {"index": index} if key == "index" and exported is cached else {}
        strict = recorded == "strict export"
        with pytest.raises(
            (TypeError, RuntimeError) if strict else TypeError,
            match=r"`torch\.export\.export` traces it.*Export the module itself \(`cached\.module`",
        ):
            torch.export.export(exported, arguments, kwargs, strict=strict)
    with torch.no_grad():
        assert torch.equal(holder(ids, index), module(ids))
        assert torch.equal(holder(ids + 4, index + 3), module(ids + 4))
    cached.close()


class AsDtype(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_rows_are_checked_kept_and_recalled(store: Store, dtype: torch.dtype) -> None:
    """Rows of a float8 dtype (which torch cannot test for finiteness) are compared in a
    wider one by the check that each row is answered alone: kept and recalled as they
    are, and a module mixing its rows is still refused."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 4), AsDtype(dtype))
    cached = cache_rows(module, store)
    x = torch.randn(5, 8)
    out = cached(x)
    assert out.dtype == dtype and torch.equal(out.float(), expected(module, x).float())
    assert torch.equal(cached(x).float(), out.float()) and cached.stats.recalled == 5
    cached.close()
    with pytest.raises(NotRowwise, match="last of 5 rows, run again on its own"):
        cache_rows(nn.Sequential(CumulativeSum(), AsDtype(dtype)))(x)


class Conjugated(nn.Module):
    """Answers the conjugate of each row's spectrum: a conjugate view, as `.conj()` makes
    one, whose bytes are the spectrum's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x).conj()


def test_rows_answered_as_a_conjugate_view_are_checked_kept_and_recalled(store: Store) -> None:
    """Complex rows a module answers as a lazy conjugate (`.conj()`) are compared by the
    check that each row is answered alone as the values they stand for, then kept and
    recalled as those values, by a fresh cache over the store too; a module mixing its
    rows is still refused."""
    x = torch.randn(5, 8)
    cached = cache_rows(Conjugated(), store)
    out = cached(x)
    assert torch.equal(out, expected(Conjugated(), x))
    cached.close()
    fresh = cache_rows(Conjugated(), store)
    assert torch.equal(fresh(x), out) and fresh.stats.recalled == 5
    mixing = nn.Sequential(CumulativeSum(), Conjugated())
    with pytest.raises(NotRowwise, match="last of 5 rows, run again on its own"):
        cache_rows(mixing)(x)


class Magnitudes(nn.Module):
    """Answers each value's magnitude, times 100, in a given dtype (an unsigned one too)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.abs() * 100).to(self.dtype)


def rows_as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The rows of ``t`` as their bytes, one row of ``uint8`` each: rows a test picks by
    index, as torch 2.4 indexes no float8 tensor nor an unsigned one past uint8."""
    return t.view(torch.uint8).reshape(len(t), -1)


@pytest.mark.parametrize(
    "dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]
)
def test_a_batch_part_recalled_part_computed_of_any_kept_dtype_is_put_together(
    store: Store, dtype: torch.dtype
) -> None:
    """Rows of a dtype the store keeps but torch copies into place by index for no CPU
    batch (float8, the unsigned ones past uint8) are put together like any others when a
    batch is part recalled, part computed."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 4), Magnitudes(dtype))
    cached = cache_rows(module, store)
    x = torch.randn(6, 8)
    first = cached(x[:4])
    out = cached(x[[5, 2, 4, 3, 0]])
    assert out.dtype == dtype
    truth = rows_as_bytes(torch.cat([first, cached(x[4:])]))[[5, 2, 4, 3, 0]]
    assert torch.equal(rows_as_bytes(out), truth)
    assert torch.equal(out.double(), expected(module, x[[5, 2, 4, 3, 0]]).double())
    cached.close()


class Spectrum(nn.Module):
    """Answers the conjugate of each row's spectrum, or its imaginary part, as torch hands
    them: a view with the conjugate (or negative) bit set, not its values in memory."""

    def __init__(self, part: str) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.part = part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.fft(self.linear(x)).conj()
        return spectrum.imag if self.part == "imag" else spectrum


@pytest.mark.parametrize("part", ["conj", "imag"])
def test_a_batch_part_recalled_part_computed_of_conjugate_views_is_put_together(
    store: Store, part: str
) -> None:
    """Rows a module answers as a conjugate view (``x.conj()``) or a negative one (its
    ``.imag``) are put together with rows recalled as their values, not refused by torch
    (which views no such tensor as bits of another dtype)."""
    torch.manual_seed(0)
    module = Spectrum(part)
    cached = cache_rows(module, store)
    x = torch.randn(6, 8)
    first = cached(x[:4])
    out = cached(x[[5, 2, 4, 3, 0]])
    truth = torch.cat([first, cached(x[4:])])[[5, 2, 4, 3, 0]]
    assert out.dtype == truth.dtype
    assert torch.equal(out, truth)
    cached.close()


class Quantized(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)


class AsBytesOf(nn.Module):
    """Answers each row as bytes viewed as ``dtype`` (a packed one, ``torch.uint4``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).to(torch.uint8).view(self.dtype)


class Boxes(torch.Tensor):
    """A tensor subclass, as torchvision's ``tv_tensors.BoundingBoxes`` is one."""


class AsBoxes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).as_subclass(Boxes)


def test_rows_of_a_tensor_subclass_are_refused(store: Store) -> None:
    """A module answering a tensor subclass is refused when it runs: its rows, kept and
    gathered as plain tensors, would come back without their class."""
    boxes = cache_rows(AsBoxes(), store)
    with pytest.raises(NotRowwise, match=r"returned a `Boxes`.*as_subclass\(torch\.Tensor\)"):
        boxes(torch.randn(2, 4))
    assert boxes.tiers[0].rows == 0
    boxes.close()


class Mask(torch.Tensor):
    """A tensor subclass a module may answer otherwise than a plain tensor of its values
    (torchvision's ``tv_tensors.Mask`` beside an ``Image``)."""


def test_a_batch_of_a_tensor_subclass_is_refused(store: Store) -> None:
    """A row is keyed by its content, not its class: a subclass is refused before anything
    is looked up or run, saying how to hand it on as a plain tensor; a frozen parameter
    handed on is keyed and run as its values."""
    cached = cache_rows(nn.Linear(4, 2), store)
    data = torch.randn(3, 4)
    with pytest.raises(NotRowwise, match=r"handed a `Mask`.*as_subclass\(torch\.Tensor\)"):
        cached(data.as_subclass(Mask))
    assert cached.stats.batches == 0 and cached.tiers[0].rows == 0
    answer = cached(nn.Parameter(data, requires_grad=False))
    assert type(answer) is torch.Tensor
    torch.testing.assert_close(answer, expected(cached.module, data))
    cached(data)
    assert cached.stats.recalled == 3
    cached.close()


class IntoItsBuffer(nn.Module):
    """Writes its answer into a buffer it keeps and answers with a view of it, as a
    module captured in a CUDA graph or one with a preallocated output does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        # Held in an object of a class written in C, as a CUDA graph holds its output:
        # not a setting (one written at every call would key the next anew).
        self.graph = collections.deque([torch.zeros(64, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer: torch.Tensor = self.graph[0]
        answer[: x.shape[0]] = self.lin(x)
        return answer[: x.shape[0]]


def test_a_module_answering_into_its_own_buffer_keeps_each_rows_answer(
    store: Store,
) -> None:
    """The check that runs rows again alone writes into the buffer the batch's answer is a
    view of: what is returned, kept in memory and written to the store is each row's own
    answer all the same."""
    module = IntoItsBuffer()
    x = torch.randn(5, 4)
    with torch.no_grad():
        truth = module.lin(x)
    cached = cache_rows(module, store)
    torch.testing.assert_close(cached(x), truth)
    cached.flush()
    torch.testing.assert_close(cached(x), truth)  # from memory
    assert cached.stats.from_device == 5
    again = IntoItsBuffer()
    fresh = cache_rows(again, store)
    torch.testing.assert_close(fresh(x).clone(), truth)
    assert fresh.stats.from_store == 5
    cached.close()
    fresh.close()


_MIDWAY: list[Callable[[], Any]] = []
"""What :class:`Midway` runs inside its next forwards, one each: what another thread may
do meanwhile."""


class Midway(nn.Module):
    """A linear layer whose forward runs the first of ``_MIDWAY`` before it answers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _MIDWAY:
            _MIDWAY.pop(0)()
        out: torch.Tensor = self.lin(x)
        return out


def test_rows_computed_while_the_weights_change_are_answered_and_not_kept(
    tmp_path: Path,
) -> None:
    """Weights changed while rows are computed (another thread loading a checkpoint into
    a module a server calls) are the weights those rows were computed with, not the ones
    they were keyed under: they are answered, and kept nowhere, or they would be recalled
    as the old weights' once those are loaded back."""
    module = Midway()
    cached = cache_rows(module, Store(tmp_path / "store"))
    cached(torch.randn(2, 4))  # keyed and checked
    weights = module.lin.weight.detach().clone()
    x = torch.randn(4, 4)
    _MIDWAY.append(lambda: module.lin.weight.detach().mul_(2))
    assert torch.equal(cached(x), expected(module, x))  # as the weights answer now
    module.lin.weight.detach().copy_(weights)  # back to the weights the rows were keyed under
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 2 + 4 + 4
    cached.close()
    fresh = cache_rows(module, Store(tmp_path / "store"))
    assert torch.equal(fresh(x), expected(module, x))
    fresh.close()


class Gained(Midway):
    """A :class:`Midway` whose answer is scaled by what a method of its class says."""

    def gain(self) -> float:
        return 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.gain()


def test_rows_computed_while_the_code_changes_are_answered_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method set on the module's class while its rows are computed (another thread
    patching it for a while) answers those rows, which are the new code's, not that of the
    code they were keyed under: they are answered and kept nowhere, or they would be
    recalled, from memory and the store, as the old code's once it is set back."""
    module = Gained()
    cached = cache_rows(module, Store(tmp_path / "store"))
    cached(torch.randn(2, 4))  # keyed and checked
    x = torch.randn(4, 4)
    _MIDWAY.append(lambda: monkeypatch.setattr(Gained, "gain", lambda self: 2.0))
    assert torch.equal(cached(x), expected(module, x))  # as the code answers now
    monkeypatch.undo()  # the method set back
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 2 + 4 + 4
    cached.close()
    fresh = cache_rows(module, Store(tmp_path / "store"))
    assert torch.equal(fresh(x), expected(module, x))
    fresh.close()


class Rescaled(Midway):
    """A :class:`Midway` whose answer is scaled by a value it keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale


def test_rows_computed_as_a_value_changes_that_another_thread_keys_are_not_kept(
    tmp_path: Path,
) -> None:
    """A value given to the module while its rows are computed (another thread setting
    `encoder.scale`), and a forward on a third thread keying rows by it before the first
    ends, leave the first forward's rows, computed with the new value, answered and kept
    nowhere: they were compared with the module as that third forward found it, not as
    their own keys named it, and kept under the keys of the value before, to be recalled,
    from memory and the store, once it was set back."""
    module = Rescaled()
    cached = cache_rows(module, Store(tmp_path / "store"))
    cached(torch.randn(2, 4))  # keyed and checked
    y = torch.randn(3, 4)

    def rescaled() -> None:
        module.scale = 2.0
        other = threading.Thread(target=cached, args=(y,))
        other.start()
        other.join()

    x = torch.randn(4, 4)
    _MIDWAY.append(rescaled)
    assert torch.equal(cached(x), expected(module, x))  # as the module answers now
    module.scale = 1.0  # set back to the value the rows were keyed by
    _ran_again_and_kept_nowhere(cached, module, x, tmp_path / "store")


def _ran_again_and_kept_nowhere(cached: CachedRows, module: nn.Module, x: Any, at: Path) -> None:
    """``x``, answered in the middle while the module was not what its rows were keyed by
    and now as it was, runs again (2 + 3 + 4 rows before, 4 now) and is answered as the
    module answers, as it is by a fresh cache on the store: nothing of the middle was kept."""
    assert torch.equal(cached(x), expected(module, x))
    assert cached.stats.computed == 2 + 3 + 4 + 4
    cached.close()
    fresh = cache_rows(module, Store(at))
    assert torch.equal(fresh(x), expected(module, x))
    fresh.close()


def test_rows_keyed_before_another_thread_keys_new_weights_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward whose rows were keyed under the weights before, when another thread loads
    a checkpoint and runs a forward that keys rows under it before the first goes on, runs
    its rows with the new weights: they are answered and kept nowhere, or they would be
    recalled, from memory and the store, as the old weights' once those are loaded
    back."""
    module = Midway()
    cached = cache_rows(module, Store(tmp_path / "store"))
    cached(torch.randn(2, 4))  # keyed and checked
    weights = module.lin.weight.detach().clone()
    keying = _row_lookup._keying
    meanwhile: list[Callable[[], Any]] = []

    def keyed_then_meanwhile(cache: CachedRows, x: Any) -> Any:
        keyed = keying(cache, x)
        if meanwhile:
            meanwhile.pop()()
        return keyed

    def reloaded() -> None:
        module.lin.weight.detach().mul_(2)  # a checkpoint loaded
        other = threading.Thread(target=cached, args=(torch.randn(3, 4),))
        other.start()
        other.join()

    monkeypatch.setattr(_row_lookup, "_keying", keyed_then_meanwhile)
    x = torch.randn(4, 4)
    meanwhile.append(reloaded)
    assert torch.equal(cached(x), expected(module, x))  # as the weights answer now
    module.lin.weight.detach().copy_(weights)  # back to the weights the rows were keyed under
    _ran_again_and_kept_nowhere(cached, module, x, tmp_path / "store")


def test_weights_changed_while_rows_are_run_again_alone_refuse_nothing() -> None:
    """A module whose weights change between its batch's run and the run of a row alone
    (another thread loading a checkpoint) answers that row otherwise for that reason
    alone: it is not refused as mixing its rows, the batch is answered as it ran and kept
    nowhere, and it is looked at again at the next rows computed."""
    module = Midway()
    cached = cache_rows(module)
    x = torch.randn(4, 4)
    truth = expected(module, x)
    weights = module.lin.weight.detach().clone()
    _MIDWAY.extend([lambda: None, lambda: module.lin.weight.detach().mul_(2)])
    assert torch.equal(cached(x), truth)  # as the batch ran, before the change
    assert cached.tiers[0].rows == 0
    module.lin.weight.detach().copy_(weights)
    assert torch.equal(cached(x), truth)
    assert cached.stats.computed == 8 and cached.tiers[0].rows == 4


def test_rows_keyed_on_two_threads_while_one_keys_anew_are_keyed_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One thread looking its keyings over again (its weights written) while another makes
    a keying (rows of another shape) raised `dictionary changed size during iteration`
    on the first, and both wrote the declaration they derive a key prefix from: keyings
    are looked at and made by one thread at a time."""
    module = nn.Linear(4, 2)
    cached = cache_rows(module)
    x, wide = torch.randn(3, 4), torch.randn(3, 2, 4)
    cached(x)
    inside, release = threading.Event(), threading.Event()
    prefix = _row_keys._prefix

    def paused(self: CachedRows, tag: Any) -> bytes:
        if threading.current_thread() is first and not inside.is_set():
            inside.set()
            release.wait(10)
        return prefix(self, tag)

    monkeypatch.setattr(_row_keys, "_prefix", paused)
    answers: dict[str, torch.Tensor] = {}
    failed: list[BaseException] = []

    def run(name: str, rows: torch.Tensor) -> None:
        try:
            answers[name] = cached(rows)
        except BaseException as error:
            failed.append(error)

    module.weight.detach().mul_(1)  # the same weights, changed in place: looked over again
    first = threading.Thread(target=run, args=("x", x))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=run, args=("wide", wide))
    second.start()
    second.join(1)  # keyed meanwhile, unless it waits for the first
    release.set()
    first.join()
    second.join()
    assert not failed
    assert torch.equal(answers["x"], expected(module, x))
    assert torch.equal(answers["wide"], expected(module, wide))


def _midway_handed_back() -> tuple[Midway, CachedRows]:
    """A :class:`Midway` and its row cache, which answered a batch and was handed back:
    the module its model's again, in train mode, trained."""
    module = Midway()
    cached = cache_rows(module)
    cached(torch.randn(2, 4))
    cached.hand_back()
    release(module)
    module.train().requires_grad_(True)
    return module, cached


def test_freeze_again_while_a_handed_back_call_runs_leaves_the_module_frozen() -> None:
    """``freeze_again`` asked from another thread while a call of the cache handed back
    runs (a stage beginning while a pool still embeds a dataset) freezes the module once
    the call has put it back as its model had it: the call, ending after, left it as it
    found it, training and requiring grad, with the cache no longer holding it for each
    call, so the next call refused it as unfrozen and an optimizer went on moving it."""
    module, cached = _midway_handed_back()
    frozen = threading.Thread(target=cached.freeze_again)
    _MIDWAY.append(lambda: (frozen.start(), frozen.join(1)))  # waits, unless it is held
    x = torch.randn(3, 4)
    out = cached(x)
    frozen.join(10)
    assert is_held(module) and not any(part.training for part in module.modules())
    assert not any(p.requires_grad for p in module.parameters())
    assert torch.equal(cached(x), out)
    assert torch.equal(out, expected(module, x))


def test_freeze_again_inside_a_handed_back_call_freezes_the_module_as_the_call_ends() -> None:
    """``freeze_again`` asked inside a call of the cache handed back, on the thread making
    it (by code its module's forward runs), freezes the module once the call has put it
    back as its model had it: the call, ending after, left it training and requiring grad,
    so the next call refused it as unfrozen."""
    module, cached = _midway_handed_back()
    _MIDWAY.append(cached.freeze_again)
    x = torch.randn(3, 4)
    out = cached(x)
    assert is_held(module) and not any(part.training for part in module.modules())
    assert not any(p.requires_grad for p in module.parameters())
    assert torch.equal(cached(x), out)
    assert torch.equal(out, expected(module, x))


def test_a_cache_handed_back_called_on_two_threads_leaves_its_module_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row cache whose module was handed back to its model (as ``CacheFrozen`` does when
    a stage ends), called on two threads at once (a pool embedding a dataset), answers as
    the module frozen in eval and leaves it as its model has it: the second call found it
    held frozen by the first and, ending last, put it back so — in eval, its parameters
    requiring no grad, though the model trains it. Such calls hold it one at a time."""
    module = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))
    cached = cache_rows(module)
    cached.hand_back()
    release(module)  # its model's again, in train mode, trained
    module.requires_grad_(True)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    first_in, second_in = threading.Event(), threading.Event()
    plain = nn.Linear.forward

    @functools.wraps(plain)
    def forward(self: nn.Linear, rows: torch.Tensor) -> Any:
        if threading.current_thread() is first and not first_in.is_set():
            first_in.set()
            second_in.wait(1)  # the second call runs meanwhile, unless it waits for this one
        elif threading.current_thread() is second and not second_in.is_set():
            second_in.set()
            first.join(10)  # the first call ends while this one runs
        return plain(self, rows)

    monkeypatch.setattr(nn.Linear, "forward", forward)
    answers: dict[str, torch.Tensor] = {}
    failed: list[BaseException] = []

    def run(name: str, rows: torch.Tensor) -> None:
        try:
            answers[name] = cached(rows)
        except BaseException as error:
            failed.append(error)

    first = threading.Thread(target=run, args=("x", x))
    second = threading.Thread(target=run, args=("y", y))
    first.start()
    assert first_in.wait(10)
    second.start()
    first.join()
    second.join()
    monkeypatch.undo()
    assert not failed
    assert not is_held(module) and all(part.training for part in module.modules())
    assert all(p.requires_grad for p in module.parameters())
    assert torch.equal(answers["x"], expected(module, x))
    assert torch.equal(answers["y"], expected(module, y))


class Sparse(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_sparse()


def test_index_keys_take_inputs_of_any_dtype() -> None:
    """Rows keyed by index are never digested, so their inputs may be of a dtype no digest
    takes (complex128)."""
    cached = cache_rows(AsDtype(torch.complex128), key="index", version="c@1")
    x = torch.randn(3, 2, dtype=torch.complex128)
    assert torch.equal(cached(x, index=torch.arange(3)), x)
    assert torch.equal(cached(x * 2, index=torch.arange(3)), x)  # recalled by index


def test_the_frozen_module_stays_in_eval_and_keeps_its_state_dict_keys(
    cached: CachedRows,
) -> None:
    """Training mode on the wrapper leaves the encoder in eval, and its state_dict keys are
    the encoder's, so a checkpoint loads into the unwrapped module."""
    cached.train()
    module = cached.module
    assert is_held(module)
    assert not any(part.training for part in module.modules())
    assert list(cached.state_dict()) == list(module.state_dict())
    fresh = encoder(seed=2)
    fresh.load_state_dict(cached.state_dict())
    assert not any(p.requires_grad for p in cached.parameters())


class Described(Gain):
    """Says what it answers (a plain value) and has a method beside its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.out_dim = 3

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


def test_what_the_module_holds_beside_its_call_is_the_modules(store: Store) -> None:
    """A value or a method of the module is read through the cache as from the module (a
    method runs it uncached); a value of the module written through the cache is written
    to the module, where its forward reads it."""
    module = Described()
    cached = cache_rows(module, store)
    x = torch.randn(4, 6)
    assert cached.out_dim == 3
    assert torch.equal(cached.features(x), expected(module, x))
    assert cached.stats.rows == 0  # only the call is cached
    assert torch.equal(cached(x), expected(module, x))
    cached.gain = 2.0
    assert module.gain == 2.0 and "gain" not in cached.__dict__
    assert cached.redeclare()
    assert torch.equal(cached(x), expected(module, x))
    with pytest.raises(AttributeError, match="no attribute 'width'"):
        cached.width  # noqa: B018
    assert not isinstance(cached, Iterable) and bool(cached)  # not a container
    cached.close()


class Defaulted(OnALinear):
    """A module whose gain and temperature are defaults its class holds, the temperature
    a property that keeps what it is set to."""

    gain = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    @property
    def temperature(self) -> float:
        return self.scale

    @temperature.setter
    def temperature(self, value: float) -> None:
        self.scale = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.gain / self.temperature
        return out


def test_a_class_default_written_or_deleted_through_the_cache_is_the_modules(
    store: Store,
) -> None:
    """A value the module's class holds as a default (``gain = 1.0`` in its body), or a
    property it sets, written through the cache is written to the module, where its
    forward reads it: the next answers follow it, and reading it back through the cache
    shows what the module uses. Deleted through the cache, it is deleted from the
    module."""
    module = Defaulted()
    cached = cache_rows(module, store)
    x = torch.randn(4, 6)
    first = cached(x)
    cached.gain = 3.0
    assert module.gain == 3.0 and "gain" not in cached.__dict__
    assert torch.allclose(cached(x), first * 3)
    cached.temperature = 2.0
    assert module.scale == 2.0 and "temperature" not in cached.__dict__
    assert torch.allclose(cached(x), first * 1.5)
    assert torch.equal(cached(x), expected(module, x))
    del cached.gain  # deleted from the module: its class's default again
    assert "gain" not in module.__dict__ and module.gain == 1.0
    assert torch.allclose(cached(x), first / 2)
    cached.close()


class Slotted(OnALinear):
    """A module that keeps its gain in a slot its class declares."""

    __slots__ = ("gain",)

    def __init__(self) -> None:
        super().__init__()
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.gain
        return out


def test_a_value_the_module_keeps_in_a_slot_keys_its_rows(store: Store) -> None:
    """A value kept in a slot of the module's class (``__slots__``), written through the
    cache or on the module itself, keys the rows of the next call anew: what was kept
    for the old value is not recalled for the new."""
    module = Slotted()
    cached = cache_rows(module, store)
    x = torch.randn(4, 6)
    first = cached(x)
    cached.gain = 3.0
    assert module.gain == 3.0
    assert torch.allclose(cached(x), first * 3)
    module.gain = 2.0
    assert torch.allclose(cached(x), first * 2)
    cached.close()


def test_a_cached_container_indexes_and_iterates_as_the_module(store: Store) -> None:
    """A cached ``nn.Sequential`` indexes, slices, iterates and has a length as the module
    does; what it hands out are the module's own parts, uncached."""
    module = encoder()
    cached = cache_rows(module, store)
    assert len(cached) == len(module) == 5
    assert list(cached) == list(module) and cached[0] is module[0] and module[1] in cached
    head = cached[:-1]
    assert type(head) is nn.Sequential and list(head) == list(module)[:-1]
    x = images(4)
    assert torch.equal(head(x).flatten(1), expected(module, x))
    assert cached.stats.rows == 0
    assert isinstance(cached, CachedRows)
    cached.close()


def test_a_row_twice_in_one_batch_runs_once(
    store: Store, count_rows: Callable[[nn.Module], Tally]
) -> None:
    """Two equal rows in one batch run once, both get the answer, and it is kept once."""
    module = encoder()
    cached = cache_rows(module, store)
    cached(images(2, seed=9))  # the last of the first rows runs once more, alone: a check
    counter = count_rows(module)
    x = images(6)
    batch = torch.cat([x, x[:2]])
    out = cached(batch)
    assert counter.rows == 6
    assert torch.equal(out[6:], out[:2])
    assert cached.tiers[0].rows == 2 + 6
    cached.flush()
    assert cached.stats.rows_kept == 2 + 6
    cached.close()


@pytest.mark.parametrize("key", ["content", "index"])
def test_a_batch_of_one_row_many_times_is_checked_row_by_row(store: Store, key: KeyMode) -> None:
    """A batch whose rows to run are all one row (a sample drawn again and again, a batch
    padded by repeating it) is run whole until the module is known to answer each row
    alone: a module whose answer for a row depends on the rest of its batch is refused
    there, nothing kept, rather than handed the answer for a batch of that one row; a
    module that answers each row alone answers each copy as uncached."""
    version = "rows@1" if key == "index" else None
    row = torch.randn(1, 3).repeat(4, 1)
    index = torch.zeros(4, dtype=torch.long)
    mixing = cache_rows(CumulativeSum(), store, key=key, version=version)
    with pytest.raises(NotRowwise, match="last of 4 rows, run again on its own"):
        mixing(row, **({"index": index} if key == "index" else {}))
    assert mixing.tiers[0].rows == 0
    mixing.flush()
    assert mixing.stats.rows_kept == 0
    mixing.close()
    module = encoder()
    alone = cache_rows(module, store, key=key, version=version)
    x = images(1).repeat(3, 1, 1, 1)
    index = torch.zeros(3, dtype=torch.long)
    out = alone(x, **({"index": index} if key == "index" else {}))
    assert torch.allclose(out, expected(module, x), rtol=0, atol=1e-6)
    assert torch.equal(out[1:], out[:1].expand(2, -1))
    assert alone.tiers[0].rows == 1
    alone.close()


def test_an_empty_batch_gives_an_empty_answer(cached: CachedRows) -> None:
    """A batch of no rows answers no rows, of the encoder's row shape, and counts nothing."""
    out = cached(images(0))
    assert out.shape == (0, 8)
    assert cached.stats.batches == 0


def test_index_keys_hold_the_input_row_shape(store: Store, tmp_path: Path) -> None:
    """Keyed by index, the same samples at another input shape (a resize changed) are
    other rows: nothing computed at one shape is recalled at the other, from memory or
    from the store, and each shape recalls its own. Content keys, whose row digests hold
    the shape, declare it nowhere else."""
    index = torch.arange(8)
    small, large = images(8), torch.randn(8, 3, 16, 16)
    cached = cache_rows(encoder(), store, key="index", version="toy@1")
    assert set(cached.row_keys(small, index)).isdisjoint(cached.row_keys(large, index))
    cached(small, index=index)
    assert torch.equal(cached(large, index=index), expected(cached.module, large))
    assert cached.stats.computed == 16
    cached.close()
    again = cache_rows(encoder(), Store(tmp_path / "store"), key="index", version="toy@1")
    assert torch.equal(again(large, index=index), expected(again.module, large))
    assert torch.equal(again(small, index=index), expected(again.module, small))
    assert again.stats.from_store == 16 and again.stats.computed == 0
    again.close()
    by_content = cache_rows(encoder())
    by_content.row_keys(small)
    precision = {"input": "F32", "autocast": None}
    assert by_content._node.declared == {"rows": "content", "precision": precision}


def test_indices_that_name_different_inputs_are_refused(store: Store) -> None:
    """An index that names two rows of different inputs in one batch is refused, nothing
    kept: labels passed for the indices repeat. The same sample twice (a sampler with
    replacement), NaN and all, is one row."""
    data = images(32)
    labels = torch.arange(32) % 4
    cached = cache_rows(encoder(), store, key="index", version="toy@1")
    with pytest.raises(NeedsIndex, match=r"names sample 0 at rows 0 and 4 .* labels"):
        cached(data[:16], index=labels[:16])
    assert cached.stats.rows == 0 and cached.tiers[0].rows == 0
    data[3, 0, 0, 0] = float("nan")
    index = torch.tensor([3, 5, 3, 5])
    out = cached(data[index], index=index)
    assert torch.equal(out[2:].nan_to_num(), out[:2].nan_to_num())
    assert out[0].isnan().all() and cached.tiers[0].rows == 2
    cached.close()


class Reciprocal(nn.Module):
    """Tells a zero from a negative zero: 1/0 is inf, 1/-0 is -inf."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1 / x


def test_indices_that_name_inputs_differing_only_in_their_bits_are_refused() -> None:
    """An index repeated for a zero and a negative zero, or for NaNs of other bits, names
    two inputs that compare equal as values and are not one sample loaded twice: the
    module may tell them apart, so the answer of one recalled for the other is wrong."""
    cached = cache_rows(Reciprocal(), key="index", version="toy@1")
    zeros = torch.zeros(2, 3)
    zeros[1, 2] = -0.0
    with pytest.raises(NeedsIndex, match="names sample 7 at rows 0 and 1"):
        cached(zeros, index=torch.tensor([7, 7]))
    nans = torch.full((2, 3), float("nan"))
    nans[1].view(torch.int32)[:] |= 1  # another NaN payload
    with pytest.raises(NeedsIndex, match="names sample 7 at rows 0 and 1"):
        cached(nans, index=torch.tensor([7, 7]))
    assert cached.stats.rows == 0
    same = torch.tensor([[-0.0, float("nan"), 1.0]]).expand(2, 3)
    out = cached(same, index=torch.tensor([7, 7]))
    assert torch.equal(out.nan_to_num(), (1 / same).nan_to_num()) and out[1, 0] < 0


def test_a_repeated_index_of_a_pooled_channels_last_batch_is_compared(store: Store) -> None:
    """Keyed by index, a batch of channels_last maps pooled to 1x1 (strides (C, 1, C, C),
    which torch calls contiguous) with a sample twice in it (a sampler with replacement)
    has the two rows compared as bytes and answered as the module answers them, where the
    comparison failed with torch's RuntimeError on viewing them as bytes; one whose
    repeated index names two inputs is refused as any other."""
    torch.manual_seed(0)
    pooled = nn.functional.adaptive_avg_pool2d(
        torch.randn(4, 8, 5, 5).to(memory_format=torch.channels_last), 1
    )
    index = torch.tensor([3, 5, 2, 3])
    batch = pooled[torch.tensor([0, 1, 2, 0])]
    assert batch.is_contiguous() and batch.stride() == (8, 1, 8, 8)
    head = nn.Conv2d(8, 4, 1).requires_grad_(False)
    cached = cache_rows(head, store, key="index", version="toy@1")
    with torch.no_grad():
        assert torch.equal(cached(batch, index=index), head(batch))
    with pytest.raises(NeedsIndex, match="names sample 3 at rows 0 and 3"):
        cached(pooled, index=index)
    cached.close()


def test_prefill_keyed_by_index_takes_no_tuple_item_for_the_indices(store: Store) -> None:
    """Keyed by index, prefill does not take a tuple's last item for the indices: an
    ``(x, y)`` loader's labels, never repeating within a batch, would key each row under a
    label and be recalled for another sample. Told where they are (``inputs=``), it keeps
    rows that the samples' indices recall."""
    data = images(32)
    labels = (torch.arange(32) * 7 + 3) % 16  # no label twice in a batch of 4
    cached = cache_rows(encoder(), store, key="index", version="toy@1")
    with pytest.raises(NeedsIndex, match=r"cannot tell the samples' indices in a `list`"):
        prefill(cached, DataLoader(TensorDataset(data, labels), batch_size=4), progress=False)
    with pytest.raises(NeedsIndex, match=r"a `dict` with no 'index'"):
        prefill(cached, [{"x": data[:4]}], progress=False)
    with pytest.raises(NeedsIndex, match=r"cannot tell the samples' indices in a `Tensor`"):
        prefill(cached, [data[:4]], progress=False)
    indexed = DataLoader(TensorDataset(data, labels, torch.arange(32)), batch_size=4)
    with pytest.raises(NeedsIndex, match=r"inputs= answered the batch alone.*\(batch, indices\)"):
        prefill(cached, indexed, inputs=lambda item: item[0], progress=False)
    assert cached.stats.rows == 0 and cached.tiers[0].rows == 0
    done = prefill(cached, indexed, inputs=lambda item: (item[0], item[2]), progress=False)
    assert done.computed == 32
    out = cached(data, index=torch.arange(32))
    assert cached.stats.recalled == 32
    assert torch.allclose(out, expected(cached.module, data), atol=1e-6)
    cached.close()


class CumulativeSum(nn.Module):
    """Each row's answer is the sum of the rows up to it: the first row's is its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(0)


class ReversedSum(nn.Module):
    """Each row's answer is the sum of the rows from it on: the last row's is its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(0).cumsum(0).flip(0)


class Huge(nn.Module):
    """Row-wise, with answers far from 1 (their norms overflow float32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1e30


class InPlace(nn.Module):
    """Doubles its input in place and returns it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)


class UpToLongest(nn.Module):
    """Embeds token ids only as far as its batch's longest sequence (0 pads the rest), as a
    text encoder that trims the padding of its batch does."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 4, padding_idx=0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        longest = int((ids != 0).sum(1).max())
        return self.embedding(ids[:, :longest])


def test_a_module_answering_a_row_alone_in_another_shape_is_told_to_answer_one_shape(
    store: Store,
) -> None:
    """A text encoder answering as far as its batch's longest sequence answers a short row
    alone in another shape than in its batch: it is refused saying that its answer's
    shape follows the batch and to answer rows of one shape (pad to a fixed length), not
    to put the batch first, which it already does. Nothing is kept."""
    ids = torch.zeros(3, 12, dtype=torch.long)
    for row, length in enumerate((3, 9, 5)):
        ids[row, :length] = torch.arange(1, length + 1)
    cached = cache_rows(UpToLongest(), store)
    with pytest.raises(NotRowwise, match=r"batch's longest sequence.*pad to a fixed length") as why:
        cached(ids)
    assert "batch_first" not in str(why.value)
    assert cached.tiers[0].rows == 0
    cached.close()


class PooledSqueezed(nn.Module):
    """Pools a feature map to one value per channel and squeezes it, naming no dimension,
    as many image encoders do: a batch of one row loses its batch's dimension too."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x)).squeeze()


def test_a_module_squeezing_away_the_batch_dimension_is_told_so(store: Store) -> None:
    """A module whose `squeeze()` drops the batch's dimension from a batch of one row is
    refused saying so and what to squeeze, on a batch of one row and where a row run
    alone looks for mixing; it is not told that it mixes rows, nor, where the row run
    alone shows the squeeze, to cache per batch. Nothing is kept."""
    torch.manual_seed(0)
    cached = cache_rows(PooledSqueezed(), store)
    for batch, alone in ((torch.randn(4, 3, 8, 8), True), (torch.randn(1, 3, 8, 8), False)):
        with pytest.raises(NotRowwise, match=r"squeeze\(\)` naming no dimension") as why:
            cached(batch)
        assert "depends on the other rows" not in str(why.value)
        assert ("per batch" in str(why.value)) is not alone
    assert cached.tiers[0].rows == 0
    cached.close()


def test_a_module_answering_many_tensors_is_told_to_answer_the_one_wanted() -> None:
    """A module answering many tensors per row is refused, told to cache per row a module
    answering the one tensor wanted. It is told to cache it whole, per batch, where the
    store keeps such an answer: a namedtuple, Hugging Face's `ModelOutput`; not a
    namedtuple defined inside a function."""
    for module, features, whole in (
        (Answers("namedtuple"), 4, True),
        (AnswersAsHuggingFace(), 6, True),
        (Answers("local"), 4, False),
    ):
        cached = cache_rows(module)
        with pytest.raises(NotRowwise, match=r"one tensor wanted.*`encoder\(x\)\[0\]`") as why:
            cached(torch.randn(4, features))
        assert ("per batch" in str(why.value)) is whole
        assert cached.tiers[0].rows == 0


def test_a_module_that_mixes_rows_is_refused(store: Store) -> None:
    """A module whose answer for a row depends on the rest of its batch — a transformer
    layer whose dimension 0 is the sequence, a running sum along it — is refused with what
    to do, and nothing is kept; the same layer with the batch first, a BatchNorm in eval
    and a bfloat16 one (rounding otherwise in a batch of another size) are not. A module
    that writes into its input is refused for that, not for mixing rows."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)
    sequence = torch.randn(5, 1, 8)
    mixing = cache_rows(layer, store)
    with pytest.raises(NotRowwise, match=r"depends on the other rows.*batch_first=True"):
        mixing(sequence)
    assert mixing.tiers[0].rows == 0
    mixing.close()
    with pytest.raises(NotRowwise, match="last of 4 rows, run again on its own"):
        cache_rows(CumulativeSum())(torch.randn(4, 3))
    with pytest.raises(NotRowwise, match="first of 4 rows, run again on its own"):
        cache_rows(ReversedSum())(torch.randn(4, 3))
    big = torch.randn(4, 3)
    assert torch.equal(cache_rows(Huge())(big), big * 1e30)
    first = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    batch = torch.randn(6, 5, 8)
    assert torch.allclose(cache_rows(first)(batch), expected(first, batch), atol=1e-6)
    with pytest.raises(RowsError, match=WRITE):
        cache_rows(InPlace(), key="index", version="x@1")(torch.randn(3, 4), index=torch.arange(3))
    assert torch.equal(cache_rows(encoder())(images(16)), expected(encoder(), images(16)))
    half = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to(torch.bfloat16)
    rows = torch.randn(64, 64, dtype=torch.bfloat16)
    assert cache_rows(half)(rows).shape == (64, 64)


class Centring(nn.Module):
    """Takes the mean of its batch off each row: the same answer for a row alone and in a
    batch of copies of it, another in a batch of other rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)


@pytest.mark.parametrize("first", ["alone", "copies"])
@pytest.mark.parametrize("key", ["content", "index"])
def test_rows_kept_before_mixing_could_be_seen_are_checked_in_a_batch_of_others(
    store: Store, first: str, key: KeyMode
) -> None:
    """A module whose answer for a row depends on the rest of its batch, first handed a
    batch of one row (a server's first request, a look at the output's shape) or of copies
    of one row, shows nothing there to tell it from one that answers each row alone: its
    rows are answered and kept. The first batch of two rows or more after, with at most
    one row to run (the rest recalled), is refused (NotRowwise) rather than answered with
    the answers of rows computed alone, and so is every one after; a module that answers
    each row alone answers such a batch as uncached, checked once."""
    version = "rows@1" if key == "index" else None
    rows = torch.randn(3, 4)
    mixing = cache_rows(Centring(), store, key=key, version=version)

    def call(cache: CachedRows, at: list[int]) -> torch.Tensor:
        index = torch.tensor(at)
        return cache(rows[index], **({"index": index} if key == "index" else {}))

    call(mixing, [0] if first == "alone" else [0, 0])
    with pytest.raises(NotRowwise, match="depends on the other rows"):
        call(mixing, [0, 1])
    with pytest.raises(NotRowwise, match="depends on the other rows"):
        call(mixing, [1, 2])  # no row kept from the refused batch, none recalled
    mixing.close()
    linear = nn.Linear(4, 2)
    alone = cache_rows(linear, store, key=key, version=version)
    call(alone, [0] if first == "alone" else [0, 0])
    assert torch.allclose(call(alone, [0, 1]), expected(linear, rows[:2]), rtol=0, atol=1e-6)
    assert torch.allclose(call(alone, [1, 2]), expected(linear, rows[1:]), rtol=0, atol=1e-6)
    alone.close()


class ToLongest(nn.Module):
    """Runs its batch of padded token ids only up to the batch's longest sequence (pad id
    0 at the end), as a text encoder trimming its padding does: a row's answer is as long
    as the longest row of the batch it ran in."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 4, padding_idx=0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        longest = int((ids != 0).sum(1).max())
        return self.embed(ids[:, :longest]).cumsum(1)


def padded(lengths: list[int]) -> torch.Tensor:
    """Token ids padded with 0 to 6, one sequence of each of ``lengths``."""
    ids = torch.zeros(len(lengths), 6, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.arange(1, length + 1) + row
    return ids


@pytest.mark.parametrize("key", ["content", "index"])
def test_a_module_whose_rows_come_back_as_long_as_their_batchs_longest_is_refused(
    store: Store, key: KeyMode
) -> None:
    """A module whose answer for a row is as long as the longest row of its batch passes
    the check of its first batch where both of the rows run again alone are the longest;
    the next batch of rows as long as one another but shorter answers rows of another
    shape for inputs of the same shape, which shows the rows kept from the first batch are
    not what each answers alone. That batch is refused (NotRowwise) and nothing of it is
    kept, and so is every batch after that would recall rows of the first, where those
    were recalled whole, the shorter rows as long as the first batch's longest."""
    version = "ids@1" if key == "index" else None
    module = ToLongest()
    cached = cache_rows(module, store, key=key, version=version)
    first = padded([6, 2, 6])
    index = {"index": torch.arange(3)} if key == "index" else {}
    assert torch.equal(cached(first, **index), expected(module, first))
    shorter = padded([3, 4])
    index = {"index": torch.arange(3, 5)} if key == "index" else {}
    with pytest.raises(NotRowwise, match=r"rows of \[6, 4\].*and of \[4, 4\]"):
        cached(shorter, **index)
    assert cached.tiers[0].rows == 3  # the first batch's
    again = first[1:2]
    index = {"index": torch.arange(1, 2)} if key == "index" else {}
    with pytest.raises(NotRowwise, match=r"rows of \[6, 4\].*and of \[4, 4\]"):
        cached(again, **index)
    cached.close()


class Sampling(nn.Module):
    """Answers a latent sampled around a mean, as a VAE's encoder does: each call draws."""

    def __init__(self, spread: float) -> None:
        super().__init__()
        self.mean = nn.Linear(4, 3)
        self.spread = spread

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean(x)
        return mean + self.spread * torch.randn_like(mean)


@pytest.mark.parametrize(("rows", "spread"), [(1, 1.0), (4, 1e-6)])
def test_a_module_that_draws_at_random_is_refused(store: Store, rows: int, spread: float) -> None:
    """A module that draws from torch's generator as it runs is refused before a row is
    kept, where the check of rows run alone tells nothing: a batch of one row, which it
    does not run again, or a draw that moves a row less than rounding allows. A recall
    would repeat the one draw, where a call draws anew."""
    cached = cache_rows(Sampling(spread), store)
    x = torch.randn(rows, 4)
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with pytest.raises(RowsError, match="drew from torch's random number generator"):
            cached(x)
    assert cached.tiers[0].rows == 0
    cached.close()


class DrawsOnceGiven(nn.Module):
    """Adds noise drawn from a generator that a part of it is given after it is made, in a
    tuple beside the plain sizes such a part keeps: none until then."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        self.noise: tuple[Any, ...] = (3, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        held = self.inner[1].__dict__.get("draws")
        if held is not None:
            out = out + torch.randn(out.shape, generator=held[-1])
        return out


def test_a_generator_given_to_a_part_after_rows_were_computed_is_seen(store: Store) -> None:
    """The parts a computed batch looks through for generators they hold are listed once
    for the parts the module has, and their attributes read anew at each computed batch:
    a generator a part is given after rows were computed (in a tuple beside plain values,
    as a part keeps its sizes), drawn from, is seen as it is at the first call, and the
    batch is refused with nothing of it kept."""
    module = DrawsOnceGiven()
    cached = cache_rows(module, store)
    first = torch.randn(4, 4)
    assert torch.allclose(cached(first), expected(module, first), atol=1e-6)
    module.inner[1].draws = (2, "plain", torch.Generator().manual_seed(0))
    with pytest.raises(RowsError, match="drew from torch's random number generator"):
        cached(torch.randn(4, 4))
    assert cached.tiers[0].rows == 4  # the first batch's alone
    cached.close()


@pytest.mark.parametrize("beside", [DrawnBeside, AttendsBeside])
def test_a_module_run_while_another_thread_draws_is_cached(
    store: Store, beside: type[nn.Module]
) -> None:
    """A module that draws nothing, run while another thread draws from torch's generator
    (a loader fetching ahead that draws a crop), is not taken to draw: its rows are kept
    and recalled. An attention with no dropout, whose kernel torch tags as one that may
    draw, draws nothing."""
    module = beside()
    cached = cache_rows(module, store)
    x = torch.randn(4, 4)
    first = cached(x)
    assert torch.equal(cached(x), first)
    assert torch.allclose(first, expected(module, x), atol=1e-6)
    assert cached.reset_stats().computed == 4
    cached.close()


def test_a_module_that_cannot_answer_one_row_alone_is_refused(store: Store) -> None:
    """A module that uses its batch's statistics even in eval (a BatchNorm that tracks
    none) raises when the check runs one row alone: that is refused as not answering each
    row on its own, naming the module and what it raised, and nothing is kept."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False))
    cached = cache_rows(module, store)
    with pytest.raises(
        NotRowwise, match=r"`Sequential` cannot answer a row alone: the first of 6 rows.*raised"
    ) as refused:
        cached(torch.randn(6, 4))
    assert "Expected more than 1 value per channel" in str(refused.value)
    assert isinstance(refused.value.__cause__, ValueError)
    assert cached.tiers[0].rows == 0
    cached.close()


class DetachesInPlace(nn.Module):
    """Detaches its input, flattened, in place (`x.detach_()`): torch refuses that on a
    view, and a batch the module is called on is none."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        x.detach_()
        return self.linear(x)


def test_a_module_that_detaches_its_rows_in_place_is_cached_per_row(store: Store) -> None:
    """`x.detach_()` inside a module changes none of its answers, so a row cache runs it:
    the rows it runs alone to check it answers each on its own are handed as the batch is,
    no view torch would refuse to detach in place. Its rows are kept and recalled as its
    own answers."""
    torch.manual_seed(0)
    module = DetachesInPlace().eval()
    cached = cache_rows(module, store)
    data = torch.randn(6, 4)
    assert torch.equal(cached(data.clone()), module(data.clone()))
    assert cached.tiers[0].rows == 6
    assert torch.equal(cached(data.clone()), module(data.clone()))
    assert cached.stats.computed == 6
    cached.close()


class OutOfMemoryAlone(nn.Module):
    """Runs out of memory on a batch of one row while ``tight``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.tight = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tight and len(x) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return self.linear(x)


def test_out_of_memory_as_one_row_runs_alone_is_raised_as_it_was(store: Store) -> None:
    """Running out of device memory as the check runs a row alone says nothing of how the
    module answers rows: it reaches the caller as torch raised it (a loop catching it runs
    the batch again in halves), not as a refusal of the module, and nothing is kept."""
    torch.manual_seed(0)
    module = OutOfMemoryAlone()
    cached = cache_rows(module, store)
    batch = torch.randn(6, 4)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        cached(batch)
    assert cached.tiers[0].rows == 0
    module.tight = False
    assert torch.equal(cached(batch), module.linear(batch))
    assert cached.tiers[0].rows == 6
    cached.close()


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: torch.nested.nested_tensor([torch.ones(4), torch.ones(4)]), "nested"),
        (lambda: torch.empty(2, 4, device="meta"), "meta device"),
        (lambda: torch.ones(2, 4).to_sparse(), "sparse_coo .* not dense"),
        (lambda: torch.ones(2, 4).to_sparse_csr(), "sparse_csr .* not dense"),
    ],
)
@pytest.mark.parametrize("key", ["content", "index"])
def test_a_batch_with_no_rows_to_read_is_refused(
    store: Store, make: Callable[[], torch.Tensor], said: str, key: KeyMode
) -> None:
    """A nested batch (rows of no one shape), a meta one (no values) and a sparse one
    (rows not laid out densely) are refused as no batch tensor, saying what they are,
    keyed by content or by index, where torch failed inside the keying with its own
    error."""
    version = "toy@1" if key == "index" else None
    cached = cache_rows(nn.Linear(4, 2), store, key=key, version=version)
    index = torch.arange(2) if key == "index" else None
    with pytest.raises(NotRowwise, match=rf"called with a batch tensor.*{said}"):
        cached(make(), index=index)
    cached.close()


def test_a_submodule_put_in_after_wrapping_is_saved_loaded_and_converted() -> None:
    """The wrapper holds the module's own parameters, buffers and submodules: one put in
    after wrapping is in ``state_dict()`` (which loads into the plain module and answers
    as the cache did), a checkpoint loaded through the wrapper reaches it, and so does a
    conversion; a checkpoint records the module's own layout version."""
    module = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    model = nn.ModuleDict({"encoder": cache_rows(module), "head": nn.Linear(4, 2)})
    x = torch.randn(4, 8)
    replacement = nn.Linear(8, 4).requires_grad_(False)
    module[0] = replacement
    out = model["encoder"](x)
    saved = model.state_dict()
    assert torch.equal(saved["encoder.0.weight"], replacement.weight)
    plain = nn.ModuleDict(
        {"encoder": nn.Sequential(nn.Linear(8, 4), nn.ReLU()), "head": nn.Linear(4, 2)}
    )
    plain.load_state_dict(saved)
    assert torch.equal(expected(plain["encoder"], x), out)
    halves = {k: torch.full_like(v, 0.5) for k, v in module.state_dict().items()}
    model["encoder"].load_state_dict(halves)
    assert torch.equal(replacement.weight, halves["0.weight"])
    assert torch.equal(model["encoder"](x), expected(module, x))
    model.double()
    assert replacement.weight.dtype == torch.float64
    assert torch.equal(model["encoder"](x.double()), expected(module, x.double()))
    assert list(map(id, model["encoder"].parameters())) == list(map(id, module.parameters()))
    norm = cache_rows(nn.BatchNorm1d(4))
    assert norm.state_dict()._metadata[""]["version"] == nn.BatchNorm1d._version  # type: ignore[attr-defined]


def test_state_dict_hooks_registered_on_the_module_run_through_the_wrapper() -> None:
    """Hooks registered on the cached module itself run when the wrapper is saved or
    loaded, before or after wrapping: a checkpoint is the plain module's."""
    module = nn.Sequential(nn.Linear(4, 4))
    add_state_dict_post_hook(
        module, lambda m, state, prefix, meta: state.__setitem__(prefix + "tag", torch.ones(1))
    )
    cached = cache_rows(module)
    seen: list[str] = []
    add_load_state_dict_pre_hook(
        cached, lambda m, state, prefix, *rest: seen.append(str(state.pop(prefix + "tag", None)))
    )
    model = nn.ModuleDict({"encoder": cached})
    saved = model.state_dict()
    assert list(saved) == ["encoder.0.weight", "encoder.0.bias", "encoder.tag"]
    assert list(module.state_dict()) == ["0.weight", "0.bias", "tag"]
    module.load_state_dict(module.state_dict())  # registered on the wrapper: the module's too
    model.load_state_dict(saved)
    assert seen == ["tensor([1.])", "tensor([1.])"]


def test_a_part_added_after_wrapping_keys_rows_anew(store: Store) -> None:
    """A submodule appended to the module (through it or through the wrapper) changes what
    it computes: the rows are computed again, not recalled."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 4))
    cached = cache_rows(module, store)
    x = torch.randn(8, 4)
    cached(x)
    module.append(nn.Tanh())
    with torch.no_grad():
        assert torch.equal(cached(x), module(x))
    assert cached.stats.computed == 16
    cached.add_module("2", nn.ReLU())
    with torch.no_grad():
        assert torch.equal(cached(x), module(x))
    assert cached.stats.computed == 24
    cached.close()


def test_a_module_converted_to_channels_last_through_the_cache_keys_rows_anew(
    store: Store,
) -> None:
    """A conv whose weights are channels_last answers channels_last (and may round
    otherwise): rows kept for its weights in C order are not recalled once it is converted
    (`cached.to(memory_format=torch.channels_last)`), from memory or the store; they are
    computed in its layout, and recalled again once it is converted back."""
    torch.manual_seed(0)
    module = nn.Conv2d(8, 16, 3, padding=1)
    cached = cache_rows(module, store)
    answers_as_its_weights_are_laid_out(cached, module)
    assert (cached.stats.computed, cached.stats.recalled) == (8, 8)
    cached.close()


def test_a_module_unfrozen_then_converted_is_still_refused() -> None:
    """A conversion through the wrapper drops its watch; a parameter made to require grad
    before it is found all the same, not taken as the new way things are."""
    module = nn.Sequential(nn.Linear(4, 4))
    cached = cache_rows(module)
    cached(torch.randn(2, 4))
    module.requires_grad_(True)
    cached.double()
    with pytest.raises(Unfrozen, match=r"`0.weight`, `0.bias` now require grad"):
        cached(torch.randn(2, 4, dtype=torch.float64))


def test_inference_tensors_put_in_a_cached_module_are_refused(store: Store) -> None:
    """Tensors made under ``inference_mode`` and put in after caching (a checkpoint loaded
    with ``assign=True``) keep no version counter, so a later write into them could not
    be seen: refused at the next call, as freezing refuses them."""
    encoder = nn.Linear(4, 4)
    cached = cache_rows(encoder, store)
    x = torch.randn(3, 4)
    cached(x)
    with torch.inference_mode():
        checkpoint = {k: torch.randn_like(v) for k, v in encoder.state_dict().items()}
    cached.load_state_dict(checkpoint, assign=True)
    for _ in range(2):  # nothing was taken in: refused again
        with pytest.raises(FreezeError, match=r"inference_mode\(\)` \(`weight`, `bias`\)"):
            cached(x)


def test_a_module_holding_a_part_cached_per_row_is_refused(store: Store) -> None:
    """A part cached per row inside the module — before it is cached, or put in after — is
    refused where the module would be keyed: that cache, its counts with it, is part of the
    module, which would be keyed anew at every call (or refused as code changed since)."""
    trunk = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    said = r"`0` inside this `Sequential` is cached per row already: a cache of the whole"
    with pytest.raises(RowsError, match=said):
        cache_rows(nn.Sequential(cache_rows(trunk, store), nn.Linear(4, 2)), store)
    cached = cache_rows(nn.Sequential(trunk, nn.Linear(4, 2)), store)
    x = torch.randn(3, 4)
    cached(x)
    cached[0] = cache_rows(trunk, store)
    for _ in range(2):  # nothing was taken in: refused again
        with pytest.raises(RowsError, match=said):
            cached(x)


def test_a_module_with_no_forward_of_its_own_is_refused(store: Store) -> None:
    """A list or dict of encoders (an ensemble) is never called, only its parts are, and a
    cache of it hands those out uncached: it is refused when made, saying to cache each
    part. A list of parts each cached caches every one of them."""
    encoders = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 2)])
    for whole in (encoders, nn.ModuleDict({"a": encoders[0]})):
        with pytest.raises(RowsError, match=r"no forward of its own: .* Cache each part"):
            cache_rows(whole, store)
    cached = nn.ModuleList([cache_rows(part, store) for part in encoders])
    x = torch.randn(3, 4)
    for _ in range(2):
        for part in cached:
            part(x)
    assert [part.stats.recalled for part in cached] == [3, 3]


def test_a_torchscript_module_is_refused_as_one_by_cache_rows(store: Store) -> None:
    """A TorchScript module (scripted or traced), whose forward torch finds on its C++
    side, is refused by cache_rows as a TorchScript module, saying to pass the Python
    module it was made from, and not taken for one with no forward of its own."""
    module = nn.Linear(4, 2)
    for made in (torch.jit.script(module), torch.jit.trace(module, torch.randn(1, 4))):
        with pytest.raises(FreezeError, match=r"is a TorchScript module.*Pass the Python"):
            cache_rows(made, store)


def test_a_cache_remembers_store_keys_up_to_one_count_over_all_its_row_shapes(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of many shapes (sequences of many lengths) are keyed under a keying each; the
    store keys a cache remembers are counted over all of them, so they hold no more than
    one keying may: rows of ten lengths remember 100 keys, not 100 per length. A keying
    dropped (the weights changed) gives its room back, and every row is still answered
    right."""
    monkeypatch.setattr(_row_keys, "_REMEMBERED_KEYS", 100)
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    cached = cache_rows(module, store)
    batches = [torch.randn(50, length, 4) for length in range(1, 11)]
    for x in batches:
        cached(x)
    assert len(cached._keyings) == 10
    assert sum(len(keying.keys) for keying in cached._keyings.values()) == 100
    with torch.no_grad():
        module.bias.add_(1.0)  # a new state: rows are keyed anew, under new keyings
    for x in batches[:3]:
        with torch.no_grad():
            assert torch.equal(cached(x), module(x))
    assert sum(len(keying.keys) for keying in cached._keyings.values()) == 100
    cached.close()


@pytest.mark.parametrize("name", ["module", "store"])
def test_a_cache_refuses_to_have_its_module_or_store_replaced(store: Store, name: str) -> None:
    """``cached.module = other`` and ``cached.store = other`` are refused, naming what to do:
    the module assigned would have become a child of the cached module (whose registries
    the cache holds), and rows would be looked up in one store and written to the other.
    The cache, and the module it caches, stay as they were and answer as before."""
    torch.manual_seed(0)
    module = nn.Linear(8, 4)
    cached = cache_rows(module, store)
    x = torch.randn(4, 8)
    first = cached(x)
    other = nn.Linear(8, 4) if name == "module" else Store(store.root / "other")  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=f"`{name}` of a row cache is fixed"):
        setattr(cached, name, other)
    with pytest.raises(AttributeError, match=f"`{name}` of a row cache is fixed"):
        delattr(cached, name)
    assert cached.module is module and cached.store is store
    assert list(module.state_dict()) == ["weight", "bias"]
    assert torch.equal(cached(x), first) and cached.stats.from_device == 4
    cached.close()


def test_a_version_written_afterwards_is_checked_as_one_given(store: Store) -> None:
    """``cached.version`` written after the cache is made is refused where ``version=``
    would be: empty or not a string for rows keyed by index (another value than the
    string would key rows under a name of its own), any for rows keyed by content. A
    string is taken, and keys the rows of the next call under it."""
    x, index = torch.randn(4, 8), torch.arange(4)
    cached = cache_rows(nn.Linear(8, 4), store, key="index", version="toy@1")
    cached(x, index=index)
    for wrong in ("", 5, b"toy@1"):
        with pytest.raises(NeedsIndex, match="version= is that version as a string"):
            cached.version = wrong
    assert cached.version == "toy@1"
    cached(x, index=index)
    assert cached.stats.from_device == 4
    cached.version = "toy@2"
    cached(x, index=index)
    assert cached.stats.computed == 8
    by_content = cache_rows(nn.Linear(8, 4), store)
    with pytest.raises(RowsError, match="version= is for key='index'"):
        by_content.version = "toy@1"
    assert by_content.version is None
    cached.close()
    by_content.close()


class Patched(OnALinear):
    """A module whose class the test below gives another forward."""

    # Its own, for the test to replace on this class.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out


def test_a_forward_set_on_the_cached_module_s_class_is_refused_until_cached_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are keyed by the module's class, structure and weights, not its code: rows the
    old code computed, held in memory and kept in the store, would be taken for the new
    code's. So a method set on the class after it was cached is refused at the next forward,
    naming it; a new cache says the stored rows drifted, strict=True computes them with
    the new code, and the old cache answers again once the method is set back."""
    x = torch.randn(5, 6)
    cached = cache_rows(Patched(), store=store)
    first = cached(x)
    cached.flush()
    monkeypatch.setattr(Patched, "__slotnames__", [], raising=False)  # what a copy adds
    assert torch.equal(cached(x), first)
    monkeypatch.setattr(Patched, "forward", lambda self, x: self.linear(x) * 0)
    with pytest.raises(RowsError, match=r"`Patched\.forward` was set on the class.*`cache_rows`"):
        cached(x)
    assert torch.equal(cache_rows(Patched(), store=store, strict=True)(x), torch.zeros(5, 3))
    monkeypatch.undo()
    assert torch.equal(cached(x), first)


_SCALED_CELL = """
from torch import nn

SCALE = 2.0


def halved(t):
    return t / 2


class ScaledByAGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):
        return halved(self.linear(x)) * SCALE
"""


def _scaled_cell(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A notebook cell defining ``ScaledByAGlobal``, whose forward reads the global ``SCALE``
    and calls the helper ``halved`` of its module."""
    return run_cell(monkeypatch, "tests.rows_cell", _SCALED_CELL)


def test_a_global_the_cached_module_s_forward_reads_rebound_is_refused_until_set_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A global the module's forward reads, rebound (a notebook's cell run again with
    ``SCALE = 3.0``), is a change of its code, as a method set on its class is: the rows the
    old value computed would be recalled for the new one, so the next forward is refused
    naming it; a new cache computes them with the new value, and the old cache answers
    again once the global is set back."""
    cell = _scaled_cell(monkeypatch)
    module = cell.ScaledByAGlobal()
    cached = cache_rows(module, store=store)
    x = torch.randn(5, 6)
    first = cached(x)
    cached.flush()
    exec("SCALE = 3.0", vars(cell))
    with pytest.raises(RowsError, match=r"`tests\.rows_cell:SCALE` was rebound"):
        cached(x)
    again = cache_rows(cell.ScaledByAGlobal(), store=store, strict=True)
    again.module.load_state_dict(module.state_dict())
    assert torch.allclose(again(x), first * 1.5)
    exec("SCALE = 2.0", vars(cell))
    assert torch.equal(cached(x), first)


def test_a_helper_the_cached_module_s_forward_calls_rebound_is_refused_not_the_same_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper of its module the module's forward calls, defined again with other code
    (a cell run again, edited), refuses the cache; defined again with the same code (the
    cell run again as it was), it is no change, and the cache goes on recalling its rows."""
    cell = _scaled_cell(monkeypatch)
    cached = cache_rows(cell.ScaledByAGlobal(), store=store)
    x = torch.randn(5, 6)
    first = cached(x)
    exec("def halved(t):\n    return t / 2\n", vars(cell))
    assert torch.equal(cached(x), first)
    assert cached.stats.computed == 5
    exec("def halved(t):\n    return t / 4\n", vars(cell))
    with pytest.raises(RowsError, match=r"`tests\.rows_cell:halved` was rebound"):
        cached(x)


def test_a_cell_run_again_edited_names_only_the_global_it_changed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell defining the module run again with ``SCALE`` edited rebinds every name it
    defines: the refusal names ``SCALE``, not the helper defined again with the same code,
    which it named beside it as rebound as well."""
    cell = _scaled_cell(monkeypatch)
    cached = cache_rows(cell.ScaledByAGlobal(), store=store)
    x = torch.randn(5, 6)
    cached(x)
    edited = _SCALED_CELL.replace("SCALE = 2.0", "SCALE = 3.0")
    exec(compile(edited, "<cell>", "exec"), vars(cell))
    with pytest.raises(RowsError, match=r"^`tests\.rows_cell:SCALE` was rebound in its module"):
        cached(x)


def test_a_global_tensor_the_cached_module_s_forward_reads_changed_in_place_says_so(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A global tensor the module's forward reads, written in place (``MEAN[0] = 5.0``),
    refuses the cache with a message saying it changed in place: it said the global was
    set on the class, added or deleted, which no one did."""
    cell = _scaled_cell(monkeypatch)
    exec("import torch\nMEAN = torch.zeros(3)\n", vars(cell))
    exec("def halved(t):\n    return t / 2 - MEAN\n", vars(cell))
    cached = cache_rows(cell.ScaledByAGlobal(), store=store)
    x = torch.randn(5, 6)
    cached(x)
    cell.MEAN[0] = 5.0
    with pytest.raises(RowsError, match=r"`tests\.rows_cell:MEAN` was changed in place after"):
        cached(x)


def test_a_torch_module_in_a_global_the_forward_calls_keys_rows_by_its_weights(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of torch's own classes held in a global the module's forward calls (``NORM =
    nn.LayerNorm(3)``) computes its rows as much as the module's own weights do: its weights
    changed in place, or a checkpoint loaded into it, key the rows anew, computed with them,
    not the rows of the old weights recalled; set back, those are recalled again, and a new
    cache over the same store computes rows under weights it never kept rows for."""
    cell = normed_cell(monkeypatch, "tests.rows_norm_cell")
    cached = cache_rows(cell.Normed(), store=store)
    x = torch.randn(5, 6)
    first = cached(x)
    cached.flush()
    scaled(cell.NORM, 2.0)
    doubled = cached(x)
    with torch.no_grad():
        assert torch.equal(doubled, cached.module(x))
    assert not torch.equal(doubled, first)
    assert cached.stats.computed == 10
    scaled(cell.NORM, 0.5)
    assert torch.equal(cached(x), first)
    assert cached.stats.computed == 10
    cell.NORM.load_state_dict({"weight": torch.full((3,), 3.0), "bias": torch.zeros(3)})
    again = cache_rows(cached.module, store=store)
    assert torch.allclose(again(x), first * 3.0)
    assert again.stats.computed == 5


def test_a_global_named_as_an_attribute_the_forward_reads_does_not_key_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module in a global bearing the name of an attribute the module's forward reads
    (``lin = nn.Linear(3, 3)`` beside ``self.lin``) is none the forward computes with: its
    weights changed, the rows kept are recalled, not every row computed again."""
    cell = named_as_attributes_cell(monkeypatch, "tests.rows_named_cell")
    cached = cache_rows(cell.Enc(), store=store)
    x = torch.randn(5, 4)
    first = cached(x)
    scaled(cell.lin, 2.0)
    assert torch.equal(cached(x), first)
    assert cached.stats.computed == 5


def test_a_torch_module_in_a_global_made_again_with_other_weights_keys_rows_anew(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell holding the global module run again, its module made by the same text and
    given other weights, is no other code (the fingerprint names it by that text): the rows
    are keyed by the weights of the module the global holds now, not the old module's
    recalled."""
    cell = normed_cell(monkeypatch, "tests.rows_norm_cell")
    cached = cache_rows(cell.Normed(), store=store)
    x = torch.randn(5, 6)
    first = cached(x)
    exec("NORM = nn.LayerNorm(3)\nNORM.weight.data.fill_(2.0)", vars(cell))
    assert torch.allclose(cached(x), first * 2.0)
    assert cached.stats.computed == 10


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_torch_module_the_module_computes_with_but_does_not_hold_keys_rows_as_it_changes(
    store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A module of torch's own classes the module computes with but does not hold — in a
    global its forward calls, in a list or dict such a global holds, or bound by a partial
    the module keeps — keys the rows by its settings and mode (``NORM.eps = 1.0``,
    ``DROP.train()``) and its weights, and the container by the modules it holds (one
    replaced, one added): changed, the rows are computed anew with it, not the rows kept
    before recalled."""
    cell = normed_cell(monkeypatch, "tests.rows_held_cell")
    make, changed = CHANGES[change]
    cached = cache_rows(make(cell), store=store)
    x = torch.randn(5, 6)
    first = cached(x)
    changed(cell, cached.module)
    again = cached(x)
    with torch.no_grad():
        assert torch.equal(again, cached.module(x))
    assert not torch.equal(again, first)
    assert cached.stats.computed == 10


def test_a_lazy_or_inference_mode_torch_module_in_a_global_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module in a global the forward calls whose state no watch can see, as one of the
    module's parts would be refused: lazy and not called yet (no weights to key rows by),
    or made under ``torch.inference_mode()`` (no version counter to see a change by) — a
    FreezeError naming the global, where a ValueError or RuntimeError of torch's came."""
    cell = normed_cell(monkeypatch, "tests.rows_held_cell")
    with pytest.raises(FreezeError, match=r"`tests.rows_held_cell:LAZY` holds .* not made yet"):
        cache_rows(cell.Lazy(), store=store)
    with torch.inference_mode():
        cell.NORM = nn.LayerNorm(3)
    with pytest.raises(
        FreezeError,
        match=r"`tests.rows_held_cell:NORM` holds tensors made under `torch.inference_mode",
    ):
        cache_rows(cell.Normed(), store=store)


class KeptLater(nn.Module):
    """A linear layer, then each module in a plain list it keeps, empty when made, and a
    list of what it was handed, which code elsewhere fills."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.extra: list[nn.Module] = []
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        for part in self.extra:
            x = part(x)
        return x


def test_a_module_put_in_an_empty_plain_list_the_module_keeps_keys_rows_by_its_weights(
    store: Store,
) -> None:
    """A module put in a plain list the module keeps, empty when the cache was made, keys
    the rows anew, and so do its weights changed after: they are the module's state from
    then on. Recalled, the state is not digested again."""
    module = KeptLater()
    cached = cache_rows(module, store=store)
    x = torch.randn(5, 3)
    cached(x)
    watch = cached._watch
    cached(x)
    assert cached._watch is watch and cached.stats.computed == 5
    module.extra.append(nn.LayerNorm(3))
    cached(x)
    scaled(module.extra[0], 2.0)
    again = cached(x)
    with torch.no_grad():
        assert torch.equal(again, module(x))
    assert cached.stats.computed == 15


def test_a_plain_list_the_forward_fills_is_not_walked_whole_at_each_call(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain list the module keeps, empty when the cache was made, that code elsewhere
    fills (each batch the module was handed there) is watched for a module coming in by
    what came in since the last look, not walked whole at each call: a recalled call
    costs the same however long it grew."""
    module = KeptLater()
    cached = cache_rows(module, store=store)
    x = torch.randn(5, 3)
    cached(x)
    walked = 0
    reached = _state._reached

    def counted(*args: Any) -> bool:
        nonlocal walked
        walked += 1
        return reached(*args)

    monkeypatch.setattr(_state, "_reached", counted)
    looks = []
    for size in (20, 200):
        while len(module.seen) < size:
            module.seen.append(x)  # filled as a forward run elsewhere fills it
        cached(x)  # the list moved: the watch is taken again, once
        walked = 0
        cached(x)
        looks.append(walked)
    assert looks[0] == looks[1]
    computed = cached.stats.computed
    module.extra.append(nn.LayerNorm(3))  # a module coming in is still seen
    cached(x)
    assert cached.stats.computed == computed + 5


class CountedOnItsClass(OnALinear):
    """Counts its calls on its class."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        out: torch.Tensor = self.linear(x)
        return out


def test_a_count_a_cached_module_keeps_on_its_class_is_not_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value the module's own code sets on its class as it runs is its state, not code:
    the cache goes on answering."""
    monkeypatch.setattr(CountedOnItsClass, "calls", 0)
    cached = cache_rows(CountedOnItsClass(), store=store)
    first = cached(torch.randn(4, 6))
    assert CountedOnItsClass.calls >= 1
    again = torch.randn(3, 6)
    assert torch.equal(cached(again), expected(cached.module, again))
    assert first.shape == (4, 3)


class ScaledByItsClass(OnALinear):
    """Scales by a class default that an instance may override."""

    scale = 2.0

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        if scale is not None:
            self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.scale
        return out


def test_a_class_default_its_code_sets_on_an_instance_is_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class value whose name the module's code assigns on an instance
    (``self.scale = scale``) is code, not state: setting it on the class refuses the cache."""
    monkeypatch.setattr(ScaledByItsClass, "scale", 2.0)
    cached = cache_rows(ScaledByItsClass(), store=store)
    x = torch.randn(4, 6)
    cached(x)
    monkeypatch.setattr(ScaledByItsClass, "scale", 3.0)
    with pytest.raises(RowsError, match=r"`ScaledByItsClass\.scale` was set on the class"):
        cached(x)


class LateConfig:
    """A config whose class gives the scale its module reads."""

    scale = 1.0


class ReadsALateConfig(OnALinear):
    """Reads a config set on it only after it was cached."""

    def __init__(self) -> None:
        super().__init__()
        self.config: LateConfig | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.config is not None
        out: torch.Tensor = self.linear(x) * self.config.scale
        return out


def test_a_config_set_after_caching_has_its_class_code_watched(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config of a class the cache was not made with, set on the module after
    ``cache_rows``, has its class's code watched as the module's is: its rows are kept
    under a fingerprint that covers that class (a cache made with the config from the
    start recalls them as they are), and a default changed on that class refuses the
    cache rather than recall the rows the old default computed."""
    encoder = ReadsALateConfig()
    cached = cache_rows(encoder, store=store)
    encoder.config = LateConfig()
    x = torch.randn(4, 6)
    first = cached(x)
    cached.flush()
    again = ReadsALateConfig()
    again.config = LateConfig()
    other = cache_rows(again, store=store, strict=True)
    assert torch.equal(other(x), first)
    assert other.stats.from_store == 4 and other.stats.computed == 0
    monkeypatch.setattr(LateConfig, "scale", 3.0)
    with pytest.raises(RowsError, match=r"`LateConfig\.scale` was set on the class"):
        cached(x)


class DeclaresACount(OnALinear):
    """Declares the count its subclass keeps on its own class."""

    calls = 0


class CountsOnItsOwnClass(DeclaresACount):
    """Counts on its own class the name its base declares."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        out: torch.Tensor = self.linear(x)
        return out


def test_a_count_declared_on_a_base_module_is_not_code(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count a module moves on its class, declared on its base class, is state: the
    cache goes on answering once the class holds the count itself."""
    monkeypatch.setattr(DeclaresACount, "calls", 0)
    if "calls" in vars(CountsOnItsOwnClass):  # what an earlier run counted
        delattr(CountsOnItsOwnClass, "calls")
    cached = cache_rows(CountsOnItsOwnClass(), store=store)
    cached(torch.randn(4, 6))
    assert "calls" in vars(CountsOnItsOwnClass)
    again = torch.randn(3, 6)
    assert torch.equal(cached(again), expected(cached.module, again))
    if "calls" in vars(CountsOnItsOwnClass):
        delattr(CountsOnItsOwnClass, "calls")


@pytest.mark.parametrize("recalled", [True, False], ids=["recalled", "computed"])
def test_a_part_put_in_train_mode_warns_at_the_callers_line(store: Store, recalled: bool) -> None:
    """A part of the cached encoder put in train mode directly (``encoder[1].train()``)
    warns at the next forward whether its rows are recalled or computed, pointing at
    the line that called the cache; the part is put back in eval, and what is answered
    is what it answers in eval."""
    module = encoder()
    cached = cache_rows(module, store)
    x = images(6)
    first = cached(x)
    module[1].train()
    batch = x if recalled else images(6, seed=2)
    with pytest.warns(StillChanging, match="`1`.*train mode") as caught:
        again = cached(batch)
    assert [w.filename for w in caught] == [__file__]
    assert not module[1].training
    assert torch.equal(again, first if recalled else expected(module, batch))
    assert cached.stats.computed == (6 if recalled else 12)


def test_rows_kept_by_other_code_warn_at_the_callers_line(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows recalled from the store that another version of the module's code kept are
    used (the key is the same) and said to have drifted, once, at the line that called
    the cache."""
    x = torch.randn(5, 6)
    first = cache_rows(Patched(), store=store)
    kept = first(x)
    first.flush()
    monkeypatch.setattr(Patched, "forward", lambda self, x: self.linear(x) * 0)
    with pytest.warns(Drifted, match="another version of its code") as caught:
        again = cache_rows(Patched(), store=store)(x)
    assert [w.filename for w in caught] == [__file__]
    assert torch.equal(again, kept)


@pytest.mark.parametrize("fresh", [0, 3])
def test_rows_kept_by_other_code_of_another_shape_are_computed_again(
    store: Store, monkeypatch: pytest.MonkeyPatch, fresh: int
) -> None:
    """Rows another version of the module's code kept, recalled from the store, are used
    only where they are of the shape and dtype this code answers: code that now answers
    wider rows gets its own, for a batch recalled whole (``fresh`` rows computed: none) or
    in part, and is warned."""
    x = torch.randn(5, 6)
    first = cache_rows(Patched(), store=store)
    first(x)
    first.flush()

    def wider(self: Patched, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        return torch.cat([out, out], dim=1)

    monkeypatch.setattr(Patched, "forward", wider)
    module = Patched()
    batch = torch.cat([x, torch.randn(fresh, 6)])
    with pytest.warns(Drifted, match=r"rows of \[3\] torch.float32.*answers \[6\]"):
        again = cache_rows(module, store=store)(batch)
    with torch.no_grad():
        assert torch.equal(again, module(batch))


class KeepsItsMode(nn.Module):
    """Dropout that keeps its training flag in an array of its own, through a property."""

    def __init__(self) -> None:
        self._mode = array.array("b", [1])
        super().__init__()

    @property
    def training(self) -> bool:  # type: ignore[override]
        return bool(self._mode[0])

    @training.setter
    def training(self, value: bool) -> None:
        self._mode[0] = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = nn.functional.dropout(x, 0.5, self.training)
        return out


def test_a_part_that_keeps_its_mode_elsewhere_put_in_train_mode_warns(store: Store) -> None:
    """A part whose class keeps its training flag elsewhere than its table of attributes
    (a property) is looked at too: put in train mode, it warns at the next forward
    and is put back in eval."""
    module = nn.Sequential(nn.Linear(6, 6), KeepsItsMode())
    cached = cache_rows(module, store)
    x = torch.randn(4, 6)
    first = cached(x)
    module[1].train()
    with pytest.warns(StillChanging, match="`1`.*train mode"):
        again = cached(x)
    assert not module[1].training
    assert torch.equal(again, first)
    cached.close()


def _train_mode_mid_run(monkeypatch: pytest.MonkeyPatch, part: nn.Module) -> list[bool]:
    """Has ``nn.Linear``'s forward put ``part`` in train mode from another thread, once, at
    its first call after ``True`` is put in the list returned: between the cache's check
    of the modes and a part after the layer (a Dropout)."""
    plain = nn.Linear.forward
    armed: list[bool] = []

    @functools.wraps(plain)
    def forward(self: nn.Linear, x: torch.Tensor) -> Any:
        if armed and armed.pop():
            other = threading.Thread(target=part.train)
            other.start()
            other.join()
        return plain(self, x)

    monkeypatch.setattr(nn.Linear, "forward", forward)
    return armed


@pytest.mark.parametrize("first", [True, False], ids=["first rows", "later rows"])
def test_a_part_put_in_train_mode_as_the_module_runs_answers_and_keeps_no_train_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch, first: bool
) -> None:
    """A part without weights (Dropout) put in train mode by another thread while the
    module computes a batch's rows is seen once they are computed — the first rows of
    the cache, whose module is looked at for answering each row alone, or later ones: it
    is warned of and put back in eval, the rows are computed again in eval, and rows
    computed in train mode are neither answered, kept, nor taken for rows mixed."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 64), nn.Dropout(0.5))
    armed = _train_mode_mid_run(monkeypatch, module[1])
    cached = cache_rows(module, store)
    if not first:
        cached(torch.randn(4, 6))
    x = torch.randn(8, 6)
    armed.append(True)
    with pytest.warns(StillChanging, match="`1`.*train mode"):
        out = cached(x)
    assert not module[1].training
    assert torch.equal(out, expected(module, x))
    assert torch.equal(cached(x), expected(module, x))  # what was kept
    cached.flush()
    assert torch.equal(cache_rows(module, Store(store.root))(x), expected(module, x))
    cached.close()


class _DoublesInPlace(nn.Module):
    """Doubles its batch in place, as its first part's answer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)


def test_a_batch_written_by_its_module_is_refused_before_it_would_run_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part put in train mode by another thread while the module runs a batch has the
    batch run again; a module that wrote into the batch it was handed as it ran would run
    again on what it wrote. It is refused as it first runs, before it could run again,
    and nothing is kept: an answer for the doubled batch is not the answer for the batch
    the cache was handed."""
    torch.manual_seed(0)
    module = nn.Sequential(_DoublesInPlace(), nn.Linear(6, 64), nn.Dropout(0.5))
    armed = _train_mode_mid_run(monkeypatch, module[2])
    cached = cache_rows(module, store)
    armed.append(True)
    with pytest.raises(RowsError, match=WRITE):
        cached(torch.randn(8, 6))
    cached.flush()
    assert cached.stats.rows_kept == 0
    cached.close()


def test_a_model_wrapped_whole_is_cached_per_row_in_a_fresh_process() -> None:
    """A model made by ``somatize.torch.wrap`` declared whole (``frozen=True``), cached per
    row before any such model first ran in the process, was refused at its first call
    (``RowsError``) saying ``Wrapped._values`` was changed in place since it was cached: the
    first look at the wrapped model filled in what the class holds as its default. It is
    cached, and recalls its rows. Run in a process of its own, where no wrapped model ran."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "import somatize.torch as smt\n"
        "from somatize_torch.rows import cache_rows\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU())\n"
        "wrapped = smt.wrap(model, frozen=True)\n"
        "smt.freeze(wrapped)\n"
        "cached = cache_rows(wrapped, None)\n"
        "x = torch.randn(3, 8)\n"
        "with torch.no_grad():\n"
        "    assert torch.equal(cached(x), model(x))\n"
        "    assert torch.equal(cached(x), model(x))\n"
        "print(cached.stats.computed, cached.stats.rows)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["3", "6"], done.stderr[-2000:]


class _Stemmed(nn.Module):
    """A stem, and a plain value its forward reads beside it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(6, 3)
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.stem(x) * self.gain
        return out


@pytest.mark.parametrize("declared", [True, ["stem"]], ids=["whole", "stem"])
def test_a_value_the_model_a_wrapped_model_wraps_reads_keys_its_rows(
    store: Store, declared: Any
) -> None:
    """A model made by ``somatize.torch.wrap``, cached per row, was keyed by the wrapper's
    own attributes, not by the model it wraps: a plain value the model's forward reads
    (``gain``), changed, had the rows computed with the old one recalled. Its rows are
    keyed by the model's values and hooks now: a model declared whole computes them again
    with the new one, or a hook registered on the model, and one whose forward was traced
    refuses the call, as the wrapped model refuses any call once a value its code was
    traced with changed."""
    model = _Stemmed()
    wrapped = smt.wrap(model, frozen=declared)
    smt.freeze(wrapped)
    cached = cache_rows(wrapped, store)
    x = torch.randn(4, 6)
    first = cached(x)
    if declared is True:
        model.gain = 2.0
        again = cached(x)
        assert cached.stats.computed == 8
        assert torch.equal(again, expected(model, x)) and not torch.equal(again, first)
        model.register_forward_hook(_triple)  # run by the model, as the wrapper calls it
        assert torch.equal(cached(x), expected(model, x)) and cached.stats.computed == 12
    else:
        wrapped.gain = 2.0  # the model's: its forward was traced reading it
        with pytest.raises(WrapError, match=r"`gain` was 1\.0 when `wrap` traced"):
            cached(x)
    cached.close()


def test_a_wrapped_model_with_a_part_cached_per_batch_recalls_its_rows(
    store: Store, tmp_path: Path
) -> None:
    """A model made by ``somatize.torch.wrap`` with a part cached per batch in a store
    counts that part's facts as it runs: cached per row, those counts were read as a
    setting of the model, so rows were keyed anew at each ``redeclare()`` (as
    ``CacheFrozen`` asks at each epoch) and never recalled. The wrapper's own counts are
    no part of the key: the rows are recalled."""
    wrapped = smt.wrap(_Stemmed(), frozen=["stem"], cached=["stem"], store=tmp_path / "parts")
    smt.freeze(wrapped)
    cached = cache_rows(wrapped, store)
    x = torch.randn(4, 6)
    first = cached(x)
    for _ in range(2):
        cached.flush()
        assert cached.redeclare() is False
        assert torch.equal(cached(x), first)
    assert cached.stats.computed == 4 and cached.keyed_anew == 0
    cached.close()


def test_prefill_refuses_a_tensor_or_a_dataset_for_a_loader(cached: CachedRows) -> None:
    """prefill handed a batch tensor or a map-style dataset instead of a loader of batches
    says so and what to hand it, keeping nothing: iterated, each gives single rows or
    samples that were each taken for a batch, so the prefill kept rows of their values no
    training step asks for and counted them as the rows it was handed."""
    data = images(6)
    with pytest.raises(TypeError, match=r"got a tensor of shape \[6, 3, 8, 8\].*`\[x\]`"):
        prefill(cached, data, progress=False)
    with pytest.raises(TypeError, match=r"got a `TensorDataset`, a dataset.*DataLoader\(dataset"):
        prefill(cached, TensorDataset(data, torch.arange(6)), progress=False)

    class Batches(torch.utils.data.Dataset[torch.Tensor]):  # each item a whole batch
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> torch.Tensor:
            return data[3 * i : 3 * i + 3]

    with pytest.raises(TypeError, match=r"`Batches`.*batch_size=None\)` where each"):
        prefill(cached, Batches(), progress=False)
    with pytest.raises(TypeError, match=r"takes a loader of batches .*got a `NoneType`"):
        prefill(cached, None, progress=False)  # type: ignore[arg-type]
    assert cached.stats.rows == 0
    assert prefill(cached, DataLoader(Batches(), batch_size=None), progress=False).rows == 6
    assert prefill(cached, [data], progress=False).rows == 6


def test_prefill_refuses_settings_of_the_wrong_kind(cached: CachedRows) -> None:
    """inputs= and convert= that are no function, and a progress= that is no bool (a
    string "no" would draw the bar), are refused by name before a batch runs."""
    batches = loader(images(16))
    with pytest.raises(TypeError, match=r"inputs= is a function of each loader item.*got 'x'"):
        prefill(cached, batches, inputs="x", progress=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"convert= is a function of each loader item"):
        prefill(cached, batches, convert=torch.half, progress=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"progress= is True or False, got 'no'"):
        prefill(cached, batches, progress="no")  # type: ignore[arg-type]
    assert cached.stats.rows == 0
