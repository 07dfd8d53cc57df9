"""Draw a pipeline graph as SVG or PNG, with no system binary.

A graph is described neutrally: one :class:`Box` per node and one :class:`Arrow` per
edge. :class:`Figure` lays them out left to right in layers (Sugiyama style) and draws
them as hand-written SVG, or as PNG through Pillow when it is installed::

    fig = Figure([Box("sms", "Parquet"), Box("clean", "Clean")], [Arrow("sms", "clean")])
    fig.save("graph.svg")

In Jupyter a figure shows itself (``_repr_svg_``). Only the standard library is imported
here; Pillow is imported when a PNG is asked for.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import itertools
import math
import os
import unicodedata
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import ImageDraw, ImageFont

__all__ = ["MARKS", "OUTCOMES", "Arrow", "Box", "Figure", "layout"]

#: The memory marks a box may carry.
MARKS: tuple[str, ...] = ("frozen", "cached", "mapped", "at")
#: What can have happened to a node in a run.
OUTCOMES: tuple[str, ...] = ("ran", "recalled", "spared", "drifted", "failed")

Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """One node of the graph, as it is drawn."""

    name: str
    kind: str
    marks: tuple[str, ...] = ()
    state: str | None = None
    salt: str | None = None
    worker: str | None = None
    outcome: str | None = None
    took_us: int | None = None
    group: str | None = None


@dataclass(frozen=True)
class Arrow:
    """One edge of the graph: the value of ``source`` flows into ``target``."""

    source: str
    target: str
    crossed_bytes: int | None = None


# --------------------------------------------------------------------------- style

_FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'

_BG = "#ffffff"
_INK = "#0f172a"
_MUTED = "#64748b"
_BORDER = "#cbd5e1"
_EDGE = "#94a3b8"
_EDGE_CROSSED = "#475569"
_FROZEN = "#3b82f6"
_CACHED = "#8b5cf6"
_GROUP_FILL = "#f8fafc"
_GROUP_STROKE = "#e2e8f0"

#: outcome -> (box fill, box stroke, badge fill, badge text)
_OUTCOME_STYLE: dict[str, tuple[str, str, str, str]] = {
    "ran": ("#fef3c7", "#f59e0b", "#d97706", "#ffffff"),
    "recalled": ("#dcfce7", "#22c55e", "#16a34a", "#ffffff"),
    "spared": ("#f8fafc", "#94a3b8", "#e2e8f0", "#475569"),
    "drifted": ("#ffe4d6", "#f4511e", "#e64a19", "#ffffff"),
    "failed": ("#fee2e2", "#ef4444", "#dc2626", "#ffffff"),
}

#: badge tone -> (fill, text)
_BADGE_STYLE: dict[str, tuple[str, str]] = {
    "frozen": ("#dbeafe", "#1e40af"),
    "cached": ("#ede9fe", "#5b21b6"),
    "mapped": ("#ccfbf1", "#115e59"),
    "at": ("#e2e8f0", "#1e293b"),
}

_NAME_SIZE = 13.0
_KIND_SIZE = 11.0
_BADGE_SIZE = 10.0
_TITLE_SIZE = 15.0
_LEGEND_SIZE = 11.0
_CAPTION_SIZE = 10.0
_GROUP_SIZE = 11.0

_PAD_X = 14.0  # box side padding (the frozen stripe sits inside the left one)
_STRIPE = 4.0
_RADIUS = 8.0
_BOX_MIN_W = 112.0
_BOX_MAX_W = 232.0
_CONTENT_MAX_W = _BOX_MAX_W - 2 * _PAD_X
_NAME_BASE = 22.0  # baseline offsets from the box top
_KIND_BASE = 38.0
_BADGES_TOP = 48.0
_BADGE_H = 16.0
_BADGE_GAP = 4.0
_BADGE_PAD = 6.0
_BOX_PAD_BOTTOM = 10.0
_BOX_MIN_H = 50.0

_MARGIN = 24.0
_COL_GAP = 64.0
_ROW_GAP = 20.0
_DUMMY_GAP = 12.0
_COMPONENT_GAP = 36.0
_GROUP_PAD = 12.0
_GROUP_LABEL = 18.0
_TITLE_H = 34.0
_ARROW_LEN = 8.0
_PORT_STEP = 10.0

_LEGEND_ROW = 24.0
_LEGEND_SAMPLE_W = 22.0
_LEGEND_SAMPLE_H = 14.0
_LEGEND_ITEM_GAP = 18.0
_LEGEND_MIN_W = 380.0

# Advance widths of Helvetica for ASCII 32..126, in 1/1000 em: an estimate of how wide
# text is in the sans-serif fonts of the stack above.
_WIDTHS = (
    278,
    278,
    355,
    556,
    556,
    889,
    667,
    191,
    333,
    333,
    389,
    584,
    278,
    333,
    278,
    278,
    556,
    556,
    556,
    556,
    556,
    556,
    556,
    556,
    556,
    556,
    278,
    278,
    584,
    584,
    584,
    556,
    1015,
    667,
    667,
    722,
    722,
    667,
    611,
    778,
    722,
    278,
    500,
    667,
    556,
    833,
    722,
    778,
    667,
    778,
    722,
    667,
    611,
    722,
    667,
    944,
    667,
    667,
    611,
    278,
    278,
    278,
    469,
    556,
    333,
    556,
    556,
    500,
    556,
    556,
    278,
    556,
    556,
    222,
    222,
    500,
    222,
    833,
    556,
    556,
    556,
    556,
    333,
    500,
    278,
    556,
    500,
    722,
    500,
    500,
    500,
    334,
    260,
    334,
    584,
)


def _text_width(text: str, size: float, bold: bool = False) -> float:
    """Estimate the width of ``text`` in pixels at font ``size``."""
    units = 0
    for ch in text:
        code = ord(ch)
        if 32 <= code < 127:
            units += _WIDTHS[code - 32]
        elif unicodedata.combining(ch):
            continue
        elif unicodedata.east_asian_width(ch) in ("W", "F"):
            units += 1000
        else:
            units += 600
    return units * size / 1000.0 * (1.14 if bold else 1.05)


def _fit(text: str, max_w: float, measure: Callable[[str], float], middle: bool = True) -> str:
    """Shorten ``text`` with an ellipsis until ``measure`` says it fits in ``max_w``."""
    if measure(text) <= max_w:
        return text

    def cut(keep: int) -> str:
        if not middle:
            return text[:keep] + "…"
        head = (keep + 1) // 2
        tail = keep // 2
        return text[:head] + "…" + (text[len(text) - tail :] if tail else "")

    lo, hi = 0, len(text) - 1  # the largest kept length that fits lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if measure(cut(mid)) <= max_w:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo)


def _human_time(us: int) -> str:
    """Format microseconds as ``850 µs``, ``1.2 ms``, ``3.40 s`` or ``2 min 5 s``."""
    if us < 1000:
        return f"{us} µs"
    if us < 1_000_000:
        ms = us / 1000
        return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    s = us / 1_000_000
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    minutes, seconds = divmod(round(s), 60)
    return f"{minutes} min {seconds} s"


def _human_bytes(n: int) -> str:
    """Format a byte count in decimal units: ``512 B``, ``19.3 MB``."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 1000 or unit == "PB":
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def _xml(text: str) -> str:
    """Escape ``text`` for XML content or a double-quoted attribute."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "&":
            out.append("&amp;")
        elif ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        elif ch == '"':
            out.append("&quot;")
        elif ch == "'":
            out.append("&#39;")
        elif ch in "\t\n":
            out.append(f"&#{code};")
        elif code < 32 or 0xD800 <= code <= 0xDFFF or code in (0xFFFE, 0xFFFF):
            out.append("\ufffd")  # not allowed in XML 1.0
        else:
            out.append(ch)
    return "".join(out)


def _num(v: float) -> str:
    """Format a coordinate compactly."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


# --------------------------------------------------------------------------- arrangement


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


# --------------------------------------------------------------------------- SVG


def _box_colours(box: Box) -> tuple[str, str, bool, str, str]:
    """Fill, stroke, dashed, name colour and kind colour of a box."""
    if box.outcome is None:
        return _BG, _BORDER, False, _INK, _MUTED
    fill, stroke, _, _ = _OUTCOME_STYLE[box.outcome]
    if box.outcome == "spared":
        return fill, stroke, True, _MUTED, "#94a3b8"
    return fill, stroke, False, _INK, "#475569"


def _badge_colours(tone: str, outcome: str | None) -> tuple[str, str]:
    if tone == "outcome" and outcome is not None:
        _, _, fill, text = _OUTCOME_STYLE[outcome]
        return fill, text
    return _BADGE_STYLE[tone]


def _stripe_path(x: float, y: float, h: float) -> list[Point]:
    """Outline of the frozen stripe: the left ``_STRIPE`` pixels of a rounded box."""
    r = _RADIUS
    pts: list[Point] = []
    for i in range(9):  # top-left corner, from the stripe edge round to the side
        ang = math.pi * 1.5 - (math.pi / 2) * i / 8
        px = x + r + r * math.cos(ang)
        if px <= x + _STRIPE + 1e-9:
            pts.append((px, y + r + r * math.sin(ang)))
    top_y = y + r - math.sqrt(r * r - (r - _STRIPE) ** 2)
    pts.insert(0, (x + _STRIPE, top_y))
    bottom = [(px, 2 * y + h - py) for px, py in reversed(pts)]
    return pts + bottom


def _svg_path(route: _Route) -> str:
    parts = [f"M{_num(route.start[0])},{_num(route.start[1])}"]
    here = route.start
    for c1, c2, q in route.segments:
        straight = c1 == here
        here = q
        if straight:
            parts.append(f"L{_num(q[0])},{_num(q[1])}")
        else:
            parts.append(
                f"C{_num(c1[0])},{_num(c1[1])} {_num(c2[0])},{_num(c2[1])} "
                f"{_num(q[0])},{_num(q[1])}"
            )
    return " ".join(parts)


def _tooltip(box: Box) -> str:
    lines = [f"{box.name} ({box.kind})"]
    if box.marks:
        lines.append("marks: " + ", ".join(box.marks))
    if box.state is not None:
        lines.append(f"state: {box.state}")
    if box.salt is not None:
        lines.append(f"salt: {box.salt}")
    if box.worker is not None:
        lines.append(f"worker: {box.worker}")
    if box.outcome is not None:
        took = "" if box.took_us is None else f" in {_human_time(box.took_us)}"
        lines.append(f"outcome: {box.outcome}{took}")
    if box.group is not None:
        lines.append(f"group: {box.group}")
    return "\n".join(lines)


def _svg_badge(
    out: list[str], text: str, fill: str, ink: str, x: float, y: float, w: float
) -> None:
    out.append(
        f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(_BADGE_H)}" '
        f'rx="{_num(_BADGE_H / 2)}" fill="{fill}"/>'
        f'<text x="{_num(x + w / 2)}" y="{_num(y + 11.5)}" text-anchor="middle" '
        f'font-size="{_num(_BADGE_SIZE)}" font-weight="500" fill="{ink}">{_xml(text)}</text>'
    )


def _svg_sample(out: list[str], kind: str, x: float, cy: float, outcome: str | None) -> None:
    """A small box in the legend showing how a mark or an outcome looks."""
    y = cy - _LEGEND_SAMPLE_H / 2
    w, h = _LEGEND_SAMPLE_W, _LEGEND_SAMPLE_H
    fill, stroke, dash = _BG, _BORDER, ""
    if outcome is not None:
        fill, stroke, _, _ = _OUTCOME_STYLE[outcome]
        dash = ' stroke-dasharray="3 2"' if outcome == "spared" else ""
    out.append(
        f'<rect x="{_num(x + 0.5)}" y="{_num(y + 0.5)}" width="{_num(w - 1)}" '
        f'height="{_num(h - 1)}" rx="4" fill="{fill}" stroke="{stroke}"{dash}/>'
    )
    if kind == "frozen":
        out.append(
            f'<path d="M{_num(x + 4)},{_num(y)} H{_num(x + 2)} Q{_num(x)},{_num(y)} '
            f"{_num(x)},{_num(y + 2)} V{_num(y + h - 2)} Q{_num(x)},{_num(y + h)} "
            f'{_num(x + 2)},{_num(y + h)} H{_num(x + 4)} Z" fill="{_FROZEN}"/>'
        )
    elif kind == "cached":
        out.append(
            f'<rect x="{_num(x + 3)}" y="{_num(y + 3)}" width="{_num(w - 6)}" '
            f'height="{_num(h - 6)}" rx="2" fill="none" stroke="{_CACHED}"/>'
        )


def _render_svg(arr: _Arrangement, uid: str) -> str:
    W, H = arr.width, arr.height
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(W)}" height="{_num(H)}" '
        f'viewBox="0 0 {_num(W)} {_num(H)}" font-family=\'{_FONT}\' font-size="12" '
        f'role="img" aria-label="{_xml(arr.title or "pipeline graph")}">'
    ]
    if arr.title:
        out.append(f"<title>{_xml(arr.title)}</title>")
    out.append(
        "<defs>"
        f'<marker id="{uid}-arrow" viewBox="0 0 8 8" refX="0" refY="4" markerWidth="8" '
        f'markerHeight="8" markerUnits="userSpaceOnUse" orient="auto">'
        f'<path d="M0,0.5 L8,4 L0,7.5 Z" fill="{_EDGE}"/></marker>'
        f'<marker id="{uid}-arrow-crossed" viewBox="0 0 8 10" refX="0" refY="5" '
        f'markerWidth="8" markerHeight="10" markerUnits="userSpaceOnUse" orient="auto">'
        f'<path d="M0,0 L8,5 L0,10 Z" fill="{_EDGE_CROSSED}"/></marker>'
        "</defs>"
    )
    out.append(f'<rect width="{_num(W)}" height="{_num(H)}" fill="{_BG}"/>')
    if arr.title:
        out.append(
            f'<text x="{_num(_MARGIN)}" y="{_num(_MARGIN + 14)}" font-size="{_num(_TITLE_SIZE)}" '
            f'font-weight="600" fill="{_INK}">{_xml(arr.title)}</text>'
        )

    for c in arr.clusters:
        out.append(
            f'<g class="group"><rect x="{_num(c.x)}" y="{_num(c.y)}" width="{_num(c.w)}" '
            f'height="{_num(c.h)}" rx="12" fill="{_GROUP_FILL}" stroke="{_GROUP_STROKE}"/>'
            f'<text x="{_num(c.x + 12)}" y="{_num(c.y + 17)}" font-size="{_num(_GROUP_SIZE)}" '
            f'font-weight="600" fill="{_MUTED}">{_xml(c.label)}</text></g>'
        )

    out.append('<g class="edges" fill="none">')
    for r in arr.routes:
        crossed = r.arrow.crossed_bytes is not None
        stroke, width = (_EDGE_CROSSED, 2.75) if crossed else (_EDGE, 1.25)
        marker = f"{uid}-arrow-crossed" if crossed else f"{uid}-arrow"
        out.append(
            f'<path class="edge" d="{_svg_path(r)}" stroke="{stroke}" '
            f'stroke-width="{_num(width)}" marker-end="url(#{marker})">'
            f"<title>{_xml(r.arrow.source)} → {_xml(r.arrow.target)}"
            f"{'' if r.label is None else ' · ' + _xml(r.label)}</title></path>"
        )
    out.append("</g>")
    for r in arr.routes:
        if r.label is not None and r.label_at is not None:
            w = _text_width(r.label, _BADGE_SIZE) + 2 * _BADGE_PAD
            x, y = r.label_at[0] - w / 2, r.label_at[1] - _BADGE_H / 2
            out.append(
                f'<g class="bytes"><rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
                f'height="{_num(_BADGE_H)}" rx="{_num(_BADGE_H / 2)}" fill="{_BG}" '
                f'stroke="{_EDGE_CROSSED}" stroke-width="1"/>'
                f'<text x="{_num(r.label_at[0])}" y="{_num(y + 11.5)}" text-anchor="middle" '
                f'font-size="{_num(_BADGE_SIZE)}" font-weight="600" fill="{_EDGE_CROSSED}">'
                f"{_xml(r.label)}</text></g>"
            )

    for p in arr.boxes:
        b = p.box
        fill, stroke, dashed, name_ink, kind_ink = _box_colours(b)
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        out.append(f'<g class="box" data-name="{_xml(b.name)}"><title>{_xml(_tooltip(b))}</title>')
        out.append(
            f'<rect x="{_num(p.x + 0.5)}" y="{_num(p.y + 0.5)}" width="{_num(p.w - 1)}" '
            f'height="{_num(p.h - 1)}" rx="{_num(_RADIUS)}" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="1"{dash}/>'
        )
        if "cached" in b.marks:
            out.append(
                f'<rect class="cached" x="{_num(p.x + 3.5)}" y="{_num(p.y + 3.5)}" '
                f'width="{_num(p.w - 7)}" height="{_num(p.h - 7)}" rx="{_num(_RADIUS - 3)}" '
                f'fill="none" stroke="{_CACHED}" stroke-width="1"/>'
            )
        if "frozen" in b.marks:
            pts = _stripe_path(p.x, p.y, p.h)
            d = "M" + " L".join(f"{_num(px)},{_num(py)}" for px, py in pts) + " Z"
            out.append(f'<path class="frozen" d="{d}" fill="{_FROZEN}"/>')
        out.append(
            f'<text x="{_num(p.x + _PAD_X)}" y="{_num(p.y + _NAME_BASE)}" '
            f'font-size="{_num(_NAME_SIZE)}" font-weight="600" fill="{name_ink}">'
            f"{_xml(p.label)}</text>"
            f'<text x="{_num(p.x + _PAD_X)}" y="{_num(p.y + _KIND_BASE)}" '
            f'font-size="{_num(_KIND_SIZE)}" fill="{kind_ink}">{_xml(p.kind_label)}</text>'
        )
        for badge in p.badges:
            bf, bt = _badge_colours(badge.tone, b.outcome)
            _svg_badge(out, badge.text, bf, bt, badge.x, badge.y, badge.w)
        out.append("</g>")

    if arr.legend_top is not None:
        out.append('<g class="legend">')
        out.append(
            f'<line x1="{_num(_MARGIN)}" y1="{_num(arr.legend_top + 0.5)}" '
            f'x2="{_num(W - _MARGIN)}" y2="{_num(arr.legend_top + 0.5)}" stroke="{_GROUP_STROKE}"/>'
        )
        for item in arr.legend:
            base = item.y + 4
            if item.kind == "caption":
                out.append(
                    f'<text x="{_num(item.x)}" y="{_num(base)}" font-size="{_num(_CAPTION_SIZE)}" '
                    f'font-weight="600" letter-spacing="0.06em" fill="#94a3b8">'
                    f"{_xml(item.text.upper())}</text>"
                )
                continue
            text_x = item.x + _LEGEND_SAMPLE_W + 6
            if item.kind == "mapped":
                fill, ink = _BADGE_STYLE["mapped"]
                _svg_badge(out, "mapped", fill, ink, item.x, item.y - _BADGE_H / 2, item.w)
                continue
            if item.kind == "at":
                fill, ink = _BADGE_STYLE["at"]
                bw = _text_width("@ w", _BADGE_SIZE) + 2 * _BADGE_PAD
                _svg_badge(out, "@ w", fill, ink, item.x, item.y - _BADGE_H / 2, bw)
                text_x = item.x + bw + 6
            elif item.kind == "crossed":
                out.append(
                    f'<line x1="{_num(item.x)}" y1="{_num(item.y)}" '
                    f'x2="{_num(item.x + _LEGEND_SAMPLE_W - _ARROW_LEN)}" y2="{_num(item.y)}" '
                    f'stroke="{_EDGE_CROSSED}" stroke-width="2.75" '
                    f'marker-end="url(#{uid}-arrow-crossed)"/>'
                )
            else:
                _svg_sample(out, item.kind, item.x, item.y, item.outcome)
            out.append(
                f'<text x="{_num(text_x)}" y="{_num(base)}" font-size="{_num(_LEGEND_SIZE)}" '
                f'fill="#334155">{_xml(item.text)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


# --------------------------------------------------------------------------- PNG

_PIL_MISSING = (
    "PNG output needs Pillow: pip install pillow "
    "(or install the extra: pip install 'somatize[figure]')"
)


@lru_cache(maxsize=64)
def _pil_font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _pil_text(text: str) -> str:
    """Spell ``text`` with the characters Pillow's built-in font can draw."""
    text = text.replace("µ", "u").replace("→", "->").replace("—", "-").replace("–", "-")
    out = []
    for ch in text:
        if ord(ch) < 128 or ch in "·…":
            out.append(ch)
        else:
            plain = "".join(c for c in unicodedata.normalize("NFKD", ch) if ord(c) < 128)
            out.append(plain or ch)
    return "".join(out)


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def _bezier(p: Point, c1: Point, c2: Point, q: Point, steps: int = 20) -> list[Point]:
    pts = []
    for i in range(1, steps + 1):
        t = i / steps
        u = 1 - t
        pts.append(
            (
                u**3 * p[0] + 3 * u * u * t * c1[0] + 3 * u * t * t * c2[0] + t**3 * q[0],
                u**3 * p[1] + 3 * u * u * t * c1[1] + 3 * u * t * t * c2[1] + t**3 * q[1],
            )
        )
    return pts


def _simplify(pts: list[Point], tolerance: float = 0.25) -> list[Point]:
    """Drop points that lie on the line through their neighbours (their joints draw specks)."""
    out = [pts[0]]
    for here, after in itertools.pairwise(pts[1:]):
        (ax, ay), (bx, by) = out[-1], after
        length = math.hypot(bx - ax, by - ay)
        off = abs((bx - ax) * (here[1] - ay) - (by - ay) * (here[0] - ax)) / length if length else 0
        if off > tolerance:
            out.append(here)
    if len(pts) > 1:
        out.append(pts[-1])
    return out


def _rounded_outline(x0: float, y0: float, x1: float, y1: float, r: float) -> list[Point]:
    """Points round the border of a rounded rectangle, clockwise from the top-left."""
    pts: list[Point] = []
    corners = (
        (x1 - r, y0 + r, -90.0),
        (x1 - r, y1 - r, 0.0),
        (x0 + r, y1 - r, 90.0),
        (x0 + r, y0 + r, 180.0),
    )
    for cx, cy, start in corners:
        for i in range(7):
            ang = math.radians(start + 90 * i / 6)
            pts.append((cx + r * math.cos(ang), cy + r * math.sin(ang)))
    pts.append(pts[0])
    return pts


def _dashed(
    draw: ImageDraw.ImageDraw, pts: list[Point], on: float, off: float, fill: Any, width: int
) -> None:
    """Draw a polyline as dashes of length ``on`` separated by ``off``."""
    drawing, left = True, on
    for (ax, ay), (bx, by) in itertools.pairwise(pts):
        seg = math.hypot(bx - ax, by - ay)
        pos = 0.0
        while seg - pos > 1e-9:
            step = min(left, seg - pos)
            if drawing:
                t0, t1 = pos / seg, (pos + step) / seg
                draw.line(
                    [
                        (ax + (bx - ax) * t0, ay + (by - ay) * t0),
                        (ax + (bx - ax) * t1, ay + (by - ay) * t1),
                    ],
                    fill=fill,
                    width=width,
                )
            pos += step
            left -= step
            if left <= 1e-9:
                drawing = not drawing
                left = on if drawing else off


def _render_png(arr: _Arrangement, scale: float) -> bytes:
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as err:
        raise ImportError(_PIL_MISSING) from err
    if not scale > 0:
        raise ValueError(f"scale must be positive, not {scale!r}")
    final = (max(1, round(arr.width * scale)), max(1, round(arr.height * scale)))
    ss = 2 if final[0] * final[1] <= 6_000_000 else 1  # draw larger, then shrink: smooth edges
    k = scale * ss
    img = Image.new("RGB", (max(1, round(arr.width * k)), max(1, round(arr.height * k))), _BG)
    draw = ImageDraw.Draw(img)

    def P(pt: Point) -> tuple[float, float]:
        return (pt[0] * k, pt[1] * k)

    def px(v: float) -> int:
        return max(1, round(v * k))

    def text(
        x: float,
        y: float,
        s: str,
        size: float,
        fill: str,
        bold: bool = False,
        anchor: str = "ls",
        max_w: float | None = None,
    ) -> None:
        font = _pil_font(max(1, round(size * k)))
        s = _pil_text(s)
        if max_w is not None:
            s = _fit(s, max_w * k, lambda t: float(font.getlength(t)))
        stroke = max(1, round(0.3 * k)) if bold else 0
        if isinstance(font, ImageFont.FreeTypeFont):
            draw.text(
                (x * k, y * k),
                s,
                fill=fill,
                font=font,
                anchor=anchor,
                stroke_width=stroke,
                stroke_fill=fill,
            )
        else:  # a bitmap font without anchors: place its top-left corner instead
            w = font.getlength(s)
            left = x * k - (w / 2 if anchor[0] == "m" else 0)
            draw.text((left, y * k - 11), s, fill=fill, font=font)

    def badge(s: str, fill: str, ink: str, x: float, y: float, w: float) -> None:
        draw.rounded_rectangle(
            [x * k, y * k, (x + w) * k, (y + _BADGE_H) * k], radius=_BADGE_H / 2 * k, fill=fill
        )
        text(x + w / 2, y + 11.5, s, _BADGE_SIZE, ink, anchor="ms", max_w=w - 4)

    def rounded(
        x: float,
        y: float,
        w: float,
        h: float,
        r: float,
        fill: str | None,
        stroke: str,
        dashed: bool = False,
        width: float = 1.0,
    ) -> None:
        box = [x * k, y * k, (x + w) * k - 1, (y + h) * k - 1]
        if dashed:
            if fill is not None:
                draw.rounded_rectangle(box, radius=r * k, fill=fill)
            pts = _rounded_outline(x * k, y * k, (x + w) * k - 1, (y + h) * k - 1, r * k)
            _dashed(draw, pts, 4 * k, 3 * k, stroke, px(width))
        else:
            draw.rounded_rectangle(box, radius=r * k, fill=fill, outline=stroke, width=px(width))

    def arrowhead(at: Point, colour: str, half: float) -> None:
        x, y = at
        draw.polygon([P((x, y - half)), P((x + _ARROW_LEN, y)), P((x, y + half))], fill=colour)

    if arr.title:
        text(_MARGIN, _MARGIN + 14, arr.title, _TITLE_SIZE, _INK, bold=True)
    for c in arr.clusters:
        rounded(c.x, c.y, c.w, c.h, 12, _GROUP_FILL, _GROUP_STROKE)
        text(c.x + 12, c.y + 17, c.label, _GROUP_SIZE, _MUTED, bold=True, max_w=c.w - 24)

    for r in arr.routes:
        crossed = r.arrow.crossed_bytes is not None
        colour, width = (_EDGE_CROSSED, 2.75) if crossed else (_EDGE, 1.25)
        pts: list[Point] = [r.start]
        here = r.start
        for c1, c2, q in r.segments:
            pts.extend(_bezier(here, c1, c2, q) if c1 != here else [q])
            here = q
        draw.line(_simplify([P(p) for p in pts]), fill=colour, width=px(width), joint="curve")
        arrowhead(here, colour, 5.0 if crossed else 3.5)
    for r in arr.routes:
        if r.label is not None and r.label_at is not None:
            w = _text_width(r.label, _BADGE_SIZE) + 2 * _BADGE_PAD
            x, y = r.label_at[0] - w / 2, r.label_at[1] - _BADGE_H / 2
            draw.rounded_rectangle(
                [x * k, y * k, (x + w) * k, (y + _BADGE_H) * k],
                radius=_BADGE_H / 2 * k,
                fill=_BG,
                outline=_EDGE_CROSSED,
                width=px(1),
            )
            text(r.label_at[0], y + 11.5, r.label, _BADGE_SIZE, _EDGE_CROSSED, True, "ms")

    for p in arr.boxes:
        b = p.box
        fill, stroke, dashed, name_ink, kind_ink = _box_colours(b)
        rounded(p.x, p.y, p.w, p.h, _RADIUS, fill, stroke, dashed)
        if "cached" in b.marks:
            rounded(p.x + 3, p.y + 3, p.w - 6, p.h - 6, _RADIUS - 3, None, _CACHED)
        if "frozen" in b.marks:
            draw.polygon([P(pt) for pt in _stripe_path(p.x, p.y, p.h)], fill=_FROZEN)
        content = p.w - 2 * _PAD_X
        text(p.x + _PAD_X, p.y + _NAME_BASE, p.label, _NAME_SIZE, name_ink, True, max_w=content)
        text(p.x + _PAD_X, p.y + _KIND_BASE, p.kind_label, _KIND_SIZE, kind_ink, max_w=content)
        for bd in p.badges:
            bf, bt = _badge_colours(bd.tone, b.outcome)
            badge(bd.text, bf, bt, bd.x, bd.y, bd.w)

    if arr.legend_top is not None:
        ly = arr.legend_top
        draw.line([P((_MARGIN, ly)), P((arr.width - _MARGIN, ly))], fill=_GROUP_STROKE, width=px(1))
        for item in arr.legend:
            base = item.y + 4
            if item.kind == "caption":
                text(item.x, base, item.text.upper(), _CAPTION_SIZE, "#94a3b8", bold=True)
                continue
            text_x = item.x + _LEGEND_SAMPLE_W + 6
            if item.kind == "mapped":
                badge("mapped", *_BADGE_STYLE["mapped"], item.x, item.y - _BADGE_H / 2, item.w)
                continue
            if item.kind == "at":
                bw = _text_width("@ w", _BADGE_SIZE) + 2 * _BADGE_PAD
                badge("@ w", *_BADGE_STYLE["at"], item.x, item.y - _BADGE_H / 2, bw)
                text_x = item.x + bw + 6
            elif item.kind == "crossed":
                end = (item.x + _LEGEND_SAMPLE_W - _ARROW_LEN, item.y)
                draw.line([P((item.x, item.y)), P(end)], fill=_EDGE_CROSSED, width=px(2.75))
                arrowhead(end, _EDGE_CROSSED, 5.0)
            else:
                sx, sy = item.x, item.y - _LEGEND_SAMPLE_H / 2
                sw, sh = _LEGEND_SAMPLE_W, _LEGEND_SAMPLE_H
                sfill, sstroke, sdash = _BG, _BORDER, False
                if item.outcome is not None:
                    sfill, sstroke, _, _ = _OUTCOME_STYLE[item.outcome]
                    sdash = item.outcome == "spared"
                rounded(sx, sy, sw, sh, 4, sfill, sstroke, sdash)
                if item.kind == "frozen":
                    draw.rounded_rectangle(
                        [sx * k, sy * k, (sx + 4) * k, (sy + sh) * k - 1],
                        radius=2 * k,
                        fill=_FROZEN,
                        corners=(True, False, False, True),
                    )
                elif item.kind == "cached":
                    rounded(sx + 3, sy + 3, sw - 6, sh - 6, 2, None, _CACHED)
            text(text_x, base, item.text, _LEGEND_SIZE, "#334155")

    if ss != 1:
        img = img.resize(final, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


# --------------------------------------------------------------------------- Figure


class Figure:
    """A drawing of a pipeline graph: boxes for nodes, arrows for the values between them.

    The layout is computed once, when the figure is made; a cycle, a repeated box name,
    an arrow to an unknown box, an unknown mark or an unknown outcome raise ``ValueError``.
    """

    def __init__(
        self, boxes: Sequence[Box], arrows: Sequence[Arrow], title: str | None = None
    ) -> None:
        self.boxes: tuple[Box, ...] = tuple(boxes)
        self.arrows: tuple[Arrow, ...] = tuple(arrows)
        self.title = title
        for b in self.boxes:
            unknown = [m for m in b.marks if m not in MARKS]
            if unknown:
                raise ValueError(
                    f"box {b.name!r} has unknown mark(s) {unknown}; marks are one of {list(MARKS)}"
                )
            if b.outcome is not None and b.outcome not in OUTCOMES:
                raise ValueError(
                    f"box {b.name!r} has unknown outcome {b.outcome!r}; "
                    f"outcomes are one of {list(OUTCOMES)} or None"
                )
        self._arrangement = _arrange(self.boxes, self.arrows, title)
        digest = hashlib.sha1(repr((self.boxes, self.arrows, title)).encode("utf-8"))
        self._uid = "smz" + digest.hexdigest()[:10]

    def __repr__(self) -> str:
        title = "" if self.title is None else f"{self.title!r}, "
        return f"Figure({title}{len(self.boxes)} boxes, {len(self.arrows)} arrows)"

    @property
    def size(self) -> tuple[float, float]:
        """Width and height of the drawing in CSS pixels."""
        return (self._arrangement.width, self._arrangement.height)

    def svg(self) -> str:
        """The drawing as a standalone SVG document."""
        return _render_svg(self._arrangement, self._uid)

    def png(self, scale: float = 2.0) -> bytes:
        """The drawing as PNG bytes, ``scale`` pixels per CSS pixel; needs Pillow."""
        return _render_png(self._arrangement, scale)

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_png_(self) -> bytes | None:
        try:
            import PIL  # noqa: F401
        except ImportError:
            return None
        return self.png()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the drawing to ``path``: SVG or PNG, chosen by the suffix."""
        target = Path(path)
        suffix = target.suffix.lower()
        if suffix == ".svg":
            target.write_text(self.svg(), encoding="utf-8")
        elif suffix == ".png":
            target.write_bytes(self.png())
        else:
            raise ValueError(
                f"cannot save a figure as {suffix or 'a file without a suffix'!r} ({target}); "
                "use one of: .svg, .png"
            )
