"""A kernel in PyPTO-Gym's calling convention that reads one block-table column past the table.

``reads_past_the_table`` is our kernel (kernels/pfa_fp8.py) with the table-column clamp taken out: its
tile walk reads ``block_table[b, j]`` for every column j the walk covers, ``ceil(cur / s2_tile) *
(s2_tile / block_size)`` of them. Where s2_tile does not divide the length, that is more columns than
a table exactly as wide as the valid blocks has (catalog case ``edge_tail_tile_3_tokens``: S2 515,
s2_tile 256, a [1, 5] table, column 5 read), as PyPTO-Gym's kernel does (issue 20). The tokens it
would fetch lie past ``cur``, so the numbers come out right: only a bounds check sees the read.
Loaded by file path (--backend pypto-gym:tests/kernels/out_of_bounds_kernels.py:reads_past_the_table);
import it only after kernels.pypto_workarounds.load_pypto().
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
import dataclasses

import pypto

from pfa_verify.kernels.pfa_fp8 import paged_attention_fp8_body

_OPTIONS = dict(runtime_options={"stitch_function_max_num": 512, "device_sched_mode": 0},
                verify_options={"enable_pass_verify": False})
_UNCLAMPED = 1 << 30     # a column clamp that never bites


@dataclasses.dataclass(frozen=True)
class _WalkConfig:
    s1: int
    nq: int
    nkv: int
    head_dim: int
    block_size: int
    max_blocks: int
    group: int
    g_tile: int
    s2_tile: int
    blocks_per_tile: int
    softmax_scale: float
    c1_tile: list
    c2_tile: list
    v1_tile: tuple
    v2_tile: tuple


@pypto.frontend.jit(**_OPTIONS)
def reads_past_the_table(
    q: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    q_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    k: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    k_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    v: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    v_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    block_table: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    atten_out: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16),
    softmax_scale, tile_config
):
    nq, (block_size, nkv, head_dim) = q.shape[1], k.shape[1:4]
    cfg = _WalkConfig(
        s1=q.shape[0] // kv_act_seqs.shape[0], nq=nq, nkv=nkv, head_dim=head_dim, block_size=block_size,
        max_blocks=_UNCLAMPED, group=nq // nkv, g_tile=tile_config.g_tile, s2_tile=tile_config.s2_tile,
        blocks_per_tile=tile_config.s2_tile // block_size, softmax_scale=softmax_scale,
        c1_tile=tile_config.c1_tile_shape, c2_tile=tile_config.c2_tile_shape,
        v1_tile=(128, tile_config.s2_tile), v2_tile=tuple(tile_config.v2_tile_shape))
    paged_attention_fp8_body(q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, atten_out, cfg)


def make_row_gather(rows: int = 8, width: int = 128):
    """Kernel (x: fp32 [N, width], starts: int32 [M], pick: int32 [1], out: fp32 [rows, width]) computing
    ``out = x[starts[pick[0]] : + rows]``: a scalar read at a data-dependent index (``starts[pick[0]]``)
    and a view at a data-dependent row, the two accesses W12 checks, on inputs small enough to pick
    every case by hand. N and M are dynamic; pypto clips a view that runs past x's end (its tail idiom)."""

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM},
                        verify_options={"enable_pass_verify": True, "pass_verify_pass_filter": []})
    def row_gather(
        x: pypto.Tensor([pypto.DYNAMIC, width], pypto.DT_FP32),
        starts: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
        pick: pypto.Tensor([1], pypto.DT_INT32),
        out: pypto.Tensor([rows, width], pypto.DT_FP32),
    ):
        pypto.set_vec_tile_shapes(rows, width)
        start = starts[pick[0]]
        out[:] = pypto.add(pypto.view(x, [rows, width], [start, 0]), 0.0)

    return row_gather
