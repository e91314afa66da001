"""``pfa-verify search`` here (no cluster): the coverage of the examples its tasks drew (issue 30)."""
from __future__ import annotations

import json

import golden
from cases import cli


def test_a_search_reports_the_coverage_of_every_example_it_drew(tmp_path, capsys):
    report = tmp_path / "search.json"
    status = cli.main(["search", "--backend", "golden", "--laws", "acceptance,garbage_unread", "--examples", "8",
                       "--tasks", "2", "--no-capture", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert status == 0 and data["examples_run"] == 16
    coverage = data["coverage"]
    assert coverage["cases"] == 16
    # every example falls in exactly one distribution bin and one S1 bin: the counts add up to the examples
    for family in ([f"distribution_{d}" for d in golden.DISTRIBUTIONS], ["s1_1", "s1_2", "s1_3_plus"]):
        assert sum(coverage["bins"][name]["hits"] for name in family) == 16, family
    assert "crosses hit by 16 law examples" in out and out.index("Coverage:") < out.index("search on golden")
