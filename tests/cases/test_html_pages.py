"""cases/reporting/html_pages.py and cases/templates/: the report pages come from autoescaped templates, and the run's
table is one row model (cases.reporting.report.table_rows) that the terminal and the page both render."""
from __future__ import annotations

import re

import pytest
from rich.console import Console

from cases.reporting import html_pages, html_report, report
from cases.measuring import mutants
from cases.running.run import CaseResult, Outcome, RunResult

HOSTILE = "<script>alert('x')</script> & \"quoted\""


def _run() -> RunResult:
    """A run without a backend: a pass, a counted failure, a failure that does not count, a skip and an error."""
    fail = dict(max_abs_err=0.5, max_rel_err=2.0, mismatched=3, total=32,
                worst_index={"row": 0, "b": 0, "i": 0, "head": 1, "d": 3}, worst_ratio=40.0)
    results = [
        CaseResult("case_pass", "catalog", {"s1": 1}, 0, "double", 0.5,
                   [Outcome("spec", "pass", max_abs_err=0.0, max_rel_err=0.0, mismatched=0, total=32,
                            envelope={"inside_only": 2, "note": "n"})]),
        CaseResult(HOSTILE, "generated", {"s1": 1}, 1, "double", 1.25,
                   [Outcome("spec", "fail", counts=False, message=HOSTILE, attribution="backend codec", **fail),
                    Outcome("calc", "fail", message="Kernel output vs golden not close", attribution="kernel logic",
                            error_map=[[0.5, 40.0], [None, 0.1]], ratio_histogram=[1] * 11, **fail)]),
        CaseResult("case_skip", "catalog", {"s1": 1}, 0, "double", 0.0,
                   [Outcome("spec", "skipped", skip_kind="limit", message="skipped: " + "over the limit " * 6)]),
        CaseResult("case_error", "regression", None, None, "double", 0.0,
                   [Outcome("spec", "error", message="KernelRunError: the kernel left 32 of 32 outputs unwritten")]),
    ]
    return RunResult("double", "backend double (as asked)", "e4m3fn-sat", 0, results, 3.0, allowed_skips=("limit",))


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
    import jinja2
    with pytest.raises(jinja2.UndefinedError, match="'css' is undefined"):
        html_pages.render("mutants.html.j2", level="golden", summary="s", columns=[], rows=[])


def test_the_terminal_and_the_page_render_the_same_rows():
    run = _run()
    rows = report.table_rows(run)
    assert [(r.name, r.reference, r.verdict, r.style) for r in rows] == [
        ("case_pass", "spec", "pass", "pass"), (HOSTILE, "spec", "fail (not counted)", "uncounted"),
        (HOSTILE, "calc", "fail", "fail"), ("case_skip", "spec", "skipped (limit)", "skipped"),
        ("case_error", "spec", "error", "error")]
    assert [r.first for r in rows] == [True, True, False, True, True]
    assert rows[0].note == "2 inside the envelope only" and rows[2].note == "kernel logic"
    console = Console(width=400, record=True, force_terminal=False)
    console.print(report.render_table(run))
    terminal = console.export_text()
    page = html_report.render_html(run)
    cells = re.findall(r'<td class="v">(.*?)</td></tr>', page)
    assert len(cells) == len(rows)
    for row, cell in zip(rows, cells):
        shown = row.verdict + (f": {row.note}" if row.outcome.verdict == "fail" and row.note else "")
        assert shown in terminal and re.sub(r"<[^>]+>", "", cell).startswith(row.verdict)
        assert f"{row.mismatched}" in terminal and f'<td class="num">{row.mismatched}</td>' in page
    assert ">over the limit over the limit over the limit over the limi\u2026<" in page   # a long reason cut at 60
