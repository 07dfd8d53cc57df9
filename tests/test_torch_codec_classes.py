"""The tensor codec's answers kept as their own class: dataclasses (Hugging Face's
`ModelOutput`) and `torch.return_types` structseqs, found again by name, never imported."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import somatize.torch as smt
from somatize import CODECS, Broker, Graph, Node, Store, Worker
from somatize.codecs import Unreadable
from tests.test_torch_wrap import Answered, AnswersAsHuggingFace


@dataclasses.dataclass
class Pooled:
    """A plain dataclass answer: tensors, None and a nested tuple."""

    hidden: torch.Tensor
    pooled: torch.Tensor | None = None
    extra: tuple[torch.Tensor, ...] = ()


@dataclasses.dataclass
class Counted:
    """A dataclass with a field its constructor does not take."""

    hidden: torch.Tensor
    count: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass
class Named(str):
    """A dataclass that is a str: the str it is is no field."""

    hidden: torch.Tensor


class Slotted:
    """A class holding a slot of its own, beside the fields of a dataclass made of it."""

    __slots__ = ("note",)


@dataclasses.dataclass
class SlottedFields(Slotted):
    """A dataclass whose base holds a slot that is no field."""

    hidden: torch.Tensor


@dataclasses.dataclass
class Doubled:
    """A dataclass whose constructor changes what it is handed: made again from its
    fields, it is not what it was."""

    hidden: torch.Tensor

    def __post_init__(self) -> None:
        self.hidden = self.hidden * 2


def _bytes(value: object) -> memoryview:
    return memoryview(b"".join(bytes(piece) for piece in smt.TENSOR.encode(value)))


def _patched(value: Any, change: Callable[[dict[str, Any]], None]) -> memoryview:
    """The codec's bytes of ``value`` with the shape in its header changed by ``change``."""
    data = bytes(_bytes(value))
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    tree = json.loads(header["__metadata__"]["tree"])
    change(tree)
    header["__metadata__"]["tree"] = json.dumps(tree)
    raw = json.dumps(header).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    return memoryview(struct.pack("<Q", len(raw)) + raw + data[8 + size :])


def _alike(a: Any, b: Any) -> bool:
    """Equal values of the same classes all the way down: fields, keys in their order."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        fields = [f.name for f in dataclasses.fields(a)]
        if not all(_alike(getattr(a, f), getattr(b, f)) for f in fields):
            return False
        if not isinstance(a, dict):
            return True
    if isinstance(a, dict):
        return list(a) == list(b) and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _values() -> list[Any]:
    h = torch.randn(3, 4)
    return [
        Answered(logits=h, hidden=None, loss=torch.ones(())),
        Answered(logits=h),
        Pooled(h, None, (h * 2,)),
        {"out": Pooled(h, h.sum(1))},
        h.max(dim=1),
        h.topk(2),
        (h.sort(dim=0), None),
    ]


@pytest.mark.parametrize(
    "at", range(7), ids=["output", "one-field", "dataclass", "inside", "max", "topk", "sort"]
)
def test_dataclasses_and_structseqs_come_back_as_their_own_class(at: int) -> None:
    """A `ModelOutput` (a dataclass that is an `OrderedDict` of its fields not None), a
    plain dataclass and a `torch.return_types` structseq are kept, and come back as their
    own class with the same fields and keys; digested, equal values weigh the same."""
    value = _values()[at]
    assert smt.TENSOR.refusal(value) is None
    assert CODECS.for_value(value).name == "tensor"
    back = smt.TENSOR.decode(_bytes(value))
    assert _alike(back, value)
    assert smt.TENSOR.digest(back) == smt.TENSOR.digest(value)


def test_a_model_output_read_back_is_read_as_it_was() -> None:
    """A recalled `ModelOutput` is read by attribute, by key and by place; a field that was
    None is None and no key."""
    h = torch.randn(2, 3)
    back = smt.TENSOR.decode(_bytes(Answered(logits=h, loss=torch.zeros(()))))
    assert type(back) is Answered
    assert list(back.keys()) == ["logits", "loss"]
    assert back.hidden is None and "hidden" not in back
    assert torch.equal(back.logits, h) and torch.equal(back["logits"], h)
    assert torch.equal(back[1], torch.zeros(()))


def test_the_class_of_a_kept_value_is_part_of_its_digest() -> None:
    """Equal fields of another class, or of a plain dict, weigh another digest."""
    h = torch.ones(2)
    kinds = [Answered(logits=h), {"logits": h}, Pooled(h), (h, None), h.max(dim=0)]
    assert len({smt.TENSOR.digest(v) for v in kinds}) == len(kinds)
    assert smt.TENSOR.digest(h.max(dim=0)) != smt.TENSOR.digest(h.min(dim=0))


def _local() -> Any:
    @dataclasses.dataclass
    class Local:
        x: torch.Tensor

    return Local(torch.ones(1))


def _extra() -> Pooled:
    value = Pooled(torch.ones(1))
    value.note = torch.ones(1)  # type: ignore[attr-defined]
    return value


def _key_beside() -> Answered:
    value = Answered(logits=torch.ones(1))
    value["other"] = torch.zeros(1)
    return value


def _run_by_exec() -> Any:
    """A dataclass made by code run by `exec` in a namespace of its own, as a notebook
    runner or `runpy.run_path` runs a file: its class names a module that does not hold
    it."""
    namespace: dict[str, Any] = {"__name__": "somatize_cell"}
    cell = "import dataclasses\n@dataclasses.dataclass\nclass Out:\n    hidden: object\n"
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), namespace)
    return namespace["Out"](torch.ones(1))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (Counted(torch.ones(1)), "dataclass, which its constructor does not make"),
        (Named(torch.ones(1)), "dataclass, which its constructor does not make"),
        (SlottedFields(torch.ones(1)), "dataclass, which its constructor does not make"),
        (_local(), "dataclass, whose class cannot be found again by its name"),
        (_local(), "its name: it is defined inside a function"),
        (_run_by_exec(), "module `somatize_cell` holds no such class, as for code run by `exec`"),
        (Doubled(torch.ones(1)), "made again from its fields, does not give back as it is"),
        (_extra(), "dataclass holding `note`, no field"),
        (_key_beside(), r"item \['other'\] is a key .* not the field of its name"),
        (Pooled(torch.ones(1), None, (3,)), r"item .extra\[0\] is a `builtins.int`"),
    ],
    ids=[
        "not-init",
        "str",
        "slot",
        "local",
        "local-why",
        "exec",
        "rebuilt-differs",
        "attribute",
        "key",
        "int-field",
    ],
)
def test_a_dataclass_that_cannot_come_back_as_it_is_is_refused(value: Any, why: str) -> None:
    """A dataclass with a field its constructor does not take, one defined inside a
    function, one its class does not make again as it is, or one holding what is no field
    or what the codec does not write, is refused, naming why."""
    assert not smt.TENSOR.accepts(value)
    refusal = smt.TENSOR.refusal(value)
    assert refusal is not None and re.search(why, refusal), refusal


def _more_fields(tree: dict[str, Any]) -> None:
    tree["fields"].append("more")
    tree["items"].append(None)


@pytest.mark.parametrize(
    ("value", "change", "said"),
    [
        (Answered(logits=torch.ones(1)), {"dataclass": "somatize_gone:Answered"}, "no such"),
        (Pooled(torch.ones(1)), _more_fields, "no such class"),
        (Answered(logits=torch.ones(1)), {"keys": None}, "the class changed"),
        (torch.ones(2).max(dim=0), {"structseq": "torch.return_types:gone"}, "no such class"),
        (torch.ones(2).max(dim=0), {"fields": ["indices", "values"]}, "no such class"),
    ],
    ids=["not-loaded", "fields", "keys", "structseq-gone", "structseq-fields"],
)
def test_a_kept_class_not_loaded_or_changed_is_unreadable(
    value: Any, change: Any, said: str
) -> None:
    """A kept dataclass or structseq whose class is not loaded, has other fields, or is a
    dict now and was not kept as one, is Unreadable: computed again, never a value other
    than what was kept."""
    changed = change if callable(change) else lambda tree: tree.update(change)
    with pytest.raises(Unreadable, match=said):
        smt.TENSOR.decode(_patched(value, changed))


def test_a_shape_naming_keys_that_are_no_fields_is_damaged() -> None:
    """Keys a dataclass's shape records that are not its fields, or twice, are damage."""
    for keys in (["logits", "logits"], ["nothing"], "logits"):

        def changed(tree: dict[str, Any], keys: Any = keys) -> None:
            tree["keys"] = keys

        with pytest.raises(ValueError, match="damaged") as why:
            smt.TENSOR.decode(_patched(Answered(logits=torch.ones(1)), changed))
        assert not isinstance(why.value, Unreadable)


class _Outputs(Node):
    """Answers a dataclass whose module it loads only when it runs."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self.calls = 0

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, x: int, ctx: Any) -> Any:
        self.calls += 1
        sys.modules[self._module.__name__] = self._module  # as `import` inside forward would
        return self._module.Output(hidden=torch.ones(2) * x)


def _output_class(module: types.ModuleType, *fields: str) -> type:
    kind = dataclasses.make_dataclass(
        "Output",
        [(f, Any, None) for f in fields],
        bases=(dict,),
        namespace={"__post_init__": Answered.__post_init__, "__module__": module.__name__},
    )
    module.Output = kind  # type: ignore[attr-defined]
    return kind


def test_a_graph_nodes_model_output_is_recalled_and_computed_again_when_its_class_changed(
    store: Store,
) -> None:
    """A node answering a `ModelOutput`-like dataclass is recalled as its own class; where
    its class is not loaded, or has other fields, the answer is computed again with an
    ``unreadable`` fact, nothing set aside as damaged."""
    module = types.ModuleType("somatize_outputs_here")
    kind = _output_class(module, "hidden", "pooled")
    outputs = _Outputs(module)
    graph = Graph.somatize(outputs.named("out").frozen().cached())
    try:
        first = graph.forward(2, store=store)
        again = graph.forward(2, store=store)
        assert type(again) is kind and list(again) == ["hidden"] and again.pooled is None
        assert torch.equal(again.hidden, first.hidden) and outputs.calls == 1
        del sys.modules[module.__name__]  # not loaded: the node loads it when it runs
        _computed_again(graph, store, kind, first.hidden)
        kind = _output_class(module, "hidden", "pooled", "attentions")
        _computed_again(graph, store, kind, first.hidden)
        assert outputs.calls == 3
        assert not (Path(store.root) / "quarantine").exists()
    finally:
        sys.modules.pop(module.__name__, None)


def _computed_again(graph: Graph, store: Store, kind: type, hidden: torch.Tensor) -> None:
    seen: list[dict[str, Any]] = []
    back = graph.forward(2, store=store, watching=seen.append)
    assert [f["fact"] for f in seen][:2] == ["unreadable", "ran"], seen
    assert type(back) is kind and torch.equal(back["hidden"], hidden)


class _OutputsOf(Node):
    """Answers the dataclass ``Output`` of the loaded module it names."""

    def __init__(self, module: str) -> None:
        self.module = module

    def forward(self, x: int, ctx: Any) -> Any:
        return sys.modules[self.module].Output(hidden=torch.ones(2) * x)


def _store_in(home: str, folder: Path) -> Store:
    if home == "directory":
        return Store(folder)
    from tests.conftest_s3 import s3_options, s3_url

    cache = {"cache": folder / "cache"} if home == "bucket, cached" else {}
    return Store.on_bucket(s3_url(), **s3_options(), **cache)


@pytest.mark.parametrize("home", ["directory", "bucket", "bucket, cached"])
def test_an_answer_a_worker_keeps_in_place_of_an_unreadable_one_is_recalled_next(
    home: str, tmp_path: Path
) -> None:
    """An answer read back unreadable here (its class has other fields now) that a network
    worker computes again and keeps in its place is recalled by the next forward, not
    read back unreadable and computed again at every forward."""
    store = _store_in(home, tmp_path)
    module = types.ModuleType("somatize_outputs_kept_there")
    sys.modules[module.__name__] = module
    graph = Graph.somatize(_OutputsOf(module.__name__).named("out").frozen().cached().at("w1"))
    broker = Broker.embedded({"w1": Worker.generic(mode="network")})
    try:
        _output_class(module, "hidden")
        graph.forward(2, store=store)
        kind = _output_class(module, "hidden", "pooled")
        said = []
        for _ in range(3):
            seen: list[dict[str, Any]] = []
            back = graph.forward(2, store=store, broker=broker, watching=seen.append)
            assert type(back) is kind and torch.equal(back.hidden, torch.ones(2) * 2)
            said.append([f["fact"] for f in seen if f["fact"] != "crossed"])
        assert said[0] == ["unreadable", "ran", "kept", "finished"], said
        assert said[1:] == [["recalled", "finished"]] * 2, said
    finally:
        sys.modules.pop(module.__name__, None)


def test_a_model_answering_a_model_output_is_cached_whole(store: Store) -> None:
    """`wrap(model, frozen=True, cached=True)` over a model answering a `ModelOutput` keeps
    it and recalls it at the next call, as its own class, equal to what it computed."""
    torch.manual_seed(0)
    model = AnswersAsHuggingFace()
    wrapped = smt.wrap(model, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x, labels = torch.randn(3, 6), torch.randn(3, 2)
    for args in ((x,), (x, labels)):
        computed, recalled, expected = wrapped(*args), wrapped(*args), model(*args)
        for answered in (computed, recalled):
            assert _alike(answered, expected)
        assert (recalled.loss is None) is (len(args) == 1)
        assert torch.equal(recalled["logits"], expected.logits)
    assert wrapped.counts["answers_as_hugging_face"] == {"ran": 2, "kept": 2, "recalled": 2}


class AnswersTwice(torch.nn.Module):
    """Answers a `ModelOutput` holding one tensor in two fields, as Hugging Face's does
    its last hidden state and the last of its hidden states, and its input in a third."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Answered:
        h = self.head(x)
        return Answered(logits=h, hidden=h, loss=x)


def test_a_model_output_computed_or_recalled_holds_each_tensor_in_memory_of_its_own(
    store: Store,
) -> None:
    """A `ModelOutput` whose fields share memory with each other or with the input is
    answered, computed as recalled, with each tensor in memory of its own: a write into
    one field changes no other, nor the input, on a miss as on a hit."""
    model = AnswersTwice()
    wrapped = smt.wrap(model, frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    for _ in range(2):  # computed, then recalled
        out = wrapped(x)
        assert type(out) is Answered and torch.equal(out.hidden, model(x).hidden)
        out.logits.add_(1)
        out.loss.add_(1)
        assert torch.equal(out.hidden, model(x).hidden) and torch.equal(out.loss, x + 1)
        assert out["logits"] is out.logits
    assert wrapped.counts["answers_twice"]["recalled"] == 1


_MADE: list[str] = []
"""What :class:`Noted`'s constructor was run for: none of its code runs for a read."""


@dataclasses.dataclass
class Noted:
    """A dataclass whose `__post_init__` does something beside its fields (here, notes it
    ran), as one a store might name to have its code run."""

    hidden: torch.Tensor
    pooled: torch.Tensor | None = None

    def __post_init__(self) -> None:
        _MADE.append("made")


def test_reading_a_dataclass_runs_no_code_of_its_class() -> None:
    """A kept dataclass is made again as it was kept, not by its constructor: a store
    naming any loaded dataclass does not get its code run, as it gets no namedtuple's."""
    value = Noted(torch.ones(2), torch.zeros(1))
    data = _bytes(value)
    _MADE.clear()
    back = smt.TENSOR.decode(data)
    assert _MADE == []
    assert _alike(back, value)
    output = smt.TENSOR.decode(_bytes(Answered(logits=torch.ones(1), loss=torch.zeros(()))))
    assert type(output) is Answered and list(output) == ["logits", "loss"]
    assert output.hidden is None and torch.equal(output[1], torch.zeros(()))


def test_a_dataclass_kept_as_a_dict_whose_class_is_none_now_is_unreadable() -> None:
    """A kept dataclass's keys say whether it was a dict: one kept as a dict whose class is
    none now is computed again rather than given back other."""
    with pytest.raises(Unreadable, match="the class changed"):
        smt.TENSOR.decode(_patched(Pooled(torch.ones(1)), lambda tree: tree.update(keys=[])))


class AnswersNoted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Noted:
        return Noted(self.head(x))


def test_a_recalled_dataclass_answer_runs_no_code_of_its_class(store: Store) -> None:
    """A cached module's dataclass answer, recalled, runs none of its class's code: neither
    to read it nor to place it (each hit of a row cache would run it)."""
    wrapped = smt.wrap(AnswersNoted(), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    computed = wrapped(x)
    _MADE.clear()
    recalled = wrapped(x)
    assert wrapped.counts["answers_noted"]["recalled"] == 1
    assert _MADE == []
    assert _alike(recalled, computed)


class AnswersMax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(x).max(dim=1)


def test_a_hits_classes_are_not_looked_into_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a class of an answer is (a namedtuple, a structseq, a dataclass, its fields) is
    found once: a hit, on a row cache at every batch, does not ask it again."""
    from somatize_torch import _codec_tree

    wrapped = smt.wrap(AnswersMax(), frozen=True, cached=True, store=store)
    smt.freeze(wrapped)
    x = torch.randn(2, 4)
    computed = wrapped(x)
    asked: list[type] = []
    looked = _codec_tree._form
    monkeypatch.setattr(_codec_tree, "_form", lambda kind: asked.append(kind) or looked(kind))
    recalled = wrapped(x)
    assert wrapped.counts["answers_max"]["recalled"] == 1
    assert asked == []
    assert _alike(recalled, computed)


@dataclasses.dataclass
class Propertied:
    """A dataclass whose field is set through a property: code of its class runs for each
    value set, made by its constructor or not."""

    hidden: torch.Tensor
    pooled: torch.Tensor | None = None


def _set_hidden(self: Propertied, value: torch.Tensor) -> None:
    _MADE.append("set")
    self.__dict__["hidden"] = value


setattr(Propertied, "hidden", property(lambda self: self.__dict__["hidden"], _set_hidden))  # noqa: B010  # after the class, as a dataclass takes it for the default otherwise


def test_a_dataclass_whose_field_is_a_property_is_neither_kept_nor_read() -> None:
    """A field set through a property is refused, and a store naming such a class is
    computed again: setting it would run the class's code."""
    refusal = smt.TENSOR.refusal(Propertied(torch.ones(1)))
    assert refusal is not None and "property" in refusal, refusal
    named = f"{__name__}:Propertied"
    data = _patched(Noted(torch.ones(1)), lambda tree: tree.update(dataclass=named))
    _MADE.clear()
    with pytest.raises(Unreadable, match="no such class"):
        smt.TENSOR.decode(data)
    assert _MADE == []
