"""``pfa-verify search`` here (no cluster): the coverage of the examples its tasks drew (issue 30); the
minimum of examples, every --laws group, text from the kernel, progress and --fail-fast (issue 53)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import strategies as st

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.running.search import LAW_GROUPS, law_names, law_verdicts, search
from pfa_verify.cases.running.search_channel import Channel, TaskChannel
from pfa_verify.properties.search import law_examples, laws
from pfa_verify.properties.search.law_examples import AT12_LAWS, BACKEND_LAWS, PAGED_LAWS


def test_a_search_reports_the_coverage_of_every_example_it_drew(tmp_path, capsys):
    report = tmp_path / "search.json"
    status = cli.main(["search", "--backend", "golden", "--laws", "acceptance,garbage_unread", "--examples", "8",
                       "--tasks", "2", "--no-capture", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert status == 0 and data["examples_run"] == 16
    coverage = data["coverage"]
    assert coverage["cases"] == 16
    # every example falls in exactly one distribution bin and one S1 bin: the counts add up to the examples
    for family in ([f"distribution_{d}" for d in golden.DISTRIBUTIONS], ["s1_1", "s1_2", "s1_3_plus"]):
        assert sum(coverage["bins"][name]["hits"] for name in family) == 16, family
    assert "crosses hit by 16 law examples" in out and out.index("Coverage:") < out.index("search on golden")


# --- issue 53: a law holds on evidence; every --laws group; text from the kernel; progress and --fail-fast ------

def _search(tmp_path, capsys, *args: str) -> tuple[int, str, dict]:
    report = tmp_path / "search.json"
    status = cli.main(["search", *args, "--no-capture", "--json", str(report)])
    return status, capsys.readouterr().out, json.loads(report.read_text())


@pytest.mark.parametrize("command", ["laws", "search"])
def test_every_group_the_help_names_is_taken(command, capsys):
    """--help of laws and search names the groups all, paged, at12: each is taken, alone or mixed with names
    (each law once, in order)."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "all|paged|at12|LAW,..." in shown and "groups (all, paged, at12)" in shown
    assert set(LAW_GROUPS) == {"all", "paged", "at12"}
    assert law_names("at12") == AT12_LAWS and law_names("all") == BACKEND_LAWS
    assert law_names("paged,at12") == PAGED_LAWS + AT12_LAWS
    assert law_names("at12_default_scale,at12,acceptance") == ("at12_default_scale", "at12_acceptance",
                                                                 "at12_fp8_vs_bf16", "acceptance")


def test_a_search_of_the_at12_group_runs_its_three_laws(tmp_path, capsys):
    status, out, data = _search(tmp_path, capsys, "--backend", "golden", "--laws", "at12", "--examples", "2",
                                "--tasks", "1")
    assert status == 0 and tuple(data["laws"]) == AT12_LAWS, out
    assert [r["verdict"] for r in data["law_verdicts"]] == ["held"] * 3


@pytest.mark.parametrize("strategy", [
    st.sampled_from(["a", "b", "c"]),                                   # the space runs out after 3
    # the filter rejects 1023 draws in 1024 (a hash: nothing Hypothesis can aim at); under these seeds
    # Hypothesis gives up after 4 and 3 examples
    st.integers(0, 2**64).filter(lambda n: hashlib.sha256(n.to_bytes(9, "big")).digest()[:2] < b"\x00\x40"),
], ids=["exhausted", "filtered"])
def test_a_law_hypothesis_drew_fewer_examples_for_has_too_few(strategy, tmp_path, capsys, monkeypatch):
    """Examples are counted as the law's calls: where Hypothesis gives fewer than asked (a space it exhausts,
    draws its filters reject), the tasks together checked fewer than the minimum and the law is not held."""
    calls: list = []
    monkeypatch.setattr(law_examples, "examples", lambda law, backend=None: strategy.map(lambda x: (x, {})))
    monkeypatch.setattr(laws, "run", lambda law, backend, case, **params: calls.append(case))
    status, out, data = _search(tmp_path, capsys, "--backend", "golden", "--laws", "outputs_finite",
                                "--examples", "40", "--tasks", "2")
    (row,) = data["law_verdicts"]
    assert status == 1 and row["verdict"] == "too few examples", row
    assert row["examples"] == len(calls) < 20 and "Hypothesis drew no more" in row["detail"]
    assert "laws: 1 too few examples (at least 20 examples each) -> FAILED" in " ".join(out.split())


def test_text_from_the_kernel_is_shown_as_text_in_the_search_table(tmp_path, capsys):
    """A kernel message with rich markup (``[/x]``) and escape sequences: a row of the table, never a
    MarkupError, and nothing in it acts on the terminal."""
    status, out, data = _search(tmp_path, capsys, "--backend", "tests/cases/loud_kernel.py:make", "--laws",
                                "acceptance", "--examples", "1", "--tasks", "1", "--shrink-seconds", "0")
    assert status == 1 and data["law_verdicts"][0]["verdict"] == "error"
    assert "\x1b" not in out and "\u202e" not in out and "[/x] [bold]bold?[/bold]" in out and "\\x1b]0;pwned" in out


def test_counts_come_back_from_pool_processes_and_fail_fast_stops_the_rest():
    """--workers 2: each task's count of examples checked reaches the driver while it runs (the channel of
    cases/running/search_channel.py); the first failure stops the task beside it and keeps the third from
    starting, and none of them holds."""
    events: list = []
    run = search("tests/cases/slow_kernels.py:make_quick", ("gqa_repetition", "outputs_finite", "acceptance"),
                 examples=200, tasks=1, workers=2, seconds=120, shrink_s=0, capture=False, fail_fast=True,
                 min_examples=1, progress=lambda event, task, data: events.append((event, task.law, data)))
    rows = {r["law"]: r for r in law_verdicts(run)}
    assert run.execution["executor"] == "local" and run.exit_status == 1
    assert rows["gqa_repetition"]["verdict"] == "failed", rows
    assert rows["outputs_finite"]["verdict"] in ("stopped", "not run") and rows["outputs_finite"]["examples"] < 200
    assert rows["acceptance"] == rows["acceptance"] | {"verdict": "not run", "detail": "stopped by --fail-fast"}
    counts = [data for event, law, data in events if event == "checked"]
    assert counts and all(n >= 1 and s >= 0 for n, s in counts), events
    assert [e[:2] for e in events if e[0] != "checked"][:2] == [("start", "gqa_repetition"), ("start", "outputs_finite")]


def test_the_channel_shows_what_tasks_wrote_and_ignores_anything_else(tmp_path):
    """A count as written; garbage, a folder or a FIFO in its place (a kernel runs as the same user) reads as
    nothing, never blocks; a stop is seen by every task."""
    channel = Channel()
    try:
        task = TaskChannel(channel.folder, "acceptance", 0)
        assert channel.checked("acceptance", 0) is None and not task.stopped()
        task.checked(1, 0.5)
        assert channel.checked("acceptance", 0) == (1, 0.5)
        for k, make in enumerate((lambda p: p.write_text("lots of examples"), lambda p: p.write_text("-3 1"),
                                  lambda p: p.mkdir(), os.mkfifo)):
            make(Path(channel.folder) / f"outputs_finite.{k}")
            assert channel.checked("outputs_finite", k) is None
        channel.stop()
        assert task.stopped() and TaskChannel(channel.folder, "outputs_finite", 3).stopped()
    finally:
        channel.close()
    assert not Path(channel.folder).exists()
