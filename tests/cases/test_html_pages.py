"""cases/reporting/html_pages.py and cases/templates/: the report pages come from autoescaped templates, and the run's
table is one row model (cases.reporting.report.table_rows) that the terminal and the page both render."""
from __future__ import annotations

import re

import jinja2
import pytest
import torch
from rich.console import Console

from pfa_verify.cases.measuring import mutants
from pfa_verify.cases.reporting import html_pages, html_report, report
from pfa_verify.cases.running.verdict import CaseError, CaseVerdict, RunResult
from pfa_verify.kernels import Skip
from pfa_verify.properties.rule.acceptance import CodecVerdict, EnvelopeFigures, Judgement
from pfa_verify.properties.rule.compare import Comparison

HOSTILE = "<script>alert('x')</script> & \"quoted\""


def _codec(reference: str, *, passed: bool, counts: bool = True, category: str = "pass", message: str = "",
           **figures) -> CodecVerdict:
    res = Comparison(passed=passed, kind="attention", rtol=1 / 128, atol=1e-4, total=32, mismatched=0 if passed else 3)
    return CodecVerdict(reference=reference, comparison=res, counts=counts, category=category, attribution=None,
                        attribution_text=None, message=message, worst_ratio=0.0 if passed else 40.0,
                        expected=torch.zeros(1), **figures)


def _run() -> RunResult:
    """A run without a backend: a pass, a counted failure, a failure that does not count, a skip and an error."""
    fail = dict(max_abs_err=0.5, max_rel_err=2.0, worst_index={"row": 0, "b": 0, "i": 0, "head": 1, "d": 3})
    passing = _codec("spec", passed=True, max_abs_err=0.0, max_rel_err=0.0, envelope_figures=EnvelopeFigures(
        inside_only=2, flippable=0, p_elements=0, degenerate_rows=0, rows_built=1, outside_by=None, note="n"))
    failing = (_codec("spec", passed=False, counts=False, category="backend codec", message=HOSTILE, **fail),
               _codec("calc", passed=False, category="kernel logic", message="Kernel output vs golden not close",
                      error_map=[[0.5, 40.0], [None, 0.1]], ratio_histogram=[1] * 11, **fail))
    common = dict(config={"s1": 1}, seed=0, backend="double")
    results = (
        CaseVerdict(name="case_pass", source="catalog", seconds=0.5, **common,
                    judgement=Judgement("case_pass", "double", (passing,), torch.zeros(1))),
        CaseVerdict(name=HOSTILE, source="generated", seconds=1.25, **common,
                    judgement=Judgement(HOSTILE, "double", failing, torch.zeros(1))),
        CaseVerdict(name="case_skip", source="catalog", **common, skip=Skip("limit", "over the limit " * 6)),
        CaseVerdict(name="case_error", source="regression", config=None, seed=None, backend="double",
                    error=CaseError(kind="kernel", message="KernelRunError: the kernel left 32 of 32 outputs unwritten")),
    )
    return RunResult(backend="double", backend_note="backend double (as asked)", codec="e4m3fn-sat", seed=0,
                     results=results, seconds=3.0, allowed_skips=("limit",))


def test_values_are_escaped_in_every_page():
    page = html_report.render_html(_run())
    assert "<script>" not in page and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &#34;quoted&#34;" in page
    cell = mutants.LawKill("acceptance", True, 1, 0.1, None, HOSTILE, by="law")
    row = mutants.MutantResult("m", "golden", HOSTILE, None, [cell])
    matrix = mutants.render_html(mutants.MutantsRun("golden", 1, 0, mutants.MutantResult(
        "none (baseline)", "golden", "the unmutated reference", None, [mutants.LawKill("acceptance", False, 1, 0.1)]),
        [row], 1.0, 1.0))
    assert "<script>" not in matrix and matrix.count("&lt;script&gt;") == 2     # the bug and the cell's title


def test_a_name_the_template_lacks_is_an_error_not_an_empty_cell():
    with pytest.raises(jinja2.UndefinedError, match="'css' is undefined"):
        html_pages.render("mutants.html.j2", level="golden", summary="s", columns=[], rows=[])


def test_the_terminal_and_the_page_render_the_same_rows():
    run = _run()
    rows = report.table_rows(run)
    assert [(r.case.name, r.reference, r.shown_verdict, r.style) for r in rows] == [
        ("case_pass", "spec", "pass", "pass"), (HOSTILE, "spec", "fail (not counted)", "uncounted"),
        (HOSTILE, "calc", "fail", "fail"), ("case_skip", "-", "skipped (limit)", "skipped"),
        ("case_error", "-", "error", "error")]
    assert [r.first for r in rows] == [True, True, False, True, True]
    notes = [report.cells(r)["note"] for r in rows]
    assert notes[0] == "2 inside the envelope only" and notes[2] == "kernel logic"
    console = Console(width=400, record=True, force_terminal=False)
    console.print(report.render_table(run, verbose=True))     # the page lists every row, as -v does
    terminal = console.export_text()
    page = html_report.render_html(run)
    cells = re.findall(r'<td class="v">(.*?)</td></tr>', page)
    assert len(cells) == len(rows)
    for row, cell, note in zip(rows, cells, notes, strict=True):
        shown = row.shown_verdict + (f": {note}" if row.verdict == "fail" and note else "")
        mismatched = report.cells(row)["mismatched"]
        assert shown in terminal and re.sub(r"<[^>]+>", "", cell).startswith(row.shown_verdict)
        assert mismatched in terminal and f'<td class="num">{mismatched}</td>' in page
    assert ">over the limit over the limit over the limit over the limi\u2026<" in page   # a long reason cut at 60
