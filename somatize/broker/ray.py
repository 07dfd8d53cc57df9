"""The Ray broker: each worker is a Ray actor, for when one machine is not enough.

An actor is started per worker name the first time a node placed there runs,
with the resources the :class:`~somatize.broker.Worker` asks for (CPUs, GPUs,
custom resources), and it keeps the nodes it rebuilt — and whatever weights they
loaded — between forwards. What crosses is what a network worker sends in one
process: the node's blueprint, its context, and its inputs as codec bytes — a
large one put into Ray's object store once (a retry sends the same object again,
not a new copy), a small one inside the call; the answer comes back the same way.
Nothing a user wrote is pickled: only plain fields and bytes cross.

A frozen node that holds state (weights) is loaded on its actor once per state
(:mod:`somatize.broker.host`): the first job names the state's digest, the actor
answers that it lacks it, and the client puts the state's bytes into the object
store (``ray.put``) and sends the job again with them; from then on the actor
holds the node loaded and jobs carry only the digest. A retry on a fresh actor
hands it the same object.

The store is shared: a job names the forward's store by its address — a bucket's
URL and storage options, or a local directory when the cluster is one machine —
and the actor opens it there and keeps the answer of a cached node it ran itself,
so a second forward from any client recalls what any worker kept. A signed store
is opened only by an actor whose own ``$SOMATIZE_STORE_KEY`` is the store's key
(the key never crosses; its fingerprint does). With a store an actor cannot open
— no address (a live filesystem object in its options, a ``memory://`` bucket),
no matching key, a bucket it cannot reach — the client keeps what comes back; the
answer is the same.

A worker that dies while it runs a node (killed, out of memory, its machine
gone) is reported as :class:`~somatize.broker.WorkerLost`, naming the node and
the worker; nothing was kept for that node, and the next call starts the worker
afresh — at once, ``retries`` times, when the broker is told to. A call that
takes longer than ``timeout_s`` stops its worker the same way.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import blake3

from somatize import keys as keying
from somatize._precision import Precision, keyed_in_precision, precision_now
from somatize.catalog import Blueprint, Catalog, Unbuildable
from somatize.codecs import CodecError
from somatize.errors import SomatizeError, _rebuilt
from somatize.node import Context

from .base import (
    Broker,
    BrokerClosed,
    Done,
    FailedOnWorker,
    NoRay,
    OtherCluster,
    StateMismatch,
    UnknownWorker,
    WorkerLost,
    WorkerTimeout,
    _check_timeout,
    _seconds,
)
from .host import (
    Host,
    Job,
    NeedState,
    Reply,
    crossings,
    held_state,
    job_for,
    state_for,
    unpacker,
)
from .worker import BadWorker, Worker

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["RayBroker"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal colour code, as Ray's messages hold them."""

_T = TypeVar("_T")

_INLINE = 100_000
"""Inputs up to this many bytes travel inside the call; larger ones are put into the
object store once, so a retry does not send them again."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise NoRay(
            "Broker.ray runs workers on a Ray cluster, and Ray is not installed here: "
            "`pip install 'somatize[ray]'` (or `pip install 'ray>=2.9'`), or use "
            "`Broker.embedded(...)` to run the workers in this process"
        ) from None
    return ray


@dataclass(frozen=True)
class _Failure:
    """What a job raised inside an actor, by kind, type name and message."""

    kind: str
    """``codec``, ``unbuildable``, ``state``, ``own`` (another error class of somatize's
    own, named by :attr:`home`) or ``forward``."""
    raised: str
    message: str
    home: str = ""
    """For ``own``: the error's class as ``module:qualname``."""
    attributes: tuple[tuple[str, Any], ...] = ()
    """For ``own``: the error's attributes, every one plain (:func:`_plain`)."""


_OWN = ("somatize", "somatize_torch")
"""The packages whose error classes a failure on a worker is rebuilt as (:func:`_own`)."""

_PLAIN = (str, int, float, bool, type(None))


def _plain(value: object) -> bool:
    """Whether ``value`` crosses as plain fields: a str, number, bool or None, or a list or
    tuple of them (the notes of an error, ``__notes__``)."""
    if isinstance(value, (list, tuple)):
        return type(value) in (list, tuple) and all(type(item) in _PLAIN for item in value)
    return type(value) in _PLAIN


def _own(error: SomatizeError) -> _Failure | None:
    """``error``, an error of somatize's own class raised by a node on an actor, as a failure
    that names its class, message and attributes; None for a class of anyone else's (a
    node's own subclass), or an error holding what is not plain (WatcherFailed's
    ``value``), which is named and not rebuilt without it."""
    kind = type(error)
    if kind.__module__.split(".")[0] not in _OWN:
        return None
    attributes = tuple(vars(error).items())
    if not all(_plain(value) for _, value in attributes):
        return None
    home = f"{kind.__module__}:{kind.__qualname__}"
    return _Failure("own", kind.__name__, _message(error), home, attributes)


def _rebuilt_own(failure: _Failure) -> SomatizeError | None:
    """The error of somatize's own class that ``failure`` names, with its message and
    attributes — made here from those plain fields, nothing unpickled — or None when this
    process finds no such class in somatize."""
    module, _, qualname = failure.home.partition(":")
    if module.split(".")[0] not in _OWN:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    if not isinstance(found, type) or not issubclass(found, SomatizeError):
        return None
    error = _rebuilt(found, failure.message, dict(failure.attributes))
    assert isinstance(error, SomatizeError)
    return error


def _message(error: BaseException) -> str:
    """What ``error`` says; a note that it could not be read when its ``str()`` raises, so
    the client still learns what was raised and where."""
    try:
        return str(error)
    except Exception as unreadable:
        return f"(its message could not be read: str() of it raised {type(unreadable).__name__})"


def _guarded(work: Callable[[], _T]) -> _T | _Failure:
    """What ``work``, run on an actor, answers; what it raised as a :class:`_Failure`, by
    kind, type name and message — never the exception itself, which Ray would pickle
    back for the client to unpickle (:func:`_raised` raises it there again)."""
    try:
        return work()
    except CodecError as why:
        return _Failure("codec", type(why).__name__, _message(why))
    except Unbuildable as why:
        return _Failure("unbuildable", type(why).__name__, _message(why))
    except StateMismatch as why:
        return _Failure("state", type(why).__name__, _message(why))
    except SomatizeError as why:  # the node's own code raised one: rebuilt as itself
        own = _own(why)
        return own if own is not None else _Failure("forward", type(why).__name__, _message(why))
    except SystemExit:
        # The node, or Ray stopping the actor (`ray.actor.exit_actor()`), ends the
        # process, as it would end the client's: the worker is lost, and started afresh.
        raise
    except BaseException as why:
        if isinstance(why, _ray().exceptions.AsyncioActorExit):
            raise  # Ray's own signal to stop the actor
        # Named, never carried: what the node raised (a KeyboardInterrupt, a class of
        # its own) is not pickled back for the client to unpickle.
        return _Failure("forward", type(why).__name__, _message(why))


def _raised(graph: Graph, node: str, worker: str, failure: _Failure) -> Exception:
    """The error to raise here for ``failure``, what ``node`` raised on ``worker``."""
    if failure.kind == "codec":
        return CodecError(failure.message)
    if failure.kind == "unbuildable":
        return Unbuildable(failure.message)
    if failure.kind == "state":
        return StateMismatch(failure.message)
    if failure.kind == "own":
        own = _rebuilt_own(failure)
        if own is not None:
            return own
    return FailedOnWorker(node, graph.kind_of(node), worker, failure.raised, failure.message)


def _directories(import_paths: object) -> list[str]:
    """``import_paths`` as the directories (str) the actors put on their ``sys.path``: each
    a str or an :class:`os.PathLike` (a :class:`~pathlib.Path`), taken as
    :func:`os.fspath` gives it; anything else is refused, one string alone too, which
    would put each of its letters on their path."""
    paths = (
        [os.fspath(path) if isinstance(path, os.PathLike) else path for path in import_paths]
        if isinstance(import_paths, Sequence) and not isinstance(import_paths, (str, bytes))
        else None
    )
    if paths is None or not all(isinstance(path, str) for path in paths):
        raise TypeError(
            "import_paths is a list of directories (str or os.PathLike, such as a "
            "pathlib.Path) the actors import node modules from, e.g. "
            f'`import_paths=["/srv/project/src"]`; got {import_paths!r}'
        )
    return paths


class _Actor:
    """The body of a worker's Ray actor: a :class:`Host` and a place to run it. Ray runs its
    methods one after another (it is started with no ``max_concurrency``), so its host runs
    apart: one job at a time in the actor's process, whose settings it enters for each."""

    def __init__(self, worker: str, import_paths: Sequence[str]) -> None:
        # First, in their order, ahead of what the process was started with: Ray puts the
        # directory the client was started from first, which the client may not import from.
        sys.path[:] = [*import_paths, *(path for path in sys.path if path not in import_paths)]
        self.host = Host(worker, Catalog(), apart=True)

    def run(self, job: Job, state: bytes | None, *payloads: bytes) -> Reply | NeedState | _Failure:
        return _guarded(lambda: self.host.run(job, payloads, state=state))

    def key_of(
        self,
        name: str,
        blueprint: bytes,
        state: str | None,
        salt: str | None,
        mapped: bool,
        inputs: list[str],
        precision: Precision | None,
        held: str | None,
        data: bytes | None,
    ) -> str | NeedState | _Failure:
        """The key of the node rebuilt here, called in ``precision`` (None: the default);
        for one that holds state (``held``, its digest), from the state loaded here and the
        digest worked out from it. What rebuilding it raises comes back as :meth:`run`'s
        does, named (:func:`_guarded`)."""

        def work() -> str | NeedState:
            node = self.host.node(blueprint, held, data, name=name)
            if node is None:
                assert held is not None
                return NeedState(held)
            key_state = node._smz.state if held is not None else state
            identity = Blueprint.from_bytes(blueprint).identity
            declaration = node.declaration()
            prefix = keying.node_prefix(identity, declaration, key_state, salt, mapped=mapped)
            if precision is not None and keyed_in_precision(node):
                prefix = keying.in_precision(prefix, precision)
            return keying.node_key(prefix, inputs)

        return _guarded(work)

    def pid(self) -> int:
        return os.getpid()

    def version(self) -> str:
        """The version of somatize this actor imported, which reads the jobs it is sent,
        and the digest of its source files (:func:`_version`)."""
        return _version()


class RayBroker(Broker):
    """Workers as Ray actors; see the module docstring."""

    _made_as = 'Broker.ray(workers={"w1": Worker.generic(mode="network")})'

    def __init__(
        self,
        address: str | None,
        workers: Mapping[str, Worker],
        *,
        retries: int = 0,
        timeout_s: float | None = None,
        start_timeout_s: float = 120.0,
        import_paths: Sequence[str | os.PathLike[str]] | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(address, Mapping):
            raise TypeError(
                "Broker.ray takes the cluster's address first and the workers second: "
                'Broker.ray(workers={...}) — e.g. `Broker.ray(workers={"w1": '
                'Worker.generic(mode="network")})` — or `Broker.ray(address, {...})`'
            )
        if address is not None and not isinstance(address, str):
            raise TypeError(
                f'address is the Ray cluster\'s address, a str (`"auto"`, `"host:port"`, '
                f'`"ray://host:10001"`), or None for the one this process is connected to '
                f"or a new one on this machine; got {address!r}"
            )
        directories = None if import_paths is None else _directories(import_paths)
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise TypeError(
                "runtime_env is Ray's runtime environment, a dict (e.g. "
                f'`{{"working_dir": "."}}`), or None; got {runtime_env!r}'
            )
        super().__init__(workers)
        for name, worker in self.workers.items():
            if not worker.crosses:
                raise BadWorker(
                    f'worker `{name}` is `mode="local"`, and a Ray actor is another process: '
                    'values always cross it through their codecs. Describe it with `mode="network"`'
                )
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries is a count ≥ 0, got {retries!r}")
        _check_timeout(timeout_s)
        if not _seconds(start_timeout_s):
            raise ValueError(f"start_timeout_s is a number of seconds > 0, got {start_timeout_s!r}")
        ray = _ray()
        if not ray.is_initialized():
            _refuse_unanswered(address)
            ray.init(address=address)
        elif address is not None:
            connected = _connected_elsewhere(ray, address)
            if connected is not None:
                raise OtherCluster(
                    f"Broker.ray was given the address {address!r}, and this process is already "
                    f"connected to the Ray cluster at {connected} (ray.init was called before), "
                    f"which is not the cluster {address!r} names: a process is connected to one "
                    "cluster at a time, so the workers would run there instead. To run them on "
                    f"{address!r}, call `ray.shutdown()` first; to run them on {connected}, "
                    "call `Broker.ray(workers={...})` without an address"
                )
        self.retries = retries
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        if directories is None:  # where this process imports from, in its order
            here = [p or os.getcwd() for p in sys.path]
            directories = [p for p in dict.fromkeys(here) if os.path.isdir(p)]
        self.import_paths = directories
        self.runtime_env = runtime_env
        self._remote = ray.remote(_Actor)
        self._actors: dict[str, Any] = {}
        self._started: set[Any] = set()
        self._stopped: set[Any] = set()
        """Actors stopped because the forward waiting on them was interrupted: a call on
        one is not tried again."""
        self._closes = 0
        """How many times the broker was closed: a call made before a close starts no actor."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Refused, by name: a copy in another process would connect to a cluster of that
        process's choosing, with actors of its own."""
        raise TypeError(
            "a Ray broker cannot be copied or sent to another process (pickled, as a "
            "DataLoader hands its spawned workers a dataset that holds one): its actors are "
            "this process's, on the cluster it is connected to. Make one in that process "
            "with `Broker.ray(...)`"
        )

    def _known(self, worker: str, asked: str) -> None:
        """Refuses a name ``worker`` the broker has no worker of, naming those it has."""
        if worker not in self.workers:
            known = ", ".join(f"`{name}`" for name in self.workers)
            raise UnknownWorker(
                f"this broker has no worker `{worker}`; it has {known}: ask one of those {asked}"
            )

    def actor(self, worker: str, closes: int | None = None) -> Any:
        """The Ray actor that is ``worker``, started if it is not running. With ``closes``
        (how many times the broker was closed when a call was made), None when the broker
        has been closed since: a call the close failed starts no actor. A worker the
        broker lacks is refused (:class:`UnknownWorker`), naming those it has."""
        self._known(worker, "for its actor")
        with self._lock:
            if closes is not None and closes != self._closes:
                return None
            found = self._actors.get(worker)
            if found is None:
                spec = self.workers[worker]
                options: dict[str, Any] = {}
                if spec.num_cpus is not None:
                    options["num_cpus"] = spec.num_cpus
                if spec.num_gpus is not None:
                    options["num_gpus"] = spec.num_gpus
                if spec.resources:
                    options["resources"] = dict(spec.resources)
                if self.runtime_env is not None:
                    options["runtime_env"] = self.runtime_env
                try:
                    found = self._remote.options(**options).remote(worker, self.import_paths)
                except Exception as why:  # Ray refused what the worker asks for
                    raise BadWorker(
                        f"worker `{worker}` could not be started on the Ray cluster: Ray "
                        f"refused it ({type(why).__name__}: {_message(why)}), so nothing ran "
                        "there and nothing was kept. Check `runtime_env=` on the broker and "
                        "what the worker asks for (num_cpus, num_gpus, resources)"
                    ) from None
                self._actors[worker] = found
            return found

    def key_on(self, worker: str, graph: Graph, node: str, inputs: list[str]) -> str:
        """The key of ``node`` reading inputs keyed ``inputs`` (for a mapped node, an item's
        keys, and the key is that item's), as computed on ``worker`` from the node it
        rebuilt there, in the precision a forward called from this thread now is keyed in:
        the same as the client's, or keys would not meet. A worker the
        broker lacks, a node the graph lacks or that no network worker rebuilds, and inputs
        other than one key per input the node reads are refused before anything is sent.
        Asked as a node's call is: of a worker running this somatize (BadWorker otherwise),
        within the broker's timeouts (WorkerTimeout otherwise, the actor stopped), on a
        worker that lives to answer (WorkerLost otherwise, after ``retries`` fresh ones),
        of a broker not closed meanwhile (BrokerClosed otherwise, no actor started again)."""
        ray = _ray()
        self._known(worker, "for the key of a node")
        node = graph.resolve(node)
        self.check(graph)
        if node not in self._checked[graph][1]:
            raise ValueError(
                f"`{node}` is placed on no network worker of this broker, so no worker rebuilds "
                "it: key_on asks a worker for the key of a node it rebuilds, one placed with "
                '`.at(name)` on a `Worker.generic(mode="network")` worker'
            )
        count = max(len(graph.predecessors(node)), 1)
        listed = isinstance(inputs, (list, tuple)) and all(isinstance(k, str) for k in inputs)
        if not listed or len(inputs) != count:
            many = "" if count == 1 else "s"
            wrong = ValueError if listed else TypeError
            raise wrong(
                f"`{node}` reads {count} input{many}, so key_on takes a list of {count} "
                f"key{many} (str), one per input in the order it reads them (the graph's "
                f"input's, for a node that reads no other); got {inputs!r}"
            )
        memory = graph.memory
        blueprint = self._blueprint(graph, node).to_bytes()
        salt, mapped = memory.salt_of(node), memory.is_mapped(node)
        # In the precision this thread calls a forward in, which the node's key names.
        asked = (node, blueprint, memory.state_of(node), salt, mapped, inputs, precision_now())
        held = held_state(graph, node)
        state: Any = None
        cause = ""
        with self._lock:
            closes = self._closes
        for _ in range(self.retries + 1):
            actor = self.actor(worker, closes)
            if actor is None:
                raise BrokerClosed(node, worker)
            try:
                self._check_started(node, worker, actor)
                key = self._answer(node, worker, actor, actor.key_of.remote(*asked, held, state))
                if isinstance(key, NeedState):
                    if state is None:
                        state = ray.put(state_for(graph.node(node)))
                    key = self._answer(
                        node, worker, actor, actor.key_of.remote(*asked, held, state)
                    )
                if isinstance(key, _Failure):
                    raise _raised(graph, node, worker, key)
                return str(key)
            except ray.exceptions.RayActorError as error:
                cause = self._lost(node, worker, actor, error)
        if closes != self._closes:
            raise BrokerClosed(node, worker)
        raise WorkerLost(node, worker, self.retries + 1, cause)

    def _lost(self, node: str, worker: str, actor: Any, error: Any) -> str:
        """Lets go of ``worker``'s ``actor``, which died (``error``, Ray's) while it was
        asked about ``node``, so the next call starts it afresh; raises BadWorker when it
        never started (a retry would fail so), else answers the cause to report."""
        ray = _ray()
        # One only out of reach for now (ActorUnavailableError) may come back, and would
        # hold its resources with nobody calling it: stopped, not just forgotten.
        unreachable = isinstance(error, ray.exceptions.ActorUnavailableError)
        self._forget(worker, actor, kill=unreachable)
        if getattr(error, "actor_init_failed", False):  # never started: a retry fails so
            raise _unstartable(node, worker, error) from None
        return type(error).__name__

    def _check_started(self, node: str, worker: str, actor: Any) -> None:
        """Asks ``worker``'s actor, before it is first sent anything about ``node``, which
        somatize it runs: WorkerTimeout if it does not answer within ``start_timeout_s``
        (it never started), BadWorker if it runs another (it would read what it is sent
        with other code); the actor is stopped either way."""
        if actor in self._started:
            return
        ray = _ray()
        try:
            there = ray.get(actor.version.remote(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._forget(worker, actor, kill=True)
            raise WorkerTimeout(node, worker, self.start_timeout_s, starting=True) from None
        if not _same_somatize(there):
            self._forget(worker, actor, kill=True)
            raise _other_version(node, worker, there)
        self._started.add(actor)

    def _answer(self, node: str, worker: str, actor: Any, call: Any) -> Any:
        """What ``call``, made of ``worker``'s actor about ``node``, answers within the
        broker's ``timeout_s``; past it the actor is stopped (the next call starts it
        afresh) and WorkerTimeout raised."""
        ray = _ray()
        try:
            return ray.get(call, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._forget(worker, actor, kill=True)
            assert self.timeout_s is not None
            raise WorkerTimeout(node, worker, self.timeout_s) from None

    def close(self) -> None:
        """Stops every actor and lets the workers go; a later call starts them again."""
        ray = _ray()
        with self._lock:
            actors, self._actors = self._actors, {}
            self._started.clear()
            self._closes += 1
        super().close()
        for actor in actors.values():
            ray.kill(actor)

    def interrupted(self, futures: Iterable[Future[Done]]) -> None:
        """Stops the actors that run the calls of ``futures`` still running, as a timeout
        does: nothing is kept for their nodes, and the next call starts them afresh. So are
        those of the calls the interrupted thread submitted and does not hold yet
        (interrupted as ``submit`` returned), as :meth:`Broker.interrupted` says; a call
        not started yet never starts, and one whose actor is still being started, or not
        sent yet, is not sent (:meth:`_run`)."""
        with self._lock:
            stopping = self._stopping(futures)
            self._halted.update(f for f in stopping if not f.done())
            running = [f for f in stopping if f.running() and f in self._pending]
            workers = {self._pending[f][1] for f in running}
            actors = [(w, self._actors[w]) for w in workers if w in self._actors]
            self._stopped.update(actor for _, actor in actors)
        for future in stopping:
            future.cancel()
        for worker, actor in actors:
            self._forget(worker, actor, kill=True)

    def _forget(self, worker: str, actor: Any, *, kill: bool) -> None:
        with self._lock:
            if self._actors.get(worker) is actor:
                del self._actors[worker]
            self._started.discard(actor)
        if kill:
            _ray().kill(actor)

    def _send(
        self, graph: Graph, node: str, worker: str, inputs: list[Any], ctx: Context, keep: bool
    ) -> Callable[[], Done]:
        ray = _ray()
        blueprint = self._blueprint(graph, node)
        job, sent = job_for(
            graph, node, worker, blueprint, inputs, ctx, keep=keep, holder=self._holder(graph)
        )
        payloads = [ray.put(data) if len(data) > _INLINE else data for data in sent]
        with self._lock:
            closes = self._closes
        unpack = unpacker(node, worker)  # in the caller's inference mode, read on its thread

        def run() -> Done:
            start = time.perf_counter_ns()
            reply = self._run(graph, node, worker, job, payloads, closes)
            value = unpack(reply.codec, reply.data)
            sizes = [len(data) for data in sent]
            facts = crossings(graph, node, worker, sizes, len(reply.data), reply.carried)
            took = (time.perf_counter_ns() - start) // 1000
            return Done(value, took, facts, reply.kept, reply.moved)

        return run

    def _run(
        self, graph: Graph, node: str, worker: str, job: Job, payloads: list[Any], closes: int
    ) -> _Carried:
        """Runs ``job`` on ``worker``'s actor, trying again on a fresh one ``retries`` times
        when it dies — unless the broker was closed since the call was made."""
        ray = _ray()
        reply: Reply | NeedState | _Failure | None = None
        state: Any = None
        carried = 0
        cause = ""
        call = getattr(self._here, "future", None)
        for _ in range(self.retries + 1):
            actor = self.actor(worker, closes)
            if actor is None:
                raise BrokerClosed(node, worker)
            with self._lock:  # after the actor is known: one interrupted from here stops it
                halted = call in self._halted
            if halted:
                raise WorkerLost(node, worker, 1, "stopped: its forward was interrupted")
            try:
                self._check_started(node, worker, actor)
                first = self._answer(node, worker, actor, actor.run.remote(job, state, *payloads))
                if isinstance(first, NeedState):
                    if state is None:
                        data = state_for(graph.node(node))
                        state, carried = ray.put(data), len(data)
                    # set only once it comes back: an actor that dies loading the state
                    # leaves no reply, and is lost as one dying on its first call is
                    first = self._answer(
                        node, worker, actor, actor.run.remote(job, state, *payloads)
                    )
                reply = first
                break
            except ray.exceptions.RayActorError as error:
                if actor in self._stopped:  # the forward waiting on it was interrupted
                    self._stopped.discard(actor)
                    raise WorkerLost(
                        node, worker, 1, "stopped: its forward was interrupted"
                    ) from None
                cause = self._lost(node, worker, actor, error)
        if reply is None:
            if closes != self._closes:
                raise BrokerClosed(node, worker)
            raise WorkerLost(node, worker, self.retries + 1, cause)
        if isinstance(reply, _Failure):
            raise _raised(graph, node, worker, reply)
        assert not isinstance(reply, NeedState), "a worker handed the state asked for it again"
        return _Carried(reply.codec, reply.data, reply.kept, carried, reply.moved)


def _version() -> str:
    """The version of somatize imported here and the digest of its source files
    (:func:`_source`), as ``"<version> <digest>"``: a worker running the same version
    edited is told apart from one running it as released."""
    import somatize

    return f"{somatize.__version__} {_source()}"


def _versions(there: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The version and source digest a worker's :func:`_version` says (``there``), and
    this process's: one reading of the string both sides write."""
    version, _, source = there.partition(" ")
    mine, _, my_source = _version().partition(" ")
    return (version, source), (mine, my_source)


def _same_somatize(there: str) -> bool:
    """Whether a worker whose :func:`_version` is ``there`` runs the somatize this process
    does: the same version, from the same source files — where both could read theirs (an
    installation shipped without its ``.py`` files is told apart by its version alone)."""
    (version, source), (mine, my_source) = _versions(there)
    unread = _UNREAD in (source, my_source)
    return version == mine and (source == my_source or unread)


_UNREAD = "unread"
"""What :func:`_source` answers where somatize's source files are not there to read."""


@functools.cache
def _source() -> str:
    """The digest of the source files of somatize here — the ``somatize`` package this
    process imported and the ``somatize_torch`` beside it — read once per process, when
    first asked (a client asks as its first worker starts, an actor as it is first asked
    its version); :data:`_UNREAD` where there is no ``.py`` file of somatize to read."""
    packages: list[tuple[str, Path]] = []
    for name in _OWN:
        spec = importlib.util.find_spec(name)  # the imported one's, or where an import looks
        if spec is not None and spec.submodule_search_locations:
            packages.extend((name, Path(place)) for place in spec.submodule_search_locations)
    return source_digest(packages) or _UNREAD


def source_digest(packages: Iterable[tuple[str, Path]]) -> str | None:
    """The BLAKE3 digest of the ``.py`` files under each (name, directory) of ``packages``,
    each by its path from its package's name and its bytes: the same files give the same
    digest wherever they lie, and a file edited, added, removed or moved another. None
    when there is no such file."""
    hasher = blake3.blake3()
    read = 0
    for name, place in packages:
        for path in sorted(place.rglob("*.py")):
            named = f"{name}/{path.relative_to(place).as_posix()}".encode()
            data = path.read_bytes()
            for part in (named, data):
                hasher.update(len(part).to_bytes(8, "little"))
                hasher.update(part)
            read += 1
    return "blake3:" + hasher.hexdigest() if read else None


def _other_version(node: str, worker: str, there: str) -> BadWorker:
    """The refusal of a worker whose actor imported another version of somatize, or the
    same version from other source files (``there``, its :func:`_version`), which would
    read the jobs this process writes otherwise."""
    (version, source), (mine, my_source) = _versions(there)
    if version == mine:
        runs = (
            f"runs somatize {mine} as this process does, from other source files (their "
            f"digest there is {source or 'not said'}, here {my_source}: one of them was "
            "edited)"
        )
    else:
        runs = f"runs somatize {version}, and this process {mine}"
    return BadWorker(
        f"worker `{worker}` {runs}: the jobs it is sent would be read there by other code "
        f"than wrote them, so `{node}` did not run and nothing was kept. The worker was "
        "stopped. Install the same somatize everywhere the graph runs (on a cluster "
        "elsewhere, through `runtime_env=`)"
    )


def _unstartable(node: str, worker: str, error: BaseException) -> BadWorker:
    """The refusal of a worker whose actor failed as it was made (``error``, Ray's): its
    process could not import or build it, as every other started in that environment."""
    said = [line.strip() for line in _ANSI.sub("", _message(error)).splitlines() if line.strip()]
    return BadWorker(
        f"worker `{worker}` could not be started: its actor failed as it was made "
        f"({said[-1] if said else type(error).__name__}), so `{node}` did not run there and "
        "nothing was kept. The worker's environment must import Ray and the same version of "
        "somatize as this process: check `runtime_env=` and `import_paths=` on the broker"
    )


def _refuse_unanswered(address: str | None) -> None:
    """Raises ``ConnectionError`` when the cluster ``address`` names by its GCS
    ``host:port`` (given, or ``$RAY_ADDRESS`` for None and ``"auto"``) refuses a connection
    or does not answer in five seconds: ``ray.init`` would wait for it for minutes, logging
    retries, before it gave up. An address of another form is left to ``ray.init``."""
    named = os.environ.get("RAY_ADDRESS") if address in (None, "auto") else address
    if not named or named == "local" or "://" in named:
        return
    host, _, port = named.rpartition(":")
    if not host or not port.isdigit():
        return
    given = "" if named == address else f" ($RAY_ADDRESS, for the address {address!r})"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_ANSWER_S) as line:
            said = _first_frame(line)
    except OSError as why:
        raise ConnectionError(
            f"no Ray cluster answers at {named}{given} ({type(why).__name__}: {why}), so "
            "Broker.ray connected to none and nothing was started: start the cluster there "
            "(`ray start --head`), or name the address of a running one"
        ) from why
    if said is None:
        raise ConnectionError(
            f"a server takes connections at {named}{given} and says nothing there in "
            f"{_ANSWER_S:g} s, where a Ray cluster's GCS answers at once (it speaks gRPC), so "
            "Broker.ray connected to nothing and nothing was started. Name the cluster's GCS "
            "address, the one `ray start --head` printed (port 6379 unless it was given "
            "another)"
        )
    if said and not (len(said) == len(_SETTINGS) and said[3] == _SETTINGS[3]):
        raise ConnectionError(
            f"a server answers at {named}{given} that is no Ray cluster's GCS: it does not "
            f"speak gRPC (it answered {said!r}), so Broker.ray connected to nothing and "
            "nothing was started. Name the cluster's GCS address, the one `ray start --head` "
            "printed (port 6379 unless it was given another) — not its dashboard's (8265), "
            "nor its Ray Client server's, which is given as `ray://host:10001`"
        )


_ANSWER_S = 5.0
"""Seconds a cluster's GCS has to take a connection, and then to answer on it."""

_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""An empty HTTP/2 SETTINGS frame: its header, a frame type of 4 at byte 3."""

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _SETTINGS
"""What an HTTP/2 client (gRPC's, as Ray's GCS speaks) sends first on a connection; the
server answers with a SETTINGS frame of its own before anything else."""


def _first_frame(line: socket.socket) -> bytes | None:
    """The first bytes (a frame header's nine, at most) the server on ``line`` answers to an
    HTTP/2 preface; None where it says nothing within the connection's timeout; nothing
    where it closes the connection or breaks it, or the cluster speaks TLS
    (``$RAY_USE_TLS``), which this does not."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return b""
    said = b""
    try:
        line.sendall(_PREFACE)
        while len(said) < len(_SETTINGS):
            more = line.recv(len(_SETTINGS) - len(said))
            if not more:
                return said  # closed: what it said, if anything (nothing: left to ray.init)
            said += more
    except TimeoutError:
        return said or None  # silent: a GCS answers at once, so no GCS
    except OSError:
        return b""  # gone: left to ray.init
    return said


def _connected_elsewhere(ray: Any, address: str) -> str | None:
    """The address of the cluster this process is connected to, when ``address`` names
    another one (or one that cannot be told to be it); None when it names that one.

    ``address`` is read as ``ray.init`` reads it: ``"auto"`` is ``$RAY_ADDRESS`` when set,
    else the cluster ``ray.init`` would find on this machine (none found: it names no
    other); ``"host:port"`` is a cluster's GCS, ``localhost`` and ``127.0.0.1`` being this
    machine; ``"ray://host:port"`` is a Ray Client server, the same cluster only when this
    process is connected through that server; ``"local"`` is always a new cluster."""
    through_client = bool(ray.util.client.ray.is_connected())
    if through_client:  # connected through a Ray Client server
        server = getattr(ray.util.client.ray.client_worker, "_conn_str", None)
        connected = f"ray://{server}" if isinstance(server, str) else "a Ray Client server"
    else:
        connected = str(ray.get_runtime_context().gcs_address)
    named: str | None = address
    if named == "auto":
        named = os.environ.get("RAY_ADDRESS") or _as_ray_reads("auto")
    if named is None:  # "auto", and no cluster to be found here: it names no other
        return None
    if named == "local":
        return connected
    if "://" in named or through_client:
        if "://" not in named or not connected.startswith("ray://"):
            return connected  # a Ray Client server and a cluster's GCS cannot be compared
        scheme, _, rest = named.partition("://")
        same = scheme == "ray" and _same_endpoint(rest, connected[len("ray://") :], ray)
        return None if same else connected
    gcs = _as_ray_reads(named) or named
    return None if _same_endpoint(gcs, connected, ray) else connected


def _as_ray_reads(address: str) -> str | None:
    """The GCS ``host:port`` ``ray.init`` would connect to for ``address`` (``"auto"``: the
    cluster it would find on this machine), or None when it would find none or reads
    ``address`` otherwise (it is then compared as it is written)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address(address)
    except Exception:  # none found ("auto"), or an address ray cannot read either
        return None
    return found if isinstance(found, str) else None


def _same_endpoint(one: str, other: str, ray: Any) -> bool:
    """Whether ``host:port`` ``one`` and ``other`` are one place: the same port, and hosts
    written alike, both this machine (``localhost``, ``127.0.0.1``, the address of this
    machine's Ray node), or one that resolves to the other's address."""
    host, _, port = one.rstrip("/").rpartition(":")
    there, _, port_there = other.rstrip("/").rpartition(":")
    if not port.isdigit() or not port_there.isdigit() or int(port) != int(port_there):
        return False
    host, there = host.strip("[]").lower(), there.strip("[]").lower()
    if host == there:
        return True
    mine, theirs = _addresses(host), _addresses(there)
    here = _addresses("localhost") | _addresses(str(ray.util.get_node_ip_address()))
    return bool(mine & theirs) or (bool(mine & here) and bool(theirs & here))


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to (none when it does not)."""
    try:
        found = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return set()
    return {str(info[4][0]) for info in found}


@dataclass(frozen=True)
class _Carried:
    """A job's answer as it came back, and the bytes of the state sent for it (0: none)."""

    codec: str
    data: bytes
    kept: int | None
    carried: int
    moved: bool = False
    """Whether the node's code, or what it declares, changed as it ran there
    (:attr:`Reply.moved`)."""
