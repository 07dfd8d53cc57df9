"""Warming a cache ahead: :func:`prefill` runs it over a loader before training starts.

A first epoch through a cold cache computes every row inside the training loop;
:func:`prefill` computes them beforehand, over the same loader or any other, and
flushes them to the store, so that training, in this process or a later one,
recalls from its first batch. Handed whatever a DataLoader yields, it must find the
batch tensor in it (and, keyed by index, the indices): :func:`batch_at` says where
the batch tensor is, as :mod:`somatize_torch.ahead` asks too, to name the rows of
the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import TYPE_CHECKING, Any

import torch

from somatize_torch._row_keys import KeyMode
from somatize_torch._row_stats import RowStats
from somatize_torch.deferred import DeferredRows

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows

__all__ = ["batch_at", "prefill"]


def batch_at(item: Any) -> tuple[Any, ...] | None:
    """Where the batch tensor is in what a DataLoader yields, by default: the item itself
    if it is a tensor, a tuple's or list's first item, a dict's ``x`` (or ``input``);
    None where there is no such tensor."""
    if isinstance(item, torch.Tensor):
        return ()
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
        return (0,)
    if isinstance(item, dict):
        key = "x" if "x" in item else "input"
        if isinstance(item.get(key), torch.Tensor):
            return (key,)
    return None


def _inputs(batch: Any, key: KeyMode) -> tuple[torch.Tensor | DeferredRows, torch.Tensor | None]:
    """The batch tensor (and, keyed by index, the indices) of what a DataLoader yields:
    the tensor :func:`batch_at` finds, and a tuple's or list's last item or a dict's
    ``index``; or the :class:`DeferredRows` that is the item or a tuple's first."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], DeferredRows):
        return batch[0], None
    if isinstance(batch, DeferredRows):
        return batch, None
    path = batch_at(batch)
    if path == ():
        return batch, None
    if path == (0,):
        index = batch[-1] if key == "index" and len(batch) > 1 else None
        return batch[0], index
    if path is not None:
        return batch[path[0]], batch.get("index") if key == "index" else None
    raise TypeError(
        f"prefill cannot tell the batch tensor in a `{type(batch).__name__}` the loader "
        "yields; pass inputs=, a function from one loader item to the batch tensor (or to "
        "(batch, indices) for key='index')"
    )


def prefill(
    cached: CachedRows,
    loader: Iterable[Any],
    *,
    inputs: Callable[[Any], Any] | None = None,
    progress: bool = True,
    device: torch.device | str | None = None,
    convert: Callable[[Any], Any] | None = None,
) -> RowStats:
    """Runs ``cached`` over every batch of ``loader`` so its answers are kept before
    training starts, then flushes; returns what it did. ``inputs`` turns one loader
    item into the batch tensor (or ``(batch, indices)``); by default a tensor is the
    batch, a tuple's first item is the batch (and with ``key="index"`` its last the
    indices), a dict's ``x`` and ``index``. ``convert`` is applied to each item first
    (as a trainer's precision converts a batch), and ``device`` moves batches there.
    ``progress`` shows a tqdm bar."""
    from somatize_torch.rows import CachedRows

    if not isinstance(cached, CachedRows):
        raise TypeError(
            f"prefill takes a module made by `cache_rows`, got a `{type(cached).__name__}`"
        )
    before = cached.stats
    items: Iterable[Any] = loader
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError(
                "prefill(progress=True) shows a progress bar with tqdm, which is not installed: "
                "`pip install tqdm`, or pass progress=False"
            ) from None
        total = len(loader) if isinstance(loader, Sized) else None
        items = tqdm(loader, total=total, desc=f"prefill {type(cached.module).__name__}")
    for item in items:
        if convert is not None:
            item = convert(item)
        if inputs is not None:
            got = inputs(item)
            x, index = got if isinstance(got, tuple) else (got, None)
        else:
            x, index = _inputs(item, cached.key_mode)
        if device is not None:
            x = x.to(device)
        # Rows keyed by content are named by their input: indices beside it mean nothing.
        cached(x, index=index if cached.key_mode == "index" else None)
    cached.flush()
    after = cached.stats
    return RowStats(
        **{
            name: getattr(after, name) - getattr(before, name)
            for name in RowStats.__dataclass_fields__
        }
    )
