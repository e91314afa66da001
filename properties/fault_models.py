"""The fault models of properties/diagnosis.py: each a defect as a deviation of the golden,
a function of the case alone (never of a known kernel), named by the SPEC §2 stage it changes.

- **input-level models**, parameterized: the golden run on inputs changed the way a defect reads them (a
  scale entry of the neighbouring KV head, batch or token; a scale missing or inverted; the softmax
  scale missing or applied twice; lengths off by one, of batch 0 or of the previous batch). Cheap: one
  vectorized golden call each.
- **layout models**: a SPEC §1 tensor read or written in another axis order or by another index (rows as
  [S1, B], heads before positions, output rows as [S1, B], cache blocks head-major, v_scale channel-major, the
  GQA map's interleaved orders, KV head h // NKV, q_scale of the batch's row), and the softmax_scale
  argument ignored. One golden call each, on changed inputs.
- **stage models**: one stage of the staged golden (kernels/mutants/staged.py) changed, seeded from the
  golden-level mutant catalog (causal offset, table column, GQA head map, the online rescale, P's
  quantization, empty rows, ...) and written from SPEC §2 for the stages the catalog does not hold
  (properties/stage_models.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

import golden
from golden.codec import Fp8Codec
from kernels.backends.contract import KernelBackend
from kernels.mutants.golden_level import GOLDEN_MUTANTS
from kernels.mutants.staged import StagedGolden
from properties.acceptance import Scalars, Tensors
from properties.stage_models import WRITTEN

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
    return [FaultModel(name, stage, text, _golden_on(change)) for name, stage, text, change in models]


# -- the layout models: a SPEC §1 tensor read or written in another axis order, or by another index -------

def _s1_major(batch: int, s1: int) -> torch.Tensor:
    """The memory row i*B + b of each logical row b*S1 + i (the [B*S1] rows taken as [S1, B])."""
    if batch < 2 or s1 < 2:
        raise ValueError("one batch or one query position: both row orders are the same")
    return torch.arange(batch * s1).reshape(s1, batch).T.reshape(-1)


def _rows_s1_major(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
    """q and q_scale read, and the output written, with the [B*S1] rows taken as [S1, B] (row i*B + b)."""
    t = dict(tensors)
    batch = int(t["kv_act_seqs"].shape[0])
    s1 = t["q"].shape[0] // batch
    memory = _s1_major(batch, s1)
    t["q"], t["q_scale"] = t["q"][memory].contiguous(), t["q_scale"][memory].contiguous()
    by_name: dict[str, Any] = t         # as in _golden_on
    logical = golden.paged_attention_fp8(**by_name, **scalars, codec=codec)
    out = torch.empty_like(logical)
    out[memory] = logical
    return out


def _output_heads_before_positions(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
    """The output's memory written in [B, NQ, S1, D] order, not [B, S1, NQ, D]."""
    by_name: dict[str, Any] = tensors   # as in _golden_on
    out = golden.paged_attention_fp8(**by_name, **scalars, codec=codec)
    rows, nq, d = out.shape
    batch = int(tensors["kv_act_seqs"].shape[0])
    s1 = rows // batch
    if s1 < 2 or nq < 2:
        raise ValueError("one query position or one head: both orders are the same")
    return out.reshape(batch, s1, nq, d).permute(0, 2, 1, 3).contiguous().reshape(rows, nq, d)


def _block_heads_before_slots(*names: str) -> Change:
    """A cache block [BS, NKV, ...] read as [NKV, BS, ...]: the kernel's (slot s, head n) is memory row n*BS + s."""
    def change(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
        for name in names:
            x = t[name]
            nb, bs, nkv = x.shape[:3]
            if nkv < 2:
                raise ValueError("one KV head: both block layouts are the same")
            t[name] = x.reshape(nb, nkv, bs, *x.shape[3:]).transpose(1, 2).contiguous()
        return t, s
    return change


def _k_scale_of_logical_block(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """K's scale read at block j of the table's column, not at the physical block block_table[b, j]."""
    table, k_scale = t["block_table"], t["k_scale"]
    changed = k_scale.clone()
    for b, j in (table >= 0).nonzero().tolist():
        if j >= k_scale.shape[0]:
            raise ValueError(f"column {j} has no block {j} to read the scale of")
        changed[int(table[b, j])] = k_scale[j]
    if torch.equal(changed, k_scale):
        raise ValueError("every block sits at its own column: the defect changes nothing")
    t["k_scale"] = changed
    return t, s


def _q_scale_of_kv_head(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """Every query head of group n reads the q_scale of query head n (the KV head's index)."""
    q_scale, nkv = t["q_scale"], t["k_cache"].shape[2]
    group = q_scale.shape[1] // nkv
    if group < 2:
        raise ValueError("a group of one query head: its index is the KV head's")
    t["q_scale"] = q_scale[:, torch.arange(q_scale.shape[1]) // group].contiguous()
    return t, s


def _softmax_scale_ignored(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """The caller's softmax_scale replaced by the default 1 / sqrt(D) (SPEC §1: the default, when none is given)."""
    default = t["q"].shape[-1] ** -0.5
    if s.get("softmax_scale") in (None, default):
        raise ValueError("the case uses the default softmax_scale: ignoring the argument changes nothing")
    s["softmax_scale"] = default
    return t, s


def _interleaved(nq: int, nkv: int) -> torch.Tensor:
    """Query head n*group + g of the blocked order (SPEC §2.2) at its place g*NKV + n of the interleaved one."""
    group = nq // nkv
    if nkv < 2 or group < 2:
        raise ValueError("one KV head or a group of one: the blocked and interleaved head orders are the same")
    return torch.arange(nq).reshape(nkv, group).T.reshape(-1)


def _query_heads_read_interleaved(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """KV head n's g-th query head read at q's head g*NKV + n (and its q_scale), its output written at n*group + g."""
    interleaved = _interleaved(t["q"].shape[1], t["k_cache"].shape[2])
    reads = torch.empty_like(interleaved)
    reads[interleaved] = torch.arange(len(interleaved))
    t["q"], t["q_scale"] = t["q"][:, reads].contiguous(), t["q_scale"][:, reads].contiguous()
    return t, s


def _output_heads_written_interleaved(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
    """Query head n*group + g computed right and written at head g*NKV + n of the output."""
    by_name: dict[str, Any] = tensors   # as in _golden_on
    out = golden.paged_attention_fp8(**by_name, **scalars, codec=codec)
    written = torch.empty_like(out)
    written[:, _interleaved(out.shape[1], tensors["k_cache"].shape[2])] = out
    return written


def _kv_head_of_query_head_over_nkv(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """Query head h reads KV head h // NKV (not h // group): run as NQ KV heads, head h holding KV head h // NKV."""
    nq, nkv = t["q"].shape[1], t["k_cache"].shape[2]
    if nq // nkv == nkv:
        raise ValueError("NQ / NKV equals NKV: h // NKV is h // group")
    if (nq - 1) // nkv >= nkv:
        raise ValueError(f"query head {nq - 1} would read KV head {(nq - 1) // nkv} of {nkv}: an out-of-range read")
    kv_of = torch.arange(nq) // nkv
    for name in ("k_cache", "v_cache", "k_scale"):
        t[name] = t[name][:, :, kv_of].contiguous()
    t["v_scale"] = t["v_scale"][:, kv_of].contiguous()
    s["g_tile"] = None
    return t, s


def _q_scale_of_batch_row(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """Query row b*S1 + i reads the q_scale of row b (the batch's index, not the row's)."""
    batch = int(t["kv_act_seqs"].shape[0])
    s1 = t["q"].shape[0] // batch
    if s1 < 2:
        raise ValueError("S1 = 1: the batch's index is the row's")
    t["q_scale"] = t["q_scale"][torch.arange(batch * s1) // s1].contiguous()
    return t, s


def _output_rows_s1_major(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
    """The output's row (b, i) written at memory row i*B + b; q and q_scale read right."""
    by_name: dict[str, Any] = tensors   # as in _golden_on
    logical = golden.paged_attention_fp8(**by_name, **scalars, codec=codec)
    batch = int(tensors["kv_act_seqs"].shape[0])
    out = torch.empty_like(logical)
    out[_s1_major(batch, logical.shape[0] // batch)] = logical
    return out


def _v_scale_channel_major(t: Tensors, s: Scalars) -> tuple[Tensors, Scalars]:
    """v_scale [B, NKV, D] read as [B, D, NKV]: the kernel's (n, d) is memory element d*NKV + n of the batch."""
    v_scale = t["v_scale"]
    batch, nkv, d = v_scale.shape
    if nkv < 2:
        raise ValueError("one KV head: both layouts are the same")
    t["v_scale"] = v_scale.reshape(batch, d, nkv).transpose(1, 2).contiguous()
    return t, s


def _layout_models() -> list[FaultModel]:
    paging = "paging, SPEC §1 and §2.2"
    return [
        FaultModel("query_rows_s1_major", "lengths and paging, SPEC §1 and §2.1",
                   "q, q_scale and the output's rows are read and written as [S1, B] (row i*B + b), not [B, S1]",
                   _rows_s1_major),
        FaultModel("output_heads_before_positions", "output, SPEC §1 and §2.4",
                   "the output is written in [B, NQ, S1, D] order into its [B*S1, NQ, D] tensor",
                   _output_heads_before_positions),
        FaultModel("cache_block_heads_before_slots", paging,
                   "every block of K, V and K's scale is read as [NKV, BS, D], not [BS, NKV, D]",
                   _golden_on(_block_heads_before_slots("k_cache", "v_cache", "k_scale"))),
        FaultModel("kv_block_heads_before_slots", paging,
                   "every block of K and V (not their scales) is read as [NKV, BS, D], not [BS, NKV, D]",
                   _golden_on(_block_heads_before_slots("k_cache", "v_cache"))),
        FaultModel("k_scale_of_logical_block", "paging, SPEC §1 and §2.2",
                   "K's scale is read at the logical block (the table's column), not at the physical block",
                   _golden_on(_k_scale_of_logical_block)),
        FaultModel("q_scale_of_kv_head", _MM1, "every query head of group n reads the q_scale of query head n",
                   _golden_on(_q_scale_of_kv_head)),
        FaultModel("softmax_scale_ignored", _MM1, "the softmax_scale argument is ignored: S is scaled by 1 / sqrt(D)",
                   _golden_on(_softmax_scale_ignored)),
        FaultModel("query_heads_read_interleaved", "GQA head map, SPEC §1 and §2.2",
                   "KV head n's g-th query head is read at q's head g*NKV + n (interleaved), its output written at "
                   "n*group + g", _golden_on(_query_heads_read_interleaved)),
        FaultModel("output_heads_written_interleaved", "output, SPEC §1 and §2.4",
                   "query head n*group + g is written at the output's head g*NKV + n (interleaved)",
                   _output_heads_written_interleaved),
        FaultModel("kv_head_of_query_head_over_nkv", "GQA head map, SPEC §2.2",
                   "query head h reads KV head h // NKV, not h // (NQ / NKV)",
                   _golden_on(_kv_head_of_query_head_over_nkv)),
        FaultModel("q_scale_of_batch_row", _MM1, "query row b*S1 + i reads the q_scale of row b (the batch's index)",
                   _golden_on(_q_scale_of_batch_row)),
        FaultModel("output_rows_s1_major", "output, SPEC §1 and §2.4",
                   "the output's rows are written as [S1, B] (row i*B + b), not [B, S1]; q is read right",
                   _output_rows_s1_major),
        FaultModel("v_scale_channel_major", _MM2, "v_scale [B, NKV, D] is read as if laid out [B, D, NKV]",
                   _golden_on(_v_scale_channel_major)),
    ]


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
    """The stage models written from SPEC §2 (properties/stage_models.py), run as fault models."""
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
    return _input_models() + _layout_models() + _stage_models() + _written_stage_models()


def models_by_name() -> dict[str, FaultModel]:
    """:func:`fault_models` by name (the probes of properties/probes.py re-run the leading candidates)."""
    return {m.name: m for m in fault_models()}
