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
preallocated tensor (a :class:`Bank`), and one dict from key to row slot for all
their banks, a slot's number saying its bank too (:data:`_BANK_ROWS`). Recalling
a whole batch is one dict pass over its keys and one ``index_select`` — as cheap
as reading precomputed features out of a tensor, however many banks the tier has:
sequences padded each batch to its own length make hundreds of row shapes, and a
batch's keys are never looked for in the banks of the others. A tier holds at
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
import contextlib
import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence

import torch

from somatize_torch._row_codec import decode_rows, encode_rows, select_rows
from somatize_torch.writer import WriteFailed, Writer, store_lock

_NO_SLOT = -1
"""The slot a tier's lookup answers for a row it does not hold."""

_BANK_ROWS = 1 << 40
"""How many slot numbers each bank has in its tier's dict: bank ``n``'s rows are numbered
from ``n * _BANK_ROWS``, so a row's number says which bank holds it and where, and one
dict finds rows of every shape (far more rows than a bank ever holds)."""

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
    """Rows of one shape and dtype in one tensor, their keys in its tier's dict from key to
    slot number, numbered from the bank's ``base``.

    Slots are written once and never change (answers are immutable), so a view of
    rows already in the bank stays valid while later rows are appended. Its tensor is
    an ordinary one even when rows come from under ``torch.inference_mode`` (a
    validation loop's), so rows computed outside it can still be appended.
    """

    __slots__ = ("base", "device", "dtype", "row_bytes", "row_shape", "slots", "tensor", "used")

    row_bytes: int
    """What one row costs the tier: its bytes and its entry in ``slots``
    (:data:`ROW_INDEX_BYTES`)."""

    def __init__(
        self,
        row_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        slots: dict[Hashable, int],
        base: int = 0,
    ) -> None:
        self.row_shape = row_shape
        self.dtype = dtype
        self.device = device
        size = torch.Size(row_shape).numel() * torch.empty((), dtype=dtype).element_size()
        self.row_bytes = size + ROW_INDEX_BYTES
        self.slots = slots  # the tier's, shared by all its banks
        self.base = base  # the number of this bank's first row in ``slots``
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
        placed = dict(zip(keys, range(self.base + self.used, self.base + end), strict=True))
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

    def gather(self, slots: Iterable[int]) -> torch.Tensor:
        """The rows numbered ``slots`` (as in the tier's dict), in that order, as a new
        tensor on the bank's device."""
        # From an array of int64, not a list: a third of the time for a batch of slots.
        numbers = array.array("q", slots)
        if not numbers:
            return self.tensor[:0].clone()
        index = torch.frombuffer(numbers, dtype=torch.long)
        if self.base:
            index = index - self.base
        if self.device.type != "cpu":
            index = index.to(self.device, non_blocking=True)
        return select_rows(self.tensor, index)


class Tier:
    """One memory tier: banks on one device, within a byte budget, never evicting.

    ``slots`` maps each key held to its row's number (:data:`_BANK_ROWS`): a lookup costs
    the same whatever the number of banks, as does finding the bank for rows of a shape."""

    def __init__(self, name: str, device: torch.device | str, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"the {name} tier's byte budget must be 0 or more, got {budget}")
        self.name = name
        self.device = torch.device(device)
        self.budget = int(budget)
        self.clear()

    def clear(self) -> None:
        """Lets go of every row held, and of the banks holding them."""
        self.banks: list[Bank] = []  # bank n holds the rows numbered from n * _BANK_ROWS
        self.slots: dict[Hashable, int] = {}
        self._bank_of: dict[tuple[tuple[int, ...], torch.dtype], Bank] = {}
        # Kept as banks grow and give back room, not summed over them: with rows of
        # hundreds of shapes, a sum a batch would cost as much as the lookup.
        self._allocated = 0
        self._roomy: dict[Bank, None] = {}  # the banks that may have room they do not use

    @property
    def used(self) -> int:
        """Bytes of rows this tier holds, each with its entry in the tier's dict."""
        return sum(bank.used * bank.row_bytes for bank in self.banks)

    @property
    def allocated(self) -> int:
        """Bytes its banks have room for: what counts against the budget."""
        return self._allocated

    @property
    def rows(self) -> int:
        """How many rows this tier holds."""
        return sum(bank.used for bank in self.banks)

    def __contains__(self, key: object) -> bool:
        return key in self.slots

    def find(
        self, keys: Sequence[Hashable], positions: Sequence[int] | None = None
    ) -> tuple[list[tuple[list[int] | None, torch.Tensor]], list[int]]:
        """The rows held here of ``keys[p]`` for ``p`` in ``positions`` (None: all of them):
        pieces of (batch positions — None when they are all of ``keys``, in order — and
        their rows), and the positions not held here.

        Each key is looked up once, in the tier's one dict, whatever the number of banks.
        A whole batch found in one bank then costs one gather; rows found in several banks
        are sorted by mapped passes, one per bank they are in, not a Python step a row.
        """
        rest = list(range(len(keys))) if positions is None else list(positions)
        wanted = keys if positions is None else [keys[p] for p in rest]
        found = list(map(self.slots.get, wanted, itertools.repeat(_NO_SLOT, len(wanted))))
        if not found:
            return [], rest
        bank = self._holding_all(found)
        if bank is not None:
            # Positions asked out of order, or one twice, are never all of keys in order,
            # even as many as there are keys: their rows go with them.
            whole = positions is None or rest == list(range(len(keys)))
            return [(None if whole else rest, bank.gather(found))], []
        return self._found_apart(rest, found), list(
            itertools.compress(rest, map(_NO_SLOT.__eq__, found))
        )

    def _holding_all(self, found: list[int]) -> Bank | None:
        """The bank holding every row numbered ``found``, if one does."""
        if len(self.banks) == 1:  # rows of one shape, as a rule: one pass tells
            return None if _NO_SLOT in found else self.banks[0]
        lowest = min(found)
        if lowest == _NO_SLOT:
            return None
        bank = self.banks[lowest // _BANK_ROWS]
        return bank if max(found) < bank.base + _BANK_ROWS else None

    def _found_apart(
        self, rest: list[int], found: list[int]
    ) -> list[tuple[list[int] | None, torch.Tensor]]:
        """The rows numbered ``found`` (:data:`_NO_SLOT` for none) at batch positions
        ``rest``, a piece a bank they are in: never all of the keys asked."""
        banks = list(map(_BANK_ROWS.__rfloordiv__, found))  # _NO_SLOT stays _NO_SLOT
        pieces: list[tuple[list[int] | None, torch.Tensor]] = []
        for number in dict.fromkeys(banks):
            if number != _NO_SLOT:
                held = list(map(number.__eq__, banks))
                rows = self.banks[number].gather(itertools.compress(found, held))
                pieces.append((list(itertools.compress(rest, held)), rows))
        return pieces

    def admit(self, keys: Sequence[Hashable], rows: torch.Tensor) -> int:
        """Keeps as many of ``rows`` (the first ones) as the budget allows; returns how many.

        Keys already here are not kept twice: the caller only admits what it did not
        find here."""
        if not keys:
            return 0
        row_shape = tuple(rows.shape[1:])
        bank = self._bank_of.get((row_shape, rows.dtype))
        row_bytes = (
            bank.row_bytes
            if bank is not None
            else torch.Size(row_shape).numel() * rows.element_size() + ROW_INDEX_BYTES
        )
        # Rows fit in the room a bank has left, and in what the budget has not allocated.
        capacity = int(bank.tensor.shape[0]) if bank is not None else 0
        held = bank.used if bank is not None else 0
        if capacity - held + max(self.budget - self.allocated, 0) // row_bytes < len(keys):
            self._trim_all_but(bank)  # short of room: the others give back what they do not use
        most = capacity + max(self.budget - self.allocated, 0) // row_bytes
        take = min(len(keys), most - held)
        if take <= 0:
            return 0
        if bank is None:
            base = len(self.banks) * _BANK_ROWS
            bank = Bank(row_shape, rows.dtype, self.device, self.slots, base)
            self.banks.append(bank)
            self._bank_of[row_shape, rows.dtype] = bank
        # Listed as roomy before it grows: an interrupt then leaves it to be trimmed still.
        self._roomy[bank] = None
        with self._counted(bank):
            bank.append(keys[:take], rows[:take], most)
        return take

    def _trim_all_but(self, bank: Bank | None) -> None:
        """Has every bank but ``bank`` give back the room it reserved and does not use."""
        for other in list(self._roomy):
            if other is not bank:
                with self._counted(other):
                    other.trim()
                del self._roomy[other]

    @contextlib.contextmanager
    def _counted(self, bank: Bank) -> Iterator[None]:
        """Counts in ``allocated`` what ``bank`` comes to allocate meanwhile, even if
        interrupted: the budget stays exact."""
        before = bank.allocated
        try:
            yield
        finally:
            self._allocated += bank.allocated - before

    def __repr__(self) -> str:
        return (
            f"Tier({self.name!r}, {str(self.device)!r}, {self.rows} rows, "
            f"{self.used}/{self.budget} bytes)"
        )
