"""The executable spec: FP8 paged attention as the plain five-level loop of SPEC §2.

b / s1 / n2 / g / s2, one tile at a time, the way the kernel walks it. It shares its stages with the
vectorized golden (``golden.attention``) and must agree with it bit for bit; it is kept plain on
purpose, so a reader can check it against docs/spec.md line by line. Use ``golden.paged_attention_fp8``
for speed.
"""
from __future__ import annotations

import torch

from .attention import dequantize_scores, tile_values
from .codec import Fp8Codec, get_codec
from .matmul import exact_matmul
from .softmax_state import OnlineSoftmaxState, local_softmax
from .validate import check_on_cpu, check_paged_attention_args, check_scores_in_float32

__all__ = ["paged_attention_fp8_loop"]


def paged_attention_fp8_loop(
    q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor,
    v_cache: torch.Tensor, v_scale: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
    softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
    codec: Fp8Codec | str | None = None,
) -> torch.Tensor:
    """bfloat16 [B*S1, NQ, D]: the same result as ``golden.paged_attention_fp8``, one tile at a time."""
    check_on_cpu(q=q, q_scale=q_scale, k_cache=k_cache, k_scale=k_scale, v_cache=v_cache, v_scale=v_scale,
                 block_table=block_table, kv_act_seqs=kv_act_seqs)
    dims = check_paged_attention_args(
        q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
        softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile,
    )
    check_scores_in_float32(q_scale, k_scale, block_table, kv_act_seqs, dims)
    codec = get_codec(codec)
    bs, group = dims.block_size, dims.group
    out = torch.zeros(q.shape)  # rows with cur == 0 stay 0 (SPEC §2.5)
    for b in range(dims.batch):
        for i in range(dims.s1):
            row = b * dims.s1 + i
            cur = max(0, int(kv_act_seqs[b]) - (dims.s1 - 1 - i))  # SPEC §2.1
            for n in range(dims.nkv):
                for g0 in range(0, group, dims.g_tile):
                    heads = slice(n * group + g0, n * group + g0 + dims.g_tile)  # GQA: heads of kv head n
                    q_tile = codec.from_fp8(q[row, heads])  # [g_tile, D]
                    state = OnlineSoftmaxState.empty((dims.g_tile,), dims.head_dim)
                    for start in range(0, cur, dims.s2_tile):
                        tokens = torch.arange(start, min(start + dims.s2_tile, cur))
                        blocks = block_table[b, tokens // bs].long()  # SPEC §2.2
                        rows_in_block = tokens % bs
                        k = codec.from_fp8(k_cache[blocks, rows_in_block, n])  # [T, D]
                        v = codec.from_fp8(v_cache[blocks, rows_in_block, n])  # [T, D]
                        k_s = k_scale[blocks, rows_in_block, n]  # [T, 1]
                        scores = dequantize_scores(exact_matmul(q_tile, k.T), q_scale[row, heads], k_s.T, dims.softmax_scale)
                        m_j, p, l_j = local_softmax(scores)
                        o_j = tile_values(p, v, v_scale[b, n][None, :], codec)
                        state.update(m_j, l_j, o_j)
                    out[row, heads] = state.finalize()
    return out.bfloat16()
