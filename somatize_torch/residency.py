"""Residency: where the copies of an answer live, and how they get there.

An answer can have copies in three places, nearest first::

    device tier     rows of one tensor on the device the module runs on
    host tier       rows of one tensor in host memory
    store           item answers packed many per blob (the store's packing)

Answers are immutable, so a copy is either current or absent: there is no
version to compare and nothing to invalidate, only the question of which copy
is nearest. A recall takes the nearest; a copy moves only when it is needed
somewhere it is not, and never back to where it already is.

**Memory tiers** (:class:`Tier`) keep rows of equal shape and dtype in one
preallocated tensor (a :class:`Bank`) with a dict from key to row slot, so
recalling a whole batch is one dict pass over its keys and one ``index_select``
— as cheap as reading precomputed features out of a tensor. A tier holds at
most its byte budget (what its banks allocate, not only the rows they hold),
at every moment: a bank copies its rows into a larger tensor only when both fit
in the budget, and otherwise adds a tensor (a chunk) beside it, so a bank
holding more than half the budget is a few chunks, one gather each. A bank
reserves room in proportion to what it holds (a first chunk of
:data:`_FIRST_BYTES`, then twice what it has, as far as the budget leaves), and
when rows no longer fit, the other banks give back the room they reserved and do
not use, as far as their rows can move without passing the budget (waiting in
room another bank reserved, if need be); room that cannot is filled by rows of
its own shape. So rows of many shapes (sequences of many lengths) fill the
budget as rows of one shape do. It never evicts: in a shuffled epoch every row comes back
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
from collections.abc import Hashable, Sequence

import torch

from somatize_torch._row_codec import decode_rows, encode_rows
from somatize_torch.writer import WriteFailed, Writer, store_lock

__all__ = [
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


# ------------------------------------------------------------------------------ memory tiers


class Bank:
    """Rows of one shape and dtype in one tensor (or a few), with a dict from key to slot.

    Slots are written once and never change (answers are immutable). A slot is a row of
    the bank's chunks laid end to end: ``chunks`` holds (first slot, tensor) pairs, each
    chunk full but the last. A bank that grows copies its rows into one larger tensor when
    the old chunks and the new one fit in its tier's budget together, and otherwise adds a
    chunk beside them, so the bank never holds more than the budget, even for the moment
    of a copy; while the budget is roomy a bank is one tensor and a batch one gather.
    Its tensors are ordinary ones even when rows come from under ``torch.inference_mode``
    (a validation loop's), so rows computed outside it can still be appended.
    """

    __slots__ = (
        "chunks",
        "device",
        "dtype",
        "itemsize",
        "row_bytes",
        "row_shape",
        "slots",
        "used",
    )

    def __init__(self, row_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.row_shape = row_shape
        self.dtype = dtype
        self.device = device
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        # At least 1, so rows of no elements are still counted against a budget.
        self.row_bytes = max(1, torch.Size(row_shape).numel() * self.itemsize)
        self.slots: dict[Hashable, int] = {}
        # Replaced whole, never changed in place: an interrupt leaves the old or the new.
        self.chunks: tuple[tuple[int, torch.Tensor], ...] = ()
        self.used = 0

    @property
    def capacity(self) -> int:
        """How many rows this bank has room for (held or not)."""
        if not self.chunks:
            return 0
        first, tensor = self.chunks[-1]
        return first + int(tensor.shape[0])

    @property
    def allocated(self) -> int:
        """Bytes of the rows this bank has room for (held or not)."""
        return self.capacity * self.row_bytes

    def append(self, keys: Sequence[Hashable], rows: torch.Tensor, spare: int) -> None:
        """Appends ``rows`` (on any device) under ``keys`` (none of them already here),
        growing geometrically by at most ``spare`` rows (what the tier's budget has not
        allocated; the rows must fit in the room the bank has and that), never holding
        more than the budget, even for the moment of a copy.

        Rows coming to a bank in host memory from a device are copied before this returns:
        a copy that did not wait could leave the bank reading rows the device has not yet
        written. Rows going to a device are copied in its stream's order, as usual."""
        count = len(keys)
        end = self.used + count
        with torch.inference_mode(False):
            capacity = self.capacity
            if end > capacity:
                first = _FIRST_BYTES // self.row_bytes
                self._grow(min(max(end, 2 * capacity, first), capacity + spare), spare, end)
            blocking = self.device.type == "cpu"
            for start, tensor in self.chunks:
                lo, hi = max(self.used, start), min(end, start + int(tensor.shape[0]))
                if lo < hi:
                    piece = rows[lo - self.used : hi - self.used]
                    tensor[lo - start : hi - start].copy_(piece, non_blocking=not blocking)
        # The keys are recorded last, and all at once, after the rows are counted: an
        # interrupt (Ctrl-C in a forward) before that leaves none of them here, and one
        # between the two statements leaves rows counted that no key points at (room
        # lost, never a wrong row). Never a key at a slot the next append writes over.
        placed = dict(zip(keys, range(self.used, end), strict=True))
        self.used = end
        self.slots.update(placed)

    def _grow(self, rows: int, spare: int, needed: int) -> None:
        """Makes room for ``rows`` rows in all, ``needed`` of them at least, within ``spare``
        more rows (what the budget has not allocated).

        When the rows needed fit in ``spare`` beside the chunks they replace, they are
        copied into one tensor, whose room to spare leaves the budget enough to copy them
        once more (what giving that room back takes). Otherwise a chunk is added, with
        room to spare of at most half what the budget has left: the rest is where the rows
        of a bank giving back its room wait while they move."""
        capacity = self.capacity
        if needed <= spare:
            self.chunks = ((0, self._copied(min(rows, max(needed, spare + capacity - needed)))),)
        else:
            added = min(rows, max(needed, capacity + spare // 2)) - capacity
            self.chunks = (*self.chunks, (capacity, self._empty(added)))

    @property
    def reserved(self) -> int:
        """Bytes of the room this bank reserved and holds no row in (all in its last chunk)."""
        return (self.capacity - self.used) * self.row_bytes

    @property
    def to_move(self) -> int:
        """Bytes of the rows this bank moves to give back its room: its last chunk's."""
        first = self.chunks[-1][0] if self.chunks else 0
        return (self.used - first) * self.row_bytes

    def trim(self, spare: int, lenders: Sequence[Bank] = ()) -> int:
        """Gives back the room reserved beyond the rows held, never holding more than the
        budget meanwhile; returns how many bytes (0: nowhere to move the rows to).

        The rows of the last chunk (the one with the room) move to chunks of their size:
        as many as fit in ``spare`` bytes (what the budget has not allocated) are copied
        beside the old chunk, and the rest wait in the room ``lenders`` (other banks)
        reserved and do not use until the old chunk is let go. Each step leaves every bank
        whole: a lender's room is out of its reach while lent, and the rows waiting there
        are this bank's. Interrupted (Ctrl-C) before the end, a lender goes on without the
        room it lent, neither used nor counted against the budget any more."""
        reserved = self.reserved
        if not reserved:
            return 0
        with torch.inference_mode(False):
            if len(self.chunks) > 1 and self.used * self.row_bytes <= spare:
                self.chunks = ((0, self._copied(self.used)),)  # one tensor again
                return reserved
            start, last = self.chunks[-1]
            held = self.used - start
            early = min(held, spare // self.row_bytes)  # copied beside the old chunk
            late = held - early  # copied once it is let go, lent room holding them meanwhile
            loans: list[tuple[Bank, int, torch.Tensor, torch.Tensor]] = []
            short = late
            for lender in sorted(lenders, key=lambda bank: -bank.reserved):
                if short <= 0:
                    break
                lent_at, lent = lender.chunks[-1]
                room = self._room_in(lent[lender.used - lent_at :], short)
                if room is not None:
                    loans.append((lender, lent_at, lent, room))
                    short -= len(room)
            if short > 0:
                return 0
            before = self.chunks[:-1]
            kept: tuple[tuple[int, torch.Tensor], ...] = ()
            if early:
                fresh = self._empty(early)
                fresh.copy_(last[:early])
                kept = ((start, fresh),)
            waiting: list[tuple[int, torch.Tensor]] = []
            for lender, lent_at, lent, room in loans:
                at = early + sum(len(rows) for _, rows in waiting)
                room.copy_(last[at : at + len(room)])
                waiting.append((start + at, room))
                lender.chunks = (*lender.chunks[:-1], (lent_at, lent[: lender.used - lent_at]))
            del last
            self.chunks = (*before, *kept, *waiting)  # the old chunk is let go
            if late:
                made = self._empty(late)
                for at, rows in waiting:
                    made[at - start - early : at - start - early + len(rows)].copy_(rows)
                self.chunks = (*before, *kept, (start + early, made))
            for lender, lent_at, lent, _ in loans:
                lender.chunks = (*lender.chunks[:-1], (lent_at, lent))
        return reserved

    def _room_in(self, free: torch.Tensor, most: int) -> torch.Tensor | None:
        """Up to ``most`` rows of this bank laid over the bytes of ``free`` (rows of another
        bank, holding none), or None if not one fits."""
        raw = free.reshape(-1).view(torch.uint8)
        pad = -raw.storage_offset() % 16  # where rows of any dtype may start
        numel = torch.Size(self.row_shape).numel()
        size = max(1, numel) * self.itemsize
        fits = min(most, (int(raw.numel()) - pad) // size)
        if fits <= 0:
            return None
        span = raw[pad : pad + fits * size].view(self.dtype)
        return span[: fits * numel].view(fits, *self.row_shape)

    def _empty(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, *self.row_shape), dtype=self.dtype, device=self.device)

    def _copied(self, rows: int) -> torch.Tensor:
        """A tensor of ``rows`` rows, the first of them the rows this bank holds."""
        tensor = self._empty(rows)
        for start, chunk in self.chunks:
            held = min(self.used - start, int(chunk.shape[0]))
            if held > 0:
                tensor[start : start + held].copy_(chunk[:held])
        return tensor

    def gather(self, slots: Sequence[int]) -> torch.Tensor:
        """The rows at ``slots``, in that order, as a new tensor on the bank's device."""
        if not slots:
            return self._empty(0)
        # From an array of int64, not a list: a third of the time for a batch of slots.
        index = torch.frombuffer(array.array("q", slots), dtype=torch.long)
        if len(self.chunks) == 1:
            return self.chunks[0][1].index_select(0, self._on_device(index))
        # Rows in several chunks: slots ordered by chunk, each chunk's rows gathered at
        # once, side by side, then put back in the order asked.
        starts = torch.tensor([start for start, _ in self.chunks], dtype=torch.long)
        which = torch.bucketize(index, starts[1:], right=True)
        order = torch.argsort(which, stable=True)
        local = (index - starts[which])[order]
        counts = torch.bincount(which, minlength=len(self.chunks)).tolist()
        rows = self._empty(len(slots))
        at = 0
        for (_, chunk), count in zip(self.chunks, counts, strict=True):
            if count:
                part = self._on_device(local[at : at + count])
                torch.index_select(chunk, 0, part, out=rows[at : at + count])
                at += count
        return rows.index_select(0, self._on_device(torch.argsort(order)))

    def _on_device(self, index: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return index
        return index.to(self.device, non_blocking=True)


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
        """Bytes of rows this tier holds."""
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

        A whole batch found in one bank costs one dict pass and one gather."""
        pieces: list[tuple[list[int] | None, torch.Tensor]] = []
        if positions is None and self.banks:
            get = self.banks[0].slots.get
            slots = [get(key, -1) for key in keys]
            if -1 not in slots:
                return [(None, self.banks[0].gather(slots))], []
        rest = list(range(len(keys))) if positions is None else list(positions)
        for bank in self.banks:
            if not rest:
                break
            get = bank.slots.get
            hit_at: list[int] = []
            hit_slots: list[int] = []
            missed: list[int] = []
            for position in rest:
                slot = get(keys[position])
                if slot is None:
                    missed.append(position)
                else:
                    hit_at.append(position)
                    hit_slots.append(slot)
            if hit_at:
                whole = len(hit_at) == len(keys)
                pieces.append((None if whole else hit_at, bank.gather(hit_slots)))
            rest = missed
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
            else max(1, torch.Size(row_shape).numel() * rows.element_size())
        )
        # Rows fit in the room a bank has left, and in what the budget has not allocated.
        capacity = bank.capacity if bank is not None else 0
        held = bank.used if bank is not None else 0
        if capacity - held + self._spare() // row_bytes < len(keys):
            self._give_back(bank)
        spare = self._spare() // row_bytes
        take = min(len(keys), capacity + spare - held)
        if take <= 0:
            return 0
        if bank is None:
            bank = Bank(row_shape, rows.dtype, self.device)
            self.banks.append(bank)
        bank.append(keys[:take], rows[:take], spare)
        return take

    def _give_back(self, short: Bank | None) -> None:
        """Short of room for the rows of ``short``: the other banks give back what they
        reserved and do not use, those with the fewest rows to move first (what each gives
        back is room for the next to copy more), the room every other bank reserved lent
        for the rows that cannot be copied beside their old chunk (:meth:`Bank.trim`)."""
        for bank in sorted((b for b in self.banks if b is not short), key=lambda b: b.to_move):
            lenders = [other for other in self.banks if other is not bank and other.reserved]
            bank.trim(self._spare(), lenders)

    def _spare(self) -> int:
        """Bytes of the budget its banks have not allocated."""
        return max(self.budget - self.allocated, 0)

    def __repr__(self) -> str:
        return (
            f"Tier({self.name!r}, {str(self.device)!r}, {self.rows} rows, "
            f"{self.used}/{self.budget} bytes)"
        )
