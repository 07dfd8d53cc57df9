"""What a local store says when a file or folder of it cannot be used: one this process
may not search or read (another user's, made with umask 077), or a file where a folder
should be. Never success without a write, never a raw OSError: a StoreError naming the
file, and nothing published that refers to what is not there.

Tests run as root, which may search and read every folder: a permission refused is
simulated by making ``os.stat``, ``os.utime`` and ``os.open`` refuse the paths under one
folder of the store, as the system does for another user's folder.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from somatize.store import LocalStore, StoreError
from somatize.store._packed import digest_of
from somatize.store.base import JoinedWrite
from tests.forked import answer_of, forked, in_forked_child, needs_fork

DATA = b"bytes this store cannot write"
KEY = "blake3:" + "ab" * 32


def _refusing(monkeypatch: pytest.MonkeyPatch, folder: Path, calls: tuple[str, ...]) -> None:
    """Makes the ``os`` functions named in ``calls`` refuse every path under ``folder``
    with EACCES, as for a folder of another user this process may not search."""
    inside = f"{folder}{os.sep}"

    def refuse(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(inside):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            return real(path, *args, **kwargs)

        return call

    for name in calls:
        monkeypatch.setattr(os, name, refuse(getattr(os, name)))


def _shard_of(store: LocalStore, digest: str) -> Path:
    return store.blob_path(digest).parent


def _blob_shard_is_a_file(store: LocalStore, digest: str, _: pytest.MonkeyPatch) -> None:
    """Puts a regular file where the folder of blob ``digest`` belongs (damage, a sync)."""
    shard = _shard_of(store, digest)
    shutil.rmtree(shard, ignore_errors=True)
    shard.write_bytes(b"junk")


def _blob_shard_is_unsearchable(
    store: LocalStore, digest: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = _shard_of(store, digest)
    shard.mkdir(parents=True, exist_ok=True)
    _refusing(monkeypatch, shard, ("stat", "utime", "open"))


SHARDS = {"a file": _blob_shard_is_a_file, "unsearchable": _blob_shard_is_unsearchable}


@pytest.mark.parametrize("shard", list(SHARDS))
def test_put_keep_and_bind_where_a_blob_cannot_be_looked_at_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard: str
) -> None:
    """Where the folder a blob goes in cannot be searched, or is a file, put and keep say
    StoreError and publish no record, and bind binds no name, rather than taking the
    blob for kept (a record or name pointing at nothing)."""
    store = LocalStore(tmp_path / "store")
    digest = digest_of([DATA])
    SHARDS[shard](store, digest, monkeypatch)
    with pytest.raises(StoreError, match="could not write blobs/"):
        store.put(DATA)
    with pytest.raises(StoreError, match="could not write blobs/"):
        store.keep(KEY, DATA, "plain")
    assert not store.answer_path(KEY).exists()
    with pytest.raises(StoreError, match="cannot read blobs/"):
        store.bind("ds/v1", digest)
    assert not (store.root / "names" / "ds" / "v1").exists()
    assert os.listdir(store.root / "tmp") == []


def _a_store_with_everything(root: Path) -> tuple[LocalStore, list[str], str]:
    """A store holding an answer alone, two packed, and a name; its keys, and the digest
    of the named blob."""
    store = LocalStore(root)
    keys = [f"blake3:{i:064x}" for i in range(1, 4)]
    store.keep(keys[0], b"one" * 10, "plain")
    store.keep_many([(keys[1], b"two"), (keys[2], b"three")], "plain")
    named = store.put(b"dataset")
    store.bind("ds/v1", named)
    return store, keys, named


def test_a_blob_or_name_this_process_may_not_read_is_a_store_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob or name of another user (0600) is a StoreError saying which file, that
    nothing was changed and who may read it, from every read; recall_many hands it back
    per key, as it does Missing and Corrupt, rather than raising for the whole batch."""
    _, keys, named = _a_store_with_everything(tmp_path / "store")
    _refusing(monkeypatch, tmp_path / "store" / "blobs", ("open",))
    _refusing(monkeypatch, tmp_path / "store" / "names", ("open",))
    fresh = LocalStore(tmp_path / "store")
    assert fresh.have(keys) == set(keys)  # here: only reading them is refused
    unreadable = r"cannot read blobs/\w\w/\w{64} in .*Permission denied.*nothing was removed"
    for read in (
        lambda: fresh.recall(keys[0]),
        lambda: fresh.recall(keys[1]),
        lambda: fresh.get(named),
        lambda: fresh.open_blob(named),
    ):
        with pytest.raises(StoreError, match=unreadable):
            read()
    got = fresh.recall_many(keys)
    assert all(isinstance(got[key], StoreError) for key in keys)
    with pytest.raises(StoreError, match=r"cannot read names/ds/v1 in .*may read every file"):
        fresh.resolve("ds/v1")
    assert fresh.have(keys) == set(keys)  # nothing was forgotten or set aside
    assert not (tmp_path / "store" / "quarantine").exists()


@pytest.mark.parametrize(
    ("under", "call", "said"),
    [
        ("", "listdir", r"cannot read packs in "),
        ("packs", "open", r"cannot read packs/\w{64} in "),
        ("answers", "listdir", r"cannot read answers/00 in "),
    ],
    ids=["pack folder", "pack index", "answer folder"],
)
def test_packs_and_records_that_cannot_be_listed_or_read_are_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under: str, call: str, said: str
) -> None:
    """Where the packs folder cannot be listed, a pack's index cannot be read, or the
    folder of records of packed keys cannot be listed (another user's), a fresh store's
    have and recall say StoreError naming it, never a raw PermissionError, and take
    nothing for gone: once it may, it finds every answer, though the packs folder did
    not change since (its time an hour old, which a look takes as listed already)."""
    _, keys, _ = _a_store_with_everything(tmp_path / "store")
    hour_ago = time.time() - 3600
    os.utime(tmp_path / "store" / "packs", (hour_ago, hour_ago))
    with monkeypatch.context() as refused:
        _refusing(refused, tmp_path / "store" / under if under else tmp_path / "store", (call,))
        fresh = LocalStore(tmp_path / "store")
        for read in (lambda: fresh.have(keys), lambda: fresh.recall(keys[1])):
            with pytest.raises(StoreError, match=said + r".*Permission denied.*nothing was"):
                read()
    assert fresh.have(keys) == set(keys)
    assert bytes(fresh.recall(keys[1])[1]) == b"two"
    assert not (tmp_path / "store" / "quarantine").exists()


def test_have_where_a_blob_cannot_be_looked_at_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where whether a blob is here cannot be told (its folder another user's, or a file
    where the folder should be), have says StoreError naming it, never a raw OSError."""
    store, keys, _ = _a_store_with_everything(tmp_path / "store")
    digest = store.answer(keys[0]).value  # type: ignore[union-attr]
    _blob_shard_is_a_file(store, digest, monkeypatch)
    fresh = LocalStore(tmp_path / "store")
    with pytest.raises(StoreError, match=r"cannot read blobs/.*Not a directory"):
        fresh.have([keys[0]])
    with pytest.raises(StoreError, match=r"cannot read blobs/.*Not a directory"):
        fresh.recall(keys[0])


def test_a_forward_over_an_unreadable_answer_says_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward whose kept answer this process may not read fails with StoreError naming
    the file, as for a record it may not read, not with a raw PermissionError."""
    from somatize import Graph, Store
    from tests.nodes import Scale

    graph = Graph.somatize(Scale(3.0).named("s").frozen().cached())
    assert graph.forward([1.0, 2.0], store=Store(tmp_path / "store")) == [3.0, 6.0]
    _refusing(monkeypatch, tmp_path / "store" / "blobs", ("open",))
    with pytest.raises(StoreError, match="cannot read blobs/"):
        graph.forward([1.0, 2.0], store=Store(tmp_path / "store"))


@pytest.mark.parametrize("size", [100, 3_000_000], ids=["read", "read while hashed"])
def test_a_forward_whose_kept_answer_fails_as_it_is_read_says_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A kept answer whose blob opens but fails as it is read (an I/O error of the disk)
    is a StoreError naming the blob, as one this process may not open is, not a raw
    OSError."""
    from somatize import Graph, Store
    from somatize.store import local
    from tests.nodes import Scale

    graph = Graph.somatize(Scale(3.0).named("s").frozen().cached())
    x = [1.0] * (size // 8)
    assert graph.forward(x, store=Store(tmp_path / "store")) == [3.0] * len(x)

    def failing(*_: object) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    for reading in ("_read_open", "_read_privately", "hash_read"):
        monkeypatch.setattr(local, reading, failing)
    with pytest.raises(StoreError, match=r"cannot read blobs/.*Input/output error"):
        graph.forward(x, store=Store(tmp_path / "store"))


def test_a_blob_cut_short_as_it_is_hashed_is_corrupt_not_a_failing_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob that ends before its size as it is hashed (cut short by another writer) is
    Corrupt, which callers set aside and compute again, not taken for a disk failing as it
    is read."""
    from somatize.store import Corrupt, local

    digest = LocalStore(tmp_path / "store").put(b"x" * 100_000)
    monkeypatch.setattr(local, "hash_read", lambda *_: None)
    with pytest.raises(Corrupt, match="ended before its 100000 bytes as it was hashed"):
        LocalStore(tmp_path / "store").local_blob(digest)


@pytest.mark.parametrize("how", ["moved", "removed"])
def test_a_store_whose_directory_is_gone_refuses_writes_and_makes_it_nowhere(
    tmp_path: Path, how: str
) -> None:
    """A store object whose directory was moved or removed after it was opened does not
    make the directory again, part by part, for its next write (a store nobody meant,
    holding what was meant for the one moved): put, keep and bind are a StoreError
    saying the directory is gone, and nothing is made where it was."""
    root = tmp_path / "store"
    store = LocalStore(root)
    named = store.put(b"a dataset")
    if how == "moved":
        root.rename(tmp_path / "elsewhere")
    else:
        shutil.rmtree(root)
    calls: list[Callable[[], object]] = [
        lambda: store.put(DATA),
        lambda: store.put(DATA * 30_000),  # large: written to tmp/ while it is hashed
        lambda: store.keep(KEY, DATA, "plain"),
        lambda: store.keep_many([(KEY, DATA)], "plain"),
        lambda: store.bind("sms/train", named),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="is gone"):
            call()
        assert not root.exists()


@pytest.mark.parametrize("how", ["moved", "removed"])
def test_a_store_whose_directory_is_gone_is_not_writable(tmp_path: Path, how: str) -> None:
    """writable() of a store object whose directory was moved or removed after it was
    opened is False, as every write to it is refused (a callback checking it up front
    refuses the store then, not after an epoch of work), and makes nothing where it was."""
    root = tmp_path / "store"
    store = LocalStore(root)
    assert store.writable()
    if how == "moved":
        root.rename(tmp_path / "elsewhere")
    else:
        shutil.rmtree(root)
    assert not store.writable()
    assert not root.exists()


def test_a_joined_write_let_go_of_unclosed_removes_its_file_and_says_so(tmp_path: Path) -> None:
    """A joined write dropped with neither a close nor an abort leaves no file open and no
    pack in ``tmp/`` (which a gc would leave be while it is claimed), and a ResourceWarning
    says that what was added is not kept, as Python says of a file left open."""
    store = LocalStore(tmp_path / "store")
    key = "blake3:" + "ab" * 32
    joined = store.open_joined("plain")
    joined.add([key], b"abc", [3])
    assert list((tmp_path / "store" / "tmp").iterdir())  # the pack is being written there
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del joined
        gc.collect()
    said = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(said) == 1
    assert "joined write" in said[0] and "not kept" in said[0]
    assert list((tmp_path / "store" / "tmp").iterdir()) == []
    assert store.have([key]) == set()


_INHERITED: list[object] = []
"""What a forked child is handed by being forked: its parent's joined write in progress."""


def _let_go_of_inherited() -> bool:
    """In a forked child: lets go of the joined write its parent is still writing."""
    _INHERITED.clear()
    gc.collect()
    return True


@needs_fork
def test_a_forked_child_letting_go_of_its_parent_s_joined_write_leaves_it_be(
    tmp_path: Path,
) -> None:
    """A child forked while its parent writes a joined write (a DataLoader worker forked
    as the writer thread gathers) that lets go of its copy removes nothing: the pack in
    ``tmp/`` is the parent's, which the parent's close still publishes."""
    store = LocalStore(tmp_path / "store")
    keys = ["blake3:" + "ab" * 32, "blake3:" + "cd" * 32]
    # Held only where the child lets go of it: a name in this frame would hold it there.
    _INHERITED.append(store.open_joined("plain"))
    try:
        # Larger than the file's buffer, so written through as it is added: the child's
        # copy of the file holds none of it unwritten.
        data = os.urandom(1 << 17)
        _INHERITED[0].add(keys, data, [1 << 16, 1 << 16])  # type: ignore[attr-defined]
        assert in_forked_child(_let_go_of_inherited)
        joined = _INHERITED.pop()
    finally:
        _INHERITED.clear()
    assert isinstance(joined, JoinedWrite)
    assert list((tmp_path / "store" / "tmp").iterdir())  # still being written
    joined.close()
    assert store.have(keys) == set(keys)


def _child_drops_inherited() -> str:
    """In a forked child: drops its copy of the parent's joined write, as an exiting
    child's finalizers (``sys.exit``) do; its unwritten bytes go with it."""
    _INHERITED.clear()
    gc.collect()
    return "done"


def _child_aborts_inherited() -> str:
    """In a forked child: aborts its copy of the parent's joined write, as a ``with`` block
    left by ``sys.exit`` does."""
    joined = _INHERITED.pop()
    assert isinstance(joined, JoinedWrite)
    joined.abort()
    return "done"


@needs_fork
@pytest.mark.parametrize("child", [_child_drops_inherited, _child_aborts_inherited])
def test_a_forked_child_writes_nothing_of_its_parent_s_joined_write_still_unwritten(
    tmp_path: Path, child: Callable[[], str]
) -> None:
    """A child forked while its parent's joined write holds bytes not yet written to its
    file neither writes them into that file nor removes it, whether it lets go of its copy
    or aborts it: the parent's close keeps every answer as added."""
    store = LocalStore(tmp_path / "store")
    first = ["blake3:" + "ab" * 32, "blake3:" + "cd" * 32]
    second = ["blake3:" + "ef" * 32, "blake3:" + "12" * 32]
    data = [os.urandom(100) for _ in range(4)]
    _INHERITED.append(store.open_joined("plain"))
    try:
        _INHERITED[0].add(first, b"".join(data[:2]), [100, 100])  # type: ignore[attr-defined]
        assert answer_of(*forked(child)) == "done"
        joined = _INHERITED[0]
    finally:
        _INHERITED.clear()
    assert isinstance(joined, JoinedWrite)
    joined.add(second, b"".join(data[2:]), [100, 100])
    joined.close()
    assert [bytes(store.recall(key)[1]) for key in first + second] == data


def _child_writes_its_own() -> str:
    """In a forked child: a joined write of its own to the store it inherited, closed."""
    (store,) = _INHERITED
    assert isinstance(store, LocalStore)
    keys = ["blake3:" + "34" * 32, "blake3:" + "56" * 32]
    with store.open_joined("plain") as joined:
        joined.add(keys, b"x" * 100 + b"y" * 100, [100, 100])
    return "kept" if store.have(keys) == set(keys) else "not kept"


@needs_fork
def test_a_forked_child_s_own_joined_write_is_kept(tmp_path: Path) -> None:
    """A child forked from a process holding a store keeps a joined write of its own."""
    store = LocalStore(tmp_path / "store")
    _INHERITED.append(store)
    try:
        assert answer_of(*forked(_child_writes_its_own)) == "kept"
    finally:
        _INHERITED.clear()
    assert store.have(["blake3:" + "34" * 32]) == {"blake3:" + "34" * 32}
