"""The engine: one have() per forward, recall and spare, facts in order, and failures."""

from __future__ import annotations

import copy
import enum
import os
import pickle
import shutil
import sys
import threading
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from somatize import (
    CODECS,
    AlreadyBuilt,
    Codec,
    CodecError,
    Drifted,
    Graph,
    Node,
    NodeFailed,
    Opaque,
    Store,
    Undeclared,
    WatcherFailed,
    Worker,
    plan,
)
from somatize.broker import Broker, UnknownWorker
from somatize.graph import UnknownNode
from somatize.store import BadAddress, BucketStore, LocalStore
from tests.conftest_s3 import s3_options, s3_url
from tests.nodes import Echo, Fails, Largest, Rows, Scale, Slotted, Square


def _chain() -> tuple[Graph, Rows, Scale, Largest]:
    rows, scale, top = Rows(), Scale(), Largest()
    g = Graph.somatize(
        rows.named("rows").frozen()
        >> scale.named("scale").frozen()
        >> top.named("top").frozen().cached()
    )
    return g, rows, scale, top


class CountingStore(LocalStore):
    """A local store that counts the calls to have()."""

    have_calls = 0

    def have(self, keys: Any) -> set[str]:
        self.have_calls += 1
        return super().have(keys)


def test_second_forward_recalls_and_spares(store: Store) -> None:
    """The first forward runs and keeps; the second recalls and spares what only it needed."""
    g, rows, scale, top = _chain()
    first: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=store, watching=first.append) == 14.0
    assert [f["fact"] for f in first] == ["ran", "ran", "ran", "kept", "finished"]
    second: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=store, watching=second.append) == 14.0
    assert [(f["fact"], f.get("node")) for f in second] == [
        ("spared", "rows"),
        ("spared", "scale"),
        ("recalled", "top"),
        ("finished", None),
    ]
    assert second[2]["key"] == first[3]["key"]
    assert (rows.calls, scale.calls, top.calls) == (1, 1, 1)
    assert g.record is not None and g.record.outcome == {
        "rows": "spared",
        "scale": "spared",
        "top": "recalled",
    }


def test_one_have_query_per_forward(store: Store) -> None:
    """The store is asked once per forward, whatever the number of cached nodes."""
    counting = CountingStore(store.root)
    g = Graph.somatize(
        Rows().named("rows").frozen().cached()
        >> (Scale(1.0).frozen().cached(), Scale(2.0).frozen().cached())
    )
    g.forward({"at": 0, "take": 4}, store=counting)
    g.forward({"at": 0, "take": 4}, store=counting)
    assert counting.have_calls == 2


class HidingStore(LocalStore):
    """A local store whose have() does not tell of the keys in ``hidden``."""

    hidden: frozenset[str] = frozenset()

    def have(self, keys: Any) -> set[str]:
        return super().have(keys) - self.hidden


def test_an_input_seen_again_is_planned_by_what_the_store_has_and_what_is_asked(
    store: Store,
) -> None:
    """The same input on the same graph is recalled only while the store says it has the
    answer, spares only what the outputs asked for do not need, and runs again once a
    node it depends on is changed: what was decided for it before is not taken again
    when any of these differs."""
    hiding = HidingStore(store.root)
    g, rows, scale, top = _chain()
    x = {"at": 0, "take": 8}

    def outcome(**kwargs: Any) -> dict[str, str]:
        g.forward(x, store=hiding, **kwargs)
        assert g.record is not None
        return g.record.outcome

    assert outcome() == {"rows": "ran", "scale": "ran", "top": "ran"}
    recalled = {"rows": "spared", "scale": "spared", "top": "recalled"}
    assert outcome() == recalled
    key = g.record.facts[2]["key"]  # type: ignore[union-attr]
    hiding.hidden = frozenset({key})
    assert outcome() == {"rows": "ran", "scale": "ran", "top": "ran"}
    assert top.calls == 2
    hiding.hidden = frozenset()
    assert outcome() == recalled
    assert outcome(outputs="scale") == {"rows": "ran", "scale": "ran", "top": "spared"}
    assert outcome(outputs=("scale", "top")) == {"rows": "ran", "scale": "ran", "top": "recalled"}
    assert outcome() == recalled
    assert g.forward(x, store=hiding) == 14.0
    scale.by = 3.0
    assert g.forward(x, store=hiding) == 21.0
    assert g.record.outcome == {"rows": "ran", "scale": "ran", "top": "ran"}
    scale.by = 2.0
    assert g.forward(x, store=hiding) == 14.0
    assert g.record.outcome == recalled
    assert (rows.calls, scale.calls, top.calls) == (5, 5, 3)


def test_an_input_changed_in_place_is_another_question(store: Store) -> None:
    """A coordinate changed in place between forwards is keyed as it is now: its answer
    is computed, not recalled from what the coordinate held before."""
    g, rows, _, _ = _chain()
    x = {"at": 0, "take": 8}
    assert g.forward(x, store=store) == g.forward(x, store=store) == 14.0
    x["take"] = 4
    assert g.forward(x, store=store) == 6.0
    x["at"] = True  # equal to 1, but another question
    assert g.forward(x, store=store) == 8.0
    x["at"] = 1
    assert g.forward(x, store=store) == 8.0
    assert rows.calls == 4


def test_store_as_path(tmp_path: Path) -> None:
    """forward(store=...) takes a directory path as well as a Store."""
    g, _, _, top = _chain()
    g.forward({"at": 0, "take": 8}, store=tmp_path / "s")
    g.forward({"at": 0, "take": 8}, store=str(tmp_path / "s"))
    assert top.calls == 1


def _opener(home: str, where: Path) -> Callable[[], Store]:
    """Opens, each time it is called, a new object of one store: a directory, or a prefix
    of the bucket on loopback (with a cache folder in front, for ``bucket with a cache``)."""
    if home == "local":
        return lambda: Store(where / "s")
    url, options = s3_url(), s3_options()
    cache = where / "cache" if home == "bucket with a cache" else None
    return lambda: Store.on_bucket(url, cache=cache, **options)


def _remove_blobs(store: Store) -> None:
    """Removes every blob of ``store`` (and of the cache in front of it)."""
    if isinstance(store, LocalStore):
        for blob in (store.root / "blobs").rglob("*"):
            if blob.is_file():
                blob.unlink()
        return
    assert isinstance(store, BucketStore)
    store.fs.rm(store.fs.find(f"{store.root}/blobs"))
    if store.cache is not None:
        _remove_blobs(store.cache)


@pytest.mark.parametrize("home", ["local", "bucket", "bucket with a cache"])
def test_a_store_holds_fewer_attributes_than_objects_share(tmp_path: Path, home: str) -> None:
    """A store, local or on a bucket, that recalled answers another object kept, was asked
    for keys it lacks, had a blob gone, kept an answer, was collected and was closed holds
    fewer than 30 attributes: CPython (3.11 on) shares the keys of no more among the objects
    of a class, and makes the dozen calls a recalled forward makes on its store fast only on
    an object whose keys are shared."""
    g, _, _, _ = _chain()
    opened = _opener(home, tmp_path)
    store = opened()
    g.forward({"at": 0, "take": 8}, store=opened())
    g.forward({"at": 0, "take": 8}, store=store)
    g.forward({"at": 0, "take": 8}, store=store)
    assert store.have(["blake3:" + "0" * 64]) == set()
    _remove_blobs(store)
    g.forward({"at": 0, "take": 8}, store=store)
    g.forward({"at": 8, "take": 8}, store=store)
    store.gc()
    store.close()
    assert len(vars(store)) < 30, sorted(vars(store))


def test_store_as_path_is_opened_where_it_names_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory named again at a later forward is the one it names then: one removed
    since (a cache cleared with `rm -rf`) is a new, empty store there, and a relative path
    is taken from the directory the program is in at that forward."""
    g, _, _, top = _chain()
    span = {"at": 0, "take": 8}
    where = tmp_path / "s"
    g.forward(span, store=str(where))
    shutil.rmtree(where)
    g.forward(span, store=str(where))  # the directory is made again, and the answer kept
    assert top.calls == 2
    kept = g.record.facts[-2]
    assert kept["fact"] == "kept"
    assert Store(where).have([kept["key"]]) == {kept["key"]}
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    g.forward(span, store="cache")
    monkeypatch.chdir(second)
    g.forward(span, store="cache")  # another directory's `cache`: nothing kept there yet
    assert top.calls == 4
    assert (second / "cache" / "answers").is_dir()


def test_store_as_path_is_not_taken_for_another_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two paths are one store only when they name one directory: `a/../b` through a
    link `a` is not `b`, and `~/s` is not a directory `~` of the current one."""
    g, _, _, top = _chain()
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "a").symlink_to(tmp_path / "x" / "y")
    monkeypatch.chdir(tmp_path)
    g.forward({"at": 0, "take": 8}, store="a/../b")  # x/b, where the link leads
    assert (tmp_path / "x" / "b" / "answers").is_dir()
    g.forward({"at": 0, "take": 8}, store="b")  # b, beside a: another store
    assert top.calls == 2
    assert (tmp_path / "b" / "answers").is_dir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    g.forward({"at": 0, "take": 8}, store="~/s")
    assert (tmp_path / "home" / "s" / "answers").is_dir()
    g.forward({"at": 0, "take": 8}, store=str(tmp_path / "~" / "s"))
    assert top.calls == 4
    assert (tmp_path / "~" / "s" / "answers").is_dir()


def test_store_as_relative_path_from_a_removed_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path from a current directory that was removed names nothing: refused
    saying so, where an absolute one still opens."""
    g, _, _, top = _chain()
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    g.forward({"at": 0, "take": 8}, store="cache")
    shutil.rmtree(gone)
    with pytest.raises(BadAddress, match="current directory, which is gone"):
        g.forward({"at": 0, "take": 8}, store="cache")
    g.forward({"at": 0, "take": 8}, store=str(tmp_path / "kept"))
    assert top.calls == 2


def test_no_store_runs_everything() -> None:
    """Without a store nothing is kept or recalled."""
    g, rows, _, top = _chain()
    g.forward({"at": 0, "take": 8})
    g.forward({"at": 0, "take": 8})
    assert rows.calls == top.calls == 2


def test_different_input_misses(store: Store) -> None:
    """Another span is another question."""
    g, rows, _, _ = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    g.forward({"at": 8, "take": 8}, store=store)
    assert rows.calls == 2


def _chain_kept(store: Store) -> tuple[Graph, Largest, list[Path]]:
    """A chain run once with ``store``; its top node, and the blobs the run kept."""
    g, _, _, top = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    return g, top, [blob for blob in (store.root / "blobs").rglob("*") if blob.is_file()]


def test_record_whose_bytes_are_gone_is_a_miss(store: Store) -> None:
    """An answer record whose blob was deleted is not a hit: the node runs again."""
    g, top, blobs = _chain_kept(store)
    for blob in blobs:
        blob.unlink()
    fresh = Store(store.root)
    assert g.forward({"at": 0, "take": 8}, store=fresh) == 14.0
    assert top.calls == 2


def test_damaged_blob_is_recomputed_and_said(store: Store) -> None:
    """A blob whose bytes changed is never returned: a corrupt fact, and the node runs."""
    g, top, blobs = _chain_kept(store)
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        data[-1] ^= 0xFF
        blob.write_bytes(bytes(data))
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=Store(store.root), watching=seen.append) == 14.0
    assert [f["fact"] for f in seen][:2] == ["corrupt", "ran"]
    assert top.calls == 2


def test_a_damaged_pack_is_one_corrupt_fact_saying_how_many_items_it_held(
    store: Store,
) -> None:
    """A mapped node's items read back from one damaged pack are said in one `corrupt`
    fact, whose `items` and `of` say how many of the items handed it held (an item handed
    twice counted twice, as `ran` counts it), not one fact per item; they all run again."""
    square = Square()
    g = Graph.somatize(square.named("square").frozen().mapped().cached())
    handed = [*range(40), 7]
    g.forward(handed, store=store)
    [blob] = [blob for blob in (Path(store.root) / "blobs").rglob("*") if blob.is_file()]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    seen: list[dict[str, Any]] = []
    assert g.forward(handed, store=Store(store.root), watching=seen.append) == [
        i * i for i in handed
    ]
    said = [f for f in seen if f["fact"] == "corrupt"]
    assert len(said) == 1, said
    assert (said[0]["items"], said[0]["of"]) == (41, 41)
    assert blob.name in said[0]["why"]
    assert square.calls[-1] == list(range(40))
    assert [(f["items"], f["of"]) for f in seen if f["fact"] == "ran"] == [(41, 41)]


@pytest.mark.parametrize("codec", ["tensor", "arrow"])
def test_an_answer_in_a_codec_not_registered_is_unreadable_not_corrupt(
    store: Store, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """An answer kept by a codec this process has not registered (a tensor, read without
    `import somatize.torch`) is no damage: an `unreadable` fact saying what to import, the
    node computed again, nothing set aside; read back once the codec is there."""
    g, top, _ = _chain_kept(store)
    [key] = [f["key"] for f in g.record.facts if f["fact"] == "kept"]
    store.keep(key, store.recall(key)[1], codec)
    monkeypatch.delitem(CODECS._by_name, codec, raising=False)
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=Store(store.root), watching=seen.append) == 14.0
    assert [f["fact"] for f in seen][:2] == ["unreadable", "ran"]
    home = {"tensor": "somatize.torch", "arrow": "somatize.data"}[codec]
    assert f"`import {home}`" in seen[0]["why"]
    assert f"`{codec}` codec" in seen[0]["why"]
    assert not (store.root / "quarantine").exists()
    assert top.calls == 2


def test_failing_node_named_and_nothing_kept_below(store: Store) -> None:
    """A node that raises is named in the error; nothing is kept for it or below it."""
    below = Echo().named("below").frozen().cached()
    g = Graph.somatize(Rows().named("rows").frozen() >> Fails().named("boom").frozen() >> below)
    with pytest.raises(NodeFailed, match=r"`boom` \(Fails\) raised ZeroDivisionError: on purpose"):
        g.forward({"at": 0, "take": 3}, store=store)
    assert below.calls == 0
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    assert g.record is not None and g.record.outcome["boom"] == "failed"


def test_non_canonical_input_refused_without_opaque(store: Store) -> None:
    """An input with no canonical form must be wrapped in Opaque; nothing is kept."""
    g, rows, _, _ = _chain()
    with pytest.raises(TypeError, match="Opaque"):
        g.forward({"at": 0, "take": {1, 2}}, store=store)
    assert rows.calls == 0


def test_opaque_input_is_unwrapped_for_the_node(store: Store) -> None:
    """Nodes see an Opaque input's value; the key comes from its content."""
    echo = Echo().named("echo").frozen().cached()
    g = Graph.somatize(echo)
    assert g.forward(Opaque(b"abc"), store=store) == b"abc"
    assert g.forward(Opaque(b"abc"), store=store) == b"abc"
    assert echo.calls == 1


class Kinds(Node):
    """The type of each item of its input (a mapped node gets a list of items)."""

    def forward(self, values: Any, ctx: Any) -> list[str]:
        return [type(v).__name__ for v in values]


def test_opaque_items_inside_an_input_are_weighed_and_unwrapped(store: Store) -> None:
    """An Opaque inside a list, tuple or dict input is keyed by its content and handed to
    the nodes unwrapped, with or without a store: a mapped node keys each item by it."""
    kinds = Kinds().named("kinds").frozen().cached().mapped()
    g = Graph.somatize(kinds)
    items = [Opaque(bytearray(b"ab")), Opaque(b"cd"), 3]
    assert g.forward(items) == g.forward(items, store=store) == ["bytearray", "bytes", "int"]
    facts: list[dict[str, Any]] = []
    g.forward([Opaque(bytearray(b"ab")), Opaque(b"dc"), 3], store=store, watching=facts.append)
    assert next(f for f in facts if f["fact"] == "ran")["items"] == 1  # only the new item ran
    echo = Echo().named("echo").frozen().cached()
    whole = Graph.somatize(echo)
    for payload in (b"x", b"x", b"y"):
        answer = whole.forward({"at": 0, "img": (Opaque(payload),)}, store=store)
        assert answer == {"at": 0, "img": (payload,)}
    assert echo.calls == 2
    with pytest.raises(TypeError, match=r"items that must be weighed, such as tensors, each in"):
        g.forward(Opaque(b"ab"), store=store)


class Total(Node):
    """The sum of its input's items."""

    def forward(self, values: Any, ctx: Any) -> float:
        return float(sum(values))


class NumpyBytes(Codec):
    """A one-dimensional int64 numpy array as its bytes; no stamp, as a mutable value has."""

    name = "tests-numpy"
    types = (np.ndarray,)

    def encode(self, value: Any) -> list[bytes]:
        return [value.astype(np.int64).tobytes()]

    def decode(self, data: memoryview) -> Any:
        return np.frombuffer(data, dtype=np.int64)


@pytest.mark.parametrize(
    "opaque",
    [
        lambda: Opaque(np.zeros(4, dtype=np.int64), NumpyBytes()),
        lambda: Opaque(bytearray(4)),
    ],
    ids=["numpy", "bytearray"],
)
def test_an_opaque_changed_in_place_is_weighed_again(
    store: Store, opaque: Callable[[], Opaque]
) -> None:
    """One Opaque around a mutable value, refilled in place between forwards, is keyed by
    what it holds at each forward: the answer is the new content's, not a recall."""
    what = opaque()
    g = Graph.somatize(Total().named("total").frozen().cached())
    assert g.forward(what, store=store) == 0.0
    what.value[:] = b"\x01\x01\x01\x01" if isinstance(what.value, bytearray) else 1
    seen: list[dict[str, Any]] = []
    assert g.forward(what, store=store, watching=seen.append) == 4.0
    assert seen[0]["fact"] == "ran"


def test_answer_with_no_codec_is_refused(store: Store) -> None:
    """A cached node answering something no codec writes fails with its type named."""

    class Weird(Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return {1, 2}

    g = Graph.somatize(Weird().named("weird").frozen().identified("tests:Weird").cached())
    facts: list[dict[str, Any]] = []
    with pytest.raises(CodecError, match=r"answer of `weird` is a `builtins\.set`"):
        g.forward(1, store=store, watching=facts.append)
    assert [f["fact"] for f in facts] == ["ran", "failed"]
    assert facts[1]["node"] == "weird" and g.record is not None
    assert g.record.outcome == {"weird": "failed"}


def test_a_strict_that_is_no_bool_is_refused_before_anything_runs(store: Store) -> None:
    """``strict="no"`` (or ``"false"``, from a config file) was taken as true, and a
    forward recomputed what it should have recalled; it is refused saying what it takes,
    before any node runs."""
    scale = Scale()
    g = Graph.somatize(scale.named("scale").frozen().cached())
    with pytest.raises(TypeError, match=r"strict= is True .* or False .* got a `str`"):
        g.forward([1.0], store=store, strict="no")  # type: ignore[arg-type]
    assert scale.calls == 0
    assert g.forward([1.0], store=store, strict=False) == g.forward([1.0], store=store)


def test_what_watches_and_what_brokers_are_checked_before_anything_runs(store: Store) -> None:
    """``watching=`` that is no function (or an ``async def`` one, which would make
    coroutines nothing awaits) and ``broker=`` that is no broker are refused saying what
    they take, before any node runs."""
    scale = Scale()
    g = Graph.somatize(scale.named("scale").frozen().cached())
    with pytest.raises(TypeError, match=r"watching= takes a function .* got a `str`"):
        g.forward([1.0], store=store, watching="facts")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"broker= takes a somatize Broker .* got a `str`"):
        g.forward([1.0], store=store, broker="w1")
    with pytest.raises(TypeError, match=r"broker= takes .* got the class `Broker` itself"):
        g.forward([1.0], store=store, broker=Broker)

    async def facts_later(fact: dict[str, Any]) -> None:
        pass

    class Awaited:
        async def __call__(self, fact: dict[str, Any]) -> None:
            pass

    for watcher in (facts_later, Awaited()):
        with pytest.raises(TypeError, match=r"an `async def` one .* pass a plain function"):
            g.forward([1.0], store=store, watching=watcher)
    assert scale.calls == 0


def test_a_watcher_that_edits_its_facts_leaves_the_record_as_it_happened(store: Store) -> None:
    """``watching`` is handed a copy of each fact: a watcher that edits what it is handed
    does not change the record (nor the outcome and figure read from it)."""
    g, _, _, _ = _chain()

    def edit(fact: dict[str, Any]) -> None:
        fact["fact"] = "edited"
        fact.pop("node", None)

    assert g.forward({"at": 0, "take": 8}, store=store, watching=edit) == 14.0
    assert g.record is not None
    assert [(f["fact"], f.get("node")) for f in g.record.facts] == [
        ("ran", "rows"),
        ("ran", "scale"),
        ("ran", "top"),
        ("kept", "top"),
        ("finished", None),
    ]
    assert g.record.outcome == {"rows": "ran", "scale": "ran", "top": "ran"}


def test_a_watcher_that_raises_costs_no_answer(store: Store) -> None:
    """A watcher that raises is not called again; the forward finishes without it, keeping
    what it computed, then raises WatcherFailed naming the fact, from the watcher's error,
    with the forward's answer as its value."""
    g, _, _, top = _chain()
    handed: list[str] = []

    def breaks(fact: dict[str, Any]) -> None:
        handed.append(fact["fact"])
        if fact["fact"] == "ran" and fact["node"] == "top":
            raise RuntimeError("watcher broke")

    with pytest.raises(
        WatcherFailed,
        match=r"raised RuntimeError \(watcher broke\) when handed the `ran` fact of `top`",
    ) as failed:
        g.forward({"at": 0, "take": 8}, store=store, watching=breaks)
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert failed.value.value == 14.0
    assert failed.value.fact["fact"] == "ran" and failed.value.fact["node"] == "top"
    assert handed == ["ran", "ran", "ran"]
    assert g.record is not None
    assert [f["fact"] for f in g.record.facts] == ["ran", "ran", "ran", "kept", "finished"]
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=store, watching=seen.append) == 14.0
    assert [f["fact"] for f in seen] == ["spared", "spared", "recalled", "finished"]
    assert top.calls == 1


def test_a_forward_that_fails_after_its_watcher_raised_says_both(store: Store) -> None:
    """A forward that fails after its watcher raised raises its own error, with a note
    (where exceptions take notes) that the watcher had raised."""
    g = Graph.somatize(Rows().named("rows").frozen() >> Fails().named("boom").frozen())

    def breaks(fact: dict[str, Any]) -> None:
        raise RuntimeError("watcher broke")

    with pytest.raises(NodeFailed, match="`boom`") as failed:
        g.forward({"at": 0, "take": 3}, store=store, watching=breaks)
    assert isinstance(failed.value.__cause__, ZeroDivisionError)
    if sys.version_info >= (3, 11):
        assert failed.value.__notes__ == [
            "The watching= callback had raised RuntimeError (watcher broke) when handed the "
            "`ran` fact of `rows`, and was not called again."
        ]


def test_drift_is_a_fact_and_a_warning(store: Store) -> None:
    """A hit kept by another version of the code is recalled with a drifted fact and a
    warning; strict mode recomputes instead."""
    g, _, _, top = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    g.memory.written_as("top", "sha256:newer")
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted, match="strict=True"):
        g.forward({"at": 0, "take": 8}, store=store, watching=seen.append)
    assert "drifted" in [f["fact"] for f in seen]
    assert top.calls == 1
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.forward({"at": 0, "take": 8}, store=store, watching=seen.append, strict=True)
    assert top.calls == 2
    assert seen[0]["fact"] == "drifted" and seen[0]["recomputed"] is True


def test_a_node_recomputed_because_its_answer_drifted_ran(store: Store) -> None:
    """The outcome of a node whose drifted answer strict mode recomputed is ``ran`` (the
    drifted fact stays); one recalled from a drifted answer is ``drifted``."""
    g, _, _, _ = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    g.memory.written_as("top", "sha256:newer")
    with pytest.warns(Drifted):
        g.forward({"at": 0, "take": 8}, store=store)
    assert g.record is not None and g.record.outcome["top"] == "drifted"
    g.forward({"at": 0, "take": 8}, store=store, strict=True)
    assert g.record.count("drifted") == 1
    assert g.record.outcome == {"rows": "ran", "scale": "ran", "top": "ran"}


def test_the_code_an_answer_is_kept_with_names_no_node(store: Store) -> None:
    """The code fingerprint kept beside an answer covers the code of the node and of what it
    reads, not their names: one computation under other names recalls it without drift."""
    g, _, _, _ = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    other = Graph.somatize(
        Rows().named("source").frozen()
        >> Scale().named("double").frozen()
        >> Largest().named("largest").frozen().cached()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert other.forward({"at": 0, "take": 8}, store=store) == 14.0
    assert other.record is not None and other.record.outcome["largest"] == "recalled"
    assert plan.static_of(other).fingerprint["largest"] == plan.static_of(g).fingerprint["top"]
    assert plan.static_of(g).fingerprint["top"] != g.memory.fingerprint_of("top")


def test_drift_of_some_recalled_items_is_a_fact_and_a_warning(store: Store) -> None:
    """A mapped node recalling some items kept by another version of its code and running
    the rest says so with a drifted fact and a warning; strict mode recomputes those items."""
    square = Square()
    g = Graph.somatize(square.named("square").frozen().mapped().cached())
    g.forward([1, 2], store=store)
    g.memory.written_as("square", "sha256:newer")
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted, match=r"`square` was recalled .* strict=True"):
        assert g.forward([1, 2, 3], store=store, watching=seen.append) == [1, 4, 9]
    assert [f["fact"] for f in seen] == ["recalled", "ran", "kept", "drifted", "finished"]
    assert square.calls == [[1, 2], [3]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.forward([1, 2, 4], store=store, strict=True) == [1, 4, 16]
    assert square.calls == [[1, 2], [3], [1, 2, 4]]


def test_a_forward_asks_once_whether_the_store_may_keep_what_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward asks the store whether it may keep an answer (a look at its directory)
    once, before any node runs, when a mapped node reading the graph's input runs some
    of its items: the mapped node is not asked again as it runs. One reading a computed
    list, keyed only once that list is there, is asked then, once."""
    asked: list[str] = []
    refused_keeping = LocalStore._refused_keeping

    def counted(self: LocalStore) -> Any:
        asked.append("asked")
        return refused_keeping(self)

    monkeypatch.setattr(LocalStore, "_refused_keeping", counted)
    store = Store(tmp_path / "store")
    square = Square().named("square").frozen().mapped().cached()
    over_input = Graph.somatize(square)
    late = Square().named("late").frozen().mapped().cached()
    over_computed = Graph.somatize(Rows().named("rows").frozen() >> late)
    for g, given in ((over_input, [1, 2]), (over_computed, {"at": 0, "take": 2})):
        asked.clear()
        g.forward(given, store=store)
        assert asked == ["asked"]
    asked.clear()
    assert over_input.forward([1, 2, 3], store=store) == [1, 4, 9]
    assert asked == ["asked"] and square.calls == [[1, 2], [3]]


def test_strict_says_a_mapped_nodes_drifted_items_in_one_fact(store: Store) -> None:
    """A mapped node whose items were kept by another version of its code, run with
    `strict=True`, says so in one `drifted` fact saying `recomputed` and how many items of
    how many handed (an item handed twice counted twice), keyed as the fact without
    `strict` is, not one fact per item; they all run again, whether all its items were
    kept or some run beside them."""
    square = Square()
    g = Graph.somatize(square.named("square").frozen().mapped().cached())
    handed = [1, 2, 3, 4, 5, 3]
    g.forward(handed, store=store)
    g.memory.written_as("square", "sha256:newer")
    recalled: list[dict[str, Any]] = []
    with pytest.warns(Drifted):
        g.forward(handed, store=store, watching=recalled.append)
    [told] = [f for f in recalled if f["fact"] == "drifted"]
    for present, code in ((handed, "sha256:newer"), ([0, *handed], "sha256:newest")):
        g.memory.written_as("square", code)
        seen: list[dict[str, Any]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert g.forward(present, store=store, watching=seen.append, strict=True) == [
                i * i for i in present
            ]
        said = [f for f in seen if f["fact"] == "drifted"]
        assert len(said) == 1, said
        assert said[0].keys() == {*told, "recomputed", "items", "of"}
        assert said[0]["key"] == plan.compile(g, present, store, g.outputs).keys["square"]
        assert (said[0]["recomputed"], said[0]["items"], said[0]["of"]) == (True, 6, len(present))
        assert square.calls[-1] == list(dict.fromkeys(present))
    assert said[0]["was"] == told["now"]


def test_strict_says_items_kept_by_two_older_versions_in_one_fact(store: Store) -> None:
    """A mapped node's items kept by two older versions of its code, run with
    `strict=True`, are one `drifted` fact saying `recomputed` and how many items of how
    many handed, as without `strict` they are one fact, not one per version: each
    version's fact counted only its own items, and the node drifted twice in the record.
    Both say the version the first item read was kept by."""
    square = Square()
    g = Graph.somatize(square.named("square").frozen().mapped().cached())
    g.memory.written_as("square", "sha256:older")
    g.forward([1, 2], store=store)
    g.memory.written_as("square", "sha256:old")
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted):
        g.forward([1, 2, 3], store=store, watching=seen.append)
    [older] = [f["was"] for f in seen if f["fact"] == "drifted"]
    g.memory.written_as("square", "sha256:now")
    for strict in (False, True):
        seen.clear()
        with pytest.warns(Drifted) if not strict else warnings.catch_warnings():
            answer = g.forward([1, 2, 3, 4], store=store, watching=seen.append, strict=strict)
        assert answer == [1, 4, 9, 16]
        [said] = [f for f in seen if f["fact"] == "drifted"]
        assert said["was"] == older
        assert g.record is not None and g.record.count("drifted") == 1
    assert (said["recomputed"], said["items"], said["of"]) == (True, 3, 4)
    assert square.calls[-1] == [1, 2, 3]  # 4 kept by the forward before, without `strict`


def test_mapped_runs_only_missing_items(store: Store) -> None:
    """A mapped node answers item by item; only the missing items run, as one call."""
    square = Square()
    g = Graph.somatize(square.named("square").frozen().mapped().cached())
    assert g.forward([1, 2, 3], store=store) == [1, 4, 9]
    assert g.forward([3, 4, 1, 5], store=store) == [9, 16, 1, 25]
    assert square.calls == [[1, 2, 3], [4, 5]]
    seen: list[dict[str, Any]] = []
    assert g.forward([5, 4], store=store, watching=seen.append) == [25, 16]
    assert square.calls == [[1, 2, 3], [4, 5]]
    assert seen[0] == {"fact": "recalled", "node": "square", "items": 2, "of": 2}


class Pairs(Node):
    """Answers each item as a list of it and its double: an object of its own per item."""

    def forward(self, items: list[int], ctx: Any) -> list[list[int]]:
        return [[item, item * 2] for item in items]


def test_items_alike_recalled_are_each_an_object_of_their_own(store: Store) -> None:
    """A mapped node handed one item twice answers each with its own object when it recalls
    them (all of them, or some beside items it runs), as when it computes them: changing
    one leaves the other as it was."""
    g = Graph.somatize(Pairs().identified("tests:Pairs").named("pairs").frozen().mapped().cached())
    computed = g.forward([3, 3], store=store)
    assert computed == [[3, 6], [3, 6]] and computed[0] is not computed[1]
    for handed in ([3, 3], [3, 4, 3, 3]):
        seen: list[dict[str, Any]] = []
        again = g.forward(handed, store=store, watching=seen.append)
        assert any(f["fact"] == "recalled" for f in seen), seen
        assert again == [[item, item * 2] for item in handed]
        threes = [answer for item, answer in zip(handed, again, strict=True) if item == 3]
        assert len({id(answer) for answer in threes}) == len(threes)
        threes[0].append(0)
        assert threes[1] == [3, 6]


class CountedPairs(Pairs):
    """Pairs, noting each list of items it is handed."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def forward(self, items: list[int], ctx: Any) -> list[list[int]]:
        self.calls.append(list(items))
        return super().forward(items, ctx)


def test_items_alike_are_computed_once_each_place_with_an_object_of_its_own(
    store: Store,
) -> None:
    """A cached mapped node handed one item twice, or more, is handed it once: every place
    gets an answer equal to it, each an object of its own (changing one leaves the others
    as they were); the facts count every place, and the answer is kept once."""
    pairs = CountedPairs()
    g = Graph.somatize(pairs.identified("tests:Pairs").named("pairs").frozen().mapped().cached())
    seen: list[dict[str, Any]] = []
    answers = g.forward([3, 4, 3, 3], store=store, watching=seen.append)
    assert pairs.calls == [[3, 4]]
    assert answers == [[3, 6], [4, 8], [3, 6], [3, 6]]
    threes = [answers[0], answers[2], answers[3]]
    assert len({id(answer) for answer in threes}) == 3
    threes[0].append(0)
    assert threes[1] == threes[2] == [3, 6]
    ran = [f for f in seen if f["fact"] in ("ran", "kept")]
    assert [(f["fact"], f["items"], f["of"]) for f in ran] == [("ran", 4, 4), ("kept", 4, 4)]
    assert g.forward([4, 3, 5, 5], store=store) == [[4, 8], [3, 6], [5, 10], [5, 10]]
    assert pairs.calls == [[3, 4], [5]]


def test_every_fact_of_a_mapped_node_says_how_many_items_of_how_many(store: Store) -> None:
    """A mapped node's `ran`, `kept` and `recalled` facts each say `items` and `of`, the
    items they are about and how many it was handed: all run, some recalled, all
    recalled."""
    g = Graph.somatize(Square().named("square").frozen().mapped().cached())
    for handed in ([1, 2, 3], [3, 4], [4, 3, 1]):
        seen: list[dict[str, Any]] = []
        g.forward(handed, store=store, watching=seen.append)
        said = [f for f in seen if f["fact"] in ("ran", "kept", "recalled")]
        assert said, seen
        for fact in said:
            assert fact["of"] == len(handed), fact
            assert 0 < fact["items"] <= len(handed), fact
        assert sum(f["items"] for f in said if f["fact"] != "kept") == len(handed)


class CountUp(Node):
    """An iterator over the numbers below its input."""

    def forward(self, n: int, ctx: Any) -> Any:
        return iter(range(n))


class SumPlus(Node):
    def __init__(self, plus: int) -> None:
        self.plus = plus

    def forward(self, numbers: Any, ctx: Any) -> int:
        return sum(numbers) + self.plus


def test_an_iterator_answered_to_more_than_one_reader_is_refused() -> None:
    """An iterator read by two nodes, or by a node and the caller, is refused naming its
    node, rather than the second reader answering from what the first left of it; read
    once, it is handed on."""
    counts = CountUp().named("counts").frozen()
    fanned = Graph.somatize(counts >> (SumPlus(0).named("a"), SumPlus(100).named("b")))
    with pytest.raises(NodeFailed, match=r"`counts` \(CountUp\) answered .* iterator, and 2"):
        fanned.forward(4)
    chained = Graph.somatize(CountUp().named("counts") >> SumPlus(1).named("sum"))
    with pytest.raises(NodeFailed, match="iterator, and 2 read it"):
        chained.forward(4, outputs=["counts", "sum"])
    assert chained.forward(4) == 7
    assert list(chained.forward(3, outputs="counts")) == [0, 1, 2]


class SquareButThree(Node):
    """Squares each item, and raises when handed a 3."""

    def forward(self, values: list[int], ctx: Any) -> list[int]:
        if 3 in values:
            raise ValueError("three")
        return [v * v for v in values]


def test_a_mapped_node_failing_on_its_missing_items_says_those_it_recalled(
    store: Store,
) -> None:
    """The items of a mapped node read back from the store are said `recalled` before the
    missing ones run, so a watcher counting hits counts them when the run then fails."""
    g = Graph.somatize(SquareButThree().named("square").frozen().mapped().cached())
    assert g.forward([1, 2], store=store) == [1, 4]
    seen: list[dict[str, Any]] = []
    with pytest.raises(NodeFailed, match="three"):
        g.forward([1, 3, 2], store=store, watching=seen.append)
    assert [f["fact"] for f in seen] == ["recalled", "failed"]
    assert seen[0] == {"fact": "recalled", "node": "square", "items": 2, "of": 3}
    g.forward([1, 4], store=store)
    assert g.record.outcome == {"square": "ran"}  # some of its items ran


def test_mapped_after_a_computed_list(store: Store) -> None:
    """A mapped node reading a computed list keys its items once the list exists."""
    square = Square()
    g = Graph.somatize(
        Rows().named("rows").frozen() >> square.named("sq").frozen().mapped().cached()
    )
    assert g.forward({"at": 0, "take": 3}, store=store) == [0, 1, 4]
    assert g.forward({"at": 0, "take": 3}, store=store) == [0, 1, 4]
    assert square.calls == [[0, 1, 2]]


def test_mapped_must_answer_as_many_items(store: Store) -> None:
    """A mapped node returning a list of the wrong length fails, naming it."""

    class Short(Node):
        def forward(self, items: list[int], ctx: Any) -> list[int]:
            return items[:-1]

    g = Graph.somatize(Short().named("short").identified("tests:Short").frozen().mapped().cached())
    with pytest.raises(NodeFailed, match="as long as its input"):
        g.forward([1, 2], store=store)


class Short(Node):
    """Answers one item fewer than it was handed."""

    def forward(self, items: list[int], ctx: Any) -> list[int]:
        return items[:-1]


@pytest.mark.parametrize(
    ("given", "mapped", "error"),
    [
        ([1, 2], Short, r"`short` \(Short\) answered a list of 1 for the 2 items it was handed"),
        (7, Square, r"`short` \(Square\) is mapped, .* what `given` answered is a `int`"),
    ],
    ids=["answer", "input"],
)
def test_a_mapped_node_that_cannot_map_fails_with_a_fact(
    store: Store, given: Any, mapped: type[Node], error: str
) -> None:
    """A mapped node whose answer is not as long as what it was handed, or that is handed
    no list, fails naming itself, with a failed fact and outcome, with a store or without;
    nothing is kept."""
    g = Graph.somatize(
        Echo().named("given").frozen() >> mapped().named("short").frozen().mapped().cached()
    )
    for where in (store, None):
        facts: list[dict[str, Any]] = []
        with pytest.raises(NodeFailed, match=error):
            g.forward(given, store=where, watching=facts.append)
        assert [(f["fact"], f.get("node")) for f in facts] == [
            ("ran", "given"),
            ("failed", "short"),
        ]
        assert g.record is not None and g.record.outcome == {"given": "ran", "short": "failed"}
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))


@pytest.mark.parametrize("cached", [True, False], ids=["below-a-cached-node", "nothing-cached"])
def test_a_mapped_node_not_cached_maps_its_items_with_a_store_as_without(
    store: Store, cached: bool
) -> None:
    """A mapped node that is not cached, nor above a cached node, is run item by item with
    a store as without one: an answer of another length than it was handed fails naming
    it, what it is handed must be a list, its facts say how many items of how many, and
    handed no items it is not called. With a store it was run as a node that is not
    mapped, and its answer of one item too few was handed back."""
    given = Echo().named("given").frozen()
    if cached:
        given = given.cached()
    wrong = Graph.somatize(given >> Short().named("short").frozen().mapped())
    for where in (store, None):
        with pytest.raises(NodeFailed, match="answered a list of 1 for the 2 items"):
            wrong.forward([1, 2], store=where)
        with pytest.raises(NodeFailed, match=r"is mapped, .* is a `int`"):
            wrong.forward(7, store=where)
    square = Square()
    g = Graph.somatize(Echo().named("given").frozen() >> square.named("square").frozen().mapped())
    for where in (store, None):
        seen: list[dict[str, Any]] = []
        assert g.forward([2, 3], store=where, watching=seen.append) == [4, 9]
        ran = [f for f in seen if f.get("node") == "square"]
        assert [(f["fact"], f["items"], f["of"]) for f in ran] == [("ran", 2, 2)]
        assert g.forward([], store=where) == []
    assert square.calls == [[2, 3], [2, 3]]


def test_a_mapped_node_handed_no_items_runs_on_none(store: Store) -> None:
    """A mapped node handed an empty list runs, trivially, without being called: a ran fact
    with no items, on every path — reading the graph's input or a computed list, with a
    store or without, the first time and the next."""
    square, late = Square(), Square()
    alone = Graph.somatize(square.named("square").frozen().mapped().cached())
    below = Graph.somatize(
        Echo().named("given").frozen() >> late.named("square").frozen().mapped().cached()
    )
    for g in (alone, below, alone, below):
        for where in (store, None):
            assert g.forward([], store=where) == []
            assert g.record is not None
            assert g.record.facts[-2] == {
                "fact": "ran",
                "node": "square",
                "took_us": 0,
                "items": 0,
                "of": 0,
            }
            assert g.record.outcome["square"] == "ran"
    assert square.calls == late.calls == []


def test_outputs_selects_other_nodes() -> None:
    """outputs= returns another node's value; what it does not need — here what is below
    it — does not run and is spared."""
    g, _, _, top = _chain()
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 3}, outputs="scale", watching=seen.append) == [0, 2, 4]
    assert top.calls == 0
    assert {"fact": "spared", "node": "top"} in seen
    assert g.record is not None
    assert g.record.outcome == {"rows": "ran", "scale": "ran", "top": "spared"}


def test_outputs_other_than_names_in_order_are_refused_saying_what_it_takes() -> None:
    """outputs= takes a node's name or names in order: a node itself, a number, bytes or
    a set (whose order, and so that of the values handed back, is not the caller's) is
    refused before anything runs, saying so."""
    g, rows, _, _ = _chain()
    scale = g.node("scale")
    for wrong, said in [
        (scale, r"got the node `scale` \(Scale\) itself: pass its name, `'scale'`"),
        ([scale], r"got the node `scale` \(Scale\) itself: pass its name, `'scale'`"),
        (3, "got a `int`"),
        (b"top", "got a `bytes`"),
        (["top", 3], "got a `int`"),
        ({"rows", "top"}, "a `set` has no order"),
        (frozenset({"top"}), "a `frozenset` has no order"),
    ]:
        with pytest.raises(TypeError, match=said):
            g.forward({"at": 0, "take": 3}, outputs=wrong)  # type: ignore[arg-type]
    assert rows.calls == 0
    assert g.forward({"at": 0, "take": 3}, outputs=["top", "rows"]) == (4.0, [0, 1, 2])
    ordered = {"rows": 1, "top": 2}
    assert g.forward({"at": 0, "take": 3}, outputs=ordered.keys()) == ([0, 1, 2], 4.0)


def test_names_in_a_list_or_tuple_are_handed_back_as_a_tuple_one_name_too() -> None:
    """outputs= names in a list or tuple hand back a tuple as long, however many there are,
    so code that pairs each name with its value (``zip(names, g.forward(...))``) pairs a
    node's own list with its name, not its first item; a name alone hands back its value."""
    g, _, _, _ = _chain()
    span = {"at": 0, "take": 3}
    for names in (["rows"], ("rows",), {"rows": 0}.keys()):
        assert g.forward(span, outputs=names) == ([0, 1, 2],)
    paired = zip(["rows"], g.forward(span, outputs=["rows"]), strict=True)
    assert dict(paired) == {"rows": [0, 1, 2]}
    assert g.forward(span, outputs="rows") == [0, 1, 2]
    assert g.forward(span) == 4.0


def test_answers_are_published_whole(store: Store) -> None:
    """After a forward, tmp/ holds nothing: every write was renamed into place."""
    g, _, _, _ = _chain()
    g.forward({"at": 0, "take": 8}, store=store)
    assert os.listdir(store.root / "tmp") == []


def test_mapped_and_unmapped_answers_never_cross(store: Store) -> None:
    """One node mapped in one graph and unmapped in another keeps its answers apart: the
    answer to a whole list is not recalled as the answer to one item of a mapped node."""

    class Lengths(Node):
        def forward(self, words: list[str], ctx: Any) -> list[int]:
            return [len(word) for word in words]

    doc = ["to", "be", "or"]
    whole = Graph.somatize(Lengths().identified("tests:Lengths").frozen().cached())
    assert whole.forward(doc, store=store) == [2, 2, 2]
    per_doc = Graph.somatize(Lengths().identified("tests:Lengths").frozen().mapped().cached())
    seen: list[dict[str, Any]] = []
    assert per_doc.forward([doc, ["a"]], store=store, watching=seen.append) == [3, 1]
    assert "recalled" not in [f["fact"] for f in seen]


class Weighted(Node):
    """The weighted sum of its input, by the weights it was built with."""

    def __init__(self, weights: list[float]) -> None:
        self.weights = weights

    def forward(self, x: float, ctx: Any) -> float:
        return sum(w * x for w in self.weights)


def test_a_declared_list_changed_after_build_is_keyed_as_it_is_now(store: Store) -> None:
    """A list a node was built with, changed after the graph was built, changes its key and
    its declaration in the graph's memory: the old answer is not recalled; in every graph
    the node is in."""
    weights = [1.0]
    node = Weighted(weights).named("weighted").frozen().cached()
    g = Graph.somatize(Echo().frozen() >> node)
    other = Graph.somatize(node)
    assert g.forward(10, store=store) == 10.0
    assert other.forward(10, store=store) == 10.0
    was = g.memory.declaration_of("weighted")
    weights.append(5.0)
    seen: list[dict[str, Any]] = []
    assert g.forward(10, store=store, watching=seen.append) == 60.0
    assert "recalled" not in [f["fact"] for f in seen]
    assert g.memory.declaration_of("weighted") == node.declaration() != was
    assert other.forward(10, store=store) == 60.0
    seen.clear()
    assert g.forward(10, store=store, watching=seen.append) == 60.0
    assert ("recalled", "weighted") in [(f["fact"], f.get("node")) for f in seen]


class Tilted(Node):
    """The weighted sum of its input, by the weights it was built with, plus its tilt."""

    def __init__(self, weights: list[int], tilt: int) -> None:
        self.weights = weights
        self.tilt = tilt

    def forward(self, x: int, ctx: Any) -> int:
        return sum(w * x for w in self.weights) + self.tilt


def test_an_argument_replaced_and_given_back_is_keyed_as_it_is_now_in_every_graph(
    store: Store,
) -> None:
    """A node two graphs are built with, whose kept argument is replaced, taken as the
    argument by one graph's forward, and given back its old value before the other's, is
    keyed in the other as it holds it. That graph, finding the node holding what it held
    when it was built, looked no further, and keyed a node built with a list by the call the
    first graph noted: it kept what it computed with the old value under the key of a node
    built with the new one, and recalled it for such a node."""
    node = Tilted([1], 0).named("tilted").frozen().cached()
    g = Graph.somatize(node)
    other = Graph.somatize(Echo().frozen() >> node)
    assert g.forward(10, store=store) == other.forward(10, store=store) == 10
    node.tilt = 5  # type: ignore[attr-defined]
    assert g.forward(10, store=store) == 15
    node.tilt = 0  # type: ignore[attr-defined]
    assert other.forward(10, store=store) == 10
    assert other.memory.declaration_of("tilted") == Tilted([1], 0).declaration()
    node.tilt = 5  # type: ignore[attr-defined]
    assert other.forward(10, store=store) == other.forward(10) == 15
    assert g.forward(10, store=store) == 15


class Counts(Node):
    """Counts the items of a list it is built with."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def forward(self, x: Any, ctx: Any) -> int:
        return len(self.items)


def _refused_where_keyed(graph: Graph, value: Any, store: Store, match: str) -> None:
    """Each of two forwards of ``graph`` on ``value`` that key its node is refused, saying
    ``match``: the refusal is not a first call's alone."""
    for _ in range(2):
        with pytest.raises(Undeclared, match=match):
            graph.forward(value, store=store)


def _answer_of_a_new_build(node: Node, value: Any, store: Store) -> Any:
    """What ``node``, built anew, answers for ``value``: run, not recalled under another
    build's key."""
    fresh = Graph.somatize(node.named("fresh").frozen().cached())
    answer = fresh.forward(value, store=store)
    assert fresh.record is not None and fresh.record.outcome == {"fresh": "ran"}
    return answer


def test_a_list_given_an_item_with_no_canonical_form_is_refused_only_where_it_is_keyed(
    store: Store,
) -> None:
    """A list a node was built with, given an item with no canonical form after the build,
    leaves a forward without a store, and one that needs no key of it, running; a forward
    that keys it refuses it, saying which item; back to canonical, it is keyed again."""
    items: list[Any] = [1]
    kept = Graph.somatize(Counts(items).named("counts").frozen().cached())
    loose = Graph.somatize(Counts(items).named("loose"))
    assert kept.forward(0, store=store) == loose.forward(0) == 1
    items.append(object())
    assert kept.forward(0) == loose.forward(0) == loose.forward(0, store=store) == 2
    _refused_where_keyed(kept, 0, store, r"`counts` \(Counts\) cannot be keyed.*"
                         r"value\['items'\]\[1\] is a `builtins.object`")  # fmt: skip
    assert kept.forward(0) == 2
    items[1] = 2
    assert kept.forward(0, store=store) == 2
    assert kept.record is not None and kept.record.outcome == {"counts": "ran"}


class Recurses(Node):
    """Counts down by forwarding the graph it is in again (``graph``, given after the
    build), with the store it was handed."""

    graph: Graph

    def forward(self, x: int, ctx: Any) -> int:
        return self.graph.forward(x - 1, store=ctx.store) + 1 if x > 0 else 0


class Waits(Node):
    """Hands its input on; input ``"slow"`` waits until ``go`` is set."""

    go = threading.Event()

    def forward(self, x: str, ctx: Any) -> str:
        if x == "slow":
            assert self.go.wait(10)
        return x


def test_the_record_of_a_graph_is_that_of_the_forward_that_ended_last(store: Store) -> None:
    """``g.record`` is what happened in the forward that ended last: the outer one, when a
    node's forward forwards its own graph again; of two threads, the one that ends second,
    though it started first; and one that failed, which ended last."""
    recurses = Recurses()
    g = Graph.somatize(Echo().named("src").frozen() >> recurses.named("down").frozen().cached())
    recurses.graph = g
    for _ in range(2):  # kept, then recalled
        seen: list[dict[str, Any]] = []
        assert g.forward(3, store=store, watching=seen.append) == 3
        assert g.record is not None and g.record.facts == seen
    waits = Graph.somatize(Waits().named("waits"))
    slow: list[dict[str, Any]] = []
    first = threading.Thread(target=lambda: waits.forward("slow", watching=slow.append))
    Waits.go.clear()
    first.start()
    try:
        assert waits.forward("fast") == "fast"
        assert waits.record is not None and waits.record.outcome == {"waits": "ran"}
    finally:
        Waits.go.set()
        first.join()
    assert slow and waits.record is not None and waits.record.facts == slow
    with pytest.raises(NodeFailed):
        g.forward("x", store=store)
    assert g.record is not None and g.record.outcome == {"src": "ran", "down": "failed"}


class Interrupted(Node):
    """Interrupted as it runs (Ctrl-C)."""

    def forward(self, value: Any, ctx: Any) -> Any:
        raise KeyboardInterrupt


def test_a_forward_refused_before_it_runs_or_interrupted_says_so_in_its_record() -> None:
    """A forward refused before any node runs (a node placed on a worker its broker does
    not know) leaves a record of its own, where nothing ran, not the last forward's; a
    node interrupted (KeyboardInterrupt) says ``failed`` before the interrupt goes on."""
    g = Graph.somatize(Echo().named("src") >> Echo().named("far").at("w1"))
    assert g.forward(1) == 1
    assert g.record is not None and g.record.outcome == {"src": "ran", "far": "ran"}
    broker = Broker.embedded({"w2": Worker.generic(mode="local")})
    try:
        with pytest.raises(UnknownWorker):
            g.forward(2, broker=broker)
    finally:
        broker.close()
    assert g.record is not None and g.record.facts == []
    for refused in ({"outputs": "nope"}, {"watching": 3}):  # its own arguments
        assert g.forward(1) == 1
        with pytest.raises((UnknownNode, TypeError)):
            g.forward(1, **refused)
        assert g.record is not None and g.record.facts == []
    for where in (None, "w1"):  # run here, and by a broker's worker
        stop = Interrupted().named("stop")
        h = Graph.somatize(Echo().named("src") >> (stop.at(where) if where else stop))
        seen: list[dict[str, Any]] = []
        broker = Broker.embedded({"w1": Worker.generic(mode="local")})
        try:
            with pytest.raises(KeyboardInterrupt):
                h.forward(1, watching=seen.append, broker=broker)
        finally:
            broker.close()
        assert {"fact": "failed", "node": "stop", "error": "KeyboardInterrupt"} in seen
        assert h.record is not None and h.record.outcome == {"src": "ran", "stop": "failed"}


def test_threads_forwarding_one_graph_get_their_own_answers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads forwarding one graph at once, each its own inputs, get every answer right and
    no error while the inputs' keys the graph remembers are let go of (here after two)."""
    monkeypatch.setattr(plan, "_KNOWN_INPUTS", 2)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    g = Graph.somatize(Scale(3.0).named("scale").frozen().cached())
    wrong: list[Any] = []

    def forward(first: int) -> None:
        for x in range(first, first + 150):
            try:
                if g.forward([x], store=store) != [x * 3.0]:
                    wrong.append(x)
            except Exception as why:
                wrong.append(why)

    try:
        threads = [threading.Thread(target=forward, args=(k * 1000,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []


def test_an_argument_a_node_keeps_changed_after_building_is_keyed_as_it_is_now(
    store: Store,
) -> None:
    """A node keeps its constructor argument as an attribute (``self.by = by``); replaced
    after the graph was built, the node computes with the new value, and its key follows:
    no answer kept for the old value is recalled for it."""
    scale = Scale(2.0)
    g = Graph.somatize(scale.named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    scale.by = 3.0
    assert g.forward([1.0], store=store) == [3.0]
    assert g.forward([1.0]) == [3.0]
    assert g.record is not None and g.record.outcome == {"scale": "ran"}
    scale.by = 2.0
    assert g.forward([1.0], store=store) == [2.0]
    assert g.record is not None and g.record.outcome == {"scale": "recalled"}
    assert scale.declaration() == Scale(2.0).declaration()
    left = Scale()  # an argument left to its default is kept all the same
    g = Graph.somatize(left.named("scale").frozen().cached())
    left.by = 5.0
    assert g.forward([1.0], store=store) == g.forward([1.0]) == [5.0]


def test_an_argument_a_node_keeps_in_a_slot_changed_after_building_is_keyed_as_it_is_now(
    store: Store,
) -> None:
    """A constructor argument kept in a slot (the class declares ``__slots__``) and
    replaced after the build is followed as one kept in the node's dict is: the node is
    keyed as built with the new value, and no answer kept for the old one is recalled."""
    slotted = Slotted(2.0)
    g = Graph.somatize(slotted.named("slotted").frozen().cached())
    assert g.forward(1.0, store=store) == 2.0
    slotted.by = 3.0
    assert g.forward(1.0, store=store) == 3.0
    assert g.record is not None and g.record.outcome == {"slotted": "ran"}
    assert slotted.declaration() == Slotted(3.0).declaration()


@pytest.mark.parametrize("copied", ["deepcopy", "pickle"])
def test_an_argument_kept_by_a_node_of_a_copied_graph_is_followed_on_the_copy(
    store: Store, copied: str
) -> None:
    """A copied graph (``copy.deepcopy``, a pickle round trip) follows an argument its own
    node keeps as the original does: replaced on the copy, it keys the node as built with
    the new value, and the original is left as it was."""
    g = Graph.somatize(Echo().named("rows").frozen() >> Scale(2).named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    again: Graph = copy.deepcopy(g) if copied == "deepcopy" else pickle.loads(pickle.dumps(g))
    again.node("scale").by = 3  # type: ignore[attr-defined]
    assert again.forward([1.0], store=store) == again.forward([1.0]) == [3.0]
    assert again.record is not None and again.record.outcome["scale"] == "ran"
    assert g.forward([1.0], store=store) == [2.0]
    assert g.record is not None and g.record.outcome["scale"] == "recalled"
    g.node("scale").by = 5  # type: ignore[attr-defined]
    assert g.forward([1.0], store=store) == [5.0]


class Doubles(Node):
    """Keeps its argument, and makes from it the factor its forward uses; counts its calls."""

    def __init__(self, by: int) -> None:
        self.by = by
        self.factor = by * 2
        self.calls = 0

    def forward(self, x: int, ctx: Any) -> int:
        self.calls += 1
        return x * self.factor


def test_an_argument_replaced_where_the_constructor_made_more_from_it_is_refused(
    store: Store,
) -> None:
    """A kept argument replaced after the build on a node whose constructor made another
    attribute from it would key the node as built with the new value while it computes with
    the old one: it is refused where it is keyed, naming both and saying what to do, and no
    answer lands under the key of a node built with the new value; replaced after that
    attribute is made again, it is followed (what the node counts is its own business)."""
    doubles = Doubles(2)
    g = Graph.somatize(doubles.named("doubles").frozen().cached())
    assert g.forward(5, store=store) == 20
    doubles.by = 3
    _refused_where_keyed(g, 5, store, r"`doubles` \(Doubles\) cannot be keyed: `by`, .* "
                         r"replaced after the node was made, and `factor`, which its "
                         r"constructor makes .* Build a new `Doubles` with the new value "
                         r"\(`Doubles\(by=3\)`\)")  # fmt: skip
    assert g.forward(5) == 20
    assert _answer_of_a_new_build(Doubles(3), 5, store) == 30
    doubles.factor, doubles.by = 8, 4
    assert g.forward(5, store=store) == 40
    assert g.record is not None and g.record.outcome == {"doubles": "ran"}


def test_a_node_refused_for_what_it_made_from_an_old_value_is_accepted_once_it_holds_the_new(
    store: Store,
) -> None:
    """Refused for holding what its constructor made from an argument's old value, a node
    is accepted as soon as it holds what a build from the new value holds — set by hand,
    with the argument left as it is — and keyed as that build: it recalls what such a node
    kept. Made stale again, it is refused again."""
    doubles = Doubles(2)
    g = Graph.somatize(doubles.named("doubles").frozen().cached())
    assert g.forward(5, store=store) == 20
    doubles.by = 3
    with pytest.raises(Undeclared, match="`factor`, which its constructor makes"):
        g.forward(5, store=store)
    fresh = Graph.somatize(Doubles(3).named("fresh").frozen().cached())
    assert fresh.forward(5, store=store) == 30
    doubles.factor = 6
    assert g.forward(5, store=store) == 30
    assert g.record is not None and g.record.outcome == {"doubles": "recalled"}
    doubles.factor = 4
    with pytest.raises(Undeclared, match="`factor`, which its constructor makes"):
        g.forward(5, store=store)


@pytest.mark.parametrize("first", [0, 1])
def test_an_argument_replaced_where_the_constructor_made_more_from_it_is_refused_in_each_graph(
    store: Store, first: int
) -> None:
    """A node two graphs are built with, a kept argument of which is replaced where its
    constructor made another attribute from it, is refused in both, whichever runs first:
    the first took the new value as the argument, and the second then found the node built
    with it already, took what the node holds as made from it, and kept the old value's
    answer under the key of a node built with the new one, which such a node recalled. Given
    what the new value makes, it is followed in both."""
    doubles = Doubles(2).named("doubles").frozen().cached()
    graphs = [Graph.somatize(doubles), Graph.somatize(doubles >> Doubles(1).named("more"))]
    assert [g.forward(5, store=store) for g in graphs] == [20, 40]
    doubles.by = 3
    for g in (graphs[first], graphs[1 - first]):
        _refused_where_keyed(g, 5, store, r"`doubles` \(Doubles\) cannot be keyed: `by`, .* "
                             r"and `factor`, which its constructor makes")  # fmt: skip
    assert _answer_of_a_new_build(Doubles(3), 5, store) == 30
    doubles.factor = 6
    assert [g.forward(5, store=store) for g in graphs] == [30, 60]


class Totals(Node):
    """Keeps the list it is built with, and makes from it the total its forward uses."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.total = sum(items)

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.total


class Settings(Node):
    """Keeps the dict it is built with, and makes from it the factor its forward uses."""

    def __init__(self, settings: dict[str, int]) -> None:
        self.settings = settings
        self.factor = settings["scale"] * 2

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.factor


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_list_changed_in_place_where_the_constructor_made_more_from_it_is_refused(
    store: Store, when: str
) -> None:
    """A list a node was built with, changed in place after the build or before it, where
    the constructor made another attribute from it, would key the node as built with the
    new list while it computes with the old total: refused where it is keyed, naming both
    and saying what to do, and no answer lands under the key of a node built with the new
    list; back to what it was, or given what the new list makes, it is followed."""
    items = [1, 2]
    totals = Totals(items)
    if when == "before":
        items.append(10)
    g = Graph.somatize(totals.named("totals").frozen().cached())
    if when == "after":
        assert g.forward(10, store=store) == 30
        items.append(10)
    _refused_where_keyed(g, 10, store, r"`totals` \(Totals\) cannot be keyed: `items`, .* "
                         r"changed in place since the node was made, and `total`, which its "
                         r"constructor makes .* still holds what was made from the old value"
                         r".* Build a new `Totals` with the new value "
                         r"\(`Totals\(items=\[1, 2, 10\]\)`\)")  # fmt: skip
    assert g.forward(10) == 30
    assert _answer_of_a_new_build(Totals([1, 2, 10]), 10, store) == 130
    items.pop()
    assert g.forward(10, store=store) == 30
    items.append(10)
    with pytest.raises(Undeclared, match="`total`, which its constructor makes"):
        g.forward(10, store=store)
    totals.total = 13
    assert g.forward(10, store=store) == 130
    assert g.record is not None and g.record.outcome == {"totals": "recalled"}
    items[:] = [3]
    with pytest.raises(Undeclared, match="`total`, which its constructor makes"):
        g.forward(10, store=store)


class Sums(Node):
    """Keeps the buffer it is built with, and makes from it the total its forward uses."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.total = sum(buffer)

    def forward(self, x: int, ctx: Any) -> int:
        return x + self.total


@pytest.mark.parametrize("wrap", [lambda raw: raw, memoryview], ids=["bytearray", "memoryview"])
def test_bytes_changed_in_place_where_the_constructor_made_more_from_them_are_refused(
    store: Store, wrap: Any
) -> None:
    """A bytearray a node was built with, or a memoryview over one, whose bytes change in
    place after the build, where the constructor made another attribute from them, is
    refused where it is keyed: the call is noted with a copy of the bytes, so the change
    is told apart from what the node was made from, and no answer lands under the key of a
    node built with the new bytes."""
    raw = bytearray(b"\x01\x02")
    g = Graph.somatize(Sums(wrap(raw)).named("sums").frozen().cached())
    assert g.forward(0, store=store) == 3
    raw[0] = 100
    with pytest.raises(Undeclared, match=r"`sums` \(Sums\) cannot be keyed: `buffer`, .* "
                       r"changed in place since the node was made, and `total`, which its "
                       r"constructor makes"):  # fmt: skip
        g.forward(0, store=store)
    assert g.forward(0) == 3
    assert _answer_of_a_new_build(Sums(bytes(raw)), 0, store) == 102


def test_a_dict_changed_in_place_where_the_constructor_made_more_from_it_is_refused(
    store: Store,
) -> None:
    """A dict a node was built with, changed in place after the build where the
    constructor made another attribute from one of its values, is refused where it is
    keyed, as a list is; a forward without a store runs it as it is."""
    settings = {"scale": 1}
    made = Settings(settings)
    g = Graph.somatize(made.named("settings").frozen().cached())
    assert g.forward(3, store=store) == 6
    settings["scale"] = 5
    with pytest.raises(Undeclared, match=r"`settings` \(Settings\) cannot be keyed: "
                       r"`settings`, .* changed in place .* and `factor`, which its "
                       r"constructor makes"):  # fmt: skip
        g.forward(3, store=store)
    assert g.forward(3) == 6
    fresh = Graph.somatize(Settings({"scale": 5}).named("fresh").frozen().cached())
    assert fresh.forward(3, store=store) == 30


class Copies(Node):
    """Keeps a copy of the list it is built with, under the parameter's own name."""

    def __init__(self, items: list[int]) -> None:
        self.items = list(items)

    def forward(self, x: int, ctx: Any) -> int:
        return x * sum(self.items)


class Picked(Node):
    """Keeps, under the name of the dict it is built with, one value taken from it."""

    def __init__(self, scale: dict[str, int]) -> None:
        self.scale = scale["x"]

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.scale


class Normed(Node):
    """Divides by the total of the dict it is built with, by default one shared by every
    instance, and keeps both."""

    def __init__(self, weights: dict[str, float] = {"a": 1.0, "b": 1.0}) -> None:  # noqa: B006
        self.weights = weights
        self.norm = sum(weights.values())

    def forward(self, x: float, ctx: Any) -> float:
        return x / self.norm


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_default_changed_in_place_where_the_constructor_made_more_from_it_is_refused(
    store: Store, when: str
) -> None:
    """A dict left to its default and changed in place, after the build or before it, where
    the constructor made another attribute from it, is refused where it is keyed, as the
    same dict passed by the caller is: no answer lands under the key of a node built with
    the new dict. Back to what it was, it is followed; its key is the one of a node given
    that dict."""
    normed = Normed()
    assert normed.declaration() == Normed({"a": 1.0, "b": 1.0}).declaration()
    try:
        if when == "before":
            normed.weights["a"] = 3.0
        g = Graph.somatize(normed.named("normed").frozen().cached())
        if when == "after":
            assert g.forward(10.0, store=store) == 5.0
            normed.weights["a"] = 3.0
        with pytest.raises(Undeclared, match=r"`normed` \(Normed\) cannot be keyed: `weights`, "
                           r".* changed in place since the node was made, and `norm`, which its "
                           r"constructor makes .* Build a new `Normed` with the new value "
                           r"\(`Normed\(weights=\{'a': 3.0, 'b': 1.0\}\)`\)"):  # fmt: skip
            g.forward(10.0, store=store)
        assert g.forward(10.0) == 5.0
        assert _answer_of_a_new_build(Normed({"a": 3.0, "b": 1.0}), 10.0, store) == 2.5
    finally:
        normed.weights["a"] = 1.0  # the default is every instance's
    assert g.forward(10.0, store=store) == 5.0
    assert g.record is not None and g.record.outcome == {
        "normed": "ran" if when == "before" else "recalled"
    }


def _append_ten(items: list[int]) -> None:
    items.append(10)


def _thirteen(scale: dict[str, int]) -> None:
    scale["x"] = 13


@pytest.mark.parametrize(
    ("make", "given", "change", "attr", "made"),
    [
        (Copies, [1, 2], _append_ten, "items", [1, 2, 10]),
        (Picked, {"x": 3}, _thirteen, "scale", 13),
    ],
    ids=["a copy of a list", "a value taken from a dict"],
)
def test_an_attribute_named_like_an_argument_changed_in_place_but_not_it_is_refused(
    store: Store, make: type[Node], given: Any, change: Any, attr: str, made: Any
) -> None:
    """An attribute named like the list or the dict a node was built with, but made from it
    rather than the very value (a copy of it, a value taken from it), still holds what the
    old value made once that value is changed in place: the node is refused where it is
    keyed, naming the attribute, and no answer lands under the key of a node built with the
    new value; given what the new value makes, it is followed."""
    node, name = make(given), make.__name__.lower()
    g = Graph.somatize(node.named(name).frozen().cached())
    assert g.forward(10, store=store) == 30
    change(given)
    _refused_where_keyed(g, 10, store, rf"`{name}` \({make.__name__}\) cannot be keyed: "
                         rf"`{attr}`, .* changed in place since the node was made, and "
                         rf"`{attr}` \(named like the argument, but not the very value it "
                         r"was given\), which its constructor makes .* still holds what was "
                         r"made from the old value")  # fmt: skip
    assert g.forward(10) == 30
    assert _answer_of_a_new_build(make(given), 10, store) == 130
    setattr(node, attr, made)
    assert g.forward(10, store=store) == 130
    assert g.record is not None and g.record.outcome == {name: "recalled"}


class Floats(Node):
    """Multiplies by ``by``, which it keeps as a float, whatever number it is handed."""

    def __init__(self, by: float) -> None:
        self.by = float(by)

    def forward(self, x: float, ctx: Any) -> float:
        return x * self.by


def test_an_attribute_made_from_an_argument_and_replaced_after_building_is_refused(
    store: Store,
) -> None:
    """An attribute named like a constructor argument but not the very value (``self.by =
    float(by)`` handed an int), replaced after the build, is not taken as the argument —
    nor left out in silence, the node keyed as built with the old one: it is refused where
    it is keyed, naming it and saying what to do, until it holds again what it held when the
    graph was built, or what a build from its arguments holds. Handed a float, the attribute
    is the argument and is followed, as before; so whatever number the node is built with,
    no answer of the old value is recalled for the new one."""
    floats = Floats(2)
    g = Graph.somatize(floats.named("floats").frozen().cached())
    assert g.forward(10.0, store=store) == 20.0
    floats.by = 3.0
    _refused_where_keyed(g, 10.0, store, r"`floats` \(Floats\) cannot be keyed: `by` was "
                         r"replaced after the node was made, and is named like an argument "
                         r"of its constructor but not the very value it was given .* keyed as "
                         r"a `Floats\(by=2\)`, which holds another\. .* Build a new `Floats` "
                         r"with the value you mean")  # fmt: skip
    assert g.forward(10.0) == 30.0
    floats.by = 2.0  # what it held: another float object, equal
    assert g.forward(10.0, store=store) == 20.0
    assert g.record is not None and g.record.outcome == {"floats": "recalled"}
    follows = Floats(2.0)
    g = Graph.somatize(follows.named("follows").frozen().cached())
    assert g.forward(10.0, store=store) == 20.0
    follows.by = 3.0
    assert g.forward(10.0, store=store) == 30.0
    assert g.record is not None and g.record.outcome == {"follows": "ran"}
    early = Floats(2)
    early.by = 5.0  # before the build: refused as after it, not keyed as `Floats(2)`
    g = Graph.somatize(early.named("early").frozen().cached())
    with pytest.raises(Undeclared, match=r"`early` \(Floats\) cannot be keyed: `by` was replaced"):
        g.forward(1.0, store=store)
    early.by = 2.0  # what a Floats(2) holds: keyed as one
    assert g.forward(10.0, store=store) == 20.0
    assert g.record is not None and g.record.outcome == {"early": "recalled"}


class Loads(Node):
    """Loads, on first use, what it is named after into the attribute of that name."""

    def __init__(self, model: str) -> None:
        self.model: Any = None
        self.named_after = model

    def forward(self, x: float, ctx: Any) -> float:
        if self.model is None:
            self.model = types.SimpleNamespace(scale=len(self.named_after))
        return x * self.model.scale


def test_an_attribute_replaced_from_outside_by_what_no_key_holds_is_refused(
    store: Store,
) -> None:
    """An attribute named like a constructor argument but not the very value, or one its
    constructor set that no argument names, replaced from outside the node by a value with no
    canonical form (a numpy number) is refused where the node is keyed, as one replaced by a
    value with one is: it was not looked at, so the node was keyed as built, recalling the
    old value's answers and keeping the new one's under the old key. One the node's own code
    gives such a value (a model it loads on first use) is its own business."""
    floats = Floats(2)
    g = Graph.somatize(floats.named("floats").frozen().cached())
    assert g.forward(10.0, store=store) == 20.0
    floats.by = np.float64(3.0)  # type: ignore[assignment]
    _refused_where_keyed(g, 10.0, store, r"`floats` \(Floats\) cannot be keyed: `by` was "
                         r"replaced after the node was made")  # fmt: skip
    assert g.forward(7.0) == 21.0
    assert _answer_of_a_new_build(Floats(2), 7.0, store) == 14.0
    offsets = Offsets(2.0)
    g = Graph.somatize(offsets.named("offsets").frozen().cached())
    assert g.forward(10.0, store=store) == 20.0
    offsets.offset = np.float64(5.0)  # type: ignore[assignment]
    _refused_where_keyed(g, 10.0, store, r"`offsets` \(Offsets\) cannot be keyed: `offset` "
                         r"was replaced after the node was made, from outside it")  # fmt: skip
    offsets.offset = 0.0
    assert g.forward(10.0, store=store) == 20.0
    assert g.record is not None and g.record.outcome == {"offsets": "recalled"}
    g = Graph.somatize(Loads("abc").named("loads").frozen().cached())
    assert g.forward(1.0, store=store) == 3.0
    assert g.forward(2.0, store=store) == 6.0  # what it loaded first is its own
    assert g.forward(1.0, store=store) == 3.0
    assert g.record is not None and g.record.outcome == {"loads": "recalled"}


class Offsets(Node):
    """Multiplies by its argument and adds an offset its constructor sets; counts its calls."""

    def __init__(self, by: float = 2.0) -> None:
        self.by = by
        self.offset = 0.0
        self.calls = 0

    def forward(self, x: float, ctx: Any) -> float:
        self.calls += 1
        return x * self.by + self.offset


def test_an_attribute_the_constructor_set_replaced_from_outside_is_refused(store: Store) -> None:
    """A public attribute the constructor set, not from its arguments, and replaced from
    outside the node — before the build or after it — is in no key: the node is refused
    where it is keyed, naming it, what a build from its arguments holds there and what to
    do, until it holds that again, and no answer of one value is recalled for the other.
    What the node's own forward sets (a count of its calls) is its own business."""
    g = Graph.somatize(Offsets(2.0).named("a").frozen().cached())
    assert g.forward(1.0, store=store) == 2.0
    early = Offsets(2.0)
    early.offset = 10.0  # after it was made, before the build
    again = Graph.somatize(early.named("a").frozen().cached())
    _refused_where_keyed(again, 1.0, store, r"`a` \(Offsets\) cannot be keyed: `offset` was "
                         r"replaced after the node was made, .* a `Offsets\(by=2\.0\)` holds "
                         r"0\.0 there.* Pass it to the constructor .* `declare\(\)`")  # fmt: skip
    assert again.forward(1.0) == 12.0
    early.offset = 0.0  # what a build holds: keyed as one, and recalled
    assert again.forward(1.0, store=store) == 2.0
    assert again.record is not None and again.record.outcome == {"a": "recalled"}
    late = g.node("a")
    late.offset = 5.0  # type: ignore[attr-defined]  # after the build
    _refused_where_keyed(g, 1.0, store, r"`a` \(Offsets\) cannot be keyed: `offset` was "
                         r"replaced after the node was made")  # fmt: skip
    assert g.forward(1.0) == 7.0
    late.offset = 0.0  # type: ignore[attr-defined]
    assert g.forward(1.0, store=store) == 2.0
    assert g.record is not None and g.record.outcome == {"a": "recalled"}
    counts = Graph.somatize(Offsets(4.0).named("counts").frozen().cached())
    assert counts.forward(1.0, store=store) == 4.0
    assert counts.forward(2.0, store=store) == 8.0
    assert counts.node("counts").calls == 2  # type: ignore[attr-defined]
    assert counts.forward(1.0, store=store) == 4.0
    assert counts.record is not None and counts.record.outcome == {"counts": "recalled"}


class NotesLast(Node):
    """Notes the last value it was handed, by ``setattr``."""

    def __init__(self, by: float = 2.0) -> None:
        self.by = by
        self.last = 0.0

    def forward(self, x: float, ctx: Any) -> float:
        noted = "last"
        setattr(self, noted, x)
        return x * self.by


class NotesLastInVars(NotesLast):
    def forward(self, x: float, ctx: Any) -> float:
        vars(self)["last"] = x
        return x * self.by


class NotesLastInDict(NotesLast):
    def forward(self, x: float, ctx: Any) -> float:
        self.__dict__.update(last=x)
        return x * self.by


@pytest.mark.parametrize("kind", [NotesLast, NotesLastInVars, NotesLastInDict])
def test_an_attribute_a_node_sets_itself_by_name_is_its_own(
    store: Store, kind: type[NotesLast]
) -> None:
    """A node whose own code sets attributes by name (``setattr``, ``vars(self)``,
    ``self.__dict__``) may set any: none of what its constructor set is taken for replaced
    from outside, and it is recalled as a node counting its calls is."""
    g = Graph.somatize(kind(2.0).named("notes").frozen().cached())
    assert g.forward(1.0, store=store) == 2.0
    assert g.forward(3.0, store=store) == 6.0
    assert g.node("notes").last == 3.0  # type: ignore[attr-defined]
    assert g.forward(1.0, store=store) == 2.0
    assert g.record is not None and g.record.outcome == {"notes": "recalled"}


class SetsUp(Node):
    """Keeps its argument through a helper its constructor calls."""

    def __init__(self, by: float) -> None:
        self._set_up(by)

    def _set_up(self, by: float) -> None:
        self.by = by

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.by for v in values]


class Builds:
    """Makes a node, then gives it another value than it was made with."""

    def __init__(self) -> None:
        self.scale = SetsUp(2.0)
        self.scale.by = 7.0


@pytest.mark.parametrize("copied", ["as made", "deepcopy", "pickle"])
def test_an_argument_replaced_before_the_build_is_taken_as_the_argument(
    store: Store, copied: str
) -> None:
    """An argument a node keeps, given another value after the node was made and before a
    graph was built with it (``s = Scale(2.0); s.by = 5.0``), is taken as the argument the
    node is built with, as one replaced after the build is: the node computes with 5.0 and
    was keyed as a ``Scale(2.0)``, recalling that node's answers. What the constructor
    sets, through a helper too, is what it was made with; what another object's
    constructor sets is not. A node whose constructor made more from the old value is
    refused where it is keyed; two such nodes are not one computation."""
    rows = Echo().named("rows").frozen()
    g = Graph.somatize(rows >> Scale(2.0).named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]

    def made(node: Node) -> Node:
        if copied == "deepcopy":
            return copy.deepcopy(node)
        return pickle.loads(pickle.dumps(node)) if copied == "pickle" else node

    early = Scale(2.0)
    early.by = 5.0
    g = Graph.somatize(rows >> made(early).named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [5.0]
    assert g.record is not None and g.record.outcome["scale"] == "ran"
    helped = SetsUp(2.0)
    g = Graph.somatize(rows >> made(helped).named("helped").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    assert g.node("helped").declaration() == SetsUp(2.0).declaration()
    g = Graph.somatize(rows >> made(Builds().scale).named("built").frozen().cached())
    assert g.forward([1.0], store=store) == [7.0]
    assert g.node("built").declaration() == SetsUp(7.0).declaration()
    doubles = Doubles(2)
    doubles.by = 3
    g = Graph.somatize(rows >> made(doubles).named("doubles").frozen().cached())
    with pytest.raises(Undeclared, match=r"`doubles` \(Doubles\) cannot be keyed: `by`, an "
                       r"argument it was built with and keeps, was replaced after the node was "
                       r"made, and `factor`"):  # fmt: skip
        g.forward(1, store=store)
    first, second = SetsUp(2.0), SetsUp(2.0)
    first.by = second.by = 4.0
    g = Graph.somatize(rows >> (made(first).frozen().cached(), made(second).frozen().cached()))
    assert g.forward([1.0], store=store) == ([4.0], [4.0])


@pytest.mark.parametrize("how", ["dict", "object", "init again"])
def test_an_argument_given_another_value_past_setattr_before_the_build_is_followed(
    store: Store, how: str
) -> None:
    """What the node holds when its constructor returns is what the graph looks at it
    from: a value given before the build through its ``__dict__``, past ``__setattr__``,
    or by calling ``__init__`` again is followed as one given by assignment is."""
    rows = Echo().named("rows").frozen()
    g = Graph.somatize(rows >> Scale(2.0).named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    early = Scale(2.0)
    if how == "dict":
        vars(early).update(by=5.0)
    elif how == "object":
        object.__setattr__(early, "by", 5.0)
    else:
        early.__init__(5.0)  # type: ignore[misc]
    g = Graph.somatize(rows >> early.named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [5.0]
    assert g.node("scale").declaration() == Scale(5.0).declaration()


def test_an_argument_of_an_unpickled_node_given_another_value_is_followed(
    store: Store,
) -> None:
    """An unpickled node holds the number it was made with as a new object, apart from
    the argument noted in its call: it is taken as the argument all the same, so a value
    given after the build is followed as on the original, not refused."""
    rows = Echo().named("rows").frozen()
    carried = pickle.loads(pickle.dumps(Scale(2.0)))
    g = Graph.somatize(rows >> carried.named("scale").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    carried.by = 5.0
    assert g.forward([1.0], store=store) == [5.0]


class Configured(Node):
    """Keeps each keyword argument it is handed as an attribute of its name."""

    def __init__(self, **settings: Any) -> None:
        for name, value in settings.items():
            setattr(self, name, value)

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.by for v in values]


def test_a_keyword_argument_a_node_keeps_given_another_value_is_followed(store: Store) -> None:
    """An argument a constructor's ``**kwargs`` took and the node keeps under its keyword
    is followed as a named parameter's is, given another value after the build or before
    it: the node is keyed as built with that value."""
    rows = Echo().named("rows").frozen()
    configured = Configured(by=2.0)
    g = Graph.somatize(rows >> configured.named("configured").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    configured.by = 5.0  # type: ignore[attr-defined]
    assert g.forward([1.0], store=store) == [5.0]
    assert g.node("configured").declaration() == Configured(by=5.0).declaration()
    early = Configured(by=2.0)
    early.by = 6.0  # type: ignore[attr-defined]
    g = Graph.somatize(rows >> early.named("configured").frozen().cached())
    assert g.forward([1.0], store=store) == [6.0]
    assert Graph.somatize(rows >> Configured(by=2.0).named("configured").frozen().cached()).forward(
        [1.0], store=store
    ) == [2.0]


class KeepsBy:
    """A mixin whose constructor keeps ``by``: not a node class's."""

    def __init__(self, by: float) -> None:
        self.by = by


class MixedScale(KeepsBy, Node):
    """Multiplies by ``by``, kept by a mixin's constructor."""

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.by for v in values]


def test_an_argument_a_mixin_keeps_given_another_value_before_the_build_is_followed(
    store: Store,
) -> None:
    """A node made by a constructor that is not a node class's own (a mixin's) does not say
    when it is made: what it holds is told apart from what a build from its call holds,
    once, at the build, so a value given before is followed as one given after is."""
    rows = Echo().named("rows").frozen()
    g = Graph.somatize(rows >> MixedScale(2.0).named("mixed").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    early = MixedScale(2.0)
    early.by = 5.0
    g = Graph.somatize(rows >> early.named("mixed").frozen().cached())
    assert g.forward([1.0], store=store) == [5.0]
    assert g.node("mixed").declaration() == MixedScale(5.0).declaration()


class KeywordSettings(Configured):
    """Keeps each keyword argument under its keyword; reads the one named ``settings``."""

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.settings for v in values]


def test_a_keyword_named_as_the_kwargs_parameter_given_another_value_is_followed(
    store: Store,
) -> None:
    """A keyword a ``**settings`` took named ``settings`` too is one of its arguments, not
    the parameter: replaced, it is taken as that argument (it replaced the whole of them,
    and every forward failed)."""
    rows = Echo().named("rows").frozen()
    node = KeywordSettings(settings=2.0)
    g = Graph.somatize(rows >> node.named("settings").frozen().cached())
    assert g.forward([1.0], store=store) == [2.0]
    node.settings = 5.0  # type: ignore[attr-defined]
    assert g.forward([1.0], store=store) == [5.0]
    assert g.node("settings").declaration() == KeywordSettings(settings=5.0).declaration()
    carried = pickle.loads(pickle.dumps(Configured(by=2.0)))
    g = Graph.somatize(rows >> carried.named("configured").frozen().cached())
    carried.by = 6.0  # type: ignore[attr-defined]
    assert g.forward([1.0], store=store) == [6.0]


class _CallsInit(type):
    """A metaclass that makes its instances itself: ``__new__`` handed nothing, then
    ``__init__`` handed the call."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        made = cls.__new__(cls)
        made.__init__(*args, **kwargs)
        return made


class MadeByMeta(Node, metaclass=_CallsInit):
    """Multiplies by ``by``; made by a metaclass that hands ``__new__`` nothing."""

    def __init__(self, by: float = 1.0) -> None:
        self.by = by

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.by for v in values]


def test_a_node_whose_metaclass_hands_its_constructor_the_call_is_declared_by_it(
    store: Store,
) -> None:
    """A node is declared by the call its constructor is handed, where its ``__new__`` is
    handed another (a metaclass that calls ``__init__`` itself): ``MadeByMeta(5.0)`` is not
    keyed as ``MadeByMeta()``."""
    rows = Echo().named("rows").frozen()
    g = Graph.somatize(rows >> MadeByMeta(5.0).named("made").frozen().cached())
    assert g.forward([1.0], store=store) == [5.0]
    g = Graph.somatize(rows >> MadeByMeta().named("made").frozen().cached())
    assert g.forward([1.0], store=store) == [1.0]
    assert g.record is not None and g.record.outcome["made"] == "ran"


def test_an_attribute_made_from_an_argument_of_an_interned_node_changed_is_refused() -> None:
    """Two equal frozen nodes are one computation: an attribute made from an argument
    replaced on either after the build could not be heard, or would be heard by both, and
    is refused, as a replaced argument is."""
    first, second = Floats(2).named("a").frozen(), Floats(2).named("b").frozen()
    g = Graph.somatize(Echo().named("rows") >> (first, second))
    assert g.forward(1.0) == (2.0, 2.0)
    second.by = 5.0
    with pytest.raises(AlreadyBuilt, match=r"`by` of a `Floats` was changed .* runs there as `a`"):
        g.forward(1.0)
    second.by = 2.0
    first.by = 3.0
    with pytest.raises(AlreadyBuilt, match=r"`by` of `a` was changed .* runs as `a` too"):
        g.forward(1.0)


class Positive(Node):
    """Takes only a positive ``by``."""

    def __init__(self, by: int) -> None:
        if by <= 0:
            raise ValueError("by must be positive")
        self.by = by

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.by


def test_an_argument_replaced_by_what_the_constructor_refuses_is_refused_where_it_is_keyed(
    store: Store,
) -> None:
    """A kept argument replaced after the build by a value its class would not be built with
    cannot be checked against a node built with it: refused where it is keyed, saying why."""
    positive = Positive(2)
    g = Graph.somatize(positive.named("positive").frozen().cached())
    assert g.forward(5, store=store) == 10
    positive.by = -1
    with pytest.raises(Undeclared, match=r"`positive` \(Positive\) cannot be keyed: .* could not "
                       r"be built again .*ValueError: by must be positive"):  # fmt: skip
        g.forward(5, store=store)


class Tidies(Node):
    """Keeps its argument, then tidies it into something with no canonical form."""

    def __init__(self, path: str) -> None:
        self.path: Any = path

    def forward(self, x: Any, ctx: Any) -> str:
        self.path = Path(self.path)
        return self.path.name


def test_a_node_tidying_its_own_argument_runs_on() -> None:
    """A node that replaces an argument it keeps with something of no canonical form (a
    path made a Path on first use) runs on where it is not keyed: the next forward without
    a store runs as the first."""
    g = Graph.somatize(Tidies("a/b.txt").named("tidies"))
    assert g.forward(1) == g.forward(1) == "b.txt"


_REPLACING_BY = pytest.mark.parametrize("by", [5.0, np.float64(5.0)], ids=["float", "numpy"])
"""What an interned node's argument is replaced by: a value a key holds, and one it does not."""


@_REPLACING_BY
def test_an_interned_node_changed_after_building_is_refused(by: Any) -> None:
    """Two equal frozen nodes are one computation; changing the one that does not run
    afterwards could not be heard, and is refused rather than ignored — by a value with no
    canonical form too (a numpy number), which was ignored, and the graph answered for the
    node from the one that ran."""
    first, second = Scale(2.0).named("a").frozen(), Scale(2.0).named("b").frozen()
    g = Graph.somatize(Echo().named("rows") >> (first, second))
    assert g.forward([1.0]) == ([2.0], [2.0])
    second.by = by
    with pytest.raises(AlreadyBuilt, match=r"`by` of a `Scale` was changed .* runs there as `a`"):
        g.forward([1.0])


@_REPLACING_BY
def test_the_node_an_equal_one_was_interned_into_changed_after_building_is_refused(
    by: Any,
) -> None:
    """Changing the node that runs for both of two interned nodes would change the other's
    answers too: refused, like a change to the one that does not run, by a value with no
    canonical form too, which the graph ran with for both."""
    first, second = Scale(2.0).named("a").frozen(), Scale(2.0).named("b").frozen()
    g = Graph.somatize(Echo().named("rows") >> (first, second))
    first.by = by
    with pytest.raises(AlreadyBuilt, match=r"`by` of `a` was changed .* runs as `a` too"):
        g.forward([1.0])


class Picks(Node):
    """Picks the items at ``at``, an argument it keeps."""

    def __init__(self, at: Any = (0,)) -> None:
        self.at = at

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [values[i] for i in self.at]


class Weighs(Node):
    """Weighs items by a dict it is built with, by default one shared by every instance."""

    def __init__(self, weights: dict[str, float] = {"a": 1.0}) -> None:  # noqa: B006
        self.weights = weights

    def forward(self, x: float, ctx: Any) -> float:
        return x * self.weights["a"]


def test_a_list_a_node_is_given_after_building_is_followed_as_it_changes(
    store: Store,
) -> None:
    """An argument replaced after the build by a list, and a mutable default, are followed
    when they change in place, as an argument built with a list is: no answer kept before
    the change is recalled after it."""
    picks = Picks()
    g = Graph.somatize(picks.named("picks").frozen().cached())
    values = [10.0, 20.0, 30.0]
    assert g.forward(values, store=store) == [10.0]
    picks.at = [0, 1]
    assert g.forward(values, store=store) == [10.0, 20.0]
    picks.at.append(2)
    assert g.forward(values, store=store) == [10.0, 20.0, 30.0]
    assert g.record is not None and g.record.outcome == {"picks": "ran"}
    weighs = Weighs()
    g = Graph.somatize(weighs.named("weighs").frozen().cached())
    assert g.forward(2.0, store=store) == 2.0
    weighs.weights["a"] = 5.0
    try:
        assert g.forward(2.0, store=store) == 10.0
        assert g.record is not None and g.record.outcome == {"weighs": "ran"}
    finally:
        weighs.weights["a"] = 1.0  # the default is every instance's


@pytest.mark.parametrize(
    ("number", "plain", "x"),
    [
        (np.float32(0.1), 0.1, 1.0),
        (np.float64(4.0), 4.0, 1.0),
        (np.longdouble(3.0), 3.0, 1.0),
        (np.bool_(True), True, 1.0),
        (np.int64(2**62), 2**62, 2**62),
        (np.uint8(3), 3, 1.0),
    ],
    ids=["float32", "float64", "longdouble", "bool_", "int64", "uint8"],
)
def test_an_argument_replaced_by_a_numpy_number_is_refused_as_a_node_built_with_one_is(
    store: Store, number: Any, plain: Any, x: Any
) -> None:
    """A numpy number computes as numpy's type does (a float32's rounding, an int64's
    overflow), not as the Python number it holds, and has no canonical form: a node built
    with one cannot be keyed, and one whose kept argument is replaced by one after the
    build is refused where it is keyed, saying to pass the Python number — not keyed as
    that number, under whose key it would keep what it computes otherwise. A forward
    without a store runs it; replaced by the Python number, it is keyed as a node built
    with that."""
    with pytest.raises(Undeclared, match=r"no canonical form"):
        Shifts(number).declaration()
    shift = Shifts(2.0)
    g = Graph.somatize(shift.named("shift").frozen().cached())
    assert g.forward(1.0, store=store) == 3.0
    shift.by = number
    _refused_where_keyed(g, x, store, r"`shift` \(Shifts\) cannot be keyed: `by`, .* "
                         r"replaced after the node was made, and it is a "
                         rf"`numpy\.{type(number).__name__}` .* computes as numpy's own type "
                         r"does .* Replace it with the Python number "
                         r"\(`float\(x\)`, `int\(x\)` or `bool\(x\)`\)")  # fmt: skip
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        assert g.forward(x) == float(x + number)
    shift.by = plain
    assert g.forward(x, store=store) == float(x + plain)
    assert g.record is not None and g.record.outcome == {"shift": "ran"}
    assert shift.declaration() == Shifts(plain).declaration()


class Mode(str, enum.Enum):
    """A str enum: equal to its value, but its ``str()`` is ``"Mode.UP"``."""

    UP = "upper"


class Level(enum.IntEnum):
    """An int enum."""

    HIGH = 3


class Cases(Node):
    """Upper-cases its input when ``mode`` is ``"upper"``, an argument it keeps."""

    def __init__(self, mode: Any = "lower") -> None:
        self.mode = mode

    def forward(self, x: str, ctx: Any) -> str:
        return x.upper() if self.mode == "upper" else f"{x.lower()}:{self.mode}"


@pytest.mark.parametrize("member", [Mode.UP, Level.HIGH], ids=["str enum", "int enum"])
def test_an_argument_replaced_by_an_enum_member_is_refused_as_a_node_built_with_one_is(
    store: Store, member: Any
) -> None:
    """An enum member, a str or an int one too, has no canonical form: a node built with one
    cannot be keyed, and one whose kept argument is replaced by one after the build is
    refused where it is keyed, naming it — not keyed as its ``str()`` (``"Mode.UP"``), nor
    as the value it stands for, which it may not compute like. Replaced by the plain value,
    it is keyed as a node built with that."""
    with pytest.raises(Undeclared, match=r"no canonical form"):
        Cases(member).declaration()
    cases = Cases()
    g = Graph.somatize(cases.named("cases").frozen().cached())
    assert g.forward("Ab", store=store) == "ab:lower"
    cases.mode = member
    _refused_where_keyed(g, "Ab", store, rf"`cases` \(Cases\) cannot be keyed: `mode`, .* "
                         rf"replaced after the node was made, .*`[\w.]*{type(member).__name__}`"
                         r", which has no canonical form")  # fmt: skip
    computes = g.forward("Ab")
    cases.mode = member.value
    assert g.forward("Ab", store=store) == computes
    assert g.record is not None and g.record.outcome == {"cases": "ran"}
    assert cases.declaration() == Cases(member.value).declaration()
    named = Graph.somatize(Cases(str(member)).named("named").frozen().cached())
    assert named.forward("Ab", store=store) == f"ab:{member}"
    assert named.record is not None and named.record.outcome == {"named": "ran"}


def test_an_argument_replaced_by_what_no_key_holds_is_refused_where_it_is_keyed(
    store: Store,
) -> None:
    """A kept argument replaced after the build by a value with no canonical form (a
    longdouble, a ``Path``) is not left out of the key in silence: a forward that keys the
    node refuses it, naming the argument, until it is replaced by a value that has one; a
    forward without a store runs it."""
    shift = Shifts(2.0)
    g = Graph.somatize(shift.named("shift").frozen().cached())
    assert g.forward(1.0, store=store) == 3.0
    shift.by = np.longdouble(1) / 3
    _refused_where_keyed(g, 1.0, store, r"`shift` \(Shifts\) cannot be keyed: `by`, an "
                         r"argument it .* replaced after the node was made, and it is a "
                         r"`numpy.longdouble` .* holds numbers only as Python's")  # fmt: skip
    assert g.forward(1.0) == float(1 + np.longdouble(1) / 3)
    shift.by = 4.0
    assert g.forward(1.0, store=store) == 5.0
    assert g.record is not None and g.record.outcome == {"shift": "ran"}
    tidies = Tidies("a/b.txt")
    g = Graph.somatize(tidies.named("tidies").frozen().cached())
    assert g.forward(1, store=store) == "b.txt"
    with pytest.raises(Undeclared, match=r"`path`.* is a `pathlib\.(_local\.)?\w*Path`, "
                       r"which has no canonical form.*under another name"):  # fmt: skip
        g.forward(1, store=store)


class Shifts(Node):
    """Adds ``by``, an argument it keeps, and answers a plain float."""

    def __init__(self, by: float = 1.0) -> None:
        self.by = by

    def forward(self, x: float, ctx: Any) -> float:
        return float(x + self.by)


class Viewed(Node):
    """Answers a memoryview of typed items."""

    def forward(self, x: Any, ctx: Any) -> memoryview:
        return memoryview(np.arange(2, dtype=np.int32))


def test_an_answer_that_would_come_back_as_another_type_is_refused_saying_why(
    store: Store,
) -> None:
    """A memoryview would be read back as bytes (for typed items, of another length): the
    answer is not kept, and the error says what in it is refused."""
    g = Graph.somatize(Viewed().named("viewed").frozen().cached())
    facts: list[dict[str, Any]] = []
    with pytest.raises(CodecError, match=r"no codec writes it \(value is a memoryview"):
        g.forward(1, store=store, watching=facts.append)
    assert [f["fact"] for f in facts] == ["ran", "failed"]


class Ordered(Node):
    """A dict whose keys are not in sorted order, holding a bytearray."""

    def forward(self, x: Any, ctx: Any) -> dict[str, Any]:
        return {"zeta": x, "alpha": bytearray(b"ab"), "mid": [{"y": 1, "x": 2}]}


def test_a_recalled_answer_is_what_was_computed_in_order_and_type(store: Store) -> None:
    """A dict comes back in the order it was computed in and a bytearray as a bytearray,
    while keys, which sort dicts and take bytes alike, are unchanged."""
    g = Graph.somatize(Ordered().named("ordered").frozen().cached())
    computed = g.forward(1, store=store)
    recalled = g.forward(1, store=store)
    assert g.record is not None and g.record.outcome == {"ordered": "recalled"}
    assert recalled == computed and list(recalled) == ["zeta", "alpha", "mid"]
    assert type(recalled["alpha"]) is bytearray and list(recalled["mid"][0]) == ["y", "x"]
    plain = CODECS.named("plain")
    assert plain.digest({"b": 1, "a": 2}) == plain.digest({"a": 2, "b": 1})


class SortsInPlace(Node):
    """Sorts the list it is handed in place, and answers it."""

    def forward(self, values: list[int], ctx: Any) -> list[int]:
        values.sort()
        return values


class Head(Node):
    """The first item of the list it is handed."""

    def forward(self, values: list[int], ctx: Any) -> int:
        return values[0]


def test_an_input_a_node_wrote_into_is_not_keyed_as_it_was_handed_in(store: Store) -> None:
    """A node that writes into the graph's input as it runs (sorts it in place) leaves a
    keyed node reading the input after it another input than the one its key names: that
    node fails, saying so, and nothing is kept under the key of the input as it was handed
    in, where the answer computed from the written input was kept and recalled for it."""
    g = Graph.somatize(
        (SortsInPlace().named("sort").frozen(), Head().named("head").frozen().cached())
    )
    with pytest.raises(NodeFailed, match=r"`head` .*`sort`.* wrote into it"):
        g.forward([3, 1, 2], store=store)
    assert g.record is not None and g.record.outcome == {"sort": "ran", "head": "failed"}
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    assert g.forward([3, 1, 2], store=store, outputs="head") == 3  # read alone: as handed in
    assert g.forward([3, 1, 2], store=store, outputs="head") == 3
    assert g.record.outcome == {"sort": "spared", "head": "recalled"}

    # Read before the node that writes into it, or by that node alone, the input is as keyed.
    before = Graph.somatize(
        (Head().named("head").frozen().cached(), SortsInPlace().named("sort").frozen())
    )
    assert before.forward([5, 4], store=store) == (5, [4, 5])
    alone = Graph.somatize(SortsInPlace().named("sort").frozen().cached())
    assert alone.forward([9, 8], store=store) == [8, 9]
    assert alone.forward([9, 8], store=store) == [8, 9]
    assert alone.record is not None and alone.record.outcome == {"sort": "recalled"}


class Pops(Node):
    """Takes `n` out of the dict it is handed."""

    def forward(self, x: dict[str, Any], ctx: Any) -> Any:
        return x.pop("n")


class Gets(Node):
    """`n` of the dict it is handed, or -1 where it holds none."""

    def forward(self, x: dict[str, Any], ctx: Any) -> Any:
        return x.get("n", -1)


def test_an_input_holding_an_opaque_a_node_wrote_into_is_not_keyed_as_handed_in(
    store: Store,
) -> None:
    """An input holding an Opaque is handed to the nodes in a dict or list of its own, with
    what the Opaque wraps in its place: a node that writes into that (pops from the dict,
    sorts the list) leaves the input handed in as it was, and a keyed node reading it after
    that node fails, as it does where the input holds no Opaque, where what it computed
    from the written input was kept, and recalled, as its answer to the input handed in."""

    def made() -> dict[str, Any]:
        return {"n": 5, "blob": Opaque(b"abc")}

    g = Graph.somatize((Pops().named("pop").frozen(), Gets().named("get").frozen().cached()))
    with pytest.raises(NodeFailed, match=r"`get` .*the graph's input after `pop`.* wrote into it"):
        g.forward(made(), store=store)
    assert g.record is not None and g.record.outcome == {"pop": "ran", "get": "failed"}
    assert g.forward(made(), store=store, outputs="get") == 5  # read alone: as handed in
    assert g.forward(made(), store=store, outputs="get") == 5
    assert g.record.outcome == {"pop": "spared", "get": "recalled"}

    listed = Graph.somatize(
        (SortsInPlace().named("sort").frozen(), Head().named("head").frozen().cached())
    )
    with pytest.raises(NodeFailed, match=r"`head` .*`sort`.* wrote into it"):
        listed.forward([Opaque(b"b"), Opaque(b"a")], store=store)
    # What the Opaque wraps, handed back unchanged (or another equal to it), is no change.
    same = Graph.somatize((Echo().named("echo").frozen(), Gets().named("get").frozen().cached()))
    assert same.forward(made(), store=store) == ({"n": 5, "blob": b"abc"}, 5)


class Listed(Node):
    """The list it is handed, as a list of its own."""

    def forward(self, values: list[int], ctx: Any) -> list[int]:
        return list(values)


def _shared(*readers: Node, src: Node | None = None) -> Graph:
    """``src`` (a list of the input's own) read by each of ``readers``, in that order."""
    return Graph.somatize((src or Listed().named("src").frozen()) >> readers)


def test_an_answer_a_node_wrote_into_is_not_read_as_it_was_made(store: Store) -> None:
    """A node that writes into an answer it reads (sorts it in place) leaves a keyed node
    reading that answer after it another value than the one its key names (what `src`
    answered): that node fails, saying so, and nothing is kept for it, where the answer
    computed from the written list was kept and recalled as the first of `src`'s answer.
    So it does when `src`'s answer is recalled, and the writer writes into what was read
    back."""
    g = _shared(SortsInPlace().named("sort").frozen(), Head().named("first").frozen().cached())
    with pytest.raises(NodeFailed, match=r"`first` .*`src`.*`sort` wrote into it"):
        g.forward([3, 1, 2], store=store)
    assert g.record is not None
    assert g.record.outcome == {"src": "ran", "sort": "ran", "first": "failed"}
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    assert g.forward([3, 1, 2], store=store, outputs="first") == 3  # read alone: as made
    assert g.forward([3, 1, 2], store=store, outputs="first") == 3
    assert g.record.outcome == {"src": "spared", "sort": "spared", "first": "recalled"}

    kept = _shared(
        SortsInPlace().named("sort").frozen(),
        Head().named("first").frozen().cached(),
        src=Listed().named("src").frozen().cached(),
    )
    kept.forward([6, 5], store=store, outputs="src")
    assert kept.record is not None
    assert [f["fact"] for f in kept.record.facts if f.get("node") == "src"] == ["ran", "kept"]
    with pytest.raises(NodeFailed, match=r"`first` .*`sort` wrote into it"):
        kept.forward([6, 5], store=store)  # src read back, and written into by sort
    assert kept.record.outcome == {"src": "recalled", "sort": "ran", "first": "failed"}


def test_an_answer_read_before_a_node_writes_into_it_is_read_as_made(store: Store) -> None:
    """A keyed node handed an answer before the node that writes into it, or a node that
    writes into an answer it alone reads, computes from it as it was made, and keeps it."""
    before = _shared(Head().named("first").frozen().cached(), SortsInPlace().named("sort").frozen())
    assert before.forward([5, 4], store=store) == (5, [4, 5])
    assert before.forward([5, 4], store=store) == (5, [4, 5])
    assert before.record is not None and before.record.outcome["first"] == "recalled"
    alone = _shared(SortsInPlace().named("sort").frozen().cached())
    assert alone.forward([9, 8], store=store) == [8, 9]
    assert alone.forward([9, 8], store=store) == [8, 9]
    assert alone.record is not None
    assert alone.record.outcome == {"src": "spared", "sort": "recalled"}


def test_an_answer_written_into_is_caught_with_a_broker(store: Store) -> None:
    """With a broker running a placed node (the forward's other loop), a keyed node handed
    an answer a node before it wrote into fails as it does without one."""
    g = _shared(
        SortsInPlace().named("sort").frozen(),
        Head().named("first").frozen().cached(),
        src=Listed().named("src").frozen().at("w1"),
    )
    broker = Broker.embedded({"w1": Worker.generic(mode="local")})
    try:
        with pytest.raises(NodeFailed, match=r"`first` .*`sort` wrote into it"):
            g.forward([3, 1, 2], store=store, broker=broker)
        assert g.record is not None and g.record.outcome["first"] == "failed"
        assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    finally:
        broker.close()


class Arrayed(Node):
    """The list it is handed, as a numpy array (which no codec weighs)."""

    def forward(self, values: list[int], ctx: Any) -> Any:
        return np.array(values)


def test_an_answer_no_codec_weighs_is_handed_on_unchecked(store: Store) -> None:
    """A keyed node handed, after another node was, an answer no codec weighs (a numpy
    array), which nothing can tell unchanged, is handed it unchecked: it computes and keeps
    its answer, and the graph runs as one whose answers are each read by one node."""
    src = Arrayed().named("src").frozen()
    g = _shared(
        Listed().named("other").frozen(), FirstNumber().named("first").frozen().cached(), src=src
    )
    assert g.forward([3, 1], store=store)[1] == 3
    assert g.record is not None and g.record.outcome["first"] == "ran"
    assert g.forward([3, 1], store=store)[1] == 3
    assert g.record.outcome["first"] == "recalled"


class Tensored(Node):
    """The list it is handed, as a tensor."""

    def forward(self, values: list[int], ctx: Any) -> Any:
        import torch

        return torch.tensor(values)


class FirstNumber(Node):
    """The first number of the tensor it is handed, as an int (no view of the tensor)."""

    def forward(self, x: Any, ctx: Any) -> int:
        return int(x[0])


class AddsOne(Node):
    """Adds one to the tensor it is handed, in place."""

    def forward(self, x: Any, ctx: Any) -> Any:
        return x.add_(1)


def test_a_tensor_answer_written_in_place_is_caught(store: Store) -> None:
    """A tensor answer one node writes into in place (``x.add_(1)``) is seen changed by a
    keyed node handed it after that node (its version counter moved), which fails and
    keeps nothing; handed it before, the keyed node keeps what it computed."""
    import somatize.torch  # noqa: F401  # the tensor codec

    src = Tensored().named("src").frozen()
    first = FirstNumber().named("first").frozen().cached()
    g = _shared(AddsOne().named("add").frozen(), first, src=src)
    with pytest.raises(NodeFailed, match=r"`first` .*`add` wrote into it"):
        g.forward([3, 1], store=store)
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    before = _shared(first, AddsOne().named("add").frozen(), src=src)
    assert before.forward([3, 1], store=store)[0] == 3
    assert before.forward([3, 1], store=store)[0] == 3
    assert before.record is not None and before.record.outcome["first"] == "recalled"


class Keyed(Node):
    """A dict of the names it is handed, in their order: of their positions, or, with
    ``tensors``, of tensors of them."""

    def __init__(self, tensors: bool = False) -> None:
        self.tensors = tensors

    def forward(self, names: list[str], ctx: Any) -> dict[str, Any]:
        import torch

        return {n: torch.tensor([i]) if self.tensors else i for i, n in enumerate(names)}


class SortsKeysInPlace(Node):
    """Sorts the dict it is handed in place (each key taken out and put back, in order)."""

    def forward(self, named: dict[str, Any], ctx: Any) -> int:
        for name in sorted(named):
            named[name] = named.pop(name)
        return len(named)


class FirstKey(Node):
    """The first key of the dict it is handed."""

    def forward(self, named: dict[str, Any], ctx: Any) -> str:
        return next(iter(named))


@pytest.mark.parametrize("tensors", [False, True])
def test_a_dict_answer_sorted_in_place_is_caught(store: Store, tensors: bool) -> None:
    """A node that sorts a dict answer in place leaves its items as they were and their
    order not, which a recalled answer keeps: a keyed node handed it after that node, whose
    answer follows the order, fails and keeps nothing, where it kept what it computed from
    the sorted dict (`a`) under the key a forward without the sorter recalled it for, which
    computes `b`. So it does for a dict of tensors, whose digest sorts its keys too."""
    import somatize.torch  # noqa: F401  # the tensor codec

    src = Keyed(tensors).named("src").frozen()
    first = FirstKey().named("first").frozen().cached()
    g = _shared(SortsKeysInPlace().named("sort").frozen(), first, src=src)
    with pytest.raises(NodeFailed, match=r"`first` .*`sort` wrote into it"):
        g.forward(["b", "a"], store=store)
    assert not any(p.is_file() for p in (store.root / "answers").rglob("*"))
    assert g.forward(["b", "a"], store=store, outputs="first") == "b"  # read alone: as made
    assert g.forward(["b", "a"], store=store, outputs="first") == "b"
    assert g.record is not None and g.record.outcome["first"] == "recalled"
