"""The bounds of the acceptance envelope's stages (golden/envelope.py, whose module docstring numbers
the steps): the raw score's error E1 (step 1, the any-order bound and the sharper residue bound), the
float32 intervals of the raw sum and of the dequantized score (step 2, F2), of ``exp`` (step 3, F3),
the deviations of MM2 when flippable codes of P take either end (step 5) and the relative error of
the sum of l (step 6). Pure functions of tensors: golden/envelope.py's EnvelopeBuilder folds them,
golden/at12.py and kernels/conforming use the score bounds. golden.envelope re-exports the public names.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .codec import Fp8Codec
from .intervals import U32, down32, lowbit, residue_bound, sum_error_bound, ulp32, up32
from .model import ConformanceModel

__all__ = ["score_bounds", "refine_score_bounds", "raw_interval", "dequant_interval", "exp_bounds",
           "grid_of_codes"]

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


def score_bounds(raw: torch.Tensor, abs_sum: torch.Tensor, grid: torch.Tensor, terms: int,
                 model: ConformanceModel) -> torch.Tensor:
    """float64: E1, the bound on |kernel raw score - exact raw score| (module docstring, step 1), from
    the exact sum ``raw``, ``abs_sum = |q| . |k|`` and the product ``grid`` of the operands' grids.

    0 under the exact model, and where every partial sum is representable (``M <= 2**24 grid``)."""
    if model.sums == "exact":
        return torch.zeros_like(raw)
    magnitude = (abs_sum + raw.abs()) / 2          # max(positive part, negative part): bounds every subset sum
    rounding = "toward-zero" if model.sums == "truncating" else "nearest"
    bound = sum_error_bound(terms, magnitude, abs_sum, raw, rounding=rounding)
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
    The spec model allows SPEC §2.3's order only."""
    chains = [lambda r: r * q_scale * k_scale]
    if model.scale_order == "any":
        chains += [lambda r: r * k_scale * q_scale, lambda r: r * (q_scale * k_scale)]
    lows = [chain(raw_lo) * softmax_scale for chain in chains]
    highs = [chain(raw_hi) * softmax_scale for chain in chains]
    lo, hi = lows[0], highs[0]
    for a, b in zip(lows[1:], highs[1:]):
        lo, hi = torch.minimum(lo, a), torch.maximum(hi, b)
    return lo, hi


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


def _deviations(golden_p8, p8_lo, p8_hi, v, per_tile_sum, like):
    """(low, high) >= 0 per tile [P, N, R, D]: how far ``P8 @ v8`` can move below and above the golden's
    when each flippable code takes either end (``v8``'s positive and negative parts taken apart: a
    midpoint-radius product, exact in float64), computed for the (block, kv head) pairs that have a flippable
    code only."""
    down, up = golden_p8 - p8_lo, p8_hi - golden_p8
    # (q, n) blocks with a flip in some row: V's parts are taken once per block, not once per row.
    blocks = ((down != 0) | (up != 0)).flatten(2).any(dim=-1).nonzero(as_tuple=True)
    low, high = torch.zeros_like(like), torch.zeros_like(like)
    if not blocks[0].numel():
        return low, high
    vr = v[blocks]                                                               # [F, BS, D]
    v_pos, v_neg = vr.clamp(min=0), (-vr).clamp(min=0)
    d, u = down[blocks], up[blocks]                                              # [F, R, BS]
    low_rows = torch.bmm(d, v_pos) + torch.bmm(u, v_neg)
    high_rows = torch.bmm(u, v_pos) + torch.bmm(d, v_neg)
    low_blocks = torch.zeros(down.shape[:-1] + (v.shape[-1],), dtype=torch.float64).index_put(blocks, low_rows)
    high_blocks = torch.zeros(down.shape[:-1] + (v.shape[-1],), dtype=torch.float64).index_put(blocks, high_rows)
    return per_tile_sum(low_blocks), per_tile_sum(high_blocks)


def _sum_relative(n: torch.Tensor, model: ConformanceModel) -> torch.Tensor:
    """float64: relative error bound of a float32 sum of ``n`` non-negative terms (l_j, F1)."""
    if model.sums == "exact":
        return torch.where(n >= 2, U32, 0.0)
    per = 2.0 if model.sums == "truncating" else 1.0
    tree = per * (n - 1).clamp(min=0) * U32 * (1 + n * 2.0 ** -23)
    kahan = 2 * U32 + 16 * n * U32 * U32
    return torch.where(n >= 2, torch.maximum(tree, kahan), 0.0)
