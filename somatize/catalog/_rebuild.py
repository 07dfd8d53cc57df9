"""Who executes a node, and how another process rebuilds it.

An identity (:func:`identity_of`) is ``module:qualname`` of a node's class; a
:class:`Catalog` turns it back into the class, by a registration or an import, and builds
a node from a :class:`Blueprint` — the identity, the constructor call and the digest of
the declaration — refusing (:class:`Unbuildable`) what it cannot rebuild as it was made.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import TYPE_CHECKING, Any

from somatize import canonical
from somatize.catalog._project import main_named, qualified, script_importable_as
from somatize.errors import SomatizeError

if TYPE_CHECKING:
    from somatize.node import Node


class Unbuildable(SomatizeError, LookupError):
    """An identity that this process cannot turn back into an implementation."""


def identity_of(kind: type) -> str | None:
    """``module:qualname`` of ``kind``, or None when the name would not lead back to it.

    A class defined in ``__main__`` has an identity (a notebook's nodes are keyed
    like any other), the same in a process ``multiprocessing`` spawns, which loads the
    script as ``__mp_main__`` (:func:`main_named`), and named by its module where
    ``python -m`` ran the script (``pkg.script:Enc``, :func:`key_named`, found in the
    script that runs by :meth:`Catalog.resolve`); one defined inside a function does
    not, since every call makes another class under the same name; nor does any class
    its module does not hold under its name — one made by ``type(...)`` in a function (a factory's
    ``type("Add", (Node,), {"k": k, "forward": ...})``), whose values (what it holds,
    what its methods close over) are in no key and differ from call to call. (A class
    its module holds, given a function later — a method patched in — keeps its name.)
    """
    explicit = kind.__dict__.get("identity")
    if isinstance(explicit, str):
        return explicit
    qualname = kind.__qualname__
    if "<locals>" in qualname or "<lambda>" in qualname:
        return None
    if not _held_under_its_name(kind):
        return None
    return qualified(kind)


def nameless_because(kind: type) -> tuple[str, str]:
    """Why ``kind`` has no identity (:func:`identity_of` is None), as a refusal says it
    after the class's name, and what to do: made by a class statement at the top of its
    module that ran again since (a notebook's cell, the module reloaded), so that the
    module holds the class it made then under the name, and ``kind`` is the one it made
    before, which no name leads back to — else defined or made in a function."""
    if defined_again(kind):
        return (
            "was defined again after this object was made (its notebook cell run again, "
            "or its module reloaded), and its name leads to the class made then",
            f"Make the `{kind.__qualname__}` again from its class as it is now (a module's "
            "weights carried over with `load_state_dict`)",
        )
    if "<locals>" not in kind.__qualname__ and main_named(kind.__module__) == "__main__":
        # Ray (cloudpickle) sends a class of the driver's script by value: the worker's own
        # `__main__` is Ray's, which holds no such name.
        return (
            "is a class of a script (`__main__`) that this process's `__main__` does not "
            "hold, such as one sent by value from another process (to a Ray actor or task)",
            "Define the class in a module both processes import "
            f"(`from encoders import {kind.__qualname__}`), not in the script that runs",
        )
    return ("is defined inside a function", "Define the class at module level")


def defined_again(kind: type) -> bool:
    """Whether ``kind``, made by a class statement (its methods are named as its own,
    ``Enc.forward``), is not what its module holds under its name, though a class that
    statement made is: the statement ran again after ``kind`` was made."""
    qualname = kind.__qualname__
    now = held_at(kind.__module__, qualname)
    if (
        "<locals>" in qualname
        or not isinstance(now, type)
        or now is kind
        or (now.__module__, now.__qualname__) != (kind.__module__, qualname)
    ):
        return False
    return any(
        getattr(value, "__qualname__", "").startswith(f"{qualname}.")
        for value in vars(kind).values()
        if callable(value)
    )


def _held_under_its_name(kind: type) -> bool:
    """Whether ``kind``'s module holds it under its qualified name."""
    return held_at(kind.__module__, kind.__qualname__) is kind


def held_at(module: str, qualname: str) -> Any:
    """What loaded module ``module`` holds at ``qualname`` (``Outer.Inner``), or None —
    read from module and class namespaces only: nothing is imported, and no module
    ``__getattr__`` (which may import) or metaclass property runs for a name that came
    from elsewhere (a store). A script ``python -m`` ran as ``module``, named so
    (:func:`~somatize.catalog._project.key_named`), is loaded as ``__main__``."""
    found: Any = sys.modules.get(module) or _running_script(module)
    for part in qualname.split("."):
        if not isinstance(found, (type(sys), type)):
            return None
        found = vars(found).get(part)
    return found


def held_as_named(module: str, qualname: str) -> Any:
    """What ``module:qualname``, as keys name a class (:func:`qualified`), is among the
    loaded modules, or None: where ``python -m`` ran the script as ``module``, what the
    script holds — its code's own class, though an import loaded ``module`` besides, making
    other classes of the same names — else what :func:`held_at` finds."""
    return held_at("__main__" if _running_script(module) else module, qualname)


def _dotted(name: str) -> bool:
    """Whether ``name`` is identifiers joined by dots (``pkg.mod``, ``Outer.Inner``): what
    the module and the qualname of an identity are."""
    return all(part.isidentifier() for part in name.split("."))


def _running_script(name: str) -> ModuleType | None:
    """The script that runs here, where ``python -m`` ran it as module ``name``: its
    classes are the ones ``name`` names, those its own code uses. Importing ``name`` runs
    its code a second time, making other classes of the same names, which a module of its
    package may have done besides."""
    if script_importable_as() != name:
        return None
    return sys.modules["__main__"]


def _lookup(module: Any, qualname: str) -> Any:
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


class Catalog:
    """Identity → implementation, with registrations for what an import cannot find.

    ``in_process=True`` is for a catalog whose rebuilt nodes run in this very process
    (the embedded broker's workers): there, a class defined in ``__main__`` — a
    notebook's — is found in this process's ``__main__``, as it would be by a worker
    sharing the interpreter. A catalog for another process refuses such classes.
    """

    def __init__(self, *, in_process: bool = False) -> None:
        self._registered: dict[str, type] = {}
        self.in_process = in_process

    def register(self, kind: type, identity: str | None = None) -> str:
        """Makes ``kind`` findable under ``identity`` (by default its own) in this process."""
        name = identity or identity_of(kind)
        if name is None:
            raise Unbuildable(
                f"`{kind.__qualname__}` has no stable name; register it under one, "
                "e.g. `catalog.register(kind, 'mypackage.nodes:Clean')`"
            )
        self._registered[name] = kind
        return name

    def resolve(self, identity: str) -> type:
        """The class behind ``identity``: registered here, or imported by ``module:qualname``."""
        registered = self._registered.get(identity)
        if registered is not None:
            return registered
        module_name, _, qualname = identity.partition(":")
        if not _dotted(module_name) or not _dotted(qualname):
            raise Unbuildable(
                f"`{identity}` is not of the form `module:qualname` (each a dotted name of "
                "identifiers, with no leading dot)"
            )
        if module_name == "__main__":
            main = sys.modules.get("__main__") if self.in_process else None
            found_here = _lookup(main, qualname) if main is not None else None
            if isinstance(found_here, type):
                return found_here
            raise Unbuildable(
                f"`{identity}` is defined in `__main__` (a script or a notebook), which another "
                "process cannot import: move the class into a module that process can import, "
                "or register it there with `Catalog.register`"
            )
        try:
            found: Any = _running_script(module_name) or importlib.import_module(module_name)
        except (ImportError, ValueError, TypeError) as error:
            raise Unbuildable(
                f"`{identity}` cannot be rebuilt here: importing `{module_name}` failed ({error})"
            ) from error
        for part in qualname.split("."):
            found = getattr(found, part, None)
            if found is None:
                raise Unbuildable(f"`{module_name}` has no `{qualname}`, so `{identity}` is gone")
        if not isinstance(found, type):
            raise Unbuildable(f"`{identity}` names a `{type(found).__name__}`, not a class")
        return found

    def maker(self, name: str) -> Any:
        """The classmethod ``module:Class.method`` of a node class, which builds a node that
        stands for another class; Unbuildable when it is not one."""
        from somatize.node import Node

        owner, dot, method = name.rpartition(".")
        if not dot or ":" not in owner:
            raise Unbuildable(f"a maker is `module:Class.method`, got `{name}`")
        kind = self.resolve(owner)
        found = getattr(kind, method, None)
        if not issubclass(kind, Node) or getattr(found, "__self__", None) is not kind:
            raise Unbuildable(f"`{name}` is no classmethod of a Node class, so it builds no node")
        return found

    def admit(self, blueprint: Blueprint) -> None:
        """Raises Unbuildable when this catalog cannot find what ``blueprint`` names: its
        class and, when it has one, its maker."""
        self.resolve(blueprint.identity)
        if blueprint.maker is not None:
            self.maker(blueprint.maker)

    def rebuild(self, identity: str, arguments: dict[str, Any]) -> Any:
        """A new instance of ``identity`` built with the declared keyword ``arguments``."""
        kind = self.resolve(identity)
        positional = arguments.get("*args", ())
        named = {k: v for k, v in arguments.items() if k not in ("*args", "**kwargs")}
        named.update(arguments.get("**kwargs", {}))
        return kind(*positional, **named)

    def build(self, blueprint: Blueprint) -> Node:
        """The node ``blueprint`` describes, built afresh and checked against its declaration.

        Unbuildable when the class cannot be found here, when it is not a node, or
        when the rebuilt node declares something else than the original did (the
        code or its arguments differ here, so its answers would be kept under a key
        that does not describe them), or holds other values in its public attributes
        (:func:`check_held`; one that holds state is compared once it is loaded, by
        whoever loads it)."""
        from somatize.node import Node

        kind = self.resolve(blueprint.identity)
        made: Any
        if blueprint.maker is None:
            if not issubclass(kind, Node):
                raise Unbuildable(f"`{blueprint.identity}` is a `{kind.__qualname__}`, not a Node")
            make, args, own = kind, blueprint.args, identity_of(kind)
        else:
            make, args, own = self.maker(blueprint.maker), (kind, *blueprint.args), None
        try:
            made = make(*args, **blueprint.kwargs)
        except Exception as error:
            raise Unbuildable(
                f"rebuilding `{blueprint.identity}` with the arguments it was made with failed "
                f"({type(error).__name__}: {error}); its constructor must accept again what it "
                "was called with"
            ) from error
        if not isinstance(made, Node):
            raise Unbuildable(
                f"`{blueprint.maker}` made a `{type(made).__qualname__}`, not a Node, "
                f"from `{blueprint.identity}`"
            )
        node: Node = made
        if blueprint.maker is not None:
            own = node._smz.identity or identity_of(type(node))
        if blueprint.identity != (own or blueprint.identity):
            node.identified(blueprint.identity)
        if blueprint.declaration is not None:
            try:
                again = node.declaration()
            except SomatizeError:
                again = None
            if again != blueprint.declaration:
                raise Unbuildable(
                    f"`{blueprint.identity}` rebuilt here declares {again}, where it was made "
                    f"declaring {blueprint.declaration}: this process runs other code, or the "
                    "constructor does not make the same node from the same arguments. Install "
                    "the same version of the code everywhere the graph runs"
                )
        if blueprint.held is not None and not node.holds_state:
            check_held(blueprint, node)
        return node


def check_held(blueprint: Blueprint, node: Node) -> None:
    """Unbuildable when ``node``, rebuilt from ``blueprint`` (and, when it holds state,
    loaded with it), holds other values in its public attributes than the original held
    when it was sent (:attr:`Blueprint.held`)."""
    from somatize.node import held_by

    was, now = dict(blueprint.held or ()), dict(held_by(node))
    apart = sorted(a for a in was.keys() | now.keys() if was.get(a) != now.get(a))
    if apart:
        said = ", ".join(f"`{attr}`" for attr in apart)
        raise Unbuildable(
            f"`{blueprint.identity}` rebuilt here from its constructor call holds other "
            f"values in {said} than the node in the graph holds: this process runs other "
            "code, or the constructor does not make the same node from the same arguments "
            "(it draws a seed of its own, say), or the attribute was set after the node was "
            "made (`p.k = 3`, a counter that had already counted), and a copy rebuilt from "
            "its arguments would answer otherwise. Make it from its arguments alone (a seed "
            "an argument, a setting a constructor argument), or run it where the graph is "
            'called or on a `Worker.generic(mode="local")` worker'
        )


@dataclass(frozen=True)
class Blueprint:
    """What another process needs to rebuild a node: its identity, the constructor call
    that made it, and the digest of its declaration to check the result against — and
    what the node holds in its public attributes (:func:`~somatize.node.held_by`) when it
    is sent, which a copy rebuilt from the call must hold too."""

    identity: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    declaration: str | None
    maker: str | None = None
    """``module:Class.method`` that builds the node from the class ``identity`` names and
    the arguments, for a node that stands for another class; None: the class is the node's."""
    held: tuple[tuple[str, str], ...] | None = None
    """Each public attribute with a canonical form, by the digest of that form, as the
    node holds them when it is sent; None: not checked. A copy that holds state is
    checked once its state is loaded (:func:`check_held`)."""

    def to_bytes(self) -> bytes:
        """The bytes of this blueprint: what crosses a wire (worked out once). They are
        canonical bytes written exact, so that the arguments come back as they were made:
        each dict in the order it was built in, a bytearray as one — a node reads both
        (``for name in order``), and a copy built from them sorted or turned to bytes
        would compute otherwise. (A key takes them alike; a blueprint's bytes are no key.)"""
        return self._bytes

    @cached_property
    def _bytes(self) -> bytes:
        held = None if self.held is None else [list(pair) for pair in self.held]
        fields = [self.identity, self.args, self.kwargs, self.declaration, self.maker, held]
        return b"".join(canonical.parts_of(fields, "a blueprint", exact=True))

    @staticmethod
    def from_bytes(data: bytes | memoryview) -> Blueprint:
        """The blueprint whose bytes are ``data``; Unbuildable when they are not one."""
        try:
            identity, args, kwargs, declaration, maker, held = canonical.decode(data)
            if not isinstance(identity, str) or not isinstance(kwargs, dict):
                raise ValueError("fields of the wrong types")
            if maker is not None and not isinstance(maker, str):
                raise ValueError("a maker that is not a name")
            if held is not None:
                held = tuple((str(attr), str(digest)) for attr, digest in held)
            return Blueprint(identity, tuple(args), dict(kwargs), declaration, maker, held)
        except (ValueError, TypeError) as why:
            raise Unbuildable(f"these bytes are not a node's blueprint ({why})") from None


def blueprint_of(
    node: Node, name: str | None = None, held: tuple[tuple[str, str], ...] | None = None
) -> Blueprint:
    """How another process rebuilds ``node``; Unbuildable, saying what to do, when it cannot.

    ``name`` is what errors call the node (its name in a graph); ``held``, what it holds
    in its public attributes now (:func:`~somatize.node.held_by`), which the copy must hold
    too — a copy of a node that holds state once that state is loaded into it."""
    kind = type(node)
    called = f"`{name or node._smz.name or kind.__qualname__}` ({node.kind_name()})"
    identity = node._smz.identity or identity_of(kind)
    if identity is None:
        raise Unbuildable(
            f"{called} has no stable name — its class is made inside a function or at run "
            "time — so no other process can rebuild it. Define the class at module level in a "
            "module the worker can import"
        )
    try:
        maker, args, kwargs = node.recipe()
    except Unbuildable as why:
        raise Unbuildable(f"{called} cannot be rebuilt in another process: {why}") from None
    try:
        canonical.parts_of([tuple(args), dict(kwargs)], exact=True)
    except canonical.NotCanonical as why:
        raise Unbuildable(
            f"{called} cannot be rebuilt in another process: it was constructed with "
            f"arguments that cannot cross a wire ({why}). Construct it from canonical values "
            "(a path or a name rather than an open object), or run it where the graph is "
            'called or on a `Worker.generic(mode="local")` worker'
        ) from None
    try:
        declaration: str | None = node.declaration(name)
    except SomatizeError:
        declaration = None
    return Blueprint(identity, tuple(args), dict(kwargs), declaration, maker, held)


def state_crosses(node: Node) -> bool:
    """Whether ``node`` can hand its state to a copy of it rebuilt elsewhere: its class
    writes both :meth:`~somatize.node.Node.state_bytes` and
    :meth:`~somatize.node.Node.load_state`."""
    from somatize.node import Node

    kind = type(node)
    return kind.state_bytes is not Node.state_bytes and kind.load_state is not Node.load_state
