"""A Lightning callback that caches frozen submodules of a ``LightningModule`` across epochs.

A linear probe, an adapter or a head on a frozen backbone recomputes the same
backbone features every epoch. :class:`CacheFrozen` makes that one line::

    trainer = Trainer(callbacks=[CacheFrozen("features/", ["encoder"])])

In ``setup()`` — before ``configure_optimizers``, before the strategy moves or
wraps the model, and before any compiled module first runs — it replaces each
named submodule by the same module cached one row at a time
(:func:`somatize_torch.rows.cache_rows`): frozen (weights and buffers digested,
``requires_grad_(False)``, held in eval), each row of a batch keyed by the
digest of its content (or by its sample index), recalled from the nearest copy
(device memory, host memory, the store) or computed with the rows that are
missing. Nothing is traced, so the LightningModule as a whole need not be
fx-traceable; the lookup runs outside any compiled region, so a model (or a
head) compiled with ``torch.compile`` compiles around it.

Why it is shaped this way:

- **It works on the module's own objects.** The cached wrapper registers the
  module's parameters, buffers and children under their own names, so the
  LightningModule's ``state_dict`` is what it was: a checkpoint written while
  the callback is active loads into the plain model, and resuming from one
  works. The cache is not in the checkpoint; the store is.
- **It hands the model back as it found it**: when a stage ends (or fails) each
  module is put back in every place it sat, in the mode and with the
  ``requires_grad`` it had (or in the mode asked of it meanwhile), so the model a
  trainer hands back is the plain model — traced, exported, saved or fitted again
  without the callback as if it had never been cached. The callback keeps its
  caches, and a later stage of the same model puts them back in place, memory tiers
  and all; called on its own meanwhile, a cache holds its module frozen only for the
  call, and leaves it as it was.
- **Every stage uses it**: train, validation, test and predict run the same
  cached module. Shuffling does not defeat it (rows, not batches, are keys);
  random augmentations do, since each epoch's inputs differ — the callback sees
  a training epoch after the first with no hit at all and warns once
  (:class:`NeverHits`), saying why.
- **It counts per stage and per epoch**: hit rate, rows computed and recalled,
  bytes kept and time spent in lookups go to the trainer's logger at the end of
  each epoch (``cache/<module>/hit_rate``, ``cache/<module>/val_hit_rate``, …),
  the running hit rate to the progress bar, and every epoch's figures to
  :attr:`CacheFrozen.history`.
- **Precision is part of the key**: under ``precision="bf16-mixed"`` or
  ``"16-mixed"`` the encoder runs under autocast, and the autocast dtype is in
  every row's key, so a bf16 answer is never recalled for an fp32 question.
- **The next batch is named while the step runs**: with content keys on the
  CPU, the callback hands the training and validation loaders to
  :class:`somatize_torch.ahead.Ahead` from their second epoch on (Lightning has
  made the first epoch's iterator by the time a callback can act), so the rows of
  batch ``k + 1`` are hashed on another core while step ``k`` runs, and the
  step's lookup is a dict pass and a gather. The second epoch is fetched in
  order, watching whether the loader draws random numbers in this process: only
  one that draws none is fetched ahead, from the third epoch, since an early
  fetch would move its draws before the step's own and the run would differ from
  one without the callback. ``ahead=False`` turns it off; a loader that keeps its
  own position (one with ``state_dict``) is left as it is, since fetching ahead
  would put its position one batch off.
- **A module unfrozen by a fine-tuning schedule trains uncached**: a cached
  module runs without gradients; one whose parameters come to require grad — at
  an epoch's start or at any batch — is put back as it was before it next runs,
  with a warning (:class:`Uncached`), and trains exactly as without the callback.
  One replaced in the model by another module runs uncached for the rest of the
  stage, with the same warning.
  A named module whose parameters require grad when it is cached is frozen with
  a warning (:class:`FrozeTrainable`) — in a LightningModule with a ``setup()`` of its
  own, once that has run, since it may freeze the module there — and naming everything
  the fit would train is refused; under a fine-tuning callback, one it leaves to train (or in train
  mode) is left uncached, with a warning (:class:`Uncached`).
- **A module that would run in train mode runs so, uncached**: a cached module
  runs in eval, so one its model would run in train mode (frozen by
  ``requires_grad_(False)`` alone, never put in eval) with parts that compute
  otherwise there — BatchNorm on batch statistics, dropout drawing — is put back
  as it was when a forward finds so, after the LightningModule's own hooks have
  asked their modes, and answers that very batch uncached, with a warning
  (:class:`Uncached`). One with no such part is cached whatever its mode.
- **A module whose input trains runs uncached**: one handed a batch that requires
  grad (a trainable adapter, learned normalization or embedding upstream of it in
  the LightningModule) or carries a forward-mode tangent could not be recalled — a
  recalled row is a leaf, and the part upstream would stop training on hits — so
  it answers that batch itself, the gradient flowing upstream as without the
  callback, and runs uncached for the rest of the stage, with a warning
  (:class:`Uncached`). ``cache_rows`` on its own refuses such a batch
  (:class:`~somatize_torch.CachedInputNeedsGrad`).
- **Ranks share one store**: under DDP each rank computes and keeps its own rows
  (a store's writes are atomic and idempotent, so two ranks keeping one row is
  harmless), and at the end of each epoch every rank flushes its writes and
  waits for the others, so the next epoch's shuffle — which hands a rank rows
  another rank computed — finds them in the store. A cached module is digested at
  its first call of each epoch there, after DDP's forward wrote rank 0's buffers
  into the others' (where no version counter moves).

The callback's parts are modules of their own, their names re-exported here: what
it is given, checked (:mod:`somatize_torch._lightning_options`); finding, checking,
caching in place and putting back the named submodules
(:mod:`somatize_torch._lightning_modules`), naming the next batch ahead
(:mod:`somatize_torch._lightning_ahead`), prefill
(:mod:`somatize_torch._lightning_prefill`), what is counted and where it goes
(:mod:`somatize_torch._lightning_stats`), and the errors and warnings
(:mod:`somatize_torch._lightning_errors`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from somatize import Store
from somatize_torch._prefill import check_callable, check_flag, check_loader
from somatize_torch.ahead import Ahead
from somatize_torch.freeze import refuse_tied
from somatize_torch.rows import DEVICE_BYTES, HOST_BYTES, CachedRows, RowStats, check_options
from somatize_torch.writer import WaitsForItself

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.trainer.states import TrainerStatus
except ImportError:  # pragma: no cover - the message is the point
    raise ImportError(
        "somatize.torch.lightning needs Lightning, which is not installed: "
        "`pip install 'somatize[lightning]'` (or `pip install 'lightning>=2.2'`)"
    ) from None

# The parts import Lightning themselves: after the message above, which says how to get it.
from somatize_torch._lightning_ahead import fetch_ahead
from somatize_torch._lightning_errors import (
    CacheFrozenError,
    CompiledSubmodule,
    FrozeTrainable,
    NeverHits,
    NotASubmodule,
    Uncached,
)
from somatize_torch._lightning_modules import (
    Found,
    after_own_setup,
    cache_in_place,
    cached_elsewhere,
    check_trainable,
    find,
    fixed_by_wrap,
    freeze_first,
    handed_grad,
    left_in_train_mode,
    locate,
    nested,
    nothing_left,
    own_cache_put_back,
    own_setup_restored,
    pass_through,
    put_back_all,
    replaced,
    twins,
    uncache,
    waiting_with,
    waits_for_own_setup,
)
from somatize_torch._lightning_options import (
    check_flags,
    module_names,
    one_set_a_step,
    prefill_keyed_as,
    prefill_module,
    writable_store,
)
from somatize_torch._lightning_prefill import (
    PrefillJob,
    dev_run_batches,
    forward_context,
    generators_kept,
    run_prefill,
    runs_no_batch,
)
from somatize_torch._lightning_stats import (
    EpochStats,
    Stage,
    grown,
    log_epoch,
    never_called,
    never_hit,
    plus,
    show_hit_rate,
    since,
)

__all__ = [
    "CacheFrozen",
    "CacheFrozenError",
    "CompiledSubmodule",
    "EpochStats",
    "FrozeTrainable",
    "NeverHits",
    "NotASubmodule",
    "Uncached",
]


class CacheFrozen(Callback):
    """Caches the frozen submodules ``modules`` of a LightningModule across epochs.

    ``store`` is where answers are kept: a :class:`somatize.Store`, a directory, or a
    bucket URL (``s3://bucket/prefix``; ``Store.on_bucket`` for options), or None for
    memory only (the process's own epochs hit; nothing outlives it). ``modules`` are
    dotted names of submodules (``"encoder"``, ``"backbone.trunk"``). ``key``,
    ``version``, ``salt``, ``device_bytes``, ``host_bytes`` and ``strict`` go to
    :func:`somatize_torch.rows.cache_rows` for each of them; with ``key="index"`` the
    LightningModule calls the cached module as ``self.encoder(x, index=idx)``, or, with
    loaders over :class:`~somatize_torch.deferred.Deferred` datasets (each with its own
    ``version``), as ``self.encoder(x)`` with the batch's ``DeferredRows``: then only
    the images of rows computed are ever loaded.
    ``progress_bar`` shows the running hit rate in the progress bar as ``hit``
    (refreshed every few batches, and only when the trainer has a progress bar).
    ``ahead`` names each training and validation batch's rows on another thread
    while the step before runs (content keys, on the CPU).
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str] | None,
        modules: Sequence[str] | str,
        *,
        key: Literal["content", "index"] = "content",
        version: str | None = None,
        salt: str | None = None,
        device_bytes: int = DEVICE_BYTES,
        host_bytes: int = HOST_BYTES,
        strict: bool = False,
        progress_bar: bool = True,
        ahead: bool = True,
    ) -> None:
        names = module_names(modules)
        # Refused here, not when the trainer first calls `setup()`, possibly hours later.
        check_options(key, version, salt, device_bytes, host_bytes, strict)
        check_flags(progress_bar, ahead)
        self.store: Store | None = writable_store(store)
        self.names = names
        self._state_key = f"CacheFrozen{names}"
        self.key: Literal["content", "index"] = key
        self.version = version
        self.salt = salt
        self.device_bytes = device_bytes
        self.host_bytes = host_bytes
        self.strict = strict
        self.progress_bar = progress_bar
        self.ahead = ahead
        self.history: list[EpochStats] = []
        self._cached: dict[str, CachedRows] = {}  # kept between stages of one model
        self._found: dict[str, Found] = {}  # how each was found, while it is in place
        self._aliases: dict[str, str] = {}  # a name of a module named before: that name
        self._uncached: set[str] = set()  # put back uncached, for the model it holds now
        self._owner: pl.LightningModule | None = None
        self._started: dict[str, float] = {}
        # What each module counted in a stage's epoch under way before its counts now (a
        # training epoch's, before a validation inside it).
        self._parts: dict[Stage, dict[str, RowStats]] = {}
        # Where in the history the last epoch's records are, while rows are keyed as its stage.
        self._ended: dict[str, int] = {}
        self._train_epochs = 0
        self._warned = False
        # The first training epoch, once it ended, until the callback has said whether it
        # called each module: after the LightningModule's own epoch-end hook, which may.
        self._unasked: int | None = None
        # Each cache's count of rows keyed anew when the last training epoch ended.
        self._keyed_anew: dict[str, int] = {}
        self._prefills: list[PrefillJob] = []
        self._looked = True  # whether the stage under way looked at the modules again
        # What rows are keyed and counted as: stage (None between stages), loader.
        self._stage: tuple[Stage | None, int] = (None, 0)
        self._aheads: weakref.WeakSet[Ahead[Any]] = weakref.WeakSet()  # loaders put behind it
        self._passes: dict[int, RemovableHandle] = {}  # uncached modules loading Deferred rows
        # The trainer whose stage holds the caches in place, until the stage ends.
        self._holder: weakref.ref[pl.Trainer] | None = None

    # -- copies

    def __getstate__(self) -> dict[str, Any]:
        """What a copy of it in another process is made from (``strategy="ddp_spawn"``
        pickles the trainer, its callbacks with it, to each rank): the loaders it put
        behind :class:`~somatize_torch.ahead.Ahead`, which it holds weakly, as a list."""
        state = dict(self.__dict__)
        state["_aheads"] = list(self._aheads)
        state["_holder"] = None  # a trainer of this process: nothing a copy holds
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        aheads = state.pop("_aheads")
        self.__dict__.update(state)
        self._aheads = weakref.WeakSet(aheads)

    # -- what it holds

    @property
    def cached(self) -> dict[str, CachedRows]:
        """The cached modules by name, once ``setup`` has made them: in the model while a
        stage runs, and kept by the callback between stages (the model holds its plain
        modules then). Called between stages, a cache answers as its module frozen in eval
        would, as the module is at that call, and leaves the plain module as it was (mode,
        ``requires_grad``): it holds it frozen for the call only
        (:meth:`CachedRows.hand_back`)."""
        return dict(self._cached)

    @property
    def state_key(self) -> str:
        return self._state_key  # Lightning asks at every hook of every batch

    def prefill(
        self,
        dataloader: Iterable[Any],
        *,
        module: str | None = None,
        inputs: Callable[[Any], Any] | None = None,
        progress: bool = True,
        stage: str = "train",
        dataloader_idx: int = 0,
    ) -> None:
        """Runs ``dataloader`` through the cached ``module`` when fitting starts (after
        the model is on its device, in the trainer's precision, before the first epoch)
        and flushes, so epoch 1 recalls too. ``inputs`` turns one loader item into what
        the module is handed (by default a tensor item, a tuple's first item, a dict's
        ``x``); keyed by index, it returns ``(batch, indices)`` unless the item is a dict
        with an ``index`` or a batch from ``Deferred`` (an ``(x, y)`` item's labels are no
        indices, and are refused). ``module`` is needed only when the callback caches
        more than one.
        Keyed by index under the callback's ``version``, the rows are those of the
        training loader's samples; ``stage`` and ``dataloader_idx`` name another loader
        the prefill stands for (``stage="validate"`` for the first validation loader),
        whose sample 0 is not the training loader's.
        Under DDP each rank runs its share of the batches. ``progress`` shows a bar
        (on rank 0)."""
        # Refused when asked, not once fitting starts (nor let through under DDP, where
        # each rank's share of the loader is a generator of its items).
        check_loader(dataloader, "cache.prefill(dataloader)")
        check_callable(inputs, "inputs", "`lambda item: item[0]`")
        check_flag(progress, "progress")
        module = prefill_module(self.names, module)
        keyed_as = prefill_keyed_as(stage, dataloader_idx)
        self._prefills.append(PrefillJob(dataloader, module, inputs, progress, keyed_as))

    # -- setting up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Puts the cached modules in place of the named submodules, each found as it is
        now; :meth:`teardown` puts them back. The same model again (fit, then test, then
        fit) gets the same caches, memory tiers and all."""
        listed = sum(callback is self for callback in getattr(trainer, "callbacks", ()))
        if listed > 1:
            # Lightning would run every hook of it that many times: each epoch counted
            # again, with no rows, and its caches put in place over themselves.
            raise CacheFrozenError(
                f"this CacheFrozen is listed {listed} times in the trainer's callbacks: "
                "list it once (`callbacks=[cache]`); to cache other modules, name them all "
                "in it, or give another CacheFrozen for them"
            )
        holder = self._held_by_another(trainer)
        if holder is not None:
            raise CacheFrozenError(
                f"this CacheFrozen is running another trainer's stage (`{holder}`, still "
                "under way), whose model holds its caches in place: a trainer run inside "
                "it (in one of its hooks) cannot be given the same callback. Give that "
                "trainer a CacheFrozen of its own — on the same store, to share the rows "
                "kept — or run it after the other's stage ends"
            )
        self._holder = weakref.ref(trainer)
        if self._owner is not pl_module:
            put_back_all(self, failed=True)  # nothing, unless a stage of the last model never ended
            self._cached = {}
            self._uncached = set()
            self._owner = pl_module
        self._aliases = {}
        freeze_first(trainer, self, pl_module)  # a fine-tuning callback listed after this one
        todo: list[tuple[str, nn.Module, str, nn.Module]] = []
        for name in self.names:
            if name in self._uncached:
                # Unfrozen by a schedule in an earlier fit: it trains, uncached.
                with contextlib.suppress(NotASubmodule):
                    pass_through(self, locate(pl_module, name)[2])
                continue
            parent, attribute, found = find(pl_module, name)
            if isinstance(found, CachedRows):
                # Ours if still in place (a stage that ended without its teardown).
                ours = next((n for n, c in self._cached.items() if c is found), None)
                if ours is None:
                    raise cached_elsewhere(name)
                if found.when_unfrozen != self._unfrozen:
                    raise own_cache_put_back(name, ours)  # by hand, between stages
                if ours != name:
                    self._aliases[name] = ours
                continue
            refused = fixed_by_wrap(pl_module, name, found)
            if refused is not None:
                raise refused
            named = next((n for n, _, _, m in todo if m is found), None)
            if named is not None:
                self._aliases[name] = named  # one module under two names: one cache
                continue
            todo.append((name, parent, attribute, found))
        refused = self._refused(pl_module, [(name, found) for name, _, _, found in todo])
        if refused is not None:
            raise refused
        # One requiring grad is looked at once the LightningModule's own `setup()` has run,
        # which may freeze it, and so is one sharing a part with it; the tie of one it leaves
        # to train is refused when fitting starts.
        waiting = waiting_with(
            todo, [one for one in todo if waits_for_own_setup(trainer, pl_module, one[3])]
        )
        todo = [one for one in todo if all(one is not other for other in waiting)]
        self._cache(trainer, pl_module, stage, todo)  # warns at what called this hook
        # What is not in place this stage (left uncached) is not kept for a later one.
        kept = {name for name, _, _, _ in waiting} | set(self._found)
        self._cached = {n: c for n, c in self._cached.items() if n in kept}
        if waiting:
            after_own_setup(
                pl_module,
                self,
                functools.partial(self._cache_found_again, trainer, pl_module, stage, waiting),
            )

    def _refused(
        self, pl_module: pl.LightningModule, todo: list[tuple[str, nn.Module]]
    ) -> CacheFrozenError | None:
        """The refusal of the modules ``todo`` (each with its name), one inside another
        (:func:`nested`), or, keyed by index, two copies of one encoder (:func:`twins`)."""
        refused = nested(pl_module, todo)
        if refused is None and self.key == "index":
            refused = twins(todo)
        return refused

    def _cache_found_again(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        stage: str,
        waiting: list[tuple[str, nn.Module, str, nn.Module]],
    ) -> None:
        """Caches the modules ``waiting`` once the LightningModule's own ``setup()`` has run,
        each found again by its name, as at setup: another CacheFrozen waiting beside this
        one may have cached it first (refused, as one cached elsewhere is, rather than cached
        again inside that cache), and that ``setup()`` may have put another module in its
        place, the one the fit runs."""
        todo: list[tuple[str, nn.Module, str, nn.Module]] = []
        for name, _, _, _ in waiting:
            parent, attribute, found = find(pl_module, name)
            if isinstance(found, CachedRows):
                if all(found is not cached for cached in self._cached.values()):
                    raise cached_elsewhere(name)
                continue  # ours already (the LightningModule put it there again)
            refused = fixed_by_wrap(pl_module, name, found)
            if refused is not None:
                raise refused
            todo.append((name, parent, attribute, found))
        refused = self._refused(pl_module, [(name, found) for name, _, _, found in todo])
        if refused is not None:
            raise refused
        self._cache(trainer, pl_module, stage, todo)

    def _cache(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        stage: str,
        todo: list[tuple[str, nn.Module, str, nn.Module]],
    ) -> None:
        """Caches the modules ``todo`` (each with its name, parent and attribute) in place,
        each as it is now, but those :func:`check_trainable` leaves uncached. Each is found
        (:meth:`Found.at`) before any is frozen: two of them may share a part (a stem),
        which freezing the first would put in eval and stop training before the second
        is looked at, and the second would be put back, and run, as so."""
        left = check_trainable(trainer, pl_module, stage, todo)
        if stage == "fit":  # nothing trains in validate, test or predict
            caching = [name for name, _, _, _ in todo if name not in left] + list(self._found)
            refuse_tied(pl_module, caching, CacheFrozenError)
        found_as = {
            name: Found.at(pl_module, module, fitting=stage == "fit")
            for name, _, _, module in todo
            if name not in left
        }
        for name, _, _, module in todo:
            if name in left:
                pass_through(self, module)
            else:
                cache_in_place(self, name, module, found_as[name])

    def _held_by_another(self, trainer: pl.Trainer) -> str | None:
        """The stage (``fit``, …) of a trainer other than ``trainer`` whose stage, still
        under way, holds this callback's caches in place; None where there is none."""
        holder = self._holder() if self._holder is not None else None
        if holder is None or holder is trainer or holder.state.status != TrainerStatus.RUNNING:
            return None
        return str(holder.state.fn.value if holder.state.fn is not None else "a stage")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_epochs = 0
        self._unasked = None
        refused = nothing_left(pl_module, self._found)  # a head made in `configure_model()`
        if refused is not None:
            raise refused
        # A head made since `setup()` (in `configure_model()`, or the LightningModule's own
        # `setup()`, which Lightning runs after the callbacks') may share a cached weight:
        # the first hook after both that a callback gets. One the cache froze is one the
        # head would train without it.
        froze = {id(p) for f in self._found.values() for p, was, _ in f.as_found.grads if was}
        refuse_tied(pl_module, list(self._found), CacheFrozenError, froze=froze)
        if not self._prefills or runs_no_batch(trainer):
            return  # a fit training no batch leaves the prefill to the next fit
        self._key_as("prefill")  # an earlier stage (validate, test) may have keyed its own
        # What the prefill draws (a DataLoader's seed, a Dataset's augmentation) is not the
        # fit's: the fit draws what it would without the callback.
        with generators_kept(pl_module.device), forward_context(trainer), torch.no_grad():
            for named in self._prefills:
                # A module held under two names is counted under the first, as it is
                # in the stages.
                job = replace(named, module=self._aliases.get(named.module, named.module))
                cached = self._cached.get(job.module)
                if cached is None:
                    continue  # left uncached (a fine-tuning callback trains it), as warned
                version = self._version_as(*job.keyed_as)
                if version is not None:
                    cached.version = version
                try:
                    self.history.append(run_prefill(trainer, pl_module, cached, job))
                finally:
                    self._key_as("prefill")
        if dev_run_batches(trainer) is None:
            self._prefills = []  # a smoke test's few batches leave them for the real fit
        self._flush(trainer)

    # -- counting, per stage

    def _begin(self, stage: str) -> None:
        self._started[stage] = time.perf_counter()

    def _end(self, trainer: pl.Trainer, stage: Stage) -> None:
        self._count_down()
        seconds = since(self._started.pop(stage, time.perf_counter()))
        parts = self._parts.pop(stage, {})
        self._ended = {}
        for name in self._cached:
            self._ended[name] = len(self.history)
            rows = parts.get(name, RowStats())
            self.history.append(EpochStats(stage, trainer.current_epoch, name, seconds, rows))

    def _count_down(self) -> None:
        """What each cached module counted until now, taken from it and counted as the
        stage its rows are keyed as: into that stage's epoch under way; into its epoch that
        ended last, while rows are still keyed as its stage (the LightningModule's own
        end hooks run after this callback's: a k-NN monitor taking the features of its bank
        there); or as nobody's (the sanity check's, or a call between stages)."""
        stage = self._stage[0]
        if stage in self._started or self._ended:
            for cached in self._cached.values():
                cached.flush()  # so the bytes the stage kept are counted as its own
        counted = {name: cached.reset_stats() for name, cached in self._cached.items()}
        if stage in self._started:
            parts = self._parts.setdefault(stage, {})
            for name, rows in counted.items():
                parts[name] = plus(parts[name], rows) if name in parts else rows
            return
        for name, at in self._ended.items():
            if name in counted:
                record = self.history[at]
                self.history[at] = replace(record, rows=plus(record.rows, counted[name]))

    def _fresh(self, stage: Stage) -> None:
        """At an epoch's start: the counts of the epoch before set down (:meth:`_count_down`),
        rows keyed by the callback's ``version`` keyed as the stage's (a validation sample 0
        is not a training sample 0), and the modules looked at again at the stage's first
        batch. What was counted since rows were keyed as the stage's (the LightningModule's
        own ``on_validation_start``) is the epoch's."""
        if self._stage[0] == stage and self._ended:
            self._count_down()
        self._key_as(stage)
        self._ended = {}
        self._parts.pop(stage, None)
        self._looked = False

    def _key_as(self, stage: Stage | None, loader: int = 0) -> None:
        """Rows keyed by the callback's ``version`` keyed as those of loader ``loader`` of
        ``stage``: the training data's own version (between stages too), ``version|validate``
        for the first validation loader, ``version|validate|1`` for the second (its sample 0
        is not the first one's), and so on. Rows are counted as the stage they are keyed as:
        what was counted under another stage is set down as that stage's first."""
        if stage != self._stage[0]:
            self._count_down()
            self._ended = {}
        self._stage = (stage, loader)
        version = self._version_as(stage, loader)
        if version is not None:
            for cached in self._cached.values():
                cached.version = version

    def _version_as(self, stage: Stage | None, loader: int) -> str | None:
        """The version rows of loader ``loader`` of ``stage`` are keyed under by index (see
        :meth:`_key_as`); None where rows are not keyed by the callback's version."""
        if self.key != "index" or self.version is None:
            return None
        if stage in (None, "train", "prefill"):
            return self.version
        return self.version + f"|{stage}" + (f"|{loader}" if loader else "")

    def _look(self, pl_module: pl.LightningModule) -> None:
        """At a stage's first batch — after every epoch-start hook has run, the
        LightningModule's own and other callbacks' (a fine-tuning schedule's) — a module
        somebody replaced or unfroze is put back uncached, and each cached one is looked
        at again: its settings and state (one changed since keys its rows anew, see
        :meth:`CachedRows.redeclare`), and the store for samples of Deferred datasets other
        ranks answered."""
        self._looked = True
        for name, cached in list(self._cached.items()):
            if replaced(self, pl_module, name, cached):
                continue
            if any(p.requires_grad for p in cached.module.parameters()):
                uncache(self, pl_module, name, cached)
                continue
            # Digested again at every stage's first batch, validation's inside a training
            # epoch too, and training's again after it: an epoch-start or -end hook may write
            # weights through `.data` (another model's for evaluation, then the training
            # weights back), which no watch sees; it costs one pass over the weights (a
            # fraction of a millisecond for a small encoder, ~15 ms for 45 MB). Under DDP
            # the forward hands every rank rank 0's buffers as it begins, written where no
            # version counter moves: the digest is taken at the module's next call instead,
            # after they came, so buffers rank 0 alone changed key every rank's rows.
            ranks = pl_module.trainer.world_size > 1
            cached.redeclare(digest=not ranks)
            if ranks:
                cached.digest_at_next_call()
            cached.look_up_answered()

    def _unfrozen(self, cached: CachedRows) -> bool:
        """Told by a cached module's forward that it found the module unfrozen (a schedule
        that unfreezes by step, or in a hook that runs after this callback's): it is put
        back uncached there and then, and the forward answers with the module itself.
        False for a cache this callback no longer holds (it went on to another model):
        the forward refuses it, as a cache of its own would."""
        owner = self._owner
        name = next((n for n, c in self._cached.items() if c is cached), None)
        if owner is None or name is None:
            return False
        uncache(self, owner, name, cached)
        return True

    def _runs_uncached(self, cached: CachedRows) -> bool:
        """Asked by a cached module's forward before it keys a row — after every hook has
        asked its modes (``self.encoder.eval()`` in the LightningModule's
        ``on_train_batch_start``, which runs after this callback's) — whether the module
        would run in train mode without the cache, with parts that compute otherwise there
        (BatchNorm, dropout): it is then put back uncached there and then, in that mode
        (:func:`left_in_train_mode`), and the forward answers with the module itself, so
        that not even that batch is answered in eval. Not while prefilling, which runs in
        eval before any hook of the fit could put it there; nor for a module unfrozen too,
        which the forward puts back itself (:meth:`_unfrozen`), saying so.
        While the trainer runs its loops without this callback (:meth:`_unheard`), the
        forward answers with the module itself too, the cache left in place for the
        batches after them."""
        name = next((n for n, c in self._cached.items() if c is cached), None)
        found = self._found.get(name) if name is not None else None
        if found is None or name is None or self._stage[0] == "prefill":
            return False
        parts = found.in_train_mode(cached.training)
        if parts and not any(p.requires_grad for p in cached.module.parameters()):
            left_in_train_mode(self, name, cached, parts)
            return True
        return self._unheard()

    def _unheard(self) -> bool:
        """Whether the trainer whose stage holds the caches in place runs its loops without
        this callback among its own: a tuner's trials (``Tuner.lr_find`` and
        ``scale_batch_size``, or the ``LearningRateFinder`` and ``BatchSizeFinder``
        callbacks) hand it callbacks of their own while they run. None of this callback's
        hooks runs there: what rows are keyed as (a validation's samples are not the
        training samples of the same indices), and the module looked at again at each
        stage's first batch, would be the last stage's."""
        holder = self._holder() if self._holder is not None else None
        return holder is not None and all(c is not self for c in getattr(holder, "callbacks", ()))

    def _input_needs_grad(self, cached: CachedRows, cut: str) -> bool:
        """Told by a cached module's forward that it is handed a batch whose derivatives
        its recalled rows would cut (``cut``: it requires grad, a trainable part upstream,
        or carries a forward-mode tangent): it is put back uncached there and then, for the
        rest of the stage (:func:`handed_grad`), and the forward answers with the module
        itself, the gradient flowing upstream as without the callback. One unfrozen too
        is put back as such (:meth:`_unfrozen`), saying so. False for a cache this
        callback no longer holds: the forward refuses the batch, as a cache of its own
        would."""
        name = next((n for n, c in self._cached.items() if c is cached), None)
        if name is None or name not in self._found:
            return False
        if any(p.requires_grad for p in cached.module.parameters()):
            return self._unfrozen(cached)
        handed_grad(self, name, cached, cut)
        return True

    def _first_batch(self, pl_module: pl.LightningModule) -> None:
        if not self._looked:
            self._look(pl_module)

    def _first_loader(self) -> None:
        """Rows keyed as the first loader's again when an evaluation epoch ends, for the
        LightningModule's own end hooks (run after this callback's), as its own start hooks
        were handed them: not as those of the loader that ran last, whose sample 0 is
        another one."""
        stage, loader = self._stage
        if loader:
            self._key_as(stage)

    def _training_again(self) -> None:
        """Rows keyed as the training data's again, once an evaluation inside the fit (the
        sanity check, a validation in or after an epoch) is over. Not at the evaluation's
        epoch-end hook: Lightning runs the LightningModule's own after this callback's, and
        one that calls the encoder there (features of the validation set for a k-NN
        monitor) is still handed validation samples; so is its ``on_validation_end``. This
        callback's next training hook runs before the LightningModule's."""
        if self._stage[0] != "train":
            self._key_as("train")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training_again()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if "train" not in self._started:
            # An epoch resumed from a checkpoint written inside it (or at its last batch:
            # the epoch after it too) gets no epoch-start hook from Lightning; this
            # callback's own is run here, at its first batch, so the epoch is counted,
            # its modules looked at, and its loaders checked, as any other's.
            self.on_train_epoch_start(trainer, pl_module)
        self._training_again()
        self._first_batch(pl_module)

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        stage, loader = self._stage
        if dataloader_idx != loader:
            self._key_as(stage, dataloader_idx)
        self._first_batch(pl_module)

    on_test_batch_start = on_validation_batch_start
    on_predict_batch_start = on_validation_batch_start

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._one_set_a_step(trainer.fit_loop, "train")
        self._fresh("train")
        self._say_never_called(trainer, pl_module)
        self._fetch_ahead(pl_module, trainer.fit_loop)
        self._begin("train")

    def _fetch_ahead(self, pl_module: pl.LightningModule, loop: Any) -> None:
        """Puts ``loop``'s loaders behind :func:`~somatize_torch.ahead.ahead`, for the
        iterators Lightning makes from its next run on."""
        caches = [c for c in self._cached.values() if c.key_mode == "content"]
        if self.ahead:
            fetch_ahead(loop, caches, pl_module.device, self._aheads)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.progress_bar:
            show_hit_rate(trainer, pl_module, batch_idx, self._cached, self._parts.get("train", {}))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Keyed as this stage's from its first hook: the LightningModule's own runs next,
        # before any epoch starts (a k-NN monitor taking the features of its bank there).
        self._key_as("validate")
        self._evaluation_began()

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._key_as("test")
        self._evaluation_began()

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._key_as("predict")
        self._evaluation_began()

    def _evaluation_began(self) -> None:
        """Lightning has just taken every module's training flag and asked ``eval()``, and
        sets the flags back directly when the evaluation ends, undoing the modes asked
        meanwhile (``norm.eval()`` in ``on_validation_epoch_start``): each cache undoes
        them too, from that ``eval()`` on, whatever ``eval()`` is asked until then."""
        for cached in self._cached.values():
            cached.evaluation_began()

    def _one_set_a_step(self, loop: Any, stage: Stage) -> None:
        """Refuses loaders of ``stage`` whose rows, keyed by index under the callback's
        version, one step would take for one another's (:func:`one_set_a_step`)."""
        if self.key == "index" and self.version is not None and self._cached:
            one_set_a_step(loop, self.version, stage)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fitting = trainer.state.fn == "fit"
        loop = trainer.fit_loop.epoch_loop.val_loop if fitting else trainer.validate_loop
        self._one_set_a_step(loop, "validate")
        self._fresh("validate")
        if not trainer.sanity_checking:
            self._fetch_ahead(pl_module, loop)
        self._begin("validate")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_loader()
        # Rows stay keyed as this stage's until the training epoch goes on
        # (:meth:`_training_again`) or the stage is over (:meth:`teardown`): the
        # LightningModule's own epoch-end hook runs next, on validation samples.
        if "train" in self._started and not trainer.sanity_checking:
            # Validation inside a training epoch: its end hooks may put the training weights
            # back through `.data` (as weight-averaging callbacks do), which no watch sees;
            # the modules are looked at again at the next training batch, or the rest of the
            # epoch would be keyed as the evaluation weights.
            self._looked = False
        if trainer.sanity_checking:
            self._started.pop("validate", None)
            for cached in self._cached.values():
                # Written first: a row the writer keeps after the counts are set down (as
                # nobody's) would be counted as kept by training epoch 0.
                cached.flush()
            self._count_down()
            return
        self._flush(trainer)
        self._end(trainer, "validate")
        log_epoch(pl_module, trainer, "validate", self._last("validate"))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training_again()  # after a validation at the epoch's end
        self._flush(trainer)
        self._end(trainer, "train")
        log_epoch(pl_module, trainer, "train", self._last("train"))
        self._train_epochs += 1
        keyed = {name: cached.keyed_anew for name, cached in self._cached.items()}
        changed = grown(self._keyed_anew, keyed)
        self._keyed_anew = keyed
        if self._train_epochs == 1:
            # Said at the next epoch's start, or the fit's end: the LightningModule's own
            # epoch-end hook runs after this one, and may call the module (a k-NN bank).
            self._unasked = trainer.current_epoch
        if self._train_epochs >= 2 and not self._warned:
            never = never_hit(trainer, self._last("train"), changed)
            if never is not None:
                self._warned = True
                warnings.warn(never, NeverHits, stacklevel=2)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._unasked is not None:
            self._count_down()  # what the LightningModule's own epoch-end hook counted
            self._say_never_called(trainer, pl_module)

    def _say_never_called(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Warns (:class:`Uncached`) of each module the first training epoch, its own
        end hooks and every evaluation before it never called, once its counts are down."""
        epoch, self._unasked = self._unasked, None
        if epoch is None:
            return
        idle = never_called(trainer, pl_module, epoch, self.history, self._cached)
        if idle is not None:
            warnings.warn(idle, Uncached, stacklevel=3)

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._one_set_a_step(trainer.test_loop, "test")
        self._fresh("test")
        self._begin("test")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_loader()
        # Keyed as the test's until teardown, as validation's are.
        self._flush(trainer)
        self._end(trainer, "test")
        log_epoch(pl_module, trainer, "test", self._last("test"))

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fresh("predict")
        self._begin("predict")

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_loader()
        self._flush(trainer)
        self._end(trainer, "predict")  # Lightning logs nothing while predicting

    def _last(self, stage: Stage) -> list[EpochStats]:
        count = len(self._cached)
        return [e for e in self.history if e.stage == stage][-count:] if count else []

    # -- keeping

    def _flush(self, trainer: pl.Trainer) -> None:
        """Every rank's computed rows into the store, and (under DDP) every rank waits for
        the others, so the next epoch finds what any rank computed."""
        for cached in self._cached.values():
            cached.flush()
        if trainer.world_size > 1 and self.store is not None:
            trainer.strategy.barrier("somatize-flush")

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for cached in self._cached.values():
            # A checkpoint's run can be resumed from the store. One saved by a signal handler
            # inside a call into the store (a cluster's requeue signal) cannot wait for the
            # writer, which needs that call's lock: it is saved without, as the rows go on
            # being written, and a resume computes again any that never were.
            with contextlib.suppress(WaitsForItself):
                cached.flush()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Flushes, and puts back each module as :meth:`setup` found it (mode and
        ``requires_grad`` included): the model the trainer hands back is the plain model.
        The caches are kept, memory tiers and all, for the next stage of the same model."""
        if self._held_by_another(trainer) is not None:
            return  # refused at setup: the stage under way is another's
        self._holder = None
        own_setup_restored(pl_module)  # a stage whose LightningModule's `setup()` never ran
        self._key_as(None)  # the stage's own version, and its counts, end with it
        put_back_all(self, failed=False)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """A stage that failed (or was interrupted) gets no teardown from Lightning: the
        modules are put back here, and what could not be written is left (the error that
        ended the stage is the one raised)."""
        if self._held_by_another(trainer) is not None:
            return  # refused at setup (a trainer inside another's stage): that one goes on
        self._holder = None
        # What the failed stage counted is nobody's, and not flushed: a write may be what failed.
        self._started, self._ended = {}, {}
        own_setup_restored(pl_module)  # failed before the LightningModule's `setup()` ran
        self._key_as(None)
        put_back_all(self, failed=True)
