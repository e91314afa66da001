"""The suite's own cost per example, stage by stage (``pfa-verify bench --stages``).

On a 950 the kernel takes microseconds; everything else in an example is the suite's work on the
host CPU, and it decides how many examples a run checks per hour. This table times that work on one
core (torch set to one thread; numpy is single-threaded), per case, for three workloads:

- ``kernel``: kernel-sized cases, as ``pfa-verify run`` generates them for a kernel backend
  (``cases.data.collect.generated_cases`` with ``kernels.config.KERNEL_SHAPES``, a fixed seed);
- ``upstream``: the six cases of SPEC §5, where the golden is also timed against a plain FP32 loop
  oracle (:func:`fp32_loop_oracle`, what a kernel's own test would use as its reference);
- ``small``: the small ragged workload of ``cases.measuring.bench.small_workload``.

- ``conforming``: kernel-sized ``outlier_channels`` cases with the outputs of the conforming variants
  (:func:`conforming_workload`), where the rule builds the envelope for the rows outside the tolerance.

Stages: ``inputs`` (``Case.inputs()``, i.e. ``golden.make_inputs``) beside ``torch.rand`` of as many values
as it draws, ``golden spec`` and ``golden calculator`` (the vectorized golden under each codec), the full
``envelope`` (``golden.paged_attention_envelope`` under each codec, the golden included), ``comparison``
(``properties.rule.compare.compare``, kind ``attention``), ``rule`` (``properties.rule.acceptance.judge`` but the
backend's computation: the inputs-unchanged check, the golden, the comparison and the envelope where an
element lies outside the tolerance), and the codecs' throughput. The goals (:data:`GOALS`: the per-example
budget and the ratio lines) are printed beside the figures as lines to meet; they are never asserted
(speed goals live in benchmarks, not in tests) and never change the exit status.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from pfa_verify import golden
from pfa_verify.cases.data.collect import generated_cases
from pfa_verify.golden import PYPTO_CALCULATOR_CODEC, SPEC_CODEC
from pfa_verify.golden.codec import get_codec
from pfa_verify.golden.inputs import drawn_values
from pfa_verify.golden.quant import quantize_rows
from pfa_verify.golden.validate import check_paged_attention_args
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.kernels.conforming import VARIANTS, get_variant
from pfa_verify.properties.rule import acceptance
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.case import Case

__all__ = ["GOALS", "StageRow", "CodecRow", "fp32_loop_oracle", "conforming_workload",
           "stage_rows", "codec_rows", "format_stage_row", "format_codec_row", "STAGE_HEADER", "CODEC_HEADER"]

T = TypeVar("T")

#: The per-example budget: (stage, workload) -> (kind, figure), where kind ``max_s`` is
#: at most that many seconds per case (every case), ``min_speedup`` at least that loop-oracle / golden
#: time ratio (every case), ``min_rate`` at least that many M elements/s (workload ``codec``); and
#: ``max_ratio``: a stage at most that many times another's time over the whole workload (the envelope,
#: which returns the golden too, against the golden; the rule against the golden; the inputs against
#: ``torch.rand`` of as many values).
GOALS: dict[tuple[str, str], tuple[str, float]] = {
    ("inputs", "kernel"): ("max_s", 0.05),
    ("inputs / torch.rand", "kernel"): ("max_ratio", 3.0),
    ("inputs + rule", "kernel"): ("max_s", 0.15),
    ("golden spec speed-up over FP32 loop oracle", "upstream"): ("min_speedup", 1.5),
    ("rule / golden", "kernel"): ("max_ratio", 1.5),
    ("rule / golden", "upstream"): ("max_ratio", 1.5),
    ("rule / golden", "small"): ("max_ratio", 1.5),
    ("rule / golden", "conforming"): ("max_ratio", 3.0),
    ("envelope / golden", "upstream"): ("max_ratio", 2.5),
    ("envelope / golden", "small"): ("max_ratio", 2.5),
    ("encode", "codec"): ("min_rate", 100.0),
    ("decode float32", "codec"): ("min_rate", 300.0),
    ("decode float64", "codec"): ("min_rate", 300.0),
}

_CODEC_ELEMENTS = 1 << 22


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside the block (the budgets are per core), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class StageRow:
    """One stage over a workload's cases: the mean and the worst case (the most seconds, or for a
    speed-up the least), in ``unit`` ("s" per case, "x" for a speed-up); ``None`` over no cases."""

    workload: str
    stage: str
    cases: int
    mean: float | None
    worst: float | None
    unit: str = "s"
    note: str = ""

    def goal(self) -> tuple[str, float] | None:
        return GOALS.get((self.stage, self.workload))

    def to_dict(self) -> dict:
        return {"workload": self.workload, "stage": self.stage, "cases": self.cases, "mean": self.mean,
                "worst": self.worst, "unit": self.unit, "note": self.note, "goal": self.goal()}


@dataclass(frozen=True)
class CodecRow:
    """Throughput of one codec operation, in M elements/s (best of the repeats)."""

    codec: str
    operation: str
    rate: float

    def goal(self) -> tuple[str, float] | None:
        return GOALS.get((self.operation, "codec"))

    def to_dict(self) -> dict:
        return {"codec": self.codec, "operation": self.operation, "rate_m_per_s": self.rate, "goal": self.goal()}


def fp32_loop_oracle(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                     softmax_scale=None, s2_tile=128, g_tile=None, codec=None) -> torch.Tensor:
    """bfloat16 [B*S1, NQ, D]: SPEC §2 as a kernel's own test would write its reference, the baseline
    of the golden's speed goal: per batch and KV head, tile by tile, MM1 and MM2 as float32 matmuls,
    ``exp`` in float32, P quantized with ``golden.quant.quantize_rows`` (the codec's ``round``).

    Not exact (float32 sums in BLAS order), so it is a speed baseline, never a reference: on uniform
    inputs it agrees with the golden within SPEC §4 (tests/cases/test_bench.py).
    """
    dims = check_paged_attention_args(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                      softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)
    codec = get_codec(codec)
    s1, group, d, bs = dims.s1, dims.group, dims.head_dim, dims.block_size
    scale = torch.tensor(dims.softmax_scale, dtype=torch.float32)
    out = torch.zeros(q.shape)
    behind = torch.arange(s1 - 1, -1, -1).repeat_interleave(group)[:, None]  # [S1*G, 1]: S1 - 1 - i
    with torch.inference_mode():
        for b in range(dims.batch):
            length = int(kv_act_seqs[b])
            if length == 0:
                continue
            tokens = torch.arange(length)
            blocks, rows = block_table[b, tokens // bs].long(), tokens % bs
            k, v, k_s = codec.from_fp8(k_cache[blocks, rows]), codec.from_fp8(v_cache[blocks, rows]), k_scale[blocks, rows]
            cur = (length - behind).clamp(min=0)  # SPEC §2.1, per row (i, g)
            for n in range(dims.nkv):
                heads = slice(n * group, (n + 1) * group)
                q_n = codec.from_fp8(q[b * s1:(b + 1) * s1, heads]).reshape(s1 * group, d)
                q_s = q_scale[b * s1:(b + 1) * s1, heads].reshape(s1 * group, 1)
                m = torch.full((s1 * group, 1), -torch.inf)
                l, o = torch.zeros((s1 * group, 1)), torch.zeros((s1 * group, d))
                started = torch.zeros((s1 * group, 1), dtype=torch.bool)
                for start in range(0, length, dims.s2_tile):
                    end = min(start + dims.s2_tile, length)
                    s = (q_n @ k[start:end, n].T) * q_s * k_s[start:end, n].T * scale
                    visible = torch.arange(start, end)[None, :] < cur
                    s = torch.where(visible, s, -torch.inf)
                    m_j = s.amax(dim=-1, keepdim=True)
                    has = m_j > -torch.inf
                    p = torch.exp(torch.where(visible, s - torch.where(has, m_j, 0.0), -torch.inf))
                    p8, p_scale = quantize_rows(p, codec=codec)
                    o_j = (p8 @ v[start:end, n]) * p_scale * v_scale[b, n][None, :]
                    m_new = torch.maximum(m, m_j)
                    a = torch.exp(torch.where(started, m - m_new, 0.0))
                    c = torch.exp(torch.where(has, m_j - m_new, -torch.inf))
                    l, o = a * l + c * p.sum(dim=-1, keepdim=True), a * o + c * o_j
                    m, started = torch.where(has, m_new, m), started | has
                out[b * s1:(b + 1) * s1, heads] = torch.where(started, o / torch.where(started, l, 1.0), 0.0).view(s1, group, d)
    return out.bfloat16()


def _timed(fn: Callable[[], T], repeat: int) -> tuple[float, T | None]:
    """The best seconds of ``repeat`` calls of ``fn`` and what the last returned (None: no call)."""
    best: float = float("inf")
    result: T | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _per_case(workload: str, stage: str, seconds: Sequence[float], note: str = "") -> StageRow:
    if not seconds:
        return StageRow(workload, stage, 0, None, None, note=note)
    return StageRow(workload, stage, len(seconds), statistics.fmean(seconds), max(seconds), note=note)


class _FixedOutput:
    """A backend whose call returns a precomputed output (a clone): what is left of judge is the rule."""

    codec = None

    def __init__(self, out: torch.Tensor, name: str) -> None:
        self.out, self.name = out, name

    def paged_attention_fp8(self, **_):
        return self.out.clone()


def stage_rows(workload: str, cases: Sequence, *, repeat: int = 1, outputs: Callable | None = None) -> list[StageRow]:
    """Per-case seconds of every stage over ``cases`` (properties.rule.case.Case values), on one thread;
    each stage of each case is timed ``repeat`` times and the best kept.

    The rule (``properties.rule.acceptance.judge`` but the backend's computation: the inputs-unchanged check,
    the golden and the comparison, the envelope where an element lies outside the tolerance) is timed on
    the output ``outputs(case, kwargs)`` returns, by default the golden's own (a passing kernel: no
    envelope needed), under the spec codec and SPEC_MODEL. The full envelope keeps its own line, under
    both codecs."""

    stages = ("inputs", "torch.rand", "golden spec", "golden calculator", "envelope", "comparison", "rule")
    times: dict[str, list[float]] = {k: [] for k in stages + (("fp32 loop oracle",) if workload == "upstream" else ())}
    with one_thread():
        for case in cases:
            t_inputs, bundle = _timed(case.inputs, repeat)
            assert bundle is not None       # repeat >= 1 (main checks it): each stage ran at least once
            generator = torch.Generator().manual_seed(0)
            t_rand, _ = _timed(lambda: torch.rand(drawn_values(case.config), generator=generator), repeat)
            kwargs = bundle.kwargs()
            t_spec, spec = _timed(lambda: golden.paged_attention_fp8(**kwargs), repeat)
            t_calc, calc = _timed(lambda: golden.paged_attention_fp8(**kwargs, codec=PYPTO_CALCULATOR_CODEC), repeat)
            assert spec is not None and calc is not None
            t_env = sum(_timed(functools.partial(golden.paged_attention_envelope, **kwargs, codec=c), repeat)[0]
                        for c in (SPEC_CODEC, PYPTO_CALCULATOR_CODEC))
            t_cmp, _ = _timed(lambda: cmp.compare(calc, spec, kind="attention", s1=bundle.config.s1), repeat)
            backend = _FixedOutput(spec if outputs is None else outputs(case, kwargs), workload)
            # looked up at each call (as the import inside this function did): a test replaces it
            t_rule, _ = _timed(lambda: acceptance.judge(backend, case, bundle=bundle), repeat)
            for key, t in zip(stages, (t_inputs, t_rand, t_spec, t_calc, t_env, t_cmp, t_rule), strict=True):
                times[key].append(t)
            if workload == "upstream":
                times["fp32 loop oracle"].append(_timed(lambda: fp32_loop_oracle(**kwargs), repeat)[0])
    rows = [_per_case(workload, k, v) for k, v in times.items()]
    rows.append(_ratio(workload, "inputs / torch.rand", times["inputs"], times["torch.rand"],
                       "make_inputs s / torch.rand of as many values as it draws s"))
    # An example costs its inputs and the rule (which computes the golden itself), besides the backend.
    totals = [a + b for a, b in zip(times["inputs"], times["rule"], strict=True)]
    rows.append(_per_case(workload, "inputs + rule", totals, "the rule: golden, comparison, envelope where needed"))
    rows.append(_ratio(workload, "rule / golden", times["rule"], times["golden spec"],
                       "judge but the backend call s / golden spec s" + ("" if outputs is None else "; conforming outputs")))
    goldens = [a + b for a, b in zip(times["golden spec"], times["golden calculator"], strict=True)]
    rows.append(_ratio(workload, "envelope / golden", times["envelope"], goldens,
                       "all cases' full envelope s / golden s, both codecs"))
    if workload == "upstream":
        ratios = [o / g for o, g in zip(times["fp32 loop oracle"], times["golden spec"], strict=True)]
        rows.append(StageRow(workload, "golden spec speed-up over FP32 loop oracle", len(ratios),
                             statistics.fmean(ratios), min(ratios), unit="x", note="oracle s / golden s"))
    return rows


def _ratio(workload: str, stage: str, numerator: Sequence[float], denominator: Sequence[float], note: str) -> StageRow:
    """One workload-wide ratio (all cases' seconds over all cases' seconds): one figure, in both the mean
    and the worst field (a goal line reads the worst)."""
    ratio = sum(numerator) / sum(denominator) if sum(denominator) else None
    return StageRow(workload, stage, len(numerator), ratio, ratio, unit="x", note=note)


def conforming_workload(count: int = 20, seed: int = 0) -> tuple[list, Callable]:
    """(cases, outputs): ``count`` kernel-sized ``outlier_channels`` cases (where some rows need the
    envelope) and the output of a conforming variant for each (kernels/conforming, in turn), computed
    once: the rule's cost where the envelope is built."""

    cases = generated_cases(count, seed, supported=KERNEL_SHAPES, distributions=("outlier_channels",))
    names = sorted(VARIANTS)
    computed: dict[Case, torch.Tensor] = {}

    def outputs(case: Case, kwargs: dict[str, Any]) -> torch.Tensor:
        if case not in computed:
            computed[case] = get_variant(names[len(computed) % len(names)]).paged_attention_fp8(**kwargs)
        return computed[case]
    return cases, outputs


def codec_rows(*, repeat: int = 3, elements: int = _CODEC_ELEMENTS) -> list[CodecRow]:
    """encode, decode (``decode_array``, float32 and float64) and round of both codecs, M elements/s,
    on ``elements`` float32 values spread over the E4M3 range (normal, scaled by 100). Decode writes
    into a buffer allocated once, as the golden does (a fresh array of this size costs a page fault
    per 4 KiB, the kernel's work rather than the codec's)."""
    x = torch.randn(elements, generator=torch.Generator().manual_seed(0)) * 100
    out32, out64 = np.empty(elements, np.float32), np.empty(elements, np.float64)
    rows = []
    with one_thread():
        for codec in (SPEC_CODEC, PYPTO_CALCULATOR_CODEC):
            codes = codec.encode(x).numpy()
            for name, fn in (("encode", lambda: codec.encode(x)),
                             ("decode float32", lambda: codec.decode_array(codes, out=out32)),
                             ("decode float64", lambda: codec.decode_array(codes, True, out=out64)),
                             ("round", lambda: codec.round(x))):
                rows.append(CodecRow(codec.name, name, elements / _timed(fn, repeat)[0] / 1e6))
    return rows


STAGE_HEADER = f"{'workload':<9} {'stage':<44} {'cases':>5} {'mean':>10} {'worst':>10}  goal"
CODEC_HEADER = f"{'codec':<24} {'operation':<16} {'M elem/s':>9}  goal"


def _verdict(kind: str, limit: float, value: float | None) -> str:
    if value is None:
        return ""
    met = value <= limit if kind in ("max_s", "max_ratio") else value >= limit
    wanted = {"max_s": f"<= {limit:g} s per case", "min_rate": f">= {limit:g} M/s",
              "min_speedup": f">= {limit:g}x on every case", "max_ratio": f"<= {limit:g}x"}[kind]
    return f"{wanted}: {'met' if met else 'MISSED'}"


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return f"{'-':>10}"
    return f"{value:9.2f}x" if unit == "x" else f"{value:9.4f}s"


def format_stage_row(row: StageRow) -> str:
    goal = row.goal()
    verdict = _verdict(*goal, row.worst) if goal else ""  # judged on the worst case
    notes = "; ".join(t for t in (verdict, row.note) if t)
    return (f"{row.workload:<9} {row.stage:<44} {row.cases:>5} {_figure(row.mean, row.unit)} "
            f"{_figure(row.worst, row.unit)}  {notes}")


def format_codec_row(row: CodecRow) -> str:
    goal = row.goal()
    return f"{row.codec:<24} {row.operation:<16} {row.rate:9.1f}  {_verdict(*goal, row.rate) if goal else ''}"
