"""Functions of the models `wrap`'s tests trace, kept in a module of their own so the
models call them through it (`wrap_helpers.is_float64(name)`)."""

from __future__ import annotations

import logging


def is_float64(name: str) -> bool:
    """Whether ``name`` is float64's, joined to a suffix."""
    return name == "torch.float64-k"


def logged(message: str) -> float:
    """Logs ``message``, and gives a gain of two."""
    logging.getLogger("somatize.tests.wrap.helpers").debug(message)
    return 2.0
