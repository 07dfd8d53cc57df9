"""The catalog: who executes a node.

An identity is the name of what implements a node — ``module:qualname`` of its
class — so that any process can rebuild the node from ``(identity,
declaration)``: import the class, construct it with the declared arguments. A
class with no stable name (one made inside a function, a lambda) has no
identity unless it is given one, and what cannot be rebuilt says so.

The code fingerprint lives here too, since it is a fact about the
implementation: a digest of the class's source (or, where the source is not to
be had, of its compiled code). It is metadata, never part of a key.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Any

from somatize.errors import SomatizeError

__all__ = [
    "Catalog",
    "Unbuildable",
    "fingerprint_of",
    "identity_of",
]


class Unbuildable(SomatizeError, LookupError):
    """An identity that this process cannot turn back into an implementation."""


def identity_of(kind: type) -> str | None:
    """``module:qualname`` of ``kind``, or None when the name would not lead back to it.

    A class defined in ``__main__`` has an identity (a notebook's nodes are keyed
    like any other); one defined inside a function does not, since every call
    makes another class under the same name.
    """
    explicit = kind.__dict__.get("identity")
    if isinstance(explicit, str):
        return explicit
    qualname = kind.__qualname__
    if "<locals>" in qualname or "<lambda>" in qualname:
        return None
    return f"{kind.__module__}:{qualname}"


_FINGERPRINTS: dict[type, str] = {}


def fingerprint_of(kind: type) -> str:
    """A digest of how ``kind`` is written: its source, or its code when the source is
    not available (a class typed into an interpreter). Worked out once per class."""
    found = _FINGERPRINTS.get(kind)
    if found is None:
        found = _FINGERPRINTS[kind] = _fingerprint(kind)
    return found


def _fingerprint(kind: type) -> str:
    try:
        text = inspect.getsource(kind).encode()
    except (OSError, TypeError):
        pieces = []
        for name, member in sorted(vars(kind).items()):
            code = getattr(member, "__code__", None)
            if code is not None:
                pieces.append(name.encode() + code.co_code + repr(code.co_consts).encode())
        text = b"\0".join(pieces)
    return "sha256:" + hashlib.sha256(text).hexdigest()[:16]


class Catalog:
    """Identity → implementation, with registrations for what an import cannot find."""

    def __init__(self) -> None:
        self._registered: dict[str, type] = {}

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
        if not qualname:
            raise Unbuildable(f"`{identity}` is not of the form `module:qualname`")
        if module_name == "__main__":
            raise Unbuildable(
                f"`{identity}` is defined in `__main__` (a script or a notebook), which another "
                "process cannot import: move the class into a module that process can import, "
                "or register it there with `Catalog.register`"
            )
        try:
            found: Any = importlib.import_module(module_name)
        except ImportError as error:
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

    def rebuild(self, identity: str, arguments: dict[str, Any]) -> Any:
        """A new instance of ``identity`` built with the declared keyword ``arguments``."""
        kind = self.resolve(identity)
        positional = arguments.get("*args", ())
        named = {k: v for k, v in arguments.items() if k not in ("*args", "**kwargs")}
        named.update(arguments.get("**kwargs", {}))
        return kind(*positional, **named)
