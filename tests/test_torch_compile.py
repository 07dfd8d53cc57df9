"""torch.compile of a wrapped model: the cache lookup is one graph break, nothing recompiles."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import types
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as smt
from somatize import Store
from tests.test_torch_wrap import (
    Blocked,
    Fails,
    FailsInferring,
    IteratesByConfig,
    IteratesByConfigInTrain,
    MakesConstants,
    Mixed,
    Normed,
    Optional,
    PoolsByDefault,
    PoolsByFlag,
    Repeated,
    ShiftsBetween,
    Targets,
    Thresholded,
    _default_dtype,
    _modes,
    cached_as,
    default_edited,
    refused_again_untraced,
    refused_in_train_until_set_back,
    while_another_thread_exports,
)

RAN: list[int] = []
"""A mark for each run of an :class:`Encoder`: noted outside it, since a count it kept
would change what it keeps at every call, and none of its answers would be kept."""


class Encoder(nn.Module):
    """A frozen encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RAN.append(1)
        return torch.tanh(self.linear(x))


class Model(nn.Module):
    """Compiled code on both sides of a cached encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x * 2.0)) + 1.0)


_FIRST_CALLS = """
import sys, tempfile
import torch
from torch import nn
compiler_at_import = "torch._dynamo" in sys.modules
import somatize.torch as smt
print(compiler_at_import, "torch._dynamo" in sys.modules)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        with torch.no_grad():  # a block a failed call leaves: the call is made to unwind it
            h = self.encoder(x)
        return self.head(torch.relu(h))

class Holder(nn.Module):
    def __init__(self, encoder, head):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x * 2.0)))

torch.manual_seed(0)
model = Model()
wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tempfile.mkdtemp())
smt.freeze(wrapped)
encoder = nn.Linear(4, 4)
whole = smt.wrap(encoder, frozen=True, cached=True, store=tempfile.mkdtemp())
smt.freeze(whole)
rows = smt.cache_rows(encoder, store=tempfile.mkdtemp())
x = torch.randn(3, 4)
with torch.no_grad():
    answers = [torch.equal(call(x), plain(x))
               for call, plain in ((wrapped, model), (whole, encoder), (rows, encoder))
               for _ in range(2)]  # computed, then recalled
print(all(answers), "torch._dynamo" in sys.modules)
compiled = torch.compile(Holder(rows, model.head), backend="eager")
before = rows.stats.recalled
with torch.no_grad():
    answers = [torch.equal(compiled(x * k), Holder(encoder, model.head)(x * k)) for k in (1, 2, 1)]
    answers += [torch.equal(rows(x), encoder(x))]
print(all(answers), "torch._dynamo" in sys.modules, rows.stats.recalled > before + 3)
"""


@pytest.fixture(scope="module")
def first_calls() -> list[str]:
    """What :data:`_FIRST_CALLS` prints, run once in a new process for the two tests that
    read it: each looks at a step of its own of that process's life."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_importing_somatize_torch_leaves_torch_compiler_unloaded(first_calls: list[str]) -> None:
    """Importing ``somatize.torch`` loads nothing of torch.compile's (``torch._dynamo``,
    about a second): the functions it keeps out of compiled code are marked at their
    first call once something compiles, as the tests below, which compile around them,
    show they still are."""
    assert first_calls[:2] == ["False", "False"]


def test_first_calls_leave_torch_compiler_unloaded_until_something_compiles(
    first_calls: list[str],
) -> None:
    """The first calls of a wrapped model (a cached part, a no-grad block), of a model
    wrapped whole and of a row cache answer as the models do and load nothing of
    torch.compile's: nothing compiles, so what they keep out of compiled code runs as it
    is. A model compiled around the same row cache later answers as the eager one does,
    the cache kept out of the compiled code."""
    assert first_calls[2:] == ["True", "False", "True", "True", "True"]


def test_compiled_wrapped_model_equals_eager_without_recompiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled results equal eager ones; the cached node is a graph break; batches reuse code."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(wrapped)
    compiled = torch.compile(wrapped)
    batches = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    with torch.no_grad():
        eager = [model(x) for x in batches]
        RAN.clear()
        assert torch.allclose(compiled(batches[0]), eager[0], atol=1e-6)
        first = counters["frames"]["total"]
        for x, expected in zip(batches[1:] + batches, eager[1:] + eager, strict=True):
            assert torch.allclose(compiled(x), expected, atol=1e-6)
    assert wrapped.counts["encoder"] == {"ran": 4, "kept": 4, "recalled": 4}
    assert len(RAN) == 4
    breaks = [reason for reason in counters["graph_break"] if "_recall_or_run" in reason]
    assert breaks, dict(counters["graph_break"])
    assert all("_recall_or_run" in reason for reason in counters["graph_break"])
    assert counters["stats"]["unique_graphs"] <= 2
    # Every frame was met at the first batch (those compiled, and any skipped, such as
    # an audit hook's): none was compiled again for a later one.
    assert counters["frames"]["total"] == first
    torch._dynamo.reset()


def test_compiled_wrapped_frozen_module_stays_in_eval_after_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapped frozen module put in train mode and compiled runs in eval: its BatchNorm
    statistics, and so its digest, stay what they were frozen at."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = Normed()
    wrapped = smt.wrap(module, frozen=True, store=Store(tmp_path / "s"))
    digest = smt.freeze(wrapped)["normed"]
    wrapped.train()
    compiled = torch.compile(wrapped)
    x = torch.randn(8, 4) * 5 + 3
    with torch.no_grad():
        out = compiled(x)
        assert torch.allclose(out, module(x), atol=1e-6)
    assert not any(part.training for part in module.modules())
    assert smt.digest_state(module) == digest
    torch._dynamo.reset()


class NormedHead(nn.Module):
    """A frozen encoder holding a BatchNorm, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Normed()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@pytest.mark.parametrize("cached", [False, True], ids=["frozen", "cached"])
def test_a_compiled_call_puts_back_in_eval_a_part_of_a_frozen_submodule_put_in_train_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """A part of a frozen submodule put in train mode directly after the model was compiled
    (``model.encoder.norm.train()``, as a recipe setting BatchNorms' modes does) warns at
    the next compiled call and is put back in eval first, as an eager call does: the call
    answers as the submodule does in eval, and its statistics stay what they were frozen
    at."""
    model, _, compiled = _compiled(NormedHead, tmp_path, monkeypatch, cached=cached)
    x = torch.randn(8, 4) * 5 + 3
    norm = model.encoder.norm
    with torch.no_grad():
        first = compiled(x)
        before = norm.running_mean.clone()
        norm.train()
        with pytest.warns(smt.StillChanging, match="`norm`.*train mode"):
            again = compiled(x)
        assert not norm.training
        assert torch.equal(norm.running_mean, before)
        assert torch.equal(again, first)
        assert torch.equal(compiled(x), first)
    torch._dynamo.reset()


class Around(nn.Module):
    """Compiled code on both sides of a module it is handed (a row cache)."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x * 2.0)))


def test_a_compiled_model_calling_a_row_cache_breaks_its_graph_once_and_warns_of_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled model calling a row cache breaks its graph at the cache's call alone, as
    the docs say, and torch.compile warns of nothing it met in the cache's code (it warned
    that it could not trace torch's functorch question asked of the batch, a second
    break)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    encoder, head = Encoder(), nn.Linear(8, 3)
    rows = smt.cache_rows(encoder, Store(tmp_path / "s"))
    compiled = torch.compile(Around(rows, head), backend="eager")
    batches = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for x in batches + batches:
            assert torch.equal(compiled(x), Around(encoder, head)(x))
    assert [str(w.message) for w in caught] == []
    assert counters["graph_break"], "the cache's call is a graph break"
    assert all("_stand_in_call" in reason for reason in counters["graph_break"]), dict(
        counters["graph_break"]
    )
    torch._dynamo.reset()


def test_a_compiled_model_calling_a_row_cache_handed_back_answers_as_the_module_in_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row cache whose module was handed back to its model (``CacheFrozen`` does so when
    a stage ends), which trained it, answers a compiled model's call as the module in
    eval with the weights it trained to, and leaves it in train mode requiring grad, as
    it does eagerly: it holds the module and digests its weights outside compiled code."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    module, head = Normed(), nn.Linear(4, 2)
    rows = smt.cache_rows(module, Store(tmp_path / "s"))
    compiled = torch.compile(Around(rows, head), backend="eager")
    x = torch.randn(8, 4) * 5 + 3
    with torch.no_grad():
        compiled(x)
    rows.hand_back()
    smt.release(module)
    module.requires_grad_(True)
    module(x).square().sum().backward()
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    with torch.no_grad():
        got = compiled(x)
        module.eval()
        expected = Around(module, head)(x)
        module.train()
    assert torch.equal(got, expected)
    assert module.training and module.norm.training
    assert all(p.requires_grad for p in module.parameters())
    torch._dynamo.reset()


def test_compiled_wrapped_model_runs_a_part_assigned_after_wrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part assigned on the wrapped model after it was compiled is the one the compiled
    model runs."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(wrapped)
    compiled = torch.compile(wrapped)
    x = torch.randn(4, 8)
    head = nn.Linear(8, 3)
    with torch.no_grad():
        compiled(x)
        wrapped.head = head
        expected = head(torch.relu(model.encoder(x * 2.0)) + 1.0)
        assert torch.allclose(compiled(x), expected, atol=1e-6)
    torch._dynamo.reset()


def test_compiled_wrapped_model_refuses_a_declared_part_replaced_on_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declared submodule replaced on the model itself (not on the wrapper) after it was
    compiled is refused at the next compiled call."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    model = Model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(wrapped)
    compiled = torch.compile(wrapped, backend="eager")
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled(x)
        model.encoder = type(model.encoder)()
        with pytest.raises(smt.WrapError, match="`encoder` is declared"):
            compiled(x)
    torch._dynamo.reset()


def test_compiled_wrapped_model_switches_grad_mode_and_autocast_as_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled, a wrapped model still runs its forward's no-grad and autocast blocks as
    the model does, and leaves both modes as it found them."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    targets, mixed = Targets(), Mixed().eval()
    compiled = []
    for i, model in enumerate((targets, mixed)):
        wrapped = smt.wrap(
            model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / f"s{i}")
        )
        smt.freeze(wrapped)
        compiled.append(torch.compile(wrapped, backend="eager"))
    x = torch.randn(5, 4)
    for _ in range(2):
        p, t = compiled[0](x)
        assert p.requires_grad and not t.requires_grad
        with torch.no_grad():
            assert torch.equal(compiled[1](x), mixed(x))
        assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    (p.sum() + t.sum()).backward()
    assert targets.target.weight.grad is None and targets.head.weight.grad is not None
    torch._dynamo.reset()


def _compiled(
    make: Callable[[], nn.Module],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cached: bool = True,
) -> tuple[nn.Module, smt.Wrapped, Any]:
    """The model ``make`` makes, with torch.compile's caches fresh and kept under
    ``tmp_path`` and the seed set first; it wrapped with its encoder frozen (and cached,
    unless ``cached`` is False) and settled; and that compiled (eager backend)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make()
    wrapped = smt.wrap(
        model, frozen=["encoder"], cached=["encoder"] if cached else [], store=tmp_path / "s"
    )
    smt.freeze(wrapped)
    return model, wrapped, torch.compile(wrapped, backend="eager")


@pytest.mark.parametrize("kind", [Fails, FailsInferring])
def test_compiled_wrapped_model_that_fails_inside_a_block_leaves_the_modes_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: type[Fails]
) -> None:
    """Compiled, a call that fails inside the forward's no-grad, autocast or inference-mode
    block leaves the modes as they were before it, as it does eagerly."""
    model, _, compiled = _compiled(kind, tmp_path, monkeypatch)
    x = torch.randn(3, 4)
    expected = model(x)

    def calls() -> None:  # in a thread of its own, so modes left switched stay there
        assert torch.equal(compiled(x), expected)
        with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied"):
            compiled(torch.randn(3, 5))
        assert _modes() == (True, False, False)
        assert torch.equal(compiled(x), expected)

    with ThreadPoolExecutor(1) as thread:
        thread.submit(calls).result()
    torch._dynamo.reset()


def test_a_compiled_call_leaving_an_optional_argument_none_traces_it_eagerly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call leaving an optional argument None traces the forward again with it
    None; made in compiled code, that trace runs eagerly, and the compiled calls then
    answer as the model does, given the argument or not."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Optional().eval()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(wrapped)
    compiled = torch.compile(wrapped)
    x, scale = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        for call in (lambda m: m(x, scale), lambda m: m(x), lambda m: m(x), lambda m: m(x, scale)):
            assert torch.allclose(call(compiled), call(model), atol=1e-6)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 3}
    torch._dynamo.reset()


def test_compiled_calls_giving_values_equal_in_python_run_the_code_traced_for_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled calls give the arguments the forward branches on values that are equal in
    Python and traced apart (`0.0` and `-0.0`, `True` and `1`) and answer as the model
    does for each; a tensor for one is refused, naming it, as in an eager call."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    x = torch.randn(3, 4)
    for kind, values in ((Thresholded, (0.0, -0.0, 0.5)), (Repeated, (1, True, 3, False))):
        torch.manual_seed(0)
        model = kind().eval()
        wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tmp_path / "s")
        smt.freeze(wrapped)
        compiled = torch.compile(wrapped, backend="eager")
        with torch.no_grad():
            for _ in range(2):
                for value in values:
                    assert torch.equal(compiled(x, value), model(x, value)), value
    model = PoolsByFlag().eval()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tmp_path / "s")
    smt.freeze(wrapped)
    compiled = torch.compile(wrapped, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(x, False), model(x, False))
        with pytest.raises(smt.WrapError, match=r"`pool` is a `torch\.Tensor` in this call"):
            compiled(x, torch.tensor(True))
    torch._dynamo.reset()


class Gained(nn.Module):
    """Scales by a plain value of its own, and by a mask when given one."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.gain = 3.0

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x) * self.gain
        return h if mask is None else h * mask


def test_a_compiled_call_tracing_a_model_changed_after_wrap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled call makes none of the checks an eager one makes; one that traces the
    forward again, leaving an argument None, checks the model first: a value the code
    read changed after `wrap` is refused there, and in every eager call after it, rather
    than traced into the new code and taken as what all the code read."""
    model, wrapped, compiled = _compiled(Gained, tmp_path, monkeypatch, cached=False)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x, mask), model(x, mask))
        model.gain = 5.0
        with pytest.raises(smt.WrapError, match=r"`gain` was 3\.0"):
            compiled(x)
        with pytest.raises(smt.WrapError, match=r"`gain` was 3\.0"):
            wrapped(x, mask)
        model.gain = 3.0
        assert torch.equal(compiled(x), model(x))
        assert torch.equal(wrapped(x, mask), model(x, mask))
    torch._dynamo.reset()


def _tensors_doubled(module: nn.Module, args: Any, out: Any) -> Any:
    return out * 2 if isinstance(out, torch.Tensor) else None


@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
@pytest.mark.parametrize("style", ["in place", "torch.compile"])
@pytest.mark.parametrize("kind", ["whole", "whole frozen", "rows"])
def test_a_compiled_stand_in_runs_global_hooks_with_its_module_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, style: str
) -> None:
    """A model wrapped whole (cached, or frozen only), or a row cache, compiled in place
    (`module.compile()`) or by `torch.compile`, runs torch's global hooks with the module
    it stands for only, as an eager call does: its answer, computed or recalled, is the
    one torch gives for the module compiled the same way under them (`torch.compile` runs
    them once more on the module it makes), and a hook registered or removed after a
    compiled call is seen."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    stand_in: nn.Module
    if kind.startswith("whole"):
        cached = kind == "whole"
        stand_in = smt.wrap(model, frozen=True, cached=cached, store=Store(tmp_path / "s"))
        smt.freeze(stand_in)
    else:
        stand_in = smt.cache_rows(model, Store(tmp_path / "s"))
    plain = copy.deepcopy(model)
    if style == "in place":
        stand_in.compile(backend="eager")
        compiled, plain_compiled = stand_in, plain
        plain.compile(backend="eager")
    else:
        compiled = torch.compile(stand_in, backend="eager")
        plain_compiled = torch.compile(plain, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x))
        with contextlib.ExitStack() as undo:
            undo.callback(nn.modules.module.register_module_forward_hook(_tensors_doubled).remove)
            expected = plain_compiled(x)
            assert torch.allclose(compiled(x), expected)
            assert torch.allclose(compiled(x), expected)
        assert torch.allclose(compiled(x), model(x))
    if kind == "rows":
        stand_in.close()
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
@pytest.mark.parametrize("first", ["compiled before", "registered before"])
def test_a_compiled_traced_model_refuses_a_call_while_global_hooks_are_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """A compiled call of a traced model, as an eager one, is refused naming the global
    hook registered, whether it was registered before the model was first called
    compiled or after; once it is removed, compiled calls answer as the model does."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ShiftsBetween()
    traced = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(traced)
    x = torch.randn(3, 4)
    traced(x)
    compiled = torch.compile(traced, backend="eager")
    with torch.no_grad():
        if first == "compiled before":
            assert torch.allclose(compiled(x), model(x))
        with contextlib.ExitStack() as undo:
            undo.callback(nn.modules.module.register_module_forward_hook(_tensors_doubled).remove)
            with pytest.raises(
                smt.WrapError, match=r"register_module_forward_hook\(_tensors_doubled\)"
            ):
                compiled(x)
        assert torch.allclose(compiled(x), model(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("edit", ["defaults", "kwdefaults", "kwdefaults in place"])
def test_a_compiled_call_after_a_forward_default_changed_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    """A compiled call runs code traced with an argument left out at the default it had at
    `wrap`: changed after (`__defaults__`, `__kwdefaults__`), the compiled call is refused
    naming the argument, as an eager one is, where it would have answered for the old
    default; put back, it answers as the model does."""
    model, _, compiled = _compiled(PoolsByDefault, tmp_path, monkeypatch)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
        with default_edited(edit) as name:
            for _ in range(2):
                with pytest.raises(smt.WrapError, match=rf"default of `{name}`.*changed"):
                    compiled(x)
        assert torch.equal(compiled(x), model(x))
    torch._dynamo.reset()


class Configured(nn.Module):
    """Scales by a plain value of its own, doubles where its config says so, and scales
    by a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.gain = 3.0
        self.config = types.SimpleNamespace(double=False, sizes=[1.0])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) * self.gain * self.config.sizes[0]
        if self.config.double:
            h = h * 2
        return h * mask


def test_a_compiled_call_after_what_the_forward_read_changed_answers_or_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled call runs code traced with what the forward read of the model: its
    config changed after `wrap` (`self.config.double`, an item of a list it holds), the
    compiled call runs the code traced for the values it holds then, as an eager one
    does, and for those set back the code traced for them; a plain value of the model's
    own changed (`self.gain`) is refused naming it, as in an eager call, where it would
    have answered for the old."""
    model, _, compiled = _compiled(Configured, tmp_path, monkeypatch, cached=False)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x, mask), model(x, mask))
        for double in (True, False, True):
            model.config.double = double
            for _ in range(2):
                assert torch.equal(compiled(x, mask), model(x, mask)), double
        model.config.sizes[0] = 2.0
        assert torch.equal(compiled(x, mask), model(x, mask))
        model.gain = 5.0
        for _ in range(2):
            with pytest.raises(smt.WrapError, match=r"`gain` was 3\.0"):
                compiled(x, mask)
        model.gain = 3.0
        assert torch.equal(compiled(x, mask), model(x, mask))
    torch._dynamo.reset()


def test_a_compiled_call_in_a_mode_fx_refused_for_a_config_is_refused_or_runs_as_eagerly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled, a call in the mode fx could not trace for what the config holds (traced
    in eval mode only) is refused naming the line, as an eager one is; set back, the
    call runs the code traced for the values set back. The model and its wrapper are held
    in globals, as a script holds them."""
    model, wrapped, compiled = _compiled(
        lambda: IteratesByConfigInTrain().eval(), tmp_path, monkeypatch
    )
    # As a script holds them: in globals of the module that defines the model's class.
    defining = vars(sys.modules[IteratesByConfigInTrain.__module__])
    monkeypatch.setitem(defining, "wrapped", wrapped)
    monkeypatch.setitem(defining, "compiled", compiled)
    refused_in_train_until_set_back(model, wrapped, compiled)
    torch._dynamo.reset()


def test_a_compiled_call_fx_cannot_trace_for_a_config_is_refused_again_without_a_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled, a call fx cannot trace in either mode for what the config holds is
    refused again without tracing it again while the config holds the same, as an eager
    one is; set back, or changed to other values fx can trace, it runs as the model does."""
    model, _, compiled = _compiled(IteratesByConfig, tmp_path, monkeypatch)
    assert isinstance(model, IteratesByConfig)
    refused_again_untraced(model, compiled, monkeypatch)
    torch._dynamo.reset()


def test_a_compiled_call_under_another_default_dtype_makes_its_constants_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled call under another default dtype than `wrap` was called under runs the
    code traced under that one, whose tensors made from numbers are made in it, as an
    eager call does, and answers as the model does."""
    model, _, compiled = _compiled(MakesConstants, tmp_path, monkeypatch)
    model.eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        for dtype in (torch.float64, torch.float32, torch.float64):
            with _default_dtype(dtype):
                got, want = compiled(x), model(x)
            for one, other in zip(got, want, strict=True):
                assert one.dtype == other.dtype
                assert torch.equal(one, other)
    torch._dynamo.reset()


class Projected(nn.Module):
    """Reads a parameter and a buffer of its own before and after a declared encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.proj = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x @ self.proj) + self.shift


@pytest.mark.parametrize("cached", [False, True], ids=["frozen", "cached"])
def test_a_compiled_call_runs_the_parts_replaced_on_the_model_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    """A parameter or buffer replaced on the model itself after it was compiled (not on the
    wrapped model: `model.proj = nn.Parameter(...)`, a checkpoint loaded into the model
    with `assign=True`) is the one the next compiled call computes with, as in an eager
    call, not the one the segments held."""
    model, _, compiled = _compiled(Projected, tmp_path, monkeypatch, cached=cached)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
        model.proj = nn.Parameter(torch.randn(4, 4))
        assert torch.allclose(compiled(x), model(x))
        model.shift = torch.ones(4)
        assert torch.allclose(compiled(x), model(x))
        model.load_state_dict({**model.state_dict(), "shift": torch.full((4,), 2.0)}, assign=True)
        assert torch.allclose(compiled(x), model(x))
    torch._dynamo.reset()


class ClassScaled(nn.Module):
    """Scales by a value its class gives, and by a mask."""

    scale = 3.0

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.scale * mask


@pytest.mark.parametrize("where", ["class", "instance"])
def test_a_compiled_call_after_a_value_the_class_gave_changed_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A value the forward read as its class gives it (`scale = 3.0` in the class body),
    changed on the class or given the model itself after `wrap`, has a compiled call
    refused naming it, as an eager one is, where it would have computed with the old; set
    back, the call answers as the model does."""
    model, _, compiled = _compiled(ClassScaled, tmp_path, monkeypatch, cached=False)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x, mask), model(x, mask))
        try:
            if where == "class":
                ClassScaled.scale = 5.0
            else:
                model.scale = 5.0
            for _ in range(2):
                with pytest.raises(smt.WrapError, match=r"`scale` .*3\.0"):
                    compiled(x, mask)
        finally:
            ClassScaled.scale = 3.0
            model.__dict__.pop("scale", None)
        assert torch.equal(compiled(x, mask), model(x, mask))
    torch._dynamo.reset()


def test_a_compiled_call_with_a_block_traced_into_in_another_mode_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block fx traced into put in another mode than the model (`model.block.train()`
    after `model.eval()`) would run code traced for the model's mode: a compiled call is
    refused saying which part is in which mode, as an eager one is, and answers as the
    model does once both are in one mode again."""
    model, wrapped, compiled = _compiled(Blocked, tmp_path, monkeypatch)
    x = torch.randn(3, 4)
    wrapped.eval()
    model.block.train()
    with torch.no_grad():
        for _ in range(2):
            with pytest.raises(
                smt.WrapError,
                match=r"different modes \(`the model itself` in eval, `block` in train",
            ):
                compiled(x)
        model.block.eval()
        assert torch.equal(compiled(x), model(x))
    torch._dynamo.reset()


_CTRL_C_AS_THE_COMPILER_LOADS = """
import os, signal, sys, tempfile, time
import torch
from torch import nn
import somatize.torch as smt

# Ctrl-C raises KeyboardInterrupt here whatever this process was started with (a job a
# shell runs in the background starts with SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)

class CtrlC:
    pressed = False

    def find_spec(self, name, path=None, target=None):
        if name.startswith("torch._dynamo.polyfills.") and not CtrlC.pressed:
            CtrlC.pressed = True
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
        return None

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.encoder(x)
        block = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if sys.argv[1] == "autocast"
            else torch.inference_mode()
        )
        with block:
            return self.head(h)

torch.manual_seed(0)
model = Model()
call = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=tempfile.mkdtemp())
smt.freeze(call)
x = torch.randn(3, 4)
sys.meta_path.insert(0, CtrlC())
try:
    call(x)
except KeyboardInterrupt:
    print("interrupted")
with torch.no_grad():
    print("same" if torch.equal(call(x), model(x)) else "other")
"""


@pytest.mark.parametrize("block", ["autocast", "inference"])
def test_a_ctrl_c_as_the_first_call_loads_torchs_compiler_leaves_later_calls_working(
    block: str,
) -> None:
    """A Ctrl-C pressed while the first call of a wrapped model whose forward enters an
    autocast or inference-mode block loads torch's compiler (``torch._dynamo``, a
    second's import, which the code fx recorded to enter and leave the block calls as it
    is kept out of compiled code) stops that call, and leaves the compiler loaded whole:
    the next call answers as the model does, rather than fail for the rest of the process
    on a module left half made. (Other first calls leave the compiler unloaded.)"""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_AS_THE_COMPILER_LOADS, block],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "same"]


@pytest.mark.parametrize("declared", ["whole", "part", "rows"])
def test_a_compiled_model_called_while_another_thread_exports_answers_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, declared: str
) -> None:
    """A compiled model (`torch.compile`) with a cached part, called on one thread while
    another ran `torch.export.export`, was refused as though export traced it, and
    compiled so: torch's compiler kept the refusal in the code it made, and every later
    call of the compiled model was refused too, the export long over. The cached part
    answers as the model does meanwhile, and every compiled call does after it, with no
    question of the export left in the compiled code; the export goes on. (A model cached
    whole, or a row cache, stands for the module it runs through a call torch's compiler
    skips, which torch refuses in compiled code while any thread exports: refused
    meanwhile, keeping nothing.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
    cached = cached_as(declared, model, Store(tmp_path / "s"))
    compiled = torch.compile(cached, backend="eager")
    x, other = torch.randn(4, 6), torch.randn(4, 6)
    answered: list[torch.Tensor] = []
    with while_another_thread_exports(), torch.no_grad():
        try:
            answered += [compiled(x), compiled(x)]
        except RuntimeError:
            if declared == "part":
                raise
    with torch.no_grad():
        after = [compiled(other), compiled(other)]
        assert all(torch.allclose(got, model(x), atol=1e-6) for got in answered)
        assert torch.allclose(after[0], model(other), atol=1e-6)
        assert torch.equal(after[1], after[0])
    # Compiled meanwhile, the code asks nothing of the other thread's export: a question
    # that breaks its graph (the frame's callback) would stay in it for good.
    assert not [reason for reason in counters["graph_break"] if "eval_frame_callback" in reason]
    if declared != "rows":
        assert isinstance(cached, smt.Wrapped)
        calls = 2 if answered else 1  # a call refused keeps nothing
        assert list(cached.counts.values()) == [{"ran": calls, "kept": calls, "recalled": calls}]
    torch._dynamo.reset()


class _CompiledEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.compile(
            nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), backend="eager"
        )
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


def test_a_frozen_part_compiled_by_torch_compile_runs_in_eval_without_a_warning(
    tmp_path: Path,
) -> None:
    """A frozen part that `torch.compile` made is held in eval, its wrapper as well: torch
    2.4's wrapper keeps a mode of its own, made in train and not changed by `.eval()`, so
    each call warned the part was in train mode (StillChanging, an error here)."""
    torch._dynamo.reset()
    model = _CompiledEncoder()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=Store(tmp_path / "s"))
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), wrapped(x))
    assert not any(part.training for part in model.encoder.modules())
    torch._dynamo.reset()
