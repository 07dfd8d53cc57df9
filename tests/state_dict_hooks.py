"""Registering a module's state-dict hooks through whichever interface this torch has:
torch 2.5 made public the two that torch 2.4 has under private names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def add_state_dict_post_hook(module: nn.Module, hook: Callable[..., Any]) -> None:
    """Registers ``hook(module, state, prefix, meta)`` to run after ``module`` is saved."""
    register = getattr(module, "register_state_dict_post_hook", None)
    if register is None:  # torch 2.4
        register = module._register_state_dict_hook
    register(hook)


def add_load_state_dict_pre_hook(module: nn.Module, hook: Callable[..., Any]) -> None:
    """Registers ``hook(module, state, prefix, ...)`` to run before ``module`` is loaded."""
    register = getattr(module, "register_load_state_dict_pre_hook", None)
    if register is None:  # torch 2.4
        module._register_load_state_dict_pre_hook(hook, with_module=True)
    else:
        register(hook)
