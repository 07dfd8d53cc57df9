"""Residency: where the copies of an answer live, and how they get there.

An answer can have copies in three places, nearest first::

    device tier     rows of one tensor on the device the module runs on
    host tier       rows of one tensor in host memory
    store           item answers packed many per blob (the store's packing)

Answers are immutable, so a copy is either current or absent: there is no
version to compare and nothing to invalidate, only the question of which copy
is nearest. A recall takes the nearest; a copy moves only when it is needed
somewhere it is not, and never back to where it already is. A row computed and
kept in no memory tier has one more copy while its write is under way, in the
store writer's staging (:meth:`Writer.recall`), which a recall takes before the
store's.

**Memory tiers** (:class:`Tier`) keep rows of equal shape and dtype in one
preallocated tensor (a :class:`Bank`) with a dict from key to row slot, so
recalling a whole batch is one dict pass over its keys and one ``index_select``
— as cheap as reading precomputed features out of a tensor. A tier holds at
most its byte budget: what its banks allocate, not only the rows they hold, each row
counted with the dict entry it is found by (:data:`ROW_INDEX_BYTES`, in host memory
whatever the tier's device — for rows of a few floats, most of what a tier holds). A
bank reserves room in proportion to what it holds (a first chunk of
:data:`_FIRST_BYTES`, then twice what it has, as far as the budget leaves), and
when rows no longer fit, the other banks give back the room they reserved and do
not use: rows of many shapes (sequences of many lengths) fill the budget as rows
of one shape do. It never evicts: in a shuffled epoch every row comes back
once per epoch, and a least-recently-used policy over a working set larger than
the budget would evict each row just before it is asked for again (no hits at
all), whereas keeping what fits first gives ``budget / working set`` of the
rows from memory, every epoch. What does not fit goes to the next tier, then to
the store only.

The background store writer, which keeps rows in the store behind the step, is
:mod:`somatize_torch.writer`; the bytes a row is kept as are
:mod:`somatize_torch._row_codec`. Their names are importable from here too.
"""

from __future__ import annotations

import array
import itertools
import operator
from collections.abc import Hashable, Sequence

import torch

from somatize_torch._row_codec import decode_rows, encode_rows, select_rows
from somatize_torch.writer import WriteFailed, Writer, store_lock

_NO_SLOT = -1
"""The slot a bank's lookup answers for a row it does not hold."""

__all__ = [
    "ROW_INDEX_BYTES",
    "Bank",
    "Tier",
    "WriteFailed",
    "Writer",
    "decode_rows",
    "encode_rows",
    "store_lock",
]

_FIRST_BYTES = 64 << 10
"""How many bytes of rows a bank first has room for (at least the rows it is first
handed); it doubles from there, as far as its tier's budget leaves."""

ROW_INDEX_BYTES = 256
"""What a tier counts for each row it has room for, beside the row's own bytes: the dict
entry that finds the row (its key, the row's name and its slot: 130 to 210 bytes, as the
dict grows), in host memory. A row of four floats is 16 bytes and its entry about ten times
that, so a budget that counted the rows alone would let the entries of a tier of small rows
take ten times its budget."""


# ------------------------------------------------------------------------------ memory tiers


class Bank:
    """Rows of one shape and dtype in one tensor, with a dict from key to row slot.

    Slots are written once and never change (answers are immutable), so a view of
    rows already in the bank stays valid while later rows are appended. Its tensor is
    an ordinary one even when rows come from under ``torch.inference_mode`` (a
    validation loop's), so rows computed outside it can still be appended.
    """

    __slots__ = ("device", "dtype", "row_bytes", "row_shape", "slots", "tensor", "used")

    row_bytes: int
    """What one row costs the tier: its bytes and its entry in ``slots``
    (:data:`ROW_INDEX_BYTES`)."""

    def __init__(self, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.row_shape = row_shape
        self.dtype = dtype
        self.device = device
        size = torch.Size(row_shape).numel() * torch.empty((), dtype=dtype).element_size()
        self.row_bytes = size + ROW_INDEX_BYTES
        self.slots: dict[Hashable, int] = {}
        with torch.inference_mode(False):
            self.tensor = torch.empty((0, *row_shape), dtype=dtype, device=device)
        self.used = 0

    @property
    def allocated(self) -> int:
        """Bytes of the rows this bank has room for (held or not), each with its entry."""
        return int(self.tensor.shape[0]) * self.row_bytes

    def append(self, keys: Sequence[Hashable], rows: torch.Tensor, most: int) -> None:
        """Appends ``rows`` (on any device) under ``keys`` (none of them already here),
        growing the tensor geometrically up to ``most`` rows.

        Rows coming to a bank in host memory from a device are copied before this returns:
        a copy that did not wait could leave the bank reading rows the device has not yet
        written. Rows going to a device are copied in its stream's order, as usual."""
        count = len(keys)
        end = self.used + count
        with torch.inference_mode(False):
            if end > self.tensor.shape[0]:
                first = _FIRST_BYTES // self.row_bytes
                self._resize(min(max(end, 2 * self.tensor.shape[0], first), most))
            self.tensor[self.used : end].copy_(rows, non_blocking=self.device.type != "cpu")
        # The keys are recorded last, and all at once, after the rows are counted: an
        # interrupt (Ctrl-C in a forward) before that leaves none of them here, and one
        # between the two statements leaves rows counted that no key points at (room
        # lost, never a wrong row). Never a key at a slot the next append writes over.
        placed = dict(zip(keys, range(self.used, end), strict=True))
        self.used = end
        self.slots.update(placed)

    def trim(self) -> int:
        """Gives back the room reserved beyond the rows held; returns how many bytes."""
        spare = self.allocated - self.used * self.row_bytes
        if spare:
            with torch.inference_mode(False):
                self._resize(self.used)
        return spare

    def _resize(self, rows: int) -> None:
        resized = torch.empty((rows, *self.row_shape), dtype=self.dtype, device=self.device)
        resized[: self.used].copy_(self.tensor[: self.used])
        self.tensor = resized

    def gather(self, slots: Sequence[int]) -> torch.Tensor:
        """The rows at ``slots``, in that order, as a new tensor on the bank's device."""
        if not slots:
            return self.tensor[:0].clone()
        # From an array of int64, not a list: a third of the time for a batch of slots.
        index = torch.frombuffer(array.array("q", slots), dtype=torch.long)
        if self.device.type != "cpu":
            index = index.to(self.device, non_blocking=True)
        return select_rows(self.tensor, index)


class Tier:
    """One memory tier: banks on one device, within a byte budget, never evicting."""

    def __init__(self, name: str, device: torch.device | str, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"the {name} tier's byte budget must be 0 or more, got {budget}")
        self.name = name
        self.device = torch.device(device)
        self.budget = int(budget)
        self.banks: list[Bank] = []

    @property
    def used(self) -> int:
        """Bytes of rows this tier holds, each with its entry in its bank's dict."""
        return sum(bank.used * bank.row_bytes for bank in self.banks)

    @property
    def allocated(self) -> int:
        """Bytes its banks have room for: what counts against the budget."""
        return sum(bank.allocated for bank in self.banks)

    @property
    def rows(self) -> int:
        """How many rows this tier holds."""
        return sum(bank.used for bank in self.banks)

    def __contains__(self, key: object) -> bool:
        return any(key in bank.slots for bank in self.banks)

    def find(
        self, keys: Sequence[Hashable], positions: Sequence[int] | None = None
    ) -> tuple[list[tuple[list[int] | None, torch.Tensor]], list[int]]:
        """The rows held here of ``keys[p]`` for ``p`` in ``positions`` (None: all of them):
        pieces of (batch positions — None when they are all of ``keys``, in order — and
        their rows), and the positions not held here.

        A whole batch found in one bank costs one dict pass and one gather; each bank is
        looked in by one mapped pass over the keys still missing, not a Python step a row.
        """
        pieces: list[tuple[list[int] | None, torch.Tensor]] = []
        every = list(range(len(keys)))
        rest = every if positions is None else list(positions)
        wanted = list(keys) if positions is None else [keys[p] for p in rest]
        # Positions asked out of order, or one twice, are never all of keys in order, even
        # as many as there are keys: their rows go with their positions.
        in_order = positions is None or rest == every
        for bank in self.banks:
            if not rest:
                break
            slots = list(map(bank.slots.get, wanted, itertools.repeat(_NO_SLOT, len(wanted))))
            if _NO_SLOT not in slots:  # all the rows still missing are in this bank
                whole = in_order and len(rest) == len(keys)
                pieces.append((None if whole else rest, bank.gather(slots)))
                return pieces, []
            held = list(map(_NO_SLOT.__ne__, slots))
            if any(held):
                # Some of the rows still missing: never all of keys.
                hit_at = list(itertools.compress(rest, held))
                hit_slots = list(itertools.compress(slots, held))
                pieces.append((hit_at, bank.gather(hit_slots)))
                missed = list(map(operator.not_, held))
                rest = list(itertools.compress(rest, missed))
                wanted = list(itertools.compress(wanted, missed))
        return pieces, rest

    def admit(self, keys: Sequence[Hashable], rows: torch.Tensor) -> int:
        """Keeps as many of ``rows`` (the first ones) as the budget allows; returns how many.

        Keys already here are not kept twice: the caller only admits what it did not
        find here."""
        if not keys:
            return 0
        row_shape = tuple(rows.shape[1:])
        bank = next(
            (b for b in self.banks if b.row_shape == row_shape and b.dtype == rows.dtype), None
        )
        row_bytes = (
            bank.row_bytes
            if bank is not None
            else torch.Size(row_shape).numel() * rows.element_size() + ROW_INDEX_BYTES
        )
        # Rows fit in the room a bank has left, and in what the budget has not allocated.
        capacity = int(bank.tensor.shape[0]) if bank is not None else 0
        held = bank.used if bank is not None else 0
        if capacity - held + max(self.budget - self.allocated, 0) // row_bytes < len(keys):
            for other in self.banks:  # short of room: the others give back what they do not use
                if other is not bank:
                    other.trim()
        most = capacity + max(self.budget - self.allocated, 0) // row_bytes
        take = min(len(keys), most - held)
        if take <= 0:
            return 0
        if bank is None:
            bank = Bank(row_shape, rows.dtype, self.device)
            self.banks.append(bank)
        bank.append(keys[:take], rows[:take], most)
        return take

    def __repr__(self) -> str:
        return (
            f"Tier({self.name!r}, {str(self.device)!r}, {self.rows} rows, "
            f"{self.used}/{self.budget} bytes)"
        )
