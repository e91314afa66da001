"""pypto 0.2.0 in SIM mode on the CPU, platform DAV_3510 (through kernels.pypto_workarounds).

Two levels:
  compile  parse + the full pass pipeline; no numbers come out. With cost_model=True pypto's cost
           model runs afterwards and the report (`last_report`: seconds, "AICore End-to-End Time"
           where pypto prints it) carries its figures; it is off by default because it crashes the
           process on large grids (kernels/pypto_workarounds/, W8).
  execute  pypto's CPU calculator runs the kernel's traced tensor graph on the caller's tensors and
           writes the kernel's own numbers into `out` (the default). W9: the first call of a static
           configuration traces the kernel (no pass pipeline, no cost model); later calls with the
           same static configuration (B, NB and the values may differ) re-run only the calculator.
           `last_report.figures["path"]` says which ("trace" or "reverify").

The calculator's E4M3 is not E4M3FN (tests/kernels/test_calculator_codec.py), so this backend's
codec is golden.codec.PYPTO_CALCULATOR_CODEC: comparing it with a golden run under that codec checks
everything the kernel does except the hardware's own FP8 conversions. A comparison under the spec
codec says nothing about the kernel here (`spec_codec_not_applicable` says why).

`sim-spec-codec` (e4m3="spec") is the same calculator with the spec's E4M3 switched on for its runs
(kernels/pypto_workarounds/, W13: OCP E4M3FN, round to nearest even, saturating, NaN kept, no integer
pre-rounding in casts): its codec is golden.codec.SPEC_CODEC, so the CPU can judge a kernel under the
spec codec, codes worth 256 to 448 and saturation included.

Reads of an input outside its shape (a block-table column past a row, a view past a cache's end)
are KernelRunErrors naming the tensor and the index (W12).

`model` is the SPEC §4.1 conformance model the backend is judged by (golden.model.DETERMINISTIC_MODEL unless
kernels.probes.calibrate measured otherwise).

A result must be the kernel's: `out` starts as the UNWRITTEN sentinel (kernels.backends.finish_output),
so a run that writes nothing is a KernelRunError (an `error` verdict), never zeros that a golden row of
zeros would pass. A calculator assertion in the captured output ("Errcode: FBF0..", the calculator's
error codes, lib/calculator/src/calc_error.h) is a KernelRunError too. The "Unrecognized DataTypeDT_FP8E4M3" lines are not: every run prints about 200 of
them, correct runs included (205 lines in a run that matched the golden;
``backend.last_report.figures["unrecognized_dtype_lines"]`` counts them after any call).
"""
from __future__ import annotations

import re

import torch

from pfa_verify.golden.codec import PYPTO_CALCULATOR_CODEC, SPEC_CODEC
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.model import DETERMINISTIC_MODEL
from pfa_verify.golden.validate import check_paged_attention_args
from pfa_verify.kernels import pypto_workarounds as pw
from pfa_verify.kernels.backends import (
    BackendUnavailable,
    KernelRunError,
    Skip,
    finish_output,
    sim_cost,
    unwritten_output,
)
from pfa_verify.kernels.backends.pypto_backend import PyptoBackend

__all__ = ["SimBackend", "LEVELS", "SIM_BUDGET_S", "calculator_error", "PYPTO_CODEC_REASON"]

LEVELS = ("execute", "compile")

# Wall-clock budget of a sim run unless --budget says otherwise: regressions and catalog cases run
# first, so what a spent budget skips is the tail of the generated examples (each one is reported).
SIM_BUDGET_S = 600

#: Why the plain sim's comparison under the spec codec cannot judge its kernel (Backend.spec_codec_not_applicable).
PYPTO_CODEC_REASON = ("pypto 0.2.0's CPU calculator computes with its own E4M3 (codes with exponent field 15 read "
                      "as 240, casts round to an integer first: golden.codec.PYPTO_CALCULATOR_CODEC), so a "
                      "comparison under the spec codec measures the calculator, not the kernel; "
                      "--backend sim-spec-codec runs the spec's E4M3")

_CALCULATOR_ERROR = re.compile(r"Errcode: FBF0[0-9A-F]{2}")


class SimBackend(PyptoBackend):
    default_budget_s = SIM_BUDGET_S
    run_mode = "SIM"
    #: torch threads for a process that runs this backend: one OpenMP thread (kernels/backends/sim_cost.py
    #: has the measurements). The calculator runs thousands of tiny libtorch ops, between which extra
    #: threads only spin, ten times slower when the other core is busy; parallelism comes from worker
    #: processes. Set by the owner of the process (kernels.backends.use_backend_threads: the command
    #: line, the run's and the mutants' workers, the test session), never by the backend itself.
    threads = 1
    out_of_bounds_reads = ("errors: scalar reads of an input outside its shape and views that start outside an "
                           "input are KernelRunErrors naming the tensor and the index (W12)")

    def __init__(self, *, level: str = "execute", pass_options: dict | None = None,
                 tiles: dict | None = None, cost_model: bool | None = None,
                 max_seconds: float | None = None, memory_cap: float = sim_cost.MEMORY_CAP_BYTES,
                 e4m3: str = "pypto") -> None:
        if level not in LEVELS:
            raise UsageError(f"level={level!r} must be one of {LEVELS}")
        if e4m3 not in ("pypto", "spec"):
            raise UsageError(f"e4m3={e4m3!r} must be 'pypto' (the calculator's own E4M3) or 'spec' (SPEC §3)")
        try:
            self._pypto = pw.load_pypto()
        except pw.PyptoUnavailable as exc:
            raise BackendUnavailable(f"sim backend: {exc}") from None
        self._pw = pw
        self.level = level
        self.e4m3 = e4m3
        self.name = ("sim" if e4m3 == "pypto" else "sim-spec-codec") + ("" if level == "execute" else "-compile")
        self.codec = PYPTO_CALCULATOR_CODEC if e4m3 == "pypto" else SPEC_CODEC
        self.spec_codec_not_applicable = None if e4m3 == "spec" else PYPTO_CODEC_REASON
        self.model = DETERMINISTIC_MODEL   # a fixed tile walk and order: the same bits every call
        self.pass_options = pass_options
        self.tiles = dict(tiles or {})
        # W8: the cost model can crash on large grids and computes no numbers (W9): compile-level runs
        # take it only when asked, for its figures; execute runs never.
        self.cost_model = bool(cost_model)
        if level == "execute" and self.cost_model:
            raise UsageError("cost_model=True applies to level='compile'; execute runs the calculator only (W9)")
        self.last_report = None
        self.max_seconds = max_seconds
        self.memory_cap = memory_cap
        self._kernels = {}

    def notes(self) -> list[str]:
        """W9's fast path, when it is off here: the run header says so once (else every call would
        quietly trace the kernel again)."""
        why = self._pw.reverify_unavailable() if self.level == "execute" else None
        return [(f"W9's re-run of a traced graph is off here ({why}): every call traces the kernel again "
                 "(the same numbers, a few seconds more per call)")] if why else []

    def estimate(self, config) -> sim_cost.Estimate:
        """The predicted seconds and peak memory of executing ``config`` here (kernels/backends/sim_cost.py)."""
        return sim_cost.estimate(config, self.memory_cap)

    def skip_reason(self, config) -> Skip | None:
        """Unsupported shapes (KERNEL_SHAPES), then cases estimated over ``max_seconds`` (None: no limit)."""
        unsupported = super().skip_reason(config)
        if unsupported is not None:
            return unsupported
        cost = self.estimate(config)
        if self.max_seconds and cost.seconds > self.max_seconds:
            return Skip("limit", f"estimated {cost.describe()} on the sim backend, over --case-timeout "
                                 f"{self.max_seconds:g}; run it with a larger limit or --backend npu")
        return None

    # -- paged attention ---------------------------------------------------------------------------
    def _run(self, kernel, args, *, execute: bool = False):
        try:
            with self._pw.sim_session(cost_model=self.cost_model) as report:
                if execute:   # W9: trace + calculator; the same static signature again: the calculator only
                    with self._pw.e4m3_codec(self.e4m3):                          # W13
                        report.figures["path"] = self._pw.execute_kernel(kernel, args)
                else:
                    kernel(*args)
        except self._pw.OutOfBoundsRead as exc:     # W12: an input read outside its shape
            raise KernelRunError(f"out-of-bounds read: {exc}") from None
        except self._pw.CalculatorFailed as exc:    # W9: the calculator threw on the kept graph
            raise KernelRunError(str(exc)) from None
        except (RuntimeError, self._pypto.frontend.parser.error.ParserError) as exc:
            # pypto's trace or calculator refused the kernel (its C++ errors reach Python as RuntimeError,
            # an error inside the trace as the parser's RenderedParserError): the kernel did not deliver,
            # a kill in the mutant matrix (cases/measuring/mutants.py). Building the kernel (its module, the jit
            # wrapper) happens before this and is never caught here.
            text = str(exc).strip()
            raise KernelRunError(f"the kernel failed inside pypto: {text.splitlines()[0] if text else ''}") from exc
        self.last_report = report
        error = calculator_error(report.text)
        if error:
            raise KernelRunError(f"pypto's calculator reported an error: {error}")
        return report

    def compile_paged_attention(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                kv_act_seqs, *, softmax_scale=None, s2_tile=128, g_tile=None):
        """Compile only (no numbers); returns the RunCapture (seconds, cost-model figures, text)."""
        dims = check_paged_attention_args(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                          kv_act_seqs, softmax_scale=softmax_scale, s2_tile=s2_tile,
                                          g_tile=g_tile)
        out = torch.zeros(q.shape, dtype=torch.bfloat16)
        args = [q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs]
        return self._run(self._pfa_kernel(False), [_contiguous(a) for a in args] + self._kernel_arguments(dims, out))

    def _paged_attention(self, dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                         kv_act_seqs):
        if self.level == "compile":
            raise KernelRunError("the sim backend at level 'compile' computes no output; "
                                 "use level='execute' or compile_paged_attention()")
        tensors = dict(q=q, q_scale=q_scale, k_cache=k_cache, k_scale=k_scale, v_cache=v_cache, v_scale=v_scale,
                       block_table=block_table, kv_act_seqs=kv_act_seqs)
        chunks = sim_cost.plan(kv_act_seqs.tolist(), s1=dims.s1, nkv=dims.nkv, g_steps=dims.group // dims.g_tile,
                               s2_tile=dims.s2_tile, block_size=dims.block_size, head_dim=dims.head_dim,
                               num_blocks=dims.num_blocks, cap=self.memory_cap)
        if len(chunks) == 1:
            return self._execute_pfa(dims, tensors)
        # Over the memory cap: batch chunks on compacted caches, the same static configuration.
        parts = [self._execute_pfa(dims, sim_cost.chunk_inputs(tensors, c.batches, dims.s1)) for c in chunks]
        return torch.cat(parts)

    def _execute_pfa(self, dims, tensors: dict) -> torch.Tensor:
        out = unwritten_output(tensors["q"].shape)
        args = [_contiguous(tensors[name]) for name in ("q", "q_scale", "k_cache", "k_scale", "v_cache", "v_scale",
                                                         "block_table", "kv_act_seqs")]
        self._run(self._pfa_kernel(True), args + self._kernel_arguments(dims, out), execute=True)
        return finish_output(out, tensors["kv_act_seqs"], dims.s1, self._captured_output)

    def _captured_output(self) -> str:
        """The tail of the last run's captured output for an error message, or "" when it printed nothing."""
        text = self.last_report.text.strip() if self.last_report is not None else ""
        return "pypto output:\n" + text[-2000:] if text else ""

    # -- AT-12 -------------------------------------------------------------------------------------
    def _at12(self, q, k, scale, q_scale, k_scale):
        kernel, cfg = self._at12_kernel(q, k, scale, pass_verify=True)
        out = unwritten_output((q.shape[0], k.shape[0]), dtype=torch.float32)
        tensors = [q, k] + ([q_scale, k_scale] if cfg.dequant_after else []) + [out]
        self._run(kernel, [_contiguous(t) for t in tensors], execute=True)
        return finish_output(out)

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        if self.level == "compile":
            raise KernelRunError("the sim backend at level 'compile' computes no output")
        return self._at12(q, k, scale, q_scale, k_scale)


def calculator_error(text: str) -> str | None:
    """The first line of ``text`` (a run's captured output) carrying one of the calculator's error
    codes (0xBF000 and up, "Errcode: FBF0.."), or None."""
    found = _CALCULATOR_ERROR.search(text)
    if not found:
        return None
    start = text.rfind("\n", 0, found.start()) + 1
    return text[start:].split("\n", 1)[0].strip()[:300]


def _contiguous(x):
    return x.contiguous() if isinstance(x, torch.Tensor) else x
