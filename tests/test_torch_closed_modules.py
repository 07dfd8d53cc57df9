"""A module a model's class reaches through its code — closed over by a method, taken by
default, named in its module — is that very module, not code: what freezing does to it
(eval, no grad) is no change of the class, while another module put in its place is."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as smt
from somatize import Store


class Encoder(nn.Module):
    """A linear map then dropout: answers otherwise in train mode than in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.linear(x))


def _encoder(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder()


def _made_with(sub: nn.Module) -> tuple[nn.Module, Callable[[nn.Module], None]]:
    """A model of a class made here, whose ``__init__`` takes ``sub`` from the function,
    and what rebinds that cell to another module."""

    class Closing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = sub

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.encoder(x)

    def rebind(other: nn.Module) -> None:
        nonlocal sub
        sub = other

    return Closing(), rebind


def _taking(sub: nn.Module) -> Callable[[nn.Module], None]:
    """An ``__init__`` setting ``sub``, which it closes over, as the encoder; its
    ``rebind`` puts another module in that cell."""

    def __init__(self: nn.Module) -> None:
        nn.Module.__init__(self)
        self.encoder = sub

    def rebind(other: nn.Module) -> None:
        nonlocal sub
        sub = other

    __init__.rebind = rebind  # type: ignore[attr-defined]
    return __init__


class Closing(nn.Module):
    """Takes its encoder from a cell its ``__init__`` closes over."""

    __init__ = _taking(_encoder())  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


SHARED = _encoder()
DEFAULT = _encoder()


class Defaulting(nn.Module):
    """Takes its encoder by default."""

    def __init__(self, encoder: nn.Module = DEFAULT) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class Global(nn.Module):
    """Takes its encoder from a name of its module."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = SHARED

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def _model(held: str) -> tuple[nn.Module, Callable[[nn.Module], None]]:
    """A model whose class reaches its encoder as ``held`` says, in train mode, and what
    puts another module where the class reaches it."""
    if held == "class made in a function":
        return _made_with(_encoder())
    if held == "closure":
        rebind: Callable[[nn.Module], None] = Closing.__init__.rebind  # type: ignore[attr-defined]
        rebind(_encoder())
        return Closing().train(), rebind
    if held == "default":
        model: nn.Module = Defaulting()

        def other_default(other: nn.Module) -> None:
            Defaulting.__init__.__defaults__ = (other,)

        return model.train(), other_default

    def other_global(other: nn.Module) -> None:
        sys.modules[__name__].SHARED = other

    return Global().train(), other_global


@pytest.fixture(autouse=True)
def _puts_back_what_is_rebound() -> Any:
    defaults, shared = Defaulting.__init__.__defaults__, SHARED
    yield
    Defaulting.__init__.__defaults__ = defaults
    sys.modules[__name__].SHARED = shared
    Closing.__init__.rebind(_encoder())  # type: ignore[attr-defined]


HELD = ["closure", "default", "global"]


@pytest.mark.parametrize("held", ["class made in a function", *HELD])
def test_a_module_the_class_reaches_frozen_by_wrap_is_no_change_of_code(
    held: str, store: Store
) -> None:
    """A model whose ``__init__`` takes its encoder from a cell of the function that made
    its class, a default or a name of its module, wrapped with that encoder frozen and
    cached and frozen (put in eval, no grad), runs and recalls: freezing the module the
    class reaches was taken for its code changed, and the first call refused."""
    model, _ = _model(held)
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    first = wrapped(x)
    with torch.no_grad():
        assert torch.equal(first, model.encoder(x))
    assert torch.equal(wrapped(x), first)
    assert wrapped.counts["encoder"]["recalled"] == 1


@pytest.mark.parametrize("held", HELD)
def test_a_module_the_class_reaches_frozen_by_a_row_cache_is_no_change_of_code(
    held: str,
) -> None:
    """The same model cached per row (frozen whole: eval, no grad) computes its rows, then
    recalls them: they were refused as computed by code changed since."""
    model, _ = _model(held)
    cached = smt.cache_rows(model)
    x = torch.randn(3, 4)
    first = cached(x)
    with torch.no_grad():
        assert torch.equal(first, model.encoder(x))
    assert torch.equal(cached(x), first)
    assert cached.stats.computed == 3


@pytest.mark.parametrize("held", ["closure", "default"])
def test_another_module_where_the_class_reaches_it_is_still_refused(
    held: str, store: Store
) -> None:
    """Another module put where the class's ``__init__`` reaches its encoder (the cell
    rebound, another default) after ``wrap`` or ``cache_rows`` is refused at the next
    call, as any change of the class's code is."""
    model, rebind = _model(held)
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    wrapped(x)
    rebind(_encoder(1))
    with pytest.raises(smt.WrapError, match=r"__init__"):
        wrapped(x)
    model, rebind = _model(held)
    cached = smt.cache_rows(model)
    cached(x)
    rebind(_encoder(2))
    with pytest.raises(smt.RowsError, match=r"__init__"):
        cached(x)


OUTSIDE = _encoder().eval()
CLOSED = _encoder().eval()


def _calls(outside: nn.Module) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """A forward calling ``outside``, which it closes over."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return outside(x) * 2.0

    def rebind(other: nn.Module) -> None:
        nonlocal outside
        outside = other

    forward.rebind = rebind  # type: ignore[attr-defined]
    return forward


class CallsClosed(nn.Module):
    """Calls a module its forward closes over, which it does not hold."""

    forward = _calls(CLOSED)


class CallsGlobal(nn.Module):
    """Calls a module its module names, which it does not hold."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return OUTSIDE(x) * 2.0


def _calling(held: str) -> tuple[nn.Module, nn.Module, Callable[[nn.Module], None]]:
    """A model whose forward calls a module it does not hold, reached as ``held`` says, a
    new one put there first, that module, and what puts another in its place."""

    def other_global(other: nn.Module) -> None:
        sys.modules[__name__].OUTSIDE = other

    rebind = CallsClosed.forward.rebind if held == "closure" else other_global  # type: ignore[attr-defined]
    outside = _encoder().eval()
    rebind(outside)
    return (CallsClosed() if held == "closure" else CallsGlobal()), outside, rebind


@pytest.mark.parametrize(
    ("held", "change"),
    [
        ("global", "weights"),
        ("global", "mode"),
        ("closure", "weights"),
        ("closure", "mode"),
        ("closure", "another"),
    ],
)
def test_a_module_the_class_calls_and_the_model_does_not_hold_is_still_watched(
    held: str, change: str
) -> None:
    """A module a forward calls that the model does not hold (closed over, named in its
    module), so that no weight nor mode of it is keyed with the model's, is still watched
    through the class: its rows are computed, then recalled, and once its weights are
    changed in place, it is put in train mode, or another module is put in the cell after
    ``cache_rows``, the next call is refused, never recalled as computed by the module as it
    was."""
    model, outside, rebind = _calling(held)
    cached = smt.cache_rows(model)
    x = torch.randn(3, 4)
    first = cached(x)
    assert torch.equal(cached(x), first) and cached.stats.computed == 3
    if change == "weights":
        with torch.no_grad():
            outside.linear.weight.mul_(2.0)
    elif change == "mode":
        outside.train()
    else:
        rebind(_encoder(3).eval())
    with pytest.raises(smt.RowsError, match=r"forward|OUTSIDE"):
        cached(x)


def _heads_with(head: nn.Module) -> tuple[Callable[..., None], Callable[..., torch.Tensor]]:
    """An ``__init__`` holding ``head`` beside a new encoder, and a forward scaling what
    ``head`` answers by whether it trains, both closing over it."""

    def __init__(self: nn.Module) -> None:
        nn.Module.__init__(self)
        self.encoder = _encoder()
        self.head = head

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        z = self.head(self.encoder(x))
        return z * 3.0 if head.training else z

    return __init__, forward


class TrainsHead(nn.Module):
    """Trains a head its methods close over, on a frozen encoder."""

    __init__, forward = _heads_with(nn.Linear(4, 2))  # type: ignore[assignment]


def _head_stepped(model: nn.Module, store: Store) -> tuple[nn.Module, torch.Tensor]:
    """``model`` wrapped with its encoder frozen and cached, frozen, its head stepped by an
    optimizer, then called in eval and back in train mode, each call answering as the model
    does; the wrapped model, and the input it was called with."""
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    wrapped(x).sum().backward()
    optimizer.step()
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        wrapped.eval()
        assert torch.equal(wrapped(x), model(x))
        wrapped.train()
    return wrapped, x


def test_a_trained_head_the_class_closes_over_is_no_change_of_code(store: Store) -> None:
    """A trainable head of the model that its class's methods close over, stepped by an
    optimizer and put in eval with the model, is the model's part: the calls answer as the
    model does, where each was refused as the class's code changed; its flag, read through
    the cell, is still that of a part (left in eval while the model trains, refused)."""
    model = TrainsHead()
    wrapped, x = _head_stepped(model, store)
    with torch.no_grad():
        model.head.eval()
        with pytest.raises(smt.WrapError, match=r"different modes"):
            wrapped(x)


def _pick(parts: Any, at: int) -> nn.Module:
    """The encoder (0) or the activation (1) of ``parts``, however they are held."""
    if isinstance(parts, (dict, nn.ModuleDict)):
        return _pick(parts["all"], at) if "all" in parts else parts[("encoder", "act")[at]]
    return parts[at]


def _through(parts: Any) -> tuple[Callable[..., None], Callable[..., torch.Tensor]]:
    """An ``__init__`` holding the encoder and activation of ``parts`` beside a new head,
    and a forward calling them through ``parts``, both closing over it."""

    def __init__(self: nn.Module) -> None:
        nn.Module.__init__(self)
        self.encoder, self.act = _pick(parts, 0), _pick(parts, 1)
        self.head = nn.Linear(4, 2)

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.head(_pick(parts, 1)(_pick(parts, 0)(x)))

    return __init__, forward


class ThroughParts(nn.Module):
    """Reaches its encoder and activation through a container its methods close over."""

    __init__, forward = _through([_encoder(), nn.ReLU()])  # type: ignore[assignment]


def _bound_apply(parts: Any, x: torch.Tensor) -> torch.Tensor:
    return _pick(parts, 1)(_pick(parts, 0)(x))


class BoundParts(nn.Module):
    """Reaches its encoder and activation through a container a partial it holds binds."""

    apply = functools.partial(_bound_apply, [_encoder(), nn.ReLU()])

    def __init__(self) -> None:
        super().__init__()
        parts = type(self).apply.args[0]
        self.encoder, self.act = _pick(parts, 0), _pick(parts, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.apply(x))


@pytest.fixture
def _puts_back_the_parts() -> Any:
    methods, apply = (ThroughParts.__init__, ThroughParts.forward), BoundParts.apply
    yield
    ThroughParts.__init__, ThroughParts.forward = methods  # type: ignore[method-assign]
    BoundParts.apply = apply


KINDS = ["list", "tuple", "dict", "ModuleList", "ModuleDict", "nested"]


def _in_parts(held: str, kind: str) -> tuple[nn.Module, Any]:
    """A model in train mode whose class reaches its encoder and activation (a ReLU) through
    a container of ``kind`` its methods close over (``held`` "closure") or a partial it
    holds binds ("partial"), and that container."""
    encoder, act = _encoder(), nn.ReLU()
    parts: Any = {
        "list": lambda: [encoder, act],
        "tuple": lambda: (encoder, act),
        "dict": lambda: {"encoder": encoder, "act": act},
        "ModuleList": lambda: nn.ModuleList([encoder, act]),
        "ModuleDict": lambda: nn.ModuleDict({"encoder": encoder, "act": act}),
        "nested": lambda: {"all": [encoder, act]},
    }[kind]()
    if held == "closure":
        ThroughParts.__init__, ThroughParts.forward = _through(parts)  # type: ignore[method-assign]
        return ThroughParts().train(), parts
    BoundParts.apply = functools.partial(_bound_apply, parts)
    return BoundParts().train(), parts


@pytest.mark.usefixtures("_puts_back_the_parts")
@pytest.mark.parametrize(
    ("held", "kind"), [*(("closure", kind) for kind in KINDS), ("partial", "list")]
)
def test_modules_in_a_container_the_class_reaches_are_no_change_of_code(
    held: str, kind: str, store: Store
) -> None:
    """A model whose class reaches its encoder and activation through a list, tuple or dict
    (or a ``ModuleList``, ``ModuleDict``, a list in a dict) its methods close over or a
    partial binds, wrapped with the encoder frozen and cached, frozen, its head stepped by
    an optimizer, put in eval and back: each call answers as the model does and the encoder
    is recalled, where the first call after ``freeze`` was refused as the class's code
    changed (the container was read whole, the modes of the modules in it with it)."""
    model, _ = _in_parts(held, kind)
    wrapped, x = _head_stepped(model, store)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    assert wrapped.counts["encoder"]["recalled"] == 3


@pytest.mark.usefixtures("_puts_back_the_parts")
@pytest.mark.parametrize("kind", KINDS)
def test_modules_in_a_container_are_keyed_by_a_row_cache_not_refused(kind: str) -> None:
    """The same model cached per row (frozen whole) recalls its rows; its encoder's weights
    changed in place key the rows anew, computed with the new weights, and a part put in
    train mode is put back in eval: both were refused as the class's code changed."""
    model, _ = _in_parts("closure", kind)
    cached = smt.cache_rows(model)
    x = torch.randn(3, 4)
    first = cached(x)
    assert torch.equal(cached(x), first) and cached.stats.computed == 3
    with torch.no_grad():
        model.encoder.linear.weight.mul_(2.0)
        now = cached(x)
        assert torch.equal(now, model(x)) and not torch.equal(now, first)
    assert cached.stats.computed == 6
    model.encoder.train()
    with pytest.warns(smt.StillChanging):
        assert torch.equal(cached(x), now)
    assert cached.stats.computed == 6


def _changed(parts: Any, change: str) -> None:
    """Changes what ``parts`` holds as ``change`` says: another encoder in its place, a
    module added, or the activation taken out."""
    inner = parts["all"] if isinstance(parts, dict) and "all" in parts else parts
    named = isinstance(inner, (dict, nn.ModuleDict))
    if change == "replaced":
        inner["encoder" if named else 0] = _encoder(1)
    elif change == "added" and named:
        inner["more"] = nn.Tanh()
    elif change == "added":
        inner.append(nn.Tanh())
    else:
        del inner["act" if named else 1]


@pytest.mark.usefixtures("_puts_back_the_parts")
@pytest.mark.parametrize("change", ["replaced", "added", "removed"])
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "tuple"])
def test_a_container_the_class_reaches_changed_is_still_refused(
    kind: str, change: str, store: Store
) -> None:
    """A module replaced in the container the class reaches, one added to it or one taken
    out after ``wrap`` or ``cache_rows`` is refused at the next call, as any change of the
    class's code is: the container is watched by which modules it holds."""
    model, parts = _in_parts("closure", kind)
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    wrapped(x)
    _changed(parts, change)
    with pytest.raises(smt.WrapError, match=r"ThroughParts"):
        wrapped(x)
    model, parts = _in_parts("closure", kind)
    cached = smt.cache_rows(model)
    cached(x)
    _changed(parts, change)
    with pytest.raises(smt.RowsError, match=r"ThroughParts"):
        cached(x)
