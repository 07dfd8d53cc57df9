"""The tensor codec and tensor digests: round-trips, zero-copy recall, content keys."""

from __future__ import annotations

import collections
import json
import re
import struct
import subprocess
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn
from torch.autograd import forward_ad

import somatize.torch as smt
from somatize import CODECS, CodecError, Graph, Node, Opaque, Store
from somatize.codecs import Unreadable
from somatize_torch import _native
from somatize_torch import digest as smt_digest
from somatize_torch.digest import DTYPES, RowsLater, raw_rows, raw_rows_later
from tests.forked import in_forked_child

SAMPLES = {
    torch.bool: torch.tensor([[True, False, True], [False, False, True]]),
    torch.uint8: torch.arange(6, dtype=torch.uint8).reshape(2, 3),
    torch.int8: torch.tensor([[-128, 0, 127], [1, -1, 5]], dtype=torch.int8),
}


def _sample(dtype: torch.dtype) -> torch.Tensor:
    if dtype in SAMPLES:
        return SAMPLES[dtype]
    base = torch.linspace(-3, 3, 6).reshape(2, 3)
    if dtype.is_complex:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # complex32 is experimental in torch
            return torch.complex(base, -base).to(dtype)
    return base.to(dtype)


def _bytes(value: object) -> memoryview:
    return memoryview(b"".join(bytes(piece) for piece in smt.TENSOR.encode(value)))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=[str(d) for d in DTYPES])
def test_every_dtype_round_trips(dtype: torch.dtype) -> None:
    """A tensor of each supported dtype decodes to the same dtype, shape, device and values."""
    tensor = _sample(dtype)
    back = smt.TENSOR.decode(_bytes(tensor))
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12.0).reshape(3, 4).t(),
        torch.arange(24.0).reshape(2, 3, 4)[:, ::2, 1:],
        torch.tensor(3.5),
        torch.tensor(True),
        torch.empty(0, 5),
        torch.empty(0, dtype=torch.bfloat16),
    ],
    ids=["transposed", "strided", "0-dim", "0-dim-bool", "empty", "empty-bf16"],
)
def test_awkward_tensors_round_trip(tensor: torch.Tensor) -> None:
    """Non-contiguous, 0-dim and empty tensors keep shape, dtype and values."""
    back = smt.TENSOR.decode(_bytes(tensor))
    assert _same(back, tensor)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (lambda x: x, "it is a tensor that requires grad"),
        (lambda x: x * 2, "it is a tensor that requires grad"),
        (lambda x: (torch.ones(1), x), r"item \[1\] is a tensor that requires grad"),
        (lambda x: {"h": (x, None)}, "an item of it is a tensor that requires grad"),
    ],
    ids=["leaf", "grad_fn", "tuple", "tree"],
)
def test_a_tensor_that_requires_grad_is_neither_written_nor_weighed(
    value: Callable[[torch.Tensor], Any], said: str
) -> None:
    """A tensor that requires grad (a leaf, or one with a ``grad_fn``), alone or as an item,
    is a CodecError saying so and what to do, written or weighed: it would come back a leaf
    that does not, and the gradient through what made it would stop on a recall."""
    made = value(torch.ones(3, requires_grad=True))
    with pytest.raises(CodecError, match=rf"{said}.*\.detach\(\)"):
        smt.TENSOR.encode(made)
    with pytest.raises(CodecError, match=rf"{said}.*\.detach\(\)"):
        smt.TENSOR.digest(made)


class Doubled(Node):
    """Its input doubled."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x * 2


class Trained(Node):
    """Its input times a weight that trains."""

    weight = nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x * self.weight


def test_a_cached_node_handed_or_answering_a_tensor_that_requires_grad_is_refused(
    store: Store,
) -> None:
    """A cached node handed ``Opaque(x)`` of an ``x`` that requires grad, or answering a
    tensor that does, is refused before anything is kept: a recalled answer is a leaf, so
    the gradient reaching ``x`` (or the weight) differed between a miss and a hit. The
    values, detached, are cached as before."""
    g = Graph.somatize(Doubled().named("double").frozen().cached())
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(CodecError, match="requires grad"):
        g.forward(Opaque(x), store=store)
    values = x.detach()
    batch = Opaque(values)
    assert torch.equal(g.forward(batch, store=store), torch.full((3,), 2.0))
    values.requires_grad_(True)  # the same tensor, made to require grad after it was weighed
    with pytest.raises(CodecError, match="requires grad"):
        g.forward(batch, store=store)
    trained = Graph.somatize(Trained().named("trained").frozen().cached())
    with pytest.raises(CodecError, match="requires grad"):
        trained.forward(Opaque(torch.ones(3)), store=store)
    assert trained.record is not None and trained.record.outcome == {"trained": "failed"}


def test_a_cached_node_handed_a_tensor_carrying_a_forward_mode_tangent_is_refused(
    store: Store,
) -> None:
    """A cached node handed ``Opaque(x)`` of a dual tensor (``forward_ad.make_dual``) is
    refused before anything is kept, under ``torch.no_grad()`` too, where tangents flow:
    the answer computed carried the jvp and the one recalled carried none
    (``unpack_dual(out).tangent`` None). Its values, the tangent dropped, are cached."""
    g = Graph.somatize(Doubled().named("double").frozen().cached())
    x = torch.ones(3)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones(3))
        for grad in (True, False):
            with torch.set_grad_enabled(grad), pytest.raises(CodecError, match="tangent"):
                g.forward(Opaque(dual), store=store)
        assert torch.equal(g.forward(Opaque(dual.detach()), store=store), torch.full((3,), 2.0))
    with pytest.raises(CodecError, match=r"tangent.*unpack_dual"), forward_ad.dual_level():
        smt.TENSOR.encode(forward_ad.make_dual(x, torch.ones(3)))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        torch.randn(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d),
        torch.arange(12.0).reshape(3, 4).t(),
        torch.randn(4, 3, 2).permute(2, 0, 1),
    ],
    ids=["channels_last", "channels_last_3d", "transposed", "permuted"],
)
def test_a_dense_tensor_in_another_dim_order_comes_back_with_its_strides(
    tensor: torch.Tensor,
) -> None:
    """A tensor whose memory is dense in another order of its dims (channels_last, a
    transpose) is written in memory order, with no copy, and comes back with the strides
    it had, where it came back C-contiguous and a conv reading it answered other last
    bits; a safetensors reader reads the dims in memory order. Its digest is its C-order
    content's, as before."""
    pieces = smt.TENSOR.encode(tensor)
    assert np.frombuffer(pieces[1], dtype=np.uint8).ctypes.data == tensor.data_ptr()
    back = smt.TENSOR.decode(_bytes(tensor))
    assert _same(back, tensor) and back.stride() == tensor.stride()
    order = sorted(range(tensor.dim()), key=lambda d: -tensor.stride(d))
    read = safetensors.torch.load(bytes(_bytes(tensor)))["tensor"]
    assert torch.equal(read, tensor.permute(order))
    assert smt.TENSOR.digest(tensor) == smt.TENSOR.digest(tensor.contiguous())


class Cloned(Node):
    """A copy of its input, in the input's memory format."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x.clone()


def test_a_channels_last_answer_is_recalled_channels_last(store: Store) -> None:
    """A cached node's channels_last answer is recalled channels_last, so a conv reading it
    answers the same bits on a hit as on a miss; where it came back C-contiguous."""
    torch.manual_seed(0)
    g = Graph.somatize(Cloned().named("cloned").frozen().cached())
    x = torch.randn(2, 8, 10, 10).to(memory_format=torch.channels_last)
    conv = nn.Conv2d(8, 8, 3)
    computed = g.forward(Opaque(x), store=store)
    recalled = g.forward(Opaque(x), store=store)
    assert g.record is not None and g.record.outcome == {"cloned": "recalled"}
    assert recalled.stride() == computed.stride() == x.stride()
    with torch.no_grad():
        assert torch.equal(conv(recalled), conv(computed))


class Pooled(Node):
    """The mean of each channel of its input, as a map of 1x1 (a squeeze-and-excitation
    block's squeeze): fed channels_last, torch answers it with the strides of
    channels_last, those of its dims of size 1 included."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return nn.functional.adaptive_avg_pool2d(x, 1)


def test_a_pooled_channels_last_answer_is_recalled_with_its_strides(store: Store) -> None:
    """A cached node's answer that is contiguous to torch but laid out otherwise in its
    dims of size 1 (a channels_last map pooled to 1x1, strides (64, 1, 64, 64)) is recalled
    with the strides it was computed with, so a 1x1 conv reading it answers the same bits,
    laid out alike, on a hit as on a miss: it was written in C order, recalled with strides
    (64, 1, 1, 1), and the conv took another path and answered other last bits, in C
    order where it answered channels_last."""
    torch.manual_seed(0)
    g = Graph.somatize(Pooled().named("pooled").frozen().cached())
    x = torch.randn(8, 64, 7, 7).to(memory_format=torch.channels_last)
    conv = nn.Conv2d(64, 128, 1)
    computed = g.forward(Opaque(x), store=store)
    recalled = g.forward(Opaque(x), store=store)
    assert g.record is not None and g.record.outcome == {"pooled": "recalled"}
    assert computed.is_contiguous() and computed.stride() == (64, 1, 64, 64)
    assert recalled.stride() == computed.stride()
    with torch.no_grad():
        answered, again = conv(computed), conv(recalled)
    assert again.stride() == answered.stride() and torch.equal(again, answered)


class Halves(Node):
    """Its input split in two along its channels (a gated block's halves): fed
    channels_last, each half keeps the strides of the whole, with gaps where the other
    half's channels lie."""

    def forward(self, x: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, ...]:
        return x.chunk(2, dim=1)


def test_a_channels_last_answer_with_gaps_is_recalled_channels_last(store: Store) -> None:
    """A cached node's answer laid out in channels_last with gaps in its memory (a half of a
    channels_last map split along its channels) is recalled dense in channels_last, so a
    conv reading it answers the same bits, laid out alike, on a hit as on a miss: it was
    written in C order and recalled so, and the conv took another path and answered other
    last bits, in C order where it answered channels_last. A transpose with gaps is
    recalled in its order too."""
    torch.manual_seed(0)
    g = Graph.somatize(Halves().named("halves").frozen().cached())
    x = torch.randn(8, 32, 14, 14).to(memory_format=torch.channels_last)
    conv = nn.Conv2d(16, 32, 3, padding=1)
    computed = g.forward(Opaque(x), store=store)
    recalled = g.forward(Opaque(x), store=store)
    assert g.record is not None and g.record.outcome == {"halves": "recalled"}
    assert not computed[0].is_contiguous(memory_format=torch.channels_last)
    assert all(one.is_contiguous(memory_format=torch.channels_last) for one in recalled)
    with torch.no_grad():
        answered, again = conv(computed[0]), conv(recalled[0])
    assert again.stride() == answered.stride() and torch.equal(again, answered)
    columns = torch.randn(6, 10)[:, ::2].t()  # strides (2, 10): a transpose, with gaps
    back = smt.TENSOR.decode(_bytes(columns))
    assert torch.equal(back, columns) and back.stride() == (1, 5)
    assert smt.TENSOR.digest(columns) == smt.TENSOR.digest(columns.contiguous())


def test_collections_round_trip() -> None:
    """A dict, a tuple and a list of tensors come back as the same kind, in order (a dict in
    the order it was filled in)."""
    parts = (torch.randn(2, 3).half(), torch.tensor([1, 2], dtype=torch.int8), torch.tensor(True))
    named = {"z": parts[0], "a": parts[1], "m": parts[2]}
    for value in (parts, list(parts), named):
        back = smt.TENSOR.decode(_bytes(value))
        assert type(back) is type(value)
        if isinstance(value, dict):
            assert all(_same(back[name], value[name]) for name in value)
        else:
            assert all(_same(b, v) for b, v in zip(back, value, strict=True))
    assert list(smt.TENSOR.decode(_bytes(named))) == ["z", "a", "m"]


def test_an_empty_collection_written_directly_comes_back_as_itself() -> None:
    """A dict, tuple or list of no tensors, handed to the codec's encode itself (the state
    of a module with no weights, sent to a worker), is written and read back as the same
    kind, as it is weighed; an answer of one is still left to the plain codec."""
    for value in ({}, (), []):
        back = smt.TENSOR.decode(_bytes(value))
        assert type(back) is type(value) and not back
        assert not smt.TENSOR.accepts(value)


Pair = collections.namedtuple("Pair", ["hidden", "pooled"])


def _header_of(value: object) -> dict[str, Any]:
    data = bytes(_bytes(value))
    (size,) = struct.unpack("<Q", data[:8])
    return dict(json.loads(data[8 : 8 + size]))


def _alike(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down, dicts in the same order."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and _same(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_flat_collections_are_written_as_before() -> None:
    """A tensor, and a flat tuple, list or sorted dict of tensors, keep the header they were
    written with before nesting and dict order were recorded: answers kept then read the
    same, and a sorted dict's bytes name no order."""
    x = torch.ones(2)
    assert _header_of(x)["__metadata__"] == {"format": "somatize/tensor/1", "kind": "tensor"}
    assert _header_of((x, x))["__metadata__"] == {"format": "somatize/tensor/1", "kind": "tuple"}
    assert _header_of({"a": x, "b": x})["__metadata__"] == {
        "format": "somatize/tensor/1",
        "kind": "dict",
    }
    assert json.loads(_header_of({"b": x, "a": x})["__metadata__"]["order"]) == ["b", "a"]
    kept_before = _patched({"b": x, "a": x * 2}, lambda h: h["__metadata__"].pop("order"))
    assert list(smt.TENSOR.decode(kept_before)) == ["a", "b"]


@pytest.mark.parametrize(
    "value",
    [
        (torch.ones(2, 3), None),
        (torch.ones(2), (torch.arange(3), torch.zeros(1, 2))),
        [torch.ones(1), [None, [torch.tensor(True)]], ()],
        {"z": torch.ones(2), "a": [None, {"q": torch.arange(2)}], "m": None},
        collections.OrderedDict(z=torch.ones(1), a=torch.zeros(2)),
        Pair(torch.ones(2, 2), torch.arange(2)),
        Pair(torch.ones(1), None),
        {"out": Pair(torch.ones(1), (torch.zeros(1),))},
    ],
    ids=["none", "nested", "list", "dict", "ordered", "namedtuple", "namedtuple-none", "inside"],
)
def test_nested_values_come_back_as_they_were(value: Any) -> None:
    """Tensors and None nested in tuples, lists, dicts, OrderedDicts and namedtuples come
    back as the same types, in the same order, with the same tensors; the bytes are still
    what a safetensors reader opens."""
    assert smt.TENSOR.accepts(value)
    assert CODECS.for_value(value).name == "tensor"
    assert _alike(smt.TENSOR.decode(_bytes(value)), value)
    safetensors.torch.load(bytes(_bytes(value)))


def test_nested_values_digest_by_content_whatever_the_order_of_a_dict() -> None:
    """A nested value's digest does not depend on the order its dicts were filled in, and
    does depend on where None and each tensor stand."""
    a, b = torch.ones(2), torch.arange(2)
    one = {"a": (a, None), "b": b}
    assert smt.TENSOR.digest(one) == smt.TENSOR.digest({"b": b, "a": (a, None)})
    others = [{"a": (None, a), "b": b}, {"a": (a, None), "b": a}, {"a": [a, None], "b": b}]
    assert len({smt.TENSOR.digest(v) for v in [one, *others]}) == 4


def _local_pair() -> Any:
    Local = collections.namedtuple("Local", ["x"])
    return Local(torch.ones(1))


class Counts(dict[str, torch.Tensor]):
    """A dict subclass, which the codec cannot rebuild without calling its code."""


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ((torch.ones(1), 3), r"item \[1\] is a `builtins.int`"),
        ((torch.ones(1), [None, object()]), r"item \[1\]\[1\] is a `builtins.object`"),
        ({"a": {1: torch.ones(1)}}, r"item \['a'\]\[1\] is under a `builtins.int` key"),
        (_local_pair(), "namedtuple, whose class cannot be found again by its name"),
        (Counts(a=torch.ones(1)), r"it is a `[\w.]*Counts`"),
        (collections.defaultdict(list, a=torch.ones(1)), "`collections.defaultdict`"),
        ((None, None), "it holds no tensor"),
    ],
    ids=["int", "object", "int-key", "local-namedtuple", "dict-subclass", "defaultdict", "none"],
)
def test_what_the_codec_does_not_write_is_refused_by_item(value: Any, why: str) -> None:
    """A value the codec cannot give back as it is — another type in it, a class it
    cannot find again by name — is refused, never written as something else, and the
    refusal names the item."""
    assert not smt.TENSOR.accepts(value)
    refusal = smt.TENSOR.refusal(value)
    assert refusal is not None and re.search(why, refusal), refusal


def test_a_namedtuple_whose_class_is_not_loaded_is_an_answer_that_cannot_be_read() -> None:
    """A namedtuple answer is rebuilt from the class of its name among the modules loaded,
    never imported; one that is not there (or has other fields) is Unreadable (a
    ValueError), which the engine takes for an answer it computes again."""
    data = bytes(_bytes(Pair(torch.ones(1), torch.zeros(1))))

    def renamed(header: dict[str, Any]) -> None:
        tree = json.loads(header["__metadata__"]["tree"])
        tree["namedtuple"] = "somatize_not_loaded.module:Pair"
        header["__metadata__"]["tree"] = json.dumps(tree)

    with pytest.raises(Unreadable, match="no such class is loaded"):
        smt.TENSOR.decode(_patched(Pair(torch.ones(1), torch.zeros(1)), renamed))
    assert type(smt.TENSOR.decode(memoryview(data))) is Pair


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda h: h["tensor"].update(dtype="F4_E2M1"), "of dtype 'F4_E2M1', which this process"),
        (lambda h: h["__metadata__"].update(format="somatize/tensor/2"), "later somatize"),
        (lambda h: h["__metadata__"].update(kind="sparse"), "of kind 'sparse'"),
    ],
    ids=["dtype", "format", "kind"],
)
def test_an_answer_a_later_torch_or_somatize_wrote_is_unreadable_not_damaged(
    change: Any, said: str
) -> None:
    """A tensor answer of a dtype this torch has none of (one a later torch added), or of a
    later version of the format, or of a kind a later somatize writes, is whole: it is
    Unreadable, saying so, which the engine computes again as an ``unreadable`` answer, not
    a damaged one. A format or kind that is no somatize's is damage, as ever."""
    with pytest.raises(Unreadable, match=re.escape(said)):
        smt.TENSOR.decode(_patched(torch.arange(4.0), change))
    for other in ("safetensors/1", "somatize/tensor/x", "somatize/tensor/0"):
        with pytest.raises(ValueError, match="unknown kind or format") as why:
            smt.TENSOR.decode(
                _patched(torch.arange(4.0), lambda h, f=other: h["__metadata__"].update(format=f))
            )
        assert not isinstance(why.value, Unreadable)


class _Paired(Node):
    """Answers a namedtuple whose module it loads only when it runs."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, x: int, ctx: Any) -> Any:
        sys.modules[self._module.__name__] = self._module  # as `import` inside forward would
        return self._module.Pair(torch.ones(2) * x, torch.zeros(1))


def test_an_answer_whose_namedtuple_is_not_loaded_is_unreadable_not_corrupt(
    store: Store,
) -> None:
    """Where the class an answer names is not loaded, the answer is computed again with an
    ``unreadable`` fact — nothing in the store is damaged or set aside — and read back once
    the class is there."""
    module = types.ModuleType("somatize_pairs_here")
    module.Pair = collections.namedtuple("Pair", "a b", module=module.__name__)  # type: ignore[attr-defined]
    graph = Graph.somatize(_Paired(module).named("pair").frozen().cached())
    try:
        graph.forward(2, store=store)
        del sys.modules[module.__name__]
        seen: list[dict[str, Any]] = []
        assert type(graph.forward(2, store=store, watching=seen.append)) is module.Pair
        assert [f["fact"] for f in seen][:3] == ["unreadable", "ran", "kept"]
        assert "no such class is loaded" in seen[0]["why"]
        assert not (Path(store.root) / "quarantine").exists()
        assert type(graph.forward(2, store=store)) is module.Pair
        assert graph.record.outcome["pair"] == "recalled"
    finally:
        sys.modules.pop(module.__name__, None)


class _Counted(Node):
    """A tensor of ``x`` elements."""

    def forward(self, x: int, ctx: Any) -> torch.Tensor:
        return torch.arange(float(x))


def test_an_answer_of_a_dtype_this_torch_has_not_is_computed_as_unreadable(
    store: Store,
) -> None:
    """An answer kept by a later torch, of a dtype this one has none of, is computed again
    with an ``unreadable`` fact that names the dtype, not a ``corrupt`` one: nothing in the
    store is damaged or set aside."""
    graph = Graph.somatize(_Counted().named("counted").frozen().cached())
    graph.forward(4, store=store)
    (record,) = [p for p in (Path(store.root) / "answers").rglob("*") if p.is_file()]
    fields = json.loads(record.read_bytes())
    data = bytes(_patched(torch.arange(4.0), lambda h: h["tensor"].update(dtype="F8_E9M9")))
    digest = store.put(data)
    record.write_bytes(json.dumps({**fields, "value": digest, "bytes": len(data)}).encode())
    seen: list[dict[str, Any]] = []
    assert torch.equal(
        graph.forward(4, store=Store(str(store.root)), watching=seen.append), torch.arange(4.0)
    )
    assert [f["fact"] for f in seen][:3] == ["unreadable", "ran", "kept"]
    assert "'F8_E9M9'" in seen[0]["why"]
    assert not (Path(store.root) / "quarantine").exists()


class _PairedItems(Node):
    """Answers each item a namedtuple whose module it loads only when it runs."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self.calls: list[list[int]] = []

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, xs: list[int], ctx: Any) -> Any:
        self.calls.append(list(xs))
        sys.modules[self._module.__name__] = self._module
        return [self._module.Pair(torch.ones(2) * x, torch.zeros(1)) for x in xs]


class DoubledItems(Node):
    """Each item doubled; declared mapped in the tests."""

    def forward(self, xs: list[torch.Tensor], ctx: Any) -> list[torch.Tensor]:
        return [x * 2 for x in xs]


def test_tensor_items_alike_recalled_are_each_in_memory_of_their_own(store: Store) -> None:
    """A mapped node handed one tensor item twice answers each place with a tensor in
    memory of its own when it recalls them (all of them, or some beside items it runs), as
    when it computes them: a tensor decodes in place, over the bytes read, and both places
    were read from the same bytes, so writing into one changed the other."""
    g = Graph.somatize(DoubledItems().named("doubled").frozen().mapped().cached())
    item, other = torch.ones(64 * 1024), torch.full((64 * 1024,), 3.0)
    g.forward([Opaque(item), Opaque(item.clone())], store=store)
    for handed in ([item, item.clone()], [item, other, item.clone()]):
        again = g.forward([Opaque(x) for x in handed], store=store)
        again[0].add_(1)
        assert torch.equal(again[-1], item * 2)
        assert torch.equal(again[0], item * 2 + 1)


def test_an_unreadable_answer_kept_by_other_code_is_computed_not_said_drifted(
    store: Store,
) -> None:
    """An answer kept by another version of the code that cannot be read in this process
    (the class it names is not loaded) is computed again and said ``unreadable`` alone:
    nothing drifted was recalled, so no ``drifted`` fact or warning says one was, and the
    node's outcome is ``ran``."""
    module = types.ModuleType("somatize_pair_items_here")
    module.Pair = collections.namedtuple("Pair", "a b", module=module.__name__)  # type: ignore[attr-defined]
    paired = _PairedItems(module)
    graph = Graph.somatize(paired.named("pair").frozen().mapped().cached())
    try:
        graph.forward([2], store=store)
        del sys.modules[module.__name__]
        graph.memory.written_as("pair", "sha256:newer")
        seen: list[dict[str, Any]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graph.forward([2], store=store, watching=seen.append)
        assert [f["fact"] for f in seen] == ["unreadable", "ran", "kept", "finished"]
        assert graph.record.outcome == {"pair": "ran"}
        assert paired.calls == [[2], [2]]
    finally:
        sys.modules.pop(module.__name__, None)


def test_a_class_name_an_answer_gives_is_looked_up_without_running_any_code() -> None:
    """The class a namedtuple answer names is read from modules' and classes' own
    namespaces: a module's ``__getattr__`` (which imports) never runs for it."""
    lazy = types.ModuleType("somatize_lazy_module")
    calls: list[str] = []
    lazy.__getattr__ = calls.append  # type: ignore[method-assign]
    sys.modules[lazy.__name__] = lazy

    def renamed(header: dict[str, Any]) -> None:
        tree = json.loads(header["__metadata__"]["tree"])
        tree["namedtuple"] = "somatize_lazy_module:Pair"
        header["__metadata__"]["tree"] = json.dumps(tree)

    try:
        with pytest.raises(ValueError, match="no such class is loaded"):
            smt.TENSOR.decode(_patched(Pair(torch.ones(1), torch.zeros(1)), renamed))
    finally:
        del sys.modules[lazy.__name__]
    assert calls == []


def test_a_header_nested_past_what_is_read_is_damaged() -> None:
    """JSON nested deeper than this process parses is a ValueError (an answer computed
    again), not a RecursionError out of the forward."""

    def deep(header: dict[str, Any]) -> None:
        header["__metadata__"]["tree"] = "[" * 200_000 + "]" * 200_000

    with pytest.raises(ValueError, match="nested too deep"):
        smt.TENSOR.decode(_patched(Pair(torch.ones(1), torch.zeros(1)), deep))


@pytest.mark.parametrize(
    "tree",
    [
        {"tuple": [0, 0]},
        {"tuple": [0]},
        {"tuple": [0, 1, 2]},
        {"set": [0, 1]},
        {"dict": [["a", 0], ["a", 1]]},
        {"dict": [[1, 0], ["b", 1]]},
        {"namedtuple": "x:Y", "fields": ["a"], "items": [0, 1]},
        "[0, 1]",
    ],
    ids=["twice", "missing", "extra", "unknown", "same-key", "int-key", "fields", "not-a-shape"],
)
def test_a_tree_shape_that_lies_is_refused_as_damaged(tree: Any) -> None:
    """A shape that places a tensor twice or not at all, or is not one the codec writes, is
    a ValueError, never a wrong value."""
    value = (torch.ones(1), (torch.zeros(1), None))

    def change(header: dict[str, Any]) -> None:
        header["__metadata__"]["tree"] = json.dumps(tree)

    with pytest.raises(ValueError):
        smt.TENSOR.decode(_patched(value, change))


def test_layout_is_safetensors() -> None:
    """What the codec writes, the safetensors library reads as the same tensors."""
    value = {"weight": torch.randn(4, 4).bfloat16(), "mask": torch.tensor([True, False])}
    loaded = safetensors.torch.load(bytes(_bytes(value)))
    assert all(_same(loaded[name], value[name]) for name in value)


def test_weighing_and_recalling_leave_tensors_resizable(store: Store) -> None:
    """Digesting or keeping a caller's tensor does not change it: it can be resized after,
    as rows recalled by the per-row cache can."""
    x = torch.randn(4, 3)
    smt.digest_tensor(x)
    smt.digest_rows(x)
    Opaque(x).digest  # noqa: B018 - weighing is the point
    b"".join(bytes(piece) for piece in CODECS.named("tensor").encode(x))
    x.resize_(40)
    cached = smt.cache_rows(nn.Linear(3, 2), store)
    rows = torch.randn(5, 3)
    cached(rows)
    again = cached(rows)
    cached.close()
    rows.resize_(50)
    again.resize_(100)


def test_encode_hands_over_the_tensors_own_memory() -> None:
    """Encoding a contiguous tensor yields a view of its memory, not a copy."""
    tensor = torch.randn(1000)
    pieces = smt.TENSOR.encode(tensor)
    view = np.frombuffer(pieces[1], dtype=np.uint8)
    assert view.ctypes.data == tensor.data_ptr()


def test_recall_is_zero_copy_from_what_the_store_read(store: Store) -> None:
    """A recalled tensor's storage lies inside the memory the store read the blob into,
    which starts aligned as torch's own tensors do."""
    tensor = torch.randn(64, 1024)
    store.keep("blake3:" + "1" * 64, smt.TENSOR.encode(tensor), "tensor")
    _, data = store.recall("blake3:" + "1" * 64)
    start = np.frombuffer(data, dtype=np.uint8).ctypes.data
    back = smt.TENSOR.decode(data)
    assert isinstance(data.obj, bytearray) and start % 64 == 0
    assert start <= back.untyped_storage().data_ptr() < start + len(data)
    assert torch.equal(back, tensor)


_WRITTEN_IN_PLACE = """
import sys, torch
import somatize.torch as smt
from somatize import Store

root, elements = sys.argv[1], int(sys.argv[2])
store, key = Store(root), "blake3:" + "2" * 64
store.keep(key, smt.TENSOR.encode(torch.ones(elements)), "tensor")
for _ in range(2):  # the first recall fills what the store holds; the second reads it
    smt.TENSOR.decode(store.recall(key)[1]).add_(41)
for reader in (store, Store(root)):
    assert torch.equal(smt.TENSOR.decode(reader.recall(key)[1]), torch.ones(elements))
"""


@pytest.mark.parametrize("elements", [4, 64 * 1024], ids=["held", "mapped"])
def test_a_recalled_tensor_written_in_place_changes_only_itself(
    tmp_path: Path, elements: int
) -> None:
    """A recalled tensor written in place (small, held in memory; large, memory-mapped)
    changes neither the blob nor a later recall, and nothing faults. In a process of its
    own, so a fault fails this test alone."""
    run = [sys.executable, "-c", _WRITTEN_IN_PLACE, str(tmp_path), str(elements)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_damaged_bytes_are_refused() -> None:
    """A header that lies about its tensor's bytes is a ValueError, never a wrong tensor."""
    data = bytearray(_bytes(torch.randn(4)))
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8 : 8 + size]))
    header["tensor"]["shape"] = [5]
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (size - len(raw))
    data[8 : 8 + size] = raw
    with pytest.raises(ValueError, match="it is damaged"):
        smt.TENSOR.decode(memoryview(bytes(data)))
    with pytest.raises(ValueError, match="too few"):
        smt.TENSOR.decode(memoryview(b"\x01"))


def _patched(value: Any, change: Any) -> memoryview:
    """The codec's bytes of ``value`` with its JSON header changed by ``change``."""
    data = bytes(_bytes(value))
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    change(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return memoryview(struct.pack("<Q", len(raw)) + raw + data[8 + size :])


def _devices(devices: Any) -> Any:
    return lambda h: h["__metadata__"].update(devices=json.dumps(devices))


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h["tensor"].update(shape=[-3, -4]),
        lambda h: h["tensor"].update(shape=[0, 2**63], data_offsets=[0, 0]),
        _devices({"tensor": "meta"}),
        _devices({"tensor": "nonsense"}),
        _devices({"elsewhere": "cpu"}),
        _devices(["cpu"]),
        lambda h: h.update(other=h.pop("tensor")),
        lambda h: h["tensor"].update(shape=[0] + [2**47] * 4, data_offsets=[0, 0]),
        lambda h: h["tensor"].update(shape=[float("inf"), 4]),
        lambda h: h["tensor"].update(data_offsets=[0, float("inf")]),
        lambda h: h["tensor"].update(shape="34"),
        lambda h: h["tensor"].update(shape={"12": 1}),
        lambda h: h["tensor"].update(shape=[True, 12]),
        lambda h: h["tensor"].update(shape=[3.0, 4.5]),
        lambda h: h["tensor"].update(data_offsets=[0.0, 48.0]),
        lambda h: h["tensor"].update(data_offsets="0,48"),
        _devices({"tensor": "cuda:256"}),
        _devices({"tensor": "cuda:128"}),
        _devices({"tensor": 0}),
        lambda h: h["__metadata__"].update(dims=json.dumps({"tensor": [0, 0]})),
        lambda h: h["__metadata__"].update(dims=json.dumps({"tensor": [1, 0, 2]})),
        lambda h: h["__metadata__"].update(dims=json.dumps({"other": [1, 0]})),
        lambda h: h["__metadata__"].update(dims="[1, 0]"),
    ],
    ids=[
        "negative",
        "huge",
        "meta",
        "no-device",
        "unknown-name",
        "not-a-dict",
        "renamed",
        "strides-overflow",
        "infinite-size",
        "infinite-offset",
        "shape-a-string",
        "shape-a-dict",
        "shape-of-bools",
        "shape-of-floats",
        "offsets-of-floats",
        "offsets-a-string",
        "device-index-wrapping-to-0",
        "device-index-wrapping-negative",
        "device-a-number",
        "dims-repeated",
        "dims-too-many",
        "dims-of-no-tensor",
        "dims-not-a-dict",
    ],
)
def test_a_header_that_lies_is_refused_as_damaged(change: Any) -> None:
    """Shapes, byte ranges, devices and names a header lies about are a ValueError (the
    engine's sign of a damaged answer, which it computes again), never another error or a
    tensor without a value: a shape or a byte range is a list of whole numbers, as the
    codec writes it, and not a string, floats or booleans read as numbers."""
    with pytest.raises(ValueError):
        smt.TENSOR.decode(_patched(torch.arange(12.0).reshape(3, 4), change))


def _with_header(value: Any, edit: Callable[[str], str]) -> memoryview:
    """The codec's bytes of ``value`` with the text of its JSON header changed by ``edit``."""
    data = bytes(_bytes(value))
    (size,) = struct.unpack("<Q", data[:8])
    raw = edit(data[8 : 8 + size].decode().rstrip()).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return memoryview(struct.pack("<Q", len(raw)) + raw + data[8 + size :])


@pytest.mark.parametrize(
    ("value", "edit"),
    [
        (
            torch.arange(12.0),
            lambda t: t[:-1] + ',"tensor":{"dtype":"F32","shape":[2,6],"data_offsets":[0,48]}}',
        ),
        (torch.arange(12.0), lambda t: t.replace('"shape":[12]', '"shape":[12],"shape":[3,4]')),
        (
            torch.arange(12.0),
            lambda t: t.replace(
                '"kind":"tensor"',
                '"devices":"{\\"tensor\\":\\"meta\\",\\"tensor\\":\\"cpu\\"}","kind":"tensor"',
            ),
        ),
        (
            (torch.ones(1), None),
            lambda t: t.replace('{\\"tuple\\":', '{\\"tuple\\":[null,0],\\"tuple\\":'),
        ),
    ],
    ids=["tensor-twice", "shape-twice", "device-twice", "tree-container-twice"],
)
def test_a_header_naming_a_key_twice_is_refused_as_damaged(
    value: Any, edit: Callable[[str], str]
) -> None:
    """The codec writes each key of a JSON object once: a header (or a string of its
    metadata) naming one twice is damaged, not read as whichever one a JSON reader keeps."""
    changed = _with_header(value, edit)
    assert bytes(changed) != bytes(_bytes(value)), "the edit changed nothing"
    with pytest.raises(ValueError):
        smt.TENSOR.decode(changed)


def test_two_tensors_claiming_the_same_bytes_are_refused() -> None:
    """Tensors of one answer never share memory: a header giving two the same bytes is
    damaged."""
    pair = {"a": torch.zeros(4), "b": torch.ones(4)}
    with pytest.raises(ValueError, match="claim the same bytes"):
        smt.TENSOR.decode(
            _patched(pair, lambda h: h["b"].update(data_offsets=h["a"]["data_offsets"]))
        )
    tuple_without_0 = _patched((torch.ones(2),), lambda h: h.update(x=h.pop("0")))
    with pytest.raises(ValueError):
        smt.TENSOR.decode(tuple_without_0)


def test_bytes_no_tensor_claims_are_refused() -> None:
    """The codec writes the tensors' bytes one after the other from the first, and nothing
    after the last: bytes past them, before them or between two are damage (safetensors
    forbids them too), never skipped."""
    data = bytes(_bytes(torch.arange(4.0)))
    with pytest.raises(ValueError, match="claims bytes up to 16, and the answer holds 24"):
        smt.TENSOR.decode(memoryview(data + bytes(8)))
    later = _patched(torch.arange(4.0), lambda h: h["tensor"].update(data_offsets=[8, 24]))
    with pytest.raises(ValueError, match="bytes no tensor claims"):
        smt.TENSOR.decode(memoryview(bytes(later) + bytes(8)))
    pair = {"a": torch.zeros(4), "b": torch.ones(4)}
    apart = _patched(pair, lambda h: h["b"].update(data_offsets=[24, 40]))
    with pytest.raises(ValueError, match="bytes no tensor claims"):
        smt.TENSOR.decode(memoryview(bytes(apart) + bytes(8)))
    empty = {"a": torch.zeros(0), "b": torch.ones(2, 0)}
    assert all(map(_same, smt.TENSOR.decode(_bytes(empty)).values(), empty.values()))


@pytest.mark.parametrize("elements", [4, 8192], ids=["copied", "in-place"])
def test_a_bool_tensor_of_bytes_other_than_0_and_1_is_refused(elements: int) -> None:
    """torch writes a bool as the byte 0 or 1: a bool answer holding another byte is damaged,
    not a tensor that disagrees with itself (``t == True`` false where ``t.int()`` is 2)."""
    value = torch.arange(elements) % 3 == 0
    data = bytearray(_bytes(value))
    assert _same(smt.TENSOR.decode(memoryview(bytes(data))), value)
    data[-3] = 2
    with pytest.raises(ValueError, match="bytes other than 0 and 1"):
        smt.TENSOR.decode(memoryview(bytes(data)))
    data[-3] = 255
    with pytest.raises(ValueError, match="bytes other than 0 and 1"):
        smt.TENSOR.decode(memoryview(bytes(data)))


class Bits(Node):
    """Bit 2 of each byte, as a uint8 mask viewed as bool: bytes 0 and 4."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return (x & 4).view(torch.bool)


def test_a_bool_tensor_of_bytes_other_than_0_and_1_is_not_written(store: Store) -> None:
    """A bool answer holding a byte torch never writes (a uint8 mask viewed as bool) is a
    CodecError when it is written, alone or as an item, saying how to make a bool of it:
    it was kept, and every later forward read it as damaged and computed it again."""
    fours = (torch.tensor([4, 5, 0, 1], dtype=torch.uint8) & 4).view(torch.bool)
    with pytest.raises(CodecError, match=r"it is a bool tensor .*bytes other than 0 and 1"):
        smt.TENSOR.encode(fours)
    with pytest.raises(CodecError, match=r"item \[1\] is a bool tensor .*`mask != 0`"):
        smt.TENSOR.encode((torch.ones(1), fours))
    g = Graph.somatize(Bits().named("bits").frozen().cached())
    with pytest.raises(CodecError, match="bytes other than 0 and 1"):
        g.forward(Opaque(torch.tensor([4, 5, 0, 1], dtype=torch.uint8)), store=store)
    made = fours != 0
    assert _same(smt.TENSOR.decode(_bytes(made)), made)


def test_long_headers_are_not_held_once_their_answers_are_gone() -> None:
    """Headers are kept, by their bytes, to be read once however many answers share them:
    a short one only (a header padded with spaces is valid), and so many bytes of them at
    most, so that what is held after the answers are gone stays small."""
    from somatize_torch import _codec_header

    def padded(value: torch.Tensor, spaces: int) -> memoryview:
        data = bytes(_bytes(value))
        (size,) = struct.unpack("<Q", data[:8])
        raw = data[8 : 8 + size] + b" " * spaces
        raw += b" " * (-(len(raw) + 8) % 8)
        return memoryview(struct.pack("<Q", len(raw)) + raw + data[8 + size :])

    for i in range(6):
        assert smt.TENSOR.decode(padded(torch.full((1,), float(i)), (1 << 20) + 8 * i)) == i
        assert all(len(raw) <= 64 << 10 for raw in _codec_header._HEADERS)
    for i in range(100):
        assert smt.TENSOR.decode(padded(torch.full((1,), float(i)), (60 << 10) + 8 * i)) == i
        assert sum(map(len, _codec_header._HEADERS)) <= 4 << 20
    short = _bytes(torch.ones(3))
    smt.TENSOR.decode(short)
    (size,) = struct.unpack("<Q", short[:8])
    assert bytes(short[8 : 8 + size]) in _codec_header._HEADERS


def test_one_element_with_any_stride_is_digested_and_kept() -> None:
    """A column of a batch of one (one element, stride 5 — contiguous to torch) is digested,
    row by row too, and encoded, as the same value laid out plainly."""
    column = torch.randn(1, 5)[:, 0]
    plain = torch.tensor([column.item()])
    assert smt.digest_tensor(column) == smt.digest_tensor(plain)
    assert smt.digest_rows(column) == smt.digest_rows(plain)
    corner = torch.randn(1, 8).t()[:1]  # shape (1, 1), strides (1, 8)
    assert raw_rows(corner) == raw_rows(torch.tensor([[corner.item()]]))
    assert torch.equal(smt.TENSOR.decode(_bytes(column[0])), column[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a process without CUDA")
def test_cuda_answer_lands_on_host_with_a_warning() -> None:
    """A tensor kept from a CUDA device is recalled onto the CPU, with a LandedOnHost warning."""
    data = bytearray(_bytes(torch.arange(3.0)))
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8 : 8 + size]))
    header["__metadata__"]["devices"] = json.dumps({"tensor": "cuda:0"})
    raw = json.dumps(header).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    patched = struct.pack("<Q", len(raw)) + raw + bytes(data[8 + size :])
    with pytest.warns(smt.LandedOnHost, match="no CUDA device"):
        back = smt.TENSOR.decode(memoryview(patched))
    assert back.device.type == "cpu" and torch.equal(back, torch.arange(3.0))


@pytest.mark.parametrize(
    "device", ["mps:0", "mps", "xpu:0", "mtia", "xla", "hpu", "lazy", "privateuseone", "ipu"]
)
def test_an_answer_kept_on_a_device_this_process_lacks_lands_on_host(device: str) -> None:
    """A tensor kept on a device of any kind this process has not (one kept on a Mac, read
    on Linux) is recalled onto the CPU with a LandedOnHost warning, in memory aligned as
    torch's own, as a CUDA tensor is where there is no CUDA: never another error."""
    kind = torch.device(device).type
    module = torch.backends.mps if kind == "mps" else getattr(torch, kind, None)
    if getattr(module, "is_available", lambda: False)():
        pytest.skip(f"this process has {kind} devices")
    value = torch.arange(12.0).reshape(3, 4)
    with pytest.warns(smt.LandedOnHost, match=f"no {device.split(':')[0].upper()} device"):
        back = smt.TENSOR.decode(_patched(value, _devices({"tensor": device})))
    assert _same(back, value) and back.data_ptr() % 64 == 0


def test_a_cuda_answer_of_a_device_past_those_present_lands_on_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tensor kept on ``cuda:3``, read where CUDA has fewer devices, lands on the CPU with
    a LandedOnHost warning rather than failing to move there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    value = torch.arange(3.0)
    with pytest.warns(smt.LandedOnHost, match="no CUDA device 3"):
        back = smt.TENSOR.decode(_patched(value, _devices({"tensor": "cuda:3"})))
    assert _same(back, value)


def test_an_xla_tensor_is_moved_back_where_torch_xla_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch has no module of its own for ``xla``: where ``torch_xla`` is loaded, a tensor
    kept from it goes back there (never imported to find out); elsewhere it lands on host."""
    from somatize_torch.codec import _usable

    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert not _usable(torch.device("xla"))
    monkeypatch.setitem(sys.modules, "torch_xla", types.ModuleType("torch_xla"))
    assert _usable(torch.device("xla"))


def test_codec_takes_tensors_and_leaves_plain_values() -> None:
    """Tensors and collections of them go to `tensor`; a tuple of ints stays `plain`."""
    assert CODECS.for_value(torch.ones(2)).name == "tensor"
    assert CODECS.for_value((torch.ones(2), torch.zeros(1))).name == "tensor"
    assert CODECS.for_value((1, 2)).name == "plain"
    assert CODECS.for_value([]).name == "plain"
    assert CODECS.for_value((None, None)).name == "plain"
    # A key safetensors keeps for itself is written in the shape, not as a tensor's name.
    back = smt.TENSOR.decode(_bytes({"__metadata__": torch.ones(1)}))
    assert list(back) == ["__metadata__"] and torch.equal(back["__metadata__"], torch.ones(1))


def test_opaque_tensor_is_keyed_by_content_dtype_and_shape() -> None:
    """Equal content gives one digest whatever the strides; dtype, shape or a value change it."""
    x = torch.arange(12.0).reshape(3, 4)
    same = torch.arange(12.0).reshape(3, 4).t().contiguous().t()
    assert not same.is_contiguous()
    assert Opaque(x).digest == Opaque(same).digest
    others = [x.reshape(4, 3), x.double(), x.clone().index_fill_(0, torch.tensor([1]), 0.5)]
    assert len({Opaque(x).digest, *(Opaque(o).digest for o in others)}) == 4
    assert Opaque((x,)).digest != Opaque(x).digest != Opaque({"0": x}).digest


class Total(Node):
    """The sum of a tensor, or of a tuple of tensors."""

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...], ctx: Any) -> float:
        return sum(float(t.sum()) for t in (x if isinstance(x, tuple) else (x,)))


def test_an_opaque_tensor_changed_in_place_is_weighed_again(store: Store) -> None:
    """A batch wrapped once and changed in place (a reused buffer) is keyed by its new
    content at the next forward: the answer is computed again, not the old one recalled."""
    batch = torch.zeros(4)
    what = Opaque(batch)
    g = Graph.somatize(Total().named("total").frozen().cached())
    assert g.forward(what, store=store) == 0.0
    batch += 1
    seen: list[dict[str, Any]] = []
    assert g.forward(what, store=store, watching=seen.append) == 4.0
    assert seen[0]["fact"] == "ran"


@pytest.mark.parametrize("reused", ["tensor", "tuple"])
def test_a_reused_unchanged_opaque_tensor_is_weighed_once(
    store: Store, monkeypatch: pytest.MonkeyPatch, reused: str
) -> None:
    """Forwarding one Opaque again weighs nothing while its tensors are unchanged (their
    version counters, memory and layout), and weighs again once one changes in place."""
    weighed: list[object] = []
    digest = smt.TENSOR.digest
    monkeypatch.setattr(smt.TENSOR, "digest", lambda value: weighed.append(value) or digest(value))
    batch = torch.randn(32, 3, 8, 8)
    what = Opaque(batch if reused == "tensor" else (batch, torch.ones(2)))
    g = Graph.somatize(Total().named("total").frozen().cached())
    for _ in range(3):
        g.forward(what, store=store)
    assert len(weighed) == 1
    batch.mul_(2)
    g.forward(what, store=store)
    g.forward(what, store=store)
    assert len(weighed) == 2
    what.value = batch.clone()  # another tensor, equal content: weighed, not trusted
    g.forward(what, store=store)
    assert len(weighed) == 3


@pytest.fixture(params=["blake3 package", "native library"])
def row_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Rows digested by the ``blake3`` package (native code off), or by the native host
    library (native code required, built here if it is not yet)."""
    native = request.param == "native library"
    monkeypatch.setenv(_native.ENV_MODE, "1" if native else "0")
    assert (_native.ready_host_library() is not None) == native
    return str(request.param)


def test_digest_rows_names_each_row_as_digest_tensor_does(row_path: str) -> None:
    """One call digests every row, each equal to digesting that row alone."""
    batch = torch.randn(7, 3, 2).bfloat16()
    rows = smt.digest_rows(batch)
    assert rows == [smt.digest_tensor(batch[i]) for i in range(7)]
    assert len(set(rows)) == 7
    assert smt.digest_rows(batch.transpose(1, 2).contiguous().transpose(1, 2)) == rows
    assert smt.digest_rows(torch.empty(0, 4)) == []
    with pytest.raises(ValueError, match="at least one dimension"):
        smt.digest_rows(torch.tensor(1.0))


@pytest.mark.parametrize("shape", [(101, 3, 32, 32), (257, 3, 16, 16), (67, 3, 64, 64)])
def test_digest_rows_of_a_large_batch_split_across_threads(
    row_path: str, shape: tuple[int, ...]
) -> None:
    """A batch large enough to be hashed on several threads names every row exactly as
    digesting that row alone does, in order (odd row counts, so the runs are uneven;
    rows of 12 KiB, 3 KiB and 48 KiB)."""
    batch = torch.randn(*shape)
    rows = smt.digest_rows(batch)
    assert rows == [smt.digest_tensor(batch[i]) for i in range(shape[0])]


@pytest.mark.parametrize("worker", ["started", "not started"])
def test_a_large_batch_on_two_cores_is_hashed_beside_the_librarys_worker(
    monkeypatch: pytest.MonkeyPatch, worker: str
) -> None:
    """On two cores, a batch hashed on both is shared between the calling thread and the
    native library's own worker, each taking the next rows until none is left: no thread
    of the Python pool is woken for it (the hand-off through a future and the interpreter
    lock cost a recalled batch a tenth of its digest, and a pool thread that gets little of
    a busy machine's CPU holds up its half). Where the worker cannot be started, the pool
    hashes it as before. Either way every row is named as digesting it alone names it."""
    monkeypatch.setenv(_native.ENV_MODE, "1")
    lib = _native.ready_host_library()
    assert lib is not None
    if worker == "not started":
        stand_in = types.SimpleNamespace(
            smz_blake3_host_rows=lib.smz_blake3_host_rows,
            smz_blake3_host_rows_begin=lambda *args: None,
        )
        monkeypatch.setattr(_native, "ready_host_library", lambda: stand_in)
    pooled: list[int] = []
    pool = smt_digest._pool
    monkeypatch.setattr(smt_digest, "_cores", lambda: 2)
    monkeypatch.setattr(smt_digest, "_pool", lambda: pooled.append(1) or pool())
    batch = torch.randn(67, 3, 64, 64)  # 3.1 MB: over the size hashed on every core
    assert smt.digest_rows(batch) == [smt.digest_tensor(batch[i]) for i in range(67)]
    assert bool(pooled) == (worker == "not started")


def test_a_batch_whose_job_on_the_worker_is_interrupted_as_it_begins_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C landing as a batch's job on the library's worker begins, before this thread
    waits for it, is raised, and the batch and the buffer the worker writes its digests
    into are kept for the process: the worker may still read the one and write the other,
    so neither memory is freed under it. The next batch is hashed as ever."""
    monkeypatch.setenv(_native.ENV_MODE, "1")
    lib = _native.ready_host_library()
    assert lib is not None

    def begin_interrupted(*args: Any) -> None:
        lib.smz_blake3_host_rows_wait(lib.smz_blake3_host_rows_begin(*args), 1)
        raise KeyboardInterrupt

    stand_in = types.SimpleNamespace(
        smz_blake3_host_rows=lib.smz_blake3_host_rows,
        smz_blake3_host_rows_begin=begin_interrupted,
    )
    monkeypatch.setattr(_native, "ready_host_library", lambda: stand_in)
    monkeypatch.setattr(smt_digest, "_cores", lambda: 2)
    monkeypatch.setattr(smt_digest, "_BEGUN_UNWAITED", [])
    batch = torch.randn(67, 3, 64, 64)
    with pytest.raises(KeyboardInterrupt):
        smt.digest_rows(batch)
    [(host, digests)] = smt_digest._BEGUN_UNWAITED
    assert host.data_ptr() == batch.data_ptr() and len(digests) == 32 * 67
    monkeypatch.setattr(_native, "ready_host_library", lambda: lib)
    assert smt.digest_rows(batch) == [smt.digest_tensor(batch[i]) for i in range(67)]


def test_digest_rows_of_short_and_ragged_rows(row_path: str) -> None:
    """Rows of no bytes, of one chunk or less, and rows whose last chunk is partial."""
    for batch in (
        torch.empty(5, 0),
        torch.arange(9, dtype=torch.uint8).reshape(9, 1),
        torch.randn(40, 3),
        torch.randn(33, 257),  # 1,028 bytes: one full chunk and 4 bytes
        torch.randn(300, 1000),  # 4,000 bytes, 1.2 MB in all: split across threads
    ):
        expected = [smt.digest_tensor(batch[i]) for i in range(batch.shape[0])]
        assert smt.digest_rows(batch) == expected, batch.shape


def test_rows_named_on_another_thread_are_the_rows_digests(row_path: str) -> None:
    """``raw_rows_later`` gives what ``raw_rows`` gives, for batches of every shape, on
    both paths; a device tensor or a 0-dim one is not started."""
    later = [
        (batch, raw_rows_later(batch))
        for batch in (
            torch.randn(64, 3, 64, 64),
            torch.randn(33, 257),
            torch.empty(5, 0),
            torch.empty(0, 4),
            torch.randn(7, 3, 2).bfloat16().transpose(1, 2),
        )
    ]
    for batch, started in later:
        assert started is not None
        assert started.result() == raw_rows(batch), batch.shape
    assert raw_rows_later(torch.tensor(1.0)) is None
    assert raw_rows_later(torch.randn(4, 4, device="meta")) is None


def _without_data() -> dict[str, torch.Tensor]:
    """Tensors with elements and no memory of their own to read them from: torch answers
    a data pointer of 0 for each."""
    from torch.testing._internal.two_tensor import TwoTensor

    values = torch.randn(3, 4)
    freed = torch.randn(8, 1024)
    freed.untyped_storage().resize_(0)
    return {
        "jagged nested": torch.nested.nested_tensor(
            [torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged
        ),
        "strided nested": torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)]),
        "wrapper subclass": TwoTensor(values, values.clone()),
        "freed storage": freed,
    }


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize(
    "kind", ["jagged nested", "strided nested", "wrapper subclass", "freed storage"]
)
def test_a_tensor_without_data_in_memory_is_refused_plainly(row_path: str, kind: str) -> None:
    """A nested tensor, a wrapper subclass and a tensor whose storage was freed are refused
    with a TypeError that says so, by every digest and on both paths: none is read at
    address 0."""
    tensor = _without_data()[kind]
    fragment = "nested .* tensor cannot be digested" if "nested" in kind else "holds no data"
    for digest in (raw_rows, raw_rows_later, smt.digest_rows, smt.digest_tensor):
        with pytest.raises(TypeError, match=fragment):
            digest(tensor)


def test_a_batch_dropped_while_its_rows_are_named_is_kept_until_they_are(row_path: str) -> None:
    """The thread reads memory the handle keeps alive: dropping both the batch and the
    handle before the result waits for the thread instead of freeing what it reads."""
    for _ in range(20):
        later = raw_rows_later(torch.randn(64, 3, 64, 64))
        assert later is not None
        del later
    batch = torch.randn(16, 3, 64, 64)
    started = raw_rows_later(batch)
    assert started is not None
    # A child forked meanwhile hashes rows of its own, and lets go of the parent's handle
    # without waiting for a thread it does not have.
    assert in_forked_child(_digest_in_child) is True
    assert in_forked_child(_let_go, started) is True
    assert started.result() == raw_rows(batch)


def _let_go(started: RowsLater) -> bool:
    started._wait(take_rest=False)
    return True


def test_unsupported_dtype_is_refused() -> None:
    """A dtype with no agreed layout is an error naming what to convert to; the codec
    refuses to write it with a CodecError naming it."""
    bits = torch.zeros(2, dtype=torch.uint8).view(torch.bits8)
    with pytest.raises(TypeError, match="Convert it to one of"):
        smt.digest_tensor(bits)
    with pytest.raises(CodecError, match=r"torch\.bits8"):
        smt.TENSOR.encode(bits)
    with pytest.raises(CodecError, match=r"torch\.bits8"):
        smt.TENSOR.encode((torch.ones(1), bits))


@pytest.mark.parametrize(
    "dtype",
    [torch.complex128, torch.complex32, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz],
    ids=str,
)
def test_complex128_complex32_and_fnuz_float8_are_kept_and_recalled(
    dtype: torch.dtype, store: Store
) -> None:
    """The dense dtypes safetensors has no name for are written under one in its manner,
    digested, kept, and recalled bit for bit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # complex32 is experimental in torch
        tensor = _sample(dtype)
        back = smt.TENSOR.decode(_bytes(tensor))
        assert back.dtype == dtype and torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))
        assert smt.digest_rows(tensor)[1] == smt.digest_tensor(tensor[1])
        graph = Graph.somatize(_Emits(tensor).named("emit").frozen().cached())
        first = graph.forward(0, store=store)
        again = graph.forward(0, store=store)
    assert graph.record.outcome["emit"] == "recalled"
    assert torch.equal(again.view(torch.uint8), first.view(torch.uint8))


class _Emits(Node):
    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def declare(self) -> dict[str, Any]:
        return {"dtype": str(self._tensor.dtype)}

    def forward(self, x: int, ctx: Any) -> torch.Tensor:
        return self._tensor.clone()


@pytest.mark.parametrize("elements", [6, 64 * 1024], ids=["small", "memory-mapped"])
def test_a_recalled_tensor_starts_where_torch_would_allocate_it(
    elements: int, store: Store
) -> None:
    """A recalled tensor's memory is 64-aligned, as torch's own CPU tensors are: CPU
    kernels take another path over memory aligned less, and round differently. A large
    answer is still read in place from the memory map; safetensors still opens it."""
    tensor = torch.randn(elements)
    key = "blake3:" + "5" * 64
    store.keep(key, smt.TENSOR.encode(tensor), "tensor")
    for _ in range(2):  # read from the file, then from what the store holds
        _, data = store.recall(key)
        back = smt.TENSOR.decode(data)
        assert back.data_ptr() % 64 == 0
        assert torch.equal(back, tensor)
    if elements > 1024:
        start = np.frombuffer(data, dtype=np.uint8).ctypes.data
        assert start <= back.data_ptr() < start + len(data)
    loaded = safetensors.torch.load(b"".join(bytes(p) for p in smt.TENSOR.encode(tensor)))
    assert torch.equal(loaded["tensor"], tensor)
    pieces = (torch.randn(3), torch.ones(5, dtype=torch.int8), torch.randn(2, 2).double())
    assert all(t.data_ptr() % 64 == 0 for t in smt.TENSOR.decode(_bytes(pieces)))


def test_importing_somatize_torch_initialises_no_cuda_and_registers_the_codec(
    tmp_path: Path,
) -> None:
    """In a fresh process: the codec appears with `import somatize.torch`, and CUDA stays cold."""
    code = (
        "import somatize, torch\n"
        "assert 'tensor' not in somatize.CODECS\n"
        "import somatize.torch\n"
        "assert 'tensor' in somatize.CODECS\n"
        "assert not torch.cuda.is_initialized(), 'CUDA was initialised'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _digest_in_child() -> bool:
    batch = torch.arange(64 * 3 * 64 * 64, dtype=torch.float32).reshape(64, 3, 64, 64)
    return smt.digest_rows(batch) == [smt.digest_tensor(row) for row in batch]


def test_rows_are_digested_in_a_forked_child(row_path: str) -> None:
    """A process forked after rows were hashed on several threads (a DataLoader worker)
    hashes rows on its own threads: the parent's pool has no threads in the child."""
    batch = torch.randn(64, 3, 64, 64)  # 3 MB: split across threads on both paths
    assert smt.digest_rows(batch) == [smt.digest_tensor(row) for row in batch]
    assert in_forked_child(_digest_in_child) is True


class Boxes(torch.Tensor):
    """A tensor subclass, as torchvision's ``tv_tensors.BoundingBoxes`` is one."""


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: torch.empty(3, device="meta"), "meta device"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
        (lambda: torch.empty(2**50, 0), "past 2\\*\\*48"),
        (
            lambda: torch.ones(2, 4).as_subclass(Boxes),
            r"`[\w.]*Boxes`.*as_subclass\(torch\.Tensor\)",
        ),
        (lambda: nn.Parameter(torch.ones(2)), r"`torch\.nn\.Parameter`.*\.detach\(\)"),
        (
            lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8),
            r"quantized torch\.quint8 tensor.*`x\.dequantize\(\)`",
        ),
        (lambda: torch.ones(2, 2).to_sparse(), r"sparse_coo torch\.float32 .*`x\.to_dense\(\)`"),
        (
            lambda: torch.zeros(2, dtype=torch.uint8).view(torch.int4),
            r"torch\.int4 tensor.*`x\.view\(torch\.uint8\)`",
        ),
    ],
    ids=["meta", "nested", "huge", "subclass", "parameter", "quantized", "sparse", "sub-byte"],
)
def test_a_tensor_the_codec_cannot_give_back_as_it_was_is_refused_saying_what_it_is(
    make: Callable[[], torch.Tensor], said: str
) -> None:
    """A meta tensor, a nested one, one with a dimension past 2**48, a tensor subclass and a
    Parameter are not accepted, and writing one (alone, as an item, as ``Opaque``) is a
    CodecError saying what it is and, for a subclass or a Parameter, how to make it a plain
    tensor; so is a quantized, sparse or sub-byte one, saying how to make it one the codec
    writes (where it said only its layout and dtype, and then to return a tensor) — where
    a meta or nested tensor failed inside torch, a huge empty one was read back as damaged,
    and a subclass or Parameter came back a plain tensor (its class, attributes and
    requires_grad lost)."""
    value = make()
    assert not smt.TENSOR.accepts(value)
    assert not smt.TENSOR.accepts({"x": value})
    with pytest.raises(CodecError, match=said):
        smt.TENSOR.encode(value)
    with pytest.raises(CodecError, match=rf"item \[1\] is .*{said}"):
        smt.TENSOR.encode((torch.ones(1), value))
    with pytest.raises(CodecError, match=said):
        Opaque(value)
    for codec in ("tensor", smt.TENSOR):  # the codec named, or given, refuses it as well
        with pytest.raises(CodecError, match=rf"`tensor` codec.*{said}"):
            Opaque(value, codec)


def test_an_opaque_given_a_codec_is_refused_a_value_that_codec_does_not_take() -> None:
    """``Opaque(value, codec)`` asks the codec as ``Opaque(value)`` does: a value not of its
    types is a CodecError naming both, where a string was weighed as nothing a tensor codec
    reads."""
    with pytest.raises(CodecError, match=r"`builtins\.str`.*`tensor` codec.*torch\.Tensor"):
        Opaque("a string", "tensor")
    assert Opaque(torch.ones(2), "tensor").digest == Opaque(torch.ones(2)).digest


class WidthOf(Node):
    """The width of the first box, by the box format the tensor carries."""

    def forward(self, boxes: Any, ctx: Any) -> float:
        first = boxes[0]
        return float(first[2] - first[0]) if boxes.fmt == "xyxy" else float(first[2])


def test_a_subclass_handed_with_the_codec_named_is_not_keyed_by_its_values_alone(
    store: Store,
) -> None:
    """Two boxes of the same values and other formats, each handed as ``Opaque(boxes,
    "tensor")``, are refused rather than keyed alike: the second recalled the first's
    width."""
    g = Graph.somatize(WidthOf().named("width").frozen().cached())
    boxes = torch.tensor([[10.0, 0.0, 30.0, 5.0]]).as_subclass(Boxes)
    boxes.fmt = "xyxy"  # type: ignore[attr-defined]
    with pytest.raises(CodecError, match="Boxes"):
        g.forward(Opaque(boxes, "tensor"), store=store)


class AsBoxes(Node):
    """Answers its input doubled, as a `Boxes`."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return (x * 2).as_subclass(Boxes)


def test_a_node_answering_a_tensor_subclass_is_refused_when_kept(store: Store) -> None:
    """A node whose answer is a tensor subclass is refused, naming the node and the class,
    rather than recalled as a plain tensor; without a store it answers as it computed."""
    graph = Graph.somatize(AsBoxes().named("boxes").frozen().cached())
    x = torch.ones(3)
    with pytest.raises(CodecError, match=r"the answer of `boxes` is a `[\w.]*Boxes`.*as_subclass"):
        graph.forward(Opaque(x), store=store)
    assert type(graph.forward(Opaque(x))) is Boxes
