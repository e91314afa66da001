"""FP8 paged attention (SPEC §2): the stages, and the vectorized golden built from them.

For batch b, query position i, kv head n and the query heads h of its group:

1. ``cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` tokens are visible (causal within S1).
2. Token t is row ``t % BS`` of block ``block_table[b, t // BS]``, KV head ``h // group``.
3. Per ``s2_tile`` of tokens: MM1 (``exact_matmul``), ``dequantize_scores``, ``local_softmax``,
   ``tile_values`` (P quantization, MM2, dequant), then the online update.
4. ``out = bf16(O / l)``, round to nearest even; 5. rows with ``cur == 0`` are 0.

``paged_attention_fp8`` evaluates the tiles of every (b, i, n) together: the (batch, tile) pairs
that hold tokens are packed (a short batch costs only its own tiles), and each row's ``cur`` masks
its columns. Only the online update loops over tiles (``OnlineSoftmaxState.update_tiles``),
because the semantics do. ``golden.attention_loop`` is the same math written as the plain
five-level loop; tests hold the two to bit-identical outputs.

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

__all__ = ["paged_attention_fp8", "visible_lengths", "dequantize_scores", "tile_values", "dequantize_values"]


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
    return dequantize_values(exact_matmul(p8, v), p_scale, v_scale)


def dequantize_values(raw: torch.Tensor, p_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """float32 ``raw * p_scale[row] * v_scale[channel]``, in that order (SPEC §2.3, after MM2)."""
    return raw * p_scale * v_scale


# Tiles are evaluated in chunks of about this many K elements, so that K and V stay in cache while
# they are used (one pass over all of K in float64 costs more than the whole loop golden).
_CHUNK_ELEMENTS = 1 << 20


def _token_slots(block_table: torch.Tensor, batch: torch.Tensor, token: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(physical block, row in block) of token positions ``token`` [P, T] of batches ``batch`` [P].

    Every position must lie inside its batch's valid length (SPEC §2.2), so no entry is -1.
    """
    return block_table.to(torch.int64)[batch[:, None], token // block_size], token % block_size


def _gather_tiles(cache: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[N, P, T, X]: the cache ([NB, BS, N, X]) rows at ``slots``, kv head first."""
    return cache.permute(2, 0, 1, 3)[(slice(None), *slots)]


def _paged_attention(dims: PagedAttentionDims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, codec: Fp8Codec) -> torch.Tensor:
    batch, s1, nkv, group, d = dims.batch, dims.s1, dims.nkv, dims.group, dims.head_dim
    rows = s1 * group  # the rows of one (kv head, batch): query positions i x heads g of the group
    tile = dims.s2_tile
    lengths = kv_act_seqs.to(torch.int64)
    tiles_of = (lengths + tile - 1) // tile  # the last query position sees every valid token
    most_tiles = int(tiles_of.max())
    if most_tiles == 0:
        return torch.zeros(q.shape, dtype=torch.bfloat16)
    # The (batch, tile) pairs that hold tokens, packed: a short batch costs only its own tiles.
    pair_batch, pair_tile = torch.nonzero(torch.arange(most_tiles)[None, :] < tiles_of[:, None], as_tuple=True)

    # Kv head leads, so that every (n, pair) block of K and V is one contiguous matrix for the matmuls.
    q_rows = codec.from_fp8(q, torch.float64).view(batch, s1, nkv, group, d).permute(2, 0, 1, 3, 4).reshape(nkv, batch, rows, d)
    q_scale_rows = q_scale.view(batch, s1, nkv, group).permute(2, 0, 1, 3).reshape(nkv, batch, rows, 1)
    v_scale_rows = v_scale.permute(1, 0, 2).reshape(nkv, batch, 1, d)
    # Column t of row (i, g) is visible when t < cur[b, i] (SPEC §2.1).
    row_cur = visible_lengths(kv_act_seqs, s1)[:, :, None].expand(batch, s1, group).reshape(batch, rows, 1)

    # Each tile's (m_j, l_j, O_j, has tokens), laid out [B, tiles, N, R, .] for the fold below.
    m_t = torch.full((batch, most_tiles, nkv, rows, 1), -torch.inf)
    l_t = torch.zeros((batch, most_tiles, nkv, rows, 1))
    o_t = torch.zeros((batch, most_tiles, nkv, rows, d))
    has_tokens = torch.zeros((batch, most_tiles, rows, 1), dtype=torch.bool)
    chunk = max(1, _CHUNK_ELEMENTS // (nkv * tile * d))
    block_size = dims.block_size
    per_tile = tile // block_size  # blocks per s2 tile
    blocks_of = (lengths + block_size - 1) // block_size
    for first in range(0, pair_batch.numel(), chunk):
        pb, pt = pair_batch[first:first + chunk], pair_tile[first:first + chunk]
        pairs = pb.numel()
        token = pt[:, None] * tile + torch.arange(tile)[None, :]  # [P, tile]
        # K and V are read by blocks: the blocks of each pair's tile that the batch owns, so a short
        # last tile costs only its blocks. Block q_pair[k] holds tokens q_token[k] of its pair's tile.
        q_pair, q_block = torch.nonzero(pt[:, None] * per_tile + torch.arange(per_tile)[None, :] < blocks_of[pb, None], as_tuple=True)
        q_batch = pb[q_pair]
        q_token = (pt[q_pair] * per_tile + q_block)[:, None] * block_size + torch.arange(block_size)[None, :]
        # The padding of a batch's last block re-reads its last token; it is masked like any
        # position past a row's length.
        slots = _token_slots(block_table, q_batch, torch.minimum(q_token, lengths[q_batch, None] - 1), block_size)
        k = codec.decode(_gather_tiles(k_cache.view(torch.uint8), slots), torch.float64)  # [N, Q, BS, D]
        v_codes = _gather_tiles(v_cache.view(torch.uint8), slots)
        # Unread V rows become code 0 (value 0): P8 is 0 there, but 0 * NaN garbage would still be NaN.
        v_codes.masked_fill_((q_token >= lengths[q_batch, None])[None, :, :, None], 0)
        v = codec.decode(v_codes, torch.float64)

        # MM1 per block, laid into the tiles; blocks a tile lacks stay 0 and are masked below.
        raw = torch.zeros((nkv, pairs, per_tile, rows, block_size))
        raw[:, q_pair, q_block] = exact_matmul(q_rows[:, q_batch], k.transpose(-1, -2))
        k_scale_cols = torch.zeros((nkv, pairs, per_tile, block_size))
        k_scale_cols[:, q_pair, q_block] = _gather_tiles(k_scale, slots)[..., 0]
        raw = raw.permute(0, 1, 3, 2, 4).reshape(nkv, pairs, rows, tile)
        visible = (token[:, None, :] < row_cur[pb]).unsqueeze(0)  # [1, P, R, tile]
        scores = dequantize_scores(raw, q_scale_rows[:, pb], k_scale_cols.view(nkv, pairs, 1, tile), dims.softmax_scale)
        m_j, p, l_j = local_softmax(scores, visible)
        p8, p_scale = quantize_rows(p, valid=visible.expand(p.shape), codec=codec)
        # MM2 per block, summed per tile in float64: every partial sum is exact (golden.matmul), so
        # this is the tile's exact product, rounded once.
        p8_blocks = p8.view(nkv, pairs, rows, per_tile, block_size).permute(0, 1, 3, 2, 4)[:, q_pair, q_block]
        mm2 = torch.zeros((nkv, pairs, rows, d), dtype=torch.float64).index_add_(1, q_pair, torch.matmul(p8_blocks.double(), v))
        o_j = dequantize_values(mm2.float(), p_scale, v_scale_rows[:, pb])
        m_t[pb, pt] = m_j.transpose(0, 1)
        l_t[pb, pt] = l_j.transpose(0, 1)
        o_t[pb, pt] = o_j.transpose(0, 1)
        has_tokens[pb, pt] = visible[0].any(dim=-1, keepdim=True)

    by_row = (2, 0, 3, 1, 4)  # [N, B, R, tiles, .]: update_tiles folds the tiles of each row in order
    state = OnlineSoftmaxState.empty((nkv, batch, rows), d)
    state.update_tiles(m_t.permute(by_row), l_t.permute(by_row), o_t.permute(by_row),
                       valid=has_tokens.permute(0, 2, 1, 3).unsqueeze(0))
    result = state.finalize().view(nkv, batch, s1, group, d).permute(1, 2, 0, 3, 4)
    # reshape returns a strided view when group == 1; the output must be contiguous (SPEC §1).
    return result.reshape(q.shape).contiguous().bfloat16()


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
