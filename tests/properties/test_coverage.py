"""properties/rule/coverage.py (issue 30): the corner bins of the contract, the classifier, the report line, and
``pfa-verify run --coverage``'s one-line failure naming the holes."""
from __future__ import annotations

import json

import pytest

from pfa_verify.cases import cli
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.golden import PagedAttentionConfig
from pfa_verify.properties.rule.coverage import BINS, CROSSES, bin_names, classify, coverage


def test_every_bin_names_its_spec_line_and_the_names_are_unique():
    names = bin_names()
    assert len(set(names)) == len(names) and all(b.spec.startswith("§") for b in BINS + CROSSES)


def test_a_hand_built_case_falls_in_the_bins_its_shape_says():
    # B=2, S1=3, lengths 0 and 257, BS 128, s2_tile 256: rows of 257, 256, 255 tokens and an empty batch
    config = PagedAttentionConfig(batch=2, s1=3, s2=257, nq=6, nkv=2, head_dim=16, block_size=128, s2_tile=256,
                                  g_tile=1, kv_act_seqs=(0, 257), max_blocks=4, num_blocks=6,
                                  distribution="sinks", garbage="nan",
                                  block_table=((-1, -1, -1, -1), (5, 0, 3, -1)))
    hit = classify(config)
    for name in ("empty_batch", "cur_block_plus_1", "cur_at_block", "cur_block_minus_1", "cur_at_tile",
                 "cur_tile_plus_1", "cur_tile_minus_1", "one_tile_row", "two_tile_row", "s1_3_plus", "group_3",
                 "split_g_tile", "nkv_2", "s2_tile_2_blocks", "distribution_sinks", "garbage_nan", "shuffled_table",
                 "extra_columns", "spare_blocks", "distribution_sinks x multi_tile_rows", "garbage_nan x extra_columns",
                 "s1_3_plus x ragged_lengths", "group_3 x split_g_tile",
                 "last_tile_over_unused_columns"):      # the row of 257: its second tile spans columns 2 and 3 (-1)
        assert name in hit, name
    for name in ("empty_by_causality", "three_plus_tile_row", "s1_1", "group_2", "nkv_1", "table_width_not_tile_multiple"):
        assert name not in hit, name


def test_a_last_tile_over_unused_columns_needs_a_column_past_the_batch_s_blocks():
    def config(length, s2_tile, max_blocks):
        need = -(-length // 128)
        return PagedAttentionConfig(batch=1, s1=1, s2=length, nq=2, nkv=2, head_dim=16, block_size=128,
                                    s2_tile=s2_tile, kv_act_seqs=(length,), max_blocks=max_blocks, num_blocks=need,
                                    block_table=(tuple(range(need)) + (-1,) * (max_blocks - need),))
    assert "last_tile_over_unused_columns" in classify(config(257, 256, 4))      # tile 2 spans columns 2, 3
    assert "last_tile_over_unused_columns" not in classify(config(257, 256, 3))  # the table ends at column 2
    assert "last_tile_over_unused_columns" not in classify(config(256, 256, 4))  # the last tile ends at a full block pair
    assert "last_tile_over_unused_columns" not in classify(config(257, 128, 4))  # one-block tiles never do


def test_the_upstream_cases_hit_the_8_block_tile_and_the_coverage_line_names_the_holes():
    upstream = [c.config for n, c in load_catalog().items() if n.startswith("pfa_fp8_")]
    cv = coverage(upstream)
    assert cv.counts["s2_tile_8_blocks"] == 2 and cv.counts["s2_tile_1_blocks"] == 4 and cv.cases == 6
    assert "empty_batch" in cv.holes and cv.line().startswith(f"Coverage: {len(BINS) - len(cv.holes)}/{len(BINS)} bins")
    assert cv.missing(["empty_batch", "s1_2"]) == ("empty_batch",) and "empty_batch" in cv.missing(["all"])


def test_a_run_reports_its_coverage_and_fails_on_a_required_hole(tmp_path, capsys):
    report = tmp_path / "r.json"
    status = cli.main(["run", "--backend", "golden", "--cases", "pfa_fp8_b2_s1_1_s2_1k", "--examples", "0",
                       "--no-capture", "--coverage", "all", "--json", str(report)])
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert status == 1 and data["coverage"]["cases"] == 1 and "empty_batch" in data["coverage"]["holes"]
    verdict = data["summary"]["verdict"]
    assert "-> FAILED: --coverage: " in verdict and " required bins not hit by any checked case (" in verdict
    assert "empty_batch" in verdict.split("--coverage: ", 1)[1] and "\nCoverage: " in out
    assert cli.main(["run", "--backend", "golden", "--cases", "pfa_fp8_b2_s1_1_s2_1k", "--examples", "0",
                     "--no-capture", "--coverage", "s1_1,nkv_1"]) == 0


def test_an_unknown_bin_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--backend", "golden", "--coverage", "s1_9"])
    assert exited.value.code == 2 and "'s1_9': ['s1_9'] not among the coverage bins" in capsys.readouterr().err


def test_a_pytest_law_run_ends_with_the_coverage_of_its_examples(suite_pytester):
    """The law runs count the bins of every case a law ran on and end the session with one coverage line
    (tests/conftest.py); each bin is also a Hypothesis event of the law's test."""
    suite_pytester.makepyfile(test_law='''
from hypothesis import given, settings
from pfa_verify.properties.search import strategies as ps


@settings(max_examples=5, derandomize=True, database=None, deadline=None)
@given(case=ps.cases_for(None, s1=1))
def test_acceptance(check_law, case):
    check_law("acceptance", case)
''')
    result = suite_pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                                 "--hypothesis-show-statistics", timeout=300)
    text = result.stdout.str()
    assert result.ret == 0, text
    assert "coverage of the law runs (properties/rule/coverage.py)" in text
    assert "hit by 5 law examples; holes (no case drawn there): " in text and "s1_2" in text.split("holes (no case drawn there): ", 1)[1]
    assert "coverage: s1_1" in text            # a Hypothesis event of the law's test
