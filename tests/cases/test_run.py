"""cases/run.py: ``pfa-verify run`` (issue 5): order, both codecs, capture, exit status, workers, skips."""
from __future__ import annotations

import json
from types import SimpleNamespace

import golden
from cases import cli, regressions
from cases import run as runner
from properties.case import Case

SMALL = "edge_causal_s1_3_short,edge_tail_tile_3_tokens"
PERTURB = "tests/cases/run_doubles.py:PerturbOne"
CODEC = "tests/cases/run_doubles.py:CalculatorCodec"


def _run(tmp_path, *extra, backend="golden", cases=SMALL, examples=0):
    report = tmp_path / "report.json"
    status = cli.main(["run", "--backend", backend, "--cases", cases, "--examples", str(examples),
                       "--regressions", str(tmp_path / "regs"), "--json", str(report), *extra])
    return status, json.loads(report.read_text())


def test_golden_run_passes_with_exit_0(tmp_path, capsys):
    status, data = _run(tmp_path, examples=2)
    assert status == 0
    assert [r["source"] for r in data["results"]] == ["catalog", "catalog", "generated", "generated"]
    assert {r["verdict"] for r in data["results"]} == {"pass"}
    assert data["summary"]["exit_status"] == 0 and data["summary"]["failed"] == 0
    assert "-> OK" in capsys.readouterr().out


def test_failing_backend_exits_1_captures_and_prints_the_replay(tmp_path, capsys):
    status, data = _run(tmp_path, backend=PERTURB)
    out = capsys.readouterr().out
    assert status == 1 and data["summary"]["failing_cases"] == 2
    ids = regressions.list_ids(directory=tmp_path / "regs")
    assert len(ids) == 2
    for rid in ids:
        assert f"Replay: pfa-verify cases replay {rid}" in out
    r = data["results"][0]
    assert r["verdict"] == "fail" and r["mismatched"] == 1 and r["attribution"] == "kernel logic"
    assert r["worst_index"] == {"row": 0, "b": 0, "i": 0, "head": 1, "d": 3}
    assert r["message"].endswith(r["replay"])
    # the capture replays in the cases CLI and fails the same way
    assert cli.main(["cases", "--dir", str(tmp_path / "regs"), "replay", ids[0]]) == 1


def test_backend_codec_gives_two_comparisons_and_only_the_codec_one_counts(tmp_path):
    status, data = _run(tmp_path, backend=CODEC, cases="edge_causal_s1_3_short")
    spec, own = data["results"]
    assert (spec["reference"], own["reference"]) == ("spec", "pypto-0.2.0-calculator")
    assert spec["verdict"] == "fail" and spec["counts"] is False and spec["attribution"] == "backend codec"
    assert own["verdict"] == "pass" and own["counts"] is True
    assert status == 0 and data["summary"]["not_counted"] == 1
    assert not regressions.list_ids(directory=tmp_path / "regs")


def test_regressions_run_first(tmp_path):
    case = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16,
                                            s2_tile=16))
    reg = regressions.Regression.from_failure("acceptance", "golden", case, {}, "captured earlier")
    regressions.save(reg, directory=tmp_path / "regs")
    status, data = _run(tmp_path, cases=f"edge_causal_s1_3_short,{reg.id}", examples=1)
    assert [(r["name"], r["source"]) for r in data["results"]] == [
        (reg.id, "regression"), ("edge_causal_s1_3_short", "catalog"), ("generated_00", "generated")]
    assert status == 0


def test_workers_merge_into_one_report_in_order(tmp_path):
    serial_status, serial = _run(tmp_path, backend=PERTURB, examples=2)
    par_status, par = _run(tmp_path, "--workers", "2", backend=PERTURB, examples=2)
    assert serial_status == par_status == 1
    keep = ("name", "source", "reference", "verdict", "mismatched", "total", "worst_index", "replay")
    assert [{k: r[k] for k in keep} for r in par["results"]] == [{k: r[k] for k in keep} for r in serial["results"]]


def test_unknown_case_name_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["run", "--backend", "golden", "--cases", "no_such_case", "--examples", "0",
                     "--regressions", str(tmp_path)]) == 2
    assert "no_such_case" in capsys.readouterr().err


def test_generated_cases_repeat_for_a_seed():
    a = runner.generated_cases(4, 11, kernel_only=False)
    assert len(a) == 4 and a == runner.generated_cases(4, 11, kernel_only=False)
    assert all(c.config.head_dim == 128 for c in runner.generated_cases(2, 11, kernel_only=True))


def test_sim_skips_what_it_cannot_run_here_with_the_reason():
    sim = SimpleNamespace(name="sim")
    cat = {name: case for name, case in __import__("cases.catalog").catalog.load_catalog().items()}
    assert "over the sim execute limit" in runner.skip_reason(sim, cat["pfa_fp8_b16_s1_1_s2_8k_nkv_1"])
    assert "head_dim" in runner.skip_reason(sim, cat["edge_small_blocks_ragged"])
    assert runner.skip_reason(sim, cat["pfa_fp8_b2_s1_1_s2_1k"]) is None
    assert runner.skip_reason(sim, cat["pfa_fp8_b16_s1_1_s2_8k_nkv_1"], max_scores=0) is None   # 0: no limit
    assert "limit of 100" in runner.skip_reason(sim, cat["pfa_fp8_b2_s1_1_s2_1k"], max_scores=100)
    assert runner.skip_reason(SimpleNamespace(name="golden"), cat["pfa_fp8_b16_s1_1_s2_8k_nkv_1"]) is None
    own = SimpleNamespace(name="sim", skip_reason=lambda cfg: "mine")
    assert runner.skip_reason(own, cat["pfa_fp8_b2_s1_1_s2_1k"]) == "mine"


def test_spent_budget_skips_the_rest(tmp_path):
    status, data = _run(tmp_path, "--budget", "1", backend=PERTURB, examples=0)
    # the budget is checked when a case starts; at least one ran, a skipped one says why
    verdicts = [r["verdict"] for r in data["results"]]
    assert verdicts[0] == "fail"
    for r in data["results"]:
        if r["verdict"] == "skipped":
            assert "time budget" in r["message"] and r["counts"] is False
