"""The fault models of properties/diagnosis/diagnosis.py: each a defect as a deviation of the golden,
a function of the case alone (never of a known kernel), named by the SPEC §2 stage it changes.

- **input-level models**, parameterized: the golden run on inputs changed the way a defect reads them (a
  scale entry of the neighbouring KV head, batch or token; a scale missing or inverted; the softmax
  scale missing or applied twice; lengths off by one, of batch 0 or of the previous batch). Cheap: one
  vectorized golden call each.
- **layout models**: a SPEC §1 tensor read or written in another axis order or by another index (rows as
  [S1, B], heads before positions, output rows as [S1, B], cache blocks head-major, v_scale channel-major, the
  GQA map's interleaved orders, KV head h // NKV, q_scale of the batch's row), and the softmax_scale
  argument ignored. One golden call each, on changed inputs (properties/diagnosis/layout_models.py).
- **stage models**: one stage of the staged golden (kernels/mutants/staged.py) changed, seeded from the
  golden-level mutant catalog (causal offset, table column, GQA head map, the online rescale, P's
  quantization, empty rows, ...) and written from SPEC §2 for the stages the catalog does not hold
  (properties/diagnosis/stage_models.py).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.kernels.backends.contract import KernelBackend
from pfa_verify.kernels.mutants.golden_level import GOLDEN_MUTANTS
from pfa_verify.kernels.mutants.staged import StagedGolden
from pfa_verify.properties.diagnosis.fault_model import Change, FaultModel, ModelOutput, golden_on
from pfa_verify.properties.diagnosis.layout_models import layout_models
from pfa_verify.properties.diagnosis.stage_models import WRITTEN
from pfa_verify.properties.rule.acceptance import Scalars, Tensors

__all__ = ["FaultModel", "ModelOutput", "fault_models", "models_by_name"]


# -- the input-level models --------------------------------------------------------------------------

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


def _read_from(name: str, other: str) -> Change:
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        t[name] = t[other]
        return t, s
    return change


def _heads_before_batches(x: torch.Tensor) -> torch.Tensor:
    """A [B, N, ...] tensor's memory read as [N, B, ...]: entry (b, n) is memory row n * B + b."""
    batch, heads = x.shape[:2]
    if batch < 2 or heads < 2:
        raise ValueError("one batch or one head: both orders are the same")
    rows = (torch.arange(heads)[None, :] * batch + torch.arange(batch)[:, None]).reshape(-1)
    return x.reshape(batch * heads, *x.shape[2:])[rows].reshape(x.shape).contiguous()


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
_VISIBLE = "visible length, SPEC §2.1"


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
        ("v_scale_heads_before_batches", _MM2, "v_scale [B, NKV, D] is read as [NKV, B, D] (row n * B + b)",
         _with("v_scale", _heads_before_batches)),
        ("v_gathered_from_k_cache", _MM2, "MM2 gathers V from k_cache (the K gather repeated; V's scale kept)",
         _read_from("v_cache", "k_cache")),
        ("k_gathered_from_v_cache", _MM1, "MM1 gathers K from v_cache (the V gather repeated; K's scale kept)",
         _read_from("k_cache", "v_cache")),
        ("kv_of_kv_head_0", _PAGING, "K and V are gathered from KV head 0 for every head (their scales are not)",
         _heads_of_zero("k_cache", "v_cache")),
        ("lengths_of_batch_0", _PAGING, "every batch walks batch 0's kv_act_seqs", _lengths(_first(0))),
        ("lengths_of_batch_b-1", _PAGING, "batch b walks the kv_act_seqs of batch b - 1", _lengths(_roll(0, 1))),
        # One off on every row is the visible length's slip (SPEC §2.1: the causal offset S1 - i, say), not the table's.
        ("lengths_one_short", _VISIBLE, "every batch walks kv_act_seqs[b] - 1 tokens (every row sees one token less)",
         _lengths(lambda x: x - 1)),
        ("lengths_one_long", _VISIBLE, "every batch walks kv_act_seqs[b] + 1 tokens (every row sees one token more)",
         _lengths(lambda x: x + 1)),
    ]
    return [FaultModel(name, stage, text, golden_on(change)) for name, stage, text, change in models]


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


def _written_stage_models() -> list[FaultModel]:
    """The stage models written from SPEC §2 (properties/diagnosis/stage_models.py), run as fault models."""
    def run(cls: type[StagedGolden]) -> ModelOutput:
        def output(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
            backend: KernelBackend = cls(codec=codec)
            by_name: dict[str, Any] = tensors   # as in _golden_on
            return backend.paged_attention_fp8(**by_name, **scalars)
        return output
    return [FaultModel(name, stage, text, run(cls), cost=2) for name, stage, text, cls in WRITTEN]


def fault_models() -> list[FaultModel]:
    """Every fault model, cheapest first: input-level and layout models (golden calls), then stage models
    (the staged golden's loop), the catalog's before those written here."""
    return _input_models() + layout_models() + _stage_models() + _written_stage_models()


def models_by_name() -> dict[str, FaultModel]:
    """:func:`fault_models` by name (the probes of properties/diagnosis/probes.py re-run the leading candidates)."""
    return {m.name: m for m in fault_models()}
