"""Rounding facts for the acceptance envelope (SPEC §4.2): float32 outward rounding and ulps.

Notation: ``u = 2**-24`` is float32's unit roundoff; ``ulp(x)`` is the spacing of float32 numbers in
the binade of ``|x|`` (``2**(floor(log2|x|) - 23)``, at least ``2**-149``). Every bound here is computed
in float64 from float32 data and then rounded *outward* to float32 (:func:`down32`, :func:`up32`), so
the float64 arithmetic can only widen what it bounds.

The bounds on a float32 sum taken in any order (SPEC §4.1 F1) are golden/sum_bounds.py's; they read
:func:`ulp32_array`, :func:`lowbit_array` and :func:`float64_array`, this module's numpy cores.
"""
from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import torch

__all__ = ["U32", "TINY32", "U64", "down32", "up32", "down32_add", "up32_add", "outward_sums", "step32", "ulp32", "lowbit", "float64_slack", "float64_sum_slack",
           "ulp32_array", "lowbit_array", "float64_array",
           "within_ulps", "within_ulps_arrays", "widen"]

U32 = 2.0 ** -24          # float32 unit roundoff (round to nearest)
TINY32 = 2.0 ** -149      # the smallest float32 subnormal: the absolute error of a rounding near 0 is <= TINY32 / 2
U64 = 2.0 ** -53          # float64 unit roundoff: one float64 rounding of a normal result errs by at most U64 relative


_Count = TypeVar("_Count", float, np.ndarray, torch.Tensor)


def float64_slack(roundings: _Count) -> _Count:
    """A relative bound on the error of a float64 value that went through ``roundings`` float64 roundings
    of normal results (products, quotients, sums of same-signed terms; an ``exp`` within 1 ulp counts 2):
    ``(1 + U64)**k - 1 <= gamma_k = k U64 / (1 - k U64)`` (Higham, Accuracy and Stability, Lemma 3.1),
    and ``k U64 (1 + 2 k U64)`` is above gamma_k for ``k U64 < 1/4``. Every float64 slack of the envelope
    reads it with the count of its roundings, stated where it is used."""
    k = roundings
    return k * U64 * (1 + 2 * k * U64)


def float64_sum_slack(terms: _Count) -> _Count:
    """A bound, relative to the sum of the terms' magnitudes, on the error of a float64 sum (or dot
    product) of ``terms`` terms in any order, each product rounded once: gamma_(terms) (Higham §3.1),
    plus 3 roundings for what the fold does around it (the final addition of its two signed parts and
    the magnitude's own rounding)."""
    return float64_slack(terms + 3)


_MINUS_ZERO_BITS = np.int32(-2 ** 31)
#: Up to this many elements a float32 step is numpy's nextafter, beyond it integer arithmetic on the patterns.
_NEXTAFTER_MOST = 1 << 10


def step32(f: np.ndarray, move: np.ndarray, direction: int | np.ndarray) -> np.ndarray:
    """float32 (numpy): ``f`` moved one float32 step down (``direction`` -1) or up (+1) where ``move``, on the bit
    patterns (vectorized integer arithmetic: torch's ``where`` and numpy's ``nextafter`` cost several times
    as much per element): a pattern's magnitude grows by one toward the side away from 0, so stepping away
    from 0 adds 1 to it, toward 0 subtracts 1; a zero moving either way becomes the smallest subnormal of
    that sign (taken as -0 going down, +0 going up). ``direction`` may be an int32 array of -1 and +1
    that broadcasts against ``f`` (each element its own)."""
    return _step_patterns(np.array(f, dtype=np.float32, order="C", copy=True), move, direction)   # keeps a 0-d shape


def _step32_in_place(f: np.ndarray, move: np.ndarray, direction: int | np.ndarray) -> np.ndarray:
    """:func:`step32` on a C-contiguous float32 array of the caller's own (a fresh result), overwriting it.
    ``move`` never holds at a NaN nor at an infinity moving outward (the callers' comparisons are false there)."""
    f = np.asarray(f)                   # a numpy scalar (the arithmetic of 0-d arrays gives them) as a 0-d array
    if f.size <= _NEXTAFTER_MOST:
        # Small arrays: one masked nextafter (the calls' fixed cost dominates; per element it costs more). It
        # steps as the patterns do: a zero to the smallest subnormal of the direction's sign, -2**-149 up to
        # -0, and the largest finite value or an infinity inward; NaN and outward infinities never move here.
        target = np.float32(np.inf) * (direction.astype(np.float32) if isinstance(direction, np.ndarray) else np.float32(direction))
        stepped: np.ndarray = np.nextafter(f, target, out=f, where=move)
        return stepped
    return _step_patterns(f, move, direction)


def _step_patterns(f: np.ndarray, move: np.ndarray, direction: int | np.ndarray) -> np.ndarray:
    """:func:`step32` on the patterns of ``f`` (C-contiguous float32, overwritten)."""
    bits = f.view(np.int32)
    zero = ((bits & np.int32(0x7FFFFFFF)) == 0) & move
    if zero.any():
        if isinstance(direction, np.ndarray):
            bits = np.where(zero, np.where(direction < 0, _MINUS_ZERO_BITS, np.int32(0)), bits)
        else:
            bits = np.where(zero, _MINUS_ZERO_BITS if direction < 0 else np.int32(0), bits)
    sign = (bits >> np.int32(31)) | np.int32(1)                       # -1 for negative patterns, +1 otherwise
    bits -= move.astype(np.int32) * sign * (-direction if isinstance(direction, np.ndarray) else np.int32(-direction))
    return bits.view(np.float32)


def float64_array(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """float64 numpy ``x`` (a view where it is one already; a numpy array as it is, widened if need be)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64, copy=False)
    if x.dtype != torch.float64 or x.requires_grad:
        x = x.detach().double()
    return np.asarray(x.numpy())


def down32(x: torch.Tensor) -> torch.Tensor:
    """float32: the largest float32 <= x (x float64; -inf stays -inf, NaN stays NaN)."""
    return torch.from_numpy(_np_down32(float64_array(x)))


def up32(x: torch.Tensor) -> torch.Tensor:
    """float32: the smallest float32 >= x (x float64)."""
    return torch.from_numpy(_np_up32(float64_array(x)))


def _rounded_sum(a: torch.Tensor, b: torch.Tensor, direction: int) -> torch.Tensor:
    """float32 RD (-1) or RU (+1) of the exact ``a + b``: the float64 sum ``s``, its exact error (Knuth's
    TwoSum), and one step past the float32 nearest ``s`` where that one lies on the wrong side of the
    exact sum (beyond ``s``, or at ``s`` with the error pointing away)."""
    a64, b64 = np.broadcast_arrays(float64_array(a), float64_array(b))
    return torch.from_numpy(_directed_sum(a64, b64, direction))


def outward_sums(a_lo: torch.Tensor | np.ndarray, b_lo: torch.Tensor | np.ndarray, a_hi: torch.Tensor | np.ndarray,
                 b_hi: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(down32_add(a_lo, b_lo), up32_add(a_hi, b_hi))`` (float64 operands of one shape after
    broadcasting, tensors or numpy arrays), in one pass over both: elementwise, so the bits of the two calls."""
    a_lo, b_lo, a_hi, b_hi = (float64_array(x) for x in (a_lo, b_lo, a_hi, b_hi))
    shape = _common_shape(a_lo, b_lo, a_hi, b_hi)
    if math.prod(shape) > _PAIRED_MOST:
        down_a, down_b = np.broadcast_arrays(a_lo, b_lo)
        up_a, up_b = np.broadcast_arrays(a_hi, b_hi)
        return torch.from_numpy(_directed_sum(down_a, down_b, -1)), torch.from_numpy(_directed_sum(up_a, up_b, 1))
    both = _outward_pair(_pair(a_lo, a_hi, shape), _pair(b_lo, b_hi, shape))
    return torch.from_numpy(both[0, ...]), torch.from_numpy(both[1, ...])


#: Up to this many elements per end, the two ends of an outward rounding go through one pass (the calls'
#: fixed cost dominates); above it, two (the copies into the pair would cost more than the calls).
_PAIRED_MOST = 1 << 12


def _common_shape(*arrays: np.ndarray) -> tuple[int, ...]:
    shape = arrays[0].shape
    if any(x.shape != shape for x in arrays[1:]):
        shape = np.broadcast_shapes(*(x.shape for x in arrays))
    return shape


def _pair(first: np.ndarray, second: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """float64 [2, *shape]: the two arrays side by side, each broadcast to ``shape`` (np.stack and
    np.broadcast_arrays cost several times as much on the small arrays of a few rows)."""
    both = np.empty((2,) + shape)
    both[0], both[1] = first, second
    return both


def _directed_sum(a: np.ndarray, b: np.ndarray, direction: int | np.ndarray) -> np.ndarray:
    """:func:`_rounded_sum` on broadcast float64 arrays; ``direction`` as :func:`step32` takes it."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = a + b
        f = s.astype(np.float32)
        wide = f.astype(np.float64)
        move = np.where(direction < 0, wide > s, wide < s) if isinstance(direction, np.ndarray) else \
            ((wide > s) if direction < 0 else (wide < s))
        # Only where the float64 sum is a float32 value does the exact error's sign decide, and only where
        # b is not 0 can there be one (a raw score under the exactness certificate has e1 = 0).
        decide = (wide == s) & (b != 0)
        count = int(np.count_nonzero(decide))
        if count > decide.size // 8 or (count and isinstance(direction, np.ndarray)):   # the error everywhere
            back = s - a
            error = (a - (s - back)) + (b - back)
            away = np.where(direction < 0, error < 0, error > 0) if isinstance(direction, np.ndarray) else \
                ((error < 0) if direction < 0 else (error > 0))
            move |= decide & away
        elif count:                                # few: only there
            on = np.nonzero(decide)
            a_on, b_on, s_on = a[on], b[on], s[on]
            back = s_on - a_on
            error = (a_on - (s_on - back)) + (b_on - back)
            move[on] = (error < 0) if direction < 0 else (error > 0)
        return _step32_in_place(f, move, direction)


def _outward_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 [2, ...]: :func:`_directed_sum` of ``a``, ``b`` [2, ...] rounded down at index 0 and up at 1,
    each comparison taken on its half (the same operations on the same elements as with a direction array)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = a + b
        f = s.astype(np.float32)
        wide = f.astype(np.float64)
        move = np.empty(s.shape, dtype=bool)
        np.greater(wide[0, ...], s[0, ...], out=move[0, ...])
        np.less(wide[1, ...], s[1, ...], out=move[1, ...])
        decide = (wide == s) & (b != 0)
        if decide.any():                           # the error everywhere, as _directed_sum with directions
            back = s - a
            error = (a - (s - back)) + (b - back)
            away = np.empty(s.shape, dtype=bool)
            np.less(error[0, ...], 0, out=away[0, ...])
            np.greater(error[1, ...], 0, out=away[1, ...])
            move |= decide & away
        return _step32_in_place(f, move, _OUTWARD.reshape((2,) + (1,) * (s.ndim - 1)))


#: The directions of :func:`_outward_pair`'s two halves.
_OUTWARD = np.array([-1, 1], dtype=np.int32)


def down32_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32: the largest float32 <= the exact ``a + b`` (float64 a, b): :func:`down32` of the float64 sum,
    one step lower where that sum is a float32 value the exact one lies below. (Where ``fl64(a + b)`` is not
    a float32 value, the exact sum lies within half a float64 ulp of it, closer than any float32.) Exact
    where the sum is: a raw score's bound ``raw - e1`` often is a float32 value (both on coarse grids), and
    a bound that stepped past it anyway would be one float32 step looser there."""
    return _rounded_sum(a, b, -1)


def up32_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32: the smallest float32 >= the exact ``a + b`` (see :func:`down32_add`)."""
    return _rounded_sum(a, b, 1)


_EXPONENT_BITS = 0x7FF0000000000000


def ulp32(x: torch.Tensor) -> torch.Tensor:
    """float64: the float32 spacing in the binade of |x| (``2**(floor(log2|x|) - 23)``, >= 2**-149).

    Non-decreasing in |x|, so the ulp of a bound on a magnitude bounds the ulp of the magnitude. Read
    from the float64 exponent bits: masking off the sign and the mantissa leaves ``2**floor(log2|x|)``
    (0 for a float64 subnormal, far below 2**-149, where the floor applies; infinite and NaN values give
    the cap 2**1000)."""
    # numpy: three operations on arrays that are often a few rows, where torch's per-call cost dominates.
    return torch.from_numpy(ulp32_array(float64_array(x)))


def ulp32_array(values: np.ndarray) -> np.ndarray:
    """:func:`ulp32` of a float64 numpy array (a new array)."""
    binade = (np.ascontiguousarray(values).reshape(-1).view(np.int64) & _EXPONENT_BITS).view(np.float64)   # 1-d: in place
    np.multiply(binade, 2.0 ** -23, out=binade)
    np.maximum(binade, 2.0 ** -149, out=binade)                # never NaN (no mantissa): max then min is the clamp
    return np.minimum(binade, 2.0 ** 1000, out=binade).reshape(values.shape)


def _lowest_within(t_lo: np.ndarray, t_hi: np.ndarray, ulps: float) -> np.ndarray:
    """float64: the least ``t - ulps ulp(t)`` over the reals ``t`` in ``[t_lo, t_hi]`` (see within_ulps).
    numpy: a few operations on arrays that are often small, where torch's per-call cost would dominate."""
    binade = (t_lo.view(np.int64) & _EXPONENT_BITS).view(np.float64)           # 2**floor(log2 |t_lo|)
    with np.errstate(invalid="ignore"):                                         # inf - inf: NaN stays NaN
        low = t_lo - ulps * np.maximum(binade * 2.0 ** -23, TINY32)
        # For t > 0 the function drops at each power of two (the ulp doubles there): the first power above
        # t_lo is the one place it can fall below its value at t_lo (later powers give more).
        power = 2 * binade
        at_power = power - ulps * np.maximum(power * 2.0 ** -23, TINY32)
        return np.minimum(low, at_power, out=low, where=(t_lo > 0) & (power <= t_hi))


def _np_up32(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):                # also the step from the largest finite to inf
        f = x.astype(np.float32)
        return _step32_in_place(f, f < x, 1)


def _np_down32(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        f = x.astype(np.float32)
        return _step32_in_place(f, f > x, -1)


def within_ulps(t_lo: torch.Tensor, t_hi: torch.Tensor, ulps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(lo, hi)``: the least and the greatest float32 ``y`` with ``|y - t| <= ulps * ulp(t)`` for
    some real ``t`` in ``[t_lo, t_hi]`` (float64 bounds on an exact result): what an operation "within
    ``ulps`` ulp" (SPEC §4.1 F3) may return, with SPEC's ulp (:func:`ulp32`: of the exact result, at least
    2**-149).

    Not ``t (1 -+ ulps 2**-23)``: just above a power of two the ulp is the upper binade's, so the results
    reach below the power by ``ulps`` steps of the upper binade, twice as many steps of the lower one; the
    least ``t - ulps ulp(t)`` is at ``t_lo`` or at the first power of two above it, when ``t_hi`` reaches it.
    (``t - n ulp(t)`` is exact in float64: it keeps t's binade or the one below, and t's last bit.) The
    greatest is the mirror image, at ``t_hi`` (``t + n ulp(t)`` only grows with t). An ``ulps`` that is not
    a multiple of a power of two rounds ``ulps * ulp`` once: 2**-52 relative, far below a float32 step."""
    lo, hi = within_ulps_arrays(float64_array(t_lo), float64_array(t_hi), ulps)
    return torch.from_numpy(np.asarray(lo)), torch.from_numpy(np.asarray(hi))


def within_ulps_arrays(lo64: np.ndarray, hi64: np.ndarray, ulps: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`within_ulps` on float64 numpy arrays, float32 numpy results (for callers already in numpy)."""
    if ulps != 0:
        # Both ends in one pass (the upper one mirrored): elementwise, so the bits of two passes.
        shape = _common_shape(lo64, hi64)
        if math.prod(shape) > _PAIRED_MOST:
            lo64, hi64 = _lowest_within(lo64, hi64, ulps), -_lowest_within(-hi64, -lo64, ulps)
        else:
            ends = _lowest_within(_pair(lo64, -hi64, shape), _pair(hi64, -lo64, shape), ulps)
            # The upper end is the mirror image: ``down32(-e) = -up32(e)``, bit for bit (a negation flips
            # the sign bit alone, zeros and NaN included), so both ends are rounded up in one pass.
            both = _np_up32(ends)
            return both[0, ...], np.negative(both[1, ...], out=both[1, ...])
    return _np_up32(lo64), _np_down32(hi64)


def lowbit(x: torch.Tensor) -> torch.Tensor:
    """float64: the largest power of two dividing the float32 value ``x`` (inf where x == 0, so a zero
    term never lowers a grid), read from the float32 bits: clearing the lowest set bit of a pattern
    whose significand has one below its leading bit takes exactly that bit's value off (the two share
    their binade, so the difference is exact); a power of two is its own lowbit. An inf or NaN pattern
    reads as if its exponent field were a number (2**128 for inf), as the bits say: such a term makes
    the sum non-finite whatever its grid."""
    x = x.detach()
    # float64 and float32 to float32 in numpy (the same rounding as torch's), one copy: lowbit_of's own.
    values = np.asarray(x.numpy() if x.dtype in (torch.float64, torch.float32) else x.float().numpy())
    with np.errstate(over="ignore", invalid="ignore"):             # silent, as torch's: inf, NaN
        values = values.astype(np.float32, order="C")
    return torch.from_numpy(lowbit_array(values))


def lowbit_array(values: np.ndarray) -> np.ndarray:
    """:func:`lowbit` of a C-contiguous float32 numpy array that it may overwrite (float64, same shape)."""
    # numpy, in place: the same integer and exact float32 operations at a fraction of torch's per-call cost,
    # and fewer passes over large arrays.
    bits = values.reshape(-1).view(np.int32)                                             # 1-d: in-place ops
    np.bitwise_and(bits, np.int32(0x7FFFFFFF), out=bits)                                   # |x|
    top = bits >= 0x7F800000                                   # inf and NaN: taken one binade down, then doubled
    special = bool(top.any())
    if special:
        np.subtract(bits, np.int32(0x800000), out=bits, where=top)
    magnitude = bits.view(np.float32)
    cleared = bits & -bits
    np.subtract(bits, cleared, out=cleared)
    power = magnitude - cleared.view(np.float32)
    np.copyto(power, magnitude, where=(bits & np.int32(0x7FFFFF)) == 0)
    power = power.astype(np.float64)
    if special:
        np.multiply(power, 2, out=power, where=top)
    np.copyto(power, np.inf, where=magnitude == 0)
    return power.reshape(values.shape)


def widen(lo: torch.Tensor, hi: torch.Tensor, relative: float | torch.Tensor, absolute: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``[lo - relative |lo| - absolute, hi + relative |hi| + absolute]``: room for roundings
    of relative size ``relative`` (and ``absolute`` near 0)."""
    return lo - relative * lo.abs() - absolute, hi + relative * hi.abs() + absolute
