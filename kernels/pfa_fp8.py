"""Our FP8 paged-attention kernel for the Ascend 950 (DAV_3510), written against the pypto 0.2.0 API.

Semantics: SPEC §2 (one output row per batch b, query position i, query head h). Structure: the
five-level loop of the seed article (b / s1 / n2 / g / s2) with B and the block count dynamic.

Per s2 tile (SPEC §2.3), with the cube and vector stages kept apart:
  C1  gather K (and its scales) through block_table (-1 clamped to block 0), MM1 = q8 @ k8^T (FP32)
  V1  dequantize (q_scale per row, k_scale per column), then * softmax_scale; local softmax
      m_j, P = exp(S - m_j), l_j; quantize P per row (scale 448 / rowmax|P|)
  C2  gather V, MM2 = P8 @ v8 (FP32)
  V2  dequantize (p_scale per row, v_scale per channel), online update of (m, l, O), and on the
      last tile out = bf16(O / l)
one function each (_c1_scores, _v1_softmax, _c2_values, _v2_update), on the tile's TileStep.
Rows whose visible length `cur` is 0 run no tile and keep the caller's zeros (SPEC §2.5).

Cube/vector separation. pypto's graph partitioner refuses to put cube operations (A_MUL_B) and
vector ones in one subgraph ("Try to merge operations with different OpCoreType"). Each stage
therefore sets its own tile shapes right before it (set_cube_tile_shapes before each matmul,
set_vec_tile_shapes before each vector chain, as the AT-12 seed article prescribes), and each
vector chain runs in its own merge scope (set_pass_options(sg_set_scope=N) ... -1), so the matmul
never shares a scope with the gather copies or the vector chain. Scope ids are per stage.

Import this module only after kernels.pypto_workarounds.load_pypto() (the sim backend does).
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
from dataclasses import dataclass
from typing import Any, TypeAlias

import pypto

from pfa_verify.golden.quant import FP8_MAX
from pfa_verify.kernels.config import (
    UPSTREAM_PASS_OPTIONS,
    UPSTREAM_RUNTIME_OPTIONS,
    PagedAttentionKernelConfig,
    softmax_tile,
)
from pfa_verify.kernels.jit import jit

__all__ = ["paged_attention_fp8_body", "make_kernel", "TileStep"]

#: A pypto tensor or symbolic scalar of the trace: pypto 0.2.0 ships no types, so it is Any to mypy.
PyptoValue: TypeAlias = Any

# Merge-scope ids of the vector stages (any distinct positive ints; -1 closes a scope).
_SCOPE_DEQUANT_SOFTMAX = 1
_SCOPE_QUANT_P = 2
_SCOPE_UPDATE = 3
_SCOPE_OUTPUT = 4


def _scoped(scope_id: int):
    """Context manager: everything built inside goes into merge scope `scope_id`."""

    class _Scope:
        def __enter__(self):
            pypto.set_pass_options(sg_set_scope=scope_id)

        def __exit__(self, *exc):
            pypto.set_pass_options(sg_set_scope=-1)
            return False

    return _Scope()


def _gather_tile(cfg: PagedAttentionKernelConfig, src_2d, block_table, b_idx, s2_idx, n2_idx,
                 width: int, dtype, valid_rows, name: str):
    """Copy the s2_tile rows of tile s2_idx for kv head n2_idx out of the paged cache.

    src_2d is the cache viewed as [NB * BS, NKV * width]. Block-table entries are clamped to >= 0
    (-1 means unused; its rows lie past `cur` and are cut off by the valid shape), and the table
    column is clamped to max_blocks - 1 so a table exactly as wide as the valid blocks is never read
    past its end when s2_tile does not divide the walk.
    """
    bs = cfg.block_size
    tile = pypto.tensor([cfg.s2_tile, width], dtype, name)
    for i in range(cfg.blocks_per_tile):
        column = (s2_idx * cfg.blocks_per_tile + i).min(cfg.max_blocks - 1)
        block = block_table[b_idx, column].max(0)
        tile[i * bs:(i + 1) * bs, 0:] = pypto.view(src_2d, [bs, width], [block * bs, n2_idx * width])
    return pypto.view(tile, [cfg.s2_tile, width], [0, 0], valid_shape=[valid_rows, width])


def paged_attention_fp8_body(
    q: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    q_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    k_cache: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    k_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    v_cache: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    v_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    block_table: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    out: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16),
    cfg,
):
    """FP8 paged attention (SPEC §2). Tensors as in SPEC §1; `cfg` a PagedAttentionKernelConfig."""
    s1, nq, nkv, d = cfg.s1, cfg.nq, cfg.nkv, cfg.head_dim
    bs, group, g_tile, s2_tile = cfg.block_size, cfg.group, cfg.g_tile, cfg.s2_tile
    batch = kv_act_seqs.shape[0]
    num_blocks = k_cache.shape[0]

    q_2d = pypto.reshape(q, [batch * s1 * nq, d], inplace=True)
    qs_2d = pypto.reshape(q_scale, [batch * s1 * nq, 1], inplace=True)
    k_2d = pypto.reshape(k_cache, [num_blocks * bs, nkv * d], inplace=True)
    ks_2d = pypto.reshape(k_scale, [num_blocks * bs, nkv], inplace=True)
    v_2d = pypto.reshape(v_cache, [num_blocks * bs, nkv * d], inplace=True)
    vs_2d = pypto.reshape(v_scale, [batch * nkv, d], inplace=True)

    for b_idx in pypto.loop(batch, name="LOOP_b", idx_name="b_idx"):
        for s1_idx in pypto.loop(s1, name="LOOP_s1", idx_name="s1_idx"):
            cur = (kv_act_seqs[b_idx] - (s1 - 1 - s1_idx)).max(0)
            s2_loop = pypto.ceildiv(cur, s2_tile)
            row = b_idx * s1 + s1_idx
            for n2_idx in pypto.loop(nkv, name="LOOP_n2", idx_name="n2_idx"):
                for g_idx in pypto.loop(group // g_tile, name="LOOP_g", idx_name="g_idx"):
                    head = n2_idx * group + g_idx * g_tile
                    m_acc = pypto.tensor([g_tile, 1], pypto.DT_FP32, "m_acc")
                    l_acc = pypto.tensor([g_tile, 1], pypto.DT_FP32, "l_acc")
                    o_acc = pypto.tensor([g_tile, d], pypto.DT_FP32, "o_acc")
                    for s2_idx in pypto.loop(s2_loop, name="LOOP_s2", idx_name="s2_idx",
                                             unroll_list=[8, 4, 2, 1]):
                        valid = (cur - s2_idx * s2_tile).min(s2_tile)
                        _tile_step(cfg, TileStep(
                            q_2d=q_2d, qs_2d=qs_2d, k_2d=k_2d, ks_2d=ks_2d, v_2d=v_2d, vs_2d=vs_2d,
                            block_table=block_table, out=out, b_idx=b_idx, n2_idx=n2_idx,
                            s2_idx=s2_idx, row=row, head=head, valid=valid,
                            m_acc=m_acc, l_acc=l_acc, o_acc=o_acc))


@dataclass(frozen=True, kw_only=True)
class TileStep:
    """What one s2 tile reads and writes: the 2-D views of the call's tensors (the caches viewed as
    [NB * BS, NKV * width]), the loop indices of the tile (``row`` = b * S1 + i, ``head`` the first
    query head of the g tile, ``valid`` its token count) and the row's online-softmax accumulators."""
    q_2d: PyptoValue
    qs_2d: PyptoValue
    k_2d: PyptoValue
    ks_2d: PyptoValue
    v_2d: PyptoValue
    vs_2d: PyptoValue
    block_table: PyptoValue
    out: PyptoValue
    b_idx: PyptoValue
    n2_idx: PyptoValue
    s2_idx: PyptoValue
    row: PyptoValue
    head: PyptoValue
    valid: PyptoValue
    m_acc: PyptoValue
    l_acc: PyptoValue
    o_acc: PyptoValue


def _tile_step(cfg: PagedAttentionKernelConfig, t: TileStep) -> None:
    """One s2 tile: C1, V1, C2, V2 of the module docstring."""
    q_row = t.row * cfg.nq + t.head
    s_raw, kscale_j = _c1_scores(cfg, t, q_row)
    m_j, l_j, p8, p_scale = _v1_softmax(cfg, t, s_raw, kscale_j, q_row)
    o_raw = _c2_values(cfg, t, p8)
    _v2_update(cfg, t, o_raw, p_scale, m_j, l_j)


def _c1_scores(cfg: PagedAttentionKernelConfig, t: TileStep, q_row):
    """C1: gather K and its per-token scales, MM1 = q8 @ k8^T in FP32. Returns (S [g_tile, s2_tile] with
    ``valid`` columns, the tile's K scales [s2_tile, 1])."""
    d, g_tile, s2_tile, valid = cfg.head_dim, cfg.g_tile, cfg.s2_tile, t.valid
    pypto.set_vec_tile_shapes(*softmax_tile(cfg))
    qi = pypto.view(t.q_2d, [g_tile, d], [q_row, 0])
    kj = _gather_tile(cfg, t.k_2d, t.block_table, t.b_idx, t.s2_idx, t.n2_idx, d, pypto.DT_FP8E4M3, valid, "kj")
    kscale_j = _gather_tile(cfg, t.ks_2d, t.block_table, t.b_idx, t.s2_idx, t.n2_idx, 1, pypto.DT_FP32, valid,
                            "kscale_j")
    pypto.set_cube_tile_shapes(*[list(p) for p in cfg.c1_tile])
    s_raw = pypto.matmul(qi, kj, pypto.DT_FP32, a_trans=False, b_trans=True)
    return pypto.view(s_raw, [g_tile, s2_tile], [0, 0], valid_shape=[g_tile, valid]), kscale_j


def _v1_softmax(cfg: PagedAttentionKernelConfig, t: TileStep, s_raw, kscale_j, q_row):
    """V1: dequantize first, then the softmax scale (SPEC §2.3); local softmax; quantize P per row
    (scale 448 / rowmax|P|). Returns (m_j, l_j, P8, p_scale)."""
    g_tile, s2_tile, valid = cfg.g_tile, cfg.s2_tile, t.valid
    pypto.set_vec_tile_shapes(*softmax_tile(cfg))
    with _scoped(_SCOPE_DEQUANT_SOFTMAX):
        qscale_i = pypto.view(t.qs_2d, [g_tile, 1], [q_row, 0])
        kscale_row = pypto.reshape(kscale_j, [1, s2_tile], valid_shape=[1, valid])
        s = pypto.mul(pypto.mul(s_raw, qscale_i), kscale_row)
        s = pypto.mul(s, cfg.softmax_scale)
        m_j = pypto.amax(s, dim=-1, keepdim=True)
        p = pypto.exp(pypto.sub(s, m_j))
        l_j = pypto.sum(p, dim=-1, keepdim=True)
    with _scoped(_SCOPE_QUANT_P):
        p_max = pypto.amax(pypto.abs(p), dim=-1, keepdim=True)
        p_quant_scale = pypto.div(pypto.full([g_tile, 1], FP8_MAX, pypto.DT_FP32), p_max)
        p_scale = pypto.div(pypto.full([g_tile, 1], 1.0, pypto.DT_FP32), p_quant_scale)
        p8 = pypto.cast(pypto.mul(p, p_quant_scale), pypto.DT_FP8E4M3)
    return m_j, l_j, p8, p_scale


def _c2_values(cfg: PagedAttentionKernelConfig, t: TileStep, p8):
    """C2: gather V, MM2 = P8 @ v8 in FP32 ([g_tile, D])."""
    pypto.set_vec_tile_shapes(*softmax_tile(cfg))
    vj = _gather_tile(cfg, t.v_2d, t.block_table, t.b_idx, t.s2_idx, t.n2_idx, cfg.head_dim, pypto.DT_FP8E4M3,
                      t.valid, "vj")
    pypto.set_cube_tile_shapes(*[list(p) for p in cfg.c2_tile])
    return pypto.matmul(p8, vj, pypto.DT_FP32)


def _v2_update(cfg: PagedAttentionKernelConfig, t: TileStep, o_raw, p_scale, m_j, l_j) -> None:
    """V2: dequantize (p_scale per row, v_scale per channel), the online update of (m, l, O), and on the
    last tile the output row bf16(O / l) (SPEC §2.3-2.4)."""
    d, g_tile, nkv = cfg.head_dim, cfg.g_tile, cfg.nkv
    b_idx, n2_idx, s2_idx = t.b_idx, t.n2_idx, t.s2_idx
    m_acc, l_acc, o_acc = t.m_acc, t.l_acc, t.o_acc
    pypto.set_vec_tile_shapes(*cfg.v2_tile)
    with _scoped(_SCOPE_UPDATE):
        vscale_n = pypto.view(t.vs_2d, [1, d], [b_idx * nkv + n2_idx, 0])
        o_j = pypto.mul(pypto.mul(o_raw, p_scale), vscale_n)
        if pypto.cond(pypto.is_loop_begin(s2_idx)):
            m_acc[:] = m_j
            l_acc[:] = l_j
            o_acc[:] = o_j
        else:
            m_new = pypto.maximum(m_acc, m_j)
            a = pypto.exp(pypto.sub(m_acc, m_new))
            c = pypto.exp(pypto.sub(m_j, m_new))
            l_acc[:] = pypto.add(pypto.mul(l_acc, a), pypto.mul(l_j, c))
            o_acc[:] = pypto.add(pypto.mul(o_acc, a), pypto.mul(o_j, c))
            m_acc[:] = m_new
    if pypto.cond(pypto.is_loop_end(s2_idx)):
        with _scoped(_SCOPE_OUTPUT):
            pypto.set_vec_tile_shapes(16, *cfg.v2_tile)
            o_final = pypto.div(o_acc, l_acc)
            o_3d = pypto.cast(pypto.reshape(o_final, [1, g_tile, d]), pypto.DT_BF16)
            pypto.assemble(o_3d, [t.row, t.head, 0], t.out)


def make_kernel(*, run_mode, pass_verify: bool, pass_options: dict | None = None,
                runtime_options: dict | None = None):
    """The body wrapped for one backend (kernels/jit.py), with the upstream runtime and pass options
    (kernels/config.py) unless others are given."""
    return jit(run_mode=run_mode, pass_verify=pass_verify,
               runtime_options=UPSTREAM_RUNTIME_OPTIONS if runtime_options is None else runtime_options,
               pass_options=UPSTREAM_PASS_OPTIONS if pass_options is None else pass_options)(paged_attention_fp8_body)
