"""cases/reporting/report.py: the JSON report against its schema (cases/report.schema.json), the table, the exit status."""
from __future__ import annotations

import copy
import hashlib
import json
import re
import socket
from pathlib import Path

import pytest
from markupsafe import escape
from rich.console import Console

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.catalog import CATALOG_PATH
from pfa_verify.cases.data.collect import collect_items, fingerprint, selection
from pfa_verify.cases.data.provenance import regressions_fingerprint
from pfa_verify.cases.reporting import html_report, report
from pfa_verify.cases.running import run as runner
from pfa_verify.golden.model import EXACT_MODEL, SPEC_MODEL

PERTURB = "tests/cases/run_doubles.py:PerturbOne"
CODEC = "tests/cases/run_doubles.py:CalculatorCodec"


def _args(tmp_path, backend, cases="edge_causal_s1_3_short,edge_tail_tile_3_tokens", examples=1):
    return cli.run_options(cli.build_parser().parse_args(["run", "--backend", backend, "--cases", cases, "--examples",
                                                          str(examples), "--regressions", str(tmp_path / "regs")]))


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
    assert data["summary"]["exit_status"] == 1 == report.summarize(failing_run).exit_status
    assert {"pfa-verify", "torch", "pypto", "platform"} <= set(data["versions"])
    fails = [r for r in data["results"] if r["verdict"] == "fail"]
    assert fails and all(r["replay"].startswith("pfa-verify cases --regressions ") and " replay " in r["replay"] for r in fails)


def test_json_of_a_two_codec_run_validates(codec_run):
    data = report.to_json(codec_run)
    assert report.check_schema(data) == []
    assert [r["reference"] for r in data["results"]] == ["spec", "pypto-0.2.0-calculator"] * 2
    assert report.summarize(codec_run).exit_status == 0


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["results"][0].pop("verdict"), "$.results[0]: 'verdict' is a required property"),
    (lambda d: d["results"][0].update(verdict="maybe"), "$.results[0].verdict: 'maybe' is not one of"),
    (lambda d: d["results"][0].update(mismatched=-1), "$.results[0].mismatched: -1 is less than the minimum of 0"),
    (lambda d: d["results"][0].update(worst_index={"row": 0}), "is not valid under any of the given schemas"),
    (lambda d: d["summary"].update(extra=1), "('extra' was unexpected)"),
    (lambda d: d["summary"]["skipped_by_kind"].update(lazy=1), "$.summary.skipped_by_kind: 'lazy' is not one of"),
    (lambda d: d.update(schema="pfa-verify-run-report/3"), "$.schema: 'pfa-verify-run-report/5' was expected"),
    (lambda d: d["results"][0].pop("node"), "$.results[0]: 'node' is a required property"),
    (lambda d: d["results"][0].update(attempts=3), "$.results[0].attempts: 3 is greater than the maximum of 2"),
    (lambda d: d["execution"].update(executor="slurm"), "$.execution.executor: 'slurm' is not one of"),
    (lambda d: d.pop("execution"), "'execution' is a required property"),
], ids=["missing field", "bad verdict", "negative count", "bad worst_index", "extra summary key", "bad skip kind",
        "other schema", "no node", "three attempts", "unknown executor", "no execution"])
def test_schema_check_rejects(failing_run, mutate, expected):
    data = copy.deepcopy(report.to_json(failing_run))
    mutate(data)
    errors = report.check_schema(data)
    assert any(expected in e for e in errors), errors


def test_every_result_names_its_node_and_the_report_its_executor(failing_run):
    """Issue 19: each case names the host that ran it; the report says what executed the cases."""
    data = report.to_json(failing_run)
    assert {r["node"] for r in data["results"]} == {socket.gethostname()}
    assert {r["attempts"] for r in data["results"]} == {1}
    assert data["execution"]["executor"] == "supervised" and data["execution"]["cluster"] is None
    assert data["execution"]["cases_per_node"] == {socket.gethostname(): len(failing_run.results)}
    assert report.execution_line(failing_run) == (f"Kernel calls in 1 supervised worker process on "
                                                  f"{socket.gethostname()} {len(failing_run.results)}")


def test_table_has_the_columns_and_verdicts(failing_run):
    console = Console(width=220, record=True, force_terminal=False)
    report.print_report(failing_run, console, verbose=True)
    text = console.export_text()
    for column in ("case", "source", "backend", "reference", "max abs", "max rel", "mismatched/total",
                   "worst (row, head, d)", "verdict"):
        assert column in text
    assert "fail: kernel logic" in text and "(0, 1, 3)" in text
    assert "-> FAILED" in text.splitlines()[-1]
    # one block, with its replay line, per group of cases that fail alike (cases/running/groups.py)
    groups = report.to_json(failing_run)["groups"]
    assert text.count("Replay: pfa-verify cases --regressions ") == len(groups) == 2 < len(failing_run.results)


@pytest.mark.parametrize("which", ["failing_run", "codec_run"])
def test_the_table_shows_what_did_not_pass_and_groups_the_rest_within_100_columns(which, request):
    run = request.getfixturevalue(which)
    console = Console(width=220, record=True, force_terminal=False)
    console.print(report.render_table(run))
    table = console.export_text()
    assert max(len(line) for line in table.splitlines()) <= 100
    rows = report.table_rows(run)
    shown = {r.case.name for r in rows if r.verdict != "pass"}
    assert shown and all(f" {name} " in table for name in shown)
    passing = [r for r in rows if r.verdict == "pass"]
    assert not any(f" {r.case.name} " in table for r in passing if r.case.name not in shown)
    for source, reference in {(r.case.source, r.reference) for r in passing}:
        n = sum(1 for r in passing if (r.case.source, r.reference) == (source, reference))
        assert f" {n} {source} case{'s' if n != 1 else ''} " in table


def test_uncounted_codec_difference_is_shown(codec_run):
    console = Console(width=220, record=True, force_terminal=False)
    report.print_report(codec_run, console)
    text = console.export_text()
    cells = " ".join(re.sub("[│┃]", " ", text).split())       # the table wraps its verdict column
    assert "fail (not counted): backend codec" in cells and "-> OK" in text


def test_report_names_what_it_checked_by_content(failing_run, tmp_path):
    """Provenance (issue 20): the kernel file by sha256 and function, the catalog's sha256, the
    regressions as the run found them (before its own captures), the selection's fingerprint."""

    data = report.to_json(failing_run)
    assert report.check_schema(data) == []
    kernel = data["backend"]["kernel"]
    assert kernel["function"] == "PerturbOne" and kernel["source"] == "tests/cases/run_doubles.py"
    assert kernel["sha256"] == hashlib.sha256(Path(PERTURB.split(":")[0]).read_bytes()).hexdigest()
    # A double built on the golden backend declares the golden's own arithmetic (golden.EXACT_MODEL).
    assert data["backend"]["model"]["describe"] == golden.EXACT_MODEL.describe()
    assert data["inputs"]["catalog"]["sha256"] == hashlib.sha256(CATALOG_PATH.read_bytes()).hexdigest()
    regs = data["inputs"]["regressions"]
    # the shipped captures alone (the run's folder was empty when it started)
    assert regs["cases"] == len(regressions.shipped_ids())
    assert regs["fingerprint"] == regressions_fingerprint(tmp_path / "empty")["fingerprint"]
    assert regressions.list_ids(directory=regs["directory"])                     # captured by this run, after
    assert data["project"]["version"] == data["versions"]["pfa-verify"]
    # The selection's fingerprint covers exactly the cases in results, whatever their verdicts.
    seen = {}
    for r in data["results"]:
        seen.setdefault(r["name"], {"name": r["name"], "source": r["source"], "law": "acceptance",
                                    "config": r["config"], "seed": r["seed"]})
    assert data["selection"]["fingerprint"] == fingerprint(list(seen.values()))
    assert data["selection"]["cases"] == 3 and data["selection"]["by_source"]["generated"]["cases"] == 1
    text = Console(width=220, record=True, force_terminal=False)
    report.print_report(failing_run, text)
    out = text.export_text()
    assert f"fingerprint {data['selection']['fingerprint'][7:19]}" in out and kernel["sha256"] in out


def test_a_declared_model_is_reported(tmp_path):
    run = runner.execute(_args(tmp_path, "tests/cases/run_doubles.py:DeclaresExactModel", cases="edge_causal_s1_3_short",
                               examples=0))
    data = report.to_json(run)
    assert report.check_schema(data) == []
    assert data["backend"]["model"] == {**EXACT_MODEL.to_dict(), "describe": EXACT_MODEL.describe(), "declared": True}

    assert str(escape(f"Model: {EXACT_MODEL.describe()} (declared by the backend)")) in html_report.render_html(run)


def test_the_model_that_judged_the_run_is_reported_when_none_is_declared(tmp_path):
    """A backend that declares no model is judged by SPEC §4.1 as written: the report names that model and
    says it was not declared (README: a kernel loaded from a file is judged by SPEC_MODEL)."""
    run = runner.execute(_args(tmp_path, "tests/cases/run_doubles.py:DeclaresNoModel", cases="edge_causal_s1_3_short",
                               examples=0))
    data = report.to_json(run)
    assert report.check_schema(data) == []
    assert data["backend"]["model"] == {**SPEC_MODEL.to_dict(), "describe": SPEC_MODEL.describe(), "declared": False}
    text = Console(width=220, record=True, force_terminal=False)
    report.print_report(run, text)
    assert f"Model: {SPEC_MODEL.describe()} (none declared: SPEC §4.1 as written)" in text.export_text()


@pytest.mark.parametrize("change, same", [
    ({}, True), ({"seed": 1}, False), ({"examples": 3}, False), ({"supported": {"head_dim": (128,), "block_size": (128,)}}, False),
    ({"cases": "edge_causal_s1_3_short"}, False)], ids=["same", "seed", "examples", "supported shapes", "cases"])
def test_the_selection_fingerprint_follows_the_selection(tmp_path, change, same):
    base = {"cases": "edge_causal_s1_3_short,edge_tail_tile_3_tokens", "examples": 2, "seed": 0, "supported": None}

    def fp(opts):
        items = collect_items(opts["cases"], examples=opts["examples"], seed=opts["seed"], supported=opts["supported"],
                              regressions_dir=tmp_path)
        return selection(items, **opts)["fingerprint"]
    assert (fp(base) == fp({**base, **change})) is same


def test_regressions_fingerprint_is_over_the_files(tmp_path):
    empty = regressions_fingerprint(tmp_path / "none")
    shipped = len(regressions.shipped_ids())                 # every run replays them: they are fingerprinted too
    assert empty["cases"] == shipped
    (tmp_path / "abc.json").write_text("{}")
    one = regressions_fingerprint(tmp_path)
    (tmp_path / "abc.json").write_text("{} ")
    changed = regressions_fingerprint(tmp_path)
    assert one["cases"] == changed["cases"] == 1 + shipped and len({empty["fingerprint"], one["fingerprint"],
                                                          changed["fingerprint"]}) == 3


def test_a_counted_failure_carries_its_diagnosis_in_the_json_and_the_message(failing_run):
    """properties/diagnosis/diagnosis.py on every counted failure of the run: the record in the JSON report (schema
    checked above), the line in the failure text. PerturbOne's one element is no known defect."""
    data = report.to_json(failing_run)
    fails = [r for r in data["results"] if r["verdict"] == "fail" and r["counts"]]
    assert fails and all(r["diagnosis"]["evaluated"] >= 1 and r["diagnosis"]["candidates"] for r in fails)
    assert all(not r["diagnosis"]["explained"] for r in fails)
    assert all("Diagnosis: not identified: no fault model explains this failure, and none comes close" in r["message"]
               and r["diagnosis"]["closest"] is None for r in fails)
    # no candidate to tell apart: the probes are the weights readout's and properties/diagnosis/ablations.py's, they
    # refute nothing, and the one element's offset survives every ablation that leaves row 0 a token to see
    assert all(r["diagnosis"]["probes"] and "to show what the failure needs" in r["diagnosis"]["probe_note"]
               for r in fails)
    probes = [p for r in fails for p in r["diagnosis"]["probes"]]
    assert all(p["change"].startswith(("V-scale readout", "weights readout ", "ablation '")) and not p["refuted"]
               for p in probes)
    assert any(p["change"].startswith("weights readout ") for p in probes)
    # the readout locates no stage of a perturbed element, except that a row SPEC §2.5 leaves 0 is not 0
    located = [r["diagnosis"]["located"] for r in fails if r["diagnosis"]["located"] is not None]
    assert all(loc["stage"] is None or (loc["stage"] == "empty rows" and "rows that see no token" in loc["evidence"])
               for loc in located), located
    assert all(p["outcome"] == "fails" for p in probes if "'scores 0'" in p["change"] or "'V constant'" in p["change"])
    assert all(r["diagnosis"] is None for r in data["results"] if r["verdict"] == "pass")
