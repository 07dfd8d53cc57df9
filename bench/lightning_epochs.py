"""Epoch times of the Lightning example with and without CacheFrozen, against the bound.

Runs of ``examples/lightning/train.py``'s probe, same data, same trainer:

- **plain**: no callback; the frozen encoder runs on every batch of every epoch;
- **content**: ``CacheFrozen(store, ["encoder"])``, rows keyed by their content
  (the default); epoch 1 computes and keeps, 2+ recall;
- **index**: the same with ``key="index"``: the loader hands each row's sample
  index beside it, and rows are keyed by index within a dataset version;
- **deferred**: ``key="index"`` with the example's own probe and loaders over
  ``Deferred`` datasets (``train.py --deferred``): an image comes with its sample
  only until the cache has answered it, so from epoch 2 no image is loaded;
- **bound**: the features precomputed once, outside the timing, and a head-only
  LightningModule trained on them — what an epoch costs when the encoder costs
  nothing and its inputs are never loaded;
- **loading**: the same head on the same features, from a loader that hands each
  sample's image beside its features (and drops it): the bound plus loading the
  encoder's inputs, which a cache called with the images (by content or by
  index) must still load — the best such a cache can do.

Content keys must read every input byte each epoch to name the rows, so the
script also times naming one epoch's rows by content (``raw_rows``, the digest the
cache computes) over the same batches on its own:
bound + that hashing is the floor a content-keyed cache can reach on this
machine, printed beside the target.

Every run is repeated ``--rounds`` times (5), interleaved round by round, after one
discarded warm-up fit (the first fit in a process pays for start-up no later one does),
and medians are printed: on a noisy machine the bound's own epoch moves by a fifth
between runs. Printed: each run's epoch 1 and epoch 2+ time (validation included); the
epoch 2+ ratios of content, index and deferred to the bound (target: within 1.3x), with
the floors beside them (bound + hashing, and loading); content and index against
loading; plain against content and deferred; and content's epoch 1 against plain's.
Run: ``python bench/lightning_epochs.py [--epochs 4] [--samples 2048] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from somatize.torch.lightning import CacheFrozen
from somatize_torch.digest import raw_rows

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


class IndexedProbe(example.Probe):  # type: ignore[misc, name-defined]
    """The example's probe, calling its encoder with each row's sample index."""

    def _loss(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, index = batch
        with torch.no_grad():
            features = self.encoder(x, index=index)
        return self.head(features), y

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, y = self._loss(batch)
        loss: torch.Tensor = nn.functional.cross_entropy(logits, y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        logits, y = self._loss(batch)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())


def indexed(loader: DataLoader[Any], shuffle: bool, start: int = 0) -> DataLoader[Any]:
    """The same samples, each with its index beside it (counted from ``start``, so that the
    training and validation sets, under one version, name different samples)."""
    x, y = loader.dataset.tensors  # type: ignore[attr-defined]
    data = TensorDataset(x, y, torch.arange(start, start + len(x)))
    return DataLoader(data, batch_size=loader.batch_size, shuffle=shuffle)


def hashing_s(train: DataLoader[Any], val: DataLoader[Any], repeats: int = 5) -> float:
    """Seconds to digest one epoch's inputs (training and validation), row by row:
    what content keys cost beyond the bound. The median of ``repeats`` epochs."""
    batches = [x for x, _ in train] + [x for x, _ in val]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for x in batches:
            raw_rows(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


class LoadingHead(Head):
    """The head on precomputed features, from batches that carry the images too."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, y, f = batch
        return super().training_step((f, y), batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _, y, f = batch
        super().validation_step((f, y), batch_idx)


def features(
    loader: DataLoader[Any], shuffle: bool, batch_size: int, images: bool = False
) -> DataLoader[Any]:
    """The loader's samples with the encoder's features in place of the images (beside
    them, with ``images``), computed once here."""
    x, y = loader.dataset.tensors  # type: ignore[attr-defined]
    encoder = example.Probe().encoder.eval()
    with torch.no_grad():
        f = torch.cat([encoder(part) for part in x.split(256)])
    data = TensorDataset(x, y, f) if images else TensorDataset(f, y)
    return DataLoader(data, batch_size=batch_size, shuffle=shuffle)


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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    example.quiet()
    torch.manual_seed(0)
    train, val = example.loaders(args.samples)
    bound_train = features(train, True, train.batch_size or 64)
    bound_val = features(val, False, val.batch_size or 256)
    loading_train = features(train, True, train.batch_size or 64, images=True)
    loading_val = features(val, False, val.batch_size or 256, images=True)

    # Every run goes round by round, so drifting load on the machine hits them alike;
    # each figure is the median over rounds (and epochs 2+). The first fit in the
    # process pays for start-up no later one does, so one is run first and dropped.
    runs: dict[str, list[list[float]]] = {
        "plain": [],
        "content": [],
        "index": [],
        "deferred": [],
        "bound": [],
        "loading": [],
    }
    timed(example.Probe(), train, val, 1, [])
    for _ in range(args.rounds):
        runs["plain"].append(timed(example.Probe(), train, val, args.epochs, []))
        with tempfile.TemporaryDirectory() as scratch:
            runs["content"].append(
                timed(example.Probe(), train, val, args.epochs, [CacheFrozen(scratch, ["encoder"])])
            )
        with tempfile.TemporaryDirectory() as scratch:
            index = CacheFrozen(scratch, ["encoder"], key="index", version="example@seed0")
            runs["index"].append(
                timed(
                    IndexedProbe(),
                    indexed(train, True),
                    indexed(val, False, start=args.samples),
                    args.epochs,
                    [index],
                )
            )
        # `train.py --deferred`. The loaders are made afresh each round: which samples
        # are answered is kept on the dataset, and each round's store starts empty.
        deferred = example.loaders(args.samples, deferred=True)
        with tempfile.TemporaryDirectory() as scratch:
            by_rows = CacheFrozen(scratch, ["encoder"], key="index")
            runs["deferred"].append(timed(example.Probe(), *deferred, args.epochs, [by_rows]))
        runs["bound"].append(timed(Head(), bound_train, bound_val, args.epochs, []))
        runs["loading"].append(timed(LoadingHead(), loading_train, loading_val, args.epochs, []))
    hashing = hashing_s(train, val)

    def first(name: str) -> float:
        return statistics.median(seconds[0] for seconds in runs[name])

    def later(name: str) -> float:
        return statistics.median(s for seconds in runs[name] for s in seconds[1:])

    print(
        f"\n{args.samples} images, {args.epochs} epochs, {args.rounds} rounds, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"{'run':>8}  {'epoch 1 s':>9}  {'epoch 2+ s':>10}")
    for name in ("plain", "content", "index", "deferred", "bound", "loading"):
        print(f"{name:>8}  {first(name):>9.3f}  {later(name):>10.3f}")
    plain, bound, content, by_index, loading = (
        later(n) for n in ("plain", "bound", "content", "index", "loading")
    )
    print(f"\ndigesting one epoch's inputs alone: {hashing:.3f} s")
    print(f"content / bound, epoch 2+: {content / bound:.2f}x   (target <= 1.3x)")
    print(
        f"  floor for content keys named in the step, (bound + digesting) / bound: "
        f"{1 + hashing / bound:.2f}x"
    )
    print(f"index / bound, epoch 2+:   {by_index / bound:.2f}x   (target <= 1.3x)")
    print(
        f"  floor for a cache called with the images, loading them / bound: {loading / bound:.2f}x"
    )
    print(f"deferred / bound, epoch 2+: {later('deferred') / bound:.2f}x   (target <= 1.3x)")
    print(
        f"content / loading: {content / loading:.2f}x   index / loading: {by_index / loading:.2f}x"
    )
    print(f"plain / content, epoch 2+: {plain / content:.2f}x")
    print(f"plain / deferred, epoch 2+: {plain / later('deferred'):.2f}x")
    print(f"content epoch 1 / plain epoch 1: {first('content') / first('plain'):.2f}x")


if __name__ == "__main__":
    main()
