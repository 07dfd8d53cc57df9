"""Draw a pipeline graph as SVG or PNG, with no system binary.

A graph is described neutrally: one :class:`Box` per node and one :class:`Arrow` per
edge. :class:`Figure` lays them out left to right in layers (Sugiyama style) and draws
them as hand-written SVG, or as PNG through Pillow when it is installed::

    fig = Figure([Box("sms", "Parquet"), Box("clean", "Clean")], [Arrow("sms", "clean")])
    fig.save("graph.svg")

In Jupyter a figure shows itself as SVG (``_repr_mimebundle_``). Only the standard
library is imported here; Pillow is imported when a PNG is asked for, and only then.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Container, Sequence
from pathlib import Path

from ._arrangement import _Arrangement
from .layout import _arrange as _arrange
from .layout import layout
from .model import MARKS, OUTCOMES, Arrow, Box
from .png import _check_scale, _png_arrangement, _render_png
from .svg import _render_svg

__all__ = ["MARKS", "OUTCOMES", "Arrow", "Box", "Figure", "layout"]


def _description(boxes: tuple[Box, ...], arrows: tuple[Arrow, ...], title: str | None) -> str:
    """What a figure's ids are taken from: the repr of its boxes, arrows and title, with an
    arrow read once written without ``reads=1``, so that a plain figure's ids stay put."""
    said = [repr(a).removesuffix(", reads=1)") + ")" if a.reads == 1 else repr(a) for a in arrows]
    listed = "(" + ", ".join(said) + ("," if len(said) == 1 else "") + ")"
    return f"({boxes!r}, {listed}, {title!r})"


class Figure:
    """A drawing of a pipeline graph: boxes for nodes, arrows for the values between them.

    The layout is computed once, when the figure is made (and the PNG's, which measures
    names as it escapes them, on the first ``png()``); a cycle, a repeated box name,
    an arrow to an unknown box, an unknown mark, an unknown outcome or a count of reads
    below one raise ``ValueError``.
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
        for a in self.arrows:
            if isinstance(a.reads, bool) or not isinstance(a.reads, int) or a.reads < 1:
                raise ValueError(
                    f"arrow {a.source!r} -> {a.target!r} has reads={a.reads!r}; "
                    "it is how many times the target reads the source, a whole number >= 1"
                )
        self._arrangement = _arrange(self.boxes, self.arrows, title)
        self._png_arrangement: _Arrangement | None = None  # laid out on the first png()
        digest = hashlib.sha1(_description(self.boxes, self.arrows, title).encode("utf-8"))
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
        """The drawing as PNG bytes, ``scale`` pixels per CSS pixel; needs Pillow.

        ``scale`` is a number from 0.05 to 10: another number is a
        ``ValueError``, anything else a ``TypeError``.
        """
        _check_scale(scale)
        if self._png_arrangement is None:
            self._png_arrangement = _png_arrangement(self.boxes, self.arrows, self.title)
        return _render_png(self._png_arrangement, float(scale))

    def _repr_mimebundle_(
        self, include: Container[str] | None = None, exclude: Container[str] | None = None
    ) -> dict[str, str]:
        """What a notebook shows: the SVG, with a line of text for a plain console.

        IPython draws every format an object offers each time it is shown, so a figure
        offers one: the PNG, slow on a large graph, is drawn only when asked (``png()``).
        """
        bundle: dict[str, str] = {}
        for mime, draw in (("image/svg+xml", self.svg), ("text/plain", self.__repr__)):
            if (include is None or mime in include) and (exclude is None or mime not in exclude):
                bundle[mime] = draw()
        return bundle

    def _repr_svg_(self) -> str:
        return self.svg()

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
