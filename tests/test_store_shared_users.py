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

from somatize.store import LocalStore

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
