"""The weights a plain node keeps, and the watch of them from when it is settled.

A plain :class:`~somatize.Node` may keep a module with weights as an attribute
(``self.encoder = Encoder()``), or a parameter, or either in a list, tuple or dict it keeps
as one (:func:`kept_weights`). Its weights are its state, which it says itself in a
``settled_state()`` that ``somatize.data.settle(g)`` asks once. What changes them after —
an optimizer step, ``load_state_dict``, ``p.add_(1)`` under ``no_grad`` — would go on being
keyed by the state settled. :class:`KeptWeightsWatch` watches them from the settle on, as
cheaply as a torch node's own weights are watched (:class:`~somatize_torch._state.StateWatch`),
and says what changed. The watch is cheap and fires on what leaves the state equal too (the
module moved to another device and back, a gradient, the same values loaded), so the graph
then asks the node's own ``settled_state()`` once: the digest it was settled at, and the
node is watched afresh; another, and the graph takes the settled state back and refuses
the node until it is settled again, or until, touched again, it holds the settled values
once more (loaded back), when it goes on.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterator
from typing import Any

import blake3
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from somatize import canonical
from somatize.node import UNSET, attributes_of, tells_state
from somatize_torch._settings import SettingsWatch, hooks_of, settings_of
from somatize_torch._state import StateWatch
from somatize_torch.digest import digest_named, raw_digest

__all__ = ["KeptWeightsWatch", "kept_weights", "watch_kept_weights"]


def kept_weights(node: Any) -> Iterator[tuple[str, Any, Any]]:
    """Each parameter, and each module with parameters or buffers, ``node`` keeps as an
    attribute or as an item of a list, tuple or dict it keeps as one: the attribute's name,
    what it holds, and the parameter or module."""
    for name, value in attributes_of(node).items():
        inside = value.values() if isinstance(value, dict) else value
        parts = inside if isinstance(value, (list, tuple, dict)) else (value,)
        for part in parts:
            if isinstance(part, nn.Parameter) or (
                isinstance(part, nn.Module)
                and (
                    next(part.parameters(), None) is not None
                    or next(part.buffers(), None) is not None
                )
            ):
                yield name, value, part


class _ParameterWatch:
    """A parameter kept on its own, watched as :class:`StateWatch` watches one of a module:
    by its version counter, its memory and the gradient it holds."""

    __slots__ = ("_gradient", "_parameter", "_requires", "_version", "_where")

    def __init__(self, parameter: torch.Tensor) -> None:
        self._parameter = parameter
        self._version = parameter._version
        self._where = parameter.data_ptr()
        self.follow_gradients()

    def changed(self, thorough: bool = True) -> bool:
        p = self._parameter
        return (
            p._version != self._version
            or p.grad is not self._gradient
            or p.requires_grad != self._requires
            or (thorough and p.data_ptr() != self._where)
        )

    def held_in_place(self) -> bool:
        p = self._parameter
        return p._version == self._version and p.data_ptr() == self._where

    def follow_gradients(self) -> None:
        self._gradient = self._parameter.grad
        self._requires = self._parameter.requires_grad


def _items(held: Any) -> tuple[Any, ...]:
    """What a list, tuple or dict holds, to be compared by identity."""
    return (*held, *held.values()) if isinstance(held, dict) else tuple(held)


class KeptWeightsWatch:
    """The weights a node keeps (:func:`kept_weights`), watched from when it was settled:
    calling it answers what changed since, in words, or None. Each attribute is looked at
    by what it holds (a module put in its place, or into the list it is), each module by a
    :class:`StateWatch` asked thoroughly, as a torch node's is at every forward. A copy
    (``copy.deepcopy`` of the graph, a pickle) watches the copy's weights, equal to the
    original's when copied, and says changed where the original's had."""

    __slots__ = (
        "__weakref__",
        "_changed",
        "_graded",
        "_heard",
        "_heard_on",
        "_kept",
        "_node",
        "_parameters",
        "_part_ids",
        "_parts",
        "_raw",
        "_settings",
        "_structure",
        "_training",
        "_values",
        "_weights",
    )

    def __init__(self, node: Any, changed: str | None = None, values: str | None = None) -> None:
        self._node = node
        self._changed = changed
        # What the weights hold, to tell a touch that leaves them equal from a change a
        # `settled_state()` worked out once (a checkpoint's digest) does not hear.
        self._values = _values_of(node) if values is None else values
        # The same tensor by tensor, beside the structure, to weigh the very tensors held in
        # place again at each forward a gradient is held: their names, dtypes and shapes
        # cannot have changed, and the canonical digest of all of them costs several times
        # as much. A copy handed the values of the original compares by those.
        self._weights = _weights_of(node)
        self._raw = _raw_of(self._weights) if values is None else None
        self._structure = _structure_of(node)
        kept: dict[str, tuple[Any, list[tuple[Any, StateWatch | _ParameterWatch]]]] = {}
        for name, value, part in kept_weights(node):
            watch = StateWatch(part) if isinstance(part, nn.Module) else _ParameterWatch(part)
            kept.setdefault(name, (value, []))[1].append((part, watch))
        self._kept = [
            (name, value, _items(value) if isinstance(value, (list, tuple, dict)) else None, parts)
            for name, (value, parts) in kept.items()
        ]
        self._parts = [part for _, _, part in _kept_modules(node) for part in part.modules()]
        self._watch_beside_weights()
        self._part_ids = frozenset(map(id, self._parts))
        # Held in place, as each forward after a gradient checks first, they are these.
        self._parameters = list(_kept_parameters(node))
        self._graded = _holds_gradients(self._parameters)
        self._heard: list[RemovableHandle] = []
        self._heard_on: list[weakref.ref[torch.Tensor]] = []
        weakref.finalize(self, _removed, self._heard)
        self._hear_gradients(self._parameters)

    def _hear_gradients(self, parameters: list[torch.Tensor]) -> None:
        """Marks the weights graded whenever a backward gives a weight that requires grad
        a gradient from here on: a fused step, then `zero_grad()`, before the next forward
        leaves each weight at its version and its gradient None, as watched. The hooks
        already set are kept where they are on the very weights that require grad now:
        a node holding a gradient is weighed again at each forward, and setting them
        afresh each time would cost more than the digest of a small module."""
        wanted = [p for p in parameters if p.requires_grad and p.is_leaf]
        if len(wanted) == len(self._heard_on) and all(
            p is was() for p, was in zip(wanted, self._heard_on, strict=True)
        ):
            return
        _removed(self._heard)
        self._heard_on = [weakref.ref(p) for p in wanted]
        heard = weakref.ref(self)

        def given(_: torch.Tensor) -> None:
            watch = heard()
            if watch is not None:
                watch._graded = True

        self._heard.extend(
            p.register_post_accumulate_grad_hook(given)  # type: ignore[no-untyped-call]
            for p in wanted
        )

    def __call__(self) -> str | None:
        if self._changed is None:
            self._changed = self._looked()
        return self._changed

    def _looked(self) -> str | None:
        replaced = self._replaced()
        if replaced is not None:
            return replaced
        for name, _, _, parts in self._kept:
            for part, watch in parts:
                if watch.changed(thorough=True):
                    what = "a parameter" if isinstance(part, nn.Parameter) else "an nn.Module"
                    return (
                        f"`self.{name}`, {what}, changed (a weight or buffer changed in place: "
                        "an optimizer step, `load_state_dict`; or one was replaced)"
                    )
        beside = self._beside_weights()
        if beside is not None:
            return beside
        if self._graded:
            # A fused optimizer (`AdamW(fused=True)`) steps a weight holding a gradient
            # without moving its version counter: only its values tell.
            return (
                "a weight it keeps holds or was given a gradient, which an optimizer may "
                "have stepped it by"
            )
        return None

    def _beside_weights(self) -> str | None:
        """What changed beside the weights, in words: a part's mode, or a value a part
        keeps or a hook (which may leave all as it was: an equal value set again)."""
        if tuple(map(_TRAINING, self._parts)) != self._training:
            return "an nn.Module it keeps, or a part of it, was put in another mode (`train()`)"
        for name, settings in self._settings:
            if settings.changed():
                return (
                    f"`self.{name}`, an nn.Module, changed (a value one of its parts keeps "
                    "beside its weights was set, or a hook registered or removed)"
                )
        return None

    def _watch_beside_weights(self) -> None:
        """Watches from here what the kept modules' parts hold beside their weights: the
        values they keep (a BatchNorm's `eps`), which the weights' watches do not see and a
        `settled_state()` of weights does not hear, and each part's mode (put in train
        mode, a dropout draws and a BatchNorm reads the batch, though no weight changed)."""
        self._settings = [
            (name, SettingsWatch(part))
            for name, _, _, parts in self._kept
            for part, _ in parts
            if isinstance(part, nn.Module)
        ]
        self._training = tuple(map(_TRAINING, self._parts))

    def took_its_own(self) -> None:
        """Takes what the node's own forward set beside the weights as it ran (a count it
        keeps, a mask it builds at its first call) as what it holds from here: its state,
        not a change made since it was settled. Set from outside between forwards, it is
        seen at the next forward's start, before anything runs; a weight the forward
        changed in place is seen as ever."""
        if self._beside_weights() is None:
            return
        self._watch_beside_weights()
        self._structure = _structure_of(self._node)
        self._values = self._values.partition(" ")[0] + " " + self._structure

    def shares_parts_with(self, other: Any) -> bool:
        """Whether ``other``, another node's watch, watches a module this one watches."""
        return isinstance(other, KeptWeightsWatch) and not self._part_ids.isdisjoint(
            other._part_ids
        )

    def _replaced(self) -> str | None:
        """Which attribute was given another object, or an item of the list it is, in words."""
        held = attributes_of(self._node)
        for name, value, items, _ in self._kept:
            now = held.get(name, UNSET)
            if now is not value or (items is not None and _replaced(_items(now), items)):
                return f"`self.{name}` was given another object"
        return None

    def weighed_again(self) -> bool | None:
        """Where only gradients were touched since the watch was taken (given, dropped,
        or held, a parameter made to require grad or not): whether the weights still hold
        the values watched, worked out once. True, and the watch follows the gradients as
        they are and says nothing changed; False: other values (a fused optimizer's step).
        None where more changed (a weight changed in place, moved or replaced, a part's mode,
        a value a part keeps, a hook), left to the node's ``settled_state()``. A touch that
        leaves each weight at its version and in its memory costs one digest of the values,
        and no asking the node."""
        if (
            self._replaced() is not None
            or not all(watch.held_in_place() for _, _, _, parts in self._kept for _, watch in parts)
            # Touched beside the weights too: the node's `settled_state()` may name that, and
            # a watch taken afresh once stops the values being digested at each forward.
            or self._beside_weights() is not None
        ):
            return None
        if not self._holds_watched_values():
            return False
        for _, _, _, parts in self._kept:
            for _, watch in parts:
                watch.follow_gradients()
        self._graded = _holds_gradients(self._parameters)
        self._hear_gradients(self._parameters)  # a weight made to require grad since
        self._changed = None
        return True

    def _holds_watched_values(self) -> bool:
        """Whether the weights, each held in place, hold the values watched."""
        if self._raw is None:
            return _values_of(self._node) == self._values
        return _raw_of(self._weights) == self._raw and _structure_of(self._node) == self._structure

    def holds_as(self, later: KeptWeightsWatch) -> bool:
        """Whether the weights held the same values when ``later`` was taken as when this
        watch was."""
        return self._values == later._values

    def differs_from(self, later: KeptWeightsWatch) -> str:
        """What holds other values when ``later`` was taken than when this watch was, and
        what makes a ``settled_state()`` tell it, in words."""
        was, now = self._values.split(" "), later._values.split(" ")
        if len(was) != len(now):  # pickled by a release that kept fewer apart, once changed
            return (
                "It was settled by an older release of somatize, whose record of its values "
                "this one cannot compare: build the graph again and settle it."
            )
        return " ".join(words for words, a, b in zip(_DIFFERING, was, now, strict=True) if a != b)

    def __getstate__(self) -> dict[str, Any]:
        return {"node": self._node, "changed": self(), "values": self._values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A watch pickled before it kept the values: the copy's, equal when copied. So where
        # it kept fewer of them apart and had seen nothing change since the settle: the
        # values were then those settled, and its own could never be compared with any.
        values, changed = state.get("values"), state["changed"]
        if values is not None and changed is None and values.count(" ") != len(_DIFFERING) - 1:
            values = None
        self.__init__(state["node"], changed, values)  # type: ignore[misc]


def _values_of(node: Any) -> str:
    """The digest of the values of the weights ``node`` keeps, wherever they live, then of
    the structure of each module kept as ``repr`` shows it, of the values its parts keep
    beside their weights, of their modes and of their own forward hooks, each apart
    (:data:`_DIFFERING` says each): a part with no weights put in place of one
    (``nn.ReLU`` for ``nn.Tanh``), a BatchNorm's ``eps`` set, a part put in train mode or
    given a hook changes no weight, yet the answers."""
    return digest_named(dict(_named_weights(node))) + " " + _structure_of(node)


def _named_weights(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter and buffer among the weights ``node`` keeps, under a name of its own."""
    for at, (name, _, part) in enumerate(kept_weights(node)):
        if isinstance(part, nn.Module):
            held = [*part.named_parameters(), *part.named_buffers()]
        else:
            held = [("", part)]
        yield from ((f"{at}.{name}.{inner}", t.detach()) for inner, t in held)


def _structure_of(node: Any) -> str:
    """The digests of the structure of each module ``node`` keeps, as ``repr`` shows it, of
    the values its parts keep beside their weights, of their modes and of their own hooks,
    each apart."""
    structure: list[list[bytes]] = [[], [], [], []]
    for _, _, part in _kept_modules(node):
        structure[0].append(repr(part).encode())
        structure[1].append(canonical.encode(settings_of(part)))
        structure[2].append(canonical.encode([sub.training for sub in part.modules()]))
        # Its parts' own hooks, not those of every module's a profiler registers.
        hooks = hooks_of(part)
        hooks.pop("*", None)
        structure[3].append(canonical.encode(hooks))
    return " ".join(blake3.blake3(b"\n".join(one)).hexdigest() for one in structure)


def _weights_of(node: Any) -> list[torch.Tensor]:
    """The parameters and buffers among the weights ``node`` keeps, in order."""
    return [tensor for _, tensor in _named_weights(node)]


def _raw_of(weights: list[torch.Tensor]) -> tuple[bytes, ...]:
    """The digest of each tensor's bytes alone, in order."""
    return tuple(map(raw_digest, weights))


_DIFFERING = (
    "Its weights or buffers hold other values: `somatize.torch.digest_state(self.encoder)` "
    "digests every one, those `state_dict()` leaves out (`persistent=False`) too.",
    "Its parts differ as `repr(self.encoder)` shows them (a part with no weights put in "
    "place of one, `nn.ReLU` for `nn.Tanh`): name the repr in the digest.",
    "A value a part keeps beside its weights differs (a BatchNorm's `eps`, which "
    "`repr(self.encoder)` shows, or one of your own): name it in the digest.",
    "A part is in another mode (`train()`): put it back in the mode it was settled in "
    "(`.eval()`), or name the modes in the digest "
    "(`[m.training for m in self.encoder.modules()]`).",
    "A part runs other forward hooks (`register_forward_hook`): remove them, or name them "
    "in the digest.",
)
"""What each field of :func:`_values_of` is, and what makes a digest tell it, in words."""


_TRAINING = operator.attrgetter("training")


def _kept_modules(node: Any) -> Iterator[tuple[str, Any, nn.Module]]:
    """Each module among the weights ``node`` keeps (:func:`kept_weights`)."""
    return ((n, v, p) for n, v, p in kept_weights(node) if isinstance(p, nn.Module))


def _kept_parameters(node: Any) -> Iterator[torch.Tensor]:
    """Each parameter among the weights ``node`` keeps."""
    for _, _, part in kept_weights(node):
        yield from part.parameters() if isinstance(part, nn.Module) else (part,)


def _holds_gradients(parameters: list[torch.Tensor]) -> bool:
    """Whether one of ``parameters`` (the weights a node keeps) holds a gradient."""
    return any(p.grad is not None for p in parameters)


def _removed(handles: list[RemovableHandle]) -> None:
    """Removes the hooks ``handles`` hold, once the watch that set them is dropped."""
    for handle in handles:
        handle.remove()
    handles.clear()


def _replaced(now: tuple[Any, ...], was: tuple[Any, ...]) -> bool:
    return len(now) != len(was) or any(a is not b for a, b in zip(now, was, strict=True))


def watch_kept_weights(node: Any) -> KeptWeightsWatch | None:
    """The watch of the weights ``node`` keeps, about to be settled by its
    ``settled_state()`` (registered with :func:`~somatize.node.watches_settled`); None for a
    torch node (it watches its own, :meth:`~somatize.node.Node.restate`) and for a node that
    keeps none."""
    if tells_state(node):
        return None
    if next(kept_weights(node), None) is None:
        return None
    return KeptWeightsWatch(node)
