"""The stage models written from SPEC §2: the staged golden (kernels/mutants/staged.py) with one stage
changed, for the defects the golden-level mutant catalog does not hold. properties/diagnosis/fault_models.py runs
each as a fault model; each is a deviation the spec's text leaves room for, not a copy of any one kernel.
:data:`WRITTEN` lists them all; the online update's and the output's are properties/diagnosis/update_models.py.

- P's quantization: its scale not inverted, its values clamped to 240, the cast left out, the cast
  without its scale, the scale 240 / max P (the IEEE-style E4M3's largest value);
- paging: the block-table column one off either way, a tile's first column taken as its index;
- the tile walk: the last tile's length (dropped when full, the partial tail dropped, a full tile one
  token short), each tile's end inclusive, the softmax run on tiles of a cache block;
- MM1: the softmax scale folded into q_scale or into the dequant product (SPEC F2: it comes last), the
  scores stored in bf16;
- the visible length: the causal offset counted from the first row or from the flat row index;
- the local softmax: the exp in base 2, P = exp(S) with the tile's max not subtracted;
- empty rows: written with the previous row's output, seeing one token, or found by their batch's length
  rather than by cur (0 / 0).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pfa_verify.golden import FP8_MAX
from pfa_verify.golden.matmul import exact_matmul
from pfa_verify.golden.softmax_state import exp_f32, local_softmax
from pfa_verify.kernels.mutants.staged import StagedGolden
from pfa_verify.properties.diagnosis.update_models import (
    DividedByLastTileSum,
    NotNormalized,
    OnlineMaxStartsAtZero,
    ORescaleFactorsSwapped,
    ORescaleFactorsSwappedFromEmpty,
    RescaleAfterMaxStored,
    RescaleFactorsSwapped,
    RunningMaxNotUpdated,
    TileFactorForgotten,
)

__all__ = ["WRITTEN"]

_MM1 = "MM1 scales, SPEC §2.3"
_TILE_WALK = "the tile walk, SPEC §2.3"


class PScaleNotInverted(StagedGolden):
    def quantize_p(self, p: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        p8, p_scale = super().quantize_p(p, valid)  # type: ignore[no-untyped-call]  # StagedGolden's stages are unannotated (kernels/mutants/staged.py)
        return p8, torch.reciprocal(p_scale)


class PClamped(StagedGolden):
    top = 240.0

    def quantize_p(self, p: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # round(min(y, c)) = min(round(y), c) for an E4M3 value c: the rounding is monotone
        p8, p_scale = super().quantize_p(p, valid)  # type: ignore[no-untyped-call]  # StagedGolden's stages are unannotated (kernels/mutants/staged.py)
        return p8.clamp(max=self.top), p_scale


class TableColumnShifted(StagedGolden):
    shift = 1

    def token_slots(self, block_table: torch.Tensor, b: int, tokens: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        bs, width = self.dims.block_size, block_table.shape[1]
        columns = (tokens // bs + self.shift).clamp(0, width - 1)
        return block_table[b, columns].long().clamp(min=0), tokens % bs


class TableColumnShiftedBack(TableColumnShifted):
    shift = -1


# SPEC §2.3, the tile walk: a row of cur tokens is ceil(cur / s2_tile) tiles, the last holding the
# remainder, or a full s2_tile when cur is a multiple of it. The ways a kernel gets that length wrong,
# as the tokens that reach the result: the last tile's length taken as cur % s2_tile (0 when full: the
# tile is dropped), the tile count as cur // s2_tile (the partial tail dropped), or a full last tile
# one token short.


class LastTileDroppedWhenFull(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        cur: int = super().visible_length(lengths, b, i)
        return cur - self.dims.s2_tile if cur and cur % self.dims.s2_tile == 0 else cur


class PartialLastTileDropped(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        cur: int = super().visible_length(lengths, b, i)
        return cur - cur % int(self.dims.s2_tile)


class FullLastTileOneShort(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        cur: int = super().visible_length(lengths, b, i)
        return cur - 1 if cur and cur % self.dims.s2_tile == 0 else cur


# SPEC §2.3 and F2: the dequant scales in any order, then softmax_scale, last. A kernel that folds the
# softmax scale into a dequant factor rounds it with the scales, before the product it must follow.


class SoftmaxScaleFoldedIntoQScale(StagedGolden):
    def scores(self, q_tile: torch.Tensor, k: torch.Tensor, q_scale_rows: torch.Tensor,
               k_scale_tokens: torch.Tensor) -> torch.Tensor:
        folded = q_scale_rows * torch.tensor(self.dims.softmax_scale, dtype=torch.float32)
        return exact_matmul(q_tile, k.T) * folded * k_scale_tokens.T


class SoftmaxScaleFoldedIntoDequant(StagedGolden):
    def scores(self, q_tile: torch.Tensor, k: torch.Tensor, q_scale_rows: torch.Tensor,
               k_scale_tokens: torch.Tensor) -> torch.Tensor:
        folded = q_scale_rows * k_scale_tokens.T * torch.tensor(self.dims.softmax_scale, dtype=torch.float32)
        return exact_matmul(q_tile, k.T) * folded


# The stages whose one natural slip the catalog lacks, each the deviation SPEC §2 leaves room for.
# §2.1: the causal offset S1 - 1 - i counted from the other end (row i sees kv_act_seqs[b] - i tokens).


class CausalOffsetReversed(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        return max(0, lengths[b] - i)


# §2.3: P = exp(S - m_j) in base 2 (an exp2 unit used without the log2(e) factor on its argument).


class ExpInBase2(StagedGolden):
    def local_softmax(self, scores: torch.Tensor,
                      valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return local_softmax(scores, valid, exp=lambda x: torch.exp2(x.double()).float())


# §2.3 and §3: MM2 on the float32 P (no E4M3 round trip, no P scale).


class PNotQuantized(StagedGolden):
    def tile_values(self, p: torch.Tensor, v: torch.Tensor, v_scale_channels: torch.Tensor,
                    valid: torch.Tensor | None) -> torch.Tensor:
        if valid is not None:
            p = torch.where(valid, p, 0.0)
        return exact_matmul(p, v) * v_scale_channels


# §2.5: a row that sees no token is written with what the output buffer held: the row before it.


class EmptyRowKeepsPreviousRow(StagedGolden):
    def write_empty_row(self, out: torch.Tensor, row: int) -> None:
        if row > 0:
            out[row] = out[row - 1]


# §2.3 and §3: P cast to E4M3 as it is, without the 448 / max(P) scale (its dequant scale 1): the small
# probabilities fall to E4M3's subnormals or to 0.
class PCastUnscaled(StagedGolden):
    def quantize_p(self, p: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if valid is not None:
            p = torch.where(valid, p, 0.0)
        return self.codec.round(p.float()), torch.ones(p.shape[:-1] + (1,))


# §2.2 with §2.3: a tile's first block-table column taken as the tile's index (j), not j * blocks per tile.
class TileColumnIsTileIndex(StagedGolden):
    def token_slots(self, block_table: torch.Tensor, b: int, tokens: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        bs, width = self.dims.block_size, block_table.shape[1]
        if self.dims.s2_tile == bs:
            raise ValueError("one block per tile: the tile's index is its first column")
        columns = (start // self.dims.s2_tile + (tokens - start) // bs).clamp(0, width - 1)
        return block_table[b, columns].long().clamp(min=0), tokens % bs


# §2.1: the query position i taken as the flat row b*S1 + i (capped at the batch's length): only batch 0
# is causal.
class CausalOffsetOfFlatRow(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        if b == 0 and len(lengths) == 1:
            raise ValueError("one batch: the flat row is the query position")
        s1 = int(self.dims.s1)
        return min(lengths[b], max(0, lengths[b] - (s1 - 1 - (b * s1 + i))))


# §2.5 with §2.1: a guard against an empty softmax lets every row of a batch with tokens see at least
# one (cur = max(1, ...)): a causally empty row reads token 0.
class EmptyRowsSeeOneToken(StagedGolden):
    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        cur: int = super().visible_length(lengths, b, i)
        return max(cur, 1) if lengths[b] > 0 else cur


# The constants and dtypes SPEC §2.3 fixes, each one a kernel may take from the wrong table: P's E4M3 max
# (448; 240 is the IEEE-style E4M3's, float8_e4m3fnuz's), the scores' dtype (float32; bf16 is the
# output's), the softmax's tile (s2_tile tokens; a cache block is BS).
class PScaledToAnotherMax(StagedGolden):
    top = 240.0

    def p_reference(self, p: torch.Tensor) -> torch.Tensor:
        """What P's scale maps to ``top``: the row's max (SPEC §2.3)."""
        return p.abs().amax(dim=-1, keepdim=True)

    def quantize_p(self, p: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if valid is not None:
            p = torch.where(valid, p, 0.0)
        reference = self.p_reference(p)
        scale = torch.tensor(self.top) / torch.where(reference == 0, torch.tensor(self.top), reference)
        return self.codec.round(p * scale), torch.reciprocal(scale)


class PScaledByRowSum(PScaledToAnotherMax):
    top = FP8_MAX

    def p_reference(self, p: torch.Tensor) -> torch.Tensor:
        return p.double().sum(dim=-1, keepdim=True).float()       # l_j, as local_softmax sums it


# §2.2: the block table's memory [B, MAXB] read column-major, batch b's column c at entry c * B + b.
class TableReadColumnMajor(StagedGolden):
    def token_slots(self, block_table: torch.Tensor, b: int, tokens: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch, bs = block_table.shape[0], self.dims.block_size
        if batch < 2:
            raise ValueError("one batch: both orders of the table are the same")
        entries = block_table.reshape(-1)[(tokens // bs) * batch + b]
        return entries.long().clamp(min=0), tokens % bs


# §2.1: an earlier query position's cur tokens taken from the end of the sequence, [L - cur, L), not the
# prefix [0, cur). visible_length runs before a row's tiles, so it leaves the row's shift for token_slots.
class CausalWindowFromEnd(StagedGolden):
    shift = 0

    def visible_length(self, lengths: list[int], b: int, i: int) -> int:
        cur: int = super().visible_length(lengths, b, i)
        self.shift = lengths[b] - cur
        return cur

    def token_slots(self, block_table: torch.Tensor, b: int, tokens: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dims.s1 < 2:
            raise ValueError("one query position: its window is the whole sequence either way")
        slots: tuple[torch.Tensor, torch.Tensor] = super().token_slots(block_table, b, tokens + self.shift, start)
        return slots


class ScoresInBf16(StagedGolden):
    def scores(self, q_tile: torch.Tensor, k: torch.Tensor, q_scale_rows: torch.Tensor,
               k_scale_tokens: torch.Tensor) -> torch.Tensor:
        scores: torch.Tensor = super().scores(q_tile, k, q_scale_rows, k_scale_tokens)
        return scores.bfloat16().float()


class SoftmaxTilesOfBlockSize(StagedGolden):
    def _paged_attention(self, dims: Any, *tensors: torch.Tensor) -> torch.Tensor:
        if dims.s2_tile == dims.block_size:
            raise ValueError("s2_tile is the block size: the two tile walks are the same")
        out: torch.Tensor = super()._paged_attention(  # type: ignore[no-untyped-call]  # StagedGolden's walk is unannotated
            dataclasses.replace(dims, s2_tile=dims.block_size), *tensors)
        return out


# §2.5 with §2.1: an empty row found by kv_act_seqs[b] == 0 instead of cur == 0: a causally empty row of a
# batch with tokens runs the softmax over no token, and O / l is 0 / 0.
class CausallyEmptyRowNotFound(StagedGolden):
    def write_empty_row(self, out: torch.Tensor, row: int) -> None:
        kv_act_seqs = self.tables[-1]       # StagedGolden keeps the call's tensors in SPEC §1's order
        if int(kv_act_seqs[row // self.dims.s1]) > 0:
            out[row] = torch.nan


# §2.3, the tile walk: each tile's slice taken one token too far (an inclusive end), so the first token of
# the next tile is counted twice (once in each tile), and the last tile is unchanged.
class TileEndInclusive(StagedGolden):
    def tile_tokens(self, start: int, cur: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return torch.arange(start, min(start + self.dims.s2_tile + 1, cur)), None


# §2.3: P = exp(S) with the tile's max computed but not subtracted, while the online update still takes
# m_j for its factors (the catalog's no_max_subtraction also keeps m = 0 in the state).
class PNotShiftedByItsMax(StagedGolden):
    def local_softmax(self, scores: torch.Tensor,
                      valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m_j, _, _ = local_softmax(scores, valid)
        p = exp_f32(scores if valid is None else torch.where(valid, scores, -torch.inf))
        return m_j, p, p.double().sum(dim=-1, keepdim=True).float()


#: (name, SPEC §2 stage, description, the staged golden with that stage changed), cheapest first.
WRITTEN: tuple[tuple[str, str, str, type[StagedGolden]], ...] = (
    ("p_scale_not_inverted", "P quantization, SPEC §2.3 and §3",
               "P is dequantized with its quantization scale (448 / max P) instead of its reciprocal",
               PScaleNotInverted),
    ("p_clamped_to_240", "P quantization, SPEC §2.3 and §3",
               "P's scaled values are clamped to 240 before the E4M3 cast (the IEEE-style E4M3's largest value)",
               PClamped),
    ("running_max_not_updated", "online update, SPEC §2.3",
               "the running max keeps the first tile's value (m = m' is never stored)", RunningMaxNotUpdated),
    ("table_column_plus_one", "paging, SPEC §2.2",
               "every block reads the block-table column one too far (-1 entries read as block 0)",
               TableColumnShifted),
    ("table_column_minus_one", "paging, SPEC §2.2",
               "every block reads the block-table column one too early", TableColumnShiftedBack),
    ("last_tile_dropped_when_full", _TILE_WALK,
               ("a row whose visible length is a multiple of s2_tile loses its last tile (its length taken as "
               "cur % s2_tile)"), LastTileDroppedWhenFull),
    ("partial_last_tile_dropped", _TILE_WALK,
               "a row's partial last tile is dropped (cur // s2_tile tiles)", PartialLastTileDropped),
    ("full_last_tile_one_short", _TILE_WALK,
               "a full last tile reads s2_tile - 1 tokens (its last token never reaches the result)",
               FullLastTileOneShort),
    ("softmax_scale_folded_into_q_scale", _MM1,
               "softmax_scale is multiplied into q_scale before the dequant (SPEC F2: it comes last)",
               SoftmaxScaleFoldedIntoQScale),
    ("softmax_scale_folded_into_dequant", _MM1,
               ("q_scale * k_scale * softmax_scale is formed first and applied once (SPEC F2: softmax_scale "
               "comes last)"), SoftmaxScaleFoldedIntoDequant),
    ("causal_offset_reversed", "visible length, SPEC §2.1",
               "query row i sees kv_act_seqs[b] - i tokens (the causal offset counted from the first row)",
               CausalOffsetReversed),
    ("exp_in_base_2", "local softmax, SPEC §2.3",
               "P = 2 ** (S - m_j): an exp2 without the log2(e) factor", ExpInBase2),
    ("p_not_quantized", "P quantization, SPEC §2.3 and §3",
               "MM2 takes the float32 P (no E4M3 round trip, no P scale)", PNotQuantized),
    ("o_rescale_factors_swapped", "online update, SPEC §2.3",
               "O' = exp(m_j - m') * O + exp(m - m') * O_j (O's two factors swapped)",
               ORescaleFactorsSwapped),
    ("o_rescale_factors_swapped_from_empty", "online update, SPEC §2.3",
               ("as o_rescale_factors_swapped, the update run from (m, l, O) = (-inf, 0, 0) on the first tile too "
               "(the first tile's O_j is lost)"), ORescaleFactorsSwappedFromEmpty),
    ("rescale_factors_swapped", "online update, SPEC §2.3",
               ("O and l each take the other term's factor: exp(m_j - m') on the running value, exp(m - m') on "
               "the tile's"), RescaleFactorsSwapped),
    ("output_not_normalized", "output, SPEC §2.4", "the output is O, not divided by l",
               NotNormalized),
    ("empty_row_keeps_previous_row", "empty rows, SPEC §2.5",
               "a row that sees no token is written with the previous row's output (a buffer not cleared)",
               EmptyRowKeepsPreviousRow),
    ("p_cast_unscaled", "P quantization, SPEC §2.3 and §3",
     "P is cast to E4M3 as it is, without the 448 / max(P) scale (dequant scale 1)", PCastUnscaled),
    ("rescale_after_max_stored", "online update, SPEC §2.3",
     "the new max is stored before exp(m - m') is taken: a = 1, the running O and l are never scaled down",
     RescaleAfterMaxStored),
    ("tile_column_is_tile_index", "paging, SPEC §2.2-2.3",
     "a tile's first block-table column is the tile's index j, not j * s2_tile / BS", TileColumnIsTileIndex),
    ("causal_offset_of_flat_row", "visible length, SPEC §2.1",
     "the causal offset takes the flat row b*S1 + i for the query position (only batch 0 is causal)",
     CausalOffsetOfFlatRow),
    ("empty_rows_see_one_token", "empty rows, SPEC §2.5 and §2.1",
     "every row of a batch with tokens sees at least one (cur = max(1, ...)): a causally empty row reads token 0",
     EmptyRowsSeeOneToken),
    ("p_scaled_to_240", "P quantization, SPEC §2.3 and §3",
     "P is quantized with the scale 240 / max(P) (the IEEE-style E4M3's largest value), not 448 / max(P)",
     PScaledToAnotherMax),
    ("scores_rounded_to_bf16", _MM1, "the dequantized scores S are stored in bf16 before the softmax", ScoresInBf16),
    ("softmax_tiles_of_block_size", _TILE_WALK,
     "the softmax, P's quantization and the online update run on tiles of BS tokens (a cache block), not s2_tile",
     SoftmaxTilesOfBlockSize),
    ("online_max_starts_at_zero", "online update, SPEC §2.3",
     "the online state starts at m = 0, l = 0, O = 0 (not m = -inf) and the first tile is folded in by the update",
     OnlineMaxStartsAtZero),
    ("causally_empty_row_not_found", "empty rows, SPEC §2.5 and §2.1",
     "an empty row is found by kv_act_seqs[b] == 0, not cur == 0: a causally empty row is 0 / 0 (NaN)",
     CausallyEmptyRowNotFound),
    ("tile_factor_forgotten", "online update, SPEC §2.3",
     "the update adds the tile's l_j and O_j without their factor c = exp(m_j - m'): l' = a l + l_j, O' = a O + O_j",
     TileFactorForgotten),
    ("divided_by_last_tile_sum", "output, SPEC §2.4",
     "the output is O divided by the last tile's own l_j, not by the running l", DividedByLastTileSum),
    ("tile_end_inclusive", _TILE_WALK,
     "each tile reads one token past its end (an inclusive slice): the next tile's first token counts twice",
     TileEndInclusive),
    ("p_not_shifted_by_its_max", "local softmax, SPEC §2.3",
     "P = exp(S): the tile's max m_j is not subtracted, though the online update takes m_j for its factors",
     PNotShiftedByItsMax),
    ("p_scaled_by_row_sum", "P quantization, SPEC §2.3 and §3",
     "P is quantized with the scale 448 / l_j (the tile's row sum), not 448 / max(P)", PScaledByRowSum),
    ("table_read_column_major", "paging, SPEC §2.2",
     "the block table's memory is read column-major: batch b's column c is entry c * B + b, not b * MAXB + c",
     TableReadColumnMajor),
    ("causal_window_from_the_end", "visible length, SPEC §2.1",
     "an earlier query position sees the last cur tokens [L - cur, L) of its batch, not the first cur",
     CausalWindowFromEnd),
)
