"""What the callback counted: :class:`EpochStats`, one per cached module, stage and epoch.

Each cached module counts its rows itself (:class:`~somatize_torch.rows.RowStats`);
:class:`~somatize_torch.lightning.CacheFrozen` takes those counts wherever the stage its
rows are keyed as changes, and at each epoch's end, so one record holds one epoch of one
stage. Validation inside a training epoch is counted apart: what training counted before
it is set aside and added back at the training epoch's end (:func:`plus`), and what the
LightningModule's own hooks count after an evaluation's epoch ended is added to its
record, so neither stage's figures hold the other's rows.

The records go three ways. :attr:`CacheFrozen.history` keeps every one, with or
without a logger. The trainer's logger gets each epoch's figures
(:func:`log_epoch`: ``cache/<module>/hit_rate``, ``cache/<module>/val_hit_rate``, …),
reduced across ranks under DDP (counts summed, a hit rate taken over the rows summed,
times averaged). The progress bar gets the training epoch's running hit rate
(:func:`running_hit_rate`), every few batches (:func:`show_hit_rate`).
And a training epoch after the first that recalled nothing it could have
(:func:`never_hit`) says so once: its inputs differ every epoch. So does a first training
epoch that never called a module named (:func:`never_called`): the step runs a method of
it, or its parts, which the cache does not stand for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from somatize_torch.rows import CachedRows, RowStats

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "EpochStats",
    "Stage",
    "grown",
    "log_epoch",
    "never_called",
    "never_hit",
    "plus",
    "running_hit_rate",
    "show_hit_rate",
    "since",
]

Stage = Literal["train", "validate", "test", "predict", "prefill"]

_PREFIX: dict[Stage, str] = {"train": "", "validate": "val_", "test": "test_"}
"""What a stage's figures are logged as, after ``cache/<module>/``."""

_BAR_EVERY = 10
"""The running hit rate goes to the progress bar every this many training batches."""


@dataclass(frozen=True)
class EpochStats:
    """What one cached module did in one epoch of one stage.

    ``epoch`` is the trainer's ``current_epoch`` (0-based); ``seconds`` the wall time
    from the epoch's start hook to its end hook (for ``train``, validation inside the
    epoch included); ``rows`` the module's :class:`~somatize_torch.rows.RowStats`.
    """

    stage: Stage
    epoch: int
    module: str
    seconds: float
    rows: RowStats

    @property
    def hit_rate(self) -> float:
        return self.rows.hit_rate


def plus(a: RowStats, b: RowStats) -> RowStats:
    return RowStats(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(RowStats)})


def since(started: float) -> float:
    return time.perf_counter() - started


def running_hit_rate(cached: dict[str, CachedRows], parts: dict[str, RowStats]) -> float:
    """The training epoch's hit rate so far, over every cached module: what each counted
    since validation, plus ``parts``, what it counted before."""
    rows = recalled = 0
    for name, cache in cached.items():
        now = cache.stats
        before = parts.get(name)
        rows += now.rows + (before.rows if before else 0)
        recalled += now.recalled + (before.recalled if before else 0)
    return recalled / rows if rows else 0.0


def show_hit_rate(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch_idx: int,
    cached: dict[str, CachedRows],
    parts: dict[str, RowStats],
) -> None:
    """The training epoch's running hit rate to the progress bar, as ``hit``: every
    :data:`_BAR_EVERY` batches and at the epoch's last, when the trainer has a bar."""
    if not cached or trainer.progress_bar_callback is None:
        return  # logging a value costs about a millisecond: only for a bar that shows it
    last = batch_idx + 1 >= trainer.num_training_batches
    if batch_idx % _BAR_EVERY and not last:
        return  # the bar keeps showing the value logged last
    rate = running_hit_rate(cached, parts)
    pl_module.log("hit", rate, prog_bar=True, logger=False, on_step=True, on_epoch=False)


def log_epoch(
    pl_module: pl.LightningModule, trainer: pl.Trainer, stage: Stage, records: list[EpochStats]
) -> None:
    """``records``, the epoch of ``stage`` just ended, to the trainer's loggers."""
    if trainer.sanity_checking or not trainer.loggers or not records:
        return  # with no logger, ``history`` is where the figures are
    prefix = _PREFIX[stage]
    ranks = trainer.world_size > 1
    rates = _hit_rates(pl_module, trainer, records) if ranks else [e.hit_rate for e in records]
    for record, rate in zip(records, rates, strict=True):
        rows = record.rows
        metrics: list[tuple[str, float, str]] = [
            # Every rank logs the same rate, that of all ranks' rows: the largest of equal
            # values is that value, where their mean may round.
            ("hit_rate", rate, "max"),
            ("rows_computed", float(rows.computed), "sum"),
            ("rows_recalled", float(rows.recalled), "sum"),
            ("bytes_kept", float(rows.bytes_kept), "sum"),
            ("lookup_s", rows.lookup_s, "mean"),
        ]
        for metric, value, reduce in metrics:
            pl_module.log(
                f"cache/{record.module}/{prefix}{metric}",
                value,
                on_step=False,
                on_epoch=True,
                prog_bar=False,
                sync_dist=ranks,
                reduce_fx=reduce,
            )


def _hit_rates(
    pl_module: pl.LightningModule, trainer: pl.Trainer, records: list[EpochStats]
) -> list[float]:
    """Each record's hit rate over the rows of every rank: the rows they recalled over the
    rows they asked, each summed across ranks (one reduction for all the records). A mean
    of the ranks' own rates would weigh a rank that asked 16 rows as one that asked 48 —
    ranks handed batches of other sizes, or whose hooks call the module on one rank only —
    and say another rate than the counts logged beside it."""
    counts = [[e.rows.recalled, e.rows.rows] for e in records]
    summed = trainer.strategy.reduce(
        torch.tensor(counts, dtype=torch.int64, device=pl_module.device), reduce_op="sum"
    )
    return [recalled / asked if asked else 0.0 for recalled, asked in summed.tolist()]


def grown(before: dict[str, int], now: dict[str, int]) -> set[str]:
    """The names whose count in ``now`` is not the one in ``before`` (a name new to it
    counts as unchanged)."""
    return {name for name, count in now.items() if before.get(name, count) != count}


def never_hit(trainer: pl.Trainer, records: list[EpochStats], changed: set[str]) -> str | None:
    """What to warn of (:class:`~somatize_torch.lightning.NeverHits`) when the training
    epoch just ended, ``records``, recalled none of the rows of a module after an epoch
    that computed and kept them; None otherwise, and when the epochs may share no sample
    (:func:`_rows_recur`). A module in ``changed`` had its rows keyed anew since the epoch
    before ended (its weights or a setting changed): that, not its inputs, is why it
    recalled nothing. One whose epoch counted rows under a version their Deferred no longer
    holds (``rows_outdated``, by persistent workers), which it recalls none of and its cache
    warned of already, says nothing of the inputs by its misses. Only the training epoch's
    own counts are read: validation inside it counts apart."""
    if not _rows_recur(trainer):
        return None
    never = [
        e.module
        for e in records
        if e.rows.rows and e.rows.recalled == 0 and e.rows.computed and not e.rows.rows_outdated
    ]
    if not never:
        return None
    said = (
        f"training epoch {trainer.current_epoch} recalled none of the rows of "
        f"{_listed(never)} from the cache, after an epoch that computed and kept them: "
    )
    reasons: list[str] = []
    moved = [n for n in never if n in changed]
    if moved:
        reasons.append(
            f"{_listed(moved)} changed since its rows were kept (its weights, buffers or a "
            "setting it reads: new weights loaded at an epoch's start, say), so each row "
            "was keyed anew and computed again, as it must be. A module that changes "
            "every epoch gains nothing from caching: name only what stays frozen"
        )
    same = [n for n in never if n not in changed]
    if same:
        reasons.append(
            f"the inputs of {_listed(same)} differ every epoch — most likely a random "
            "augmentation (a random crop, flip or noise in the Dataset or its transform) — "
            "so every row is new and caching only costs time. Move the augmentation after "
            "the cached module, cache the encoder on the un-augmented input, or drop the "
            "callback"
        )
    return said + "; ".join(reasons)


def never_called(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    epoch: int,
    history: list[EpochStats],
    cached: dict[str, CachedRows],
) -> str | None:
    """What to warn of (:class:`~somatize_torch.lightning.Uncached`) when the first
    training epoch (``epoch``) ended, having run batches, and no stage so far (``history``,
    the LightningModule's own end hooks of that epoch counted in) called
    one of the ``cached`` modules: the step calls a method of it (a CLIP model's
    ``encode_image``) or its parts, which run uncached. None otherwise. The rows are summed
    across ranks, as a hook may call a module on one rank only."""
    if not cached or not trainer.num_training_batches:
        return None
    names = list(cached)
    asked = [sum(e.rows.rows for e in history if e.module == name) for name in names]
    summed = trainer.strategy.reduce(
        torch.tensor(asked, dtype=torch.int64, device=pl_module.device), reduce_op="sum"
    )
    idle = [name for name, count in zip(names, summed.tolist(), strict=True) if count == 0]
    if not idle:
        return None
    parts = [f"{name}.{part}" for name in idle for part, _ in cached[name].module.named_children()]
    instead = (
        f"Name the parts the step calls instead ({_listed(parts[:8])}), or call"
        if parts
        else "Call"
    )
    first = idle[0]
    return (
        f"training epoch {epoch} never called {_listed(idle)}, nor did an "
        "evaluation before it, so none of its rows was cached or recalled. The callback "
        f"caches a call of the module itself (`self.{first}(x)`); a method of it "
        f"(`self.{first}.encode_image(x)`, `self.{first}.forward_features(x)`) or a part "
        f"of it called directly runs uncached. {instead} the module itself"
    )


def _rows_recur(trainer: pl.Trainer) -> bool:
    """Whether each training epoch is handed the samples the epoch before was: every
    training loader is run through whole (``limit_train_batches`` — an int or a fraction —
    takes in all of its batches, or there is none), or its first batches are the same
    every epoch (it is not shuffled). The first batches of a shuffled loader (an int
    limit under its length, or a fraction under 1) may share no sample with the epoch
    before: an epoch of them that recalls nothing says nothing of the inputs."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    if not isinstance(combined, CombinedLoader) or combined.limits is None:
        # Another Lightning than the one this reads: only epochs over all of the data.
        limit = trainer.limit_train_batches
        return limit is None or (isinstance(limit, float) and limit >= 1.0)
    for loader, limit in zip(combined.flattened, combined.limits, strict=True):
        try:
            whole = limit >= len(loader)
        except TypeError:  # an iterable of no length: whole only with no limit
            whole = limit == float("inf")
        if not whole and not _in_order(loader):
            return False
    return True


def _in_order(loader: Any) -> bool:
    """Whether ``loader`` hands its samples in the same order every epoch: a loader whose
    sampler is sequential (or distributed, unshuffled). None other is known to."""
    batches = getattr(loader, "batch_sampler", None)
    sampler: Any = batches.sampler if type(batches) is BatchSampler else None
    if batches is None:
        sampler = getattr(loader, "sampler", None)  # a loader of single samples
    if type(sampler) is DistributedSampler:
        return not sampler.shuffle
    return type(sampler) is SequentialSampler


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)
