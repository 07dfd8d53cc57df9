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
    {"fact": "unreadable", "node": "widest", "key": "blake3:…", "why": "…"}
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

A mapped node says ``items`` and ``of`` (the items the fact is about, and how many it
was handed) in each of its ``ran``, ``kept`` and ``recalled`` facts, and in each
``corrupt`` and ``unreadable`` fact: its items read back that cannot be used for one
reason (the blob of the pack holding them found damaged) are one fact, whose ``key`` is
the first of them — a damaged pack of 100,000 items is one fact, not 100,000. So with
``strict=True``: its items kept by other versions of the code, one or more, are one
``drifted`` fact saying ``recomputed``, ``items`` and ``of``, whose ``key`` is the node's
and whose ``was`` is the version the first of them was kept by, as the ``drifted`` fact
of its items recalled without ``strict`` is. Handed no items
it runs, trivially and without being called: ``ran`` with ``items`` 0. Handed
something that is no list, or answering a list of another length than it was handed,
it is ``failed``, and :class:`NodeFailed` says which.

An answer that was there when the store was asked but is damaged or gone when
read is a miss: it is reported (``corrupt``), the plan is redone without it,
and the node runs. So is an answer that is whole but cannot be read in this
process (:class:`~somatize.codecs.Unreadable`: a class it names is not loaded
here; or the codec it was kept by is not registered here, as a tensor read without
``import somatize.torch``, which its ``why`` says to import), reported as
``unreadable`` — nothing is damaged or set aside. Neither is said
``drifted`` where another version of the code kept it: nothing drifted was recalled.
A wrong answer is never returned. An answer computed that cannot be kept (no codec
writes it, the store refuses it) is ``failed`` after ``ran``, and its error
goes on to the caller. Where the store can tell before anything runs that it
would refuse it (a bucket that does not exist, a directory gone or read-only),
a forward that would keep an answer raises that error before any node runs,
rather than compute what it would lose.
A keyed node handed the graph's input after another node was has it keyed again first:
one that no longer keys as it did (the node before wrote into it as it ran, sorting a
list in place) has the keyed node ``failed``, with :class:`NodeFailed` saying why, rather
than compute from it what would be kept as the answer to the input handed in. So with a
node's answer that others read too (:attr:`~somatize.plan.Static.shared`): a keyed node
handed it after another node was has it checked unchanged since it was made or read back
— by its codec's stamp (a tensor's version counter), or digest — and is ``failed`` where
it changed (a node before wrote into it: ``x.add_(1)``). An answer no codec weighs (a
numpy array) is handed on unchecked, as is an answer one node reads, or what a recalled
node reads.
An answer computed while a node's code was changed (a method set on its class by
another thread as the forward ran) is not kept, and says no ``kept``: it may be the
new code's, and would be kept with the old code's fingerprint.

A ``watching`` callback that raises is not called again, and the forward goes on
without it: what runs is kept as usual, the record holds every fact, and the
forward then raises :class:`WatcherFailed`, naming the fact the callback raised
on, from the callback's error, with the forward's answer as its ``value``. A
watcher's error never costs an answer computed. If the forward fails of itself
after that, its own error is raised, with a note (Python 3.11 and later) saying
that the watcher had raised.

With a ``broker`` (:mod:`somatize.broker`) and a graph that places nodes, the
engine speaks to it in three calls: ``broker.check(graph)`` before anything runs
(an unknown worker, or a node its worker cannot rebuild, is refused there);
``broker.submit(graph, node, inputs, ctx, keep=...)`` for every placed node as
soon as its inputs are there, returning a future of a ``Done`` (``value``,
``took_us``, ``facts`` to emit, ``kept``: the bytes its worker kept when it kept
the answer itself); and ``broker.call(graph, node, inputs, ctx, emit)`` → the
value, for the items of a mapped node. The engine waits on whichever future it
needs next, so independent branches on different workers run at the same time,
and their facts come in the order things finish. A forward interrupted (Ctrl-C)
while submitted nodes still run hands their futures to ``broker.interrupted``,
which stops them (a Ray actor; a node on an embedded worker's thread). Without a
broker, or with no node placed, the loop is the plain one, in order.

This module holds the loops; its parts are what a forward tells its caller —
:class:`Record`, :class:`NodeFailed`, :class:`WatcherFailed`, :class:`Drifted` — in
:mod:`somatize._record`, and the state of one forward with the steps it takes on a
node (reading answers back, calling it, keeping its answer, running a mapped node's
items) in :mod:`somatize._run`.
"""

from __future__ import annotations

import _thread
import inspect
import operator
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from contextlib import suppress
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from somatize._record import Drifted, Fact, NodeFailed, Record, WatcherFailed, failed_as
from somatize._run import _describe, _Run, node_failed
from somatize.codecs import Opaque
from somatize.errors import SomatizeError
from somatize.node import Context, Node
from somatize.plan import Plan, compile, look_again, static_of
from somatize.store._serial import reading

if TYPE_CHECKING:
    from somatize.graph import Graph
    from somatize.store import Store

__all__ = ["Drifted", "NodeFailed", "Record", "WatcherFailed", "run"]


def _recalled(state: _Run, plan: Plan, node: str, stacklevel: int = 4) -> None:
    """Hands on a recalled answer, with its facts (and a warning if its code drifted)."""
    values = state.values
    static = plan.static
    values[node] = state.loaded[node]
    if node in static.mapped:
        count = len(values[node])
        state.emit({"fact": "recalled", "node": node, "items": count, "of": count})
    else:
        state.emit({"fact": "recalled", "node": node, "key": plan.keys[node]})
    if node in state.drift:
        state.drifted(node, plan.keys.get(node), stacklevel)


def _flow(state: _Run, plan: Plan, x: Any, value_of: Any, store: Store | None) -> None:
    """The forward's loop when a broker runs placed nodes: each node starts as soon as
    what it reads is there. A placed node is submitted to its worker (``broker.submit``)
    and the loop moves on, so independent branches on different workers run at the same
    time; nodes placed nowhere run here, in order; facts come as things finish."""
    graph = state.graph
    broker = state.broker
    static = plan.static
    running = plan.running
    recalled = plan.recalled
    values = state.values
    sharing = static.sharing
    placement = graph.placement
    waiting = list(static.order)
    done: set[str] = set()
    busy: dict[Future[Any], str] = {}
    # Workers handed the very objects (local ones): what runs there reads what is handed
    # beside it at the same time (`_Run.hands_beside`).
    workers = getattr(broker, "workers", None)
    local = frozenset(
        name for name, w in (workers or {}).items() if not getattr(w, "crosses", True)
    )
    cancel = True
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
                if not preds:
                    state.reads_input(plan, node, x, value_of)
                elif node in sharing:
                    state.reads_shared(plan, node)
                inputs = [values[p] for p in preds] if preds else [value_of]
                worker = placement.worker_of(node)
                ctx = Context(
                    name=node,
                    key=plan.keys.get(node),
                    worker=worker,
                    store=store,
                    precision=static.precision,
                )
                shares = None
                if local:
                    # One done and not taken yet counts: its answer may be what it was handed.
                    alongside = [n for n in busy.values() if n in state.beside]
                    there = worker in local and node not in static.mapped  # items: called here
                    shares = state.hands_beside(node, inputs, there, alongside)
                if node in static.mapped:
                    values[node] = state.run_mapped(plan, node, inputs, ctx, 5, shares)
                    continue
                if worker is not None:
                    # Not asked of a worker once code of the graph moved (a node it reads may
                    # have answered with the new code), as the client would not keep it.
                    keep = node in static.cached and store is not None and not state.code_moved()
                    busy[broker.submit(graph, node, inputs, ctx, keep=keep)] = node
                    done.discard(node)
                    continue
                value, took = state.call(node, inputs, ctx)
                if shares is not None:
                    state.answered_beside(plan, node, shares)
                _ran(state, plan, node, value, took, None)
            waiting = later
            if not busy:
                continue
            finished = wait_for(busy, FIRST_COMPLETED)
            # Each node that ended is said before one failure is raised: two ending
            # together, both failed, are two failed facts, the other's error noted.
            failures: list[BaseException] = []
            for future in finished:
                node = busy.pop(future)
                state.took_its_own(node)  # ended, failed or not
                try:
                    outcome = future.result()
                except SomatizeError as error:
                    state.emit({"fact": "failed", "node": node, "error": failed_as(error)})
                    failures.append(error)
                    continue
                except Exception as error:
                    state.emit({"fact": "failed", "node": node, "error": type(error).__name__})
                    failed = node_failed(graph, node, graph.node(node), error)
                    failed.__cause__ = error
                    failures.append(failed)
                    continue
                except BaseException as error:  # KeyboardInterrupt: said, and let go
                    state.emit({"fact": "failed", "node": node, "error": type(error).__name__})
                    failures.append(error)
                    continue
                state.emit_crossed(node, outcome.facts)
                if node in state.beside:
                    state.answered_beside(plan, node)
                _ran(state, plan, node, outcome.value, outcome.took_us, outcome.kept, outcome.moved)
                done.add(node)
            if failures:
                raise _first_of(failures)
    except BaseException as error:
        # Interrupted (Ctrl-C): the broker stops what runs on workers, where it can, before
        # anything else. Every Python instruction here is a place a second Ctrl-C can land,
        # so one that cuts the stopping short has it done again, rather than leave a node
        # running for nobody, holding its worker (and this process, which waits for it as
        # it exits); a Ctrl-C landing as a failure is handled stops them too.
        stop = error
        while True:
            try:
                if not isinstance(stop, Exception):  # even with none held: one landing as
                    interrupted = getattr(broker, "interrupted", None)  # submit returned left
                    if interrupted is not None:  # its call to the broker, which knows it
                        interrupted(list(busy))  # and those not started yet never start:
                        cancel = False  # nothing left to cancel, where a Ctrl-C could land
                break
            except KeyboardInterrupt as again:
                stop = again
        if busy and not isinstance(stop, Exception):
            for node in busy.values():  # as a node interrupted running here is said
                state.emit({"fact": "failed", "node": node, "error": type(stop).__name__})
        if stop is not error:
            raise stop from None
        raise
    finally:
        # Those not started never start. After an interrupt, the broker cancelled its own
        # calls as it stopped them; a future of another kind is cancelled here.
        for future in busy:
            if cancel or not isinstance(future, Call):
                future.cancel()


def _first_of(failures: list[BaseException]) -> BaseException:
    """The error to raise for nodes that failed together: an interrupt (Ctrl-C, which has
    the broker stop what still runs) before any error, else the first; the others are
    noted on it (where exceptions take notes: Python 3.11 and later)."""
    first = next((f for f in failures if not isinstance(f, Exception)), failures[0])
    if sys.version_info >= (3, 11):
        for other in failures:
            if other is not first:
                first.add_note(f"At the same time: {type(other).__name__}: {other}")
    return first


def wait_for(futures: Iterable[Future[Any]], return_when: str = ALL_COMPLETED) -> set[Future[Any]]:
    """The futures of ``futures`` that are done, once ``return_when`` says so (as
    :func:`concurrent.futures.wait`; a cancelled one is done). Futures that are all
    :class:`Call` are waited on without any lock a Ctrl-C could leave held (:class:`Call`).
    A Ctrl-C landing as Python's own waiting code puts itself back together can come out
    of it as another error (``RuntimeError: release unlocked lock``, raised while handling
    the KeyboardInterrupt): that KeyboardInterrupt is raised instead, so the forward
    waiting here is seen interrupted."""
    try:
        return _wait(list(futures), return_when)
    except Exception as error:
        cause: BaseException | None = error
        seen: set[int] = set()
        while cause is not None and id(cause) not in seen:
            if not isinstance(cause, Exception):
                raise cause from None
            seen.add(id(cause))
            cause = cause.__context__
        raise


def _wait(futures: list[Future[Any]], return_when: str) -> set[Future[Any]]:
    """:func:`wait_for`, unguarded."""
    calls = [future for future in futures if isinstance(future, Call)]
    if return_when not in (ALL_COMPLETED, FIRST_COMPLETED) or len(calls) != len(futures):
        return wait(futures, return_when=return_when)[0]
    woken = _Woken()
    try:
        for call in calls:
            with call._condition:
                call._waiters.append(woken)
        while True:
            done: set[Future[Any]] = {call for call in calls if call.done()}
            if len(done) == len(calls) or (done and return_when == FIRST_COMPLETED):
                return done
            # A signal that comes as the wait begins, before it blocks, does not end it: a
            # Ctrl-C then waits this long at most.
            with suppress(Empty):
                woken.settled.get(timeout=_LOOK_AGAIN_S)
    finally:
        for call in calls:
            with call._condition:
                if woken in call._waiters:
                    call._waiters.remove(woken)


_LOOK_AGAIN_S = 0.05
"""How long :func:`wait_for` waits for a call to settle before it looks again: a Ctrl-C
that comes as the wait begins, before it blocks, is only seen once it stops blocking."""


class _Guard(_thread.RLock):  # type: ignore[misc]  # subclassed as CPython allows
    """The condition of a :class:`Call`: a ``threading.Condition`` that is its own lock,
    so ``with`` takes it and lets it go in one C call each, with no Python instruction in
    between where a Ctrl-C could land."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: deque[Any] = deque()

    wait = threading.Condition.wait
    wait_for = threading.Condition.wait_for
    notify = threading.Condition.notify
    notify_all = threading.Condition.notify_all


class Call(Future[Any]):
    """The future of one call a broker runs on a worker's thread. A plain future's condition
    is a lock taken and let go in Python code (``threading.Condition.__enter__``), so a
    Ctrl-C landing there — as the interrupted forward unwinds, stops its nodes, or cancels
    what has not started — can leave it held by the main thread for good, and the worker's
    thread, settling the future, waits on it for ever (and this process for that thread as
    it exits). This one's is taken and let go in one C call each (:class:`_Guard`), and
    :func:`wait_for` waits on it with nothing but a queue whose ``put`` never waits."""

    _condition: Any
    _waiters: list[Any]

    def __init__(self) -> None:
        super().__init__()
        self._condition = _Guard()


class _Woken:
    """What :func:`wait_for` hangs on the futures it waits on (as
    :func:`concurrent.futures.wait` hangs its own): each settling future is put on a queue
    from the thread that settles it, in one C call that never waits."""

    def __init__(self) -> None:
        self.settled: SimpleQueue[Future[Any]] = SimpleQueue()

    def add_result(self, future: Future[Any]) -> None:
        self.settled.put(future)

    add_exception = add_cancelled = add_result


def _ran(
    state: _Run,
    plan: Plan,
    node: str,
    value: Any,
    took: int,
    kept: int | None,
    moved: bool = False,
) -> None:
    """Records the value of a node that ran, and keeps it if it is cached (unless its
    worker already did: ``kept`` is then the bytes it wrote; or its code was changed as it
    ran on its worker, ``moved``: the answer may be the new code's)."""
    state.values[node] = value
    state.emit({"fact": "ran", "node": node, "took_us": took})
    if node in plan.static.cached and state.store is not None and not moved:
        key = plan.keys[node]
        if kept is None:
            size = state.keep(node, key, value, plan.static.fingerprint.get(node))
            if size is not None:
                state.emit({"fact": "kept", "node": node, "key": key, "bytes": size})
        else:
            if key in state.unused:
                # Its worker kept it in place of the answer read back here, which this
                # process's store object remembers: read afresh, the next forward recalls it.
                with reading(state.store):
                    state.store.reread(key)
            worker = state.graph.placement.worker_of(node)
            state.emit({"fact": "kept", "node": node, "key": key, "bytes": kept, "by": worker})


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
    if not isinstance(strict, bool):
        raise TypeError(
            f"strict= is True (recompute what another version of the code kept) or False "
            f"(recall it and warn), got {_describe(strict)}"
        )
    state = _Run(graph, store, watching, broker, strict)
    try:
        wanted = state.wanted = _wanted(graph, outputs, watching, broker)
        with graph._looking:
            # What this forward keys by is what it looked at: another thread's forward of
            # the graph may take a node's declaration again meanwhile (a module it calls in
            # another precision), and keys made from both would name what neither runs.
            look_again(graph)
            static = static_of(graph) if store is not None else None
        if broker is not None:
            broker.check(graph)
        plan = compile(graph, x, store, wanted, static)
        if store is not None:
            while not state.load(plan):
                plan.walk(wanted)
        static = plan.static
        running = state.running = plan.running
        # A late mapped node's items are keyed only once what it reads has answered: it
        # is asked then, before it runs (`_Run.run_mapped`).
        state.refuse_keeping(running & static.cached - static.late)
        value_of = _opened(x)
        state.input = (x, value_of, plan.root)
        recalled = plan.recalled
        values = state.values
        placement = graph.placement
        if broker is not None and len(placement):
            _flow(state, plan, x, value_of, store)
        else:
            sharing = static.sharing
            for node in static.order:
                if node in recalled:
                    _recalled(state, plan, node)
                    continue
                if node not in running:
                    state.emit({"fact": "spared", "node": node})
                    continue
                preds = static.preds[node]
                if not preds:
                    state.reads_input(plan, node, x, value_of)
                elif node in sharing:
                    state.reads_shared(plan, node)
                inputs = [values[p] for p in preds] if preds else [value_of]
                # No worker runs it: with no broker `.at()` is ignored, and it runs here.
                ctx = Context(
                    name=node, key=plan.keys.get(node), store=store, precision=static.precision
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
                    if size is not None:
                        state.emit({"fact": "kept", "node": node, "key": key, "bytes": size})
        state.emit({"fact": "finished", "took_us": (time.perf_counter_ns() - start) // 1000})
    except BaseException as failure:
        state.watcher_noted(failure)
        raise
    finally:
        # The record of the forward that ended last, as it ends: one a node's forward started
        # on this graph (re-entering it), or another thread's, may end before this one.
        graph.record = state.record

    # A name alone, or a graph's one output, is its value; names in a list or tuple are a
    # tuple as long, one name too, so a caller pairing names with values pairs them right.
    alone = isinstance(outputs, str) or (outputs is None and len(wanted) == 1)
    value = values[wanted[0]] if alone else tuple(values[name] for name in wanted)
    state.watcher_said(value)
    return value


def _wanted(
    graph: Graph, outputs: str | Sequence[str] | None, watching: Any, broker: Any
) -> tuple[str, ...]:
    """The nodes whose answers a forward returns, once its arguments are checked."""
    if watching is not None and not callable(watching):
        raise TypeError(
            f"watching= takes a function called with each fact (`facts.append`, `print`), "
            f"got {_describe(watching)}"
        )
    if watching is not None and (
        inspect.iscoroutinefunction(watching)
        or inspect.iscoroutinefunction(type(watching).__call__)
    ):
        named = getattr(watching, "__qualname__", type(watching).__qualname__)
        raise TypeError(
            "watching= takes a function called with each fact, as the forward goes; an "
            f"`async def` one (`{named}`) would only be made a coroutine that "
            "nothing awaits: pass a plain function (one that puts each fact on a queue an "
            "event loop reads, `loop.call_soon_threadsafe(queue.put_nowait, fact)`)"
        )
    if broker is not None and (
        isinstance(broker, type) or not callable(getattr(broker, "check", None))
    ):
        raise TypeError(
            "broker= takes a somatize Broker (`Broker.embedded({...})`, `Broker.ray(...)`), "
            + (
                f"got the class `{broker.__name__}` itself: make one"
                if isinstance(broker, type)
                else f"got {_describe(broker)}"
            )
        )
    if outputs is None:
        return graph.outputs
    if isinstance(outputs, str):
        return (graph.resolve(outputs),)
    if isinstance(outputs, _NOT_NAMES) or not isinstance(outputs, Iterable):
        raise _not_outputs(outputs)
    names = tuple(outputs)  # a list, a tuple, `ordered.keys()`: names in an order
    for name in names:
        if not isinstance(name, str):
            raise _not_outputs(name)
    return tuple(graph.resolve(name) for name in names)


_NOT_NAMES = (Node, bytes, bytearray, memoryview, set, frozenset)
"""What ``outputs=`` is refused as, though it can be gone over: a node, bytes (its items
are numbers), and a set, whose order is not its caller's."""


def _not_outputs(what: Any) -> TypeError:
    """The error for ``outputs=`` (or one of its names) being ``what``: it takes a node's
    name, or names in a list or tuple, whose order is that of the values handed back."""
    takes = (
        "outputs= takes a node's name (`'scale'`) or a list or tuple of names, and hands "
        "back their values in that order"
    )
    if isinstance(what, Node):
        name = what._smz.name
        said = f"`{name}` ({type(what).__qualname__})" if name else f"a `{type(what).__qualname__}`"
        named = f"its name, `{name!r}`" if name else "its name (`g.nodes()` lists them)"
        return TypeError(f"{takes}; got the node {said} itself: pass {named}")
    if isinstance(what, (set, frozenset)):
        return TypeError(
            f"{takes}; a `{type(what).__name__}` has no order of its caller's, so the values "
            "would come back in one nobody chose: pass a list or a tuple"
        )
    return TypeError(f"{takes}; got {_describe(what)}")
