"""The layout models of properties/diagnosis/fault_models.py: a SPEC §1 tensor read or written in another axis order
or by another index (rows as [S1, B], heads before positions, output rows as [S1, B], cache blocks
head-major, v_scale channel-major, the GQA map's interleaved orders, KV head h // NKV, q_scale of the
batch's row), and the softmax_scale argument ignored. One golden call each, on changed inputs."""
from __future__ import annotations

from typing import Any

import torch

from pfa_verify import golden
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.properties.diagnosis.fault_model import Change, FaultModel, golden_on
from pfa_verify.properties.rule.acceptance import Scalars, Tensors

__all__ = ["layout_models"]

_MM1 = "MM1 scales, SPEC §2.3"
_MM2 = "MM2 and the V scale, SPEC §2.3"


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


def layout_models() -> list[FaultModel]:
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
                   golden_on(_block_heads_before_slots("k_cache", "v_cache", "k_scale"))),
        FaultModel("kv_block_heads_before_slots", paging,
                   "every block of K and V (not their scales) is read as [NKV, BS, D], not [BS, NKV, D]",
                   golden_on(_block_heads_before_slots("k_cache", "v_cache"))),
        FaultModel("k_scale_of_logical_block", "paging, SPEC §1 and §2.2",
                   "K's scale is read at the logical block (the table's column), not at the physical block",
                   golden_on(_k_scale_of_logical_block)),
        FaultModel("q_scale_of_kv_head", _MM1, "every query head of group n reads the q_scale of query head n",
                   golden_on(_q_scale_of_kv_head)),
        FaultModel("softmax_scale_ignored", _MM1, "the softmax_scale argument is ignored: S is scaled by 1 / sqrt(D)",
                   golden_on(_softmax_scale_ignored)),
        FaultModel("query_heads_read_interleaved", "GQA head map, SPEC §1 and §2.2",
                   "KV head n's g-th query head is read at q's head g*NKV + n (interleaved), its output written at "
                   "n*group + g", golden_on(_query_heads_read_interleaved)),
        FaultModel("output_heads_written_interleaved", "output, SPEC §1 and §2.4",
                   "query head n*group + g is written at the output's head g*NKV + n (interleaved)",
                   _output_heads_written_interleaved),
        FaultModel("kv_head_of_query_head_over_nkv", "GQA head map, SPEC §2.2",
                   "query head h reads KV head h // NKV, not h // (NQ / NKV)",
                   golden_on(_kv_head_of_query_head_over_nkv)),
        FaultModel("q_scale_of_batch_row", _MM1, "query row b*S1 + i reads the q_scale of row b (the batch's index)",
                   golden_on(_q_scale_of_batch_row)),
        FaultModel("output_rows_s1_major", "output, SPEC §1 and §2.4",
                   "the output's rows are written as [S1, B] (row i*B + b), not [B, S1]; q is read right",
                   _output_rows_s1_major),
        FaultModel("v_scale_channel_major", _MM2, "v_scale [B, NKV, D] is read as if laid out [B, D, NKV]",
                   golden_on(_v_scale_channel_major)),
    ]
