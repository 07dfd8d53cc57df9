"""Shared fixtures: a fresh store per test, written only under tmp_path; Ctrl-C on cue.

The tests' tensors are tiny, so torch runs each op on one thread, here and in every
process a test starts: a second OpenMP thread gains nothing on them and, on a machine
whose other core is busy (a test's child process, a writer thread), an op waits a
scheduler tick for it, a thousand times what the op costs."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from somatize import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty local store in this test's temporary directory."""
    return Store(tmp_path / "store")


@pytest.fixture
def interrupt_when() -> Iterator[Callable[[Path], threading.Thread]]:
    """Starts a thread that interrupts this process's main thread (SIGINT, as Ctrl-C does)
    once a given file exists (a node started). For the test, SIGINT raises
    KeyboardInterrupt whatever this process was started with: a job a shell runs in the
    background starts with SIGINT ignored, and Python then leaves it so."""

    def start(marker: Path) -> threading.Thread:
        def interrupt() -> None:
            for _ in range(3000):
                if marker.exists():
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.01)

        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        return thread

    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield start
    finally:
        signal.signal(signal.SIGINT, was)
