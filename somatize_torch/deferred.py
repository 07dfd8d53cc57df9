"""Inputs loaded only for the rows a cache must compute.

An index-keyed cache (:func:`somatize_torch.rows.cache_rows` with ``key="index"``)
names a row by its sample index, so it needs a row's input only to compute it. A
loader that reads and decodes every image anyway spends, from the second epoch
on, most of what is left of an epoch on inputs nobody looks at. :class:`Deferred`
is a dataset that hands out each sample with its input loaded only while no cache
has answered that sample::

    data = Deferred(images, labels, version="images@v3")  # item i: (images[i]?, labels[i])
    loader = DataLoader(data, batch_size=64, shuffle=True)
    cached = cache_rows(encoder, "features/", key="index")
    for x, y in loader:                     # x: DeferredRows, the batch's sample indices
        features = cached(x)                # epoch 2 on: no image loaded at all

``images`` is anything indexed by sample (a map-style dataset, a tensor, a list):
``images[i]`` is the module's input for sample ``i``, loaded (read, decoded,
transformed) with the sample — by a DataLoader worker, where there are workers —
until a cache answers that sample, and not after. ``labels`` — any number of
things indexed the same way — are handed out as they are. The default collate
turns a batch of samples into one :class:`DeferredRows`, which carries the
batch's indices and the inputs that came with it, moves to a device with ``.to``
(Lightning does that to a batch) and loads rows with :meth:`DeferredRows.load`.

Which samples have been answered is :attr:`Deferred.answered`, in memory that
DataLoader workers share (kept or forked anew each epoch): a cache marks the rows
of each batch it answers, and, the first time it meets a dataset, the samples
whose rows its store already has (on another thread), so a run over rows an
earlier run kept loads little more than its first batches. It is a hint, never a
key: a cache that lacks a row whose input did not come (another module, other
weights) loads that input itself, on the loop's thread. The marks are those of the
version rows are keyed under now: a cache given a new version marks none answered
(:meth:`Deferred.marks_under`).

A row is keyed by its index within the dataset's ``version`` — the Deferred's
own, or else the cache's ``version=``. The version is a promise that the same
index names the same input: give each dataset its own (a training and a
validation set both have a sample 0) and change it whenever the data changes (a
version written is checked as ``version=`` is).
Keys are those of ``cached(x, index=idx)`` under the same version, so a row kept
one way is recalled the other. The dtype and row shape the keys hold are learned
from the first inputs loaded (sample 0 is read for them once per process if every
row is recalled); an input of another dtype or shape is refused when it is loaded. A
cache runs floating-point inputs in its module's floating dtype (as a trainer in
true half precision converts a batch tensor), and keys them as such.

A batch made in a DataLoader worker travels to the loop as its indices, the name
of its :class:`Deferred` (never the dataset itself) and the inputs loaded with it.
A persistent DataLoader worker holds the Deferred as it was when it started: inputs
it loads after the Deferred was given others (``data.inputs = new``), or after the
cache whose version keys a Deferred without its own was given another
(``cached.version = "v2"``: the data changed in place), are the old data's. Rows carry
the Deferred's ``generation``, which moves with either change, and a cache computes
rows that came with such inputs from inputs loaded now: under the new version it
never keeps what the old data answers. Rows handed out under a version of the
Deferred's own that it no longer holds may carry the old data or the new (changed in
place where the workers read it, too): a cache answers them from the inputs they carry,
recalling and keeping none (:meth:`DeferredRows.outdated`).
"""

from __future__ import annotations

import copy
import numbers
import operator
import os
import secrets
import weakref
from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import DupFd
from typing import Any, NoReturn

import torch
from torch.utils.data import Dataset, default_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from somatize.errors import SomatizeError

__all__ = ["Deferred", "DeferredRows", "NotLoadable", "Row"]


class NotLoadable(SomatizeError, ValueError):
    """Deferred inputs cannot be loaded as asked: no dataset to load them from here, or an
    input that is not one row like the others."""


_MARKS_KEPT = 8
"""How many versions' marks of answered samples a :class:`Deferred` keeps beside the
ones it holds: a few stages' versions, each a bool per sample (in memory only once
marked: see :func:`_shared_zeros`)."""

_KNOWN: weakref.WeakValueDictionary[str, Deferred] = weakref.WeakValueDictionary()
"""Every :class:`Deferred` of this process by its name, so a batch made in a DataLoader
worker finds its dataset in the process that uses it."""


class Deferred(Dataset[Any]):
    """Samples whose input is loaded with them only until a row-cached module has answered
    them; see the module docstring. Item ``i`` is ``Row(i)`` alone, or ``(Row(i),
    beside[0][i], …)``; items ``[i, j, …]`` are those samples collated into one batch."""

    def __init__(self, inputs: Any, *beside: Any, version: str | None = None) -> None:
        self.version = version
        try:
            count = len(inputs)
        except TypeError:
            raise TypeError(
                f"Deferred(inputs, ...) takes something indexed by sample with a length (a "
                f"map-style dataset, a tensor, a list), got a `{type(inputs).__name__}`"
            ) from None
        for n, other in enumerate(beside):
            if not hasattr(other, "__getitem__") or len(other) != count:
                raise ValueError(
                    f"everything handed out beside the inputs is indexed like them: inputs "
                    f"have {count} samples, argument {n + 2} is {_length(other)}"
                )
        # How many times what the inputs are read from changed (`_moved`), carried by rows.
        self.generation = 0
        self.inputs = inputs
        self.beside = beside
        self.name = secrets.token_hex(8)
        self._count = count
        self._row: tuple[torch.dtype, torch.Size] | None = None
        self._marks_anew(self.version)
        _KNOWN[self.name] = self

    @property
    def version(self) -> str | None:
        """The version of the data ``inputs`` hold, which keys their rows (None: the
        cache's). It may be written (the data changed), and is checked as ``version=`` is:
        an empty one would pass for none given, and key the rows under the cache's version
        without its refusal of a second Deferred there."""
        return self._version

    @version.setter
    def version(self, value: Any) -> None:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(
                f"version= names this dataset's content (its digest, say), as a string; got "
                f"{value!r}"
            )
        was = getattr(self, "_version", value)
        self._version: str | None = value
        if value != was:
            self._forget_answered()  # its rows were answered under the version before

    @property
    def inputs(self) -> Any:
        """What the inputs are read from. Given others, the Deferred moves to a new
        :attr:`generation`, and inputs loaded from it before (by persistent DataLoader
        workers, which hold it as it was) are no longer its own."""
        return self._inputs

    @inputs.setter
    def inputs(self, value: Any) -> None:
        count = getattr(self, "_count", None)
        if count is not None and _length(value) != f"of length {count}":
            raise ValueError(
                f"inputs given to a Deferred anew are indexed as those before, with what is "
                f"handed out beside them: {count} samples, got inputs {_length(value)}. For "
                "data of another length make a new Deferred (and a DataLoader over it)"
            )
        self._inputs = value
        self._forget_answered()  # its rows were answered for the inputs before
        self._moved()
        self._inputs_from = self.generation  # inputs that came from a generation before are not its

    def _moved(self) -> None:
        """Moves to a new :attr:`generation`: what the inputs are read from was given anew,
        or a cache keying their rows under its version was given another (which may name
        them changed in place). Rows carry the generation of the Deferred they were made
        from — a DataLoader worker's copy holds the one of when it started — so a cache
        tells inputs that came with them from a Deferred as it was from inputs loaded from
        it as it is (:func:`~somatize_torch._row_keys.given_holds`)."""
        self.generation += 1

    @property
    def answered(self) -> torch.Tensor:
        """Which samples a cache has answered under the version rows are keyed under now
        (:meth:`marks_under`): a hint, in memory shared with DataLoader workers, for which
        inputs to load with the sample (where workers load them). A view of that
        version's marks, written in place."""
        return self._marks[int(self._held)]

    def _marks_anew(self, version: str | None) -> None:
        """Marks no sample answered under any version, holding those of ``version``. Each
        version keyed under has a row of its own in ``_marks`` (``_rows``, the version held
        last), so switching versions, as caches of different versions reading this
        Deferred do at every batch, copies nothing; ``_held``, the row held, is shared
        with DataLoader workers as the marks are, persistent ones included."""
        self._marks, self._held, self._marks_fd = _shared_zeros(_MARKS_KEPT + 1, self._count)
        self._rows: dict[str | None, int] = {version: 0}

    @property
    def _marks_of(self) -> str | None:
        """The version whose marks :attr:`answered` holds."""
        return next(reversed(self._rows))

    def _forget_answered(self) -> None:
        """Marks no sample answered under any version (in place: workers share the flags),
        so workers load their inputs with them again: the rows answered were of other data.
        (Where the cache lending its version is given another, :meth:`marks_under` holds
        that one's.)"""
        marks = getattr(self, "_marks", None)  # none yet while it is made
        if marks is not None:
            for row in self._rows.values():
                marks[row].fill_(False)  # rows no version holds stay all False
            self._rows = {self.version: int(self._held)}

    def marks_under(self, version: str | None) -> None:
        """Has :attr:`answered` hold the samples answered under ``version``, the one rows
        are keyed under now: those answered under another are not answered under this one
        (the data may have changed in place), so their inputs come with them again. The
        marks of the versions before are kept, found again if rows are keyed under one of
        them again (Lightning's callback switches the cache's version at every stage, and
        back; two caches of different versions reading this Deferred switch at every
        batch), up to :data:`_MARKS_KEPT` of them. DataLoader workers see the switch."""
        if version == self._marks_of:
            return
        row = self._rows.pop(version, None)
        if row is None:
            row = self._free_row()
        self._rows[version] = row  # the last: held now
        self._held.fill_(row)

    def _free_row(self) -> int:
        """A row of ``_marks`` no version holds, all False: the one of the version not keyed
        under for longest, cleared, where every row is held."""
        held = set(self._rows.values())
        free = next((row for row in range(len(self._marks)) if row not in held), None)
        if free is None:
            free = self._rows.pop(next(iter(self._rows)))
            self._marks[free].fill_(False)
        return free

    def mark_answered(self, indices: Any, version: str | None) -> None:
        """Marks samples ``indices`` answered by rows keyed under ``version``: in the marks
        of that version, where they are kept (another thread may have keyed rows under
        another since)."""
        row = self._rows.get(version)
        if row is not None:
            self._marks[row][indices] = True

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (list, tuple)) or getattr(index, "ndim", 0) == 1:
            # Samples fetched as one batch (a DataLoader with batch_size=None over a
            # BatchSampler), collated as a DataLoader collates them.
            return default_collate(self.__getitems__(list(index)))
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Items ``indices``, as the DataLoader fetches a batch: what is handed out beside
        the inputs is indexed once per batch where it is a tensor (a view per sample),
        not once per sample."""
        picks = [operator.index(i) for i in indices]
        bad = next((i for i in picks if not 0 <= i < self._count), None)
        if bad is not None:
            raise IndexError(f"sample {bad} of a Deferred of {self._count} samples")
        at = torch.tensor(picks, dtype=torch.long)
        answered = self.answered[at].tolist()
        values: list[Any] = [None] * len(picks)
        unanswered = [p for p, done in enumerate(answered) if not done]
        if unanswered and isinstance(self.inputs, torch.Tensor):
            loaded = self.inputs[at[unanswered]].unbind(0)
            for p, value in zip(unanswered, loaded, strict=True):
                values[p] = value
        else:
            for p in unanswered:
                values[p] = self.inputs[picks[p]]
        version, generation = self.version, self.generation
        rows = [
            Row(self.name, i, version, value, generation)
            for i, value in zip(picks, values, strict=True)
        ]
        if not self.beside:
            return rows
        columns = [
            other[at].unbind(0) if isinstance(other, torch.Tensor) else [other[i] for i in picks]
            for other in self.beside
        ]
        return list(zip(rows, *columns, strict=True))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        fd = state.pop("_marks_fd")
        if get_spawning_popen() is not None:  # to a DataLoader worker it starts: shared
            if fd is not None:  # the file itself, mapped again there, the row held in it
                state["_marks"] = (DupFd(fd), *self._marks.shape)
                del state["_held"]
            return state
        # Saved (torch.save, pickle): the marks of the versions held alone, not the rows
        # kept for versions to come (read whole, each page of them would be made), as the
        # release before this one wrote them and reads them.
        del state["_marks"], state["_held"], state["_rows"]
        held = self._marks_of
        state["answered"] = self.answered.clone()
        state["_marks_of"] = held
        kept = {v: self._marks[row].clone() for v, row in self._rows.items() if v != held}
        state["_marks_kept"] = kept
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "inputs" in state:  # saved before its inputs could be given anew
            state = {**state, "_inputs": state["inputs"], "generation": 0, "_inputs_from": 0}
            del state["inputs"]
        state = dict(state)
        answered = state.pop("answered", None)  # beside `_marks`, a view of the row held
        saved = "_marks" not in state  # saved with the marks of the versions held alone
        marks_of = state.pop("_marks_of", state.get("_version"))
        kept = state.pop("_marks_kept", {})
        marks = state.pop("_marks", None)
        self.__dict__.update(state)
        self._marks_fd = None
        if isinstance(marks, tuple):  # the file of the marks, in a DataLoader worker
            dup, rows, count = marks
            self._marks, self._held, self._marks_fd = _mapped(dup.detach(), rows, count)
        elif marks is not None:  # shared by torch's own sharing
            self._marks = marks
        if saved:
            self._marks_anew(marks_of)
            marked = [*list(kept.items())[-_MARKS_KEPT:], (marks_of, answered)]
            self._rows = {version: row for row, (version, _) in enumerate(marked)}
            for row, (_, flags) in enumerate(marked):
                self._marks[row].copy_(flags)
            self._held.fill_(len(marked) - 1)
        # A copy in a spawned DataLoader worker takes the name its batches travel under.
        if _KNOWN.setdefault(self.name, self) is not self:
            # Loaded where the one saved lives (`torch.load` in the same process), which
            # may hold other inputs by now: a dataset of its own, its batches loading from
            # it, none of its samples answered (it was saved with the other's flags).
            self.name = secrets.token_hex(8)
            self._marks_anew(self.version)
            _KNOWN[self.name] = self

    def __copy__(self) -> Deferred:
        """A dataset of its own (its own name, nothing answered yet), over the same inputs
        and what is handed out beside them: under the original's name, a copy given other
        inputs and a version of their own (a second split made from the first) would have
        the rows its batches bring without their input loaded from the original. The dtype
        and shape of a row are learned again, from the inputs it holds then."""
        return Deferred(self.inputs, *self.beside, version=self.version)

    def __deepcopy__(self, memo: dict[int, Any]) -> Deferred:
        """A dataset of its own (its own name, nothing answered yet), over copies of the
        inputs and of what is handed out beside them."""
        inputs, beside = copy.deepcopy((self.inputs, self.beside), memo)
        copied = Deferred(inputs, *beside, version=self.version)
        copied._row = self._row
        memo[id(self)] = copied
        return copied

    # -- loading

    def row(self) -> tuple[torch.dtype, torch.Size]:
        """The dtype and shape of one input row: of the first input loaded, or of sample 0
        loaded now."""
        if self._row is None:
            self.load([0])
        assert self._row is not None
        return self._row

    def load(self, indices: Sequence[int]) -> torch.Tensor:
        """The inputs of samples ``indices``, as one batch tensor (where ``inputs`` keeps them)."""
        if not indices:
            dtype, shape = self.row()
            return torch.empty((0, *shape), dtype=dtype)
        inputs = self.inputs
        if isinstance(inputs, torch.Tensor):
            batch = inputs[torch.tensor(indices, dtype=torch.long)]
        else:
            batch = _stacked([inputs[i] for i in indices], indices)
        return self.check(batch, indices)

    def check(self, batch: Any, indices: Sequence[int]) -> torch.Tensor:
        """``batch``, the inputs of samples ``indices``, if it is rows of the dtype and shape
        of the first inputs loaded (which it sets, if it is the first)."""
        if not isinstance(batch, torch.Tensor):
            raise NotLoadable(
                f"the inputs of a Deferred are one tensor per sample (or what the default "
                f"collate stacks into one); samples {list(indices)[:8]} made a "
                f"`{type(batch).__name__}`"
            )
        found = (batch.dtype, batch.shape[1:])
        if self._row is None:
            self._row = found
        elif found != self._row:
            raise NotLoadable(
                f"inputs of one Deferred are rows of one dtype and shape: the first loaded "
                f"was {self._row[0]} {list(self._row[1])}, samples {list(indices)[:8]} are "
                f"{found[0]} {list(found[1])}"
            )
        return batch


class Row:
    """One sample's input, not loaded — the name of its :class:`Deferred` and its index —
    or, for a sample no cache has answered yet, loaded with the sample (``value``, where
    DataLoader workers load it, from the Deferred at ``generation``). The default collate
    makes a batch of them one :class:`DeferredRows`."""

    __slots__ = ("generation", "index", "source", "value", "version")

    def __init__(
        self,
        source: str,
        index: int,
        version: str | None,
        value: Any = None,
        generation: int | None = None,
    ) -> None:
        self.source = source
        self.index = index
        self.version = version
        self.generation = generation
        self.value = value

    def __repr__(self) -> str:
        loaded = ", loaded" if self.value is not None else ""
        return f"Row({self.index} of {self.source}{loaded})"

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> NoReturn:
        """Refuses a torch function handed rows (``torch.stack`` of them, in a
        ``collate_fn`` of one's own), saying how to collate them: torch would only say it
        expected a tensor."""
        raise TypeError(
            f"`torch.{getattr(func, '__name__', func)}` was handed the `Row`s a Deferred "
            "hands out, one per sample: its index, and its input only while no cache has "
            "answered it. Collate them with `torch.utils.data.default_collate(rows)`, which "
            "makes them one `DeferredRows` for the cache, in a collate_fn of your own too"
        )


class DeferredRows:
    """A batch of inputs, mostly not loaded: the samples' indices (``index``, a 1-d int64
    tensor on the CPU), the :class:`Deferred` they come from, the device rows are loaded
    to, the inputs loaded with the batch (``given``, for the rows at ``given_at``:
    samples no cache had answered when it was made) and the :attr:`Deferred.generation`
    they were loaded at (None: the one it is at). Handed to a row-cached module keyed by
    index, it loads only the rows it computes that came without their input."""

    __slots__ = (
        "__weakref__",
        "_dataset",
        "device",
        "generation",
        "given",
        "given_at",
        "index",
        "source",
        "version",
    )

    def __init__(
        self,
        source: str,
        index: torch.Tensor,
        version: str | None,
        device: torch.device,
        given: torch.Tensor | None = None,
        given_at: Sequence[int] = (),
        generation: int | None = None,
    ) -> None:
        self.source = source
        self.index = index
        self.version = version
        self.device = device
        self.given = given
        self.given_at = list(given_at)
        self.generation = generation
        self._dataset = _KNOWN.get(source)  # held: a batch keeps its dataset alive

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def __repr__(self) -> str:
        given = f", {len(self.given_at)} loaded" if self.given_at else ""
        return f"DeferredRows({len(self)} rows of {self.source}{given}, device={self.device})"

    def __reduce__(self) -> tuple[Any, ...]:
        state = (
            self.source,
            self.index,
            self.version,
            self.device,
            self.given,
            self.given_at,
            self.generation,
        )
        return (DeferredRows, state)

    def to(
        self, device: torch.device | str | None = None, *args: Any, **kwargs: Any
    ) -> DeferredRows:
        """The same rows, to be loaded onto ``device`` (a dtype or other argument is
        ignored: inputs load as their dataset makes them)."""
        if device is None or isinstance(device, torch.dtype):
            return self
        return DeferredRows(
            self.source,
            self.index,
            self.version,
            torch.device(device),
            self.given,
            self.given_at,
            self.generation,
        )

    def dataset(self) -> Deferred:
        """The :class:`Deferred` these rows come from, in this process."""
        found = self._dataset
        if found is None:
            raise NotLoadable(
                f"these rows come from a Deferred ({self.source}) that this process does not "
                "hold: deferred rows load only where their dataset lives (the process that "
                "made the DataLoader, or its workers)"
            )
        return found

    def outdated(self) -> bool:
        """Whether these rows were handed out under a version their :class:`Deferred` no
        longer holds (made by a persistent DataLoader worker, which holds it as it was when
        it started, or before it was given a new one). The inputs that came with them may
        be the new data's all the same (changed in place, where the worker reads it: a
        tensor in shared memory, files on disk): their rows are neither recalled nor kept
        under either version."""
        return self.dataset().version != self.version

    def loadable(self) -> Deferred:
        """The :class:`Deferred` these rows come from, if it holds the inputs of the version
        they were handed out under. One given other inputs under a new version since (a
        DataLoader's persistent workers hand out rows of the Deferred as it was when they
        started) would load the new inputs, answering rows of the old version from the
        new data."""
        dataset = self.dataset()
        if self.outdated():
            raise NotLoadable(
                f"these rows were handed out under version {_named(self.version)} and their "
                f"Deferred holds version {_named(dataset.version)} now: its inputs are no "
                "longer the ones these rows name, and the rows that came without theirs "
                "can be answered from neither version. Make the DataLoader again after "
                "giving the Deferred a new version (persistent workers hold it as it was "
                "when they started)"
            )
        return dataset

    def row(self) -> tuple[torch.dtype, torch.Size]:
        """The dtype and shape of one input row (see :meth:`Deferred.row`), from the inputs
        given with the batch where it is not known yet."""
        dataset = self.dataset()
        if dataset._row is None and self.given is not None:
            dataset.check(self.given, self._indices(self.given_at))
        if dataset._row is None:  # sample 0 is read, which must be of the rows' version
            self.loadable()
        return dataset.row()

    def load(
        self, positions: Sequence[int] | None = None, *, as_given: bool = True
    ) -> torch.Tensor:
        """The inputs of the rows at batch ``positions`` (all by default), on ``device``:
        those given with the batch as they came (unless not ``as_given``: inputs of other
        data, every one loaded now), the others loaded now."""
        wanted = list(range(len(self))) if positions is None else list(positions)
        dataset = self.dataset()
        slot = {p: k for k, p in enumerate(self.given_at)} if as_given else {}
        came = [k for k, p in enumerate(wanted) if p in slot]
        # Inputs that came with the rows are of the version they name, whatever the
        # Deferred holds now; only those loaded here must be of it (:meth:`loadable`).
        if self.given is None or not came:
            batch = self.loadable().load(self._indices(wanted))
        else:
            given = dataset.check(self.given, self._indices(self.given_at))
            picked = given if wanted == self.given_at else given[[slot[wanted[k]] for k in came]]
            rest = [k for k, p in enumerate(wanted) if p not in slot]
            if not rest:
                batch = picked
            else:
                batch = torch.empty((len(wanted), *given.shape[1:]), dtype=given.dtype)
                batch[came] = picked
                loaded = self.loadable().load(self._indices([wanted[k] for k in rest]))
                batch[rest] = loaded.to(batch.device)
        return batch.to(self.device) if batch.device != self.device else batch

    def answered(self, positions: Sequence[int] | None, version: str | None) -> None:
        """Notes that a cache has answered these rows (those at ``positions``; None: all)
        under ``version``, so their inputs are not loaded with the samples from now on
        (where a worker would load them for nothing) while rows are keyed under it."""
        index = self.index if positions is None else self.index[list(positions)]
        if not self.outdated():  # else answered for inputs it no longer holds
            self.dataset().mark_answered(index, version)

    def _indices(self, positions: Sequence[int]) -> list[int]:
        every: list[int] = self.index.tolist()
        return [every[p] for p in positions]


def _collate(batch: list[Row], *, collate_fn_map: Any = None) -> DeferredRows:
    source = batch[0].source
    if any(row.source != source for row in batch):
        raise NotLoadable(
            "a batch of deferred inputs comes from one Deferred, not several (a ConcatDataset "
            "of Deferreds mixes them): make one Deferred over the inputs concatenated, "
            "`Deferred(ConcatDataset([images_a, images_b]), labels, version=...)`, with a "
            "version naming both"
        )
    index = torch.tensor([row.index for row in batch], dtype=torch.long)
    given_at = [p for p, row in enumerate(batch) if row.value is not None]
    values = [batch[p].value for p in given_at]
    given = _stacked(values, [batch[p].index for p in given_at]) if given_at else None
    first = batch[0]
    cpu = torch.device("cpu")
    return DeferredRows(source, index, first.version, cpu, given, given_at, first.generation)


def _stacked(values: list[Any], indices: Sequence[int]) -> Any:
    """``values``, the inputs of samples ``indices``, collated into one batch; tensors of
    other shapes or dtypes among them (sequences of varying length) are refused, naming
    the samples, where the default collate would fail with torch's own error; so are
    NumPy arrays, which it stacks as tensors, and lists or tuples (token ids as a
    tokenizer answers them), which it would not make one batch tensor of."""
    kinds: dict[tuple[Any, tuple[int, ...]], int] = {}
    for value, index in zip(values, indices, strict=True):
        if isinstance(value, (list, tuple, dict)) and _holds_parts(value):
            raise NotLoadable(_whole_samples(value, index))
        if isinstance(value, (list, tuple)):
            raise NotLoadable(
                f"the inputs of a Deferred are one tensor per sample (or what the default "
                f"collate stacks into one); sample {index} is a `{type(value).__name__}`: "
                "have the Deferred read each as a tensor (`torch.tensor(ids)`), padded to "
                "one length"
            )
        if _is_array(value):
            kinds.setdefault((value.dtype, tuple(value.shape)), index)
    if len(kinds) > 1:
        said = ", ".join(f"sample {i} is {d} {list(s)}" for (d, s), i in list(kinds.items())[:3])
        raise NotLoadable(
            f"inputs of one Deferred are rows of one dtype and shape, stacked into one batch: "
            f"{said}. A row is keyed by its index and the shape of its input, so pad (or "
            "crop) each sample's input to one shape where the Deferred reads it (token ids "
            "to a fixed length), or, without a Deferred, pad each batch in the loader's "
            "`collate_fn` and call the cache with `index=`"
        )
    return default_collate(values)


def _holds_parts(value: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> bool:
    """Whether ``value`` holds a part of a whole sample (:func:`_is_part`): an input beside
    its label, not one input (token ids)."""
    items = value.values() if isinstance(value, dict) else value
    return any(_is_part(v) for v in items)


def _is_part(value: Any) -> bool:
    """Whether ``value``, an item of what a Deferred's inputs hand out, is a part of a
    whole sample: an array of one or more dimensions (an image, a text's token ids), or an
    object not read as one (a PIL image). A number, a 0-d tensor among them, is one token
    id; a string or a list may be tokens too."""
    if _is_array(value):
        return bool(value.ndim)
    return not isinstance(value, (numbers.Number, str, list, tuple))


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray"


def _whole_samples(value: list[Any] | tuple[Any, ...] | dict[Any, Any], index: int) -> str:
    """Why a Deferred over a dataset of whole samples (a `TensorDataset`, an
    `ImageFolder`, a Hugging Face dataset) is refused, and what to hand it."""
    if isinstance(value, dict):
        held = f"a `dict` of {sorted(map(str, value))}"
        part = next(f"data[i][{k!r}]" for k, v in value.items() if _is_part(v))
    else:
        count = f"{len(value)} item" + ("s" if len(value) != 1 else "")
        held = f"a `{type(value).__name__}` of {count}"
        part = next(f"data[i][{k}]" for k, v in enumerate(value) if _is_part(v))
    return (
        f"the inputs of a Deferred are one tensor per sample, the module's input alone; "
        f"sample {index} is {held}, a whole sample (an input beside its label, as a "
        "`TensorDataset`, an `ImageFolder` or a Hugging Face dataset hands out). Hand "
        f"Deferred a dataset whose item i is the input alone (`{part}`), and the labels "
        "beside it: `Deferred(inputs, labels, version=...)`"
    )


_HEAD = 8
"""The bytes before a Deferred's marks in the memory they share with workers: the row
held, one ``int64``."""


def _shared_zeros(rows: int, count: int) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """A bool tensor of ``rows`` by ``count``, all False, and a 0-dim ``int64`` zero (the
    row held), in one piece of memory shared with DataLoader workers; and the file
    descriptor of that memory (None: torch's own sharing hands it to workers). One piece,
    so a Deferred holds one file descriptor, as one shared tensor did. On Linux it takes
    room only where written: a fresh memory file reads as zeros and its pages are made as
    they are touched, so rows kept for versions not keyed under cost nothing. (Torch's
    shared memory reserves every page as it is made.)"""
    make = getattr(os, "memfd_create", None)
    if make is not None:
        fd = make("somatize-marks", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _HEAD + rows * count)
            return _mapped(fd, rows, count)
        except (OSError, RuntimeError):  # no /proc to map it through (a bare sandbox)
            os.close(fd)
    storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(_HEAD + rows * count)  # type: ignore[no-untyped-call]
    return *_viewed(storage, rows, count), None


def _mapped(fd: int, rows: int, count: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The memory file ``fd`` as the marks of ``rows`` by ``count`` and the row held (see
    :func:`_shared_zeros`), and ``fd``, closed once the marks are gone (the views of the
    memory keep it mapped)."""
    nbytes = _HEAD + rows * count
    storage = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=True, nbytes=nbytes)
    assert isinstance(storage, torch.UntypedStorage)  # what from_file makes of the class
    marks, held = _viewed(storage, rows, count)
    weakref.finalize(marks, os.close, fd)
    return marks, held, fd


def _viewed(
    storage: torch.UntypedStorage, rows: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The marks and the row held, as :func:`_shared_zeros` lays them in ``storage``."""
    held = torch.empty(0, dtype=torch.long).set_(storage, 0, (), ())
    marks = torch.empty(0, dtype=torch.bool).set_(storage, _HEAD, (rows, count), (count, 1))
    return marks, held


def _named(version: str | None) -> str:
    return "none (the cache's)" if version is None else f"`{version}`"


def _length(value: Any) -> str:
    try:
        return f"of length {len(value)}"
    except TypeError:
        return f"a `{type(value).__name__}` without a length"


# torch's documented way to teach `default_collate` a type of its own.
default_collate_fn_map[Row] = _collate
