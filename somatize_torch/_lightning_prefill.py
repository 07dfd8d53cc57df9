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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from somatize_torch._lightning_stats import EpochStats, since
from somatize_torch.rows import CachedRows
from somatize_torch.rows import prefill as prefill_rows

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["PrefillJob", "forward_context", "run_prefill", "share"]


@dataclass
class PrefillJob:
    """A loader to run through the cached ``module`` when fitting starts; ``inputs`` and
    ``progress`` as :meth:`CacheFrozen.prefill` was given them."""

    loader: Iterable[Any]
    module: str
    inputs: Callable[[Any], Any] | None
    progress: bool


def run_prefill(
    trainer: pl.Trainer, pl_module: pl.LightningModule, cached: CachedRows, job: PrefillJob
) -> EpochStats:
    """Runs ``job`` through ``cached`` (this rank's share of it), and says what it did.
    The caller runs it under :func:`forward_context` and without gradients."""
    started = time.perf_counter()
    loader: Iterable[Any] = job.loader
    ranks = trainer.world_size
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
