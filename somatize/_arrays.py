"""Telling a numpy array written in place: numpy keeps no version counter, so what an array
held is taken when it is first watched (:func:`looked_at`) and its bytes compared with
that at every look (:func:`same_array`) — a small one with a copy of them, a large one in
place, a slice at a time, so that no copy of it is made at every look.

Shared by the watch a graph takes of its nodes' code (an array a node's code reads, held
itself, in a table or by an object: :class:`Written`; a small tensor's bytes, which a write
through ``.data`` or ``.numpy()`` changes without moving its count of changes in place) and
by the torch side's watch of what a module keeps (an array it holds among its settings).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["COPIED", "Written", "looked_at", "same_array"]


def looked_at(array: Any) -> tuple[Any, ...]:
    """What names a numpy array: its dtype, its shape and its bytes (a copy, compared
    whole: numpy keeps no version counter to tell a write in place by), in the order they
    lie in memory (a Fortran-ordered one's in its order), and the strides that say so."""
    return array.dtype.str, array.shape, array.strides, array.tobytes(order="A")


COPIED = 1 << 22
"""The size (4 MiB) up to which an array is looked at by a copy of its bytes: beyond it,
its bytes are compared in place, a slice at a time."""

SLICE = 1 << 18
"""How many bytes of a large array :func:`same_array` compares at a time (the memory it
takes to say whether they are the same)."""


def same_array(array: Any, was: tuple[Any, ...]) -> bool:
    """Whether a numpy array holds what ``was`` (as :func:`looked_at` took it) says: its
    dtype, its shape, its strides and its bytes, each compared exactly. A small one, or one
    whose bytes are not in one block (C or Fortran ordered), is copied to be compared; a
    large one is compared in place, a slice at a time, so that no copy of it is made at
    every look."""
    dtype, shape, strides, held = was
    if array.dtype.str != dtype or array.shape != shape or array.strides != strides:
        return False
    one_block = array.flags.c_contiguous or array.flags.f_contiguous
    if array.nbytes <= COPIED or not one_block:
        return bool(array.tobytes(order="A") == held)
    numpy = sys.modules["numpy"]  # an array is held: numpy is imported
    # Views of the same memory, as bytes in the order they lie (of a plain array: a
    # subclass, `np.matrix`, reshapes otherwise).
    now = numpy.asarray(array).ravel(order="A").view(numpy.uint8)
    kept = numpy.frombuffer(held, numpy.uint8)
    return all(
        bool((now[at : at + SLICE] == kept[at : at + SLICE]).all())
        for at in range(0, now.size, SLICE)
    )


class Written:
    """A numpy array a node's code reads — one its class holds, one its module holds, one a
    helper it calls reads, one an object it reads holds —, whose values its fingerprint
    names, as a graph's watch compares it with what it held as the watch was taken
    (:func:`looked_at`): equal to that only while it holds the same dtype, shape and bytes
    (:func:`same_array`), so that a write in place since (``MEANS[0] = 5.0``, ``H.m[0] =
    5.0``) is seen by a graph built before, whose fingerprints are worked out again. numpy
    keeps no version counter, so its bytes are compared at every look: a small array's with
    a copy, a large one's in place."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __len__(self) -> int:  # one entry of what a watch of a marked object reads
        return 1

    def __eq__(self, other: object) -> bool:
        return type(other) is tuple and same_array(self.array, other)

    __hash__ = None  # type: ignore[assignment]
