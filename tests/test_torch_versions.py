"""What the oldest torch (2.4) and numpy (1.24) the library allows lack, that the library
must not lean on."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy
import pytest
import torch

from somatize_torch.codec import TENSOR
from somatize_torch.digest import host_bytes, memory_of

_IMPORTED_WITH_TORCH_ONLY_LATER = ("torch.utils.checkpoint",)
"""Modules `import torch` loads from a later release on, but torch 2.4 leaves unloaded."""


def test_the_library_imports_where_import_torch_leaves_checkpoint_unloaded() -> None:
    """Torch 2.4's `import torch` does not load `torch.utils.checkpoint`: the library
    imports what it reads itself, so it imports there too."""
    code = f"""
import sys
import torch
for name in {_IMPORTED_WITH_TORCH_ONLY_LATER!r}:
    parent, _, child = name.rpartition(".")
    sys.modules.pop(name, None)
    if hasattr(sys.modules[parent], child):
        delattr(sys.modules[parent], child)
import somatize.torch
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _asarray_refusing_address_zero(real: Callable[..., Any]) -> Callable[..., Any]:
    """``numpy.asarray`` as numpy before 2.3 has it: an object whose array interface puts
    its data at address 0 is refused."""

    def asarray(value: Any, *args: Any, **kwargs: Any) -> Any:
        interface = getattr(value, "__array_interface__", None)
        if interface is not None and interface["data"][0] == 0:
            raise TypeError("int() argument must be a string, not the object")
        return real(value, *args, **kwargs)

    return asarray


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_an_empty_tensor_is_read_where_numpy_refuses_address_zero(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch puts an empty tensor at address 0, which numpy before 2.3 refuses as an
    array's data: the library reads an empty tensor's bytes without asking numpy there,
    read-only unless asked for writable bytes."""
    monkeypatch.setattr(numpy, "asarray", _asarray_refusing_address_zero(numpy.asarray))
    empty = torch.empty(0, 3, dtype=dtype)
    assert empty.data_ptr() == 0
    assert host_bytes(empty).tobytes() == b""
    assert host_bytes(empty).readonly
    assert not memory_of(empty, writable=True).readonly
    stored = memoryview(b"".join(bytes(piece) for piece in TENSOR.encode(empty)))
    recalled = TENSOR.decode(stored)
    assert recalled.dtype == dtype
    assert recalled.shape == empty.shape


def test_a_child_forked_in_a_trace_calls_modules_as_before_where_fx_names_no_patcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Torch 2.4's fx keeps no record of what the trace under way replaced: a child forked
    meanwhile still has how every module is called and read put back, so its own calls
    do not go through the parent's trace."""
    from torch.fx import _symbolic_trace

    from somatize_torch._split import _fx_put_back

    monkeypatch.setattr(_symbolic_trace, "CURRENT_PATCHER", None, raising=False)
    call, getattr_ = torch.nn.Module.__call__, torch.nn.Module.__getattr__
    put_back = _fx_put_back()
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *args: "traced")
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda *args: "traced")
    put_back()
    assert torch.nn.Module.__call__ is call
    assert torch.nn.Module.__getattr__ is getattr_
