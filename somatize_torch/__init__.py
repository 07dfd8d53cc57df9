"""somatize_torch: the torch side of somatize.

Users reach it as ``somatize.torch``; this package builds on the core's public
API like any user would, plus the codec and digest hooks. Importing it registers
the ``tensor`` codec (:mod:`somatize_torch.codec`) and initialises no CUDA.

- :func:`wrap` — a model whose declared submodules are somatize nodes;
- :func:`freeze` — settles frozen torch nodes: digests weights and buffers,
  turns off their gradients, holds them in eval (:func:`release` lets go of
  a module unfrozen to train it);
- :func:`cache_rows` — per-sample caching of a frozen encoder, with memory tiers
  and a background writer, and :func:`prefill` to warm it;
- :class:`Deferred` — a dataset whose inputs an index-keyed cache loads only for
  the rows it computes;
- :func:`ahead` — a loader fetched a batch ahead, its rows named for content-keyed
  caches on another thread while the current step runs;
- :func:`digest_tensor` / :func:`digest_rows` — the one way tensor content is named.
"""

try:  # imported here for the message below, rather than the bare one of the first part
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError as why:
    raise ImportError(
        f"somatize.torch needs {why.name or 'torch'}, which is not installed: "
        "`pip install 'somatize[torch]'`"
    ) from None

from somatize_torch._steps import see_optimizer_steps
from somatize_torch.ahead import Ahead, ahead
from somatize_torch.codec import TENSOR, LandedOnHost, TensorCodec, register
from somatize_torch.deferred import Deferred, DeferredRows, NotLoadable
from somatize_torch.digest import digest_named, digest_rows, digest_tensor
from somatize_torch.freeze import (
    FreezeError,
    ModuleNode,
    NotATorchNode,
    NotDeclaredFrozen,
    NothingToFreeze,
    StateDoesNotFit,
    StillChanging,
    digest_state,
    freeze,
    is_held,
    release,
)
from somatize_torch.residency import Tier
from somatize_torch.rows import (
    CachedRows,
    NeedsIndex,
    NotRowwise,
    RowsError,
    RowStats,
    Unfrozen,
    cache_rows,
    prefill,
)
from somatize_torch.wrap import (
    CachedInputNeedsGrad,
    NotCalled,
    UnknownSubmodule,
    Untraceable,
    WrapError,
    Wrapped,
    wrap,
)
from somatize_torch.writer import WriteFailed

register()
# A fused optimizer's step moves no version counter, which every watch of weights reads.
see_optimizer_steps()

__all__ = [
    "TENSOR",
    "Ahead",
    "CachedInputNeedsGrad",
    "CachedRows",
    "Deferred",
    "DeferredRows",
    "FreezeError",
    "LandedOnHost",
    "ModuleNode",
    "NeedsIndex",
    "NotATorchNode",
    "NotCalled",
    "NotDeclaredFrozen",
    "NotLoadable",
    "NotRowwise",
    "NothingToFreeze",
    "RowStats",
    "RowsError",
    "StateDoesNotFit",
    "StillChanging",
    "TensorCodec",
    "Tier",
    "Unfrozen",
    "UnknownSubmodule",
    "Untraceable",
    "WrapError",
    "Wrapped",
    "WriteFailed",
    "ahead",
    "cache_rows",
    "digest_named",
    "digest_rows",
    "digest_state",
    "digest_tensor",
    "freeze",
    "is_held",
    "prefill",
    "release",
    "wrap",
]
