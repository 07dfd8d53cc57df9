"""What the native builds share: the switches read from the environment
(``SOMATIZE_NATIVE``, ``SOMATIZE_EXT_CACHE``; the policy is described in
:mod:`somatize_torch._native`), where the sources ship and where builds are cached,
the key a build is cached under, the errors, and the one lock and once-only log
every build takes.

A module of its own so that the host library, the CUDA extension and the staging
pool build on it without importing the face that re-exports them (and imports them).
The lock is replaced in a forked child (by the host library's fork hook), so the
other modules read it here, as ``_native_env._lock``, each time they take it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Final

__all__ = [
    "DIGEST_SIZE",
    "ENV_CACHE",
    "ENV_MODE",
    "NativeDisabledError",
    "NativeUnavailableError",
    "cache_dir",
    "csrc_dir",
    "native_mode",
]

logger = logging.getLogger("somatize_torch.native")

ENV_MODE: Final = "SOMATIZE_NATIVE"
ENV_CACHE: Final = "SOMATIZE_EXT_CACHE"
DIGEST_SIZE: Final = 32

_lock = threading.RLock()
_logged: set[str] = set()


class NativeUnavailableError(RuntimeError):
    """Native code was required but could not be built or loaded."""


class NativeDisabledError(NativeUnavailableError):
    """Native code is switched off with ``SOMATIZE_NATIVE=0``."""


def _log_once(key: str, message: str, *args: object) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.debug(message, *args)


def native_mode() -> str:
    """``"on"`` (``SOMATIZE_NATIVE=1``), ``"off"`` (``=0``) or ``"auto"``."""
    value = os.environ.get(ENV_MODE, "").strip()
    if value == "1":
        return "on"
    if value == "0":
        return "off"
    return "auto"


def csrc_dir() -> Path:
    """Directory holding the native sources: ``csrc/`` inside the package, where the
    wheel ships them."""
    found = Path(__file__).resolve().parent / "csrc"
    if (found / "blake3_tree.h").is_file():
        return found
    raise NativeUnavailableError(f"native sources not found in {found}")


def cache_dir() -> Path:
    """Build cache: ``$SOMATIZE_EXT_CACHE`` or ``~/.cache/somatize/ext``."""
    configured = os.environ.get(ENV_CACHE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "somatize" / "ext"


def _sources_key(src: Path, names: tuple[str, ...], *extra: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in names:
        h.update(name.encode())
        h.update(b"\0")
        h.update((src / name).read_bytes())
        h.update(b"\0")
    for item in extra:
        h.update(item.encode())
        h.update(b"\0")
    return h.hexdigest()
