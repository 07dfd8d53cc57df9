"""The code an answer depends on: its node's and that of every node above it, as one
fingerprint kept beside the answer and compared on a hit.

The code an answer is kept with is not in its key (a cosmetic refactor would invalidate
half a store in silence; see :mod:`somatize.memory`), and it is more than the node's own:
the answer is what the node's code made of what the code of every node above it made, so
an edited node upstream makes it as stale as an edited node itself. So the fingerprint
(:attr:`~somatize.plan.Static.fingerprint`) covers them all, in the order the key reads
its inputs, and neither names nor keys: :func:`code_fingerprints`, worked out once per
graph state by :func:`~somatize.plan.static_of`.

A fingerprint worked out in this process is remembered with the code of each node it was
worked out from (the node's own fingerprint and those of what it reads, by position, not
by name), so a drifted answer this process kept — a notebook's cell edited and run again —
can name the nodes whose code changed (:func:`changed_code`); one kept by another process,
or long enough ago, is said to have drifted without names. These are re-exported
by :mod:`somatize.plan`, their public home.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from somatize._threads import make_room
from somatize.memory import upstream

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["changed_code", "code_fingerprints"]

_UNWRITTEN = "unwritten"
"""What a node with no code fingerprint (none noted in its graph's memory) contributes to
the fingerprints of the nodes below it."""

_KNOWN_CODE = 4096
"""How many fingerprints :func:`changed_code` remembers the code behind."""

_CODE: dict[str, tuple[str | None, tuple[str, ...]]] = {}
"""A fingerprint worked out in this process for a node (:attr:`~somatize.plan.Static.fingerprint`)
→ what it was worked out from: the node's own fingerprint, and those worked out for what it
reads, in order. So a drifted answer kept by this process — a cell of a notebook edited and
run again — can name what changed, by following the fingerprint it was kept with down the
nodes it reads, whatever they were called then. The last :data:`_KNOWN_CODE` seen are
remembered; for one older, or kept by another process, drift is said without names."""


def code_fingerprints(
    order: Iterable[str],
    preds: dict[str, tuple[str, ...]],
    written: dict[str, str | None],
) -> dict[str, str]:
    """For each node of ``order`` (each after what it reads), a digest of its own code
    fingerprint (``written``; :data:`_UNWRITTEN` when it has none) and of those worked
    out for ``preds`` — what it reads, in the order its key reads them. The code of
    everything an answer depends on, and neither names nor keys: one computation under
    two names, or on another input, is kept with the same one."""
    out: dict[str, str] = {}
    for node in order:
        digest = hashlib.sha256(b"somatize code 1\0")
        digest.update((written[node] or _UNWRITTEN).encode())
        for pred in preds[node]:
            digest.update(b"\0" + out[pred].encode())
        out[node] = "sha256:" + digest.hexdigest()[:16]
    return out


def _remember_code(
    fingerprint: dict[str, str],
    preds: dict[str, tuple[str, ...]],
    written: dict[str, str | None],
) -> None:
    """Remembers what each of ``fingerprint`` (:func:`code_fingerprints` of a graph state)
    was worked out from."""
    for node, worked_out in fingerprint.items():
        if worked_out in _CODE:
            continue
        make_room(_CODE, _KNOWN_CODE)
        _CODE[worked_out] = (written[node], tuple(fingerprint[p] for p in preds[node]))


def changed_code(graph: Graph, node: str, was: str | None) -> list[str] | None:
    """The nodes, of ``node`` and those it reads (nearest first), whose code is not now
    what it was when this process worked out the fingerprint ``was`` for ``node`` — None
    when it did not, or when what it remembers does not reach far enough to tell.

    ``was`` is followed down what the node reads, position by position, as the node's
    key reads them (the answer is recalled under the same key, so what it reads is read
    in the same shape); where a fingerprint worked out now is the one worked out then,
    nothing above it changed. Names do not count: the fingerprint may have been worked
    out in another graph, whose nodes were called otherwise."""
    if was is None:
        return None
    memory = graph.memory
    order = graph.nodes()
    preds = {n: graph.predecessors(n) for n in order}
    written = {n: memory.fingerprint_of(n) for n in order}
    now = code_fingerprints(order, preds, written)
    changed: set[str] = set()
    seen: set[tuple[str, str]] = set()
    walk = [(node, was)]
    while walk:
        at, then = walk.pop()
        if now[at] == then or (at, then) in seen:
            continue
        seen.add((at, then))
        remembered = _CODE.get(then)
        if remembered is None or len(remembered[1]) != len(preds[at]):
            return None
        own, above = remembered
        if (own or _UNWRITTEN) != (written[at] or _UNWRITTEN):
            changed.add(at)
        walk += zip(preds[at], above, strict=True)
    return [n for n in upstream(graph, node) if n in changed] or None
