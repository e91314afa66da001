"""cases/measuring/tightness.py: the envelope's widening per distribution, held to the recorded shares.

A share that grows fails (the envelope got looser, or the cases changed); a share that shrinks is an
improvement: record it (``pfa-verify tightness --record``) so that the next change is held to it.
"""
from __future__ import annotations

import pytest

from pfa_verify.cases.measuring import tightness

RECORDED = tightness.recorded()


@pytest.mark.parametrize("distribution", sorted(RECORDED["distributions"]))
def test_widening_does_not_grow(distribution):
    want = RECORDED["distributions"][distribution]
    got = tightness.measure(distribution, count=RECORDED["cases"], seed=RECORDED["seed"])
    assert got.cases == RECORDED["cases"]
    for field in ("flippable_share", "widened_share", "p99", "largest"):
        value = getattr(got, field)
        assert value <= want[field] * (1 + 1e-9) + 1e-12, (
            f"{distribution}: {field} grew from the recorded {want[field]:.6g} to {value:.6g}")
