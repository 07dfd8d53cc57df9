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

Every message says what happened, why it matters, and what to do.
"""

from __future__ import annotations

__all__ = ["SomatizeError", "SomatizeWarning"]


class SomatizeError(Exception):
    """Anything somatize refuses or fails at."""


class SomatizeWarning(UserWarning):
    """Something that works but is probably not what was meant."""
