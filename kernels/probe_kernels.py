"""One-operation kernels for the platform probes (kernels/probes.py): the float32 operations of our
paged-attention kernel (kernels/pfa_fp8.py) on their own, so their rounding can be measured.

  exp     out = exp(x)                      (P = exp(S - m_j), a = exp(m - m'))
  rowsum  out[r, 0] = sum_c x[r, c]         (l_j = rowsum(P))
  div     out = x / y, y one value per row  (out = O / l)
  bf16    out = bf16(x)                     (the output cast)

The FP8 matmul (MM1/MM2) is probed through our AT-12 kernel (kernels/at12.py) with unit scales.
Shapes are static; the vector tiles follow tests/kernels/codec_probe.py. Import only after
kernels.pypto_workarounds.load_pypto() (or on a 950, after torch_npu).
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
import pypto

from pfa_verify.kernels.jit import jit

__all__ = ["OPS", "make_probe_kernel"]

OPS = ("exp", "rowsum", "div", "bf16")


def make_probe_kernel(op: str, rows: int, cols: int, *, run_mode, pass_verify: bool):
    """The jit kernel of ``op`` (one of OPS) on float32 [rows, cols] inputs:
    exp (x, out), rowsum (x, out[rows, 1]), div (x, y[rows, 1], out), bf16 (x, out bf16)."""
    if op not in OPS:
        raise ValueError(f"op={op!r} must be one of {OPS}")
    wrap = jit(run_mode=run_mode, pass_verify=pass_verify)
    tile = (min(rows, 16), cols)

    if op == "exp":
        @wrap
        def exp_probe(x: pypto.Tensor((rows, cols), pypto.DT_FP32),
                      out: pypto.Tensor((rows, cols), pypto.DT_FP32)):
            pypto.set_vec_tile_shapes(*tile)
            out[:] = pypto.exp(x)
        return exp_probe

    if op == "rowsum":
        @wrap
        def rowsum_probe(x: pypto.Tensor((rows, cols), pypto.DT_FP32),
                         out: pypto.Tensor((rows, 1), pypto.DT_FP32)):
            pypto.set_vec_tile_shapes(*tile)
            out[:] = pypto.sum(x, dim=-1, keepdim=True)
        return rowsum_probe

    if op == "div":
        @wrap
        def div_probe(x: pypto.Tensor((rows, cols), pypto.DT_FP32),
                      y: pypto.Tensor((rows, 1), pypto.DT_FP32),
                      out: pypto.Tensor((rows, cols), pypto.DT_FP32)):
            pypto.set_vec_tile_shapes(*tile)
            out[:] = pypto.div(x, y)
        return div_probe

    @wrap
    def bf16_probe(x: pypto.Tensor((rows, cols), pypto.DT_FP32),
                   out: pypto.Tensor((rows, cols), pypto.DT_BF16)):
        pypto.set_vec_tile_shapes(*tile)
        out[:] = pypto.cast(x, pypto.DT_BF16)
    return bf16_probe
