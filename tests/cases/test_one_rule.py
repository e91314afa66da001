"""One acceptance rule everywhere: a case captured on a backend with its own codec gets the same
verdict from ``pfa-verify run``, ``cases replay``, ``cases prune`` and the pytest replay.

Two doubles declare pypto's calculator codec, as the sim backend does: one is correct except for that
codec (it fails the spec-codec comparison, which does not count), one has a real logic bug (it fails
under its own codec too). Before the one rule, the first passed in ``run`` and failed in ``replay``,
``prune`` and pytest, which compared under the spec codec only."""
from __future__ import annotations

import json

import pytest

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.properties.rule.case import Case

CASE = Case(golden.PagedAttentionConfig(batch=2, s1=1, s2=300, nq=4, nkv=2, head_dim=32, block_size=32, s2_tile=64,
                                        kv_act_seqs=(300, 70)), seed=3)
DOUBLES = {"codec only": ("tests/cases/run_doubles.py:CalculatorCodec", "pass"),
           "logic bug": ("tests/cases/run_doubles.py:calculator_codec_logic_bug", "fail")}


@pytest.mark.parametrize("which", list(DOUBLES))
def test_the_same_verdict_in_run_replay_prune_and_pytest(tmp_path, capsys, monkeypatch, suite_pytester, which):
    backend, expected = DOUBLES[which]
    folder = tmp_path / "regs"
    reg = regressions.Regression.from_failure("acceptance", backend, CASE, {}, "captured on the calculator")
    regressions.save(reg, directory=folder)
    verdicts = {}

    report = tmp_path / "run.json"
    status = cli.main(["run", "--backend", backend, "--cases", reg.id, "--examples", "0", "--regressions",
                       str(folder), "--json", str(report)])
    results = json.loads(report.read_text())["results"]
    verdicts["run"] = "pass" if status == 0 else "fail"
    assert [r["reference"] for r in results] == ["spec", "pypto-0.2.0-calculator"]
    assert results[0]["verdict"] == "fail" and results[0]["counts"] is (which == "logic bug")

    verdicts["replay"] = "pass" if cli.main(["cases", "--regressions", str(folder), "replay", reg.id]) == 0 else "fail"
    capsys.readouterr()
    # one replay: the verdict is the rule's on the same bits (the default 10 guard against races, test_nondeterministic_captures)
    cli.main(["cases", "--regressions", str(folder), "prune", "--dry-run", "--replays", "1"])
    verdicts["prune"] = "pass" if f"would remove {reg.id}" in capsys.readouterr().out else "fail"

    monkeypatch.setenv("PFA_VERIFY_REGRESSIONS", str(folder))
    suite_pytester.makepyfile(test_replay="from tests.cases.test_replay_captured import *  # noqa: F401,F403\n")
    # -k: this capture alone; the shipped captures are replayed beside it otherwise, on their own verdicts
    result = suite_pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--backend", backend,
                                                 "-k", reg.id, timeout=300)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1, result.stdout.str()
    assert set(outcomes) <= {"passed", "failed", "deselected"}, result.stdout.str()
    verdicts["pytest"] = "pass" if result.ret == 0 else "fail"

    assert verdicts == dict.fromkeys(("run", "replay", "prune", "pytest"), expected)
