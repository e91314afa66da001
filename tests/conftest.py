"""The control panel of the suite: options, markers, Hypothesis profiles, the report header.

Options
  --backend NAME   golden | sim | npu | auto | package.module:factory (default: golden). Tests that
                   take the ``backend`` fixture run against it.
  --device N       NPU device index for the npu backend (else TILE_FWK_DEVICE_ID, else the
                   pytest-xdist worker index).
"""
from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pfa-verify")
    group.addoption("--backend", default=os.environ.get("PFA_VERIFY_BACKEND", "golden"),
                    help="backend under test: golden, sim, npu, auto or package.module:factory")
    group.addoption("--device", type=int, default=None,
                    help="NPU device index for the npu backend")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "npu: needs an Ascend 950 and torch_npu")
    config.addinivalue_line("markers", "sim: needs pypto 0.2.0 (SIM mode on the CPU)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest):
    """The backend named by --backend (kernels.get_backend); a BackendUnavailable becomes a skip
    whose reason says what is missing (no torch_npu, no 950, pypto not installed...)."""
    import kernels

    name = request.config.getoption("--backend")
    device = request.config.getoption("--device")
    try:
        return kernels.get_backend(name, device=device) if device is not None else kernels.get_backend(name)
    except kernels.BackendUnavailable as exc:
        pytest.skip(f"backend {name!r} unavailable: {exc.reason}")
