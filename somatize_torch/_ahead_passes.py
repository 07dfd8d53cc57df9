"""The passes :class:`~somatize_torch.ahead.Ahead` makes over a loader, what they watch
as they fetch, and what is known of each loader.

A pass is one iteration of the loader, with what it watches. :class:`_InOrder` is the
first pass over a loader not yet known to draw no random numbers (``check_draws=True``):
it fetches each batch only when the loop asks for it, as without fetching ahead, and
compares the global generators (:func:`_draws`) around every fetch after the first.
:class:`_Fetching` fetches batches before the loop asks for them, ``depth`` at most and
only once the loader is known not to refill them, and starts naming their rows as each
is fetched; as the pass ends it lets go of the names no forward took (:func:`_let_go`).
Both compare each batch fetched with the ones before it (:func:`_stamps`,
:func:`_refilled`) to see whether the loader fills again the memory of a batch it handed
out; the ``Ahead`` they serve decides what follows from what they saw.

What passes show about a loader (whether it draws, whether it refills its batches) is
kept for that loader while it lives, in a :class:`_Findings` found by the loader's
identity (:func:`_findings_of`), so a loop that makes ``ahead(loader, ...)`` anew each
epoch learns it once.
"""

from __future__ import annotations

import collections
import functools
import logging
import random
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from somatize_torch._row_ahead import _NAMED_AHEAD
from somatize_torch.rows import CachedRows

if TYPE_CHECKING:
    from somatize_torch.ahead import Ahead

log = logging.getLogger("somatize.torch")

T = TypeVar("T")

Path = tuple[Any, ...]

_HELD = 1
"""Batches a loop may still use once it asks for the next, beyond those fetched ahead:
Lightning's fetches the next batch of a loader of no length before it runs the step on
the one it has (to know which batch is the last). A loader is fetched ahead ``depth``
batches only once ``depth + _HELD`` batches before each one fetched in order were seen
left as they were, so that a loader taking turns between two buffers is not fetched one
ahead into the buffer of the batch whose step is still to come."""

_Name = tuple[CachedRows, int, weakref.ref[torch.Tensor]]
"""A batch named ahead for a cache: the cache, the tensor's id and a weak reference to it."""


def _tensors(item: Any, path: Path = (), depth: int = 3) -> Iterator[tuple[Path, torch.Tensor]]:
    """Every tensor in ``item`` (nested tuples, lists and mappings, ``depth`` levels), with
    the path of indices and keys that reaches it. A mapping that is no dict (a tokenizer's
    ``BatchEncoding``) is looked into as a dict is, so its input is learned and a buffer
    refilled in it is seen."""
    if isinstance(item, torch.Tensor):
        yield path, item
    elif depth > 0 and isinstance(item, (tuple, list)):
        for i, part in enumerate(item):
            yield from _tensors(part, (*path, i), depth - 1)
    elif depth > 0 and isinstance(item, Mapping):
        for key, part in item.items():
            yield from _tensors(part, (*path, key), depth - 1)


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


class _Pass(Iterator[T]):
    """What the two passes share: the loader's iterator, let go when the pass ends."""

    items: Iterator[T]
    done: bool  # the pass is over: the loader's iterator is exhausted or let go

    def close(self) -> None:
        """Ends the pass, as a generator's ``close`` does, and lets the loader's iterator go."""
        self._end()

    def _end(self) -> None:
        self.done = True
        self.items = iter(())  # the loader's iterator goes (a DataLoader's workers with it)

    def _next_item(self) -> T:
        """The loader's next item; where the loader has none left, the pass ends and the
        ``StopIteration`` goes on to the caller."""
        try:
            return next(self.items)
        except StopIteration:
            self._end()
            raise


class _InOrder(_Pass[T]):
    """A pass over the loader in order, with the generators watched around every fetch but
    the first (which may draw a shuffle, as it does without fetching ahead). An error from
    the loader is raised and the pass goes on at the next call, as on the loader's own
    iterator."""

    def __init__(self, ahead: Ahead[T], items: Iterator[T]) -> None:
        self.ahead = ahead
        self.items = items
        self.count = ahead.batches()
        self.fetched = 0
        self.taken: collections.deque[T] = collections.deque(maxlen=ahead.depth + _HELD)
        self.done = False

    def __next__(self) -> T:
        if self.done:
            raise StopIteration
        before = _draws() if self.fetched else None
        behind = _stamps(self.taken)
        try:
            item = self._next_item()
        except StopIteration:
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

    def _counted(self, before: tuple[Any, ...] | None) -> None:
        ahead = self.ahead
        self.fetched += 1
        if before is not None and _draws() != before:
            ahead._saw_draws(True)
            log.debug("the loader draws random numbers as it fetches: fetched in order")
        if ahead.draws is None and self.count is not None and self.fetched >= self.count:
            ahead._saw_draws(False)  # a whole pass drew nothing (a loop may stop at its length)


class _Fetching(_Pass[T]):
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
        # length (as Lightning's does) would see other shuffles in the epochs after. Nor
        # past the batches the loop takes, where it stops before (`max_steps`).
        self.count = ahead.batches()
        self.fetched = 0
        # The last batches the loop took (as many as are fetched ahead, and the one a loop
        # may still use, `_HELD`): until the loader is known not to refill their memory for
        # the next, batches are fetched in order and compared with them (see `reuses`).
        self.taken: collections.deque[T] = collections.deque(maxlen=ahead.depth + _HELD)
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
        self._end()
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
                item = self._next_item()
            except StopIteration:
                break
            except Exception as error:
                self.fetched += 1  # the batch that failed took its place in the loader
                self.failed = error
                break
            self.fetched += 1
            known = ahead.reuses
            ahead._look_for_reuse(ahead_of, behind, item, len(self.taken))
            names: list[_Name] = []
            if ahead.reuses:
                if not known:
                    self._let_go_refilled()
                # The next fetch may fill this batch again before its forward (a loop that
                # fetches before its step), behind torch's back as likely as not: its
                # forward names it.
                self.waiting.append((item, None, names))
                continue
            try:
                ahead._name(item, names)
            except StopIteration as stop:
                # Raised at its turn as it is, it would end the loop as the loader's end
                # does, and every batch after it would be lost without a word.
                refused = RuntimeError(
                    "inputs= raised StopIteration on a loader item (a `next()` over its "
                    "parts that found none): raised as this error, as it would otherwise end "
                    "the loop as if the loader were exhausted. Have inputs= raise another "
                    "error, or answer None, for an item holding no input"
                )
                refused.__cause__ = stop
                self.waiting.append((item, refused, names))
            except Exception as chosen:  # from inputs=: naming itself raises nothing here
                self.waiting.append((item, chosen, names))
            else:
                self.waiting.append((item, None, names))

    def _let_go_refilled(self) -> None:
        """Lets go of the names made for the batches fetched and not taken yet, and for
        those handed out, once the loader is seen filling one of them again: a batch filled
        through a new tensor over its memory (``torch.from_numpy`` of one buffer) moved no
        version counter, so its forward would take the names of what it held before."""
        for _, _, names in self.waiting:
            _let_go(names)
            names.clear()
        _let_go([name for _, name in self.named])
        self.named.clear()


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
