"""Freezing torch nodes: deterministic state digests, no gradients, held in eval, refusals."""

from __future__ import annotations

import ast
import collections
import copy
import dataclasses
import decimal
import enum
import fractions
import functools
import os
import pathlib
import subprocess
import sys
import sysconfig
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

import somatize.torch as smt
from somatize import (
    Drifted,
    Graph,
    Node,
    NotSettled,
    Opaque,
    Store,
    Unbuildable,
    engine,
    keys,
    plan,
)
from somatize._precision import precision_now
from somatize.canonical import NotCanonical
from somatize_torch.freeze import settings_of
from tests.decoding import Decoder, NotesWidth, steps_alike
from tests.drawing import AttendsBeside, CountedBeside, DrawnBeside, WritesBeside
from tests.global_modules import CHANGES, normed_cell, scaled
from tests.nodes import host_float32_products, matmul_in_tf32


class Encoder(nn.Module):
    """A small encoder with state beyond weights (BatchNorm statistics) and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.norm = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.linear(x)))


class Pair(nn.Module):
    """Two parameters registered in the order given."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__()
        values = {"a": torch.arange(3.0), "b": torch.ones(2, 2)}
        self.register_parameter(first, nn.Parameter(values[first]))
        self.register_parameter(second, nn.Parameter(values[second]))


@dataclasses.dataclass
class Box:
    scale: float


class Scaled(nn.Module):
    """Reads plain values it keeps beside its weights: none of them shows in ``repr``."""

    def __init__(self, temperature: float, shift: torch.Tensor | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.temperature = temperature
        self.shift = torch.zeros(4) if shift is None else shift  # a tensor, not a buffer
        self.act = nn.functional.relu  # a function: seen by its code
        self.gain = np.float64(1.0)  # a subclass of float: seen as the float it is
        self.options = {"clip": 10.0, "hook": print}  # a dict: its plain entries are seen
        self.box = Box(1.0)  # a dataclass: its fields are seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x) / self.temperature * self.box.scale + self.shift
        return self.act(out.clamp(max=self.options["clip"]))


class Count(Node):
    """Not a torch node."""

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


MAKE = "torch.manual_seed(0); m = Encoder(); m.norm.running_mean.fill_(0.25)"


def _encoder() -> Encoder:
    torch.manual_seed(0)
    m = Encoder()
    m.norm.running_mean.fill_(0.25)
    return m


def test_state_digest_ignores_registration_order() -> None:
    """The same tensors registered in another order give the same digest."""
    assert list(dict(Pair("a", "b").named_parameters())) == ["a", "b"]
    assert list(dict(Pair("b", "a").named_parameters())) == ["b", "a"]
    assert smt.digest_state(Pair("a", "b")) == smt.digest_state(Pair("b", "a"))


def test_state_digest_is_the_same_in_a_fresh_process() -> None:
    """Another interpreter digests the same weights to the same state."""
    code = (
        "import torch, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_torch_freeze import Encoder\n"
        "import somatize.torch as smt\n"
        f"{MAKE}\n"
        "print(smt.digest_state(m))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == smt.digest_state(_encoder())


def test_buffers_are_state() -> None:
    """Changing a BatchNorm running mean changes the digest; so does any weight."""
    base = smt.digest_state(_encoder())
    moved = _encoder()
    moved.norm.running_mean[0] += 1e-3
    weighted = _encoder()
    with torch.no_grad():
        weighted.linear.weight[0, 0] += 1e-3
    assert len({base, smt.digest_state(moved), smt.digest_state(weighted)}) == 3


def test_state_digest_is_the_same_on_any_device_and_dtype_matters() -> None:
    """A moved copy keeps its digest; the same values in another dtype do not."""
    m = _encoder()
    assert smt.digest_state(m) == smt.digest_state(_encoder().to("cpu"))
    assert smt.digest_state(m) != smt.digest_state(_encoder().double())


def test_freeze_turns_off_gradients_and_holds_eval() -> None:
    """After freeze: no parameter requires grad, and `.train()` from a parent leaves it in eval."""
    encoder = _encoder()
    parent = nn.Sequential(encoder, nn.Linear(4, 1))
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen())
    digests = smt.freeze(g)
    assert digests == {"encoder": smt.digest_state(encoder)}
    assert g.memory.state_of("encoder") == digests["encoder"]
    assert not any(p.requires_grad for p in encoder.parameters())
    parent.train()
    assert parent[1].training
    assert not any(m.training for m in encoder.modules())
    assert smt.is_held(encoder)


def test_frozen_module_put_back_in_train_mode_warns() -> None:
    """A part of a frozen module trained directly warns when it runs, and runs in eval."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen())
    smt.freeze(g)
    encoder.drop.train()
    x = torch.randn(5, 6)
    with pytest.warns(smt.StillChanging, match="`drop`.*train mode"):
        first = g.forward(x)
    assert not encoder.drop.training
    assert torch.equal(first, g.forward(x))


@pytest.mark.parametrize("cached", [True, False])
def test_a_frozen_module_released_and_called_untrained_answers_as_in_eval(
    store: Store, cached: bool
) -> None:
    """A frozen node's module released (``release``, which puts it in train mode) and
    called again with its gradients still off answers as in eval, recalled or computed,
    its BatchNorm statistics unmoved: its answer is kept, or keys those of the nodes below
    it. It is held in eval for the call only, and left as released, in train mode, with
    ``.eval()`` and ``.train()`` working. It ran in train mode where nothing was recalled
    and answered as in eval where something was; then it was held in eval for good, and
    a fine-tuning turning its gradients on after such a call ran in eval."""
    encoder = _encoder()
    node = smt.ModuleNode(encoder).named("encoder").frozen()
    g = Graph.somatize(node.cached() if cached else node)
    smt.freeze(g)
    known, new = torch.randn(5, 6), torch.randn(5, 6)
    g.forward(Opaque(known), store=store)
    statistics = encoder.norm.running_mean.clone()
    for x in (known, new):
        smt.release(encoder)
        out = g.forward(Opaque(x), store=store)
        assert not smt.is_held(encoder) and all(part.training for part in encoder.modules())
        encoder.eval()
        with torch.no_grad():
            assert torch.equal(out, encoder(x))
        encoder.train()
        assert all(part.training for part in encoder.modules())
    assert torch.equal(encoder.norm.running_mean, statistics)


class Noisy(nn.Module):
    """Adds noise whatever its mode: each call draws anew."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.randn(x.shape[0], 4)


class NoisyOwnGenerator(nn.Module):
    """Adds noise drawn from a generator it holds, whatever its mode."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.noise = {"draws": torch.Generator().manual_seed(0)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape[0], 4, generator=self.noise["draws"])
        return self.linear(x) + noise


@pytest.mark.parametrize("module", [Noisy, NoisyOwnGenerator])
def test_a_cached_module_that_draws_at_random_is_refused(
    store: Store, module: type[nn.Module]
) -> None:
    """A cached module that draws from torch's generator, or one it holds, is refused
    before its answer is kept: a recall would repeat the one draw, where a call of the
    module draws anew."""
    g = Graph.somatize(smt.ModuleNode(module()).named("noisy").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with pytest.raises(smt.FreezeError, match="drew from torch's random number generator"):
            g.forward(x, store=store)


@pytest.mark.parametrize("module", [DrawnBeside, AttendsBeside])
def test_a_cached_module_run_while_another_thread_draws_is_kept_and_recalled(
    store: Store, module: type[nn.Module]
) -> None:
    """A cached module that draws nothing, run while another thread draws from torch's
    generator (another model sampling), is not taken to draw: its answer is kept, and
    recalled. An attention with no dropout, whose kernel torch tags as one that may draw,
    draws nothing."""
    g = Graph.somatize(smt.ModuleNode(module()).named("beside").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 4))
    first = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"beside": "ran"}
    assert torch.equal(g.forward(x, store=store), first)
    assert g.record is not None and g.record.outcome == {"beside": "recalled"}


def test_a_module_that_changes_what_it_keeps_as_another_thread_draws_runs_once(
    store: Store,
) -> None:
    """A cached module that changes what it keeps as it runs (a count of its calls), run
    while another thread draws, is not run again to see whether the draw is its own:
    that would change what it keeps twice. Its draw is taken as its own."""
    module = CountedBeside()
    g = Graph.somatize(smt.ModuleNode(module).named("beside").frozen().cached())
    smt.freeze(g)
    with pytest.raises(smt.FreezeError, match="drew from torch's random number generator"):
        g.forward(Opaque(torch.randn(5, 4)), store=store)
    assert module.calls == 1


def test_a_module_that_writes_into_its_input_as_another_thread_draws_writes_once(
    store: Store,
) -> None:
    """A cached module that writes into what it is handed, run while another thread draws,
    is run once more on a copy of it to see whether the draw is its own: the input is
    written once, as it is where no other thread draws, not twice."""
    g = Graph.somatize(smt.ModuleNode(WritesBeside()).named("beside").frozen().cached())
    smt.freeze(g)
    x = torch.ones(5, 4)
    g.forward(Opaque(x), store=store)
    assert torch.equal(x, torch.full((5, 4), 2.0))


def test_an_attention_that_drops_out_as_another_thread_draws_is_refused(store: Store) -> None:
    """A cached module whose attention drops out, run while another thread draws, is
    refused: run once more, its own draw is seen, whatever the other thread drew."""
    g = Graph.somatize(smt.ModuleNode(AttendsBeside(0.5)).named("beside").frozen().cached())
    smt.freeze(g)
    with pytest.raises(smt.FreezeError, match="drew from torch's random number generator"):
        g.forward(Opaque(torch.randn(5, 4)), store=store)


def test_a_frozen_module_that_draws_at_random_above_a_cached_one_is_refused(
    store: Store,
) -> None:
    """A frozen module that draws, not cached itself, above a cached one is refused: the
    cached node's answer is keyed by what the frozen one was handed, so it would be recalled
    with the one draw it was computed from, the frozen node spared."""
    head = smt.ModuleNode(nn.Linear(4, 2)).named("head").frozen().cached()
    g = Graph.somatize(smt.ModuleNode(Noisy()).named("noisy").frozen() >> head)
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    for _ in range(2):
        with pytest.raises(smt.FreezeError, match="is frozen, and it drew from torch's"):
            g.forward(x, store=store)


def test_a_cached_module_put_back_in_train_mode_warns_when_its_answer_is_recalled(
    store: Store,
) -> None:
    """A part of a frozen, cached module trained directly warns when the module's answer
    is recalled too, not only when it runs: what is recalled is what it answers in eval,
    where it is put back, once."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    first = g.forward(x, store=store)
    encoder.drop.train()
    with pytest.warns(smt.StillChanging, match="`drop`.*train mode"):
        again = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"encoder": "recalled"}
    assert torch.equal(again, first)
    assert not encoder.drop.training


def test_a_torch_module_in_a_global_the_forward_calls_is_keyed_as_the_node_s_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen module node whose module's forward calls a module of torch's own classes held
    in a global (``NORM = nn.LayerNorm(3)``) is keyed by that module's weights too: changed
    in place, the node runs again with them, its answer not recalled; set back, the first
    answer is."""
    cell = normed_cell(monkeypatch, "tests.freeze_norm_cell")
    normed = cell.Normed()
    g = Graph.somatize(smt.ModuleNode(normed).named("normed").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    with torch.no_grad():
        first = g.forward(x, store=store)
        scaled(cell.NORM, 2.0)
        doubled = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"normed": "ran"}
        assert torch.equal(doubled, normed(x.value))
        scaled(cell.NORM, 0.5)
        assert torch.equal(g.forward(x, store=store), first)
        assert g.record.outcome == {"normed": "recalled"}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_torch_module_the_node_s_module_computes_with_but_does_not_hold_keys_the_node(
    store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A frozen module node whose module computes with a module of torch's own classes it
    does not hold — in a global its forward calls, in a list or dict such a global holds,
    or bound by a partial it keeps — is keyed by that module's settings and mode
    (``NORM.eps = 1.0``, ``DROP.train()``) and weights, and by the modules such a
    container holds: changed, the node runs again, its answer not recalled."""
    cell = normed_cell(monkeypatch, "tests.freeze_held_cell")
    make, changed = CHANGES[change]
    module = make(cell)
    g = Graph.somatize(smt.ModuleNode(module).named("held").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    with torch.no_grad():
        first = g.forward(x, store=store)
        changed(cell, module)
        again = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"held": "ran"}
        assert torch.equal(again, module(x.value))
        assert not torch.equal(again, first)


def test_a_lazy_torch_module_in_a_global_the_node_s_module_calls_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Freezing a module node whose module's forward calls a lazy module held in a global,
    not called yet, is refused as one of its parts would be, naming the global: there are
    no weights to key its answers by (torch's ValueError came instead)."""
    cell = normed_cell(monkeypatch, "tests.freeze_held_cell")
    g = Graph.somatize(smt.ModuleNode(cell.Lazy()).named("lazy").frozen().cached())
    with pytest.raises(smt.FreezeError, match=r"`tests.freeze_held_cell:LAZY` holds .* not made"):
        smt.freeze(g)


def test_a_module_node_whose_module_calls_a_torch_module_in_a_global_is_copied(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen module node whose module's forward calls a module held in a global is copied
    whole (``copy.deepcopy``): the watch of that global's weights holds the cell's
    namespace, which holds modules no copy is made of, and is not copied with it; the copy,
    in a graph of its own, answers as the node does."""
    cell = normed_cell(monkeypatch, "tests.freeze_norm_cell")
    node = smt.ModuleNode(cell.Normed()).named("normed").frozen().cached()
    smt.freeze(Graph.somatize(node))
    x = Opaque(torch.randn(5, 6))
    copied = Graph.somatize(copy.deepcopy(node))
    smt.freeze(copied)
    with torch.no_grad():
        assert torch.equal(copied.forward(x, store=store), node.module(x.value))


def _outcome_in_float64(g: Graph, x: Any, store: Store) -> dict[str, str]:
    """What a forward of ``g`` on ``x`` did with each node, run with float64 as torch's
    default dtype."""
    made = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        g.forward(x, store=store)
    finally:
        torch.set_default_dtype(made)
    assert g.record is not None
    return g.record.outcome


def test_a_cached_module_node_is_keyed_by_the_precision_it_runs_in(store: Store) -> None:
    """A cached module called through a graph under bf16 autocast, or with another default
    dtype, is keyed apart from a call in torch's default precision: computed in that
    precision, never the float32 answer recalled for it, nor the other way round; back in
    the default precision, the first answer is recalled, under the key it always had."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
    smt.freeze(g)
    declared = g.memory.declaration_of("encoder")
    x = Opaque(torch.randn(5, 6))
    first = g.forward(x, store=store)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lowered = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"encoder": "ran"}
        with torch.no_grad():
            assert torch.equal(lowered, encoder(x.value))
    assert lowered.dtype == torch.bfloat16
    assert torch.equal(g.forward(x, store=store), first)
    assert g.record.outcome == {"encoder": "recalled"}
    assert g.memory.declaration_of("encoder") == declared
    assert _outcome_in_float64(g, x, store) == {"encoder": "ran"}
    g.forward(x, store=store)
    assert g.record.outcome == {"encoder": "recalled"}


def test_a_cached_module_node_on_a_local_worker_runs_in_the_precision_it_is_keyed_by(
    store: Store,
) -> None:
    """A cached module placed on a local worker (a thread, where the caller's autocast does
    not reach) and called under bf16 autocast computes under it, as its key says: the
    answer kept is the one the module computes there, and the same module called here
    under autocast recalls it; out of autocast, it is computed in float32."""
    from somatize import Broker, Worker

    encoder = _encoder()
    node = smt.ModuleNode(encoder).named("encoder").frozen().cached().at("w1")
    g = Graph.somatize(node)
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lowered = g.forward(x, store=store, broker=broker)
            assert g.record is not None and g.record.outcome == {"encoder": "ran"}
            with torch.no_grad():
                assert torch.equal(lowered, encoder(x.value))
            assert torch.equal(g.forward(x, store=store), lowered)
            assert g.record.outcome == {"encoder": "recalled"}
        plain = g.forward(x, store=store, broker=broker)
        assert g.record.outcome == {"encoder": "ran"}
        assert plain.dtype == torch.float32
    finally:
        broker.close()


def test_a_cached_module_node_first_called_under_autocast_keeps_its_answer(store: Store) -> None:
    """A frozen, cached module node first called under bf16 autocast keeps its answer, and
    the second call recalls it, as out of autocast: the precision it is keyed by, taken
    anew, left what the module keeps unwatched, and the first answer was taken for one
    whose forward changed it, computed again at the second call."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    facts: list[dict[str, Any]] = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = g.forward(x, store=store, watching=facts.append)
        assert torch.equal(g.forward(x, store=store, watching=facts.append), first)
    assert [f["fact"] for f in facts if f.get("node") == "encoder"] == ["ran", "kept", "recalled"]


@pytest.mark.parametrize("under_autocast", [False, True])
def test_a_cached_module_node_two_graphs_are_built_with_is_keyed_by_the_precision_each_runs_in(
    store: Store, under_autocast: bool
) -> None:
    """A cached module node two graphs are built with (an encoder two pipelines share), the
    second built in another precision than the one the first's key last named, is keyed
    by the precision each call runs in, in the first too: the build took the node's
    declaration in its precision, which the node then took as the one its key names, so
    the first graph, not told, recalled a bf16 answer for a float32 call, and a float32
    one for a call under bf16 autocast."""
    encoder = _encoder()
    node = smt.ModuleNode(encoder).named("encoder").frozen().cached()
    first = Graph.somatize(node)
    smt.freeze(first)
    x = Opaque(torch.randn(5, 6))
    plain = first.forward(x, store=store)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lowered = first.forward(x, store=store)
    assert lowered.dtype == torch.bfloat16
    if under_autocast:
        first.forward(x, store=store)  # its key names float32 again
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=under_autocast):
        smt.freeze(Graph.somatize(node))
        again = first.forward(x, store=store)
    expected = lowered if under_autocast else plain
    assert again.dtype == expected.dtype and torch.equal(again, expected)
    assert first.record is not None and first.record.outcome == {"encoder": "recalled"}


class Gate(Node):
    """Hands its input on; in a thread named in :data:`_GATES`, only once that thread's
    gate is opened, having said it got there."""

    def forward(self, x: Any, ctx: Any) -> Any:
        gate = _GATES.get(threading.get_ident())
        if gate is not None:
            there, opened = gate
            there.set()
            assert opened.wait(timeout=30)
        return x


_GATES: dict[int, tuple[threading.Event, threading.Event]] = {}
"""The gates of :class:`Gate`, by the thread that waits at one."""


def _under_autocast_meanwhile(
    g: Graph,
    x: Any,
    store: Store,
    meanwhile: Callable[[], torch.Tensor],
    planning: pytest.MonkeyPatch | None,
) -> torch.Tensor:
    """What ``g`` answers ``x`` under bf16 autocast in a thread of its own, stopped on its
    way (as it plans, with ``planning`` to patch the engine; else at a :class:`Gate` node)
    while this thread runs ``meanwhile``, a forward in float32."""
    there, opened = threading.Event(), threading.Event()
    if planning is not None:
        planned = engine.compile

        def compile(*args: Any) -> Any:
            if threading.get_ident() in _GATES:
                there.set()
                assert opened.wait(timeout=30)
            return planned(*args)

        planning.setattr(engine, "compile", compile)
    got: list[Any] = []

    def under_autocast() -> None:
        _GATES[threading.get_ident()] = (there, opened)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got.append(g.forward(x, store=store))
        except Exception as why:
            got.append(why)
        finally:
            del _GATES[threading.get_ident()]

    thread = threading.Thread(target=under_autocast)
    thread.start()
    try:
        assert there.wait(timeout=30)
        assert meanwhile().dtype == torch.float32
    finally:
        opened.set()
        thread.join()
    assert len(got) == 1 and not isinstance(got[0], Exception), got
    assert got[0].dtype == torch.bfloat16
    answer: torch.Tensor = got[0]
    return answer


@pytest.mark.parametrize("waits", ["planning", "running"])
def test_a_cached_module_node_called_in_two_precisions_from_two_threads_keys_each_as_it_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch, waits: str
) -> None:
    """A cached module node one graph forwards from two threads at once, one of them under
    bf16 autocast (a server whose request threads run in other precisions), is keyed by
    each call's own precision and computed in it, however the calls interleave: the call
    in float32 taking the node's declaration again while the one under autocast was on
    its way had the latter compute in float32 what it kept under its bf16 key (waiting to
    run), or key by float32 what it computed under autocast (waiting to plan once it had
    looked at the graph), each then recalled for a call in the other precision."""
    encoder = _encoder()
    g = Graph.somatize(
        Gate().named("gate").frozen() >> smt.ModuleNode(encoder).named("encoder").frozen().cached()
    )
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    with torch.no_grad():
        plain = encoder(x.value)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lowered = encoder(x.value)
    got = _under_autocast_meanwhile(
        g,
        x,
        store,
        lambda: g.forward(Opaque(torch.randn(5, 6)), store=store),
        monkeypatch if waits == "planning" else None,
    )
    assert got.dtype == torch.bfloat16 and torch.equal(got, lowered)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = g.forward(x, store=store)
    assert again.dtype == torch.bfloat16 and torch.equal(again, lowered)
    again = g.forward(x, store=store)
    assert again.dtype == torch.float32 and torch.equal(again, plain)


def test_a_graph_frozen_again_while_another_thread_plans_its_forward_is_keyed_by_its_new_state(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph frozen again at a checkpoint (``smt.freeze(g)``) by one thread while a
    forward in another is working out what its keys need keys the next forwards by the
    state it was frozen at: what the forward worked out from the state before was taken
    as derived from the new one, so the module's answers were kept under the keys of the
    state before, and recalled once it held that state again."""
    module, g, x = _frozen_square()
    first, second = copy.deepcopy(module.state_dict()), copy.deepcopy(module.state_dict())
    for tensor in second.values():
        tensor.mul_(2.0)
    module.load_state_dict(second)
    smt.freeze(g)
    there, opened = threading.Event(), threading.Event()
    worked_out = plan.code_fingerprints

    def code_fingerprints(*args: Any) -> Any:
        if threading.get_ident() in _GATES:
            there.set()
            assert opened.wait(timeout=30)
        return worked_out(*args)

    monkeypatch.setattr(plan, "code_fingerprints", code_fingerprints)

    def planning() -> None:
        _GATES[threading.get_ident()] = (there, opened)
        try:
            g.forward(Opaque(torch.randn(4, 32)), store=store)
        finally:
            del _GATES[threading.get_ident()]

    thread = threading.Thread(target=planning)
    thread.start()
    try:
        assert there.wait(timeout=30)
        module.load_state_dict(first)
        smt.freeze(g)
    finally:
        opened.set()
        thread.join()
    g.forward(x, store=store)
    module.load_state_dict(second)
    smt.freeze(g)
    out = g.forward(x, store=store)
    with torch.no_grad():
        assert torch.equal(out, module(x.value))


_MEANWHILE: list[Callable[[], Any]] = []
"""What :class:`Meanwhile` and :class:`Rescaled` run inside their next forwards, one each:
what another thread may do meanwhile."""


class Meanwhile(Node):
    """Hands its input on, having run the first of :data:`_MEANWHILE`."""

    def forward(self, x: Any, ctx: Any) -> Any:
        if _MEANWHILE:
            _MEANWHILE.pop(0)()
        return x


class Rescaled(nn.Module):
    """A linear layer whose answer is scaled by a value it keeps, read after the first of
    :data:`_MEANWHILE` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.lin(x)
        if _MEANWHILE:
            _MEANWHILE.pop(0)()
        return h * self.scale


@pytest.mark.parametrize("cached_by", ["graph", "wrap"])
def test_a_value_given_as_a_module_runs_keeps_its_answer_nowhere_though_another_thread_keyed_it(
    store: Store, cached_by: str
) -> None:
    """A value given to a frozen, cached module while it computes an answer (another thread
    setting `encoder.scale`), and a call from a third thread keyed by the new value before
    the first ends (a server's next request), leave the first answer, computed with the new
    value, kept nowhere: it was compared with the module as the third thread found it, not
    as its own key named it, and kept under the key of the value before, to be recalled
    once that value was set back."""
    module = Rescaled()
    call: Callable[[torch.Tensor], Any]
    if cached_by == "graph":
        g = Graph.somatize(smt.ModuleNode(module).named("rescaled").frozen().cached())
        smt.freeze(g)
        call = lambda x: g.forward(Opaque(x), store=store)  # noqa: E731
    else:
        wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
        smt.freeze(wrapped)
        call = wrapped
    call(torch.randn(2, 4))
    y = torch.randn(2, 4)  # drawn here: a draw inside a frozen module's forward is refused

    def rescaled() -> None:
        module.scale = 2.0
        other = threading.Thread(target=call, args=(y,))
        other.start()
        other.join()

    _MEANWHILE.append(rescaled)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(call(x), module(x))  # as the module answers now
        module.scale = 1.0  # set back to the value the first answer was keyed by
        assert torch.equal(call(x), module(x))


def test_a_checkpoint_loaded_as_a_forward_runs_the_nodes_before_a_module_keeps_its_answer_nowhere(
    store: Store,
) -> None:
    """A checkpoint loaded into a frozen, cached module (by another thread) after a forward
    keyed it, while the forward runs the nodes before it, leaves the answer the module then
    computes with the new weights kept nowhere: its forward looked for a write into the
    weights only as it ran, and kept the answer under the key of the weights before, to be
    recalled once they were loaded back."""
    module = Rescaled()
    g = Graph.somatize(
        Meanwhile().named("meanwhile").frozen()
        >> smt.ModuleNode(module).named("rescaled").frozen().cached()
    )
    smt.freeze(g)
    before = copy.deepcopy(module.state_dict())
    after = {name: tensor * 2 for name, tensor in before.items()}
    _MEANWHILE.append(lambda: module.load_state_dict(after))
    x = Opaque(torch.randn(3, 4))
    with torch.no_grad():
        assert torch.equal(g.forward(x, store=store), module(x.value))  # as it answers now
        module.load_state_dict(before)
        assert torch.equal(g.forward(x, store=store), module(x.value))


def test_a_module_node_not_frozen_runs_under_the_callers_autocast() -> None:
    """A module node neither frozen nor cached, called under autocast after a call outside
    it, computes under autocast, as the module does: nothing keys its answers, and no
    precision named before is held to."""
    encoder = _encoder().eval()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder"))
    x = Opaque(torch.randn(5, 6))
    g.forward(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lowered = g.forward(x)
        with torch.no_grad():
            assert torch.equal(lowered, encoder(x.value))
    assert lowered.dtype == torch.bfloat16


def test_a_cached_module_node_keyed_by_autocast_is_not_sent_to_another_process(
    store: Store,
) -> None:
    """A cached module that a worker in another process rebuilds, called under autocast,
    is refused before anything runs, saying where it can run: autocast does not reach that
    process, where it would compute in float32 an answer kept under a key that says bf16
    (or be refused there, as running other code). In torch's default precision it is sent
    as before, and with another default dtype too, a setting of the whole process that a
    worker's process may share (this one does): its copy, rebuilt there, says whether it
    does."""
    from somatize import Broker, Unbuildable, Worker

    node = smt.ModuleNode.build(Encoder).named("encoder").frozen().cached().at("w1")
    g = Graph.somatize(node)
    smt.freeze(g)
    x = Opaque(torch.randn(5, 6))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    try:
        first = g.forward(x, store=store, broker=broker)
        lowered = torch.autocast("cpu", dtype=torch.bfloat16)
        with lowered, pytest.raises(Unbuildable, match=r"autocast.*bfloat16.*local"):
            g.forward(x, store=store, broker=broker)
        assert torch.equal(g.forward(x, store=store, broker=broker), first)
        assert g.record is not None and g.record.outcome == {"encoder": "recalled"}
        made = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            g.forward(x, store=store, broker=broker)
            assert g.record.outcome == {"encoder": "ran"}
        finally:
            torch.set_default_dtype(made)
    finally:
        broker.close()


class Gram(Node):
    """A plain node computing with torch: its input times itself transposed, a product
    autocast lowers and TF32 rounds."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x @ x.T


class Grams(Node):
    """:class:`Gram` of each item of a list: a node to map."""

    def forward(self, items: list[torch.Tensor], ctx: Any) -> list[torch.Tensor]:
        return [x @ x.T for x in items]


def test_a_cached_plain_node_is_keyed_by_the_precision_it_runs_in(store: Store) -> None:
    """A cached node that is no module, computing with torch, called under bf16 autocast,
    with another default dtype or with float32 products in reduced precision, is keyed
    apart from a call in torch's default precision: the bf16 answer was kept under the key
    of the float32 call and recalled for it (dtype bfloat16, other values). A call in the
    default precision keeps the key it always had: the node's fixed parts and its input's
    key, nothing more."""
    g = Graph.somatize(Gram().named("gram").frozen().cached())
    x = Opaque(torch.randn(4, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lowered = g.forward(x, store=store)
    assert lowered.dtype == torch.bfloat16
    plain = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"gram": "ran"}
    assert plain.dtype == torch.float32 and torch.equal(plain, x.value @ x.value.T)
    memory = g.memory
    fixed = keys.node_prefix(
        memory.identity_of("gram") or "",
        memory.declaration_of("gram") or "",
        memory.state_of("gram"),
        memory.salt_of("gram"),
    )
    (kept,) = [f["key"] for f in g.record.facts if f["fact"] == "kept"]
    assert kept == keys.node_key(fixed, [keys.root_key(x)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        again = g.forward(x, store=store)
    assert g.record.outcome == {"gram": "recalled"} and torch.equal(again, lowered)
    assert torch.equal(g.forward(x, store=store), plain)
    assert g.record.outcome == {"gram": "recalled"}
    assert _outcome_in_float64(g, x, store) == {"gram": "ran"}
    if hasattr(torch.backends.mkldnn, "matmul"):  # torch's per-backend precision
        try:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
            g.forward(x, store=store)
            assert g.record.outcome == {"gram": "ran"}
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = "none"
    g.forward(x, store=store)
    assert g.record.outcome == {"gram": "recalled"}


_SUMS = (
    "from somatize import Graph, Node\n"
    "class Sums(Node):\n"
    "    def forward(self, x, ctx):\n"
    "        a = torch.linspace(0, 1, x['n'] * x['n']).reshape(x['n'], x['n'])\n"
    "        return float((a @ a).sum())\n"
    "g = Graph.somatize(Sums().named('s').frozen().cached())\n"
)
"""A script's lines making ``g``, a graph of a cached node computing with torch that
answers a float (which needs no codec of torch's), once torch is imported."""


def test_a_plain_node_is_keyed_by_its_precision_where_only_torch_is_imported(
    tmp_path: pathlib.Path,
) -> None:
    """In a process that imported torch and not ``somatize.torch``, a cached node computing
    with torch under bf16 autocast (a float from a coordinate, which needs no codec of
    torch's) is keyed by that precision all the same: its answer was recalled for the
    float32 call after it. The forward imports ``somatize.torch`` to read the precision."""
    code = "import sys, torch\n" + _SUMS
    code += (
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    lowered = g.forward({'n': 7}, store=sys.argv[1])\n"
        "plain = g.forward({'n': 7}, store=sys.argv[1])\n"
        "assert g.record.outcome == {'s': 'ran'}, g.record.outcome\n"
        "assert plain != lowered, (plain, lowered)\n"
        "assert 'somatize.torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)


def test_a_forward_with_a_store_runs_where_torch_is_imported_without_numpy(
    tmp_path: pathlib.Path,
) -> None:
    """torch installed on its own needs no numpy, and ``somatize.torch`` does: a forward
    with a store in a process that imported torch reads the precision all the same (the
    autocast, which torch itself says), rather than failing every forward on the import
    of ``somatize.torch``; its answers are kept and recalled, and one computed under bf16
    autocast is not recalled for the float32 call."""
    code = (
        "import sys, warnings\n"
        "sys.modules['numpy'] = None  # as if it were not installed\n"
        "warnings.simplefilter('ignore')  # torch warns it found no numpy\n"
        "import torch\n"
    )
    code += _SUMS
    code += (
        "plain = g.forward({'n': 7}, store=sys.argv[1])\n"
        "assert g.forward({'n': 7}, store=sys.argv[1]) == plain\n"
        "assert g.record.outcome == {'s': 'recalled'}, g.record.outcome\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    lowered = g.forward({'n': 7}, store=sys.argv[1])\n"
        "assert g.record.outcome == {'s': 'ran'}, g.record.outcome\n"
        "assert plain != lowered, (plain, lowered)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)


def test_a_node_below_a_plain_node_run_under_autocast_is_keyed_apart(store: Store) -> None:
    """A cached node that reads what a plain node computed under autocast, and the items of
    a mapped plain node, are keyed by that precision too: a module, which names its own
    precision, whose input was computed in bf16, and each item's answer."""
    encoder = _encoder()
    g = Graph.somatize(
        Gram().named("gram").frozen() >> smt.ModuleNode(encoder).named("encoder").frozen().cached()
    )
    smt.freeze(g)
    x = Opaque(torch.randn(6, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lowered = g.forward(x, store=store)
    assert g.forward(x, store=store).dtype == torch.float32
    assert g.record is not None and g.record.outcome == {"gram": "ran", "encoder": "ran"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(g.forward(x, store=store), lowered)
    assert g.record.outcome == {"gram": "spared", "encoder": "recalled"}
    items = [Opaque(torch.randn(3, 3)) for _ in range(2)]
    mapped = Graph.somatize(Grams().named("gram").frozen().cached().mapped())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {a.dtype for a in mapped.forward(items, store=store)} == {torch.bfloat16}
    assert {a.dtype for a in mapped.forward(items, store=store)} == {torch.float32}
    assert mapped.record is not None and mapped.record.outcome == {"gram": "ran"}


def test_a_cached_plain_node_on_a_worker_is_keyed_as_where_the_graph_is_called(
    store: Store,
) -> None:
    """A cached plain node placed on a local or network worker, called under bf16 autocast,
    computes in bf16 there and is kept under the key the same call here names: recalled
    here under autocast, and never for a float32 call."""
    from somatize import Broker, Worker

    for mode in ("local", "network"):
        g = Graph.somatize(Gram().named("gram").frozen().cached().at("w1"))
        x = Opaque(torch.randn(4, 4))
        broker = Broker.embedded({"w1": Worker.generic(mode=mode)})
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                there = g.forward(x, store=store, broker=broker)
                assert there.dtype == torch.bfloat16
                assert torch.equal(g.forward(x, store=store), there)
                assert g.record is not None and g.record.outcome == {"gram": "recalled"}
            plain = g.forward(x, store=store, broker=broker)
            assert g.record.outcome == {"gram": "ran"} and plain.dtype == torch.float32
        finally:
            broker.close()


def test_a_network_worker_refuses_a_plain_node_keyed_in_another_precision() -> None:
    """A network worker in the process the graph is called in (an embedded broker's), whose
    process computes in another precision than the key of the job's node names (another
    default dtype set since the graph was called: a setting of the whole process, which it
    does not set for one job while other threads compute in it) refuses to run it, saying
    so, rather than keep under that key an answer it does not describe."""
    from somatize.broker.host import Host, job_for
    from somatize.catalog import blueprint_of
    from somatize.node import Context

    g = Graph.somatize(Gram().named("gram").frozen().cached().at("w1"))
    blueprint = blueprint_of(g.node("gram"), "gram")
    ctx = Context(name="gram", key="blake3:" + "0" * 64, worker="w1", store=None)
    x = torch.randn(3, 3)
    job, sent = job_for(g, "gram", "w1", blueprint, [x], ctx, keep=False)
    assert job.precision == ()
    made = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(
            Unbuildable,
            match=r"`gram` on worker `w1` would run in default float64.*changed since the forward",
        ):
            Host("w1").run(job, sent)
    finally:
        torch.set_default_dtype(made)
    assert Host("w1").run(job, sent).kept is None  # in the precision its key names, it runs


class MadeIn(Node):
    """Answers the dtype of a tensor it makes and how float32 products are computed on the
    host, as its process has them set."""

    def forward(self, x: Any, ctx: Any) -> list[str]:
        return [str(torch.ones(1).dtype), host_float32_products()]


class Float64Meanwhile(Node):
    """Passes its input on, having had another thread make float64 the default dtype as it
    ran the first time: a setting of the whole process changed while the forward runs."""

    def __init__(self) -> None:
        self._first = True

    def forward(self, x: Any, ctx: Any) -> Any:
        if not self._first:
            return x
        self._first = False
        meanwhile = threading.Thread(target=torch.set_default_dtype, args=(torch.float64,))
        meanwhile.start()
        meanwhile.join()
        return x


def test_a_worker_runs_a_plain_node_in_the_precision_its_forward_began_in(store: Store) -> None:
    """A plain node on a network worker whose key names the precision the forward was
    called in (torch's default) is run in that one, or refused, when another thread set
    another default dtype since the forward began: the job named the precision in force as
    it was sent, so the embedded worker, finding it in force, ran the node in float64 and
    kept its answer under the key of the float32 call, and a forward in float32 recalled
    it; a Ray actor would have set float64 for it. The embedded worker now refuses it,
    nothing kept, and a job says the precision the node is keyed in."""
    from somatize import Broker, Worker
    from somatize.broker.host import job_for
    from somatize.catalog import blueprint_of
    from somatize.node import Context

    g = Graph.somatize(
        Float64Meanwhile().named("meanwhile").frozen()
        >> MadeIn().named("made").frozen().cached().at("w1")
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    made = torch.get_default_dtype()
    try:
        with pytest.raises(
            Unbuildable, match=r"`made` on worker `w1` would run in default float64"
        ):
            g.forward(1, store=store, broker=broker)
        torch.set_default_dtype(made)
        assert g.forward(1, store=store, broker=broker)[0] == "torch.float32"
        assert g.record is not None and g.record.outcome["made"] == "ran"
    finally:
        torch.set_default_dtype(made)
        broker.close()
    blueprint = blueprint_of(g.node("made"), "made")
    ctx = Context(name="made", key="blake3:" + "0" * 64, worker="w1", store=None)
    with matmul_in_tf32():  # set since the forward, keyed in the default precision, began
        job, _ = job_for(g, "made", "w1", blueprint, [1], ctx, keep=False)
    assert job.precision == ()


def test_a_worker_of_its_own_process_runs_a_plain_node_in_the_settings_its_key_names() -> None:
    """A network worker in a process of its own that runs one job at a time (a Ray actor)
    runs a plain node in the default dtype and float32 precision its key names, whatever its
    process sets, and puts its own back after: it refused it (Unbuildable) for a graph
    called with TF32 set, as Lightning's warning asks, where the worker's process had not,
    and the other way round."""
    from somatize.broker.host import Host, Reply, job_for, unpack
    from somatize.catalog import blueprint_of
    from somatize.node import Context

    g = Graph.somatize(MadeIn().named("made").frozen().cached().at("w1"))
    blueprint = blueprint_of(g.node("made"), "made")
    ctx = Context(name="made", key="blake3:" + "0" * 64, worker="w1", store=None)
    host = Host("w1", apart=True)
    with matmul_in_tf32():
        tf32 = dataclasses.replace(ctx, precision=precision_now())
        job, sent = job_for(g, "made", "w1", blueprint, [1], tf32, keep=False)
    usual = host_float32_products()
    reply = host.run(job, sent)
    assert isinstance(reply, Reply)
    assert unpack(reply.codec, reply.data) == ["torch.float32", "tf32"]
    assert host_float32_products() == usual
    job, sent = job_for(g, "made", "w1", blueprint, [1], ctx, keep=False)
    made = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with matmul_in_tf32():
            reply = host.run(job, sent)
            assert isinstance(reply, Reply)
            dtype, products = unpack(reply.codec, reply.data)
            assert dtype == "torch.float32" and products == "full"
            assert host_float32_products() == "tf32"
            assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(made)
    # cuBLAS's half-precision settings are not entered: the job is refused, saying so.
    half = (("cuda.matmul.allow_fp16_accumulation", "True"),)
    elsewhere = dataclasses.replace(job, precision=half)
    with pytest.raises(Unbuildable, match=r"names cuda.matmul.allow_fp16.*could not set the"):
        host.run(elsewhere, sent)
    assert torch.get_default_dtype() == made


def test_a_cached_plain_node_called_in_two_precisions_from_two_threads_keys_each_as_it_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph of a cached plain node forwarded from two threads at once, one under bf16
    autocast (kept by torch per thread), keys each call by the precision of its own
    thread, however they interleave: a call under autocast planning after a float32 one
    is keyed in bf16, and each is recalled for its own precision only."""
    g = Graph.somatize(Gram().named("gram").frozen().cached())
    x = Opaque(torch.randn(4, 4))
    got = _under_autocast_meanwhile(g, x, store, lambda: g.forward(x, store=store), monkeypatch)
    assert g.forward(x, store=store).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(g.forward(x, store=store), got)
    assert g.record is not None and g.record.outcome == {"gram": "recalled"}


def test_freezing_an_undeclared_node_is_an_error() -> None:
    """Naming a node that is not declared frozen is refused, not skipped."""
    g = Graph.somatize(
        smt.ModuleNode(_encoder()).named("encoder").frozen()
        >> smt.ModuleNode(nn.Linear(4, 1)).named("head")
    )
    with pytest.raises(smt.NotDeclaredFrozen, match="`head` is not declared frozen"):
        smt.freeze(g, "head")
    assert smt.freeze(g, "encoder").keys() == {"encoder"}


def test_nothing_to_freeze_is_an_error() -> None:
    """A graph without a frozen torch node says so instead of doing nothing."""
    with pytest.raises(smt.NothingToFreeze, match="no frozen torch node"):
        smt.freeze(Graph.somatize(Count().frozen()))
    with pytest.raises(smt.NotATorchNode, match="holds no torch module"):
        smt.freeze(Graph.somatize(Count().named("count").frozen()), "count")
    with pytest.raises(TypeError, match="takes a somatize Graph"):
        smt.freeze(nn.Linear(2, 2))  # type: ignore[arg-type]


def test_unsettled_torch_node_is_refused_by_the_core(store: Store) -> None:
    """A frozen, cached module node run before freeze gets the core's NotSettled refusal."""
    g = Graph.somatize(smt.ModuleNode(_encoder()).named("encoder").frozen().cached())
    with pytest.raises(NotSettled, match=r"somatize\.torch\.freeze"):
        g.forward(Opaque(torch.randn(3, 6)), store=store)


class Scorer(Node, nn.Module):
    """A node that is itself an ``nn.Module``: a torch node, frozen by ``freeze``."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.linear = nn.Linear(2, 1)

    def forward(self, x: Any, ctx: Any) -> float:  # type: ignore[override]
        with torch.no_grad():
            return float(self.linear(torch.ones(2)))


def test_an_unfrozen_node_that_is_a_module_is_refused_and_frozen_keys_by_its_weights(
    store: Store,
) -> None:
    """A frozen, cached node that is itself an ``nn.Module`` holds weights: run before
    ``freeze`` it is refused (it was keyed by its class alone, and another instance with
    other weights recalled the first one's answer); frozen, its weights are in its key."""
    first, second = Scorer(), Scorer()
    with torch.no_grad():
        second.linear.bias.add_(1.0)
    g = Graph.somatize(first.named("score").frozen().cached())
    with pytest.raises(
        NotSettled, match=r"`score` is declared frozen .* Call `somatize\.torch\.freeze\(g\)`"
    ):
        g.forward(1, store=store)
    smt.freeze(g)
    assert g.forward(1, store=store) == first(1, None)
    h = Graph.somatize(second.named("score").frozen().cached())
    smt.freeze(h)
    assert h.forward(1, store=store) == second(1, None) != first(1, None)
    assert h.record is not None and h.record.outcome == {"score": "ran"}


def test_weights_changed_in_a_frozen_node_that_is_a_module_are_seen_at_the_next_forward(
    store: Store,
) -> None:
    """A frozen, cached node that is itself an ``nn.Module`` whose checkpoint is loaded, whose
    weights are changed in place or whose part is replaced after ``freeze`` is keyed by
    its new state at the next forward, as a ``ModuleNode`` is: its answer for the weights
    it was frozen at was recalled for every weights after. A part of it put in train mode
    directly is put back in eval, with a warning, before its answer is recalled."""
    scorer = Scorer()
    g = Graph.somatize(scorer.named("score").frozen().cached())
    smt.freeze(g)
    first = g.forward(1, store=store)
    assert g.forward(1, store=store) == first
    assert g.record is not None and g.record.outcome == {"score": "recalled"}
    scorer.load_state_dict({name: t + 1.0 for name, t in scorer.state_dict().items()})
    loaded = g.forward(1, store=store)
    assert g.record.outcome == {"score": "ran"}
    assert loaded == scorer(1, None) != first
    with torch.no_grad():
        scorer.linear.bias.mul_(3.0)
    assert g.forward(1, store=store) == scorer(1, None) != loaded
    assert g.record.outcome == {"score": "ran"}
    scorer.linear = nn.Linear(2, 1)
    replaced = g.forward(1, store=store)
    assert g.record.outcome == {"score": "ran"}
    assert replaced == scorer(1, None)
    assert not scorer.linear.training and not scorer.linear.weight.requires_grad
    assert g.forward(1, store=store) == replaced
    assert g.record.outcome == {"score": "recalled"}
    scorer.linear.train()
    with pytest.warns(smt.StillChanging, match="`score` is frozen, and `linear`"):
        assert g.forward(1, store=store) == replaced
    assert g.record.outcome == {"score": "recalled"} and not scorer.linear.training


def test_two_frozen_nodes_that_are_modules_alike_when_built_each_answer_from_their_own(
    store: Store,
) -> None:
    """Two frozen nodes that are themselves ``nn.Module`` objects, their states digested
    alike (a scorer and a copy of it), are two nodes of a graph built with both, as two
    ``ModuleNode`` objects alike are: the node's class writes no ``restate`` of its own, so
    they were interned into one, and a checkpoint loaded into the one that did not run was
    never heard, the graph answering its branch from the other's weights."""
    scorer = Scorer()
    smt.freeze(Graph.somatize(scorer.named("score").frozen().cached()))
    twin = copy.deepcopy(scorer).named("twin")
    g = Graph.somatize((scorer, twin))
    assert set(g.nodes()) == {"score", "twin"}
    with torch.no_grad():
        twin.linear.bias.add_(5.0)
    for kept in (None, store, store):
        assert g.forward(1, store=kept) == (scorer(1, None), twin(1, None))


class Keeps(Node):
    """A plain node that keeps a module it made: weights its class does not say it holds."""

    def __init__(self) -> None:
        self.linear = nn.Linear(2, 1)
        self.act = nn.ReLU()  # no weights: nothing to settle

    def forward(self, x: Any, ctx: Any) -> float:
        with torch.no_grad():
            return float(self.linear(torch.ones(2)))


class KeepsListed(Node):
    """A plain node that keeps the modules it made in a list."""

    def __init__(self) -> None:
        self.layers = [nn.ReLU(), nn.Linear(2, 1)]

    def forward(self, x: Any, ctx: Any) -> float:
        with torch.no_grad():
            return float(self.layers[1](torch.ones(2)))


class KeepsSettled(Keeps):
    """The same, saying the digest of the weights it keeps."""

    def settled_state(self) -> str:
        return smt.digest_named(dict(self.linear.state_dict()))


def test_a_frozen_node_keeping_a_module_with_weights_is_refused_until_settled(
    store: Store,
) -> None:
    """A frozen, cached plain node keeping a module with weights as an attribute was keyed by
    its class alone, and another instance with other weights recalled the first one's
    answer. It is refused before anything runs, naming the attribute and the ways to settle
    it; with a ``settled_state()``, ``settle(g)`` puts the weights' digest in its key."""
    from somatize.data import settle

    g = Graph.somatize(Keeps().named("keeps").frozen().cached())
    said = (
        r"`keeps` is declared frozen and keeps `self\.linear`, an nn\.Module with weights"
        r".*ModuleNode.*settled_state"
    )
    with pytest.raises(NotSettled, match=said):
        g.forward(1, store=store)
    assert isinstance(g.forward(1), float)  # with no store nothing is kept: it runs
    listed = Graph.somatize(KeepsListed().named("listed").frozen().cached())
    with pytest.raises(NotSettled, match=r"keeps `self\.layers`, holding an nn\.Module"):
        listed.forward(1, store=store)
    first, second = KeepsSettled(), KeepsSettled()
    with torch.no_grad():
        second.linear.bias.add_(1.0)
    answers = []
    for node in (first, second):
        h = Graph.somatize(node.named("keeps").frozen().cached())
        settle(h)
        answers.append(h.forward(1, store=store))
        assert h.record is not None and h.record.outcome == {"keeps": "ran"}
    assert answers == [first.forward(1, None), second.forward(1, None)]
    assert answers[0] != answers[1]


def test_frozen_module_node_is_recalled_by_content(store: Store) -> None:
    """The second forward on an equal batch recalls; another batch, or new weights, runs."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
    smt.freeze(g)
    x = torch.randn(3, 6)
    first = g.forward(Opaque(x), store=store)
    again = g.forward(Opaque(x.clone()), store=store)
    assert g.record is not None and g.record.outcome == {"encoder": "recalled"}
    assert torch.equal(first, again)
    g.forward(Opaque(torch.randn(3, 6)), store=store)
    assert g.record.outcome == {"encoder": "ran"}
    with torch.no_grad():
        encoder.linear.bias.add_(1.0)
    smt.freeze(g)
    changed = g.forward(Opaque(x), store=store)
    assert g.record.outcome == {"encoder": "ran"}
    assert not torch.equal(changed, first)


def test_weights_changed_after_freezing_are_seen_at_the_next_forward(store: Store) -> None:
    """A checkpoint loaded into a frozen module, or a submodule replaced, after ``freeze``
    keys the node by its new state at the next forward: it runs, and nothing computed with
    the old weights is recalled."""
    encoder = _encoder()
    g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
    smt.freeze(g)
    x = torch.randn(3, 6)
    first = g.forward(Opaque(x), store=store)
    torch.manual_seed(7)
    encoder.load_state_dict(Encoder().state_dict())
    loaded = g.forward(Opaque(x), store=store)
    assert g.record is not None and g.record.outcome == {"encoder": "ran"}
    with torch.no_grad():
        assert torch.equal(loaded, encoder(x)) and not torch.equal(loaded, first)
    encoder.linear = nn.Linear(6, 4)
    replaced = g.forward(Opaque(x), store=store)
    assert g.record.outcome == {"encoder": "ran"}
    assert not encoder.linear.training and not encoder.linear.weight.requires_grad
    with torch.no_grad():
        assert torch.equal(replaced, encoder(x))
    assert torch.equal(g.forward(Opaque(x), store=store), replaced)
    assert g.record.outcome == {"encoder": "recalled"}
    nn.Linear(6, 4)  # parts given to another module: this one is looked at, and unchanged
    assert torch.equal(g.forward(Opaque(x), store=store), replaced)
    assert g.record.outcome == {"encoder": "recalled"}
    encoder.linear.bias = nn.Parameter(torch.ones(4))  # then one of its own is replaced
    assert not torch.equal(g.forward(Opaque(x), store=store), replaced)
    assert g.record.outcome == {"encoder": "ran"}
    encoder.linear.bias = None  # torch tells no hook of this one
    without = g.forward(Opaque(x), store=store)
    assert g.record.outcome == {"encoder": "ran"}
    with torch.no_grad():
        assert torch.equal(without, encoder(x))


class Times(Node):
    """Multiplies what it is handed by ``by``."""

    def __init__(self, by: float) -> None:
        self.by = by

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x * self.by


def test_a_frozen_module_two_graphs_hold_is_keyed_by_its_new_state_in_both(store: Store) -> None:
    """A frozen module node two graphs are built with (an encoder two pipelines share) whose
    checkpoint is loaded, or whose setting is changed, is keyed by what it is now in both,
    whichever runs first: a change is told once, to the graph that asks first, and the
    other went on keying the node by its old weights, and recalled what they computed."""
    encoder = Scaled(2.0)
    node = smt.ModuleNode(encoder).named("encoder").frozen().cached()
    first = Graph.somatize(node >> Times(2.0).named("head").frozen().cached())
    second = Graph.somatize(node >> Times(3.0).named("head").frozen().cached())
    smt.freeze(first)
    smt.freeze(second)
    x = torch.randn(3, 6)
    first.forward(Opaque(x), store=store)
    second.forward(Opaque(x), store=store)
    torch.manual_seed(7)
    encoder.linear.load_state_dict(nn.Linear(6, 4).state_dict())
    first.forward(Opaque(x), store=store)
    answer = second.forward(Opaque(x), store=store)
    # The encoder's new answer is the one the first graph kept, under the same key.
    assert second.record is not None
    assert second.record.outcome == {"encoder": "recalled", "head": "ran"}
    with torch.no_grad():
        assert torch.equal(answer, encoder(x) * 3.0)
    encoder.temperature = 4.0
    first.forward(Opaque(x), store=store)
    answer = second.forward(Opaque(x), store=store)
    assert second.record.outcome == {"encoder": "recalled", "head": "ran"}
    with torch.no_grad():
        assert torch.equal(answer, encoder(x) * 3.0)
    assert torch.equal(second.forward(Opaque(x), store=store), answer)
    assert second.record.outcome == {"encoder": "spared", "head": "recalled"}
    torch.manual_seed(8)
    encoder.linear.load_state_dict(nn.Linear(6, 4).state_dict())
    smt.freeze(first)  # frozen again there, by hand
    answer = second.forward(Opaque(x), store=store)
    assert second.record.outcome == {"encoder": "ran", "head": "ran"}
    with torch.no_grad():
        assert torch.equal(answer, encoder(x) * 3.0)


def test_two_frozen_modules_alike_when_built_each_answer_from_their_own_weights(
    store: Store,
) -> None:
    """Two frozen module nodes whose states were digested alike (an encoder and a copy of
    it, frozen in another graph) are two nodes of a graph built with both, each answering
    from its own weights: one whose checkpoint was loaded since, before the build or after
    it, was interned into the other as one computation, as two settled nodes alike are, and
    the graph answered its branch from the other's module, with or without a store."""
    torch.manual_seed(0)
    encoder = smt.ModuleNode(Scaled(2.0)).named("encoder").frozen()
    smt.freeze(Graph.somatize(encoder))
    x = torch.randn(3, 6)
    for loaded_before_build in (True, False):
        twin = copy.deepcopy(encoder).named("twin")
        if loaded_before_build:
            torch.manual_seed(7)
            twin.module.linear.load_state_dict(nn.Linear(6, 4).state_dict())
        g = Graph.somatize(
            (
                encoder >> Times(2.0).named("head").frozen().cached(),
                twin >> Times(2.0).named("twin_head").frozen().cached(),
            )
        )
        if not loaded_before_build:
            torch.manual_seed(7)
            twin.module.linear.load_state_dict(nn.Linear(6, 4).state_dict())
        for kept in (None, store, store):
            ours, theirs = g.forward(Opaque(x), store=kept)
            with torch.no_grad():
                assert torch.equal(ours, encoder.module(x) * 2.0)
                assert torch.equal(theirs, twin.module(x) * 2.0)
                assert not torch.equal(ours, theirs)


class Gated(nn.Module):
    """A linear layer and an activation with no weights of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)
        self.act: nn.Module = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x.to(self.linear.weight.dtype)))


def _frozen_node(module: nn.Module, name: str) -> Graph:
    """A graph of ``module`` as its one node ``name``, frozen and cached, frozen at it."""
    g = Graph.somatize(smt.ModuleNode(module).named(name).frozen().cached())
    smt.freeze(g)
    return g


def test_a_part_without_weights_replaced_or_a_conversion_is_seen(store: Store) -> None:
    """An activation replaced (the weights digest as they did) and the module converted
    to another dtype (no version counter moves) after ``freeze``: the next forward runs,
    and answers what the module answers now."""
    torch.manual_seed(0)
    module = Gated()
    g = _frozen_node(module, "gated")
    x = Opaque(torch.randn(3, 6))
    g.forward(x, store=store)
    module.act = nn.Tanh()
    tanh = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"gated": "ran"}
    with torch.no_grad():
        assert torch.equal(tanh, module(x.value))
    module.double()
    doubled = g.forward(x, store=store)
    assert g.record.outcome == {"gated": "ran"} and doubled.dtype == torch.float64
    assert torch.equal(g.forward(x, store=store), doubled)
    assert g.record.outcome == {"gated": "recalled"}


class Square(nn.Module):
    """One linear layer without a bias, 32 wide (its weight a 4 KiB block of memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _frozen_square(module: Square | None = None) -> tuple[Square, Graph, Opaque]:
    """A :class:`Square` (seeded, or ``module``), cached in a graph frozen at it, and an
    input for it."""
    if module is None:
        torch.manual_seed(0)
        module = Square()
    g = _frozen_node(module, "square")
    return module, g, Opaque(torch.randn(4, 32))


def _fused_steps(module: nn.Module, drop: bool) -> None:
    """Three steps of a fused AdamW on ``module`` (no version counter moves), its
    gradients dropped after the last one if ``drop``."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1, fused=True)
    for _ in range(3):
        optimizer.zero_grad()
        module(torch.randn(4, 32)).pow(2).sum().backward()
        optimizer.step()
    if drop:
        optimizer.zero_grad()


def test_weights_a_fused_optimizer_stepped_are_seen_once_frozen_again(store: Store) -> None:
    """A frozen, cached module unfrozen, stepped by a fused optimizer (which moves no
    version counter) and frozen again answers with its new weights: the gradients the
    steps left are seen; and once a forward refused it unfrozen, it is digested again
    when frozen again, even with its gradients dropped."""
    module, g, x = _frozen_square()
    g.forward(x, store=store)
    module.requires_grad_(True)
    _fused_steps(module, drop=False)
    module.requires_grad_(False)
    stepped = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"square": "ran"}
    with torch.no_grad():
        assert torch.equal(stepped, module(x.value))
    module.requires_grad_(True)
    with pytest.raises(smt.Unfrozen, match=r"freeze them again .* digested again"):
        g.forward(x, store=store)
    _fused_steps(module, drop=True)
    module.requires_grad_(False)
    again = g.forward(x, store=store)
    assert g.record.outcome == {"square": "ran"}
    with torch.no_grad():
        assert torch.equal(again, module(x.value)) and not torch.equal(again, stepped)


def test_a_round_trip_through_half_precision_is_seen(store: Store) -> None:
    """A module converted to half precision and back has rounded weights, often in the
    very memory it had before (the allocator hands the freed block back) and no version
    counter moved: the next forward runs, and answers what the module answers now."""
    module, g, x = _frozen_square()
    for dtype in (torch.float16, torch.bfloat16):
        before = g.forward(x, store=store)
        module.to(dtype).float()
        after = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"square": "ran"}
        with torch.no_grad():
            assert torch.equal(after, module(x.value)) and not torch.equal(after, before)


def test_other_memory_at_the_same_address_is_seen(store: Store) -> None:
    """A weight given other memory (``p.data = t``) at the address its old memory, let
    go, had — here the same numpy buffer, taken as a new tensor after it was rewritten —
    is seen at the next forward: an equal address is not taken for the same memory."""
    torch.manual_seed(0)
    module = Square()
    buffer = module.linear.weight.detach().numpy().copy()
    module.linear.weight.data = torch.from_numpy(buffer)
    module, g, x = _frozen_square(module)
    before = g.forward(x, store=store)
    address = module.linear.weight.data_ptr()
    buffer *= 2
    module.linear.weight.data = torch.from_numpy(buffer)
    assert module.linear.weight.data_ptr() == address
    after = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"square": "ran"}
    with torch.no_grad():
        assert torch.equal(after, module(x.value)) and torch.allclose(after, 2 * before)


class Adapted(nn.Module):
    """A layer and a trainable adapter beside it, as LoRA libraries put one in."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.delta = nn.Linear(32, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.delta(x)


def test_a_trainable_adapter_put_into_a_frozen_module_is_refused(store: Store) -> None:
    """Trainable parameters put into a frozen, cached module after ``freeze`` under new
    names are refused by name, as an unfrozen one is, not silently frozen; frozen
    themselves, the module is keyed by its new state."""
    module, g, x = _frozen_square()
    g.forward(x, store=store)
    module.linear = Adapted(module.linear)
    with pytest.raises(smt.Unfrozen, match=r"`linear.delta.weight` now require grad"):
        g.forward(x, store=store)
    assert module.linear.delta.weight.requires_grad
    module.linear.delta.requires_grad_(False)
    adapted = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"square": "ran"}
    with torch.no_grad():
        assert torch.equal(adapted, module(x.value))


def test_numpy_scalars_a_module_keeps_are_in_its_key(store: Store) -> None:
    """``np.float32`` and ``np.int64`` are no Python number subclasses: they are seen as
    the numbers they hold, of their numpy type (Python's arithmetic with a float32 is
    float32's), and a numeric array by its content."""
    module = Scaled(1.0)
    module.gain = np.float32(2.0)
    module.steps = np.int64(3)
    module.table = np.arange(4.0)
    settings = settings_of(module)
    assert settings["gain"] == {"numpy": ["float32", 2.0]}
    assert settings["steps"] == {"numpy": ["int64", 3]}
    module.gain = np.float64(2.0)  # a float subclass, which divides by zero otherwise
    assert settings_of(module)["gain"] == {"numpy": ["float64", 2.0]}
    plain = Scaled(1.0)
    plain.gain, plain.steps, plain.table = 2.0, 3, np.arange(4.0)
    assert settings_of(plain)["gain"] == 2.0 and settings_of(plain)["steps"] == 3
    assert "array" in settings["table"]
    other = Scaled(1.0)
    other.gain, other.steps, other.table = np.float32(2.0), np.int64(3), np.arange(4.0) + 1
    assert settings_of(other)["table"] != settings["table"]
    answers = []
    for gain in (np.float32(1.0), np.float32(2.0)):
        held = Scaled(1.0)
        held.gain = gain
        g = Graph.somatize(smt.ModuleNode(held).named("scaled").frozen().cached())
        smt.freeze(g)
        g.forward(Opaque(torch.randn(3, 6)), store=store)
        answers.append(g.record)
    assert [r.outcome["scaled"] for r in answers if r is not None] == ["ran", "ran"]


class Mode(enum.Enum):
    A = "a"


class Access(enum.IntFlag, boundary=enum.KEEP):
    """Flags that keep bits no member names: such a value has no name."""

    READ = 1
    WRITE = 2


class Held(nn.Module):
    """Scales its output by a value it keeps, of whichever kind: its weights and ``repr``
    are the same whatever it holds."""

    def __init__(self, held: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.held = held

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * _magnitude(self.held)


def _magnitude(value: Any) -> float:
    if isinstance(value, (set, frozenset, range, list)):
        return float(len(value))
    if isinstance(value, slice):  # how many of eight features it keeps
        return float(len(range(8)[value]))
    if isinstance(value, dict):
        return float(sum(value.values()))
    if isinstance(value, complex):
        return abs(value)
    if isinstance(value, np.datetime64):
        return float(value.astype("int64") % 7 + 1)
    if isinstance(value, pathlib.PurePath):
        return float(len(str(value)))
    return float(value)


def _held(value: Any) -> Any:
    """What :func:`settings_of` names of a value a module keeps (``"unseen"`` when it
    names nothing)."""
    module = nn.Linear(2, 2)
    module.held = value
    return settings_of(module).get("held", "unseen")


def _replaced_is_seen(before: Any, after: Any, store: Store) -> None:
    """A frozen cached ``Held`` given ``after`` in place of ``before`` runs again at its
    next forward, answering as the module does, and does not recall the answer kept
    before."""
    module = Held(before)
    g = _frozen_node(module, "held")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    module.held = after
    out = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"held": "ran"}, (before, after)
    with torch.no_grad():
        assert torch.equal(out, module(x.value))
    assert not torch.equal(out, first)


def test_a_setting_nested_at_any_depth_is_in_its_key(store: Store) -> None:
    """A config nested five levels deep keys apart from one that differs at the bottom; a
    list holding itself is named by where it refers back to, the same each time; one
    nested deeper than Python can follow is refused."""

    def config(scale: float) -> dict[str, Any]:
        return {"model": {"enc": {"layers": [{"scale": scale}]}}}

    assert _held(config(1.0)) != _held(config(100.0))
    module = Held(1.0)
    module.config = config(1.0)
    g = _frozen_node(module, "held")
    x = Opaque(torch.randn(3, 6))
    g.forward(x, store=store)
    module.config = config(100.0)
    smt.freeze(g)
    g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"held": "ran"}
    looped: list[Any] = [1.0]
    looped.append(looped)
    again: list[Any] = [1.0]
    again.append(again)
    other: list[Any] = [3.0]
    other.append(other)
    assert _held(looped) == _held(again) != _held(other)
    assert _held(looped) != _held([1.0, [1.0]])
    nested: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    with pytest.raises(NotCanonical, match=r"`held` is nested deeper"):
        _held(nested)


def test_a_dict_keyed_by_other_than_strings_is_in_its_key(store: Store) -> None:
    """A dict keyed by ints, floats or tuples keys apart by its entries, telling apart keys
    of different types (``1``, ``"1"``, ``1.0``, ``(1,)``) and taking its entries in an
    order of their own, the same in every process, with the order they were filled in
    beside; an entry replaced after freeze (``enc.scales[0] = 3.0``) is seen at the next
    forward."""
    assert _held({0: 1.0}) != _held({0: 3.0})
    assert len({repr(_held({key: 1.0})) for key in (1, "1", 1.0, (1,))}) == 4
    assert _held({2: "b", 1: "a"})["dict"] == _held({1: "a", 2: "b"})["dict"]
    assert _held({2: "b", 1: "a"}) != _held({1: "a", 2: "b"})
    module = Held({0: 1.0})
    g = _frozen_node(module, "held")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    module.held[0] = 3.0
    out = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"held": "ran"}
    assert not torch.equal(out, first)


class Layered(nn.Module):
    """Scales its output by items of lists held inside lists, tuples and dicts, itself and
    in a config (as a model keeps the widths of its stages, ``config.layers[0][1]``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.layers = [[1.0, 2.0], [3.0]]
        self.stages = ([1.0], {"deep": [[1.0]]})
        self.config = types.SimpleNamespace(layers=[[1.0, 2.0]], sizes={"a": {1.0}})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.layers[0][1] * self.stages[0][0] * self.stages[1]["deep"][0][0]
        scale *= self.config.layers[0][1] * sum(self.config.sizes["a"])
        return self.linear(x) * scale


def test_an_item_of_a_list_held_in_a_list_is_seen_at_the_next_call(store: Store) -> None:
    """An item of a list, dict or set held inside another container a cached module keeps,
    itself or in a config, set in place (``config.layers[0][1] = 5.0``) keys the next
    call anew: computed as the module computes it now, never the answer kept for the old
    value recalled; set back, the first answer is recalled."""
    module = Layered()
    ran = _cached_calls(module, "layered", store)
    first = ran("ran")
    changes: list[tuple[Any, Any, Any]] = [
        (module.layers[0], 1, 5.0),
        (module.stages[0], 0, 5.0),
        (module.stages[1]["deep"][0], 0, 5.0),
        (module.config.layers[0], 1, 5.0),
    ]
    for held, at, value in changes:
        was = held[at]
        held[at] = value
        assert not torch.equal(ran("ran"), first)
        held[at] = was
        ran("recalled")
    module.config.sizes["a"].add(4.0)
    assert not torch.equal(ran("ran"), first)


class Shelved(nn.Module):
    """Scales its output by how a config's table of small lists shares its items out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.config = types.SimpleNamespace(table={"a": [1.0, 2.0], "b": [3.0]})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.config.table["a"], self.config.table["b"]
        return self.linear(x) * (sum(a) * (1 + len(b)) + sum(b))


def test_an_item_moved_between_lists_held_in_a_table_is_seen(store: Store) -> None:
    """Lists held in a table a config keeps are looked at item by item, each by its
    length too: an item moved from the end of one to the start of the next, which leaves
    their items in the same order one after the other, keys the next call anew; moved
    back, the first answer is recalled."""
    module = Shelved()
    ran = _cached_calls(module, "shelved", store)
    first = ran("ran")
    table = module.config.table
    for one, other in (("a", "b"), ("b", "a")):
        table[other].insert(0, table[one].pop())
        assert not torch.equal(ran("ran"), first)
        table[one].append(table[other].pop(0))
        assert torch.equal(ran("recalled"), first)


class Patterned(nn.Module):
    """Scales its output by bytes of bytearrays it keeps, itself and in a config's list."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.pattern = bytearray(b"\x01\x02")
        self.config = types.SimpleNamespace(patterns=[bytearray(b"\x01")])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.pattern[0] * self.config.patterns[0][0]


def test_a_bytearray_written_in_place_is_seen_at_the_next_call(store: Store) -> None:
    """A bytearray a cached module keeps, itself or in a config's list, written in place
    (it is keyed by its bytes) keys the next call anew: computed as the module computes it
    now, never the answer kept for the old bytes; written back, the first is recalled."""
    module = Patterned()
    ran = _cached_calls(module, "patterned", store)
    first = ran("ran")
    for held in (module.pattern, module.config.patterns[0]):
        held[0] = 5
        assert not torch.equal(ran("ran"), first)
        held[0] = 1
        assert torch.equal(ran("recalled"), first)


def test_values_of_different_kinds_key_apart() -> None:
    """A tuple and a list of the same items, an enum member and its name, a dtype or a
    device and its name, a dict and an ``OrderedDict`` of the same entries: a forward can
    tell each from the other, so each is its own setting."""
    pairs = [
        ((1.0, 2.0), [1.0, 2.0]),
        (Mode.A, "Mode.A"),
        (Mode.A, "A"),
        (torch.float32, "torch.float32"),
        (torch.device("cpu"), "cpu"),
        ({"a": 1}, collections.OrderedDict(a=1)),
    ]
    for one, other in pairs:
        assert _held(one) != _held(other), (one, other)


class Weighted(nn.Module):
    """Concatenates its output scaled by each weight it keeps, in the dict's order."""

    def __init__(self, weights: dict[str, float]) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.weights = weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return torch.cat([h * w for w in self.weights.values()], -1)


def test_a_dict_a_module_keeps_keys_by_its_order(tmp_path: pathlib.Path) -> None:
    """A forward reads a dict in the order it was filled in, so the same entries in
    another order key apart: reordered in place after freeze, or filled in another order
    by another model on the same store, the module is computed anew, never answered with
    what was kept for the other order. A dict filled in sorted order keeps its name."""
    x = torch.randn(2, 3)
    torch.manual_seed(0)
    plain = Weighted({"a": 1.0, "b": 2.0})
    wrapped = smt.wrap(copy.deepcopy(plain), frozen=True, cached=True, store=tmp_path)
    smt.freeze(wrapped)
    assert torch.equal(wrapped(x), plain(x))
    for module in (wrapped.model, plain):
        module.weights["a"] = module.weights.pop("a")  # now b, a
    assert torch.equal(wrapped(x), plain(x))
    assert wrapped.counts["weighted"] == {"ran": 2, "kept": 2}

    torch.manual_seed(0)
    other = Weighted({"b": 2.0, "a": 1.0})
    again = smt.wrap(copy.deepcopy(other), frozen=True, cached=True, store=tmp_path)
    smt.freeze(again)
    assert torch.equal(again(x), other(x))
    assert _held({"a": 1, "b": 2}) == {"dict": [["a", 1], ["b", 2]]}
    assert _held({"b": 2, "a": 1}) != _held({"a": 1, "b": 2})
    assert _held(collections.OrderedDict(b=2, a=1)) != _held(collections.OrderedDict(a=1, b=2))


def test_an_enum_value_without_a_name_and_a_path_are_in_its_key(store: Store) -> None:
    """Flags holding bits no member names (which have no name), and paths, are each named
    by what they hold and their class: one replaced by another is computed anew, never
    the answer kept for the first recalled."""
    pairs = [
        (Access(16), Access(32)),
        (Access(0), Access(64)),
        (pathlib.Path("vocab.txt"), pathlib.Path("vocab-large.txt")),
        (pathlib.PurePosixPath("a"), pathlib.PureWindowsPath("a")),
        (pathlib.PurePosixPath("a"), "a"),
    ]
    for one, other in pairs:
        assert "unseen" != _held(one) != _held(other), (one, other)
    assert _held(Access.READ) == {"enum": [f"{__name__}:Access", "READ"]}
    for one, other in pairs[:3]:
        _replaced_is_seen(one, other, store)


def test_a_slice_a_module_keeps_is_in_its_key(store: Store) -> None:
    """A slice (``self.keep = slice(0, 64)``, the features a forward keeps) is named by its
    start, stop and step, apart from a range or a tuple of them: one replaced after freeze
    is computed anew, where it was unseen and the answer kept for the old one was
    recalled."""
    pairs = [
        (slice(0, 2), slice(0, 5)),
        (slice(1, None), slice(None, 1)),
        (slice(0, 4), slice(0, 4, 2)),
        (slice(0, 2), range(0, 2)),
        (slice(0, 2), (0, 2, None)),
    ]
    for one, other in pairs:
        assert "unseen" != _held(one) != _held(other), (one, other)
    assert _held(slice(0, 2)) == _held(slice(0, 2))
    _replaced_is_seen(slice(0, 2), slice(0, 5), store)


def test_a_numpy_array_in_another_byte_order_is_in_its_key() -> None:
    """A big-endian array is named by its values as a native one is, and by its dtype."""
    big = np.array([1.0], dtype=">f8")
    assert _held(big) != "unseen"
    assert _held(big) != _held(np.array([3.0], dtype=">f8"))
    assert _held(big) != _held(np.array([1.0], dtype=">f4"))


def test_numbers_sets_and_ranges_a_module_keeps_are_in_its_key(store: Store) -> None:
    """A complex number, a fraction, a decimal, a set and a range are each named by what
    they hold and their kind; a set's items are named in an order of their own, not of
    their hashes (which differ from one process to the next); one replaced after freeze,
    or a set added to, is seen at the next forward."""
    pairs = [
        (1 + 0j, 3 + 0j),
        (1 + 0j, 1.0),
        (fractions.Fraction(1, 3), fractions.Fraction(2, 3)),
        (fractions.Fraction(1), 1),
        (decimal.Decimal(1), decimal.Decimal(3)),
        (decimal.Decimal("1.0"), 1.0),
        ({1}, {1, 2, 3}),
        ({1}, frozenset({1})),
        ({1}, [1]),
        (range(1), range(3)),
        (range(3), [0, 1, 2]),
    ]
    for one, other in pairs:
        assert "unseen" != _held(one) != _held(other), (one, other)
    assert _held({"c", "a", "b"}) == {"set": ["a", "b", "c"]}
    for one, other in [*pairs[0:7:2], pairs[9]]:
        _replaced_is_seen(one, other, store)
    module = Held({4, 5})
    g = _frozen_node(module, "held")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    module.held.add(6)  # in place: seen as an item of a list or dict is
    assert not torch.equal(g.forward(x, store=store), first)
    assert g.record is not None and g.record.outcome == {"held": "ran"}


class Anchored(nn.Module):
    """Scales its output by numpy arrays it keeps, itself and in a config (as a detector
    keeps its anchors): its weights and ``repr`` are the same whatever they hold."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.anchors = np.ones(4, dtype=np.float32)
        self.config = types.SimpleNamespace(scales=np.ones(4, dtype=np.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = [self.anchors, self.config.scales]
        out = self.linear(x)
        for array in held:
            out = out * torch.from_numpy(array.reshape(-1)[:4])
        return out


def _cached_calls(module: nn.Module, name: str, store: Store) -> Callable[[str], torch.Tensor]:
    """Calls of a graph caching ``module`` frozen as node ``name`` on one input: each
    answers what the graph answered, checked to be what ``module`` computes now and to
    have been the outcome asked (``"ran"``, ``"recalled"``)."""
    g = Graph.somatize(smt.ModuleNode(module).named(name).frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(3, 6))

    def ran(outcome: str) -> torch.Tensor:
        out = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {name: outcome}
        with torch.no_grad():
            assert torch.equal(out, module(x.value))
        return out

    return ran


class _Scaler:
    """Scales what it is given by ``s``: a plain object whose method a module keeps."""

    def __init__(self, s: float) -> None:
        self.s = s

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


def test_a_value_the_object_of_a_kept_method_holds_keys_a_module_nodes_answers(
    store: Store,
) -> None:
    """A value the object a cached module's kept method is bound to holds
    (``self.act = scaler.apply``, then ``scaler.s = 3.0``) keys the next call anew, as a
    config the module holds does: computed as the module computes it now, never the
    answer kept for the old value; set back, that one is recalled. A method bound to a
    module is named by its code alone, as before."""
    scaler = _Scaler(2.0)
    ran = _cached_calls(Activated(scaler.apply), "act", store)
    first = ran("ran")
    scaler.s = 3.0
    assert not torch.equal(ran("ran"), first)
    scaler.s = 2.0
    ran("recalled")
    assert list(settings_of(Activated(nn.Linear(2, 2).forward))["act"]) == ["function"]


@pytest.mark.parametrize("where", ["module", "config"])
def test_a_numpy_array_written_in_place_is_seen_at_the_next_call(store: Store, where: str) -> None:
    """A numpy array a cached module keeps, itself or in a config it holds, written in
    place (numpy keeps no version counter) or reshaped, keys the next
    call anew: computed as the module computes it now, never the answer kept for the old
    values; written back, the first answer is recalled."""
    module = Anchored()
    array = module.anchors if where == "module" else module.config.scales
    ran = _cached_calls(module, "anchored", store)

    first = ran("ran")
    array[0] = 5.0
    assert not torch.equal(ran("ran"), first)
    array[0] = 1.0
    ran("recalled")
    array.shape = (2, 2)
    ran("ran")


def _peak_of_a_look(watch: Any) -> int:
    """The most memory Python allocated while ``watch`` looked, which saw no change."""
    import tracemalloc

    tracemalloc.start()
    try:
        assert not watch.changed()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_numpy_array_is_compared_in_place_at_each_call(store: Store) -> None:
    """A numpy array of many MiB a cached module keeps is looked at in place at each call,
    without a copy of its bytes, and a write in place anywhere in it (its last byte too) is
    still seen at the next call; written back, the first answer is recalled."""
    from somatize_torch._settings import SettingsWatch

    module = Anchored()
    module.anchors = np.ones(4 << 20, dtype=np.float32)  # 16 MiB
    ran = _cached_calls(module, "anchored", store)
    ran("ran")
    for at in (-1, 0, len(module.anchors) // 2):
        module.anchors[at] = 5.0
        ran("ran")
        module.anchors[at] = 1.0
        ran("recalled")
    watch = SettingsWatch(module)
    assert _peak_of_a_look(watch) < 2 << 20  # no copy of the array's 16 MiB
    module.anchors = np.asmatrix(np.ones((1024, 2048), dtype=np.float32))  # a subclass
    watch = SettingsWatch(module)
    assert not watch.changed()
    module.anchors[-1, -1] = 5.0
    assert watch.changed()
    # In Fortran order (as some loaders give a matrix), compared in place too.
    module.anchors = np.asfortranarray(np.ones((1024, 4096), dtype=np.float32))
    watch = SettingsWatch(module)
    assert _peak_of_a_look(watch) < 2 << 20
    for at in ((0, 1), (1, 0), (-1, -1)):
        module.anchors[at] = 5.0
        assert watch.changed()
        module.anchors[at] = 1.0
        assert not watch.changed()


def test_each_change_to_a_list_of_tensors_a_module_keeps_is_seen() -> None:
    """A plain list of tensors a module keeps for its forward (``self.scales =
    [torch.ones(3)]``) is looked at by each tensor's memory and version counter, and by
    the list's items: a write in place into any of them, one given other memory
    (``t.data = ...``, or memory made under ``torch.inference_mode()`` where its own was),
    one replaced, appended or taken out is seen; reading them is no change."""
    from somatize_torch._settings import SettingsWatch

    module = nn.Linear(3, 3)
    module.scales = [torch.ones(3) for _ in range(1000)]
    with torch.inference_mode():
        module.scales.append(torch.ones(3))  # keeps no version counter

    def given_inference_memory(tensor: torch.Tensor) -> None:
        with torch.inference_mode():
            same = torch.from_numpy(tensor.numpy())  # its own memory, at the same place
        tensor.data = same

    changes: list[Callable[[], Any]] = [
        lambda: module.scales[0].mul_(2.0),
        lambda: module.scales[-2][1].fill_(5.0),
        lambda: setattr(module.scales[3], "data", torch.zeros(3)),
        lambda: given_inference_memory(module.scales[4]),
        lambda: module.scales.__setitem__(5, torch.ones(3)),
        lambda: module.scales.append(torch.ones(3)),
        lambda: module.scales.pop(6),
        lambda: setattr(module, "scales", module.scales[:-1]),
    ]
    for change in changes:
        watch = SettingsWatch(module)
        assert torch.stack(module.scales).sum() > 0
        assert not watch.changed()
        change()
        assert watch.changed()
        assert watch.changed()  # and still, asked again


class Tabled(nn.Module):
    """Scales its output by what a table it keeps says, itself and in a config (as a
    tokenizer's vocabulary is kept)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.table = {"a": 1, "b": 2, "c": 3}
        self.config = types.SimpleNamespace(table={"a": 1, "b": 2, "c": 3})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tables = [self.table, self.config.table]
        scale = sum(len(k) * float(v) for table in tables for k, v in table.items())
        return self.linear(x) * scale


@pytest.mark.parametrize("where", ["module", "config"])
def test_each_change_to_a_dict_a_cached_module_keeps_is_seen_at_the_next_call(
    store: Store, where: str
) -> None:
    """A dict a cached module keeps, itself or in a config, looked at by its version where
    CPython keeps one rather than item by item: each kind of change to it — a value
    replaced, by an equal one of another kind too, a key swapped for another, an item
    popped and put back last, the dict cleared and filled, merged into — keys the next
    call anew, computed as the module computes it now; put back as it was, the answer
    kept for it is recalled."""
    from somatize_torch._settings import _dict_version

    plain_cpython = sys.implementation.name == "cpython" and sys.version_info < (3, 13)
    if plain_cpython and not sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert _dict_version is not None  # the versions are what is looked at here
    module = Tabled()
    table = module.table if where == "module" else module.config.table
    g = _frozen_node(module, "tabled")
    x = Opaque(torch.randn(3, 6))
    g.forward(x, store=store)
    changes = [
        lambda: table.__setitem__("a", 5),
        lambda: table.__setitem__("a", 5.0),
        lambda: (table.__delitem__("b"), table.__setitem__("bb", 2)),
        lambda: table.__setitem__("c", table.pop("a")),
        lambda: (table.clear(), table.update(a=7, b=8, c=9)),
        lambda: table.__ior__({"d": 1}),
        lambda: table.setdefault("e", 0),
        lambda: table.popitem(),  # the table as it was two calls before: recalled
    ]
    for at, change in enumerate(changes):
        change()
        out = g.forward(x, store=store)
        outcome = "recalled" if at == len(changes) - 1 else "ran"
        assert g.record is not None and g.record.outcome == {"tabled": outcome}, table
        with torch.no_grad():
            assert torch.equal(out, module(x.value))


class Gained:
    """A config whose class gives what the module computes with."""

    def __init__(self) -> None:
        self.flag = True

    @property
    def gain(self) -> float:
        return 1.0


class Tripled(Gained):
    @property
    def gain(self) -> float:
        return 3.0


class ReadsGain(nn.Module):
    """Scales by what its config's class gives, and by the tensors it keeps in a list and
    a dict."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.config = Gained()
        self.config.scales = {"all": [torch.ones(4)]}
        self.offsets = [torch.zeros(4)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.config.gain + self.offsets[0]
        return out * self.config.scales["all"][0]


class Negated(ReadsGain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -super().forward(x)


@pytest.mark.parametrize("change", ["config class", "module class", "listed", "nested"])
def test_a_class_swapped_or_a_tensor_in_a_container_written_is_seen_at_the_next_call(
    store: Store, change: str
) -> None:
    """A config or a module given another class in place (``config.__class__ = ...``, as
    some libraries do), or a tensor a module or its config keeps in a list or dict written
    in place, keys the next call anew: computed as the module computes it now, not the
    answer kept before recalled (as drifted, the class's code being other)."""
    module = ReadsGain()
    g = _frozen_node(module, "gain")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    if change == "config class":
        module.config.__class__ = Tripled
    elif change == "module class":
        module.__class__ = Negated
    elif change == "listed":
        module.offsets[0].add_(1.0)
    else:
        module.config.scales["all"][0].mul_(2.0)
    out = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"gain": "ran"}
    with torch.no_grad():
        assert torch.equal(out, module(x.value))
    assert not torch.equal(out, first)


@pytest.mark.parametrize("whose", ["config", "module"])
def test_a_table_of_attributes_replaced_whole_is_seen_at_the_next_call(
    store: Store, whose: str
) -> None:
    """A config's or a module's table of attributes replaced by another
    (``config.__dict__ = {...}``), of the same length, keys the next call anew: computed
    as the module computes it now, not the answer kept for the old table recalled."""
    module = ReadsGain()
    g = _frozen_node(module, "gain")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    if whose == "config":
        module.config.__dict__ = {"flag": True, "scales": {"all": [torch.full((4,), 3.0)]}}
    else:
        module.__dict__ = {**vars(module), "offsets": [torch.ones(4)]}
    out = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"gain": "ran"}
    with torch.no_grad():
        assert torch.equal(out, module(x.value))
    assert not torch.equal(out, first)


class FlaggedByName(nn.Module):
    """Reads a flag from each config it keeps in a dict, beside a vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.configs = {f"w{i}": i for i in range(1000)}
        self.configs["main"] = types.SimpleNamespace(flag=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flags = [c.flag for c in self.configs.values() if isinstance(c, types.SimpleNamespace)]
        return self.linear(x) * (1 + sum(flags))


def test_a_config_put_in_a_dict_after_a_run_is_watched_at_the_next_call(store: Store) -> None:
    """A config put into a dict a cached module keeps, after the module ran, keys the next
    call anew, and is watched from then on as the others are: a flag set on it later is
    seen at the call after (the dict is not taken for the one looked through before)."""
    module = FlaggedByName()
    g = _frozen_node(module, "flagged")
    x = Opaque(torch.randn(3, 6))

    def ran(outcome: str) -> None:
        out = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"flagged": outcome}
        with torch.no_grad():
            assert torch.equal(out, module(x.value))

    ran("ran")
    ran("recalled")
    added = types.SimpleNamespace(flag=False)
    module.configs["added"] = added
    ran("ran")
    added.flag = True
    ran("ran")
    module.configs["main"].flag = True
    ran("ran")


def test_a_numpy_scalar_holding_no_python_number_is_in_its_key(store: Store) -> None:
    """A ``datetime64`` is named by its count of units and its unit; kept by a module, it
    keys it, its replacement anew."""
    day = np.datetime64("2020-01-01")
    assert _held(day) != _held(np.datetime64("2020-01-03"))
    assert _held(day) != _held(np.datetime64("2020-01-01T00:00"))
    _replaced_is_seen(day, np.datetime64("2020-01-03"), store)


def test_an_item_that_cannot_be_named_keeps_its_container_in_the_key() -> None:
    """A list, dict or dataclass holding an object that has no name of its own is still
    named by its other items, the object by its type: another value beside it keys apart,
    and so does another type in its place."""
    assert _held([1.0, object()]) != _held([3.0, object()])
    assert _held([1.0, object()]) == _held([1.0, object()])
    assert _held([1.0, object()]) != _held([1.0, Box])
    assert _held({"a": 1.0, "b": object()}) != _held({"a": 1.0})
    assert _held(Box(object())) != _held(Box(None))  # type: ignore[arg-type]


class Tied(nn.Module):
    """An output layer tied to the embedding a frozen encoder holds."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.encoder.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(ids))


def test_freezing_a_weight_a_trained_part_shares_is_refused() -> None:
    """Freezing turns a tied weight's gradient off for its other owner too: refused,
    naming both, and nothing is held; once the other owner is off on purpose, it
    freezes."""
    model = Tied()
    wrapped = smt.wrap(model, frozen=["encoder"])
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        smt.freeze(wrapped)
    assert model.out.weight.requires_grad and not smt.is_held(model.encoder)
    other = Tied()  # another parameter over the same numbers: training it changes them
    other.out.weight = nn.Parameter(other.encoder.weight.data)
    with pytest.raises(smt.FreezeError, match="holds the same numbers"):
        smt.freeze(smt.wrap(other, frozen=["encoder"]))
    model.out.weight.requires_grad_(False)
    assert set(smt.freeze(wrapped)) == {"encoder"}


def test_a_frozen_weight_a_trained_parameter_shares_memory_with_is_refused() -> None:
    """A part frozen before wrapping still has its numbers rewritten by a trained parameter
    over the same memory: refused, naming both."""
    model = Tied()
    model.encoder.requires_grad_(False)
    model.out.weight = nn.Parameter(model.encoder.weight.data)
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        smt.freeze(smt.wrap(model, frozen=["encoder"]))


def test_a_tied_checkpoint_loaded_after_freezing_is_refused(tmp_path: pathlib.Path) -> None:
    """A checkpoint saved from a model with tied weights holds one memory under both
    names: loaded with ``assign=True`` after freezing, the trained output layer rewrote the
    frozen embedding as it trained, whose answers were recalled as they were. Refused at
    the next call, naming both, until the layer has its own copy."""
    tied = Tied()
    saved = tmp_path / "tied.pt"
    torch.save(tied.state_dict(), saved)
    model = Tied()
    model.out.weight = nn.Parameter(model.out.weight.detach().clone())
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tmp_path / "s")
    smt.freeze(wrapped)
    ids = torch.tensor([1, 2, 3])
    wrapped(ids)
    wrapped.load_state_dict(torch.load(saved), assign=True)
    assert model.out.weight.data_ptr() == model.encoder.weight.data_ptr()
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        wrapped(ids)
    assert model.out.weight.requires_grad
    model.out.weight = nn.Parameter(model.out.weight.detach().clone())
    with torch.no_grad():
        assert torch.equal(wrapped(ids), model.out(model.encoder(ids)))
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2}


def test_a_trained_parameter_put_in_a_frozen_part_after_freezing_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    """Tying the frozen embedding to the trained output layer after freezing
    (``encoder.weight = out.weight``) held the layer's parameter frozen with the
    embedding, so the layer silently stopped training. Refused at the next call, naming
    both, its gradient left on."""
    model = Tied()
    model.out.weight = nn.Parameter(model.out.weight.detach().clone())
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tmp_path)
    smt.freeze(wrapped)
    model.encoder.weight = model.out.weight
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        wrapped(torch.tensor([1, 2, 3]))
    assert model.out.weight.requires_grad


def test_parameters_over_separate_parts_of_one_buffer_are_not_tied() -> None:
    """Parameters that are separate views of one flat buffer share no numbers: freezing
    one part leaves the other training; a view that overlaps a frozen one is refused."""
    model = Tied()
    flat = torch.zeros(80)
    model.encoder.weight = nn.Parameter(flat[:40].view(10, 4))
    model.out.weight = nn.Parameter(flat[40:].view(10, 4))
    assert set(smt.freeze(smt.wrap(model, frozen=["encoder"]))) == {"encoder"}
    assert model.out.weight.requires_grad
    other = Tied()
    flat = torch.zeros(80)
    other.encoder.weight = nn.Parameter(flat[:40].view(10, 4))
    other.out.weight = nn.Parameter(flat[36:76].view(10, 4))  # one row in common
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        smt.freeze(smt.wrap(other, frozen=["encoder"]))


class Towers(nn.Module):
    """Two frozen towers and a head over both."""

    def __init__(self) -> None:
        super().__init__()
        self.img = nn.Sequential(nn.Linear(4, 4))
        self.txt = nn.Sequential(nn.Linear(4, 4))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.img(x), self.txt(x)], -1))


def _towers(model: Towers, store: Store) -> Any:
    return smt.wrap(model, frozen=["img", "txt"], cached=["img", "txt"], store=store)


def test_a_frozen_weight_another_tensor_shares_memory_with_is_refused(store: Store) -> None:
    """Two parameters over one memory, different tensors (``nn.Parameter(img.weight.data)``),
    each keep a version counter of their own: a checkpoint loaded into one tower moved
    only its own, and the other tower's answers were recalled for numbers that changed.
    Refused at freezing, naming both, wherever the other is (a frozen part, a part that
    does not train); the very same parameter in both is not."""
    model = Towers()
    model.txt[0].weight = nn.Parameter(model.img[0].weight.data)
    with pytest.raises(smt.FreezeError, match=r"`img\.0\.weight` is frozen, and `txt\.0\.weigh"):
        smt.freeze(_towers(model, store))
    assert not smt.is_held(model.img)
    idle = Towers()
    idle.head.weight = nn.Parameter(idle.img[0].weight.data.view(2, 8))
    idle.head.requires_grad_(False)
    with pytest.raises(smt.FreezeError, match=r"`img\.0\.weight` is frozen, and `head\.weight`"):
        smt.freeze(smt.wrap(idle, frozen=["img"], cached=["img"], store=store))
    same = Towers()
    same.txt[0].weight = same.img[0].weight
    assert set(smt.freeze(_towers(same, store))) == {"img", "txt"}


def test_views_of_one_buffer_in_two_frozen_parts_are_seen_changed_through_either(
    store: Store,
) -> None:
    """Buffers that are views torch made of one tensor share its version counter: two
    frozen parts holding overlapping ones are not refused, and a change made through one
    is seen by both."""
    model = Towers()
    table = torch.randn(6, 4)
    model.img.register_buffer("table", table[:4])
    model.txt.register_buffer("table", table[2:])
    wrapped = _towers(model, store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    wrapped(x)
    model.img.table.add_(1)
    wrapped(x)
    assert wrapped.counts["txt"] == {"ran": 2, "kept": 2}


def test_a_sparse_buffer_beside_frozen_parts_is_no_tie(store: Store) -> None:
    """A sparse tensor has no storage to point at: one beside the frozen parts is looked at
    for ties, and at each call for having moved, without being taken for one."""
    model = Towers()
    model.head.register_buffer("adjacency", torch.eye(2).to_sparse())
    wrapped = _towers(model, store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    wrapped(x)
    wrapped(x)
    assert wrapped.counts["img"] == {"ran": 1, "kept": 1, "recalled": 1}


def test_memory_shared_with_a_frozen_part_after_freezing_is_refused_at_the_next_call(
    store: Store,
) -> None:
    """A tie made after freezing, outside the frozen part (a trained layer given the frozen
    embedding's memory: ``head.weight = nn.Parameter(img.weight.data)``), was not looked
    at: training the layer rewrote the frozen weights under their recalled answers. So
    was another frozen part given it. Both are refused at the next call, naming both."""
    model = Towers()
    wrapped = _towers(model, store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    wrapped(x)
    model.head.weight = nn.Parameter(model.img[0].weight.data.view(2, 8))
    with pytest.raises(smt.FreezeError, match=r"`img\.0\.weight` is frozen, and `head\.weight`"):
        wrapped(x)
    model.head.weight = nn.Parameter(torch.randn(2, 8))
    wrapped(x)
    model.txt[0].weight = nn.Parameter(model.img[0].weight.data)
    with pytest.raises(smt.FreezeError, match=r"`img\.0\.weight` is frozen, and `txt\.0\.weigh"):
        wrapped(x)
    assert wrapped.counts["txt"] == {"ran": 1, "kept": 1, "recalled": 1}


def test_tensors_over_one_array_by_two_storages_share_memory() -> None:
    """Two tensors made over one array (``torch.from_numpy`` of two views of it) have
    storages of their own over the same bytes: a trained one over a frozen one's is
    refused, as one over the same storage is."""
    model = Tied()
    flat = np.zeros(80, dtype=np.float32)
    model.encoder.weight = nn.Parameter(torch.from_numpy(flat[:40]).view(10, 4))
    model.out.weight = nn.Parameter(torch.from_numpy(flat[36:76]).view(10, 4))
    with pytest.raises(smt.FreezeError, match=r"`encoder\.weight` is frozen.*`out\.weight`"):
        smt.freeze(smt.wrap(model, frozen=["encoder"]))


def test_a_lazy_parameter_left_to_train_does_not_stop_freezing() -> None:
    """A parameter not made yet (``nn.LazyLinear``) holds no numbers to share: the
    frozen part beside it freezes."""
    model = Tied()
    model.out = nn.LazyLinear(10, bias=False)
    assert set(smt.freeze(smt.wrap(model, frozen=["encoder"]))) == {"encoder"}
    assert smt.is_held(model.encoder)


def test_a_trained_parameter_over_a_frozen_buffer_is_refused() -> None:
    """A parameter left to train over the memory of a frozen part's buffer (its
    statistics) rewrites them under their answers as it trains: refused, naming both."""
    model = Tied()
    model.encoder.register_buffer("mean", torch.zeros(4))
    model.shift = nn.Parameter(model.encoder.mean.data)
    with pytest.raises(smt.FreezeError, match=r"`encoder\.mean` is frozen.*`shift`"):
        smt.freeze(smt.wrap(model, frozen=["encoder"]))
    assert not smt.is_held(model.encoder)


def test_a_module_made_under_inference_mode_is_refused() -> None:
    """Tensors made under ``inference_mode`` keep no version counter, so a checkpoint
    loaded into them later could not be seen: refused before anything is held."""
    with torch.inference_mode():
        module = Gated()
    g = Graph.somatize(smt.ModuleNode(module).named("gated").frozen().cached())
    with pytest.raises(smt.FreezeError, match="inference_mode"):
        smt.freeze(g)
    assert not smt.is_held(module) and g.memory.state_of("gated") is None


def _quantized(seed: int) -> nn.Module:
    """An encoder whose linear layers ``quantize_dynamic`` replaced by torch.ao's
    quantized ones, which keep their weights packed outside parameters and buffers."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 4))
    with warnings.catch_warnings():  # torch says its eager quantization is deprecated
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)


def test_a_module_keeping_packed_quantized_weights_is_refused(store: Store) -> None:
    """A quantized module keeps its weights packed where no parameter or buffer shows
    them: two such encoders of other weights had one digest, and the second recalled the
    first's answers from a shared store. Refused before anything is held, as is one
    quantized after its cache was made, at its next call."""
    module = _quantized(0)
    g = Graph.somatize(smt.ModuleNode(module).named("encoder").frozen().cached())
    with pytest.raises(smt.FreezeError, match=r"packed.*`0\._packed_params\._packed_params`"):
        smt.freeze(g)
    assert not smt.is_held(module) and g.memory.state_of("encoder") is None
    encoder = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 4))
    cached = smt.cache_rows(encoder, store)
    x = torch.randn(3, 6)
    cached(x)
    encoder[0] = _quantized(1)[0]
    with pytest.raises(smt.FreezeError, match="packed"):
        cached(x)


class NegatedWeight(torch.Tensor):
    """A weight that a linear layer uses negated: what it answers hangs on its class as
    well as on its values."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is nn.functional.linear:
            x, weight, *rest = args
            return func(x, -weight.as_subclass(torch.Tensor), *rest, **(kwargs or {}))
        return super().__torch_function__(func, types, args, kwargs)


def _negated_weight(module: nn.Linear) -> nn.Linear:
    """``module`` holding its weight, of the same values, as a ``NegatedWeight``."""
    weight = module.weight.detach().as_subclass(NegatedWeight)
    module.weight = nn.Parameter(weight, requires_grad=False)
    return module


def test_a_module_holding_weights_of_a_tensor_subclass_is_refused(store: Store) -> None:
    """A weight of a subclass of ``torch.Tensor`` may answer by its class, or by what else
    it carries, as well as by its values, which are all its digest reads: an encoder
    holding the same values as plain tensors had one digest, and the second recalled the
    first's answers from a shared store. Refused before anything is held, as is a weight
    of a subclass put in after the cache was made, at its next call."""
    torch.manual_seed(0)
    plain = nn.Linear(6, 4)
    x = torch.randn(3, 6)
    smt.cache_rows(plain, store)(x)
    torch.manual_seed(0)
    negated = _negated_weight(nn.Linear(6, 4))
    with pytest.raises(smt.FreezeError, match=r"\(`weight`, of `NegatedWeight`\).*as_subclass"):
        smt.cache_rows(negated, store)
    g = Graph.somatize(smt.ModuleNode(negated).named("encoder").frozen().cached())
    with pytest.raises(smt.FreezeError, match="NegatedWeight"):
        smt.freeze(g)
    assert not smt.is_held(negated) and g.memory.state_of("encoder") is None
    encoder = nn.Sequential(nn.Linear(6, 4), nn.Tanh())
    cached = smt.cache_rows(encoder, store)
    cached(x)
    _negated_weight(encoder[0])
    with pytest.raises(smt.FreezeError, match=r"\(`0\.weight`, of `NegatedWeight`\)"):
        cached(x)


def test_a_lazy_module_not_made_yet_is_refused() -> None:
    """A lazy module holds no weights before its first call: freezing or caching it is
    refused saying so (not torch's own error about an uninitialized parameter), and
    nothing is held; once called, it is frozen as any module is."""
    module = nn.Sequential(nn.LazyLinear(4), nn.Tanh())
    g = Graph.somatize(smt.ModuleNode(module).named("encoder").frozen().cached())
    with pytest.raises(smt.FreezeError, match=r"not made yet \(`0\.weight`, `0\.bias`\)"):
        smt.freeze(g)
    assert not smt.is_held(module) and g.memory.state_of("encoder") is None
    with pytest.raises(smt.FreezeError, match="not made yet"):
        smt.cache_rows(module)
    x = torch.randn(3, 6)
    with torch.no_grad():
        plain = module(x)
    cached = smt.cache_rows(module)
    assert torch.equal(cached(x), plain)


def test_a_module_built_on_the_meta_device_is_frozen_once_its_weights_are_loaded(
    store: Store,
) -> None:
    """A graph is built over a module made on the meta device (to load its weights later):
    freezing it before they are loaded is refused, saying it holds no values, and once they
    are put in (`assign=True`) it is frozen and keyed by them."""
    torch.manual_seed(0)
    loaded = nn.Linear(4, 3)
    with torch.device("meta"):
        module = nn.Linear(4, 3)
    g = Graph.somatize(smt.ModuleNode(module).named("linear").frozen().cached())
    with pytest.raises(TypeError, match=r"on the meta device .* holds no values.*assign=True"):
        smt.freeze(g)
    assert g.memory.state_of("linear") is None
    module.load_state_dict(loaded.state_dict(), assign=True)
    smt.freeze(g)
    x = torch.randn(2, 4)
    first = g.forward(Opaque(x), store=store)
    assert torch.equal(g.forward(Opaque(x), store=store), first)
    assert g.record.outcome == {"linear": "recalled"}
    with torch.no_grad():
        assert torch.equal(first, loaded(x))


class Scaling(nn.Module):
    """A parametrization: the tensor it is handed, times ``factor``."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value * self.factor


class PlusOne(nn.Module):
    """A parametrization: the tensor it is handed, plus one."""

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value + 1


def _parametrized(seed: int, factor: float = 2.0) -> nn.Linear:
    """A linear layer parametrized itself: torch moves it into a class it makes."""
    torch.manual_seed(seed)
    module = nn.Linear(6, 4)
    parametrize.register_parametrization(module, "weight", Scaling(factor))
    return module


def _answer(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


def test_a_module_parametrized_itself_is_named_by_its_class(store: Store) -> None:
    """A module torch parametrized itself (``weight_norm``, ``register_parametrization``)
    is in a class torch made at run time, which no module holds: it is named by the class
    it was made as and by its parametrizations, and frozen and cached by a graph, by
    ``wrap`` or per row as any module is — not refused as a class defined in a function.
    One with another parametrization, or none, over the same weights in the same store is
    answered for itself."""
    x = torch.randn(3, 6)
    torch.manual_seed(0)
    normed = weight_norm(nn.Linear(6, 4))
    node = smt.ModuleNode(normed)
    assert node._smz.identity == "torch.nn.modules.linear:Linear"
    g = Graph.somatize(node.named("encoder").frozen().cached())
    smt.freeze(g)
    assert torch.equal(g.forward(Opaque(x), store=store), _answer(normed, x))
    wrapped = smt.wrap(_parametrized(1), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    assert torch.equal(wrapped(x), _answer(_parametrized(1), x))
    torch.manual_seed(1)
    for module in (_parametrized(1), nn.Linear(6, 4), _parametrized(1, 3.0)):
        assert torch.equal(smt.cache_rows(module, store)(x), _answer(module, x))


def test_a_change_to_a_module_parametrized_itself_is_seen(store: Store) -> None:
    """A value of its parametrization changed, its original weight changed in place or
    loaded anew, a parametrization added or removed (the module back in its own class),
    and one put on the module after it was cached: each is seen at the next call, which
    answers what torch answers."""
    x = torch.randn(3, 6)
    module = _parametrized(0)
    cached = smt.cache_rows(module, store)

    def agrees() -> None:
        assert torch.equal(cached(x), _answer(module, x))

    agrees()
    module.parametrizations.weight[0].factor = 3.0
    agrees()
    with torch.no_grad():
        module.parametrizations.weight.original.add_(1.0)
    agrees()
    module.load_state_dict({name: t * 2 for name, t in module.state_dict().items()})
    agrees()
    parametrize.register_parametrization(module, "bias", PlusOne())
    agrees()
    parametrize.remove_parametrizations(module, "bias", leave_parametrized=False)
    parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
    assert type(module) is nn.Linear
    agrees()
    parametrize.register_parametrization(module, "weight", PlusOne())
    agrees()


def _scripted(module: nn.Module, x: torch.Tensor) -> nn.Module:
    return torch.jit.script(module)


def _traced(module: nn.Module, x: torch.Tensor) -> nn.Module:
    return torch.jit.trace(module, x)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("make", [_scripted, _traced])
def test_a_torchscript_module_is_refused(
    make: Callable[[nn.Module, torch.Tensor], nn.Module], store: Store
) -> None:
    """What a module ``torch.jit.script`` or ``torch.jit.trace`` made computes is code
    somatize cannot read: freezing, caching or wrapping one, or a module holding one, is
    refused saying so (not with torch's own error from deep inside, nor as a quantized
    module), and so is a module cached per row whose part is made one after, at its next
    call."""
    x = torch.randn(3, 6)

    def made() -> nn.Module:
        return make(nn.Sequential(nn.Linear(6, 4), nn.Tanh()), x)

    module = made()
    g = Graph.somatize(smt.ModuleNode(module).named("encoder").frozen().cached())
    with pytest.raises(
        smt.FreezeError,
        match=r"`encoder` is a TorchScript module \(of `Sequential`\).*Pass the Python module",
    ):
        smt.freeze(g)
    assert g.memory.state_of("encoder") is None
    with pytest.raises(smt.FreezeError, match="is a TorchScript module"):
        smt.cache_rows(made(), store)
    with pytest.raises(smt.WrapError, match="is a TorchScript module"):
        smt.wrap(made(), frozen=True, cached=True)
    with pytest.raises(smt.WrapError, match=r"holds TorchScript modules \(`0`\)"):
        smt.wrap(nn.Sequential(made(), nn.Linear(4, 2)), frozen=["0"], cached=["0"])
    encoder = nn.Sequential(nn.Linear(6, 4), nn.Tanh())
    cached = smt.cache_rows(encoder, store)
    cached(x)
    encoder[0] = make(encoder[0], x)
    with pytest.raises(smt.FreezeError, match=r"holds TorchScript modules \(`0`\)"):
        cached(x)


def _negate(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return -output


def test_a_forward_hook_is_in_its_key(store: Store) -> None:
    """A hook registered on a submodule after the graph was built is seen when it is
    frozen again: the node runs, with the hook, instead of recalling the answer without
    it. A module without hooks declares none."""
    module = Scaled(1.0)
    node = smt.ModuleNode(module)
    assert "hooks" not in node.declare()
    g = Graph.somatize(node.named("scaled").frozen().cached())
    smt.freeze(g)
    x = Opaque(torch.randn(3, 6))
    plain = g.forward(x, store=store)
    module.linear.register_forward_hook(_negate)
    smt.freeze(g)
    hooked = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"scaled": "ran"}
    with torch.no_grad():
        assert torch.equal(hooked, module(x.value))
    assert not torch.equal(hooked, plain)
    (name, code), *others = node.declare()["hooks"]["linear"]["post"]
    assert name.endswith(":_negate") and code.startswith("sha256:") and not others


def test_values_a_module_keeps_beside_its_weights_are_in_its_key(store: Store) -> None:
    """Modules with equal weights and repr, one reading another temperature, plain
    tensor attribute, dict entry or dataclass field: each is its own question, never
    another's answer; the same settings in a new module recall, and a value changed
    after the graph was built is seen when it is frozen again."""
    x = Opaque(torch.randn(3, 6))
    answers = []
    clipped, boxed = Scaled(1.0), Scaled(1.0)
    clipped.options["clip"] = 0.1
    boxed.box = Box(3.0)
    for module in (
        Scaled(1.0),
        Scaled(2.0),
        Scaled(1.0, shift=torch.ones(4)),
        Scaled(1.0),
        clipped,
        boxed,
    ):
        g = _frozen_node(module, "scaled")
        answers.append((g.forward(x, store=store), g.record))
    outcomes = [record.outcome["scaled"] for _, record in answers]
    assert outcomes == ["ran", "ran", "ran", "recalled", "ran", "ran"]
    for other in (1, 2, 4, 5):
        assert not torch.equal(answers[0][0], answers[other][0]), other
    assert torch.equal(answers[0][0], answers[3][0])
    module = Scaled(1.0)
    g = _frozen_node(module, "scaled")
    assert torch.equal(g.forward(x, store=store), answers[0][0])
    module.temperature = 2.0  # changed after the graph was built: freezing again sees it
    smt.freeze(g)
    assert torch.equal(g.forward(x, store=store), answers[1][0])
    assert g.record is not None and g.record.outcome == {"scaled": "recalled"}
    kept = smt.cache_rows(Scaled(1.0), store)
    assert torch.equal(kept(x.value), answers[0][0]) and kept.stats.computed == 3
    kept.close()  # its rows are in the store
    hotter = smt.cache_rows(Scaled(2.0), store)
    assert torch.equal(hotter(x.value), answers[1][0])
    assert hotter.stats.computed == 3 and hotter.stats.from_store == 0
    hotter.close()


def test_a_value_changed_after_freeze_is_seen_at_the_next_forward(store: Store) -> None:
    """A plain value, a dict entry or a forward hook changed on a frozen module without
    freezing again keys the graph's next forward anew: computed with the change, the
    answer kept before it not recalled; the same call again is recalled."""
    x = Opaque(torch.randn(3, 6))
    module = Scaled(1.0)
    g = _frozen_node(module, "scaled")
    seen = [g.forward(x, store=store)]
    for change in (
        lambda: setattr(module, "temperature", 2.0),
        lambda: module.options.__setitem__("clip", 0.1),
        lambda: module.linear.register_forward_hook(_negate),
    ):
        change()
        out = g.forward(x, store=store)
        assert g.record is not None and g.record.outcome == {"scaled": "ran"}
        with torch.no_grad():
            assert torch.equal(out, module(x.value))
        assert all(not torch.equal(out, before) for before in seen)
        assert torch.equal(g.forward(x, store=store), out)
        assert g.record.outcome == {"scaled": "recalled"}
        seen.append(out)
    # A copy of a node (its module copied with it) is watched as its own.
    g = Graph.somatize(smt.ModuleNode(Activated(torch.tanh)).named("act").frozen().cached())
    smt.freeze(g)
    first = g.forward(x, store=store)
    twin = copy.deepcopy(g.node("act"))
    h = Graph.somatize(twin.named("act").frozen().cached())
    smt.freeze(h)
    assert torch.equal(h.forward(x, store=store), first)
    twin.module.act = torch.sigmoid
    out = h.forward(x, store=store)
    assert h.record is not None and h.record.outcome == {"act": "ran"}
    with torch.no_grad():
        assert torch.equal(out, twin.module(x.value))


class Activated(nn.Module):
    """Applies the function it holds: its weights and ``repr`` are the same whichever."""

    def __init__(self, act: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


def _halved(x: torch.Tensor) -> torch.Tensor:
    return x / 2


def test_a_function_a_module_holds_is_in_its_key(store: Store) -> None:
    """Modules with equal weights holding another function (Python or built-in, a
    partial binding another value), or whose ``forward`` was replaced on the instance:
    each is its own question, never another's answer; the same function in a new module
    recalls from the store. ``Module.compile`` changes nothing in the key."""
    acts = [
        nn.functional.relu,
        torch.tanh,
        nn.functional.gelu,
        functools.partial(nn.functional.leaky_relu, negative_slope=0.5),
        functools.partial(nn.functional.leaky_relu, negative_slope=0.1),
        _halved,
    ]
    doubled = Activated(nn.functional.relu)
    doubled.forward = lambda x: doubled.linear(x) * 2  # type: ignore[method-assign]
    modules = [Activated(act) for act in acts] + [doubled, Activated(nn.functional.relu)]
    x = Opaque(torch.randn(3, 6))
    answers, outcomes = [], []
    for module in modules:
        g = _frozen_node(module, "act")
        answers.append(g.forward(x, store=store))
        assert g.record is not None
        outcomes.append(g.record.outcome["act"])
        with torch.no_grad():
            assert torch.equal(answers[-1], module(x.value))
    assert outcomes == ["ran"] * 7 + ["recalled"]
    for i, a in enumerate(answers[:7]):
        for b in answers[i + 1 : 7]:
            assert not torch.equal(a, b)
    compiled = Activated(nn.functional.relu)
    compiled.compile()
    assert smt.ModuleNode(compiled).declare() == smt.ModuleNode(modules[0]).declare()


class ConfigActivated(nn.Module):
    """Applies the function a config it holds keeps: its weights and ``repr`` are the same
    whichever."""

    def __init__(self, act: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 4)
        self.config = types.SimpleNamespace(act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.config.act(self.linear(x))
        return out


def _scaled_by(k: float) -> Any:
    return lambda t: t * k


def test_what_a_held_function_closes_over_or_defaults_to_keys_its_answers(store: Store) -> None:
    """A function a cached module's config keeps, made by the same factory with another
    value it closes over, one whose closed-over value is rebound, or whose defaults are
    replaced, keys the next call anew: computed as the module computes it now, never the
    answer kept for the old value; the same values again recall it."""
    module = ConfigActivated(_scaled_by(1.0))
    ran = _cached_calls(module, "act", store)

    first = ran("ran")
    module.config.act = _scaled_by(3.0)
    assert not torch.equal(ran("ran"), first)
    k = 1.0

    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t * k

    module.config.act = scaled
    ran("ran")
    k = 4.0  # the cell `scaled` closes over, rebound
    ran("ran")

    def by(t: torch.Tensor, s: float = 1.0) -> torch.Tensor:
        return t * s

    module.config.act = by
    ran("ran")
    by.__defaults__ = (5.0,)
    ran("ran")
    module.config.act = _scaled_by(3.0)
    ran("recalled")
    assert _held(_scaled_by(2.0)) != _held(_scaled_by(7.0))
    assert _held(_scaled_by(2.0)) == _held(_scaled_by(2.0))


def _scaled_by_held(held: Any) -> Any:
    def scaled(t: torch.Tensor) -> torch.Tensor:
        if isinstance(held, torch.Tensor):
            return t * held
        if isinstance(held, np.ndarray):
            return t * torch.from_numpy(held)
        if isinstance(held, list):
            return t * sum(held)
        if isinstance(held, dict):
            return t * held["k"]
        return t * held.k

    return scaled


@pytest.mark.parametrize("held", ["tensor", "array", "list", "dict", "config", "default"])
def test_what_a_held_function_closes_over_changed_in_place_is_seen_at_the_next_call(
    store: Store, held: str
) -> None:
    """A value a function a cached module's config keeps closes over, or holds as a
    default, changed in place (a tensor or numpy array written, an item of a list or dict
    set, a config's attribute set) keys the next call anew, as one the module keeps
    itself does: computed as the module computes it now, never the answer kept for the
    old value."""
    values: dict[str, Any] = {
        "tensor": torch.ones(4),
        "array": np.ones(4, dtype=np.float32),
        "list": [1.0],
        "dict": {"k": 1.0},
        "config": types.SimpleNamespace(k=1.0),
        "default": torch.ones(4),
    }
    value = values[held]
    if held == "default":

        def act(t: torch.Tensor, scale: torch.Tensor = value) -> torch.Tensor:
            return t * scale

        module = ConfigActivated(act)
    else:
        module = ConfigActivated(_scaled_by_held(value))
    g = _frozen_node(module, "act")
    x = Opaque(torch.randn(3, 6))
    first = g.forward(x, store=store)
    if held in ("tensor", "default"):
        value.mul_(3.0)
    elif held == "array":
        value[:] = 3.0
    elif held == "list":
        value[0] = 3.0
    elif held == "dict":
        value["k"] = 3.0
    else:
        value.k = 3.0
    out = g.forward(x, store=store)
    assert g.record is not None and g.record.outcome == {"act": "ran"}
    with torch.no_grad():
        assert torch.equal(out, module(x.value))
    assert not torch.equal(out, first)


_GAIN = 1.0
_GAINS = [1.0]


def _gains() -> float:
    return _GAINS[0]


def _gained(t: torch.Tensor) -> torch.Tensor:
    return t * _GAIN * _gains()


def test_a_global_a_held_function_reads_keys_its_answers(store: Store) -> None:
    """A module-level value a function a cached module's config keeps reads, rebound
    (``_GAIN = 2.0``), or read by a function of its module it calls and changed in place
    (``_GAINS[0] = 3.0``), keys the next call anew: computed as the module computes it
    now, never the answer kept for the old value; set back, the first answer is recalled.
    A function reading only modules and other modules' functions is named as before."""
    global _GAIN
    module = ConfigActivated(_gained)
    ran = _cached_calls(module, "act", store)
    first = ran("ran")
    try:
        _GAIN = 2.0
        assert not torch.equal(ran("ran"), first)
        _GAIN = 1.0
        ran("recalled")
        _GAINS[0] = 3.0
        assert not torch.equal(ran("ran"), first)
    finally:
        _GAIN, _GAINS[0] = 1.0, 1.0
    ran("recalled")
    assert "globals" not in _held(_halved) and "globals" not in _held(_scaled_by_held(1.0))
    gained = _held(_gained)
    assert gained["globals"] == {"_GAIN": 1.0, "_gains": {"function": _held(_gains)["function"]}}
    assert gained["helpers"] == [_held(_gains)]


_SQUASH: Any = torch.tanh
_BENT: Any = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.1)
_NORMED: Any = torch.nn.functional.normalize


def _squashed(t: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _NORMED(_SQUASH(_BENT(t)), dim=-1)
    return out


def test_a_global_naming_another_function_keys_its_answers(store: Store) -> None:
    """A module-level name a held function calls, bound to a built-in (``torch.tanh``),
    a ``functools.partial`` or a library's function, rebound to another keys the next call
    anew: computed with the function it names now, never the answer kept for the one it
    named before; bound back, the first answer is recalled. A library's own function held
    is named by its code alone, as it always was, not by what its module holds."""
    global _SQUASH, _BENT, _NORMED
    module = ConfigActivated(_squashed)
    ran = _cached_calls(module, "act", store)
    first = ran("ran")
    was = _SQUASH, _BENT, _NORMED
    try:
        _SQUASH = torch.sigmoid
        assert not torch.equal(ran("ran"), first)
        _SQUASH = was[0]
        ran("recalled")
        _BENT = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.5)
        assert not torch.equal(ran("ran"), first)
        _BENT = was[1]
        _NORMED = torch.nn.functional.softmax
        assert not torch.equal(ran("ran"), first)
    finally:
        _SQUASH, _BENT, _NORMED = was
    ran("recalled")
    for function in (torch.nn.functional.silu, torch.nn.functional.interpolate):
        assert "globals" not in _held(function)


def _installed_function() -> Any:
    """A function of a package installed in ``site-packages``, which keeps what it saw in a
    table of its module (a cache, as a library fills)."""
    source = "SEEN = []\n\ndef squash(t):\n    SEEN.append(tuple(t.shape))\n    return t.tanh()\n"
    where = str(pathlib.Path("venv", "lib", "site-packages", "squashing", "core.py"))
    table: dict[str, Any] = {"__name__": "squashing.core"}
    exec(compile(source, where, "exec"), table)
    return table["squash"]


_INSTALLED = _installed_function()


def _through_installed(t: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _INSTALLED(t)
    return out


@pytest.mark.parametrize("held", [_INSTALLED, _through_installed])
def test_an_installed_packages_function_is_keyed_by_its_code(store: Store, held: Any) -> None:
    """A function of an installed package, held or called through a global, is named by its
    code, not by what its module holds: a cache that package fills as it runs does not key
    each call anew, and the first answer is recalled."""
    module = ConfigActivated(held)
    ran = _cached_calls(module, "act", store)
    first = ran("ran")
    assert torch.equal(ran("recalled"), first)
    assert "globals" not in _held(_INSTALLED)


def test_a_name_read_as_an_attribute_is_no_global_a_function_reads() -> None:
    """A name a held function reads only as an attribute (``t.data``) is not a global it
    reads: a module-level value of that name (a dataset, ``data = [...]``) does not key
    it, and is not looked at; one it reads as a global does."""
    source = "def doubled(t):\n    return t.data * 2 + (lambda u: u.shape)(t)[0] * SCALE\n"
    table: dict[str, Any] = {"__name__": "attributes_read", "data": [1.0], "shape": [2.0]}
    table["SCALE"] = 2.0
    exec(compile(source, "attributes_read.py", "exec"), table)
    assert _held(table["doubled"])["globals"] == {"SCALE": 2.0}


def _calling_each_other(count: int, scale: float) -> list[Any]:
    """``count`` functions of one module, each calling every other (as helpers of a
    recursive walk do), and reading the module's ``SCALE``."""
    source = f"SCALE = {scale!r}\n"
    for one in range(count):
        others = " + ".join(f"f{other}(t, n - 1)" for other in range(count) if other != one)
        source += f"def f{one}(t, n=1):\n    return t if n <= 0 else ({others}) * SCALE\n"
    table: dict[str, Any] = {"__name__": "calling_each_other"}
    exec(compile(source, "calling_each_other.py", "exec"), table)
    return [table[f"f{one}"] for one in range(count)]


def test_functions_calling_each_other_are_each_named_once() -> None:
    """Functions of a module calling each other, reached through the globals a held
    function reads, are each named once in its key, whatever the ways between them (eight
    calling each other are more than 40,000 ways): what each reads still keys it."""
    from somatize import canonical

    named = canonical.encode(_held(_calling_each_other(8, 0.5)[0]))
    assert len(named) < 50_000
    assert named != canonical.encode(_held(_calling_each_other(8, 0.25)[0]))


def test_module_class_without_a_stable_name_cannot_be_cached(store: Store) -> None:
    """A module class defined inside a function has no identity, so caching it is refused."""

    class Local(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    g = Graph.somatize(smt.ModuleNode(Local()).named("local").frozen().cached())
    smt.freeze(g)
    with pytest.raises(TypeError, match="defined inside a function"):
        g.forward(Opaque(torch.ones(2)), store=store)


def test_a_script_s_class_sent_by_value_is_refused_saying_to_move_it_to_a_module(
    store: Store,
) -> None:
    """A module class of the driver's script, as Ray (cloudpickle) rebuilds it by value in
    an actor (its module `__main__`, which there is Ray's and holds no such name), is
    refused saying to define it in a module both processes import, not that it is
    defined inside a function, which it is not."""

    class Encoder(nn.Module):
        __module__ = "__main__"
        __qualname__ = "Encoder"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    with pytest.raises(TypeError, match=r"`Encoder` is a class of a script \(`__main__`\)") as why:
        smt.cache_rows(Encoder(), store=store)(torch.ones(2, 3))
    assert "from encoders import Encoder" in str(why.value)
    assert "inside a function" not in str(why.value)


def test_a_module_made_before_its_class_was_defined_again_is_refused_for_what_it_is(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module made, then its class's cell run again (or its module reloaded), unchanged,
    is of a class its name no longer leads to: caching it — in a graph, by rows, or sent to
    a network worker — is refused saying so and what to do, not that its class is defined
    inside a function, which it is not."""
    text = _EDITED.replace("BODY", "self.linear(x)")
    made = _loaded("tests.edited_module", text, monkeypatch).Edited()
    again = _loaded("tests.edited_module", text, monkeypatch).Edited
    said = r"`Edited` was defined again after this object was made .* Make the `Edited` again"
    g = Graph.somatize(smt.ModuleNode(made).named("encoder").frozen().cached())
    smt.freeze(g)
    with pytest.raises(TypeError, match=said):
        g.forward(Opaque(torch.ones(2, 3)), store=store)
    with pytest.raises(TypeError, match=said):
        smt.cache_rows(made, store=store)(torch.ones(2, 3))
    built = smt.ModuleNode.build(again)
    now = _loaded("tests.edited_module", text, monkeypatch)
    with pytest.raises(Unbuildable, match=said):
        built.recipe()
    fresh = now.Edited()
    fresh.load_state_dict(made.state_dict())
    cached = smt.cache_rows(fresh, store=store)
    with torch.no_grad():
        assert torch.equal(cached(torch.ones(2, 3)), made(torch.ones(2, 3)))


_EDITED = """
class Edited(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return BODY
"""


def _edited(body: str, monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    """An ``Edited`` module whose class has the same name, weights and repr whatever
    ``body`` its forward returns: as if its file were edited between two runs (the
    module, loaded anew, holds the class)."""
    module: nn.Module = _loaded(
        "tests.edited_module", _EDITED.replace("BODY", body), monkeypatch
    ).Edited()
    return module


def _loaded(name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The module ``name`` made of ``text`` (``torch`` and ``nn`` at hand), as if loaded
    from its file, held in ``sys.modules`` for the test."""
    loaded = types.ModuleType(name)
    loaded.__dict__.update(torch=torch, nn=nn)
    exec(text, loaded.__dict__)
    monkeypatch.setitem(sys.modules, name, loaded)
    return loaded


def test_an_edited_module_forward_is_recalled_as_drifted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module node's answer is kept beside its module class's code fingerprint: recalled
    after that class's forward was edited, it comes with a drifted fact and a warning, and
    strict mode recomputes it."""
    x = torch.ones(1, 3)
    before = Graph.somatize(
        smt.ModuleNode(_edited("torch.relu(self.linear(x))", monkeypatch))
        .named("encoder")
        .frozen()
        .cached()
    )
    smt.freeze(before)
    before.forward(Opaque(x), store=store)
    assert before.record is not None and before.record.outcome == {"encoder": "ran"}
    edited = _edited("self.linear(x) * 100", monkeypatch)
    after = Graph.somatize(smt.ModuleNode(edited).named("encoder").frozen().cached())
    smt.freeze(after)
    with pytest.warns(Drifted, match="`encoder` was recalled"):
        after.forward(Opaque(x), store=store)
    assert after.record is not None and after.record.outcome == {"encoder": "drifted"}
    fresh = after.forward(Opaque(x), store=store, strict=True)
    assert after.record.count("ran") == 1
    with torch.no_grad():
        assert torch.equal(fresh, edited(x))


_BLOCKS = """
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return BODY

class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.blocks(x)
"""


def test_an_edited_submodule_class_is_in_a_module_node_s_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module node's code fingerprint covers the classes of its submodules, so an edited
    block of a model is seen; torch's own classes are left out of it."""
    from somatize.catalog import fingerprint_of

    def stack(body: str) -> nn.Module:
        module: nn.Module = _loaded(
            "tests.stacked_module", _BLOCKS.replace("BODY", body), monkeypatch
        ).Stack()
        return module

    def noted(module: nn.Module) -> str | None:
        g = Graph.somatize(smt.ModuleNode(module).named("stack"))
        return g.memory.fingerprint_of("stack")

    before, edited = stack("torch.relu(self.linear(x))"), stack("self.linear(x)")
    assert noted(before) != noted(edited)
    assert noted(before) == noted(stack("torch.relu(self.linear(x))"))
    block = type(before.get_submodule("blocks.0"))
    assert noted(before) == fingerprint_of(type(before), block)
    assert fingerprint_of(block) == fingerprint_of(block, nn.Linear, nn.Sequential)


def _modes(module: nn.Module) -> dict[str, bool]:
    return {name: part.training for name, part in module.named_modules()}


def test_modes_asked_of_parts_while_held_are_put_back_in_order() -> None:
    """Each mode asked of a held module's parts, or of the module whole, while it is held
    is put back when it is let go, in the order asked — a part's own ask overriding an
    earlier whole-module ask, a later whole-module ask overriding it — as the module would
    be had it never been held; meanwhile it is in eval."""
    from somatize_torch.freeze import AsFound, hold

    def asks(module: nn.Module) -> None:
        module.train()
        module.norm.eval()  # BatchNorm frozen in eval while the rest trains
        module.drop.train()
        module.drop.eval()

    for then_whole in [False, True]:
        plain, held = _encoder(), _encoder()
        found = AsFound.take(held)
        hold(held)
        for module in (plain, held):
            asks(module)
            if then_whole:
                module.train()
        assert not any(part.training for name, part in held.named_modules())
        found.put_back()
        assert _modes(held) == _modes(plain)
        assert held.norm.training == then_whole
        assert not smt.is_held(held) and "train" not in vars(held.norm)


class Sizes(nn.Module):
    """Notes in a table it keeps each batch size it was handed, as a cache filled as the
    module runs is."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.sizes: dict[int, bool] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.setdefault(int(x.shape[0]), True)
        out: torch.Tensor = self.linear(x)
        return out


def test_what_a_run_changed_of_what_a_module_keeps_keys_the_next_call_and_is_not_kept(
    store: Store,
) -> None:
    """A batch of a new size the module notes in a table it keeps (its forward changing
    what it keeps) is answered and its rows kept nowhere, and the next batch is keyed by
    the table as it is then, as after a change made from outside; a batch that changes
    nothing is kept, and the watch of what the module keeps is not taken again after it,
    rather than walk every part again at each batch."""
    from somatize_torch.rows import cache_rows

    module = Sizes()
    cached = cache_rows(module, store)
    x = torch.randn(4, 3)
    first = cached(x)  # a size noted: computed, kept nowhere
    assert torch.equal(cached(x), first) and cached.stats.computed == 8  # computed again
    node = cached._node
    watch = node._settings
    assert watch is not None and not node.declaration_moved()
    assert torch.equal(cached(x), first) and cached.stats.computed == 8  # recalled
    assert node._settings is watch
    cached(torch.randn(5, 3))  # a new size noted
    assert 5 in module.sizes and node.declaration_moved()
    cached.close()


@pytest.mark.parametrize("in_lists", [False, True], ids=["tensors", "lists"])
def test_a_module_node_keeping_what_each_step_computed_answers_each_generation_as_computed(
    store: Store, in_lists: bool
) -> None:
    """A frozen, cached node of a decoder layer whose forward appends to a cache of keys
    and values it keeps (a tensor made anew, or a list), emptied between generations,
    answers each step of a generation as the layer run itself does: no answer a step
    computed is kept, since a recall would not append to the cache."""
    torch.manual_seed(0)
    reference = Decoder(in_lists).eval()
    layer = copy.deepcopy(reference.layer)
    g = Graph.somatize(smt.ModuleNode(layer).named("layer").frozen().cached())
    smt.freeze(g)
    facts: list[dict[str, Any]] = []

    def decoded(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = reference.head(g.forward(Opaque(x), store=store, watching=facts.append))
        return out

    assert all(steps_alike(decoded, layer.reset, reference))
    done = [fact["fact"] for fact in facts if fact.get("node") == "layer"]
    assert done == ["ran"] * 9  # none kept, none recalled


def test_a_module_node_giving_a_value_anew_as_it_was_keeps_its_answer(store: Store) -> None:
    """A frozen, cached node whose forward sets a value its module keeps to the very value
    it held (a width noted at every call) changes nothing: its answer is kept and
    recalled, not computed at every run."""
    torch.manual_seed(0)
    module = NotesWidth().eval()
    g = Graph.somatize(smt.ModuleNode(module).named("notes").frozen().cached())
    smt.freeze(g)
    facts: list[dict[str, Any]] = []
    x = torch.randn(5, 300)
    for _ in range(3):
        with torch.no_grad():
            assert torch.equal(g.forward(Opaque(x), store=store, watching=facts.append), module(x))
    assert [f["fact"] for f in facts if f.get("node") == "notes"] == [
        "ran",
        "kept",
        "recalled",
        "recalled",
    ]


class RunningSum(nn.Module):
    """Adds each input into a buffer it keeps, in place, and answers the sum so far."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total += x
        return self.total.clone()


def test_a_module_node_writing_into_its_own_buffer_keeps_no_answer(store: Store) -> None:
    """A frozen, cached node whose forward adds into a buffer of its module in place keeps
    none of its answers: one recalled in a later run would leave the buffer as it was, and
    every answer after it would be another than the module's own."""
    answers = []
    for _ in range(2):  # the second run as a new process would: a module made anew
        module, reference = RunningSum(), RunningSum()
        g = Graph.somatize(smt.ModuleNode(module).named("sum").frozen().cached())
        smt.freeze(g)
        facts: list[dict[str, Any]] = []
        for scale in (1.0, 2.0, 1.0):
            x = torch.full((3,), scale)
            answers.append((g.forward(Opaque(x), store=store, watching=facts.append), reference(x)))
        assert [f["fact"] for f in facts if f.get("node") == "sum"] == ["ran"] * 3
    assert all(torch.equal(got, wanted) for got, wanted in answers)


def test_the_torch_helpers_name_the_argument_they_were_handed_wrong() -> None:
    """digest_tensor, digest_rows, digest_named, digest_state and is_held handed what is
    not a tensor, a mapping or a module say what they take, where they failed deep inside
    with an AttributeError (`'list' object has no attribute 'is_nested'`)."""
    with pytest.raises(TypeError, match=r"digested from a torch.Tensor, got a `list`"):
        smt.digest_tensor([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"digested from a torch.Tensor, got a `ndarray`"):
        smt.digest_rows(np.zeros((2, 3)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"digest_named takes a mapping of names to tensors"):
        smt.digest_named([torch.zeros(2)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"digest_state takes an nn.Module.*digest_named"):
        smt.digest_state(nn.Linear(2, 2).state_dict())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"is_held takes an nn.Module, got a `str`"):
        smt.is_held("encoder")  # type: ignore[arg-type]
    assert smt.digest_rows(torch.zeros(2, 3))[0] == smt.digest_tensor(torch.zeros(3))


def test_release_refuses_a_mode_that_is_no_bool_and_keeps_the_hold() -> None:
    """release(module, "no") is refused before anything is undone: it let go of the
    module's hold on eval and only then failed in torch's `train()`, leaving a frozen
    module released with an error that named no argument."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    g = Graph.somatize(smt.ModuleNode(model).named("enc").frozen())
    smt.freeze(g)
    assert smt.is_held(model)
    with pytest.raises(TypeError, match=r"release\(module, mode\) puts the module in train"):
        smt.release(model, "no")  # type: ignore[arg-type]
    assert smt.is_held(model)
    model.train()
    assert not model.training
    smt.release(model, False)
    assert not smt.is_held(model) and not model.training


_SCRIPT_SPAWNING_A_MODEL = """
import collections, enum, multiprocessing, sys
import torch
from torch import nn
import somatize.torch as smt

Out = collections.namedtuple("Out", ["y"])
RUNS = []

class Mode(enum.Enum):
    FAST = 1

def doubled(module, args, out):
    return out * 2

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.mode = Mode.FAST
        self.lin = nn.Linear(2, 2)
        self.lin.register_forward_hook(doubled)

    def forward(self, x):
        RUNS.append(1)
        return Out(self.lin(x))

def answer(store):
    torch.manual_seed(0)
    model = smt.wrap(Net(), frozen=True, cached=True, store=store)
    smt.freeze(model)
    out = model(torch.ones(1, 2))
    return type(out).__name__, out.y.tolist(), len(RUNS)

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        kept = pool.apply(answer, (sys.argv[1],))
    print(repr(kept), "|", repr(answer(sys.argv[1])))
"""


def test_a_script_s_model_kept_in_a_spawned_process_is_recalled_in_the_script(
    tmp_path: pathlib.Path,
) -> None:
    """A process ``multiprocessing`` spawns (a ``ddp_spawn`` rank, a pool's) loads the
    script as ``__mp_main__``: a model the script defines, with a setting of an enum the
    script defines, a hook it writes and a namedtuple answer of its own, kept there, is
    recalled in the script under the same key, the answer read back as that namedtuple,
    the forward not run again."""
    script = tmp_path / "spawning.py"
    script.write_text(_SCRIPT_SPAWNING_A_MODEL)
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    kept, _, recalled = done.stdout.strip().partition(" | ")
    name, answer, runs = ast.literal_eval(kept)
    assert (name, runs) == ("Out", 1)
    assert ast.literal_eval(recalled) == ("Out", answer, 0)


def test_a_module_holding_a_quantized_buffer_is_refused_naming_it(tmp_path: pathlib.Path) -> None:
    """A quantized tensor kept as a buffer cannot be digested: the module is refused when
    its cache is made, naming the buffer and what to do, not with a digest's `TypeError`."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer(
                "w", torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    module = Scaled().eval().requires_grad_(False)
    with pytest.raises(smt.FreezeError, match=r"quantized tensors \(`w`\).*dequantize"):
        smt.cache_rows(module, store=str(tmp_path))(torch.randn(2, 4))


class HoldingEncoder(nn.Module):
    """A model holding the encoder to cache, for ``wrap``."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


@pytest.mark.parametrize("kind", ["wrap", "modulenode"])
def test_a_value_set_on_a_part_put_in_keys_anew(
    store: Store, kind: str, sharp_norm: nn.Sequential
) -> None:
    """A cached part of a wrapped model, or a module node, looked for a value set after a
    part was put in (``eps`` of a BatchNorm put in place of one) on the part replaced:
    the answer of the old ``eps`` was recalled. It is keyed anew."""
    x = torch.randn(3, 8)
    encoder = sharp_norm
    if kind == "wrap":
        wrapped = smt.wrap(
            HoldingEncoder(encoder), frozen=["encoder"], cached=["encoder"], store=store
        )
        smt.freeze(wrapped)

        def call() -> torch.Tensor:
            return wrapped(x)
    else:
        g = Graph.somatize(smt.ModuleNode(encoder).named("encoder").frozen().cached())
        smt.freeze(g)

        def call() -> torch.Tensor:
            return g.forward(Opaque(x), store=store)

    call()
    encoder[1] = copy.deepcopy(encoder[1])
    call()
    encoder[1].eps = 0.5
    with torch.no_grad():
        truth = copy.deepcopy(encoder).eval()(x)
    assert torch.equal(call(), truth)
