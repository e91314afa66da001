"""Two one-operation kernels that run pypto's FP8 casts through the calculator (SIM + pass verify).

tests/kernels/test_calculator_codec.py uses them to measure the calculator's E4M3 decode (FP8 ->
FP32) and encode (FP32 -> FP8) on every code and every FP32 value class, so that
golden.codec.PYPTO_CALCULATOR_CODEC is a measured model rather than a guess.
Import only after kernels.pypto_workarounds.load_pypto().
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
import pypto

from pfa_verify.kernels.jit import jit

__all__ = ["make_decode_probe", "make_encode_probe"]


def make_decode_probe(rows: int, cols: int):
    """Kernel (codes: fp8 [rows, cols], out: fp32 [rows, cols]) computing out = float32(codes)."""

    @jit(run_mode=pypto.RunMode.SIM, pass_verify=True)
    def decode_probe(
        codes: pypto.Tensor((rows, cols), pypto.DT_FP8E4M3),
        out: pypto.Tensor((rows, cols), pypto.DT_FP32),
    ):
        pypto.set_vec_tile_shapes(min(rows, 16), cols)
        out[:] = pypto.cast(codes, pypto.DT_FP32)

    return decode_probe


def make_encode_probe(rows: int, cols: int):
    """Kernel (x: fp32 [rows, cols], out: fp8 [rows, cols]) computing out = e4m3(x), the cast the
    paged-attention kernel uses to quantize P."""

    @jit(run_mode=pypto.RunMode.SIM, pass_verify=True)
    def encode_probe(
        x: pypto.Tensor((rows, cols), pypto.DT_FP32),
        out: pypto.Tensor((rows, cols), pypto.DT_FP8E4M3),
    ):
        pypto.set_vec_tile_shapes(min(rows, 16), cols)
        out[:] = pypto.cast(x, pypto.DT_FP8E4M3)

    return encode_probe
