"""The `somatize store` command line: human sizes, clear exit codes, and the same upkeep."""

from __future__ import annotations

import builtins
import errno
import io
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from somatize.cli import main, parse_size, size_of
from somatize.store import LocalStore, Store, StoreError
from tests.conftest_s3 import s3_options, s3_url
from tests.test_store_upkeep import _damaged_name, _held, _plant

KEY = "blake3:" + "ab" * 32
REPO = Path(__file__).resolve().parent.parent


def _store(tmp_path: Path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    store.keep(KEY, b"x" * 3000, "plain")
    store.bind("sms/train", store.put(b"rows"))
    return store


def test_sizes_read_and_written_in_human_units() -> None:
    """Sizes print in binary units and parse with or without them."""
    assert size_of(3 * 1024 * 1024) == "3.0 MiB"
    assert size_of(12) == "12 B"
    assert parse_size("1.5K") == 1536 and parse_size("10GiB") == 10 << 30
    assert parse_size("700") == 700


@pytest.mark.parametrize(
    ("count", "printed"),
    [
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        ((1 << 20) - 50, "1.0 MiB"),
        ((1 << 20) - 1, "1.0 MiB"),
        (1 << 20, "1.0 MiB"),
        ((1 << 30) - 1, "1.0 GiB"),
        ((1 << 40) - 1, "1.0 TiB"),
        (5000 << 40, "5000.0 TiB"),
    ],
)
def test_a_size_that_rounds_up_to_the_next_unit_is_printed_in_it(count: int, printed: str) -> None:
    """A size just under a unit is printed in it once rounding reaches it: 1 MiB less a byte
    is `1.0 MiB`, never `1024.0 KiB`."""
    assert size_of(count) == printed


def test_ls_du_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ls lists the answer and the name; du sums sections; show prints a record and a name."""
    store = _store(tmp_path)
    where = str(store.root)
    assert main(["store", "ls", "--store", where]) == 0
    listed = capsys.readouterr().out
    assert KEY in listed and "sms/train" in listed
    assert main(["store", "du", "--store", where]) == 0
    assert "2.9 KiB" in capsys.readouterr().out
    assert main(["store", "show", KEY, "--store", where]) == 0
    assert "bytes    3000 (2.9 KiB)" in capsys.readouterr().out
    assert main(["store", "show", "sms/train", "--store", where]) == 0
    assert "sms/train → blake3:" in capsys.readouterr().out


def test_show_says_a_damaged_or_missing_blob_is_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """show of a blob, of an answer and of a name says when the blob is damaged (its
    bytes hash to another digest, even at the size it had) or missing, with status 1, as
    verify would: a whole one is shown with status 0 and nothing said of it."""
    store = _store(tmp_path)
    where = str(store.root)
    answer = store.answer(KEY)
    assert answer is not None
    named = store.resolve("sms/train")
    for shown in (KEY, answer.value, "sms/train", named):
        assert main(["store", "show", shown, "--store", where]) == 0, shown
        assert "DAMAGED" not in capsys.readouterr().out
    store.blob_path(answer.value).write_bytes(b"y" * 3000)
    for shown in (KEY, answer.value):
        assert main(["store", "show", shown, "--store", where]) == 1, shown
        printed = capsys.readouterr().out
        assert f"{answer.value}" in printed and "DAMAGED: its bytes hash to blake3:" in printed
        assert "store verify --quarantine" in printed
    store.blob_path(named).unlink()
    assert main(["store", "show", "sms/train", "--store", where]) == 1
    assert f"sms/train → {named}  MISSING" in capsys.readouterr().out


def test_verify_exit_status_says_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify exits 0 on a healthy store and 1, naming the file, on a damaged one."""
    store = _store(tmp_path)
    where = str(store.root)
    assert main(["store", "verify", "--store", where]) == 0
    answer = store.answer(KEY)
    assert answer is not None
    store.blob_path(answer.value).write_bytes(b"y" * 3000)
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 1
    assert f"DAMAGED blobs/{answer.value[7:9]}/{answer.value[7:]}" in capsys.readouterr().out
    assert main(["store", "verify", "--store", where]) == 0


def test_gc_frees_what_it_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gc --max-bytes 100 drops the 3000-byte answer and keeps the named blob."""
    store = _store(tmp_path)
    assert (
        main(["store", "gc", "--store", str(store.root), "--max-bytes", "100", "--grace", "0"]) == 0
    )
    assert "dropped 1 answers" in capsys.readouterr().out
    fresh = LocalStore(store.root)
    assert fresh.have([KEY]) == set()
    assert bytes(fresh.get(fresh.resolve("sms/train"))) == b"rows"


def test_gc_counts_what_grace_leaves_as_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc --max-bytes 0 within the grace drops the records but leaves their young blobs on
    disk: what it prints as kept counts them, and says grace left them, never `0 B kept`."""
    store = LocalStore(tmp_path / "store")
    for i in range(3):
        store.keep(f"blake3:{i:064x}", bytes(100_000 + i), "plain")
    assert main(["store", "gc", "--store", str(store.root), "--max-bytes", "0"]) == 0
    printed = capsys.readouterr().out
    assert "dropped 3 answers" in printed and "removed 0 blobs" in printed
    on_disk = sum(p.stat().st_size for p in (store.root / "blobs").rglob("*") if p.is_file())
    assert on_disk == 300_003
    assert f"{size_of(on_disk)} kept" in printed
    assert f"{size_of(on_disk)} of it blobs younger than --grace" in printed
    done = LocalStore(store.root).gc(max_bytes=0)
    assert done.kept == on_disk and done.young == on_disk


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path-traversal name and an unknown name are refused with a message and status 2."""
    where = str(_store(tmp_path).root)
    assert main(["store", "show", "../etc/passwd", "--store", where]) == 2
    assert "could reach outside the store" in capsys.readouterr().err
    assert main(["store", "show", "sms/none", "--store", where]) == 2
    assert "nothing is bound to `sms/none`" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["ls"], ["du"], ["gc"], ["verify"], ["show", "sms/train"]])
def test_a_store_named_without_store_says_to_name_it_so(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A store named as a word after the command (`somatize store ls features`), as `du`
    takes a directory, exits 2 saying to name it with --store, where argparse's usage line
    said only that the word was not recognized; a stray option is named alone."""
    where = str(_store(tmp_path).root)
    assert main(["store", *command, where]) == 2
    said = capsys.readouterr().err
    assert f"unrecognized arguments: {where}; a store is named with --store" in said, said
    run = shlex.join(["somatize", "store", command[0], "--store", where, *command[1:]])
    assert f"`{run}`" in said, said
    assert main(["store", *command, "--bogus", "--store", where]) == 2
    assert capsys.readouterr().err.endswith("unrecognized arguments: --bogus\n")


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["show", "sms/train", "{where}"], "show --store {where} sms/train"),
        (["gc", "{where}", "--max-bytes", "1K"], "gc --store {where} --max-bytes 1K"),
        (["gc", "1K", "--max-bytes", "1K"], "gc --store 1K --max-bytes 1K"),
        (["verify", "{where}", "--quarantine"], "verify --store {where} --quarantine"),
    ],
)
def test_the_command_said_for_a_store_named_as_a_word_keeps_the_rest(
    tmp_path: Path, command: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line said to run, for a store named as a word, is the one given with
    that word handed to --store: the key `show` takes, a gc's limit, verify's quarantine
    are kept, where leaving them out would show nothing, or gc or verify otherwise than
    asked."""
    where = str(_store(tmp_path).root)
    words = [word.format(where=where) for word in command]
    assert main(["store", *words]) == 2
    run = shlex.join(["somatize", "store", *said.format(where=where).split(" ")])
    assert capsys.readouterr().err.endswith(f"`{run}`\n")


def test_a_word_beside_a_store_named_is_not_said_to_be_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A word left over where --store names the store already is said to be unrecognized
    alone: it is not the store, and a command naming it as one would open another."""
    where = str(_store(tmp_path).root)
    assert main(["store", "ls", "--store", where, "features"]) == 2
    assert capsys.readouterr().err.endswith("unrecognized arguments: features\n")


@pytest.mark.parametrize("command", [["ls"], ["du"], ["gc"], ["verify"], ["show", "sms/train"]])
def test_a_path_that_is_no_store_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A missing directory, one that holds no store, or a file, is refused with a message
    naming it, saying which it is, and status 2, and is left as it was."""
    missing, empty, file = tmp_path / "no_such_dir", tmp_path / "empty", tmp_path / "a_file"
    empty.mkdir()
    file.write_bytes(b"kept as it is")
    for where, found in (
        (missing, "there is no such directory"),
        (empty, "it holds no store"),
        (file, "it is a file, not a directory"),
    ):
        assert main(["store", *command, "--store", str(where)]) == 2
        assert f"{where} is not a store: {found}" in capsys.readouterr().err
    assert not missing.exists() and not any(empty.iterdir())
    assert file.read_bytes() == b"kept as it is"


def test_a_file_url_that_is_no_store_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--store file:///typo` is refused as a plain path is, and nothing is created."""
    missing = tmp_path / "typo"
    assert main(["store", "ls", "--store", f"file://{missing}"]) == 2
    assert "is not a store" in capsys.readouterr().err
    assert not missing.exists()
    store = _store(tmp_path)
    assert main(["store", "ls", "--store", f"file://{store.root}"]) == 0


@pytest.mark.parametrize("archive", ["zip", "tar"])
def test_a_store_in_an_archive_is_read_by_every_command_that_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], archive: str
) -> None:
    """A store packed into an archive (`zip://store::file://…`, as docs/store.md names it) is
    listed, measured, verified and shown; a gc says the archive is only read (status 2).
    Every command took the URL for the archive's file and said it was a file, not a
    directory: no store."""
    _store(tmp_path)
    packed = shutil.make_archive(str(tmp_path / "packed"), archive, tmp_path, "store")
    url = f"{archive}://store::file://{packed}"
    assert main(["store", "ls", "--store", url]) == 0
    listed = capsys.readouterr().out
    assert "sms/train" in listed
    # when each was written, as the archive says it, not at the epoch (a zip's were not read)
    written = (tmp_path / "store" / "names" / "sms" / "train").stat().st_mtime
    assert time.strftime("%Y-", time.localtime(written)) in listed
    assert time.strftime("%Y-", time.localtime(0)) not in listed
    assert main(["store", "du", "--store", url]) == 0
    assert "total" in capsys.readouterr().out
    assert main(["store", "verify", "--store", url]) == 0
    assert "1 names" in capsys.readouterr().out
    assert main(["store", "show", "sms/train", "--store", url]) == 0
    assert "sms/train → blake3:" in capsys.readouterr().out
    assert main(["store", "gc", "--store", url]) == 2
    err = capsys.readouterr().err
    assert f"the store is in a {archive} archive" in err and len(err.splitlines()) == 1
    missing = f"{archive}://store::file://{tmp_path / 'missing'}.{archive}"
    assert main(["store", "ls", "--store", missing]) == 2
    assert "cannot open" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["local://", "simplecache::file://"])
def test_every_url_of_a_local_directory_that_is_no_store_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    """fsspec's other names for a local directory (`local://`, or `file://` at the end of
    a chain) are refused as `file://` is when they hold no store, and nothing is created;
    one that holds a store opens."""
    missing = tmp_path / "typo"
    for command in (["ls"], ["du"], ["verify"]):
        assert main(["store", *command, "--store", f"{scheme}{missing}"]) == 2
        assert "is not a store: there is no such directory" in capsys.readouterr().err
    assert not missing.exists()
    store = _store(tmp_path)
    assert main(["store", "ls", "--store", f"{scheme}{store.root}"]) == 0


def test_an_empty_somatize_store_is_unset_and_an_empty_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SOMATIZE_STORE=` (set, and empty) is taken as unset, so `./store` is the default;
    `--store ''` names no directory, and is refused as `Store('')` is (`.` is the current
    one), rather than take whatever store the current directory holds."""
    store = _store(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SOMATIZE_STORE", "")
    assert main(["store", "ls"]) == 0
    assert "sms/train" in capsys.readouterr().out
    monkeypatch.chdir(store.root)
    assert main(["store", "du", "--store", ""]) == 2
    err = capsys.readouterr().err
    assert "--store names no directory" in err and "`.`" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["store", "du", "--store", "."]) == 0


def test_a_memory_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`memory://` lives in one process, so the command line refuses it rather than
    report the empty store it would make there."""
    assert main(["store", "ls", "--store", "memory://somatize-cli-test"]) == 2
    assert "memory:// lives in the process that made it" in capsys.readouterr().err


def test_a_home_of_no_known_user_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--store ~nosuchuser/x` names a home no user has: status 2 and one line, not a
    traceback."""
    assert main(["store", "ls", "--store", "~somatize_no_such_user/x"]) == 2
    err = capsys.readouterr().err
    assert "`~somatize_no_such_user` names no home directory" in err
    assert len(err.splitlines()) == 1


def test_a_closed_standard_output_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with its output closed (`>&-`, where Python's sys.stdout is None), a
    command does nothing and says so on stderr with status 2."""
    store = _store(tmp_path)
    monkeypatch.setattr(sys, "stdout", None)
    assert (
        main(["store", "gc", "--max-bytes", "0", "--grace", "0", "--store", str(store.root)]) == 2
    )
    assert "the standard output is closed" in capsys.readouterr().err
    assert store.answer(KEY) is not None


def test_verify_lists_a_stray_file_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .DS_Store in blobs/ is listed as stray, and verify still exits 0: it is no damage."""
    store = _store(tmp_path)
    (store.root / "blobs" / ".DS_Store").write_bytes(b"Finder's")
    assert main(["store", "verify", "--store", str(store.root)]) == 0
    assert "stray   blobs/.DS_Store: not named by a digest" in capsys.readouterr().out


def test_verify_tells_abandoned_writes_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an interrupted write left in tmp/ is told by verify, as no damage (status 0),
    with what gc does of it; gc then removes it."""
    store = _store(tmp_path)
    (store.root / "tmp" / "blob-1234.part").write_bytes(b"half a blob")
    where = str(store.root)
    assert main(["store", "verify", "--store", where]) == 0
    printed = capsys.readouterr().out
    assert "1 abandoned write in tmp/" in printed and "gc removes them" in printed
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert "and 1 abandoned writes" in capsys.readouterr().out
    assert main(["store", "verify", "--store", where]) == 0
    assert "abandoned" not in capsys.readouterr().out


def test_verify_says_gc_leaves_a_stray_file_in_answers_or_packs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .DS_Store in answers/ or packs/ is listed as stray with what gc does of it: it leaves
    it (only a stray in blobs/ is removed), as gc then does."""
    store = _store(tmp_path)
    strays = [store.root / "answers" / KEY[7:9] / ".DS_Store", store.root / "packs" / ".DS_Store"]
    for stray in strays:
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(b"Finder's")
    where = str(store.root)
    assert main(["store", "verify", "--store", where]) == 0
    printed = capsys.readouterr().out
    assert (
        f"stray   answers/{KEY[7:9]}/.DS_Store: not named by a digest where it lies, so no record; "
        in printed
    )
    assert (
        "stray   packs/.DS_Store: not named by a digest where it lies, so no pack index; "
        in printed
    )
    assert "gc removes" not in printed and printed.count("gc leaves it") == 2
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert all(stray.exists() for stray in strays)


def test_ls_shows_no_size_for_an_answer_or_pack_whose_blob_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls prints `-` for the bytes of an answer or pack whose blob is gone, as for a name:
    never the size its record says, as if it were whole."""
    store = _store(tmp_path)
    answer = store.answer(KEY)
    assert answer is not None
    (pack,) = store.keep_many([(f"blake3:{i:064x}", b"item %d" % i) for i in range(3)], "plain")[:1]
    for blob in {answer.value, pack.value}:
        store.blob_path(blob).unlink()
    assert main(["store", "ls", "--store", str(store.root)]) == 0
    rows = {line.split()[-1]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows[KEY][1] == "-"
    (pack_row,) = [row for row in rows.values() if row[0] == "pack"]
    assert pack_row[1] == "-"
    assert rows["sms/train"][1:3] == ["4", "B"]


def test_a_stray_file_in_names_is_no_damage_and_no_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .DS_Store in names/, and a file there whose name is not UTF-8, are listed as stray
    by verify, which exits 0, and --quarantine leaves them; gc goes on; ls lists no such
    name (show would refuse it)."""
    store = _store(tmp_path)
    (store.root / "names" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    with open(os.path.join(os.fsencode(store.root / "names"), b"x\xffy"), "wb") as f:
        f.write(b"junk")
    where = str(store.root)
    for command in (["verify", "--quarantine"], ["verify"]):
        assert main(["store", *command, "--store", where]) == 0
        printed = capsys.readouterr().out
        assert "stray   names/.DS_Store: not a name" in printed
        assert "stray   names/x\\xffy: not a name" in printed and "DAMAGED" not in printed
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert main(["store", "ls", "--store", where]) == 0
    assert [line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:]] == [
        KEY,
        "sms/train",
    ]
    assert (store.root / "names" / ".DS_Store").exists()


def test_gc_on_a_read_only_store_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc of a store it cannot remove from (a read-only disk) raises StoreError saying so,
    and the command line exits 2 with that one line, no traceback; the store is whole."""
    store = _store(tmp_path)
    unreferenced = store.put(b"nothing refers to this")

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "unlink", read_only)
    with pytest.raises(StoreError, match=r"could not remove blobs/.*: the store is read-only"):
        LocalStore(store.root).gc(grace=0)
    assert main(["store", "gc", "--store", str(store.root), "--grace", "0"]) == 2
    err = capsys.readouterr().err
    assert "somatize store gc: could not remove blobs/" in err and "read-only" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.undo()
    assert LocalStore(store.root).has_blob(unreferenced) and LocalStore(store.root).verify().ok


def test_verify_says_what_it_could_not_move_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify --quarantine on a store it cannot write counts as moved only what it moved
    (nothing), says what it could not move and why, and leaves the damage in place."""
    store = _store(tmp_path)
    answer = store.answer(KEY)
    assert answer is not None
    blob = store.blob_path(answer.value)
    blob.write_bytes(b"y" * 3000)

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", read_only)
    found = LocalStore(store.root).verify(quarantine=True)
    where = f"blobs/{answer.value[7:9]}/{answer.value[7:]}"
    assert found.quarantined == [] and set(found.unmoved) == {
        where,
        f"answers/{KEY[7:9]}/{KEY[7:]}",
    }
    assert "Read-only file system" in found.unmoved[where]
    assert main(["store", "verify", "--store", str(store.root), "--quarantine"]) == 1
    printed = capsys.readouterr().out
    assert "aside into quarantine/" not in printed
    assert f"could not move {where} to quarantine/" in printed
    assert blob.exists()
    assert not [p for p in (store.root / "quarantine").rglob("*") if p.is_file()]


def _bare_s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, credentials: bool) -> None:
    """An environment whose S3 client reaches only the loopback server, with the test
    credentials or none at all (no files, no instance metadata), and no client cached."""
    import s3fs

    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    if credentials:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {})  # a client of its own, not cached


@pytest.mark.parametrize("command", [["ls"], ["du"], ["gc"], ["verify"], ["show", "sms/train"]])
def test_a_bucket_that_does_not_exist_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    """A URL naming a bucket that does not exist is refused with status 2 and a message
    naming the bucket: it is no empty, healthy store."""
    _bare_s3(monkeypatch, tmp_path, credentials=True)
    where = "s3://no-such-bucket-somatize/prefix"
    assert main(["store", *command, "--store", where]) == 2
    err = capsys.readouterr().err
    assert "the bucket `no-such-bucket-somatize` does not exist" in err
    assert len(err.strip().splitlines()) == 1


def test_a_bucket_without_credentials_exits_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no credentials to be found, the command line says so in one line and exits 2,
    saying that it reads them where the client looks (it takes no storage options); no
    traceback."""
    _bare_s3(monkeypatch, tmp_path, credentials=False)
    assert main(["store", "ls", "--store", "s3://somatize-tests/prefix"]) == 2
    err = capsys.readouterr().err
    assert "found no credentials" in err and "AWS_ACCESS_KEY_ID" in err
    assert "the only place the `somatize` command reads them" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("grace", ["-5", "nan", "inf"])
def test_gc_refuses_a_grace_that_is_not_finite_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    """`gc --grace` that is negative (it would remove writes in flight), NaN or infinite
    exits 2 with a message, and the writes in flight in tmp/ are left alone."""
    store = _store(tmp_path)
    in_flight = store.root / "tmp" / "4242-writing.part"
    in_flight.write_bytes(b"being written")
    assert main(["store", "gc", "--store", str(store.root), f"--grace={grace}"]) == 2
    assert "grace is finite seconds ≥ 0" in capsys.readouterr().err
    assert in_flight.exists()


def _refuse_reading(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Makes opening ``paths`` fail as a file of another user, mode 0600, does (as root,
    permissions would not stop a read, so the refusal is simulated)."""
    refused = {os.fspath(p) for p in paths}

    def guarded(real: Any) -> Any:
        def opening(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, bytes, os.PathLike)) and os.fsdecode(file) in refused:
                raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(file))
            return real(file, *args, **kwargs)

        return opening

    for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
        monkeypatch.setattr(module, name, guarded(getattr(module, name)))


@pytest.mark.parametrize("what", ["record", "blob"])
def test_a_file_that_cannot_be_read_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    what: str,
) -> None:
    """A record or blob of a shared store this user may not read (another user's, mode
    0600) stops verify, show and (a record) gc with one line naming it and status 2 — not a
    traceback and status 1, which says damage was found — and nothing is removed."""
    store = _store(tmp_path)
    answer = store.answer(KEY)
    assert answer is not None
    record, blob = store.answer_path(KEY), store.blob_path(answer.value)
    target = record if what == "record" else blob
    shown = f"{target.parent.parent.name}/{target.parent.name}/{target.name}"
    _refuse_reading(monkeypatch, target)
    where = str(store.root)
    commands = [["verify"], ["show", KEY if what == "record" else answer.value]]
    if what == "record":  # gc reads records, indexes and names; never a blob
        commands.append(["gc", "--grace", "0"])
    for command in commands:
        assert main(["store", *command, "--store", where]) == 2, command
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "Permission denied" in err and (shown in err or str(target) in err), err
    fresh = LocalStore(store.root)
    with pytest.raises(StoreError, match=shown):
        fresh.verify()
    if what == "record":
        with pytest.raises(StoreError, match=shown):
            fresh.answer(KEY)
    monkeypatch.undo()
    assert record.exists() and blob.exists() and LocalStore(store.root).verify().ok


@pytest.mark.parametrize("command", [["ls"], ["du"], ["verify"], ["show", KEY]])
def test_a_reader_that_goes_away_ends_it_quietly(tmp_path: Path, command: list[str]) -> None:
    """Output into a pipe whose reader has gone (`somatize store ls | head -1`) ends the
    command quietly with status 141, as a tool stopped by SIGPIPE ends: no traceback."""
    store = _store(tmp_path)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before a line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "somatize.cli", "store", *command, "--store", str(store.root)],
            stdout=write,
            stderr=subprocess.PIPE,
            env=dict(
                os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
            ),
            timeout=120,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (141, "")


@pytest.mark.parametrize(
    ("command", "stopped"),
    [(["gc", "--grace", "0"], "gc"), (["verify", "--quarantine"], "verify")],
)
def test_a_command_interrupted_ends_with_a_line_and_status_130(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    stopped: str,
) -> None:
    """A command interrupted (Ctrl-C) says so in one line on stderr, with no traceback, and
    ends with status 130, as a tool stopped by SIGINT does; run again, it finishes."""
    store = _store(tmp_path)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStore, stopped, interrupted)
    argv = ["store", command[0], "--store", str(store.root), *command[1:]]
    assert main(argv) == 130
    printed = capsys.readouterr()
    assert printed.err == (
        f"somatize store {command[0]}: interrupted; what it changed so far stands "
        "(run it again to finish)\n"
    )
    monkeypatch.undo()
    assert main(argv) == 0


def test_what_the_store_holds_is_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """File names planted in a shared store, and a record's codec and fingerprint, are
    printed with their control characters escaped (``\\x1b``, ``\\n``), and a name that is
    not UTF-8 with its bytes escaped: nothing a store holds reaches the terminal as an
    escape sequence, or forges a line of output."""
    store = _store(tmp_path)
    root = store.root
    (root / "names" / "evil\x1b]0;PWNED\x07\x1b[2J").write_bytes(b"junk")
    (root / "names" / "x\nanswer        1 B  2020-01-01 00:00  blake3:forged").write_bytes(b"")
    (root / "answers" / "zz").mkdir()
    (root / "answers" / "zz" / "\x1b[31mred").write_bytes(b"x")
    with open(os.path.join(os.fsencode(root / "answers" / "zz"), b"bad\xffname"), "wb") as f:
        f.write(b"x")
    other = "blake3:" + "cd" * 32
    store.keep(other, b"x", "plain\x1b]0;PWNED\x07", fingerprint="fp\x1b[2J")
    for command in (["ls"], ["verify"], ["show", other]):
        assert main(["store", *command, "--store", str(root)]) in (0, 1), command
        printed = capsys.readouterr()
        text = printed.out + printed.err
        assert not {"\x1b", "\x07", "\udcff"} & set(text), (command, text)
        lines = text.splitlines()
        assert not [line for line in lines if line.startswith("answer") and "forged" in line]
        if command == ["verify"]:
            assert "answers/zz/\\x1b[31mred" in text and "answers/zz/bad\\xffname" in text
        if command[0] == "show":
            assert "codec    plain\\x1b]0;PWNED\\x07" in text
            assert "code     fp\\x1b[2J" in text


def test_ls_says_what_each_holds_and_show_takes_what_ls_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls prints the bytes an answer holds, a pack's blob holds and a name points at (not
    the size of the small file that says so), and show takes every key ls prints: a pack's
    id shows the pack."""
    store = LocalStore(tmp_path / "store")
    store.keep(KEY, bytes(5 << 20), "plain")
    store.keep_many([(f"blake3:{i:064x}", [bytes(100_000)]) for i in range(50)], "plain")
    store.bind("data/v1", store.put(bytes(3000)))
    where = str(store.root)
    assert main(["store", "ls", "--store", where]) == 0
    lines = capsys.readouterr().out.splitlines()
    sizes = {line.split()[-1]: " ".join(line.split()[1:3]) for line in lines}
    pack = next(line.split()[-1] for line in lines if line.startswith("pack"))
    assert sizes == {KEY: "5.0 MiB", pack: "4.8 MiB", "data/v1": "2.9 KiB"}
    for shown in sizes:
        assert main(["store", "show", shown, "--store", where]) == 0, shown
        printed = capsys.readouterr().out
        if shown == pack:
            assert f"pack     {pack}" in printed and "items    50" in printed
            assert "bytes    5000000 (4.8 MiB)" in printed


def test_ls_lists_a_record_it_may_not_read_without_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ls of a shared store holding a record this user may not read (another user's, mode
    0600) lists it with `-` for its size, and the rest as usual: it does not stop."""
    store = _store(tmp_path)
    other = "blake3:" + "cd" * 32
    store.keep(other, b"y" * 5000, "plain")
    _refuse_reading(monkeypatch, store.answer_path(KEY))
    assert main(["store", "ls", "--store", str(store.root)]) == 0
    sizes = {line.split()[-1]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert sizes[KEY] == "-" and sizes[other] == "4.9"


def test_a_file_bucket_holding_only_names_is_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store made through `Store.on_bucket("file://…")` that holds datasets and names but
    no answer yet (so no answers/ folder) is a store to every command, named by its URL or
    its path."""
    root = tmp_path / "bucket"
    store = Store.on_bucket(f"file://{root}")
    store.bind("sms/train", store.put(b"a dataset"))
    assert not (root / "answers").exists()
    for where in (f"file://{root}", str(root)):
        for command in (["ls"], ["du"], ["verify"], ["gc"], ["show", "sms/train"]):
            assert main(["store", *command, "--store", where]) == 0, capsys.readouterr().err
            printed = capsys.readouterr().out
            if command == ["ls"]:
                assert printed.split()[-1] == "sms/train"


def test_show_of_a_record_that_cannot_be_read_says_it_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record whose `created` lies beyond what a clock can show (1e20), or that is not
    a record at all, is damage: show says it cannot be read in one line (status 1, as for a
    damaged blob; no traceback), how to move it aside, and verify reports it."""
    store = _store(tmp_path)
    path = store.answer_path(KEY)
    path.write_text(path.read_text().replace('"created":', '"created":1e20,"was":'))
    where = str(store.root)
    assert main(["store", "show", KEY, "--store", where]) == 1
    err = capsys.readouterr().err
    assert "cannot be read" in err and len(err.strip().splitlines()) == 1
    assert "DAMAGED" in err and "verify --quarantine" in err
    path.write_text("garbage{")
    assert main(["store", "show", KEY, "--store", where]) == 1
    assert "DAMAGED" in capsys.readouterr().err
    assert main(["store", "verify", "--store", where]) == 1
    assert f"DAMAGED answers/{KEY[7:9]}/{KEY[7:]}" in capsys.readouterr().out


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_show_of_a_record_that_says_other_bytes_than_its_blob_holds_says_it_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheme: str
) -> None:
    """A record that reads whole but says other bytes than its blob, whole, holds (a digit
    of its size flipped, or an offset past the blob's end) is damage, as verify says and
    as a recall finds it: show says so with status 1, where it showed the answer as whole
    with status 0, and says that verify moves it aside."""
    store = _store(tmp_path)
    path = store.answer_path(KEY)
    kept = path.read_text()
    where = f"{scheme}{store.root}"
    for record, said in (
        (kept.replace('"bytes":3000', '"bytes":3001'), "it holds 3000 bytes, not the 3001"),
        (kept.replace('"bytes":3000', '"bytes":3000,"offset":1'), "it holds 3000 bytes, not"),
    ):
        path.write_text(record)
        with pytest.raises(StoreError):  # what a recall finds
            LocalStore(store.root).recall(KEY)
        assert main(["store", "show", KEY, "--store", where]) == 1
        printed = capsys.readouterr().out
        assert f"DAMAGED: {said}" in printed and "verify --quarantine" in printed
        assert main(["store", "verify", "--store", where]) == 1
        assert f"DAMAGED answers/{KEY[7:9]}/{KEY[7:]}" in capsys.readouterr().out
    path.write_text(kept)
    assert main(["store", "show", KEY, "--store", where]) == 0
    assert "DAMAGED" not in capsys.readouterr().out


def test_show_of_a_record_signed_with_another_key_says_which_key_to_show_it_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """show with a key the store's writers did not sign with does not advise `verify
    --quarantine`, which refuses that key: it says to show it with the writers' key, and
    that only where this is that key the record was altered and verify moves it aside."""
    monkeypatch.setenv("SOMATIZE_STORE_KEY", "the writers' key")
    where = str(_store(tmp_path).root)
    monkeypatch.setenv("SOMATIZE_STORE_KEY", "another key")
    assert main(["store", "show", KEY, "--store", where]) == 1
    err = capsys.readouterr().err
    assert "signature that does not match" in err and len(err.strip().splitlines()) == 1
    assert "with the key the store's writers sign with (SOMATIZE_STORE_KEY)" in err
    assert "where this process holds that key" in err
    assert main(["store", "verify", "--quarantine", "--store", where]) == 2
    assert "none of the 2 records" in capsys.readouterr().err


def test_du_of_a_bucket_counts_its_use_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """du of a bucket store counts the used/ logs its readers wrote (one per reading
    process) in a line of their own and in the total: they are files the store holds."""
    url = s3_url()
    options = s3_options()
    store = Store.on_bucket(url, **options)
    store.keep(KEY, b"x" * 100, "plain")
    for _ in range(3):
        reader = Store.on_bucket(url, **options)
        reader.recall(KEY)
        reader.close()
    _bare_s3(monkeypatch, tmp_path, credentials=True)
    assert main(["store", "du", "--store", url]) == 0
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert lines["used"][0] == "3"
    counted = sum(int(parts[0]) for section, parts in lines.items() if section != "total")
    assert int(lines["total"][0]) == counted == 5  # a blob, its record, three logs


def test_python_m_somatize_is_the_command(tmp_path: Path) -> None:
    """`python -m somatize` runs the command line, for an environment whose scripts are
    not on the PATH."""
    store = _store(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "somatize", "store", "du", "--store", str(store.root)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()][-1] == "total"


@pytest.mark.parametrize(
    ("given", "wanted"), [([], "{store}"), (["store"], "{ls,du,gc,compact,verify,show}")]
)
def test_a_missing_command_is_named_by_what_may_be_given(
    capsys: pytest.CaptureFixture[str], given: list[str], wanted: str
) -> None:
    """`somatize` or `somatize store` alone exits 2 saying which words may follow, not the
    name the parser keeps the answer under."""
    with pytest.raises(SystemExit) as ended:
        main(given)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"the following arguments are required: {wanted}" in err


@pytest.mark.parametrize("command", [["ls"], ["gc"], ["verify"], ["show", "sms/train"]])
def test_a_url_whose_filesystem_cannot_be_made_from_it_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """`--store reference://…` names a filesystem the command line cannot make (it needs a
    reference file, which no URL names): status 2 and one line saying why, not a traceback
    and status 1, which `verify` means as damage found."""
    assert main(["store", *command, "--store", "reference://somatize/store"]) == 2
    err = capsys.readouterr().err
    assert "cannot open reference://somatize/store as a bucket store" in err
    assert len(err.splitlines()) == 1


def test_ls_of_a_bucket_says_when_each_answer_was_last_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ls of a bucket store lists answers least recently used first, as gc drops them, at
    the time they were last used: a bucket keeps a recall's time in its used/ logs, not in
    the record's time, which says when it was written."""
    url = f"file://{tmp_path / 'bucket'}"
    store = Store.on_bucket(url)
    older, newer = KEY, "blake3:" + "cd" * 32
    store.keep(older, b"a" * 100, "plain")
    store.keep(newer, b"b" * 300, "plain")
    store.close()
    written = time.time() - 7200
    for hours, key in ((2, older), (1, newer)):
        record = tmp_path / "bucket" / "answers" / key[7:9] / key[7:]
        os.utime(record, (time.time() - hours * 3600,) * 2)
    reader = Store.on_bucket(url)
    reader.recall(older)
    reader.close()
    assert main(["store", "ls", "--store", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in lines] == [newer, older]
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(written)) not in lines[1]
    assert main(["store", "gc", "--store", url, "--max-bytes", "700", "--grace", "0"]) == 0
    assert "dropped 1 answers" in capsys.readouterr().out
    assert main(["store", "ls", "--store", url]) == 0
    assert capsys.readouterr().out.split()[-1] == older  # what ls listed first went


def test_a_directory_named_through_a_caching_layer_is_collected_and_verified_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store's directory named through a layer of copies (`simplecache::file://…`) is a
    directory still: gc collects it rather than looking for a bucket named by its first
    folder, and verify --quarantine moves what is damaged aside, as for its path."""
    store = _store(tmp_path)
    answer = store.answer(KEY)
    assert answer is not None
    where = f"simplecache::file://{store.root}"
    assert main(["store", "gc", "--store", where, "--max-bytes", "100"]) == 0
    assert "dropped 1 answers" in capsys.readouterr().out
    assert LocalStore(store.root).have([KEY]) == set()
    store = _store(tmp_path)
    store.blob_path(answer.value).write_bytes(b"y" * 3000)
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 1
    assert "moved 2 aside into quarantine/" in capsys.readouterr().out
    assert main(["store", "verify", "--store", where]) == 0


@pytest.mark.parametrize("home", ["local", "s3"])
def test_gc_says_what_it_kept_for_a_name_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    """`somatize store gc` meeting a name whose digest had a digit flipped drops answers as
    asked but removes no blob the name may point at, and says which name and how much it
    kept; once `verify --quarantine` moved the name aside, gc removes them."""
    if home == "local":
        store: Store = LocalStore(tmp_path / "store")
        where = str(tmp_path / "store")
    else:
        where = s3_url()
        store = Store.on_bucket(where, **s3_options())
        _bare_s3(monkeypatch, tmp_path, credentials=True)
    named = store.put(b"the training set")
    store.bind("sms/train", named)
    store.bind("sms/test", store.put(b"the test set"))
    answered = store.keep(KEY, b"x" * 100, "plain").value
    flipped = _damaged_name(_held(store, "names/sms/train"), "a digit flipped")
    _plant(store, "names/sms/train", flipped)
    gc = ["store", "gc", "--store", where, "--grace", "0", "--max-bytes", "0"]
    assert main(gc) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "dropped 1 answers" in printed and "removed 0 blobs" in printed
    assert f"kept {size_of(116)} of blobs nothing else refers to" in printed
    assert "(names/sms/train)" in printed and "verify --quarantine" in printed
    assert store.has_blob(named) and store.has_blob(answered)
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 1
    assert "moved 1 aside" in capsys.readouterr().out
    assert main(gc) == 0
    printed = capsys.readouterr().out
    assert "removed 2 blobs" in printed and "names/" not in printed
    assert not store.has_blob(named) and not store.has_blob(answered)
    assert bytes(store.get(store.resolve("sms/test"))) == b"the test set"


def _left_without_empty_folders(store: Store) -> set[str]:
    """What lies at the top of the store, its empty folders removed as a copy of it from a
    bucket (`aws s3 sync`) would leave them out; a bucket keeps none of them anyway."""
    if isinstance(store, LocalStore):
        for folder in sorted(store.root.rglob("*"), key=lambda at: -len(at.parts)):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        # Its `.gitignore` (keeping a local store out of git) is no part of the store.
        return {at.name for at in store.root.iterdir()} - {".gitignore"}
    from somatize.store import BucketStore

    assert isinstance(store, BucketStore)
    store.fs.invalidate_cache()
    return {path.rsplit("/", 1)[-1] for path in store.fs.ls(store.root, detail=False)}


@pytest.mark.parametrize("home", ["local", "s3"])
def test_a_store_its_upkeep_emptied_is_still_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    """A store whose every answer gc dropped and whose every name verify --quarantine moved
    aside holds only blobs/ and quarantine/ on a bucket (or in a directory copied from one,
    which keeps no empty folder), and only quarantine/ once gc removed the blobs: every
    command takes it for a store still, and gc collects it. A folder holding blobs/ alone,
    or beside a quarantine/ of a user's files, is still none, and is left as it was."""
    if home == "local":
        store: Store = LocalStore(tmp_path / "store")
        where = str(tmp_path / "store")
        bare, user = tmp_path / "blobs-only", tmp_path / "users"
        for at, files in ((bare, ["blobs"]), (user, ["blobs", "quarantine"])):
            for folder in files:
                (at / folder).mkdir(parents=True)
        (bare / "blobs" / "ab").mkdir()
        (bare / "blobs" / "ab" / ("ab" * 32)).write_bytes(b"a blob")
        (user / "quarantine" / "report.txt").write_bytes(b"a user's file")
        others = [str(bare), str(user)]
    else:
        where = s3_url()
        store = Store.on_bucket(where, **s3_options())
        _bare_s3(monkeypatch, tmp_path, credentials=True)
        others = [s3_url(), s3_url()]
        fs = store.fs
        fs.pipe_file(f"{others[0][5:]}/blobs/ab/{'ab' * 32}", b"a blob")
        fs.pipe_file(f"{others[1][5:]}/blobs/ab/{'ab' * 32}", b"a blob")
        fs.pipe_file(f"{others[1][5:]}/quarantine/report.txt", b"a user's file")
    store.keep(KEY, b"x" * 100, "plain")
    store.bind("sms/train", store.put(b"the training set"))
    assert main(["store", "gc", "--store", where, "--max-bytes", "0"]) == 0  # blobs are young
    _plant(store, "names/sms/train", b"garbled")
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 1
    capsys.readouterr()
    assert _left_without_empty_folders(store) == {"blobs", "quarantine", "somatize-store"}
    for command in (["ls"], ["du"], ["verify"]):
        assert main(["store", *command, "--store", where]) == 0, capsys.readouterr().err
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert "removed 2 blobs" in capsys.readouterr().out
    assert _left_without_empty_folders(store) == {"quarantine", "somatize-store"}
    assert main(["store", "du", "--store", where]) == 0, capsys.readouterr().err
    assert "quarantine 1 files" in " ".join(capsys.readouterr().out.split())
    for other in others:
        for command in (["ls"], ["gc", "--grace", "0"]):
            assert main(["store", *command, "--store", other]) == 2
            assert "holds no store" in capsys.readouterr().err
    if home == "local":
        assert {at.name for at in bare.iterdir()} == {"blobs"}
        assert (bare / "blobs" / "ab" / ("ab" * 32)).read_bytes() == b"a blob"
    else:
        assert len(fs.find(others[1][5:])) == 2
        assert fs.cat_file(f"{others[0][5:]}/blobs/ab/{'ab' * 32}") == b"a blob"


def test_a_file_url_with_percent_escapes_names_the_store_it_encodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--store` given a `file://` URL as `Path.as_uri()` writes it (a space as `%20`) reads
    the store in the folder it names, and refuses one holding `::`."""
    folder = tmp_path / "my store"
    store = LocalStore(folder)
    store.keep("blake3:" + "ab" * 32, b"kept", "plain")
    assert main(["store", "ls", "--store", folder.as_uri()]) == 0
    assert "blake3:" + "ab" * 32 in capsys.readouterr().out
    assert main(["store", "ls", "--store", f"file://{tmp_path}/a::b"]) == 2
    assert "holds `::`" in capsys.readouterr().err


def _as_it_lies(root: Path) -> dict[str, int]:
    """Each file and folder under ``root`` (and ``root`` itself) → its time: a folder made
    or a file written in a folder changes the folder's time."""
    found = {".": root.stat().st_mtime_ns}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = path.lstat().st_mtime_ns
    return found


@pytest.mark.parametrize("url", [False, True])
@pytest.mark.parametrize(
    "command", [["ls"], ["du"], ["verify"], ["show", KEY], ["show", "sms/train"]]
)
def test_a_command_that_only_reads_writes_nothing_in_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], url: bool
) -> None:
    """ls, du, show and verify (without --quarantine) open the store read-only: one an
    earlier somatize made (no marker, no tmp/ nor packs/) is read as it lies, gaining no
    marker and no folder, and what they print is what they print of a marked store."""
    store = _store(tmp_path)
    root = store.root
    store.close()
    where = f"file://{root}" if url else str(root)
    assert main(["store", *command, "--store", where]) == 0
    printed = capsys.readouterr().out
    (root / "somatize-store").unlink()
    shutil.rmtree(root / "tmp")
    shutil.rmtree(root / "packs")
    before = _as_it_lies(root)
    assert main(["store", *command, "--store", where]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == printed
    assert _as_it_lies(root) == before


@pytest.mark.parametrize(
    "command", [["gc", "--grace", "0"], ["compact"], ["verify", "--quarantine"]]
)
def test_a_command_that_changes_the_store_marks_one_an_earlier_somatize_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """gc, compact and verify --quarantine open the store to write it: one an earlier
    somatize made is marked as any writer marks it."""
    store = _store(tmp_path)
    root = store.root
    store.close()
    (root / "somatize-store").unlink()
    assert main(["store", *command, "--store", str(root)]) == 0, capsys.readouterr().err
    assert (root / "somatize-store").is_file()
