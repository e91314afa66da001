"""Input transformations the laws are made of (SPEC §2): each returns new tensors, never touches its
arguments. ``tensors`` is a dict of the SPEC §1 tensors by name (``InputBundle.tensors()``)."""
from __future__ import annotations

import torch

from pfa_verify.golden.attention import read_cells
from pfa_verify.golden.codec import SPEC_CODEC
from pfa_verify.golden.inputs import GARBAGE
from pfa_verify.properties.rule.attribution import query_positions

__all__ = ["poison_unread", "minus_one_to_garbage", "unread_cells", "derangement", "permute_blocks",
           "repeat_kv_heads", "select_batch"]


def unread_cells(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(bool [NB, BS] cache rows nothing reads, bool [B*S1] query rows with ``cur == 0``): the complement
    of golden.attention.read_cells."""
    nb, bs = tensors["k_cache"].shape[:2]
    s1 = query_positions(tensors)
    slots, rows = read_cells(tensors["block_table"], tensors["kv_act_seqs"], num_blocks=nb, block_size=bs, s1=s1)
    return ~slots, ~rows


def _garbage(fill: str | None) -> tuple[int, float]:
    """(the E4M3 code, the K scale) of garbage ``fill``, a key of ``golden.GARBAGE``."""
    if fill not in GARBAGE:
        raise ValueError(f"fill={fill!r} must be one of {tuple(GARBAGE)}")
    value, scale = GARBAGE[fill]
    return int(SPEC_CODEC.encode(torch.tensor([value], dtype=torch.float32))[0]), scale


def poison_unread(tensors: dict[str, torch.Tensor], fill: str | None) -> dict[str, torch.Tensor]:
    """Copies with ``fill`` (a key of ``golden.GARBAGE``: None for zeros, "nan", "huge" or "plausible";
    the fills make_inputs uses) in every cell the spec says must not reach the output: cache rows no row
    of the table reads (spare blocks, tails of last blocks), their K scales, and q / q_scale of query
    rows with ``cur == 0`` (their output is 0 whatever q holds, SPEC §2 item 5)."""
    code, scale = _garbage(fill)
    out = {k: v.clone() for k, v in tensors.items()}
    cache_rows, query_rows = unread_cells(tensors)
    for name in ("k_cache", "v_cache"):
        out[name].view(torch.uint8)[cache_rows] = code
    out["k_scale"][cache_rows] = scale
    out["q"].view(torch.uint8)[query_rows] = code
    out["q_scale"][query_rows] = scale
    return out


def minus_one_to_garbage(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies with one more physical block, NaN in every K and V code and K scale, and every -1 entry of
    the block table pointing at it. SPEC §2 item 2 clamps a -1 to block 0, whose data must never reach the
    result: the golden reads the same as before, and an output that reads a -1 column comes out NaN."""
    code, scale = _garbage("nan")
    out = dict(tensors)
    for name in ("k_cache", "v_cache"):
        cache = tensors[name]
        extra = torch.full((1, *cache.shape[1:]), code, dtype=torch.uint8).view(cache.dtype)
        out[name] = torch.cat([cache, extra])
    out["k_scale"] = torch.cat([tensors["k_scale"], torch.full((1, *tensors["k_scale"].shape[1:]), scale,
                                                                dtype=tensors["k_scale"].dtype)])
    table = tensors["block_table"]
    out["block_table"] = torch.where(table < 0, torch.full_like(table, tensors["k_cache"].shape[0]), table)
    return out


def derangement(n: int, seed: int) -> torch.Tensor:
    """int64 [n]: a random permutation of range(n) that moves every element (n >= 2): one n-cycle
    through a random order, so a law built on it can never draw the identity."""
    if n < 2:
        raise ValueError(f"n={n} must be >= 2: one block cannot move")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    perm = torch.empty(n, dtype=torch.int64)
    perm[order] = order.roll(-1)
    return perm


def permute_blocks(tensors: dict[str, torch.Tensor], perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Copies with physical block p moved to ``perm[p]`` and the table renumbered to match."""
    out = dict(tensors)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm))
    for name in ("k_cache", "k_scale", "v_cache"):
        out[name] = tensors[name][inv].contiguous()
    table = tensors["block_table"]
    out["block_table"] = torch.where(table >= 0, perm[table.clamp(min=0).long()].to(table.dtype), table)
    return out


def repeat_kv_heads(tensors: dict[str, torch.Tensor], group: int) -> dict[str, torch.Tensor]:
    """Copies with every KV head repeated ``group`` times, so NKV = NQ (no grouping left)."""
    out = dict(tensors)
    for name in ("k_cache", "k_scale", "v_cache"):
        out[name] = tensors[name].repeat_interleave(group, dim=2).contiguous()
    out["v_scale"] = tensors["v_scale"].repeat_interleave(group, dim=1).contiguous()
    return out


def select_batch(tensors: dict[str, torch.Tensor], b: int, s1: int) -> dict[str, torch.Tensor]:
    """The inputs of batch ``b`` alone: its S1 query rows, table row, length and V scales."""
    out = dict(tensors)
    rows = slice(b * s1, (b + 1) * s1)
    out["q"] = tensors["q"][rows].contiguous()
    out["q_scale"] = tensors["q_scale"][rows].contiguous()
    out["block_table"] = tensors["block_table"][b:b + 1].contiguous()
    out["v_scale"] = tensors["v_scale"][b:b + 1].contiguous()
    out["kv_act_seqs"] = tensors["kv_act_seqs"][b:b + 1].contiguous()
    return out
