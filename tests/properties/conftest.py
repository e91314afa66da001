"""Fixtures of the property tests: case strategies for the backend under test, and wrong doubles."""
from __future__ import annotations

import pytest

from properties import strategies as ps


@pytest.fixture(scope="session")
def cases_for(backend):
    """``cases_for(**narrowing)``: cases the backend under test runs (kernel-sized for a kernel
    backend: its ``supported_shapes``), narrowed to a law's domain (``group=...``, ``s1=...``,
    ``batch=...``, ``spare_blocks=...``), so that no example is vacuous for the law."""
    def strategy(**narrowing):
        return ps.cases_for(backend, **narrowing)
    return strategy


@pytest.fixture
def drop_last_tile_backend():
    """A backend that is wrong on purpose: it skips the last s2 tile (see doubles.py)."""
    from doubles import DropLastS2Tile
    return DropLastS2Tile()


@pytest.fixture
def regressions_dir(tmp_path, monkeypatch):
    """A temporary cases/regressions folder (captures of the suite's own tests must not land in git)."""
    folder = tmp_path / "regressions"
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(folder))
    return folder
