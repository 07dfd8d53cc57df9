"""Where a top-level module or package of the user's own code lies: its project.

A script and the modules beside it (``train.py`` importing ``helpers.py`` from its
folder, a notebook importing ``helpers.py`` from its working directory, a package
``proj`` beside a module ``tools``) are one project even though no package holds them:
their top-level names differ, yet they are written together, and an edit to one changes
what the others compute. The folder a top-level module is found in (its ``sys.path``
entry) says which project it is of; one found where installed packages lie
(``site-packages``) or among the standard library is of no project, since a folder of
installed packages holds many that are upgraded apart.
"""

from __future__ import annotations

import csv
import functools
import os
import site
import sys
import sysconfig
from types import ModuleType
from typing import Any


def main_named(module: str) -> str:
    """``module``, the name of a module, with the script or notebook that runs named
    ``__main__`` whatever loaded it: a process ``multiprocessing`` spawns (a DataLoader's
    worker, a pool's, a ``ddp_spawn`` rank) loads the parent's script as ``__mp_main__``,
    the same module, whose classes and functions are the same code."""
    if module == "__mp_main__" or module.startswith("__mp_main__."):
        return "__main__" + module[len("__mp_main__") :]
    return module


def key_named(module: str) -> str:
    """``module``, the name of a module, as keys, fingerprints and identities name it: as
    :func:`main_named` says it, but a script ``python -m`` ran (``python -m pkg.script``)
    by the name it is imported by (``pkg.script``), which Python keeps as its spec's name,
    in it and in a process ``multiprocessing`` spawns from it. So the same code, run or
    imported, is keyed alike. A script run by its path, a notebook, and a package's
    ``__main__`` (``python -m pkg``, which an import would run again) stay ``__main__``."""
    named = main_named(module)
    if named != "__main__" and not named.startswith("__main__."):
        return named
    importable = script_importable_as(module.partition(".")[0])
    return named if importable is None else importable + named[len("__main__") :]


def script_importable_as(main: str = "__main__") -> str | None:
    """The name the script loaded as module ``main`` (``__main__``, or ``__mp_main__``
    where ``multiprocessing`` spawned this process) is imported by, where ``python -m`` ran
    it as one module of a package or of the path; None for a script run by its path, a
    notebook, ``python -c``, a package's ``__main__``, or a runner of another's code.
    """
    module = sys.modules.get(main)
    name = _spec_name(module)
    if name is None or name.rpartition(".")[2] == "__main__":
        return None
    # A runner of the standard library or an installed package (`python -m cProfile
    # train.py`) is `__main__` there, and the script it runs, of another file, is not it.
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str) or _checked(os.path.dirname(origin)) is None:
        return None
    return name


def _spec_name(main: ModuleType | None) -> str | None:
    """The name the import system found the script ``main`` by, where ``python -m`` ran
    it (``pkg.script``, ``pkg.__main__``); None where no import found it."""
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return name if isinstance(name, str) and name and name != "__main__" else None


def qualified(named: Any) -> str:
    """``module:qualname`` of ``named``, a class or function, its module as
    :func:`key_named` says it: what every key, fingerprint and identity names it by, the
    same in the script, in a process ``multiprocessing`` spawns from it, and, for a script
    ``python -m`` ran, where its module is imported. A function made
    with globals naming no module (``exec(text, {})``, ``types.FunctionType``) has none:
    it is named by its qualified name alone."""
    module = named.__module__
    return f"{key_named(module) if isinstance(module, str) else ''}:{named.__qualname__}"


def project_of(top: str) -> str | None:
    """The folder the top-level module or package ``top`` (as imported now) was found in,
    where that is a folder of the user's code; None where it is not imported, has no file,
    or lies among installed packages or the standard library."""
    module = sys.modules.get(top)
    if module is None:
        return None
    if main_named(top) == "__main__":
        return _main_folder(module)
    return _folder_of(module)


def _main_folder(main: ModuleType) -> str | None:
    """The project of the script or notebook that runs: the package ``python -m`` ran a
    module of, the folder of a script, else (a notebook, ``python -c``) the working
    directory, which Python puts first on its path for them."""
    name = _spec_name(main)
    if name is not None:
        return project_of(name.partition(".")[0])
    file = getattr(main, "__file__", None)
    if isinstance(file, str):  # the folder of the script itself, where it is a link
        return _checked(os.path.dirname(os.path.realpath(file)))
    try:
        return _checked(os.getcwd())
    except OSError:
        return None


def _folder_of(module: ModuleType) -> str | None:
    """The folder a top-level ``module`` was found in: that of its file, or, for a
    package, the one holding the package's folder; None where a package installed there
    holds it (:func:`_installed_in`)."""
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        folder = os.path.dirname(os.path.abspath(file))
        if getattr(module, "__path__", None) is not None:  # a package: its __init__ file
            folder = os.path.dirname(folder)
    else:
        # a namespace package: one folder, found once through each entry of the path that
        # leads to it (the working directory and $PYTHONPATH both naming the same one)
        paths = getattr(module, "__path__", None) or ()
        if not all(isinstance(path, str) for path in paths):
            return None
        found = {os.path.realpath(path) for path in paths}
        if len(found) != 1:
            return None
        folder = os.path.dirname(found.pop())
    if module.__name__ in _installed_in(folder):
        return None
    return _checked(folder)


@functools.lru_cache(maxsize=256)
def _checked(folder: str) -> str | None:
    """``folder``, resolved, unless it is one of installed packages or of the standard
    library."""
    real = os.path.realpath(folder)
    parts = set(real.split(os.sep))
    if parts & {"site-packages", "dist-packages"} or real in _installed():
        return None
    return real


@functools.lru_cache(maxsize=256)
def _installed_in(folder: str) -> frozenset[str]:
    """The top-level modules and packages that packages installed in ``folder`` hold, by
    the files each one's ``.dist-info`` records, or else its name (``pip install
    --target``, a folder of installed packages that is not named ``site-packages``, such as
    a function's bundle beside its handler): not the user's code, though found beside it."""
    try:
        infos = [entry.path for entry in os.scandir(folder) if entry.name.endswith(".dist-info")]
    except OSError:
        return frozenset()
    names: set[str] = set()
    for info in infos:
        names.add(os.path.basename(info).partition("-")[0].replace(".", "_"))
        try:
            with open(os.path.join(info, "RECORD"), newline="", encoding="utf-8") as record:
                rows = list(csv.reader(record))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        for row in rows:
            path = row[0].replace("\\", "/") if row else ""
            if not path or path.startswith(("/", "..")):
                continue
            first, _, rest = path.partition("/")
            names.add(first if rest else first.partition(".")[0])
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def _installed() -> frozenset[str]:
    """The folders of installed packages and of the standard library."""
    folders = set(sysconfig.get_paths().values())
    with_site = getattr(site, "getsitepackages", None)
    if with_site is not None:
        folders.update(with_site())
    folders.add(site.getusersitepackages())
    return frozenset(os.path.realpath(folder) for folder in folders)
