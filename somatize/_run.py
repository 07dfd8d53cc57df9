"""The state of one forward, and the steps it takes on a node: read its answers back, call
it, keep what it answered, and run a mapped node item by item.

The engine's loops (:mod:`somatize.engine`) decide what runs when; a :class:`_Run`
takes each step and says it, every fact emitted as it happens to ``watching`` and into
the run's :class:`~somatize.engine.Record`. A step that fails says ``failed`` before its
error goes on to the caller.

An answer that cannot be used when read back — gone, damaged, not decodable, or (with
``strict=True``) kept by another version of its code — is ``_DAMAGED``: a miss, said in
a fact, never a wrong answer. A drifted answer read back is noted in ``drift`` and said
(a ``drifted`` fact and a :class:`~somatize.engine.Drifted` warning) when the node is
handed on, so that the warning can point at the caller's forward (``stacklevel``).

A mapped node's items are keyed one by one: those kept are read back, the rest run in
one call, and what it reads and what it answers must be lists as long as each other.
Items alike (one key) are one question: the node is handed it once, and every other
place gets the answer written by its codec and read back, an object of its own, as
each recalled item is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from somatize._record import (
    Drifted,
    Fact,
    NodeFailed,
    Record,
    WatcherFailed,
    fact_named,
    failed_as,
)
from somatize.canonical import NotCanonical, digest_of, parts_of
from somatize.catalog import fingerprint_of, own_state
from somatize.codecs import CODECS, CodecError, Opaque, Plain, Unreadable
from somatize.errors import SomatizeError
from somatize.keys import item_key, root_key
from somatize.node import Context, running_here
from somatize.plan import Plan, changed_code, item_keys_from
from somatize.store import Corrupt, Missing
from somatize.store._serial import reading, serially
from somatize.store.base import recalled

if TYPE_CHECKING:
    from somatize.graph import Graph
    from somatize.store import Store

__all__ = ["_Run"]


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
        self.emit: Callable[[Fact], None] = (
            self.facts.append if watching is None else self._emit_watched
        )
        """Puts a fact in the record, and hands ``watching`` a copy of it
        (:meth:`_emit_watched`); with nothing watching, the record's own append, so that a
        fact costs no call of Python's."""
        self.wanted: tuple[str, ...] = graph.outputs
        """The nodes whose answers this forward hands back (``outputs=``)."""
        self.running: frozenset[str] | None = None
        """The nodes this forward runs, once planned; None for all of them."""
        self.input: tuple[Any, Any, str | None] | None = None
        """The graph's input, what its nodes are handed of it (:meth:`reads_input`), and
        its key as it was handed in (None where it is not keyed)."""
        self.read_input: list[str] = []
        """The nodes that read the graph's input, in the order they were handed it."""
        self.handed: dict[str, list[str]] = {}
        """Node of :attr:`~somatize.plan.Static.shared` → the nodes handed its answer so far,
        in the order they were handed it."""
        self.marks: dict[str, Hashable] = {}
        """Node of :attr:`~somatize.plan.Static.shared` → what told its answer unchanged as
        the first node was handed it (:func:`_mark_of`); taken only where a keyed node that
        runs is handed it after, and where a codec weighs the answer."""
        self.beside: dict[str, tuple[Sequence[Any], list[tuple[Any, Hashable, str]]]] = {}
        """Node running on a worker that is handed the very objects (a local one) → what it
        was handed, and for each of those a node handed too while it ran: that input, what
        told it unchanged as that node was handed it, and that node (:meth:`hands_beside`)."""
        self.values: dict[str, Any] = {}
        self.moved: set[str] = set()
        """The nodes whose answers this forward keeps none of: a mapped node whose code was
        changed as its items ran on a network worker
        (:attr:`~somatize.broker.base.Done.moved`), and a node that changed what it declares
        as it ran here (:meth:`~somatize.node.Node.changed_as_it_ran`)."""
        self.loaded: dict[str, Any] = {}
        self.unused: set[str] = set()
        """The keys whose answers this forward read back and could not use (unreadable,
        corrupt, drifted under ``strict``): the store object remembers those records."""
        self.drift: dict[str, tuple[str | None, str]] = {}
        """Node → the code fingerprints (kept with, now) of the first of its drifted answers
        read back: a mapped node's items may have been kept by several older versions."""
        self.changed: dict[tuple[str, str | None], list[str] | None] = {}
        """(node, fingerprint kept with) → :func:`~somatize.plan.changed_code`, worked out
        once per forward."""
        self.watcher_failed: tuple[Fact, Exception] | None = None
        """The fact ``watching`` raised on, and its error; it is not called again."""

    def _emit_watched(self, fact: Fact) -> None:
        """Puts ``fact`` in the record and hands ``watching`` a copy of it: what a watcher
        does to the fact it is handed does not change what the record says happened.

        A watcher that raises is not called again, and the forward goes on without it, so
        that what it computes is not lost to it; :meth:`watcher_said` says so at the end."""
        self.facts.append(fact)
        if self.watching is not None:
            try:
                self.watching(_copy_of(fact))
            except Exception as error:
                self.watching = None
                self.watcher_failed = (_copy_of(fact), error)

    def watcher_said(self, value: Any) -> None:
        """Raises :class:`~somatize.engine.WatcherFailed` if the watcher raised during a
        forward that finished with ``value``."""
        if self.watcher_failed is not None:
            fact, error = self.watcher_failed
            raise WatcherFailed(fact, error, value) from error

    def watcher_noted(self, failure: BaseException) -> None:
        """Notes on ``failure``, the error a forward ends with, that the watcher had raised
        before it (where exceptions take notes: Python 3.11 and later)."""
        if self.watcher_failed is not None and sys.version_info >= (3, 11):
            fact, error = self.watcher_failed
            failure.add_note(
                f"The watching= callback had raised {type(error).__name__} ({error}) when "
                f"handed {fact_named(fact)}, and was not called again."
            )

    # -- reading back -------------------------------------------------------------------------

    def load(self, plan: Plan) -> bool:
        """Reads every recalled answer; False (with the damaged keys dropped) if one failed."""
        static = plan.static
        loaded = self.loaded
        for node in plan.recall:
            if node in loaded:
                continue
            if node not in static.mapped:
                key = plan.keys[node]
                value = self._read_one(node, key, static.fingerprint.get(node))
                if value is _DAMAGED:
                    plan.have.discard(key)
                    return False
                loaded[node] = value
                continue
            keys = plan.items[node]
            got = self.read(
                node, keys, static.fingerprint.get(node), len(keys), plan.keys.get(node)
            )
            damaged = [key for key, value in zip(keys, got, strict=True) if value is _DAMAGED]
            if damaged:
                plan.have.difference_update(damaged)
                return False
            loaded[node] = got
        return True

    def _read_one(self, node: str, key: str, fingerprint: str | None) -> Any:
        """The decoded answer under ``key``; ``_DAMAGED`` if it could not be used."""
        value = self._decode(node, key, self._recalled(key), fingerprint)
        if isinstance(value, (_Unused, _Recompute)):
            self.emit(self.unused_fact(node, key, value))
            self.unused.add(key)
            return _DAMAGED
        return value

    def _recalled(self, key: str) -> Any:
        """What the store recalls under ``key``: its answer and bytes, or why it has none
        whole (Missing, Corrupt)."""
        store = self.store
        assert store is not None
        try:
            return serially(store, recalled, store, key)
        except (Missing, Corrupt) as error:
            return error

    def read(
        self,
        node: str,
        keys: Sequence[str],
        fingerprint: str | None,
        of: int,
        whole: str | None,
    ) -> list[Any]:
        """The decoded answer under each of ``keys``, items of mapped ``node`` (handed ``of``
        items; keyed ``whole``, where it has a key of its own), in their order; ``_DAMAGED``
        for each that could not be used. A key met again (two items alike) is decoded again,
        from a copy of its bytes, so that each item recalled is an object of its own, in
        memory of its own (a tensor decodes in place, over the bytes it is read from), as
        each computed is.

        The items that cannot be used for one reason (the blob of their pack found damaged,
        their codec not registered, kept by other versions of the code with ``strict``,
        one or more) are said in one fact, whose ``items`` says how many (and ``of``, of how
        many handed): a damaged pack of 100,000 items is one ``corrupt`` fact, not 100,000,
        and 100,000 items drifted one ``drifted`` fact, keyed ``whole`` as a node's drift
        recalled is, and saying the version of the code the first was kept by, as that is
        too."""
        store = self.store
        assert store is not None
        if len(keys) == 1:
            found = {keys[0]: self._recalled(keys[0])}
        else:
            found = serially(store, store.recall_many, keys)
        said: dict[_Unused | type[_Recompute], Fact] = {}
        damaged: dict[str, Fact] = {}  # key → the fact saying so
        decoded: set[str] = set()
        out: list[Any] = []
        for key in keys:
            if key in damaged:  # one found damaged is not read, nor said so, again
                value = _DAMAGED
            else:
                got = found.get(key)
                if key in decoded and isinstance(got, tuple):
                    got = (got[0], memoryview(bytearray(got[1])))
                decoded.add(key)
                value = self._decode(node, key, got, fingerprint)
                if isinstance(value, (_Unused, _Recompute)):
                    # A drift is said of the node, as one recalled, once whichever versions
                    # of the code kept its items; damage of the item, once per why.
                    why = _Recompute if isinstance(value, _Recompute) else value
                    if why not in said:
                        told = whole if why is _Recompute else key
                        said[why] = self.unused_fact(node, told, value)
                        said[why].update(items=0, of=of)
                    damaged[key] = said[why]
                    value = _DAMAGED
            if value is _DAMAGED:
                damaged[key]["items"] += 1
            out.append(value)
        for fact in said.values():
            self.emit(fact)
        return out

    def _decode(self, node: str, key: str, got: Any, fingerprint: str | None) -> Any:
        """The value of one recalled answer; or why it cannot be used, for the caller to
        say: :class:`_Unused`, or :class:`_Recompute` where it is drifted (``strict``)."""
        if not isinstance(got, tuple):
            problem = got if got is not None else Missing(key)
            return _Unused("corrupt", str(problem))
        answer, data = got
        drifted: tuple[str | None, str] | None = None  # the fingerprints kept with, and now
        if fingerprint and answer.fingerprint not in (None, fingerprint):
            drifted = (answer.fingerprint, fingerprint)
        if drifted is not None and self.strict:
            return _Recompute(*drifted)
        try:
            codec = CODECS.named(answer.codec)
        except CodecError as why:  # whole, kept by a codec not registered here: no damage
            return _Unused("unreadable", str(why))
        try:
            value = codec.decode(data)
        except Unreadable as why:
            return _Unused("unreadable", str(why))
        except (ValueError, TypeError) as why:
            return _Unused("corrupt", str(why))
        if drifted is not None:  # noted once read: one unread is computed, not recalled
            self.drift.setdefault(node, drifted)  # the first, as `strict` says it
        return value

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

    def unused_fact(self, node: str, key: str | None, why: _Unused | _Recompute) -> Fact:
        """The fact that says an answer of ``node`` read back under ``key`` is not used:
        ``corrupt`` or ``unreadable``, saying why; or, for one ``strict`` computes again as
        it was kept by another version of the code, ``drifted``, saying ``recomputed``."""
        if isinstance(why, _Unused):
            return {"fact": why.fact, "node": node, "key": key, "why": why.why}
        fact = self.drift_fact(node, key, why.was, why.now)
        fact["recomputed"] = True
        return fact

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
            "with strict=True to recompute (`g.forward(..., strict=True)`; a wrapped model: "
            "`somatize.torch.wrap(model, ..., strict=True)`), or add a salt "
            "(`.cached(salt=...)`; a wrapped model: `cached={name: salt}`)",
            Drifted,
            stacklevel=stacklevel + 1,
        )

    # -- running ------------------------------------------------------------------------------

    def reads_input(self, plan: Plan, node: str, x: Any, handed: Any) -> None:
        """Notes that ``node`` is handed the graph's input ``x``, as ``handed`` (``x``, or,
        where it holds an Opaque, lists, tuples and dicts of its own holding what each
        Opaque wraps). A keyed node handed it after another node was, when it no longer
        keys as it did (that node wrote into it as it ran: sorted a list in place, popped
        from a dict), fails rather than compute from it what would be kept under the key of
        the input as it was handed in, and recalled for it. Keyed again only then: the first
        node handed the input reads it as it was keyed, and what a node computes from an
        input it writes into itself is its answer to it."""
        before = self.read_input
        if before and plan.root is not None and node in plan.static.prefix:
            try:
                moved = root_key(_as_handed(x, handed)) != plan.root
            except (NotCanonical, CodecError):  # written into it: what nothing keys
                moved = True
            if moved:
                raise self._written_into(
                    node, before, "the graph's input", "the input as it was handed in"
                )
        before.append(node)

    def reads_shared(self, plan: Plan, node: str) -> None:
        """Notes that ``node`` is handed answers that other nodes read too
        (:attr:`~somatize.plan.Static.shared`). A keyed node handed one after another node
        was, when it is no longer the answer that was made or read back (that node wrote
        into it as it ran: sorted a list in place, added to a tensor with ``add_``), fails
        rather than compute from it what would be kept under a key that names the answer
        as it was made, and recalled for it. The answer is marked as the first node is
        handed it, and only where a keyed node that runs is handed it after: by its codec's
        stamp where it has one (a tensor's version counter), otherwise by what a recalled
        answer keeps, the order of its dicts included (:func:`_mark_of`). An
        answer no codec weighs (a numpy array) cannot be marked: it is handed on unchecked,
        and a write into it is not seen."""
        static = plan.static
        handed = self.handed
        preds = static.preds[node]
        for pred in preds if len(preds) == 1 else dict.fromkeys(preds):
            keyed = static.shared.get(pred)
            if keyed is None:
                continue
            before = handed.get(pred)
            if before is None:
                handed[pred] = [node]
                for reader in keyed:
                    if reader != node and reader in plan.running:
                        # Where nothing tells it unchanged, it is handed on unchecked.
                        with contextlib.suppress(CodecError):
                            self.marks[pred] = _mark_of(self.values[pred])
                        break
                continue
            if pred in self.marks and node in keyed:
                self._unwritten(node, pred, before)
            before.append(node)

    def _unwritten(self, node: str, pred: str, before: list[str]) -> None:
        """NodeFailed, said, when the answer of ``pred`` that keyed ``node`` is handed, after
        the nodes ``before``, is not as it was marked."""
        try:
            moved = _mark_of(self.values[pred]) != self.marks[pred]
        except CodecError:  # something no codec weighs was written into it
            moved = True
        if moved:
            raise self._written_into(
                node, before, f"the answer of `{pred}`", f"the answer `{pred}` made"
            )

    def hands_beside(
        self, node: str, inputs: Sequence[Any], local: bool, running: Sequence[str]
    ) -> list[tuple[Any, Hashable, str]] | None:
        """Notes that ``node`` is handed ``inputs`` while the nodes ``running`` run on
        workers that are handed the very objects (local ones), and on such a worker itself
        when ``local``: each input it shares with one of them is marked now
        (:func:`_mark_of`), for each of the two, which :meth:`answered_beside` looks at
        again as each answers. The engine hands a node what it reads once that is there,
        so nodes beside each other on such workers read the same objects at the same time,
        where without a broker they would run one after the other. Returns what ``node``
        shares so (None where it shares nothing)."""
        shares: list[tuple[Any, Hashable, str]] = []
        for other in running:
            found = self.beside.get(other)
            if found is None:
                continue
            handed, noted = found
            for value in inputs:
                if not any(value is read for read in handed):
                    continue
                try:
                    mark = self._mark_of(value)
                except (CodecError, NotCanonical):
                    continue  # nothing tells it unchanged: handed on unchecked, as elsewhere
                noted.append((value, mark, node))
                shares.append((value, self._handed_as(value, mark), other))
        if local:
            self.beside[node] = (inputs, shares)
        return shares or None

    def _mark_of(self, value: Any) -> Hashable:
        """What tells ``value`` unchanged (:func:`_mark_of`); the graph's input, where its
        nodes are handed lists and dicts of its own holding what an Opaque in it wraps, by
        its key as they hold it now (:func:`_as_handed`), which no codec may weigh whole."""
        given = self.input
        if given is not None and value is given[1]:
            return root_key(_as_handed(given[0], value))
        return _mark_of(value)

    def _handed_as(self, value: Any, mark: Hashable) -> Hashable:
        """What tells ``value``, marked ``mark`` as a node is handed it, as that node was
        handed it: the graph's input by its key as it was handed in, which a keyed node
        handed it after another was found it still held (:meth:`reads_input`), as a node
        beside it may have written into it since; ``mark`` otherwise."""
        given = self.input
        if given is not None and value is given[1] and given[2] is not None:
            return given[2]
        return mark

    def answered_beside(
        self, plan: Plan, node: str, shares: list[tuple[Any, Hashable, str]] | None = None
    ) -> None:
        """NodeFailed, said, when keyed ``node`` answered after an input it shared with a
        node running beside it (:meth:`hands_beside`) changed: one of the two wrote into
        it as the other read it, so what ``node`` computed may be from the input written,
        which would be kept, and recalled, under the key of the input as it was handed.
        ``shares``: what :meth:`hands_beside` returned for a node run here; one run on a
        local worker is looked up."""
        found = self.beside.pop(node, None)
        if found is not None:
            shares = found[1]
        if not shares or node not in plan.static.prefix:
            return
        moved: dict[int, tuple[Any, list[str]]] = {}
        for value, mark, other in shares:
            try:
                changed = self._mark_of(value) != mark
            except (CodecError, NotCanonical):  # something no codec weighs was written into it
                changed = True
            if changed:
                moved.setdefault(id(value), (value, []))[1].append(other)
        for value, others in moved.values():
            preds = plan.static.preds[node]
            handed = (
                "the graph's input"
                if not preds
                else " and ".join(
                    f"the answer of `{p}`" for p in preds if self.values.get(p) is value
                )
                or "an input"
            )
            beside = " and ".join(f"`{n}`" for n in dict.fromkeys(others))
            raise self.unusable(
                node,
                ValueError(
                    f"ran at the same time as {beside}, each handed {handed} itself (a local "
                    "worker is handed the very objects), and it changed before "
                    f"`{node}`'s answer was taken: one of them wrote into it. What `{node}` "
                    "answered may be computed from it as written, or be it, and would be "
                    f"kept, and recalled, as computed from {handed} as it was handed in. Have "
                    "a node that writes into what it is handed work on a copy of it "
                    "(`sorted(x)`, `dict(x)`, `x.copy()`, `x.clone()`), or place one of them "
                    'on a `Worker.generic(mode="network")` worker, which is sent a copy'
                ),
            )

    def _written_into(self, node: str, before: list[str], handed: str, was: str) -> NodeFailed:
        """NodeFailed for keyed ``node``, handed ``handed`` after the nodes ``before``, one
        of which wrote into it as it ran, so that it is no longer ``was``."""
        named = ", ".join(f"`{n}`" for n in before)
        who = named if len(before) == 1 else f"one of {named}"
        return self.unusable(
            node,
            ValueError(
                f"is handed {handed} after {named}, and it is no longer {was}: {who} wrote "
                f"into it as it ran. What `{node}` computes from it would be kept, and "
                f"recalled, as computed from {was}. Have a node that writes into what it is "
                "handed work on a copy of it (`sorted(x)`, `dict(x)`, `x.copy()`, "
                f"`x.clone()`), or `{node}` read it before {named}"
            ),
        )

    def took_its_own(self, node: str) -> None:
        """What the settled node ``node`` set beside its weights as it ran (a count, a mask
        built at its first call) is its own state, not a change since it was settled
        (:meth:`~somatize_torch._settled.KeptWeightsWatch.took_its_own`), where it ran on
        the very object the graph holds: with no broker, or on a broker's local worker,
        which is handed it. A copy run on a network worker leaves the graph's as it was."""
        worker = self.graph.placement.worker_of(node)
        if worker is not None and self.broker is not None:
            placed = getattr(self.broker, "workers", {}).get(worker)
            if getattr(placed, "crosses", True):
                return
        watches = self.graph._settled_watches
        own = watches.get(node) if watches else None
        if getattr(own, "took_its_own", None) is None:
            return
        # Each settled node keeping a module it keeps too sees what its forward set there.
        for watch in watches.values():
            shares = getattr(watch, "shares_parts_with", None)
            if watch is own or (shares is not None and shares(own)):
                watch.took_its_own()  # type: ignore[attr-defined]

    def call(self, node: str, inputs: Sequence[Any], ctx: Context) -> Any:
        implementation = self.graph.node(node)
        worker = self.graph.placement.worker_of(node)
        # What an object its class holds, marked by which object it is, changes as the node
        # runs (a count, a cache) is its state, not a change to mark it anew for.
        own = own_state(self.graph._code_watch, implementation.implementing_classes())
        start = time.perf_counter_ns()
        try:
            if worker is not None and self.broker is not None:
                told: list[Fact] = []
                done = self.broker.called(self.graph, node, list(inputs), ctx, told.append)
                self.emit_crossed(node, told)
                value = done.value
                if done.moved:
                    self.moved.add(node)
            elif worker is not None:  # placed, run here: what it changes is its own
                with running_here(implementation), own:
                    value = implementation.forward(*inputs, ctx)
            else:
                with own:
                    value = implementation.forward(*inputs, ctx)
            if (worker is None or self.broker is None) and implementation.changed_as_it_ran():
                self.moved.add(node)  # a recall would not make the change: not kept
        except SomatizeError as error:
            self.emit({"fact": "failed", "node": node, "error": failed_as(error)})
            raise
        except Exception as error:
            self.emit({"fact": "failed", "node": node, "error": f"{type(error).__name__}"})
            raise node_failed(self.graph, node, implementation, error) from error
        except BaseException as error:  # KeyboardInterrupt, SystemExit: said, and let go
            self.emit({"fact": "failed", "node": node, "error": type(error).__name__})
            raise
        finally:  # what it set before it raised is its state as much
            self.took_its_own(node)
        took = (time.perf_counter_ns() - start) // 1000
        if _own_coroutine(implementation, value):
            value.close()  # never to be awaited: closed, so Python does not warn it was not
            raise self.unusable(
                node,
                TypeError(
                    "answered a coroutine of its own `async def forward`, which a decorator "
                    "hid when the graph was built: a graph calls a forward and hands on what "
                    "it returns, never awaiting it. Write `def forward(self, x, ctx)`; to "
                    "await inside it, run its own loop (`asyncio.run(...)`), or, where the "
                    "forward is called inside a running loop (a notebook, an async server), "
                    "call the forward through `asyncio.to_thread`"
                ),
            )
        if isinstance(value, Iterator) and self.readers(node) > 1:
            raise self.unusable(
                node,
                TypeError(
                    f"answered {_describe(value)}, an iterator, and {self.readers(node)} read "
                    "it (nodes below it, or the forward's caller): the first to read it would "
                    "leave the others nothing, and they would answer from that. Return a list "
                    "(`list(...)`) or a tuple"
                ),
            )
        return value, took

    def emit_crossed(self, node: str, facts: list[Fact]) -> None:
        """Emits ``facts``, what ``node``'s call on a worker crossed. Its answer came back
        once, and the broker puts its bytes on the edge to the first node reading it in the
        graph, which may not read it in this forward (its own answer recalled, or not
        needed): they are put on the edge to the first reader that runs, and on no edge
        where none does (the answer only handed back), as a figure draws them."""
        back = [fact for fact in facts if fact.get("way") == "back" and "from" in fact]
        running = self.running
        if running is not None and any(fact["node"] not in running for fact in back):
            size = sum(fact["bytes"] for fact in back)
            readers = [r for r in self.graph.successors(node) if r in running]
            edges = [{**back[0], "node": r, "bytes": 0} for r in readers]
            if edges:
                edges[0]["bytes"] = size
            else:
                edges = [{**back[0], "node": node, "bytes": size}]
                del edges[0]["from"]
            facts = [fact for fact in facts if all(fact is not b for b in back)] + edges
        for fact in facts:
            self.emit(fact)

    def readers(self, node: str) -> int:
        """How many read the answer of ``node``: an edge to each node below it (two from one
        node handed it twice) that runs, and each output this forward hands back that is
        it."""
        graph = self.graph
        below = set(graph._succs.get(node, ()))
        if self.running is not None:
            below &= self.running
        edges = sum(graph._preds[reader].count(node) for reader in below)
        return edges + self.wanted.count(node)

    def keep(self, node: str, key: str, value: Any, fingerprint: str | None) -> int | None:
        """Keeps the answer of ``node`` under ``key``, with the ``fingerprint`` of the code
        it depends on (:attr:`~somatize.plan.Static.fingerprint`); returns its bytes, or None
        where the code was changed as the forward ran (:meth:`code_moved`), or what the node
        declares as it ran (:attr:`moved`)."""
        store = self.store
        assert store is not None
        if node in self.moved or self.code_moved():
            return None
        with self._keeping(node):
            codec = CODECS.for_value(value, f"the answer of `{node}`")
            encoded = codec.encode(value)
            with reading(store):
                answer = store.keep(key, encoded, codec.name, fingerprint)
        return answer.size

    def code_moved(self) -> bool:
        """Whether a node's code was changed since this forward looked at it (a method set
        on its class from another thread, or by a node as it ran): an answer computed now
        may be the new code's, and kept with the fingerprint of the old it would be taken
        for the old code's, so it is not kept. One comparison of the classes' namespaces
        (:func:`~somatize.catalog.watch_code`), and the fingerprints worked out again only
        where they differ (a count a class moves as it runs leaves them as they were)."""
        graph = self.graph
        watch = graph._code_watch
        if watch.looks_same():
            return False
        memory = graph.memory
        return any(
            fingerprint_of(*node.implementing_classes()) != memory.fingerprint_of(name)
            for name, node in graph._nodes.items()
            if memory.fingerprint_of(name) is not None
        )

    @contextlib.contextmanager
    def _keeping(self, node: str) -> Iterator[None]:
        """Says ``failed`` of ``node`` when its answer, computed, cannot be kept (no codec
        writes it, the store refuses it), before the error goes on to the caller."""
        try:
            yield
        except SomatizeError:
            self.emit({"fact": "failed", "node": node, "error": "refused"})
            raise
        except BaseException as error:
            self.emit({"fact": "failed", "node": node, "error": type(error).__name__})
            raise

    def refuse_keeping(self, keeping: AbstractSet[str]) -> None:
        """Raises the error keeping an answer in the store would raise, when ``keeping``
        (cached nodes about to run) is not empty and the store can tell it now: the work
        is not done only to be lost."""
        if keeping and self.store is not None:
            with reading(self.store):
                refused = self.store._refused_keeping()
            if refused is not None:
                raise refused

    def run_mapped(
        self,
        plan: Plan,
        node: str,
        inputs: list[Any],
        ctx: Context,
        stacklevel: int = 4,
        shares: list[tuple[Any, Hashable, str]] | None = None,
    ) -> Any:
        """Runs the items of mapped ``node`` whose answers are not kept, recalls the rest,
        and says both (and drift, as :func:`somatize.engine._recalled` does: ``stacklevel``
        is where the caller's forward is, seen from here). ``shares``: what it shares with
        nodes running beside it on local workers (:meth:`hands_beside`), looked at again
        once its items answered, before any is kept (:meth:`answered_beside`)."""
        static = plan.static
        preds = static.preds[node]
        for index, value in enumerate(inputs):
            if not isinstance(value, (list, tuple)):
                what = f"what `{preds[index]}` answered" if preds else "the graph's input"
                raise self.unusable(
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
            raise self.unusable(
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
                    plan.have |= serially(self.store, self.store.have, items)
            else:
                items = plan.items[node]
        out: list[Any] = [None] * count
        missing = list(range(count))
        if items is not None:
            present = [key for key in items if key in plan.have]
            fingerprint = static.fingerprint.get(node)
            got = iter(
                self.read(node, present, fingerprint, count, plan.keys.get(node)) if present else ()
            )
            missing = []
            for index, key in enumerate(items):
                value = next(got) if key in plan.have else _DAMAGED
                if value is _DAMAGED:
                    missing.append(index)
                else:
                    out[index] = value
        recalled = count - len(missing)
        if recalled:  # said before the rest run: read is read, whether or not they fail
            self.emit({"fact": "recalled", "node": node, "items": recalled, "of": count})
        if missing:
            if keyed and node in static.late:  # the others were asked before any node ran
                with self._keeping(node):  # said `failed`, as a keep the store refuses is
                    self.refuse_keeping({node})
            called, alike = _first_of_each(missing, items)
            sub = [[value[i] for i in called] for value in inputs]
            ctx.keys = [items[i] for i in called] if items is not None else None
            answers, took = self.call(node, sub, ctx)
            if not isinstance(answers, (list, tuple)) or len(answers) != len(called):
                raise self.unusable(
                    node,
                    TypeError(
                        f"answered {_describe(answers)} for the {len(called)} items it was "
                        "handed: a mapped node returns a list as long as its input, item i "
                        "out from item i in"
                    ),
                )
            if shares is not None:
                self.answered_beside(plan, node, shares)
            self.emit(
                {"fact": "ran", "node": node, "took_us": took, "items": len(missing), "of": count}
            )
            for index, value in zip(called, answers, strict=True):
                out[index] = value
            if alike:
                with self._keeping(node):
                    for index, first in alike:
                        out[index] = _own_copy(out[first], f"an item answer of `{node}`")
            if items is not None:
                kept = self.keep_items(
                    node,
                    [(items[i], out[i]) for i in called],
                    static.fingerprint.get(node),
                )
                if kept is not None:
                    self.emit(
                        {
                            "fact": "kept",
                            "node": node,
                            "items": len(missing),
                            "of": count,
                            "bytes": kept,
                        }
                    )
        elif not count:  # no items: it runs, trivially, without being called
            self.emit({"fact": "ran", "node": node, "took_us": 0, "items": 0, "of": 0})
        if node in self.drift:
            self.drifted(node, plan.keys.get(node), stacklevel)
        return out

    def unusable(self, node: str, why: Exception) -> NodeFailed:
        """Says ``failed`` of ``node``, whose answer (or, mapped, what it was handed) cannot
        be used as it is (``why``: no list of its items; an iterator more than one reads),
        and returns the error to raise."""
        self.emit({"fact": "failed", "node": node, "error": type(why).__name__})
        return NodeFailed(node, self.graph.kind_of(node), why, raised=False)

    def keep_items(
        self, node: str, answers: list[tuple[str, Any]], fingerprint: str | None
    ) -> int | None:
        """Keeps a mapped node's item answers, grouped by codec, with the ``fingerprint`` of
        the code they depend on; returns the bytes kept, or None where the code was changed
        as the forward ran (:meth:`code_moved`), as :meth:`keep` does, or as they ran on
        their worker (:attr:`moved`)."""
        store = self.store
        assert store is not None
        if node in self.moved or self.code_moved():
            return None
        groups: dict[str, list[tuple[str, Sequence[Any]]]] = {}
        with self._keeping(node):
            for key, value in answers:
                codec = CODECS.for_value(value, f"an item answer of `{node}`")
                groups.setdefault(codec.name, []).append((key, codec.encode(value)))
            with reading(store):
                kept = [store.keep_many(items, name, fingerprint) for name, items in groups.items()]
            return sum(answer.size for answers in kept for answer in answers)

    def _item_column(self, plan: Plan, pred: str, count: int) -> list[str]:
        if pred in plan.items:
            return plan.items[pred]
        return [item_key(plan.keys[pred], i) for i in range(count)]


_DAMAGED = object()


@dataclasses.dataclass(frozen=True)
class _Unused:
    """Why an answer read back cannot be used: the fact that says so (``corrupt``,
    ``unreadable``) and what it says. Items of a mapped node unused alike (the items of one
    damaged pack) are said in one fact."""

    fact: str
    why: str


@dataclasses.dataclass(frozen=True)
class _Recompute:
    """An answer read back that ``strict`` computes again: it was kept with the code
    fingerprint ``was``, and the code it depends on is ``now``. Items of a mapped node kept
    by other versions of it, one or more, are said in one ``drifted`` fact, whose ``was`` is
    the first's."""

    was: str | None
    now: str


_NOTHING = object()
"""What an input held where a node put a value into what it was handed (a new key)."""


def _as_handed(x: Any, handed: Any) -> Any:
    """The input ``x`` as what its nodes were handed, ``handed``, holds now, to key again:
    ``x`` where they were handed it; else ``handed`` with each value in place of one of
    ``x``'s Opaques wrapped again — in that Opaque while it is still what it wraps, in a new
    one otherwise —, since a node may write into the lists and dicts made to hand it (pop
    from a dict), which ``x`` does not see. CodecError where no codec weighs what was put
    in place of an Opaque's value."""
    if handed is x:
        return x
    if type(x) is Opaque:
        return x if handed is x.value else Opaque(handed, x.codec)
    kind = type(handed)
    if kind is not type(x):  # put in place of what the input held there
        return handed
    if kind is dict:
        return {name: _as_handed(x.get(name, _NOTHING), item) for name, item in handed.items()}
    if kind is list or kind is tuple:
        count = len(x)
        again = [
            _as_handed(x[at] if at < count else _NOTHING, item) for at, item in enumerate(handed)
        ]
        return again if kind is list else tuple(again)
    return handed


def _first_of_each(
    missing: list[int], items: list[str] | None
) -> tuple[list[int], list[tuple[int, int]]]:
    """Of the places ``missing`` of a mapped node's items, those it is called on — the
    first of each item key, or all of them where its items have no keys — and each other
    place with the place of the item alike that is: one question, asked once."""
    if items is None:
        return missing, []
    first: dict[str, int] = {}
    called: list[int] = []
    alike: list[tuple[int, int]] = []
    for index in missing:
        at = first.setdefault(items[index], index)
        if at == index:
            called.append(index)
        else:
            alike.append((index, at))
    return called, alike


def _own_copy(value: Any, where: str) -> Any:
    """``value`` written by its codec and read back, as a recalled answer is: an object of
    its own, equal to it, for a place handed the answer of an item alike."""
    codec = CODECS.for_value(value, where)
    return codec.decode(memoryview(b"".join(codec.encode(value))))


def _mark_of(value: Any) -> Hashable:
    """What tells ``value`` unchanged, as its codec can say it: its stamp where the codec
    has one (a tensor's version counter, memory and layout; nothing to read for a value that
    cannot change), and otherwise what a recalled answer keeps: a canonical value's
    encoding as an answer is written (its dicts' order, a bytearray as one), hashed; any
    other's digest, with the order of the keys of each dict in it, which a digest leaves
    out (it sorts them). A dict sorted in place is not the answer its key recalls.
    CodecError where no codec weighs it."""
    codec = CODECS.for_value(value, "it", weighed=True)
    stamp = codec.stamp(value)
    if stamp is not None:
        return stamp
    if isinstance(codec, Plain):
        return digest_of(b"", parts_of(value, "it", exact=True))
    return codec.digest(value), _orders(value)


def _orders(value: Any) -> tuple[tuple[Any, ...], ...]:
    """The keys of each dict in ``value`` (itself, or in its lists, tuples and dicts, at any
    depth), each in its order, in the order they are met."""
    orders = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            orders.append(tuple(item))
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return tuple(orders)


def _copy_of(fact: Fact) -> Fact:
    """A copy of ``fact`` that shares nothing it could change with it. A fact's values are
    strings, numbers, booleans and None, or a list of node names (a ``drifted`` fact's
    ``changed``), copied too."""
    return {name: list(value) if isinstance(value, list) else value for name, value in fact.items()}


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


def _own_coroutine(implementation: Any, value: Any) -> bool:
    """Whether ``value`` is a coroutine of ``implementation``'s own forward, an `async def`
    under a decorator whose plain wrapper made it look like a plain forward. A coroutine
    the forward made of another function is an answer like any other, handed on."""
    if not inspect.iscoroutine(value):
        return False
    forward = inspect.unwrap(implementation.forward)
    return value.cr_code is getattr(forward, "__code__", None)


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a `{type(value).__name__}`"


def node_failed(graph: Graph, node: str, implementation: Any, error: Exception) -> NodeFailed:
    """The NodeFailed to raise for ``error``, raised running ``node`` (here or on a worker,
    which runs the same class: ``implementation``'s signature is read here); a TypeError
    says how a forward is called when the signature cannot take what the node is handed."""
    hint = ""
    if isinstance(error, TypeError):
        hint = called_wrongly(implementation, graph.predecessors(node))
    return NodeFailed(node, graph.kind_of(node), error, hint=hint)


def called_wrongly(implementation: Any, read: Sequence[str]) -> str:
    """How a node's forward is called, when its signature cannot take what the node is
    handed — one input per node it ``read`` (the graph's input when none), then a ctx — as
    a forward written without ``ctx``, or reading another count of inputs than the node is
    chained below, cannot; "" when it can, so the TypeError was raised inside it. A worker
    runs the same class, so its signature is read here."""
    count = len(read) or 1
    try:
        signature = inspect.signature(implementation.forward)
        signature.bind(*([None] * count), None)
    except TypeError:
        pass
    except ValueError:  # no signature to read (a builtin): nothing to say
        return ""
    else:
        return ""
    names = ["x"] if count == 1 else [f"x{i}" for i in range(1, count + 1)]
    whence = ", ".join(f"from `{one}`" for one in read) if read else "the graph's input"
    return (
        f"A node's forward is handed its {count} input{'s' if count != 1 else ''} "
        f"({whence}) and then ctx: `def forward(self, {', '.join(names)}, ctx)`"
    )
