"""cases/measuring/bench.py: the small workload is deterministic and stays inside the parameter space it
documents, and a bench run reports the two goldens' agreement (timings are not asserted: speed
goals live in the benchmark itself)."""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden
from pfa_verify.cases.measuring import bench_stages as bs
from pfa_verify.cases.measuring.bench import BenchRow, kernel_workload, run_bench, small_workload
from pfa_verify.cases.measuring.bench_stages import fp32_loop_oracle
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.rule import acceptance
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.case import Case


def test_small_workload_is_deterministic_and_in_its_documented_space():
    configs = small_workload(200)
    assert configs == small_workload(200) and configs != small_workload(200, seed=1)
    for c in configs:
        assert 1 <= c.batch <= 6 and 1 <= c.s1 <= 3 and 1 <= c.nkv <= 2 and c.nq // c.nkv in (1, 2, 3, 4)
        assert c.head_dim in (16, 32, 64, 128) and c.block_size in (16, 32, 64, 128)
        assert c.s2_tile // c.block_size in (1, 2, 3, 4) and c.s2_tile % c.block_size == 0
        assert c.g_tile is None or (c.nq // c.nkv) % c.g_tile == 0
        assert all(0 <= n <= c.s2 <= 600 for n in c.kv_act_seqs)
    lengths = [n for c in configs for n in c.kv_act_seqs]
    assert {0, 1} <= set(lengths)
    assert any(n == c.block_size for c in configs for n in c.kv_act_seqs)
    assert len({c.s2_tile // c.block_size for c in configs}) == 4
    assert any(c.g_tile is not None for c in configs) and any(c.g_tile is None for c in configs)


def test_run_bench_reports_agreement_of_the_two_goldens():
    lines = []
    rows = run_bench("small", repeat=1, small_cases=4, report=lines.append)
    assert len(rows) == 1 and len(lines) == 1
    row = rows[0]
    assert isinstance(row, BenchRow) and row.cases == 4
    assert row.non_identical == 0 and row.outputs > 0 and row.finite and row.shape == "4 configs"
    assert row.loop_s > 0 and row.vectorized_s > 0
    assert "0 / " in lines[0]


# ---------------------------------------------------------------- the per-stage table (cases/measuring/bench_stages.py)


def test_kernel_workload_is_the_runs_kernel_sized_generation():
    cases = kernel_workload(3)
    assert len(cases) == 3 and cases == kernel_workload(3)
    for case in cases:
        assert case.config.head_dim in KERNEL_SHAPES["head_dim"] and case.config.block_size in KERNEL_SHAPES["block_size"]


def test_stage_rows_time_every_stage_and_total_them():

    cases = [Case(c, seed=i) for i, c in enumerate(small_workload(3))]
    rows = {r.stage: r for r in bs.stage_rows("small", cases)}
    assert list(rows) == ["inputs", "torch.rand", "golden spec", "golden calculator", "envelope", "comparison", "rule",
                          "inputs / torch.rand", "inputs + rule", "rule / golden",
                          "envelope / golden"]
    for name in ("inputs", "torch.rand", "golden spec", "golden calculator", "envelope", "comparison", "rule"):
        assert rows[name].cases == 3 and 0 < rows[name].mean <= rows[name].worst
    # An example costs its inputs and the rule, which computes the golden itself (and the envelope only
    # where an element lies outside the tolerance: the golden's own output needs none).
    assert rows["inputs + rule"].mean == pytest.approx(rows["inputs"].mean + rows["rule"].mean)
    assert rows["rule / golden"].mean == pytest.approx(rows["rule"].mean / rows["golden spec"].mean)
    assert rows["inputs / torch.rand"].mean == pytest.approx(rows["inputs"].mean / rows["torch.rand"].mean)
    goldens = rows["golden spec"].mean + rows["golden calculator"].mean
    assert rows["envelope / golden"].mean == pytest.approx(rows["envelope"].mean / goldens)


def test_the_rule_is_timed_on_the_outputs_given(monkeypatch):
    """The conforming workload's rule judges the conforming variants' outputs (the envelope built where
    needed), not the golden's."""
    cases, outputs = bs.conforming_workload(2)
    assert [c.config.distribution for c in cases] == ["outlier_channels"] * 2
    judged = []
    real = acceptance.judge
    monkeypatch.setattr(acceptance, "judge", lambda backend, case, **kw: judged.append(backend.out) or real(backend, case, **kw))
    bs.stage_rows("conforming", cases, outputs=outputs)
    assert all(torch.equal(out, outputs(case, None)) for out, case in zip(judged, cases, strict=True))


def test_stage_rows_time_the_envelope_under_both_codecs(monkeypatch):
    calls = []
    real = golden.paged_attention_envelope
    monkeypatch.setattr(golden, "paged_attention_envelope", lambda **kw: calls.append(kw["codec"]) or real(**kw))
    bs.stage_rows("small", [Case(small_workload(1)[0], seed=0)])
    assert [c.name for c in calls] == [golden.SPEC_CODEC.name, golden.PYPTO_CALCULATOR_CODEC.name]


def test_the_fp32_loop_oracle_is_timed_on_upstream_only():
    cases = [Case(small_workload(1)[0], seed=0)]
    small = {r.stage for r in bs.stage_rows("small", cases)}
    upstream = {r.stage: r for r in bs.stage_rows("upstream", cases)}
    assert "fp32 loop oracle" not in small and "golden spec speed-up over FP32 loop oracle" not in small
    assert upstream["fp32 loop oracle"].cases == 1 and upstream["fp32 loop oracle"].mean > 0
    speed_up = upstream["golden spec speed-up over FP32 loop oracle"]
    assert speed_up.cases == 1 and speed_up.mean == upstream["fp32 loop oracle"].mean / upstream["golden spec"].mean


def test_goal_lines_are_judged_on_the_worst_case():
    met = bs.StageRow("kernel", "inputs", 2, 0.01, 0.04)
    missed = bs.StageRow("kernel", "inputs", 2, 0.01, 0.06)
    assert "<= 0.05 s per case: met" in bs.format_stage_row(met)
    assert "MISSED" in bs.format_stage_row(missed)
    slow = bs.StageRow("upstream", "golden spec speed-up over FP32 loop oracle", 6, 2.0, 1.2, unit="x")
    assert ">= 1.5x on every case: MISSED" in bs.format_stage_row(slow)
    assert "MISSED" in bs.format_codec_row(bs.CodecRow("e4m3fn-sat", "decode float64", 250.0))
    assert "met" in bs.format_codec_row(bs.CodecRow("e4m3fn-sat", "encode", 250.0))


def test_codec_rows_cover_both_codecs_and_every_operation():
    rows = bs.codec_rows(repeat=1, elements=1 << 12)
    assert [(r.codec, r.operation) for r in rows] == [
        (c, op) for c in ("e4m3fn-sat", "pypto-0.2.0-calculator")
        for op in ("encode", "decode float32", "decode float64", "round")]
    assert all(r.rate > 0 for r in rows)


def test_fp32_loop_oracle_is_within_spec_tolerance_of_the_golden():
    """The speed baseline computes SPEC §2 (in float32 sums): on uniform inputs it passes SPEC §4
    against the golden, on ragged, causal, GQA and multi-tile cases."""
    for config in (golden.PagedAttentionConfig(batch=3, s1=2, s2=300, nq=4, nkv=2, head_dim=64, block_size=32,
                                               s2_tile=64, kv_act_seqs=(300, 1, 0), num_blocks=12, garbage="nan"),
                   golden.PagedAttentionConfig(batch=2, s1=1, s2=1024, nq=12, nkv=1)):
        kwargs = golden.make_inputs(config, 0).kwargs()
        for codec in (golden.SPEC_CODEC, golden.PYPTO_CALCULATOR_CODEC):
            res = cmp.compare(fp32_loop_oracle(**kwargs, codec=codec), golden.paged_attention_fp8(**kwargs, codec=codec),
                              kind="attention", s1=config.s1)
            assert res.passed, cmp.make_mismatch_message(res, identifier=f"FP32 loop oracle vs golden ({codec.name})")
