"""The embedded broker: placement, local and network workers, crossings, refusals, concurrency."""

from __future__ import annotations

import copy
import gc
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from somatize import (
    Catalog,
    CodecError,
    Drifted,
    Graph,
    Node,
    NodeFailed,
    Opaque,
    Store,
    StoreError,
    Unbuildable,
)
from somatize.broker import (
    BadWorker,
    Broker,
    BrokerClosed,
    GradientLost,
    Reentrant,
    StateMismatch,
    UnknownWorker,
    Worker,
)
from somatize.broker.host import Host, held_state
from somatize.catalog import Blueprint, blueprint_of
from somatize.data import settle
from somatize.node import held_by
from somatize_torch import ModuleNode, StateDoesNotFit, freeze, is_held
from tests import broker_nodes
from tests.broker_nodes import (
    LOADED,
    Convolved,
    Counting,
    Doubled,
    Doubled2,
    Drifts,
    Encoder,
    Gained,
    Grows,
    Holds,
    KeptInAList,
    Lazy,
    Length,
    Listed,
    LoadsOnFirstUse,
    MakesBlob,
    Meet,
    Nap,
    Nested,
    Normed,
    Overlap,
    Picks,
    Products,
    Projected,
    RaisesUnprintable,
    Ramp,
    Recurrent,
    Remembers,
    ScaleOtherwise,
    Seeded,
    SeedsItself,
    Seen,
    Stepper,
    Tagged,
    Tally,
    Three,
    Times,
    WeightNormed,
    Weights,
    Where,
    Widthed,
    Window,
    napping,
    spinning,
    weighted,
)
from tests.forked import needs_fork
from tests.global_modules import normed_cell
from tests.nodes import Add, Echo, Fails, Largest, Rows, Scale, Square


def _seed() -> tuple[Graph, Rows, Scale, Largest]:
    """Seed 001's crossing graph, with plain nodes: a source, a node on w1, a node here."""
    rows, scale, top = Rows(), Scale(3.0), Largest()
    g = Graph.somatize(rows.named("sms") >> scale.named("clean").at("w1") >> top.named("widest"))
    return g, rows, scale, top


@pytest.mark.parametrize("mode", ["local", "network"])
def test_same_answer_as_without_a_broker(mode: str) -> None:
    """The seed's graph answers the same with a broker, in either mode, as without one."""
    g, _, _, _ = _seed()
    alone = g.forward({"at": 0, "take": 32})
    worker = Broker.embedded({"w1": Worker.generic(mode=mode)})  # type: ignore[arg-type]
    assert g.forward({"at": 0, "take": 32}, broker=worker) == alone == 93.0
    assert g.forward({"at": 100, "take": 5}, broker=worker) == g.forward({"at": 100, "take": 5})


def test_local_mode_hands_objects_and_runs_the_node_itself() -> None:
    """A local worker runs the graph's own node object; nothing is encoded, nothing crosses."""
    g, _, scale, _ = _seed()
    seen: list[dict[str, Any]] = []
    g.forward({"at": 0, "take": 8}, broker=Broker.embedded({"w1": Worker.generic(mode="local")}))
    g.forward(
        {"at": 0, "take": 8},
        broker=Broker.embedded({"w1": Worker.generic(mode="local")}),
        watching=seen.append,
    )
    assert scale.calls == 2
    assert not [f for f in seen if f["fact"] == "crossed"]
    assert [f["node"] for f in seen if f["fact"] == "ran"] == ["sms", "clean", "widest"]


def test_network_mode_rebuilds_and_reports_crossed_bytes() -> None:
    """In network mode the node is rebuilt on the worker and every crossing is a fact with
    the bytes of the codec's encoding, added up per edge in the record."""
    g, _, scale, _ = _seed()
    seen: list[dict[str, Any]] = []
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward({"at": 0, "take": 32}, broker=broker, watching=seen.append) == 93.0
    assert scale.calls == 0  # the client's object never ran: the worker built its own
    crossed = [f for f in seen if f["fact"] == "crossed"]
    from somatize import CODECS

    sent = sum(len(p) for p in CODECS.for_value(list(range(32))).encode(list(range(32))))
    answer = [v * 3.0 for v in range(32)]
    back = sum(len(p) for p in CODECS.for_value(answer).encode(answer))
    assert crossed == [
        {"fact": "crossed", "node": "clean", "from": "sms", "worker": "w1", "bytes": sent,
         "way": "out"},
        {"fact": "crossed", "node": "widest", "from": "clean", "worker": "w1", "bytes": back,
         "way": "back"},
    ]  # fmt: skip
    assert g.record is not None
    assert g.record.crossed == {("sms", "clean"): sent, ("clean", "widest"): back}
    g.forward({"at": 0, "take": 32}, broker=broker)
    assert g.record.crossed == {("sms", "clean"): sent, ("clean", "widest"): back}


@pytest.mark.parametrize("mapped", [False, True])
def test_an_answer_that_came_back_crosses_on_the_edge_to_a_reader_that_runs(
    store: Store, mapped: bool
) -> None:
    """An answer that came back from a network worker is on the edge to the first of its
    readers that runs in the forward: the first reader the graph has, recalled or not
    needed (spared), never read it, and the figure would draw the bytes on its edge. Where
    no reader runs (the answer only handed back), it crosses on no edge."""
    clean = (Square().mapped() if mapped else Scale(3.0)).named("clean").frozen().at("w1")
    g = Graph.somatize(
        Rows().named("sms").frozen()
        >> clean
        >> (Largest().named("widest").frozen().cached(), Echo().named("echo"))
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g.forward({"at": 0, "take": 32}, broker=broker, store=store)
    g.forward({"at": 0, "take": 32}, broker=broker, store=store)
    assert g.record is not None and g.record.outcome["widest"] == "recalled"
    back = [f for f in g.record.facts if f["fact"] == "crossed" and f["way"] == "back"]
    assert [(f["from"], f["node"]) for f in back] == [("clean", "echo")]
    assert back[0]["bytes"] > 0
    assert g.record.crossed[("clean", "echo")] == back[0]["bytes"]
    assert ("clean", "widest") not in g.record.crossed
    g.forward({"at": 0, "take": 32}, broker=broker, outputs=("clean", "widest"), store=store)
    back = [f for f in g.record.facts if f["fact"] == "crossed" and f["way"] == "back"]
    assert [(f.get("from"), f["node"]) for f in back] == [(None, "clean")]
    assert back[0]["bytes"] > 0


def test_the_worker_keeps_its_nodes_loaded() -> None:
    """A network worker rebuilds a node once and reuses it on later forwards."""
    g = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g.forward({"at": 0, "take": 2}, broker=broker)
    host = broker._hosts["w1"]
    (built,) = host._nodes.values()
    g.forward({"at": 0, "take": 2}, broker=broker)
    assert list(host._nodes.values()) == [built]


def test_a_value_with_no_codec_names_its_type_and_edge() -> None:
    """An input no codec writes fails in network mode, naming its type and the edge it took."""
    g = Graph.somatize(Rows().named("rows") >> MakesBlob().named("blob") >> Echo().at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(CodecError, match=r"`blob` → `echo`.*tests\.broker_nodes\.Blob"):
        g.forward({"at": 0, "take": 2}, broker=broker)
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert type(g.forward({"at": 0, "take": 2}, broker=local)).__name__ == "Blob"


def test_an_answer_with_no_codec_names_its_type_and_edge() -> None:
    """An answer no codec writes fails on its way back, naming its type and its reader."""
    g = Graph.somatize(Rows().named("rows") >> MakesBlob().named("blob").at("w1") >> Echo())
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(CodecError, match=r"answer of `blob`.*`w1` to `echo`.*broker_nodes\.Blob"):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_unknown_worker_is_refused_before_anything_runs() -> None:
    """A node placed on a name the broker does not know is refused, and nothing ran."""
    rows = Rows()
    g = Graph.somatize(rows.named("rows") >> Scale().named("scale").at("w9"))
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    seen: list[dict[str, Any]] = []
    with pytest.raises(UnknownWorker, match=r"no worker for `scale` on `w9`; it has `w1`"):
        g.forward({"at": 0, "take": 2}, broker=broker, watching=seen.append)
    assert rows.calls == 0 and seen == []


Main = type("Main", (Echo,), {"__module__": "__main__"})
"""A node class as if typed into a notebook or a script (which holds it: see `in_main`)."""


@pytest.fixture
def in_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """``__main__`` holds `Main` under its name, as a notebook holds the classes typed in."""
    monkeypatch.setattr(sys.modules["__main__"], "Main", Main, raising=False)


def test_a_class_in_main_is_refused_in_network_mode_with_the_advice(in_main: None) -> None:
    """A class from ``__main__`` cannot be imported by another process (a catalog not of
    this process): refused before anything runs, saying to move it into a module or to
    register it."""
    rows = Rows()
    g = Graph.somatize(rows.named("rows") >> Main().named("main").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")}, catalog=Catalog())
    with pytest.raises(Unbuildable, match=r"`main` cannot be sent to worker `w1`.*`__main__`.*"
                       r"move the class into a module.*register it"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert rows.calls == 0
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert g.forward({"at": 0, "take": 2}, broker=local) == [0, 1]


def test_a_registered_main_class_crosses(in_main: None) -> None:
    """Registered on the broker's catalog, a class from ``__main__`` is rebuilt there."""
    g = Graph.somatize(Rows().named("rows") >> Main().named("main").at("w1"))
    catalog = Catalog()
    catalog.register(Main)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")}, catalog=catalog)
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0, 1, 2]


def test_a_closure_class_is_refused_in_network_mode_with_the_advice() -> None:
    """A class made inside a function has no name another process could find."""

    class Inner(Node):
        def forward(self, value: Any, ctx: Any) -> Any:
            return value

    g = Graph.somatize(Rows().named("rows") >> Inner().named("inner").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(Unbuildable, match=r"`inner`.*no stable name.*module level"):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_node_built_from_an_object_is_refused_in_network_mode() -> None:
    """A node whose constructor took a non-canonical object cannot be rebuilt elsewhere."""
    g = Graph.somatize(Rows().named("rows") >> Holds(object()).named("holds").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(
        Unbuildable, match=r"`holds` \(Holds\).*cannot cross a wire.*mode=\"local\""
    ):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_node_holding_state_is_refused_in_network_mode() -> None:
    """A node with state its constructor does not rebuild is not copied to a network worker."""
    g = Graph.somatize(Rows().named("rows") >> Weights().named("weights").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(Unbuildable, match=r"`weights` \(Weights\).*holds state.*mode=\"local\""):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_custom_declare_crosses_through_the_constructor_call() -> None:
    """A node with its own ``declare()`` is rebuilt from the call that made it, and checked
    against its declaration."""
    node = Tagged("t", verbose=True)
    blueprint = blueprint_of(node, "tagged")
    assert (blueprint.args, blueprint.kwargs) == (("t",), {"verbose": True})
    again = Blueprint.from_bytes(blueprint.to_bytes())
    assert again == blueprint
    rebuilt = Catalog().build(again)
    assert isinstance(rebuilt, Tagged) and rebuilt.verbose is True
    assert rebuilt.declaration() == node.declaration()
    g = Graph.somatize(Rows().named("rows") >> Tagged("t", verbose=True).at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward({"at": 0, "take": 4}, broker=broker) == ["t", 4]


def test_a_node_is_rebuilt_on_a_network_worker_with_its_arguments_as_they_were_made() -> None:
    """A dict a node is built with crosses to a network worker in the order it was built
    in, and a bytearray as one, so the copy rebuilt there computes as the node does (it
    reads the dict's order); its key takes dicts in any order alike, as before. A memoryview,
    which would come back as bytes, is refused, saying to pass its bytes."""
    made = Picks({"z": 1, "a": 2}, bytearray(b"ab"))
    assert made.declaration() == Picks({"a": 2, "z": 1}, bytearray(b"ab")).declaration()
    again = Blueprint.from_bytes(blueprint_of(made, "picks").to_bytes())
    assert list(again.args[0]) == ["z", "a"] and type(again.args[1]) is bytearray
    g = Graph.somatize(made.named("picks").at("w1"))
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    value = {"a": "A", "z": "Z"}
    assert g.forward(value, broker=network) == g.forward(value) == [["Z", "A"], "bytearray"]
    viewed = Graph.somatize(Picks({}, memoryview(b"ab")).named("viewed").at("w1"))
    with pytest.raises(Unbuildable, match=r"`viewed` \(Picks\) cannot be rebuilt in another "
                       r"process: .* is a memoryview: it would be read back as bytes.* "
                       r"Pass `bytes\(view\)`"):  # fmt: skip
        viewed.forward(value, broker=network)


def test_a_rebuilt_node_that_declares_otherwise_is_refused() -> None:
    """A blueprint whose declaration the rebuilt node does not match is refused."""
    blueprint = blueprint_of(Tagged("t"), "tagged")
    forged = Blueprint(blueprint.identity, ("u",), {}, blueprint.declaration)
    with pytest.raises(Unbuildable, match=r"rebuilt here declares .* where it was made"):
        Catalog().build(forged)


@pytest.mark.parametrize("mode", ["embedded", "blueprint"])
def test_a_node_whose_rebuilt_copy_holds_other_public_values_is_refused(mode: str) -> None:
    """A constructor that draws a seed of its own into a public attribute, or a public
    attribute set after the node was made, would make the copy a network worker rebuilds
    from the constructor call answer otherwise: refused before anything runs, naming the
    attribute. Built alike, the node runs there as here."""
    times = Times()
    times.k = 3
    for node, attr in ((SeedsItself(), "seed"), (times, "k")):
        g = Graph.somatize(Echo().named("s") >> node.named("n").at("w1"))
        if mode == "blueprint":
            blueprint = blueprint_of(node, "n", held_by(node))
            with pytest.raises(Unbuildable, match=rf"holds other values in `{attr}`"):
                Catalog().build(Blueprint.from_bytes(blueprint.to_bytes()))
            continue
        broker = Broker.embedded({"w1": Worker.generic(mode="network")})
        seen: list[dict[str, Any]] = []
        refused = rf"`n` cannot be sent .* holds other values in `{attr}` than .* Nothing has run"
        with pytest.raises(Unbuildable, match=refused):
            g.forward(2.0, broker=broker, watching=seen.append)
        assert seen == []
    g = Graph.somatize(Echo().named("s") >> Times().named("n").at("w1"))
    assert g.forward(2.0, broker=Broker.embedded({"w1": Worker.generic(mode="network")})) == 2.0


def test_a_public_value_set_after_the_graph_was_built_is_refused_on_a_network_worker() -> None:
    """A public attribute given another value after the graph was built (``p.k = 5``) is
    compared at the start of the next forward that sends the node: refused, naming it,
    before anything runs, where the copy a worker rebuilds would answer otherwise; set
    back, the node runs there again. What a node changes itself while it runs here (a
    counter, on a local worker or with no broker) is its own, and it still crosses, as a
    copy of it does."""
    times = Times()
    g = Graph.somatize(Echo().named("s") >> times.named("n").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward(2.0, broker=broker) == 2.0
    times.k = 5
    assert g.forward(2.0) == 10.0
    seen: list[dict[str, Any]] = []
    refused = r"`n` cannot be sent .* holds other values in `k` than the node in the graph .*"
    with pytest.raises(Unbuildable, match=refused + "Nothing has run"):
        g.forward(2.0, broker=broker, watching=seen.append)
    assert seen == []
    times.k = 1
    assert g.forward(2.0, broker=broker) == 2.0
    scale = Scale(3.0)
    g = Graph.somatize(Echo().named("s") >> scale.named("n").at("w1"))
    assert g.forward([1.0]) == [3.0]
    here = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert g.forward([1.0], broker=here) == [3.0]
    assert scale.calls == 2
    assert g.forward([1.0], broker=broker) == [3.0]
    assert copy.deepcopy(g).forward([1.0], broker=broker) == [3.0]


def test_what_a_node_changes_in_place_itself_crosses_and_what_is_given_it_does_not() -> None:
    """A placed node run here, with no broker and on a local worker, that changes its
    public values in place itself (a dict of counts it keeps, a dict it fills) still
    crosses to a network worker; one given a value in place between runs, after it had
    set it up itself, is refused there, where the copy would compute with its own."""
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    for kind in (Tally, Remembers):
        g = Graph.somatize(Echo().named("s") >> kind().named("n").at("w1"))
        assert g.forward(1.0) == 2.0
        assert g.forward(2.0, broker=local) == 4.0
        assert g.forward(3.0, broker=network) == 6.0
    lazy = Lazy()
    g = Graph.somatize(Echo().named("s") >> lazy.named("n").at("w1"))
    assert g.forward(1.0) == 1.0  # its weights set up by itself: its own
    lazy.weights[0] = 10.0  # given, in place, between runs
    assert g.forward(2.0) == 20.0
    with pytest.raises(Unbuildable, match=r"holds other values in `weights`"):
        g.forward(3.0, broker=network)


def test_an_argument_a_node_advances_itself_is_what_its_copy_is_rebuilt_with() -> None:
    """A node that advances an argument it keeps (``self.step += 1``) while it runs here
    is rebuilt on a network worker with the argument as it is now, as its key follows it:
    it was refused there, its copy said to hold the step it was built with while the
    blueprint built it with the new one."""
    stepper = Stepper()
    g = Graph.somatize(Echo().named("s") >> stepper.named("n").at("w1"))
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward(10.0) == 11.0
    assert g.forward(10.0, broker=network) == 12.0  # Stepper(step=1), stepping once there
    assert g.forward(10.0, broker=Broker.embedded({"w1": Worker.generic(mode="local")})) == 12.0
    assert g.forward(10.0, broker=network) == 13.0


class _Trains(Node):
    """Multiplies its input by a trainable weight, here."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, x: torch.Tensor, ctx: Any) -> Any:
        return {"y": [x * self.weight]}  # nested: looked into as the codec does


def test_a_tensor_that_requires_grad_is_refused_crossing_to_a_network_worker() -> None:
    """A tensor that requires grad, crossing to a network worker, is refused, naming the
    edge and saying what to do: the worker is sent its values alone, and the gradient
    through the node placed there was lost without a word. A local worker, a detached
    tensor and a forward under ``torch.no_grad()`` cross as before."""
    weight = nn.Parameter(torch.ones(3))

    def graph(w: torch.Tensor = weight) -> Graph:
        return Graph.somatize(_Trains(w).named("t") >> Doubled2().named("d").at("w1"))

    x = torch.arange(3.0)
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(GradientLost, match=r"`t` → `d` \(to worker `w1`\) .*requires grad.*"
                       r"mode=\"local\"\)`.*`\.detach\(\)`.*`torch\.no_grad\(\)`"):  # fmt: skip
        graph().forward(x, broker=network)
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    out = graph().forward(x, broker=local)
    out["y"][0].sum().backward()
    assert weight.grad is not None and weight.grad.tolist() == [0.0, 2.0, 4.0]
    with torch.no_grad():
        assert graph().forward(x, broker=network)["y"][0].tolist() == [0.0, 2.0, 4.0]
    assert graph(weight.detach()).forward(x, broker=network)["y"][0].tolist() == [0.0, 2.0, 4.0]


def test_a_local_worker_runs_its_node_in_the_caller_s_grad_mode() -> None:
    """A node on a local worker runs under the grad mode and inference mode of the thread
    that called the forward, as it runs with no broker: torch keeps them per thread, and
    the worker's thread had its own. Under ``torch.no_grad()`` a module there recorded its
    graph, answering a tensor that requires grad; under ``torch.inference_mode()`` it
    failed on an input made there, which autograd cannot save for backward."""
    torch.manual_seed(0)
    linear = nn.Linear(3, 2)
    g = Graph.somatize(Echo().named("s") >> ModuleNode(linear).named("enc").at("w1"))
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    with torch.no_grad():
        out = g.forward(torch.ones(4, 3), broker=local)
        assert not out.requires_grad and torch.equal(out, g.forward(torch.ones(4, 3)))
    with torch.inference_mode():
        x = torch.ones(4, 3)
        out = g.forward(x, broker=local)
        assert out.is_inference() and torch.equal(out, g.forward(x))
    out = g.forward(torch.ones(4, 3), broker=local)
    out.sum().backward()  # with grad on, it trains through the node as before
    assert linear.weight.grad is not None


def test_a_local_worker_runs_its_node_under_the_caller_s_autocast() -> None:
    """A node on a local worker runs under the autocast of the thread that called the
    forward, as with no broker: torch keeps autocast per thread, as it keeps grad mode, and
    the worker's thread had none. Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a
    product there was computed in float32 — a plain node's, and a module's not frozen —
    where the same graph with no broker answers in bfloat16."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    linear = nn.Linear(3, 2)
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    for placed in (Products().named("p").at("w1"), ModuleNode(linear).named("enc").at("w1")):
        g = Graph.somatize(Echo().named("s") >> placed)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            here = g.forward(x)
            there = g.forward(x, broker=local)
            with torch.autocast("cpu", enabled=False):  # one turned off inside, too
                off = g.forward(x, broker=local)
        assert here.dtype == there.dtype == torch.bfloat16 and torch.equal(there, here)
        assert off.dtype == torch.float32 and torch.equal(off, g.forward(x))
    local.close()


def test_a_network_worker_runs_its_node_under_the_caller_s_autocast() -> None:
    """A node on a network worker runs under the autocast of the thread that called the
    forward, as it runs in its grad mode: the job names it, and the worker's thread (a Ray
    actor's process) enters it. Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a
    plain node's product there was computed in float32, where the same graph with no
    broker answers in bfloat16."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    g = Graph.somatize(Echo().named("s") >> Products().named("p").at("w1"))
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        here = g.forward(x)
        there = g.forward(x, broker=network)
        with torch.autocast("cpu", enabled=False):
            off = g.forward(x, broker=network)
    assert here.dtype == there.dtype == torch.bfloat16 and torch.equal(there, here)
    assert off.dtype == torch.float32 and torch.equal(off, g.forward(x))
    assert g.forward(x, broker=network).dtype == torch.float32  # and none after it
    network.close()


def test_a_network_worker_runs_its_node_in_the_caller_s_grad_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen encoder on a network worker whose forward calls a module held in a global of
    its file (``NORM = nn.LayerNorm(3)``, its weights trainable) answers under
    ``torch.no_grad()`` (and ``torch.inference_mode()``) what it answers here: the worker's
    thread ran it with grad on, and its answer, requiring grad, was refused on its way back
    (a CodecError telling to compute it under ``torch.no_grad()``, as it was). With grad on,
    where the answer here requires grad, it is refused as GradientLost, naming the node."""
    cell = normed_cell(monkeypatch, "normed_on_a_network_worker")
    torch.manual_seed(0)
    enc = ModuleNode.build(cell.Normed)
    g = Graph.somatize(Echo().named("s") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    x = torch.randn(4, 6)
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    with torch.no_grad():
        assert torch.equal(g.forward(x, broker=network), enc.module(x))
    with torch.inference_mode():
        assert torch.equal(g.forward(x, broker=network), enc.module(x))
    assert enc.module(x).requires_grad
    with pytest.raises(GradientLost, match=r"answer of `enc`.*worker `w1`.*requires grad.*"
                       r"mode=\"local\"\)`.*`torch\.no_grad\(\)`"):  # fmt: skip
        g.forward(x, broker=network)


@pytest.mark.parametrize("timeout_s", [None, 60.0])
def test_a_network_worker_answers_an_inference_tensor_under_inference_mode(
    timeout_s: float | None,
) -> None:
    """Under ``torch.inference_mode()``, a frozen module on a network worker answers an
    inference tensor, as it does run here and recalled from the store: its answer was
    decoded on the worker's thread, out of the caller's inference mode, and came back a
    plain tensor. Placed there by a first forward under ``torch.inference_mode()``, it is
    built as the worker builds it, not as an inference tensor of weights the worker then
    failed to load the frozen state into (a RuntimeError)."""
    torch.manual_seed(0)
    enc = ModuleNode.build(nn.Linear, 3, 2)
    g = Graph.somatize(Echo().named("s") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    network = Broker.embedded({"w1": Worker.generic(mode="network")}, timeout_s=timeout_s)
    with torch.inference_mode():
        x = torch.ones(4, 3)
        out, here = g.forward(x, broker=network), g.forward(x)
    assert here.is_inference() and out.is_inference() and torch.equal(out, here)
    out = g.forward(x, broker=network)  # with inference mode off, as it is here
    assert not out.is_inference() and not g.forward(x).is_inference()
    network.close()


def test_a_copy_that_changes_its_arguments_as_it_runs_is_built_again(store: Store) -> None:
    """A node that advances an argument it keeps (``self.step += 1``) on a network worker
    answers each job as the node its key names: the copy that stepped is let go of and the
    next job, naming the same blueprint, is run by a copy built again. It went on with the
    stepped copy, and kept its answer under the key of the node that had not stepped."""
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})

    def graph(placed: bool) -> Graph:
        node = Stepper().named("n").frozen().cached()
        return Graph.somatize(Echo().named("s").frozen() >> (node.at("w1") if placed else node))

    g = graph(placed=True)
    assert g.forward(10.0, broker=broker) == 11.0
    seen: list[dict[str, Any]] = []
    assert g.forward(10.0, broker=broker, store=store, watching=seen.append) == 11.0
    assert [f["fact"] for f in seen if f.get("node") == "n" and f["fact"] != "crossed"] == [
        "ran",
        "kept",
    ]
    assert graph(placed=False).forward(10.0) == 11.0  # what a Stepper(step=0) answers
    assert graph(placed=False).forward(10.0, store=store) == 11.0  # and what was kept
    assert g.forward(10.0, broker=broker) == 11.0


def test_a_copy_that_changes_an_argument_into_what_has_no_canonical_form_is_built_again(
    store: Store,
) -> None:
    """A node that replaces an argument it keeps with a value that has no canonical form (a
    Fraction) answers each job on a network worker as the node its key names, and what a
    worker keeps is that answer: the copy that changed is let go of, as one whose value
    changed to another canonical one is. It was kept — a value that lost its canonical form
    was taken for a model loaded where None was — and the next job ran with the doubled
    value, its answer kept under the key of the node that had not doubled it."""
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})

    def graph(placed: bool) -> Graph:
        node = Drifts(1.0).named("d").frozen().cached()
        return Graph.somatize(Rows().named("rows").frozen() >> (node.at("w1") if placed else node))

    g = graph(placed=True)
    assert g.forward({"at": 0, "take": 3}, broker=broker, store=store) == [0.0, 1.0, 2.0]
    assert g.forward({"at": 1, "take": 3}, broker=broker, store=store) == [1.0, 2.0, 3.0]
    assert graph(placed=False).forward({"at": 1, "take": 3}, store=store) == [1.0, 2.0, 3.0]


def test_a_copy_that_counts_in_an_attribute_it_makes_answers_as_its_first() -> None:
    """A node counting its runs in a public attribute its constructor does not make
    (``self.seen = seen + 1``) answers every forward on a network worker as it answers its
    first, as docs/broker.md says: the copy that made the attribute is built again. It was
    kept (an attribute that appeared was not a change), and answers went 100, 101, 100."""
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g = Graph.somatize(Echo().named("s") >> Seen().named("n").at("w1"))
    assert [g.forward(100.0, broker=broker) for _ in range(4)] == [100.0] * 4
    here = Graph.somatize(Echo().named("s") >> Seen().named("n"))
    assert [here.forward(100.0) for _ in range(3)] == [100.0, 101.0, 102.0]


def test_a_worker_packs_a_tensor_its_node_made_from_canonical_inputs() -> None:
    """A worker process that never imported ``somatize.torch`` (a Ray actor handed a list)
    packs a tensor its node made, as this process would: no codec wrote it there."""
    code = (
        "import sys, torch\n"
        "from somatize.broker.host import pack\n"
        "assert 'somatize.torch' not in sys.modules and 'somatize_torch' not in sys.modules\n"
        "print(pack(torch.tensor([1.0, 2.0]), 'the answer')[0])\n"
    )
    assert _printed(code).split() == ["tensor"]


def _printed(code: str) -> str:
    """What a new Python process running ``code`` in this checkout prints."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_plain_values_cross_to_a_network_worker_where_torch_is_loaded_without_numpy() -> None:
    """torch installed on its own needs no numpy, and somatize.torch (the `torch` extra)
    does. A process that imported torch and holds no numpy sends and gets back plain values
    across a network worker, as a process with neither does; a tensor it would send is
    refused as a CodecError naming what `import somatize.torch` said here, where no codec
    writes it, rather than every value refused with an ImportError said of the node."""
    code = (
        "import sys, warnings\n"
        "sys.modules['numpy'] = None  # as if it were not installed\n"
        "warnings.simplefilter('ignore')  # torch warns it found no numpy\n"
        "import torch\n"
        "from somatize import Broker, CodecError, Graph, Worker\n"
        "from tests.nodes import Largest, Rows, Scale\n"
        "broker = Broker.embedded({'w1': Worker.generic(mode='network')})\n"
        "g = Graph.somatize(Rows() >> Scale(3.0).at('w1') >> Largest())\n"
        "print(g.forward({'at': 0, 'take': 4}, broker=broker))\n"
        "from somatize.broker.host import pack\n"
        "try:\n"
        "    pack(torch.ones(2), 'the answer')\n"
        "except CodecError as why:\n"
        "    print(why)\n"
    )
    first, said = _printed(code).splitlines()
    assert first == "9.0"
    assert "the answer is a `torch.Tensor` and no codec writes it" in said, said
    assert "somatize.torch needs numpy, which is not installed" in said, said


def test_a_node_loading_a_model_on_first_use_loads_it_once_on_a_worker(
    store: Store,
) -> None:
    """A copy that fills an attribute as it first runs (a model loaded where None was,
    with no canonical form) has not changed what it computes: it is kept for the next
    job, not built (and loaded) again for each. Nor is it refused in this process, where
    `model` is named like its constructor's argument and is not the argument."""
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    LOADED.clear()
    g = Graph.somatize(
        Echo().named("s").frozen() >> LoadsOnFirstUse().named("e").frozen().cached().at("w1")
    )
    assert [g.forward(float(i), broker=broker) for i in range(4)] == [0.0, 2.0, 4.0, 6.0]
    assert LOADED == ["small"]
    here = Graph.somatize(
        Echo().named("s").frozen() >> LoadsOnFirstUse().named("e").frozen().cached()
    )
    assert [here.forward(float(i), store=store) for i in range(3)] == [0.0, 2.0, 4.0]


def test_a_module_that_changes_its_state_as_it_runs_is_loaded_again(store: Store) -> None:
    """A frozen module whose forward updates a buffer (a count of its calls) on a network
    worker answers each job from the state the graph is frozen at, as the module does in
    this process at that state: the copy that changed is let go of and the state is loaded
    again for the next job. The worker went on with the changed copy, and kept what it
    answered under the key of the state it was sent. Nor is such an answer kept, as it is
    not in this process: recalled, it would leave the count where it was."""
    torch.manual_seed(0)
    enc = ModuleNode.build(Counting, 3)
    g = Graph.somatize(
        Ramp(3).named("rows").frozen() >> enc.named("enc").frozen().cached().at("w1")
    )
    freeze(g)
    torch.manual_seed(0)
    fresh = Graph.somatize(
        Ramp(3).named("rows").frozen()
        >> ModuleNode.build(Counting, 3).named("enc").frozen().cached()
    )
    freeze(fresh)
    assert fresh.memory.state_of("enc") == g.memory.state_of("enc")
    x = {"at": 0, "take": 2}
    expected = copy.deepcopy(fresh).forward(x)  # a module at the frozen state, run once
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    sent = []
    for keeping in (None, store, store):
        seen: list[dict[str, Any]] = []
        assert torch_equal(
            g.forward(x, broker=broker, store=keeping, watching=seen.append), expected
        )
        sent.append(_state_crossings(seen))
        assert not [f for f in seen if f["fact"] in ("kept", "recalled")]
    assert sent == [[len(enc.state_bytes())]] * 3
    assert torch_equal(fresh.forward(x, store=store), expected)


def _ramped(kind: type[nn.Module], width: int, placed: bool = True) -> tuple[Graph, ModuleNode]:
    """Rows ``width`` wide, then a frozen cached ``kind`` of that width, on `w1` where
    ``placed``, frozen at the same weights each time; and its node."""
    torch.manual_seed(0)
    enc = ModuleNode.build(kind, width)
    node = enc.named("enc").frozen().cached()
    g = Graph.somatize(Ramp(width).named("rows").frozen() >> (node.at("w1") if placed else node))
    freeze(g)
    return g, enc


def test_a_module_that_sets_what_it_keeps_as_it_runs_keeps_nothing_on_a_network_worker(
    store: Store,
) -> None:
    """A frozen, cached module whose forward sets a value it keeps (a gain taken from the
    first batch it sees) keeps nothing on a network worker, as in this process: each job
    answers as the module at the frozen state, its copy built again, and a graph handed
    the batches in the other order with a fresh worker computes them. The worker kept the
    answers of the copy that had set its gain, under the key of the module that had not,
    and the second graph recalled them: other answers than its module gives."""
    x, y = {"at": 0, "take": 2}, {"at": 4, "take": 3}
    _, fresh = _ramped(Gained, 3, placed=False)

    def expected(span: dict[str, int]) -> torch.Tensor:
        rows = Ramp(3).forward(span, None)
        with torch.no_grad():
            out: torch.Tensor = copy.deepcopy(fresh.module)(rows)
        return out

    for order in ([x, y], [y, x]):
        g, _ = _ramped(Gained, 3)
        broker = Broker.embedded({"w1": Worker.generic(mode="network")})
        for span in order:
            seen: list[dict[str, Any]] = []
            out = g.forward(span, broker=broker, store=store, watching=seen.append)
            assert torch.equal(out, expected(span))
            assert [
                f["fact"] for f in seen if f.get("node") == "enc" and f["fact"] != "crossed"
            ] == ["ran"]
        broker.close()
    seen = []
    assert torch.equal(
        _ramped(Gained, 3, placed=False)[0].forward(y, store=store, watching=seen.append),
        expected(y),
    )
    assert [f["fact"] for f in seen if f.get("node") == "enc"] == ["ran"]  # here too


def test_a_module_that_sets_what_it_keeps_as_it_runs_on_a_local_worker_keeps_it_as_here(
    store: Store,
) -> None:
    """A frozen, cached module whose forward sets a value it keeps (a gain taken from the
    first batch it sees) on a local worker keeps nothing of the call that set it, as with
    no broker: the next call is keyed by the gain, and every graph answers as its module
    does, whatever order it is handed the batches in. The call that set the gain was kept
    under the key of the module without one, and a graph recalling it never set its gain:
    it then recalled, for the next batch, an answer computed with another batch's gain."""
    x, y = {"at": 0, "take": 2}, {"at": 4, "take": 3}
    for order in ([x, y], [y, x], [x, y]):
        g, enc = _ramped(Gained, 3)
        module = copy.deepcopy(enc.module)  # as the graph's, run with no cache
        broker = Broker.embedded({"w1": Worker.generic(mode="local")})
        for i, span in enumerate(order):
            seen: list[dict[str, Any]] = []
            out = g.forward(span, broker=broker, store=store, watching=seen.append)
            with torch.no_grad():
                assert torch.equal(out, module(Ramp(3).forward(span, None)))
            if i == 0:
                assert [f["fact"] for f in seen if f.get("node") == "enc"] == ["ran"]
        broker.close()


def test_a_module_that_gives_a_value_anew_as_it_was_keeps_its_answers_on_a_network_worker(
    store: Store,
) -> None:
    """A frozen, cached module whose forward sets a value it keeps to the very value it
    held (a width noted at every call, a new object each time) changes nothing on a
    network worker: its answer is kept there, and its copy, with its weights, kept for the
    next job."""
    g, enc = _ramped(Widthed, 300)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen: list[dict[str, Any]] = []
    for at in (0, 1, 0):
        g.forward({"at": at, "take": 2}, broker=broker, store=store, watching=seen.append)
    enc_facts = [f for f in seen if f.get("node") == "enc" and f["fact"] != "crossed"]
    assert [f["fact"] for f in enc_facts] == ["ran", "kept", "ran", "kept", "recalled"]
    assert [f.get("by") for f in enc_facts if f["fact"] == "kept"] == ["w1", "w1"]
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    broker.close()


@pytest.mark.parametrize("kind", [Projected, KeptInAList, Normed])
def test_a_module_a_partial_or_a_plain_list_holds_crosses_to_a_network_worker_with_its_weights(
    store: Store, kind: type[nn.Module]
) -> None:
    """A frozen module computing with a module a partial it keeps binds, or one it keeps in
    a plain list, no part of it, answers on a network worker as in this process: the
    weights of that module, in its state digest, cross with the module's own, and are
    loaded into the copy the worker built. They did not cross, so the worker's copy (drawn
    by its constructor) was refused with a StateMismatch saying to freeze the graph again,
    which could never help, or, for a list, answered with the weights it drew. One read
    from a global is, on a worker in this process, the client's very own: it is left
    trainable, as the client has it."""
    torch.manual_seed(0)
    enc = ModuleNode.build(kind, 3)
    g = Graph.somatize(
        Ramp(3).named("rows").frozen() >> enc.named("enc").frozen().cached().at("w1")
    )
    freeze(g)
    x = {"at": 0, "take": 2}
    with torch.no_grad():
        expected = enc.module(Ramp(3).forward(x, None))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with torch.no_grad():  # the module the partial binds is trainable, as without a broker
        assert torch_equal(g.forward(x, broker=broker, store=store), expected)
    here = Graph.somatize(Ramp(3).named("rows").frozen() >> enc.named("enc").frozen().cached())
    assert torch_equal(here.forward(x, store=store), expected)
    assert all(p.requires_grad for p in broker_nodes.NORM.parameters())


def test_a_copy_whose_global_module_another_copy_loaded_is_loaded_again(store: Store) -> None:
    """A worker keeping copies of a node at two states that differ by the weights of a
    module its module reads from a global (two graphs, or two clients whose globals were
    drawn apart) holds that global once: loading the second state into it changed what
    the first copy computes with. The first copy was kept and answered, under its state's
    key, with the second's weights; it is now loaded again, and answers as its state says."""
    torch.manual_seed(0)
    enc = ModuleNode.build(Normed, 3)
    g = Graph.somatize(
        Ramp(3).named("rows").frozen() >> enc.named("enc").frozen().cached().at("w1")
    )
    freeze(g)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 2}
    with torch.no_grad():
        g.forward(x, broker=broker, store=store)
        rows = Ramp(3).forward(x, None)
        expected = enc.module(rows)
    blueprint = broker._blueprint(g, "enc").to_bytes()
    first, data = held_state(g, "enc"), enc.state_bytes()
    weight = broker_nodes.NORM.weight.detach().clone()
    try:
        with torch.no_grad():
            broker_nodes.NORM.weight.mul_(2)
        freeze(g)
        second, other = held_state(g, "enc"), enc.state_bytes()
        host = Host("w9", apart=True)  # its global is the client's here: loaded in turn
        host.node(blueprint, first, data, name="enc", holder="a")
        host.node(blueprint, second, other, name="enc", holder="b")
        assert host.node(blueprint, first, name="enc", holder="a") is None  # its state, again
        again = host.node(blueprint, first, data, name="enc", holder="a")
        assert again is not None
        with torch.no_grad():
            assert torch_equal(again.module(rows), expected)
    finally:
        with torch.no_grad():
            broker_nodes.NORM.weight.copy_(weight)


def test_a_worker_keeps_one_copy_of_a_node_whose_list_changes_between_forwards() -> None:
    """A node whose list changes between forwards is rebuilt from a new blueprint each time
    on a network worker, which keeps the copies built from the last two and lets go of
    older ones: it kept one copy per blueprint, for good. A list switched back and forth
    builds no new copy."""
    recent: list[int] = []
    g = Graph.somatize(Echo().named("s") >> Window(recent).named("n").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    for item in range(10):
        recent.append(item)
        assert g.forward(1.0, broker=broker) == 2.0 + item
    host = broker._hosts["w1"]
    assert len(host._nodes) == 2  # the one it runs now, and the one before
    kept = set(map(id, host._nodes.values()))
    for _ in range(3):
        recent.pop()
        assert g.forward(1.0, broker=broker) == 10.0
        recent.append(9)
        assert g.forward(1.0, broker=broker) == 11.0
    assert set(map(id, host._nodes.values())) == kept


def test_a_node_holding_state_is_compared_by_its_public_values_once_its_state_is_loaded() -> None:
    """A node that hands its state over is compared too, once that state is loaded into the
    copy a network worker rebuilds: weights changed before the graph was built are its
    state, and cross; a public setting beside them given another value, before the build or
    after, is refused, naming it, as for a node that holds no state."""
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    listed = Listed()
    listed.weights = [2.0]
    g = Graph.somatize(Echo().named("s") >> listed.named("n").frozen().at("w1"))
    settle(g)
    assert g.forward(3.0, broker=broker) == g.forward(3.0) == 6.0
    listed.scale = 5.0
    refused = r"`n` .* holds other values in `scale` than the node in the graph"
    with pytest.raises(Unbuildable, match=refused):
        g.forward(3.0, broker=broker)
    scaled = Listed()
    scaled.scale = 5.0
    g = Graph.somatize(Echo().named("s") >> scaled.named("n").frozen().at("w1"))
    settle(g)
    assert g.forward(3.0) == 15.0
    with pytest.raises(Unbuildable, match=refused):
        g.forward(3.0, broker=Broker.embedded({"w1": Worker.generic(mode="network")}))


def test_a_cached_node_on_a_worker_is_kept_there_and_recalled(store: Store) -> None:
    """A cached node placed on a network worker is kept by the worker; the next forward
    recalls it and nothing crosses."""
    rows = Rows()
    g = Graph.somatize(
        rows.named("rows").frozen() >> Scale(2.0).named("scale").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    first: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 4}, store=store, broker=broker, watching=first.append) == [
        0.0, 2.0, 4.0, 6.0
    ]  # fmt: skip
    (kept,) = [f for f in first if f["fact"] == "kept"]
    assert store.have([kept["key"]]) == {kept["key"]}
    second: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 4}, store=store, broker=broker, watching=second.append) == [
        0.0, 2.0, 4.0, 6.0
    ]  # fmt: skip
    assert [(f["fact"], f.get("node")) for f in second] == [
        ("spared", "rows"),
        ("recalled", "scale"),
        ("finished", None),
    ]
    assert g.forward({"at": 0, "take": 4}, store=store) == [0.0, 2.0, 4.0, 6.0]
    assert rows.calls == 1


def test_the_broker_s_errors_cross_a_process_boundary_whole() -> None:
    """A broker's error raised where a forward runs in a process of a pool (or a Ray task)
    is pickled to reach the caller: each comes back as the same type, message and
    attributes, not as a TypeError of its constructor that breaks the pool's channel."""
    import pickle

    from somatize.broker import FailedOnWorker, WorkerLost, WorkerTimeout

    errors = [
        WorkerLost("enc", "gpu", 2, "ActorDiedError"),
        WorkerTimeout("enc", "gpu", 30.0),
        WorkerTimeout("enc", "gpu", 120.0, starting=True),
        BrokerClosed("enc", "gpu"),
        FailedOnWorker("enc", "ModuleNode", "gpu", "ZeroDivisionError", "division by zero"),
    ]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.node, back.worker) == ("enc", "gpu")
        assert vars(back) == vars(error)
    assert pickle.loads(pickle.dumps(errors[-1])).raised_there == "ZeroDivisionError"


def test_a_node_failing_on_a_worker_is_named_and_the_broker_goes_on(store: Store) -> None:
    """A node raising on a worker is NodeFailed naming it; nothing is kept; the broker
    runs the next forward."""
    g = Graph.somatize(
        Rows().named("rows").frozen() >> Fails().named("fails").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(NodeFailed, match=r"`fails` \(Fails\) raised ZeroDivisionError"):
        g.forward({"at": 0, "take": 2}, store=store, broker=broker)
    assert not list((Path(store.root) / "answers").rglob("*"))  # type: ignore[attr-defined]
    ok = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    assert ok.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


@pytest.mark.parametrize("where", ["here", "local", "network"])
def test_a_node_raising_an_exception_whose_message_cannot_be_read_is_named(where: str) -> None:
    """A node raising an exception whose ``str()`` raises is NodeFailed naming the node and
    the type it raised, saying its message could not be read — with no broker and on
    either kind of embedded worker, as on a Ray actor — not the error ``str()`` raised."""
    g = Graph.somatize(Rows().named("rows") >> RaisesUnprintable().named("bad").at("w1"))
    broker = None if where == "here" else Broker.embedded({"w1": Worker.generic(mode=where)})
    seen: list[dict[str, Any]] = []
    with pytest.raises(NodeFailed, match=r"`bad` \(RaisesUnprintable\) raised Unprintable") as e:
        g.forward({"at": 0, "take": 2}, broker=broker, watching=seen.append)
    assert "could not be read" in str(e.value)
    assert isinstance(e.value.__cause__, broker_nodes.Unprintable)
    assert [f for f in seen if f["fact"] == "failed"] == [
        {"fact": "failed", "node": "bad", "error": "Unprintable"}
    ]


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_node_running_on_a_worker_when_the_forward_is_interrupted_is_said_failed(
    mode: str, tmp_path: Path, interrupt_when: Callable[[Path], threading.Thread]
) -> None:
    """Ctrl-C while a node runs on a worker says that node ``failed`` with
    KeyboardInterrupt, as the same graph says with no broker, where the interrupt stops
    the node itself — not nothing at all about it."""
    said: dict[str, Any] = {}
    for where in ("here", mode):
        marker = tmp_path / f"started-{where}"
        g = Graph.somatize(
            Rows().named("rows") >> Nap(0.5, marker=str(marker)).named("nap").at("w1")
        )
        broker = None if where == "here" else Broker.embedded({"w1": Worker.generic(mode=mode)})
        interrupter = interrupt_when(marker)
        with pytest.raises(KeyboardInterrupt):
            g.forward({"at": 0, "take": 2}, broker=broker)
        interrupter.join()
        said[where] = g.record.outcome
        if broker is not None:
            broker.close()
    assert said[mode] == said["here"] == {"rows": "ran", "nap": "failed"}


def _kept_and_ran(folder: Path, store: Store) -> list[tuple[str, str]]:
    """What the graph of :func:`broker_nodes.spinning` recalls from ``store`` and runs, with
    no broker (its `spin` let go at once)."""
    (folder / "go").touch()
    seen: list[dict[str, Any]] = []
    spinning(folder).forward({"at": 0, "take": 3}, store=store, watching=seen.append)
    return [(f["fact"], f["node"]) for f in seen if f["fact"] in ("recalled", "ran")]


def _next_forward(after: Graph, broker: Broker, go: Path) -> Any:
    """The answer of ``after`` run on ``broker`` once an interrupted forward has ended:
    at once, not behind a node of that forward still running on a worker (which ``go``,
    touched then, lets end)."""
    out: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: out.update(value=after.forward({"at": 0, "take": 3}, broker=broker)),
        daemon=True,
    )
    thread.start()
    thread.join(60)
    stuck = thread.is_alive()
    go.touch()
    assert not stuck, "a worker still runs a node of the interrupted forward"
    return out["value"]


@pytest.mark.parametrize("mode", ["local", "network", "timed"])
@pytest.mark.parametrize("swallows", [False, True], ids=["raises", "swallows"])
def test_an_interrupted_forward_stops_the_node_on_an_embedded_worker(
    mode: str,
    swallows: bool,
    tmp_path: Path,
    store: Store,
    interrupt_when: Callable[[Path], threading.Thread],
) -> None:
    """Ctrl-C while a node loops in Python on an embedded worker stops that node there: the
    worker is free for its next node at once (not behind a node running for nobody), and
    nothing is kept for the stopped node — nor for one that caught the KeyboardInterrupt
    and answered anyway — while a sibling that finished on another worker is kept. So it
    is on network workers whose calls are timed (``timeout_s``), which run on threads of
    their own."""
    g = spinning(tmp_path, swallows=swallows)
    worker = Worker.generic(mode="network" if mode == "timed" else mode)  # type: ignore[arg-type]
    timeout_s = 600.0 if mode == "timed" else None
    broker = Broker.embedded({"w1": worker, "w2": worker}, timeout_s=timeout_s)

    def watch(fact: dict[str, Any]) -> None:
        if fact["fact"] == "kept" and fact["node"] == "fine":
            (tmp_path / "fine-kept").touch()

    interrupter = interrupt_when(tmp_path / "started")
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 3}, store=store, broker=broker, watching=watch)
    interrupter.join()
    assert g.record.outcome["spin"] == "failed"
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0]
    broker.close()
    assert _kept_and_ran(tmp_path, store) == [
        ("ran", "rows"),
        ("recalled", "fine"),
        ("ran", "spin"),
        ("ran", "sum"),
    ]


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_second_ctrl_c_while_the_first_is_said_still_stops_the_node(
    mode: str, tmp_path: Path, interrupt_when: Callable[[Path], threading.Thread]
) -> None:
    """Ctrl-C pressed again while the forward says what the first one stopped (here: as
    the `failed` fact of the looping node is handed to ``watching``) still leaves that node
    stopped on its embedded worker: the worker is free for its next node, rather than
    held by a node running for nobody, which this process would also wait for as it exits."""
    g = spinning(tmp_path)
    (tmp_path / "fine-kept").touch()
    broker = Broker.embedded({"w1": Worker.generic(mode=mode), "w2": Worker.generic(mode=mode)})

    def again(fact: dict[str, Any]) -> None:
        if fact["fact"] == "failed" and fact["node"] == "spin":
            raise KeyboardInterrupt  # the second Ctrl-C, landing as the first is said

    interrupter = interrupt_when(tmp_path / "started")
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 3}, broker=broker, watching=again)
    interrupter.join()
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0]


@pytest.mark.parametrize("mode", ["local", "network"])
def test_ctrl_c_landing_as_submit_returns_still_stops_the_node(mode: str, tmp_path: Path) -> None:
    """A node starts on its worker while the forward is still returning from
    ``broker.submit``: a Ctrl-C landing there, before the forward holds the call, still
    stops that node, so the worker is free for its next node at once."""
    from somatize.broker import EmbeddedBroker
    from tests.broker_nodes import Spin, returning_interrupted

    Returning = returning_interrupted(EmbeddedBroker, "spin", tmp_path / "started")
    broker = Returning({"w1": Worker.generic(mode=mode)})
    spin = Spin(str(tmp_path / "started"), str(tmp_path / "go"))
    g = Graph.somatize(Rows().named("rows") >> spin.named("spin").at("w1"))
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 3}, broker=broker)
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0]


def test_a_second_ctrl_c_landing_as_the_forward_stops_its_nodes_still_stops_them(
    tmp_path: Path, interrupt_when: Callable[[Path], threading.Thread]
) -> None:
    """A second Ctrl-C landing as the interrupted forward hands its calls to the broker
    to stop, before the broker has stopped them, has them stopped again: the node looping
    on the embedded worker stops, and the forward raises KeyboardInterrupt."""
    from somatize.broker import EmbeddedBroker
    from tests.broker_nodes import Spin

    class CutShort(EmbeddedBroker):
        cuts = 1

        def interrupted(self, futures: Any) -> None:
            if self.cuts:
                self.cuts -= 1
                raise KeyboardInterrupt  # the second Ctrl-C, landing before the stop
            super().interrupted(futures)

    broker = CutShort({"w1": Worker.generic(mode="local")})
    spin = Spin(str(tmp_path / "started"), str(tmp_path / "go"))
    g = Graph.somatize(Rows().named("rows") >> spin.named("spin").at("w1"))
    interrupter = interrupt_when(tmp_path / "started")
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 3}, broker=broker)
    interrupter.join()
    assert broker.cuts == 0
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0]


def test_ctrl_c_cut_short_in_the_wait_of_a_forward_still_stops_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing as Python's own waiting code puts itself back together comes out
    of it as ``RuntimeError: release unlocked lock``, raised while handling the
    KeyboardInterrupt: the forward raises that KeyboardInterrupt, and stops the node."""
    import somatize.engine as engine
    from tests.broker_nodes import Spin

    def cut_short(*args: Any, **kwargs: Any) -> Any:
        waited = time.monotonic()
        while not (tmp_path / "started").exists() and time.monotonic() - waited < 60:
            time.sleep(0.001)
        try:
            raise KeyboardInterrupt  # the Ctrl-C
        finally:
            raise RuntimeError("release unlocked lock")  # as the wait puts itself back

    monkeypatch.setattr(engine, "_wait", cut_short)
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    spin = Spin(str(tmp_path / "started"), str(tmp_path / "go"))
    g = Graph.somatize(Rows().named("rows") >> spin.named("spin").at("w1"))
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 3}, broker=broker)
    assert g.record.outcome["spin"] == "failed"
    monkeypatch.undo()
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0]


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_second_ctrl_c_landing_as_a_lock_is_taken_leaves_the_worker_free(
    mode: str, tmp_path: Path, interrupt_when: Callable[[Path], threading.Thread]
) -> None:
    """A second Ctrl-C landing in Python code that takes a lock, once it has taken it and
    before its ``with`` block begins (as a ``threading`` ``__enter__`` returns), while the
    interrupted forward unwinds and stops its nodes, leaves no lock held that the embedded
    worker needs to settle the stopped call: the worker is free for its next node, and the
    process would not wait for it at exit (its node takes a while to end, as one cleaning
    up does, so the worker settles the call after the forward has unwound)."""
    from tests.broker_nodes import Spin

    landed: list[str] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call" or code.co_name != "__enter__" or code.co_filename != threading.__file__:
            return None

        def entering(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "return" and not landed:
                landed.append(code.co_name)  # co_qualname is Python 3.11 on
                raise KeyboardInterrupt  # the second Ctrl-C, the lock just taken
            return entering

        return entering

    def first(signum: int, frame: Any) -> None:
        sys.settrace(tracer)  # from here on, in this (the main) thread
        raise KeyboardInterrupt

    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})
    spin = Spin(str(tmp_path / "started"), str(tmp_path / "go"), lingers=1.0)
    g = Graph.somatize(Rows().named("rows") >> spin.named("spin").at("w1"))
    interrupter = interrupt_when(tmp_path / "started")
    signal.signal(signal.SIGINT, first)
    try:
        with pytest.raises(KeyboardInterrupt):
            g.forward({"at": 0, "take": 3}, broker=broker)
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter.join()
    after = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert _next_forward(after, broker, tmp_path / "go") == [0.0, 3.0, 6.0], landed


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_ctrl_c_landing_as_a_call_is_handed_to_its_lane_leaves_the_worker_free(
    mode: str, tmp_path: Path
) -> None:
    """A Ctrl-C landing in Python code that takes a lock, once it has taken it, as
    ``broker.submit`` hands a call to its worker's running lane leaves no lock held that
    the lane needs: the worker runs the next forward's node (it hangs otherwise, and so
    would the process at exit)."""
    from somatize.broker import base as broker_base

    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})
    g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0.0, 3.0, 6.0]  # lane running
    landed: list[str] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call" or code.co_name != "__enter__" or code.co_filename != threading.__file__:
            return None
        outer: types.FrameType | None = frame
        while outer is not None and not (
            outer.f_code.co_name == "submit" and outer.f_code.co_filename == broker_base.__file__
        ):  # Broker.submit (co_qualname is Python 3.11 on)
            outer = outer.f_back
        if outer is None:
            return None

        def entering(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "return" and not landed:
                landed.append(frame.f_back.f_code.co_name if frame.f_back else "?")
                raise KeyboardInterrupt  # the Ctrl-C, the lock just taken
            return entering

        return entering

    sys.settrace(tracer)
    try:
        g.forward({"at": 0, "take": 3}, broker=broker)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    assert _next_forward(g, broker, tmp_path / "go") == [0.0, 3.0, 6.0], landed


_FIRST_CALL_INTERRUPTED = """
import sys, threading
from somatize import Broker, Graph, Worker
from somatize.broker import base
from tests.nodes import Rows, Scale
g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w"))
def in_submit(frame):
    while frame is not None and not (
        frame.f_code.co_name == "submit" and frame.f_code.co_filename == base.__file__
    ):
        frame = frame.f_back
    return frame is not None
for mode in ("local", "network"):
    for point in range(1, 1000):
        returns, landed = [0], []
        def tracer(frame, event, arg):
            if event != "call" or not in_submit(frame):
                return None
            def returning(frame, event, arg):
                if event == "return":
                    returns[0] += 1
                    if returns[0] == point and not landed:
                        landed.append(frame.f_code.co_name)
                        raise KeyboardInterrupt  # the Ctrl-C, as this call returns
                return returning
            return returning
        broker = Broker.embedded({"w": Worker.generic(mode=mode)})
        sys.settrace(tracer)
        try:
            g.forward({"at": 0, "take": 3}, broker=broker)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        if not landed:
            break
        out = {}
        after = threading.Thread(
            target=lambda: out.update(value=g.forward({"at": 0, "take": 3}, broker=broker)),
            daemon=True,
        )
        after.start()
        after.join(30)
        if out.get("value") != [0.0, 3.0, 6.0]:
            print(f"{mode}: landing as `{landed[0]}` returned (return {point}) left the "
                  f"worker stuck", flush=True)
            raise SystemExit(1)
    print(mode, "ok", point > 1, flush=True)
"""


_CHECKOUT = Path(__file__).resolve().parent.parent


def _importing_the_checkout() -> dict[str, str]:
    """This process's environment, for a new process that imports from this checkout
    first."""
    paths = [str(_CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _python(arguments: list[str], timeout: float, hung: str) -> subprocess.CompletedProcess[str]:
    """What ``python`` given ``arguments`` did, run as a new process in this checkout; the
    test fails saying ``hung`` and what it printed where it does not exit in ``timeout``
    seconds."""
    try:
        return subprocess.run(
            [sys.executable, *arguments],
            capture_output=True,
            text=True,
            cwd=_CHECKOUT,
            env=_importing_the_checkout(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as late:
        said = late.stdout.decode() if isinstance(late.stdout, bytes) else late.stdout
        pytest.fail(f"{hung}: {said}")


def test_a_ctrl_c_landing_in_a_worker_s_first_call_leaves_the_worker_free(
    tmp_path: Path,
) -> None:
    """A Ctrl-C landing anywhere in ``broker.submit`` as it hands a worker its first call
    — as each Python call made there returns, one after another, the lane's thread
    being started among them — leaves nothing held that the worker needs: its next
    forward runs, and the process exits (``threading``'s start of a thread takes locks
    in Python code, which a Ctrl-C landing there left held for good; one landing just
    after the start left the thread running unrecorded, which the process waited for
    as it exited)."""
    done = _python(
        ["-c", _FIRST_CALL_INTERRUPTED],
        180,
        "the process did not exit once a worker's first call was interrupted",
    )
    assert done.stdout.splitlines() == ["local ok True", "network ok True"], (
        done.stdout + done.stderr[-2000:]
    )
    assert done.returncode == 0, done.stderr[-2000:]


_FORWARD_AS_THE_INTERPRETER_FINALIZES = """
import gc, sys
from somatize import Broker, Graph, Worker
from tests.nodes import Rows, Scale
broker = Broker.embedded({"w": Worker.generic(mode="local")})
g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w"))
if sys.argv[1] == "started":
    print(g.forward({"at": 0, "take": 3}, broker=broker), flush=True)
    broker.close()  # the next forward makes the worker's lane again
class Later:
    def __del__(self):
        print("finalizing", sys.is_finalizing(), flush=True)
        try:
            g.forward({"at": 0, "take": 3}, broker=broker)
        except BaseException as error:
            print("raised", type(error).__name__, flush=True)
gc.disable()  # collected as the interpreter finalizes
later = Later()
later.me = later
del later
"""


@pytest.mark.parametrize("before", ["fresh", "started"])
def test_a_forward_as_the_interpreter_finalizes_fails_and_the_process_exits(before: str) -> None:
    """A forward run by code a collection runs as the interpreter finalizes, on a worker
    with no thread yet (none started in the process, or its lane closed), fails — the
    interpreter starts no thread then — and the process exits, rather than wait for ever
    on a thread that was to start the worker's."""
    done = _python(
        ["-c", _FORWARD_AS_THE_INTERPRETER_FINALIZES, before],
        60,
        "the process did not exit after a forward as it finalized",
    )
    lines = done.stdout.splitlines()
    assert lines[-2:] == ["finalizing True", "raised NodeFailed"], done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]


_FORWARD_IN_A_COLLECTION_ON_THE_STARTING_THREAD = """
import gc
from somatize import Broker, Graph, Worker
from somatize._threads import start_thread
from tests.nodes import Rows, Scale
broker = Broker.embedded({"w": Worker.generic(mode="local")})
g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w"))
class Later:
    def __del__(self):
        print(g.forward({"at": 0, "take": 3}, broker=broker), flush=True)
def start():
    later = Later()
    later.me = later
    del later
    gc.collect()  # as any allocation while a thread starts may collect, on that thread
start_thread(start)
print(g.forward({"at": 1, "take": 2}, broker=broker), flush=True)
"""


def test_a_forward_a_collection_runs_as_a_thread_starts_runs() -> None:
    """A forward run by code a collection runs (a ``__del__``) on the thread that starts
    the workers' threads, as it starts one, starts its worker's thread there and runs,
    rather than hand that start to the thread itself — which waited for it for ever, and
    every later worker's first call with it."""
    done = _python(
        ["-c", _FORWARD_IN_A_COLLECTION_ON_THE_STARTING_THREAD],
        60,
        "a forward run as a thread started waited for ever",
    )
    assert done.stdout.splitlines() == ["[0.0, 3.0, 6.0]", "[3.0, 6.0]"], done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


_FORWARD_IN_A_COLLECTION_INSIDE_THE_BROKER = """
import gc, sys
from somatize import Broker, Graph, Worker
from tests.nodes import Rows, Scale
broker = Broker.embedded({"w": Worker.generic(mode=sys.argv[1])})
g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w"))
print(g.forward({"at": 0, "take": 3}, broker=broker), flush=True)
class Later:
    def __del__(self):
        try:
            g.forward({"at": 1, "take": 3}, broker=broker)
        except BaseException as error:
            print("raised", type(error).__name__, flush=True)
later = Later()
later.me = later
del later
with broker._lock:  # as any allocation inside one of the broker's blocks may collect
    gc.collect()
print(g.forward({"at": 1, "take": 2}, broker=broker), flush=True)
"""


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_forward_a_collection_runs_inside_the_broker_is_refused(mode: str) -> None:
    """A forward run by code a collection runs (a ``__del__``) on a thread inside one of
    the broker's own blocks is refused (``Reentrant``): its worker takes the broker's
    lock to begin the node, and waited for ever for the thread that waited for it. The
    broker goes on answering afterwards."""
    root = Path(__file__).resolve().parent.parent
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FORWARD_IN_A_COLLECTION_INSIDE_THE_BROKER, mode],
            capture_output=True,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
            timeout=60,
        )
    except subprocess.TimeoutExpired as hung:
        said = hung.stdout.decode() if isinstance(hung.stdout, bytes) else hung.stdout
        pytest.fail(f"a forward run in a collection inside the broker waited for ever: {said}")
    assert done.stdout.splitlines() == ["[0.0, 3.0, 6.0]", "raised Reentrant", "[3.0, 6.0]"], (
        done.stdout + done.stderr[-2000:]
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_call_interrupted_before_its_node_begins_does_not_begin_it() -> None:
    """A call stopped while its worker still readies it (decodes its inputs, loads its
    state), before its node's forward begins, does not begin it once ready: it fails with
    KeyboardInterrupt, and the worker's next call runs."""
    from somatize.broker import Done, EmbeddedBroker
    from somatize.node import Context

    readying, ready = threading.Event(), threading.Event()
    began: list[Any] = []

    class Readying(EmbeddedBroker):
        def _send(
            self, graph: Graph, node: str, worker: str, inputs: list[Any], ctx: Any, keep: bool
        ) -> Callable[[], Done]:
            def work() -> Done:
                readying.set()
                ready.wait(60)
                with self.stoppable():
                    began.append(inputs[0])
                return Done(inputs[0], 0)

            return work

    broker = Readying({"w1": Worker.generic(mode="local")})
    g = Graph.somatize(Echo().named("n").at("w1"))
    ctx = Context(name="n", key=None, worker="w1", store=None)
    first = broker.submit(g, "n", [1], ctx)
    assert readying.wait(60)
    broker.interrupted([first])
    ready.set()
    with pytest.raises(KeyboardInterrupt):
        first.result(60)
    assert broker.submit(g, "n", [2], ctx).result(60).value == 2
    assert began == [2]


def test_an_interrupted_forward_stops_what_a_nested_forward_waits_on(
    tmp_path: Path, interrupt_when: Callable[[Path], threading.Thread]
) -> None:
    """Ctrl-C while a node on `w1` waits on a nested forward whose node loops on `w2`
    stops that node too — `w1`'s thread, waiting on it, could not be stopped before it
    ends — so both workers are free for their next nodes at once."""
    from tests.broker_nodes import Spin

    broker = Broker.embedded(
        {"w1": Worker.generic(mode="local"), "w2": Worker.generic(mode="network")}
    )
    spin = Spin(str(tmp_path / "started"), str(tmp_path / "go"))
    inner = Graph.somatize(Echo().named("in") >> spin.named("spin").at("w2"))
    outer = Graph.somatize(Echo().named("start") >> Nested(inner, broker).named("nest").at("w1"))
    interrupter = interrupt_when(tmp_path / "started")
    with pytest.raises(KeyboardInterrupt):
        outer.forward(1.0, broker=broker)
    interrupter.join()
    after = Graph.somatize(
        Rows().named("rows")
        >> (Scale(3.0).named("one").at("w1"), Scale(2.0).named("two").at("w2"))
        >> Add().named("sum")
    )
    assert _next_forward(after, broker, tmp_path / "go") == 15.0


@pytest.mark.parametrize("mode", ["local", "network"])
def test_ctrl_c_ends_a_process_whose_node_loops_on_an_embedded_worker(
    mode: str, tmp_path: Path
) -> None:
    """SIGINT to a process whose forward waits on a node looping in Python on an embedded
    worker ends the process with KeyboardInterrupt, rather than have it wait, as it exits,
    for the node to finish; nothing was kept for that node, and the answer of a sibling
    that finished on another worker is whole."""
    code = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from somatize import Broker, Store, Worker\n"
        "from tests.broker_nodes import spinning\n"
        "folder = Path(sys.argv[1])\n"
        "workers = {w: Worker.generic(mode=sys.argv[2]) for w in ('w1', 'w2')}\n"
        "def watch(fact):\n"
        "    if fact['fact'] == 'kept' and fact['node'] == 'fine':\n"
        "        (folder / 'fine-kept').touch()\n"
        "spinning(folder).forward(\n"
        "    {'at': 0, 'take': 3}, store=Store(folder / 'store'),\n"
        "    broker=Broker.embedded(workers), watching=watch,\n"
        ")\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=_CHECKOUT,
        env=_importing_the_checkout(),
    )
    try:
        for _ in range(6000):
            if (tmp_path / "started").exists() or process.poll() is not None:
                break
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()[1][-2000:]
        os.kill(process.pid, signal.SIGINT)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the process went on running the interrupted node after Ctrl-C")
    finally:
        (tmp_path / "go").touch()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode != 0
    assert err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    assert _kept_and_ran(tmp_path, Store(tmp_path / "store")) == [
        ("ran", "rows"),
        ("recalled", "fine"),
        ("ran", "spin"),
        ("ran", "sum"),
    ]


_PROFILED_AFTER = """
import os, signal, sys, threading, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)
from somatize import Broker, Graph, Worker
from tests.broker_nodes import spinning
from tests.nodes import Rows, Scale
folder, interrupted = Path(sys.argv[1]), sys.argv[2] == "interrupted"
broker = Broker.embedded({w: Worker.generic() for w in ("w1", "w2")})
if interrupted:
    (folder / "fine-kept").touch()
    def interrupt():
        while not (folder / "started").exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        spinning(folder).forward({"at": 0, "take": 3}, broker=broker)
    except KeyboardInterrupt:
        pass
g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
print(g.forward({"at": 0, "take": 3}, broker=broker))
def called():
    return "called"
sys.setprofile(lambda frame, event, arg: None)
print(called())
sys.setprofile(None)
"""


@pytest.mark.parametrize("interrupted", ["interrupted", "plain"])
def test_a_profiler_set_after_a_forward_on_an_embedded_worker_runs(
    tmp_path: Path, interrupted: str
) -> None:
    """A profiler or tracer set after a forward ran a node on an embedded worker — stopped
    by Ctrl-C there or not — runs the calls made after it: the interrupts the broker can
    raise in its workers' threads leave the interpreter as they found it (taking one back
    by sending none left it looking for one at every instruction, and Python 3.11 then
    hung at the first call a profiler saw)."""
    (tmp_path / "go").touch() if interrupted == "plain" else None
    try:
        done = _python(
            ["-c", _PROFILED_AFTER, str(tmp_path), interrupted],
            120,
            "the process hung at a call once a profiler was set",
        )
    finally:
        (tmp_path / "go").touch()
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-3:] == ["[0.0, 3.0, 6.0]", "called", ""]


def _forward_on(graph: Graph, broker: Broker) -> Any:
    """``graph``'s answer run on ``broker`` (in a forked child, by :func:`in_forked_child`)."""
    return graph.forward({"at": 0, "take": 3}, broker=broker)


@needs_fork
@pytest.mark.parametrize("mode", ["local", "network"])
@pytest.mark.parametrize("held", [False, True], ids=["idle", "locks-held"])
def test_a_broker_used_before_a_fork_runs_forwards_in_the_forked_child(
    mode: str, held: bool
) -> None:
    """A process forked from one whose forwards ran on a broker (a DataLoader worker, a
    multiprocessing worker) runs its own forwards on that broker — on workers of its
    own, since the parent's threads stay behind — rather than hand its calls to a
    worker thread it does not have and wait for ever; so it does when a thread of the
    parent held the broker's locks as it forked. The parent's workers run on."""
    from tests.forked import in_child

    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})
    g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("next").at("w1"))
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0.0, 3.0, 6.0]
    taken, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        locks = [broker._lock, *(host._lock for host in broker._hosts.values())]
        for lock in locks:
            lock.acquire()
        taken.set()
        let_go.wait(120)
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold, daemon=True)
    if held:
        holder.start()
        assert taken.wait(60)
    try:
        assert in_child("fork", _forward_on, g, broker, timeout=60) == [0.0, 3.0, 6.0]
    finally:
        let_go.set()
    if held:
        holder.join(60)
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0.0, 3.0, 6.0]


def test_a_broker_copied_or_sent_to_a_spawned_process_runs_forwards_there() -> None:
    """A broker pickled to a spawned process (a DataLoader worker on macOS) or copied runs
    its forwards on workers of its own, as one in a forked child does, with the catalog it
    was given; the original's run on. It could not be pickled: `SimpleQueue` said so,
    naming nothing of somatize's."""
    from tests.forked import in_child

    catalog = Catalog(in_process=True)
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="network"), "w2": Worker.generic(mode="local")},
        catalog=catalog,
    )
    g = Graph.somatize(
        Rows().named("rows")
        >> Scale(3.0).named("next").at("w1")
        >> Scale(2.0).named("last").at("w2")
    )
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0.0, 6.0, 12.0]
    copied = copy.deepcopy(broker)
    assert copied.workers == broker.workers and not copied._lanes
    assert copied.catalog.in_process
    assert g.forward({"at": 0, "take": 3}, broker=copied) == [0.0, 6.0, 12.0]
    assert in_child("spawn", _forward_on, g, broker, timeout=120) == [0.0, 6.0, 12.0]
    assert g.forward({"at": 0, "take": 3}, broker=broker) == [0.0, 6.0, 12.0]


def test_mapped_node_on_a_worker(store: Store) -> None:
    """The items of a mapped node placed on a network worker cross and are kept one by one."""
    from tests.nodes import Square

    g = Graph.somatize(Square().named("sq").frozen().cached().mapped().at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward([1, 2, 3], store=store, broker=broker) == [1, 4, 9]
    assert g.forward([1, 2, 3, 4], store=store, broker=broker) == [1, 4, 9, 16]


def test_independent_branches_on_two_workers_run_at_once(tmp_path: Path) -> None:
    """Two nodes on two workers with no edge between them run at once: each waits for the
    other's mark, so run one after the other the first would wait in vain and raise."""
    where = str(tmp_path)
    g = Graph.somatize(
        Rows().named("rows")
        >> (
            Meet(where, "a", "b").named("a").at("w1"),
            Meet(where, "b", "a").named("b").at("w2"),
        )
        >> Add().named("sum")
    )
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="network"), "w2": Worker.generic(mode="network")}
    )
    try:
        assert g.forward({"at": 0, "take": 4}, broker=broker) == 12.0
    finally:
        broker.close()


def test_workers_are_described_honestly() -> None:
    """A worker with an unknown mode or negative resources is refused, saying what is allowed."""
    with pytest.raises(BadWorker, match=r"`local`.*`network`.*got 'wire'"):
        Worker.generic(mode="wire")  # type: ignore[arg-type]
    with pytest.raises(BadWorker, match=r"num_gpus is a finite number ≥ 0"):
        Worker.generic(num_gpus=-1)
    with pytest.raises(TypeError, match=r"Worker.generic"):
        Broker.embedded({"w1": "gpu"})  # type: ignore[dict-item]


@pytest.mark.parametrize("name", ["w1\n  fake", "w\t1", "\x1b[2J", "w1\u2028  fake"])
def test_a_broker_refuses_a_worker_name_no_node_could_be_placed_on(name: str) -> None:
    """A worker's name holds no control character nor line separator, as `.at()` says: a
    broker given one is refused, saying so, rather than hold a worker no node can name."""
    with pytest.raises(ValueError, match=r"a worker is named by a non-empty str with no control"):
        Broker.embedded({name: Worker.generic()})
    Broker.embedded({"gpu 0·名前": Worker.generic()}).close()


def test_a_worker_is_hashable_and_its_resources_stay_as_checked() -> None:
    """A worker is a frozen value: it hashes (a set of workers, a key in a dict), equal
    descriptions are equal, and its resources are copied when it is made and cannot be
    changed after they were checked. It was unhashable, and a negative amount could be
    written into its resources after the check."""
    given = {"accelerator": 1}
    worker = Worker.generic(mode="network", num_gpus=1, resources=given)
    given["accelerator"] = -5
    assert worker.resources == {"accelerator": 1} and worker.resources["accelerator"] == 1
    with pytest.raises(TypeError):
        worker.resources["accelerator"] = -5  # type: ignore[index]
    same = Worker.generic(mode="network", num_gpus=1, resources={"accelerator": 1})
    assert worker == same and hash(worker) == hash(same)
    assert len({worker, same, Worker.generic()}) == 2
    assert dict(worker.resources) == {"accelerator": 1}
    assert Worker("network", None, None, {"a": 2.0}).resources == {"a": 2.0}
    with pytest.raises(BadWorker, match=r"resources map names to finite amounts"):
        Worker.generic(resources={"a": -1})


def test_the_seed_cells_with_parquet(tmp_path: Path) -> None:
    """Seed 001's last cells: rows read here, cleaned on a network worker, same answer."""
    data = pytest.importorskip("somatize.data")
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    from tests.broker_nodes import Frames, Widest

    chooser = random.Random(0)
    words = ["win", "free", "dinner", "tomorrow", "bus", "sorry", "meeting", "ok"]
    messages = [
        " ".join(chooser.choice(words) for _ in range(chooser.randint(4, 12))) for _ in range(200)
    ]
    sink = pyarrow.BufferOutputStream()
    parquet.write_table(pyarrow.table({"sms": messages}), sink)
    store = Store(tmp_path / "store")
    store.bind("sms/train", store.put(sink.getvalue().to_pybytes()))

    counts = Widest()
    crossing = Graph.somatize(
        data.Parquet(store, "sms/train").named("sms")
        >> Frames().named("clean").at("w1")
        >> counts.named("widest")
    )
    worker = Broker.embedded({"w1": Worker.generic(mode="network")})
    expected = float(max(len(one.split()) for one in messages[:32]))
    assert crossing.forward({"at": 0, "take": 32}) == expected
    seen: list[dict[str, Any]] = []
    assert crossing.forward({"at": 0, "take": 32}, broker=worker, watching=seen.append) == expected
    crossed = {(f.get("from"), f["node"]): f["bytes"] for f in seen if f["fact"] == "crossed"}
    assert set(crossed) == {("sms", "clean"), ("clean", "widest")}
    assert all(size > 0 for size in crossed.values())


def test_the_seeds_crossing_cell_runs_as_written(tmp_path: Any) -> None:
    """A notebook's own class, defined in `__main__`, crosses to an embedded network
    worker exactly as the seed writes it: no registration needed in this process."""
    script = tmp_path / "cell.py"
    script.write_text(
        "from somatize import Broker, Graph, Node, Worker\n"
        "class Clean(Node):\n"
        "    def forward(self, rows, ctx):\n"
        "        return [r * 2 for r in rows]\n"
        "class Source(Node):\n"
        "    def forward(self, span, ctx):\n"
        "        return list(range(span['at'], span['at'] + span['take']))\n"
        "crossing = Graph.somatize(\n"
        "    Source().named('sms') >> Clean().named('clean').at('w1')\n"
        ")\n"
        "worker = Broker.embedded({'w1': Worker.generic(mode='network')})\n"
        "seen = []\n"
        "out = crossing.forward({'at': 0, 'take': 32}, broker=worker, watching=seen.append)\n"
        "assert out == crossing.forward({'at': 0, 'take': 32}), out\n"
        "assert any(f['fact'] == 'crossed' and f['bytes'] > 0 for f in seen), seen\n"
        "print('crossed', sum(f['bytes'] for f in seen if f['fact'] == 'crossed'))\n"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("crossed ")


# -- frozen torch modules on network workers ------------------------------------------------


def _encoder_graph(*, cached: bool = False) -> tuple[Graph, ModuleNode, Ramp]:
    """A source here feeding a frozen encoder built rebuildably and placed on `w1`, frozen;
    its BatchNorm statistics moved off their defaults, so buffers must cross too."""
    rows = Ramp(4)
    enc = ModuleNode.build(Encoder, 4)
    with torch.no_grad():
        enc.module.norm.running_mean.fill_(0.5)
    if cached:
        rows.frozen().cached()
        enc.cached("enc")
    g = Graph.somatize(rows.named("rows") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    return g, enc, rows


def _state_crossings(facts: list[dict[str, Any]]) -> list[int]:
    """The bytes of every state that crossed to a worker, in order."""
    return [f["bytes"] for f in facts if f["fact"] == "crossed" and f["way"] == "state"]


def test_a_built_module_node_names_its_class_and_arguments() -> None:
    """`ModuleNode.build` gives a blueprint naming the module's class, its arguments and the
    maker, rebuilt into the same node; its declaration is an instance-made node's."""
    enc = ModuleNode.build(Encoder, 4, out=2)
    blueprint = blueprint_of(enc, "enc")
    assert (blueprint.identity, blueprint.args, blueprint.kwargs, blueprint.maker) == (
        "tests.broker_nodes:Encoder", (4,), {"out": 2}, "somatize_torch.freeze:ModuleNode.build"
    )  # fmt: skip
    assert enc.declaration() == ModuleNode(Encoder(4, out=2)).declaration()
    rebuilt = Catalog().build(Blueprint.from_bytes(blueprint.to_bytes()))
    assert isinstance(rebuilt, ModuleNode) and isinstance(rebuilt.module, Encoder)
    assert rebuilt.module.linear.out_features == 2
    assert rebuilt._smz.identity == "tests.broker_nodes:Encoder"
    assert rebuilt.declaration() == enc.declaration()
    with pytest.raises(TypeError, match=r"module class.*ModuleNode\.build\(Encoder, width=32\)"):
        ModuleNode.build(Encoder(4))  # type: ignore[arg-type]


def test_a_module_under_the_older_weight_norm_runs_on_a_network_worker() -> None:
    """A frozen encoder normalised by torch's older ``weight_norm`` answers on a network
    worker as here, and the weights it is changed to, once frozen again: the weight its
    forward pre-hook works out from its state, kept as a plain tensor, was declared as a
    setting, so a copy rebuilt with other random weights declared otherwise and the node was
    refused (Unbuildable) before anything ran."""
    torch.manual_seed(0)
    enc = ModuleNode.build(WeightNormed, 4)
    g = Graph.somatize(Ramp(4).named("rows") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))
    with torch.no_grad():
        enc.module.linear.weight_g.mul_(2.0)
    freeze(g)
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))
    assert torch_equal(g.forward(x), enc.module(Ramp(4).forward(x, None)))


def test_a_module_in_channels_last_runs_so_on_a_network_worker() -> None:
    """A frozen conv whose weights were put in channels_last here
    (``module.to(memory_format=torch.channels_last)``) computes in channels_last on a
    network worker too, and answers in the layout it answers here: the worker copied the
    weights into the contiguous ones it built, so its convolutions took the other path and
    answered in C order, where a kernel may round otherwise."""
    torch.manual_seed(0)
    enc = ModuleNode.build(Convolved, 4)
    enc.module.to(memory_format=torch.channels_last)
    g = Graph.somatize(Echo().named("s") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    x = torch.randn(2, 4, 5, 5)
    out = g.forward(x, broker=Broker.embedded({"w1": Worker.generic(mode="network")}))
    here = enc.module(x)
    assert here.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, here) and out.stride() == here.stride()


def test_a_frozen_module_crosses_once_and_stays_loaded() -> None:
    """A frozen encoder on a network worker answers as without a broker; its weights cross
    on the first forward only, and the worker holds them loaded and frozen."""
    g, enc, _ = _encoder_graph()
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    first: list[dict[str, Any]] = []
    assert torch_equal(g.forward(x, broker=broker, watching=first.append), g.forward(x))
    assert _state_crossings(first) == [len(enc.state_bytes())]
    assert [f["way"] for f in first if f["fact"] == "crossed"] == ["state", "out", "back"]
    second: list[dict[str, Any]] = []
    y = {"at": 5, "take": 3}
    assert torch_equal(g.forward(y, broker=broker, watching=second.append), g.forward(y))
    assert _state_crossings(second) == []
    assert [f["way"] for f in second if f["fact"] == "crossed"] == ["out", "back"]
    (loaded,) = broker._hosts["w1"]._nodes.values()
    assert loaded is not enc and loaded._smz.state == g.memory.state_of("enc")
    assert is_held(loaded.module) and not any(p.requires_grad for p in loaded.module.parameters())


def test_a_frozen_module_of_no_weights_runs_on_a_network_worker() -> None:
    """A frozen module that holds no parameter or buffer (an activation, a fixed transform)
    answers on a network worker as here: its state, of no tensor, crosses as one."""
    rows = Ramp(4)
    enc = ModuleNode.build(nn.Tanh)
    g = Graph.somatize(rows.named("rows") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    seen: list[dict[str, Any]] = []
    assert torch_equal(g.forward(x, broker=broker, watching=seen.append), g.forward(x))
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    (loaded,) = broker._hosts["w1"]._nodes.values()
    assert loaded._smz.state == g.memory.state_of("enc")


def test_a_recurrent_module_runs_on_a_network_worker() -> None:
    """A frozen LSTM built rebuildably answers on a network worker as here: the parameters
    it keeps in a plain list beside its registered ones are its state, not a setting that
    the worker's module, built from its class before its weights are loaded, would
    declare otherwise."""
    rows = Ramp(4)
    enc = ModuleNode.build(Recurrent, 3)
    g = Graph.somatize(rows.named("rows") >> enc.named("enc").frozen().at("w1"))
    freeze(g)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))


def test_a_refrozen_module_is_loaded_again() -> None:
    """Weights changed and frozen again are a new state: the worker is sent it, answers as
    the changed module does here, and lets the old weights go."""
    g, enc, _ = _encoder_graph()
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    before = g.forward(x, broker=broker)
    with torch.no_grad():
        enc.module.linear.weight.add_(1.0)
    digest = freeze(g)["enc"]
    seen: list[dict[str, Any]] = []
    after = g.forward(x, broker=broker, watching=seen.append)
    assert torch_equal(after, g.forward(x)) and not torch_equal(after, before)
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    (loaded,) = broker._hosts["w1"]._nodes.values()
    assert loaded._smz.state == digest


def _negated(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return -output


def test_a_setting_given_after_build_is_refused_on_a_network_worker() -> None:
    """A value given to a built module, or a hook registered on it, after
    `ModuleNode.build` made it would not be on the module a worker builds from the class
    and arguments: the next forward is refused, naming what changed, before anything runs
    (the worker would otherwise compute without it, under a key that says it)."""
    g, enc, rows = _encoder_graph()
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    g.forward(x, broker=broker)
    ran = rows.calls
    enc.module.tag = 3.0
    with pytest.raises(
        Unbuildable, match=r"`tag` of the `Encoder` changed after `ModuleNode\.build"
    ):
        g.forward(x, broker=broker)
    del enc.module.tag
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))
    handle = enc.module.linear.register_forward_hook(_negated)
    with pytest.raises(Unbuildable, match=r"its forward hooks of the `Encoder` changed"):
        g.forward(x, broker=broker)
    handle.remove()
    assert rows.calls == ran + 2
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    enc.module.tag = 3.0
    assert torch_equal(g.forward(x, broker=local), g.forward(x))


def test_a_module_node_made_from_an_instance_is_refused_on_a_network_worker() -> None:
    """A ModuleNode holding a module instance cannot be rebuilt elsewhere: refused before
    anything runs, saying to build it with `ModuleNode.build`; a local worker runs it."""
    rows = Ramp(4)
    g = Graph.somatize(rows.named("rows") >> ModuleNode(Encoder(4)).named("enc").frozen().at("w1"))
    freeze(g)
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(Unbuildable, match=r"`enc` cannot be sent to worker `w1`.*`Encoder` "
                       r"instance.*`ModuleNode\.build\(Encoder, \.\.\.\)`"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=network)
    assert rows.calls == 0
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    x = {"at": 0, "take": 2}
    assert torch_equal(g.forward(x, broker=local), g.forward(x))


def test_a_module_node_not_frozen_is_refused_on_a_network_worker() -> None:
    """A rebuildable module that is not frozen at a digest has no state a worker could check:
    refused before anything runs, saying to freeze it."""
    rows = Ramp(4)
    g = Graph.somatize(rows.named("rows") >> ModuleNode.build(Encoder, 4).named("enc").at("w1"))
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    with pytest.raises(Unbuildable, match=r"`enc` \(Encoder\).*not frozen at any.*\.frozen\(\)"
                       r".*somatize\.torch\.freeze\(g\)"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=network)
    assert rows.calls == 0


def test_a_state_whose_digest_does_not_match_is_refused() -> None:
    """Weights changed after freezing where the node cannot see it (into ``.data``) are
    refused by the worker that loads them, which keeps nothing loaded; the same weights
    frozen again run."""
    g, enc, _ = _encoder_graph()
    frozen_at = g.memory.state_of("enc")
    with torch.no_grad():
        enc.module.linear.bias.data.add_(1.0)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    refused = r"`enc` on worker `w1` was sent state whose digest is blake3:\w+, and the graph "
    refused += rf"is frozen at {frozen_at}.*freeze\(g\)"
    with pytest.raises(StateMismatch, match=refused):
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert not broker._hosts["w1"]._nodes
    freeze(g)
    x = {"at": 0, "take": 2}
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))


def test_weights_changed_in_place_are_restated_before_they_cross() -> None:
    """Weights changed in place after freezing, where the node sees it, are restated before
    the forward sends anything: the worker loads the new weights and answers as here."""
    g, enc, _ = _encoder_graph()
    frozen_at = g.memory.state_of("enc")
    x = {"at": 0, "take": 2}
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g.forward(x, broker=broker)
    with torch.no_grad():
        enc.module.linear.bias.add_(1.0)
    assert torch_equal(g.forward(x, broker=broker), g.forward(x))
    assert g.memory.state_of("enc") != frozen_at


@pytest.mark.parametrize("keeping", [False, True])
def test_a_list_changed_after_build_reaches_the_network_worker(
    keeping: bool, tmp_path: Path
) -> None:
    """A node built with a list and placed on a network worker is rebuilt there with the list
    as it is now, with or without a store; with one, the answer is kept under the key of
    the new list, which a fresh graph built with that list recalls."""
    store = Store(tmp_path / "store") if keeping else None
    weights = [2.0]
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    g = weighted(weights, "w1")
    x = {"at": 0, "take": 4}
    assert g.forward(x, store=store, broker=broker) == 6.0
    weights[0] = 3.0
    assert g.forward(x, store=store, broker=broker) == 9.0
    assert g.forward(x, store=store, broker=broker) == 9.0
    if store is not None:
        fresh = weighted([3.0])
        seen: list[dict[str, Any]] = []
        assert fresh.forward(x, store=store, watching=seen.append) == 9.0
        assert ("recalled", "top") in [(f["fact"], f.get("node")) for f in seen]


def test_state_that_does_not_fit_the_rebuilt_module_is_refused() -> None:
    """Weights of another shape than the module built to receive them are refused, naming
    the tensor, before anything is copied."""
    narrow = ModuleNode.build(Encoder, 4)
    before = narrow.module.linear.weight.clone()
    with pytest.raises(StateDoesNotFit, match=r"`Encoder`'s `linear\.weight` was sent as "
                       r"torch\.float32 \(3, 5\).*holds torch\.float32 \(3, 4\)"):  # fmt: skip
        narrow.load_state(memoryview(ModuleNode.build(Encoder, 5).state_bytes()))
    assert torch.equal(narrow.module.linear.weight, before)
    with pytest.raises(StateDoesNotFit, match=r"names \['bias', 'weight'\].*has \["):
        narrow.load_state(memoryview(ModuleNode(torch.nn.Linear(4, 3)).state_bytes()))


def test_a_module_converted_to_another_dtype_runs_on_a_worker_in_that_dtype() -> None:
    """A ModuleNode.build module converted after it was built (``.double()``) and frozen
    again runs on a network worker, whose rebuilt module takes the weights' dtypes, and
    answers as without a broker; weights of a dtype no conversion makes are refused."""
    enc = ModuleNode.build(Encoder, 4)
    g = Graph.somatize(
        Ramp(4).named("rows") >> Doubled().named("doubled") >> enc.named("enc").frozen().at("w1")
    )
    enc.module.double()
    freeze(g)
    x = {"at": 0, "take": 4}
    here = g.forward(x)
    there = g.forward(x, broker=Broker.embedded({"w1": Worker.generic(mode="network")}))
    assert there.dtype == torch.float64 and torch.equal(there, here)
    built = ModuleNode.build(Encoder, 4)
    counted = ModuleNode.build(Encoder, 4)
    counted.module.norm.num_batches_tracked = counted.module.norm.num_batches_tracked.double()
    with pytest.raises(StateDoesNotFit, match=r"`norm\.num_batches_tracked` was sent as "
                       r"torch\.float64"):  # fmt: skip
        built.load_state(memoryview(counted.state_bytes()))


def test_a_cached_frozen_module_is_kept_by_the_worker_and_recalled(store: Store) -> None:
    """A cached frozen encoder on a network worker is kept there; the next forward recalls
    it without sending anything, weights included."""
    g, _, _ = _encoder_graph(cached=True)
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 4}
    first: list[dict[str, Any]] = []
    kept = g.forward(x, store=store, broker=broker, watching=first.append)
    assert [f["by"] for f in first if f["fact"] == "kept" and f["node"] == "enc"] == ["w1"]
    second: list[dict[str, Any]] = []
    assert torch_equal(g.forward(x, store=store, broker=broker, watching=second.append), kept)
    assert [f["fact"] for f in second] == ["spared", "recalled", "finished"]


def test_an_answer_a_worker_kept_is_kept_with_the_code_it_depends_on(store: Store) -> None:
    """A worker keeps a cached node's answer with the client's fingerprint of its code and of
    the code of what it reads: recalled as it is, and drifted, naming it, once a node it
    reads is written otherwise."""
    g = Graph.somatize(
        Rows().named("sms").frozen() >> Scale(3.0).named("clean").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 4}
    first: list[dict[str, Any]] = []
    assert g.forward(x, store=store, broker=broker, watching=first.append) == [0, 3, 6, 9]
    assert [f["by"] for f in first if f["fact"] == "kept"] == ["w1"]
    assert g.forward(x, store=store, broker=broker) == [0, 3, 6, 9]
    assert g.record is not None and g.record.outcome == {"sms": "spared", "clean": "recalled"}
    g.memory.written_as("sms", "sha256:newer")
    with pytest.warns(Drifted, match=r"`clean` was recalled .* the code of `sms` \(`Rows`\)"):
        assert g.forward(x, store=store, broker=broker) == [0, 3, 6, 9]
    assert g.record.outcome == {"sms": "spared", "clean": "drifted"}


def torch_equal(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same values."""
    return bool(torch.equal(a, b))


# -- where a network worker keeps ----------------------------------------------------------------


def _scaled() -> tuple[Graph, Rows]:
    """A source here feeding a cached `scale` on network worker `w1`, built afresh."""
    rows = Rows()
    g = Graph.somatize(
        rows.named("rows").frozen() >> Scale(2.0).named("scale").frozen().cached().at("w1")
    )
    return g, rows


def _kept_by(facts: list[dict[str, Any]]) -> list[str | None]:
    """Who kept each answer: a worker's name, or None for the client."""
    return [f.get("by") for f in facts if f["fact"] == "kept"]


def _network() -> Broker:
    return Broker.embedded({"w1": Worker.generic(mode="network")})


def test_a_network_worker_keeps_into_a_bucket_and_a_fresh_client_recalls() -> None:
    """With a bucket store (S3 on loopback) a network worker opens the bucket from its
    address and keeps there; a fresh client store over the bucket recalls it, nothing run."""
    from tests.conftest_s3 import s3_options, s3_url

    url = s3_url()
    g, _ = _scaled()
    first: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    store = Store.on_bucket(url, **s3_options())
    assert g.forward(x, store=store, broker=_network(), watching=first.append) == [0.0, 2.0, 4.0]
    assert _kept_by(first) == ["w1"]
    other, rows = _scaled()
    again: list[dict[str, Any]] = []
    fresh = Store.on_bucket(url, **s3_options())
    assert other.forward(x, store=fresh, broker=_network(), watching=again.append) == [
        0.0, 2.0, 4.0
    ]  # fmt: skip
    assert [f["fact"] for f in again] == ["spared", "recalled", "finished"]
    assert rows.calls == 0


def test_a_store_with_no_address_is_kept_by_the_client() -> None:
    """A `memory://` bucket lives in this process alone and has no address: the worker is
    not told of it and the client keeps the answer, which the next forward recalls."""
    store = Store.on_bucket("memory://somatize/no-address-on-workers")
    g, _ = _scaled()
    first: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    assert g.forward(x, store=store, broker=_network(), watching=first.append) == [0.0, 2.0, 4.0]
    assert _kept_by(first) == [None]
    again: list[dict[str, Any]] = []
    assert g.forward(x, store=store, broker=_network(), watching=again.append) == [0.0, 2.0, 4.0]
    assert [f["fact"] for f in again] == ["spared", "recalled", "finished"]


def _napping(marker: Path, placed: bool = True) -> Graph:
    """A source here feeding a cached `nap` that touches ``marker`` when it runs, placed on
    `w1` where ``placed``."""
    nap = Nap(0.0, marker=str(marker)).named("nap").frozen().cached()
    return Graph.somatize(Rows().named("rows").frozen() >> (nap.at("w1") if placed else nap))


@pytest.mark.parametrize("mode", ["local", "network"])
@pytest.mark.parametrize("home", ["directory", "bucket"])
def test_a_store_opened_read_only_is_read_only_on_the_workers(
    tmp_path: Path, mode: str, home: str
) -> None:
    """Over a store opened ``read_only=True``, a forward whose answers are all held is served
    with nothing run on a worker; one with an answer missing is refused with the read-only
    message before any worker begins, as with no broker, and nothing is kept."""
    from tests.conftest_s3 import writer_and_reader

    writer, reader = writer_and_reader(home, tmp_path / "store")
    marker = tmp_path / "ran"
    held, missing = {"at": 0, "take": 3}, {"at": 5, "take": 3}
    assert _napping(marker, placed=False).forward(held, store=writer) == [0, 1, 2]
    marker.unlink()
    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})
    seen: list[dict[str, Any]] = []
    g = _napping(marker)
    assert g.forward(held, store=reader, broker=broker, watching=seen.append) == [0, 1, 2]
    assert [(f["fact"], f.get("node")) for f in seen] == [
        ("spared", "rows"),
        ("recalled", "nap"),
        ("finished", None),
    ]
    for asked in (None, broker):
        seen.clear()
        with pytest.raises(StoreError, match=r"opened with read_only=True.*can still be read"):
            g.forward(missing, store=reader, broker=asked, watching=seen.append)
        assert seen == []
    assert not marker.exists()
    seen.clear()
    _napping(marker, placed=False).forward(missing, store=writer, watching=seen.append)
    assert [f["fact"] for f in seen if f.get("node") == "nap"] == ["ran", "kept"]


def test_a_worker_without_the_signing_key_leaves_the_keeping_to_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed store whose key the worker's environment lacks: the worker keeps nothing,
    the client keeps a signed record, and a fresh signed client recalls it."""
    from somatize.store import LocalStore

    monkeypatch.delenv("SOMATIZE_STORE_KEY", raising=False)
    g, _ = _scaled()
    first: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    signed = LocalStore(tmp_path / "store", signing_key="client-only")
    assert g.forward(x, store=signed, broker=_network(), watching=first.append) == [0.0, 2.0, 4.0]
    assert _kept_by(first) == [None]
    (key,) = [f["key"] for f in first if f["fact"] == "kept"]
    fresh = LocalStore(tmp_path / "store", signing_key="client-only")
    assert bytes(fresh.recall(key)[1])
    other, rows = _scaled()
    again: list[dict[str, Any]] = []
    assert other.forward(x, store=fresh, broker=_network(), watching=again.append) == [
        0.0, 2.0, 4.0
    ]  # fmt: skip
    assert [f["fact"] for f in again] == ["spared", "recalled", "finished"]
    assert rows.calls == 0


def test_a_worker_with_the_signing_key_keeps_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose `$SOMATIZE_STORE_KEY` is the store's key keeps there, signed: a store
    signed with that key recalls it; one with another key does not have it."""
    from somatize.store import LocalStore

    monkeypatch.setenv("SOMATIZE_STORE_KEY", "shared-secret")
    g, _ = _scaled()
    first: list[dict[str, Any]] = []
    signed = LocalStore(tmp_path / "store")
    assert signed.signer is not None
    x = {"at": 0, "take": 3}
    assert g.forward(x, store=signed, broker=_network(), watching=first.append) == [0.0, 2.0, 4.0]
    assert _kept_by(first) == ["w1"]
    (key,) = [f["key"] for f in first if f["fact"] == "kept"]
    assert LocalStore(tmp_path / "store", signing_key="shared-secret").have([key]) == {key}
    assert LocalStore(tmp_path / "store", signing_key="other").have([key]) == set()


def _answers(store: Store) -> list[Path]:
    return [p for p in (Path(store.root) / "answers").rglob("*") if p.is_file()]  # type: ignore[attr-defined]


def test_a_worker_running_other_code_refuses_and_keeps_nothing(store: Store) -> None:
    """A worker whose class behind a node's identity is other code than the graph's (the
    same constructor and declaration, another source) refuses before anything runs,
    naming the node and the worker, instead of keeping its answer under the graph's key."""
    catalog = Catalog()
    catalog.register(ScaleOtherwise, "tests.nodes:Scale")
    rows = Rows()
    g = Graph.somatize(
        rows.named("rows").frozen() >> Scale(3.0).named("scale").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")}, catalog=catalog)
    with pytest.raises(Unbuildable, match=r"`scale` cannot be sent to worker `w1`.*other code"):
        g.forward({"at": 0, "take": 2}, store=store, broker=broker)
    assert rows.calls == 0 and _answers(store) == []
    assert g.forward({"at": 0, "take": 2}, store=store, strict=True) == [0.0, 3.0]


def test_a_host_refuses_a_job_written_against_other_code() -> None:
    """A host whose node's code has another fingerprint than the job names refuses the job
    itself, naming the node and the worker (the last line of defence, on any broker)."""
    from somatize.broker.host import Host, job_for
    from somatize.node import Context

    g = Graph.somatize(Rows().named("rows") >> Scale(3.0).named("scale").at("w1"))
    blueprint = blueprint_of(g.node("scale"), "scale")
    ctx = Context(name="scale", key=None, worker="w1", store=None)
    job, sent = job_for(g, "scale", "w1", blueprint, [[1, 2]], ctx, keep=False)
    catalog = Catalog()
    catalog.register(ScaleOtherwise, "tests.nodes:Scale")
    with pytest.raises(Unbuildable, match=r"`scale` on worker `w1` runs other code"):
        Host("w1", catalog).run(job, sent)
    assert Host("w1").run(job, sent).kept is None  # the same code answers


def test_an_input_crosses_as_it_was_when_the_node_was_submitted(store: Store) -> None:
    """What a network worker is sent is encoded when its node is submitted: a node here
    that changes the value in place while the worker is busy does not change it."""
    g = Graph.somatize(
        Echo().named("s").frozen()
        >> (
            Nap(0.3).named("busy").at("w1"),
            Length().named("len").frozen().cached().at("w1"),
            Grows().named("grow"),
        )
        >> Three().named("out")
    )
    assert g.forward([1, 2, 3]) == [[1, 2, 3, 0], 3, 4]
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    assert g.forward([1, 2, 3], store=store, broker=broker)[1] == 3
    assert g.forward([1, 2, 3], store=store)[1] == 3  # and 3 was kept under its key


def _forward_in_thread(g: Graph, value: Any, broker: Broker) -> tuple[threading.Thread, dict]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = g.forward(value, broker=broker)
        except BaseException as error:
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(marker: Path) -> None:
    for _ in range(400):
        if marker.exists():
            return
        time.sleep(0.025)
    raise AssertionError(f"{marker} never appeared")


@pytest.mark.parametrize("mode", ["local", "network"])
def test_closing_the_broker_fails_a_waiting_forward_at_once(mode: str, tmp_path: Path) -> None:
    """A forward with one node running and one queued on a worker when the broker is closed
    fails with BrokerClosed, naming a node and its worker, instead of waiting forever; the
    broker runs the next forward."""
    marker = tmp_path / "started"
    g = napping(marker, 1.0)
    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})  # type: ignore[arg-type]
    thread, out = _forward_in_thread(g, {"at": 0, "take": 2}, broker)
    _wait_for(marker)
    broker.close()
    thread.join(10)
    assert not thread.is_alive(), "the forward still waits on a closed broker"
    assert isinstance(out.get("error"), BrokerClosed), out
    assert re.search(r"`[ab]` on worker `w1`.*closed", str(out["error"]))
    assert g.forward({"at": 0, "take": 2}, broker=broker) == 2.0


def _closed_as_a_node_runs(mode: str, tmp_path: Path, seconds: float) -> Broker:
    """An embedded broker of one worker ``w1`` of ``mode``, closed while a node that runs
    for ``seconds`` still runs there; the forward that ran it told the broker closed."""
    broker_nodes.RUNNING.update(now=0, most=0)
    marker = tmp_path / "started"
    slow = Graph.somatize(Echo().named("s") >> Overlap(seconds, str(marker)).named("slow").at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode=mode)})  # type: ignore[arg-type]
    thread, out = _forward_in_thread(slow, 1, broker)
    _wait_for(marker)
    broker.close()
    thread.join(10)
    assert isinstance(out.get("error"), BrokerClosed), out
    return broker


@pytest.mark.parametrize("mode", ["local", "network"])
def test_after_close_a_worker_still_runs_one_node_at_a_time(mode: str, tmp_path: Path) -> None:
    """A node still running on an embedded worker when the broker is closed finishes on its
    own, and the worker starts the next forward's node only once it has: each worker runs
    one node at a time. The next node ran beside it, on a lane of its own."""
    broker = _closed_as_a_node_runs(mode, tmp_path, 0.5)
    quick = Graph.somatize(Echo().named("s") >> Overlap(0.0).named("quick").at("w1"))
    assert quick.forward(2, broker=broker) == 2
    assert broker_nodes.RUNNING == {"now": 0, "most": 1}


@pytest.mark.parametrize("mode", ["local", "network"])
def test_a_ctrl_c_as_a_closed_worker_s_next_lane_is_made_keeps_one_node_at_a_time(
    mode: str, tmp_path: Path
) -> None:
    """A Ctrl-C landing as the first call after ``close()`` hands its new lane the wait for
    the node still running on the closed one (here: as the pool makes that wait's future)
    leaves the wait noted: the worker's next node starts once the running one has
    finished, not beside it."""
    import concurrent.futures.thread as pool_module

    broker = _closed_as_a_node_runs(mode, tmp_path, 1.0)
    landed: list[str] = []

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        below = frame.f_back
        if event != "call" or landed or below is None:
            return None
        if below.f_code.co_name != "submit" or below.f_code.co_filename != pool_module.__file__:
            return None

        def returning(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "return" and not landed:
                landed.append(frame.f_code.co_name)
                raise KeyboardInterrupt  # the Ctrl-C, as the lane is handed its first call
            return returning

        return returning

    quick = Graph.somatize(Echo().named("s") >> Overlap(0.0).named("quick").at("w1"))
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            quick.forward(2, broker=broker)
    finally:
        sys.settrace(None)
    assert landed
    assert quick.forward(2, broker=broker) == 2
    assert broker_nodes.RUNNING == {"now": 0, "most": 1}


def test_closing_an_embedded_broker_lets_go_of_the_nodes_and_weights_it_loaded() -> None:
    """``close()`` lets go of what the network workers rebuilt and loaded (a frozen
    module's weights): the next forward builds the node again and sends its weights again.
    The hosts kept them for good."""
    g, enc, _ = _encoder_graph()
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 5}
    seen: list[dict[str, Any]] = []
    g.forward(x, broker=broker, watching=seen.append)
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    (loaded,) = broker._hosts["w1"]._nodes.values()
    gone = weakref.ref(loaded)
    del loaded
    broker.close()
    gc.collect()
    assert gone() is None, "the closed broker still holds the module it loaded"
    seen.clear()
    assert torch_equal(g.forward(x, broker=broker, watching=seen.append), g.forward(x))
    assert _state_crossings(seen) == [len(enc.state_bytes())]


def test_a_node_no_worker_can_rebuild_is_refused_before_anything_runs(store: Store) -> None:
    """A node whose rebuilt copy declares something else is refused before the first node
    runs, naming the node and the worker, and nothing upstream is kept."""
    rows = Rows()
    g = Graph.somatize(
        rows.named("rows").frozen()
        >> Scale().named("scale").frozen().cached()
        >> Seeded().named("seeded").frozen().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen: list[dict[str, Any]] = []
    with pytest.raises(Unbuildable, match=r"`seeded` cannot be sent to worker `w1`.*"
                       r"rebuilt here declares.*Nothing has run"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, store=store, broker=broker, watching=seen.append)
    assert rows.calls == 0 and seen == [] and _answers(store) == []


def test_a_nested_forward_on_the_same_worker_is_refused() -> None:
    """A node that runs another graph with the broker it runs on, on the worker it runs on,
    would wait on itself: refused with a clear error; another worker of the broker is fine."""
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="local"), "w2": Worker.generic(mode="local")}
    )
    inner = Graph.somatize(Echo().named("start") >> Scale().named("scale").at("w1"))
    outer = Graph.somatize(Echo().named("start") >> Nested(inner, broker).named("nest").at("w1"))
    thread, out = _forward_in_thread(outer, [1, 2], broker)
    thread.join(10)
    assert not thread.is_alive(), "the nested forward waits on itself"
    assert isinstance(out.get("error"), Reentrant), out
    assert re.search(r"`scale` is placed on worker `w1`, where .* already runs", str(out["error"]))
    elsewhere = Graph.somatize(Echo().named("start") >> Scale().named("scale").at("w2"))
    outer = Graph.somatize(
        Echo().named("start") >> Nested(elsewhere, broker).named("nest").at("w1")
    )
    assert outer.forward([1, 2], broker=broker) == [2.0, 4.0]


def test_a_nested_forward_back_through_another_worker_is_refused() -> None:
    """A node on w1 running a graph on w2 whose node runs a graph on w1 would wait on itself
    through w2: refused, saying through which workers, as the direct case is."""
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="local"), "w2": Worker.generic(mode="local")}
    )
    back = Graph.somatize(Echo().named("start") >> Scale().named("scale").at("w1"))
    there = Graph.somatize(Echo().named("start") >> Nested(back, broker).named("hop").at("w2"))
    outer = Graph.somatize(Echo().named("start") >> Nested(there, broker).named("nest").at("w1"))
    thread, out = _forward_in_thread(outer, [1, 2], broker)
    thread.join(10)
    assert not thread.is_alive(), "the nested forwards wait on each other"
    error = out.get("error")
    assert isinstance(error, Reentrant), out
    assert "`scale` is placed on worker `w1`, where a node waits" in str(error)
    assert "(through `w1` → `w2`)" in str(error)


class _MeetThenNest(Node):
    """Waits until ``meeting`` is met (both branches running on their workers), then runs
    ``inner`` with ``broker`` from inside its forward."""

    def __init__(self, inner: Graph, broker: Broker, meeting: threading.Barrier) -> None:
        self.inner, self.broker, self.meeting = inner, broker, meeting

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, value: Any, ctx: Any) -> Any:
        self.meeting.wait(10)
        return self.inner.forward(value, broker=self.broker)


def test_two_workers_whose_nodes_run_graphs_on_each_other_are_refused_not_stuck() -> None:
    """Two branches of one forward, running at once, a node on w1 running a graph on w2 and
    a node on w2 one on w1, would each wait for the other for ever — each on another worker
    than its own, so what one thread asked did not show it. The call that would close the
    circle is refused (Reentrant), naming the workers; it hung."""
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="local"), "w2": Worker.generic(mode="local")}
    )
    meeting = threading.Barrier(2)
    on_w2 = Graph.somatize(Echo().named("i0") >> Scale().named("i1").at("w2"))
    on_w1 = Graph.somatize(Echo().named("j0") >> Scale().named("j1").at("w1"))
    g = Graph.somatize(
        Echo().named("s")
        >> (
            _MeetThenNest(on_w2, broker, meeting).named("a").at("w1"),
            _MeetThenNest(on_w1, broker, meeting).named("b").at("w2"),
        )
        >> Add().named("both")
    )
    thread, out = _forward_in_thread(g, [1, 2], broker)
    thread.join(15)
    assert not thread.is_alive(), "the two workers wait on each other"
    error = out.get("error")
    assert isinstance(error, Reentrant), out
    said = r"`[ij]1` is placed on worker `w.`, whose node waits for the node asking for it"
    assert re.search(said + r", on `w.` \(through `w.` → `w.`\)", str(error))
    alone = _MeetThenNest(on_w2, broker, threading.Barrier(1))
    one = Graph.somatize(Echo().named("s") >> alone.named("a").at("w1"))
    assert one.forward([1, 2], broker=broker) == [2.0, 4.0]  # nothing left waiting


def test_workers_and_catalogs_are_checked_when_described() -> None:
    """Resources that are not finite numbers, a map that is not one, and a catalog that is
    not a Catalog are refused where they are given, saying what is expected."""
    for amount in (float("nan"), float("inf"), True):
        with pytest.raises(BadWorker, match=r"num_cpus is a finite number ≥ 0"):
            Worker.generic(num_cpus=amount)
    with pytest.raises(BadWorker, match=r"num_gpus is a finite number ≥ 0"):
        Worker.generic(num_gpus=float("inf"))
    with pytest.raises(BadWorker, match=r"resources map names to .* got 'abc'"):
        Worker.generic(resources="abc")  # type: ignore[arg-type]
    with pytest.raises(BadWorker, match=r"resources map names to finite amounts ≥ 0, got 'a'"):
        Worker.generic(resources={"a": float("nan")})
    with pytest.raises(TypeError, match=r"catalog= takes a `somatize.Catalog`, got a `str`"):
        Broker.embedded({"w1": Worker.generic()}, catalog="x")  # type: ignore[arg-type]


def test_two_graphs_at_other_weights_each_send_their_weights_once() -> None:
    """Two graphs whose encoders share a name and an architecture but not their weights,
    run by turns on one worker, each send their weights on their first forward only: the
    worker holds both, where re-freezing one graph lets its old weights go."""
    graphs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        graphs.append(_encoder_graph()[0])
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    x = {"at": 0, "take": 3}
    sent = []
    for _ in range(3):
        for g in graphs:
            seen: list[dict[str, Any]] = []
            assert torch_equal(g.forward(x, broker=broker, watching=seen.append), g.forward(x))
            sent.append(len(_state_crossings(seen)))
    assert sent == [1, 1, 0, 0, 0, 0]
    assert len(broker._hosts["w1"]._nodes) == 2


def test_a_class_redefined_runs_as_redefined_on_the_same_worker() -> None:
    """A notebook cell defining a node's class is edited and run again: a graph built again
    runs the new class on the worker that ran the old one, as it does without a broker."""
    cell = types.ModuleType("tests_redefined_cell")
    written = "class Offset(Node):\n    def forward(self, x, ctx):\n        return x + {}\n"
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    sys.modules[cell.__name__] = cell
    try:
        answers = []
        for offset in (1, 1000):
            exec(written.format(offset), {"Node": Node, **vars(cell)}, vars(cell))
            g = Graph.somatize(cell.Offset().named("offset").at("w1"))
            answers.append((g.forward(2, broker=broker), g.forward(2)))
        assert answers == [(3, 3), (1002, 1002)]
    finally:
        del sys.modules[cell.__name__]
        broker.close()


def test_a_placed_node_is_told_the_worker_it_runs_on_and_none_with_no_broker() -> None:
    """``ctx.worker`` names where the node runs: its worker when a broker runs it there, in
    either mode, and None when the graph runs with no broker, which ignores ``.at()`` and
    runs every node here — as a node placed nowhere is told."""
    g = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w1"))
    assert g.forward({"at": 0, "take": 2})[1] is None
    for mode in ("local", "network"):
        broker = Broker.embedded({"w1": Worker.generic(mode=mode)})  # type: ignore[arg-type]
        assert g.forward({"at": 0, "take": 2}, broker=broker)[1] == "w1"
    unplaced = Graph.somatize(Rows().named("rows") >> Where().named("where"))
    assert unplaced.forward({"at": 0, "take": 2}, broker=broker)[1] is None


_COMPUTING = threading.Event()
"""Set by :class:`_ComputesLate` once its forward began on its worker."""
_PATCHED = threading.Event()
"""Set by :class:`_PatchesComputesLate` once it gave :class:`_ComputesLate` other code."""


class _ComputesLate(Node):
    """Adds one, by a method it calls once :class:`_PatchesComputesLate`, on another worker,
    has had its chance to give it another."""

    def forward(self, x: int, ctx: Any) -> int:
        _COMPUTING.set()
        _PATCHED.wait(10)
        return self.compute(x)

    def compute(self, x: int) -> int:
        return x + 1


class _PatchesComputesLate(Node):
    """Sets another `compute` on :class:`_ComputesLate` while it runs, as another thread of
    the process (a notebook's cell run again) would."""

    def forward(self, x: int, ctx: Any) -> int:
        _COMPUTING.wait(10)
        _ComputesLate.compute = lambda self, x: x + 1000  # type: ignore[method-assign]
        _PATCHED.set()
        return x


def test_an_answer_a_worker_computed_while_its_code_was_changed_is_not_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node on a network worker whose class is given another method while it runs there
    computes with the new code, after the job was checked against the old code's
    fingerprint: neither the worker nor the client keeps its answer, so the old code, set
    back, computes its own answer rather than recall the new code's under its key."""
    written = _ComputesLate.compute
    monkeypatch.setattr(_ComputesLate, "compute", written)
    _COMPUTING.clear()
    _PATCHED.clear()
    g = Graph.somatize(
        Echo().named("start").frozen()
        >> (
            _ComputesLate().named("late").frozen().cached().at("w1"),
            _PatchesComputesLate().named("patches").at("w2"),
        )
        >> Add().named("sum")
    )
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="network"), "w2": Worker.generic(mode="network")}
    )
    seen: list[dict[str, Any]] = []
    assert g.forward(1, store=store, broker=broker, watching=seen.append) == 1002
    assert [f for f in seen if f["fact"] == "kept"] == []
    _ComputesLate.compute = written  # type: ignore[method-assign]
    fresh = Graph.somatize(
        Echo().named("start").frozen()
        >> (_ComputesLate().named("late").frozen().cached(), Echo().named("patches"))
        >> Add().named("sum")
    )
    _PATCHED.set()  # nothing patches it now
    assert fresh.forward(1, store=store, strict=True) == 3


class _Signalled(Node):
    """A node told by ``written`` that a branch beside it wrote into what both are handed
    (declared by nothing else: the event is no argument of its answers)."""

    def __init__(self, written: threading.Event) -> None:
        self.written = written

    def declare(self) -> dict[str, Any]:
        return {}


class _SumsOnceWritten(_Signalled):
    """Sums the list it is handed once ``written`` is set (another branch wrote into it)."""

    def forward(self, xs: list[int], ctx: Any) -> int:
        self.written.wait(10)
        return sum(xs)


class _WritesFirst(_Signalled):
    """Writes into the list it is handed, then sets ``written``."""

    def forward(self, xs: list[int], ctx: Any) -> int:
        xs[0] = -100
        self.written.set()
        return len(xs)


def test_a_keyed_node_on_a_local_worker_whose_input_a_node_beside_it_writes_into_fails(
    store: Store,
) -> None:
    """A cached node on a local worker is handed the very list a node run beside it, here,
    is handed too, and that node writes into it while the cached one runs: the cached
    node's answer, computed from the written list, was kept under the key of the list as it
    was handed in, and recalled without the broker for that list. It fails (NodeFailed)
    and nothing is kept."""
    written = threading.Event()
    g = Graph.somatize(
        Echo().named("start").frozen()
        >> (
            _SumsOnceWritten(written).named("sum").frozen().cached().at("w1"),
            _WritesFirst(written).named("writes").frozen(),
        )
        >> Add().named("both").frozen()
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    seen: list[dict[str, Any]] = []
    with pytest.raises(NodeFailed, match=r"`sum`.*ran at the same time as `writes`.*changed"):
        g.forward([1, 2, 3], store=store, broker=broker, watching=seen.append)
    assert _answers(store) == [] and not [f for f in seen if f["fact"] == "kept"]
    assert {"fact": "failed", "node": "sum", "error": "ValueError"} in seen
    written.set()
    assert g.forward([1, 2, 3], store=store) == 9  # 6, computed from [1, 2, 3], and 3


def test_a_keyed_node_here_whose_input_a_node_on_a_local_worker_writes_into_fails(
    store: Store,
) -> None:
    """The other way round: a node on a local worker writes into the list a cached node
    run here, beside it, is handed too. The cached node fails, and nothing is kept."""
    written = threading.Event()
    g = Graph.somatize(
        Echo().named("start").frozen()
        >> (
            _WritesFirst(written).named("writes").frozen().at("w1"),
            _SumsOnceWritten(written).named("sum").frozen().cached(),
        )
        >> Add().named("both").frozen()
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    with pytest.raises(NodeFailed, match=r"`sum`.*ran at the same time as `writes`.*changed"):
        g.forward([1, 2, 3], store=store, broker=broker)
    assert _answers(store) == []


class _GetsOnceWritten(_Signalled):
    """`n` of the dict it is handed (-1 where it holds none), once ``written`` is set."""

    def forward(self, x: dict[str, Any], ctx: Any) -> int:
        self.written.wait(10)
        return int(x.get("n", -1))


class _PopsFirst(_Signalled):
    """Takes `n` out of the dict it is handed, then sets ``written``."""

    def forward(self, x: dict[str, Any], ctx: Any) -> int:
        n = int(x.pop("n"))
        self.written.set()
        return n


def test_a_keyed_node_handed_an_input_holding_an_opaque_a_node_beside_it_writes_into_fails(
    store: Store,
) -> None:
    """The graph's input holding an Opaque tensor beside plain values, which no codec weighs
    whole once the tensor is unwrapped, handed to a node on a local worker that writes
    into it (pops from the dict) while a cached node here reads it: the cached node's
    answer, computed from the written input, was kept under the key of the input as it
    was handed in. It fails, and nothing is kept."""
    written = threading.Event()
    g = Graph.somatize(
        (
            _PopsFirst(written).named("pops").frozen().at("w1"),
            _GetsOnceWritten(written).named("gets").frozen().cached(),
        )
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    with pytest.raises(NodeFailed, match=r"`gets`.*ran at the same time as `pops`.*changed"):
        g.forward({"n": 5, "t": Opaque(torch.ones(2))}, store=store, broker=broker)
    assert _answers(store) == []


class _NegatesFirst(Node):
    """Negates the first item of the list it is handed, in place, and hands it on."""

    def forward(self, xs: list[int], ctx: Any) -> list[int]:
        xs[0] = -xs[0]
        return xs


def test_a_keyed_node_on_a_local_worker_writing_into_its_own_input_keeps_its_answer(
    store: Store,
) -> None:
    """A cached node on a local worker that writes into the list it is handed, with no node
    handed that list running beside it, answers from it as it does with no broker: what a
    node computes from an input it writes into itself is its answer to it."""
    g = Graph.somatize(
        Echo().named("start").frozen() >> _NegatesFirst().named("neg").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert g.forward([1, 2, 3], store=store, broker=broker) == [-1, 2, 3]
    assert len(_answers(store)) == 1


class _AnswersWhatItIsHanded(Node):
    """Answers the very list it is handed, and sets ``answered``."""

    def __init__(self, answered: threading.Event) -> None:
        self.answered = answered

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, xs: list[int], ctx: Any) -> list[int]:
        self.answered.set()
        return xs


class _WaitsForAnswer(Node):
    """Answers 0 once ``answered`` is set and the call that set it has had time to end."""

    def __init__(self, answered: threading.Event) -> None:
        self.answered = answered

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, x: Any, ctx: Any) -> int:
        self.answered.wait(10)
        time.sleep(0.2)
        return 0


class _WritesFirstOf(Node):
    """Writes into the first list it is handed, and answers its length."""

    def forward(self, xs: list[int], _: Any, ctx: Any) -> int:
        xs[0] = -100
        return len(xs)


class _Copies(Node):
    def forward(self, xs: list[int], ctx: Any) -> list[int]:
        return list(xs)


def test_a_keyed_answer_on_a_local_worker_that_is_its_input_written_after_it_ran_fails(
    store: Store,
) -> None:
    """A cached node on a local worker answering the very list it is handed, done and not
    taken yet when a node here is handed that list and writes into it: its answer, the
    written list, was kept under the key of the list as handed in, and recalled for it
    without the broker, where the same graph keeps the list as it was handed. It fails,
    and nothing is kept for it."""
    answered = threading.Event()
    copy = _Copies().named("copy").frozen()
    picks = _AnswersWhatItIsHanded(answered).named("picks").frozen().cached().at("w1")
    waits = _WaitsForAnswer(answered).named("waits").frozen()
    writes = _WritesFirstOf().named("writes").frozen()
    g = Graph.somatize(
        [
            copy >> picks,
            Echo().named("other").frozen() >> waits,  # hands `waits` another list
            (copy, waits) >> writes,
            (picks, writes) >> Add().named("both").frozen(),
        ]
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    with pytest.raises(NodeFailed, match=r"`picks`.*ran at the same time as `writes`.*changed"):
        g.forward([1, 2, 3], store=store, broker=broker)
    assert _answers(store) == []
    assert g.forward([1, 2, 3], store=store, outputs="picks") == [1, 2, 3]


class _AddsByMethod(Node):
    """Adds one, by a method its class may be given another of."""

    def forward(self, x: int, ctx: Any) -> int:
        return self.compute(x)

    def compute(self, x: int) -> int:
        return x + 1


_PATCHING = threading.Event()
"""Set while :class:`_PatchesAddsByMethod` is to patch."""


class _PatchesAddsByMethod(Node):
    """Gives :class:`_AddsByMethod` another `compute` as it runs (while :data:`_PATCHING`
    is set), as another thread of the process (a notebook's cell run again) would, and
    hands its input on."""

    def forward(self, x: int, ctx: Any) -> int:
        if _PATCHING.is_set():
            _AddsByMethod.compute = lambda self, x: x + 1000  # type: ignore[method-assign]
        return x


class _Twice(Node):
    def forward(self, x: int, ctx: Any) -> int:
        return 2 * x


def test_an_answer_a_worker_computed_from_a_node_whose_code_changed_is_not_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached node on a network worker handed the answer of a node here whose class was
    given another method as the forward ran: the client keeps nothing computed once the
    code moved, but the worker kept its answer, computed from the new code's, with the
    fingerprint of the old code of the node it reads, which the old code, set back,
    recalled. The worker is asked to keep nothing then, and neither keeps it."""
    written = _AddsByMethod.compute
    monkeypatch.setattr(_AddsByMethod, "compute", written)
    _PATCHING.set()
    g = Graph.somatize(
        Echo().named("start").frozen()
        >> _PatchesAddsByMethod().named("patches").frozen()
        >> _AddsByMethod().named("adds").frozen()
        >> _Twice().named("twice").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen: list[dict[str, Any]] = []
    assert g.forward(1, store=store, broker=broker, watching=seen.append) == 2002
    assert [f for f in seen if f["fact"] == "kept"] == [] and _answers(store) == []
    _PATCHING.clear()
    _AddsByMethod.compute = written  # type: ignore[method-assign]
    fresh = Graph.somatize(
        Echo().named("start").frozen()
        >> _PatchesAddsByMethod().named("patches").frozen()
        >> _AddsByMethod().named("adds").frozen()
        >> _Twice().named("twice").frozen().cached()
    )
    assert fresh.forward(1, store=store, strict=True) == 4


def test_nodes_failing_together_on_workers_are_each_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes on two workers that both failed before the forward looked (both ended
    while it waited, as on a loaded machine) are each a ``failed`` fact, and the
    NodeFailed raised for one notes the other's error: the other was said nowhere."""
    import somatize.engine as engine

    g = Graph.somatize(
        Rows().named("rows")
        >> (Fails().named("a").at("w1"), Fails().named("b").at("w2"))
        >> Add().named("sum")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local"), "w2": Worker.generic()})
    wait_for = engine.wait_for

    def both_ended(futures: Any, return_when: str = engine.ALL_COMPLETED) -> Any:
        return wait_for(futures, engine.ALL_COMPLETED)

    monkeypatch.setattr(engine, "wait_for", both_ended)
    try:
        with pytest.raises(NodeFailed, match=r"`[ab]` \(Fails\) raised ZeroDivisionError") as e:
            g.forward({"at": 0, "take": 2}, broker=broker)
    finally:
        broker.close()
    assert g.record is not None
    failed = sorted(f["node"] for f in g.record.facts if f["fact"] == "failed")
    assert failed == ["a", "b"]
    if sys.version_info >= (3, 11):  # where exceptions take notes
        other = "b" if e.value.node == "a" else "a"
        said = f"`{other}` (Fails) raised ZeroDivisionError"
        assert any(said in note for note in e.value.__notes__)


class _SumsEachOnceWritten(Node):
    """Sums each list item it is handed, mapped, once ``written`` is set (another branch
    wrote into an item)."""

    def __init__(self, written: threading.Event) -> None:
        self.written = written

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, items: list[list[int]], ctx: Any) -> list[int]:
        self.written.wait(10)
        return [sum(item) for item in items]


class _WritesIntoFirstItem(Node):
    """Writes into the first item of the list it is handed, then sets ``written``."""

    def __init__(self, written: threading.Event) -> None:
        self.written = written

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, xs: list[list[int]], ctx: Any) -> int:
        xs[0][0] = -100
        self.written.set()
        return len(xs)


@pytest.mark.parametrize("where", ["here", "w1"])
def test_a_keyed_mapped_node_whose_input_a_node_on_a_local_worker_writes_into_fails(
    store: Store, where: str
) -> None:
    """A cached mapped node, run here or on a local worker, handed the very list a node on
    another local worker is handed too, which writes into one of its items while the
    mapped node's items run: the item answer computed from the written item was kept under
    the key of the item as handed in, and recalled for it without the broker. The mapped
    node fails, as a node that is not mapped does, and none of its items is kept."""
    written = threading.Event()
    sums = _SumsEachOnceWritten(written).named("sums").frozen().cached().mapped()
    g = Graph.somatize(
        Echo().named("start").frozen()
        >> (
            _WritesIntoFirstItem(written).named("writes").frozen().at("w2"),
            sums.at(where) if where != "here" else sums,
        )
        >> Add().named("both").frozen()
    )
    broker = Broker.embedded(
        {"w1": Worker.generic(mode="local"), "w2": Worker.generic(mode="local")}
    )
    seen: list[dict[str, Any]] = []
    with pytest.raises(NodeFailed, match=r"`sums`.*ran at the same time as `writes`.*changed"):
        g.forward([[1], [2], [3]], store=store, broker=broker, watching=seen.append)
    assert _answers(store) == [] and not [f for f in seen if f["fact"] == "kept"]
    assert {"fact": "failed", "node": "sums", "error": "ValueError"} in seen
    assert g.forward([[1], [2], [3]], store=store, outputs="sums") == [1, 2, 3]
