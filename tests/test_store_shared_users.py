"""One local store shared by several users of one machine (a lab's cache folder, a group
with umask 002): each user's process is a child switched to that user, so these tests
need root to run, and are skipped without it."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from somatize.store import LocalStore, Store

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or os.geteuid() != 0,
    reason="switching to another user takes root (os.setuid in a forked child)",
)

LAB = 40_000
"""The group the store's users share."""
FIRST, SECOND = 40_001, 40_002
"""Two users of that group."""


def key_of(number: int) -> str:
    return f"blake3:{number:064x}"


def as_user(user: int, work: Callable[..., Any], *args: Any, umask: int = 0o002) -> Any:
    """What ``work(*args)`` returns in a forked child running as ``user`` of the group
    :data:`LAB`, with ``umask``; the child's error is raised here as an AssertionError."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        os.close(reading)
        try:
            os.setgroups([LAB])
            os.setgid(LAB)
            os.setuid(user)
            os.umask(umask)
            result: tuple[bool, Any] = (True, work(*args))
        except BaseException as why:
            result = (False, f"{type(why).__name__}: {why}")
        with os.fdopen(writing, "wb") as out:
            out.write(pickle.dumps(result))
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as into:
        done, result = pickle.loads(into.read())
    os.waitpid(child, 0)
    assert done, f"as user {user}: {result}"
    return result


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder of the group :data:`LAB`, which its members may write and new files in
    which take its group (setgid), as a lab's shared cache folder is set up; a store in
    it is ``shared / "store"``."""
    folder = Path(tempfile.mkdtemp(prefix="somatize-shared-"))
    os.chmod(folder, 0o755)  # made 0o700; others may pass through to the store
    (folder / "lab").mkdir()
    os.chown(folder / "lab", FIRST, LAB)
    os.chmod(folder / "lab", 0o2775)
    yield folder / "lab"
    shutil.rmtree(folder)


def _keep(root: Path, numbers: list[int]) -> None:
    store = LocalStore(root)
    for number in numbers:
        store.keep(key_of(number), bytes([number]) * 1_000, "plain")


def _recall(root: Path, number: int) -> None:
    store = LocalStore(root)
    assert bytes(store.recall(key_of(number))[1]) == bytes([number]) * 1_000
    store.close()  # writes down when it was used


def _collect(root: Path, max_bytes: int) -> list[str]:
    store = LocalStore(root)
    store.gc(max_bytes=max_bytes, grace=0)
    return sorted(store.have([key_of(number) for number in range(4)]))


def test_a_use_by_another_member_of_the_group_spares_an_answer_from_gc(shared: Path) -> None:
    """A user may set a file's time to one of their choosing only on a file they own, so
    a store shared by a group wrote down no use by one user of an answer another kept: a
    gc with max_bytes dropped the answer the group recalled all day, taken for unused
    since its owner last used it, and kept one nobody used. Such a use is written down as
    the time now, which any user who may write the file may set."""
    root = shared / "store"
    as_user(FIRST, _keep, root, [0, 1, 2, 3])
    an_hour_ago = time.time() - 3_600
    for number in range(4):  # kept an hour ago, the oldest first
        when = an_hour_ago + number
        os.utime(LocalStore(root).answer_path(key_of(number)), (when, when))
    as_user(SECOND, _recall, root, 0)
    assert as_user(FIRST, _collect, root, 2_000) == [key_of(0)]


def _read_every_file(root: Path) -> int:
    """How many files under ``root`` this user read, as a copy of it (``cp -r``) would."""
    read = 0
    for folder, _, names in os.walk(root):
        for name in names:
            (Path(folder) / name).read_bytes()
            read += 1
    return read


def test_every_file_a_store_makes_is_readable_by_its_group(shared: Path) -> None:
    """The store's marker was made readable by its maker alone, whatever the umask, so
    another member of the group could not copy a store the group shares."""
    root = shared / "store"
    as_user(FIRST, _keep, root, [1])
    assert as_user(SECOND, _read_every_file, root) == 4  # marker, .gitignore, record, blob


def _through_cache(bucket: str, cache: Path, number: int) -> bytes:
    """Keeps an answer in the bucket at ``bucket`` through the cache folder ``cache``, and
    recalls the one the first user kept."""
    store = Store.on_bucket(bucket, cache=cache)
    store.keep(key_of(number), bytes([number]) * 1_000, "plain")
    return bytes(store.recall(key_of(1))[1])


def test_a_cache_folder_shared_by_a_group_serves_each_member(shared: Path, tmp_path: Path) -> None:
    """The file that binds a bucket store's cache folder to its bucket was readable by the
    user who made it alone, so every other member of the group sharing that folder was
    refused the store (StoreError: cannot read it)."""
    Store.on_bucket(f"file://{tmp_path / 'warm'}").put(b"")  # loads fsspec as root
    bucket = f"file://{shared / 'bucket'}"
    assert as_user(FIRST, _through_cache, bucket, shared / "cache", 1) == bytes([1]) * 1_000
    assert as_user(SECOND, _through_cache, bucket, shared / "cache", 2) == bytes([1]) * 1_000
