"""The catalog: who executes a node.

An identity is the name of what implements a node — ``module:qualname`` of its
class — so that any process can rebuild the node from ``(identity,
declaration)``: import the class, construct it with the declared arguments. A
class with no stable name (one made inside a function, a lambda) has no
identity unless it is given one, and what cannot be rebuilt says so.

What crosses to another process is a :class:`Blueprint`: the identity, the
constructor call that made the node (its arguments exactly as passed, which must
be canonical) and the digest of its declaration. The call is shipped rather than
the declaration because a node may write its own ``declare()``, which says what
decides its answers, not how to build it. The declaration's digest travels
beside the call so the rebuilt node is checked against the original: a worker
whose code or arguments differ refuses instead of answering under somebody
else's key. A class defined in ``__main__`` can be imported only by the process
that defined it, so it is rebuilt only where it is registered.

A node that stands for another class — a torch node stands for its module's
class, which is its identity — names a **maker** too: a classmethod of a node
class (``module:Class.method``) that is handed the class the identity names and
the arguments, and returns the node. :meth:`~somatize.node.Node.recipe` says how
a node is rebuilt, and refuses, saying what to do, for one that cannot be.

A blueprint also carries what the node holds in its public attributes when it is
sent (:attr:`Blueprint.held`): a copy rebuilt from the call that holds other values
there (a setting given after the node was made) would answer otherwise, and is
refused (:func:`check_held`).

A node that holds state (weights) is rebuilt by its constructor and then handed
its state, when it can hand it over (:func:`state_crosses`); the broker
(:mod:`somatize.broker.host`) carries the state and checks its digest, and compares
what the copy holds once that state is loaded — its state may be held in public
attributes too, which only the state makes equal.

The code fingerprint lives here too, since it is a fact about the
implementation (:func:`fingerprint_of`). It is metadata, never part of a key. It
covers the class and every class it inherits from, short of the library's (``Node``,
the standard library's, torch's — a torch upgrade does not make every answer
drifted; another package's classes count, so its upgrade does), and for a torch node
the classes of its module's submodules too. Each class is read as it was loaded, not
as its file reads now: each of its functions by its source where the file, compiled
now, still makes the code that runs (which keeps a fingerprint the same across Python
versions), else by that code (a class typed into an interpreter, a file edited since
it was imported), digested alike in every process; with its plain values (numbers,
strings, tuples of them), the functions' defaults and what they close over (a plain value,
a function by how it is written). Any other object a function closes over, and a
callable a class holds that is no plain function (a callable object, a mock) or that its
code reads (``setting = Setting(2)``: :func:`_runner`; a class it holds, ``make = Double``,
by its name and how it is written), or any
object it holds, or a function closes over, in a dict, list, tuple or set
(``acts = {"a": Scale(2)}``, read as deep and
as far as such an object is, :func:`_contained_bytes`), is named
by its class and what it holds where all it holds is named so in turn (:func:`_held_bytes`:
the same in every process making it alike; a lock it holds by its type, a logger by its
name, :func:`_library_bytes`), else by a mark of that very object, the
same for no other object in any process (:func:`_token_of`): a replacement, or the
object changed in place, is never taken for the old code. Its functions' code is followed
into their module, one module only: the plain functions defined there that they
name (and those these name, close over — what a decorator wraps — or take by default) and
the plain constants, the objects of helper classes of its package (by their class's code
and what they hold) and their methods bound to them (``SCALE = SCALER.scale``), and its
tables as its text writes them — watched where the code only reads them and they hold only
plain values, or plain functions besides, named by how they are written (a change in place
after a graph was built is seen), its arrays and tensors by their values, and the objects
of the library's or of another package's classes it holds (``DTYPE = torch.float32``: as
its text makes them, else by what says them, :func:`_library_bytes`). A method, or a helper,
wrapped by a decorator of its package is read with the wrapper that runs around it (a
function, or an object's ``__call__``), by the wrapper's own code. A module or class from
elsewhere, a module-level table the code fills or that holds other objects, a callable that
is not a plain function and says it wraps none, a value the code reads from an object are
not seen.
A class's body is watched by a graph at every forward (:func:`watch_code`): a method set
on it after the graph was built (a monkeypatch), a method given other code or defaults
in place (``f.__code__ = ...``, as a reloader does), or the class given other bases is
that node's code from then on.

The parts live in private modules, one per part of naming a node, each importing only
those listed before it (where one needs a later one, the function that does imports it):

- :mod:`~somatize.catalog._rebuild`: identities, the :class:`Catalog` and blueprints;
- :mod:`~somatize.catalog._members`: what a class attribute is, read plainly;
- :mod:`~somatize.catalog._code`: a function's source and compiled code, and what a
  module's text assigns and imports;
- :mod:`~somatize.catalog._bytecode`: what a function's instructions change in place;
- :mod:`~somatize.catalog._marks`: an object marked by which object it is;
- :mod:`~somatize.catalog._held`: an object named by what it holds;
- :mod:`~somatize.catalog._functions`: a function named by how it is written;
- :mod:`~somatize.catalog._marked`: what a watch notes of a marked object;
- :mod:`~somatize.catalog._names`: what a node's functions name in their module;
- :mod:`~somatize.catalog._fingerprint`: :func:`fingerprint_of`;
- :mod:`~somatize.catalog._watch`: :func:`watch_code` and what a graph looks at each forward.
"""

from somatize.catalog._bytecode import globals_read
from somatize.catalog._code import code_digest
from somatize.catalog._fingerprint import fingerprint_of
from somatize.catalog._rebuild import (
    Blueprint,
    Catalog,
    Unbuildable,
    blueprint_of,
    check_held,
    defined_again,
    held_at,
    identity_of,
    nameless_because,
    state_crosses,
)
from somatize.catalog._watch import CodeWatch as CodeWatch  # a watch's type, not in __all__
from somatize.catalog._watch import Mark as Mark  # what a watch notes, not in __all__
from somatize.catalog._watch import (
    code_changes,
    marks_moved,
    names_rebound,
    objects_read,
    own_state,
    state_taken,
    watch_code,
    watched_again,
)

__all__ = [
    "Blueprint",
    "Catalog",
    "Unbuildable",
    "blueprint_of",
    "check_held",
    "code_changes",
    "code_digest",
    "defined_again",
    "fingerprint_of",
    "globals_read",
    "held_at",
    "identity_of",
    "marks_moved",
    "nameless_because",
    "names_rebound",
    "objects_read",
    "own_state",
    "state_crosses",
    "state_taken",
    "watch_code",
    "watched_again",
]
