"""The errors wrapping a model raises, kept below every module that raises them.

:mod:`somatize_torch.wrap` exports them, and :mod:`somatize_torch` with it; they live
here, apart, so that the modules wrapping is made of (the fx split, the cached call,
the parts watcher) raise them without importing the wrapper that imports them::

    SomatizeError
    ├── WrapError (ValueError)
    │   ├── UnknownSubmodule (KeyError)
    │   └── NotCalled
    ├── Untraceable (TypeError)
    └── CachedInputNeedsGrad (ValueError)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._guards import TracingContext
from torch.autograd import forward_ad

from somatize.errors import SomatizeError

__all__ = [
    "CachedInputNeedsGrad",
    "NotCalled",
    "UnknownSubmodule",
    "Untraceable",
    "WrapError",
]


class WrapError(SomatizeError, ValueError):
    """A model cannot be wrapped as asked, or was changed since in a way its wrapping
    cannot follow."""


class UnknownSubmodule(WrapError, KeyError):
    """A declared name that is not a submodule of the model."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class NotCalled(WrapError):
    """A declared submodule that the model's forward never calls."""


class Untraceable(SomatizeError, TypeError):
    """torch.fx could not trace the model's forward."""

    branched: frozenset[str] | None = None
    """Where the forward branched on (or iterated over) what fx stands in for: the
    arguments that flowed into it (none for what the model holds); None where fx stopped
    otherwise."""

    tensors: frozenset[str] = frozenset()
    """Those of :attr:`branched` the forward used as tensors (`x.shape`, `x.size()`): a
    branch on a tensor's shape or value, which no argument fixed at a value lifts."""

    where: str = ""
    """Where in the model's code fx stopped, as a message says it (" at file:line
    (`code`)"); "" where it is not known."""

    read: Any = None
    """What the trace read of the model before fx stopped (a
    :class:`~somatize_torch._values.Noted`), None where it is not known: read as it was,
    the same values lead a trace of the same call to the same stop."""


class CachedInputNeedsGrad(SomatizeError, ValueError):
    """A cached node was handed a tensor that requires grad."""


def in_a_transform(called: str, handed: str, instead: str) -> TypeError:
    """The refusal of a cached call made inside a ``torch.func`` transform (``vmap``,
    ``grad``), which makes the tensors the module computes with its own: they have no
    memory to key them by, and a recalled answer would take no part in the transform."""
    return TypeError(
        f"{called} is called inside a `torch.func` transform (`vmap`, `grad`, `jacrev`), "
        f"which makes {handed} a tensor of its own (one made outside it too, and the "
        "module's weights where `functional_call` hands it the transform's), with no memory "
        "to key it by: a recalled answer would take no part in the transform either. Call "
        "it outside the transform (encode first, then transform what reads the encoding), "
        f"or {instead}"
    )


JIT_TRACE = "torch.jit.trace"
EXPORT = "torch.export.export"
"""What records a call as code for every later call (:func:`traced_by`)."""


def traced_by(tracer: str, called: str, instead: str) -> TypeError:
    """The refusal of a cached call made while ``tracer`` (:data:`JIT_TRACE`, as
    :func:`jit_tracing` says; :data:`EXPORT`, as :func:`exporting` says) records it: what
    it records of a call is the code it runs for every later input, and a recalled answer
    runs none (it would be answered whatever it is given)."""
    exported = tracer == EXPORT
    what = (
        "the program would answer every input as it answers this one, and the tensors "
        "export traces with are stand-ins, holding no values to key the call by"
        if exported
        else "the trace would answer every input with what was recalled for this one"
    )
    return TypeError(
        f"{called} is called while `{tracer}` traces it, which keeps the operations "
        "a call runs as the code every later call runs: a recalled answer runs none, so "
        f"{what}. {'Export' if exported else 'Trace'} {instead}"
    )


def jit_tracing() -> bool:
    """Whether ``torch.jit.trace`` is recording what runs (:func:`traced_by`)."""
    return torch._C._is_tracing()


def exporting() -> bool:
    """Whether ``torch.export`` is tracing what runs on this thread, strict or not
    (:func:`traced_by`): asked before any function kept out of compiled code is called,
    which export cannot call (or trace into). A torch before 2.6 has no such question, and
    says no.

    torch's own question is the process's (a flag an export sets for its whole run), so
    an eager call on another thread meanwhile would be taken for one export traces. What
    export traces runs on its thread under a tracing context, which torch holds per
    thread: a non-strict export runs the code there. Code torch's compiler traces is
    asked of the trace itself (:func:`_compiled_for_export`): a strict export's, or a
    ``torch.compile``'s on another thread, whose code would otherwise keep the refusal
    of that export for every later call."""
    if torch.compiler.is_dynamo_compiling():
        return _compiled_for_export()
    return _is_exporting() and TracingContext.try_get() is not None


def _compiled_for_export() -> bool:
    """Whether torch's compiler traces the code that asks for an export: a strict one
    (or ``torch._dynamo.export``), or one on this thread that has it trace a part (a
    branch of ``torch.cond``), and not for ``torch.compile``. Asked as the code is traced,
    its answer kept in the code as it is: torch's compiler traces anew for each export.
    The process's flag alone is no answer here: read as the trace reads it, it is kept in
    compiled code as the trace found it, and a ``torch.compile`` on one thread while
    another exports would keep the refusal of that export for good. Where this torch
    cannot say, the flag is the answer."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    export = getattr(tx, "export", None)
    if export is None:  # another torch's compiler: asked as torch asks
        return _is_exporting()
    if export:
        return True
    try:
        from torch._higher_order_ops.utils import _in_hop_compile
    except ImportError:
        return False
    return _is_exporting() and _in_hop_compile()


# Called as the code is traced, the answer kept as a constant: the mark that
# ``torch.compiler.assume_constant_result`` puts, put here without importing torch's
# compiler (a second), which a process that never compiles need not load. (Traced as
# code, its questions of torch's compiler would break the graph, which a strict export
# cannot.)
_compiled_for_export._dynamo_marked_constant = True  # type: ignore[attr-defined]


def exporting_elsewhere() -> bool:
    """Whether ``torch.export`` traces on another thread, and not on this one
    (:func:`exporting`): what torch marks as never compiled refuses every call meanwhile."""
    return _is_exporting() and not exporting()


_is_exporting: Callable[[], bool] = getattr(torch.compiler, "is_exporting", lambda: False)


def transforming() -> bool:
    """Whether a ``torch.func`` transform is running, which makes each tensor read under it
    its own (``x.detach()`` of one made outside it, the weights ``functional_call`` hands
    in), not only those it hands in. Asked outside compiled code: torch.compile cannot
    trace the question."""
    return torch._C._functorch.maybe_current_level() is not None


def gradient_cut(value: torch.Tensor) -> str:
    """What of ``value``'s derivatives a recalled answer would not carry, as a message
    says it ("" for none): a gradient where one is recorded (``value`` requires grad, grad
    mode on), or a forward-mode tangent (``forward_ad.make_dual``), which flows under
    ``torch.no_grad()`` too, though not under ``torch.inference_mode()``."""
    if value.requires_grad and torch.is_grad_enabled():
        return "requires grad"
    if carries_tangent(value):
        return f"carries {TANGENT}"
    return ""


TANGENT = "a forward-mode tangent (`torch.autograd.forward_ad.make_dual`)"
"""How a message names what :func:`carries_tangent` looks for."""


def carries_tangent(value: torch.Tensor) -> bool:
    """Whether ``value`` carries a forward-mode tangent that flows through what reads it
    (``forward_ad.make_dual``): under ``torch.no_grad()`` too, not under
    ``torch.inference_mode()``. A recalled answer would carry none."""
    return (
        forward_ad._current_level >= 0
        and not torch.is_inference_mode_enabled()
        and forward_ad.unpack_dual(value).tangent is not None  # type: ignore[no-untyped-call]
    )
