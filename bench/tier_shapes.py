"""What recalling a batch from a memory tier costs when its rows come in many shapes.

Sequences padded each batch to its own length (dynamic padding) give a row cache one
row shape a length: hundreds over a run, each a bank of its tier. A batch's rows are
all in one of them, and recalling it should cost what it costs in a tier of one bank.

A host tier holds 64 rows of 16 floats a token for each of ``--shapes`` lengths from 8
to 600; another holds the same rows of one length only. The time of ``Tier.find`` for
a batch of 64 keys (keyed as a cache keys them: its tag and each row's digest) is the
median of ``--repeats`` calls on each, interleaved, for the batch of the length held
last (the bank made last) and the batch of the length held first. Prints both and their
ratio; target: many shapes within 1.2x of one.

    python bench/tier_shapes.py [--shapes 600] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
from collections.abc import Hashable

import torch
from timing import interleaved_s

from somatize_torch.residency import Tier

BATCH = 64
WIDTH = 16


def batch_of(length: int) -> tuple[list[Hashable], torch.Tensor]:
    """The keys and rows of one batch of sequences ``length`` tokens long."""
    keys: list[Hashable] = [
        ("tag", hashlib.blake2b(f"{length}.{i}".encode(), digest_size=16).digest())
        for i in range(BATCH)
    ]
    return keys, torch.randn(BATCH, length, WIDTH)


def tier_of(lengths: list[int]) -> Tier:
    """A host tier holding a batch of each of ``lengths``."""
    tier = Tier("host", "cpu", budget=8 << 30)
    for length in lengths:
        keys, rows = batch_of(length)
        assert tier.admit(keys, rows) == BATCH
    return tier


def find_us(tiers: list[Tier], keys: list[Hashable], repeats: int) -> list[float]:
    """The median microseconds of ``find(keys)`` on each of ``tiers``, interleaved, each
    first checked to hold every row of ``keys``."""
    for tier in tiers:
        pieces, missing = tier.find(keys)
        assert not missing and len(pieces) == 1
    calls = [functools.partial(tier.find, keys) for tier in tiers]
    return [seconds * 1e6 for seconds in interleaved_s(calls, repeats, warm=20)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    lengths = [8 + (592 * i) // max(args.shapes - 1, 1) for i in range(args.shapes)]
    lengths = list(dict.fromkeys(lengths))
    torch.set_num_threads(1)
    many = tier_of(lengths)
    print(f"torch {torch.__version__}; {len(many.banks)} banks, {many.rows} rows")
    for label, length in (("made last", lengths[-1]), ("made first", lengths[0])):
        keys, _ = batch_of(length)
        one, several = find_us([tier_of([length]), many], keys, args.repeats)
        print(f"  a batch of length {length} ({label})")
        print(f"    {'Tier.find, a tier of one shape':<52} {one:8.1f} us")
        print(f"    {f'Tier.find, a tier of {len(lengths)} shapes':<52} {several:8.1f} us")
        print(f"    {'many / one':<52} {several / one:8.2f}x   (target <= 1.2x)")


if __name__ == "__main__":
    main()
