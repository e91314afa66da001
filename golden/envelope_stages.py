"""The bounds of the acceptance envelope's stages (golden/envelope.py, whose module docstring numbers
the steps): the raw score's error E1 (step 1, the any-order bound and the sharper residue bound), the
float32 intervals of the raw sum and of the dequantized score (step 2, F2), of ``exp`` (step 3, F3),
the deviations of MM2 when flippable codes of P take either end (step 5) and the relative error of
the sum of l (step 6); and the tables they read, built once per codec and kept on it: the grids of
the codes (the exactness certificate's, for Q rows and K columns) and the rounding boundaries of step
4's flip test (boundary_distance). Functions of tensors and arrays (the |V| of _mm2_bounds goes into the
shared golden.scratch buffer): golden/envelope.py's EnvelopeBuilder folds them, golden/at12.py and
kernels/conforming use the score bounds. golden.envelope re-exports the public names.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .codec import Fp8Codec
from .intervals import U32, down32, lowbit, residue_bound, sum_error_bound, ulp32, up32
from .model import ConformanceModel
from .quant import FP8_MAX
from .scratch import SCRATCH

__all__ = ["score_bounds", "refine_score_bounds", "raw_interval", "dequant_interval", "exp_bounds"]

_F64 = 2.0 ** -50          # slack for float64 arithmetic on bounds (a few float64 roundings)


def grid_of_codes(codec: Fp8Codec) -> np.ndarray:
    """float64[256]: the largest power of two dividing each code's value (inf for zero codes): the
    grid every product with that operand lies on (the exactness certificate's ``g``)."""
    cached = getattr(codec, "_pfa_grid", None)
    if cached is None:
        cached = lowbit(torch.from_numpy(codec.decode_array(np.arange(256, dtype=np.uint8)).copy())).numpy()
        cached = np.where(np.isfinite(codec.decode_array(np.arange(256, dtype=np.uint8))), cached, math.inf)
        codec._pfa_grid = cached
    return cached


#: grid_exponents_of_codes's value for a zero code (its grid is infinite); POWERS_OF_GRID reads it as inf.
NO_GRID = 127
#: float64[256]: ``2**(e - 128)`` at index ``e + 128`` of a grid exponent ``e`` (inf for NO_GRID).
POWERS_OF_GRID = np.where(np.arange(256) == NO_GRID + 128, math.inf, np.ldexp(1.0, np.arange(256) - 128))


def grid_exponents_of_codes(codec: Fp8Codec) -> np.ndarray:
    """int8[256]: ``log2`` of :func:`grid_of_codes` (NO_GRID for zero codes): a column's grid is the
    minimum over its codes, taken on one byte per code (a float64 lookup moves eight)."""
    cached = getattr(codec, "_pfa_grid_exponents", None)
    if cached is None:
        grid = grid_of_codes(codec)
        cached = np.where(np.isfinite(grid), np.log2(np.where(np.isfinite(grid), grid, 1.0)), NO_GRID).astype(np.int8)
        codec._pfa_grid_exponents = cached
    return cached


def column_grid_exponents(codec: Fp8Codec, rows: np.ndarray) -> np.ndarray:
    """int8 [...]: the grid exponent of each K column or Q row (one score's operand: the minimum of
    :func:`grid_exponents_of_codes` over its ``D`` codes), from ``rows`` [..., D] uint8 codes with D
    contiguous, as the cache holds them. Two codes at a time (a 65536-entry table of pair minima):
    the lookup is the cost, and it halves."""
    if rows.shape[-1] % 2:
        return np.take(grid_exponents_of_codes(codec), rows).min(axis=-1)
    pairs = getattr(codec, "_pfa_grid_exponent_pairs", None)
    if pairs is None:
        single = grid_exponents_of_codes(codec)
        index = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
        pairs = codec._pfa_grid_exponent_pairs = np.minimum(single[index[:, 0]], single[index[:, 1]])
    halves = np.take(pairs, np.ascontiguousarray(rows).view(np.uint16), mode="clip")
    return halves.min(axis=-1)


def boundary_distance(codec: Fp8Codec, p: torch.Tensor) -> torch.Tensor:
    """float64: for each float32 ``P >= 0``, the distance from ``y = RN(448 P)`` (the golden's P times its
    scale, which is 448: the row max of its P is exp(0) = 1) to the nearest rounding boundary of the
    codec, relative to y (inf at y = 0, NaN for NaN): a kernel whose y' lies less than ``dist * y`` from y
    reads back the golden's code (step 4's flip test). Three lookups in :func:`boundary_brackets`."""
    y = (p * torch.tensor(FP8_MAX, dtype=torch.float32)).numpy()
    split, lower, upper = boundary_brackets(codec)
    top = (y.view(np.uint32) >> np.uint32(16)).astype(np.intp)
    y64 = y.astype(np.float64)
    half = 2 * top + (y64 >= np.take(split, top))
    below, above = y64 - np.take(lower, half), np.take(upper, half) - y64
    with np.errstate(divide="ignore", invalid="ignore"):
        return torch.from_numpy(np.minimum(below, above) / y64)


def boundary_brackets(codec: Fp8Codec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 tables of the codec's rounding boundaries (``codec.rounding_boundaries()``: the first float32
    of each new value read back) by the top 16 bits ``i`` of a non-negative float32: ``split[i]``, the one
    boundary strictly inside the values of that top (inf if none; checked: at most one, as adjacent
    boundaries lie at least 2**15 patterns apart), and [2 * 65536] ``lower``, ``upper`` at ``2 i`` for the
    values below the split and ``2 i + 1`` for those at or above it: the last boundary at or below them
    (-inf if none) and the first above them (inf if none)."""
    cached = getattr(codec, "_pfa_brackets", None)
    if cached is None:
        boundaries = codec.rounding_boundaries().numpy().astype(np.float32)    # float32 values: exact
        starts = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)             # the first pattern of each top
        patterns = boundaries.view(np.uint32)
        first_inside = np.searchsorted(patterns, starts, side="right")           # boundaries <= the top's first
        past = np.searchsorted(patterns, starts | np.uint32(0xFFFF), side="right")  # ... <= its last
        if np.any(past - first_inside > 1):
            raise RuntimeError(f"{codec!r} has two rounding boundaries within one top: the flip test needs a finer table")
        ends = np.concatenate([[-np.inf], boundaries, [np.inf]]).astype(np.float32)   # ends[i + 1] = boundaries[i]
        split = np.where(past > first_inside, ends[first_inside + 1], np.float32(np.inf))
        lower, upper = np.empty(2 << 16, np.float32), np.empty(2 << 16, np.float32)
        lower[0::2], lower[1::2] = ends[first_inside], ends[past]
        upper[0::2], upper[1::2] = ends[first_inside + 1], ends[past + 1]
        cached = codec._pfa_brackets = (split, lower, upper)
    return cached


def column_grids(codec: Fp8Codec, rows: np.ndarray) -> np.ndarray:
    """float64 [...]: each column's grid (:func:`column_grid_exponents` as a power of two, inf where a
    column has none), from ``rows`` [..., D] uint8 codes with D contiguous: the exactness certificate's
    grid of a Q row or a K column."""
    return np.take(POWERS_OF_GRID, column_grid_exponents(codec, rows).astype(np.int16) + 128)


def score_bounds(raw: torch.Tensor, abs_sum: torch.Tensor, grid: torch.Tensor, terms: int,
                 model: ConformanceModel, magnitude: torch.Tensor | None = None) -> torch.Tensor:
    """float64: E1, the bound on |kernel raw score - exact raw score| (module docstring, step 1), from
    the exact sum ``raw``, ``abs_sum = |q| . |k|`` and the product ``grid`` of the operands' grids.

    0 under the exact model, and where every partial sum is representable (``M <= 2**24 grid``).
    ``magnitude``: ``M = (abs_sum + |raw|) / 2``, when the caller has it already."""
    if model.sums == "exact":
        return torch.zeros_like(raw)
    if magnitude is None:                          # max(positive part, negative part): bounds every subset sum
        magnitude = (abs_sum + raw.abs()) / 2
    rounding = "toward-zero" if model.sums == "truncating" else "nearest"
    # With two terms or more the sum bound already covers half an ulp of the exact sum (one of the partial
    # sums ``magnitude`` bounds): the golden's single rounding needs no term of its own.
    bound = sum_error_bound(terms, magnitude, abs_sum, raw if terms < 2 else None, rounding=rounding)
    return torch.where(magnitude <= 2.0 ** 24 * grid, 0.0, bound)


def refine_score_bounds(products: torch.Tensor, raw: torch.Tensor, abs_sum: torch.Tensor) -> torch.Tensor:
    """float64: the residue bound (golden.intervals.residue_bound) for the scores whose products are
    ``products`` [F, D], never below what compensated summation or the golden's single rounding need."""
    magnitude = (abs_sum + raw.abs()) / 2
    sharp = residue_bound(products, magnitude)
    floor = sum_error_bound(0, magnitude, abs_sum, raw)        # terms=0: only the Kahan and 1/2 ulp floors
    return torch.maximum(sharp, floor)


def raw_interval(raw: torch.Tensor, e1: torch.Tensor, model: ConformanceModel) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (lo, hi): every float32 value a kernel's sum can take, given the exact sum ``raw``
    (float64) and the bound ``e1`` (the exact model: the sum rounded once, as the golden does)."""
    if model.sums == "exact":
        return raw.float(), raw.float()
    return down32(raw - e1), up32(raw + e1)


def dequant_interval(raw_lo, raw_hi, q_scale, k_scale, softmax_scale, model: ConformanceModel):
    """float32 (S_lo, S_hi) from float32 raw bounds (module docstring, step 2).

    F2 lets a kernel multiply the dequant scales in any order: ``(raw q) k``, ``(raw k) q`` or
    ``raw (q k)``, then ``softmax_scale`` last, each product rounded to float32. Each chain is monotone in
    raw (a multiplication by a positive number, rounded to nearest, is), so the values reachable lie
    between the chains of the two ends: the union over the three orders is exact, with no widening.
    The last multiplication is monotone too, so it is taken once, after the minimum (maximum) over the
    orders. The spec model allows SPEC §2.3's order only."""
    if model.scale_order != "any":
        return raw_lo * q_scale * k_scale * softmax_scale, raw_hi * q_scale * k_scale * softmax_scale
    both = q_scale * k_scale
    lo = torch.minimum(torch.minimum(raw_lo * q_scale * k_scale, raw_lo * k_scale * q_scale), raw_lo * both)
    hi = torch.maximum(torch.maximum(raw_hi * q_scale * k_scale, raw_hi * k_scale * q_scale), raw_hi * both)
    return lo * softmax_scale, hi * softmax_scale


def exp_bounds(e_lo: torch.Tensor, e_hi: torch.Tensor, d_lo: torch.Tensor, d_hi: torch.Tensor,
               ulps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 bounds on a kernel's ``P = exp(x)`` (F3: within ``ulps`` float32 ulps, ``exp(0) = 1``)
    for ``x = RN(S - m)`` with ``S - m`` in ``[d_lo, min(0, d_hi)]``, from ``e_lo = exp(d_lo)`` and
    ``e_hi = exp(d_hi)``: the rounding of x moves it by at most ``ulp(d)`` (a factor ``exp(+-ulp(d))``,
    bounded by ``1 - ulp`` and ``1 + 2 ulp``), then the smallest float32 >= ``exp(x_lo) - ulps ulp(...)``
    and the largest <= ``min(1, exp(x_hi)) + ulps ulp(...)`` (the float64 exp's own error: 2**-50)."""
    low = e_lo * (1 - ulp32(d_lo).clamp(max=0.5)) * (1 - _F64)
    high = torch.clamp(e_hi * (1 + 2 * ulp32(d_hi).clamp(max=0.5)), max=1.0) * (1 + _F64)
    # ulp of the exact exp, bounded above (an ulp is non-decreasing in the magnitude).
    return (up32((low - ulps * ulp32(low * (1 + 4 * _F64))).clamp(min=0.0)),
            down32(high + ulps * ulp32(high)))


def _mm2_bounds(golden_p8, p8_lo, p8_hi, v, per_tile_sum):
    """(low, high, magnitude) per tile [P, N, R, D]: how far ``P8 @ v8`` can move below and above the
    golden's when each flippable code takes either end (low, high >= 0), and ``P8_hi @ |v8|``, which
    bounds every partial sum of a conforming MM2 (step 5). Blocks are [Q, N, R, BS].

    With ``d = P8 - P8_lo`` and ``u = P8_hi - P8`` (both >= 0), the lowest sum takes ``-d`` where v is
    positive and ``+u`` where it is negative: ``low = d.v+ + u.v-`` and ``high = u.v+ + d.v-``, that is
    ``((u + d).|v| +- (d - u).v) / 2``: two matrix products, taken for the (block, kv head) pairs that
    hold a flippable code only. Every value is exact in float64 (E4M3 products, and code differences of
    a few significant bits, summed over a block: the golden's MM2 argument, golden/matmul.py)."""
    v_abs = SCRATCH.abs("|K| or |V|", v)
    magnitude = per_tile_sum(torch.matmul(p8_hi, v_abs))
    width = p8_hi - p8_lo
    moved = (p8_lo != golden_p8) | (p8_hi != golden_p8)
    blocks = moved.flatten(2).any(dim=-1).nonzero(as_tuple=True)              # (block, kv head) with a flip
    if not blocks[0].numel():
        return torch.zeros_like(magnitude), torch.zeros_like(magnitude), magnitude
    spread = torch.bmm(width[blocks], v_abs[blocks])                          # [F, R, D]
    signed = torch.bmm((2 * golden_p8 - p8_lo - p8_hi)[blocks], v[blocks])
    shape = width.shape[:-1] + (v.shape[-1],)
    low = torch.zeros(shape, dtype=torch.float64).index_put(blocks, (spread + signed) / 2)
    high = torch.zeros(shape, dtype=torch.float64).index_put(blocks, (spread - signed) / 2)
    return per_tile_sum(low), per_tile_sum(high), magnitude


def _sum_relative(n: torch.Tensor, model: ConformanceModel) -> torch.Tensor:
    """float64: relative error bound of a float32 sum of ``n`` non-negative terms (l_j, F1)."""
    if model.sums == "exact":
        return torch.where(n >= 2, U32, 0.0)
    per = 2.0 if model.sums == "truncating" else 1.0
    tree = per * (n - 1).clamp(min=0) * U32 * (1 + n * 2.0 ** -23)
    kahan = 2 * U32 + 16 * n * U32 * U32
    return torch.where(n >= 2, torch.maximum(tree, kahan), 0.0)
