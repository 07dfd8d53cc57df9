"""The roots of everything somatize raises or warns.

Each module defines its own errors beside the code that raises them; they all
descend from :class:`SomatizeError` and from the builtin they are, so a caller
can catch either ``SomatizeError`` or, say, ``ValueError``::

    SomatizeError
    ├── NotCanonical (TypeError)          somatize.canonical
    ├── Undeclared (TypeError)            somatize.node
    ├── GraphError (ValueError)           somatize.graph
    │   ├── Cycle
    │   └── UnknownNode (KeyError)
    ├── MemoryError_ (ValueError)         somatize.memory
    │   ├── Unsettled
    │   ├── Nameless
    │   └── NotSettled
    ├── CodecError (TypeError)            somatize.codecs
    ├── StoreError (OSError)              somatize.store
    │   ├── NameNotFound (KeyError)
    │   ├── BadName (ValueError)
    │   └── Corrupt
    │       └── NewerFormat
    ├── NodeFailed (RuntimeError)         somatize.engine
    │   └── FailedOnWorker                somatize.broker
    ├── WatcherFailed (RuntimeError)      somatize.engine
    ├── Unbuildable (LookupError)         somatize.catalog
    ├── UnknownWorker (ValueError)        somatize.broker
    ├── BadWorker (ValueError)
    ├── WorkerLost (RuntimeError)
    ├── WorkerTimeout (TimeoutError)
    ├── NoRay (ImportError)
    ├── RowsError (ValueError)            somatize_torch.rows
    │   ├── NotRowwise (TypeError)
    │   └── NeedsIndex
    └── WriteFailed (OSError)             somatize_torch.writer

Every message says what happened, why it matters, and what to do. An error built from
more than its message (:class:`_Rebuilt`) is pickled as its type, message and attributes,
so it crosses a process pool's boundary as itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SomatizeError", "SomatizeWarning"]


class SomatizeError(Exception):
    """Anything somatize refuses or fails at."""


class SomatizeWarning(UserWarning):
    """Something that works but is probably not what was meant."""


class _Befell(SomatizeError):
    """What befell a node's run that is no refusal of the library's: its worker died, did
    not answer in time, or was closed. The node's ``failed`` fact names the error's class,
    where a refusal says ``refused``."""


class _Rebuilt(BaseException):
    """An error made from more than its message, that still crosses a process boundary
    (a pool's, a Ray task's): pickled as its type, message and attributes, and rebuilt from
    them rather than by calling its constructor with the message alone."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), str(self), dict(vars(self)))


def _rebuilt(kind: type[BaseException], message: str, attributes: dict[str, Any]) -> BaseException:
    """The error of type ``kind`` saying ``message``, with ``attributes``, unpickled."""
    error = kind.__new__(kind)
    BaseException.__init__(error, message)
    vars(error).update(attributes)
    return error
