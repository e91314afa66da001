"""properties/diagnosis/error_probes.py: an error's diagnosis is the kernel on neighbours of the case, what the error
needs; and a run carries it for every erroring case, in the text, the JSON report and the HTML card."""
from __future__ import annotations

import json

import torch

from pfa_verify import golden
from pfa_verify.cases import cli
from pfa_verify.cases.data import schemas
from pfa_verify.properties.diagnosis.error_probes import error_neighbours, probe_error
from pfa_verify.properties.diagnosis.probes import MAX_CALLS
from pfa_verify.properties.rule.case import Case
from tests.properties.outside_defects import HandWritten


def _narrow_table() -> Case:
    """Lengths (70, 20) over blocks of 16 and tiles of 32: 5 columns, not a whole number of tiles (2 blocks)."""
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=70, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=32,
                                         kv_act_seqs=(70, 20), max_blocks=5)
    return Case(config, seed=0)


class _Raises:
    name = "raises always"

    def __init__(self):
        self.calls = 0

    def paged_attention_fp8(self, *args, **kwargs):
        self.calls += 1
        raise RuntimeError("the device went away")


def test_the_table_widened_to_whole_tiles_comes_first_and_the_overrun_needs_it():
    case = _narrow_table()
    change, widened = next(error_neighbours(case))
    assert change == "block table widened from 5 to 6 columns (-1 filled: a whole number of tiles)"
    given, wide = case.inputs().tensors(), widened.inputs().tensors()
    assert torch.equal(wide["block_table"][:, :5], given["block_table"]) and bool((wide["block_table"][:, 5] == -1).all())
    assert all(torch.equal(wide[k].view(torch.uint8) if wide[k].dtype == torch.float8_e4m3fn else wide[k],
                           given[k].view(torch.uint8) if given[k].dtype == torch.float8_e4m3fn else given[k])
               for k in given if k != "block_table")                 # the same pool of blocks, the same data
    found = probe_error(case, HandWritten("table_overrun"), "IndexError: block_table column 5 is past the row's 5 columns")
    assert found.error.startswith("IndexError") and not found.candidates and found.stage == "the tile walk"
    assert "the error goes away with the block table widened from 5 to 6 columns" in found.located.evidence
    assert found.probes[0].change == change, found.render()
    # the widened table runs; so do the lengths that widen it or stay inside it; batch 1 left empty does not
    assert [p.outcome for p in found.probes] == ["passes", "passes", "passes", "error"], found.render()
    assert "block_table column 5 is past the row's 5 columns" in found.probes[3].detail
    assert found.render().startswith("Diagnosis of the error (IndexError: block_table column 5 is past the row's 5 "
                                     "columns): no output to score models against; the kernel on neighbours")


def test_a_kernel_that_always_raises_errs_on_every_probe_within_the_budget():
    backend = _Raises()
    found = probe_error(_narrow_table(), backend, "RuntimeError: the device went away")
    assert backend.calls == len(found.probes) == MAX_CALLS
    assert all(p.outcome == "error" and "the device went away" in p.detail for p in found.probes)
    assert found.stage is None                        # it raises on the widened table too: nothing located
    assert probe_error(_narrow_table(), _Raises(), "RuntimeError: x", max_calls=0).probes == ()


def test_a_run_diagnoses_its_errors_in_the_text_the_json_and_the_html(tmp_path, capsys):
    report, page = tmp_path / "r.json", tmp_path / "r.html"
    status = cli.main(["run", "--backend", "tests/properties/outside_defects.py:table_overrun", "--cases",
                       "edge_tail_tile_3_tokens", "--examples", "0", "--no-capture", "--json", str(report),
                       "--html", str(page)])
    printed = capsys.readouterr().out
    assert status == 1
    data = json.loads(report.read_text())
    assert schemas.errors(data, "report") == []
    (error,) = [r for r in data["results"] if r["verdict"] == "error"]
    diagnosis = error["diagnosis"]
    assert diagnosis["error"].startswith("IndexError") and diagnosis["candidates"] == [] and diagnosis["probes"]
    assert diagnosis["probes"][0]["change"].startswith("block table widened from 5 to ")
    assert "Diagnosis of the error (IndexError" in error["message"] and "Diagnosis of the error" in printed
    html = page.read_text()
    assert "What: the kernel raised <code>IndexError" in html and "Probe block table widened from 5 to " in html
    assert "Where: located in <b>the tile walk</b> by the error goes away" in html and diagnosis["stage"] == "the tile walk"


class _NarrowRaisesWideWrong:
    """Raises on a table narrower than whole tiles; on a wider one runs, and is wrong by values everywhere."""
    name = "narrow raises, wide wrong"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kwargs):
        tile_blocks = kwargs.get("s2_tile", 128) // k_cache.shape[1]
        if block_table.shape[1] % tile_blocks:
            raise IndexError("block_table column past the row")
        out = golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                         **kwargs)
        return (out.float() + 0.5).bfloat16()


def test_a_widened_table_that_only_runs_locates_nothing():
    """Failing by values on the widened table says no more than that the kernel ran there: no stage."""
    found = probe_error(_narrow_table(), _NarrowRaisesWideWrong(), "IndexError: block_table column past the row")
    assert found.probes[0].change.startswith("block table widened") and found.probes[0].outcome == "fails"
    assert found.located is None and found.stage is None, found.render()
