"""FP8 paged attention (SPEC §2): the stages, and the vectorized golden built from them.

For batch b, query position i, kv head n and the query heads h of its group:

1. ``cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` tokens are visible (causal within S1).
2. Token t is row ``t % BS`` of block ``block_table[b, t // BS]``, KV head ``h // group``.
3. Per ``s2_tile`` of tokens: MM1 (``exact_matmul``), ``dequantize_scores``, ``local_softmax``,
   ``tile_values`` (P quantization, MM2, dequant), then the online update.
4. ``out = bf16(O / l)``, round to nearest even; 5. rows with ``cur == 0`` are 0.

``paged_attention_fp8`` evaluates every tile of every (b, i, n) at once: scores for all tokens,
masked by each row's ``cur``, viewed as ``[..., tiles, s2_tile]``. Only the online update loops,
over tiles, because the semantics do. ``golden.attention_loop`` is the same math written as the
plain five-level loop; tests hold the two to bit-identical outputs.

Decisions (SPEC leaves them open), with their tests in tests/golden/test_attention.py:
- ``g_tile`` only partitions heads for the kernel; rows are independent, so it never changes the
  result (``test_g_tile_does_not_change_output``). ``s2_tile`` does: P is quantized per tile.
- A token past ``kv_act_seqs[b]`` is never read, whatever the table or the cache hold there: scores
  are masked with ``where`` (not multiplied), so NaN garbage cannot leak (``test_garbage_*``).
- Inputs are decoded with ``codec`` (default: the spec's E4M3FN), and P is encoded and decoded with
  it: a backend whose hardware reads E4M3 differently is compared against its own codec too.
"""
from __future__ import annotations

import torch

from .codec import Fp8Codec, get_codec
from .matmul import exact_matmul
from .quant import quantize_rows
from .softmax_state import OnlineSoftmaxState, local_softmax
from .validate import PagedAttentionDims, check_paged_attention_args

__all__ = ["paged_attention_fp8", "visible_lengths", "dequantize_scores", "tile_values"]


def visible_lengths(kv_act_seqs: torch.Tensor, s1: int) -> torch.Tensor:
    """int64 [B, S1]: ``cur[b, i] = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` (SPEC §2.1)."""
    behind_last = torch.arange(s1 - 1, -1, -1)
    return torch.clamp(kv_act_seqs.to(torch.int64)[:, None] - behind_last[None, :], min=0)


def dequantize_scores(raw: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """float32 ``raw * q_scale[row] * k_scale[col] * softmax_scale``, in that order (SPEC §2.3).

    q_scale [..., rows, 1] and k_scale [..., 1, cols] (the K scale transposed to the score axis):
    dequantize first, then scale, never the other way round.
    """
    return raw * q_scale * k_scale * torch.tensor(softmax_scale, dtype=torch.float32)


def tile_values(p: torch.Tensor, v: torch.Tensor, v_scale: torch.Tensor, codec: Fp8Codec, valid: torch.Tensor | None = None) -> torch.Tensor:
    """float32 ``O_j = (P8 @ v8) * p_scale * v_scale`` for one tile (SPEC §2.3, MM2).

    p [..., rows, T] from ``local_softmax``; v [..., T, D] decoded E4M3 values (zero where a token
    is not valid); v_scale [..., 1, D], the batch's per-channel scale. P is quantized per row over
    the ``valid`` columns and read back through ``codec``.
    """
    p8, p_scale = quantize_rows(p, valid=valid, codec=codec)
    return exact_matmul(p8, v) * p_scale * v_scale


def _gather_tokens(cache: torch.Tensor, block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """cache[..] rows of tokens 0..length-1 of every batch: [B, length, ...], -1 entries read block 0.

    Positions past a table row's columns read its last column; like the kernel's clamp of -1 to
    block 0, what they read is masked away by the caller.
    """
    token = torch.arange(length)
    column = torch.clamp(token // block_size, max=block_table.shape[1] - 1)
    physical = torch.clamp(block_table.to(torch.int64)[:, column], min=0)
    return cache[physical, (token % block_size)[None, :]]


def _paged_attention(dims: PagedAttentionDims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, codec: Fp8Codec) -> torch.Tensor:
    batch, s1, nkv, group, d = dims.batch, dims.s1, dims.nkv, dims.group, dims.head_dim
    rows = s1 * group
    tile = dims.s2_tile
    cur = visible_lengths(kv_act_seqs, s1)  # [B, S1]
    longest = int(cur.max())
    out = torch.zeros((batch, s1, nkv, group, d))
    if longest == 0:
        return out.reshape(q.shape).bfloat16()
    tiles = -(-longest // tile)
    length = tiles * tile

    # Rows are (i, g) pairs of one (b, n): [B, NKV, 1, R, D] against tiles [B, NKV, T, D, tile].
    q_rows = codec.from_fp8(q).view(batch, s1, nkv, group, d).permute(0, 2, 1, 3, 4).reshape(batch, nkv, 1, rows, d)
    q_scale_rows = q_scale.view(batch, s1, nkv, group, 1).permute(0, 2, 1, 3, 4).reshape(batch, nkv, 1, rows, 1)
    token_valid = torch.arange(length)[None, :] < kv_act_seqs.to(torch.int64)[:, None]  # [B, L]

    k = codec.decode(_gather_tokens(k_cache.view(torch.uint8), block_table, length, dims.block_size))
    k = k.view(batch, tiles, tile, nkv, d).permute(0, 3, 1, 4, 2)  # [B, NKV, T, D, tile]
    k_scale_cols = _gather_tokens(k_scale, block_table, length, dims.block_size)
    k_scale_cols = k_scale_cols.view(batch, tiles, tile, nkv).permute(0, 3, 1, 2).unsqueeze(3)  # [B, NKV, T, 1, tile]
    v = codec.decode(_gather_tokens(v_cache.view(torch.uint8), block_table, length, dims.block_size))
    v = torch.where(token_valid[:, :, None, None], v, 0.0)  # 0 * NaN garbage would still be NaN
    v = v.view(batch, tiles, tile, nkv, d).permute(0, 3, 1, 2, 4)  # [B, NKV, T, tile, D]

    # Column t of row (i, g) is visible when t < cur[b, i].
    row_cur = cur[:, :, None].expand(batch, s1, group).reshape(batch, 1, 1, rows, 1)
    column = torch.arange(length).view(1, 1, tiles, 1, tile)
    visible = column < row_cur  # [B, 1, T, R, tile]

    scores = dequantize_scores(exact_matmul(q_rows, k), q_scale_rows, k_scale_cols, dims.softmax_scale)
    m_j, p, l_j = local_softmax(scores, visible)
    o_j = tile_values(p, v, v_scale.view(batch, nkv, 1, 1, d), codec, valid=visible)

    tile_has_tokens = visible.any(dim=-1, keepdim=True).expand(batch, nkv, tiles, rows, 1)
    state = OnlineSoftmaxState.empty((batch, nkv, rows), d)
    for j in range(tiles):
        state.update(m_j[:, :, j], l_j[:, :, j], o_j[:, :, j], valid=tile_has_tokens[:, :, j])
    result = state.finalize().view(batch, nkv, s1, group, d).permute(0, 2, 1, 3, 4)
    return result.reshape(q.shape).bfloat16()


def paged_attention_fp8(
    q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor,
    v_cache: torch.Tensor, v_scale: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
    softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
    codec: Fp8Codec | str | None = None,
) -> torch.Tensor:
    """bfloat16 [B*S1, NQ, D]: FP8 paged attention as SPEC §2 defines it (vectorized golden).

    Arguments as in SPEC §1: q [B*S1, NQ, D] float8_e4m3fn; q_scale [B*S1, NQ, 1] float32;
    k_cache, v_cache [NB, BS, NKV, D] float8_e4m3fn; k_scale [NB, BS, NKV, 1] float32;
    v_scale [B, NKV, D] float32; block_table [B, MAXB] int32 (-1 = unused);
    kv_act_seqs [B] int32. softmax_scale None means D**-0.5; s2_tile must be a multiple of the
    block size; g_tile (None: the whole group) must divide NQ/NKV; codec None means the spec's
    E4M3FN. Inputs are never modified. Invalid arguments raise ValueError / TypeError.
    """
    dims = check_paged_attention_args(
        q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
        softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile,
    )
    return _paged_attention(dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, get_codec(codec))
