"""The pytest plugin of pfa-verify: the laws of SPEC §2-§6 as pytest tests against a backend you name.

Installed with the package (the ``pytest11`` entry point), so that after ``pip install pfa-verify``::

    pytest --pyargs cases.laws --backend path/to/my_kernel.py:make_backend -n 2

runs every law (cases/laws/) against that backend, from any folder.

Options
  --backend NAME   golden | sim | npu | auto | pypto-gym:FILE.py[:FUNCTION] | mutant:NAME |
                   package.module:factory | path/file.py:factory (default: golden). Tests that
                   take the ``backend`` fixture run against it. A backend that cannot run here fails
                   every such test with its reason (a property run that checked nothing is not a
                   pass); ``--allow-unavailable`` turns that into skips, counted in the summary.
  --device N       NPU device index for the npu backend (else TILE_FWK_DEVICE_ID, else the
                   pytest-xdist worker index).
  --allow-fallback     with --backend auto, run on the golden when no kernel backend starts (else
                   the tests fail: such a session checks no kernel).
  --in-process     run the backend's kernel in the test process (for a debugger). By default every
                   backend but the golden runs under a supervisor (kernels/backends/supervisor.py):
                   its kernel in a worker process of the test process, so a kernel that exits, crashes
                   or hangs (--case-timeout) fails the test that called it (a KernelFault, which the
                   laws report as a failure) and can never end the session with a pass.
  --case-timeout S     the time limit of one kernel call of a supervised backend (default: none).
  --regressions DIR    where a law's failure is captured (default cases/regressions, or
                   $PFA_VERIFY_REGRESSIONS).

Hypothesis profiles (``--hypothesis-profile NAME``): ci (derandomized, 20 examples a law), dev (random,
20), nightly (2000), npu and sim (kernel-sized, few). A session that runs the laws and names none gets
``ci`` when CI is set, else ``dev``; a session of other tests is left as it is.

Fixtures: ``backend``; ``check_law(name, case, **params)``, which runs a law of properties.laws on the
backend under test and captures a failure (cases.data.regressions.check); ``examples_for(law)``, the
law's examples for the backend (properties/law_examples.py).
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.control import currently_in_test_context

import kernels
from cases.data import regressions
from cases.data.versions import versions
from golden.errors import UsageError
from kernels.backends.supervisor import BackendSpec, GuardedBackend, SupervisedBackend, Supervisor
from properties import law_examples
from properties.coverage import Coverage, classify
from properties.generation import pin_local_constants, reported_example

__all__ = ["register_profiles", "DEFAULT_PROFILE"]

#: The profile a session that runs the laws gets when it names none.
DEFAULT_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """The Hypothesis profiles of the laws (the module docstring); registering loads none."""
    settings.register_profile("ci", derandomize=True, max_examples=20, deadline=None, database=None,
                              print_blob=True, suppress_health_check=_SLOW_OK)
    settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile("nightly", max_examples=2000, deadline=None, print_blob=True,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("npu", max_examples=20, deadline=None, print_blob=True,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("sim", derandomize=True, max_examples=10, deadline=None, database=None,
                              print_blob=True, suppress_health_check=_SLOW_OK)


register_profiles()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pfa-verify")
    group.addoption("--backend", default=os.environ.get("PFA_VERIFY_BACKEND", "golden"),
                    help="backend under test: golden, sim, npu, auto, pypto-gym:FILE.py[:FUNCTION] (PyPTO-Gym's "
                         "kernel on the sim; pypto-gym-npu:... on a 950), mutant:NAME, package.module:factory or "
                         "path/file.py:factory")
    group.addoption("--device", type=int, default=None,
                    help="NPU device index for the npu backend")
    group.addoption("--allow-unavailable", action="store_true",
                    help="skip (instead of fail) the backend's tests when it cannot run here")
    group.addoption("--allow-fallback", action="store_true",
                    help="with --backend auto, let a fall back to the golden (no kernel here) run instead of failing")
    group.addoption("--in-process", action="store_true",
                    help="run the backend's kernel in the test process (a debugger); by default every backend but "
                         "the golden runs in a supervised worker process, so a kernel that exits or crashes fails "
                         "its test instead of ending the session")
    group.addoption("--case-timeout", type=float, default=None,
                    help="seconds one kernel call of a supervised backend may take (default: no limit)")
    group.addoption("--regressions", metavar="DIR", default=None,
                    help="the folder a law's failure is captured in (default cases/regressions or "
                         "$PFA_VERIFY_REGRESSIONS)")


def _runs_the_laws(config: pytest.Config) -> bool:
    """Whether the session names the laws (cases.laws) or a backend: the sessions whose profile is ours."""
    args = [str(a) for a in config.invocation_params.args]
    return any("cases.laws" in a or "cases/laws" in a or a.startswith("--backend") for a in args)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # One torch thread per xdist worker: the workers share the cores, and the sim backend's
        # calculator runs thousands of tiny ops between which extra threads only spin (its
        # measurements: kernels/backends/sim_cost.py). A backend never sets this itself.
        torch.set_num_threads(1)
    # Derandomized examples depend on the test, the Hypothesis version and the profile only, never on
    # what else the session imported (another backend's module, a kernel file, the mutants): the
    # local-constant pool Hypothesis would mix into its draws is pinned empty (properties/generation.py).
    pin_local_constants()
    if _runs_the_laws(config) and config.getoption("--hypothesis-profile", None) is None:
        settings.load_profile(DEFAULT_PROFILE)
    folder = config.getoption("--regressions")
    if folder is not None:
        os.environ[regressions.REGRESSIONS_ENV] = str(folder)


def pytest_report_header(config: pytest.Config) -> list[str]:
    # From its metadata, never imported: pypto must first be imported by kernels.pypto_workarounds.
    pypto_version = versions()["pypto"] or "not installed"
    seed = config.getoption("hypothesis_seed", None)
    profile = settings.get_current_profile_name()
    derandomized = settings.default is not None and settings.default.derandomize
    lines = [f"pfa-verify: backend={config.getoption('--backend')} torch={torch.__version__} pypto={pypto_version}",
             (f"pfa-verify: hypothesis profile={profile} "
             f"seed={seed if seed is not None else ('derandomized' if derandomized else 'random')}")]
    if config.option.markexpr:
        # Under xdist the summary line does not count deselected tests: say here what is left out.
        lines.append(f"pfa-verify: only tests matching -m {config.option.markexpr!r} run; the rest are not checked "
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
            terminalreporter.write_line(f"{count:5d}  {reason}")
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
        pytest.fail(f"backend {name!r}: {exc}", pytrace=False)
    except kernels.BackendUnavailable as exc:
        message = f"backend {name!r} cannot run here: {exc.reason}"
        if request.config.getoption("--allow-unavailable"):
            pytest.skip(message)
        pytest.fail(message + " (--allow-unavailable skips its tests instead)", pytrace=False)
    if getattr(chosen, "fallback", False) and not request.config.getoption("--allow-fallback"):
        pytest.fail(f"{chosen.selection} (--allow-fallback runs the golden instead)", pytrace=False)
    return chosen


@pytest.fixture(scope="session")
def examples_for(backend):
    """``examples_for(law)``: the law's ``(case, params)`` examples for the backend under test
    (kernel-sized for a kernel backend: its ``supported_shapes``), properties/law_examples.py."""

    def strategy(law: str):
        return law_examples.examples(law, backend)
    return strategy


@pytest.fixture(scope="session")
def check_law(backend, request: pytest.FixtureRequest):
    """``check_law(name, case, **params)``: law ``name`` on the backend under test; a failure is
    captured in cases/regressions (named so that a fresh process rebuilds the backend) before it is
    reported, and the message ends with the replay command."""

    option = request.config.getoption("--backend")
    name_in_files = backend.name if option == "auto" else option
    budget = getattr(backend, "shrink_calls", None)
    after_failure: dict[str, int] = {}     # test id -> law calls since its first failure

    def check(name: str, case, **params) -> None:
        __tracebackhide__ = True
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        _record_coverage(case)
        if budget is not None and after_failure.get(test, -1) >= budget and not reported_example():
            return      # past the backend's shrink budget: every attempt "passes", the shrinker keeps its best
        failed = False
        try:
            regressions.check(name, backend, case, backend_name=name_in_files, **params)
        except kernels.BackendUnavailable as exc:   # e.g. AT-12 on a paged-attention-only kernel
            pytest.skip(f"{backend.name} cannot run law {name}: {exc.reason}")
        except BaseException:
            failed = True
            raise
        finally:
            if test in after_failure:
                after_failure[test] += 1
            elif failed:
                after_failure[test] = 0
    return check


#: Coverage bins (properties/coverage.py) of every paged case a law ran on in this process: name -> hits.
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


@pytest.hookimpl(optionalhook=True)      # xdist's hook: absent under -p no:xdist
def pytest_testnodedown(node, error) -> None:                        # xdist's controller: merge the workers'
    got = getattr(node, "workeroutput", {}).get("pfa_coverage")
    if got:
        _COVERAGE_HITS.update(got["hits"])
        _COVERAGE_CASES[0] += got["cases"]


def _coverage_summary(terminalreporter) -> None:
    if not _COVERAGE_CASES[0]:
        return
    terminalreporter.section("pfa-verify: coverage of the law runs (properties/coverage.py)")
    terminalreporter.write_line(Coverage.from_hits(_COVERAGE_HITS, _COVERAGE_CASES[0]).line("law examples"))
