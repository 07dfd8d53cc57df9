"""What a PNG of a wide fan-out costs, against a PNG of as many short arrows.

A fan-out: one box feeding ``n`` others, whose arrows run from the middle of a column
``n`` rows tall to each of its rows. Its peer: ``n`` pairs of boxes, each joined by one
short arrow, a picture of the same width and height with as many boxes to write and
as many arrows to draw. Each is drawn with ``png()`` at its default scale, for ``n``
from 100 to 1600; the time is the processor time of the best of a few tries.

Prints seconds and ratios; target: the fan-out costs at most 1.5× its peer at every
``n``, its time growing with ``n`` as its peer's does (its arrows are long, but most
of their ink lies on one another's), not with the square of ``n``.
"""

from __future__ import annotations

import time

from somatize.figure import Arrow, Box, Figure


def fan_out(n: int) -> Figure:
    boxes = [Box("source", "Rows")] + [Box(f"target {i}", "Scale") for i in range(n)]
    return Figure(boxes, [Arrow("source", f"target {i}") for i in range(n)])


def pairs(n: int) -> Figure:
    boxes = [
        Box(f"{end} {i}", kind) for i in range(n) for end, kind in (("a", "Rows"), ("b", "Scale"))
    ]
    return Figure(boxes, [Arrow(f"a {i}", f"b {i}") for i in range(n)])


def best_s(figure: Figure, tries: int) -> float:
    """The least processor time ``figure.png()`` took in ``tries`` calls, in seconds."""
    taken = []
    for _ in range(tries):
        start = time.process_time()
        figure.png()
        taken.append(time.process_time() - start)
    return min(taken)


def main() -> None:
    sizes = (100, 200, 400, 800, 1600)
    rows = []
    for n in sizes:
        fan, peer = fan_out(n), pairs(n)
        assert fan.size[1] <= 1.1 * peer.size[1], (fan.size, peer.size)  # the same picture size
        tries = 3 if n <= 400 else 1
        rows.append((n, best_s(fan, tries), best_s(peer, tries)))

    print(f"{'n':>5} {'fan-out':>9} {'pairs':>9} {'fan-out/pairs':>14}")
    for n, fan_s, peer_s in rows:
        print(f"{n:>5} {fan_s:8.2f}s {peer_s:8.2f}s {fan_s / peer_s:13.2f}×")
    worst = max(fan_s / peer_s for _, fan_s, peer_s in rows)
    (first, first_fan, first_peer), (last, last_fan, last_peer) = rows[0], rows[-1]
    print()
    print(f"fan-out against its peer, at worst: {worst:.2f}× (target ≤ 1.5×)")
    print(
        f"from n = {first} to {last}: the fan-out {last_fan / first_fan:.1f}×, "
        f"its peer {last_peer / first_peer:.1f}× (linear is {last // first}×, "
        f"the square {(last // first) ** 2}×)"
    )


if __name__ == "__main__":
    main()
