"""The SVG renderer: an arrangement written out as a standalone SVG document, by hand.

SVG is text, so it needs no library: every element is formatted here, with text escaped
for XML and coordinates written compactly. Arrow-head marker ids carry a per-figure prefix
so that several figures can share one HTML page (a notebook) without clashing.
"""

from __future__ import annotations

from ._arrangement import _Arrangement, _Route
from .model import Box
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
    _FONT,
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
    _OUTCOME_WORDS,
    _PAD_X,
    _RADIUS,
    _TITLE_SIZE,
    _badge_colours,
    _box_colours,
    _human_time,
    _salt_shown,
    _stripe_path,
    _text_width,
)


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
        lines.append(f"salt: {_salt_shown(box.salt)}")
    if box.worker is not None:
        lines.append(f"worker: {box.worker}")
    if box.outcome is not None:
        took = "" if box.took_us is None else f" in {_human_time(box.took_us)}"
        lines.append(f"outcome: {_OUTCOME_WORDS.get(box.outcome, box.outcome)}{took}")
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
        if outcome in _DASHES:
            on, off = _DASHES[outcome][1]
            dash = f' stroke-dasharray="{_num(on)} {_num(off)}"'
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
        f'role="img" aria-label="{_xml(arr.title or "pipeline graph")}" '
        # text as written: a run of spaces, or one at a name's end, is no other name's
        'xml:space="preserve" style="white-space:pre">'
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
            crossed = r.arrow.crossed_bytes is not None
            what, ink, weight = ("bytes", _EDGE_CROSSED, 600) if crossed else ("reads", _MUTED, 500)
            out.append(
                f'<g class="{what}"><rect x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" '
                f'height="{_num(_BADGE_H)}" rx="{_num(_BADGE_H / 2)}" fill="{_BG}" '
                f'stroke="{_EDGE_CROSSED if crossed else _EDGE}" stroke-width="1"/>'
                f'<text x="{_num(r.label_at[0])}" y="{_num(y + 11.5)}" text-anchor="middle" '
                f'font-size="{_num(_BADGE_SIZE)}" font-weight="{weight}" fill="{ink}">'
                f"{_xml(r.label)}</text></g>"
            )

    for p in arr.boxes:
        b = p.box
        fill, stroke, dashes, name_ink, kind_ink = _box_colours(b)
        dash = "" if dashes is None else f' stroke-dasharray="{_num(dashes[0])} {_num(dashes[1])}"'
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
