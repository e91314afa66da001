"""Ablations: a case with parts of SPEC §2 made unable to matter, to locate a defect no fault model names.

A fault model names a defect only when someone wrote it down; the *stage* a defect lives in can be found
without one. Each ablation changes a case so that some stages take no part in its output:

- **scores 0**: every visible K code 0, so every score is 0; MM1, its scales, the softmax scale and the row
  max do not matter, and a row weighs the tokens it sees alike (which tokens it sees still matters);
- **V constant**: every visible V token equal to the first (batch 0's token 0, each KV head's codes), so a
  row's output is that token times its batch's V scale however it weighs what it sees, up to P's E4M3
  rounding (sum(P8 * p_scale) / l is 1 only to within it): the scores, the mask, the tile walk, the online
  update and which batch's blocks it reads matter only through that rounding; V's scale, the
  normalization and the output do;
- **unit scales**: q_scale, k_scale and v_scale folded into the codes and every scale 1 (the scales'
  layout and their place in the chain do not matter);
- the case's shape reduced: **one tile** (every length at most s2_tile), **one query row** (S1 = 1: no
  causal offset), **one head** (NQ = NKV = 1: no GQA map), **one batch**, the **default softmax scale**, **no
  garbage**, **full last tiles** (every length a multiple of s2_tile).

properties/diagnosis/probes.py runs the kernel on the ablations that best tell the stages still in the running
apart, and says which stages' fault models fail where the kernel fails and pass where it passes. The
fault models are the map from an ablation's outcome to a stage (each is the golden with one stage
changed), so no table of "ablation -> stage" is written by hand here; a defect nobody modelled is located
when the models of its stage, and of no other, behave as the kernel does on every ablation run.

Only the values and shapes of a case change; the tensors keep their dtypes, the caches their garbage in
the cells no kernel may read, and the block table its blocks (the tensor ablations).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pfa_verify import golden
from pfa_verify.golden.paging import token_slots
from pfa_verify.properties.rule.case import Case

__all__ = ["Ablation", "ABLATIONS", "ablations", "replaced_config", "with_lengths"]


def replaced_config(c: golden.PagedAttentionConfig, **changes: Any) -> golden.PagedAttentionConfig | None:
    """``c`` with ``changes``: its block table kept where it still holds the new lengths, else a table of
    the same width drawn afresh, else any table; None when no such case is valid."""
    attempts = [changes,
                changes | {"block_table": None, "num_blocks": None},
                changes | {"block_table": None, "num_blocks": None, "max_blocks": None}]
    for attempt in attempts:
        try:
            return dataclasses.replace(c, **attempt)
        except ValueError:
            continue
    return None


def with_lengths(c: golden.PagedAttentionConfig, lengths: list[int]) -> golden.PagedAttentionConfig | None:
    """``c`` with the batches' visible lengths ``lengths`` (as many batches as lengths)."""
    return replaced_config(c, batch=len(lengths), kv_act_seqs=tuple(lengths), s2=max(c.s2, *lengths, 1))


# -- the tensor ablations: values changed where a kernel reads them, garbage kept ------------------------

def _codes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


def _encode(values: torch.Tensor) -> torch.Tensor:
    """float32 values as E4M3FN codes (spec codec), saturated at the format's largest finite value."""
    return golden.SPEC_CODEC.to_fp8(values.clamp(-golden.FP8_MAX, golden.FP8_MAX))


def _slots(t: dict[str, torch.Tensor], block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, _, block, row = token_slots(t["block_table"], t["kv_act_seqs"], block_size)
    return batch, block, row


def _cache_cells(case: Case, name: str, codes: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]) -> Case | None:
    """``case`` with the codes of cache ``name`` at the cells a kernel reads set to ``codes(old codes, block,
    row)``; None when no cell is read."""
    t = case.inputs().tensors()
    _, block, row = _slots(t, case.config.block_size)
    if not block.numel():
        return None
    x = t[name].clone()
    _codes(x)[block, row] = codes(_codes(t[name]), block, row)
    return dataclasses.replace(case, explicit={**t, name: x}, name=None)


def _scores_zero(case: Case) -> Case | None:
    return _cache_cells(case, "k_cache", lambda old, block, row: 0)           # code 0 is +0.0


def _values_constant(case: Case) -> Case | None:
    return _cache_cells(case, "v_cache", lambda old, block, row: old[block[0], row[0]])


def _unit_scales(case: Case) -> Case | None:
    t = case.inputs().tensors()
    batch, block, row = _slots(t, case.config.block_size)
    decode = golden.SPEC_CODEC.from_fp8
    q = _encode(decode(t["q"]) * t["q_scale"])
    k, k_scale, v = t["k_cache"].clone(), t["k_scale"].clone(), t["v_cache"].clone()
    _codes(k)[block, row] = _codes(_encode(decode(t["k_cache"][block, row]) * t["k_scale"][block, row]))
    k_scale[block, row] = 1.0
    _codes(v)[block, row] = _codes(_encode(decode(t["v_cache"][block, row]) * t["v_scale"][batch]))
    return dataclasses.replace(case, name=None, explicit={
        **t, "q": q, "q_scale": torch.ones_like(t["q_scale"]), "k_cache": k, "k_scale": k_scale,
        "v_cache": v, "v_scale": torch.ones_like(t["v_scale"])})


# -- the shape ablations: another case of the same seed --------------------------------------------------

def _shaped(case: Case, config: golden.PagedAttentionConfig | None) -> Case | None:
    return None if config is None or config == case.config else Case(config, seed=case.seed)


def _one_tile(case: Case) -> Case | None:
    c = case.config
    return _shaped(case, with_lengths(c, [min(n, c.s2_tile) for n in c.lengths]))


def _full_tiles(case: Case) -> Case | None:
    c = case.config
    return _shaped(case, with_lengths(c, [-(-n // c.s2_tile) * c.s2_tile for n in c.lengths]))


def _one_row(case: Case) -> Case | None:
    return _shaped(case, replaced_config(case.config, s1=1))


def _one_head(case: Case) -> Case | None:
    return _shaped(case, replaced_config(case.config, nq=1, nkv=1, g_tile=None))


def _one_batch(case: Case) -> Case | None:
    c = case.config
    return _shaped(case, with_lengths(c, [max(c.lengths)])) if c.batch > 1 else None


def _block_is_tile(case: Case) -> Case | None:
    c = case.config
    return _shaped(case, replaced_config(c, block_size=c.s2_tile)) if c.block_size != c.s2_tile else None


def _default_softmax_scale(case: Case) -> Case | None:
    return _shaped(case, replaced_config(case.config, softmax_scale=None))


def _no_garbage(case: Case) -> Case | None:
    return _shaped(case, replaced_config(case.config, garbage=None))


@dataclasses.dataclass(frozen=True)
class Ablation:
    """One way to make stages unable to matter: ``make(case)`` is the ablated case (None: it does not
    apply, or changes nothing)."""
    name: str
    what: str
    make: Callable[[Case], Case | None] = dataclasses.field(repr=False)


ABLATIONS: tuple[Ablation, ...] = (
    Ablation("scores 0", "every visible K code 0 (every score 0)", _scores_zero),
    Ablation("V constant", "every visible V token the first token's (of batch 0, for every KV head)", _values_constant),
    Ablation("unit scales", "q, k and v scales folded into the codes, every scale 1", _unit_scales),
    Ablation("one tile", "every length at most s2_tile", _one_tile),
    Ablation("full tiles", "every length a multiple of s2_tile", _full_tiles),
    Ablation("one query row", "S1 = 1 (no causal offset)", _one_row),
    Ablation("one head", "NQ = NKV = 1 (no GQA map)", _one_head),
    Ablation("block of a tile", "block_size = s2_tile", _block_is_tile),
    Ablation("one batch", "the longest batch alone", _one_batch),
    Ablation("default softmax scale", "softmax_scale None (1/sqrt(D))", _default_softmax_scale),
    Ablation("no garbage", "the unread cache cells 0, not garbage", _no_garbage),
)


def ablations(case: Case, names: tuple[str, ...] | None = None) -> Iterator[tuple[str, Case]]:
    """(what changed, the ablated case) of every ablation (of ``names``, in that order; None: all) that
    applies to ``case`` and changes it."""
    by_name = {a.name: a for a in ABLATIONS}
    unknown = [n for n in names or () if n not in by_name]
    if unknown:
        raise ValueError(f"names={unknown!r} must be ablations of {tuple(by_name)}")
    for a in ABLATIONS if names is None else [by_name[n] for n in names]:
        try:
            ablated = a.make(case)
        except (ValueError, TypeError, IndexError, RuntimeError):    # a shape the change cannot make
            continue
        if ablated is not None:
            yield f"ablation '{a.name}': {a.what}", ablated
