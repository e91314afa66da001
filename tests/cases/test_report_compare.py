"""cases/reporting/report_compare.py: ``pfa-verify compare A.json B.json`` (issue 20): same selection side by side,
verdicts that differ, worst error over the tolerance, refusal of different selections (exit 2).

Reports come from real runs of the golden and of test doubles (tests/cases/run_doubles.py), so the
suite needs no kernel: PerturbOne is a kernel-logic bug, CalculatorCodec a kernel whose only
difference from the spec is its platform codec (its spec comparison fails and does not count)."""
from __future__ import annotations

import json
import re

import pytest
import torch

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.reporting import report_compare as rc

CASES = "edge_causal_s1_3_short,edge_tail_tile_3_tokens"
PERTURB = "tests/cases/run_doubles.py:PerturbOne"
CODEC = "tests/cases/run_doubles.py:CalculatorCodec"


def _report(folder, backend, *extra, examples=1) -> str:
    stem = re.sub(r"\W", "_", backend)[-20:]
    path = folder / f"{stem}-{len(extra)}.json"
    cli.main(["run", "--backend", backend, "--cases", CASES, "--examples", str(examples), "--no-capture",
              "--regressions", str(folder / "regs"), "--json", str(path), *extra])
    return str(path)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    return {"golden": _report(folder, "golden"), "perturb": _report(folder, PERTURB),
            "codec": _report(folder, CODEC), "seed1": _report(folder, "golden", "--seed", "1")}


def test_a_kernel_logic_bug_beside_the_golden(reports, tmp_path, capsys):
    status = cli.main(["compare", reports["golden"], reports["perturb"], "--html", str(tmp_path / "c.html")])
    out = capsys.readouterr().out
    assert status == 1
    c = rc.compare(rc.load_report(reports["golden"]), rc.load_report(reports["perturb"]))
    assert [r.name for r in c.rows] == ["edge_causal_s1_3_short", "edge_tail_tile_3_tokens", "generated_00"]
    assert all(r.a.verdict == "pass" and r.b.verdict == "fail" and r.b.detail == "kernel logic" for r in c.rows)
    assert all(r.a.worst == 0.0 for r in c.rows)       # the loop golden is the vectorized one, bit for bit
    assert "3 cases, the same selection" in out and "0 with the same verdict, 3 differ: pass in A, fail in B: 3" in out
    assert out.count("differs") >= 3 and "-> DIFFERENT" in out


def test_worst_error_is_in_units_of_the_tolerance(reports):
    """Held against the golden directly: PerturbOne adds 0.5 at (row 0, head 1, d 3) in bf16."""
    c = rc.compare(rc.load_report(reports["golden"]), rc.load_report(reports["perturb"]))
    case = load_catalog()["edge_tail_tile_3_tokens"]
    g = golden.paged_attention_fp8(**case.inputs().kwargs()).float()
    k = g.clone().to(torch.bfloat16)
    k[0, 1, 3] += torch.tensor(0.5, dtype=torch.bfloat16)
    expected = float(((k.float() - g).abs() / (1e-4 + g.abs() / 128)).max())
    row = next(r for r in c.rows if r.name == "edge_tail_tile_3_tokens")
    assert row.b.worst == pytest.approx(expected, rel=1e-6) and expected > 100


def test_an_uncounted_codec_difference_keeps_the_same_verdict(reports, capsys):
    status = cli.main(["compare", reports["golden"], reports["codec"]])
    out = capsys.readouterr().out
    assert status == 0 and "-> SAME VERDICTS" in out
    c = rc.compare(rc.load_report(reports["golden"]), rc.load_report(reports["codec"]))
    for row in c.rows:
        refs = {ref: (ratio, counts) for ref, ratio, counts in row.b.ratios}
        assert refs["spec"][1] is False and refs["spec"][0] > 1            # fails, shown, not counted
        assert refs["pypto-0.2.0-calculator"][1] is True and row.b.worst == refs["pypto-0.2.0-calculator"][0] <= 1
    assert "not counted]" in out


def test_different_selections_are_refused_in_one_line(reports, capsys):
    status = cli.main(["compare", reports["golden"], reports["seed1"]])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("pfa-verify: error: ") and "did not check the same cases" in err
    assert "generated (1 vs 1 cases)" in err and "seed 0 vs 1" in err and "catalog" not in err.split("differing:")[1].split(";")[0]


@pytest.mark.parametrize("content, expected", [
    (None, "cannot read it"), ("{not json", "is not JSON"), ('{"schema": "pfa-verify-run-report/2"}', ("has schema "
     "'pfa-verify-run-report/2'")), ('{"schema": "pfa-verify-run-report/5"}', "does not match pfa-verify-run-report/5")],
    ids=["missing", "not json", "older schema", "invalid"])
def test_unreadable_reports_are_one_line_errors(reports, tmp_path, capsys, content, expected):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert cli.main(["compare", reports["golden"], str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err and "bad.json" in err


def _result(verdict, *, counts=True, ratio=0.5, reference="spec", **extra):
    return {"name": "c", "source": "catalog", "reference": reference, "verdict": verdict, "counts": counts,
            "worst_ratio": ratio, "message": extra.pop("message", ""), **extra}


@pytest.mark.parametrize("results, verdict, worst", [
    ([_result("pass"), _result("pass", reference="calc", ratio=0.1)], "pass", 0.5),
    ([_result("fail", counts=False, ratio=97.0), _result("pass", reference="calc", ratio=0.2)], "pass", 0.2),
    ([_result("fail", ratio=None, attribution="kernel logic")], "fail", float("inf")),
    ([_result("error", ratio=None, message="KernelRunError: boom\nmore")], "error", None),
    ([_result("skipped", counts=False, ratio=None, skip_kind="limit")], "skipped", None),
], ids=["passes", "uncounted failure", "non-finite failure", "error", "skip"])
def test_case_verdict_follows_the_runs_rule(results, verdict, worst):
    v = rc.case_verdict(results)
    assert v.verdict == verdict and v.worst == worst


def test_html_is_self_contained_with_one_row_per_case(reports, tmp_path):
    c = rc.compare(rc.load_report(reports["golden"]), rc.load_report(reports["perturb"]))
    text = rc.write_html(c, tmp_path / "c.html").read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.count('<tr class="differs">') == 3
    assert not re.search(r"https?://|<script|<link|@import|src=", text, re.I)
    assert text.count("<circle") == 3 and "kernel sha256" in text
    data = json.loads(open(reports["perturb"]).read())
    assert data["backend"]["kernel"]["sha256"] in text
