"""cases/reporting/html_report.py: one self-contained file, one table, one heat map and histogram per failure."""
from __future__ import annotations

import dataclasses
import re

import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.reporting import html_report
from pfa_verify.cases.reporting.report import table_rows
from pfa_verify.cases.running import run as runner
from pfa_verify.kernels import Skip
from pfa_verify.properties.rule.coverage import BINS, CROSSES


def _run(tmp, backend, examples=0):
    args = cli.build_parser().parse_args(["run", "--backend", backend, "--cases",
                                          "edge_causal_s1_3_short,edge_tail_tile_3_tokens",
                                          "--examples", str(examples), "--regressions", str(tmp / "regs")])
    return runner.execute(cli.run_options(args))


@pytest.fixture(scope="module")
def failing_html(tmp_path_factory):
    run = _run(tmp_path_factory.mktemp("h"), "tests/cases/run_doubles.py:PerturbOne", examples=1)
    path = html_report.write_html(run, tmp_path_factory.mktemp("out") / "r.html")
    return run, path.read_text(encoding="utf-8")


def test_one_table_and_a_picture_per_failure_group(failing_html):
    run, text = failing_html
    failing = [row for row in table_rows(run) if row.verdict == "fail"]
    groups = {r.group.number for r in run.results if r.group is not None}
    assert failing and 0 < len(groups) < len(failing)     # two cases fail alike: one card shows both
    assert text.count('<table class="results"') == 1 and text.count('<table class="coverage"') == 1
    assert text.count('<svg class="heatmap"') == len(groups) == text.count('<svg class="histogram"')
    assert text.count('<section class="failure') == len(groups)
    results = text.split('<table class="results"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr class=\"", results)
    assert len(rows) == len(table_rows(run))
    assert "kernel logic" in text and "pfa-verify cases --regressions " in text


def test_self_contained(failing_html):
    _, text = failing_html
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|<script|<link|@import|src=", text, re.I)


def test_codec_attribution_badge(tmp_path):
    run = _run(tmp_path, "tests/cases/run_doubles.py:CalculatorCodec")
    text = html_report.render_html(run)
    assert 'badge backend-codec' in text and "not counted" in text
    assert text.count('<section class="failure uncounted"') == 2


def test_colours_split_at_the_tolerance():
    within, over = html_report.ratio_colour(0.9), html_report.ratio_colour(1.1)
    assert within[1:3] == within[3:5]          # grey
    assert over.startswith("#ff") and html_report.ratio_colour(None) == "#000000"


def test_skips_are_listed_with_their_reason(tmp_path):
    args = cli.build_parser().parse_args(["run", "--backend", "golden", "--cases", "edge_causal_s1_3_short",
                                          "--examples", "0", "--regressions", str(tmp_path)])
    run = runner.execute(cli.run_options(args))

    skipped = dataclasses.replace(run.results[0], judgement=None, skip=Skip("limit", "too big here"))
    text = html_report.render_html(dataclasses.replace(run, results=(skipped,) + run.results[1:]))
    assert "<h2>Not checked: skipped (1)</h2>" in text
    assert "limit (not allowed: fails the run): edge_causal_s1_3_short: too big here" in text
    assert "1 case was not checked (skips of kind limit are not allowed" in text


def test_header_names_what_was_checked_by_content(failing_html):
    run, text = failing_html
    kernel = run.provenance["backend"]["kernel"]
    assert f"sha256 {kernel['sha256']}" in text and "tests/cases/run_doubles.py:PerturbOne" in text
    assert f"fingerprint {run.selection['fingerprint'][7:19]}" in text
    assert "Model: exact (the golden" in text and "catalog sha256 " in text      # a double built on the golden


def test_a_failure_card_says_what_the_diagnosis_found(failing_html):
    """The "What:" line of properties/diagnosis/diagnosis.py on each counted failure (PerturbOne's one changed element
    is no known defect: none is named, and none is called close)."""
    _, text = failing_html
    assert '<p class="diagnosis">What: not identified: no fault model explains this failure or comes close' in text


def test_the_coverage_table_lists_every_bin_and_marks_the_holes(failing_html):
    run, text = failing_html
    table = text.split('<table class="coverage"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr") == len(BINS) + len(CROSSES) + 1        # and the header row
    assert table.count('<tr class="hole">') == len(run.coverage["holes"]) + len(run.coverage["cross_holes"])
    assert "Coverage: " in text
