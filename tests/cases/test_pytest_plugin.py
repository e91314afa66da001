"""The package's pytest plugin (cases/plugin/): the laws from the installed package, in a folder that is not
the checkout, and no trace of it in a session of other tests (no profile, no torch)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outside(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytest session in a fresh folder, the package importable (installed, or the checkout on the path),
    the plugin loaded as the entry point loads it, its captures kept in its folder."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(pytester.path / "regressions"))
    return pytester


def _plugin_args() -> tuple[str, ...]:
    return ("-p", "no:cacheprovider", "-p", "pfa_verify.cases.plugin")     # by name, as a user loads it


def test_the_laws_run_from_the_package_against_a_named_backend(outside):
    example = ROOT / "docs" / "examples" / "my_backend.py"
    result = outside.runpytest_subprocess(*_plugin_args(), "--pyargs", "pfa_verify.cases.laws", "--backend",
                                          f"{example}:make_backend", "-k", "at12 or outputs_finite")
    result.assert_outcomes(passed=4)
    profile = "ci" if os.environ.get("CI") else "dev"          # the plugin's default (cases/plugin/session.py)
    result.stdout.fnmatch_lines(["pfa-verify: backend=*my_backend.py:make_backend*", f"*hypothesis profile={profile}*"])


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_session_of_other_tests_keeps_hypothesis_defaults_and_never_imports_torch(outside, monkeypatch, ci):
    """Also under CI, where Hypothesis loads a profile named "ci" by itself: the plugin's must not be it."""
    monkeypatch.setenv("CI", ci)
    outside.makepyfile(test_other='''
        import sys
        from hypothesis import given, settings, strategies as st

        @given(st.integers())
        def test_defaults(x):
            assert settings().max_examples == 100 and "torch" not in sys.modules
    ''')
    result = outside.runpytest_subprocess(*_plugin_args())
    result.assert_outcomes(passed=1)
    assert "pfa-verify:" not in result.stdout.str()


def test_a_kernel_that_raises_backend_unavailable_in_a_call_fails_its_laws(outside):
    """Raised during a kernel call, kernels.BackendUnavailable is the kernel's error, never a skip, even with
    --allow-unavailable (it covers a backend that cannot start, nothing else)."""
    hostile = ROOT / "tests" / "kernels" / "hostile_kernels.py"
    result = outside.runpytest_subprocess(*_plugin_args(), "--pyargs", "pfa_verify.cases.laws", "--backend",
                                          f"{hostile}:unavailable_in_a_call", "-k", "acceptance and not at12",
                                          "--hypothesis-profile", "ci", "--allow-unavailable")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the kernel raised BackendUnavailable*"])


def test_the_laws_of_a_kernel_the_backend_does_not_implement_are_not_run_and_fail_the_session(outside):
    hostile = ROOT / "tests" / "kernels" / "hostile_kernels.py"
    result = outside.runpytest_subprocess(*_plugin_args(), "--pyargs", "pfa_verify.cases.laws", "--backend",
                                          f"{hostile}:paged_only", "-k", "at12_default_scale or outputs_finite",
                                          "--hypothesis-profile", "ci")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*does not implement qk_matmul_scale*", "*1 law test(s) not run on this backend*"])
