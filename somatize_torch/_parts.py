"""Parts replaced after wrapping: the fx segments kept pointing at what the model holds.

fx segments hold references to the parts they read. A submodule, parameter or
buffer replaced since (``wrapped.head = nn.Linear(...)``,
``load_state_dict(sd, assign=True)``) is seen when it is assigned on the wrapped
model, and before every eager forward, and the segments are pointed at the new
one. A declared submodule cannot be replaced — its node holds the module it was
declared with — nor one whose forward was traced into the code, which runs what that
forward did then: that is refused: wrap the model again.

fx records a part the model holds under two names (``self.first = self.layers[0]``) by
one of them only, wherever the forward reads it: the names given two parts since, the
code could run the one where the forward runs the other. So the names of each part the
code holds are watched too, and their being given two parts is said to the traces,
which have the forward traced again (:meth:`_Parts.follow`).

The fx split lists what the segments hold (:class:`_Read`); :class:`_Parts` watches
the tables on the way to each, so that asking whether any changed, which every eager
forward does, costs a look by identity per entry.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from somatize_torch._errors import WrapError
from somatize_torch.freeze import ModuleNode

_MISSING: Any = object()


class _Read(NamedTuple):
    """A part of the model fx code holds by reference: ``holder.field`` is the model's
    ``path``."""

    holder: nn.Module
    field: str
    path: str


class _Parts:
    """The parts of the model the fx segments hold by reference, kept pointing at what the
    model holds now, and the declared submodules, which cannot be replaced.

    Whether any changed is asked cheaply — each table entry on the way to each part is
    looked at by identity — and only then is each looked up and re-pointed."""

    def __init__(
        self,
        reads: Sequence[_Read],
        declared: Mapping[str, ModuleNode],
        traced: Mapping[str, nn.Module] | None = None,
        children: Mapping[str, tuple[str, ...]] | None = None,
        hooks: Mapping[str, Hooks] | None = None,
        aliases: Mapping[str, tuple[str, ...]] | None = None,
        running: Collection[str] | None = None,
    ) -> None:
        self.reads = list(reads)
        self.declared = dict(declared)
        """Declared submodules by path in the model (none when the model itself is)."""
        self.traced = dict(traced or {})
        """The submodules whose forward was traced into the code, by path: the code runs
        what their forward did, so they cannot be replaced either."""
        self.children = dict(children or {})
        """The names of the children each module the code went through held, by its path:
        fx unrolls a loop over a container (``for layer in self.layers``) as it traces, so
        a child added or removed since would not run as the model runs it."""
        self.hooks = dict(hooks or {})
        """The hooks and the ``forward`` of its own each module whose forward fx ran
        (the model's own, ``""``, included) had, by its path: fx calls that forward
        itself, so a hook or a ``forward`` given to it since would not run."""
        self.tops = frozenset(path.split(".")[0] for path in [*declared, *self.traced])
        self.aliases = dict(aliases or {})
        """The other paths at which the model held each part the code holds when it was
        traced (``self.enc2 = self.enc``, :func:`aliases_of`): fx calls or reads such a
        part by one of its names only, so the code is not the forward's once they hold
        two parts."""
        self.running = None if running is None else frozenset(running)
        """The paths of :attr:`reads` the code run now reads (None for every one): one of
        them gone is refused. Code traced for other values of a config, or before parts
        held under two names were given apart, may read one gone since: it is pointed at
        the part once it is back, before it is run."""
        self._tables: list[dict[str, Any]] = []
        self._keys: list[str] = []
        self._values: list[Any] = []
        self._held: list[dict[str, Any]] = []
        self._names: list[tuple[str, ...]] = []
        self._hooked: list[dict[Any, Any]] = []
        self._hook_keys: list[tuple[Any, ...]] = [
            keys for hooks in self.hooks.values() for keys in hooks[:-1]
        ]
        self._owns: list[dict[str, Any]] = []
        self._forwards = [hooks[-1] for hooks in self.hooks.values()]

    def watch(self, model: nn.Module) -> None:
        """Notes the table entries on the way to every part, as they are now."""
        seen: dict[tuple[int, str], tuple[dict[str, Any], Any]] = {}
        paths = [*self.declared, *self.traced, *(read.path for read in self.reads)]
        for path in [*paths, *(alias for names in self.aliases.values() for alias in names)]:
            owner: Any = model
            for atom in path.split("."):
                table = _table_of(owner, atom)
                if table is None:  # a plain attribute: a constant of the traced code
                    break
                _note_table(seen, owner, table)
                owner = table[atom]
                seen[(id(table), atom)] = (table, owner)
        held = [(_part(model, path), names) for path, names in self.children.items()]
        for part, _ in held:
            if isinstance(part, nn.Module):
                _note_table(seen, part, part._modules)
        self._tables = [table for table, _ in seen.values()]
        self._keys = [key for _, key in seen]
        self._values = [value for _, value in seen.values()]
        self._held = [part._modules for part, _ in held if isinstance(part, nn.Module)]
        self._names = [names for part, names in held if isinstance(part, nn.Module)]
        ran = [_part(model, path) for path in self.hooks]
        self._hooked = [getattr(module, table, {}) for module in ran for table in _HOOKS]
        self._owns = [getattr(module, "__dict__", {}) for module in ran]

    def changed(self) -> bool:
        """Whether an entry on the way to a part holds another object than it did, a
        module the code went through holds other children, or one whose forward fx ran
        has other hooks or another ``forward`` of its own."""
        return (
            not all(map(operator.is_, map(dict.get, self._tables, self._keys), self._values))
            or not all(map(operator.eq, map(tuple, self._held), self._names))
            or not all(map(operator.eq, map(tuple, self._hooked), self._hook_keys))
            or not all(map(operator.is_, map(_own_forward, self._owns), self._forwards))
        )

    def refuse(self, model: nn.Module, name: str, value: Any) -> None:
        """Refuses putting ``value`` in the model as ``name`` where that replaces a declared
        submodule (or what holds one) with another object."""
        for path, node in self.declared.items():
            if path.split(".")[0] == name and _part(model, name) is not value:
                raise _replaced(path, node)
        for path, module in self.traced.items():
            if path.split(".")[0] == name and _part(model, name) is not value:
                raise _retraced(path, module)

    def follow(self, model: nn.Module) -> tuple[str, str] | None:
        """Points every segment at the part the model holds now; WrapError when a declared
        submodule was replaced, or a part the code reads is gone. Says which two names of
        a part held under two (:attr:`aliases`) hold two parts now, if any: the forward is
        then traced again."""
        for path, node in self.declared.items():
            if _part(model, path) is not node.module:
                raise _replaced(path, node)
        for path, module in self.traced.items():
            if _part(model, path) is not module:
                raise _retraced(path, module)
        for path, names in self.children.items():
            held = _part(model, path)
            now = tuple(held._modules) if isinstance(held, nn.Module) else ()
            if now != names:
                raise _regrown(path, names, now)
        for path, was in self.hooks.items():
            module = _part(model, path)
            if isinstance(module, nn.Module) and hooks_of(module) != was:
                raise _hooked(path, module, was)
        split = untied(model, self.aliases)
        # Given apart, the code that runs is traced again: what it read may be gone.
        self.point(model, refuse=split is None)
        self.watch(model)
        return split

    def point(self, model: nn.Module, refuse: bool = True) -> None:
        """Points every segment at the part the model holds now; WrapError, where
        ``refuse``, when a part the code run now reads (:attr:`running`) is gone."""
        for read in self.reads:
            now = _part(model, read.path)
            if now is _MISSING:
                if not refuse or (self.running is not None and read.path not in self.running):
                    continue
                raise WrapError(
                    f"`{read.path}` was removed from the model after `wrap`, and the model's "
                    "forward reads it (fx traced the read into its code): there is nothing to "
                    "run in its place. Put it back, or wrap the model again"
                )
            if getattr(read.holder, read.field, _MISSING) is not now:
                _put(read.holder, read.field, now)


def _replaced(path: str, node: ModuleNode) -> WrapError:
    kind = type(node.module).__qualname__
    return WrapError(
        f"`{path}` is declared (frozen or cached), and was replaced after `wrap`: its node "
        f"holds the `{kind}` it was declared with, which would go on running and be keyed "
        "in place of the new one. Wrap the model again after replacing a declared "
        "submodule (`somatize.torch.wrap(model, ...)`, then `freeze`), or load new weights "
        "into it instead (`load_state_dict`)"
    )


def aliases_of(model: nn.Module, paths: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The other paths at which ``model`` holds what it holds at each of ``paths`` (a
    module, parameter or buffer under two names), for those it holds under more than one."""
    names: dict[int, list[str]] = {}
    for name, one in itertools.chain(
        model.named_modules(remove_duplicate=False),
        model.named_parameters(remove_duplicate=False),
        model.named_buffers(remove_duplicate=False),
    ):
        names.setdefault(id(one), []).append(name)
    found: dict[str, tuple[str, ...]] = {}
    for path in dict.fromkeys(paths):
        others = tuple(dict.fromkeys(n for n in names.get(id(_part(model, path)), ()) if n != path))
        if path and others:
            found[path] = others
    return found


def untied(model: nn.Module, aliases: Mapping[str, tuple[str, ...]]) -> tuple[str, str] | None:
    """A path of ``aliases`` and one of its other names that ``model`` holds two parts at
    now, or None where each is held under all its names still."""
    for path, names in aliases.items():
        held = _part(model, path)
        split = next((alias for alias in names if _part(model, alias) is not held), None)
        if split is not None:
            return path, split
    return None


def untied_said(path: str, alias: str) -> str:
    """What :func:`untied` found, for a message."""
    return (
        f"`{path}` and `{alias}` held the same part when `wrap` traced the model, and hold two now"
    )


def _retraced(path: str, module: nn.Module) -> WrapError:
    kind = type(module).__qualname__
    return WrapError(
        f"`{path}` was traced into (its `{kind}.forward` is part of the code `wrap` traced, "
        "which runs what it did then, with the values it read), and was replaced after "
        "`wrap`: the new one's own code and values would not run. Wrap the model again "
        "after replacing it, or load new weights into it instead (`load_state_dict`)"
    )


Hooks = tuple[Any, ...]
"""The keys of a module's tables of forward and backward hooks and pre-hooks, and the
``forward`` it was given of its own (None for none: a copy keeps None as it is)."""

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_HOOK_KINDS = ("forward hooks", "forward pre-hooks", "backward hooks", "backward pre-hooks")


def hooks_of(module: nn.Module) -> Hooks:
    """What of ``module``'s hooks and own ``forward`` a call of it runs, as :data:`Hooks`."""
    tables = [tuple(getattr(module, table, {})) for table in _HOOKS]
    return (*tables, _own_forward(vars(module)))


def _own_forward(held: dict[str, Any]) -> Any:
    return held.get("forward")


def hooked_error(path: str, kinds: str, was: str) -> WrapError:
    """The refusal of a module whose forward fx ran that has hooks (``kinds``) it did
    not have when it was traced (``was`` says when)."""
    where = f"`{path}`" if path else "the model"
    return WrapError(
        f"{where} has {kinds} {was}: fx calls the forward of the model and of each block "
        "it traces into itself, without their hooks, so the wrapped model would not run "
        "them. Register a hook on the model on the wrapped model instead "
        "(`wrapped.register_forward_hook(...)`, which runs it); for a block traced into, "
        "register it before `wrap` (it is traced with the block's forward), or declare "
        "the block. Wrap the model again after changing its hooks "
        "(`somatize.torch.wrap(model, ...)`, then `freeze`)"
    )


def _hooked(path: str, module: nn.Module, was: Hooks) -> WrapError:
    now = hooks_of(module)
    if now[-1] is not was[-1]:
        where = f"`{path}`" if path else "the model"
        return WrapError(
            f"{where} has a `forward` of its own given to it after `wrap` (in place of "
            "the one traced into the code, by a library that wraps it or by hand): the "
            "wrapped model runs what was traced, not the new one. Wrap the model again "
            "after replacing it (`somatize.torch.wrap(model, ...)`, then `freeze`)"
        )
    kinds = [kind for kind, a, b in zip(_HOOK_KINDS, now, was, strict=False) if a != b]
    return hooked_error(path, " and ".join(kinds), "it did not have when `wrap` traced it")


def _regrown(path: str, was: tuple[str, ...], now: tuple[str, ...]) -> WrapError:
    def shown(names: tuple[str, ...]) -> str:
        listed = ", ".join(f"`{name}`" for name in names[:8])
        return (listed + (f" and {len(names) - 8} more" if len(names) > 8 else "")) or "none"

    return WrapError(
        f"`{path or 'the model'}` held the children {shown(was)} when `wrap` traced the "
        f"forward, which went through it, and holds {shown(now)} now: fx unrolled what the "
        "forward did with them into the code the wrapped model runs (a loop over a "
        "container runs the layers it held then), so a child added or removed would not "
        "run as the model runs it. Wrap the model again after changing it "
        "(`somatize.torch.wrap(model, ...)`, then `freeze`); a child replaced by another "
        "under the same name is the one that runs"
    )


def _table_of(owner: Any, atom: str) -> dict[str, Any] | None:
    """The table of ``owner`` (a module) that registers ``atom``, or None."""
    if not isinstance(owner, nn.Module):
        return None
    for table in (owner._parameters, owner._buffers, owner._modules):
        if atom in table:
            return table
    # A tensor kept as a plain attribute (`self.scale = torch.ones(4)`), which fx reads
    # as a constant of the code by reference: replaced, the segments follow it too.
    if isinstance(owner.__dict__.get(atom), torch.Tensor):
        return owner.__dict__
    return None


def _note_table(
    seen: dict[tuple[int, str], tuple[dict[str, Any], Any]], owner: nn.Module, table: Any
) -> None:
    """Notes which of ``owner``'s registries ``table`` is: a module may make one anew (a
    ``ModuleList`` does as a child is removed), and the entries noted in the old one would
    then say nothing of what it holds. A row cache's registries are its module's (it
    stands in its place), made anew by the module, and noted there: the cache's own
    attributes (its locks, its memory tiers) are no part of the model's code, and a copy
    of the model copies the cache as a cache, not them."""
    from somatize_torch.rows import CachedRows  # rows builds on wrap, which on this

    held = (owner.module if isinstance(owner, CachedRows) else owner).__dict__
    for name in ("_parameters", "_buffers", "_modules"):
        if held.get(name) is table:
            seen[(id(held), name)] = (held, table)


def _part(model: nn.Module, path: str) -> Any:
    """What ``model`` holds at dotted ``path`` (the model itself at ``""``), or
    ``_MISSING``."""
    if not path:
        return model
    found: Any = model
    for atom in path.split("."):
        found = getattr(found, atom, _MISSING)
        if found is _MISSING:
            break
    return found


def _put(holder: nn.Module, field: str, value: Any) -> None:
    """Puts ``value`` in ``holder`` as ``field``, in the table its kind goes in."""
    for table in (holder._parameters, holder._buffers, holder._modules, holder.__dict__):
        table.pop(field, None)
    if isinstance(value, nn.Module):
        holder._modules[field] = value
    elif isinstance(value, nn.Parameter):
        holder._parameters[field] = value
    elif isinstance(value, torch.Tensor):
        holder._buffers[field] = value
    else:
        object.__setattr__(holder, field, value)
