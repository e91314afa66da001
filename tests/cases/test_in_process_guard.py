"""--in-process (issue 53, item 7): the shipped example runs in process; a kernel that ends the process there
never leaves exit 0 without a summary (cases/cli/in_process.py); its ``posix._exit`` is an error like
``os._exit`` (GuardedBackend); the watching parent forwards a signal only the parent got, and does not
double one the child got too."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.cli.in_process import ENDED_EARLY
from pfa_verify.kernels.backends.contract import capabilities_of
from pfa_verify.kernels.backends.faults import KernelRaised
from pfa_verify.kernels.backends.guarded import GuardedBackend
from tests.cases.ends_the_driver import PosixExit

ROOT = Path(__file__).resolve().parents[2]
DOUBLES = "tests/cases/ends_the_driver.py"
SLOW = "tests/cases/run_doubles.py:Slow"


def _command(tmp_path, backend, *extra, cases="edge_tail_tile_3_tokens,edge_all_batches_empty"):
    return [sys.executable, "-m", "pfa_verify.cases.cli", "run", "--backend", backend, "--cases", cases, "--examples", "0",
            "--regressions", str(tmp_path / "regs"), "--json", str(tmp_path / "r.json"), *extra]


def _env(tmp_path) -> dict:
    (tmp_path / "pids").mkdir(exist_ok=True)
    return dict(os.environ, PYTHONPATH=str(ROOT), PFA_VERIFY_TEST_PIDS=str(tmp_path / "pids"))


def _run(tmp_path, backend, *extra):
    proc = subprocess.run(_command(tmp_path, backend, *extra), cwd=ROOT, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _verdict(out: str) -> str:
    return next(line for line in reversed(out.strip().splitlines()) if " -> " in line)


def test_the_shipped_example_runs_in_process(tmp_path, capsys):
    status = cli.main(["run", "--in-process", "--backend", "docs/examples/my_backend.py:make_backend", "--cases",
                       "edge_causal_s1_3_short", "--examples", "0", "--regressions", str(tmp_path / "regs")])
    out = capsys.readouterr().out
    assert status == 0 and _verdict(out).endswith("-> OK"), out
    assert "Kernel calls in this process (--in-process: the kernel unsupervised)" in out


def test_posix_exit_raises_while_the_kernel_runs_in_process():
    guarded = GuardedBackend(PosixExit(), capabilities_of(PosixExit()))
    with pytest.raises(KernelRaised, match=r"the kernel called os\._exit\(0\)"):
        guarded.paged_attention_fp8()
    assert os._exit is sys.modules[os.name]._exit          # both names given back after the call
    # the optional attributes it does not declare are their defaults, as supervised
    assert guarded.supported_shapes is None and guarded.skip_reason(None) is None and guarded.notes() == []


def test_a_kernel_that_ends_the_process_in_process_never_exits_0(tmp_path):
    status, out, err = _run(tmp_path, f"{DOUBLES}:saved_exit", "--in-process")
    assert status == 1, (out, err)
    assert err.strip().splitlines()[-1] == ENDED_EARLY
    assert " -> " not in out and not (tmp_path / "r.json").exists()


def test_posix_exit_in_process_is_an_error_with_its_summary(tmp_path):
    status, out, err = _run(tmp_path, f"{DOUBLES}:posix_exit", "--in-process", "--cases", "edge_tail_tile_3_tokens")
    assert status == 1 and "Traceback" not in out + err, (out, err)
    assert _verdict(out).endswith("-> FAILED: no case was checked; 1 case failed or ended in an error")
    assert "the kernel called os._exit(0)" in out and ENDED_EARLY not in err


def test_a_signal_to_the_watching_parent_is_never_lost(tmp_path):
    """The kernel signals its process's parent: under --in-process, the parent that watches the command.
    Forwarded, or (the command ended within the second the parent waits for the child's own copy) the
    parent's own status: never 0."""
    status, out, err = _run(tmp_path, f"{DOUBLES}:sigusr1_to_parent", "--in-process", "--cases", "edge_tail_tile_3_tokens")
    assert status == 138, (out, err)
    assert "SIGUSR1" in err and "Traceback" not in out + err


def _start_in_process(tmp_path):
    proc = subprocess.Popen(_command(tmp_path, SLOW, "--in-process", cases="catalog"), cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    end = time.monotonic() + 300
    while time.monotonic() < end and not any((tmp_path / "pids").iterdir()):   # the child's kernel is busy
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return proc


def test_the_parent_forwards_a_signal_only_it_received(tmp_path):
    proc = _start_in_process(tmp_path)
    proc.send_signal(signal.SIGTERM)                  # to the parent alone, as `kill PID` does
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, (out, err)
    assert err.count("pfa-verify: SIGTERM: stopping") == 1 and "again: ending at once" not in err
    assert "-> FAILED: interrupted by SIGTERM" in _verdict(out)


def test_a_signal_to_the_whole_group_reaches_the_child_once(tmp_path):
    proc = _start_in_process(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)                # as the terminal's Ctrl-C: parent and child get it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out, err)
    assert err.count("pfa-verify: SIGINT: stopping") == 1 and "again: ending at once" not in err
    assert "-> FAILED: interrupted by SIGINT" in _verdict(out)
