"""somatize_torch: the torch side of somatize.

Users reach it as ``somatize.torch``; this package builds on the core's public
API like any user would, plus the codec and digest hooks. Importing it registers
the ``tensor`` codec (:mod:`somatize_torch.codec`) and initialises no CUDA.

- :func:`wrap` — a model whose declared submodules are somatize nodes;
- :func:`freeze` — settles frozen torch nodes: digests weights and buffers,
  turns off their gradients, holds them in eval;
- :func:`digest_tensor` / :func:`digest_rows` — the one way tensor content is named.
"""

from somatize_torch.codec import TENSOR, LandedOnHost, TensorCodec, register
from somatize_torch.digest import digest_named, digest_rows, digest_tensor
from somatize_torch.freeze import (
    FreezeError,
    ModuleNode,
    NotATorchNode,
    NotDeclaredFrozen,
    NothingToFreeze,
    StillChanging,
    digest_state,
    freeze,
    is_held,
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

register()

__all__ = [
    "TENSOR",
    "CachedInputNeedsGrad",
    "FreezeError",
    "LandedOnHost",
    "ModuleNode",
    "NotATorchNode",
    "NotCalled",
    "NotDeclaredFrozen",
    "NothingToFreeze",
    "StillChanging",
    "TensorCodec",
    "UnknownSubmodule",
    "Untraceable",
    "WrapError",
    "Wrapped",
    "digest_named",
    "digest_rows",
    "digest_state",
    "digest_tensor",
    "freeze",
    "is_held",
    "wrap",
]
