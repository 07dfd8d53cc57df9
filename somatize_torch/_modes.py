"""What a traced forward does besides tensor operations: the modes it switches, and
the state it reads.

torch.fx records the calls a forward makes on tensors, and nothing else. A context
manager the forward enters is entered once, while it is traced, and left out of the
code; a value it reads from Python (``torch.is_grad_enabled()``, ``random.random()``)
is read once, and what it read is kept. The wrapped model would then compute with
gradients where the model computes without, in float32 where it computes in bf16, or
take one branch in every call, and say nothing. So while :mod:`somatize_torch._split`
traces a model, :func:`recording`:

- **records the modes the forward switches**, as calls in the traced code that switch
  them as it runs: grad mode (``torch.no_grad()``, ``torch.enable_grad()``,
  ``torch.set_grad_enabled(...)``, as a block, a decorator or a call), autocast
  (``torch.autocast(...)``) and ``torch.inference_mode()``, made of what each call
  hands them where the forward makes them so (``torch.autocast(x.device.type,
  enabled=use_amp)``). Each block puts back, on its way out, the mode it found when the
  call came — the caller's, not the one the model was traced in — and :func:`unwinding`
  leaves the blocks a failed call left open, as Python leaves the model's own;
- **refuses what fx would fix** (:class:`Fixed`): a read of grad mode, autocast or
  inference mode in the model's code; a draw from torch's random number generators for
  no traced tensor (``torch.rand([])`` is run once and kept as a constant;
  ``torch.rand_like(x)`` is recorded), which a dispatch mode sees whatever called it;
  and a call of Python's ``random`` or NumPy's ``numpy.random`` functions, through
  the module (``random.random()``), imported by name into a module a class of the
  model's is written in (``from random import random``), or kept by a part of the
  model (``self.draw = random.random``); and a draw from a ``random.Random`` of the
  model's own (or kept by a module the model is written in), one whose class draws in
  methods of its own (``random.SystemRandom``) included, or from a NumPy generator a
  part keeps (``self.rng = np.random.default_rng(0)``: stood in for where it is kept,
  since its methods are compiled and cannot be replaced on its class); and a switch of a flag of
  torch's backends (a ``torch.nn.attention.sdpa_kernel(...)`` or
  ``torch.backends.cudnn.flags(...)`` block, ``torch.backends.cudnn.enabled = False``),
  which fx keeps no call to; and asking what kind of value a module answers is
  (``isinstance(out, tuple)``), which fx answers no for its stand-in whatever the
  module hands back, or what a torch function hands back where that may be other than
  a tensor (``isinstance(torch.chunk(h, 2), tuple)``, ``isinstance(h.size(0), int)``);
  and asking whether a value fx stands in for can be called (``callable(h)``), which
  the stand-in can whatever it stands for; and asking something of the text the
  model's code made of a value fx stands in for (``"float32" in str(x.dtype)``), which
  is the stand-in's name, not the value's (printing it, or putting it in a message, is
  let be); and an autograd Function applied to a value fx stands in for
  (``GradReverse.apply(h)``, a reentrant ``torch.utils.checkpoint``), whose ``forward``
  fx records and whose ``backward`` it drops. torch's own code that reads the modes as it
  is traced (the non-reentrant ``torch.utils.checkpoint``, traced as a plain call of the
  block) keeps nothing it read in the code, and is let be.

Not seen: a function of ``random`` imported by name into another module (a helper the
forward calls) or kept elsewhere than on a part of the model (in a list, a closure), and
a ``random.SystemRandom`` or a NumPy generator found only there. Watching those would
mean watching every call the trace makes.

While a model is traced, the modes are recorded, not switched, and those it is traced in
are those of a plain call, whichever ``wrap`` is called in. Everything here watches
the tracing thread only: the functions replaced meanwhile call through to the
originals in every other thread, and are put back when the trace ends.
"""

from __future__ import annotations

import _thread
import builtins
import enum
import functools
import importlib
import importlib._bootstrap as _bootstrap
import inspect
import operator
import os
import random
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

# `import torch` loads `torch.utils.checkpoint` only from torch 2.5 on; imported here by
# name so torch 2.4 has it too
import torch.utils.checkpoint
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from somatize._threads import ProcessLock, start_thread
from somatize_torch._errors import exporting_elsewhere
from somatize_torch._text_flow import TEXT_METHODS, asked_at, kept_per_argument_at

__all__ = [
    "Fixed",
    "enter_autocast",
    "enter_inference_mode",
    "enters_blocks",
    "leave",
    "module_answering",
    "recording",
    "set_grad_enabled",
    "switches",
    "unwinding",
]


class Fixed(Exception):
    """A forward read, as it was traced, a value fx would keep as it read it then."""


# ------------------------------------------------------------------------------ the recorded calls

_here = threading.local()
"""This thread's blocks entered and not left yet (``opened``), and, while it traces a
model, what records it (``recorder``)."""


def _opened() -> list[Any]:
    opened: list[Any] | None = getattr(_here, "opened", None)
    if opened is None:
        opened = _here.opened = []
    return opened


def set_grad_enabled(mode: bool) -> None:
    """Grad mode switched by the forward. (Not ``torch._C._set_grad_enabled`` itself:
    ``split_module`` would rewrite that into the modes seen while tracing.)"""
    torch._C._set_grad_enabled(mode)


class _Entered:
    """A block the recorded code entered, handed on to the code that leaves it: an
    object of its own, so compiled code hands on this very block, not one made like it."""

    __slots__ = ("block",)

    def __init__(self, block: Any) -> None:
        self.block = block
        block.__enter__()
        _opened().append(block)


def _enter_autocast(
    device_type: str, dtype: torch.dtype | None, enabled: bool, cache_enabled: bool | None
) -> _Entered:
    return _Entered(
        torch.amp.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    )


def _enter_inference_mode(mode: bool) -> _Entered:
    return _Entered(torch._C._InferenceMode(mode))


def _leave(entered: _Entered) -> None:
    opened = _opened()
    if opened and opened[-1] is entered.block:
        opened.pop()
    entered.block.__exit__(None, None, None)


def outside_compiled(fn: Callable[..., Any], recursive: bool = True) -> Callable[..., Any]:
    """``fn`` as ``torch.compiler.disable`` makes it, never compiled (with ``recursive``,
    nor what it calls), but marked at its first call rather than now: marking imports
    torch's compiler, which takes a second, and a program that never calls ``fn`` need
    not pay for it. The mark is torch's own lazy one (``torch._disable_dynamo``), which
    torch.compile skips as it skips ``torch.compiler.disable``; where this torch lacks
    it, ``fn`` is marked now. What it returns is called through :func:`marked_as_needed`,
    which calls ``fn`` as it is where nothing compiles."""
    lazy = getattr(torch, "_disable_dynamo", None)
    if lazy is None:
        marked: Callable[..., Any] = torch.compiler.disable(fn, recursive=recursive)  # type: ignore[no-untyped-call]
        return marked
    return lazy(fn, recursive=recursive)  # type: ignore[no-any-return]


_COMPILER = "torch._dynamo"
"""torch's compiler, as ``sys.modules`` names it: until it is there, nothing in the
process compiles, and no frame is watched by it."""


def marked_as_needed(marked: Callable[..., Any]) -> Callable[..., Any]:
    """What to call for a function :func:`outside_compiled` ``marked``: the mark in
    compiled code, and wherever torch's compiler is loaded (compiled code may be running
    around the call); the function itself, as it is, in a process that has not loaded
    the compiler, where the mark would change nothing but import it (a second, at the
    first call). Called where the function is, ``marked_as_needed(_remember)(...)``:
    torch.compile reads ``is_compiling()`` as True, asks nothing more, and meets the
    mark where it met it before, one graph break in the code it compiles anyway. (Called
    inside a function of its own, the mark would break that function's code, which
    torch.compile would then compile on its own, once for each function marked.) While
    another thread exports, the function as it is where nothing compiles on this thread
    (:func:`_uncompiled_here`)."""
    if (torch.compiler.is_compiling() or _COMPILER in sys.modules) and not _uncompiled_here():
        return marked
    return unmarked(marked)


def _uncompiled_here() -> bool:
    """Whether the mark is to be left off where torch's compiler is loaded: while another
    thread exports, torch's mark refuses any call ("Non-recursive torch.compiler.disable is
    not supported with torch.export", asked of the process), and on this one, where nothing
    compiles the frames it runs (no callback of the compiler's, which torch holds per
    thread), the function as it is runs as the mark would have it run. Code torch's
    compiler traces meets the mark, asking nothing: the process's flag, read as the trace
    reads it, would be kept in the code as the trace found it, and the frame's callback
    cannot be asked there without breaking the graph."""
    if torch.compiler.is_dynamo_compiling():
        return False
    return exporting_elsewhere() and _frame_callback() is None


_frame_callback: Callable[[], Any] = getattr(
    torch._C._dynamo.eval_frame, "get_eval_frame_callback", lambda: "unknown"
)
"""The callback torch's compiler runs on each frame this thread enters, None where none
is set; a torch that cannot say is taken to have one set."""


def unmarked(marked: Callable[..., Any]) -> Callable[..., Any]:
    """The function :func:`outside_compiled` ``marked``, as it is: for a call that torch
    traces as Python (``torch.export``), which cannot call the mark."""
    plain: Callable[..., Any] = marked.__wrapped__  # type: ignore[attr-defined]
    return plain


def load_compiler() -> None:
    """Imports torch's compiler (``torch._dynamo``), as the first call of a function
    :func:`outside_compiled` marks does, whole: on a thread of its own, waited for through
    a Ctrl-C, which is raised once it is loaded. The import takes a second, and one a
    Ctrl-C stops halfway leaves ``torch._dynamo`` partly made for the process: every
    later call of a marked function, every forward, fails on it. Called before code fx
    traced first enters a block (:func:`enter_autocast`): fx's code calls what it
    recorded as it is, marked, where nothing compiles too. Where the compiler is in
    ``sys.modules`` already, it is loaded, or being loaded by another thread, which a
    Ctrl-C here does not stop."""
    if torch.compiler.is_compiling() or _COMPILER in sys.modules:  # compiled code asks no more
        return
    done = _thread.allocate_lock()
    done.acquire()
    failed: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module("torch._dynamo")
        except BaseException as error:  # raised on the caller's thread
            failed.append(error)
        finally:
            done.release()

    start_thread(threading.Thread(target=load, name="somatize-compiler-import").start)
    interrupted = False
    while True:
        try:  # a lock waited on in C: a Ctrl-C here leaves nothing held
            done.acquire()
            break
        except KeyboardInterrupt:
            interrupted = True
    if failed:
        raise failed[0]
    if interrupted:
        raise KeyboardInterrupt


# A block is entered in one call and left in another, with a graph break between them
# wherever a cached node stands: compiled code makes both calls as they are. (torch.compile
# follows grad mode itself.) fx's code calls them as it recorded them, marked, in every
# call: the first loads torch's compiler, compiled or not.
_as_they_are: Callable[[Callable[..., Any]], Callable[..., Any]] = outside_compiled


def _named_as(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn``, named as this module holds it: fx writes a function into the code it makes
    by its module and name, and a copy of the code loaded (``torch.load``) imports it so."""
    fn.__name__ = fn.__qualname__ = name
    return fn


enter_autocast = _named_as(_as_they_are(_enter_autocast), "enter_autocast")
"""An autocast block the forward enters, made as the forward made it."""
enter_inference_mode = _named_as(_as_they_are(_enter_inference_mode), "enter_inference_mode")
"""An inference-mode block the forward enters."""
leave = _named_as(_as_they_are(_leave), "leave")
"""Leaves a block entered by :func:`enter_autocast` or :func:`enter_inference_mode`."""


def grad_enabled() -> bool:
    """Grad mode as a call finds it, read by a grad-mode block of the forward to put it
    back on its way out."""
    return torch.is_grad_enabled()


RECORDED = (set_grad_enabled, grad_enabled, enter_autocast, enter_inference_mode, leave)
"""The functions recorded into the code a forward is traced into."""


def switches(code: fx.Graph) -> bool:
    """Whether recorded code switches a mode."""
    switching = (set_grad_enabled, enter_autocast, enter_inference_mode)
    return any(n.op == "call_function" and n.target in switching for n in code.nodes)


def enters_blocks(code: fx.Graph) -> bool:
    """Whether recorded code enters an autocast or inference-mode block: calls functions
    kept out of compiled code that are called marked even where nothing compiles, fx's
    code calling them as it recorded them (:func:`load_compiler` says why that matters)."""
    entering = (enter_autocast, enter_inference_mode)
    return any(n.op == "call_function" and n.target in entering for n in code.nodes)


def unwinding(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``; if it fails, the blocks it entered and did not leave
    are left, innermost first, and grad mode put back as it was before the call: what
    the model's own ``with`` blocks do on the way out. (Grad mode switched by a bare
    ``torch.set_grad_enabled(...)`` before the failure stays switched in the model;
    here it is put back too.)"""
    grad = torch.is_grad_enabled()
    opened = _opened()
    depth = len(opened)
    try:
        return call(*args, **kwargs)
    except BaseException:
        while len(opened) > depth:
            opened.pop().__exit__(None, None, None)
        torch._C._set_grad_enabled(grad)
        raise


# ------------------------------------------------------------------------------ recording


class _Recorder:
    """Records into the graph ``tracer`` builds what the forward switches."""

    def __init__(self, tracer: fx.Tracer) -> None:
        self.tracer = tracer
        self.made: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
        """The arguments each autocast block made as the forward was traced was made with."""
        self.entered: weakref.WeakKeyDictionary[Any, list[fx.Proxy]] = weakref.WeakKeyDictionary()
        """What each block entered and not left yet was entered as, innermost last."""

    def call(self, target: Callable[..., Any], *args: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", target, args, {})


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def in_torch(filename: str) -> bool:
    """Whether code in ``filename`` is torch's own: in torch's folder — not in a package
    beside it whose name begins as torch's does (``torchvision``), which is a model's."""
    return filename.startswith(_TORCH_DIR)


_GRAD_MODE = os.path.abspath(torch.autograd.grad_mode.__file__)
_AUTOCAST = torch.amp.autocast_mode.autocast
_AUTOCAST_MADE = inspect.signature(_AUTOCAST.__init__)
_INFERENCE = torch.autograd.grad_mode.inference_mode


def _caller() -> str:
    """The file of the code that called the replaced function (three frames up: this
    one, what the tracing thread gets instead, the replacement)."""
    return os.path.abspath(sys._getframe(3).f_code.co_filename)


def _switch_grad(recorder: _Recorder, original: Callable[..., Any], mode: Any) -> None:
    recorder.call(set_grad_enabled, mode)


def _read_grad(recorder: _Recorder, original: Callable[..., Any]) -> Any:
    caller = _caller()
    if caller == _GRAD_MODE:  # a grad-mode block keeping the mode it found, to put back
        return recorder.call(grad_enabled)
    if in_torch(caller):
        return original()
    raise Fixed(
        "reads `torch.is_grad_enabled()`: fx keeps the value it read while tracing, so the "
        "wrapped model would act on that value whatever grad mode it is called in"
    )


def _read_dtype(recorder: _Recorder, original: Callable[..., Any]) -> Any:
    """``torch.get_default_dtype()`` read as the forward is traced: fx keeps the dtype it
    answers in the code, so the trace is marked as one the default dtype made, which the
    wrapped model traces again under another (:attr:`somatize_torch._split._Tracer.dtyped`)."""
    tracer: Any = recorder.tracer
    tracer.dtyped = True
    return original()


def _read(name: str, what: str) -> Callable[..., Any]:
    def read(recorder: _Recorder, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if in_torch(_caller()):
            return original(*args, **kwargs)
        raise Fixed(
            f"reads `torch.{name}()`: fx keeps the value it read while tracing, so the "
            f"wrapped model would act on that value whatever {what} it is called in"
        )

    return read


def _as_text(recorder: _Recorder, original: Callable[..., Any], proxy: Any) -> Any:
    """A value fx stands in for turned into text (``str(x.dtype)``, ``f"{x.device}"``):
    by the model's code, a :class:`_Text`, the stand-in's name, which refuses to be
    compared, looked up or read; by torch's or Python's own code (a message, a log
    record), the name, as ever."""
    text = original(proxy)
    # Imported here: the module that tells the model's code apart imports this one.
    from somatize_torch._split import _model_own

    if not _model_own(_caller()):
        return text
    _refuse_asked(sys._getframe(2), _model_own)
    return _Text(text)


def _refuse_asked(frame: types.FrameType, own: Callable[[str], bool]) -> None:
    """Refuses (:class:`Fixed`) the text the model's code makes of a stand-in's in
    ``frame`` where that code, or the model's code it returns it to, asks something of
    it: Python puts a :class:`_Text` into plain text (``"{}!".format(...)``, ``"%s" %
    (...,)``, ``"-".join([...])``, an f-string of parts), which it does not mark."""
    try:
        where = asked_at(frame, own)
    except Exception as why:  # code this reading does not know: what it asks is unknown
        raise Fixed(
            'turns a value fx stands in for into text (`str(x.dtype)`, `f"{x.device}"`) in '
            f"code that cannot be followed to see whether it asks something of it "
            f"({frame.f_code.co_filename}:{frame.f_lineno}: {type(why).__name__}: {why}); "
            "what the forward does with it would be done alike whatever a call gives"
        ) from why
    if where is not None:
        raise Fixed(f"{_ASKED}. The text is asked at {where}")


def _text_made(self: str) -> None:
    """A :class:`_Text` put into more text by the model's code as it is traced
    (formatted, ``%``, ``str``), two frames up: refused where that text is asked
    something (:func:`_refuse_asked`)."""
    if getattr(_here, "recorder", None) is None:
        return
    from somatize_torch._split import _model_own

    frame = sys._getframe(2)
    if _model_own(frame.f_code.co_filename):
        _refuse_asked(frame, _model_own)


def _hashed(recorder: _Recorder, original: Callable[..., Any], proxy: Any) -> Any:
    """The hash of a value fx stands in for: asked by the model's code (``x.dtype in
    {torch.float16, torch.bfloat16}``, ``{torch.float64: 10.0}.get(x.dtype)``), refused
    (:class:`Fixed`), since the stand-in is no key of any set or dict, and what the
    forward looks up would be missed whatever a call gives; by torch's code, as ever."""
    # Imported here: the module that tells the model's code apart imports this one.
    from somatize_torch._split import _model_own

    if _model_own(_caller()) and not _kept_per_argument(sys._getframe(2)):
        raise Fixed(_HASHED)
    return original(proxy)


def _kept_per_argument(frame: types.FrameType) -> bool:
    """Whether ``frame`` is calling a function of its own cached per argument
    (``ramp(x.shape[1])``, ``self._mask(n)`` under ``functools.lru_cache``), which
    misses its cache for a stand-in, as it must, not looking the stand-in up (``in``,
    ``[...]``, ``gains.get``, ``set(...)``)."""
    try:
        return kept_per_argument_at(frame)
    except Exception:  # pragma: no cover - code this reading does not know is refused
        return False


_HASHED = (
    "looks a value fx stands in for up in a set or dict (`x.dtype in {torch.float16, "
    "torch.bfloat16}`, `{torch.float64: 10.0}.get(x.dtype)`): the stand-in is no key of "
    "it, so the branch kept would be the one for a value not there, whatever a call gives"
)


_ASKED = (
    'turns a value fx stands in for into text (`str(x.dtype)`, `f"{x.device}"`) and asks '
    "something of it: the text is the stand-in's name, not the value's, so what the forward "
    'does with it (`"float32" in str(x.dtype)`, a lookup by it) would be done alike '
    "whatever a call gives (printing it, or putting it in a message, is let be)"
)


def _asked_by_the_model() -> bool:
    """Whether the code asking a :class:`_Text` something is the model's, in a thread
    tracing it (three frames up: this one, the method asked, its caller)."""
    if getattr(_here, "recorder", None) is None:
        return False
    from somatize_torch._split import _model_own

    return _model_own(sys._getframe(2).f_code.co_filename)


class _Text(str):
    """The text the model's code made of a value fx stands in for, as it is traced: the
    stand-in's name. Printed, or put in a message, it is that name, as is more text its
    methods make of it (``name.upper()``); compared, looked up, searched or read by the
    model's code, it refuses (:class:`Fixed`), since what the forward does with it would be
    done alike whatever a call gives."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__") and _asked_by_the_model():
            if name in TEXT_METHODS:
                return functools.partial(_more_text, getattr(str, name), self)
            raise Fixed(_ASKED)
        return str.__getattribute__(self, name)


def _more_text(method: Callable[..., Any], text: str, *args: Any, **kwargs: Any) -> Any:
    """``method`` of ``text`` (``upper``, ``replace``): what it makes, a :class:`_Text` too,
    refused where it is asked something as the text it was made of is."""
    made = method(text, *args, **kwargs)
    return _Text(made) if isinstance(made, str) else made


def _refusing(name: str) -> Callable[..., Any]:
    method = getattr(str, name)

    def asked(self: str, *args: Any) -> Any:
        if _asked_by_the_model():
            raise Fixed(_ASKED)
        return method(self, *args)

    asked.__name__ = name
    return asked


def _joining(name: str) -> Callable[..., Any]:
    """A method of :class:`_Text` that makes more text of it (``"dtype " + str(x.dtype)``,
    ``str(x.dtype) * 2``, ``format``): a :class:`_Text` too, so a message built so is let
    be and a comparison of it refused, as of the text it was made of. (Python asks the
    reflected method of a subclass of ``str`` first, ``__radd__`` for ``"a" + text``.)"""
    reflected = {"__radd__": "__add__", "__rmod__": "__mod__", "__rmul__": "__mul__"}

    def joined(self: str, other: Any, /) -> Any:
        if name == "__format__":
            _text_made(self)
        if name in reflected:
            if not isinstance(other, str):
                return NotImplemented
            made = getattr(str, reflected[name])(other, str.__str__(self))
        else:
            made = getattr(str, name)(self, other)
        return _Text(made) if isinstance(made, str) else made

    joined.__name__ = name
    return joined


for _name in (
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__hash__",
    "__getitem__", "__iter__", "__len__",
):  # fmt: skip
    setattr(_Text, _name, _refusing(_name))
for _name in ("__add__", "__radd__", "__mod__", "__rmod__", "__mul__", "__rmul__", "__format__"):
    setattr(_Text, _name, _joining(_name))


def _text_of(self: str) -> str:
    """``str(text)``, and what ``"%s" % (text,)`` and ``print`` ask: the text itself, a
    :class:`_Text` still, refused where the model's code asks something of plain text
    made of it."""
    _text_made(self)
    return self


def _repr_of(self: str) -> str:
    """``repr(text)``, ``"%r" % (text,)``: as of the text, a :class:`_Text` too."""
    _text_made(self)
    return _Text(str.__repr__(self))


_Text.__str__ = _text_of  # type: ignore[method-assign,assignment]
_Text.__repr__ = _repr_of  # type: ignore[method-assign,assignment]


def _attribute_asked(recorder: _Recorder, original: Callable[..., Any], *args: Any) -> Any:
    """``hasattr`` and ``getattr`` in the tracing thread, made by :func:`_asking_attribute`
    (this one marks them in :func:`_replacements`)."""
    return original(*args)


_ATTRIBUTE_ASKED = (
    'asks whether a value fx stands in for has an attribute (`hasattr(h, "marked")`, '
    '`getattr(x, "gain", None)`): the stand-in answers any name, so the branch kept would '
    "be the one for a value that has it, whatever a call gives"
)


def _asking_attribute(original: Any) -> Any:
    """``hasattr``, or ``getattr`` (``original``), replaced: asked by the model's code of a
    value fx stands in for, whether it has an attribute (``getattr`` with a default), it
    refuses (:class:`Fixed`), since the stand-in answers yes for any name; asked anything
    else, as it is, at once (torch and fx read attributes at every step they take)."""
    asking = original is builtins.hasattr

    @functools.wraps(original)
    def replaced(value: Any, name: Any, /, *default: Any) -> Any:
        if (
            not (asking or default)
            or not issubclass(type(value), fx.Proxy)
            or _here.__dict__.get("recorder") is None
        ):
            return original(value, name, *default)
        # Imported here: the module that tells the model's code apart imports this one.
        from somatize_torch._split import _model_own

        if _model_own(sys._getframe(1).f_code.co_filename):
            raise Fixed(_ATTRIBUTE_ASKED)
        return original(value, name, *default)

    return replaced


def _callable_asked(recorder: _Recorder, original: Callable[..., Any], value: Any) -> Any:
    """``callable`` in the tracing thread, made by :func:`_asking_callable` (this one marks
    it in :func:`_replacements`)."""
    return original(value)


_CALLABLE_ASKED = (
    "asks whether a value fx stands in for can be called (`callable(h)`): the stand-in "
    "can, whatever a call gives (a tensor cannot), so the branch kept would be the one for "
    "a value that can be called in every call"
)


def _asking_callable(original: Any) -> Any:
    """``callable`` (``original``) replaced: asked by the model's code of a value fx stands
    in for, it refuses (:class:`Fixed`), since the stand-in answers yes whatever it stands
    for; asked anything else, as it is, at once."""

    @functools.wraps(original)
    def replaced(value: Any, /) -> Any:
        if not issubclass(type(value), fx.Proxy) or _here.__dict__.get("recorder") is None:
            return original(value)
        # Imported here: the module that tells the model's code apart imports this one.
        from somatize_torch._split import _model_own

        if _model_own(sys._getframe(1).f_code.co_filename):
            raise Fixed(_CALLABLE_ASKED)
        return original(value)

    return replaced


_ASKING_ATTRIBUTE = _asking_attribute(builtins.hasattr).__code__
"""The code ``hasattr`` and ``getattr`` run through in the tracing thread."""


def _code_of(fn: Any) -> Any:
    """The code of ``fn``, a function written in Python, else None."""
    return fn.__code__ if type(fn) is types.FunctionType else None


def read_by(frame: types.FrameType) -> str:
    """The file of the code reading an attribute in ``frame``: of its caller, where
    ``frame`` is the ``hasattr`` or ``getattr`` a tracing thread runs through."""
    if frame.f_code is _ASKING_ATTRIBUTE and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code.co_filename


def _draw(name: str, source: str) -> Callable[..., Any]:
    def draw(recorder: _Recorder, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if "seed" in name or "state" in name:
            raise Fixed(
                f"seeds {source} (`{name}()`): fx keeps no call to it, so the wrapped model "
                "would never seed it"
            )
        raise Fixed(
            f"draws from {source} (`{name}()`): fx keeps the value it drew while tracing, "
            "not the call, so the wrapped model would use that value in every call"
        )

    return draw


_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""This package's folder: its own checks of what it is handed are not the forward's."""


_IS_TENSOR = torch.is_tensor.__code__
"""``torch.is_tensor``'s code: its ``isinstance`` is asked for its caller."""


def _asker() -> str:
    """The file of the code that asked :func:`_tensor_check`'s ``isinstance``: the caller
    of ``torch.is_tensor`` where that asked, which is the forward's question, not
    torch's."""
    frame = sys._getframe(3)
    if frame.f_code is _IS_TENSOR and frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code.co_filename


def _tensor_check(recorder: _Recorder, original: Callable[..., Any], value: Any, kinds: Any) -> Any:
    """``isinstance`` in the tracing thread: the forward asking whether what fx hands it in
    a tensor's place is a tensor, which it never is while fx traces (a stand-in), so the
    branch fx keeps would be the one for a value that is no tensor."""
    if not original(value, fx.Proxy):
        return original(value, kinds)  # fx's own values, mostly: asked as they are
    caller = _asker()
    by_the_model = not (in_torch(caller) or caller.startswith(_OURS))
    if _names_a_plain_kind(kinds, original) or (
        _names_a_tensor(kinds, original) and _annotated_plain(value.node.type)
    ):
        # An argument with a plain default asked after as a plain kind (`isinstance(flag,
        # bool)`), or, annotated as taking plain values only, as a tensor
        # (`isinstance(scale, torch.Tensor)`): fx would answer no for every value. A
        # branch on its value, so the argument is traced fixed at the value a call gives.
        node = value.node
        if (
            node.op == "placeholder"
            and node.args
            and _is_plain(node.args[0], original)
            # Not one annotated as taking a tensor too, whose calls may hand it one.
            and "Tensor" not in str(node.type)
            and by_the_model
        ):
            value.tracer.branched = frozenset({str(node.target)})
            raise fx.proxy.TraceError(
                f"asks what kind of value `{node.target}` is (`isinstance`): fx stands in "
                "for it, and would answer no whatever a call gives"
            )
    if (
        by_the_model
        and value.node.op == "placeholder"
        and str(value.node.target) in getattr(value.tracer, "containers", ())
    ):
        raise Fixed(
            f"asks what kind of value `{value.node.target}` is (`isinstance`), which "
            "this call hands a list, tuple or dict: fx stands in for it while it traces, "
            "and would answer no whatever the call gives"
        )
    called = module_answering(value.node)
    if called is not None and by_the_model:
        raise Fixed(
            f"asks what kind of value the answer of `{called.target}`, or an item of it, "
            "is (`isinstance`): fx stands in for what a module answers while it traces, "
            "and would answer no "
            "whether the module hands back a tensor, a tuple or a dict, so the branch "
            "kept would be the one for a value of no such kind in every call. Take what "
            "the module answers as the kind it is (`out[0]`, `out['h']`)"
        )
    if by_the_model and not _names_a_tensor(kinds, original):
        made = _made_by_torch(value.node, getattr(value.tracer, "containers", ()))
        if made is not None and _may_answer_yes(kinds, original, value):
            raise Fixed(
                f"asks of {made} what kind of value it is (`isinstance`): fx stands in for it "
                "while it traces, and would answer no whether it is a tensor, a tuple, a "
                "`torch.Size` or a number, so the branch kept would be the one for a value "
                "of no such kind in every call. Take it as the kind torch hands back "
                "(`torch.chunk` and `torch.split` a tuple of tensors, `x.size(0)` an int), "
                "without asking"
            )
    if by_the_model and _names_a_tensor(kinds, original):
        raise Fixed(
            "asks whether a value fx stands in for is a tensor (`isinstance(x, "
            "torch.Tensor)`): while fx traces, no input, buffer or value made of them is "
            "one, so the branch kept would be the one for a value that is no tensor, and "
            "the wrapped model would take it in every call"
        )
    return original(value, kinds)


def module_answering(node: fx.Node) -> fx.Node | None:
    """The call of a module (a declared submodule, or a layer fx does not trace into) whose
    answer ``node`` is, or holds (an item or attribute taken out of it, ``out[0]``,
    ``out.hidden``); None where ``node`` is no such value. What a module answers is the
    one value fx knows nothing of the kind of: a tensor, a tuple, a dict."""
    while (
        node.op == "call_function"
        and (
            node.target is operator.getitem
            or getattr(node.target, "__wrapped__", node.target) is _GETATTR
        )
        and type(node.args[0]) is fx.Node
    ):
        node = node.args[0]
    return node if node.op == "call_module" else None


def _made_by_torch(node: fx.Node, containers: Any) -> str | None:
    """What made ``node``, said for a message, where it may be other than a tensor: the
    call of a torch function, method or operator (``torch.chunk(h, 2)``, ``h.size(0)``,
    ``h.shape``, ``torch.max(h, dim=1)``) that may hand back a tuple, a ``torch.Size`` or
    a number; None where it is a tensor in every call (:func:`_a_tensor`), and where it is
    no such call (an input, what a module answers: asked of elsewhere)."""
    if node.op not in ("call_function", "call_method") or _a_tensor(node, containers):
        return None
    target = node.target
    if node.op == "call_method":
        return f"what `.{target}()` hands back"
    if getattr(target, "__wrapped__", target) is _GETATTR and len(node.args) > 1:
        return f"the `.{node.args[1]}` of a tensor"
    if target is operator.getitem:
        return "an item of what torch hands back"
    name = getattr(target, "__name__", None) or repr(target)
    module = str(getattr(target, "__module__", None) or "")
    if module == "_operator":
        return f"what `operator.{name}` hands back"  # `h * 2`, where `h` may be a tuple
    if type(target) is types.BuiltinFunctionType and module.startswith("torch"):
        return f"what `torch.{name}` hands back"  # `torch.chunk`, not its C class
    return f"what `{module}.{name}` hands back" if module else f"what `{name}` hands back"


def _a_tensor(node: Any, containers: Any, depth: int = 0) -> bool:
    """Whether ``node`` stands for a tensor in every call: an input taken as one (not a
    list, tuple or dict, not ``*args``), a parameter or buffer, or what an operator or a
    call of torch's makes of one whose every overload taking a tensor first hands back a
    tensor (``x * 2``, ``h.flatten(1)``, ``torch.relu(h)``, ``parts[0]`` of
    ``torch.chunk(h, 2)``)."""
    if type(node) is not fx.Node or depth > 64:
        return False
    if node.op == "placeholder":
        name = str(node.target)
        return not name.startswith("*") and name not in containers
    if node.op == "get_attr":
        return True
    if node.op not in ("call_function", "call_method") or not node.args:
        return False
    first = node.args[0]
    target: Any = node.target
    if target is operator.getitem:
        if type(node.args[1]) is int and _returns(first, containers, depth) == ("Tensor[]",):
            return True  # an item of `torch.chunk(h, 2)`
        return _a_tensor(first, containers, depth + 1)
    if target in _TENSOR_OPERATORS:
        return any(_a_tensor(one, containers, depth + 1) for one in node.args)
    if getattr(target, "__wrapped__", target) is _GETATTR:
        return node.args[1:2] in _TENSOR_ATTRIBUTES and _a_tensor(first, containers, depth + 1)
    return _returns(node, containers, depth) == ("Tensor",)


def _returns(node: Any, containers: Any, depth: int) -> tuple[str, ...] | None:
    """What every overload of the torch function or method ``node`` calls that takes a
    tensor first hands back, by torch's own schemas (``("Tensor",)`` for ``relu``,
    ``("Tensor[]",)`` for ``chunk``); None where the overloads differ (``max``: a tensor,
    or values and indices), none is known, or the method may be a tuple's, a list's or a
    number's, called on one."""
    if type(node) is not fx.Node or node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if node.op == "call_method":
        name = str(target)
        if name in _TENSOR_METHODS:  # `int` and `float` name a number's methods too
            return ("Tensor",) if _a_tensor(node.args[0], containers, depth + 1) else None
    elif type(target) is types.BuiltinFunctionType and str(
        getattr(target, "__module__", None)
    ).startswith("torch"):
        name = target.__name__
    else:
        return None
    if not node.args or (
        # A method of a tuple, list or number too (`sizes.index(4)`), called on a value that
        # may be one.
        node.op == "call_method"
        and any(hasattr(kind, name) for kind in _PLAIN_HOLDERS)
        and not _a_tensor(node.args[0], containers, depth + 1)
    ):
        return None
    returns = _schema_returns(name)
    return next(iter(returns)) if len(returns) == 1 else None


@functools.lru_cache(maxsize=1024)
def _schema_returns(name: str) -> frozenset[tuple[str, ...]]:
    """What the overloads of the ATen operator ``name`` that take a tensor first hand back,
    each as the types of what it returns (``Tensor[]`` for a list of tensors)."""
    found: set[tuple[str, ...]] = set()
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        if schema.arguments and str(schema.arguments[0].type) == "Tensor":
            kinds = tuple(str(one.type) for one in schema.returns)
            found.add(tuple("Tensor[]" if kind == "List[Tensor]" else kind for kind in kinds))
    return frozenset(found)


_TENSOR_OPERATORS = frozenset(
    {
        operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
        operator.mod, operator.pow, operator.matmul, operator.neg, operator.pos,
        operator.invert, operator.and_, operator.or_, operator.xor, operator.lshift,
        operator.rshift, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
        operator.ge, operator.abs,
    }
)  # fmt: skip
"""The operators fx records of a stand-in that, on a tensor, hand back a tensor."""

_TENSOR_METHODS = frozenset(
    {"float", "double", "half", "bfloat16", "int", "long", "short", "bool", "byte", "char"}
    | {"cpu", "cuda"}
)
"""Methods of a tensor that hand back a tensor, of no ATen operator of their name."""

_PLAIN_HOLDERS = (tuple, list, dict, int, float, complex, str, torch.Size)
"""Kinds of value whose methods a stand-in's method may be, other than a tensor's."""

_TENSOR_ATTRIBUTES = frozenset({("T",), ("mT",), ("H",), ("mH",), ("real",), ("imag",), ("data",)})
"""The attributes of a tensor that are tensors in turn (as ``node.args[1:2]``)."""

_TORCH_ANSWERS = (
    torch.Tensor, tuple, list, torch.Size, int, float, bool, complex, torch.dtype,
    torch.device, torch.layout, torch.memory_format, str, type(None),
)  # fmt: skip
"""The kinds of value a torch function, method or attribute may hand back."""


def _may_answer_yes(kinds: Any, check: Callable[..., Any], value: Any) -> bool:
    """Whether ``isinstance(value, kinds)`` of what torch hands back may answer yes where
    fx answers no for its stand-in ``value``: ``kinds`` names one of what torch may hand
    back (:data:`_TORCH_ANSWERS`), a kind of which (a namedtuple, ``torch.Size``) or one
    they are of (``collections.abc.Sequence``, ``numbers.Number``)."""
    if check(kinds, tuple):
        return any(_may_answer_yes(kind, check, value) for kind in kinds)
    if check(kinds, type):
        return not check(value, kinds) and any(
            issubclass(answer, kinds) or issubclass(kinds, answer) for answer in _TORCH_ANSWERS
        )
    return any(_may_answer_yes(kind, check, value) for kind in getattr(kinds, "__args__", ()))


_GETATTR = builtins.getattr
"""``getattr``, the target of a node fx makes of an attribute of a stand-in
(``out.hidden``): as it is, or replaced while a trace runs."""


_PLAIN_KINDS = (bool, int, float, complex, str, bytes, enum.Enum)
"""The kinds of plain values an argument the forward branches on is traced fixed at."""


_PLAIN_NAMES = frozenset({"bool", "int", "float", "complex", "str", "bytes"})
_ANNOTATION_PARTS = re.compile(r"[\s|,\[\]]+")


def _annotated_plain(annotation: Any) -> bool:
    """Whether ``annotation`` (a forward's, a string under ``from __future__ import
    annotations``) names plain kinds of value only, None aside (``float``, ``int | None``):
    not a tensor, and not ``Any`` or none, which a call may hand a tensor."""
    if annotation is None or annotation is inspect.Parameter.empty:
        return False
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    parts = [
        part
        for part in _ANNOTATION_PARTS.split(text)
        if part
        and part not in ("None", "NoneType", "Optional", "Union")
        and part not in ("typing.Optional", "typing.Union")
    ]
    return bool(parts) and all(part in _PLAIN_NAMES for part in parts)


def _names_a_plain_kind(kinds: Any, check: Callable[..., Any]) -> bool:
    """Whether ``kinds`` (a class, a tuple or union of them) names only plain kinds of
    value (:data:`_PLAIN_KINDS`), and not a tensor."""
    if check(kinds, tuple):
        return bool(kinds) and all(_names_a_plain_kind(kind, check) for kind in kinds)
    if check(kinds, type):
        return issubclass(kinds, _PLAIN_KINDS)
    inner = getattr(kinds, "__args__", ())
    return bool(inner) and all(_names_a_plain_kind(kind, check) for kind in inner)


def _is_plain(value: Any, check: Callable[..., Any]) -> bool:
    """Whether ``value`` is a plain value, not None (an argument's default)."""
    return value is not None and check(value, _PLAIN_KINDS)


def _names_a_tensor(kinds: Any, check: Callable[..., Any]) -> bool:
    """Whether ``kinds`` (a class, a tuple or union of them) names torch's tensor or a
    subclass of it."""
    if check(kinds, tuple):
        return any(_names_a_tensor(kind, check) for kind in kinds)
    if check(kinds, type):
        return issubclass(kinds, torch.Tensor)
    return any(_names_a_tensor(kind, check) for kind in getattr(kinds, "__args__", ()))


def _flag(name: str) -> Callable[..., Any]:
    def flag(recorder: _Recorder, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise Fixed(
            f"switches a flag of torch's backends (`{name}`, as a block of "
            "`torch.nn.attention.sdpa_kernel(...)` or `torch.backends.*.flags(...)` does, or "
            "a setting of `torch.backends`): fx keeps no call to it, so the wrapped model "
            "would run with whatever flags it is called with"
        )

    return flag


def _applied(recorder: _Recorder, original: Callable[..., Any], *args: Any) -> Any:
    """Marks ``torch.autograd.Function.apply`` in :func:`_replacements`: replaced by
    :func:`_applying`, as a class method."""
    return original(*args)


def _applying(original: Any) -> classmethod[Any, ..., Any]:
    """``torch.autograd.Function.apply`` (``original``, bound) replaced: a Function applied
    to a value fx stands in for is refused. fx runs its ``forward`` on the stand-ins and
    records what it does, and keeps nothing of its ``backward``: the wrapped model would
    train by the gradient of what the forward computes, not the Function's (a reversed or
    straight-through one), and a reentrant ``torch.utils.checkpoint``, which runs its
    block without gradients in its forward, would train neither the block nor what
    feeds it."""
    apply = original.__func__

    @functools.wraps(apply)
    def replaced(cls: Any, *args: Any, **kwargs: Any) -> Any:
        recorder: _Recorder | None = getattr(_here, "recorder", None)
        if recorder is None or not any(isinstance(a, fx.Proxy) for a in (*args, *kwargs.values())):
            return apply(cls, *args, **kwargs)
        if cls.__module__ == _CHECKPOINTING:
            raise Fixed(
                "runs a reentrant `torch.utils.checkpoint` (`use_reentrant=True`), an "
                "autograd Function whose forward runs the block without gradients: fx "
                "records what that forward does and keeps none of the Function's backward, "
                "so the wrapped model would train neither the block nor what feeds it. "
                "Checkpoint with `use_reentrant=False`, which fx traces as a plain call of "
                "the block (its activations kept, not recomputed)"
            )
        raise Fixed(
            f"applies `{cls.__qualname__}.apply`, a `torch.autograd.Function`: fx records "
            "what its forward does and keeps none of its backward, so the wrapped model "
            "would train by the gradient of what the forward computes, not the one the "
            "Function hands back"
        )

    return classmethod(replaced)


_CHECKPOINTING = torch.utils.checkpoint.__name__
"""Where torch's reentrant checkpoint is written, an autograd Function."""


def _set_prop(
    recorder: _Recorder, original: Callable[..., Any], prop: Any, owner: Any, value: Any
) -> None:
    named = [name for name, held in vars(type(owner)).items() if held is prop]
    where = f"{getattr(owner, '__name__', 'torch.backends')}.{named[0] if named else '...'}"
    _flag(f"{where} = {value!r}")(recorder, original)


_FLAGS = (
    "_set_sdp_",
    "_set_math_sdp_",
    "_set_cudnn_",
    "_set_cublas_",
    "_set_cpu_allow_",
    "_set_mkldnn_",
    "_set_onednn_",
    "_set_miopen_",
    "_set_nnpack_",
    "_set_blas_",
    "_set_linalg_",
    "_set_rocm_fa_",
    "_set_fp32_precision_",
    "_set_float32_matmul_precision",
    "_set_deterministic_algorithms",
)
"""What sets a flag of torch's backends, by the start of its name in ``torch._C``: what
``torch.backends`` and ``sdpa_kernel`` call, looked up as they call it."""


_DROPOUTS = ("dropout_p", "dropout")
"""The arguments of a kernel torch tags as drawing for the dropout it may apply (an
attention's, a recurrent layer's) that say how much it drops: none, it draws nothing."""


def _draws(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func``, called with ``args`` and ``kwargs``, draws at random: it is one
    torch tags ``nondeterministic_seeded``, and not a kernel tagged so for a dropout it
    applies none of (``F.scaled_dot_product_attention`` with ``dropout_p=0``, as
    ``nn.MultiheadAttention`` runs in eval; a cuDNN LSTM out of training)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for at, argument in enumerate(func._schema.arguments):
        if argument.name not in (*_DROPOUTS, "train"):
            continue
        value = args[at] if at < len(args) else kwargs.get(argument.name, argument.default_value)
        dropping = value is not False if argument.name == "train" else value != 0
        if not dropping:
            return False
    return True


class DrawsSeen(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Notes (:attr:`drew`) an operation of torch's that draws at random (:func:`_draws`:
    ``randn_like``, a dropout's ``bernoulli_``) run in the thread it is entered in, and in
    that thread only: torch's generators are the process's, and another thread's draw
    moves them as this one's does."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.drew = False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if _draws(func, args, kwargs):
            self.drawn(func)
        return func(*args, **kwargs)

    def drawn(self, func: Any) -> None:
        """Told of ``func``, an operation that draws, as it is run."""
        self.drew = True


class _Draws(DrawsSeen):  # type: ignore[no-untyped-call]
    """Refuses, in the thread that traces, an operation of torch's that draws at random:
    one fx runs as it traces (no traced tensor goes into it, so none comes out of it),
    whose result it keeps as a constant. A draw for a traced tensor never gets here."""

    def drawn(self, func: Any) -> None:
        raise Fixed(
            f"draws from torch's random number generator (`{func}`) for no traced tensor "
            "(`torch.rand([])`, a tensor made with numbers for its size): fx runs the "
            "call once, while tracing, and keeps what it drew as a constant, so the "
            "wrapped model would use that in every call. Draw for a tensor it is handed "
            "(`torch.rand_like(x)`, `torch.rand(x.shape)`), which fx records"
        )


def _autocast_made(
    recorder: _Recorder, original: Callable[..., Any], block: Any, *args: Any, **kwargs: Any
) -> None:
    bound = _AUTOCAST_MADE.bind(block, *args, **kwargs)
    bound.apply_defaults()
    # Made of what the forward is handed (`x.device.type`, `enabled=use_amp`), it is
    # checked as the call comes, not here: the block traced is never entered.
    if not any(isinstance(value, fx.Proxy) for value in bound.arguments.values()):
        original(block, *args, **kwargs)
    # Made again as the call comes, so what it leaves to the modes then (no dtype given:
    # the one autocast has) is settled then, and what the call hands it is used.
    recorder.made[block] = tuple(bound.arguments.values())[1:]


def _autocast_entered(recorder: _Recorder, original: Callable[..., Any], block: Any) -> Any:
    made = recorder.made.get(block)
    if made is None:  # made before the trace, and settled then
        made = (block.device, block.fast_dtype, block._enabled, block._cache_enabled)
    recorder.entered.setdefault(block, []).append(recorder.call(enter_autocast, *made))
    return block


def _inference_made(
    recorder: _Recorder, original: Callable[..., Any], kind: Any, mode: Any = True
) -> Any:
    if isinstance(mode, fx.Proxy):  # a mode the forward is handed: a block, not a decorator
        return object.__new__(kind)
    return original(kind, mode)


def _inference_entered(recorder: _Recorder, original: Callable[..., Any], block: Any) -> None:
    recorder.entered.setdefault(block, []).append(recorder.call(enter_inference_mode, block.mode))


def _left(recorder: _Recorder, original: Callable[..., Any], block: Any, *exc: Any) -> bool:
    entered = recorder.entered.get(block)
    if entered:
        recorder.call(leave, entered.pop())
    return False


def _homes(model: torch.nn.Module) -> set[Any]:
    """The modules (Python's) the classes of ``model``'s parts are written in, torch's
    own left out: where a forward finds a function it imported by name."""
    homes = set()
    for part in model.modules():
        for kind in type(part).__mro__:
            home = sys.modules.get(kind.__module__)
            if home is not None and not in_torch(
                os.path.abspath(getattr(home, "__file__", "") or "")
            ):
                homes.add(home)
    return homes


def _replacements(model: torch.nn.Module) -> list[tuple[Any, str, Callable[..., Any]]]:
    """Each function replaced while a thread traces ``model``: where it lives, its name,
    and what the tracing thread gets instead."""
    found: list[tuple[Any, str, Callable[..., Any]]] = [
        (builtins, "isinstance", _tensor_check),
        (builtins, "hasattr", _attribute_asked),
        (builtins, "getattr", _attribute_asked),
        (builtins, "callable", _callable_asked),
        (fx.Proxy, "__repr__", _as_text),
        (fx.proxy.ParameterProxy, "__repr__", _as_text),
        (fx.Proxy, "__hash__", _hashed),
        (torch.autograd.Function, "apply", _applied),
        (torch._C, "_set_grad_enabled", _switch_grad),
        (torch, "is_grad_enabled", _read_grad),
        (torch, "get_default_dtype", _read_dtype),
        (torch, "is_inference_mode_enabled", _read("is_inference_mode_enabled", "mode")),
        (_AUTOCAST, "__init__", _autocast_made),
        (_AUTOCAST, "__enter__", _autocast_entered),
        (_AUTOCAST, "__exit__", _left),
        (_INFERENCE, "__new__", _inference_made),
        (_INFERENCE, "__enter__", _inference_entered),
        (_INFERENCE, "__exit__", _left),
    ]
    found += [
        (torch, name, _read(name, "autocast"))
        for name in dir(torch)
        if name.startswith(("is_autocast_", "get_autocast_"))
        and name.endswith(("_enabled", "_dtype"))
    ]
    found += [
        (torch._C, name, _flag(f"torch._C.{name}()"))
        for name in dir(torch._C)
        if name.startswith(_FLAGS)
    ]
    # A flag set as an attribute (`torch.backends.cudnn.enabled = False`), whose setter
    # was looked up as torch was imported.
    found.append((torch.backends.ContextProp, "__set__", _set_prop))
    found += [
        (torch, name, _draw(f"torch.{name}", "torch's random number generator"))
        for name in ("manual_seed", "seed", "set_rng_state")
    ]
    found += [
        (random, name, _draw(f"random.{name}", "Python's `random`"))
        for name in random.__all__
        if name != "getstate" and getattr(getattr(random, name), "__self__", None) is random._inst
    ]
    # A generator of the model's own: every draw of a `random.Random` comes to one of
    # these, looked up on its class as the draw is made.
    found += [
        (random.Random, name, _draw(f"random.Random.{name}", "Python's `random`"))
        for name in _GENERATING
    ]
    numpy_random = sys.modules.get("numpy.random")
    shared = numpy_random.mtrand._rand if numpy_random is not None else None
    if numpy_random is not None:
        found += [
            (numpy_random, name, _draw(f"numpy.random.{name}", "NumPy's random generator"))
            for name in dir(numpy_random)
            if name != "get_state" and getattr(getattr(numpy_random, name), "__self__", 0) is shared
        ]
    # A function of theirs imported by name (`from random import random`) into a module
    # the model is written in, or kept by a part of the model (`self.draw = random.random`),
    # which holds it bound and would not see it replaced where it came from.
    holders = [*(_homes(model) - {random, numpy_random}), *model.modules()]
    generators: dict[type[random.Random], None] = {}
    numpy_generators = _numpy_generators(numpy_random)
    for holder in holders:
        for name, value in list(vars(holder).items()):
            drawn = _drawn_by(value, shared)
            if drawn is not None:
                found.append((holder, name, _draw(*drawn)))
            generator = _generator_of(value)
            if generator is not None:
                generators[type(generator)] = None
            if numpy_generators and isinstance(value, numpy_generators):
                # Its methods are compiled, and cannot be replaced on its class: the
                # generator is stood in for where it is kept (`self.rng`).
                found.append((holder, name, _STANDS_IN))
    # A generator whose class draws in methods of its own (`random.SystemRandom`), which
    # those of `random.Random` replaced above never see.
    for drawing in generators:
        for kind in drawing.__mro__[: drawing.__mro__.index(random.Random)]:
            made = _named(kind)
            found += [
                (kind, name, _draw(f"{made}.{name}", "Python's `random`"))
                for name in _GENERATING
                if name in vars(kind)
            ]
    return found


_GENERATING = ("random", "getrandbits", "seed", "setstate")
"""The methods of a ``random.Random`` that every draw (and seeding) of it comes to."""


def _named(kind: type) -> str:
    """A class by the name its users write: ``random.SystemRandom``."""
    return f"{kind.__module__}.{kind.__qualname__}"


def _generator_of(value: Any) -> random.Random | None:
    """The ``random.Random`` ``value`` is, or is a method of; None if neither."""
    try:
        for generator in (value, getattr(value, "__self__", None)):
            if isinstance(generator, random.Random):
                return generator
    except Exception:  # a lazy module's attribute, say: nothing of random's
        pass
    return None


def _drawn_by(value: Any, shared: Any) -> tuple[str, str] | None:
    """What ``value`` is named by and draws from, if it is a function of ``random``'s or
    ``numpy.random``'s that draws (or seeds), or a method of a ``random.Random`` of one's
    own; None if it is anything else."""
    try:
        owner = getattr(value, "__self__", None)
        name = getattr(value, "__name__", "")
    except Exception:  # a lazy module's attribute, say: nothing of random's
        return None
    if isinstance(owner, random.Random) and name != "getstate":
        made = "random" if owner is random._inst else _named(type(owner))
        return f"{made}.{name}", "Python's `random`"
    if owner is not None and owner is shared and name != "get_state":
        return f"numpy.random.{name}", "NumPy's random generator"
    return None


def _numpy_generators(numpy_random: Any) -> tuple[type, ...]:
    """NumPy's kinds of generator, where NumPy is imported: a model that keeps one has."""
    if numpy_random is None:
        return ()
    return tuple(
        kind
        for kind in (getattr(numpy_random, name, None) for name in ("Generator", "RandomState"))
        if isinstance(kind, type)
    )


class _Drawing:
    """Stands in for a NumPy generator a part of a model keeps (``self.rng =
    np.random.default_rng(0)``) while the model is traced: each of its methods is the
    generator's, replaced as ``numpy.random``'s functions are, so a draw is refused in
    the tracing thread and made in any other."""

    def __init__(self, generator: Any) -> None:
        self._generator = generator
        self._kind = f"numpy.random.{type(generator).__name__}"  # as its users name it

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._generator, name)
        if not callable(found) or name in _READING:
            return found
        return _replaced(found, _draw(f"{self._kind}.{name}", "NumPy's random generator"))


_READING = frozenset({"get_state", "__getstate__", "__reduce__", "__repr__", "__str__"})
"""The methods of a NumPy generator that read it and draw nothing."""


_STANDS_IN = _draw("numpy.random.Generator", "NumPy's random generator")
"""Said of a NumPy generator a part keeps: not replaced as a function is, but stood in
for by a :class:`_Drawing`."""


def _replaced(original: Any, instead: Callable[..., Any]) -> Any:
    if instead is _STANDS_IN:
        return _Drawing(original)
    if instead is _tensor_check:
        return _asking_kind(original)
    if instead is _attribute_asked:
        return _asking_attribute(original)
    if instead is _callable_asked:
        return _asking_callable(original)
    if instead is _applied:
        return _applying(original)

    @functools.wraps(original)
    def replaced(*args: Any, **kwargs: Any) -> Any:
        recorder: _Recorder | None = getattr(_here, "recorder", None)
        # No module being imported in any thread (each holds its lock as it runs): no
        # frame of Python's import to look for, at each of the calls a trace makes.
        if recorder is None or (_IMPORT_LOCKS and _importing()):
            return original(*args, **kwargs)
        return instead(recorder, original, *args, **kwargs)

    return replaced


def _asking_kind(original: Any) -> Any:
    """``isinstance`` (``original``) replaced: asked in the tracing thread of a value fx
    stands in for, by :func:`_tensor_check`; of any other value, as it is, at once (fx
    asks it of its own values at every step it takes)."""

    @functools.wraps(original)
    def replaced(value: Any, kinds: Any, /) -> Any:
        recorder: _Recorder | None = getattr(_here, "recorder", None)
        if recorder is None or not original(value, fx.Proxy) or (_IMPORT_LOCKS and _importing()):
            return original(value, kinds)
        return _tensor_check(recorder, original, value, kinds)

    return replaced


_IMPORTING = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})
"""Where Python's import runs a module's code (its frames' ``__name__``)."""

_IMPORT_LOCKS: dict[str, Any] = getattr(_bootstrap, "_module_locks", {"": None})
"""The lock of each module being imported, in any thread, held as its code runs (where
Python keeps none there, one taken as always held)."""

_TRACING = "torch.fx._symbolic_trace"
"""Where fx runs the forward it traces (and the modules it calls): the frames above it
are not the forward's."""


def _importing() -> bool:
    """Whether a replaced function is called by a module's code run as the forward imports
    it — sympy's, which torch imports the first time it needs it and which makes and seeds
    a ``random.Random`` as it is imported: that code runs once in a process, not at each
    call, and is no part of what the forward computes. Looked for between the call and
    fx's tracing only, so a model traced as the module it is written in is imported is
    still refused what its forward does."""
    frame: types.FrameType | None = sys._getframe(2)  # what called the replaced function
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if name in _IMPORTING:
            return True
        if name == _TRACING:
            return False
        frame = frame.f_back
    return False


_ABSENT: Any = object()
_DisableAutocast: Callable[[], Any] = torch._C._DisableAutocast
"""Autocast off on every device (and said to be off), while it is held."""
_installing = ProcessLock()
"""Held while a thread traces: another one waits to replace what this one replaced. A
forked child gets it unheld, with what a thread of its parent's trace replaced put back
(:func:`swapped`)."""

_SWAPPED: list[Callable[[], None]] = []
"""What the trace under way changed for every thread, as the calls that put each back,
innermost last (:func:`swapped`): only the thread holding :data:`_installing` adds to it."""


@contextmanager
def swapped(put_back: Callable[[], None]) -> Iterator[None]:
    """Within a trace (:data:`_installing` held), around a block that changes what every
    thread sees (a function replaced, a class's lookup, the model's train mode):
    ``put_back`` puts it back as the block ends, and in a child forked meanwhile
    (:func:`put_back_in_child`)."""
    with put_back_in_child(put_back):
        try:
            yield
        finally:
            put_back()


@contextmanager
def put_back_in_child(put_back: Callable[[], None]) -> Iterator[None]:
    """Within a trace (:data:`_installing` held), around a block that changes what every
    thread sees: ``put_back`` puts it back in a child forked meanwhile by another thread
    (a DataLoader worker forked as a server thread traces), which has no thread to end
    the block, as it starts (:func:`_put_back_in_child`): the child's own calls would go
    through what the trace put in, and its own trace would take that for what it
    replaces. The fork may come at any point of the block, and of what puts it back
    there: ``put_back`` puts back what was changed so far, and again what was put back."""
    try:
        _SWAPPED.append(put_back)
        yield
    finally:
        if put_back in _SWAPPED:
            _SWAPPED.remove(put_back)


def _put_back_in_child() -> None:
    """Runs in a forked child, on its only thread, before the fork returns there: what the
    trace of another thread of the parent changed for every thread is put back, innermost
    first. A trace of the thread that forked goes on in the child, and puts back its own.
    One that fails does not keep the others (the builtins, outermost) as the trace left
    them: each is put back, and the first failure is raised after, for Python to report."""
    if _installing.held_here():
        return
    failed: BaseException | None = None
    while _SWAPPED:
        try:
            _SWAPPED.pop()()
        except BaseException as error:  # the rest put back all the same
            failed = failed or error
    if failed is not None:
        raise failed


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_put_back_in_child)


def _put(owner: Any, name: str, was: Any) -> None:
    """Gives ``owner`` back ``was`` as its own ``name``: none of its own where ``was`` is
    ``_ABSENT`` (it had none), whether it has one now or not."""
    if was is _ABSENT:
        if name in vars(owner):
            delattr(owner, name)
    else:
        setattr(owner, name, was)


@contextmanager
def _as_a_plain_call() -> Iterator[None]:
    """The modes of a plain call: grad on, autocast and inference mode off."""
    with torch.inference_mode(False), torch.enable_grad(), _DisableAutocast():
        yield


@contextmanager
def recording(tracer: fx.Tracer, model: torch.nn.Module) -> Iterator[None]:
    """While this thread traces ``model`` with ``tracer``: the modes its forward switches
    recorded into the trace, and what fx would fix refused (:class:`Fixed`). The trace
    runs in the modes of a plain call (grad on, no autocast, no inference mode), whatever
    modes it is made in: what fx runs once as it traces and keeps (a tensor made from
    numbers) is made as a call makes it, not as an inference tensor or in bf16."""
    outer = getattr(_here, "recorder", None)
    # Switched before anything is replaced, and put back after all is (inside a trace,
    # they are those of a plain call already, and switching them would be recorded).
    plain = _as_a_plain_call() if outer is None else nullcontext()
    with _installing, plain:
        replaced: list[tuple[Any, str, Any]] = []

        def put_back() -> None:
            while replaced:
                _put(*replaced[-1])
                replaced.pop()

        with swapped(put_back):
            for owner, name, instead in _replacements(model):
                replaced.append((owner, name, owner.__dict__.get(name, _ABSENT)))
                setattr(owner, name, _replaced(getattr(owner, name), instead))
            _here.recorder = _Recorder(tracer)
            try:
                with _Draws():
                    yield
            finally:
                _here.recorder = outer
    for node in list(tracer.graph.nodes):  # modes read by blocks that never put them back
        if node.op == "call_function" and node.target is grad_enabled and not node.users:
            tracer.graph.erase_node(node)
        elif node.op == "call_function" and _code_of(node.target) is _ASKING_ATTRIBUTE:
            node.target = node.target.__wrapped__  # an attribute fx read, by `getattr`
