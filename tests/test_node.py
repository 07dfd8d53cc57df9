"""Nodes: declarations captured from the constructor, and chaining."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from somatize import Expr, Graph, Node, Store, Undeclared
from somatize.node import AlreadyBuilt
from tests.nodes import Echo, Largest, Rows, Scale


class Holder(Node):
    """Takes something with no canonical form."""

    def __init__(self, thing: object, size: int = 3) -> None:
        self.thing = thing
        self.size = size

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


class Declared(Holder):
    """Says what distinguishes it, so it can be keyed."""

    def declare(self) -> Any:
        return {"size": self.size}


def test_declaration_from_constructor_arguments() -> None:
    """Arguments, defaults filled in, decide the declaration; how they were passed does not."""
    assert Scale(2.0).declaration() == Scale(by=2.0).declaration()
    assert Scale().declaration() == Scale(2.0).declaration()
    assert Scale(2.0).declaration() != Scale(3.0).declaration()
    assert Scale(2.0).declaration() != Scale(2).declaration()


def test_mutable_attributes_are_not_declared() -> None:
    """What __init__ sets on self (a call counter) is not part of the declaration."""
    one, two = Rows(), Rows()
    two.calls = 99
    assert one.declaration() == two.declaration()


def test_non_canonical_argument_refused_with_advice() -> None:
    """A node built with a non-canonical argument must say declare(); the error says so."""
    with pytest.raises(Undeclared, match=r"`holder` \(Holder\).*declare\(self\)"):
        Holder(object()).named("holder").declaration()
    assert Declared(object()).declaration() == Declared(object(), 3).declaration()


def test_declarations_chain() -> None:
    """named/frozen/cached/mapped/at return the node and record what was said."""
    node = Echo().named("e").frozen().cached("s1").mapped().at("w1")
    marks = node._smz
    assert isinstance(node, Echo)
    assert (marks.name, marks.frozen, marks.cached, marks.salt, marks.mapped, marks.worker) == (
        "e",
        True,
        True,
        "s1",
        True,
        "w1",
    )


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda n: n.named(""), ValueError),
        (lambda n: n.named("a\nb"), ValueError),
        (lambda n: n.cached(salt=3), TypeError),
        (lambda n: n.at(""), ValueError),
        (lambda n: n.identified("noColon"), ValueError),
    ],
)
def test_bad_declarations_refused(call: Any, error: type[Exception]) -> None:
    """Malformed names, salts and workers are refused at once."""
    with pytest.raises(error):
        call(Echo())


@pytest.mark.parametrize(
    "name", ["scale\0v2", "a\x1bb", "tab\there", "del\x7f", "c1\x85", "a\u2028b", "p\u2029q"]
)
def test_a_name_with_a_control_character_is_refused_saying_so(name: str) -> None:
    """A node name holding a control character (NUL, an escape, a tab…) is refused when it
    is said, naming what a name may hold, rather than accepted and misread later; a name
    with spaces or letters of any script is a name."""
    with pytest.raises(ValueError, match=r"a node name is a non-empty str with no control "):
        Echo().named(name)
    for fine in ("scale v2", "échelle·2", "名前"):
        assert Echo().named(fine)._smz.name == fine


@pytest.mark.parametrize(
    "worker", ["w1]\n  fake  Forged", "\x1b[2J", "w\t1", "w\x00", "w1]\u2028  fake  Forged"]
)
def test_a_worker_name_with_a_control_character_is_refused_saying_so(worker: str) -> None:
    """A worker name, shown beside the node's name in `print(g)`, facts and figures, holds
    no control character either: a line break in it would forge a line of `print(g)`."""
    with pytest.raises(ValueError, match=r"a worker is named by a non-empty str with no control"):
        Echo().at(worker)
    assert Echo().at("gpu 0·名前")._smz.worker == "gpu 0·名前"


def test_chain_fan_out_and_fan_in() -> None:
    """`>>` chains, a tuple after `>>` fans out, a tuple before it fans in, in order."""
    rows, a, b, add = Rows(), Scale(1.0), Scale(2.0), Largest()
    expr = rows >> (a, b)
    assert [n for n in expr.outputs] == [a, b]
    joined = expr >> add
    assert (a, add) in joined.edges and (b, add) in joined.edges
    assert joined.edges.index((a, add)) < joined.edges.index((b, add))
    assert isinstance((a, b) >> add, Expr)


def test_expression_of_something_else_is_refused() -> None:
    """Only nodes, expressions and tuples of them build a graph."""
    with pytest.raises(TypeError, match="built from nodes"):
        Rows() >> 3  # type: ignore[operator]
    with pytest.raises(TypeError, match="built from nodes"):
        Graph.somatize(())


def test_forward_must_be_written() -> None:
    """A node without forward says so when it runs."""

    class Bare(Node):
        pass

    with pytest.raises(Exception, match="no forward"):
        Graph.somatize(Bare()).forward(1)


def test_repr_names_the_node() -> None:
    """A node's repr shows its class and name."""
    assert repr(Largest().named("top")) == "<Largest 'top'>"


def test_declarations_after_build_are_refused() -> None:
    """Saying something new about a node already in a graph is refused, naming what and
    what to do; saying again what was said is not."""
    node = Scale(2.0).named("scale").frozen().cached("v1")
    Graph.somatize(Rows().frozen() >> node)
    node.frozen().cached("v1").named("scale")
    with pytest.raises(AlreadyBuilt, match=r"`scale` \(Scale\) is already in a graph.*salt='v2'"):
        node.cached(salt="v2")
    for say in (lambda: node.named("other"), lambda: node.mapped(), lambda: node.at("w1")):
        with pytest.raises(AlreadyBuilt, match="build the graph again from a new `Scale`"):
            say()
    assert node._smz.salt == "v1" and node._smz.name == "scale"


@pytest.mark.parametrize("copied", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copy_of_a_node_has_what_was_said_about_it_as_its_own(copied: Any) -> None:
    """A copy of a node starts with what was said about the original, and what is said to
    it afterwards is its own: the original keeps its name and is not cached. A copy of a
    node already in a graph is in none, and joins a new one as a node just made would."""
    node = Scale(2.0).named("a").frozen()
    copied(node).named("early").cached()
    assert node._smz.name == "a" and not node._smz.cached
    Graph.somatize(Rows().frozen() >> node)
    twin = copied(node)
    assert (twin._smz.name, twin._smz.frozen, twin.by) == ("a", True, 2.0)
    twin.named("b").cached()
    assert node._smz.name == "a" and not node._smz.cached
    g = Graph.somatize(Rows().named("rows").frozen() >> (node, twin))
    assert g.nodes() == ("rows", "a", "b") and g.memory.is_cached("b")
    assert not g.memory.is_cached("a")
    for built in (node, twin):
        with pytest.raises(AlreadyBuilt, match="is already in a graph"):
            built.cached(salt="v2")


def test_a_copied_graph_holds_its_copied_nodes_as_built() -> None:
    """The nodes of a copied graph are in that graph, which took what was said about them:
    they refuse to be told anything new, as the original graph's do."""
    g = Graph.somatize(Rows().named("rows").frozen() >> Scale(2.0).named("scale").frozen())
    for again in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        with pytest.raises(AlreadyBuilt, match=r"`scale` \(Scale\) is already in a graph"):
            again.node("scale").cached()
        assert again.forward({"at": 0, "take": 2}) == [0.0, 2.0]


def test_declaration_is_fixed_unless_built_with_something_changeable() -> None:
    """Immutable constructor arguments give a fixed declaration; a list or a dict does not;
    a node's own declare() is taken at its word."""
    assert Scale(2.0).is_declaration_fixed()
    assert Scale(by=(1.0, "a", None)).is_declaration_fixed()  # type: ignore[arg-type]
    assert not Scale([1.0]).is_declaration_fixed()  # type: ignore[arg-type]
    assert not Scale(by={"a": 1}).is_declaration_fixed()  # type: ignore[arg-type]
    assert Declared([1.0]).is_declaration_fixed()


class Unnamed(Node):
    """Names no ``self``: its constructor takes ``*args``, ``self`` the first of them."""

    def __init__(*args: Any) -> None:
        self, k = args
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        return int(x * self.k)


def test_a_constructor_that_names_no_self_is_declared_by_every_argument_passed(
    tmp_path: Any,
) -> None:
    """``__init__(*args)`` is handed ``self`` as the first of its ``*args``: what is
    declared is the rest, all of it, so two nodes built with other arguments are keyed
    apart (the answer of one is not recalled for the other), and one built with a list is
    followed as it changes."""
    assert Unnamed(1).declare() == {"*args": (1,)}
    assert Unnamed(1).declaration() != Unnamed(5).declaration()
    assert Unnamed(5).declaration() == Unnamed(5).declaration()
    assert Unnamed(5).is_declaration_fixed()
    assert not Unnamed([5]).is_declaration_fixed()
    store = Store(tmp_path / "store")
    for k in (1, 5):
        g = Graph.somatize(Unnamed(k).named("unnamed").frozen().cached())
        assert g.forward(10, store=store) == 10 * k
        assert g.record is not None and g.record.outcome == {"unnamed": "ran"}


class Registered(Node):
    """Defines its own ``__new__``, which hands ``Node.__new__`` none of the arguments."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Registered:
        return super().__new__(cls)  # type: ignore[return-value]

    def __init__(self, k: int = 1) -> None:
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.k


class PassesOn(Node):
    """Defines its own ``__new__``, which passes on what it is handed."""

    def __new__(cls, *args: Any, **kwargs: Any) -> PassesOn:
        return super().__new__(cls, *args, **kwargs)  # type: ignore[return-value]

    def __init__(self, k: int = 1) -> None:
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.k


class Said(Registered):
    """Defines its own ``__new__`` below, and says what distinguishes it."""

    def declare(self) -> Any:
        return {"k": self.k}


def test_a_node_whose_class_defines_its_own_new_is_undeclared_until_it_says_declare(
    tmp_path: Any,
) -> None:
    """A class that defines its own ``__new__`` hands ``Node.__new__``, which notes the call
    a node is made with, what it will (nothing, for ``super().__new__(cls)``), and nothing
    tells whether it passes on the call as made: such a node is undeclared, so two built
    with different arguments never share a key. It runs without a store, is refused where
    it is keyed, and is not rebuilt from the call on another process; with a ``declare()``
    of its own it is keyed."""
    from somatize.catalog import Unbuildable, blueprint_of

    for made in (Registered(k=5), Registered(5), PassesOn(k=5)):
        with pytest.raises(Undeclared, match=r"defines its own `__new__`.* Passing `\*args, "
                           r"\*\*kwargs` on .* is not enough.* `declare\(self\)`"):  # fmt: skip
            made.declaration()
        assert made.is_declaration_fixed() and made.kept_arguments() == []
        with pytest.raises(Unbuildable, match=r"defines its own `__new__`.*`recipe\(self\)`"):
            blueprint_of(made)
    g = Graph.somatize(Registered(k=5).named("registered").frozen().cached())
    assert g.forward(10) == 50
    with pytest.raises(Undeclared, match=r"`registered` \(Registered\) cannot be keyed: "
                       r"`Registered` defines its own `__new__`"):  # fmt: skip
        g.forward(10, store=Store(tmp_path / "store"))
    assert Said(k=5).declaration() != Said(k=1).declaration()


class Dropping(type):
    """Hands ``__new__`` none of the arguments it hands ``__init__``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        made = cls.__new__(cls)
        made.__init__(*args, **kwargs)
        return made


class Metaed(Node, metaclass=Dropping):
    """Made through a metaclass that hands ``Node.__new__`` another call."""

    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.k


class Keeps:
    """A mixin whose constructor keeps ``k``: not a node's own constructor."""

    def __init__(self, k: int) -> None:
        self.k = k


class MixedIn(Keeps, Node, metaclass=Dropping):
    """Made through a metaclass that hands ``Node.__new__`` another call, by a mixin's
    constructor."""

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.k


def test_a_call_that_does_not_fit_the_constructor_is_undeclared_not_a_bare_type_error() -> None:
    """A node is declared by the call its own constructor is handed, whatever its metaclass
    handed ``Node.__new__``. One whose constructor is a mixin's, noted as made with a call
    that constructor does not take, is undeclared, saying so, rather than failing with the
    ``TypeError`` of binding the call; a graph built with it runs it without a store."""
    assert Metaed(3).declaration() == Metaed(k=3).declaration() != Metaed(4).declaration()
    with pytest.raises(Undeclared, match=r"`mixed` \(MixedIn\) cannot be keyed: the call it is "
                       r"noted as made with, `MixedIn\(\)`, does not fit its constructor, "
                       r"`__init__\(self, k: 'int'\) -> 'None'` \(missing a required "
                       r"argument: 'k'\)"):  # fmt: skip
        MixedIn(3).named("mixed").declaration()
    assert Graph.somatize(MixedIn(3).named("mixed").frozen().cached()).forward(2) == 6


class Base(Node):
    """Keeps ``k``."""

    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.k


class Fronted:
    """A mixin whose constructor takes two arguments and hands the next one of them."""

    def __init__(self, k: int, extra: int) -> None:
        super().__init__(k)  # type: ignore[call-arg]
        self.extra = extra


class FrontedBase(Fronted, Base):
    """A node made by a mixin's constructor, which calls a node class's constructor."""


class Shrunk(Base):
    """Its own constructor hands the one it inherits another argument."""

    def __init__(self, k: int, by: int = 2) -> None:
        super().__init__(k * by)


def test_a_constructor_called_through_super_leaves_the_call_a_node_was_made_with() -> None:
    """What a node class's constructor notes of the call and of what the node holds, it
    notes only as the node's own constructor: called from a subclass's or a mixin's
    through ``super().__init__``, with other arguments, it leaves the call as made."""
    Base(1)  # its constructor is the one that notes, from here on, for a Base
    assert FrontedBase(3, 4).declaration() != FrontedBase(3, 5).declaration()
    assert Shrunk(3, by=2).declaration() != Shrunk(3, by=3).declaration()
    assert Shrunk(3, by=2).declaration() != Shrunk(6, by=1).declaration()


@dataclass
class Tagged(Node):
    """A dataclass node: its list of tags is made by a ``default_factory``."""

    tags: list[str] = field(default_factory=list)
    scale: int = 2

    def forward(self, x: int, ctx: Any) -> int:
        return x * self.scale + len(self.tags)


def test_a_dataclass_field_left_to_its_default_factory_is_declared_as_what_it_made() -> None:
    """A dataclass field left to its ``default_factory`` is declared as the value the
    factory made for the node, as if it had been passed: ``Tagged()`` and
    ``Tagged(tags=[])`` key alike, apart from ``Tagged(["a"])``, and the declaration is not
    fixed, since the list the node holds can change in place."""
    assert Tagged().declaration() == Tagged(tags=[]).declaration() == Tagged([], 2).declaration()
    assert Tagged().declaration() != Tagged(["a"]).declaration()
    assert Tagged().declaration() != Tagged(scale=3).declaration()
    assert not Tagged().is_declaration_fixed()


def test_a_list_a_dataclass_field_made_by_its_default_factory_is_followed_as_it_changes(
    store: Store,
) -> None:
    """The list a ``default_factory`` made for a dataclass node, changed in place, is
    followed as a list the caller passed is: no answer kept before the change is recalled
    after it, a node built with the changed list recalls the one kept for it, and a copy
    rebuilt elsewhere is built with it."""
    tagged = Tagged()
    g = Graph.somatize(tagged.named("tagged").frozen().cached())
    assert g.forward(1, store=store) == 2
    tagged.tags.append("a")
    assert g.forward(1, store=store) == 3
    assert g.record is not None and g.record.outcome == {"tagged": "ran"}
    fresh = Graph.somatize(Tagged(["a"]).named("fresh").frozen().cached())
    assert fresh.forward(1, store=store) == 3
    assert fresh.record is not None and fresh.record.outcome == {"fresh": "recalled"}
    _, args, kwargs = tagged.recipe()
    assert Tagged(*args, **kwargs) == Tagged(["a"])


made_by_factory: list[list[str]] = []


def _counted() -> list[str]:
    made_by_factory.append([])
    return made_by_factory[-1]


@dataclass
class Counted(Node):
    """A dataclass node whose ``default_factory`` notes each list it makes."""

    tags: list[str] = field(default_factory=_counted)

    def forward(self, x: int, ctx: Any) -> int:
        return x + len(self.tags)


@dataclass
class Prefixed(Node):
    """A dataclass node whose ``__post_init__`` puts a column before those it is given."""

    columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.columns = ["id", *self.columns]

    def forward(self, x: int, ctx: Any) -> int:
        return x * len(self.columns)


def test_a_default_factory_runs_once_per_node_and_is_not_kept_twice() -> None:
    """Making and keying a dataclass node calls its ``default_factory`` once, as the
    dataclass does (it ran twice: a factory drawing at random drew twice, one building a
    module kept a second one alive)."""
    made_by_factory.clear()
    node = Counted()
    node.declaration()
    Graph.somatize(node.named("n"))
    assert len(made_by_factory) == 1 and node.tags is made_by_factory[0]


def test_a_default_factory_field_a_post_init_changes_is_refused_not_keyed_as_passed(
    store: Store,
) -> None:
    """A field left to its ``default_factory`` in a class whose ``__post_init__`` changes
    it is refused, saying to pass it: taken as passed, ``Prefixed()`` (columns ``id``) keyed
    as ``Prefixed(["id"])`` (columns ``id, id``), and the second recalled the first's
    answer. Passed, it is keyed by what was passed."""
    with pytest.raises(Undeclared, match=r"leaves `columns` to its `default_factory`"):
        Graph.somatize(Prefixed().named("n").frozen().cached()).forward(3, store=store)
    assert (
        Graph.somatize(Prefixed(["id"]).named("n").frozen().cached()).forward(3, store=store) == 6
    )


class Labelled(Declared):
    """Takes an argument of its own, and inherits a declare() that does not say it."""

    def __init__(self, thing: object, size: int = 3, label: str = "") -> None:
        super().__init__(thing, size)
        self.label = label


class Resized(Declared):
    """Its own constructor, with the same parameters as the class it inherits declare() from."""

    def __init__(self, thing: object, size: int = 3) -> None:
        super().__init__(thing, size * 1)


class Small(Declared):
    """Fixes the one argument of the class it inherits declare() from: nothing unsaid."""

    def __init__(self, thing: object) -> None:
        super().__init__(thing, 1)


class Passing(Declared):
    """Passes whatever it is given through: nothing unsaid."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0


class Keeping(Declared):
    """Takes an argument of its own through ``**kwargs`` and passes the rest on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.label = kwargs.pop("label", "")
        super().__init__(*args, **kwargs)


class Trailing(Declared):
    """Keeps positional arguments past the ones it passes on."""

    def __init__(self, thing: object, *more: int) -> None:
        self.more = more
        super().__init__(thing)


class Told(Labelled):
    """Adds its own argument to the declaration it inherits."""

    def declare(self) -> Any:
        return {**super().declare(), "label": self.label}


def test_a_subclass_with_arguments_its_inherited_declare_may_not_say_is_refused(
    store: Store,
) -> None:
    """A subclass that takes constructor arguments of its own and inherits declare() cannot be
    keyed, saying why and what to add; one that takes the same parameters can, and one that
    adds its arguments to super().declare() keys them apart."""
    with pytest.raises(Undeclared, match=r"`Labelled` takes constructor arguments of its own "
                       r"\(`label`\) and inherits `declare\(\)` from `Declared`.*could then not "
                       r"be told apart.*super\(\)\.declare\(\).*.label.: self\.label"):  # fmt: skip
        Labelled(object(), label="a").declaration()
    g = Graph.somatize(Rows().frozen() >> Labelled(object()).named("odd").frozen().cached())
    with pytest.raises(Undeclared, match=r"`odd` \(Labelled\) cannot be keyed"):
        g.forward({"at": 0, "take": 2}, store=store)
    assert Resized(object()).declaration() == Declared(object()).declaration()
    assert Small(object()).declaration() == Declared(object(), 1).declaration()
    assert Passing(object(), size=5).declaration() == Declared(object(), 5).declaration()
    with pytest.raises(Undeclared, match=r"`Keeping` takes constructor arguments of its own "
                       r"\(`label`\)"):  # fmt: skip
        Keeping(object(), label="a").declaration()
    with pytest.raises(Undeclared, match=r"\(`3 positional arguments`\)"):
        Trailing(object(), 1, 2).declaration()
    assert Trailing(object()).declaration() == Declared(object()).declaration()
    assert Keeping(object(), size=2).declaration() == Declared(object(), 2).declaration()
    assert Told(object(), label="a").declaration() != Told(object(), label="b").declaration()


class Standing(Node):
    """Stands for another class, whose code computes its answers."""

    def implementing_class(self) -> type:
        return Largest

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


def test_fingerprint_follows_the_implementing_class() -> None:
    """The code fingerprint a graph notes for a node is that of the class implementing it."""
    from somatize.catalog import fingerprint_of

    assert Scale().implementing_class() is Scale
    g = Graph.somatize(Standing().named("s"))
    assert g.memory.fingerprint_of("s") == fingerprint_of(Largest) != fingerprint_of(Standing)


def test_a_class_defined_again_under_its_name_is_fingerprinted_by_its_own_code() -> None:
    """A class defined again under the name of one in a file (a notebook cell edited and
    run with ``exec``) is not fingerprinted by the first definition's source, which is
    what looking its source up by name finds: its code is another."""
    from somatize.catalog import fingerprint_of

    again: dict[str, Any] = {"__name__": Largest.__module__}
    exec(
        "class Largest:\n    def forward(self, values, ctx):\n        return min(values)\n",
        again,
    )
    assert again["Largest"].__qualname__ == Largest.__qualname__
    assert fingerprint_of(again["Largest"]) != fingerprint_of(Largest)


def _adder(k: int) -> type[Node]:
    """A class made at run time, its forward closing over ``k``."""
    return type("Adder", (Node,), {"forward": lambda self, x, ctx: x + k})


def _forward_plus_k(self: Any, x: Any, ctx: Any) -> Any:
    return x + self.k


def _holding(k: int) -> type[Node]:
    """A class made at run time, holding ``k`` as a class attribute its forward reads."""
    return type("Holding", (Node,), {"k": k, "forward": _forward_plus_k})


def test_a_class_made_in_a_function_has_no_identity(tmp_path: Any) -> None:
    """``type(...)`` in a function makes another class at every call under one name, out
    of values in no key (what its methods close over, what the class holds): a class its
    module does not hold under its name has none, and such a node is refused as nameless
    when it would be kept, rather than keyed alike."""
    from somatize import Nameless
    from somatize.catalog import identity_of

    adder = _adder(1)
    assert identity_of(adder) is None and identity_of(_adder(100)) is None
    assert identity_of(_holding(1)) is None
    holding = Graph.somatize(_holding(1)().named("add").frozen().cached())
    with pytest.raises(Nameless, match="`add`"):
        holding.forward(10, store=str(tmp_path))
    assert identity_of(Scale) is not None  # methods using super() close over __class__ only
    g = Graph.somatize(adder().named("add").frozen().cached())
    assert g.forward(5) == 6
    with pytest.raises(Nameless, match="`add`"):
        g.forward(5, store=str(tmp_path))


def test_a_class_its_module_holds_keeps_its_name_when_a_closure_is_patched_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A method patched into a class its module holds (a test's counter, a library's
    wrapper) leaves the class its name."""
    from somatize.catalog import identity_of

    calls: list[Any] = []
    plain = Echo.forward

    def counted(self: Echo, x: Any, ctx: Any) -> Any:
        calls.append(x)
        return plain(self, x, ctx)

    monkeypatch.setattr(Echo, "forward", counted)
    assert identity_of(Echo) == f"{Echo.__module__}:Echo"
