"""What a row cache refuses, and how its messages describe what they were handed.

The errors live here, below every module that raises them (the keying, the
rowwise check, the lookup, :mod:`somatize_torch.rows` itself), and are re-exported
by :mod:`somatize_torch.rows`, their public home::

    RowsError (SomatizeError, ValueError)   a module cannot be cached per row as asked
    ├── NotRowwise (TypeError)              its output is not one row per input row
    └── NeedsIndex                          indices missing, or not naming one input each

A module found unfrozen is :class:`~somatize_torch.freeze.Unfrozen`, which is
:mod:`somatize_torch.freeze`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from somatize.errors import SomatizeError

__all__ = ["NeedsIndex", "NotRowwise", "RowsError"]


class RowsError(SomatizeError, ValueError):
    """A module cannot be cached per row as asked."""


class NotRowwise(RowsError, TypeError):
    """The module's output is not one row per input row."""


class NeedsIndex(RowsError):
    """An index-keyed cache was called without the samples' indices, or with bad ones."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor) and value.is_nested:
        return f"a nested {value.dtype} tensor, whose rows have no one shape"
    if isinstance(value, torch.Tensor) and value.is_meta:
        return f"a {value.dtype} tensor on the meta device, which holds no values"
    if isinstance(value, torch.Tensor) and value.layout != torch.strided:
        layout = str(value.layout).removeprefix("torch.")
        return f"a {layout} {value.dtype} tensor, whose rows are not dense (`x.to_dense()`)"
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if is_numpy_array(value):
        return (
            f"a numpy {value.dtype} array of shape {list(value.shape)}: hand "
            "`torch.from_numpy(array)`, which shares its memory"
        )
    return f"a `{type(value).__name__}`"


def is_numpy_array(value: Any) -> bool:
    """Whether ``value`` is a numpy array (a column of a Ray Data or pandas batch), which a
    cache takes once made a tensor; told by its class, so as not to import numpy."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ == "ndarray"
