"""The row codec: the rows of a per-row answer as the ``tensor`` codec's bytes, a batch
at a time.

A row is kept in the store as an answer of one tensor, so any reader of the codec
reads it. The rows one cache writes share a dtype and a shape, and so a header:
:func:`encode_batch` makes it once per batch, and :func:`decode_rows` reads it once
and copies a whole batch's data into one tensor, each row straight from where it
was read. The writer (:mod:`somatize_torch.writer`) encodes and a recall
(:mod:`somatize_torch.rows`) decodes, so both halves live here, below the two of
them and below :mod:`somatize_torch.residency`, which names them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy
import torch

from somatize.store._packed import take_as_steady
from somatize_torch._codec_header import _strides_overflow
from somatize_torch.codec import (
    TENSOR,
    _apart,
    _check_bools,
    _refuse_bools,
    in_c_order,
    inverse_order,
    row_layout,
)
from somatize_torch.digest import memory_of

__all__ = [
    "as_bits",
    "batch_order",
    "decode_rows",
    "empty_rows",
    "encode_batch",
    "encode_batch_viewed",
    "encode_rows",
    "laid_out",
    "row_order",
    "select_rows",
]


def row_order(rows: torch.Tensor) -> list[int] | None:
    """The order of the dims of batch ``rows`` in its memory, outermost first, when that is
    not C order and the batch's elements lie in it with its rows one after another
    (channels_last, a batch of transposed rows): ``rows.permute(order)`` is contiguous, or
    has gaps only (a half of a channels_last batch split along its channels), and is
    copied dense in that order where rows are laid out (:func:`laid_out`) or written.
    None for a batch in C order (:func:`~somatize_torch.codec.in_c_order`: a channels_last
    map pooled to 1x1, contiguous to torch, is not), one whose memory order is C order
    with gaps, or one that overlaps (written in C order)."""
    if rows.dim() < 3 or in_c_order(rows):
        return None
    strides = rows.stride()
    order = [0, *sorted(range(1, rows.dim()), key=lambda d: (-strides[d], d))]
    if order == sorted(order):
        return None
    # With gaps, a kernel reading the rows picks its path by that order as it would for
    # dense ones (a conv takes the channels_last one): recalled dense in it, it takes the
    # same path on a hit as on the miss.
    stored = rows.permute(order)
    return order if stored.is_contiguous() or _apart(stored) else None


def batch_order(rows: torch.Tensor) -> list[int] | None:
    """The order of the dims of batch ``rows`` in its memory, outermost first, the batch's
    own among them: where the batch is dense in an order that puts another dim outside
    the batch's (a module that runs along a sequence first and hands the batch back
    transposed, each row's tokens a batch apart; a projection answered as ``(W @ x.T).T``),
    that order, else :func:`row_order`'s. Rows are kept and written in their own order
    whatever it is; a batch put together from them is laid out in it. A batch of one row
    says nothing of where the batch's dim lies: :func:`row_order`'s."""
    if rows.is_contiguous() or rows.shape[0] < 2:  # a batch torch calls contiguous: first
        return row_order(rows)
    strides = rows.stride()
    order = sorted(range(rows.dim()), key=lambda d: (-strides[d], d))
    if order[0] != 0 and rows.permute(order).is_contiguous():
        return order
    return row_order(rows)


def laid_out(rows: torch.Tensor, order: list[int] | None) -> torch.Tensor:
    """``rows`` with their dims in memory in ``order`` (:func:`batch_order`; None: C order),
    copied only when they are not so already."""
    if batch_order(rows) == order and (order is not None or in_c_order(rows)):
        return rows
    # Copied into C order, or into C order of the dims in `order`, by a clone: `contiguous`
    # hands back as they are rows that torch calls contiguous, whatever the strides of
    # their dims of size 1.
    if order is None:
        return rows.clone(memory_format=torch.contiguous_format)
    held = rows.permute(order).clone(memory_format=torch.contiguous_format)
    return held.permute(inverse_order(order))


def empty_rows(
    shape: tuple[int, ...], order: list[int] | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Memory for a batch of ``shape`` with its dims in memory in ``order`` (None: C
    order)."""
    if order is None:
        return torch.empty(shape, dtype=dtype, device=device)
    held = torch.empty([shape[d] for d in order], dtype=dtype, device=device)
    return held.permute(inverse_order(order))


class _Encoded(numpy.ndarray):
    """The bytes of a batch of rows as :func:`encode_rows` made them: written once, by a
    copy that holds no GIL, and never again, so a store takes them as it takes ``bytes``
    (:func:`~somatize.store._packed.take_as_steady`): hashed and written with no copy."""


take_as_steady(_Encoded)


def encode_rows(rows: torch.Tensor, order: list[int] | None = None) -> list[list[memoryview]]:
    """Each row of a host tensor as the ``tensor`` codec writes it: a piece of
    :func:`encode_batch`'s buffer a row, one after another.

    The bytes of ``[TENSOR.encode(row) for row in rows]``, for ``rows`` given as
    :func:`encode_batch` takes them."""
    whole, step = encode_batch(rows, order)
    return [[whole[i * step : (i + 1) * step]] for i in range(rows.shape[0])]


def encode_batch(rows: torch.Tensor, order: list[int] | None = None) -> tuple[memoryview, int]:
    """The rows of a host tensor as the ``tensor`` codec writes each, one after another in
    one buffer, and how many bytes each takes there; the header made once.

    The header depends only on a row's dtype, shape and order of dims in memory, which all
    rows share. Given the ``order`` of a batch's dims in memory (:func:`row_order`),
    ``rows`` is that batch permuted into it (contiguous), each row written as its memory
    holds it, with the order its dims are put back in.

    The buffer is made in one copy by torch, which lets go of the GIL as it copies: the
    writer thread that encodes a batch of many megabytes does not keep the training
    loop's thread from running meanwhile (a join into ``bytes`` would, as it copies and
    as the kernel hands it fresh pages). Nothing writes into it again, so a store hashes
    and writes it, or views of it, as it is (:class:`_Encoded`)."""
    buffer, step, _ = encode_batch_viewed(rows, order)
    return buffer, step


def encode_batch_viewed(
    rows: torch.Tensor, order: list[int] | None = None
) -> tuple[memoryview, int, torch.Tensor | None]:
    """:func:`encode_batch`'s buffer and step, and ``rows`` as a tensor viewing that buffer
    (the same values, laid out as ``rows`` is): what has the buffer holds the rows, and
    needs no copy of them besides. None where their values cannot be viewed there (a
    header whose bytes are no whole count of the dtype's), or where there are none."""
    if rows.shape[0] == 0:
        return memoryview(b""), 0, None
    if rows.dtype is torch.bool:
        # The header is the codec's for one row, which it checked alone: every row's bytes
        # are checked here, in one pass over the batch.
        _refuse_bools("tensor", "tensor", rows)
    header = _header(rows, order)
    count = rows.shape[0]
    size = rows[0].numel() * rows.element_size()
    step = len(header) + size
    encoded = torch.empty((count, step), dtype=torch.uint8)
    encoded[:, : len(header)] = header
    viewed = None
    if size:
        data = rows.contiguous().reshape(-1).view(torch.uint8)
        encoded[:, len(header) :] = data.view(count, size)
        if len(header) % rows.element_size() == 0:
            viewed = encoded[:, len(header) :].view(rows.dtype).view(rows.shape)
    return memory_of(encoded.view(-1), kind=_Encoded), step, viewed


_HEADERS: dict[tuple[torch.dtype, tuple[int, ...], tuple[int, ...] | None], torch.Tensor] = {}
"""Row headers as :func:`_header` made them, by the dtype, shape and order of dims of the
rows they head."""

_HEADERS_HELD = 256
"""How many row headers :data:`_HEADERS` keeps, at most."""


def _header(rows: torch.Tensor, order: list[int] | None) -> torch.Tensor:
    """The header the codec writes before each row of ``rows`` (as :func:`encode_batch` takes
    them), as bytes in a tensor: made by the codec once for each dtype, shape and order of
    dims (it says only those), rather than at every batch."""
    kind = (rows.dtype, tuple(rows.shape[1:]), None if order is None else tuple(order))
    found = _HEADERS.get(kind)
    if found is None:
        # The header of a row as the batch lies: the codec writes one not in C order as its
        # memory holds it, which is how the batch's bytes hold each row.
        if order is None:
            first = rows[0].contiguous()  # a batch in another order is written in C order
        else:
            first = rows[0].permute(inverse_order([d - 1 for d in order[1:]]))
        found = torch.tensor(list(bytes(TENSOR.encode(first)[0])), dtype=torch.uint8)
        if len(_HEADERS) < _HEADERS_HELD:
            _HEADERS[kind] = found
    return found


def decode_rows(datas: Sequence[memoryview]) -> torch.Tensor:
    """The rows whose ``tensor``-codec bytes are ``datas``, stacked into one host tensor.

    Rows that one cache wrote share their header (it says only dtype and shape), so the
    first row's header is read by the codec — once per distinct header in the process —
    and when every row has that header and the length it implies, their data are each
    copied into its place in one tensor, straight from where it was read. Any other batch
    is decoded row by row. Either way a row is read only as the codec reads it: its
    header checked, its data exactly the bytes the header gives it (from the first byte
    after the header to the last of the row), a bool row's bytes 0 or 1; and nothing is
    allocated for a row until its bytes are known to be there. ValueError for bytes that
    are damaged."""
    header, dtype, shape, size, back = row_layout(datas[0])
    head = len(header)
    count = len(datas)
    if set(map(len, datas)) == {head + size} and (
        b"".join([row[:head] for row in datas]) == header * count
    ):
        # The header, checked, gives the one tensor of a row the bytes from the first of its
        # data to the last (none is left out), and every row holds exactly those.
        out = _stacked(count, shape, dtype)
        if size:
            # Each row's data copied straight into its place: no joined copy between.
            into = memory_of(out, writable=True)
            for at, row in enumerate(datas):
                into[at * size : (at + 1) * size] = row[head:]
            if dtype is torch.bool:
                _check_bools(out, "a row answer")
        return _as_kept(out, back)
    logical = shape if back is None else tuple(shape[d] for d in back)
    stacked: torch.Tensor | None = None
    for index, row in enumerate(datas):
        one = TENSOR.decode(row)
        if not isinstance(one, torch.Tensor) or one.shape != logical or one.dtype != dtype:
            raise ValueError(f"row answer {index} is not a {dtype} row of shape {list(logical)}")
        if stacked is None:  # a row is there: the rows take as many bytes as it times count
            stacked = _as_kept(_stacked(count, shape, dtype), back)
        stacked[index].copy_(one)
    assert stacked is not None
    return stacked


def _as_kept(stacked: torch.Tensor, back: list[int] | None) -> torch.Tensor:
    """Rows read as their memory held them (``stacked``, of their shape in that order),
    given the order of their dims ``back`` puts back: the strides the computed rows had."""
    return stacked if back is None else stacked.permute([0, *(1 + d for d in back)])


def _stacked(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Memory for ``count`` rows of ``shape``; ValueError when torch cannot lay them out (a
    row of no element whose sizes, times its count, overflow a stride)."""
    if _strides_overflow([count, *shape]):
        raise ValueError(f"{count} rows of shape {list(shape)[:8]} cannot be stacked: damaged")
    return torch.empty((count, *shape), dtype=dtype)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""An integer dtype of each element size, which every device copies into place by index."""


def as_bits(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` as integers of their element's size, the same bits: torch copies no CPU
    tensor of a float8 dtype, or an unsigned one past uint8, into place by index, and a
    copy of bits is exactly the copy of the values. A conjugate or negative view (a module
    answering ``x.conj()`` or its ``.imag``) holds other bits than its values, and torch
    views none as another dtype: its values are taken first."""
    kind = _BITS.get(rows.element_size())
    if kind is None or rows.dtype is kind:
        return rows
    return rows.resolve_conj().resolve_neg().view(kind)


_GATHERED = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32}
    | {torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128}
)
"""The dtypes torch gathers by index on every device, as they are."""


def select_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows.index_select(0, index)`` for rows of any dtype: those of another dtype than
    :data:`_GATHERED` are gathered as their bits (:func:`as_bits`), since torch gathers a
    CPU tensor of one value a row of an unsigned dtype past uint8 (a score or a code a
    row, in uint16) for no index."""
    if rows.dtype in _GATHERED:
        return rows.index_select(0, index)
    bits = as_bits(rows)
    taken = bits.index_select(0, index)
    return taken if bits is rows else taken.view(rows.dtype)
