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

Left as they are: a loader already behind ``Ahead``; one that keeps its own
position (one with ``state_dict``), which fetching ahead would put one batch off;
every loader of a loop this reads no ``CombinedLoader`` from (another Lightning),
whose rows are named in the step.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from lightning.pytorch.utilities import CombinedLoader

from somatize_torch._prefill import not_a_loader
from somatize_torch.ahead import Ahead
from somatize_torch.rows import CachedRows

__all__ = ["fetch_ahead"]


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
        else Ahead(dl, caches, check_draws=True)
        for dl in loaders
    ]
    aheads.update(dl for dl in wrapped if isinstance(dl, Ahead))
    if any(new is not old for new, old in zip(wrapped, loaders, strict=True)):
        combined.flattened = wrapped
