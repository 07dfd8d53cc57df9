"""The digest of somatize's source files a Ray worker is compared by, besides its version."""

from __future__ import annotations

import shutil
from pathlib import Path

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
