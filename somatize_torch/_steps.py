"""An optimizer step leaves a trace on each weight it moved, whichever kernel moved it.

Every watch of weights (:class:`~somatize_torch._state.StateWatch`, a settled node's)
tells a change in place by the tensor's version counter. A fused optimizer
(``AdamW(fused=True)``, under ``torch.compile`` or not) writes the new values without
moving it, and so does an optimizer of one's own writing through ``p.data``. Once its
gradients are dropped (``zero_grad()`` after ``step()``) nothing else tells the weights
moved, and the answers of the old weights would be recalled.

So each step of a ``torch.optim`` optimizer, once over, moves the version counter of
each parameter it was handed that holds a gradient (those it steps): a step is a change
in place, seen as any other is. It costs a look at each parameter per step, and nothing
per forward. A parameter made under ``torch.inference_mode()`` keeps no counter; it is
left alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from somatize_torch._modes import marked_as_needed, outside_compiled

__all__ = ["see_optimizer_steps"]

# Kept through a reload of this module in place (IPython's autoreload): the hook registered
# before it stays registered, and a second would count each step twice, at twice the cost.
_hooked: bool = globals().get("_hooked", False)


def _count_step(optimizer: torch.optim.Optimizer) -> None:
    """Moves the version counter of each parameter ``optimizer`` just stepped."""
    stepped = [
        p
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None and not p.is_inference()
    ]
    if not stepped:
        return
    if _TAKES_A_LIST:
        torch.autograd.graph.increment_version(stepped)
    else:
        for parameter in stepped:
            torch.autograd.graph.increment_version(parameter)


def _takes_a_list() -> bool:
    """Whether this torch's ``increment_version`` moves a list of tensors' counters in one
    call (torch 2.4 takes one tensor a call)."""
    try:
        torch.autograd.graph.increment_version([torch.empty(0)])
    except (TypeError, RuntimeError):  # torch 2.4 raises RuntimeError
        return False
    return True


_TAKES_A_LIST = _takes_a_list()


# In a compiled step (`torch.compile` of `optimizer.step`) the counters would not move
# inside the compiled code: the count runs as it is, after it.
_COUNT_STEP = outside_compiled(_count_step)


def _stepped(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    marked_as_needed(_COUNT_STEP)(optimizer)


def see_optimizer_steps() -> None:
    """Has every optimizer step from here on move the version counters of the weights it
    stepped (once per process)."""
    global _hooked
    if not _hooked:
        register_optimizer_step_post_hook(_stepped)
        _hooked = True
