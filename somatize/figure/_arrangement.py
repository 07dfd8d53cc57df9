"""What the layout hands the renderers: everything that is drawn, at absolute coordinates.

An arrangement is computed once per figure and holds every measure either renderer
needs (box frames and their fitted text, badge spots, edge curves, group frames, legend
items), so the SVG and the PNG draw the same picture and neither measures text again.
Its parts are frozen: both renderers read one arrangement, and a figure keeps it for
as long as it lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Arrow, Box, Point


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
