"""Nodes (and a torch module) the broker tests place on workers, in a module so another
process can import them."""

from __future__ import annotations

import functools
import json
import os
import random
import threading
import time
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import blake3
import torch
from torch import nn

from somatize import Graph, Node


class Products(Node):
    """Answers its input (a matrix) times itself transposed: a product autocast lowers."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x @ x.T


class Nap(Node):
    """Sleeps ``seconds`` (first touching ``marker``, when given), then hands its input on."""

    def __init__(self, seconds: float, tag: str = "", marker: str = "") -> None:
        self.seconds = seconds
        self.tag = tag
        self.marker = marker

    def forward(self, value: Any, ctx: Any) -> Any:
        if self.marker:
            Path(self.marker).touch()
        time.sleep(self.seconds)
        return value


class SlowToBuild(Node):
    """Built in ``seconds`` where ``marker`` exists (on a worker, once a test touched it),
    at once elsewhere — in process ``home`` too, where its graph is made and a broker
    checks it can be rebuilt; hands its input on."""

    def __init__(self, seconds: float, marker: str, home: int) -> None:
        self.seconds = seconds
        self.marker = marker
        self.home = home
        if os.getpid() != home and Path(marker).exists():
            time.sleep(seconds)

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class ExitsWhenBuilt(Node):
    """Ends the process it is built in (a worker running out of memory as it loads the
    node), unless that is process ``home``, where its graph is made; hands its input on."""

    def __init__(self, home: int) -> None:
        self.home = home
        if os.getpid() != home:
            os._exit(3)

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class RaisesWhenBuilt(Node):
    """Raises an :class:`Abort` (touching ``marker`` when unpickled) as it is built in any
    process but ``home``, where its graph is made; hands its input on."""

    def __init__(self, home: int, marker: str) -> None:
        self.home = home
        self.marker = marker
        if os.getpid() != home:
            raise Abort(marker)

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class Drifts(Node):
    """Scales by ``by``, then keeps twice as much in ``by`` as a Fraction, which has no
    canonical form: a node that changes an argument it keeps into what no key can name."""

    def __init__(self, by: float = 1.0) -> None:
        self.by = by

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        scaled = [v * float(self.by) for v in values]
        self.by = Fraction(float(self.by) * 2)
        return scaled


class Meet(Node):
    """Leaves a mark named ``tag`` in ``folder``, then waits up to ``seconds`` for the mark
    of ``other`` there, and hands its input on: two of them meet only when they run at
    once (run one after the other, the first waits in vain and raises)."""

    def __init__(self, folder: str, tag: str, other: str, seconds: float = 60.0) -> None:
        self.folder = folder
        self.tag = tag
        self.other = other
        self.seconds = seconds

    def forward(self, value: Any, ctx: Any) -> Any:
        Path(self.folder, self.tag).touch()
        waited = 0.0
        while not Path(self.folder, self.other).exists():
            if waited > self.seconds:
                raise TimeoutError(f"`{self.tag}` never met `{self.other}`: they ran apart")
            time.sleep(0.02)
            waited += 0.02
        return value


RUNNING = {"now": 0, "most": 0}
"""How many :class:`Overlap` nodes run at this moment, and the most that ever ran at once."""
_RUNNING = threading.Lock()


class Overlap(Node):
    """Counts itself running in :data:`RUNNING` for ``seconds`` (touching ``marker`` first,
    when given), then hands its input on."""

    def __init__(self, seconds: float, marker: str = "") -> None:
        self.seconds = seconds
        self.marker = marker

    def forward(self, value: Any, ctx: Any) -> Any:
        with _RUNNING:
            RUNNING["now"] += 1
            RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
        try:
            if self.marker:
                Path(self.marker).touch()
            time.sleep(self.seconds)
        finally:
            with _RUNNING:
                RUNNING["now"] -= 1
        return value


class Blob:
    """A value no codec writes."""


class MakesBlob(Node):
    """Answers a :class:`Blob`, which cannot cross a wire."""

    def forward(self, value: Any, ctx: Any) -> Blob:
        return Blob()


class Tagged(Node):
    """Answers ``[tag, n]``; its own ``declare()`` says only what decides its answer."""

    def __init__(self, tag: str, verbose: bool = False) -> None:
        self.tag = tag
        self.verbose = verbose

    def declare(self) -> dict[str, Any]:
        return {"tag": self.tag}

    def forward(self, values: list[int], ctx: Any) -> list[Any]:
        return [self.tag, len(values)]


class Weights(Node):
    """A node holding state its constructor does not rebuild."""

    holds_state = True

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class Holds(Node):
    """Built from an object with no canonical form (and declaring only its name)."""

    def __init__(self, thing: object) -> None:
        self.thing = thing

    def declare(self) -> dict[str, Any]:
        return {"thing": type(self.thing).__name__}

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class Where(Node):
    """Answers where it ran: the process id, the worker, and the key it was told."""

    def forward(self, value: Any, ctx: Any) -> list[Any]:
        return [os.getpid(), ctx.worker, ctx.key]


class StoreSeen(Node):
    """Answers how the store it was handed was opened where it ran: whether read-only, and
    whether it may be written."""

    def forward(self, value: Any, ctx: Any) -> list[bool]:
        return [ctx.store.read_only, ctx.store.writable()]


class Frames(Node):
    """Rows in, one list of word lengths per message out (seed 001's Clean)."""

    def forward(self, frame: Any, ctx: Any) -> list[list[float]]:
        return [[float(len(word)) for word in one.split()] for one in frame.column("sms")]


class Length(Node):
    """How many rows a frame brought."""

    def forward(self, frame: Any, ctx: Any) -> int:
        return len(frame)


class Widest(Node):
    """How long the longest message in the batch was (seed 001's Widest)."""

    def forward(self, counts: list[list[float]], ctx: Any) -> float:
        return float(max(len(one) for one in counts))


class Encoder(nn.Module):
    """A small encoder whose state is weights, BatchNorm statistics and a buffer that is
    not in its ``state_dict`` — all of which must reach a worker."""

    def __init__(self, width: int, out: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(width, out)
        self.norm = nn.BatchNorm1d(out)
        self.register_buffer("scale", torch.full((out,), 2.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x)) * self.scale


class WeightNormed(nn.Module):
    """An encoder normalised by torch's older ``weight_norm``, whose forward pre-hook sets
    the weight it works out from ``weight_g`` and ``weight_v`` as a plain tensor."""

    def __init__(self, width: int, out: int = 3) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated, still in use
            self.linear = nn.utils.weight_norm(nn.Linear(width, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Convolved(nn.Module):
    """Two convolutions, which pick their path (and the layout of what they answer) by the
    memory format of their weights as of their input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(channels, channels, 3, padding=1)
        self.second = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x).relu())


class Counting(nn.Module):
    """Counts its calls in a buffer its forward updates, and adds the count to its answer
    (as a running statistic or a step would)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) + self.calls


class Gained(nn.Module):
    """Sets its gain from the first batch it is handed, and scales every answer by it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)
        self.gain: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gain is None:
            self.gain = float(x.abs().max())
        return self.linear(x) * self.gain


class Widthed(nn.Module):
    """Notes the width of what it is handed at every call: the value it held, a new
    ``int`` object each time (past those CPython keeps one of)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.width = x.shape[-1]
        return self.linear(x)


def _applied(parts: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for part in parts:
        x = part(x)
    return x


class Projected(nn.Module):
    """A linear layer, then one a partial it keeps binds: no part of the module, so its
    constructor draws weights of its own for it in each process that builds it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 3)
        self.then = functools.partial(_applied, [nn.Linear(3, 3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.then(self.linear(x))
        return out


class KeptInAList(nn.Module):
    """A linear layer, then one it keeps in a plain list: no part of the module, so its
    constructor draws weights of its own for it in each process that builds it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 3)
        self.then = [nn.Linear(3, 3)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _applied(self.then, self.linear(x))


NORM = nn.LayerNorm(3)
"""A module of torch's own classes a node's module reads from a global, trainable."""


class Normed(nn.Module):
    """A linear layer, then the global ``NORM``: the same object on a worker in this
    process, one of its own in another."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = NORM(self.linear(x))
        return out


class Recurrent(nn.Module):
    """An LSTM over each row's values, answering its last hidden state: an RNN keeps its
    parameters in a plain list too (``_flat_weights``)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(1, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.rnn(x.unsqueeze(-1))[0][:, -1]
        return out


class Ramp(Node):
    """Rows ``at`` to ``at + take`` of a fixed float matrix ``width`` columns wide."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.calls = 0

    def forward(self, span: dict[str, int], ctx: Any) -> torch.Tensor:
        self.calls += 1
        start, take = span["at"] * self.width, span["take"]
        values = torch.arange(start, start + take * self.width, dtype=torch.float32)
        return values.reshape(take, self.width) / 10


class Doubled(Node):
    """Its input tensor, as float64."""

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        return x.double()


class Doubled2(Node):
    """Twice each tensor of ``{"y": [tensors]}``."""

    def forward(self, value: dict[str, list[torch.Tensor]], ctx: Any) -> Any:
        return {"y": [t * 2 for t in value["y"]]}


class Weighted(Node):
    """Multiplies every item by the sum of ``weights``, a list the caller may change."""

    def __init__(self, weights: list[float]) -> None:
        self.weights = weights

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * sum(self.weights) for v in values]


def weighted(weights: list[float], worker: str | None = None) -> Graph:
    """Rows, each multiplied by the sum of ``weights`` (on ``worker``), and the largest of
    them, kept."""
    node = Weighted(weights).named("weighted").frozen()
    if worker is not None:
        node.at(worker)
    from tests.nodes import Largest, Rows

    return Graph.somatize(
        Rows().named("rows").frozen() >> node >> Largest().named("top").frozen().cached()
    )


def napping(marker: Path, seconds: float) -> Graph:
    """Rows, then node `a` napping ``seconds`` on worker `w1` (touching ``marker`` as it
    starts) and node `b` queued behind it there, then their sum: a forward that waits on
    its worker."""
    from tests.nodes import Add, Rows

    return Graph.somatize(
        Rows().named("rows")
        >> (
            Nap(seconds, "a", marker=str(marker)).named("a").at("w1"),
            Nap(0.0, "b").named("b").at("w1"),
        )
        >> Add().named("sum")
    )


class Grows(Node):
    """Appends to the list it is handed (in place, as careless code does) and answers how
    long it is now."""

    def forward(self, values: list[Any], ctx: Any) -> int:
        values.append(0)
        return len(values)


class Three(Node):
    """Gathers its three inputs into a list."""

    def forward(self, a: Any, b: Any, c: Any, ctx: Any) -> list[Any]:
        return [a, b, c]


class Seeded(Node):
    """Declares a seed it draws itself, so a node rebuilt from its arguments declares
    another one: no other process can make the same node."""

    def __init__(self, k: int = 1) -> None:
        self.k = k
        self.seed = random.random()

    def declare(self) -> dict[str, Any]:
        return {"k": self.k, "seed": self.seed}

    def forward(self, value: Any, ctx: Any) -> Any:
        return value


class SeedsItself(Node):
    """Draws a seed of its own into a public attribute, which it does not declare: a node
    rebuilt from its (no) arguments holds another seed, and answers otherwise."""

    def __init__(self) -> None:
        self.seed = random.random()

    def forward(self, value: float, ctx: Any) -> float:
        return value + self.seed


class Times(Node):
    """Multiplies by ``k``, a public attribute its constructor sets to 1."""

    def __init__(self) -> None:
        self.k = 1

    def forward(self, value: float, ctx: Any) -> float:
        return value * self.k


class Listed(Node):
    """Holds its weights, its state, as a list it hands over as JSON, and beside them a
    public setting, ``scale``, that is no part of its state."""

    holds_state = True

    def __init__(self) -> None:
        self.weights = [1.0]
        self.scale = 1.0

    def settled_state(self) -> str:
        return "blake3:" + blake3.blake3(self.state_bytes()).hexdigest()

    def state_bytes(self) -> bytes:
        return json.dumps(self.weights).encode()

    def load_state(self, data: memoryview) -> str:
        self.weights = json.loads(bytes(data))
        return self.settled_state()

    def forward(self, value: float, ctx: Any) -> float:
        return value * self.weights[0] * self.scale


class ScaleOtherwise(Node):
    """``tests.nodes:Scale`` as another version of the code would write it: the same
    constructor and declaration, another answer."""

    def __init__(self, by: float = 2.0) -> None:
        self.by = by

    def forward(self, values: list[float], ctx: Any) -> list[float]:
        return [v * self.by + 1000 for v in values]


class Nested(Node):
    """Runs ``inner`` with ``broker`` from inside its own forward (a composed pipeline);
    only a local worker can run it, since it holds live objects."""

    def __init__(self, inner: Graph, broker: Any) -> None:
        self.inner = inner
        self.broker = broker

    def declare(self) -> dict[str, Any]:
        return {}

    def forward(self, value: Any, ctx: Any) -> Any:
        return self.inner.forward(value, broker=self.broker)


def _unpickled(marker: str) -> RuntimeError:
    Path(marker).touch()
    return RuntimeError("unpickled")


class Abort(BaseException):
    """A BaseException of a node's own that, unpickled, touches ``marker``."""

    def __init__(self, marker: str) -> None:
        super().__init__("stop right there")
        self.marker = marker

    def __reduce__(self) -> Any:
        return (_unpickled, (self.marker,))


class RaisesBase(Node):
    """Raises a BaseException: an :class:`Abort` (touching ``marker`` when unpickled), a
    ``KeyboardInterrupt``, or ``SystemExit``, as ``kind`` says."""

    def __init__(self, kind: str, marker: str = "") -> None:
        self.kind = kind
        self.marker = marker

    def forward(self, value: Any, ctx: Any) -> Any:
        if self.kind == "abort":
            raise Abort(self.marker)
        if self.kind == "interrupt":
            raise KeyboardInterrupt("interrupted")
        raise SystemExit(3)


class RaisesOwn(Node):
    """Raises an error of somatize's own classes, as a node's own code may (a nested
    forward's NodeFailed, a store's StoreError, a nested forward's WatcherFailed holding
    that forward's answer): ``failed``, ``store`` or ``watcher``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def forward(self, value: Any, ctx: Any) -> Any:
        from somatize import NodeFailed, StoreError, WatcherFailed

        if self.kind == "failed":
            raise NodeFailed("inner", "Inner", ValueError("an inner node failed"))
        if self.kind == "watcher":
            fact = {"fact": "ran", "node": "inner"}
            raise WatcherFailed(fact, ValueError("the callback failed"), value)
        raise StoreError("the node's own store refused")


class Unprintable(Exception):
    """An exception whose message cannot be read: ``str()`` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("this message cannot be read")


class RaisesUnprintable(Node):
    """Raises an :class:`Unprintable`."""

    def forward(self, value: Any, ctx: Any) -> Any:
        raise Unprintable()


class Remembers(Node):
    """Doubles a value, remembering each answer in a public dict it fills as it runs."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def forward(self, value: float, ctx: Any) -> float:
        self.seen[str(value)] = value * 2
        return value * 2


class Stepper(Node):
    """Adds its step, an argument it keeps and advances itself at each run."""

    def __init__(self, step: int = 0) -> None:
        self.step = step

    def forward(self, value: float, ctx: Any) -> float:
        self.step += 1
        return value + self.step


class Seen(Node):
    """Adds how many times it ran before, counted in a public attribute its constructor
    does not make: the attribute appears as it first runs."""

    def forward(self, value: float, ctx: Any) -> float:
        seen = getattr(self, "seen", 0)
        self.seen = seen + 1
        return value + seen


class Exits(nn.Module):
    """Ends the process it runs in (a worker running out of memory on its first forward
    after loading its weights)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os._exit(3)


LOADED: list[str] = []
"""Each model :class:`LoadsOnFirstUse` loaded, in this process."""


class Doubler:
    """A model that is no value: it has no canonical form."""

    def __call__(self, value: float) -> float:
        return value * 2


class LoadsOnFirstUse(Node):
    """Loads the model ``model`` names as it first runs, keeping it where None was; the
    model has no canonical form."""

    def __init__(self, model: str = "small") -> None:
        self.name = model
        self.model: Doubler | None = None

    def forward(self, value: float, ctx: Any) -> float:
        if self.model is None:
            LOADED.append(self.name)
            self.model = Doubler()
        return self.model(value)


class Window(Node):
    """Adds how many items the list it was built with holds now; it keeps the list."""

    def __init__(self, recent: list[int]) -> None:
        self.recent = recent

    def forward(self, value: float, ctx: Any) -> float:
        return value + len(self.recent)


class Tally(Node):
    """Doubles a value, counting its calls in a public dict of fixed keys."""

    def __init__(self) -> None:
        self.stats = {"calls": 0}

    def forward(self, value: float, ctx: Any) -> float:
        self.stats["calls"] += 1
        return value * 2


class Lazy(Node):
    """Multiplies by its first weight, setting its weights up at its first run."""

    def __init__(self) -> None:
        self.weights: list[float] | None = None

    def forward(self, value: float, ctx: Any) -> float:
        if self.weights is None:
            self.weights = [1.0, 1.0]
        return value * self.weights[0]


class Picks(Node):
    """Answers the items of its input at the names of ``order``, in the order the dict it is
    built with holds them, and the type of ``raw``, a buffer it is built with."""

    def __init__(self, order: dict[str, int], raw: Any = b"") -> None:
        self.order = order
        self.raw = raw

    def forward(self, value: dict[str, Any], ctx: Any) -> list[Any]:
        return [[value[name] for name in self.order], type(self.raw).__name__]


class Spin(Node):
    """Waits for the file ``after`` (when given), touches ``marker``, then loops in Python —
    short naps, never one long C call — until the file ``until`` exists (or ten minutes
    have passed), and hands its input on: a node an interrupt can land in at once. One
    that ``swallows`` catches a KeyboardInterrupt and answers anyway; one that ``lingers``
    takes that many seconds (cleaning up) before it lets a KeyboardInterrupt go on."""

    def __init__(
        self,
        marker: str,
        until: str,
        after: str = "",
        swallows: bool = False,
        lingers: float = 0.0,
    ) -> None:
        self.marker = marker
        self.until = until
        self.after = after
        self.swallows = swallows
        self.lingers = lingers

    def forward(self, value: Any, ctx: Any) -> Any:
        deadline = time.monotonic() + 600.0
        while self.after and not os.path.exists(self.after) and time.monotonic() < deadline:
            time.sleep(0.01)
        Path(self.marker).touch()
        try:
            while not os.path.exists(self.until) and time.monotonic() < deadline:
                time.sleep(0.01)
        except KeyboardInterrupt:
            time.sleep(self.lingers)
            if not self.swallows:
                raise
        return value


def spinning(folder: Path, *, swallows: bool = False) -> Graph:
    """Rows, then a cached `fine` on worker `w2`, which answers at once, and a cached `spin`
    on worker `w1` (a :class:`Spin` that starts once ``folder/fine-kept`` exists, touches
    ``folder/started`` and loops until ``folder/go`` exists), then their sum."""
    from tests.nodes import Add, Rows, Scale

    spin = Spin(str(folder / "started"), str(folder / "go"), str(folder / "fine-kept"), swallows)
    return Graph.somatize(
        Rows().named("rows").frozen()
        >> (
            Scale(2.0).named("fine").frozen().cached().at("w2"),
            spin.named("spin").frozen().cached().at("w1"),
        )
        >> Add().named("sum")
    )


def returning_interrupted(broker: Any, node: str, started: Path) -> Any:
    """A subclass of the broker class ``broker`` whose ``submit`` of ``node`` raises
    KeyboardInterrupt as it returns, once ``started`` exists (the node began on its
    worker): a Ctrl-C landing there, before the forward holds the call."""

    class Returning(broker):  # type: ignore[misc,valid-type]
        def submit(self, graph: Graph, name: str, *args: Any, **kwargs: Any) -> Any:
            future = super().submit(graph, name, *args, **kwargs)
            if name != node:
                return future
            waited = time.monotonic()
            while not started.exists() and time.monotonic() - waited < 60:
                time.sleep(0.001)
            raise KeyboardInterrupt  # the Ctrl-C, landing as submit returns

    return Returning


class Stuck(Node):
    """Touches ``marker``, then loops until the file ``until`` exists, ignoring every
    KeyboardInterrupt sent to it — a node no interrupt stops — and hands its input on."""

    def __init__(self, marker: str, until: str) -> None:
        self.marker = marker
        self.until = until

    def forward(self, value: Any, ctx: Any) -> Any:
        Path(self.marker).touch()
        deadline = time.monotonic() + 600.0
        while not os.path.exists(self.until) and time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except KeyboardInterrupt:
                continue
        return value


class ChangesItsCode(Node):
    """Adds one to each item, by a method it gives its class other code for first (adding a
    thousand), as a node that patches code while it runs on a worker does; declared mapped
    in the tests."""

    def forward(self, items: list[int], ctx: Any) -> list[int]:
        type(self).add = _add_a_thousand  # type: ignore[method-assign]
        return [self.add(item) for item in items]

    def add(self, item: int) -> int:
        return item + 1


def _add_a_thousand(self: ChangesItsCode, item: int) -> int:
    return item + 1000


class AnswersUnloaded(Node):
    """Answers a dataclass of a module its forward alone loads (as an ``import`` inside it
    would), so a process that only calls the graph has not loaded its class."""

    def forward(self, n: int, ctx: Any) -> Any:
        return _unloaded_output()(hidden=torch.arange(float(n)) * 2)


def _unloaded_output() -> type:
    import dataclasses
    import sys
    import types

    module = sys.modules.get("somatize_loaded_by_forward")
    if module is None:
        module = types.ModuleType("somatize_loaded_by_forward")

        @dataclasses.dataclass
        class Output:
            hidden: torch.Tensor

        Output.__module__, Output.__qualname__ = module.__name__, "Output"
        module.Output = Output  # type: ignore[attr-defined]
        sys.modules[module.__name__] = module
    return module.Output  # type: ignore[no-any-return]


class Hidden(Node):
    """The ``hidden`` field of the dataclass it is handed."""

    def forward(self, out: Any, ctx: Any) -> torch.Tensor:
        return out.hidden + 0
