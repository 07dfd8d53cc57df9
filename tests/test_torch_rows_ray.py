"""A frozen encoder cached per row inside Ray actors and tasks, as a batch inference job
runs it (`ray.data.Dataset.map_batches` over an actor class holding the cache): rows
written as they come, so an actor killed or a driver reading the store next finds them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from somatize import Store
from somatize_torch import cache_rows
from somatize_torch.writer import LINGER, Writer
from tests.conftest_s3 import s3_options, s3_url
from tests.ray_encoders import Encoder, Holder, linger_in_a_task

ray = pytest.importorskip("ray", reason="these tests need ray: pip install 'somatize[ray]'")


def test_a_ray_actor_writes_rows_as_they_come(cluster: None, tmp_path: Path) -> None:
    """In a Ray actor the writer gathers no rows before it writes them, as in any worker
    process: `ray.kill`, a crash or the end of a job (the driver goes on at once) would
    otherwise leave a second of rows unwritten, for the next run to compute again."""
    actor = ray.remote(num_cpus=0)(Encoder).remote(str(tmp_path))
    features, linger = ray.get(actor.encode.remote(torch.randn(16, 8)))
    ray.kill(actor)
    assert features.shape == (16, 4)
    assert linger == 0.0
    assert Writer(Store(tmp_path)).linger == LINGER  # the driver gathers as before


def test_a_ray_task_writes_rows_as_they_come(cluster: None, tmp_path: Path) -> None:
    """So does a cache made in a plain Ray task."""
    assert ray.get(ray.remote(num_cpus=0)(linger_in_a_task).remote(str(tmp_path))) == 0.0


def test_a_cache_on_a_bucket_sent_to_an_actor_carries_none_of_its_credentials(
    cluster: None,
) -> None:
    """A cache on a bucket made in the driver and sent to an actor (Ray pickles it) carries
    none of the bucket's credentials: the actor reaches the bucket with those of its own
    environment, given through `runtime_env`, and recalls the rows the driver kept."""
    credentials = {"secret": "a-secret-no-actor-is-sent", "token": "a-token-no-actor-is-sent"}
    store = Store.on_bucket(s3_url(), **{**s3_options(), **credentials})
    torch.manual_seed(0)
    cached = cache_rows(nn.Sequential(nn.Linear(8, 4), nn.ReLU()), store)
    x = torch.randn(16, 8)
    computed = cached(x)
    cached.flush()
    sent = ray.cloudpickle.dumps(cached)
    for secret in credentials.values():
        assert secret.encode() not in sent
    environment = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    actor = ray.remote(num_cpus=0)(Holder).options(runtime_env={"env_vars": environment})
    features, from_store = ray.get(actor.remote(cached).encode.remote(x))
    assert torch.equal(features, computed)
    assert from_store == len(x)
