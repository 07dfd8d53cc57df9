"""Tests of the native BLAKE3 code: the host build against the ``blake3`` package and
the official test vectors, the host emulation of the CUDA kernels' tree plan, the
``_native`` module's switches and staging pool, and (with a CUDA device) the
device digests."""

from __future__ import annotations

import ctypes
import importlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import blake3
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _load_native() -> ModuleType:
    try:
        return importlib.import_module("somatize_torch._native")
    except ImportError:
        sys.path.insert(0, str(REPO))
        return importlib.import_module("somatize_torch._native")


native = _load_native()
# The modules behind it, for the state and helpers of their own that tests look at.
native_host = importlib.import_module("somatize_torch._host_library")
native_env = importlib.import_module("somatize_torch._native_env")

MiB = 1 << 20

SPECIAL_LENGTHS = sorted(
    {0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 3072, 3073, 4095, 4096, 4097, 8 * MiB + 7}
    | {(1 << k) + d for k in range(1, 21) for d in (-1, 0, 1)}
)
RANDOM_LENGTHS = sorted(random.Random(20240601).randrange(0, 3 * MiB // 2) for _ in range(24))

# Lengths of the official BLAKE3 test_vectors.json (input byte i is i % 251).
OFFICIAL_LENGTHS = [
    0, 1, 1023, 1024, 1025, 2048, 2049, 3072, 3073, 4096, 4097, 5120, 5121, 6144, 6145,
    7168, 7169, 8192, 8193, 16384, 31744, 102400,
]  # fmt: skip
# First 32 bytes of the "hash" field of the official vectors for some of them.
OFFICIAL_HASHES = {
    0: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
    1: "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
    1023: "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11",
    1024: "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
    1025: "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
    2048: "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a",
    2049: "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030",
    3072: "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2",
    3073: "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3",
    4096: "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969",
    4097: "9b4052b38f1c5fc8b1f9ff7ac7b27cd242487b3d890d15c96a1c25b8aa0fb995",
    5120: "9cadc15fed8b5d854562b26a9536d9707cadeda9b143978f319ab34230535833",
    8192: "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63",
    102400: "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085",
}

# Row batches (rows, row_bytes). row_bytes == 0 is allowed: every row digests
# the empty input, as blake3(b"") would.
ROW_SHAPES = [
    (1, 0), (4, 0), (1, 1), (7, 1), (1, 1024), (5, 1024), (1, 1025), (6, 1025), (2, 4096),
    (3, 4096), (3, 1000), (17, 3000), (9, 64), (33, 1023), (4, 5 * 1024), (3, 8 * 1024 + 1),
    (2, 300 * 1024 + 17), (2, 2049 * 1024),
]  # fmt: skip
# Chunks per row that hit every leaf tile size and one, two and three reduce passes.
PLAN_CHUNKS = [
    1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 100, 127, 128, 129, 200, 255,
    256, 257, 300, 511, 513, 1000, 2047, 2048, 2049, 4097, 65536, 65537,
]  # fmt: skip


def _data(n: int, seed: int | None = None) -> bytes:
    return random.Random(n if seed is None else seed).randbytes(n)


def _ref(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


@pytest.fixture(scope="session", autouse=True)
def ext_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # A cache named by the environment (the GPU checks share theirs, whose CUDA build is
    # slow) is used as it is; otherwise each run builds into its own.
    named = os.environ.get(native.ENV_CACHE)
    cache = Path(named) if named else tmp_path_factory.mktemp("ext-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native.ENV_CACHE, str(cache))
        mp.delenv(native.ENV_MODE, raising=False)
        yield cache


@pytest.fixture(scope="session")
def lib(ext_cache: Path) -> ctypes.CDLL:
    return native.host_library()


def _call32(fn: ctypes._CFuncPtr, data: bytes, *extra: int) -> bytes:
    out = ctypes.create_string_buffer(32)
    fn(data, len(data), *extra, out)
    return out.raw


def _emulate_rows(lib: ctypes.CDLL, data: bytes, rows: int, row_bytes: int) -> list[bytes]:
    out = ctypes.create_string_buffer(32 * max(rows, 1))
    lib.smz_blake3_host_emulate_rows(data, rows, row_bytes, out)
    return [out.raw[32 * i : 32 * i + 32] for i in range(rows)]


# --------------------------------------------------------------------------- host build


def test_host_library_is_built_in_cache_dir(lib: ctypes.CDLL, ext_cache: Path) -> None:
    built = native.build_host_library(ext_cache)
    assert built.parent == ext_cache and built.name.startswith("libsmz_blake3_host-")
    assert not [p for p in ext_cache.iterdir() if p.name.endswith(".tmp")]
    assert lib.smz_blake3_host_abi_version() == 5
    mtime = built.stat().st_mtime_ns
    assert native.build_host_library(ext_cache) == built
    assert built.stat().st_mtime_ns == mtime  # cached, not rebuilt


def test_a_build_sweeps_what_killed_builds_left(
    tmp_path: Path, ext_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temporary files of builds that never ended (an hour old) are removed by the next
    build; a fresh one, perhaps another process's build in progress, stays.

    The sweep comes before the compiler runs, whatever it writes: the build runs through
    one that copies this run's library rather than compile it once more."""
    monkeypatch.setenv("CXX", str(_copying_compiler(tmp_path, ext_cache)))
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / ".libsmz_blake3_host-0123.so.abc.tmp"
    fresh = cache / ".libsmz_blake3_host-0123.so.def.tmp"
    other = cache / ".libsmz_other-0123.so.abc.tmp"
    for path in (stale, fresh, other):
        path.write_bytes(b"half a library")
    hours_ago = time.time() - 2 * 3600
    for path in (stale, other):
        os.utime(path, (hours_ago, hours_ago))
    built = native.build_host_library(cache)
    assert built.is_file()
    assert not stale.exists()
    assert fresh.exists() and other.exists()


_DIGEST_IN_A_CHILD = (
    "import sys, torch\n"
    "from somatize_torch import _native\n"
    "from somatize_torch.digest import digest_rows, digest_tensor\n"
    "assert _native.host_library() is not None\n"
    "t = torch.randn(4, 300)\n"
    "assert digest_rows(t) == [digest_tensor(row) for row in t]\n"
)


def _copying_compiler(folder: Path, ext_cache: Path) -> Path:
    """A C++ compiler, made in ``folder``, that writes this run's host library where it is
    asked to write its output: a build through it runs as every build does (the library
    landed whole, then its record written beside it) without compiling once more."""
    compiler = folder / "copying-c++"
    compiler.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo copying 1.0; exit 0; }\n'
        'while [ $# -gt 1 ]; do [ "$1" = -o ] && exec cp "$0.so" "$2"; shift; done\nexit 1\n'
    )
    compiler.chmod(0o755)
    shutil.copyfile(native.build_host_library(ext_cache), f"{compiler}.so")
    return compiler


def _child_env(cache: Path, compiler: Path | None) -> dict[str, str]:
    """The environment of a process that builds the host library into ``cache``, on
    ``compiler`` where one is given."""
    env = dict(os.environ, SOMATIZE_EXT_CACHE=str(cache), SOMATIZE_NATIVE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if compiler is not None:
        env["CXX"] = str(compiler)
    return env


def _built_in(directory: Path, ext_cache: Path, compiler: Path | None = None) -> Path:
    """The host library in ``directory`` as a whole build there leaves it (the library
    and its record), copied from this run's build rather than compiled once more; through
    ``compiler`` where one is given (the library is then named for it)."""
    if compiler is not None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CXX", str(compiler))
            return native.build_host_library(directory)
    built = native.build_host_library(ext_cache)
    directory.mkdir(parents=True, exist_ok=True)
    for made in (built, built.with_name(built.name + ".ok")):
        shutil.copyfile(made, directory / made.name)
    assert native.build_host_library(directory) == directory / built.name  # taken as built
    return directory / built.name


@pytest.mark.parametrize("damage", ["cut short", "no record"])
def test_a_cached_library_not_whole_is_built_again(
    tmp_path: Path, ext_cache: Path, damage: str
) -> None:
    """A cached library cut short (its bytes lost in a crash after it was renamed into
    place), or one with no record of what its build wrote, is built again before it is
    loaded, where loading it killed the process.

    What is built again does not depend on how the library was damaged: only "cut short"
    compiles it, and "no record" builds it through a compiler that copies this run's."""
    compiler = None if damage == "cut short" else _copying_compiler(tmp_path, ext_cache)
    built = _built_in(tmp_path / "cache", ext_cache, compiler)
    record = built.with_name(built.name + ".ok")
    whole = built.read_bytes()
    assert record.read_text().split() == [str(len(whole)), blake3.blake3(whole).hexdigest()]
    if damage == "cut short":
        built.write_bytes(whole[:20000])
    else:
        record.unlink()
    env = _child_env(tmp_path / "cache", compiler)
    done = subprocess.run(
        [sys.executable, "-c", _DIGEST_IN_A_CHILD], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rebuilt = built.read_bytes()
    assert record.read_text().split() == [str(len(rebuilt)), blake3.blake3(rebuilt).hexdigest()]


def _put_in_place(library: Path, data: bytes) -> None:
    """``data`` at ``library``, with the record a build would have written for it."""
    library.write_bytes(data)
    library.with_name(library.name + ".ok").write_text(
        f"{len(data)} {blake3.blake3(data).hexdigest()}\n"
    )


def _foreign_library(tmp_path: Path) -> bytes:
    """A shared library that loads and has none of the host library's functions."""
    source = tmp_path / "other.cpp"
    source.write_text('extern "C" int smz_other(void) { return 1; }\n')
    out = tmp_path / "other.so"
    compiler = native_host._host_compiler()
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(out)], check=True)
    return out.read_bytes()


@pytest.mark.parametrize("kind", ["not a library", "another library"])
def test_a_cached_library_that_will_not_load_is_built_again(
    tmp_path: Path, ext_cache: Path, kind: str
) -> None:
    """A cached file that matches its record and still will not load, or loads and lacks
    the host library's functions, is removed and built again, and the library works.

    What is built again does not depend on what the file was: only "not a library"
    compiles it, and "another library" builds it through a compiler that copies this
    run's."""
    bad = b"not a library" if kind == "not a library" else _foreign_library(tmp_path)
    compiler = None if kind == "not a library" else _copying_compiler(tmp_path, ext_cache)
    cache = tmp_path / "cache"
    built = _built_in(cache, ext_cache, compiler)
    _put_in_place(built, bad)
    env = _child_env(cache, compiler)
    done = subprocess.run(
        [sys.executable, "-c", _DIGEST_IN_A_CHILD], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert built.read_bytes() != bad


def test_a_library_that_will_not_load_even_built_afresh_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that will not load even when built again is the library being
    unavailable, said with the file's name (not as a cache to be made writable); the
    background build keeps the pure path, raising nothing."""
    bad = tmp_path / "libsmz_blake3_host-bad.so"

    def build(directory: Path | None = None) -> Path:
        _put_in_place(bad, b"not a library")
        return bad

    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    monkeypatch.setattr(native_host, "build_host_library", build)
    with pytest.raises(native.NativeUnavailableError, match="built afresh") as raised:
        native.host_library()
    assert str(bad) in str(raised.value) and native.ENV_CACHE not in str(raised.value)
    native_host._build_in_background()  # logs, raises nothing


def test_a_function_missing_from_a_library_is_said_naming_the_file(tmp_path: Path) -> None:
    """A library that loads and lacks a function of the host library is refused as
    unavailable, naming the file, where binding it raised a bare AttributeError."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from somatize_torch import _host_library, _native\n"
        "try:\n"
        "    _host_library._open_host(Path(sys.argv[1]))\n"
        "except _native.NativeUnavailableError as exc:\n"
        "    assert sys.argv[1] in str(exc) and 'smz_blake3_host' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('bound')\n"
    )
    foreign = tmp_path / "libsmz_blake3_host-foreign.so"
    foreign.write_bytes(_foreign_library(tmp_path))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(foreign)], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


@pytest.mark.slow
def test_concurrent_builds_are_atomic(tmp_path: Path) -> None:
    target = tmp_path / "concurrent"
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(native.build_host_library(target))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert sorted(p.name for p in target.iterdir()) == [results[0].name, results[0].name + ".ok"]
    loaded = ctypes.CDLL(str(results[0]))
    out = ctypes.create_string_buffer(32)
    loaded.smz_blake3_host(b"abc", ctypes.c_uint64(3), out)
    assert out.raw == _ref(b"abc")


@pytest.mark.parametrize("n", SPECIAL_LENGTHS + RANDOM_LENGTHS)
def test_host_digest_matches_blake3(n: int) -> None:
    data = _data(n)
    assert native.host_digest(data) == _ref(data)


@pytest.mark.parametrize("n", SPECIAL_LENGTHS + RANDOM_LENGTHS)
def test_tree_formulations_agree(lib: ctypes.CDLL, n: int) -> None:
    """The level-wise reduction, the streaming ChunkState path and the emulation of
    the CUDA kernels' tiling plan all give the reference digest."""
    data = _data(n)
    expected = _ref(data)
    assert _call32(lib.smz_blake3_host_levelwise, data) == expected
    piece = random.Random(n).choice([0, 1, 7, 64, 65, 1000, 1024, 4096])
    assert _call32(lib.smz_blake3_host_streaming, data, piece) == expected
    assert _emulate_rows(lib, data, 1, n) == [expected]


@pytest.mark.parametrize("n", OFFICIAL_LENGTHS)
def test_official_vectors(lib: ctypes.CDLL, n: int) -> None:
    data = bytes(i % 251 for i in range(n))
    got = native.host_digest(data)
    assert got == _ref(data)
    assert _call32(lib.smz_blake3_host_levelwise, data) == got
    assert _emulate_rows(lib, data, 1, n) == [got]
    if n in OFFICIAL_HASHES:
        assert got.hex() == OFFICIAL_HASHES[n]


def test_official_hashes_are_checked() -> None:
    assert len(OFFICIAL_HASHES) >= 3
    assert set(OFFICIAL_HASHES) <= set(OFFICIAL_LENGTHS)


@pytest.mark.parametrize(("rows", "row_bytes"), ROW_SHAPES)
def test_host_rows_match_blake3(lib: ctypes.CDLL, rows: int, row_bytes: int) -> None:
    data = _data(rows * row_bytes, seed=rows * 1_000_003 + row_bytes)
    expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
    assert native.host_digest_rows(data, rows, row_bytes) == expected
    assert _emulate_rows(lib, data, rows, row_bytes) == expected


def test_random_row_batches(lib: ctypes.CDLL) -> None:
    rnd = random.Random(7)
    for _ in range(12):
        rows = rnd.randrange(1, 40)
        row_bytes = rnd.choice([rnd.randrange(0, 2048), rnd.randrange(0, 40_000)])
        data = rnd.randbytes(rows * row_bytes)
        expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        assert native.host_digest_rows(data, rows, row_bytes) == expected
        assert _emulate_rows(lib, data, rows, row_bytes) == expected


def test_keys_of_many_items_in_one_call_are_the_keys_made_one_by_one(lib: ctypes.CDLL) -> None:
    """The native keys of a batch's items, each as a node keyed by one input names it,
    are the keys Python makes: for rows named by content (a row cache's keys, from raw
    digests) and for items of any length, the empty one and ones past a chunk among them;
    none is made where there is no item."""
    from somatize.keys import before_one_key, key_after, node_head
    from somatize_torch.digest import (
        before_raw,
        keys_after_rows,
        raw_rows,
        row_digest,
        row_header,
    )

    x = torch.randn(37, 3, 5)
    raws = raw_rows(x)
    header = row_header(x)
    head = node_head(b"a node's prefix " * 20, 1)
    made = keys_after_rows(before_raw(header, 32), raws, before_one_key(head))
    assert made == [key_after(head, [row_digest(header, raw)]) for raw in raws]
    rnd = random.Random(11)
    items = [rnd.randbytes(rnd.choice([0, 1, 63, 64, 1025, 3000])) for _ in range(50)]
    inner, outer = rnd.randbytes(130), rnd.randbytes(70)

    def one(item: bytes) -> str:
        first = "blake3:" + blake3.blake3(inner + item).hexdigest()
        return "blake3:" + blake3.blake3(outer + first.encode()).hexdigest()

    assert keys_after_rows(inner, items, outer) == [one(item) for item in items]
    assert keys_after_rows(inner, [], outer) is None


def _rows_on(
    fn: ctypes._CFuncPtr, data: bytes, rows: int, row_bytes: int, width: int
) -> list[bytes]:
    out = ctypes.create_string_buffer(32 * max(rows, 1))
    assert fn(data, rows, row_bytes, out, width) == 0, width
    return [out.raw[32 * i : 32 * i + 32] for i in range(rows)]


# Rows of every tree shape the lanes meet: one chunk or less, full chunks only, a
# partial last chunk, an odd node carried up, more jobs than one vector holds, and
# rows of more chunks than one group of rows.
LANE_SHAPES = [
    *ROW_SHAPES, (9, 2048), (11, 3 * 1024), (13, 12 * 1024), (3, 12 * 1024 + 5), (8, 7 * 1024),
    (17, 48 * 1024), (2, 2049 * 1024 + 3),
]  # fmt: skip


def test_lane_widths_agree(lib: ctypes.CDLL) -> None:
    """Rows hashed on 16 lanes (AVX-512), 8 (AVX2), 4 and one at a time give the
    reference digests, on every width this CPU runs; the width chosen for it is the
    widest, and a width it cannot run is refused."""
    chosen = lib.smz_blake3_host_lane_width()
    assert chosen in (1, 4, 8, 16)
    widths = [w for w in (1, 4, 8, 16) if w <= chosen]
    for width in (8, 16):
        if width > chosen:
            assert lib.smz_blake3_host_rows_width(b"", 0, 0, None, width) == -1
    for rows, row_bytes in LANE_SHAPES:
        data = _data(rows * row_bytes, seed=rows + 7 * row_bytes)
        expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        for width in widths:
            got = _rows_on(lib.smz_blake3_host_rows_width, data, rows, row_bytes, width)
            assert got == expected, (rows, row_bytes, width)
    assert lib.smz_blake3_host_rows_width(b"", 0, 0, None, 3) == -1


def test_rows_begun_on_the_worker_are_shared_with_the_caller(lib: ctypes.CDLL) -> None:
    """Jobs queued faster than the worker hashes them: a caller waiting on the last one
    hashes its rows itself (the worker, busy with the first ones, finds none left), and
    every job's digests are right, whichever of the two wrote them; jobs given up while
    queued or half done skip their rows and never hang."""
    rows, row_bytes = 24, 40 * 1024  # four runs of rows each
    batches = [_data(rows * row_bytes, seed=k) for k in range(12)]
    expected = [
        [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)] for data in batches
    ]
    for order in (range(12), reversed(range(12))):
        outs = [ctypes.create_string_buffer(32 * rows) for _ in batches]
        jobs = [
            lib.smz_blake3_host_rows_begin(data, rows, row_bytes, out)
            for data, out in zip(batches, outs, strict=True)
        ]
        assert all(jobs)
        for k in order:
            lib.smz_blake3_host_rows_wait(jobs[k], 1)
            got = [outs[k].raw[32 * i : 32 * i + 32] for i in range(rows)]
            assert got == expected[k], k
    outs = [ctypes.create_string_buffer(32 * rows) for _ in batches]
    jobs = [
        lib.smz_blake3_host_rows_begin(data, rows, row_bytes, out)
        for data, out in zip(batches, outs, strict=True)
    ]
    for job in reversed(jobs):
        lib.smz_blake3_host_rows_wait(job, 0)
    # The worker is still there and right after jobs were given up.
    out = ctypes.create_string_buffer(32 * rows)
    lib.smz_blake3_host_rows_wait(
        lib.smz_blake3_host_rows_begin(batches[0], rows, row_bytes, out), 0
    )
    job = lib.smz_blake3_host_rows_begin(batches[1], rows, row_bytes, out)
    lib.smz_blake3_host_rows_wait(job, 1)
    assert [out.raw[32 * i : 32 * i + 32] for i in range(rows)] == expected[1]


def test_lanes_without_shuffles(tmp_path: Path) -> None:
    """The build for compilers without ``__builtin_shufflevector`` (words gathered one
    at a time, rotations by shifts) gives the same digests."""
    path = native_host._build_shared(
        tmp_path,
        native_host._HOST_SOURCES,
        (*native_host._HOST_FLAGS, "-DSMZ_LANES_NO_SHUFFLE"),
        "libsmz_blake3_plain",
    )
    plain = ctypes.CDLL(str(path))
    fn = plain.smz_blake3_host_rows_width
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int]
    for rows, row_bytes in [(13, 12 * 1024), (3, 12 * 1024 + 5), (17, 48 * 1024), (5, 1025)]:
        data = _data(rows * row_bytes, seed=row_bytes)
        expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        for width in (w for w in (4, 8, 16) if w <= plain.smz_blake3_host_lane_width()):
            assert _rows_on(fn, data, rows, row_bytes, width) == expected, (rows, row_bytes)


def test_ready_host_library_never_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no build in the cache, the first call starts one in the background and
    returns None; once it has landed, the library. Off: never; on: loaded (or built)
    right away, with no thread."""
    fresh = tmp_path / "fresh"
    monkeypatch.setenv(native.ENV_CACHE, str(fresh))
    assert native.ready_host_library() is None
    native_host._background[fresh].join(timeout=300)
    lib = native.ready_host_library()
    assert lib is not None
    assert lib is native.host_library()
    monkeypatch.setenv(native.ENV_MODE, "0")
    assert native.ready_host_library() is None
    monkeypatch.setenv(native.ENV_MODE, "1")
    other = tmp_path / "other"
    other.mkdir()
    for built in fresh.glob("*.so*"):  # the library and the record that says it is whole
        (other / built.name).write_bytes(built.read_bytes())
    monkeypatch.setenv(native.ENV_CACHE, str(other))
    assert native.ready_host_library() is not None
    assert other not in native_host._background


def test_a_background_build_lands_after_its_process_exits(tmp_path: Path) -> None:
    """A process that started the build in the background and exited before it ended
    (a short job, the first time) still leaves the library for the next one."""
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import time\n"
        "from pathlib import Path\n"
        "from somatize_torch import _native\n"
        "assert _native.ready_host_library() is None\n"
        "cache = Path(os.environ['SOMATIZE_EXT_CACHE'])\n"
        "for _ in range(600):  # until the compiler runs, then gone mid-build\n"
        "    if list(cache.glob('.*.tmp')):\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "time.sleep(0.5)\n"
        "os._exit(0)\n"
    )
    env = dict(os.environ, SOMATIZE_EXT_CACHE=str(tmp_path))
    env.pop("SOMATIZE_NATIVE", None)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    for _ in range(1200):
        if list(tmp_path.glob("libsmz_blake3_host-*.so")):
            break
        time.sleep(0.1)
    built = list(tmp_path.glob("libsmz_blake3_host-*.so"))
    assert len(built) == 1
    assert ctypes.CDLL(str(built[0])).smz_blake3_host_abi_version() == 5


def test_a_failed_background_build_keeps_the_pure_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that fails leaves rows to the ``blake3`` package, with the same digests,
    and is not tried again on every batch."""
    from somatize_torch.digest import digest_rows, digest_tensor

    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # found on PATH, and fails whatever it is asked
    batch = torch.randn(9, 3, 40)
    assert native.ready_host_library() is None
    native_host._background[tmp_path].join(timeout=300)
    assert native.ready_host_library() is None
    assert not list(tmp_path.glob("*.so"))
    assert digest_rows(batch) == [digest_tensor(row) for row in batch]


def test_a_cache_that_cannot_be_made_is_said_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache directory that cannot be made (its parent is a file) is the library being
    unavailable, said with what to do; in the background it leaves the pure path quietly."""
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "file" / "cache"))
    with pytest.raises(native.NativeUnavailableError, match="set SOMATIZE_EXT_CACHE"):
        native.host_library()
    native_host._build_in_background()  # logs, raises nothing


def _homeless(monkeypatch: pytest.MonkeyPatch, temp: Path) -> None:
    """A process with no home directory (no ``HOME``, no entry for its user), whose
    temporary directory is ``temp``."""

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv(native.ENV_CACHE, raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    monkeypatch.setattr(native_env.tempfile, "gettempdir", lambda: str(temp))
    monkeypatch.setattr(native_host, "_ready", {})  # what was found under another temp


def test_with_no_home_builds_are_cached_in_a_temporary_folder_of_the_users_own(
    tmp_path: Path, ext_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no home directory the cache is ``somatize-<uid>/ext`` in the temporary
    directory, made for this user alone, and rows are digested (by the package until the
    library is built there, then by the library).

    Where the cache is does not depend on what the compiler writes: the library is built
    there through one that copies this run's rather than compile it once more."""
    from somatize_torch.digest import digest_rows, digest_tensor

    compilers = tmp_path / "compiler"
    compilers.mkdir()
    monkeypatch.setenv("CXX", str(_copying_compiler(compilers, ext_cache)))
    _homeless(monkeypatch, tmp_path)
    expected = tmp_path / f"somatize-{os.getuid()}" / "ext"
    assert native.cache_dir() == expected
    assert (expected.parent.stat().st_mode & 0o777) == 0o700
    batch = torch.randn(5, 7)
    assert digest_rows(batch) == [digest_tensor(row) for row in batch]
    native_host._background[expected].join(timeout=300)
    assert native.ready_host_library() is not None
    assert digest_rows(batch) == [digest_tensor(row) for row in batch]


def test_with_no_home_a_temporary_folder_others_may_write_to_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``somatize-<uid>`` folder that others may write to (made by someone else to plant
    a library) is not used: the library is unavailable, said plainly, and rows are
    digested by the package."""
    from somatize_torch.digest import digest_rows, digest_tensor

    _homeless(monkeypatch, tmp_path)
    planted = tmp_path / f"somatize-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(native.NativeUnavailableError, match="nobody else may write"):
        native.cache_dir()
    assert native.ready_host_library() is None
    batch = torch.randn(5, 7)
    assert digest_rows(batch) == [digest_tensor(row) for row in batch]
    monkeypatch.setenv(native.ENV_MODE, "1")
    with pytest.raises(native.NativeUnavailableError, match=native.ENV_CACHE):
        native.ready_host_library()


def test_a_host_build_holds_no_lock_the_cuda_path_takes_and_is_stopped_if_it_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the host library compiles, the lock the CUDA extension takes is free (its
    first digest does not wait for a host compile); a compile that runs past its time is
    stopped, and the library is unavailable, said plainly."""
    hanging = tmp_path / "hanging-c++"
    hanging.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo hanging 1.0; exit 0; }\nexec sleep 60\n'
    )
    hanging.chmod(0o755)
    monkeypatch.setenv("CXX", str(hanging))
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(native_host, "_COMPILE_S", 3.0)
    failed: list[BaseException] = []

    def build() -> None:
        try:
            native.host_library()
        except BaseException as exc:
            failed.append(exc)

    builder = threading.Thread(target=build)
    started = time.monotonic()
    builder.start()
    for _ in range(200):
        if list((tmp_path / "cache").glob(".*.tmp")):
            break
        time.sleep(0.05)
    assert builder.is_alive()
    assert native_env._lock.acquire(timeout=1)  # the CUDA path's lock, free mid-compile
    native_env._lock.release()
    builder.join(timeout=120)
    assert time.monotonic() - started < 30
    assert len(failed) == 1 and isinstance(failed[0], native.NativeUnavailableError)
    assert "ran past" in str(failed[0])


@pytest.mark.parametrize("interpreter", ["", "missing-python"])
def test_a_build_with_no_interpreter_to_run_under_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interpreter: str
) -> None:
    """The build runs under this Python; where the process names none, or one that cannot
    be run (an embedded interpreter), the library is unavailable, said plainly, and not a
    cache to be made writable."""
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / interpreter) if interpreter else "")
    with pytest.raises(native.NativeUnavailableError, match=r"interpreter|cannot be run under"):
        native.host_library()
    native_host._build_in_background()  # logs, raises nothing


def _library_in_child() -> bool:
    return native.host_library() is not None


def test_a_child_forked_during_a_build_gets_the_library(lib: ctypes.CDLL) -> None:
    """The build lock held in the parent when it forks (a build under way) is not held in
    the child, which loads the library itself."""
    from tests.forked import in_forked_child

    held, done = threading.Event(), threading.Event()

    def build() -> None:  # stands for a build on another thread, holding the lock
        with native_host._build_lock, native_env._lock:
            held.set()
            done.wait(timeout=300)

    builder = threading.Thread(target=build)
    builder.start()
    held.wait(timeout=60)
    try:
        assert in_forked_child(_library_in_child) is True
    finally:
        done.set()
        builder.join()


@pytest.mark.parametrize("chunks", PLAN_CHUNKS)
def test_kernel_plan_every_tile_shape(lib: ctypes.CDLL, chunks: int) -> None:
    rows = 1 if chunks > 4096 else 3
    lengths = (
        [chunks * 1024 - 1000] if chunks > 4096 else [chunks * 1024, max(chunks * 1024 - 1000, 1)]
    )
    for row_bytes in lengths:
        data = _data(rows * row_bytes, seed=chunks)
        expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        assert _emulate_rows(lib, data, rows, row_bytes) == expected


@pytest.fixture(scope="session")
def emulator(ext_cache: Path) -> ctypes.CDLL:
    return native.kernel_emulator()


def _run_kernels(
    emu: ctypes.CDLL, data: bytes, rows: int, row_bytes: int, offset: int, max_tile_log2: int = 8
) -> tuple[list[bytes], int]:
    out = ctypes.create_string_buffer(32 * max(rows, 1))
    width = ctypes.c_int(0)
    rc = emu.smz_blake3_emu_rows(
        data, rows, row_bytes, offset, max_tile_log2, out, ctypes.byref(width)
    )
    assert rc == 0
    return [out.raw[32 * i : 32 * i + 32] for i in range(rows)], width.value


# Small shapes: the emulation runs one OS thread per CUDA thread.
EMU_SHAPES = [
    (1, 0), (3, 0), (1, 1), (5, 1), (1, 64), (1, 1023), (1, 1024), (1, 1025), (1, 3073),
    (6, 1025), (3, 1000), (17, 3000), (300, 16), (2, 4096), (1, 40 * 1024 + 17),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "row_bytes"), EMU_SHAPES)
def test_cuda_kernels_under_emulation(emulator: ctypes.CDLL, rows: int, row_bytes: int) -> None:
    """The CUDA kernels, compiled for the host, on every load-width path."""
    data = _data(rows * row_bytes, seed=rows * 7919 + row_bytes)
    expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
    for offset in (0, 1, 4, 8):
        got, width = _run_kernels(emulator, data, rows, row_bytes, offset)
        assert got == expected, (offset, width)
        # No data: no pointer to align. Otherwise the row starts decide the width.
        alignment = offset | (row_bytes if rows > 1 else 0) if data else 0
        assert width == next(w for w in (16, 8, 4, 1) if alignment % w == 0)


@pytest.mark.parametrize(
    ("rows", "row_bytes", "max_tile_log2"),
    [(1, 100 * 1024 + 5, 0), (1, 100 * 1024 + 5, 1), (3, 37 * 1024 + 1, 2), (2, 64 * 1024, 3)],
)
def test_cuda_kernel_passes_under_emulation(
    emulator: ctypes.CDLL, rows: int, row_bytes: int, max_tile_log2: int
) -> None:
    """Small tiles make small inputs take many reduce passes (scratch ping-pong)."""
    data = _data(rows * row_bytes)
    expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
    assert _run_kernels(emulator, data, rows, row_bytes, 0, max_tile_log2)[0] == expected


def test_rows_edge_cases() -> None:
    assert native.host_digest_rows(b"", 0, 0) == []
    assert native.host_digest_rows(b"", 0, 123) == []
    assert native.host_digest_rows(b"", 3, 0) == [_ref(b"")] * 3
    with pytest.raises(ValueError):
        native.host_digest_rows(b"abc", 2, 2)
    with pytest.raises(ValueError):
        native.host_digest_rows(b"", -1, 0)


def test_coop_load_layout(lib: ctypes.CDLL) -> None:
    assert lib.smz_blake3_host_coop_selftest() == 0


def test_host_digest_input_types() -> None:
    data = _data(5000)
    expected = _ref(data)
    assert native.host_digest(bytearray(data)) == expected
    assert native.host_digest(memoryview(data)) == expected
    assert native.host_digest(memoryview(bytearray(data))) == expected
    assert native.host_digest(memoryview(data)[100:]) == _ref(data[100:])
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert native.host_digest(t) == expected
    assert native.host_digest(t.view(torch.int32)[:1250].reshape(50, 25)) == expected
    assert native.host_digest(torch.empty(0)) == _ref(b"")
    with pytest.raises(ValueError):
        native.host_digest(t.view(torch.int32).reshape(50, 25).t())
    with pytest.raises(ValueError):
        native.host_digest(memoryview(data)[::2])


# --------------------------------------------------------------------------- module switches


@pytest.mark.slow
def test_import_touches_neither_torch_nor_cuda(tmp_path: Path) -> None:
    package = REPO / "somatize_torch"
    code = f"""
import sys, types
# The package without its __init__ (which imports torch): _native and the modules behind it.
stub = types.ModuleType("somatize_torch")
stub.__path__ = [{str(package)!r}]
sys.modules["somatize_torch"] = stub
import somatize_torch._native as mod
assert "torch" not in sys.modules, "torch imported at import time"
import torch
def boom(*args, **kwargs):
    raise AssertionError("CUDA touched")
torch.cuda.is_available = boom
torch.cuda.init = boom
torch.cuda._lazy_init = boom
mod.native_mode(); mod.cache_dir(); mod.csrc_dir()
assert mod.cuda_extension() is None  # SOMATIZE_NATIVE=0: no CUDA probe at all
assert mod.device_digest(torch.zeros(4)) is None
assert not torch.cuda.is_initialized()
print("clean")
"""
    env = dict(os.environ, SOMATIZE_NATIVE="0", SOMATIZE_EXT_CACHE=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def test_disabled_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV_MODE, "0")
    assert native.native_mode() == "off"
    assert native.cuda_extension() is None
    with pytest.raises(native.NativeDisabledError):
        native.host_library()
    with pytest.raises(native.NativeDisabledError):
        native.host_digest(b"abc")
    assert native.device_digest(torch.arange(10)) is None
    assert native.device_digest_rows(torch.arange(10).reshape(2, 5)) is None
    if torch.cuda.is_available():
        assert native.device_digest(torch.arange(10, device="cuda")) is None
    monkeypatch.delenv(native.ENV_MODE)
    assert native.native_mode() == "auto"
    assert native.host_digest(b"abc") == _ref(b"abc")


def test_a_cache_in_a_home_this_system_does_not_know_is_said_plainly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`SOMATIZE_EXT_CACHE` in the home of a user this system does not know (or `~` in a
    process with no home) raised a bare RuntimeError from every digest of rows: the library
    is unavailable, said naming the variable, and rows are digested by the package; with
    `SOMATIZE_NATIVE=1` that is raised."""
    from somatize_torch.digest import digest_rows, digest_tensor

    monkeypatch.setenv(native.ENV_CACHE, "~nosuchuser-somatize/ext")
    monkeypatch.delenv(native.ENV_MODE, raising=False)
    monkeypatch.setattr(native_host, "_ready", {})
    said = r"SOMATIZE_EXT_CACHE is '~nosuchuser-somatize/ext', in a home directory"
    with pytest.raises(native.NativeUnavailableError, match=said):
        native.cache_dir()
    assert native.ready_host_library() is None
    batch = torch.randn(5, 7)
    assert digest_rows(batch) == [digest_tensor(row) for row in batch]
    monkeypatch.setenv(native.ENV_MODE, "1")
    with pytest.raises(native.NativeUnavailableError, match=said):
        native.ready_host_library()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    assert native.cuda_extension() is None  # auto: quiet fallback
    assert native.device_digest(torch.arange(10)) is None
    monkeypatch.setenv(native.ENV_MODE, "1")
    with pytest.raises(native.NativeUnavailableError):
        native.cuda_extension()


def test_pinned_pool_bounds_and_reuse() -> None:
    pool = native.PinnedPool(1000)
    t = torch.arange(100, dtype=torch.int32)  # 400 bytes
    first = pool.to_host(t)
    out = first.wait()
    assert out.dtype == torch.int32 and out.shape == t.shape and torch.equal(out, t)
    assert (pool.stats.allocations, pool.held_bytes, pool.in_use_bytes) == (1, 400, 400)
    ptr = out.data_ptr()
    first.release()
    first.release()  # idempotent
    assert (pool.held_bytes, pool.in_use_bytes) == (400, 0)

    with pool.to_host(torch.ones(90, dtype=torch.int32)) as second:  # 360 bytes: reuses
        assert second.wait().data_ptr() == ptr
        assert torch.equal(second.wait(), torch.ones(90, dtype=torch.int32))
    assert pool.stats.reuses == 1

    small = pool.to_host(torch.zeros(300, dtype=torch.uint8))  # too small to reuse 400
    assert pool.stats.allocations == 2 and pool.held_bytes == 700
    small.release()

    big = pool.to_host(torch.zeros(600, dtype=torch.uint8))  # evicts oldest idle buffer(s)
    assert pool.stats.evictions >= 1 and pool.held_bytes <= 1000
    assert pool.in_use_bytes == 600

    over = pool.to_host(torch.zeros(900, dtype=torch.uint8))  # cannot fit while 600 in use
    assert pool.stats.overflows == 1 and not over.pinned
    assert torch.equal(over.wait(), torch.zeros(900, dtype=torch.uint8))
    over.release()
    too_big = pool.to_host(torch.zeros(5000, dtype=torch.uint8))
    assert pool.stats.overflows == 2
    too_big.release()
    big.release()
    assert pool.in_use_bytes == 0 and pool.held_bytes <= 1000
    pool.clear()
    assert pool.held_bytes == 0

    empty = pool.to_host(torch.empty(0, 3))
    assert empty.wait().shape == (0, 3)
    empty.release()
    scalar = pool.to_host(torch.tensor(3.5, dtype=torch.float64))
    assert scalar.wait().item() == 3.5
    scalar.release()


def test_pinned_pool_blocks_made_under_inference_mode_are_reused_outside_it() -> None:
    """A block first asked for under ``torch.inference_mode`` (a validation loop's rows) is
    an ordinary tensor, so a copy into it outside inference mode (a training step's rows,
    later) works, and is the copy asked for."""
    pool = native.PinnedPool(1 << 20)
    with torch.inference_mode():
        first = pool.to_host(torch.arange(100, dtype=torch.int32))
        assert not first.wait().is_inference()
        first.release()
    second = pool.to_host(torch.ones(90, dtype=torch.int32))
    assert pool.stats.reuses == 1
    assert torch.equal(second.wait(), torch.ones(90, dtype=torch.int32))
    second.release()


def test_a_copy_to_the_host_interrupted_hands_its_buffer_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``to_host`` interrupted after it took a buffer (Ctrl-C during the copy) gives the
    buffer back to the pool, whose budget is not left spent for good."""
    from somatize_torch import _pinned_pool

    pool = native.PinnedPool(1000)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_pinned_pool, "StagedCopy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.to_host(torch.arange(100, dtype=torch.int32))
    monkeypatch.undo()
    assert (pool.held_bytes, pool.in_use_bytes) == (400, 0)
    again = pool.to_host(torch.ones(100, dtype=torch.int32))
    assert pool.stats.reuses == 1
    again.release()


def test_a_child_forked_after_cuda_started_stages_in_ordinary_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a child forked from a process that had started CUDA (a DataLoader worker of a
    training on the GPU), CUDA cannot be used, and page-locking memory crashes the child:
    the pool stages its copies in ordinary memory there, as where there is no CUDA."""
    from somatize_torch import _pinned_pool

    pinned_asked: list[int] = []

    def allocate(nbytes: int, pinned: bool) -> torch.Tensor:
        if pinned:
            pinned_asked.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    monkeypatch.setattr(_pinned_pool.PinnedPool, "_allocate", staticmethod(allocate))
    pool = native.PinnedPool(1 << 20)
    staged = pool.to_host(torch.arange(100, dtype=torch.int32))
    assert not staged.pinned and pinned_asked == []
    assert torch.equal(staged.wait(), torch.arange(100, dtype=torch.int32))
    staged.release()
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)  # the same pool, unforked
    again = pool.to_host(torch.arange(200, dtype=torch.int32))
    assert again.pinned and pinned_asked == [800]
    again.release()


def test_pinned_pool_to_device_on_cpu() -> None:
    pool = native.PinnedPool(1 << 20)
    t = torch.randn(4, 5)
    staged = pool.to_device(t, "cpu")
    got = staged.wait()
    assert torch.equal(got, t) and got.data_ptr() != t.data_ptr()
    staged.release()
    with pytest.raises(ValueError):
        native.PinnedPool(-1)


# --------------------------------------------------------------------------- device (GPU only)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_device_digests_match_cpu() -> None:
    assert native.cuda_extension() is not None
    rnd = random.Random(99)
    sizes = [0, 1, 15, 16, 17, 1023, 1024, 1025, 4096, 65537, 1 << 20, 19 * MiB + 3]
    sizes += [rnd.randrange(0, 8 * MiB) for _ in range(10)]
    for n in sizes:
        host = torch.frombuffer(bytearray(_data(n)), dtype=torch.uint8) if n else torch.empty(0)
        host = host.to(torch.uint8)
        dev = host.cuda()
        assert native.device_digest(dev) == _ref(host.numpy().tobytes()), n
        ext = native.cuda_extension()
        assert ext is not None
        for offset in (1, 4, 8):  # misaligned views, copied by the op or digested in place
            if n > offset:
                want = _ref(host[offset:].numpy().tobytes())
                assert native.device_digest(dev[offset:]) == want
                raw = ext.blake3_digest_rows_unaligned(dev[offset:].view(1, -1))
                assert raw.numpy().tobytes() == want
    x = torch.randn(37, 19, device="cuda").t()  # non-contiguous, float
    assert native.device_digest(x) == _ref(x.contiguous().cpu().numpy().tobytes())


@pytest.mark.gpu
@needs_cuda
def test_device_row_digests_match_cpu() -> None:
    rnd = random.Random(5)
    shapes = [*ROW_SHAPES, (1000, 1), (257, 1024), (3, 5 * MiB + 9), (1, 70 * MiB + 5)]
    shapes += [(rnd.randrange(1, 300), rnd.randrange(0, 20_000)) for _ in range(10)]
    for rows, row_bytes in shapes:
        data = _data(rows * row_bytes, seed=rows + row_bytes)
        host = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0)
        dev = host.to(torch.uint8).reshape(rows, row_bytes).cuda()
        expected = [_ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        assert native.device_digest_rows(dev) == expected, (rows, row_bytes)
    assert native.device_digest_rows(torch.empty(0, 5, device="cuda")) == []


@pytest.mark.gpu
@needs_cuda
def test_pinned_pool_round_trip_on_cuda() -> None:
    pool = native.PinnedPool(64 * MiB)
    x = torch.randn(1000, 333, device="cuda")
    staged = pool.to_host(x)
    assert staged.pinned
    assert torch.equal(staged.wait(), x.cpu())
    staged.release()
    back = pool.to_device(torch.arange(12345, dtype=torch.int64), "cuda")
    assert torch.equal(back.wait().cpu(), torch.arange(12345, dtype=torch.int64))
    back.release()


def test_the_native_sources_ship_inside_the_package() -> None:
    """Every source a native build compiles is in ``somatize_torch/csrc/``, which the wheel
    carries as package data: an installed copy builds without the repository."""
    import tomllib

    import somatize_torch
    from somatize_torch import _cuda_extension, _host_library, _native

    package = Path(somatize_torch.__file__).resolve().parent
    assert _native.csrc_dir() == package / "csrc"
    needed = {
        *_host_library._HOST_SOURCES,
        *_host_library._EMU_SOURCES,
        *_cuda_extension._CUDA_UNITS,
    }
    assert all((package / "csrc" / name).is_file() for name in needed)
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text())
    assert "csrc/*" in pyproject["tool"]["setuptools"]["package-data"]["somatize_torch"]
