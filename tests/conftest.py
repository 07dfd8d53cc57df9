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
from typing import Any

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


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray cluster for the test module asking for it, bound to 127.0.0.1 only. Ray reads
    `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` once, when it is imported — the test module imported
    it already — so the setting it was read into is set too (the processes the cluster starts
    read the environment).

    The raylet starts as many worker processes at once as the cluster has CPUs, two here,
    and counts one whose Python cannot run Ray (the tests' ``/bin/false``) as starting
    until its registration times out, a minute later: two such tests left no worker able
    to start for the tests after them, which waited out that minute. Eight may start at
    once instead."""
    ray = pytest.importorskip("ray", reason="these tests need ray: pip install 'somatize[ray]'")
    from ray._private import ray_constants

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    clusters = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        num_cpus=2,
        resources={"slot": 8},
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"worker_maximum_startup_concurrency": 8},
    )
    try:
        gcs = ray.get_runtime_context().gcs_address
        assert gcs.startswith("127.0.0.1:"), f"the test cluster listens on {gcs}, not loopback"
        yield
    finally:
        ray.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = clusters
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def sharp_norm() -> Any:
    """A Linear, then a BatchNorm in eval whose small running variance makes its ``eps``
    tell in every answer."""
    import torch  # only the tests asking for it need torch
    from torch import nn

    module = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4)).eval()
    with torch.no_grad():
        module[1].running_var.fill_(1e-3)
    return module
