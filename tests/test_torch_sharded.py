"""A frozen, cached encoder inside a model FSDP shards (gloo, on 127.0.0.1, two ranks):
it is cached as outside it, and a change of its weights made through the sharded model
is seen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp
from torch import nn

import somatize.torch as smt
from somatize_torch._state import own_parameters, trainable_parameters
from tests.sharded import (
    Classifier,
    Encoder,
    fsdp1_training,
    fsdp1_watching,
    fsdp2,
    fsdp2_loading,
    run_ranks,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available(), reason="torch built without torch.distributed"),
]


@pytest.mark.parametrize("how", ["rows", "wrap"])
def test_fsdp1_shards_a_frozen_cached_encoder_beside_a_trained_head(
    tmp_path: Path, how: str
) -> None:
    """FSDP1 with ``use_orig_params=True`` holding the frozen, cached encoder in one unit
    with the trained head (whose views of the encoder's weights require grad) trains:
    every answer is the plain model's, and the second step recalls the encoder's."""
    for answer in run_ranks(fsdp1_training, how, str(tmp_path / "store")):
        assert answer["same"] == [True, True]
        assert answer["recalled"] == (4 if how == "rows" else 1)


@pytest.mark.parametrize("how", ["rows", "wrap"])
def test_fsdp1_digests_an_unchanged_encoder_once_and_sees_its_weights_change(
    tmp_path: Path, how: str
) -> None:
    """FSDP1 puts new views of the encoder's weights in their place at each forward: the
    same weights all the same, not digested again at the second and third calls; weights
    loaded into the sharded model, or written in place where FSDP gathers them
    (``summon_full_params``), are seen at the next call, which answers as the plain model
    holding them does."""
    for answer in run_ranks(fsdp1_watching, how, str(tmp_path / "store")):
        first, *later = answer["digests"]
        assert first > 0
        assert later == [first, first]
        assert answer["same"] == [True, True]


@pytest.mark.skipif(
    not hasattr(torch.distributed.fsdp, "fully_shard") and not torch.cuda.is_available(),
    reason="needs torch >= 2.6 on a host without CUDA: FSDP2 in torch 2.4 runs on CUDA only",
)
@pytest.mark.parametrize("how", ["rows", "wrap"])
def test_fsdp2_sees_encoder_weights_loaded_into_the_sharded_model(tmp_path: Path, how: str) -> None:
    """Weights loaded into a model ``fully_shard`` shards (``load_state_dict``) reach the
    cached encoder: its next answer is the one the new weights compute, not one recalled
    of the old (FSDP2 gathers them into the same parameters, their version counters put
    back)."""
    for answer in run_ranks(fsdp2_loading, how, str(tmp_path / "store")):
        assert answer["same"] == [True, True, True]


def test_own_parameters_of_a_module_fsdp_never_held_are_all_its_parameters() -> None:
    """A module no FSDP holds, a TorchScript one too (whose parts cannot be looked up by
    name), has all its parameters as its own, frozen and trained alike."""
    plain = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    plain[0].requires_grad_(False)
    for module in (plain, torch.jit.script(plain)):
        assert [name for name, _ in own_parameters(module)] == [
            "0.weight",
            "0.bias",
            "1.weight",
            "1.bias",
        ]
        assert [name for name, _ in trainable_parameters(module)] == ["1.weight", "1.bias"]


def test_a_module_fsdp2_shards_is_refused_saying_to_shard_the_model_holding_the_cache(
    tmp_path: Path,
) -> None:
    """``fully_shard`` holds a module's parameters as ``DTensor``s, this rank's shard of
    each: an encoder sharded before it is cached, or sharded on its own inside a wrapped
    model, is refused naming ``DTensor`` and saying to cache or wrap before sharding and
    to shard the model holding the cache, not to hold plain tensors, which FSDP2 puts
    back at once."""
    fully_shard, _, _ = fsdp2()
    advice = r"`DTensor`s.*before `fully_shard`.*the whole wrapped model"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        encoder = Encoder()
        fully_shard(encoder)
        with pytest.raises(smt.FreezeError, match=advice) as refused:
            smt.cache_rows(encoder, store=str(tmp_path / "store"))
        assert "as_subclass" not in str(refused.value)
        model = Classifier()
        wrapped = smt.wrap(
            model, frozen=["encoder"], cached=["encoder"], store=str(tmp_path / "store")
        )
        smt.freeze(wrapped)
        fully_shard(model.encoder)
        with pytest.raises(smt.FreezeError, match=advice), torch.no_grad():
            wrapped(torch.randn(2, 16))
    finally:
        dist.destroy_process_group()


def test_a_dtensor_is_known_where_torch_2_4_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch 2.4 writes ``DTensor`` in ``torch.distributed._tensor``, beside a
    ``torch.distributed.tensor`` without it: a tensor of that class is known as one there,
    so a module FSDP2 shards is refused as it is in a later torch, not failing in the
    library."""
    import types

    from somatize_torch._sharding import is_dtensor

    class DTensor(torch.Tensor):
        """Stands for torch 2.4's ``DTensor``."""

    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", types.ModuleType("tensor"))
    older = types.ModuleType("_tensor")
    older.DTensor = DTensor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed._tensor", older)
    assert is_dtensor(torch.zeros(2).as_subclass(DTensor))
    assert not is_dtensor(torch.zeros(2))
