"""What the settings that are amounts — seconds, counts of resources — accept.

A setting that is an amount takes an int or a float that is finite; ``True`` is an
int to Python but no amount to a person, and NaN or an infinity compares in ways no
caller means (``nan < 0`` is false, so a NaN grace passed a check for ``< 0`` and
turned sweeping off). Each caller says the bound it needs on top.
"""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["finite"]


def finite(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
