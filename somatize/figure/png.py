"""The PNG renderer: an arrangement painted through Pillow.

Pillow is optional, so it is imported only when a PNG is asked for, and a missing
Pillow says how to install it. Unless the image is very large it is drawn at twice
the size and shrunk, which smooths its edges. Text is drawn in Pillow's built-in font,
never one of the machine's, so that a PNG is the same wherever it is drawn; that font
has ASCII and a few symbols, so any other character is written escaped, as Python's
``ascii()`` writes it, and two different names never draw alike.

Drawing takes time in proportion to the pixels: a graph of ``n`` boxes is about ``n``
rows tall, and so is the image. A fan-out of ``n`` edges holds edges about as long, which
lie on one another for most of their length: their steep parts are painted together,
each pixel once (:func:`_draw_lines`), so that they cost what shows of them, not the
square of ``n``. Still, a graph of a thousand nodes is about a hundred million pixels at
the default scale, seconds to draw and pack: that is why a notebook is shown the SVG
only (see ``Figure._repr_mimebundle_``).
"""

from __future__ import annotations

import io
import itertools
import math
import numbers
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ._arrangement import _Arrangement
from .layout import _arrange
from .model import Arrow, Box, Point
from .style import (
    _ARROW_LEN,
    _BADGE_H,
    _BADGE_PAD,
    _BADGE_SIZE,
    _BADGE_STYLE,
    _BG,
    _BORDER,
    _CACHED,
    _CAPTION_SIZE,
    _DASHES,
    _EDGE,
    _EDGE_CROSSED,
    _FROZEN,
    _GROUP_FILL,
    _GROUP_SIZE,
    _GROUP_STROKE,
    _INK,
    _KIND_BASE,
    _KIND_SIZE,
    _LEGEND_SAMPLE_H,
    _LEGEND_SAMPLE_W,
    _LEGEND_SIZE,
    _MARGIN,
    _MUTED,
    _NAME_BASE,
    _NAME_SIZE,
    _OUTCOME_STYLE,
    _PAD_X,
    _RADIUS,
    _TITLE_SIZE,
    _badge_colours,
    _box_colours,
    _fit,
    _fit_apart,
    _stripe_path,
    _text_width,
)

if TYPE_CHECKING:
    from PIL import ImageDraw, ImageFont

_PIL_MISSING = (
    "PNG output needs Pillow: pip install pillow "
    "(or install the extra: pip install 'somatize[figure]')"
)


#: The scales a PNG may be drawn at, in pixels per CSS pixel: from a thumbnail to print.
_SCALES = (0.05, 10.0)


def _check_scale(scale: object) -> None:
    """Refuse a scale that is no number, or one outside ``_SCALES``."""
    low, high = _SCALES
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"scale must be a number from {low} to {high} (pixels per CSS pixel), "
            f"not {type(scale).__name__} {scale!r}"
        )
    if not low <= float(scale) <= high:  # NaN fails this too
        raise ValueError(
            f"scale must be from {low} to {high} (pixels per CSS pixel), not {scale!r}"
        )


@lru_cache(maxsize=64)
def _pil_font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


#: the figure's own symbols, spelled plainly where the font lacks them (a time in µs, a
#: count of reads ×2); what a user named is escaped instead, never spelled so
_PLAIN = {"µ": "u", "×": "x", "→": "->", "—": "-", "–": "-", "·": "-"}


@lru_cache(maxsize=4096)
def _has_glyph(ch: str) -> bool:
    """Whether Pillow's built-in font draws ``ch`` as itself rather than as the box it draws
    for a glyph it lacks. The font is asked, not a list, and it is Pillow's own, never one
    of the machine's: the same text draws the same wherever the same Pillow is."""
    if " " <= ch <= "~":
        return True
    if ch < "\xa0":  # a control character
        return False
    from PIL import Image, ImageDraw, ImageFont

    font = _pil_font(20)
    if not isinstance(font, ImageFont.FreeTypeFont):
        return False  # the bitmap font of a Pillow without FreeType: ASCII only

    def drawn(one: str) -> tuple[float, bytes]:
        img = Image.new("L", (48, 40))
        ImageDraw.Draw(img).text((8, 6), one, font=font, fill=255)
        return font.getlength(one), img.tobytes()

    return drawn(ch) != drawn("\uffff")  # a noncharacter: no font has it


def _pil_text(text: str, ours: bool = False) -> str:
    """``text`` spelled with the characters Pillow's built-in font draws: any other is
    escaped as Python's ``ascii()`` writes it (数 as ``\\u6570``, é as ``\\xe9``) and a
    backslash is doubled, so that two different texts are never spelled alike. In
    ``ours``, the figure's own words, a few symbols are spelled plainly instead (µs as
    ``us``); an ellipsis, which only a cut adds, is three dots where the font lacks it."""
    out = []
    for ch in text:
        if ch != "\\" and _has_glyph(ch):
            out.append(ch)
        elif ch == "…":
            out.append("...")
        elif ours and ch in _PLAIN:
            out.append(_PLAIN[ch])
        else:
            out.append(ascii(ch)[1:-1])
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


def _frame(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
    """A rectangle's corners, its far side pulled back no further than its near one: at a
    small scale a thin frame, drawn one pixel in from its edge, would otherwise turn over."""
    return (x0, y0, max(x0, x1), max(y0, y1))


def _rounded_rectangle(
    draw: ImageDraw.ImageDraw, box: Sequence[float], radius: float, **style: Any
) -> None:
    """Pillow's rounded rectangle in the frame ``box``, made safe by :func:`_frame`; a few
    pixels small it is drawn square, as its corners would not show (and Pillow's pieces of
    them, each a pixel or two, can turn over and be refused)."""
    x0, y0, x1, y1 = _frame(*box)
    if min(round(x1) - round(x0), round(y1) - round(y0)) < 8:
        style.pop("corners", None)
        draw.rectangle((x0, y0, x1, y1), **style)
    else:
        draw.rounded_rectangle((x0, y0, x1, y1), radius=radius, **style)


#: a segment of a line this many times as tall as it is wide (the line's width counted) is
#: painted a pixel column at a time; a flatter one is drawn by Pillow
_TALL = 24


def _add_column_runs(
    columns: dict[int, list[tuple[int, int]]],
    a: Point,
    b: Point,
    r: float,
    joints: tuple[bool, bool],
) -> None:
    """Add to ``columns`` what the segment from ``a`` to ``b`` drawn ``2 * r`` thick covers, a
    pixel column at a time: for each column it crosses, the first and last row it covers
    there. A pixel is covered when its centre is nearer the segment than ``r``; the
    segment's ends are flat, or round where ``joints`` says it meets another. The segment
    is steep (``a`` and ``b`` at different heights)."""
    (ax, ay), (bx, by) = a, b
    dx, dy = bx - ax, by - ay
    length2 = dx * dx + dy * dy
    slope = dy / dx if dx else 0.0
    across = r * math.sqrt(length2) / abs(dx) if dx else 0.0  # half the line, upright
    lean, reach = dx / dy, length2 / abs(dy)  # where its ends cut a column, and how far apart
    ends = [end for end, joint in zip((a, b), joints, strict=True) if joint]
    for column in range(math.ceil(min(ax, bx) - r), math.floor(max(ax, bx) + r) + 1):
        # between the lines square to the segment through its ends ...
        lo = ay - (column - ax) * lean
        if dy < 0:
            lo -= reach
        hi = lo + reach
        # ... and nearer its line than r
        if dx:
            mid = ay + (column - ax) * slope
            if mid - across > lo:
                lo = mid - across
            if mid + across < hi:
                hi = mid + across
        elif not -r < column - ax < r:
            hi = lo
        for ex, ey in ends:
            off = column - ex
            if -r < off < r:
                half = math.sqrt(r * r - off * off)
                if lo >= hi:
                    lo, hi = ey - half, ey + half
                else:
                    lo, hi = min(lo, ey - half), max(hi, ey + half)
        first, last = math.ceil(lo), math.ceil(hi) - 1
        if first <= last:
            runs = columns.get(column)
            if runs is None:
                columns[column] = [(first, last)]
            else:
                runs.append((first, last))


def _draw_lines(
    draw: ImageDraw.ImageDraw, lines: Iterable[Sequence[Point]], width: int, fill: Any
) -> None:
    """Draw ``lines`` (polylines, in pixels) ``width`` pixels thick, as Pillow draws a line
    with curved joints; but their steep segments are painted together, a pixel column at a
    time, each column's rows merged first and painted once.

    A thick line drawn by Pillow costs a step for each row it spans. The arrows of a wide
    fan-out are steep, as long as the fan-out is tall and lie on one another for most of
    their length: drawn one by one they would cost the square of the fan-out's width,
    painted together they cost the width of their columns and the ink that shows.
    """
    offset = 0.5 if width % 2 == 0 else 0.0  # where Pillow centres a line this thick
    r = width / 2
    columns: dict[int, list[tuple[int, int]]] = {}
    for line in lines:
        # on the pixels Pillow would put it on: whole coordinates, and a half for an even width
        pts = [(math.floor(x) + offset, math.floor(y) + offset) for x, y in line]
        flat = pts[:1]
        for i, (a, b) in enumerate(itertools.pairwise(pts)):
            if abs(b[1] - a[1]) <= _TALL * (abs(b[0] - a[0]) + width):
                flat.append(b)
                continue
            if len(flat) > 1:
                draw.line(flat, fill=fill, width=width, joint="curve")
            flat = [b]
            _add_column_runs(columns, a, b, r, (i > 0, i < len(pts) - 2))
        if len(flat) > 1:
            draw.line(flat, fill=fill, width=width, joint="curve")
    for column, runs in columns.items():
        runs.sort()
        first, last = runs[0]
        for top, bottom in runs[1:]:
            if top > last + 1:
                draw.rectangle((column, first, column, last), fill=fill)
                first, last = top, bottom
            else:
                last = max(last, bottom)
        draw.rectangle((column, first, column, last), fill=fill)


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


def _png_arrangement(
    boxes: Sequence[Box], arrows: Sequence[Arrow], title: str | None
) -> _Arrangement:
    """The graph laid out for the PNG: what the user wrote measured as the PNG writes it
    (escaped where its font lacks a character), so that a box is as wide as the text it
    holds; where nothing is escaped, the same as the SVG's."""
    try:
        import PIL  # noqa: F401  (its font is asked which characters it draws)
    except ImportError as err:
        raise ImportError(_PIL_MISSING) from err
    return _arrange(boxes, arrows, title, _pil_text)


def _render_png(arr: _Arrangement, scale: float) -> bytes:
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as err:
        raise ImportError(_PIL_MISSING) from err
    _check_scale(scale)
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
        ours: bool = False,
    ) -> None:
        font = _pil_font(max(1, round(size * k)))
        if max_w is not None:  # cut the text, then spell it: an escape is never cut in two
            s = _fit(s, max_w * k, lambda t: float(font.getlength(_pil_text(t, ours))))
        s = _pil_text(s, ours)
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

    def badge(
        s: str, fill: str, ink: str, x: float, y: float, w: float, ours: bool = False
    ) -> None:
        _rounded_rectangle(
            draw,
            [x * k, y * k, (x + w) * k, (y + _BADGE_H) * k],
            radius=_BADGE_H / 2 * k,
            fill=fill,
        )
        text(x + w / 2, y + 11.5, s, _BADGE_SIZE, ink, anchor="ms", max_w=w - 4, ours=ours)

    def rounded(
        x: float,
        y: float,
        w: float,
        h: float,
        r: float,
        fill: str | None,
        stroke: str,
        dashes: tuple[float, float] | None = None,
        width: float = 1.0,
    ) -> None:
        box = _frame(x * k, y * k, (x + w) * k - 1, (y + h) * k - 1)
        if dashes is not None:
            if fill is not None:
                _rounded_rectangle(draw, box, radius=r * k, fill=fill)
            on, off = dashes
            _dashed(draw, _rounded_outline(*box, r * k), on * k, off * k, stroke, px(width))
        else:
            _rounded_rectangle(draw, box, radius=r * k, fill=fill, outline=stroke, width=px(width))

    def arrowhead(at: Point, colour: str, half: float) -> None:
        x, y = at
        draw.polygon([P((x, y - half)), P((x + _ARROW_LEN, y)), P((x, y + half))], fill=colour)

    if arr.title:
        text(_MARGIN, _MARGIN + 14, arr.title, _TITLE_SIZE, _INK, bold=True)
    for c in arr.clusters:
        rounded(c.x, c.y, c.w, c.h, 12, _GROUP_FILL, _GROUP_STROKE)
        text(c.x + 12, c.y + 17, c.label, _GROUP_SIZE, _MUTED, bold=True, max_w=c.w - 24)

    # the arrows, plain ones first and those that crossed to or from a worker over them:
    # each kind's lines painted together, then their heads
    for crossed, colour, width, half in (
        (False, _EDGE, 1.25, 3.5),
        (True, _EDGE_CROSSED, 2.75, 5.0),
    ):
        lines, heads = [], []
        for r in arr.routes:
            if (r.arrow.crossed_bytes is not None) != crossed:
                continue
            pts: list[Point] = [r.start]
            here = r.start
            for c1, c2, q in r.segments:
                pts.extend(_bezier(here, c1, c2, q) if c1 != here else [q])
                here = q
            lines.append(_simplify([P(p) for p in pts]))
            heads.append(here)
        _draw_lines(draw, lines, px(width), colour)
        for at in heads:
            arrowhead(at, colour, half)
    for r in arr.routes:
        if r.label is not None and r.label_at is not None:
            w = _text_width(r.label, _BADGE_SIZE) + 2 * _BADGE_PAD
            x, y = r.label_at[0] - w / 2, r.label_at[1] - _BADGE_H / 2
            crossed = r.arrow.crossed_bytes is not None
            _rounded_rectangle(
                draw,
                [x * k, y * k, (x + w) * k, (y + _BADGE_H) * k],
                radius=_BADGE_H / 2 * k,
                fill=_BG,
                outline=_EDGE_CROSSED if crossed else _EDGE,
                width=px(1),
            )
            ink = _EDGE_CROSSED if crossed else _MUTED
            text(r.label_at[0], y + 11.5, r.label, _BADGE_SIZE, ink, crossed, "ms", ours=True)

    # the names fitted to their boxes by the font's own widths, whole names cut as the
    # layout cuts them (it sized the boxes from widths estimated a little wide), and kept
    # apart: two boxes never show the same
    name_font = _pil_font(max(1, round(_NAME_SIZE * k)))
    names = _fit_apart(
        [p.box.name for p in arr.boxes],
        [(p.w - 2 * _PAD_X) * k for p in arr.boxes],
        lambda t: float(name_font.getlength(_pil_text(t))),
        _pil_text,
    )
    for p, name in zip(arr.boxes, names, strict=True):
        b = p.box
        fill, stroke, dashes, name_ink, kind_ink = _box_colours(b)
        rounded(p.x, p.y, p.w, p.h, _RADIUS, fill, stroke, dashes)
        if "cached" in b.marks:
            rounded(p.x + 3, p.y + 3, p.w - 6, p.h - 6, _RADIUS - 3, None, _CACHED)
        if "frozen" in b.marks:
            draw.polygon([P(pt) for pt in _stripe_path(p.x, p.y, p.h)], fill=_FROZEN)
        content = p.w - 2 * _PAD_X
        text(p.x + _PAD_X, p.y + _NAME_BASE, name, _NAME_SIZE, name_ink, True)
        text(p.x + _PAD_X, p.y + _KIND_BASE, p.kind_label, _KIND_SIZE, kind_ink, max_w=content)
        for bd in p.badges:
            bf, bt = _badge_colours(bd.tone, b.outcome)
            badge(bd.text, bf, bt, bd.x, bd.y, bd.w, ours=bd.tone == "outcome")

    if arr.legend_top is not None:
        ly = arr.legend_top
        draw.line([P((_MARGIN, ly)), P((arr.width - _MARGIN, ly))], fill=_GROUP_STROKE, width=px(1))
        for item in arr.legend:
            base = item.y + 4
            if item.kind == "caption":
                text(item.x, base, item.text.upper(), _CAPTION_SIZE, "#94a3b8", True, ours=True)
                continue
            text_x = item.x + _LEGEND_SAMPLE_W + 6
            if item.kind == "mapped":
                badge(
                    "mapped", *_BADGE_STYLE["mapped"], item.x, item.y - _BADGE_H / 2, item.w, True
                )
                continue
            if item.kind == "at":
                bw = _text_width("@ w", _BADGE_SIZE) + 2 * _BADGE_PAD
                badge("@ w", *_BADGE_STYLE["at"], item.x, item.y - _BADGE_H / 2, bw, True)
                text_x = item.x + bw + 6
            elif item.kind == "crossed":
                end = (item.x + _LEGEND_SAMPLE_W - _ARROW_LEN, item.y)
                draw.line([P((item.x, item.y)), P(end)], fill=_EDGE_CROSSED, width=px(2.75))
                arrowhead(end, _EDGE_CROSSED, 5.0)
            else:
                sx, sy = item.x, item.y - _LEGEND_SAMPLE_H / 2
                sw, sh = _LEGEND_SAMPLE_W, _LEGEND_SAMPLE_H
                sfill, sstroke, sdash = _BG, _BORDER, None
                if item.outcome is not None:
                    sfill, sstroke, _, _ = _OUTCOME_STYLE[item.outcome]
                    sdash = _DASHES[item.outcome][0] if item.outcome in _DASHES else None
                rounded(sx, sy, sw, sh, 4, sfill, sstroke, sdash)
                if item.kind == "frozen":
                    _rounded_rectangle(
                        draw,
                        _frame(sx * k, sy * k, (sx + 4) * k, (sy + sh) * k - 1),
                        radius=2 * k,
                        fill=_FROZEN,
                        corners=(True, False, False, True),
                    )
                elif item.kind == "cached":
                    rounded(sx + 3, sy + 3, sw - 6, sh - 6, 2, None, _CACHED)
            text(text_x, base, item.text, _LEGEND_SIZE, "#334155", ours=True)

    if ss != 1:
        img = img.resize(final, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    # a large image (drawn as is) is mostly white: the fastest zlib level packs it about as
    # well, in two thirds of the time
    img.save(buf, format="PNG", compress_level=3 if ss != 1 else 1)
    return buf.getvalue()
