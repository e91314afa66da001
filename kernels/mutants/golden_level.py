"""Golden-level mutants: realistic defects of an FP8 paged-attention kernel, one stage of
kernels/mutants/staged.StagedGolden changed in each. The docstring of each class names the bug as a
kernel engineer could write it. The equivalent ones (an ``equivalent`` proof) are listed, never counted:
P peaks at exactly 1 in every row, and tokens past the length are cut before both matmuls, so bugs
confined to those places cannot change a bit."""
from __future__ import annotations

import torch

from pfa_verify.golden.attention import dequantize_values
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.golden.matmul import exact_matmul
from pfa_verify.golden.quant import quantize_rows
from pfa_verify.golden.softmax_state import exp_f32
from pfa_verify.kernels.mutants.staged import StagedGolden, WrittenOutUpdate

__all__ = ["GOLDEN_MUTANTS"]


class CausalOffsetIgnored(StagedGolden):
    """Every query position sees all kv_act_seqs[b] tokens: the S1 - 1 - i causal offset is dropped."""

    def visible_length(self, lengths, b, i):
        return lengths[b]


class WrongBatchLength(StagedGolden):
    """Batch b walks the length of batch b + 1 (an off-by-one in the kv_act_seqs index)."""

    def visible_length(self, lengths, b, i):
        return max(0, lengths[(b + 1) % len(lengths)] - (self.dims.s1 - 1 - i))


class KScaleOfNextToken(StagedGolden):
    """The per-token K scale is taken one token late (the scales' view is offset by one row)."""

    def key_scales(self, k_scale, blocks, slots, n):
        return super().key_scales(k_scale, blocks, slots, n).roll(1, dims=0)


class KScaleOfFirstToken(StagedGolden):
    """The K scale is broadcast along the wrong axis: the tile's first token's scale for every token."""

    def key_scales(self, k_scale, blocks, slots, n):
        scales = super().key_scales(k_scale, blocks, slots, n)
        return scales[:1].expand_as(scales)


class VScalePerToken(StagedGolden):
    """The V scale is applied per token (indexed by token position) instead of per channel."""

    def tile_values(self, p, v, v_scale_channels, valid):
        per_token = v_scale_channels[0, torch.arange(v.shape[0]) % v.shape[1]][:, None]
        p8, p_scale = self.quantize_p(p, valid)
        return exact_matmul(p8, v * per_token) * p_scale


class VScaleOfNextBatch(StagedGolden):
    """The V scale of batch b + 1 is used (the per-batch V scale's row offset is off by one)."""

    def value_scales(self, v_scale, b, n, tokens):
        return v_scale[(b + 1) % v_scale.shape[0], n][None, :]


class _FullTiles(StagedGolden):
    """Reads every tile as a full s2_tile of tokens, as a kernel gathers it (table columns clamped to
    the table's width), and cuts the tokens past the length out of P and of V (the valid shape)."""

    def tile_tokens(self, start, cur):
        tokens = torch.arange(start, start + self.dims.s2_tile)
        return tokens, (tokens < cur)[None, :]

    def token_slots(self, block_table, b, tokens, start):
        bs, width = self.dims.block_size, self.dims.max_blocks
        blocks = block_table[b, (tokens // bs).clamp(max=width - 1)].long()
        return self.clamp(blocks, block_table, b), tokens % bs

    def clamp(self, blocks, block_table, b):
        return blocks.clamp(min=0)              # the kernel's .max(0)

    def tile_values(self, p, v, v_scale_channels, valid):
        return super().tile_values(p, self.cut(v, valid), v_scale_channels, valid)

    def cut(self, v, valid):
        return torch.where(valid[0][:, None], v, 0.0)


class TailTileReadsFullTile(_FullTiles):
    """The last tile computes over a full s2_tile: tokens past the length enter the softmax."""

    def tile_tokens(self, start, cur):
        return super().tile_tokens(start, cur)[0], None

    def cut(self, v, valid):
        return v


class TailMaskedByMultiplying(_FullTiles):
    """Tokens past the length are masked by multiplying by 0 instead of selecting: P is 0 there, but
    the V rows past the length still enter MM2, and 0 * NaN is NaN."""

    def cut(self, v, valid):
        return v


class MinusOneNotClamped(_FullTiles):
    """-1 table entries are not clamped before the gather (block -1: here the last physical block)."""

    equivalent = ("A -1 entry only ever stands for tokens past the length (a -1 inside a row's valid blocks "
                  "is rejected by the argument checks), and those are cut out of P and V by the tile's "
                  "valid shape before either matmul, so the block they would come from never reaches the "
                  "result. On hardware the unclamped address may fault; the sim-level mutant of the same "
                  "name shows what the calculator does.")

    def clamp(self, blocks, block_table, b):
        return blocks


class MinusOneClampedToALiveBlock(_FullTiles):
    """-1 table entries are clamped to the batch's first block instead of block 0."""

    equivalent = ("As for minus_one_not_clamped: the rows read through a clamped entry lie past the length "
                  "and are cut out of P and V before either matmul, whatever block they come from.")

    def clamp(self, blocks, block_table, b):
        return torch.where(blocks < 0, block_table[b, 0].long(), blocks)


class TableColumnOffByOne(StagedGolden):
    """Every tile after the first starts its block-table lookup one column early (the tile's first
    column computed as s2_idx * blocks_per_tile - 1)."""

    def token_slots(self, block_table, b, tokens, start):
        bs = self.dims.block_size
        columns = tokens // bs - (1 if start > 0 else 0)
        return block_table[b, columns].long(), tokens % bs


class GqaHeadModulo(StagedGolden):
    """Query head h reads KV head h % NKV instead of h // group."""

    def query_heads(self, n, g0):
        heads = torch.arange(n, self.dims.nq, self.dims.nkv)
        return heads[g0:g0 + self.dims.g_tile]


class MissingORescale(WrittenOutUpdate):
    """The online update forgets to rescale O by exp(m - m'): O = O + c * O_j."""
    rescale_o = False


class MissingLRescale(WrittenOutUpdate):
    """The online update forgets to rescale l by exp(m - m'): l = l + c * l_j."""
    rescale_l = False


class NoMaxSubtraction(StagedGolden):
    """The softmax skips the row max: P = exp(S), and the state keeps m = 0 (exp over- or underflows
    once logits pass about +-88)."""

    def local_softmax(self, scores, valid):
        p = exp_f32(scores if valid is None else torch.where(valid, scores, -torch.inf))
        return torch.zeros(scores.shape[:-1] + (1,)), p, p.double().sum(dim=-1, keepdim=True).float()


class SoftmaxScaleBeforeDequant(StagedGolden):
    """softmax_scale is applied to the raw scores before the q and k dequantization."""

    def scores(self, q_tile, k, q_scale_rows, k_scale_tokens):
        scaled = exact_matmul(q_tile, k.T) * torch.tensor(self.dims.softmax_scale, dtype=torch.float32)
        return scaled * q_scale_rows * k_scale_tokens.T


class PQuantizedPerColumn(StagedGolden):
    """P's quantization max is taken over the wrong axis: one scale per column (the max over the tile's
    rows), and after MM2 the [1, T] dequant vector is read as a scalar (its first element)."""

    def tile_values(self, p, v, v_scale_channels, valid):
        x = p if valid is None else torch.where(valid, p, 0.0)
        p8_t, dequant_t = quantize_rows(x.T.contiguous(), codec=self.codec)     # rows of x.T = columns of P
        return dequantize_values(exact_matmul(p8_t.T, v), dequant_t[0, 0], v_scale_channels)


class PScaleOfAnotherRow(StagedGolden):
    """P's dequant scale is taken from the next row of the tile (the scale vector is offset by one)."""

    equivalent = ("Every row of P = exp(S - m_j) peaks at exp(0) = 1 exactly, so every row's dequant scale "
                  "is 1/448: another row's is the same number, bit for bit.")

    def quantize_p(self, p, valid):
        p8, p_scale = super().quantize_p(p, valid)
        return p8, p_scale.roll(1, dims=0)


class LFromQuantizedP(StagedGolden):
    """l_j is summed from the quantized P8 (dequantized) instead of the unquantized P."""

    def local_softmax(self, scores, valid):
        m_j, p, _ = super().local_softmax(scores, valid)
        p8, p_scale = self.quantize_p(p, valid)
        return m_j, p, (p8 * p_scale).double().sum(dim=-1, keepdim=True).float()


class Bf16AccumulationOfO(WrittenOutUpdate):
    """O is accumulated in bf16 (the running O rounded to bf16 after every tile)."""

    def update(self, state, m_j, l_j, o_j, *, p=None, valid=None):
        super().update(state, m_j, l_j, o_j)
        state.o = state.o.bfloat16().float()


class _TruncatingCast:
    """``codec``'s E4M3 with the cast truncating toward zero (P >= 0): a code the cast rounded up is
    taken one code down. Only ``round`` (what golden.quant.quantize_rows calls) is provided."""

    def __init__(self, codec: Fp8Codec) -> None:
        self.codec = codec

    def round(self, y: torch.Tensor) -> torch.Tensor:
        codes = self.codec.encode(y)
        down = self.codec.decode(codes) > y                      # rounded up: one code down
        return self.codec.decode(torch.where(down & (codes > 0), codes - 1, codes))


class E4M3TruncatingCast(StagedGolden):
    """The FP32 -> E4M3 cast of P truncates toward zero instead of rounding to nearest even."""

    def quantize_p(self, p, valid):
        return quantize_rows(p, valid=valid, codec=_TruncatingCast(self.codec))


class EmptyRowsNan(StagedGolden):
    """Rows with cur == 0 are written as NaN (the output buffer is not zero-initialised)."""

    def write_empty_row(self, out, row):
        out[row] = torch.nan


class EmptyRowsGarbage(StagedGolden):
    """Rows with cur == 0 are written with leftover data (here: the row's dequantized query)."""

    def write_empty_row(self, out, row):
        q, q_scale = self.tables[0], self.tables[1]
        out[row] = self.codec.decode(q[row].contiguous()) * q_scale[row]


class PQuantizedPerTensor(StagedGolden):
    """P is quantized per tensor (one scale for the tile) instead of per row."""

    equivalent = ("Every row of P = exp(S - m_j) has its maximum at exp(0) = 1 exactly (exp_f32(0) is 1), "
                  "so the tile's maximum is 1 too and the one scale equals every row's scale (448): "
                  "the same codes and the same dequant scale, bit for bit.")

    def quantize_p(self, p, valid):
        x = p if valid is None else torch.where(valid, p, 0.0)
        p8, scale = quantize_rows(x.reshape(1, -1), codec=self.codec)
        return p8.reshape(p.shape), scale.expand(p.shape[0], 1)


GOLDEN_MUTANTS = {
    "causal_offset_ignored": CausalOffsetIgnored,
    "wrong_batch_length": WrongBatchLength,
    "k_scale_of_next_token": KScaleOfNextToken,
    "k_scale_of_first_token": KScaleOfFirstToken,
    "v_scale_per_token": VScalePerToken,
    "v_scale_of_next_batch": VScaleOfNextBatch,
    "tail_masked_by_multiplying": TailMaskedByMultiplying,
    "minus_one_not_clamped": MinusOneNotClamped,
    "minus_one_clamped_to_a_live_block": MinusOneClampedToALiveBlock,
    "tail_tile_reads_full_tile": TailTileReadsFullTile,
    "table_column_off_by_one": TableColumnOffByOne,
    "gqa_head_modulo": GqaHeadModulo,
    "missing_o_rescale": MissingORescale,
    "missing_l_rescale": MissingLRescale,
    "no_max_subtraction": NoMaxSubtraction,
    "softmax_scale_before_dequant": SoftmaxScaleBeforeDequant,
    "p_quantized_per_column": PQuantizedPerColumn,
    "p_scale_of_another_row": PScaleOfAnotherRow,
    "l_from_quantized_p": LFromQuantizedP,
    "bf16_accumulation_of_o": Bf16AccumulationOfO,
    "e4m3_truncating_cast": E4M3TruncatingCast,
    "empty_rows_nan": EmptyRowsNan,
    "empty_rows_garbage": EmptyRowsGarbage,
    "p_quantized_per_tensor": PQuantizedPerTensor,
}
