"""Drawing pipeline graphs: layout, SVG, PNG and saving (somatize.figure)."""

from __future__ import annotations

import importlib.util
import io
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from somatize.figure import Arrow, Box, Figure, _arrange, layout
from somatize.figure.style import _BADGE_H, _BADGE_PAD, _BADGE_SIZE, _text_width

SVG = "{http://www.w3.org/2000/svg}"


def sms_boxes(after_run: bool = False) -> list[Box]:
    """The four-node example graph, before or after a run."""
    return [
        Box(
            "sms",
            "Parquet",
            marks=("frozen",),
            state="5f7ac205",
            outcome="recalled" if after_run else None,
        ),
        Box(
            "clean",
            "Clean",
            marks=("frozen",),
            outcome="ran" if after_run else None,
            took_us=1234 if after_run else None,
        ),
        Box(
            "widest",
            "Widest",
            marks=("frozen", "cached"),
            salt="v2",
            outcome="spared" if after_run else None,
        ),
        Box(
            "embed",
            "Embed",
            marks=("mapped", "at"),
            worker="w1",
            outcome="failed" if after_run else None,
        ),
    ]


def sms_arrows(crossed: int | None = None) -> list[Arrow]:
    """The edges of the four-node example: a chain with a fan-out at ``clean``."""
    return [
        Arrow("sms", "clean"),
        Arrow("clean", "widest"),
        Arrow("clean", "embed", crossed_bytes=crossed),
    ]


def random_dag(n: int, seed: int) -> tuple[list[Box], list[Arrow]]:
    """A random DAG of ``n`` nodes with one or two inputs per node and some repeated kinds."""
    rng = random.Random(seed)
    boxes = [
        Box(
            f"node_{i}",
            rng.choice(["Clean", "Parquet", "Join", "Model"]),
            marks=tuple(rng.sample(["frozen", "cached", "mapped", "at"], rng.randint(0, 2))),
            worker=rng.choice([None, "w1"]),
            group=rng.choice([None, None, None, "model"]),
        )
        for i in range(n)
    ]
    arrows = [
        Arrow(f"node_{i}", f"node_{j}")
        for j in range(1, n)
        for i in rng.sample(range(j), min(j, rng.randint(1, 2)))
    ]
    rng.shuffle(arrows)
    return boxes, arrows


def parse(svg: str) -> ET.Element:
    """Parse an SVG document, failing the test if it is not well-formed XML."""
    return ET.fromstring(svg)


def all_text(root: ET.Element) -> str:
    """Every piece of text in an SVG tree, joined by newlines."""
    return "\n".join(t for t in root.itertext())


def legend_text(root: ET.Element) -> str:
    """The text of the legend group of an SVG tree."""
    legend = [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend"]
    assert len(legend) == 1
    return all_text(legend[0])


def assert_no_overlap(boxes: list[Box], arrows: list[Arrow]) -> None:
    """Check that no two drawn boxes share any area."""
    placed = _arrange(boxes, arrows, None).boxes
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
            assert apart, f"{a.box.name} overlaps {b.box.name}"


def test_svg_is_xml_with_names_marks_and_worker() -> None:
    """The SVG parses as XML and shows every name, kind, mark word and the worker."""
    svg = Figure(sms_boxes(), sms_arrows(), title="sms").svg()
    root = parse(svg)
    assert root.tag == f"{SVG}svg"
    text = all_text(root)
    for name in ("sms", "clean", "widest", "embed", "Parquet", "Clean", "Widest", "Embed"):
        assert name in text
    for word in ("frozen", "cached", "mapped", "w1"):
        assert word in text
    assert "@ w1" in text


def test_state_digest_and_salt_are_shown() -> None:
    """A frozen box shows its state digest and a cached box its salt, next to the mark."""
    text = all_text(parse(Figure(sms_boxes(), sms_arrows()).svg()))
    assert "frozen · 5f7ac205" in text
    assert "cached · v2" in text


def test_svg_is_sized_to_its_content() -> None:
    """The SVG carries width, height and a matching viewBox that hold every box."""
    fig = Figure(sms_boxes(), sms_arrows())
    root = parse(fig.svg())
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    assert (width, height) == fig.size
    for box in _arrange(sms_boxes(), sms_arrows(), None).boxes:
        assert box.x >= 0 and box.x + box.w <= width
        assert box.y >= 0 and box.y + box.h <= height


def test_xml_special_characters_are_escaped() -> None:
    """Names, kinds, groups and titles holding < & > " ' come through escaped and intact."""
    name = "a<b & \"c\">'d'"
    boxes = [Box(name, "K<&>", group="g&<"), Box("plain", "Plain", worker="w<1>")]
    fig = Figure(boxes, [Arrow(name, "plain")], title='t<&>"')
    svg = fig.svg()
    root = parse(svg)
    text = all_text(root)
    assert name in text
    assert "K<&>" in text
    assert "g&<" in text
    assert "@ w<1>" in text
    assert "a<b" not in svg and "&lt;" in svg and "&amp;" in svg
    names = {g.get("data-name") for g in root.iter(f"{SVG}g") if g.get("class") == "box"}
    assert names == {name, "plain"}


def test_control_characters_do_not_break_the_xml() -> None:
    """Characters XML cannot carry are replaced rather than emitted."""
    parse(Figure([Box("bell\x07", "Ctl\x00")], []).svg())


def test_names_differing_in_spaces_or_unwritable_characters_read_apart() -> None:
    """Two boxes never read the same in the SVG: its text keeps runs of spaces and spaces
    at a name's ends (`xml:space="preserve"`, `white-space:pre`), and names that differ
    only in characters XML cannot hold (lone surrogates, written U+FFFD) or in a tab and a
    space (shown alike) are numbered apart."""
    names = ["load data", "load  data", " x", "x", "\ud800y", "\udc00y", "a\tb", "a b"]
    fig = Figure([Box(n, "K") for n in names], [])
    svg = fig.svg()
    root = ET.fromstring(svg)
    assert root.get("{http://www.w3.org/XML/1998/namespace}space") == "preserve"
    assert "white-space:pre" in (root.get("style") or "")
    shown = [p.label for p in fig._arrangement.boxes]
    written = [label.replace("\t", " ") for label in shown]
    written = ["".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in w) for w in written]
    assert len(set(written)) == len(names), shown
    assert shown[:4] == names[:4]


def test_long_names_are_truncated_with_the_full_name_in_a_tooltip() -> None:
    """A very long name is drawn shortened with an ellipsis and kept whole in <title>."""
    long = "encoder.layers.11.attention.output.dense." + "x" * 80
    root = parse(Figure([Box(long, "Linear")], []).svg())
    (box,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "box"]
    title = box.find(f"{SVG}title")
    assert title is not None and title.text is not None and long in title.text
    drawn = [t.text or "" for t in box.iter(f"{SVG}text")]
    assert long not in drawn
    assert any("…" in t and t.startswith("encoder") for t in drawn)


def test_outcomes_colour_boxes_and_fill_the_legend() -> None:
    """After a run each outcome has its label and colour, and the legend lists all of them."""
    svg = Figure(sms_boxes(after_run=True), sms_arrows()).svg()
    root = parse(svg)
    text = all_text(root)
    assert "ran 1.2 ms" in text
    for word in ("recalled", "spared", "failed"):
        assert word in text
    for colour in ("#fef3c7", "#dcfce7", "#fee2e2"):  # ran, recalled, failed fills
        assert colour in svg
    assert 'stroke-dasharray="4 3"' in svg  # the spared box
    legend = legend_text(root)
    for outcome in ("ran", "recalled", "spared", "drifted", "failed"):
        assert outcome in legend
    for mark in ("frozen", "cached", "mapped"):
        assert mark in legend


def test_legend_leaves_out_outcomes_before_a_run() -> None:
    """Before a run the legend explains the marks only."""
    legend = legend_text(parse(Figure(sms_boxes(), sms_arrows()).svg()))
    assert "frozen" in legend and "cached" in legend
    assert "recalled" not in legend and "drifted" not in legend


def test_plain_graph_has_no_legend() -> None:
    """A graph without marks or outcomes draws no legend at all."""
    root = parse(Figure([Box("a", "A"), Box("b", "B")], [Arrow("a", "b")]).svg())
    assert not [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend"]


@pytest.mark.parametrize(
    ("took_us", "shown"),
    [
        (850, "ran 850 µs"),
        (1234, "ran 1.2 ms"),
        (2_400_000, "ran 2.40 s"),
        (125_000_000, "2 min 5 s"),
    ],
)
def test_run_time_is_human(took_us: int, shown: str) -> None:
    """The time of a box that ran reads in µs, ms, s or minutes as fits."""
    box = Box("x", "X", outcome="ran", took_us=took_us)
    assert shown in all_text(parse(Figure([box], []).svg()))


def test_crossed_bytes_thicken_the_edge_and_are_labelled() -> None:
    """An edge whose value crossed to or from a worker is drawn thicker with a human byte
    count."""
    root = parse(Figure(sms_boxes(after_run=True), sms_arrows(crossed=19_300_000)).svg())
    assert "19.3 MB" in all_text(root)
    widths = sorted(
        float(p.get("stroke-width", "0"))
        for p in root.iter(f"{SVG}path")
        if p.get("class") == "edge"
    )
    assert len(widths) == 3 and widths[-1] > widths[0]
    assert "bytes to or from a worker" in legend_text(root)


def test_edges_have_arrowheads() -> None:
    """Every edge ends in an arrowhead marker defined in the document."""
    root = parse(Figure(sms_boxes(), sms_arrows(crossed=10)).svg())
    markers = {m.get("id") for m in root.iter(f"{SVG}marker")}
    edges = [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    assert len(edges) == 3
    for edge in edges:
        ref = edge.get("marker-end", "")
        assert ref.startswith("url(#") and ref[5:-1] in markers


def test_groups_are_drawn_as_labelled_clusters() -> None:
    """Boxes sharing a group sit inside one labelled rectangle that holds them all."""
    boxes = [
        Box("in", "Source"),
        Box("embed", "Embedding", group="bert"),
        Box("attend", "Attention", group="bert"),
        Box("out", "Head"),
    ]
    arrows = [Arrow("in", "embed"), Arrow("embed", "attend"), Arrow("attend", "out")]
    root = parse(Figure(boxes, arrows).svg())
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "group"]
    assert len(groups) == 1 and "bert" in all_text(groups[0])
    arrangement = _arrange(boxes, arrows, None)
    (cluster,) = arrangement.clusters
    for placed in arrangement.boxes:
        inside = (
            cluster.x <= placed.x
            and placed.x + placed.w <= cluster.x + cluster.w
            and cluster.y <= placed.y
            and placed.y + placed.h <= cluster.y + cluster.h
        )
        assert inside == (placed.box.group == "bert")


def test_layout_runs_left_to_right_without_overlaps() -> None:
    """In the example every edge points right and no two boxes overlap."""
    pos = layout(sms_boxes(), sms_arrows())
    assert set(pos) == {"sms", "clean", "widest", "embed"}
    for a in sms_arrows():
        assert pos[a.source][0] < pos[a.target][0]
    assert pos["widest"][0] == pos["embed"][0]
    assert_no_overlap(sms_boxes(), sms_arrows())


def test_layout_handles_single_node_components_fans_and_repeated_kinds() -> None:
    """A lone node, separate components, fan-in, fan-out and repeated kinds all lay out."""
    assert set(layout([Box("only", "Only")], [])) == {"only"}
    boxes = [Box(n, "Same") for n in ("a", "b", "c", "d", "e", "x", "y", "lone")]
    arrows = [
        Arrow("a", "c"),
        Arrow("b", "c"),  # fan-in
        Arrow("c", "d"),
        Arrow("c", "e"),  # fan-out
        Arrow("a", "e"),  # a long edge
        Arrow("x", "y"),  # a second component
    ]
    pos = layout(boxes, arrows)
    for a in arrows:
        assert pos[a.source][0] < pos[a.target][0]
    assert_no_overlap(boxes, arrows)
    parse(Figure(boxes, arrows).svg())


def test_lone_boxes_are_packed_in_a_grid() -> None:
    """Boxes with no edges are packed in rows, not stacked in one tall column."""
    boxes = [Box(f"lone_{i}", "Lone") for i in range(20)]
    fig = Figure(boxes, [])
    width, height = fig.size
    assert width > height
    assert_no_overlap(boxes, [])


def test_long_edges_do_not_cross_boxes() -> None:
    """An edge skipping columns is routed beside, never through, the boxes between."""
    boxes = [Box(n, "K") for n in ("a", "b", "c", "d")]
    arrows = [Arrow("a", "b"), Arrow("b", "c"), Arrow("c", "d"), Arrow("a", "d")]
    arrangement = _arrange(boxes, arrows, None)
    route = next(r for r in arrangement.routes if r.arrow == Arrow("a", "d"))
    inner = [p for p in arrangement.boxes if p.box.name in ("b", "c")]
    for _, _, end in route.segments[:-1]:
        for box in inner:
            assert not (box.x <= end[0] <= box.x + box.w and box.y <= end[1] <= box.y + box.h)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_dag_of_fifty_nodes_lays_out_cleanly(seed: int) -> None:
    """A 50-node random DAG renders to SVG pointing right, no overlaps."""
    boxes, arrows = random_dag(50, seed)
    svg = Figure(boxes, arrows).svg()
    parse(svg)
    pos = layout(boxes, arrows)
    for a in arrows:
        assert pos[a.source][0] < pos[a.target][0]
    assert_no_overlap(boxes, arrows)


def test_cycle_raises_value_error() -> None:
    """A cycle, including a node feeding itself, is refused rather than looped on."""
    boxes = [Box("a", "A"), Box("b", "B"), Box("c", "C")]
    with pytest.raises(ValueError, match="cycle"):
        Figure(boxes, [Arrow("a", "b"), Arrow("b", "c"), Arrow("c", "a")])
    with pytest.raises(ValueError, match="cycle"):
        layout(boxes, [Arrow("b", "b")])


def test_bad_descriptions_raise_value_error() -> None:
    """Unknown boxes, repeated names, unknown marks and unknown outcomes are refused clearly."""
    with pytest.raises(ValueError, match="no box is named 'z'"):
        Figure([Box("a", "A")], [Arrow("a", "z")])
    with pytest.raises(ValueError, match="unique"):
        Figure([Box("a", "A"), Box("a", "B")], [])
    with pytest.raises(ValueError, match="frozen"):
        Figure([Box("a", "A", marks=("melted",))], [])
    with pytest.raises(ValueError, match="recalled"):
        Figure([Box("a", "A", outcome="exploded")], [])


def test_empty_graph_still_draws() -> None:
    """A graph with no boxes gives a small valid SVG."""
    root = parse(Figure([], []).svg())
    assert float(root.get("width", "0")) > 0


def test_png_export() -> None:
    """With Pillow the PNG is a real image at ``scale`` times the SVG's size."""
    pil_image = pytest.importorskip("PIL.Image")
    fig = Figure(sms_boxes(after_run=True), sms_arrows(crossed=19_300_000), title="sms")
    data = fig.png(scale=2.0)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = fig.size
    with pil_image.open(io.BytesIO(data)) as image:
        image.load()
        assert image.size == (round(width * 2), round(height * 2))
        assert abs(image.size[0] / image.size[1] - width / height) < 0.01
        colours = image.convert("RGB").getcolors(1 << 24)
        assert colours is not None and len(colours) > 10  # not a blank canvas


def test_png_of_a_random_dag() -> None:
    """A 50-node graph with every outcome and crossing renders to PNG as well."""
    pytest.importorskip("PIL")
    boxes, arrows = random_dag(50, 3)
    outcomes = [None, "ran", "recalled", "spared", "drifted", "failed"]
    boxes = [
        Box(b.name, b.kind, b.marks, outcome=outcomes[i % 6], took_us=i * 997)
        for i, b in enumerate(boxes)
    ]
    arrows = [
        Arrow(a.source, a.target, 7**i % 10**9 if i % 4 == 0 else None)
        for i, a in enumerate(arrows)
    ]
    assert Figure(boxes, arrows).png(scale=1.0)[:4] == b"\x89PNG"


def spanned_in(colour: str, fig: Figure, scale: float, monkeypatch: pytest.MonkeyPatch) -> float:
    """The pixels the PNG renderer's lines, rectangles and polygons in ``colour`` span when it
    draws ``fig`` at ``scale``: their bounding boxes (a line's widened by its width) added
    up, at the size the picture is drawn before it is shrunk."""
    from PIL import ImageDraw

    spanned = 0.0

    def spying(name: str, widened: bool) -> Any:
        real = getattr(ImageDraw.ImageDraw, name)

        def call(self: Any, xy: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal spanned
            if kwargs.get("fill") == colour:
                flat = [float(v) for point in xy for v in point] if isinstance(xy[0], tuple) else xy
                xs, ys = flat[0::2], flat[1::2]
                extra = kwargs.get("width", 1) if widened else 1
                spanned += (max(xs) - min(xs) + extra) * (max(ys) - min(ys) + extra)
            return real(self, xy, *args, **kwargs)

        return call

    with monkeypatch.context() as patched:
        for name, widened in (("line", True), ("rectangle", False), ("polygon", False)):
            patched.setattr(ImageDraw.ImageDraw, name, spying(name, widened))
        fig.png(scale)
    return spanned


def test_a_wide_fan_out_is_drawn_in_proportion_to_its_picture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The arrows of a wide fan-out run the height of the picture and lie on one another for
    most of it: the PNG renderer's drawing of them spans fewer pixels than the picture has,
    not a multiple of them growing with the fan-out's width (as drawing each arrow would)."""
    pytest.importorskip("PIL")
    from somatize.figure.style import _EDGE

    for n in (100, 200):
        fig = Figure([Box("rows", "Rows")] + [Box(f"scale {i}", "Scale") for i in range(n)],
                     [Arrow("rows", f"scale {i}") for i in range(n)])  # fmt: skip
        width, height = fig.size
        assert width * height / 4 <= 6_000_000  # drawn at twice the size, one pixel per CSS pixel
        assert spanned_in(_EDGE, fig, 0.5, monkeypatch) < width * height, n


def test_steep_lines_painted_by_columns_cover_what_pillow_would() -> None:
    """A steep line, painted a pixel column at a time, covers the pixels Pillow's own thick
    line with curved joints covers, but for a few at its edges."""
    pytest.importorskip("PIL")
    from PIL import Image, ImageChops, ImageDraw

    from somatize.figure.png import _draw_lines

    rng = random.Random(7)
    for width in (1, 2, 3, 5, 6, 11):
        points = [(rng.uniform(20, 30), 10.0)]
        for _ in range(5):
            x, y = points[-1]
            points.append((x + rng.uniform(0.5, 8), y + rng.uniform(300, 800)))
        pillows, ours = Image.new("L", (80, 4200)), Image.new("L", (80, 4200))
        ImageDraw.Draw(pillows).line(points, fill=255, width=width, joint="curve")
        _draw_lines(ImageDraw.Draw(ours), [points], width, 255)
        inked = pillows.histogram()[255]
        assert abs(ours.histogram()[255] - inked) < inked / 200, width
        assert ImageChops.difference(pillows, ours).histogram()[255] < inked / 100, width


def test_png_without_pillow_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Pillow, png() names the install command and a notebook still shows the SVG."""
    import builtins

    real_import = builtins.__import__

    def no_pil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    fig = Figure(sms_boxes(), sms_arrows())
    with pytest.raises(ImportError, match=r"pip install pillow.*somatize\[figure\]"):
        fig.png()
    assert fig._repr_mimebundle_()["image/svg+xml"].startswith("<svg")


def test_module_imports_only_the_standard_library() -> None:
    """Loading the figure module pulls in neither Pillow nor torch nor the rest of somatize."""
    package = Path(__file__).resolve().parent.parent / "somatize" / "figure"
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location(\n"
        f"    'figure_alone', {str(package / '__init__.py')!r},\n"
        f"    submodule_search_locations=[{str(package)!r}],\n"
        ")\n"
        "module = sys.modules['figure_alone'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "assert module.Figure([module.Box('a', 'A')], []).svg().startswith('<svg')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PIL', 'torch', 'somatize'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_save_by_suffix(tmp_path: Path) -> None:
    """save() writes SVG or PNG by the path's suffix."""
    fig = Figure(sms_boxes(), sms_arrows())
    fig.save(tmp_path / "graph.svg")
    parse((tmp_path / "graph.svg").read_text(encoding="utf-8"))
    fig.save(str(tmp_path / "graph.SVG"))
    assert (tmp_path / "graph.SVG").read_text(encoding="utf-8") == fig.svg()
    if importlib.util.find_spec("PIL") is not None:
        fig.save(tmp_path / "graph.png")
        assert (tmp_path / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_refuses_other_suffixes(tmp_path: Path) -> None:
    """save() with another suffix raises ValueError naming the valid ones, writing nothing."""
    fig = Figure(sms_boxes(), sms_arrows())
    with pytest.raises(ValueError, match=r"\.svg.*\.png"):
        fig.save(tmp_path / "graph.pdf")
    with pytest.raises(ValueError, match=r"\.svg.*\.png"):
        fig.save(tmp_path / "graph")
    assert list(tmp_path.iterdir()) == []


def test_svg_is_deterministic_and_ids_are_per_figure() -> None:
    """The same figure draws the same SVG; different figures use different marker ids."""
    one = Figure(sms_boxes(), sms_arrows()).svg()
    assert one == Figure(sms_boxes(), sms_arrows()).svg()
    other = Figure([Box("z", "Z")], []).svg()
    ids = {m.get("id") for m in parse(one).iter(f"{SVG}marker")}
    assert ids.isdisjoint({m.get("id") for m in parse(other).iter(f"{SVG}marker")})


def test_png_scale_is_checked_and_every_accepted_scale_draws() -> None:
    """png(scale) takes a number from 0.05 to 10 and draws at each, the smallest included;
    another number is a ValueError and anything else a TypeError, each naming the range."""
    pytest.importorskip("PIL")
    fig = Figure(sms_boxes(after_run=True), sms_arrows(crossed=19_300_000), title="sms")
    for scale in (0.05, 0.07, 0.1, 0.12, 0.15, 0.2, 0.33, 1, 4):
        assert fig.png(scale)[:4] == b"\x89PNG"
    assert Figure([Box("a", "A")], []).png(10)[:4] == b"\x89PNG"
    for bad in (0, -1, 0.01, 10.5, float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError, match=r"from 0\.05 to 10\.0"):
            fig.png(bad)
    for wrong in ("2", True, None, [2]):
        with pytest.raises(TypeError, match=r"number from 0\.05 to 10\.0"):
            fig.png(wrong)  # type: ignore[arg-type]


def test_a_notebook_draws_the_svg_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shown in a notebook, which asks for every _repr_*_ a figure has, a figure draws its
    SVG (with a line of text) and never its PNG, which stays one png() away."""

    def no_png(self: Figure, scale: float = 2.0) -> bytes:
        raise AssertionError("the PNG was drawn")

    fig = Figure(sms_boxes(after_run=True), sms_arrows(crossed=10))
    with monkeypatch.context() as patched:
        patched.setattr(Figure, "png", no_png)
        shown = {name: getattr(fig, name)() for name in dir(fig) if name.startswith("_repr_")}
    bundle = shown["_repr_mimebundle_"]
    assert set(bundle) == {"image/svg+xml", "text/plain"}
    assert bundle["image/svg+xml"] == fig.svg() and bundle["text/plain"] == repr(fig)
    assert fig._repr_mimebundle_(include={"text/plain"}) == {"text/plain": repr(fig)}
    assert fig._repr_mimebundle_(exclude={"image/svg+xml"}) == {"text/plain": repr(fig)}
    if importlib.util.find_spec("PIL") is not None:
        assert fig.png()[:4] == b"\x89PNG"


def test_arrows_with_the_same_ends_are_drawn_once() -> None:
    """Arrows with the same ends are one edge: one route, their reads and bytes added up,
    its label on the edge and above the legend however many arrows were given."""
    boxes = [Box("rows", "Rows"), Box("pair", "Pair", worker="w1")]
    arrangement = _arrange(boxes, [Arrow("rows", "pair", 909)] * 6, None)
    (route,) = arrangement.routes
    assert route.arrow == Arrow("rows", "pair", 6 * 909, reads=6)
    assert route.label == "×6 · 5.5 kB"
    assert route.label_at is not None and arrangement.legend_top is not None
    assert route.label_at[1] + _BADGE_H / 2 < arrangement.legend_top
    once = _arrange(boxes, [Arrow("rows", "pair", 909, reads=2), Arrow("rows", "pair")], None)
    assert [r.label for r in once.routes] == ["×3 · 909 B"]
    plain = _arrange(boxes, [Arrow("rows", "pair", reads=2)], None)
    assert [r.label for r in plain.routes] == ["×2"]
    svg = Figure(boxes, [Arrow("rows", "pair", reads=2)]).svg()
    assert [g.get("class") for g in parse(svg).iter(f"{SVG}g") if g.get("class") == "reads"]
    with pytest.raises(ValueError, match="reads=0"):
        Figure(boxes, [Arrow("rows", "pair", reads=0)])


def test_crowded_labels_stay_off_boxes_and_above_the_legend() -> None:
    """However crowded, an edge label is drawn over no box, over no other label, and above
    the legend."""
    for seed in (33, 41):
        boxes, arrows = random_dag(20 + seed, seed)
        arrows = [Arrow(a.source, a.target, 10**6 * (i + 1)) for i, a in enumerate(arrows)]
        arrangement = _arrange(boxes, arrows, None)
        assert arrangement.legend_top is not None
        labels = []
        for r in arrangement.routes:
            assert r.label is not None and r.label_at is not None
            w = _text_width(r.label, _BADGE_SIZE) + 2 * _BADGE_PAD
            x, y = r.label_at
            labels.append((x - w / 2, y - _BADGE_H / 2, x + w / 2, y + _BADGE_H / 2))
        boxed = [(p.x, p.y, p.x + p.w, p.y + p.h) for p in arrangement.boxes]
        for i, one in enumerate(labels):
            assert one[3] < arrangement.legend_top
            for other in boxed + labels[i + 1 :]:
                apart = one[2] <= other[0] or other[2] <= one[0]
                assert apart or one[3] <= other[1] or other[3] <= one[1]


def drawn_png_texts(fig: Figure, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every piece of text the PNG renderer writes on the picture, in order."""
    from PIL import ImageDraw

    written: list[str] = []
    real = ImageDraw.ImageDraw.text

    def text(self: Any, xy: Any, text: Any, *args: Any, **kwargs: Any) -> None:
        if self.mode == "RGB":  # not the font's glyphs, tried on a grey scratch image
            written.append(text)
        real(self, xy, text, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(ImageDraw.ImageDraw, "text", text)
        fig.png(1)
    return written


@pytest.mark.parametrize(
    "names",
    [
        [f"embedding_table_for_{what}_features_from_clickstream_v2_normalised" for what in
         ("user", "item")],
        [f"encoder.layers.{i}.attention.output.dense.weight_normalised" for i in range(12)],
        ["a_long_common_beginning_that_goes_on_and_on_X_and_a_long_common_ending_too",
         "a_long_common_beginning_that_goes_on_and_on_Y_and_a_long_common_ending_too"],
        ["pre" + "abc" * 20, "pre" + "abc" * 21, "short", "x" * 60, "x" * 61],
    ],
)  # fmt: skip
def test_boxes_of_different_names_never_show_the_same_text(
    names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long names are cut to fit, but never so that two boxes read the same: where a cut
    in the middle would make them alike, they are cut to show the part that differs, in
    the SVG and in the PNG."""
    fig = Figure([Box("rows", "Rows")] + [Box(n, "Scale") for n in names],
                 [Arrow("rows", n) for n in names])  # fmt: skip
    labels = [p.label for p in fig._arrangement.boxes]
    assert len(set(labels)) == len(labels)
    cut = [label for label, name in zip(labels[1:], names, strict=True) if len(name) > 40]
    assert cut and all("…" in label for label in cut)
    shown = {g.get("data-name"): next(t.text for t in g.iter(f"{SVG}text"))
             for g in parse(fig.svg()).iter(f"{SVG}g") if g.get("class") == "box"}  # fmt: skip
    assert len(set(shown.values())) == len(shown) == len(names) + 1
    if importlib.util.find_spec("PIL") is not None:
        written = drawn_png_texts(fig, monkeypatch)
        drawn = [w for w in written if w not in ("Rows", "Scale")]  # no badge, no legend
        assert len(set(drawn)) == len(drawn) == len(names) + 1


def test_png_escapes_what_its_font_cannot_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PNG's built-in font draws ASCII and a few symbols: any other character is written
    as Python's ascii() escapes it and a backslash is doubled, so that different names never
    draw alike (no empty boxes, no accents dropped); the SVG writes them as they are."""
    pytest.importorskip("PIL")

    def pictured(a: str, b: str) -> Figure:
        return Figure([Box(a, "Rows"), Box(b, "Top")], [Arrow(a, b)])

    for one, other in [
        (("数据", "模型"), ("清洗", "训练")),
        (("данные", "модель"), ("очистка", "обучение")),
        (("αβγ", "δεζ"), ("ηθι", "κλμ")),
        (("données", "modèle"), ("donnees", "modele")),
        (("a\\u00e9", "b"), ("aé", "b")),
        (("🙂", "b"), ("🙃", "b")),
    ]:
        assert pictured(*one).png(1) != pictured(*other).png(1), (one, other)
    fig = Figure([Box("数据", "Données"), Box("a\\b", "Top", worker="wé")], [Arrow("数据", "a\\b")])
    assert fig.png(1) == fig.png(1)
    written = drawn_png_texts(fig, monkeypatch)
    for shown in ("\\u6570\\u636e", "Donn\\xe9es", "a\\\\b"):
        assert shown in written, (shown, written)
    assert any(w.startswith("@") and w.endswith("\\xe9") for w in written)  # cut to its badge
    text = all_text(parse(fig.svg()))
    assert "数据" in text and "Données" in text and "@ wé" in text


def test_png_boxes_are_sized_for_the_names_as_it_writes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name the PNG writes escaped gets a box as wide as its escaped text, so that it is
    written whole where it fits the widest box and is cut in the middle, as any long name
    is, where it does not; different names still draw differently, and the SVG, which
    writes the names as they are, keeps its narrower boxes."""
    pytest.importorskip("PIL")
    from somatize.figure.png import _pil_font
    from somatize.figure.style import _NAME_SIZE, _PAD_X

    short, long = "数据处理", "用户特征嵌入表数据处理管道清洗训练模型"
    fig = Figure([Box(short, "Rows"), Box(long, "Scale", worker="工作站"), Box("b", "Top")],
                 [Arrow(short, long), Arrow(long, "b")])  # fmt: skip
    written = drawn_png_texts(fig, monkeypatch)
    assert "\\u6570\\u636e\\u5904\\u7406" in written
    assert "@ \\u5de5\\u4f5c\\u7ad9" in written
    cut = [w for w in written if w.startswith("\\u7528\\u6237")]
    assert len(cut) == 1 and "…" in cut[0] and cut[0].endswith("\\u6a21\\u578b"), written
    assert fig._png_arrangement is not None
    short_box, long_box, _ = fig._png_arrangement.boxes
    font = _pil_font(round(_NAME_SIZE * 2))  # fig.png(1) draws at twice the size
    assert font.getlength(cut[0]) / 2 <= long_box.w - 2 * _PAD_X
    assert short_box.w > fig._arrangement.boxes[0].w  # the SVG's, for the name unescaped
    svg = all_text(parse(fig.svg()))
    assert short in svg and "@ 工作站" in svg
    assert fig.svg() == Figure(fig.boxes, fig.arrows).svg()

    names = [f"模型{i}的嵌入表数据处理管道清洗训练" for i in "一二三"]
    fig = Figure([Box("rows", "Rows")] + [Box(n, "Scale") for n in names],
                 [Arrow("rows", n) for n in names])  # fmt: skip
    drawn = [w for w in drawn_png_texts(fig, monkeypatch) if w.startswith("\\u6a21")]
    assert len(set(drawn)) == len(drawn) == len(names), drawn


def test_png_spells_its_own_symbols_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times and counts the figure writes itself keep a plain spelling in the PNG (µs as us,
    ×2 as x2) where its font lacks the symbol."""
    pytest.importorskip("PIL")
    boxes = [Box("a", "A", outcome="ran", took_us=850), Box("b", "B", outcome="ran", took_us=9)]
    written = drawn_png_texts(Figure(boxes, [Arrow("a", "b", 10, reads=2)]), monkeypatch)
    assert "ran 850 us" in written and "x2 · 10 B" in written
