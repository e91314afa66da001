"""The pytest plugin of pfa-verify: the laws of SPEC §2-§6 as pytest tests against a backend you name.

Loaded by name, never by an entry point, so that installing pfa-verify changes no other pytest session
of the environment: after ``pip install pfa-verify``::

    pytest -p pfa_verify.cases.plugin --pyargs pfa_verify.cases.laws --backend path/to/my_kernel.py:make -n 2

runs every law (cases/laws/) against that backend, from any folder.

Options
  --backend NAME   golden | sim | npu | auto | pypto-gym:FILE.py[:FUNCTION] | mutant:NAME |
                   package.module:factory | path/file.py:factory (default: golden). Tests that
                   take the ``backend`` fixture run against it. A backend that cannot run here fails
                   every such test with its reason (a property run that checked nothing is not a
                   pass); ``--allow-unavailable`` turns that into skips, counted in the summary. It
                   covers a backend that cannot start, nothing else: an exception a kernel raises
                   during a call fails its law, and a law of a kernel the backend does not implement
                   (kernels.Capabilities.operators) is skipped and fails the session.
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
  --regressions DIR    where a law's failure is captured (default ./pfa-verify-regressions,
                   or $PFA_VERIFY_REGRESSIONS; never the captures shipped in the package).

Hypothesis profiles (``--hypothesis-profile NAME``): ci (derandomized, 20 examples a law), dev (random,
20), nightly (2000), npu and sim (kernel-sized, few). A session that runs the laws and names none gets
``ci`` when CI is set, else ``dev``; a session of other tests is left as it is.

Fixtures (cases/plugin/session.py): ``backend``; ``check_law(name, case, **params)``, which runs a law of
properties.search.laws on the backend under test and captures a failure (cases.data.regressions.check);
``examples_for(law)``, the law's examples for the backend (properties/search/law_examples.py).

This module imports pytest only and holds the options. A session that runs the laws (it names the
laws or a --backend)
gets the rest, cases/plugin/session.py: the profiles, torch, the backends, the fixtures, the report
header and summaries. Any other session is left as it is: no torch, and none of these profiles, whose
names (ci, dev) Hypothesis would otherwise take for its own (it loads a "ci" profile by itself under CI).
"""
from __future__ import annotations

import importlib
import os

import pytest

__all__ = ["SESSION_PLUGIN"]

#: The plugin of a session that runs the laws (registered by :func:`pytest_configure`).
SESSION_PLUGIN = "pfa_verify.cases.plugin.session"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pfa-verify")
    group.addoption("--backend", default=os.environ.get("PFA_VERIFY_BACKEND", "golden"),
                    help="backend under test: golden, sim, npu, auto, pypto-gym:FILE.py[:FUNCTION] (PyPTO-Gym's "
                         "kernel on the sim; pypto-gym-npu:... on a 950), mutant:NAME, package.module:factory or "
                         "path/file.py:factory")
    group.addoption("--device", type=int, default=None,
                    help="NPU device index for the npu backend")
    group.addoption("--allow-unavailable", action="store_true",
                    help="skip (instead of fail) the backend's tests when the backend cannot start here; never "
                         "covers a kernel call, whose exception always fails its law")
    group.addoption("--allow-fallback", action="store_true",
                    help="with --backend auto, let a fall back to the golden (no kernel here) run instead of failing")
    group.addoption("--in-process", action="store_true",
                    help="run the backend's kernel in the test process (a debugger); by default every backend but "
                         "the golden runs in a supervised worker process, so a kernel that exits or crashes fails "
                         "its test instead of ending the session")
    group.addoption("--case-timeout", type=float, default=None,
                    help="seconds one kernel call of a supervised backend may take (default: no limit)")
    group.addoption("--regressions", metavar="DIR", default=None,
                    help="the folder a law's failure is captured in (default ./pfa-verify-regressions or "
                         "$PFA_VERIFY_REGRESSIONS)")


def runs_the_laws(config: pytest.Config) -> bool:
    """Whether the session names the laws (pfa_verify.cases.laws) or a backend: the sessions the plugin is for."""
    args = [str(a) for a in config.invocation_params.args]
    return any("pfa_verify.cases.laws" in a or "cases/laws" in a or a.startswith("--backend") for a in args)


@pytest.hookimpl(tryfirst=True)     # before Hypothesis' own, which loads a --hypothesis-profile by name
def pytest_configure(config: pytest.Config) -> None:
    if runs_the_laws(config) and not config.pluginmanager.has_plugin(SESSION_PLUGIN):
        # imported here, not at the top: every other session of the environment is spared torch
        config.pluginmanager.register(importlib.import_module(SESSION_PLUGIN), SESSION_PLUGIN)
