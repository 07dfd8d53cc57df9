"""What :class:`~somatize_torch.lightning.CacheFrozen` refuses, and what it warns of.

The errors and warnings live here, below every module that raises them (the callback
and the part that finds and checks its submodules,
:mod:`somatize_torch._lightning_modules`), and are re-exported by
:mod:`somatize_torch.lightning`, their public home::

    CacheFrozenError (SomatizeError, ValueError)   asked to cache something it cannot
    ├── NotASubmodule (LookupError)                a name names no submodule
    └── CompiledSubmodule (TypeError)              the submodule is itself compiled

    NeverHits (SomatizeWarning)        a training epoch after the first recalled no row
    Uncached (SomatizeWarning)         a submodule unfrozen, left to train or never called
    FrozeTrainable (SomatizeWarning)   caching froze parameters that required grad

A warning, not an error, where the fit can go on: a module unfrozen trains as
without the callback; one frozen while its parameters required grad leaves the rest
of the model to train (naming everything the fit would train is refused, since
nothing would be left); inputs that differ every epoch only cost time.
"""

from __future__ import annotations

from somatize.errors import SomatizeError, SomatizeWarning

__all__ = [
    "CacheFrozenError",
    "CompiledSubmodule",
    "FrozeTrainable",
    "NeverHits",
    "NotASubmodule",
    "Uncached",
]


class CacheFrozenError(SomatizeError, ValueError):
    """The callback was asked to cache something it cannot."""


class NotASubmodule(CacheFrozenError, LookupError):
    """A name given to the callback names no submodule of the LightningModule."""


class CompiledSubmodule(CacheFrozenError, TypeError):
    """A submodule to cache was itself compiled with ``torch.compile``."""


class NeverHits(SomatizeWarning):
    """A training epoch after the first recalled no row: its inputs differ every epoch, or
    the module changed since the epoch before kept its rows."""


class Uncached(SomatizeWarning):
    """A submodule runs uncached: a fine-tuning schedule unfroze it, a fine-tuning
    callback leaves it to train (or in train mode), it would run in train mode with parts
    that compute otherwise there (BatchNorm, dropout), it is handed a batch that requires
    grad (a trainable part upstream of it), or another module replaced it; or the first
    training epoch never called it (the step calls a method of it, or its parts)."""


class FrozeTrainable(SomatizeWarning):
    """A submodule named to be cached had parameters that required grad: caching froze them."""
