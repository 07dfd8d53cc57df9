"""A child forked while another thread of its parent holds one of the locks somatize keeps
for the whole process (a DataLoader worker forked as a server thread decodes an answer,
runs a node on a worker, makes a node, or lets go of a frozen part) takes that lock
itself: it is unheld there, where a plain lock stayed held for good, by a thread the
child does not have, and the child waited on it for ever."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from somatize import Node
from tests.forked import held_elsewhere, in_forked_child, needs_fork
from tests.nodes import Scale


def _decodes() -> bool:
    """Decodes an answer whose header this process has not read (its key names the child)."""
    import somatize.torch as smt

    value = {f"rows-{os.getpid()}": torch.arange(3.0)}
    data = memoryview(b"".join(bytes(piece) for piece in smt.TENSOR.encode(value)))
    return bool(torch.equal(smt.TENSOR.decode(data)[f"rows-{os.getpid()}"], torch.arange(3.0)))


def _runs_a_node_here() -> bool:
    from somatize.node import running_here

    with running_here(Scale(3.0)):
        return True


def _makes_a_node() -> int:
    class Made(Node):  # a class of the child's, whose making nothing watched yet
        def __init__(self, k: int) -> None:
            self.k = k

    return Made(4).k


def _lets_go_of_a_frozen_part() -> bool:
    from somatize_torch.freeze import held_while

    part = nn.Linear(2, 2).train()
    with held_while(part):
        pass
    return part.training


def _lock(module: str, name: str) -> Any:
    return getattr(__import__(module, fromlist=[name]), name)


@needs_fork
@pytest.mark.parametrize(
    ("module", "name", "child", "answer"),
    [
        ("somatize_torch._codec_header", "_HEADERS_LOCK", _decodes, True),
        ("somatize._held", "_HOLDING", _runs_a_node_here, True),
        ("somatize.node", "_MAKERS_LOCK", _makes_a_node, 4),
        ("somatize_torch.freeze", "_taken_lock", _lets_go_of_a_frozen_part, True),
    ],
    ids=["header", "holding", "making", "taken"],
)
def test_a_child_forked_while_a_thread_holds_a_lock_of_the_process_takes_it(
    module: str, name: str, child: Callable[[], Any], answer: Any
) -> None:
    with held_elsewhere(_lock(module, name)):
        assert in_forked_child(child, timeout=20) == answer


def test_a_child_puts_back_every_change_of_a_trace_when_one_fails_to() -> None:
    """What a trace of another thread changed for every thread is put back in a forked
    child, innermost first; one that fails to be put back leaves the others put back all
    the same (the builtins, outermost), and its failure is raised after them, for Python
    to report."""
    from somatize_torch import _modes

    done: list[str] = []

    def failing() -> None:
        done.append("inner")
        raise RuntimeError("cannot put this back")

    with (
        _modes.put_back_in_child(lambda: done.append("outer")),
        _modes.put_back_in_child(failing),
        pytest.raises(RuntimeError, match="cannot put this back"),
    ):
        _modes._put_back_in_child()
    assert done == ["inner", "outer"]
    assert not _modes._SWAPPED
