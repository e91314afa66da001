"""Captures of nondeterministic kernels are kept: ``cases prune`` removes a capture only after all of its
replays pass (10 by default), a capture whose kernel answered the same inputs differently (a pass and a
failure, or other output bits: cases/running/answers.py) is marked ``nondeterministic`` in its record and
never pruned, ``cases replay --times N`` says NONDETERMINISTIC (exit 1) when it sees both, and a run's
shrinking marks the captures of such a kernel (Hypothesis' Flaky included) instead of losing the sighting.
The kernels are real backend files (tests/kernels/unsteady_kernels.py), run through the command line."""
from __future__ import annotations

import contextlib
import io
import json
from types import SimpleNamespace

import pytest
import torch
from hypothesis import strategies as st

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.running.answers import Answers, Recorded
from pfa_verify.cases.running.shrink import Hunt, hunt, nondeterminism
from pfa_verify.kernels.backends.faults import KernelFault
from pfa_verify.properties.rule.case import Case
from tests.checkout import REPO_ROOT

RACY = "tests/kernels/unsteady_kernels.py:make_racy"      # wrong on every second call of its process
BUGGY = "tests/kernels/unsteady_kernels.py:make_buggy"    # wrong on every call
# Two KV heads: the rolled V scales show (one head would hide the bug).
CASE = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=16))


def _capture(folder, backend, case=CASE) -> str:
    reg = regressions.Regression.from_failure("acceptance", backend, case, {}, "Kernel output vs golden not close")
    regressions.save(reg, directory=folder)
    return reg.id


def _cli(*argv):
    """The command line in this process (its kernels still run in supervised worker processes): exit
    status, stdout and stderr, the regressions folder only what ``argv`` names."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.delenv(regressions.REGRESSIONS_ENV, raising=False)
        patch.chdir(REPO_ROOT)
        code = cli.main(list(argv))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _record(folder, rid) -> dict:
    return json.loads((folder / f"{rid}.json").read_text())


def test_prune_keeps_the_capture_of_a_kernel_wrong_on_every_second_call(tmp_path):
    """The racy kernel's first replay passes (its first call is right): a prune of one replay removed the
    capture of a real failure. Now its second replay fails: kept and marked; the buggy kernel's capture
    still fails and is kept; the golden's passes 10 of 10 and is removed."""
    racy, buggy, passing = _capture(tmp_path, RACY), _capture(tmp_path, BUGGY), _capture(tmp_path, "golden")
    before = _record(tmp_path, racy)
    done = _cli("cases", "--regressions", str(tmp_path), "prune")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert (f"kept {racy}: nondeterministic (seen 1 of 2 replays failed and 1 passed; the kernel answered output "
            in out), out
    assert f"marked {racy} nondeterministic: `cases prune` keeps it)" in out
    assert f"kept {buggy}: still fails on {BUGGY}" in out
    assert f"removed {passing} (passes 10 of 10 replays on golden)" in out
    assert regressions.list_ids(directory=tmp_path) == sorted([racy, buggy])
    after = _record(tmp_path, racy)
    assert after["nondeterministic"]["seen"].startswith("cases prune: 1 of 2 replays failed and 1 passed")
    # the mark is no part of the id: the record is what it was, and still loads under its id
    assert {k: v for k, v in after.items() if k != "nondeterministic"} == \
           {k: v for k, v in before.items() if k != "nondeterministic"}
    assert regressions.load(racy, directory=tmp_path).nondeterministic == after["nondeterministic"]
    # marked: kept without a replay, and listed as such
    again = _cli("cases", "--regressions", str(tmp_path), "prune", "--backend", RACY)
    assert f"kept {racy}: nondeterministic (seen cases prune: 1 of 2 replays failed and 1 passed" in again.stdout
    listed = _cli("cases", "--regressions", str(tmp_path), "list")
    assert any(line.startswith(racy) and "[nondeterministic]" in line for line in listed.stdout.splitlines())


def test_a_dry_run_prune_says_nondeterministic_and_writes_nothing(tmp_path):
    racy = _capture(tmp_path, RACY)
    before = (tmp_path / f"{racy}.json").read_bytes()
    done = _cli("cases", "--regressions", str(tmp_path), "prune", "--dry-run")
    assert f"kept {racy}: nondeterministic (seen 1 of 2 replays failed and 1 passed" in done.stdout
    assert "; not marked: --dry-run)" in done.stdout
    assert (tmp_path / f"{racy}.json").read_bytes() == before


def test_replay_times_says_nondeterministic_and_never_passes(tmp_path):
    racy, buggy = _capture(tmp_path, RACY), _capture(tmp_path, BUGGY)
    done = _cli("cases", "--regressions", str(tmp_path), "replay", racy, "--times", "3")
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    # the first call is right, the second wrong; later ones as the failing replays' probes shift the count
    outcomes = [line.rsplit(": ", 1)[1] for line in lines if line.startswith("replay ")]
    assert len(outcomes) == 3 and outcomes[:2] == ["PASS", "FAIL"], done.stdout
    said = f"{outcomes.count('FAIL')} of 3 replays failed and {outcomes.count('PASS')} passed"
    assert lines[-1].startswith(f"NONDETERMINISTIC: {said}; the kernel answered output ")
    assert lines[-1].endswith(f"(marked {racy} nondeterministic: `cases prune` keeps it)")
    assert "PASS: the captured failure" not in done.stdout
    assert _record(tmp_path, racy)["nondeterministic"]["seen"].startswith(f"cases replay --times 3: {said}")
    # a deterministic failure, replayed three times: FAIL, not nondeterministic, not marked
    done = _cli("cases", "--regressions", str(tmp_path), "replay", buggy, "--times", "3")
    assert done.returncode == 1 and "NONDETERMINISTIC" not in done.stdout
    assert done.stdout.count(": FAIL") == 3 and "\nFAIL\nKernel output vs golden not close" in done.stdout
    assert _record(tmp_path, buggy)["nondeterministic"] is None


def test_a_run_marks_the_captures_of_a_racy_kernel_found_while_shrinking(tmp_path):
    """``run``: a generated case that failed in the run is drawn again while its group is shrunk; the racy
    kernel answers it with other bits: the group's capture is marked, and prune keeps it unreplayed."""
    regs = tmp_path / "regs"
    # Seed 1: its shrink meets a case of the run on a call of the other parity (which seeds do is the draws' affair)
    done = _cli("run", "--backend", RACY, "--cases", "generated", "--examples", "6", "--workers", "1", "--seed", "1",
                "--regressions", str(regs), "--shrink-seconds", "20")
    assert done.returncode == 1, done.stdout + done.stderr
    ids = regressions.list_ids(directory=regs)
    assert ids and "; nondeterministic: output " in done.stdout
    for rid in ids:
        seen = _record(regs, rid)["nondeterministic"]["seen"]
        assert " in the run), then output " in seen and "(while shrinking) on the same inputs" in seen, seen
    pruned = _cli("cases", "--regressions", str(regs), "prune")
    assert all(f"kept {rid}: nondeterministic (seen output " in pruned.stdout for rid in ids), pruned.stdout
    assert regressions.list_ids(directory=regs) == ids


@pytest.mark.parametrize("argv, message", [(["replay", "x", "--times", "0"], "--times 0 must be at least 1"),
                                           (["prune", "--replays", "0"], "--replays 0 must be at least 1")])
def test_zero_replays_is_a_usage_error(tmp_path, capsys, argv, message):
    assert cli.main(["cases", "--regressions", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err == f"pfa-verify: error: {message}\n"


def test_a_recapture_keeps_the_mark(tmp_path):
    racy = _capture(tmp_path, RACY)
    assert regressions.mark_nondeterministic(racy, "seen by a test", directory=tmp_path)
    assert not regressions.mark_nondeterministic(racy, "seen again", directory=tmp_path)   # the first is kept
    assert _capture(tmp_path, RACY) == racy                                               # the same failure again
    assert _record(tmp_path, racy)["nondeterministic"]["seen"] == "seen by a test"


class _Flips:
    """A backend double whose answer to the same inputs changes on every call, and one that raises."""
    name = "flips"

    def __init__(self):
        self.calls = 0

    def paged_attention_fp8(self, q, **kwargs):
        self.calls += 1
        return torch.full((2,), float(self.calls))

    def qk_matmul_scale(self, q, k, **kwargs):
        raise KernelFault("its worker ended", kind="ended")


def test_recorded_hears_other_bits_for_the_same_inputs_and_delegates_the_rest():
    answers = Answers()
    backend = Recorded(_Flips(), answers, "here")
    q = torch.arange(4.0)
    backend.paged_attention_fp8(q.clone(), s2_tile=16)
    backend.paged_attention_fp8(q + 1, s2_tile=16)           # another question: no comparison
    assert answers.seen() is None and backend.name == "flips" and backend.calls == 2
    backend.paged_attention_fp8(q.clone(), s2_tile=16)       # the first question again, another answer
    assert answers.seen() is not None and answers.seen().endswith("(here) on the same inputs")
    backend.paged_attention_fp8(q.clone(), s2_tile=32)       # a scalar is part of the question
    assert len(answers.differences) == 1
    with pytest.raises(KernelFault):
        backend.qk_matmul_scale(q, q)
    backend.where = "there"
    with pytest.raises(KernelFault):
        backend.qk_matmul_scale(q, q)
    assert len(answers.differences) == 1                     # a call that never came back is no answer


def test_hunt_says_when_hypothesis_final_replay_of_the_failure_passed():
    """A check that fails on an example the first time and passes it the next: Hypothesis' final replay of
    the smallest failure passes and it raises Flaky. hunt keeps the failure, says so in ``unreliable``
    instead of losing it, and nondeterminism() turns that into the capture's mark."""
    seen: set[int] = set()

    def fails_once(n: int) -> None:
        if n >= 10 and n not in seen:
            seen.add(n)
            raise AssertionError(f"{n} fails once")
    found = hunt(st.integers(0, 1000), fails_once, seed=1, examples=200, shrink_s=30)
    assert found.error is not None and found.unreliable is not None
    assert "Hypothesis replayed the smallest failure and it passed" in nondeterminism(Answers(), found, lambda: None)
    assert nondeterminism(Answers(), found, lambda: "SIGINT") is None     # an interrupt makes every attempt pass

    def always(n: int) -> None:
        if n >= 10:
            raise AssertionError("fails")
    steady = hunt(st.integers(0, 1000), always, seed=1, examples=200, shrink_s=30)
    assert steady.error is not None and steady.unreliable is None and nondeterminism(Answers(), steady, lambda: None) is None
    seen.clear()
    cut = hunt(st.integers(0, 1000), fails_once, seed=1, examples=200, shrink_s=30, shrink_calls=0)
    assert cut.error is not None and cut.unreliable is None       # the final replay was over budget: no evidence
    assert nondeterminism(Answers(), Hunt(), lambda: None) is None


def test_run_replays_a_capture_marked_nondeterministic_as_often_as_prune_asks(tmp_path):
    """One passing replay of a marked capture proves little: ``run`` replays it PASSING_REPLAYS times, each
    its own row, and the racy kernel fails some of them (exit 1); the first replay alone would have passed."""
    racy = _capture(tmp_path, RACY)
    assert regressions.mark_nondeterministic(racy, "a test", directory=tmp_path)
    report = tmp_path / "report.json"
    done = _cli("run", "--backend", RACY, "--cases", racy, "--examples", "0", "--regressions",
                str(tmp_path), "--no-capture", "--json", str(report))
    rows = json.loads(report.read_text())["results"]
    assert [r["name"] for r in rows] == [racy] + [f"{racy}#{k}" for k in range(2, regressions.PASSING_REPLAYS + 1)]
    assert rows[0]["verdict"] == "pass" and {r["verdict"] for r in rows} == {"pass", "fail"}
    assert done.returncode == 1, done.stdout + done.stderr
