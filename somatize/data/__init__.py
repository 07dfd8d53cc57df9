"""somatize.data: where the rows come from.

A dataset is not a special kind of thing here. A source is a node — it has a
forward, which is why ``>>``, ``.at()``, ``.cached()``, the record and the
figure all reach it — and what is different is what the graph is handed: not a
batch, a coordinate::

    g = Graph.somatize(Parquet(store, "sms/train").named("sms").frozen() >> clean)
    settle(g)
    g.forward({"at": 4096, "take": 64}, store=store)

A coordinate is keyed in a microsecond and reads nothing, and the rows it
stands for are named by the span and by the dataset's version — the digest the
store already worked out — so a cache under a source never weighs a batch.

- :class:`Parquet` (a dataset in a store), :class:`ParquetDir` (a directory of
  files), :class:`Table` (a table in memory): sources read by span, each with a
  ``version`` that :func:`settle` makes its frozen state;
- :class:`Stream`: whatever is newest; cannot be frozen, so nothing under it is
  cached;
- :class:`Frame`: the rows a source answers, Arrow underneath (``column``,
  ``to_arrow``, ``to_polars``); :func:`to_arrow` for any tabular value;
- :func:`spans`: the coordinates that walk a source to its end.

Importing this package registers the ``arrow`` codec with ``somatize.CODECS``,
so frames and tables are kept and cross to workers as Arrow IPC.
"""

from somatize.codecs import CODECS
from somatize.data.codec import ArrowCodec
from somatize.data.coordinate import BadCoordinate, Counted, NotACoordinate, span_of, spans
from somatize.data.errors import DataError
from somatize.data.frame import (
    AmbiguousColumn,
    Frame,
    NoPolars,
    NotArrow,
    NotPlain,
    UnknownColumn,
    to_arrow,
)
from somatize.data.parquet import NotParquet, Parquet
from somatize.data.parquet_dir import DatasetChanged, ParquetDir
from somatize.data.settle import NotADigest, SameDigestOtherValues, Settles, settle
from somatize.data.sources import Stream, Table, TooManyRows, Unfreezable

CODECS.register(ArrowCodec())

__all__ = [
    "AmbiguousColumn",
    "ArrowCodec",
    "BadCoordinate",
    "Counted",
    "DataError",
    "DatasetChanged",
    "Frame",
    "NoPolars",
    "NotACoordinate",
    "NotADigest",
    "NotArrow",
    "NotParquet",
    "NotPlain",
    "Parquet",
    "ParquetDir",
    "SameDigestOtherValues",
    "Settles",
    "Stream",
    "Table",
    "TooManyRows",
    "Unfreezable",
    "UnknownColumn",
    "settle",
    "span_of",
    "spans",
    "to_arrow",
]
