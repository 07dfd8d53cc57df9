"""What built a node: the constructor call that made it, read against its class's
constructor.

A node is declared, by default, by the arguments it was made with
(:meth:`~somatize.node.Node.declare`). The call is captured as the node is made, and read
here against the signature of its class's ``__init__``: by parameter name, defaults filled
in (:func:`declared_arguments`). A dataclass field left to its ``default_factory`` keeps
dataclasses' placeholder, since the factory is not called (:func:`_factories`). A call
that holds a list, a dict or bytes that can change (a bytearray, a memoryview), passed or
left to a default that every instance shares, is noted as it was, copied
(:func:`noted_call`, :func:`copy_call`), so that a change in place afterwards is told
apart from it. A class that defines its own constructor below the
class whose ``declare()`` it inherits may take arguments that ``declare()`` does not say
(:func:`_unsaid`). What is worked out of a class is worked out once and remembered, for
as long as the class lives: a notebook's cell run again makes its classes anew, and those
it made before are freed with the graphs built of them, so nothing remembered of a class
holds it (a class of its own MRO is remembered by its place there).
:class:`~somatize.node.Node` reads its call through these, and :mod:`somatize._look_again`
what changed in it since.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from typing import TYPE_CHECKING, Any

from somatize import canonical

if TYPE_CHECKING:
    from somatize.node import Node

_SIGNATURES: weakref.WeakKeyDictionary[type, inspect.Signature | None] = weakref.WeakKeyDictionary()

# The class it holds is one strictly above the class it is remembered for, never the class.
_UNSAID: weakref.WeakKeyDictionary[type, tuple[type, list[str], bool] | None] = (
    weakref.WeakKeyDictionary()
)

_CHANGEABLE_DEFAULTS: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()

# By its place in the class's MRO: the class itself may be the one, and held here it would
# never be freed.
_OWN_NEW: weakref.WeakKeyDictionary[type, int | None] = weakref.WeakKeyDictionary()

_FACTORIES: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()

_UNKNOWN: Any = object()
"""What the maps above answer for a class not worked out yet."""

_FACTORY_MADE: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())
"""The default a dataclass's generated ``__init__`` gives a field made by a
``default_factory``: a placeholder, which it replaces by what the factory makes."""


def own_new(kind: type) -> type | None:
    """The class below :class:`~somatize.node.Node` in ``kind``'s MRO that defines its own
    ``__new__``, or None when none does (worked out once per class). The call a node was
    made with is what ``Node.__new__`` is handed, and such a ``__new__`` hands it what it
    will: nothing (``super().__new__(cls)``), or other arguments. Nothing tells whether it
    passes on the call as it was made, so for such a class the call is not known."""
    mro = kind.__mro__
    at = _OWN_NEW.get(kind, _UNKNOWN)
    if at is _UNKNOWN:
        from somatize.node import Node  # not at import time: somatize.node imports this module

        below = mro[: mro.index(Node)] if Node in mro else ()
        at = _OWN_NEW[kind] = next((i for i, c in enumerate(below) if "__new__" in vars(c)), None)
    return None if at is None else mro[at]


def _unsaid(kind: type) -> tuple[type, list[str], bool] | None:
    """For a class that defines its own ``__init__`` below the class whose ``declare()`` it
    inherits: that class, the parameters of its own that class's does not take
    (``declare()`` was written without them, so it may not say them), and whether it takes
    ``*args`` or ``**kwargs`` — which it may pass through or keep, so each call's
    arguments are checked against that class's parameters (:func:`_unsaid_in`). None when
    it inherits ``__init__`` with ``declare()`` (worked out once per class)."""
    known = _UNSAID.get(kind, _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[no-any-return]
    from somatize.node import Node  # not at import time: somatize.node imports this module

    found: tuple[type, list[str], bool] | None = None
    mro = kind.__mro__
    owner = next(c for c in mro if "declare" in vars(c))
    made_by = next((c for c in mro if "__init__" in vars(c)), object)
    if owner is not Node and mro.index(made_by) < mro.index(owner):
        theirs = {name for name, _ in _parameters(owner)}
        passed = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        parameters = _parameters(kind)
        if parameters[0][1] is not inspect.Parameter.VAR_POSITIONAL:
            parameters = parameters[1:]  # self; one that names none has it in its *args
        new = [name for name, how in parameters if how not in passed and name not in theirs]
        variadic = any(how in passed for _, how in parameters)
        if new or variadic:
            found = (owner, new, variadic)
    _UNSAID[kind] = found
    return found


def _unsaid_in(node: Node, owner: type) -> list[str]:
    """The arguments of the call that made ``node`` (whose class takes ``*args`` or
    ``**kwargs``) that ``owner``'s constructor could not have been handed: its class took
    them for itself, and ``owner``'s ``declare()`` does not say them. Fewer arguments, or
    arguments bound differently, are the class's to pass on."""
    signature = _signature(owner)
    if signature is None:
        return []
    args, kwargs = node._smz.call
    try:
        signature.bind_partial(None, *args, **kwargs)
    except TypeError:
        takes = signature.parameters
        keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values())
        extra = [] if keyword else [name for name in kwargs if name not in takes]
        return extra or [f"{len(args)} positional arguments"]
    return []


def _parameters(kind: type) -> list[tuple[str, Any]]:
    """The name and kind of each parameter of ``kind.__init__``, ``self`` first."""
    init = kind.__init__  # type: ignore[misc]
    try:
        return [(p.name, p.kind) for p in inspect.signature(init).parameters.values()]
    except (TypeError, ValueError):
        return [("?", None)]


def _signature(kind: type) -> inspect.Signature | None:
    """The signature of ``kind.__init__``, worked out once per class."""
    found = _SIGNATURES.get(kind, _UNKNOWN)
    if found is _UNKNOWN:
        init = kind.__init__  # type: ignore[misc]
        try:
            found = None if init is object.__init__ else inspect.signature(init)
        except (TypeError, ValueError):
            found = None
        _SIGNATURES[kind] = found
    return found  # type: ignore[no-any-return]


def _factories(kind: type) -> frozenset[str]:
    """For a dataclass: the parameters its constructor leaves to a field's
    ``default_factory`` (their default is dataclasses' placeholder); empty for any other
    class (worked out once per class)."""
    known = _FACTORIES.get(kind)
    if known is None:
        found: set[str] = set()
        signature = _signature(kind)
        if signature is not None and dataclasses.is_dataclass(kind):
            made = {
                f.name
                for f in dataclasses.fields(kind)
                if f.default_factory is not dataclasses.MISSING
            }
            found = {
                name
                for name, parameter in signature.parameters.items()
                if parameter.default is _FACTORY_MADE and name in made
            }
        known = _FACTORIES[kind] = frozenset(found)
    return known


def _with_defaults(kind: type, bound: inspect.BoundArguments) -> None:
    """Fills in ``bound``, a call of ``kind``'s constructor, with the defaults of the
    arguments it leaves out. One left to a dataclass field's ``default_factory`` keeps
    dataclasses' placeholder, which has no canonical form: the factory is not called
    (it may draw at random, or build a module), and what it made is known only from the
    node that holds it (:meth:`~somatize.node.Node._call`)."""
    bound.apply_defaults()


def declared_arguments(kind: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the default :meth:`~somatize.node.Node.declare` says of a ``kind`` made by
    ``kind(*args, **kwargs)``: the arguments by parameter name, defaults filled in (a
    dataclass field left to its ``default_factory`` as dataclasses' placeholder, see
    :func:`_with_defaults`)."""
    signature = _signature(kind)
    if signature is None:
        if args or kwargs:
            return {"*args": tuple(args), "**kwargs": dict(kwargs)}
        return {}
    bound = signature.bind(None, *args, **kwargs)
    _with_defaults(kind, bound)
    out: dict[str, Any] = {}
    for name, value in arguments_of(bound).items():
        how = signature.parameters[name].kind
        if how is inspect.Parameter.VAR_POSITIONAL:
            out["*args"] = tuple(value)
        elif how is inspect.Parameter.VAR_KEYWORD:
            out["**kwargs"] = dict(value)
        else:
            out[name] = value
    return out


def arguments_of(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The arguments of ``bound``, a constructor call bound with ``None`` in the place of
    ``self``, by parameter name, without ``self``. A constructor that names no ``self``
    (``__init__(*args, **kwargs)``) is handed it as the first of its ``*args``, which is
    dropped from there: the arguments the call passed are the rest."""
    arguments = iter(bound.arguments.items())
    first, value = next(arguments)
    out = dict(arguments)
    if bound.signature.parameters[first].kind is inspect.Parameter.VAR_POSITIONAL:
        out = {first: tuple(value[1:]), **out}
    return out


def _has_changeable_defaults(kind: type) -> bool:
    """Whether a parameter of ``kind``'s constructor defaults to something that can change
    in place (a list, a dict), worked out once per class."""
    found = _CHANGEABLE_DEFAULTS.get(kind)
    if found is None:
        signature = _signature(kind)
        defaults = [] if signature is None else [p.default for p in signature.parameters.values()]
        found = _CHANGEABLE_DEFAULTS[kind] = not canonical.is_immutable(
            tuple(d for d in defaults if d is not inspect.Parameter.empty)
        )
    return found


def noted_call(
    kind: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call ``kind(*args, **kwargs)`` as :attr:`~somatize.node.Marks.made_with` notes
    it: with each argument left to a default that can change in place filled in (a list or
    a dict, which one instance may change for every other), and its lists and dicts copied
    (:func:`copy_call`), so that a change in place afterwards leaves it as it was; None
    when nothing in it can change in place. The call it notes is the same call: it
    declares the same, and builds the same node."""
    if _has_changeable_defaults(kind):
        signature = _signature(kind)
        assert signature is not None
        try:
            bound = signature.bind(None, *args, **kwargs)
        except TypeError:
            pass  # refused by the constructor itself
        else:
            _with_defaults(kind, bound)
            args, kwargs = tuple(bound.args[1:]), dict(bound.kwargs)
    if canonical.is_immutable((args, tuple(kwargs.values()))):
        return None
    return copy_call(args, kwargs)


def copy_call(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with each list, dict, tuple, bytearray and memoryview in them
    copied, to any depth, so that what is changed in place afterwards leaves the copy as it
    was (a memoryview, whose buffer may be written through another name, as a view of its
    own copy of the bytes: :func:`_copied_view`); what else they hold is shared (numbers
    and strings cannot change, and other objects are not what a key holds)."""
    made: dict[int, Any] = {}

    def copied(value: Any) -> Any:
        kind = type(value)
        if kind not in (list, dict, tuple, bytearray, memoryview):
            return value
        found = made.get(id(value))
        if found is not None:
            return found
        if kind is bytearray:
            found = bytearray(value)
        elif kind is memoryview:
            found = _copied_view(value)
        elif kind is tuple:
            found = tuple(copied(item) for item in value)
        elif kind is list:
            found = made[id(value)] = []  # noted before it is filled: it may hold itself
            found.extend(copied(item) for item in value)
        else:
            found = made[id(value)] = {}
            found.update((key, copied(item)) for key, item in value.items())
        made[id(value)] = found
        return found

    return copied(args), copied(kwargs)


def _copied_view(view: memoryview) -> Any:
    """A memoryview over a copy of ``view``'s bytes, in C order, of its format and shape,
    and read-only when it is; the bytes themselves when the view is of a format a
    memoryview cannot be cast to (a struct, an explicit byte order), with which the node
    has no key (:mod:`somatize.canonical`) and the note tells a change in place all the
    same."""
    data = view.tobytes()
    try:
        # typeshed takes a format only as one of the literals it lists
        copy: Any = memoryview(bytearray(data)).cast(view.format, view.shape)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return data
    return copy.toreadonly() if view.readonly else copy
