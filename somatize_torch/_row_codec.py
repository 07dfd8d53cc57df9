"""The row codec: the rows of a per-row answer as the ``tensor`` codec's bytes, a batch
at a time.

A row is kept in the store as an answer of one tensor, so any reader of the codec
reads it. The rows one cache writes share a dtype and a shape, and so a header:
:func:`encode_rows` makes it once per batch, and :func:`decode_rows` reads it once
and copies a whole batch's data into one tensor in one go. The writer
(:mod:`somatize_torch.writer`) encodes and a recall (:mod:`somatize_torch.rows`)
decodes, so both halves live here, below the two of them and below
:mod:`somatize_torch.residency`, which names them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from somatize_torch.codec import TENSOR, row_layout
from somatize_torch.digest import host_bytes, memory_of

__all__ = ["decode_rows", "encode_rows"]


def encode_rows(rows: torch.Tensor) -> list[list[memoryview | bytes]]:
    """Each row of a host tensor as the ``tensor`` codec writes it, header made once.

    Equal to ``[TENSOR.encode(row) for row in rows]``: the header depends only on a
    row's dtype and shape, which all rows share."""
    if rows.shape[0] == 0:
        return []
    header = bytes(TENSOR.encode(rows[0])[0])
    flat = host_bytes(rows)
    size = flat.nbytes // rows.shape[0]
    return [[header, flat[i * size : (i + 1) * size]] for i in range(rows.shape[0])]


def decode_rows(datas: Sequence[memoryview]) -> torch.Tensor:
    """The rows whose ``tensor``-codec bytes are ``datas``, stacked into one host tensor.

    Rows that one cache wrote share their header (it says only dtype and shape), so the
    first row's header is read by the codec — once per distinct header in the process —
    and when every row has that header and the length it implies, their data are
    copied into place in one go. Any other batch is decoded row by row. ValueError for
    bytes that are damaged."""
    header, dtype, shape, size = row_layout(datas[0])
    head = len(header)
    count = len(datas)
    out = torch.empty((count, *shape), dtype=dtype)
    if size == 0:
        return out
    if set(map(len, datas)) == {head + size} and (
        b"".join([row[:head] for row in datas]) == header * count
    ):
        memory_of(out, writable=True)[:] = b"".join([row[head:] for row in datas])
        return out
    for index, row in enumerate(datas):
        one = TENSOR.decode(row)
        if not isinstance(one, torch.Tensor) or one.shape != shape or one.dtype != dtype:
            raise ValueError(f"row answer {index} is not a {dtype} row of shape {list(shape)}")
        out[index].copy_(one)
    return out
