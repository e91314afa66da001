"""Every run replays the captured regressions (cases/regressions/*.json) first, on the backend under
test. Known failures come from cases/ledger.py: tolerated ones are strict xfails (one that starts
passing fails, so its entry is removed), quarantined ones are not launched."""
from __future__ import annotations

import pytest

from cases import ledger, regressions


def _params():
    out = []
    for rid in regressions.list_ids():
        out.append(pytest.param(rid, id=rid, marks=[pytest.mark.regression]))
    return out or [pytest.param(None, id="none-captured", marks=[pytest.mark.regression])]


@pytest.mark.parametrize("regression_id", _params())
def test_captured_regression(backend, regression_id, request):
    """A captured failure, replayed: its law must hold now (unless the ledger says otherwise)."""
    if regression_id is None:
        return  # nothing captured yet: nothing to replay
    known = ledger.lookup(regression_id, backend.name)
    if known is not None:
        if known.quarantined:
            pytest.skip(f"quarantined: {known.reason}")
        request.applymarker(pytest.mark.xfail(reason=known.reason, strict=True, raises=AssertionError))
    regressions.replay(regressions.load(regression_id), backend)
