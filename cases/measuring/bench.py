"""Benchmark: the vectorized golden against the loop golden, in one process (``pfa-verify bench``).

It lives in cases/ because its upstream workload is the case catalog's (golden/ depends on nothing).

Three workloads: every upstream case of SPEC §5; kernel-sized cases as ``pfa-verify run`` generates
them for a kernel backend (20 by default, a fixed seed); and a property-testing-shaped one (200
small ragged cases drawn from the parameter space of the property suite's strategies: B <= 6,
S1 <= 3, lengths up to 600 including 0, 1 and block and tile boundaries, block sizes 16-128, several
s2_tile values); and ``conforming``, kernel-sized ``outlier_channels`` cases judged on the outputs of the
conforming variants (where the rule builds the envelope for some rows; part of ``all`` with ``--stages``
only). For each it reports both goldens' time, the speed-up, cases per second, and whether the two
agree (count of outputs that are not bit-identical). With ``--stages`` it adds the suite's cost per
example, stage by stage on one core, each beside its goal (the per-example budget and ratio lines of
cases/measuring/bench_stages.py's GOALS).

Run: ``pfa-verify bench [--repeat N] [--workload upstream|kernel|small|conforming|all] [--small-cases N]
[--kernel-cases N] [--stages] [--json PATH]`` (the options: cases/cli/measure_commands.py). Speed goals live
here, not in tests.
"""
from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pfa_verify.cases.data.catalog import SPEC_CASE_NAMES, load_catalog
from pfa_verify.cases.data.collect import generated_cases
from pfa_verify.cases.measuring import bench_stages as bs
from pfa_verify.cases.measuring.bench_stages import conforming_workload
from pfa_verify.golden import (
    DISTRIBUTIONS,
    InputBundle,
    PagedAttentionConfig,
    make_inputs,
    paged_attention_fp8,
    paged_attention_fp8_loop,
)
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.rule.case import Case

__all__ = ["WORKLOADS", "upstream_cases", "kernel_workload", "small_workload", "BenchRow", "run_bench",
           "run_stages", "main"]

WORKLOADS = ("upstream", "kernel", "small", "conforming", "all")

def upstream_cases() -> dict[str, InputBundle]:
    """The six upstream cases of SPEC §5, by name, from the case catalog (cases/catalog.json)."""

    catalog = load_catalog()
    return {name: catalog[name].inputs() for name in SPEC_CASE_NAMES}


def kernel_workload(count: int = 20, seed: int = 0) -> list:
    """``count`` kernel-sized cases (properties.rule.case.Case) as ``pfa-verify run`` generates them for a
    kernel built for ``kernels.config.KERNEL_SHAPES`` (cases.data.collect.generated_cases; same seed, same cases)."""
    return generated_cases(count, seed, supported=KERNEL_SHAPES)


# The parameter space of the property suite's default strategies (properties/search/strategies.py:
# ``dims``, ``special_lengths``, ``configs``), with B <= 6 and lengths up to about 600, so that the
# small workload is shaped like the examples hypothesis runs.
_HEAD_DIMS = (16, 32, 64, 128)
_BLOCK_SIZES = (16, 32, 64, 128)
_GROUPS = (1, 2, 3, 4)
_GARBAGE = (None, "nan", "huge")
_MAX_LEN = 600


def small_workload(count: int = 200, seed: int = 0) -> list[PagedAttentionConfig]:
    """``count`` small ragged configs shaped like a property-testing run (deterministic in ``seed``).

    B <= 6, S1 <= 3, NKV <= 2, group 1-4 (g_tile the whole group or a proper divisor), D 16-128,
    block sizes 16-128, s2_tile 1-4 blocks, lengths up to 600 with half of them on the special
    points the property suite favours (0, 1, block and tile boundaries, the table's capacity), every
    value distribution, and unread cells left 0, NaN or huge.
    """
    rng = random.Random(seed)
    configs = []
    for _ in range(count):
        block_size = rng.choice(_BLOCK_SIZES)
        s2_tile = block_size * rng.randint(1, 4)
        batch = rng.randint(1, 6)
        s2 = rng.randint(1, _MAX_LEN)
        special = (0, 1, block_size - 1, block_size, block_size + 1, s2_tile - 1, s2_tile, s2_tile + 1,
                   2 * s2_tile, 2 * s2_tile + 1, s2 - 1, s2)
        lengths = tuple(max(0, min(s2, rng.choice(special) if rng.random() < 0.5 else rng.randint(0, s2))) for _ in range(batch))
        nkv, group = rng.randint(1, 2), rng.choice(_GROUPS)
        g_tile = rng.choice([None] + [g for g in range(1, group) if group % g == 0])
        configs.append(PagedAttentionConfig(
            batch=batch, s1=rng.randint(1, 3), s2=s2, nq=nkv * group, nkv=nkv, head_dim=rng.choice(_HEAD_DIMS),
            block_size=block_size, s2_tile=s2_tile, g_tile=g_tile, kv_act_seqs=lengths,
            distribution=rng.choice(DISTRIBUTIONS), garbage=rng.choice(_GARBAGE),
        ))
    return configs


@dataclass(frozen=True)
class BenchRow:
    """One benchmark line: best-of-repeats seconds of each golden over ``cases`` inputs, and their agreement."""

    name: str
    cases: int
    loop_s: float
    vectorized_s: float
    non_identical: int
    outputs: int
    shape: str = ""
    finite: bool = True

    @property
    def speedup(self) -> float:
        return self.loop_s / self.vectorized_s

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.vectorized_s

    def to_dict(self) -> dict[str, float | int | str]:
        return {"name": self.name, "cases": self.cases, "loop_s": self.loop_s, "vectorized_s": self.vectorized_s,
                "speedup": self.speedup, "cases_per_s": self.cases_per_s, "non_identical": self.non_identical,
                "outputs": self.outputs, "shape": self.shape, "finite": self.finite}


def _time(fn: Callable[[], list[torch.Tensor]]) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _bench(name: str, bundles: Sequence[InputBundle], repeat: int) -> BenchRow:
    calls = [b.kwargs() for b in bundles]
    # Alternate the two so a drift in machine speed hits both alike.
    vec_s, vec = _time(lambda: [paged_attention_fp8(**kw) for kw in calls])
    loop_s, loop = _time(lambda: [paged_attention_fp8_loop(**kw) for kw in calls])
    for _ in range(repeat - 1):
        vec_s = min(vec_s, _time(lambda: [paged_attention_fp8(**kw) for kw in calls])[0])
        loop_s = min(loop_s, _time(lambda: [paged_attention_fp8_loop(**kw) for kw in calls])[0])
    non_identical = sum(int((a.view(torch.int16) != b.view(torch.int16)).sum()) for a, b in zip(vec, loop, strict=True))
    finite = all(bool(torch.isfinite(a.float()).all()) for a in vec)
    return BenchRow(name, len(bundles), loop_s, vec_s, non_identical, sum(a.numel() for a in vec),
                    _shape(bundles[0].config) if len(bundles) == 1 else f"{len(bundles)} configs", finite)


def _shape(c: PagedAttentionConfig) -> str:
    return f"B={c.batch} S1={c.s1} S2={c.s2} NQ={c.nq} NKV={c.nkv} D={c.head_dim} s2_tile={c.s2_tile}"


def _check_workload(workload: str) -> None:
    if workload not in WORKLOADS:
        raise UsageError(f"workload={workload!r} must be one of {WORKLOADS}")


def run_bench(workload: str = "all", *, repeat: int = 3, small_cases: int = 200, kernel_cases: int = 20,
              report: Callable[[str], None] = print) -> list[BenchRow]:
    """Benchmark rows for the chosen workload (one of WORKLOADS); prints as it goes."""
    _check_workload(workload)
    rows = []
    if workload in ("upstream", "all"):
        for name, bundle in upstream_cases().items():
            rows.append(_bench(name, [bundle], repeat))
            report(_format_row(rows[-1]))
    if workload in ("kernel", "all"):
        bundles = [case.inputs() for case in kernel_workload(kernel_cases)]
        rows.append(_bench(f"kernel-sized workload ({kernel_cases} cases)", bundles, repeat))
        report(_format_row(rows[-1]))
    if workload in ("small", "all"):
        bundles = [make_inputs(c, seed=i) for i, c in enumerate(small_workload(small_cases))]
        rows.append(_bench(f"small ragged workload ({small_cases} cases)", bundles, repeat))
        report(_format_row(rows[-1]))
    if workload == "conforming":
        bundles = [case.inputs() for case in conforming_workload(kernel_cases)[0]]
        rows.append(_bench(f"kernel-sized outlier_channels ({kernel_cases} cases)", bundles, repeat))
        report(_format_row(rows[-1]))
    return rows


def run_stages(workload: str = "all", *, repeat: int = 1, small_cases: int = 200, kernel_cases: int = 20,
               report: Callable[[str], None] = print) -> tuple[list[bs.StageRow], list[bs.CodecRow]]:
    """(stage rows, codec rows) of cases/measuring/bench_stages.py for the chosen workload; prints as it goes."""

    _check_workload(workload)
    report(bs.CODEC_HEADER)
    codecs = bs.codec_rows()
    for codec_row in codecs:
        report(bs.format_codec_row(codec_row))
    workloads = []
    if workload in ("kernel", "all"):
        workloads.append(("kernel", kernel_workload(kernel_cases)))
    if workload in ("upstream", "all"):
        catalog = load_catalog()
        workloads.append(("upstream", [catalog[name] for name in SPEC_CASE_NAMES]))
    if workload in ("small", "all"):
        workloads.append(("small", [Case(c, seed=i) for i, c in enumerate(small_workload(small_cases))]))
    outputs = {}
    if workload in ("conforming", "all"):
        cases, outputs["conforming"] = bs.conforming_workload(kernel_cases)
        workloads.append(("conforming", cases))
    report(bs.STAGE_HEADER)
    stages: list[bs.StageRow] = []
    for name, cases in workloads:
        for row in bs.stage_rows(name, cases, repeat=repeat, outputs=outputs.get(name)):
            stages.append(row)
            report(bs.format_stage_row(row))
    return stages, codecs


_HEADER = (f"{'workload':<44} {'shape':<50} {'cases':>5} {'loop s':>8} {'vector s':>9} {'speed-up':>8} "
           f"{'cases/s':>8} {'finite':>6} {'non-identical':>16}")


def _format_row(row: BenchRow) -> str:
    return (f"{row.name:<44} {row.shape:<50} {row.cases:>5} {row.loop_s:>8.3f} {row.vectorized_s:>9.3f} "
            f"{row.speedup:>7.1f}x {row.cases_per_s:>8.1f} {'yes' if row.finite else 'NO':>6} "
            f"{row.non_identical:>7} / {row.outputs:<8}")


def main(*, workload: str = "all", repeat: int = 3, small_cases: int = 200, kernel_cases: int = 20, stages: bool = False,
         json_path: str | None = None) -> int:
    """``pfa-verify bench`` (its options in cases/cli/measure_commands.py): print the rows, write them as JSON;
    exit 1 when the two goldens disagree or a row is not finite."""
    if repeat < 1 or small_cases < 1 or kernel_cases < 1:
        raise SystemExit("pfa-verify bench: --repeat, --small-cases and --kernel-cases must be >= 1")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of {repeat}")
    print(_HEADER)
    rows = run_bench(workload, repeat=repeat, small_cases=small_cases, kernel_cases=kernel_cases)
    stage_list: list[bs.StageRow] = []
    codecs: list[bs.CodecRow] = []
    if stages:
        print(f"\nThe suite's cost per example, on one core (torch 1 thread), best of {repeat} per stage and case:")
        stage_list, codecs = run_stages(workload, repeat=repeat, small_cases=small_cases, kernel_cases=kernel_cases)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            goldens: list[dict[str, Any]] = [r.to_dict() for r in rows]
            data: list[dict[str, Any]] | dict[str, list[dict[str, Any]]] = goldens
            if stages:
                data = {"goldens": goldens, "stages": [r.to_dict() for r in stage_list], "codecs": [r.to_dict() for r in codecs]}
            json.dump(data, f, indent=2)
    disagree = sum(r.non_identical for r in rows)
    not_finite = [r.name for r in rows if not r.finite]
    print(f"{len(rows)} rows; {disagree} non-identical outputs between the two goldens; "
          f"{len(not_finite)} rows with non-finite outputs")
    # The two goldens must agree bit for bit and stay finite on these inputs: anything else is a
    # golden defect, and the job says so in its exit status.
    return 1 if disagree or not_finite else 0


if __name__ == "__main__":     # python -m cases.measuring.bench: the default bench
    sys.exit(main())
