"""The bounds of the acceptance envelope's stages (golden/envelope/builder.py, whose module docstring numbers
the steps): the raw score's error E1 (step 1, the any-order bound and the sharper residue bound), the
float32 intervals of the raw sum and of the dequantized score (step 2, F2), of ``x = RN(S - m)`` and of
``exp`` (step 3, F3, SPEC's ulp), the deviations of MM2 when flippable codes of P take either end (step
5), the relative error of the sum of l and ``exp(S_hi - m_hi)`` for it (step 6); and the tables they
read, built once per codec and kept on it: the grids of the codes (the exactness certificate's, for Q
rows and K columns), the rounding boundaries of step 4's flip test (boundary_distance) and the codec's
quantization error (step 8). Functions of tensors and arrays (the |V| of mm2_bounds goes into the
shared golden.scratch buffer): golden/envelope/builder.py's EnvelopeBuilder carries them per tile,
golden/envelope/fold.py folds them, golden/at12.py and kernels/conforming use the score bounds.
golden.envelope re-exports the public names. Each is held alone at its edges in
tests/golden/test_stage_bounds.py.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..codec import Fp8Codec
from ..intervals import TINY32, U32, float64_slack, lowbit, outward_sums, step32, widen, within_ulps_arrays
from ..model import ConformanceModel
from ..quant import FP8_MAX
from ..scratch import SCRATCH
from ..sum_bounds import residue_bound, sum_error_bound

__all__ = ["score_bounds", "refine_score_bounds", "raw_interval", "dequant_interval", "exp_arguments", "exp_bounds",
           "sum_relative", "quantization_error", "upper_relative_to_max", "mm2_bounds", "scale_product_error",
           "mm2_scaled_interval"]

def grid_of_codes(codec: Fp8Codec) -> np.ndarray:
    """float64[256]: the largest power of two dividing each code's value (inf for zero codes): the
    grid every product with that operand lies on (the exactness certificate's ``g``)."""
    def make() -> np.ndarray:
        grid = lowbit(torch.from_numpy(codec.decode_array(np.arange(256, dtype=np.uint8)).copy())).numpy()
        return np.where(np.isfinite(codec.decode_array(np.arange(256, dtype=np.uint8))), grid, math.inf)
    return codec.derived("grid of codes", make)


#: grid_exponents_of_codes's value for a zero code (its grid is infinite); POWERS_OF_GRID reads it as inf.
NO_GRID = 127
#: float64[256]: ``2**(e - 128)`` at index ``e + 128`` of a grid exponent ``e`` (inf for NO_GRID).
POWERS_OF_GRID = np.where(np.arange(256) == NO_GRID + 128, math.inf, np.ldexp(1.0, np.arange(256) - 128))


def grid_exponents_of_codes(codec: Fp8Codec) -> np.ndarray:
    """int8[256]: ``log2`` of :func:`grid_of_codes` (NO_GRID for zero codes): a column's grid is the
    minimum over its codes, taken on one byte per code (a float64 lookup moves eight)."""
    def make() -> np.ndarray:
        grid = grid_of_codes(codec)
        return np.where(np.isfinite(grid), np.log2(np.where(np.isfinite(grid), grid, 1.0)), NO_GRID).astype(np.int8)
    return codec.derived("grid exponents of codes", make)


def column_grid_exponents(codec: Fp8Codec, rows: np.ndarray) -> np.ndarray:
    """int8 [...]: the grid exponent of each K column or Q row (one score's operand: the minimum of
    :func:`grid_exponents_of_codes` over its ``D`` codes), from ``rows`` [..., D] uint8 codes with D
    contiguous, as the cache holds them. Two codes at a time (a 65536-entry table of pair minima):
    the lookup is the cost, and it halves."""
    if rows.shape[-1] % 2:
        single: np.ndarray = np.take(grid_exponents_of_codes(codec), rows).min(axis=-1)
        return single
    def make() -> np.ndarray:
        single = grid_exponents_of_codes(codec)
        index = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
        minima: np.ndarray = np.minimum(single[index[:, 0]], single[index[:, 1]])
        return minima
    pairs = codec.derived("grid exponents of code pairs", make)
    halves = np.take(pairs, np.ascontiguousarray(rows).view(np.uint16), mode="clip")
    least: np.ndarray = halves.min(axis=-1)
    return least


def boundary_distance(codec: Fp8Codec, p: torch.Tensor) -> torch.Tensor:
    """float64: for each float32 ``P >= 0``, the distance from ``y = RN(448 P)`` (the golden's P times its
    scale, which is 448: the row max of its P is exp(0) = 1) to the nearest rounding boundary of the
    codec, relative to y (inf at y = 0, NaN for NaN): a kernel whose y' lies less than ``dist * y`` from y
    reads back the golden's code (step 4's flip test). Three lookups in :func:`boundary_brackets`."""
    y = p.numpy() * np.float32(FP8_MAX)                         # float32, as torch's product
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
    def make() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        return split, lower, upper
    return codec.derived("rounding brackets", make)


def quantization_error(codec: Fp8Codec, top: float) -> tuple[float, float, float]:
    """``(rho_lo, rho_hi, alpha)``: for every float32 ``y`` in ``[0, top]``, the value ``codec.round(y)`` reads
    back lies in ``[rho_lo y - alpha, rho_hi y + alpha]`` (the degenerate rows' bound, step 8 of
    golden/envelope/builder.py). Read off the codec's own rounding boundaries: between two boundaries the value is
    one constant ``v`` and ``y`` spans ``[b, b')``, so ``v / b`` and ``v / b'`` are the extremes of the ratio.
    Below ``Y0`` (the last boundary under which some interval is off by more than 1/16 relative: the spec
    codec's subnormals, the calculator's integer rounding; the saturating last interval excepted) the error
    is taken absolutely, ``alpha``, the
    largest ``|v - y|`` there; above it relatively. Kept on the codec, per ``top``."""
    cache: dict[float, tuple[float, float, float]] = codec.derived("quantization error by top", dict)
    if top in cache:
        return cache[top]
    starts = np.concatenate([[0.0], codec.rounding_boundaries().numpy()])
    starts = starts[starts <= top]
    ends = np.concatenate([starts[1:], [top]])
    values = codec.round(torch.from_numpy(starts).float()).double().numpy()
    relative_off = np.maximum(np.abs(values / np.where(starts > 0, starts, np.nan) - 1),
                              np.abs(values / np.where(ends > 0, ends, np.nan) - 1))
    relative_off = np.nan_to_num(relative_off, nan=np.inf)
    # The last interval (saturation: the calculator reads 240 for every y >= 240) stays relative: as an
    # absolute error it would cost every token 208 / 448 of its weight.
    off = np.nonzero(relative_off[:-1] > 1 / 16)[0]
    first = int(off.max()) + 1 if off.size else 0                      # intervals from here on: relative
    alpha = float(np.max(np.maximum(np.abs(values[:first] - starts[:first]), np.abs(values[:first] - ends[:first])),
                         initial=0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_hi = float(np.max(values[first:] / starts[first:], initial=1.0))
        rho_lo = float(np.min(values[first:] / ends[first:], initial=1.0))
    # float64 quotients: one rounding each, outward.
    cache[top] = (rho_lo * (1 - 2.0 ** -52), rho_hi * (1 + 2.0 ** -52), alpha * (1 + 2.0 ** -52))
    return cache[top]


def column_grids(codec: Fp8Codec, rows: np.ndarray) -> np.ndarray:
    """float64 [...]: each column's grid (:func:`column_grid_exponents` as a power of two, inf where a
    column has none), from ``rows`` [..., D] uint8 codes with D contiguous: the exactness certificate's
    grid of a Q row or a K column."""
    grids: np.ndarray = np.take(POWERS_OF_GRID, column_grid_exponents(codec, rows).astype(np.int16) + 128)
    return grids


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
    """float64: the residue bound (golden.sum_bounds.residue_bound) for the scores whose products are
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
    exact, bound = raw.detach().double().numpy(), e1.detach().double().numpy()      # each read once, negated in numpy
    return outward_sums(exact, -bound, exact, bound)


def dequant_interval(raw_lo: torch.Tensor, raw_hi: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
                     softmax_scale: float | torch.Tensor, model: ConformanceModel) -> tuple[torch.Tensor, torch.Tensor]:
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


#: The smallest normal float32: a float32 product at or above it is within 2**-24 of its exact value, relative.
NORMAL32 = 2.0 ** -126


def scale_product_error(ps_lo: float, v_scale: np.ndarray, model: ConformanceModel) -> np.ndarray:
    """float64, ``v_scale``'s shape: per channel, the absolute error that MM2's scales multiplied together
    first add to ``O = RN(O_raw * RN(p_scale * v_scale))``, in units of ``|O_raw|`` (step 5, F2 as
    docs/spec.md states it: the two scales of a stage may be multiplied together first).

    ``RN(p v) = p v (1 + d) + eta`` with ``|d| <= 2**-24`` and ``eta = 0`` where ``p v >= 2**-126``, or ``d =
    0`` and ``|eta| <= 2**-150`` where the product is a float32 subnormal (SPEC §4.1's ulp there is
    2**-149). So ``O = O_raw p v (1 + d)(1 + d') + O_raw eta (1 + d') + eta'``: the two relative roundings
    and the absolute ``eta'`` every order shares (:func:`mm2_scaled_interval` widens by them), plus ``|O_raw|
    2**-150 (1 + 2**-24)`` where ``p_scale * v_scale`` can be subnormal, i.e. ``0 < ps_lo * v_scale < 2**-126``
    (p_scale is at least ``ps_lo``, EnvelopeBuilder.ps_lo). A product of 0 (``v_scale = 0``) is exact. Float64: the
    comparison is exact (a product of two float32 values), the returned constant needs no rounding. 0
    everywhere for a model that allows SPEC §2.3's order only (``scale_order='spec'``)."""
    vs = np.asarray(v_scale, dtype=np.float64)
    if model.scale_order != "any":
        return np.zeros_like(vs)
    subnormal = (vs > 0) & (vs * ps_lo < NORMAL32)
    return np.where(subnormal, 2.0 ** -150 * (1 + U32), 0.0)


def mm2_scaled_interval(o_lo: np.ndarray, o_hi: np.ndarray, ps_lo: float, ps_hi: float, v_scale: np.ndarray,
                        model: ConformanceModel) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (O_lo, O_hi) of a kernel's ``O = O_raw * p_scale * v_scale`` (step 5, F2) for a float32 ``O_raw``
    in ``[o_lo, o_hi]`` (float64 arrays [..., D]), ``p_scale`` in ``[ps_lo, ps_hi]`` (positive) and ``v_scale``
    ``>= 0`` broadcasting against them.

    F2 lets the two products come in either order, ``(O_raw p) v`` or ``(O_raw v) p``, each rounded to float32:
    within ``(1 + 2**-24)**2`` of the exact product, relative, plus ``2**-150`` absolute for each rounding
    whose result is subnormal (``2 TINY32`` covers both: ``O_raw p`` is never subnormal, since a nonzero
    O_raw is at least 2**-18, the grid of E4M3 products that every float32 partial sum keeps, and ``p`` at
    least ``ps_lo``; ``O_raw v``'s is then scaled by ``p < 1``). And, as
    docs/spec.md states it, the scales multiplied together first, ``O_raw RN(p v)``: the same two relative
    roundings plus ``|O_raw|`` times the product's absolute error where ``p v`` is subnormal
    (:func:`scale_product_error`). The exact product is monotone in ``O_raw`` and in ``p`` (of ``O_raw``'s
    sign), so its ends are at ``o_lo`` and ``o_hi`` with ``ps_lo`` or ``ps_hi``. Float64: the two products,
    the widening's product and its two sums: 5 units relative to the ends; the association's term carries
    its own 4 (its product, its sum with ``2 TINY32``, the widening's two sums, each rounding by at most
    ``2**-53 (|x| + term)``)."""
    vs = np.asarray(v_scale, dtype=np.float64)
    per_unit = scale_product_error(ps_lo, vs, model)
    absolute: float | torch.Tensor = 2 * TINY32
    if per_unit.any():
        absolute = torch.from_numpy(2 * TINY32 + per_unit * np.maximum(np.abs(o_lo), np.abs(o_hi)) * (1 + float64_slack(4)))
    lo = np.minimum(o_lo * ps_lo, o_lo * ps_hi) * vs
    hi = np.maximum(o_hi * ps_lo, o_hi * ps_hi) * vs
    return widen(torch.from_numpy(lo), torch.from_numpy(hi), (1 + U32) ** 2 - 1 + float64_slack(5), absolute)


def exp_arguments(s_lo: torch.Tensor, s_hi: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(x_lo, x_hi)``: the ends of ``x = RN(S - m)``, a kernel's float32 subtraction (SPEC §2.3), for
    float32 ``S`` in ``[s_lo, s_hi]`` and a row max ``m`` in ``[m_lo, m_hi]`` (float32 values, given in any
    float dtype), ``x_hi <= 0``. RN is monotone, so the ends are ``RN(s_lo - m_hi)`` and ``RN(s_hi - m_lo)``:
    float32 subtractions, exactly what the kernel computes."""
    x_lo = s_lo.float() - m_hi.float()
    x_hi = (s_hi.float() - m_lo.float()).clamp(max=0.0)
    return x_lo, x_hi


#: float64 ``exp``'s error, in float64 roundings (torch's float64 exp, SLEEF's u10 or glibc's, is within
#: 1 ulp = 2 units of 2**-53), and the product that applies the slack: 3.
_EXP64_ROUNDINGS = 3
#: The largest float32 below 0: for x < 0, exp(x) <= exp(-2**-149) < 1.
_BELOW_ZERO = -(2.0 ** -149)


def exp_bounds(x_lo: torch.Tensor, x_hi: torch.Tensor, ulps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(P_lo, P_hi)``: every float32 a kernel's ``exp`` may return for a float32 ``x`` in
    ``[x_lo, x_hi]`` (``x_hi <= 0``) under SPEC §4.1 F3: within ``ulps`` ulp of ``exp(x)``, with SPEC's ulp
    (golden.intervals.within_ulps: just above a power of two the results reach ``ulps`` steps of the upper
    binade below it), never below 0, and ``exp(0) = 1`` exactly.

    The exact ``exp(x_lo)`` and ``exp(x_hi)`` are bounded by float64 ``exp`` and its error
    (:data:`_EXP64_ROUNDINGS`). At ``x = 0`` the result is 1; for ``x < 0`` the exact value is below 1, in
    the binade of spacing 2**-24, so the greatest result is below ``1 + ulps 2**-24`` (the bound is taken
    over the ``x < 0`` part, then 1 joined where ``x_hi = 0``): 1 for ``ulps <= 2``, and 1 + 2**-23 for
    SPEC's 3 ulp, which a kernel reaches at x = -2**-24 (a P above exp(0) = 1)."""
    slack = float64_slack(_EXP64_ROUNDINGS)
    if x_lo.shape != x_hi.shape:
        x_lo, x_hi = torch.broadcast_tensors(x_lo, x_hi)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    lo, hi = x_lo.numpy(), x_hi.numpy()
    # One exp for both ends (elementwise: the same bits as two), on the float64 pair [2, ...] built in numpy:
    # the widening is exact, and the clamp is a minimum with a number (a NaN passes unchanged, as torch's).
    # (numpy from here: a few operations on the flagged elements, where torch's per-call cost would dominate.)
    t = np.empty((2,) + lo.shape)
    t[0], t[1] = lo, hi
    np.minimum(t[1, ...], _BELOW_ZERO, out=t[1, ...])
    t = torch.exp(torch.from_numpy(t)).numpy()
    t_lo, t_hi = t[0, ...], t[1, ...]                 # in place (arrays, even 0-d ones)
    t_lo *= 1 - slack
    t_hi *= 1 + slack
    # x < 0: exp(x) < 1 exactly, whatever float64 says; 1 - 2**-53 keeps the spacing of [1/2, 1), and the
    # float32 results there are below 1 + ulps 2**-24, strictly when the cap binds.
    capped = t_hi >= 1
    np.copyto(t_hi, 1 - 2.0 ** -53, where=capped)
    p_lo, p_hi = within_ulps_arrays(t_lo, np.maximum(t_hi, t_lo), ulps)
    if capped.any():
        p_hi = step32(p_hi, capped & (p_hi.astype(np.float64) >= np.float64(1 + ulps * 2.0 ** -24)), -1)   # P > 0 here
    # In place from here: p_lo and p_hi are fresh arrays of this call.
    zero_hi, zero_lo = hi == 0, lo == 0          # x_lo == 0: x is 0 in every execution
    np.maximum(p_hi, np.float32(1), out=p_hi, where=zero_hi)
    np.maximum(p_lo, np.float32(0), out=p_lo)
    np.copyto(p_lo, np.float32(1), where=zero_lo)
    np.copyto(p_hi, np.float32(1), where=zero_lo)
    return torch.from_numpy(p_lo.astype(np.float32, copy=False)), torch.from_numpy(p_hi.astype(np.float32, copy=False))


def mm2_bounds(golden_p8: torch.Tensor, p8_lo: torch.Tensor, p8_hi: torch.Tensor, v: torch.Tensor,
               per_tile_sum: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    shape = width.shape[:-1] + (v.shape[-1],)
    pairs = blocks[0].numel()
    if pairs == moved.shape[0] * moved.shape[1]:
        # Every pair holds one (a row of its own, typically): the operands as they lie, without gathering
        # each block's V (row-major, the order nonzero lists the pairs in, and as contiguous as a gather).
        def take(x: torch.Tensor) -> torch.Tensor:
            return x.reshape((pairs,) + x.shape[2:])

        def put(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(shape)
    else:
        def take(x: torch.Tensor) -> torch.Tensor:
            return x[blocks]

        def put(x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.float64).index_put(blocks, x)
    spread = torch.bmm(take(width), take(v_abs))                               # [F, R, D]
    signed = torch.bmm(take(2 * golden_p8 - p8_lo - p8_hi), take(v))
    return per_tile_sum(put((spread + signed) / 2)), per_tile_sum(put((spread - signed) / 2)), magnitude


def sum_relative(n: torch.Tensor, model: ConformanceModel) -> torch.Tensor:
    """float64: relative error bound of a float32 sum of ``n`` non-negative terms (l_j, F1)."""
    if model.sums == "exact":
        return torch.where(n >= 2, U32, 0.0)
    per = 2.0 if model.sums == "truncating" else 1.0
    if n.dtype == torch.float64:
        # numpy: a dozen float64 operations on a count per row (IEEE in either library; a NaN count gives 0).
        count = n.detach().numpy()
        tree64 = per * np.maximum(count - 1, 0.0) * U32 * (1 + count * 2.0 ** -23)
        kahan64 = 2 * U32 + 16 * count * U32 * U32
        return torch.from_numpy(np.asarray(np.where(count >= 2, np.maximum(tree64, kahan64), 0.0)))
    tree = per * (n - 1).clamp(min=0) * U32 * (1 + n * 2.0 ** -23)
    kahan = 2 * U32 + 16 * n * U32 * U32
    return torch.where(n >= 2, torch.maximum(tree, kahan), 0.0)


#: Rows whose max is uncertain by more than this (logits) get ``exp(S_hi - m_hi)`` from its own exp: the
#: product ``exp(S_hi - m_lo) exp(m_lo - m_hi)`` would meet an overflowed and an underflowed (or subnormal,
#: a few significant bits) factor.
_WIDE_MAX = 600.0


def upper_relative_to_max(e_hi: torch.Tensor, s_hi: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor) -> torch.Tensor:
    """float64 ``exp(S_hi - m_hi)`` from ``e_hi = exp(S_hi - m_lo)``: the product with ``exp(m_lo - m_hi)``
    (two float64 exps and a product, 5 units of 2**-53), computed on its own in rows of :data:`_WIDE_MAX`."""
    relative = e_hi * torch.exp(m_lo - m_hi)
    if m_hi.dtype == m_lo.dtype:
        wide = torch.from_numpy(np.asarray((m_hi.numpy() - m_lo.numpy()) > _WIDE_MAX))   # numpy's difference is torch's
    else:
        wide = (m_hi - m_lo) > _WIDE_MAX
    if bool(wide.any()):
        relative = torch.where(wide, torch.exp(s_hi.double() - m_hi), relative)
    return relative
