"""What a forward tells its caller: its facts, read as a :class:`Record`, and the error
and warning it raises.

These are what a user holds after a forward (``graph.record``, ``except NodeFailed``, a
warnings filter on ``Drifted``), and what the drawing, the broker and the torch side
read; the engine that emits them is the loop behind. They are re-exported by
:mod:`somatize.engine`, their public home, whose docstring lists the facts::

    NodeFailed (SomatizeError, RuntimeError)   a node's forward raised, or a mapped node
                                               could not be run item by item
    WatcherFailed (SomatizeError, RuntimeError)
                                               the ``watching`` callback raised; the
                                               forward finished without it
    Drifted (SomatizeWarning)                  a recalled answer was kept by another
                                               version of the code it depends on

A record holds nothing but the facts, in order; each node's outcome, how long it took
and what crossed to or from a worker are read from them when asked, so what a record
says and what ``watching`` saw cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from somatize.errors import SomatizeError, SomatizeWarning, _Befell, _Rebuilt

__all__ = ["Drifted", "Fact", "NodeFailed", "Record", "WatcherFailed", "failed_as"]

Fact = dict[str, Any]


class NodeFailed(_Rebuilt, SomatizeError, RuntimeError):
    """A node's forward raised — or a mapped node could not be run item by item: what it
    was handed, or what it answered, is no list of its items (``raised=False``, ``error``
    saying what); nothing was kept for it or below it."""

    raised_there: str | None = None
    """The name of the type a node raised in another process (a worker's), which is named
    there and not carried here; None when it raised here."""

    def __init__(
        self,
        node: str,
        kind: str,
        error: BaseException,
        *,
        raised: bool = True,
        hint: str = "",
    ) -> None:
        self.node = node
        what = f"raised {type(error).__name__}: {message_of(error)}" if raised else str(error)
        super().__init__(
            f"`{node}` ({kind}) {what} — nothing was kept for `{node}` or anything below it"
            + (f". {hint}" if hint else "")
        )


def message_of(error: BaseException) -> str:
    """What ``error`` says; a note that it could not be read when its ``str()`` raises, so
    the caller still learns which node raised what."""
    try:
        return str(error)
    except Exception as unreadable:
        return f"(its message could not be read: str() of it raised {type(unreadable).__name__})"


def failed_as(error: SomatizeError) -> str:
    """What the ``failed`` fact of a node says it raised, for ``error``, a SomatizeError that
    stopped it: the type a node raised on a worker in another process, as a node raising
    here is said (:class:`~somatize.broker.FailedOnWorker`), so a graph says the same
    wherever it runs; the error's class for what befell its worker (``WorkerTimeout``,
    ``WorkerLost``, ``BrokerClosed``); ``refused`` for anything else (the library
    refusing)."""
    if isinstance(error, NodeFailed) and error.raised_there is not None:
        return error.raised_there
    if isinstance(error, _Befell):
        return type(error).__name__
    return "refused"


class WatcherFailed(_Rebuilt, SomatizeError, RuntimeError):
    """The ``watching`` callback raised on ``fact``. It was not called again, and the
    forward went on without it: what it ran was kept as usual, ``graph.record`` holds
    every fact, and ``value`` is what the forward would have returned. The callback's
    own error is the cause (``__cause__``)."""

    def __init__(self, fact: Fact, error: Exception, value: Any) -> None:
        self.fact = fact
        self.value = value
        super().__init__(
            f"the watching= callback raised {type(error).__name__} ({error}) when handed "
            f"{fact_named(fact)}; it was not called again, and the forward finished without "
            "it, keeping what it keeps: graph.record holds every fact, and this error's "
            "`value` is the forward's answer. Fix the callback, or catch WatcherFailed and "
            "take its `value`"
        )


def fact_named(fact: Fact) -> str:
    """``fact`` as a message names it: "the `ran` fact of `clean`"."""
    node = fact.get("node")
    return f"the `{fact['fact']}` fact" + (f" of `{node}`" if node is not None else "")


class Drifted(SomatizeWarning):
    """A recalled answer was kept by a different version of the code it depends on: its
    node's, or that of a node it reads."""


@dataclass
class Record:
    """What happened in one forward: its facts in order, and each node's outcome."""

    facts: list[Fact] = field(default_factory=list)

    @property
    def outcome(self) -> dict[str, str]:
        """Node → what became of it: ``ran``, ``recalled``, ``spared`` (not run: not needed),
        ``drifted`` (recalled from an answer kept by another version of its code; one
        ``strict=True`` recomputed instead ``ran``, its ``drifted`` fact saying
        ``recomputed``) or ``failed``."""
        out: dict[str, str] = {}
        for fact in self.facts:
            kind = fact["fact"]
            if kind == "failed" or (kind == "drifted" and not fact.get("recomputed")):
                out[fact["node"]] = kind  # said after `ran` or `recalled`, and wins
            elif kind == "ran" and out.get(fact["node"]) == "recalled":
                out[fact["node"]] = kind  # a mapped node's kept items read, the rest run
            elif kind in _OUTCOMES:
                out.setdefault(fact["node"], kind)
        return out

    @property
    def took_us(self) -> dict[str, int]:
        """Node → how long its forward took, for the nodes that ran."""
        return {fact["node"]: fact["took_us"] for fact in self.facts if fact["fact"] == "ran"}

    @property
    def crossed(self) -> dict[tuple[str, str], int]:
        """(source, target) → the bytes ``source``'s value crossed between this process and a
        worker on its way to ``target``, both ways added up: out to the worker ``target``
        runs on (``"way": "out"``) and back from the worker ``source`` ran on (``"back"``).
        An edge between two nodes of one network worker counts both, as the value comes
        back and goes out again. An answer read by several nodes came back once: its
        bytes are on the edge to the first of them that ran in the forward, the others'
        0; an edge to one that did not run (recalled, spared) is left out. A node's state
        (``"state"``), the graph's input and an output no node reads cross on no edge and
        are left out."""
        out: dict[tuple[str, str], int] = {}
        for fact in self.facts:
            if fact["fact"] == "crossed" and "from" in fact:
                edge = (fact["from"], fact["node"])
                out[edge] = out.get(edge, 0) + fact["bytes"]
        return out

    def count(self, fact: str) -> int:
        """How many facts of this kind were emitted."""
        return sum(1 for one in self.facts if one["fact"] == fact)


_OUTCOMES = frozenset(("ran", "recalled", "spared", "failed"))
