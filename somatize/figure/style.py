"""The look of a figure: colours, sizes, spacing, and how wide text is.

Layout and both renderers must agree on every measure (a box is as wide as its text is
estimated to be, and the SVG and the PNG paint the same colours), so the numbers and the
small helpers that turn a box into colours and text into widths live here, once.
Only the standard library is used: text is measured from Helvetica's advance widths,
not from a font file.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Sequence

from .model import Arrow, Box, Point

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
    "unreached": ("#ffffff", "#cbd5e1", "#f1f5f9", "#64748b"),
}

#: outcome -> the dashes of its broken border (on, off): on a box, and on a legend sample
_DASHES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "spared": ((4.0, 3.0), (3.0, 2.0)),
    "unreached": ((1.5, 3.0), (1.0, 2.0)),
}

#: outcome -> how a badge and the legend write it, where not as its name
_OUTCOME_WORDS: dict[str, str] = {"unreached": "not reached"}

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


_LINE_BREAKING = frozenset(("Cc", "Zl", "Zp"))
"""The categories of characters that break or control a line: control characters (a
newline, a tab), and the line and paragraph separators (U+2028, U+2029)."""


def _salt_shown(salt: str) -> str:
    """``salt`` as a box shows it: as it is, or, where it holds a character that breaks or
    controls a line, as Python writes it, quoted and escaped on one line (``'v1\\nv2'``), as
    ``print(g)`` shows it: a node's name cannot hold such a character, a salt can, and it
    would show as two lines, or as another salt that reads alike."""
    if salt.isprintable() or all(unicodedata.category(ch) not in _LINE_BREAKING for ch in salt):
        return salt
    return repr(salt)


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


def _largest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[lo, hi]`` for which ``fits(n)``, taking ``fits`` to hold up to
    some ``n`` and not beyond (``lo`` if it holds for none)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_prefix(one: str, other: str) -> int:
    """How many characters ``one`` and ``other`` begin with alike."""
    n = 0
    for a, b in zip(one, other, strict=False):
        if a != b:
            break
        n += 1
    return n


def _fit_showing(text: str, at: int, max_w: float, measure: Callable[[str], float]) -> str:
    """Shorten ``text`` to fit ``max_w`` keeping the character at index ``at`` in sight:
    cut at the end if that keeps it, else at the start, else on both sides of it."""
    if measure(text) <= max_w:
        return text
    n = len(text)
    keep = _largest(0, n - 1, lambda k: measure(text[:k] + "…") <= max_w)
    if keep > at:
        return text[:keep] + "…"
    tail = _largest(0, n - 1, lambda k: measure("…" + text[n - k :]) <= max_w)
    if n - tail <= at:
        return "…" + text[n - tail :]

    def window(size: int) -> str:
        start = min(max(0, at - size // 3), n - size)
        return "…" + text[start : start + size] + "…"

    return window(_largest(1, n - 1, lambda size: measure(window(size)) <= max_w))


def _fit_apart(
    texts: Sequence[str],
    widths: Sequence[float],
    measure: Callable[[str], float],
    spelled: Callable[[str], str] = lambda text: text,
) -> list[str]:
    """Fit each of ``texts`` (all different) to its width as :func:`_fit` does, but never
    two alike as ``spelled`` writes them (the SVG writes every character XML cannot hold,
    a lone surrogate, as U+FFFD; the PNG an ellipsis its font lacks as three dots): where
    two would read the same, each is cut again to show where it differs from the other;
    and should some still read the same, they are numbered."""
    fitted = [_fit(t, w, measure) for t, w in zip(texts, widths, strict=True)]
    for _ in range(3):
        alike: dict[str, list[str]] = {}
        for text, shown in zip(texts, fitted, strict=True):
            alike.setdefault(spelled(shown), []).append(text)
        if all(len(same) == 1 for same in alike.values()):
            return fitted
        for i, (text, shown) in enumerate(zip(texts, fitted, strict=True)):
            others = [t for t in alike[spelled(shown)] if t != text]
            if others:
                at = max(_common_prefix(text, t) for t in others)
                fitted[i] = _fit_showing(text, at, widths[i], measure)
    seen: dict[str, int] = {}
    for shown in fitted:
        seen[spelled(shown)] = seen.get(spelled(shown), 0) + 1
    count: dict[str, int] = {}
    for i, shown in enumerate(fitted):
        key = spelled(shown)
        if seen[key] > 1:
            count[key] = count.get(key, 0) + 1
            mark = f" #{count[key]}"
            fitted[i] = _fit(texts[i], widths[i] - measure(mark), measure) + mark
    return fitted


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


def _edge_label(arrow: Arrow) -> str | None:
    """What is written on an edge: how many times it is read, if more than once (``×2``),
    and the bytes its value crossed to or from a worker, if any did."""
    parts = [f"×{arrow.reads}"] if arrow.reads > 1 else []
    if arrow.crossed_bytes is not None:
        parts.append(_human_bytes(arrow.crossed_bytes))
    return " · ".join(parts) if parts else None


def _box_colours(box: Box) -> tuple[str, str, tuple[float, float] | None, str, str]:
    """Fill, stroke, dashes of the border (None: a solid one), name colour and kind colour
    of a box."""
    if box.outcome is None:
        return _BG, _BORDER, None, _INK, _MUTED
    fill, stroke, _, _ = _OUTCOME_STYLE[box.outcome]
    if box.outcome in _DASHES:  # spared or not reached: nothing ran, the box is greyed
        return fill, stroke, _DASHES[box.outcome][0], _MUTED, "#94a3b8"
    return fill, stroke, None, _INK, "#475569"


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
