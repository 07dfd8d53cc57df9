"""A trainable head on a frozen encoder: what an epoch costs with per-row caching.

Two frozen encoders, each under a trainable linear head, batch 64, shuffled:

- a CNN: 4 conv blocks 3→32→64→128→256 (stride 2, BatchNorm, ReLU), global pool,
  over random 64×64 images;
- a 6-layer ``nn.TransformerEncoder`` (d_model 256, 64 tokens), whose answer is
  every token; the head mean-pools them.

Epoch times for: recomputing the encoder every step; somatize epoch 1 (empty store),
timed until its answers are durable (the writes still in flight when the last step
ends are flushed within the epoch's time; the flush is also printed on its own),
with rows keyed by content and again by index (no digest of the input to wait for:
on a GPU, a content-keyed call waits for the device to hand back its rows' digests,
an index-keyed one does not; while nothing is recalled, a content-keyed call there
queues the module's run on its whole batch before that wait, and the line under
epoch 1 says how many rows ran so); epoch 2+ from the memory tier (rows keyed by content,
and by index); epoch 2+ from the store alone in a fresh process (each round starts a
new Python process whose cached modules, by content and by index, have no memory
tiers and open the store anew, so nothing of it is held in the process: no blobs, no
pack mappings — but the OS page cache still holds what epoch 1 wrote, so this is a
store read from warm files, not from a cold disk); the content-keyed ones again with
the loader wrapped in ``somatize.torch.ahead`` (each batch's rows named on another
thread while the step before runs); and the bound — the features precomputed into
one tensor, the head reading them by index. Content keys must read every input byte
each epoch, so the time to name one epoch's rows by content (``raw_rows``, the
digest the cache computes) is timed alone too: bound + that is the floor a
content-keyed cache can reach on this machine. Every run iterates the same
DataLoader, so loading is in all of them; epochs of different kinds are interleaved
and their medians compared, so drifting load hits them alike. Targets: epoch 2+
within 1.3× of the bound from memory, within 3× from the store alone, epoch 1 (flush
included) within 1.15× of recompute.

    python bench/frozen_encoder.py [--images 2048] [--sequences 256] [--threads 1] [--repeats 5]
                                   [--device cuda] [--profile-first]

Epoch 1's line is followed by where its steps' time in the cache went: running the
module, and the rest (naming rows, looking them up, keeping them); and by the time the
store writer's thread spent writing its rows, behind the steps and in the flush, and the
staging buffers its pool made for them (page-locked memory on a GPU). ``--profile-first``
also profiles one more first epoch of each encoder and prints its costliest functions.

With ``--device cuda`` the encoders, the head and the bound's features live on the
GPU and each batch is moved there as the step begins (as a training loop does): rows
are named by the device kernel and recalled from the device tier, so the lines
"fetched ahead" (which names host batches) are left out.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import math
import pstats
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import somatize_torch.rows as rows_cache
from somatize import Store
from somatize_torch.ahead import ahead
from somatize_torch.digest import raw_rows

CPU = torch.device("cpu")
VERSION = "bench@1"  # the dataset version rows keyed by index are kept under


class ConvEncoder(nn.Module):
    """4 conv blocks 3→32→64→128→256, stride 2, BatchNorm, ReLU; global average pool."""

    def __init__(self) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = 3
        for out in (32, 64, 128, 256):
            blocks += [nn.Conv2d(width, out, 3, 2, 1), nn.BatchNorm2d(out), nn.ReLU()]
            width = out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.blocks(x)).flatten(1)


def token_encoder() -> nn.Module:
    """A 6-layer TransformerEncoder, d_model 256; its answer is every token (64 x 256)."""
    layer = nn.TransformerEncoderLayer(256, 8, dim_feedforward=1024, batch_first=True)
    return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)


class Head(nn.Module):
    """The trainable part: mean over tokens (when there are tokens), then a linear layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 10)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = features.mean(1) if features.dim() == 3 else features
        out: torch.Tensor = self.linear(pooled)
        return out


def settle_bn(encoder: nn.Module) -> None:
    """Gives the BatchNorm layers statistics that are not the identity."""
    for module in encoder.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)


def epoch(
    loader: Iterable[Any],
    head: nn.Module,
    features: Callable[[Any], torch.Tensor],
    device: torch.device = CPU,
) -> float:
    """One epoch of training ``head`` on ``features(batch)``, each batch moved to
    ``device`` first (its indices kept on the host too, last); seconds, until the device
    is done."""
    optimizer = torch.optim.SGD(head.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for batch in loader:
        if device != CPU:
            # The indices stay on the host too, last, as the DataLoader hands them: a cache
            # keyed by index reads them there, with no wait for the device.
            batch = [*(t.to(device, non_blocking=True) for t in batch), batch[1]]
        target = batch[1] % 10
        loss = loss_fn(head(features(batch)), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def make_loader(data: torch.Tensor, device: torch.device) -> DataLoader[Any]:
    """Batches of 64 samples, each with its index, shuffled the same way in every process."""
    return DataLoader(
        TensorDataset(data, torch.arange(data.shape[0])),
        batch_size=64,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        pin_memory=device.type == "cuda",
    )


def store_alone(spec_path: str, kinds: list[str]) -> None:
    """In a fresh process: one epoch from the store alone for each of ``kinds``, each with
    cached modules of its own over a ``Store`` opened anew, with no memory tiers. Prints
    the seconds and hit rates as one line of JSON."""
    spec = torch.load(spec_path, weights_only=False)
    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    encoder: nn.Module = spec["encoder"].to(device)
    loader = make_loader(spec["data"], device)
    torch.manual_seed(1)
    head = Head(spec["width"]).to(device)
    # The process warmed up (first calls, kernels, the DataLoader) on one batch through a
    # cache with no store, as a training script is by its first epoch: nothing is read
    # from the store before the timing.
    warm = rows_cache.cache_rows(encoder, None)
    epoch(itertools.islice(loader, 1), head, lambda b: warm(b[0]), device)
    warm.close()
    seconds: dict[str, float] = {}
    hit_rates: dict[str, float] = {}
    for kind in kinds:
        store = Store(spec["root"])
        if kind == "store_index":
            cached = rows_cache.cache_rows(
                encoder, store, key="index", version=VERSION, device_bytes=0, host_bytes=0
            )
            seconds[kind] = epoch(loader, head, lambda b, c=cached: c(b[0], index=b[-1]), device)
        else:
            cached = rows_cache.cache_rows(encoder, store, device_bytes=0, host_bytes=0)
            source = ahead(loader, cached) if kind == "store_ahead" else loader
            seconds[kind] = epoch(source, head, lambda b, c=cached: c(b[0]), device)
        hit_rates[kind] = cached.stats.hit_rate
        cached.close()
    print(json.dumps({"seconds": seconds, "hit_rates": hit_rates}))


def staging_buffers(cached: Any) -> tuple[int, int] | None:
    """How many staging buffers the writer of ``cached`` made and how many times it reused
    one, so far (its store's writer pool: page-locked memory on a GPU, each one made a
    costly call); None where the pool is not built."""
    writer = cached._writer
    pool = writer._backlog.pool if writer is not None else None
    if pool is None:
        return None
    return pool.stats.allocations, pool.stats.reuses


def run(
    name: str,
    encoder: nn.Module,
    data: torch.Tensor,
    repeats: int,
    device: torch.device,
    profile: bool = False,
) -> None:
    with tempfile.TemporaryDirectory(prefix="somatize-bench-") as scratch:
        run_in(Path(scratch), name, encoder, data, repeats, device, profile)


def profile_first_epoch(
    scratch: Path,
    encoder: nn.Module,
    loader: DataLoader[Any],
    head: nn.Module,
    device: torch.device,
) -> str:
    """Where one more first epoch (over a store of its own) spends its time, by function:
    what the cache does in a step beside the module, on this device."""
    cached = rows_cache.cache_rows(encoder, str(scratch / "profiled"))
    profiler = cProfile.Profile()
    profiler.enable()
    epoch(loader, head, lambda b: cached(b[0]), device)
    cached.flush()
    profiler.disable()
    cached.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    listed = textwrap.indent(out.getvalue().strip(), "    ")
    return f"  one more epoch 1, profiled (this thread only), by time in each function:\n{listed}"


def run_in(
    scratch: Path,
    name: str,
    encoder: nn.Module,
    data: torch.Tensor,
    repeats: int,
    device: torch.device,
    profile: bool = False,
) -> None:
    torch.manual_seed(1)
    encoder.eval().requires_grad_(False).to(device)
    count = data.shape[0]
    loader = make_loader(data, device)
    with torch.no_grad():
        width = encoder(data[:2].to(device)).shape[-1]
    head = Head(width).to(device)
    on_host = device == CPU

    def timed(source: Iterable[Any], features: Callable[[Any], torch.Tensor]) -> float:
        return epoch(source, head, features, device)

    def encoded(batch: Any) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = encoder(batch[0])
        return out

    # The process warmed up first, as a training script is by the time its data matter:
    # one recomputed epoch (a GPU's first one pays for choosing and loading its kernels,
    # which would flatter every ratio to recompute), and one batch through a cache over a
    # store of its own (the native code loaded, the writer started), flushed.
    timed(loader, encoded)
    warm = rows_cache.cache_rows(encoder, str(scratch / "warm"))
    timed(itertools.islice(loader, 1), lambda b: warm(b[0]))
    warm.flush()
    warm.close()
    root = str(scratch / "store")
    by_content = rows_cache.cache_rows(encoder, root)
    # Epoch 1 between two recomputed epochs: the machine's load drifts, so it is compared
    # with their mean. Its answers are made durable within its time: the writes still in
    # flight when its last step ends are part of what epoch 1 costs.
    before = timed(loader, encoded)
    stepped = timed(loader, lambda b: by_content(b[0]))
    start = time.perf_counter()
    by_content.flush()
    flushed = time.perf_counter() - start
    staging = staging_buffers(by_content)
    first_by_index = rows_cache.cache_rows(
        encoder, str(scratch / "first-by-index"), key="index", version=VERSION
    )
    start = time.perf_counter()
    timed(loader, lambda b: first_by_index(b[0], index=b[-1]))
    first_by_index.flush()
    first_index = time.perf_counter() - start
    first_by_index.close()
    first = stepped + flushed
    kept_mb = by_content.stats.bytes_kept / 1e6
    first_stats = by_content.stats  # where the steps' time in the cache went
    recompute = (before + timed(loader, encoded)) / 2
    profiled = profile_first_epoch(scratch, encoder, loader, head, device) if profile else ""

    by_index = rows_cache.cache_rows(encoder, root, key="index", version=VERSION)
    # Keys differ by kind; a batch is (inputs, indices).
    rows_cache.prefill(
        by_index, loader, inputs=lambda b: (b[0], b[1]), progress=False, device=device
    )
    with torch.no_grad():
        precomputed = torch.cat(
            [encoder(data[i : i + 256].to(device)) for i in range(0, count, 256)]
        )
    # What a fresh process needs to read the store as this one would: the same encoder
    # (so the same state digest) and the same samples.
    spec = scratch / "store_alone.pt"
    torch.save(
        {
            "encoder": encoder,
            "data": data,
            "width": width,
            "root": root,
            "device": str(device),
            "threads": torch.get_num_threads(),
        },
        spec,
    )
    alone_kinds = ["store", "store_ahead", "store_index"] if on_host else ["store", "store_index"]
    hit_rates: dict[str, list[float]] = {kind: [] for kind in alone_kinds}

    def from_store_alone(turn: int) -> dict[str, float]:
        """One epoch of each store-alone kind in a fresh process; the order turns each
        round, so that no kind is always the first in its process."""
        kinds = alone_kinds[turn % len(alone_kinds) :] + alone_kinds[: turn % len(alone_kinds)]
        done = subprocess.run(
            [sys.executable, __file__, "--store-alone", str(spec), "--kinds", ",".join(kinds)],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
        answer = json.loads(done.stdout.splitlines()[-1])
        for kind, rate in answer["hit_rates"].items():
            hit_rates[kind].append(rate)
        seconds: dict[str, float] = answer["seconds"]
        return seconds

    by_content.reset_stats()
    by_index.reset_stats()

    # Interleaved rounds, medians: each kind of epoch sees the same drift in load.
    runs: dict[str, list[float]] = {
        "memory": [],
        "memory_ahead": [],
        "index": [],
        "store": [],
        "store_ahead": [],
        "store_index": [],
        "bound": [],
        "naming": [],
    }
    inputs = [batch[0].to(device) for batch in loader]

    def naming() -> float:
        start = time.perf_counter()
        for x in inputs:
            raw_rows(x)
        return time.perf_counter() - start

    for turn in range(repeats):
        runs["naming"].append(naming())
        runs["bound"].append(timed(loader, lambda b: precomputed[b[1]]))
        runs["memory"].append(timed(loader, lambda b: by_content(b[0])))
        runs["index"].append(timed(loader, lambda b: by_index(b[0], index=b[-1])))
        for kind, seconds in from_store_alone(turn).items():
            runs[kind].append(seconds)
        if on_host:
            runs["memory_ahead"].append(
                timed(ahead(loader, by_content), lambda b: by_content(b[0]))
            )
    memory, memory_ahead, memory_index, from_store, store_ahead, store_index, bound, named = (
        statistics.median(runs[kind]) if runs[kind] else math.nan
        for kind in (
            "memory",
            "memory_ahead",
            "index",
            "store",
            "store_ahead",
            "store_index",
            "bound",
            "naming",
        )
    )
    content_stats, index_stats = by_content.stats, by_index.stats
    content_epochs = len(runs["memory"]) + len(runs["memory_ahead"])
    store_hit_rate = min(rate for rates in hit_rates.values() for rate in rates)
    for cached in (by_content, by_index):
        cached.close()

    def line(
        label: str, seconds: float, against: str = "", target: str = "", note: str = ""
    ) -> None:
        ratio = ""
        if against:
            peer = recompute if against == "recompute" else bound
            ratio = f"   {seconds / peer:5.2f}x {against:<9}"
        aim = f"   (target <= {target})" if target else f"   {note}" if note else ""
        print(f"  {label:<48} {seconds * 1e3:9.1f} ms{ratio}{aim}")

    print(f"\n{name}: {count} samples, batch 64, shuffled")
    line("recompute (mean of 2)", recompute)
    line("somatize epoch 1, flush included", first, "recompute", "1.15x")
    line("  ... its steps alone", stepped, "recompute")
    line("  ... the flush after them", flushed)
    line("  ... in its steps, the module ran", first_stats.compute_s)
    line("  ... in its steps, the cache's own work", first_stats.lookup_s)
    line("  ... behind them, the writer's thread", first_stats.write_s)
    if staging is not None:
        made, reused = staging
        print(
            f"  {'  ... staging buffers made, for rows to write':<48} {made:9d}"
            f"      ({reused} reused; on a GPU each made is page-locked)"
        )
    print(
        f"  {'  ... rows run before they were named':<48} {first_stats.ran_ahead:9d}"
        f"      (of {first_stats.rows}; only on a GPU, while nothing is recalled)"
    )
    line("  ... keyed by index instead, flush included", first_index, "recompute", "1.15x")
    line("epoch 2+, memory tier, by content", memory, "bound", "1.3x")
    if on_host:
        line("  ... fetched ahead", memory_ahead, "bound", "1.3x")
    line("epoch 2+, memory tier, by index", memory_index, "bound", "1.3x")
    line("epoch 2+, store alone (new process), by content", from_store, "bound", "3x")
    if on_host:
        line("  ... fetched ahead", store_ahead, "bound", "3x")
    line("epoch 2+, store alone (new process), by index", store_index, "bound", "3x")
    line("bound (precomputed, head only)", bound)
    line("naming one epoch's rows by content", named)
    line(
        "  ... bound + naming",
        bound + named,
        "bound",
        note="the floor for content keys named in the step",
    )
    print(f"  {'recompute / epoch 2+ memory, by content':<48} {recompute / memory:9.1f}x")
    print(
        f"  epoch 2+ hit rates: content {content_stats.hit_rate:.3f} "
        f"(lookup {content_stats.lookup_s * 1e3 / content_epochs:.1f} ms an epoch, mean of its "
        f"{content_epochs} epochs; {content_stats.ran_ahead} rows run before they were named), "
        f"index {index_stats.hit_rate:.3f}, store alone (lowest) {store_hit_rate:.3f}; "
        f"epoch 1 kept {kept_mb:.1f} MB"
    )
    if profiled:
        print(profiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU")
    parser.add_argument(
        "--profile-first", action="store_true", help="also profile one more epoch 1 of each"
    )
    # The fresh process's part: what it reads, and which epochs it times.
    parser.add_argument("--store-alone", help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.store_alone:
        store_alone(args.store_alone, args.kinds.split(","))
        return
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, torch.set_num_threads({args.threads}), {where}")
    torch.manual_seed(0)
    cnn = ConvEncoder()
    settle_bn(cnn)
    images = torch.randn(args.images, 3, 64, 64)
    run("CNN encoder (64x64 images)", cnn, images, args.repeats, device, args.profile_first)
    torch.manual_seed(0)
    run(
        "Transformer encoder (6 layers, d_model 256, 64 tokens)",
        token_encoder(),
        torch.randn(args.sequences, 64, 256),
        args.repeats,
        device,
        args.profile_first,
    )


if __name__ == "__main__":
    main()
