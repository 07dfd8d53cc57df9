"""Wrapping a model: declared submodules become somatize nodes, the model stays a model."""

from __future__ import annotations

import argparse
import builtins
import collections
import contextlib
import copy
import cProfile
import dataclasses
import enum
import functools
import inspect
import io
import json
import linecache
import logging
import math
import operator
import os
import pickle
import pstats
import random
import re
import subprocess
import sys
import threading
import time
import types
import unicodedata
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from random import random as draw_at_random
from typing import Any, ClassVar, TypeVar

import numpy as np
import pytest
import torch
from moto.core.authorization import enable_iam_authentication
from torch import nn
from torch.autograd import forward_ad
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import _pytree as pytree
from torch.utils.checkpoint import checkpoint

import somatize.torch as smt
from somatize import Drifted, Graph, NotSettled, Opaque, Store, Unsettled
from somatize.canonical import NotCanonical
from somatize.codecs import CodecError
from somatize.keys import node_key, node_prefix, root_key
from somatize.store import StoreError
from somatize_torch import _cached, _split, _tracing
from somatize_torch._modes import in_torch
from tests import wrap_helpers
from tests._helpers_config import HoldsConfig, ReadsConfig
from tests.conftest_s3 import READS, s3_url, user
from tests.decoding import Decoder, NotesWidthThenHead, steps_alike
from tests.drawing import AttendsBeside, DrawnBeside, WritesBeside
from tests.global_modules import CHANGES, named_as_attributes_cell, normed_cell, run_cell, scaled
from tests.layouts import answers_as_its_weights_are_laid_out
from tests.state_dict_hooks import add_load_state_dict_pre_hook, add_state_dict_post_hook

M = TypeVar("M", bound=nn.Module)

with open(__file__, encoding="utf-8") as _source:
    _SOURCE_LINES = _source.readlines()
"""This file's lines as it was imported: the lines of the code that runs."""


@pytest.fixture(autouse=True)
def _quotes_this_file_as_imported() -> None:
    """`wrap` quotes the lines of the model's code it names from their file, by
    `linecache`: kept there as this file was imported (with no time, which `linecache`
    never reads it again for), so an edit made to it as the tests run does not change the
    lines quoted for the code that runs."""
    size = sum(len(line) for line in _SOURCE_LINES)
    linecache.cache[__file__] = (size, None, _SOURCE_LINES, __file__)


_RUNS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
"""How many times each :class:`Encoder` ran: counted outside it, since a count the
module kept would change what it keeps at every call, and it would never be recalled."""


class Encoder(nn.Module):
    """Holds data-dependent control flow, which fx cannot trace — but it is a declared leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)
        self.norm = nn.BatchNorm1d(5)

    @property
    def calls(self) -> int:
        return _RUNS.get(self, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNS[self] = self.calls + 1
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


def _encoder_frozen(model: nn.Module, store: Store | None) -> smt.Wrapped:
    """``model`` wrapped with its encoder frozen and cached in ``store``, and frozen."""
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    return wrapped


def _wrapped(store: Store | None = None, seed: int = 0) -> smt.Wrapped:
    return _encoder_frozen(_model(seed), store)


def test_wrapped_keeps_signature_parameters_and_state_dict_keys(store: Store) -> None:
    """Forward signature, parameter names (in order) and state_dict keys are the model's."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    assert isinstance(wrapped, nn.Module)
    assert inspect.signature(wrapped.forward) == inspect.signature(model.forward)
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert list(wrapped.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(wrapped.parameters(), model.parameters(), strict=True))


def test_a_wrapped_model_is_pickled_by_cloudpickle_with_its_signature(store: Store) -> None:
    """A wrapped model sent to a Ray task (pickled by cloudpickle) was refused with a raw
    ``TypeError: cannot pickle '_thread._local' object``: its forward, made with the model's
    signature, was pickled by value with this library's globals. Loaded from
    ``torch.save``, its forward had lost the signature. Both now answer as the model, with
    its signature."""
    cloudpickle = pytest.importorskip("cloudpickle")
    model = _model()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 6)
    with torch.no_grad():
        plain = model(x)
    for again in (
        cloudpickle.loads(cloudpickle.dumps(wrapped)),
        *_pickled_and_copied(wrapped),
    ):
        assert inspect.signature(again.forward) == inspect.signature(model.forward)
        with torch.no_grad():
            assert torch.equal(again(x), plain)


def test_a_wrapped_model_over_a_bucket_that_refused_a_write_runs_no_encoder() -> None:
    """Over a bucket whose credentials may only read, the first call that computes the
    encoder is refused as its answer is kept; every later call that would compute it is
    refused (StoreError saying the bucket refused writes) before the encoder runs, as over
    a read-only local store, and a call the bucket answers is recalled."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    held, first, second = (
        torch.randn(3, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    with enable_iam_authentication(), torch.no_grad():
        kept = _wrapped(Store.on_bucket(url, **admin))(held)
        model = _model()
        wrapped = _encoder_frozen(model, Store.on_bucket(url, **reader, backoff=0.0))
        assert torch.equal(wrapped(held), kept) and model.encoder.calls == 0
        with pytest.raises(StoreError, match="refused"):
            wrapped(first)
        assert model.encoder.calls == 1
        with pytest.raises(StoreError, match=r"the bucket refused writes.*it can still be read"):
            wrapped(second)
        assert model.encoder.calls == 1
        assert torch.equal(wrapped(held), kept) and model.encoder.calls == 1


def test_a_wrapped_model_over_a_local_store_opened_read_only_runs_no_encoder(
    tmp_path: Path,
) -> None:
    """Over a local store opened ``read_only=True``, a call the store answers is recalled,
    and one that would compute the encoder is refused before it runs, saying so."""
    held, other = (torch.randn(3, 6, generator=torch.Generator().manual_seed(i)) for i in range(2))
    with torch.no_grad():
        kept = _wrapped(Store(tmp_path))(held)
        model = _model()
        wrapped = _encoder_frozen(model, Store(tmp_path, read_only=True))
        assert torch.equal(wrapped(held), kept) and model.encoder.calls == 0
        with pytest.raises(StoreError, match=r"opened with read_only=True.*can still be read"):
            wrapped(other)
        assert model.encoder.calls == 0


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


def test_wrapped_graph_drawn_with_its_record_says_no_node_was_not_reached(store: Store) -> None:
    """The record of a wrapped model holds the calls of its cached nodes only: the code
    around them ran too, and a figure drawn with it draws that code without an outcome,
    not as a node the call never came to."""
    wrapped = _wrapped(store)
    x = torch.randn(4, 6)
    wrapped(x)
    wrapped(x)
    graph = wrapped.graph
    assert graph.record is not None and graph.record.outcome == {"encoder": "recalled"}
    fig = graph.figure(graph.record)
    drawn = {box.name: box.outcome for box in fig.boxes}
    assert drawn == {"fx_0": None, "encoder": "recalled", "fx_1": None}
    assert "not reached" not in fig.svg()


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


class Renamed(Model):
    """Saves a tensor of its own (extra state) and renamed its head in layout version 2:
    older checkpoints are mended as they load."""

    _version = 2

    def get_extra_state(self) -> Any:
        return {"calibrated": torch.tensor([3.0])}

    def set_extra_state(self, state: Any) -> None:
        self.calibrated = state["calibrated"]

    def _load_from_state_dict(
        self, state_dict: Any, prefix: str, metadata: Any, *rest: Any
    ) -> None:
        if metadata.get("version", 1) < 2 and prefix + "old_head.weight" in state_dict:
            for part in ("weight", "bias"):
                state_dict[f"{prefix}head.{part}"] = state_dict.pop(f"{prefix}old_head.{part}")
        super()._load_from_state_dict(state_dict, prefix, metadata, *rest)


def test_a_wrapped_checkpoint_is_the_models_own_with_its_hooks_and_overrides(
    store: Store,
) -> None:
    """The model's extra state, its load-time mending, its layout version and the state-dict
    hooks registered on it run through the wrapper: checkpoints are the plain model's."""
    torch.manual_seed(0)
    model = Renamed()
    add_state_dict_post_hook(
        model, lambda module, state, prefix, meta: state.__setitem__(prefix + "tag", torch.ones(1))
    )
    add_load_state_dict_pre_hook(
        model, lambda module, state, prefix, *rest: state.pop(prefix + "tag", None)
    )
    plain = model.state_dict()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    saved = wrapped.state_dict()
    assert list(saved) == list(plain) and "_extra_state" in saved and "tag" in saved
    assert saved._metadata[""]["version"] == 2  # type: ignore[attr-defined]
    torch.manual_seed(1)
    older = {k.replace("head.", "old_head."): v for k, v in Renamed().state_dict().items()}
    older = collections.OrderedDict(older)
    older._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    wrapped.load_state_dict(older)
    assert torch.equal(model.head.weight, older["old_head.weight"])
    assert torch.equal(model.calibrated, torch.tensor([3.0]))


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


def test_encoder_weights_that_require_grad_handed_by_functional_call_are_refused(
    store: Store,
) -> None:
    """`functional_call` handing a frozen, cached encoder weights that require grad is
    refused, saying so, rather than the caller's weights frozen behind its back (their
    gradients dropped, none reaching them); handed detached, the answer is the model's."""
    wrapped = _wrapped(store)
    plain = _model()
    x = torch.randn(4, 6)
    wrapped(x)
    weights = {
        name: torch.randn_like(p).requires_grad_()
        for name, p in wrapped.named_parameters()
        if name.startswith("encoder.")
    }
    with pytest.raises(smt.Unfrozen, match=r"weights that require grad.*functional_call"):
        torch.func.functional_call(wrapped, weights, (x,))
    assert all(t.requires_grad for t in weights.values())
    detached = {name: t.detach() for name, t in weights.items()}
    with torch.no_grad():
        assert torch.equal(
            torch.func.functional_call(wrapped, detached, (x,)),
            torch.func.functional_call(plain.eval(), detached, (x,)),
        )
        assert torch.equal(wrapped(x), plain(x))


def test_an_unfrozen_encoder_released_trains_and_freezes_again(store: Store) -> None:
    """The refusal of an unfrozen encoder says how to train it: released, it takes
    ``train()`` again (its BatchNorm updates); frozen again, the next forward holds it in
    eval and answers with the weights it has now."""
    wrapped = _wrapped(store)
    encoder = wrapped.encoder
    x = torch.randn(4, 6)
    wrapped(x)
    encoder.requires_grad_(True)
    with pytest.raises(smt.Unfrozen, match=r"`somatize\.torch\.release\(module\)`"):
        wrapped(x)
    wrapped.train()
    assert not encoder.training  # held: `train()` alone leaves it in eval
    smt.release(encoder)
    assert encoder.training and encoder.norm.training and not smt.is_held(encoder)
    before = encoder.norm.running_mean.clone()
    encoder(x - wrapped.model.shift).sum().backward()
    assert not torch.equal(encoder.norm.running_mean, before)
    encoder.requires_grad_(False)
    with torch.no_grad():
        assert torch.equal(wrapped(x), wrapped.model.eval()(x))
    assert smt.is_held(encoder) and not encoder.training


def test_a_cached_encoder_released_and_called_untrained_answers_as_in_eval(
    store: Store,
) -> None:
    """A frozen, cached encoder released (``release``, which puts it in train mode) and
    called through the wrapped model with its gradients still off answers as in eval,
    recalled or computed, its BatchNorm statistics unmoved, and is left as released, in
    train mode. It was left in train mode and recalled its answer in eval for a batch it
    knew and was refused (`WrapError`, its BatchNorm counting) for a new one; then it was
    held in eval for good."""
    model = _model()
    wrapped = _encoder_frozen(model, store)
    encoder = wrapped.encoder
    known, new = torch.randn(4, 6), torch.randn(4, 6)
    wrapped(known)
    statistics = encoder.norm.running_mean.clone()
    for x in (known, new):
        smt.release(encoder)
        out = wrapped(x)
        assert not smt.is_held(encoder) and all(part.training for part in encoder.modules())
        with torch.no_grad():
            assert torch.equal(out, model.eval()(x))
        model.train()
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 1}
    assert torch.equal(encoder.norm.running_mean, statistics)


@pytest.mark.parametrize("cached", [["encoder"], []])
def test_an_encoder_released_fine_tunes_after_a_pass_without_gradients(
    store: Store, cached: list[str]
) -> None:
    """A frozen encoder released, called through the wrapped model under
    ``torch.no_grad()`` (a sanity pass before training), then given its gradients back
    and put in train mode trains in train mode, its BatchNorm on batch statistics: the
    pass held it in eval for good, and ``train()`` was silently ignored."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=cached, store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    x = torch.randn(4, 6)
    wrapped(x)
    smt.release(encoder)
    with torch.no_grad():
        wrapped(x)
    encoder.requires_grad_(True)
    wrapped.train()
    assert not smt.is_held(encoder) and all(part.training for part in encoder.modules())
    before = encoder.norm.running_mean.clone()
    encoder(x - model.shift).sum().backward()
    assert not torch.equal(encoder.norm.running_mean, before)
    assert all(p.grad is not None for p in encoder.parameters())
    wrapped.eval()
    assert not encoder.training


def test_update_bn_re_estimates_a_released_encoder_not_cached(store: Store) -> None:
    """``torch.optim.swa_utils.update_bn`` run on a wrapped model whose frozen encoder
    (not cached: nothing is recalled or kept for it) was released re-estimates its
    BatchNorm statistics in train mode, as on the model unwrapped: they were reset and
    left at zero, the encoder held in eval at the first batch, with no error or warning."""
    loader = [torch.randn(4, 6) * 3 + 1 for _ in range(3)]
    plain = _model()
    torch.optim.swa_utils.update_bn(loader, plain)
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    wrapped(loader[0])
    smt.release(encoder)
    torch.optim.swa_utils.update_bn(loader, wrapped)
    assert torch.allclose(encoder.norm.running_mean, plain.encoder.norm.running_mean)
    assert torch.allclose(encoder.norm.running_var, plain.encoder.norm.running_var)
    assert not smt.is_held(encoder) and encoder.training


@pytest.mark.parametrize(("frozen", "cached"), [(["encoder"], []), (["encoder", "head"], ["head"])])
def test_a_released_encoder_not_cached_trained_and_frozen_again_is_held(
    store: Store, frozen: list[str], cached: list[str]
) -> None:
    """A frozen encoder that is not cached (alone, or beside a cached part), released,
    trained a step and given its gradients off again is frozen at the next forward of the
    wrapped model, held in eval and answering with the weights it trained to; released
    again, ``update_bn`` re-estimates its statistics, its weights unchanged since. It
    stayed released, in train mode, at every call: its BatchNorm on batch statistics."""
    model = _model()
    wrapped = smt.wrap(model, frozen=frozen, cached=cached, store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    x = torch.randn(4, 6)
    wrapped(x)
    smt.release(encoder)
    encoder.requires_grad_(True)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    encoder(x - model.shift).sum().backward()
    optimizer.step()
    encoder.requires_grad_(False)
    with torch.no_grad():
        out = wrapped(x)
    assert smt.is_held(encoder) and not any(part.training for part in encoder.modules())
    with torch.no_grad():
        assert torch.equal(out, model.eval()(x))
    loader = [torch.randn(4, 6) * 3 + 1 for _ in range(3)]
    plain = Model()
    plain.load_state_dict(model.state_dict())
    torch.optim.swa_utils.update_bn(loader, plain)
    smt.release(encoder)
    torch.optim.swa_utils.update_bn(loader, wrapped)
    assert not smt.is_held(encoder) and encoder.training
    assert torch.allclose(encoder.norm.running_mean, plain.encoder.norm.running_mean)


@pytest.mark.parametrize(("frozen", "cached"), [(["encoder"], ["encoder"]), (["encoder"], [])])
def test_an_encoder_fine_tuned_by_a_fused_optimizer_answers_with_its_new_weights(
    store: Store, frozen: list[str], cached: list[str]
) -> None:
    """A frozen encoder released and fine-tuned by a fused optimizer (which moves no
    version counter), its gradients dropped after each step (``zero_grad()`` after
    ``step()``), then given its gradients off: the next forward recalled the answer of
    the weights it was frozen at, or, not cached, ran it released in train mode. It runs
    with the weights it trained to, held in eval again."""
    model = _model()
    wrapped = smt.wrap(model, frozen=frozen, cached=cached, store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    x = torch.randn(4, 6)
    with torch.no_grad():
        before = wrapped(x)
    smt.release(encoder, False)  # in eval: its BatchNorm statistics stay as they are
    encoder.requires_grad_(True)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=0.5, fused=True)
    for _ in range(2):
        encoder(torch.randn(4, 6)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    encoder.requires_grad_(False)
    with torch.no_grad():
        after = wrapped(x)
    assert smt.is_held(encoder) and not any(part.training for part in encoder.modules())
    with torch.no_grad():
        assert torch.equal(after, model.eval()(x))
    assert not torch.allclose(after, before)
    if cached:
        assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2}


def test_a_released_encoder_not_cached_called_with_gradients_is_frozen_again(
    store: Store,
) -> None:
    """A frozen encoder not cached, released and called through the wrapped model with
    its gradients on, is frozen again at the first call after they are off, though no
    optimizer moved its weights and its gradients were dropped (``zero_grad``)."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    x = torch.randn(4, 6)
    smt.release(encoder)
    encoder.requires_grad_(True)
    wrapped(x).sum().backward()
    encoder.zero_grad(set_to_none=True)
    encoder.requires_grad_(False)
    wrapped(x)
    assert smt.is_held(encoder) and not encoder.training


def test_a_released_encoder_not_cached_moved_stays_released(store: Store) -> None:
    """A frozen encoder not cached, released and then moved with its model (converted
    here, as Lightning moves a model to its device before the sanity pass), called with
    its gradients still off, stays released in train mode: a move trains nothing. It was
    frozen again there, its buffers and memory new, so the fine-tuning after ran in eval."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    encoder = wrapped.encoder
    smt.release(encoder)
    wrapped.double()
    with torch.no_grad():
        wrapped(torch.randn(4, 6, dtype=torch.float64))
    assert not smt.is_held(encoder) and encoder.training


def test_each_threads_cached_call_counts_what_it_did(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached submodule called from two threads at once counts, in ``counts``, what each
    call did: one that ran and kept its answer is not counted as recalled, though another
    thread's call, recalled, ended between the end of its lookup and its count."""
    wrapped = _wrapped(store)
    known, new = torch.randn(4, 6), torch.randn(4, 6)
    wrapped(known)
    recalled = threading.Event()
    forward = Graph.forward

    def ends_first(graph: Graph, *args: Any, **kwargs: Any) -> Any:
        out = forward(graph, *args, **kwargs)
        if threading.current_thread().name == "runs":  # the other call ends meanwhile
            other.start()
            assert recalled.wait(10)
        return out

    def recalls() -> None:
        wrapped(known)
        recalled.set()

    other = threading.Thread(target=recalls)
    runs = threading.Thread(target=lambda: wrapped(new), name="runs")
    monkeypatch.setattr(Graph, "forward", ends_first)
    runs.start()
    runs.join(20)
    other.join(20)
    assert wrapped.encoder.calls == 2
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 1}


class _ReadThenSwitched(dict[str, int]):
    """A node's counts whose read, in the thread named ``reads``, lets another call count
    before the count read is written back: a switch the interpreter may make between a
    dict's read and its write, made here every time."""

    def __init__(self, counts: dict[str, int], other: threading.Thread) -> None:
        super().__init__(counts)
        self.other = other

    def get(self, key: str, default: Any = None) -> Any:
        read = super().get(key, default)
        if threading.current_thread().name == "reads" and not self.other.is_alive():
            self.other.start()
            self.other.join(1.0)  # blocked until this count is written, where it waits
        return read


def test_calls_from_several_threads_lose_no_count(store: Store) -> None:
    """Calls of one wrapped model from several threads count every fact in ``counts``: one
    that counted while another had read a count and not yet written it back is not lost
    (4 threads recalling 3,000 times each counted 11,958 to 11,995 of 12,000 recalls)."""
    wrapped = _wrapped(store)
    x = torch.randn(4, 6)
    wrapped(x)
    other = threading.Thread(target=lambda: wrapped(x))
    wrapped.counts["encoder"] = _ReadThenSwitched(wrapped.counts["encoder"], other)
    reads = threading.Thread(target=lambda: wrapped(x), name="reads")
    reads.start()
    reads.join(20)
    other.join(20)
    assert dict(wrapped.counts["encoder"]) == {"ran": 1, "kept": 1, "recalled": 2}


def _counts_in_child(wrapped: smt.Wrapped, x: torch.Tensor) -> dict[str, int]:
    wrapped(x)
    return dict(wrapped.counts["encoder"])


def test_a_child_forked_while_a_thread_counts_calls_its_wrapped_model(store: Store) -> None:
    """A child forked while another thread of its parent was counting a call (a DataLoader
    worker forked as a thread runs the model) counts its own calls: the lock held over the
    counts is its own there, where it waited for good on one nobody in it would let go."""
    from somatize_torch.wrap import _COUNTING
    from tests.forked import held_elsewhere, in_forked_child

    wrapped = _wrapped(store)
    x = torch.randn(4, 6)
    wrapped(x)
    with held_elsewhere(_COUNTING):
        counted = in_forked_child(_counts_in_child, wrapped, x, timeout=30)
    assert counted == {"ran": 1, "kept": 1, "recalled": 1}


_IN_CALL, _LEAVE_CALL = threading.Event(), threading.Event()
_ISINSTANCE = builtins.isinstance


class _WaitsInCall(nn.Module):
    """Run on a thread named ``in-call``, says so and waits to go on; ``in_train``, only
    in train mode (traced into, in the middle of the trace of train mode)."""

    def __init__(self, in_train: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.in_train = in_train

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "in-call" and (self.training or not self.in_train):
            _IN_CALL.set()
            _LEAVE_CALL.wait(30)
        return self.linear(x)


class ConfiguredWaits(nn.Module):
    """Branches on its config's flag after a part that may wait in a call (``encoder``)."""

    def __init__(self, encoder: nn.Module | None = None) -> None:
        super().__init__()
        self.config = _Config()
        self.encoder = _WaitsInCall() if encoder is None else encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2.0 if self.config.flag else h


def _flagged_in_child(wrapped: smt.Wrapped, x: torch.Tensor) -> list[list[float]]:
    wrapped.model.config.flag = True
    with torch.no_grad():
        return list(wrapped(x).tolist())


def test_a_child_forked_while_a_thread_is_in_a_call_traces_its_wrapped_model_again(
    store: Store,
) -> None:
    """A child forked while another thread of its parent is inside a call of the wrapped
    model (a DataLoader worker forked as a thread runs the model) traces the model again
    when its config changes there, and answers as the model does: the call of the thread
    the child does not have no longer holds the trace off, where it waited for good."""
    from tests.forked import in_forked_child

    torch.manual_seed(0)
    model = ConfiguredWaits()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        model.config.flag = True
        expected = model(x)
        model.config.flag = False
    _IN_CALL.clear()
    _LEAVE_CALL.clear()
    calling = threading.Thread(target=wrapped, args=(x + 1,), name="in-call")
    calling.start()
    try:
        assert _IN_CALL.wait(10)
        answer = in_forked_child(_flagged_in_child, wrapped, x, timeout=30)
    finally:
        _LEAVE_CALL.set()
        calling.join()
    assert torch.equal(torch.tensor(answer), expected)


def _replaced_in_child() -> list[str]:
    """What a trace replaces for every thread that is not what it is outside a trace."""
    from torch.fx import _symbolic_trace

    found = [
        ("isinstance", builtins.isinstance, _ISINSTANCE),
        ("Module.__call__", nn.Module.__call__, _symbolic_trace._orig_module_call),
        ("Linear.__getattribute__", vars(nn.Linear).get("__getattribute__"), None),
        ("is_fx_tracing", _symbolic_trace._is_fx_tracing_flag, False),
    ]
    return [name for name, now, was in found if now is not was]


def _traced_in_child(wrapped: smt.Wrapped, x: torch.Tensor) -> tuple[Any, ...]:
    replaced = _replaced_in_child()
    training = [module.training for module in wrapped.model.modules()]
    answer = _flagged_in_child(wrapped, x)
    return replaced, training, answer, _replaced_in_child()


def test_a_child_forked_while_a_thread_traces_traces_its_wrapped_model(store: Store) -> None:
    """A child forked while another thread of its parent traces the wrapped model (a
    DataLoader worker forked as a server thread makes the model's first call) traces it
    itself and answers as the model does, where it waited for good on the lock the trace
    held; and what that trace replaced for every thread (Python's ``isinstance``, how fx
    calls modules, the model's train mode for the trace of the other mode) is put back
    there, rather than left for the child's own calls to go through."""
    from tests.forked import in_forked_child

    torch.manual_seed(0)
    model = ConfiguredWaits(_WaitsInCall(in_train=True)).eval()
    wrapped = smt.wrap(model, frozen=["encoder.linear"], cached=["encoder.linear"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    model.config.flag = True  # traced again, by the thread's call
    with torch.no_grad():
        expected = model(x)
    _IN_CALL.clear()
    _LEAVE_CALL.clear()
    calling = threading.Thread(target=_flagged_in_child, args=(wrapped, x + 1), name="in-call")
    calling.start()
    try:
        assert _IN_CALL.wait(10)
        replaced, training, answer, after = in_forked_child(
            _traced_in_child, wrapped, x, timeout=30
        )
    finally:
        _LEAVE_CALL.set()
        calling.join()
    assert replaced == after == []
    assert not any(training)
    assert torch.equal(torch.tensor(answer), expected)


def test_release_refuses_what_it_cannot_release(store: Store) -> None:
    """``release`` takes a module, and the module of a row cache, not the cache: each
    refused saying what to pass."""
    with pytest.raises(TypeError, match=r"release takes an nn\.Module"):
        smt.release("encoder")  # type: ignore[arg-type]
    cached = smt.cache_rows(nn.Linear(4, 4), store)
    with pytest.raises(TypeError, match=r"release\(cached\.module\)"):
        smt.release(cached)


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


class Tempered(nn.Module):
    """Divides by a plain value it keeps beside its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) / self.temperature


class OnTempered(nn.Module):
    """A model whose declared encoder is a :class:`Tempered`; its forward is each
    subclass's."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Tempered()


class AsksIfTensor(OnTempered):
    """Scales by its mask only if the mask is a tensor."""

    def forward(self, x: torch.Tensor, mask: Any = 1.0) -> torch.Tensor:
        h = self.encoder(x)
        return h * mask if isinstance(mask, torch.Tensor) else h


class AsksIfTensorOrNone(AsksIfTensor):
    """The same, its mask optional."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        return super().forward(x, mask)


def test_a_forward_asking_if_what_fx_stands_in_for_is_a_tensor_is_refused(
    store: Store,
) -> None:
    """fx hands the forward stand-ins, which are no tensors: `isinstance(mask,
    torch.Tensor)` is False while it traces, and the branch kept would ignore the mask in
    every call. A plain value is no stand-in (the forward is traced at it); a call handing
    a tensor is refused, naming the line; with the argument optional, the forward is
    traced with it None, and a call that gives it is refused so."""
    wrapped, model = _encoder_cached(AsksIfTensor, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for mask in (1.0, 2.0):
            assert torch.equal(wrapped(x, mask), model(x, mask))
        with pytest.raises(smt.Untraceable, match=r"isinstance\(mask, torch\.Tensor\).*no tensor"):
            wrapped(x, torch.full((3, 4), 2.0))
    wrapped, model = _encoder_cached(AsksIfTensorOrNone, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        with pytest.raises(smt.Untraceable, match=r"isinstance\(mask, torch\.Tensor\)"):
            wrapped(x, torch.full((3, 4), 2.0))


class AsksIsTensor(OnTempered):
    """Scales by its mask only if `torch.is_tensor` says the mask is a tensor."""

    def forward(self, x: torch.Tensor, mask: Any = 1.0) -> torch.Tensor:
        h = self.encoder(x)
        return h * mask if torch.is_tensor(mask) else h


def test_a_forward_asking_torch_is_tensor_of_what_fx_stands_in_for_is_refused(
    store: Store,
) -> None:
    """`torch.is_tensor(mask)` asks `isinstance` in torch's code for the forward: a call
    handing a tensor is refused naming the forward's line, as for `isinstance`, not run
    by the branch fx kept for a stand-in, which ignores the mask."""
    wrapped, model = _encoder_cached(AsksIsTensor, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x, 2.0), model(x, 2.0))
        with pytest.raises(smt.Untraceable, match=r"torch\.is_tensor\(mask\).*no tensor"):
            wrapped(x, torch.full((3, 4), 2.0))


shared_encoder = Encoder().eval()
"""An encoder held in a global of the name the model holds its row cache under, as a
script or notebook names both alike (only :class:`CachesRows` uses it)."""


class CachesRows(nn.Module):
    """Caches its encoder per row itself, beside a tower left to ``wrap`` to declare."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.shared_encoder = smt.cache_rows(shared_encoder, store)
        self.tower = nn.Linear(4, 5)
        self.head = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.shared_encoder(x), self.tower(t)], 1))


def test_a_model_caching_a_part_per_row_is_wrapped_around_the_cache(store: Store) -> None:
    """A row cache in the model's own code is called as the module it stands for, not
    traced into (which was refused as fx handing it no batch tensor): the wrapped model
    answers and trains the head as the plain model does, sees the encoder's weights
    changed, ``train()`` is no change of its code, and it copies and pickles."""
    torch.manual_seed(0)
    model = CachesRows(store)
    plain = copy.deepcopy(model)
    plain.shared_encoder = plain.shared_encoder.module
    wrapped = smt.wrap(model, frozen=["tower"], cached=["tower"], store=store)
    smt.freeze(wrapped)
    x, t = torch.randn(8, 6), torch.randn(8, 4)
    for _ in range(2):
        wrapped.train()
        plain.train()
        plain.shared_encoder.eval()
        out, expected = wrapped(x, t), plain(x, t)
        assert torch.allclose(out, expected, atol=1e-6)
        out.sum().backward()
        expected.sum().backward()
        assert model.head.weight.grad is not None and plain.head.weight.grad is not None
        assert torch.allclose(model.head.weight.grad, plain.head.weight.grad, atol=1e-6)
        model.head.zero_grad()
        plain.head.zero_grad()
    assert not shared_encoder.training
    assert model.shared_encoder.stats.recalled == 8
    with torch.no_grad():
        shared_encoder.linear.weight.add_(1.0)
        plain.shared_encoder.linear.weight.add_(1.0)
        expected = plain(x, t)
        assert torch.allclose(wrapped(x, t), expected, atol=1e-6)
        for again in (copy.deepcopy(wrapped), pickle.loads(pickle.dumps(wrapped))):
            assert torch.allclose(again(x, t), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("frozen", "cached", "said"),
    [
        (["shared_encoder"], ["shared_encoder"], r"`shared_encoder` in cached= is cached per row"),
        (True, True, r"cached whole, holds `shared_encoder`, which is cached per row"),
    ],
)
def test_a_row_cache_declared_cached_per_batch_is_refused(
    store: Store, frozen: Any, cached: Any, said: str
) -> None:
    """A row cache declared cached, or inside a part declared cached, ran at every call,
    keeping no batch and saying nothing (its counts, part of its state, change as it
    runs); it is refused naming it and what to declare, and declared frozen only it is
    called as it is, and recalls its rows itself."""
    model = CachesRows(store)
    with pytest.raises(smt.WrapError, match=said + r".*shared_encoder\.module"):
        smt.wrap(model, frozen=frozen, cached=cached, store=store)
    wrapped = smt.wrap(model, frozen=["shared_encoder", "tower"], cached=["tower"], store=store)
    smt.freeze(wrapped)
    x, t = torch.randn(4, 6), torch.randn(4, 4)
    wrapped(x, t)
    wrapped(x, t)
    assert model.shared_encoder.stats.recalled == 4
    assert wrapped.counts["tower"] == {"ran": 1, "kept": 1, "recalled": 1}


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


def test_a_wrapped_model_wrapped_again_says_to_wrap_the_model_once(store: Store) -> None:
    """wrap of what wrap made was refused as a module whose `forward` some library had
    replaced (mixed precision, by hand), which named neither what was wrong nor what to
    do; it says the model is wrapped already, to declare every submodule in one wrap, and
    the first wrap still answers."""
    model = _model()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    for frozen in (["encoder"], ["head"], True):
        with pytest.raises(smt.WrapError, match=r"this `Model` is wrapped already .*once"):
            smt.wrap(wrapped, frozen=frozen)
    x = torch.randn(3, 6)
    assert torch.allclose(wrapped(x), model(x))


def test_a_wrapped_part_left_undeclared_is_refused_naming_it_and_declared_answers_as_alone(
    store: Store, tmp_path: Path
) -> None:
    """An encoder wrapped on its own and put into a larger model was traced into when the
    larger one was wrapped without declaring it, and refused as fx failing inside the
    machinery that calls its parts, which named neither the part nor what to do. It is
    refused naming it and saying to declare it; declared, it is called whole and keeps
    its own answers in its own store."""
    model = _model()
    inner = smt.wrap(model.encoder, frozen=True, cached=True, store=tmp_path / "inner")
    smt.freeze(inner)
    model.encoder = inner  # type: ignore[assignment]
    for frozen in ([], ["head"], ["encoder.linear"]):
        with pytest.raises(smt.WrapError, match=r"`encoder` is a wrapped model already .*declare"):
            smt.wrap(model, frozen=frozen, cached=frozen, store=store)
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 6)
    with torch.no_grad():
        assert torch.allclose(wrapped(x), wrapped.model(x))
        wrapped(x)
    assert inner.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 2}


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


class HeldTwice(nn.Module):
    """One encoder held under three names, called by its second, as T5 holds its
    embedding as ``shared`` and ``decoder.embed_tokens``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, 3)
        self.again = self.encoder
        self.decoder = nn.Module()
        self.decoder.embed = self.encoder
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.again(x))


@pytest.mark.parametrize("name", ["again", "decoder.embed"])
def test_a_submodule_declared_by_another_name_is_refused_naming_its_first(
    name: str, store: Store
) -> None:
    """A module held under two names is traced under the first ``named_modules()`` gives,
    whichever the forward calls: declared by another, it is refused saying which name to
    declare it by, not as no submodule; declared by that one, it is cached under it."""
    pattern = f"`{re.escape(name)}` in frozen= is the submodule this `HeldTwice` holds as `encoder`"
    with pytest.raises(smt.WrapError, match=pattern + r".*`frozen=\['encoder'\]`"):
        smt.wrap(HeldTwice(), frozen=[name], cached=[name])
    with pytest.raises(smt.WrapError, match=r"in cached= .*`cached=\['encoder'\]`"):
        smt.wrap(HeldTwice(), frozen=["encoder"], cached=[name])
    model = HeldTwice()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x)) and torch.equal(wrapped(x), model(x))
    assert wrapped.counts == {"encoder": {"ran": 1, "kept": 1, "recalled": 1}}


def test_cached_input_that_requires_grad_is_refused(store: Store) -> None:
    """A cached node fed by a trainable layer is refused: hits would silently stop training it."""
    wrapped = smt.wrap(Feeds(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    with pytest.raises(smt.CachedInputNeedsGrad, match="requires grad"):
        wrapped(torch.randn(2, 6))


@pytest.mark.parametrize("context", [contextlib.nullcontext, torch.no_grad])
def test_cached_input_carrying_a_forward_mode_tangent_is_refused(
    store: Store, context: Callable[[], Any]
) -> None:
    """A dual tensor (``forward_ad.make_dual``) carries its tangent through the module,
    under ``torch.no_grad()`` too, and a recalled answer carries none: the jvp was there
    on the miss and silently missing on the hit. Refused, computed or not."""
    torch.manual_seed(0)
    wrapped = smt.wrap(nn.Linear(4, 4), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    for _ in range(2):
        with forward_ad.dual_level(), context():
            dual = forward_ad.make_dual(x, torch.ones_like(x))
            with pytest.raises(smt.CachedInputNeedsGrad, match="forward-mode tangent"):
                wrapped(dual)
    assert torch.equal(wrapped(x), wrapped(x))
    assert wrapped.counts["linear"] == {"ran": 1, "kept": 1, "recalled": 1}


class _GradsOn(nn.Module):
    """Turns gradients on inside its forward, where ``on``."""

    def __init__(self, on: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.on = on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(self.on or torch.is_grad_enabled()):
            out: torch.Tensor = self.linear(x) * 2
        return out


def test_cached_input_that_requires_grad_is_taken_where_no_gradient_is_recorded(
    store: Store,
) -> None:
    """Under ``torch.no_grad()`` (a teacher run on what a trained module produced) an
    argument that requires grad cuts no gradient: it is answered as the module answers it
    there, computed and then recalled. Where gradients are recorded it is refused, and so
    it is under ``torch.no_grad()`` for a module that turns them on itself."""
    torch.manual_seed(0)
    teacher = smt.wrap(_GradsOn(False), frozen=True, cached=True, store=store)
    smt.freeze(teacher)
    trained = nn.Parameter(torch.ones(()))
    x = torch.randn(3, 4) * trained
    with torch.no_grad():
        truth = teacher.linear(x) * 2
        first, again = teacher(x), teacher(x)
    assert not first.requires_grad and not again.requires_grad
    assert torch.equal(first, truth) and torch.equal(again, truth)
    assert teacher.counts["_grads_on"]["recalled"] == 1
    with pytest.raises(smt.CachedInputNeedsGrad, match="requires grad"):
        teacher(x)
    turns = smt.wrap(_GradsOn(True), frozen=True, cached=True, store=store)
    smt.freeze(turns)
    with torch.no_grad(), pytest.raises(smt.CachedInputNeedsGrad, match="turns gradients on"):
        turns(x)


class _EncodesWithoutGrad(nn.Module):
    """A trainable layer, then a frozen encoder called under ``torch.no_grad()``."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        with torch.no_grad():
            z = self.encoder(h)
        out: torch.Tensor = h * z
        return out


def test_a_cached_submodule_called_under_no_grad_inside_a_forward_trains_as_without_cache(
    store: Store,
) -> None:
    """A cached encoder called under ``torch.no_grad()`` inside a training forward, handed
    what a trainable layer produced, is taken: the answer and the layer's gradient are
    those of the model without caching, computed and then recalled."""
    torch.manual_seed(0)
    model = _EncodesWithoutGrad()
    plain = copy.deepcopy(model)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    for _ in range(2):
        model.zero_grad()
        plain.zero_grad()
        out, truth = wrapped(x), plain(x)
        out.sum().backward()
        truth.sum().backward()
        assert torch.allclose(out, truth)
        assert model.pre.weight.grad is not None and plain.pre.weight.grad is not None
        assert torch.allclose(model.pre.weight.grad, plain.pre.weight.grad)
    assert wrapped.counts["encoder"]["recalled"] == 1


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


# ------------------------------------------------------------------ what a cached call is keyed by


class Holds(OnTempered):
    """A declared encoder and a head after it."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _negated(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    return -out


def _held(whole: bool, store: Store, kind: type[nn.Module] = Holds) -> tuple[smt.Wrapped, Any]:
    """A model of ``kind`` (its part ``encoder`` frozen and cached, or wrapped ``whole``),
    frozen, and the model."""
    torch.manual_seed(0)
    model = kind()
    return _part_frozen(model, "encoder", whole, store), model


def _part_frozen(model: nn.Module, name: str, whole: bool, store: Store) -> smt.Wrapped:
    """``model``'s part ``name`` frozen and cached in ``store`` (that part wrapped
    ``whole``, or the model wrapped naming it), and frozen."""
    wrapped = (
        smt.wrap(model.get_submodule(name), frozen=True, cached=True, store=store)
        if whole
        else smt.wrap(model, frozen=[name], cached=[name], store=store)
    )
    smt.freeze(wrapped)
    return wrapped


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
@pytest.mark.parametrize("change", ["setting", "hook"])
def test_a_setting_or_hook_changed_and_frozen_again_keys_anew(
    store: Store, whole: bool, change: str
) -> None:
    """A plain value or a forward hook changed on a cached module is seen when `freeze`
    runs again: the next call is keyed anew and computed, not the old answer recalled."""
    wrapped, model = _held(whole, store)
    x = torch.randn(3, 4)
    before = wrapped(x)
    if change == "setting":
        model.encoder.temperature = 2.0
    else:
        model.encoder.linear.register_forward_hook(_negated)
    smt.freeze(wrapped)
    after = wrapped(x)
    name = next(iter(wrapped.counts))
    assert wrapped.counts[name] == {"ran": 2, "kept": 2}
    with torch.no_grad():
        assert torch.allclose(after, wrapped.model(x))
    assert not torch.allclose(after, before)


class Tuned(nn.Module):
    """Reads plain values it keeps beside its weights, and fills a table as it first runs
    (its own change, which changes nothing it answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.temperature = 1.0
        self.scales = [1.0, 1.0]
        self.shift = torch.zeros(4)  # a tensor, not a buffer
        self.gains = collections.OrderedDict(out=1.0)
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None or self.table.shape[0] < x.shape[0]:
            self.table = torch.ones(x.shape[0], 1)
        out = self.linear(x) / self.temperature * self.scales[0] * self.gains["out"] + self.shift
        return out * self.table[: x.shape[0]]


class Tunes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Tuned()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _retune(encoder: Tuned, change: str) -> None:
    if change == "setting":
        encoder.temperature = 2.0
    elif change == "list item":
        encoder.scales[0] = 3.0
    elif change == "ordered dict item":
        encoder.gains["out"] = 4.0
    elif change == "tensor in place":
        encoder.shift.add_(1.0)
    elif change == "tensor data":
        encoder.shift.data = torch.ones(4)
    elif change == "hook":
        encoder.linear.register_forward_hook(_negated)
    elif change == "pre-hook":
        encoder.linear.register_forward_pre_hook(_doubled_input)
    else:
        raise AssertionError(change)


def _doubled_input(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
    return (args[0] * 2,)


def _doubled_linear(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
    return out * 2 if type(module) is nn.Linear else None


class Shifts(nn.Module):
    """A block traced into, which a global hook can tell by its class."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


class ShiftsBetween(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 4))
        self.block = Shifts()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.encoder(x)))


def _shifted_block(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
    return out + 1 if type(module) is Shifts else None


def _tensors_doubled(module: nn.Module, args: Any, out: Any) -> Any:
    return out * 2 if isinstance(out, torch.Tensor) else None


@pytest.mark.parametrize("hook", [_shifted_block, _tensors_doubled, _doubled_linear])
def test_a_global_hook_is_refused_by_a_traced_model_and_run_by_one_wrapped_whole(
    store: Store, hook: Callable[..., Any]
) -> None:
    """A global forward hook runs with every module called: a traced model, which runs
    fx code in place of the blocks it traced into and between its declared submodules,
    refuses a call while one is registered, naming it, and `wrap` refuses to trace one;
    a model wrapped whole runs it with the model alone, not once more with the modules
    standing for it, so its answer, computed or recalled, is the model's own under it."""
    torch.manual_seed(0)
    model = ShiftsBetween()
    traced = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    traced(x)
    whole = smt.wrap(ShiftsBetween(), frozen=True, cached=True, store=store)
    smt.freeze(whole)
    whole(x)
    with contextlib.ExitStack() as undo:
        undo.callback(nn.modules.module.register_module_forward_hook(hook).remove)
        with pytest.raises(
            smt.WrapError, match=rf"register_module_forward_hook\({hook.__name__}\)"
        ):
            traced(x)
        with pytest.raises(smt.WrapError, match="Remove them while wrapping it"):
            smt.wrap(ShiftsBetween(), frozen=["encoder"], cached=["encoder"], store=store)
        with torch.no_grad():
            plain = whole.model(x)
        assert torch.allclose(whole(x), plain) and whole.counts["shifts_between"]["ran"] == 2
        assert torch.allclose(whole(x), plain) and whole.counts["shifts_between"]["recalled"] == 1
    with torch.no_grad():
        assert torch.allclose(traced(x), model(x))


@pytest.mark.parametrize("cached", [False, True], ids=["frozen", "cached without a store"])
def test_a_model_wrapped_whole_and_computed_runs_a_global_hook_once(cached: bool) -> None:
    """A model wrapped whole that computes its answer (frozen only, or cached with no
    store to keep it in) runs a global forward hook with the model alone, not once more
    with what calls it in the graph: its answer is the model's own under the hook."""
    torch.manual_seed(0)
    model = ShiftsBetween()
    whole = smt.wrap(model, frozen=True, cached=cached, store=None)
    smt.freeze(whole)
    x = torch.randn(3, 4)
    with contextlib.ExitStack() as undo:
        undo.callback(nn.modules.module.register_module_forward_hook(_tensors_doubled).remove)
        with torch.no_grad():
            plain = model(x)
            assert torch.allclose(whole(x), plain)
    with torch.no_grad():
        assert torch.allclose(whole(x), model(x))


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
@pytest.mark.parametrize(
    "change",
    [
        "setting",
        "list item",
        "ordered dict item",
        "tensor in place",
        "tensor data",
        "hook",
        "pre-hook",
    ],
)
def test_a_setting_or_hook_changed_after_freeze_is_seen_at_the_next_call(
    store: Store, whole: bool, change: str
) -> None:
    """A plain value or a forward hook changed on a frozen cached module, without
    freezing again, keys the next call anew: computed with the change, not the answer
    kept before it recalled. What the module's own forward changes as it runs (a table
    it fills the first time) keys the next call anew too, and the answer of the call that
    filled it is not kept: the same input again is computed once more, then recalled."""
    wrapped, model = _held(whole, store, Tunes)
    x = torch.randn(3, 4)
    before = wrapped(x)
    name = next(iter(wrapped.counts))
    assert wrapped.counts[name] == {"ran": 1}  # the table filled: not kept
    assert torch.equal(wrapped(x), before)
    assert torch.equal(wrapped(x), before)
    assert wrapped.counts[name] == {"ran": 2, "kept": 1, "recalled": 1}
    _retune(model.encoder, change)
    after = wrapped(x)
    assert wrapped.counts[name] == {"ran": 3, "kept": 2, "recalled": 1}
    with torch.no_grad():
        assert torch.allclose(after, copy.deepcopy(wrapped.model)(x))
    assert not torch.allclose(after, before)
    assert torch.equal(wrapped(x), after)
    assert wrapped.counts[name] == {"ran": 3, "kept": 2, "recalled": 2}


@pytest.mark.parametrize("in_lists", [False, True], ids=["tensors", "lists"])
def test_a_cached_part_keeping_what_each_step_computed_answers_each_generation_as_computed(
    store: Store, in_lists: bool
) -> None:
    """A cached decoder layer whose forward appends to a cache of keys and values it keeps
    (a tensor made anew, or a list), emptied between generations, answers each step of a
    generation as the model run itself does: a step handed the token an earlier
    generation was at that step is keyed by the cache as it is now, and no answer a step
    computed is recalled, since a recall would not append to the cache."""
    torch.manual_seed(0)
    reference = Decoder(in_lists).eval()
    model = copy.deepcopy(reference)
    wrapped = smt.wrap(model, frozen=["layer"], cached=["layer"], store=store)
    smt.freeze(wrapped)
    assert all(steps_alike(wrapped, model.layer.reset, reference))
    assert wrapped.counts["layer"] == {"ran": 9}


def test_a_cached_part_giving_a_value_anew_as_it_was_is_recalled(store: Store) -> None:
    """A cached part whose forward sets a value it keeps to the very value it held (a
    width noted at every call) changes nothing: its answer is kept and recalled, not
    computed at every call."""
    torch.manual_seed(0)
    model = NotesWidthThenHead().eval()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(5, 300)
    with torch.no_grad():
        answers = [wrapped(x) for _ in range(3)]
        assert all(torch.equal(answer, model(x)) for answer in answers)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 2}


def test_a_setting_whose_declaration_anew_was_interrupted_is_seen_at_the_next_call(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call interrupted (Ctrl-C) as it takes anew what a cached part declares, once a
    setting was given to it, leaves the setting to the next call, which computes its
    answer with it: the watch of its settings was taken before, so the next call found
    nothing changed and recalled, for good, the answer kept for the old setting."""
    wrapped, model = _held(False, store, Tunes)
    x = torch.randn(3, 4)
    before = wrapped(x)
    _retune(model.encoder, "setting")
    calls = [0]
    declared_again = _cached.declared_again

    def interrupted(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt  # as a Ctrl-C landing there would
        declared_again(*args)

    monkeypatch.setattr(_cached, "declared_again", interrupted)
    with pytest.raises(KeyboardInterrupt):
        wrapped(x)
    after = wrapped(x)
    with torch.no_grad():
        assert torch.allclose(after, copy.deepcopy(wrapped.model)(x))
    assert not torch.allclose(after, before)
    assert torch.equal(wrapped(x), after)
    name = next(iter(wrapped.counts))
    # The first call filled the table: its answer was not kept.
    assert wrapped.counts[name] == {"ran": 2, "kept": 1, "recalled": 1}


def test_settings_refused_as_a_cached_part_is_declared_anew_are_refused_at_every_call_after(
    store: Store,
) -> None:
    """Settings given to a cached part since it was frozen, one of which no key can hold
    (nested deeper than Python's recursion limit lets it be followed), are refused at the
    next call and at every one after, until that one goes: refused once, the call run
    again found nothing changed and recalled the answer kept for the settings before."""
    wrapped, model = _held(False, store, Tunes)
    x = torch.randn(3, 4)
    before = wrapped(x)
    nested: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        nested = [nested]
    _retune(model.encoder, "setting")
    model.encoder.kept = nested
    for _ in range(2):
        with pytest.raises(NotCanonical, match=r"`kept` is nested deeper"):
            wrapped(x)
    del model.encoder.kept
    after = wrapped(x)
    with torch.no_grad():
        assert torch.allclose(after, copy.deepcopy(wrapped.model)(x))
    assert not torch.allclose(after, before)


def _flag_read_anew(wrapped: smt.Wrapped, config: Any) -> tuple[torch.Tensor, torch.Tensor, str]:
    """An input, the answer ``wrapped`` gives it, and the name of its cached module, whose
    ``config.flag`` set True then keys the next call anew: computed as the module computes
    it now, not the answer kept recalled."""
    x = torch.randn(3, 4) - 0.5
    before = wrapped(x)
    name = next(iter(wrapped.counts))
    config.flag = True
    flipped = wrapped(x)
    with torch.no_grad():
        assert torch.equal(flipped, wrapped.model(x))
    assert not torch.allclose(flipped, before)
    return x, before, name


def _scale_read_anew_and_set_back(
    wrapped: smt.Wrapped, config: Any, x: torch.Tensor, before: torch.Tensor, name: str
) -> None:
    """``config.inner.scale``, an object the config holds changed in place, keys the next
    call of ``wrapped`` on ``x`` anew; the config set back, the answer kept ``before`` the
    flag was set is recalled."""
    config.inner.scale = 3.0
    scaled = wrapped(x)
    with torch.no_grad():
        assert torch.equal(scaled, wrapped.model(x))
    assert wrapped.counts[name] == {"ran": 3, "kept": 3}
    config.flag, config.inner.scale = False, 1.0
    assert torch.equal(wrapped(x), before)
    assert wrapped.counts[name] == {"ran": 3, "kept": 3, "recalled": 1}


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
@pytest.mark.parametrize("kind", ["object", "namespace", "argparse", "dataclass"])
def test_a_value_a_cached_module_reads_from_its_config_keys_its_answers(
    store: Store, whole: bool, kind: str
) -> None:
    """A flag or scale a cached module's forward reads from a config it holds
    (``self.config.flag``, ``self.config.inner.scale``), changed in place after answers
    were kept, keys the next call anew: computed as the module computes it now, not the
    answer kept for the old value recalled; set back, the old answer is recalled."""
    torch.manual_seed(0)
    model = HoldsConfig(kind)
    wrapped = _part_frozen(model, "encoder", whole, store)
    config = model.encoder.config
    x, before, name = _flag_read_anew(wrapped, config)
    assert wrapped.counts[name] == {"ran": 2, "kept": 2}
    _scale_read_anew_and_set_back(wrapped, config, x, before, name)
    config.flag = 0  # another value than False, though it computes alike
    wrapped(x)
    assert wrapped.counts[name] == {"ran": 4, "kept": 4, "recalled": 1}


def test_a_config_of_a_class_in_a_user_s_module_named_like_python_s_keys_its_answers(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config class the user wrote in a module named like one of the standard library's
    (`mailbox.py`) is the user's config, not Python's: a flag read from it, changed in place,
    keys the next call anew, where it was taken for a logger's or a lock's and not followed."""
    text = "class Settings:\n    def __init__(self):\n        self.flag = False\n"
    path = tmp_path / "mailbox.py"
    path.write_text(text)
    module = types.ModuleType("mailbox")
    module.__file__ = str(path)
    exec(compile(text, str(path), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "mailbox", module)
    config = module.Settings()
    config.inner = types.SimpleNamespace(scale=1.0)
    torch.manual_seed(0)
    wrapped = _part_frozen(nn.Sequential(ReadsConfig(config)), "0", True, store)
    _flag_read_anew(wrapped, config)


class ReadsHeldConfig(nn.Module):
    """Reads its flag from a config it keeps in a list, tuple or dict."""

    def __init__(self, holder: Any) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.holder = holder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = self.holder
        config = held["main"] if isinstance(held, dict) else held[0]
        out: torch.Tensor = self.linear(x)
        return out.relu() if config.flag else out


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "nested"])
def test_a_config_held_in_a_container_changed_in_place_is_seen_at_the_next_call(
    store: Store, kind: str
) -> None:
    """A config a cached module keeps in a list, tuple or dict, changed in place after
    answers were kept, keys the next call anew: not the answer kept for its old value."""
    torch.manual_seed(0)
    config = types.SimpleNamespace(flag=False)
    holder: Any = {
        "list": [config],
        "tuple": (config,),
        "dict": {"main": config},
        "nested": [[config]],
    }[kind]
    model = nn.Sequential(ReadsHeldConfig(holder), nn.Linear(4, 2))
    if kind == "nested":
        model[0].forward = types.MethodType(  # type: ignore[method-assign]
            lambda self, x: self.linear(x).relu() if self.holder[0][0].flag else self.linear(x),
            model[0],
        )
    wrapped = smt.wrap(model, frozen=["0"], cached=["0"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4) - 0.5
    before = wrapped(x)
    config.flag = True
    flipped = wrapped(x)
    with torch.no_grad():
        assert torch.equal(flipped, wrapped.model(x))
    assert not torch.allclose(flipped, before)
    assert wrapped.counts["0"] == {"ran": 2, "kept": 2}
    config.flag = False
    assert torch.equal(wrapped(x), before)
    assert wrapped.counts["0"] == {"ran": 2, "kept": 2, "recalled": 1}


class Defaulted:
    """A config whose class gives a default and a value worked out from it."""

    scale = 1.0

    def __init__(self) -> None:
        self.flag = False

    @property
    def gain(self) -> float:
        return 1.0


class ReadsClassGiven(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.configs = [Defaulted()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        config = self.configs[0]
        out: torch.Tensor = self.linear(x) * config.scale * config.gain
        return out


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
@pytest.mark.parametrize("given", ["attribute", "property"])
def test_a_config_class_changed_after_answers_were_kept_is_seen_as_drifted(
    store: Store, monkeypatch: pytest.MonkeyPatch, whole: bool, given: str
) -> None:
    """What a cached module reads from a config's class (a default, a property) is that
    class's code: changed after an answer was kept, the answer is recalled as drifted,
    never silently, as an edited block's would be."""
    torch.manual_seed(0)
    model = nn.Sequential(ReadsClassGiven(), nn.Linear(4, 2))
    wrapped = _part_frozen(model, "0", whole, store)
    x = torch.randn(3, 4)
    first = wrapped(x)
    if given == "attribute":
        monkeypatch.setattr(Defaulted, "scale", 3.0)
    else:
        monkeypatch.setattr(Defaulted, "gain", property(lambda self: 3.0))
    with pytest.warns(Drifted, match="was recalled from an answer kept by another version"):
        assert torch.equal(wrapped(x), first)
    name = next(iter(wrapped.counts))
    assert wrapped.counts[name]["drifted"] == 1


def _drifted_part(
    store: Store, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> tuple[nn.Sequential, torch.Tensor]:
    """A model whose part ``0`` kept its answer to the input returned in ``store`` (wrapped
    ``whole``, or the model wrapped naming it), then had its class's code changed."""
    torch.manual_seed(0)
    model = nn.Sequential(ReadsClassGiven(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    _part_frozen(model, "0", whole, store)(x)
    monkeypatch.setattr(Defaulted, "scale", 3.0)
    return model, x


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
def test_a_model_wrapped_strict_computes_a_drifted_answer_again(
    store: Store, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    """An answer kept by another version of a cached part's code (an earlier somatize's,
    or its class's before an edit) is computed again by a model wrapped with
    ``strict=True`` and kept anew, so a model wrapped later recalls it with no drift."""
    model, x = _drifted_part(store, monkeypatch, whole)
    strict = (
        smt.wrap(model[0], frozen=True, cached=True, store=store, strict=True)
        if whole
        else smt.wrap(model, frozen=["0"], cached=["0"], store=store, strict=True)
    )
    smt.freeze(strict)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        fresh = strict(x)
        with torch.no_grad():
            assert torch.equal(fresh, (model[0] if whole else model)(x))
        name = next(iter(strict.counts))
        assert strict.counts[name] == {"drifted": 1, "ran": 1, "kept": 1}  # said recomputed
        later = _part_frozen(model, "0", whole, store)
        assert torch.equal(later(x), fresh)
        assert later.counts[name] == {"recalled": 1}


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
def test_a_wrapped_model_s_drift_warning_says_how_a_wrapped_model_is_made_strict(
    store: Store, monkeypatch: pytest.MonkeyPatch, whole: bool
) -> None:
    """The warning of a drifted answer a wrapped model recalls names the way a wrapped
    model computes it again, or salts it, not only a graph's."""
    model, x = _drifted_part(store, monkeypatch, whole)
    plain = _part_frozen(model, "0", whole, store)
    with pytest.warns(Drifted) as caught:
        plain(x)
    said = str(caught[0].message)
    assert "somatize.torch.wrap(model, ..., strict=True)" in said
    assert "cached={name: salt}" in said


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
def test_a_copy_of_a_model_wrapped_strict_is_strict(
    store: Store, monkeypatch: pytest.MonkeyPatch, whole: bool, how: str
) -> None:
    """A copy of a model wrapped with ``strict=True`` (deep-copied, or pickled as a Ray task
    or a spawned worker takes it) computes a drifted answer again too."""
    model, x = _drifted_part(store, monkeypatch, whole)
    strict = (
        smt.wrap(model[0], frozen=True, cached=True, store=store, strict=True)
        if whole
        else smt.wrap(model, frozen=["0"], cached=["0"], store=store, strict=True)
    )
    copied = copy.deepcopy(strict) if how == "deepcopy" else pickle.loads(pickle.dumps(strict))
    smt.freeze(copied)
    assert copied.strict is True
    with warnings.catch_warnings():
        warnings.simplefilter("error", Drifted)
        copied(x)
    name = next(iter(copied.counts))
    assert copied.counts[name] == {"drifted": 1, "ran": 1, "kept": 1}


def test_a_wrapped_model_s_strict_is_true_or_false() -> None:
    """``strict=`` other than a bool is refused as the model is wrapped, not taken as
    true or false by its truth."""
    with pytest.raises(smt.WrapError, match="strict= is True or False, got 'yes'"):
        smt.wrap(nn.Linear(2, 2), frozen=True, cached=True, strict="yes")  # type: ignore[arg-type]


@dataclasses.dataclass
class Fielded:
    scale: float = 1.0


class ReadsBeyondFields(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.config = Fielded()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.config.scale
        return out.relu() if getattr(self.config, "flag", False) else out


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
def test_an_attribute_set_on_a_dataclass_config_beyond_its_fields_keys_its_answers(
    store: Store, whole: bool
) -> None:
    """A value set on a dataclass config that is none of its fields (``config.flag =
    True``), read by a cached module, keys the next call anew: not the answer kept
    without it."""
    torch.manual_seed(0)
    model = nn.Sequential(ReadsBeyondFields(), nn.Linear(4, 2))
    wrapped = _part_frozen(model, "0", whole, store)
    x = torch.randn(3, 4) - 0.5
    before = wrapped(x)
    name = next(iter(wrapped.counts))
    model[0].config.flag = True  # type: ignore[attr-defined]
    flagged = wrapped(x)
    with torch.no_grad():
        assert torch.equal(flagged, wrapped.model(x))
    assert not torch.allclose(flagged, before)
    assert wrapped.counts[name] == {"ran": 2, "kept": 2}


class Slotted:
    """A config whose class keeps its values in slots, as ``attrs``' ``define`` does."""

    __slots__ = ("flag", "inner")

    def __init__(self) -> None:
        self.flag = False
        self.inner = types.SimpleNamespace(scale=1.0)


class ReadsSlotted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.config = Slotted()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x) * self.config.inner.scale
        return out.relu() if self.config.flag else out


@pytest.mark.parametrize("whole", [False, True], ids=["declared", "whole"])
def test_a_value_a_cached_module_reads_from_a_slotted_config_keys_its_answers(
    store: Store, whole: bool
) -> None:
    """A config of a class with ``__slots__`` is named by what its slots hold, and a value
    set on it in place keys the next call anew, as a config with a ``__dict__`` does."""
    torch.manual_seed(0)
    model = nn.Sequential(ReadsSlotted(), nn.Linear(4, 2))
    wrapped = _part_frozen(model, "0", whole, store)
    config = model[0].config
    x, before, name = _flag_read_anew(wrapped, config)
    _scale_read_anew_and_set_back(wrapped, config, x, before, name)


@pytest.mark.parametrize("config", ["with a __dict__", "slotted"])
def test_tables_of_attributes_replaced_whole_are_looked_for_by_one_mapped_read(
    monkeypatch: pytest.MonkeyPatch, config: str
) -> None:
    """The settings watch looks at every part's and config's table of attributes at each
    cached call, for one replaced whole (``part.__dict__ = {...}``): where each keeps one
    (modules, a config with a ``__dict__``), they are read by one mapped call, not a Python
    call each (half of that look's time); where one keeps none (a slotted config), each is
    read as before. Either way a table replaced is seen, and one replaced and put back is
    no change."""
    from somatize_torch import _settings

    module = ReadsSlotted()
    if config != "slotted":
        module.config = types.SimpleNamespace(flag=False, inner=types.SimpleNamespace(scale=1.0))
    watch = _settings.SettingsWatch(module)
    read: list[object] = []
    dict_of = _settings._dict_of
    monkeypatch.setattr(_settings, "_dict_of", lambda value: read.append(value) or dict_of(value))
    assert not watch.changed()
    assert bool(read) == (config == "slotted")
    table = vars(module.linear)
    module.linear.__dict__ = dict(table)
    assert watch.changed()
    module.linear.__dict__ = table
    assert not watch.changed()


class CountingHook:
    """A forward hook that keeps a count of the calls it sees."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module: nn.Module, args: Any, out: Any) -> None:
        self.calls += 1


def test_what_a_hook_object_keeps_is_no_config_the_settings_watch_sees() -> None:
    """A hook is named by its code: what a callable object registered as one keeps (a
    count it moves as it runs) is no config of the module, and changing it says nothing
    changed, so a cached call is not declared again for it."""
    from somatize_torch._settings import SettingsWatch

    module = nn.Linear(4, 4)
    hook = CountingHook()
    module.register_forward_hook(hook)
    module.config = types.SimpleNamespace(flag=False)
    watch = SettingsWatch(module)
    module(torch.randn(2, 4))
    assert hook.calls == 1
    assert not watch.changed()
    module.config.flag = True
    assert watch.changed()


def test_a_config_value_other_in_another_process_is_computed_not_recalled(
    tmp_path: Path,
) -> None:
    """Answers kept for a config holding one value are not recalled in another process
    whose module's config holds another: they are computed there."""
    store = str(tmp_path / "store")

    def run(flag: bool) -> list[str]:
        code = (
            "import torch\n"
            "from tests._helpers_config import HoldsConfig\n"
            "import somatize.torch as smt\n"
            "torch.manual_seed(0)\n"
            f"model = HoldsConfig('object', {flag})\n"
            f"wrapped = smt.wrap(model, frozen=['encoder'], cached=['encoder'], store={store!r})\n"
            "smt.freeze(wrapped)\n"
            "x = torch.randn(3, 4) - 0.5\n"
            "out = wrapped(x)\n"
            "with torch.no_grad():\n"
            "    assert torch.equal(out, model(x))\n"
            "print(' '.join(sorted(wrapped.counts['encoder'])))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        return done.stdout.split()

    assert run(False) == ["kept", "ran"]
    assert run(True) == ["kept", "ran"]
    # This process is a third, other than both: what the first kept is recalled here.
    torch.manual_seed(0)
    model = HoldsConfig("object", False)
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4) - 0.5
    out = wrapped(x)
    with torch.no_grad():
        assert torch.equal(out, model(x))
    assert sorted(wrapped.counts["encoder"]) == ["recalled"]


def test_the_precision_a_call_runs_in_keys_it_apart(store: Store) -> None:
    """An answer computed under bf16 autocast is not recalled for a float32 call, nor the
    other way round, and a call in torch's default precision keeps the key it had: the
    owner graph's declaration and state, and the content of the inputs."""
    wrapped, model = _held(False, store)
    x = torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = wrapped(x)
    plain = wrapped(x)
    assert plain.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(plain, model(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(wrapped(x), low)
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 1}
    memory = wrapped.graph.memory
    identity, declaration = memory.identity_of("encoder"), memory.declaration_of("encoder")
    assert identity is not None and declaration is not None
    prefix = node_prefix(identity, declaration, memory.state_of("encoder"), None)
    usual = node_key(prefix, [root_key(Opaque((x,), smt.TENSOR))])
    wrapped(x)
    assert wrapped.graph.record is not None
    assert [f["key"] for f in wrapped.graph.record.facts if f["fact"] == "recalled"] == [usual]


class Convolves(nn.Module):
    """A declared convolution and a head after it."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Conv2d(3, 8, 3, 2, 1)
        self.head = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_a_call_with_onednn_turned_off_is_keyed_apart(store: Store) -> None:
    """A convolution called with oneDNN turned off (`torch.backends.mkldnn.enabled =
    False`) runs through torch's own kernel, which rounds otherwise: the answer oneDNN
    computed is not recalled for it, nor the other way round."""
    wrapped, model = _held(False, store, Convolves)
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        usual = model(x)
    assert torch.equal(wrapped(x), usual)
    try:
        torch.backends.mkldnn.enabled = False
        with torch.no_grad():
            without = model(x)
        assert torch.equal(wrapped(x), without)
    finally:
        torch.backends.mkldnn.enabled = True
    assert not torch.equal(without, usual)  # the setting changes the answer
    assert torch.equal(wrapped(x), usual)
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 1}


@pytest.mark.skipif(
    not hasattr(torch.backends.mkldnn, "matmul"), reason="needs torch's per-backend precision"
)
def test_the_per_backend_precision_is_read_and_keys_a_call_apart(store: Store) -> None:
    """torch's per-backend float32 precision (`torch.backends.<backend>.matmul.
    fp32_precision`), which makes torch's legacy getter raise once set, is read as it is:
    a call under it runs, and one in reduced precision on the host is not recalled for a
    full precision one."""
    wrapped, _ = _held(False, store)
    x = torch.randn(3, 4)
    wrapped(x)
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        wrapped(x)
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        wrapped(x)
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = "none"
        torch.backends.cuda.matmul.fp32_precision = "none"
    wrapped(x)
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 2}


# ------------------------------------------------------------------ what comes back


Pooled = collections.namedtuple("Pooled", ["hidden", "pooled"])


class Answers(nn.Module):
    """Answers a value of the kind it is built to."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        h = self.linear(x)
        if self.kind == "dict":
            return {"zeta": h, "alpha": h.sum(-1)}
        if self.kind == "ordered":
            return collections.OrderedDict(zeta=h, alpha=h.sum(-1))
        if self.kind == "namedtuple":
            return Pooled(h, h.mean(-1))
        if self.kind == "none":
            return h, None
        if self.kind == "nested":
            return h, (h.sum(-1), [h.mean(-1), None])
        if self.kind == "int":
            return h, (h.sum(-1), 3)
        if self.kind == "local":
            local = collections.namedtuple("local", ["h"])
            return local(h)
        return Scores(h=h)


class Scores(dict[str, torch.Tensor]):
    """A dict subclass: kept, it could only come back as a plain dict."""


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_value(p, q) for p, q in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("kind", ["dict", "ordered", "namedtuple", "none", "nested"])
def test_an_answer_comes_back_as_it_was_computed(store: Store, kind: str) -> None:
    """A cached module's answer is the same kind of value computed and recalled — a dict in
    its order, a namedtuple as its class, None and nesting where they were — and is what
    the module itself answers."""
    torch.manual_seed(0)
    module = Answers(kind)
    wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    computed, recalled = wrapped(x), wrapped(x)
    assert wrapped.counts["answers"] == {"ran": 1, "kept": 1, "recalled": 1}
    with torch.no_grad():
        assert _same_value(computed, module(x))
    assert _same_value(recalled, computed)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("int", r"item \[1\]\[1\] is a `builtins.int`"),
        ("local", "it is a .*namedtuple, whose class cannot be found again by its name"),
        ("subclass", r"it is a `[\w.]*Scores`"),
    ],
    ids=["int", "local-namedtuple", "dict-subclass"],
)
def test_an_answer_that_cannot_come_back_as_it_is_is_refused(
    store: Store, kind: str, why: str
) -> None:
    """An answer the store cannot give back as it was computed is refused when it is kept,
    naming the item, rather than recalled as something else."""
    wrapped = smt.wrap(Answers(kind), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    with pytest.raises(
        CodecError, match=f"`answers` is cached, and its answer cannot be kept: {why}"
    ):
        wrapped(torch.randn(3, 4))


class Boxes(torch.Tensor):
    """A tensor subclass, as torchvision's ``tv_tensors.BoundingBoxes`` is one."""


class Queries(nn.Module):
    """Hands a frozen parameter of its own to the encoder (as DETR hands its queries)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.queries = nn.Parameter(torch.randn(4, 6), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.queries) + x


def test_a_frozen_parameter_handed_to_a_cached_module_is_keyed_by_its_values(
    store: Store,
) -> None:
    """A frozen parameter handed to a cached module is weighed and handed on as its values,
    and the answer is recalled; a tensor subclass is refused, saying what to hand."""
    torch.manual_seed(0)
    wrapped = smt.wrap(Queries(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(4, 5)
    computed, recalled = wrapped(x), wrapped(x)
    assert torch.equal(computed, recalled)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    boxed = smt.wrap(Returns(nn.Linear(5, 5)), frozen=True, cached=True, store=store)
    smt.freeze(boxed)
    with pytest.raises(TypeError, match=r"with a `Boxes`.*as_subclass\(torch\.Tensor\)"):
        boxed(x.as_subclass(Boxes))


@pytest.mark.parametrize("kept", ["store", "no store"])
@pytest.mark.parametrize("shape", [(4, 6), ()], ids=["batch", "scalar"])
def test_a_cached_module_traced_by_torch_jit_trace_is_refused(
    store: Store, shape: tuple[int, ...], kept: str
) -> None:
    """`torch.jit.trace` of a wrapped model keeps what a call runs as the code of every
    later call, and a recalled answer runs nothing: the trace failed with a `NotCanonical`
    saying to pass a Python number, or torch's own internal assertion. It is refused,
    saying to trace the model itself, which then traces as the plain model; the wrapped
    model answers as before. So it is without a store, as an export is: the trace would
    leave the part declared cached uncached for good, silently."""
    torch.manual_seed(0)
    wrapped = smt.wrap(
        nn.Sequential(nn.Linear(6, 6), nn.Tanh()),
        frozen=True,
        cached=True,
        store=store if kept == "store" else None,
    )
    smt.freeze(wrapped)
    x = torch.randn(shape or (6,))
    wrapped(x)
    with pytest.raises(TypeError, match=r"`torch\.jit\.trace` traces it.*`wrapped\.model`"):
        torch.jit.trace(wrapped, (x,), check_trace=False)
    traced = torch.jit.trace(wrapped.model, (x,))
    other = torch.randn(shape or (6,))
    with torch.no_grad():
        assert torch.equal(traced(other), wrapped.model(other))
        assert torch.equal(wrapped(other), wrapped.model(other))


@pytest.mark.parametrize("kept", ["store", "no store"])
@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("declared", ["whole", "part"])
def test_a_cached_module_exported_by_torch_export_is_refused(
    store: Store, declared: str, strict: bool, kept: str
) -> None:
    """`torch.export.export` of a wrapped model keeps what a call runs as the program of
    every later call, and a recalled answer runs nothing: it failed with torch's own
    "Non-recursive torch.compiler.disable is not supported with torch.export" (the model
    cached whole), or with a refusal of a `FakeTensor` saying to hand a plain tensor (a
    cached part). It is refused, saying to export the model itself, which then exports as
    the plain model; the wrapped model answers as before. A strict export is refused so
    too (torch's compiler, which traces it, reports the refusal it met)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    names: Any = True if declared == "whole" else ["0"]
    wrapped = smt.wrap(model, frozen=names, cached=names, store=store if kept == "store" else None)
    smt.freeze(wrapped)
    x = torch.randn(4, 6)
    wrapped(x)
    with pytest.raises(
        (TypeError, RuntimeError) if strict else TypeError,
        match=r"`torch\.export\.export` traces it.*Export the model itself \(`wrapped\.model`\)",
    ):
        torch.export.export(wrapped, (x,), strict=strict)
    exported = torch.export.export(wrapped.model, (x,)).module()
    other = torch.randn(4, 6)
    with torch.no_grad():
        assert torch.equal(exported(other), model(other))
        assert torch.equal(wrapped(other), model(other))


class _ExportWaits(nn.Module):
    """Exported, waits inside the export until told to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go_on = threading.Event(), threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        self.go_on.wait(30)
        return x + 1


@contextlib.contextmanager
def while_another_thread_exports() -> Iterator[None]:
    """Runs the block while another thread is inside a (non-strict) `torch.export.export`,
    and checks that the export went on."""
    waits = _ExportWaits()
    failed: list[BaseException] = []

    def export() -> None:
        try:
            torch.export.export(waits, (torch.randn(2, 3),), strict=False)
        except BaseException as error:
            failed.append(error)

    exporting = threading.Thread(target=export)
    exporting.start()
    try:
        assert waits.inside.wait(30)
        yield
    finally:
        waits.go_on.set()
        exporting.join()
    assert not failed


def cached_as(declared: str, model: nn.Module, store: Store) -> nn.Module:
    """``model`` cached as ``declared`` says: wrapped and cached "whole", its first "part"
    cached, or cached per "rows"."""
    if declared == "rows":
        return smt.cache_rows(model, store)
    names: Any = True if declared == "whole" else ["0"]
    wrapped = smt.wrap(model, frozen=names, cached=names, store=store)
    smt.freeze(wrapped)
    return wrapped


@pytest.mark.parametrize("declared", ["whole", "part", "rows"])
def test_a_cached_call_on_another_thread_than_an_export_is_not_refused(
    store: Store, declared: str
) -> None:
    """torch says it is exporting to every thread while one exports: an eager cached call
    on another thread meanwhile was refused as if export traced it, or failed with torch's
    own "Non-recursive torch.compiler.disable is not supported with torch.export". It is
    computed and then recalled, and the export goes on."""
    torch.manual_seed(0)
    cached = cached_as(declared, nn.Sequential(nn.Linear(6, 6), nn.Tanh()), store)
    with while_another_thread_exports():
        x = torch.randn(4, 6)
        with torch.no_grad():
            computed, recalled = cached(x), cached(x)
    assert torch.equal(computed, recalled)
    if declared != "rows":
        assert isinstance(cached, smt.Wrapped)
        assert list(cached.counts.values()) == [{"ran": 1, "kept": 1, "recalled": 1}]


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("declared", ["whole", "part"])
def test_a_wrapped_model_that_keeps_nothing_is_exported_as_the_plain_model(
    declared: str, strict: bool
) -> None:
    """A model declared frozen and cached nowhere keeps no answer that could go stale, so
    `torch.export.export` of it gives the plain model's program: the model frozen whole
    failed with torch's own "Non-recursive torch.compiler.disable is not supported with
    torch.export" (or, strict, an `Unsupported` call of a function marked as skipped)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    wrapped = smt.wrap(model, frozen=True if declared == "whole" else ["0"])
    smt.freeze(wrapped)
    x = torch.randn(4, 6)
    exported = torch.export.export(wrapped, (x,), strict=strict).module()
    other = torch.randn(4, 6)
    with torch.no_grad():
        assert torch.equal(exported(other), model(other))
        assert torch.equal(wrapped(other), model(other))


@pytest.mark.parametrize(
    "transformed",
    [
        lambda wrapped, x: torch.func.vmap(wrapped)(x),
        lambda wrapped, x: torch.func.grad(lambda x: wrapped(x).sum())(x),
        lambda wrapped, x: torch.func.grad(lambda s: (s * wrapped(x)).sum())(torch.ones(())),
        lambda wrapped, x: torch.func.grad(
            lambda p: torch.func.functional_call(wrapped, p, (x,)).sum()
        )({name: p.detach().clone() for name, p in wrapped.named_parameters()}),
    ],
    ids=["vmap", "grad", "grad of a batch made outside", "grad of its weights"],
)
def test_a_cached_module_called_inside_a_torch_func_transform_is_refused(
    store: Store, transformed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> None:
    """Inside `torch.func.vmap` or `torch.func.grad` a cached module is handed tensors of
    the transform's own, with no memory to key them by: the call is refused, naming the
    transform and what to do, and the same batch outside it is computed and recalled."""
    torch.manual_seed(0)
    wrapped = smt.wrap(nn.Linear(4, 4), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"inside a `torch\.func` transform.*outside the transform"):
        transformed(wrapped, x)
    with torch.no_grad():
        assert torch.equal(wrapped(x), wrapped(x))
    assert wrapped.counts["linear"] == {"ran": 1, "kept": 1, "recalled": 1}


@pytest.mark.parametrize(
    ("made", "kind"),
    [
        (lambda x: x.to_sparse(), "sparse_coo"),
        (lambda x: torch.nested.nested_tensor([x[:1], x]), "nested"),
    ],
    ids=["sparse", "nested"],
)
def test_a_cached_module_handed_a_tensor_that_is_not_dense_is_refused_saying_what_to_hand(
    store: Store, made: Callable[[torch.Tensor], torch.Tensor], kind: str
) -> None:
    """A sparse or nested tensor has no one layout of bytes to key a call by: the call is
    refused naming the module, the kind of tensor and the dense one to hand instead."""
    wrapped = smt.wrap(nn.Linear(4, 4), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    with (
        warnings.catch_warnings(),  # torch calls its nested tensors a prototype
        pytest.raises(TypeError, match=rf"`linear` is cached .* a {kind} tensor .*to_dense"),
    ):
        warnings.simplefilter("ignore")
        wrapped(made(torch.randn(3, 4)))


class ConvStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_a_batch_laid_out_channels_last_is_keyed_apart_from_the_same_batch_in_c_order(
    store: Store,
) -> None:
    """A conv fed channels_last answers channels_last (and may round otherwise): the answer
    kept for a batch in C order is not recalled for the same batch laid out channels_last,
    which is computed and kept on its own, so each layout gets what the model answers it,
    strides and bits, on a hit as on the miss."""
    torch.manual_seed(0)
    model = ConvStack()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 8, 6, 6)
    last = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        truth, truth_last = model(x), model(last)
        wrapped(x)
        for _ in range(2):
            out = wrapped(last)
            assert out.stride() == truth_last.stride()
            assert torch.equal(out, truth_last)
        out = wrapped(x)
        assert out.stride() == truth.stride()
        assert torch.equal(out, truth)
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 2}


def test_a_model_laid_out_channels_last_after_freezing_recalls_no_answer_of_its_c_order_weights(
    store: Store,
) -> None:
    """A conv whose weights are channels_last answers channels_last (and may round
    otherwise), whatever its input's layout: a model converted so after freezing
    (`model.to(memory_format=torch.channels_last)`) computes and keeps its own answers,
    strides and bits, rather than recall those of its weights in C order; converted back,
    it recalls those again."""
    torch.manual_seed(0)
    model = nn.Conv2d(8, 16, 3, padding=1)
    wrapped = smt.wrap(model, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    answers_as_its_weights_are_laid_out(wrapped, model)
    assert wrapped.counts["conv2d"] == {"ran": 2, "kept": 2, "recalled": 2}


def test_a_cached_module_handed_a_meta_tensor_is_refused_saying_so(store: Store) -> None:
    """A tensor on the meta device (one a shape is worked out with) holds no values to key
    a call by: the call is refused naming the module and the argument, not stopped by
    torch asking what precision a meta device runs in."""
    wrapped = smt.wrap(nn.Linear(4, 4), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    with pytest.raises(TypeError, match=r"`linear` is cached .* meta device as argument 0"):
        wrapped(torch.empty(3, 4, device="meta"))
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), wrapped(x))
    assert wrapped.counts["linear"] == {"ran": 1, "kept": 1, "recalled": 1}


def _unkeyable_inputs() -> list[torch.Tensor]:
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates quantized tensors
        found = [torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)]
    for dtype in ("uint1", "float4_e2m1fn_x2"):
        if hasattr(torch, dtype):
            found.append(torch.zeros(3, 4, dtype=getattr(torch, dtype)))
    return found


@pytest.mark.parametrize("x", _unkeyable_inputs(), ids=lambda x: str(x.dtype))
def test_a_cached_module_handed_a_tensor_of_a_dtype_no_codec_writes_is_refused_saying_so(
    store: Store, x: torch.Tensor
) -> None:
    """A quantized or sub-byte tensor has no bytes the codec writes to key a call by: the
    call is refused naming the module, the argument and the dtype, and what to do, not
    as an Opaque tuple the user never made."""
    wrapped = smt.wrap(nn.Linear(4, 4), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    with pytest.raises(CodecError) as refused:
        wrapped(x)
    said = str(refused.value)
    assert f"`linear` is cached and is called with a {x.dtype} tensor as argument 0" in said
    assert "cannot be keyed" in said and "drop the submodule from `cached=`" in said
    assert "Opaque" not in said
    assert "linear" not in wrapped.counts  # refused before anything ran or was kept


def test_an_answer_of_a_tensor_subclass_is_refused(store: Store) -> None:
    """A cached module answering a tensor subclass is refused when its answer is kept,
    naming the class, rather than recalled as a plain tensor."""
    wrapped = smt.wrap(Returns(AsBoxes()), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    with pytest.raises(CodecError, match=r"cannot be kept: it is a `[\w.]*Boxes`, a subclass"):
        wrapped(torch.randn(3, 4))


class AsBoxes(nn.Module):
    """Answers its input doubled, as a `Boxes`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).as_subclass(Boxes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_answer_is_on_the_device_of_the_input_computed_or_recalled(store: Store) -> None:
    """An answer is put on the device of the call's first input, computed or recalled
    alike: one kept from a call on the host is recalled onto the device a later call is
    made on, and one a module answers on the host comes back on its input's device."""
    wrapped = smt.wrap(Returns(ToHost()), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4, device="cuda")
    assert wrapped(x).device.type == "cuda"
    assert wrapped(x).device.type == "cuda"
    assert wrapped.counts["returns"]["recalled"] == 1
    y = torch.randn(3, 4)
    assert wrapped(y).device.type == "cpu"
    assert wrapped(y.cuda()).device.type == "cuda"
    assert wrapped.counts["returns"]["recalled"] == 2


class ToHost(nn.Module):
    """Answers on the host whatever device its input is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).cpu()


class Returns(nn.Module):
    """Returns what the module it holds answers."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> Any:
        return self.inner(x)


# ------------------------------------------------------------------ what a cached module may do


class Centres(nn.Module):
    """Centres its input in place, then encodes it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.mean(-1, keepdim=True))
        return self.linear(x)


class Residual(nn.Module):
    """Reads its input again after the encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Centres()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + x


def test_a_cached_module_that_writes_into_its_input_is_refused(store: Store) -> None:
    """A cached module that writes into a tensor it is handed is refused before its answer
    is kept: a recall would not repeat the write, and what reads the input after it
    would differ between a miss and a hit."""
    wrapped = smt.wrap(Residual(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with pytest.raises(smt.WrapError, match="wrote into argument 0 it was handed, in place"):
            wrapped(x.clone())


def test_a_write_into_an_input_made_under_inference_mode_is_refused(store: Store) -> None:
    """Under ``inference_mode`` inputs keep no version counter: the write is seen by their
    content, weighed again on a miss."""
    wrapped = smt.wrap(Residual(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    with torch.inference_mode():
        x = torch.randn(3, 4)
        with pytest.raises(smt.WrapError, match="wrote into argument 0 it was handed"):
            wrapped(x.clone())


class CountsItsCalls(nn.Module):
    """Counts its calls in a buffer, and scales its encoding by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) * self.calls


class CountedResidual(nn.Module):
    """Its counting encoder, and its input after it."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = CountsItsCalls()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + x


@pytest.mark.parametrize(
    "mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference"]
)
def test_a_cached_module_that_writes_into_its_own_buffers_is_refused(
    store: Store, mode: Callable[[], Any]
) -> None:
    """A cached module that writes into a buffer of its own as it runs is refused before
    its answer is kept: a recall would not repeat the write, so a process finding the
    answer kept would go on answering the first call's answer where the model answers
    the count of each call."""
    wrapped = smt.wrap(CountedResidual(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with mode(), pytest.raises(smt.WrapError, match="wrote into `calls`, of its own"):
            wrapped(x)


class CountsItsCallsBeside(nn.Module):
    """Counts its calls in a tensor it keeps as a plain attribute, or in its config, and
    scales its encoding by the count."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.where = where
        self.calls = torch.zeros(())  # a tensor, not a buffer
        self.config = types.SimpleNamespace(calls=torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calls = self.calls if self.where == "attribute" else self.config.calls
        calls += 1
        return self.linear(x) * calls


class CountedBesideResidual(nn.Module):
    """Its encoder counting beside its weights, and its input after it."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.encoder = CountsItsCallsBeside(where)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + x


@pytest.mark.parametrize(("where", "named"), [("attribute", "calls"), ("config", "config")])
def test_a_cached_module_that_writes_into_a_tensor_it_keeps_is_refused(
    store: Store, where: str, named: str
) -> None:
    """A tensor a cached module keeps beside its weights, as a plain attribute or in a
    config, written in place as it runs, is refused as a buffer is: its key was taken
    before the write, so the next call would be recalled as the first was computed where
    the model answers the count of each call."""
    wrapped = smt.wrap(
        CountedBesideResidual(where), frozen=["encoder"], cached=["encoder"], store=store
    )
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with torch.no_grad(), pytest.raises(smt.WrapError, match=f"wrote into `{named}`, of"):
            wrapped(x)


class Probed(nn.Module):
    """A linear head on a linear encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def test_inference_tensors_put_in_a_frozen_module_are_refused(store: Store) -> None:
    """Tensors made under ``inference_mode`` and put in after freezing (a checkpoint loaded
    with ``assign=True``) keep no version counter, so a later write into them could not
    be seen: refused at the next forward, as freezing refuses them, saying how to load."""
    model = Probed()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    wrapped(x)
    with torch.inference_mode():
        checkpoint = {k: torch.randn_like(v) for k, v in model.encoder.state_dict().items()}
    model.encoder.load_state_dict(checkpoint, assign=True)
    for _ in range(2):  # nothing was taken in: refused again
        with pytest.raises(
            smt.FreezeError, match=r"inference_mode\(\)` \(`weight`, `bias`\).*without `assign`"
        ):
            wrapped(x)


class Aliases(nn.Module):
    """Answers a tensor and a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.linear(x)
        return h, h[:, :2]


class ZeroesOne(nn.Module):
    """Writes into the first of the encoder's answers and reads the second."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Aliases()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        whole, part = self.encoder(x)
        whole.mul_(0)
        return part.sum(-1)


def test_the_tensors_of_an_answer_share_no_memory_computed_or_recalled(store: Store) -> None:
    """A recalled answer's tensors are each their own; a computed one's are made so too,
    so a write into one reaches the other neither on a miss nor on a hit."""
    torch.manual_seed(0)
    wrapped = smt.wrap(ZeroesOne(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        computed, recalled = wrapped(x), wrapped(x)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    assert torch.equal(computed, recalled) and bool(computed.abs().sum() > 0)


class Flat(nn.Module):
    """Answers a view of its input, or its own weight as it holds it (``hand=True``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.hand = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight.detach() if self.hand else x.flatten(1)


class Doubles(nn.Module):
    """Writes into the encoder's answer, then reads its input too."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Flat()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        h.mul_(2)
        return h.sum() + x.sum()


def test_an_answer_sharing_memory_with_an_input_or_the_weights_is_copied(store: Store) -> None:
    """An answer that is a view of the input, or the module's own weight, is copied when
    computed, as a recalled one is its own: a write into it changes neither the input nor
    the weight, and a miss and a hit answer alike."""
    wrapped = smt.wrap(Doubles(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.ones(3, 2, 2)
    with torch.no_grad():
        computed, recalled = wrapped(x), wrapped(x.clone())
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    assert torch.equal(computed, recalled) and torch.equal(x, torch.ones(3, 2, 2))
    encoder = Flat()
    encoder.hand = True
    whole = smt.wrap(encoder, frozen=True, cached=True, store=store)
    smt.freeze(whole)
    with torch.no_grad():
        whole(torch.zeros(2)).mul_(3)
        assert torch.equal(encoder.weight, torch.ones(4))
        assert torch.equal(whole(torch.zeros(2)), torch.ones(4))


class Table(nn.Module):
    """Answers a table it keeps as a plain attribute, not a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.zeros(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table


def test_an_answer_that_is_a_tensor_the_module_keeps_as_an_attribute_is_copied(
    store: Store,
) -> None:
    """A module answering a tensor it keeps as a plain attribute hands back a copy when it
    computes, as when it recalls: a write into the answer leaves the table as it was (it
    changed the table, and every later answer, on a miss only)."""
    module = Table()
    whole = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(whole)
    with torch.no_grad():
        whole(torch.ones(1)).add_(5)
        assert torch.equal(module.table, torch.zeros(3))
        assert torch.equal(whole(torch.ones(1)), torch.zeros(3))


class ContainedTables(nn.Module):
    """Answers a table it keeps in a list, and one it keeps in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = [torch.zeros(3)]
        self.cache = {"cos": torch.zeros(3)}

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tables[0], self.cache["cos"]


def test_an_answer_that_is_a_tensor_the_module_keeps_in_a_container_is_copied(
    store: Store,
) -> None:
    """A tensor kept in a list or a dict is the module's as much as one kept alone: a write
    into the answer it computed leaves the table as it was, so the next call is recalled
    as the first was computed, not computed again from a table it wrote."""
    module = ContainedTables()
    whole = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(whole)
    with torch.no_grad():
        for answer in whole(torch.ones(1)):
            answer.add_(5)
        assert torch.equal(module.tables[0], torch.zeros(3))
        assert torch.equal(module.cache["cos"], torch.zeros(3))
        assert all(torch.equal(answer, torch.zeros(3)) for answer in whole(torch.ones(1)))
    assert whole.counts == {"contained_tables": {"ran": 1, "kept": 1, "recalled": 1}}


@dataclasses.dataclass
class TableConfig:
    """A config holding a table."""

    table: torch.Tensor


class ConfiguredTables(nn.Module):
    """Answers the tables its configs hold: a namespace's, and a dataclass's nested in it."""

    def __init__(self) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(table=torch.zeros(3), sub=TableConfig(torch.zeros(3)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.config.table, self.config.sub.table


def test_an_answer_that_is_a_tensor_a_config_of_the_module_holds_is_copied(
    store: Store,
) -> None:
    """A tensor a plain object held as a config keeps (`self.config.table`) is the module's
    as much as one kept in a list: a write into the answer it computed leaves the config's
    table as it was, so the next call is recalled as the first was computed."""
    module = ConfiguredTables()
    whole = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(whole)
    with torch.no_grad():
        for answer in whole(torch.ones(1)):
            answer.add_(5)
        assert torch.equal(module.config.table, torch.zeros(3))
        assert torch.equal(module.config.sub.table, torch.zeros(3))
        assert all(torch.equal(answer, torch.zeros(3)) for answer in whole(torch.ones(1)))
    assert whole.counts == {"configured_tables": {"ran": 1, "kept": 1, "recalled": 1}}


def test_a_module_wrapped_whole_takes_a_salt(store: Store) -> None:
    """``cached={"": salt}`` caches a module wrapped whole under its salt: the same
    weights and batch under another salt are computed again, not recalled."""
    torch.manual_seed(0)
    encoder = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    plain = smt.wrap(encoder, frozen=True, cached=True, store=store)
    salted = smt.wrap(encoder, frozen=True, cached={"": "v2"}, store=store)
    smt.freeze(plain)
    smt.freeze(salted)
    with torch.no_grad():
        assert torch.equal(plain(x), salted(x))
        salted(x)
    assert plain.counts["linear"] == {"ran": 1, "kept": 1}
    assert salted.counts["linear"] == {"ran": 1, "kept": 1, "recalled": 1}


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"frozen": [1]}, r"`frozen=` takes .*; got `1`, a `int`"),
        ({"frozen": 1}, r"`frozen=` takes .*; got a `int`"),
        (
            {"frozen": {"encoder": "x"}},
            r"`frozen=` takes .*a dict of salts: a salt goes in `cached=",
        ),
        ({"cached": {"encoder": 2}}, r"`cached=` takes .*got the salt `2` for `encoder`"),
    ],
)
def test_declarations_other_than_names_are_refused_saying_what_is_taken(
    given: dict[str, Any], match: str
) -> None:
    """``frozen=`` and ``cached=`` given something else than ``True``, names or (in
    ``cached=``) names mapped to salts are refused, naming the argument and what it
    takes, rather than failing deep inside or dropping a salt."""
    declared: dict[str, Any] = {"frozen": ["encoder"], "cached": ["encoder"], **given}
    with pytest.raises(TypeError, match=match):
        smt.wrap(_model(), **declared)


def test_declarations_are_names_from_any_iterable(store: Store) -> None:
    """Names come from any iterable of them, as from a list: a dict's keys, a generator,
    a dict to no salt in ``frozen=``."""
    x = torch.randn(4, 6)
    salts = {"encoder": "v2"}
    seen = []
    for frozen in (salts.keys(), (n for n in ["encoder"]), {"encoder": None}):
        wrapped = smt.wrap(_model(), frozen=frozen, cached=salts, store=store)
        smt.freeze(wrapped)
        with torch.no_grad():
            wrapped(x)
        assert wrapped.graph.record is not None
        seen.append(wrapped.graph.record.outcome["encoder"])
    assert seen == ["ran", "recalled", "recalled"]


class Scaled(OnTempered):
    """Multiplies the encoder's answer by a tensor kept as a plain attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.scale


def test_a_plain_tensor_attribute_replaced_after_wrap_is_the_one_read(store: Store) -> None:
    """A tensor the forward reads as a plain attribute, replaced on the model or on the
    wrapped model, is the one the traced code reads."""
    wrapped, model = _encoder_cached(Scaled, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.scale = torch.zeros(4)
        assert torch.equal(wrapped(x), model(x))
        wrapped.scale = torch.full((4,), 3.0)
        assert model.scale is wrapped.model.scale and float(model.scale[0]) == 3.0
        assert torch.equal(wrapped(x), model(x))


class Normalises(OnTempered):
    """Computes with its buffers and a plain tensor attribute among themselves, before
    they meet the input: statistics clamped, a temperature read as a number."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("std", torch.ones(4))
        self.register_buffer("temperature", torch.tensor(2.0))
        self.offset = torch.zeros(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) / self.std.clamp(min=1e-3)
        return h / self.temperature.item() + self.offset * 2


def test_buffers_the_forward_computes_with_are_read_as_it_runs(store: Store) -> None:
    """What the forward computes from buffers and plain tensor attributes alone is
    computed as the wrapped model runs, not kept from the trace: a checkpoint loaded in
    place, or a buffer written in place, is the one the next call computes with."""
    wrapped, model = _encoder_cached(Normalises, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        state = wrapped.state_dict()
        state["std"], state["temperature"] = torch.full((4,), 4.0), torch.tensor(10.0)
        wrapped.load_state_dict(state)
        assert float(model.temperature) == 10.0
        assert torch.equal(wrapped(x), model(x))
        model.offset.fill_(3.0)
        assert torch.equal(wrapped(x), model(x))


class BranchesOnABuffer(OnTempered):
    """Takes a branch by what a buffer holds."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("use_bias", torch.tensor(True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.use_bias:
            h = h + 1
        return h


def test_a_branch_on_what_a_buffer_holds_is_refused() -> None:
    """A branch on a buffer's value would be taken once, as fx traces: `wrap` refuses it,
    naming the line, rather than keep the branch the buffer picked then."""
    with pytest.raises(smt.Untraceable, match=r"`if self\.use_bias:`"):
        smt.wrap(BranchesOnABuffer(), frozen=["encoder"])


class Settled(OnTempered):
    """Reads plain values it keeps, and a block's, between its declared encoder and its
    head; keeps one it never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4))
        self.block.gain = 2.0  # type: ignore[assignment]
        self.temperature = 2.0
        self.act = torch.relu
        self.scales = [1.0, 3.0]
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.encoder(x)) / self.temperature * self.scales[1]
        return self.block(h) * self.block.gain


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: setattr(m, "temperature", 0.5), r"`temperature` was 2\.0 .* is 0\.5 now"),
        (lambda m: m.scales.__setitem__(1, 1.0), r"`scales` was \[1\.0, 3\.0\] .* \[1\.0, 1\.0\]"),
        (lambda m: setattr(m, "act", torch.tanh), r"`act` was `torch\.relu` .* `torch\.tanh`"),
        (lambda m: setattr(m.block, "gain", 3.0), r"`block\.gain` was 2\.0"),
        (lambda m: delattr(m, "temperature"), r"`temperature` was 2\.0 .* was removed"),
    ],
    ids=["number", "list item", "function", "traced-into part", "removed"],
)
def test_a_plain_value_the_forward_read_changed_after_wrap_is_refused(
    store: Store, change: Any, named: str
) -> None:
    """fx traces a plain value the forward reads from the model into the code as the value
    it had: changed after `wrap`, the wrapped model would compute with the old one, so
    the next call is refused, naming it; put back as it was, the call runs."""
    wrapped, model = _encoder_cached(Settled, store)
    assert type(model) is Settled and type(model.block) is nn.Sequential
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
        change(model)
        with pytest.raises(smt.WrapError, match=named + ".*Wrap the model again"):
            wrapped(x)
        model.temperature, model.act, model.scales[1], model.block.gain = 2.0, torch.relu, 3.0, 2.0
        assert torch.equal(wrapped(x), expected)
        again = _encoder_frozen(model, store)
        change(model)
        with pytest.raises(smt.WrapError, match=named):
            again(x)


@pytest.mark.parametrize("whose", ["model", "part"])
def test_a_table_of_attributes_replaced_whole_after_a_call_is_refused(
    store: Store, whose: str
) -> None:
    """A module's table of attributes replaced whole after the wrapped model ran
    (``model.__dict__ = {...}``), holding another value the forward read, is refused at
    the next call, naming it, as the value set alone is; put back, the call runs as the
    model does."""
    wrapped, model = _encoder_cached(Settled, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = wrapped(x)
        if whose == "model":
            model.__dict__ = {**vars(model), "temperature": 0.5}
            named = r"`temperature` was 2\.0 .* is 0\.5 now"
        else:
            model.block.__dict__ = {**vars(model.block), "gain": 3.0}
            named = r"`block\.gain` was 2\.0"
        with pytest.raises(smt.WrapError, match=named):
            wrapped(x)
        model.temperature, model.block.gain = 2.0, 2.0
        assert torch.equal(wrapped(x), expected)
        assert torch.equal(wrapped(x), model(x))


def test_a_value_the_forward_does_not_read_changes_freely(store: Store) -> None:
    """A value the model keeps and its forward never reads, or one given again as it was,
    changes nothing the wrapped model runs; one given to the wrapped model is given to the
    model, and is refused at the next call when the code read it."""
    wrapped, model = _encoder_cached(Settled, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.step = 7
        model.temperature = float("2.0")  # another float object, the same value
        model.scales = [1.0, 3.0]
        assert torch.equal(wrapped(x), model(x))
        wrapped.temperature = 4.0
        assert model.temperature == 4.0
        with pytest.raises(smt.WrapError, match=r"`temperature` was 2\.0"):
            wrapped(x)


class Registers(nn.Module):
    """Keeps a registry of its subclasses, which subclassing it fills."""

    known: ClassVar[list[type]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Registers.known.append(cls)


class Registered(Registers):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Tempered()
        self.gain = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.gain


def test_tracing_leaves_the_model_s_classes_as_they_were(store: Store) -> None:
    """The values a trace reads are noted without changing what a class holds: a class
    that runs code when subclassed sees no new subclass (its values go unwatched), and
    every module has its own class back after a trace, a failed one too."""
    before = list(Registers.known)
    model = Registered()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    assert Registers.known == before and type(model) is Registered
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    failing = Model()
    failing.encoder = Untraceable()  # type: ignore[assignment]
    with pytest.raises(smt.Untraceable):
        smt.wrap(failing, frozen=["head"])
    assert type(failing) is Model and type(failing.encoder) is Untraceable


class Checks(OnTempered):
    """Branches on its own class, as a base class's forward may."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 if type(self) is Checks else h


def test_the_trace_sees_the_model_s_own_class(store: Store) -> None:
    """What is read from the model while it is traced is noted without giving its modules
    another class: a forward that looks at its class traces as it runs."""
    model = Checks()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model.encoder(x) * 2)
    assert "__getattribute__" not in vars(Checks) and "__setattr__" not in vars(Checks)


_A_TRACING, _B_TRACING = threading.Event(), threading.Event()


class TracedFirst(OnTempered):
    """Says it is being traced, then waits a while for the other model's trace."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _A_TRACING.set()
        _B_TRACING.wait(1.0)
        return self.encoder(x)


class TracedSecond(OnTempered):
    """Says it is being traced, then lets the other model's trace end first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _B_TRACING.set()
        time.sleep(0.5)
        return self.encoder(x)


def test_models_wrapped_on_two_threads_at_once_leave_their_classes_as_they_were() -> None:
    """Two models sharing a class, wrapped on two threads at once, are traced one after
    the other: neither puts back over the class what the other's trace put there."""
    _A_TRACING.clear()
    _B_TRACING.clear()
    first = threading.Thread(target=lambda: smt.wrap(TracedFirst(), frozen=["encoder"]))
    first.start()
    assert _A_TRACING.wait(30)
    smt.wrap(TracedSecond(), frozen=["encoder"])
    first.join()
    for kind in (Tempered, TracedFirst, TracedSecond, nn.Linear):
        assert "__getattribute__" not in vars(kind) and "__setattr__" not in vars(kind)


def test_only_torch_s_own_folder_is_torch_s_code() -> None:
    """What torch's own code reads of a module while it is traced is not the forward's; a
    package installed beside torch whose name begins as torch's (torchvision, torchaudio)
    is a model's code, and what it reads is watched."""
    beside = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    assert in_torch(os.path.abspath(nn.modules.linear.__file__))
    assert not in_torch(os.path.join(beside, "torchvision", "models", "resnet.py"))
    assert not in_torch(os.path.join(beside, "torch_geometric", "nn", "conv.py"))


class InitialisesOnce(OnTempered):
    """Sets its shift from the first batch it sees, then never again."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(4))
        self.initialized = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if not self.initialized:
            self.shift.copy_(h.mean(0))
            self.initialized = True
        return h - self.shift


class KeepsFeatures(OnTempered):
    """Keeps what its encoder answered on itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.features = self.encoder(x)
        return self.features * 2


@pytest.mark.parametrize(
    ("kind", "named"), [(InitialisesOnce, "initialized"), (KeepsFeatures, "features")]
)
def test_a_forward_that_assigns_to_the_model_is_refused_and_left_as_it_was(
    store: Store, kind: type[nn.Module], named: str
) -> None:
    """fx keeps what a forward does to tensors, not what its Python assigns: the wrapped
    model would never assign it (and the trace would have used up a first-batch
    initialisation), so it is refused, naming the line, and the model is as it was."""
    model = kind()
    before = dict(vars(model))
    with pytest.raises(
        smt.Untraceable, match=f"assigns `{named}` as it runs \\(at .*test_torch_wrap"
    ):
        smt.wrap(model, frozen=["encoder"], store=store)
    assert vars(model).keys() == before.keys()
    assert all(vars(model)[k] is v for k, v in before.items())


class Defaults(OnTempered):
    """Reads a gain it may not have, and a scale its class gives."""

    scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * getattr(self, "gain", 1.0) * self.scale


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: setattr(m, "gain", 3.0), r"`gain` was not set .* is given 3\.0 now"),
        (lambda m: m.register_buffer("gain", torch.tensor(3.0)), r"`gain` was not set"),
        (lambda m: setattr(m, "scale", 5.0), r"`scale` was 2\.0, as the class .* given 5\.0"),
        (lambda m: setattr(type(m), "scale", 7.0), r"`scale` was 2\.0, as the class .* 7\.0 now"),
    ],
    ids=["absent, then set", "absent, then a buffer", "class value shadowed", "class value"],
)
def test_what_the_model_did_not_hold_itself_is_watched_too(
    store: Store, change: Any, named: str
) -> None:
    """A default the forward took for an attribute the model lacked, and a value its class
    gave, are traced into the code as well: given another after `wrap`, the call is
    refused."""
    model = Defaults()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    try:
        with torch.no_grad():
            assert torch.equal(wrapped(x), model(x))
        change(model)
        with pytest.raises(smt.WrapError, match=named):
            wrapped(x)
    finally:
        Defaults.scale = 2.0


class Stepped(OnTempered):
    """Traces into a block of its own, which reads a gain it keeps."""

    def __init__(self, gain: float = 2.0) -> None:
        super().__init__()
        self.block = Settled().block
        self.block.gain = gain  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.encoder(x)) * self.block.gain


@pytest.mark.parametrize("where", ["model", "wrapped"])
def test_a_submodule_traced_into_cannot_be_replaced(store: Store, where: str) -> None:
    """The code of a submodule whose forward was traced into is part of the wrapped
    model's, run with the values it read: replacing the submodule (on the model or on
    the wrapped model) is refused, as a declared one is."""
    model = Stepped()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    other = Stepped(3.0).block
    with pytest.raises(smt.WrapError, match="`block` was traced into"):
        (model if where == "model" else wrapped).block = other
        wrapped(torch.randn(2, 4))


class ReadsFlags(OnTempered):
    """Adds noise while its head trains; scales up while its encoder trains."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.encoder.training:
            h = h * 100
        if self.head.training:
            h = h + 1.0
        return self.head(h)


def test_a_training_flag_the_forward_reads_of_a_part_it_calls_whole_is_kept_right(
    store: Store,
) -> None:
    """The code holds what the forward read of a part's training flag: a frozen encoder,
    in eval whenever it runs, is read so; a layer put in another mode than the model is
    refused, as a part traced into is."""
    torch.manual_seed(0)
    model = ReadsFlags()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    wrapped.train()
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        model.head.eval()
        with pytest.raises(smt.WrapError, match="`head` in eval"):
            wrapped(x)


class Ordered(OnTempered):
    """Sums weighted copies of its encoder's answer, in the order of a dict of weights."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = {"a": 1.0, "b": 0.0}
        self.steps = (4.0,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        first = next(iter(self.weights.values()))
        return h * first + torch.arange(self.steps[0]).sum()


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m, "weights", {"b": 0.0, "a": 1.0}),
        lambda m: setattr(m, "steps", (4,)),
        lambda m: m.weights.__setitem__("a", -0.0) or m.weights.__setitem__("a", 1),
    ],
    ids=["dict reordered", "float to int", "int in place of float"],
)
def test_a_value_equal_but_computing_otherwise_is_another_value(store: Store, change: Any) -> None:
    """Values are the same only when of one type, item by item, in order: a dict
    reordered, `4` for `4.0` compare equal, and compute otherwise."""
    model = Ordered()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    change(model)
    with pytest.raises(smt.WrapError, match="when `wrap` traced"):
        wrapped(torch.randn(2, 4))


def test_a_dict_reordered_is_shown_in_its_order(store: Store) -> None:
    """The refusal of a dict the forward read, reordered in place since, shows it as it
    was and as it is, each in its own order: shown sorted, the two would read alike."""
    model = Ordered()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    model.weights["a"] = model.weights.pop("a")
    with pytest.raises(smt.WrapError) as refused:
        wrapped(torch.randn(2, 4))
    assert "was {'a': 1.0, 'b': 0.0} when" in str(refused.value)
    assert "is {'b': 0.0, 'a': 1.0} now" in str(refused.value)


def test_a_forward_given_to_the_model_itself_is_refused() -> None:
    """fx traces a class's `forward`: one given to the model in its place (as a library
    that wraps it for mixed precision does) would not be what runs."""
    model = Holds()
    model.forward = types.MethodType(lambda self, x: self.head(x), model)  # type: ignore[method-assign]
    with pytest.raises(smt.Untraceable, match="has a `forward` of its own"):
        smt.wrap(model, frozen=["encoder"])


class HandsBack(OnTempered):
    """Returns a buffer, a tensor it keeps and a tensor made from numbers beside its answer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.ones(4))
        self.scale = torch.full((4,), 2.0)
        self.offsets = [0, 1]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.encoder(x), self.shift, self.scale, torch.tensor(self.offsets)


def test_a_forward_returning_what_the_model_holds_is_wrapped(store: Store) -> None:
    """What the forward returns as the model holds it — a buffer, a tensor kept as an
    attribute, a constant — comes back as the plain model's does: the very tensors."""
    model = HandsBack()
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    with torch.no_grad():
        answer, shift, scale, offsets = wrapped(x)
        assert torch.equal(answer, model.encoder(x))
    assert shift is model.shift and scale is model.scale
    assert offsets.tolist() == [0, 1]


def test_a_copied_wrapped_model_watches_its_own_model(store: Store) -> None:
    """A deep copy of a wrapped model watches the copied model: a value the code read,
    changed there, is refused; a tensor attribute replaced there is the one read."""
    x = torch.randn(2, 4)
    originals = [smt.wrap(kind(), frozen=["encoder"], store=store) for kind in (Settled, Scaled)]
    for original in originals:
        smt.freeze(original)
        with torch.no_grad():
            original(x)  # what a call looks at is worked out: the copy works out its own
    settled, scaled = map(copy.deepcopy, originals)
    with torch.no_grad():
        scaled.model.scale = torch.full((4,), 3.0)
        assert torch.equal(scaled(x), scaled.model(x))
        settled.model.temperature = 0.5
        with pytest.raises(smt.WrapError, match=r"`temperature` was 2\.0"):
            settled(x)


class Masked(nn.Module):
    """Takes a mask by name, and a scale only by name."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.linear(x)
        h = h if mask is None else h * mask
        return h if scale is None else h * scale


def test_a_wrapped_module_takes_keyword_arguments(store: Store) -> None:
    """Arguments given by name reach the module: a cached call is keyed by them in the
    order of the signature (by name or by position, one answer), one that has no place in
    that order is refused saying why, and a module frozen only takes any."""
    torch.manual_seed(0)
    module = Masked()
    wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x, mask = torch.randn(3, 4), (torch.rand(3, 4) > 0.5).float()
    with torch.no_grad():
        expected = module(x, mask)
    assert torch.equal(wrapped(x, mask=mask), expected)
    assert torch.equal(wrapped(x, mask), expected)
    assert wrapped.counts["masked"] == {"ran": 1, "kept": 1, "recalled": 1}
    with pytest.raises(TypeError, match="`scale` has no place in that order"):
        wrapped(x, scale=mask)
    with torch.no_grad():  # an argument given as its default is the call without it
        assert torch.equal(wrapped(x, mask=None), module(x))
        assert torch.equal(wrapped(x), module(x))
    assert wrapped.counts["masked"]["recalled"] == 2
    frozen = smt.wrap(Masked(), frozen=True, store=store)
    smt.freeze(frozen)
    assert frozen(x, mask=mask, scale=mask).shape == (3, 4)


class FlagFromConfig(nn.Module):
    """Reads a flag from its config where a call leaves it None, as Hugging Face models
    read `output_hidden_states`."""

    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.linear = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, flag: bool | None = None
    ) -> torch.Tensor:
        flag = flag if flag is not None else self.config.flag
        return self.linear(x) * 2.0 if flag else self.linear(x)


def test_a_flag_handed_to_a_wrapped_module_is_refused_naming_it(store: Store) -> None:
    """A flag handed by name to a module wrapped whole is refused naming it, and saying
    where to set it instead: set on the config, the call is keyed by it."""
    torch.manual_seed(0)
    module = FlagFromConfig()
    wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with pytest.raises(TypeError, match=r"`bool` as argument 2 \(`flag`\).* `model\.config\.flag`"):
        wrapped(x, flag=True)
    module.config.flag = True
    with torch.no_grad():
        assert torch.equal(wrapped(x), module(x, flag=True))


class Attends(Masked):
    """Takes an optional mask, then an optional scale, as attention modules do."""

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return super().forward(x, mask, scale=scale)


def test_a_cached_module_takes_none_for_an_optional_argument(store: Store) -> None:
    """A cached module is handed None for an optional argument before one given (by
    position, or left out before one given by name), and is keyed by which arguments are
    None: where both calls were refused, the second telling to make None a constant of
    the model. The same tensor as a mask or as a scale is another answer."""
    torch.manual_seed(0)
    module = Attends()
    wrapped = smt.wrap(module, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x, s = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        scaled, masked = module(x, None, s), module(x, s)
    assert torch.equal(wrapped(x, None, s), scaled)
    assert torch.equal(wrapped(x, scale=s), scaled)
    assert torch.equal(wrapped(x, s), masked)
    assert torch.equal(wrapped(x, s, None), masked)
    assert wrapped.counts["attends"] == {"ran": 2, "kept": 2, "recalled": 2}


# ------------------------------------------------------------------ train and eval


class Drops(OnTempered):
    """Drops out after the encoder as `self.training` says."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(self.encoder(x), p=0.5, training=self.training)
        return self.head(h)


@pytest.mark.parametrize("wrapped_in", ["train", "eval"])
def test_code_that_reads_the_training_flag_follows_the_mode(store: Store, wrapped_in: str) -> None:
    """What the model's own forward reads of `self.training` follows the mode the wrapped
    model is in, whichever mode it was wrapped in."""
    torch.manual_seed(0)
    model = Drops().train(wrapped_in == "train")
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(64, 4)
    wrapped.eval()
    with torch.no_grad():
        assert torch.equal(wrapped(x), wrapped(x))
        assert torch.allclose(wrapped(x), model(x))
    wrapped.train()
    assert not torch.equal(wrapped(x), wrapped(x))
    assert not wrapped.encoder.training and wrapped.head.training


class Block(nn.Module):
    """Traced into (not a leaf), and reads its own `self.training`."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.linear(x), p=0.5, training=self.training)


class Blocked(OnTempered):
    """An encoder, then a block traced into."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.encoder(x))


def test_the_mode_of_the_modules_traced_into_picks_the_code(store: Store) -> None:
    """The model put in eval directly (not through the wrapper) runs the code traced for
    eval; modules traced into left in different modes are refused, since code traced for
    one mode would run for a part in the other."""
    torch.manual_seed(0)
    model = Blocked().train()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(64, 4)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(wrapped(x), model(x))
    model.train()
    model.block.eval()
    with pytest.raises(smt.WrapError, match=r"different modes \(`the model itself` in train"):
        wrapped(x)


class Normed(nn.Module):
    """A linear layer and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


@pytest.mark.parametrize("cached", [False, True], ids=["frozen", "cached"])
def test_train_leaves_a_wrapped_frozen_module_in_eval(store: Store, cached: bool) -> None:
    """`train()` on a wrapped frozen module, or on a model holding one, leaves every part
    of it in eval: nothing warns, and its statistics stay put."""
    module = Normed()
    holder = nn.ModuleDict({"encoder": smt.wrap(module, frozen=True, cached=cached, store=store)})
    smt.freeze(holder["encoder"])
    before = module.norm.running_mean.clone()
    holder.train()
    assert holder["encoder"].training
    assert not any(part.training for part in module.modules())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        holder["encoder"](torch.randn(8, 4) * 5 + 3)
    assert torch.equal(module.norm.running_mean, before)


def test_a_part_of_a_cached_submodule_put_in_train_mode_warns_when_recalled(store: Store) -> None:
    """A part of a frozen, cached submodule put in train mode directly
    (``model.encoder.norm.train()``) warns at the next call, whose answer is recalled:
    the answer is what the submodule computes in eval, where it is put back."""
    wrapped = _wrapped(store)
    model = wrapped.model
    x = torch.randn(3, 6)
    first = wrapped(x)
    model.encoder.norm.train()
    with pytest.warns(smt.StillChanging, match="`norm`.*train mode"):
        again = wrapped(x)
    assert wrapped.graph.record is not None
    assert wrapped.graph.record.outcome == {"encoder": "recalled"}
    assert torch.equal(again, first)
    assert not model.encoder.norm.training


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "submodule"])
def test_a_part_of_a_cached_module_without_a_store_put_in_train_mode_warns(whole: bool) -> None:
    """Cached with no store to keep answers in, a frozen module is still held in eval: a
    part of it put in train mode directly warns at the next call and is put back, so the
    call answers as it does in eval."""
    module = Normed()
    if whole:
        wrapped = smt.wrap(module, frozen=True, cached=True)
        part = module.norm
    else:
        wrapped = smt.wrap(_model(), frozen=["encoder"], cached=["encoder"])
        part = wrapped.model.encoder.norm
    smt.freeze(wrapped)
    x = torch.randn(8, 4 if whole else 6) * 5 + 3
    first = wrapped(x)
    before = part.running_mean.clone()
    part.train()
    with pytest.warns(smt.StillChanging, match="`norm`.*train mode"):
        again = wrapped(x)
    assert not part.training
    assert torch.equal(part.running_mean, before)
    assert torch.equal(again, first)


@pytest.mark.parametrize("stored", [True, False], ids=["store", "no-store"])
def test_a_part_put_in_place_of_another_is_held_in_eval_without_a_warning(
    store: Store, stored: bool
) -> None:
    """A part put in place of one of a frozen, cached submodule after freezing
    (``model.encoder.norm = nn.BatchNorm1d(5)``, made in train mode) is new weights, not
    a part put in train mode: it is held in eval with the rest at the next call, which
    warned that something had called ``.train()`` on it. Put in train mode directly after,
    it warns as any part does."""
    wrapped = smt.wrap(
        _model(), frozen=["encoder"], cached=["encoder"], store=store if stored else None
    )
    smt.freeze(wrapped)
    model = wrapped.model
    x = torch.randn(3, 6)
    wrapped(x)
    model.encoder.norm = nn.BatchNorm1d(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = wrapped(x)
    assert not model.encoder.norm.training
    assert torch.equal(model.encoder.norm.running_mean, torch.zeros(5))
    with torch.no_grad():
        assert torch.equal(out, model(x))
    model.encoder.norm.train()
    with pytest.warns(smt.StillChanging, match="`norm`.*train mode"):
        wrapped(x)


# ------------------------------------------------------------------ parts replaced after wrap


class Projects(OnTempered):
    """A declared encoder, a weight of its own and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Parameter(torch.randn(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x) @ self.proj)


def _projects(store: Store, seed: int = 0) -> tuple[smt.Wrapped, Projects]:
    torch.manual_seed(seed)
    model = Projects()
    wrapped = _encoder_frozen(model, store)
    return wrapped, model


def test_parts_replaced_after_wrap_are_the_ones_that_run(store: Store) -> None:
    """A part replaced on the wrapped model — assigned, or loaded with `assign=True` — or
    on the model itself is the one that runs, and the two models hold the same parts."""
    wrapped, model = _projects(store)
    x = torch.randn(3, 4)
    wrapped(x)
    wrapped.head = nn.Linear(4, 2)
    assert model.head is wrapped.head
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    other = _projects(store, seed=1)[1]
    wrapped.load_state_dict(other.state_dict(), assign=True)
    with torch.no_grad():
        assert torch.allclose(wrapped(x), other(x))
    model.proj = nn.Parameter(torch.eye(4))
    with torch.no_grad():
        assert torch.allclose(wrapped(x), model(x))
        wrapped.double()
        assert torch.allclose(wrapped(x.double()), model(x.double()))


class Shared(nn.Module):
    """Calls one frozen encoder and one layer each under two names, and reads a weight
    its head shares with the layer under the head's name."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.again = self.encoder
        self.mid = nn.Linear(4, 4)
        self.mid_again = self.mid
        self.head = nn.Linear(4, 4)
        self.head.weight = self.mid.weight

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.encoder(x)) + self.mid_again(self.again(y))
        return h @ self.head.weight.T


@pytest.mark.parametrize("name", ["again", "mid_again", "head"])
def test_a_part_held_under_two_names_given_two_parts_is_refused(store: Store, name: str) -> None:
    """fx calls (or reads) a part the model holds under two names by one of them wherever
    the forward uses it: one of the names given another part after `wrap` went on running
    the part it held, where the model runs the new one. Given apart, on the wrapped model
    or on the model, the forward is traced again, and the wrapped model answers as the
    model does (a layer, a weight the head shares); where the declared encoder was
    called under both, it calls it otherwise, which one graph cannot describe: refused at
    the next forward until the names hold one part again. The same part under both runs
    as the model does."""
    torch.manual_seed(0)
    model = Shared()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    was = getattr(model, name)
    for holder in (wrapped, model):
        setattr(holder, name, nn.Linear(4, 4))
        assert getattr(model, name) is getattr(wrapped, name)
        if name == "again":
            with pytest.raises(smt.WrapError, match="held the same part when `wrap` traced"):
                wrapped(x, y)
        else:
            with torch.no_grad():
                assert torch.equal(wrapped(x, y), model(x, y))
    setattr(model, name, was)
    with torch.no_grad():
        assert torch.equal(wrapped(x, y), model(x, y))
    model.mid = model.mid_again = nn.Linear(4, 4)
    model.head.weight = model.mid.weight
    with torch.no_grad():
        assert torch.equal(wrapped(x, y), model(x, y))


class Handled(nn.Module):
    """Keeps a second name for the first of its layers, a handle its forward never calls
    by: registered after the layers (``handle_first=False``) or before them, where fx
    calls the layer by the handle's name."""

    def __init__(self, handle_first: bool) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        if handle_first:
            self.first = nn.Linear(4, 4)
            self.layers = nn.Sequential(self.first, nn.ReLU(), nn.Linear(4, 2))
        else:
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            self.first = self.layers[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.encoder(x))


@pytest.mark.parametrize("handle_first", [False, True], ids=["handle-after", "handle-before"])
def test_a_layer_replaced_under_one_of_its_two_names_is_the_one_that_runs(
    store: Store, handle_first: bool
) -> None:
    """A layer the model holds under a second name its forward never calls it by
    (``self.first = self.layers[0]``), replaced under the name the forward calls
    (``model.layers[0] = nn.Linear(4, 4)``), on the model or on the wrapped model, is
    the one that runs, and so is the one that then replaces the handle, or the layer once
    the handle is removed: the names apart, the forward is traced again, which calls each
    part by its own name."""
    torch.manual_seed(0)
    model = Handled(handle_first)
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    wrapped(x)
    model.layers[0] = nn.Linear(4, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    wrapped.layers[0] = nn.Linear(4, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    model.first = nn.Linear(4, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    model.first = model.layers[0]
    model.layers[0] = nn.Linear(4, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    model.first = model.layers[0]
    del model.first
    model.layers[0] = nn.Linear(4, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 5}


class Stacked(OnTempered):
    """Runs the layers its containers hold: a list, a sequence and a dict of them, and a
    block of its own that goes through its children."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4)])
        self.seq = nn.Sequential(nn.Linear(4, 4))
        self.blocks = nn.ModuleDict({"first": nn.Linear(4, 4)})
        self.chain = Chained()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        for layer in self.layers:
            h = layer(h)
        for name in self.blocks:
            h = self.blocks[name](h)
        return self.chain(self.seq(h))


class Chained(nn.Module):
    """Runs its children in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for child in self.children():
            x = child(x)
        return x


def _encoder_cached(kind: Callable[[], M], store: Store) -> tuple[smt.Wrapped, M]:
    """A model made by ``kind`` (seeded) wrapped with its encoder frozen and cached, and
    the model."""
    torch.manual_seed(0)
    model = kind()
    return _encoder_frozen(model, store), model


def _answers_as_the_model(kind: Callable[[], nn.Module], store: Store) -> None:
    """A model made by ``kind`` (seeded), wrapped with its encoder frozen and cached,
    answers a batch as the model itself does."""
    wrapped, model = _encoder_cached(kind, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))


def _refused_as_untraceable(kind: Callable[[], nn.Module], named: str, store: Store) -> None:
    """Wrapping a model made by ``kind`` (seeded), its encoder frozen and cached, is refused
    as untraceable, saying ``named``."""
    torch.manual_seed(0)
    with pytest.raises(smt.Untraceable, match=named):
        smt.wrap(kind(), frozen=["encoder"], cached=["encoder"], store=store)


@pytest.mark.parametrize(
    ("grow", "named"),
    [
        (lambda m: m.layers.append(nn.Linear(4, 4)), "layers"),
        (lambda m: m.seq.append(nn.ReLU()), "seq"),
        (lambda m: m.blocks.__setitem__("second", nn.Linear(4, 4)), "blocks"),
        (lambda m: m.layers.__delitem__(0), "layers"),
        (lambda m: setattr(m, "layers", nn.ModuleList([nn.Linear(4, 4)] * 2)), "layers"),
        (lambda m: setattr(m.chain, "b", nn.Linear(4, 4)), "chain"),
    ],
    ids=["list appended", "sequence appended", "dict added to", "removed", "replaced", "child"],
)
def test_a_container_the_forward_ran_through_changed_after_wrap_is_refused(
    store: Store, grow: Any, named: str
) -> None:
    """fx unrolls a loop over a container as it traces: a layer added to or removed from
    a container the forward went through after `wrap` would not run as the model runs
    it, so the next call is refused, naming the container; a layer replaced in place is
    the one that runs."""
    wrapped, model = _encoder_cached(Stacked, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        model.layers[0] = nn.Linear(4, 4)
        assert torch.equal(wrapped(x), model(x))
        wrapped.extra = nn.Linear(4, 4)  # the model's forward never reads it
        assert torch.equal(wrapped(x), model(x))
        grow(model)
        with pytest.raises(smt.WrapError, match=f"`{named}` held .*Wrap the model again"):
            wrapped(x)


def test_a_layer_replaced_after_a_container_was_grown_and_cut_back_is_the_one_that_runs(
    store: Store,
) -> None:
    """Removing a layer from a `ModuleList` makes it a table of children anew: a layer
    appended, then removed — refused in between — and another put in place of the first
    is the one that runs, as it does in the model."""
    wrapped, model = _encoder_cached(Stacked, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        model.layers.append(nn.Linear(4, 4))
        with pytest.raises(smt.WrapError, match="`layers` held"):
            wrapped(x)
        del model.layers[1]
        model.layers[0] = nn.Linear(4, 4)
        assert torch.equal(wrapped(x), model(x))


def _zeroed(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 0


@pytest.mark.parametrize(
    ("hook", "named"),
    [
        (lambda m: m.register_forward_hook(_zeroed), r"the model has forward hooks"),
        (lambda m: m.chain.register_forward_hook(_zeroed), r"`chain` has forward hooks"),
        (lambda m: m.seq.register_forward_pre_hook(lambda mod, a: a), r"`seq` has forward"),
        (lambda m: setattr(m.chain, "forward", lambda x: x), r"`chain` has a `forward` of"),
    ],
    ids=["model", "block traced into", "pre-hook", "forward given"],
)
def test_hooks_or_a_forward_given_to_what_was_traced_after_wrap_are_refused(
    store: Store, hook: Any, named: str
) -> None:
    """fx calls the forward of the model and of what it traces into itself, without their
    hooks: a hook registered on either after `wrap`, or a `forward` given to a block
    traced into, would not run, so the next call is refused; a hook on a layer called
    whole runs as it does in the model."""
    wrapped, model = _encoder_cached(Stacked, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        model.layers[0].register_forward_hook(_zeroed)
        assert torch.equal(wrapped(x), model(x))
        hook(model)
        with pytest.raises(smt.WrapError, match=named + ".*Wrap the model again"):
            wrapped(x)


def test_hooks_on_the_model_itself_are_refused_at_wrap(store: Store) -> None:
    """The wrapped model runs the model's forward without the model's own hooks: `wrap`
    refuses a model that has any, saying to register them on the wrapped model, which
    runs them; hooks on a block traced into are traced with its forward."""
    torch.manual_seed(0)
    model = Stacked()
    handle = model.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    with pytest.raises(smt.WrapError, match=r"forward pre-hooks.*wrapped\.register_forward"):
        smt.wrap(model, frozen=["encoder"], store=store)
    handle.remove()
    model.chain.register_forward_hook(_zeroed)
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    wrapped.register_forward_hook(_zeroed)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x) * 0)


class Optional(OnTempered):
    """Takes an optional scale and a keyword-only optional shift, branches on whether each
    was given, and on its mode; when no scale is given, scales by a plain value of its
    own."""

    def __init__(self) -> None:
        super().__init__()
        self.fallback = 3.0

    def forward(
        self,
        x: torch.Tensor,
        scale: torch.Tensor | None = None,
        *,
        shift: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.encoder(x)
        h = h * (self.fallback if scale is None else scale)
        if shift is not None:
            h = h + shift
        return h * 2 if self.training else h


class Clamped(OnTempered):
    """Takes a floor that defaults to a number, and a mask it must be handed, either of
    which may be None."""

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, floor: float | None = 0.0
    ) -> torch.Tensor:
        h = self.encoder(x)
        if floor is not None:
            h = h.clamp(min=floor)
        return h if mask is None else h * mask


def test_an_argument_given_none_whose_default_is_not_none_runs_code_traced_with_it_none(
    store: Store,
) -> None:
    """A call that gives None for an argument that defaults to something else, or has no
    default, runs code traced with it None, as one left to a default of None does."""
    wrapped, model = _encoder_cached(Clamped, store)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(wrapped(x, mask), model(x, mask))
            assert torch.equal(wrapped(x, mask, None), model(x, mask, None))
            assert torch.equal(wrapped(x, None, floor=None), model(x, None, floor=None))
            assert torch.equal(wrapped(x, mask=None, floor=0.5), model(x, None, 0.5))
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 7}


class PositionalOnly(OnTempered):
    """Takes its input and an optional mask by place only."""

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, /, shift: float = 0.0
    ) -> torch.Tensor:
        h = self.encoder(x) + shift
        return h if mask is None else h * mask


def test_a_forward_taking_arguments_by_place_only_is_wrapped(store: Store) -> None:
    """A forward whose arguments are positional-only is wrapped, with its signature, and
    runs calls that give its optional mask or leave it None as the model does."""
    wrapped, model = _encoder_cached(PositionalOnly, store)
    assert inspect.signature(wrapped.forward) == inspect.signature(model.forward)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, mask, shift=1.0), model(x, mask, shift=1.0))
        assert torch.equal(wrapped(x, None, 2.0), model(x, None, 2.0))


def test_a_call_leaving_optional_arguments_none_runs_code_traced_with_them_none(
    store: Store,
) -> None:
    """fx traces each argument of the forward as an input, so what the forward does for
    `None` is not in the code `wrap` traced: a call that leaves optional arguments None
    (left out, or given so, by place or by name) runs code traced with those None, in
    either mode, and the declared encoder stays one cached node in all of them."""
    wrapped, model = _encoder_cached(Optional, store)
    x, scale, shift = torch.randn(3, 4), torch.full((3, 4), 2.0), torch.full((4,), 0.5)
    calls = [
        lambda m: m(x, scale, shift=shift),
        lambda m: m(x),
        lambda m: m(x, None),
        lambda m: m(x, scale=None, shift=None),
        lambda m: m(x, scale),
        lambda m: m(x, shift=shift),
        lambda m: m(x, None, shift=shift),
    ]
    with torch.no_grad():
        for mode in (False, True):
            wrapped.train(mode)
            for call in calls:
                assert torch.equal(call(wrapped), call(model))
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 13}
    assert list(wrapped.graph.nodes()) == ["encoder", "fx_0"]


def test_a_value_the_code_traced_with_an_argument_none_read_is_watched(store: Store) -> None:
    """Code traced for a call that leaves an argument None is traced from the model as it
    is then (a value changed before is read as it is), and what it read is watched from
    then on: changed, the next call is refused, whichever code it runs."""
    wrapped, model = _encoder_cached(Optional, store)
    x, scale = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        assert torch.equal(wrapped(x, scale), model(x, scale))
        model.fallback = 5.0  # read by no code traced yet
        assert torch.equal(wrapped(x), model(x))
        model.fallback = 7.0
        for call in (lambda: wrapped(x), lambda: wrapped(x, scale)):
            with pytest.raises(smt.WrapError, match=r"`fallback`"):
                call()


def test_a_wrapped_model_traced_with_arguments_none_is_pickled_and_copied(
    store: Store,
) -> None:
    """A wrapped model whose forward is annotated as strings (`from __future__ import
    annotations`, as here) and that was traced again for a call leaving arguments None is
    pickled (`torch.save` of a model holding it) and copied, and each copy answers as the
    model does, given them or not."""
    wrapped, model = _encoder_cached(Optional, store)
    x, scale = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        wrapped(x)
        held = io.BytesIO()
        torch.save(wrapped, held)
        held.seek(0)
        for copied in (torch.load(held, weights_only=False), copy.deepcopy(wrapped)):
            for call in (lambda m: m(x), lambda m: m(x, scale), lambda m: m(x, shift=scale)):
                assert torch.equal(call(copied), call(model))


_TRACED_WITHOUT_MASK = threading.Event()
_GO_ON = threading.Event()


class HoldsItsTrace(OnTempered):
    """Drops out in train mode; traced with no mask, says so and waits to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.drop(self.encoder(x))
        if mask is None:
            _TRACED_WITHOUT_MASK.set()
            _GO_ON.wait(10)
            return h
        return h * mask


def test_a_call_made_while_another_thread_traces_the_model_waits_for_the_trace(
    store: Store,
) -> None:
    """fx replaces how every module is called while it traces, and the model's modules are
    put in the mode traced: a call made in another thread while a first call leaving an
    argument None traces the model waits for the trace, and answers as the model does,
    rather than being traced into it, or run in the other mode."""
    torch.manual_seed(0)
    model = HoldsItsTrace().eval()
    wrapped = _encoder_frozen(model, store)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    _GO_ON.set()
    with torch.no_grad():
        expected = model(x, mask), model(x)
    _TRACED_WITHOUT_MASK.clear()
    _GO_ON.clear()
    answers: list[Any] = []

    def other() -> None:
        _TRACED_WITHOUT_MASK.wait(10)
        with torch.no_grad():
            try:
                answers.append(wrapped(x, mask))
            except Exception as error:  # what a call taken into the trace raises
                answers.append(error)

    def go_on(calling: threading.Thread) -> None:
        _TRACED_WITHOUT_MASK.wait(10)
        calling.join(1.0)  # returns at once where the call is not held off
        _GO_ON.set()

    calling = threading.Thread(target=other)
    releasing = threading.Thread(target=go_on, args=(calling,))
    calling.start()
    releasing.start()
    try:
        with torch.no_grad():
            traced = wrapped(x)
    finally:
        _GO_ON.set()
        calling.join()
        releasing.join()
    assert torch.equal(traced, expected[1])
    assert len(answers) == 1 and isinstance(answers[0], torch.Tensor), answers
    assert torch.equal(answers[0], expected[0])


_SCALES_TRACED = threading.Event()
_SCALES_GO_ON = threading.Event()


class HoldsAScale(OnTempered):
    """Scales by a tensor it keeps as a plain attribute; traced with no mask, says so and
    waits to go on."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.full((4,), 2.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x) * self.scale
        if mask is None:
            _SCALES_TRACED.set()
            _SCALES_GO_ON.wait(10)
            return h
        return h * mask


def test_the_model_called_in_another_thread_while_it_is_traced_runs_as_ever(
    store: Store,
) -> None:
    """While a model is traced, what is read from and assigned to its modules is noted in
    the tracing thread only: the model itself called in another thread meanwhile (not
    through the wrapper, which waits for the trace) reads its own tensors, not the trace's
    stand-ins for them, and answers as it does alone."""
    wrapped, model = _encoder_cached(HoldsAScale, store)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    _SCALES_GO_ON.set()
    with torch.no_grad():
        expected = model(x, mask)
    _SCALES_TRACED.clear()
    _SCALES_GO_ON.clear()
    answers: list[Any] = []

    def call_the_model() -> None:
        _SCALES_TRACED.wait(10)
        with torch.no_grad():
            try:
                answers.append(model(x, mask))
            except Exception as error:  # what a read taken into the trace raises
                answers.append(error)
        _SCALES_GO_ON.set()

    calling = threading.Thread(target=call_the_model)
    calling.start()
    try:
        with torch.no_grad():
            traced = wrapped(x)  # traced now, with `mask` None
    finally:
        _SCALES_GO_ON.set()
        calling.join()
    with torch.no_grad():
        assert torch.equal(traced, model(x))
    assert len(answers) == 1 and isinstance(answers[0], torch.Tensor), answers
    assert torch.equal(answers[0], expected)


class Flagged(OnTempered):
    """Doubles its answer when handed a true flag: a branch on an argument's value."""

    def forward(self, x: torch.Tensor, double: bool | None = None) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 if double else h


class FlaggedMasked(nn.Module):
    """Hands its optional mask on to its declared encoder, and branches on a flag's value."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = MaskedEncoder()

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, double: bool | None = None
    ) -> torch.Tensor:
        h = self.encoder(x, mask=mask)
        return h * 2 if double else h


class ExtraWithoutMask(OnTempered):
    """Calls its declared extra layer only when no mask is given."""

    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x)
        return self.extra(h) if mask is None else h * mask


def test_a_declared_call_the_first_trace_could_not_see_is_refused_saying_how_it_traced(
    store: Store,
) -> None:
    """A declared submodule the forward calls only when an argument is None, which the
    trace with every argument given never saw, is refused saying how the forward was
    traced; and where that trace fell back to every optional argument None (a branch on
    a flag's value), a call that gives one the forward hands on to a declared submodule
    hands it on, the submodule's answers cached apart for the call it makes."""
    with pytest.raises(smt.NotCalled, match=r"traced with `mask` given, never calls.*only when"):
        smt.wrap(ExtraWithoutMask(), frozen=["encoder", "extra"], store=store)
    wrapped, model = _encoder_cached(FlaggedMasked, store)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(wrapped(x), model(x))
            assert torch.equal(wrapped(x, mask), model(x, mask))
            assert torch.equal(wrapped(x, mask, True), model(x, mask, True))
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 4}


def test_a_forward_branching_on_an_optional_flag_runs_with_it_given_or_none(
    store: Store,
) -> None:
    """A forward that branches on an optional argument's value cannot be traced with it
    as an input: `wrap` traces it with every optional argument None instead, and calls
    that leave them None run; a call that gives one a plain value runs code traced with it
    fixed at that value; one that gives it a tensor is refused, naming it and the line
    (`WrapError`, as any call handing an argument the forward branches on a tensor)."""
    wrapped, model = _encoder_cached(Flagged, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        with pytest.raises(smt.WrapError, match=r"`double` is a `torch\.Tensor`.*if double"):
            wrapped(x, double=torch.tensor(True))
        for _ in range(2):
            assert torch.equal(wrapped(x), model(x))
            assert torch.equal(wrapped(x, None), model(x))
            assert torch.equal(wrapped(x, double=True), model(x, double=True))
            assert torch.equal(wrapped(x, False), model(x, False))
        with pytest.raises(smt.WrapError, match=r"`double` is a `torch\.Tensor` in this call"):
            wrapped(x, double=torch.tensor(True))
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 7}


_VALUE_TRACES: list[tuple[Any, ...]] = []
"""What each trace of the models below fixed their branched-on arguments at: appended as
the forward's Python runs, which it does only while fx traces it."""


class PoolsByFlag(OnTempered):
    """Pools its encoded rows when `pool` is true, by the `mode` it is handed, and scales by
    a number it only hands on: branches on two arguments' values, which have defaults."""

    def forward(
        self, x: torch.Tensor, pool: bool = True, mode: str = "mean", scale: float = 1.0
    ) -> torch.Tensor:
        _VALUE_TRACES.append(("pooled", pool, mode))
        h = self.encoder(x) * scale
        if not pool:
            return h
        if mode == "max":
            return h.max(dim=0).values
        return h.mean(dim=0)


def test_a_forward_branching_on_an_argument_with_a_default_is_traced_per_value(
    store: Store,
) -> None:
    """A forward that branches on a flag and a string it defaults is wrapped: each call runs
    code traced with them fixed at the values it gives, traced once per set of values and
    reused after, with the cached encoder one node recalled across all of them. A number
    the forward only computes with is traced at each value a call hands it too, once, as
    fx cannot see every use of a plain value; handed a tensor, it is an input, traced once
    for every tensor."""
    wrapped, model = _encoder_cached(PoolsByFlag, store)
    x = torch.randn(3, 4)
    calls = [
        lambda m: m(x),
        lambda m: m(x, False),
        lambda m: m(x, pool=True, mode="max"),
        lambda m: m(x, True, "mean", 2.0),
        lambda m: m(x, mode="max", scale=3.0),
        lambda m: m(x, pool=False, mode="max"),
    ]
    with torch.no_grad():
        for _ in range(2):
            for call in calls:
                assert torch.equal(call(wrapped), call(model))

        def traces_of(scales: list[Any]) -> int:
            """The forward's runs in calls handing each of ``scales``, pooled and not."""
            before = len(_VALUE_TRACES)
            for scale in scales:
                assert torch.equal(wrapped(x, scale=scale), model(x, scale=scale))
                assert torch.equal(wrapped(x, False, scale=scale), model(x, False, scale=scale))
            return len(_VALUE_TRACES) - before

        # The model's own calls, and a trace in both modes per new value, pooled and not.
        assert traces_of([4.0, 5.0, -1.0]) == 6 + 3 * 2 * 2
        assert traces_of([4.0, 5.0, -1.0]) == 6
        # Tensors are an input: traced once, pooled and not, for all of them.
        assert traces_of([torch.tensor(3.0), torch.tensor(6.0)]) == 4 + 2 * 2
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 27}
    assert list(wrapped.graph.nodes()) == ["encoder", "fx_0"]


def test_a_wrapped_model_traced_per_value_is_pickled_and_copied_with_its_traces(
    store: Store,
) -> None:
    """A wrapped model traced for several values of an argument it branches on is pickled
    and copied with those traces: each copy answers as the model does, tracing nothing
    anew for the values traced before."""
    wrapped, model = _encoder_cached(PoolsByFlag, store)
    x = torch.randn(3, 4)
    calls = [lambda m: m(x), lambda m: m(x, False), lambda m: m(x, mode="max")]
    with torch.no_grad():
        for call in calls:
            call(wrapped)
        held = io.BytesIO()
        torch.save(wrapped, held)
        held.seek(0)
        for copied in (torch.load(held, weights_only=False), copy.deepcopy(wrapped)):
            for call in calls:
                traced = len(_VALUE_TRACES)
                assert torch.equal(call(copied), call(model))
                assert len(_VALUE_TRACES) == traced + 1  # the model's own call only


class Repeated(OnTempered):
    """Negates or doubles for a flag, and adds its answer to itself `times - 1` times for a
    count: `True` and `1` are equal, and answer apart."""

    def forward(self, x: torch.Tensor, times: int | bool = 1) -> torch.Tensor:
        h = self.encoder(x)
        if isinstance(times, bool):
            return h * 2 if times else -h
        for _ in range(times - 1):
            h = h + h
        return h


class Thresholded(OnTempered):
    """Keeps what is over a threshold it branches on."""

    def forward(self, x: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
        _VALUE_TRACES.append(("thresholded", floor))
        h = self.encoder(x)
        if floor > 0 or math.copysign(1.0, floor) < 0:
            return h.clamp(min=floor)
        return h


def test_values_equal_in_python_but_of_another_kind_or_sign_are_traced_apart(
    store: Store,
) -> None:
    """`True` and `1`, `False` and `0`, `0.0` and `-0.0` are equal (and hash alike), and
    a forward may answer them apart: each is traced for itself; a NaN is one value."""
    wrapped, model = _encoder_cached(Repeated, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            for times in (1, True, 0, False, 3, 1):
                assert torch.equal(wrapped(x, times), model(x, times))
    wrapped, model = _encoder_cached(Thresholded, store)
    with torch.no_grad():
        for floor in (0.0, -0.0, 0.5, -0.0, 0.0):
            assert torch.equal(wrapped(x, floor), model(x, floor))
        wrapped(x, math.nan)
        traced = len(_VALUE_TRACES)
        assert torch.equal(wrapped(x, float("nan")), model(x, math.nan))
        assert len(_VALUE_TRACES) == traced + 1  # the model's own call only


class ScalesUnlessTrue(OnTempered):
    """Scales by 2.5 when handed `True` itself, and by what it is handed otherwise: fx
    answers `is` for its stand-in without a branch it notices, and the code it traces
    uses the argument beside."""

    def forward(self, x: torch.Tensor, flag: bool | int = True) -> torch.Tensor:
        h = self.encoder(x)
        if flag is True:
            return h * 2.5
        return h * flag


class HundredfoldForAnInt(OnTempered):
    """Scales by a hundred when handed an int, by the number it is handed otherwise, and
    not at all without one."""

    def forward(self, x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        h = self.encoder(x)
        if scale is None:
            return h
        if type(scale) is int:
            return h * 100
        return h * scale


class TriplesForAFlag(OnTempered):
    """Triples when handed a flag, and scales by the count it is handed otherwise."""

    def forward(self, x: torch.Tensor, n: Any = 1) -> torch.Tensor:
        h = self.encoder(x)
        return h * 3 if type(n) is bool else h * n


class ScalesByATensorMask(OnTempered):
    """Scales by its mask when it is a tensor, by asking its type."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        if type(mask) is torch.Tensor:
            return h * mask
        return h


class ScalesByATensorMaskAskingItsClass(OnTempered):
    """Scales by its mask when it is a tensor, by asking its class."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        if mask.__class__ is torch.Tensor:
            return h * mask
        return h


class ScalesByATensorMaskAskingItsClassName(OnTempered):
    """Scales by its mask when its class is named a tensor's."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        return h * mask if mask.__class__.__name__ == "Tensor" else h


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (ScalesByATensorMaskAskingItsClass, r"mask\.__class__ is torch\.Tensor"),
        (ScalesByATensorMaskAskingItsClassName, r"mask\.__class__\.__name__ == "),
    ],
    ids=["class", "class name"],
)
def test_a_forward_comparing_the_class_of_what_fx_stands_in_for_is_refused_naming_it(
    store: Store, kind: Callable[[], nn.Module], line: str
) -> None:
    """`mask.__class__` of the stand-in fx hands for an argument a call gives a tensor is
    the stand-in's class, as `type(mask)` is: that call is refused naming the argument and
    the line, rather than answered by the branch for a value that is no tensor."""
    wrapped, model = _encoder_cached(kind, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, 2.0), model(x, 2.0))
        with pytest.raises(smt.WrapError, match=rf"`mask` is a `torch\.Tensor`.*{line}"):
            wrapped(x, torch.full((3, 4), 2.0))


class ScalesForItsDtype(OnTempered):
    """Scales by ten when its input is in float32, asking its dtype by identity."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        if mask is not None and mask.dtype is torch.float32:
            return h * 10
        return h


def test_an_attribute_of_what_fx_stands_in_for_compared_by_identity_is_refused(
    store: Store,
) -> None:
    """`mask.dtype is torch.float32` asked of the stand-in fx hands the forward for an
    argument a call gives a tensor is asked of the stand-in's attribute, another stand-in,
    and answered no whatever the call gives: that call is refused naming the argument and
    the line, rather than answered by the branch for another dtype."""
    wrapped, model = _encoder_cached(ScalesForItsDtype, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        with pytest.raises(smt.WrapError, match=r"`mask` is a `torch\.Tensor`.*mask\.dtype is"):
            wrapped(x, torch.ones(3, 4))


class _Kind(enum.Enum):
    """What a mask is made for."""

    CAUSAL = 1
    FULL = 2


class KeepsAMaskOfItsKind(OnTempered):
    """Multiplies by ones made like its input, of bool for its kind, which it compares by
    identity among the arguments of the call making them, after an attribute of the
    input."""

    def __init__(self) -> None:
        super().__init__()
        self.kind = _Kind.CAUSAL

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        keep = torch.ones(
            x.shape, device=x.device, dtype=torch.bool if self.kind is _Kind.CAUSAL else x.dtype
        )
        return h * keep


class KeepsAMaskOfItsKindLikeItsGain(KeepsAMaskOfItsKind):
    """The same, the ones made like a parameter it keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) * self.gain
        keep = torch.ones(
            self.gain.shape,
            device=self.gain.device,
            dtype=torch.bool if self.kind is _Kind.CAUSAL else x.dtype,
        )
        return h * keep


@pytest.mark.parametrize(
    "kind", [KeepsAMaskOfItsKind, KeepsAMaskOfItsKindLikeItsGain], ids=["input", "parameter"]
)
def test_an_identity_comparison_beside_an_attribute_of_what_fx_stands_in_for_is_traced(
    store: Store, kind: Callable[[], nn.Module]
) -> None:
    """`x.device` (or `self.gain.device`) handed to a call whose next argument compares
    another value by identity (`self.kind is _Kind.CAUSAL`) compares no attribute of the
    tensor: the model is traced, and answers as the model does."""
    _answers_as_the_model(kind, store)


class ScalesForItsWeightDtype(OnTempered):
    """Scales by ten when a parameter of its own is in float32, asking its dtype by
    identity."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if self.gain.dtype is torch.float32 else h


class ShiftsForItsBufferDevice(nn.Module):
    """Shifts when the buffer it keeps is on the CPU, asking in a method of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.ones(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._shifted(h)

    def _shifted(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.shift if self.shift.device.type is _CPU else h


_CPU = "cpu"


class ShiftsInABlock(OnTempered):
    """Calls a block fx traces into after its encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.block = ShiftsForItsBufferDevice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.encoder(x))


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (ScalesForItsWeightDtype, r"`gain`.*self\.gain\.dtype is torch\.float32"),
        (ShiftsInABlock, r"`block\.shift`.*self\.shift\.device\.type is _CPU"),
    ],
    ids=["parameter", "buffer in a block"],
)
def test_an_attribute_of_a_tensor_of_the_model_compared_by_identity_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx stands in for a parameter or buffer the forward reads, and for its attributes:
    `self.gain.dtype is torch.float32` is answered no whatever the tensor holds, and the
    branch kept would be the other one in every call. `wrap` refuses it, naming the tensor
    and the line, in the forward or in code it runs of a block traced into."""
    _refused_as_untraceable(kind, named, store)


class DoublesWhatItEncodedInAMethod(OnTempered):
    """Doubles what its encoder answers when that is a tensor, asking its type in a method
    of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._doubled(self.encoder(x))

    def _doubled(self, h: Any) -> Any:
        return h * 2 if type(h) is torch.Tensor else h + 100


def test_the_type_of_a_value_made_as_the_forward_is_traced_asked_in_a_method_is_refused(
    store: Store,
) -> None:
    """fx hands a method the forward calls a stand-in for a value made of the inputs (what
    a declared encoder answers), and `type(h) is torch.Tensor` asked of it is the
    stand-in's type: the branch kept would be the one for a value that is no tensor in
    every call. `wrap` refuses it, naming the line."""
    torch.manual_seed(0)
    with pytest.raises(smt.Untraceable, match=r"type\(h\) is torch\.Tensor"):
        smt.wrap(
            DoublesWhatItEncodedInAMethod(), frozen=["encoder"], cached=["encoder"], store=store
        )


class EncodesTwice(nn.Module):
    """Answers its encoding and the encoding doubled, as a pair."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.linear(x)
        return h, h * 2


class KeepsTheFirstIfAPair(nn.Module):
    """Keeps the first of what its encoder answers when that is a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = EncodesTwice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.encoder(x)
        if isinstance(out, tuple):
            out = out[0]
        return out


class KeepsAnItemIfAPair(KeepsTheFirstIfAPair):
    """The same, of an item of what its encoder answers, asked of lists and tuples."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.encoder(x)[1]
        return out[0] if isinstance(out, (list, tuple)) else out


class KeepsTheLSTMOutputIfAPair(nn.Module):
    """Keeps the output of an LSTM, a layer fx does not trace into, when it answers a
    tuple; its encoder declared beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.lstm = nn.LSTM(4, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lstm(self.encoder(x))
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (KeepsTheFirstIfAPair, "encoder"),
        (KeepsAnItemIfAPair, "encoder"),
        (KeepsTheLSTMOutputIfAPair, "lstm"),
    ],
    ids=["declared", "an item", "a layer"],
)
def test_asking_what_kind_of_value_a_module_answers_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx stands in for what a module answers, and `isinstance(out, tuple)` asked of the
    stand-in is no whatever the module hands back: the wrapped model would keep the branch
    for a value that is no tuple and answer the pair itself where the model answers its
    first tensor. `wrap` refuses it, naming the module and the line."""
    _refused_as_untraceable(kind, rf"isinstance\(out.*the answer of `{named}`", store)


class SumsWhatItEncoded(KeepsTheFirstIfAPair):
    """Sums the pair its encoder answers, iterating over it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.encoder(x))


class JoinsWhatItEncoded(KeepsTheFirstIfAPair):
    """Joins the pair its encoder answers, spread into a list."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([*self.encoder(x)])


class SumsHalvesOfWhatItEncoded(KeepsTheFirstIfAPair):
    """Sums the halves of the first of what its encoder answers, iterating over them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(self.encoder(x)[0].chunk(2, -1))


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (SumsWhatItEncoded, "what `encoder` answers"),
        (JoinsWhatItEncoded, "what `encoder` answers"),
        (SumsHalvesOfWhatItEncoded, "a value made of what `encoder` answers"),
    ],
    ids=["sum", "spread", "made of it"],
)
def test_iterating_over_what_a_module_answers_is_refused_naming_the_module(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx cannot iterate over what a declared submodule answers, or a value made of it, not
    knowing its length: the refusal names the submodule and says to take its items by
    index or unpack them, not that the forward branches on the value of the tensor it
    handed the submodule (a default for it would lift nothing)."""
    torch.manual_seed(0)
    with pytest.raises(smt.Untraceable, match=rf"iterates over {named}, whose") as refused:
        smt.wrap(kind(), frozen=["encoder"], cached=["encoder"], store=store)
    assert "a, b = self.encoder(x)" in str(refused.value)
    assert "branches on the value of `x`" not in str(refused.value)


class HalvesIfChunked(KeepsTheFirstIfAPair):
    """Keeps the first half of its encoding when `torch.chunk` hands back a tuple."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)[0]
        parts = torch.chunk(h, 2, dim=-1)
        return parts[0] * 2 if isinstance(parts, tuple) else h


class KeepsTheMaximumIfATuple(KeepsTheFirstIfAPair):
    """Keeps the values of `torch.max` over a dimension when it hands back a tuple."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)[0]
        found = h.max(dim=-1)
        return found[0] if isinstance(found, tuple) else h


class TriplesIfASize(KeepsTheFirstIfAPair):
    """Triples its encoding when its width, read with `size`, is an int."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)[0]
        return h * 3 if isinstance(h.size(-1), int) else h


class KeepsTheFirstOfTwiceIfAPair(KeepsTheFirstIfAPair):
    """Keeps the first item of what its encoder answers, doubled, when that is a tuple."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        twice = self.encoder(x) * 2
        return twice[0] if isinstance(twice, tuple) else twice


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (HalvesIfChunked, "`torch.chunk`"),
        (KeepsTheMaximumIfATuple, r"`\.max\(\)`"),
        (TriplesIfASize, r"`\.size\(\)`"),
        (KeepsTheFirstOfTwiceIfAPair, r"`operator\.mul`"),
    ],
    ids=["chunk", "max", "size", "an operator"],
)
def test_asking_what_kind_of_value_a_torch_function_hands_back_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx stands in for what `torch.chunk` hands back, and `isinstance(parts, tuple)` asked
    of the stand-in is no where the model's own run answers yes: the wrapped model would
    answer the whole encoding where the model answers its first half. `wrap` refuses it,
    naming the function."""
    _refused_as_untraceable(kind, rf"asks of what {named} hands back what kind", store)


class CallsWhatItEncodedIfCallable(KeepsTheFirstIfAPair):
    """Doubles its encoding unless that can be called, which a tensor cannot."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)[0] + 1
        return h(x) if callable(h) else h * 2


class ScalesItsInputIfCallable(KeepsTheFirstIfAPair):
    """Encodes its input, scaled when that can be called, which a tensor cannot."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x * 3 if callable(x) else x)[0]


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (CallsWhatItEncodedIfCallable, r"callable\(h\)"),
        (ScalesItsInputIfCallable, r"callable\(x\)"),
    ],
    ids=["made", "an input"],
)
def test_asking_whether_a_value_fx_stands_in_for_can_be_called_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx's stand-in for a tensor can be called, and `callable(h)` asked of it is yes where
    the model's own run answers no: the wrapped model would keep the branch for a value
    that can be called in every call. `wrap` refuses it, naming the line."""
    _refused_as_untraceable(kind, rf"{named}.*asks whether a value fx stands in for can be", store)


class AsksOfTensorsOnly(KeepsTheFirstIfAPair):
    """Asks whether values torch makes as tensors are tuples or lists, which none is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x)[0])
        first = torch.chunk(h, 2, dim=-1)[0].float()
        doubled = x * 2
        if isinstance(h, tuple) or isinstance(first, (list, tuple)):
            return h
        return first + doubled[..., :2] if not isinstance(doubled, list) else h


def test_asking_what_kind_of_value_a_tensor_torch_makes_is_is_answered(store: Store) -> None:
    """Where what torch hands back is a tensor in every call (`torch.relu(h)`, an item of
    `torch.chunk(h, 2)`, `x * 2`), fx's no to `isinstance(h, tuple)` is the model's own
    answer too: the model is wrapped, and answers as it does unwrapped."""
    torch.manual_seed(0)
    model = AsksOfTensorsOnly()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))


class DoublesWhatItMakesIfATensor(OnTempered):
    """Doubles a value it makes of what its encoder answers when that is a tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) + 1
        return h * 2 if type(h) is torch.Tensor else h + 100


class DoublesItsInputIfATensor(OnTempered):
    """Doubles a value it makes of its input when that is a tensor, before its encoder."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if type(y) is torch.Tensor:
            return self.encoder(y) * 10
        return self.encoder(y)


class SumsWhatItMakesIfATensor(OnTempered):
    """Keeps the sum of what its encoder answers when that sum, asked at once, is a tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) + 1
        return h.sum(-1) if type(h.sum(-1)) is torch.Tensor else h


class HalvesWhatItMakesIfSplit(OnTempered):
    """Keeps the first half of what its encoder answers when `torch.split`, asked at once,
    hands back a tuple."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) + 1
        return h[..., :2] if type(torch.split(h, 2, dim=-1)) is tuple else h


class AddsAListIfTensors(OnTempered):
    """Hands what its encoder answers and its second input to a method in a list, which
    asks the type of an item."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._added([self.encoder(x), y])

    def _added(self, items: list[Any]) -> Any:
        if type(items[0]) is torch.Tensor:
            return items[0] * 10 + items[1]
        return items[0] + items[1]


class AddsAListItemByItem(OnTempered):
    """The same, asking the type of each item as it goes over them."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out: Any = 0
        for item in [self.encoder(x), y]:
            out = out + (item * 10 if type(item) is torch.Tensor else item)
        return out


class ScalesForItsDtypeByName(OnTempered):
    """Scales by ten when its input is in float64, asking the name of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if "float64" in str(x.dtype) else h


class ScalesForItsDtypeInAnFString(OnTempered):
    """The same, asking an f-string of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if f"{x.dtype}" == "torch.float64" else h


class PicksAHeadByItsDtype(OnTempered):
    """Scales by ten when the name of its dtype, split, ends as float64's does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if str(x.dtype).split(".")[-1] == "float64" else h


class ScalesForItsDtypeInALongerFString(OnTempered):
    """Scales by ten when an f-string of several parts naming its dtype says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if f"dtype={x.dtype}" == "dtype=torch.float64" else h


class ScalesForItsDtypeJoined(OnTempered):
    """Scales by ten when text joined to the name of its dtype says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if "dtype " + str(x.dtype) == "dtype torch.float64" else h


class ScalesForItsDtypeFormatted(OnTempered):
    """Scales by ten when text formatted of the name of its dtype says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if "{}!".format(str(x.dtype)) == "torch.float64!" else h  # noqa: UP032


class ScalesForItsDtypeByPercent(OnTempered):
    """The same, formatting the name with `%` and a tuple."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if "%s" % (str(x.dtype),) == "torch.float64" else h  # noqa: UP031


class ScalesForItsDtypeJoinedByJoin(OnTempered):
    """The same, joining the name into a list's text kept in a local, asked a line
    later."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        name = "-".join([str(x.dtype), "a"])
        return h * 10 if name in ("torch.float64-a",) else h


class ScalesForItsDtypeTwiceMadeText(OnTempered):
    """The same, making text of the text of its dtype (`str(str(...))`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if str(str(x.dtype)) == "torch.float64" else h


def _dtype_named(x: torch.Tensor) -> str:
    """The name of ``x``'s dtype, joined to a suffix."""
    return "-".join([str(x.dtype), "k"])


class LooksUpAGainByItsDtype(OnTempered):
    """Looks a gain up by text a function of its own makes of its dtype's name."""

    gains: ClassVar[dict[str, float]] = {"torch.float64-k": 10.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.gains.get(_dtype_named(x), 1.0)


class ScalesByAGainItsMethodPicks(OnTempered):
    """Scales by a gain a method of its own picks by text formatted of its dtype's name,
    handed to it by keyword."""

    def _gain(self, name: str) -> float:
        return 10.0 if name == "torch.float64!" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain(name="{}!".format(x.dtype))  # noqa: UP032


def _suffixed(name: str) -> str:
    """``name`` joined to a suffix."""
    return "-".join([name, "k"])


def _gain_named(name: str) -> float:
    """A gain picked by text naming a dtype."""
    return 10.0 if name == "torch.float64-k" else 1.0


class ScalesForItsDtypeSuffixedByAFunction(OnTempered):
    """Scales by ten when the name of its dtype, handed to a function of its own that
    makes more text of it, says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if _suffixed(str(x.dtype)) == "torch.float64-k" else h


class ScalesByAGainPickedByTextHandedOnTwice(OnTempered):
    """Scales by a gain a function of its own picks by text another made of the name of
    its dtype (`_gain_named(_suffixed(f"{x.dtype}"))`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * _gain_named(_suffixed(f"{x.dtype}"))


def _gain_handed_on(name: str) -> float:
    """The gain :func:`_gain_named` picks by ``name``, handed on to it."""
    return _gain_named(name)


class ScalesByAGainPickedByTextAFunctionHandsOn(OnTempered):
    """Scales by a gain a function of its own picks by the name of its dtype, handed it by
    another it is handed to."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * _gain_handed_on("-".join([str(x.dtype), "k"]))


class ScalesByAGainItsMethodHandsOnToAnother(OnTempered):
    """The same, by a method of its own handing it on to another (`self._pick(name)`)."""

    def _gain(self, name: str) -> float:
        return self._pick(name)

    def _pick(self, name: str) -> float:
        return 10.0 if name == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain("-".join([str(x.dtype), "k"]))


def _suffixed_on(name: str) -> str:
    """What :func:`_suffixed` makes of ``name``, handed on to it."""
    return _suffixed(name)


class ScalesForItsDtypeSuffixedByAFunctionHandingItOn(OnTempered):
    """Scales by ten when what a function of its own hands back, which another it hands
    the name of its dtype on to made of it, says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = "-".join([str(x.dtype), "k"])
        return h * 10 if _suffixed_on(name) == "torch.float64-k-k" else h


def _fill_named(names: list[str], x: torch.Tensor) -> None:
    """Puts the name of ``x``'s dtype, joined to a suffix, into ``names``."""
    names.append("-".join([str(x.dtype), "k"]))


def _put_named(names: list[str], name: str) -> None:
    """Puts ``name``, joined to a suffix, into ``names``."""
    names.append("-".join([name, "k"]))


class ScalesForItsDtypeInAListAFunctionFills(OnTempered):
    """Scales by ten when a list a function of its own puts the name of its dtype into
    holds float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names: list[str] = []
        _fill_named(names, x)
        return h * 10 if "torch.float64-k" in names else h


class ScalesForItsDtypeInAListItHandsTheName(OnTempered):
    """The same, the name made here and handed, by keyword, to the function that puts it
    into the list."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names: list[str] = []
        _put_named(names=names, name=str(x.dtype))
        return h * 10 if "torch.float64-k" in names else h


def _add_named(names: list[str], x: torch.Tensor) -> None:
    """The same as :func:`_fill_named`, by `+=`."""
    names += ["-".join([str(x.dtype), "k"])]


def _fill_named_on(names: list[str], x: torch.Tensor) -> None:
    """Hands ``names`` on to :func:`_fill_named`."""
    _fill_named(names, x)


class ScalesForItsDtypeInAListAFunctionAddsTo(OnTempered):
    """Scales by ten when a list a function of its own adds the name of its dtype to
    (`names += [...]`) holds float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names: list[str] = []
        _add_named(names, x)
        return h * 10 if "torch.float64-k" in names else h


class ScalesForItsDtypeInAListFilledTwoCallsDown(OnTempered):
    """The same, the list handed on to the function that puts the name into it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names: list[str] = []
        _fill_named_on(names, x)
        return h * 10 if "torch.float64-k" in names else h


class ScalesForItsDtypeInADict(OnTempered):
    """Scales by ten when a dict holds the name of its dtype as float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        table = {}
        table["dtype"] = "-".join([str(x.dtype), "k"])
        return h * 10 if table["dtype"] == "torch.float64-k" else h


class ScalesForItsDtypeInAListItKeeps(OnTempered):
    """Scales by ten when a list it keeps, which a method of its own puts the name of
    its dtype into, holds float64's."""

    def _note(self, x: torch.Tensor) -> None:
        self.names.append("-".join([str(x.dtype), "k"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        self.names: list[str] = []
        self._note(x)
        return h * 10 if "torch.float64-k" in self.names else h


class ScalesForItsDtypeInAListItKeepsByAMethodHandedIt(OnTempered):
    """The same, the method handed the name of its dtype to put into the list."""

    def _note(self, name: str) -> None:
        self.names.append(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        self.names: list[str] = []
        self._note("-".join([str(x.dtype), "k"]))
        return h * 10 if "torch.float64-k" in self.names else h


class ScalesForItsDtypeFoundInALoop(OnTempered):
    """Scales by ten when a name in a list of them, gone over in a loop, says float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        for name in ["-".join([str(x.dtype), "k"]), "other"]:
            if name == "torch.float64-k":
                return h * 10
        return h


class ScalesForItsDtypeGotOutOfADict(OnTempered):
    """Scales by ten when the name of its dtype, got out of a dict by `get`, says
    float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        table = {"dtype": "-".join([str(x.dtype), "k"])}
        return h * 10 if table.get("dtype") == "torch.float64-k" else h


def _dtype_names(x: torch.Tensor) -> list[str]:
    """A list holding the name of ``x``'s dtype, joined to a suffix."""
    return ["-".join([str(x.dtype), "k"])]


class ScalesForItsDtypeFoundByAGenerator(OnTempered):
    """Scales by ten when any name in a list, compared in a generator expression, says
    float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = ["-".join([str(x.dtype), "k"])]
        return h * 10 if any(n == "torch.float64-k" for n in names) else h


class ScalesUnlessAllItsDtypeNamesDiffer(OnTempered):
    """The same, by `all` of names that differ from float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h if all(n != "torch.float64-k" for n in names) else h * 10


class ScalesForItsDtypeFilteredByAListComprehension(OnTempered):
    """The same, by a list comprehension that keeps float64's name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if [n for n in names if n == "torch.float64-k"] else h


class ScalesForItsDtypeInASetComprehension(OnTempered):
    """The same, looking the name up in a set made by a comprehension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if "torch.float64-k" in {n for n in names} else h


class ScalesForItsDtypeInADictComprehension(OnTempered):
    """The same, in a dict made by a comprehension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if "torch.float64-k" in {n: len(names) for n in names} else h


class ScalesForItsDtypeSortedFromAGenerator(OnTempered):
    """The same, sorting the names a generator expression hands out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if sorted(n for n in names)[0] == "torch.float64-k" else h


class ScalesForItsDtypeTakenByNext(OnTempered):
    """The same, taking the first name out of an iterator over the list."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if next(iter(names)) == "torch.float64-k" else h


class ScalesForItsDtypeComparedInAGenerator(OnTempered):
    """The same, the name of its dtype compared in a generator expression that reads it
    from the forward's locals."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = "-".join([str(x.dtype), "k"])
        return h * 10 if any(n == name for n in ["torch.float64-k"]) else h


def _is_float64(name: str) -> bool:
    """Whether ``name`` is float64's, joined to a suffix."""
    return name == "torch.float64-k"


class ScalesForItsDtypeAFunctionPicksInAGenerator(OnTempered):
    """The same, each name handed to a function of its own that compares it, in a
    generator expression."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if any(_is_float64(n) for n in names) else h


class ScalesForItsDtypeItsMethodPicksInAComprehension(OnTempered):
    """The same, each name handed to a method of its own that compares it, in a list
    comprehension."""

    def _is_float64(self, name: str) -> bool:
        return name == "torch.float64-k"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if [n for n in names if self._is_float64(n)] else h


class ScalesForItsDtypeAFunctionOfAModulePicks(OnTempered):
    """Scales by ten when a function of a module of its own (`wrap_helpers.is_float64`),
    handed the name of its dtype, compares it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if wrap_helpers.is_float64(names[0]) else h


class ScalesForItsDtypeAFunctionOfAModulePicksInAGenerator(OnTempered):
    """The same, each name handed to it in a generator expression."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if any(wrap_helpers.is_float64(n) for n in names) else h


class ScalesForItsDtypeSuffixedInAGenerator(OnTempered):
    """The same, each name handed to a function of its own that makes more text of it,
    compared in a generator expression."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if any(_suffixed(n) == "torch.float64-k-k" for n in names) else h


class ScalesForItsDtypeSuffixedInAComprehension(OnTempered):
    """The same, the names a function of its own makes more text of, in a list
    comprehension, looked up in the list it makes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = _dtype_names(x)
        return h * 10 if "torch.float64-k-k" in [_suffixed(n) for n in names] else h


class ScalesForItsDtypeUpperCased(OnTempered):
    """The same, the name of its dtype upper-cased (`str(x.dtype).upper()`), which is
    let be, then compared."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = str(x.dtype).upper()
        return h * 10 if name == "TORCH.FLOAT64" else h


class ScalesForItsDtypeInAListALoopFills(OnTempered):
    """Scales by ten when a list a loop puts the names of its dtype into, asked after
    it, holds float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        kept = []
        for name in _dtype_names(x):
            kept.append(name)
        return h * 10 if "torch.float64-k" in kept else h


class ScalesByAGainKeyedByItsDtype(OnTempered):
    """Scales by a gain it gets out of a dict keyed by the name of its dtype, by
    float64's name: the dict compares its keys with it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = {"-".join([str(x.dtype), "k"]): 10.0}
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainLookedUpByItsDtype(OnTempered):
    """The same, looked up by `[]`, a missing key answered by a gain of one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = {"-".join([str(x.dtype), "k"]): 10.0}
        try:
            gain = gains["torch.float64-k"]
        except KeyError:
            gain = 1.0
        return h * gain


class ScalesByAGainAComprehensionKeysByItsDtype(OnTempered):
    """The same, got out of a dict a comprehension keys by the names of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = {n: 10.0 for n in _dtype_names(x)}
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainZippedToItsDtype(OnTempered):
    """The same, got out of a dict made of the names of its dtype zipped to gains."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = dict(zip(_dtype_names(x), [10.0], strict=True))
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainUpdatedByItsDtype(OnTempered):
    """The same, got out of a dict `update` puts a dict keyed by the name of its dtype
    into."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains: dict[str, float] = {}
        gains.update({"-".join([str(x.dtype), "k"]): 10.0})
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainSpreadWithItsDtype(OnTempered):
    """The same, the dict spread into one with more gains (`{**gains, name: ...}`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        defaults = {"torch.float16-k": 2.0}
        gains = {**defaults, "-".join([str(x.dtype), "k"]): 10.0}
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainCopiedByKeywords(OnTempered):
    """The same, the dict keyed by the name of its dtype copied by `dict(**...)`, and
    looked up by `[]`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        keyed = {"-".join([str(x.dtype), "k"]): 10.0}
        gains = dict(**keyed)
        try:
            gain = gains["torch.float64-k"]
        except KeyError:
            gain = 1.0
        return h * gain


class ScalesByAGainMadeOfAPair(OnTempered):
    """The same, got out of a dict made of a list of one pair of the name of its dtype
    and a gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = dict([("-".join([str(x.dtype), "k"]), 10.0)])
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainMadeOfPairsALoopAppends(OnTempered):
    """The same, the pairs appended to a list by a loop over the names of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = []
        for name in _dtype_names(x):
            pairs.append((name, 10.0))
        gains = dict(pairs)
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainAnOrderedDictKeysByItsDtype(OnTempered):
    """The same, got out of an `OrderedDict` made of a pair of the name of its dtype and a
    gain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        gains = collections.OrderedDict([("-".join([str(x.dtype), "k"]), 10.0)])
        return h * gains.get("torch.float64-k", 1.0)


class ScalesByAGainADefaultDictKeysByItsDtype(OnTempered):
    """The same, got out of a `defaultdict` of gains made so, by `[]`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = [("-".join([str(x.dtype), "k"]), 10.0)]
        gains = collections.defaultdict(lambda: 1.0, pairs)
        return h * gains["torch.float64-k"]


def _fill_pairs(pairs: list[tuple[str, float]], x: torch.Tensor) -> None:
    """Puts a pair of the name of ``x``'s dtype, joined to a suffix, and a gain into
    ``pairs``."""
    pairs.append(("-".join([str(x.dtype), "k"]), 10.0))


class ScalesByAGainMadeOfPairsAFunctionFills(OnTempered):
    """The same, the pairs put into a list by a function of its own handed it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs: list[tuple[str, float]] = []
        _fill_pairs(pairs, x)
        return h * dict(pairs).get("torch.float64-k", 1.0)


class ScalesByAGainMadeOfAPairTakenByPlace(OnTempered):
    """The same, the pair taken back out of a list of them by place (`pairs[0]`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = [("-".join([str(x.dtype), "k"]), 10.0)]
        return h * dict([pairs[0]]).get("torch.float64-k", 1.0)


class ScalesByAGainMadeOfAPairGoneOverInALoop(OnTempered):
    """The same, each pair gone over in a loop over a list of them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = [("-".join([str(x.dtype), "k"]), 10.0)]
        for pair in pairs:
            h = h * dict([pair]).get("torch.float64-k", 1.0)
        return h


class ScalesByAGainMadeOfAListPair(OnTempered):
    """The same, the pair a list of two (`dict([[name, 10.0]])`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * dict([["-".join([str(x.dtype), "k"]), 10.0]]).get("torch.float64-k", 1.0)


class ScalesByAGainMadeOfAPairHeldInADict(OnTempered):
    """The same, the pair held in a dict by a key of its own (`{0: (name, 10.0)}`) and
    read back out of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        held = {0: ("-".join([str(x.dtype), "k"]), 10.0)}
        return h * dict([held[0]]).get("torch.float64-k", 1.0)


def _first(pairs: list[tuple[str, float]]) -> tuple[str, float] | str:
    """The first of ``pairs``."""
    return pairs[0]


class ScalesForItsDtypeReadOutOfPairsHandedBack(OnTempered):
    """Scales by ten when what a function of its own hands back read by place out of a
    list of pairs of the name of its dtype and a gain starts as float64's name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = [("-".join([str(x.dtype), "k"]), 10.0)]
        first = _first(pairs)
        return h * 10 if isinstance(first, str) and first.startswith("torch.float64") else h


class ScalesForItsDtypeCounted(OnTempered):
    """Scales by ten when a `Counter` of the names of its dtype counts float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        counts = collections.Counter(_dtype_names(x))
        return h * 10 if counts["torch.float64-k"] else h


class ScalesForItsDtypeMatchedByARegex(OnTempered):
    """Scales by ten when a function of a module (`re.match`) finds float64's name in the
    name of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * 10 if re.match(r"torch\.float64", str(x.dtype)) else h


class ScalesByHowManyNamesASetHolds(OnTempered):
    """Scales by how many names a set of float32's name and its dtype's holds: one where
    they are the same, which the set tells by comparing them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * len({"-".join([str(x.dtype), "k"]), "torch.float32-k"})


class ScalesByHowManyNamesASetIsAddedTo(OnTempered):
    """The same, the names added to the set one by one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        seen = {"torch.float32-k"}
        seen.add("-".join([str(x.dtype), "k"]))
        return h * len(seen)


class ScalesByHowManyKeysADictComprehensionMakes(OnTempered):
    """The same, counting the keys of a dict a comprehension keys by the names."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        names = ["-".join([str(x.dtype), "k"]), "torch.float32-k"]
        return h * len({n: 1.0 for n in names})


class ScalesForItsDtypeComparedByAnOperator(OnTempered):
    """Scales by ten when `operator.eq` finds the name of its dtype float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * 10 if operator.eq("-".join([str(x.dtype), "k"]), "torch.float64-k") else h


class ScalesForItsDtypeMatchedByAMappingPattern(OnTempered):
    """Scales by ten when a `match` statement's mapping pattern finds float64's name under
    the key of its dtype's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        match {"dtype": "-".join([str(x.dtype), "k"])}:
            case {"dtype": "torch.float64-k"}:
                return h * 10
        return h


class ScalesForItsDtypeMatchedByEitherOfTwoNames(OnTempered):
    """Scales by ten when a `match` statement finds the name of its dtype to be either of
    float64's names."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        match "-".join([str(x.dtype), "k"]):
            case "torch.float64-k" | "torch.double-k":
                return h * 10
        return h


class ScalesForItsDtypeReadLetterByLetter(OnTempered):
    """Scales by ten when the letters of the name of its dtype, listed, spell float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        letters = list("-".join([str(x.dtype), "k"]))
        return h * 10 if letters == list("torch.float64-k") else h


class ScalesForItsDtypeSubstituted(OnTempered):
    """Scales by ten when the name of its dtype, its suffix taken off by `re.sub`, is
    float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * 10 if re.sub("-k$", "", "-".join([str(x.dtype), "k"])) == "torch.float64" else h


class ScalesForItsDtypeDumped(OnTempered):
    """Scales by ten when the name of its dtype, written as JSON, is float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * 10 if json.dumps("-".join([str(x.dtype), "k"])) == '"torch.float64-k"' else h


class ScalesByAGainMadeOfPairsPoppedOffAList(OnTempered):
    """Scales by a gain looked up in a dict made of a list of pairs of the name of its
    dtype and a gain, popped off a list of such lists."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        rows: list[list[tuple[str, float]]] = [[], [("-".join([str(x.dtype), "k"]), 10.0)]]
        return h * dict(rows.pop()).get("torch.float64-k", 1.0)


class ScalesForItsDtypePoppedFirst(OnTempered):
    """Scales by ten when the first of a list of the name of its dtype and a word, popped
    off it by place, is float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        words = ["-".join([str(x.dtype), "k"]), "input"]
        return h * 10 if words.pop(0) == "torch.float64-k" else h


class ScalesForItsDtypeNotedByUpdate(OnTempered):
    """Scales by ten when the name of its dtype, put into a dict of notes by `update` by
    name, is float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        notes = {"gain": 2.0}
        notes.update(dtype="-".join([str(x.dtype), "k"]))
        return h * 10 if notes["dtype"] == "torch.float64-k" else h


class ScalesForItsDtypeNormalized(OnTempered):
    """Scales by ten when the name of its dtype, put in a normal form by a function of a
    library that nothing tells makes more text (`unicodedata.normalize`), is float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = "-".join([str(x.dtype), "k"])
        return h * 10 if unicodedata.normalize("NFC", name) == "torch.float64-k" else h


class ScalesByAGainALambdaPicks(OnTempered):
    """Scales by a gain a lambda picks by the name of its dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = "-".join([str(x.dtype), "k"])
        return h * (lambda n: 10.0 if n == "torch.float64-k" else 1.0)(name)


class ScalesByAGainLookedUpBySpreadText(OnTempered):
    """Scales by a gain looked up by the name of its dtype spread into the call
    (`gains.get(*[name], 1.0)`)."""

    gains: ClassVar[dict[str, float]] = {"torch.float64-k": 10.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        return h * self.gains.get(*["-".join([str(x.dtype), "k"])], 1.0)


class ScalesByAGainItsMethodPicksBySpreadText(OnTempered):
    """Scales by a gain a method of its own picks by the name of its dtype spread into the
    call (`self._gain(*[name])`)."""

    def _gain(self, name: str) -> float:
        return 10.0 if name == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain(*["-".join([str(x.dtype), "k"])])


class ScalesByAGainItsMethodPicksBySpreadTexts(OnTempered):
    """The same, the name second of the texts spread (`self._gain(*[tag, name])`)."""

    def _gain(self, tag: str, name: str) -> float:
        return 10.0 if name == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain(*["t", "-".join([str(x.dtype), "k"])])


class ScalesByAGainItsMethodPicksOutOfWhatItGathers(OnTempered):
    """Scales by a gain a method of its own picks by the first of the texts it gathers
    (`*names`), handed the name of its dtype."""

    def _gain(self, *names: str) -> float:
        return 10.0 if names[0] == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain("-".join([str(x.dtype), "k"]))


class ScalesByAGainItsMethodPicksOutOfWhatItGathersByName(OnTempered):
    """The same, gathered by name (`**names`)."""

    def _gain(self, **names: str) -> float:
        return 10.0 if names["dtype"] == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain(dtype="-".join([str(x.dtype), "k"]))


class ScalesByAGainItsMethodPicksByName(OnTempered):
    """Scales by a gain a method of its own picks by the name of its dtype, handed by
    name ahead of another (`self._pick(name=..., n=3)`)."""

    def _pick(self, n: int, name: str) -> float:
        return 10.0 if name == "torch.float64-k" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._pick(name="-".join([str(x.dtype), "k"]), n=3)


class ScalesByAGainItsMethodFindsInItsSecondArgument(OnTempered):
    """Scales by a gain a method of its own picks when a list it is handed second holds
    float64's name, the name of its dtype handed first too."""

    def _pick(self, name: str, names: list[str]) -> float:
        return 10.0 if "torch.float64-k" in names else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = "-".join([str(x.dtype), "k"])
        return self.encoder(x.float()) * self._pick(name, [name])


class ScalesByAGainItsMethodIsHandedByTheNameOfItsDtype(OnTempered):
    """Scales by a gain a method of its own is handed by the parameter the name of its
    dtype names (`self._gain(**{name: 10.0})`), which binding compares with its
    parameters'."""

    def _gain(self, **gains: float) -> float:
        return gains.get("torch.float64-k", 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self._gain(**{"-".join([str(x.dtype), "k"]): 10.0})


class ScalesByAGainMadeOfAPairEnumerated(OnTempered):
    """Scales by a gain looked up in a dict made of each pair of the name of its dtype and
    a gain, gone over numbered by `enumerate`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        pairs = [("-".join([str(x.dtype), "k"]), 10.0)]
        for _, pair in enumerate(pairs):
            h = h * dict([pair]).get("torch.float64-k", 1.0)
        return h


class ScalesByAGainMadeOfPairsAComprehensionMakesOfTwoNames(OnTempered):
    """Scales by a gain looked up in a dict made of pairs a list comprehension makes of
    the name of its dtype, which it reads, and of each of a list of it, which it goes
    over: the pairs are keyed by the name it reads, whatever it makes of the other."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        name = "-".join([str(x.dtype), "k"])
        names = [name]
        gains = dict([(name, [10.0, n][0]) for n in names])
        return h * gains.get("torch.float64-k", 1.0)


class ScalesForItsDtypeUnpackedWithTheRest(OnTempered):
    """Scales by ten when the first of a list of the names of its dtype, unpacked with the
    rest (`first, *rest = names`), is float64's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x.float())
        first, *_ = ["-".join([str(x.dtype), "k"])]
        return h * 10 if first == "torch.float64-k" else h


class PutsItsDtypeInMessages(OnTempered):
    """Puts the name of its dtype into messages made by `format`, `%`, `join` and
    `str`, printed and warned of, which is let be, and takes the last word off a list of
    them, which compares none, nor do the comprehension and generator expression it
    prints them by; nor do a dict holding the name by a keyword, a pair read by place or
    more text its methods make of it (`upper`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        notes, pair = dict(dtype=str(x.dtype)), (str(x.dtype), "input")
        print(notes.get("dtype"), pair[0], pair, str(x.dtype).upper(), f"{pair[0].strip()}!")
        words = [str(x.dtype), "input", "!"]
        words.pop()
        message = "-".join(words)
        _fill_named(words, x)
        print(words, [f"{w}!" for w in words], ", ".join(f"<{w}>" for w in words))
        print("{}!".format(x.dtype), "%s" % (x.dtype,), message, str(str(x.dtype)))  # noqa: UP032, UP031
        warnings.warn("{} input of shape {}".format(str(x.dtype), x.shape), stacklevel=1)  # noqa: UP032
        return self.encoder(x) * 2


class _Gains:
    """Picks a gain by text naming a width."""

    def gain_for(self, name: str) -> float:
        return 10.0 if name == "width 4" else 1.0


class _GainsModule(nn.Module):
    """The same, as a module."""

    def gain_for(self, name: str) -> float:
        return 10.0 if name == "width 4" else 1.0


class ScalesByAGainAHelperPicks(OnTempered):
    """Scales by a gain an object it holds picks by text naming its width
    (`self.gains.gain_for`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gains = _Gains()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.gains.gain_for(f"width {x.shape[1]}")


class _Picker:
    """Picks a gain by text naming a dtype, by a method named as a list's."""

    def append(self, name: str) -> float:
        return 10.0 if name == "torch.float64-k" else 1.0


class ScalesByAGainAnObjectPicksByAMethodNamedAsAList(OnTempered):
    """Scales by a gain an object it holds picks by the name of its dtype, by a method
    named as a list's (`self.picker.append`)."""

    def __init__(self) -> None:
        super().__init__()
        self.picker = _Picker()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self.picker.append("-".join([str(x.dtype), "k"]))


class ScalesByAGainPickedAfterManyPrints(OnTempered):
    """Scales by a gain a function of its own picks by the name of its dtype, after
    printing it at more places than a few."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = "-".join([str(x.dtype), "k"])
        print(name, 1, end="")
        print(name, 2, end="")
        print(name, 3, end="")
        print(name, 4, end="")
        print(name, 5, end="")
        print(name, 6, end="")
        print(name, 7, end="")
        print(name, 8, end="")
        print(name, 9, end="")
        print(name, 10, end="")
        print(name, 11, end="")
        print(name, 12, end="")
        print(name, 13, end="")
        print(name, 14, end="")
        print(name, 15, end="")
        print(name, 16, end="")
        return self.encoder(x.float()) * _gain_named(name)


class ScalesByAGainASubmodulePicks(OnTempered):
    """The same, picked by a submodule's method, reached through a container."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({"gains": _GainsModule()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.parts.gains.gain_for(f"width {x.shape[1]}")


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (ScalesForItsDtypeFormatted, r"\"\{\}!\"\.format\(str\(x\.dtype\)\) == .*into text"),
        (ScalesForItsDtypeByPercent, r"\"%s\" % \(str\(x\.dtype\),\) == .*into text"),
        (ScalesForItsDtypeJoinedByJoin, r"\"-\"\.join.*into text.*asked at .*`return h \* 10 if"),
        (ScalesForItsDtypeTwiceMadeText, r"str\(str\(x\.dtype\)\) == .*into text"),
        (LooksUpAGainByItsDtype, r"\"-\"\.join.*into text.*asked at .*self\.gains\.get"),
        (ScalesByAGainItsMethodPicks, r"into text.*asked at .*`return 10\.0 if name =="),
        (ScalesByAGainAHelperPicks, r"into text.*asked at .*`return 10\.0 if name =="),
        (ScalesByAGainASubmodulePicks, r"into text.*asked at .*`return 10\.0 if name =="),
        (
            ScalesByAGainAnObjectPicksByAMethodNamedAsAList,
            r"into text.*asked at .*`return 10\.0 if name ==",
        ),
        (ScalesByAGainPickedAfterManyPrints, r"into text.*asked at .*`return 10\.0 if name =="),
        (ScalesForItsDtypeSuffixedByAFunction, r"into text.*asked at .*`return h \* 10 if _suf"),
        (ScalesByAGainPickedByTextHandedOnTwice, r"into text.*asked at .*`return 10\.0 if name =="),
        (
            ScalesByAGainPickedByTextAFunctionHandsOn,
            r"into text.*asked at .*`return 10\.0 if name ==",
        ),
        (ScalesByAGainItsMethodHandsOnToAnother, r"into text.*asked at .*`return 10\.0 if name =="),
        (
            ScalesForItsDtypeSuffixedByAFunctionHandingItOn,
            r"into text.*asked at .*`return h \* 10 if _suffixed_on\(name\) ==",
        ),
        (ScalesForItsDtypeInAListAFunctionFills, r"into text.*asked at .*`return h \* 10 if \"t"),
        (ScalesForItsDtypeInAListItHandsTheName, r"into text.*asked at .*`return h \* 10 if \"t"),
        (ScalesForItsDtypeInAListAFunctionAddsTo, r"into text.*asked at .*`return h \* 10 if \"t"),
        (ScalesForItsDtypeInAListFilledTwoCallsDown, r"into text.*asked at .*`return h \* 10 if"),
        (ScalesForItsDtypeInADict, r"into text.*asked at .*`return h \* 10 if table"),
        (ScalesForItsDtypeInAListItKeeps, r"into text.*asked at .*`return h \* 10 if \"t"),
        (
            ScalesForItsDtypeInAListItKeepsByAMethodHandedIt,
            r"into text.*asked at .*`return h \* 10 if \"torch\.float64-k\" in self\.names",
        ),
        (ScalesForItsDtypeFoundInALoop, r"into text.*asked at .*`if name == \"torch"),
        (ScalesForItsDtypeGotOutOfADict, r"into text.*asked at .*`return h \* 10 if table"),
        (ScalesForItsDtypeFoundByAGenerator, r"into text.*asked at .*`return h \* 10 if any\(n"),
        (ScalesUnlessAllItsDtypeNamesDiffer, r"into text.*asked at .*`return h if all\(n !="),
        (ScalesForItsDtypeFilteredByAListComprehension, r"into text.*asked at .*if \[n for"),
        (ScalesForItsDtypeInASetComprehension, r"into text.*asked at .*in \{n for n in names\}"),
        (ScalesForItsDtypeInADictComprehension, r"into text.*asked at .*in \{n: len\(names\)"),
        (ScalesForItsDtypeSortedFromAGenerator, r"into text.*asked at .*if sorted\(n for n"),
        (ScalesForItsDtypeTakenByNext, r"into text.*asked at .*if next\(iter\(names\)\) =="),
        (ScalesForItsDtypeComparedInAGenerator, r"into text.*asked at .*any\(n == name for"),
        (
            ScalesForItsDtypeAFunctionPicksInAGenerator,
            r"into text.*asked at .*`return name == \"torch\.float64-k\"`",
        ),
        (
            ScalesForItsDtypeItsMethodPicksInAComprehension,
            r"into text.*asked at .*`return name == \"torch\.float64-k\"`",
        ),
        (
            ScalesForItsDtypeAFunctionOfAModulePicks,
            r"into text.*asked at .*wrap_helpers\.py.*`return name == \"torch\.float64-k\"`",
        ),
        (
            ScalesForItsDtypeAFunctionOfAModulePicksInAGenerator,
            r"into text.*asked at .*wrap_helpers\.py.*`return name == \"torch\.float64-k\"`",
        ),
        (ScalesForItsDtypeSuffixedInAGenerator, r"into text.*asked at .*any\(_suffixed\(n\) =="),
        (
            ScalesForItsDtypeSuffixedInAComprehension,
            r"into text.*asked at .*`return h \* 10 if \"torch\.float64-k-k\" in \[_suffixed",
        ),
        (ScalesForItsDtypeUpperCased, r"into text.*asked at .*`return h \* 10 if name == \"TORCH"),
        (
            ScalesForItsDtypeInAListALoopFills,
            r"into text.*asked at .*if \"torch\.float64-k\" in kept",
        ),
        (ScalesByAGainKeyedByItsDtype, r"into text.*asked at .*`return h \* gains\.get"),
        (ScalesByAGainLookedUpByItsDtype, r"into text.*asked at .*`gain = gains\["),
        (
            ScalesByAGainAComprehensionKeysByItsDtype,
            r"into text.*asked at .*`return h \* gains\.get",
        ),
        (ScalesByAGainZippedToItsDtype, r"into text.*asked at .*`return h \* gains\.get"),
        (ScalesByAGainUpdatedByItsDtype, r"into text.*asked at .*`return h \* gains\.get"),
        (ScalesByAGainSpreadWithItsDtype, r"into text.*asked at .*`return h \* gains\.get"),
        (ScalesByAGainCopiedByKeywords, r"into text.*asked at .*`gain = gains\["),
        (ScalesByAGainMadeOfAPair, r"into text.*asked at .*`return h \* gains\.get"),
        (ScalesByAGainMadeOfPairsALoopAppends, r"into text.*asked at .*`return h \* gains\.get"),
        (
            ScalesByAGainAnOrderedDictKeysByItsDtype,
            r"into text.*asked at .*`return h \* gains\.get",
        ),
        (
            ScalesByAGainADefaultDictKeysByItsDtype,
            r"into text.*asked at .*`return h \* gains\[",
        ),
        (
            ScalesByAGainMadeOfPairsAFunctionFills,
            r"into text.*asked at .*`return h \* dict\(pairs\)\.get",
        ),
        (
            ScalesByAGainMadeOfAPairTakenByPlace,
            r"into text.*asked at .*`return h \* dict\(\[pairs\[0\]\]\)\.get",
        ),
        (
            ScalesByAGainMadeOfAPairGoneOverInALoop,
            r"into text.*asked at .*`h = h \* dict\(\[pair\]\)\.get",
        ),
        (ScalesByAGainMadeOfAListPair, r"into text.*asked at .*`return h \* dict\(\[\[\"-\"\.join"),
        (
            ScalesByAGainMadeOfAPairHeldInADict,
            r"into text.*asked at .*`return h \* dict\(\[held\[0\]\]\)\.get",
        ),
        (
            ScalesForItsDtypeReadOutOfPairsHandedBack,
            r"into text.*asked at .*`return h \* 10 if isinstance\(first, str\) and first\.st",
        ),
        (ScalesForItsDtypeCounted, r"into text.*asked at .*`counts = collections\.Counter\("),
        (ScalesForItsDtypeMatchedByARegex, r"into text.*asked at .*`return h \* 10 if re\.match"),
        (ScalesByHowManyNamesASetHolds, r"into text.*asked at .*`return h \* len\(\{"),
        (ScalesByHowManyNamesASetIsAddedTo, r"into text.*asked at .*`return h \* len\(seen\)"),
        (
            ScalesByHowManyKeysADictComprehensionMakes,
            r"into text.*asked at .*`return h \* len\(\{n: 1\.0",
        ),
        (ScalesForItsDtypeComparedByAnOperator, r"into text.*asked at .*if operator\.eq\("),
        (ScalesForItsDtypeReadLetterByLetter, r"into text.*asked at .*`letters = list\("),
        (ScalesForItsDtypeSubstituted, r"into text.*asked at .*`return h \* 10 if re\.sub\("),
        (ScalesForItsDtypeDumped, r"into text.*asked at .*`return h \* 10 if json\.dumps\("),
        (
            ScalesByAGainMadeOfPairsPoppedOffAList,
            r"into text.*asked at .*`return h \* dict\(rows\.pop\(\)\)\.get",
        ),
        (ScalesForItsDtypePoppedFirst, r"into text.*asked at .*`return h \* 10 if words\.pop\(0\)"),
        (ScalesForItsDtypeNotedByUpdate, r"into text.*asked at .*`return h \* 10 if notes\["),
        (
            ScalesForItsDtypeNormalized,
            r"into text.*asked at .*`return h \* 10 if unicodedata\.normalize\(",
        ),
        (ScalesByAGainALambdaPicks, r"into text.*asked at .*`return h \* \(lambda n:"),
        (
            ScalesByAGainLookedUpBySpreadText,
            r"into text.*asked at .*`return h \* self\.gains\.get\(\*",
        ),
        (
            ScalesByAGainItsMethodPicksBySpreadText,
            r"into text.*asked at .*`return 10\.0 if name == \"torch\.float64-k\"",
        ),
        (
            ScalesByAGainItsMethodPicksBySpreadTexts,
            r"into text.*asked at .*`return 10\.0 if name == \"torch\.float64-k\"",
        ),
        (
            ScalesByAGainItsMethodPicksOutOfWhatItGathers,
            r"into text.*asked at .*`return 10\.0 if names\[0\] ==",
        ),
        (
            ScalesByAGainItsMethodPicksOutOfWhatItGathersByName,
            r"into text.*asked at .*`return 10\.0 if names\[\"dtype\"\] ==",
        ),
        (
            ScalesByAGainItsMethodPicksByName,
            r"into text.*asked at .*`return 10\.0 if name == \"torch\.float64-k\"",
        ),
        (
            ScalesByAGainItsMethodFindsInItsSecondArgument,
            r"into text.*asked at .*`return 10\.0 if \"torch\.float64-k\" in names",
        ),
        (
            ScalesByAGainItsMethodIsHandedByTheNameOfItsDtype,
            r"into text.*asked at .*`return self\.encoder\(x\.float\(\)\) \* self\._gain\(\*\*",
        ),
        (ScalesByAGainMadeOfAPairEnumerated, r"into text.*asked at .*`h = h \* dict\(\[pair\]\)"),
        (
            ScalesByAGainMadeOfPairsAComprehensionMakesOfTwoNames,
            r"into text.*asked at .*`return h \* gains\.get",
        ),
        (
            ScalesForItsDtypeUnpackedWithTheRest,
            r"into text.*asked at .*`return h \* 10 if first ==",
        ),
        (ScalesForItsDtypeMatchedByAMappingPattern, r"into text.*asked at .*`case \{\"dtype\": "),
        (
            ScalesForItsDtypeMatchedByEitherOfTwoNames,
            r"into text.*asked at .*`case \"torch\.float64-k\" \|",
        ),
    ],
    ids=[
        "format",
        "percent with a tuple",
        "join",
        "str of str",
        "looked up as returned",
        "handed",
        "handed to an attribute's method",
        "handed to a submodule's method",
        "handed to an attribute's method named as a list's",
        "handed to a function after many prints",
        "handed back",
        "handed back and on",
        "handed on by the function it is handed to",
        "handed on by the method it is handed to",
        "handed back by the function it is handed on to",
        "put into a list handed to a function",
        "handed with a list to a function that puts it in",
        "added to a list handed to a function",
        "put into a list handed on",
        "put into a dict",
        "put into a list the model keeps",
        "put into a list the model keeps by a method handed it",
        "gone over in a loop",
        "got out of a dict",
        "compared in a generator expression",
        "compared in a generator expression all asks",
        "compared in a list comprehension",
        "put into a set by a comprehension",
        "put into a dict by a comprehension",
        "sorted from a generator expression",
        "taken out of an iterator",
        "read by a generator expression from the forward",
        "handed to a function in a generator expression",
        "handed to a method in a list comprehension",
        "handed to a function of a module",
        "handed to a function of a module in a generator expression",
        "handed back in a generator expression",
        "handed back in a list comprehension",
        "upper-cased",
        "put into a list by a loop",
        "a dict's key got by a literal",
        "a dict's key looked up by a literal",
        "a dict's key put by a comprehension",
        "a dict's key put by zip",
        "a dict's key put by update",
        "a dict's key spread into another",
        "a dict's key copied by keywords",
        "a dict's key made of a pair",
        "a dict's key made of pairs a loop appends",
        "an ordered dict's key made of a pair",
        "a default dict's key made of a pair",
        "a dict's key made of pairs a function appends",
        "a dict's key made of a pair taken by place",
        "a dict's key made of a pair gone over in a loop",
        "a dict's key made of a list of two",
        "a dict's key made of a pair held in a dict",
        "read by place out of pairs and handed back",
        "counted",
        "matched by a module's function",
        "counted in a set",
        "counted in a set added to",
        "counted as a dict's keys",
        "compared by an operator",
        "read letter by letter",
        "substituted by a module's function",
        "written as JSON",
        "a dict's key made of pairs popped off a list",
        "popped off a list by place",
        "a dict's value put by update by name",
        "put in a normal form by a library's function",
        "handed to a lambda",
        "looked up by text spread into the call",
        "spread into a call of its own method",
        "spread second into a call of its own method",
        "gathered by its own method",
        "gathered by name by its own method",
        "handed by name to its own method",
        "handed second to its own method",
        "naming the parameter of its own method it is handed by",
        "a dict's key made of a pair enumerated",
        "a dict's key made of pairs a comprehension makes of two names",
        "unpacked with the rest",
        "matched by a mapping pattern",
        "matched by an or-pattern",
    ],
)
def test_text_python_makes_of_what_fx_stands_in_for_is_followed_and_refused_where_asked(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """Python puts the text of a stand-in into plain text by `str.format`, `%` with a
    tuple, `str.join` or `str`, which it does not mark: `"{}!".format(str(x.dtype)) ==
    "torch.float64!"` would keep the branch for float32 for a float64 input too. `wrap`
    follows that text through locals, what a function returns, a function of the
    model's it is handed to and a list or dict it, a loop or such a function puts it
    into, to the items taken out of them and into a comprehension or generator
    expression over them or reading it, and refuses it where it is compared or looked
    up, naming both lines; put into a message, it is let be, and
    the model answers as it does."""
    _refused_as_untraceable(kind, named, store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _answers_as_the_model(PutsItsDtypeInMessages, store)


def test_text_in_code_the_following_cannot_read_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the code text of a stand-in is made in cannot be read (bytecode this
    reading does not know), whether it is compared is unknown: the model is refused,
    naming the line and what failed, not let be, since a comparison missed keeps the
    branch taken for one dtype for every other."""

    def unreadable(frame: object, own: object) -> None:
        raise NotImplementedError("an instruction not known")

    monkeypatch.setattr("somatize_torch._modes.asked_at", unreadable)
    torch.manual_seed(0)
    with pytest.raises(smt.Untraceable, match=r"cannot be followed.*an instruction not known"):
        smt.wrap(PutsItsDtypeInMessages(), frozen=["encoder"], cached=["encoder"], store=store)


class CountsItsMessages(OnTempered):
    """Gathers messages naming its shape in a list and logs them when there are any: the
    list's length asks nothing of the text in it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        messages = []
        messages.append(f"input of shape {x.shape}")
        h = self.encoder(x)
        if len(messages) > 0:
            logging.getLogger("somatize.tests.wrap.counts").debug("; ".join(messages))
        return h * 2


class _Notebook:
    """Takes notes, logging them."""

    def append(self, note: str) -> None:
        logging.getLogger("somatize.tests.wrap.notebook").debug(note)


class NotesItsShapeThenReadsItsMode(OnTempered):
    """Hands a note naming its shape to an object it holds (`self.notes.append`), then
    scales by a mode of its own: the model is no list of the note."""

    def __init__(self) -> None:
        super().__init__()
        self.notes = _Notebook()
        self.mode = "double"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.notes.append(f"input of shape {x.shape}")
        h = self.encoder(x)
        return h * 2 if self.mode == "double" else h


class _Logs(nn.Module):
    """Logs a message, and gives a gain of two."""

    def gain_for(self, message: str) -> float:
        logging.getLogger("somatize.tests.wrap.logs").debug(message)
        return 2.0


class HandsItsShapeToASubmodule(OnTempered):
    """Hands text naming its shape to a method of a submodule (`self.logs.gain_for`),
    which only logs it; its own method of that name would compare it."""

    def __init__(self) -> None:
        super().__init__()
        self.logs = _Logs()

    def gain_for(self, name: str) -> float:
        return 10.0 if name == "torch.Size([3, 4])" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.logs.gain_for(f"{x.shape}")


class HandsItsDtypeNamesToASubmoduleInAGenerator(OnTempered):
    """Hands the names of its dtype to a method of a submodule that only logs them, in a
    generator expression, and scales by the least gain it gives."""

    def __init__(self) -> None:
        super().__init__()
        self.logs = _Logs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * min(self.logs.gain_for(n) for n in _dtype_names(x))


class HandsItsShapeToAFunctionOfAModule(OnTempered):
    """Hands text naming its shape to a function of a module of its own
    (`wrap_helpers.logged`), which only logs it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * wrap_helpers.logged(f"{x.shape}")


class PrintsPairsOfItsDtypeTakenByPlace(OnTempered):
    """Prints a pair of the name of its dtype taken by place out of a list of them, and a
    dict made of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = [("-".join([str(x.dtype), "k"]), 2.0)]
        print(pairs[0], dict([pairs[0]]))
        return self.encoder(x) * 2


class PrintsTheNameOfItsDtypePoppedOffAList(OnTempered):
    """Prints a list of the name of its dtype and a word, the word popped off it: a list
    popped asks nothing of what it holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        words = ["-".join([str(x.dtype), "k"]), "input"]
        words.pop()
        print(words)
        return self.encoder(x) * 2


class PrintsTheNameOfItsDtypePoppedFirst(OnTempered):
    """Prints the name of its dtype popped by place off a list of it and a word, and the
    word left: a list popped by place compares none of what it holds."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        words = ["-".join([str(x.dtype), "k"]), "input"]
        first = words.pop(0)
        print(first.upper(), words)
        return self.encoder(x) * 2


class ScalesByAGainBesideItsDtypeNoted(OnTempered):
    """Scales by a gain read out of a dict of notes that `update` puts the name of its
    dtype into as a value, by name and by a dict made there: the dict is keyed by no
    text of it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        notes = {"gain": 2.0}
        notes.update(dtype="-".join([str(x.dtype), "k"]))
        notes.update({"kind": "-".join([str(x.dtype), "k"])})
        return self.encoder(x) * notes["gain"]


class HandsItsShapeOnToASubmodule(OnTempered):
    """Hands text naming its shape to a method of its own that hands it on to a method of
    a submodule, which only logs it."""

    def __init__(self) -> None:
        super().__init__()
        self.logs = _Logs()

    def _gain(self, message: str) -> float:
        return self.logs.gain_for(message)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self._gain(f"{x.shape}")


class PrintsItsDtypeNormalized(OnTempered):
    """Prints the name of its dtype put in a normal form by a function of a library, and
    doubles when it is text, which any name is: what the function hands back is only
    printed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = "-".join([str(x.dtype), "k"])
        print(unicodedata.normalize("NFC", name))
        h = self.encoder(x)
        return h * 2 if isinstance(name, str) else h


class LogsItsDtypeSpreadIntoItsMethod(OnTempered):
    """Spreads the name of its dtype and a word into a method of its own that only logs
    them, one as a parameter, the rest gathered."""

    def _log(self, name: str, *rest: str) -> None:
        logging.getLogger("somatize.tests.wrap.spread").debug("%s %s", name, rest)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._log(*["-".join([str(x.dtype), "k"]), "input"])
        return self.encoder(x) * 2


class PrintsTheTextOfPairsOfItsDtype(OnTempered):
    """Prints the name of its dtype read by place out of a pair read by place out of a
    list of them, and out of each pair gone over in a loop, upper-cased: a pair is no
    text, so the text read out of it is read out of no text."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = [("-".join([str(x.dtype), "k"]), 2.0)]
        print(pairs[0][0].upper(), [pair[0].title() for pair in pairs])
        return self.encoder(x) * 2


@pytest.mark.parametrize(
    "kind",
    [
        CountsItsMessages,
        NotesItsShapeThenReadsItsMode,
        HandsItsShapeToASubmodule,
        HandsItsDtypeNamesToASubmoduleInAGenerator,
        HandsItsShapeToAFunctionOfAModule,
        PrintsPairsOfItsDtypeTakenByPlace,
        PrintsTheTextOfPairsOfItsDtype,
        PrintsTheNameOfItsDtypePoppedOffAList,
        PrintsItsDtypeNormalized,
        LogsItsDtypeSpreadIntoItsMethod,
        PrintsTheNameOfItsDtypePoppedFirst,
        ScalesByAGainBesideItsDtypeNoted,
        HandsItsShapeOnToASubmodule,
    ],
    ids=[
        "length of a list",
        "handed to an attribute's method",
        "a submodule's method",
        "a submodule's method in a generator expression",
        "a module's function",
        "pairs taken by place",
        "the text of pairs taken by place",
        "a list of two popped",
        "printed as a library's function hands it back, and asked its type",
        "spread into its own method that logs it",
        "a list of two popped by place",
        "a dict updated with it as a value",
        "handed on by its method to a submodule's",
    ],
)
def test_text_of_what_fx_stands_in_for_that_nothing_asks_is_let_be(
    store: Store, kind: Callable[[], nn.Module]
) -> None:
    """Text made of a stand-in that the forward only gathers in a list it counts or prints,
    hands to an object it holds or to a submodule's method or a module's function that logs
    it, is asked nothing: the model is wrapped, and answers as it does."""
    _answers_as_the_model(kind, store)


class PrintsItsShape(OnTempered):
    """Prints the shape of its input as it runs, logs it, and checks its width with a
    message naming it, as torchvision's vision transformer checks its input's size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print(x.shape, f"{x.dtype}")
        logging.getLogger("somatize.tests.wrap.prints").debug(f"input {x.shape}")
        torch._assert(x.shape[1] == 4, f"Wrong width! Expected 4 but got {x.shape[1]}!")
        warnings.warn(str(x.dtype) + " input of shape " + str(x.shape), stacklevel=1)
        return self.encoder(x) * 2


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (DoublesWhatItMakesIfATensor, r"`h`.*type\(h\) is torch\.Tensor"),
        (DoublesItsInputIfATensor, r"`y`.*type\(y\) is torch\.Tensor"),
        (AddsAListIfTensors, r"`items`.*type\(items\[0\]\) is torch\.Tensor"),
        (AddsAListItemByItem, r"type\(item\) is torch\.Tensor"),
        (SumsWhatItMakesIfATensor, r"`h`.*type\(h\.sum\(-1\)\) is torch\.Tensor"),
        (HalvesWhatItMakesIfSplit, r"`h`.*type\(torch\.split\(h, 2, dim=-1\)\) is tuple"),
    ],
    ids=["made after", "made before", "in a list", "over a list", "a method's", "a function's"],
)
def test_the_type_of_what_fx_stands_in_for_in_a_local_or_a_list_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx stands in for a value the forward makes of its inputs (`h = self.encoder(x) +
    1`), for each tensor in a list it builds, and for what a call makes of them:
    `type(h) is torch.Tensor`, `type(items[0]) is torch.Tensor` in a method handed the
    list, or `type(h.sum(-1)) is torch.Tensor`, is the stand-in's type whatever a call
    gives, and the branch kept would be the one for a value that is no tensor in every
    call. `wrap` refuses it, naming the line."""
    _refused_as_untraceable(kind, named, store)


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (ScalesForItsDtypeByName, r"\"float64\" in str\(x\.dtype\).*into text"),
        (ScalesForItsDtypeInAnFString, r"f\"\{x\.dtype\}\" == .*into text"),
        (PicksAHeadByItsDtype, r"str\(x\.dtype\)\.split.*into text"),
        (ScalesForItsDtypeInALongerFString, r"f\"dtype=\{x\.dtype\}\" == .*into text"),
        (ScalesForItsDtypeJoined, r"\"dtype \" \+ str\(x\.dtype\) == .*into text"),
    ],
    ids=["str", "f-string", "split", "f-string of parts", "joined"],
)
def test_a_forward_turning_what_fx_stands_in_for_into_text_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """The text of a stand-in (`str(x.dtype)`, `f"{x.dtype}"`) is its name whatever a call
    gives: `"float64" in str(x.dtype)` would keep the branch for float32 for a float64
    input too. `wrap` refuses it, naming the line; a forward that only prints a stand-in,
    logs it or puts it in the message of a check (`torch._assert(..., f"... {h}")`) is
    traced, and answers as the model does."""
    _refused_as_untraceable(kind, named, store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _answers_as_the_model(PrintsItsShape, store)


class UpcastsHalfInputs(OnTempered):
    """Upcasts an input whose dtype is in a set of half kinds before its encoder, and
    scales by a gain looked up by the dtype, as mixed-precision code does."""

    gains: ClassVar[dict[torch.dtype, float]] = {torch.float64: 10.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in {torch.float16, torch.bfloat16, torch.float64}:
            x = x.float() * 2
        return self.encoder(x.float()) * self.gains.get(x.dtype, 1.0)


class LooksUpAGainByItsKind(OnTempered):
    """Scales by a gain looked up by its input's dtype alone."""

    gains: ClassVar[dict[torch.dtype, float]] = {torch.float64: 10.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * self.gains.get(x.dtype, 1.0)


@functools.lru_cache(maxsize=8)
def _ramp(width: Any) -> torch.Tensor:
    """``0, 1, ..., width - 1``, kept per width."""
    return torch.arange(width).float()


class AddsARampKeptPerWidth(OnTempered):
    """Adds a ramp a cached function of its own makes for its input's width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + _ramp(x.shape[1])


class AddsARampItsMethodKeepsPerWidth(OnTempered):
    """Adds a ramp a method of its own cached per argument makes for its input's width."""

    @functools.lru_cache(maxsize=8)  # noqa: B019
    def _ramp(self, width: Any) -> torch.Tensor:
        return torch.arange(width).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[1]
        return self.encoder(x) + self._ramp(width)


class AddsARampItsMethodCaches(OnTempered):
    """The same, by a method under `functools.cache`."""

    @functools.cache  # noqa: B019
    def _ramp(self, width: Any) -> torch.Tensor:
        return torch.arange(width).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + self._ramp(x.shape[1])


class AddsARampItsStaticMethodKeeps(OnTempered):
    """The same, by a static method cached per argument."""

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def _ramp(width: Any) -> torch.Tensor:
        return torch.arange(width).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + self._ramp(x.shape[1])


class AddsARampItsClassMethodKeeps(OnTempered):
    """The same, by a class method cached per argument."""

    @classmethod
    @functools.lru_cache(maxsize=8)
    def _ramp(cls, width: Any) -> torch.Tensor:
        return torch.arange(width).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + self._ramp(x.shape[1])


class ScalesByAGainItKeeps(OnTempered):
    """Scales by a gain it works out once (`functools.cached_property`)."""

    @functools.cached_property
    def gain(self) -> float:
        return 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.gain


@pytest.mark.parametrize(
    "kind",
    [
        AddsARampKeptPerWidth,
        AddsARampItsMethodKeepsPerWidth,
        AddsARampItsMethodCaches,
        AddsARampItsStaticMethodKeeps,
        AddsARampItsClassMethodKeeps,
        ScalesByAGainItKeeps,
    ],
    ids=["function", "method", "method under cache", "static method", "class method", "property"],
)
def test_a_function_kept_per_argument_handed_what_fx_stands_in_for_is_traced(
    store: Store, kind: Callable[[], nn.Module]
) -> None:
    """A function or method of the model's cached per argument (`functools.lru_cache`,
    `functools.cache`) handed a stand-in (`self._ramp(x.shape[1])`) misses its cache, as
    it must, and is traced: the model is wrapped, and answers as it does."""
    _answers_as_the_model(kind, store)


_gain_of_kind = {torch.float64: 10.0}.get
"""A dict's `get`, called by a name of its own."""


class LooksUpAGainByAName(OnTempered):
    """Scales by a gain looked up by its input's dtype through a dict's `get` named
    apart."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * _gain_of_kind(x.dtype, 1.0)


_gain_kept = functools.lru_cache(maxsize=None)({torch.float64: 10.0}.get)
"""A dict's `get`, kept per argument (`functools.lru_cache`)."""

_gain_cached = functools.cache({4: 10.0}.get)
"""A dict's `get`, under `functools.cache`."""


class LooksUpAGainThroughACache(OnTempered):
    """Scales by a gain looked up by its input's dtype through a dict's `get` kept per
    argument."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x.float()) * _gain_kept(x.dtype, 1.0)


class LooksUpAGainByWidthThroughACache(OnTempered):
    """Scales by a gain looked up by its input's width through a dict's `get` under
    `functools.cache`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * _gain_cached(x.shape[1], 1.0)


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (UpcastsHalfInputs, r"x\.dtype in \{torch\.float16.*set or dict"),
        (LooksUpAGainByItsKind, r"self\.gains\.get\(x\.dtype, 1\.0\).*set or dict"),
        (LooksUpAGainByAName, r"_gain_of_kind\(x\.dtype, 1\.0\).*set or dict"),
        (LooksUpAGainThroughACache, r"_gain_kept\(x\.dtype, 1\.0\).*set or dict"),
        (LooksUpAGainByWidthThroughACache, r"_gain_cached\(x\.shape\[1\], 1\.0\).*set or dict"),
    ],
    ids=[
        "in a set",
        "a dict's get",
        "a dict's get named apart",
        "a dict's get kept per argument",
        "a dict's get cached, by width",
    ],
)
def test_looking_what_fx_stands_in_for_up_in_a_set_or_dict_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx's stand-in for `x.dtype` is no key of any set or dict: `x.dtype in
    {torch.float16, ...}` answers no, and `gains.get(x.dtype, 1.0)` the default, whatever
    a call gives, so a float64 input would run the branch for float32. `wrap` refuses it,
    naming the line."""
    _refused_as_untraceable(kind, named, store)


class ScalesWhenMarked(OnTempered):
    """Scales by ten when what its encoder answers carries a mark (`hasattr`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * 10 if hasattr(h, "marked") else h


class ScalesByAGainItsInputCarries(OnTempered):
    """Scales by a gain its input carries, where it carries one (`getattr` with a
    default)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = getattr(x, "gain", None)
        h = self.encoder(x)
        return h if gain is None else h * gain


class ReadsItsWidthByName(OnTempered):
    """Reads its input's width by the attribute's name (`getattr` with no default)."""

    read = "shape"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * getattr(x, self.read)[1]


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        (ScalesWhenMarked, r"hasattr\(h, \"marked\"\).*any name"),
        (ScalesByAGainItsInputCarries, r"getattr\(x, \"gain\", None\).*any name"),
    ],
    ids=["hasattr", "getattr"],
)
def test_asking_whether_what_fx_stands_in_for_has_an_attribute_is_refused(
    store: Store, kind: Callable[[], nn.Module], named: str
) -> None:
    """fx's stand-in answers every attribute asked of it, so `hasattr(h, "marked")` or
    `getattr(x, "gain", None)` would keep the branch for a value that has it in every
    call. `wrap` refuses it, naming the line; reading an attribute by name with no default
    (`getattr(x, "shape")`) is traced, and answers as the model does."""
    _refused_as_untraceable(kind, named, store)
    _answers_as_the_model(ReadsItsWidthByName, store)


class ScalesByATensorMaskInAMethod(OnTempered):
    """Scales by its mask when it is a tensor, asking its type in a method of its own."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        return self._scaled(self.encoder(x), mask)

    def _scaled(self, h: torch.Tensor, by: Any) -> torch.Tensor:
        if type(by) is torch.Tensor:
            return h * by
        return h


def _scaled_by_a_tensor(h: torch.Tensor, mask: Any) -> torch.Tensor:
    return h * mask if type(mask) is torch.Tensor else h


class ScalesByATensorMaskInAFunction(OnTempered):
    """Scales by its mask when it is a tensor, asking its type in a function it calls."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        return _scaled_by_a_tensor(self.encoder(x), mask)


def _passes_through(count: int) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """``count`` functions, each with code of its own, that answer what they are handed."""
    made: list[Callable[[torch.Tensor], torch.Tensor]] = []
    for at in range(count):
        space: dict[str, Any] = {}
        exec(f"def passed_{at}(h):\n    return h\n", space)
        made.append(space[f"passed_{at}"])
    return made


_THROUGH = _passes_through(4200)
"""Kept by the module, not the class: a class holding so many is too large for a graph to
watch, and is warned of."""


class ScalesByATensorMaskAfterManyFunctions(OnTempered):
    """Hands what it encoded through many functions, each of its own code, then scales it
    by its mask when that is a tensor, asking its type in a function it calls."""

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        for one in _THROUGH:
            h = one(h)
        return _scaled_by_a_tensor(h, mask)


class ScalesByATensor(nn.Module):
    """Scales by what it is handed when that is a tensor, by asking its type."""

    def forward(self, h: torch.Tensor, mask: Any) -> torch.Tensor:
        return _scaled_by_a_tensor(h, mask) if type(mask) in (torch.Tensor,) else h


class ScalesByATensorMaskInABlock(OnTempered):
    """Scales by its mask when it is a tensor, asking its type in a block traced into."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = ScalesByATensor()

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        return self.scale(self.encoder(x), mask)


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (ScalesByATensorMaskInAMethod, r"type\(by\) is torch\.Tensor"),
        (ScalesByATensorMaskInAFunction, r"type\(mask\) is torch\.Tensor"),
        (ScalesByATensorMaskInABlock, r"type\(mask\) in \(torch\.Tensor,\)"),
        (ScalesByATensorMaskAfterManyFunctions, r"type\(mask\) is torch\.Tensor"),
    ],
    ids=["method", "function", "block", "after thousands of functions"],
)
def test_the_type_of_what_fx_stands_in_for_compared_in_code_the_forward_calls_is_refused(
    store: Store, kind: Callable[[], nn.Module], line: str
) -> None:
    """`type(mask) is torch.Tensor` asked in a method of the model, a function or a block
    the forward calls, of the stand-in fx hands for an argument a call gives a tensor,
    would keep the branch for a value that is no tensor: that call is refused naming the
    argument and the line there, as in the forward's own code; calls handing it a plain
    value answer as the model does."""
    wrapped, model = _encoder_cached(kind, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, 2.0), model(x, 2.0))
        for _ in range(2):
            with pytest.raises(smt.WrapError, match=rf"`mask` is a `torch\.Tensor`.*{line}"):
                wrapped(x, torch.full((3, 4), 2.0))


def _profiled_after() -> int:
    """A function a profiler is asked to have seen, called after `wrap`."""
    return 1


@pytest.mark.parametrize("hook", ["profiler", "tracer"])
def test_wrap_leaves_a_profiler_or_tracer_set_as_it_was_and_still_reads_code_it_runs(
    store: Store, hook: str
) -> None:
    """The trace notes the functions it runs through a hook of its own, which it cannot
    put back in place of a profiler set in C (cProfile's, before Python 3.12): the hook is
    one that is free, the profiler or tracer set keeps running after `wrap`, a trace in
    either mode is not refused for it, and code the forward hands a stand-in to is still
    read, as without one."""
    profiler = cProfile.Profile()
    seen: list[str] = []

    def trace(frame: types.FrameType, event: str, arg: Any) -> None:
        seen.append(frame.f_code.co_name)

    if hook == "profiler":
        profiler.enable()
    else:
        was = sys.gettrace()
        sys.settrace(trace)
    try:
        wrapped, model = _encoder_cached(ScalesByATensorMaskInAMethod, store)
        _profiled_after()
    finally:
        if hook == "profiler":
            profiler.disable()
        else:
            sys.settrace(was)
    if hook == "profiler":
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        assert any(name == "_profiled_after" for _, _, name in stats)
    else:
        assert "_profiled_after" in seen
    x = torch.randn(3, 4)
    with torch.no_grad():
        for training in (True, False):
            wrapped.train(training)
            model.train(training)
            assert torch.equal(wrapped(x), model(x))
            with pytest.raises(smt.WrapError, match=r"`mask` is a `torch\.Tensor`.*type\(by\)"):
                wrapped(x, torch.full((3, 4), 2.0))


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        (ScalesUnlessTrue, [True, 1, False, 0, True, 1, 2.0]),
        (HundredfoldForAnInt, [2.0, 2, None, 3, 3.0, 2]),
        (TriplesForAFlag, [2, True, 1, False, 2, True]),
    ],
)
def test_a_plain_value_the_forward_tells_apart_unseen_by_fx_answers_as_the_forward(
    store: Store, kind: Callable[[], nn.Module], values: list[Any]
) -> None:
    """A forward that tells a plain value apart where fx sees no branch (`flag is True`,
    `type(n) is int`) and also computes with it answers as the model does for each value
    a call hands it, whatever came before: `True`, `1` and `2.0`, `2` and `2.0`, traced
    apart."""
    wrapped, model = _encoder_cached(kind, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for value in values:
            assert torch.equal(wrapped(x, value), model(x, value)), value


def test_a_forward_comparing_the_type_of_what_fx_stands_in_for_is_refused_naming_it(
    store: Store,
) -> None:
    """`type(mask) is torch.Tensor` asked of the stand-in fx hands the forward for an
    argument a call gives a tensor is the stand-in's type, and the branch kept would be
    the one for a value that is no tensor: that call is refused naming the argument and
    the line, rather than answered so; calls handing it a plain value answer as the
    model does, and so do those of a forward asking it of an argument handed a flag or
    a count."""
    wrapped, model = _encoder_cached(ScalesByATensorMask, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, 2.0), model(x, 2.0))
        for _ in range(2):
            with pytest.raises(smt.WrapError, match=r"`mask` is a `torch\.Tensor`.*type\(mask\)"):
                wrapped(x, torch.full((3, 4), 2.0))
    wrapped, model = _encoder_cached(TriplesForAFlag, store)
    with torch.no_grad():
        with pytest.raises(smt.WrapError, match=r"`n` is a `torch\.Tensor`.*type\(n\) is bool"):
            wrapped(x, torch.tensor(4.0))
        assert torch.equal(wrapped(x, True), model(x, True))


class Step(enum.Enum):
    UP = "up"
    DOWN = "down"


class StepsByEnum(OnTempered):
    """Branches on an Enum member and on a tuple of numbers."""

    def forward(
        self, x: torch.Tensor, step: Step = Step.UP, shape: tuple[int, int] = (3, 4)
    ) -> torch.Tensor:
        h = self.encoder(x)
        h = h + 1 if step is Step.UP or step == Step.UP else h - 1
        return h.reshape(shape[1], shape[0]) if shape[0] > 3 else h


def test_an_enum_member_or_a_tuple_of_numbers_branched_on_is_traced_per_value(
    store: Store,
) -> None:
    """An Enum member and a tuple of numbers the forward branches on pick a trace each."""
    wrapped, model = _encoder_cached(StepsByEnum, store)
    x = torch.randn(6, 4)
    with torch.no_grad():
        for _ in range(2):
            for call in (
                lambda m: m(x),
                lambda m: m(x, Step.DOWN),
                lambda m: m(x, shape=(6, 4)),
                lambda m: m(x, Step.DOWN, (4, 6)),
            ):
                assert torch.equal(call(wrapped), call(model))


class Option(enum.IntFlag):
    SCALE = 1
    SHIFT = 2


class ByOptions(OnTempered):
    """Scales and shifts by the options it is handed, which may be members combined."""

    def forward(self, x: torch.Tensor, options: Option = Option.SHIFT) -> torch.Tensor:
        h = self.encoder(x)
        if options & Option.SCALE:
            h = h * 3
        if options & 4:
            h = h + 1
        return h


def test_flag_values_without_a_name_are_traced_apart(store: Store) -> None:
    """Flag values made of members combined or of bits no member names have no name of
    their own: each picks a trace by its value, not one shared by all of them."""
    wrapped, model = _encoder_cached(ByOptions, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            for options in (Option(4), Option(8), Option.SCALE | Option.SHIFT, Option(5)):
                assert torch.equal(wrapped(x, options), model(x, options))


class ByOptionsCombined(OnTempered):
    """Shifts for an option of the members combined it defaults to, and scales by them."""

    def forward(
        self, x: torch.Tensor, options: Option = Option.SCALE | Option.SHIFT
    ) -> torch.Tensor:
        h = self.encoder(x)
        if options & Option.SHIFT:
            h = h + 1
        return h * options


def test_flag_values_fx_cannot_spell_are_traced_and_run(store: Store) -> None:
    """fx writes a flag value into its code by class and name, which members combined
    (`SCALE|SHIFT`) or no member (None) do not make Python of: a forward fixed at such a
    value, by default or by a call, is traced and answers as the model does."""
    wrapped, model = _encoder_cached(ByOptionsCombined, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        for options in (Option(0), Option.SCALE, Option(6), Option.SCALE | Option.SHIFT):
            assert torch.equal(wrapped(x, options), model(x, options))


class ScalesByOptions(OnTempered):
    """Scales by the options it is handed, members combined by default."""

    def forward(
        self, x: torch.Tensor, options: Option = Option.SCALE | Option.SHIFT
    ) -> torch.Tensor:
        return self.encoder(x) * options


def test_a_flag_value_fx_cannot_spell_as_an_input_default_is_refused_naming_it(
    store: Store,
) -> None:
    """An argument taken as an input whose default is a flag value with no name of its
    own cannot be written into fx's code: refused at the call handing it a tensor, naming
    it and what to do. A call handing it a plain value, its default included, is traced
    at that value, which is written as it is made."""
    wrapped, model = _encoder_cached(ScalesByOptions, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, Option.SCALE), model(x, Option.SCALE))
        with pytest.raises(smt.Untraceable, match=r"`options` is taken as an input.*with a name"):
            wrapped(x, torch.tensor(2.0))


class Shifted(OnTempered):
    """Scales by a number it only computes with, then adds each shift of a tuple it
    iterates over, empty by default."""

    def forward(
        self, x: torch.Tensor, scale: float = 1.0, shifts: tuple[float, ...] = ()
    ) -> torch.Tensor:
        h = self.encoder(x) * scale
        for shift in shifts:
            h = h + shift
        return h


def test_a_tuple_branched_on_after_an_argument_with_a_default_is_traced_per_value(
    store: Store,
) -> None:
    """A tuple the forward iterates over, empty or not, placed after an argument it takes
    as an input with a default, picks a trace by its value."""
    wrapped, model = _encoder_cached(Shifted, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for call in (
            lambda m: m(x),
            lambda m: m(x, 2.0, (1.0,)),
            lambda m: m(x, shifts=(1.0, -2.5)),
            lambda m: m(x, 3.0),
        ):
            assert torch.equal(call(wrapped), call(model))


class ShiftedByThis(nn.Module):
    """Adds each shift of a tuple it iterates over, its forward's first parameter named
    other than `self`."""

    def __init__(this) -> None:
        super().__init__()
        this.encoder = Tempered()

    def forward(this, x: torch.Tensor, shifts: tuple[float, ...] = ()) -> torch.Tensor:
        h = this.encoder(x)
        for shift in shifts:
            h = h + shift
        return h


def test_a_tuple_branched_on_by_a_forward_whose_first_parameter_is_not_self_runs(
    store: Store,
) -> None:
    """The code traced for a tuple value takes the forward's arguments after its first,
    whatever that one is named: a forward written `def forward(this, x, shifts=())`
    answers as the model does for a tuple it is given."""
    wrapped, model = _encoder_cached(ShiftedByThis, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for shifts in ((), (1.0,), (1.0, -2.5)):
            assert torch.equal(wrapped(x, shifts), model(x, shifts))


class Way(enum.Enum):
    MEAN = "mean"
    MAX = "max"


class AsksUnseen(OnTempered):
    """Branches on its arguments in ways fx answers without recording anything: by
    identity, by kind, by membership, by a dictionary lookup and by a formatted string."""

    def __init__(self) -> None:
        super().__init__()
        self.scales = {"a": 2.0, "b": 3.0}

    def forward(
        self,
        x: torch.Tensor,
        flag: bool = True,
        way: Way = Way.MEAN,
        n: int = 2,
        mode: str = "mean",
        which: str = "a",
        k: int | None = None,
    ) -> torch.Tensor:
        h = self.encoder(x)
        if flag is True:
            h = h * 2
        if way is Way.MAX:
            h = h - 1
        if type(n) is int:
            h = h + 3
        if mode in {"max", "amax"}:
            h = h.abs()
        if f"pool_{mode}" == "pool_min":
            h = -h
        if isinstance(k, int):
            h = h / 5
        return h * self.scales.get(which, 1.0)


def test_a_forward_branching_where_fx_records_nothing_is_traced_per_value(
    store: Store,
) -> None:
    """fx hands the forward a stand-in for each argument, and `flag is True`, `type(n) is
    int`, `mode in {...}`, `scales.get(which)`, `f"...{mode}"` and `isinstance(k, int)`
    on it answer without a branch fx notices, the stand-in then unused: an argument the
    traced code never uses is traced fixed at each plain value a call gives (and takes a
    tensor as an input), and every call, the one giving nothing included, answers as the
    model does."""
    wrapped, model = _encoder_cached(AsksUnseen, store)
    x = torch.randn(3, 4)
    calls = [
        lambda m: m(x),
        lambda m: m(x, False),
        lambda m: m(x, way=Way.MAX),
        lambda m: m(x, n=2.0),
        lambda m: m(x, mode="max"),
        lambda m: m(x, mode="min"),
        lambda m: m(x, which="b"),
        lambda m: m(x, k=3),
        lambda m: m(x, k=None),
        lambda m: m(x, k=torch.tensor(3)),
    ]
    with torch.no_grad():
        for _ in range(2):
            for call in calls:
                assert torch.equal(call(wrapped), call(model))


class PoolsByDefault(OnTempered):
    """Doubles when it pools, and scales by a number it only computes with."""

    def forward(self, x: torch.Tensor, pool: bool = True, *, scale: float = 1.0) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 * scale if pool else h * scale


@contextlib.contextmanager
def default_edited(edit: str) -> Iterator[str]:
    """Edits a default of ``PoolsByDefault.forward`` — its ``__defaults__`` or its
    ``__kwdefaults__`` replaced, or one of them set in place, as ``edit`` says — yields
    the name of the argument whose default changed, and puts the defaults back."""
    forward = PoolsByDefault.forward
    before = (forward.__defaults__, dict(forward.__kwdefaults__ or {}))
    try:
        if edit == "defaults":
            forward.__defaults__ = (False,)
            yield "pool"
        elif edit == "kwdefaults":
            forward.__kwdefaults__ = {"scale": 3.0}
            yield "scale"
        else:
            forward.__kwdefaults__["scale"] = 3.0
            yield "scale"
    finally:
        forward.__defaults__, forward.__kwdefaults__ = before


@pytest.mark.parametrize("edit", ["defaults", "kwdefaults", "kwdefaults in place"])
def test_a_forward_default_changed_after_wrap_is_refused_naming_it(store: Store, edit: str) -> None:
    """The code traced takes an argument left out at the default it had at `wrap`:
    changed after (`__defaults__`, `__kwdefaults__`), the next call is refused naming the
    argument, where it would have answered for the old default; copies and pickles of
    the wrapped model call as before."""
    wrapped, model = _encoder_cached(PoolsByDefault, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        held = io.BytesIO()
        torch.save(wrapped, held)
        held.seek(0)
        for copied in (torch.load(held, weights_only=False), copy.deepcopy(wrapped)):
            assert torch.equal(copied(x), model(x))
        with (
            default_edited(edit) as name,
            pytest.raises(smt.WrapError, match=rf"default of `{name}`.*changed"),
        ):
            wrapped(x)


class ExtraUnpooled(OnTempered):
    """Calls its declared extra layer only when it does not pool."""

    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, pool: bool = True) -> torch.Tensor:
        h = self.encoder(x)
        return h.mean(dim=0) if pool else self.extra(h)


def test_a_declared_call_made_only_for_another_value_is_refused_saying_the_value_traced(
    store: Store,
) -> None:
    """A declared submodule the forward calls only for a value other than the default of
    an argument it branches on is refused at `wrap`, saying the value it was traced at."""
    with pytest.raises(
        smt.NotCalled, match=r"`extra` is declared.*where `pool` is True.*other values"
    ):
        smt.wrap(ExtraUnpooled(), frozen=["encoder", "extra"], store=store)


_ENCODER_RUNS: list[bool] = []


class AnswersDict(nn.Module):
    """Answers a dict of its hidden states and their mean when asked for one, as a Hugging
    Face encoder does, and a tuple of them otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_dict: bool = True
    ) -> Any:
        _ENCODER_RUNS.append(return_dict)
        h = self.linear(x) if mask is None else self.linear(x) * mask
        if return_dict:
            return {"last_hidden_state": h, "pooler_output": h.mean(dim=0)}
        return (h, h.mean(dim=0))


class HandsOnReturnDict(nn.Module):
    """Hands `return_dict` on to its encoder, as a Hugging Face model does, and answers
    as it asks."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = AnswersDict()
        self.head = nn.Linear(4, 2)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_dict: bool = True
    ) -> Any:
        out = self.encoder(x, mask=mask, return_dict=return_dict)
        hidden = out["last_hidden_state"] if return_dict else out[0]
        logits = self.head(hidden)
        if return_dict:
            return {"logits": logits, "pooled": out["pooler_output"]}
        return (logits, out[1])


@pytest.mark.parametrize("cached", [True, False])
def test_a_declared_submodule_handed_a_value_traced_per_value_gets_the_value_given(
    tmp_path: Path, cached: bool
) -> None:
    """A declared encoder handed the value of an argument the forward branches on
    (`self.encoder(x, return_dict=return_dict)`) is called with the value each call
    gives, in the code traced for it: each answer is the model's, a cached one is kept
    apart per value and recalled for that value only, in this wrapped model and in
    another wrapping the same model on the same store, whichever value comes first."""
    torch.manual_seed(0)
    model = HandsOnReturnDict()
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    calls = [
        lambda m: m(x),
        lambda m: m(x, return_dict=False),
        lambda m: m(x, None, True),
        lambda m: m(x, mask, False),
        lambda m: m(x, return_dict=False),
        lambda m: m(x, mask=mask),
    ]
    with torch.no_grad():
        expected = [call(model) for call in calls]
        for order in (calls, calls[::-1]):
            wrapped = smt.wrap(
                model,
                frozen=["encoder"],
                cached=["encoder"] if cached else [],
                store=Store(tmp_path / "s"),
            )
            smt.freeze(wrapped)
            _ENCODER_RUNS.clear()
            got = [call(wrapped) for call in order]
            if order is not calls:
                got = got[::-1]
            for answer, want in zip(got, expected, strict=True):
                assert type(answer) is type(want)
                for a, b in zip(pytree.tree_leaves(answer), pytree.tree_leaves(want), strict=True):
                    assert torch.equal(a, b)
            if not cached:
                # Frozen only: the encoder runs in every call, handed the value given.
                given = [True, False, True, False, False, True]
                ran = list(_ENCODER_RUNS)
                assert ran == (given if order is calls else given[::-1])
            elif order is calls:
                # Each value's answer computed once, by the encoder handed that value.
                assert _ENCODER_RUNS == [True, False, False, True]
                assert wrapped.counts["encoder"] == {"ran": 4, "kept": 4, "recalled": 2}
            else:
                assert _ENCODER_RUNS == []
                assert wrapped.counts["encoder"] == {"recalled": 6}


class KindAware(nn.Module):
    """Answers by the kind and sign of the number it is handed, not its value alone."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 0.0) -> torch.Tensor:
        kind = {bool: 5.0, int: 7.0}.get(type(scale), 1.0)
        return self.linear(x) * kind * math.copysign(1.0, scale)


class HandsOnScale(nn.Module):
    """Hands its number on to a :class:`KindAware` encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = KindAware()

    def forward(self, x: torch.Tensor, scale: float = 0.0) -> torch.Tensor:
        return self.encoder(x, scale=scale)


@pytest.mark.parametrize("cached", [True, False])
def test_a_declared_submodule_handed_an_equal_value_of_another_kind_gets_the_value_given(
    tmp_path: Path, cached: bool
) -> None:
    """A declared encoder handed on `False`, `0` or `-0.0` where the first trace handed it
    `0.0` (equal in Python, apart per trace) is called with the value each call gives,
    not with the first trace's."""
    torch.manual_seed(0)
    model = HandsOnScale()
    wrapped = smt.wrap(
        model, frozen=["encoder"], cached=["encoder"] if cached else [], store=Store(tmp_path)
    )
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for scale in (0.0, False, 0, -0.0, 1.0, True, 1, 0.0):
            assert torch.equal(wrapped(x, scale), model(x, scale)), scale


class FlagRequired(OnTempered):
    """Branches on a flag it has no default for."""

    def forward(self, x: torch.Tensor, double: bool) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 if double else h


def test_a_forward_branching_on_an_argument_without_a_default_is_refused_naming_it(
    store: Store,
) -> None:
    """An argument the forward branches on is traced fixed at its default at `wrap`: one
    without a default is refused, naming it and saying to give it one, and the line."""
    with pytest.raises(smt.Untraceable, match=r"value of `double`, which has no default.*if"):
        smt.wrap(FlagRequired(), frozen=["encoder"], store=store)


class ChecksShape(OnTempered):
    """Checks the width of what it is handed (an argument with no annotation), the way a
    layer does, asking for the shape, size or rank."""

    heads, width = 2, 2
    asks = "shape"

    def forward(self, x):  # type: ignore[no-untyped-def]  # unannotated on purpose
        if self.asks == "shape":
            _, c = x.shape
            if c != self.heads * self.width:
                raise ValueError(c)
        elif self.asks == "size":
            if x.size(-1) != 4:
                x = x[..., :4]
        elif self.asks == "dim":
            if x.dim() == 3:
                x = x[0]
        elif x.ndim == 3:
            x = x[0]
        return self.encoder(x)


@pytest.mark.parametrize("asks", ["shape", "size", "dim", "ndim"])
def test_a_forward_branching_on_a_tensors_shape_is_refused_saying_so(
    store: Store, asks: str
) -> None:
    """A branch on a tensor argument's shape, size or rank is refused naming the line and
    saying fx cannot follow a branch on a tensor's shape, and what to do — not advising a
    default for the tensor, as for a flag, which no default would lift."""
    model = ChecksShape()
    model.asks = asks
    with pytest.raises(smt.Untraceable) as refused:
        smt.wrap(model, frozen=["encoder"], store=store)
    said = str(refused.value)
    assert "default" not in said, said
    assert "`ChecksShape.forward`" in said, said
    line = {"shape": "c != self.heads", "size": "x.size(-1)", "dim": "x.dim()", "ndim": "x.ndim"}
    assert f"if {line[asks]}" in said, said
    assert "branches on the shape, size or value of `x`, a tensor" in said, said
    assert "fx cannot follow a branch on a tensor's shape, size or value" in said, said
    assert "Make the shape static" in said and "declare the submodule" in said, said
    # A genuine flag, never used as a tensor, is still told to take a default.
    with pytest.raises(smt.Untraceable, match=r"give it a default \(`double: bool = False`\)"):
        smt.wrap(FlagRequired(), frozen=["encoder"], store=store)


class AsksIfFlag(OnTempered):
    """Doubles or negates for a flag, and scales by a count: asks which it was handed."""

    def forward(self, x: torch.Tensor, times: int | bool = 1) -> torch.Tensor:
        h = self.encoder(x)
        if isinstance(times, bool):
            return h * 2 if times else -h
        return h * times


class AsksIfNumber(OnTempered):
    """Makes a tensor of a number it is handed, and takes a tensor as it is."""

    def forward(self, x: torch.Tensor, step: torch.Tensor | float = 0.0) -> torch.Tensor:
        if isinstance(step, float):
            step = torch.full((4,), step)
        return self.encoder(x) + step


def test_a_forward_asking_what_kind_an_argument_that_may_be_a_tensor_is_runs_tensors(
    store: Store,
) -> None:
    """An argument annotated as taking a tensor is not traced per value for being asked
    what kind it is: a call handing it a tensor runs the branch fx traced for one."""
    wrapped, model = _encoder_cached(AsksIfNumber, store)
    x, step = torch.randn(3, 4), torch.full((4,), 0.5)
    with torch.no_grad():
        assert torch.equal(wrapped(x, step), model(x, step))


def test_a_forward_asking_what_kind_an_argument_with_a_plain_default_is_traced_per_value(
    store: Store,
) -> None:
    """fx answers no to `isinstance(times, bool)` whatever a call gives, so the branch
    kept would ignore a flag: such an argument is traced fixed at each value instead, and
    a call giving `True` answers as the model does, not as for `1`."""
    wrapped, model = _encoder_cached(AsksIfFlag, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            for times in (1, True, 3, False, 0):
                assert torch.equal(wrapped(x, times), model(x, times))


class ScalesByNumber(OnTempered):
    """Scales by a number it defaults, taking the number out of a tensor it is handed."""

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        if isinstance(scale, torch.Tensor):
            scale = scale.item()
        return self.encoder(x) * scale


def test_a_forward_asking_if_an_argument_with_a_plain_default_is_a_tensor_is_traced_per_value(
    store: Store,
) -> None:
    """fx answers no to `isinstance(scale, torch.Tensor)` for its stand-in whatever a call
    gives: an argument with a plain default asked so is traced fixed at each plain value a
    call gives, as one asked whether it is a bool is, and a call handing it a tensor is
    refused naming it."""
    wrapped, model = _encoder_cached(ScalesByNumber, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for scale in (1.0, 2.0, 1.0, -3.0):
            assert torch.equal(wrapped(x, scale), model(x, scale))
        with pytest.raises(smt.WrapError, match=r"`scale` is a `torch\.Tensor` in this call"):
            wrapped(x, torch.tensor(2.0))


def test_a_branched_on_argument_handed_what_is_not_a_plain_value_is_refused_naming_it(
    store: Store,
) -> None:
    """An argument the forward branches on picks a trace by its value: handed a tensor or a
    list, the call is refused, naming the argument and what it takes."""
    wrapped, _ = _encoder_cached(PoolsByFlag, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        with pytest.raises(
            smt.WrapError, match=r"`pool` is a `torch\.Tensor` in this call.*`bool\("
        ):
            wrapped(x, torch.tensor(True))
        with pytest.raises(smt.WrapError, match=r"`mode` is a `list` in this call"):
            wrapped(x, mode=["max"])


def test_a_branched_on_argument_handed_a_numpy_value_is_refused_saying_its_kind_whole(
    store: Store,
) -> None:
    """A numpy flag is no plain `bool`: the refusal names its kind with its module, so it
    does not read as refusing a bool, and says how to make one of it."""
    wrapped, _ = _encoder_cached(PoolsByFlag, store)
    x = torch.randn(3, 4)
    refused = r"`pool` is a `numpy\.bool_?` in this call.*`bool\(pool\)`"
    with torch.no_grad(), pytest.raises(smt.WrapError, match=refused):
        wrapped(x, np.bool_(False))


class Counted(OnTempered):
    """Adds a count it branches on."""

    def forward(self, x: torch.Tensor, count: int = 0) -> torch.Tensor:
        h = self.encoder(x)
        return h + count if count > 0 else h


class Listed(OnTempered):
    """Adds each number of a list it defaults to."""

    def forward(self, x: torch.Tensor, shifts: Any = [1.0, 2.0]) -> torch.Tensor:  # noqa: B006
        h = self.encoder(x)
        for shift in shifts:
            h = h + shift
        return h


def test_a_forward_iterating_over_a_list_it_defaults_to_is_refused_saying_so(
    store: Store,
) -> None:
    """A list is no plain constant a trace is fixed at: a forward iterating over the list
    an argument defaults to is refused at `wrap`, saying it defaults to one."""
    with pytest.raises(smt.Untraceable, match=r"`shifts` defaults to a `list`.*a tuple of"):
        smt.wrap(Listed(), frozen=["encoder"], store=store)


def test_the_traces_per_value_of_a_model_are_bounded(store: Store) -> None:
    """A forward is traced for at most so many sets of values of the arguments it branches
    on; a call with one more is refused, saying which arguments and what to do."""
    wrapped, model = _encoder_cached(Counted, store)
    x = torch.randn(3, 4)
    limit = smt.Wrapped.TRACES_PER_VALUE
    with torch.no_grad():
        for count in range(limit):
            assert torch.equal(wrapped(x, count), model(x, count))
        with pytest.raises(
            smt.WrapError, match=rf"traced {limit} times already for values of `count`"
        ):
            wrapped(x, limit)
        assert torch.equal(wrapped(x, 1), model(x, 1))


class CountedMasked(OnTempered):
    """Adds a count it branches on, and masks where it is handed a mask."""

    def forward(
        self, x: torch.Tensor, count: int = 0, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.encoder(x)
        h = h + count if count > 0 else h
        return h if mask is None else h * mask


def test_the_traces_bound_counts_values_traced_apart_for_arguments_left_none(
    store: Store,
) -> None:
    """Each set of values is traced apart for each set of arguments a call leaves None:
    the refusal at the bound counts traces, and says those left None count apart, where
    fewer values than the bound were given."""
    wrapped, model = _encoder_cached(CountedMasked, store)
    wrapped.TRACES_PER_VALUE = 3
    x, mask = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, 1), model(x, 1))
        with pytest.raises(
            smt.WrapError, match=r"traced 3 times.*apart again.*leaves None \(here `mask`"
        ):
            wrapped(x, 1, mask)


class ScalesAndPools(OnTempered):
    """Scales by a number it only computes with, and pools where asked."""

    def forward(self, x: torch.Tensor, scale: float = 1.0, pool: bool = False) -> torch.Tensor:
        h = self.encoder(x) * scale
        return h.mean(dim=0) if pool else h


def test_a_call_handing_a_tensor_past_the_traces_bound_runs(store: Store) -> None:
    """Past the bound, the refusal says to hand a number that changes as a tensor: a call
    doing so, its other values traced already, runs as the model does, for any tensor."""
    wrapped, model = _encoder_cached(ScalesAndPools, store)
    wrapped.TRACES_PER_VALUE = 3
    x = torch.randn(3, 4)
    with torch.no_grad():
        for scale in (2.0, 3.0):
            assert torch.equal(wrapped(x, scale), model(x, scale))
        with pytest.raises(smt.WrapError, match=r"traced 3 times.*as a tensor"):
            wrapped(x, 4.0)
        for scale in (torch.tensor(4.0), torch.tensor(5.0)):
            assert torch.equal(wrapped(x, scale), model(x, scale))
        with pytest.raises(smt.WrapError, match=r"traced 3 times"):
            wrapped(x, torch.tensor(4.0), True)


class MaskedEncoder(nn.Module):
    """Encodes, masking what it is handed a mask for."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.linear(x)
        return h if mask is None else h * mask


class HandsOnMask(nn.Module):
    """Hands its optional mask on to its declared encoder, twice, beside its input."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = MaskedEncoder()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x, mask=mask)
        return self.encoder(h.relu(), mask)


def test_a_declared_submodule_handed_an_argument_left_none_is_handed_none(
    store: Store,
) -> None:
    """A forward that hands an optional argument on to a declared submodule hands it None
    when a call leaves it None: the same node, keyed by None where it stands, so the
    answers with and without a mask are each recalled as they were computed; the wrapped
    model is pickled and copied so too."""
    wrapped, model = _encoder_cached(HandsOnMask, store)
    x, mask = torch.randn(3, 4), (torch.rand(3, 4) > 0.5).float()
    with torch.no_grad():
        for _ in range(2):
            for mode in (False, True):
                wrapped.train(mode)
                assert torch.equal(wrapped(x, mask), model(x, mask))
                assert torch.equal(wrapped(x), model(x))
                assert torch.equal(wrapped(x, mask=None), model(x))
    assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2, "recalled": 10}
    assert wrapped.counts["encoder~2"] == {"ran": 2, "kept": 2, "recalled": 10}
    assert sorted(wrapped.graph.nodes()) == ["encoder", "encoder~2", "fx_0"]
    held = io.BytesIO()
    torch.save(wrapped, held)
    held.seek(0)
    with torch.no_grad():
        for copied in (torch.load(held, weights_only=False), copy.deepcopy(wrapped)):
            assert torch.equal(copied(x), model(x))
            assert torch.equal(copied(x, mask), model(x, mask))


class Prompt(nn.Module):
    """A learned prompt, scaled by a context when handed one."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt = nn.Parameter(torch.randn(4))

    def forward(self, context: torch.Tensor | None) -> torch.Tensor:
        return self.prompt if context is None else self.prompt * context


class Prompted(nn.Module):
    """Hands its optional context, and nothing else, on to its declared prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt = Prompt()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return self.linear(x) + self.prompt(context)


def test_a_cached_submodule_handed_nothing_but_none_is_computed(store: Store) -> None:
    """A cached submodule a call hands nothing but None, an argument it left None, has
    nothing to be keyed by beside itself: it is computed, as in the model, and recalled
    again when it is handed a tensor."""
    torch.manual_seed(0)
    model = Prompted()
    wrapped = smt.wrap(model, frozen=["prompt"], cached=["prompt"], store=store)
    smt.freeze(wrapped)
    x, context = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(wrapped(x), model(x))
            assert torch.equal(wrapped(x, context), model(x, context))
    assert wrapped.counts["prompt"] == {"ran": 1, "kept": 1, "recalled": 1}


class Attention(nn.Module):
    """Weighs its query, keys and values apart, so each place tells."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.linear(q) + 2 * k + 3 * v


class Rows(nn.Module):
    """Answers the rows of its projection a slice it is handed picks."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        return self.linear(x)[rows]


class HandsOnASlice(nn.Module):
    """Hands its declared submodule a slice made of its input's length."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = Rows()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        n = x.shape[0] - 1
        h = self.rows(x, slice(0, n))
        return h if mask is None else h * mask[:n]


def _answers_with_a_mask_and_without(model: nn.Module, part: str, store: Store) -> None:
    """``model`` wrapped with its ``part`` frozen answers as it does, handed a mask and
    handed none."""
    wrapped = smt.wrap(model, frozen=[part], store=store)
    smt.freeze(wrapped)
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x, mask), model(x, mask))
        assert torch.equal(wrapped(x), model(x))


def test_a_declared_call_handed_a_slice_of_inputs_runs_when_an_argument_is_left_none(
    store: Store,
) -> None:
    """A declared call handed a slice made of an input (`slice(0, n)`) is the same call
    in the code traced with an argument None, and runs there as the forward does."""
    _answers_with_a_mask_and_without(HandsOnASlice(), "rows", store)


class Filled(nn.Module):
    """Adds the number it is handed, or zeroes what is not a number when handed NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, fill: float) -> torch.Tensor:
        h = self.linear(x)
        return torch.nan_to_num(h, nan=0.0) if fill != fill else h + fill


_NAN = float("nan")


class HandsOnNaN(nn.Module):
    """Hands its declared submodule a NaN constant."""

    def __init__(self) -> None:
        super().__init__()
        self.filled = Filled()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.filled(x, _NAN)
        return h if mask is None else h * mask


def test_a_declared_call_handed_a_nan_constant_runs_when_an_argument_is_left_none(
    store: Store,
) -> None:
    """A declared call handed a NaN constant is the same call in the code traced with an
    argument None: the constant is itself, as in the call's description."""
    _answers_with_a_mask_and_without(HandsOnNaN(), "filled", store)


class NamesOtherwise(nn.Module):
    """Hands its declared attention its keys and values by name, in one order when given a
    mask and in the other without one."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if mask is None:
            return self.attention(x, v=x * 2, k=y)
        return self.attention(x, k=y, v=x * 2) * mask


def test_a_declared_call_naming_its_arguments_in_another_order_runs_as_the_forward_does(
    store: Store,
) -> None:
    """A declared call handed its arguments by name in another order, in the code traced
    with an argument None, is the same call: each is handed where it is named, and the
    answer is recalled across the two."""
    torch.manual_seed(0)
    model = NamesOtherwise()
    wrapped = smt.wrap(model, frozen=["attention"], cached=["attention"], store=store)
    smt.freeze(wrapped)
    x, y, mask = torch.randn(3, 4), torch.randn(3, 4), torch.rand(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x, y, mask), model(x, y, mask))
        assert torch.equal(wrapped(x, y), model(x, y))
    assert wrapped.counts["attention"] == {"ran": 1, "kept": 1, "recalled": 1}


class AttendsToContext(nn.Module):
    """Attends to a context when given one, to its own input otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, context: torch.Tensor | None = None
    ) -> torch.Tensor:
        kv = x if context is None else context
        return self.attention(x, kv, kv) + memory


class AttendsToMemory(AttendsToContext):
    """Hands its memory in the values' place when no context is given, where it handed
    its input with one."""

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, context: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.attention(x, x, x)
        return self.attention(h, memory, h if context is not None else memory)


def test_a_declared_call_handed_its_inputs_in_other_places_runs_as_the_forward_does(
    store: Store,
) -> None:
    """Where a call that leaves an argument None hands a declared submodule the same
    input in two places, where the first trace handed two, the submodule is handed it in
    both; one handed two inputs where the first trace handed one in both is called so
    too, by code of its own, rather than run with the first trace's."""
    torch.manual_seed(0)
    model = AttendsToContext()
    wrapped = smt.wrap(model, frozen=["attention"], cached=["attention"], store=store)
    smt.freeze(wrapped)
    x, memory, context = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(wrapped(x, memory), model(x, memory))
            assert torch.equal(wrapped(x, memory, context), model(x, memory, context))
    assert wrapped.counts["attention"] == {"ran": 2, "kept": 2, "recalled": 2}
    other = AttendsToMemory()
    for cached in ([], ["attention"]):
        wrapped = smt.wrap(other, frozen=["attention"], cached=cached, store=store)
        smt.freeze(wrapped)
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(wrapped(x, memory, context), other(x, memory, context))
                assert torch.equal(wrapped(x, memory), other(x, memory))
    assert wrapped.counts["attention"] == {"ran": 1, "kept": 1, "recalled": 3}
    assert wrapped.counts["attention~2"] == {"ran": 2, "kept": 2, "recalled": 2}


class AttendsBothWays(nn.Module):
    """Calls its declared attention four times on the same two inputs, each time with them
    in other places: by name, in another order of the names, and by position, one of them
    twice."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, ...]:
        there = self.attention(q=x, k=context, v=context)
        back = self.attention(k=x, v=x, q=context)
        keys_between = self.attention(x, context, x)
        values_between = self.attention(x, context, context)
        return there, back, keys_between, values_between


def test_calls_of_a_cached_submodule_handing_its_inputs_in_other_places_are_keyed_apart(
    store: Store,
) -> None:
    """Two calls of a cached submodule handing it the same inputs in other places (named in
    another order, `attention(q=x, k=c, v=c)` and `attention(k=x, v=x, q=c)`, or one of
    them given twice, `attention(x, c, x)` and `attention(x, c, c)`) are keyed apart, each
    answered as the model answers it, rather than the second recalling the first's answer."""
    torch.manual_seed(0)
    model = AttendsBothWays()
    wrapped = smt.wrap(model, frozen=["attention"], cached=["attention"], store=store)
    smt.freeze(wrapped)
    x, context = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            for got, want in zip(wrapped(x, context), model(x, context), strict=True):
                assert torch.equal(got, want)
    for name in ("attention", "attention~2", "attention~3", "attention~4"):
        assert wrapped.counts[name] == {"ran": 1, "kept": 1, "recalled": 1}


class Shaped(nn.Module):
    """Scales by 2 when handed a tuple, by 3 when handed a dtype rather than its name, and
    by 4 when handed a dict keyed by an int rather than by its text."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, how: Any) -> torch.Tensor:
        h = self.linear(x)
        if isinstance(how, tuple):
            return h * 2
        if isinstance(how, torch.dtype):
            return h * 3
        if isinstance(how, dict) and 1 in how:
            return h * 4
        return h


class HandsTuplesAndLists(nn.Module):
    """Calls its declared encoder with a tuple and a list of the same items, with a dtype
    and the text its repr gives, and with dicts keyed by an int and by its text."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Shaped()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            self.encoder(x, (1, 2)),
            self.encoder(x, [1, 2]),
            self.encoder(x, torch.float32),
            self.encoder(x, "torch.float32"),
            self.encoder(x, {1: 0}),
            self.encoder(x, {"1": 0}),
        )


def test_calls_of_a_cached_submodule_handed_a_tuple_or_a_list_a_dtype_or_its_name_are_keyed_apart(
    store: Store,
) -> None:
    """A cached submodule handed a tuple and then a list of the same items, a dtype and
    then a string spelling it, or dicts keyed by an int and by its text, may answer each
    otherwise (`isinstance(how, tuple)`): the
    calls are keyed apart, each answered as the model answers it, rather than the second
    recalling the first's answer."""
    torch.manual_seed(0)
    model = HandsTuplesAndLists()
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            for got, want in zip(wrapped(x), model(x), strict=True):
                assert torch.equal(got, want)
    for name in ("encoder", *(f"encoder~{n}" for n in range(2, 7))):
        assert wrapped.counts[name] == {"ran": 1, "kept": 1, "recalled": 1}


class EncodesThrough(nn.Module):
    """Encodes what the module it is handed embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, embed: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        return self.linear(embed(x))


class HandsItsEmbedders(nn.Module):
    """Hands its encoder each of two embedders of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        self.encoder = EncodesThrough()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(x, self.first), self.encoder(x, self.second)


def test_a_cached_submodule_handed_a_module_is_refused(store: Store) -> None:
    """A cached submodule handed a module of the model is refused at `wrap`: the
    module is no constant, its weights are not in the key, so the answer computed through
    one embedder would be recalled for another, or for the same one once it trained; a
    frozen one not cached runs it, as the model does."""
    model = HandsItsEmbedders()
    with pytest.raises(smt.WrapError, match="`encoder` is cached and is handed a module"):
        smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    wrapped = smt.wrap(model, frozen=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.first.weight.mul_(2)
        for got, want in zip(wrapped(x), model(x), strict=True):
            assert torch.equal(got, want)


class MasksWhenGiven(OnTempered):
    """Calls its declared masker only when it is handed a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.masker = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x)
        if mask is not None:
            h = self.masker(h * mask)
        return h


class BranchesWithoutMask(OnTempered):
    """Branches on a tensor's value only when no mask is given, which fx cannot trace."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x)
        if mask is None and h.sum() > 0:
            return -h
        return h if mask is None else h * mask


class TakesOptions(OnTempered):
    """Takes an optional mask and any keyword arguments besides."""

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, **options: Any
    ) -> torch.Tensor:
        h = self.encoder(x)
        return h if mask is None else h * mask


def test_a_call_leaving_an_argument_none_that_cannot_be_traced_is_refused(
    store: Store,
) -> None:
    """Code traced with an argument None that calls the declared submodules otherwise, or
    that fx cannot trace, or a forward taking `**kwargs` traced again, is refused at the
    call that leaves it None, naming the argument; calls that give it run on."""
    x, mask = torch.randn(3, 4), torch.ones(3, 4)
    cases: list[tuple[nn.Module, list[str], type[Exception], str]] = [
        (
            MasksWhenGiven(),
            ["encoder", "masker"],
            smt.WrapError,
            r"differently when `mask` is None",
        ),
        (
            BranchesWithoutMask(),
            ["encoder"],
            smt.Untraceable,
            r"`mask` is None in this call.*h.sum\(\) >",
        ),
        (TakesOptions(), ["encoder"], smt.WrapError, r"`mask` is None in this call.*\*\*kwargs"),
    ]
    for model, frozen, kind, refused in cases:
        wrapped = smt.wrap(model, frozen=frozen, cached=["encoder"], store=store)
        smt.freeze(wrapped)
        with torch.no_grad():
            assert torch.equal(wrapped(x, mask), model(x, mask))
            for _ in range(2):  # refused again, not run by half-taken-in code
                with pytest.raises(kind, match=refused):
                    wrapped(x)
            assert torch.equal(wrapped(x, mask), model(x, mask))


class TakesOptionsAsking(OnTempered):
    """Takes any keyword arguments, and doubles for one only if it is `True`."""

    def forward(self, x: torch.Tensor, **options: Any) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 if options.get("double") is True else h


class TakesOptionsWithFlag(OnTempered):
    """Takes a flag it defaults to `True`, asked with `is`, and any keyword arguments."""

    def forward(self, x: torch.Tensor, double: bool = True, **options: Any) -> torch.Tensor:
        h = self.encoder(x)
        return h * 2 if double is True else h


def test_a_forward_taking_kwargs_handed_or_defaulting_a_plain_constant_is_refused(
    store: Store,
) -> None:
    """A forward taking `**kwargs` is traced once, with a stand-in for every argument,
    whose `is True` fx answers no: a call handing one a plain constant is refused naming
    it, and so is, at `wrap`, such a forward defaulting one to a plain constant; calls
    handing tensors run as the model does."""
    x = torch.randn(3, 4)
    model = TakesOptionsAsking()
    wrapped = _encoder_frozen(model, store)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x, scale=torch.ones(4)), model(x, scale=torch.ones(4)))
        with pytest.raises(smt.WrapError, match=r"`double` is handed the plain constant True"):
            wrapped(x, double=True)
    with pytest.raises(smt.WrapError, match=r"`double` defaults to the plain constant True"):
        smt.wrap(TakesOptionsWithFlag(), frozen=["encoder"], store=store)


def test_replacing_a_declared_submodule_is_refused(store: Store) -> None:
    """A declared submodule replaced after `wrap` is refused — on the wrapped model when it
    is assigned, on the model itself at the next forward — since its node holds the one
    it was declared with; assigning the same one again is no replacement."""
    wrapped, model = _projects(store)
    x = torch.randn(3, 4)
    wrapped.encoder = wrapped.encoder
    wrapped(x)
    with pytest.raises(smt.WrapError, match=r"`encoder` is declared .* Wrap the model again"):
        wrapped.encoder = Tempered()
    with pytest.raises(smt.WrapError, match="`encoder` is declared"):
        wrapped.add_module("encoder", Tempered())
    assert wrapped.encoder is model.encoder
    wrapped(x)
    model.encoder = Tempered()
    with pytest.raises(smt.WrapError, match=r"`encoder` is declared .* replaced after `wrap`"):
        wrapped(x)


class TrainsOnly(OnTempered):
    """Branches on a tensor value in train mode only, which fx cannot trace."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and h.sum() > 0:
            return h * 2
        return h


class TwiceInEval(OnTempered):
    """Calls its declared encoder once in train mode and twice in eval mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h if self.training else h + self.encoder(x * 2)


def test_a_model_traceable_in_one_mode_runs_only_in_that_mode(store: Store) -> None:
    """A model fx can trace in eval mode only runs in eval mode; in train mode it is refused,
    saying why, rather than running the code traced in eval mode."""
    model = TrainsOnly().eval()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    wrapped.train()
    with pytest.raises(smt.WrapError, match=r"wrapped in eval mode and is run in train mode"):
        wrapped(x)


def test_a_mode_fx_cannot_trace_is_refused_without_watching_the_model_anew(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call in the mode fx could not trace, with no other traces for that mode, is
    refused leaving what the model watches as it was: a refusal repeated (a training step
    caught and retried) does not rebuild the watch each time."""
    model = TrainsOnly().eval()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
    wrapped.train()
    watched: list[object] = []
    watch = _tracing.Tracing.watch
    monkeypatch.setattr(_tracing.Tracing, "watch", lambda self: watched.append(watch(self)))
    for _ in range(3):
        with pytest.raises(smt.WrapError, match=r"in eval mode only"):
            wrapped(x)
    assert watched == []


class TrainsOnlyWithoutMask(OnTempered):
    """Branches on a tensor value in train mode when no mask is given, which fx cannot
    trace."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x)
        if mask is None and self.training and h.sum() > 0:
            return h * 2
        return h if mask is None else h * mask


def test_a_call_leaving_an_argument_none_traceable_in_one_mode_says_so(store: Store) -> None:
    """Code traced with an argument None that fx can trace in eval mode only is refused in
    train mode, saying it is the argument left None that fx traced in eval mode only, not
    that the model was wrapped in eval mode, which it was not."""
    model = TrainsOnlyWithoutMask().train()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x, torch.ones(3, 4)), model(x, torch.ones(3, 4)))
        with pytest.raises(smt.WrapError, match=r"with `mask` None in eval mode only") as got:
            wrapped(x)
        assert "wrapped in eval mode" not in str(got.value)
        wrapped.eval()
        assert torch.equal(wrapped(x), model(x))


def test_declared_calls_that_differ_between_modes_are_refused() -> None:
    """A forward that calls its declared submodules differently in train and eval mode is
    refused at `wrap`: one graph cannot describe both."""
    with pytest.raises(smt.WrapError, match=r"differently in train and eval mode"):
        smt.wrap(TwiceInEval(), frozen=["encoder"])


class _Layers(nn.Module):
    """A frozen encoder, and layers after it whose CPU kernels see its answer's memory."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.encoder(x)))


def test_a_hit_answers_bit_for_bit_what_a_miss_answered(store: Store) -> None:
    """The recalled encoder output lies in memory aligned as torch's own, so the layers
    after it take the kernels they took on the miss: the model's answer on a hit is the
    one it gave on the miss, to the last bit."""
    torch.manual_seed(0)
    wrapped = smt.wrap(_Layers(), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(64, 4)
    miss, hit = wrapped(x), wrapped(x)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    assert torch.equal(miss, hit)
    graph = Graph.somatize(smt.ModuleNode(nn.Linear(4, 4)).named("e").frozen().cached())
    smt.freeze(graph)
    computed = graph.forward(Opaque(x), store=store)
    recalled = graph.forward(Opaque(x), store=store)
    assert graph.record is not None and graph.record.outcome["e"] == "recalled"
    assert computed.data_ptr() % 64 == 0 and recalled.data_ptr() % 64 == 0


# ------------------------------------------------------------------ what fx does not record


class Targets(OnTempered):
    """Computes a target without gradients beside a trainable head (an EMA teacher)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)
        self.target = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        with torch.no_grad():
            t = self.target(h)
        return self.head(h), t


def test_a_block_run_without_grad_gets_no_gradient_as_in_the_model(store: Store) -> None:
    """What the forward runs under `torch.no_grad()` gets no gradient in the wrapped model
    either, and the grad mode it runs in is put back after the block, as it was."""
    wrapped, model = _encoder_cached(Targets, store)
    x = torch.randn(5, 4)
    p, t = wrapped(x)
    assert p.requires_grad and not t.requires_grad
    (p.sum() + t.sum()).backward()
    assert model.target.weight.grad is None and model.head.weight.grad is not None
    assert torch.is_grad_enabled()
    with torch.no_grad():
        p, t = wrapped(x)
        assert not p.requires_grad and not torch.is_grad_enabled()
        assert torch.equal(p, model(x)[0]) and torch.equal(t, model(x)[1])


class StopsBefore(nn.Module):
    """Runs a trainable layer and the cached encoder after it without gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.encoder = Tempered()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.encoder(self.pre(x))
        return self.head(h)


def test_a_cached_call_inside_a_no_grad_block_runs_without_grad(store: Store) -> None:
    """A cached submodule called under the forward's own `torch.no_grad()` is handed what
    the model hands it, a tensor that needs no grad, and is recalled the next time."""
    wrapped, model = _encoder_cached(StopsBefore, store)
    x = torch.randn(3, 4)
    first, again = wrapped(x), wrapped(x)
    assert torch.equal(first, again) and torch.allclose(first, model(x))
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}


class Grads(OnTempered):
    """Turns grad mode on for a block, by context manager and by decorator."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    @torch.enable_grad()
    def _graded(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        with torch.set_grad_enabled(True):
            a = self.head(h)
        return a, self._graded(h), self.head(h)


def test_grad_mode_turned_on_in_the_forward_follows_the_mode_of_the_call(store: Store) -> None:
    """A block the forward runs with grad turned on gets gradients under the caller's
    `torch.no_grad()` too, and the code after it runs in the caller's mode again."""
    wrapped, model = _encoder_cached(Grads, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        plain = [t.requires_grad for t in model(x)]
        assert [t.requires_grad for t in wrapped(x)] == plain == [True, True, False]
        assert not torch.is_grad_enabled()


class Mixed(OnTempered):
    """Runs its encoder and head under bf16 autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.head(self.encoder(x))
        return out.float() + out


def test_a_block_run_under_autocast_runs_in_its_precision(store: Store) -> None:
    """What the forward runs under `torch.autocast` runs in that precision in the wrapped
    model too, the cached encoder keyed by it, and autocast is off again after the call."""
    torch.manual_seed(0)
    model = Mixed().eval()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
        first, again = wrapped(x), wrapped(x)
    assert first.dtype == expected.dtype == torch.float32
    assert torch.equal(first, expected) and torch.equal(again, expected)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
    assert not torch.is_autocast_enabled("cpu")
    with torch.no_grad():
        direct = wrapped.encoder(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert wrapped.encoder(x).dtype == torch.bfloat16 != direct.dtype


class Infers(OnTempered):
    """Computes a target under `torch.inference_mode()`."""

    def __init__(self) -> None:
        super().__init__()
        self.target = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        with torch.inference_mode():
            return self.target(h)


def test_a_block_run_under_inference_mode_runs_in_it(store: Store) -> None:
    """What the forward runs under `torch.inference_mode()` makes inference tensors in the
    wrapped model too."""
    model = Infers()
    wrapped = _encoder_frozen(model, store)
    out = wrapped(torch.randn(3, 4))
    assert out.is_inference() and model(torch.randn(3, 4)).is_inference()
    assert not torch.is_inference_mode_enabled()


class Switches(OnTempered):
    """Runs its head under autocast, on the device of its input, and under inference mode,
    as its caller asks."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, amp: bool = True, infer: bool = False) -> torch.Tensor:
        h = self.encoder(x)
        with (
            torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp),
            torch.inference_mode(infer),
        ):
            return self.head(h)


@pytest.mark.parametrize(("amp", "infer"), [(True, False), (False, True), (False, False)])
def test_a_block_switched_by_what_the_call_hands_the_forward_follows_it(
    store: Store, amp: bool, infer: bool
) -> None:
    """An autocast or inference-mode block made of what the forward is handed (the input's
    device, a flag) is made of what each call hands it."""
    wrapped, model = _encoder_cached(Switches, store)
    x = torch.randn(3, 4)
    out, expected = wrapped(x, amp, infer), model(x, amp, infer)
    assert torch.equal(out, expected) and out.dtype == expected.dtype
    assert out.is_inference() == expected.is_inference() == infer
    assert _modes() == (True, False, False)


class Fails(OnTempered):
    """Fails inside a no-grad block within autocast, on a batch of the wrong width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            return self.encoder(x) * 2


class FailsInferring(Fails):
    """Fails inside an inference-mode block, on a batch of the wrong width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.encoder(x) * 2


class SwitchesBetween(OnTempered):
    """Runs a layer after its encoder without gradients, and its head under bf16
    autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.middle = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        with torch.no_grad():
            h = self.middle(h)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.head(h)
        return h, out


def test_a_wrapped_model_loaded_from_torch_save_switches_the_modes_its_forward_does(
    store: Store,
) -> None:
    """A wrapped model whose forward switches grad mode and autocast is saved
    (`torch.save`), and the copy loaded switches them as the model does: fx makes the code
    anew as it loads it, and would have run the switches once then, kept none, and
    computed with gradients where the model has none. The modes are as they were after
    each call, and after loading."""
    wrapped, model = _encoder_cached(SwitchesBetween, store)
    x = torch.randn(3, 4)
    wrapped(x)
    held = io.BytesIO()
    torch.save(wrapped, held)
    held.seek(0)
    loaded = torch.load(held, weights_only=False)
    assert _modes() == (True, False, False)
    for copied in (loaded, wrapped):
        (h, out), (want_h, want_out) = copied(x), model(x)
        assert (h.requires_grad, out.dtype) == (want_h.requires_grad, want_out.dtype)
        assert (h.requires_grad, out.dtype) == (False, torch.bfloat16)
        assert torch.equal(h, want_h) and torch.equal(out, want_out)
        assert _modes() == (True, False, False)


def _modes() -> tuple[bool, bool, bool]:
    """Grad mode, CPU autocast and inference mode, as they are now."""
    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.is_inference_mode_enabled(),
    )


@pytest.mark.parametrize("kind", [Fails, FailsInferring])
def test_a_forward_that_fails_inside_a_block_leaves_the_modes_as_they_were(
    store: Store, kind: type[Fails]
) -> None:
    """A call that fails inside a no-grad, autocast or inference-mode block leaves the
    modes as they were before it, as the model's own blocks would on their way out."""
    model = kind()
    wrapped = _encoder_frozen(model, store)
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied"):
        wrapped(torch.randn(3, 5))
    assert _modes() == (True, False, False)
    x = torch.randn(3, 4)
    out, expected = wrapped(x), model(x)
    assert out.dtype == expected.dtype and out.is_inference() == expected.is_inference()


class RunsOutOfMemory(nn.Module):
    """Runs out of memory on a batch of more than four rows, as an encoder on a GPU does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return torch.tanh(self.linear(x))


class OnRunsOutOfMemory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = RunsOutOfMemory()
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def _in_halves(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``call(x)``, run again on each half of ``x`` where it runs out of memory: a loop's
    way with a batch too large for its device."""
    try:
        return call(x)
    except torch.OutOfMemoryError:
        half = len(x) // 2
        return torch.cat([_in_halves(call, x[:half]), _in_halves(call, x[half:])])


@pytest.mark.parametrize("kept", [True, False])
def test_a_cached_part_that_raises_raises_its_own_error_as_the_model_does(
    store: Store, kept: bool
) -> None:
    """A cached part that raises (a CUDA out-of-memory error on a batch too large) raises
    its own error, as the model does and as the same wrapped model without a store does:
    a loop that catches it and runs the batch in halves runs so, and every call after it
    answers as the model does, the halves recalled at the next pass."""
    model = OnRunsOutOfMemory()
    plain = copy.deepcopy(model).requires_grad_(False).eval()
    wrapped = _encoder_frozen(model, store if kept else None)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        wrapped(torch.randn(8, 4))
    x = torch.randn(16, 4)
    for _ in range(2):
        with torch.no_grad():
            assert torch.equal(_in_halves(wrapped, x), _in_halves(plain, x))
    assert not wrapped.encoder.training
    if kept:
        assert wrapped.counts["encoder"] == {"ran": 4, "kept": 4, "recalled": 4, "failed": 7}


def test_a_cached_part_that_raises_says_so_in_the_record(store: Store) -> None:
    """`wrapped.graph.record` says what the last cached call did: one whose part raised
    left it saying what the call before did (`recalled`), where a graph's record says the
    node failed, and with what."""
    wrapped = _encoder_frozen(OnRunsOutOfMemory(), store)
    x = torch.randn(4, 4)
    wrapped(x)
    wrapped(x)
    assert wrapped.graph.record is not None
    assert wrapped.graph.record.outcome == {"encoder": "recalled"}
    with pytest.raises(torch.OutOfMemoryError):
        wrapped(torch.randn(8, 4))
    assert wrapped.graph.record.outcome == {"encoder": "failed"}
    failed = [f for f in wrapped.graph.record.facts if f["fact"] == "failed"]
    assert failed == [{"fact": "failed", "node": "encoder", "error": "OutOfMemoryError"}]
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1, "failed": 1}


class Weighs(OnTempered):
    """Weighs its output by a matrix it makes from numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.eye(4) @ torch.tensor([1.0, 2.0, 3.0, 4.0]).diag()
        return self.head(self.encoder(x)) @ weights


@pytest.mark.parametrize(
    "around",
    [torch.no_grad, torch.inference_mode, lambda: torch.autocast("cpu", dtype=torch.bfloat16)],
    ids=["no-grad", "inference-mode", "autocast"],
)
def test_the_modes_wrap_is_called_in_leave_no_mark_on_the_wrapped_model(
    store: Store, around: Any
) -> None:
    """A model wrapped under `torch.no_grad()`, `torch.inference_mode()` or `torch.autocast`
    runs, and trains, as the model does: what fx runs once as it traces (a tensor made from
    numbers) is made as in a plain call, not as an inference tensor or in bf16."""
    torch.manual_seed(0)
    model = Weighs()
    with around():
        wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    out = wrapped(x)
    assert torch.equal(out, model(x))
    out.sum().backward()
    assert model.head.weight.grad is not None


class MakesConstants(OnTempered):
    """Adds tensors it makes from numbers, which fx keeps as constants, to its encoder's
    answer."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.encoder(x)
        return h + torch.ones(4), h + torch.linspace(0, 1, 4), h * torch.full((4,), 1 / 3)


class ReadsDefaultDtype(OnTempered):
    """Casts its encoder's answer to the default dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).to(torch.get_default_dtype())


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    was = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(was)


def _traces_counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that each trace taken from now on adds to (one a mode)."""
    traced: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        traced.append(True)
        return _split._traced(*args, **kwargs)

    monkeypatch.setattr(_tracing, "_traced", counted)
    return traced


@pytest.mark.parametrize("kind", [MakesConstants, ReadsDefaultDtype])
@pytest.mark.parametrize(
    ("wrapped_under", "called_under"),
    [(torch.float32, torch.float64), (torch.float64, torch.float32)],
    ids=["wrapped-float32", "wrapped-float64"],
)
def test_a_tensor_the_forward_makes_from_numbers_is_made_in_the_default_dtype_of_the_call(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    kind: type[nn.Module],
    wrapped_under: torch.dtype,
    called_under: torch.dtype,
) -> None:
    """fx makes a tensor the forward makes from numbers once, as it traces, in the default
    dtype of that moment, and keeps it (and the default dtype the forward reads): a call
    under another default dtype runs code traced under that one, traced once per default
    dtype, and answers as the model does, in its dtype and values."""
    torch.manual_seed(0)
    model = kind().eval()
    with _default_dtype(wrapped_under):
        wrapped = _encoder_frozen(model, store)
    traced = _traces_counted(monkeypatch)
    x = torch.randn(3, 4)
    for dtype in (called_under, wrapped_under, called_under, wrapped_under):
        with _default_dtype(dtype), torch.no_grad():
            got, want = wrapped(x), model(x)
        for one, other in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True):
            assert one.dtype == other.dtype
            assert torch.equal(one, other)
    assert len(traced) == 2  # train and eval mode, under the default dtype of the call


class AddsBuffer(OnTempered):
    """Adds a buffer it keeps to its encoder's answer: it makes no tensor of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) + self.shift * 2


def test_a_model_making_no_tensor_is_not_traced_again_under_another_default_dtype(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward that makes no tensor from numbers, nor reads the default dtype, keeps
    nothing the default dtype made: called under another, it answers as the model does,
    without a trace."""
    torch.manual_seed(0)
    model = AddsBuffer().eval()
    wrapped = _encoder_frozen(model, store)
    traced = _traces_counted(monkeypatch)
    x = torch.randn(3, 4)
    for dtype in (torch.float64, torch.float32):
        with _default_dtype(dtype), torch.no_grad():
            got, want = wrapped(x), model(x)
        assert got.dtype == want.dtype
        assert torch.equal(got, want)
    assert traced == []


class Checkpoints(OnTempered):
    """Runs a trainable block through `torch.utils.checkpoint`, which reads the modes."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, self.encoder(x), use_reentrant=False)


def test_torch_code_that_reads_the_modes_as_it_is_traced_is_wrapped(store: Store) -> None:
    """torch's own code that reads grad mode and autocast while it is traced keeps nothing
    it read in the code, and is wrapped as before."""
    model = Checkpoints()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    out = wrapped(x)
    assert torch.equal(out, model(x))
    out.sum().backward()
    assert model.block.weight.grad is not None


class ReadsGrad(OnTempered):
    """Branches on whether grad mode is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h if torch.is_grad_enabled() else h * 0


class ReadsAutocast(OnTempered):
    """Casts back when autocast is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h.float() if torch.is_autocast_enabled("cpu") else h


class LayerDrop(OnTempered):
    """Skips its middle layer at random while training, drawing from Python's `random`."""

    def __init__(self) -> None:
        super().__init__()
        self.middle = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and random.random() < 0.5:
            return h
        return self.middle(h)


class DrawsByName(LayerDrop):
    """LayerDrop drawing from a function of `random` imported by name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and draw_at_random() < 0.5:
            return h
        return self.middle(h)


class DrawsOwn(LayerDrop):
    """LayerDrop drawing from a generator of its own, through one of `random`'s methods
    written in Python (`randint` ends in a C method inside `random`)."""

    def __init__(self) -> None:
        super().__init__()
        self.chooser = random.Random(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and self.chooser.randint(0, 1):
            return h
        return self.middle(h)


class SeedsOwn(LayerDrop):
    """Seeds a generator of its own as it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.chooser = random.Random(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.chooser.seed(7)
        return self.middle(self.encoder(x))


class KeepsDraw(LayerDrop):
    """LayerDrop drawing through a function of `random` it keeps as an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.draw = random.random

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and self.draw() < 0.5:
            return h
        return self.middle(h)


class KeepsOwnDraw(KeepsDraw):
    """LayerDrop drawing through the method of a generator of its own, kept as an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.draw = random.Random(0).random


class DrawsSystem(LayerDrop):
    """LayerDrop drawing from a `random.SystemRandom`, which draws in methods of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.chooser = random.SystemRandom()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and self.chooser.randint(0, 1):
            return h
        return self.middle(h)


class DrawsNumpy(LayerDrop):
    """LayerDrop drawing from a NumPy generator of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.default_rng(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and self.rng.random() < 0.5:
            return h
        return self.middle(h)


class DrawsNumpyState(DrawsNumpy):
    """LayerDrop drawing from a legacy NumPy `RandomState` of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.RandomState(0)  # type: ignore[assignment]


class DrawsInAThread(OnTempered):
    """Draws from generators it keeps in another thread, which it waits for."""

    def __init__(self) -> None:
        super().__init__()
        self.draw = random.random
        self.chooser = random.SystemRandom()
        self.drawn: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def draws() -> None:
            self.drawn.extend([self.draw(), self.chooser.random()])

        thread = threading.Thread(target=draws)
        thread.start()
        thread.join()
        return self.encoder(x)


def test_draws_in_another_thread_while_a_model_is_traced_are_made() -> None:
    """What is replaced while a model is traced draws as ever in every other thread, and is
    put back after."""
    model = DrawsInAThread()
    drawing = vars(random.SystemRandom)["random"]
    smt.wrap(model, frozen=["encoder"])
    assert len(model.drawn) == 4 and all(0 <= d < 1 for d in model.drawn)
    assert model.draw == random.random and vars(random.SystemRandom)["random"] is drawing


def test_a_numpy_generator_a_part_keeps_is_its_own_again_after_a_trace() -> None:
    """A NumPy generator a part keeps is stood in for only while the model is traced: put
    back after, the very one, and drawn from as ever by a model wrapped in eval mode,
    which never draws in its forward."""
    model = DrawsNumpy().eval()
    rng = model.rng
    wrapped = smt.wrap(model, frozen=["encoder"])
    smt.freeze(wrapped)
    assert model.rng is rng and 0 <= model.rng.random() < 1
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))


class PicksKernel(OnTempered):
    """Attends with the attention kernel it picks for a block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.encoder(x).unsqueeze(0)
        with sdpa_kernel([SDPBackend.MATH]):
            return nn.functional.scaled_dot_product_attention(q, q, q)


class TurnsCudnnOff(LayerDrop):
    """Runs its middle layer with cuDNN turned off for a block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        with torch.backends.cudnn.flags(enabled=False):
            return self.middle(h)


class DrawsTorch(OnTempered):
    """Skips its middle layer at random while training, drawing a number from torch."""

    def __init__(self) -> None:
        super().__init__()
        self.middle = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.training and torch.rand([]) < 0.5:
            return h
        return self.middle(h)


class Reversed(torch.autograd.Function):
    """Hands the gradient back negated (a gradient reversal layer)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor) -> torch.Tensor:
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return -grad


class ReversesGradient(OnTempered):
    """Trains what comes before its middle layer against it, through an autograd Function
    of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.middle = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.middle(Reversed.apply(self.encoder(x)))


class ChecksPointsReentrant(Checkpoints):
    """Runs its trainable block through the reentrant `torch.utils.checkpoint`, an autograd
    Function whose forward runs the block without gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, self.encoder(x), use_reentrant=True)


@pytest.mark.parametrize(
    ("model", "refused"),
    [
        (ReadsGrad, r"\(`return h if torch\.is_grad_enabled.*reads `torch\.is_grad_enabled\(\)`"),
        (ReadsAutocast, r"\(`return h\.float\(\) if .*reads `torch\.is_autocast_enabled\(\)`"),
        (LayerDrop, r"\(`if self\.training and random.*Python's `random` \(`random\.random\(\)`"),
        (DrawsTorch, r"\(`if self\.training and torch\.rand.*torch's random number generator"),
        (
            DrawsByName,
            r"\(`if self\.training and draw_at_random.*Python's `random` \(`random\.random\(\)`",
        ),
        (DrawsOwn, r"\(`if self\.training and self\.chooser.*\(`random\.Random\.getrandbits\(\)`"),
        (SeedsOwn, r"\(`self\.chooser\.seed\(7\)`.*seeds Python's `random`"),
        (KeepsDraw, r"\(`if self\.training and self\.draw.*\(`random\.random\(\)`"),
        (KeepsOwnDraw, r"\(`if self\.training and self\.draw.*\(`random\.Random\.random\(\)`"),
        (
            DrawsSystem,
            r"\(`if self\.training and self\.chooser.*\(`random\.SystemRandom\.getrandbits",
        ),
        (
            DrawsNumpy,
            r"\(`if self\.training and self\.rng.*\(`numpy\.random\.Generator\.random\(\)`",
        ),
        (
            DrawsNumpyState,
            r"\(`if self\.training and self\.rng.*\(`numpy\.random\.RandomState\.random\(\)`",
        ),
        (PicksKernel, r"\(`with sdpa_kernel.*switches a flag of torch's backends"),
        (TurnsCudnnOff, r"\(`with torch\.backends\.cudnn\.flags.*_set_cudnn_enabled"),
        (ReversesGradient, r"\(`return self\.middle\(Reversed\.apply.*`Reversed\.apply`"),
        (ChecksPointsReentrant, r"\(`return checkpoint\(self\.block.*use_reentrant=False"),
    ],
    ids=[
        "grad-mode",
        "autocast",
        "python-random",
        "torch-random",
        "by-name",
        "own",
        "seeds",
        "kept",
        "own-kept",
        "subclass",
        "numpy-generator",
        "numpy-state",
        "sdpa-kernel",
        "backend-flags",
        "autograd-function",
        "reentrant-checkpoint",
    ],
)
def test_a_forward_that_reads_what_fx_would_fix_is_refused(
    model: type[nn.Module], refused: str
) -> None:
    """A forward that reads grad mode, autocast or a random number while it is traced,
    switches a flag of torch's backends, or calls an autograd Function (a reentrant
    checkpoint is one), is refused, naming what it did and where: fx would keep the value it
    read then, and the wrapped model would take one branch in every call, drop the switch,
    or compute the Function's gradient as that of its forward."""
    with pytest.raises(smt.Untraceable, match=rf"(?s){refused}.*wrap just the submodule"):
        smt.wrap(model().train(), frozen=["encoder"])


class ImportsAsItRuns(LayerDrop):
    """Imports a module the first time it runs, whose code makes and seeds a generator of
    its own as it is imported (as sympy does, which torch imports the first time it needs
    it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import importlib

        importlib.import_module(self.imported)
        return self.middle(self.encoder(x))


def test_a_module_imported_as_the_forward_runs_may_seed_a_generator_as_it_is(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code a module runs as the forward first imports it (a generator made and seeded,
    a number drawn) runs once in any process, not at each call: the forward is traced,
    and the wrapped model computes as the model does."""
    name = f"seeds_on_import_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "import random\nchooser = random.Random()\nchooser.seed(7)\nDRAWN = chooser.random()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model = ImportsAsItRuns().train()
    model.imported = name
    try:
        wrapped = _encoder_frozen(model, store)
        x = torch.randn(3, 4)
        with torch.no_grad():
            assert torch.equal(wrapped(x), model(x))
    finally:
        sys.modules.pop(name, None)


def test_a_forward_that_makes_torch_import_sympy_is_traced(tmp_path: Path) -> None:
    """The first trace in a process of a forward that has torch import sympy
    (``torch.from_numpy``), whose code seeds a generator of its own as it is imported, is
    not refused as seeding Python's `random`."""
    code = (
        "import sys, numpy as np, torch\n"
        "from torch import nn\n"
        "sys.path.insert(0, 'tests')\n"
        "import somatize.torch as smt\n"
        "from test_torch_wrap import LayerDrop\n"
        "if 'sympy' in sys.modules:\n"
        "    print('loaded with torch'); sys.exit()\n"
        "class FromNumpy(LayerDrop):\n"
        "    def forward(self, x):\n"
        "        return self.middle(self.encoder(x)) + torch.from_numpy(np.ones(4, 'float32'))\n"
        "model = FromNumpy().train()\n"
        "wrapped = smt.wrap(model, frozen=['encoder'], cached=['encoder'], "
        f"store={str(tmp_path / 'store')!r})\n"
        "smt.freeze(wrapped)\n"
        "x = torch.randn(3, 4)\n"
        "with torch.no_grad():\n"
        "    assert torch.equal(wrapped(x), model(x))\n"
        "print('traced')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.stdout.split() == ["loaded", "with", "torch"]:
        pytest.skip("needs a torch that imports sympy lazily: torch 2.4 imports it with itself")
    assert done.stdout.split() == ["traced"], done.stderr[-2000:]


def test_a_forward_that_draws_at_random_in_train_mode_only_runs_in_eval_only(
    store: Store,
) -> None:
    """A forward that draws a random number in train mode only, wrapped in eval mode, runs
    in eval mode and is refused in train mode, saying why."""
    model = LayerDrop().eval()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
    wrapped.train()
    with pytest.raises(smt.WrapError, match=r"(?s)in eval mode only.*random\.random"):
        wrapped(x)


class HelpedBlock(nn.Module):
    """A block the model's forward is traced into, with a helper of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def shift(self, h: torch.Tensor) -> torch.Tensor:
        return h + 1

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.shift(self.linear(h))


class Patchable(OnTempered):
    """A declared encoder, then a block traced into, then a helper of the model's own."""

    def __init__(self) -> None:
        super().__init__()
        self.block = HelpedBlock()

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        return h * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(self.block(self.encoder(x)))


def _doubled_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.encoder(x) * 2


@pytest.mark.parametrize(
    ("where", "name", "value"),
    [(Patchable, "forward", _doubled_forward), (HelpedBlock, "forward", lambda self, h: h)],
    ids=["the model's", "a block's"],
)
def test_a_forward_set_on_a_class_the_trace_went_through_after_wrap_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch, where: type, name: str, value: Any
) -> None:
    """fx traced the code of the model's class and of the blocks it went through into what
    the wrapped model runs: a forward set on one of those classes after `wrap` would not
    run there, so the call is refused, naming it, until it is set back; a dunder that
    holds no code (`__slotnames__`) is not code. (A helper the forward reads,
    `self.finish`, is a value read from the model, refused as one.)"""
    wrapped, model = _encoder_cached(Patchable, store)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        # What no code reads, set on the class (a copy of an instance adds it), is not code.
        monkeypatch.setattr(where, "__slotnames__", [], raising=False)
        assert torch.equal(wrapped(x), model(x))
        monkeypatch.setattr(where, name, value)
        with pytest.raises(
            smt.WrapError, match=rf"`{where.__qualname__}.{name}` .*Wrap the model again"
        ):
            wrapped(x)
        monkeypatch.undo()
        assert torch.equal(wrapped(x), model(x))


def test_a_method_set_on_a_cached_submodule_s_class_after_wrap_is_seen(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached submodule runs the code its class holds when it is called: a method set on
    the class after `wrap` is its code from then on, and an answer the old code kept is
    recalled as drifted, never silently."""
    wrapped, _ = _encoder_cached(Patchable, store)
    x = torch.randn(2, 4)
    with torch.no_grad():
        first = wrapped(x)
        monkeypatch.setattr(Tempered, "forward", lambda self, x: self.linear(x) * 0)
        with pytest.warns(Drifted, match="`encoder` was recalled"):
            assert torch.equal(wrapped(x), first)


class _SubConfig:
    def __init__(self) -> None:
        self.x = 1.0


class _Config:
    """A config as Hugging Face models keep one: a plain object, read in forward."""

    def __init__(self, flag: bool = False) -> None:
        self.flag = flag
        self.scale = 2.0
        self.sub = _SubConfig()

    @property
    def doubled(self) -> bool:
        return self.flag and self.scale > 1.0


@dataclasses.dataclass
class _FrozenConfig:
    gain: float = 1.0


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, double: bool = False) -> torch.Tensor:
        h = self.linear(x)
        return h * 2.0 if double else h


class _Block(nn.Module):
    """Traced into; shares its model's config."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self.config = config
        self.linear = nn.Linear(4, 4)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h) + self.config.sub.x


class Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.extra = _FrozenConfig()
        self.encoder = _Encoder()
        self.block = _Block(self.config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x, self.config.flag) * self.config.scale
        if self.config.doubled:
            h = h + 1.0
        return self.block(h) * self.extra.gain


class ReadsArrays(nn.Module):
    """Makes tensors of numpy arrays it keeps, itself and in a config: fx traces what it
    made of them into the code as constants."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.anchors = np.ones(4, dtype=np.float32)
        self.config = types.SimpleNamespace(scales=np.ones(4, dtype=np.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        anchors = torch.from_numpy(self.anchors.copy())
        scales = torch.from_numpy(self.config.scales.copy())
        out: torch.Tensor = self.head(self.encoder(x) * anchors * scales)
        return out


@pytest.mark.parametrize("where", ["anchors", "config.scales"])
def test_a_numpy_array_the_model_holds_written_after_wrap_is_refused_not_run_as_traced(
    store: Store, where: str
) -> None:
    """A numpy array the traced forward read, written in place after ``wrap`` (numpy keeps
    no version counter), is refused at the next call, naming it: the wrapped model would
    go on computing with the tensor traced into its code."""
    __import__("sympy")  # which torch imports as it first makes a tensor of an array
    wrapped, model = _encoder_cached(ReadsArrays, store)
    x = torch.randn(3, 4)
    wrapped(x)
    array = model.anchors if where == "anchors" else model.config.scales
    array[0] = 5.0
    with pytest.raises(smt.WrapError, match=rf"numpy array `{where}` was written in place"):
        wrapped(x)
    array[0] = 1.0  # as it was traced: taken as it is
    wrapped(x)


def _scaled_by(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t * k


class CallsHeldFunctions(nn.Module):
    """Calls a function it keeps, and one its config keeps: fx traces each into the code
    with the values it closes over and its defaults as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.act = _scaled_by(1.0)
        self.config = types.SimpleNamespace(act=_scaled_by(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.config.act(self.act(self.encoder(x))))
        return out


@pytest.mark.parametrize("change", ["closed over", "config's closed over", "default"])
def test_a_function_the_model_holds_changed_after_wrap_is_refused_not_run_as_traced(
    store: Store, change: str
) -> None:
    """A function the traced forward called, whose closed-over value was set anew or whose
    default was replaced after ``wrap``, is refused at the next call, naming it: the
    wrapped model would go on computing with the values traced into its code."""
    torch.manual_seed(0)
    model = CallsHeldFunctions()
    if change == "default":
        model.act = lambda t, s=1.0: t * s
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    wrapped(x)
    held = model.config.act if change == "config's closed over" else model.act
    if change == "default":
        held.__defaults__ = (5.0,)
    else:
        assert held.__closure__ is not None
        held.__closure__[0].cell_contents = 5.0
    where = "config.act" if change == "config's closed over" else "act"
    with pytest.raises(smt.WrapError, match=rf"`{where}` .* closes over, or a default"):
        wrapped(x)


def _scaled_by_item(held: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(held, list):
        return lambda t: t * held[0]
    if isinstance(held, dict):
        return lambda t: t * held["k"]
    return lambda t: t * torch.tensor(held)  # a copy of the array, made as fx traces


@pytest.mark.parametrize("held", ["list", "dict", "array"])
def test_what_a_function_the_model_holds_closes_over_changed_in_place_is_refused(
    store: Store, held: str
) -> None:
    """A list, dict or numpy array a function the traced forward called closes over,
    changed in place after ``wrap`` (an item set, the array written), is refused at the
    next call, naming the function: fx traced what it read of it into the code as it was,
    and the wrapped model would go on computing with that; put back, the call runs."""
    torch.manual_seed(0)
    model = CallsHeldFunctions()
    value: Any = {"list": [1.0], "dict": {"k": 1.0}, "array": np.ones(4, dtype=np.float32)}[held]
    model.act = _scaled_by_item(value)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    first = wrapped(x)
    where, was = (0, 1.0) if held != "dict" else ("k", 1.0)
    value[where] = 3.0
    with pytest.raises(smt.WrapError, match=r"`act` .* closes over, or a default"):
        wrapped(x)
    value[where] = was
    with torch.no_grad():
        assert torch.equal(wrapped(x), first)


def _times_first(gains: list[float], t: torch.Tensor) -> torch.Tensor:
    return t * gains[0]


def _scaled_by_first(t: torch.Tensor, gains: list[float]) -> torch.Tensor:
    return t * gains[0]


def _applied(act: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> torch.Tensor:
    return act(t)


def _doubled(t: torch.Tensor) -> torch.Tensor:
    return t * 2.0


def _partial_kept(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``functools.partial`` of the kind named, which the traced forward calls."""
    if kind == "keyword":
        return functools.partial(torch.clamp, min=0.0, max=6.0)
    if kind == "argument list":
        return functools.partial(_times_first, [2.0])
    if kind == "keyword list":
        return functools.partial(_scaled_by_first, gains=[2.0])
    return functools.partial(_applied, functools.partial(torch.mul, other=2.0))


def _change_partial(act: Any, kind: str, value: float) -> float:
    """Sets what ``act`` (made by :func:`_partial_kept`) binds to ``value``, in place, and
    says what it bound before."""
    if kind == "keyword":
        held, at = act.keywords, "max"
    elif kind == "argument list":
        held, at = act.args[0], 0
    elif kind == "keyword list":
        held, at = act.keywords["gains"], 0
    else:
        held, at = act.args[0].keywords, "other"
    was: float = held[at]
    held[at] = value
    return was


_PARTIALS = ["keyword", "argument list", "keyword list", "nested"]


@pytest.mark.parametrize("kind", _PARTIALS)
def test_what_a_partial_the_model_holds_binds_changed_in_place_is_refused(
    store: Store, kind: str
) -> None:
    """A ``functools.partial`` the traced forward called, whose keywords or a list it binds
    (or those of a partial it binds) were changed in place after ``wrap``, is refused at the
    next call, naming it, as a function whose closed-over value changed is: fx traced what
    it binds into the code as it was, and the wrapped model would go on computing with
    that; put back, the call runs."""
    torch.manual_seed(0)
    model = CallsHeldFunctions()
    model.act = _partial_kept(kind)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = wrapped(x)
        assert torch.equal(first, model(x))
        was = _change_partial(model.act, kind, 0.5)
        with pytest.raises(smt.WrapError, match=r"`act` .* binds, or what its function"):
            wrapped(x)
        _change_partial(model.act, kind, was)  # the very value it bound: taken as it is
        assert torch.equal(wrapped(x), first)


class CallsHeldFunction(nn.Module):
    """Calls a function it keeps, which pickles (by its name, a partial with what it
    binds)."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.act(self.encoder(x)))
        return out


def _pickled_and_copied(wrapped: smt.Wrapped) -> list[smt.Wrapped]:
    """``wrapped`` pickled (``torch.save``) and loaded, and deep-copied."""
    held = io.BytesIO()
    torch.save(wrapped, held)
    held.seek(0)
    return [torch.load(held, weights_only=False), copy.deepcopy(wrapped)]


@pytest.mark.parametrize("kind", ["function", *_PARTIALS])
def test_a_wrapped_model_calling_a_function_or_partial_it_holds_is_pickled_and_copied(
    store: Store, kind: str
) -> None:
    """A wrapped model whose forward calls a function or a ``functools.partial`` it keeps
    is pickled and copied, and each copy answers as the model does; what the copy holds is
    watched in the copy (a partial is copied with what it binds): changed there, the copy's
    call is refused and the model's runs, and one changed before the copy is refused by
    the copy too."""
    torch.manual_seed(0)
    model = CallsHeldFunction(_doubled if kind == "function" else _partial_kept(kind))
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        for copied in _pickled_and_copied(wrapped):
            assert torch.equal(copied(x), model(x))
            assert torch.equal(copied(x), copied.model(x))
            if kind == "function":
                continue
            _change_partial(copied.model.act, kind, 0.5)
            with pytest.raises(smt.WrapError, match=r"`act` .* binds, or what its function"):
                copied(x)
            assert torch.equal(wrapped(x), model(x))
        if kind == "function":
            return
        _change_partial(model.act, kind, 0.5)
        for copied in _pickled_and_copied(wrapped):
            with pytest.raises(smt.WrapError, match=r"`act` .* binds, or what its function"):
                copied(x)


class _EncoderWithAct(nn.Module):
    """An encoder that calls a function it keeps."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.lin(x))
        return out


class EncoderCallsHeldFunction(nn.Module):
    """Its declared encoder calls a function it keeps, which its key names."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.encoder = _EncoderWithAct(act)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


@pytest.mark.parametrize("kind", ["function", "keyword"])
def test_a_wrapped_model_whose_frozen_part_calls_a_function_it_holds_is_pickled(
    store: Store, kind: str
) -> None:
    """A wrapped model whose frozen, cached encoder keeps a function or a partial it calls
    is pickled and copied once it ran (its settings watched), and each copy answers as the
    model does, recalling the encoder's answer: the copy's encoder is watched afresh."""
    torch.manual_seed(0)
    act = _doubled if kind == "function" else _partial_kept(kind)
    model = EncoderCallsHeldFunction(act)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        for copied in _pickled_and_copied(wrapped):
            assert torch.equal(copied(x), model(x))
            assert copied.counts["encoder"]["recalled"] == 1


class _Scaler:
    """Scales what it is given by ``s``: a plain object whose method a model keeps."""

    def __init__(self, s: float) -> None:
        self.s = s

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


@pytest.mark.parametrize("where", ["traced", "cached"])
def test_a_value_the_object_of_a_kept_method_holds_changed_after_wrap_is_seen(
    store: Store, where: str
) -> None:
    """A method a model keeps (``self.act = scaler.apply``) whose object's value
    (``scaler.s``) changed in place after ``wrap``: called by the traced forward, which fx
    traced into with the value it read then, the next call is refused, naming it, as a
    function whose closed-over value changed is; kept by the cached encoder, it keys the
    encoder's answers anew, computed as the model computes them now. Set back, the call
    runs and answers as first."""
    torch.manual_seed(0)
    scaler = _Scaler(2.0)
    if where == "traced":
        model: nn.Module = CallsHeldFunction(scaler.apply)
    else:
        model = EncoderCallsHeldFunction(scaler.apply)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = wrapped(x)
        assert torch.equal(first, model(x))
        scaler.s = 3.0
        if where == "traced":
            with pytest.raises(smt.WrapError, match=r"the method `act` .* is bound to"):
                wrapped(x)
        else:
            assert torch.equal(wrapped(x), model(x))
            assert wrapped.counts["encoder"] == {"ran": 2, "kept": 2}
        scaler.s = 2.0
        assert torch.equal(wrapped(x), first)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m.config, "flag", True),
        lambda m: setattr(m.config, "scale", 3.0),
        lambda m: setattr(m.config.sub, "x", 5.0),
        lambda m: setattr(m.block.config, "flag", True),
        lambda m: setattr(m, "extra", _FrozenConfig(gain=4.0)),
        lambda m: setattr(m, "config", _Config(flag=True)),
    ],
    ids=["flag", "number", "nested", "shared", "dataclass replaced", "config replaced"],
)
def test_a_value_read_from_a_config_the_model_holds_is_traced_again_once_changed(
    store: Store, change: Any
) -> None:
    """fx traces what the forward reads of a plain object a module holds (a Hugging Face
    `self.config.output_hidden_states`) into the code: changed after `wrap`, the forward is
    traced again for the new values, and the cached encoder, called with the flag, keys
    its answers apart by it; set back, the traces taken first run again."""
    wrapped, model = _encoder_cached(Configured, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = model(x)
        assert torch.equal(wrapped(x), first)
        change(model)
        for _ in range(2):  # computed, then recalled
            expected = model(x)
            assert torch.equal(wrapped(x), expected)
        assert not torch.equal(expected, first)
        model.config = model.block.config
        model.config.flag = False
        model.config.scale, model.config.sub.x, model.extra = 2.0, 1.0, _FrozenConfig()
        assert torch.equal(wrapped(x), model(x))
        assert torch.equal(wrapped(x), model(x))


class SkipsByConfig(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.encoder = _Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.flag:
            return x * self.config.scale
        return self.encoder(x) * self.config.scale


def test_a_config_change_traced_again_is_bounded_and_kept_to_the_declared_calls(
    store: Store,
) -> None:
    """A config changed so that the forward calls other declared submodules is refused,
    naming it, until set back; a value changed call after call is traced a bounded number
    of times, then refused naming it."""
    wrapped, model = _encoder_cached(SkipsByConfig, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.config.flag = True
        with pytest.raises(smt.WrapError, match=r"differently when what it read .* config"):
            wrapped(x)
        model.config.flag = False
        assert torch.equal(wrapped(x), model(x))
        wrapped.TRACES_PER_VALUE = 3
        for scale in (3.0, 4.0):
            model.config.scale = scale
            assert torch.equal(wrapped(x), model(x))
        model.config.scale = 5.0
        with pytest.raises(
            smt.WrapError, match=r"`config\.scale` was 4\.0 .* is 5\.0 now.*3 times"
        ):
            wrapped(x)
        model.config.scale = 2.0
        assert torch.equal(wrapped(x), model(x))


class IteratesByConfig(nn.Module):
    """Iterates over what its encoder answers where its config says so, as a Hugging Face
    model builds its tuple answer (`(h,) + tuple(out[1:])`) where `return_dict` is False:
    fx cannot trace that."""

    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.encoder = _Encoder()

    def forward(self, x: torch.Tensor) -> Any:
        h = self.encoder(x)
        if self.config.flag:
            return tuple(h)
        return h * self.config.scale


def test_a_config_change_fx_cannot_trace_is_refused_until_set_back(store: Store) -> None:
    """A config changed so that fx cannot trace the forward is refused, naming the line;
    set back, the model runs the code traced first again, recalling what it kept; changed
    to other values fx can trace, it is traced for them."""
    wrapped, model = _encoder_cached(IteratesByConfig, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = wrapped(x)
        model.config.flag = True
        for _ in range(2):
            with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
                wrapped(x)
        model.config.flag = False
        assert torch.equal(wrapped(x), first)
        assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}
        model.config.flag = True
        with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
            wrapped(x)
        model.config.flag, model.config.scale = False, 3.0
        assert torch.equal(wrapped(x), model(x))
        assert not torch.equal(model(x), first)


def test_a_call_fx_cannot_trace_for_a_config_is_refused_again_without_a_trace(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call fx cannot trace in either mode for what the config holds is refused again
    without tracing it again while the config holds the same; set back, or changed to
    other values fx can trace, it runs as the model does."""
    wrapped, model = _encoder_cached(IteratesByConfig, store)
    refused_again_untraced(model, wrapped, monkeypatch)


def refused_again_untraced(
    model: IteratesByConfig, call: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``call`` (a wrapped ``model``, or it compiled), refused naming the line where the
    config's flag is set, traces nothing at the refusals after the first; it answers as the
    model with the flag set back, and with another scale."""
    traces: list[bool] = []
    real = _tracing._traced

    def counted(*args: Any, **kwargs: Any) -> Any:
        traces.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(_tracing, "_traced", counted)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(call(x), model(x))
        model.config.flag = True
        with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
            call(x)
        traces.clear()
        for _ in range(2):
            with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
                call(x)
        assert traces == []
        model.config.flag = False
        assert torch.equal(call(x), model(x))
        model.config.flag = True
        with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
            call(x)
        model.config.flag, model.config.scale = False, 3.0
        assert torch.equal(call(x), model(x))
        assert traces  # the new scale was traced


class IteratesByConfigWhenNone(IteratesByConfig):
    """Reads its config only where a call leaves `mask` None: the first trace, `mask`
    given, reads none of it."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        h = self.encoder(x)
        if mask is None:
            if self.config.flag:
                return tuple(h)
            return h * self.config.scale
        return h * mask


def test_a_call_fx_cannot_trace_for_a_config_runs_once_the_config_is_set_back(
    store: Store,
) -> None:
    """A call fx cannot trace for what the config holds, where the traces taken before
    read none of it, is refused; set back, the same call is traced and runs."""
    wrapped, model = _encoder_cached(IteratesByConfigWhenNone, store)
    x, mask = torch.randn(3, 4), torch.ones(4)
    with torch.no_grad():
        assert torch.equal(wrapped(x, mask), model(x, mask))
        model.config.flag = True
        with pytest.raises(smt.Untraceable, match=r"return tuple\(h\)"):
            wrapped(x)
        model.config.flag = False
        assert torch.equal(wrapped(x), model(x))


class IteratesByConfigInTrain(IteratesByConfig):
    """Reads its config's flag in train mode only: fx traces eval mode reading none of it."""

    def forward(self, x: torch.Tensor) -> Any:
        h = self.encoder(x)
        if self.training and self.config.flag:
            return tuple(h)
        return h * self.config.scale


def test_a_mode_fx_cannot_trace_for_a_config_runs_once_the_config_is_set_back(
    store: Store,
) -> None:
    """A config changed so that fx traces the forward in eval mode only (which reads none
    of it) refuses a call in train mode; set back, train mode runs the code traced first."""
    torch.manual_seed(0)
    model = IteratesByConfigInTrain().eval()
    wrapped = _encoder_frozen(model, store)
    refused_in_train_until_set_back(model, wrapped, wrapped)


def refused_in_train_until_set_back(
    model: IteratesByConfigInTrain, wrapped: smt.Wrapped, call: Callable[..., Any]
) -> None:
    """``call`` (``wrapped``, or it compiled) answers as ``model`` in eval mode whatever
    its flag; in train mode with the flag set it is refused naming the line fx could not
    trace, and with the flag set back it answers as the model."""
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(call(x), model(x))
        model.config.flag = True
        assert torch.equal(call(x), model(x))
        wrapped.train()
        for _ in range(2):
            with pytest.raises(smt.WrapError, match=r"return tuple\(h\)"):
                call(x)
        model.config.flag = False
        assert torch.equal(call(x), model(x))


class _VitConfig:
    """A Hugging Face config: the defaults the forward's optional arguments resolve to."""

    def __init__(self) -> None:
        self.output_hidden_states = False
        self.output_attentions = False
        self.use_return_dict = True


class _VitPatches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 4, 4)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        _, channels, _, _ = pixel_values.shape
        if channels != 3:
            raise ValueError(f"expected 3 channels, got {channels}")
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class _VitLayer(nn.Module):
    def __init__(self, checks_size: bool = False) -> None:
        super().__init__()
        self.checks_size = checks_size
        self.norm = nn.LayerNorm(8)
        self.mix = nn.Linear(8, 8)

    def forward(self, hidden: torch.Tensor, output_attentions: bool = False) -> tuple[Any, ...]:
        if self.checks_size:
            _, _, size = hidden.shape
            # A branch on a shape: fx cannot trace it.
            if size != 8:
                raise ValueError(f"hidden size {size} != 8")
        mixed = self.mix(self.norm(hidden))
        out: tuple[Any, ...] = (hidden + mixed,)
        if output_attentions:
            out = out + (mixed.softmax(-1),)  # noqa: RUF005 - as Hugging Face writes it
        return out


class HuggingFaceVit(nn.Module):
    """A ViT as Hugging Face writes one: optional arguments resolved from the config when
    None, hidden states and attentions gathered in a loop when asked, and a dict or a
    tuple answered."""

    def __init__(self, checks_size: bool = False) -> None:
        super().__init__()
        self.config = _VitConfig()
        self.embeddings = _VitPatches()
        self.layers = nn.ModuleList([_VitLayer(checks_size) for _ in range(2)])
        self.norm = nn.LayerNorm(8)

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> Any:
        output_attentions = (
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states
            if output_hidden_states is not None
            else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict
        hidden = self.embeddings(pixel_values)
        all_hidden_states: tuple[Any, ...] | None = () if output_hidden_states else None
        all_attentions: tuple[Any, ...] | None = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                assert all_hidden_states is not None
                all_hidden_states = all_hidden_states + (hidden,)  # noqa: RUF005
            out = layer(hidden, output_attentions)
            hidden = out[0]
            if output_attentions:
                assert all_attentions is not None
                all_attentions = all_attentions + (out[1],)  # noqa: RUF005
        if output_hidden_states:
            assert all_hidden_states is not None
            all_hidden_states = all_hidden_states + (hidden,)  # noqa: RUF005
        hidden = self.norm(hidden)
        if not return_dict:
            return tuple(v for v in (hidden, all_hidden_states, all_attentions) if v is not None)
        return {
            "last_hidden_state": hidden,
            "hidden_states": all_hidden_states,
            "attentions": all_attentions,
        }


def _same_answer(got: Any, want: Any) -> bool:
    """Whether two answers are the same structure holding equal tensors (and Nones)."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(want)
    return got_spec == want_spec and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(got_leaves, want_leaves, strict=True)
    )


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_hugging_face_vit_answers_as_itself_for_every_set_of_its_optional_arguments(
    store: Store, training: bool
) -> None:
    """A ViT written as Hugging Face writes one (`() if output_hidden_states else None`,
    each optional argument resolved from `self.config` when None) answers exactly as the
    model itself for every set of `output_hidden_states`, `output_attentions` and
    `return_dict` (None, True, False; by name and by place), called in any order, each
    set twice, computed then recalled, and after the config changes: no call is answered
    with what was traced or kept for another set."""
    torch.manual_seed(0)
    model = HuggingFaceVit()
    wrapped = smt.wrap(model, frozen=["embeddings"], cached=["embeddings"], store=store)
    smt.freeze(wrapped)
    wrapped.train(training)
    pixels = [torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)]
    sets = [
        (hidden, attentions, as_dict)
        for hidden in (None, True, False)
        for attentions in (None, True, False)
        for as_dict in (None, True, False)
    ]
    order = sets + sets[::-1] + random.Random(0).sample(sets, len(sets))
    with torch.no_grad():
        for at, (hidden, attentions, as_dict) in enumerate(order):
            x = pixels[at % 2]
            if at == len(sets):
                model.config.output_hidden_states = True
            if at == 2 * len(sets):
                model.config.output_attentions, model.config.use_return_dict = True, False
            named = {
                "output_hidden_states": hidden,
                "output_attentions": attentions,
                "return_dict": as_dict,
            }
            want = model(x, **named)
            assert _same_answer(wrapped(x, **named), want), (at, named)
            assert _same_answer(wrapped(x, hidden, attentions, as_dict), want), (at, named)
            left_out = {name: value for name, value in named.items() if value is not None}
            assert _same_answer(wrapped(x, **left_out), want), (at, named)


def test_a_hugging_face_vit_that_fx_cannot_trace_is_refused_naming_the_line_that_stops_it(
    store: Store,
) -> None:
    """Traced with every optional argument given, the forward stops at
    `() if output_hidden_states else None`, which tracing it with them None (resolved
    from the config) gets past; where that trace stops elsewhere (a layer branching on
    the hidden size), the refusal names that line and says to declare the submodule
    holding it, not the branch on the argument, which no change would let fx trace as a
    stand-in and which is not what stops the model; declared, the model wraps and
    answers as itself."""
    torch.manual_seed(0)
    model = HuggingFaceVit(checks_size=True)
    with pytest.raises(smt.Untraceable) as refused:
        smt.wrap(model, frozen=["embeddings"], cached=["embeddings"], store=store)
    said = str(refused.value)
    first = said.index(" at ")
    assert said[first:].split("`", 2)[1] == "if size != 8:", said
    assert "declare the submodule that holds this code" in said, said
    assert "every optional argument None" in said, said
    assert said.index("`all_hidden_states: tuple[Any, ...] | None = ()") > first, said
    declared = ["embeddings", "layers.0", "layers.1"]
    wrapped = smt.wrap(model, frozen=declared, cached=declared, store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for hidden in (None, True, False):
            want = model(x, output_hidden_states=hidden, return_dict=False)
            assert _same_answer(wrapped(x, output_hidden_states=hidden, return_dict=False), want)


class ComparesOptionalCount(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: int | None = None) -> torch.Tensor:
        h = self.encoder(x)
        if n > 2:  # type: ignore[operator]
            h = h * 2
        return h


def test_a_forward_stopped_at_the_same_line_with_its_optional_arguments_none_is_refused_there(
    store: Store,
) -> None:
    """A forward that stops fx at the same line whether its optional argument is given or
    None (`if n > 2:` with `n` None) is refused naming that line alone, not as a trace
    with it None that got past a branch on it."""
    with pytest.raises(smt.Untraceable, match=r"`if n > 2:") as refused:
        smt.wrap(ComparesOptionalCount(), frozen=["encoder"], cached=["encoder"], store=store)
    assert "every optional argument None" not in str(refused.value)


_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class _Options:
    mode: str = "a"
    k: float = 2.0


class _Mode:
    def __init__(self, mode: str) -> None:
        self.mode = mode


class TakesObjects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(
        self,
        x: torch.Tensor,
        opts: _Options = _Options(),
        marker: Any = None,
        items: Any = None,
        asked: Any = None,
    ) -> torch.Tensor:
        h = self.encoder(x)
        if opts.mode == "a":
            h = h * opts.k
        if marker is _DEFAULT:
            h = h + 1.0
        if marker is not None and getattr(marker, "mode", None) == "b":
            h = h - 3.0
        if items is not None:
            h = h + items[0]
        if isinstance(asked, list):
            h = h - asked[0]
        return h


def test_an_argument_handed_an_object_is_traced_per_value_or_refused_never_answered_wrong(
    store: Store,
) -> None:
    """fx hands the forward a stand-in for an argument that is neither a tensor nor a plain
    constant, and answers `marker is DEFAULT` or `isinstance(items, list)` for the stand-in:
    a frozen dataclass of constants is traced per value; a sentinel or another object is
    refused naming the argument; a list is an input apart from a tensor, and asking its
    kind is refused — every answer given is the model's."""
    wrapped, model = _encoder_cached(TakesObjects, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        for opts in (_Options("b"), _Options("a", 3.0), _Options()):
            assert torch.equal(wrapped(x, opts), model(x, opts))
        for marker in (_DEFAULT, _Mode("b")):
            with pytest.raises(smt.WrapError, match=r"`marker` is a `.*` in this call: fx"):
                wrapped(x, marker=marker)
        t = torch.ones(4)
        assert torch.equal(wrapped(x, items=[t]), model(x, items=[t]))
        assert torch.equal(wrapped(x, items=t), model(x, items=t))
        with pytest.raises(smt.Untraceable, match=r"what kind of value `asked` is"):
            wrapped(x, asked=[t])
        assert torch.equal(wrapped(x, asked=t), model(x, asked=t))


class TakesABatch(nn.Module):
    """Encodes a batch handed as a dict, scaling by its mask where it holds one, and
    shifts by the second item of a list where that is given."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(self, batch: dict[str, Any], extra: Any = None) -> torch.Tensor:
        h = self.encoder(batch["x"])
        mask = batch.get("mask")
        if mask is not None:
            h = h * mask
        if extra is not None and extra[1] is not None:
            h = h + extra[1]
        return h


def test_an_item_of_a_dict_or_list_argument_left_none_is_refused_never_run_as_traced(
    store: Store,
) -> None:
    """fx stands in for a dict or list the forward is handed, and for each item it takes
    out (`batch.get("mask")`, `extra[1]`), which is never None: the code traced is the
    forward's for a value there. A call leaving the key out, or handing None there, is
    refused naming the item, where it ran that code with None (a raw error from the
    traced code, or the branch for a value), by a copy loaded with `torch.load` too;
    calls handing values answer as the model does."""
    wrapped, model = _encoder_cached(TakesABatch, store)
    x, two = torch.randn(3, 4), torch.full((3, 4), 2.0)
    with torch.no_grad():
        assert torch.equal(wrapped({"x": x, "mask": two}), model({"x": x, "mask": two}))
        with pytest.raises(smt.WrapError, match=r"`batch\['mask'\]` is None .* has no 'mask'"):
            wrapped({"x": x})
        given = {"x": x, "mask": two}
        assert torch.equal(wrapped(given, [x, two]), model(given, [x, two]))
        with pytest.raises(smt.WrapError, match=r"`extra\[1\]` is None in this call: fx"):
            wrapped(given, [x, None])
        saved = io.BytesIO()
        torch.save(wrapped, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)  # the code fx traced again as loaded
        with pytest.raises(smt.WrapError, match=r"`batch\['mask'\]` is None"):
            loaded({"x": x})


class AttendsWhereMasked(nn.Module):
    """Attends over a batch handed as a dict where it holds a padding mask, handing the
    mask to the attention alone, then attends again handing on whatever mask it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.attention = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        h = self.encoder(batch["x"])
        mask = batch.get("mask")
        if mask is not None:
            h = self.attention(h, h, h, key_padding_mask=mask)[0]
        return self.attention(h, h, h, attn_mask=batch.get("attn_mask"))[0]


def test_an_item_tested_against_none_and_handed_to_a_module_left_out_is_refused(
    store: Store,
) -> None:
    """An item the forward tests against None and hands only to a module (`if mask is not
    None: h = self.attention(..., key_padding_mask=mask)`) is traced as given: a call
    leaving it out would run the attention the forward skips. It is refused naming the
    item; an item handed on as it is, untested (`attn_mask=batch.get("attn_mask")`), runs
    left out, as the model does."""
    torch.manual_seed(0)
    model = AttendsWhereMasked().eval()
    wrapped = _encoder_frozen(model, store)
    wrapped.eval()
    x = torch.randn(2, 3, 4)
    mask = torch.tensor([[False, False, True], [False, False, False]])
    with torch.no_grad():
        given = {"x": x, "mask": mask}
        assert torch.equal(wrapped(given), model(given))
        with pytest.raises(smt.WrapError, match=r"`batch\['mask'\]` is None .* has no 'mask'"):
            wrapped({"x": x})


class TakesANestedBatch(nn.Module):
    """Encodes a batch handed as a dict of dicts, scaling by the mask its inner dict holds
    where it holds one, and attending where the inner dict holds a padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.attention = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        h = self.encoder(batch["inner"]["x"])
        scale = batch["inner"].get("scale")
        if scale is not None:
            h = h * scale
        inner = batch["inner"]
        mask = inner.get("mask")
        if mask is not None:
            h = self.attention(h, h, h, key_padding_mask=mask)[0]
        return h


def test_an_item_of_a_dict_in_a_dict_argument_left_out_is_refused_naming_it(
    store: Store,
) -> None:
    """An item taken out of a dict in a dict argument (`batch["inner"].get("scale")`) is
    stood in for as one of the argument's own: a call leaving it out is refused naming its
    path, where it ran the code traced for a value (a raw TypeError from fx's code, or the
    attention the forward skips for a mask left out); calls handing it answer as the
    model does."""
    torch.manual_seed(0)
    model = TakesANestedBatch().eval()
    wrapped = _encoder_frozen(model, store)
    wrapped.eval()
    x, two = torch.randn(2, 3, 4), torch.full((2, 3, 4), 2.0)
    mask = torch.tensor([[False, False, True], [False, False, False]])
    with torch.no_grad():
        given = {"inner": {"x": x, "scale": two, "mask": mask}}
        assert torch.equal(wrapped(given), model(given))
        with pytest.raises(
            smt.WrapError, match=r"`batch\['inner'\]\['scale'\]` is None .* has no 'scale'"
        ):
            wrapped({"inner": {"x": x, "mask": mask}})
        with pytest.raises(
            smt.WrapError, match=r"`batch\['inner'\]\['mask'\]` is None .* has no 'mask'"
        ):
            wrapped({"inner": {"x": x, "scale": two}})


class Logs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.log = logging.getLogger("somatize.tests.wrap.logs")
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.debug("called")
        return self.encoder(x)


def test_a_logger_the_model_holds_is_no_config_traced_again_as_its_level_changes(
    store: Store,
) -> None:
    """An object of the standard library a module holds (a logger, whose level and cache
    change as it is used) is not watched as a config: changing its level traces nothing
    anew, and is never refused as one more set of values."""
    model = Logs()
    wrapped = _encoder_frozen(model, store)
    wrapped.TRACES_PER_VALUE = 2
    x = torch.randn(3, 4)
    with torch.no_grad():
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR) * 2:
            model.log.setLevel(level)
            assert torch.equal(wrapped(x), model(x))


_FAST = _Options("b", 5.0)


class ComparesPreset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, opts: Any = None) -> torch.Tensor:
        h = self.encoder(x)
        if opts is not None and opts is _FAST:
            return h * opts.k
        return h


def test_an_argument_compared_by_identity_is_not_traced_per_value(store: Store) -> None:
    """A frozen dataclass is traced per value: one the forward compares by identity
    (`opts is PRESET`) would be answered for the instance traced, so a call handing one is
    refused, naming it; `opts is None` is answered right for any value, and runs."""
    model = ComparesPreset()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        for opts in (_FAST, _Options("b", 5.0)):
            with pytest.raises(smt.WrapError, match=r"`opts` is a `_Options` .* by identity"):
                wrapped(x, opts)


class ComparesPresetInAMethod(ComparesPreset):
    def forward(self, x: torch.Tensor, opts: Any = None) -> torch.Tensor:
        return self._scaled(self.encoder(x), opts)

    def _scaled(self, h: torch.Tensor, given: Any) -> torch.Tensor:
        return h * given.k if given is _FAST else h


def test_an_argument_compared_by_identity_in_a_method_is_not_traced_per_value(
    store: Store,
) -> None:
    """A frozen dataclass the forward hands a method of the model that compares it by
    identity (`opts is PRESET` there) would be answered for the instance traced: a call
    handing one is refused naming it, as where the forward compares it, not answered by
    the code traced for an equal instance."""
    model = ComparesPresetInAMethod()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        for opts in (_FAST, _Options("b", 5.0), _FAST):
            with pytest.raises(smt.WrapError, match=r"`opts` is a `_Options` .* by identity"):
                wrapped(x, opts)


@dataclasses.dataclass(frozen=True)
class _Activated:
    act: _Kind = _Kind.CAUSAL
    k: float = 2.0
    preset: _Options = _FAST


def _activated(h: torch.Tensor, given: _Activated) -> torch.Tensor:
    return torch.tanh(h) * given.k if given.act is _Kind.FULL else torch.relu(h) * given.k


class ComparesAnEnumFieldInAFunction(ComparesPreset):
    def forward(self, x: torch.Tensor, opts: _Activated = _Activated()) -> torch.Tensor:
        return _activated(self.encoder(x), opts)


class ComparesAnEnumField(ComparesPreset):
    def forward(self, x: torch.Tensor, opts: _Activated = _Activated()) -> torch.Tensor:
        h = self.encoder(x)
        return torch.tanh(h) * opts.k if opts.act is _Kind.FULL else torch.relu(h) * opts.k


class ComparesADataclassFieldByIdentity(ComparesPreset):
    def forward(self, x: torch.Tensor, opts: _Activated = _Activated()) -> torch.Tensor:
        h = self.encoder(x)
        return h * opts.k if opts.preset is _FAST else h


@pytest.mark.parametrize(
    "kind", [ComparesAnEnumField, ComparesAnEnumFieldInAFunction], ids=["forward", "function"]
)
def test_an_enum_field_of_an_argument_compared_by_identity_is_traced_per_value(
    store: Store, kind: Callable[[], nn.Module]
) -> None:
    """`opts.act is Kind.FULL` compares an Enum member, one object for every equal value:
    a frozen dataclass whose field the forward, or a function it hands it to, compares so
    is traced per value, and each call answers as the model does; a field that is itself
    a dataclass compared by identity (`opts.preset is PRESET`) is still refused."""
    model = kind()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for opts in (_Activated(), _Activated(_Kind.FULL), _Activated(_Kind.FULL, 3.0)):
            assert torch.equal(wrapped(x, opts), model(x, opts))
    refused = ComparesADataclassFieldByIdentity()
    wrapped = _encoder_frozen(refused, store)
    with torch.no_grad(), pytest.raises(smt.WrapError, match=r"`opts` .* by identity"):
        wrapped(x, _Activated(preset=_Options("b", 5.0)))


class NamespaceConfigured(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.cfg = config
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        return h * self.cfg.inner.scale if self.cfg.flag else h


@pytest.mark.parametrize(
    "make",
    [
        lambda: types.SimpleNamespace(flag=False, inner=types.SimpleNamespace(scale=2.0)),
        lambda: argparse.Namespace(flag=False, inner=argparse.Namespace(scale=2.0)),
    ],
    ids=["SimpleNamespace", "argparse"],
)
def test_a_namespace_config_changed_after_wrap_is_traced_again(store: Store, make: Any) -> None:
    """The standard library's configs (`types.SimpleNamespace`, whose reads cannot be noted
    as they are made, is watched whole; `argparse.Namespace`) are watched as any config."""
    model = NamespaceConfigured(make())
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        model.cfg.flag = True
        assert torch.equal(wrapped(x), model(x))
        model.cfg.inner.scale = 3.0
        assert torch.equal(wrapped(x), model(x))


class CountsInConfig(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.config.calls += 1
        return self.encoder(x) * self.config.scale


class _Counted:
    def __init__(self) -> None:
        self.calls = 0
        self.scale = 2.0


@pytest.mark.parametrize(
    "make",
    [_Counted, lambda: types.SimpleNamespace(calls=0, scale=2.0)],
    ids=["object", "SimpleNamespace"],
)
def test_a_forward_that_assigns_to_its_config_is_refused_and_left_as_it_was(
    store: Store, make: Callable[[], Any]
) -> None:
    """A forward that counts its calls in the config it holds would read a value the trace
    itself changed: the wrapped model never assigns it, and would be traced again at every
    call for the count the last trace left. It is refused at `wrap`, naming what it
    assigns, and the config is as it was."""
    config = make()
    model = CountsInConfig(config)
    with pytest.raises(smt.Untraceable, match=r"assigns `config\.calls` as it runs"):
        smt.wrap(model, frozen=["encoder"], store=store)
    assert vars(config) == {"calls": 0, "scale": 2.0}


class _Exported:
    def __init__(self) -> None:
        self.flag = False
        self.scale = 2.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ReadsConfigWhole(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if self.config.to_dict()["flag"]:
            h = h * 3.0
        return h * vars(self.config)["scale"]


def test_a_config_read_through_its_dict_is_traced_again_once_changed(store: Store) -> None:
    """A forward reading its config whole (`config.to_dict()`, `vars(config)`, as a
    Hugging Face config's export does) reads every value it holds: changed after `wrap`,
    the forward is traced again for them, never run as traced for the ones before."""
    model = ReadsConfigWhole(_Exported())
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        model.config.flag = True
        assert torch.equal(wrapped(x), model(x))
        model.config.scale = 5.0
        assert torch.equal(wrapped(x), model(x))


class _Sized:
    def __init__(self) -> None:
        self.sizes = [2.0, 3.0]
        self.gains = {"a": 1.0}


class ReadsConfigItems(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Sized()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.config.sizes[0] + self.config.gains["a"]


def test_a_list_or_dict_a_config_holds_changed_in_place_is_traced_again(store: Store) -> None:
    """A list or dict a config holds, changed in place after `wrap` (`config.sizes[0] =
    5.0`), is the same object the first trace read: the forward is traced again for the
    items it holds now, never run as traced for the items it held then; set back, the
    first trace runs again."""
    model = ReadsConfigItems()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = model(x)
        assert torch.equal(wrapped(x), first)
        model.config.sizes[0] = 5.0
        assert torch.equal(wrapped(x), model(x))
        model.config.gains["a"] = 7.0
        assert torch.equal(wrapped(x), model(x))
        model.config.sizes[0], model.config.gains["a"] = 2.0, 1.0
        assert torch.equal(wrapped(x), first)


@dataclasses.dataclass
class _Stage:
    scale: float = 2.0
    skip: bool = False


class ReadsStageConfigs(nn.Module):
    """Keeps a config per stage in a list, tuple or dict, as a model built from a list of
    stage settings does, and reads each as it goes."""

    def __init__(self, holder: Callable[[list[Any]], Any]) -> None:
        super().__init__()
        self.stages = holder([_Stage(), types.SimpleNamespace(scale=3.0, skip=False)])
        self.config = types.SimpleNamespace(stages=holder([_Stage(scale=0.5)]))
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        for at in range(2):
            stage = self.stages[at]
            if not stage.skip:
                h = h * stage.scale
        return h * self.config.stages[0].scale


@pytest.mark.parametrize(
    "holder",
    [list, tuple, lambda stages: dict(enumerate(stages))],
    ids=["list", "tuple", "dict"],
)
def test_a_config_held_in_a_container_changed_after_wrap_is_traced_again(
    store: Store, holder: Callable[[list[Any]], Any]
) -> None:
    """A config the model keeps in a list, tuple or dict (one per stage: a dataclass, a
    namespace), or one a config keeps so, is read by the forward as one held directly is:
    changed in place after `wrap`, the forward is traced again for the values it holds
    now, never run as traced for the ones it held then; set back, the first trace runs
    again."""
    model = ReadsStageConfigs(holder)
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    changes: list[Callable[[ReadsStageConfigs], None]] = [
        lambda m: setattr(m.stages[0], "scale", 5.0),
        lambda m: setattr(m.stages[0], "skip", True),
        lambda m: setattr(m.stages[1], "scale", 7.0),
        lambda m: setattr(m.config.stages[0], "scale", 4.0),
    ]
    with torch.no_grad():
        first = model(x)
        assert torch.equal(wrapped(x), first)
        for change in changes:
            change(model)
            expected = model(x)
            assert not torch.equal(expected, first)
            assert torch.equal(wrapped(x), expected)
        model.stages[0].scale, model.stages[0].skip, model.stages[1].scale = 2.0, False, 3.0
        model.config.stages[0].scale = 0.5
        assert torch.equal(wrapped(x), first)


class FlaggedAndConfigured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Sized()
        self.encoder = nn.Linear(4, 4)
        self.boost = True
        self.offsets = [1.0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x) * self.config.sizes[0] + self.offsets[0]
        return h * 10.0 if self.boost else h


@pytest.mark.parametrize(
    "change",
    [lambda m: setattr(m, "boost", False), lambda m: m.offsets.__setitem__(0, 4.0)],
    ids=["value", "list item"],
)
def test_a_model_value_changed_with_its_config_set_back_is_refused_not_run_as_traced(
    store: Store, change: Callable[[nn.Module], None]
) -> None:
    """A plain value the model keeps (`self.boost`), changed as its config is set back to
    values traced before, is not what the traces for those values read: the next call is
    refused naming it, never run as traced for the value it held then."""
    model = FlaggedAndConfigured()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        model.config.sizes[0] = 5.0
        assert torch.equal(wrapped(x), model(x))
        model.config.sizes[0] = 2.0
        change(model)
        with pytest.raises(smt.WrapError, match=r"`(boost|offsets)` was .* now"):
            wrapped(x)


class Rescaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x) * self.config.scale


def test_code_changed_as_the_config_is_set_back_is_refused_not_run_as_traced(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's forward replaced on its class as its config is set back to values
    traced before: the traces for those values ran the old code, so the next call is
    refused naming it, never run as traced."""
    model = Rescaled()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(wrapped(x), model(x))
        model.config.scale = 3.0
        assert torch.equal(wrapped(x), model(x))
        model.config.scale = 2.0
        monkeypatch.setattr(Rescaled, "forward", lambda self, x: self.encoder(x) + 100.0)
        with pytest.raises(smt.WrapError, match=r"`Rescaled.forward` was set on the class"):
            wrapped(x)


_OFFSET_CELL = """
from torch import nn

OFFSET = 1.0


def doubled(t):
    return t * 2


class OffsetByAGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return doubled(self.head(self.encoder(x))) + OFFSET
"""


def _offset_cell(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A notebook cell defining ``OffsetByAGlobal``, whose forward reads the global
    ``OFFSET`` and calls the helper ``doubled`` of its module."""
    return run_cell(monkeypatch, "tests.wrap_cell", _OFFSET_CELL)


def test_a_global_the_model_s_forward_reads_rebound_is_refused_until_set_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A global the model's forward reads, rebound (a notebook's cell run again with
    ``OFFSET = 7.0``), was traced into the code the wrapped model runs as it was then, as
    the class's code was: the next call is refused naming it, as one after a method set on
    the class is, never run with the old value; set back, the wrapped model answers
    again."""
    cell = _offset_cell(monkeypatch)
    model = cell.OffsetByAGlobal()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = wrapped(x)
        assert torch.equal(first, model(x))
        exec("OFFSET = 7.0", vars(cell))
        with pytest.raises(smt.WrapError, match=r"`tests\.wrap_cell:OFFSET` was rebound"):
            wrapped(x)
        exec("OFFSET = 1.0", vars(cell))
        assert torch.equal(wrapped(x), first)


def test_a_helper_the_model_s_forward_calls_rebound_is_refused_not_the_same_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper of its module the model's forward calls, defined again with other code (a
    cell run again, edited), refuses the next call; defined again with the same code (the
    cell run again as it was), it is no change, and the wrapped model goes on answering."""
    cell = _offset_cell(monkeypatch)
    model = cell.OffsetByAGlobal()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 4)
    with torch.no_grad():
        first = wrapped(x)
        exec("def doubled(t):\n    return t * 2\n", vars(cell))
        assert torch.equal(wrapped(x), first)
        exec("def doubled(t):\n    return t * 3\n", vars(cell))
        with pytest.raises(smt.WrapError, match=r"`tests\.wrap_cell:doubled` was rebound"):
            wrapped(x)


def test_a_torch_module_in_a_global_the_cached_part_calls_keys_its_answers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached part whose forward calls a module of torch's own classes held in a global
    (``NORM = nn.LayerNorm(3)``) is keyed by that module's weights too: changed in place, the
    wrapped model answers what the model does, the part computed with them, not its old
    answer recalled; set back, that answer is recalled."""
    cell = normed_cell(monkeypatch, "tests.wrap_norm_cell")
    model = cell.HeadOnNormed()
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 6)
    with torch.no_grad():
        first = wrapped(x)
        scaled(cell.NORM, 2.0)
        assert torch.equal(wrapped(x), model(x))
        assert wrapped.graph.record is not None
        assert wrapped.graph.record.outcome["encoder"] == "ran"
        scaled(cell.NORM, 0.5)
        assert torch.equal(wrapped(x), first)
        assert wrapped.graph.record.outcome["encoder"] == "recalled"


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_torch_module_the_cached_part_computes_with_but_does_not_hold_keys_its_answers(
    store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A module of torch's own classes the cached part computes with but does not hold — in a
    global its forward calls, in a list or dict such a global holds, or bound by a partial
    the part keeps — keys its answers by its settings and mode (``NORM.eps = 1.0``,
    ``DROP.train()``) and its weights, and the container by the modules it holds: changed,
    the wrapped model answers what the model does, the part run again."""
    cell = normed_cell(monkeypatch, "tests.wrap_held_cell")
    make, changed = CHANGES[change]
    model = cell.HeadOnNormed(make(cell))
    wrapped = _encoder_frozen(model, store)
    x = torch.randn(3, 6)
    with torch.no_grad():
        first = wrapped(x)
        changed(cell, model.encoder)
        assert torch.equal(wrapped(x), model(x))
        assert wrapped.graph.record is not None
        assert wrapped.graph.record.outcome["encoder"] == "ran"
        assert not torch.equal(model(x), first)


def test_a_copy_of_a_wrapped_model_whose_part_a_global_of_its_name_holds_goes_on_after_training(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapped model whose forward reads ``self.encoder``, its encoder held in a global
    named ``encoder`` too (``encoder = Enc(); model = M(encoder, tower)``), copied for an
    average of its weights (``ema = copy.deepcopy(wrapped)``): a step of training of the
    model's encoder changes no code the copy reads — the forward reads no global
    ``encoder`` —, and the copy answers what its own model does, where it was refused as if
    ``encoder`` had been set on its class."""
    cell = named_as_attributes_cell(monkeypatch, "tests.wrap_named_cell")
    model = cell.Towered(cell.encoder, nn.Linear(4, 4))
    wrapped = smt.wrap(model, frozen=["tower"], cached=["tower"], store=store)
    smt.freeze(wrapped)
    x, t = torch.randn(3, 4), torch.randn(3, 4)
    wrapped(x, t)
    ema = copy.deepcopy(wrapped)
    ema(x, t)
    optimizer = torch.optim.SGD(cell.encoder.parameters(), lr=0.1)
    wrapped(x, t).sum().backward()
    optimizer.step()
    with torch.no_grad():
        assert torch.equal(ema(x, t), ema.model(x, t))
        assert not torch.equal(ema(x, t), model(x, t))


_UNRELATED_CHANGES: dict[str, Callable[[nn.Module], object]] = {
    "mode": lambda module: module.eval(),
    "weights": lambda module: scaled(module.lin, 2.0),
    "attribute": lambda module: setattr(module, "note", 3),
}
"""Each way a module held in a global is changed: none changes code that reads no global of
its name."""


@pytest.mark.parametrize("change", list(_UNRELATED_CHANGES))
def test_a_global_named_as_an_attribute_the_forward_reads_is_no_global_it_reads(
    store: Store, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A module in a global that is no part of the model (``enc = Enc()``) but bears the
    name of an attribute the model's forward reads (``self.enc``) is none the forward
    reads: put in eval, given other weights or an attribute, it leaves the wrapped model
    answering what the model does, where it was refused as if ``enc`` had been set on the
    model's class."""
    cell = named_as_attributes_cell(monkeypatch, "tests.wrap_named_cell")
    model = cell.Encoded()
    wrapped = smt.wrap(model, frozen=["tower"], cached=["tower"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    with torch.no_grad():
        wrapped(x)
        _UNRELATED_CHANGES[change](cell.enc)
        assert torch.equal(wrapped(x), model(x))


class Noisy(nn.Module):
    """Adds noise whatever its mode: each call draws anew."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.randn_like(x)


class NoisyOwnGenerator(nn.Module):
    """Adds noise drawn from a generator a submodule holds, whatever its mode."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.linear.draws = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(x.shape, generator=self.linear.draws)
        return self.linear(x) + noise


class NoisyProbe(nn.Module):
    """A linear head on an encoder that draws at every call."""

    def __init__(self, encoder: type[nn.Module] = Noisy) -> None:
        super().__init__()
        self.encoder = encoder()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@pytest.mark.parametrize("encoder", [Noisy, NoisyOwnGenerator])
def test_a_cached_module_that_draws_at_random_is_refused(
    store: Store, encoder: type[nn.Module]
) -> None:
    """A cached module that draws from torch's generator, or one a submodule holds, is
    refused before its answer is kept: a recall would repeat the one draw, where a call of
    the module draws anew."""
    wrapped = smt.wrap(NoisyProbe(encoder), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    for _ in range(2):  # nothing was kept: refused again, not recalled
        with pytest.raises(smt.WrapError, match="drew from torch's random number generator"):
            wrapped(x)
    assert "recalled" not in wrapped.counts.get("encoder", {})


@pytest.mark.parametrize("encoder", [DrawnBeside, AttendsBeside])
def test_a_cached_module_run_while_another_thread_draws_is_kept_and_recalled(
    store: Store, encoder: type[nn.Module]
) -> None:
    """A cached module that draws nothing, run while another thread draws from torch's
    generator (another model sampling), is not taken to draw: its answer is kept, and
    recalled. An attention with no dropout, whose kernel torch tags as one that may draw,
    draws nothing."""
    wrapped = smt.wrap(NoisyProbe(encoder), frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    x = torch.randn(3, 4)
    first = wrapped(x)
    assert torch.equal(wrapped(x), first)
    assert wrapped.counts["encoder"] == {"ran": 1, "kept": 1, "recalled": 1}


def test_a_cached_module_that_writes_into_its_input_as_another_thread_draws_writes_once(
    store: Store,
) -> None:
    """A cached module that writes into its input, run while another thread draws, is
    refused for the write, and the input is written once, as where no other thread draws:
    run once more to see whether the draw is its own, it runs on a copy of its input."""
    wrapped = smt.wrap(
        NoisyProbe(WritesBeside), frozen=["encoder"], cached=["encoder"], store=store
    )
    smt.freeze(wrapped)
    x = torch.ones(3, 4)
    with pytest.raises(smt.WrapError, match="wrote into argument 0 it was handed"):
        wrapped(x)
    assert torch.equal(x, torch.full((3, 4), 2.0))


@dataclasses.dataclass
class Answered(collections.OrderedDict):  # type: ignore[type-arg]
    """An answer as Hugging Face's `ModelOutput` is: a dataclass and an `OrderedDict`
    holding its fields that are not None, read by name, by attribute or by place."""

    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    loss: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None:
                self[field.name] = getattr(self, field.name)

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(key) if isinstance(key, str) else tuple(self.values())[key]


class AttributeDict(dict):  # type: ignore[type-arg]
    """A dict read by attribute, of a class of its own."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


class AnswersAsHuggingFace(nn.Module):
    """Answers an `Answered` (with its loss where labels are given), an `OrderedDict` or
    an `AttributeDict`."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(5, 2)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor | None = None, kind: str = "answered"
    ) -> Any:
        hidden = self.encoder(x)
        logits = self.head(hidden)
        if kind == "ordered":
            return collections.OrderedDict(logits=logits, hidden=hidden)
        if kind == "attributes":
            return AttributeDict(logits=logits, hidden=hidden)
        loss = None if labels is None else (logits - labels).pow(2).mean()
        return Answered(logits=logits, hidden=hidden, loss=loss)


def test_a_wrapped_models_answer_is_of_the_class_the_model_answers(store: Store) -> None:
    """A forward answering a dict of a class of its own (Hugging Face's `ModelOutput`, an
    `OrderedDict`) is answered so by the wrapped model, a copy of it and one loaded, where
    fx made a plain dict of it (`out.loss` an AttributeError); one fx cannot make again is
    refused at `wrap`, naming it."""
    torch.manual_seed(0)
    model = AnswersAsHuggingFace()
    wrapped = _encoder_frozen(model, store)
    x, labels = torch.randn(3, 6), torch.randn(3, 2)
    held = io.BytesIO()
    torch.save(wrapped, held)
    held.seek(0)
    calls = [((x,), {}), ((x, labels), {}), ((x,), {"kind": "ordered"})]
    for copied in (wrapped, copy.deepcopy(wrapped), torch.load(held, weights_only=False)):
        for args, kwargs in calls * 2:  # computed, then recalled
            expected, answered = model(*args, **kwargs), copied(*args, **kwargs)
            assert type(answered) is type(expected)
            assert list(answered.keys()) == list(expected.keys())
            assert all(torch.equal(answered[key], expected[key]) for key in expected)
    assert torch.equal(wrapped(x, labels).loss, model(x, labels).loss)
    assert torch.equal(wrapped(x)[0], model(x).logits)
    with pytest.raises(smt.Untraceable, match=r"`AttributeDict`, a subclass of `dict`"):
        wrapped(x, kind="attributes")


class _Pooled(nn.Module):
    """A timm-style model: how it pools is a plain value its forward reads, and it has
    methods of its own beside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.global_pool = "avg"

    def pooled(self, h: torch.Tensor) -> torch.Tensor:
        return h.mean(1) if self.global_pool == "avg" else h[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pooled(self.embed(x))


def test_a_value_written_through_a_model_wrapped_whole_is_the_models(tmp_path: Path) -> None:
    """A value the model holds, written through the wrapped model
    (``wrapped.global_pool = "token"``), is written to the model, whose forward reads it:
    the next call answers as the model does with it, and reading it through the wrapped
    model gives the model's. A method of the model is reached through it too."""
    model = _Pooled()
    wrapped = smt.wrap(model, frozen=True, cached=True, store=tmp_path)
    smt.freeze(wrapped)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        pooled = wrapped(x)
        wrapped.global_pool = "token"
        assert model.global_pool == "token" and wrapped.global_pool == "token"
        assert torch.equal(wrapped(x), model(x))
        assert not torch.equal(wrapped(x), pooled)
        assert torch.equal(wrapped.pooled(x), model.pooled(x))
    assert list(wrapped.counts.values()) == [{"ran": 2, "kept": 2, "recalled": 1}]


def test_a_value_deleted_through_a_model_wrapped_whole_is_the_models(tmp_path: Path) -> None:
    """A value the model holds, deleted through the wrapped model (``del
    wrapped.global_pool``), is deleted from the model, as it is read and written there:
    the model's class default shows through both again. A name neither holds is refused
    as on any module."""
    model = _Pooled()
    wrapped = smt.wrap(model, frozen=True, cached=True, store=tmp_path)
    type(model).global_pool = "token"  # type: ignore[attr-defined]
    try:
        del wrapped.global_pool
        assert "global_pool" not in vars(model)
        assert model.global_pool == "token" and wrapped.global_pool == "token"
    finally:
        del type(model).global_pool  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="global_pool"):
        del wrapped.global_pool


def test_a_name_neither_a_wrapped_model_nor_its_model_holds_is_refused_naming_the_model(
    tmp_path: Path,
) -> None:
    """Reading a name neither the wrapped model nor the model holds raises AttributeError
    naming the model's class, so ``hasattr`` says False and the message says where the
    name was looked for."""
    wrapped = smt.wrap(_Pooled(), frozen=True, cached=True, store=tmp_path)
    with pytest.raises(AttributeError, match=r"'pooled_by'.*wraps \(`_Pooled`\)"):
        _ = wrapped.pooled_by
    assert not hasattr(wrapped, "pooled_by") and hasattr(wrapped, "global_pool")
