"""Stores: where answers live, named by what they are.

A store knows bytes, digests and keys — never graphs, nodes or engines. Two
homes share one interface: a local directory (``Store(path)``) and a bucket
(``Store.on_bucket("s3://bucket/prefix")``).
"""

from somatize.store._compact import Compacted
from somatize.store.base import (
    Answer,
    BadAddress,
    BadName,
    Corrupt,
    JoinedWrite,
    Missing,
    NameNotFound,
    NewerFormat,
    Store,
    StoreError,
    StoreFull,
    check_name,
)
from somatize.store.bucket import BucketStore
from somatize.store.local import LocalStore
from somatize.store.records import KEY_VARIABLE, KeyMismatch, NameSignedAlone, Unsigned
from somatize.store.upkeep import Collected, Damage, Verified

__all__ = [
    "KEY_VARIABLE",
    "Answer",
    "BadAddress",
    "BadName",
    "BucketStore",
    "Collected",
    "Compacted",
    "Corrupt",
    "Damage",
    "JoinedWrite",
    "KeyMismatch",
    "LocalStore",
    "Missing",
    "NameNotFound",
    "NameSignedAlone",
    "NewerFormat",
    "Store",
    "StoreError",
    "StoreFull",
    "Unsigned",
    "Verified",
    "check_name",
]
