"""The suite's own pytest setup: markers, the regressions replayed first, the Hypothesis profile, and
``suite_pytester``. The options, fixtures (``backend``, ``check_law``, ``examples_for``), the report
header and the skip and coverage summaries are the package's pytest plugin (cases/plugin/ and its
session part cases/plugin/session.py: the docstring lists the options), loaded here by name, as a user
loads it with ``-p pfa_verify.cases.plugin``.

One option of the suite's own: ``--allow-quarantined``, captured cases the ledger quarantines are
skips (else failures: tests/cases/test_replay_captured.py).

Fixtures: ``suite_pytester``, pytest's ``pytester`` set up to run a pytest session with this suite's
conftest.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

pytest.register_assert_rewrite("pfa_verify.cases.plugin")   # as pytest does for a plugin it loads by -p
from pfa_verify.cases.plugin.session import DEFAULT_PROFILE  # noqa: E402 - after the line above

pytest_plugins = ("pytester", "pfa_verify.cases.plugin", "pfa_verify.cases.plugin.session")

# The laws' profiles are the plugin's (cases/plugin/: ci, dev, nightly, npu, sim); the suite's tests use
# them too, the default chosen as the plugin chooses it (ci when CI is set).
settings.load_profile(DEFAULT_PROFILE)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("pfa-verify").addoption("--allow-quarantined", action="store_true",
                                            help="skip (instead of fail) captured cases the ledger quarantines")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "npu: needs an Ascend 950 and torch_npu")
    config.addinivalue_line("markers", "sim: needs pypto 0.2.0 (SIM mode on the CPU)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "regression: replays a captured case, shipped or the user's (runs first)")
    config.addinivalue_line("markers", "cluster: needs Ray (the ray extra) and starts a local Ray; run by tox -e cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    # Every run replays the captured regressions before anything else (stable sort keeps the rest).
    items.sort(key=lambda item: item.get_closest_marker("regression") is None)


@pytest.fixture
def suite_pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytest's ``pytester`` for tests that run a pytest session of their own (``runpytest_subprocess``):
    its folder has a conftest.py that is this one (options, fixtures, profiles), the project root is on
    the import path, the session is not taken for an xdist worker of ours, and its captures stay in its folder."""
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    # its laws capture into its own folder, never into the checkout's folder
    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(pytester.path / "regressions"))
    pytester.makeconftest("from tests.conftest import *  # noqa: F401,F403\n")
    return pytester
