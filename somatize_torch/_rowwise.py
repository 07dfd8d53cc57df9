"""Running the module on the rows found nowhere, and the check that it answers each alone.

What the module returns for a sub-batch is kept and recalled row by row, so it
must be rows: one dense tensor, one row per input row, of a dtype a store keeps.
And a row's answer must be the row's alone. Where a keying first computes rows,
the first and last of them are run again, each alone: a module whose answer for a
row depends on the other rows of its batch (attention along dimension 0) is
refused (:class:`~somatize_torch.rows.NotRowwise`), since an answer kept from one
batch would be recalled in another. Alone and in a batch, a row goes through
kernels that round differently, so the two answers are compared within what
rounding allows (:func:`_rounding`, :func:`_difference`), not for equality.

Nor may the module write into the rows it is handed (`x.mul_(2)`, an
``nn.ReLU(inplace=True)`` as its first part, centring in place): it is handed the
caller's batch only where every row is computed, a copy of the rows it computes
where others are recalled, and nothing where all are, so the caller would see its
batch written in one epoch and not in the next. Every run is watched
(:func:`_answer`), and a write refused before anything of its batch is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from somatize.errors import SomatizeError
from somatize_torch._errors import CachedInputNeedsGrad
from somatize_torch._precision import float32_precision, reduced
from somatize_torch._row_calls import _run
from somatize_torch._row_codec import batch_order, laid_out
from somatize_torch._row_errors import NotRowwise, RowsError, _describe
from somatize_torch._row_keys import _floating_dtypes, _Keying, code_moved, given_holds
from somatize_torch._state import StateWatch
from somatize_torch.codec import TENSOR
from somatize_torch.deferred import DeferredRows
from somatize_torch.digest import DTYPES
from somatize_torch.freeze import (
    check_still,
    drew_as_it_ran,
    drew_at_random,
    generator_states,
    part_tables,
)

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows


def _compute(
    self: CachedRows,
    x: torch.Tensor | DeferredRows,
    positions: list[int],
    keying: _Keying,
    watch: StateWatch | None,
) -> torch.Tensor:
    """The module's answer on the rows of ``x`` at ``positions``; where the keying does not
    know yet that the module answers each row alone, its first and last rows are checked
    (:func:`_check_rowwise`)."""
    module = self.module
    if not _in_eval(self):  # one flag a part, not a walk naming every part, at each batch
        check_still(type(module).__name__, module)
    if isinstance(x, DeferredRows):
        sub = x.load(positions, as_given=given_holds(self, x, keying.version))
        if sub.dtype != keying.dtype:
            sub = sub.to(keying.dtype)
    else:
        sub = _picked(x, positions)
    # Taken before the forward, which may write into its input.
    ends = sub[:: len(positions) - 1].clone() if not keying.rowwise and len(positions) > 1 else None
    alike = ends is not None and _copies_of_one(sub)
    tables = _listed(self)[2]  # the parts' tables, looked through for generators they hold
    generators = generator_states(module, sub, tables)
    out: torch.Tensor = _answer(self, sub, ends, handed=sub is x)
    _check_answer(self, out, len(positions), sub.dim())
    # A draw from torch's generator (a VAE's encoder sampling its latents) would be
    # recalled: a row run alone, or one whose draw moves it less than rounding allows, is
    # not told apart by the check below. Rows not computed as they were keyed (a part put
    # in train mode meanwhile, a count the module keeps moved) are kept nowhere: computed
    # again or answered once (`_run`, `_recall_or_run`), whatever they drew.
    keyed = functools.partial(_still_keyed, self, watch)
    again = functools.partial(_answer, self)
    if drew_as_it_ran(module, sub[:1], generators, again, keyed, tables) and keyed():
        raise RowsError(
            drew_at_random(
                f"`{type(module).__name__}` is cached per row",
                "each row's answer",
                "the cache and call the module itself (`cached.module`)",
            )
        )
    if ends is not None:
        # A copy of the answer, taken before the module runs again: one that writes
        # into a buffer it keeps and answers with a view of it (a CUDA graph, a
        # preallocated output) answers each row alone into that very buffer. The copy
        # is what is compared, kept and returned — once per keying.
        out = out.clone()
        _check_rowwise(self, ends, out, keying, watch, alike)
    if len(positions):
        _same_answers(self, out, keying, watch)
    return out


def _picked(x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """The rows of the batch ``x`` at ``positions``: ``x`` itself where they are all of it.
    Picked rows come in C order where the batch's own dim lies inside its memory (a batch
    transposed): laid out as the batch is, the module answers them as it answers the
    batch, and that is the layout learned for rows recalled."""
    if len(positions) == x.shape[0]:
        return x
    picked = x[torch.tensor(positions, dtype=torch.long, device=x.device)]
    return laid_out(picked, batch_order(x))


def answered_for_layout(self: CachedRows, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """The module's answer on the rows of ``x`` at ``positions``, run once only to see how
    it lays out its answer for inputs laid out as ``x``: neither kept nor returned, so
    not checked row by row (its first computed batch is), which would run it twice more."""
    sub = _picked(x, positions)
    out: torch.Tensor = _answer(self, sub, handed=sub is x)
    _check_answer(self, out, len(positions), sub.dim())
    return out


def _same_answers(
    self: CachedRows, rows: torch.Tensor, keying: _Keying, watch: StateWatch | None
) -> None:
    """Refuses a module that answers rows of another shape or dtype than those it answered
    before under ``keying`` (inputs of one shape and dtype, one state, one precision):
    rows computed now (``watch`` given), or recalled from the store. A module answering
    each row alone answers every row of such inputs alike, whatever its batch holds; one
    whose answer is as long as its batch's longest sequence (run only that far) passes
    the check of its first batch where both rows run again alone are the longest, and
    the rows kept from that batch would be recalled, too long, in batches of shorter
    ones. The keying is refused from then on (:attr:`_Keying.mixes`), recalled rows and
    all; a new state or declaration keys the rows anew."""
    answers = (rows.shape[1:], rows.dtype)
    if keying.answers is None:
        keying.answers = answers
        return
    if answers == keying.answers or keying.mixes is not None:
        return
    if watch is not None and not _still_keyed(self, watch):
        return  # run with other weights than the rows keyed: kept nowhere
    (shape, dtype), kept = answers, keying.answers
    keying.mixes = (
        f"`{type(self.module).__name__}` answered rows of {list(kept[0])} {kept[1]} for "
        f"inputs of one shape and dtype, and of {list(shape)} {dtype} for other inputs of "
        "that shape and dtype in another batch, under the same weights and settings: its "
        "answer for a row depends on the other rows of its batch (it runs as far as the "
        "batch's longest sequence, say), so a row kept from one batch would be recalled "
        "in another, wrongly. Nothing of that batch was kept, and no batch of such inputs "
        "is answered by this cache any more, its rows recalled or not (a module converted "
        "in place, `encoder.half()`, answers so too: `cached.redeclare()` sees that). "
        "Cache it per batch (`somatize.torch.wrap(module, frozen=True, cached=True)`), or "
        "have it answer rows of one shape whatever its batch holds (pad to a fixed length)"
    )
    raise NotRowwise(keying.mixes)


def _answer(
    self: CachedRows, rows: torch.Tensor, ends: torch.Tensor | None = None, handed: bool = False
) -> Any:
    """The module's answer on ``rows`` (``handed``: the batch the cache was handed itself),
    run without gradients; a module that wrote into ``rows`` as it ran is refused
    (:func:`_refuse_writing`). The write is seen by their version counter; an inference
    tensor keeps none (one made under ``torch.inference_mode``), and is seen written only
    where its rows are checked, by its first and last rows' bytes against ``ends``, their
    copy taken before the run."""
    version = None if rows.is_inference() else rows._version
    with torch.no_grad():
        out = _run(self.module, rows)
    if version is not None:
        written = rows._version != version
    elif ends is not None:
        now, before = _bits(rows[:: len(rows) - 1]), _bits(ends)
        written = now is not None and before is not None and not torch.equal(now, before)
    else:
        written = False
    if written:
        _refuse_writing(self, handed)
    return out


def _refuse_writing(self: CachedRows, handed: bool) -> NoReturn:
    batch = "was written" if handed else "is as it was: the module ran on a copy of rows of it"
    raise RowsError(
        f"`{type(self.module).__name__}` wrote into the rows it was handed, in place, as it "
        "ran (`x.mul_(2)`, an `nn.ReLU(inplace=True)` as its first part, centring in "
        "place): a cache per row hands it the batch itself only where it computes every "
        "row, a copy of the rows it computes where it recalls others, and nothing where it "
        "recalls them all, so what reads the batch after the call would find it written in "
        "one epoch and not in the next. Nothing of this batch was kept, and the batch "
        f"handed to the cache {batch}. Have the module write into a copy (`x = x.clone()` "
        "before writing into it, or `inplace=False`), or call the module itself"
    )


def _copies_of_one(rows: torch.Tensor) -> bool:
    """Whether every row of ``rows`` holds the bytes of the first (a sample drawn again and
    again, a batch of zeros run to warm up): compared once per keying, where rows are
    checked. Rows whose bytes torch cannot view are taken as other rows, as they were
    before copies were told apart."""
    bits = _bits(rows)
    if bits is None:
        return False
    bits = bits.reshape(len(rows), -1)
    return bool((bits == bits[:1]).all())


def _bits(rows: torch.Tensor) -> torch.Tensor | None:
    """The bytes of ``rows`` (as torch lays them out in C order); None where torch cannot
    view them as bytes: a quantized batch, which some torch releases view as bytes that
    crash the process when read, or another it refuses to view."""
    if rows.is_quantized:
        return None
    try:
        return rows.resolve_conj().resolve_neg().contiguous().view(torch.uint8)
    except RuntimeError:
        return None


def _check_records_none(self: CachedRows, x: torch.Tensor, keying: _Keying) -> bool:
    """Refuses a batch that requires grad, taken where no gradient is recorded (under
    ``torch.no_grad()``), for a module that records one anyway, turning gradients on
    inside its forward: its own answer would carry the batch's gradient, and a recalled
    row carries none. Its first row is run once per keying to see, whether the batch's
    rows are then recalled or computed. True where, instead,
    :attr:`CachedRows.when_input_needs_grad` put the module back uncached, to answer the
    batch itself."""
    if keying.records_none or x.shape[0] == 0:
        return False
    module = self.module
    check_still(type(module).__name__, module)
    # A copy: a module that writes into its input (centring it in place) is refused here
    # (`_answer`), the batch left as it was handed.
    row = x[:1].detach().clone().requires_grad_()
    try:
        out = _answer(self, row)
    except SomatizeError:
        raise
    except Exception as error:
        _refuse_alone(self, "first", x.shape[0], error)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        if self._put_back_for(
            "requires grad, and it turns gradients on inside its forward (under "
            "`torch.no_grad()` too)"
        ):
            return True
        raise CachedInputNeedsGrad(
            f"`{type(module).__name__}` is cached per row and turns gradients on inside its "
            "forward: handed a batch that requires grad, even under `torch.no_grad()`, it "
            "answers with that batch's gradient, and a recalled row is a leaf, so whatever "
            "produced the batch would train on misses and silently stop on hits. Hand it "
            "`x.detach()`, or call the module itself"
        )
    keying.records_none = True
    return False


def _check_answer(self: CachedRows, out: Any, rows: int, dims: int) -> None:
    """Refuses an answer that cannot be kept and recalled row by row (handed ``rows`` rows,
    a batch of ``dims`` dimensions)."""
    module = self.module
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != rows:
        # A loader handing samples one at a time (`batch_size=None`) hands no batch: the
        # cache took the sample's first dimension for its rows.
        values = " of one value each" if dims == 1 else ""
        raise NotRowwise(
            f"`{type(module).__name__}` was handed {rows} rows{values} and returned "
            f"{_describe(out)}: a module cached per row must return one tensor with one row "
            f"per input row (batch along dimension 0). {_instead_of(out, rows, dims)}"
        )
    if type(out) is not torch.Tensor:
        raise NotRowwise(
            f"`{type(module).__name__}` returned a `{type(out).__qualname__}`, a subclass of "
            "`torch.Tensor`: rows are kept and gathered as plain tensors, so a row recalled "
            "would come back without its class and what it carries. Return a plain one "
            "(`out.as_subclass(torch.Tensor)`; `out.detach()` for a parameter)"
        )
    if out.requires_grad:
        raise RowsError(
            f"`{type(module).__name__}` answered rows that require grad, from a batch that "
            "requires none: it turns gradients on inside its forward and answers through "
            "a tensor it holds that requires grad, which is none of its parameters (those "
            "are frozen). A recalled row is a leaf, so that tensor would train on misses "
            "and silently stop on hits. Freeze it (`requires_grad_(False)`), or make it a "
            "parameter, or call the module itself to train it"
        )
    if out.layout != torch.strided:
        raise NotRowwise(
            f"`{type(module).__name__}` returned a {out.layout} tensor: rows are kept and "
            "gathered as dense tensors. Return `out.to_dense()`"
        )
    if out.dtype not in DTYPES:
        # Nor can a memory tier: torch copies no rows of them into its banks.
        kept = ", ".join(sorted(str(dtype).removeprefix("torch.") for dtype in DTYPES))
        raise RowsError(
            f"`{type(module).__name__}` returned rows of {out.dtype}, which a store cannot "
            f"keep, nor a memory tier hold (they keep {kept}). Return a dtype they keep "
            "(`out.dequantize()` for quantized rows; packed ones viewed as bytes, "
            "`out.view(torch.uint8)`), or call the module itself"
        )


def _instead_of(out: Any, rows: int, dims: int) -> str:
    """What to do instead of caching per row a module that answered ``out`` for ``rows``
    rows (a batch of ``dims`` dimensions), no tensor of one row per input row."""
    if dims == 1:
        return (
            "Where that was one sample, not a batch (a DataLoader with `batch_size=None` "
            "hands samples one at a time), hand batches of them (`DataLoader(..., "
            "batch_size=64)`, or `x.unsqueeze(0)` for one sample). Else cache the module "
            f"per batch ({_WRAP})"
        )
    if isinstance(out, torch.Tensor):
        # A batch of one row answered with no row of its own most likely lost the batch's
        # dimension to a `squeeze()`, which caching per batch would not mend.
        return (
            f"{_SQUEEZE}. Otherwise {_PER_BATCH[0].lower()}{_PER_BATCH[1:]}"
            if rows == 1
            else _PER_BATCH
        )
    if isinstance(out, (tuple, list, dict)) or dataclasses.is_dataclass(out):
        # An answer of many tensors (Hugging Face's `ModelOutput`): the one tensor wanted
        # is cached per row, and the whole only where the store gives it back as it was.
        whole = f", or cache it whole, per batch ({_WRAP})"
        return (
            "Cache per row a module answering the one tensor wanted of it (a forward "
            "returning `encoder(x).last_hidden_state` or `encoder(x)[0]`)"
            + (whole if TENSOR.refusal(out) is None else "")
        )
    return _PER_BATCH


_WRAP = "`somatize.torch.wrap(module, frozen=True, cached=True)`"
_PER_BATCH = f"Cache it per batch instead ({_WRAP})"


def _check_rowwise(
    self: CachedRows,
    ends: torch.Tensor,
    out: torch.Tensor,
    keying: _Keying,
    watch: StateWatch | None,
    alike: bool = False,
) -> None:
    """Refuses a module whose answer for a row depends on the other rows of its batch
    (attention or a recurrence along dimension 0, statistics of the batch): an answer
    kept from one batch would be recalled in a batch of other rows. Its first and last
    rows (``ends``) are run again, each alone, and compared with their rows in the
    batch — once per keying, so it costs two forwards of one row where a keying first
    computes rows. Both ends: along a recurrence or causal attention the last row sees
    the others, along a reversed one the first does. Kernels round differently for a
    batch of another size, so the two are compared within what rounding at the
    precision the module runs in allows. A batch of copies of one row (``alike``) is
    checked so too, but a module that answers a copy as it answers the row alone (a
    mean over the batch taken off, attention along dimension 0) may answer a batch of
    other rows otherwise: the keying is not taken as answering each row alone."""
    limit = _rounding(self, ends, out)
    for which, at in (("first", 0), ("last", len(out) - 1)):
        try:
            # A row of its own, not a view of `ends`: a module called on a batch gets a
            # tensor that is no view, and may detach it in place (`x.detach_()`), which
            # torch refuses on a view.
            alone = _answer(self, ends[min(at, 1) : min(at, 1) + 1].clone())
        except (SomatizeError, torch.cuda.OutOfMemoryError):
            # Out of memory is the device's state, not the module's way with rows: a loop
            # catching it (to run the batch again in halves) is handed it as it was raised.
            # (`torch.OutOfMemoryError` on a torch that has it; the name under `torch.cuda`
            # is the one every torch this library supports has.)
            raise
        except Exception as error:
            # It answered the batch, so what it cannot do is answer a row on its own.
            _refuse_alone(self, which, len(out), error)
        row = out[at : at + 1]
        reshaped = _reshaped(alone, row)
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
        if not _still_keyed(self, watch):
            return  # run with other weights than the batch: nothing seen, looked at again
        if _squeezed(alone, row):
            _refuse_squeezed(self, which, len(out), got)
        _refuse_mixing(self, which, len(out), got, reshaped)
    if not alike:
        keying.rowwise = True


def _check_kept(
    self: CachedRows,
    x: torch.Tensor | DeferredRows,
    near: Sequence[Hashable],
    positions: list[int],
    keying: _Keying,
    watch: StateWatch | None,
) -> None:
    """Checks that the module answers each row alone (:func:`_check_rowwise`) on a batch of
    two rows or more of which at most one is to run, where the keying kept rows before it
    knew: rows run in a batch of one row, or of copies of one, which a module that mixes
    rows answers as it answers them alone, and which would be recalled beside other rows
    as though answered among them. Two of the batch's rows are run together, and each
    alone, once, as the check of rows computed would run them; a module that mixes rows
    is refused (:class:`~somatize_torch.rows.NotRowwise`) before any is answered."""
    first: dict[Hashable, int] = {}
    for at in positions:
        first.setdefault(near[at], at)
    if len(first) > 1:
        return  # two rows or more run: they are checked as they run
    for at, row in enumerate(near):
        first.setdefault(row, at)
    if len(first) > 1:
        _compute(self, x, list(first.values())[:2], keying, watch)


def _still_keyed(self: CachedRows, watch: StateWatch | None) -> bool:
    """Whether the module that computed rows is the one they were keyed under: its weights
    (``watch``) not changed, replaced or converted meanwhile (by another thread: a
    checkpoint loaded into a module a server calls), and every part still in eval (none
    put in train mode by another thread, a part without weights too: a Dropout). Rows
    computed with other weights are answered and kept nowhere, since under their keys
    they would be recalled for the weights keyed; rows computed with a part in train mode
    are computed again (:mod:`somatize_torch._row_lookup`). Rows computed as the module
    changed what it keeps beside its weights (a table it fills as it first runs, a count
    of its calls: :meth:`~somatize_torch.freeze.ModuleNode.changed_as_it_ran`) are kept
    nowhere either: a recall would not make the change, and the next batch is keyed by
    what it keeps then. So are rows computed while
    the code of its classes moved (a method set on one by another thread, for a while):
    they are the new code's, and would be recalled as the code's they were keyed by once
    it is set back, where the next forward refuses the cache while it stays."""
    return (
        watch is not None
        and self._watch is watch
        and not watch.changed()
        and not self._node.changed_as_it_ran()
        and _in_eval(self)
        and _code_unmoved(self)
    )


def _code_unmoved(self: CachedRows) -> bool:
    """Whether the code of the module's classes is what it was when its rows were keyed
    (:func:`~somatize_torch._row_keys._code_as_cached` looked then): one comparison made
    in C, and, where it says no, what changed worked out, as there (a value the classes'
    own code set on one of them as it ran is its state, not its code, and a helper defined
    again with the same code no change)."""
    return self._code.looks_same() or not code_moved(self)


def _in_eval(self: CachedRows) -> bool:
    """Whether every part of the module is in eval. The parts are listed once per state
    watch, which is made anew whenever a part is put in, taken out or replaced, so this
    reads one flag per part, from each part's table of attributes; a class of its own
    that keeps the flag elsewhere (a property) is asked."""
    try:
        return not any(map(_TRAINING, _listed(self)[1]))
    except KeyError:
        return not any(part.training for part in self.module.modules())


def _listed(
    self: CachedRows,
) -> tuple[StateWatch | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """The module's parts as listed under the state watch now: the table of attributes of
    each part, and of what each stands for (:func:`~somatize_torch.freeze.part_tables`,
    looked through for generators at each computed call). Listed anew with each watch,
    which is made anew whenever a part is put in, taken out or replaced; the tables are the
    parts' own, so an attribute set on a part since is read in them."""
    watch = self._watch
    parts = self._parts
    if parts is None or parts[0] is not watch:
        module = self.module
        parts = self._parts = (
            watch,
            [vars(part) for part in module.modules()],
            part_tables(module),
        )
    return parts


_TRAINING = operator.itemgetter("training")


def _refuse_alone(self: CachedRows, which: str, rows: int, error: Exception) -> NoReturn:
    raise NotRowwise(
        f"`{type(self.module).__name__}` cannot answer a row alone: the {which} of {rows} "
        f"rows, run again on its own, raised {type(error).__name__}: {error}. A module that "
        "answered the batch and fails on one of its rows most likely answers a row by the "
        "other rows of its batch (statistics of the batch: a BatchNorm with "
        "track_running_stats=False, a normalisation over dimension 0), so an answer kept "
        "from one batch would be recalled in a batch of other rows, wrongly. A module "
        "cached per row answers each row on its own: keep running statistics, or cache "
        "it per batch (`somatize.torch.wrap(module, frozen=True, cached=True)`)"
    ) from error


def _reshaped(alone: Any, row: torch.Tensor) -> bool:
    """Whether ``alone``, a row's answer alone, is one row as ``row`` is, in another shape:
    the shape of a row's answer follows its batch (a text encoder run only as far as its
    batch's longest sequence), which no order of the batch's dimensions changes."""
    return (
        isinstance(alone, torch.Tensor)
        and alone.dim() == row.dim()
        and alone.shape[:1] == row.shape[:1]
        and alone.shape != row.shape
    )


def _squeezed(alone: Any, row: torch.Tensor) -> bool:
    """Whether ``alone``, a row's answer alone, is ``row`` without the batch's dimension:
    a ``squeeze()`` naming no dimension drops it from a batch of one row, and only there."""
    return isinstance(alone, torch.Tensor) and alone.shape == row.shape[1:]


_SQUEEZE = (
    "A `squeeze()` naming no dimension drops the batch's dimension from a batch of one "
    "row: squeeze only the dimensions meant (`out.squeeze(-1)`, `out.flatten(1)`)"
)


def _refuse_squeezed(self: CachedRows, which: str, rows: int, got: str) -> NoReturn:
    raise NotRowwise(
        f"`{type(self.module).__name__}` answers a batch of one row without the batch's "
        f"dimension: the {which} of {rows} rows, run again on its own, came back with "
        f"{got}. A module cached per row answers one row per input row, a batch of one "
        f"too. {_SQUEEZE}"
    )


def _refuse_mixing(self: CachedRows, which: str, rows: int, got: str, reshaped: bool) -> None:
    if reshaped:
        why = (
            "The shape of its answer for a row follows its batch (it runs as far as the "
            "batch's longest sequence, say)"
        )
        instead = (
            "have it answer rows of one shape whatever its batch holds (pad to a fixed "
            "length, and answer for every place)"
        )
    else:
        why = "Its answer for a row depends on the other rows of its batch"
        instead = "put the batch first (`batch_first=True` for a transformer layer or an RNN)"
    raise NotRowwise(
        f"`{type(self.module).__name__}` answers a row differently alone than in a batch: "
        f"the {which} of {rows} rows, run again on its own, came back with {got}. "
        f"{why}, so an answer kept from one batch would be recalled "
        "in a batch of other rows, wrongly. A module cached per row takes rows along "
        f"dimension 0 and answers each on its own: {instead}, or cache it per "
        "batch (`somatize.torch.wrap(module, frozen=True, cached=True)`). A module that "
        "draws at random as it runs (sampling noise, dropout kept on) answers no row the "
        "same way twice, and cannot be cached at all"
    )


def _rounding(self: CachedRows, row: torch.Tensor, out: torch.Tensor) -> float:
    """How far apart (relative to its size) one row computed in batches of two sizes
    may be: a thousandth, or 16 units in the last place of the least precise
    floating dtype the rows run in — the input's, the output's, the weights', the
    autocast dtype, and TF32 or bfloat16 where float32 products may use them. A
    float8 is only stored, never computed in: a value is rounded into it once, so it
    allows 2 units (one either side of a rounding boundary); 16 of its units would be
    more than any two answers can differ by."""
    device = out.device.type
    dtypes = {row.dtype, out.dtype, *_floating_dtypes(self.module)}
    if torch.is_autocast_enabled(device):
        dtypes.add(torch.get_autocast_dtype(device))
    floating = [dtype for dtype in dtypes if dtype.is_floating_point or dtype.is_complex]
    eps = max((torch.finfo(dtype).eps for dtype in floating if dtype.itemsize > 1), default=0.0)
    stored = max((torch.finfo(dtype).eps for dtype in floating if dtype.itemsize == 1), default=0.0)
    products = reduced(float32_precision(device))
    if products == "bf16":
        eps = max(eps, 2.0**-7)  # bfloat16 products
    elif products == "tf32" or device != "cpu":
        eps = max(eps, 2.0**-10)  # TF32 products (cuDNN allows them by default)
    return max(1e-3, 16 * eps, 2 * stored)


def _difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """How far ``a`` is from ``b``, relative to their size (the norm of the difference over
    the larger norm); infinite where their non-finite values or integer values differ."""
    if not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else math.inf
    if a.dtype.itemsize == 1:
        # float8: torch tests none for finiteness; float32 holds each value exactly.
        a, b = a.float(), b.float()
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)):
        return math.inf
    if not bool(finite.all()):
        if not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a[a.isinf()], b[b.isinf()]):
            return math.inf
        a, b = a.where(finite, 0), b.where(finite, 0)
    if a.is_complex():
        # A conjugate view (`.conj()`) holds the unconjugated values, which view_as_real
        # refuses to read as its values: they are made first.
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    a, b = a.double(), b.double()
    # Scaled by the largest magnitude first, so that neither the norms nor the difference
    # overflow (or vanish) for values far from 1.
    scale = max(float(a.abs().max()), float(b.abs().max())) if a.numel() else 0.0
    if not scale:
        return 0.0
    a, b = a / scale, b / scale
    size = max(float(a.norm()), float(b.norm()))
    return float((a - b).norm()) / size if size else 0.0
