"""cases/report.py: the JSON report against its schema (cases/report.schema.json), the table, the exit status."""
from __future__ import annotations

import copy
import json

import pytest
from rich.console import Console

from cases import cli, report
from cases import run as runner

PERTURB = "tests/cases/run_doubles.py:PerturbOne"
CODEC = "tests/cases/run_doubles.py:CalculatorCodec"


def _args(tmp_path, backend, cases="edge_causal_s1_3_short,edge_tail_tile_3_tokens", examples=1):
    return cli.build_parser().parse_args(["run", "--backend", backend, "--cases", cases, "--examples", str(examples),
                                          "--regressions", str(tmp_path / "regs")])


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    return runner.execute(_args(tmp_path_factory.mktemp("fail"), PERTURB))


@pytest.fixture(scope="module")
def codec_run(tmp_path_factory):
    return runner.execute(_args(tmp_path_factory.mktemp("codec"), CODEC, examples=0))


def test_json_of_a_failing_run_validates_against_the_schema(failing_run, tmp_path):
    path = report.write_json(failing_run, tmp_path / "r.json")
    data = json.loads(path.read_text())       # allow_nan=False when written: strict JSON
    assert report.check_schema(data) == []
    assert data["summary"]["exit_status"] == 1 == report.exit_status(failing_run)
    assert {"pfa-verify", "torch", "pypto", "platform"} <= set(data["versions"])
    fails = [r for r in data["results"] if r["verdict"] == "fail"]
    assert fails and all(r["replay"].startswith("pfa-verify cases --dir ") and " replay " in r["replay"] for r in fails)


def test_json_of_a_two_codec_run_validates(codec_run):
    data = report.to_json(codec_run)
    assert report.check_schema(data) == []
    assert [r["reference"] for r in data["results"]] == ["spec", "pypto-0.2.0-calculator"] * 2
    assert report.exit_status(codec_run) == 0


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["results"][0].pop("verdict"), "$.results[0]: 'verdict' is a required property"),
    (lambda d: d["results"][0].update(verdict="maybe"), "$.results[0].verdict: 'maybe' is not one of"),
    (lambda d: d["results"][0].update(mismatched=-1), "$.results[0].mismatched: -1 is less than the minimum of 0"),
    (lambda d: d["results"][0].update(worst_index={"row": 0}), "is not valid under any of the given schemas"),
    (lambda d: d["summary"].update(extra=1), "('extra' was unexpected)"),
    (lambda d: d["summary"]["skipped_by_kind"].update(lazy=1), "$.summary.skipped_by_kind: 'lazy' is not one of"),
    (lambda d: d.update(schema="other/2"), "$.schema: 'pfa-verify-run-report/2' was expected"),
], ids=["missing field", "bad verdict", "negative count", "bad worst_index", "extra summary key", "bad skip kind",
        "other schema"])
def test_schema_check_rejects(failing_run, mutate, expected):
    data = copy.deepcopy(report.to_json(failing_run))
    mutate(data)
    errors = report.check_schema(data)
    assert any(expected in e for e in errors), errors


def test_table_has_the_columns_and_verdicts(failing_run):
    console = Console(width=220, record=True, force_terminal=False)
    report.print_report(failing_run, console)
    text = console.export_text()
    for column in ("case", "source", "backend", "reference", "max abs", "max rel", "mismatched/total",
                   "worst (row, head, d)", "verdict"):
        assert column in text
    assert "fail: kernel logic" in text and "(0, 1, 3)" in text
    assert "-> FAILED" in text.splitlines()[-1]
    assert text.count("Replay: pfa-verify cases --dir ") == report.summarize(failing_run)["failing_cases"]


def test_uncounted_codec_difference_is_shown(codec_run):
    console = Console(width=220, record=True, force_terminal=False)
    report.print_report(codec_run, console)
    text = console.export_text()
    assert "fail (not counted): backend codec" in text and "-> OK" in text
