"""Nodes, and the expressions that chain them.

A node is one step of a pipeline: ``forward(x, ctx)`` takes what its
predecessors produced (one positional argument each, in the order they were
chained) and a context, and returns a value. A dataset source is a node like
any other; so is a frozen encoder.

What a node *is*, for a key, is two things: its class (the identity) and the
arguments that built this instance (the declaration). The declaration is
captured from the constructor call automatically, so ``Embed(512)`` and
``Embed(64)`` get different keys without anybody writing a line; what the
constructor then sets on ``self`` — a call counter, a cache — is not part of it (and
such a public attribute, replaced from outside the node, has it refused where it is keyed:
:meth:`Node.set_up_attributes`).
An argument with no canonical form (a store, a module) cannot be written into a
key, and such a node says what it is with its own ``declare()``.

The chainable declarations (``.named``, ``.frozen``, ``.cached``, ``.mapped``,
``.at``) are only said here; the graph copies them into its memory and
placement when it is built. The node holds no caching logic. Once a node is in
a graph, what was said about it is settled: saying something else then is
refused (:class:`AlreadyBuilt`), since that graph would go on as it was built. A
copy of a node (``copy.copy``, ``copy.deepcopy``) starts with what was said about
the original, as its own, and is in no graph until one is built with it.

A declaration captured from the constructor holds the arguments themselves, so
one built with a list or a dict can change after the graph is built when
somebody changes that list; such a node's declaration is derived again at the
start of each forward (:meth:`Node.is_declaration_fixed`). So can one whose list or
dict is left to its default, which every instance shares. What the constructor made
from such a list (``self.total = sum(items)``) is made from it as it was then, so the
call is noted as it was, defaults filled in (:attr:`Marks.made_with`), and a node whose
list changed since, and that still holds what the old one made, is refused where it is
keyed.

A ``declare()`` says what distinguishes instances of the class that wrote it. A
subclass that defines its own constructor, with other parameters than that
class's, has arguments the ``declare()`` it inherits may not say: it cannot be
keyed (:class:`Undeclared`) until it writes a ``declare()`` of its own that adds
them to ``super().declare()``. The call a node is made with is what ``Node.__new__`` is
handed, so a class that defines its own ``__new__`` (which may hand it nothing) is not
declared by its call, nor rebuilt from it, until it writes ``declare()`` (and
``recipe()``).

Chaining: ``a >> b`` feeds ``a`` into ``b``; a tuple fans out or in —
``a >> (b, c)`` feeds ``a`` to both, ``(a, b) >> c`` hands ``c`` both outputs
as two positional arguments.

What built a node is read from its constructor call in :mod:`somatize._calls`: the
arguments by parameter name, defaults filled in, and the call as it was made when it holds
a list or a dict. What a node holds besides what built it — its attributes, those in slots
too, and which of them tell two nodes apart (:func:`held_by`) — is read in
:mod:`somatize._held`.
"""

from __future__ import annotations

import functools
import inspect
import unicodedata
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from types import FunctionType
from typing import Any, TypeVar

from somatize import canonical
from somatize._calls import (
    _FACTORY_MADE,
    _factories,
    _signature,
    _unsaid,
    _unsaid_in,
    arguments_of,
    declared_arguments,
    noted_call,
    own_new,
)
from somatize._held import UNSET as UNSET
from somatize._held import (
    Holding,
    attributes_of,
    digest_of,
    held_by,
    holding_of,
    in_slot,
    running_here,
    slots_of,
)
from somatize._threads import ProcessLock
from somatize.errors import SomatizeError

__all__ = [
    "AlreadyBuilt",
    "Context",
    "Expr",
    "Node",
    "Undeclared",
    "attributes_of",
    "digest_of",
    "held_by",
    "holding_of",
    "holds_state",
    "in_slot",
    "keyed_by_state",
    "restates",
    "running_here",
    "says_state",
    "sees_state",
    "settled_watch",
    "slots_of",
    "state_held",
    "tells_state",
    "watches_settled",
]

_Said = TypeVar("_Said", bound="Node")
"""A node, as what is said about it (``.named()``, ``.frozen()``…) hands it back: of its own
class, so that a checker still sees its attributes."""


class Undeclared(SomatizeError, TypeError):
    """A node whose declaration cannot be written into a key."""


class AlreadyBuilt(SomatizeError, ValueError):
    """Something said about a node after it joined a graph, which would not hear it."""


@dataclass
class Marks:
    """What was said about one node before it joined a graph."""

    call: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
    name: str | None = None
    identity: str | None = None
    frozen: bool = False
    state: str | None = None
    cached: bool = False
    salt: str | None = None
    mapped: bool = False
    worker: str | None = None
    built: bool = False
    """Whether a graph was built with the node; what is said about it is then settled."""
    moved: int = 0
    """How many times a graph holding the node heard that its state, or what it declares,
    changed (:meth:`Node.restate`, :meth:`Node.declaration_moved`): a node tells a change
    once, to whichever graph asks first, and every other graph built with it follows the
    change at its next forward, where it finds the count past the one it last followed."""
    retaken: int = 0
    """How many times a graph holding the node took an attribute replaced since as its
    argument (:meth:`Node.retake`): every other graph built with the node finds the count
    past the one it last looked at, and takes what the node holds against the call it is
    noted as made with now — a value given back since is the argument again there, though
    it is what that graph last saw."""
    holding: Holding | None = None
    """What a copy of the node rebuilt elsewhere must hold, once asked
    (:func:`~somatize.node.holding_of`); a copy of the node (``copy.copy``) has its own."""
    made_with: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    """For a node declared by its constructor arguments where one of them is a list or a
    dict, passed or left to its default: the call its attributes were made from
    (:func:`~somatize._calls.noted_call`) — as it was when the node was made, or since
    found to make what the node holds. A list changed in place afterwards is told apart
    from it (:func:`~somatize.plan.look_again`)."""
    made: dict[str, Any] | None = None
    """Once its constructor has returned: what the node held then under the name of each
    argument of its call (each parameter's, and each keyword a ``**kwargs`` took), for a
    node declared by its constructor arguments. A graph looks at the node from there, so a
    value given to such an attribute before the graph is built (``s = Scale(2.0); s.by =
    5.0``, through ``vars(s)`` too, or calling ``__init__`` again) is followed as one given
    after the build is (:meth:`Node.kept_arguments`). None while the node is being made;
    for a class whose constructor does not say when it returns (a mixin's, or one whose
    metaclass has a ``__call__`` of its own: :func:`_watch_making`), worked out at the
    build (:meth:`Node._as_constructed`)."""
    set_up: dict[str, Any] | None = None
    """Once its constructor has returned: each public attribute it set that is not named like
    an argument of its call, with what it held then, for a node declared by its constructor
    arguments (:meth:`Node.set_up_attributes`). None when that is not known: none is watched."""
    making: int = 0
    """How many of the node's own constructors are running (one calls another through
    ``super().__init__``): it is made when the outermost returns."""
    unmade: bool = False
    """Whether a build from its call, to tell what it was made with, failed
    (:meth:`Node._as_constructed`): it is not tried again."""


_LINE_BREAKING = frozenset(("Cc", "Zl", "Zp"))
"""The categories of characters a name may not hold: control characters, and the line and
paragraph separators (U+2028, U+2029), which end a line as a newline does."""


def _one_line(name: object) -> bool:
    """Whether ``name`` may name a node or a worker: a non-empty str with no control
    character nor line separator, as facts, errors and figures show it on one line."""
    return (
        isinstance(name, str)
        and bool(name)
        and all(unicodedata.category(char) not in _LINE_BREAKING for char in name)
    )


def _check_worker_name(name: object) -> None:
    """Refuses ``name`` for a worker unless it may name one (:func:`_one_line`): alike where
    a broker is given its workers and where ``.at()`` places a node, so that a node can be
    placed on every worker a broker has."""
    if not _one_line(name):
        raise ValueError(
            "a worker is named by a non-empty str with no control characters (a newline, "
            "a tab, an escape) nor line separators (U+2028): facts, errors and figures show "
            f"it as one line, got {name!r}"
        )


_DECLARATION = b"somatize/declaration\0"
"""What a declaration's digest is prefixed with, so that it is no other value's."""


_HOLDS_STATE: list[Callable[[Any], bool | str]] = []
"""What libraries that know a kind of node say of whether one holds state its class does not
say it holds (``somatize.torch``: a node that is an ``nn.Module``, or keeps one with weights):
False, True, or what it holds, in words."""


def holds_state(node: Any) -> bool:
    """Whether ``node`` holds state a frozen declaration must be settled at: its class says so
    (``holds_state = True``), or a library registered with :func:`sees_state` does."""
    return bool(node.holds_state) or any(sees(node) for sees in _HOLDS_STATE)


def says_state(node: Any) -> bool:
    """Whether ``node`` says the state it is frozen at itself (``settled_state()``, as a data
    source does), so that ``somatize.data.settle`` settles it: its state, held whether or not
    its class says ``holds_state``, is known only once it is settled."""
    return callable(getattr(node, "settled_state", None))


def keyed_by_state(node: Any) -> bool:
    """Whether ``node``, frozen, is keyed by a state it is settled at: it holds one
    (:func:`holds_state`) or says its own (:func:`says_state`); until settled it has none
    to be keyed by."""
    return holds_state(node) or says_state(node)


def state_held(node: Any) -> str | None:
    """What a library registered with :func:`sees_state` says ``node`` holds, in words
    ("keeps `self.encoder`, an nn.Module with weights"), where its class does not say it holds
    state and the library says more than that it does; None otherwise."""
    if node.holds_state:
        return None
    for sees in _HOLDS_STATE:
        said = sees(node)
        if isinstance(said, str):
            return said
    return None


def sees_state(sees: Callable[[Any], bool | str]) -> None:
    """Registers ``sees``, which says of a node whether it holds state its class does not say
    it holds — False, True, or what it holds, in words, for the refusal to name
    (idempotent): ``somatize.torch`` registers one for nodes that are or keep modules."""
    if sees not in _HOLDS_STATE:
        _HOLDS_STATE.append(sees)


_WATCHES_SETTLED: list[Callable[[Any], Callable[[], str | None] | None]] = []
"""What libraries that know a kind of state give a node settled by its ``settled_state()``
to watch what it holds (``somatize.torch``: the modules it keeps), or None."""


def watches_settled(watch_of: Callable[[Any], Callable[[], str | None] | None]) -> None:
    """Registers ``watch_of``, which gives a node about to be settled by its
    ``settled_state()`` a watch of the state it holds, or None where it holds none the
    library knows (idempotent). The watch, asked at every forward, answers what changed
    since, in words, or None: ``settled_state()`` is the node's own, and a change it does not
    hear (a module's weights stepped in place) would be keyed by the state before. A watch
    with a ``holds_as(later)`` method says whether the state held the same values when the
    watch ``later`` was taken: a touch that leaves them equal (weights moved away and back)
    goes on, a change ``settled_state()`` does not hear is refused."""
    if watch_of not in _WATCHES_SETTLED:
        _WATCHES_SETTLED.append(watch_of)


def settled_watch(node: Any) -> Callable[[], str | None] | None:
    """A watch of what ``node`` holds (:func:`watches_settled`), or None where no library
    watches it."""
    for watch_of in _WATCHES_SETTLED:
        watch = watch_of(node)
        if watch is not None:
            return watch
    return None


_RESTATES: list[tuple[type, Callable[[Any], str | None]]] = []
"""What libraries that know a kind of node answer for :meth:`Node.restate` of a node of that
kind whose class writes none of its own (``somatize.torch``: a node that is itself an
``nn.Module``, whose weights ``freeze`` settles), each with the kind."""


def restates(kind: type, restate: Callable[[Any], str | None]) -> None:
    """Registers ``restate`` as :meth:`Node.restate` of a node that is also a ``kind`` and
    whose class writes none of its own (idempotent): ``somatize.torch`` registers one for
    nodes that are themselves ``nn.Module`` objects, whose weights change after ``freeze``
    (a checkpoint loaded) without their class saying how to see it."""
    if (kind, restate) not in _RESTATES:
        _RESTATES.append((kind, restate))


def tells_state(node: Any) -> bool:
    """Whether ``node`` can tell that its state changed: its class writes
    :meth:`Node.restate`, or a library registered one for a kind it is (:func:`restates`).
    A graph asks only such nodes, at every forward."""
    return type(node).restate is not Node.restate or any(
        isinstance(node, kind) for kind, _ in _RESTATES
    )


class Node:
    """A step of a pipeline. Subclass it and write ``forward(self, x, ctx)``.

    Class attributes a subclass may set:

    - ``holds_state``: True when the node holds state that a frozen declaration
      must be settled at (weights, a dataset version) — running it frozen and
      cached before somebody settles it is refused. Such a node crosses to a
      network worker only when it can hand its state over: its class writes
      :meth:`state_bytes` and :meth:`load_state`.
    - ``ignores_precision``: True when the node's answer does not depend on the
      precision a forward is called in — it computes with no torch (it reads rows,
      parses, counts) — so its key never names that precision (autocast, the default
      dtype, TF32: :mod:`somatize._precision`) and a network worker runs it whatever
      its process sets. A node that may compute with torch leaves it False.
    - ``identity``: a stable ``module:qualname`` to use instead of the class's own.
    """

    holds_state: bool = False
    ignores_precision: bool = False
    _smz: Marks

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Notes what the class and its module hold as they are made, before anything may
        set other values there: one set by hand later (a test's monkeypatch of a computed
        constant) is then told from what the text computed, whenever the class is first
        fingerprinted (:func:`_noted_as_made`)."""
        super().__init_subclass__(**kwargs)
        _noted_as_made(cls)

    def __new__(cls, *args: Any, **kwargs: Any) -> Node:
        self = super().__new__(cls)
        marks = Marks()
        _note_call(cls, marks, args, kwargs)
        object.__setattr__(self, "_smz", marks)
        _watch_making(cls)
        return self

    def __setstate__(self, state: Any) -> None:
        """Fills in a copy (``copy.copy``, ``copy.deepcopy``, an unpickled node): what the
        original holds, and what was said about it — as the copy's own, so that what is said
        to the copy afterwards (``.named("b").cached()``) leaves the original as it was. A
        copy has joined no graph, whatever the original joined: it joins one as a node just
        made would, and what is said to it before is what that graph takes."""
        held, slots = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
        if held:
            vars(self).update(held)
        for name, value in (slots or {}).items():
            setattr(self, name, value)
        marks = vars(self).get("_smz")
        if isinstance(marks, Marks):
            holding = marks.holding.copied() if marks.holding is not None else None
            made = dict(marks.made) if marks.made is not None else None
            set_up = dict(marks.set_up) if marks.set_up is not None else None
            copied = replace(
                marks, built=False, holding=holding, made=made, set_up=set_up, making=0
            )
            object.__setattr__(self, "_smz", copied)
            if made:
                self._same_as_made(made)

    def _same_as_made(self, made: dict[str, Any]) -> None:
        """In a copy carried through bytes (unpickled), where a number the constructor kept
        and the argument it was handed arrive as two objects, and so does what the node
        holds under that name: takes each, when it holds the argument's value, as the very
        argument, as it was in the original (a number cannot change in place, so which
        object holds it is not seen otherwise)."""
        bound = self._bound()
        if bound is None:
            return
        bound.apply_defaults()
        arguments = dict(_by_name(bound))
        held = vars(self)
        for name, was in made.items():
            argument = arguments.get(name, UNSET)
            if was is argument or type(argument) not in _ATOMIC:
                continue
            digest = digest_of(argument)
            if type(was) is type(argument) and digest_of(was) == digest:
                made[name] = argument
            now = held.get(name, UNSET)
            if now is not argument and type(now) is type(argument) and digest_of(now) == digest:
                held[name] = argument

    def forward(self, *inputs: Any) -> Any:
        """What this node computes: predecessors' outputs, then ``ctx``."""
        raise NotImplementedError(f"{type(self).__qualname__} has no forward(x, ctx)")

    def declare(self) -> Any:
        """What distinguishes this instance from another of its class, as a canonical value.

        By default: the constructor's arguments by parameter name, defaults filled
        in. Override it when the constructor takes something with no canonical
        form (return what, of it, decides the answers). A subclass whose constructor
        takes other parameters than the class that wrote the ``declare()`` it inherits
        writes its own, adding its arguments to ``super().declare()``. So does a class that
        defines its own ``__new__``: the call it was made with is not known
        (:func:`~somatize._calls.own_new`), and it is :class:`Undeclared` until it does.
        """
        return self._declared_by_call(None)

    def _declared_by_call(self, where: str | None) -> dict[str, Any]:
        """What the default :meth:`declare` says: the arguments of the call that made this
        node, by parameter name; :class:`Undeclared` when that call is not known."""
        kind = type(self)
        name = where or self._smz.name or kind.__qualname__
        owner = own_new(kind)
        if owner is not None:
            raise Undeclared(
                f"`{name}` ({kind.__qualname__}) cannot be keyed: `{owner.__qualname__}` "
                "defines its own `__new__`, and the call a node is made with is noted from "
                "what that `__new__` hands `Node.__new__` — nothing, for "
                "`super().__new__(cls)` — so the arguments it was built with are not known, "
                f"and two `{kind.__qualname__}`s built with different ones could share one "
                "key. Passing `*args, **kwargs` on to `super().__new__` is not enough: "
                f"nothing can tell that it does. Give `{kind.__qualname__}` a "
                "`declare(self)` method that returns, as canonical values, what "
                "distinguishes one instance from another, or drop its `__new__`"
            )
        args, kwargs = self._call()
        try:
            return declared_arguments(kind, args, kwargs)
        except TypeError as why:  # the call does not bind to the constructor's signature
            said = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            raise Undeclared(
                f"`{name}` ({kind.__qualname__}) cannot be keyed: the call it is noted as "
                f"made with, `{kind.__qualname__}({said})`, does not fit its constructor, "
                f"`__init__{_signature(kind)}` ({why}), so the arguments it was built with "
                "are not known: what `Node.__new__` was handed is not what `__init__` was "
                f"(a metaclass passed on other arguments). Give `{kind.__qualname__}` a "
                "`declare(self)` method that returns, as canonical values, what "
                "distinguishes one instance from another"
            ) from None

    def is_declaration_fixed(self) -> bool:
        """Whether :meth:`declare` says the same for as long as the node lives. When it
        may not, the graph derives the declaration again at the start of each forward, so
        its key, and a copy rebuilt on a worker, follow what it is now — a cost the node
        pays only then.

        By default: fixed when every constructor argument is an immutable value (a
        number, a str, bytes, None, tuples of them), and not when one is a list or a dict
        the caller can change in place. A node with its own :meth:`declare` is taken at its
        word when the graph is built (and by whoever settles it); override this to answer
        False when what it declares can change while the graph is in use.
        """
        if type(self).declare is not Node.declare or own_new(type(self)) is not None:
            return True  # taken at its word, or undeclared (nothing to follow)
        args, kwargs = self._call()
        bound = self._bound()
        if bound is not None:  # with its defaults, which declare() says too
            bound.apply_defaults()
            return canonical.is_immutable(tuple(arguments_of(bound).values()))
        return canonical.is_immutable((args, tuple(kwargs.values())))

    def kept_arguments(self) -> list[tuple[str, Any]]:
        """For a node declared by its constructor arguments (the default :meth:`declare`):
        each argument it keeps as an attribute of its parameter's name (``self.by = by``),
        with the object it was handed. The graph looks at these attributes at the start of
        each forward as the constructor left them: one replaced since (``scale.by = 3.0``,
        after the build or before it, once the constructor returned: :attr:`Marks.made`)
        is taken as the argument the node was built with (:meth:`retake`), so its key, and
        a copy rebuilt on a worker, follow what it computes with — unless its constructor
        made more from it (``self.factor = by * 2``) and that still holds what the old
        value made, or it was replaced by something with no canonical form (``self.path =
        Path(self.path)``, a node tidying its own argument): the node is then refused where
        it is keyed. An attribute made from the argument rather than the very object
        (``self.by = float(by)``) is not the argument: it is looked at as
        :meth:`named_like_arguments` says."""
        if type(self).declare is not Node.declare or own_new(type(self)) is not None:
            return []
        bound = self._bound()
        if bound is None:
            return []
        bound.apply_defaults()  # an argument left to its default is kept all the same
        held = self._held_as_made()
        return [
            (name, value) for name, value in _by_name(bound) if name in held and held[name] is value
        ]

    def named_like_arguments(self) -> list[tuple[str, Any]]:
        """For a node declared by its constructor arguments (the default :meth:`declare`):
        each public attribute named like one of its constructor's parameters that is not
        the argument it was handed — made from it (``self.by = float(by)``, ``self.items =
        list(items)``), or given by no constructor — with what the constructor left there.
        It is not taken as the argument: the graph looks at it at the start of each forward,
        and one replaced since by a value that is neither what it held then nor what a
        build from the node's arguments holds is refused where the node is keyed, since its
        key would go on naming what it was built with (see :meth:`kept_arguments`)."""
        if type(self).declare is not Node.declare or own_new(type(self)) is not None:
            return []
        bound = self._bound()
        if bound is None:
            return []
        bound.apply_defaults()
        held = self._held_as_made()
        return [
            (name, held[name])
            for name, value in _by_name(bound)
            if not name.startswith("_") and name in held and held[name] is not value
        ]

    def set_up_attributes(self) -> list[tuple[str, Any]]:
        """For a node declared by its constructor arguments (the default :meth:`declare`)
        that holds no state: each public attribute its constructor set that is not named
        like one of its parameters (``self.offset = 0.0``), with what the constructor left
        there (:attr:`Marks.set_up`) — but not one a method of its class other than a
        constructor sets (``self.calls += 1`` in its forward: its own business). It is in no
        key: the graph looks at it at the start of each forward as :meth:`named_like_arguments`
        says, and one replaced since, from outside the node, by a value that is neither what
        it held then nor what a build from the node's arguments holds, has the node refused
        where it is keyed."""
        set_up = self._smz.set_up
        if (
            not set_up
            or self.holds_state
            or type(self).declare is not Node.declare
            or own_new(type(self)) is not None
        ):
            return []
        own = _set_by_methods(type(self))
        if own is None:  # its methods may set any attribute: which are its own is not told
            return []
        names = self._argument_names()
        return [(name, value) for name, value in set_up.items() if name not in names | own]

    def retake(self, values: dict[str, Any]) -> None:
        """Takes ``values`` as the constructor arguments of those names, as if the node had
        been built with them: what declares it and what rebuilds it elsewhere follow."""
        bound = self._bound()
        if bound is None:
            return
        parameters = bound.signature.parameters
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for name, value in values.items():
            if name in parameters and parameters[name].kind not in variadic:
                bound.arguments[name] = value
            else:  # one of the keyword arguments a `**kwargs` took
                taken = next((n for n, p in parameters.items() if p.kind is p.VAR_KEYWORD), None)
                if taken is None:
                    raise ValueError(f"{type(self).__qualname__} takes no argument `{name}`")
                bound.arguments[taken] = {**bound.arguments.get(taken, {}), name: value}
        self._smz.call = (tuple(bound.args[1:]), dict(bound.kwargs))
        self._smz.retaken += 1
        made = self._smz.made
        if made is not None:  # what it holds is what it is made with from here
            made.update((name, value) for name, value in values.items() if name in made)

    def _held_as_made(self) -> dict[str, Any]:
        """What the node holds as attributes, but under its constructor's parameter names
        what it held when its constructor returned (:attr:`Marks.made`): what the graph
        starts to watch from, so that a value given since is followed as one given after
        the build is."""
        held = attributes_of(self)
        made = self._as_constructed()
        if made is None:
            return held
        names = self._argument_names()
        return {**{k: v for k, v in held.items() if k not in names}, **made}

    def _as_constructed(self) -> dict[str, Any] | None:
        """What the node held when it was made (:attr:`Marks.made`), under its arguments'
        names. For a node whose constructor does not say so (a mixin's, a class whose
        metaclass has a ``__call__`` of its own: :func:`_watch_making`), and which holds no
        state (cheap to build, as a worker would), worked out once, before a graph is built
        with it, by building one from its call: what it holds that the build holds too (by
        canonical form) is as made, and where they differ, what the build holds is what it
        was made with — so that a value given before the build is followed all the same.
        None where that cannot be told: the node is looked at as it is at the build."""
        marks = self._smz
        if marks.made is not None or marks.built or marks.unmade or self.holds_state:
            return marks.made
        if type(self).declare is not Node.declare or own_new(type(self)) is not None:
            return None
        names = self._argument_names()
        if not names:
            marks.made = {}
            return marks.made
        from somatize._look_again import _built_again  # which imports this module

        try:
            fresh = attributes_of(_built_again(self, self.recipe()))
        except Exception:  # a constructor that cannot be run again here: as it is
            marks.unmade = True
            return None
        held = attributes_of(self)
        made: dict[str, Any] = {}
        set_up: dict[str, Any] = {}
        for name in fresh:
            if name not in names and name.startswith("_"):
                continue
            now, built = held.get(name, UNSET), fresh[name]
            digest = digest_of(now)
            unchanged = now is built or (digest is not None and digest == digest_of(built))
            (made if name in names else set_up)[name] = now if unchanged else built
        marks.made, marks.set_up = made, set_up
        return made

    def _argument_names(self) -> frozenset[str]:
        """The names the node's constructor call gives an argument under, one by one: its
        parameters' (for a class declared by them), and those its ``**kwargs`` took."""
        names, keywords = _parameter_names(type(self))
        if not keywords:
            return names
        return names | {name for name in self._smz.call[1] if isinstance(name, str)}

    def replaced_since_made(self) -> bool:
        """Whether an attribute named like a constructor parameter holds other than what the
        constructor left there (:attr:`Marks.made`)."""
        made = self._as_constructed()
        if not made:
            return False
        held = attributes_of(self)
        return any(held.get(name, UNSET) is not value for name, value in made.items())

    def _bound(self) -> inspect.BoundArguments | None:
        signature = _signature(type(self))
        if signature is None:
            return None
        args, kwargs = self._call()
        try:
            return signature.bind(None, *args, **kwargs)
        except TypeError:
            return None

    def _call(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The constructor call that made this node, ``(args, kwargs)``. A dataclass field
        left to its ``default_factory`` is taken as passed, with what the node holds under
        its name (what the factory made): that is what it computes with, changed in place
        since or not, and what a copy rebuilt elsewhere is built with. It is noted in the
        call the first time the call is asked for once the node holds it, and followed from
        there as an argument passed is — unless the class has a ``__post_init__``, which
        may have changed it: then it is not taken, and the node cannot be keyed."""
        call = self._smz.call
        factories = _factories(type(self))
        if not factories or getattr(type(self), "__post_init__", None) is not None:
            # What a `__post_init__` may have made of it is no argument a call could pass
            # (`self.cols = ["id"] + self.cols`): left to the placeholder, and refused.
            return call
        signature = _signature(type(self))
        assert signature is not None
        try:
            bound = signature.bind(None, *call[0], **call[1])
        except TypeError:
            return call
        held = attributes_of(self)
        left = {n: held[n] for n in factories if n not in bound.arguments and n in held}
        if not left:
            return call
        bound.arguments.update(left)
        self._smz.call = (tuple(bound.args[1:]), dict(bound.kwargs))
        return self._smz.call

    def recipe(self) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
        """How another process rebuilds this node: ``(maker, args, kwargs)``.

        By default the constructor call that made it, with no maker: the node's class is
        called with ``args`` and ``kwargs``. A node that stands for another class (its
        identity is that class's) names a maker, ``module:Class.method`` — a classmethod
        of a node class that is handed the class the identity names, then ``args`` and
        ``kwargs``. A node that no other process can rebuild raises
        :class:`~somatize.catalog.Unbuildable`, saying how to make one that can be: by
        default, one whose class defines its own ``__new__``, since the call it was made
        with is not known (:func:`~somatize._calls.own_new`).
        """
        owner = own_new(type(self))
        if owner is not None:
            from somatize.catalog import Unbuildable  # the catalog builds nodes: it is above

            raise Unbuildable(
                f"`{owner.__qualname__}` defines its own `__new__`, so the call it was made "
                "with is not known (the call a node is made with is noted from what that "
                "`__new__` hands `Node.__new__`), and a copy built from the call noted could "
                f"be another node. Give `{type(self).__qualname__}` a `recipe(self)` method "
                "that says how to build it, or run it where the graph is called or on a "
                '`Worker.generic(mode="local")` worker'
            )
        args, kwargs = self._call()
        return None, tuple(args), dict(kwargs)

    def state_bytes(self) -> bytes:
        """The state this node holds (its weights), as codec bytes, for a copy of it
        rebuilt in another process to :meth:`load_state`. A node that holds state and
        writes both crosses to a network worker; see :mod:`somatize.broker.host`."""
        raise NotImplementedError(f"{type(self).__qualname__} cannot hand its state over")

    def load_state(self, data: memoryview) -> str:
        """Loads the state :meth:`state_bytes` wrote into this node, which was just rebuilt
        by its constructor, holds it as it would be held frozen, and answers the digest of
        the state it now holds — the digest the graph is frozen at when the bytes are
        those of that state, worked out here from what was loaded."""
        raise NotImplementedError(f"{type(self).__qualname__} cannot load a state")

    def restate(self) -> str | None:
        """For a node settled at a state (weights digested by ``freeze``): the digest of its
        state if it changed since, now said to be its state; None when it did not (and
        by default). The graph asks at the start of each forward, so its key, and the state
        a worker is sent, name the state it computes with — a node that can see a change
        cheaply (a torch module watching its tensors) says so here; where its class does
        not, a library that knows a kind it is may (:func:`restates`)."""
        for kind, restate in _RESTATES:
            if isinstance(self, kind):
                return restate(self)
        return None

    def declaration_moved(self) -> bool:
        """For a node settled at a state: whether what it declares may have changed since
        this was last asked, though it was built with nothing that changed (a setting
        given to a torch module after ``freeze``). Asked beside :meth:`restate`; a yes,
        which may be wrong but never when a no would be, has the graph take its
        declaration again. False by default."""
        return False

    def changed_as_it_ran(self) -> bool:
        """Whether the forward that just ended may have changed what this node declares
        (a torch module that keeps a cache its forward appends to, a table it fills as it
        first runs): its answer is then not kept, since a recall would not make the change,
        and the next call is keyed by what it declares then (:meth:`declaration_moved`
        says yes). A yes may be wrong, but never when a no would be. False by default."""
        return False

    def implementing_class(self) -> type:
        """The class whose code computes this node's answers: its own, or the one it stands
        for (a torch node: its module's class). The fingerprint of that code is noted
        beside each answer kept, and compared when the answer is recalled."""
        return type(self)

    def implementing_classes(self) -> tuple[type, ...]:
        """Every class whose code computes this node's answers: :meth:`implementing_class`,
        and for a node made of parts of other classes (a torch module's submodules) those
        too. The code fingerprint noted beside each answer covers them all, and the
        classes they inherit from (:func:`~somatize.catalog.fingerprint_of`)."""
        return (self.implementing_class(),)

    def kind_name(self) -> str:
        """What this node is called in listings, figures and messages: its class, or what
        it stands for (a torch node says its module's class)."""
        return type(self).__qualname__

    def declaration(self, where: str | None = None) -> str:
        """``blake3:<hex>`` of :meth:`declare`; :class:`Undeclared` when it is not canonical,
        or when the node's class takes constructor arguments the ``declare()`` it inherits
        was not written for (see :func:`~somatize._calls._unsaid`)."""
        unsaid = _unsaid(type(self))
        if unsaid is not None:
            owner, new, variadic = unsaid
            if not new and variadic:
                new = _unsaid_in(self, owner)
            if new:
                raise self._unsaid_by((owner, new), where)
        if type(self).declare is Node.declare:
            declared: Any = self._declared_by_call(where)  # named as ``where`` says
        else:
            declared = self.declare()
        try:
            return canonical.hex_of(declared, _DECLARATION)
        except canonical.NotCanonical as why:
            kind = type(self).__qualname__
            name = where or self._smz.name or kind
            left = (
                [n for n, v in declared.items() if v is _FACTORY_MADE]
                if isinstance(declared, dict)
                else []
            )
            if left:
                raise Undeclared(
                    f"`{name}` ({kind}) cannot be keyed: it leaves `{left[0]}` to its "
                    "`default_factory`, and its `__post_init__` may change what the factory "
                    "made, so what it holds does not say what built it. Pass it "
                    f"(`{kind}({left[0]}=...)`), or give `{kind}` a `declare(self)` method"
                ) from None
            raise Undeclared(
                f"`{name}` ({kind}) cannot be keyed: its declaration (what built it) has no "
                f"canonical form — {str(why).rstrip('.')}. Give `{kind}` a `declare(self)` "
                "method that returns, as canonical values, what distinguishes one instance "
                "from another"
            ) from None

    def _declared_with(self, call: tuple[tuple[Any, ...], dict[str, Any]]) -> str:
        """``blake3:<hex>`` of what the default :meth:`declare` would say had this node been
        made by ``call`` (``args``, ``kwargs``); NotCanonical when that has no canonical
        form."""
        return canonical.hex_of(declared_arguments(type(self), *call), _DECLARATION)

    def _unsaid_by(self, unsaid: tuple[type, list[str]], where: str | None) -> Undeclared:
        owner, new = unsaid
        kind = type(self).__qualname__
        name = where or self._smz.name or kind
        base = owner.__qualname__
        args = ", ".join(f"`{n}`" for n in new)
        example = new[0] if new[0].isidentifier() else "value"
        return Undeclared(
            f"`{name}` ({kind}) cannot be keyed: `{kind}` takes constructor arguments of its "
            f"own ({args}) and inherits `declare()` from `{base}`, which says what "
            f"distinguishes one `{base}` from another and may not say them. Two `{kind}`s "
            "built with different arguments could then not be told apart: they would share "
            f"one key, and one's answer would be recalled for the other. Give `{kind}` its "
            "own `declare(self)` that adds them to `super().declare()`, e.g. "
            f'`return {{**super().declare(), "{example}": self.{example}}}`'
        )

    # -- declarations (chainable) ------------------------------------------------------

    def _settled(self, said: str, changes: bool) -> None:
        """Refuses ``said`` when it ``changes`` what was said about a node already built into
        a graph: that graph took the node's declarations when it was built, and would go on
        keeping and recalling answers as if nothing had been said."""
        if changes and self._smz.built:
            kind = type(self).__qualname__
            name = self._smz.name
            who = f"`{name}` ({kind})" if name else f"this `{kind}`"
            raise AlreadyBuilt(
                f"{who} is already in a graph, which took what was said about it "
                f"when it was built: `{said}` now would change nothing there, and its answers "
                "would go on being keyed, kept and recalled as before. Say it before "
                f"`Graph.somatize(...)`: build the graph again from a new `{kind}` (and a "
                "second graph that uses it otherwise, from a node of its own)"
            )

    def named(self: _Said, name: str) -> _Said:
        """Calls this node ``name`` in facts, errors and figures. Not part of its key:
        one computation under two names shares answers."""
        if not _one_line(name):
            raise ValueError(
                "a node name is a non-empty str with no control characters (a newline, a tab, "
                "NUL) nor line separators (U+2028): facts, errors and figures show it as one "
                f"line, got {name!r}"
            )
        self._settled(f".named({name!r})", name != self._smz.name)
        self._smz.name = name
        return self

    def identified(self: _Said, identity: str) -> _Said:
        """Gives this node a stable identity (``package.module:Name``) when its class has
        none of its own — one made inside a function, say."""
        if not isinstance(identity, str) or ":" not in identity:
            raise ValueError(f"an identity is `module:qualname`, got {identity!r}")
        self._settled(f".identified({identity!r})", identity != self._smz.identity)
        self._smz.identity = identity
        return self

    def frozen(self: _Said) -> _Said:
        """Says this node's state does not change while the graph runs."""
        self._settled(".frozen()", not self._smz.frozen)
        self._smz.frozen = True
        return self

    def cached(self: _Said, salt: str | None = None) -> _Said:
        """Says this node's output is worth keeping; ``salt`` tells apart runs the key cannot."""
        if salt is not None and not isinstance(salt, str):
            raise TypeError(f"a salt is a str, got a {type(salt).__name__}")
        said = ".cached()" if salt is None else f".cached(salt={salt!r})"
        self._settled(said, not self._smz.cached or salt != self._smz.salt)
        self._smz.cached = True
        self._smz.salt = salt
        return self

    def mapped(self: _Said) -> _Said:
        """Says this node maps over the items of its input: a list in, a list as long
        out, so that what is kept of it is kept item by item."""
        self._settled(".mapped()", not self._smz.mapped)
        self._smz.mapped = True
        return self

    def at(self: _Said, worker: str) -> _Said:
        """Places this node on ``worker`` (a name the broker knows)."""
        _check_worker_name(worker)
        self._settled(f".at({worker!r})", worker != self._smz.worker)
        self._smz.worker = worker
        return self

    # -- chaining ----------------------------------------------------------------------

    def __rshift__(self, other: Any) -> Expr:
        return Expr.of(self).__rshift__(other)

    def __rrshift__(self, other: Any) -> Expr:
        return Expr.of(other) >> self

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<{type(self).__qualname__}{f' {name!r}' if name else ''}>"


@dataclass
class Expr:
    """A piece of graph under construction: nodes, ordered edges, and which nodes are
    its outputs. Built with ``>>`` and tuples; turned into a graph by
    ``Graph.somatize``."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[Node, Node]] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)

    @staticmethod
    def of(what: Any) -> Expr:
        """``what`` as an expression: a node, an expression, or a tuple of them side by side."""
        if isinstance(what, Expr):
            return what
        if isinstance(what, Node):
            return Expr([what], [], [what])
        if isinstance(what, (tuple, list)) and what:
            return Expr._side_by_side([Expr.of(part) for part in what])
        raise TypeError(
            f"a graph is built from nodes, `>>` and tuples of them; got a "
            f"`{type(what).__qualname__}` ({what!r})"
        )

    def beside(self, other: Expr) -> Expr:
        """Both side by side: their nodes, their edges and the outputs of each, in order.

        An output given twice is two outputs (``(a, a) >> j`` hands ``j`` two
        arguments). An edge is one edge however often the piece of graph it belongs to
        is written (``(x, x >> c)`` is ``x`` once, fed into ``c``): an edge both sides
        hold is kept as often as the side holding it more often has it."""
        return Expr._side_by_side([self, other])

    @staticmethod
    def _side_by_side(parts: Sequence[Expr]) -> Expr:
        """``parts`` side by side, as :meth:`beside` puts two, in one pass over them all
        (a tuple of a thousand nodes is not put together a thousand times): each edge kept
        as often as the part holding it most often has it, in the order it first comes
        that often."""
        first = parts[0]
        nodes = list(first.nodes)
        edges = list(first.edges)
        outputs = list(first.outputs)
        if len(parts) == 1:
            return Expr(nodes, edges, outputs)
        known = set(map(id, nodes))
        held: Counter[tuple[int, int]] = Counter()
        if any(part.edges for part in parts[1:]):
            held.update((id(source), id(target)) for source, target in edges)
        for part in parts[1:]:
            Expr._take_nodes(nodes, known, part.nodes)
            Expr._take_edges(edges, held, part.edges)
            outputs += part.outputs
        return Expr(nodes, edges, outputs)

    @staticmethod
    def _take_nodes(nodes: list[Node], known: set[int], more: Iterable[Node]) -> None:
        """Appends to ``nodes`` each of ``more`` not ``known`` yet (by identity), noting it."""
        for node in more:
            if id(node) not in known:
                known.add(id(node))
                nodes.append(node)

    @staticmethod
    def _take_edges(
        edges: list[tuple[Node, Node]],
        held: Counter[tuple[int, int]],
        more: Iterable[tuple[Node, Node]],
    ) -> None:
        """Appends to ``edges`` each of ``more`` as often as ``more`` has it beyond what
        ``edges`` holds (``held``: how often each is there, by identity, kept up to date)."""
        seen: Counter[tuple[int, int]] = Counter()
        for source, target in more:
            pair = (id(source), id(target))
            seen[pair] += 1
            if seen[pair] > held[pair]:
                held[pair] += 1
                edges.append((source, target))

    def heads(self) -> list[Node]:
        """The nodes nothing in this expression feeds: where an input comes in."""
        fed = {id(target) for _, target in self.edges}
        return [n for n in self.nodes if id(n) not in fed]

    def __rshift__(self, other: Any) -> Expr:
        """``self`` then ``other``: both side by side (:meth:`beside`), each output of ``self``
        feeding each head of ``other``, whose outputs are the outputs.

        What it holds is put together when it is first read, from the nearest expression
        before it that was (:meth:`_put_together`): a chain built one ``>>`` at a time
        costs one pass over its nodes, not one per link."""
        after: Expr = Expr.of(other)
        bridges = [(tail, head) for head in after.heads() for tail in self.outputs]
        chained: Expr = object.__new__(Expr)
        chained.outputs = list(after.outputs)
        vars(chained)["_link"] = (self, list(after.nodes), list(after.edges), bridges)
        return chained

    def __rrshift__(self, other: Any) -> Expr:
        return Expr.of(other) >> self

    def __getattr__(self, name: str) -> list[Any]:
        """The nodes or edges of an expression made by ``>>``, put together as first read."""
        if name in ("nodes", "edges") and "_link" in vars(self):
            self._put_together()
            held: list[Any] = vars(self)[name]
            return held
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _put_together(self) -> None:
        """Sets the nodes and edges of this expression, made by ``>>``, from the links back
        to the nearest expression that holds its own: each link's nodes and edges put
        beside what came before as :meth:`beside` puts them, then its bridges."""
        links = []
        at = self
        while (link := vars(at).get("_link")) is not None:
            links.append(link)
            at = link[0]
        nodes, edges = list(at.nodes), list(at.edges)
        known = set(map(id, nodes))
        held: Counter[tuple[int, int]] | None = None  # how often each edge is there
        for _, added, joined, bridges in reversed(links):
            Expr._take_nodes(nodes, known, added)
            if joined:
                if held is None:
                    held = Counter((id(source), id(target)) for source, target in edges)
                Expr._take_edges(edges, held, joined)
            edges += bridges
            if held is not None:
                held.update((id(source), id(target)) for source, target in bridges)
        self.nodes, self.edges = nodes, edges
        vars(self).pop("_link", None)  # put together by another thread meanwhile too: alike


@dataclass
class Context:
    """What a node is told about the call it is running in."""

    name: str
    """Its name in the graph."""
    key: str | None = None
    """The key its answer is kept under, when it is keyed."""
    keys: Sequence[str] | None = None
    """One key per item, for a mapped node whose items are keyed."""
    worker: str | None = None
    """The worker it runs on: None when it runs where the graph is called (placed nowhere,
    or with no broker, which ignores ``.at()``)."""
    store: Any = None
    """The store of this forward, or None."""
    precision: tuple[tuple[str, str], ...] | None = None
    """The precision the forward was called in, as its keys name it where it is not torch's
    default (``(("autocast.cpu", "bfloat16"),)``: :mod:`somatize._precision`), read once as
    the forward began; None in the default precision."""


_ATOMIC = (int, float, complex, str, bytes, bool, type(None))
"""Values that cannot change in place, which a pickle carries as a new object each time."""


_PARAMETER_NAMES: weakref.WeakKeyDictionary[type, tuple[frozenset[str], bool]] = (
    weakref.WeakKeyDictionary()
)


def _by_name(bound: inspect.BoundArguments) -> list[tuple[str, Any]]:
    """The arguments of ``bound``, a constructor call (bound with ``None`` for ``self``),
    one by one: each parameter's but ``self`` and a ``*args``, and each of those its
    ``**kwargs`` took, under its keyword."""
    out: list[tuple[str, Any]] = []
    for index, (name, value) in enumerate(bound.arguments.items()):
        how = bound.signature.parameters[name].kind
        if how is inspect.Parameter.VAR_KEYWORD:
            out += [(key, item) for key, item in value.items() if isinstance(key, str)]
        elif index and how is not inspect.Parameter.VAR_POSITIONAL:
            out.append((name, value))
    return out


def _parameter_names(kind: type[Node]) -> tuple[frozenset[str], bool]:
    """The names of the parameters ``kind``'s constructor takes one by one, for a class
    declared by them (the default :meth:`Node.declare`; none for any other), and whether
    it takes ``**kwargs`` too. Worked out once per class."""
    found = _PARAMETER_NAMES.get(kind)
    if found is None:
        signature = _signature(kind) if kind.declare is Node.declare else None
        parameters = list(signature.parameters.values())[1:] if signature is not None else []
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        found = _PARAMETER_NAMES[kind] = (
            frozenset(p.name for p in parameters if p.kind not in variadic),
            any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters),
        )
    return found


def _note_call(
    kind: type[Node], marks: Marks, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Notes ``args`` and ``kwargs`` as the call that made a node of ``kind`` (and, for one
    declared by them, the call its attributes are made from: :attr:`Marks.made_with`)."""
    marks.call = (args, kwargs)
    if (
        kind.declare is Node.declare
        and kind.recipe is Node.recipe
        and not kind.holds_state
        and own_new(kind) is None
    ):
        marks.made_with = noted_call(kind, args, kwargs)


_MAKERS: weakref.WeakKeyDictionary[type, int | None] = weakref.WeakKeyDictionary()
"""A class of nodes → the place in its MRO of the class whose constructor
:func:`_watch_making` wraps for it (None: none is), not that class, which may be the class
itself: held here, it would never be freed (a notebook's cell run again makes its classes
anew)."""
_MAKERS_LOCK = ProcessLock()
"""Held while a constructor is wrapped (:func:`_watch_making`): unheld in a forked child
(a DataLoader worker forked as another thread makes a node), which makes nodes too."""


def _maker_of(kind: type) -> type | None:
    """The class whose constructor :func:`_watch_making` wrapped for ``kind``, if it did."""
    at = _MAKERS.get(kind)
    return None if at is None else kind.__mro__[at]


def _watch_making(kind: type[Node]) -> None:
    """Makes sure the constructor of ``kind`` says when a node is made (:attr:`Marks.made`):
    the ``__init__`` it runs, when a class of nodes defines it (a dataclass too), is
    wrapped, once, in one that notes what the node holds when the outermost returns, and
    the call it was handed (what ``Node.__new__`` was handed may be other: a metaclass
    that calls ``__init__`` itself). Only where every constructor along the class's MRO
    is a node class's: one that is not (a mixin's, ``torch.nn.Module``'s) is not touched,
    nor is a node class's that such a class may reach through ``super().__init__`` (a
    library that walks its constructors' frames would meet the wrapper's), and a node of
    such a class is looked at as a build from its call makes it (:meth:`Node._as_constructed`)."""
    if kind.declare is not Node.declare:
        return
    if kind in _MAKERS:
        owner = _maker_of(kind)
    else:
        makers = [c for c in kind.__mro__ if "__init__" in vars(c) and c is not object]
        pure = all(issubclass(c, Node) for c in makers)
        owner = makers[0] if pure and makers and makers[0] is not Node else None
        _MAKERS[kind] = None if owner is None else kind.__mro__.index(owner)
    if owner is None:
        return
    init = vars(owner).get("__init__")
    if not isinstance(init, FunctionType) or getattr(init, "_smz_making", False):
        return
    with _MAKERS_LOCK:
        init = vars(owner).get("__init__")
        if isinstance(init, FunctionType) and not getattr(init, "_smz_making", False):
            type.__setattr__(owner, "__init__", _making(init, owner))


def _noted_as_made(kind: type) -> None:
    """Notes what the node class ``kind`` and its module hold as it is made
    (:func:`~somatize.catalog._code._note_made`), and makes sure each class made below it
    is noted so too: an ``__init_subclass__`` ``kind`` defines is wrapped, once, in one that
    notes the class it ran for as it returns — one that does not call
    ``super().__init_subclass__`` (a registry's) keeps ``Node``'s from running for the
    classes below, and a constant set on one of them by hand before its first fingerprint
    would be taken for what its text made."""
    from somatize.catalog._code import _note_made

    _note_made(kind)
    hook = vars(kind).get("__init_subclass__")
    if (
        isinstance(hook, classmethod)
        and isinstance(hook.__func__, FunctionType)
        and not getattr(hook.__func__, "_smz_noting", False)
    ):
        type.__setattr__(kind, "__init_subclass__", classmethod(_noting(hook.__func__)))


def _noting(hook: Callable[..., None]) -> Callable[..., None]:
    """``hook``, a node class's ``__init_subclass__``, noting the class it ran for as it
    returns (:func:`_noted_as_made`)."""

    @functools.wraps(hook)
    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        hook(cls, **kwargs)
        _noted_as_made(cls)

    __init_subclass__._smz_noting = True  # type: ignore[attr-defined]
    return __init_subclass__


def _making(init: Callable[..., None], owner: type) -> Callable[..., None]:
    """``init``, the constructor of ``owner``, a class of nodes, noting when a node whose
    constructor it is (:func:`_watch_making`) is made. Run for another (a subclass's own
    constructor, or a mixin's, calling it through ``super().__init__``), it is ``init``."""

    @functools.wraps(init)
    def __init__(self: Node, *args: Any, **kwargs: Any) -> None:
        marks = vars(self).get("_smz")
        if (
            not isinstance(marks, Marks)
            or marks.made is not None  # made already: called again, it changes the node
            or _maker_of(type(self)) is not owner
        ):
            init(self, *args, **kwargs)
            return
        if not marks.making and not _same_call(marks.call, args, kwargs):
            _note_call(type(self), marks, args, kwargs)
        marks.making += 1
        try:
            init(self, *args, **kwargs)
        finally:
            marks.making -= 1
        if not marks.making and type(type(self)).__call__ is type.__call__:
            # (A metaclass of its own may do more once the constructor returns: the node is
            # then looked at as it is when a graph is built.)
            held = attributes_of(self)
            names = self._argument_names()
            marks.made = {name: held[name] for name in names if name in held}
            marks.set_up = {
                name: value
                for name, value in held.items()
                if name not in names and not name.startswith("_")
            }

    __init__._smz_making = True  # type: ignore[attr-defined]
    return __init__


_SET_BY_METHODS: weakref.WeakKeyDictionary[type, frozenset[str] | None] = (
    weakref.WeakKeyDictionary()
)


def _set_by_methods(kind: type[Node]) -> frozenset[str] | None:
    """The attribute names a function of ``kind`` or a class it inherits from (but
    ``Node``'s), other than one run as a node is made (``__init__``), sets or deletes on
    anything (``self.calls += 1``): what the node may change itself; None when one may set
    any (it names ``setattr``, ``delattr``, ``vars`` or ``__dict__``: :data:`_BY_NAME`).
    Worked out once per class."""
    if kind in _SET_BY_METHODS:
        return _SET_BY_METHODS[kind]
    # the catalog builds on this module: imported when first asked
    from somatize.catalog._bytecode import _BY_NAME, _MAKERS, _named_by, _names_any
    from somatize.catalog._members import _functions_in

    names: set[str] = set()
    found: frozenset[str] | None = None
    for function in (
        function
        for owner in kind.__mro__
        if owner is not Node and owner is not object
        for name, member in list(vars(owner).items())
        if name not in _MAKERS
        for function in _functions_in(member)
    ):
        if _names_any(function.__code__, _BY_NAME):
            break
        names |= _named_by(function.__code__, ("STORE_ATTR", "DELETE_ATTR"))
    else:
        found = frozenset(names)
    _SET_BY_METHODS[kind] = found
    return found


def _same_call(
    call: tuple[tuple[Any, ...], dict[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether ``args`` and ``kwargs`` are the very objects of ``call``."""
    was, named = call
    return (
        len(was) == len(args)
        and all(a is b for a, b in zip(was, args, strict=True))
        and named.keys() == kwargs.keys()
        and all(named[k] is kwargs[k] for k in named)
    )
