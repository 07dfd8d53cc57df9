"""Where everything goes: a layered, left-to-right layout of boxes and arrows.

Sugiyama style: boxes are put in layers by longest path, ordered within each layer to
cut crossings (keeping a group's boxes together), placed on rows, straightened, and
joined by curved routes; groups get a frame and the legend is set below. The result is
an :class:`_Arrangement` of absolute coordinates, computed once per figure, which both
renderers draw without measuring anything again.

Each step is a module of its own: measuring a box (``_measure``), the columns and the
order within them (``_layering``), the rows (``_rows``), the arrows (``_routes``), the
legend (``_legend``) and what they produce (``_arrangement``). This one joins them: it
checks the description, threads each long edge through the columns it skips, sizes the
columns (a gap widens to hold a byte label), splits the graph into components (joined
by an edge or by a shared group) set one under another, packs the boxes with no edge
and no group in a grid below them, and frames the groups.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

# what a layout produces: its parts can be imported from here as well
from ._arrangement import _Arrangement as _Arrangement
from ._arrangement import _Badge as _Badge
from ._arrangement import _Cluster as _Cluster
from ._arrangement import _LegendItem as _LegendItem
from ._arrangement import _Placed as _Placed
from ._arrangement import _Route as _Route
from ._layering import _layers, _order
from ._legend import _legend
from ._measure import _as_written, _measure, _name_labels
from ._routes import _routes
from ._rows import _place_rows
from .model import Arrow, Box
from .style import (
    _ARROW_LEN,
    _BADGE_H,
    _BADGE_PAD,
    _BADGE_SIZE,
    _COL_GAP,
    _COMPONENT_GAP,
    _GROUP_LABEL,
    _GROUP_PAD,
    _LEGEND_MIN_W,
    _MARGIN,
    _PAD_X,
    _ROW_GAP,
    _TITLE_H,
    _TITLE_SIZE,
    _edge_label,
    _text_width,
)


def _arrange(
    boxes: Sequence[Box],
    arrows: Sequence[Arrow],
    title: str | None,
    spelled: Callable[[str], str] = _as_written,
) -> _Arrangement:
    """Lay the graph out and place everything that is drawn, measuring what the user wrote
    (names, kinds, badges, the title) as ``spelled`` writes it: as it is for the SVG."""
    names = [b.name for b in boxes]
    index: dict[str, int] = {}
    for i, b in enumerate(boxes):
        if b.name in index:
            raise ValueError(f"two boxes are named {b.name!r}; box names must be unique")
        index[b.name] = i
    n = len(boxes)
    # arrows with the same ends are one edge, drawn once: their reads and bytes add up
    edges: dict[tuple[str, str], Arrow] = {}
    for a in arrows:
        for end in (a.source, a.target):
            if end not in index:
                raise ValueError(f"arrow {a.source!r} -> {a.target!r}: no box is named {end!r}")
        if a.source == a.target:
            raise ValueError(f"the graph has a cycle: {a.source!r} feeds itself")
        same = edges.get((a.source, a.target))
        if same is not None:
            crossed = [c for c in (same.crossed_bytes, a.crossed_bytes) if c is not None]
            a = Arrow(a.source, a.target, sum(crossed) if crossed else None, same.reads + a.reads)
        edges[(a.source, a.target)] = a
    arrows = list(edges.values())
    pairs = [(index[a.source], index[a.target]) for a in arrows]

    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, t in pairs:
        succ[s].append(t)
        pred[t].append(s)
    layer = _layers(n, succ, pred, names)

    labels = _name_labels(boxes, spelled)
    measured = [_measure(b, label, spelled) for b, label in zip(boxes, labels, strict=True)]
    height = [m.h for m in measured]
    dummy = [False] * n
    group: list[str | None] = [b.group for b in boxes]
    succ = [[] for _ in range(n)]
    pred = [[] for _ in range(n)]
    chains: dict[tuple[int, int], list[int]] = {}
    for s, t in pairs:
        chain = [s]
        shared = group[s] if group[s] is not None and group[s] == group[t] else None
        for li in range(layer[s] + 1, layer[t]):
            chain.append(len(layer))
            layer.append(li)
            height.append(0.0)
            dummy.append(True)
            group.append(shared)
            succ.append([])
            pred.append([])
        chain.append(t)
        for u, v in itertools.pairwise(chain):
            succ[u].append(v)
            pred[v].append(u)
        chains[(s, t)] = chain

    # components: connected through edges or through a shared group
    parent = list(range(n))

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    first_of_group: dict[str, int] = {}
    for s, t in pairs:
        parent[root(s)] = root(t)
    for v in range(n):
        g = boxes[v].group
        if g is not None:
            if g in first_of_group:
                parent[root(v)] = root(first_of_group[g])
            else:
                first_of_group[g] = v
    comps: dict[int, list[int]] = {}
    for v in range(n):
        comps.setdefault(root(v), []).append(v)
    for (s, _t), chain in chains.items():
        comps[root(s)].extend(chain[1:-1])

    # lone boxes (no edge, no group) are packed in a grid under the rest
    lone = sorted(m[0] for m in comps.values() if len(m) == 1 and group[m[0]] is None)
    lone_set = set(lone)
    linked = sorted((m for m in comps.values() if m[0] not in lone_set), key=min)

    # columns
    depth = max(layer[:n], default=0) + 1
    col_w = [0.0] * depth
    for v in range(n):
        if v not in lone_set:
            col_w[layer[v]] = max(col_w[layer[v]], measured[v].need_w)
    col_w = [w if w > 0 else 60.0 for w in col_w]
    col_gap = [_COL_GAP] * max(depth - 1, 0)
    for a in arrows:
        label = _edge_label(a)
        if label is not None:
            s = index[a.source]
            label_w = _text_width(label, _BADGE_SIZE) + 2 * _BADGE_PAD
            col_gap[layer[s]] = max(col_gap[layer[s]], label_w + 2 * _ARROW_LEN + 28)
    col_x = [_MARGIN]
    for li in range(depth - 1):
        col_x.append(col_x[li] + col_w[li] + col_gap[li])
    content_w = col_x[-1] + col_w[-1] + _MARGIN if linked else 2 * _MARGIN
    left = {v: col_x[layer[v]] for v in range(n)}
    wide = {v: col_w[layer[v]] for v in range(n)}

    # rows, one component under another
    top = _MARGIN + (_TITLE_H if title else 0.0)
    cy: dict[int, float] = {}
    big = len(layer) > 1500  # fewer sweeps for huge graphs: they stay quick
    for members in linked:
        rows = _order(members, layer, succ, pred, group, 4 if big else 8)
        ys = _place_rows(rows, height, dummy, group, succ, pred, 2 if big else 6)

        def above(v: int) -> float:
            return height[v] / 2 + (_GROUP_PAD + _GROUP_LABEL if group[v] is not None else 0.0)

        def below(v: int) -> float:
            return height[v] / 2 + (_GROUP_PAD if group[v] is not None else 0.0)

        lo = min(ys[v] - above(v) for v in ys)
        hi = max(ys[v] + below(v) for v in ys)
        for v, yv in ys.items():
            cy[v] = yv - lo + top
        top += hi - lo + _COMPONENT_GAP
    if lone:
        cell = max(measured[v].need_w for v in lone)
        fit = math.floor((content_w - 2 * _MARGIN + _ROW_GAP) / (cell + _ROW_GAP))
        per_row = min(len(lone), max(math.ceil(math.sqrt(2 * len(lone))), fit))
        for first in range(0, len(lone), per_row):
            row = lone[first : first + per_row]
            row_h = max(height[v] for v in row)
            for i, v in enumerate(row):
                left[v] = _MARGIN + i * (cell + _ROW_GAP)
                wide[v] = cell
                cy[v] = top + height[v] / 2
            top += row_h + _ROW_GAP
        top += _COMPONENT_GAP - _ROW_GAP
        content_w = max(content_w, _MARGIN + per_row * (cell + _ROW_GAP) - _ROW_GAP + _MARGIN)
    content_bottom = top - _COMPONENT_GAP if n else _MARGIN + (_TITLE_H if title else 0.0)

    placed: list[_Placed] = []
    for v, (b, m) in enumerate(zip(boxes, measured, strict=True)):
        x, w = left[v], wide[v]
        y = cy[v] - m.h / 2
        badges = tuple(
            _Badge(text, tone, x + _PAD_X + dx, y + dy, bw) for text, tone, dx, dy, bw in m.badges
        )
        placed.append(_Placed(b, x, y, w, m.h, m.label, m.kind_label, badges))

    routes = _routes(
        arrows,
        placed,
        index=index,
        chains=chains,
        succ=succ,
        pred=pred,
        cy=cy,
        layer=layer,
        col_x=col_x,
        col_w=col_w,
    )

    # a label crowded off its edge steps down: the legend goes below it
    for r in routes:
        if r.label_at is not None:
            content_bottom = max(content_bottom, r.label_at[1] + _BADGE_H / 2)

    clusters: list[_Cluster] = []
    spans: dict[str, list[float]] = {}
    for p in placed:
        if p.box.group is not None:
            box_span = spans.setdefault(p.box.group, [math.inf, math.inf, -math.inf, -math.inf])
            box_span[0] = min(box_span[0], p.x)
            box_span[1] = min(box_span[1], p.y)
            box_span[2] = max(box_span[2], p.x + p.w)
            box_span[3] = max(box_span[3], p.y + p.h)
    for g, (x0, y0, x1, y1) in spans.items():
        x0, y0 = x0 - _GROUP_PAD, y0 - _GROUP_PAD - _GROUP_LABEL
        x1, y1 = x1 + _GROUP_PAD, y1 + _GROUP_PAD
        clusters.append(_Cluster(g, x0, y0, x1 - x0, y1 - y0))

    width = max(content_w, _LEGEND_MIN_W)
    if title:
        width = max(width, _text_width(spelled(title), _TITLE_SIZE, True) + 2 * _MARGIN)
    legend, legend_bottom = _legend(boxes, arrows, content_bottom + 18, width)
    if legend:
        width = max(width, max(item.x + item.w for item in legend) + _MARGIN)
    height_px = (legend_bottom if legend else content_bottom) + _MARGIN
    return _Arrangement(
        width=math.ceil(width),
        height=math.ceil(height_px),
        title=title,
        boxes=tuple(placed),
        routes=tuple(routes),
        clusters=tuple(clusters),
        legend=tuple(legend),
        legend_top=content_bottom + 18 if legend else None,
    )


def layout(boxes: Sequence[Box], arrows: Sequence[Arrow]) -> dict[str, tuple[float, float]]:
    """Lay the graph out left to right and return the centre ``(x, y)`` of each box.

    Raises ``ValueError`` for a cycle, a repeated box name or an arrow to no box.
    """
    return {p.box.name: p.centre for p in _arrange(boxes, arrows, None).boxes}
