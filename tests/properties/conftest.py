"""Fixtures of the property tests: wrong doubles and a temporary regressions folder (the laws' examples for
the backend under test, ``examples_for``, are the plugin's: cases/plugin/session.py)."""
from __future__ import annotations

import pytest
from doubles import DropLastS2Tile


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
