"""Models and data for the Lightning callback's tests, importable by the DDP script too.

Classes live at module level so their identity (``tests.lightning_models:Encoder``)
is the same in every process that caches them.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

SAMPLES = 64
CLASSES = 4


class Encoder(nn.Module):
    """A small conv encoder with BatchNorm, so eval mode and buffers matter."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, 2, 1)
        self.norm = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.gain = 1.0  # a plain value forward reads: part of the encoder's key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.norm(self.conv(x)))).flatten(1) * self.gain


class Probe(pl.LightningModule):
    """A linear head on a frozen encoder. Its training step branches on data, so the
    LightningModule as a whole is not fx-traceable; it keeps the encoder in eval itself
    (as a hand-written probe must), so a run without the callback trains the same head."""

    def __init__(self, seed: int = 0, lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.encoder = Encoder()
        with torch.no_grad():
            self.encoder.norm.running_mean.uniform_(-0.5, 0.5)
            self.encoder.norm.running_var.uniform_(0.5, 1.5)
        self.encoder.requires_grad_(False)
        self.head = nn.Linear(8, CLASSES)
        self.lr = lr

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.encoder.eval()  # in train mode its BatchNorm would use batch statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.encoder(x)
        return self.head(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        if bool((logits.abs().sum() > 0).item()):  # data-dependent: fx cannot trace this
            loss = nn.functional.cross_entropy(logits, y)
        else:
            loss = logits.sum()
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.head.parameters(), lr=self.lr)


class Noisy(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A dataset with a random augmentation: every access adds fresh noise."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i] + 0.1 * torch.randn_like(self.images[i]), self.labels[i]


def data(seed: int = 1, samples: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 3, 16, 16, generator=generator)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    return images, labels


def loader(shuffle: bool = True, noisy: bool = False, seed: int = 1) -> DataLoader[Any]:
    """A loader over :func:`data`, shuffled by a fixed generator."""
    images, labels = data(seed)
    dataset: Dataset[Any] = Noisy(images, labels) if noisy else TensorDataset(images, labels)
    generator = torch.Generator().manual_seed(7)
    return DataLoader(dataset, batch_size=16, shuffle=shuffle, generator=generator)


def trainer(root: Any, epochs: int, **options: Any) -> pl.Trainer:
    """A quiet CPU trainer writing only under ``root``."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": epochs,
        "default_root_dir": str(root),
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "deterministic": True,
        "num_sanity_val_steps": 0,
    }
    settings.update(options)
    return pl.Trainer(**settings)
