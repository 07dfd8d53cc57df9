"""The precision a forward is called in: part of the key of each node it computes.

A node that computes with torch answers otherwise under ``torch.autocast`` (a
product in bfloat16), under another default dtype (``torch.set_default_dtype``) or
with float32 products computed in TF32, and its answer to one call must never be
recalled for the other. So a forward reads, in the thread that calls it, the
precision in force there (:func:`precision_now`): autocast on each device type
(:func:`autocast_on`, kept by torch per thread, read here as a worker is handed it)
and the settings of the whole process that the library computing with them
registers (:func:`keyed_by_precision`: ``somatize.torch`` names torch's). Each
keyed node's key names it (:func:`somatize.keys.in_precision`) where it is not the
default, so a call in the default precision keeps the key it always had — but a
node whose class says its answer does not depend on it (``ignores_precision``: a data
source, which computes with no torch) and a node of a kind whose own declaration names
the precision it runs in (a torch module's, by the device its weights are on), which
would otherwise name it twice.

The settings of the process hold for all its threads, and no job carries them: a
worker that runs in a process of its own, one job at a time (a Ray actor), enters
those the job's key names for the time of the job (:func:`entered`), and puts its own
back after.

The core never imports torch: where torch is not imported, nothing computes with it
and no precision is read; where it is and ``somatize.torch`` is not, that is
imported for its settings, as a worker imports it for the codec of a tensor.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

__all__ = [
    "AUTOCAST_DEVICES",
    "Precision",
    "autocast_on",
    "entered",
    "keyed_by_precision",
    "keyed_in_precision",
    "precision_now",
]

Precision = tuple[tuple[str, str], ...]
"""What differs from the default, each as (what, its value): ``(("autocast.cpu",
"bfloat16"),)``."""

AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "maia", "xla", "privateuseone")
"""The device types torch may run autocast on, each looked at in the caller's thread."""

Enter = Callable[[Precision], AbstractContextManager[None]]
"""What makes the settings of the process those a precision names, for a block."""

_SETTINGS: list[tuple[Callable[[], Precision], type, Enter]] = []
"""What :func:`keyed_by_precision` registered: the reader of the settings of the process,
the kind of node that names the precision it runs in itself, and what enters them."""


def keyed_by_precision(
    settings: Callable[[], Precision], names_its_own: type, enter: Enter
) -> None:
    """Registers ``settings``, which names the settings of this process that change what a
    node computes, where they are not the default (none: ``()``), ``names_its_own``, the
    kind of node whose declaration names its precision itself, and ``enter``, which makes
    the settings of this process those a precision names for the time of a block, as
    ``settings`` names them (idempotent): ``somatize.torch`` registers torch's default
    dtype and how its products are computed, and ``ModuleNode``."""
    if (settings, names_its_own, enter) not in _SETTINGS:
        _SETTINGS.append((settings, names_its_own, enter))


def keyed_in_precision(node: Any) -> bool:
    """Whether ``node``'s key names the precision a forward is called in: any node but one
    whose class says its answer does not depend on it (``ignores_precision``: a data
    source) and one whose declaration names it itself (:func:`keyed_by_precision`)."""
    if node.ignores_precision:
        return False
    return not any(isinstance(node, kind) for _, kind, _ in _SETTINGS)


def autocast_on() -> Precision:
    """The device types autocast is on for in this thread, each with the name of its dtype
    (none where torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    anywhere = getattr(torch._C, "_is_any_autocast_enabled", None)
    if anywhere is not None and not anywhere():  # at every forward: one call, where none is
        return ()
    return tuple(
        (device, str(torch.get_autocast_dtype(device)).removeprefix("torch."))
        for device in AUTOCAST_DEVICES
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
    )


def precision_now() -> Precision | None:
    """The precision a node called now in this thread computes in, where it is not the
    default: autocast on each device type (``("autocast.cuda", "bfloat16")``) and the
    settings of the process registered (:func:`keyed_by_precision`). None in the default
    precision, and where torch is not imported."""
    if "torch" not in sys.modules:
        return None
    autocast = autocast_on()
    said = tuple((f"autocast.{device}", dtype) for device, dtype in autocast) if autocast else ()
    for settings, _, _ in _registered():
        said += settings()
    return said or None


@contextlib.contextmanager
def entered(precision: Precision) -> Iterator[None]:
    """The settings of this whole process made those ``precision`` names (the default where
    it names none) for the time of the block, and put back after it, by each library
    registered (:func:`keyed_by_precision`; autocast, kept per thread, is not among them).
    Only for a process that computes nothing else meanwhile: every thread computes in them.
    A setting none of them can make is left as it is: read :func:`precision_now` in it."""
    with contextlib.ExitStack() as stack:
        # Where torch is not imported, its settings are its defaults: nothing to enter for
        # the default precision.
        if precision or "torch" in sys.modules:
            for _, _, enter in _registered():
                stack.enter_context(enter(precision))
        yield


def _registered() -> list[tuple[Callable[[], Precision], type, Enter]]:
    """What :func:`keyed_by_precision` registered, ``somatize.torch`` imported first where
    nothing is, to register torch's settings."""
    if not _SETTINGS and not _UNREADABLE:
        try:
            importlib.import_module("somatize.torch")
        except ImportError as why:
            # torch installed on its own, without numpy (which torch does not require and
            # `somatize.torch` does): nothing here can keep a tensor, and a node computing
            # with torch is keyed by the autocast it runs under alone, as it is read from
            # torch itself. Said once: the import is not tried at every forward.
            _UNREADABLE.append(why)
    return _SETTINGS


_UNREADABLE: list[ImportError] = []
"""Why ``somatize.torch`` could not be imported to register torch's settings, once it was
tried (:func:`_registered`)."""
