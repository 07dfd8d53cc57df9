"""Per-sample caching: one key per row of a batch, so a shuffled epoch still hits.

Training a head on a frozen encoder shuffles its data: batch ``k`` of epoch 2
holds other samples than batch ``k`` of epoch 1, so a cache keyed per batch
never hits. :func:`cache_rows` keys each *row*::

    key(row) = H(identity, declaration, state, salt, key of the row)

built with :func:`somatize.keys.node_prefix` and :func:`~somatize.keys.node_key`,
so it has the form of every other key: the **identity** is the module's class
(``package.module:Encoder``); the **declaration** is what :class:`ModuleNode`
declares for it (its structure as ``repr`` shows it) plus how it is called here
— how rows are keyed and the **precision** it runs under (the input's dtype and
the autocast dtype, since a bf16 answer is not an fp32 answer), and, keyed by
index, the shape of an input row (a content key holds it in each row's digest);
the **state** is the digest of its weights and buffers (:func:`digest_state`);
the **salt** is the caller's. The key of a row is, by default, the digest of its content
(:func:`digest_rows`, one call for the whole batch — any DataLoader, any
shuffling, no change to the dataset); or, with ``key="index"``, the sample's
index in a dataset of a given version (no hashing at all — the cheapest, and
right only as long as the version names the data exactly). Keyed by index, a
batch from :class:`~somatize_torch.deferred.Deferred` needs no input for the rows
it recalls: inputs come with the samples only until a cache has answered them,
and the cache loads itself only those it must compute and did not get.

A forward looks its rows up nearest first (:mod:`somatize_torch.residency`):
the device tier, the host tier, then the store — one dict pass and one gather
per tier that holds any — and runs the module only on the rows found nowhere,
as one sub-batch, in eval mode and without gradients, then puts the output back
together in the batch's order. The rows it computed go into the nearest memory
tier with room and, behind the step, into the store. Where a keying first
computes rows, the first and last of them are run again, each alone: a module
whose answer for a row depends on the other rows of its batch (attention along
dimension 0) is refused (:class:`NotRowwise`), since an answer kept from one
batch would be recalled in another.

Gradients downstream are exactly as without caching: the module is frozen, so
its output never required grad, and an input that requires grad is refused
(a recalled row is a leaf; whatever produced the input would train on misses
and silently stop on hits).

The module is settled by :func:`somatize.torch.freeze` when it is wrapped
(weights digested, ``requires_grad_(False)``, held in eval). Its weights are
watched: a change in place (``load_state_dict``, an optimizer step on a
parameter somebody unfroze) is seen by the tensors' version counters, a tensor
or submodule replaced (a checkpoint loaded by assignment, ``encoder[0] = conv``)
by identity, and the state is digested again before the next row is keyed, so
no answer computed with other weights is recalled. What neither sees — a tensor
swapped or written through ``p.data``, the inner module converted in place, a
fused optimizer kernel's write — is seen at :meth:`CachedRows.redeclare`, which
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
into the same store, with memory tiers of its own. Rows computed under
``torch.inference_mode`` are kept like any others.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable, Sized
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from somatize import Graph, Store
from somatize.catalog import fingerprint_of
from somatize.engine import Drifted
from somatize.errors import SomatizeError
from somatize.keys import node_key, node_prefix, root_key
from somatize.store.base import Corrupt, Missing
from somatize_torch._row_codec import decode_rows
from somatize_torch.codec import TENSOR, stamp_of
from somatize_torch.deferred import Deferred, DeferredRows
from somatize_torch.digest import (
    DTYPES,
    RowsLater,
    raw_rows,
    raw_rows_later,
    row_digest,
    row_header,
)
from somatize_torch.freeze import (
    ModuleNode,
    StateWatch,
    Unfrozen,
    check_still,
    digest_state,
    freeze,
    hold,
    unfrozen_error,
)
from somatize_torch.residency import Tier
from somatize_torch.wrap import CachedInputNeedsGrad
from somatize_torch.writer import Writer, store_lock

__all__ = [
    "CachedRows",
    "NeedsIndex",
    "NotRowwise",
    "RowStats",
    "RowsError",
    "Unfrozen",
    "cache_rows",
    "prefill",
]

log = logging.getLogger("somatize.torch")

KeyMode = Literal["content", "index"]

DEVICE_BYTES = 1 << 30
"""The device tier's default byte budget."""

HOST_BYTES = 4 << 30
"""The host tier's default byte budget."""


class RowsError(SomatizeError, ValueError):
    """A module cannot be cached per row as asked."""


class NotRowwise(RowsError, TypeError):
    """The module's output is not one row per input row."""


class NeedsIndex(RowsError):
    """An index-keyed cache was called without the samples' indices, or with bad ones."""


@dataclass(frozen=True)
class RowStats:
    """What a cached module did, counted in rows (cumulative until :meth:`CachedRows.reset_stats`).

    ``recalled`` = ``from_device + from_host + from_store``; ``hit_rate`` is
    ``recalled / rows``. ``bytes_kept`` and ``rows_kept`` count what the background
    writer has written to the store so far; ``lookup_s`` is the time spent keying rows
    and finding them (not computing them), ``compute_s`` the time the module ran.
    """

    batches: int = 0
    rows: int = 0
    computed: int = 0
    from_device: int = 0
    from_host: int = 0
    from_store: int = 0
    rows_kept: int = 0
    bytes_kept: int = 0
    rows_failed: int = 0
    lookup_s: float = 0.0
    compute_s: float = 0.0

    @property
    def recalled(self) -> int:
        return self.from_device + self.from_host + self.from_store

    @property
    def hit_rate(self) -> float:
        return self.recalled / self.rows if self.rows else 0.0

    def as_dict(self) -> dict[str, float]:
        """Every counter, plus ``recalled`` and ``hit_rate``, for a logger."""
        out: dict[str, float] = dict(asdict(self))
        out["recalled"] = self.recalled
        out["hit_rate"] = self.hit_rate
        return out


_REMEMBERED_KEYS = 1 << 20
"""How many store keys a keying remembers (about 200 MB at most)."""

_NAMED_AHEAD = 16
"""How many batches named ahead a cache holds for forwards to come (older ones are dropped)."""

_SEED_CHUNK = 4096
"""How many samples' keys one call to the store's ``have`` holds, looking for answered ones."""

_COUNTED = ("batches", "rows", "computed", "device", "host", "store", "lookup_s", "compute_s")


def _dtype_name(dtype: torch.dtype) -> str:
    return DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def _floating_dtypes(module: nn.Module) -> dict[torch.dtype, int]:
    """How many elements of each floating dtype a module's weights and buffers hold."""
    held: dict[torch.dtype, int] = {}
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            held[tensor.dtype] = held.get(tensor.dtype, 0) + tensor.numel()
    return held


class _Keying:
    """How rows are keyed under one state and precision.

    ``tag`` names this keying inside the process, so the memory tiers can key a row
    by ``(tag, raw digest or index)`` — a tuple, hashed in nanoseconds — and only rows
    that go to the store need their full key, ``key(row)``."""

    __slots__ = ("dtype", "header", "keys", "prefix", "rowwise", "tag", "version")

    def __init__(
        self, prefix: bytes, tag: int, version: str | None, header: bytes, dtype: torch.dtype
    ) -> None:
        self.dtype = dtype  # what the rows run in
        self.prefix = prefix
        self.tag = tag
        self.version = version
        self.header = header
        self.keys: dict[Any, str] = {}
        # Whether the module was seen to answer a row alone as it did in a batch (see
        # `CachedRows._check_rowwise`): looked at once per keying.
        self.rowwise = False

    def key(self, row: Any) -> str:
        """The store key of the row named ``row`` (the raw digest of its content, or its
        index); remembered, for up to :data:`_REMEMBERED_KEYS` rows, so a row read from
        the store every epoch is keyed once."""
        found = self.keys.get(row)
        if found is None:
            if isinstance(row, bytes):
                found = node_key(self.prefix, [row_digest(self.header, row)])
            else:
                found = node_key(self.prefix, [root_key({"dataset": self.version, "index": row})])
            if len(self.keys) < _REMEMBERED_KEYS:
                self.keys[row] = found
        return found


class CachedRows(nn.Module):
    """A frozen module whose answers are cached one row at a time; see the module docstring.

    Call it as the module: ``cached(x)`` (``key="content"``) or ``cached(x, index=idx)``
    (``key="index"``, ``idx`` the samples' indices in the dataset ``version`` names).
    ``tiers`` are the memory tiers, nearest first; ``store`` is where answers are
    kept (None: memory only); ``stats`` counts what happened.
    """

    module: nn.Module
    store: Store | None

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
        # The mode asked of the wrapper is recorded (the module is held in eval), from the
        # module's own: what it is put back in once it is no longer cached.
        self.training = module.training
        if key not in ("content", "index"):
            raise RowsError(
                f"key= is `content` (each row by the digest of its content) or `index` (each "
                f"row by its sample index in a dataset version), got {key!r}"
            )
        if key == "index" and version is not None and (not isinstance(version, str) or not version):
            raise NeedsIndex(
                "key='index' keys each row by its sample index, which names a row only within "
                f"one version of the dataset; version= is that version as a string (e.g. the "
                f"dataset's digest, 'sms/train@blake3:…'), got {version!r}"
            )
        if key == "content" and version is not None:
            raise RowsError(
                "version= is for key='index'; with key='content' each row is named by its own "
                "content, so there is no dataset version to give"
            )
        # The module's own registries of children, parameters and buffers — the very dicts,
        # not copies: `state_dict()` has the module's keys, and a conversion, a checkpoint
        # loaded or a submodule put in (`encoder[0] = conv`), through the wrapper or the
        # module, is one and the same change to both.
        for registry in ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set"):
            self.__dict__[registry] = module.__dict__[registry]
        self._version = module._version  # what a checkpoint records for the module's layout
        object.__setattr__(self, "module", module)
        self.key_mode: KeyMode = key
        self.version = version
        self.salt = salt
        self.strict = strict
        self.store = store
        self.tiers = [Tier("device", "cpu", device_bytes), Tier("host", "cpu", host_bytes)]
        self._placed = False
        self._node = ModuleNode(module)
        self._node.named(type(module).__name__).frozen()
        self._state = freeze(Graph.somatize(self._node))[self._node._smz.name or ""]
        self._identity = self._node._smz.identity
        self._watch: StateWatch | None = StateWatch(module)
        # The module's floating dtypes (by how many elements each holds), for the watch.
        self._floats: tuple[StateWatch | None, dict[torch.dtype, int]] = (None, {})
        self._keyings: dict[
            tuple[str, str | None, torch.Size, str | None, str | None, str | None], _Keying
        ] = {}
        # The memory tiers' name for each keying ever made here, so a keying made again
        # (a setting changed and changed back) finds the rows it kept in memory.
        self._tags: dict[tuple[bytes, tuple[Any, ...]], int] = {}
        self._fingerprint = fingerprint_of(type(module))
        self._writer = Writer(store, self._fingerprint) if store is not None else None
        self._lock = store_lock(store) if store is not None else None
        self._drift_warned = False
        self._counts = dict.fromkeys(_COUNTED, 0.0)
        self._kept_base = (0, 0, 0)
        # Batches whose rows were named ahead of their forward (see `name_ahead`), by id.
        self._named: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Any, ...], RowsLater]]
        self._named = {}
        self._named_lock = threading.Lock()
        # Deferred datasets whose answered samples were looked up in the store, per keying.
        self._seeded: set[tuple[str, int]] = set()
        # The one Deferred without a version of its own whose rows are keyed under
        # `version` (by its name), if any.
        self._lent_to: dict[str, str] = {}  # the cache's versions, each by the Deferred lent it
        self._seeders: list[threading.Thread] = []
        # Told (with this cache) when a forward finds the module unfrozen: if it answers
        # True it has put the module back uncached, and the forward answers with the
        # module itself instead of refusing it (`Unfrozen`). ``CacheFrozen`` sets it.
        self.when_unfrozen: Callable[[CachedRows], bool] | None = None
        self.named_ahead = 0  # batches named ahead, and how many of them a forward used
        self.used_ahead = 0
        self.last_input: weakref.ref[torch.Tensor] | None = None

    # -- the state it is frozen at

    @property
    def state(self) -> str:
        """The digest of the module's weights and buffers its keys are built on."""
        self._settle()
        return self._state

    def _settle(self, again: bool = False, thorough: bool = False) -> bool | None:
        """Digests the state again if any weight, buffer or submodule changed or was
        replaced (see :class:`~somatize_torch.freeze.StateWatch`), or if ``again``; a new
        state keys every row anew, and so does a new declaration under the same state (a
        part without weights replaced: `encoder.act = nn.Tanh()`). Returns None when
        nothing was looked at, else whether rows are keyed anew."""
        watch = self._watch
        if not again and watch is not None and not watch.changed(thorough):
            return None
        # With no watch (a conversion dropped it) every parameter is looked at: one made to
        # require grad before the conversion is unfrozen all the same.
        unfrozen = (
            watch.unfrozen(self.module)
            if watch is not None
            else [n for n, p in self.module.named_parameters() if p.requires_grad]
        )
        if unfrozen:
            raise unfrozen_error(self.module, unfrozen)
        hold(self.module)  # a submodule put in since is held in eval too
        state = digest_state(self.module)
        self._watch = StateWatch(self.module)
        if state != self._state:
            self._state = state
            self._node._smz.state = state
            self._keyings.clear()
            return True
        # The same weights and buffers; what the watch saw may still be a part replaced
        # whose repr, settings or hooks are in the declaration, so that is said again too
        # (only here, where the watch fired: a forward that changed nothing pays nothing).
        return self._redeclared()

    def _redeclared(self) -> bool:
        """Drops each keying whose prefix the module as it is now would not derive (its
        declaration changed); returns whether there was one."""
        stale = [tag for tag, keying in self._keyings.items() if self._prefix(tag) != keying.prefix]
        for tag in stale:
            del self._keyings[tag]
        return bool(stale)

    def _keying(self, x: torch.Tensor | DeferredRows) -> _Keying:
        """How rows of ``x`` are keyed now: the key prefix for the precision they run in."""
        self._settle()
        version = self.version
        if isinstance(x, DeferredRows):
            dtype, shape = self._deferred_row(x)
            if x.version is None and version is not None:
                self._lend_version(x.source, version)
            version = x.version or version
        else:
            dtype, shape = x.dtype, x.shape[1:]
        device = x.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        # A row is named in memory by the raw digest of its bytes (or its index), which says
        # nothing of their dtype or shape (or dataset): one keying per row shape and dataset
        # version keeps rows of different shapes and datasets apart.
        autocast_name = None if autocast is None else _dtype_name(autocast)
        # The dtype tensors made in the forward get (torch.linspace, torch.zeros): named
        # only when it is not the usual float32, so the usual keys do not change.
        made = torch.get_default_dtype()
        made_name = None if made == torch.float32 else _dtype_name(made)
        # How float32 products are computed (TF32 on a GPU): named only when not torch's
        # defaults (full precision for matrix products, TF32 allowed to cuDNN), likewise.
        matmul = torch.get_float32_matmul_precision()
        matmul_name = None if matmul == "highest" else matmul
        if device == "cuda" and not torch.backends.cudnn.allow_tf32:
            matmul_name = f"{matmul}, cudnn without tf32"
        tag = (_dtype_name(dtype), autocast_name, shape, version, made_name, matmul_name)
        found = self._keyings.get(tag)
        if found is None:
            if self.key_mode == "index" and version is None:
                raise NeedsIndex(
                    "key='index' keys each row by its sample index, which names a row only "
                    "within one version of the dataset, and none was given: pass version= to "
                    "the cache (e.g. the dataset's digest, 'sms/train@blake3:…') or to the "
                    "`Deferred` the rows come from. Change it whenever the data changes"
                )
            prefix = self._prefix(tag)
            number = self._tags.setdefault((prefix, tag), len(self._tags) + 1)
            # Only content keys use the header (deferred rows are keyed by index).
            by_content = self.key_mode == "content"
            header = row_header(x) if by_content and isinstance(x, torch.Tensor) else b""
            found = _Keying(prefix, number, version, header, dtype)
            self._keyings[tag] = found
        return found

    def _lend_version(self, source: str, version: str) -> None:
        """Lets the Deferred named ``source``, which has no version of its own, key its rows
        under the cache's ``version`` — if it is the first to: the version names one
        dataset, and two under it would share their indices."""
        lent = self._lent_to.setdefault(version, source)
        if lent != source:
            raise NeedsIndex(
                f"a second `Deferred` without a version of its own came to this cache, which "
                f"keys the rows of the first under its version={version!r}: under one version "
                "sample 0 of one dataset would be recalled for sample 0 of the other (a "
                "training and a validation set both have one). Give each Deferred its own "
                "version, `Deferred(inputs, ..., version='val@1')` (a Deferred made again over "
                "the same data needs one too: the cache cannot tell it is the same)"
            )

    def _deferred_row(self, x: DeferredRows) -> tuple[torch.dtype, torch.Size]:
        """The dtype and shape deferred rows run in: floating-point inputs in the module's
        own floating dtype, as a trainer in true half precision converts a batch tensor
        (only the cache sees these inputs, so only it can) — their own where the module
        holds floating weights of it (a float32 scale beside a bfloat16 body holds both),
        else the one most of its floating weights are in; others as they load."""
        dtype, shape = x.row()
        if dtype.is_floating_point:
            watch = self._watch
            if self._floats[0] is not watch or watch is None:
                self._floats = (watch, _floating_dtypes(self.module))
            held = self._floats[1]
            if held and dtype not in held:
                dtype = max(held, key=held.__getitem__)
        return dtype, shape

    def _prefix(self, tag: tuple[Any, ...]) -> bytes:
        """The key prefix of rows run in precision ``tag``, from the module as it is now."""
        precision = {"input": tag[0], "autocast": tag[1]}
        if tag[4] is not None:
            precision["default"] = tag[4]
        if tag[5] is not None:
            precision["matmul"] = tag[5]
        declared: dict[str, Any] = {"rows": self.key_mode, "precision": precision}
        if self.key_mode == "index":
            # An index names a sample, not what was made of it: the same sample resized
            # (another input shape) is another answer. A content key has the shape already
            # (in each row's digest), so it is not named there.
            declared["input"] = [int(size) for size in tag[2]]
        self._node.declared = declared
        declaration = self._node.declaration()
        assert self._identity is not None  # ModuleNode.declaration refused it otherwise
        return node_prefix(self._identity, declaration, self._state, self.salt)

    def redeclare(self, *, digest: bool = True) -> bool:
        """Looks again at the plain values and functions the module keeps beside its
        weights and at its forward hooks (:func:`~somatize_torch.freeze.settings_of`,
        :func:`~somatize_torch.freeze.hooks_of`), and (unless ``digest=False``) digests
        its weights and buffers again — at every forward they are watched (a change in
        place, a tensor or submodule replaced), and this also sees writes that bypass
        what is watched (into ``p.data``): if one changed since rows were keyed, rows
        are keyed anew from the next forward, and nothing kept under the old values is
        recalled for them. Returns whether one changed. ``CacheFrozen`` calls it at the
        first batch of every stage's epoch."""
        settled = self._settle(again=digest, thorough=True)
        return self._redeclared() if settled is None else settled

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
        and names the rows itself otherwise, or if naming failed. Nothing is named for
        an index-keyed cache, for a batch that requires grad or is not on the CPU, for a
        host batch once the cache runs on a device, or for an inference tensor (one made
        under ``torch.inference_mode``): it has no version counter, so a change in place
        could not be told from no change."""
        if self.key_mode != "content" or not isinstance(x, torch.Tensor) or x.dim() == 0:
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

    def _take_named(self, x: torch.Tensor) -> list[bytes] | None:
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

    def _row_ids(self, x: torch.Tensor | DeferredRows, index: torch.Tensor | None) -> list[Any]:
        """What names each row within one keying: its content digest, or its index."""
        if isinstance(x, DeferredRows):
            rows: list[Any] = x.index.tolist()
            return rows
        if self.key_mode == "content":
            named = self._take_named(x)
            return named if named is not None else raw_rows(x)
        if index is None:
            raise NeedsIndex(
                "this cache keys rows by sample index (key='index'), and was called without "
                "one: call it as `cached(x, index=idx)`, with the indices the Dataset's "
                "__getitem__ was given (return them from it beside the sample)"
            )
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.is_floating_point():
            raise NeedsIndex(
                f"index= is a 1-d integer tensor of sample indices, one per row; got "
                f"{_describe(index)}"
            )
        if index.shape[0] != x.shape[0]:
            raise NeedsIndex(
                f"index= has {index.shape[0]} indices for a batch of {x.shape[0]} rows; each "
                "row needs the index of its own sample"
            )
        ids: list[Any] = index.tolist()
        if len(set(ids)) < len(ids):
            _check_repeats(x, ids)
        return ids

    def row_keys(
        self, x: torch.Tensor | DeferredRows, index: torch.Tensor | None = None
    ) -> list[str]:
        """The store key of each row of ``x`` as this module, in its precision now, answers it."""
        keying = self._keying(x)
        return [keying.key(row) for row in self._row_ids(x, index)]

    # -- forward

    def forward(
        self,
        x: torch.Tensor | DeferredRows,
        *beside: Any,
        index: torch.Tensor | None = None,
        **more: Any,
    ) -> torch.Tensor:
        """The module's output on ``x``, row by row from the nearest copy; see the class.

        ``index`` is keyword-only: a second positional argument (``encoder(x, mask)``) is
        one the module would take, and is refused as every other argument is."""
        if beside or more:
            given = [f"`{k}=`" for k in more]
            if beside:
                count = len(beside)
                given.insert(0, f"{count} positional argument{'s' if count > 1 else ''}")
            raise RowsError(
                f"`{type(self.module).__name__}` is cached per row and was called with "
                f"{' and '.join(given)} beside its batch: a row is keyed by its input alone (or "
                "its index), so nothing else can reach the module — answers computed with one "
                "value would be recalled for another. Keep the value in the module (a setting "
                "is in the key) or call the module itself; sample indices go as `index=`"
            )
        if index is not None and self.key_mode != "index":
            raise RowsError(
                f"`{type(self.module).__name__}` is cached per row keyed by content and was "
                "called with index=: each row is named by the digest of its input, so an index "
                "would be ignored. Call it as `cached(x)`, or key rows by sample index "
                "(cache_rows(module, store, key='index', version=...)) to name them by it"
            )
        if isinstance(x, DeferredRows):
            if self.key_mode != "index":
                raise RowsError(
                    "deferred inputs (a batch from `Deferred`) name their rows by sample index "
                    "and are loaded only for rows that are computed, so they go to a cache "
                    "keyed by index: cache_rows(module, store, key='index'), the version given "
                    "to the Deferred or to the cache. A content-keyed cache must read every "
                    "input to name it"
                )
            if index is not None:
                raise NeedsIndex(
                    "a batch from `Deferred` carries its samples' indices; call the cache as "
                    "`cached(x)`, without index="
                )
        elif not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise NotRowwise(
                f"a row-cached module is called with a batch tensor (rows along dimension 0), "
                f"got {_describe(x)}"
            )
        elif x.requires_grad:
            raise CachedInputNeedsGrad(
                f"`{type(self.module).__name__}` is cached per row and the batch it is handed "
                "requires grad: a recalled row is a leaf, so whatever produced the batch would "
                "train on misses and silently stop on hits. Freeze what feeds it, or call the "
                "module itself"
            )
        try:
            out: torch.Tensor = _remember(self, x, index)
        except Unfrozen:
            handler = self.when_unfrozen
            if handler is None or not handler(self):
                raise
            return self._uncached(x)
        return out

    def _uncached(self, x: torch.Tensor | DeferredRows) -> torch.Tensor:
        """The module's own answer on ``x``, once :attr:`when_unfrozen` has put it back
        uncached: run as without a cache, in the caller's grad mode, so that it trains
        from this very batch."""
        if isinstance(x, DeferredRows):
            dtype = self._deferred_row(x)[0]
            loaded = x.load()
            x = loaded if loaded.dtype == dtype else loaded.to(dtype)
        out: torch.Tensor = self.module(x)
        return out

    def _recall_or_run(
        self, x: torch.Tensor | DeferredRows, index: torch.Tensor | None
    ) -> torch.Tensor:
        if self._writer is not None:
            self._writer.check()  # here, outside what torch.compile traces
        start = time.perf_counter()
        if not self._placed:
            self.tiers[0].device = x.device
            self._placed = True
        if isinstance(x, torch.Tensor):
            self.last_input = weakref.ref(x)
        keying = self._keying(x)
        tag = keying.tag
        if isinstance(x, DeferredRows) and self.store is not None:
            self._seed(x, keying)
        ids = self._row_ids(x, index)
        near = [(tag, row) for row in ids]
        count = len(near)
        if count == 0:
            return self._compute(x, [], keying)  # an empty batch: nothing to look up or keep
        counts = self._counts
        pieces: list[tuple[list[int] | None, torch.Tensor]] = []
        positions: list[int] | None = None  # None: every row is still to be found
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
        computed = 0.0
        if positions and self.store is not None:
            keys = {p: keying.key(ids[p]) for p in positions}
            found = self._from_store(keys)
            if found is not None:
                at, rows = found
                counts["store"] += len(at)
                self._admit([near[p] for p in at], rows)
                pieces.append((None if len(at) == count else at, rows))
                taken = set(at)
                positions = [p for p in positions if p not in taken]
        if positions:
            began = time.perf_counter()
            first: dict[Hashable, int] = {}
            for p in positions:
                first.setdefault(near[p], p)
            once = list(first.values())  # a row that is in the batch twice runs once
            rows = self._compute(x, once, keying)
            computed = time.perf_counter() - began
            self._admit([near[p] for p in once], rows)
            if self._writer is not None:
                self._writer.submit([keying.key(ids[p]) for p in once], rows)
            if len(once) < len(positions):
                slot = {p: i for i, p in enumerate(once)}
                rows = rows[torch.tensor([slot[first[near[p]]] for p in positions])]
            elif rows.is_cuda and len(positions) == count:
                # The writer copies these rows to the host on a side stream, after the work
                # queued so far; a caller writing into the output in place must not race it.
                rows = rows.clone()
            pieces.append((None if len(positions) == count else positions, rows))
        out = _assemble(pieces, count, x.device)
        if isinstance(x, DeferredRows):
            x.answered()  # their inputs need not come with the samples any more
        counts["batches"] += 1
        counts["rows"] += count
        counts["computed"] += len(positions)  # rows of the batch answered by running
        counts["compute_s"] += computed
        counts["lookup_s"] += time.perf_counter() - start - computed
        return out

    def look_up_answered(self) -> None:
        """Has the next batch of each :class:`~somatize_torch.deferred.Deferred` look the
        store up again for samples answered elsewhere (another process, another rank)
        since, so their inputs stop coming with the samples. ``CacheFrozen`` calls it at
        the start of every epoch; a dataset whose samples are all answered costs
        nothing."""
        self._seeded.clear()

    def _seed(self, x: DeferredRows, keying: _Keying) -> None:
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
            target=self._seed_from_store, args=(dataset, keying), name="somatize-seed", daemon=True
        )
        self._seeders = [t for t in self._seeders if t.is_alive()] + [seeder]
        seeder.start()

    def _seed_from_store(self, dataset: Deferred, keying: _Keying) -> None:
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
                dataset.answered[[keys[key] for key in present]] = True
        except Exception as error:  # a hint: a sample left unmarked is only loaded
            log.debug("the store was not looked up for answered samples: %s", error)

    def _compute(
        self, x: torch.Tensor | DeferredRows, positions: list[int], keying: _Keying
    ) -> torch.Tensor:
        module = self.module
        check_still(type(module).__name__, module)
        if isinstance(x, DeferredRows):
            sub = x.load(positions)
            if sub.dtype != keying.dtype:
                sub = sub.to(keying.dtype)
        elif len(positions) == x.shape[0]:
            sub = x
        else:
            sub = x[torch.tensor(positions, dtype=torch.long, device=x.device)]
        # Taken before the forward, which may write into its input.
        ends = (
            sub[:: len(positions) - 1].clone()
            if not keying.rowwise and len(positions) > 1
            else None
        )
        with torch.no_grad():
            out = module(sub)
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != len(positions):
            raise NotRowwise(
                f"`{type(module).__name__}` was handed {len(positions)} rows and returned "
                f"{_describe(out)}: a module cached per row must return one tensor with one row "
                "per input row (batch along dimension 0). Cache it per batch instead "
                "(`somatize.torch.wrap(module, frozen=True, cached=True)`)"
            )
        if out.layout != torch.strided:
            raise NotRowwise(
                f"`{type(module).__name__}` returned a {out.layout} tensor: rows are kept and "
                "gathered as dense tensors. Return `out.to_dense()`"
            )
        if self.store is not None and out.dtype not in DTYPES:
            kept = ", ".join(sorted(str(dtype).removeprefix("torch.") for dtype in DTYPES))
            raise RowsError(
                f"`{type(module).__name__}` returned rows of {out.dtype}, which a store cannot "
                f"keep (it keeps {kept}). Return a dtype it keeps (`torch.view_as_real` for "
                "complex rows), or cache in memory only (store=None)"
            )
        if ends is not None:
            self._check_rowwise(ends, out, keying)
        return out

    def _check_rowwise(self, ends: torch.Tensor, out: torch.Tensor, keying: _Keying) -> None:
        """Refuses a module whose answer for a row depends on the other rows of its batch
        (attention or a recurrence along dimension 0, statistics of the batch): an answer
        kept from one batch would be recalled in a batch of other rows. Its first and last
        rows (``ends``) are run again, each alone, and compared with their rows in the
        batch — once per keying, so it costs two forwards of one row where a keying first
        computes rows. Both ends: along a recurrence or causal attention the last row sees
        the others, along a reversed one the first does. Kernels round differently for a
        batch of another size, so the two are compared within what rounding at the
        precision the module runs in allows."""
        module = self.module
        limit = self._rounding(ends, out)
        for which, at in (("first", 0), ("last", len(out) - 1)):
            with torch.no_grad():
                alone = module(ends[min(at, 1) : min(at, 1) + 1])
            row = out[at : at + 1]
            if isinstance(alone, torch.Tensor) and alone.shape == row.shape:
                difference = _difference(alone, row)
                if difference <= limit:
                    continue
                got = (
                    f"an answer {difference:.3g} of its size away from its row of the batch's "
                    f"answer (rounding allows {limit:.3g})"
                )
            else:
                got = f"{_describe(alone)}, not a tensor of shape {list(row.shape)}"
            self._refuse_mixing(which, len(out), got)
        keying.rowwise = True

    def _refuse_mixing(self, which: str, rows: int, got: str) -> None:
        raise NotRowwise(
            f"`{type(self.module).__name__}` answers a row differently alone than in a batch: "
            f"the {which} of {rows} rows, run again on its own, came back with {got}. Its answer "
            "for a row depends on the other rows of its batch, so an answer kept from one "
            "batch would be recalled in a batch of other rows, wrongly. A module cached per "
            "row takes rows along dimension 0 and answers each on its own: put the batch "
            "first (`batch_first=True` for a transformer layer or an RNN), or cache it per "
            "batch (`somatize.torch.wrap(module, frozen=True, cached=True)`)"
        )

    def _rounding(self, row: torch.Tensor, out: torch.Tensor) -> float:
        """How far apart (relative to its size) one row computed in batches of two sizes
        may be: a thousandth, or 16 units in the last place of the least precise
        floating dtype the rows run in — the input's, the output's, the weights', the
        autocast dtype, and TF32 or bfloat16 where float32 products may use them."""
        device = out.device.type
        dtypes = {row.dtype, out.dtype, *_floating_dtypes(self.module)}
        if torch.is_autocast_enabled(device):
            dtypes.add(torch.get_autocast_dtype(device))
        eps = max(
            (
                torch.finfo(dtype).eps
                for dtype in dtypes
                if dtype.is_floating_point or dtype.is_complex
            ),
            default=0.0,
        )
        matmul = torch.get_float32_matmul_precision()
        if matmul == "medium":
            eps = max(eps, 2.0**-7)  # bfloat16 products
        elif matmul == "high" or device != "cpu":
            eps = max(eps, 2.0**-10)  # TF32 products (cuDNN allows them by default)
        return max(1e-3, 16 * eps)

    def _admit(self, near: list[Hashable], rows: torch.Tensor) -> None:
        """Keeps rows in the nearest memory tier with room, the rest in the next one."""
        if len(set(near)) < len(near):
            first: dict[Hashable, int] = {}
            for i, key in enumerate(near):
                first.setdefault(key, i)
            near = list(first)
            rows = rows[torch.tensor(list(first.values()), device=rows.device)]
        done = 0
        for tier in self.tiers:
            if done == len(near):
                return
            done += tier.admit(near[done:], rows[done:])

    def _from_store(self, keys: dict[int, str]) -> tuple[list[int], torch.Tensor] | None:
        """The rows at batch positions ``keys`` (position → store key) the store has."""
        store = self.store
        assert store is not None and self._lock is not None
        with self._lock:
            present = store.have(keys.values())
            if not present:
                return None
            wanted = [p for p, key in keys.items() if key in present]
            got = store.recall_many([keys[p] for p in wanted], borrow=True)  # decoded by copy
        at: list[int] = []
        datas: list[memoryview] = []
        for p in wanted:
            item = got.get(keys[p])
            if not isinstance(item, tuple):
                continue  # damaged or gone since `have`: computed again
            answer, data = item
            if answer.codec != TENSOR.name:
                continue
            if answer.fingerprint not in (None, self._fingerprint):
                if self.strict:
                    continue
                self._drifted(answer.fingerprint)
            at.append(p)
            datas.append(data)
        if not at:
            return None
        try:
            rows = decode_rows(datas)
        except (ValueError, TypeError, Corrupt, Missing):
            return None  # a damaged row: every row of this lookup is computed again
        return at, rows

    def _drifted(self, was: str | None) -> None:
        if self._drift_warned:
            return
        self._drift_warned = True
        warnings.warn(
            f"rows of `{type(self.module).__name__}` recalled from the store were kept by "
            f"another version of its code ({was}, now {self._fingerprint}); they are used, "
            "since the key (class, structure, weights) is the same. Pass strict=True to "
            "compute them again instead",
            Drifted,
            stacklevel=4,
        )

    # -- what it did

    @property
    def stats(self) -> RowStats:
        """What this cache did since it was made (or since :meth:`reset_stats`)."""
        c = self._counts
        writer = self._writer
        kept = (0, 0, 0)
        if writer is not None:
            base = self._kept_base
            kept = (
                writer.kept_rows - base[0],
                writer.kept_bytes - base[1],
                writer.failed_rows - base[2],
            )
        return RowStats(
            batches=int(c["batches"]),
            rows=int(c["rows"]),
            computed=int(c["computed"]),
            from_device=int(c["device"]),
            from_host=int(c["host"]),
            from_store=int(c["store"]),
            rows_kept=kept[0],
            bytes_kept=kept[1],
            rows_failed=kept[2],
            lookup_s=c["lookup_s"],
            compute_s=c["compute_s"],
        )

    def reset_stats(self) -> RowStats:
        """Starts counting afresh (per epoch, say); returns what was counted until now."""
        out = self.stats
        self._counts = dict.fromkeys(_COUNTED, 0.0)
        writer = self._writer
        if writer is not None:
            self._kept_base = (writer.kept_rows, writer.kept_bytes, writer.failed_rows)
        return out

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
        for tier in self.tiers:
            tier.banks = []
        self._keyings.clear()
        with self._named_lock:
            self._named.clear()

    # -- nn.Module

    def train(self, mode: bool = True) -> CachedRows:
        """Records the mode; the frozen module stays in eval whatever is asked."""
        self.training = mode
        return self

    # The registries are the module's own (see `__init__`), so what torch does to the
    # wrapper's own tensors is done by the module, as it would be unwrapped: its overrides
    # (a module that converts a tensor it keeps, one with extra state) take part.

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> CachedRows:
        self.module._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._watch = None  # a conversion: digest again
        return self

    def _save_to_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.module._save_to_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
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
        what it loads as caches the same way, with memory tiers and a writer of its own."""
        return (_cached_again, (self.module, self.store, self._options(), self.training))

    def __deepcopy__(self, memo: dict[int, Any]) -> CachedRows:
        """A copy (an EMA or SWA model's) caches a copy of the module in the same store, with
        memory tiers and a writer of its own."""
        copied = cache_rows(copy.deepcopy(self.module, memo), self.store, **self._options())
        copied.training = self.training
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


_remember: Callable[..., Any] = torch.compiler.disable(CachedRows._recall_or_run)  # type: ignore[no-untyped-call]
"""The lookup runs outside any compiled region: a graph break at the cached module, so
``torch.compile`` compiles what is around it (the head) once."""


def _assemble(
    pieces: list[tuple[list[int] | None, torch.Tensor]], count: int, device: torch.device
) -> torch.Tensor:
    """The rows of ``pieces`` put back in batch order on ``device``."""
    if len(pieces) == 1 and pieces[0][0] is None:
        rows = pieces[0][1]
        return rows.to(device) if rows.device != device else rows
    first = pieces[0][1]
    out = torch.empty((count, *first.shape[1:]), dtype=first.dtype, device=device)
    for at, rows in pieces:
        if rows.shape[1:] != first.shape[1:] or rows.dtype != first.dtype:
            raise NotRowwise(
                f"rows of one batch came back as {rows.dtype} {list(rows.shape[1:])} and as "
                f"{first.dtype} {list(first.shape[1:])}: a module cached per row must answer "
                "every row with the same dtype and shape"
            )
        assert at is not None
        out.index_copy_(0, torch.tensor(at, device=device), rows.to(device))
    return out


def _check_repeats(x: torch.Tensor, ids: list[Any]) -> None:
    """Refuses a batch in which one index names rows of different inputs: the answer
    computed for one would be recalled for the other, now and in every epoch after. Only
    the repeated rows are compared, so a batch without repeats costs nothing here."""
    first: dict[Any, int] = {}
    again: list[int] = []
    for p, row in enumerate(ids):
        if first.setdefault(row, p) != p:
            again.append(p)
    was = [first[ids[p]] for p in again]
    a = x[torch.tensor(again, device=x.device)]
    b = x[torch.tensor(was, device=x.device)]
    differ = a != b
    if a.is_floating_point() or a.is_complex():
        differ &= ~(a.isnan() & b.isnan())  # the same sample loaded twice, NaN and all
    bad = differ.reshape(len(again), -1).any(1).nonzero().flatten().tolist()
    if not bad:
        return
    p = again[bad[0]]
    raise NeedsIndex(
        f"index= names sample {ids[p]} at rows {first[ids[p]]} and {p} of one batch, and "
        "their inputs differ: an index must name one input, or the answer computed for one "
        "row is recalled for the other. Pass the samples' indices in the dataset (return "
        "them from the Dataset's __getitem__; prefill takes a loader item's last tensor for "
        "them, and the labels of an (x, y) loader are not: pass inputs=). Inputs drawn at "
        "random (an augmentation) are not named by their index either: key them by content "
        "(key='content')"
    )


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """How far ``a`` is from ``b``, relative to their size (the norm of the difference over
    the larger norm); infinite where their non-finite values or integer values differ."""
    if not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else math.inf
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)):
        return math.inf
    if not bool(finite.all()):
        if not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a[a.isinf()], b[b.isinf()]):
            return math.inf
        a, b = a.where(finite, 0), b.where(finite, 0)
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a, b = a.double(), b.double()
    # Scaled by the largest magnitude first, so that neither the norms nor the difference
    # overflow (or vanish) for values far from 1.
    scale = max(float(a.abs().max()), float(b.abs().max())) if a.numel() else 0.0
    if not scale:
        return 0.0
    a, b = a / scale, b / scale
    size = max(float(a.norm()), float(b.norm()))
    return float((a - b).norm()) / size if size else 0.0


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"a `{type(value).__name__}`"


def _cached_again(
    module: nn.Module, store: Store | None, options: dict[str, Any], training: bool
) -> CachedRows:
    cached = cache_rows(module, store, **options)
    cached.training = training
    return cached


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
    return CachedRows(
        module,
        Store.of(store),
        key=key,
        version=version,
        salt=salt,
        device_bytes=device_bytes,
        host_bytes=host_bytes,
        strict=strict,
    )


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
