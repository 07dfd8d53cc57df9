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

from somatize_torch._codec_header import _strides_overflow
from somatize_torch.codec import TENSOR, _check_bools, row_layout
from somatize_torch.digest import host_bytes, memory_of

__all__ = ["decode_rows", "encode_rows"]


def encode_rows(rows: torch.Tensor) -> list[list[memoryview | bytes]]:
    """Each row of a host tensor as the ``tensor`` codec writes it, header made once.

    Equal to ``[TENSOR.encode(row) for row in rows]``: the header depends only on a
    row's dtype and shape, which all rows share."""
    if rows.shape[0] == 0:
        return []
    # The rows are written in C order (a channels_last batch too): so is the header's row.
    header = bytes(TENSOR.encode(rows[0].contiguous())[0])
    flat = host_bytes(rows)
    size = flat.nbytes // rows.shape[0]
    return [[header, flat[i * size : (i + 1) * size]] for i in range(rows.shape[0])]


def decode_rows(datas: Sequence[memoryview]) -> torch.Tensor:
    """The rows whose ``tensor``-codec bytes are ``datas``, stacked into one host tensor.

    Rows that one cache wrote share their header (it says only dtype and shape), so the
    first row's header is read by the codec — once per distinct header in the process —
    and when every row has that header and the length it implies, their data are
    copied into place in one go. Any other batch is decoded row by row. Either way a
    row is read only as the codec reads it: its header checked, its data exactly the
    bytes the header gives it (from the first byte after the header to the last of the
    row), a bool row's bytes 0 or 1; and nothing is allocated for a row until its bytes
    are known to be there. ValueError for bytes that are damaged."""
    header, dtype, shape, size = row_layout(datas[0])
    head = len(header)
    count = len(datas)
    if set(map(len, datas)) == {head + size} and (
        b"".join([row[:head] for row in datas]) == header * count
    ):
        # The header, checked, gives the one tensor of a row the bytes from the first of its
        # data to the last (none is left out), and every row holds exactly those.
        out = _stacked(count, shape, dtype)
        if size:
            memory_of(out, writable=True)[:] = b"".join([row[head:] for row in datas])
            if dtype is torch.bool:
                _check_bools(out, "a row answer")
        return out
    stacked: torch.Tensor | None = None
    for index, row in enumerate(datas):
        one = TENSOR.decode(row)
        if not isinstance(one, torch.Tensor) or one.shape != shape or one.dtype != dtype:
            raise ValueError(f"row answer {index} is not a {dtype} row of shape {list(shape)}")
        if stacked is None:  # a row is there: the rows take as many bytes as it times count
            stacked = _stacked(count, shape, dtype)
        stacked[index].copy_(one)
    assert stacked is not None
    return stacked


def _stacked(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Memory for ``count`` rows of ``shape``; ValueError when torch cannot lay them out (a
    row of no element whose sizes, times its count, overflow a stride)."""
    if _strides_overflow([count, *shape]):
        raise ValueError(f"{count} rows of shape {list(shape)[:8]} cannot be stacked: damaged")
    return torch.empty((count, *shape), dtype=dtype)
