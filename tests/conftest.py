"""Shared fixtures: a fresh store per test, written only under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from somatize import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """An empty local store in this test's temporary directory."""
    return Store(tmp_path / "store")
