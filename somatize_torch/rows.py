"""Per-sample caching: one key per row of a batch, so a shuffled epoch still hits.

Training a head on a frozen encoder shuffles its data: batch ``k`` of epoch 2
holds other samples than batch ``k`` of epoch 1, so a cache keyed per batch
never hits. :func:`cache_rows` keys each *row*::

    key(row) = H(identity, declaration, state, salt, key of the row)

the key of a row being the digest of its content or, with ``key="index"``, the
sample's index in a dataset of a given version (how each part is made, and why,
is :mod:`somatize_torch._row_keys`). Keyed by index, a batch from
:class:`~somatize_torch.deferred.Deferred` needs no input for the rows
it recalls: inputs come with the samples only until a cache has answered them,
and the cache loads itself only those it must compute and did not get.

A forward takes a batch and nothing else (:mod:`somatize_torch._row_calls`). It
looks its rows up nearest first — the device tier, the host tier, then the store —
and runs the module only on the rows found nowhere
(:mod:`somatize_torch._row_lookup`); where a keying first computes rows, it checks
that the module answers each row alone as it did in the batch, and refuses one
that does not, and at every run one that writes into the rows it is handed
(:mod:`somatize_torch._rowwise`). Keyed by content, a batch's rows can be named on
another thread before its forward (:meth:`CachedRows.name_ahead`,
:mod:`somatize_torch._row_ahead`). What it did is counted in rows
(:class:`RowStats`); :func:`prefill` fills a cache before training starts; the
settings it takes are checked when it is made (:func:`check_options`,
:mod:`somatize_torch._row_options`).

Gradients downstream are exactly as without caching: the module is frozen, so
its output never required grad, and an input that requires grad is refused
(a recalled row is a leaf; whatever produced the input would train on misses
and silently stop on hits) where gradients are recorded: under ``torch.no_grad()``
it is taken, unless the module turns them on inside its forward
(:func:`~somatize_torch._rowwise._check_records_none`); so is one carrying a
forward-mode tangent. Where :attr:`CachedRows.when_input_needs_grad` is set
(``CacheFrozen`` sets it), such a batch is told to it instead, to put the module back
uncached, and the forward answers with the module itself.

The module is settled by :func:`somatize.torch.freeze` when it is wrapped
(weights digested, ``requires_grad_(False)``, held in eval). Its weights are
watched: a change in place (``load_state_dict``, an optimizer step on a
parameter somebody unfroze) is seen by the tensors' version counters, a tensor
or submodule replaced (a checkpoint loaded by assignment, ``encoder[0] = conv``)
by identity, and the state is digested again before the next row is keyed, so
no answer computed with other weights is recalled. A conversion asked of a cache
(``cached.half()``), carried out by the module in place, is seen by every cache at
its next call, another cache of the same module too (``_row_keys._LAST_CONVERSION``).
The inner module converted in place itself is seen by its first and last floating tensors'
memory (:meth:`~somatize_torch._state.StateWatch.ends_moved`). What none of these sees —
a tensor swapped or written through ``p.data``, a part converted on its own, a fused
optimizer kernel's write — is seen at :meth:`CachedRows.redeclare`, which
looks at the tensors' memory and digests the state again (``CacheFrozen`` calls
it at every epoch's first batch). A module whose parameters come to require grad
(somebody unfroze it to train it) is refused (:class:`Unfrozen`): a cached module
runs without gradients — or, where :attr:`CachedRows.when_unfrozen` is set
(``CacheFrozen`` sets it), handed to it to be put back uncached, the forward
answering with the module itself. The wrapper holds the module's own registries of
parameters, buffers and children (the same dicts), so ``state_dict()`` keys are
the module's, a checkpoint loads into the unwrapped module, and a submodule put
into the module after it was wrapped is saved, loaded and converted through the
wrapper too. A copy (``copy.deepcopy``: an EMA or SWA model) or a pickle
(``torch.save`` of a model holding it) caches a copy of the module the same way
into the same store, with memory tiers of its own; a copy of a cache handed back
(:meth:`CachedRows.hand_back`) is handed back too, its module left as the copied model
has it. Rows computed under
``torch.inference_mode`` are kept like any others.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from somatize import Graph, Store
from somatize._threads import ProcessLock
from somatize.catalog import fingerprint_of
from somatize_torch._errors import EXPORT, CachedInputNeedsGrad, exporting, gradient_cut
from somatize_torch._modes import marked_as_needed, outside_compiled
from somatize_torch._prefill import batch_at as batch_at
from somatize_torch._prefill import prefill
from somatize_torch._row_ahead import _name_ahead
from somatize_torch._row_calls import _check_call, _defaults_left_out, _named_batch, _run
from somatize_torch._row_errors import NeedsIndex, NotRowwise, RowsError
from somatize_torch._row_keys import (
    _LAST_CONVERSION,
    KeyMode,
    _deferred_row,
    _drop_keyings,
    _Keying,
    _keying,
    _KeyRoom,
    _redeclared,
    _row_ids,
    _settle,
    _share_registries,
    _version_moved,
    code_watch,
    converted,
)
from somatize_torch._row_lookup import _remember, traced
from somatize_torch._row_options import DEVICE_BYTES as DEVICE_BYTES
from somatize_torch._row_options import HOST_BYTES as HOST_BYTES
from somatize_torch._row_options import check_options
from somatize_torch._row_stats import _COUNTED, RowStats, Written, _reset_stats, _stats_of
from somatize_torch._settings import its_own, its_own_held, stand_in_call
from somatize_torch._state import StateWatch
from somatize_torch.deferred import DeferredRows
from somatize_torch.digest import RowsLater
from somatize_torch.freeze import (
    AskedSoFar,
    ModuleNode,
    Unfrozen,
    classes_of,
    freeze,
    held_while,
    hold,
    is_held,
    refuse_scripted,
)
from somatize_torch.residency import Tier
from somatize_torch.writer import Writer, reading

__all__ = [
    "CachedContainer",
    "CachedRows",
    "NeedsIndex",
    "NotRowwise",
    "RowStats",
    "RowsError",
    "Unfrozen",
    "cache_rows",
    "check_options",
    "never_called",
    "prefill",
]


class CachedRows(nn.Module):
    """A frozen module whose answers are cached one row at a time; see the module docstring.

    Call it as the module: ``cached(x)`` (``key="content"``) or ``cached(x, index=idx)``
    (``key="index"``, ``idx`` the samples' indices in the dataset ``version`` names).
    ``tiers`` are the memory tiers, nearest first; ``store`` is where answers are
    kept (None: memory only); ``stats`` counts what happened.
    """

    module: nn.Module
    store: Store | None
    _dataset_version: str | None

    def __init__(
        self,
        module: nn.Module,
        store: Store | None,
        *,
        key: KeyMode = "content",
        version: str | None = None,
        salt: str | None = None,
        device_bytes: int = DEVICE_BYTES,
        host_bytes: int = HOST_BYTES,
        strict: bool = False,
    ) -> None:
        super().__init__()
        # Before its tables are shared: a TorchScript module keeps none of its own.
        refuse_scripted(type(module).__name__, module)
        # The mode asked of the wrapper is recorded (the module is held in eval), from the
        # module's own: what it is put back in once it is no longer cached.
        self.training = module.training
        check_options(key, version, salt, device_bytes, host_bytes, strict)
        _share_registries(self, module)  # the module's own dicts of parts, not copies
        self._version = module._version  # what a checkpoint records for the module's layout
        self._key_mode: KeyMode = key
        # The one Deferred without a version of its own whose rows are keyed under
        # `version` (by its name), if any.
        self._lent_to: dict[str, str] = {}  # the cache's versions, each by the Deferred lent it
        # The Deferreds that came with a version of their own, by it: none may be one the
        # cache lent its version to.
        self._claimed: dict[str, set[str]] = {}
        # The version of the cache's the rows of each such Deferred, by its name and
        # generation, were first keyed under (`_row_keys.given_holds`).
        self._keyed_as: dict[tuple[str, int | None], str] = {}
        self._dataset_version = None
        self.version = version
        self._salt = salt
        self.strict = strict
        self.store = store
        self.tiers = [Tier("device", "cpu", device_bytes), Tier("host", "cpu", host_bytes)]
        # Held while the tiers are looked up, admitted to or emptied, and while the counts
        # move: one cache may be called from several threads at once. A forked child gets
        # it unheld; a forward run by code a collection runs inside it is refused.
        self._tiers_lock = ProcessLock()
        # Held while rows' keyings are looked over, dropped or made (`_row_keys`): a thread
        # making one while another drops or looks them over would change what it iterates,
        # and each writes the declaration a key prefix is derived from.
        self._keying_lock = ProcessLock()
        self._placed = False
        self._node = ModuleNode(module)
        self._node._keys_precision = False  # rows are keyed by the precision they run in
        self._node.named(type(module).__name__).frozen()
        # The last conversion asked of any row cache, as the state is digested after it
        # (`_row_keys._settle`: one made since is looked for in the tensors' memory).
        self._conversion = _LAST_CONVERSION[0]
        self._state = freeze(Graph.somatize(self._node))[self._node._smz.name or ""]
        self._identity = self._node._smz.identity
        self._watch: StateWatch | None = self._node._watch  # taken as `freeze` digested it
        # The tables of attributes of the module's parts as listed under that watch, whose
        # training flags a forward looks at, and of what each part stands for, looked
        # through for the generators they hold (`_rowwise._listed`).
        self._parts: tuple[StateWatch | None, list[dict[str, Any]], list[dict[str, Any]]] | None = (
            None
        )
        # The module's floating dtypes (by how many elements each holds), for the watch.
        self._floats: tuple[StateWatch | None, dict[torch.dtype, int]] = (None, {})
        self._keyings: dict[
            tuple[str, str | None, torch.Size, str | None, str | None, str | None], _Keying
        ] = {}
        self._key_room = _KeyRoom()  # how many more store keys they may remember
        # The memory tiers' name for each of the last keyings made here, so a keying made
        # again (a setting changed and changed back) finds the rows it kept in memory
        # (`_row_keys._tag_of`); and how many names were handed out.
        self._tags: dict[tuple[bytes, tuple[Any, ...]], int] = {}
        self._tags_made = 0
        self._orders: dict[
            tuple[int, ...] | None, dict[tuple[torch.Size, torch.dtype], list[int] | None]
        ] = {}
        """Per order of the dims of the input in memory, then per shape and dtype of a row,
        the order of the dims in memory of the batches the module answered (None: C
        order): a batch recalled is laid out so too."""
        self._classes = classes_of(module)
        # What the fingerprint is worked out from, taken first: a method set on a class
        # since is refused where rows are keyed (`_row_keys._keying`).
        self._code = code_watch(self._classes, module)
        self._fingerprint = fingerprint_of(*self._classes)
        self._writer = Writer(store, self._fingerprint) if store is not None else None
        # What a forward holds while it asks the store (`writer.reading`).
        self._lock = reading(store) if store is not None else None
        self._drift_warned = False
        self._unread_warned = False  # a store read that failed is warned of once
        # The Deferreds (by name) and versions whose batches came under a version they no
        # longer hold, warned of once each (`_row_lookup._answer_outdated`).
        self._outdated_warned: set[tuple[str, str | None]] = set()
        # How many times rows were keyed anew since the module was cached: its state or its
        # declaration changed (weights loaded, a setting written), so no row kept before
        # is recalled after.
        self.keyed_anew = 0
        self._counts = dict.fromkeys(_COUNTED, 0.0)
        self._kept_base: Written = (0, 0, 0, 0.0)
        # Whether the last forward recalled nothing: then a batch on a CUDA device is run
        # before its rows' names come back from it (`_row_lookup._queue_names`).
        self._cold = False
        # Batches whose rows were named ahead of their forward (see `name_ahead`), by id.
        self._named: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Any, ...], RowsLater]]
        self._named = {}
        self._named_lock = ProcessLock()  # a forked DataLoader worker gets it unheld
        # Deferred datasets whose answered samples were looked up in the store, per keying.
        self._seeded: set[tuple[str, int]] = set()
        self._seeders: list[threading.Thread] = []
        # Told (with this cache) when a forward finds the module unfrozen: if it answers
        # True it has put the module back uncached, and the forward answers with the
        # module itself instead of refusing it (`Unfrozen`). ``CacheFrozen`` sets it.
        self.when_unfrozen: Callable[[CachedRows], bool] | None = None
        # Asked (with this cache) at each lookup, before any row is keyed, whether the
        # module is to run uncached from here on: if it answers True it has put the module
        # back, and the forward answers with the module itself. ``CacheFrozen`` sets it, for
        # a module its model would run in train mode, where it answers otherwise.
        self.runs_uncached: Callable[[CachedRows], bool] | None = None
        # Told (with this cache, and what of the batch's derivatives a recalled row would
        # cut, as `gradient_cut` says it) when a forward is handed a batch it would refuse
        # for that (`CachedInputNeedsGrad`: a trainable part upstream): if it answers True
        # it has put the module back uncached, and the forward answers with the module
        # itself, the gradient or tangent flowing. ``CacheFrozen`` sets it.
        self.when_input_needs_grad: Callable[[CachedRows, str], bool] | None = None
        # Whether the module is its model's again (see `hand_back`), until `freeze_again`.
        self._handed_back = False
        # Held by a call that holds the module frozen for itself once it is handed back: a
        # second thread's call would find it held, and, ending last, leave it so.
        self._held_for_call = ProcessLock()
        # Whether `freeze_again` was asked inside the call that holds it, on its thread: made
        # once that call has put the module back as it found it.
        self._freeze_after_call = False
        # The modes asked of the module and its parts as they stood when `eval()` was last
        # asked of this cache: until `train()` is asked, the flag set back directly (as
        # Lightning sets each module's back after an evaluation) undoes those asked since.
        self._asked_at_eval: AskedSoFar | None = None
        # Whether the `eval()` last asked began an evaluation (see `evaluation_began`).
        self._evaluating = False
        self.named_ahead = 0  # batches named ahead, and how many of them a forward used
        self.used_ahead = 0
        self.last_input: weakref.ref[torch.Tensor] | None = None
        # Last: from here on, a setting of the module's own is written to the module (see
        # `__setattr__`), and the wrapper's own attributes above are all in place.
        object.__setattr__(self, "module", module)

    # -- the module it stands for: only the call is cached

    def __getattr__(self, name: str) -> Any:
        """What the module holds beside its tensors and children — a plain value
        (``encoder.out_dim``), a method (``encoder.features(x)``) — read from the module
        itself. Only calling the wrapper is cached: a method called this way runs the
        module, uncached (frozen and in eval all the same)."""
        try:
            return super().__getattr__(name)  # parameters, buffers, children: the module's
        except AttributeError:
            module = self.__dict__.get("module")
            if module is None:
                raise
            return getattr(module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """A value the module holds itself (``encoder.gain = 2.0``), or its class holds as a
        default or a property, is written to the module, where its forward reads it (and
        where the key sees it), not beside it on the wrapper, where reading it back would
        show a value the forward never uses. The module and the store themselves are the
        cache's, fixed when it is made (:func:`_replaced`)."""
        if name in _MADE_WITH and name in self.__dict__:
            _replaced(name)
        if name == "training":
            self._set_back()
        module = self.__dict__.get("module")
        if module is not None and its_own(self, module, name):
            setattr(module, name, value)
            return
        super().__setattr__(name, value)

    def _set_back(self) -> None:
        """The training flag set directly (not by :meth:`train`) after an ``eval()``:
        Lightning, at the end of an evaluation, setting each module's flag back to what it
        was before its ``eval()`` — so the modes asked of the module's parts since are
        undone, as they would be on the module uncached."""
        asked = self.__dict__.get("_asked_at_eval")
        if asked is not None:
            asked.undo()
            self._asked_at_eval, self._evaluating = None, False

    def __delattr__(self, name: str) -> None:
        """A value the module holds itself is deleted from the module, as it is written
        there (:meth:`__setattr__`)."""
        if name in _MADE_WITH and name in self.__dict__:
            _replaced(name)
        module = self.__dict__.get("module")
        if module is not None and its_own_held(self, module, name):
            delattr(module, name)
            return
        super().__delattr__(name)

    # -- how rows are keyed: fixed when the cache is made

    @property
    def key_mode(self) -> KeyMode:
        """How rows are named: ``"content"`` (the digest of each row) or ``"index"``."""
        return self._key_mode

    @key_mode.setter
    def key_mode(self, value: Any) -> None:
        _fixed("key_mode", "key", value)

    @property
    def version(self) -> str | None:
        """The dataset version rows are keyed under by index (``key="index"``). It may be
        written (a stage's own data: the callback keys validation rows apart), and rows are
        keyed under the new one from the next call; it is checked as ``version=`` is."""
        return self._dataset_version

    @version.setter
    def version(self, value: Any) -> None:
        check_options(self._key_mode, value, None, 0, 0, False)
        was, self._dataset_version = self._dataset_version, value
        if value != was:
            _version_moved(self, was)

    @property
    def salt(self) -> str | None:
        """The caller's salt, part of every row's key."""
        return self._salt

    @salt.setter
    def salt(self, value: Any) -> None:
        _fixed("salt", "salt", value)

    # -- the state it is frozen at

    @property
    def state(self) -> str:
        """The digest of the module's weights and buffers its keys are built on."""
        with self._frozen_for_call():
            _settle(self)
        return self._state

    def redeclare(self, *, digest: bool = True) -> bool:
        """Looks again at the plain values and functions the module keeps beside its
        weights and at its forward hooks (:func:`~somatize_torch._settings.settings_of`,
        :func:`~somatize_torch._settings.hooks_of`), and (unless ``digest=False``) digests
        its weights and buffers again — at every forward both are watched (a value given
        or a hook registered, a weight changed in place, a tensor or submodule replaced:
        :class:`~somatize_torch._settings.SettingsWatch`,
        :class:`~somatize_torch._state.StateWatch`), and this also sees what is not
        watched (a write into ``p.data``, an attribute of an object that is no config):
        if one changed since rows were keyed, rows
        are keyed anew from the next forward, and nothing kept under the old values is
        recalled for them. Returns whether one changed. ``CacheFrozen`` calls it at the
        first batch of every stage's epoch."""
        with self._frozen_for_call():
            settled = _settle(self, again=digest, thorough=True)
            return _redeclared(self) if settled is None else settled

    # -- keys

    def name_ahead(self, x: torch.Tensor) -> bool:
        """Starts naming the rows of ``x`` by content on another thread and returns at
        once, so that a forward on this same tensor finds them named (waiting for the
        rest, if any); returns whether it started.

        For a loop that fetches the next batch before it runs the current step
        (:func:`somatize_torch.ahead.ahead`): naming is most of what a content-keyed
        recall costs on a CPU, and this way it overlaps the step
        (:func:`~somatize_torch.digest.raw_rows_later`). A forward uses the names only
        if ``x`` is the very tensor named and unchanged since — same version counter
        (which every change in place through torch bumps), memory, layout and dtype —
        and names the rows itself otherwise, or if naming failed. A write that moves no
        version counter (into ``x.data``, through ``x.numpy()`` or DLPack) after naming
        is not seen, and the forward takes the names of what ``x`` held before: write
        before naming, or into a ``clone()``. Nothing is named for
        an index-keyed cache, for a batch that requires grad or is not on the CPU, for a
        host batch once the cache runs on a device, for a batch the forward refuses (a
        nested tensor, a subclass of ``torch.Tensor``) or cannot read (its storage freed),
        or for an inference tensor (one made under ``torch.inference_mode``): it has no
        version counter, so a change in place could not be told from no change."""
        return _name_ahead(self, x)

    def row_keys(
        self, x: torch.Tensor | DeferredRows, index: torch.Tensor | None = None
    ) -> list[str]:
        """The store key of each row of ``x`` as this module, in its precision now, answers it."""
        with self._frozen_for_call():
            keying, _ = _keying(self, x)
            return [keying.key(row) for row in _row_ids(self, x, index)]

    # -- forward

    def _call_impl(self, *args: Any, **kwargs: Any) -> Any:
        # Stands for the module it runs: torch's global hooks run with that one.
        if exporting():  # before the calls kept out of compiled code, which export cannot make
            raise traced(self, EXPORT)
        return marked_as_needed(stand_in_call)(self, args, kwargs, RowsError)

    def forward(
        self,
        x: torch.Tensor | DeferredRows | None = None,
        *beside: Any,
        index: torch.Tensor | None = None,
        **more: Any,
    ) -> torch.Tensor:
        """The module's output on ``x``, row by row from the nearest copy; see the class.

        ``index`` is keyword-only: a second positional argument (``encoder(x, mask)``) is
        one the module would take, and is refused as every other argument is, but None
        where the forward defaults to None (the call without it). The batch may go by the
        name the module's forward gives it (``cached(input_ids=ids)``)."""
        if x is None and more:
            x, more = _named_batch(self, more)
        beside, more = _defaults_left_out(self.module, beside, more)
        try:
            _check_call(self, x, beside, index, more)
        except CachedInputNeedsGrad:
            assert isinstance(x, torch.Tensor)  # the last refusal: a batch tensor, all else taken
            if not self._put_back_for(gradient_cut(x)):
                raise
            return self._uncached(x)
        assert x is not None  # refused there, as no batch tensor
        if isinstance(x, nn.Parameter):
            # A parameter handed on: keyed and run as its values (still requiring grad for
            # a trainable one, taken where no gradient is recorded, and looked at as such).
            x = x.detach().requires_grad_(x.requires_grad)
        try:
            out: torch.Tensor = marked_as_needed(_remember)(self, x, index)
        except Unfrozen:
            handler = self.when_unfrozen
            if handler is None or not handler(self):
                raise
            return self._uncached(x)
        return out

    def _put_back_for(self, cut: str) -> bool:
        """Whether :attr:`when_input_needs_grad`, told that a batch's ``cut`` (what of its
        derivatives a recalled row would not carry) has the batch refused, put the module
        back uncached instead, to answer it itself."""
        handler = self.when_input_needs_grad
        # Told outside compiled code: a compiled forward refuses the batch as it is traced,
        # and what the handler changes of the model (the module put back in its place) is
        # no code to compile.
        return handler is not None and bool(marked_as_needed(_told)(handler, self, cut))

    def _uncached(self, x: torch.Tensor | DeferredRows) -> torch.Tensor:
        """The module's own answer on ``x``, once :attr:`when_unfrozen`,
        :attr:`runs_uncached` or :attr:`when_input_needs_grad` has put it back uncached:
        run as without a cache, in the caller's grad mode and the module's own mode, so
        that it trains or runs as without a cache from this very batch."""
        if isinstance(x, DeferredRows):
            dtype = _deferred_row(self, x)[0]
            loaded = x.load()
            x = loaded if loaded.dtype == dtype else loaded.to(dtype)
        out: torch.Tensor = _run(self.module, x)
        return out

    def digest_at_next_call(self) -> None:
        """Has the next forward digest the weights and buffers again before it keys a row,
        whatever torch noted of them: ``CacheFrozen`` calls it at a stage's first batch
        under DDP, whose forward writes rank 0's buffers into every other rank's as it
        begins without moving their version counters, after that batch's hooks ran."""
        self._watch = None

    def look_up_answered(self) -> None:
        """Has the next batch of each :class:`~somatize_torch.deferred.Deferred` look the
        store up again for samples answered elsewhere (another process, another rank)
        since, so their inputs stop coming with the samples. ``CacheFrozen`` calls it at
        the start of every epoch; a dataset whose samples are all answered costs
        nothing."""
        self._seeded.clear()

    # -- what it did

    @property
    def stats(self) -> RowStats:
        """What this cache did since it was made (or since :meth:`reset_stats`)."""
        return _stats_of(self)

    def reset_stats(self) -> RowStats:
        """Starts counting afresh (per epoch, say); returns what was counted until now, once
        the rows computed until now are written (or failed): they are counted kept here."""
        return _reset_stats(self)

    def freeze_again(self) -> None:
        """Freezes the module again once it was let go (put back in a model as it was, then
        handed to this cache once more): no gradients, held in eval, and its state digested
        again before the next row is keyed, so a change made meanwhile (it trained) keys
        rows anew. The mode asked of the wrapper is the module's own again; the memory
        tiers keep what they held. A call of the cache handed back running on another
        thread is waited for: it puts the module back as it found it as it ends, which
        would undo this freeze; so is one running on this thread (code the module's forward
        runs asked it), which makes the freeze as it ends."""
        if self._held_for_call.held_here():
            self._freeze_after_call = True
            return
        with self._held_for_call:
            self._freeze()

    def _freeze(self) -> None:
        """:meth:`freeze_again`'s work, done holding ``_held_for_call``."""
        self._asked_at_eval, self._evaluating = None, False
        self.training = self.module.training
        hold(self.module)
        self._watch = None
        self._handed_back = False

    def hand_back(self) -> None:
        """Says that the module is its model's again: put back in place of this cache as it
        was (``CacheFrozen`` does so when a stage ends), not held in eval, perhaps in train
        mode and requiring grad. Until :meth:`freeze_again`, a call of this cache still
        answers as the frozen module in eval would, its state as it is now, but holds it
        so only while the call runs, and leaves it as it found it: mode, hold and
        ``requires_grad``."""
        self._handed_back = True

    @contextlib.contextmanager
    def _frozen_for_call(self) -> Iterator[None]:
        """Nothing to do while the cache holds its module. Once it is handed back, the
        module is held frozen for the call only (:func:`~somatize_torch.freeze.held_while`),
        by one call at a time, and looked at whole first, as at a stage's first batch
        (:meth:`redeclare`): between calls it is its model's, which may have trained it,
        written its weights through ``p.data`` or with a fused optimizer, or changed a
        setting it reads."""
        if not self._handed_back:
            yield
            return
        with self._held_for_call:
            try:
                with held_while(self.module):
                    _settle(self, again=True, thorough=True)
                    yield
            finally:
                if self._freeze_after_call:  # asked inside the call, now put back
                    self._freeze_after_call = False
                    self._freeze()

    def flush(self) -> None:
        """Waits until every computed row is in the store; :class:`WriteFailed` if some
        could not be written."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flushes and stops the background writer (a later forward that computes rows
        starts it again, so nothing computed after is left out of the store)."""
        if self._writer is not None:
            self._writer.close()

    def forget(self) -> None:
        """Lets go of the rows the memory tiers hold (up to their budgets: GiBs), the
        store keys remembered and the batches named ahead — for a cache no longer used.
        The store keeps what was written; a later forward finds rows there again."""
        with self._tiers_lock:
            for tier in self.tiers:
                tier.clear()
        _drop_keyings(self)
        with self._named_lock:
            self._named.clear()

    # -- nn.Module

    def train(self, mode: bool = True) -> CachedRows:
        """Records the mode; the frozen module stays in eval whatever is asked, and the ask
        is recorded by its hold too, in order with those of its parts
        (:class:`~somatize_torch.freeze.AsFound`). The modes asked are noted as they stand
        at an ``eval()`` (unless it is asked during an evaluation already under way), for
        the flag set back directly to undo those asked after (see :meth:`_set_back`)."""
        if mode:
            self._asked_at_eval, self._evaluating = None, False
        elif not self._evaluating:
            self._asked_at_eval = AskedSoFar.of(self.module) if is_held(self.module) else None
        object.__setattr__(self, "training", mode)  # asked, not set back
        if is_held(self.module):
            self.module.train(mode)
        return self

    def evaluation_began(self) -> None:
        """Says that the ``eval()`` last asked began an evaluation (Lightning's validation,
        test or predict): one asked during it (``self.eval()`` in a validation step) does
        not note the modes anew, so that setting the flag back when it ends undoes every
        mode asked since it began."""
        self._evaluating = self._asked_at_eval is not None

    # The registries are the module's own (see `__init__`), so what torch does to the
    # wrapper's own tensors is done by the module, as it would be unwrapped: its overrides
    # (a module that converts a tensor it keeps, one with extra state) take part.

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> CachedRows:
        self.module._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._watch = None  # a conversion: digest again
        converted()  # and every other cache over the module, or a part of it, looks
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The module's state dict, under its keys as they are now: a registry the module
        made anew since the last row (``del encoder[1]`` on the module itself) is taken up
        first, as the next forward would."""
        _share_registries(self, self.module)
        return super().state_dict(*args, **kwargs)

    def _save_to_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.module._save_to_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        _share_registries(self, self.module)  # its children are loaded next, by these keys
        self.module._load_from_state_dict(*args, **kwargs)

    # -- copies

    def _options(self) -> dict[str, Any]:
        return {
            "key": self.key_mode,
            "version": self.version,
            "salt": self.salt,
            "device_bytes": self.tiers[0].budget,
            "host_bytes": self.tiers[1].budget,
            "strict": self.strict,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (``torch.save`` of a model holding it) as its module, store and options:
        what it loads as caches the same way, with memory tiers of its own (and the
        writer of its store in the process it loads in), handed back if it was."""
        made = (self.module, self.store, self._options(), self.training, self._handed_back)
        return (_cached_again, made)

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedRows:
        """A copy (an EMA or SWA model's) caches a copy of the module in the same store, with
        memory tiers of its own, handed back if this is; the store's writer is shared
        (:class:`Writer`)."""
        module = copy.deepcopy(self.module, memo)
        copied = _cached_again(
            module, self.store, self._options(), self.training, self._handed_back
        )
        memo[id(self)] = copied
        return copied

    def extra_repr(self) -> str:
        tiers = ", ".join(repr(t) for t in self.tiers)
        key = (
            "content"
            if self.key_mode == "content"
            else f"index of {self.version or 'each Deferred'}"
        )
        return f"rows keyed by {key}; {tiers}; store={self.store!r}"


def _tell(handler: Callable[[CachedRows, str], bool], cached: CachedRows, cut: str) -> bool:
    return handler(cached, cut)


_told: Callable[..., Any] = outside_compiled(_tell)
""":attr:`CachedRows.when_input_needs_grad` called with a cache and what a batch's
recalled rows would cut, never compiled."""


def _fixed(name: str, option: str, value: Any) -> None:
    raise AttributeError(
        f"`{name}` of a row cache is fixed when it is made: rows already keyed, in memory "
        "and named ahead, are keyed under the one it was made with, so a new value would be "
        f"ignored by some and mixed with the old by others. Make a new cache for it: "
        f"`cache_rows(cached.module, cached.store, {option}={value!r}, ...)`"
    )


_MADE_WITH = ("module", "store")
"""What a cache is made of, which nothing replaces afterwards (:func:`_replaced`)."""


def _replaced(name: str) -> None:
    """Refuses to replace or remove the cache's ``module`` or ``store``: its keys, memory
    tiers, watch and background writer were made for the ones it was made with. A module
    assigned through ``nn.Module`` would become a child of the cached module (whose
    registries the cache holds), and a store would be read while rows went on being
    written to the other."""
    raise AttributeError(
        f"`{name}` of a row cache is fixed when it is made: its keys, memory tiers and "
        f"background writer are those of the {name} it was made with (a module assigned "
        "here would become a part of the cached module, a store would be read while rows "
        "are written to the other). Make a new cache for it: `cache_rows(module, store, "
        "...)`; `cached.flush()` the old one first if the two share a store"
    )


class CachedContainer(CachedRows):
    """A cached module that is also a container (``nn.Sequential``, ``nn.ModuleList``,
    ``nn.ModuleDict``, a class of one's own with ``__getitem__``): indexing, ``len``,
    iteration and ``in`` are the module's. What they hand out is the module's own parts,
    uncached (``cached[:-1]`` is the plain ``nn.Sequential`` of all but the last): only
    calling the wrapper is cached."""

    module: Any  # a container: indexed, measured and iterated as its class allows

    def __getitem__(self, index: Any) -> Any:
        return self.module[index]

    def __len__(self) -> int:
        return len(self.module)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.module)

    def __contains__(self, item: Any) -> bool:
        return item in self.module

    def __setitem__(self, index: Any, value: Any) -> None:
        """``cached[i] = part`` is ``module[i] = part``: a part put in is seen before the
        next row is keyed, as any submodule replaced is."""
        self.module[index] = value
        _share_registries(self, self.module)

    def __delitem__(self, index: Any) -> None:
        """``del cached[i]`` is ``del module[i]``, seen as :meth:`__setitem__` is."""
        del self.module[index]
        # `nn.Sequential` and `nn.ModuleList` renumber into a new dict of children.
        _share_registries(self, self.module)


_CONTAINER = ("__getitem__", "__len__", "__iter__")
"""What makes a module's class a container, whose cache is a :class:`CachedContainer`."""


def _cached_again(
    module: nn.Module,
    store: Store | None,
    options: dict[str, Any],
    training: bool,
    handed_back: bool = False,
) -> CachedRows:
    """A copy of a cache, over ``module`` (a copy of its module). One handed back leaves
    the module as it is: it is the copied model's, which may train it (copied with the
    cache, or pickled with it, as ``strategy="ddp_spawn"`` pickles the trainer with the
    model), so it is held frozen only while the cache is made."""
    if not handed_back:
        cached = cache_rows(module, store, **options)
    else:
        with held_while(module):
            cached = cache_rows(module, store, **options)
        cached.hand_back()
    cached.training = training
    return cached


def _refuse_caches_inside(module: nn.Module) -> None:
    """Refuses ``module`` holding a part cached per row: the part's cache, its counts with
    it, is part of what the module is, so a cache of the whole would key its rows by what
    moves at every call, and never recall them."""
    inner = next(
        (name for name, part in module.named_modules() if isinstance(part, CachedRows)), None
    )
    if inner is not None:
        raise RowsError(
            f"`{inner}` inside this `{type(module).__qualname__}` is cached per row already: "
            "a cache of the whole would key its rows by that cache too, whose counts change "
            "at every call, so it would never recall them. Cache one of the two: the part "
            "alone, or the whole with the part itself (its cache's `.module`) put back in "
            "place of its cache"
        )


def never_called(module: nn.Module) -> bool:
    """Whether ``module`` has no forward of its own (an ``nn.ModuleList``, an
    ``nn.ModuleDict``): only its parts are ever called, so a cache of it caches nothing.
    Looked up as the class holds it: a TorchScript module's ``forward`` is found on torch's
    C++ side only through the instance, which is refused as such (``refuse_scripted``)."""
    inherited = inspect.getattr_static(type(module), "forward", None)
    return inherited is nn.Module.forward and "forward" not in module.__dict__


def _refuse_never_called(module: nn.Module) -> None:
    """Refuses ``module`` with no forward of its own: its parts, iterated or indexed
    through a cache of it, would run uncached, and nothing would say so."""
    if never_called(module):
        raise RowsError(
            f"this `{type(module).__qualname__}` has no forward of its own: it is never "
            "called, only its parts are, and those run uncached, so a cache of it would "
            "cache nothing. Cache each part that is called instead, as "
            "`nn.ModuleList([cache_rows(part, store) for part in parts])`"
        )


def cache_rows(
    module: nn.Module,
    store: Store | str | os.PathLike[str] | None = None,
    *,
    key: KeyMode = "content",
    version: str | None = None,
    salt: str | None = None,
    device_bytes: int = DEVICE_BYTES,
    host_bytes: int = HOST_BYTES,
    strict: bool = False,
) -> CachedRows:
    """``module``, frozen and cached one row at a time; see the module docstring.

    ``key="content"`` (the default) names each row by the digest of its content;
    ``key="index"`` by its sample index within dataset ``version`` (call the result as
    ``cached(x, index=idx)``, or as ``cached(rows)`` with a batch of
    :class:`~somatize_torch.deferred.DeferredRows`, whose inputs it needs only for the
    rows it computes). ``device_bytes`` and ``host_bytes`` are the memory
    tiers' budgets; ``store`` a :class:`somatize.Store` or a directory (None: memory
    only); ``strict`` computes again rows that were kept by another version of the
    module's code instead of warning.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"cache_rows takes an nn.Module, got a `{type(module).__name__}`")
    if isinstance(module, CachedRows):
        raise RowsError("this module is already cached per row; cache the module inside once")
    _refuse_caches_inside(module)
    _refuse_never_called(module)
    container = any(hasattr(type(module), method) for method in _CONTAINER)
    kind = CachedContainer if container else CachedRows
    return kind(
        module,
        Store.of(store),
        key=key,
        version=version,
        salt=salt,
        device_bytes=device_bytes,
        host_bytes=host_bytes,
        strict=strict,
    )
