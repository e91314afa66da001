"""cases/bench.py: the small workload is deterministic and stays inside the parameter space it
documents, and a bench run reports the two goldens' agreement (timings are not asserted: speed
goals live in the benchmark itself)."""
from __future__ import annotations

from cases.bench import BenchRow, run_bench, small_workload


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
