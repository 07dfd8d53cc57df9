"""What a row-cached module is called with: a batch (by place, or by the name the module's
forward gives its input, as a text encoder is called: ``cached(input_ids=ids)``), and its
samples' indices where rows are keyed by them. Anything else is refused, but None to a
parameter whose default is None (``attention_mask=None``): that is the call without it
(:func:`_defaults_left_out`).

A row is keyed by its input alone (or by its index), so nothing else may reach the
module: an argument beside the batch (``encoder(x, mask)``, ``encoder(x, scale=2)``)
would be in no key, and answers computed with one value of it would be recalled for
another. :func:`_check_call` refuses one before anything is looked up, saying what to
do instead. It refuses as well a call that does not fit how rows are keyed: ``index=``
to a cache keyed by content (it would be ignored), or to a module whose forward takes
``index`` itself (it would answer without it), a batch from
:class:`~somatize_torch.deferred.Deferred` to one keyed by content (such a batch names
its rows by index and loads inputs only for those computed) or with ``index=`` beside
it (it carries its own), and anything but a batch tensor — a subclass of
``torch.Tensor`` too (a row is keyed by its content, never its class); a frozen
``nn.Parameter`` is handed on as its values. A batch that requires grad
is refused too: a recalled row is a leaf, so whatever produced the batch would train
on misses and silently stop on hits.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import DataParallel
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import PackedSequence

from somatize_torch._errors import gradient_cut, in_a_transform
from somatize_torch._row_errors import (
    NeedsIndex,
    NotRowwise,
    RowsError,
    _describe,
    is_numpy_array,
)
from somatize_torch.deferred import DeferredRows
from somatize_torch.digest import plain
from somatize_torch.wrap import CachedInputNeedsGrad

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows


def _named_batch(self: CachedRows, more: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The batch handed by the name the module's forward gives its input
    (``cached(input_ids=ids)``, as a text encoder is called), and the arguments beside it,
    which :func:`_check_call` refuses; a call naming no such input is refused here."""
    name = _input_name(self.module)
    if name is None or name not in more:
        given = ", ".join(f"`{k}=`" for k in more)
        by_name = f" or by the name its forward gives it (`{name}=`)" if name else ""
        raise RowsError(
            f"`{type(self.module).__name__}` is cached per row and was called with {given} "
            f"and no batch: hand it its batch by place (`cached(x)`){by_name}, and "
            "nothing beside it"
        )
    rest = dict(more)
    return rest.pop(name), rest


def _defaults_left_out(
    module: torch.nn.Module, beside: tuple[Any, ...], more: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``beside`` and ``more`` less the arguments that are None where the parameter of the
    module's forward they go to defaults to None (``attention_mask=None``, as a caller with
    no mask writes): the call is the very call without them. Any other is left for
    :func:`_check_call` to refuse."""
    if all(value is not None for value in (*beside, *more.values())):
        return beside, more
    try:
        parameters = list(inspect.signature(_forward_of(module)).parameters.values())[1:]
    except (TypeError, ValueError):
        return beside, more
    by_name = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    more = {
        name: value
        for name, value in more.items()
        if not (value is None and name in by_name and by_name[name].default is None)
    }
    by_place = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kept = len(beside)  # only those last may be left out: the rest keep their places
    while 0 < kept <= len(by_place) and beside[kept - 1] is None:
        if by_place[kept - 1].default is not None:
            break
        kept -= 1
    return beside[:kept], more


def _input_name(module: torch.nn.Module) -> str | None:
    """The name ``module``'s forward gives its first input, where a call may give it by
    name; None where its signature cannot be read or names none so."""
    first = _first_input(module)
    if first is None or first.kind not in (first.POSITIONAL_OR_KEYWORD, first.KEYWORD_ONLY):
        return None
    return first.name


def _first_input(module: torch.nn.Module) -> inspect.Parameter | None:
    """The first parameter of ``module``'s forward; None where it has none, or its
    signature cannot be read."""
    return _read(module)[0]


def _takes_index(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward takes an argument named ``index`` beside its input
    (named so as its input, ``forward(self, index)``, it is handed the batch there)."""
    return _read(module)[1]


_Read = tuple[inspect.Parameter | None, bool]

# What each forward's signature says (:func:`_read`), by its function: read once, not at
# every call handed ``index=`` or every batch computed. A forward replaced later (another
# function) is read anew.
_READ: weakref.WeakKeyDictionary[Any, _Read] = weakref.WeakKeyDictionary()


def _read(module: torch.nn.Module) -> _Read:
    """The first parameter of the forward that answers a call of ``module`` (None where it
    has none, or its signature cannot be read), and whether it takes ``index`` beside it."""
    forward = _forward_of(module)
    function = forward.__func__ if inspect.ismethod(forward) else None
    try:
        found = _READ.get(function) if function is not None else None
    except TypeError:  # a function that no weak reference can hold is read every time
        function = None
        found = None
    if found is None:
        found = _signature_of(forward)
        if function is not None:
            _READ[function] = found
    return found


def _signature_of(forward: Any) -> _Read:
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None, False
    takes = any(
        p.name == "index" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        for p in parameters[1:]
    )
    return (parameters[0] if parameters else None), takes


def _forward_of(module: torch.nn.Module) -> Any:
    """The forward that answers a call of ``module``: seen through ``torch.compile``'s
    wrapper and torch's ``DataParallel`` and ``DistributedDataParallel``, whose forward
    takes ``(*args, **kwargs)`` and hands them on to the module they wrap as they came."""
    while True:
        inner = module._modules.get("_orig_mod")
        if inner is not None and type(module).__name__ == "OptimizedModule":
            module = inner
        elif isinstance(module, (DataParallel, DistributedDataParallel)):
            module = module.module
        else:
            return module.forward


def _run(module: torch.nn.Module, x: torch.Tensor) -> Any:
    """``module``'s answer on the batch ``x``: handed by place, or by name where its forward
    takes its input by name only (``forward(self, *, pixel_values)``), which a batch
    handed by place would not reach."""
    first = _first_input(module)
    if first is not None and first.kind is first.KEYWORD_ONLY:
        return module(**{first.name: x})
    return module(x)


def _check_call(
    self: CachedRows,
    x: torch.Tensor | DeferredRows | None,
    beside: tuple[Any, ...],
    index: torch.Tensor | None,
    more: dict[str, Any],
) -> None:
    """Refuses a call of the cache with ``x``, ``index=`` and the arguments ``beside`` and
    ``more`` that it cannot answer row by row; see the module docstring."""
    if beside or more:
        given = [f"`{k}=`" for k in more]
        if beside:
            count = len(beside)
            given.insert(0, f"{count} positional argument{'s' if count > 1 else ''}")
        raise RowsError(
            f"`{type(self.module).__name__}` is cached per row and was called with "
            f"{' and '.join(given)} beside its batch: a row is keyed by its input alone (or "
            "its index), so nothing else can reach the module — answers computed with one "
            f"value would be recalled for another. {_keep_beside(x, beside, more)}; sample "
            "indices go as `index=`"
        )
    if index is not None and self.key_mode != "index":
        raise RowsError(
            f"`{type(self.module).__name__}` is cached per row keyed by content and was "
            "called with index=: each row is named by the digest of its input, so an index "
            "would be ignored. Call it as `cached(x)`, or key rows by sample index "
            "(cache_rows(module, store, key='index', version=...)) to name them by it"
        )
    if index is not None and _takes_index(self.module):
        raise RowsError(
            f"`{type(self.module).__name__}` is cached per row keyed by index and was called "
            "with index=, which its forward takes too: the cache takes it as the rows' "
            "sample indices and hands the module its batch alone, so the module would "
            "answer every row as if no index were given, and not as it answers the call "
            "uncached. Have what reads the index done outside the module cached (cache a "
            "part that takes its input alone), or call the module itself"
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
    elif (
        not isinstance(x, torch.Tensor)
        or x.is_nested
        or x.is_meta
        or x.layout != torch.strided  # sparse, mkldnn: rows are looked up as dense ones
        or x.dim() == 0
    ):
        raise NotRowwise(
            f"a row-cached module is called with a batch tensor (rows along dimension 0), "
            f"got {_describe(x)}{_one_batch(self.module, x)}"
        )
    elif not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(x):
        # torch.compile cannot trace the question, and would warn and break the graph on
        # it; compiled, the lookup asks it eagerly instead (whether a transform runs).
        raise in_a_transform(
            f"`{type(self.module).__name__}` is cached per row and",
            "the batch",
            "call the module itself",
        )
    elif not plain(x):
        raise NotRowwise(
            f"`{type(self.module).__name__}` is cached per row and was handed a "
            f"`{type(x).__qualname__}`, a subclass of `torch.Tensor`: a row is keyed by its "
            "content alone, not by its class or what else it carries, so a module that "
            "answers a subclass otherwise (a mask and an image of the same values) would "
            "be answered from another class's rows. Hand it a plain tensor "
            "(`x.as_subclass(torch.Tensor)`), or call the module itself"
        )
    elif cut := gradient_cut(x):
        # Where no gradient is recorded (torch.no_grad, inference_mode), none is cut: the
        # module's answer there would not require grad either, unless it turns gradients
        # on itself (refused once its keying is known: `_rowwise._check_records_none`).
        raise CachedInputNeedsGrad(
            f"`{type(self.module).__name__}` is cached per row and the batch it is handed "
            f"{cut}: a recalled row is a leaf, so whatever produced the batch would train "
            "on misses and silently stop on hits. Freeze what feeds it, or call the module "
            "itself"
        )


_MADE_INSIDE = "inside the module (a padding mask as `input_ids != pad_id`)"
_STACKED = (
    "(`torch.stack([ids, mask], dim=1)`, taken apart inside the module), whose rows are keyed whole"
)
"""How a value for each row (an attention mask) may reach a module cached per row: made
from its batch, or in its batch."""


def _keep_beside(x: Any, beside: tuple[Any, ...], more: dict[str, Any]) -> str:
    """What to do with the arguments ``beside`` and ``more`` handed beside the batch ``x``:
    a value for each row (an attention mask) is part of each row's input, so it goes into
    the batch, or is made from it; any other is a setting of the module's."""
    rows = _rows_of(x)
    per_row = [f"`{name}=`" for name, value in more.items() if _holds_rows(value, rows)]
    per_row[:0] = [
        "The argument after the batch" if at == 0 else f"Argument {at + 2} of the call"
        for at, value in enumerate(beside)
        if _holds_rows(value, rows)
    ]
    if not per_row:
        return "Keep the value in the module (a setting is in the key) or call the module itself"
    verb = "holds" if len(per_row) == 1 else "hold"
    return (
        f"{' and '.join(per_row)} {verb} a value for each row: make it from the batch "
        f"{_MADE_INSIDE}, or hand the module one batch holding both {_STACKED}"
    )


def _rows_of(x: Any) -> int | None:
    """How many rows the batch ``x`` has; None where it is no batch."""
    if isinstance(x, torch.Tensor):
        return int(x.shape[0]) if x.dim() else None
    return len(x) if isinstance(x, DeferredRows) else None


def _holds_rows(value: Any, rows: int | None) -> bool:
    """Whether ``value`` is a tensor with one row for each of the batch's ``rows``."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows


def _one_batch(module: torch.nn.Module, x: Any) -> str:
    """What to hand ``module``'s cache in place of ``x``, which is no batch tensor: sequences
    of varying length padded into one, or one of the tensors of a tokenizer's batch (the
    module's input by the name its forward gives it, where one is so named), the rest made
    from it inside the module or stacked with it. Empty where there is nothing to say
    beyond what ``x`` is."""
    if isinstance(x, PackedSequence):  # before the tuples: it is a named tuple
        return (
            ": pad it into one batch tensor, the first of what "
            "`pad_packed_sequence(batch, batch_first=True)` returns"
        )
    if isinstance(x, torch.Tensor) and x.is_nested:
        return ": pad it into one batch tensor, `batch.to_padded_tensor(0)`"
    if _unstacked_samples(x):
        return (
            " of sequences of varying length, one sample each: pad them into one batch "
            "tensor, `torch.nn.utils.rnn.pad_sequence(batch, batch_first=True)`. Padded to "
            "a fixed length, a sample is the same row every epoch, and is recalled"
        )
    found = _tensors_in(x)
    if not found:
        return ""
    named = _input_name(module)
    # Where no input is so named, features come rather from a float column (an image)
    # than from an integer one beside it (a sample's id), a tokenizer's ids aside.
    floats = [read for name, read, is_float in found if is_float] or [found[0][1]]
    picked = next((read for name, read, _ in found if name == named), floats[0])
    if isinstance(x, list) or (isinstance(x, tuple) and not hasattr(x, "_fields")):
        held = f"{len(found)} tensors"
    else:
        held = ", ".join(f"`{name}`" for name, _, _ in found)
    return (
        f" of {held}. Hand it one, `cached({picked})`, and make what else the module "
        f"reads from it {_MADE_INSIDE}, or stack them into one batch {_STACKED}; or cache "
        "the module per batch (`somatize.torch.wrap(module, frozen=True, cached=True)`)"
    )


def _unstacked_samples(x: Any) -> bool:
    """Whether ``x`` is a list or plain tuple of tensors of varying length, which a
    collate left unstacked: the parts of one batch (ids and a mask) share its rows, so
    tensors differing in their first dimension are samples."""
    if not isinstance(x, (list, tuple)) or hasattr(x, "_fields") or len(x) < 2:
        return False
    if not all(isinstance(item, torch.Tensor) and item.dim() > 0 for item in x):
        return False
    return len({item.shape[0] for item in x}) > 1


def _tensors_in(x: Any) -> list[tuple[str, str, bool]]:
    """The tensors (or numpy arrays) a batch of several holds (a dict or other mapping, a
    dataclass, a named tuple, a tuple or list), each as its name, how it is read out of
    ``batch`` as a tensor, and whether it holds floating point values."""
    items: list[tuple[str, str, Any]]
    if isinstance(x, Mapping):
        items = [(str(k), f"batch[{k!r}]".replace("'", '"'), v) for k, v in x.items()]
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        # A field its __init__ leaves unset (`field(init=False)`) is not there to name.
        fields = dataclasses.fields(x)
        items = [(f.name, f"batch.{f.name}", getattr(x, f.name, None)) for f in fields]
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        items = [(name, f"batch.{name}", v) for name, v in zip(x._fields, x, strict=False)]
    elif isinstance(x, (tuple, list)):
        items = [(f"batch[{at}]", f"batch[{at}]", v) for at, v in enumerate(x)]
    else:
        return []
    return [
        (name, read, value.is_floating_point())
        if isinstance(value, torch.Tensor)
        else (name, f"torch.from_numpy({read})", value.dtype.kind == "f")
        for name, read, value in items
        if isinstance(value, torch.Tensor) or is_numpy_array(value)
    ]
