"""Where a forward finds its rows: the memory tiers, then the store, then the module.

A forward looks its rows up nearest first (:mod:`somatize_torch.residency`):
the device tier, the host tier, the rows the store writer still holds unwritten
(:meth:`~somatize_torch.writer.Writer.recall`), then the store — one dict pass and
one gather per tier that holds any — and runs the module only on the rows found
nowhere, as one sub-batch, in eval mode and without gradients
(:mod:`somatize_torch._rowwise`), then puts the output back together in the
batch's order. The rows it computed go into the nearest memory tier with room
and, behind the step, into the store. On a CUDA device, while the cache recalls
nothing, a batch is run whole before its rows' names come back from the device
(:func:`_queue_names`), so that the forward does not leave the device idle.

Rows of a :class:`~somatize_torch.deferred.Deferred` are looked for in the store
once more, ahead of their batches: the first time a keying meets a Deferred, the
samples the store already answered are marked on another thread (:func:`_seed`),
so their inputs stop coming with the samples.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from somatize.engine import Drifted
from somatize.errors import SomatizeWarning
from somatize.store._local_files import OUT_OF_FILES
from somatize.store.base import Corrupt, Missing, StoreError
from somatize_torch._errors import (
    JIT_TRACE,
    in_a_transform,
    jit_tracing,
    traced_by,
    transforming,
)
from somatize_torch._modes import outside_compiled
from somatize_torch._row_codec import (
    as_bits,
    batch_order,
    decode_rows,
    empty_rows,
    laid_out,
)
from somatize_torch._row_errors import NotRowwise, RowsError
from somatize_torch._row_keys import _Keying, _keying, _row_ids
from somatize_torch._rowwise import (
    _check_kept,
    _check_records_none,
    _compute,
    _in_eval,
    _same_answers,
    _still_keyed,
    answered_for_layout,
)
from somatize_torch.codec import TENSOR
from somatize_torch.deferred import Deferred, DeferredRows
from somatize_torch.digest import RowsQueued, raw_rows_queued
from somatize_torch.freeze import check_still, outside_level

if TYPE_CHECKING:
    from somatize_torch._state import StateWatch
    from somatize_torch.rows import CachedRows

log = logging.getLogger("somatize.torch")

_SEED_CHUNK = 4096
"""How many samples' keys one call to the store's ``have`` holds, looking for answered ones."""


def _recall_or_run(
    self: CachedRows, x: torch.Tensor | DeferredRows, index: torch.Tensor | None
) -> torch.Tensor:
    if self._tiers_lock.held_here():
        raise RowsError(
            f"`{type(self.module).__name__}` is cached per row and was called by code run "
            "while this thread was inside the cache's own lookup (a `__del__` or weakref "
            "callback a garbage collection ran there): its memory tiers are half updated "
            "there, so the call would wait for itself, for ever. Call the cache from "
            "ordinary code, after the collection"
        )
    if isinstance(x, DeferredRows) and x.outdated():
        return _answer_outdated(self, x)
    if self._writer is not None:
        self._writer.check()  # here, outside what torch.compile traces
    start = time.perf_counter()
    if not self._placed:
        with self._tiers_lock:
            self.tiers[0].device = x.device
            self._placed = True
    if isinstance(x, torch.Tensor):
        # The cache's own attribute, set past the wrapper's `__setattr__` (which looks for
        # the name on the module first) and `nn.Module`'s: a few microseconds a batch.
        object.__setattr__(self, "last_input", weakref.ref(x))
    # How the module lays out its answers depends on how its input is laid out (a conv
    # fed channels_last answers channels_last): recalled rows follow the batches it
    # computed from inputs laid out as this one.
    with self._tiers_lock:
        orders = self._orders.setdefault(_layout_of(x), {})
    # A part put in since is held in eval with the rest; `watch` watches the weights the
    # rows are keyed under.
    keying, watch = _keying(self, x)
    if keying.mixes is not None:
        raise NotRowwise(keying.mixes)  # seen answering rows of two shapes: refused
    _check_still(self)
    # A batch that requires grad is taken here only where none is recorded; one the module
    # records a gradient of anyway is refused, or put back uncached and answered by it.
    if isinstance(x, torch.Tensor) and x.requires_grad and _check_records_none(self, x, keying):
        return self._uncached(x)
    tag = keying.tag
    if isinstance(x, DeferredRows):
        x.dataset().marks_under(keying.version)  # before the store is looked up for them
        if self.store is not None:
            _seed(self, x, keying)
    ran_s = 0.0  # the module's time on this batch
    ahead: torch.Tensor | None = None  # the whole batch's answer, run before it was named
    queued = _queue_names(x) if self._cold and self.key_mode == "content" else None
    if queued is not None:
        began = time.perf_counter()
        ahead = _run(self, x, list(range(queued.rows)), keying, watch)
        ran_s = time.perf_counter() - began
        ids = queued.result()
    else:
        ids = _row_ids(self, x, index)
    near = [(tag, row) for row in ids]
    count = len(near)
    if count == 0:
        return _compute(self, x, [], keying, watch)  # an empty batch: nothing to look up or keep
    # What this forward counts, added to the cache's counts at its end all at once: a
    # `reset_stats` meanwhile (on another thread) finds it in one period, whole.
    counts = dict.fromkeys(("device", "host", "pending", "store", "unread"), 0)
    pieces: list[tuple[list[int] | None, torch.Tensor]] = []
    positions: list[int] | None = None  # None: every row is still to be found
    # The tiers are looked up and admitted to under the cache's lock: a cache called from
    # two threads at once (a threaded server) would otherwise gather from a bank another
    # thread is growing, or admit rows into slots the other is writing.
    with self._tiers_lock:
        for tier in self.tiers:
            if positions == [] or not tier.banks:
                continue
            got, rest = tier.find(near, positions)
            for at, rows in got:
                counts[tier.name] += len(at) if at is not None else count
                pieces.append((at, rows))
            positions = rest
    if positions is None:
        positions = list(range(count))
    computed = ran_s
    keys: dict[int, str] = {}

    def keyed(positions: list[int]) -> dict[int, str]:
        """Position → store key of the rows at ``positions``, made in one call."""
        return dict(zip(positions, keying.keys_of([ids[p] for p in positions]), strict=True))

    def took(
        found: tuple[list[int], torch.Tensor] | None, where: str, positions: list[int]
    ) -> list[int]:
        """Takes in the rows ``found`` (positions and rows) beside the batch's others,
        counted as from ``where`` and admitted to the tiers: the positions still missing."""
        if found is None:
            return positions
        at, rows = found
        if (
            where == "store"
            and drifted
            and not _answers_now(self, x, at[0], rows, drifted, (keying, watch))
        ):
            return positions  # another code's answers, of another shape: computed again
        _same_answers(self, rows, keying, None)
        counts[where] += len(at)
        _admit(self, [near[p] for p in at], rows)
        # Rows come as found (those of several writes a write at a time), not in the
        # batch's order: their positions go with them unless they are the whole batch.
        pieces.append((None if at == list(range(count)) else at, rows))
        taken = set(at)
        return [p for p in positions if p not in taken]

    if positions and self._writer is not None:
        # Rows in no tier may still be on their way to the store, staged in the writer (the
        # tiers full, a disk behind): read from there, before the store, which has them
        # once the writer lets them go.
        keys = keyed(positions)
        positions = took(self._writer.recall(keys), "pending", positions)
    refused: StoreError | None = None  # why the store could not keep rows computed now
    drifted: str | None = None  # the fingerprint of other code that kept rows found, if any
    if positions and self.store is not None:
        # Named for the writer's staging just now, unless there is no writer.
        keys = {p: keys[p] for p in positions} if keys else keyed(positions)
        found, refused, drifted = _from_store(self, keys, counts)
        positions = took(found, "store", positions)
    if keying.unchecked and not keying.rowwise:
        _check_kept(self, x, near, positions, keying, watch)
    if positions:
        if refused is not None:
            _refuse_unkeepable(self, refused, len(positions), count)
        began = time.perf_counter()
        first: dict[Hashable, int] = {}
        for p in positions:
            first.setdefault(near[p], p)
        once = list(first.values())  # a row that is in the batch twice runs once
        if ahead is not None:
            rows = ahead if len(once) == count else ahead[_index(once, ahead.device)]
        else:
            # Unless it is the only row to run and the module is not yet known to answer
            # each row alone: run once, it would go unchecked (`_rowwise`), and a module
            # that mixes rows would answer it as it answers a batch of one, not of the
            # copies it was given.
            run = positions if len(once) == 1 and not keying.rowwise else once
            rows = _run(self, x, run, keying, watch)
            if run is not once:
                rows = rows[:1]  # the copies' answers are the first one's, checked
        computed += time.perf_counter() - began
        _learn_order(self, orders, rows)  # what a batch answered from memory is laid out as
        if _still_keyed(self, watch):
            # Queued for the store before they are kept in memory: a submit interrupted
            # while it waits for the writer (Ctrl-C) leaves them in no tier either, so the
            # forward run again computes and queues them, rather than recall them and
            # never write them.
            if self._writer is not None:
                named = keys or keyed(once)  # named for the writer's lookup, as a rule
                self._writer.submit([named[p] for p in once], rows)
            _admit(self, [near[p] for p in once], rows)
            if not keying.rowwise:
                keying.unchecked = True
        if len(once) < len(positions):
            slot = {p: i for i, p in enumerate(once)}
            rows = rows[torch.tensor([slot[first[near[p]]] for p in positions])]
        elif rows.is_cuda and len(positions) == count:
            # The writer copies these rows to the host on a side stream, after the work
            # queued so far; a caller writing into the output in place must not race it.
            rows = rows.clone()
        pieces.append((None if len(positions) == count else positions, rows))
    if len(positions) < count:
        computed += _learn_layout(self, x, pieces[0][1], orders, ahead)
    # Rows all computed now are the module's own as they are; any recalled are laid out.
    out = _assemble(pieces, count, x.device, {} if len(positions) == count else orders)
    if isinstance(x, DeferredRows):
        x.answered(
            _held(self, near, positions), keying.version
        )  # their inputs need not come any more
    with self._tiers_lock:
        into = _count_batch(self, count, len(positions), computed)
        for name, rows_of in counts.items():
            into[name] += rows_of
        into["ran_ahead"] += count if ahead is not None else 0
        # Nothing recalled: the next batch on a device is run before its rows are named.
        cold = not any(counts[tier] for tier in ("device", "host", "pending", "store"))
        if cold != self._cold:
            self._cold = cold
        into["lookup_s"] += time.perf_counter() - start - computed
    return out


def _count_batch(self: CachedRows, rows: int, computed: int, compute_s: float) -> dict[str, float]:
    """Counts a batch of ``rows``, ``computed`` of them answered by running the module (kept
    or not) in ``compute_s``, into the cache's counts, which it returns for the rest of
    the batch's; called under the cache's lock."""
    into = self._counts
    into["batches"] += 1
    into["rows"] += rows
    into["computed"] += computed
    into["compute_s"] += compute_s
    return into


def _answer_outdated(self: CachedRows, x: DeferredRows) -> torch.Tensor:
    """The module's answer on rows handed out under a version their Deferred no longer
    holds (:meth:`~somatize_torch.deferred.DeferredRows.outdated`), from the inputs that
    came with them, warned of once per Deferred and version: rows made so may hold the
    old data or the new (changed in place where the workers read it), which the cache
    cannot tell apart, so none is recalled or kept. They run as any row the cache computes
    does, without gradients, and are counted as computed. Rows that came without their
    input are refused (:meth:`~somatize_torch.deferred.DeferredRows.loadable`)."""
    seen = (x.source, x.version)
    if seen not in self._outdated_warned:
        self._outdated_warned.add(seen)
        warnings.warn(
            f"`{type(self.module).__name__}` is cached per row and was handed rows made "
            f"under version {x.version!r} of a Deferred that holds "
            f"{x.dataset().version!r} now (by persistent DataLoader workers, which hold it "
            "as it was when they started): they are computed from the inputs that came "
            "with them, and neither recalled nor kept. Make the DataLoader again to cache "
            "them",
            SomatizeWarning,
            stacklevel=outside_level(),
        )
    _check_still(self)  # answered as any row is: by the module in eval
    began = time.perf_counter()
    with torch.no_grad():  # as `_answer` runs the rows the cache computes
        out = self._uncached(x)
    with self._tiers_lock:
        _count_batch(self, len(x), len(x), time.perf_counter() - began)["outdated"] += len(x)
    return out


def _run(
    self: CachedRows,
    x: torch.Tensor | DeferredRows,
    positions: list[int],
    keying: _Keying,
    watch: StateWatch | None,
) -> torch.Tensor:
    """The module's answer on the rows of ``x`` at ``positions``, run in eval mode."""
    rows = _compute(self, x, positions, keying, watch)
    if not _in_eval(self):
        # A part put in train mode as the module ran (by another thread): its rows may be
        # train mode's (a dropout drawing). Computed again, the part warned of and put
        # back in eval first (`_compute`), and kept only if none moved meanwhile. It runs
        # on the very rows it ran on: a module writing into them was refused as it ran.
        rows = _compute(self, x, positions, keying, watch)
    return rows


def _learn_order(
    self: CachedRows,
    orders: dict[tuple[torch.Size, torch.dtype], list[int] | None],
    rows: torch.Tensor,
) -> None:
    """Takes the order of the dims in memory of ``rows``, which the module answered, as how
    it lays out rows of their shape and dtype for inputs laid out as those ``orders``
    are for. One row says nothing of where the module puts the batch's dim: the place a
    batch of more showed is kept."""
    kind = (rows.shape[1:], rows.dtype)
    with self._tiers_lock:
        if len(rows) > 1 or kind not in orders:
            orders[kind] = batch_order(rows)


def _learn_layout(
    self: CachedRows,
    x: torch.Tensor | DeferredRows,
    recalled: torch.Tensor,
    orders: dict[tuple[torch.Size, torch.dtype], list[int] | None],
    ahead: torch.Tensor | None,
) -> float:
    """Learns how the module lays out rows like ``recalled`` for inputs laid out as ``x``,
    where no batch it ran from such inputs said so yet (a layout first met with every
    row recalled, or a new cache recalling from the store): the rows' own layout is the
    one they were computed in, maybe from inputs laid out otherwise. It is seen on the
    batch run ahead, if any, else by running the module once on the first two rows of
    ``x`` (one where it holds one): answers neither kept nor counted as rows computed. Returns
    how long the module ran. Rows of a Deferred are not run so: answered, their inputs are
    not loaded (they come back as kept, until the cache computes a batch of them)."""
    if (recalled.shape[1:], recalled.dtype) in orders or isinstance(x, DeferredRows):
        return 0.0  # as a rule: one dict lookup a batch
    began = time.perf_counter()
    if ahead is None:
        ahead = answered_for_layout(self, x, list(range(min(len(x), 2))))
    _learn_order(self, orders, ahead)
    return time.perf_counter() - began


def _queue_names(x: torch.Tensor | DeferredRows) -> RowsQueued | None:
    """The content names of ``x``'s rows, queued where naming would wait for its device;
    None where the rows are named at once.

    Named on a CUDA device, a batch's rows are known to the host only once the device has
    done all the work queued before the digests: the last step's. A forward that names
    its rows first therefore waits for the device at every batch, and the device waits
    for the forward's lookup before it has the batch's run queued — where a loop that
    recomputes queues each batch while the device still runs the one before. While the
    cache recalls nothing (a first epoch), a batch is thus run whole behind its queued
    names, and looked up once they come (:func:`_recall_or_run`): rows found after all
    are recalled, their run spent for nothing, and from then on rows are named first."""
    if not isinstance(x, torch.Tensor):
        return None
    return raw_rows_queued(x)


def _index(positions: list[int], device: torch.device) -> torch.Tensor:
    """``positions`` as an index on ``device``, copied without waiting for the device."""
    return torch.tensor(positions, dtype=torch.long).to(device, non_blocking=True)


def _refuse_unkeepable(self: CachedRows, refused: StoreError, missing: int, count: int) -> NoReturn:
    """Refuses to compute ``missing`` rows of a batch of ``count`` that the store could not
    keep (``refused``: it is one this process may not write, on a read-only disk, or its
    directory is gone) before the module runs: the work would be lost, and every write
    of it would fail behind the step, raised at some later forward. What the store holds
    is still recalled."""
    raise StoreError(
        f"{missing} of the {count} rows of this batch for `{type(self.module).__name__}` "
        f"are in no memory tier and not in {self.store!r}, which cannot keep them: "
        f"computed, their writes would fail behind the step ({refused}). Nothing was "
        "computed; batches whose rows the store holds are still answered from it. To "
        "compute rows, cache over a store this process may write, or with store=None to "
        "keep them in memory only"
    ) from refused


def _check_still(self: CachedRows) -> None:
    """Warns of a part of the module put in train mode directly (``encoder[1].train()``)
    and puts it back in eval, whether the batch's rows are then recalled or computed: what
    is recalled is what it answers in eval."""
    if not _in_eval(self):
        check_still(type(self.module).__name__, self.module)


def _held(self: CachedRows, near: Sequence[Hashable], computed: list[int]) -> list[int] | None:
    """The batch positions whose rows some copy holds now (None: all of them): rows
    computed are kept in the store, where there is one; without it, only those a memory
    tier took. A row kept nowhere is not marked answered, so its input goes on coming with
    its sample (loaded by a DataLoader's workers) rather than by the cache every epoch."""
    if self._writer is not None or not computed:
        return None
    with self._tiers_lock:
        dropped = {p for p in computed if not any(near[p] in tier for tier in self.tiers)}
    if not dropped:
        return None
    return [p for p in range(len(near)) if p not in dropped]


def _seed(self: CachedRows, x: DeferredRows, keying: _Keying) -> None:
    """The first time rows of a Deferred come under ``keying``: marks the samples whose
    rows the store already has as answered, on another thread, so their inputs stop
    coming with the samples (a store filled by an earlier run leaves nothing to load
    from the first batches on). It looks up :data:`_SEED_CHUNK` samples at a time
    and stops at a chunk the store has none of, so a first run over a large dataset
    spends one lookup on it."""
    dataset = x.dataset()
    mark = (dataset.name, keying.tag)
    if mark in self._seeded:
        return
    self._seeded.add(mark)
    seeder = threading.Thread(
        target=_seed_from_store, args=(self, dataset, keying), name="somatize-seed", daemon=True
    )
    self._seeders = [t for t in self._seeders if t.is_alive()] + [seeder]
    seeder.start()


def _seed_from_store(self: CachedRows, dataset: Deferred, keying: _Keying) -> None:
    store, lock = self.store, self._lock
    assert store is not None and lock is not None
    try:
        todo: list[int] = (~dataset.answered).nonzero().flatten().tolist()
        for start in range(0, len(todo), _SEED_CHUNK):
            keys = {keying.key(i): i for i in todo[start : start + _SEED_CHUNK]}
            with lock:
                present = store.have(keys)
            if not present:
                return  # a store without these (a first run): the rest is not looked up
            dataset.mark_answered([keys[key] for key in present], keying.version)
    except Exception as error:  # a hint: a sample left unmarked is only loaded
        log.debug("the store was not looked up for answered samples: %s", error)


def _admit(self: CachedRows, near: list[Hashable], rows: torch.Tensor) -> None:
    """Keeps rows in the nearest memory tier with room, the rest in the next one: each
    once, and none that a tier holds already (another thread, calling the cache at the
    same time, may have admitted it since this one looked)."""
    if not any(tier.budget or tier.banks for tier in self.tiers):
        return  # no room anywhere (a cache of the store alone): no row to look for either
    with self._tiers_lock:
        first: dict[Hashable, int] = {}
        for i, key in enumerate(near):
            first.setdefault(key, i)
        for tier in self.tiers:
            if not tier.slots.keys().isdisjoint(first):  # as a rule, none is held
                for key in [key for key in first if key in tier]:
                    del first[key]
        if len(first) < len(near):
            near = list(first)
            rows = rows[torch.tensor(list(first.values()), dtype=torch.long, device=rows.device)]
        done = 0
        for tier in self.tiers:
            if done == len(near):
                return
            done += tier.admit(near[done:], rows[done:])


def _from_store(
    self: CachedRows, keys: dict[int, str], counts: dict[str, int]
) -> tuple[tuple[list[int], torch.Tensor] | None, StoreError | None, str | None]:
    """The rows at batch positions ``keys`` (position → store key) the store has, and why
    it could not keep rows computed now, if it could not (a read-only store, or one whose
    directory is gone: :meth:`~somatize.Store._refused_keeping`, which tells without
    keeping anything) — asked in one hold of what a forward holds to read the store
    (:func:`~somatize_torch.writer.reading`: nothing where the store may be read while
    the writer thread writes through it, so the forward waits for no write; else the
    store's lock, so it waits for no more than the one write in progress). A row it has
    but cannot hand over whole — damaged, gone since it was asked, or a read that failed
    (an I/O error, a file this process may not read) — is a miss: computed again,
    counted in ``counts["unread"]`` and warned of (:func:`_unread`), never raised to the
    caller, as the store is a cache of what the module answers. So is a lookup of which
    rows it has that fails (a ``packs/`` listing failing with an I/O error): every row
    looked up is computed again, unless the store could not keep them either, as a
    read-only store could not. Rows another version of the module's code kept are
    taken, unless the cache is strict, and the fingerprint of that code comes back with
    them (:func:`_answers_now` sees whether they are of the shape this code answers)."""
    store = self.store
    assert store is not None and self._lock is not None
    with self._lock:
        refused = store._refused_keeping()
        try:
            present = store.have(keys.values())
        except (StoreError, OSError) as why:
            if refused is None:  # else the refusal is raised, before any row is computed
                _unread(self, counts, len(keys), why, "looked up in")
            return None, refused, None
        if not present:
            return None, refused, None
        wanted = [p for p, key in keys.items() if key in present]
        try:
            got = store.recall_many([keys[p] for p in wanted], borrow=True)  # decoded by copy
        except OSError as why:  # the whole read failed, not one answer of it
            _unread(self, counts, len(wanted), why)
            return None, refused, None
    at: list[int] = []
    drifted: str | None = None
    datas: list[memoryview] = []
    faults: list[Exception] = []
    for p in wanted:
        item = got.get(keys[p]) or Missing(f"the store handed nothing back for {keys[p]}")
        if not isinstance(item, tuple):
            faults.append(item)  # damaged, gone since `have`, or not read: computed again
            continue
        answer, data = item
        if answer.codec != TENSOR.name:
            continue
        if answer.fingerprint not in (None, self._fingerprint):
            if self.strict:
                continue
            drifted = answer.fingerprint
        at.append(p)
        datas.append(data)
    if faults:
        _unread(self, counts, len(faults), faults[0])
    if not at:
        return None, refused, None
    try:
        rows = decode_rows(datas)
    except (ValueError, TypeError, Corrupt, Missing) as why:
        _unread(self, counts, len(at), why)  # every row of this lookup is computed again
        return None, refused, None
    return (at, rows), refused, drifted


def _unread(
    self: CachedRows,
    counts: dict[str, int],
    rows: int,
    why: Exception,
    doing: str = "read back from",
) -> None:
    """Counts ``rows`` more rows the store had and could not hand over (``why``), or could
    not say whether it had (``doing``: "looked up in"), and warns of the first such of
    this cache: they are computed again, so the answer is right, but a store that keeps
    failing to read (a disk going bad) costs every epoch their compute."""
    counts["unread"] += rows
    if self._unread_warned:
        return
    self._unread_warned = True
    look = (
        # Found by the lookup and gone at the read: let go of, not damaged.
        "the store let them go after they were looked up (a gc, in this process or "
        "another, or a file removed by hand), so nothing is wrong with it"
        if isinstance(why, Missing)
        else "the store is not at fault"
        if _out_of_files(why)
        else "`somatize store verify` looks the store over"
    )
    warnings.warn(
        f"rows of `{type(self.module).__name__}` could not be {doing} the store "
        f"({type(why).__name__}: {why}); they were computed again. `stats.rows_unread` "
        f"counts such rows; {look}",
        SomatizeWarning,
        stacklevel=outside_level(),
    )


def _answers_now(
    self: CachedRows,
    x: torch.Tensor | DeferredRows,
    position: int,
    rows: torch.Tensor,
    was: str,
    keyed: tuple[_Keying, StateWatch | None],
) -> bool:
    """Whether ``rows``, recalled from the store and kept by another version of the
    module's code (``was``), are of the shape and dtype this code answers (warned of as
    drifted, then, and used). Their key is the same (class, structure, weights), so code
    that now answers rows of another size (a pooling changed to concatenate two) would
    have them recalled whole, wrong. What this code answers is seen once per keying, by
    running the row at ``position`` of ``x``, where no row computed or recalled under it
    has said so yet; rows of any other shape are computed again."""
    keying, watch = keyed
    if keying.answers is None:
        _run(self, x, [position], keying, watch)  # `_same_answers` takes its shape
    if keying.answers is None or keying.answers == (rows.shape[1:], rows.dtype):
        _drifted(self, was)
        return True
    if not self._drift_warned:
        self._drift_warned = True
        (shape, dtype), kept = keying.answers, (rows.shape[1:], rows.dtype)
        warnings.warn(
            f"rows of `{type(self.module).__name__}` in the store were kept by another "
            f"version of its code ({was}, now {self._fingerprint}) and are rows of "
            f"{list(kept[0])} {kept[1]}, where it answers {list(shape)} {dtype} now: "
            "they are computed again. Pass a new salt= to keep this code's rows apart "
            "in the store",
            Drifted,
            stacklevel=outside_level(),
        )
    return False


def _out_of_files(why: BaseException) -> bool:
    """Whether ``why`` comes of this process having as many files open as it may: no
    damage for `verify` to look for."""
    cause = why.__cause__
    return isinstance(cause, OSError) and cause.errno in OUT_OF_FILES


def _drifted(self: CachedRows, was: str | None) -> None:
    if self._drift_warned:
        return
    self._drift_warned = True
    warnings.warn(
        f"rows of `{type(self.module).__name__}` recalled from the store were kept by "
        f"another version of its code ({was}, now {self._fingerprint}); they are used, "
        "since the key (class, structure, weights) is the same. Pass strict=True to "
        "compute them again instead",
        Drifted,
        stacklevel=outside_level(),
    )


def _recall_held(
    self: CachedRows, x: torch.Tensor | DeferredRows, index: torch.Tensor | None
) -> torch.Tensor:
    """:func:`_recall_or_run` with the module held frozen for the call, once it was handed
    back (:meth:`CachedRows._frozen_for_call`): holding it digests its weights, which is
    kept out of compiled code with the lookup. First, :attr:`CachedRows.runs_uncached` is
    asked whether the module runs uncached from here on (and answers with the module
    itself, then), out of compiled code too: what it asks is the model's, not the batch's."""
    uncached = self.runs_uncached
    if uncached is not None and uncached(self):
        return self._uncached(x)
    if transforming():  # a batch made outside it: the transform makes it its own as it is read
        raise in_a_transform(
            f"`{type(self.module).__name__}` is cached per row and",
            "the batch",
            "call the module itself",
        )
    if jit_tracing():
        raise traced(self, JIT_TRACE)
    if not self._handed_back:  # as a rule: nothing to hold, and no context made per batch
        return _recall_or_run(self, x, index)
    with self._frozen_for_call():
        return _recall_or_run(self, x, index)


def traced(self: CachedRows, tracer: str) -> TypeError:
    """The refusal of a call of the cache that ``tracer`` records
    (:func:`~somatize_torch._errors.traced_by`)."""
    return traced_by(
        tracer,
        f"`{type(self.module).__name__}` is cached per row and",
        "the module itself (`cached.module`) in the cache's place",
    )


_remember: Callable[..., Any] = outside_compiled(_recall_held)
"""The lookup runs outside any compiled region: a graph break at the cached module, so
``torch.compile`` compiles what is around it (the head) once."""


def _layout_of(x: torch.Tensor | DeferredRows) -> tuple[int, ...] | None:
    """The order of the dims of batch ``x`` in memory (:func:`batch_order`; None: C order,
    or rows that are loaded only when computed)."""
    order = batch_order(x) if isinstance(x, torch.Tensor) else None
    return tuple(order) if order is not None else None


def _assemble(
    pieces: list[tuple[list[int] | None, torch.Tensor]],
    count: int,
    device: torch.device,
    orders: dict[tuple[torch.Size, torch.dtype], list[int] | None],
) -> torch.Tensor:
    """The rows of ``pieces`` put back in batch order on ``device``, laid out in memory as
    the module lays out rows of their shape and dtype (``orders``, from the rows it
    computed or the store kept): a conv reading a recalled channels_last batch then takes
    the path it takes for a computed one, and answers the same bits."""
    first = pieces[0][1]
    shape = first.shape[1:]
    if len(pieces) == 1 and pieces[0][0] is None:
        rows = first.to(device) if first.device != device else first
        # Computed, the module's own; recalled, as the module lays them out.
        known = (shape, first.dtype) in orders
        return laid_out(rows, orders[(shape, first.dtype)]) if known else rows
    order = orders.get((shape, first.dtype))
    out = empty_rows((count, *shape), order, first.dtype, device)
    for at, rows in pieces:
        if rows.shape[1:] != first.shape[1:] or rows.dtype != first.dtype:
            raise NotRowwise(
                f"rows of one batch came back as {rows.dtype} {list(rows.shape[1:])} and as "
                f"{first.dtype} {list(first.shape[1:])}: a module cached per row must answer "
                "every row with the same dtype and shape"
            )
        assert at is not None
        as_bits(out).index_copy_(0, torch.tensor(at, device=device), as_bits(rows.to(device)))
    return out
