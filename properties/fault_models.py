"""The fault models of properties/diagnosis.py: each a defect as a deviation of the golden,
a function of the case alone (never of a known kernel), named by the SPEC §2 stage it changes.

- **input-level models**, parameterized: the golden run on inputs changed the way a defect reads them (a
  scale entry of the neighbouring KV head, batch or token; a scale missing or inverted; the softmax
  scale missing or applied twice; lengths off by one, of batch 0 or of the previous batch). Cheap: one
  vectorized golden call each.
- **stage models**: one stage of the staged golden (kernels/mutants/staged.py) changed, seeded from the
  golden-level mutant catalog (causal offset, table column, GQA head map, the online rescale, P's
  quantization, empty rows, ...) and written here from SPEC §2 for the stages the catalog does not hold
  (the last tile's length, the softmax scale's place in the dequant chain, the table column, P's scale,
  the causal offset's direction, the exp's base, P left unquantized, the update's factors swapped, the
  division by l, a stale empty row).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

import golden
from golden.codec import Fp8Codec
from golden.matmul import exact_matmul
from golden.softmax_state import exp_f32
from kernels.backends.contract import KernelBackend
from kernels.mutants.golden_level import GOLDEN_MUTANTS
from kernels.mutants.staged import StagedGolden, WrittenOutUpdate
from properties.acceptance import Scalars, Tensors

__all__ = ["FaultModel", "ModelOutput", "fault_models", "models_by_name"]

#: A fault model's output: (tensors, scalars, codec) -> the bf16 output of a kernel with the defect.
ModelOutput: TypeAlias = Callable[[Tensors, Scalars, Fp8Codec | str | None], torch.Tensor]
#: An input-level defect: (tensors, scalars) -> the changed (tensors, scalars).
Change: TypeAlias = Callable[[Tensors, Scalars], tuple[Tensors, Scalars]]



@dataclasses.dataclass(frozen=True)
class FaultModel:
    """One defect as a deviation of the golden: ``output(tensors, scalars, codec)`` is the bf16 output a
    kernel with this defect computes on the case (ValueError: the model does not apply to the case)."""
    name: str
    stage: str                      # the SPEC §2 stage it changes, as a reader would look for it
    description: str
    output: ModelOutput = dataclasses.field(repr=False, compare=False)
    cost: int = 1                   # 1: one vectorized golden call; 2: the staged (loop) golden




# -- the input-level models --------------------------------------------------------------------------

def _golden_on(change: Change) -> ModelOutput:
    """A model output: the golden on inputs changed by ``change(tensors, scalars)`` (copies)."""
    def output(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
        t, s = change(dict(tensors), dict(scalars))
        by_name: dict[str, Any] = t         # mypy cannot match a dict's keys to the tensor parameters
        return golden.paged_attention_fp8(**by_name, **s, codec=codec)
    return output


def _with(name: str, value: Callable[[torch.Tensor], torch.Tensor]) -> Change:
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        t[name] = value(t[name])
        return t, s
    return change


def _roll(dims: int, shift: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def value(x: torch.Tensor) -> torch.Tensor:
        if x.shape[dims] < 2:
            raise ValueError("only one entry along that axis: no neighbour to read")
        return x.roll(shift, dims=dims).contiguous()
    return value


def _first(dims: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def value(x: torch.Tensor) -> torch.Tensor:
        if x.shape[dims] < 2:
            raise ValueError("only one entry along that axis: reading the first is no defect")
        return x.narrow(dims, 0, 1).expand_as(x).contiguous()
    return value


def _heads_of_zero(*names: str) -> Change:
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        for name in names:
            t[name] = _first(2)(t[name])
        return t, s
    return change


def _softmax(factor: Callable[[float], float]) -> Change:
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        scale = s.get("softmax_scale") or t["q"].shape[-1] ** -0.5
        s["softmax_scale"] = factor(scale)
        return t, s
    return change


def _lengths(value: Callable[[torch.Tensor], torch.Tensor]) -> Change:
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        t["kv_act_seqs"] = value(t["kv_act_seqs"]).clamp(min=0).to(torch.int32)
        return t, s
    return change


_MM1 = "MM1 scales, SPEC §2.3"
_MM2 = "MM2 and the V scale, SPEC §2.3"
_PAGING = "lengths and paging, SPEC §2.1-2.2"
_TILE_WALK = "the tile walk, SPEC §2.3"


def _input_models() -> list[FaultModel]:
    ones = torch.ones_like
    models = [
        ("v_scale_of_kv_head_n-1", _MM2, "V's dequant scale is read from KV head n - 1", _with("v_scale", _roll(1, 1))),
        ("v_scale_of_kv_head_n+1", _MM2, "V's dequant scale is read from KV head n + 1", _with("v_scale", _roll(1, -1))),
        ("v_scale_of_batch_b-1", _MM2, "V's dequant scale is read from batch b - 1", _with("v_scale", _roll(0, 1))),
        ("v_scale_of_batch_b+1", _MM2, "V's dequant scale is read from batch b + 1", _with("v_scale", _roll(0, -1))),
        ("v_scale_missing", _MM2, "V's dequant scale is not applied", _with("v_scale", ones)),
        ("v_scale_inverted", _MM2, "V is multiplied by its quantization scale instead of the dequant scale",
         _with("v_scale", torch.reciprocal)),
        ("q_scale_of_head_h-1", _MM1, "Q's dequant scale is read from query head h - 1", _with("q_scale", _roll(1, 1))),
        ("q_scale_of_token_row-1", _MM1, "Q's dequant scale is read from the previous token row",
         _with("q_scale", _roll(0, 1))),
        ("q_scale_missing", _MM1, "Q's dequant scale is not applied", _with("q_scale", ones)),
        ("q_scale_inverted", _MM1, "Q is multiplied by its quantization scale instead of the dequant scale",
         _with("q_scale", torch.reciprocal)),
        ("k_scale_of_kv_head_n-1", _MM1, "K's dequant scale is read from KV head n - 1", _with("k_scale", _roll(2, 1))),
        ("k_scale_missing", _MM1, "K's dequant scale is not applied", _with("k_scale", ones)),
        ("k_scale_inverted", _MM1, "K is multiplied by its quantization scale instead of the dequant scale",
         _with("k_scale", torch.reciprocal)),
        ("softmax_scale_missing", _MM1, "softmax_scale is not applied", _softmax(lambda s: 1.0)),
        ("softmax_scale_twice", _MM1, "softmax_scale is applied twice", _softmax(lambda s: s * s)),
        ("v_scale_of_batch_0", _MM2, "every batch reads batch 0's V scale", _with("v_scale", _first(0))),
        ("kv_of_kv_head_0", _PAGING, "K and V are gathered from KV head 0 for every head (their scales are not)",
         _heads_of_zero("k_cache", "v_cache")),
        ("lengths_of_batch_0", _PAGING, "every batch walks batch 0's kv_act_seqs", _lengths(_first(0))),
        ("lengths_of_batch_b-1", _PAGING, "batch b walks the kv_act_seqs of batch b - 1", _lengths(_roll(0, 1))),
        ("lengths_one_short", _PAGING, "every batch walks kv_act_seqs[b] - 1 tokens", _lengths(lambda x: x - 1)),
        ("lengths_one_long", _PAGING, "every batch walks kv_act_seqs[b] + 1 tokens", _lengths(lambda x: x + 1)),
    ]
    return [FaultModel(name, stage, text, _golden_on(change)) for name, stage, text, change in models]


# -- the stage models, seeded from the golden-level mutant catalog -------------------------------------

_STAGE_OF_METHOD = {
    "visible_length": "visible length, SPEC §2.1", "query_heads": "GQA head map, SPEC §2.2",
    "token_slots": "paging, SPEC §2.2", "clamp": "paging (-1 entries), SPEC §2.2",
    "tile_tokens": "the tile walk, SPEC §2.3", "cut": "the tile walk, SPEC §2.3",
    "key_scales": _MM1, "scores": _MM1, "local_softmax": "local softmax, SPEC §2.3",
    "quantize_p": "P quantization, SPEC §2.3 and §3", "value_scales": _MM2, "tile_values": _MM2,
    "update": "online update, SPEC §2.3", "finalize": "output, SPEC §2.4", "write_empty_row": "empty rows, SPEC §2.5",
}


#: Mutants whose defect lies in another stage than the method they override (P's scale per column is a
#: quantization defect, carried out where MM2 reads it back).
_STAGE_OF_MUTANT = {"p_quantized_per_column": "P quantization, SPEC §2.3 and §3"}


def _stage_models() -> list[FaultModel]:
    models = []
    for name, cls in GOLDEN_MUTANTS.items():
        if cls.equivalent is not None:
            continue
        # The stage the class itself changes, else the one its mutant base changes (_FullTiles, _Recurrence).
        own = [k for k in cls.__mro__ if issubclass(k, StagedGolden) and k is not StagedGolden]
        changed = [m for k in own for m in _STAGE_OF_METHOD if m in vars(k)]
        stage = _STAGE_OF_MUTANT.get(name) or (_STAGE_OF_METHOD[changed[0]] if changed else "SPEC §2")

        def output(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None,
                   cls: type[StagedGolden] = cls) -> torch.Tensor:
            backend: KernelBackend = cls(codec=codec)
            by_name: dict[str, Any] = tensors   # as in _golden_on
            return backend.paged_attention_fp8(**by_name, **scalars)
        # kernels.mutants' catalog refuses, at import, a golden mutant without a docstring (it names the bug).
        assert cls.__doc__ is not None
        models.append(FaultModel(name, stage, " ".join(cls.__doc__.split()), output, cost=2))
    return models


def _own_stage_models() -> list[FaultModel]:
    """Stage models written here, for defects the golden-level catalog does not hold (the staged golden of
    kernels/mutants with one stage changed): the P scale, P's clamp, the running max, the table column, the
    last tile's length, the softmax scale's place, and one natural slip of each stage the catalog lacks."""

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

    class RunningMaxNotUpdated(WrittenOutUpdate):
        store_max = False

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
            if valid is not None:
                scores = torch.where(valid, scores, -torch.inf)
            m_j = scores.amax(dim=-1, keepdim=True)
            shifted = scores - m_j
            if valid is not None:
                shifted = torch.where(valid, shifted, -torch.inf)
            p = torch.exp2(shifted.double()).float()
            return m_j, p, p.double().sum(dim=-1, keepdim=True).float()

    # §2.3 and §3: MM2 on the float32 P (no E4M3 round trip, no P scale).
    class PNotQuantized(StagedGolden):
        def tile_values(self, p: torch.Tensor, v: torch.Tensor, v_scale_channels: torch.Tensor,
                        valid: torch.Tensor | None) -> torch.Tensor:
            if valid is not None:
                p = torch.where(valid, p, 0.0)
            return exact_matmul(p, v) * v_scale_channels

    # §2.3, the online update: O's two factors swapped (the running O times the tile's exp(m_j - m'), the
    # tile's O_j times the old exp(m - m')), or both O's and l's. A kernel that starts from (m, l, O) =
    # (-inf, 0, 0) and runs the update on the first tile too (the same result when the update is right)
    # loses the first tile's O_j to the swap: exp(-inf) = 0 multiplies it.
    class ORescaleFactorsSwapped(WrittenOutUpdate):
        swap_l = False
        from_empty = False

        def update(self, state: Any, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, *,
                   p: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> None:
            if not bool(state.started.any()):
                state.started = torch.ones_like(state.started)
                if not self.from_empty:
                    state.m, state.l, state.o = m_j, l_j, o_j
                    return
            m_new = torch.maximum(state.m, m_j)
            a, c = exp_f32(state.m - m_new), exp_f32(m_j - m_new)
            state.l = c * state.l + a * l_j if self.swap_l else a * state.l + c * l_j
            state.o, state.m = c * state.o + a * o_j, m_new

    class RescaleFactorsSwapped(ORescaleFactorsSwapped):
        swap_l = True

    class ORescaleFactorsSwappedFromEmpty(ORescaleFactorsSwapped):
        from_empty = True

    # §2.4: the output is O without the division by l.
    class NotNormalized(StagedGolden):
        def finalize(self, state: Any) -> torch.Tensor:
            return torch.where(state.started, state.o, 0.0)

    # §2.5: a row that sees no token is written with what the output buffer held: the row before it.
    class EmptyRowKeepsPreviousRow(StagedGolden):
        def write_empty_row(self, out: torch.Tensor, row: int) -> None:
            if row > 0:
                out[row] = out[row - 1]

    def run(cls: type[StagedGolden]) -> ModelOutput:
        def output(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
            backend: KernelBackend = cls(codec=codec)
            by_name: dict[str, Any] = tensors   # as in _golden_on
            return backend.paged_attention_fp8(**by_name, **scalars)
        return output
    return [
        FaultModel("p_scale_not_inverted", "P quantization, SPEC §2.3 and §3",
                   "P is dequantized with its quantization scale (448 / max P) instead of its reciprocal",
                   run(PScaleNotInverted), cost=2),
        FaultModel("p_clamped_to_240", "P quantization, SPEC §2.3 and §3",
                   "P's scaled values are clamped to 240 before the E4M3 cast (the IEEE-style E4M3's largest value)",
                   run(PClamped), cost=2),
        FaultModel("running_max_not_updated", "online update, SPEC §2.3",
                   "the running max keeps the first tile's value (m = m' is never stored)", run(RunningMaxNotUpdated), cost=2),
        FaultModel("table_column_plus_one", "paging, SPEC §2.2",
                   "every block reads the block-table column one too far (-1 entries read as block 0)",
                   run(TableColumnShifted), cost=2),
        FaultModel("table_column_minus_one", "paging, SPEC §2.2",
                   "every block reads the block-table column one too early", run(TableColumnShiftedBack), cost=2),
        FaultModel("last_tile_dropped_when_full", _TILE_WALK,
                   "a row whose visible length is a multiple of s2_tile loses its last tile (its length taken as "
                   "cur % s2_tile)", run(LastTileDroppedWhenFull), cost=2),
        FaultModel("partial_last_tile_dropped", _TILE_WALK,
                   "a row's partial last tile is dropped (cur // s2_tile tiles)", run(PartialLastTileDropped), cost=2),
        FaultModel("full_last_tile_one_short", _TILE_WALK,
                   "a full last tile reads s2_tile - 1 tokens (its last token never reaches the result)",
                   run(FullLastTileOneShort), cost=2),
        FaultModel("softmax_scale_folded_into_q_scale", _MM1,
                   "softmax_scale is multiplied into q_scale before the dequant (SPEC F2: it comes last)",
                   run(SoftmaxScaleFoldedIntoQScale), cost=2),
        FaultModel("softmax_scale_folded_into_dequant", _MM1,
                   "q_scale * k_scale * softmax_scale is formed first and applied once (SPEC F2: softmax_scale "
                   "comes last)", run(SoftmaxScaleFoldedIntoDequant), cost=2),
        FaultModel("causal_offset_reversed", "visible length, SPEC §2.1",
                   "query row i sees kv_act_seqs[b] - i tokens (the causal offset counted from the first row)",
                   run(CausalOffsetReversed), cost=2),
        FaultModel("exp_in_base_2", "local softmax, SPEC §2.3",
                   "P = 2 ** (S - m_j): an exp2 without the log2(e) factor", run(ExpInBase2), cost=2),
        FaultModel("p_not_quantized", "P quantization, SPEC §2.3 and §3",
                   "MM2 takes the float32 P (no E4M3 round trip, no P scale)", run(PNotQuantized), cost=2),
        FaultModel("o_rescale_factors_swapped", "online update, SPEC §2.3",
                   "O' = exp(m_j - m') * O + exp(m - m') * O_j (O's two factors swapped)",
                   run(ORescaleFactorsSwapped), cost=2),
        FaultModel("o_rescale_factors_swapped_from_empty", "online update, SPEC §2.3",
                   "as o_rescale_factors_swapped, the update run from (m, l, O) = (-inf, 0, 0) on the first tile too "
                   "(the first tile's O_j is lost)", run(ORescaleFactorsSwappedFromEmpty), cost=2),
        FaultModel("rescale_factors_swapped", "online update, SPEC §2.3",
                   "O and l each take the other term's factor: exp(m_j - m') on the running value, exp(m - m') on "
                   "the tile's", run(RescaleFactorsSwapped), cost=2),
        FaultModel("output_not_normalized", "output, SPEC §2.4", "the output is O, not divided by l",
                   run(NotNormalized), cost=2),
        FaultModel("empty_row_keeps_previous_row", "empty rows, SPEC §2.5",
                   "a row that sees no token is written with the previous row's output (a buffer not cleared)",
                   run(EmptyRowKeepsPreviousRow), cost=2),
    ]


def fault_models() -> list[FaultModel]:
    """Every fault model, cheapest first (input-level, then stage models)."""
    return _input_models() + _own_stage_models() + _stage_models()


def models_by_name() -> dict[str, FaultModel]:
    """:func:`fault_models` by name (the probes of properties/probes.py re-run the leading candidates)."""
    return {m.name: m for m in fault_models()}
