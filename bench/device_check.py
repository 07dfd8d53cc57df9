"""Correctness checks and figures for somatize's native BLAKE3 code.

    python bench/device_check.py [--no-figures] [--max-bytes N]

Always: the host library's digests against the ``blake3`` package.
With a CUDA device: builds the CUDA extension, checks device digests (random
sizes, misaligned views, row batches) against ``blake3`` on the CPU, then prints
GB/s for 1 MiB, 19 MiB, 256 MiB and 4 GiB buffers: device BLAKE3 (kernels incl.
launch, median of several runs, CUDA events), copy-to-host + multi-threaded
``blake3`` on the CPU, and a device-to-device copy of the same size; the ratio
device digest / device copy; the 19 MiB digest time; pinned vs pageable
host<->device transfer rates.

Exit status: 0 when every digest matched, 1 on any mismatch, 2 when the CUDA
extension could not be built on a machine with a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from somatize_torch import _native as native  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FIGURE_SIZES = [(MiB, "1 MiB"), (19 * MiB, "19 MiB"), (256 * MiB, "256 MiB"), (4 * GiB, "4 GiB")]


class Tally:
    def __init__(self, name: str) -> None:
        self.name = name
        self.passed = 0
        self.failed: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"  FAIL {self.name}: {what}", flush=True)

    def report(self) -> bool:
        print(f"{self.name}: PASS {self.passed}  FAIL {len(self.failed)}", flush=True)
        return not self.failed


def ref(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()


def host_checks() -> bool:
    tally = Tally("host library vs blake3")
    rnd = random.Random(1)
    sizes = [0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 3072, 4095, 4096, 4097]
    sizes += [(1 << k) + d for k in range(11, 24) for d in (-1, 1)]
    sizes += [rnd.randrange(0, 4 * MiB) for _ in range(20)]
    for n in sizes:
        data = rnd.randbytes(n)
        tally.check(native.host_digest(data) == ref(data), f"len {n}")
    for rows, row_bytes in [(3, 0), (5, 1), (7, 1024), (4, 1025), (3, 4096), (3, 1000), (9, 33333)]:
        data = rnd.randbytes(rows * row_bytes)
        want = [ref(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(rows)]
        tally.check(native.host_digest_rows(data, rows, row_bytes) == want, f"{rows}x{row_bytes}")
    lib = native.host_library()
    tally.check(lib.smz_blake3_host_coop_selftest() == 0, "cooperative load layout")
    return tally.report()


def random_device_bytes(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)


def host_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().cpu().numpy().tobytes()


def device_checks(ext: Any) -> bool:
    tally = Tally("device digests vs blake3 on CPU")
    rnd = random.Random(2)
    sizes = [0, 1, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 2048, 2049, 4096, 65535, 65537]
    sizes += [MiB, 19 * MiB, 19 * MiB + 7, 64 * MiB + 1, 256 * MiB + 3]
    sizes += [rnd.randrange(0, 32 * MiB) for _ in range(25)]
    for i, n in enumerate(sizes):
        x = random_device_bytes(n, seed=i)
        want = ref(host_bytes(x))
        tally.check(native.device_digest(x) == want, f"len {n}")
        for off in (1, 4, 8):  # misaligned views: copied by the op, or digested in place
            if n > off:
                v = x[off:]
                want_v = ref(host_bytes(v))
                tally.check(native.device_digest(v) == want_v, f"len {n} offset {off}")
                raw = ext.blake3_digest_rows_unaligned(v.view(1, -1)).numpy().tobytes()
                tally.check(raw == want_v, f"len {n} offset {off} narrow loads")
    shapes = [(1, 0), (9, 0), (1000, 1), (64, 64), (33, 1023), (7, 1024), (6, 1025), (3, 1000)]
    shapes += [(17, 3000), (5, 4096), (300, 4100), (3, 2049 * KiB), (2, 19 * MiB + 5)]
    shapes += [(rnd.randrange(1, 500), rnd.randrange(0, 40_000)) for _ in range(15)]
    for i, (rows, row_bytes) in enumerate(shapes):
        x = random_device_bytes(rows * row_bytes, seed=1000 + i).reshape(rows, row_bytes)
        host = host_bytes(x)
        want = [ref(host[r * row_bytes : (r + 1) * row_bytes]) for r in range(rows)]
        tally.check(native.device_digest_rows(x) == want, f"rows {rows}x{row_bytes}")
    y = torch.randn(333, 77, device="cuda").t()  # non-contiguous float tensor
    tally.check(native.device_digest(y) == ref(host_bytes(y)), "non-contiguous float32")
    return tally.report()


def cuda_time_ms(fn: Callable[[], object], runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_time_ms(fn: Callable[[], object], runs: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("inf")


def figures(ext: Any, max_bytes: int) -> bool:
    ok = True
    free, _ = torch.cuda.mem_get_info()
    print(
        "\nsize      device-b3 GB/s   ms      host(copy+b3) GB/s  d2d-copy GB/s  b3/d2d"
        "  device/host"
    )
    for n, label in FIGURE_SIZES:
        if n > max_bytes or 2.2 * n > free:
            print(f"{label:8s}  skipped (limit {max_bytes} bytes, {free} free on device)")
            continue
        x = random_device_bytes(n, seed=n)
        x2d = x.view(1, n)
        runs = 10 if n <= 256 * MiB else 4
        dev_ms = cuda_time_ms(lambda x2d=x2d: ext.blake3_digest_rows_async(x2d), runs)
        y = torch.empty_like(x)
        d2d_ms = cuda_time_ms(lambda x=x, y=y: y.copy_(x), runs)
        del y
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host_view = memoryview(pinned.numpy()).cast("B")

        def host_path(x: torch.Tensor = x, pinned: torch.Tensor = pinned) -> bytes:
            pinned.copy_(x)
            return ref(memoryview(pinned.numpy()).cast("B"))

        host_ms = wall_time_ms(host_path, 3 if n <= 256 * MiB else 1)
        want = ref(host_view)  # pinned holds x after host_path
        got = ext.blake3_digest(x)
        match = bytes(got.numpy().tobytes()) == want
        ok &= match
        del pinned, host_view
        ratio = gbps(n, dev_ms) / gbps(n, d2d_ms)
        print(
            f"{label:8s}  {gbps(n, dev_ms):12.1f}  {dev_ms:8.3f}  {gbps(n, host_ms):14.2f}"
            f"  {gbps(n, d2d_ms):12.1f}  {ratio:6.1%}  {host_ms / dev_ms:10.1f}x"
            f"  {'digest ok' if match else 'DIGEST MISMATCH'}"
        )
        if n == 19 * MiB:
            sync_ms = wall_time_ms(lambda x=x: ext.blake3_digest(x), 10)
            print(
                f"          19 MiB: {dev_ms:.3f} ms on the device (launches incl.),"
                f" {sync_ms:.3f} ms wall incl. the digest's copy to the host; target < 1 ms:"
                f" {'met' if dev_ms < 1.0 else 'MISSED'}"
            )
        if n >= 256 * MiB:
            print(f"          >= 256 MiB target 25% of d2d: {'met' if ratio >= 0.25 else 'MISSED'}")
        del x, x2d
        torch.cuda.empty_cache()

    n = min(256 * MiB, max_bytes)
    print(f"\nhost<->device transfers, {n // MiB} MiB")
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    pageable = torch.empty(n, dtype=torch.uint8)
    pageable.fill_(7)
    pool = native.PinnedPool(2 * n)
    staged = pool.to_host(dev)
    staged.wait()
    print(f"  staging pool buffer page-locked: {staged.pinned}")
    pinned = staged.wait()
    rows = []
    for direction in ("H2D", "D2H"):
        res = {}
        for kind, host in (("pageable", pageable), ("pinned", pinned)):
            if direction == "H2D":
                ms = wall_time_ms(lambda h=host: dev.copy_(h, non_blocking=True), 5)
            else:
                ms = wall_time_ms(lambda h=host: h.copy_(dev, non_blocking=True), 5)
            res[kind] = gbps(n, ms)
        rows.append((direction, res["pageable"], res["pinned"]))
    staged.release()
    for direction, pag, pin in rows:
        print(f"  {direction}: pageable {pag:6.1f} GB/s  pinned {pin:6.1f} GB/s  pinned/pageable"
              f" {pin / pag:5.2f}x")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-figures", action="store_true", help="checks only")
    parser.add_argument(
        "--max-bytes", type=int, default=4 * GiB, help="largest buffer for the figures"
    )
    args = parser.parse_args()

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), blake3 {blake3.__version__}")
    ok = host_checks()
    if torch.version.cuda is None or not torch.cuda.is_available():
        print(
            "\nNo CUDA device here: device digests, GB/s figures and transfer rates need a GPU"
            " (host-library checks only)."
        )
        return 0 if ok else 1

    print(f"device: {torch.cuda.get_device_name()}")
    os.environ[native.ENV_MODE] = "1"  # build or fail loudly
    t0 = time.perf_counter()
    try:
        ext = native.cuda_extension()
    except native.NativeUnavailableError as exc:
        print(f"CUDA extension build FAILED: {exc.__cause__ or exc}")
        return 2
    print(f"CUDA extension ready in {time.perf_counter() - t0:.1f} s ({ext})")
    ok &= device_checks(ext)
    if not args.no_figures:
        ok &= figures(ext, args.max_bytes)
    print("\nALL PASS" if ok else "\nMISMATCHES FOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
