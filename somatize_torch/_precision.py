"""How float32 products and convolutions are computed: the settings of torch's backends
that change what a call answers, read through whichever interface this torch has; and
how float16 and bfloat16 products are computed on CUDA (:func:`half_precision`), and
whether oneDNN computes them on the host (:func:`kernels_off`).

torch 2.9 gave each backend and operation a setting of its own
(``torch.backends.cuda.matmul.fp32_precision = "tf32"``, ``torch.backends.mkldnn.matmul
.fp32_precision = "bf16"``), and once one is set, the legacy getters
(``torch.get_float32_matmul_precision()``, ``torch.backends.cudnn.allow_tf32``) raise.
So where the per-backend settings exist, those of the backends a call on the device runs
on are read (cuBLAS and cuDNN on CUDA, oneDNN on the host); the legacy ones otherwise.
Each is named only where it is not torch's default, so the usual keys do not change.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

Named = tuple[tuple[str, str], ...]

_CUDA = {
    ("cuda", "matmul"): ("none", "ieee"),
    ("cudnn", "conv"): ("tf32",),
    ("cudnn", "rnn"): ("tf32",),
}
_HOST = {
    ("mkldnn", "matmul"): ("none", "ieee"),
    ("mkldnn", "conv"): ("none", "ieee"),
    ("mkldnn", "rnn"): ("none", "ieee"),
}
"""The per-backend settings read for a device, with the values torch starts with ("none"
defers to the backend's own default, full precision but for cuDNN's TF32)."""

_HALF = {
    "allow_fp16_accumulation": (False,),
    "allow_fp16_reduced_precision_reduction": (True, (True, True)),
    "allow_bf16_reduced_precision_reduction": (True, (True, True)),
}
"""cuBLAS's settings of how float16 and bfloat16 products are computed on CUDA (under
autocast, or by a module converted to them), with the values torch starts with: sums
kept in float32, partial sums allowed in reduced precision (a pair in a torch that
also says whether split-K ones are)."""

_HALF_READ = tuple(
    (setting, read, usual)
    for setting, usual in _HALF.items()
    if (read := getattr(torch._C, f"_get_cublas_{setting}", None)) is not None
)
"""Each of :data:`_HALF` this torch has, with torch's own getter: read through
``torch.backends.cuda.matmul`` they cost ten times as much, at every cached call."""


@functools.cache
def _per_backend() -> bool:
    """Whether this torch has the per-backend settings (looked for once: a key is worked
    out at every batch, and torch's interface does not change in a process)."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(
        torch.backends.mkldnn, "matmul"
    )


_READ_AS = {
    ("cuda", "matmul"): ("cuda", "matmul"),
    ("cudnn", "conv"): ("cuda", "conv"),
    ("cudnn", "rnn"): ("cuda", "rnn"),
    ("mkldnn", "matmul"): ("mkldnn", "matmul"),
    ("mkldnn", "conv"): ("mkldnn", "conv"),
    ("mkldnn", "rnn"): ("mkldnn", "rnn"),
}
"""The names torch's own getter knows each per-backend setting by."""


@functools.cache
def _fp32_readers(device: str) -> tuple[tuple[str, Callable[[], str], tuple[str, ...]], ...]:
    """Each per-backend setting read for ``device`` (:data:`_CUDA`, :data:`_HOST`), with what
    reads it and the values torch starts with: torch's own getter where it answers as the
    setting does (read through ``torch.backends`` a setting costs six times as much, at
    every cached call and every forward of a graph), the setting itself otherwise."""
    readers = []
    for (backend, op), usual in (_CUDA if device == "cuda" else _HOST).items():
        holder = getattr(getattr(torch.backends, backend), op)
        read: Callable[[], str] = functools.partial(_setting, holder)
        getter = getattr(torch._C, "_get_fp32_precision_getter", None)
        if getter is not None:
            fast = functools.partial(getter, *_READ_AS[(backend, op)])
            try:
                if fast() == read():
                    read = fast
            except RuntimeError:  # a name this torch does not know
                pass
        readers.append((f"{backend}.{op}", read, usual))
    return tuple(readers)


def _setting(holder: Any) -> str:
    """The per-backend setting ``holder`` holds (``torch.backends.mkldnn.matmul``)."""
    return str(holder.fp32_precision)


def float32_precision(device: str) -> Named:
    """The settings that change how float32 products and convolutions run on ``device``
    (a device type, ``"cuda"``, ``"cpu"``), each with its value, where it is not torch's
    default: none at all under torch's defaults."""
    if _per_backend():
        said: Named = ()
        for name, read, usual in _fp32_readers(device):  # a loop: at every forward
            value = read()
            if value not in usual:
                said += ((name, value),)
        return said
    matmul = torch.get_float32_matmul_precision()
    legacy = [] if matmul == "highest" else [("matmul", matmul)]
    if device == "cuda" and not torch.backends.cudnn.allow_tf32:
        legacy.append(("cudnn", "without tf32"))
    return tuple(legacy)


def half_precision(device: str) -> Named:
    """The settings that change how float16 and bfloat16 products run on ``device`` (a
    device type), each with its value, where it is not torch's default: cuBLAS's on
    CUDA (:data:`_HALF`), none elsewhere."""
    if device != "cuda":
        return ()
    said: list[tuple[str, str]] = []
    for setting, read, usual in _HALF_READ:
        value = read()
        if value not in usual:
            said.append((f"cuda.matmul.{setting}", str(value)))
    return tuple(said)


def kernels_off(device: str) -> Named:
    """The libraries torch computes with on ``device`` (a device type) that are turned off,
    where a kernel of torch's own computes the call instead and rounds otherwise (a
    convolution, a bfloat16 product): oneDNN on the host (``torch.backends.mkldnn.enabled
    = False``, a ``torch.backends.mkldnn.flags(enabled=False)`` block), cuDNN on CUDA
    (``torch.backends.cudnn.enabled = False``). None where it is on, as torch starts."""
    if device == "cuda":
        return () if torch._C._get_cudnn_enabled() else (("cudnn", "off"),)
    if torch._C._get_mkldnn_enabled():
        return ()
    return (("mkldnn", "off"),)


def products(device: str) -> Named:
    """How products and convolutions run on ``device`` (a device type), named only where it
    is not torch's default: :func:`float32_precision`, :func:`half_precision` and
    :func:`kernels_off`."""
    return float32_precision(device) + half_precision(device) + kernels_off(device)


def precision_on(device: str) -> Named | None:
    """The precision a call on ``device`` (a device type) runs in, named only where it is
    not torch's default: autocast on that device type, the dtype tensors made in the
    forward get, how float32 products and convolutions are computed (TF32,
    bfloat16), how half-precision ones are (accumulating in float16), and whether oneDNN
    computes them on the host — None under
    torch's defaults, so the usual key does not change."""
    said: list[tuple[str, str]] = []
    # torch has no autocast for some device types (``meta``, where a model is built
    # before its weights are loaded), and raises when asked about one.
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        said.append(("autocast", _dtype_name(torch.get_autocast_dtype(device))))
    said.extend(_made_in())
    said.extend(products(device))
    return tuple(said) or None


def settings() -> Named:
    """The settings of this process that change what torch computes, on any device, each
    named only where it is not torch's default: the dtype tensors made in a call get, and
    how products and convolutions are computed (:func:`products`) on the host and, where
    this torch is built with CUDA, on CUDA. What the key of a node that is no module names
    besides autocast (:mod:`somatize._precision`), which may compute on either."""
    said = [*_made_in(), *products("cpu")]
    if _cuda_built():
        said.extend(named for named in products("cuda") if named not in said)
    return tuple(said)


@contextlib.contextmanager
def entered(named: Named) -> Iterator[None]:
    """The settings of this process made as ``named`` says (as :func:`settings` names them;
    torch's default where it names none) for the time of the block, and put back as they
    were after it: the default dtype, how float32 products and convolutions are computed,
    and whether oneDNN and cuDNN are on. They hold for every thread of the process, so only
    a process that computes nothing else meanwhile enters them (a Ray actor, which runs one
    job at a time). cuBLAS's settings of half-precision products, and a setting this torch
    lacks (one built without CUDA), are left as they are: who enters them reads
    :func:`settings` again."""
    said = set(named)
    put_back: list[Callable[[], None]] = []
    try:
        for read, write, wanted in _switches(said):
            was = read()
            if wanted is not None and was != wanted:
                write(wanted)
                put_back.append(functools.partial(write, was))
        yield
    finally:
        for undo in reversed(put_back):
            undo()


Switch = tuple[Callable[[], Any], Callable[[Any], None], Any]
"""A setting :func:`entered` sets: what reads it, what writes it, and the value it is to
hold (None: any it holds, torch's default among them)."""


def _switches(said: set[tuple[str, str]]) -> Iterator[Switch]:
    """Each setting :func:`settings` names that :func:`entered` sets, with the value ``said``
    names for it (as :func:`settings` names them)."""
    named = dict(said)
    made = getattr(torch, named.get("default", "float32"), None)
    if isinstance(made, torch.dtype):
        yield torch.get_default_dtype, torch.set_default_dtype, made
    devices = ("cpu", "cuda") if _cuda_built() else ("cpu",)
    if _per_backend():
        for device in devices:
            for name, read, usual in _fp32_readers(device):
                holder = functools.reduce(getattr, name.split("."), torch.backends)
                write = functools.partial(setattr, holder, "fp32_precision")
                wanted = named.get(name) or (None if read() in usual else usual[0])
                yield read, write, wanted
    else:
        matmul = named.get("matmul", "highest")
        yield torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, matmul
        if _cuda_built():
            yield _cudnn_tf32, _set_cudnn_tf32, ("cudnn", "without tf32") not in said
    yield torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled, ("mkldnn", "off") not in said
    if _cuda_built():
        yield torch._C._get_cudnn_enabled, torch._C._set_cudnn_enabled, ("cudnn", "off") not in said


def _cudnn_tf32() -> bool:
    return bool(torch.backends.cudnn.allow_tf32)


def _set_cudnn_tf32(on: bool) -> None:
    torch.backends.cudnn.allow_tf32 = on


def _made_in() -> Named:
    """The dtype tensors made in a call get, where it is not torch's default."""
    made = torch.get_default_dtype()
    return () if made == torch.float32 else (("default", _dtype_name(made)),)


@functools.cache
def _cuda_built() -> bool:
    """Whether this torch is built with CUDA: in one that is not, nothing computes on CUDA,
    and its settings are not read."""
    return bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reduced(named: Named) -> str | None:
    """The least precise way float32 products are computed among ``named`` (as
    :func:`float32_precision` gives them): ``"bf16"``, ``"tf32"``, or None for full
    precision."""
    values = {value for _, value in named}
    if values & {"bf16", "medium"}:
        return "bf16"
    if values & {"tf32", "high"}:
        return "tf32"
    return None
