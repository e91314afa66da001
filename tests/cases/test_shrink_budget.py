"""Shrinking against an expensive backend is bounded by a count and reproducible (issue 28): a backend's
``shrink_calls`` caps the law calls after a law's first failure (tests/conftest.py, check_law), so the
same derandomized test shrinks to the same example in two runs, within that many extra calls."""
from __future__ import annotations

import re

from hypothesis import strategies as st

from pfa_verify.cases.running.shrink import hunt
from pfa_verify.kernels.backends.contract import DEFAULT_SHRINK_CALLS, shrink_budget
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.properties.diagnosis.probes import MAX_CALLS

LAW_TEST = '''
from hypothesis import given, settings, strategies as st
from pfa_verify.properties.search import strategies as ps


@settings(max_examples=30, derandomize=True, database=None, deadline=None)
@given(case=ps.cases_for(None, batch=st.integers(1, 4), distribution=("uniform",)))
def test_acceptance(check_law, case):
    check_law("acceptance", case)
'''


def _run(suite_pytester, monkeypatch, tmp_path, tag: str) -> tuple[str, list[int], int]:
    calls = tmp_path / f"calls-{tag}"
    monkeypatch.setenv("PFA_VERIFY_TEST_CALLS", str(calls))
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(tmp_path / f"regs-{tag}"))
    result = suite_pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--backend",
                                                 "tests/cases/run_doubles.py:FailsFromTwoBatches", timeout=300)
    assert result.ret == 1, result.stdout.str()
    falsifying = re.search(r"Failing test case: test_acceptance\(.*?case=(Case\(.*?\)\)),", result.stdout.str(), flags=re.S)
    assert falsifying, result.stdout.str()
    # the reported example's diagnosis runs its probes on the backend (properties/diagnosis/probes.py), each one call
    probes = re.search(r"(\d+) (?:probes? in|ablations? run)", result.stdout.str())
    return falsifying.group(1), [int(line) for line in calls.read_text().split()], int(probes.group(1)) if probes else 0


def test_shrinking_is_bounded_by_the_backends_count_and_reproducible(suite_pytester, monkeypatch, tmp_path):
    suite_pytester.makepyfile(test_law=LAW_TEST)
    first, calls, probes = _run(suite_pytester, monkeypatch, tmp_path, "a")
    again, calls_again, probes_again = _run(suite_pytester, monkeypatch, tmp_path, "b")
    assert first == again and calls == calls_again and probes == probes_again
    failed_at = next(k for k, batches in enumerate(calls) if batches >= 2)
    # after the first failure: at most shrink_calls = 3 calls reach the backend, then Hypothesis' final replay
    # and the probes its diagnosis says it ran (at most MAX_CALLS)
    assert probes <= MAX_CALLS and len(calls) - failed_at - 1 <= 3 + 1 + probes, calls


def test_a_backend_that_declares_no_count_is_bounded_by_the_default():
    """pfa_verify.kernels.backends.contract.shrink_budget: a backend's own shrink_calls, else DEFAULT_SHRINK_CALLS; hunt
    calls its check at most that many times after the first failure, and shrinks no further."""
    class Declares:
        shrink_calls = 3
    assert shrink_budget(GoldenBackend()) == DEFAULT_SHRINK_CALLS and shrink_budget(Declares()) == 3
    seen: list[int] = []

    def fails_over_ten(n: int) -> None:
        seen.append(n)
        assert n <= 10
    found = hunt(st.integers(0, 10**6), fails_over_ten, seed=1, examples=100, shrink_s=60.0, shrink_calls=5)
    first = next(k for k, n in enumerate(seen) if n > 10)
    assert found.shrink_calls == 5 and len(seen) - first - 1 <= 5 + 1      # then Hypothesis' final replay
    unbounded = hunt(st.integers(0, 10**6), fails_over_ten, seed=1, examples=100, shrink_s=60.0)
    assert unbounded.example == 11 and unbounded.shrink_calls > 5 and found.example > 11
