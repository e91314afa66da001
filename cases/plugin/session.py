"""The pytest plugin's session part (cases/plugin/ docstring): the Hypothesis profiles, the fixtures
``backend``, ``check_law`` and ``examples_for``, the report header, the skip and coverage summaries. Registered by cases/plugin/ in a
session that runs the laws, and by the suite's own conftest.
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.control import currently_in_test_context

from pfa_verify import kernels
from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.versions import versions
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends.contract import implements, shrink_budget
from pfa_verify.kernels.backends.guarded import GuardedBackend
from pfa_verify.kernels.backends.supervised import SupervisedBackend
from pfa_verify.kernels.backends.supervisor import Supervisor
from pfa_verify.kernels.backends.text import printable
from pfa_verify.kernels.backends.worker_process import BackendSpec
from pfa_verify.properties.rule.coverage import Coverage, classify
from pfa_verify.properties.search import law_examples
from pfa_verify.properties.search.generation import reported_example
from pfa_verify.properties.search.law_examples import operator_of

__all__ = ["DEFAULT_PROFILE", "register_profiles", "NOT_RUN"]

#: How a skip of a law the backend cannot run starts: such a skip fails the session (pytest_sessionfinish).
NOT_RUN = "pfa-verify: not run:"

#: The profile a session that runs the laws gets when it names none.
DEFAULT_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# Every phase but explain: once an example fails, explain traces every later run of the law (its
# diagnosis included), minutes of a failing law on a CPU, for a line the failure text already gives.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]


def register_profiles() -> None:
    """The Hypothesis profiles of the laws (the module docstring); registering loads none."""
    settings.register_profile("ci", derandomize=True, max_examples=20, deadline=None, database=None,
                              print_blob=True, phases=_PHASES, suppress_health_check=_SLOW_OK)
    settings.register_profile("dev", max_examples=20, deadline=None, phases=_PHASES, suppress_health_check=_SLOW_OK)
    settings.register_profile("nightly", max_examples=2000, deadline=None, print_blob=True, phases=_PHASES,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("npu", max_examples=20, deadline=None, print_blob=True, phases=_PHASES,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("sim", derandomize=True, max_examples=10, deadline=None, database=None,
                              print_blob=True, phases=_PHASES, suppress_health_check=_SLOW_OK)


register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # One torch thread per xdist worker: the workers share the cores, and the sim backend's
        # calculator runs thousands of tiny ops between which extra threads only spin (its
        # measurements: kernels/backends/sim_cost.py). A backend never sets this itself.
        torch.set_num_threads(1)
    if config.getoption("--hypothesis-profile", None) is None:
        settings.load_profile(DEFAULT_PROFILE)
    folder = config.getoption("--regressions")
    if folder is not None:
        os.environ[regressions.REGRESSIONS_ENV] = str(folder)
    try:        # a law's failure is captured there: never into the package's own shipped captures
        regressions.refuse_shipped(regressions.directory(), shown="--regressions" if folder is not None
                                   else f"${regressions.REGRESSIONS_ENV}" if os.environ.get(regressions.REGRESSIONS_ENV)
                                   else None)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    # From its metadata, never imported: pypto must first be imported by kernels.pypto_workarounds.
    pypto_version = versions()["pypto"] or "not installed"
    seed = config.getoption("hypothesis_seed", None)
    profile = settings.get_current_profile_name()
    derandomized = settings.default is not None and settings.default.derandomize
    backend = printable(config.getoption("--backend"), one_line=True)
    lines = [f"pfa-verify: backend={backend} torch={torch.__version__} pypto={pypto_version}",
             (f"pfa-verify: hypothesis profile={profile} "
             f"seed={seed if seed is not None else ('derandomized' if derandomized else 'random')}")]
    if config.option.markexpr:
        # Under xdist the summary line does not count deselected tests: say here what is left out.
        lines.append(f"pfa-verify: only tests matching -m {printable(repr(config.option.markexpr))} run; the rest are not checked "
                     "in this session")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    # Skips are "cannot run here", never a pass: count them by reason so nobody mistakes them.
    reasons: Counter = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("pfa-verify: skipped (cannot run here)")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {printable(reason)}")
    if (not_run := _not_run(config)):
        terminalreporter.write_line(f"pfa-verify: {not_run} law test(s) not run on this backend: the session fails "
                                    "(a law not run is not a pass)", red=True)
    _coverage_summary(terminalreporter)


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest):
    """The backend named by --backend (kernels.get_backend). One that cannot run here fails the
    tests that need it, with the reason (no torch_npu, no 950, pypto not installed...); with
    --allow-unavailable they are skipped instead, counted in the summary."""

    name = request.config.getoption("--backend")
    device = request.config.getoption("--device")
    supervised = name != "golden" and not request.config.getoption("--in-process")
    chosen: Any
    try:
        if supervised:
            supervisor = Supervisor(BackendSpec(name=name, device=device),
                                    case_timeout=request.config.getoption("--case-timeout"))
            request.addfinalizer(supervisor.close)
            chosen = SupervisedBackend(supervisor)
        else:
            chosen = kernels.get_backend(name, device=device) if device is not None else kernels.get_backend(name)
            if name != "golden":        # --in-process: the kernel's exits are still failures (GuardedBackend)
                chosen = GuardedBackend(chosen)
    except UsageError as exc:
        pytest.fail(printable(f"backend {name!r}: {exc}"), pytrace=False)
    except kernels.BackendUnavailable as exc:
        message = printable(f"backend {name!r} cannot run here: {exc.reason}")
        if request.config.getoption("--allow-unavailable"):
            pytest.skip(message)
        pytest.fail(message + " (--allow-unavailable skips its tests instead)", pytrace=False)
    if getattr(chosen, "fallback", False) and not request.config.getoption("--allow-fallback"):
        pytest.fail(printable(f"{chosen.selection} (--allow-fallback runs the golden instead)"), pytrace=False)
    return chosen


@pytest.fixture(scope="session")
def examples_for(backend):
    """``examples_for(law)``: the law's ``(case, params)`` examples for the backend under test
    (kernel-sized for a kernel backend: its ``supported_shapes``), properties/search/law_examples.py."""

    def strategy(law: str):
        return law_examples.examples(law, backend)
    return strategy


@pytest.fixture(scope="session")
def check_law(backend, request: pytest.FixtureRequest):
    """``check_law(name, case, **params)``: law ``name`` on the backend under test; a failure is
    captured in the user's folder (--regressions; named so that a fresh process rebuilds the backend) before it is
    reported, and the message ends with the replay command."""

    option = request.config.getoption("--backend")
    name_in_files = backend.name if option == "auto" else option
    budget = shrink_budget(backend)
    after_failure: dict[str, int] = {}     # test id -> law calls since its first failure

    def check(name: str, case, **params) -> None:
        __tracebackhide__ = True
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        operator = operator_of(name)
        if operator is not None and not implements(backend, operator):
            # Declared by the backend when it was loaded (kernels.Capabilities.operators), never learnt from a
            # call: a kernel call that raises is a failure of its law. Not run is not a pass (the session fails).
            pytest.skip(f"{NOT_RUN} backend {backend.name} does not implement {operator}, which law {name} calls; "
                        "select the laws of what it implements (e.g. cases.laws.test_paged_attention_laws)")
        _record_coverage(case)
        if after_failure.get(test, -1) >= budget and not reported_example():
            return      # past the backend's shrink budget: every attempt "passes", the shrinker keeps its best
        failed = False
        try:
            regressions.check(name, backend, case, backend_name=name_in_files, **params)
        except BaseException:
            failed = True
            raise
        finally:
            if test in after_failure:
                after_failure[test] += 1
            elif failed:
                after_failure[test] = 0
    return check


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's report as text: a failure's or a skip's text and the output captured while it ran (a
    kernel's message, what a kernel run in this process printed) with their control characters escaped
    (kernels.backends.text.printable); a report with none is left as pytest made it."""
    outcome = yield
    _escape_report(outcome.get_result())


def _escape_report(report) -> None:
    """Make ``report`` (a pytest TestReport) printable in place: see :func:`pytest_runtest_makereport`."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:                   # a skip: (path, line, reason)
        report.longrepr = (longrepr[0], longrepr[1], printable(longrepr[2]))
    elif longrepr is not None:
        text = str(longrepr)
        if printable(text) != text:
            report.longrepr = printable(text)
    report.sections = [(title, printable(content)) for title, content in report.sections]


#: Coverage bins (properties/rule/coverage.py) of every paged case a law ran on in this process: name -> hits.
_COVERAGE_HITS: Counter = Counter()
_COVERAGE_CASES = [0]


def _record_coverage(case) -> None:
    """Count the bins of a law's case, and tell Hypothesis (``--hypothesis-show-statistics`` lists them per law)."""
    config = getattr(case, "config", None)
    if config is None or not hasattr(config, "block_table"):
        return
    bins = classify(config)
    _COVERAGE_HITS.update(bins)
    _COVERAGE_CASES[0] += 1
    if currently_in_test_context():
        for name in sorted(bins):
            event(f"coverage: {name}")


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)     # an xdist worker: hand the counts over
    if workeroutput is not None:
        workeroutput["pfa_coverage"] = {"hits": dict(_COVERAGE_HITS), "cases": _COVERAGE_CASES[0]}
        return
    # A law the backend could not run is visible as a skip, and it is not a pass: the session fails.
    if _not_run(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _not_run(config: pytest.Config) -> int:
    """How many law tests were skipped because the backend cannot run their law (:data:`NOT_RUN`)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(reporter, "stats", {}) if reporter is not None else {}
    return sum(1 for report in stats.get("skipped", []) if NOT_RUN in str(report.longrepr))


@pytest.hookimpl(optionalhook=True)      # xdist's hook: absent under -p no:xdist
def pytest_testnodedown(node, error) -> None:                        # xdist's controller: merge the workers'
    got = getattr(node, "workeroutput", {}).get("pfa_coverage")
    if got:
        _COVERAGE_HITS.update(got["hits"])
        _COVERAGE_CASES[0] += got["cases"]


def _coverage_summary(terminalreporter) -> None:
    if not _COVERAGE_CASES[0]:
        return
    terminalreporter.section("pfa-verify: coverage of the law runs (properties/rule/coverage.py)")
    terminalreporter.write_line(Coverage.from_hits(_COVERAGE_HITS, _COVERAGE_CASES[0]).line("law examples"))
