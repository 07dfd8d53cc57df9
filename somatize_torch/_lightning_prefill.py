"""Prefill under Lightning: loaders run through their cached modules when fitting starts.

:meth:`CacheFrozen.prefill <somatize_torch.lightning.CacheFrozen.prefill>` only
records what to run (a :class:`PrefillJob`): until fitting starts the model is not
on its device nor in the trainer's precision, and the rows must be computed as the
epochs will ask for them (the autocast dtype is part of a row's key). At
``on_fit_start`` each job runs (:func:`run_prefill`) under the context the trainer
runs a forward in (:func:`forward_context`: autocast under mixed precision), each
batch converted as the trainer converts a training batch (true half precision), and
the callback flushes, so that epoch 1 recalls too.

Under DDP every rank runs a share of the batches, every ``ranks``-th one
(:func:`share`), and keeps what it computed in the one store the ranks share.

A prefill is work the run would not do without the callback, so it leaves the global
random generators where they stood (:func:`generators_kept`): a DataLoader draws its
seed from torch's as its iterator is made, and a Dataset may draw as it is fetched,
which would otherwise hand the fit's shuffles, augmentations and dropout other numbers
than the same run without the callback.
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from somatize_torch._lightning_stats import EpochStats, Stage, since
from somatize_torch.rows import CachedRows
from somatize_torch.rows import prefill as prefill_rows

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "PrefillJob",
    "dev_run_batches",
    "forward_context",
    "generators_kept",
    "run_prefill",
    "runs_no_batch",
    "share",
]


@dataclass
class PrefillJob:
    """A loader to run through the cached ``module`` when fitting starts; ``inputs`` and
    ``progress`` as :meth:`CacheFrozen.prefill` was given them, and the loader its rows
    are keyed as by index (``keyed_as``: a stage and the loader's place in it)."""

    loader: Iterable[Any]
    module: str
    inputs: Callable[[Any], Any] | None
    progress: bool
    keyed_as: tuple[Stage, int] = ("train", 0)


def run_prefill(
    trainer: pl.Trainer, pl_module: pl.LightningModule, cached: CachedRows, job: PrefillJob
) -> EpochStats:
    """Runs ``job`` through ``cached`` (this rank's share of it), and says what it did.
    The caller runs it under :func:`forward_context` and without gradients."""
    started = time.perf_counter()
    loader: Iterable[Any] = job.loader
    ranks = trainer.world_size
    batches = dev_run_batches(trainer)
    if batches is not None:
        loader = itertools.islice(loader, batches * ranks)  # each rank's share: `batches`
    if ranks > 1:
        loader = share(loader, trainer.global_rank, ranks)
    plugin = getattr(trainer, "precision_plugin", None)
    done = prefill_rows(
        cached,
        loader,
        inputs=job.inputs,
        progress=job.progress and trainer.is_global_zero,
        device=pl_module.device,
        convert=getattr(plugin, "convert_input", None),  # as a training batch is
    )
    cached.reset_stats()
    return EpochStats("prefill", trainer.current_epoch, job.module, since(started), done)


def dev_run_batches(trainer: pl.Trainer) -> int | None:
    """How many batches of each loader a ``fast_dev_run`` trainer runs (a smoke test of
    a few batches, where a whole prefill could take hours); None for a real run, which
    ``fast_dev_run=0`` is to Lightning as ``False`` is."""
    dev_run = getattr(trainer, "fast_dev_run", False)
    if not dev_run:
        return None
    return 1 if dev_run is True else int(dev_run)


def runs_no_batch(trainer: pl.Trainer) -> bool:
    """Whether the fit about to start trains on no batch at all (``max_epochs=0``,
    ``max_steps=0``, ``limit_train_batches=0``): a prefill then computes rows no epoch
    asks for, possibly hours of them, and is left to the next fit."""
    return (
        getattr(trainer, "max_epochs", None) == 0
        or getattr(trainer, "max_steps", None) == 0
        or getattr(trainer, "limit_train_batches", None) == 0
    )


def share(loader: Iterable[Any], rank: int, ranks: int) -> Iterator[Any]:
    """Rank ``rank``'s share of ``loader``'s items: every ``ranks``-th, from its own."""
    for i, item in enumerate(loader):
        if i % ranks == rank:
            yield item


def forward_context(trainer: pl.Trainer) -> AbstractContextManager[Any]:
    """The context the trainer runs a forward in (autocast under mixed precision)."""
    plugin = getattr(trainer, "precision_plugin", None)
    context = getattr(plugin, "forward_context", None)
    return context() if context is not None else nullcontext()


@contextmanager
def generators_kept(device: torch.device) -> Iterator[None]:
    """Puts the process's global random generators back where they stood once the block
    ends: torch's (and ``device``'s, a CUDA one), ``random``'s, and numpy's where numpy
    is imported."""
    numpy = sys.modules.get("numpy")
    python = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
