"""How a batch's rows are keyed: one key per row, under one state and precision.

A row's key, ``H(identity, declaration, state, salt, key of the row)``, is built
with :func:`somatize.keys.node_prefix` and :func:`~somatize.keys.node_key` (as
:func:`~somatize.keys.key_after` computes it, the fixed part joined once), so it
has the form of every other key: the **identity** is the module's class
(``package.module:Encoder``); the **declaration** is what
:class:`~somatize_torch.freeze.ModuleNode` declares for it (its structure as
``repr`` shows it) plus how it is called here — how rows are keyed and the
**precision** it runs under (the input's dtype and the autocast dtype, since a bf16
answer is not an fp32 answer), and, keyed by index, the shape of an input row (a
content key holds it in each row's digest); the **state** is the digest of its
weights and buffers (:func:`~somatize_torch.freeze.digest_state`); the **salt** is
the caller's. The key of a row is, by default, the digest of its content
(:func:`~somatize_torch.digest.digest_rows`, one call for the whole batch — any
DataLoader, any shuffling, no change to the dataset); or, with ``key="index"``, the
sample's index in a dataset of a given version (no hashing at all — the cheapest,
and right only as long as the version names the data exactly).

All of the key but the row's own name is the same for every row run in one
precision, so it is derived once, as a :class:`_Keying`, and dropped when the state
or the declaration changes; a row then costs the digest of its content (or nothing,
keyed by index), and its full key only where it goes to the store or comes from it.
Before rows are keyed the state is settled (:func:`_settle`): digested again once its
watch saw a weight, buffer or submodule change (the module refused if it was unfrozen
meanwhile), and each keying whose declaration changed dropped (:func:`_redeclared`) —
looked at again too where only a setting or hook may have changed
(:meth:`~somatize_torch.freeze.ModuleNode.declaration_moved`). A
batch whose rows were named ahead of its forward (:mod:`somatize_torch._row_ahead`)
has them taken as named.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Literal, NoReturn, ParamSpec, TypeVar

import blake3
import torch
from torch import nn

from somatize import canonical
from somatize.catalog import (
    CodeWatch,
    code_changes,
    fingerprint_of,
    names_rebound,
    watch_code,
    watched_again,
)
from somatize.keys import (
    before_one_key,
    key_after,
    node_head,
    node_prefix,
    root_bytes,
    root_key,
)
from somatize_torch._native_env import DIGEST_SIZE
from somatize_torch._precision import products
from somatize_torch._row_ahead import _take_named
from somatize_torch._row_errors import NeedsIndex, RowsError, _describe
from somatize_torch._state import StateWatch, trainable_parameters
from somatize_torch.deferred import _KNOWN, DeferredRows
from somatize_torch.digest import (
    DTYPES,
    before_raw,
    keys_after_rows,
    raw_rows,
    row_digest,
    row_header,
)
from somatize_torch.freeze import (
    classes_of,
    hold,
    keyed_with,
    refuse_unseen_state,
    unfrozen_error,
    watched_state,
)
from somatize_torch.wrap import REGISTRIES

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows

KeyMode = Literal["content", "index"]

_REMEMBERED_KEYS = 1 << 20
"""How many store keys a cache remembers, over all its keyings (about 250 MB at most)."""

_TAGS_HELD = 4096
"""How many of its keyings' names a cache holds (:func:`_tag_of`)."""

_LAST_CONVERSION: list[object] = [object()]
"""A mark made anew by every conversion (``.half()``, ``.double()``, ``.to(device)``)
asked of a row cache (:func:`converted`), which its module carries out in place: the
tensors' memory changes, their identities and version counters do not, so no other cache
over that module (keyed otherwise, salted apart), over a part of it or over one holding
it would see it. Each cache keeps the mark it last settled under (:func:`_settle`); one
it has not seen has it look at the tensors' memory too — once, and at the cost of one
comparison at every other call. Made anew, never counted up: two threads converting at
once leave a mark no cache has seen."""


def converted() -> None:
    """Says that a row cache's module was converted in place (:data:`_LAST_CONVERSION`)."""
    _LAST_CONVERSION[0] = object()


class _KeyRoom:
    """How many more store keys the keyings of one cache may remember: one count for all
    of them, since a cache may key rows under many (one per row shape: sequences of many
    lengths), and a cap on each would let them all together hold the keys of every row
    ever looked up."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = _REMEMBERED_KEYS


P = ParamSpec("P")
R = TypeVar("R")


def _one_at_a_time(
    step: Callable[Concatenate[CachedRows, P], R],
) -> Callable[Concatenate[CachedRows, P], R]:
    """``step`` run under the cache's keying lock: one thread at a time looks its keyings
    over, drops them or makes one (a cache called from several threads at once)."""

    @functools.wraps(step)
    def locked(cache: CachedRows, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with cache._keying_lock:
            return step(cache, *args, **kwargs)

    return locked


@_one_at_a_time
def _drop_keyings(self: CachedRows, tags: list[Any] | None = None) -> None:
    """Drops the keyings under ``tags`` (None: all of them), giving back the room their
    remembered keys took."""
    for tag in list(self._keyings) if tags is None else tags:
        self._key_room.left += len(self._keyings.pop(tag).keys)


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

    __slots__ = (
        "answers",
        "before_index",
        "before_key",
        "before_raw",
        "dtype",
        "head",
        "header",
        "keys",
        "mixes",
        "prefix",
        "records_none",
        "room",
        "rowwise",
        "tag",
        "unchecked",
        "version",
    )

    def __init__(
        self,
        prefix: bytes,
        tag: int,
        version: str | None,
        header: bytes,
        dtype: torch.dtype,
        room: _KeyRoom,
    ) -> None:
        self.dtype = dtype  # what the rows run in
        self.prefix = prefix
        self.head = node_head(prefix, 1)  # all of a row's key but the key of the row
        self.tag = tag
        self.version = version
        self.header = header
        # What a row's two hashes hash before its raw digest and before its digest's text.
        self.before_raw = before_raw(header, DIGEST_SIZE)
        self.before_key = before_one_key(self.head)
        self.before_index: bytes | None = None  # found at the first batch keyed by index
        self.keys: dict[Any, str] = {}
        self.room = room  # shared with the cache's other keyings
        # Whether the module was seen to answer a row alone as it did in a batch (see
        # `somatize_torch._rowwise._check_rowwise`): looked at once per keying.
        self.rowwise = False
        # Whether rows were kept before that was seen (run in a batch of one row, or of
        # copies of one): checked in the first batch of other rows that recalls them.
        self.unchecked = False
        # Whether the module was seen to record no gradient of a batch that requires grad
        # under torch.no_grad (see `somatize_torch._rowwise._check_records_none`).
        self.records_none = False
        # The shape and dtype of the rows the module answers, from the first rows computed
        # or recalled; and why it is refused, once it answered rows of another
        # (`somatize_torch._rowwise._same_answers`).
        self.answers: tuple[torch.Size, torch.dtype] | None = None
        self.mixes: str | None = None

    def key(self, row: Any) -> str:
        """The store key of the row named ``row`` (the raw digest of its content, or its
        index); remembered, for up to :data:`_REMEMBERED_KEYS` rows of all the cache's
        keyings, so a row read from the store every epoch is keyed once."""
        found = self.keys.get(row)
        if found is None:
            if isinstance(row, bytes):
                found = key_after(self.head, [row_digest(self.header, row)])
            else:
                found = key_after(self.head, [root_key({"dataset": self.version, "index": row})])
            room = self.room
            if room.left > 0:
                self.keys[row] = found
                room.left -= 1
        return found

    def keys_of(self, rows: Sequence[Any]) -> list[str]:
        """:meth:`key` of each of ``rows``: those not remembered made in one native call
        (:func:`~somatize_torch.digest.keys_after_rows`), where the host library is
        loaded, rather than a row at a time in Python (two hashes and two hex strings a
        row named by content; a canonical encoding, two hashes and two hex strings a row
        named by index)."""
        known = self.keys
        found: list[str | None] = [known.get(row) for row in rows]
        todo = [i for i, key in enumerate(found) if key is None]
        made = None
        if len(todo) < _KEYS_AT_ONCE:
            pass
        elif all(type(rows[i]) is bytes and len(rows[i]) == DIGEST_SIZE for i in todo):
            made = keys_after_rows(self.before_raw, [rows[i] for i in todo], self.before_key)
        elif all(type(rows[i]) is int for i in todo) and self._indexed():
            items = [canonical.int_bytes(rows[i]) for i in todo]
            made = keys_after_rows(self.before_index or b"", items, self.before_key)
        if made is not None:
            room = self.room
            for i, key in zip(todo, made, strict=True):
                found[i] = key
                if room.left > 0:
                    known[rows[i]] = key
                    room.left -= 1
            return found  # type: ignore[return-value]  # every one found or made
        for i in todo:
            found[i] = self.key(rows[i])
        return found  # type: ignore[return-value]

    def _indexed(self) -> bool:
        """Whether rows keyed by index can be keyed natively: what :func:`root_key` hashes of
        ``{"dataset": version, "index": i}`` is found once as a prefix and the encoding of
        ``i`` after it, checked against it for a few indices (else they are keyed in
        Python, as ever)."""
        if self.before_index is None:
            tail = canonical.int_bytes(0)
            whole = root_bytes({"dataset": self.version, "index": 0})
            before = whole[: -len(tail)]
            same = whole.endswith(tail) and all(
                "blake3:" + blake3.blake3(before + canonical.int_bytes(i)).hexdigest()
                == root_key({"dataset": self.version, "index": i})
                for i in (0, 1, -1, 255, 1 << 40)
            )
            self.before_index = before if same else b""
        return bool(self.before_index)


_KEYS_AT_ONCE = 4
"""How many rows' keys to make, at least, for one native call to be worth its setting up."""


@_one_at_a_time
def _keying(self: CachedRows, x: torch.Tensor | DeferredRows) -> tuple[_Keying, StateWatch | None]:
    """How rows of ``x`` are keyed now: the key prefix for the precision they run in, and
    the watch of the weights it was derived from. The two are read in one hold of the
    lock: another thread settling weights loaded since, between the two reads, would
    have rows keyed under the weights before taken as computed under the watch of those
    after, and kept under the wrong keys."""
    _code_as_cached(self)
    _settle(self)
    version = self.version
    if isinstance(x, DeferredRows):
        dtype, shape = _deferred_row(self, x)
        if x.version is None and version is not None:
            _lend_version(self, x.source, version)
            self._keyed_as.setdefault((x.source, x.generation), version)
        elif x.version is not None:
            _claim_version(self, x.source, x.version)
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
    # How float32 products and convolutions are computed (TF32, bfloat16), half
    # precision ones on CUDA (accumulating in float16), and whether oneDNN computes them
    # on the host: named only when not torch's defaults (full precision for matrix
    # products, TF32 allowed to cuDNN, oneDNN on), likewise.
    precision = products(device)
    matmul_name = ", ".join(f"{setting}={value}" for setting, value in precision) or None
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
        prefix = _prefix(self, tag)
        number = _tag_of(self, (prefix, tag))
        # Only content keys use the header (deferred rows are keyed by index).
        by_content = self.key_mode == "content"
        header = row_header(x) if by_content and isinstance(x, torch.Tensor) else b""
        found = _Keying(prefix, number, version, header, dtype, self._key_room)
        self._keyings[tag] = found
    return found, self._watch


def _tag_of(self: CachedRows, named: tuple[bytes, tuple[Any, ...]]) -> int:
    """The memory tiers' name for the keying ``named`` by its prefix and precision: the
    one it had, if it is among the last :data:`_TAGS_HELD` made or made again, so that
    its rows kept in memory are found again; else a new one. A module that keys rows
    anew at every batch (its forward counts its calls, a value given it at every step)
    makes a keying a batch, so only the last ones are held; a name is never handed out
    twice, so a keying made again after its name was let go of finds none of the rows
    kept under another's (it computes its own again)."""
    tags = self._tags
    number = tags.pop(named, None)
    if number is None:
        self._tags_made += 1
        number = self._tags_made
        while len(tags) >= _TAGS_HELD:
            dropped = tags.pop(next(iter(tags)))
            for mark in [mark for mark in self._seeded if mark[1] == dropped]:
                self._seeded.discard(mark)  # no keying is named so again
    tags[named] = number  # the most recently made, last
    return number


def _lend_version(self: CachedRows, source: str, version: str) -> None:
    """Lets the Deferred named ``source``, which has no version of its own, key its rows
    under the cache's ``version`` — if it is the first to: the version names one
    dataset, and two under it would share their indices."""
    if self._claimed.get(version, {source}) != {source}:
        _refuse_shared_version(version)
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


def _claim_version(self: CachedRows, source: str, version: str) -> None:
    """Notes that the Deferred named ``source`` keys its rows under ``version``, its own;
    refused where the cache lent that version to a Deferred without one of its own
    (:func:`_lend_version`), which is another dataset as far as the cache can tell."""
    if self._lent_to.get(version, source) != source:
        _refuse_shared_version(version)
    self._claimed.setdefault(version, set()).add(source)


def _refuse_shared_version(version: str) -> NoReturn:
    raise NeedsIndex(
        f"a `Deferred` without a version of its own keys its rows under this cache's "
        f"version={version!r}, and another Deferred came with that very version as its "
        "own: under one version sample 0 of one dataset would be recalled for sample 0 of "
        "the other (a training and a validation set both have one). Give the Deferred "
        "without one a version of its own, `Deferred(inputs, ..., version='val@1')`"
    )


def _version_moved(self: CachedRows, was: str | None) -> None:
    """Moves the :class:`~somatize_torch.deferred.Deferred` the cache's version ``was`` was
    lent to (:func:`_lend_version`) to a new generation, as the cache's version changes:
    the new one may name its inputs changed in place, so batches made from it from now on
    (by workers started after) are told from those made before, whose inputs
    :func:`given_holds` takes only under the version their generation was keyed under."""
    lent = None if was is None else self._lent_to.get(was)
    dataset = None if lent is None else _KNOWN.get(lent)
    if dataset is not None:
        dataset._moved()
    # The samples answered under the version before are not under this one: their inputs
    # come with them again from now on, rather than be loaded by the loop; those of a
    # Deferred keyed under this one before (a stage switched back to) are answered again.
    now = None if self.version is None else self._lent_to.get(self.version)
    for source in (lent, now):
        held = None if source is None else _KNOWN.get(source)
        if held is not None:
            held.marks_under(self.version)


def given_holds(self: CachedRows, x: DeferredRows, version: str | None) -> bool:
    """Whether the inputs that came with deferred rows keyed under ``version`` are those of
    the samples it names. Rows of a Deferred without a version of its own are keyed under
    the cache's, whatever the Deferred held when their inputs were loaded (a persistent
    DataLoader worker holds it as it was when it started): inputs of a generation before
    the Deferred was given the ones it holds, or first keyed under another version of the
    cache's, are of other data, and loaded again as it is now."""
    if x.version is not None or x.given is None or x.generation is None:
        return True  # keyed under their own version; or nothing came; or made as it is now
    dataset = x.dataset()
    if x.generation < dataset._inputs_from:
        return False
    return self._keyed_as.get((x.source, x.generation)) == version


def _deferred_row(self: CachedRows, x: DeferredRows) -> tuple[torch.dtype, torch.Size]:
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
        dtype = _run_in(dtype, self._floats[1])
    return dtype, shape


def _run_in(dtype: torch.dtype, held: dict[torch.dtype, int]) -> torch.dtype:
    """The dtype floating-point inputs of ``dtype`` run in, in a module holding floating
    weights of the dtypes ``held`` (:func:`_floating_dtypes`): their own where it is
    among them, else the one most of its floating weights are in."""
    return max(held, key=held.__getitem__) if held and dtype not in held else dtype


def _prefix(self: CachedRows, tag: tuple[Any, ...]) -> bytes:
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


def _share_registries(cached: CachedRows, module: nn.Module) -> None:
    """Has ``cached`` hold ``module``'s own registries of children, parameters and buffers,
    and of the hooks ``state_dict()`` and ``load_state_dict()`` run — the very dicts, not
    copies: ``state_dict()`` has the module's keys, and a conversion, a checkpoint loaded
    or a submodule put in (``encoder[0] = conv``), through the cache or the module, is one
    and the same change to both. Done again where the module makes a registry anew
    (``del encoder[1]`` renumbers its children into a new dict)."""
    for registry in REGISTRIES:
        cached.__dict__[registry] = module.__dict__[registry]


def _code_as_cached(self: CachedRows) -> None:
    """Refuses a cache whose module's classes were given another method or value, or lost
    one, since it was made (a monkeypatch), or a global or helper of their modules their
    code reads rebound (a notebook's cell run again, edited): its rows are keyed by the
    class, structure and weights, not the code, and those the old code computed — in its
    memory tiers, in the store under its fingerprint — would be taken for the new code's."""
    code = self._code
    if code.looks_same():
        return
    changed = code_moved(self)
    if not changed:  # what no code reads (`__slotnames__`, which a copy of an instance adds)
        self._code = watched_again(code)
        return
    said = ", ".join(f"`{name}`" for name in changed[:6])
    kind = type(self.module).__qualname__
    one = len(changed) == 1
    if not code_changes(code):
        how = f"rebound in {'its module' if one else 'their modules'}"
    elif all(":" in name for name in changed):  # `module:name`: what a module holds
        how = "changed in place"
    else:
        how = "set on the class, added or deleted, or changed in place"
    how = f"{'was' if one else 'were'} {how}"
    raise RowsError(
        f"{said} {how} "
        f"after `cache_rows` cached the `{kind}`: its rows are keyed by its class, structure "
        "and weights, not its code, and the rows the old code computed, held in memory and "
        "kept in the store under the same keys, would be taken for the new code's. Make a "
        "new cache for it (`cache_rows(module, store, ...)`, after `cached.flush()`), which "
        "says the rows the old code kept drifted (`strict=True` computes them again), or set "
        "it back"
    )


def code_moved(self: CachedRows) -> list[str]:
    """What changed in the code of the module's classes since its rows were keyed
    (:func:`~somatize.catalog.code_changes`), else each global or helper of their modules
    their code reads rebound, where the fingerprint rows are kept under is no longer theirs
    (:func:`~somatize.catalog.names_rebound`: one defined again with the same code is no
    change). Worked out where the one comparison of the watch says no."""
    code = self._code
    return code_changes(code) or names_rebound(code, self._fingerprint)


@_one_at_a_time
def _settle(self: CachedRows, again: bool = False, thorough: bool = False) -> bool | None:
    """Digests the state again if any weight, buffer or submodule changed or was
    replaced (see :class:`~somatize_torch._state.StateWatch`), or if ``again``; a new
    state keys every row anew, and so does a new declaration under the same state (a
    part without weights replaced: `encoder.act = nn.Tanh()`). Returns None when
    nothing was looked at, else whether rows are keyed anew."""
    watch = self._watch
    # A conversion asked of another cache (or this one) since: the tensors' memory tells.
    conversion = _LAST_CONVERSION[0]
    seen = conversion is self._conversion
    # The module converted itself (`encoder.half()`, asked of no cache): its ends tell.
    thorough = thorough or not seen or (watch is not None and watch.ends_moved())
    if not again and watch is not None and not watch.changed(thorough):
        if not seen:
            self._conversion = conversion
        # The same weights; a setting given to the module since (`enc.temperature = 5.0`)
        # or a hook registered is in the declaration.
        if not self._node.declaration_moved():
            return None
        try:
            return _redeclared(self)
        except BaseException:
            # Stopped before the keyings of the old declaration were dropped (a Ctrl-C as it
            # is worked out): the next forward looks again, rather than key rows by it.
            self._node.look_at_settings_again()
            raise
    # With no watch (a conversion dropped it) every parameter is looked at: one made to
    # require grad before the conversion is unfrozen all the same.
    unfrozen = (
        watch.unfrozen(self.module)
        if watch is not None
        else [name for name, _ in trainable_parameters(self.module)]
    )
    if unfrozen:
        raise unfrozen_error(self.module, unfrozen)
    _share_registries(self, self.module)  # a registry the module made anew (`del encoder[1]`)
    # Tensors put in since (`load_state_dict(..., assign=True)`) keep a version counter,
    # or no later change to them could be seen.
    refuse_unseen_state(type(self.module).__name__, self.module)
    from somatize_torch.rows import _refuse_caches_inside  # rows imports this module

    _refuse_caches_inside(self.module)  # a part put in since, cached per row
    hold(self.module)  # a submodule put in since is held in eval too
    # Watched from before the digest: a change while it reads the weights is seen next.
    state, watch = watched_state(self.module)
    self._watch, self._conversion = watch, conversion
    # What the parts keep beside their weights is watched anew too, on the parts held now:
    # one put in since (`encoder[1] = bn`) is watched for a value set on it later.
    self._node.look_at_settings_again()
    try:
        if state != self._state:
            self._state = state
            self._node._smz.state = state
            _drop_keyings(self)
            # How the module lays out its answers may have changed with its weights' own
            # layout (converted to channels_last, or back): learned again.
            # Each table is emptied in place: a forward holds the one of its input's layout.
            with self._tiers_lock:
                for orders in self._orders.values():
                    orders.clear()
            # What it keeps beside its weights, watched from here: the batch computed
            # next is kept unless its forward changes that (_rowwise._still_keyed).
            self._node.declaration_moved()
            self.keyed_anew += 1
            return True
        # The same weights and buffers; what the watch saw may still be a part replaced
        # whose repr, settings or hooks are in the declaration, so that is said again too.
        self._node.declaration_moved()  # looked at whole now
        return _redeclared(self)
    except BaseException:
        # Stopped before the keyings of the old state or declaration were dropped (a Ctrl-C
        # as they are): the next forward digests again, rather than recall rows kept under
        # them for the weights or settings it found unchanged since this watch.
        self._watch = None
        raise


def code_watch(classes: tuple[type, ...], module: nn.Module) -> CodeWatch:
    """The watch a row cache takes of ``classes``, the code of ``module``
    (:func:`~somatize.catalog.watch_code`), taken again at once where an object their code
    reaches was marked anew as it was watched (a graph watched it and is gone, as the one
    ``cache_rows`` freezes the module by): that new mark is no change since the cache was
    made, and would have its first call refused as code changed; the fingerprint is worked
    out after it, with the new mark. The fingerprint is worked out before it too: the watch
    watches the names of their modules it looked up (a global rebound) only once it is."""
    fingerprint_of(*classes)
    code = watch_code(classes, keyed_with(module))
    if any(mark.anew for mark in code.marks):
        code = watched_again(code)
    return code


@_one_at_a_time
def _redeclared(self: CachedRows) -> bool:
    """Drops each keying whose prefix the module as it is now would not derive (its
    declaration changed); returns whether there was one. A config of a class not
    among those the cache was made with (set on the module since) has its class's code
    watched, and covered by the fingerprint rows are kept under, from now on."""
    classes = classes_of(self.module)
    if set(classes) != set(self._classes):
        self._classes = classes
        self._code = code_watch(classes, self.module)
        self._fingerprint = fingerprint_of(*classes)
        if self._writer is not None:
            self._writer.fingerprint = self._fingerprint
    stale = [tag for tag, keying in self._keyings.items() if _prefix(self, tag) != keying.prefix]
    _drop_keyings(self, stale)
    if stale:
        self.keyed_anew += 1
    return bool(stale)


def _row_ids(
    self: CachedRows, x: torch.Tensor | DeferredRows, index: torch.Tensor | None
) -> list[Any]:
    """What names each row within one keying: its content digest, or its index."""
    if isinstance(x, DeferredRows):
        rows: list[Any] = x.index.tolist()
        return rows
    if self.key_mode == "content":
        named = _take_named(self, x)
        return named if named is not None else raw_rows(x)
    if index is None:
        raise NeedsIndex(
            "this cache keys rows by sample index (key='index'), and was called without "
            "one: call it as `cached(x, index=idx)`, with the indices the Dataset's "
            "__getitem__ was given (return them from it beside the sample)"
        )
    if (
        not isinstance(index, torch.Tensor)
        or index.is_meta  # no indices to read; sparse ones are read as no dense tensor is
        or index.layout != torch.strided
        or index.dim() != 1
        or index.is_floating_point()
        or index.is_complex()
        or index.dtype == torch.bool  # True would name sample 1: a mask is no index
    ):
        raise NeedsIndex(
            "index= is a 1-d integer tensor of sample indices, one per row; got "
            f"{_describe(index)}{_index_from(index)}"
        )
    if index.shape[0] != x.shape[0]:
        raise NeedsIndex(
            f"index= has {index.shape[0]} indices for a batch of {x.shape[0]} rows; each "
            "row needs the index of its own sample"
        )
    ids: list[Any] = index.tolist()
    if ids and min(ids) < 0:
        raise NeedsIndex(
            f"index= holds {min(ids)}: indices name samples by their place in the dataset, "
            "from 0 (-1 would name the last one as the dataset stands, and another when it "
            "grows)"
        )
    if len(set(ids)) < len(ids):
        _check_repeats(x, ids)
    return ids


def _index_from(index: Any) -> str:
    """How to make an index= tensor of ``index``, a list or tuple: of integers, a tensor of
    them; of names (the string keys a webdataset's samples carry), none, since a name is no
    place in a dataset. Empty for anything else."""
    if not isinstance(index, (list, tuple)) or not index:
        return ""
    if all(isinstance(i, int) and not isinstance(i, bool) for i in index):
        return " of integers: hand `torch.tensor(index)`"
    if any(isinstance(i, str) for i in index):
        return (
            " of names: a sample's name (a webdataset's `__key__`) is no place in a dataset. "
            "Hand each sample's place in it, or key rows by content (`key='content'`, the "
            "default)"
        )
    return ""


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
    # Compared as bytes: the same sample loaded twice is the same bytes, NaN and all,
    # while a zero and a negative zero (or two NaNs of other bits) are equal as values
    # and still two inputs a module may tell apart (1/x).
    a = _row_bytes(x[torch.tensor(again, device=x.device)])
    b = _row_bytes(x[torch.tensor(was, device=x.device)])
    bad = (a != b).any(1).nonzero().flatten().tolist()
    if not bad:
        return
    p = again[bad[0]]
    raise NeedsIndex(
        f"index= names sample {ids[p]} at rows {first[ids[p]]} and {p} of one batch, and "
        "their inputs differ: an index must name one input, or the answer computed for one "
        "row is recalled for the other. Pass the samples' indices in the dataset (return "
        "them from the Dataset's __getitem__, and to prefill as a dict's `index` or "
        "through inputs=; the labels of an (x, y) loader are not indices). Inputs drawn at "
        "random (an augmentation) are not named by their index either: key them by content "
        "(key='content')"
    )


def _row_bytes(rows: torch.Tensor) -> torch.Tensor:
    """The bytes of each of ``rows`` (a fresh tensor, from indexing), one row each; of the
    values a quantized row holds, whose own bytes some torch releases view as bytes that
    crash the process when read."""
    if rows.is_quantized:
        rows = rows.dequantize()
    if rows.is_complex():
        rows = torch.view_as_real(rows)
    # Flat rows before the bytes: torch calls rows contiguous whatever the strides of their
    # dims of size 1 (channels_last maps pooled to 1x1), and views bytes only at stride 1.
    return rows.contiguous().reshape(rows.shape[0], -1).view(torch.uint8)
