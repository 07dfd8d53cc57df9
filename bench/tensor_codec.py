"""The tensor codec and freeze, against the plainest peers in the same run.

1. Write and recall of a 19 MB tensor answer (32x3x224x224 float32) through the
   `tensor` codec, against writing and reading the tensor's raw bytes to and
   from a plain file, and the whole ``store.keep`` (codec, digest, publish). Recall
   is followed by the same consumer on both sides (a sum over the tensor), so the
   memory-mapped side pays for touching its pages.
   Also shown: `safetensors.torch.save` to bytes, the detour the codec avoids.
2. `somatize.torch.freeze` of a 100 MB model against one BLAKE3 pass over the same
   bytes laid end to end, on one thread and on all cores; the faster of the two is the
   bound (on a small machine, threads can cost more than they give). The three are
   called in turn, round by round, so load that comes and goes falls on all alike.

Prints medians and ratios (peer time / our time, so higher is better);
targets: write and recall ≥ 0.8 of the plain file, freeze close to one pass.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import blake3
import safetensors.torch
import torch
from timing import interleaved_s, median_us
from torch import nn

import somatize.torch as smt
from somatize import Graph, Store


def median_s(call: Callable[[], Any], repeats: int = 7, warm: int = 2) -> float:
    return median_us(call, repeats, warm) / 1e6


def codec_round_trip(where: str) -> None:
    tensor = torch.randn(32, 3, 224, 224)
    megabytes = tensor.numel() * tensor.element_size() / 1e6
    store = Store(os.path.join(where, "store"))
    key = "blake3:" + "7" * 64
    store.keep(key, smt.TENSOR.encode(tensor), "tensor")
    plain_path = os.path.join(where, "plain.bin")

    def plain_write() -> None:
        with open(plain_path, "wb") as out:
            out.write(memoryview(tensor.numpy()))

    def codec_write() -> None:
        with open(os.path.join(where, "codec.bin"), "wb") as out:
            for piece in smt.TENSOR.encode(tensor):
                out.write(piece)

    fresh = iter(range(1_000_000))

    def store_keep() -> None:
        # A new store each time: an equal blob already kept would not be written again.
        Store(os.path.join(where, f"keep{next(fresh)}")).keep(
            key, smt.TENSOR.encode(tensor), "tensor"
        )

    def safetensors_write() -> None:
        with open(os.path.join(where, "st.bin"), "wb") as out:
            out.write(safetensors.torch.save({"tensor": tensor}))

    def plain_read() -> float:
        raw = bytearray(os.path.getsize(plain_path))
        with open(plain_path, "rb") as handle:
            handle.readinto(raw)
        return float(torch.frombuffer(raw, dtype=torch.float32).sum())

    def store_recall() -> float:
        _, data = store.recall(key)
        return float(smt.TENSOR.decode(data).sum())

    plain_w = median_s(plain_write)
    codec_w = median_s(codec_write)
    keep_w = median_s(store_keep)
    st_w = median_s(safetensors_write, repeats=3, warm=1)
    plain_r = median_s(plain_read)
    recall_r = median_s(store_recall)
    print(f"19 MB tensor ({megabytes:.1f} MB), medians:")
    print(
        f"  plain file write        {plain_w * 1e3:8.2f} ms  {megabytes / plain_w / 1e3:6.2f} GB/s"
    )
    print(
        f"  codec write to a file   {codec_w * 1e3:8.2f} ms  {megabytes / codec_w / 1e3:6.2f} GB/s"
        f"   ratio {plain_w / codec_w:.2f}"
    )
    print(
        f"  store.keep (codec + digest + publish) {keep_w * 1e3:8.2f} ms"
        f"   ratio {plain_w / keep_w:.2f}"
    )
    print(f"  safetensors.save→bytes→file {st_w * 1e3:8.2f} ms   ratio {plain_w / st_w:.2f}")
    print(f"  plain file read + sum   {plain_r * 1e3:8.2f} ms")
    print(
        f"  store recall + sum      {recall_r * 1e3:8.2f} ms   ratio {plain_r / recall_r:.2f}"
        " (zero-copy from the memory map)"
    )


def freeze_100mb() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1580, 1580) for _ in range(10)])
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    view = memoryview(flat.view(torch.uint8).numpy())
    g = Graph.somatize(smt.ModuleNode(model).named("model").frozen())

    def one_thread() -> None:
        blake3.blake3(view).digest()

    def all_cores() -> None:
        blake3.blake3(view, max_threads=blake3.blake3.AUTO).digest()

    def freeze() -> None:
        smt.freeze(g)

    single, multi, frozen = interleaved_s([one_thread, all_cores, freeze], repeats=15)
    bound = min(single, multi)
    print(f"freeze of a {size / 1e6:.0f} MB model, medians of 15 calls in turn:")
    print(f"  one BLAKE3 pass (one thread) {single * 1e3:8.2f} ms")
    print(f"  one BLAKE3 pass (all cores)  {multi * 1e3:8.2f} ms")
    print(
        f"  somatize.torch.freeze        {frozen * 1e3:8.2f} ms"
        f"   ratio {bound / frozen:.2f} (the faster pass / freeze)"
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as where:
        codec_round_trip(where)
    freeze_100mb()
