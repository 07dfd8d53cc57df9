"""Warming a cache ahead: :func:`prefill` runs it over a loader before training starts.

A first epoch through a cold cache computes every row inside the training loop;
:func:`prefill` computes them beforehand, over the same loader or any other, and
flushes them to the store, so that training, in this process or a later one,
recalls from its first batch. Handed whatever a DataLoader yields, it must find the
batch tensor in it (and, keyed by index, the indices): :func:`batch_for` says where
the batch tensor is, as :mod:`somatize_torch.ahead` asks too, to name the rows of
the next batch. Indices are never guessed: a tuple's other items are as likely the
labels as the indices, and labels that do not repeat within a batch pass every check
an index gets, so rows kept under them would be recalled for other samples. Only
what names them says where they are: a dict's ``index``, a :class:`DeferredRows`,
or the caller (``inputs=``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from somatize_torch._row_calls import _forward_of
from somatize_torch._row_errors import NeedsIndex
from somatize_torch._row_keys import KeyMode
from somatize_torch._row_stats import RowStats
from somatize_torch.deferred import DeferredRows

if TYPE_CHECKING:
    from somatize_torch.rows import CachedRows

__all__ = ["batch_at", "batch_for", "length_of", "prefill"]


def length_of(loader: Iterable[Any]) -> int | None:
    """How many batches ``loader`` holds, None where it cannot say: an iterable with no
    ``len()``, or a DataLoader over an IterableDataset without a length (a DataLoader
    always has ``__len__``, which raises TypeError there)."""
    if not isinstance(loader, Sized):
        return None
    try:
        return len(loader)
    except TypeError:
        return None


def batch_at(item: Any) -> tuple[Any, ...] | None:
    """Where the batch tensor is in what a DataLoader yields, by default: the item itself
    if it is a tensor, a tuple's or list's first item, a dict's ``x`` (or ``input``);
    None where there is no such tensor. A mapping that is no dict (transformers'
    ``BatchEncoding``, what its collators yield) is taken as a dict."""
    if isinstance(item, torch.Tensor):
        return ()
    if isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
        return (0,)
    if isinstance(item, Mapping):
        key = _dict_key(item)
        if isinstance(item.get(key), torch.Tensor):
            return (key,)
    return None


def _dict_key(item: Mapping[Any, Any]) -> str:
    """The key of a dict loader item that holds the batch: ``x``, else ``input``."""
    return "x" if "x" in item else "input"


def batch_for(item: Any, module: nn.Module) -> tuple[Any, ...] | None:
    """Where the batch tensor for ``module`` is in what a DataLoader yields, by default:
    where :func:`batch_at` finds it, or in a mapping with neither ``x`` nor ``input`` (a
    tokenizer's output), under the name of the module's forward's first parameter
    (:func:`named_by_forward`). None where there is no such tensor."""
    path = batch_at(item)
    if path is None and isinstance(item, Mapping):
        path = named_by_forward(item, module)
    return path


_NAMED = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)
"""Kinds of parameter a forward names: a dict's tensor may be handed it by that name."""


def _signature(module: nn.Module) -> tuple[Any, list[inspect.Parameter]] | None:
    """The forward the cache calls (seen through ``torch.compile`` and ``DataParallel``)
    and its parameters; None where its signature cannot be read or it names no first
    parameter."""
    forward = _forward_of(module)
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters or parameters[0].kind not in _NAMED:
        return None
    return forward, parameters


def named_by_forward(item: Mapping[Any, Any], module: nn.Module) -> tuple[Any, ...] | None:
    """Where the batch tensor is in a dict ``item`` with no ``x`` or ``input`` (a
    tokenizer's output): under the name of the parameter of the module's forward it is
    handed as, its first, which the cache hands it by keyword where it is keyword-only. A
    ``Deferred`` batch is found so too (``StackDataset(input_ids=Deferred(...))``). None
    where the forward's signature cannot be read or no tensor of the dict is named so.
    (:func:`refuse_beside` refuses a mask beside it.)"""
    read = _signature(module)
    if read is None or not isinstance(item.get(read[1][0].name), (torch.Tensor, DeferredRows)):
        return None
    return (read[1][0].name,)


def refuse_beside(
    item: Mapping[Any, Any], found: str, module: nn.Module, key: KeyMode, by_name: bool
) -> None:
    """Refuses a dict ``item`` whose batch is under ``found`` where another of its tensors
    names a parameter of the module's forward too (an ``attention_mask``, a ``mask``): the
    cache hands the module the batch alone, and would leave that one out. Says which
    ``inputs=`` keeps it (with the dict's ``index`` beside the batch where ``key`` is by
    index). Where the batch was found ``by_name`` of the forward's first parameter, a
    forward taking ``**kwargs`` takes any other name too; a dict's ``x`` beside labels
    ``y`` is the plain loader item it always was."""
    read = _signature(module)
    if read is None:
        return
    forward, parameters = read
    first = parameters[0].name
    # The indices are no input: keyed by index they go as `index=` (refused there where
    # the forward takes them too); keyed by content they are left out of every call.
    also = [
        p.name
        for p in parameters[1:]
        if p.kind in _NAMED
        and p.name not in (found, "index")
        and isinstance(item.get(p.name), torch.Tensor)
    ]
    if by_name and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        # `**kwargs` takes any name (a wrapper handing them on to a model): all but the
        # indices are taken beside the batch.
        also = [
            name
            for name, value in item.items()
            if name not in (first, "index") and isinstance(value, torch.Tensor)
        ]
    if not also:
        return
    owner = f"`{type(getattr(forward, '__self__', module)).__name__}.forward`"
    where = f"the first parameter of {owner}" if found == first else "as a dict's batch is"
    stacked = f"torch.stack([item[{found!r}], item[{also[0]!r}]], dim=1)"
    raise TypeError(
        f"prefill found the batch under '{found}', {where}, in the dict the loader yields, "
        f"and {', '.join(repr(name) for name in also)} beside it, which {owner} takes too: "
        "a cache per row hands the module the batch alone, so those would be left out, and "
        "a padded row's answer without its mask is another. To keep a mask, either make it "
        f"in the forward from the batch ({first} != pad_id, where none is given) and pass "
        f"{_advice(f'item[{found!r}]', item, key)}, which also caches it without them where "
        f"no row is padded; or hand both as one tensor ({_advice(stacked, item, key)}, "
        "taken apart in the forward)"
    )


def _advice(batch: str, item: Mapping[Any, Any], key: KeyMode) -> str:
    """An ``inputs=`` answering the expression ``batch`` of a loader item: with the item's
    ``index`` beside it where rows are keyed by index, which would refuse the batch
    alone."""
    if key == "index" and "index" in item:
        return f"inputs=lambda item: ({batch}, item['index'])"
    return f"inputs=lambda item: {batch}"


def _inputs(
    batch: Any, key: KeyMode, module: nn.Module
) -> tuple[torch.Tensor | DeferredRows, torch.Tensor | None]:
    """The batch tensor (and, keyed by index, the indices) of what a DataLoader yields:
    the tensor :func:`batch_for` finds (one found by the name of the module's forward's
    first parameter, alone of the forward's parameters), and a dict's ``index``; or the
    :class:`DeferredRows` that is the item or a tuple's first."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], DeferredRows):
        return batch[0], None
    if isinstance(batch, Mapping) and isinstance(batch.get(_dict_key(batch)), DeferredRows):
        # A `StackDataset(x=Deferred(...), y=labels)`: a mask beside it is refused too.
        refuse_beside(batch, _dict_key(batch), module, key, by_name=False)
        return batch[_dict_key(batch)], None
    if isinstance(batch, DeferredRows):
        return batch, None
    path = batch_at(batch)
    by_name = path is None and isinstance(batch, Mapping)
    if by_name:
        path = named_by_forward(batch, module)
    if path is None:
        raise TypeError(
            f"prefill cannot tell the batch tensor in a `{type(batch).__name__}` the loader "
            "yields; pass inputs=, a function from one loader item to the batch tensor (or to "
            "(batch, indices) for key='index')"
        )
    if isinstance(batch, Mapping):
        refuse_beside(batch, path[0], module, key, by_name)  # beside a dict's `x` too
    x = batch if path == () else batch[path[0]]
    if key != "index" or isinstance(x, DeferredRows):  # a Deferred batch carries its indices
        return x, None
    index = batch.get("index") if isinstance(batch, Mapping) else None
    if index is None:
        _refuse_unnamed(batch)
    return x, index


def _answered(got: Any) -> tuple[Any, Any]:
    """The batch and indices (None where it gave none) of what ``inputs=`` answered for
    one loader item: the batch, or ``(batch, indices)``."""
    if not isinstance(got, tuple):
        return got, None
    if len(got) != 2:
        raise TypeError(
            f"prefill's inputs= answered a tuple of {len(got)} items for one loader item; "
            "it answers the batch tensor, or (batch, indices) for a cache keyed by index: "
            "inputs=lambda item: item[0], or inputs=lambda item: (item[0], item[2]) for "
            "items (x, y, index)"
        )
    return got


def _refuse_unnamed(batch: Any) -> NoReturn:
    kind = f"a `{type(batch).__name__}`"
    if isinstance(batch, Mapping):
        kind = f"a `{type(batch).__name__}` with no 'index'"
    elif isinstance(batch, (tuple, list)):
        kind = f"a `{type(batch).__name__}` of {len(batch)} items"
    raise NeedsIndex(
        f"prefill cannot tell the samples' indices in {kind} the loader yields, and this "
        "cache keys rows by them (key='index'). It does not guess them from a tuple's other "
        "items: those of an (x, y) loader are labels, and rows kept under labels would be "
        "recalled for other samples. Say where they are: inputs=lambda item: (item[0], "
        "item[2]) for items (x, y, index), a dict item's 'index', or load the inputs "
        "through `Deferred`, whose batches carry their indices"
    )


def check_loader(loader: object, where: str) -> None:
    """Refuses what is not a loader of batches, naming ``where`` it was handed
    (:func:`not_a_loader`)."""
    refusal = not_a_loader(loader, where)
    if refusal is not None:
        raise refusal


def not_a_loader(loader: object, where: str) -> TypeError | None:
    """The refusal of ``loader`` as a loader of batches, or None where it is one: no
    iterable at all, a tensor (iterated, it gives rows, each taken for a batch of its
    values), or a map-style dataset (it gives samples one by one, not batches) would
    cache rows no training step asks for, or fail deep in the module."""
    if isinstance(loader, torch.Tensor):
        return TypeError(
            f"{where} takes a loader of batches (a DataLoader, a list of batch tensors), "
            f"got a tensor of shape {list(loader.shape)}: iterated, it gives rows, each "
            "taken for a batch. Hand it `[x]` for one batch, or a "
            "`DataLoader(TensorDataset(x), batch_size=...)`"
        )
    dataset = isinstance(loader, torch.utils.data.Dataset)
    if dataset and not hasattr(type(loader), "__iter__"):
        return TypeError(
            f"{where} takes a loader of batches, got a `{type(loader).__name__}`, a dataset: "
            "iterated, it gives one sample at a time, each taken for a batch. Hand it "
            "`DataLoader(dataset, batch_size=...)`, or `DataLoader(dataset, batch_size=None)` "
            "where each of its items is a whole batch already"
        )
    if not isinstance(loader, Iterable) and not hasattr(type(loader), "__getitem__"):
        return TypeError(
            f"{where} takes a loader of batches (a DataLoader, a list of batch tensors), "
            f"got a `{type(loader).__name__}`"
        )
    return None


def check_flag(value: object, name: str) -> None:
    """Refuses a setting ``name`` that is no bool: "no", read from a config, would be true."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}= is True or False, got {value!r}")


def check_callable(value: object, name: str, example: str) -> None:
    """Refuses a setting `name` that is neither None nor a function of each loader item."""
    if value is not None and not callable(value):
        raise TypeError(
            f"{name}= is a function of each loader item, {example}, or None; got "
            f"{value!r}, a `{type(value).__name__}`"
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
    training starts, then flushes; returns what it did. Rows the cache computed before,
    still on their way to the store, are written first (a write of theirs that failed
    is raised there, before anything is computed): they are not counted as its own.
    ``inputs`` turns one loader item into the batch tensor (or ``(batch, indices)``); by
    default a tensor is the batch, a tuple's first item is the batch, a dict's ``x`` (or
    ``input``, or the one named as the forward's first parameter) and ``index``. With
    ``key="index"`` the indices are taken only where they are named (a dict's
    ``index``, a :class:`DeferredRows`); otherwise ``inputs`` must say where they are
    (:class:`NeedsIndex` if it does not). ``convert`` is applied to each item first
    (as a trainer's precision converts a batch), and ``device`` moves batches there.
    ``progress`` shows a tqdm bar."""
    from somatize_torch.rows import CachedRows

    if not isinstance(cached, CachedRows):
        raise TypeError(
            f"prefill takes a module made by `cache_rows`, got a `{type(cached).__name__}`"
        )
    check_loader(loader, "prefill(cached, loader)")
    check_callable(inputs, "inputs", "`lambda item: item[0]`")
    check_callable(convert, "convert", "`lambda item: item.half()`")
    check_flag(progress, "progress")
    # Rows computed before, still on their way to the store, are written first: its
    # flush at the end would write them too, and count them as kept by the prefill.
    cached.flush()
    before = cached.stats
    items: Iterable[Any] = loader
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError(
                "prefill(progress=True) shows a progress bar with tqdm, which is not installed: "
                "the `torch` extra brings it, `pip install 'somatize[torch]'` (or `pip install "
                "'tqdm>=4.60'`), or pass progress=False"
            ) from None
        items = tqdm(
            loader, total=length_of(loader), desc=f"prefill {type(cached.module).__name__}"
        )
    for item in items:
        if convert is not None:
            item = convert(item)
        if inputs is not None:
            x, index = _answered(inputs(item))
            if index is None and cached.key_mode == "index" and not isinstance(x, DeferredRows):
                raise NeedsIndex(
                    "prefill's inputs= answered the batch alone, and this cache keys rows by "
                    "sample index (key='index'): have it answer (batch, indices), "
                    "inputs=lambda item: (item[0], item[2]) for items (x, y, index), "
                    "(item['input_ids'], item['index']) for dict items"
                )
        else:
            x, index = _inputs(item, cached.key_mode, cached.module)
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
