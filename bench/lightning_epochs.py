"""Epoch times of the Lightning example with and without CacheFrozen, against the bound.

Three runs of ``examples/lightning/train.py``'s probe, same data, same trainer:

- **plain**: no callback; the frozen encoder runs on every batch of every epoch;
- **cached**: ``CacheFrozen(store, ["encoder"])``; epoch 1 computes and keeps, 2+ recall;
- **bound**: the features precomputed once, outside the timing, and a head-only
  LightningModule trained on them — what an epoch costs when the encoder costs
  nothing, the best a cache can do.

Printed: each run's epoch 1 and mean epoch 2+ time (validation included), and the
ratios cached/bound (target: epoch 2+ within 1.3x) and plain/cached.
Run: ``python bench/lightning_epochs.py [--epochs 4] [--samples 2048]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from somatize.torch.lightning import CacheFrozen

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lightning" / "train.py"
spec = importlib.util.spec_from_file_location("lightning_example", EXAMPLE)
assert spec is not None and spec.loader is not None
example = importlib.util.module_from_spec(spec)
sys.modules["lightning_example"] = example
spec.loader.exec_module(example)


class Head(pl.LightningModule):
    """The example's head alone, trained on precomputed features."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        example.Encoder()  # draw the same initial head weights as the probe
        self.head = nn.Linear(128, example.CLASSES)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = nn.functional.cross_entropy(self.head(x), y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self.head(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.head.parameters(), lr=self.lr)


def features(loader: DataLoader[Any], shuffle: bool, batch_size: int) -> DataLoader[Any]:
    encoder = example.Probe().encoder.eval()
    with torch.no_grad():
        pairs = [(encoder(x), y) for x, y in loader]
    xs = torch.cat([p[0] for p in pairs])
    ys = torch.cat([p[1] for p in pairs])
    return DataLoader(TensorDataset(xs, ys), batch_size=batch_size, shuffle=shuffle)


def timed(
    model: pl.LightningModule, train: Any, val: Any, epochs: int, extra: list[Any]
) -> list[float]:
    clock = example.EpochClock()
    example.trainer(epochs, [*extra, clock]).fit(model, train, val)
    return clock.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()
    example.quiet()
    torch.manual_seed(0)
    train, val = example.loaders(args.samples)

    runs: dict[str, list[float]] = {}
    runs["plain"] = timed(example.Probe(), train, val, args.epochs, [])
    with tempfile.TemporaryDirectory() as scratch:
        runs["cached"] = timed(
            example.Probe(), train, val, args.epochs, [CacheFrozen(scratch, ["encoder"])]
        )
    bound_train = features(train, True, train.batch_size or 64)
    bound_val = features(val, False, val.batch_size or 256)
    runs["bound"] = timed(Head(), bound_train, bound_val, args.epochs, [])

    def later(seconds: list[float]) -> float:
        return sum(seconds[1:]) / max(1, len(seconds) - 1)

    print(f"\n{args.samples} images, {args.epochs} epochs, torch threads {torch.get_num_threads()}")
    print(f"{'run':>8}  {'epoch 1 s':>9}  {'epoch 2+ s':>10}")
    for name, seconds in runs.items():
        print(f"{name:>8}  {seconds[0]:>9.3f}  {later(seconds):>10.3f}")
    cached, plain, bound = later(runs["cached"]), later(runs["plain"]), later(runs["bound"])
    print(f"\ncached / bound, epoch 2+: {cached / bound:.2f}x   (target <= 1.3x)")
    print(f"plain / cached, epoch 2+: {plain / cached:.2f}x")
    print(f"cached epoch 1 / plain epoch 1: {runs['cached'][0] / runs['plain'][0]:.2f}x")


if __name__ == "__main__":
    main()
