"""What a row cache did, counted in rows: :class:`RowStats`.

Counted in rows, not batches, since a row is what is recalled: one batch is often
part recalled, part computed, and the hit rate is the share of its rows found in a
tier or the store. A forward adds to the counters :data:`_COUNTED` names (one per
tier, by the tier's name); what the store writer kept it counts itself, behind the
step, and :attr:`~somatize_torch.rows.CachedRows.stats` reads both (:func:`_stats_of`).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from somatize_torch.writer import WaitsForItself

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows

__all__ = ["RowStats"]


@dataclass(frozen=True)
class RowStats:
    """What a cached module did, counted in rows (cumulative until :meth:`CachedRows.reset_stats`).

    ``recalled`` = ``from_device + from_host + from_pending + from_store``; ``hit_rate``
    is ``recalled / rows``. ``from_pending`` counts rows in no memory tier recalled from
    the background writer's staged copies, their write to the store not yet done.
    ``bytes_kept`` and ``rows_kept`` count what the background writer has written to the
    store so far (:meth:`CachedRows.reset_stats` waits for the period's writes first);
    ``rows_unread`` counts rows the store had but could not hand over (damaged, gone
    since it was asked, or a read that failed), or could not say whether it had (its
    lookup failed), computed again instead; ``rows_outdated`` counts rows handed out
    under a version their ``Deferred`` no longer holds (by persistent DataLoader workers),
    computed and neither recalled nor kept; ``ran_ahead`` counts rows of
    batches the module ran whole before their rows were named, on a CUDA device while the
    cache recalled nothing (those found known after all are counted as recalled too);
    ``lookup_s`` is the time spent keying rows and finding them (not
    computing them), ``compute_s`` the time the module ran, and ``write_s`` the time the
    background writer spent writing its rows to the store, behind the steps (a write
    that also held other caches' rows of the store counted whole).
    """

    batches: int = 0
    rows: int = 0
    computed: int = 0
    from_device: int = 0
    from_host: int = 0
    from_pending: int = 0
    from_store: int = 0
    rows_kept: int = 0
    bytes_kept: int = 0
    rows_failed: int = 0
    rows_unread: int = 0
    rows_outdated: int = 0
    ran_ahead: int = 0
    lookup_s: float = 0.0
    compute_s: float = 0.0
    write_s: float = 0.0

    @property
    def recalled(self) -> int:
        return self.from_device + self.from_host + self.from_pending + self.from_store

    @property
    def hit_rate(self) -> float:
        return self.recalled / self.rows if self.rows else 0.0

    def as_dict(self) -> dict[str, float]:
        """Every counter, plus ``recalled`` and ``hit_rate``, for a logger."""
        out: dict[str, float] = dict(asdict(self))
        out["recalled"] = self.recalled
        out["hit_rate"] = self.hit_rate
        return out


_COUNTED = (
    "batches",
    "rows",
    "computed",
    "device",
    "host",
    "pending",
    "store",
    "unread",
    "outdated",
    "lookup_s",
    "compute_s",
    "ran_ahead",
)


Written = tuple[int, int, int, float]
"""What a cache's writer did so far: rows and bytes kept, rows it failed to keep, and its
seconds of writing."""


def _written(self: CachedRows) -> Written:
    """What the cache's writer did so far (:data:`Written`)."""
    writer = self._writer
    if writer is None:
        return (0, 0, 0, 0.0)
    return (writer.kept_rows, writer.kept_bytes, writer.failed_rows, writer.took_s)


def _writes_ended(self: CachedRows) -> None:
    """Waits until every row ``self`` has submitted so far is written or has failed, without
    raising a failure (the next forward or flush does); not on the writer's own thread, nor
    while holding the lock it writes through, where waiting would never end."""
    if self._writer is None:
        return
    with contextlib.suppress(WaitsForItself):
        self._writer.drain()


def _stats_of(
    self: CachedRows,
    counted: dict[str, float] | None = None,
    written: Written | None = None,
) -> RowStats:
    """What ``self`` counted (``counted``: those counts, not its own now; ``written``: what
    its writer did by then, as :func:`_written` read it), as
    :attr:`CachedRows.stats <somatize_torch.rows.CachedRows.stats>` says."""
    if counted is None:
        with self._tiers_lock:  # a forward adds its counts under it, all at once
            counted = dict(self._counts)
    c = counted
    now = _written(self) if written is None else written
    base = self._kept_base
    kept = [now[at] - base[at] for at in range(4)]
    return RowStats(
        batches=int(c["batches"]),
        rows=int(c["rows"]),
        computed=int(c["computed"]),
        from_device=int(c["device"]),
        from_host=int(c["host"]),
        from_pending=int(c["pending"]),
        from_store=int(c["store"]),
        rows_kept=int(kept[0]),
        bytes_kept=int(kept[1]),
        rows_failed=int(kept[2]),
        rows_unread=int(c["unread"]),
        rows_outdated=int(c["outdated"]),
        ran_ahead=int(c["ran_ahead"]),
        lookup_s=c["lookup_s"],
        compute_s=c["compute_s"],
        write_s=kept[3],
    )


def _reset_stats(self: CachedRows) -> RowStats:
    """Starts ``self`` counting afresh; returns what it counted until now, once the writes of
    the rows it computed have ended: an epoch's rows are counted kept (or failed) in that
    epoch, not in the next, which would seem to keep rows it never computed. A forward
    under way on another thread is counted whole in one of the two."""
    _writes_ended(self)
    with self._tiers_lock:
        counted, self._counts = self._counts, dict.fromkeys(_COUNTED, 0.0)
    # What the writer did is read once, for both periods: a write ending on its thread
    # between two reads would be counted in neither.
    written = _written(self)
    out = _stats_of(self, counted, written)
    self._kept_base = written
    return out
