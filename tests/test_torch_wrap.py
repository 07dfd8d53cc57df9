"""Wrapping a model: declared submodules become somatize nodes, the model stays a model."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch import nn

import somatize.torch as smt
from somatize import NotSettled, Store, Unsettled


class Encoder(nn.Module):
    """Holds data-dependent control flow, which fx cannot trace — but it is a declared leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)
        self.norm = nn.BatchNorm1d(5)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.abs().sum() > 1e9:
            return self.linear(x)
        return torch.tanh(self.norm(self.linear(x)))


class Model(nn.Module):
    """Code before and after a declared encoder, a top-level parameter and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(5, 2)
        self.scale = nn.Parameter(torch.ones(2))
        self.register_buffer("shift", torch.full((6,), 0.5))

    def forward(self, x: torch.Tensor, boost: float = 1.0) -> torch.Tensor:
        z = self.encoder(x - self.shift)
        return self.head(torch.relu(z)) * self.scale * boost


class Untraceable(nn.Module):
    """Branches on a tensor value in its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.linear(x)
        return x


class Feeds(nn.Module):
    """A trainable layer feeding the encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(6, 6)
        self.encoder = Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.pre(x))


class Writes(nn.Module):
    """Writes into the encoder's output in place."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(x)
        z.mul_(2.0)
        return z + 1


def _model(seed: int = 0) -> Model:
    torch.manual_seed(seed)
    model = Model()
    model.encoder.norm.running_mean.uniform_()
    return model


def _wrapped(store: Store | None = None, seed: int = 0) -> smt.Wrapped:
    wrapped = smt.wrap(_model(seed), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    return wrapped


def test_wrapped_keeps_signature_parameters_and_state_dict_keys(store: Store) -> None:
    """Forward signature, parameter names (in order) and state_dict keys are the model's."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    assert isinstance(wrapped, nn.Module)
    assert inspect.signature(wrapped.forward) == inspect.signature(model.forward)
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(wrapped.parameters(), model.parameters(), strict=True))


def test_wrapped_graph_has_one_node_per_declared_submodule(store: Store) -> None:
    """The graph is the fx segments around one node named by the submodule's path."""
    wrapped = _wrapped(store)
    graph = wrapped.graph
    assert graph.nodes() == ("fx_0", "encoder", "fx_1")
    assert graph.predecessors("encoder") == ("fx_0",)
    assert graph.memory.identity_of("encoder") == f"{Encoder.__module__}:Encoder"
    assert graph.memory.state_of("encoder") == smt.digest_state(wrapped.encoder)
    svg = graph.figure().svg()
    assert "encoder" in svg and "Encoder" in svg and "ModuleNode" not in svg
    assert graph.kind_of("encoder") == "Encoder"


def test_checkpoints_move_between_wrapped_and_plain(store: Store) -> None:
    """A wrapped model's checkpoint loads into the plain model, and the plain one's back."""
    wrapped = _wrapped(store, seed=1)
    plain = _model(seed=2)
    plain.load_state_dict(wrapped.state_dict())
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), wrapped.state_dict().values(), strict=True)
    )
    other = _model(seed=3)
    wrapped.load_state_dict(other.state_dict())
    assert torch.equal(wrapped.head.weight, other.head.weight)
    assert torch.equal(wrapped.encoder.norm.running_mean, other.encoder.norm.running_mean)


def test_weights_loaded_after_freezing_key_the_encoder_anew(store: Store) -> None:
    """A checkpoint loaded into a frozen, wrapped model is seen at the next forward: the
    encoder runs with the new weights, and nothing computed with the old ones is recalled."""
    wrapped = _wrapped(store, seed=1)
    x = torch.randn(4, 6)
    wrapped(x)
    other = _model(seed=3)
    wrapped.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(wrapped(x), other.eval()(x))
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2}
    assert not any(part.training for part in wrapped.encoder.modules())


def test_an_encoder_unfrozen_after_freezing_is_refused(store: Store) -> None:
    """A frozen, cached encoder whose parameters come to require grad is refused at the
    next forward, saying why, rather than frozen again behind its owner's back."""
    wrapped = _wrapped(store)
    x = torch.randn(4, 6)
    wrapped(x)
    wrapped.encoder.linear.weight.requires_grad_(True)
    with pytest.raises(smt.Unfrozen, match=r"`linear.weight` now require grad"):
        wrapped(x)
    assert wrapped.encoder.linear.weight.requires_grad


def test_second_forward_on_the_same_batch_recalls_the_encoder(store: Store) -> None:
    """The encoder runs once per distinct batch; the same batch again is recalled, equal."""
    wrapped = _wrapped(store)
    x = torch.randn(4, 6)
    first = wrapped(x)
    second = wrapped(x.clone(), boost=1.0)
    assert torch.equal(first, second)
    assert wrapped.encoder.calls == 1
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    assert wrapped.graph.record is not None
    assert wrapped.graph.record.outcome["encoder"] == "recalled"
    wrapped(torch.randn(4, 6))
    assert wrapped.encoder.calls == 2


def test_results_equal_the_plain_model_in_eval(store: Store) -> None:
    """What the wrapped model answers — computed or recalled — is what the model answers."""
    wrapped = _wrapped(store)
    plain = _model()
    plain.eval()
    x = torch.randn(3, 6)
    for _ in range(2):
        assert torch.allclose(wrapped(x, 2.0), plain(x, 2.0))


def test_training_a_head_behind_a_cached_encoder_matches_the_plain_model(tmp_path: Path) -> None:
    """Two epochs of training the head give the same weights with and without the cache."""
    batches = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    targets = [torch.randn(8, 2, generator=torch.Generator().manual_seed(10 + i)) for i in range(3)]

    def train(model: nn.Module) -> nn.Module:
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trainable, lr=0.1, momentum=0.9)
        for _ in range(2):
            for x, y in zip(batches, targets, strict=True):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
        return model

    plain = _model()
    plain.encoder.requires_grad_(False)
    plain.encoder.eval()
    plain.encoder.train = lambda mode=True: plain.encoder  # type: ignore[method-assign]
    wrapped = _wrapped(Store(tmp_path / "store"))
    train(plain)
    train(wrapped)
    assert wrapped.counts["encoder"]["recalled"] == 3
    for (name, a), b in zip(plain.state_dict().items(), wrapped.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    assert not torch.equal(wrapped.head.weight, _model().head.weight)


def test_running_before_freeze_is_refused(store: Store) -> None:
    """A wrapped model with a declared frozen node is refused until it is frozen."""
    wrapped = smt.wrap(_model(), frozen=["encoder"], store=store)
    with pytest.raises(NotSettled, match=r"somatize\.torch\.freeze"):
        wrapped(torch.randn(2, 6))
    smt.freeze(wrapped)
    wrapped(torch.randn(2, 6))
    assert not wrapped.encoder.training


def test_untraceable_model_error_names_the_call() -> None:
    """fx's failure becomes an error naming the line that stopped it and what to do."""
    with pytest.raises(smt.Untraceable, match=r"if x.sum\(\) > 0.*wrap just the submodule"):
        smt.wrap(Untraceable(), frozen=["linear"])


def test_wrapping_a_single_module_needs_no_tracing(store: Store) -> None:
    """`wrap(module, frozen=True, cached=True)` works on a module fx cannot trace."""
    torch.manual_seed(0)
    module = Untraceable()
    wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    assert list(wrapped.state_dict()) == list(module.state_dict())
    x = torch.rand(2, 3)
    assert torch.equal(wrapped(x), module(x))
    wrapped(x)
    assert wrapped.counts["untraceable"]["recalled"] == 1


def test_declarations_are_checked() -> None:
    """Unknown names, cached-but-not-frozen, nesting and uncalled submodules are refused."""
    with pytest.raises(smt.UnknownSubmodule, match="`encodr` in frozen= is not a submodule"):
        smt.wrap(_model(), frozen=["encodr"])
    with pytest.raises(Unsettled, match="is not frozen"):
        smt.wrap(_model(), cached=["encoder"])
    with pytest.raises(smt.WrapError, match="declared inside `encoder`"):
        smt.wrap(_model(), frozen=["encoder", "encoder.linear"])
    unused = _model()
    unused.spare = nn.Linear(1, 1)
    with pytest.raises(smt.NotCalled, match="`spare` is declared"):
        smt.wrap(unused, frozen=["encoder", "spare"])


def test_cached_input_that_requires_grad_is_refused(store: Store) -> None:
    """A cached node fed by a trainable layer is refused: hits would silently stop training it."""
    wrapped = smt.wrap(Feeds(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    with pytest.raises(smt.CachedInputNeedsGrad, match="requires grad"):
        wrapped(torch.randn(2, 6))


def test_code_that_writes_into_a_recalled_answer_gets_a_copy(store: Store) -> None:
    """In-place writes after a cached node work on recall and leave the kept answer intact."""
    wrapped = smt.wrap(Writes(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 6)
    first = wrapped(x)
    assert torch.equal(wrapped(x), first)
    assert torch.equal(wrapped(x), first)
    assert wrapped.counts["encoder"]["recalled"] == 2


def test_without_a_store_nothing_is_kept() -> None:
    """With no store the cached node simply runs."""
    wrapped = _wrapped(None)
    x = torch.randn(2, 6)
    wrapped(x)
    wrapped(x)
    assert wrapped.encoder.calls == 2
