"""Workers: the places a broker can run a node, as the user describes them.

A worker is a name in a graph (``node.at("w1")``) and a description here of what
stands behind the name: how values reach it, and what it needs from a cluster.

``mode="local"`` hands Python objects across, as a thread in the same process
would; ``mode="network"`` sends every value through its codec and rebuilds the
node from its blueprint on the other side, exactly as if a wire were between
them — which is what a Ray worker always does, so a graph that runs with
network workers in one process runs on a cluster too. The resources
(``num_cpus``, ``num_gpus``, custom ``resources``) are what a cluster must set
aside for the worker; the embedded broker has no use for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from somatize._numbers import finite
from somatize.errors import SomatizeError

__all__ = ["BadWorker", "Mode", "Worker"]

Mode = Literal["local", "network"]


class BadWorker(SomatizeError, ValueError):
    """A worker described with a mode or resources that cannot be honoured."""


@dataclass(frozen=True)
class Worker:
    """What stands behind one worker name."""

    mode: Mode = "network"
    """``local``: Python objects cross as they are. ``network``: values cross as codec
    bytes and the node is rebuilt from its blueprint on the worker's side."""
    num_cpus: float | None = None
    """CPUs a cluster sets aside for the worker (its default when None)."""
    num_gpus: float | None = None
    """GPUs a cluster sets aside for the worker (none when None)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom resources a cluster must find on the machine the worker lands on."""

    def __post_init__(self) -> None:
        if self.mode not in ("local", "network"):
            raise BadWorker(
                f"a worker's mode is `local` (Python objects cross as they are) or `network` "
                f"(values cross as codec bytes, as over a wire); got {self.mode!r}"
            )
        for what, amount in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus)):
            if amount is not None and not _an_amount(amount):
                raise BadWorker(
                    f"{what} is a finite number ≥ 0 (or None: the cluster's default), got "
                    f"{amount!r}"
                )
        if not isinstance(self.resources, Mapping):
            raise BadWorker(
                f"resources map names to finite amounts ≥ 0, got {self.resources!r} (a "
                f'`{type(self.resources).__name__}`); e.g. `resources={{"accelerator": 1}}`'
            )
        for name, amount in self.resources.items():
            if not isinstance(name, str) or not _an_amount(amount):
                raise BadWorker(
                    f"resources map names to finite amounts ≥ 0, got {name!r}: {amount!r}; e.g. "
                    '`resources={"accelerator": 1}`'
                )

    @classmethod
    def generic(
        cls,
        mode: Mode = "network",
        *,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> Worker:
        """A worker that runs any node: ``Worker.generic(mode="network", num_gpus=1)``."""
        if resources is None:
            resources = {}
        return cls(
            mode,
            num_cpus,
            num_gpus,
            dict(resources) if isinstance(resources, Mapping) else resources,
        )

    @property
    def crosses(self) -> bool:
        """Whether values reaching this worker go through their codecs."""
        return self.mode == "network"


def _an_amount(amount: object) -> bool:
    """Whether ``amount`` is a finite number ≥ 0 a cluster can set aside (a bool is not)."""
    return finite(amount) and amount >= 0
