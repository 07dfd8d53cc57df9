"""Looking at a graph again: what changed in its nodes since it was built, said to its
memory at the start of every forward.

What a node declares is taken when its graph is built, and some nodes change after: one
built with a list or a dict, which somebody changes in place
(:meth:`~somatize.node.Node.is_declaration_fixed`); one whose argument, kept as an
attribute, is replaced (``scale.by = 3.0``: :meth:`~somatize.node.Node.kept_arguments`);
a frozen node that sees its own state change (a torch module whose weights were loaded
since ``freeze``: :meth:`~somatize.node.Node.restate`) or what it declares (a setting
given to the module since: :meth:`~somatize.node.Node.declaration_moved`).
:func:`look_again` finds each and says the change to the graph's memory, which makes a
new state — before anything is keyed or sent to a worker — so a key, and a node rebuilt
on a worker, name what the node is now.

A replaced argument is taken as the argument the node was built with. When its key could
not follow it — no key holds the new value, or the constructor made more from the old
value than it keeps (``self.factor = by * 2``) and the node still holds that — the graph
holds why, and the node is refused where its key is needed, not here, until it is
replaced again. An attribute named like a parameter that is not the argument itself
(``self.by = float(by)``: made from it) is not taken as one: replaced by what the node did
not hold when the graph was built, nor a build from its arguments holds, it has the node
refused the same way (:func:`_looked_at_named_like`), and so does a public attribute its
constructor set that no argument names (``self.offset = 0.0``), replaced from outside the
node (:meth:`~somatize.node.Node.set_up_attributes`). A list or a dict changed in place is
followed as a replaced argument is, from the value the node's attributes were made from
(:func:`_changed_in_place`), before the graph was built too. :func:`look_again` and
:func:`declared_again` are re-exported by :mod:`somatize.plan`, their public home.
"""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING, Any

from somatize import canonical
from somatize._calls import copy_call, declared_arguments, noted_call
from somatize.catalog import Blueprint, Catalog, Unbuildable, identity_of
from somatize.errors import SomatizeError
from somatize.memory import Memory
from somatize.node import (
    UNSET,
    AlreadyBuilt,
    Node,
    Undeclared,
    _by_name,
    _set_by_methods,
    attributes_of,
    digest_of,
    held_by,
    in_slot,
    settled_watch,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from somatize.graph import Graph

__all__ = ["declared_again", "look_again"]


def look_again(graph: Graph) -> None:
    """Says to ``graph``'s memory what changed in its nodes since it was built: the
    declaration of a node built with a list or a dict changed in place since (see
    :meth:`~somatize.node.Node.is_declaration_fixed`), and the state of a frozen node
    that sees its own state changed (:meth:`~somatize.node.Node.restate`), and the code
    of a node whose class, or a class it inherits from, was given another method or
    value since, or lost one (a monkeypatch), or other bases, or one of whose methods
    was given other code or defaults in place: its fingerprint worked out again, so an
    answer kept by the old code is drifted, never taken for the new code's. A change makes
    a new state of the memory, so what was derived from the old one — a graph's
    :class:`~somatize.plan.Static`, a broker's blueprints — is derived again. Nothing is
    refused here: a node that can no longer be keyed is refused where its key is needed.
    Run at the start of every forward, before anything is keyed or sent; it costs one
    comparison of the classes' namespaces for a graph with no such node."""
    if not graph._code_watch.looks_same():
        # A method set on a class since, or deleted: the fingerprints of its code now.
        graph._written_again()
    unfixed: dict[str, Node] = graph._unfixed
    restated: dict[str, Node] = graph._restated
    kept = graph._kept
    named_like = graph._named_like
    if graph._settled_watches:
        _looked_at_settled(graph)
    if not unfixed and not restated and not kept and not named_like:
        return
    for name, made in graph._made_stale.items():
        # Refused while it holds what was made from the old value, and not once it holds
        # what a build from its arguments holds (set by hand), until they are replaced again.
        refused = made.check()
        if (refused is None) != (name not in graph._unfollowed):
            if refused is None:
                del graph._unfollowed[name]
                made.node._smz.made_with = made.made_with
            else:
                graph._unfollowed[name] = refused
            _declared_again(graph, name, made.node)
    memory = graph.memory
    held, names, values, slotted, taken = graph._kept_watch
    taken_elsewhere = {id(marks) for marks, count in taken if marks.retaken != count}
    if (
        not all(map(operator.is_, map(dict.get, held, names), values))
        or (slotted and not all(in_slot(slot, node) is value for slot, node, value in slotted))
        or taken_elsewhere
    ):
        retaken = set()
        for name, (node, arguments) in list(kept.items()):
            now = attributes_of(node)
            changed = {a: now[a] for a, was in arguments if a in now and now[a] is not was}
            if id(node._smz) in taken_elsewhere:
                # Taken as its argument by another graph built with it since this one
                # looked: one given back since is what this graph last saw, and no
                # longer the argument the node is noted as made with.
                called = _called_with(node)
                changed.update(
                    (a, now[a])
                    for a, _ in arguments
                    if a in now and now[a] is not called.get(a, UNSET)
                )
            if changed:
                _retaken(graph, name, node, changed)
                retaken.add(name)
        for name, (node, like) in list(named_like.items()):
            _looked_at_named_like(graph, name, node, like, name in retaken)
        graph.watch_kept()
    for name, node in unfixed.items():
        declared = _declaration_now(graph, name, node)
        if isinstance(declared, str):
            _changed_in_place(graph, name, node, declared)
        _declared_again(graph, name, node, declared)
    followed = graph._followed
    for name, node in restated.items():
        if memory.is_frozen(name):
            marks = node._smz
            state = node.restate()
            # What changed may be more than its state (a part with no weights of its own
            # replaced: an activation), and what it declares says the rest.
            moved = node.declaration_moved() or state is not None
            if moved:
                marks.moved += 1
                if state is not None:
                    marks.state = state
            elif marks.moved != followed[name] or marks.state != memory.state_of(name):
                # Told to another graph built with the node (or frozen there), which asked
                # first: a node tells a change once, and this graph would go on keying it
                # by what it was.
                moved = True
                if marks.state is not None and marks.state != memory.state_of(name):
                    state = marks.state
            if state is not None:
                memory.freeze(name, state)
            if moved:
                _declared_again(graph, name, node)
            # Past what taking its declaration again told (a torch module declared in
            # another precision), which this graph has just followed.
            followed[name] = marks.moved


def _looked_at_settled(graph: Graph) -> None:
    """Takes back the state of each node settled by its ``settled_state()`` whose watch
    (:func:`~somatize.node.watches_settled`) finds what it holds changed since, and whose
    ``settled_state()``, asked once, says another digest than it was settled at: it is
    refused where its key is needed, saying what changed, until it is settled again or
    holds the settled state again (:func:`_looked_at_refused`). One that says the same
    digest (its weights moved to another device and back, given a gradient, loaded with
    the values they held) is watched afresh and goes on. A forward that finds no change
    asks no node anything."""
    changed = graph._changed_since_settled
    memory = graph.memory
    for name, watch in list(graph._settled_watches.items()):
        if name in changed:
            _looked_at_refused(graph, name, watch)
            continue
        settled = memory.state_of(name)
        if settled is None:
            continue
        what = watch()
        if what is None:
            continue
        refused = _settled_elsewhere(graph, name, settled, watch)
        if refused is not None:
            changed[name] = f"{what}, and {refused}"
            memory.unsettle(name)
            graph._refused_settled[name] = (settled, settled_watch(graph.node(name)))


def _looked_at_refused(graph: Graph, name: str, watch: Callable[[], str | None]) -> None:
    """Settles the node ``name``, refused since what it holds changed, at the state it was
    settled at again where it holds that state again (weights loaded back from the settled
    state): the same values give the same answers. It is asked only once the watch taken
    when it was last found changed finds it touched since, so that a refused node left as
    it is costs no digest at each forward (one holding gradients, one digest of its values);
    still changed, it is watched afresh from here."""
    settled, since = graph._refused_settled.get(name, (None, None))
    if settled is None or since is None or since() is None:
        return
    # Only gradients touched (held at each forward once stepped): values as they were when
    # refused, it is refused still, and is not asked its state at each forward.
    weighed_again = getattr(since, "weighed_again", None)
    if weighed_again is not None and weighed_again():
        return
    fresh = settled_watch(graph.node(name))
    if _holds_settled(graph.node(name), settled, watch, fresh) is None:
        graph.memory.freeze(name, settled)
        graph.watch_settled(name, fresh)
    else:
        graph._refused_settled[name] = (settled, fresh)


def _settled_elsewhere(
    graph: Graph, name: str, settled: str, watch: Callable[[], str | None]
) -> str | None:
    """Why the node ``name``, whose ``watch`` found what it holds touched, no longer holds
    the state ``settled`` it was settled at, in words; None when its ``settled_state()``
    still says that digest and the watch finds the values it holds equal, and then it is
    watched afresh from here, so that the node is asked once per change and never at a
    forward that finds none."""
    weighed_again = getattr(watch, "weighed_again", None)
    # Only gradients touched (one written at every step): the values alone tell, and a
    # node asked at each forward would digest its weights at each.
    equal = None if weighed_again is None else weighed_again()
    if equal is not None:
        return None if equal else f"{_OTHER_VALUES}, stepped by what moves no version counter"
    node = graph.node(name)
    # Taken first, as settle takes it: a change made while the state is worked out is seen.
    fresh = settled_watch(node)
    refused = _holds_settled(node, settled, watch, fresh)
    if refused is None:
        graph.watch_settled(name, fresh)
    return refused


def _holds_settled(
    node: Node,
    settled: str,
    watch: Callable[[], str | None],
    fresh: Callable[[], str | None] | None,
) -> str | None:
    """Why ``node`` does not hold the state ``settled`` it was settled at (``watch`` taken
    then), in words, as ``fresh``, taken just before, finds it; None when it does: its
    ``settled_state()`` says that digest, and the values it holds are those ``watch``
    was taken with."""
    try:
        now = node.settled_state()  # type: ignore[attr-defined]
    except Exception as why:  # the node's own code: said in the refusal, never raised here
        return (
            f"its `settled_state()` raised {type(why).__name__}: {why}, so whether it still "
            "holds the state it was settled at is unknown"
        )
    if now != settled:
        return f"its `settled_state()` now says {now!r}, not {settled!r}"
    # The watch is there for what `settled_state()` does not hear (a digest worked out once).
    holds_as = getattr(watch, "holds_as", None)
    if holds_as is not None and not holds_as(fresh):
        return (
            f"{_OTHER_VALUES}, which its `settled_state()`, saying the same digest, does not hear"
        )
    return None


_OTHER_VALUES = "it holds other values than it was settled with"
"""Why a node whose weights were touched is refused, where only their values tell."""


def _retaken(graph: Graph, name: str, node: Node, changed: dict[str, Any]) -> None:
    """Takes the attributes of ``node`` replaced since the build as its constructor
    arguments, and the graph's memory its declaration now. One replaced by a value no key
    can hold (a path made a ``Path``, a numpy number, an enum member) is taken too, and the
    node is refused where its key is needed, naming it, until it is replaced again: its key
    would otherwise go on naming the old value (:func:`_unkeyable`). So is
    one whose constructor made more from the old value than it keeps
    (:func:`_made_otherwise`)."""
    taken = dict(changed)
    keyable = [attr for attr, value in taken.items() if canonical.is_canonical(value)]
    # By a value no key holds too: the node that does not run would go unheard, and the one
    # that runs would answer with it for both.
    _refuse_interned(graph, name, node, list(taken))
    if "\0" not in name:  # one interned into another is keyed, if at all, where it runs
        # A node holding no state is cheap to build, as a worker would; one holding state
        # (weights) is checked against the state it is settled at instead. What it holds
        # was made from the call noted when it was made, where a list in it may have
        # changed in place since.
        made_with = node._smz.made_with
        before: Recipe | Unbuildable | None = None
        if not node.holds_state:
            before = _recipe(node) if made_with is None else (None, *made_with)
            if made_with is None and isinstance(before, tuple) and before[0] is None:
                # Noted on the node, not in this graph: another graph built with it takes
                # the new value next, and finds the call the node is keyed as built with
                # already holding it, while what it holds was still made from this one.
                # Once it holds what the new value makes, that call is noted (_made_from).
                node._smz.made_with = copy_call(*before[1:])
        node.retake(taken)
        unkeyable = [attr for attr in taken if attr not in keyable]
        refused: Undeclared | None = None
        graph._made_stale.pop(name, None)
        if unkeyable:
            refused = _unkeyable(name, node, unkeyable[0], taken[unkeyable[0]])
        elif before is not None:
            made = _made_otherwise(name, node, taken, before, _REPLACED)
            if isinstance(made, _MadeOtherwise):
                graph._made_stale[name] = made
                refused = made.check()
            else:
                refused = made
        if refused is not None:
            graph._unfollowed[name] = refused
        else:
            graph._unfollowed.pop(name, None)
            _made_from(node)
        declared = _declaration_now(graph, name, node)
        if isinstance(declared, str):  # judged here: not as a change in place after
            graph._in_place[name] = declared
        _declared_again(graph, name, node, declared)
        if not node.is_declaration_fixed():  # a list or a dict now: followed from here on
            graph._unfixed[name] = node
    # What the node keeps now is what is watched from here.
    now = attributes_of(node)
    graph._kept[name] = (node, [(attr, now.get(attr, was)) for attr, was in graph._kept[name][1]])


def _called_with(node: Node) -> dict[str, Any]:
    """The arguments of the call ``node`` is noted as made with, by name, defaults filled
    in (those its ``**kwargs`` took under their keywords)."""
    bound = node._bound()
    if bound is None:
        return {}
    bound.apply_defaults()
    return dict(_by_name(bound))


def _refuse_interned(graph: Graph, name: str, node: Node, attrs: list[str]) -> None:
    """Refuses ``attrs`` of ``node``, known to ``graph`` as ``name``, changed after the build
    when the node is one computation with another: interned into it (it does not run), or
    the one another was interned into (the change would be that one's too)."""
    said = ", ".join(f"`{attr}`" for attr in attrs)
    if "\0" in name:  # a node interned into another, which runs in its place
        raise AlreadyBuilt(
            f"{said} of a `{type(node).__qualname__}` was changed after the graph was built, "
            f"and that node runs there as `{name.split(chr(0))[0]}` (it was one computation "
            "with it when the graph was built), so the change would not be heard. Build the "
            "graph again"
        )
    others = (*graph._kept, *graph._named_like)
    if any(other.startswith(f"{name}\0") for other in others):
        raise AlreadyBuilt(
            f"{said} of `{name}` was changed after the graph was built, and another node "
            f"built alike runs as `{name}` too (they were one computation when the graph was "
            "built), so the change would change that one's answers as well. Build the graph "
            "again"
        )


def _looked_at_named_like(
    graph: Graph,
    name: str,
    node: Node,
    like: list[tuple[str, Any, str | None]],
    retaken: bool,
) -> None:
    """Looks at the attributes of ``node`` named like a constructor parameter but not the
    argument (:meth:`~somatize.node.Node.named_like_arguments`): ``like``, each with the
    object last seen and the digest of what its constructor left there. One replaced since
    is not taken as the argument — it was made from it (``self.by = float(by)``), or given
    by no constructor — and the node's key names what it was built with: it holds
    what it held then (by canonical form), or what a build from the arguments it is keyed
    as built with holds (a node holding no state, built again as a worker would), or the
    node is refused where it is keyed, naming it, until it does. Looked at when one of them
    was replaced, when an argument the node keeps was (``retaken``), and while refused."""
    now = attributes_of(node)
    replaced = any(now.get(attr, UNSET) is not was for attr, was, _ in like)
    if not replaced and not retaken and name not in graph._remade:
        return
    # One that holds what has no canonical form now is not compared where the node's own
    # code may have put it there (a model it loads on first use in place of None): no key
    # could name it, as a node's attributes go. Given from outside (a numpy number), it is.
    seen = {attr: digest_of(now.get(attr, UNSET)) for attr, _, _ in like}
    own = _set_by_methods(type(node))
    stale = [
        attr
        for attr, _, digest in like
        if seen[attr] != digest and (seen[attr] is not None or not (own is None or attr in own))
    ]
    built: dict[str, Any] | None = None
    if stale and not node.holds_state:
        try:
            built = dict(attributes_of(_built_again(node, node.recipe())))
        except Unbuildable:
            pass  # not checked against a build: refused, as it holds what it did not
        else:
            fresh = {attr: digest_of(value) for attr, value in built.items()}
            stale = [a for a in stale if digest_of(now.get(a, UNSET)) != fresh.get(a)]
    if stale:
        _refuse_interned(graph, name, node, stale)
    graph._named_like[name] = (node, [(a, now.get(a, UNSET), d) for a, _, d in like])
    if "\0" in name:
        return
    names = node._argument_names()
    set_up = [attr for attr in stale if attr not in names]
    if set_up:
        made = {attr: was for attr, was, _ in like}
        refused: Undeclared | None = _set_up_again(name, node, set_up, built or made)
    else:
        refused = _remade(name, node, stale) if stale else None
    if refused is None and graph._remade.pop(name, None) is None:
        return
    if refused is not None:
        graph._remade[name] = refused
    _declared_again(graph, name, node)


def _remade(name: str, node: Node, stale: list[str]) -> Undeclared:
    """Why ``node`` cannot be keyed while its attributes ``stale``, named like a constructor
    parameter but not the argument, hold what it was not built with."""
    kind = type(node).__qualname__
    said = ", ".join(f"`{attr}`" for attr in stale)
    one = len(stale) == 1
    built = ", ".join(
        f"{attr}={value!r}" for attr, value in declared_arguments(type(node), *node._call()).items()
    )
    keyed = f"the node is keyed as a `{kind}({built})`"
    if node.holds_state:
        holds = f"{keyed}, and {'it holds' if one else 'they hold'} other than when it was built"
    else:
        holds = f"{keyed}, which holds {'another' if one else 'others'}"
    return Undeclared(
        f"`{name}` ({kind}) cannot be keyed: {said} {'was' if one else 'were'} replaced after "
        f"the node was made, and {'is' if one else 'are'} named like "
        f"{'an argument' if one else 'arguments'} of its constructor but not the very value "
        "it was given (made from it, or given by no constructor), so "
        f"{'it is not taken as the argument' if one else 'they are not taken as the arguments'}"
        f": {holds}. Keyed so, it would keep answers such a node "
        f"does not compute, under that node's key. Build a new `{kind}` with the value you "
        f"mean (`{kind}({stale[0]}=...)`) and the graph again, or give {said} back what "
        f"{'it' if one else 'they'} held; a node that tidies an argument as it keeps it "
        "keeps what it makes under another name (`self._by`)"
    )


def _set_up_again(name: str, node: Node, stale: list[str], built: dict[str, Any]) -> Undeclared:
    """Why ``node`` cannot be keyed while its public attributes ``stale``, which its
    constructor set and no argument of its call names, hold what a build from its arguments
    does not (``built``: what one holds, else what its constructor left)."""
    kind = type(node).__qualname__
    said = ", ".join(f"`{attr}`" for attr in stale)
    one = len(stale) == 1
    arguments = declared_arguments(type(node), *node._call())
    call = ", ".join(f"{attr}={value!r}" for attr, value in arguments.items())
    holds = ", ".join(f"{built.get(attr, UNSET)!r}" for attr in stale)
    return Undeclared(
        f"`{name}` ({kind}) cannot be keyed: {said} {'was' if one else 'were'} replaced after "
        f"the node was made, from outside it, and {'is' if one else 'are'} in no key, which "
        f"holds what it was built with: a `{kind}({call})` holds {holds} there. Keyed so, it "
        "would keep answers such a node does not compute, under that node's key. Pass "
        f"{'it' if one else 'them'} to the constructor (a parameter `{stale[0]}`) and build "
        f"the node and the graph again, give `{kind}` a `declare()` that says "
        f"{'it' if one else 'them'}, or give {said} back what a build holds"
    )


Recipe = tuple[str | None, tuple[Any, ...], dict[str, Any]]


def _recipe(node: Node) -> Recipe | Unbuildable:
    """How ``node`` is built (:meth:`~somatize.node.Node.recipe`), or why it cannot be."""
    try:
        return node.recipe()
    except Unbuildable as why:
        return why


class _MadeOtherwise:
    """A node whose arguments ``taken`` were replaced or changed in place, built again from
    the arguments it had and from the new ones: :meth:`check` says why it does not hold what
    the new build holds — an attribute made from its arguments (the two builds hold it
    apart) still holding what was made from the old value, or a declaration other than the
    new build's — and None once it does (the attribute set to what the new value makes).

    An attribute that is the argument itself is not looked at: a replaced argument was
    given to the attribute of its name, and taken from there as the argument, and a list
    or a dict changed in place is the argument where the attribute holds that very object.
    An attribute of that name holding anything else (``self.items = list(items)``, a copy)
    was made from the argument, and still holds what the old value made."""

    def __init__(
        self,
        name: str,
        node: Node,
        taken: dict[str, Any],
        head: str,
        fix: str,
        old: Node,
        new: Node,
        in_place: bool,
    ) -> None:
        self.name = name
        self.node = node
        self.taken = taken
        self.in_place = in_place
        self.head = head
        self.fix = fix
        self.new = new
        self.made_with = _copied(node)
        """The call the node is keyed as built with, as it was when it was found: what its
        attributes are made from once it holds what a build from it holds."""
        was, self.fresh = dict(held_by(old)), dict(held_by(new))
        self.made = [
            a for a in sorted(was.keys() | self.fresh.keys()) if was.get(a) != self.fresh.get(a)
        ]

    def check(self) -> Undeclared | None:
        name, node, kind = self.name, self.node, type(self.node).__qualname__
        built = ", ".join(f"{attr}={value!r}" for attr, value in self.taken.items())
        now = dict(held_by(node))
        stale = [a for a in self.made if not self._is_taken(a) and now.get(a) != self.fresh.get(a)]
        if stale:
            held = ", ".join(
                f"`{attr}` (named like the argument, but not the very value it was given)"
                if attr in self.taken
                else f"`{attr}`"
                for attr in stale
            )
            return Undeclared(
                f"{self.head}, and {held}, which its constructor makes from its arguments, "
                f"still {'holds' if len(stale) == 1 else 'hold'} what was made from the old "
                f"value: a `{kind}({built})` holds another. Keyed as built with the new value, "
                f"it would keep answers such a node does not compute, under that node's key. "
                f"{self.fix}"
            )
        try:
            declared = node.declaration(name) == self.new.declaration(name)
        except SomatizeError:
            declared = True  # refused where it is keyed, for that reason
        if not declared:
            return Undeclared(
                f"{self.head}, and a `{kind}({built})` declares something else than it does "
                f"now. {self.fix}"
            )
        return None

    def _is_taken(self, attr: str) -> bool:
        """Whether ``attr`` is one of the arguments taken, not something made from one."""
        if attr not in self.taken:
            return False
        if not self.in_place:
            return True  # replaced by hand, and taken as the argument from there
        return attributes_of(self.node).get(attr, UNSET) is self.taken[attr]


_REPLACED = (
    "an argument it was built with and keeps, was",
    "arguments it was built with and keeps, were",
    "replaced after the node was made",
)
"""How :func:`_made_otherwise` says that arguments a node keeps were replaced."""

_IN_PLACE = (
    "an argument it was built with, was",
    "arguments it was built with, were",
    "changed in place since the node was made",
)
"""How :func:`_made_otherwise` says that a list or a dict a node was built with changed."""


def _made_otherwise(
    name: str,
    node: Node,
    taken: dict[str, Any],
    before: Recipe | Unbuildable,
    how: tuple[str, str, str],
) -> Undeclared | _MadeOtherwise | None:
    """Why ``node``, whose arguments ``taken`` were just replaced or changed in place (as
    ``how`` says), is not what its class builds from its arguments now; None when it is.

    A constructor may make more than the argument it keeps (``self.factor = by * 2``):
    replacing the argument then leaves what was made from the old value, and the node,
    keyed as built with the new value, would keep answers such a node does not compute
    under that node's key, where another recalls them. So the class is built again, as a
    worker builds it, from the arguments the node had (``before``, its recipe then) and
    from the new ones: an attribute the two builds hold apart is made from the
    arguments, and the node must hold what the new build holds. An attribute both builds
    hold alike (a call counter) is the node's own business. Run once per replacement: what
    it finds (a :class:`_MadeOtherwise`) is checked again at every forward, so a node given
    what the new value makes is accepted."""
    kind = type(node).__qualname__
    said = ", ".join(f"`{attr}`" for attr in taken)
    built = ", ".join(f"{attr}={value!r}" for attr, value in taken.items())
    one, many, when = how
    head = f"`{name}` ({kind}) cannot be keyed: {said}, {one if len(taken) == 1 else many} {when}"
    fix = f"Build a new `{kind}` with the new value (`{kind}({built})`) and the graph again"
    if how is _IN_PLACE:
        fix += ", or change a copy rather than what the node was built with"
    try:
        if isinstance(before, Unbuildable):
            raise before
        old = _built_again(node, before)
        new = _built_again(node, node.recipe())
    except Unbuildable as why:
        cause = why.__cause__
        reason = f"{type(cause).__name__}: {cause}" if cause is not None else str(why)
        return Undeclared(
            f"{head}, and a `{kind}` could not be built again from its arguments to check "
            f"that nothing else it holds was made from the old value ({reason}). {fix}"
        )
    found = _MadeOtherwise(name, node, taken, head, fix, old, new, how is _IN_PLACE)
    return found if found.check() is not None else None


def _built_again(node: Node, recipe: Recipe) -> Node:
    """A new node made by ``recipe`` in this process, of ``node``'s own class, as a worker
    builds one (:meth:`~somatize.catalog.Catalog.build`); Unbuildable when it cannot be."""
    maker, args, kwargs = recipe
    kind = type(node)
    catalog = Catalog(in_process=True)
    identity = node._smz.identity or identity_of(kind) or f"{kind.__module__}:{kind.__qualname__}"
    if maker is None:
        catalog.register(kind, identity)  # this very class, even one with no stable name
    return catalog.build(Blueprint(identity, tuple(args), dict(kwargs), None, maker))


def _unkeyable(name: str, node: Node, attr: str, value: Any) -> Undeclared:
    """Why ``node`` cannot be keyed once its argument ``attr`` was replaced by ``value``,
    which has no canonical form."""
    kind = type(node).__qualname__
    fix = "Replace it with a value that has a canonical form"
    numpy = sys.modules.get("numpy")  # a numpy number exists only once numpy is imported
    if numpy is not None and isinstance(value, numpy.generic):
        what = (
            f"it is a `numpy.{type(value).__name__}` ({value!r}), which computes as numpy's "
            "own type does (a float32's rounding, an int64's overflow, `~` of a bool_), not as "
            "the Python number it holds, and a key holds numbers only as Python's"
        )
        fix = "Replace it with the Python number (`float(x)`, `int(x)` or `bool(x)`)"
    else:
        what = "it has no canonical form"
        try:
            canonical.encode(value, "it")
        except canonical.NotCanonical as why:
            what = str(why).rstrip(".")
    return Undeclared(
        f"`{name}` ({kind}) cannot be keyed: `{attr}`, an argument it was built with and "
        f"keeps, was replaced after the node was made, and {what}. Its key would go on "
        f"naming the old value while it computes with the new one. {fix}, or build a new "
        f"`{kind}` with what you mean; a node that tidies its own argument keeps what it "
        "makes under another name (`self._path`)"
    )


def _declaration_now(graph: Graph, name: str, node: Node) -> str | Undeclared:
    """What ``node`` declares now, or why it cannot be declared."""
    try:
        return node.declaration(name)
    except Undeclared as why:
        return why.with_traceback(None)  # raised again where the node is keyed


def _changed_in_place(graph: Graph, name: str, node: Node, now: str) -> None:
    """Refuses ``node``, built with a list or a dict changed in place since its attributes
    were made from it (it declares ``now``), where its key is needed, when its
    constructor made more from that value than it keeps and the node still holds what the
    old value made (``self.total = sum(items)``): keyed as built with the list as it is, it
    would keep answers such a node does not compute under that node's key. A node that
    only keeps what it was built with follows it. Looked at once per declaration the node
    is found with, as a replaced argument is (:func:`_made_otherwise`), and from the
    declaration its attributes were made from (:attr:`~somatize.node.Marks.made_with`,
    noted when it was made), so a change made before the graph was built is found too; a
    node back to that value, or given what the new one makes, is followed."""
    made_with = node._smz.made_with
    if made_with is None or node.holds_state or graph._in_place.get(name) == now:
        return
    graph._in_place[name] = now
    try:
        was = node._declared_with(made_with)
    except canonical.NotCanonical:
        return
    found: Undeclared | _MadeOtherwise | None = None
    if was != now:
        changed = _changed_arguments(node, made_with)
        found = _made_otherwise(name, node, changed, (None, *made_with), _IN_PLACE)
    graph._made_stale.pop(name, None)
    refused: Undeclared | None
    if isinstance(found, _MadeOtherwise):
        graph._made_stale[name] = found
        refused = found.check()
    else:
        refused = found
    if refused is None:
        graph._unfollowed.pop(name, None)
        _made_from(node)
    else:
        graph._unfollowed[name] = refused


def _changed_arguments(
    node: Node, made_with: tuple[tuple[Any, ...], dict[str, Any]]
) -> dict[str, Any]:
    """The arguments of ``node``, by parameter name, that are other now than in
    ``made_with``, the call its attributes were made from, with what they are now."""
    kind = type(node)
    was = declared_arguments(kind, *made_with)
    now = declared_arguments(kind, *node._call())
    changed = {}
    for attr, value in now.items():
        try:
            same = attr in was and canonical.encode(was[attr]) == canonical.encode(value)
        except canonical.NotCanonical:
            same = False
        if not same:
            changed[attr] = value
    return changed


def _copied(node: Node) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call that made ``node`` as it is now, its lists and dicts copied, those left to
    their defaults too (:func:`~somatize._calls.noted_call`); None when it holds none (an
    argument that cannot change in place is not looked at)."""
    return noted_call(type(node), *node._call())


def _made_from(node: Node) -> None:
    """Notes that what ``node`` holds is made from the call it is keyed as built with."""
    node._smz.made_with = _copied(node)


def _declared_again(
    graph: Graph, name: str, node: Node, now: str | Undeclared | None = None
) -> None:
    """Tells the graph's memory what ``node`` declares now, if that changed. A node that
    cannot be declared any more (a list it was built with given an item with no canonical
    form, or an argument it keeps replaced by one: :func:`_retaken`) has its declaration
    taken back, and the graph holds why: it is refused where its
    key is needed (:func:`~somatize.plan.static_of`), and a forward without a store, or one
    that keys nothing it feeds, runs it as it is — the same as for a node undeclared when
    built."""
    memory = graph.memory
    was = memory.declaration_of(name)
    refused = graph._unfollowed.get(name) or graph._remade.get(name)
    if refused is None:
        if now is None:
            now = _declaration_now(graph, name, node)
        if isinstance(now, Undeclared):
            refused = now
    if refused is not None:
        graph._undeclared[name] = refused
        if was is not None:
            memory.undeclare(name)
        return
    assert isinstance(now, str)
    if now != was:
        graph._undeclared.pop(name, None)
        memory.declared_as(name, now)


def declared_again(memory: Memory, name: str, node: Node) -> None:
    """Tells ``memory`` what ``node``, known there as ``name``, declares now, if that
    changed."""
    was = memory.declaration_of(name)
    try:
        now = node.declaration(name)
    except Undeclared:
        if was is None:
            return  # undeclared when built, and still: refused where it is keyed
        raise
    if now != was:
        memory.declared_as(name, now)
