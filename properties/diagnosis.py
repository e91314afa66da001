"""Diagnosis: which defect explains a failing case (issue 29).

A red verdict says where a kernel's output differs from the golden; this module says *what* could make
it differ so. A :class:`FaultModel` is a deviation of the golden, a function of the case alone (never of a
known kernel), named by the SPEC §2 stage it changes. Two families:

- **input-level models**, parameterized: the golden run on inputs changed the way a defect reads them (a
  scale entry of the neighbouring KV head, batch or token; a scale missing or inverted; the softmax
  scale missing or applied twice; lengths off by one or of the next batch). Cheap: one vectorized golden
  call each.
- **stage models**, seeded from the golden-level mutant catalog (kernels/mutants): one stage of the
  staged golden changed (causal offset, table column, GQA head map, the online rescale, P's
  quantization, empty rows, ...). Each is the mutant's stage as a function of the case.

:func:`diagnose` evaluates the models on the failing case's inputs, cheapest first, within a time budget,
and scores each against the kernel's output with the one comparison core (properties.compare, SPEC §4's
tolerance around the model's output): how much of the mismatch it *explains* (mismatched elements where
the kernel lies within tolerance of the model) and how much it *breaks* (elements that matched the golden
and do not match the model). The best few are reported with their stage and scores, or the report says
that no model explains the failure and which comes closest. Deterministic: the same case, backend output
and budget give the same report (the budget cuts the list at a model boundary).

Never a verdict: a diagnosis is rendered beside a failure the rule already decided.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

import golden
from golden.codec import Fp8Codec
from kernels.backends.contract import KernelBackend
from kernels.mutants.golden_level import GOLDEN_MUTANTS
from kernels.mutants.staged import StagedGolden, WrittenOutUpdate
from properties import compare as cmp
from properties.acceptance import Judgement, Scalars, Tensors

__all__ = ["FaultModel", "Candidate", "Diagnosis", "fault_models", "diagnose", "diagnose_verdict", "EXPLAINS",
           "DEFAULT_BUDGET_S"]

#: A model *explains* a failure when it accounts for at least this share of the mismatched elements and
#: breaks at most 1 - EXPLAINS of the matching ones.
EXPLAINS = 0.9
#: Seconds of model evaluation per case (the report says how many models ran within it).
DEFAULT_BUDGET_S = 20.0

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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A model's scores on one failure."""
    model: str
    stage: str
    description: str
    explained: int                  # mismatched elements (vs the golden) that match the model
    mismatched: int
    broken: int                     # matching elements (vs the golden) that do not match the model
    matching: int

    @property
    def explained_share(self) -> float:
        return self.explained / self.mismatched if self.mismatched else 0.0

    @property
    def broken_share(self) -> float:
        return self.broken / self.matching if self.matching else 0.0

    @property
    def explains(self) -> bool:
        return self.explained_share >= EXPLAINS and self.broken_share <= 1 - EXPLAINS

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"explains": self.explains}


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The best candidates (best first), how many models were evaluated and in how long, and the budget."""
    candidates: tuple[Candidate, ...]
    evaluated: int
    available: int
    seconds: float
    budget_s: float

    @property
    def explained(self) -> bool:
        return bool(self.candidates) and self.candidates[0].explains

    def render(self, top: int = 3, note: str = "") -> str:
        """One line: the model that explains the failure (and the runners-up), or the closest one; ``note``
        ends the cost in parentheses (which case the models ran on)."""
        if not self.candidates:
            return f"Diagnosis: no fault model applies to this case ({self._cost()}{note})"

        def one(c: Candidate) -> str:
            return (f"{c.model} [{c.stage}] explains {c.explained}/{c.mismatched} mismatches, breaks "
                    f"{c.broken}/{c.matching} matching elements")
        best = self.candidates[0]
        same = [c for c in self.candidates[1:] if (c.explained, c.broken) == (best.explained, best.broken)]
        rest = [c for c in self.candidates[1 + len(same):top + len(same)] if c.explained]
        head = (f"Diagnosis: {one(best)}: {best.description}" if best.explains else
                f"Diagnosis: no fault model explains this failure; closest: {one(best)}")
        # Models that give the same output here cannot be told apart on this case: named, not ranked.
        alike = f"; alike on this case: {', '.join(c.model for c in same)}" if same else ""
        tail = "; next: " + "; ".join(f"{c.model} {c.explained_share:.0%} explained, {c.broken_share:.0%} broken"
                                      for c in rest) if rest else ""
        return head + alike + tail + f" ({self._cost()}{note})"

    def _cost(self) -> str:
        cut = f", budget {self.budget_s:g} s reached" if self.evaluated < self.available else ""
        return f"{self.evaluated} of {self.available} models in {self.seconds:.1f} s{cut}"

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        return {"explained": self.explained, "candidates": [c.to_dict() for c in self.candidates[:top]],
                "evaluated": self.evaluated, "available": self.available, "seconds": round(self.seconds, 2),
                "budget_s": self.budget_s}


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
    kernels/mutants with one stage changed): the P scale, P's clamp, the running max, the table column."""

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
    ]


def fault_models() -> list[FaultModel]:
    """Every fault model, cheapest first (input-level, then stage models)."""
    return _input_models() + _own_stage_models() + _stage_models()


# -- matching -------------------------------------------------------------------------------------------

def diagnose(out: torch.Tensor, expected: torch.Tensor, tensors: Tensors, scalars: Scalars, *,
             codec: Fp8Codec | str | None = None,
             budget_s: float = DEFAULT_BUDGET_S, models: list[FaultModel] | None = None) -> Diagnosis:
    """Score every fault model (``models``, default :func:`fault_models`) against the kernel's output ``out``
    on the case's inputs, within ``budget_s`` seconds; ``expected`` is the golden's output under ``codec``
    (the comparison that failed). Candidates come best first: most of the mismatch explained, then fewest
    matching elements broken, then the cheaper model."""
    models = fault_models() if models is None else models
    against_golden = cmp.compare(out, expected, kind="attention")
    if against_golden.attribute is not None:
        return Diagnosis((), 0, len(models), 0.0, budget_s)
    mismatch = against_golden.mismatch_mask
    assert mismatch is not None       # compare sets the mask whenever the attributes agree
    mismatched, matching = int(mismatch.sum()), int((~mismatch).sum())
    scored, start, evaluated = [], time.perf_counter(), 0
    for model in models:
        if evaluated and time.perf_counter() - start > budget_s:      # at least one model, whatever the budget
            break
        evaluated += 1
        try:
            with torch.inference_mode():
                faulty = model.output({k: v.clone() for k, v in tensors.items()}, dict(scalars), codec)
        except (ValueError, TypeError, IndexError, RuntimeError):    # the model does not apply to this case
            continue
        res = cmp.compare(out, faulty, kind="attention")
        if res.attribute is not None:
            continue
        differs = res.mismatch_mask
        assert differs is not None        # as above: the attributes agree
        scored.append((Candidate(model.name, model.stage, model.description, int((mismatch & ~differs).sum()),
                                 mismatched, int((~mismatch & differs).sum()), matching), model.cost))
    scored.sort(key=lambda sc: (-sc[0].explained_share, sc[0].broken_share, sc[1]))
    return Diagnosis(tuple(c for c, _ in scored), evaluated, len(models), time.perf_counter() - start, budget_s)


def diagnose_verdict(verdict: Judgement, tensors: Tensors, scalars: Scalars, *,
                     budget_s: float = DEFAULT_BUDGET_S) -> Diagnosis | None:
    """:func:`diagnose` of a failed properties.acceptance.Judgement, on its first counted failing comparison
    under that comparison's codec; None when nothing counted failed, or the failure is not one of values
    (shape, dtype or non-finite placement: the message already says what)."""
    failing = [r for r in verdict.references if r.counts and not r.passed]
    if not failing or failing[0].comparison.attribute is not None:
        return None
    ref = failing[0]
    codec = golden.SPEC_CODEC if ref.reference == "spec" else golden.get_codec(ref.reference)
    return diagnose(verdict.output, ref.expected, tensors, scalars, codec=codec, budget_s=budget_s)
