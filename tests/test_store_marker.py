"""The marker at a store's root: written whole as a store is made, in every home, so that a
store its upkeep emptied stays a store, a folder that merely holds folders named as a
store's is none, and a store an earlier somatize made (no marker) is marked as it is
opened."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from somatize.cli import main
from somatize.store import BadAddress, BucketStore, LocalStore, Store, StoreError
from somatize.store import local as store_local
from somatize.store._bucket_upkeep import BucketShelf
from somatize.store.base import MARKER, MARKER_DATA, MARKER_PART
from tests.conftest_s3 import s3_options, s3_url
from tests.test_store_cli import _bare_s3

KEY = "blake3:" + "ab" * 32
SECRET = "team secret"

HOMES: dict[str, Callable[[Path], Any]] = {
    "local": lambda tmp: LocalStore(tmp / "store"),
    "local-signed": lambda tmp: LocalStore(tmp / "store", signing_key=SECRET),
    "file": lambda tmp: Store.on_bucket(f"file://{tmp}/store"),
    "s3": lambda tmp: Store.on_bucket(s3_url(), **s3_options()),
    "s3-signed": lambda tmp: Store.on_bucket(s3_url(), signing_key=SECRET, **s3_options()),
}
"""Every home a store is made in; add the next one here."""


def _marker(store: Any) -> bytes | None:
    """What the store's marker holds; None when it has none."""
    if isinstance(store, LocalStore):
        path = store.root / MARKER
        return path.read_bytes() if path.exists() else None
    assert isinstance(store, BucketStore)
    store.fs.invalidate_cache()
    path = f"{store.root}/{MARKER}"
    return bytes(store.fs.cat_file(path)) if store.fs.exists(path) else None


def _where(store: Any) -> str:
    return str(store.root) if isinstance(store, LocalStore) else store.url


@pytest.mark.parametrize("home", HOMES)
def test_a_new_store_is_marked_and_stays_a_store_once_emptied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    """A store writes its marker, whole, as it is made (a directory as it is opened, a
    bucket's prefix, which has no folders, at its first write); its upkeep never removes it,
    so a store whose every answer a gc dropped, its blobs still in their grace (on a bucket
    all that is left is blobs/), is a store still to every command."""
    store = HOMES[home](tmp_path)
    if home.startswith("s3"):
        assert _marker(store) is None  # opened, nothing written: no store made yet
        _bare_s3(monkeypatch, tmp_path, credentials=True)
        if home == "s3-signed":
            monkeypatch.setenv("SOMATIZE_STORE_KEY", SECRET)
    elif home == "local-signed":
        monkeypatch.setenv("SOMATIZE_STORE_KEY", SECRET)
    store.keep(KEY, b"x" * 100, "plain")
    assert _marker(store) == MARKER_DATA
    assert store.gc(max_bytes=0).answers == 1  # the blob is young: it stays
    assert store.verify().ok and store.verify().stray == []
    where = _where(store)
    for command in (["ls"], ["du"], ["verify"], ["verify", "--quarantine"]):
        assert main(["store", *command, "--store", where]) == 0, capsys.readouterr().err
    assert MARKER not in capsys.readouterr().out  # no answer, pack, name nor stray file
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert "removed 1 blobs" in capsys.readouterr().out
    assert _marker(store) == MARKER_DATA
    assert main(["store", "ls", "--store", where]) == 0


@pytest.mark.parametrize("home", ["local", "s3"])
def test_a_users_folder_holding_store_like_folders_is_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    """A folder of a user's own holding blobs/ and quarantine/names/ bears no marker and is
    not clearly a store: it can be listed as an emptied store of an earlier somatize would
    be, but gc and verify --quarantine refuse it (status 2, the store's API a StoreError)
    and neither moves nor removes anything; marked by hand, it is collected as a store."""
    files = {
        f"blobs/ab/{'ab' * 32}": b"not a blob: a file of the user's",
        "blobs/photo.jpg": b"a photo",
        "quarantine/names/notes.txt": b"notes",
    }
    if home == "local":
        root = tmp_path / "mine"
        for name, data in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        where = str(root)

        def left() -> dict[str, bytes]:
            return {
                str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
            }

        opened: Any = LocalStore(root)
    else:
        where = s3_url()
        opened = Store.on_bucket(where, **s3_options())
        for name, data in files.items():
            opened.fs.pipe_file(f"{opened.root}/{name}", data)
        _bare_s3(monkeypatch, tmp_path, credentials=True)

        def left() -> dict[str, bytes]:
            opened.fs.invalidate_cache()
            return {
                p[len(opened.root) + 1 :]: bytes(opened.fs.cat_file(p))
                for p in opened.fs.find(opened.root)
            }

    assert left() == files  # opening it made nothing there
    assert main(["store", "ls", "--store", where]) == 0
    for command in (["gc", "--grace", "0"], ["verify", "--quarantine"]):
        assert main(["store", *command, "--store", where]) == 2
        assert "bears no store's marker" in capsys.readouterr().err
    with pytest.raises(StoreError, match="it may be a folder of yours"):
        opened.gc(grace=0)
    with pytest.raises(StoreError, match=f"creating the file `{MARKER}` at its root"):
        opened.verify(quarantine=True)
    assert left() == files
    if home == "local":
        (root / MARKER).touch()  # marked by hand, as the refusal says
    else:
        opened.fs.pipe_file(f"{opened.root}/{MARKER}", b"")
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert f"blobs/ab/{'ab' * 32}" not in left()


def test_a_folder_holding_other_files_is_no_place_for_a_new_store(tmp_path: Path) -> None:
    """A directory that holds files but no store (no marker, not an earlier store's
    layout) is refused as a store's, as a directory or a ``file://`` bucket, and nothing is
    made there; one missing, empty, or holding only a store's empty folders is a new store."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_bytes(b"a file of the user's")
    (mine / "blobs").mkdir()
    for open_ in (LocalStore, lambda at: Store.on_bucket(f"file://{at}")):
        with pytest.raises(BadAddress, match="holds files but no store"):
            open_(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["blobs", "thesis.tex"]
    half = tmp_path / "half"
    (half / "blobs").mkdir(parents=True)  # a store's making, stopped before its marker
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".DS_Store").write_bytes(b"a file browser's")
    for at in (half, tmp_path / "empty", tmp_path / "missing"):
        assert _marker(LocalStore(at)) == MARKER_DATA
    (tmp_path / "finder").mkdir()
    (tmp_path / "finder" / ".DS_Store").write_bytes(b"a file browser's")
    assert _marker(Store.on_bucket(f"file://{tmp_path / 'finder'}")) == MARKER_DATA
    for kept, open_ in (("local", LocalStore), ("file", OPENERS["file"])):
        repository = tmp_path / f"kept-in-git-{kept}"  # a cache folder a repository keeps
        repository.mkdir()
        (repository / ".gitkeep").write_bytes(b"")
        (repository / ".gitignore").write_bytes(b"*\n")
        assert _marker(open_(repository)) == MARKER_DATA
        assert (repository / ".gitignore").read_bytes() == b"*\n"


OPENERS: dict[str, Callable[[Path], Any]] = {
    "local": LocalStore,
    "file": lambda at: Store.on_bucket(f"file://{at}"),
}
"""The homes a store is made in as it is opened: a directory, by path or file:// URL."""


@pytest.mark.parametrize("home", OPENERS)
@pytest.mark.parametrize("other", OPENERS)
def test_many_processes_opening_a_new_store_at_once_all_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: str, other: str
) -> None:
    """Ranks or workers opening a new store at once: one that found no store there, and
    then found the folder no longer fresh because another made the store in between, opens
    that store rather than refusing it as a folder of the user's. A folder whose tmp/ holds
    only the marker another is writing, there before the marker, is no user's either."""
    at = tmp_path / "store"
    real = {"local": store_local._fresh, "file": BucketShelf._fresh}

    def made_meanwhile(*args: Any) -> bool:  # another process makes the store, and writes
        monkeypatch.setattr(store_local, "_fresh", real["local"])
        monkeypatch.setattr(BucketShelf, "_fresh", real["file"])
        OPENERS[other](at).put(b"written by another process")
        return bool(real[home](*args))

    monkeypatch.setattr(store_local, "_fresh", made_meanwhile)
    monkeypatch.setattr(BucketShelf, "_fresh", made_meanwhile)
    store = OPENERS[home](at)
    assert _marker(store) == MARKER_DATA
    assert (
        bytes(store.get(store.put(b"written by another process"))) == b"written by another process"
    )
    for one, opened in OPENERS.items():  # the other's marker, still in tmp/
        marking = tmp_path / f"marking-{one}"
        (marking / "tmp").mkdir(parents=True)
        (marking / "tmp" / f"123-{'ab' * 16}{MARKER_PART}").write_bytes(MARKER_DATA)
        assert _marker(opened(marking)) == MARKER_DATA


@pytest.mark.parametrize("home", ["local", "file", "s3", "s3-signed"])
def test_a_store_an_earlier_somatize_made_is_marked_and_kept_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    """A store of the earlier layout (blobs/, and answers/, packs/ or names/; no marker) is
    opened, read and written as ever, and marked: a directory as it is opened, a bucket at
    its first write or its first gc; so its upkeep emptying it later leaves it a store."""
    made = HOMES[home](tmp_path)
    made.keep(KEY, b"an earlier answer", "plain")
    made.bind("ds", made.put(b"a dataset"))
    if isinstance(made, LocalStore):
        (made.root / MARKER).unlink()
    else:
        made.fs.rm_file(f"{made.root}/{MARKER}")
    assert _marker(made) is None
    where = _where(made)
    if home.startswith("s3"):
        _bare_s3(monkeypatch, tmp_path, credentials=True)
        if home == "s3-signed":
            monkeypatch.setenv("SOMATIZE_STORE_KEY", SECRET)
        assert main(["store", "ls", "--store", where]) == 0  # read: nothing written
        assert _marker(made) is None
        assert main(["store", "gc", "--store", where, "--max-bytes", "0"]) == 0
        assert _marker(made) == MARKER_DATA
        made.fs.rm_file(f"{made.root}/{MARKER}")
        key = {"signing_key": SECRET} if home == "s3-signed" else {}
        again = Store.on_bucket(where, **key, **s3_options())
        again.keep("blake3:" + "cd" * 32, b"a new answer", "plain")
    else:
        again = LocalStore(where) if home == "local" else Store.on_bucket(where)
        assert bytes(again.recall(KEY)[1]) == b"an earlier answer"
    assert _marker(made) == MARKER_DATA
    assert bytes(again.get(again.resolve("ds"))) == b"a dataset"
    capsys.readouterr()


def test_an_emptied_store_of_an_earlier_somatize_is_read_but_not_collected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory holding no more than what verify moved aside (quarantine/names/), as an
    earlier somatize's store emptied by its upkeep and copied from a bucket is left, is
    read as a store, and never marked nor collected, since a user's folder may hold as
    much; marked by hand, it is looked after as a store."""
    root = tmp_path / "old"
    (root / "quarantine" / "names").mkdir(parents=True)
    (root / "quarantine" / "names" / "ds").write_bytes(b"garbled")
    assert main(["store", "ls", "--store", str(root)]) == 0
    assert main(["store", "verify", "--store", str(root)]) == 0
    assert main(["store", "gc", "--store", str(root)]) == 2
    assert "what verify moves aside" in capsys.readouterr().err
    store = LocalStore(root)
    assert sorted(p.name for p in root.iterdir()) == ["quarantine"]  # nothing made there
    (root / MARKER).write_bytes(b"")
    assert store.gc(grace=0).blobs == 0
    assert main(["store", "gc", "--store", str(root)]) == 0


def test_a_quarantine_that_is_no_bool_is_refused_as_such_before_the_marker_is_looked_at(
    tmp_path: Path,
) -> None:
    """verify(quarantine="no") is refused for its argument where the store bears no marker
    too (an earlier somatize's store emptied by its upkeep), rather than as a store whose
    damaged files would be moved aside, which nobody asked; nothing is made there."""
    root = tmp_path / "old"
    (root / "quarantine" / "names").mkdir(parents=True)
    (root / "quarantine" / "names" / "ds").write_bytes(b"garbled")
    store = LocalStore(root)
    with pytest.raises(TypeError, match=r"quarantine= is True or False, got 'no'"):
        store.verify(quarantine="no")  # type: ignore[arg-type]
    assert sorted(p.name for p in root.iterdir()) == ["quarantine"]


def _untracked(checkout: Path) -> str:
    """What `git status` lists in ``checkout`` as untracked, each file of it."""
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=checkout,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_a_store_made_in_a_git_checkout_is_kept_out_of_it(tmp_path: Path) -> None:
    """A store made inside a project's checkout writes a `.gitignore` of `*` at its root,
    so `git add -A` adds none of its blobs; a `.gitignore` of the user's own, in the
    folder before the store was made there, is left as it is."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    store = LocalStore(tmp_path / "store")
    store.keep(KEY, b"an answer", "plain")
    store.put(b"a blob")
    assert _untracked(tmp_path) == ""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".gitignore").write_text("blobs/\n")
    LocalStore(mine).put(b"a blob")
    assert (mine / ".gitignore").read_text() == "blobs/\n"
    assert (mine / MARKER).read_bytes() == MARKER_DATA


def test_a_store_whose_making_was_killed_is_kept_out_of_git_once_opened(tmp_path: Path) -> None:
    """A process killed (SIGKILL) as it makes a store, the moment its marker is renamed into
    place, leaves a store that is still kept out of git: its `.gitignore` is whole, there
    or written as the store is opened again, never left out or empty for good."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    root = tmp_path / "store"
    script = textwrap.dedent(
        f"""
        import os, signal
        from somatize.store import LocalStore
        replace = os.replace
        def replace_then_die(source, target):
            replace(source, target)
            if os.fspath(target).endswith({MARKER!r}):
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace_then_die
        LocalStore({str(root)!r})
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    died = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    assert died.returncode == -9
    store = LocalStore(root)
    store.keep(KEY, b"an answer", "plain")
    assert _untracked(tmp_path) == ""
    assert (root / ".gitignore").read_text() == store_local.GITIGNORE
