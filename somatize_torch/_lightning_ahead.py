"""Naming the next batch under Lightning: a loop's loaders put behind ``Ahead``.

A content-keyed lookup reads every byte of its batch to name the rows; on the CPU
that is most of what an epoch from memory costs beyond the head's own work, and it
does not depend on the step before. :func:`fetch_ahead` hands the loaders of a
Lightning loop to :class:`~somatize_torch.ahead.Ahead`, so the rows of batch
``k + 1`` are hashed on another core while step ``k`` runs.

Lightning has made a stage's iterator by the time a callback's epoch-start hook
runs, so loaders replaced there (in the loop's ``CombinedLoader``) are used from
the loop's next run on: a training loader from its second epoch. They are wrapped
with ``check_draws=True``: the first epoch they serve is fetched in order, watching
whether the loader draws random numbers in this process, and only one that draws
none is fetched ahead after it, since an early fetch would move its draws before
the step's own and the run would differ from one without the callback.

A loop may stop before a loader's end: a training epoch at the batch of its last
optimizer step under ``max_steps`` (``accumulate_grad_batches`` batches to a step), an
evaluation at ``limit_val_batches``. Each loader is told how many batches the loop takes
from the pass it starts (:func:`batches_taken`), so no batch past them is fetched: a
Dataset whose loading costs, or counts, sees the reads of a run without the callback.

Left as they are: a loader already behind ``Ahead``; one that keeps its own
position (one with ``state_dict``), which fetching ahead would put one batch off;
every loader of a loop this reads no ``CombinedLoader`` from (another Lightning),
whose rows are named in the step.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import CombinedLoader

from somatize_torch._prefill import not_a_loader
from somatize_torch.ahead import Ahead
from somatize_torch.rows import CachedRows

__all__ = ["batches_taken", "fetch_ahead"]


def fetch_ahead(
    loop: Any,
    caches: list[CachedRows],
    device: torch.device,
    aheads: weakref.WeakSet[Ahead[Any]],
) -> None:
    """Puts ``loop``'s loaders behind :func:`~somatize_torch.ahead.ahead`, for the
    iterators Lightning makes from its next run on, naming rows for the content-keyed
    ``caches`` of a model on ``device`` (on the CPU only; with none, nothing is done).
    The loaders wrapped are added to ``aheads``, so that a cache put back uncached can
    be dropped from them."""
    if not caches or device.type != "cpu":
        return
    combined = getattr(loop, "_combined_loader", None)
    if not isinstance(combined, CombinedLoader):
        return  # another Lightning than the one this reads: rows are named in the step
    loaders = combined.flattened
    wrapped = [
        dl
        if isinstance(dl, Ahead)
        or callable(getattr(dl, "state_dict", None))
        or not_a_loader(dl, "") is not None  # no loader of batches: Lightning iterates it
        else Ahead(dl, caches, check_draws=True, takes=batches_taken(loop, index))
        for index, dl in enumerate(loaders)
    ]
    aheads.update(dl for dl in wrapped if isinstance(dl, Ahead))
    if any(new is not old for new, old in zip(wrapped, loaders, strict=True)):
        combined.flattened = wrapped


def batches_taken(loop: Any, index: int) -> Callable[[], int | None]:
    """What tells loader ``index`` of ``loop``, as a pass over it starts, how many batches
    the loop takes from that pass (None: as many as the loader holds)."""
    if hasattr(loop, "epoch_loop"):  # the fit's loop: one epoch is one pass
        return functools.partial(_training_batches, loop)
    return functools.partial(_evaluation_batches, loop, index)


def _training_batches(loop: Any) -> int | None:
    """How many batches the training epoch takes from a pass started now: up to its last
    batch (``limit_train_batches`` included), or, under ``max_steps``, to the batch of its
    last optimizer step, ``accumulate_grad_batches`` batches to a step. A pass started
    inside the epoch (a shorter loader cycled by ``CombinedLoader``, an epoch resumed)
    counts from the batches already taken. Under manual optimization the LightningModule
    says when it steps: the epoch is taken to go to its last batch. None where it cannot
    say (a loader of no length, a Lightning whose loops this does not read)."""
    trainer = loop.trainer
    epoch = loop.epoch_loop
    try:
        taken = int(epoch.batch_progress.current.ready)
        last = loop.max_batches
        steps_left = epoch.max_steps - epoch.global_step
        every = int(trainer.accumulate_grad_batches)
        automatic = trainer.lightning_module.automatic_optimization
    except AttributeError:
        return None
    if epoch.max_steps >= 0 and automatic:
        last = min(last, (taken // every + steps_left) * every)
    return None if math.isinf(last) else max(0, int(last) - taken)


def _evaluation_batches(loop: Any, index: int) -> int | None:
    """How many batches an evaluation takes from its loader ``index``: its limit
    (``limit_val_batches``), where its loaders run one after another."""
    combined = getattr(loop, "_combined_loader", None)
    limits = getattr(combined, "limits", None)
    if getattr(combined, "_mode", None) != "sequential" or not limits or index >= len(limits):
        return None
    limit = limits[index]
    return None if math.isinf(limit) else int(limit)
