"""A law's failure is data (properties/rule/failure.py); the boundary that reports it diagnoses it once
(cases/data/diagnosed.py), issue 54: laws raise, cases/ diagnoses, for run, laws, replay and the plugin alike."""
from __future__ import annotations

import json

import pytest
from doubles import WritesToInputs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pfa_verify.cases.data import diagnosed, regressions
from pfa_verify.golden import PagedAttentionConfig
from pfa_verify.kernels.mutants import get_mutant
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.failure import LawFailure
from pfa_verify.properties.search import laws

_NAMED = "Diagnosis: causal_offset_ignored [visible length, SPEC §2.1] explains"


def _small(lengths, s1):
    config = PagedAttentionConfig(batch=len(lengths), s1=s1, s2=max(lengths), nq=2, nkv=2, head_dim=16,
                                  block_size=16, s2_tile=32, kv_act_seqs=tuple(lengths),
                                  max_blocks=-(-max(lengths) // 16), num_blocks=sum(-(-n // 16) for n in lengths))
    return Case(config, 3)


def test_a_failing_law_raises_what_the_rule_found_and_no_diagnosis():
    backend, case = get_mutant("causal_offset_ignored"), _small([40, 7], 3)
    with pytest.raises(LawFailure) as info:
        laws.run("tile_invariance", backend, case, s2_tile=16)
    failure = info.value
    assert failure.law == "tile_invariance" and failure.case is case and failure.params == {"s2_tile": 16}
    (failed,) = failure.failed
    assert not failed.judgement.passed and failed.case is not None and failed.case.config.s2_tile == 16
    assert str(failure).startswith("At s2_tile=16, g_tile=None instead of s2_tile=32") and "Diagnosis" not in str(failure)


def test_an_assertion_without_the_rule_is_a_law_failure_with_nothing_to_diagnose():
    case = Case(PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16))
    with pytest.raises(LawFailure, match=r"Input q_scale after the .* call vs before not bit-identical") as info:
        laws.run("acceptance", WritesToInputs(), case)
    assert info.value.failed == () and info.value.law == "acceptance"
    assert diagnosed.explain(info.value, WritesToInputs()).message == str(info.value)


def test_check_diagnoses_the_failure_it_reports_and_captures_it_so(regressions_dir):
    backend, case = get_mutant("causal_offset_ignored"), _small([40, 7], 3)
    with pytest.raises(AssertionError) as info:
        regressions.check("acceptance", backend, case)
    message = str(info.value)
    assert _NAMED in message and message.splitlines()[-1].startswith("Replay: pfa-verify cases")
    (record,) = regressions_dir.glob("*.json")
    assert _NAMED in json.loads(record.read_text())["message"]


def test_a_diagnosis_that_breaks_never_hides_the_failure(monkeypatch):
    backend, case = get_mutant("causal_offset_ignored"), _small([40, 7], 3)
    with pytest.raises(LawFailure) as info:
        laws.run("acceptance", backend, case)

    def broken(*args, **kwargs):
        raise RuntimeError("no models today")
    monkeypatch.setattr(diagnosed, "diagnose_verdict", broken)
    told = diagnosed.explain(info.value, backend)
    assert told.message == f"{info.value}\nDiagnosis: unavailable (RuntimeError: no models today)"
    assert told.diagnosis is None and told.named is None


def test_a_law_searched_and_shrunk_by_hypothesis_is_diagnosed_once(monkeypatch, regressions_dir):
    """Not while Hypothesis shrinks: once, on the example it reports."""
    calls = []
    real = diagnosed.diagnose_verdict
    monkeypatch.setattr(diagnosed, "diagnose_verdict", lambda *a, **k: calls.append(1) or real(*a, **k))
    backend = get_mutant("causal_offset_ignored")

    @settings(max_examples=30, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(st.lists(st.integers(1, 40), min_size=1, max_size=2), st.integers(1, 3))
    def acceptance(lengths, s1):
        regressions.check("acceptance", backend, _small(lengths, s1))

    with pytest.raises(AssertionError, match="Diagnosis: "):
        acceptance()
    assert len(calls) == 1
