"""Where everything goes: a layered, left-to-right layout of boxes and arrows.

Sugiyama style: boxes are put in layers by longest path, ordered within each layer to
cut crossings (keeping a group's boxes together), placed on rows, straightened, and
joined by curved routes; groups get a frame and the legend is set below. The result is
an :class:`_Arrangement` of absolute coordinates, computed once per figure, which both
renderers draw without measuring anything again.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import OUTCOMES, Arrow, Box, Point
from .style import (
    _ARROW_LEN,
    _BADGE_GAP,
    _BADGE_H,
    _BADGE_PAD,
    _BADGE_SIZE,
    _BADGES_TOP,
    _BOX_MAX_W,
    _BOX_MIN_H,
    _BOX_MIN_W,
    _BOX_PAD_BOTTOM,
    _CAPTION_SIZE,
    _COL_GAP,
    _COMPONENT_GAP,
    _CONTENT_MAX_W,
    _DUMMY_GAP,
    _GROUP_LABEL,
    _GROUP_PAD,
    _KIND_SIZE,
    _LEGEND_ITEM_GAP,
    _LEGEND_MIN_W,
    _LEGEND_ROW,
    _LEGEND_SAMPLE_W,
    _LEGEND_SIZE,
    _MARGIN,
    _NAME_SIZE,
    _PAD_X,
    _PORT_STEP,
    _ROW_GAP,
    _TITLE_H,
    _TITLE_SIZE,
    _fit,
    _human_bytes,
    _human_time,
    _text_width,
)


@dataclass(frozen=True)
class _Badge:
    text: str
    tone: str  # a mark, or "outcome"
    x: float
    y: float
    w: float


@dataclass(frozen=True)
class _Placed:
    box: Box
    x: float
    y: float
    w: float
    h: float
    label: str
    kind_label: str
    badges: tuple[_Badge, ...]

    @property
    def centre(self) -> Point:
        return (self.x + self.w / 2, self.y + self.h / 2)


@dataclass(frozen=True)
class _Route:
    arrow: Arrow
    start: Point
    segments: tuple[tuple[Point, Point, Point], ...]  # cubic curves: control, control, end
    label: str | None
    label_at: Point | None


@dataclass(frozen=True)
class _Cluster:
    label: str
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class _LegendItem:
    kind: str  # "caption", "frozen", "cached", "mapped", "at", "outcome", "crossed"
    text: str
    x: float
    y: float  # the centre line of the row
    w: float
    outcome: str | None = None


@dataclass(frozen=True)
class _Arrangement:
    width: float
    height: float
    title: str | None
    boxes: tuple[_Placed, ...]
    routes: tuple[_Route, ...]
    clusters: tuple[_Cluster, ...]
    legend: tuple[_LegendItem, ...]
    legend_top: float | None


@dataclass
class _Measured:
    need_w: float
    h: float
    label: str
    kind_label: str
    badges: list[tuple[str, str, float, float, float]]  # text, tone, dx, dy, w


def _badge_texts(box: Box) -> list[tuple[str, str]]:
    """The badges a box shows, in order, as (text, tone)."""
    out: list[tuple[str, str]] = []
    if box.outcome is not None:
        text = box.outcome
        if box.outcome == "ran" and box.took_us is not None:
            text = f"ran {_human_time(box.took_us)}"
        out.append((text, "outcome"))
    state = None if box.state is None else _fit(box.state, 12, len, middle=False)
    salt = None if box.salt is None else _fit(box.salt, 16, len, middle=False)
    if "frozen" in box.marks:
        out.append(("frozen" if state is None else f"frozen · {state}", "frozen"))
    elif state is not None:
        out.append((f"state · {state}", "frozen"))
    if "cached" in box.marks:
        out.append(("cached" if salt is None else f"cached · {salt}", "cached"))
    elif salt is not None:
        out.append((f"salt · {salt}", "cached"))
    if "mapped" in box.marks:
        out.append(("mapped", "mapped"))
    if box.worker is not None:
        out.append((f"@ {box.worker}", "at"))
    elif "at" in box.marks:
        out.append(("at", "at"))
    return out


def _measure(box: Box) -> _Measured:
    label = _fit(box.name, _CONTENT_MAX_W, lambda s: _text_width(s, _NAME_SIZE, True))
    kind_label = _fit(box.kind, _CONTENT_MAX_W, lambda s: _text_width(s, _KIND_SIZE), False)
    need = max(_text_width(label, _NAME_SIZE, True), _text_width(kind_label, _KIND_SIZE))
    badges: list[tuple[str, str, float, float, float]] = []
    row, dx = 0, 0.0
    for text, tone in _badge_texts(box):
        text = _fit(text, _CONTENT_MAX_W - 2 * _BADGE_PAD, lambda s: _text_width(s, _BADGE_SIZE))
        w = _text_width(text, _BADGE_SIZE) + 2 * _BADGE_PAD
        if dx > 0 and dx + w > _CONTENT_MAX_W:
            row, dx = row + 1, 0.0
        badges.append((text, tone, dx, _BADGES_TOP + row * (_BADGE_H + _BADGE_GAP), w))
        dx += w + _BADGE_GAP
        need = max(need, dx - _BADGE_GAP)
    if badges:
        rows = row + 1
        h = _BADGES_TOP + rows * _BADGE_H + (rows - 1) * _BADGE_GAP + _BOX_PAD_BOTTOM
    else:
        h = _BOX_MIN_H
    need_w = min(_BOX_MAX_W, max(_BOX_MIN_W, need + 2 * _PAD_X))
    return _Measured(need_w, h, label, kind_label, badges)


def _layers(
    n: int, succ: list[list[int]], pred: list[list[int]], names: Sequence[str]
) -> list[int]:
    """Longest-path layering from the sources; sources are then pulled next to their targets."""
    indegree = [len(p) for p in pred]
    queue = deque(i for i in range(n) if indegree[i] == 0)
    topo: list[int] = []
    while queue:
        v = queue.popleft()
        topo.append(v)
        for w in succ[v]:
            indegree[w] -= 1
            if indegree[w] == 0:
                queue.append(w)
    if len(topo) < n:
        stuck = [names[i] for i in range(n) if indegree[i] > 0]
        shown = ", ".join(repr(s) for s in stuck[:8]) + (", ..." if len(stuck) > 8 else "")
        raise ValueError(f"the graph has a cycle; it runs through or feeds: {shown}")
    layer = [0] * n
    for v in topo:
        for w in succ[v]:
            layer[w] = max(layer[w], layer[v] + 1)
    for v in range(n):
        if not pred[v] and succ[v]:
            layer[v] = min(layer[w] for w in succ[v]) - 1
    return layer


def _crossings(layers: list[list[int]], succ: list[list[int]], pos: dict[int, int]) -> int:
    total = 0
    for upper in layers[:-1]:
        pairs = sorted((pos[u], pos[v]) for u in upper for v in succ[u])
        seen: list[int] = []
        for _, b in pairs:
            total += len(seen) - bisect.bisect_right(seen, b)
            bisect.insort(seen, b)
    return total


def _keep_groups_together(row: list[int], group: list[str | None]) -> list[int]:
    """Reorder a layer so that members of one group sit next to each other."""
    if all(group[v] is None for v in row):
        return row
    spots: dict[str, list[int]] = {}
    for i, v in enumerate(row):
        g = group[v]
        if g is not None:
            spots.setdefault(g, []).append(i)

    def key(item: tuple[int, int]) -> tuple[float, int]:
        i, v = item
        g = group[v]
        return (i if g is None else sum(spots[g]) / len(spots[g]), i)

    return [v for _, v in sorted(enumerate(row), key=key)]


def _order(
    members: list[int],
    layer: list[int],
    succ: list[list[int]],
    pred: list[list[int]],
    group: list[str | None],
    sweeps: int = 8,
) -> list[list[int]]:
    """Order the nodes of one component within their layers to reduce crossings."""
    low = min(layer[v] for v in members)
    high = max(layer[v] for v in members)
    layers: list[list[int]] = [[] for _ in range(high - low + 1)]
    seen: set[int] = set()
    roots = [v for v in members if not pred[v]] + members
    for root in roots:  # depth-first from the sources gives a sensible start
        stack = [root]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            layers[layer[v] - low].append(v)
            stack.extend(reversed(succ[v]))
    layers = [_keep_groups_together(row, group) for row in layers]
    pos = {v: i for row in layers for i, v in enumerate(row)}
    best = [list(row) for row in layers]
    best_count = _crossings(layers, succ, pos)
    for sweep in range(sweeps):
        if best_count == 0:
            break
        down = sweep % 2 == 0
        indices = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
        near = pred if down else succ
        for li in indices:
            row = layers[li]
            bary: dict[int, float] = {}
            for v in row:
                ns = near[v]
                bary[v] = sum(pos[u] for u in ns) / len(ns) if ns else float(pos[v])
            row.sort(key=lambda v: (bary[v], pos[v]))
            row = _keep_groups_together(row, group)
            layers[li] = row
            for i, v in enumerate(row):
                pos[v] = i
        count = _crossings(layers, succ, pos)
        if count < best_count:
            best, best_count = [list(row) for row in layers], count
    return best


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


def _arrange(boxes: Sequence[Box], arrows: Sequence[Arrow], title: str | None) -> _Arrangement:
    """Lay the graph out and place everything that is drawn."""
    names = [b.name for b in boxes]
    index: dict[str, int] = {}
    for i, b in enumerate(boxes):
        if b.name in index:
            raise ValueError(f"two boxes are named {b.name!r}; box names must be unique")
        index[b.name] = i
    n = len(boxes)
    pairs: list[tuple[int, int]] = []
    seen_pairs: set[tuple[int, int]] = set()
    for a in arrows:
        for end in (a.source, a.target):
            if end not in index:
                raise ValueError(f"arrow {a.source!r} -> {a.target!r}: no box is named {end!r}")
        pair = (index[a.source], index[a.target])
        if pair[0] == pair[1]:
            raise ValueError(f"the graph has a cycle: {a.source!r} feeds itself")
        if pair not in seen_pairs:
            seen_pairs.add(pair)
            pairs.append(pair)

    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, t in pairs:
        succ[s].append(t)
        pred[t].append(s)
    layer = _layers(n, succ, pred, names)

    measured = [_measure(b) for b in boxes]
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
        if a.crossed_bytes is not None:
            s = index[a.source]
            label_w = _text_width(_human_bytes(a.crossed_bytes), _BADGE_SIZE) + 2 * _BADGE_PAD
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

    # ports: edges meeting one side of a box are spread by where they come from
    def node_y(v: int) -> float:
        return cy[v]

    out_port: dict[tuple[int, int], float] = {}
    in_port: dict[tuple[int, int], float] = {}
    for v in range(n):
        for side, ports in ((succ, out_port), (pred, in_port)):
            ends = sorted(side[v], key=node_y)
            k = len(ends)
            span = min((k - 1) * _PORT_STEP, max(height[v] - 24, 0.0))
            for i, u in enumerate(ends):
                ports[(v, u)] = cy[v] + (0.0 if k == 1 else -span / 2 + i * span / (k - 1))

    routes: list[_Route] = []
    taken: list[tuple[float, float, float, float]] = []  # byte labels placed so far
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
        label = label_at = None
        if a.crossed_bytes is not None:
            label = _human_bytes(a.crossed_bytes)
            label_at = _label_spot(start, segments, label, taken)
        routes.append(_Route(a, start, tuple(segments), label, label_at))

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
        width = max(width, _text_width(title, _TITLE_SIZE, True) + 2 * _MARGIN)
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


def _label_spot(
    start: Point,
    segments: Sequence[tuple[Point, Point, Point]],
    label: str,
    taken: list[tuple[float, float, float, float]],
) -> Point:
    """Where on its edge a byte label goes: on a curve between columns, clear of the others."""
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

    def rect(at: Point) -> tuple[float, float, float, float]:
        return (at[0] - w / 2, at[1] - _BADGE_H / 2, at[0] + w / 2, at[1] + _BADGE_H / 2)

    def clear(r: tuple[float, float, float, float]) -> bool:
        return all(
            r[2] + 4 <= o[0] or o[2] + 4 <= r[0] or r[3] + 4 <= o[1] or o[3] + 4 <= r[1]
            for o in taken
        )

    for curve in order:
        for t in (0.5, 0.38, 0.62, 0.28, 0.72):
            at = spot(curve, t)
            r = rect(at)
            if r[0] >= curve[0][0] + 4 and r[2] <= curve[3][0] - 4 and clear(r):
                taken.append(r)
                return at
    at = spot(order[0], 0.5)
    for _ in range(len(taken) + 1):  # crowded: step down until it is clear
        if clear(rect(at)):
            break
        at = (at[0], at[1] + _BADGE_H + 2)
    taken.append(rect(at))
    return at


def _legend(
    boxes: Sequence[Box], arrows: Sequence[Arrow], top: float, width: float
) -> tuple[list[_LegendItem], float]:
    """Place the legend rows under the graph; returns the items and the bottom edge."""
    marks: list[tuple[str, str]] = []
    if any("frozen" in b.marks or b.state is not None for b in boxes):
        marks.append(("frozen", "frozen · state digest"))
    if any("cached" in b.marks or b.salt is not None for b in boxes):
        marks.append(("cached", "cached · salt"))
    if any("mapped" in b.marks for b in boxes):
        marks.append(("mapped", "mapped"))
    if any("at" in b.marks or b.worker is not None for b in boxes):
        marks.append(("at", "placed on a worker"))
    run: list[tuple[str, str]] = []
    if any(b.outcome is not None for b in boxes):
        run.extend(("outcome", o) for o in OUTCOMES)
    if any(a.crossed_bytes is not None for a in arrows):
        run.append(("crossed", "bytes sent to a worker"))
    items: list[_LegendItem] = []
    y = top + 14 + _LEGEND_ROW / 2
    limit = width - _MARGIN
    for caption, entries in (("marks", marks), ("run", run)):
        if not entries:
            continue
        cap_w = max(_text_width(c.upper(), _CAPTION_SIZE, True) * 1.1 for c in ("marks", "run"))
        cap_w += 14.0
        items.append(_LegendItem("caption", caption, _MARGIN, y, cap_w))
        x = _MARGIN + cap_w
        for kind, text in entries:
            if kind == "mapped":
                w = _text_width("mapped", _BADGE_SIZE) + 2 * _BADGE_PAD
            elif kind == "at":
                w = _text_width("@ w", _BADGE_SIZE) + 2 * _BADGE_PAD + 6
                w += _text_width(text, _LEGEND_SIZE)
            else:
                w = _LEGEND_SAMPLE_W + 6 + _text_width(text, _LEGEND_SIZE)
            if x + w > limit and x > _MARGIN + cap_w:
                y += _LEGEND_ROW
                x = _MARGIN + cap_w
            outcome = text if kind == "outcome" else None
            items.append(_LegendItem(kind, text, x, y, w, outcome))
            x += w + _LEGEND_ITEM_GAP
        y += _LEGEND_ROW
    return items, y - _LEGEND_ROW / 2


def layout(boxes: Sequence[Box], arrows: Sequence[Arrow]) -> dict[str, tuple[float, float]]:
    """Lay the graph out left to right and return the centre ``(x, y)`` of each box.

    Raises ``ValueError`` for a cycle, a repeated box name or an arrow to no box.
    """
    return {p.box.name: p.centre for p in _arrange(boxes, arrows, None).boxes}
