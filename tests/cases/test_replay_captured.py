"""Every run replays the captured regressions first (the shipped cases/regressions/*.json, then the user's
folder: ./pfa-verify-regressions or $PFA_VERIFY_REGRESSIONS), on the backend under test, under the rule they were captured under. Known failures come from the ledger (properties/rule/ledger.py,
re-exported by cases/ledger.py; an entry naming no captured file is an error): tolerated
ones are strict xfails (one that starts passing fails, so its entry is removed); quarantined ones are
not launched, and fail the session (the case is not checked) unless --allow-quarantined, as in
``pfa-verify run`` unless --allow-skips quarantined."""
from __future__ import annotations

import pytest

from pfa_verify.cases.data import regressions
from pfa_verify.properties.rule import ledger


def _params():
    ids = regressions.replayed_ids()
    ledger.check(regression_ids=ids, where=f"{regressions.directory()} or the shipped captures ({regressions.SHIPPED})")
    out = []
    for rid in ids:
        out.append(pytest.param(rid, id=rid, marks=[pytest.mark.regression]))
    return out or [pytest.param(None, id="none-captured", marks=[pytest.mark.regression])]


@pytest.mark.parametrize("regression_id", _params())
def test_captured_regression(backend, regression_id, request):
    """A captured failure, replayed: its law must hold now (unless the ledger says otherwise)."""
    if regression_id is None:   # not a pass: nothing was replayed, and the skip summary says so
        pytest.skip(f"no captured regressions in {regressions.directory()}: nothing to replay")
    reg = regressions.load(regression_id)
    case = reg.to_case()
    known = ledger.lookup(regression_id, backend.name, config=getattr(case, "config", None))
    if known is not None:
        if known.quarantined:
            message = f"quarantined, not checked: {known.reason}"
            if request.config.getoption("--allow-quarantined"):
                pytest.skip(message)
            pytest.fail(message + " (--allow-quarantined skips it)", pytrace=False)
        request.applymarker(pytest.mark.xfail(reason=known.reason, strict=True, raises=AssertionError))
    skip = backend.skip_reason(case.config) if reg.case.get("kind") == "paged" and hasattr(backend, "skip_reason") else None
    if skip is not None:   # the same decision as `pfa-verify run`, shown in the skip summary
        pytest.skip(f"{skip.kind}: {skip.reason}")
    regressions.replay(reg, backend)
