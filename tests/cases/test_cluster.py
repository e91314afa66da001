"""cases/running/pool.py on Ray (issue 19): ``tox -e cluster`` (the ray extra; these tests are marked ``cluster``).

A local Ray head with 2 CPUs is started once for the module (``ray start --head --block``, ended by
its process group afterwards; token authentication off, as on a private test cluster). Against it:
``pfa-verify run --cluster`` gives the local pool's verdicts on the catalog and 20 generated sim cases;
a worker killed from outside mid-run leaves every case in the report; a case whose worker dies once
runs again, one that kills its worker every time is an error; failures are captured by the driver
alone; a two-law search with 2 tasks per law; the refusals (unreachable, no NPU resource) are one line
and exit 2 before any case.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.running.search import search

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
SMALL = "edge_causal_s1_3_short,edge_tail_tile_3_tokens,edge_constant_rows"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """``ray=127.0.0.1:PORT`` of a local head with 2 CPUs; its workers see the test doubles' folders."""
    folders = tmp_path_factory.mktemp("head")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PFA_VERIFY_TEST_DEATHS=str(folders / "deaths"),
               PFA_VERIFY_TEST_PIDS=str(folders / "pids"))
    port = _free_port()
    proc = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--num-cpus", "2", "--port", str(port), "--block",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(1)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
        pytest.fail("the Ray head did not start within 180 s")
    time.sleep(3)    # the raylet registers after the GCS listens
    yield {"address": f"ray=127.0.0.1:{port}", "deaths": folders / "deaths", "pids": folders / "pids"}
    os.killpg(proc.pid, signal.SIGTERM)              # the head's process group: this test started it
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _no_token(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")


def _run(tmp_path, *extra, backend="golden", cases=SMALL, examples=0, name="report"):
    report = tmp_path / f"{name}.json"
    status = cli.main(["run", "--backend", backend, "--cases", cases, "--examples", str(examples), "--regressions",
                       str(tmp_path / "regs"), "--json", str(report), *extra])
    return status, json.loads(report.read_text())


def _verdicts(data) -> list:
    return [(r["name"], r["reference"], r["verdict"], r["counts"], r["skip_kind"]) for r in data["results"]]


def test_the_cluster_gives_the_local_pool_s_verdicts_on_the_catalog_and_20_generated_sim_cases(head, tmp_path):
    common = ("--allow-skips", "unsupported", "--budget", "0", "--no-capture")
    local_status, local = _run(tmp_path, "--workers", "2", *common, backend="sim", cases="catalog", examples=20,
                               name="local")
    ray_status, ray = _run(tmp_path, "--cluster", head["address"], *common, backend="sim", cases="catalog", examples=20,
                           name="ray")
    assert _verdicts(ray) == _verdicts(local) and ray_status == local_status == 0
    assert ray["selection"]["fingerprint"] == local["selection"]["fingerprint"]
    assert ray["execution"]["executor"] == "ray" and ray["execution"]["resources"]["CPU"] == 2
    assert all(r["node"] and "(" in r["node"] for r in ray["results"])          # host (node address)


def test_a_worker_killed_mid_run_leaves_every_case_in_the_report(head, tmp_path):
    """Kill a busy kernel worker from outside (SIGKILL: the Slow kernel writes its pid, and it runs in the
    worker process the Ray task's supervisor started on the node); its case runs again there and every
    case is reported once."""
    head["pids"].mkdir(exist_ok=True)
    killed = []

    def killer():
        deadline = time.monotonic() + 300
        while not killed and time.monotonic() < deadline:
            busy = [int(p.name) for p in head["pids"].iterdir()]
            if busy:
                os.kill(busy[0], signal.SIGKILL)     # a Ray worker of the head this test started
                killed.append(busy[0])
            time.sleep(0.2)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    status, data = _run(tmp_path, "--cluster", head["address"], backend="tests/cases/run_doubles.py:Slow",
                        cases="catalog", examples=0)
    thread.join(timeout=5)
    assert killed, "no busy worker was seen"
    names = [r["name"] for r in data["results"]]
    assert len(names) == len(set(names)) == 18
    again = [r for r in data["results"] if r["attempts"] == 2]
    assert len(again) == 1 and again[0]["verdict"] == "pass" and "killed by SIGKILL" in again[0]["message"]
    assert status == 0 and {r["verdict"] for r in data["results"]} == {"pass"}


def test_a_case_whose_worker_dies_every_time_is_an_error_the_rest_pass(head, tmp_path, monkeypatch):
    head["deaths"].mkdir(exist_ok=True)
    (head["deaths"] / "always").write_text("")
    try:
        status, data = _run(tmp_path, "--cluster", head["address"], backend="tests/cases/run_doubles.py:DiesOnTheTailCase")
    finally:
        for f in head["deaths"].iterdir():
            f.unlink()
    tail = data["results"][1]
    assert (tail["name"], tail["verdict"], tail["attempts"]) == ("edge_tail_tile_3_tokens", "error", 2)
    assert "killed by SIGKILL during the call; so did the 1 new process(es) it ran again in" in tail["message"]
    assert [r["verdict"] for r in data["results"][::2]] == ["pass", "pass"] and status == 1


def test_a_case_whose_worker_dies_once_runs_again_and_passes(head, tmp_path):
    head["deaths"].mkdir(exist_ok=True)
    try:
        status, data = _run(tmp_path, "--cluster", head["address"], backend="tests/cases/run_doubles.py:DiesOnTheTailCase")
        assert len(list(head["deaths"].glob("died-*"))) == 1
    finally:
        for f in head["deaths"].iterdir():
            f.unlink()
    assert status == 0 and [(r["verdict"], r["attempts"]) for r in data["results"]] == [("pass", 1), ("pass", 2),
                                                                                         ("pass", 1)]


def test_failures_are_captured_once_by_the_driver(head, tmp_path, monkeypatch):
    saved = []
    real = regressions.save
    monkeypatch.setattr(regressions, "save", lambda reg, **kw: saved.append(reg.id) or real(reg, **kw))
    status, data = _run(tmp_path, "--cluster", head["address"], backend="tests/cases/run_doubles.py:PerturbOne")
    ids = regressions.list_ids(directory=tmp_path / "regs")
    assert status == 1 and sorted(saved) == sorted(ids) and len(ids) == 3      # each written here, once
    assert {r["replay"].rsplit(" ", 1)[1] for r in data["results"]} == set(ids)


def test_a_two_law_search_with_2_tasks_per_law(head, tmp_path):
    run = search("tests/cases/run_doubles.py:PerturbOne", ("acceptance", "outputs_finite"), examples=20, tasks=2,
                 cluster=head["address"], shrink_s=5, regressions_dir=tmp_path / "regs")
    assert [(t.law, t.task) for t in run.tasks] == [("acceptance", 0), ("acceptance", 1), ("outputs_finite", 0),
                                                    ("outputs_finite", 1)]
    assert len({t.seed for t in run.tasks}) == 4 and all(t.node for t in run.tasks)
    failed = [t for t in run.tasks if t.failure]
    assert {t.law for t in failed} == {"acceptance"}                   # +0.5 on one element stays finite
    assert len(run.captured) == 1 and len(os.listdir(tmp_path / "regs")) in (1, 2)   # .json (+ .npz)
    assert {t.replay for t in failed} == {run.captured[0]["replay"]} and run.exit_status == 1


def test_the_golden_mutants_run_on_the_cluster(head, tmp_path):
    out = tmp_path / "m.json"
    status = cli.main(["mutants", "--level", "golden", "--mutants", "missing_o_rescale", "--laws", "acceptance",
                       "--examples", "5", "--no-catalog", "--shrink-seconds", "0", "--cluster", head["address"],
                       "--json", str(out)])
    data = json.loads(out.read_text())
    assert status == 0 and data["mutants"][0]["killed"] and data["baseline"]["failures"] == []


def test_an_unreachable_cluster_is_one_line_and_exit_2_before_any_case(tmp_path, capsys):
    port = _free_port()
    start = time.monotonic()
    status = cli.main(["run", "--backend", "golden", "--cases", SMALL, "--cluster", f"ray=127.0.0.1:{port}",
                       "--regressions", str(tmp_path / "regs")])
    out = capsys.readouterr()
    assert status == 2 and time.monotonic() - start < 60
    assert out.err == (f"pfa-verify: error: --cluster ray=127.0.0.1:{port}: the cluster cannot be reached at "
                       f"127.0.0.1:{port} (Connection refused); 'ray start --head --port PORT' starts one, and prints "
                       "its address\n")
    assert "cases:" not in out.out


def test_a_cluster_without_npus_refuses_the_npu_backend_before_any_case(head, tmp_path, capsys, monkeypatch):
    """The npu backend under the test-only torch_npu stand-in (tests/kernels/npu_standin.py) asks for one NPU
    per case: a cluster with none is a one-line exit 2."""
    monkeypatch.setenv("PFA_VERIFY_STANDIN_DEVICES", "1")
    status = cli.main(["run", "--backend", "tests/kernels/npu_standin.py:npu", "--cases", SMALL,
                       "--cluster", head["address"], "--regressions", str(tmp_path / "regs")])
    out = capsys.readouterr()
    assert status == 2 and "cases:" not in out.out
    assert out.err.startswith(f"pfa-verify: error: --cluster {head['address']}: the cluster has no NPU resource, which "
                              "every task of this command needs (NPU 1 each); it has CPU 2")
