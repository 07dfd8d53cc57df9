"""The digest of somatize's source files a Ray worker is compared by, besides its version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from somatize.broker.ray import _source, source_digest

HERE = Path(__file__).resolve().parent.parent / "somatize"


def _copy(where: Path) -> Path:
    """A copy of the somatize package's source files under ``where``."""
    copied = where / "somatize"
    shutil.copytree(HERE, copied, ignore=shutil.ignore_patterns("__pycache__"))
    return copied


def test_the_same_files_anywhere_have_one_digest(tmp_path: Path) -> None:
    """Two copies of the same files, in two places, have the digest of the package here."""
    one, other = _copy(tmp_path / "one"), _copy(tmp_path / "other")
    assert source_digest([("somatize", one)]) == source_digest([("somatize", other)])
    assert source_digest([("somatize", one)]) == source_digest([("somatize", HERE)])


def test_a_file_edited_added_removed_or_moved_changes_the_digest(tmp_path: Path) -> None:
    """Every change a copy of the same version can carry gives another digest."""
    copied = _copy(tmp_path)
    digests = {source_digest([("somatize", copied)])}
    (copied / "plan.py").write_text((copied / "plan.py").read_text() + "# edited\n")
    digests.add(source_digest([("somatize", copied)]))
    (copied / "extra.py").write_text("")
    digests.add(source_digest([("somatize", copied)]))
    (copied / "extra.py").rename(copied / "broker" / "extra.py")
    digests.add(source_digest([("somatize", copied)]))
    (copied / "broker" / "extra.py").unlink()
    digests.add(source_digest([("somatize", copied)]))  # back to the edit alone: seen
    assert len(digests) == 4


def test_this_process_digests_the_somatize_it_imported() -> None:
    """The digest this process compares a worker by is the one of the files it imported."""
    import somatize
    import somatize_torch

    imported = [
        ("somatize", Path(somatize.__file__).parent),
        ("somatize_torch", Path(somatize_torch.__file__).parent),
    ]
    assert _source() == source_digest(imported)


def test_a_worker_is_compared_by_its_source_where_both_sides_could_read_theirs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker of this version is the same somatize when its source digest is this
    process's, and another when it differs; where either side has no ``.py`` file of
    somatize to read (an installation shipped compiled), the version alone decides, as a
    worker shipped so is not refused for what it cannot show. Another version never is."""
    import somatize
    from somatize.broker import ray as ray_broker

    version, here = somatize.__version__, _source()
    assert source_digest([("somatize", tmp_path)]) is None  # no .py file there
    assert ray_broker._same_somatize(f"{version} {here}")
    assert not ray_broker._same_somatize(f"{version} blake3:{'0' * 64}")
    assert ray_broker._same_somatize(f"{version} unread")
    assert not ray_broker._same_somatize(f"0.0.0-other {here}")
    monkeypatch.setattr(ray_broker, "_source", lambda: "unread")
    assert ray_broker._same_somatize(f"{version} blake3:{'0' * 64}")


def test_a_worker_saying_no_digest_is_refused_naming_its_version_and_source() -> None:
    """A worker that says its version and no digest (it runs code from before digests were
    compared) is told apart, and the refusal names the version once and says the digest
    was not said."""
    import somatize
    from somatize.broker import ray as ray_broker

    version = somatize.__version__
    assert not ray_broker._same_somatize(version)
    refusal = str(ray_broker._other_version("scale", "w1", version))
    assert f"runs somatize {version} as this process does" in refusal
    assert "digest there is not said" in refusal
