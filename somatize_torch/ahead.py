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
write into a ``clone()`` and hand the forward that.

Which tensor of a loader item is the cached module's input is learned: after each
step, the tensor of the item that a cache was last called with (found by identity
among the item's tensors) is the one named in the items after it; before the first
step, a tensor item, or a tuple's or list's first tensor, or a dict's ``x`` or
``input``. ``inputs=`` says it outright. A cache whose forwards never use the names
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
beside its own labels. So the first batches (``depth`` of them, after the first) are
fetched in order, each compared with the ones the loop took before it: a loader that
wrote into one (its version counter moved) or handed out another tensor over its
memory (``torch.from_numpy`` of one buffer, each time) is fetched in order from then
on (:attr:`Ahead.reuses`, logged at info), and only one that did neither is fetched
ahead — still compared at every fetch, with a warning, and in order from then on, if
it refills a batch later. What it cannot see: the very tensor handed out again after
a write behind torch's back (through ``x.numpy()``), which looks like a constant
handed with every batch.

An error from the loader, or from ``inputs=``, is raised in the loop at the batch
where it happened, after the batches before it, and the next batch comes at the next
``next()`` as from the loader's own iterator (a loop that skips a sample that fails to
load goes on with the rest of the epoch). Naming that fails, as it starts or on the
other thread, costs no batch: the batch is handed out all the same, and its forward
names the rows itself, raising what is wrong with them if anything is. :class:`Ahead`
passes ``len()`` and any attribute (``sampler``, ``dataset``, …) through to the
loader, so code that inspects a DataLoader still works on it. With no
content-keyed cache to name for it is the loader itself.
"""

from __future__ import annotations

import collections
import functools
import logging
import random
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from somatize_torch._prefill import length_of
from somatize_torch._row_ahead import _NAMED_AHEAD
from somatize_torch.rows import CachedRows, batch_at

__all__ = ["Ahead", "ahead"]

log = logging.getLogger("somatize.torch")

T = TypeVar("T")

_UNUSED_LIMIT = 4
"""Batches named for a cache beyond ``depth``, with none of them used by its forward,
after which the thread stops naming for it."""

Path = tuple[Any, ...]

_Name = tuple[CachedRows, int, weakref.ref[torch.Tensor]]
"""A batch named ahead for a cache: the cache, the tensor's id and a weak reference to it."""


def _tensors(item: Any, path: Path = (), depth: int = 3) -> Iterator[tuple[Path, torch.Tensor]]:
    """Every tensor in ``item`` (nested tuples, lists and dicts, ``depth`` levels), with
    the path of indices and keys that reaches it."""
    if isinstance(item, torch.Tensor):
        yield path, item
    elif depth > 0 and isinstance(item, (tuple, list)):
        for i, part in enumerate(item):
            yield from _tensors(part, (*path, i), depth - 1)
    elif depth > 0 and isinstance(item, dict):
        for key, part in item.items():
            yield from _tensors(part, (*path, key), depth - 1)


def _at(item: Any, path: Path) -> Any:
    for step in path:
        try:
            item = item[step]
        except (KeyError, IndexError, TypeError):
            return None
    return item


_Stamp = tuple[torch.Tensor, int | None, tuple[str, int, int] | None]
"""A tensor of an item, its version counter (None for an inference tensor, which has
none) and the bytes of memory it spans."""


def _span(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    """The device and the range of addresses ``tensor``'s elements lie in; None where it
    has no plain memory to say (sparse, meta, no elements)."""
    if tensor.layout != torch.strided or tensor.is_meta or tensor.numel() == 0:
        return None
    try:
        start = tensor.data_ptr()
    except RuntimeError:
        return None
    last = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return (str(tensor.device), start, start + (last + 1) * tensor.element_size())


def _stamps(items: Iterable[Any]) -> list[_Stamp]:
    return [
        (tensor, None if tensor.is_inference() else tensor._version, _span(tensor))
        for item in items
        for _, tensor in _tensors(item)
    ]


def _refilled(stamps: list[_Stamp], item: Any) -> bool:
    """Whether fetching ``item`` changed the tensors ``stamps`` were taken of: written
    through torch (their version counter moved), or handed out again as another tensor
    over the same memory (a loader filling one buffer and wrapping it anew each time). The
    very tensor handed out again unchanged is a constant the loader gives every item."""
    if not stamps:
        return False
    fresh = [(tensor, _span(tensor)) for _, tensor in _tensors(item)]
    for tensor, version, span in stamps:
        if version is not None and tensor._version != version:
            return True
        for new, at in fresh:
            if new is tensor:
                if version is None:
                    return True  # an inference tensor, which cannot say if it changed
            elif (
                span is not None
                and at is not None
                and at[0] == span[0]
                and at[1] < span[2]
                and span[1] < at[2]
            ):
                return True
    return False


def _draws() -> tuple[Any, ...]:
    """Where the process's global random generators stand: torch's, ``random``'s, and
    numpy's where numpy is imported."""
    numpy = sys.modules.get("numpy")
    state: tuple[Any, ...] = ()
    if numpy is not None:
        _, keys, position, has_gauss, gauss = numpy.random.get_state()
        state = (keys.tobytes(), position, has_gauss, gauss)
    return (torch.random.get_rng_state().numpy().tobytes(), random.getstate(), state)


@dataclass
class _Findings:
    """What passes over a loader have shown about it (see :class:`Ahead`'s ``draws`` and
    ``reuses``), kept for the loader rather than for one :class:`Ahead`: a loop that
    makes ``ahead(loader, ...)`` anew each epoch learns it in the first."""

    draws: bool | None = None
    reuses: bool | None = None
    fresh_for: int = 0  # the most batches ahead over which no refill was seen

    def reuses_at(self, depth: int) -> bool | None:
        """Whether the loader refills its batches, as far as it was seen for fetching
        ``depth`` batches ahead: no refill seen over fewer batches (a loader taking turns
        between two buffers refills the one before last) says nothing."""
        if self.reuses is False and self.fresh_for < depth:
            return None
        return self.reuses


_FINDINGS: dict[int, tuple[weakref.ref[Any], _Findings]] = {}
"""The findings of each live loader passed to :class:`Ahead`, by identity (a loader's own
``==`` says nothing about its batches); an entry goes with its loader."""


def _findings_of(loader: Any) -> _Findings:
    """What is known of ``loader``, shared by every :class:`Ahead` over it; one of its own
    for a loader that takes no weak reference (a list), whose findings are its Ahead's."""
    key = id(loader)
    known = _FINDINGS.get(key)
    if known is not None and known[0]() is loader:
        return known[1]
    found = _Findings()
    try:
        ref = weakref.ref(loader, functools.partial(_lost, key))
    except TypeError:
        return found
    _FINDINGS[key] = (ref, found)
    return found


def _lost(key: int, ref: weakref.ref[Any]) -> None:
    """A loader is gone: its findings go with it (an entry made since for another loader
    at the same address stays)."""
    known = _FINDINGS.get(key)
    if known is not None and known[0] is ref:
        del _FINDINGS[key]


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
        self.loader = loader
        self.caches = list(caches)
        self.inputs = inputs
        self.depth = depth
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
        if name.startswith("__") or name in (
            "loader",
            "caches",
            "inputs",
            "depth",
            "draws",
            "reuses",
        ):
            raise AttributeError(name)
        return getattr(self.loader, name)

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

    def _look_for_reuse(
        self, ahead_of: list[_Stamp], behind: list[_Stamp], item: T, taken: int
    ) -> None:
        """Says from ``item``, just fetched, whether the loader refills the memory of the
        batches before it: those still waiting for the loop (``ahead_of``) or the last
        ``taken`` ones it took (``behind``)."""
        if self.reuses:
            return
        if _refilled(ahead_of, item):
            self._saw_reuse(True)
            log.warning(
                "the loader refilled the memory of a batch fetched ahead with the next one "
                "(it hands out its buffers again, filled in place) after the first batches "
                "had not: the loop gets that batch changed. Fetched in order from now on; "
                "fetch ahead only a loader that hands out fresh tensors"
            )
        elif _refilled(behind, item):
            self._saw_reuse(True)
            log.info(
                "the loader hands out its batches in memory it fills again for the next "
                "batch: fetched in order, not ahead"
            )
        elif self.reuses is None and taken >= self.depth:
            self._saw_reuse(False)  # as many batches as are fetched ahead stayed as they were

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
            path = batch_at(item)
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


class _InOrder(Iterator[T]):
    """A pass over the loader in order, with the generators watched around every fetch but
    the first (which may draw a shuffle, as it does without fetching ahead). An error from
    the loader is raised and the pass goes on at the next call, as on the loader's own
    iterator."""

    def __init__(self, ahead: Ahead[T], items: Iterator[T]) -> None:
        self.ahead = ahead
        self.items = items
        self.count = length_of(ahead.loader)
        self.fetched = 0
        self.taken: collections.deque[T] = collections.deque(maxlen=ahead.depth)
        self.done = False

    def __next__(self) -> T:
        if self.done:
            raise StopIteration
        before = _draws() if self.fetched else None
        behind = _stamps(self.taken)
        try:
            item = next(self.items)
        except StopIteration:
            self.done = True
            self.items = iter(())
            if self.ahead.draws is None and self.fetched:
                self.ahead._saw_draws(False)  # a whole pass drew nothing: ahead from now on
            raise
        except Exception:
            self._counted(before)  # the batch that failed took its place, and may have drawn
            raise
        self._counted(before)
        self.ahead._look_for_reuse([], behind, item, len(self.taken))
        self.taken.append(item)
        return item

    def close(self) -> None:
        """Ends the pass, as a generator's ``close`` does, and lets the loader's iterator go."""
        self.done = True
        self.items = iter(())

    def _counted(self, before: tuple[Any, ...] | None) -> None:
        ahead = self.ahead
        self.fetched += 1
        if before is not None and _draws() != before:
            ahead._saw_draws(True)
            log.debug("the loader draws random numbers as it fetches: fetched in order")
        if ahead.draws is None and self.count is not None and self.fetched >= self.count:
            ahead._saw_draws(False)  # a whole pass drew nothing (a loop may stop at its length)


class _Fetching(Iterator[T]):
    """A pass over the loader, each batch fetched ``depth`` batches before it is asked for
    and named meanwhile. An error from the loader (or from ``inputs=``) is raised at its
    batch's turn and the pass goes on at the next call, as on the loader's own iterator: a
    loop that skips a sample that fails to load loses nothing after it.

    A cache holds each batch named ahead until its forward takes the names. The names no
    forward will take are let go as the pass ends: all but the last batch's once the
    loader is exhausted (a loop may fetch the next batch before it runs the step, as
    Lightning's does), and all of them when the pass is closed or collected (a loop
    left early, or over)."""

    def __init__(self, ahead: Ahead[T], items: Iterator[T]) -> None:
        self.ahead = ahead
        self.items = items
        # Each batch fetched, with the error ``inputs=`` raised on it (raised at its turn)
        # and the names started for it.
        self.waiting: collections.deque[tuple[T, Exception | None, list[_Name]]]
        self.waiting = collections.deque()
        # The names started for the batches handed out, each with the batch's number: a
        # cache holds no more batches named ahead than the last of these.
        most = _NAMED_AHEAD * max(1, len(ahead.caches))
        self.named: collections.deque[tuple[int, _Name]] = collections.deque(maxlen=most)
        self.handed_out = 0
        self.failed: Exception | None = None  # raised once the batches before it are through
        self.done = False  # the loader's iterator is exhausted
        # Never ahead past the loader's length: asking an exhausted DataLoader for one
        # more batch draws from its shuffling generator, so a loop that stops at the
        # length (as Lightning's does) would see other shuffles in the epochs after.
        self.count = length_of(ahead.loader)
        self.fetched = 0
        # The last batches the loop took (as many as are fetched ahead): until the loader
        # is known not to refill their memory for the next, batches are fetched in order
        # and compared with them (see `reuses`).
        self.taken: collections.deque[T] = collections.deque(maxlen=ahead.depth)
        self.handed: list[T] = []  # the batch handed out last, learned from at the next call

    def __next__(self) -> T:
        if self.handed:
            item = self.handed.pop()
            self.taken.append(item)
            self.ahead._learn(item)
        self._fetch()
        if not self.waiting:
            if self.failed is not None:
                failed, self.failed = self.failed, None
                raise failed
            last = self.handed_out  # that batch's step may be still to come
            while self.named and self.named[0][0] != last:
                _let_go([self.named.popleft()[1]])
            raise StopIteration
        item, raised, names = self.waiting.popleft()
        if raised is not None:
            _let_go(names)
            raise raised
        self.handed.append(item)
        self.handed_out += 1
        self.named.extend((self.handed_out, name) for name in names)
        return item

    def close(self) -> None:
        """Ends the pass, as a generator's ``close`` does: the batches fetched and not
        handed out are dropped, and every name no forward has taken is let go."""
        self.done = True
        self.items = iter(())  # the loader's iterator goes (a DataLoader's workers with it)
        self.failed = None
        self.handed.clear()
        _let_go([name for _, name in self.named])
        self.named.clear()
        while self.waiting:
            _let_go(self.waiting.popleft()[2])

    def __del__(self) -> None:
        self.close()

    def _fetch(self) -> None:
        """Fetches (and names) batches until ``depth`` of them wait beyond the next."""
        ahead = self.ahead
        while not self.done and self.failed is None and len(self.waiting) <= ahead.depth:
            if self.waiting and self.count is not None and self.fetched >= self.count:
                break  # past the length only when the loop asks for it
            if self.waiting and ahead.reuses is not False:
                break  # in order until the loader is known to hand out fresh memory
            ahead_of = _stamps(item for item, _, _ in self.waiting)
            behind = _stamps(self.taken)
            try:
                item = next(self.items)
            except StopIteration:
                self.done = True
                self.items = iter(())
                break
            except Exception as error:
                self.fetched += 1  # the batch that failed took its place in the loader
                self.failed = error
                break
            self.fetched += 1
            ahead._look_for_reuse(ahead_of, behind, item, len(self.taken))
            names: list[_Name] = []
            try:
                ahead._name(item, names)
            except Exception as chosen:  # from inputs=: naming itself raises nothing here
                self.waiting.append((item, chosen, names))
            else:
                self.waiting.append((item, None, names))


def _let_go(names: list[_Name]) -> None:
    """Drops the names a cache holds for these batches, where no forward has taken them, so
    that the cache no longer holds the batches. Safe in a finalizer: a cache whose lock
    this thread is inside already (a collection run in the middle of its block) keeps
    them, still at most as many as it ever holds."""
    for cache, key, ref in names:
        lock = cache._named_lock
        if lock.held_here():
            continue
        with lock:
            found = cache._named.get(key)
            if found is not None and found[0]() is ref():
                del cache._named[key]


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
    fetches ahead only a loader that drew no random numbers in it. With no
    content-keyed cache it is ``loader`` itself."""
    return Ahead(loader, caches, inputs=inputs, depth=depth, check_draws=check_draws)
