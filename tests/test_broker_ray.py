"""The Ray broker on a real Ray cluster started here, on 127.0.0.1: same answers, crossings,
keys equal across processes, a shared store (a directory, a bucket on loopback, signed
stores), dead and slow workers, concurrency."""

from __future__ import annotations

import copy
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from somatize import CodecError, Graph, NodeFailed, Opaque, Store, StoreError, Unbuildable
from somatize.broker import (
    BadWorker,
    Broker,
    FailedOnWorker,
    OtherCluster,
    StateMismatch,
    UnreadableCrossing,
    Worker,
    WorkerLost,
    WorkerTimeout,
)
from somatize.keys import root_key
from somatize_torch import ModuleNode, freeze
from tests.broker_nodes import (
    AnswersUnloaded,
    ChangesItsCode,
    Encoder,
    Exits,
    ExitsWhenBuilt,
    Gained,
    Hidden,
    Length,
    MakesBlob,
    Meet,
    Nap,
    Products,
    RaisesBase,
    RaisesOwn,
    RaisesUnprintable,
    RaisesWhenBuilt,
    Ramp,
    Seeded,
    SlowToBuild,
    Stepper,
    StoreSeen,
    Where,
    napping,
    weighted,
)
from tests.nodes import Add, Echo, Fails, Largest, Rows, Scale, Square

ray = pytest.importorskip("ray", reason="the Ray broker needs ray: pip install 'somatize[ray]'")

SLOT = {"slot": 1.0}
"""Each test worker asks for one of the cluster's custom `slot` resources and no CPU, so
workers are placed by resources and never wait for a CPU on a two-core machine."""


def _worker() -> Worker:
    return Worker.generic(mode="network", num_cpus=0, resources=SLOT)


@pytest.fixture(scope="module")
def broker(cluster: None) -> Iterator[Any]:
    """A Ray broker with two workers, shared by the tests (their actors stay loaded, as
    they would between forwards), stopped at the end."""
    made = Broker.ray(workers={"w1": _worker(), "w2": _worker()})
    try:
        yield made
    finally:
        made.close()


def test_the_seed_graph_on_ray(broker: Any) -> None:
    """The seed's graph on a Ray worker answers as without a broker, with crossed bytes."""
    g = Graph.somatize(
        Rows().named("sms") >> Scale(3.0).named("clean").at("w1") >> Largest().named("widest")
    )
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 32}, broker=broker, watching=seen.append) == g.forward(
        {"at": 0, "take": 32}
    )
    crossed = {(f.get("from"), f["node"]): f["bytes"] for f in seen if f["fact"] == "crossed"}
    assert set(crossed) == {("sms", "clean"), ("clean", "widest")}
    assert all(size > 0 for size in crossed.values())


def test_a_ray_worker_runs_its_node_under_the_caller_s_autocast(broker: Any) -> None:
    """A node on a Ray actor runs under the autocast of the thread that called the forward,
    as it runs in its grad mode: under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a
    plain node's product there was computed in float32, where with no broker it is
    computed in bfloat16."""
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    g = Graph.somatize(Echo().named("s") >> Products().named("p").at("w1"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        here = g.forward(x)
        there = g.forward(x, broker=broker)
    assert here.dtype == there.dtype == torch.bfloat16 and torch.equal(there, here)
    assert g.forward(x, broker=broker).dtype == torch.float32


def test_a_plain_node_on_a_ray_worker_is_keyed_in_the_precision_the_graph_is_called_in(
    broker: Any, store: Store
) -> None:
    """A cached plain node on a Ray actor called under bf16 autocast is kept under the key
    the client names for that call, which the actor works out too, and never recalled for
    a float32 call; with another default dtype where the graph is called, a setting of
    the client's process that the actor's does not share, the actor enters it for the job
    (it computes one job at a time) rather than compute there in float32 what is kept under
    a key naming float64, or refuse."""
    x = Opaque(torch.randn(4, 3))
    g = Graph.somatize(Products().named("p").frozen().cached().at("w1"))
    seen: list[dict[str, Any]] = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        there = g.forward(x, store=store, broker=broker, watching=seen.append)
        key = _kept_keys(seen)["p"]
        assert broker.key_on("w1", g, "p", [root_key(x)]) == key
        assert torch.equal(g.forward(x, store=store), there)
    assert there.dtype == torch.bfloat16
    assert broker.key_on("w1", g, "p", [root_key(x)]) != key
    assert g.forward(x, store=store, broker=broker).dtype == torch.float32
    assert g.record is not None and g.record.outcome == {"p": "ran"}
    made = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        wide = Opaque(torch.randn(4, 3))  # float64, as the actor makes them now
        assert torch.equal(g.forward(wide, store=store, broker=broker), wide.value @ wide.value.T)
        assert g.record is not None and g.record.outcome == {"p": "ran"}
        assert broker.key_on("w1", g, "p", [root_key(wide)]) == _kept_keys(g.record.facts)["p"]
    finally:
        torch.set_default_dtype(made)


def test_a_ray_worker_is_another_process_that_keeps_its_node(broker: Any) -> None:
    """The node runs in the actor's process, told its worker, and is built there once."""
    g = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w2"))
    pid, worker, _ = g.forward({"at": 0, "take": 2}, broker=broker)
    assert pid != os.getpid() and worker == "w2"
    assert g.forward({"at": 0, "take": 2}, broker=broker)[0] == pid


def _kept_keys(seen: list[dict[str, Any]]) -> dict[str, str]:
    """The key of each node a forward kept an answer of, by name, from its facts."""
    return {f["node"]: f["key"] for f in seen if f["fact"] == "kept"}


def _scaled_on_w1(store: Store) -> tuple[Graph, dict[str, str]]:
    """A graph scaling rows on worker ``w1``, run here once, and the keys it kept."""
    g = Graph.somatize(
        Rows().named("rows").frozen().cached()
        >> Scale(2.0).named("scale").frozen().cached().at("w1")
    )
    seen: list[dict[str, Any]] = []
    g.forward({"at": 0, "take": 2}, store=store, watching=seen.append)
    return g, _kept_keys(seen)


def _killed(actor: Any) -> None:
    """Kills ``actor`` and returns once a call of it fails as one of a dead actor does:
    ``ray.kill`` only asks, and a call made before the kill lands is still answered."""
    ray.kill(actor)
    for _ in range(1200):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    pytest.fail(f"{actor} still answered 1,200 calls after it was killed")


def test_keys_are_equal_on_the_client_and_on_a_worker(broker: Any, store: Store) -> None:
    """The key a worker computes from the node it rebuilt equals the client's, a frozen
    torch module's included."""
    x = {"at": 4, "take": 3}
    g = Graph.somatize(
        Rows().named("rows").frozen().cached()
        >> Scale(1.5).named("scale").frozen().cached("s").at("w1")
    )
    seen: list[dict[str, Any]] = []
    g.forward(x, store=store, broker=broker, watching=seen.append)
    keys = _kept_keys(seen)
    assert keys["rows"] != keys["scale"]
    assert broker.key_on("w1", g, "scale", [keys["rows"]]) == keys["scale"]
    assert broker.key_on("w2", g, "scale", [keys["rows"]]) == keys["scale"]
    assert root_key(x) != keys["rows"]
    # A frozen torch module: rebuilt from its class and loaded with the weights sent there,
    # whose digest the worker works out itself.
    encoded, _ = _encoder_graph()
    seen.clear()
    encoded.forward(x, store=store, broker=broker, watching=seen.append)
    keys = _kept_keys(seen)
    assert keys["enc"] != keys["rows"]
    assert broker.key_on("w1", encoded, "enc", [keys["rows"]]) == keys["enc"]
    assert broker.key_on("w2", encoded, "enc", [keys["rows"]]) == keys["enc"]


def test_the_keys_of_a_mapped_node_on_a_worker_are_the_client_s(broker: Any, store: Store) -> None:
    """The key a worker computes for an item of a mapped node is the one the client kept
    that item under: it was the key of the node handed the item whole, which no client
    computes."""
    from somatize.keys import item_key

    x = {"at": 0, "take": 3}
    g = Graph.somatize(
        Rows().named("rows").frozen().cached()
        >> Square().named("sq").frozen().cached().mapped().at("w1")
    )
    seen: list[dict[str, Any]] = []
    assert g.forward(x, store=store, broker=broker, watching=seen.append) == [0, 1, 4]
    (rows,) = [f["key"] for f in seen if f["fact"] == "kept" and f["node"] == "rows"]
    for index in range(3):
        key = broker.key_on("w1", g, "sq", [item_key(rows, index)])
        assert store.have([key]) == {key}


def test_items_a_worker_computed_while_its_code_was_changed_are_not_kept(
    cluster: None, store: Store
) -> None:
    """A mapped node whose class is given other code on its Ray worker as its items run
    there computes them with the new code, after the job was checked against the old
    code's fingerprint: the client keeps none of them under the old code's keys, where the
    old code would recall them."""
    from somatize.keys import item_key

    x = {"at": 0, "take": 3}
    g = Graph.somatize(
        Rows().named("rows").frozen().cached()
        >> ChangesItsCode().named("changes").frozen().cached().mapped().at("w1")
    )
    seen: list[dict[str, Any]] = []
    # A broker of its own: the class its worker holds keeps the other code.
    with Broker.ray(workers={"w1": _worker()}) as broker:
        assert g.forward(x, store=store, broker=broker, watching=seen.append) == [1000, 1001, 1002]
        (rows,) = [f["key"] for f in seen if f["fact"] == "kept" and f["node"] == "rows"]
        keys = [broker.key_on("w1", g, "changes", [item_key(rows, i)]) for i in range(3)]
    assert [f for f in seen if f["fact"] == "kept" and f["node"] == "changes"] == []
    assert store.have(keys) == set()


def test_a_key_asked_with_what_names_no_key_is_refused_before_anything_is_sent(
    broker: Any,
) -> None:
    """``key_on`` given a worker the broker does not have, a node the graph does not have or
    that is placed on no network worker, or inputs that are not one key per input the node
    reads, says so, naming what it got and what it takes — it was a bare KeyError, or a key
    worked out from the characters of a key given alone, or from too many keys, that no
    client computes."""
    from somatize.broker import UnknownWorker
    from somatize.graph import UnknownNode

    g = Graph.somatize(Rows().named("rows") >> Scale(2.0).named("scale").frozen().at("w1"))
    rows = root_key({"at": 0, "take": 2})
    with pytest.raises(UnknownWorker, match=r"this broker has no worker `w9`; it has `w1`, `w2`"):
        broker.key_on("w9", g, "scale", [rows])
    with pytest.raises(UnknownNode, match=r"no node named `nowhere`"):
        broker.key_on("w1", g, "nowhere", [rows])
    with pytest.raises(ValueError, match=r"`rows` is placed on no network worker"):
        broker.key_on("w1", g, "rows", [rows])
    for inputs, wrong in ((rows, TypeError), ([1], TypeError), ([rows, rows], ValueError),
                          ([], ValueError)):  # fmt: skip
        with pytest.raises(wrong, match=r"`scale` reads 1 input.*a list of 1 key \(str\)"):
            broker.key_on("w1", g, "scale", inputs)
    assert broker.key_on("w1", g, "scale", [rows]).startswith("blake3:")


def test_the_actor_of_a_worker_the_broker_lacks_is_refused_naming_those_it_has(
    broker: Any,
) -> None:
    """``actor`` asked for a worker the broker does not have says so, naming the workers it
    has, as ``key_on`` does — it was a bare KeyError — and starts no actor."""
    from somatize.broker import UnknownWorker

    with pytest.raises(UnknownWorker, match=r"no worker `w9`; it has `w1`, `w2`.*for its actor"):
        broker.actor("w9")
    assert "w9" not in broker._actors


def test_a_list_changed_after_build_reaches_the_ray_worker(broker: Any, store: Store) -> None:
    """A node built with a list, on a Ray worker, runs there with the list as it is now, and
    its answer is kept under the key of the new list."""
    weights = [2.0]
    g = weighted(weights, "w1")
    x = {"at": 0, "take": 4}
    assert g.forward(x, store=store, broker=broker) == 6.0
    weights[0] = 3.0
    assert g.forward(x, store=store, broker=broker) == 9.0
    assert g.forward(x, broker=broker) == 9.0
    assert weighted([3.0]).forward(x, store=store) == 9.0


def _encoder_graph() -> tuple[Graph, ModuleNode]:
    """A cached source here feeding a cached frozen encoder, built rebuildably, on `w1`."""
    enc = ModuleNode.build(Encoder, 4)
    with torch.no_grad():
        enc.module.norm.running_var.fill_(4.0)
    g = Graph.somatize(
        Ramp(4).named("rows").frozen().cached() >> enc.named("enc").frozen().cached("s").at("w1")
    )
    freeze(g)
    return g, enc


def _state_crossings(facts: list[dict[str, Any]]) -> list[int]:
    """The bytes of every state that crossed to a worker, in order."""
    return [f["bytes"] for f in facts if f["fact"] == "crossed" and f["way"] == "state"]


def test_a_copy_that_changes_itself_on_a_ray_worker_is_built_again(
    broker: Any, store: Store
) -> None:
    """A node that advances an argument it keeps (``self.step += 1``) on an actor answers
    each job as the node its key names, the copy that stepped built again: the actor went
    on with it, and kept its answer under the key of the node that had not stepped."""

    def graph(placed: bool) -> Graph:
        node = Stepper().named("n").frozen().cached()
        return Graph.somatize(Echo().named("s").frozen() >> (node.at("w1") if placed else node))

    g = graph(placed=True)
    assert g.forward(10.0, broker=broker) == 11.0
    assert g.forward(10.0, broker=broker, store=store) == 11.0
    assert graph(placed=False).forward(10.0, store=store) == 11.0 == graph(False).forward(10.0)


def test_a_module_that_sets_what_it_keeps_on_a_ray_worker_keeps_nothing(
    broker: Any, store: Store
) -> None:
    """A frozen, cached module whose forward sets a value it keeps (a gain taken from the
    first batch it sees) keeps nothing on an actor, as in this process, and each job
    answers as the module at the frozen state: the actor kept the answer of the copy that
    had set its gain under the key of the module that had not, and recalled it after."""

    def graph() -> Graph:
        torch.manual_seed(0)
        enc = ModuleNode.build(Gained, 3).named("enc").frozen().cached().at("w1")
        g = Graph.somatize(Ramp(3).named("rows").frozen() >> enc)
        freeze(g)
        return g

    g = graph()
    x, y = {"at": 0, "take": 2}, {"at": 4, "take": 3}
    for span in (x, y, y):
        seen: list[dict[str, Any]] = []
        out = g.forward(span, store=store, broker=broker, watching=seen.append)
        assert torch.equal(out, copy.deepcopy(graph()).forward(span))  # a fresh module's
        assert [f["fact"] for f in seen if f.get("node") == "enc" and f["fact"] != "crossed"] == [
            "ran"
        ]


def test_a_frozen_module_on_a_ray_worker(broker: Any, store: Store) -> None:
    """A frozen encoder on a Ray actor answers as without a broker, kept by the actor; its
    weights cross on the first forward only."""
    g, enc = _encoder_graph()
    x = {"at": 0, "take": 5}
    seen: list[dict[str, Any]] = []
    assert torch.equal(g.forward(x, store=store, broker=broker, watching=seen.append), g.forward(x))
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    assert [f["by"] for f in seen if f["fact"] == "kept" and f["node"] == "enc"] == ["w1"]
    again: list[dict[str, Any]] = []
    y = {"at": 5, "take": 3}
    assert torch.equal(
        g.forward(y, store=store, broker=broker, watching=again.append), g.forward(y)
    )
    assert _state_crossings(again) == []
    assert [f["fact"] for f in again].count("ran") == 2


def test_a_ray_worker_answers_an_inference_tensor_under_inference_mode(broker: Any) -> None:
    """Under ``torch.inference_mode()``, a frozen encoder on a Ray actor answers an
    inference tensor, as it does run here: its answer was decoded out of the caller's
    inference mode, on the thread that waited for the actor, and came back a plain tensor."""
    g, _ = _encoder_graph()
    with torch.inference_mode():
        out, here = g.forward({"at": 0, "take": 5}, broker=broker), g.forward({"at": 0, "take": 5})
    assert here.is_inference() and out.is_inference() and torch.equal(out, here)


def test_a_refrozen_module_on_a_ray_worker(broker: Any, store: Store) -> None:
    """Weights changed and frozen again reach the actor, which answers as the changed module
    does here, under the new key the client computes."""
    g, enc = _encoder_graph()
    x = {"at": 0, "take": 5}
    before = g.forward(x, store=store, broker=broker)
    with torch.no_grad():
        enc.module.linear.weight.mul_(-1.0)
    freeze(g)
    seen: list[dict[str, Any]] = []
    after = g.forward(x, store=store, broker=broker, watching=seen.append)
    assert torch.equal(after, g.forward(x)) and not torch.equal(after, before)
    assert _state_crossings(seen) == [len(enc.state_bytes())]
    keys = _kept_keys(seen)
    assert set(keys) == {"enc"}
    rows = [f["key"] for f in seen if f["fact"] == "recalled" and f["node"] == "rows"]
    assert broker.key_on("w1", g, "enc", rows) == keys["enc"]


def test_a_module_whose_state_does_not_match_is_refused_on_ray(broker: Any) -> None:
    """Weights changed after freezing where the node cannot see it (into ``.data``) are
    refused by the actor that loads them."""
    g, enc = _encoder_graph()
    with torch.no_grad():
        enc.module.linear.bias.data.add_(1.0)
    with pytest.raises(StateMismatch, match=r"`enc` on worker `w1` was sent state whose digest"):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_module_instance_is_refused_on_ray_before_anything_runs(broker: Any) -> None:
    """A ModuleNode holding a module instance is refused, saying to use `ModuleNode.build`."""
    rows = Ramp(4)
    g = Graph.somatize(rows.named("rows") >> ModuleNode(Encoder(4)).named("enc").frozen().at("w1"))
    freeze(g)
    with pytest.raises(Unbuildable, match=r"`enc` cannot be sent.*ModuleNode\.build\(Encoder"):
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert rows.calls == 0


def _numbers_in(store: Store, rows: int) -> str:
    """``rows`` numbers written as Parquet and bound to `numbers` in ``store``."""
    import pyarrow
    import pyarrow.parquet

    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(pyarrow.table({"n": list(range(rows))}), sink)
    digest = store.put(sink.getvalue().to_pybytes())
    store.bind("numbers", digest)
    return digest


def _dataset_graph(store: Store) -> Graph:
    """A Parquet source over `numbers`, cached and settled on `w1`, counted here."""
    from somatize.data import Parquet, settle

    g = Graph.somatize(
        Parquet(store, "numbers").named("data").frozen().cached().at("w1")
        >> Length().named("count")
    )
    settle(g)
    return g


def test_a_parquet_source_on_a_ray_worker(broker: Any, store: Store) -> None:
    """A dataset source crosses to an actor by reference (its store's address, its name, and
    its version, never rows): the actor reads the rows, answers as here and keeps them,
    under the key the client computes."""
    _numbers_in(store, 100)
    g = _dataset_graph(store)
    x = {"at": 90, "take": 64}
    seen: list[dict[str, Any]] = []
    assert g.forward(x, store=store, broker=broker, watching=seen.append) == g.forward(x) == 10
    assert _state_crossings(seen) == [len(g.memory.state_of("data") or "")]
    kept = [f for f in seen if f["fact"] == "kept"]
    assert [(f["node"], f["by"]) for f in kept] == [("data", "w1")]
    assert broker.key_on("w1", g, "data", [root_key(x)]) == kept[0]["key"]
    seen.clear()
    assert g.forward({"at": 0, "take": 5}, store=store, broker=broker, watching=seen.append) == 5
    assert _state_crossings(seen) == []


def test_a_rebound_dataset_name_is_refused_on_ray(broker: Any, store: Store) -> None:
    """A name bound to other bytes after the source was built is refused by the actor, which
    resolves it anew; nothing runs there and nothing is kept."""
    _numbers_in(store, 100)
    g = _dataset_graph(store)
    _numbers_in(store, 30)
    seen: list[dict[str, Any]] = []
    with pytest.raises(StateMismatch, match=r"`data` on worker `w1`: `numbers` is bound to "
                       r"blake3:\w+ in Store\(.*\), and .*rebound"):  # fmt: skip
        g.forward({"at": 0, "take": 64}, store=store, broker=broker, watching=seen.append)
    assert not [f for f in seen if f["fact"] in ("ran", "kept")]


def test_a_worker_keeps_into_the_shared_store_and_any_client_recalls(
    broker: Any, tmp_path: Path
) -> None:
    """A cached node run on a worker is kept by that worker; a second client, with a graph
    built afresh and no broker, recalls it without running anything."""
    where = tmp_path / "shared"

    def build() -> tuple[Graph, Rows]:
        rows = Rows()
        return Graph.somatize(
            rows.named("rows").frozen() >> Scale(2.0).named("scale").frozen().cached().at("w1")
        ), rows

    g, _ = build()
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 3}, store=Store(where), broker=broker, watching=seen.append)
    (kept,) = [f for f in seen if f["fact"] == "kept"]
    assert kept["by"] == "w1" and kept["bytes"] > 0
    other, rows = build()
    facts: list[dict[str, Any]] = []
    assert other.forward({"at": 0, "take": 3}, store=Store(where), watching=facts.append) == [
        0.0, 2.0, 4.0
    ]  # fmt: skip
    assert rows.calls == 0
    assert [f["fact"] for f in facts] == ["spared", "recalled", "finished"]


def _scaled() -> tuple[Graph, Rows]:
    """A source here feeding a cached `scale` on `w1`, built afresh."""
    rows = Rows()
    return Graph.somatize(
        rows.named("rows").frozen() >> Scale(2.0).named("scale").frozen().cached().at("w1")
    ), rows


def test_a_worker_keeps_into_a_bucket_and_a_fresh_client_recalls(
    broker: Any, tmp_path: Path
) -> None:
    """With a bucket store (S3 on loopback) an actor opens the bucket from its address — not
    the client's cache — and keeps there; a fresh client store over the bucket recalls it."""
    from tests.conftest_s3 import s3_options, s3_url

    url = s3_url()
    g, _ = _scaled()
    seen: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    client = Store.on_bucket(url, cache=tmp_path / "cache", **s3_options())
    assert g.forward(x, store=client, broker=broker, watching=seen.append) == [0.0, 2.0, 4.0]
    (kept,) = [f for f in seen if f["fact"] == "kept"]
    assert kept["by"] == "w1" and kept["bytes"] > 0
    other, rows = _scaled()
    facts: list[dict[str, Any]] = []
    fresh = Store.on_bucket(url, **s3_options())
    assert other.forward(x, store=fresh, broker=broker, watching=facts.append) == [0.0, 2.0, 4.0]
    assert [f["fact"] for f in facts] == ["spared", "recalled", "finished"]
    assert rows.calls == 0


@pytest.mark.parametrize("home", ["directory", "bucket"])
def test_a_store_opened_read_only_is_read_only_on_the_actors(
    broker: Any, tmp_path: Path, home: str
) -> None:
    """An actor opens a store opened ``read_only=True`` read-only from its address. Over it a
    forward whose answers are all held is served, nothing run; one with an answer missing is
    refused with the read-only message before anything runs, as with no broker."""
    from tests.conftest_s3 import writer_and_reader

    writer, reader = writer_and_reader(home, tmp_path / "store")
    seen_there = Graph.somatize(Rows().named("rows") >> StoreSeen().named("seen").at("w1"))
    x = {"at": 0, "take": 3}
    assert seen_there.forward(x, store=writer, broker=broker) == [False, True]
    assert seen_there.forward(x, store=reader, broker=broker) == [True, False]
    g, rows = _scaled()
    assert g.forward(x, store=writer) == [0.0, 2.0, 4.0]
    g, rows = _scaled()
    facts: list[dict[str, Any]] = []
    assert g.forward(x, store=reader, broker=broker, watching=facts.append) == [0.0, 2.0, 4.0]
    assert [f["fact"] for f in facts] == ["spared", "recalled", "finished"]
    facts.clear()
    with pytest.raises(StoreError, match=r"opened with read_only=True.*can still be read"):
        g.forward({"at": 5, "take": 3}, store=reader, broker=broker, watching=facts.append)
    assert facts == []
    assert rows.calls == 0


def test_an_actor_without_the_signing_key_leaves_the_keeping_to_the_client(
    broker: Any, tmp_path: Path
) -> None:
    """A signed local store whose key the actors lack: the actor keeps nothing (a record it
    wrote unsigned would be refused), the client keeps a signed one, and the next forward
    from a fresh signed store recalls it."""
    from somatize.store import LocalStore

    g, _ = _scaled()
    seen: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    signed = LocalStore(tmp_path / "store", signing_key="known-to-the-client-alone")
    assert g.forward(x, store=signed, broker=broker, watching=seen.append) == [0.0, 2.0, 4.0]
    (kept,) = [f for f in seen if f["fact"] == "kept"]
    assert "by" not in kept
    other, rows = _scaled()
    facts: list[dict[str, Any]] = []
    fresh = LocalStore(tmp_path / "store", signing_key="known-to-the-client-alone")
    assert other.forward(x, store=fresh, broker=broker, watching=facts.append) == [0.0, 2.0, 4.0]
    assert [f["fact"] for f in facts] == ["spared", "recalled", "finished"]
    assert rows.calls == 0


def test_an_actor_with_the_signing_key_keeps_signed(cluster: None, tmp_path: Path) -> None:
    """Actors given the store's key in their own environment keep into the signed store;
    its record is signed with that key."""
    from somatize.store import LocalStore

    secret = "given-to-the-actors"
    g, _ = _scaled()
    seen: list[dict[str, Any]] = []
    x = {"at": 0, "take": 3}
    signed = LocalStore(tmp_path / "store", signing_key=secret)
    env = {"env_vars": {"SOMATIZE_STORE_KEY": secret}}
    with Broker.ray(workers={"w1": _worker()}, runtime_env=env) as keyed:
        assert g.forward(x, store=signed, broker=keyed, watching=seen.append) == [0.0, 2.0, 4.0]
    (kept,) = [f for f in seen if f["fact"] == "kept"]
    assert kept["by"] == "w1"
    assert LocalStore(tmp_path / "store", signing_key=secret).have([kept["key"]]) == {kept["key"]}
    assert LocalStore(tmp_path / "store", signing_key="other").have([kept["key"]]) == set()


def test_a_worker_killed_mid_forward(broker: Any, store: Store, tmp_path: Path) -> None:
    """Killing the worker during a slow node is a clear error naming node and worker, the
    store holds nothing of it, and the broker runs the next forward."""
    marker = tmp_path / "started"
    g = Graph.somatize(
        Rows().named("rows").frozen()
        >> Nap(30.0, marker=str(marker)).named("slow").frozen().cached().at("w1")
    )
    killer = _kill_when(marker, broker, "w1")
    with pytest.raises(WorkerLost, match=r"`slow` was running on worker `w1` when the worker died"):
        g.forward({"at": 0, "take": 2}, store=store, broker=broker)
    killer.join()
    assert not list((store.root / "answers").rglob("*"))  # type: ignore[attr-defined]
    ok = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    assert ok.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_an_interrupted_forward_stops_the_node_it_ran_on_a_ray_worker(
    broker: Any,
    store: Store,
    tmp_path: Path,
    interrupt_when: Callable[[Path], threading.Thread],
) -> None:
    """Ctrl-C while a node runs on an actor stops that actor, as a timeout does: the node
    does not go on running on the cluster, nothing is kept for it, and the next call —
    which would otherwise wait behind it, as would this process's exit — starts the worker
    afresh at once."""
    where = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w1"))
    before = where.forward({"at": 0, "take": 1}, broker=broker)[0]
    marker = tmp_path / "started"
    g = Graph.somatize(
        Rows().named("rows").frozen()
        >> Nap(20.0, marker=str(marker)).named("slow").frozen().cached().at("w1")
    )
    interrupter = interrupt_when(marker)
    with pytest.raises(KeyboardInterrupt):
        g.forward({"at": 0, "take": 2}, store=store, broker=broker)
    interrupter.join()
    assert g.record.outcome["slow"] == "failed"
    after = where.forward({"at": 0, "take": 1}, broker=broker)[0]
    assert after != before  # a fresh actor, not the one still napping
    assert not list((store.root / "answers").rglob("*"))  # type: ignore[attr-defined]


def test_ctrl_c_landing_as_submit_returns_still_stops_the_node_on_ray(
    cluster: None, tmp_path: Path
) -> None:
    """A Ctrl-C landing as the forward returns from ``broker.submit``, before it holds the
    call, still stops the actor that runs the node, as on an embedded worker: the next
    call starts the worker afresh at once, rather than wait behind the node."""
    from somatize.broker.ray import RayBroker
    from tests.broker_nodes import returning_interrupted

    marker = tmp_path / "started"
    Returning = returning_interrupted(RayBroker, "slow", marker)

    with Returning(None, {"w1": _worker()}) as broker:
        where = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w1"))
        before = where.forward({"at": 0, "take": 1}, broker=broker)[0]
        g = Graph.somatize(
            Rows().named("rows") >> Nap(60.0, marker=str(marker)).named("slow").at("w1")
        )
        with pytest.raises(KeyboardInterrupt):
            g.forward({"at": 0, "take": 2}, broker=broker)
        out: dict[str, Any] = {}
        thread = threading.Thread(
            target=lambda: out.update(pid=where.forward({"at": 0, "take": 1}, broker=broker)[0]),
            daemon=True,
        )
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), (
            "the next call waits behind the node of the interrupted forward"
        )
        assert out["pid"] != before  # a fresh actor, not the one still napping


def test_an_error_of_somatize_s_own_a_node_raises_on_ray_comes_back_as_itself(
    broker: Any,
) -> None:
    """An error of somatize's own classes that a node's code raises on an actor (a nested
    forward's NodeFailed, a store's StoreError) is raised here as that class, with its
    message and plain attributes, and said ``failed`` alike — as with no broker or an
    embedded one — not as FailedOnWorker."""
    embedded = Broker.embedded({"w2": Worker.generic(mode="network")})
    for kind in ("failed", "store"):
        g = Graph.somatize(Rows().named("rows") >> RaisesOwn(kind).named("own").at("w2"))
        raised: dict[str, BaseException] = {}
        said: dict[str, list[dict[str, Any]]] = {}
        for where, using in (("here", None), ("embedded", embedded), ("ray", broker)):
            seen: list[dict[str, Any]] = []
            with pytest.raises(Exception) as caught:
                g.forward({"at": 0, "take": 2}, broker=using, watching=seen.append)
            raised[where] = caught.value
            said[where] = [f for f in seen if f["fact"] == "failed"]
        for where in ("embedded", "ray"):
            assert type(raised[where]) is type(raised["here"]), (where, raised[where])
            assert str(raised[where]) == str(raised["here"])
            assert said[where] == said["here"]
        assert getattr(raised["ray"], "node", None) == getattr(raised["here"], "node", None)


def test_an_error_of_somatize_s_own_holding_more_than_plain_values_is_named_on_ray(
    broker: Any,
) -> None:
    """An error of somatize's own class that holds what cannot cross as plain fields (a
    nested forward's WatcherFailed, holding that forward's answer as ``value``) is not
    raised here as that class without it: it is FailedOnWorker, naming it."""
    g = Graph.somatize(Rows().named("rows") >> RaisesOwn("watcher").named("own").at("w2"))
    with pytest.raises(FailedOnWorker, match=r"`own` \(RaisesOwn\) raised WatcherFailed") as caught:
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert caught.value.raised_there == "WatcherFailed"


def test_a_runtime_env_ray_refuses_is_the_worker_s_error_not_the_node_s(
    cluster: None, tmp_path: Path
) -> None:
    """A worker Ray will not start with the runtime_env it was given (a working_dir that
    does not exist) is BadWorker naming the worker and what Ray said, said ``refused`` —
    not the node, which never ran, raising Ray's ValueError."""
    broker = Broker.ray(
        workers={"w1": _worker()}, runtime_env={"working_dir": str(tmp_path / "missing")}
    )
    g = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    seen: list[dict[str, Any]] = []
    try:
        with pytest.raises(BadWorker, match=r"worker `w1` could not be started on the Ray "
                           r"cluster: .*missing.*runtime_env="):  # fmt: skip
            g.forward({"at": 0, "take": 2}, broker=broker, watching=seen.append)
    finally:
        broker.close()
    assert [f for f in seen if f["fact"] == "failed"] == [
        {"fact": "failed", "node": "scale", "error": "refused"}
    ]


def test_a_worker_of_another_somatize_version_is_refused_before_its_node_runs(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor that imported another version of somatize than the client is BadWorker,
    naming both versions, and stopped, before the node is sent: it read the jobs the client
    wrote with other code, and the node was said to raise what that code raised there (an
    AttributeError of a job's field). The same worker with the same version answers."""
    import somatize

    g = Graph.somatize(Rows().named("rows") >> Scale(2.0).named("scale").at("w1"))
    real = somatize.__version__
    with Broker.ray(workers={"w1": _worker()}) as broker:
        monkeypatch.setattr(somatize, "__version__", "0.0.0-other")
        with pytest.raises(BadWorker, match=rf"worker `w1` runs somatize {re.escape(real)}, "
                           r"and this process 0\.0\.0-other: .*`scale` did not run"):  # fmt: skip
            g.forward({"at": 0, "take": 2}, broker=broker)
        monkeypatch.undo()
        assert g.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_a_worker_running_edited_somatize_of_the_same_version_is_refused(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor that imported somatize of the client's version from other source files (here
    the client's are said to be edited) is BadWorker, saying so, before the node is sent:
    its version alone matched, and it would have read the client's jobs with other code.
    The same worker on the same files answers."""
    import somatize
    from somatize.broker import ray as ray_broker

    g = Graph.somatize(Rows().named("rows") >> Scale(2.0).named("scale").at("w1"))
    with Broker.ray(workers={"w1": _worker()}) as broker:
        monkeypatch.setattr(ray_broker, "_source", lambda: "blake3:" + "0" * 64)
        version = re.escape(somatize.__version__)
        with pytest.raises(BadWorker, match=rf"worker `w1` runs somatize {version} as this "
                           r"process does, from other source files .*here blake3:0{64}: one of "
                           r"them was edited.*`scale` did not run"):  # fmt: skip
            g.forward({"at": 0, "take": 2}, broker=broker)
        monkeypatch.undo()
        assert g.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_a_key_asked_of_a_worker_of_another_somatize_version_is_refused(
    cluster: None, monkeypatch: pytest.MonkeyPatch, store: Store
) -> None:
    """``key_on`` asks a worker its version before its key, as a call of a node does: one
    running another somatize is BadWorker and stopped, not asked for a key worked out by
    other code. The same worker with the same version answers the client's key."""
    import somatize

    g, keys = _scaled_on_w1(store)
    with Broker.ray(workers={"w1": _worker()}) as broker:
        monkeypatch.setattr(somatize, "__version__", "0.0.0-other")
        with pytest.raises(BadWorker, match=r"worker `w1` runs somatize .*0\.0\.0-other"):
            broker.key_on("w1", g, "scale", [keys["rows"]])
        monkeypatch.undo()
        assert broker.key_on("w1", g, "scale", [keys["rows"]]) == keys["scale"]


def test_a_key_asked_of_a_worker_that_dies_is_worker_lost(cluster: None, store: Store) -> None:
    """``key_on`` fails as a call of a node does when its worker dies: WorkerLost, naming
    node and worker — never Ray's ActorDiedError — whether the worker was dead when it was
    asked or died working the key out (building the node); the next call starts the worker
    afresh, and with ``retries=`` the same call does."""
    g, keys = _scaled_on_w1(store)
    rows = [keys["rows"]]
    dies = Graph.somatize(
        Rows().named("rows").frozen()
        >> ExitsWhenBuilt(os.getpid()).named("dies").frozen().cached().at("w1")
    )
    with Broker.ray(workers={"w1": _worker()}) as broker:
        assert broker.key_on("w1", g, "scale", rows) == keys["scale"]
        _killed(broker.actor("w1"))
        with pytest.raises(
            WorkerLost, match=r"`scale` was running on worker `w1` when the worker died"
        ):
            broker.key_on("w1", g, "scale", rows)
        assert broker.key_on("w1", g, "scale", rows) == keys["scale"]
        with pytest.raises(
            WorkerLost, match=r"`dies` was running on worker `w1` when the worker died"
        ):
            broker.key_on("w1", dies, "dies", rows)
        assert broker.key_on("w1", g, "scale", rows) == keys["scale"]
    with Broker.ray(workers={"w1": _worker()}, retries=1) as broker:
        assert broker.key_on("w1", g, "scale", rows) == keys["scale"]
        _killed(broker.actor("w1"))
        assert broker.key_on("w1", g, "scale", rows) == keys["scale"]


def test_a_key_asked_of_a_worker_that_cannot_work_it_out_fails_as_a_call_does(
    broker: Any, tmp_path: Path
) -> None:
    """``key_on`` of a node the worker cannot rebuild, or whose weights changed after they
    were frozen, fails as a call of the node does — FailedOnWorker naming what it raised,
    StateMismatch saying why — and nothing raised there is unpickled here (what the node
    raises touches a file when it is): it was Ray's RayTaskError, carrying the worker's
    traceback, and the node's own exception unpickled."""
    marker = tmp_path / "unpickled"
    rows = [root_key({"at": 0, "take": 2})]
    g = Graph.somatize(
        Rows().named("rows").frozen()
        >> RaisesWhenBuilt(os.getpid(), str(marker)).named("bad").frozen().cached().at("w1")
    )
    called = r"`bad` \(RaisesWhenBuilt\) raised Abort on worker `w1`: stop right there"
    for asking in (lambda: g.forward({"at": 0, "take": 2}, broker=broker),
                   lambda: broker.key_on("w1", g, "bad", rows)):  # fmt: skip
        with pytest.raises(FailedOnWorker, match=called):
            asking()
        assert not marker.exists()
    encoded, enc = _encoder_graph()
    with torch.no_grad():
        enc.module.linear.bias.data.add_(1.0)
    changed = r"^`enc` on worker `w1` was sent state whose digest is blake3:\w+, and the graph"
    for asking in (lambda: encoded.forward({"at": 0, "take": 2}, broker=broker),
                   lambda: broker.key_on("w1", encoded, "enc", rows)):  # fmt: skip
        with pytest.raises(StateMismatch, match=changed) as refused:
            asking()
        assert refused.type is StateMismatch


def test_a_key_asked_as_the_broker_is_closed_is_broker_closed_and_starts_no_actor(
    cluster: None, tmp_path: Path
) -> None:
    """Closing a Ray broker while ``key_on`` waits on a worker fails it with BrokerClosed,
    as a call of a node does, and starts no actor again for it whatever ``retries=`` says:
    it started a fresh one and waited on it for the key."""
    from somatize.broker import BrokerClosed

    marker = tmp_path / "slow"
    g = Graph.somatize(
        Rows().named("rows").frozen()
        >> SlowToBuild(20.0, str(marker), os.getpid()).named("slow").frozen().cached().at("w1")
    )
    rows = [root_key({"at": 0, "take": 2})]
    broker = Broker.ray(workers={"w1": _worker()}, retries=1)
    marker.touch()

    def close() -> None:
        while not broker._started:  # the worker started: key_on waits on it
            time.sleep(0.05)
        broker.close()

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    try:
        with pytest.raises(BrokerClosed, match=r"`slow` on worker `w1` did not finish"):
            broker.key_on("w1", g, "slow", rows)
        closer.join()
        assert broker._actors == {}
    finally:
        broker.close()


def test_a_key_asked_of_a_worker_that_does_not_answer_in_time_is_a_timeout(
    cluster: None, tmp_path: Path
) -> None:
    """``key_on`` fails as a call of a node does when the worker does not answer in time:
    WorkerTimeout, naming node and worker, whether the worker never started
    (``start_timeout_s``) or took too long over the key (``timeout_s``: the actor is
    stopped, and started afresh for the next call) — never Ray's GetTimeoutError."""
    marker = tmp_path / "slow"
    g = Graph.somatize(
        Rows().named("rows").frozen()
        >> SlowToBuild(30.0, str(marker), os.getpid()).named("slow").frozen().cached().at("w1")
    )
    rows = [root_key({"at": 0, "take": 2})]
    never = Broker.ray(
        workers={"w1": _worker()},
        runtime_env={"py_executable": "/bin/false"},
        start_timeout_s=1,
        timeout_s=1,
    )
    try:
        with pytest.raises(WorkerTimeout, match=r"worker `w1` did not start within 1 s"):
            never.key_on("w1", g, "slow", rows)
    finally:
        never.close()
    with Broker.ray(workers={"w1": _worker()}, timeout_s=1) as broker:
        marker.touch()
        with pytest.raises(WorkerTimeout, match=r"`slow` on worker `w1` did not answer within 1 s"):
            broker.key_on("w1", g, "slow", rows)
        marker.unlink()
        # Untimed: the fresh actor imports the node's module, and torch with it, first,
        # which takes a loaded machine longer than the 1 s this call timed.
        broker.timeout_s = None
        assert broker.key_on("w1", g, "slow", rows).startswith("blake3:")


def test_a_ray_broker_given_no_workers_says_how_to_give_them_to_broker_ray() -> None:
    """``Broker.ray()`` with no workers, or not by name, says how ``Broker.ray`` is given
    them, and what it got — it showed ``Broker.embedded(...)``, another broker — before any
    cluster is connected to."""
    said = re.escape('given its workers by name, e.g. `Broker.ray(workers={"w1": Worker.generic(')
    for workers in (None, {}, [("w1", Worker.generic(mode="network"))]):
        with pytest.raises(TypeError, match=said + r'mode="network"\)\}\)`; got'):
            Broker.ray(workers=workers)  # type: ignore[arg-type]


def test_a_ray_broker_copied_or_pickled_is_refused_by_name(broker: Any) -> None:
    """A Ray broker pickled (to a spawned DataLoader worker) or copied is refused with a
    TypeError naming it and what to do, not `SimpleQueue`'s, which named nothing of
    somatize's; the broker runs on."""
    for copying in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match=r"a Ray broker cannot be copied .*Broker\.ray"):
            copying(broker)
    g = Graph.somatize(Rows().named("rows") >> Scale(2.0).named("scale").at("w1"))
    assert g.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_a_worker_whose_environment_cannot_run_it_is_said_to_be_so_when_it_never_starts(
    cluster: None,
) -> None:
    """A worker given a Python that cannot run Ray never starts, and Ray does not say so:
    the WorkerTimeout names the environment as a cause besides the resources, which alone
    it named, sending the search to a cluster that had them."""
    broker = Broker.ray(
        workers={"w1": _worker()}, runtime_env={"py_executable": "/bin/false"}, start_timeout_s=1
    )
    g = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    try:
        with pytest.raises(WorkerTimeout, match=r"did not start within 1 s.*environment.*Python"):
            g.forward({"at": 0, "take": 2}, broker=broker)
    finally:
        broker.close()


def test_a_worker_whose_actor_cannot_be_made_is_bad_worker_and_not_tried_again(
    cluster: None,
) -> None:
    """An actor whose process cannot make it (its environment lacks somatize, or imports a
    version whose actor has other methods) is BadWorker, with the last line Ray said, and is
    not started again: `retries=` would fail the same way. It was WorkerLost, a worker said
    to have died while it ran the node, after every retry."""
    from somatize.broker.ray import _Actor

    class Unmade(_Actor):
        def __init__(self, worker: str, import_paths: list[str]) -> None:
            raise ModuleNotFoundError("No module named 'somatize'")

    broker = Broker.ray(workers={"w1": _worker()}, retries=2)
    broker._remote = ray.remote(Unmade)  # as an environment without somatize would make it
    g = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
    try:
        with pytest.raises(BadWorker, match=r"worker `w1` could not be started: its actor "
                           r"failed as it was made \(.*No module named 'somatize'\)"):  # fmt: skip
            g.forward({"at": 0, "take": 2}, broker=broker)
    finally:
        broker.close()


def test_retries_run_the_node_again_on_a_fresh_worker(cluster: None, tmp_path: Path) -> None:
    """With ``retries=1`` a worker killed once is started again and the forward succeeds."""
    marker = tmp_path / "started"
    g = Graph.somatize(
        Rows().named("rows") >> Nap(1.0, marker=str(marker)).named("slow").at("w1") >> Echo()
    )
    with Broker.ray(workers={"w1": _worker()}, retries=1) as broker:
        killer = _kill_when(marker, broker, "w1")
        assert g.forward({"at": 0, "take": 2}, broker=broker) == [0, 1]
        killer.join()


def test_a_slow_worker_times_out_and_the_broker_goes_on(cluster: None) -> None:
    """A call longer than ``timeout_s`` is a clear error naming node and worker, and said
    so by the node's ``failed`` fact; the broker starts the worker afresh for the next
    call."""
    seen: list[dict[str, Any]] = []
    with Broker.ray(workers={"w1": _worker()}, timeout_s=1.0) as broker:
        ok = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w1"))
        slow = Graph.somatize(Rows().named("rows") >> Nap(30.0).named("slow").at("w1"))
        with pytest.raises(WorkerTimeout, match=r"`slow` on worker `w1` did not answer within 1 s"):
            slow.forward({"at": 0, "take": 2}, broker=broker, watching=seen.append)
        assert ok.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]
    assert [f for f in seen if f["fact"] == "failed"] == [
        {"fact": "failed", "node": "slow", "error": "WorkerTimeout"}
    ]


def test_what_a_node_raises_on_a_worker_is_named(broker: Any) -> None:
    """A node raising in an actor is reported with its type, message, node and worker."""
    g = Graph.somatize(Rows().named("rows") >> Fails().named("fails").at("w2"))
    with pytest.raises(FailedOnWorker, match=r"`fails` \(Fails\) raised ZeroDivisionError on "
                       r"worker `w2`: on purpose"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_node_raising_on_a_worker_is_said_failed_as_without_a_broker(broker: Any) -> None:
    """The ``failed`` fact of a node raising on an actor names the type it raised, as the
    same graph says with no broker or an embedded one — not ``refused``, which is the
    library refusing — for a node and for a mapped one."""
    for mapped in (False, True):
        fails = Fails().named("fails").at("w2")
        g = Graph.somatize(Rows().named("rows") >> (fails.mapped() if mapped else fails))
        said: dict[str, list[dict[str, Any]]] = {}
        for where, using in (("here", None), ("ray", broker)):
            seen: list[dict[str, Any]] = []
            with pytest.raises(NodeFailed, match="raised ZeroDivisionError"):
                g.forward({"at": 0, "take": 2}, broker=using, watching=seen.append)
            said[where] = [f for f in seen if f["fact"] == "failed"]
        assert (
            said["ray"]
            == said["here"]
            == [{"fact": "failed", "node": "fails", "error": "ZeroDivisionError"}]
        )


def test_a_base_exception_a_node_raises_on_a_worker_is_named_not_carried(
    broker: Any, tmp_path: Path
) -> None:
    """A node raising a BaseException on an actor — a KeyboardInterrupt, a class of its
    own — is FailedOnWorker naming its type and message, and nothing it raised is
    unpickled here (one of them touches a file when it is); a KeyboardInterrupt came back
    as Ray's own cancellation, and the other was unpickled in the client. ``sys.exit()``
    ends the actor: WorkerLost, and the next call starts it afresh."""
    marker = tmp_path / "unpickled"
    g = Graph.somatize(
        Rows().named("rows") >> RaisesBase("abort", str(marker)).named("abort").at("w2")
    )
    with pytest.raises(FailedOnWorker, match=r"`abort` \(RaisesBase\) raised Abort on worker "
                       r"`w2`: stop right there"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert not marker.exists()
    g = Graph.somatize(Rows().named("rows") >> RaisesBase("interrupt").named("stop").at("w2"))
    with pytest.raises(
        FailedOnWorker, match=r"raised KeyboardInterrupt on worker `w2`: interrupted"
    ):
        g.forward({"at": 0, "take": 2}, broker=broker)
    g = Graph.somatize(Rows().named("rows") >> RaisesBase("exit").named("exit").at("w2"))
    with pytest.raises(WorkerLost, match=r"`exit` was running on worker `w2` when the worker died"):
        g.forward({"at": 0, "take": 2}, broker=broker)
    ok = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w2"))
    assert ok.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_a_worker_dying_once_it_was_handed_a_state_is_lost(broker: Any) -> None:
    """An actor that asks for a frozen module's state and dies running it (out of memory on
    its first forward) is WorkerLost, as one dying on its first call is: the state it
    asked for was taken for its answer (an assertion, or an AttributeError under ``-O``)."""
    g = Graph.somatize(
        Ramp(4).named("rows") >> ModuleNode.build(Exits, 4).named("exits").frozen().at("w2")
    )
    freeze(g)
    with pytest.raises(
        WorkerLost, match=r"`exits` was running on worker `w2` when the worker died"
    ):
        g.forward({"at": 0, "take": 2}, broker=broker)
    ok = Graph.somatize(Rows().named("rows") >> Scale().named("scale").at("w2"))
    assert ok.forward({"at": 0, "take": 2}, broker=broker) == [0.0, 2.0]


def test_an_answer_with_no_codec_fails_on_ray(broker: Any) -> None:
    """An answer no codec writes is refused on the worker, naming its type and its edge."""
    g = Graph.somatize(Rows().named("rows") >> MakesBlob().named("blob").at("w1") >> Echo())
    with pytest.raises(CodecError, match=r"answer of `blob`.*`w1` to `echo`.*broker_nodes\.Blob"):
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_class_in_main_is_refused_before_anything_runs(
    broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class from ``__main__`` cannot be imported by an actor: refused with the advice."""
    main = type("Main", (Echo,), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "Main", main, raising=False)  # as typed in
    rows = Rows()
    g = Graph.somatize(rows.named("rows") >> main().named("main").at("w1"))
    with pytest.raises(Unbuildable, match=r"`main` cannot be sent.*move the class into a module"):
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert rows.calls == 0


def test_local_mode_is_refused_for_ray(cluster: None) -> None:
    """A Ray worker is another process, so a local-mode worker is refused up front."""
    from somatize.broker import BadWorker

    with pytest.raises(BadWorker, match=r"`w1` is `mode=\"local\"`.*mode=\"network\""):
        Broker.ray(workers={"w1": Worker.generic(mode="local")})


def test_counts_and_times_that_are_not_ones_are_refused_before_ray_starts() -> None:
    """retries is a count and the timeouts finite seconds: a bool, a negative, a NaN or an
    infinity is refused by name, before any cluster is reached."""
    workers = {"w1": _worker()}
    for retries in (True, -1, 1.5):
        with pytest.raises(ValueError, match=r"retries is a count ≥ 0"):
            Broker.ray(workers=workers, retries=retries)  # type: ignore[arg-type]
    for seconds in (True, 0, -1.0, float("nan"), float("inf"), "10"):
        with pytest.raises(ValueError, match=r"timeout_s is a number of seconds > 0"):
            Broker.ray(workers=workers, timeout_s=seconds)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"start_timeout_s is a number of seconds > 0"):
            Broker.ray(workers=workers, start_timeout_s=seconds)  # type: ignore[arg-type]


def test_an_address_or_import_paths_of_another_kind_are_refused_before_ray_starts() -> None:
    """Workers handed where the address goes (as ``Broker.embedded`` takes them), an
    address that is no string, or import paths given as one string (which would put each
    of its letters on the actors' ``sys.path``) or holding what is neither a str nor a
    path of one (bytes) are refused saying how to call it, before any cluster is
    reached."""
    workers = {"w1": _worker()}
    with pytest.raises(TypeError, match=r"Broker.ray\(workers=\{\.\.\.\}\)"):
        Broker.ray(workers)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"address is the Ray cluster's address, a str"):
        Broker.ray(5, workers)  # type: ignore[arg-type]

    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"src"

    for paths in ("src", ["src", 3], [b"src"], [Path("src"), BytesPath()]):
        with pytest.raises(TypeError, match=r"import_paths is a list of directories"):
            Broker.ray(workers=workers, import_paths=paths)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"runtime_env is Ray's runtime environment, a dict"):
        Broker.ray(workers=workers, runtime_env="env")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def other_cluster(cluster: None) -> Iterator[str]:
    """The GCS address of a second Ray cluster on 127.0.0.1, started by another process
    (it goes when that process ends)."""
    code = (
        "import sys, ray\n"
        "ray.init(num_cpus=0, include_dashboard=False, log_to_driver=False)\n"
        "print(ray.get_runtime_context().gcs_address, flush=True)\n"
        "sys.stdin.read()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        address = process.stdout.readline().strip()
        assert address.count(":") == 1, f"the second cluster did not start: {address!r}"
        yield address
    finally:
        process.stdin.close()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_an_address_naming_another_cluster_than_the_connected_one_is_refused(
    cluster: None, other_cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process connected to one cluster, Broker.ray(address) naming another — by its
    GCS address, through `$RAY_ADDRESS` for "auto", or a Ray Client server this process is
    not connected through — is refused naming both; the connected cluster's address, in
    any of its forms, is taken and the broker runs there."""
    here = ray.get_runtime_context().gcs_address
    port = here.rpartition(":")[2]
    other_port = other_cluster.rpartition(":")[2]
    workers = {"w1": _worker()}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for named in (other_cluster, f"localhost:{other_port}", "ray://127.0.0.1:10001", "local"):
        with pytest.raises(OtherCluster, match=rf"connected to the Ray cluster at {here}") as why:
            Broker.ray(named, workers)
        assert repr(named) in str(why.value)
        assert "ray.shutdown()" in str(why.value) and "without an address" in str(why.value)
    monkeypatch.setenv("RAY_ADDRESS", other_cluster)
    with pytest.raises(OtherCluster, match=r"address 'auto'"):
        Broker.ray("auto", workers)
    monkeypatch.setenv("RAY_ADDRESS", f"localhost:{port}")
    # An address taken is only checked against the connected cluster and not kept: every
    # broker taken runs on that cluster alike, so one runs a forward (an actor's start, the
    # costly part) and the others are each made without being refused.
    for named in (here, f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
        Broker.ray(named, workers).close()
    taken = Broker.ray("auto", workers)
    try:
        g = Graph.somatize(Rows().named("rows") >> Where().named("where").at("w1"))
        pid, worker, _ = g.forward({"at": 0, "take": 2}, broker=taken)
        assert pid != os.getpid() and worker == "w1"
    finally:
        taken.close()


def test_independent_branches_on_two_ray_workers_run_at_once(broker: Any, tmp_path: Path) -> None:
    """Two branches on two actors run at once: each waits for the other to have started,
    which, run one after the other, the first never sees."""
    warm = Graph.somatize(Rows() >> (Echo("1").at("w1"), Echo("2").at("w2")) >> Add())
    warm.forward({"at": 0, "take": 1}, broker=broker)  # start both actors first
    folder = str(tmp_path)
    g = Graph.somatize(
        Rows().named("rows")
        >> (
            Meet(folder, "a", "b").named("a").at("w1"),
            Meet(folder, "b", "a").named("b").at("w2"),
        )
        >> Add().named("sum")
    )
    assert g.forward({"at": 0, "take": 4}, broker=broker) == 12.0


def _kill_when(marker: Path, broker: Any, worker: str) -> threading.Thread:
    """A thread that kills ``worker``'s actor once ``marker`` exists (the node started)."""

    def kill() -> None:
        for _ in range(600):
            if marker.exists():
                ray.kill(broker.actor(worker))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_an_exception_whose_message_cannot_be_read_is_still_named(broker: Any) -> None:
    """A node raising an exception whose ``str()`` raises is FailedOnWorker all the same,
    naming what it raised and saying its message could not be read."""
    g = Graph.somatize(Rows().named("rows") >> RaisesUnprintable().named("bad").at("w2"))
    with pytest.raises(FailedOnWorker, match=r"`bad` \(RaisesUnprintable\) raised Unprintable on "
                       r"worker `w2`: \(its message could not be read"):  # fmt: skip
        g.forward({"at": 0, "take": 2}, broker=broker)


def test_a_node_no_actor_can_rebuild_is_refused_before_anything_runs(broker: Any) -> None:
    """A node whose rebuilt copy declares something else is refused before the first node
    runs, naming the node and the worker."""
    rows = Rows()
    g = Graph.somatize(rows.named("rows") >> Seeded().named("seeded").frozen().at("w1"))
    with pytest.raises(Unbuildable, match=r"`seeded` cannot be sent to worker `w1`.*declares"):
        g.forward({"at": 0, "take": 2}, broker=broker)
    assert rows.calls == 0


_VERSION = """
from somatize import Node


class Drifting(Node):
    def __init__(self, by=2.0):
        self.by = by

    def forward(self, values, ctx):
        return [v * self.by{more} for v in values]
"""


def test_an_actor_running_other_code_refuses_and_keeps_nothing(
    cluster: None, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor that imports another version of a node's module than the client's (the same
    constructor, another source), from a directory given in ``import_paths`` as a Path,
    refuses, naming the node and the worker, and keeps nothing under the client's key."""
    here, there = tmp_path / "here", tmp_path / "there"
    for place, more in ((here, ""), (there, " + 1000")):
        place.mkdir()
        (place / "drifting_nodes.py").write_text(_VERSION.format(more=more))
    monkeypatch.syspath_prepend(str(here))
    from drifting_nodes import Drifting  # type: ignore[import-not-found]

    g = Graph.somatize(
        Rows().named("rows").frozen() >> Drifting(3.0).named("drift").frozen().cached().at("w1")
    )
    paths = [there, *sys.path]  # a Path beside strs
    with (
        Broker.ray(workers={"w1": _worker()}, import_paths=paths) as elsewhere,
        pytest.raises(Unbuildable, match=r"`drift` on worker `w1` runs other code"),
    ):
        g.forward({"at": 0, "take": 2}, store=store, broker=elsewhere)
    answers = (store.root / "answers").rglob("*")  # type: ignore[attr-defined]
    assert not [p for p in answers if p.is_file()]
    assert g.forward({"at": 0, "take": 2}, store=store, strict=True) == [0.0, 3.0]


def test_an_actor_imports_a_node_s_helpers_from_where_the_client_does(
    cluster: None, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default an actor finds modules where this process does, in the order of its
    ``sys.path``: a helper module the node imports from beside its own file is that one
    there too, not a module of the same name in the directory the client was started from,
    which this process does not import from (``python src/run.py`` run from the project's
    root). Found there, it answered otherwise under the client's key, kept in the store."""
    started, src = tmp_path / "project", tmp_path / "project" / "src"
    src.mkdir(parents=True)
    (started / "shadowed_factor.py").write_text("def factor():\n    return 3\n")
    (src / "shadowed_factor.py").write_text("def factor():\n    return 2\n")
    (src / "shadowing_nodes.py").write_text(_SHADOWED)
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.chdir(started)
    from shadowing_nodes import Factored  # type: ignore[import-not-found]

    g = Graph.somatize(
        Rows().named("rows").frozen() >> Factored().named("f").frozen().cached().at("w1")
    )
    x = {"at": 0, "take": 2}
    assert g.forward(x) == [0, 2]
    with Broker.ray(workers={"w1": _worker()}) as broker:
        assert g.forward(x, store=store, broker=broker) == [0, 2]
    assert g.forward(x, store=store) == [0, 2]


def test_an_actor_puts_its_import_paths_first_in_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An actor puts the directories it is given first on its ``sys.path``, in their order,
    ahead of one its process was started with first: Ray starts an actor with the directory
    the client was started from at the head of its path, where a module of the same name as
    one the client imports from its own path was found first."""
    from somatize.broker.ray import _Actor

    started, src = str(tmp_path / "project"), str(tmp_path / "project" / "src")
    monkeypatch.setattr(sys, "path", [started, src, *sys.path])
    _Actor("w1", [src, started])
    assert sys.path[:2] == [src, started]
    assert sys.path.count(started) == 1


_SHADOWED = """
import shadowed_factor

from somatize import Node


class Factored(Node):
    def forward(self, values, ctx):
        return [v * shadowed_factor.factor() for v in values]
"""


def test_an_actor_that_imported_a_module_before_it_was_edited_says_to_start_it_afresh(
    cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's module edited and reloaded here while an actor that imported it runs on is
    refused as other code, saying that the actor runs the module as it imported it until it
    is started afresh (``broker.close()``) — building the graph again, which the message
    advised, changed nothing — and once the broker is closed the node runs as edited."""
    import importlib

    module = tmp_path / "edited_nodes.py"
    module.write_text(_VERSION.format(more=""))
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_nodes  # type: ignore[import-not-found]

    x = {"at": 0, "take": 2}
    with Broker.ray(workers={"w1": _worker()}) as broker:
        g = Graph.somatize(Rows().named("rows") >> edited_nodes.Drifting(3.0).at("w1"))
        assert g.forward(x, broker=broker) == [0.0, 3.0]
        module.write_text(_VERSION.format(more=" + 1000"))
        importlib.reload(edited_nodes)
        g = Graph.somatize(Rows().named("rows") >> edited_nodes.Drifting(3.0).at("w1"))
        assert g.forward(x) == [1000.0, 1003.0]
        with pytest.raises(Unbuildable, match=r"runs other code .* a worker runs a module as it "
                           r"imported it, .*`broker\.close\(\)`"):  # fmt: skip
            g.forward(x, broker=broker)
        broker.close()
        assert g.forward(x, broker=broker) == [1000.0, 1003.0]


def test_closing_the_broker_fails_a_waiting_forward_and_starts_no_actor(
    cluster: None, tmp_path: Path
) -> None:
    """Closing a Ray broker while a forward has one node running and one queued on a worker
    fails the forward at once with BrokerClosed, and starts no actor again, even with
    retries."""
    from somatize.broker import BrokerClosed

    marker = tmp_path / "started"
    g = napping(marker, 30.0)
    closing = Broker.ray(workers={"w1": _worker()}, retries=1)
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = g.forward({"at": 0, "take": 2}, broker=closing)
        except BaseException as error:
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    for _ in range(1200):
        if marker.exists():
            break
        time.sleep(0.05)
    lanes = list(closing._lanes.values())
    closing.close()
    thread.join(30)
    assert not thread.is_alive(), "the forward still waits on a closed broker"
    assert isinstance(out.get("error"), BrokerClosed), out
    ended = threading.Thread(target=lambda: [lane.shutdown(wait=True) for lane in lanes])
    ended.start()
    ended.join(30)  # the call that was running has given up, rather than try again
    assert not ended.is_alive() and closing._actors == {}


def test_an_address_where_another_server_answers_is_refused_at_once(
    cluster: None, tmp_path: Path
) -> None:
    """Broker.ray given the address of a server that answers and is no Ray cluster's GCS (a
    web server, as Ray's dashboard on port 8265 is) raises ConnectionError naming it and
    the port to give, at once, rather than wait in `ray.init` for good, logging retries. A
    cluster's GCS is let through."""
    import http.server
    import logging

    from somatize.broker.ray import _refuse_unanswered

    _refuse_unanswered(ray.get_runtime_context().gcs_address)  # a cluster's: nothing raised

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            logging.getLogger(__name__).debug(format, *args)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    named = f"127.0.0.1:{server.server_address[1]}"
    try:
        done = _ray_connected_at(named, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"a server answers at {named} that is no Ray cluster's GCS" in done.stdout
    assert "6379" in done.stdout


def test_an_address_where_a_server_says_nothing_is_refused_in_seconds(tmp_path: Path) -> None:
    """Broker.ray given the address of a server that takes the connection and says nothing
    (where a GCS answers at once) raises ConnectionError naming it after a few seconds,
    rather than leave `ray.init` to wait for it for good (the process it runs in is given
    a minute)."""
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        named = f"127.0.0.1:{listening.getsockname()[1]}"
        done = _ray_connected_at(named, tmp_path)  # taken into the backlog, never answered
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"a server takes connections at {named} and says nothing there in 5 s" in done.stdout
    assert "6379" in done.stdout


def _ray_connected_at(
    address: str | None, cwd: Path, ray_address: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A process, connected to no Ray, making ``Broker.ray(address, ...)`` with
    ``$RAY_ADDRESS`` set to ``ray_address`` (unset for None), printing the ConnectionError
    it is refused with."""
    script = (
        "from somatize.broker import Broker, Worker\n"
        "try:\n"
        f"    Broker.ray({address!r}, {{'w1': Worker.generic(mode='network')}})\n"
        "except ConnectionError as why:\n"
        "    print(why)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("RAY_ADDRESS", None)
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("through", ["address", "RAY_ADDRESS"])
def test_an_address_where_no_cluster_answers_is_refused_at_once(
    tmp_path: Path, through: str
) -> None:
    """Broker.ray given the GCS address of no running cluster (by `address=`, or by
    `$RAY_ADDRESS` with none) raises ConnectionError naming it at once, in a process not
    connected to Ray, rather than wait minutes in `ray.init` for a cluster that is not there."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed below: nothing listens there
    named = f"127.0.0.1:{port}"
    if through == "address":
        done = _ray_connected_at(named, tmp_path)
    else:
        done = _ray_connected_at(None, tmp_path, ray_address=named)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"no Ray cluster answers at {named}" in done.stdout
    assert "ray start --head" in done.stdout


def test_a_dataclass_whose_class_is_not_loaded_across_is_refused_naming_it(
    broker: Any, store: Store
) -> None:
    """A dataclass answer of a class that only the worker's node loads, crossing back, and
    one of a class only this process loaded, crossing to a worker, are refused naming the
    class and the module to import, not said to be raised by the node; once this process
    loads the class, the answer the worker kept is read back."""
    module = "somatize_loaded_by_forward"
    assert module not in sys.modules
    x = 4
    g = Graph.somatize(AnswersUnloaded().named("enc").frozen().cached().at("w1"))
    try:
        for _ in range(2):  # computed on the worker, then recalled from its store too
            seen: list[dict[str, Any]] = []
            with pytest.raises(UnreadableCrossing, match=f"`import {module}`") as caught:
                g.forward(x, store=store, broker=broker, watching=seen.append)
            assert (
                f"the answer of `enc`, crossing back from worker `w1`, is a `{module}:Output`"
                in str(caught.value)
            )
            failed = [f for f in seen if f["fact"] == "failed"]
            assert failed == [{"fact": "failed", "node": "enc", "error": "refused"}]
        AnswersUnloaded().forward(x, None)  # as `import` of its module here would load it
        recalled = g.forward(x, store=store, broker=broker)
        assert type(recalled).__module__ == module and torch.equal(
            recalled.hidden, torch.arange(4.0) * 2
        )
        there = Graph.somatize(AnswersUnloaded().named("enc") >> Hidden().named("h").at("w2"))
        with pytest.raises(UnreadableCrossing, match=f"Import `{module}` in the module of `h`"):
            there.forward(x, broker=broker)
    finally:
        sys.modules.pop(module, None)
