"""Workers: the places a broker can run a node, as the user describes them.

A worker is a name in a graph (``node.at("w1")``) and a description here of what
stands behind the name: how values reach it, and what it needs from a cluster.

``mode="local"`` hands Python objects across, as a thread in the same process
would; ``mode="network"`` sends every value through its codec and rebuilds the
node from its blueprint on the other side, exactly as if a wire were between
them — which is what a Ray worker always does, so a graph that runs with
network workers in one process runs on a cluster too. The resources
(``num_cpus``, ``num_gpus``, custom ``resources``) are what a cluster must set
aside for the worker; the embedded broker has no use for them. A worker is a
frozen value: it hashes, and its resources are copied when it is made and cannot
be changed after they were checked (:class:`Resources`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from somatize._numbers import finite
from somatize.errors import SomatizeError

__all__ = ["BadWorker", "Mode", "Resources", "Worker"]

Mode = Literal["local", "network"]


class BadWorker(SomatizeError, ValueError):
    """A worker described with a mode or resources that cannot be honoured."""


class Resources(Mapping[str, float]):
    """A worker's custom resources: a mapping of names to amounts, copied when it is made
    and never changed after, so a :class:`Worker` can be hashed and what was checked is
    what a cluster is asked for. Equal to a dict of the same items."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, float] | None = None) -> None:
        self._items: dict[str, float] = dict(items or {})

    def __getitem__(self, name: str) -> float:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Mapping):
            return self._items == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._items)


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
    resources: Mapping[str, float] = field(default_factory=Resources)
    """Custom resources a cluster must find on the machine the worker lands on, kept as
    :class:`Resources` (a mapping that cannot be changed after it was checked)."""

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
        if not isinstance(self.resources, Resources):  # copied, then checked: for good
            object.__setattr__(self, "resources", Resources(self.resources))
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
