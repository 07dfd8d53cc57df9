"""The engine: carries out a plan and says what happened.

One forward is: look at the graph again (a list a node was built with may have
changed since: :func:`~somatize.plan.look_again`); refuse what cannot honestly be
kept; compute every key; ask the store once; walk backward from the outputs
(:mod:`somatize.plan`); read back the recalled answers; run the rest in order,
keeping what cached nodes answer; and emit facts, in order, to ``watching`` and
into the run's :class:`Record`.

Facts are plain dicts::

    {"fact": "ran",      "node": "clean", "took_us": 812}
    {"fact": "kept",     "node": "widest", "key": "blake3:…", "bytes": 9}
    {"fact": "kept",     "node": "embed", "key": "blake3:…", "bytes": 9, "by": "w1"}
    {"fact": "recalled", "node": "widest", "key": "blake3:…"}
    {"fact": "spared",   "node": "clean"}
    {"fact": "drifted",  "node": "widest", "key": "blake3:…", "was": "…", "now": "…",
     "changed": ["clean"]}
    {"fact": "corrupt",  "node": "widest", "key": "blake3:…", "why": "…"}
    {"fact": "crossed",  "node": "clean", "from": "sms", "worker": "w1", "bytes": 1234,
     "way": "out"}
    {"fact": "failed",   "node": "clean", "error": "…"}
    {"fact": "finished", "took_us": 53}

A ``drifted`` answer was kept with another fingerprint of the code it depends on
(:attr:`~somatize.plan.Static.fingerprint`: its node's code and that of every
node it reads) than the graph has now; ``changed`` names the nodes whose code
changed, when this process worked out the fingerprint the answer was kept with
(a notebook's cell edited and run again), and is None otherwise.

A node is ``spared`` when it does not run because nothing asked for needs it: only
recalled nodes read it, or it is not above the outputs asked for (``outputs=``).

A mapped node says ``items`` (and ``of``) in its ``ran``, ``kept`` and ``recalled``
facts. Handed no items it runs, trivially and without being called: ``ran`` with
``items`` 0. Handed something that is no list, or answering a list of another
length than it was handed, it is ``failed``, and :class:`NodeFailed` says which.

An answer that was there when the store was asked but is damaged or gone when
read is a miss: it is reported (``corrupt``), the plan is redone without it,
and the node runs. A wrong answer is never returned. An answer computed that
cannot be kept (no codec writes it, the store refuses it) is ``failed`` after
``ran``, and its error goes on to the caller.

With a ``broker`` (:mod:`somatize.broker`) and a graph that places nodes, the
engine speaks to it in three calls: ``broker.check(graph)`` before anything runs
(an unknown worker, or a node its worker cannot rebuild, is refused there);
``broker.submit(graph, node, inputs, ctx, keep=...)`` for every placed node as
soon as its inputs are there, returning a future of a ``Done`` (``value``,
``took_us``, ``facts`` to emit, ``kept``: the bytes its worker kept when it kept
the answer itself); and ``broker.call(graph, node, inputs, ctx, emit)`` → the
value, for the items of a mapped node. The engine waits on whichever future it
needs next, so independent branches on different workers run at the same time,
and their facts come in the order things finish. Without a broker, or with no
node placed, the loop is the plain one, in order.
"""

from __future__ import annotations

import contextlib
import operator
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from somatize.codecs import CODECS, Opaque
from somatize.errors import SomatizeError, SomatizeWarning
from somatize.keys import item_key
from somatize.node import Context
from somatize.plan import Plan, changed_code, compile, item_keys_from, look_again
from somatize.store import Corrupt, Missing

if TYPE_CHECKING:
    from somatize.graph import Graph
    from somatize.store import Store

__all__ = ["Drifted", "NodeFailed", "Record", "run"]

Fact = dict[str, Any]


class NodeFailed(SomatizeError, RuntimeError):
    """A node's forward raised — or a mapped node could not be run item by item: what it
    was handed, or what it answered, is no list of its items (``raised=False``, ``error``
    saying what); nothing was kept for it or below it."""

    def __init__(self, node: str, kind: str, error: BaseException, *, raised: bool = True) -> None:
        self.node = node
        what = f"raised {type(error).__name__}: {error}" if raised else str(error)
        super().__init__(
            f"`{node}` ({kind}) {what} — nothing was kept for `{node}` or anything below it"
        )


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
            elif kind in _OUTCOMES:
                out.setdefault(fact["node"], kind)
        return out

    @property
    def took_us(self) -> dict[str, int]:
        """Node → how long its forward took, for the nodes that ran."""
        return {fact["node"]: fact["took_us"] for fact in self.facts if fact["fact"] == "ran"}

    @property
    def crossed(self) -> dict[tuple[str, str], int]:
        """(source, target) → bytes, for values that crossed to a worker."""
        out: dict[tuple[str, str], int] = {}
        for fact in self.facts:
            if fact["fact"] == "crossed" and "from" in fact:
                edge = (fact["from"], fact["node"])
                out[edge] = out.get(edge, 0) + fact["bytes"]
        return out

    def count(self, fact: str) -> int:
        """How many facts of this kind were emitted."""
        return sum(1 for one in self.facts if one["fact"] == fact)


class _Run:
    """The state of one forward."""

    def __init__(
        self,
        graph: Graph,
        store: Store | None,
        watching: Callable[[Fact], Any] | None,
        broker: Any,
        strict: bool,
    ) -> None:
        self.graph = graph
        self.store = store
        self.watching = watching
        self.broker = broker
        self.strict = strict
        self.record = Record()
        self.facts = self.record.facts
        self.values: dict[str, Any] = {}
        self.loaded: dict[str, Any] = {}
        self.drift: dict[str, tuple[str | None, str]] = {}
        """Node → the code fingerprints (kept with, now) of its drifted answers read back."""
        self.changed: dict[tuple[str, str | None], list[str] | None] = {}
        """(node, fingerprint kept with) → :func:`~somatize.plan.changed_code`, worked out
        once per forward."""

    def emit(self, fact: Fact) -> None:
        self.facts.append(fact)
        if self.watching is not None:
            self.watching(fact)

    # -- reading back -------------------------------------------------------------------------

    def load(self, plan: Plan) -> bool:
        """Reads every recalled answer; False (with the damaged keys dropped) if one failed."""
        static = plan.static
        for node in plan.recall:
            if node in self.loaded:
                continue
            keys = plan.items[node] if node in static.mapped else [plan.keys[node]]
            got = self.read(node, keys, static.fingerprint.get(node))
            damaged = [key for key in keys if got[key] is _DAMAGED]
            if damaged:
                plan.have.difference_update(damaged)
                return False
            self.loaded[node] = [got[k] for k in keys] if node in static.mapped else got[keys[0]]
        return True

    def read(self, node: str, keys: Sequence[str], fingerprint: str | None) -> dict[str, Any]:
        """The decoded answers under ``keys``; ``_DAMAGED`` for each that could not be used."""
        store = self.store
        assert store is not None
        if len(keys) == 1:
            key = keys[0]
            try:
                got: Any = store.recall(key)
            except (Missing, Corrupt) as error:
                got = error
            return {key: self._decode(node, key, got, fingerprint)}
        found = store.recall_many(keys)
        return {key: self._decode(node, key, found.get(key), fingerprint) for key in keys}

    def _decode(self, node: str, key: str, got: Any, fingerprint: str | None) -> Any:
        """The value of one recalled answer, or ``_DAMAGED`` (with the fact that says why)."""
        if not isinstance(got, tuple):
            problem = got if got is not None else Missing(key)
            self.emit({"fact": "corrupt", "node": node, "key": key, "why": str(problem)})
            return _DAMAGED
        answer, data = got
        if fingerprint and answer.fingerprint not in (None, fingerprint):
            if self.strict:
                fact = self.drift_fact(node, key, answer.fingerprint, fingerprint)
                fact["recomputed"] = True
                self.emit(fact)
                return _DAMAGED
            self.drift[node] = (answer.fingerprint, fingerprint)
        try:
            return CODECS.named(answer.codec).decode(data)
        except (ValueError, TypeError) as why:
            self.emit({"fact": "corrupt", "node": node, "key": key, "why": str(why)})
            return _DAMAGED

    def drift_fact(self, node: str, key: str | None, was: str | None, now: str) -> Fact:
        """The ``drifted`` fact of an answer of ``node`` kept with the code fingerprint
        ``was``, now ``now``: ``changed`` names the nodes (``node`` itself, or those it
        reads) whose code changed, when this process can tell, else None."""
        told = (node, was)
        if told not in self.changed:
            self.changed[told] = changed_code(self.graph, node, was)
        return {
            "fact": "drifted",
            "node": node,
            "key": key,
            "was": was,
            "now": now,
            "changed": self.changed[told],
        }

    def drifted(self, node: str, key: str | None, stacklevel: int) -> None:
        """Says that answers of ``node`` read back were kept by another version of the code
        they depend on — its own, or that of a node it reads: a ``drifted`` fact, and a
        warning for the frame ``stacklevel`` up from the caller."""
        was, now = self.drift[node]
        fact = self.drift_fact(node, key, was, now)
        self.emit(fact)
        warnings.warn(
            f"`{node}` was recalled from an answer kept by another version of "
            f"{_whose_code(self.graph, node, fact['changed'])} ({was}, now {now}); the key "
            "says the question is the same, but if the change altered what it computes, run "
            "with strict=True to recompute, or add a salt with `.cached(salt=...)`",
            Drifted,
            stacklevel=stacklevel + 1,
        )

    # -- running ------------------------------------------------------------------------------

    def call(self, node: str, inputs: Sequence[Any], ctx: Context) -> Any:
        implementation = self.graph.node(node)
        worker = ctx.worker
        start = time.perf_counter_ns()
        try:
            if worker is not None and self.broker is not None:
                value = self.broker.call(self.graph, node, list(inputs), ctx, self.emit)
            else:
                value = implementation.forward(*inputs, ctx)
        except SomatizeError:
            self.emit({"fact": "failed", "node": node, "error": "refused"})
            raise
        except Exception as error:
            self.emit({"fact": "failed", "node": node, "error": f"{type(error).__name__}"})
            raise NodeFailed(node, self.graph.kind_of(node), error) from error
        took = (time.perf_counter_ns() - start) // 1000
        return value, took

    def keep(self, node: str, key: str, value: Any, fingerprint: str | None) -> int:
        """Keeps the answer of ``node`` under ``key``, with the ``fingerprint`` of the code
        it depends on (:attr:`~somatize.plan.Static.fingerprint`); returns its bytes."""
        store = self.store
        assert store is not None
        with self._keeping(node):
            codec = CODECS.for_value(value, f"the answer of `{node}`")
            answer = store.keep(key, codec.encode(value), codec.name, fingerprint)
        return answer.size

    @contextlib.contextmanager
    def _keeping(self, node: str) -> Iterator[None]:
        """Says ``failed`` of ``node`` when its answer, computed, cannot be kept (no codec
        writes it, the store refuses it), before the error goes on to the caller."""
        try:
            yield
        except SomatizeError:
            self.emit({"fact": "failed", "node": node, "error": "refused"})
            raise
        except Exception as error:
            self.emit({"fact": "failed", "node": node, "error": type(error).__name__})
            raise

    def run_mapped(
        self, plan: Plan, node: str, inputs: list[Any], ctx: Context, stacklevel: int = 4
    ) -> Any:
        """Runs the items of mapped ``node`` whose answers are not kept, recalls the rest,
        and says both (and drift, as :func:`_recalled` does: ``stacklevel`` is where the
        caller's forward is, seen from here)."""
        static = plan.static
        preds = static.preds[node]
        for index, value in enumerate(inputs):
            if not isinstance(value, (list, tuple)):
                what = f"what `{preds[index]}` answered" if preds else "the graph's input"
                raise self.unmappable(
                    node,
                    TypeError(
                        f"is mapped, so what it reads must be a list (one item per element), "
                        f"and {what} is {_describe(value)}: make it a list of items, or drop "
                        "`.mapped()`"
                    ),
                )
        lengths = {len(value) for value in inputs}
        if len(lengths) > 1:
            said = ", ".join(f"`{p}`: {len(v)}" for p, v in zip(preds, inputs, strict=True))
            raise self.unmappable(
                node,
                ValueError(
                    f"is mapped over inputs of different lengths ({said}): a mapped node "
                    "pairs item i of each input, so they must be equally long"
                ),
            )
        count = lengths.pop() if lengths else 0
        keyed = node in static.cached
        items: list[str] | None = None
        if keyed:
            if node in static.late:
                columns = [
                    self._item_column(plan, p, len(v))
                    for p, v in zip(static.preds[node], inputs, strict=True)
                ]
                items = item_keys_from(static.prefix[node], columns, node)
                plan.items[node] = items
                assert self.store is not None
                if items:
                    plan.have |= self.store.have(items)
            else:
                items = plan.items[node]
        out: list[Any] = [None] * count
        missing = list(range(count))
        if items is not None:
            present = [key for key in items if key in plan.have]
            got = self.read(node, present, static.fingerprint.get(node)) if present else {}
            missing = []
            for index, key in enumerate(items):
                value = got.get(key, _DAMAGED)
                if value is _DAMAGED:
                    missing.append(index)
                else:
                    out[index] = value
        recalled = count - len(missing)
        if missing:
            sub = [[value[i] for i in missing] for value in inputs]
            ctx.keys = [items[i] for i in missing] if items is not None else None
            answers, took = self.call(node, sub, ctx)
            if not isinstance(answers, (list, tuple)) or len(answers) != len(missing):
                raise self.unmappable(
                    node,
                    TypeError(
                        f"answered {_describe(answers)} for the {len(missing)} items it was "
                        "handed: a mapped node returns a list as long as its input, item i "
                        "out from item i in"
                    ),
                )
            self.emit(
                {"fact": "ran", "node": node, "took_us": took, "items": len(missing), "of": count}
            )
            for index, value in zip(missing, answers, strict=True):
                out[index] = value
            if items is not None:
                kept = self.keep_items(
                    node,
                    [(items[i], out[i]) for i in missing],
                    static.fingerprint.get(node),
                )
                self.emit({"fact": "kept", "node": node, "items": len(missing), "bytes": kept})
        elif not count:  # no items: it runs, trivially, without being called
            self.emit({"fact": "ran", "node": node, "took_us": 0, "items": 0, "of": 0})
        if recalled:
            self.emit({"fact": "recalled", "node": node, "items": recalled, "of": count})
        if node in self.drift:
            self.drifted(node, plan.keys.get(node), stacklevel)
        return out

    def unmappable(self, node: str, why: Exception) -> NodeFailed:
        """Says ``failed`` of mapped ``node``, which cannot be run item by item (``why``:
        what it was handed, or what it answered, is no list of its items), and returns the
        error to raise."""
        self.emit({"fact": "failed", "node": node, "error": type(why).__name__})
        return NodeFailed(node, self.graph.kind_of(node), why, raised=False)

    def keep_items(self, node: str, answers: list[tuple[str, Any]], fingerprint: str | None) -> int:
        """Keeps a mapped node's item answers, grouped by codec, with the ``fingerprint`` of
        the code they depend on; returns the bytes kept."""
        store = self.store
        assert store is not None
        groups: dict[str, list[tuple[str, Sequence[Any]]]] = {}
        with self._keeping(node):
            for key, value in answers:
                codec = CODECS.for_value(value, f"an item answer of `{node}`")
                groups.setdefault(codec.name, []).append((key, codec.encode(value)))
            return sum(
                answer.size
                for name, items in groups.items()
                for answer in store.keep_many(items, name, fingerprint)
            )

    def _item_column(self, plan: Plan, pred: str, count: int) -> list[str]:
        if pred in plan.items:
            return plan.items[pred]
        return [item_key(plan.keys[pred], i) for i in range(count)]


def _recalled(state: _Run, plan: Plan, node: str, stacklevel: int = 4) -> None:
    """Hands on a recalled answer, with its facts (and a warning if its code drifted)."""
    values = state.values
    static = plan.static
    values[node] = state.loaded[node]
    if node in static.mapped:
        state.emit({"fact": "recalled", "node": node, "items": len(values[node])})
    else:
        state.emit({"fact": "recalled", "node": node, "key": plan.keys[node]})
    if node in state.drift:
        state.drifted(node, plan.keys.get(node), stacklevel)


def _flow(state: _Run, plan: Plan, value_of: Any, store: Store | None) -> None:
    """The forward's loop when a broker runs placed nodes: each node starts as soon as
    what it reads is there. A placed node is submitted to its worker (``broker.submit``)
    and the loop moves on, so independent branches on different workers run at the same
    time; nodes placed nowhere run here, in order; facts come as things finish."""
    graph = state.graph
    broker = state.broker
    static = plan.static
    running = set(plan.run)
    recalled = set(plan.recall)
    values = state.values
    placement = graph.placement
    waiting = list(static.order)
    done: set[str] = set()
    busy: dict[Future[Any], str] = {}
    try:
        while waiting or busy:
            later = []
            for node in waiting:
                preds = static.preds[node]
                if any(p not in done for p in preds):
                    later.append(node)
                    continue
                done.add(node)
                if node in recalled:
                    _recalled(state, plan, node, stacklevel=5)
                    continue
                if node not in running:
                    state.emit({"fact": "spared", "node": node})
                    continue
                inputs = [values[p] for p in preds] if preds else [value_of]
                worker = placement.worker_of(node)
                ctx = Context(name=node, key=plan.keys.get(node), worker=worker, store=store)
                if node in static.mapped:
                    values[node] = state.run_mapped(plan, node, inputs, ctx, stacklevel=5)
                    continue
                if worker is not None:
                    keep = node in static.cached and store is not None
                    busy[broker.submit(graph, node, inputs, ctx, keep=keep)] = node
                    done.discard(node)
                    continue
                value, took = state.call(node, inputs, ctx)
                _ran(state, plan, node, value, took, None)
            waiting = later
            if not busy:
                continue
            finished, _ = wait(busy, return_when=FIRST_COMPLETED)
            for future in finished:
                node = busy.pop(future)
                try:
                    outcome = future.result()
                except SomatizeError:
                    state.emit({"fact": "failed", "node": node, "error": "refused"})
                    raise
                except Exception as error:
                    state.emit({"fact": "failed", "node": node, "error": type(error).__name__})
                    raise NodeFailed(node, graph.kind_of(node), error) from error
                for fact in outcome.facts:
                    state.emit(fact)
                _ran(state, plan, node, outcome.value, outcome.took_us, outcome.kept)
                done.add(node)
    finally:
        for future in busy:
            future.cancel()


def _ran(state: _Run, plan: Plan, node: str, value: Any, took: int, kept: int | None) -> None:
    """Records the value of a node that ran, and keeps it if it is cached (unless its
    worker already did: ``kept`` is then the bytes it wrote)."""
    state.values[node] = value
    state.emit({"fact": "ran", "node": node, "took_us": took})
    if node in plan.static.cached and state.store is not None:
        key = plan.keys[node]
        if kept is None:
            size = state.keep(node, key, value, plan.static.fingerprint.get(node))
            state.emit({"fact": "kept", "node": node, "key": key, "bytes": size})
        else:
            worker = state.graph.placement.worker_of(node)
            state.emit({"fact": "kept", "node": node, "key": key, "bytes": kept, "by": worker})


_DAMAGED = object()
_OUTCOMES = frozenset(("ran", "recalled", "spared", "failed"))


def _whose_code(graph: Graph, node: str, changed: list[str] | None) -> str:
    """Whose code a drifted answer of ``node`` was kept by another version of, as a warning
    says it: the nodes in ``changed``, or — not known — ``node``'s or a node's it reads."""
    if changed is None:
        return f"`{graph.kind_of(node)}`'s code or of the code of a node it reads"
    said = []
    if node in changed:
        said.append(f"`{graph.kind_of(node)}`'s code")
    above = [f"`{n}` (`{graph.kind_of(n)}`)" for n in changed if n != node]
    if above:
        said.append(f"the code of {', '.join(above)}, which it reads")
    return " and of ".join(said)


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a `{type(value).__name__}`"


_NESTS = (list, tuple, dict)
_OPENED = frozenset((Opaque, *_NESTS))
"""What an input may hold that :func:`_opened` looks into."""


def _opened(value: Any) -> Any:
    """``value`` as the nodes are handed it: each :class:`~somatize.Opaque` in it (itself,
    or inside its lists, tuples and dicts) replaced by what it wraps; ``value`` itself when
    it holds none."""
    kind = type(value)
    if kind not in _NESTS:
        return value.value if isinstance(value, Opaque) else value
    items = value.values() if kind is dict else value
    if _OPENED.isdisjoint(map(type, items)):
        return value
    opened = [_opened(item) for item in items]
    if all(map(operator.is_, opened, items)):
        return value
    if kind is dict:
        return dict(zip(value, opened, strict=True))
    return opened if kind is list else tuple(opened)


def run(
    graph: Graph,
    x: Any,
    *,
    store: Store | None,
    watching: Callable[[Fact], Any] | None,
    broker: Any,
    strict: bool,
    outputs: str | Sequence[str] | None,
) -> Any:
    """One forward of ``graph`` on ``x``; see the module docstring."""
    start = time.perf_counter_ns()
    if outputs is None:
        wanted = graph.outputs
    elif isinstance(outputs, str):
        wanted = (graph.resolve(outputs),)
    else:
        wanted = tuple(graph.resolve(name) for name in outputs)
    if watching is not None and not callable(watching):
        raise TypeError(
            f"watching= takes a function called with each fact (`facts.append`, `print`), "
            f"got {_describe(watching)}"
        )
    if broker is not None and not callable(getattr(broker, "check", None)):
        raise TypeError(
            "broker= takes a somatize Broker (`Broker.embedded({...})`, `Broker.ray(...)`), "
            f"got {_describe(broker)}"
        )
    look_again(graph)
    if broker is not None:
        broker.check(graph)
    state = _Run(graph, store, watching, broker, strict)
    graph.record = state.record
    plan = compile(graph, x, store, wanted)
    if store is not None:
        while not state.load(plan):
            plan.walk(wanted)
    value_of = _opened(x)
    static = plan.static
    running = set(plan.run)
    recalled = set(plan.recall)
    values = state.values
    placement = graph.placement
    if broker is not None and len(placement):
        _flow(state, plan, value_of, store)
    else:
        for node in static.order:
            if node in recalled:
                _recalled(state, plan, node)
                continue
            if node not in running:
                state.emit({"fact": "spared", "node": node})
                continue
            preds = static.preds[node]
            inputs = [values[p] for p in preds] if preds else [value_of]
            ctx = Context(
                name=node,
                key=plan.keys.get(node),
                worker=placement.worker_of(node),
                store=store,
            )
            if node in static.mapped:
                values[node] = state.run_mapped(plan, node, inputs, ctx)
                continue
            value, took = state.call(node, inputs, ctx)
            values[node] = value
            state.emit({"fact": "ran", "node": node, "took_us": took})
            if node in static.cached and store is not None:
                key = plan.keys[node]
                size = state.keep(node, key, value, static.fingerprint.get(node))
                state.emit({"fact": "kept", "node": node, "key": key, "bytes": size})
    state.emit({"fact": "finished", "took_us": (time.perf_counter_ns() - start) // 1000})
    if len(wanted) == 1:
        return values[wanted[0]]
    return tuple(values[name] for name in wanted)
