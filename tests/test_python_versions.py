"""What a Python upgrade leaves alike: the code fingerprint of the same source, and the
library's reading of a value of a subclass of a builtin."""

from __future__ import annotations

import dataclasses

import pytest

from somatize.catalog import fingerprint_of
from somatize.catalog._held import _AS_MADE
from tests import versions_nodes


@pytest.mark.parametrize(
    ("name", "fingerprint"),
    [
        ("Unpacks", "sha256:8e9ac8ee237e018f"),
        ("Formats", "sha256:eedaa7701a8a8e67"),
        ("Settled", "sha256:13ee17a3fd7c5471"),
    ],
)
def test_a_fingerprint_is_the_same_under_every_python_version(name: str, fingerprint: str) -> None:
    """Pinned: Python 3.10, 3.11, 3.12 and 3.13 each give these, so a store filled under one
    recalls its answers under another as kept, not drifted. They change only with how the
    fingerprint is worked out, on purpose."""
    assert fingerprint_of(getattr(versions_nodes, name)) == fingerprint


def test_an_enum_a_node_names_has_the_same_fingerprint_under_python_3_11_to_3_13() -> None:
    """Pinned: `enum` sets a function of its own on every enum, which Python 3.12 writes
    otherwise than 3.11. It is Python's code, not the node's, so it is named by its name."""
    assert fingerprint_of(versions_nodes.Chooses) == "sha256:5acf9f78a9739d54"


def test_a_function_dataclasses_lends_a_dataclass_node_is_not_its_code() -> None:
    """Python 3.13 sets dataclasses' own function as every dataclass's `__replace__`: the
    standard library's code, which no edit of the class changes."""
    kind = dataclasses.make_dataclass(
        "Lent", [("by", int, 2)], bases=(versions_nodes.Settled,), namespace={}
    )
    kind.__module__ = versions_nodes.__name__
    before = fingerprint_of(kind)
    kind.__replace__ = dataclasses.replace  # type: ignore[attr-defined]
    assert fingerprint_of(kind) == before


class _Complex(complex):
    real = 99.0  # type: ignore[assignment]

    def __complex__(self) -> complex:
        return 5j


class _Bytes(bytes):
    def __getitem__(self, at: object) -> bytes:  # type: ignore[override]
        return b"other"

    def __bytes__(self) -> bytes:
        return b"other"


def test_a_value_of_a_subclass_of_complex_or_bytes_is_read_by_the_builtin_code() -> None:
    """What such a value is as the builtin, read with what Python 3.10 has too: not by the
    subclass's own methods."""
    complex_made = _AS_MADE[complex](_Complex(1, -2))
    bytes_made = _AS_MADE[bytes](_Bytes(b"abc"))
    assert (type(complex_made), complex_made) == (complex, 1 - 2j)
    assert (type(bytes_made), bytes_made) == (bytes, b"abc")
