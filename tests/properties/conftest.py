"""Fixtures of the property tests: the laws' examples for the backend under test, and wrong doubles."""
from __future__ import annotations

import pytest
from doubles import DropLastS2Tile

from properties import law_examples


@pytest.fixture(scope="session")
def examples_for(backend):
    """``examples_for(law)``: the law's ``(case, params)`` examples for the backend under test
    (kernel-sized for a kernel backend: its ``supported_shapes``), properties/law_examples.py."""

    def strategy(law: str):
        return law_examples.examples(law, backend)
    return strategy


@pytest.fixture
def drop_last_tile_backend():
    """A backend that is wrong on purpose: it skips the last s2 tile (see doubles.py)."""
    return DropLastS2Tile()


@pytest.fixture
def regressions_dir(tmp_path, monkeypatch):
    """A temporary cases/regressions folder (captures of the suite's own tests must not land in git)."""
    folder = tmp_path / "regressions"
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(folder))
    return folder
