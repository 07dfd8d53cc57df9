"""The store contract, for every home of the store.

Each implementation in STORES must pass every test here; a new home (a bucket, a
cache in front of one) joins by adding a factory to the list.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from somatize import BadName, Corrupt, Missing, NameNotFound, Store
from somatize.store import LocalStore

Factory = Callable[[Path], Store]

STORES: list[tuple[str, Factory]] = [
    ("local", lambda where: Store(where / "local")),
    ("local-durable", lambda where: LocalStore(where / "durable", durable=True)),
]


@pytest.fixture(params=[factory for _, factory in STORES], ids=[name for name, _ in STORES])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    factory: Factory = request.param
    return factory(tmp_path)


KEY = "blake3:" + "ab" * 32


def test_put_get_roundtrip(home: Store) -> None:
    """A blob comes back as it was put, named by the BLAKE3 of its bytes."""
    digest = home.put(b"hello")
    assert digest == "blake3:ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f"
    assert bytes(home.get(digest)) == b"hello"
    assert home.has_blob(digest)


def test_put_is_idempotent(home: Store) -> None:
    """Putting the same bytes twice gives one digest and changes nothing."""
    assert home.put(b"x" * 100_000) == home.put([b"x" * 50_000, b"x" * 50_000])


def test_bind_and_resolve(home: Store) -> None:
    """A name points at a digest, and rebinding moves it."""
    one, two = home.put(b"one"), home.put(b"two")
    home.bind("sms/train", one)
    assert home.resolve("sms/train") == one
    home.bind("sms/train", two)
    assert home.resolve("sms/train") == two


def test_unknown_name(home: Store) -> None:
    """Resolving a name nobody bound says how to bind it."""
    with pytest.raises(NameNotFound, match="nothing is bound to `sms/test`"):
        home.resolve("sms/test")


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "../up", "a/../b", "a//b", ".hidden", "a b", "tab\there", "x\x00"]
)
def test_bad_names_refused(home: Store, name: str) -> None:
    """Names that could escape the store or hide in it are refused."""
    digest = home.put(b"x")
    with pytest.raises(BadName):
        home.bind(name, digest)


def test_bad_digest_refused(home: Store) -> None:
    """A digest that is not blake3:<64 hex> is refused before any path is built."""
    with pytest.raises(BadName, match="is not a digest"):
        home.get("blake3:../../etc")


def test_keep_recall_have(home: Store) -> None:
    """A kept answer is had and recalled with its record."""
    assert home.have([KEY]) == set()
    answer = home.keep(KEY, [b"ab", b"cd"], "plain", "sha256:f")
    assert (answer.size, answer.codec, answer.fingerprint) == (4, "plain", "sha256:f")
    assert home.have([KEY, "blake3:" + "cd" * 32]) == {KEY}
    record, data = home.recall(KEY)
    assert bytes(data) == b"abcd" and record.value == answer.value


def test_recall_missing(home: Store) -> None:
    """Recalling what was never kept is Missing."""
    with pytest.raises(Missing):
        home.recall(KEY)


def test_large_blob_roundtrip(home: Store) -> None:
    """A blob above the memory-map threshold comes back intact."""
    data = bytes(range(256)) * 4096
    digest = home.put(data)
    assert bytes(home.get(digest)) == data


def test_truncated_blob_is_not_had(home: Store, tmp_path: Path) -> None:
    """An answer whose blob lost bytes is not had, and recalling it is Corrupt, never short."""
    answer = home.keep(KEY, b"x" * 1000, "plain")
    assert isinstance(home, LocalStore)
    path = home.blob_path(answer.value)
    path.write_bytes(b"x" * 10)
    fresh = type(home)(home.root)
    assert fresh.have([KEY]) == set()
    with pytest.raises(Corrupt):
        fresh.recall(KEY)


def test_damaged_record_is_not_had(home: Store) -> None:
    """An answer record that cannot be read is not had."""
    home.keep(KEY, b"abc", "plain")
    assert isinstance(home, LocalStore)
    record = home.root / "answers" / KEY[7:9] / KEY[7:]
    record.write_bytes(b'{"somatize": 1, "key": ')
    assert type(home)(home.root).have([KEY]) == set()
