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
"""
from __future__ import annotations

import torch

from kernels.backends import Backend, BackendUnavailable
from kernels.config import PagedAttentionKernelConfig

__all__ = ["SimBackend", "LEVELS"]

LEVELS = ("execute", "compile")


class SimBackend(Backend):
    def __init__(self, *, level: str = "execute", pass_options: dict | None = None,
                 tiles: dict | None = None, cost_model: bool | None = None) -> None:
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
        self._kernels: dict = {}

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
        out = torch.zeros(q.shape, dtype=torch.bfloat16)
        args = (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, out,
                self.kernel_config(dims))
        self._run(self._pfa_kernel(True), [_contiguous(a) for a in args])
        return out

    # -- AT-12 -------------------------------------------------------------------------------------
    def _at12(self, q, k, scale, q_scale, k_scale, execute: bool):
        from kernels.at12 import At12KernelConfig, make_at12_kernel

        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}[q.dtype]
        cfg = At12KernelConfig(q_tile=q.shape[0], k_len=k.shape[0], head_dim=q.shape[1], dtype=dtype,
                               scale=scale)
        kernel = make_at12_kernel(cfg, run_mode=self._pypto.RunMode.SIM, pass_verify=execute)
        out = torch.zeros(q.shape[0], k.shape[0], dtype=torch.float32)
        tensors = [q, k] + ([q_scale, k_scale] if cfg.dequant_after else []) + [out]
        self._run(kernel, [_contiguous(t) for t in tensors])
        return out

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


def _contiguous(x):
    return x.contiguous() if isinstance(x, torch.Tensor) else x
