"""Stores: where answers live, named by what they are.

A store knows bytes, digests and keys — never graphs, nodes or engines. Two
homes share one interface: a local directory (``Store(path)``) and a bucket
(``Store.on_bucket("s3://bucket/prefix")``).
"""

from somatize.store.base import (
    Answer,
    BadName,
    Corrupt,
    Missing,
    NameNotFound,
    Store,
    StoreError,
    check_name,
)
from somatize.store.local import LocalStore

__all__ = [
    "Answer",
    "BadName",
    "Corrupt",
    "LocalStore",
    "Missing",
    "NameNotFound",
    "Store",
    "StoreError",
    "check_name",
]
