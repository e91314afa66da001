"""cases/running/pool.py: the one worker pool (issue 19; issue 18 items 6 and 11): order, faults, a fresh worker
after a failure inside pypto's trace, and the cluster's refusals that need no Ray.

The Ray executor's own tests (a local Ray) are in tests/cases/test_cluster.py, marked ``cluster``
(``tox -e cluster``: Ray is an optional extra, 79 MB)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from pfa_verify import golden, kernels
from pfa_verify.cases import cli
from pfa_verify.cases.cli.arguments import count as count_argument
from pfa_verify.cases.data import regressions
from pfa_verify.cases.running.pool import Pool, _death, parse_cluster, task_resources, worker_slot
from pfa_verify.kernels import KernelRunError
from pfa_verify.kernels.backends.supervised import SupervisedBackend
from pfa_verify.kernels.backends.supervisor import Supervisor
from pfa_verify.kernels.backends.worker_process import BackendSpec
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.rule.case import Case

SMALL = "edge_causal_s1_3_short,edge_tail_tile_3_tokens,edge_constant_rows"
DIES = "tests/cases/run_doubles.py:DiesOnTheTailCase"


def square(x):
    return x * x


def refuse(x):
    raise ValueError(f"task {x} refuses")


def die_unless_marked(folder):
    """SIGKILL this worker the first time (a marker file says it happened), return its pid after."""
    marker = Path(folder) / "died"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


def always_die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def test_tasks_come_back_in_payload_order_with_the_node_that_ran_them():
    seen = []
    with Pool(workers=2) as pool:
        results = pool.map(square, list(range(6)), on_start=seen.append)
    assert [r.value for r in results] == [0, 1, 4, 9, 16, 25] and [r.index for r in results] == list(range(6))
    assert seen == list(range(6))                                  # handed out in payload order
    assert {r.node for r in results} == {socket.gethostname()} and os.getpid() not in {r.pid for r in results}
    assert all(r.attempts == 1 and r.error is None for r in results)


def slot_and_pid(_):
    return worker_slot(), os.getpid()


def test_a_fresh_pool_runs_more_tasks_than_workers_each_in_a_new_process_with_a_slot():
    """fresh (a new process per task, the sim kill matrix): each process gives its slot back when it
    ends, so the third task's process gets one. Before, it waited in the initializer for ever and
    `pfa-verify mutants --level sim --workers 2` hung after its first two rows."""
    got: list = []

    def run():
        with Pool(workers=2, fresh=True) as pool:     # 3 tasks: the third process needs a slot given back
            got.extend(pool.map(slot_and_pid, list(range(3))))
    driver = threading.Thread(target=run, daemon=True)      # a hang fails the test, not the whole suite
    driver.start()
    driver.join(timeout=120)
    assert not driver.is_alive(), "the fresh pool hung: a new worker process found no slot"
    results = got
    assert all(r.error is None for r in results), [r.error for r in results]
    assert {r.value[0] for r in results} <= {0, 1} and len({r.value[1] for r in results}) == 3


def test_a_task_that_raises_is_an_error_and_is_not_retried():
    with Pool(workers=2) as pool:
        results = pool.map(refuse, [1, 2])
    assert [(r.error, r.attempts) for r in results] == [("ValueError: task 1 refuses", 1), ("ValueError: task 2 refuses", 1)]


def test_a_worker_that_dies_once_is_retried_and_its_task_counted_once(tmp_path):
    done = []
    with Pool(workers=2) as pool:
        results = pool.map(die_unless_marked, [str(tmp_path)], on_done=lambda k, r: done.append(k))
    (r,) = results
    assert r.error is None and r.attempts == 2 and r.value != int((tmp_path / "died").read_text())
    assert r.retry_cause == "a worker process ended: killed by SIGKILL" and done == [0]


def test_a_worker_that_dies_twice_is_an_error_naming_the_cause():
    with Pool(workers=1, spawn=True) as pool:
        (r,) = pool.map(always_die, [0])
    assert r.value is None and r.attempts == 2
    assert r.error == ("the worker process died running this task, 2 times (first: a worker process ended: killed by "
                       "SIGKILL; last: a worker process ended: killed by SIGKILL)")


def _run(tmp_path, *extra, backend=DIES, cases=SMALL, examples=0):
    report = tmp_path / "report.json"
    status = cli.main(["run", "--backend", backend, "--cases", cases, "--examples", str(examples), "--regressions",
                       str(tmp_path / "regs"), "--json", str(report), *extra])
    return status, json.loads(report.read_text())


@pytest.fixture
def deaths(tmp_path, monkeypatch):
    folder = tmp_path / "deaths"
    folder.mkdir()
    monkeypatch.setenv("PFA_VERIFY_TEST_DEATHS", str(folder))
    monkeypatch.setenv("PFA_VERIFY_TEST_DRIVER", str(os.getpid()))
    return folder


def test_a_case_whose_worker_was_killed_runs_again_and_the_run_passes(tmp_path, deaths):
    """Issue 19: the killed worker's case is in the report once, run twice, with the cause; exit 0."""
    status, data = _run(tmp_path, "--workers", "2")
    names = [r["name"] for r in data["results"]]
    assert names == SMALL.split(",") and status == 0
    tail = data["results"][1]
    assert (tail["verdict"], tail["attempts"]) == ("pass", 2) and len(list(deaths.glob("died-*"))) == 1
    assert ("ran again: its first run was lost when its worker process ended: the kernel's worker process was "
            "killed by SIGKILL during the call") in tail["message"]
    # the cases running beside it in the other worker were not touched
    assert [r["verdict"] for r in data["results"]] == ["pass"] * 3 and data["summary"]["cases"] == 3
    assert [r["attempts"] for r in data["results"]] == [1, 2, 1]


def test_a_case_whose_worker_dies_every_time_is_an_error_and_fails_the_run(tmp_path, deaths):
    (deaths / "always").write_text("")
    status, data = _run(tmp_path, "--workers", "2")
    tail = data["results"][1]
    assert status == 1 and (tail["name"], tail["verdict"], tail["attempts"]) == ("edge_tail_tile_3_tokens", "error", 2)
    assert ("the kernel's worker process was killed by SIGKILL during the call; so did the 1 new process(es) it ran "
            "again in") in tail["message"]
    assert [r["verdict"] for r in data["results"][::2]] == ["pass", "pass"]
    assert data["summary"]["errors"] == 1 and "1 case failed or ended in an error" in data["summary"]["verdict"]


def test_failures_are_captured_by_the_driver_once(tmp_path, monkeypatch):
    """The workers judge; the one writer (cases/data/regressions.py) runs in this process, once per group of
    cases that fail alike (three failing cases, two groups)."""
    saved = []
    real = regressions.save
    monkeypatch.setattr(regressions, "save", lambda reg, **kw: saved.append((os.getpid(), reg.id)) or real(reg, **kw))
    status, data = _run(tmp_path, "--workers", "2", backend="tests/cases/run_doubles.py:PerturbOne")
    ids = regressions.list_ids(directory=tmp_path / "regs")
    assert status == 1 and sorted(i for _, i in saved) == sorted(ids) and len(ids) == len(data["groups"]) == 2
    assert {pid for pid, _ in saved} == {os.getpid()}
    # every failing case names its group's one capture
    replay_of = {g["group"]: g["replay"] for g in data["groups"]}
    assert all(r["replay"] == replay_of[r["group"]] for r in data["results"])
    assert {r["replay"].rsplit(" ", 1)[1] for r in data["results"]} == set(ids)


def test_task_resources_follow_the_backend():
    assert task_resources(kernels.get_backend("golden")) == {"CPU": 1}


@pytest.mark.parametrize("text", ["ray", "ray=10.0.0.1:6379"])
def test_cluster_names(text):
    assert parse_cluster(text) == text


@pytest.mark.parametrize("text", ["slurm", "ray=", "dask=host:1"])
def test_a_bad_cluster_name_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--backend", "golden", "--cluster", text])
    assert exit_info.value.code == 2 and "--cluster" in capsys.readouterr().err


def test_without_ray_a_cluster_run_is_one_line_exit_2_before_any_case(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)          # as on a machine without the extra
    status = cli.main(["run", "--backend", "golden", "--cases", SMALL, "--examples", "0", "--cluster", "ray",
                       "--regressions", str(tmp_path / "regs")])
    err = capsys.readouterr()
    assert status == 2 and err.err == ("pfa-verify: error: --cluster ray: Ray is not installed here "
                                       "(pip install 'pfa-verify[ray]')\n")
    assert "cases:" not in err.out


# Issue 18 item 6: a kernel that fails inside pypto's trace (the sim mutant minus_one_not_clamped views k_cache
# at a negative row, W12, while the calculator verifies the graph) leaves pypto unusable in its process (W7:
# "function nested is not allowed", or a crash).
TRACE_BAD = Case(golden.PagedAttentionConfig(batch=2, s1=1, s2=512, nq=4, nkv=1, s2_tile=256, kv_act_seqs=(512, 100)), 1)
TRACE_SPOILER = "mutant:sim/minus_one_not_clamped"


@pytest.mark.sim
def test_a_failure_inside_pypto_s_trace_leaves_the_next_case_its_own_worker():
    """In one worker: an error, then a pass, the pass in a new process."""
    good = Case(golden.PagedAttentionConfig(batch=2, s1=1, s2=300, nq=4, nkv=1, kv_act_seqs=(300, 5)), 2)
    with Supervisor(BackendSpec(name=TRACE_SPOILER)) as supervisor:       # one worker: the spoiled one is replaced
        backend = SupervisedBackend(supervisor)
        with pytest.raises(KernelRunError, match="out-of-bounds read"):
            judge(backend, TRACE_BAD)
        assert judge(backend, good).passed and supervisor.started == 2


@pytest.mark.sim
@pytest.mark.slow     # the test above proves the worker replaced; this one the run command's path (tox -e sim)
def test_a_failure_inside_pypto_s_trace_leaves_the_next_case_of_a_serial_run_its_own_worker(tmp_path):
    """The same in a serial run of the command, in a process of its own (the bad case spoils the process
    that runs it): a captured case first, then a catalog case that passes."""
    bad, name = TRACE_BAD, TRACE_SPOILER
    regs = tmp_path / "regs"
    reg = regressions.Regression.from_failure("acceptance", name, bad, {}, "fails inside the trace")
    regressions.save(reg, directory=regs)
    report = tmp_path / "serial.json"
    proc = subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", "run", "--backend", name, "--cases",
                           f"{reg.id},edge_lengths_0_1_bs_bs1", "--examples", "0", "--regressions", str(regs),
                           "--no-capture", "--json", str(report)], capture_output=True, text=True, timeout=900, check=False)
    data = json.loads(report.read_text())
    verdicts = [(r["name"], r["verdict"]) for r in data["results"] if r["counts"]]
    assert verdicts == [(reg.id, "error"), ("edge_lengths_0_1_bs_bs1", "pass")], proc.stdout[-3000:]
    assert proc.returncode == 1


def test_a_broken_pool_is_blamed_on_the_killed_worker_not_on_siblings_that_exited_after_it():
    """A sibling ending with a status once the pool broke is a consequence; with no worker killed, it is named."""

    procs = lambda *codes: {i: SimpleNamespace(exitcode=c) for i, c in enumerate(codes)}  # noqa: E731
    assert _death(procs(-signal.SIGKILL, 1, 0, None, -signal.SIGTERM)) == "a worker process ended: killed by SIGKILL"
    assert _death(procs(1, 0)) == "a worker process ended: exit status 1"
    assert _death(procs(0, -signal.SIGTERM)) == "a worker process terminated abruptly (BrokenProcessPool)"


@pytest.mark.parametrize("text, message", [("x", "'x' is not an integer"), ("-1", "'-1' must be >= 0"), ("2.5", "'2.5' is not an integer")])
def test_a_bad_count_names_the_value(text, message):

    with pytest.raises(argparse.ArgumentTypeError, match=message):
        count_argument(text)
    assert count_argument("3") == 3
