"""Fixtures of the property tests: the case strategy for the backend under test, and wrong doubles."""
from __future__ import annotations

import pytest

from properties import strategies as ps


def case_strategy(backend):
    """Kernel-shaped cases for kernel backends (sim, npu), the general ones otherwise."""
    if getattr(backend, "name", "") in ("sim", "npu"):
        return ps.cases(ps.kernel_configs())
    return ps.cases()


@pytest.fixture(scope="session")
def cases_for(backend):
    return case_strategy(backend)


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
