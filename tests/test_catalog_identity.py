"""Identities a catalog is asked to resolve: a malformed one is Unbuildable, never an
error of the import machinery."""

from __future__ import annotations

import pytest

from somatize import Unbuildable
from somatize.catalog import Catalog


@pytest.mark.parametrize(
    "identity",
    [":Inner", ".mod:Inner", "a..b:Inner", "mod.:Inner", "mod:", "mod:.Inner", "mod:A:B", "1a:B"],
)
def test_a_malformed_identity_is_unbuildable(identity: str) -> None:
    """An identity that is not ``module:qualname`` of dotted identifiers (an empty module,
    a relative one, an empty part) is refused as Unbuildable, naming the form."""
    with pytest.raises(Unbuildable, match=r"not of the form `module:qualname`"):
        Catalog().resolve(identity)
    with pytest.raises(Unbuildable):
        Catalog().maker(f"{identity}.make")


def test_a_well_formed_identity_still_resolves() -> None:
    """A dotted module and qualname resolve as before."""
    import json

    assert Catalog().resolve("json.decoder:JSONDecoder") is json.JSONDecoder
