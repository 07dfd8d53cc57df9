"""Where each box sits in its column: vertical centres, aligned with its neighbours.

Each box is pulled towards the mean centre of the boxes it is joined to, sweeping down
the columns and back up; within a column those wishes are met as closely as the gaps
allow by a weighted monotone regression (pooling adjacent violators), so the order found
by the layering and the spacing are kept exactly while boxes stay as near their
neighbours as they can. The points a long edge passes through (dummy nodes, of no
height) weigh four times a box and look both ways, and a last pass levels each long
edge's run of them wherever the boxes beside it leave room: a long edge is drawn with
as few bends as possible. Gaps widen where a group's frame begins or ends, so that a
frame and its label never touch a box outside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .style import _DUMMY_GAP, _GROUP_LABEL, _GROUP_PAD, _ROW_GAP


def _pav(targets: list[float], offsets: list[float], weights: list[float]) -> list[float]:
    """Closest positions to ``targets`` (weighted least squares) that keep order and spacing.

    Position ``i`` must be at least ``offsets[i] - offsets[i-1]`` below position ``i-1``;
    subtracting the offsets turns that into a monotone regression, solved by pooling
    adjacent violators.
    """
    blocks: list[list[float]] = []  # value, weight, count
    for t, o, w in zip(targets, offsets, weights, strict=True):
        blocks.append([t - o, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for value, _, count in blocks:
        out.extend([value] * int(count))
    return [z + o for z, o in zip(out, offsets, strict=True)]


def _place_rows(
    layers: list[list[int]],
    height: list[float],
    dummy: list[bool],
    group: list[str | None],
    succ: list[list[int]],
    pred: list[list[int]],
    rounds: int = 6,
) -> dict[int, float]:
    """Vertical centres for the nodes of one component, aligned with their neighbours."""

    def gap(a: int, b: int) -> float:
        space = _DUMMY_GAP if dummy[a] or dummy[b] else _ROW_GAP
        if group[a] != group[b]:
            if group[a] is not None:
                space += _GROUP_PAD
            if group[b] is not None:
                space += _GROUP_PAD + _GROUP_LABEL
        return space

    offsets: list[list[float]] = []
    for row in layers:
        acc, offs = 0.0, []
        for i, v in enumerate(row):
            if i:
                acc += height[row[i - 1]] / 2 + gap(row[i - 1], v) + height[v] / 2
            offs.append(acc)
        offsets.append(offs)
    y: dict[int, float] = {}
    for row, offs in zip(layers, offsets, strict=True):
        mid = offs[-1] / 2 if offs else 0.0
        for v, o in zip(row, offs, strict=True):
            y[v] = o - mid
    weights = [[4.0 if dummy[v] else 1.0 for v in row] for row in layers]

    def sweep(indices: Sequence[int], near: Callable[[int], list[int]]) -> None:
        for li in indices:
            row = layers[li]
            targets = []
            for v in row:
                ns = pred[v] + succ[v] if dummy[v] else near(v)  # long edges: keep straight
                targets.append(sum(y[u] for u in ns) / len(ns) if ns else y[v])
            for v, new in zip(row, _pav(targets, offsets[li], weights[li]), strict=True):
                y[v] = new

    down = range(1, len(layers))
    up = range(len(layers) - 2, -1, -1)
    for _ in range(rounds):
        sweep(down, lambda v: pred[v])
        sweep(up, lambda v: succ[v])
    for _ in range(2):
        sweep(range(len(layers)), lambda v: pred[v] + succ[v])
    _straighten(layers, y, height, dummy, pred, succ, gap)
    return y


def _straighten(
    layers: list[list[int]],
    y: dict[int, float],
    height: list[float],
    dummy: list[bool],
    pred: list[list[int]],
    succ: list[list[int]],
    gap: Callable[[int, int], float],
) -> None:
    """Level the runs of dummy nodes of each long edge where their neighbours leave room."""
    where: dict[int, tuple[int, int]] = {}
    for li, row in enumerate(layers):
        for i, v in enumerate(row):
            where[v] = (li, i)

    def room(v: int) -> tuple[float, float]:
        li, i = where[v]
        row = layers[li]
        lo, hi = -math.inf, math.inf
        if i > 0:
            a = row[i - 1]
            lo = y[a] + height[a] / 2 + gap(a, v) + height[v] / 2
        if i + 1 < len(row):
            b = row[i + 1]
            hi = y[b] - height[b] / 2 - gap(v, b) - height[v] / 2
        return lo, hi

    chains: list[list[int]] = []
    for v in where:
        if dummy[v] and not dummy[pred[v][0]]:
            chain = [v]
            while dummy[succ[chain[-1]][0]]:
                chain.append(succ[chain[-1]][0])
            chains.append(chain)
    chains.sort(key=len, reverse=True)
    for _ in range(2):
        for chain in chains:
            # the real ends count too: a level run that lines up with them needs no bends
            ends = [pred[chain[0]][0], succ[chain[-1]][0]]
            run: list[int] = []
            lo, hi = -math.inf, math.inf
            for step in [*chain, None]:
                if step is not None:
                    vlo, vhi = room(step)
                    if max(lo, vlo) <= min(hi, vhi):
                        run.append(step)
                        lo, hi = max(lo, vlo), min(hi, vhi)
                        continue
                if run:
                    wanted = [y[u] for u in run]
                    if run[0] == chain[0]:
                        wanted.append(y[ends[0]])
                    if run[-1] == chain[-1]:
                        wanted.append(y[ends[1]])
                    level = min(max(sorted(wanted)[len(wanted) // 2], lo), hi)
                    for u in run:
                        y[u] = level
                if step is not None:
                    run = [step]
                    lo, hi = room(step)
