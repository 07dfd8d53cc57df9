"""Ranks of a process group (gloo, on 127.0.0.1) that run a model sharded by FSDP around a
frozen, cached encoder, for the tests of how the cache meets FSDP's parameters: each rank
a spawned process, answering what it saw."""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import somatize.torch as smt


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def run_ranks(
    target: Callable[..., Any], *args: Any, world: int = 2, timeout: float = 60
) -> list[Any]:
    """What ``target(rank, *args)`` returns on each rank of a gloo process group of
    ``world`` spawned processes; fails the test if a rank hangs past ``timeout`` seconds
    or dies."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [
        context.Process(target=_rank, args=(target, rank, world, port, args, results))
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    answers = dict(results.get(timeout=timeout) for _ in ranks)
    for process in ranks:
        process.join(timeout=timeout)
        if process.is_alive():
            process.kill()
            pytest.fail(f"a rank running {target.__name__} hung")
    failed = {rank: answer for rank, answer in answers.items() if isinstance(answer, str)}
    assert not failed, f"ranks failed: {failed}"
    return [answers[rank] for rank in range(world)]


def _rank(
    target: Callable[..., Any],
    rank: int,
    world: int,
    port: int,
    args: tuple[Any, ...],
    results: Any,
) -> None:
    import traceback

    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results.put((rank, target(rank, *args)))
    except BaseException:
        results.put((rank, traceback.format_exc(limit=-3)))  # the last frames say enough
    finally:
        dist.destroy_process_group()


def cached_model(how: str, store: str) -> tuple[Classifier, nn.Module]:
    """A classifier whose encoder is frozen and cached (``rows``: per row, ``wrap``: the
    model wrapped), and the module to shard: the model, or the wrapped model."""
    torch.manual_seed(0)
    model = Classifier()
    if how == "rows":
        model.encoder = smt.cache_rows(model.encoder, store=store)  # type: ignore[assignment]
        return model, model
    wrapped = smt.wrap(model, frozen=["encoder"], cached=["encoder"], store=store)
    smt.freeze(wrapped)
    return model, wrapped


def plain_encoder() -> Encoder:
    """The encoder :func:`cached_model` starts from, uncached, in eval."""
    torch.manual_seed(0)
    return Classifier().encoder.eval()


def batch(rank: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))


def recalled(model: Classifier, top: nn.Module, how: str) -> int:
    """How many rows (``rows``) or calls (``wrap``) of the encoder were recalled so far."""
    if how == "rows":
        stats = model.encoder.stats  # type: ignore[attr-defined]
        return int(stats.from_device + stats.from_host + stats.from_store)
    return int(top.counts["encoder"].get("recalled", 0))


def fsdp1_training(rank: int, how: str, store: str) -> dict[str, Any]:
    """Two training steps of FSDP1 (``use_orig_params=True``) sharding the classifier as
    one unit, the frozen, cached encoder beside the trained head: whether each answered
    as the plain classifier does, and how much of the encoder was recalled."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    model, top = cached_model(how, store)
    sharded = FullyShardedDataParallel(top, use_orig_params=True, device_id=torch.device("cpu"))
    optimizer = torch.optim.SGD([p for p in sharded.parameters() if p.requires_grad], lr=0.1)
    torch.manual_seed(0)
    plain = Classifier().eval()
    x = batch(rank)
    same = []
    for _ in range(2):
        optimizer.zero_grad()
        out = sharded(x)
        with torch.no_grad():
            same.append(torch.allclose(out, plain(x), atol=1e-6))
        out.pow(2).mean().backward()
        # Not stepped: the head stays as the plain classifier's, to compare answers.
    optimizer.step()
    return {"same": same, "recalled": recalled(model, top, how)}


def fsdp2() -> Any:
    """torch's FSDP2: ``fully_shard``, ``DTensor`` and ``distribute_tensor``, from where this
    torch has them (public from torch 2.6 on, under ``_composable`` and ``_tensor`` in
    torch 2.4)."""
    try:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, distribute_tensor
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
        from torch.distributed._tensor import DTensor, distribute_tensor
    return fully_shard, DTensor, distribute_tensor


def fsdp2_loading(rank: int, how: str, store: str) -> dict[str, Any]:
    """FSDP2 (``fully_shard``) sharding the classifier, called, then loaded with other
    encoder weights and called again: whether each call answered as the plain classifier
    holding those weights does."""
    fully_shard, DTensor, distribute_tensor = fsdp2()
    _, top = cached_model(how, store)
    fully_shard(top)
    torch.manual_seed(0)
    plain = Classifier().eval()
    x = batch(rank)
    same = []
    with torch.no_grad():
        for _ in range(2):
            same.append(torch.allclose(top(x), plain(x), atol=1e-6))
        sharded = top.state_dict()
        full = {name: t.full_tensor() for name, t in sharded.items() if isinstance(t, DTensor)}
        other = {n: t * 3 if n.startswith("encoder.") else t for n, t in full.items()}
        top.load_state_dict(
            {
                n: distribute_tensor(t, sharded[n].device_mesh, sharded[n].placements)
                for n, t in other.items()
            }
        )
        plain.load_state_dict(other)
        same.append(torch.allclose(top(x), plain(x), atol=1e-6))
    return {"same": same}


def fsdp1_watching(rank: int, how: str, store: str) -> dict[str, Any]:
    """FSDP1 (``use_orig_params=True``) sharding the classifier, called three times, then
    its encoder's weights loaded anew (``load_state_dict``) and called, then written in
    place between forwards and called: how many times the encoder's weights were digested
    after each of the first three calls, and whether each call after a change answered
    as the plain classifier holding those weights does."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    import somatize_torch._state as state

    digests = [0]
    digest_named = state.digest_named

    def counted(tensors: dict[str, torch.Tensor], what: str) -> str:
        digests[0] += 1
        return digest_named(tensors, what)

    state.digest_named = counted  # type: ignore[assignment]  # a spawned rank's own module
    model, top = cached_model(how, store)
    sharded = FullyShardedDataParallel(top, use_orig_params=True, device_id=torch.device("cpu"))
    torch.manual_seed(0)
    plain = Classifier().eval()
    x = batch(rank)
    counts, same = [], []
    with torch.no_grad():
        for _ in range(3):
            sharded(x)
            counts.append(digests[0])
        loaded = {
            n: t * 3 if ".encoder." in f".{n}" else t for n, t in sharded.state_dict().items()
        }
        sharded.load_state_dict(loaded)
        plain.encoder.linear.weight.mul_(3)
        plain.encoder.linear.bias.mul_(3)
        same.append(torch.allclose(sharded(x), plain(x), atol=1e-6))
        with FullyShardedDataParallel.summon_full_params(sharded):
            model.encoder.linear.weight.mul_(0.5)  # written back to the shards after
        plain.encoder.linear.weight.mul_(0.5)
        same.append(torch.allclose(sharded(x), plain(x), atol=1e-6))
    return {"digests": counts, "same": same}
