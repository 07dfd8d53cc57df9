"""The legend: rows under the graph naming the marks and outcomes the figure shows.

A row appears only for what the figure uses, so a plain graph has no legend: under one
caption the memory marks its boxes carry, under another, once it shows a run, every
outcome (not reached only where a node was not), and the bytes that crossed to or from
a worker if any did. Items flow left to right and wrap at the figure's width. Each
item's width is measured here, from the same text widths as the boxes, so that the
figure can be widened to hold the legend and both renderers draw it alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._arrangement import _LegendItem
from .model import OUTCOMES, Arrow, Box
from .style import (
    _BADGE_PAD,
    _BADGE_SIZE,
    _CAPTION_SIZE,
    _LEGEND_ITEM_GAP,
    _LEGEND_ROW,
    _LEGEND_SAMPLE_W,
    _LEGEND_SIZE,
    _MARGIN,
    _OUTCOME_WORDS,
    _text_width,
)


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
        shown = {b.outcome for b in boxes}  # not reached: only where some node was not
        run.extend(("outcome", o) for o in OUTCOMES if o != "unreached" or o in shown)
    if any(a.crossed_bytes is not None for a in arrows):
        run.append(("crossed", "bytes to or from a worker"))
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
        for kind, name in entries:
            outcome = name if kind == "outcome" else None
            text = _OUTCOME_WORDS.get(name, name) if outcome is not None else name
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
            items.append(_LegendItem(kind, text, x, y, w, outcome))
            x += w + _LEGEND_ITEM_GAP
        y += _LEGEND_ROW
    return items, y - _LEGEND_ROW / 2
