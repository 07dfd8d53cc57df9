"""A local store opened ``read_only=True``: it is read as ever, and writes and removes
nothing — no answer kept, no folder made, no marker written, no file time set — refusing
at once, with the message a read-only bucket gives, what would."""

from __future__ import annotations

import copy
import gc
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from somatize import Graph, Store
from somatize.store import BadAddress, Corrupt, LocalStore, StoreError
from tests.nodes import Largest, Rows, Scale, Square
from tests.test_store_bucket import _HOMES_BEFORE_READ_ONLY, _BeforeReadOnly, _Names

KEY = "blake3:" + "ab" * 32
REFUSED = r"opened with read_only=True.*Nothing was changed; it can still be read"


def _kept_in(root: Path) -> tuple[Graph, Largest]:
    """A graph whose cached node takes the largest of its scaled input, with its answer to
    ``[1.0, 2.0]`` kept in a store at ``root``, and that node (whose calls it counts)."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    writer = Store(root)
    assert g.forward([1.0, 2.0], store=writer) == 4.0
    writer.close()
    return g, largest


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root``, with its size and modification time."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found


def test_a_read_only_local_store_recalls_and_refuses_every_write(tmp_path: Path) -> None:
    """Opened ``read_only=True``, a local store says it is not writable at once, recalls
    what it holds, refuses a forward that would keep an answer before any node runs, and
    refuses each write and removal; nothing under its folder changes, not even the time
    of a record it recalled."""
    root = tmp_path / "store"
    g, largest = _kept_in(root)
    digest = Store(root).put(b"bound")
    before = _tree(root)
    store = Store(root, read_only=True)
    assert isinstance(store, LocalStore)
    assert store.writable() is False
    with pytest.raises(StoreError, match=REFUSED):
        g.forward([1.0, 3.0], store=store)
    assert largest.calls == 1
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert largest.calls == 1
    refusals = {
        "put": lambda s: s.put(b"refused"),
        "keep": lambda s: s.keep(KEY, b"refused", "plain"),
        "keep_many": lambda s: s.keep_many([(KEY, b"refused")], "plain"),
        "open_joined": lambda s: s.open_joined("plain"),
        "bind": lambda s: s.bind("refused", digest),
        "gc": lambda s: s.gc(grace=0),
        "compact": lambda s: s.compact(grace=0),
        "verify": lambda s: s.verify(quarantine=True),
    }
    for what, refused in refusals.items():
        with pytest.raises(StoreError, match="opened with read_only=True"):
            refused(store)
        assert _tree(root) == before, what
    assert store.verify().damaged == []
    store.close()
    del store
    gc.collect()
    assert _tree(root) == before


def _opened_on_bucket(folder: Path, read_only: bool) -> Store:
    return Store.on_bucket(folder.as_uri(), read_only=read_only)


@pytest.mark.parametrize("opened", [Store, _opened_on_bucket], ids=["local", "file-url"])
def test_a_read_only_local_store_makes_no_folder(tmp_path: Path, opened: Any) -> None:
    """A missing folder is refused, not made, whether opened as a local store or by its
    ``file://`` URL: a read-only store at no store is a mistyped path. An empty one is read
    as an empty store, left empty: no folders made in it, no marker written."""
    missing = tmp_path / "missing"
    with pytest.raises(BadAddress, match=r"no directory is there.*without read_only=True"):
        opened(missing, read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    store = opened(empty, read_only=True)
    assert store.answer(KEY) is None
    store.close()
    assert list(empty.iterdir()) == []
    with pytest.raises(BadAddress, match="read_only is True or False"):
        Store(empty, read_only="yes")  # type: ignore[call-arg]


def test_a_read_only_local_store_stays_read_only_in_another_process(tmp_path: Path) -> None:
    """``read_only`` travels in the address another process opens the store from, and in
    its pickle; a store opened without it is not read-only."""
    root = tmp_path / "store"
    Store(root).close()
    store = Store(root, read_only=True)
    address = store.address()
    assert address is not None and address["home"] == "read-only local"
    assert Store.from_address(address).writable() is False
    copied = pickle.loads(pickle.dumps(store))
    assert copied.writable() is False
    assert copy.deepcopy(store).writable() is False
    with pytest.raises(StoreError, match=REFUSED):
        copied.put(b"refused")
    plain = Store(root)
    assert repr(store) == f"Store({str(root)!r}, read_only=True)"
    assert repr(plain) == f"Store({str(root)!r})"
    assert plain.address()["home"] == "local"
    assert Store.from_address(plain.address()).writable() is True
    assert pickle.loads(pickle.dumps(plain)).writable() is True


def test_a_read_only_local_store_is_refused_by_a_somatize_without_read_only(
    tmp_path: Path,
) -> None:
    """A somatize from before ``read_only`` would open a read-only local store's address or
    pickle as its own, its flag unread, and write to it: both name what it lacks, so it
    refuses them."""
    root = tmp_path / "store"
    plain = pickle.dumps(Store(root))
    address = Store(root, read_only=True).address()
    assert address["home"] not in _HOMES_BEFORE_READ_ONLY
    flagged = {**address, "home": "local", "read_only": True}  # as a user may write it
    assert Store.from_address(flagged).writable() is False
    with pytest.raises(BadAddress, match="`read_only` as a bool"):
        Store.from_address({**flagged, "read_only": "yes"})
    noted = _Names(plain)
    noted.load()
    with pytest.raises(AttributeError, match="read_only"):
        _BeforeReadOnly(pickle.dumps(Store(root, read_only=True)), noted.names).load()
    assert _BeforeReadOnly(plain, noted.names).load().writable() is True


def test_a_read_only_local_store_leaves_a_damaged_blob_in_place(tmp_path: Path) -> None:
    """A blob found damaged as it is read is Corrupt, and stays where it is: a read-only
    store moves nothing to quarantine/."""
    root = tmp_path / "store"
    digest = Store(root).put(b"whole bytes")
    blob = Store(root).blob_path(digest)
    blob.write_bytes(b"other bytes")
    store = Store(root, read_only=True)
    with pytest.raises(Corrupt, match=r"could not be moved to quarantine/.*read_only=True"):
        store.get(digest)
    assert blob.read_bytes() == b"other bytes"
    assert not (root / "quarantine").exists()


def test_a_read_only_local_store_holds_fewer_attributes_than_objects_share(
    tmp_path: Path,
) -> None:
    """Read-only, a store that recalled, was refused a keep and was closed still holds
    fewer than 30 attributes (see tests/test_engine.py); one opened writable holds no
    ``read_only`` of its own."""
    root = tmp_path / "store"
    g, _ = _kept_in(root)
    assert "read_only" not in vars(Store(root))
    store = Store(root, read_only=True)
    g.forward([1.0, 2.0], store=store)
    with pytest.raises(StoreError):
        g.forward([1.0, 3.0], store=store)
    store.close()
    assert len(vars(store)) < 30, sorted(vars(store))


def test_a_read_only_local_store_refusing_a_mapped_node_says_it_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mapped node reading a computed list, some of whose items a read-only store lacks,
    is refused before it runs; what the forward says (to ``watching=`` and its record)
    ends with that node refused, as a keep the store refuses ends, not with its items
    read as if the rest were to follow."""
    root = tmp_path / "store"
    square = Square().named("square").frozen().mapped().cached()
    g = Graph.somatize(Rows().named("rows").frozen() >> square)
    span = {"at": 0, "take": 4}
    assert g.forward(span, store=Store(root)) == [0, 1, 4, 9]
    store = Store(root, read_only=True)
    held = store.have
    # One item fewer than were kept: as a store another process collected one from.
    monkeypatch.setattr(store, "have", lambda keys: set(sorted(held(keys))[1:]))
    seen: list[dict[str, object]] = []
    with pytest.raises(StoreError, match=REFUSED):
        g.forward(span, store=store, watching=seen.append)
    assert square.calls == [[0, 1, 2, 3]]
    assert seen[-1] == {"fact": "failed", "node": "square", "error": "refused"}
    assert g.record.facts[-1] == seen[-1]
