"""Fixtures of the kernel tests: a shared SIM backend and the calculator's codec probes.

Everything that needs pypto goes through `sim_backend` / `pypto_module`, which skip (with the reason)
when pypto 0.2.0, cmake or a compiler is missing. kernels.pypto_workarounds must import pypto before
anything else does, so no test module here imports pypto at module level.
"""
from __future__ import annotations

import os

import pytest

from pfa_verify import golden, kernels
from pfa_verify.kernels import pypto_workarounds as pw


def skip_or_fail(reason: str) -> None:
    """A skip with ``reason``; a failure where PFA_VERIFY_REQUIRE_SIM=1 (tox sets it: where pypto is
    installed, a sim test that cannot run is a harness defect, not something to skip)."""
    if os.environ.get("PFA_VERIFY_REQUIRE_SIM") == "1":
        pytest.fail(f"PFA_VERIFY_REQUIRE_SIM=1 but the sim backend cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pypto_module():
    """pypto imported from the 950PR overlay, with every workaround applied (or a skip)."""

    try:
        return pw.load_pypto()
    except pw.PyptoUnavailable as exc:
        skip_or_fail(f"pypto unavailable: {exc}")


@pytest.fixture(scope="session")
def sim_backend(pypto_module):
    """The sim backend at level 'execute', shared by the session (one calculator load)."""

    try:
        return kernels.get_backend("sim")
    except kernels.BackendUnavailable as exc:
        skip_or_fail(exc.reason)


@pytest.fixture(scope="session")
def sim_compiler(pypto_module):
    """The sim backend at level 'compile'."""

    try:
        return kernels.get_backend("sim", level="compile")
    except kernels.BackendUnavailable as exc:
        skip_or_fail(exc.reason)


@pytest.fixture(scope="module")
def small_bundle():
    """A small paged-attention input bundle (B=2, one short batch) for the backend tests."""
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=256, nq=4, nkv=2, kv_act_seqs=(256, 100))
    return golden.make_inputs(config, seed=0)
