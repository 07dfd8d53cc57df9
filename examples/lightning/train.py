"""Train a linear head on a frozen encoder with Lightning, caching the encoder across epochs.

Run it from the repository root::

    python examples/lightning/train.py            # a fresh store in a temporary directory
    python examples/lightning/train.py --store features/   # keep the features for next time
    python examples/lightning/train.py --deferred  # images loaded only for rows computed

It makes its own data (no downloads): images drawn around one smooth pattern per
class, plus noise. The encoder is a small convolutional network, frozen; only
the head trains. One line — ``CacheFrozen(store, ["encoder"])`` in the
trainer's callbacks — caches the encoder's answer for every image: epoch 1
computes and keeps them, every later epoch recalls them (shuffled batches and
all) and costs about what training the head alone costs. The table printed at
the end shows each epoch's time, hit rate and rows, and the speed-up of the
later epochs over the first.

With ``--deferred`` rows are keyed by sample index and the loaders hand out each
image only until the cache has answered its sample (``somatize.torch.Deferred``),
so from epoch 2 no image is read at all.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from somatize import SomatizeWarning
from somatize.torch import Deferred
from somatize.torch.lightning import CacheFrozen

CLASSES = 10


class Encoder(nn.Module):
    """A frozen convolutional encoder: 3×32×32 images to 128 features (32 channels on
    a 2×2 grid)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


class Probe(pl.LightningModule):
    """A linear head on a frozen encoder."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = Encoder()
        self.encoder.requires_grad_(False)
        self.head = nn.Linear(128, CLASSES)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x)
        out: torch.Tensor = self.head(features)
        return out

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.encoder.eval()  # a frozen encoder's BatchNorm statistics must not move

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.cross_entropy(self(x), y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.head.parameters(), lr=self.lr)


def make_data(samples: int, seed: int = 0) -> TensorDataset:
    """Images around one smooth pattern per class (the same patterns for every seed),
    plus noise; the same images for one seed."""
    patterns = torch.randn(CLASSES, 3, 2, 2, generator=torch.Generator().manual_seed(99))
    patterns = nn.functional.interpolate(patterns, size=32, mode="bilinear")
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    images = patterns[labels] + 1.0 * torch.randn(samples, 3, 32, 32, generator=generator)
    return TensorDataset(images, labels)


def loaders(
    samples: int = 2048, batch_size: int = 64, deferred: bool = False
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """A shuffled training loader and a validation loader; with ``deferred``, their images
    are not loaded until a cache keyed by index computes their rows."""
    sets = []
    for seed, count in ((0, samples), (1, samples // 4)):
        data: Dataset[Any] = make_data(count, seed)
        if deferred:
            images, labels = data.tensors  # type: ignore[attr-defined]
            data = Deferred(images, labels, version=f"example/{count}@seed{seed}")
        sets.append(data)
    train = DataLoader(sets[0], batch_size=batch_size, shuffle=True)
    val = DataLoader(sets[1], batch_size=256)
    return train, val


def quiet() -> None:
    """Lightning's start-up notes and its advice about DataLoader workers, silenced;
    somatize's own warnings still show."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    # A callback's warning is told as raised where Lightning called the hook, so the
    # filter above would swallow somatize's own (NeverHits, Uncached, ...) with its advice.
    warnings.filterwarnings("default", category=SomatizeWarning)


def trainer(epochs: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    """A quiet CPU trainer."""
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tempfile.gettempdir(),
    )


class EpochClock(pl.Callback):
    """Wall time of each training epoch (its validation included)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--store", help="where features are kept (default: a temporary dir)")
    parser.add_argument(
        "--deferred", action="store_true", help="key rows by index; load images only to compute"
    )
    args = parser.parse_args()
    quiet()

    with tempfile.TemporaryDirectory() as scratch:
        store = args.store or scratch
        cache = CacheFrozen(store, ["encoder"], key="index" if args.deferred else "content")
        clock = EpochClock()
        train, val = loaders(args.samples, deferred=args.deferred)
        model = Probe()
        fit = trainer(args.epochs, [cache, clock])
        fit.fit(model, train, val)
        cache.cached["encoder"].flush()

    rows = [e for e in cache.history if e.stage == "train"]
    print(f"\nA linear head on a frozen encoder, {args.samples} images, features cached in")
    accuracy = float(fit.callback_metrics["val_acc"])
    print(f"{args.store or 'a temporary directory'}; validation accuracy {accuracy:.2f}\n")
    print(f"{'epoch':>5}  {'seconds':>7}  {'hit rate':>8}  {'computed':>8}  {'recalled':>8}")
    for epoch, seconds in zip(rows, clock.seconds, strict=True):
        stats = epoch.rows
        print(
            f"{epoch.epoch + 1:>5}  {seconds:>7.2f}  {stats.hit_rate:>8.0%}  "
            f"{stats.computed:>8}  {stats.recalled:>8}"
        )
    if len(clock.seconds) > 1:
        later = sum(clock.seconds[1:]) / len(clock.seconds[1:])
        first = rows[0].rows
        if first.recalled == 0:
            did = "computed every feature"
        elif first.computed == 0:
            did = "recalled every feature from the store"
        else:
            did = f"computed {first.computed} features and recalled {first.recalled}"
        print(
            f"\nepochs 2+ take {later:.2f} s on average: {clock.seconds[0] / later:.1f}x faster "
            f"than epoch 1, which {did}"
        )


if __name__ == "__main__":
    main()
