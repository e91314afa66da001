"""pypto 0.2.0 in SIM mode on the CPU, platform DAV_3510 (through kernels.pypto_workarounds).

Two levels:
  compile  parse + the full pass pipeline; no numbers come out. With cost_model=True pypto's cost
           model runs afterwards and the report (`last_report`: seconds, "AICore End-to-End Time"
           where pypto prints it) carries its figures; it is off by default because it crashes the
           process on large grids (kernels/pypto_workarounds.py, W8).
  execute  the same, plus pass verify: pypto's CPU calculator runs the kernel's tensor graph on the
           caller's tensors and writes the kernel's own numbers into `out` (the default).

The calculator's E4M3 is not E4M3FN (tests/kernels/test_calculator_codec.py), so this backend's
codec is golden.codec.PYPTO_CALCULATOR_CODEC: comparing it with a golden run under that codec checks
everything the kernel does except the hardware's own FP8 conversions.

A result must be the kernel's: `out` starts as the UNWRITTEN sentinel (kernels.backends.finish_output),
so a run that writes nothing is a KernelRunError (an `error` verdict), never zeros that a golden row of
zeros would pass. A calculator assertion in the captured output ("Errcode: FBF0..", the calculator's
error codes, lib/calculator/src/calc_error.h) is a KernelRunError too. The "Unrecognized DataTypeDT_FP8E4M3" lines are not: every run prints about 200 of
them, correct runs included (measured 2026-11-30: 205 lines in a run that matched the golden).
"""
from __future__ import annotations

import re

import torch

from kernels.backends import Backend, BackendUnavailable, KernelRunError, Skip, finish_output, unwritten_output
from kernels.config import KERNEL_SHAPES, PagedAttentionKernelConfig

__all__ = ["SimBackend", "LEVELS", "SIM_MAX_SCORES", "SIM_BUDGET_S", "calculator_error"]

LEVELS = ("execute", "compile")

# The calculator executes the kernel's graph on 2 busy cores: 10-30 s for a small case, growing with
# the score matrix (pfa_fp8_b16_s1_1_s2_256_nkv_4, 65536 scores: about 130 s). Above this many scores
# (B * S1 * NQ * longest length) a case is a Skip("limit") unless max_scores says otherwise.
SIM_MAX_SCORES = 1 << 15

# Wall-clock budget of a sim run unless --budget says otherwise: regressions and catalog cases run
# first, so what a spent budget skips is the tail of the generated examples (each one is reported).
SIM_BUDGET_S = 240

_CALCULATOR_ERROR = re.compile(r"Errcode: FBF0[0-9A-F]{2}")


class SimBackend(Backend):
    supported_shapes = KERNEL_SHAPES
    default_budget_s = SIM_BUDGET_S

    def __init__(self, *, level: str = "execute", pass_options: dict | None = None,
                 tiles: dict | None = None, cost_model: bool | None = None,
                 max_scores: int = SIM_MAX_SCORES) -> None:
        if level not in LEVELS:
            raise ValueError(f"level={level!r} must be one of {LEVELS}")
        from golden.codec import PYPTO_CALCULATOR_CODEC
        from kernels import pypto_workarounds as pw

        try:
            self._pypto = pw.load_pypto()
        except pw.PyptoUnavailable as exc:
            raise BackendUnavailable(f"sim backend: {exc}") from None
        self._pw = pw
        self.level = level
        self.name = "sim" if level == "execute" else "sim-compile"
        self.codec = PYPTO_CALCULATOR_CODEC
        self.pass_options = pass_options
        self.tiles = dict(tiles or {})
        # W8: the cost model can crash on large grids; execute needs it (the output arrives there),
        # compile skips it unless asked.
        self.cost_model = (level == "execute") if cost_model is None else bool(cost_model)
        if level == "execute" and not self.cost_model:
            raise ValueError("cost_model=False: the execute level needs the cost-model run (W8)")
        self.last_report = None
        self.max_scores = max_scores
        self._kernels: dict = {}

    def skip_reason(self, config) -> Skip | None:
        """Unsupported shapes (KERNEL_SHAPES), then cases over ``max_scores`` (0: no limit)."""
        unsupported = super().skip_reason(config)
        if unsupported is not None:
            return unsupported
        scores = config.batch * config.s1 * config.nq * max(config.lengths + (1,))
        if self.max_scores and scores > self.max_scores:
            return Skip("limit", f"{scores} scores (B*S1*NQ*S2) is over the sim execute limit of {self.max_scores} "
                                 "on a CPU (--max-scores; 0 = no limit); run it with --backend npu")
        return None

    # -- paged attention ---------------------------------------------------------------------------
    def kernel_config(self, dims) -> PagedAttentionKernelConfig:
        return PagedAttentionKernelConfig.from_dims(dims, **self.tiles)

    def _pfa_kernel(self, execute: bool):
        key = ("pfa", execute)
        if key not in self._kernels:
            from kernels.pfa_fp8 import make_kernel

            self._kernels[key] = make_kernel(run_mode=self._pypto.RunMode.SIM, pass_verify=execute,
                                             pass_options=self.pass_options)
        return self._kernels[key]

    def _run(self, kernel, args):
        with self._pw.sim_session(cost_model=self.cost_model) as report:
            kernel(*args)
        self.last_report = report
        error = calculator_error(report.text)
        if error:
            raise KernelRunError(f"pypto's calculator reported an error: {error}")
        return report

    def compile_paged_attention(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                kv_act_seqs, *, softmax_scale=None, s2_tile=128, g_tile=None):
        """Compile only (no numbers); returns the RunCapture (seconds, cost-model figures, text)."""
        from golden.validate import check_paged_attention_args

        dims = check_paged_attention_args(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                          kv_act_seqs, softmax_scale=softmax_scale, s2_tile=s2_tile,
                                          g_tile=g_tile)
        out = torch.zeros(q.shape, dtype=torch.bfloat16)
        args = (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, out,
                self.kernel_config(dims))
        return self._run(self._pfa_kernel(False), [_contiguous(a) for a in args])

    def _paged_attention(self, dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                         kv_act_seqs):
        if self.level == "compile":
            raise BackendUnavailable("the sim backend at level 'compile' computes no output; "
                                     "use level='execute' or compile_paged_attention()")
        out = unwritten_output(q.shape)
        args = (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, out,
                self.kernel_config(dims))
        self._run(self._pfa_kernel(True), [_contiguous(a) for a in args])
        return finish_output(out, kv_act_seqs, dims.s1, lambda: "pypto output:\n" + self.last_report.text[-2000:])

    # -- AT-12 -------------------------------------------------------------------------------------
    def _at12(self, q, k, scale, q_scale, k_scale, execute: bool):
        from kernels.at12 import At12KernelConfig, make_at12_kernel

        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}[q.dtype]
        cfg = At12KernelConfig(q_tile=q.shape[0], k_len=k.shape[0], head_dim=q.shape[1], dtype=dtype,
                               scale=scale)
        kernel = make_at12_kernel(cfg, run_mode=self._pypto.RunMode.SIM, pass_verify=execute)
        out = unwritten_output((q.shape[0], k.shape[0]), dtype=torch.float32)
        tensors = [q, k] + ([q_scale, k_scale] if cfg.dequant_after else []) + [out]
        self._run(kernel, [_contiguous(t) for t in tensors])
        return finish_output(out) if execute else out

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        if self.level == "compile":
            raise BackendUnavailable("the sim backend at level 'compile' computes no output")
        return self._at12(q, k, scale, q_scale, k_scale, execute=True)

    def compile_qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None):
        from golden.validate import check_qk_matmul_scale_args

        check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
        scale = float(q.shape[1]) ** -0.5 if scale is None else float(scale)
        self._at12(q, k, scale, q_scale, k_scale, execute=False)
        return self.last_report


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
