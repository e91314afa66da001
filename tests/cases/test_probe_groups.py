"""cases/running/shrink.py probe_groups: a catalog failure group is probed once, on its smallest member, and
a member's name that does not explain that smallest case is refuted by it (one bug, one group)."""
from __future__ import annotations

import dataclasses
import types

import pfa_verify.cases.running.shrink as shrink
from pfa_verify.properties.diagnosis.diagnosis import Diagnosis
from pfa_verify.properties.diagnosis.scoring import Candidate


def _candidate(model: str, stage: str, explained: int, mismatched: int = 10) -> Candidate:
    return Candidate(model, stage, model, explained, mismatched, broken=0, matching=10)


@dataclasses.dataclass(frozen=True)
class _Verdict:
    diagnosis: Diagnosis


def _member(name: str, size: int, *candidates: Candidate):
    config = types.SimpleNamespace(estimated_bytes=lambda: size)
    item = types.SimpleNamespace(name=name, source="catalog", case=types.SimpleNamespace(config=config))
    verdict = _Verdict(Diagnosis(tuple(candidates), len(candidates), len(candidates), 0.1, 7.0))
    return item, verdict


def _grouped(monkeypatch, smallest_candidates):
    """Two members of one group: the larger names 'slip' (it explains every mismatch there); the smallest is
    scored as ``smallest_candidates`` say. The probes themselves run no neighbour here."""
    monkeypatch.setattr(shrink, "signature", lambda verdict: ("kernel logic", "everywhere"))
    monkeypatch.setattr(shrink, "probe", lambda diagnosis, case, backend, stop=None: diagnosis.with_probes((), "no probe"))
    large = _member("large", 100, _candidate("slip", "online update", 10), _candidate("other", "output", 2))
    small = _member("small", 1, *smallest_candidates)
    items, results = [large[0], small[0]], [large[1], small[1]]
    return shrink.probe_groups(object(), items, results)[0].diagnosis


def test_a_name_the_groups_smallest_case_does_not_bear_out_is_refuted(monkeypatch):
    found = _grouped(monkeypatch, [_candidate("other", "output", 3), _candidate("slip", "online update", 4)])
    assert found.identified is None and "slip" in found.refuted
    assert "the same failure on small (this run's case): fails, refutes slip" in found.render()


def test_a_name_the_groups_smallest_case_bears_out_stands(monkeypatch):
    found = _grouped(monkeypatch, [_candidate("slip", "online update", 10)])
    assert found.identified is not None and found.identified.model == "slip" and not found.refuted


def test_a_name_not_scored_on_the_smallest_case_is_not_refuted_by_it(monkeypatch):
    """A model that does not apply to the smallest case (or was cut by its budget) is no evidence either way."""
    found = _grouped(monkeypatch, [_candidate("other", "output", 1)])
    assert found.identified is not None and found.identified.model == "slip"
