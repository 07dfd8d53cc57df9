"""Parquet sources: resolved at construction, read by span, only the row groups a span needs."""

from __future__ import annotations

import abc
import gc
import io
import os
import re
import stat
import threading
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy
import pyarrow
import pyarrow.compute
import pyarrow.parquet
import pytest

import somatize.data._parquet_base as parquet_base
import somatize.data.parquet as parquet_module
from somatize import Graph, NameNotFound, Node, Store, Unbuildable, Undeclared
from somatize.broker import Broker, StateMismatch, Worker
from somatize.catalog import Catalog, blueprint_of, identity_of
from somatize.data import (
    ArrowCodec,
    DatasetChanged,
    Frame,
    NotParquet,
    Parquet,
    ParquetDir,
    UnknownColumn,
    settle,
    spans,
)
from somatize.keys import node_key, node_prefix, root_key
from somatize.node import Context
from somatize.plan import compile
from somatize.store import Corrupt
from tests.arrow_types import PickledObjects
from tests.forked import answer_of, cut_short_when_hashed, forked, in_forked_child, needs_fork
from tests.nodes import Total, matmul_in_tf32
from tests.web_server import served_over_http


class CountingFile(io.RawIOBase):
    """A read-only file that counts the bytes read through it."""

    def __init__(self, inner: Any, counter: CountingStore) -> None:
        self.inner = inner
        self.counter = counter

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def readinto(self, buffer: Any) -> int:
        got = self.inner.readinto(buffer)
        self.counter.bytes_read += got
        return int(got)

    def close(self) -> None:
        self.inner.close()
        super().close()


class CountingStore(Store):
    """A store that is not local (so sources read it in ranges through ``open_blob``):
    it delegates to a local store and counts what is opened and read."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.opened = 0
        self.bytes_read = 0
        self.gets = 0

    def open_blob(self, digest: str) -> Any:
        self.opened += 1
        return CountingFile(self.inner.open_blob(digest), self)

    def get(self, digest: str) -> memoryview:
        self.gets += 1
        return self.inner.get(digest)


def _delegate(name: str) -> Any:
    def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    return call


for _name in sorted(Store.__abstractmethods__):
    if _name not in CountingStore.__dict__:
        setattr(CountingStore, _name, _delegate(_name))
abc.update_abstractmethods(CountingStore)


def parquet_bytes(table: pyarrow.Table, **options: Any) -> bytes:
    """``table`` written as a Parquet file."""
    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, sink, **options)
    return bytes(sink.getvalue().to_pybytes())


def numbers(rows: int, start: int = 0) -> pyarrow.Table:
    """``rows`` rows: an int column ``n`` counting from ``start`` and a str column ``s``."""
    values = list(range(start, start + rows))
    return pyarrow.table({"n": values, "s": [f"row {v}" for v in values]})


def bound(store: Store, table: pyarrow.Table, name: str = "data/n", **options: Any) -> str:
    """Puts ``table`` as Parquet into ``store`` under ``name``; returns its digest."""
    digest = store.put(parquet_bytes(table, **options))
    store.bind(name, digest)
    return digest


def ctx() -> Context:
    return Context(name="source")


def _made_of(kind: str, table: pyarrow.Table, tmp_path: Path, store: Store) -> Any:
    """What makes a source (called with its ``columns=``) over ``table``: bound in
    ``store`` (``kind`` "store"), or written twice as the files of a directory."""
    if kind == "store":
        bound(store, table)
        return partial(Parquet, store, "data/n")
    write_dir(tmp_path / "d", [table, table])
    return partial(ParquetDir, tmp_path / "d")


class Count(Node):
    """How many rows a frame brought."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, frame: Frame, ctx: Any) -> int:
        self.calls += 1
        return len(frame)


# ---------------------------------------------------------------- construction


def test_construction_resolves_the_name_and_reads_nothing(store: Store) -> None:
    """Building the source, a graph around it and settling it opens no blob."""
    digest = bound(store, numbers(100))
    counting = CountingStore(store)
    source = Parquet(counting, "data/n")
    g = Graph.somatize(source.named("n").frozen() >> Count().named("count").frozen().cached())
    settle(g)
    str(g)
    assert source.version == digest
    assert (counting.opened, counting.gets, counting.bytes_read) == (0, 0, 0)
    assert g.memory.state_of("n") == digest


def test_an_unknown_name_is_refused_at_construction(store: Store) -> None:
    """A name nobody bound is a NameNotFound (a KeyError) that says how to bind it."""
    with pytest.raises(NameNotFound, match="nothing is bound to `data/none`") as refused:
        Parquet(store, "data/none")
    assert isinstance(refused.value, KeyError)


def test_a_store_is_required(tmp_path: Path) -> None:
    """Handing a path where a store belongs points at ParquetDir."""
    with pytest.raises(TypeError, match="ParquetDir"):
        Parquet(str(tmp_path), "data/n")  # type: ignore[arg-type]


def test_rebinding_gives_another_version(store: Store) -> None:
    """Another dataset under the same name is another version; a built source keeps its own."""
    bound(store, numbers(100))
    first = Parquet(store, "data/n")
    bound(store, numbers(50))
    second = Parquet(store, "data/n")
    assert first.version != second.version
    assert len(first.forward({"at": 0, "take": 1000}, ctx())) == 100
    assert len(second.forward({"at": 0, "take": 1000}, ctx())) == 50


def test_the_declaration_is_the_columns_and_not_the_place(store: Store) -> None:
    """The same bytes under two names declare alike; other columns declare otherwise."""
    bound(store, numbers(10), "a/one")
    bound(store, numbers(10), "a/two")
    one, two = Parquet(store, "a/one"), Parquet(store, "a/two")
    assert one.declaration() == two.declaration()
    assert one.settled_state() == two.settled_state()
    assert Parquet(store, "a/one", columns=["n"]).declaration() != one.declaration()


# ---------------------------------------------------------------- frames


def test_a_span_brings_those_rows(store: Store) -> None:
    """A coordinate answers a Frame of exactly the rows of its span, across row groups."""
    table = numbers(1000)
    bound(store, table, row_group_size=100)
    source = Parquet(store, "data/n")
    frame = source.forward({"at": 250, "take": 300}, ctx())
    assert isinstance(frame, Frame)
    assert frame.column("n") == list(range(250, 550))
    assert frame.to_arrow().equals(table.slice(250, 300))


def test_a_span_across_row_groups_of_narrow_dictionaries_is_keyed(store: Store) -> None:
    """A span across two row groups of a dictionary column with 8-bit indices, whose
    dictionaries together hold more words than such indices count, is a frame the `arrow`
    codec digests (a key below the source), alike each time it is read."""
    chunks = [
        pyarrow.DictionaryArray.from_arrays(
            pyarrow.array([at % 100 for at in range(200)], pyarrow.int8()),
            pyarrow.array([f"{word} {at}" for at in range(100)]),
        )
        for word in ("one", "two")
    ]
    bound(store, pyarrow.table({"d": pyarrow.chunked_array(chunks)}), row_group_size=200)
    codec = ArrowCodec()
    frames = [Parquet(store, "data/n").forward({"at": 100, "take": 200}, ctx()) for _ in "ab"]
    digests = [codec.digest(frame) for frame in frames]
    assert digests[0] == digests[1]
    assert codec.held(frames[0])[1] == frames[0]


def test_a_short_frame_means_the_end_and_past_it_is_empty(store: Store) -> None:
    """The last span is short; one past the end has zero rows and the dataset's columns."""
    bound(store, numbers(1000), row_group_size=128)
    source = Parquet(store, "data/n")
    assert source.forward({"at": 980, "take": 64}, ctx()).column("n") == list(range(980, 1000))
    past = source.forward({"at": 5000, "take": 64}, ctx())
    assert len(past) == 0
    assert past.columns == ["n", "s"]
    assert len(source.forward({"at": 1000, "take": 1}, ctx())) == 0


def test_columns_reads_only_those(store: Store) -> None:
    """columns= hands on only the columns asked for; an unknown one is refused by name."""
    bound(store, numbers(20))
    assert Parquet(store, "data/n", columns=["s"]).forward({"at": 0, "take": 2}, ctx()).columns == [
        "s"
    ]
    with pytest.raises(UnknownColumn, match="has no column `label`; it has `n`, `s`"):
        Parquet(store, "data/n", columns=["label"]).forward({"at": 0, "take": 2}, ctx())
    with pytest.raises(ValueError, match=r"columns= names 'n' more than once"):
        Parquet(store, "data/n", columns=["n", "s", "n"])


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_columns_are_read_as_handed_in_their_order(kind: str, tmp_path: Path, store: Store) -> None:
    """columns= may be any ordered collection of names (a tuple, a numpy array of them):
    those columns are read, in that order, and keyed as plain names. A set, whose order is
    not the same in every process, an iterator, read once, a mapping, whose values would
    be passed over (a rename), and what is no collection of names at all, are refused
    saying what columns= takes."""
    if kind == "store":
        bound(store, numbers(4))
        make: Any = partial(Parquet, store, "data/n")
    else:
        write_dir(tmp_path / "d", [numbers(4)])
        make = partial(ParquetDir, tmp_path / "d")
    made = make(columns=("s", "n"))
    assert made.forward({"at": 0, "take": 2}, ctx()).columns == ["s", "n"]
    with pytest.raises(TypeError, match=r"a `generator`, which can be read only once"):
        make(columns=(name for name in ["s", "n"]))
    from_numpy = make(columns=numpy.array(["n"]))
    assert [type(name) for name in from_numpy.columns] == [str]
    g = Graph.somatize(from_numpy.named("n").frozen() >> Count().named("count").frozen().cached())
    settle(g)
    assert g.forward({"at": 0, "take": 3}, store=store) == 3
    with pytest.raises(TypeError, match=r"(?s)columns=.*a `set`.*order"):
        make(columns={"n", "s"})
    with pytest.raises(TypeError, match=r"columns= is a list of column names, got 5"):
        make(columns=5)
    with pytest.raises(TypeError, match=r"got 'n'; one name: `columns=\['n'\]`"):
        make(columns="n")
    with pytest.raises(TypeError, match=r"a `dict`.*renames none.*`columns=\['n'\]`"):
        make(columns={"n": "number"})  # as a DataFrame's rename takes them


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_a_dotted_column_name_reads_that_column_only(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """A column named ``a.b`` beside a struct column ``a`` with a field ``b`` is read alone:
    columns are picked out by their place in the file, not by Parquet's dotted leaf paths."""
    table = pyarrow.table({"a": pyarrow.array([{"b": "x"}, {"b": "y"}]), "a.b": [1, 2]})
    make = _made_of(kind, table, tmp_path, store)
    dotted = make(columns=["a.b"]).forward({"at": 0, "take": 2}, ctx())
    assert dotted.columns == ["a.b"]
    assert dotted.column("a.b") == [1, 2]
    both = make(columns=["a.b", "a"]).forward({"at": 1, "take": 2}, ctx())
    assert both.columns == ["a.b", "a"]
    assert both.column("a") == [{"b": "y"}] + ([{"b": "x"}] if kind == "directory" else [])
    assert make(columns=["a"]).forward({"at": 0, "take": 2}, ctx()).columns == ["a"]


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_columns_are_picked_beside_a_column_of_pyarrows_own_extension_type_over_many_leaves(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """A column of one of pyarrow's own extension types whose storage is written as several
    Parquet leaves (`arrow.opaque` over a struct) counts those leaves, so the columns after
    it are picked out as pyarrow picks them, rather than the file refused as one whose
    leaves its schema cannot account for."""
    inner = pyarrow.struct([("a", pyarrow.int32()), ("b", pyarrow.string())])
    storage = pyarrow.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}], inner)
    opaque = pyarrow.ExtensionArray.from_storage(pyarrow.opaque(inner, "geo", "v"), storage)
    table = pyarrow.table({"o": opaque, "n": [1, 2]})
    make = _made_of(kind, table, tmp_path, store)
    assert make(columns=["n"]).forward({"at": 0, "take": 2}, ctx()).column("n") == [1, 2]
    both = make(columns=["n", "o"]).forward({"at": 1, "take": 1}, ctx())
    assert both.to_arrow().equals(table.select(["n", "o"]).slice(1, 1))


def test_a_row_group_read_as_other_columns_than_declared_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows read with columns other than the footer declares for them are refused, not
    handed on under the declared ones."""
    bound(store, numbers(4))
    monkeypatch.setattr(parquet_base, "_leaves_of", lambda *args: [0])  # `n`, not `s`
    with pytest.raises(NotParquet, match=r"row group 0 of `data/n`.*was read as columns"):
        Parquet(store, "data/n", columns=["s"]).forward({"at": 0, "take": 2}, ctx())


def _footer_says_one_row_more(data: bytes) -> bytes:
    """``data``, a Parquet file of two row groups of 5 rows, with its footer saying the
    first holds 6 (a writer's footer its pages do not match): the byte of that count,
    zigzag 5, written as zigzag 6, found where the footer reads so."""
    length = int.from_bytes(data[-8:-4], "little")
    for at in range(len(data) - 8 - length, len(data) - 8):
        if data[at] != 0x0A:
            continue
        told = data[:at] + b"\x0c" + data[at + 1 :]
        try:
            footer = pyarrow.parquet.ParquetFile(io.BytesIO(told)).metadata
        except (pyarrow.ArrowException, OSError):
            continue
        if [footer.row_group(i).num_rows for i in range(footer.num_row_groups)] == [6, 5]:
            return told
    raise AssertionError("no count of rows found in the footer")


def test_a_row_group_of_other_rows_than_its_footer_says_is_refused(
    tmp_path: Path, store: Store
) -> None:
    """A row group whose pages hold fewer rows than the footer says is refused, not read
    short: its rows would be handed over at positions they are not at (the rows after it
    shifted, a span short in the middle of the dataset, which says it ended)."""
    told = _footer_says_one_row_more(parquet_bytes(numbers(10), row_group_size=5))
    store.bind("data/n", store.put(told))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "part-000.parquet").write_bytes(told)
    for source in (Parquet(store, "data/n"), ParquetDir(tmp_path / "d")):
        assert source.count_rows() == 11
        with pytest.raises(
            NotParquet, match=r"row group 0 of `.*`.* was read as 5 rows .*footer says it holds 6"
        ):
            source.forward({"at": 3, "take": 3}, ctx())


def test_a_column_name_written_twice_is_refused_as_ambiguous(tmp_path: Path, store: Store) -> None:
    """A file with two columns of one name is refused, naming it, when that name is read
    (or every column is); the columns named once still read."""
    twice = pyarrow.Table.from_arrays(
        [pyarrow.array([1, 2]), pyarrow.array([3, 4]), pyarrow.array(["x", "y"])],
        names=["a", "a", "b"],
    )
    bound(store, twice)
    for columns in (None, ["a"], ["b", "a"]):
        with pytest.raises(NotParquet, match=r"`data/n` .* has 2 columns named `a`.*ambiguous"):
            Parquet(store, "data/n", columns=columns).forward({"at": 0, "take": 2}, ctx())
    assert Parquet(store, "data/n", columns=["b"]).forward({"at": 0, "take": 2}, ctx()).column(
        "b"
    ) == ["x", "y"]
    write_dir(tmp_path / "d", [twice])
    with pytest.raises(NotParquet, match=r"`part-000\.parquet` has 2 columns named `a`"):
        ParquetDir(tmp_path / "d").forward({"at": 0, "take": 2}, ctx())


def test_a_parquet_dir_named_by_no_path_says_what_it_takes(store: Store) -> None:
    """ParquetDir handed a store (meant for `Parquet(store, name)`) or None says it takes a
    directory's path, and points a store to `Parquet`, not pathlib's `expected str, bytes or
    os.PathLike object`."""
    with pytest.raises(TypeError, match=r"named by a str or an os.PathLike.*`Parquet\(store"):
        ParquetDir(store)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"named by a str or an os.PathLike, got a `NoneType`$"):
        ParquetDir(None)  # type: ignore[arg-type]


def test_no_columns_still_counts_the_rows_across_row_groups_and_files(
    tmp_path: Path, store: Store
) -> None:
    """Read with columns=[], a span across row groups or files is as many rows as it
    spans (joining frames of no columns lost their rows, and an empty frame was kept)."""
    bound(store, numbers(1000), row_group_size=128)
    assert len(Parquet(store, "data/n", columns=[]).forward({"at": 100, "take": 300}, ctx())) == 300
    write_dir(tmp_path / "d", [numbers(5), numbers(5, 5)])
    g = Graph.somatize(
        ParquetDir(tmp_path / "d", columns=[]).named("src").frozen()
        >> Count().named("count").frozen().cached()
    )
    settle(g)
    assert g.forward({"at": 3, "take": 4}, store=store) == 4
    assert g.forward({"at": 3, "take": 4}, store=store) == 4
    assert g.record.outcome["count"] == "recalled"


def test_count_rows_reads_the_footer_only(store: Store) -> None:
    """count_rows knows the length from the footer, reading a small part of the file."""
    digest = bound(store, numbers(100_000), row_group_size=10_000)
    counting = CountingStore(store)
    assert Parquet(counting, "data/n").count_rows() == 100_000
    assert 0 < counting.bytes_read < len(store.get(digest)) // 10


def test_only_the_row_groups_of_the_span_are_read(store: Store) -> None:
    """64 rows of a 1,000,000-row file read a footer and one row group, not the file."""
    digest = bound(store, numbers(1_000_000), row_group_size=10_000)
    size = len(store.get(digest))
    counting = CountingStore(store)
    source = Parquet(counting, "data/n")
    frame = source.forward({"at": 500_000, "take": 64}, ctx())
    assert frame.column("n") == list(range(500_000, 500_064))
    assert counting.opened == 1
    assert 0 < counting.bytes_read < size // 20
    first = counting.bytes_read
    source.forward({"at": 500_064, "take": 64}, ctx())  # the same row group: decoded already
    assert counting.bytes_read == first


def test_walking_decodes_each_row_group_once(store: Store) -> None:
    """Spans walked in order read about the file once, however many spans a group holds."""
    digest = bound(store, numbers(100_000), row_group_size=10_000)
    size = len(store.get(digest))
    counting = CountingStore(store)
    source = Parquet(counting, "data/n")
    seen = []
    for span in spans(source, take=4096):
        seen.extend(source.forward(span, ctx()).column("n"))
    assert seen == list(range(100_000))
    assert counting.bytes_read < 2 * size


def test_a_blob_that_is_not_parquet_is_refused_when_read(store: Store) -> None:
    """Bytes that are not Parquet are refused on the first read, naming the dataset."""
    store.bind("data/text", store.put(b"sms,label\nhello,0\n" * 10))
    source = Parquet(store, "data/text")  # reads nothing yet
    with pytest.raises(NotParquet, match=r"`data/text` \(blake3:[0-9a-f]+\) is not a Parquet"):
        source.forward({"at": 0, "take": 4}, ctx())


def test_damaged_pages_are_not_handed_over(store: Store) -> None:
    """A page whose checksum fails is reported Corrupt rather than read as rows."""
    table = pyarrow.table({"n": list(range(10_000))})
    data = bytearray(parquet_bytes(table, write_page_checksum=True, compression="none"))
    data[len(data) // 3] ^= 0xFF
    store.bind("data/bad", store.put(bytes(data)))
    with pytest.raises(Corrupt, match="row group 0 of `data/bad`"):
        Parquet(CountingStore(store), "data/bad").forward({"at": 0, "take": 10}, ctx())


def flip_a_value(path: Path) -> None:
    """Flips one byte of a value in the Parquet file at ``path`` (written uncompressed,
    unencoded, with no page checksums: nothing in the file can tell)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_dataset_in_a_local_store_is_corrupt_and_nothing_below_is_kept(
    tmp_path: Path,
) -> None:
    """A byte flipped in a dataset's blob, which no page checksum covers, is caught by its
    digest when the source opens it: the blob is quarantined, and no answer is kept below."""
    store = Store(tmp_path / "store")
    digest = bound(store, numbers(1000).select(["n"]), compression="none", use_dictionary=False)
    flip_a_value(store.blob_path(digest))
    fresh = Store(tmp_path / "store")  # as another process opens it
    g = Graph.somatize(Parquet(fresh, "data/n").named("n").frozen() >> Total().frozen().cached())
    settle(g)
    with pytest.raises(Corrupt, match=r"`data/n` cannot be read.*hashes to"):
        g.forward({"at": 0, "take": 1000}, store=fresh)
    assert not store.blob_path(digest).exists()
    assert len(list((tmp_path / "store" / "quarantine" / "blobs").iterdir())) == 1
    assert not [p for p in (tmp_path / "store" / "answers").rglob("*") if p.is_file()]


def test_a_dataset_damaged_in_place_after_it_was_opened_is_corrupt_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    """A blob changed in place (same size) after a source verified and opened it is caught
    before its row groups are read: Corrupt, the blob quarantined, and no answer kept under
    the version's key."""
    store = Store(tmp_path / "store")
    table = pyarrow.table({"n": pyarrow.array(range(40_000), pyarrow.int64())})
    data = parquet_bytes(table, row_group_size=10_000, compression="none", use_dictionary=False)
    digest = store.put(data)
    store.bind("data/n", digest)
    g = Graph.somatize(Parquet(store, "data/n").named("n").frozen() >> Total().frozen().cached())
    settle(g)
    assert g.forward({"at": 0, "take": 10}, store=store) == 45  # opens the blob
    at = data.find((35_000).to_bytes(8, "little"))
    with open(store.blob_path(digest), "r+b") as handle:
        handle.seek(at)
        handle.write((777).to_bytes(8, "little"))
    with pytest.raises(Corrupt, match=r"`data/n`.*changed"):
        g.forward({"at": 35_000, "take": 1}, store=store)
    assert not store.blob_path(digest).exists()
    assert len(list((tmp_path / "store" / "quarantine" / "blobs").iterdir())) == 1
    assert len([p for p in (tmp_path / "store" / "answers").rglob("*") if p.is_file()]) == 1


def test_a_dataset_touched_after_it_was_opened_is_read_on(store: Store) -> None:
    """A blob whose file times moved while a source has it open (a ``put`` of the same
    bytes touches it) hashes to its digest again, and its rows are read on."""
    table = pyarrow.table({"n": pyarrow.array(range(40_000), pyarrow.int64())})
    data = parquet_bytes(table, row_group_size=10_000, compression="none", use_dictionary=False)
    store.bind("data/n", store.put(data))
    source = Parquet(store, "data/n")
    assert source.forward({"at": 0, "take": 2}, ctx()).column("n") == [0, 1]
    os.utime(store.blob_path(store.resolve("data/n")), ns=(1, 1))
    assert source.forward({"at": 35_000, "take": 2}, ctx()).column("n") == [35_000, 35_001]


def test_a_damaged_copy_in_a_buckets_cache_is_set_aside_and_the_bucket_read(
    tmp_path: Path,
) -> None:
    """A dataset the cache in front of a bucket holds is verified there before it is read:
    a damaged copy is quarantined in the cache, and the rows come from the bucket."""
    url = f"memory://somatize/{tmp_path.name}"
    cached = Store.on_bucket(url, cache=tmp_path / "cache")
    digest = bound(cached, numbers(1000).select(["n"]), compression="none", use_dictionary=False)
    cache = cached.cache  # type: ignore[attr-defined]
    flip_a_value(cache.blob_path(digest))
    source = Parquet(Store.on_bucket(url, cache=tmp_path / "cache"), "data/n")
    assert source.forward({"at": 0, "take": 1000}, ctx()).column("n") == list(range(1000))
    assert len(list((tmp_path / "cache" / "quarantine" / "blobs").iterdir())) == 1


def test_the_local_store_is_read_without_open_blob(store: Store) -> None:
    """From a local store the blob is memory-mapped, so the source reads whole answers."""
    bound(store, numbers(300), row_group_size=100)
    source = Parquet(store, "data/n")
    assert source.forward({"at": 150, "take": 100}, ctx()).column("n") == list(range(150, 250))
    source.close()
    assert source.forward({"at": 0, "take": 1}, ctx()).column("n") == [0]


def test_a_dataset_read_in_short_reads_hands_over_its_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read at a position may hand over fewer bytes than were asked for though the file
    goes on: Linux hands over at most 2 GiB less 4 KiB a call, less than a column of a row
    group of images or documents holds. The source reads on until it has them all, rather
    than take a whole dataset for one cut short (a Corrupt that says to write it again)."""
    bound(store, numbers(20_000), row_group_size=10_000, compression="none")
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, at: real(fd, min(size, 1000), at))
    rows = Parquet(store, "data/n").forward({"at": 9_990, "take": 20}, ctx())
    assert rows.column("n") == list(range(9_990, 10_010))
    assert rows.column("s") == [f"row {n}" for n in range(9_990, 10_010)]


# ---------------------------------------------------------------- a directory of files


def write_dir(root: Path, parts: list[pyarrow.Table]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(parts):
        pyarrow.parquet.write_table(part, root / f"part-{index:03d}.parquet", row_group_size=50)


def test_a_directory_reads_as_one_dataset(tmp_path: Path) -> None:
    """Spans cross file boundaries; files are in path order; `_` and `.` names are skipped."""
    write_dir(tmp_path / "d", [numbers(120), numbers(80, 120), numbers(5, 200)])
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "d" / "_meta.parquet").write_bytes(b"not data")
    source = ParquetDir(tmp_path / "d")
    assert source.files == ["part-000.parquet", "part-001.parquet", "part-002.parquet"]
    assert source.count_rows() == 205
    assert source.forward({"at": 100, "take": 104}, ctx()).column("n") == list(range(100, 204))
    assert source.forward({"at": 200, "take": 64}, ctx()).column("n") == list(range(200, 205))
    assert len(source.forward({"at": 205, "take": 64}, ctx())) == 0


def test_a_frame_carries_the_metadata_its_files_share_wherever_its_span_starts(
    tmp_path: Path,
) -> None:
    """Every frame of a directory, whichever file its span starts in and however many it
    crosses, or past the end, carries the metadata all its files say alike (not what one
    file says of itself alone), and the field ids of the first file: frames of the same
    rows read the same, and digest the same."""
    ids = [pyarrow.field("n", pyarrow.int64(), metadata={"PARQUET:field_id": i}) for i in "17"]
    parts = [
        pyarrow.table({"n": list(range(3))}, schema=pyarrow.schema([ids[0]])),
        pyarrow.table({"n": list(range(3, 6))}, schema=pyarrow.schema([ids[1]])),
    ]
    parts = [
        part.replace_schema_metadata({"shared": "alike", "writer": name})
        for part, name in zip(parts, ["first", "second"], strict=True)
    ]
    write_dir(tmp_path / "d", parts)
    source = ParquetDir(tmp_path / "d")
    expected = pyarrow.schema([ids[0]], metadata={"shared": "alike"})
    for at, take in [(0, 2), (2, 2), (3, 2), (4, 9), (9, 1)]:
        frame = source.forward({"at": at, "take": take}, ctx())
        assert frame.schema.equals(expected, check_metadata=True), (at, take)
    whole = source.forward({"at": 0, "take": 6}, ctx()).to_arrow()
    codec = ArrowCodec()
    assert codec.digest(source.forward({"at": 3, "take": 2}, ctx())) == codec.digest(
        Frame(whole.slice(3, 2))
    )


def test_a_relative_directory_is_read_where_it_was_when_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source built from a relative path keeps reading that directory after the working
    directory changes."""
    write_dir(tmp_path / "d", [numbers(10)])
    monkeypatch.chdir(tmp_path)
    source = ParquetDir("d")
    monkeypatch.chdir(tmp_path / "d")
    assert source.root.resolve() == (tmp_path / "d").resolve()
    assert source.forward({"at": 2, "take": 3}, ctx()).column("n") == [2, 3, 4]


def test_a_directory_reads_the_files_under_its_links_to_directories(tmp_path: Path) -> None:
    """A link to a directory is walked as a directory, as pyarrow walks it: its files are
    read in path order with the others (a link back up to a directory above is not walked
    again)."""
    write_dir(tmp_path / "elsewhere", [numbers(3, 100)])
    write_dir(tmp_path / "d", [numbers(2)])
    (tmp_path / "d" / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere" / "up").symlink_to(tmp_path / "d", target_is_directory=True)
    source = ParquetDir(tmp_path / "d")
    assert source.files == ["more/part-000.parquet", "part-000.parquet"]
    assert source.forward({"at": 0, "take": 9}, ctx()).column("n") == [100, 101, 102, 0, 1]


def test_a_link_that_points_at_itself_is_passed_over(tmp_path: Path) -> None:
    """A link that resolves to no file nor directory, through a loop of links or to
    nothing, is passed over, as pyarrow passes it over, rather than failing the build."""
    write_dir(tmp_path / "d", [numbers(2)])
    (tmp_path / "d" / "loop").symlink_to("loop")
    (tmp_path / "d" / "loop.parquet").symlink_to("loop.parquet")
    (tmp_path / "d" / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    source = ParquetDir(tmp_path / "d")
    assert source.files == ["part-000.parquet"]
    assert source.forward({"at": 0, "take": 9}, ctx()).column("n") == [0, 1]


def test_a_directory_that_cannot_be_listed_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory under the dataset that this process may not list holds files nobody can
    tell: read without them, the dataset would silently lack their rows, so it is refused
    naming the directory."""
    write_dir(tmp_path / "d", [numbers(2)])
    write_dir(tmp_path / "d" / "locked", [numbers(3, 100)])
    scandir = os.scandir

    def refusing(path: Any) -> Any:
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(PermissionError, match=r"(?s)`locked`.*cannot be listed.*rows"):
        ParquetDir(tmp_path / "d")


def test_a_changed_file_changes_the_version(tmp_path: Path) -> None:
    """Rewriting one file (same name, same row count) gives the directory another version."""
    write_dir(tmp_path / "d", [numbers(100), numbers(100, 100)])
    before = ParquetDir(tmp_path / "d").version
    assert ParquetDir(tmp_path / "d").version == before
    pyarrow.parquet.write_table(numbers(100, 1), tmp_path / "d" / "part-001.parquet")
    assert ParquetDir(tmp_path / "d").version != before


def test_a_file_changed_after_the_version_is_refused(tmp_path: Path) -> None:
    """Rows are never read under a version that no longer names them."""
    write_dir(tmp_path / "d", [numbers(100)])
    source = ParquetDir(tmp_path / "d")
    path = tmp_path / "d" / "part-000.parquet"
    pyarrow.parquet.write_table(numbers(100, 7), path)
    os.utime(path, ns=(1, 1))
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 0, "take": 4}, ctx())


_PLAIN = {"compression": "none", "use_dictionary": False}
"""Parquet written so: a file of other values in the same rows is as long."""


def _file_of_ones(tmp_path: Path, **options: Any) -> tuple[Path, bytes]:
    """A directory ``d`` of one file of ten 1s, and the bytes of a file of ten 2s as long,
    to write over it in place."""
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "part-000.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"n": [1] * 10}), path, **_PLAIN, **options)
    other = parquet_bytes(pyarrow.table({"n": [2] * 10}), **_PLAIN, **options)
    assert len(other) == path.stat().st_size
    return path, other


def _clock_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that has not ticked since the files were written: their times stay as they
    were, however often they are written."""
    import somatize.data.parquet_dir as module

    real = module._stat_of
    monkeypatch.setattr(module, "_stat_of", lambda *a: (*real(*a)[:4], 0, 0))


def test_a_file_rewritten_within_the_tick_it_was_hashed_in_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem stamps a file's times from a clock that ticks coarsely (every few
    milliseconds on Linux before 6.13, every second or two on some filesystems), so a file
    rewritten in place at its size in the tick it was hashed in keeps its stat: a source
    reads such a file only through blocks checked against the digests taken when it was
    hashed, rather than read its new rows under the old version. What it read before the
    change (a group kept decoded, a block checked) is the version's."""
    import somatize.data.parquet_dir as module

    _clock_stopped(monkeypatch)
    monkeypatch.setattr(module, "_RACY_NS", 10**19, raising=False)
    path, other = _file_of_ones(tmp_path, row_group_size=5)
    source = ParquetDir(tmp_path / "d")
    assert source.forward({"at": 0, "take": 3}, ctx()).column("n") == [1, 1, 1]
    with open(path, "r+b") as handle:
        handle.write(other)
    assert source.forward({"at": 2, "take": 3}, ctx()).column("n") == [1, 1, 1]
    source.close()  # lets go of what it read
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 5, "take": 3}, ctx())
    again = ParquetDir(tmp_path / "d")
    assert again.version != source.version
    assert again.forward({"at": 0, "take": 3}, ctx()).column("n") == [2, 2, 2]


@pytest.mark.parametrize("back", [False, True], ids=["left so", "written back"])
def test_a_file_rewritten_within_its_tick_as_a_row_group_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back: bool
) -> None:
    """A file written in place with other rows at its size, in the tick it was hashed in,
    just before a row group is read from it is refused: the row group may hold its new rows.
    So it is when written back as it was just after (its stat and hash as before once read),
    as the bytes read are checked, block by block, as they are read."""
    import somatize.data.parquet_dir as module

    _clock_stopped(monkeypatch)
    monkeypatch.setattr(module, "_RACY_NS", 10**19, raising=False)
    path, other = _file_of_ones(tmp_path)
    mine = path.read_bytes()
    source = ParquetDir(tmp_path / "d")
    assert source.count_rows() == 10
    decode = parquet_base._File._decode

    def written(data: bytes) -> None:
        with open(path, "r+b") as handle:  # in place, as the file it was
            handle.write(data)

    def rewritten_as_read(self: Any, index: int) -> Any:
        written(other)
        try:
            return decode(self, index)
        finally:
            if back:
                written(mine)

    monkeypatch.setattr(parquet_base._File, "_decode", rewritten_as_read)
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 0, "take": 3}, ctx())


def test_a_file_read_through_checked_blocks_is_read_as_any_once_its_stat_can_vouch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file changed too recently for its stat to vouch for it is read through checked
    blocks only until the stat can: it is then hashed once more and read as any other file
    (not through Python code and a hash of every block read); a file that no longer hashes
    to its digest then is refused."""
    import somatize.data.parquet_dir as module

    monkeypatch.setattr(module, "_RACY_NS", 10**19, raising=False)
    write_dir(tmp_path / "d", [numbers(10), numbers(10, 10)])
    source = ParquetDir(tmp_path / "d")
    assert source.forward({"at": 0, "take": 15}, ctx()).column("n") == list(range(15))
    assert [type(one.handle) for one in source._files.files.values()] == [pyarrow.PythonFile] * 2
    monkeypatch.setattr(module, "_RACY_NS", 0, raising=False)  # the clock ticked since
    assert source.forward({"at": 5, "take": 10}, ctx()).column("n") == list(range(5, 15))
    assert [type(one.handle) for one in source._files.files.values()] == [pyarrow.OSFile] * 2
    # Written in place, its times kept, before it was hashed once more: refused then.
    monkeypatch.setattr(module, "_RACY_NS", 10**19, raising=False)
    again = ParquetDir(tmp_path / "d")
    path = tmp_path / "d" / "part-000.parquet"
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(4)
        handle.write(bytes(4))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    real = module._stat_of
    monkeypatch.setattr(
        module, "_stat_of", lambda *a: (*real(*a)[:5], again._stats[0][5])
    )  # a ctime that did not move
    monkeypatch.setattr(module, "_RACY_NS", 0, raising=False)
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        again.forward({"at": 0, "take": 3}, ctx())


def test_a_directory_with_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    """A `.parquet` file that is not one is refused when the version is worked out."""
    write_dir(tmp_path / "d", [numbers(10)])
    (tmp_path / "d" / "part-999.parquet").write_bytes(b"id,label\n" * 20)
    with pytest.raises(NotParquet, match=r"`part-999\.parquet` is named like a Parquet file"):
        ParquetDir(tmp_path / "d")


def test_a_directory_with_no_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty directory, or a path that is not a directory, has nothing to read; a path
    to nothing is said to be one (a typo), from the working directory when relative, not
    taken for a file."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotParquet, match=r"no `\.parquet` files under"):
        ParquetDir(tmp_path / "empty")
    (tmp_path / "one.parquet").write_bytes(b"PAR1")
    with pytest.raises(NotParquet, match=r"is not a directory.*for one file, put it in a store"):
        ParquetDir(tmp_path / "one.parquet")
    with pytest.raises(NotParquet, match=r"missing' does not exist.*Check the path"):
        ParquetDir(tmp_path / "missing")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        NotParquet, match=rf"'missing', taken from {re.escape(repr(str(tmp_path)))}"
    ):
        ParquetDir("missing")


@pytest.mark.parametrize(
    ("log", "files", "format_"),
    [
        ("_delta_log", ["00000000000000000000.json"], "Delta"),
        (".hoodie", ["hoodie.properties"], "Hudi"),
        ("metadata", ["v1.metadata.json", "snap-1.avro"], "Iceberg"),
    ],
)
def test_a_table_whose_log_names_its_live_files_is_refused(
    tmp_path: Path, log: str, files: list[str], format_: str
) -> None:
    """A Delta, Hudi or Iceberg table keeps, beside its `.parquet` files, a log of which of
    them hold its rows now: the others hold rows deleted or replaced since. Read file by
    file it would hand those back, so it is refused naming the format, at any depth, and
    so is a directory within it (a partition)."""
    table = tmp_path / "sales" / "table"
    write_dir(table, [numbers(10), numbers(10, 5)])  # the second replaced the first
    (table / log).mkdir()
    for name in files:
        (table / log / name).write_text("{}")
    write_dir(table / "day=1", [numbers(10)])  # a partition of it, or Iceberg's data/
    for root in (table, tmp_path / "sales", table / "day=1"):
        with pytest.raises(NotParquet, match=rf"(?s)a {format_} table.*`{re.escape(log)}`"):
            ParquetDir(root)
    (table / log).rename(table / "_notes")  # a plain directory of Parquet files is read
    assert ParquetDir(table, columns=["n"]).count_rows() == 30
    assert ParquetDir(table / "day=1").count_rows() == 10


def test_files_of_different_schemas_are_refused(tmp_path: Path) -> None:
    """Files of one dataset share one schema, or reading says which file differs."""
    write_dir(tmp_path / "d", [numbers(10), pyarrow.table({"n": [1.5]})])
    source = ParquetDir(tmp_path / "d")
    mapped = Path("/proc/self/maps")
    for _ in range(3):  # every file is let go again: retries map nothing more
        with pytest.raises(NotParquet, match=r"`part-001\.parquet` has columns"):
            source.forward({"at": 0, "take": 4}, ctx())
        if mapped.exists():
            assert str(tmp_path / "d") not in mapped.read_text()

    def measured(unit: str, writer: str) -> pyarrow.Table:
        field = pyarrow.field("km", pyarrow.int64(), metadata={"unit": unit})
        return pyarrow.table({"km": [1]}, schema=pyarrow.schema([field], {"by": writer}))

    write_dir(tmp_path / "same", [measured("km", "a"), measured("km", "b")])
    assert len(ParquetDir(tmp_path / "same").forward({"at": 0, "take": 4}, ctx())) == 2
    write_dir(tmp_path / "units", [measured("km", "a"), measured("mi", "a")])
    with pytest.raises(NotParquet, match=r"(?s)`part-001\.parquet` has columns .*mi"):
        ParquetDir(tmp_path / "units").forward({"at": 0, "take": 4}, ctx())

    def wrapped(unit: str) -> pyarrow.Table:  # within a column of pyarrow's own extension type
        inner = pyarrow.struct([pyarrow.field("km", pyarrow.int64(), metadata={"unit": unit})])
        kind = pyarrow.opaque(inner, "trip", "v")
        storage = pyarrow.array([{"km": 1}], inner)
        return pyarrow.table({"trip": pyarrow.ExtensionArray.from_storage(kind, storage)})

    write_dir(tmp_path / "wrapped", [wrapped("km"), wrapped("mi")])
    with pytest.raises(NotParquet, match=r"`part-001\.parquet` has columns .*`trip`"):
        ParquetDir(tmp_path / "wrapped").forward({"at": 0, "take": 4}, ctx())


def test_files_of_different_schemas_are_told_apart_by_the_columns_that_differ(
    tmp_path: Path,
) -> None:
    """Of two wide schemas, the refusal names the columns that differ, and how, and the
    ones the files share alike, which `columns=` reads: not both schemas whole, among whose
    columns the one that differs is lost."""
    wide = {f"c{i}": [1] for i in range(30)}
    write_dir(tmp_path / "d", [pyarrow.table(wide), pyarrow.table({**wide, "c7": [1.5], "x": [0]})])
    with pytest.raises(NotParquet) as refused:
        ParquetDir(tmp_path / "d").count_rows()
    said = str(refused.value)
    assert "`c7` is double there and int64 in `part-000.parquet`" in said
    assert "`x` is in it alone" in said
    alike = [f"c{i}" for i in range(30) if i != 7]
    assert f"columns={alike!r}" in said
    assert "c8: int64" not in said  # no schema printed whole
    assert ParquetDir(tmp_path / "d", columns=alike).count_rows() == 2

    write_dir(
        tmp_path / "turned",
        [pyarrow.table({"a": [1], "b": [2]}), pyarrow.table({"b": [2], "a": [1]})],
    )
    with pytest.raises(NotParquet, match=r"in another order: \['b', 'a'\], not \['a', 'b'\]"):
        ParquetDir(tmp_path / "turned").count_rows()


def test_a_directory_partitioned_by_a_column_the_files_lack_is_refused(tmp_path: Path) -> None:
    """A directory partitioned Hive-style (`year=2020/...`, as `write_to_dataset` and Spark
    write them) holds a column in its directory names that its files lack: read whole, the
    rows would come without it, so it is refused naming the column. Asked for the files'
    own columns, or with the column in the files too, it is read."""
    table = pyarrow.table({"year": [2020, 2020, 2021], "n": [1, 2, 3]})
    pyarrow.parquet.write_to_dataset(table, tmp_path / "split", partition_cols=["year"])
    source = ParquetDir(tmp_path / "split")
    with pytest.raises(NotParquet, match=r"(?s)`year=20\d\d/.*`year`.*columns=\['n'\]"):
        source.forward({"at": 0, "take": 4}, ctx())
    with pytest.raises(NotParquet, match="`year`"):
        source.count_rows()
    assert ParquetDir(tmp_path / "split", columns=["n"]).count_rows() == 3
    assert sorted(
        ParquetDir(tmp_path / "split", columns=["n"])
        .forward({"at": 0, "take": 4}, ctx())
        .column("n")
    ) == [1, 2, 3]
    for year in (2020, 2021):
        rows = table.filter(pyarrow.compute.equal(table.column("year"), year))
        write_dir(tmp_path / "kept" / f"year={year}", [rows])
    assert ParquetDir(tmp_path / "kept").forward({"at": 0, "take": 4}, ctx()).column("year") == [
        2020,
        2020,
        2021,
    ]


def test_a_partition_directory_names_its_column_escaped(tmp_path: Path) -> None:
    """A Hive-style directory name escapes what a path may not hold (`a%3Ab=1` for a column
    `a:b`, as Spark writes it, and as pyarrow reads it back): files holding that column are
    read, and files lacking it are refused naming the column as the files would."""
    write_dir(tmp_path / "kept" / "a%3Ab=1", [pyarrow.table({"a:b": [1, 1], "n": [1, 2]})])
    assert ParquetDir(tmp_path / "kept").forward({"at": 0, "take": 4}, ctx()).column("a:b") == [
        1,
        1,
    ]
    # pyarrow writes a name as it is: a column `a%20b` under `a%20b=1` is held too
    write_dir(tmp_path / "as is" / "a%20b=1", [pyarrow.table({"a%20b": [1], "n": [1]})])
    assert ParquetDir(tmp_path / "as is").count_rows() == 1
    write_dir(tmp_path / "split" / "a%3Ab=1", [pyarrow.table({"n": [1, 2]})])
    with pytest.raises(NotParquet, match="a column `a:b`"):
        ParquetDir(tmp_path / "split").count_rows()


def test_files_whose_nested_fields_say_other_things_are_refused(tmp_path: Path) -> None:
    """What a field inside a struct, list or map column says of itself (its unit) goes with
    its rows as a top-level column's does: files that differ in it are not one dataset."""

    def distance(unit: str) -> pyarrow.Field:
        return pyarrow.field("dist", pyarrow.float64(), metadata={"unit": unit})

    kinds = {
        "struct": lambda unit: pyarrow.struct([distance(unit)]),
        "list": lambda unit: pyarrow.list_(distance(unit)),
        "map": lambda unit: pyarrow.map_(pyarrow.string(), distance(unit)),
    }
    values = {"struct": {"dist": 1.0}, "list": [1.0], "map": [("a", 1.0)]}
    for name, kind in kinds.items():

        def table(unit: str, name: str = name, kind: Any = kind) -> pyarrow.Table:
            schema = pyarrow.schema([pyarrow.field("p", kind(unit))])
            return pyarrow.table({"p": pyarrow.array([values[name]], kind(unit))}, schema=schema)

        write_dir(tmp_path / name / "same", [table("m"), table("m")])
        assert len(ParquetDir(tmp_path / name / "same").forward({"at": 0, "take": 4}, ctx())) == 2
        write_dir(tmp_path / name / "units", [table("m"), table("km")])
        with pytest.raises(NotParquet, match=r"`part-001\.parquet` has columns"):
            ParquetDir(tmp_path / name / "units").forward({"at": 0, "take": 4}, ctx())


def test_a_directory_keeps_one_budget_of_decoded_groups_for_all_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Walking many files keeps at most the source's budget of decoded row groups (beyond
    the one being read), not the last group of every file."""
    import somatize.data._parquet_base as module  # where the budget is read

    decoded: list[weakref.ref[pyarrow.Table]] = []
    real = parquet_base._File._decode

    def counting(self: Any, *args: Any, **kwargs: Any) -> pyarrow.Table:
        table = real(self, *args, **kwargs)
        decoded.append(weakref.ref(table))
        return table

    monkeypatch.setattr(parquet_base._File, "_decode", counting)
    write_dir(tmp_path / "d", [numbers(50, 50 * part).select(["n"]) for part in range(30)])
    source = ParquetDir(tmp_path / "d")
    group = source.forward({"at": 0, "take": 50}, ctx()).to_arrow().nbytes
    monkeypatch.setattr(module, "_HELD_BYTES", 3 * group)
    seen = []
    for span in spans(source, take=20):
        seen.extend(source.forward(span, ctx()).column("n"))
    assert seen == list(range(1500))
    assert len(decoded) == 30  # each group decoded once
    gc.collect()
    kept = [table for table in (one() for one in decoded) if table is not None]
    assert sum(table.nbytes for table in kept) <= 4 * group


def test_a_directory_of_more_files_than_a_process_may_open_is_read(tmp_path: Path) -> None:
    """A directory is read with a few of its files open at a time, so one of more files
    than the process may have open is counted and read across."""
    resource = pytest.importorskip("resource")
    listed = Path("/proc/self/fd")
    if not listed.is_dir():
        pytest.skip("the open files are listed in /proc/self/fd on Linux only")
    write_dir(tmp_path / "d", [pyarrow.table({"n": [part]}) for part in range(300)])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = {int(fd) for fd in os.listdir(listed)}
    limit = 0  # the lowest limit leaving 64 descriptors free: a new one takes the lowest free
    while limit - len([fd for fd in used if fd < limit]) < 64:
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        source = ParquetDir(tmp_path / "d")
        assert source.count_rows() == 300
        assert source.forward({"at": 0, "take": 300}, ctx()).column("n") == list(range(300))
        assert source.forward({"at": 250, "take": 5}, ctx()).column("n") == list(range(250, 255))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_file_replaced_after_it_was_let_go_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file the source opened, read and closed again, then replaced by another of the same
    size and time, is refused when a span reaches it again rather than read under the old
    version: by its path, and by the file opened again (as when it is replaced between the
    two)."""
    (tmp_path / "d").mkdir()
    for part in range(40):
        rows = pyarrow.table({"n": list(range(10 * part, 10 * part + 10))})
        pyarrow.parquet.write_table(rows, tmp_path / "d" / f"part-{part:03d}.parquet", **_PLAIN)
    source = ParquetDir(tmp_path / "d")
    assert source.forward({"at": 0, "take": 400}, ctx()).column("n") == list(range(400))
    path = tmp_path / "d" / "part-000.parquet"
    before = path.stat()
    replacement = pyarrow.table({"n": list(range(1, 11))})
    pyarrow.parquet.write_table(replacement, tmp_path / "new.parquet", **_PLAIN)
    assert (tmp_path / "new.parquet").stat().st_size == before.st_size
    os.replace(tmp_path / "new.parquet", path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(DatasetChanged, match=r"`part-000\.parquet` under .* changed after"):
        source.forward({"at": 0, "take": 4}, ctx())
    monkeypatch.setattr(ParquetDir, "_check", lambda self, index, **_: None)
    with pytest.raises(DatasetChanged, match=r"`part-000\.parquet` under .* changed after"):
        source.forward({"at": 0, "take": 4}, ctx())


def test_a_file_replaced_by_a_fifo_is_refused_without_waiting_for_a_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of a ParquetDir replaced by a FIFO after the version was worked out is
    DatasetChanged when its footer is read, and never opened: the open would wait for a
    writer for good."""
    import somatize.data.parquet_dir as module

    write_dir(tmp_path / "d", [numbers(10)])
    source = ParquetDir(tmp_path / "d")
    fifo = tmp_path / "d" / "part-000.parquet"
    fifo.unlink()
    os.mkfifo(fifo)

    def checked(opening: Callable[..., Any]) -> Callable[..., Any]:
        def opened(path: Any, *args: Any) -> Any:
            if not isinstance(path, int):  # a descriptor is opened already
                assert not stat.S_ISFIFO(os.stat(path).st_mode), "a FIFO waits for a writer"
            return opening(path, *args)

        return opened

    monkeypatch.setattr(pyarrow, "OSFile", checked(pyarrow.OSFile))
    monkeypatch.setattr(module, "open_file", checked(module.open_file))
    with pytest.raises(DatasetChanged, match=r"`part-000\.parquet` under .* changed"):
        source.count_rows()


def test_a_directory_source_is_settled_and_cached(tmp_path: Path, store: Store) -> None:
    """A ParquetDir settles like Parquet: its version in the key, answers recalled."""
    write_dir(tmp_path / "d", [numbers(100)])
    count = Count()
    g = Graph.somatize(
        ParquetDir(tmp_path / "d").named("d").frozen() >> count.named("count").frozen().cached()
    )
    assert settle(g) == {"d": g.node("d").version}  # type: ignore[attr-defined]
    assert g.forward({"at": 90, "take": 64}, store=store) == 10
    assert g.forward({"at": 90, "take": 64}, store=store) == 10
    assert count.calls == 1


def test_a_directory_built_again_hashes_its_files_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten in a way that leaves its stat as it was (through a shared memory
    map) gives a ParquetDir built after it the new version: no digest is taken on trust
    from an earlier build."""
    import somatize.data.parquet_dir as module

    # Times left out of the stat, as a write through a map that is already dirty leaves
    # them; and any digest remembered, however recent the file.
    monkeypatch.setattr(module, "_SAFE_AFTER_NS", -(10**18), raising=False)
    _clock_stopped(monkeypatch)
    path, other = _file_of_ones(tmp_path)
    first = ParquetDir(tmp_path / "d")
    with open(path, "r+b") as handle:
        handle.write(other)
    again = ParquetDir(tmp_path / "d")
    assert again.version != first.version
    assert again.forward({"at": 0, "take": 3}, ctx()).column("n") == [2, 2, 2]


def test_a_file_that_vanishes_while_the_version_is_worked_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file removed between the listing and its hashing is DatasetChanged, naming it."""
    import somatize.data.parquet_dir as module

    write_dir(tmp_path / "d", [numbers(10), numbers(10, 10)])
    real = module._file_digest

    def racing(path: Path, relative: str) -> Any:
        if relative == "part-001.parquet":
            os.remove(path)  # another process rewriting the directory
        return real(path, relative)

    monkeypatch.setattr(module, "_file_digest", racing)
    with pytest.raises(DatasetChanged, match=r"`part-001\.parquet` disappeared while the version"):
        ParquetDir(tmp_path / "d")


def _big_table() -> pyarrow.Table:
    return pyarrow.table({"x": [float(i) for i in range(200_000)]})  # 1.6 MB, uncompressed


@needs_fork
def test_a_file_cut_short_while_the_version_is_worked_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file cut short while ParquetDir hashes it is DatasetChanged, not a crash (SIGBUS)."""
    (tmp_path / "d").mkdir()
    path = tmp_path / "d" / "part-000.parquet"
    pyarrow.parquet.write_table(_big_table(), path, compression="none")

    def build() -> str:
        cut_short_when_hashed(monkeypatch, path)
        ParquetDir(tmp_path / "d")
        return "built"

    said = answer_of(*forked(build))
    assert said.startswith("raised DatasetChanged: `part-000.parquet` changed while its digest")


@needs_fork
def test_a_blob_cut_short_while_it_is_first_verified_is_corrupt(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset in a local store cut short while its first read verifies it is Corrupt, not
    a crash (SIGBUS)."""
    digest = bound(store, _big_table(), compression="none")
    source = Parquet(store, "data/n")
    path = store.blob_path(digest)
    assert path.stat().st_size > 1 << 20

    def count() -> str:
        cut_short_when_hashed(monkeypatch, path)
        return str(source.count_rows())

    said = answer_of(*forked(count))
    assert said.startswith("raised Corrupt: `data/n` cannot be read"), said
    assert "as it was hashed" in said


def _rows_of(source: ParquetDir) -> int:
    return source.count_rows()


@needs_fork
def test_a_parquet_dir_forked_while_its_footers_are_read_reads_them_in_the_child(
    tmp_path: Path,
) -> None:
    """A ParquetDir forked while a thread of the parent reads its footers (holding the lock
    that guards them) reads them in the child, where that thread is not: the child made
    the lock afresh (it waited for good on the parent's)."""
    (tmp_path / "d").mkdir()
    for i in range(3):
        pyarrow.parquet.write_table(pyarrow.table({"a": [i] * 5}), tmp_path / "d" / f"p{i}.parquet")
    source = ParquetDir(tmp_path / "d")
    with source._opening:  # as the parent's reading thread holds it at the fork
        assert in_forked_child(_rows_of, source, timeout=30) == 15
    assert source.count_rows() == 15


@needs_fork
def test_forked_children_read_the_rows_of_their_own_spans(store: Store) -> None:
    """A dataset opened in a parent (its rows counted, as spans() does) and read at once in
    forked children, as DataLoader workers read it, hands every process the rows it asked
    for: a child opens a file of its own, and no process reads at another's position."""
    rows = 40_000
    table = pyarrow.table({"n": list(range(rows)), "m": [3 * v for v in range(rows)]})
    bound(store, table, row_group_size=200, compression="none", use_dictionary=False)
    source = Parquet(store, "data/n")
    assert source.count_rows() == rows  # the parent holds the file open now

    def walk(seed: int) -> str:
        inherited = len(source._files.files) + len(source._held.tables)
        wrong = 0
        for step in range(300):
            at = (seed * 7919 + step * 104_729) % (rows - 5)
            source._held.clear()  # every span decoded, not kept from the one before
            frame = source.forward({"at": at, "take": 5}, ctx())
            expected = list(range(at, at + 5))
            if frame.column("n") != expected or frame.column("m") != [3 * v for v in expected]:
                wrong += 1
        return f"inherited {inherited}, wrong {wrong}"

    children = [forked(partial(walk, seed)) for seed in range(1, 4)]
    assert walk(0) == "inherited 1, wrong 0"  # the parent, reading meanwhile, keeps its own
    for child in children:
        assert answer_of(*child) == "inherited 0, wrong 0"


# ---------------------------------------------------------------- closed while read


def a_source(kind: str, tmp_path: Path, store: Store) -> Parquet | ParquetDir:
    """A source of ``kind`` over 4000 rows counting from 0 in ``n``, in row groups of 50: a
    dataset in ``store``, or a directory of four files."""
    if kind == "Parquet":
        bound(store, numbers(4000).select(["n"]), row_group_size=50)
        return Parquet(store, "data/n")
    (tmp_path / "d").mkdir()
    for part in range(4):
        rows = numbers(1000, 1000 * part).select(["n"])
        pyarrow.parquet.write_table(
            rows, tmp_path / "d" / f"part-{part}.parquet", row_group_size=50
        )
    return ParquetDir(tmp_path / "d")


def open_files(source: Parquet | ParquetDir) -> int:
    """How many files ``source`` holds open."""
    return len(source._files.files)


@pytest.mark.parametrize("kind", ["Parquet", "ParquetDir"])
def test_close_waits_for_a_span_being_read_in_another_thread(
    kind: str, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() called while another thread reads a span waits for that read, which answers
    its rows from a file still open; the file is closed once the read is done, and the next
    span opens it again."""
    source = a_source(kind, tmp_path, store)
    source.count_rows()
    reading, go = threading.Event(), threading.Event()
    real = parquet_base._File._decode

    def paused(self: Any, *args: Any, **kwargs: Any) -> pyarrow.Table:
        if not go.is_set():
            reading.set()
            go.wait(10)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(parquet_base._File, "_decode", paused)
    answered: list[Any] = []

    def read() -> None:
        try:
            answered.append(source.forward({"at": 10, "take": 20}, ctx()).column("n"))
        except Exception as why:
            answered.append(why)

    reader = threading.Thread(target=read)
    reader.start()
    assert reading.wait(10)
    closer = threading.Thread(target=source.close)
    closer.start()
    closer.join(0.5)
    waited = closer.is_alive()
    go.set()
    reader.join(10)
    closer.join(10)
    assert answered == [list(range(10, 30))]
    assert waited  # close() returned only once the read was done
    assert open_files(source) == 0
    assert source.forward({"at": 3990, "take": 20}, ctx()).column("n") == list(range(3990, 4000))


@pytest.mark.parametrize("kind", ["Parquet", "ParquetDir"])
def test_spans_read_while_another_thread_closes_the_source_are_its_rows(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """One thread walks the source span by span while another closes it again and again:
    every span answers its rows, and none is refused as damaged."""
    source = a_source(kind, tmp_path, store)
    failed: list[BaseException] = []
    walked = threading.Event()

    def walk() -> None:
        try:
            for _ in range(3):
                for span in spans(source, take=70):
                    at = span["at"]
                    seen = source.forward(span, ctx()).column("n")
                    assert seen == list(range(at, min(at + 70, 4000))), span
        except BaseException as why:
            failed.append(why)
        finally:
            walked.set()

    def close() -> None:
        while not walked.is_set():
            source.close()

    threads = [threading.Thread(target=walk), threading.Thread(target=close)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failed, failed[0]
    source.close()
    assert open_files(source) == 0


# ---------------------------------------------------------------- on a network worker


class AtLeast(Parquet):
    """A Parquet source keeping the rows whose ``n`` is at least ``least``; it inherits
    Parquet's declare(), which does not say ``least``."""

    def __init__(self, store: Store, name: str, least: int, columns: list[str] | None = None):
        super().__init__(store, name, columns)
        self.least = least

    def forward(self, span: Any, ctx: Context) -> Frame:
        table = super().forward(span, ctx).to_arrow()
        return Frame(table.filter(pyarrow.compute.greater_equal(table["n"], self.least)))


class AtLeastSaid(AtLeast):
    """An :class:`AtLeast` that adds ``least`` to its declaration."""

    def declare(self) -> dict[str, Any]:
        return {**super().declare(), "least": self.least}


def test_a_subclass_with_its_own_arguments_declares_them_or_is_refused(store: Store) -> None:
    """A Parquet subclass taking an argument its inherited declare() does not say is refused
    when keyed; with its own declare() its answers key apart, and a network worker rebuilds
    it with its own arguments."""
    bound(store, numbers(100))
    refused = r"`data` \(AtLeast\) cannot be keyed: `AtLeast` takes constructor arguments of "
    refused += r"its own \(`least`\) and inherits `declare\(\)` from `Parquet`"
    g, _ = _on_w1(AtLeast(store, "data/n", 50))
    with pytest.raises(Undeclared, match=refused):
        g.forward({"at": 0, "take": 100}, store=store)
    keys = set()
    for least in (0, 50):
        g, _ = _on_w1(AtLeastSaid(store, "data/n", least))
        seen: list[dict[str, Any]] = []
        x = {"at": 0, "take": 100}
        assert g.forward(x, store=store, broker=_network(), watching=seen.append) == 100 - least
        assert g.forward(x) == 100 - least
        keys.add(_kept(seen)["count"][0])
    assert len(keys) == 2


def _on_w1(source: Node) -> tuple[Graph, Count]:
    """``source`` frozen, cached and placed on `w1`, read by a Count here; settled."""
    count = Count()
    g = Graph.somatize(
        source.named("data").frozen().cached().at("w1") >> count.named("count").frozen().cached()
    )
    settle(g)
    return g, count


def _network() -> Broker:
    return Broker.embedded({"w1": Worker.generic(mode="network")})


def _kept(facts: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    return {f["node"]: (f["key"], f.get("by")) for f in facts if f["fact"] == "kept"}


def test_a_parquet_source_crosses_by_reference(tmp_path: Path, store: Store) -> None:
    """On a network worker the source is rebuilt from its store's address and name, sent only
    its version, reads the rows there and answers as here, under the same keys."""
    bound(store, numbers(100), "numbers")
    source = Parquet(store, "numbers", columns=["n"])
    g, _ = _on_w1(source)
    x = {"at": 90, "take": 64}
    alone: list[dict[str, Any]] = []
    assert g.forward(x, store=Store(tmp_path / "alone"), watching=alone.append) == 10
    source.close()
    seen: list[dict[str, Any]] = []
    broker = _network()
    assert g.forward(x, store=store, broker=broker, watching=seen.append) == 10
    assert not source._files.files  # the client's source read nothing: the worker's did
    assert _kept(seen) == {
        "data": (_kept(alone)["data"][0], "w1"),
        "count": (_kept(alone)["count"][0], None),
    }
    state = [f["bytes"] for f in seen if f["fact"] == "crossed" and f["way"] == "state"]
    assert state == [len(source.version)]
    seen.clear()
    assert g.forward({"at": 0, "take": 5}, store=store, broker=broker, watching=seen.append) == 5
    assert not [f for f in seen if f["fact"] == "crossed" and f["way"] == "state"]


def test_an_unsettled_parquet_source_on_a_worker_is_told_to_settle(store: Store) -> None:
    """A Parquet source nobody settled, placed on a network worker, was refused with advice
    meant for torch weights: to call `somatize.torch.freeze(g)`, which refuses a dataset. It
    is told to call `somatize.data.settle(g)`, and runs once it has."""
    bound(store, numbers(10), "numbers")
    g = Graph.somatize(
        Parquet(store, "numbers").named("data").frozen().at("w1") >> Count().named("count")
    )
    refused = r"`data` \(Parquet\) is placed on network worker `w1`.*not settled at any.*"
    refused += r"`somatize\.data\.settle\(g\)`"
    with pytest.raises(Unbuildable, match=refused) as said:
        g.forward({"at": 0, "take": 4}, broker=_network())
    assert "torch" not in str(said.value) and "weights" not in str(said.value)
    settle(g)
    assert g.forward({"at": 0, "take": 4}, broker=_network()) == 4


def test_a_name_rebound_after_settling_is_refused_on_a_worker(tmp_path: Path, store: Store) -> None:
    """The worker resolves the name anew; bound to other bytes since the source was built, it
    is refused (StateMismatch) and nothing is kept, where the graph itself still reads the
    version it was built at. Built again and settled, the source reads the new version."""
    old = bound(store, numbers(100), "numbers")
    g, _ = _on_w1(Parquet(store, "numbers"))
    new = bound(store, numbers(30), "numbers")
    x = {"at": 0, "take": 64}
    broker = _network()
    seen: list[dict[str, Any]] = []
    refused = rf"`data` on worker `w1`: `numbers` is bound to {new} in Store\(.*\), and the "
    refused += rf"graph is settled at {old}.*rebound.*Nothing ran.*somatize\.data\.settle\(g\)"
    with pytest.raises(StateMismatch, match=refused):
        g.forward(x, store=store, broker=broker, watching=seen.append)
    assert not [f for f in seen if f["fact"] in ("ran", "kept")]
    assert not broker._hosts["w1"]._nodes
    alone: list[dict[str, Any]] = []
    assert g.forward(x, store=Store(tmp_path / "alone"), watching=alone.append) == 64
    assert not store.have(key for key, _ in _kept(alone).values())
    again, _ = _on_w1(Parquet(store, "numbers"))
    assert again.forward(x, store=store, broker=broker) == 30


def test_a_source_a_worker_built_before_its_name_was_rebound_is_built_again(
    store: Store,
) -> None:
    """A worker builds a source ahead of its first job, resolving the name then: one built
    for a forward whose answers were all recalled, so that it never ran, is still at the
    old version when the name is rebound and a graph built and settled on the new one asks
    for it. That graph did as it should, and reads the new version on the worker."""
    bound(store, numbers(100), "numbers")
    x = {"at": 0, "take": 64}
    before, _ = _on_w1(Parquet(store, "numbers"))
    assert before.forward(x, store=store) == 64
    broker = _network()
    seen: list[dict[str, Any]] = []
    assert before.forward(x, store=store, broker=broker, watching=seen.append) == 64
    assert [f["fact"] for f in seen] == ["spared", "recalled", "finished"]
    bound(store, numbers(30), "numbers")
    after, _ = _on_w1(Parquet(store, "numbers"))
    seen.clear()
    assert after.forward(x, store=store, broker=broker, watching=seen.append) == 30
    assert [(f["node"], f.get("by")) for f in seen if f["fact"] == "kept"] == [
        ("data", "w1"),
        ("count", None),
    ]


def _written_again(path: Path) -> None:
    """``path`` written again with the bytes it holds, its times moved past any tick of the
    filesystem's clock: another stat, the same rows."""
    data = path.read_bytes()
    later = path.stat().st_mtime_ns + 5_000_000_000
    path.write_bytes(data)
    os.utime(path, ns=(later, later))


def test_a_directory_a_worker_read_before_its_files_were_written_again_alike_is_read(
    tmp_path: Path,
) -> None:
    """A job that writes its dataset's files anew with the same rows leaves the version as it
    was: a `ParquetDir` built again and settled reads on the worker as it reads here,
    though the worker's copy of the source, at that version, was built before the files
    were written and holds their old stat."""
    write_dir(tmp_path / "d", [numbers(100)])
    x = {"at": 0, "take": 64}
    broker = _network()
    g, _ = _on_w1(ParquetDir(tmp_path / "d"))
    assert g.forward(x, broker=broker) == 64
    _written_again(tmp_path / "d" / "part-000.parquet")
    again, _ = _on_w1(ParquetDir(tmp_path / "d"))
    assert again.node("data").version == g.node("data").version
    assert again.forward(x, broker=broker) == again.forward(x) == 64


def test_a_file_written_again_with_the_same_bytes_is_read_on(tmp_path: Path) -> None:
    """A file of a `ParquetDir` written again with the bytes it held (its stat moved) still
    holds the rows the version names: the source hashes it again and reads on. One written
    with other bytes is refused as before."""
    write_dir(tmp_path / "d", [numbers(100), numbers(50, 100)])
    source = ParquetDir(tmp_path / "d")
    fresh = ParquetDir(tmp_path / "d")  # its footers not read yet
    assert source.forward({"at": 90, "take": 20}, ctx()).column("n") == list(range(90, 110))
    _written_again(tmp_path / "d" / "part-001.parquet")
    assert source.forward({"at": 95, "take": 10}, ctx()).column("n") == list(range(95, 105))
    assert fresh.forward({"at": 95, "take": 10}, ctx()).column("n") == list(range(95, 105))
    path = tmp_path / "d" / "part-001.parquet"
    pyarrow.parquet.write_table(numbers(50, 7), path, row_group_size=50)
    os.utime(path, ns=(1, 1))
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 95, "take": 10}, ctx())


def test_a_file_written_and_written_back_while_a_span_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten with other rows while a span is read from it, and written back with
    its own bytes before the check that follows the read, is refused: the rows read may be
    the other ones, though the file hashes to its digest again by then."""
    import somatize.data.parquet_dir as module

    monkeypatch.setattr(module, "_RACY_NS", 0, raising=False)  # read as any file, not by blocks
    path, other = _file_of_ones(tmp_path)
    mine = path.read_bytes()
    source = ParquetDir(tmp_path / "d")
    assert source.count_rows() == 10
    reading = parquet_module._File.read

    def rewritten_while_read(self: Any, *args: Any) -> Any:
        path.write_bytes(other)
        try:
            return reading(self, *args)
        finally:
            path.write_bytes(mine)
            _written_again(path)

    monkeypatch.setattr(parquet_module._File, "read", rewritten_while_read)
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 0, "take": 4}, ctx())


def test_a_store_no_worker_can_open_is_refused_before_anything_runs() -> None:
    """A `memory://` bucket has no address: the source is refused, saying why and what to do,
    and nothing runs."""
    bucket = Store.on_bucket("memory://somatize/parquet-on-a-worker")
    bound(bucket, numbers(10), "numbers")
    g, count = _on_w1(Parquet(bucket, "numbers"))
    seen: list[dict[str, Any]] = []
    refused = r"`data` cannot be sent to worker `w1`.*`BucketStore` that has no address.*"
    refused += r"`memory://` bucket.*local directory.*mode=\"local\".*Nothing has run"
    with pytest.raises(Unbuildable, match=refused):
        g.forward({"at": 0, "take": 5}, broker=_network(), watching=seen.append)
    assert seen == [] and count.calls == 0
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert g.forward({"at": 0, "take": 5}, broker=local) == 5


def test_a_rebound_name_refused_on_a_worker_masks_the_store_s_password(
    tmp_path: Path, store: Store
) -> None:
    """The refusal of a source whose name was rebound names the store it read, a password
    in its URL (``http://user:password@host/…``) masked, as the store's repr masks it."""
    bound(store, numbers(10), "numbers")
    with served_over_http(tmp_path / "store") as url:
        served = Store.on_bucket(url.replace("://", "://user:a-password@"), read_only=True)
        source = Parquet(served, "numbers")
        with pytest.raises(StateMismatch, match=r"rebound") as refused:
            source.load_state(memoryview(b"blake3:" + b"0" * 64))
    assert "a-password" not in str(refused.value)
    assert "user:***@127.0.0.1" in str(refused.value)


def test_a_parquet_dir_crosses_by_its_absolute_path(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ParquetDir named by a relative path is rebuilt from the absolute one, answers as
    here on a network worker, and is refused there once its files changed."""
    write_dir(tmp_path / "parts", [numbers(60), numbers(40, 60)])
    monkeypatch.chdir(tmp_path)
    source = ParquetDir("parts")
    named = ParquetDir(path="parts")
    monkeypatch.chdir("/")  # the working directory moves after the build: the path does not
    assert blueprint_of(source).args == (str(tmp_path / "parts"),)
    assert blueprint_of(named).kwargs == {"path": str(tmp_path / "parts")}
    g, _ = _on_w1(source)
    x = {"at": 50, "take": 64}
    broker = _network()
    assert g.forward(x, store=store, broker=broker) == g.forward(x) == 50
    changed, _ = _on_w1(ParquetDir(tmp_path / "parts", columns=["n"]))
    settled = changed.memory.state_of("data")
    write_dir(tmp_path / "parts", [numbers(60), numbers(41, 60)])
    refused = r"`data` on worker `w1`: the files under .*parts', as this worker finds them, "
    refused += rf"are at version blake3:\w+, and the graph is settled at {settled}.*changed"
    with pytest.raises(StateMismatch, match=refused):
        changed.forward(x, store=store, broker=broker)


def test_a_parquet_dir_keeps_the_identity_and_keys_it_had_in_the_parquet_module(
    tmp_path: Path, store: Store
) -> None:
    """ParquetDir is defined in `somatize.data.parquet_dir` and keeps the identity it had when
    `somatize.data.parquet` defined it: its answers keep their keys (pinned: the key of a
    span of a ParquetDir at a fixed version, as it was before the class moved), and a worker
    finds the class where the identity names it."""
    write_dir(tmp_path / "d", [numbers(10)])
    source = ParquetDir(tmp_path / "d")
    assert ParquetDir.__module__ == "somatize.data.parquet_dir"
    identity = "somatize.data.parquet:ParquetDir"
    assert identity_of(ParquetDir) == identity
    assert blueprint_of(source).identity == identity and blueprint_of(source).maker is None
    assert Catalog().resolve(identity) is ParquetDir
    assert parquet_module.ParquetDir is ParquetDir
    source._version = "blake3:" + "0" * 64  # a version that no writer's footer decides
    g = Graph.somatize(source.named("d").frozen().cached())
    settle(g)
    x = {"at": 0, "take": 64}
    key = compile(g, x, store, g.outputs).keys["d"]
    prefix = node_prefix(identity, source.declaration(), source.version, None)
    assert key == node_key(prefix, [root_key(x)])
    assert key == "blake3:87d492607992a2801798e1e8a3498dbfeaca9add77857358e0006cae935c9351"

    class Own(ParquetDir):
        pass

    assert identity_of(Own) is None  # defined in a function: not the identity of its base


def test_a_file_rewritten_in_place_while_a_span_is_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file rewritten in place (same size) after the check that precedes a read, while the
    rows are read from it, is refused: the rows read may be the new ones, and are not handed
    over under the old version."""
    path, other = _file_of_ones(tmp_path)
    source = ParquetDir(tmp_path / "d")
    assert source.forward({"at": 0, "take": 4}, ctx()).column("n") == [1] * 4
    source.close()
    reading = parquet_module._File.read

    def rewritten_while_read(self: Any, *args: Any) -> Any:
        with open(path, "r+b") as handle:
            handle.write(other)
        later = path.stat().st_mtime_ns + 5_000_000_000
        os.utime(path, ns=(later, later))  # past any timestamp granularity
        return reading(self, *args)

    monkeypatch.setattr(parquet_module._File, "read", rewritten_while_read)
    with pytest.raises(DatasetChanged, match="changed after this source's version"):
        source.forward({"at": 0, "take": 4}, ctx())


def _write_through_numpy(frame: Frame, name: str) -> None:
    """Writes into the memory under column ``name`` of ``frame`` through numpy."""
    import numpy

    chunk = frame.to_arrow().column(name).chunks[0]
    values = numpy.frombuffer(chunk.buffers()[1], dtype=numpy.int64)
    values[chunk.offset : chunk.offset + len(chunk)] *= 10


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_the_rows_a_source_keeps_cannot_be_written_in_place(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """The row groups a source keeps, and hands out slices of, are in memory a write through
    numpy is refused on: a node cannot change the rows the next span of the version brings."""
    if kind == "store":
        bound(store, numbers(8))
        source: Any = Parquet(store, "data/n")
    else:
        write_dir(tmp_path / "d", [numbers(8)])
        source = ParquetDir(tmp_path / "d")
    frame = source.forward({"at": 0, "take": 4}, ctx())
    with pytest.raises(ValueError, match="read-only"):
        _write_through_numpy(frame, "n")
    assert source.forward({"at": 0, "take": 4}, ctx()).column("n") == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_columns_and_version_are_fixed_when_a_source_is_built(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """What a source is keyed by cannot be changed after it is built: its columns are a
    tuple, and neither they nor its version can be set; its key is the one it always was
    (pinned, at a fixed version: the declared columns are still a list)."""
    table = pyarrow.table({"n": [1, 2], "s": ["a", "b"]})
    if kind == "store":
        bound(store, table)
        source: Any = Parquet(store, "data/n", columns=["n"])
        pinned = "blake3:65f20ab62bb5645a5284f652416b82654bb16e99968087d98af105a5b1dde266"
    else:
        write_dir(tmp_path / "d", [table])
        source = ParquetDir(tmp_path / "d", columns=["n"])
        pinned = "blake3:28efc6824eb72666fa97ed4d22b484814adae85294d6a8f5cd54dfdf3a90819d"
    assert source.columns == ("n",)
    with pytest.raises(AttributeError):
        source.columns.append("s")
    with pytest.raises(AttributeError, match=r"is fixed when it is built.*Build a new"):
        source.columns = ["s"]
    with pytest.raises(AttributeError, match=r"is fixed when it is built.*Build a new"):
        source.version = "blake3:" + "1" * 64
    assert source.forward({"at": 0, "take": 2}, ctx()).columns == ["n"]
    source._version = "blake3:" + "0" * 64  # a version that no writer's footer decides
    g = Graph.somatize(source.named("d").frozen().cached())
    settle(g)
    assert compile(g, {"at": 0, "take": 64}, store, g.outputs).keys["d"] == pinned


@pytest.fixture
def pickled_type() -> Any:
    kind = PickledObjects()
    pyarrow.register_extension_type(kind)
    yield kind
    pyarrow.unregister_extension_type(PickledObjects.name)


def test_a_column_of_an_extension_type_defined_in_python_is_refused(
    pickled_type: Any, store: Store
) -> None:
    """A dataset with a column of an extension type some code in the process registered is
    refused when read (its values would turn into Python by that code), unless the column
    is left out; pyarrow's own extension types are read."""
    storage = pyarrow.array([b"\x80\x04N."], pyarrow.large_binary())
    table = pyarrow.table({"obj": pickled_type.wrap_array(storage), "n": [1]})
    bound(store, table)
    with pytest.raises(NotParquet, match=r"`obj`: somatize\.test\.pickled"):
        Parquet(store, "data/n").forward({"at": 0, "take": 1}, ctx())
    assert Parquet(store, "data/n", columns=["n"]).forward({"at": 0, "take": 1}, ctx()).column(
        "n"
    ) == [1]
    nested = pyarrow.StructArray.from_arrays([pickled_type.wrap_array(storage)], ["inner"])
    bound(store, pyarrow.table({"outer": nested}), "data/nested")
    with pytest.raises(NotParquet, match=r"`outer\.inner`: somatize\.test\.pickled"):
        Parquet(store, "data/nested").forward({"at": 0, "take": 1}, ctx())
    uuids = pyarrow.array([b"0123456789abcdef"], pyarrow.uuid())
    bound(store, pyarrow.table({"id": uuids}), "data/uuid")
    assert len(Parquet(store, "data/uuid").forward({"at": 0, "take": 1}, ctx())) == 1


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_a_source_is_copied_and_pickled_without_its_open_files(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """A source that has read a span (a file open, row groups kept) is copied, deep-copied and
    pickled; the copy shares no open file, kept group or lock with the original, reads the
    same rows, and a directory's copy still checks that its files are the ones its version
    names."""
    import copy
    import pickle

    if kind == "store":
        bound(store, numbers(100))
        source: Any = Parquet(store, "data/n")
    else:
        write_dir(tmp_path / "d", [numbers(50), numbers(50, 50)])
        source = ParquetDir(tmp_path / "d")
    g = Graph.somatize(source.named("s").frozen() >> Count().named("c").frozen().cached())
    settle(g)
    assert g.forward({"at": 0, "take": 10}, store=store) == 10
    copies = [copy.copy(source), copy.deepcopy(source), pickle.loads(pickle.dumps(source))]
    for one in copies:
        assert one._files is not source._files and one._held is not source._held
        assert one.version == source.version
        assert one.forward({"at": 45, "take": 10}, ctx()).column("n") == list(range(45, 55))
        one.close()
    assert source.forward({"at": 45, "take": 10}, ctx()).column("n") == list(range(45, 55))
    again = pickle.loads(pickle.dumps(g))
    assert again.forward({"at": 0, "take": 10}, store=store) == 10
    if kind == "directory":
        path = tmp_path / "d" / "part-001.parquet"
        pyarrow.parquet.write_table(numbers(50, 7), path)
        os.utime(path, ns=(1, 1))
        with pytest.raises(DatasetChanged):
            copy.deepcopy(source).forward({"at": 60, "take": 4}, ctx())


def test_a_blob_removed_after_the_name_was_rebound_says_both_ways_on(store: Store) -> None:
    """A source built before its name was rebound, whose blob was then collected, says which
    blob it was built at and what the name is bound to now, and offers both: put the bytes
    again, or build the source again."""
    from somatize.store import Missing

    old = bound(store, numbers(100))
    source = Parquet(store, "data/n")
    new = bound(store, numbers(50))
    store.gc(grace=0)
    with pytest.raises(Missing) as why:
        source.forward({"at": 0, "take": 8}, ctx())
    said = str(why.value)
    assert f"was bound to {old} when this source was built" in said
    assert f"is bound to {new} now" in said
    assert "put the same bytes again" in said and "build the source again" in said


def test_files_differing_only_by_parquet_field_ids_are_one_dataset(tmp_path: Path) -> None:
    """Field ids a writer numbered the columns by (Spark, Iceberg) say nothing of the rows:
    files that differ only by them are read as one dataset; any other column metadata must
    still agree."""
    (tmp_path / "d").mkdir()
    with_id = pyarrow.schema(
        [pyarrow.field("n", pyarrow.int64(), metadata={"PARQUET:field_id": "1"})]
    )
    pyarrow.parquet.write_table(
        pyarrow.table({"n": [1, 2]}, schema=with_id), tmp_path / "d" / "a.parquet"
    )
    pyarrow.parquet.write_table(pyarrow.table({"n": [3, 4]}), tmp_path / "d" / "b.parquet")
    assert ParquetDir(tmp_path / "d").forward({"at": 0, "take": 4}, ctx()).column("n") == [
        1,
        2,
        3,
        4,
    ]
    assert ParquetDir(tmp_path / "d", columns=["n"]).count_rows() == 4
    unit = pyarrow.schema([pyarrow.field("n", pyarrow.int64(), metadata={"unit": "m"})])
    pyarrow.parquet.write_table(
        pyarrow.table({"n": [5]}, schema=unit), tmp_path / "d" / "c.parquet"
    )
    with pytest.raises(NotParquet, match="share one schema"):
        ParquetDir(tmp_path / "d").count_rows()


_READ_AS_THE_INTERPRETER_FINALIZES = """
import gc, pathlib, sys
import pyarrow, pyarrow.parquet
from somatize.data import ParquetDir
from somatize.node import Context

root = pathlib.Path(sys.argv[1])
pyarrow.parquet.write_table(pyarrow.table({"n": [1, 2, 3]}), root / "a.parquet")
before = ParquetDir(root)  # its file just written: read through checked blocks
class Later:
    def __del__(self):
        for source in (lambda: before, lambda: ParquetDir(root)):
            try:
                print("read", source().forward({"at": 0, "take": 2}, Context(name="s")).column("n"))
            except BaseException as error:
                print("raised", type(error).__name__, error)
gc.disable()  # collected as the interpreter finalizes
later = Later()
later.me = later
del later
"""


def test_a_directory_is_built_and_read_as_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A ``ParquetDir`` built, or read with a file it hashes again, by code a collection runs
    as the interpreter finalizes — once builtins are put back as they were before ``io``
    added ``open`` — reads its rows, rather than fail with NameError."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _READ_AS_THE_INTERPRETER_FINALIZES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.stdout.splitlines() == ["read [1, 2]"] * 2, done.stdout + done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


_STORE_READ_AS_THE_INTERPRETER_FINALIZES = """
import gc, pathlib, sys
import pyarrow, pyarrow.parquet
from somatize import Store
from somatize.data import Parquet
from somatize.node import Context

store = Store(pathlib.Path(sys.argv[1]) / "store")
sink = pyarrow.BufferOutputStream()  # large enough to be read through a file, not in memory
pyarrow.parquet.write_table(pyarrow.table({"n": list(range(200_000))}), sink)
store.bind("d", store.put(sink.getvalue().to_pybytes()))
before = Parquet(store, "d")
assert len(before.forward({"at": 0, "take": 2}, Context(name="s"))) == 2
class Later:
    def __del__(self):
        for source in (lambda: before, lambda: Parquet(store, "d")):
            try:
                span = {"at": 150_000, "take": 2}
                print("read", source().forward(span, Context(name="s")).column("n"), flush=True)
            except BaseException as error:
                print("raised", type(error).__name__, error, flush=True)
gc.disable()  # collected as the interpreter finalizes
later = Later()
later.me = later
del later
"""


def test_a_dataset_in_a_store_is_read_as_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A dataset in a local store, read through a Python file, by code a collection runs as
    the interpreter finalizes — when pyarrow's threads cannot take the GIL to read it — by a
    source built before or then, hands over its rows, rather than wait for ever."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", _STORE_READ_AS_THE_INTERPRETER_FINALIZES, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except subprocess.TimeoutExpired as hung:
        said = hung.stdout.decode() if isinstance(hung.stdout, bytes) else hung.stdout
        pytest.fail(f"the read as the interpreter finalized never ended: {said!r}")
    assert done.stdout.splitlines() == ["read [150000, 150001]"] * 2, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


_CUT_SHORT = """
import os, pathlib, sys, tempfile
import pyarrow, pyarrow.parquet
from somatize import Store
from somatize.data import Parquet, ParquetDir, parquet_dir
from somatize.node import Context
from somatize.store import Corrupt

kind = sys.argv[1]
table = pyarrow.table({"n": list(range(400_000))})
where = pathlib.Path(tempfile.mkdtemp())
if kind == "store":
    store = Store(where / "store")
    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, sink, row_group_size=20_000, compression="none")
    digest = store.put(sink.getvalue().to_pybytes())
    store.bind("d", digest)
    source = Parquet(store, "d")
    path = store.blob_path(digest)
else:
    (where / "d").mkdir()
    path = where / "d" / "a.parquet"
    pyarrow.parquet.write_table(table, path, row_group_size=20_000, compression="none")
    parquet_dir._RACY_NS = 0  # its stat vouches for it: read as it is, not block by block
    source = ParquetDir(where / "d")
    ParquetDir._check = lambda self, index, **_: None  # the file cut short between check and read
assert source.forward({"at": 0, "take": 5}, Context(name="s")).column("n") == list(range(5))
os.truncate(path, os.stat(path).st_size // 2)
try:
    source.forward({"at": 390_000, "take": 5}, Context(name="s"))
except Corrupt:
    print("refused")
"""


@pytest.mark.parametrize("kind", ["store", "directory"])
def test_a_dataset_cut_short_on_disk_while_open_is_corrupt_not_a_crash(
    kind: str, tmp_path: Path
) -> None:
    """A dataset file truncated on disk after a source opened it is read through a file, not a
    memory map: a row group past its new end is Corrupt, where a map would kill the process
    (SIGBUS)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CUT_SHORT, kind],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "refused"


@pytest.mark.parametrize("kind", ["store", "dir"])
def test_a_parquet_source_keeps_its_keys_under_tf32(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """A graph of a Parquet source (bound in a store, or a directory) and a cached node that
    computes nothing with torch, called with float32 products in TF32 as Lightning's warning
    asks, recalls what it kept in torch's default precision, under the keys it always had
    (each was keyed anew, naming the precision: a store filled before missed for all)."""
    source = _made_of(kind, numbers(8), tmp_path, store)()
    g = Graph.somatize(source.named("src").frozen() >> Total().named("total").frozen().cached())
    settle(g)
    seen: list[dict[str, Any]] = []
    assert g.forward({"at": 0, "take": 8}, store=store, watching=seen.append) == 28
    with matmul_in_tf32():
        assert g.forward({"at": 0, "take": 8}, store=store, watching=seen.append) == 28
    assert g.record is not None and g.record.outcome["total"] == "recalled"
    (kept,) = [f["key"] for f in seen if f["fact"] == "kept"]
    memory = g.memory
    fixed = {
        name: node_prefix(
            memory.identity_of(name) or "",
            memory.declaration_of(name) or "",
            memory.state_of(name),
            memory.salt_of(name),
        )
        for name in ("src", "total")
    }
    at = node_key(fixed["src"], [root_key({"at": 0, "take": 8})])
    assert kept == node_key(fixed["total"], [at])


@pytest.mark.parametrize("kind", ["store", "dir"])
def test_a_parquet_source_runs_on_a_network_worker_whatever_float32_precision_is_set(
    kind: str, tmp_path: Path, store: Store
) -> None:
    """A Parquet source sent to a network worker from a graph called with float32 products
    in TF32 runs on a worker whose process computes in torch's default precision (a Ray
    actor's): it computes nothing with torch, and its job names no precision (it was
    refused, as running in another precision than its key named)."""
    from somatize.broker.base import _owed
    from somatize.broker.host import Host, Reply, job_for, state_for, unpack

    source = _made_of(kind, numbers(8), tmp_path, store)()
    g = Graph.somatize(source.named("src").frozen().at("w1") >> Total().named("total"))
    settle(g)
    ctx = Context(name="src", key="blake3:" + "0" * 64, worker="w1", store=None)
    blueprint = blueprint_of(g.node("src"), "src", _owed(g, "src"))
    with matmul_in_tf32():
        job, sent = job_for(g, "src", "w1", blueprint, [{"at": 2, "take": 3}], ctx, keep=False)
    reply = Host("w1").run(job, sent, state=state_for(g.node("src")))
    assert isinstance(reply, Reply)
    assert unpack(reply.codec, reply.data).column("n") == [2, 3, 4]
    assert job.precision is None


def test_a_directory_reads_a_span_within_a_map_of_null_values(tmp_path: Path) -> None:
    """A map column whose values are all null (Arrow's `null` type) is read by span from a
    directory as pyarrow reads it, from within a row group too: rows taken out of a group
    are not retyped as a slice (which Arrow's cast of such a slice gets wrong)."""
    kind = pyarrow.map_(pyarrow.string(), pyarrow.null())
    table = pyarrow.table({"m": pyarrow.array([[("k", None)], None, [("j", None)]] * 4, kind)})
    pyarrow.parquet.write_table(table, tmp_path / "a.parquet", row_group_size=5)
    frame = ParquetDir(tmp_path).forward({"at": 1, "take": 7}, ctx())
    assert frame.column("m") == table.slice(1, 7).column("m").to_pylist()
    frame.to_arrow().validate(full=True)
