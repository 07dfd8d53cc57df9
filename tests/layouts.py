"""What a cache of a conv answers as its weights are laid out channels_last and back."""

from __future__ import annotations

import torch
from torch import nn


def answers_as_its_weights_are_laid_out(cached: nn.Module, module: nn.Module) -> None:
    """Calls ``cached`` (a cache of the conv ``module``, taking 8 channels) on one batch,
    then with the weights converted to channels_last through it, twice, then converted
    back: each call answers what ``module`` answers in that layout, strides and bits. The
    caller counts what was computed and recalled."""
    x = torch.randn(4, 8, 6, 6)
    with torch.no_grad():
        cached(x)
        cached.to(memory_format=torch.channels_last)
        truth = module(x)
        assert truth.is_contiguous(memory_format=torch.channels_last)
        for _ in range(2):
            out = cached(x)
            assert out.stride() == truth.stride()
            assert torch.equal(out, truth)
        cached.to(memory_format=torch.contiguous_format)
        assert cached(x).is_contiguous()
