"""Fetching the next batch, and naming its rows, while the current step runs.

A content-keyed recall (:mod:`somatize_torch.rows`) must read every byte of the
batch to name its rows; on a CPU that is most of what an epoch from the memory
tier costs beyond the head's own work. None of it depends on the step before,
so it need not wait for it::

    cached = somatize.torch.cache_rows(encoder, "features/")
    for x, y in somatize.torch.ahead(loader, cached):
        loss = loss_fn(head(cached(x)), y)
        ...

:func:`ahead` takes each batch from ``loader`` ``depth`` batches before the loop
needs it and starts naming its rows for every cache given on another thread
(:meth:`~somatize_torch.rows.CachedRows.name_ahead`), which hashes while the
loop runs the step before; the loop's forward then finds them named, or waits
for the rest. Where the native host library is built, that thread is one of its
own that never takes the GIL, so the loop's Python runs beside it at full speed;
otherwise it is a pool thread hashing with the ``blake3`` package. The loader
itself runs on the loop's thread, as without :func:`ahead`.

The names are used only for the very tensor they were made from, unchanged
since (its version counter, which every change in place through torch bumps, its
memory and layout): a batch the loop changes through torch, replaces or moves to
another device is named again at its forward. A change made behind torch's back —
writing into ``x.data``, through ``x.numpy()`` or a DLPack view — moves no version
counter and is not seen: the forward would take the names of what the batch held
before. Don't write into a batch that way between the loader and the cached module;
write into a ``clone()`` and hand the forward that. Nor give up a batch's memory there
(``x.resize_()`` growing it, ``x.share_memory_()``, its storage freed): the thread naming
it holds the batch, but torch frees the memory under a storage it swaps, and the thread
may still be reading it.

Which tensor of a loader item is the cached module's input is learned: after each
step, the tensor of the item that a cache was last called with (found by identity
among the item's tensors) is the one named in the items after it; before the first
step, a tensor item, or a tuple's or list's first tensor, or a dict's ``x`` or
``input``, or, in a dict with neither (a tokenizer's), the tensor named as the
cache's module's forward's first parameter, as :func:`~somatize_torch.rows.prefill`
takes it. ``inputs=`` says it outright. A cache whose forwards never use the names
made for it (the loop feeds it something the loader did not yield, or changes the
batch first) is no longer named for after a few batches, so the thread does not
spend a core for nothing; and the names no forward took are let go when the pass
ends, so the cache holds none of those batches after the loop.

Fetching a batch early moves whatever random numbers the loader draws in this
process (a Dataset drawing a crop or a weight with ``torch.rand``, without
workers) to before the step instead of after it, so the step's own draws (a
dropout) come out otherwise than without :func:`ahead`. ``check_draws=True``
keeps a run exactly as without it: the first pass over the loader is fetched in
order while torch's, ``random``'s and numpy's global generators are watched, and
only a loader that drew nothing from them is fetched ahead in the passes after
(:class:`~somatize_torch.lightning.CacheFrozen` does this). Loaders with workers
draw in the workers, so they are fetched ahead. What a pass shows about a loader
(whether it draws, whether it refills its batches, below) is kept for that loader
while it lives, so ``ahead(loader, ...)`` made anew each epoch learns it once, as
one :class:`Ahead` used for every epoch does.

A loader that hands out its batches in memory it fills again for the next (one
preallocated buffer, refilled in place) cannot be fetched ahead: the batch waiting
for the loop would change under it, and the loop would get the next batch's inputs
beside its own labels. So the first batches (``depth + 1`` of them, after the
first) are fetched in order, each compared with the ones the loop took before it: as
many as are fetched ahead, and one more, which a loop may still use as it asks for the
next (Lightning's fetches the next batch of a loader of no length before it runs the
step on the one it has, so a loader taking turns between two buffers is fetched in
order). A loader that wrote into one (its version counter moved) or handed out another
tensor over its memory (``torch.from_numpy`` of one buffer, each time) is fetched in
order from then on (:attr:`Ahead.reuses`, logged at info), its batches named in the
forward, and the names made for the batches it may have filled again let go (one
filled behind torch's back, wrapped anew, moved no version counter of the batch it
held). Only one that did neither is fetched ahead — still compared at every fetch,
with a warning, and in order from then on, if it refills a batch later. What it
cannot see: the very tensor handed out again after a write behind torch's back
(through ``x.numpy()``), which looks like a constant handed with every batch.

An error from the loader, or from ``inputs=``, is raised in the loop at the batch
where it happened, after the batches before it, and the next batch comes at the next
``next()`` as from the loader's own iterator (a loop that skips a sample that fails to
load goes on with the rest of the epoch). A StopIteration from ``inputs=`` (a
``next()`` over an item's parts that found none) is raised as a RuntimeError, from it:
raised as it is, it would end the loop as the loader's end does. Naming that fails,
as it starts or on the other thread, costs no batch: the batch is handed out all the
same, and its forward names the rows itself, raising what is wrong with them if
anything is. :class:`Ahead` passes ``len()`` and any attribute (``sampler``,
``dataset``, …) through to the loader, and sets on the loader an attribute set on it
(Lightning's ``_iterator = None`` as a stage ends, which has a loader with persistent
workers start them again at its next ``iter()``), or deleted, so code that inspects or
resets a DataLoader still works on it. With no content-keyed cache to name for it is the loader
itself.

This module holds :class:`Ahead` (what it is given, which pass it makes over the
loader, which tensor of an item it names, and what it concludes from what a pass
saw) and :func:`ahead`. The passes themselves, and what is known of each loader, are
in :mod:`somatize_torch._ahead_passes`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch

from somatize_torch._ahead_passes import (
    _HELD,
    Path,
    _Fetching,
    _findings_of,
    _InOrder,
    _Name,
    _refilled,
    _Stamp,
    _tensors,
)
from somatize_torch._prefill import (
    batch_for,
    check_callable,
    check_flag,
    check_loader,
    length_of,
)
from somatize_torch.rows import CachedRows

__all__ = ["Ahead", "ahead"]

log = logging.getLogger("somatize.torch")

T = TypeVar("T")

_UNUSED_LIMIT = 4
"""Batches named for a cache beyond ``depth``, with none of them used by its forward,
after which the thread stops naming for it."""


_OWN = frozenset(
    (
        "loader",
        "caches",
        "inputs",
        "depth",
        "takes",
        "draws",
        "reuses",
        "_found",
        "_paths",
        "_unused",
        "_used",
    )
)
"""What an :class:`Ahead` keeps of its own; every other attribute is its loader's."""


def _at(item: Any, path: Path) -> Any:
    for step in path:
        try:
            item = item[step]
        except (KeyError, IndexError, TypeError):
            return None
    return item


class Ahead(Generic[T]):
    """``loader``, fetched ``depth`` batches ahead, with each batch's rows named for
    ``caches`` on another thread meanwhile; see the module docstring."""

    def __init__(
        self,
        loader: Iterable[T],
        caches: Sequence[CachedRows],
        *,
        inputs: Callable[[T], torch.Tensor] | None = None,
        depth: int = 1,
        check_draws: bool = False,
        takes: Callable[[], int | None] | None = None,
    ) -> None:
        if isinstance(loader, Ahead):
            raise TypeError("this loader is already fetched ahead; wrap the loader inside once")
        for cache in caches:
            if not isinstance(cache, CachedRows):
                raise TypeError(
                    f"ahead names rows for modules made by `cache_rows`, got a "
                    f"`{type(cache).__name__}`"
                )
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth= is how many batches to fetch ahead, 1 or more; got {depth!r}")
        check_loader(loader, "ahead(loader, ...)")
        check_callable(inputs, "inputs", "`lambda item: item[0]`")
        check_flag(check_draws, "check_draws")
        self.loader = loader
        self.caches = list(caches)
        self.inputs = inputs
        self.depth = depth
        # Asked as each pass starts: how many batches the loop will take from it, where it
        # stops before the loader's end (Lightning's at `max_steps`); None: to the end.
        self.takes = takes
        # What earlier passes over this loader showed, through this Ahead or another.
        self._found = _findings_of(loader)
        # Whether fetching draws random numbers in this process: None until a pass in
        # order has shown it (with check_draws), False when it is not asked.
        self.draws: bool | None = self._found.draws if check_draws else False
        # Whether the loader hands its batches out in memory it fills again for the next
        # (one buffer, refilled in place): None until the first batches fetched in order
        # have shown it; then fetched in order, as a batch fetched early would change the
        # one the loop is about to use.
        self.reuses: bool | None = self._found.reuses_at(depth)
        # Where each cache's input sits in a loader item, once a step has shown it; how
        # many batches were named for it since a forward last used names made here.
        self._paths: dict[int, Path] = {}
        self._unused: dict[int, int] = {}
        self._used: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # TypeError for an unsized loader, as len() gives

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # An attribute set from outside is the loader's, as one read is: Lightning ends a
        # stage by setting `_iterator = None` on each loader it holds, so that the next
        # `iter()` of a loader with persistent workers starts them again.
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.loader, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN:
            object.__delattr__(self, name)
        else:
            delattr(self.loader, name)

    def __iter__(self) -> Iterator[T]:
        # The loader's iterator is made here, not at the first batch: making it may draw
        # from the global generators (a DataLoader draws its base seed), and a loop over
        # several loaders (Lightning's CombinedLoader) makes every iterator before it
        # fetches from any, so a later draw would hand each loader another's numbers.
        items = iter(self.loader)
        if self.draws is None:
            self.draws = self._found.draws  # shown since by another Ahead over the loader
        if self.reuses is None:
            self.reuses = self._found.reuses_at(self.depth)
        if (
            not any(cache.key_mode == "content" for cache in self.caches)
            or self.draws
            or self.reuses
        ):
            return items  # nothing to name, or fetched in order as it must be
        if self.draws is None:
            return _InOrder(self, items)
        return _Fetching(self, items)

    def batches(self) -> int | None:
        """How many batches the pass starting now hands out at most: the loader's length,
        or fewer where the loop says it takes fewer (``takes``). A batch past them is
        never fetched ahead: the loop never asks for it, and reading it would cost a
        load (and a Dataset's side effects) that the run without fetching ahead never has.
        None where neither can say."""
        length = length_of(self.loader)
        taken = self.takes() if self.takes is not None else None
        if taken is None:
            return length
        return max(0, taken) if length is None else min(length, max(0, taken))

    def _look_for_reuse(
        self, ahead_of: list[_Stamp], behind: list[_Stamp], item: T, taken: int
    ) -> None:
        """Says from ``item``, just fetched, whether the loader refills the memory of the
        batches before it: those still waiting for the loop (``ahead_of``) or the last
        ``taken`` ones it took (``behind``)."""
        if self.reuses:
            return
        if _refilled(ahead_of, item) or (self.reuses is False and _refilled(behind, item)):
            self._saw_reuse(True)
            log.warning(
                "the loader refilled the memory of a batch fetched ahead, or of one the loop "
                "may still use, with the next one (it hands out its buffers again, filled in "
                "place) after the first batches had not: the loop gets that batch changed. "
                "Fetched in order from now on; fetch ahead only a loader that hands out "
                "fresh tensors"
            )
        elif _refilled(behind, item):
            self._saw_reuse(True)
            log.info(
                "the loader hands out its batches in memory it fills again for the next "
                "batch: fetched in order, not ahead"
            )
        elif self.reuses is None and taken >= self.depth + _HELD:
            # As many batches as are fetched ahead stayed as they were, and the one a loop
            # may still use as it asks for the next.
            self._saw_reuse(False)

    def _saw_reuse(self, reuses: bool) -> None:
        found = self._found
        self.reuses = reuses
        if reuses or found.reuses is None:
            found.reuses = reuses
        if not reuses:
            found.fresh_for = max(found.fresh_for, self.depth)

    def _saw_draws(self, draws: bool) -> None:
        self.draws = self._found.draws = draws

    def drop(self, cache: CachedRows) -> None:
        """Names no more rows for ``cache`` and lets go of it (a cache no longer used: its
        module was put back uncached), so what it holds can be freed."""
        self.caches = [c for c in self.caches if c is not cache]
        for table in (self._paths, self._unused, self._used):
            table.pop(id(cache), None)

    def _name(self, item: T, names: list[_Name]) -> None:
        """Starts naming ``item``'s input for every cache, adding each tensor named to
        ``names``."""
        for cache in self.caches:
            key = id(cache)
            seen = self._used.get(key)
            if seen != cache.used_ahead:  # a forward used names made here: keep naming
                self._used[key] = cache.used_ahead
                self._unused[key] = 0
            unused = self._unused.get(key, 0)
            if unused > self.depth + _UNUSED_LIMIT:
                continue
            x = self._input(item, cache)  # an error of inputs= is the loop's, at this batch
            if not isinstance(x, torch.Tensor):
                continue
            try:
                started = cache.name_ahead(x)
                if started:
                    names.append((cache, id(x), weakref.ref(x)))
            except Exception as why:
                # Not this batch's loss: its forward names the rows itself and says what
                # is wrong with them, if anything is. Counted as a name not used, so a
                # cache whose batches cannot be named ahead is no longer named for.
                log.debug(
                    "naming a batch ahead for `%s` failed (%s: %s); its forward names it",
                    type(cache.module).__name__,
                    type(why).__name__,
                    why,
                )
                started = True
            if started:
                self._unused[key] = unused + 1
                if unused + 1 > self.depth + _UNUSED_LIMIT:
                    log.debug(
                        "no batch named ahead for `%s` reached its forward unchanged; naming "
                        "for it stops (pass inputs= to say which tensor of an item is its "
                        "input)",
                        type(cache.module).__name__,
                    )

    def _input(self, item: T, cache: CachedRows) -> Any:
        if self.inputs is not None:
            return self.inputs(item)
        path = self._paths.get(id(cache))
        if path is None:
            path = batch_for(item, cache.module)
        return None if path is None else _at(item, path)

    # -- on the loop's thread, after each step

    def _learn(self, item: T) -> None:
        for cache in self.caches:
            last = cache.last_input() if cache.last_input is not None else None
            if last is None:
                continue
            for path, tensor in _tensors(item):
                if tensor is last:
                    if self._paths.get(id(cache)) != path:
                        self._paths[id(cache)] = path
                        self._unused[id(cache)] = 0  # a new guess gets a new chance
                    break


def ahead(
    loader: Iterable[T],
    *caches: CachedRows,
    inputs: Callable[[T], torch.Tensor] | None = None,
    depth: int = 1,
    check_draws: bool = False,
) -> Ahead[T]:
    """``loader``, fetched ``depth`` batches ahead, each batch's rows named for ``caches``
    on another thread meanwhile so that their forwards find them named; see the
    module docstring. ``inputs`` picks a cache's input out of a loader item (by default
    it is learned from the steps). ``check_draws`` fetches the first pass in order and
    fetches ahead only a loader that drew no random numbers in it. It is an
    :class:`Ahead` (not a ``DataLoader``): with no content-keyed cache, its iterator is
    ``loader``'s own."""
    return Ahead(loader, caches, inputs=inputs, depth=depth, check_draws=check_draws)
