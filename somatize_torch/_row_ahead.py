"""Rows named ahead: a batch's content keys worked out on another thread while the step
before runs.

Keyed by content, naming a batch's rows (digesting each row's bytes) is most of what
a recall costs on a CPU, and it needs nothing of the step before. For a batch fetched
early (:func:`somatize_torch.ahead.ahead`),
:meth:`CachedRows.name_ahead <somatize_torch.rows.CachedRows.name_ahead>` starts it
on another thread (:func:`_name_ahead`, over
:func:`~somatize_torch.digest.raw_rows_later`), and the forward on that batch takes
the names (:func:`_take_named`) instead of naming the rows itself.

A name holds only for the bytes that were named, so a forward takes the names only
for the very tensor named and unchanged since — the same version counter, memory,
layout and dtype (:func:`~somatize_torch.codec.stamp_of`) — and names the rows itself
otherwise. A write torch does not count (into ``x.data``, through ``x.numpy()`` or
DLPack) moves none of these, so it is not seen: a batch is to be written before it is
named. The thread naming a batch holds it (:class:`~somatize_torch.digest.RowsLater`),
and so its storage, until it is done; but a storage swaps its memory for other memory,
freeing what it held, when it grows (``x.resize_()``), moves to shared memory
(``x.share_memory_()``) or is freed (``resize_(0)``), and nothing from Python can hold
that memory or be told of the swap. The forward takes no names for such a batch (its memory or
shape moved), but the thread may have read freed memory: a batch is not to give up its
memory before its forward either. An inference tensor has no version counter, so it is
never named ahead. A cache holds at most :data:`_NAMED_AHEAD` batches named ahead, the
oldest dropped, so a loop that names batches it never runs holds no more than that.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from somatize_torch.codec import stamp_of
from somatize_torch.digest import check_batch, plain, raw_rows_later

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows

_NAMED_AHEAD = 16
"""How many batches named ahead a cache holds for forwards to come (older ones are dropped)."""


def _name_ahead(self: CachedRows, x: torch.Tensor) -> bool:
    """Starts naming the rows of ``x`` on another thread, as
    :meth:`CachedRows.name_ahead <somatize_torch.rows.CachedRows.name_ahead>` says;
    returns whether it started."""
    if self.key_mode != "content" or not _nameable(x):
        return False
    if x.requires_grad or (self._placed and x.device != self.tiers[0].device):
        return False
    if x.is_inference():
        return False
    stamp = stamp_of(x)
    later = raw_rows_later(x)
    if later is None:
        return False
    with self._named_lock:
        named = self._named
        while len(named) >= _NAMED_AHEAD:
            del named[next(iter(named))]
        named[id(x)] = (weakref.ref(x), stamp, later)
        self.named_ahead += 1
    return True


def _nameable(x: object) -> bool:
    """Whether ``x`` is a batch the forward would key by content: a plain tensor (or a
    parameter) with rows, of a dtype and layout digested here, that holds its values in
    memory. What the forward refuses (a nested tensor, a subclass, a tensor whose storage
    was freed) is not named ahead, so that the refusal comes from the forward."""
    if not isinstance(x, torch.Tensor) or not plain(x) or x.is_meta:
        return False
    try:
        check_batch(x)
    except (TypeError, ValueError):
        return False
    return True


def _take_named(self: CachedRows, x: torch.Tensor) -> list[bytes] | None:
    """The names of ``x``'s rows if they were named ahead and ``x`` is unchanged since."""
    if not self._named:
        return None
    with self._named_lock:
        found = self._named.pop(id(x), None)
    if found is None:
        return None
    ref, stamp, later = found
    if ref() is not x or stamp != stamp_of(x):
        return None  # another tensor at the same address, or changed in place
    try:
        ids = later.result()
    except Exception:  # named again in the forward, which raises what is wrong
        return None
    self.used_ahead += 1
    return ids
