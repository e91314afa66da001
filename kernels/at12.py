"""Our AT-12 QK^T MatMul Scale kernel (SPEC §6), the C1 stage of the attention skeleton on its own.

scores = matmul(Q, K, FP32, b_trans=True) * scale, scale = 1/sqrt(head_dim) unless given.
FP8 variant (dequant_after): Q, K in E4M3 with per-token scales; the FP32 result is dequantized
first (q_scale per row, k_scale transposed to a row) and scaled second (SPEC §6).

The key axis is walked in tiles of `k_tile` rows; the tail tile is a view with a valid shape, so a
length that `k_tile` does not divide never reads past the end of K. Cube work (the matmul) and
vector work (dequant and scale) are separated: cube tile shapes before the matmul, vector tile
shapes and a merge scope of their own for the vector chain.
Import only after kernels.pypto_workarounds.load_pypto().
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
from dataclasses import dataclass

import pypto

from pfa_verify.kernels.jit import jit

__all__ = ["At12KernelConfig", "make_at12_kernel"]

_CUBE = ([128, 128], [128, 128], [128, 128])
_SCOPE_DEQUANT_SCALE = 1


@dataclass(frozen=True)
class At12KernelConfig:
    """Static description of one AT-12 kernel: sizes, input dtype name, scale, key tile."""

    q_tile: int
    k_len: int
    head_dim: int
    dtype: str  # "bf16", "fp16" or "fp8"
    scale: float
    k_tile: int = 128

    @property
    def dequant_after(self) -> bool:
        return self.dtype == "fp8"


_DTYPES = {"bf16": "DT_BF16", "fp16": "DT_FP16", "fp8": "DT_FP8E4M3"}


def _k_tiles(cfg: At12KernelConfig):
    for start in range(0, cfg.k_len, cfg.k_tile):
        yield start, min(cfg.k_tile, cfg.k_len - start)


def make_at12_kernel(cfg: At12KernelConfig, *, run_mode, pass_verify: bool):
    """The jit kernel for `cfg`: (q, k, [q_scale, k_scale,] out) -> out written in place."""
    dt = getattr(pypto, _DTYPES[cfg.dtype])
    qt, kl, d, kt = cfg.q_tile, cfg.k_len, cfg.head_dim, cfg.k_tile
    wrap = jit(run_mode=run_mode, pass_verify=pass_verify)

    def c1(q, k, j0, valid):
        kj = pypto.view(k, [kt, d], [j0, 0], valid_shape=[valid, d])
        pypto.set_cube_tile_shapes(*_CUBE)
        s = pypto.matmul(q, kj, pypto.DT_FP32, a_trans=False, b_trans=True)
        return pypto.view(s, [qt, kt], [0, 0], valid_shape=[qt, valid])

    if cfg.dequant_after:
        @wrap
        def at12_fp8(
            q: pypto.Tensor((qt, d), dt),
            k: pypto.Tensor((kl, d), dt),
            q_scale: pypto.Tensor((qt, 1), pypto.DT_FP32),
            k_scale: pypto.Tensor((kl, 1), pypto.DT_FP32),
            out: pypto.Tensor((qt, kl), pypto.DT_FP32),
        ):
            ks_row = pypto.reshape(k_scale, [1, kl], inplace=True)
            for j0, valid in _k_tiles(cfg):
                s = c1(q, k, j0, valid)
                pypto.set_vec_tile_shapes(qt, kt)
                pypto.set_pass_options(sg_set_scope=_SCOPE_DEQUANT_SCALE)
                ks_j = pypto.view(ks_row, [1, kt], [0, j0], valid_shape=[1, valid])
                s = pypto.mul(pypto.mul(s, q_scale), ks_j)
                s = pypto.mul(s, cfg.scale)
                pypto.set_pass_options(sg_set_scope=-1)
                pypto.assemble(s, [0, j0], out)

        return at12_fp8

    @wrap
    def at12(
        q: pypto.Tensor((qt, d), dt),
        k: pypto.Tensor((kl, d), dt),
        out: pypto.Tensor((qt, kl), pypto.DT_FP32),
    ):
        for j0, valid in _k_tiles(cfg):
            s = c1(q, k, j0, valid)
            pypto.set_vec_tile_shapes(qt, kt)
            pypto.set_pass_options(sg_set_scope=_SCOPE_DEQUANT_SCALE)
            s = pypto.mul(s, cfg.scale)
            pypto.set_pass_options(sg_set_scope=-1)
            pypto.assemble(s, [0, j0], out)

    return at12
