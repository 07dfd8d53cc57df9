"""The root of everything :mod:`somatize.data` refuses.

Each module of the package defines its errors beside the code that raises them;
they descend from :class:`DataError` (itself a :class:`~somatize.SomatizeError`)
and from the builtin they are::

    DataError
    ├── BadCoordinate (ValueError)        somatize.data.coordinate
    │   └── NotACoordinate (TypeError)
    ├── UnknownColumn (KeyError)          somatize.data.frame
    ├── NotArrow (TypeError)              somatize.data.frame
    ├── NoPolars (ImportError)            somatize.data.frame
    ├── NotParquet (ValueError)           somatize.data.parquet
    ├── DatasetChanged (RuntimeError)     somatize.data.parquet_dir
    ├── NotADigest (TypeError)            somatize.data.settle
    ├── Unfreezable (ValueError)          somatize.data.sources
    └── TooManyRows (ValueError)          somatize.data.sources

Every message says what happened, why it matters, and what to do.
"""

from __future__ import annotations

from somatize.errors import SomatizeError

__all__ = ["DataError"]


class DataError(SomatizeError):
    """Anything a data source or a frame refuses."""
