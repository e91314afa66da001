"""cases/running/groups.py and its reports: failures that fail alike are one group, one capture, one
terminal block and one HTML card; distinct failures stay apart; the table fits the terminal."""
from __future__ import annotations

import io
import types

from rich.console import Console

from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.data.collect import Item
from pfa_verify.cases.reporting import report
from pfa_verify.cases.reporting.groups import compact_names
from pfa_verify.cases.reporting.html_report import render_html
from pfa_verify.cases.running import run as runner
from pfa_verify.cases.running.groups import alike, group_failures
from pfa_verify.cases.running.verdict import CaseError, CaseVerdict
from pfa_verify.properties.diagnosis.diagnosis import Diagnosis
from pfa_verify.properties.diagnosis.scoring import Candidate

BUGGY = "docs/examples/my_backend.py:make_buggy_backend"      # V's scale read from KV head n - 1
TWO = ("edge_ragged_causal_s1_2", "edge_tiny_magnitudes")     # two small catalog cases it fails, alike


def _printed(run, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, emoji=False)
    report.print_report(run, console)
    return console.file.getvalue()


def test_catalog_cases_that_fail_alike_are_one_block_one_capture_and_one_card(tmp_path):
    """Two catalog failures of one bug: one group in the JSON report, one capture (the smaller case), one
    block naming the other case, one HTML card; the table fits the terminal."""
    regs = tmp_path / "regs"
    run = runner.execute(runner.RunOptions(backend=BUGGY, cases=",".join(TWO), examples=0, regressions=str(regs)))
    data = report.to_json(run)
    assert [(r["name"], r["verdict"], r["group"]) for r in data["results"]] == [(TWO[0], "fail", 1), (TWO[1], "fail", 1)]
    ids = regressions.list_ids(directory=regs)
    assert len(ids) == 1, "one bug, one capture"
    [group] = data["groups"]
    assert group["cases"] == list(TWO) and "v_scale_of_kv_head_n-1" in group["alike"]
    assert group["replay"].endswith(ids[0]) and all(r["replay"] == group["replay"] for r in data["results"])
    # the capture is the smaller case, and its message names the group
    captured = regressions.load(ids[0], directory=regs)
    smaller = min(TWO, key=lambda n: load_catalog()[n].config.estimated_bytes())
    assert captured.case["config"] == load_catalog()[smaller].config.to_dict()
    assert f"2 case(s) fail alike (kernel logic; the diagnosis names v_scale_of_kv_head_n-1): {', '.join(TWO)}" \
        in captured.message
    out = _printed(run, 100)
    assert out.count("\nFAIL ") == 1
    other = next(n for n in TWO if n != smaller)
    assert f"FAIL {smaller} (spec) and 1 more that fail alike: {other}" in out
    assert "2 cases fail alike (kernel logic; the diagnosis names v_scale_of_kv_head_n-1); captured once" in out
    page = render_html(run)
    assert page.count('<section class="failure') == 1 and 'href="#group-1"' in page and 'id="group-1"' in page
    # the table fits the terminal, one line a row: 100 columns, and a narrower one (not cropped at its edge)
    for width in (100, 72):
        lines = _printed(run, width).splitlines()
        table = [line for line in lines if line and line[0] in "┏┃┡│└"]
        assert all(len(line) <= width for line in lines)
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in table), "the table's right edge is on screen"
        assert sum(line.startswith("│") for line in table) == len(run.results)


def _judgement(message: str = "not close"):
    ref = types.SimpleNamespace(counts=True, passed=False, attribution=None, category="kernel logic",
                                comparison=types.SimpleNamespace(attribute=None, nonfinite=False))
    return types.SimpleNamespace(passed=False, references=[ref], message=lambda: message)


def _failing(name: str, *candidates: Candidate) -> CaseVerdict:
    diagnosis = Diagnosis(tuple(candidates), len(candidates), len(candidates), 0.1, 7.0)
    return CaseVerdict(name=name, source="catalog", config=None, seed=0, backend="b", judgement=_judgement(name),
                       diagnosis=diagnosis)


def _model(model: str, stage: str, explained: int = 10) -> Candidate:
    return Candidate(model, stage, model, explained, 10, broken=0, matching=10)


SMALL, LARGE, OTHER = "edge_tiny_magnitudes", "edge_ragged_causal_s1_2", "edge_causal_s1_3_short"


def test_two_distinct_defects_are_two_groups_each_captured_once_its_smallest_case(tmp_path):
    cat = load_catalog()
    items = [Item(n, "catalog", cat[n]) for n in (LARGE, OTHER, SMALL)]
    results = [_failing(LARGE, _model("slip", "online update")), _failing(OTHER, _model("drift", "output")),
               _failing(SMALL, _model("slip", "online update"))]
    grouped = group_failures(items, results, backend_name="b", capture=True, regressions_dir=tmp_path)
    assert [v.group.number for v in grouped] == [1, 2, 1]
    assert grouped[0].group.members == (LARGE, SMALL) and grouped[1].group.members == (OTHER,)
    assert len(regressions.list_ids(directory=tmp_path)) == 2
    assert grouped[0].capture is grouped[2].capture and grouped[0].group.shown == SMALL
    kept = regressions.load(grouped[0].capture.regression, directory=tmp_path)
    assert kept.case["config"] == cat[SMALL].config.to_dict()
    assert [v.judgement for v in grouped] == [v.judgement for v in results]      # verdicts unchanged


def test_unnamed_failures_group_by_where_they_fail_not_by_their_closest_model():
    """No model named: the rule's category and where the mismatches concentrate decide (the attribution, the
    same in every run); the closest model, which the diagnosis' time budget can change, does not."""
    near_a = _failing("a", _model("slip", "online update", explained=6))
    near_b = _failing("b", _model("drift", "output", explained=6))
    assert near_a.diagnosis.identified is None and near_a.diagnosis.closest.model == "slip"
    assert alike(near_a)[0] == alike(near_b)[0] == ("signature", "kernel logic", "unattributed")
    named = _failing("c", _model("slip", "online update"))
    assert alike(named)[0] == ("model", "kernel logic", "slip") != alike(near_a)[0]


def test_errors_group_by_their_message_with_numbers_aside_and_are_never_captured(tmp_path):
    cat = load_catalog()
    said = ["IndexError: index 129 is out of bounds for size 128", "IndexError: index 7 is out of bounds for size 4",
            "ZeroDivisionError: division by zero"]
    names = [SMALL, LARGE, OTHER]
    results = [CaseVerdict(name=n, source="catalog", config=None, seed=0, backend="b",
                           error=CaseError(kind="kernel", message=m)) for n, m in zip(names, said, strict=True)]
    grouped = group_failures([Item(n, "catalog", cat[n]) for n in names], results, backend_name="b", capture=True,
                             regressions_dir=tmp_path)
    assert [v.group.number for v in grouped] == [1, 1, 2]
    assert all(v.capture is None for v in grouped) and regressions.list_ids(directory=tmp_path) == []


def test_a_passing_case_joins_no_group():
    passing = CaseVerdict(name="p", source="catalog", config=None, seed=0, backend="b",
                          judgement=types.SimpleNamespace(passed=True, references=[]))
    assert alike(passing) is None


def test_member_names_are_listed_compactly():
    names = ["edge_a", *(f"generated_{k:02d}" for k in (1, 2, 3, 4, 6, 7, 11)), "edge_b"]
    assert compact_names(names) == "edge_a, edge_b, generated_{01-04, 06-07, 11}"
    assert compact_names([f"generated_{k:02d}" for k in range(0, 40, 2)], limit=3) == \
        "generated_{00, 02, 04 and 17 more}"
