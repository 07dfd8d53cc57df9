"""What the oldest torch the library allows (2.4) lacks, that the library must not lean on."""

from __future__ import annotations

import subprocess
import sys

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
