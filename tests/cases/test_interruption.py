"""cases/cli/interrupt.py and run's wind-down: Ctrl-C or SIGTERM stops a run, which summarizes and writes
what it checked, marks it interrupted and exits 130 / 143; a second signal ends at once; a killed run
leaves no worker behind (kernels/backends/supervisor.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOW = "tests/cases/run_doubles.py:Slow"


def _start(tmp_path, *extra, backend=SLOW):
    env = dict(os.environ, PFA_VERIFY_TEST_PIDS=str(tmp_path / "pids"), PYTHONPATH=str(ROOT))
    (tmp_path / "pids").mkdir()
    return subprocess.Popen([sys.executable, "-m", "pfa_verify.cases.cli", "run", "--backend", backend, "--cases", "catalog",
                             "--examples", "0", "--regressions", str(tmp_path / "regs"), "--json",
                             str(tmp_path / "r.json"), *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_a_busy_worker(tmp_path, proc, within_s: float = 120.0) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end and not any((tmp_path / "pids").iterdir()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)


def _sandboxes_of(pid: int) -> list[str]:
    """The live kernel workers started by process ``pid`` (their command lines name it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"pfa_verify.kernels.backends.sandbox" in args and str(pid).encode() in args and state != "Z":
            found.append(entry.name)
    return found


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_the_run_which_says_what_it_checked(tmp_path, signum, status):
    proc = _start(tmp_path)
    _wait_for_a_busy_worker(tmp_path, proc)
    assert _sandboxes_of(proc.pid)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert proc.returncode == status, (out, err)
    assert f"pfa-verify: {name}: stopping" in err and "Traceback" not in out + err
    last = out.strip().splitlines()
    verdict = next(line for line in reversed(last) if " -> " in line)
    assert f"-> FAILED: interrupted by {name}" in verdict and " not run)" in verdict
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"]["interrupted"] == name and data["summary"]["exit_status"] == status
    assert data["summary"]["not_run"] and len(data["results"]) + len(data["summary"]["not_run"]) == 18
    time.sleep(1)
    assert not _sandboxes_of(proc.pid)


def test_a_second_signal_ends_at_once(tmp_path):
    proc = _start(tmp_path)
    _wait_for_a_busy_worker(tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    # The second signal only once the first was handled: two signals that arrive before Python runs the
    # handler are one signal (a busy machine delays the handler past any fixed sleep).
    seen = []
    while not any("stopping" in line for line in seen):
        line = proc.stderr.readline()
        if not line:                      # the run ended before it said it was stopping
            break
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = "".join(seen) + err
    assert proc.returncode == 130 and "SIGINT again: ending at once" in err and "-> OK" not in out, (out, err)


def test_a_killed_run_leaves_no_worker_behind(tmp_path):
    """Its workers are asleep inside the kernel (they would not notice their pipe closing for 600 s):
    Linux ends them with their driver (PR_SET_PDEATHSIG)."""
    proc = _start(tmp_path, "--workers", "2", backend="tests/kernels/hostile_kernels.py:sleeps")
    end = time.monotonic() + 120
    while len(_sandboxes_of(proc.pid)) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    time.sleep(3)                       # both have loaded and taken a case
    assert len(_sandboxes_of(proc.pid)) == 2
    proc.kill()
    proc.communicate(timeout=60)
    end = time.monotonic() + 10
    while _sandboxes_of(proc.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _sandboxes_of(proc.pid)
