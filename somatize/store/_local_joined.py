"""A directory's joined write: answers given a batch at a time, written as they come.

The row writer gathers a pack's worth of rows (16 MiB, or what a second brings) before
it keeps them. Held until then and written at once, the last pack of an epoch is all
still to write when the epoch ends and a flush waits for it; written to ``tmp/`` batch by
batch, hashed as it is written, a pack is left only to be renamed to its digest's name
and indexed at the close. Nothing is found by a lookup before that: the blob is published
by a rename once whole, its index after it, as :func:`~somatize.store.records.keep_packed_joined`
publishes a pack.

Answers of 1 MiB or more are held and kept at the close as ``keep_joined`` keeps them (on
their own); a pack that would pass :data:`~somatize.store.records.PACK_BYTES` is closed
and published where it fills, as ``keep_joined`` cuts one, and a pack of one answer is
kept as its record.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from somatize.store import records
from somatize.store._local_files import _RUN, LocalFiles, sync_file
from somatize.store._packed import hasher_for, steady_runs
from somatize.store.base import Buffer, JoinedWrite
from somatize.store.records import PACK_ITEM_BELOW, index_pack, pack_entries, span_of

if TYPE_CHECKING:
    import io

    import blake3


@dataclass
class _Pack:
    """A pack being written to ``tmp/``: its file, held by ``stack`` (a gc of the store object
    leaves it be), what hashes it, its answers' keys, lengths and index entries, and the
    pieces their bytes came from (a pack of one answer is kept as its record, from them)."""

    stack: contextlib.ExitStack
    temporary: str
    out: io.BufferedWriter
    hasher: blake3.blake3
    keys: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    pieces: list[Buffer] = field(default_factory=list)
    entries: list[bytes] = field(default_factory=list)
    size: int = 0

    def discard(self) -> None:
        """Removes the file and lets it go."""
        with self.stack:
            with contextlib.suppress(OSError):
                self.out.close()
            _remove(self.temporary)


class StreamedJoin(JoinedWrite):
    """A joined write to a directory, each pack written to ``tmp/`` as its answers are
    added; see the module docstring. An add or a close whose write fails aborts it: the
    file in ``tmp/`` is removed, and none of the answers not yet published is kept."""

    store: LocalFiles

    def __init__(self, store: LocalFiles, codec: str, fingerprint: str | None) -> None:
        super().__init__(store, codec, fingerprint)
        self._pack: _Pack | None = None
        self._dropped: weakref.finalize[[_Pack, str, int], StreamedJoin] | None = None

    def _taken(self, keys: list[str], pieces: Sequence[Buffer], lengths: list[int]) -> None:
        if max(lengths, default=0) >= PACK_ITEM_BELOW:
            super()._taken(keys, pieces, lengths)  # kept at the close, as keep_joined keeps them
            return
        offsets = list(itertools.accumulate(lengths, initial=0))
        starts = list(itertools.accumulate(map(len, pieces), initial=0))
        first = 0
        try:
            while first < len(keys):
                # As many answers from `first` as the pack has room for.
                held = self._pack.size if self._pack is not None else 0
                last = bisect.bisect_right(offsets, offsets[first] + records.PACK_BYTES - held) - 1
                if last == first:
                    if self._pack is not None:  # full: published, and the next one begun
                        self._finish()
                        continue
                    last = first + 1  # more than a pack alone: a pack of its own
                span = span_of(pieces, starts, offsets[first], offsets[last])
                self._write(keys[first:last], span, lengths[first:last])
                first = last
        except BaseException:
            self.abort()
            raise

    def _write(self, keys: list[str], pieces: list[Buffer], lengths: list[int]) -> None:
        """Writes the answers under ``keys`` (their bytes ``pieces``) to the pack in
        ``tmp/``, begun here if none is."""
        home = self.store
        pack = self._pack
        if pack is None:
            stack = contextlib.ExitStack()
            temporary = home._tmp + stack.enter_context(home._in_tmp(".part"))
            try:
                out = home._created(temporary)
            except OSError as why:
                stack.close()
                raise home._unwritten(temporary, None, why) from why
            pack = self._pack = _Pack(stack, temporary, out, hasher_for(pieces))
            # A write let go of unclosed would otherwise hold its file open and its claim
            # on tmp/ (which a gc leaves be) until the process ends.
            self._dropped = weakref.finalize(self, _let_go, pack, repr(home), os.getpid())
            _WRITING.add(self)
        try:
            for run in steady_runs(pieces, _RUN):  # what is hashed is what is written
                pack.hasher.update(run)
                pack.out.write(run)
        except OSError as why:
            raise home._unwritten(pack.temporary, None, why) from why
        offsets = list(itertools.accumulate(lengths, initial=pack.size))
        pack.entries.append(pack_entries(keys, offsets[:-1], lengths))
        pack.keys += keys
        pack.lengths += lengths
        pack.pieces += pieces
        pack.size = offsets[-1]

    def _finish(self) -> None:
        """Publishes the pack written so far: its blob renamed to its digest's name (or
        left, where that blob is here already), then its index."""
        home, pack = self.store, self._pack
        assert pack is not None
        self._pack = None
        self._keep_pack()
        with pack.stack:
            try:
                try:
                    pack.out.flush()
                    if home.durable:
                        sync_file(pack.out.fileno())
                finally:
                    pack.out.close()
            except OSError as why:
                raise home._unwritten(pack.temporary, None, why) from why
            except BaseException:  # stopped (Ctrl-C): nothing of it is left in tmp/
                _remove(pack.temporary)
                raise
            if len(pack.keys) == 1:
                _remove(pack.temporary)
                home.keep(pack.keys[0], pack.pieces, self.codec, self.fingerprint)
                return
            digest = "blake3:" + pack.hasher.hexdigest()
            with home._keeping() as claims:  # the blob is this write's until its index is out
                home._place_written(pack.temporary, digest, pack.size, claims)
                entries = b"".join(pack.entries)
                index_pack(
                    home, digest, pack.keys, pack.lengths, self.codec, self.fingerprint, entries
                )

    def _keep_pack(self) -> None:
        """Takes the pack in hand again: its finish or abort, not the finalizer, ends it."""
        if self._dropped is not None:
            self._dropped.detach()

    def close(self) -> None:
        if self.closed:
            return
        if self._pack is not None:
            try:
                self._finish()
            except BaseException:
                self.abort()
                raise
        super().close()

    def abort(self) -> None:
        pack, self._pack = self._pack, None
        if pack is not None:
            self._keep_pack()
            pack.discard()
        super().abort()

    def _inherited(self) -> None:
        """Makes this write, a forked child's copy of its parent's, inert: its pack is the
        parent's, which the parent still writes and publishes, so the child neither writes
        the bytes its copy of the file holds unwritten (dropped, or flushed at its exit,
        they would land in the parent's file, at the offset the two share) nor removes it,
        and its close or abort keeps nothing."""
        pack, self._pack = self._pack, None
        if pack is not None:
            self._keep_pack()
            _write_nowhere(pack.out)
        super().abort()


_WRITING: weakref.WeakSet[StreamedJoin] = weakref.WeakSet()
"""Every joined write of this process that began a pack, which a forked child makes inert."""


def _after_fork_in_child() -> None:
    for joined in list(_WRITING):
        joined._inherited()
    _WRITING.clear()


if hasattr(os, "register_at_fork"):  # no fork where there is none (Windows)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _write_nowhere(out: io.BufferedWriter) -> None:
    """Points ``out``'s file descriptor, in this process alone, at the null device: what it
    holds unwritten goes nowhere when it is flushed or closed."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, out.fileno())
    finally:
        os.close(null)


def _let_go(pack: _Pack, store: str, pid: int) -> None:
    """Removes the pack of a joined write let go of with neither a close nor an abort, and
    says so, as Python says of a file left open: none of what was added is kept. In a
    child forked from the process ``pid`` that began it, the write (and its file in tmp/)
    is that process's, which may still close it: the child's copy is let go of quietly."""
    if os.getpid() != pid:
        return
    pack.discard()
    warnings.warn(
        f"a joined write to {store} was let go of unclosed: the {len(pack.keys)} answers "
        "added to it are not kept. Close it (`with store.open_joined(...) as joined:`), "
        "or abort it to drop them",
        ResourceWarning,
        stacklevel=2,
    )


def _remove(temporary: str) -> None:
    """Removes a file of ``tmp/`` this write made, if it is still there."""
    with contextlib.suppress(OSError):
        os.unlink(temporary)
