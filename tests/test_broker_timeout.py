"""An embedded broker's ``timeout_s``: a node that does not answer in time on a network
worker fails the forward, keeps nothing, and the worker starts afresh."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from somatize import Graph, Store
from somatize.broker import BadWorker, Broker, Worker, WorkerTimeout
from somatize_torch import ModuleNode, freeze
from tests.broker_nodes import Encoder, Nap, Ramp, Stuck
from tests.nodes import Rows, Scale


def _answers(where: Path) -> list[Path]:
    """The answers kept in the store at ``where``."""
    return [path for path in (where / "answers").rglob("*") if path.is_file()]


def _calls_on(worker: str) -> list[threading.Thread]:
    """The threads that run calls on ``worker``, a timed-out one among them: each ends once
    its call has (the broker let go of it, or was closed)."""
    return [t for t in threading.enumerate() if t.name == f"somatize-{worker}-call"]


def test_a_node_that_does_not_answer_in_time_fails_and_its_worker_starts_afresh(
    tmp_path: Path,
) -> None:
    """A node stuck on a network worker (one no interrupt stops) fails its forward with
    WorkerTimeout; the worker runs the next node at once, beside the stuck one; and what
    the stuck node answers once it ends is neither handed back nor kept. Its ``failed``
    fact says it timed out, not that it was refused."""
    store = Store(tmp_path / "store")
    stuck = Stuck(str(tmp_path / "started"), str(tmp_path / "go"))
    hangs = Graph.somatize(
        Rows().named("rows").frozen() >> stuck.named("stuck").frozen().cached().at("w1")
    )
    quick = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    seen: list[dict[str, Any]] = []
    with Broker.embedded({"w1": Worker.generic(mode="network")}, timeout_s=0.5) as broker:
        with pytest.raises(
            WorkerTimeout, match=r"`stuck` on worker `w1` did not answer within 0.5 s"
        ):
            hangs.forward({"at": 0, "take": 2}, store=store, broker=broker, watching=seen.append)
        assert (tmp_path / "started").exists()
        assert quick.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]
        (tmp_path / "go").touch()
    for thread in _calls_on("w1"):
        thread.join(60)
    assert _answers(tmp_path / "store") == []
    assert [f for f in seen if f["fact"] == "failed"] == [
        {"fact": "failed", "node": "stuck", "error": "WorkerTimeout"}
    ]


def test_a_node_asleep_in_a_call_into_c_times_out_and_keeps_nothing(tmp_path: Path) -> None:
    """A node in one long call into C (a sleep), which an interrupt cannot land in, times
    out as well; once the call returns the interrupt lands and nothing is kept."""
    store = Store(tmp_path / "store")
    g = Graph.somatize(
        Rows().named("rows").frozen() >> Nap(3.0).named("nap").frozen().cached().at("w2")
    )
    with (
        Broker.embedded({"w2": Worker.generic(mode="network")}, timeout_s=0.5) as broker,
        pytest.raises(WorkerTimeout, match=r"`nap` on worker `w2` did not answer"),
    ):
        g.forward({"at": 0, "take": 2}, store=store, broker=broker)
    for thread in _calls_on("w2"):
        thread.join(60)
    assert _answers(tmp_path / "store") == []


def test_a_worker_let_go_is_sent_its_weights_again_and_answers_as_before(tmp_path: Path) -> None:
    """A worker let go after a timeout held a frozen encoder's weights: its fresh copy is
    sent them again by the next forward, and answers what the first copy answered."""
    encoder = ModuleNode.build(Encoder, 4)
    g = Graph.somatize(Ramp(4).named("rows") >> encoder.named("enc").frozen().at("w1"))
    freeze(g)
    stuck = Stuck(str(tmp_path / "started"), str(tmp_path / "go"))
    hangs = Graph.somatize(Rows().named("rows") >> stuck.named("stuck").at("w1"))
    with Broker.embedded({"w1": Worker.generic(mode="network")}, timeout_s=0.5) as broker:
        seen: list[dict[str, Any]] = []
        first = g.forward({"at": 0, "take": 3}, broker=broker, watching=seen.append)
        with pytest.raises(WorkerTimeout):
            hangs.forward({"at": 0, "take": 2}, broker=broker)
        again = g.forward({"at": 0, "take": 3}, broker=broker, watching=seen.append)
        (tmp_path / "go").touch()
    states = [f for f in seen if f["fact"] == "crossed" and f.get("way") == "state"]
    assert len(states) == 2
    assert torch.equal(first, again)


def test_a_node_that_answers_in_time_is_kept_as_without_a_timeout(tmp_path: Path) -> None:
    """Under the timeout, a cached node on a network worker answers and is kept as always."""
    store = Store(tmp_path / "store")
    g = Graph.somatize(
        Rows().named("rows").frozen() >> Scale().named("scale").frozen().cached().at("w1")
    )
    with Broker.embedded({"w1": Worker.generic(mode="network")}, timeout_s=30) as broker:
        assert g.forward({"at": 0, "take": 3}, store=store, broker=broker) == [0.0, 2.0, 4.0]
        seen: list[dict[str, object]] = []
        g.forward({"at": 0, "take": 3}, store=store, broker=broker, watching=seen.append)
    assert [fact["fact"] for fact in seen][-2:] == ["recalled", "finished"]


def test_a_timeout_is_refused_for_a_local_worker() -> None:
    """A local worker runs the node object itself on a thread, which cannot be stopped: a
    timeout would leave it running beside the next call of the same object, so it is
    refused, naming the worker."""
    workers = {"w1": Worker.generic(mode="network"), "here": Worker.generic(mode="local")}
    with pytest.raises(BadWorker, match=r"worker `here` is `mode=\"local\"`.*cannot be stopped"):
        Broker.embedded(workers, timeout_s=1.0)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), True, "1"])
def test_a_timeout_is_a_number_of_seconds(seconds: object) -> None:
    """timeout_s is finite seconds > 0, as on a Ray broker."""
    with pytest.raises(ValueError, match=r"timeout_s is a number of seconds > 0"):
        Broker.embedded({"w1": Worker.generic()}, timeout_s=seconds)  # type: ignore[arg-type]


def test_a_copy_of_the_broker_has_its_timeout() -> None:
    """A copy (sent to a spawned process) times out its calls as the original does."""
    broker = Broker.embedded({"w1": Worker.generic()}, timeout_s=2.5)
    assert copy.deepcopy(broker).timeout_s == 2.5


def test_a_process_whose_timed_out_call_is_stuck_in_c_exits() -> None:
    """A script whose node sleeps for ten minutes in one call into C on a timed worker gets
    its WorkerTimeout and exits: the thread left running that call is not waited for."""
    code = (
        "from somatize import Graph\n"
        "from somatize.broker import Broker, Worker, WorkerTimeout\n"
        "from tests.broker_nodes import Nap\n"
        "from tests.nodes import Rows\n"
        "g = Graph.somatize(Rows().named('rows') >> Nap(600.0).named('nap').at('w1'))\n"
        "broker = Broker.embedded({'w1': Worker.generic(mode='network')}, timeout_s=0.5)\n"
        "try:\n"
        "    g.forward({'at': 0, 'take': 2}, broker=broker)\n"
        "except WorkerTimeout:\n"
        "    print('timed out')\n"
    )
    checkout = Path(__file__).resolve().parent.parent
    paths = [str(checkout), *filter(None, [os.environ.get("PYTHONPATH")])]
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process waited for the call it let go")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timed", "out"]
