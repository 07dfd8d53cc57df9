"""The settings a row cache takes, and the check of them made when it is made.

:func:`~somatize_torch.rows.cache_rows` takes how rows are keyed (``key``, and the
dataset ``version`` when by sample index), a ``salt``, the memory tiers' byte budgets
and ``strict``; :class:`~somatize_torch.lightning.CacheFrozen` takes the same and
hands them on. Both refuse a setting they cannot take when they are made, naming it
(:func:`check_options`), not at the first forward — for the callback, possibly hours
later, when the trainer first calls ``setup()``. The check lives here, below both, so
that the two refuse alike, with the default budgets (:data:`DEVICE_BYTES`,
:data:`HOST_BYTES`) beside it.
"""

from __future__ import annotations

import numbers

from somatize._numbers import finite
from somatize_torch._row_errors import NeedsIndex, RowsError

__all__ = ["DEVICE_BYTES", "HOST_BYTES", "check_options"]

DEVICE_BYTES = 1 << 30
"""The device tier's default byte budget."""

HOST_BYTES = 4 << 30
"""The host tier's default byte budget."""


def check_options(
    key: object,
    version: object,
    salt: object,
    device_bytes: object,
    host_bytes: object,
    strict: object,
) -> None:
    """Refuses a setting :func:`~somatize_torch.rows.cache_rows` cannot take, naming it
    (so does :class:`~somatize_torch.lightning.CacheFrozen`, when it is made)."""
    if key not in ("content", "index"):
        raise RowsError(
            f"key= is `content` (each row by the digest of its content) or `index` (each "
            f"row by its sample index in a dataset version), got {key!r}"
        )
    if key == "index" and version is not None and (not isinstance(version, str) or not version):
        raise NeedsIndex(
            "key='index' keys each row by its sample index, which names a row only within "
            f"one version of the dataset; version= is that version as a string (e.g. the "
            f"dataset's digest, 'sms/train@blake3:…'), got {version!r}"
        )
    if key == "content" and version is not None:
        raise RowsError(
            "version= is for key='index'; with key='content' each row is named by its own "
            "content, so there is no dataset version to give"
        )
    if salt is not None and not isinstance(salt, str):
        raise RowsError(
            f"salt= is a string put into every row's key (or None), got {salt!r}: name what "
            "it stands for as text (salt='run-2')"
        )
    for name, budget in (("device_bytes", device_bytes), ("host_bytes", host_bytes)):
        if isinstance(budget, numbers.Integral) and not isinstance(budget, bool):
            budget = int(budget)  # numpy's int64 is no int, and is a number of bytes all the same
        if not finite(budget) or budget < 0:
            raise RowsError(
                f"{name}= is the memory tier's budget as a number of bytes, 0 or more (4 GiB "
                f"is 4 << 30), got {budget!r}"
            )
    if not isinstance(strict, bool):
        raise RowsError(f"strict= is True or False, got {strict!r}")
