"""FP8 paged attention (SPEC §2): the stages, and the vectorized golden built from them.

For batch b, query position i, kv head n and the query heads h of its group:

1. ``cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` tokens are visible (causal within S1).
2. Token t is row ``t % BS`` of block ``block_table[b, t // BS]``, KV head ``h // group``.
3. Per ``s2_tile`` of tokens: MM1 (``exact_matmul``), ``dequantize_scores``, ``local_softmax``,
   ``tile_values`` (P quantization, MM2, dequant), then the online update.
4. ``out = bf16(O / l)``, round to nearest even; 5. rows with ``cur == 0`` are 0.

``paged_attention_fp8`` evaluates the tiles of every (b, i, n) together: the (batch, tile) pairs
that hold tokens are packed (a short batch costs only its own tiles), and each row's ``cur`` masks
its columns. K and V are read by blocks, and only the blocks a batch owns (MM1 and MM2 run per
block; MM2's exact float64 block sums add up to the tile's). Only the online update loops over
tiles (``OnlineSoftmaxState.from_tiles``, then ``fold_tiles`` for a long context's later windows of
tiles), because the semantics do. ``golden.attention_loop`` is the same math written as the plain
five-level loop; tests hold the two to bit-identical outputs.

Why it looks the way it does: a small case is a few hundred tensor operations, each with a fixed
cost of microseconds, so the integer bookkeeping (which blocks, which rows) and the cache gathers
run in numpy, cache rows are decoded straight into reused per-thread buffers (a fresh
multi-megabyte array costs a page fault per 4 KiB), and the whole evaluation runs in inference
mode. ``pfa-verify bench`` measures it against the loop.

Decisions (SPEC leaves them open), with their tests in tests/golden/test_attention.py:
- ``g_tile`` only partitions heads for the kernel; rows are independent, so it never changes the
  result (``test_g_tile_does_not_change_output``). ``s2_tile`` does: P is quantized per tile.
- A token past ``kv_act_seqs[b]`` is never read, whatever the table or the cache hold there: scores
  are masked with ``where`` (not multiplied), so NaN garbage cannot leak (``test_garbage_*``).
- Inputs are decoded with ``codec`` (default: the spec's E4M3FN), and P is encoded and decoded with
  it: a backend whose hardware reads E4M3 differently is compared against its own codec too.
- A NaN in V reaches exactly the rows that see its token: with S1 > 1 an earlier query position does
  not, although it shares the tile (``test_nan_in_v_past_an_earlier_position_*``).
- The golden runs on the CPU; a tensor on another device is rejected, naming the argument
  (tests/golden/test_validate.py).
"""
from __future__ import annotations

import dataclasses
from typing import TypeAlias, overload

import numpy as np
import torch

from .codec import Fp8Codec, get_codec
from .envelope import AttentionEnvelope, EnvelopeBuilder, TileChunk
from .matmul import exact_matmul
from .model import SPEC_MODEL, ConformanceModel
from .paging import TileLayout, blocks_needed, ceil_div, token_slots, visible_lengths
from .quant import quantize_rows
from .scratch import SCRATCH
from .softmax_state import OnlineSoftmaxState, local_softmax
from .validate import (
    PagedAttentionDims,
    check_on_cpu,
    check_paged_attention_args,
    check_scales_not_negative,
    check_scores_in_float32,
)

__all__ = ["chunk_sizes", "CHUNK_ELEMENTS", "STATE_ELEMENTS", "paged_attention_fp8", "paged_attention_envelope", "checked_call", "PagedAttentionCall", "visible_lengths", "read_cells", "dequantize_scores", "tile_values", "dequantize_values"]


def read_cells(block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *, num_blocks: int, block_size: int,
               s1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bool [NB, BS], bool [B*S1]): the cache rows SPEC §2 item 2 reads (row ``t % BS`` of block
    ``block_table[b, t // BS]`` for ``t < kv_act_seqs[b]``), and the query rows that see a token
    (``cur > 0``, SPEC §2.1). Every other cell (its K scale, q and q_scale of such a row) is garbage no
    kernel may let reach the output. The envelope's scale check and the laws' garbage both read it."""
    _, _, block, row = token_slots(block_table, kv_act_seqs, block_size)
    slots = torch.zeros((num_blocks, block_size), dtype=torch.bool).index_put_((block, row), torch.tensor(True))
    return slots, visible_lengths(kv_act_seqs, s1).reshape(-1) > 0


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


#: One call's tensors in SPEC §1's order: q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs.
CallTensors: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor]


#: Tiles are evaluated in chunks of about this many elements of K, of the scores or of MM2's products per
#: block, whichever a (batch, tile) pair has most of: K and V stay in cache while they are used (one pass
#: over all of K in float64 costs more than the whole loop golden), and the working set stays some 0.1-0.2
#: GiB however many query rows share a KV head (sized by K alone, S1 = 32 rows of 64 heads over 8k tokens
#: held 0.94 GiB).
CHUNK_ELEMENTS = 1 << 20
#: Tile states (float32) held at a time before they are folded: 32 MiB, so that every upstream case
#: folds its tiles at once. The envelope keeps every tile's states and bounds to the end, whatever this is.
STATE_ELEMENTS = 1 << 23


def chunk_sizes(*, batch: int, nkv: int, rows: int, head_dim: int, block_size: int, s2_tile: int,
                tiles: int) -> tuple[int, int]:
    """(pairs, window): the (batch, tile) pairs the vectorized golden evaluates at a time, and the number
    of tiles whose states it folds at a time, for ``rows`` query rows per KV head (S1 * group) and
    ``tiles`` tiles in the longest row (the memory estimate, golden.inputs, sizes its chunks with this too)."""
    per_pair = nkv * max(s2_tile * head_dim, rows * s2_tile, s2_tile // block_size * rows * head_dim)
    return (max(1, CHUNK_ELEMENTS // per_pair),
            max(1, min(tiles, STATE_ELEMENTS // (batch * nkv * rows * (head_dim + 2)))))


class _PagedCache:
    """One call's caches as numpy views with one row per (block, row in block): the gathers are
    numpy fancy indexing, which costs a fraction of torch's per-call overhead on small cases."""

    def __init__(self, k_cache: torch.Tensor, k_scale: torch.Tensor, v_cache: torch.Tensor, dims: PagedAttentionDims):
        slots = dims.num_blocks * dims.block_size
        self.k_codes = k_cache.view(torch.uint8).numpy().reshape(slots, dims.nkv, dims.head_dim)
        self.v_codes = v_cache.view(torch.uint8).numpy().reshape(slots, dims.nkv, dims.head_dim)
        self.k_scale = k_scale.detach().numpy().reshape(slots, dims.nkv)


@overload
def _paged_attention(dims: PagedAttentionDims, tensors: CallTensors, codec: Fp8Codec, envelope: None = None,
                     tiles: int = 0) -> torch.Tensor: ...
@overload
def _paged_attention(dims: PagedAttentionDims, tensors: CallTensors, codec: Fp8Codec, envelope: EnvelopeBuilder,
                     tiles: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
def _paged_attention(dims: PagedAttentionDims, tensors: CallTensors, codec: Fp8Codec, envelope: EnvelopeBuilder | None = None,
                     tiles: int = 0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``O / l`` [B*S1, NQ, D], contiguous (the caller rounds it to bfloat16); with an
    ``envelope`` (golden.envelope.EnvelopeBuilder) also its float32 bounds ``(lo, hi)``, same shape.

    One function on purpose (over 60 lines): it reads as SPEC §2 in order (gather by block_table,
    MM1, dequant, local softmax, P quantization, MM2, the online fold), each stage already one call
    into golden/matmul, softmax_state or quant. What is left is the chunk's index arrays (owner,
    in_tile, slot, token) and layout closures, which every stage and the envelope share: split, each
    part would take and return a dozen of them."""
    q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs = tensors
    batch, s1, nkv, group, d = dims.batch, dims.s1, dims.nkv, dims.group, dims.head_dim
    rows = s1 * group  # the rows of one (batch, kv head): query positions i x heads g of the group
    tile, block_size = dims.s2_tile, dims.block_size
    per_tile = tile // block_size  # blocks per s2 tile
    lengths = kv_act_seqs.numpy().astype(np.int64)
    tiles_of = ceil_div(lengths, tile)  # the last query position sees every valid token
    blocks_of = blocks_needed(lengths, block_size)
    most_tiles = int(tiles_of.max()) if tiles_of.size else 0
    most_tiles = max(most_tiles, tiles) if most_tiles else 0  # a caller may pad the tile axis (golden.envelope: a subset)
    if most_tiles == 0:
        zeros = torch.zeros(q.shape)
        return zeros if envelope is None else (zeros, zeros.clone(), zeros.clone())
    cur = visible_lengths(kv_act_seqs, s1).numpy()  # [B, S1]
    row_cur = np.repeat(cur, group, axis=1)[:, :, None]  # [B, R, 1]: row (i, g) sees cur[b, i] tokens
    # The (batch, tile) pairs that hold tokens, packed: a short batch costs only its own tiles.
    pair_batch, pair_tile = np.nonzero(np.arange(most_tiles) < tiles_of[:, None])
    cache = _PagedCache(k_cache, k_scale, v_cache, dims)
    table = block_table.numpy()

    # Rows of one (batch, kv head) lead: [B, N, R, .], gathered per block or pair below.
    q_codes = np.ascontiguousarray(q.view(torch.uint8).numpy().reshape(batch, s1, nkv, group, d).transpose(0, 2, 1, 3, 4))
    q_rows = codec.decode_array(q_codes, double=True).reshape(batch, nkv, rows, d)
    q_scale_rows = q_scale.detach().numpy().reshape(batch, s1, nkv, group).transpose(0, 2, 1, 3).reshape(batch, nkv, rows, 1)
    v_scale_rows = v_scale.detach().numpy().reshape(batch, nkv, 1, d)
    q_grid = None if envelope is None else envelope.q_grid(q_codes.reshape(batch, nkv, rows, d))
    tiles_per_row = ceil_div(row_cur[:, None, :, 0], tile)  # [B, 1, R]: ceil(cur / s2_tile)
    chunk, window = chunk_sizes(batch=batch, nkv=nkv, rows=rows, head_dim=d, block_size=block_size, s2_tile=tile,
                                tiles=most_tiles)
    # The tiles in windows, each window's states folded before the next is made: they take
    # B * S1 * NQ * (D + 2) floats a tile, which at 128k tokens and S1 > 1 would outgrow the caches.
    # The envelope keeps every tile's bounds to the end: one window.
    window = most_tiles if envelope is not None else window
    state: OnlineSoftmaxState | None = None
    for t0 in range(0, most_tiles, window):
        t1 = min(t0 + window, most_tiles)
        in_window = (pair_tile >= t0) & (pair_tile < t1)
        window_batch, window_tile = pair_batch[in_window], pair_tile[in_window]
        # Each (batch, tile)'s O_j, l_j and m_j, side by side: [B * tiles, N, R, D + 2]. Tiles a batch
        # does not have stay 0 and are not folded (the counts below).
        tile_states = torch.zeros((batch * (t1 - t0), nkv, rows, d + 2))
        for first in range(0, window_batch.size, chunk):
            pb, pt = window_batch[first:first + chunk], window_tile[first:first + chunk]
            pairs = pb.size
            # K and V are read by blocks: the blocks of each pair's tile that the batch owns, so a short
            # last tile costs only its blocks. Block k is block ``in_tile[k]`` of pair ``owner[k]``.
            owner, in_tile = np.nonzero(pt[:, None] * per_tile + np.arange(per_tile) < blocks_of[pb, None])
            block_batch = pb[owner]
            logical = pt[owner] * per_tile + in_tile
            slot = (table[block_batch, logical].astype(np.int64) * block_size)[:, None] + np.arange(block_size)  # [Q, BS]
            token = logical[:, None] * block_size + np.arange(block_size)  # [Q, BS] (SPEC §2.2)
            # K transposed for MM1. The codes are transposed first (1 byte each): a lookup through a
            # strided index is up to 3x slower.
            k_codes = SCRATCH.array("k codes", (slot.shape[0], nkv, d, block_size), np.uint8)
            k_rows = cache.k_codes[slot]  # [Q, BS, N, D]
            np.copyto(k_codes, k_rows.transpose(0, 2, 3, 1))
            k_t = codec.decode_array(k_codes, double=True, out=SCRATCH.array("k", k_codes.shape, np.float64))  # [Q, N, D, BS]
            v_codes = cache.v_codes[slot]  # [Q, BS, N, D]
            # Past a batch's length its last block holds garbage: P8 is 0 there, but 0 * NaN is NaN.
            # Code 0 reads as +0 in every codec.
            v_codes[token >= lengths[block_batch, None]] = 0
            v_codes = v_codes.transpose(0, 2, 1, 3)
            v = torch.from_numpy(codec.decode_array(v_codes, double=True, out=SCRATCH.array("v", v_codes.shape, np.float64)))  # [Q, N, BS, D]
            k_scale_cols = torch.from_numpy(cache.k_scale[slot].transpose(0, 2, 1)[:, :, None, :])  # [Q, N, 1, BS]
            layout = TileLayout(pairs=pairs, nkv=nkv, rows=rows, per_tile=per_tile, block_size=block_size,
                                 owner=torch.from_numpy(owner), in_tile=torch.from_numpy(in_tile))
            q_blocks, k_blocks = torch.from_numpy(q_rows[block_batch]), torch.from_numpy(k_t)
            q_scale_blocks = torch.from_numpy(q_scale_rows[block_batch])
            raw64 = torch.matmul(q_blocks, k_blocks)  # MM1 per block: [Q, N, R, BS], exact (golden/matmul.py)
            scores = dequantize_scores(raw64.float(), q_scale_blocks, k_scale_cols, dims.softmax_scale)
            scores = layout.to_tiles(scores)
            tile_token = (pt[:, None] * tile + np.arange(tile))[:, None, None, :]  # [P, 1, 1, tile]
            visible = torch.from_numpy(tile_token < row_cur[pb][:, None])  # [P, 1, R, tile] (SPEC §2.1)
            m_j, p, l_j = local_softmax(scores, visible)
            # P is exactly 0 off the visible columns, so its row max is the visible columns' max.
            p8_tiles, p_scale = quantize_rows(p, codec=codec)
            p8 = layout.to_blocks(p8_tiles)
            mm2 = torch.matmul(p8.double(), v) + 0.0  # MM2 per block: [Q, N, R, D], exact; a zero sum +0 (golden.matmul)
            if s1 > 1 and torch.isnan(mm2).any():  # NaN in V: it may sit past an earlier position's length
                mm2 = _causal_values(p8, v, token, cur[block_batch])
            # Summed per tile in float64: every partial sum is exact (golden.matmul), so this is the
            # tile's exact product, rounded once below.
            mm2 = layout.per_tile_sum(mm2)
            o_j = dequantize_values(mm2.float(), p_scale, torch.from_numpy(v_scale_rows[pb]))
            states = torch.cat([o_j, l_j, m_j], dim=-1)
            index = torch.from_numpy(pb * (t1 - t0) + pt - t0)
            if window_batch.size == tile_states.shape[0]:  # every batch has every tile: pairs are in place
                tile_states[first:first + pairs] = states
            else:
                tile_states.index_copy_(0, index, states)
            if envelope is not None and q_grid is not None:
                envelope.chunk(TileChunk(raw64=raw64, q_blocks=q_blocks, k_blocks=k_blocks, k_rows=k_rows,
                                     q_grid=torch.from_numpy(q_grid[block_batch]), q_scale=q_scale_blocks, k_scale=k_scale_cols,
                                     visible=visible, p=p, p8=p8_tiles, mm2=mm2, v=v, v_scale=torch.from_numpy(v_scale_rows[pb]),
                                     to_tiles=layout.to_tiles, to_blocks=layout.to_blocks, per_tile_sum=layout.per_tile_sum,
                                     index=index))

        # [B, N, R, tiles, .]: the tiles of each row in order, folded into the online state.
        by_row = tile_states.view(batch, t1 - t0, nkv, rows, d + 2).permute(0, 2, 3, 1, 4)
        counts = np.clip(tiles_per_row - t0, 0, t1 - t0)
        if state is None:
            state = OnlineSoftmaxState.from_tiles(by_row[..., d + 1:], by_row[..., d:d + 1], by_row[..., :d], counts)
        else:
            state.fold_tiles(by_row[..., d + 1:], by_row[..., d:d + 1], by_row[..., :d], counts)
        del tile_states, by_row          # this window's states go before the next window's are made
    assert state is not None
    result = _to_output(state.finalize(), dims, q.shape)
    if envelope is None:
        return result
    lo, hi = envelope.fold(most_tiles, tiles_per_row)
    return result, _to_output(lo, dims, q.shape), _to_output(hi, dims, q.shape)


def _to_output(x: torch.Tensor, dims: PagedAttentionDims, shape: torch.Size) -> torch.Tensor:
    """[B, N, S1 * G, D] row-major by (batch, kv head) -> the output layout [B*S1, NQ, D], contiguous."""
    return x.view(dims.batch, dims.nkv, dims.s1, dims.group, dims.head_dim).transpose(1, 2).reshape(shape).contiguous()


def _causal_values(p8: torch.Tensor, v: torch.Tensor, token: np.ndarray, cur: np.ndarray) -> torch.Tensor:
    """MM2 per block when V holds NaN and S1 > 1: each query position multiplies only the V rows it sees.

    p8 [Q, N, S1 * G, BS], v [Q, N, BS, D], token [Q, BS], cur [Q, S1]. A row's P8 is 0 on the
    columns past its causal length, but a later query position of the same block may see them;
    0 * NaN there would put NaN in a row whose visible tokens hold none.
    """
    s1 = cur.shape[1]
    group = p8.shape[2] // s1
    parts = []
    for i in range(s1):
        unseen = torch.from_numpy(token >= cur[:, i, None])[:, None, :, None]  # [Q, 1, BS, 1]
        parts.append(torch.matmul(p8[:, :, i * group:(i + 1) * group].double(), torch.where(unseen, 0.0, v)) + 0.0)
    return torch.cat(parts, dim=2)


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
    return checked_call(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                        softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile).golden(codec)


def paged_attention_envelope(
    q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor,
    v_cache: torch.Tensor, v_scale: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
    softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
    codec: Fp8Codec | str | None = None, model: ConformanceModel | None = None,
    rows: torch.Tensor | None = None,
) -> AttentionEnvelope:
    """The golden's output and the acceptance envelope around it (SPEC §4.2; golden/envelope/builder.py).

    Arguments as :func:`paged_attention_fp8`; ``model`` (default ``golden.model.SPEC_MODEL``) is the
    set of conforming executions the envelope holds. ``result.golden`` is bit-identical to
    ``paged_attention_fp8``'s output, and ``result.lo <= result.golden <= result.hi`` elementwise.

    ``rows`` (a bool [B*S1] mask over the output rows ``b * S1 + i``, or None for all): build it for those
    rows only. An output row's envelope depends on that row's inputs alone (SPEC §4.2), so there
    ``golden``, ``lo`` and ``hi`` are bit-identical to the full envelope's; the other rows are NaN
    (``result.rows`` says which were built), and the counts cover the built rows. The inputs are checked
    whole either way.
    """
    return checked_call(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                        softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile).envelope(codec, model, rows)


def checked_call(
    q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor,
    v_cache: torch.Tensor, v_scale: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
    softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
) -> PagedAttentionCall:
    """The arguments of :func:`paged_attention_fp8` checked once (golden.validate: on the CPU, the SPEC §1
    table, SPEC §4.1's domain), as a :class:`PagedAttentionCall` that gives the golden under any codec and
    the envelope for any rows without checking them again (the one rule asks for both on one case)."""
    tensors = (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs)
    check_on_cpu(q=q, q_scale=q_scale, k_cache=k_cache, k_scale=k_scale, v_cache=v_cache, v_scale=v_scale,
                 block_table=block_table, kv_act_seqs=kv_act_seqs)
    dims = check_paged_attention_args(*tensors, softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)
    check_scores_in_float32(q_scale, k_scale, block_table, kv_act_seqs, dims)
    return PagedAttentionCall(dims, tensors)


@dataclasses.dataclass(frozen=True)
class PagedAttentionCall:
    """One call's checked arguments (:func:`checked_call`): ``dims`` and the eight tensors in SPEC §1's order.
    The tensors are the caller's own, not copies: changed after the check, they are not checked again."""
    dims: PagedAttentionDims
    tensors: CallTensors

    def golden(self, codec: Fp8Codec | str | None = None) -> torch.Tensor:
        """bfloat16 [B*S1, NQ, D]: :func:`paged_attention_fp8` of these arguments under ``codec``."""
        # Inference mode spares every torch call its autograd bookkeeping (about 10% here); the result
        # becomes an ordinary tensor again in the bfloat16 conversion, outside it.
        with torch.inference_mode():
            result = _paged_attention(self.dims, self.tensors, get_codec(codec))
        return result.to(torch.bfloat16)  # round to nearest even (SPEC §2.4)

    def envelope(self, codec: Fp8Codec | str | None = None, model: ConformanceModel | None = None,
                 rows: torch.Tensor | None = None) -> AttentionEnvelope:
        """:func:`paged_attention_envelope` of these arguments (``codec``, ``model`` and ``rows`` as there)."""
        dims = self.dims
        q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs = self.tensors
        # Only the scales the golden reads: a query row that sees tokens, a slot of a valid token, a batch with
        # tokens (which cells those are is worked out only when some scale is negative at all).
        if any(bool((scale < 0).any()) for scale in (q_scale, k_scale, v_scale)):
            slot_read, row_read = read_cells(block_table, kv_act_seqs, num_blocks=k_scale.shape[0],
                                             block_size=dims.block_size, s1=dims.s1)
            check_scales_not_negative(q_scale=(q_scale, row_read[:, None, None]), k_scale=(k_scale, slot_read[:, :, None, None]),
                                      v_scale=(v_scale, (kv_act_seqs > 0)[:, None, None]))
        model = SPEC_MODEL if model is None else model
        if not isinstance(model, ConformanceModel):
            raise TypeError(f"model must be a golden.model.ConformanceModel, got {type(model).__name__}")
        codec = get_codec(codec)
        # The tile count of the whole case, also for a subset: the fold's float64 sums then run over the same
        # number of (zero-padded) tiles, and give the same bits.
        tiles = max(ceil_div(int(kv_act_seqs.max()), dims.s2_tile) if kv_act_seqs.numel() else 0, 1)
        picked = _checked_rows(rows, dims.batch * dims.s1)
        if picked is not None:
            # Each picked row (b, i) becomes a case of its own with S1 = 1 and length cur[b, i]: it sees the same
            # tokens in the same tiles, and everything of a row is computed from them alone, so its bounds are
            # the full envelope's, bit for bit (tested); the rows of one position share its heads.
            owner = picked // dims.s1
            cur = visible_lengths(kv_act_seqs, dims.s1).reshape(-1)[picked].to(kv_act_seqs.dtype)
            sub = dataclasses.replace(dims, batch=int(picked.numel()), s1=1)
            tensors = (q[picked], q_scale[picked], k_cache, k_scale, v_cache, v_scale[owner], block_table[owner], cur)
        else:
            sub, tensors = dims, self.tensors
        builder = EnvelopeBuilder(sub, codec, model, tiles)
        with torch.inference_mode():
            if sub.batch:
                out, lo, hi = _paged_attention(sub, tensors, codec, envelope=builder, tiles=tiles)
            else:
                out = lo = hi = torch.zeros((0,) + tuple(q.shape[1:]))
        out, lo, hi = (x.to(torch.bfloat16) for x in (out, lo, hi))
        if picked is not None:
            out, lo, hi = (torch.full(q.shape, float("nan"), dtype=torch.bfloat16).index_copy_(0, picked, x) for x in (out, lo, hi))
        return AttentionEnvelope(golden=out, lo=lo, hi=hi, model=model, codec=codec.name, p_elements=builder.p_elements,
                                 flippable=builder.flippable, degenerate_rows=builder.degenerate_rows,
                                 rows=None if picked is None else tuple(int(r) for r in picked))


def _checked_rows(rows: object, count: int) -> torch.Tensor | None:
    """int64 indices of the output rows a bool [B*S1] mask selects (None: all of them); a TypeError or
    ValueError naming ``rows`` otherwise."""
    if rows is None:
        return None
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.bool:
        raise TypeError(f"rows must be a bool tensor [B*S1] (or None for all), got {type(rows).__name__}"
                        + (f" of {rows.dtype}" if isinstance(rows, torch.Tensor) else ""))
    if tuple(rows.shape) != (count,):
        raise ValueError(f"rows has shape {tuple(rows.shape)}; expected ({count},), one entry per output row (B*S1)")
    return rows.nonzero().reshape(-1)
