"""SIGHUP and SIGUSR1 to the driver end the run as SIGTERM does (issue 53, item 7; cases/cli/interrupt.py): its
summary, its reports, 128 + the signal's number; a kernel that sends one on every call does not cut the
summary short."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOUBLES = "tests/cases/ends_the_driver.py"


def _run(tmp_path, backend):
    proc = subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", "run", "--backend", backend, "--cases",
                           "edge_tail_tile_3_tokens,edge_all_batches_empty", "--examples", "0", "--regressions",
                           str(tmp_path / "regs"), "--json", str(tmp_path / "r.json")], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600,
                          check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _verdict(out: str) -> str:
    return next(line for line in reversed(out.strip().splitlines()) if " -> " in line)


@pytest.mark.parametrize("factory, name, code", [("sighup", "SIGHUP", 129), ("sigusr1", "SIGUSR1", 138)])
def test_a_signal_a_kernel_sends_its_driver_ends_the_run_as_sigterm_does(tmp_path, factory, name, code):
    status, out, err = _run(tmp_path, f"{DOUBLES}:{factory}")
    assert status == code, (out, err)
    assert f"pfa-verify: {name}: stopping" in err and "Traceback" not in out + err
    assert f"-> FAILED: interrupted by {name} after " in _verdict(out)
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["interrupted"] == name and summary["exit_status"] == code
