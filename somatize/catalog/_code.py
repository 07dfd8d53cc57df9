"""How a function's code is read: by its source, where the file still compiles to the code
that runs, else by its compiled code, digested alike in every process.

The source of a module is parsed once while :mod:`linecache` holds the same lines
(:class:`_Source`), and read for what the module's text assigns a name
(:func:`_assignment`) and imports (:func:`_imports_of`), so that a value is named as the
text writes it rather than by what it holds as the code runs.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import itertools
import linecache
import sys
import textwrap
import weakref
from collections.abc import Iterable
from functools import cached_property
from types import (
    CodeType,
    FrameType,
    FunctionType,
    ModuleType,
)
from typing import Any

from somatize.catalog._members import _plain, _same_package
from somatize.catalog._rebuild import held_at


def _code_bytes(code: CodeType) -> bytes:
    """:func:`code_digest`, and how the code is called: its arguments and flags."""
    shape = (
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_varnames,
    )
    return code_digest(code) + repr(shape).encode()


def _source_of(function: FunctionType) -> bytes | None:
    """The source of ``function`` as its file reads now, when the file, compiled now, makes
    the code the function runs at the same line — None when it does not (the file was
    edited since it was loaded, another definition is found there) or cannot be found (a
    function typed into an interpreter). The whole file is compiled, since how a line
    compiles depends on what is around it (its class, its module's imports). It is read
    as it parses (:func:`_what_runs`): a comment, a docstring or the layout of its lines
    edited is no other code."""
    code = function.__code__
    # a wrapper (`functools.wraps`) by its own lines: inspect reads those of what it wraps
    read = code if "__wrapped__" in vars(function) else function
    try:
        lines, _ = inspect.getsourcelines(read)  # reads the file as it is now
    except (OSError, TypeError, SyntaxError):
        return None
    if (code.co_name, code.co_firstlineno, _code_bytes(code)) not in _source_file(
        code.co_filename
    ).compiled:
        return None
    return _what_runs(textwrap.dedent("".join(lines))).encode()


def _what_runs(source: str) -> str:
    """``source`` as what it parses to, written again: without its comments, the
    docstrings of its functions and classes, or the layout of its lines, none of which is
    run — ``source`` itself where it does not parse on its own (a lambda read with the
    lines of the call around it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
            ast.get_docstring(node, clean=False) is not None
        ):
            node.body = node.body[1:]
    return _as_parsed(tree)


def _as_parsed(tree: ast.AST) -> str:
    """``tree`` written as what it parses to: each node by its kind and its fields, without
    where it lies. The same under every Python version, where :func:`ast.unparse` is not
    (3.10 writes ``(a, b) = x``, 3.12 an f-string's nested quotes otherwise): a Python
    upgrade is no other code. A field a version leaves empty is not written (3.12's
    ``type_params=[]``), nor an empty text 3.12.1 puts in an f-string's format."""
    parts: list[str] = []
    _write_parsed(tree, parts)
    return "".join(parts)


def _write_parsed(value: Any, parts: list[str]) -> None:
    if isinstance(value, list):
        parts.append("[")
        for item in value:
            _write_parsed(item, parts)
            parts.append(",")
        parts.append("]")
    elif isinstance(value, ast.AST):
        parts.append(type(value).__name__ + "(")
        for field in value._fields:
            item = getattr(value, field, None)
            if isinstance(value, ast.JoinedStr) and field == "values":
                item = [v for v in value.values if not _empty_text(v)]
            if item is None or item == []:
                continue
            parts.append(field + "=")
            _write_parsed(item, parts)
            parts.append(",")
        parts.append(")")
    else:
        parts.append(repr(value))


def _empty_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == ""


class _Source:
    """A source file as :mod:`linecache` holds its lines: what they compile to and what
    they parse to, each worked out once, when first asked."""

    def __init__(self, filename: str, lines: list[str]) -> None:
        self.filename = filename
        self.lines = lines
        self.text = "".join(lines)

    @cached_property
    def compiled(self) -> frozenset[tuple[str, int, bytes]]:
        """Each code object the file compiles to: its name, its first line and
        :func:`_code_bytes`."""
        shapes: set[tuple[str, int, bytes]] = set()
        try:
            codes = [compile(self.text, self.filename, "exec", dont_inherit=True)]
        except (SyntaxError, ValueError):
            codes = []
        while codes:
            at = codes.pop()
            shapes.add((at.co_name, at.co_firstlineno, _code_bytes(at)))
            codes += (c for c in at.co_consts if isinstance(c, CodeType))
        return frozenset(shapes)

    @cached_property
    def tree(self) -> ast.Module | None:
        """What the file parses to, or None."""
        try:
            return ast.parse(self.text) if self.lines else None
        except (SyntaxError, ValueError):
            return None


_SOURCES: dict[str, _Source] = {}
"""A source file → what was worked out from its lines, while :mod:`linecache` holds those
same lines (it reads a file changed since anew)."""


def _source_file(filename: str) -> _Source:
    lines = linecache.getlines(filename)
    found = _SOURCES.get(filename)
    if found is None or found.lines is not lines:
        found = _SOURCES[filename] = _Source(filename, lines)
    return found


def _as_written(body: list[ast.stmt] | None, name: str, value: Any) -> Any:
    """The value ``body`` (a class's statements) gives ``name`` where it assigns it a
    literal, else ``value``."""
    made = _assignment(body, name)
    if made is None:
        return value
    try:
        return ast.literal_eval(made)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return value


def _written_at(module: str, name: str, value: Any) -> tuple[list[ast.stmt] | None, str]:
    """The statements of the module whose text assigns ``name`` of module ``module``, and
    the name there: ``module``'s own, or where its text assigns no such name, those of the
    module of its package it imports ``value`` from (``from proj.config import SCALE``),
    followed on through the modules of its package that import it in turn (``__init__``
    importing it from ``proj.config``) or import all of another's names (``from
    proj.config import *``)."""
    at, seen = (module, name), set()
    while at not in seen:  # a module importing from one that imports from it ends here
        seen.add(at)
        body = _module_body(at[0])
        if body is not None and _assignment(body, at[1]) is not None:
            return body, at[1]
        imports = _imports_of(at[0])
        sources = [imports[at[1]]] if at[1] in imports else []
        sources += [(every, at[1]) for every, _ in imports.get("*", [])]
        at = next((s for s in sources if _same_package(s[0], module) and held_at(*s) is value), at)
    return _module_body(module), name


def _as_imported(function: FunctionType | type, module: str, name: str) -> bool:
    """Whether ``function``, defined in another module than ``module``, which holds it as
    ``name``, is what ``module``'s text imports there (``from tools import double``): what
    the module imported from holds under that name — not a function set in its place by
    hand (a monkeypatch putting a fake where a node's module imported the real one), nor
    one the text neither imports nor assigns there. Where the text does not import it (no
    text, a name the text assigns, ``dumps = json.dumps``), what its own module holds
    under its name."""
    body = _module_body(module)
    imports = _imports_of(module)
    source = imports.get(name)
    if source is not None:
        return held_at(*source) is function
    if any(held_at(whole, name) is function for whole, _ in imports.get("*", ())):
        return True
    if body is not None and _assignment(body, name) is None:
        return False  # put there from outside the text
    return held_at(function.__module__, function.__qualname__) is function


def _imports_of(module: str) -> dict[str, Any]:
    """Each name the statements of ``module``'s text import a value under (``from tools
    import double as twice``), at its top or in an ``if``, ``try`` or ``with`` block there,
    → the module imported from and the name there (``"*"`` → each module all of whose names
    are imported); {} where the text is not known."""
    body = _module_body(module)
    if body is None:
        return {}
    found = _IMPORTS.get(id(body))
    if found is None or found[0] is not body:
        package = getattr(sys.modules.get(module), "__package__", None) or ""
        names: dict[str, Any] = {}
        statements = list(body)
        while statements:  # the module's, and those of its `if`, `try` and `with` blocks
            statement = statements.pop()
            if not isinstance(statement, ast.ImportFrom):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    if not isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                        statements += getattr(statement, field, None) or []
                continue
            try:
                source = importlib.util.resolve_name(
                    "." * statement.level + (statement.module or ""), package
                )
            except (ImportError, ValueError):
                continue
            for alias in statement.names:
                if alias.name == "*":
                    names.setdefault("*", []).append((source, "*"))
                else:
                    names[alias.asname or alias.name] = (source, alias.name)
        found = _IMPORTS[id(body)] = (body, names)
    return found[1]


_IMPORTS: dict[int, tuple[list[ast.stmt], dict[str, Any]]] = {}
"""A module's statements (by identity, held so it is not another's) → what they import
(:func:`_imports_of`), read once."""


def _assigned(body: list[ast.stmt] | None, name: str, value: Any) -> bytes | None:
    """What names the value ``name`` holds, as it is assigned in ``body`` (a module's or a
    class's statements): a literal (``FACTOR = 2``) by the value it holds now, which is
    the same in every process; one computed as the module loads (``HERE =
    os.path.dirname(__file__)``, a value read from the environment) by how it is
    computed, and how the names it reads there are (:func:`_made_by`), the same wherever
    the code is, whatever it makes there (:func:`_assigned_now` adds what a plain one
    holds, where it is not of the run). None where
    nothing in ``body`` assigns it (it came from elsewhere), or ``body`` is not known."""
    made = _assignment(body, name)
    if made is None:
        return None
    try:
        ast.literal_eval(made)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return b"made by " + _made_by(body, made, {name})
    return _constant_bytes(value)


def _assigned_now(owner: Any, body: list[ast.stmt] | None, name: str, value: Any) -> bytes | None:
    """:func:`_assigned`, and where ``value`` is computed as the module or class ``owner``
    loads but is not what ``owner`` held under ``name`` when first seen (set by hand since:
    ``mod.SCALE = 3.0``, a test's monkeypatch), the value it holds too: how the text computes
    it no longer says it. So too where it is a plain value not of the run
    (:func:`_of_the_run`): one read from the environment or a file (``K =
    int(os.environ["K"])``) is another answer where it holds another value; ``owner`` None
    (state the code moves as it runs) is taken by its text alone."""
    assigned = _assigned(body, name, value)
    if assigned is None or not assigned.startswith(b"made by "):
        return assigned
    if _set_since(owner, name, value, body):
        return assigned + b"; set to " + _constant_bytes(value)
    if owner is not None and _plain(value) and not _of_the_run(owner, body, name, value):
        # read from the environment or a file as the module loads (`K =
        # int(os.environ["K"])`): another value there is another answer
        return assigned + b"; holds " + _value_bytes(value)
    return assigned


def _value_bytes(value: Any) -> bytes:
    """A plain value as :func:`_constant_bytes` says it, a long one (a text read from a file)
    by the digest of that: the same in every process, of a bounded size."""
    said = _constant_bytes(value)
    return said if len(said) <= 256 else b"sha256 " + hashlib.sha256(said).digest()


_RUN_PLACE = frozenset(
    {
        "get_rank",
        "get_world_size",
        "get_local_rank",
        "get_node_local_rank",
        "local_rank",
        "global_rank",
        "node_rank",
        "world_size",
    }
)
"""Names of :data:`_RUN_BOUND` that say the place of the process in a distributed run
wherever they are read (``args.local_rank``, ``trainer.global_rank``); the others are of the
run only where read from a module (``sys.version``, ``torch.initial_seed()``), not from a
value the module makes (``CFG.version``, ``cfg.seed`` of a config read from a file)."""

_RUN_BOUND = frozenset(
    {
        # the clock
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "localtime",
        "gmtime",
        "ctime",
        "strftime",
        "now",
        "utcnow",
        "today",
        # the process, the machine and the user running it
        "getpid",
        "getppid",
        "get_ident",
        "gethostname",
        "getfqdn",
        "node",
        "uname",
        "getuser",
        "getlogin",
        "getuid",
        "geteuid",
        "get_native_id",
        "getnode",
        # chance
        "random",
        "randint",
        "randrange",
        "getrandbits",
        "urandom",
        "secrets",
        "uuid1",
        "uuid4",
        "token_bytes",
        "token_hex",
        "token_urlsafe",
        "rand",
        "randn",
        "randperm",
        "rand_like",
        "randn_like",
        "hash",
        "id",
        "seed",
        "initial_seed",
        "mkdtemp",
        "mkstemp",
        # the machine's means (a device of `cuda` where there is one) and the versions it
        # runs: no code of the node's, as a torch upgrade is not
        "cpu_count",
        "process_cpu_count",
        "sched_getaffinity",
        "get_num_threads",
        "device_count",
        "is_available",
        "get_device_name",
        "__version__",
        "version",
        "version_info",
        "python_version",
        "platform",
        "system",
        "machine",
        "release",
    }
    # the place of the process among those of a distributed run (a rank of DDP, the size of
    # its world)
    | _RUN_PLACE
)
"""What a value computed as a module loads may read that differs from run to run, or from
machine to machine, without changing what the code computes (:func:`_of_the_run`): the clock,
the process, the machine or the user running it, chance, a fresh temporary folder, the
machine's means and versions, the place of the process in a distributed run."""


_RUN_ENVIRONMENT = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "JOB_ID",
        "HOME",
        "USER",
        "LOGNAME",
        "USERNAME",
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "TMPDIR",
        "TEMP",
        "TMP",
    }
)
"""Variables of the environment that say which process, job, machine or user runs the code,
not what it computes (:func:`_of_the_run`): a rank and world size of a distributed run (each
rank sharing a store would see the others' answers as drifted), its port, the devices it is
given, a job's id, the user, the home, working or temporary folder."""

_PLACE_ENVIRONMENT = frozenset({"HOME", "PWD", "OLDPWD", "TMPDIR", "TEMP", "TMP"})
"""Variables of :data:`_RUN_ENVIRONMENT` that name a folder: a value made from one is of the
run where it is a path, not where it is what a file found there holds (:func:`_of_the_run`)."""

_ABSENT = object()

_RUN_ENVIRONMENT_PREFIXES = (
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "PBS_",
    "LSB_",
    "SGE_",
    "MV2_",
    "RAY_",
    "TORCHELASTIC_",
)
"""Prefixes of the variables a scheduler or launcher sets for each job, task or process
(``SLURM_JOB_ID``, ``OMPI_COMM_WORLD_RANK``): :data:`_RUN_ENVIRONMENT` too."""


_PLACE_BOUND = frozenset(
    {
        "__file__",
        "expanduser",
        "home",
        "getcwd",
        "cwd",
        "abspath",
        "realpath",
        "resolve",
        "absolute",
        "gettempdir",
    }
)
"""What a value computed as a module loads may read that says where the code is, or where
it runs from (:func:`_of_the_run`): where the checkout is, the home or working folder."""


def _of_the_run(owner: Any, body: list[ast.stmt] | None, name: str, value: Any) -> bool:
    """Whether ``value``, which ``body`` (of the module or class ``owner``) computes for
    ``name`` as the module loads, is of this run rather than of what the code computes, and
    so named by how it is computed alone: one that reads (itself or through a name ``body``
    or its module assigns, under whatever name it is imported: ``from os import getpid as
    pid``) the clock, the process or machine, chance, a new temporary folder or the place
    of the process in a distributed run (:data:`_RUN_BOUND`), a variable of the environment
    that says those (:data:`_RUN_ENVIRONMENT`: ``int(os.environ["LOCAL_RANK"])``), or a path
    (a text holding a separator) made from where the code is or runs from
    (:data:`_PLACE_BOUND`: ``HERE = os.path.dirname(__file__)``, the name of the working
    folder) — not a number a file found there holds."""
    made = _assignment(body, name)
    if made is None:
        return False
    module = getattr(owner, "__name__" if isinstance(owner, ModuleType) else "__module__", "")
    around = _module_body(module) if isinstance(module, str) else None
    imported = _imports_of(module) if around is not None else {}
    read: set[str] = set()
    texts: set[str] = set()
    seen, queue = {name}, [made]

    space = vars(sys.modules[module]) if isinstance(module, str) and module in sys.modules else {}

    def made_here(named: str) -> ast.expr | None:
        there = _assignment(body, named)
        if there is None and around is not body:  # a class's, read from its module
            there = _assignment(around, named)
        return there

    def of_code(named: str) -> bool:
        """Whether the name the module reads is a module, a class or a function (``sys``,
        ``Path``, ``getpid``), not a value (a config, made here or imported)."""
        if made_here(named) is not None:
            return False
        held = space.get(named, _ABSENT)
        return held is _ABSENT or isinstance(held, (ModuleType, type)) or callable(held)

    while queue:
        called: set[int] = set()
        for node in ast.walk(queue.pop()):
            if isinstance(node, ast.Call):
                called.add(id(node.func))  # walked before its function
            elif isinstance(node, ast.Attribute):
                root: ast.expr = node.value
                while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                    root = root.func if isinstance(root, ast.Call) else root.value
                # `sys.version`, `torch.initial_seed()`, `generator.seed()`: of a module or
                # called; `CFG.version`, of a value the module makes (a config read from a
                # file), only a run's place
                if (
                    id(node) in called
                    or node.attr in _RUN_PLACE
                    or not isinstance(root, ast.Name)
                    or of_code(root.id)
                ):
                    read.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.add(node.value)
            elif isinstance(node, ast.Name):
                there = made_here(node.id)
                if node.id in _RUN_PLACE or of_code(node.id):  # imported, or a builtin
                    read.add(node.id)
                source = imported.get(node.id)
                if isinstance(source, tuple):  # `from os import getpid as pid`
                    read.update(source[0].split("."), source[1:])
                if node.id in seen:
                    continue
                seen.add(node.id)
                if there is not None:
                    queue.append(there)
    if read & _RUN_BOUND:
        return True
    environment = {
        text
        for text in texts
        if text in _RUN_ENVIRONMENT or text.startswith(_RUN_ENVIRONMENT_PREFIXES)
    }
    if read & {"environ", "getenv"} and environment - _PLACE_ENVIRONMENT:
        return True
    # a path, or a part of one (`Path.cwd().name`), not what a file found there holds
    placed = read & _PLACE_BOUND or (read & {"environ", "getenv"} and environment)
    return bool(placed) and (_path_like(value) or not read & _FILE_READ)


_FILE_READ = frozenset(
    {"open", "read", "read_text", "read_bytes", "readline", "readlines", "load", "safe_load"}
)
"""What a value computed from where the code is or runs from (:data:`_PLACE_BOUND`) may
read to be what a file found there holds, not a part of that place (:func:`_of_the_run`)."""


def _path_like(value: Any) -> bool:
    """Whether ``value`` is, or holds, a text or bytes holding a separator of paths."""
    if isinstance(value, str):
        return "/" in value or "\\" in value
    if isinstance(value, bytes):
        return b"/" in value or b"\\" in value
    if isinstance(value, (tuple, frozenset)):
        return any(map(_path_like, value))
    return False


_LOADED: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, int | None]]] = (
    weakref.WeakKeyDictionary()
)
"""A module or a class → what each of its names held when first seen (:func:`_note_loaded`),
a plain value itself, another object by a weak reference, with the line of the module's
text that ran then, where it was still loading."""


def _note_loaded(owner: Any, names: Iterable[tuple[str, Any]], at: int | None = None) -> None:
    """Notes what ``owner`` (a module or a class) holds under each of ``names`` not noted
    yet, as its text made it: when a node class is made there (``at``: the line of the
    module's text making it, as the module loads), else when a fingerprint first reads it
    (:func:`_set_since`)."""
    noted = _LOADED.setdefault(owner, {})
    for name, value in names:
        if name not in noted and not isinstance(value, (FunctionType, type, ModuleType)):
            noted[name] = (_held_as(value), at)


def _note_made(kind: type) -> None:
    """Notes what the node class ``kind`` and its module hold as the class is made
    (:func:`_note_loaded`), with the line of the module's text making it where the module
    is loading: a name its text assigns again below (``CFG = None``, the class, then ``CFG
    = Config()``) is not taken as set by hand."""
    _MADE.add(kind)
    _note_loaded(kind, list(vars(kind).items()))
    module = sys.modules.get(kind.__module__)
    if module is not None:
        space = vars(module)
        upto = _SCANNED.get(module, 0)
        if upto > len(space):  # names deleted since: all of them read again
            upto = 0
        added = list(itertools.islice(reversed(space.items()), len(space) - upto))
        _note_loaded(module, added, _loading_at(space))
        _SCANNED[module] = len(space)


_MADE: weakref.WeakSet[type] = weakref.WeakSet()
"""The node classes noted as they were made (:func:`_note_made`). One that was not — made
below a base, not a node class, whose ``__init_subclass__`` does not call
``super().__init_subclass__``, which keeps ``Node``'s from running — may have been given
another value by hand before it is first fingerprinted, as its module may (where no node
class made there noted its names): what they hold is not taken for what their text made
(:func:`_set_since`)."""


_SCANNED: weakref.WeakKeyDictionary[ModuleType, int] = weakref.WeakKeyDictionary()
"""A module → how many of its names :func:`_note_made` read as the last node class was made
there: names are added last, so the next reads only those added since, from the last —
not all of them again for each class of a module making many."""


def _loading_at(space: dict[str, Any]) -> int | None:
    """The line the text of the module whose namespace is ``space`` runs now, as it loads
    (or as a notebook's cell runs it); None where its text is not running."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is space and frame.f_code.co_name == "<module>":
            return frame.f_lineno
        frame = frame.f_back
    return None


def _held_as(value: Any) -> Any:
    """What :data:`_LOADED` notes of ``value``: itself, plain; else a weak reference to it, so
    that it is not kept alive; where it cannot be referenced weakly (a path, a decimal),
    how it is written (:class:`_WrittenAs`)."""
    if _plain(value):
        return value
    try:
        return weakref.ref(value)
    except TypeError:
        return _WrittenAs(_constant_bytes(value))


@dataclasses.dataclass(frozen=True)
class _WrittenAs:
    """Noted of an object that cannot be referenced weakly: how it is written, so that
    another set in its place (``Kind.root = Path("/elsewhere")``) is told from it."""

    said: bytes


def _set_since(owner: Any, name: str, value: Any, body: list[ast.stmt] | None = None) -> bool:
    """Whether ``owner`` (a module or a class; None where it is not known) holds ``value``
    under ``name`` in place of another it held when first seen (:data:`_LOADED`) — one set
    by hand since, not made by its text. Noted now where it was not yet, or where it was
    noted as the module loaded above a line of its text ``body`` that assigns it again:
    what that line made is what it holds."""
    if owner is None:
        return False
    if _unnoted(owner):  # nothing says what its text made: what it holds, as set by hand
        return True
    noted = _LOADED.setdefault(owner, {})
    if name not in noted:
        _note_loaded(owner, [(name, value)])
        return False
    was, at = noted[name]
    if at is not None and _assigned_below(owner, body, name, at):
        noted[name] = (_held_as(value), None)
        return False
    if isinstance(was, _WrittenAs):
        return was.said != _constant_bytes(value)
    if isinstance(was, weakref.ref):
        return was() is not value
    return was is not value and (
        type(was) is not type(value) or _constant_bytes(was) != _constant_bytes(value)
    )


def _unnoted(owner: Any) -> bool:
    """Whether ``owner`` is a node class not noted as it was made (:data:`_MADE`), or the
    module of one whose names no node class noted as it was made (:func:`_note_unmade`)."""
    if isinstance(owner, ModuleType):
        return owner in _UNNOTED
    from somatize.node import Node  # the catalog names node classes; node imports it

    return isinstance(owner, type) and issubclass(owner, Node) and owner not in _MADE


_UNNOTED: weakref.WeakSet[ModuleType] = weakref.WeakSet()
"""The modules of node classes not noted as they were made (:data:`_MADE`) whose names no
node class made there noted either (:data:`_SCANNED`): a name of theirs may have been set
by hand before the first fingerprint too (:func:`_set_since`)."""


def _note_unmade(kind: type) -> None:
    """Notes the module of ``kind``, a class about to be fingerprinted, in :data:`_UNNOTED`
    where ``kind`` is a node class not noted as it was made and no node class made there
    noted the module's names."""
    module = sys.modules.get(kind.__module__)
    if module is not None and module not in _SCANNED and _unnoted(kind):
        _UNNOTED.add(module)


def _assigned_below(owner: Any, body: list[ast.stmt] | None, name: str, at: int) -> bool:
    """Whether ``body``, the text of the module ``owner``, last assigns ``name`` below line
    ``at``."""
    if (
        not isinstance(owner, ModuleType)
        or body is None
        or body is not _module_body(owner.__name__)
    ):
        return False
    made = _assignment(body, name)
    return made is not None and made.lineno > at


def _module_named(module: str, space: dict[str, Any]) -> ModuleType | None:
    """The module ``module`` whose namespace is ``space``; None where no module loaded
    under that name has it (a namespace made by hand)."""
    found = sys.modules.get(module)
    return found if found is not None and vars(found) is space else None


def _made_by(body: list[ast.stmt] | None, made: ast.expr, seen: set[str]) -> bytes:
    """How ``made``, a value ``body`` computes, is written, with how each name it reads that
    ``body`` assigns is (``HIDDEN = 4 * WIDTH``, ``WIDTH = EMBED``, ``EMBED = 128``): another
    value written for one of those is another value, though it is read nowhere else."""
    parts = [_as_parsed(made).encode()]
    for node in ast.walk(made):
        if isinstance(node, ast.Name) and node.id not in seen:
            seen.add(node.id)
            there = _assignment(body, node.id)
            if there is not None:
                parts.append(node.id.encode() + b" = " + _made_by(body, there, seen))
    return b"; ".join(parts)


def _assignment(body: list[ast.stmt] | None, name: str) -> ast.expr | None:
    """The value the last assignment to ``name`` in ``body`` gives it; None where there is
    none, or ``body`` is not known."""
    if body is None:
        return None
    found = _ASSIGNMENTS.get(id(body))
    if found is None or found[0] is not body:
        found = _ASSIGNMENTS[id(body)] = (body, _assignments_in(body))
    return found[1].get(name)


_ASSIGNMENTS: dict[int, tuple[list[ast.stmt], dict[str, ast.expr]]] = {}
"""A module's or a class's statements (by identity, held so the identity is not another's)
→ what each name is last assigned there (:func:`_assignments_in`): read once, not once a
name, which for a class of many values would be a scan of its body for each."""


def _assignments_in(body: list[ast.stmt]) -> dict[str, ast.expr]:
    made: dict[str, ast.expr] = {}
    for statement in body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    made[target.id] = statement.value
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.value is not None
        ):
            made[statement.target.id] = statement.value
    return made


def _module_body(module: str) -> list[ast.stmt] | None:
    """The top-level statements of loaded module ``module``'s source, or None."""
    filename = getattr(sys.modules.get(module), "__file__", None)
    tree = _source_file(filename).tree if isinstance(filename, str) else None
    return None if tree is None else tree.body


def _class_body(kind: type) -> list[ast.stmt] | None:
    """The statements of ``kind``'s body in its module's source, found by its qualified
    name (a class defined inside a function is not found), or None."""
    body = _module_body(kind.__module__)
    for part in kind.__qualname__.split("."):
        if body is None:
            return None
        classes = [s for s in body if isinstance(s, ast.ClassDef) and s.name == part]
        body = classes[-1].body if classes else None
    return body


def code_digest(code: CodeType) -> bytes:
    """A digest of compiled ``code`` that every process compiling the same source agrees
    on: its bytecode, the names it uses and its constants. Nested code (a generator
    expression, a lambda, an inner function) is digested the same way, since its ``repr``
    holds its address in memory; a frozenset's members are taken in sorted order, since
    its order follows string hashes, which are salted per process."""
    digest = hashlib.sha256()
    for piece in (
        code.co_code,
        "\0".join(code.co_names).encode(),
        *map(_constant_bytes, code.co_consts),
    ):
        digest.update(len(piece).to_bytes(8, "little") + piece)
    return digest.digest()


def _constant_bytes(value: Any) -> bytes:
    """A constant of compiled code as bytes that are the same in every process."""
    if isinstance(value, CodeType):
        return b"code " + code_digest(value)
    if isinstance(value, (tuple, frozenset)):
        members = [_constant_bytes(member) for member in value]
        if isinstance(value, frozenset):
            members.sort()
        joined = b"".join(len(member).to_bytes(8, "little") + member for member in members)
        return f"{type(value).__name__} ".encode() + hashlib.sha256(joined).digest()
    return f"{type(value).__name__} {value!r}".encode()
