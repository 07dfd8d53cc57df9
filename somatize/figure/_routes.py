"""How the arrows run: from the right side of one box to the left side of another.

An arrow leaves its source's right side and ends, arrow head included, at its target's
left side, so every edge reads left to right. Across the gap between two columns it is
an S-curve; through a column it skips (an edge longer than one column) it runs straight
along its dummy node, beside the boxes placed there, never through them. Edges meeting
one side of a box are spread over ports in the order of where their other ends sit, so
that they do not cross at the box. An edge's label (how many times it is read, if more
than once, and the bytes its value crossed to or from a worker) goes on a curve between
columns, out of the boxes' way, and clear of the labels placed before it; where it is
crowded it steps down, past labels and boxes, until it is clear.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._arrangement import _Placed, _Route
from .model import Arrow, Point
from .style import (
    _ARROW_LEN,
    _BADGE_H,
    _BADGE_PAD,
    _BADGE_SIZE,
    _PORT_STEP,
    _edge_label,
    _text_width,
)

_Rect = tuple[float, float, float, float]  # left, top, right, bottom


def _routes(
    arrows: Sequence[Arrow],
    placed: Sequence[_Placed],
    *,
    index: Mapping[str, int],
    chains: Mapping[tuple[int, int], list[int]],
    succ: Sequence[list[int]],
    pred: Sequence[list[int]],
    cy: Mapping[int, float],
    layer: Sequence[int],
    col_x: Sequence[float],
    col_w: Sequence[float],
) -> list[_Route]:
    """One route per arrow, in the order of ``arrows``, between the boxes as placed.

    Nodes are numbered as in the layering, the placed boxes first and then the dummy
    nodes: ``chains`` holds each edge's path through them, ``succ`` and ``pred`` the
    edges between them, ``cy`` their vertical centres and ``layer`` their columns, whose
    left sides and widths are ``col_x`` and ``col_w``.
    """

    # ports: edges meeting one side of a box are spread by where they come from
    def node_y(v: int) -> float:
        return cy[v]

    out_port: dict[tuple[int, int], float] = {}
    in_port: dict[tuple[int, int], float] = {}
    for v in range(len(placed)):
        for side, ports in ((succ, out_port), (pred, in_port)):
            ends = sorted(side[v], key=node_y)
            k = len(ends)
            span = min((k - 1) * _PORT_STEP, max(placed[v].h - 24, 0.0))
            for i, u in enumerate(ends):
                ports[(v, u)] = cy[v] + (0.0 if k == 1 else -span / 2 + i * span / (k - 1))

    routes: list[_Route] = []
    taken: list[_Rect] = []  # edge labels placed so far
    boxes: list[_Rect] = [(p.x, p.y, p.x + p.w, p.y + p.h) for p in placed]
    for a in arrows:
        s, t = index[a.source], index[a.target]
        chain = chains[(s, t)]
        start = (placed[s].x + placed[s].w, out_port[(s, chain[1])])
        points: list[Point] = []
        for d in chain[1:-1]:
            points.append((col_x[layer[d]], cy[d]))
            points.append((col_x[layer[d]] + col_w[layer[d]], cy[d]))
        points.append((placed[t].x - _ARROW_LEN, in_port[(t, chain[-2])]))
        segments: list[tuple[Point, Point, Point]] = []
        here = start
        for i, q in enumerate(points):
            if i % 2 == 0:  # across a gap between columns: an S-curve
                half = (q[0] - here[0]) / 2
                segments.append(((here[0] + half, here[1]), (q[0] - half, q[1]), q))
            else:  # straight through a column, beside its boxes
                segments.append((here, q, q))
            here = q
        label = _edge_label(a)
        label_at = None if label is None else _label_spot(start, segments, label, taken, boxes)
        routes.append(_Route(a, start, tuple(segments), label, label_at))
    return routes


def _label_spot(
    start: Point,
    segments: Sequence[tuple[Point, Point, Point]],
    label: str,
    taken: list[_Rect],
    boxes: Sequence[_Rect],
) -> Point:
    """Where on its edge a label goes: on a curve between columns, clear of the others; where
    no spot on the edge is clear, under its first curve, below every label and box in the
    way (the layout makes room for it above the legend)."""
    w = _text_width(label, _BADGE_SIZE) + 2 * _BADGE_PAD
    curves: list[tuple[Point, Point, Point, Point]] = []
    here = start
    for c1, c2, q in segments:
        if c1 != here:
            curves.append((here, c1, c2, q))
        here = q
    order = curves[:1] + curves[-1:] + curves[1:-1] if len(curves) > 1 else curves

    def spot(curve: tuple[Point, Point, Point, Point], t: float) -> Point:
        p, c1, c2, q = curve
        u = 1 - t
        return (
            u**3 * p[0] + 3 * u * u * t * c1[0] + 3 * u * t * t * c2[0] + t**3 * q[0],
            u**3 * p[1] + 3 * u * u * t * c1[1] + 3 * u * t * t * c2[1] + t**3 * q[1],
        )

    def rect(at: Point) -> _Rect:
        return (at[0] - w / 2, at[1] - _BADGE_H / 2, at[0] + w / 2, at[1] + _BADGE_H / 2)

    def apart(r: _Rect, o: _Rect) -> bool:
        return r[2] + 4 <= o[0] or o[2] + 4 <= r[0] or r[3] + 4 <= o[1] or o[3] + 4 <= r[1]

    def clear(r: _Rect) -> bool:
        return all(apart(r, o) for o in taken)

    for curve in order:
        for t in (0.5, 0.38, 0.62, 0.28, 0.72):
            at = spot(curve, t)
            r = rect(at)
            if r[0] >= curve[0][0] + 4 and r[2] <= curve[3][0] - 4 and clear(r):
                taken.append(r)
                return at
    at = spot(order[0], 0.5)
    while True:  # crowded: step down, past whatever is in the way, until it is clear
        r = rect(at)
        below = [o[3] for o in (*taken, *boxes) if not apart(r, o)]
        if not below:
            break
        at = (at[0], max(below) + 5 + _BADGE_H / 2)  # 5, not 4: clear of rounding too
    taken.append(rect(at))
    return at
