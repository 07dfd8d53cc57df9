"""How big a box is: its name and kind fitted to its width, its badges wrapped in rows.

A box shows its name, its kind and a row or more of badges (what happened to it in a
run, its frozen state, its cached salt, mapped, the worker it is placed on). Sizes come
from the text widths estimated in ``style``, not from a font, so a box measures the same
with or without Pillow. Every box is measured once, before it is placed: the widths
decide how wide each column is, the heights how the rows stack, and the badge offsets
are kept so that placing a box only has to add its corner. Names are fitted all
together, so that no two boxes show the same one.

What a user wrote (a name, a kind, a badge's state, salt or worker) is measured as the
renderer writes it, ``spelled``: as it is for the SVG; for the PNG escaped where its font
lacks a character (``\\u6570`` for 数, six times as wide), so that a box of the PNG holds
what it writes, and the two renderers agree wherever nothing is escaped. The figure's
own words are measured as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import Box
from .style import (
    _BADGE_GAP,
    _BADGE_H,
    _BADGE_PAD,
    _BADGE_SIZE,
    _BADGES_TOP,
    _BOX_MAX_W,
    _BOX_MIN_H,
    _BOX_MIN_W,
    _BOX_PAD_BOTTOM,
    _CONTENT_MAX_W,
    _KIND_SIZE,
    _NAME_SIZE,
    _OUTCOME_WORDS,
    _PAD_X,
    _fit,
    _fit_apart,
    _human_time,
    _salt_shown,
    _text_width,
)


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
        text = _OUTCOME_WORDS.get(box.outcome, box.outcome)
        if box.outcome == "ran" and box.took_us is not None:
            text = f"ran {_human_time(box.took_us)}"
        out.append((text, "outcome"))
    state = None if box.state is None else _fit(box.state, 12, len, middle=False)
    salt = None if box.salt is None else _fit(_salt_shown(box.salt), 16, len, middle=False)
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


def _as_written(text: str) -> str:
    """``text`` as the SVG shows it: as it is, but for a tab or a line break, shown as a
    space, and any other character XML 1.0 cannot hold (a control character, a lone
    surrogate, U+FFFE, U+FFFF), written as U+FFFD."""
    if text.isprintable():
        return text
    return "".join(ch if _xml_holds(ch) else " " if ch in "\t\n" else "\ufffd" for ch in text)


def _xml_holds(ch: str) -> bool:
    """Whether XML 1.0 holds ``ch`` as it is, the tab and the line break aside."""
    code = ord(ch)
    return not (code < 32 or 0xD800 <= code <= 0xDFFF or code in (0xFFFE, 0xFFFF))


def _name_labels(boxes: Sequence[Box], spelled: Callable[[str], str] = _as_written) -> list[str]:
    """The name each box shows, fitted to the widest box as ``spelled`` writes it: a long
    name is cut in the middle, and two names that would then read the same are cut to show
    where they differ."""
    return _fit_apart(
        [b.name for b in boxes],
        [_CONTENT_MAX_W] * len(boxes),
        lambda s: _text_width(spelled(s), _NAME_SIZE, True),
        spelled,
    )


def _measure(box: Box, label: str, spelled: Callable[[str], str] = _as_written) -> _Measured:
    """A box's size and the place of its badges, ``label`` being the name it shows and
    ``spelled`` how what the user wrote is written."""

    def kind_w(s: str) -> float:
        return _text_width(spelled(s), _KIND_SIZE)

    kind_label = _fit(box.kind, _CONTENT_MAX_W, kind_w, False)
    need = max(_text_width(spelled(label), _NAME_SIZE, True), kind_w(kind_label))
    badges: list[tuple[str, str, float, float, float]] = []
    row, dx = 0, 0.0
    for text, tone in _badge_texts(box):
        ours = tone == "outcome"  # an outcome and its time: the figure's own words

        def badge_w(s: str, ours: bool = ours) -> float:
            return _text_width(s if ours else spelled(s), _BADGE_SIZE)

        text = _fit(text, _CONTENT_MAX_W - 2 * _BADGE_PAD, badge_w)
        w = badge_w(text) + 2 * _BADGE_PAD
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
