"""What :class:`~somatize_torch.lightning.CacheFrozen` is given, checked: when it is made,
when it is told to prefill, and against a fit's training loaders.

A callback is made long before it acts: the trainer first calls its ``setup()`` when
fitting starts, possibly hours later, once the data is loaded and the model built. So
what it can refuse from its arguments alone it refuses when it is made: names that are
not the dotted names of distinct submodules (:func:`module_names`; one inside another
would be cached twice), a setting :func:`~somatize_torch.rows.cache_rows` would refuse
(:func:`~somatize_torch.rows.check_options`), a flag that is not True or False
(:func:`check_flags`), and a store this process cannot write (:func:`writable_store`),
where the rows a fit computes could not be kept. A prefill for a module the callback
does not cache is refused when it is asked for (:func:`prefill_module`), not when
fitting starts.

What depends on the fit is checked once it is known: rows keyed by sample index under
the callback's one ``version`` cannot tell the samples of two training loaders apart
(each has a sample 0), nor those of two evaluation loaders whose batches come in one
step, so more than one is refused when the epoch starts (:func:`one_set_a_step`),
unless each is over a :class:`~somatize_torch.deferred.Deferred` with a version of its
own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, cast

from lightning.pytorch.utilities import CombinedLoader

from somatize import Store, StoreError
from somatize_torch._lightning_errors import CacheFrozenError, NotASubmodule
from somatize_torch._lightning_stats import Stage
from somatize_torch.deferred import Deferred

__all__ = [
    "cached_twice",
    "check_flags",
    "module_names",
    "one_set_a_step",
    "prefill_keyed_as",
    "prefill_module",
    "writable_store",
]


def module_names(modules: Sequence[str] | str) -> list[str]:
    """The dotted names of the submodules to cache, ``modules`` given as one or a list,
    each a submodule of its own (none inside another, none twice)."""
    names = [modules] if isinstance(modules, str) else None
    if names is None and isinstance(modules, Iterable):
        names = list(modules)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise CacheFrozenError(
            "modules= names the submodules to cache, by their dotted names in the "
            f"LightningModule (e.g. ['encoder']); got {modules!r}"
        )
    for a in names:
        for b in names:
            if a != b and b.startswith(a + "."):
                raise cached_twice(b, a)
    if len(set(names)) != len(names):
        raise CacheFrozenError(f"modules= names a submodule twice: {names!r}")
    return names


def cached_twice(inner: str, outer: str, path: str | None = None) -> CacheFrozenError:
    """The refusal of names where submodule ``inner`` is inside submodule ``outer`` (as
    ``path`` within it, where its own name does not say so)."""
    also = f" (it is `{outer}.{path}` too)" if path is not None else ""
    return CacheFrozenError(
        f"`{inner}` is inside `{outer}`{also}: caching `{outer}` already answers everything "
        f"`{inner}` computes within it, and a module cannot be cached twice. Name one of them"
    )


def check_flags(progress_bar: object, ahead: object) -> None:
    """Refuses ``progress_bar=`` or ``ahead=`` when it is not True or False."""
    for option, value in (("progress_bar", progress_bar), ("ahead", ahead)):
        if not isinstance(value, bool):
            raise CacheFrozenError(f"{option}= is True or False, got {value!r}")


def writable_store(store: Store | str | os.PathLike[str] | None) -> Store | None:
    """The store ``store`` names (None: memory only), refused when this process cannot
    write it."""
    opened = Store.of(store)
    if opened is None or opened.writable():
        return opened
    # As a store on a read-only disk with nothing in it is refused when it is opened:
    # here, not after an epoch of work, when the rows computed cannot be written.
    refused = opened._refused_keeping()
    why = str(refused) if refused is not None else "it is read-only for this process"
    raise StoreError(
        f"cannot use {opened!r} as this callback's store ({why}), so the rows a fit "
        "computes could not be kept (the fit would fail when it first flushes them, its "
        "work lost). Pass a store this process may write, or store=None to keep rows in "
        "memory only"
    )


def prefill_module(names: list[str], module: str | None) -> str:
    """The module a prefill's batches feed, of those the callback caches, ``names``:
    ``module``, or the only one when it is None."""
    if module is None:
        if len(names) > 1:
            raise CacheFrozenError(
                f"this callback caches {names}, so prefill needs to be told which "
                "one the loader's batches feed: prefill(loader, module='encoder')"
            )
        module = names[0]
    if module not in names:
        raise NotASubmodule(
            f"prefill(module={module!r}): this callback caches {names}; name one of those"
        )
    return module


def prefill_keyed_as(stage: str, dataloader_idx: int) -> tuple[Stage, int]:
    """The loader a prefill's rows are keyed as, by index under the callback's version:
    loader ``dataloader_idx`` of ``stage``, which must be one the callback keys rows as."""
    stages = ("train", "validate", "test", "predict")
    if stage not in stages:
        raise ValueError(
            f"prefill(stage={stage!r}): a prefill's rows are keyed as the samples of a loader "
            f"of one of the stages {list(stages)}; name the stage whose loader it runs"
        )
    if (
        isinstance(dataloader_idx, bool)
        or not isinstance(dataloader_idx, int)
        or dataloader_idx < 0
    ):
        raise ValueError(
            f"prefill(dataloader_idx={dataloader_idx!r}): the loader's place among its "
            "stage's loaders is an int from 0"
        )
    if stage == "train" and dataloader_idx != 0:
        raise ValueError(
            f"prefill(stage='train', dataloader_idx={dataloader_idx}): a fit keyed by index "
            "under the callback's version has one training loader (its samples could not "
            "be told from another's), loader 0"
        )
    return cast(Stage, stage), dataloader_idx


def one_set_a_step(loop: Any, version: str, stage: Stage) -> None:
    """Refuses loaders of ``stage`` keyed by the callback's ``version`` (by sample index)
    whose samples a step is handed without being told apart (each has a sample 0): more
    than one training loader, or more than one evaluation loader in a ``CombinedLoader``
    of another mode than ``"sequential"`` (its batch holds one batch of each, with no
    ``dataloader_idx`` to key them apart by; in that mode each loader's rows are keyed
    under a version of its own). A loader over a
    :class:`~somatize_torch.deferred.Deferred` with a version of its own keys its rows
    under that one."""
    combined = getattr(loop, "_combined_loader", None)
    if not isinstance(combined, CombinedLoader):
        return  # another Lightning than the one this reads
    mode = getattr(combined, "_mode", None)
    if stage != "train" and mode in (None, "sequential"):
        return
    plain = [dl for dl in combined.flattened if not _versioned(dl)]
    if len(plain) > 1:
        at_once = (
            "this fit trains on"
            if stage == "train"
            else f"each {stage} step (a CombinedLoader in mode {mode!r}) is handed a "
            "batch from each of"
        )
        raise CacheFrozenError(
            f"key='index' with version={version!r} keys each {stage} row by its sample "
            f"index within the data that version names, and {at_once} "
            f"{len(plain)} loaders whose samples it cannot tell apart (each has a sample 0): "
            "one loader's rows would be answered with another's. Give each loader a "
            "`Deferred` dataset with a version of its own, or key rows by content "
            "(key='content')"
            + ("" if stage == "train" else ", or combine the loaders in mode 'sequential'")
        )


def _versioned(loader: Any) -> bool:
    """Whether ``loader`` is over a Deferred dataset with a version of its own."""
    dataset = getattr(loader, "dataset", None)
    return isinstance(dataset, Deferred) and dataset.version is not None
