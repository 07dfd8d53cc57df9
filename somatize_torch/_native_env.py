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
import stat
import tempfile
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
    """Build cache: ``$SOMATIZE_EXT_CACHE`` or ``~/.cache/somatize/ext``; in a process with
    no home directory (a container run as a user it has no entry for, without ``HOME``),
    ``somatize-<uid>/ext`` in the system's temporary directory (:func:`_own_temp`).

    Raises :class:`NativeUnavailableError` where none of these can be had."""
    configured = os.environ.get(ENV_CACHE)
    if configured:
        try:
            return Path(configured).expanduser()
        except RuntimeError:  # `~user` of no user this system knows, or `~` with no home
            raise NativeUnavailableError(
                f"{ENV_CACHE} is {configured!r}, in a home directory this system does not "
                f"know; set {ENV_CACHE} to the directory's full path"
            ) from None
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):  # no HOME, and no entry for this user
        return _own_temp() / "ext"
    return home / ".cache" / "somatize" / "ext"


def _own_temp() -> Path:
    """``somatize-<uid>`` in the system's temporary directory, made if need be, and only
    if this user owns it and nobody else may write to it: a library loaded from a folder
    another user may write to would run their code."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    folder = Path(tempfile.gettempdir()) / ("somatize" if uid is None else f"somatize-{uid}")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = folder.lstat()
    except OSError as exc:
        raise NativeUnavailableError(
            f"there is no home directory to cache native builds in, and {folder} cannot be "
            f"made ({exc}); set {ENV_CACHE} to a writable directory"
        ) from exc
    if (
        not stat.S_ISDIR(found.st_mode)
        or (uid is not None and found.st_uid != uid)
        or found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise NativeUnavailableError(
            f"there is no home directory to cache native builds in, and {folder} is not a "
            "folder of this user's that nobody else may write to, so a library found there "
            f"is not loaded; set {ENV_CACHE} to a directory of this user's"
        )
    return folder


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
