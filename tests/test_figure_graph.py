"""g.figure() and print(g): a graph drawn before it runs and coloured after."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from somatize import Broker, Graph, NodeFailed, Store, Worker
from somatize.figure import Figure
from somatize.figure.style import _BADGE_H, _human_bytes
from tests.nodes import Add, Echo, Fails, Largest, Rows, Scale

SVG = "{http://www.w3.org/2000/svg}"


def _seed_graph() -> Graph:
    g = Graph.somatize(
        Rows().named("sms").frozen()
        >> Scale().named("clean").frozen()
        >> Largest().named("widest").frozen().cached()
    )
    g.memory.freeze(
        "sms", "blake3:5f7ac20586dbfd7c53e497e70f5a7523331bd5133f7c07ee0341729bd9c684e3"
    )
    return g


def test_figure_before_running_shows_names_classes_and_marks() -> None:
    """A graph that never ran draws every node with its class and memory's marks."""
    g = Graph.somatize(
        Rows().named("sms").frozen()
        >> (Scale().named("clean").frozen().at("w1"), Echo().named("items").mapped())
        >> Largest().named("widest").frozen().cached("v2")
    )
    g.memory.freeze("sms", "blake3:5f7ac20586dbfd7c53e497e70f5a75")
    svg = g.figure()._repr_svg_()
    ET.fromstring(svg)
    for text in ("sms", "clean", "items", "widest", "Rows", "Scale", "Largest"):
        assert text in svg
    for mark in ("frozen", "cached", "mapped", "w1", "5f7ac205", "v2"):
        assert mark in svg


def test_figure_after_the_seeds_second_forward(store: Store) -> None:
    """After the second forward the figure marks the cached node recalled, the rest spared."""
    g = _seed_graph()
    g.forward({"at": 0, "take": 64}, store=store)
    g.forward({"at": 0, "take": 64}, store=store)
    assert g.record is not None
    svg = g.figure(g.record).svg()
    ET.fromstring(svg)
    assert "recalled" in svg and "spared" in svg
    assert g.record.outcome == {"sms": "spared", "clean": "spared", "widest": "recalled"}


def test_figure_after_a_first_forward_shows_times(store: Store) -> None:
    """Nodes that ran are drawn with their time."""
    g = _seed_graph()
    g.forward({"at": 0, "take": 64}, store=store)
    assert g.record is not None
    svg = g.figure(g.record).svg()
    assert "ran" in svg and ("µs" in svg or "ms" in svg)


def test_fifty_nodes_render() -> None:
    """A 50-node graph lays out and renders to SVG, every branch shown (how long it takes is
    measured by bench/figure_fanout.py)."""
    rows = Rows().named("rows")
    branches = tuple(
        rows >> Scale(float(i)).named(f"s{i}") >> Echo().named(f"e{i}") for i in range(24)
    )
    g = Graph.somatize(branches >> Largest().named("top"))
    assert len(g) == 50
    svg = g.figure().svg()
    assert all(f"s{i}" in svg for i in range(24))


def test_png_export(tmp_path: Path) -> None:
    """The figure saves as PNG where Pillow is installed, and as SVG always."""
    pytest.importorskip("PIL")
    g = _seed_graph()
    g.figure().save(tmp_path / "g.png")
    g.figure().save(tmp_path / "g.svg")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ET.parse(tmp_path / "g.svg")


def test_figure_refuses_what_is_no_record() -> None:
    """g.figure(x) with x neither a Record nor None is a TypeError naming what it takes."""
    g = Graph.somatize(Rows().named("rows") >> Largest().named("top"))
    with pytest.raises(TypeError, match=r"takes a Record.*not int"):
        g.figure(123)  # type: ignore[arg-type]


def test_figure_refuses_the_record_of_another_graph() -> None:
    """A record naming nodes this graph lacks is refused, the strangers named; this graph's
    records, from any of its forwards and with nodes left without outcome, are drawn."""
    g = Graph.somatize(Rows().named("rows") >> Scale().named("clean") >> Largest().named("top"))
    h = Graph.somatize(Rows().named("other") >> Scale().named("clean") >> Largest().named("widest"))
    h.forward({"at": 0, "take": 3})
    assert h.record is not None
    with pytest.raises(ValueError, match=r"\['other', 'widest'\].*another graph"):
        g.figure(h.record)
    g.forward({"at": 0, "take": 3})
    earlier = g.record
    g.forward({"at": 0, "take": 4})
    assert earlier is not None and earlier is not g.record
    ET.fromstring(g.figure(earlier).svg())
    broken = Graph.somatize(Rows().named("rows") >> Fails().named("boom") >> Largest().named("top"))
    with pytest.raises(NodeFailed):
        broken.forward({"at": 0, "take": 3})
    assert broken.record is not None and "top" not in broken.record.outcome
    ET.fromstring(broken.figure(broken.record).svg())


def _edge_labels(fig: Figure) -> dict[tuple[str, str], str | None]:
    """The label drawn on each edge of a figure, by (source, target)."""
    return {(r.arrow.source, r.arrow.target): r.label for r in fig._arrangement.routes}


def test_edge_labels_and_legend_say_bytes_crossed_both_ways() -> None:
    """Edges are labelled with the bytes their value crossed to or from a worker (the
    record's `crossed`), and the legend says so: in `rows >> s@w1 >> t@w1 >> here` the edge
    into the worker shows what was sent, the one out of it what came back, and the one
    between its two nodes both."""
    g = Graph.somatize(
        Rows().named("rows")
        >> Scale().named("s").at("w1")
        >> Scale(3.0).named("t").at("w1")
        >> Largest().named("here")
    )
    g.forward(
        {"at": 0, "take": 100}, broker=Broker.embedded({"w1": Worker.generic(mode="network")})
    )
    assert g.record is not None
    ways: dict[tuple[str, str], dict[str, int]] = {}
    for fact in g.record.facts:
        if fact["fact"] == "crossed" and "from" in fact:
            ways.setdefault((fact["from"], fact["node"]), {})[fact["way"]] = fact["bytes"]
    assert {edge: sorted(way) for edge, way in ways.items()} == {
        ("rows", "s"): ["out"],
        ("s", "t"): ["back", "out"],
        ("t", "here"): ["back"],
    }
    assert g.record.crossed == {edge: sum(way.values()) for edge, way in ways.items()}
    fig = g.figure(g.record)
    assert _edge_labels(fig) == {e: _human_bytes(n) for e, n in g.record.crossed.items()}
    legend = [item.text for item in fig._arrangement.legend if item.kind == "crossed"]
    assert legend == ["bytes to or from a worker"]


def test_an_answer_read_by_several_nodes_is_counted_once() -> None:
    """An answer made on a network worker and read by three nodes comes back once: its
    bytes are on the edge to its first reader and the others say 0, so the record, its
    facts and the figure's labels add up to what crossed, as with one reader."""

    def back(readers: int) -> tuple[list[int], dict[tuple[str, str], int]]:
        g = Graph.somatize(
            Rows().named("rows").at("w1")
            >> tuple(Scale(float(i)).named(f"r{i}") for i in range(readers))
        )
        g.forward(
            {"at": 0, "take": 100}, broker=Broker.embedded({"w1": Worker.generic(mode="network")})
        )
        assert g.record is not None
        facts = g.record.facts
        way = [f for f in facts if f["fact"] == "crossed" and f["way"] == "back"]
        return [f["bytes"] for f in way], g.record.crossed

    (alone,), crossed = back(1)
    assert crossed == {("rows", "r0"): alone}
    facts, crossed = back(3)
    assert facts == [alone, 0, 0]
    assert crossed == {("rows", "r0"): alone, ("rows", "r1"): 0, ("rows", "r2"): 0}


@pytest.mark.parametrize("reads", [2, 6])
def test_a_value_read_many_times_is_one_arrow_with_its_total(reads: int) -> None:
    """A node reading one value several times on a worker is drawn with one arrow from it,
    marked with how many times it is read and labelled with the bytes of all the reads,
    above the legend."""
    rows = Rows().named("rows")
    g = Graph.somatize(tuple([rows] * reads) >> Add().named("sum").at("w1"))
    g.forward(
        {"at": 0, "take": 100}, broker=Broker.embedded({"w1": Worker.generic(mode="network")})
    )
    assert g.record is not None
    sent = [f["bytes"] for f in g.record.facts if f["fact"] == "crossed" and "from" in f]
    assert len(sent) == reads and g.record.crossed == {("rows", "sum"): sum(sent)}
    fig = g.figure(g.record)
    assert _edge_labels(fig) == {("rows", "sum"): f"×{reads} · {_human_bytes(sum(sent))}"}
    (route,) = fig._arrangement.routes
    assert route.label_at is not None and fig._arrangement.legend_top is not None
    assert route.label_at[1] + _BADGE_H / 2 < fig._arrangement.legend_top
    assert route.start[1] == route.label_at[1]  # on its edge, which runs straight here


def test_nodes_a_failure_kept_from_running_are_drawn_not_reached() -> None:
    """After a failure, the nodes below it are drawn as not reached (a badge, a dotted
    border and a legend entry), not as if no record were given; with no record, and in a
    run that reached every node, nothing says not reached."""
    g = Graph.somatize(Rows().named("rows") >> Fails().named("boom") >> Largest().named("top"))
    assert "not reached" not in g.figure().svg()
    with pytest.raises(NodeFailed):
        g.forward({"at": 0, "take": 3})
    assert g.record is not None and g.record.outcome == {"rows": "ran", "boom": "failed"}
    fig = g.figure(g.record)
    drawn = {
        p.box.name: (p.box.outcome, [b.text for b in p.badges]) for p in fig._arrangement.boxes
    }
    assert drawn["top"] == ("unreached", ["not reached"])
    assert drawn["boom"] == ("failed", ["failed"])
    legend = [item.text for item in fig._arrangement.legend if item.kind == "outcome"]
    assert legend[-1] == "not reached"
    assert 'stroke-dasharray="1.5 3"' in fig.svg()
    whole = Graph.somatize(Rows().named("rows") >> Largest().named("top"))
    whole.forward({"at": 0, "take": 3})
    assert whole.record is not None
    assert "not reached" not in whole.figure(whole.record).svg()


def test_a_figure_group_that_is_no_str_draws_no_group() -> None:
    """`figure_group` groups a node's box when it is a str; a node that holds something
    else under that name (a list of its own) is drawn outside any group, not refused."""

    class Grouped(Echo):
        def __init__(self, group: object) -> None:
            self.figure_group = group

    g = Graph.somatize(
        Echo().named("src") >> (Grouped(["encoders"]).named("enc"), Grouped("heads").named("head"))
    )
    groups = {box.name: box.group for box in g.figure().boxes}
    assert groups == {"src": None, "enc": None, "head": "heads"}


@pytest.mark.parametrize("salt", ["v1\nv2", "v1\tv2", "v1\u2028v2"])
def test_a_salt_that_breaks_a_line_is_shown_escaped_on_one_line(salt: str) -> None:
    """A salt holding a line break (a tab, a line separator) is shown as Python writes it,
    quoted and escaped on one line, in its box's badge and tooltip, as `print(g)` shows it:
    never as two lines, nor as another salt that reads alike."""
    g = Graph.somatize(
        Rows().named("rows").frozen() >> Largest().named("top").frozen().cached(salt)
    )
    box = next(
        b for b in ET.fromstring(g.figure().svg()).iter(f"{SVG}g") if b.get("data-name") == "top"
    )
    title = box.find(f"{SVG}title")
    assert title is not None and title.text is not None
    assert f"salt: {salt!r}" in title.text.splitlines()
    assert f"cached · {salt!r}" in [t.text for t in box.iter(f"{SVG}text")]
    assert f"cached(salt={salt!r})" in str(g)
