"""Argument checks shared by the golden and every kernel wrapper (SPEC §1).

Anything the kernel does not accept is rejected here with a ValueError (wrong value or shape) or a
TypeError (wrong type or dtype) whose message names the argument, what it got and what was expected.
The golden and the backends call the same functions, so they accept exactly the same inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from .paging import blocks_needed, positive_int, visible_lengths

__all__ = ["PagedAttentionDims", "check_paged_attention_args", "check_qk_matmul_scale_args", "check_tile", "check_on_cpu",
           "check_block_table", "check_scales_not_negative", "check_scores_in_float32", "check_at12_scores_in_float32",
           "SCORE_LIMIT", "default_softmax_scale", "group_size",
           "positive_int"]

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True, kw_only=True)
class PagedAttentionDims:
    """The sizes of one paged-attention call, derived from its arguments (SPEC §1 names)."""

    batch: int
    s1: int
    nq: int
    nkv: int
    head_dim: int
    group: int
    num_blocks: int
    block_size: int
    max_blocks: int
    s2_tile: int
    g_tile: int
    softmax_scale: float


def _tensor(x: object, name: str, dtype: torch.dtype | tuple[torch.dtype, ...], ndim: int, layout: str) -> torch.Tensor:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes:
        wanted = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor ({wanted} {layout}), got {type(x).__name__}")
        raise TypeError(f"{name} must have dtype {wanted}, got {str(x.dtype).replace('torch.', '')}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (ND layout, SPEC §1); call .contiguous() first")
    return x


def _shape(x: torch.Tensor, name: str, expected: tuple[int, ...], layout: str) -> None:
    if tuple(x.shape) != expected:
        raise ValueError(f"{name} must have shape {layout} = {expected}, got {tuple(x.shape)}")


def default_softmax_scale(head_dim: int) -> float:
    """``head_dim ** -0.5``: the softmax scale when the caller passes None (SPEC §1: D^-0.5; SPEC §6:
    AT-12's ``1/sqrt(head_dim)`` derived at run time). Every use rounds it to float32 first, where the
    two spellings agree for every head_dim up to 2**20 (checked in tests/golden/test_validate.py)."""
    scale: float = positive_int(head_dim, "head_dim") ** -0.5
    return scale


def group_size(nq: int, nkv: int, *, names: tuple[str, str] = ("nq", "nkv"), what: str = "") -> int:
    """``nq // nkv``, the query heads that share one KV head (SPEC §1: GQA, NQ a multiple of NKV), after
    checking that ``nkv`` divides ``nq``; ``names`` and ``what`` word the ValueError for the caller."""
    if nq % nkv:
        raise ValueError(f"{names[0]}={nq} must be a multiple of {names[1]}={nkv}{what}")
    return nq // nkv


def check_tile(s2_tile: object, g_tile: object, *, block_size: int, group: int) -> tuple[int, int]:
    """(s2_tile, g_tile) after checking s2_tile % block_size == 0 and g_tile | group (None: group)."""
    s2_tile = positive_int(s2_tile, "s2_tile")
    if s2_tile % block_size:
        raise ValueError(f"s2_tile={s2_tile} must be a multiple of block_size={block_size}")
    g_tile = group if g_tile is None else positive_int(g_tile, "g_tile")
    if group % g_tile:
        raise ValueError(f"g_tile={g_tile} must divide the group size NQ/NKV={group}")
    return s2_tile, g_tile


def _softmax_scale(value: object, head_dim: int) -> float:
    if value is None:
        return default_softmax_scale(head_dim)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"softmax_scale={value} must be a finite positive number")
    return float(value)


def check_paged_attention_args(
    q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor, k_scale: torch.Tensor,
    v_cache: torch.Tensor, v_scale: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
    softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
) -> PagedAttentionDims:
    """The call's dims, after checking every argument against the SPEC §1 table.

    Checks dtypes, ranks, contiguity, shape relations, NQ % NKV, g_tile | group,
    s2_tile % block_size, 0 <= kv_act_seqs[b] <= capacity of the row's leading valid entries,
    valid table entries in [0, NB) with no -1 among them, other entries in [-1, NB).
    """
    _tensor(q, "q", FP8, 3, "[B*S1, NQ, D]")
    _tensor(q_scale, "q_scale", torch.float32, 3, "[B*S1, NQ, 1]")
    _tensor(k_cache, "k_cache", FP8, 4, "[NB, BS, NKV, D]")
    _tensor(k_scale, "k_scale", torch.float32, 4, "[NB, BS, NKV, 1]")
    _tensor(v_cache, "v_cache", FP8, 4, "[NB, BS, NKV, D]")
    _tensor(v_scale, "v_scale", torch.float32, 3, "[B, NKV, D]")
    _tensor(block_table, "block_table", torch.int32, 2, "[B, MAXB]")
    _tensor(kv_act_seqs, "kv_act_seqs", torch.int32, 1, "[B]")

    rows, nq, head_dim = q.shape
    num_blocks, block_size, nkv, kd = k_cache.shape
    batch, max_blocks = block_table.shape
    for name, size in (("q's B*S1", rows), ("q's NQ", nq), ("q's D", head_dim), ("k_cache's NB", num_blocks),
                       ("k_cache's BS", block_size), ("k_cache's NKV", nkv), ("block_table's B", batch),
                       ("block_table's MAXB", max_blocks)):
        if size == 0:
            raise ValueError(f"{name} must be positive, got 0")
    if kd != head_dim:
        raise ValueError(f"k_cache's last dim D={kd} must equal q's D={head_dim}")
    if rows % batch:
        raise ValueError(f"q's first dim B*S1={rows} must be a multiple of B={batch} (block_table's rows)")
    s1 = rows // batch
    group = group_size(nq, nkv, names=("NQ", "NKV"), what=" (q's heads, k_cache's heads)")
    _shape(q_scale, "q_scale", (rows, nq, 1), "[B*S1, NQ, 1]")
    _shape(k_scale, "k_scale", (num_blocks, block_size, nkv, 1), "[NB, BS, NKV, 1]")
    _shape(v_cache, "v_cache", tuple(k_cache.shape), "k_cache's [NB, BS, NKV, D]")
    _shape(v_scale, "v_scale", (batch, nkv, head_dim), "[B, NKV, D]")
    _shape(kv_act_seqs, "kv_act_seqs", (batch,), "[B]")
    s2_tile, g_tile = check_tile(s2_tile, g_tile, block_size=block_size, group=group)
    scale = _softmax_scale(softmax_scale, head_dim)

    # The value checks run in numpy on host copies: a dozen checks on a few integers cost a fraction
    # of the same torch calls, and the kernel wrappers may pass device tensors.
    check_block_table(block_table.detach().cpu().numpy(), kv_act_seqs.detach().cpu().numpy(),
                      block_size=block_size, num_blocks=num_blocks)
    return PagedAttentionDims(
        batch=batch, s1=s1, nq=nq, nkv=nkv, head_dim=head_dim, group=group, num_blocks=num_blocks,
        block_size=block_size, max_blocks=max_blocks, s2_tile=s2_tile, g_tile=g_tile, softmax_scale=scale,
    )


def check_block_table(block_table: npt.ArrayLike, kv_act_seqs: npt.ArrayLike, *, block_size: int, num_blocks: int, shape: tuple[int, int] | None = None,
                      unique: bool = False) -> None:
    """Check a block table against the lengths it serves (SPEC §1, §2 item 2); raise a ValueError naming
    the entry otherwise. ``block_table`` [B, MAXB] and ``kv_act_seqs`` [B] are integer arrays (numpy or
    nested sequences).

    Every entry is a physical block in ``[0, NB)`` or -1 (unused); each row's first
    ``ceil(kv_act_seqs[b] / BS)`` entries (its valid blocks) hold no -1, and the table has as many
    columns. ``shape`` (B, MAXB), when given, is the table's required shape; ``unique`` asks that no
    physical block serve two valid entries (``golden.make_inputs`` writes each valid block once; a kernel
    may be given a table that shares blocks, as prefix caching does)."""
    try:
        table = np.asarray(block_table)
    except ValueError:      # rows of different lengths
        raise ValueError("block_table must be a 2-D table of ints [B, MAXB] (rows of one length)") from None
    lengths = np.asarray(kv_act_seqs).astype(np.int64)
    if table.ndim != 2 or (table.size and not np.issubdtype(table.dtype, np.integer)):
        raise ValueError(f"block_table must be a 2-D table of ints [B, MAXB], got shape {table.shape} of {table.dtype}")
    if shape is not None and table.shape != tuple(shape):
        raise ValueError(f"block_table must have shape [B, MAXB] = {tuple(shape)}, got {table.shape}")
    max_blocks = table.shape[1]
    if lengths.size and lengths.min() < 0:
        b = int(lengths.argmin())
        raise ValueError(f"kv_act_seqs[{b}]={int(lengths[b])} must be >= 0")
    if table.size and (table.min() < -1 or table.max() >= num_blocks):
        bad = np.argwhere((table < -1) | (table >= num_blocks))[0].tolist()
        raise ValueError(
            f"block_table[{bad[0]}, {bad[1]}]={int(table[bad[0], bad[1]])} must be a physical block in "
            f"[0, NB={num_blocks}) or -1 (unused)"
        )
    # Capacity: the leading run of non-(-1) entries of each row, in tokens.
    leading_valid = np.cumprod(table >= 0, axis=1).sum(axis=1)
    needed = blocks_needed(lengths, block_size)
    over = needed > leading_valid
    if over.any():
        b = int(np.argmax(over))
        capacity = int(leading_valid[b]) * block_size
        if int(needed[b]) > max_blocks:
            raise ValueError(
                f"kv_act_seqs[{b}]={int(lengths[b])} exceeds the table's capacity MAXB*BS={max_blocks * block_size}"
            )
        raise ValueError(
            f"kv_act_seqs[{b}]={int(lengths[b])} needs {int(needed[b])} blocks, but block_table[{b}] has -1 at "
            f"column {int(leading_valid[b])} (its valid entries hold {capacity} tokens)"
        )
    if unique:
        valid = np.arange(max_blocks)[None, :] < needed[:, None]
        ids, first = np.unique(table[valid], return_index=True)
        if ids.size < int(valid.sum()):
            where = np.argwhere(valid)
            k = int(np.setdiff1d(np.arange(int(valid.sum())), first)[0])
            b, j = where[k].tolist()
            owner = np.argwhere(valid & (table == table[b, j]))[0].tolist()
            raise ValueError(f"block_table[{b}, {j}]={int(table[b, j])} is also block_table[{owner[0]}, {owner[1]}]: "
                             "each valid entry must name its own physical block")


def check_qk_matmul_scale_args(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
    q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
) -> tuple[bool, float]:
    """(is_fp8, scale) after checking the AT-12 arguments (SPEC §6).

    q [q_tile, D], k [k_tile, D]: both bfloat16, both float16, or both float8_e4m3fn. FP8 inputs
    need q_scale [q_tile, 1] and k_scale [k_tile, 1] in float32; other inputs take neither.
    scale None means 1/sqrt(D).
    """
    dtypes = (torch.bfloat16, torch.float16, FP8)
    _tensor(q, "q", dtypes, 2, "[q_tile, head_dim]")
    _tensor(k, "k", dtypes, 2, "[k_tile, head_dim]")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if q.shape[1] != k.shape[1] or q.shape[1] == 0:
        raise ValueError(f"q and k must share a positive head_dim, got {q.shape[1]} and {k.shape[1]}")
    if q.shape[0] == 0 or k.shape[0] == 0:
        raise ValueError(f"q_tile and k_tile must be positive, got {q.shape[0]} and {k.shape[0]}")
    is_fp8 = q.dtype == FP8
    if is_fp8:
        if q_scale is None or k_scale is None:
            raise ValueError("FP8 q and k need both q_scale [q_tile, 1] and k_scale [k_tile, 1] (dequant_after)")
        _tensor(q_scale, "q_scale", torch.float32, 2, "[q_tile, 1]")
        _tensor(k_scale, "k_scale", torch.float32, 2, "[k_tile, 1]")
        _shape(q_scale, "q_scale", (q.shape[0], 1), "[q_tile, 1]")
        _shape(k_scale, "k_scale", (k.shape[0], 1), "[k_tile, 1]")
    elif q_scale is not None or k_scale is not None:
        raise ValueError(f"q_scale and k_scale apply to FP8 inputs only; q and k are {q.dtype}")
    if scale is None:
        scale = default_softmax_scale(q.shape[1])
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    elif not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale={scale} must be a finite positive number (SPEC §6: 1/sqrt(head_dim) by default)")
    return is_fp8, float(scale)


def check_scales_not_negative(**scales: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """ValueError naming the tensor and the first entry when a dequant scale that is read is negative.
    Each value is a tensor, or ``(tensor, read)`` with ``read`` a bool mask broadcastable to it: the
    entries the computation reads (garbage in cells no kernel may read is none of its business, whatever
    its sign). SPEC §3's dequant scales are ``max|x| / 448 >= 0``; the acceptance envelope (SPEC §4.2)
    carries each dequant product as a monotone map of its interval's ends, which a negative factor turns
    around (with one, a conforming kernel lay outside the envelope in 96 of 144 tries). NaN passes; None
    (an absent scale) is skipped."""
    for name, given in scales.items():
        scale, read = given if isinstance(given, tuple) else (given, True)
        if scale is None:
            continue
        negative = (scale < 0) & read
        if bool(negative.any()):
            at = tuple(int(i) for i in negative.nonzero()[0])
            raise ValueError(f"{name}{list(at)}={float(scale[at])} must be >= 0: a dequant scale is max|x| / 448 "
                             "(SPEC §3), and the acceptance envelope (SPEC §4.2) relies on it")


#: SPEC §4.1 "Domain": a cell's scores may reach ``D 448**2 q_scale k_scale softmax_scale``; from 2**127 on
#: they can leave float32 (the any-order sum and the roundings of F2 add a factor below 2).
SCORE_LIMIT = 2.0 ** 127
#: The largest E4M3 magnitude either codec decodes (the calculator's is 240): |raw| <= D E4M3_MAX**2.
_E4M3_MAX = 448.0


def _score_reach(q: np.ndarray, k: np.ndarray, head_dim: int, softmax_scale: float) -> np.ndarray:
    """float64: the largest magnitude a score's dequant chain can reach, for scales ``q``, ``k`` >= 0:
    ``D 448**2`` times the largest of the products F2 lets a kernel form (``raw q``, ``raw k``, ``raw q k``,
    then ``* softmax_scale``). SPEC §4.1 names the last; the domain includes the others, since a kernel
    that forms ``raw k`` first overflows there whatever ``q`` is (a conforming output would be NaN, which no
    envelope holds): stricter than SPEC's formula, and said so in README, "The acceptance envelope"."""
    with np.errstate(over="ignore", invalid="ignore"):
        both = q * k
        largest = np.maximum(np.maximum(q, k), np.maximum(both, both * softmax_scale))
        reach: np.ndarray = head_dim * _E4M3_MAX ** 2 * largest
    return reach


def _finite_max(x: torch.Tensor) -> float:
    values = x.detach().numpy()
    return float(np.fmax.reduce(values, axis=None, initial=0.0)) if values.size else 0.0   # NaN ignored, inf kept


def check_scores_in_float32(q_scale: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor,
                            kv_act_seqs: torch.Tensor, dims: PagedAttentionDims) -> None:
    """ValueError naming the scale entries when a score cell that is read (a query row and a token it sees,
    SPEC §2 items 1-2) can leave float32 (SPEC §4.1 "Domain": :data:`SCORE_LIMIT`, :func:`_score_reach`):
    such inputs are outside SPEC §2, and neither the golden nor the envelope answers for them. Scales in
    cells no kernel reads are garbage of any size; a NaN scale passes (it is visible in the output).

    Cheap first: the largest of all entries (NaN ignored). Only when that could reach the limit, each row
    is paired with the largest K scale among the tokens it sees (a running maximum along each batch's
    tokens, per kv head)."""
    d, sm = dims.head_dim, dims.softmax_scale
    q_top, k_top = _finite_max(q_scale), _finite_max(k_scale)
    reach = d * _E4M3_MAX ** 2 * max(q_top, k_top, q_top * k_top, q_top * k_top * sm)    # Python floats: inf, no raise
    if not reach >= SCORE_LIMIT or kv_act_seqs.numel() == 0 or int(kv_act_seqs.max()) == 0:
        return
    # numpy: small index arithmetic, where torch's per-call cost would dominate.
    lengths = kv_act_seqs.numpy().astype(np.int64)
    token = np.arange(int(lengths.max()))
    valid = token[None, :] < lengths[:, None]                                            # [B, tokens]
    table = block_table.numpy().astype(np.int64)
    slot = table[:, token // dims.block_size] * dims.block_size + token % dims.block_size
    k_flat = k_scale.detach().numpy().reshape(-1, dims.nkv)
    k_seen = np.where(valid[..., None], k_flat[np.where(valid, slot, 0)], 0.0)          # [B, tokens, N]
    k_running = np.fmax.accumulate(np.nan_to_num(k_seen, nan=0.0), axis=1)            # NaN reads as 0
    cur = visible_lengths(kv_act_seqs, dims.s1).numpy()                                 # [B, S1]
    last = np.maximum(cur - 1, 0)
    k_row = np.take_along_axis(k_running, last[:, :, None], axis=1)                     # [B, S1, N]
    q = np.nan_to_num(q_scale.detach().numpy().astype(np.float64), nan=0.0).reshape(dims.batch, dims.s1, dims.nkv, dims.group)
    cell = _score_reach(q, np.broadcast_to(k_row[..., None], q.shape).astype(np.float64), d, sm)
    bad = (cell >= SCORE_LIMIT) & (cur > 0)[:, :, None, None]
    if not bad.any():
        return
    b, i, n, g = (int(x) for x in np.argwhere(bad)[0])
    t = int(np.argmax(np.nan_to_num(k_seen[b, :last[b, i] + 1, n], nan=0.0)))             # the token with that K scale
    blk, row = int(block_table[b, t // dims.block_size]), t % dims.block_size
    h = n * dims.group + g
    raise ValueError(
        f"q_scale[{b * dims.s1 + i}, {h}, 0]={float(q_scale[b * dims.s1 + i, h, 0]):g} with k_scale[{blk}, {row}, {n}, 0]="
        f"{float(k_scale[blk, row, n, 0]):g} (a token row {b * dims.s1 + i} sees): its scores can reach "
        f"{float(cell[b, i, n, g]):.3g} >= 2**127, outside float32 (SPEC §4.1 Domain: D * 448**2 * q_scale * "
        "k_scale * softmax_scale, and each product F2 lets a kernel form, must stay below 2**127)")


def check_at12_scores_in_float32(q_scale: torch.Tensor | None, k_scale: torch.Tensor | None, head_dim: int,
                                 scale: float) -> None:
    """:func:`check_scores_in_float32` for AT-12's FP8 variant (SPEC §6), where every cell is read."""
    if q_scale is None or k_scale is None:
        return
    q = torch.nan_to_num(q_scale.detach().double(), nan=0.0).numpy()          # [q_tile, 1]
    k = torch.nan_to_num(k_scale.detach().double(), nan=0.0).numpy().T        # [1, k_tile]
    cell = _score_reach(q, k, head_dim, scale)
    if not (cell >= SCORE_LIMIT).any():
        return
    i, j = (int(x) for x in np.argwhere(cell >= SCORE_LIMIT)[0])
    raise ValueError(f"q_scale[{i}, 0]={float(q_scale[i, 0]):g} with k_scale[{j}, 0]={float(k_scale[j, 0]):g}: "
                     f"the score can reach {float(cell[i, j]):.3g} >= 2**127, outside float32 (SPEC §4.1 Domain)")


def check_on_cpu(**tensors: object) -> None:
    """The golden computes on the CPU: every tensor argument must live there (kernel wrappers,
    which share the checks above, take device tensors and do not call this). Call it first: the
    other checks copy a few integers to the host, which a meta tensor cannot do."""
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; the golden runs on the CPU, pass {name}.cpu()")
