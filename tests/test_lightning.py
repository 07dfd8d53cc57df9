"""The Lightning callback: frozen submodules cached across epochs by a real Trainer on CPU."""

from __future__ import annotations

import copy
import csv
import gc
import io
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import uuid
import warnings
import weakref
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy
import pytest
import torch
from lightning.pytorch.callbacks import BackboneFinetuning, BaseFinetuning, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.autograd import forward_ad

from somatize import Node, SomatizeWarning, Store, StoreError
from somatize.store.local import LocalStore
from somatize.torch import freeze, wrap
from somatize.torch.lightning import (
    CacheFrozen,
    CacheFrozenError,
    CompiledSubmodule,
    EpochStats,
    FrozeTrainable,
    NeverHits,
    NotASubmodule,
    Uncached,
)
from somatize_torch.ahead import Ahead
from somatize_torch.deferred import Deferred
from somatize_torch.freeze import is_held
from somatize_torch.rows import CachedRows, RowsError, cache_rows
from tests.conftest_s3 import s3_options, s3_url
from tests.lightning_models import SAMPLES, Encoder, Probe, data, loader, trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning:lightning",  # Lightning's advice about workers and log intervals
    "ignore::DeprecationWarning",
    "ignore::FutureWarning",
)

REPO = Path(__file__).resolve().parent.parent


def epochs(callback: CacheFrozen, stage: str) -> list[EpochStats]:
    return [e for e in callback.history if e.stage == stage]


def test_epoch_two_recalls_every_row_and_logs_per_epoch(tmp_path: Path) -> None:
    """With a shuffled loader, epoch 1 computes every row, epoch 2 recalls every row,
    and the logger gets the hit rate, rows and bytes of each epoch."""
    model = Probe()
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    fit = trainer(tmp_path, 2, callbacks=[callback], logger=CSVLogger(tmp_path / "logs"))
    fit.fit(model, loader(shuffle=True))

    assert type(model.encoder) is Encoder and not is_held(model.encoder)  # handed back
    assert callback.cached["encoder"].module is model.encoder
    first, second = epochs(callback, "train")
    assert (first.rows.computed, first.rows.recalled) == (SAMPLES, 0)
    assert (second.rows.computed, second.rows.recalled) == (0, SAMPLES)
    assert second.hit_rate == 1.0
    assert first.rows.bytes_kept > 0

    with open(next((tmp_path / "logs").rglob("metrics.csv"))) as f:
        logged = [r for r in csv.DictReader(f) if r.get("cache/encoder/hit_rate")]
    assert [float(r["cache/encoder/hit_rate"]) for r in logged] == [0.0, 1.0]
    assert [float(r["cache/encoder/rows_computed"]) for r in logged] == [SAMPLES, 0]
    assert [float(r["cache/encoder/rows_recalled"]) for r in logged] == [0, SAMPLES]
    assert float(logged[0]["cache/encoder/bytes_kept"]) == first.rows.bytes_kept
    assert float(logged[1]["cache/encoder/lookup_s"]) > 0


def test_rows_of_the_sanity_check_are_not_counted_in_epoch_one(tmp_path: Path) -> None:
    """What the sanity check's validation batches keep in the store is nobody's epoch:
    training epoch 1 counts only the rows it kept itself."""
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    fit = trainer(tmp_path, 1, callbacks=[callback], num_sanity_val_steps=2)
    fit.fit(Probe(), loader(), loader(shuffle=False, seed=2))
    (epoch,) = epochs(callback, "train")
    assert (epoch.rows.computed, epoch.rows.rows_kept) == (SAMPLES, SAMPLES)


def test_the_progress_bar_shows_the_hit_rate_only_when_there_is_a_bar(tmp_path: Path) -> None:
    """With a progress bar, ``hit`` reaches it (1.0 once epoch 2 recalls everything);
    without a bar or a logger, nothing is handed to Lightning."""
    shown = trainer(
        tmp_path / "bar", 2, callbacks=[CacheFrozen(None, ["encoder"])], enable_progress_bar=True
    )
    shown.fit(Probe(), loader(shuffle=True))
    assert float(shown.progress_bar_metrics["hit"]) == 1.0

    hidden = trainer(tmp_path / "none", 2, callbacks=[CacheFrozen(None, ["encoder"])])
    hidden.fit(Probe(), loader(shuffle=True))
    assert "hit" not in hidden.progress_bar_metrics
    assert not [name for name in hidden.callback_metrics if name.startswith("cache/")]


def test_trained_head_equals_a_run_without_the_callback(tmp_path: Path) -> None:
    """The head trained through the cache has exactly the weights of one trained
    without it (same seed, deterministic algorithms)."""
    plain = Probe()
    trainer(tmp_path / "plain", 3).fit(plain, loader(shuffle=True))
    cached = Probe()
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    trainer(tmp_path / "cached", 3, callbacks=[callback]).fit(cached, loader(shuffle=True))

    assert epochs(callback, "train")[-1].hit_rate == 1.0
    assert not torch.equal(plain.head.weight, Probe().head.weight)  # it did train
    assert torch.equal(cached.head.weight, plain.head.weight)
    assert torch.equal(cached.head.bias, plain.head.bias)


def test_from_the_second_epoch_each_batch_is_named_ahead(tmp_path: Path) -> None:
    """From epoch 3 on (epoch 2 fetches in order, seeing that the loaders draw no random
    numbers), the training and validation loaders are fetched ahead and every forward
    finds its rows named on the other thread; the head trains exactly as with
    ``ahead=False``."""
    models = {}
    for ahead in (True, False):
        model = Probe()
        callback = CacheFrozen(tmp_path / f"store-{ahead}", ["encoder"], ahead=ahead)
        fit = trainer(tmp_path / str(ahead), 3, callbacks=[callback])
        fit.fit(model, loader(shuffle=True), loader(shuffle=False, seed=2))
        cached = callback.cached["encoder"]
        batches = 2 * SAMPLES // 16  # training and validation, in epoch 3
        assert cached.used_ahead == (batches if ahead else 0)
        assert cached.named_ahead == (batches if ahead else 0)
        assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0, 1.0]
        assert [e.hit_rate for e in epochs(callback, "validate")] == [0.0, 1.0, 1.0]
        models[ahead] = model
    assert torch.equal(models[True].head.weight, models[False].head.weight)


def test_loaders_with_persistent_workers_fetched_ahead_serve_the_stages_after_the_fit(
    tmp_path: Path,
) -> None:
    """Loaders with persistent workers, fetched ahead in the fit's third epoch, then
    handed to `validate` and `test`: Lightning shuts their workers down as the fit ends,
    and the next stage starts them again, as it does without the callback."""

    def persistent(dataset: Any, **options: Any) -> Any:
        return torch.utils.data.DataLoader(
            dataset, batch_size=16, num_workers=1, persistent_workers=True, **options
        )

    losses = []
    for cached in (True, False):
        train = persistent(
            loader().dataset, shuffle=True, generator=torch.Generator().manual_seed(7)
        )
        val = persistent(torch.utils.data.TensorDataset(*data(2)))
        callbacks = [CacheFrozen(tmp_path / "store", ["encoder"])] if cached else []
        fit = trainer(tmp_path / str(cached), 3, callbacks=callbacks)
        model = Probe()
        fit.fit(model, train, val)
        if cached:
            assert callbacks[0].cached["encoder"].used_ahead > 0
        losses.append(
            (fit.validate(model, val, verbose=False), fit.test(model, val, verbose=False))
        )
    assert losses[0] == losses[1]


class TakingTurns:
    """A loader of no length handing out its images in two buffers in turn, each filled in
    place: Lightning, which fetches the next batch of such a loader before it runs the step
    on the one it has, never fills the buffer of a batch whose step is still to come."""

    def __init__(self) -> None:
        self.images, self.labels = data()
        self.buffers = [torch.empty(16, *self.images.shape[1:]) for _ in range(2)]

    def __iter__(self) -> Any:
        for k in range(SAMPLES // 16):
            buffer = self.buffers[k % 2]
            buffer.copy_(self.images[16 * k : 16 * (k + 1)])
            yield buffer, self.labels[16 * k : 16 * (k + 1)].clone()


def test_a_loader_taking_turns_between_two_buffers_trains_as_without_the_callback(
    tmp_path: Path,
) -> None:
    """A loader of no length that fills two buffers in turn: fetched ahead, the batch after
    next would be filled into the buffer of the batch whose step Lightning is about to
    run. It is fetched in order, and the head trains exactly as without the callback."""
    heads = []
    for callbacks in ([CacheFrozen(None, ["encoder"])], []):
        model = Probe()
        trainer(tmp_path, 4, callbacks=callbacks).fit(model, TakingTurns())
        heads.append(model.head.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])


@pytest.mark.parametrize("tensor", ["conv.weight", "norm.running_mean"])
def test_a_changed_encoder_misses(tmp_path: Path, tensor: str) -> None:
    """A weight or a BatchNorm statistic changed between fits sharing a store is a new
    encoder: none of its rows are recalled; the unchanged encoder recalls them all."""
    store = tmp_path / "store"
    trainer(tmp_path, 1, callbacks=[CacheFrozen(store, ["encoder"])]).fit(Probe(), loader())

    same = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 1, callbacks=[same]).fit(Probe(), loader())
    assert epochs(same, "train")[0].rows.from_store == SAMPLES

    changed = Probe()
    with torch.no_grad():
        target = dict(changed.encoder.named_parameters()) | dict(changed.encoder.named_buffers())
        target[tensor].add_(0.01)
    other = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 1, callbacks=[other]).fit(changed, loader())
    stats = epochs(other, "train")[0].rows
    assert (stats.computed, stats.recalled) == (SAMPLES, 0)


class _Hotter(pl.Callback):
    """Doubles the encoder's gain at the end of the first training epoch."""

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 0:
            pl_module.encoder.module.gain = 2.0


def test_a_setting_changed_between_epochs_keys_rows_anew(tmp_path: Path) -> None:
    """A plain value the encoder reads, changed between epochs, is another encoder: the
    next epoch computes every row with it, and the one after recalls them."""
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    model = Probe()
    trainer(tmp_path, 3, callbacks=[callback, _Hotter()]).fit(model, loader(shuffle=True))
    rows = [e.rows for e in epochs(callback, "train")]
    assert [(r.computed, r.recalled) for r in rows] == [(SAMPLES, 0), (SAMPLES, 0), (0, SAMPLES)]


class Scheduled(Probe):
    """Sets the encoder's gain in its own epoch-start hook, which Lightning runs after
    the callbacks' epoch-start hooks."""

    def on_train_epoch_start(self) -> None:
        encoder = self.encoder.module if isinstance(self.encoder, CachedRows) else self.encoder
        encoder.gain = [1.0, 3.0, 3.0][self.current_epoch]


def test_a_setting_changed_in_the_modules_epoch_start_is_seen_that_epoch(tmp_path: Path) -> None:
    """A value the LightningModule changes in its own ``on_train_epoch_start`` keys that
    very epoch's rows anew: the head trains as without the callback."""
    callback = CacheFrozen(None, ["encoder"])
    cached, plain = Scheduled(), Scheduled()
    trainer(tmp_path, 3, callbacks=[callback]).fit(cached, loader())
    trainer(tmp_path, 3).fit(plain, loader())
    rows = [(e.rows.computed, e.rows.recalled) for e in epochs(callback, "train")]
    assert rows == [(SAMPLES, 0), (SAMPLES, 0), (0, SAMPLES)]
    assert torch.equal(cached.head.weight, plain.head.weight)


class Finetuned(Probe):
    """Trains its encoder too once a fine-tuning schedule unfreezes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        trains = any(p.requires_grad for p in self.encoder.parameters())
        self.encoder.train(trains)  # in eval while frozen, in train mode once unfrozen

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.head.parameters(), lr=self.lr)


def _fitted(root: Path, model: Finetuned, callbacks: list[pl.Callback], cache: bool) -> Finetuned:
    """``model`` fitted for three epochs with ``callbacks``, and with the encoder cached by
    the callback when ``cache``."""
    if cache:
        callbacks = [*callbacks, CacheFrozen(None, ["encoder"])]
    trainer(root, 3, callbacks=callbacks).fit(model, loader())
    return model


class _Unfreeze(pl.Callback):
    """A fine-tuning schedule: the encoder (held as ``backbone``) trains from epoch 2."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            pl_module.backbone.requires_grad_(True)
            trainer.optimizers[0].add_param_group({"params": list(pl_module.backbone.parameters())})


def test_an_encoder_unfrozen_by_a_schedule_trains_uncached(tmp_path: Path) -> None:
    """A fine-tuning schedule that unfreezes the encoder at epoch 2 gets it back uncached,
    training as without the callback (same encoder and head weights), with a warning."""

    def fit(cache: bool) -> Finetuned:
        model = Finetuned()
        model.backbone = model.encoder  # where the schedule finds it, cached or not
        return _fitted(tmp_path, model, [_Unfreeze()], cache)

    with pytest.warns(Uncached, match="`encoder` was unfrozen"):
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    assert torch.equal(cached.encoder.conv.weight, plain.encoder.conv.weight)
    assert not torch.equal(plain.encoder.conv.weight, Finetuned().encoder.conv.weight)
    assert torch.equal(cached.head.weight, plain.head.weight)


class _NormInEval(Probe):
    """Keeps its BatchNorm in eval from the fit's start while the rest is in train mode
    (a common recipe), and, with ``unfreeze``, trains its encoder from epoch 2."""

    def __init__(self, unfreeze: bool) -> None:
        super().__init__()
        self.unfreeze = unfreeze

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def on_fit_start(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass  # the encoder stays in the modes `on_fit_start` left

    def on_train_epoch_start(self) -> None:
        if self.unfreeze and self.current_epoch == 1:
            self.encoder.requires_grad_(True)
            self.trainer.optimizers[0].add_param_group({"params": list(self.encoder.parameters())})


@pytest.mark.parametrize("unfreeze", [True, False], ids=["unfrozen", "at teardown"])
def test_a_part_put_in_eval_while_cached_stays_in_eval_once_put_back(
    tmp_path: Path, unfreeze: bool
) -> None:
    """A BatchNorm the module puts in eval while its encoder is cached (``bn.eval()`` in
    ``on_fit_start``) is still in eval once the encoder is put back, unfrozen mid-fit or
    at teardown, through validations (Lightning's ``eval()`` and back): its running
    statistics, and the weights trained, are those of a run without the callback."""

    def fit(cache: bool) -> _NormInEval:
        model = _NormInEval(unfreeze)
        callbacks: list[pl.Callback] = [CacheFrozen(None, ["encoder"])] if cache else []
        run = trainer(tmp_path, 3, callbacks=callbacks, num_sanity_val_steps=1)
        run.fit(model, loader(), loader(shuffle=False))
        return model

    if unfreeze:
        with pytest.warns(Uncached, match="`encoder` was unfrozen"):
            cached = fit(cache=True)
    else:
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    modes = {name: m.training for name, m in cached.named_modules()}
    assert modes == {name: m.training for name, m in plain.named_modules()}
    assert not cached.encoder.norm.training and cached.encoder.conv.training
    norm, other = cached.encoder.norm, plain.encoder.norm
    assert torch.equal(norm.running_mean, other.running_mean)
    assert torch.equal(norm.running_var, other.running_var)
    assert torch.equal(cached.encoder.conv.weight, plain.encoder.conv.weight)
    assert torch.equal(cached.head.weight, plain.head.weight)


class _NormInEvalToValidate(Probe):
    """Runs its encoder in eval for its training steps only, and puts its BatchNorm in eval
    for validation (``norm.eval()`` in ``on_validation_epoch_start``), which Lightning's
    restore of every module's flag after validation undoes; ``again`` asks it once more
    in the validation step, after a ``self.eval()`` of its own."""

    def __init__(self, again: bool) -> None:
        super().__init__()
        self.again = again

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.encoder.train()

    def on_validation_epoch_start(self) -> None:
        self.encoder.norm.eval()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.again:
            self.eval()
            self.encoder.norm.eval()
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("again", [False, True], ids=["at epoch start", "in a step too"])
def test_a_part_put_in_eval_for_validation_is_back_in_train_mode_once_put_back(
    tmp_path: Path, again: bool
) -> None:
    """A BatchNorm the module puts in eval during validation, while its encoder is cached,
    is back in train mode once the encoder is put back, as Lightning's restore after
    validation leaves it without the callback (it was kept in eval, so a forward after the
    fit left the running statistics where a run without the callback updates them)."""

    def fit(cache: bool) -> _NormInEvalToValidate:
        model = _NormInEvalToValidate(again)
        callbacks: list[pl.Callback] = [CacheFrozen(None, ["encoder"])] if cache else []
        run = trainer(tmp_path, 2, callbacks=callbacks, num_sanity_val_steps=1)
        run.fit(model, loader(), loader(shuffle=False))
        return model

    cached, plain = fit(cache=True), fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    modes = {name: m.training for name, m in cached.named_modules()}
    assert modes == {name: m.training for name, m in plain.named_modules()}
    assert cached.encoder.norm.training
    assert torch.equal(cached.head.weight, plain.head.weight)
    x = data()[0][:16]
    with torch.no_grad():
        cached.encoder(x), plain.encoder(x)
    norm, other = cached.encoder.norm, plain.encoder.norm
    assert torch.equal(norm.running_mean, other.running_mean)
    assert torch.equal(norm.running_var, other.running_var)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_part_left_in_train_mode_in_a_model_in_eval_is_so_after_an_evaluation(
    tmp_path: Path, stage: str
) -> None:
    """A model handed to an evaluation in eval, its BatchNorm in train mode, is handed back
    so, as without the callback: Lightning's ``eval()`` for the evaluation is undone with
    every other mode asked during it (it put the BatchNorm in eval)."""

    def run(cache: bool) -> dict[str, bool]:
        model = Probe()
        model.eval()
        model.encoder.norm.train()
        callbacks: list[pl.Callback] = [CacheFrozen(None, ["encoder"])] if cache else []
        evaluation = trainer(tmp_path, 1, callbacks=callbacks)
        if stage == "predict":
            evaluation.predict(model, loader(shuffle=False))
        else:
            getattr(evaluation, stage)(model, loader(shuffle=False), verbose=False)
        assert not isinstance(model.encoder, CachedRows) and not is_held(model.encoder)
        return {name: m.training for name, m in model.named_modules()}

    modes = run(cache=True)
    assert modes == run(cache=False)
    assert modes["encoder.norm"] and not modes["encoder.conv"]


class _Swaps(Probe):
    """Loads its encoder's next weights into a new module at the second epoch's start."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.encoder = Encoder().requires_grad_(False)


def test_an_encoder_replaced_at_an_epochs_start_is_said_to_run_uncached(
    tmp_path: Path,
) -> None:
    """An encoder replaced by another module at an epoch's start runs uncached for the
    rest of the fit, and a warning says so (nothing did: the second epoch computed every
    row with no cache in sight); the module cached is given back as it was found, and
    the next stage caches the new one."""
    model = _Swaps()
    first, callback = model.encoder, CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached, match="`encoder` was replaced in the model by a `Encoder`"):
        trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert "encoder" not in callback.cached and len(epochs(callback, "train")) == 1
    assert not is_held(first) and model.encoder is not first
    new = model.encoder
    trainer(tmp_path, 1, callbacks=[callback]).test(model, loader(), verbose=False)
    (tested,) = epochs(callback, "test")
    assert callback.cached["encoder"].module is new and tested.rows.computed == SAMPLES


class _CallsAMethod(Probe):
    """Calls a method of its encoder (as a CLIP model's ``encode_image``), never the
    encoder itself; validates the same way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder.pool(torch.relu(self.encoder.norm(self.encoder.conv(x))))
        return self.head(features.flatten(1))


def test_a_named_module_the_fit_never_calls_is_said_to_run_uncached(tmp_path: Path) -> None:
    """A module named to the callback that the training epoch and the validation before
    it never called (the step runs a method of it, or its parts directly) is said once to
    have cached nothing, naming its parts to name instead; the fit trains as without the
    callback, and a module the step calls is not warned of."""
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached, match="never called `encoder`") as seen:
        trainer(tmp_path, 2, callbacks=[callback]).fit(
            _CallsAMethod(), loader(), loader(shuffle=False, seed=2)
        )
    said = [w for w in seen if issubclass(w.category, Uncached)]
    assert len(said) == 1
    assert "`encoder.conv`" in str(said[0].message)
    assert [e.rows.rows for e in epochs(callback, "train")] == [0, 0]

    called = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        trainer(tmp_path / "called", 2, callbacks=[called]).fit(Probe(), loader())
    assert [e.rows.rows for e in epochs(called, "train")] == [SAMPLES, SAMPLES]


class _BankAtEpochEnd(Probe):
    """Trains its head on the images themselves; its own ``on_train_epoch_end`` (which
    Lightning runs after the callbacks') takes the encoder's features of a bank of
    images, as a k-NN monitor does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean((2, 3)).repeat(1, 3)[:, :8])

    def on_train_epoch_end(self) -> None:
        with torch.no_grad():
            self.bank = self.encoder(data()[0][: SAMPLES // 4].to(self.device))


def test_a_module_a_training_epochs_end_hook_calls_is_not_said_never_called(
    tmp_path: Path,
) -> None:
    """A named module that only the LightningModule's own ``on_train_epoch_end`` calls
    (run after the callback's) is cached there, and not said never to have been called."""
    for epochs_run in (1, 2):
        callback = CacheFrozen(None, ["encoder"])
        with warnings.catch_warnings():
            warnings.simplefilter("error", SomatizeWarning)
            trainer(tmp_path / str(epochs_run), epochs_run, callbacks=[callback]).fit(
                _BankAtEpochEnd(), loader()
            )
        assert [e.rows.rows for e in epochs(callback, "train")] == [SAMPLES // 4] * epochs_run


class _WrapsInSetup(Probe):
    """Puts its encoder inside a module of its own in ``setup()``, which Lightning runs after
    the callbacks'."""

    def setup(self, stage: str) -> None:
        self.encoder = nn.Sequential(self.encoder, nn.Identity())


def test_an_encoder_a_modules_setup_puts_inside_another_is_handed_back_plain(
    tmp_path: Path,
) -> None:
    """A LightningModule whose own ``setup()`` puts the encoder the callback cached inside a
    module of its own is warned that it runs uncached, saying why ``setup()`` is too late,
    and gets its model back with the plain encoder inside that module, not the cache."""
    model = _WrapsInSetup()
    first = model.encoder
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached, match="runs the LightningModule's own `setup\\(\\)` after"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    assert model.encoder[0] is first and not is_held(first)
    assert not any(isinstance(part, CachedRows) for part in model.modules())


def test_an_encoder_put_back_uncached_stays_so_in_a_later_fit(tmp_path: Path) -> None:
    """A second fit of the same model, after a schedule put its encoder back uncached,
    leaves it as it is: not cached (and frozen) again; and so does an evaluation after it,
    the encoder frozen again or not (docs/lightning.md)."""
    model = Finetuned()
    model.backbone = model.encoder
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached):
        trainer(tmp_path, 2, callbacks=[_Unfreeze(), callback]).fit(model, loader())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozeTrainable)
        trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    assert not isinstance(model.encoder, CachedRows) and model.encoder.conv.weight.requires_grad
    model.encoder.requires_grad_(False)  # frozen again: an evaluation leaves it uncached too
    kept = len(callback.history)
    trainer(tmp_path, 1, callbacks=[callback]).validate(model, loader(shuffle=False))
    assert not isinstance(model.encoder, CachedRows) and len(callback.history) == kept


class _Dropping(nn.Module):
    """A conv encoder with dropout and no BatchNorm: only its dropout computes otherwise
    in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.drop = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.drop(torch.relu(self.conv(x)))).flatten(1)


class _Plain(nn.Module):
    """A conv encoder with no part that computes otherwise in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x))).flatten(1)


class LeftInTrainMode(Probe):
    """A probe whose encoder is frozen by ``requires_grad_(False)`` alone and never put in
    eval: it runs in the mode the fit finds it in, train mode. ``encoder`` picks it: the
    one with BatchNorm, one with dropout, or one with neither."""

    def __init__(self, encoder: str) -> None:
        super().__init__()
        if encoder != "norm":
            self.encoder = _Dropping() if encoder == "dropout" else _Plain()
            self.encoder.requires_grad_(False)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass


@pytest.mark.parametrize("encoder", ["norm", "dropout"])
def test_an_encoder_left_in_train_mode_trains_the_head_as_without_the_callback(
    tmp_path: Path, encoder: str
) -> None:
    """An encoder frozen by ``requires_grad_(False)`` alone runs in train mode in a plain
    fit (BatchNorm on batch statistics, dropout drawing): with the callback it runs so
    too, uncached from its first training batch, with a warning saying why and what to
    do, and the head trains exactly as without the callback."""

    def fit(cache: bool) -> LeftInTrainMode:
        model = LeftInTrainMode(encoder)
        callbacks: list[pl.Callback] = [CacheFrozen(tmp_path / "store", ["encoder"])]
        run = trainer(tmp_path, 2, callbacks=callbacks if cache else [], num_sanity_val_steps=1)
        run.fit(model, loader(), loader(shuffle=False, seed=2))
        return model

    with pytest.warns(
        Uncached, match=r"`encoder` would run in train mode.*`model.encoder.eval\(\)`"
    ):
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    modes = {name: m.training for name, m in cached.named_modules()}
    assert modes == {name: m.training for name, m in plain.named_modules()}
    assert not torch.equal(plain.head.weight, LeftInTrainMode(encoder).head.weight)
    assert torch.equal(cached.head.weight, plain.head.weight)
    assert torch.equal(cached.head.bias, plain.head.bias)
    if encoder == "norm":
        assert torch.equal(cached.encoder.norm.running_mean, plain.encoder.norm.running_mean)


class _ReadsItsMode(nn.Module):
    """A conv encoder with no BatchNorm and no dropout, whose one part that computes
    otherwise in train mode is ``kind``: a spectral norm (torch's parametrization, or the
    older hook), a randomized leaky ReLU, or a stacked LSTM dropping between its layers."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        if kind == "spectral":
            self.conv = nn.utils.parametrizations.spectral_norm(self.conv)
        elif kind == "spectral_hook":
            self.conv = nn.utils.spectral_norm(self.conv)
        self.act = nn.RReLU() if kind == "rrelu" else nn.ReLU()
        dropout = 0.5 if kind == "lstm" else 0.0
        self.lstm = nn.LSTM(8, 8, num_layers=2, dropout=dropout, batch_first=True)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.act(self.conv(x))).flatten(1)
        return self.lstm(features.unsqueeze(1))[0][:, 0]  # each row a sequence of one


class _ReadingItsMode(LeftInTrainMode):
    def __init__(self, kind: str) -> None:
        super().__init__("plain")
        self.encoder = _ReadsItsMode(kind)
        self.encoder.requires_grad_(False)


@pytest.mark.parametrize("kind", ["spectral", "spectral_hook", "rrelu", "lstm"])
def test_an_encoder_left_in_train_mode_with_a_part_reading_its_mode_runs_uncached(
    tmp_path: Path, kind: str
) -> None:
    """A spectral norm iterates (its vectors updated), an ``RReLU`` draws its slope and a
    stacked LSTM drops between its layers in train mode only: an encoder left in train
    mode with one runs uncached, with a warning naming it, and the head trains exactly as
    without the callback."""

    def fit(cache: bool) -> _ReadingItsMode:
        torch.manual_seed(0)
        model = _ReadingItsMode(kind)
        callbacks: list[pl.Callback] = [CacheFrozen(tmp_path / "store", ["encoder"])]
        trainer(tmp_path, 2, callbacks=callbacks if cache else []).fit(model, loader())
        return model

    with pytest.warns(Uncached, match=r"`encoder` would run in train mode"):
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and cached.encoder.training
    assert torch.equal(cached.head.weight, plain.head.weight)
    assert torch.equal(cached.head.bias, plain.head.bias)


def test_an_encoder_left_in_train_mode_with_nothing_that_moves_is_cached(tmp_path: Path) -> None:
    """An encoder left in train mode with no part that computes otherwise there (no
    BatchNorm, no dropout) answers the same in either mode: it is cached, without a
    warning, and the head trains as without the callback."""
    plain = LeftInTrainMode("plain")
    trainer(tmp_path / "plain", 2).fit(plain, loader())
    model = LeftInTrainMode("plain")
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        trainer(tmp_path / "cached", 2, callbacks=[callback]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    assert model.encoder.training and not is_held(model.encoder)
    assert torch.equal(model.head.weight, plain.head.weight)


class Adapted(Probe):
    """A probe with a trainable part upstream of its frozen encoder — a 1x1 convolution
    normalizing the images, trained through the encoder with the head — or, ``tangent``,
    one that feeds the head the encoder's jvp along the adapted images, through a dual
    tensor (``forward_ad.make_dual``) where no gradient is recorded."""

    def __init__(self, tangent: bool = False) -> None:
        super().__init__()
        self.adapter = nn.Conv2d(3, 3, 1)
        self.tangent = tangent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adapted = self.adapter(x)
        if not self.tangent:
            return self.head(self.encoder(adapted))
        with torch.no_grad(), forward_ad.dual_level():
            dual = forward_ad.make_dual(x, adapted.detach())
            features, jvp = forward_ad.unpack_dual(self.encoder(dual))
        return self.head(features if jvp is None else features + jvp)  # none in inference_mode

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trained = [*self.adapter.parameters(), *self.head.parameters()]
        return torch.optim.SGD(trained, lr=self.lr)


@pytest.mark.parametrize("tangent", [False, True], ids=["grad", "tangent"])
def test_an_encoder_handed_a_batch_that_requires_grad_trains_what_is_upstream_uncached(
    tmp_path: Path, tangent: bool
) -> None:
    """An encoder handed a batch that requires grad (a trainable part upstream of it) or
    carries a forward-mode tangent, whose answers a recalled row would cut, runs uncached
    from that very batch for the rest of the fit, with a warning saying why and what to
    do, rather than stopping the fit: the part upstream and the head train exactly as
    without the callback. A later stage, where nothing requires grad, caches it again."""
    validation = loader(shuffle=False, seed=2)

    def fit(callbacks: list[pl.Callback]) -> Adapted:
        model = Adapted(tangent)
        run = trainer(tmp_path, 2, callbacks=callbacks, num_sanity_val_steps=1)
        run.fit(model, loader(), validation)
        return model

    callback = CacheFrozen(None, ["encoder"])
    cut = "carries a forward-mode tangent" if tangent else "requires grad"
    with pytest.warns(Uncached, match=rf"`encoder` is handed a batch that {cut}.*freeze"):
        cached = fit([callback])
    plain = fit([])
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    trained = "head" if tangent else "adapter"  # a tangent trains nothing upstream
    assert not torch.equal(getattr(plain, trained).weight, getattr(Adapted(), trained).weight)
    for name, weight in plain.named_parameters():
        assert torch.equal(cached.get_parameter(name), weight), name
    assert "encoder" not in callback.cached
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        for _ in range(2):
            trainer(tmp_path, 1, callbacks=[callback]).validate(
                model=cached, dataloaders=validation, verbose=False
            )
    assert [e.hit_rate for e in epochs(callback, "validate")] == [0.0, 1.0]


class PutInTrainModeLater(LeftInTrainMode):
    """A probe whose encoder, put in eval before fitting, its own hook puts partly in train
    mode at the second epoch's start: its BatchNorm alone, as a recipe that adapts the
    statistics to new data does."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.encoder.norm.train()


def test_an_encoder_put_in_train_mode_after_its_first_epoch_runs_uncached_from_then(
    tmp_path: Path,
) -> None:
    """An encoder cached through a first epoch in eval whose BatchNorm a hook then puts in
    train mode runs uncached from that very batch, warned of, the modes looked at anew once
    one is asked: the head trains as without the callback."""

    def fit(callbacks: list[pl.Callback]) -> PutInTrainModeLater:
        model = PutInTrainModeLater("norm")
        model.encoder.eval()
        trainer(tmp_path, 3, callbacks=callbacks).fit(model, loader())
        return model

    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached, match=r"`encoder` would run in train mode"):
        cached = fit([callback])
    plain = fit([])
    assert [e.hit_rate for e in epochs(callback, "train")][:1] == [0.0]
    assert cached.encoder.norm.training and not is_held(cached.encoder)
    assert torch.equal(cached.head.weight, plain.head.weight)
    assert torch.equal(cached.encoder.norm.running_mean, plain.encoder.norm.running_mean)


def test_an_encoder_put_in_eval_before_fitting_is_cached(tmp_path: Path) -> None:
    """An encoder put in eval before fitting (``model.encoder.eval()``, as the warning of
    one left in train mode says) stays so through the fit, validations included: it is
    cached, and the head trains as without the callback."""

    def fit(callbacks: list[pl.Callback]) -> LeftInTrainMode:
        model = LeftInTrainMode("norm")
        model.encoder.eval()
        run = trainer(tmp_path, 2, callbacks=callbacks, num_sanity_val_steps=1)
        run.fit(model, loader(), loader(shuffle=False, seed=2))
        return model

    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        cached = fit([callback])
    plain = fit([])
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    assert not cached.encoder.training
    assert torch.equal(cached.head.weight, plain.head.weight)


def test_validating_a_module_named_that_requires_grad_warns_nothing(tmp_path: Path) -> None:
    """Nothing trains in validate or test, so freezing a named module there is no loss."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozeTrainable)
        trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).validate(Tuned(), loader())


class FrozenInSetup(Probe):
    """A probe whose encoder requires grad until its own ``setup()``, which Lightning runs
    after the callbacks', freezes it there: by ``requires_grad_(False)`` and ``eval()``, or
    by ``requires_grad_(False)`` alone (``how``), as in ``LeftInTrainMode``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.encoder.requires_grad_(True)
        self.how = how

    def setup(self, stage: str) -> None:
        self.encoder.requires_grad_(False)
        if self.how == "eval":
            self.encoder.eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass


@pytest.mark.parametrize("how", ["eval", "train"])
def test_an_encoder_frozen_in_the_modules_own_setup_is_taken_as_frozen_before_fitting(
    tmp_path: Path, how: str
) -> None:
    """An encoder a LightningModule freezes in its own ``setup()`` is looked at once that
    has run, as one frozen before fitting: put in eval there, it is cached without a
    warning; left in train mode, it runs uncached so, warned of as such (not as one that
    would train). Either way the head trains as without the callback, and the encoder is
    handed back frozen, in the modes a plain fit leaves it in."""

    def fit(callbacks: list[pl.Callback]) -> FrozenInSetup:
        model = FrozenInSetup(how)
        run = trainer(tmp_path, 2, callbacks=callbacks, num_sanity_val_steps=1)
        run.fit(model, loader(), loader(shuffle=False, seed=2))
        return model

    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", SomatizeWarning)
        cached = fit([callback])
    plain = fit([])
    kinds = [type(w.message) for w in said if isinstance(w.message, SomatizeWarning)]
    assert kinds == ([] if how == "eval" else [Uncached])
    hits = [e.hit_rate for e in epochs(callback, "train")]
    assert hits == ([0.0, 1.0] if how == "eval" else [])
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    assert not any(p.requires_grad for p in cached.encoder.parameters())
    modes = {name: m.training for name, m in cached.named_modules()}
    assert modes == {name: m.training for name, m in plain.named_modules()}
    assert not torch.equal(plain.head.weight, FrozenInSetup(how).head.weight)
    assert torch.equal(cached.head.weight, plain.head.weight)
    assert torch.equal(cached.encoder.norm.running_mean, plain.encoder.norm.running_mean)


class Sampled(Probe):
    """Predicts with its dropout drawing (Monte Carlo dropout): every dropout of the model,
    the encoder's included, is put in train mode when predicting starts. Its encoder
    requires grad, as one loaded from a fine-tuned checkpoint does."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = _Dropping()

    def on_predict_start(self) -> None:
        for part in self.modules():
            if isinstance(part, nn.Dropout):
                part.train()

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out: torch.Tensor = self.encoder(batch[0])
        return out


def test_a_part_put_in_train_mode_in_an_evaluation_runs_uncached_though_the_module_requires_grad(
    tmp_path: Path,
) -> None:
    """In validate, test or predict nothing trains, and a named module requiring grad is
    cached without a warning, as a frozen one is: a part of it put in train mode there
    (dropout drawing, to sample predictions) has it run uncached, in that mode, as without
    the callback, saying so; it is not held in eval, answering every sample alike."""

    def predict(callbacks: list[pl.Callback]) -> torch.Tensor:
        model = Sampled()
        assert all(p.requires_grad for p in model.encoder.parameters())
        torch.manual_seed(11)  # the dropout's draws
        run = trainer(tmp_path, 1, callbacks=callbacks)
        predictions = run.predict(model, loader(shuffle=False))
        assert predictions is not None
        return torch.cat([torch.as_tensor(p) for p in predictions])

    plain = predict([])
    with pytest.warns(Uncached, match=r"`encoder` would run in train mode.*`drop`"):
        cached = predict([CacheFrozen(None, ["encoder"])])
    assert torch.equal(cached, plain)


class Weighted(torch.utils.data.Dataset[Any]):
    """Clean images, each with a loss weight drawn from torch's generator when fetched."""

    def __init__(self) -> None:
        self.images, self.labels = data()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i], torch.rand(())


class Dropped(Probe):
    """A head with dropout, trained on the weighted loss."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, weight = batch
        with torch.no_grad():
            features = self.encoder(x)
        losses = nn.functional.cross_entropy(self.head(self.drop(features)), y, reduction="none")
        return (losses * weight).mean()


def test_a_loader_drawing_random_numbers_is_not_fetched_ahead(tmp_path: Path) -> None:
    """A Dataset that draws random numbers as it is fetched (a loss weight), with a head
    that draws its own (dropout): fetching ahead would change which numbers each draws,
    so such a loader is fetched in order, and the head trains as without the callback."""
    heads = []
    for callbacks in ([CacheFrozen(None, ["encoder"])], []):
        pl.seed_everything(0)
        model = Dropped()
        data_loader = torch.utils.data.DataLoader(Weighted(), batch_size=16, shuffle=True)
        trainer(tmp_path, 3, callbacks=callbacks).fit(model, data_loader)
        heads.append(model.head.weight.detach().clone())
        if callbacks:
            assert [e.hit_rate for e in epochs(callbacks[0], "train")] == [0.0, 1.0, 1.0]
            assert callbacks[0].cached["encoder"].named_ahead == 0
    assert torch.equal(heads[0], heads[1])


class Indexed(Probe):
    """Calls its encoder by sample index (once it is cached), in training and validation."""

    def _features(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if isinstance(self.encoder, CachedRows):
            return self.encoder(x, index=index)
        out: torch.Tensor = self.encoder(x)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        return nn.functional.cross_entropy(self.head(self._features(x, index)), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y, index = batch
        self.log("val_loss", nn.functional.cross_entropy(self.head(self._features(x, index)), y))


def _indexed(seed: int) -> torch.utils.data.DataLoader[Any]:
    images, labels = data(seed)
    dataset = torch.utils.data.TensorDataset(images, labels, torch.arange(len(images)))
    return torch.utils.data.DataLoader(dataset, batch_size=16)


def test_index_keys_of_the_callbacks_version_are_kept_apart_per_stage(tmp_path: Path) -> None:
    """With ``key="index"`` and the callback's ``version``, a validation sample 0 is not the
    training sample 0: validation computes its own rows, and its loss is that of a run
    without the callback."""
    results = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = Indexed()
        fit = trainer(tmp_path, 2, callbacks=callbacks)
        fit.fit(model, _indexed(1), _indexed(2))
        results.append(float(fit.callback_metrics["val_loss"]))
        if callbacks:
            rows = [(e.rows.computed, e.rows.recalled) for e in epochs(callbacks[0], "validate")]
            assert rows == [(SAMPLES, 0), (0, SAMPLES)]
    assert results[0] == results[1]


def test_a_validation_loader_prefilled_by_index_is_keyed_as_its_samples(tmp_path: Path) -> None:
    """Keyed by index under the callback's version, a validation loader prefilled as one
    (``stage="validate"``) keeps its rows as the validation samples: the training sample
    of the same index is not answered with them, so training computes its own, the
    validation recalls those prefilled, and the head and loss are those of a run without
    the callback. Prefilled as training samples, the default, it would answer them."""

    def indices(item: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return item[0], item[2]

    results = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = Indexed()
        if callbacks:
            callbacks[0].prefill(_indexed(2), inputs=indices, stage="validate", progress=False)
        fit = trainer(tmp_path, 1, callbacks=callbacks)
        fit.fit(model, _indexed(1), _indexed(2))
        results.append((float(fit.callback_metrics["val_loss"]), model.head.weight))
        if callbacks:
            (warm,) = epochs(callbacks[0], "prefill")
            assert warm.rows.computed == SAMPLES
            assert [e.rows.computed for e in epochs(callbacks[0], "train")] == [SAMPLES]
            assert [e.rows.recalled for e in epochs(callbacks[0], "validate")] == [SAMPLES]
    (loss, head), (plain_loss, plain_head) = results
    assert loss == plain_loss and torch.equal(head, plain_head)


class IndexedKeepingLosses(Indexed):
    """Keeps each validation batch's loss, those of a tuner's trials too (whose logger is
    a dummy)."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y, index = batch
        self.losses.append(
            float(nn.functional.cross_entropy(self.head(self._features(x, index)), y))
        )


def test_a_tuners_trials_keyed_by_index_are_answered_as_without_the_callback(
    tmp_path: Path,
) -> None:
    """``Tuner.lr_find`` runs the trainer's loops with its own callbacks in place of the
    trainer's, so none of this callback's hooks runs in its trials: keyed by index under
    the callback's version, a validation there would be answered with the training
    samples of the same indices, and kept as them, for the fit after it to train on. The
    cached module answers the trials itself, uncached: the losses they see and the head
    the fit trains are those of a run without the callback."""
    results = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = IndexedKeepingLosses()
        images, labels = data(1)
        train = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(images, labels, torch.arange(SAMPLES)),
            batch_size=16,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
        )
        fit = trainer(tmp_path, 2, callbacks=callbacks, limit_train_batches=1)
        Tuner(fit).lr_find(model, train, _indexed(2), num_training=2, early_stop_threshold=None)
        tried = list(model.losses)
        fit.fit(model, train, _indexed(2))
        results.append((tried, model.losses, model.head.weight))
    (tried, losses, head), (plain_tried, plain_losses, plain_head) = results
    assert tried and tried == plain_tried
    assert losses == plain_losses and torch.equal(head, plain_head)


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"stage": "fit"}, "stage='fit'"),
        ({"stage": "validate", "dataloader_idx": -1}, "dataloader_idx=-1"),
        ({"stage": "train", "dataloader_idx": 1}, "one training loader"),
    ],
)
def test_a_prefill_keyed_as_no_stages_loader_is_refused(
    options: dict[str, Any], refusal: str
) -> None:
    """A prefill names the loader it stands for by a stage the callback keys rows as and
    that stage's loader index: anything else is refused when it is asked for."""
    callback = CacheFrozen(None, ["encoder"], key="index", version="toy@1")
    with pytest.raises(ValueError, match=re.escape(refusal)):
        callback.prefill(_indexed(2), **options)


@pytest.mark.parametrize(
    ("loader", "options", "refusal"),
    [
        (torch.randn(6, 4), {}, "got a tensor of shape [6, 4]"),
        (torch.utils.data.TensorDataset(torch.randn(6, 4)), {}, "a dataset"),
        ([torch.randn(6, 4)], {"progress": "no"}, "progress= is True or False, got 'no'"),
        ([torch.randn(6, 4)], {"inputs": "x"}, "inputs= is a function of each loader item"),
    ],
)
def test_a_prefill_of_what_is_no_loader_of_batches_is_refused_when_asked(
    loader: Any, options: dict[str, Any], refusal: str
) -> None:
    """cache.prefill of a tensor or a map-style dataset (iterated, rows or samples each
    taken for a batch), or with a progress= that is no bool or an inputs= that is no
    function, is refused when it is asked for, as prefill refuses them, naming the call:
    not once fitting starts, nor let through under DDP, where each rank is handed its
    share of the loader as a generator of its items and progress= is and-ed with the rank
    being the first ("no" drew a bar)."""
    callback = CacheFrozen(None, ["encoder"])
    with pytest.raises(TypeError, match=re.escape(refusal)):
        callback.prefill(loader, **options)
    callback.prefill([torch.randn(6, 4)], progress=False)  # a list of batches is one


class IndexedInHooks(Indexed):
    """Calls its encoder by index in its own stage hooks too, as a k-NN monitor takes
    the features of a whole evaluation set, keeping each hook's features."""

    def __init__(self, evaluated: torch.Tensor, trained: torch.Tensor) -> None:
        super().__init__()
        self.evaluated, self.trained = evaluated, trained
        self.seen: dict[str, list[torch.Tensor]] = {}

    def _all(self, hook: str, images: torch.Tensor) -> None:
        with torch.no_grad():
            features = self._features(images, torch.arange(len(images)))
        self.seen.setdefault(hook, []).append(features)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y, index = batch
        self.log("test_loss", nn.functional.cross_entropy(self.head(self._features(x, index)), y))

    def on_validation_start(self) -> None:
        self._all("validation_start", self.evaluated)

    def on_validation_epoch_end(self) -> None:
        self._all("validation_epoch_end", self.evaluated)

    def on_validation_end(self) -> None:
        self._all("validation_end", self.evaluated)

    def on_test_start(self) -> None:
        self._all("test_start", self.evaluated)

    def on_test_epoch_end(self) -> None:
        self._all("test_epoch_end", self.evaluated)

    def on_train_epoch_end(self) -> None:
        self._all("train_epoch_end", self.trained)


def test_a_modules_own_evaluation_hooks_are_handed_that_stages_samples(tmp_path: Path) -> None:
    """Keyed by index under the callback's version, the LightningModule's own hooks that
    start and end an evaluation (which Lightning runs after the callback's, before its epoch
    starts and after it ends) get the evaluation samples' features, not the training
    samples' of the same index, and keep none of theirs as training rows; training goes on
    keyed as itself after a validation inside its epoch: every hook, and the trained head,
    are as without the callback."""
    runs = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = IndexedInHooks(data(2)[0], data(1)[0])
        check = trainer(
            tmp_path, 2, callbacks=callbacks, num_sanity_val_steps=1, val_check_interval=0.5
        )
        check.validate(model, _indexed(2), verbose=False)
        check.fit(model, _indexed(1), _indexed(2))
        check.test(model, _indexed(2), verbose=False)
        runs.append(({k: torch.cat(v) for k, v in model.seen.items()}, model.head.weight))
    (cached, head), (plain, plain_head) = runs
    assert cached.keys() == plain.keys()
    for hook in plain:
        assert torch.equal(cached[hook], plain[hook]), hook
    assert torch.equal(head, plain_head)


class Monitored(Probe):
    """Takes the features of a fixed bank in its own validation hooks, as a k-NN monitor
    does: at the stage's start, at its epoch's end and at its end."""

    def __init__(self, bank: torch.Tensor) -> None:
        super().__init__()
        self.bank = bank

    def _take_bank(self) -> None:
        with torch.no_grad():
            self.encoder(self.bank.to(self.device))

    def on_validation_start(self) -> None:
        self._take_bank()

    def on_validation_epoch_end(self) -> None:
        self._take_bank()

    def on_validation_end(self) -> None:
        self._take_bank()


def test_rows_of_a_modules_own_evaluation_hooks_are_counted_as_that_stages(
    tmp_path: Path,
) -> None:
    """Rows the LightningModule computes in its own validation start and end hooks are
    counted in that validation's epoch, not the training epoch's nor dropped; so a bank
    that hits there does not hide that an augmented training set never does."""
    callback = CacheFrozen(None, ["encoder"])
    bank = data(3)[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer(tmp_path, 3, callbacks=[callback]).fit(
            Monitored(bank), loader(noisy=True), loader(shuffle=False, seed=2)
        )
    train = [(e.rows.rows, e.rows.recalled) for e in epochs(callback, "train")]
    assert train == [(SAMPLES, 0)] * 3
    validate = [(e.rows.computed, e.rows.recalled) for e in epochs(callback, "validate")]
    # Epoch 1 computes the validation set and the bank once, and recalls the bank twice.
    assert validate[0] == (2 * SAMPLES, 2 * SAMPLES)
    assert validate[1:] == [(0, 4 * SAMPLES)] * 2
    never = [w for w in seen if issubclass(w.category, NeverHits)]
    assert len(never) == 1
    assert "random augmentation" in str(never[0].message)


class IndexedTwice(Indexed):
    """Validates on several loaders, keeping each one's features."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[torch.Tensor]] = {}

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, _, index = batch
        self.seen.setdefault(dataloader_idx, []).append(self._features(x, index))


def test_each_evaluation_loader_keys_its_own_rows(tmp_path: Path) -> None:
    """Keyed by index under the callback's version, two validation loaders (each with a
    sample 0) key their rows apart: each gets its own samples' features, as without the
    callback. Two training loaders keyed under that version are refused."""
    features = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = IndexedTwice()
        check = trainer(tmp_path, 1, callbacks=callbacks, limit_val_batches=1)
        check.validate(model, [_indexed(2), _indexed(3)], verbose=False)
        features.append({k: torch.cat(v) for k, v in model.seen.items()})
    assert torch.equal(features[0][0], features[1][0])
    assert torch.equal(features[0][1], features[1][1])

    callback = CacheFrozen(None, ["encoder"], key="index", version="toy@1")
    with pytest.raises(CacheFrozenError, match="2 loaders whose samples it cannot tell apart"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(
            Indexed(), {"a": _indexed(1), "b": _indexed(2)}
        )


class IndexedTogether(Indexed):
    """Evaluates on a dict of loaders handed to each step at once, keeping each one's
    features."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, list[torch.Tensor]] = {}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        for name, (x, _, index) in batch.items():
            self.seen.setdefault(name, []).append(self._features(x, index))

    test_step = validation_step


def test_evaluation_loaders_handed_to_one_step_keyed_by_index_are_refused(
    tmp_path: Path,
) -> None:
    """Two evaluation loaders in a CombinedLoader whose every batch holds one of each
    (mode "max_size") come to a step with no loader index to key them apart by: keyed by
    index under the callback's version, the second loader's rows would be answered with
    the first one's. Refused, as two training loaders are; in mode "sequential" each gets
    its own samples' features, as without the callback."""
    from lightning.pytorch.utilities import CombinedLoader

    for run in ("validate", "test"):
        callback = CacheFrozen(None, ["encoder"], key="index", version="toy@1")
        together = CombinedLoader({"a": _indexed(2), "b": _indexed(3)}, "max_size")
        check = trainer(
            tmp_path, 1, callbacks=[callback], limit_val_batches=1, limit_test_batches=1
        )
        with pytest.raises(CacheFrozenError, match="2 loaders whose samples it cannot tell apart"):
            getattr(check, run)(IndexedTogether(), together, verbose=False)

    features = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = IndexedTwice()
        check = trainer(tmp_path, 1, callbacks=callbacks, limit_val_batches=1)
        in_turn = CombinedLoader([_indexed(2), _indexed(3)], "sequential")
        check.validate(model, in_turn, verbose=False)
        features.append({k: torch.cat(v) for k, v in model.seen.items()})
    assert torch.equal(features[0][1], features[1][1])


class InHooksOverLoaders(IndexedInHooks):
    """:class:`IndexedInHooks` evaluating on several loaders."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, _, index = batch
        self._features(x, index)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, _, index = batch
        self._features(x, index)


def test_a_modules_own_hooks_after_several_loaders_are_handed_the_first_loaders_samples(
    tmp_path: Path,
) -> None:
    """Keyed by index under the callback's version, the LightningModule's own hooks that end
    an evaluation over several loaders get the first loader's samples, as the hook that
    started it did, not those of the loader that ran last under the same indices: every
    hook is as without the callback."""
    runs = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = InHooksOverLoaders(data(2)[0], data(1)[0])
        check = trainer(tmp_path, 1, callbacks=callbacks)
        check.validate(model, [_indexed(2), _indexed(3)], verbose=False)
        check.test(model, [_indexed(2), _indexed(3)], verbose=False)
        runs.append({k: torch.cat(v) for k, v in model.seen.items()})
    cached, plain = runs
    assert cached.keys() == plain.keys()
    for hook in plain:
        assert torch.equal(cached[hook], plain[hook]), hook


def test_prefill_in_true_half_precision(tmp_path: Path) -> None:
    """prefill converts its batches as the trainer's precision converts training batches."""
    callback = CacheFrozen(None, ["encoder"])
    callback.prefill(loader(shuffle=False), progress=False)
    trainer(tmp_path, 1, callbacks=[callback], precision="bf16-true").fit(Probe(), loader())
    assert epochs(callback, "train")[0].rows.recalled == SAMPLES


def test_no_warning_for_epochs_of_part_of_the_data(tmp_path: Path) -> None:
    """Epochs limited to one batch of a shuffled loader may share no sample: that is not a
    random augmentation, and nothing warns."""
    callback = CacheFrozen(None, ["encoder"])
    images, labels = data(samples=2048)
    shuffled = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(3),
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fit = trainer(tmp_path, 3, callbacks=[callback], limit_train_batches=1)
        fit.fit(Probe(), shuffled)
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 0.0, 0.0]
    assert not [w for w in seen if issubclass(w.category, NeverHits)]


@pytest.mark.parametrize(
    ("limit", "shuffle"),
    [(4, True), (10, True), (3, False), (0.75, False)],
    ids=["int-whole", "int-over", "int-first-batches", "fraction-first-batches"],
)
def test_random_augmentation_warns_under_a_limit_whose_epochs_share_their_samples(
    tmp_path: Path, limit: float, shuffle: bool
) -> None:
    """A ``limit_train_batches`` that takes in every batch of the loader, or cuts an
    unshuffled one to its first batches, hands every epoch the samples of the one before:
    inputs that never hit then warn, as they do with no limit."""
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = trainer(tmp_path, 3, callbacks=[callback], limit_train_batches=limit)
        run.fit(Probe(), loader(shuffle=shuffle, noisy=True))
    never = [w for w in seen if issubclass(w.category, NeverHits)]
    assert len(never) == 1
    assert "random augmentation" in str(never[0].message)
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0] * 3


def test_no_warning_for_the_first_batches_of_a_shuffled_loader(tmp_path: Path) -> None:
    """The first three of four batches of a shuffled loader share some samples from
    epoch to epoch, which are recalled, and nothing warns."""
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = trainer(tmp_path, 3, callbacks=[callback], limit_train_batches=3)
        run.fit(Probe(), loader())
    assert all(e.rows.recalled for e in epochs(callback, "train")[1:])
    assert not [w for w in seen if issubclass(w.category, NeverHits)]


def test_validation_test_and_predict_use_the_cache(tmp_path: Path) -> None:
    """Validation recalls in its second epoch what it computed in its first; test and
    predict recall what fitting kept."""
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    model = Probe()
    fit = trainer(tmp_path, 2, callbacks=[callback], logger=CSVLogger(tmp_path / "logs"))
    fit.fit(model, loader(seed=1), loader(shuffle=False, seed=2))

    first, second = epochs(callback, "validate")
    assert (first.rows.computed, first.rows.recalled) == (SAMPLES, 0)
    assert (second.rows.computed, second.rows.recalled) == (0, SAMPLES)
    assert fit.callback_metrics["cache/encoder/val_hit_rate"] == 1.0

    fit.test(model, loader(shuffle=False, seed=2))
    assert epochs(callback, "test")[0].rows.recalled == SAMPLES
    assert fit.callback_metrics["cache/encoder/test_hit_rate"] == 1.0
    fit.predict(model, loader(shuffle=False, seed=1))
    assert epochs(callback, "predict")[0].rows.recalled == SAMPLES


class _Counted(torch.utils.data.Dataset[torch.Tensor]):
    """Images indexed by sample, counting the samples loaded."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.loaded += 1
        return self.images[i]


def test_deferred_images_are_loaded_only_to_compute_their_rows(tmp_path: Path) -> None:
    """Keyed by index with `Deferred` datasets, the LightningModule's own code is unchanged:
    training and validation each load every image once in epoch 1 and none after, each
    set keyed by its own version, and the head trains exactly as without the callback."""
    plain = Probe()
    trainer(tmp_path / "plain", 3).fit(plain, loader(seed=1), loader(shuffle=False, seed=2))

    (train_images, train_labels), (val_images, val_labels) = data(1), data(2)
    train, val = _Counted(train_images), _Counted(val_images)
    order = torch.Generator().manual_seed(7)  # the plain run's shuffle
    train_loader = torch.utils.data.DataLoader(
        Deferred(train, train_labels, version="train@1"),
        batch_size=16,
        shuffle=True,
        generator=order,
    )
    val_loader = torch.utils.data.DataLoader(
        Deferred(val, val_labels, version="val@1"), batch_size=16
    )
    callback = CacheFrozen(tmp_path / "store", ["encoder"], key="index")
    model = Probe()
    trainer(tmp_path / "cached", 3, callbacks=[callback]).fit(model, train_loader, val_loader)

    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0, 1.0]
    assert [e.hit_rate for e in epochs(callback, "validate")] == [0.0, 1.0, 1.0]
    assert (train.loaded, val.loaded) == (SAMPLES, SAMPLES)
    assert torch.equal(model.head.weight, plain.head.weight)
    assert torch.equal(model.head.bias, plain.head.bias)


def test_deferred_images_in_true_half_precision(tmp_path: Path) -> None:
    """Under ``precision="bf16-true"`` (the model in bfloat16, batch tensors converted by
    Lightning) deferred images, which only the cache sees, run in bfloat16 too, and
    epoch 2 recalls every row."""
    images, labels = data(1)
    deferred = torch.utils.data.DataLoader(
        Deferred(images, labels, version="train@1"), batch_size=16, shuffle=True
    )
    callback = CacheFrozen(tmp_path / "store", ["encoder"], key="index")
    trainer(tmp_path, 2, callbacks=[callback], precision="bf16-true").fit(Probe(), deferred)
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]


def test_a_checkpoint_loads_into_the_plain_module_and_resumes(tmp_path: Path) -> None:
    """A checkpoint written with the callback loads into the plain LightningModule, and
    resuming from it with a fresh callback recalls every row from the store."""
    store = tmp_path / "store"
    model = Probe()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit = trainer(
        tmp_path,
        1,
        callbacks=[CacheFrozen(store, ["encoder"]), checkpoints],
        enable_checkpointing=True,
    )
    fit.fit(model, loader())
    last = tmp_path / "ckpt" / "last.ckpt"

    plain = Probe.load_from_checkpoint(last, seed=5)
    assert type(plain.encoder) is Encoder
    for name, value in model.state_dict().items():
        assert torch.equal(plain.state_dict()[name], value), name

    resumed = CacheFrozen(store, ["encoder"])
    again = trainer(tmp_path, 2, callbacks=[resumed])
    again.fit(Probe(seed=5), loader(), ckpt_path=last)
    (epoch,) = epochs(resumed, "train")
    assert epoch.epoch == 1
    assert epoch.rows.from_store == SAMPLES and epoch.rows.computed == 0


def _checkpoints_every_two_steps(
    root: Path, model: pl.LightningModule, train: Any, callbacks: list[pl.Callback]
) -> Path:
    """Where a one-epoch fit of ``model`` writes its checkpoints, one every two steps
    (``step=2.ckpt``, inside the epoch, and ``step=4.ckpt``, at its last batch)."""
    checkpoints = ModelCheckpoint(
        dirpath=root / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}"
    )
    fit = trainer(root, 1, callbacks=[*callbacks, checkpoints], enable_checkpointing=True)
    fit.fit(model, train)
    return root / "ckpt"


def test_an_epoch_resumed_mid_way_counts_and_logs_its_rows(tmp_path: Path) -> None:
    """Resumed from a checkpoint written inside an epoch, or at its last batch (Lightning
    runs no epoch-start hook for that epoch, nor, from the last batch, for the next), each
    epoch is counted and logged with the rows it asked: the two batches left of the first,
    and every batch of the second, all recalled from the store."""
    store = tmp_path / "store"
    saved = _checkpoints_every_two_steps(
        tmp_path, Probe(), loader(), [CacheFrozen(store, ["encoder"])]
    )
    for step, resumed_rows in ((2, [SAMPLES // 2, SAMPLES]), (4, [SAMPLES])):
        resumed = CacheFrozen(store, ["encoder"])
        logs = CSVLogger(tmp_path / f"logs{step}")
        again = trainer(tmp_path, 2, callbacks=[resumed], logger=logs)
        again.fit(Probe(), loader(), ckpt_path=saved / f"step={step}.ckpt")
        rows = [(e.rows.rows, e.rows.recalled) for e in epochs(resumed, "train")]
        assert rows == [(n, n) for n in resumed_rows]
        with open(next((tmp_path / f"logs{step}").rglob("metrics.csv"))) as f:
            logged = [r for r in csv.DictReader(f) if r.get("cache/encoder/hit_rate")]
        assert [float(r["cache/encoder/hit_rate"]) for r in logged] == [1.0] * len(resumed_rows)
        assert [float(r["cache/encoder/rows_recalled"]) for r in logged] == resumed_rows


class IndexedPairs(Indexed):
    """Trains on a dict of loaders, each batch of each keyed by its sample indices."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        losses = [Indexed.training_step(self, batch[k], batch_idx) for k in batch]
        return torch.stack(losses).sum()


def test_several_loaders_keyed_by_index_are_refused_in_an_epoch_resumed_mid_way(
    tmp_path: Path,
) -> None:
    """Two training loaders keyed by index under the callback's version are refused in an
    epoch resumed from a checkpoint written inside it, as in any other: the second
    loader's rows would be answered with the first one's."""
    saved = _checkpoints_every_two_steps(
        tmp_path, IndexedPairs(), {"a": _indexed(1), "b": _indexed(2)}, []
    )
    callback = CacheFrozen(None, ["encoder"], key="index", version="toy@1")
    with pytest.raises(CacheFrozenError, match="2 loaders whose samples it cannot tell apart"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(
            IndexedPairs(), {"a": _indexed(1), "b": _indexed(2)}, ckpt_path=saved / "step=2.ckpt"
        )


class _Fails(Probe):
    """Fails at its first training step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise RuntimeError("the step failed")


class Trained(Probe):
    """Trains its encoder with its head, in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.requires_grad_(True)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_each_stage_hands_back_the_plain_model(tmp_path: Path) -> None:
    """When a stage ends — validate, fit, or a fit that fails — the module found is put
    back, in the mode and with the ``requires_grad`` it had: a fit without the callback
    after validating with it trains the encoder, and a fitted model traces, takes input
    gradients and follows ``.train()`` as the plain model does."""
    model = Trained()
    fit = trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])])
    fit.validate(model, loader(), verbose=False)
    assert type(model.encoder) is Encoder and not is_held(model.encoder)
    assert all(p.requires_grad for p in model.encoder.parameters())
    assert all(part.training for part in model.encoder.modules())
    before = model.encoder.conv.weight.detach().clone()
    trainer(tmp_path, 1, limit_train_batches=1).fit(model, loader())
    assert not torch.equal(model.encoder.conv.weight, before)

    probe = Probe()
    trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(probe, loader())
    assert type(probe.encoder) is Encoder and not is_held(probe.encoder)
    probe.train()
    assert probe.encoder.norm.training
    x = data()[0][:4]
    torch.jit.trace(nn.Sequential(probe.encoder, probe.head).eval(), x)
    x.requires_grad_(True)
    probe.encoder(x).sum().backward()
    assert x.grad is not None

    failing = _Fails()
    with pytest.raises(RuntimeError, match="the step failed"):
        trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(failing, loader())
    assert type(failing.encoder) is Encoder and not is_held(failing.encoder)


class _RectifiedInPlace(Probe):
    """A probe whose encoder rectifies its batch in place first (``nn.ReLU(inplace=True)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.ReLU(inplace=True), self.encoder)


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_an_encoder_that_writes_into_its_batch_fails_the_stage(tmp_path: Path, stage: str) -> None:
    """An encoder that writes into the batch it is handed (a first layer in place) is
    refused as ``cache_rows`` refuses it (``RowsError``, saying what to do), at the
    stage's first batch — under validation's inference mode too — rather than writing into
    the batch in the first epoch and not in those that recall it: nothing is kept, and the
    plain encoder is handed back."""
    model = _RectifiedInPlace()
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    fitting = trainer(tmp_path, 1, callbacks=[callback])
    with pytest.raises(RowsError, match=r"`Sequential` wrote into the rows it was handed"):
        if stage == "fit":
            fitting.fit(model, loader())
        else:
            fitting.validate(model, loader(), verbose=False)
    assert type(model.encoder) is nn.Sequential and not is_held(model.encoder)
    assert callback.cached["encoder"].stats.rows_kept == 0


def test_the_cache_used_between_stages_leaves_the_plain_module_as_it_was(
    tmp_path: Path,
) -> None:
    """Called on its own between stages, a kept cache answers as the frozen module in eval
    (its weights as they are now) and leaves the plain module in the model as it was: in
    train mode, requiring grad, not held in eval, in this stage and a later one; called on
    its own, it leaves the module the gradients it kept."""
    model = Trained()
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(FrozeTrainable):
        trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    cached, encoder, x = callback.cached["encoder"], model.encoder, data()[0][:8]
    kept = [(p, torch.ones_like(p)) for p in encoder.parameters()]  # gradients it kept
    for parameter, gradient in kept:
        parameter.grad = gradient

    def plain_answer() -> torch.Tensor:
        with torch.no_grad():
            answer: torch.Tensor = encoder.eval()(x)
        encoder.train()
        return answer

    def as_it_was() -> bool:
        return (
            not is_held(encoder)
            and all(p.requires_grad for p in encoder.parameters())
            and all(part.training for part in encoder.modules())
        )

    def kept_its_gradients() -> bool:
        return all(p.grad is gradient for p, gradient in kept)

    assert torch.equal(cached(x), plain_answer()) and as_it_was() and kept_its_gradients()
    assert cached.reset_stats().recalled == 8  # kept by the fit
    with torch.no_grad():
        encoder.conv.weight.data.mul_(2)  # it trained meanwhile, written behind torch's back
    assert torch.equal(cached(x), plain_answer()) and as_it_was()
    encoder.gain = 3.0
    assert torch.equal(cached(x), plain_answer()) and as_it_was()
    assert cached.stats.computed == 16 and cached.state and as_it_was() and kept_its_gradients()

    trainer(tmp_path, 1, callbacks=[callback]).test(model, loader(), verbose=False)
    assert model.encoder is encoder and as_it_was()
    model.eval()
    cached(x)
    assert not any(part.training for part in encoder.modules()) and not is_held(encoder)


def test_one_callback_keeps_its_cache_from_stage_to_stage(tmp_path: Path) -> None:
    """Fit, test and fit again with one callback and no store: each stage puts the same
    cache in place, its memory tiers still holding the rows, and hands the model back."""
    callback = CacheFrozen(None, ["encoder"])
    model = Probe()
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    cached = callback.cached["encoder"]
    trainer(tmp_path, 1, callbacks=[callback]).test(model, loader(shuffle=False), verbose=False)
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    assert callback.cached["encoder"] is cached and type(model.encoder) is Encoder
    test, again = epochs(callback, "test")[0], epochs(callback, "train")[-1]
    assert test.rows.from_device == again.rows.from_device == SAMPLES


def test_a_second_callback_caches_with_its_own_options(tmp_path: Path) -> None:
    """A second callback on a model fitted with a first one caches with its own store,
    salt and budgets; a module the LightningModule cached itself is refused, saying so."""
    model = Probe()
    first = CacheFrozen(tmp_path / "a", ["encoder"], salt="v1")
    trainer(tmp_path, 1, callbacks=[first]).fit(model, loader())
    second = CacheFrozen(tmp_path / "b", ["encoder"], salt="v2", device_bytes=0, host_bytes=0)
    trainer(tmp_path, 1, callbacks=[second]).fit(model, loader())
    (epoch,) = epochs(second, "train")
    assert (epoch.rows.computed, epoch.rows.rows_kept) == (SAMPLES, SAMPLES)
    assert second.cached["encoder"].salt == "v2"

    model.encoder = cache_rows(model.encoder)  # type: ignore[assignment]
    third = trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])])
    with pytest.raises(CacheFrozenError, match="`encoder` is cached per row already"):
        third.fit(model, loader())


class ValidatesInside(Probe):
    """At each training epoch's end, validates ``other`` with a trainer of its own, given
    ``callback``, and keeps what that raised."""

    def __init__(self, other: pl.LightningModule, callback: CacheFrozen, root: Path) -> None:
        super().__init__()
        self.inside = (other, callback, root)
        self.raised: list[Exception] = []

    def on_train_epoch_end(self) -> None:
        other, callback, root = self.inside
        try:
            trainer(root, 1, callbacks=[callback]).validate(other, loader(), verbose=False)
        except CacheFrozenError as error:
            self.raised.append(error)


@pytest.mark.parametrize("same", [False, True], ids=["another-model", "same-model"])
def test_a_trainer_inside_anothers_stage_is_refused_the_callback_it_runs(
    tmp_path: Path, same: bool
) -> None:
    """A trainer run inside another's stage (a validation in one of its hooks) and given
    the callback that stage runs is refused, saying so, and the stage under way goes on
    cached as it was, rather than have its modules put back behind it (and fail at its
    next epoch)."""
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    model = ValidatesInside(Probe(seed=5), callback, tmp_path / "inside")
    if same:
        model.inside = (model, callback, tmp_path / "inside")
    trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert len(model.raised) == 2
    assert "another trainer's stage" in str(model.raised[0])
    assert [e.rows.computed for e in epochs(callback, "train")] == [SAMPLES, 0]
    assert [e.rows.recalled for e in epochs(callback, "train")] == [0, SAMPLES]
    assert type(model.encoder) is Encoder


@pytest.mark.parametrize("stage", ["fit", "validate"])
def test_the_callback_given_twice_to_one_trainer_is_refused(tmp_path: Path, stage: str) -> None:
    """The same callback listed twice would get every hook twice, and record each epoch
    twice in its history, once with no rows: it is refused, saying to list it once, and
    the model is handed back plain."""
    model, callback = Probe(), CacheFrozen(tmp_path / "store", ["encoder"])
    twice = trainer(tmp_path, 1, callbacks=[callback, callback])
    with pytest.raises(CacheFrozenError, match=r"listed 2 times .* once"):
        if stage == "fit":
            twice.fit(model, loader())
        else:
            twice.validate(model, loader(), verbose=False)
    assert type(model.encoder) is Encoder and not is_held(model.encoder)
    assert callback.history == []
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())  # listed once: cached
    assert [e.rows.computed for e in epochs(callback, "train")] == [SAMPLES]


def test_the_callbacks_own_cache_put_back_in_the_model_is_refused_saying_so(
    tmp_path: Path,
) -> None:
    """The callback's own cache, put in the model by hand between stages, is refused as
    this callback's, saying to put the module itself there."""
    model, callback = Probe(), CacheFrozen(None, ["encoder"])
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    model.encoder = callback.cached["encoder"]  # type: ignore[assignment]
    with pytest.raises(
        CacheFrozenError, match=r"own cache .*\(`model.encoder = model.encoder.module`\)"
    ):
        trainer(tmp_path, 1, callbacks=[callback]).test(model, loader(), verbose=False)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_is_cached_and_keyed_apart(tmp_path: Path, precision: str) -> None:
    """Under mixed precision epoch 2 recalls every row, and a full-precision fit on the
    same store recalls none of them (the autocast dtype is in the key)."""
    store = tmp_path / "store"
    mixed = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 2, callbacks=[mixed], precision=precision).fit(Probe(), loader())
    assert [e.hit_rate for e in epochs(mixed, "train")] == [0.0, 1.0]
    assert next(iter(mixed.cached.values())).stats.rows == 0  # counted into the history

    full = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 1, callbacks=[full]).fit(Probe(), loader())
    assert epochs(full, "train")[0].rows.recalled == 0


def test_random_augmentation_warns_once(tmp_path: Path) -> None:
    """Inputs that differ every epoch never hit: the callback warns once, saying why."""
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer(tmp_path, 4, callbacks=[callback]).fit(Probe(), loader(noisy=True))
    never = [w for w in seen if issubclass(w.category, NeverHits)]
    assert len(never) == 1
    assert "random augmentation" in str(never[0].message)
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0] * 4


class Reloaded(Probe):
    """Writes new encoder weights at the second epoch's start (a checkpoint loaded, say)."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            with torch.no_grad():
                self.encoder.conv.weight.mul_(2)


def test_an_epoch_that_misses_after_a_state_change_warns_of_the_change(tmp_path: Path) -> None:
    """An epoch that recalls nothing because the module's weights changed at its start
    warns that the module changed, not of a random augmentation."""
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(NeverHits, match="`encoder` changed since its rows were kept") as seen:
        trainer(tmp_path, 2, callbacks=[callback]).fit(Reloaded(), loader())
    assert not [w for w in seen if "random augmentation" in str(w.message)]
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 0.0]


def test_an_epoch_of_rows_from_an_outdated_deferred_does_not_warn_of_augmentation(
    tmp_path: Path,
) -> None:
    """An epoch whose batches persistent workers hand out under a version their Deferred
    no longer holds recalls nothing, as it must: the cache warns to make the DataLoader
    again, and the callback does not add that the inputs differ every epoch."""
    images, labels = data(1)
    deferred = Deferred(images, labels, version="train@1")
    workers = torch.utils.data.DataLoader(
        deferred, batch_size=16, num_workers=1, persistent_workers=True
    )

    class Renamed(Probe):
        """Gives the Deferred a new version at the second epoch's start."""

        def on_train_epoch_start(self) -> None:
            if self.current_epoch == 1:
                deferred.version = "train@2"

    callback = CacheFrozen(None, ["encoder"], key="index")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer(tmp_path, 2, callbacks=[callback]).fit(Renamed(), workers)
    assert any("DataLoader again" in str(w.message) for w in seen)
    assert not [w for w in seen if issubclass(w.category, NeverHits)]
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 0.0]
    assert epochs(callback, "train")[1].rows.computed == SAMPLES


def test_outdated_rows_in_validation_leave_the_training_epochs_warning(tmp_path: Path) -> None:
    """Validation inside the training epoch handed rows of an outdated Deferred does not
    silence the warning that the training epochs, new every epoch, never hit."""
    train = Deferred(*data(1), version="train@1")
    val = Deferred(*data(2), version="val@1")
    workers = torch.utils.data.DataLoader(
        val, batch_size=16, num_workers=1, persistent_workers=True
    )

    class Renamed(Probe):
        """Gives both Deferreds a new version at the second epoch's start."""

        def on_train_epoch_start(self) -> None:
            if self.current_epoch == 1:
                train.version, val.version = "train@2", "val@2"

    callback = CacheFrozen(None, ["encoder"], key="index")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fit = trainer(tmp_path, 2, callbacks=[callback])
        fit.fit(Renamed(), torch.utils.data.DataLoader(train, batch_size=16), workers)
    assert any("DataLoader again" in str(w.message) for w in seen)
    assert len([w for w in seen if issubclass(w.category, NeverHits)]) == 1
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 0.0]


def test_no_warning_when_epochs_repeat(tmp_path: Path) -> None:
    """Clean inputs hit from epoch 2 on, and nothing warns."""
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer(tmp_path, 3, callbacks=[callback]).fit(Probe(), loader())
    assert not [w for w in seen if issubclass(w.category, NeverHits)]


def test_prefill_leaves_the_runs_random_numbers_as_they_were(tmp_path: Path) -> None:
    """A prefill over a DataLoader of the global generators (it draws its seed from
    torch's as its iterator is made) and a Dataset drawing from torch's, ``random``'s and
    numpy's leaves those generators where they stood: the training loader's shuffles, its
    Dataset's draws and the head's dropout draw what they draw without the callback,
    which trains the same head."""

    class Drawing(Weighted):
        """Each image with a loss weight drawn from all three generators when fetched."""

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x, y, weight = super().__getitem__(i)
            return x, y, weight * random.random() * float(numpy.random.rand())

    heads = []
    for prefilled in (True, False):
        callback = CacheFrozen(None, ["encoder"])
        if prefilled:
            callback.prefill(torch.utils.data.DataLoader(Drawing(), batch_size=16), progress=False)
        pl.seed_everything(0)
        model = Dropped()
        shuffled = torch.utils.data.DataLoader(Drawing(), batch_size=16, shuffle=True)
        trainer(tmp_path, 2, callbacks=[callback]).fit(model, shuffled)
        heads.append(model.head.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])


class Fetched(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """:func:`data`'s samples, counting how many were fetched."""

    def __init__(self) -> None:
        self.images, self.labels = data(1)
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.fetched += 1
        return self.images[i], self.labels[i]


def _fit_prefilling(tmp_path: Path, **options: Any) -> tuple[Fetched, CacheFrozen, Probe]:
    """A fit under a trainer made with ``options``, prefilling a loader of :class:`Fetched`
    samples first: the samples, the callback and the model it fitted."""
    prefilled = Fetched()
    callback = CacheFrozen(None, ["encoder"])
    callback.prefill(torch.utils.data.DataLoader(prefilled, batch_size=16), progress=False)
    model = Probe()
    trainer(tmp_path, 1, callbacks=[callback], **options).fit(model, loader(shuffle=False))
    return prefilled, callback, model


def test_a_fast_dev_run_prefills_as_many_batches_as_it_runs(tmp_path: Path) -> None:
    """``fast_dev_run`` is a smoke test of a few batches of each loader: a prefill runs as
    many batches of its loader as the trainer runs of the training loader, not the whole
    data set (hours of a real one). Its loader is kept, and the fit after it prefills it
    whole, recalling the rows the dev run computed (the same first batches)."""
    prefilled, callback, model = _fit_prefilling(tmp_path, fast_dev_run=2)
    (warm,) = epochs(callback, "prefill")
    assert warm.rows.rows == prefilled.fetched == 32
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader(shuffle=False))
    whole = epochs(callback, "prefill")[-1]
    assert (whole.rows.rows, whole.rows.recalled) == (SAMPLES, 32)
    assert epochs(callback, "train")[-1].rows.recalled == SAMPLES


def test_a_fast_dev_run_of_0_is_a_real_run_and_prefills_whole(tmp_path: Path) -> None:
    """``fast_dev_run=0`` (a config's or a command line's way to turn it off) is a real run
    to Lightning, which runs every batch: the prefill runs its whole loader too, not none
    of it, and is not left for a later fit."""
    prefilled, callback, model = _fit_prefilling(tmp_path, fast_dev_run=0)
    (warm,) = epochs(callback, "prefill")
    assert warm.rows.rows == prefilled.fetched == SAMPLES
    assert epochs(callback, "train")[-1].rows.recalled == SAMPLES
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader(shuffle=False))
    assert len(epochs(callback, "prefill")) == 1


@pytest.mark.parametrize(
    "options", [{"max_epochs": 0}, {"max_steps": 0}, {"limit_train_batches": 0}]
)
def test_a_fit_training_no_batch_prefills_nothing(tmp_path: Path, options: dict[str, Any]) -> None:
    """A fit that trains on no batch (no epoch, no step, no training batch) asks the encoder
    for no row: its prefill loads no sample and computes nothing, and is left to the next
    fit, which runs it whole."""
    prefilled, callback, model = _fit_prefilling(tmp_path, **options)
    assert prefilled.fetched == 0
    assert epochs(callback, "prefill") == []
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader(shuffle=False))
    (warm,) = epochs(callback, "prefill")
    assert warm.rows.computed == prefilled.fetched == SAMPLES


@pytest.mark.parametrize(
    "options",
    [
        {"max_epochs": 5, "max_steps": 10},  # stops after 2 of the 3rd epoch's 4 batches
        {"max_epochs": 9, "max_steps": 9, "accumulate_grad_batches": 3},  # after 3 of 4
        {"max_epochs": 4, "limit_train_batches": 2},
    ],
)
def test_fetching_ahead_reads_no_batch_past_the_last_one_the_fit_takes(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """A fit that stops before the loader's end (``max_steps`` inside an epoch, counted in
    optimizer steps, or ``limit_train_batches``) reads exactly the samples it reads without
    the callback, fetched ahead all the same: not the batch after its last one (a costly
    load, an encoder run of a Deferred dataset). The head trains as without the callback."""
    fetched: dict[bool, int] = {}
    heads: dict[bool, torch.Tensor] = {}
    for cached in (False, True):
        samples = Fetched()
        callback = CacheFrozen(None, ["encoder"])
        model = Probe()
        settings = dict(options)
        fit = trainer(
            tmp_path, settings.pop("max_epochs"), callbacks=[callback] * cached, **settings
        )
        generator = torch.Generator().manual_seed(7)
        fit.fit(model, torch.utils.data.DataLoader(samples, 16, shuffle=True, generator=generator))
        fetched[cached], heads[cached] = samples.fetched, model.head.weight
        if cached:
            assert callback.cached["encoder"].used_ahead > 0
    assert fetched[True] == fetched[False]
    assert torch.equal(heads[True], heads[False])


def test_prefill_makes_the_first_epoch_recall(tmp_path: Path) -> None:
    """prefill(loader) runs before the first epoch, so epoch 1 already recalls every row."""
    callback = CacheFrozen(tmp_path / "store", ["encoder"])
    callback.prefill(loader(shuffle=False), progress=False)
    trainer(tmp_path, 1, callbacks=[callback]).fit(Probe(), loader())
    (warm,) = epochs(callback, "prefill")
    assert warm.rows.computed == SAMPLES and warm.rows.rows_kept == SAMPLES
    assert epochs(callback, "train")[0].rows.recalled == SAMPLES
    assert (
        len(
            Store(tmp_path / "store").have(
                callback.cached["encoder"].row_keys(
                    loader(shuffle=False).dataset.tensors[0]  # type: ignore[attr-defined]
                )
            )
        )
        == SAMPLES
    )


class Inner(nn.Module):
    """An encoder and a head in one model, to be compiled or wrapped as a whole."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = Encoder()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class CompiledProbe(Probe):
    """A probe whose inner model is compiled with ``torch.compile``."""

    def __init__(self, backend: Any) -> None:
        super().__init__()
        del self.encoder, self.head
        self.model = torch.compile(Inner(), backend=backend)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(x)
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.head.parameters(), lr=0.1)


def test_compiled_inner_model(tmp_path: Path) -> None:
    """A model compiled with torch.compile compiles around the cached encoder, whose
    lookups run outside the compiled graph and hit from epoch 2 on."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = CompiledProbe(backend)
    callback = CacheFrozen(tmp_path / "store", ["model.encoder"])
    trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    assert graphs, "nothing was compiled"
    assert callback.cached["model.encoder"].module is model.model._orig_mod.encoder
    assert "model._orig_mod.head.weight" in model.state_dict()


class AdaptedInner(Inner):
    """A frozen encoder between a trainable 1x1 convolution upstream of it and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.requires_grad_(False)
        self.adapter = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.adapter(x)))


class CompiledAdapted(CompiledProbe):
    """A probe whose compiled inner model trains a part upstream of its encoder, and
    which holds that model under another name first (``self.net``), uncompiled."""

    def __init__(self, compiled: bool = True) -> None:
        super().__init__("eager")
        del self.model
        self.net = AdaptedInner()
        self.model = torch.compile(self.net, backend="eager") if compiled else self.net

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.1)


def test_a_compiled_model_handing_its_encoder_a_batch_that_requires_grad_trains_it_uncached(
    tmp_path: Path,
) -> None:
    """A compiled model whose encoder is handed a batch that requires grad has it put back
    uncached, warned of, and trains as without the callback: the callback is told outside
    compiled code, and torch.compile does not trace what it changes of the model (held
    under two names, that failed inside torch.compile)."""
    torch._dynamo.reset()
    cached = CompiledAdapted()
    with pytest.warns(Uncached, match=r"`model.encoder` is handed a batch that requires grad"):
        trainer(tmp_path, 2, callbacks=[CacheFrozen(None, ["model.encoder"])]).fit(cached, loader())
    plain = CompiledAdapted(compiled=False)
    trainer(tmp_path, 2).fit(plain, loader())
    assert not torch.equal(plain.net.adapter.weight, AdaptedInner().adapter.weight)
    for name, weight in plain.net.named_parameters():
        assert torch.equal(cached.net.get_parameter(name), weight), name
    torch._dynamo.reset()


DDP_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import lightning.pytorch as pl
from somatize.torch.lightning import CacheFrozen
from tests.lightning_models import Probe, loader

if __name__ == "__main__":
    for key in sys.argv[2:]:  # one fit after another, each in its own folder and store
        out = os.path.join(sys.argv[1], key)
        callback = CacheFrozen(os.path.join(out, "store"), ["encoder"], key=key)
        train = loader(shuffle=True)
        if key == "index":  # the same samples, their images deferred
            import torch
            from somatize.torch import Deferred
            images, labels = train.dataset.tensors
            train = torch.utils.data.DataLoader(
                Deferred(images, labels, version="ddp@1"), batch_size=16, shuffle=True
            )
        fit = pl.Trainer(
            accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, default_root_dir=out,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            logger=False, num_sanity_val_steps=0, callbacks=[callback],
        )
        fit.fit(Probe(), train)
        record = [
            {"epoch": e.epoch, "rows": e.rows.rows, "computed": e.rows.computed,
             "recalled": e.rows.recalled, "from_store": e.rows.from_store,
             "from_memory": e.rows.from_device + e.rows.from_host}
            for e in callback.history if e.stage == "train"
        ]
        with open(os.path.join(out, f"rank{fit.global_rank}.json"), "w") as f:
            json.dump(record, f)
"""

DDP_KEYS = ["content", "index"]


def _run_ranks(tmp_path: Path, script: str, timeout: float, *arguments: str) -> None:
    """Runs ``script`` on the CPU in a new process, handed ``tmp_path`` and ``arguments``;
    it starts its ranks itself."""
    path = tmp_path / "fit.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1")
    env.pop("MASTER_PORT", None)
    done = subprocess.run(
        [sys.executable, str(path), str(tmp_path), *arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _ranks_of(tmp_path: Path, script: str, timeout: float, *arguments: str) -> list[Any]:
    """What each of two ranks of ``script``, run on the CPU in a new process with the store
    under ``tmp_path`` and ``arguments``, recorded in its ``rank{r}.json``."""
    _run_ranks(tmp_path, script, timeout, str(tmp_path / "store"), *arguments)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def ddp_fits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding, in a folder per key of ``DDP_KEYS``, what each of two DDP ranks
    (gloo, CPU) sharing a store keyed so recorded, and that store. One launch runs the
    fits one after the other: starting two processes with torch and Lightning costs more
    than the fits."""
    folder = tmp_path_factory.mktemp("ddp")
    _run_ranks(folder, DDP_SCRIPT, 120 * len(DDP_KEYS), *DDP_KEYS)
    return folder


@pytest.mark.parametrize("key", DDP_KEYS)
def test_ddp_two_processes_share_one_store(ddp_fits: Path, key: str) -> None:
    """Two DDP ranks (gloo, CPU) share one store: each computes its share in epoch 1,
    both recall every row in epoch 2 (rows the other rank computed included), and the
    store verifies clean — keyed by content, and by index with the images deferred."""
    ranks = [json.loads((ddp_fits / key / f"rank{r}.json").read_text()) for r in (0, 1)]
    for record in ranks:
        first, second = record
        assert first["rows"] == second["rows"] == SAMPLES // 2
        assert second["recalled"] == SAMPLES // 2 and second["computed"] == 0
    assert sum(r[0]["computed"] for r in ranks) == SAMPLES
    store = Store(ddp_fits / key / "store")
    verified = store.verify()
    assert not verified.damaged and verified.packs > 0
    images = data()[0]
    if key == "index":
        cached = cache_rows(Probe().encoder, key="index", version="ddp@1")
        keys = cached.row_keys(images, index=torch.arange(len(images)))
    else:
        keys = cache_rows(Probe().encoder).row_keys(images)
    assert store.have(keys) == set(keys)


SPAWN_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import lightning.pytorch as pl
import torch.multiprocessing
from somatize.torch.lightning import CacheFrozen
from tests.lightning_models import Probe, loader

# Tensors reach the spawned ranks through files: descriptors cannot be sized on every host.
torch.multiprocessing.set_sharing_strategy("file_system")


class Recorded(Probe):
    def on_fit_end(self):
        callback = next(c for c in self.trainer.callbacks if isinstance(c, CacheFrozen))
        record = [
            {"rows": e.rows.rows, "computed": e.rows.computed, "recalled": e.rows.recalled}
            for e in callback.history if e.stage == "train"
        ]
        with open(os.path.join(sys.argv[1], f"rank{self.trainer.global_rank}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    out, store = sys.argv[1], sys.argv[2]
    callback = CacheFrozen(store, ["encoder"])
    fit = pl.Trainer(
        accelerator="cpu", strategy="ddp_spawn", devices=2, max_epochs=2, default_root_dir=out,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=False, num_sanity_val_steps=0, callbacks=[callback],
    )
    fit.fit(Recorded(), loader(shuffle=True))
    assert callback.history == []  # the ranks ran copies of it
"""


def test_ddp_spawn_ranks_run_copies_of_the_callback(tmp_path: Path) -> None:
    """Under `strategy="ddp_spawn"` the trainer, its callbacks with it, is pickled to each
    rank: each rank's copy caches its share in epoch 1 and recalls every row in epoch 2,
    and the store holds every row."""
    ranks = _ranks_of(tmp_path, SPAWN_SCRIPT, 180)
    for first, second in ranks:
        assert first["rows"] == second["rows"] == SAMPLES // 2
        assert second["recalled"] == SAMPLES // 2 and second["computed"] == 0
    keys = cache_rows(Probe().encoder).row_keys(data()[0])
    assert Store(tmp_path / "store").have(keys) == set(keys)


SHARES_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset
from somatize.torch.lightning import CacheFrozen
from tests.lightning_models import Probe, data


class Shares:
    # Two batches a rank: rank 0 is handed samples 0-47 every epoch, rank 1 16 new ones.
    def __init__(self):
        self.epoch = -1

    def __len__(self):
        return 2

    def __iter__(self):
        self.epoch += 1
        if torch.distributed.get_rank() == 0:
            return iter([list(range(24)), list(range(24, 48))])
        start = 48 + 16 * self.epoch
        return iter([list(range(start, start + 8)), list(range(start + 8, start + 16))])


if __name__ == "__main__":
    out, store = sys.argv[1], sys.argv[2]
    train = DataLoader(TensorDataset(*data(samples=80)), batch_sampler=Shares())
    callback = CacheFrozen(store, ["encoder"])
    fit = pl.Trainer(
        accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, default_root_dir=out,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=CSVLogger(out), num_sanity_val_steps=0, callbacks=[callback],
        use_distributed_sampler=False,
    )
    fit.fit(Probe(), train)
    record = {
        "rows": [e.rows.rows for e in callback.history if e.stage == "train"],
        "recalled": [e.rows.recalled for e in callback.history if e.stage == "train"],
        "logged": {k: float(v) for k, v in fit.callback_metrics.items() if k.startswith("cache/")},
    }
    with open(os.path.join(out, f"rank{fit.global_rank}.json"), "w") as f:
        json.dump(record, f)
"""


def test_ddp_hit_rate_logged_is_over_every_ranks_rows(tmp_path: Path) -> None:
    """Under DDP the hit rate logged is the rows every rank recalled over the rows they
    asked, as the counts logged beside it say: rank 0 asks 48 rows in epoch 2 and recalls
    them all, rank 1 asks 16 new ones, so 48 of 64 rows were recalled (not the mean of the
    ranks' rates, 0.5, which weighs 16 rows as 48)."""
    ranks = _ranks_of(tmp_path, SHARES_SCRIPT, 180)
    assert [r["rows"] for r in ranks] == [[48, 48], [16, 16]]
    assert [r["recalled"] for r in ranks] == [[0, 48], [0, 0]]
    for record in ranks:
        logged = record["logged"]
        assert logged["cache/encoder/rows_recalled"] == 48
        assert logged["cache/encoder/rows_computed"] == 16
        assert logged["cache/encoder/hit_rate"] == 48 / 64


RECALIBRATED_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import lightning.pytorch as pl
import torch
from somatize.torch.lightning import CacheFrozen
from tests.lightning_models import Probe, loader


class Recalibrated(Probe):
    # Rank 0 alone moves the encoder's BatchNorm statistics at epoch 1's start (a hook run
    # on rank 0 only); DDP hands every rank rank 0's buffers as each forward begins.
    def on_train_epoch_start(self):
        if self.current_epoch == 1 and self.global_rank == 0:
            with torch.no_grad():
                self.encoder.norm.running_mean.add_(1.0)

    def training_step(self, batch, batch_idx):
        x, y = batch
        features = self.encoder(x)
        plain = self.encoder.module(x)  # the module itself, with the buffers it holds now
        self.gaps.append(float((features - plain).abs().max()))
        return torch.nn.functional.cross_entropy(self.head(features), y)


if __name__ == "__main__":
    out, store = sys.argv[1], sys.argv[2]
    callback = CacheFrozen(store, ["encoder"])
    model = Recalibrated()
    model.gaps = []
    fit = pl.Trainer(
        accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, default_root_dir=out,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        logger=False, num_sanity_val_steps=0, callbacks=[callback],
    )
    fit.fit(model, loader(shuffle=True))
    record = {
        "gaps": model.gaps,
        "mean": model.encoder.norm.running_mean.tolist(),
        "computed": [e.rows.computed for e in callback.history if e.stage == "train"],
    }
    with open(os.path.join(out, f"rank{fit.global_rank}.json"), "w") as f:
        json.dump(record, f)
"""


def test_ddp_buffers_rank_0_alone_changed_key_every_ranks_rows(tmp_path: Path) -> None:
    """Buffers rank 0 alone changes at an epoch's start (statistics recalibrated in a hook
    run on rank 0 only) reach the other ranks through DDP, which writes rank 0's buffers
    into theirs as each forward begins without moving a version counter: every rank keys
    that epoch's rows by them and answers as its module now does, where the other rank
    recalled the rows of the statistics before."""
    ranks = _ranks_of(tmp_path, RECALIBRATED_SCRIPT, 180)
    assert ranks[0]["mean"] == ranks[1]["mean"]  # DDP handed rank 1 rank 0's statistics
    for record in ranks:
        assert record["gaps"] == [0.0] * 4
        assert record["computed"] == [SAMPLES // 2, SAMPLES // 2]


def test_a_store_this_process_cannot_write_is_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store filled by an earlier run, now read-only (as an empty one on a read-only disk
    is when it is opened), is refused when the callback is made, not after an epoch."""
    store = tmp_path / "store"
    trainer(tmp_path, 1, callbacks=[CacheFrozen(store, ["encoder"])]).fit(Probe(), loader())
    monkeypatch.setattr(LocalStore, "writable", lambda self: False)
    with pytest.raises(StoreError, match="read-only for this process"):
        CacheFrozen(store, ["encoder"])


def test_a_bucket_that_does_not_exist_is_refused_up_front() -> None:
    """A callback keeping rows in a bucket that does not exist is refused when it is made,
    naming the bucket, not when its first rows are flushed after an epoch."""
    store = Store.on_bucket(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x", **s3_options())
    with pytest.raises(StoreError, match=r"the bucket `no-such-bucket-\w+` does not exist"):
        CacheFrozen(store, ["encoder"])


class Twin(Probe):
    """Holds its encoder under a second name too, and calls it by both."""

    def __init__(self) -> None:
        super().__init__()
        self.twin = self.encoder

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.no_grad():
            features = self.encoder(x) + self.twin(x)
        return nn.functional.cross_entropy(self.head(features), y)


@pytest.mark.parametrize("names", [["encoder"], ["encoder", "twin"]])
def test_a_module_under_two_names_is_cached_once_under_both(
    tmp_path: Path, names: list[str]
) -> None:
    """One encoder held under two names, one named or both, is one cache in both places,
    counted once, under the first name; both places get the encoder back."""
    held: list[tuple[nn.Module, nn.Module]] = []

    class Look(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            held.append((args[1].encoder, args[1].twin))

    callback = CacheFrozen(None, names)
    model = Twin()
    keys = list(model.state_dict())
    trainer(tmp_path, 2, callbacks=[callback, Look()]).fit(model, loader())
    assert list(callback.cached) == ["encoder"]
    cached = callback.cached["encoder"]
    assert all(a is cached and b is cached for a, b in held)
    first, second = epochs(callback, "train")
    assert (first.rows.computed, second.rows.recalled) == (SAMPLES, 2 * SAMPLES)
    assert model.twin is model.encoder and type(model.encoder) is Encoder
    assert list(model.state_dict()) == keys


def test_a_prefill_of_a_module_under_its_second_name_is_counted_under_the_first(
    tmp_path: Path,
) -> None:
    """A prefill through the second name of a module held under two is the one cache's,
    and is counted under the first name, as the stages count it."""
    callback = CacheFrozen(None, ["encoder", "twin"])
    callback.prefill(loader(shuffle=False), module="twin", progress=False)
    trainer(tmp_path, 1, callbacks=[callback]).fit(Twin(), loader())
    assert [(e.stage, e.module) for e in callback.history] == [
        ("prefill", "encoder"),
        ("train", "encoder"),
    ]
    assert callback.history[1].rows.recalled == 2 * SAMPLES


class TwoTowers(Probe):
    """A query and a passage encoder loaded from one checkpoint, each called on its own
    input of a sample, keyed by index."""

    def __init__(self) -> None:
        super().__init__()
        self.passage = copy.deepcopy(self.encoder)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.encoder.eval()
        self.passage.eval()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        passages = x.flip(1)  # another input of each sample
        with torch.no_grad():
            features = self.encoder(x, index=index)
            answered = self.passage(passages, index=index)
        self.seen.append((passages, answered))
        return nn.functional.cross_entropy(self.head(features + answered), y)


def test_two_copies_of_one_encoder_keyed_by_index_are_refused(tmp_path: Path) -> None:
    """Two named copies of one encoder with the same weights are refused keyed by index,
    before anything is cached: their rows are keyed alike, so each sample's passage would
    be answered the query's rows. With weights apart, each is answered its own rows."""
    images, labels = data()
    indexed = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels, torch.arange(SAMPLES)), batch_size=8
    )
    callback = CacheFrozen(None, ["encoder", "passage"], key="index", version="towers@1")
    model = TwoTowers()
    with pytest.raises(CacheFrozenError, match=r"`encoder` and `passage` are copies of one"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(model, indexed)
    assert type(model.passage) is Encoder and not model.seen
    model = TwoTowers()
    with torch.no_grad():
        model.passage.conv.bias.add_(1.0)  # fine-tuned apart: another encoder
    callback = CacheFrozen(None, ["encoder", "passage"], key="index", version="towers@1")
    trainer(tmp_path / "apart", 1, callbacks=[callback]).fit(model, indexed)
    with torch.no_grad():
        assert all(torch.equal(got, model.passage(asked)) for asked, got in model.seen)
    assert len(model.seen) == SAMPLES // 8


def test_two_copies_of_one_encoder_apart_in_a_setting_are_cached_keyed_by_index(
    tmp_path: Path,
) -> None:
    """Two copies of one encoder with the same weights that differ in a setting their
    forward reads (a gain, a pooling) are keyed apart, by index too: both are cached,
    and each sample's passage is answered its own rows."""
    images, labels = data()
    indexed = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels, torch.arange(SAMPLES)), batch_size=8
    )
    model = TwoTowers()
    model.passage.gain = 2.0
    callback = CacheFrozen(None, ["encoder", "passage"], key="index", version="towers@1")
    trainer(tmp_path, 1, callbacks=[callback]).fit(model, indexed)
    with torch.no_grad():
        assert all(torch.equal(got, model.passage(asked)) for asked, got in model.seen)
    assert len(model.seen) == SAMPLES // 8
    assert {e.module for e in callback.history} == {"encoder", "passage"}


class SharedStem(Probe):
    """Two frozen encoders sharing their first part, a convolution and a BatchNorm, each
    with a head: the stem frozen by ``requires_grad_(False)`` alone, and left in train mode
    (its BatchNorm on batch statistics), or, ``trainable``, left to train."""

    def __init__(self, trainable: bool = False) -> None:
        super().__init__()
        torch.manual_seed(1)
        stem = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3))
        stem.requires_grad_(trainable)
        self.left = nn.Sequential(stem, Encoder().requires_grad_(False).eval())
        self.right = nn.Sequential(stem, Encoder().requires_grad_(False).eval())

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.left(x) + self.right(x.flip(-1)))
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def _shared_stem_runs_uncached(
    tmp_path: Path, kind: type[SharedStem], *, apart: bool = False
) -> None:
    """Fits a ``kind`` with and without a CacheFrozen over its two encoders (or, ``apart``,
    one CacheFrozen for each), checking that both run uncached, in train mode, and that
    the model trains and is handed back as without the callback."""
    plain = kind()
    trainer(tmp_path / "plain", 2).fit(plain, loader())
    model = kind()
    names = [["left"], ["right"]] if apart else [["left", "right"]]
    callbacks = [CacheFrozen(None, these) for these in names]
    with pytest.warns(Uncached, match="would run in train mode") as said:
        trainer(tmp_path / "cached", 2, callbacks=callbacks).fit(model, loader())
    uncached = {
        n
        for w in said
        if issubclass(w.category, Uncached)
        for n in ("left", "right")
        if f"`{n}`" in str(w.message)
    }
    assert uncached == {"left", "right"}
    assert {n: m.training for n, m in model.named_modules()} == {
        n: m.training for n, m in plain.named_modules()
    }
    assert torch.equal(model.left[0][1].running_mean, plain.left[0][1].running_mean)
    assert torch.equal(model.head.weight, plain.head.weight)


def test_two_named_modules_sharing_a_part_are_each_found_as_the_model_had_them(
    tmp_path: Path,
) -> None:
    """Two named modules sharing a part left in train mode (BatchNorm on batch statistics)
    both run in train mode, uncached, and the head trains as without the callback; the
    part is handed back in train mode. Shared and left to train, it is frozen while the fit
    runs, as each of them is, and handed back requiring grad."""
    _shared_stem_runs_uncached(tmp_path, SharedStem)

    trained = SharedStem(trainable=True)
    with pytest.warns(FrozeTrainable, match=r"`left`: `0.0.weight`.*`right`: `0.0.weight`"):
        trainer(tmp_path / "trained", 1, callbacks=[CacheFrozen(None, ["left", "right"])]).fit(
            trained, loader()
        )
    assert all(p.requires_grad for p in trained.left[0].parameters())
    assert trained.left[0].training


class SharedStemFrozenInSetup(SharedStem):
    """:class:`SharedStem` whose right encoder requires grad until the LightningModule's
    own ``setup()`` freezes it: looked at only then, after the left one was cached."""

    def __init__(self) -> None:
        super().__init__()
        self.right[1].requires_grad_(True)

    def setup(self, stage: str) -> None:
        self.right[1].requires_grad_(False)


def test_a_named_module_sharing_a_part_with_one_frozen_in_setup_waits_for_it(
    tmp_path: Path,
) -> None:
    """A named module sharing a part left in train mode with one that the LightningModule's
    own ``setup()`` freezes waits to be looked at with it: cached at the callback's setup,
    it put the shared part in eval, the other was taken as found in eval, cached and run
    so, and the part was handed back in eval. Both run in train mode, uncached, and the
    head trains as without the callback."""
    _shared_stem_runs_uncached(tmp_path, SharedStemFrozenInSetup)


def test_two_callbacks_caching_modules_that_share_a_part_find_each_as_the_model_had_it(
    tmp_path: Path,
) -> None:
    """Two CacheFrozen callbacks, each naming one of two modules sharing a part left in
    train mode: the second looks at its module as the model had it, not as the first's
    cache froze the part (in eval). Both run in train mode, uncached, the head trains as
    without the callbacks, and the part is handed back in train mode. Shared and left to
    train, the part is handed back requiring grad, in train mode, after a validation."""
    _shared_stem_runs_uncached(tmp_path, SharedStem, apart=True)

    trained = SharedStem(trainable=True)
    callbacks = [CacheFrozen(None, ["left"]), CacheFrozen(None, ["right"])]
    trainer(tmp_path / "validated", 1, callbacks=callbacks).validate(trained, loader())
    assert all(p.requires_grad for p in trained.left[0].parameters())
    assert trained.left[0].training


def test_unknown_submodule_is_refused(tmp_path: Path) -> None:
    """A name that is no submodule is refused at setup, listing what there is."""
    callback = CacheFrozen(None, ["backbone"])
    with pytest.raises(NotASubmodule, match=r"no submodule `backbone` \(it has `encoder`, `head`"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(Probe(), loader())


class Ensemble(Probe):
    """Holds frozen encoders in a list, each called on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.ensemble = nn.ModuleList([Encoder(), Encoder()]).requires_grad_(False).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(sum(encoder(x) for encoder in self.ensemble))


def test_a_list_of_encoders_is_refused_naming_its_parts(tmp_path: Path) -> None:
    """A list of encoders, which is never called itself, is refused at setup, naming the
    parts to name instead: its parts would run uncached, with nothing saying so. Named
    each, every one of them is cached."""
    callback = CacheFrozen(None, ["ensemble"])
    said = r"`ensemble` is a `ModuleList` with no forward .* `ensemble.0`, `ensemble.1`\)"
    with pytest.raises(CacheFrozenError, match=said):
        trainer(tmp_path, 1, callbacks=[callback]).fit(Ensemble(), loader())
    callback = CacheFrozen(None, ["ensemble.0", "ensemble.1"])
    trainer(tmp_path / "parts", 2, callbacks=[callback]).fit(Ensemble(), loader())
    assert [(e.epoch, e.module, e.hit_rate) for e in callback.history] == [
        (0, "ensemble.0", 0.0),
        (0, "ensemble.1", 0.0),
        (1, "ensemble.0", 1.0),
        (1, "ensemble.1", 1.0),
    ]


class Stacked(Probe):
    """Holds its encoder a second time inside a larger backbone, which it runs too."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(self.encoder, nn.Linear(8, 8)).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x) + self.backbone(x)
        return self.head(features)


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ([["encoder", "backbone"]], r"`encoder` is inside `backbone` \(it is `backbone.0` too\)"),
        ([["backbone", "encoder"]], r"`encoder` is inside `backbone` \(it is `backbone.0` too\)"),
        ([["encoder"], ["backbone"]], r"`backbone` holds `backbone.0`, cached per row already"),
        ([["backbone"], ["encoder"]], r"`encoder` is inside `backbone`, cached per row already"),
    ],
)
def test_a_module_inside_another_cached_is_refused_under_any_name(
    tmp_path: Path, names: list[list[str]], said: str
) -> None:
    """A named module held inside another one cached — named to the same callback under a
    name that does not say so, or cached by another callback, inside or around it — is
    refused, as one named inside another is: the outer cache would key its rows by the inner
    one, whose counts change at every call. The model is handed back plain."""
    model = Stacked()
    callbacks = [CacheFrozen(None, each) for each in names]
    with pytest.raises(CacheFrozenError, match=said):
        trainer(tmp_path, 1, callbacks=callbacks).fit(model, loader())
    assert type(model.encoder) is Encoder and model.backbone[0] is model.encoder


class MadeLate(Probe):
    """Makes its encoder in ``configure_model``, after the callbacks' ``setup``."""

    def __init__(self) -> None:
        super().__init__()
        del self.encoder

    def configure_model(self) -> None:
        if not hasattr(self, "encoder"):
            self.encoder = Encoder()


def test_a_submodule_made_in_configure_model_is_refused_saying_why(tmp_path: Path) -> None:
    callback = CacheFrozen(None, ["encoder"])
    with pytest.raises(NotASubmodule, match=r"makes modules in `configure_model\(\)`"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(MadeLate(), loader())


def test_compiled_submodule_is_refused(tmp_path: Path) -> None:
    """A submodule that is itself compiled is refused: compile around it instead."""
    model = Probe()
    model.encoder = torch.compile(model.encoder)  # type: ignore[assignment]
    with pytest.raises(CompiledSubmodule, match="Compile the model or the head around it"):
        CacheFrozen(None, ["encoder"]).setup(trainer(tmp_path, 1), model, "fit")


@pytest.mark.parametrize("name", ["encoder", "encoder.conv"])
def test_torchscript_submodule_is_refused(tmp_path: Path, name: str) -> None:
    """A submodule made by ``torch.jit.script``, or a part of one, is refused saying so,
    not with torch's own error as its parts are looked up or it is frozen."""
    model = Probe()
    model.encoder = torch.jit.script(model.encoder)  # type: ignore[assignment]
    with pytest.raises(CacheFrozenError, match=r"`encoder` is a TorchScript module \(of `Encoder`"):
        CacheFrozen(None, [name]).setup(trainer(tmp_path, 1), model, "fit")


def test_bad_names_are_refused() -> None:
    """Nested, repeated or empty module names, and no names at all, are refused when the
    callback is made."""
    with pytest.raises(CacheFrozenError, match=r"`encoder\.conv` is inside `encoder`"):
        CacheFrozen(None, ["encoder", "encoder.conv"])
    with pytest.raises(CacheFrozenError, match="names a submodule twice"):
        CacheFrozen(None, ["encoder", "encoder"])
    with pytest.raises(CacheFrozenError, match="dotted names"):
        CacheFrozen(None, [])
    for none in (None, 3):  # no list at all: not Python's "object is not iterable"
        with pytest.raises(CacheFrozenError, match=rf"dotted names .*got {none}"):
            CacheFrozen(None, none)  # type: ignore[arg-type]
    with pytest.raises(CacheFrozenError, match="prefill needs to be told which"):
        CacheFrozen(None, ["encoder", "head"]).prefill([])


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"key": "bogus"}, "key= is `content`"),
        ({"key": "index", "version": 3}, "version= is that version as a string"),
        ({"version": "v1"}, "version= is for key='index'"),
        ({"device_bytes": -1}, "device_bytes= is the memory tier's budget"),
        ({"host_bytes": "4GB"}, "host_bytes= is the memory tier's budget"),
        ({"salt": 5}, "salt= is a string"),
        ({"strict": "yes"}, "strict= is True or False"),
        ({"ahead": "no"}, "ahead= is True or False"),
    ],
)
def test_bad_options_are_refused_when_the_callback_is_made(
    options: dict[str, Any], named: str
) -> None:
    """Options the callback cannot use are refused when it is made, naming them, not when
    the trainer first calls its ``setup()``."""
    with pytest.raises(ValueError, match=named):
        CacheFrozen(None, ["encoder"], **options)


def _unfreeze(pl_module: pl.LightningModule) -> None:
    """What a fine-tuning schedule does: the encoder requires grad and joins the optimizer."""
    pl_module.encoder.requires_grad_(True)
    optimizer = pl_module.trainer.optimizers[0]
    optimizer.add_param_group({"params": list(pl_module.encoder.parameters())})


class _UnfreezeAtStep(pl.Callback):
    """A schedule by step: the encoder trains from step 6, the middle of epoch 2."""

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == 6:
            _unfreeze(pl_module)


class UnfrozenAtStep(Finetuned):
    """Unfreezes its encoder at step 6 in its own batch-start hook, which Lightning runs
    after the callbacks'; it puts the encoder in eval only while frozen, so once unfrozen
    it runs in the mode it was left in (eval)."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.global_step == 6:
            _unfreeze(self)
        if not any(p.requires_grad for p in self.encoder.parameters()):
            self.encoder.eval()


@pytest.mark.parametrize("where", ["a callback", "the module's own hook"])
def test_an_encoder_unfrozen_at_any_batch_trains_uncached(tmp_path: Path, where: str) -> None:
    """Unfrozen in the middle of an epoch — by a step-based schedule, or in the
    LightningModule's own batch-start hook — the encoder is put back uncached at that very
    batch, in the mode it would be in without the callback, with a warning, and trains
    exactly as without the callback."""

    def fit(cache: bool) -> Finetuned:
        if where == "a callback":
            return _fitted(tmp_path, Finetuned(), [_UnfreezeAtStep()], cache)
        return _fitted(tmp_path, UnfrozenAtStep(), [], cache)

    with pytest.warns(Uncached, match="`encoder` was unfrozen"):
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not isinstance(cached.encoder, CachedRows) and not is_held(cached.encoder)
    assert cached.encoder.training == plain.encoder.training
    assert not torch.equal(plain.encoder.conv.weight, Finetuned().encoder.conv.weight)
    assert torch.equal(cached.encoder.conv.weight, plain.encoder.conv.weight)
    assert torch.equal(cached.head.weight, plain.head.weight)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_stage_before_fit_with_a_store_leaves_fit_as_without_the_callback(
    tmp_path: Path, stage: str
) -> None:
    """Validation, test or predict first (Lightning runs them under inference mode, so what
    the cache makes then could be inference tensors), then fit with the same callback and a
    store: fitting keeps its own rows as usual and trains as without the callback."""
    heads = []
    for callbacks in ([CacheFrozen(tmp_path / "store", ["encoder"])], []):
        model = Probe()
        first = getattr(trainer(tmp_path, 1, callbacks=callbacks), stage)
        first(model, loader(shuffle=False, seed=2))
        trainer(tmp_path, 2, callbacks=callbacks).fit(model, loader())
        heads.append(model.head.weight.detach().clone())
        if callbacks:
            train = epochs(callbacks[0], "train")
            assert [(e.rows.computed, e.rows.recalled) for e in train] == [
                (SAMPLES, 0),
                (0, SAMPLES),
            ]
            assert train[0].rows.rows_kept == SAMPLES
    assert torch.equal(heads[0], heads[1])


def test_a_stage_before_fit_leaves_the_callbacks_own_version(tmp_path: Path) -> None:
    """Keyed by index under the callback's version, a validation run before fit keys its
    rows under the validation version only while it runs: prefill keys the training rows
    under the callback's own, so fitting recalls them and a later validation is answered
    with validation samples' features (its loss is that of a run without the callback)."""
    losses = []
    for callbacks in ([CacheFrozen(None, ["encoder"], key="index", version="toy@1")], []):
        model = Indexed()
        trainer(tmp_path, 1, callbacks=callbacks, limit_val_batches=2).validate(
            model, _indexed(2), verbose=False
        )
        if callbacks:
            callback = callbacks[0]
            assert callback.cached["encoder"].version == "toy@1"
            callback.prefill(_indexed(1), inputs=lambda item: (item[0], item[2]), progress=False)
        trainer(tmp_path, 1, callbacks=callbacks).fit(model, _indexed(1))
        again = trainer(tmp_path, 1, callbacks=callbacks)
        again.validate(model, _indexed(2), verbose=False)
        losses.append(float(again.callback_metrics["val_loss"]))
    (warm,) = epochs(callback, "prefill")
    assert (warm.rows.computed, epochs(callback, "train")[0].rows.recalled) == (SAMPLES, SAMPLES)
    assert losses[0] == losses[1]


class Pair(Probe):
    """Trains on the batches of two loaders at once, recording which samples came."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (xa, ya), (xb, yb) = batch["a"], batch["b"]
        self.order.append(ya.tolist() + yb.tolist())
        loss = nn.functional.cross_entropy(self(xa), ya)
        return loss + nn.functional.cross_entropy(self(xb), yb)


def test_several_training_loaders_shuffle_as_without_the_callback(tmp_path: Path) -> None:
    """Two training loaders shuffled by torch's global generator (no generator of their
    own) get the same batches as without the callback: each draws its shuffle's seed when
    Lightning makes its iterator, before either is fetched from."""
    from lightning.pytorch.utilities import CombinedLoader

    orders = []
    for callbacks in ([CacheFrozen(None, ["encoder"])], []):
        pl.seed_everything(0)
        loaders = {
            name: torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(*data(seed, samples)), batch_size=16, shuffle=True
            )
            for name, seed, samples in (("a", 1, SAMPLES), ("b", 4, 40))
        }
        model = Pair()
        fit = trainer(tmp_path, 3, callbacks=callbacks)
        fit.fit(model, CombinedLoader(loaders, "max_size_cycle"))
        orders.append(model.order)
    assert orders[0] == orders[1]


class _Reweigh(pl.Callback):
    """Writes the encoder's weights through ``.data`` (no version counter moves) when
    validation starts in epoch 2: another model's weights for evaluation, say."""

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            encoder = pl_module.encoder
            module = encoder.module if isinstance(encoder, CachedRows) else encoder
            module.conv.weight.data.mul_(2.0)


def test_weights_written_when_validation_starts_key_its_rows_anew(tmp_path: Path) -> None:
    """Weights written behind torch's back in ``on_validation_epoch_start`` are seen at
    validation's first batch: that validation computes its rows with them, and its loss
    is that of a run without the callback."""
    losses = []
    for callbacks in ([_Reweigh(), CacheFrozen(None, ["encoder"])], [_Reweigh()]):
        fit = trainer(tmp_path, 2, callbacks=callbacks)
        fit.fit(Probe(), loader(), loader(shuffle=False, seed=2))
        losses.append(float(fit.callback_metrics["val_loss"]))
        if len(callbacks) == 2:
            rows = [(e.rows.computed, e.rows.recalled) for e in epochs(callbacks[1], "validate")]
            assert rows == [(SAMPLES, 0), (SAMPLES, 0)]
    assert losses[0] == losses[1]


class _SwapForEvaluation(pl.Callback):
    """Puts evaluation weights in the encoder through ``.data`` when validation starts and
    the training weights back the same way when it ends, as Lightning's weight-averaging
    callbacks swap models."""

    def _weights(self, pl_module: pl.LightningModule) -> list[torch.Tensor]:
        encoder = pl_module.encoder
        module = encoder.module if isinstance(encoder, CachedRows) else encoder
        return list(module.parameters())

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.kept = [p.data.clone() for p in self._weights(pl_module)]
        for p in self._weights(pl_module):
            p.data.copy_(p.data * 0.5 + 0.05)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for p, kept in zip(self._weights(pl_module), self.kept, strict=True):
            p.data.copy_(kept)


def test_training_after_validation_inside_its_epoch_keys_rows_as_the_training_weights(
    tmp_path: Path,
) -> None:
    """Training weights put back through ``.data`` when a validation inside the epoch ends
    are seen at the next training batch: the rest of the epoch is neither recalled from nor
    kept under the evaluation weights' rows, and the head trains as without the callback."""
    heads = []
    for callbacks in (
        [_SwapForEvaluation(), CacheFrozen(None, ["encoder"])],
        [_SwapForEvaluation()],
    ):
        model = Probe()
        fit = trainer(tmp_path, 2, callbacks=callbacks, val_check_interval=0.5)
        fit.fit(model, loader(), loader(shuffle=False))
        heads.append(model.head.weight.detach().clone())
    assert torch.equal(heads[0], heads[1])


class Tuned(Probe):
    """Fine-tunes its encoder with its head: every parameter requires grad."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.requires_grad_(True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def test_a_named_module_that_requires_grad_is_frozen_with_a_warning(tmp_path: Path) -> None:
    """A named submodule whose parameters require grad is frozen while the fit runs, as the
    callback does with every module it caches, and a warning names its parameters, since
    it would have trained without the callback; it is handed back requiring grad."""
    model = Trained()
    before = model.encoder.conv.weight.detach().clone()
    with pytest.warns(FrozeTrainable, match=r"\(`encoder`: `conv.weight`, `conv.bias`, `norm"):
        trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(model, loader())
    assert torch.equal(model.encoder.conv.weight, before)
    assert all(p.requires_grad for p in model.encoder.parameters())


class TrainedWithASetup(Trained):
    """Trains its encoder with its head, and has a ``setup()`` of its own that leaves it so."""

    def setup(self, stage: str) -> None:
        self.head.requires_grad_(True)


def test_a_module_its_own_setup_leaves_requiring_grad_is_frozen_with_a_warning(
    tmp_path: Path,
) -> None:
    """A named module that still requires grad once the LightningModule's own ``setup()``
    has run is frozen for the fit with a warning naming its parameters, as one in a
    LightningModule with no ``setup()`` is, and handed back requiring grad."""
    model = TrainedWithASetup()
    before = model.encoder.conv.weight.detach().clone()
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(FrozeTrainable, match=r"\(`encoder`: `conv.weight`, `conv.bias`, `norm"):
        trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    assert torch.equal(model.encoder.conv.weight, before)
    assert all(p.requires_grad for p in model.encoder.parameters())
    assert "setup" not in vars(model)


class TwoFrozenInSetup(Probe):
    """A probe with two encoders, each requiring grad until its own ``setup()`` freezes it
    and puts it in eval, each named to a CacheFrozen of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.requires_grad_(True)
        self.other = Encoder().requires_grad_(True)

    def setup(self, stage: str) -> None:
        for encoder in (self.encoder, self.other):
            encoder.requires_grad_(False).eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x) + self.other(x)
        return self.head(features)


def test_two_callbacks_each_cache_a_module_frozen_in_the_modules_own_setup(
    tmp_path: Path,
) -> None:
    """Two CacheFrozen, each naming a module the LightningModule freezes in its own
    ``setup()``, each cache theirs once that has run: the second's wait for that
    ``setup()`` does not take the first's away, leaving its module uncached unsaid."""
    model = TwoFrozenInSetup()
    first = CacheFrozen(tmp_path / "first", ["encoder"])
    second = CacheFrozen(tmp_path / "second", ["other"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        trainer(tmp_path, 2, callbacks=[first, second]).fit(model, loader())
    assert [e.hit_rate for e in epochs(first, "train")] == [0.0, 1.0]
    assert [e.hit_rate for e in epochs(second, "train")] == [0.0, 1.0]
    assert "setup" not in vars(model)


class SavesTheModel(pl.Callback):
    """Saves the whole LightningModule in its own ``setup()``, a copy of it as it is then."""

    def __init__(self) -> None:
        self.saved = io.BytesIO()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        torch.save(pl_module, self.saved)


def test_a_module_waiting_for_its_own_setup_is_saved_whole_without_the_wait(
    tmp_path: Path,
) -> None:
    """A LightningModule a callback saves whole (``torch.save``) while a CacheFrozen waits
    for its own ``setup()`` is saved, and loads as it was but for the wait: calling the
    copy's ``setup()`` runs its own and caches nothing."""
    model = FrozenInSetup("eval")
    callback, saving = CacheFrozen(None, ["encoder"]), SavesTheModel()
    trainer(tmp_path, 1, callbacks=[callback, saving]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0]
    saving.saved.seek(0)
    copy = torch.load(saving.saved, weights_only=False)
    assert copy.encoder.conv.weight.requires_grad
    copy.setup("fit")
    assert type(copy.encoder) is Encoder and not copy.encoder.conv.weight.requires_grad
    assert len(callback.history) == 1


class ReplacedInSetup(Probe):
    """A probe whose encoder, requiring grad, its own ``setup()`` replaces with another,
    frozen and in eval (one loaded from a checkpoint there)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.requires_grad_(True)

    def setup(self, stage: str) -> None:
        if not isinstance(self.encoder, CachedRows):
            self.encoder = Encoder().requires_grad_(False).eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass


def test_an_encoder_the_modules_own_setup_replaces_is_cached_as_it_put_it(
    tmp_path: Path,
) -> None:
    """A module the LightningModule's own ``setup()`` puts in place of the one named is
    the one cached, as found then: frozen there, with no warning, where the one it
    replaced was warned of as frozen for the fit (FrozeTrainable) though nothing ran it,
    and the one put in its place ran uncached."""
    model = ReplacedInSetup()
    callback = CacheFrozen(None, ["encoder"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    assert type(model.encoder) is Encoder and not is_held(model.encoder)
    assert not any(p.requires_grad for p in model.encoder.parameters())


def test_two_callbacks_naming_a_module_frozen_in_the_modules_own_setup_are_refused(
    tmp_path: Path,
) -> None:
    """Two CacheFrozen naming the same module, which the LightningModule freezes in its own
    ``setup()``, are refused once that has run, as they are for one frozen before fitting:
    the second does not cache the module inside the first's cache, nor leave it unsaid."""
    callbacks = [CacheFrozen(tmp_path / "first", ["encoder"]), CacheFrozen(None, ["encoder"])]
    with pytest.raises(CacheFrozenError, match="`encoder` is cached per row already"):
        trainer(tmp_path, 1, callbacks=callbacks).fit(FrozenInSetup("eval"), loader())


def test_naming_everything_the_fit_trains_is_refused(tmp_path: Path) -> None:
    """Naming the head by mistake would leave nothing to train: refused at setup, saying
    so, rather than at the first backward."""
    callback = CacheFrozen(None, ["encoder.conv", "head"])
    with pytest.raises(CacheFrozenError, match=r"\(`head`: `weight`, `bias`\): caching freezes"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(Probe(), loader())
    assert Probe().head.weight.requires_grad


class HeadMadeLate(Trained):
    """Trains its encoder with a head it makes in ``configure_model``, after the callbacks'
    ``setup``."""

    def __init__(self) -> None:
        super().__init__()
        del self.head

    def configure_model(self) -> None:
        if not hasattr(self, "head"):
            self.head = nn.Linear(8, 4)
            self.made = self.head.weight.detach().clone()


def test_a_head_made_in_configure_model_is_left_to_train(tmp_path: Path) -> None:
    """A head made in ``configure_model`` is not there when the callback caches the
    encoder: the encoder that requires grad is frozen with a warning, and the head trains,
    rather than the fit refused for naming everything it trains."""
    model = HeadMadeLate()
    with pytest.warns(FrozeTrainable, match=r"\(`encoder`: `conv.weight`"):
        trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(model, loader())
    assert not torch.equal(model.head.weight, model.made)


def test_naming_everything_a_module_making_modules_late_trains_is_refused(
    tmp_path: Path,
) -> None:
    """A LightningModule with a ``configure_model`` of its own is looked at again when
    fitting starts: naming all it trains is refused then, saying so, and the model is handed
    back as it was."""
    model = HeadMadeLate()
    callback = CacheFrozen(None, ["encoder", "head"])
    model.configure_model()
    with pytest.raises(CacheFrozenError, match=r"\(`encoder`: .*`head`: `weight`, `bias`\)"):
        trainer(tmp_path, 1, callbacks=[callback]).fit(model, loader())
    assert type(model.head) is nn.Linear and model.head.weight.requires_grad


class TiedHead(Probe):
    """A head whose weight holds the frozen encoder's numbers: the very same parameter, or
    another one over the same memory (``nn.Parameter(weight.data)``)."""

    def __init__(self, same: bool) -> None:
        super().__init__()
        self.tied = nn.Conv2d(3, 8, 3, 2, 1)
        weight = self.encoder.conv.weight
        self.tied.weight = weight if same else nn.Parameter(weight.data)
        self.tied.weight.requires_grad_(True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([*self.head.parameters(), self.tied.weight], lr=self.lr)


@pytest.mark.parametrize("same", [True, False], ids=["same-parameter", "same-memory"])
def test_a_cached_weight_a_trained_part_shares_is_refused(tmp_path: Path, same: bool) -> None:
    """A trained part holding the cached encoder's numbers would either stop training
    (the very same parameter, frozen by caching) or rewrite the weights under their
    cached rows (another parameter over the same memory): refused at setup, naming both,
    and the model is left as it was."""
    model = TiedHead(same)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozeTrainable)  # the same parameter requires grad
        with pytest.raises(
            CacheFrozenError, match=r"`encoder\.conv\.weight` is frozen.*`tied\.weight`"
        ):
            trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(model, loader())
    assert model.tied.weight.requires_grad and isinstance(model.encoder, Encoder)


class TiedLate(Trained):
    """Trains a head it makes in ``configure_model``, after the callbacks' ``setup``, whose
    weight is the encoder's (the very same parameter, which the encoder trains with when
    uncached), another parameter over its numbers, or a copy of its own."""

    def __init__(self, tie: str) -> None:
        super().__init__()
        self.tie = tie
        self.steps = 0

    def configure_model(self) -> None:
        if hasattr(self, "tied"):
            return
        self.tied = nn.Conv2d(3, 8, 3, 2, 1)
        weight = self.encoder.conv.weight
        if self.tie == "same-parameter":
            self.tied.weight = weight
        else:
            made = weight.data if self.tie == "same-memory" else weight.detach().clone()
            self.tied.weight = nn.Parameter(made)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        return nn.functional.cross_entropy(self(x), y) + self.tied(x).square().mean()


@pytest.mark.parametrize("tie", ["same-parameter", "same-memory"])
def test_a_cached_weight_a_head_made_in_configure_model_shares_is_refused(
    tmp_path: Path, tie: str
) -> None:
    """A head ``configure_model`` makes after the callback cached the encoder, sharing a
    cached weight, would stop training or rewrite the weights under their cached rows: it
    is refused when fitting starts, as at setup, before any step runs, and the model is
    handed back as it was."""
    model = TiedLate(tie)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozeTrainable)  # the encoder requires grad
        with pytest.raises(
            CacheFrozenError, match=r"`encoder\.conv\.weight` is frozen.*`tied\.weight`"
        ):
            trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(model, loader())
    assert model.steps == 0
    assert isinstance(model.encoder, Encoder) and model.tied.weight.requires_grad


class TiedInSetup(TiedLate):
    """Makes its tied head in its own ``setup``, which Lightning runs after the callbacks'."""

    def configure_model(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        TiedLate.configure_model(self)


def test_a_cached_weight_a_head_made_in_the_modules_own_setup_shares_is_refused(
    tmp_path: Path,
) -> None:
    """A head the LightningModule's own ``setup`` makes, after the callback's, sharing a
    cached weight is refused when fitting starts, before any step runs."""
    model = TiedInSetup("same-memory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FrozeTrainable)  # the encoder requires grad
        with pytest.raises(CacheFrozenError, match=r"`encoder\.conv\.weight` is frozen"):
            trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["encoder"])]).fit(model, loader())
    assert model.steps == 0


def test_a_head_made_in_configure_model_with_a_weight_of_its_own_fits(tmp_path: Path) -> None:
    """A head ``configure_model`` makes with a copy of the encoder's weight shares nothing
    with it: the fit runs, cached, and the head trains."""
    model = TiedLate("copy")
    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(FrozeTrainable):
        trainer(tmp_path, 2, callbacks=[callback]).fit(model, loader())
    assert model.steps == 8
    assert not torch.equal(model.tied.weight, model.encoder.conv.weight)
    assert epochs(callback, "train")[1].rows.recalled == SAMPLES


class _Backbone(BaseFinetuning):
    """A fine-tuning callback that freezes the encoder in its own ``setup``."""

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.freeze(pl_module.encoder, train_bn=False)

    def finetune_function(self, pl_module: pl.LightningModule, epoch: int, optimizer: Any) -> None:
        pass


def test_no_warning_when_a_finetuning_callback_freezes_the_module(tmp_path: Path) -> None:
    """A fine-tuning callback freezes what it schedules in its own ``setup`` (after this
    callback's, when listed after it): the encoder requiring grad then is no mistake, and
    one in eval is cached. In train mode its BatchNorm would run on batch statistics
    without the callback: it is left uncached, saying so."""
    model = Tuned()
    model.encoder.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SomatizeWarning)
        callback = CacheFrozen(None, ["encoder"])
        trainer(tmp_path, 2, callbacks=[callback, _Backbone()]).fit(model, loader())
    assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]

    callback = CacheFrozen(None, ["encoder"])
    with pytest.warns(Uncached, match=r"`encoder`: its parts `norm` run in train mode"):
        trainer(tmp_path, 1, callbacks=[callback, _Backbone()]).fit(Tuned(), loader())
    assert not callback.cached and not callback.history


class Backboned(Probe):
    """A probe whose encoder is ``backbone``, where ``BackboneFinetuning`` finds it, left
    in train mode, trained by an optimizer of whatever requires grad."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = self.encoder
        del self.encoder

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.backbone(x))
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


@pytest.mark.parametrize("first", ["fine-tuning", "caching"])
def test_what_a_finetuning_callback_leaves_to_train_is_left_uncached(
    tmp_path: Path, first: str
) -> None:
    """``BackboneFinetuning`` (``train_bn=True``) leaves the backbone's BatchNorm to train:
    listed before the callback or after it, the backbone is left uncached with a warning
    naming those parameters, and trains exactly as without the callback."""

    def fit(cache: bool) -> Backboned:
        model = Backboned()
        tuner = BackboneFinetuning(unfreeze_backbone_at_epoch=5)
        callbacks: list[pl.Callback] = [tuner]
        if cache:
            callback = CacheFrozen(None, ["backbone"])
            callbacks = [tuner, callback] if first == "fine-tuning" else [callback, tuner]
        trainer(tmp_path, 1, callbacks=callbacks, limit_train_batches=2).fit(model, loader())
        return model

    with pytest.warns(Uncached, match=r"`backbone`: its parameters `norm.weight`, `norm.bias`"):
        cached = fit(cache=True)
    plain = fit(cache=False)
    assert not torch.equal(plain.backbone.norm.weight, Backboned().backbone.norm.weight)
    assert torch.equal(cached.backbone.norm.weight, plain.backbone.norm.weight)
    assert torch.equal(cached.backbone.norm.running_mean, plain.backbone.norm.running_mean)
    assert torch.equal(cached.head.weight, plain.head.weight)


class _FreezesWhole(BackboneFinetuning):
    """``BackboneFinetuning`` freezing the backbone whole, its BatchNorm layers too."""

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.freeze(pl_module.backbone, train_bn=False)


def test_the_way_to_cache_a_backbone_a_schedule_leaves_to_train_is_one_that_works(
    tmp_path: Path,
) -> None:
    """``BackboneFinetuning`` leaves the backbone's BatchNorm layers to train whatever its
    ``train_bn`` (which says only what unfreezing trains): the warning says to freeze them
    in ``freeze_before_training``, and a backbone frozen so, in eval, is cached."""
    model = Backboned()
    model.backbone.eval()
    tuner = BackboneFinetuning(unfreeze_backbone_at_epoch=5, train_bn=False)
    with pytest.warns(Uncached, match=r"`freeze_before_training`.*train_bn=False"):
        trainer(tmp_path, 1, callbacks=[CacheFrozen(None, ["backbone"]), tuner]).fit(
            model, loader()
        )
    model = Backboned()
    model.backbone.eval()
    callback = CacheFrozen(None, ["backbone"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", Uncached)
        trainer(tmp_path, 1, callbacks=[callback, _FreezesWhole(5)]).fit(model, loader())
    assert [e.rows.computed for e in epochs(callback, "train")] == [SAMPLES]


def test_an_uncached_module_lets_go_of_its_cache(tmp_path: Path) -> None:
    """Once its module is put back uncached, nothing holds the cache any more — not the
    loaders fetched ahead for it — so its memory tiers are freed."""
    seen: list[weakref.ref[CachedRows]] = []

    class Grab(pl.Callback):
        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if isinstance(pl_module.encoder, CachedRows):
                seen.append(weakref.ref(pl_module.encoder))

    class Unfreeze(pl.Callback):
        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if trainer.current_epoch == 3:
                pl_module.encoder.requires_grad_(True)

    model = Probe()
    callbacks = [Grab(), Unfreeze(), CacheFrozen(None, ["encoder"])]
    with pytest.warns(Uncached):
        fit = trainer(tmp_path, 4, callbacks=callbacks)
        fit.fit(model, loader(), loader(shuffle=False, seed=2))
    assert type(model.encoder) is Encoder
    assert any(isinstance(d, Ahead) for d in fit.fit_loop._combined_loader.flattened)
    gc.collect()
    assert seen and seen[0]() is None


def _deferred(seed: int = 1) -> torch.utils.data.DataLoader[Any]:
    """:func:`loader`'s samples in its order, from a ``Deferred`` dataset."""
    images, labels = data(seed)
    return torch.utils.data.DataLoader(
        Deferred(images, labels, version=f"deferred@{seed}"),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(7),
    )


class _UnfreezeEncoder(pl.Callback):
    """A fine-tuning schedule by epoch: the encoder trains from epoch 2."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            _unfreeze(pl_module)


@pytest.mark.parametrize("when", ["an epoch's start", "a batch", "setup", "a later fit"])
def test_a_module_running_uncached_takes_deferred_rows(tmp_path: Path, when: str) -> None:
    """Handed batches of a ``Deferred`` dataset, an encoder that runs uncached — unfrozen at
    an epoch's start or at a batch, left to train by a fine-tuning callback at setup, or
    unfrozen in an earlier fit — loads their inputs itself and trains exactly as without
    the callback on the inputs; the model handed back holds no hook of the callback's."""

    def fit(cache: bool) -> pl.LightningModule:
        callbacks: list[pl.Callback] = []
        model: pl.LightningModule = Finetuned()
        if when == "setup":
            model = Backboned()
            callbacks = [BackboneFinetuning(unfreeze_backbone_at_epoch=5)]
        elif when == "a batch":
            callbacks = [_UnfreezeAtStep()]
        else:
            callbacks = [_UnfreezeEncoder()]
        count = 1 if when == "setup" else 3
        if cache:
            name = "backbone" if when == "setup" else "encoder"
            callbacks.append(CacheFrozen(None, [name], key="index"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Uncached)  # said so, as tested elsewhere
            run = trainer(tmp_path, count, callbacks=callbacks, limit_train_batches=4)
            run.fit(model, _deferred() if cache else loader())
            if when == "a later fit":
                run = trainer(tmp_path, 4, callbacks=callbacks, limit_train_batches=4)
                run.fit(model, _deferred() if cache else loader())
        return model

    cached, plain = fit(cache=True), fit(cache=False)
    for (name, mine), theirs in zip(cached.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs), name
    assert all(not m._forward_pre_hooks for m in cached.modules())


class _ByName(Finetuned):
    """Hands its encoder the batch by name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x=x))


def test_a_module_running_uncached_takes_deferred_rows_by_name(tmp_path: Path) -> None:
    """Handed a batch of a ``Deferred`` dataset by name (``encoder(x=rows)``), an encoder
    unfrozen at an epoch's start loads the inputs itself and trains exactly as without
    the callback on the inputs."""
    models = []
    for cached in (True, False):
        callbacks: list[pl.Callback] = [_UnfreezeEncoder()]
        if cached:
            callbacks.append(CacheFrozen(None, ["encoder"], key="index"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Uncached)  # said so, as tested elsewhere
            run = trainer(tmp_path, 2, callbacks=callbacks, limit_train_batches=4)
            run.fit(model := _ByName(), _deferred() if cached else loader())
        models.append(model)
    for mine, theirs in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(mine, theirs)


class _Pixels(Encoder):
    """An encoder whose forward names its input as an image model's does."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return super().forward(pixel_values)


class _ByItsName(Probe):
    """Hands its encoder the batch by the name the encoder's forward gives it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = _Pixels().requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(pixel_values=x)
        return self.head(features)


def test_a_cached_module_takes_its_batch_by_the_name_its_forward_gives_it(
    tmp_path: Path,
) -> None:
    """A LightningModule calling its encoder with the batch by name
    (``self.encoder(pixel_values=x)``, as image and text models are called) has it cached
    as one called by place: epoch 2 recalls every row, and the head trains exactly as
    without the callback."""
    models = []
    for cached in (True, False):
        callback = CacheFrozen(None, ["encoder"])
        run = trainer(tmp_path, 2, callbacks=[callback] if cached else [])
        run.fit(model := _ByItsName(), loader(shuffle=True))
        models.append(model)
        if cached:
            assert [e.hit_rate for e in epochs(callback, "train")] == [0.0, 1.0]
    for mine, theirs in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(mine, theirs)


class _CopiesMidStage(pl.Callback):
    """Saves the model, and copies its backbone, at the stage's first batch."""

    def __init__(self) -> None:
        self.saved: pl.LightningModule | None = None
        self.copied: nn.Module | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == 0:
            held = io.BytesIO()
            torch.save(pl_module, held)
            held.seek(0)
            self.saved = torch.load(held, weights_only=False)
            self.copied = copy.deepcopy(pl_module.backbone)


def test_a_model_saved_or_copied_mid_stage_carries_a_pass_through_that_does_nothing(
    tmp_path: Path,
) -> None:
    """A model running a module uncached saves and copies mid-stage; the copies carry the
    pass-through, which does nothing for them (``index=`` is passed on as it came), and
    answer alike."""
    model = Backboned()
    copies = _CopiesMidStage()
    callbacks = [BackboneFinetuning(unfreeze_backbone_at_epoch=5), copies]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Uncached)  # said so, as tested elsewhere
        trainer(tmp_path, 1, callbacks=[*callbacks, CacheFrozen(None, ["backbone"])]).fit(
            model, loader()
        )
    assert copies.saved is not None and copies.copied is not None
    x = data()[0][:4]
    for backbone in (copies.saved.backbone, copies.copied):
        hooks = list(backbone._forward_pre_hooks.values())
        assert len(hooks) == 1
        assert hooks[0](backbone, (x,), {"index": torch.arange(4)}) is None
        backbone.eval()
    saved, copied = copies.saved.backbone(x), copies.copied(x)
    torch.testing.assert_close(saved, copied, rtol=0, atol=0)


class _SwapsForItsOwnCache(Probe):
    """Puts a row cache of its own, keyed by index, in place of its encoder at the second
    epoch's start."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.own = cache_rows(Encoder().requires_grad_(False), None, key="index")
            self.encoder = self.own


def test_a_row_cache_put_in_place_of_the_encoder_takes_deferred_rows_itself(
    tmp_path: Path,
) -> None:
    """A row cache put in place of the cached encoder takes the batches of a ``Deferred``
    dataset as they come, loading only the rows it computes: nothing is loaded for it."""
    images, labels = data(1)
    counted = _Counted(images)
    deferred = torch.utils.data.DataLoader(
        Deferred(counted, labels, version="own@1"), batch_size=16
    )
    model = _SwapsForItsOwnCache()
    with pytest.warns(Uncached, match="replaced in the model by a `CachedRows`"):
        trainer(tmp_path, 3, callbacks=[CacheFrozen(None, ["encoder"], key="index")]).fit(
            model, deferred
        )
    assert model.own.stats.computed == SAMPLES and model.own.stats.recalled == SAMPLES
    assert counted.loaded == 2 * SAMPLES  # once for each cache: none loaded twice by one


class IndexedAlways(Finetuned):
    """Calls its encoder by sample index whenever the callback caches it."""

    def __init__(self, cached: bool) -> None:
        super().__init__()
        self.cached = cached

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        features = self.encoder(x, index=index) if self.cached else self.encoder(x)
        return nn.functional.cross_entropy(self.head(features), y)


def test_a_module_running_uncached_takes_the_index_its_cache_took(tmp_path: Path) -> None:
    """Called as its cache was (``encoder(x, index=idx)``), an encoder unfrozen at an
    epoch's start runs on ``x`` alone and trains exactly as without the callback."""
    models = []
    for cached in (True, False):
        callbacks: list[pl.Callback] = [_UnfreezeEncoder()]
        if cached:
            callbacks.append(CacheFrozen(None, ["encoder"], key="index", version="toy@1"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Uncached)  # said so, as tested elsewhere
            trainer(tmp_path, 2, callbacks=callbacks).fit(
                model := IndexedAlways(cached), _indexed(1)
            )
        models.append(model)
    for mine, theirs in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(mine, theirs)


class _HyperNode(Node, pl.LightningModule):
    """A node that is a LightningModule, saving its constructor's arguments."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


class _WiderHyperNode(_HyperNode):
    """Adds an argument of its own, saved with its parent's."""

    def __init__(self, lr: float = 0.1, width: int = 8) -> None:
        super().__init__(lr)


def test_a_node_that_is_a_lightning_module_saves_every_constructor_argument() -> None:
    """``save_hyperparameters`` reads the arguments of each constructor along the chain
    from their frames: a node class's constructor is left as written where the chain
    holds another library's, so a subclass's arguments are saved whether or not a node
    of its parent class was made first."""
    _HyperNode(0.3)
    assert dict(_WiderHyperNode(0.2, width=16).hparams) == {"lr": 0.2, "width": 16}


class _WrappedProbe(pl.LightningModule):
    """A head on an encoder that a model made by ``somatize.torch.wrap`` declares
    (frozen and cached per batch there)."""

    def __init__(self, store: Path, declared: bool) -> None:
        super().__init__()
        names = ["encoder"] if declared else []
        self.net = wrap(Inner(), frozen=names, cached=names, store=store)
        if declared:
            freeze(self.net)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.cross_entropy(self.net(x), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "traced"])
def test_a_part_a_wrapped_model_holds_fixed_is_refused_saying_so(
    tmp_path: Path, declared: bool
) -> None:
    """A submodule that a model made by ``somatize.torch.wrap`` holds fixed — declared
    there, or traced into its code — is refused when the callback is set up, saying it
    is the wrapped model's, and the model is left as it was."""
    model = _WrappedProbe(tmp_path / "wrapped", declared)
    encoder = model.net.encoder
    grads = [p.requires_grad for p in encoder.parameters()]
    fit = trainer(tmp_path, 1, callbacks=[CacheFrozen(tmp_path / "rows", ["net.encoder"])])
    with pytest.raises(CacheFrozenError, match=r"`net.encoder` .*`somatize.torch.wrap`"):
        fit.fit(model, loader())
    assert model.net.encoder is encoder and type(encoder) is Encoder
    assert [p.requires_grad for p in encoder.parameters()] == grads
    assert is_held(encoder) == declared  # frozen by `freeze` only where declared


class _HeldStem(nn.Module):
    """An encoder whose stem comes first, its BatchNorm after it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        self.norm = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.stem(x))).mean((2, 3))


class _HeldStemProbe(Probe):
    """A head on an encoder made by ``somatize.torch.wrap`` with its stem declared frozen
    (held in eval there), the encoder frozen by ``requires_grad_(False)`` alone: its
    BatchNorm, after the stem, runs in train mode in a plain fit."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = wrap(_HeldStem(), frozen=["stem"])
        freeze(self.encoder)
        self.encoder.requires_grad_(False)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        pass


def test_a_part_after_one_held_on_its_own_keeps_its_train_mode(tmp_path: Path) -> None:
    """Holding a module whose stem is held on its own (frozen in a wrapped model) put the
    parts after the stem in eval as if eval had been asked of them: the callback took
    the encoder's BatchNorm for one in eval, cached it, and the head trained on features
    normalized otherwise than without the callback, the model handed back with that
    BatchNorm in eval. It runs in train mode, uncached, with a warning saying so."""

    def fit(cache: bool) -> _HeldStemProbe:
        model = _HeldStemProbe()
        callbacks: list[pl.Callback] = [CacheFrozen(None, ["encoder"])] if cache else []
        trainer(tmp_path, 2, callbacks=callbacks).fit(model, loader())
        return model

    with pytest.warns(Uncached, match=r"`encoder` would run in train mode.*`norm`"):
        cached = fit(cache=True)
    plain = fit(cache=False)
    modes = {name: m.training for name, m in cached.named_modules()}
    assert modes == {name: m.training for name, m in plain.named_modules()}
    assert modes["encoder.norm"] and not modes["encoder.stem"]
    assert torch.equal(cached.encoder.norm.running_mean, plain.encoder.norm.running_mean)
    assert torch.equal(cached.head.weight, plain.head.weight)


class _WrappedEncoderProbe(Probe):
    """A probe whose encoder is made by ``somatize.torch.wrap``, its conv cached per batch
    in a store of its own."""

    def __init__(self, parts: Path) -> None:
        super().__init__()
        self.encoder = wrap(self.encoder, frozen=["conv"], cached=["conv"], store=parts)
        freeze(self.encoder)


def test_an_encoder_with_a_part_cached_per_batch_recalls_its_rows(tmp_path: Path) -> None:
    """An encoder made by ``somatize.torch.wrap`` with a part cached per batch counts that
    part's facts as it runs: the callback read those counts as a setting of the encoder,
    keyed its rows anew at each epoch, and recalled none. They are no part of the key: the
    second epoch recalls every row."""
    callback = CacheFrozen(None, ["encoder"])
    trainer(tmp_path, 2, callbacks=[callback]).fit(
        _WrappedEncoderProbe(tmp_path / "parts"), loader()
    )
    assert epochs(callback, "train")[1].rows.recalled == SAMPLES


class GivenAStore(Probe):
    """A probe given the store its encoder's rows are kept in, which Lightning saves with
    its other hyperparameters (in each checkpoint, and in the logger's hparams.yaml)."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.store = store


def test_a_checkpoint_of_a_module_given_a_bucket_store_holds_none_of_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module given a bucket store that saves its hyperparameters writes none of the
    store's credentials into a checkpoint or hparams.yaml; the store loaded from the
    checkpoint reaches the bucket with the credentials of the process that loads it."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    credentials = {"secret": "a-secret-no-checkpoint-holds", "token": "a-token-none-holds"}
    store = Store.on_bucket(s3_url(), **{**s3_options(), **credentials})
    run = trainer(
        tmp_path,
        1,
        callbacks=[CacheFrozen(store, ["encoder"]), ModelCheckpoint(dirpath=tmp_path / "ckpt")],
        enable_checkpointing=True,
        logger=CSVLogger(tmp_path / "logs"),
    )
    run.fit(GivenAStore(store), loader())
    written = sorted(tmp_path.rglob("*.ckpt")) + sorted(tmp_path.rglob("hparams.yaml"))
    assert [path.suffix for path in written] == [".ckpt", ".yaml"]
    assert "store" in written[1].read_text()  # saved, without what it was opened with
    for path in written:
        for secret in credentials.values():
            assert secret.encode() not in path.read_bytes()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    loaded = torch.load(written[0], weights_only=False)["hyper_parameters"]["store"]
    assert bytes(loaded.get(loaded.put(b"read back"))) == b"read back"


class _CheckpointedOnASignal(Probe):
    """A probe whose second step is interrupted, inside a call into the store, by a
    handler that saves a checkpoint (as Lightning does on a cluster's requeue signal)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1:
            cache = next(c for c in self.trainer.callbacks if isinstance(c, CacheFrozen))
            with cache._cached["encoder"].store._lock:  # as a forward reading rows holds it
                self.trainer.save_checkpoint(self.path)
        return loss


def test_a_checkpoint_saved_inside_a_call_into_the_store_is_saved(tmp_path: Path) -> None:
    """A checkpoint saved by a signal handler that ran inside a call into the store (a
    requeue signal landing in a forward's lookup) cannot wait for the rows in flight: it
    is saved without, rather than fail the fit, and the rows are written all the same."""
    store = tmp_path / "store"
    model = _CheckpointedOnASignal(tmp_path / "requeue.ckpt")
    cache = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 1, callbacks=[cache]).fit(model, loader(shuffle=False))
    assert (tmp_path / "requeue.ckpt").exists()
    assert cache.history[0].rows.computed > 0
    again = CacheFrozen(store, ["encoder"])
    trainer(tmp_path, 1, callbacks=[again]).fit(Probe(), loader(shuffle=False))
    assert again.history[0].rows.computed == 0
    assert again.history[0].rows.recalled == cache.history[0].rows.computed


def _doubled(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * 2


def _shifted(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output + 1


class HooksItsEncoder(Probe):
    """Adds a forward hook to its encoder at the second epoch's start, as a feature
    monitor or a scaling hook of a user's own would."""

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.encoder.register_forward_hook(_doubled)


def test_a_hook_added_to_the_encoder_during_a_fit_stays_on_the_plain_model(
    tmp_path: Path,
) -> None:
    """A forward hook the LightningModule adds to its encoder during a fit is on the
    encoder handed back, ahead of one added after: the model answers, and a second fit
    trains the head, as without the callback."""
    images = data()[0][:8]

    def fitted(cache: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model = HooksItsEncoder()
        callbacks = [CacheFrozen(tmp_path / f"store-{cache}", ["encoder"])] if cache else []
        trainer(tmp_path, 2, callbacks=callbacks).fit(model, loader())
        alone = model.encoder(images)
        model.encoder.register_forward_hook(_shifted)
        trainer(tmp_path, 2, callbacks=callbacks).fit(model, loader())
        return alone, model.encoder(images), model.head.weight.detach().clone()

    for plain, cached in zip(fitted(cache=False), fitted(cache=True), strict=True):
        assert torch.equal(cached, plain)
