"""Which column each box goes in, and in what order within it.

These are the first two steps of a layered (Sugiyama) layout. A box's column is the
longest path to it from a source, so every arrow points right; a source is then moved
to the column just before its first target, so that an input sits beside the box that
reads it rather than at the far left. Within its columns a component is ordered to cut
crossings: depth-first from the sources for a start, then barycentre sweeps, down and
up, keeping the best order seen (fewest crossings is NP-hard; the sweeps are the usual
heuristic). The boxes of one group are kept next to each other after every sweep, so
that the frame drawn round the group holds them and nothing else.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence


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
