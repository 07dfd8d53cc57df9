"""A plain node keeping torch weights, settled by its own ``settled_state()``: the weights
are watched from ``somatize.data.settle(g)`` on, and a change since is refused where the
node's key is needed until it is settled again."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as smt
from somatize import Broker, Graph, Node, NotSettled, Store, Worker
from somatize.data import SameDigestOtherValues, settle


class Span(Node):
    """Rows of a fixed random table, by coordinate."""

    def forward(self, span: dict[str, int], ctx: Any) -> torch.Tensor:
        generator = torch.Generator().manual_seed(span["at"])
        return torch.randn(span["take"], 4, generator=generator)


class Predict(Node):
    """A plain node keeping a Linear as an attribute, saying its weights' digest."""

    def __init__(self) -> None:
        self.encoder = nn.Linear(4, 2)

    def settled_state(self) -> str:
        return smt.digest_named(self.encoder.state_dict())

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        with torch.no_grad():
            return self.encoder(x)


class PredictListed(Node):
    """The same, keeping a parameter of its own in a list."""

    def __init__(self) -> None:
        self.weights = [nn.Parameter(torch.ones(4, 2), requires_grad=False)]

    def settled_state(self) -> str:
        return smt.digest_named({"w": self.weights[0]})

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        with torch.no_grad():
            return x @ self.weights[0]


def _graph(node: Node) -> Graph:
    g = Graph.somatize(Span().named("span").frozen() >> node.named("predict").frozen().cached())
    settle(g)
    return g


def _each(argument: str, changes: list[Callable[[Predict], None]]) -> pytest.MarkDecorator:
    """Runs a test once per change, named after it."""
    return pytest.mark.parametrize(argument, changes, ids=lambda change: change.__name__.strip("_"))


def _truth(g: Graph, span: dict[str, int]) -> torch.Tensor:
    """What ``g``'s node computes now for ``span``, called by hand."""
    return g.node("predict").forward(Span().forward(span, None), None)


def _add_in_place(node: Predict) -> None:
    with torch.no_grad():
        node.encoder.weight.add_(1.0)


def _load_state_dict(node: Predict) -> None:
    node.encoder.load_state_dict({k: v + 1.0 for k, v in node.encoder.state_dict().items()})


def _optimizer_step(node: Predict) -> None:
    optimizer = torch.optim.SGD(node.encoder.parameters(), lr=1.0)
    node.encoder(torch.ones(1, 4)).sum().backward()
    optimizer.step()


def _fused_step_gradients_dropped(node: Predict) -> None:
    """A fused optimizer's step moves no version counter, and its gradients are dropped."""
    optimizer = torch.optim.AdamW(node.encoder.parameters(), lr=1.0, fused=True)
    node.encoder(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _data_replaced(node: Predict) -> None:
    node.encoder.weight.data = node.encoder.weight.data + 1.0


CHANGES: list[Callable[[Predict], None]] = [
    _add_in_place,
    _load_state_dict,
    _optimizer_step,
    _fused_step_gradients_dropped,
    _data_replaced,
]


@_each("change", CHANGES)
def test_weights_changed_since_settle_are_refused_until_settled_again(
    store: Store, change: Callable[[Predict], None]
) -> None:
    """Weights changed after ``settle(g)`` were keyed by the state settled: the next forward
    recalled the answer of the old weights, and a miss kept the new weights' answer under
    the old key. It is refused before anything runs, naming the node and the attribute and
    saying to settle again; once settled, it computes with the weights it holds."""
    node = Predict()
    g = _graph(node)
    span, other = {"at": 0, "take": 3}, {"at": 7, "take": 3}
    kept = g.forward(span, store=store)
    change(node)
    said = r"`predict` .*`self\.encoder`, an nn\.Module, changed.*settle\(g\)` again"
    for asked in (span, other):
        with pytest.raises(NotSettled, match=said):
            g.forward(asked, store=store)
    now = g.forward(span)  # with no store nothing is keyed: it runs as it is
    assert torch.equal(now, _truth(g, span))
    assert not torch.allclose(now, kept)
    settle(g)
    assert torch.equal(g.forward(span, store=store), now)
    assert g.record is not None and g.record.outcome["predict"] == "ran"
    assert torch.equal(g.forward(other, store=store), _truth(g, other))


_ASKED: list[str] = []
"""The names of the nodes :class:`PredictAsked` was asked its state as, one a time."""


class PredictAsked(Predict):
    """The same, noting each time it is asked its state."""

    def settled_state(self) -> str:
        _ASKED.append(type(self).__name__)
        return super().settled_state()


@_each("change", [_add_in_place, _optimizer_step])
def test_weights_put_back_go_on_and_never_poison_the_old_key(
    change: Callable[[Predict], None], store: Store
) -> None:
    """Weights changed since ``settle(g)`` and then loaded back from the settled state go on
    (the same values give the same answers): the node recalls what the settled weights
    computed, and changed again it is refused again. Refused, it is not asked its state at
    a forward that finds nothing touched, and nothing is kept under the settled key. They
    stayed refused until ``settle(g)``. A step that leaves its gradients on the weights (a
    loop calling ``zero_grad()`` before ``backward()``) is no touch at each forward after
    it: the node was asked at each."""
    node = PredictAsked().identified("tests.test_torch_settled:PredictAsked")
    g = _graph(node)
    span = {"at": 3, "take": 2}
    kept = g.forward(span, store=store)
    settled = copy.deepcopy(node.encoder.state_dict())
    change(node)
    _ASKED.clear()
    for _ in range(3):
        with pytest.raises(NotSettled):
            g.forward(span, store=store)
    assert len(_ASKED) == 1  # asked once, at the change
    node.encoder.load_state_dict(settled)
    assert torch.equal(g.forward(span, store=store), kept)
    assert g.record is not None and g.record.outcome["predict"] == "recalled"
    assert torch.equal(kept, _truth(g, span))
    _load_state_dict(node)
    with pytest.raises(NotSettled, match=r"`self\.encoder`, an nn\.Module, changed"):
        g.forward(span, store=store)


def test_weights_put_back_to_other_values_stay_refused(store: Store) -> None:
    """Weights changed since ``settle(g)`` and changed again to values that are not the
    settled ones bit for bit (a step taken back in float arithmetic) stay refused; once
    settled, the node computes with the weights it holds."""
    node = Predict()
    g = _graph(node)
    span = {"at": 3, "take": 2}
    with torch.no_grad():
        node.encoder.weight.add_(1e8)
    with pytest.raises(NotSettled):
        g.forward(span, store=store)
    with torch.no_grad():
        node.encoder.weight.sub_(1e8)  # rounded: not the values settled
    with pytest.raises(NotSettled):
        g.forward(span, store=store)
    settle(g)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))
    assert torch.equal(g.forward(span, store=store), _truth(g, span))
    assert g.record is not None and g.record.outcome["predict"] == "recalled"


def test_a_parameter_kept_in_a_list_is_watched_too(store: Store) -> None:
    """A parameter a node keeps in a list is its weights as a module is."""
    node = PredictListed()
    g = _graph(node)
    span = {"at": 1, "take": 2}
    g.forward(span, store=store)
    with torch.no_grad():
        node.weights[0].mul_(2.0)
    with pytest.raises(NotSettled, match=r"`self\.weights`, a parameter, changed"):
        g.forward(span, store=store)
    settle(g)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


def test_a_module_put_in_place_of_the_one_settled_is_refused(store: Store) -> None:
    """A module put in place of the one settled, in a list the node keeps, is other weights."""

    class Listed(Node):
        def __init__(self) -> None:
            self.layers = [nn.Linear(4, 2)]

        def settled_state(self) -> str:
            return smt.digest_named(self.layers[0].state_dict())

        def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
            with torch.no_grad():
                return self.layers[0](x)

    node = Listed().identified("tests.test_torch_settled:Listed")
    g = _graph(node)
    span = {"at": 2, "take": 2}
    g.forward(span, store=store)
    node.layers[0] = nn.Linear(4, 2)
    with pytest.raises(NotSettled, match=r"`self\.layers` was given another object"):
        g.forward(span, store=store)


class Activated(Predict):
    """The docs' recipe over a module in eval with a part that has no weights, a BatchNorm
    reading ``eps`` and a dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(4, 2), nn.Tanh(), nn.BatchNorm1d(2), nn.Dropout(0.5)
        ).eval()


def _relu_for_tanh(encoder: nn.Module, back: bool) -> None:
    encoder[1] = (nn.Tanh() if back else nn.ReLU()).eval()


def _eps_set(encoder: nn.Module, back: bool) -> None:
    encoder[2].eps = 1e-5 if back else 0.5


def _train_mode(encoder: nn.Module, back: bool) -> None:
    encoder.train(not back)


@pytest.mark.parametrize("graded", [False, True], ids=["", "gradient-held"])
@pytest.mark.parametrize(
    "change", [_relu_for_tanh, _eps_set, _train_mode], ids=lambda change: change.__name__[1:]
)
def test_what_changes_answers_but_no_weight_is_refused(
    store: Store, change: Callable[[nn.Module, bool], None], graded: bool
) -> None:
    """``nn.ReLU`` put in place of the settled module's ``nn.Tanh``, its BatchNorm's
    ``eps`` set, or the module put in train mode changes every answer, yet no weight nor
    what its ``settled_state()`` says: the next forward recalled the old answer. It is
    refused, as a module put in place of one is; put back, the node goes on. Weights
    holding a gradient, weighed again at each forward, are refused alike."""
    node = Activated().identified("tests.test_torch_settled:Activated")
    if graded:
        _given_a_gradient(node)
    g = _graph(node)
    span = {"at": 4, "take": 3}
    g.forward(span, store=store)
    change(node.encoder, False)
    with pytest.raises(NotSettled, match="other values"):
        g.forward(span, store=store)
    change(node.encoder, True)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


@pytest.mark.parametrize("copied", ["deepcopy", "pickle"])
def test_a_copied_graph_watches_its_own_weights(store: Store, copied: str) -> None:
    """A copy of a settled graph watches the copy's weights, and one copied after the
    original's changed is refused as the original is."""

    def copy_of(g: Graph) -> Graph:
        return copy.deepcopy(g) if copied == "deepcopy" else pickle.loads(pickle.dumps(g))

    g = _graph(Predict())
    span = {"at": 4, "take": 2}
    g.forward(span, store=store)
    again = copy_of(g)
    assert torch.equal(again.forward(span, store=store), _truth(g, span))
    _add_in_place(again.node("predict"))  # type: ignore[arg-type]
    with pytest.raises(NotSettled):
        again.forward(span, store=store)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))
    _add_in_place(g.node("predict"))  # type: ignore[arg-type]
    with pytest.raises(NotSettled):
        copy_of(g).forward(span, store=store)


def test_a_graph_pickled_before_settled_nodes_were_watched_is_read_and_forwards(
    store: Store,
) -> None:
    """A graph pickled by a somatize that watched no settled node's weights holds neither
    table of them: read back, it forwards as its state says."""
    g = _graph(Predict())
    span = {"at": 3, "take": 5}
    first = g.forward(span, store=store)
    state = g.__getstate__()
    del state["_settled_watches"], state["_changed_since_settled"]
    older = Graph.__new__(Graph)
    older.__setstate__(state)
    assert torch.equal(older.forward(span, store=store), first)


def _there_and_back(node: Predict) -> None:
    node.encoder.to(torch.float64)  # another dtype stands in for another device
    node.encoder.to(torch.float32)


def _given_a_gradient(node: Predict) -> None:
    node.encoder(torch.ones(1, 4)).sum().backward()


def _loaded_as_it_is(node: Predict) -> None:
    node.encoder.load_state_dict({k: v.clone() for k, v in node.encoder.state_dict().items()})


def _gradients_dropped(node: Predict) -> None:
    _given_a_gradient(node)
    node.encoder.zero_grad(set_to_none=True)
    node.encoder.weight.requires_grad_(False)


EQUAL = [_there_and_back, _given_a_gradient, _loaded_as_it_is, _gradients_dropped]


@_each("touch", EQUAL)
def test_weights_touched_but_equal_are_followed_without_settling_again(
    store: Store, touch: Callable[[Predict], None]
) -> None:
    """Moving the weights away and back, a gradient, or loading the very values they hold
    leaves the state the node was settled at: it was refused until settled again. Its own
    ``settled_state()`` is asked once and says the same digest, so the answer is recalled."""
    node = Predict()
    g = _graph(node)
    span = {"at": 5, "take": 3}
    kept = g.forward(span, store=store)
    touch(node)
    assert torch.equal(g.forward(span, store=store), kept)
    assert g.record is not None and g.record.outcome["predict"] == "recalled"


class Counted(Predict):
    """Counts the times its ``settled_state()`` is asked."""

    asked = 0

    def settled_state(self) -> str:
        self.asked += 1
        return super().settled_state()


def test_an_equal_state_is_asked_for_once_per_change(store: Store) -> None:
    """The node's ``settled_state()`` is asked when its weights were touched, once, and
    not at the forwards after; a real change after that is refused as before."""

    node = Counted().identified("tests.test_torch_settled:Counted")
    g = _graph(node)
    span = {"at": 6, "take": 2}
    g.forward(span, store=store)
    assert node.asked == 1  # by settle(g)
    _there_and_back(node)
    for _ in range(3):
        g.forward(span, store=store)
    assert node.asked == 2
    _add_in_place(node)
    for _ in range(2):
        with pytest.raises(NotSettled, match=r"`self\.encoder`, an nn\.Module, changed"):
            g.forward(span, store=store)
    assert node.asked == 3


def test_a_settled_state_that_raises_when_asked_again_is_refused_saying_why(
    store: Store,
) -> None:
    """A ``settled_state()`` that raises when the watch asks whether the weights are still
    equal leaves the node refused, the message naming the error, until settled again."""

    class Fickle(Predict):
        broken = False

        def settled_state(self) -> str:
            if self.broken:
                raise RuntimeError("the checkpoint is gone")
            return super().settled_state()

    node = Fickle().identified("tests.test_torch_settled:Fickle")
    g = _graph(node)
    span = {"at": 8, "take": 2}
    g.forward(span, store=store)
    node.broken = True
    _there_and_back(node)
    said = r"`settled_state\(\)` raised RuntimeError: the checkpoint is gone.*settle\(g\)` again"
    with pytest.raises(NotSettled, match=said):
        g.forward(span, store=store)
    node.broken = False
    settle(g)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


class LoadedOnce(Predict):
    """Says the digest of the weights it was built with, worked out once: its
    ``settled_state()`` does not hear them change after (a checkpoint's digest)."""

    def __init__(self) -> None:
        super().__init__()
        self._loaded = smt.digest_named(self.encoder.state_dict())

    def settled_state(self) -> str:
        return self._loaded


@_each("change", CHANGES)
def test_weights_changed_where_settled_state_says_the_same_digest_are_refused(
    store: Store, change: Callable[[Predict], None]
) -> None:
    """The watch is there for what ``settled_state()`` does not hear: weights stepped after
    settle are refused though it still says the digest it was settled at, never recalled
    as answers of the weights they no longer hold."""
    node = LoadedOnce().identified("tests.test_torch_settled:LoadedOnce")
    _refused_for_other_values(node, change, {"at": 3, "take": 2}, store)


def _refused_for_other_values(
    node: Node, change: Callable[[Any], None], span: dict[str, int], store: Store
) -> Graph:
    """The graph of ``node``, settled, whose forward after ``change`` is refused, saying
    the weights hold other values."""
    g = _graph(node)
    g.forward(span, store=store)
    change(node)
    with pytest.raises(NotSettled, match=r"other values.*settle\(g\)` again"):
        g.forward(span, store=store)
    return g


class Scaled(Predict):
    """The docs' recipe over a module reading a buffer ``state_dict()`` leaves out
    (``persistent=False``): its ``settled_state()`` does not hear that buffer change."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder.register_buffer("scale", torch.ones(2), persistent=False)

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return super().forward(x, ctx) * self.encoder.scale


def _scale_written(node: Predict) -> None:
    with torch.no_grad():
        node.encoder.scale.add_(1.0)


@pytest.mark.parametrize(
    ("node", "change"),
    [(LoadedOnce(), _add_in_place), (Scaled(), _scale_written)],
    ids=["digest-worked-out-once", "buffer-not-in-state-dict"],
)
def test_settling_again_at_the_same_digest_with_other_values_is_refused(
    store: Store, node: Predict, change: Callable[[Predict], None]
) -> None:
    """A node refused for values its ``settled_state()`` does not hear was settled again at
    the very digest it had: its next forward recalled the old values' answer. ``settle``
    refuses it, saying to digest what the forward reads, and the node stays refused."""
    node = node.identified(f"tests.test_torch_settled:{type(node).__name__}")
    g = _graph(node)
    span = {"at": 5, "take": 2}
    g.forward(span, store=store)
    change(node)
    with pytest.raises(NotSettled, match="other values"):
        g.forward(span, store=store)
    with pytest.raises(SameDigestOtherValues, match=r"digest_state\(self.encoder\)"):
        settle(g)
    with pytest.raises(NotSettled):
        g.forward(span, store=store)


def test_settling_again_at_once_at_the_same_digest_with_other_values_is_refused(
    store: Store,
) -> None:
    """So too where it is settled again before any forward saw the change."""
    node = Scaled().identified("tests.test_torch_settled:Scaled")
    g = _graph(node)
    g.forward({"at": 5, "take": 2}, store=store)
    _scale_written(node)
    with pytest.raises(SameDigestOtherValues):
        settle(g)


def test_a_gradient_written_at_every_step_asks_the_node_nothing(store: Store) -> None:
    """A gradient left on the weights at each step (their module trained along, out of
    the optimizer) moved the watch at every forward, which asked the node's
    ``settled_state()``, a digest of all its weights, each time. The weights held in place
    are compared by their values alone, and the answer is recalled."""

    node = Counted().identified("tests.test_torch_settled:Counted")
    g = _graph(node)
    span = {"at": 6, "take": 2}
    kept = g.forward(span, store=store)
    for _ in range(3):
        node.encoder.zero_grad(set_to_none=True)
        _given_a_gradient(node)
        assert torch.equal(g.forward(span, store=store), kept)
        assert g.record is not None and g.record.outcome["predict"] == "recalled"
    assert node.asked == 1  # by settle(g)


def _stepped_fused(node: Predict, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad(set_to_none=False)  # the gradient is added to in place
    _given_a_gradient(node)
    optimizer.step()


@pytest.mark.parametrize("backward_before_forward", [True, False])
def test_a_fused_optimizer_step_is_refused(store: Store, backward_before_forward: bool) -> None:
    """A fused optimizer steps a weight in place without moving its version counter, and a
    gradient added to in place stays the same object: the step went unseen and the answer
    of the weights settled was recalled. The step moves the version counter of each weight
    it stepped, and the node is refused as for any optimizer step."""
    node = Predict()
    optimizer = torch.optim.SGD(node.encoder.parameters(), lr=0.5, fused=True)
    _given_a_gradient(node)
    g = _graph(node)
    span = {"at": 2, "take": 3}
    g.forward(span, store=store)
    if backward_before_forward:
        _stepped_fused(node, optimizer)
    else:
        optimizer.step()  # with the gradient held when the forward looked
    with pytest.raises(NotSettled, match=r"`self\.encoder`, an nn\.Module, changed.*settle\(g\)"):
        g.forward(span, store=store)
    settle(g)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


def _stepped_through_data(weights: list[torch.Tensor]) -> None:
    """An optimizer of one's own: steps ``weights`` through ``.data``, which moves no
    version counter (as a fused kernel does not), then drops their gradients."""
    for weight in weights:
        assert weight.grad is not None
        weight.data.sub_(0.5 * weight.grad)
        weight.grad = None


def _stepped_by_hand_then_dropped(node: Predict) -> None:
    _given_a_gradient(node)
    _stepped_through_data(list(node.encoder.parameters()))


def _listed_stepped_by_hand_then_dropped(node: PredictListed) -> None:
    weight = node.weights[0].requires_grad_(True)
    (torch.ones(1, 4) @ weight).sum().backward()
    _stepped_through_data([weight])


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (Predict, _stepped_by_hand_then_dropped),
        (PredictListed, _listed_stepped_by_hand_then_dropped),
    ],
    ids=["module", "listed-parameter"],
)
def test_a_step_moving_no_version_whose_gradient_was_dropped_before_the_forward_is_refused(
    store: Store, make: Callable[[], Any], change: Callable[[Any], None]
) -> None:
    """A weight given a gradient after the forward, stepped by what moves no version
    counter (an optimizer of one's own writing through ``.data``) and its gradient
    dropped before the next forward kept its version, its
    memory and its gradient as watched: the step went unseen, and the answer of the
    weights settled was recalled. A gradient accumulated since the forward looked has
    the values compared, and the step is refused."""
    span = {"at": 4, "take": 3}
    g = _refused_for_other_values(make(), change, span, store)
    settle(g)
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


@pytest.mark.parametrize("copied", ["deepcopy", "pickle"])
def test_a_copy_made_after_a_write_through_data_under_a_gradient_is_refused(
    store: Store, copied: str
) -> None:
    """Weights holding a gradient are weighed again at each forward. A write through
    ``.data`` moves no version counter; a copy of the graph made after it holds the written
    values, and is refused as the original is, not weighed against its own values."""
    node = Predict()
    _given_a_gradient(node)
    g = _graph(node)
    span = {"at": 1, "take": 2}
    g.forward(span, store=store)
    node.encoder.weight.data.add_(1.0)
    again = copy.deepcopy(g) if copied == "deepcopy" else pickle.loads(pickle.dumps(g))
    with pytest.raises(NotSettled, match=r"settle\(g\)"):
        again.forward(span, store=store)
    with pytest.raises(NotSettled, match=r"settle\(g\)"):
        g.forward(span, store=store)


def _hook_registered(encoder: nn.Module) -> None:
    """A hook of every module's, as a profiler registers (`FlopCounterMode`)."""
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: None)
    encoder.__dict__["_test_handle"] = handle  # removed as the test ends


def _eps_set_as_it_was(encoder: nn.Module) -> None:
    encoder[2].eps = float(str(encoder[2].eps))  # an equal value, another object


@pytest.mark.parametrize(
    "touch", [_hook_registered, _eps_set_as_it_was], ids=lambda touch: touch.__name__[1:]
)
def test_a_touch_beside_the_weights_leaving_the_values_is_looked_at_once(
    store: Store, touch: Callable[[nn.Module], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook registered on the settled module (a profiler's), or a value its part keeps
    set again to an equal one, leaves every value it was settled with: the watch of what
    the parts keep went on saying changed, and each forward after digested all the
    weights again. It is looked at once, and the forwards after digest nothing."""
    import somatize_torch._settled as settled

    node = Activated().identified("tests.test_torch_settled:Activated")
    g = _graph(node)
    span = {"at": 4, "take": 3}
    kept = g.forward(span, store=store)
    touch(node.encoder)
    assert torch.equal(g.forward(span, store=store), kept)
    digested: list[None] = []
    values_of = settled._values_of
    monkeypatch.setattr(settled, "_values_of", lambda n: digested.append(None) or values_of(n))
    try:
        for _ in range(3):
            assert torch.equal(g.forward(span, store=store), kept)
            assert g.record is not None and g.record.outcome["predict"] == "recalled"
    finally:
        handle = node.encoder.__dict__.pop("_test_handle", None)
        if handle is not None:
            handle.remove()
    assert digested == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_train_mode, r"mode.*\.eval\(\)"),
        (_eps_set, r"beside its weights.*`eps`"),
        (_relu_for_tanh, r"repr\(self\.encoder\)"),
    ],
    ids=["mode", "eps", "part"],
)
def test_settling_again_says_what_holds_other_values(
    store: Store, change: Callable[[nn.Module, bool], None], said: str
) -> None:
    """Settled again at the same digest after a change its ``settled_state()`` does not
    hear, the refusal spoke of weights and buffers whatever changed: a module put in train
    mode was told to digest its buffers and its ``repr``, neither of which names its mode.
    It says what differs, and what makes the digest tell it."""
    node = Activated().identified("tests.test_torch_settled:Activated")
    g = _graph(node)
    g.forward({"at": 4, "take": 3}, store=store)
    change(node.encoder, False)
    with pytest.raises(SameDigestOtherValues, match=said) as refused:
        settle(g)
    assert "weights and buffers it keeps" not in str(refused.value)


def test_a_hook_put_on_the_settled_module_is_refused(store: Store) -> None:
    """A forward hook registered on the settled module changes its answers, yet no weight
    nor what its ``settled_state()`` says: the next forward recalled the answer without
    the hook. It is refused; removed, the node goes on."""
    node = Activated().identified("tests.test_torch_settled:Activated")
    g = _graph(node)
    span = {"at": 4, "take": 3}
    g.forward(span, store=store)
    handle = node.encoder[0].register_forward_hook(lambda module, args, out: out * 2)
    with pytest.raises(NotSettled, match="other values"):
        g.forward(span, store=store)
    with pytest.raises(SameDigestOtherValues, match="hook"):
        settle(g)
    handle.remove()
    assert torch.equal(g.forward(span, store=store), _truth(g, span))


class Counting(nn.Module):
    """A Linear that counts its calls and builds a mask at its first, as model code does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.calls = 0
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.mask is None:
            self.mask = torch.ones(2)
        return self.linear(x) * self.mask


class PredictCounting(Predict):
    """The docs' recipe over a module whose forward sets values of its own as it runs."""

    def __init__(self) -> None:
        self.encoder = Counting().eval()

    def settled_state(self) -> str:
        return smt.digest_state(self.encoder)


def test_what_a_settled_modules_own_forward_sets_is_its_state(store: Store) -> None:
    """A module that counts its calls, or builds a mask at its first, sets values beside its
    weights as the node runs: that is its state, not a change since it was settled. Each
    forward after the first was refused, and settling again too. The same value set from
    outside between forwards is refused."""
    node = PredictCounting().identified("tests.test_torch_settled:PredictCounting")
    g = _graph(node)
    spans = [{"at": at, "take": 3} for at in (1, 2, 1, 2)]
    outcomes = []
    for span in spans:
        # computed by a copy: a call by hand would set the module's values from outside
        truth = copy.deepcopy(node).forward(Span().forward(span, None), None)
        assert torch.equal(g.forward(span, store=store), truth)
        assert g.record is not None
        outcomes.append(g.record.outcome["predict"])
    assert outcomes == ["ran", "ran", "recalled", "recalled"]
    settle(g)
    g.forward(spans[0], store=store)
    assert g.record is not None and g.record.outcome["predict"] == "recalled"
    node.encoder.mask = torch.full((2,), 2.0)
    with pytest.raises(NotSettled, match=r"settle\(g\)"):
        g.forward(spans[0], store=store)


def test_what_a_settled_modules_own_forward_sets_on_a_local_worker_is_its_state(
    store: Store,
) -> None:
    """A local worker runs the very node, whose module counts its calls there: that is its
    state as with no broker, and each forward after the first goes on."""
    node = PredictCounting().identified("tests.test_torch_settled:PredictCounting")
    g = Graph.somatize(
        Span().named("span").frozen() >> node.named("predict").frozen().cached().at("w1")
    )
    settle(g)
    outcomes = []
    with Broker.embedded({"w1": Worker.generic(mode="local")}) as local:
        for at in (1, 2, 1):
            span = {"at": at, "take": 3}
            truth = copy.deepcopy(node).forward(Span().forward(span, None), None)
            assert torch.equal(g.forward(span, store=store, broker=local), truth)
            assert g.record is not None
            outcomes.append(g.record.outcome["predict"])
    assert outcomes == ["ran", "ran", "recalled"]
    assert node.encoder.calls == 2


class CountingSmall(Counting):
    """Counts its calls, then refuses a batch of more than four rows, as model code does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer = super().forward(x)
        if x.shape[0] > 4:
            raise ValueError("at most four rows")
        return answer


class PredictCountingSmall(PredictCounting):
    def __init__(self) -> None:
        self.encoder = CountingSmall().eval()


def test_what_a_settled_modules_own_forward_sets_before_it_raises_is_its_state(
    store: Store,
) -> None:
    """A forward that counts its call, then raises on its input, set its state as it ran:
    the next forward, given input it takes, goes on."""
    node = PredictCountingSmall().identified("tests.test_torch_settled:PredictCountingSmall")
    g = _graph(node)
    with pytest.raises(Exception, match="at most four rows"):
        g.forward({"at": 1, "take": 9}, store=store)
    span = {"at": 1, "take": 3}
    truth = copy.deepcopy(node).forward(Span().forward(span, None), None)
    assert torch.equal(g.forward(span, store=store), truth)
    assert node.encoder.calls == 2


def test_a_watch_pickled_with_fewer_values_apart_is_read_and_settles_again(store: Store) -> None:
    """A graph pickled by a somatize that kept fewer of a settled node's values apart (no
    hooks), nothing changed since it was settled: read back, it settles again at the same
    digest, and a touch that leaves its weights as they are (moved and back) goes on."""
    g = _graph(Predict())
    span = {"at": 3, "take": 5}
    first = g.forward(span, store=store)
    older = pickle.loads(pickle.dumps(g))
    watch = older._settled_watches["predict"]
    state = watch.__getstate__()  # type: ignore[attr-defined]
    state["values"] = state["values"].rsplit(" ", 1)[0]  # as a release before hooks wrote it
    watch.__setstate__(state)  # type: ignore[attr-defined]
    older_node: Predict = older.node("predict")  # type: ignore[assignment]
    _there_and_back(older_node)
    assert torch.equal(older.forward(span, store=store), first)
    settle(older)
    assert torch.equal(older.forward(span, store=store), first)


def test_a_watch_pickled_with_fewer_values_apart_once_touched_says_to_build_again(
    store: Store,
) -> None:
    """Touched before it was pickled by a somatize that kept fewer of its values apart, a
    settled node's values cannot be compared with that release's record: settling it again
    says so, not that its weights differ."""
    g = _graph(Predict())
    older = pickle.loads(pickle.dumps(g))
    _there_and_back(older.node("predict"))  # type: ignore[arg-type]
    watch = older._settled_watches["predict"]
    state = watch.__getstate__()  # type: ignore[attr-defined]
    assert state["changed"] is not None
    state["values"] = state["values"].rsplit(" ", 1)[0]  # as a release before hooks wrote it
    watch.__setstate__(state)  # type: ignore[attr-defined]
    with pytest.raises(SameDigestOtherValues, match=r"older release.*build the graph again"):
        settle(older)


SHARED = Counting().eval()
"""One module two settled nodes keep, as a shared encoder is."""


class PredictShared(PredictCounting):
    def __init__(self) -> None:
        self.encoder = SHARED


class PredictSharedToo(PredictShared):
    """Another node keeping the same module."""


class Summed(Node):
    def forward(self, x: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x + y


def test_what_a_shared_modules_own_forward_sets_is_the_state_of_each_node_keeping_it(
    store: Store,
) -> None:
    """Two settled nodes keep one module that counts its calls: what either's forward sets is
    the state of both, and each forward after the first goes on."""
    one = PredictShared().identified("tests.test_torch_settled:PredictShared")
    two = PredictSharedToo().identified("tests.test_torch_settled:PredictSharedToo")
    g = Graph.somatize(
        Span().named("span").frozen()
        >> (one.named("one").frozen().cached(), two.named("two").frozen().cached())
        >> Summed().named("summed")
    )
    settle(g)
    outcomes = []
    for at in (1, 2, 1):
        span = {"at": at, "take": 3}
        x = Span().forward(span, None)
        truth = copy.deepcopy(one).forward(x, None) * 2
        assert torch.equal(g.forward(span, store=store), truth)
        assert g.record is not None
        outcomes.append((g.record.outcome["one"], g.record.outcome["two"]))
    assert outcomes == [("ran", "ran"), ("ran", "ran"), ("recalled", "recalled")]
