"""Parameters for tests over the mutant catalog, with the ledger's survivors (properties/rule/ledger.py, kind
"survivor") as strict xfails citing their reason: the day a law kills one, its test fails and says to
remove the entry. tests/meta/test_mutants.py (golden level) and tests/kernels/test_kernel_mutants.py (sim
level, whose ledger names start with ``sim/``) read it; importable as ``ledger_marks`` (tests/ is on
sys.path through tests/conftest.py)."""
from __future__ import annotations

from collections.abc import Iterable

import pytest

from pfa_verify.kernels.mutants import MUTANTS
from pfa_verify.properties.rule import ledger


def survivor_params(names: Iterable[str], *, prefix: str = "") -> list:
    """``names`` as pytest parameters; one the ledger names as a survivor (as ``prefix + name``) gets a
    strict xfail (raises AssertionError only: a crash is not a survival). Checks first that every ledger
    survivor names a mutant of the catalog."""
    ledger.check(mutants=MUTANTS)
    params = []
    for name in names:
        known = ledger.survivor(prefix + name)
        marks = [pytest.mark.xfail(reason=f"ledger: {known.reason}", strict=True, raises=AssertionError)] if known else []
        params.append(pytest.param(name, marks=marks))
    return params
