"""What it costs to run a node on a worker instead of where the graph is called.

One placed node that hands its input on, so all of a call's cost is the crossing:
the median forward with no broker (the node runs here), against an embedded
local worker (objects handed to a thread), an embedded network worker (every
value through its codec both ways, the node rebuilt once) and a Ray actor
(codec bytes through Ray's object store), for a tiny value (a coordinate) and
for a 19 MB one (a 32×3×224×224 float tensor when ``somatize.torch`` imports,
19 MB of bytes otherwise).

Prints the median per forward, the overhead over no broker in µs, and for the
large value the bytes that crossed (out and back) per second of forward. The
Ray row needs ``ray`` and starts a two-CPU cluster on 127.0.0.1 (about 10 s).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from timing import median_us

from somatize import CODECS, Graph
from somatize.broker import Broker, Worker


def large_value() -> tuple[str, Any]:
    try:
        import torch

        import somatize.torch  # noqa: F401  (registers the tensor codec)
    except ImportError:
        return "19 MB of bytes", bytes(19 * 1024 * 1024)
    return "19 MB tensor", torch.randn(32 * 3 * 224 * 224)


def ray_broker() -> Broker | None:
    try:
        import ray
    except ImportError:
        print("(ray is not installed: no Ray row; pip install 'somatize[ray]')")
        return None
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return Broker.ray(workers={"w1": Worker.generic(mode="network", num_cpus=0)})


def main() -> None:
    # The placed node lives in a module beside this script, so a worker can import it.
    # Run from a checkout: the repository root too, for `somatize.torch`'s other half.
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    from crossing_nodes import Hand

    g = Graph.somatize(Hand().named("hand").at("w1"))
    label, large = large_value()
    size = sum(len(piece) for piece in CODECS.for_value(large).encode(large))
    brokers: list[tuple[str, Broker | None]] = [
        ("no broker", None),
        ("embedded local", Broker.embedded({"w1": Worker.generic(mode="local")})),
        ("embedded network", Broker.embedded({"w1": Worker.generic(mode="network")})),
    ]
    on_ray = ray_broker()
    if on_ray is not None:
        brokers.append(("Ray actor", on_ray))

    rows = []
    for name, broker in brokers:
        tiny = median_us(lambda b=broker: g.forward({"at": 0, "take": 64}, broker=b), 300, warm=3)
        big = median_us(lambda b=broker: g.forward(large, broker=b), 15, warm=3)
        rows.append((name, tiny, big))
    _, tiny_alone, big_alone = rows[0]

    print(f"crossing to a worker: a coordinate, and a {label} ({size / 1e6:.1f} MB encoded)")
    print(
        f"{'broker':>18} {'tiny µs':>10} {'overhead':>10} {'19 MB µs':>11} {'overhead':>11} "
        f"{'MB/s':>8}"
    )
    for name, tiny, big in rows:
        crossed = 0 if name in ("no broker", "embedded local") else 2 * size
        rate = f"{crossed / big:8.0f}" if crossed else f"{'—':>8}"
        print(
            f"{name:>18} {tiny:10.1f} {tiny - tiny_alone:9.1f}µ {big:11.1f} "
            f"{big - big_alone:10.1f}µ {rate}"
        )
    print()
    print("overhead: the forward's median minus the same forward with no broker;")
    print("MB/s: bytes that crossed (the value out and back) per second of forward")
    if on_ray is not None:
        on_ray.close()


if __name__ == "__main__":
    main()
