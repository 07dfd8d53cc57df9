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
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from somatize.store import LocalStore, StoreError
from somatize.store._packed import digest_of

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
