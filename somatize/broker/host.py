"""The far side of a crossing: what a network worker does with a job.

A **job** is everything one call of a node needs on a worker that shares no
memory with the client: the node's blueprint (identity, constructor call,
declaration digest), what its context says, and its inputs as codec bytes. A
:class:`Host` rebuilds the node through the catalog the first time it sees its
blueprint and keeps it loaded for every later job, decodes the inputs, runs the
node, encodes its answer, and — when the job says so and it can open the store
— keeps that answer itself, so the bytes it already has are written once, from
where they are. The embedded broker runs a host on a thread; the Ray broker runs
one inside each actor.

**The store.** A job names the forward's store by its address
(:meth:`~somatize.store.Store.address`: a directory, or a bucket's URL and storage
options), and a host opens it from there once — never the client's store object,
which could not cross a wire. A store with no address (options that are live
objects, a ``memory://`` bucket) is not named: the worker keeps nothing, and the
client keeps what comes back. Nor does a worker keep into a signed store unless
its own ``$SOMATIZE_STORE_KEY`` is the store's key — the address carries only the
key's fingerprint — or when it cannot open the store or write to it: the reply
then says it kept nothing, and the client keeps the answer, which readers of a
signed store accept. Either way the answer is the same; only who wrote it differs
(the ``kept`` fact says ``by`` the worker when the worker did).

**State.** A node that holds state — a frozen encoder's weights — is rebuilt by
its constructor and then loaded with that state (:meth:`~somatize.node.Node.state_bytes`
on the client, :meth:`~somatize.node.Node.load_state` here). A job names only the
digest the graph is frozen at (:attr:`Job.state`), never the weights; a host
keeps each node it loaded under (blueprint, state digest), so a job naming a
state it holds carries nothing more. A host that lacks the state answers
:class:`NeedState`, and the client sends the same job again with the state's
bytes — once: the host loads them, works out the digest of what it loaded, and
refuses (:class:`~somatize.broker.StateMismatch`) unless it is the digest the job
names, so a worker never answers under a key with weights the key does not
describe. Weights cross once per worker and state; a re-frozen node has a new
digest, so the next job asks for the new weights. Per node name, blueprint and
graph (a job names its graph by an opaque :attr:`Job.holder`) a host holds the
state it loaded last and lets the one before go, unless another holding names
it; past four holdings of one blueprint, the least recently used goes first.
Two encoders of one architecture at different weights — in one graph, or in two
graphs that call them alike — are both kept loaded, and re-freezing does not
pile old weights up on a worker.

**Code.** A job names the fingerprint of the code the graph was built with, and a
host refuses (:class:`~somatize.catalog.Unbuildable`, naming the node and the
worker) a node whose class it finds written otherwise — the declaration can match
while the code that computes the answer does not — so a worker never keeps its
answer under a key, and a fingerprint, that describe somebody else's code. The
fingerprint a worker keeps an answer with is the client's (:attr:`Job.kept_with`):
that of the node's code and of the code of every node it reads, which only the
client's graph knows. Code changed while the node ran (a method set on its class by
another thread) is looked for again after its forward: its answer then comes back
marked (:attr:`Reply.moved`) and kept by nobody, as the client keeps nothing computed
while its code changed.

**Copies that change.** A copy starts each job as the job's blueprint and state
describe it. One that changed itself as it ran — a public value it holds
(:func:`~somatize.node.held_by`, looked at before and after the job), what it declares
(a torch module's settings, watched from before the job:
:meth:`~somatize.node.Node.changed_as_it_ran`) or its state (its
:meth:`~somatize.node.Node.restate`) — answered from what the job's key names, as in
the client's process, where a key names a node as it is when its run starts; but it is
not that node any more, so it is let go of, and the next job builds (and loads) it
again. One that changed what it declares or its state (a gain it sets from the first
batch it sees, a buffer it adds into) keeps nothing either, as the client keeps nothing
of such a node run in its own process, since a recall would not make the change: its
answer comes back marked (:attr:`Reply.moved`) and kept by nobody.

The state is asked for rather than shipped through the shared store by digest
because a forward may have no store, or one only the client can open (a bucket
whose options the workers lack), and weights are not answers: no key names them,
and a store holds answers. Asking costs one round trip per worker and state, and
needs nothing but the worker itself. A state may be a reference: a dataset
source hands over only its version, and the source rebuilt here reads the rows
itself and refuses (``StateMismatch``, from its ``load_state``) when it finds
another version (:mod:`somatize.data.parquet`).

The helpers here (:func:`pack`, :func:`unpack`, :func:`crossings`) are the one
definition of how a value crosses, shared by both sides.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from somatize import canonical
from somatize._precision import (
    Precision,
    autocast_on,
    entered,
    keyed_in_precision,
    precision_now,
)
from somatize._threads import ProcessLock
from somatize.catalog import (
    Blueprint,
    Catalog,
    Unbuildable,
    check_held,
    fingerprint_of,
    state_crosses,
)
from somatize.codecs import _CODEC_HOMES, CODECS, CodecError, Unreadable
from somatize.node import Context, Node, digest_of, held_by
from somatize.plan import static_of
from somatize.store import Store, StoreError

from .base import GradientLost, StateMismatch, UnreadableCrossing, state_mismatch

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["Host", "Job", "NeedState", "Reply", "crossings", "pack", "unpack"]

Buffer = bytes | bytearray | memoryview

_BLUEPRINTS = 2
"""How many blueprints one node of a graph keeps what was built from on a host: the one
it runs now and the one before (a setting switched back and forth)."""

_HOLDINGS = 4
"""How many (node name, graph) holdings of one blueprint a host keeps states loaded for:
enough for a few graphs sharing an encoder at other weights, few enough that graphs long
gone let theirs go."""

_CODEC_LIBRARIES = {"arrow": "pyarrow", "tensor": "torch"}
"""The library whose values each codec of :data:`~somatize.codecs._CODEC_HOMES` writes: a
process that holds such a value has imported it, and a worker whose node made one (a tensor
from a list) may never have imported the codec's home."""


@dataclass(frozen=True)
class Job:
    """One call of a node, as it crosses to a worker. Plain fields only."""

    blueprint: bytes
    """The node's :class:`~somatize.catalog.Blueprint`, as its canonical bytes."""
    name: str
    key: str | None
    keys: list[str] | None
    worker: str
    codecs: list[str]
    """The codec of each input, in the order the node receives them."""
    readers: list[str]
    """Who reads the answer, so an answer with no codec names its edge."""
    keep: bool = False
    """Whether the worker keeps the answer under ``key`` in the shared store."""
    fingerprint: str | None = None
    """The fingerprint of the node's own code, as the graph was built with it: a host
    refuses to run a node its class is written otherwise for."""
    kept_with: str | None = None
    """The fingerprint the answer is kept with when the worker keeps it: the node's code and
    the code of everything it reads, as the client's plan works it out
    (:attr:`~somatize.plan.Static.fingerprint`) — what a recall on any client compares."""
    store: dict[str, Any] | None = None
    """The shared store's address (:meth:`~somatize.store.Store.address`), for the worker to
    open it itself; None when there is no store or it has no address."""
    state: str | None = None
    """For a node that holds state: the digest of the state it must hold (the graph's)."""
    holder: str = ""
    """An opaque name of the client's graph, so two graphs whose nodes share a name and a
    blueprint at other states each keep theirs loaded."""
    grad: bool = True
    """Whether grad mode is on where the graph is called (off under ``torch.no_grad()`` and
    ``torch.inference_mode()``): the node runs in it on the worker, whose thread or process
    has its own, as it runs with no broker."""
    autocast: tuple[tuple[str, str], ...] = ()
    """The device types autocast is on for where the graph is called, each with its dtype's
    name (``("cpu", "bfloat16")``): the node runs under it on the worker, as in grad
    mode."""
    autocast_cache: bool = True
    """Whether that autocast caches the casts of weights it makes."""
    precision: tuple[tuple[str, str], ...] | None = None
    """For a keyed node whose key names the precision the graph is called in
    (:func:`~somatize._precision.keyed_in_precision`): that precision (``()``, torch's
    default), which the worker must run it in, its autocast entered, and the settings of
    its process too where it runs apart (:attr:`Host.apart`); None for any other."""


@dataclass(frozen=True)
class Reply:
    """What comes back from a job: the answer as codec bytes, and what it cost."""

    codec: str
    data: bytes
    took_us: int
    kept: int | None
    """Bytes the worker kept in the store for this answer, or None if it kept nothing."""
    moved: bool = False
    """Whether the node's code was changed as it ran (a method set on its class meanwhile),
    or the node changed what it declares as it ran (a torch module that sets a value it
    keeps from the first batch it sees, or adds into a buffer:
    :meth:`~somatize.node.Node.changed_as_it_ran`): the answer may be the new code's, or
    one a recall would not make the change of, so neither the worker nor the client keeps
    it under its key."""


@dataclass(frozen=True)
class NeedState:
    """A host's answer to a job whose node holds a state it has not loaded: send the job
    again with that state's bytes."""

    state: str


def job_for(
    graph: Graph,
    node: str,
    worker: str,
    blueprint: Blueprint,
    inputs: list[Any],
    ctx: Context,
    *,
    keep: bool,
    holder: str = "",
) -> tuple[Job, list[bytes]]:
    """The job that sends ``node`` with ``inputs`` to ``worker``, and the inputs' bytes
    (each through its codec; an input with none fails, naming its edge). It names the
    store of ``ctx`` by its address, and asks the worker to keep the answer (``keep``)
    only when there is one."""
    address = ctx.store.address() if ctx.store is not None else None
    keeps = keep and address is not None
    edges = edge_names(graph, node, worker)
    for value, where in zip(inputs, edges, strict=True):
        if _needs_grad(value):
            raise gradient_lost(node, worker, where)
    packed = [pack(value, where) for value, where in zip(inputs, edges, strict=True)]
    job = Job(
        blueprint=blueprint.to_bytes(),
        name=node,
        key=ctx.key,
        keys=list(ctx.keys) if ctx.keys is not None else None,
        worker=worker,
        codecs=[codec for codec, _ in packed],
        readers=list(graph.successors(node)),
        keep=keeps,
        fingerprint=graph.memory.fingerprint_of(node),
        kept_with=static_of(graph).fingerprint.get(node) if keeps else None,
        store=address,
        state=held_state(graph, node),
        holder=holder,
        grad=_grad_on(),
        autocast=autocast_on(),
        autocast_cache=_autocast_caches(),
        precision=_keyed_precision(graph, node, ctx),
    )
    return job, [data for _, data in packed]


def _keyed_precision(graph: Graph, node: str, ctx: Context) -> Precision | None:
    """The precision ``node``'s key names (``()``: the default): the one its forward read as
    it began (:attr:`~somatize.node.Context.precision`), not the one in force now, which
    another thread may have changed since; None where it is not keyed, or its key does not
    name it (a torch module's declaration does)."""
    if ctx.key is None and ctx.keys is None:
        return None
    if not keyed_in_precision(graph.node(node)):
        return None
    return ctx.precision or ()


def _in_precision(job: Job, apart: bool) -> AbstractContextManager[Any]:
    """Where this host runs apart (:attr:`Host.apart`: a process of its own, one job at a
    time), the settings of the process the job's node is keyed in (:attr:`Job.precision`)
    entered for the job and put back after; nothing otherwise: a worker in the process the
    graph is called in computes in the caller's settings already, and other threads compute
    there meanwhile, which a setting entered for one job would reach."""
    if job.precision is None or not apart:
        return nullcontext()
    return entered(job.precision)


def _refuse_other_precision(job: Job, worker: str, apart: bool) -> None:
    """Unbuildable where the job's node would run here, its autocast and, apart, the settings
    of its process entered (:func:`_in_precision`), in another precision than its key names
    (:attr:`Job.precision`). Its answer would be kept, and recalled, under a key that does
    not describe it."""
    if job.precision is None:
        return
    here = precision_now() or ()
    if sorted(here) == sorted(job.precision):
        return
    said = (
        f"`{job.name}` on worker `{worker}` would run in {_said(here)}, and its key names "
        f"{_said(job.precision)}, the precision the graph is called in: its answer would be "
        f"kept under a key that does not describe it. `{job.name}` did not run. "
    )
    if apart:
        raise Unbuildable(
            said + "The worker set what its torch can set for the job (the default dtype, "
            "float32 precision, oneDNN and cuDNN on or off) and could not set the rest: a "
            "setting its torch lacks (one built without CUDA, another version) or cuBLAS's "
            "half-precision settings. Install the same torch on the worker as where the graph "
            "is called and set those in its process, or place the node on a "
            '`Worker.generic(mode="local")` worker'
        )
    raise Unbuildable(
        said + "This worker runs in the process the graph is called in, whose default dtype "
        "or float32 precision (`torch.set_default_dtype`, `torch.set_float32_matmul_precision`"
        ") changed since the forward began — set by another thread — and which it does not set "
        "back for one job, since every thread of the process computes in it. Leave them as "
        "they are while a forward runs"
    )


def _said(precision: Precision) -> str:
    """How an error says ``precision``."""
    if not precision:
        return "torch's default precision"
    return ", ".join(f"{what} {value}" for what, value in precision)


def _grad_on() -> bool:
    """Whether grad mode is on in this thread (no torch imported: as torch starts a thread)."""
    torch = sys.modules.get("torch")
    return torch is None or bool(torch.is_grad_enabled())


def _grad_mode(on: bool) -> AbstractContextManager[Any]:
    """What sets grad mode ``on`` in this thread while it is entered; nothing where torch is
    not imported, and no tensor either."""
    torch = sys.modules.get("torch")
    return nullcontext() if torch is None else torch.set_grad_enabled(on)


def _autocast_caches() -> bool:
    """Whether autocast caches the casts it makes in this thread (as torch starts, it does)."""
    torch = sys.modules.get("torch")
    return torch is None or bool(torch.is_autocast_cache_enabled())


def _autocast(on: Sequence[tuple[str, str]], cache: bool) -> AbstractContextManager[Any]:
    """What enters, in this thread, autocast on each device type of ``on`` in the dtype
    it names, caching casts as ``cache`` says; nothing where none is on, or torch cannot
    be imported here (nothing then computes with it)."""
    if not on:
        return nullcontext()
    try:
        torch = importlib.import_module("torch")  # a node may import it only as it runs
    except ImportError:
        return nullcontext()
    entered = ExitStack()
    for device, dtype in on:
        entered.enter_context(
            torch.autocast(device, dtype=getattr(torch, dtype), cache_enabled=cache)
        )
    return entered


def callers_modes() -> Callable[[], AbstractContextManager[Any]]:
    """What enters, on another thread (a worker's), the grad mode, inference mode and
    autocast of the thread that calls this (``torch.no_grad()``,
    ``torch.inference_mode()``, ``torch.autocast(...)``), which torch keeps per thread:
    what runs or is decoded there is as it would be where the graph is called. Nothing
    where torch is not imported, and no tensor either."""
    torch = sys.modules.get("torch")
    if torch is None:
        return nullcontext
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    autocast, cache = autocast_on(), _autocast_caches()
    return lambda: _in_modes(grad, inference, autocast, cache)


def _in_modes(
    grad: bool, inference: bool, autocast: Sequence[tuple[str, str]] = (), cache: bool = True
) -> AbstractContextManager[Any]:
    """Grad mode ``grad``, inference mode ``inference`` and autocast on each device type of
    ``autocast`` (:func:`_autocast`), entered now in this thread and left as the context
    is (torch is imported)."""
    torch = sys.modules["torch"]
    entered = ExitStack()
    entered.enter_context(torch.inference_mode(inference))
    entered.enter_context(torch.set_grad_enabled(grad))  # sets it as it is made: here
    entered.enter_context(_autocast(autocast, cache))
    return entered


def _as_a_worker_builds() -> AbstractContextManager[Any]:
    """The modes a worker's own thread or process builds a node in (grad on, inference mode
    off), whatever those of the thread that admits it: a module built under the caller's
    ``torch.inference_mode()`` would hold inference tensors, which the state it is then
    sent cannot be loaded into."""
    return nullcontext() if "torch" not in sys.modules else _in_modes(True, False)


def unpacker(node: str, worker: str) -> Callable[[str, Buffer], Any]:
    """What unpacks the answer of ``node`` that crossed back from network worker ``worker``
    as it would be made where the graph is called, on whichever thread the reply is read: in
    the inference mode of the thread that calls this (:func:`callers_modes`), so that an
    answer to a forward under ``torch.inference_mode()`` is an inference tensor, as the
    node's own answer there and one recalled from the store are. UnreadableCrossing for one
    naming a class this process has not loaded."""
    modes = callers_modes()

    def unpacked(codec: str, data: Buffer) -> Any:
        with modes():
            try:
                return unpack(codec, data)
            except Unreadable as why:
                raise unreadable_answer(node, worker, why) from None

    return unpacked


_NOT_IMPORTED = "and no module is imported to read a value"


def unreadable_answer(node: str, worker: str, why: Unreadable) -> UnreadableCrossing:
    """The refusal of the answer of ``node`` that crossed back from ``worker`` and cannot be
    read where the graph is called (``why``): a class the node's code loads there only."""
    where = f"the answer of `{node}`, crossing back from worker `{worker}`"
    if why.named is None:
        return UnreadableCrossing(f"{where}, cannot be read where the graph is called: {why}")
    module = why.named.partition(":")[0]
    return UnreadableCrossing(
        f"{where}, is a `{why.named}`, a class not loaded in this process, where the graph "
        f"is called, {_NOT_IMPORTED}. Import its module here before the forward "
        f"(`import {module}`), as the code of `{node}` does on the worker"
    )


def unreadable_input(node: str, worker: str, why: Unreadable) -> UnreadableCrossing:
    """The refusal of an input of ``node`` that crossed to ``worker``, in another process,
    and cannot be read there (``why``): a class that process has not loaded."""
    where = f"an input of `{node}`, crossing to worker `{worker}`"
    if why.named is None:
        return UnreadableCrossing(f"{where}, cannot be read there: {why}")
    module = why.named.partition(":")[0]
    fix = (
        "A class defined in a script or a notebook (`__main__`) is found in no other "
        f"process: define it in a module, and import that module in the module of `{node}`'s "
        "class"
        if module in ("__main__", "__mp_main__", "builtins")
        else f"Import `{module}` in the module of `{node}`'s class, so the worker loads it as "
        "it builds the node"
    )
    return UnreadableCrossing(
        f"{where}, is a `{why.named}`, a class not loaded in the worker's process, "
        f"{_NOT_IMPORTED}; `{node}` did not run. {fix}"
    )


def _needs_grad(value: Any) -> bool:
    """Whether ``value`` is, or holds in its tuples, lists and dicts, a tensor that requires
    grad while grad mode is on: one whose gradient a crossing would cut (no torch imported:
    no tensor)."""
    torch = sys.modules.get("torch")
    if torch is None or not _grad_on():
        return False
    tensor = torch.Tensor
    if isinstance(value, tensor):
        return bool(value.requires_grad)
    if not isinstance(value, (tuple, list, dict)):
        return False
    looked = [value]
    while looked:
        item = looked.pop()
        if isinstance(item, tensor):
            if item.requires_grad:
                return True
        elif isinstance(item, (tuple, list)):
            looked.extend(item)
        elif isinstance(item, dict):
            looked.extend(item.values())
    return False


def gradient_lost(node: str, worker: str, where: str) -> GradientLost:
    """The refusal of a tensor that requires grad, ``where`` it would cross to ``worker``."""
    return GradientLost(
        f"{where} is or holds a tensor that requires grad, and a network worker is sent "
        f"values alone: the gradient would not flow back through `{node}` to what made the "
        f"tensor, and a backward pass here would miss that path without a word. Nothing "
        f"was sent to `{worker}`. To train through `{node}`, place it on a "
        '`Worker.generic(mode="local")` worker or leave it where the graph is called; where '
        "no gradient is meant to pass, detach the tensor on purpose (`.detach()`) or run the "
        "forward under `torch.no_grad()`"
    )


def answer_needs_grad(node: str, worker: str) -> GradientLost:
    """The refusal of an answer that requires grad on ``worker``, which would come back as
    values alone."""
    return GradientLost(
        f"the answer of `{node}`, computed on worker `{worker}` with grad mode on, is or "
        "holds a tensor that requires grad (computed from weights that train: a module its "
        "forward reads that is not frozen, a parameter it makes), and it comes back as values "
        "alone: the gradient would not flow back to those weights, and a backward pass here "
        f"would miss that path without a word. Nothing was kept for `{node}`. To train through "
        f'`{node}`, place it on a `Worker.generic(mode="local")` worker or leave it where the '
        "graph is called; where no gradient is meant to pass, run the forward under "
        "`torch.no_grad()`, or freeze what it computes with"
    )


def held_state(graph: Graph, node: str) -> str | None:
    """The digest of the state a worker must load for ``node``: the one the graph is frozen
    at, for a node that holds state or says it; None for one that does neither."""
    return graph.memory.state_of(node) if graph.keyed_by_state(node) else None


def state_for(node: Node) -> bytes:
    """The bytes a worker that asked for ``node``'s state (:class:`NeedState`) is sent:
    those its :meth:`~somatize.node.Node.state_bytes` writes; none for a node that says its
    state (``settled_state()``) and cannot hand it over, whose copy there says its own."""
    return node.state_bytes() if state_crosses(node) else b""


_UNLOADABLE: dict[str, str] = {}
"""What importing each codec's home said here, where it failed (``somatize.torch`` with
torch loaded and no numpy): tried once, and said where a value would need it."""


def pack(value: Any, where: str) -> tuple[str, bytes]:
    """``value`` as (codec name, bytes); CodecError naming its type and ``where`` otherwise.
    A codec not registered yet whose library is loaded is registered first, so a worker
    packs what the client's process would; one whose home cannot be imported here (an
    extra half installed) is left out, and said where no other codec writes the value."""
    for name, home in _CODEC_HOMES.items():
        if name not in CODECS and name not in _UNLOADABLE and _CODEC_LIBRARIES[name] in sys.modules:
            try:
                importlib.import_module(home)
            except ImportError as why:
                _UNLOADABLE[name] = f"`import {home}` failed here: {why}"
    try:
        codec = CODECS.for_value(value, where)
    except CodecError as why:
        failed = [said for name, said in _UNLOADABLE.items() if name not in CODECS]
        if not failed:
            raise
        raise CodecError(f"{why}. {'; '.join(failed)}") from None
    return codec.name, b"".join(codec.encode(value))


def unpack(codec: str, data: Buffer) -> Any:
    """The value whose ``codec`` bytes are ``data``; the codec's module is imported if needed."""
    if codec not in CODECS and codec in _CODEC_HOMES:
        importlib.import_module(_CODEC_HOMES[codec])
    return CODECS.named(codec).decode(memoryview(data))


def edge_names(graph: Graph, node: str, worker: str) -> list[str]:
    """How errors call each input edge of ``node`` crossing to ``worker``."""
    preds = graph.predecessors(node)
    if not preds:
        return [f"the graph's input, crossing to `{node}` on worker `{worker}`"]
    return [f"the value crossing `{p}` → `{node}` (to worker `{worker}`)" for p in preds]


def crossings(
    graph: Graph, node: str, worker: str, sent: Sequence[int], back: int, state: int = 0
) -> list[dict[str, Any]]:
    """The ``crossed`` facts of one call: the node's state when it was sent (``"way":
    "state"``, on no edge), one per input sent, on the edge it came by (none for the
    graph's input), and one per edge that reads the answer. The answer came back once,
    however many nodes read it, so its bytes are on the edge to its first reader and the
    edges to the others say 0: added up, the facts are the bytes that crossed. The engine
    moves them to the readers that run in the forward (:meth:`~somatize._run._Run.emit_crossed`)."""
    facts: list[dict[str, Any]] = []
    if state:
        facts.append(
            {"fact": "crossed", "node": node, "worker": worker, "bytes": state, "way": "state"}
        )
    preds = graph.predecessors(node)
    for index, size in enumerate(sent):
        fact: dict[str, Any] = {"fact": "crossed", "node": node}
        if preds:
            fact["from"] = preds[index]
        fact.update(worker=worker, bytes=size, way="out")
        facts.append(fact)
    readers = graph.successors(node)
    for index, reader in enumerate(readers):
        facts.append(
            {
                "fact": "crossed",
                "node": reader,
                "from": node,
                "worker": worker,
                "bytes": back if index == 0 else 0,
                "way": "back",
            }
        )
    if not readers:
        facts.append(
            {"fact": "crossed", "node": node, "worker": worker, "bytes": back, "way": "back"}
        )
    return facts


_NONE = digest_of(None)
"""How :func:`~somatize.node.held_by` tells an attribute holding None."""


def _written_as(node: Node, fingerprint: str | None) -> bool:
    """Whether ``node``'s code is the code ``fingerprint`` names (None: not known, taken as
    so)."""
    return fingerprint is None or fingerprint_of(*node.implementing_classes()) == fingerprint


def _moved_from(node: Node, state: str) -> bool:
    """Whether ``node``, loaded at ``state``, holds another state now
    (:meth:`~somatize.node.Node.restate`)."""
    try:
        now = node.restate()
    except Exception:
        return True  # whatever it holds now, it is not what was loaded
    return now is not None and now != state


class Host:
    """A worker's side of network crossings: rebuilt nodes, kept loaded between jobs."""

    def __init__(
        self,
        worker: str,
        catalog: Catalog | None = None,
        *,
        stoppable: Callable[[], AbstractContextManager[None]] = nullcontext,
        apart: bool = False,
    ) -> None:
        self.worker = worker
        self.catalog = catalog if catalog is not None else Catalog()
        self.stoppable = stoppable
        """Around each node's forward: where an interrupted forward may stop it (an embedded
        broker's :meth:`~somatize.broker.Broker.stoppable`)."""
        self.apart = apart
        """Whether this host runs in a process of its own (a Ray actor), one job at a time:
        the modules it imported stay as it imported them, whatever the client reloads since,
        and it enters for each job the settings of the process its node's key names (the
        default dtype, TF32), which hold for all its threads."""
        self._nodes: dict[tuple[bytes, str | None], Node] = {}
        self._spare: dict[bytes, Node] = {}
        """Blueprint → a node built for it ahead of its first job (:meth:`admit`) and not
        loaded with any state yet."""
        self._held: dict[tuple[bytes, str, str], str] = {}
        """(blueprint, node name, holder) → the state loaded for it last, least recently
        used first."""
        self._built_from: dict[tuple[str, str], list[bytes]] = {}
        """(node name, holder) → the blueprints its last jobs were built from, the most
        recent last."""
        self._stores: dict[bytes, Store] = {}
        """The canonical bytes of an address → the store opened from it."""
        self.let_go = False
        """Whether the broker let this host go with a job still running on it (the job did
        not answer in time): it begins no node's forward and keeps no answer after that."""
        self._lock = ProcessLock()
        """Held while nodes are built or looked up: a broker admits nodes (on the caller's
        thread) while this host runs a job (on the worker's). Made unheld in a forked
        child (:class:`~somatize._threads.ProcessLock`)."""

    def admit(self, blueprint: bytes, fingerprint: str | None, *, name: str, holds: bool) -> None:
        """Builds the node ``blueprint`` describes ahead of its first job, and keeps it for
        that job: Unbuildable when this host cannot rebuild it, or when the code it finds
        is not the code the graph was built with (``fingerprint``). A node that ``holds``
        state is kept aside until a job brings the state to load into it."""
        with self._lock:
            found = self._nodes.get((blueprint, None)) or self._spare.get(blueprint)
            if found is None:
                found = next((n for (b, _), n in self._nodes.items() if b == blueprint), None)
            if found is not None and not _written_as(found, fingerprint):
                self._forget(blueprint)  # built from a class since redefined (a notebook)
                found = None
            if found is None:
                with _as_a_worker_builds():  # on the caller's thread, in its modes
                    found = self.catalog.build(Blueprint.from_bytes(blueprint))
                if holds:
                    self._spare[blueprint] = found
                else:
                    self._nodes[(blueprint, None)] = found
        self.same_code(found, fingerprint, name)

    def same_code(self, node: Node, fingerprint: str | None, name: str) -> None:
        """Unbuildable when ``node``, built here, is not written as the code the graph was
        built with (its ``fingerprint``; None: not known, nothing to compare)."""
        if fingerprint is None:
            return
        kind = node.implementing_class()
        here = fingerprint_of(*node.implementing_classes())
        if here != fingerprint:
            raise Unbuildable(
                f"`{name}` on worker `{self.worker}` runs other code than the graph was built "
                f"with: `{kind.__module__}:{kind.__qualname__}` there is written as {here}, "
                f"and the graph's as {fingerprint}, so its answers would be kept under keys "
                f"that name the graph's code. Nothing was kept for `{name}`. "
                + (
                    "Install the same version of the code everywhere the graph runs; a worker "
                    "runs a module as it imported it, so one started before the module was "
                    "edited runs the old code until it is started afresh (`broker.close()`: "
                    "the next forward starts the workers again)"
                    if self.apart
                    else "Install the same version of the code everywhere the graph runs (in a "
                    "notebook, build the graph again after redefining a class)"
                )
            )

    def node(
        self,
        blueprint: bytes,
        state: str | None = None,
        data: Buffer | None = None,
        *,
        name: str = "",
        holder: str = "",
        fingerprint: str | None = None,
    ) -> Node | None:
        """The node ``blueprint`` describes: built on first use, then kept. For a node that
        holds state, ``state`` is the digest it must hold and ``data`` that state's bytes,
        loaded into the node built here (and checked) when it is not loaded yet — None
        when it is not and no ``data`` came. ``name`` is the node's name in its graph, and
        ``holder`` names that graph (:attr:`Job.holder`). A node kept from a class whose
        code is no longer ``fingerprint`` (redefined since) is built again."""
        with self._lock:
            found = self._nodes.get((blueprint, state))
            if found is not None and not _written_as(found, fingerprint):
                self._forget(blueprint)  # built from a class since redefined (a notebook)
                found = None
            if found is not None and state is not None and _moved_from(found, state):
                # Loaded at `state`, it holds another now: a module it reads beyond its own
                # (a global of its file), which each copy reads, was loaded since for a
                # copy at another state (another graph's, another client's).
                self._drop(found)
                found = None
            if found is None:
                if state is not None and data is None:
                    return None
                spare = self._spare.pop(blueprint, None) if state is not None else None
                found = spare if spare is not None else self._build(blueprint, name)
                if state is not None:
                    assert data is not None
                    try:
                        loaded = self._load(found, data, name, state)
                    except StateMismatch:
                        if spare is None:
                            raise
                        # Built ahead of its first job, it found what it reads as it was
                        # then (a dataset's name bound again since, its files changed):
                        # built now, it finds them as they are.
                        found = self._build(blueprint, name)
                        loaded = self._load(found, data, name, state)
                    if loaded != state:
                        raise state_mismatch(name, self.worker, loaded, state)
                    found._smz.state = loaded
                    # Only now: what it holds may be its state, which the build left out.
                    try:
                        check_held(Blueprint.from_bytes(blueprint), found)
                    except Unbuildable as why:
                        raise Unbuildable(
                            f"`{name}` cannot be rebuilt on worker `{self.worker}`: {why}"
                        ) from None
                self._nodes[(blueprint, state)] = found
            if state is not None:
                self._hold(blueprint, name, state, holder)
            self._moved(blueprint, name, holder)
            return found

    def _load(self, node: Node, data: Buffer, name: str, state: str) -> str:
        """What ``node`` says it holds once ``data``, its state's bytes, is loaded into it;
        StateMismatch naming the node and this worker when it refuses them. A node that
        cannot load a state and says its own (``settled_state()``) is checked instead: its
        copy, rebuilt here, read what it reads as it is now, and must say ``state``."""
        try:
            if state_crosses(node):
                return node.load_state(memoryview(data))
            said = str(cast(Any, node).settled_state())
            if said != state:
                raise StateMismatch(
                    f"rebuilt here from its constructor, it says its state is {said} "
                    f"(`settled_state()`), and the graph is settled at {state}: what it reads "
                    "changed since it was settled (a file written again), so answers computed "
                    "from it would be kept under a key that does not describe them. It did not "
                    "run and nothing was kept for it. Build the graph again and settle it "
                    "(`somatize.data.settle(g)`) to read what is there now, or place it on a "
                    '`Worker.generic(mode="local")` worker to answer from the graph\'s own copy'
                )
            return said
        except StateMismatch as why:
            raise StateMismatch(f"`{name}` on worker `{self.worker}`: {why}") from None

    def _look_again(
        self, node: Node, before: tuple[tuple[str, str], ...], state: str | None
    ) -> bool:
        """Lets go of ``node``, which just ran a job, when it changed itself as it ran: a
        public value it holds (``self.step += 1``: :func:`~somatize.node.held_by`, as it was
        ``before`` the job), what it declares (a setting a torch module gives itself from
        the first batch it sees: :meth:`~somatize.node.Node.changed_as_it_ran`) or, for a
        node that holds ``state``, its state (a buffer its forward updates, seen by
        :meth:`~somatize.node.Node.restate`). The answer of that job was computed from the
        node as the job's key names it — as in the client's process, where a key names the
        node as it is when a run starts — but the next job names the same blueprint and
        state, and the copy is not that node any more: it is built (and loaded) again for
        the next job, which the client cannot tell it to. Answers whether the node changed
        what it declares as it ran, as the client asks of a node run in its own process:
        that answer is then kept by nobody, since a recall would not make the change."""
        # A value that changed, or one that appeared (`self.seen = 1`, which the next job's
        # node never held), or one that lost its canonical form as the node ran (an argument
        # it keeps replaced by a Fraction), unless it was None (a client or a model it loads
        # on first use, in place of None, which the next job's node would load again).
        was, holds = dict(before), dict(held_by(node))
        declared = node.changed_as_it_ran()
        changed = (
            declared
            or any(was.get(name) != digest for name, digest in holds.items())
            or any(name not in holds and digest != _NONE for name, digest in before)
        )
        if not changed and state is not None:
            changed = _moved_from(node, state)
        if changed:
            self._drop(node)
        return declared

    def _drop(self, node: Node) -> None:
        """Lets go of ``node``: the next job builds (and loads) it again."""
        with self._lock:
            for built in [k for k, kept in self._nodes.items() if kept is node]:
                del self._nodes[built]
            for blueprint in [b for b, kept in self._spare.items() if kept is node]:
                del self._spare[blueprint]

    def _moved(self, blueprint: bytes, name: str, holder: str) -> None:
        """Notes that ``name`` of the graph ``holder`` is built from ``blueprint`` now. It
        keeps what was built for the last :data:`_BLUEPRINTS` blueprints it was built from
        (a setting switched back and forth needs no new build); one older than those, if
        no other node of a graph was built from it lately, is let go of with what was built
        for it. (A node whose list changes between forwards has a new blueprint each time,
        and a node was kept for each, for good.)"""
        lately = self._built_from.setdefault((name, holder), [])
        if lately and lately[-1] == blueprint:
            return
        if blueprint in lately:
            lately.remove(blueprint)
        lately.append(blueprint)
        if len(lately) > _BLUEPRINTS:
            old = lately.pop(0)
            if not any(old in other for other in self._built_from.values()):
                self._forget(old)

    def _forget(self, blueprint: bytes) -> None:
        """Lets go of every node kept for ``blueprint``, and of what they held."""
        for built in [k for k in self._nodes if k[0] == blueprint]:
            del self._nodes[built]
        self._spare.pop(blueprint, None)
        for holding in [k for k in self._held if k[0] == blueprint]:
            del self._held[holding]

    def _build(self, blueprint: bytes, name: str) -> Node:
        """A new node from ``blueprint``; Unbuildable naming the node and this worker."""
        try:
            return self.catalog.build(Blueprint.from_bytes(blueprint))
        except Unbuildable as why:
            raise Unbuildable(
                f"`{name}` cannot be rebuilt on worker `{self.worker}`: {why}"
            ) from None

    def _hold(self, blueprint: bytes, name: str, state: str, holder: str) -> None:
        """Notes that ``name`` of the graph ``holder`` holds ``state``, letting go of the state
        it held before, and of the least recently used holdings past :data:`_HOLDINGS` per
        blueprint, unless another holding still names that state."""
        key = (blueprint, name, holder)
        before = self._held.pop(key, None)
        self._held[key] = state  # the most recently used last
        released = [before] if before is not None and before != state else []
        same = [k for k in self._held if k[0] == blueprint]
        for old in same[: max(0, len(same) - _HOLDINGS)]:
            released.append(self._held.pop(old))
        still = {held for k, held in self._held.items() if k[0] == blueprint}
        for gone in released:
            if gone not in still:
                self._nodes.pop((blueprint, gone), None)

    def open(self, address: dict[str, Any]) -> Store | None:
        """The shared store at ``address``, opened once; None when this host cannot open it
        (a signed store whose key this process lacks, a bucket it cannot reach), which is
        tried again on the next job."""
        named = canonical.encode(address, "a store's address")
        found = self._stores.get(named)
        if found is None:
            try:
                found = Store.from_address(address)
            except StoreError:
                return None
            self._stores[named] = found
        return found

    def run(
        self,
        job: Job,
        payloads: Sequence[Buffer],
        state: Buffer | None = None,
    ) -> Reply | NeedState:
        """Runs ``job`` on inputs ``payloads``, in the store the job names (opened here). For
        a node that holds a state this host has not loaded, :class:`NeedState` when
        ``state`` (its bytes) is not given."""
        node = self.node(
            job.blueprint,
            job.state,
            state,
            name=job.name,
            holder=job.holder,
            fingerprint=job.fingerprint,
        )
        if node is None:
            assert job.state is not None
            return NeedState(job.state)
        self.same_code(node, job.fingerprint, job.name)
        try:
            inputs = [unpack(codec, data) for codec, data in zip(job.codecs, payloads, strict=True)]
        except Unreadable as why:
            raise unreadable_input(job.name, self.worker, why) from None
        store = self.open(job.store) if job.store is not None else None
        ctx = Context(
            name=job.name,
            key=job.key,
            keys=job.keys,
            worker=self.worker,
            store=store,
            precision=job.precision or None,
        )
        before = held_by(node)
        # Watched from here (a torch module's settings, first watched now), so that what its
        # forward changes of what it keeps is seen after it (:meth:`_look_again`).
        node.declaration_moved()
        start = time.perf_counter_ns()
        try:
            # The caller's grad mode and autocast, as with no broker.
            with (
                self.stoppable(),
                _grad_mode(job.grad),
                _autocast(job.autocast, job.autocast_cache),
                _in_precision(job, self.apart),
            ):
                if self.let_go:  # as one interrupted before its forward began
                    raise KeyboardInterrupt
                _refuse_other_precision(job, self.worker, self.apart)
                value = node.forward(*inputs, ctx)
                if _needs_grad(value):
                    raise answer_needs_grad(job.name, self.worker)
        except BaseException as stop:
            if not isinstance(stop, Exception):  # interrupted partway: it may be half changed
                self._drop(node)
            raise
        finally:
            changed = self._look_again(node, before, job.state)
        took = (time.perf_counter_ns() - start) // 1000
        if job.readers:
            where = f"the answer of `{job.name}`, crossing back from worker `{self.worker}` to " + (
                ", ".join(f"`{r}`" for r in job.readers)
            )
        else:
            where = f"the answer of `{job.name}`, crossing back from worker `{self.worker}`"
        codec, data = pack(value, where)
        # Checked before the forward, and again after it: code changed while it ran (a
        # method set on its class by another thread) may have computed the answer. Nor is
        # an answer kept whose forward changed what the node keeps: a recall would not.
        moved = changed or not _written_as(node, job.fingerprint)
        kept = None
        if job.keep and job.key is not None and store is not None and not self.let_go and not moved:
            try:
                kept = store.keep(job.key, data, codec, job.kept_with).size
            except StoreError:
                kept = None  # nothing half-written is visible; the client keeps it instead
        return Reply(codec, data, took, kept, moved)
