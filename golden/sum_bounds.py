"""Sound bounds on the error of a float32 sum taken in any order (SPEC §4.1 F1), for the acceptance
envelope (SPEC §4.2) and the laws' bounds. Notation as golden/intervals.py: ``u = 2**-24``, ``ulp(x)``.

Any-order sums (F1). A float32 sum of ``n`` exact terms ``y_i`` in any order or tree is ``n - 1``
additions, each rounded to nearest; a fused multiply-add of an exact product is one of them. Every
partial sum is a subset sum, so its magnitude is at most ``M = max(sum of positive terms, sum of
|negative terms|)``, and the computed ones at most ``M' = M (1 + n 2**-23)`` (the errors so far
included). Each addition errs by at most half an ulp of its result, so

    |computed - exact| <= (n - 1) / 2 * ulp(M')                                  (the plain bound)

and the error is 0 when every partial sum is representable: all terms are multiples of a power of two
``g`` and ``M <= 2**24 g`` (the exactness certificate).

A sharper bound (:func:`residue_bound`) counts where the rounding error can come from. Write ``res_U(z)``
for the distance from ``z`` to the nearest multiple of ``U``. An addition whose result lies in a binade
of spacing ``U`` rounds to a multiple of ``U`` and errs by exactly ``res_U(a + b) <= res_U(a) +
res_U(b)``; a result of spacing ``U`` or coarser is itself a multiple of ``U``. By induction over the
tree, the errors of all additions at spacing ``U`` add up to at most ``R_U + E_<U``, where ``R_U =
sum_i res_U(y_i)`` and ``E_<U`` is the total error of the additions at finer spacings; and each of the
at most ``n - 1`` additions at spacing ``U`` errs by at most ``U / 2``. Going up the spacings from
``U_max = ulp(M')`` down to ``U_max 2**-levels`` (below which ``(n - 1) U / 2`` is used) gives

    E_U <= min((n - 1) U / 2, R_U + sum_{U' < U} E_U'),        |computed - exact| <= sum_U E_U.

An addition whose spacing is no coarser than ``g``, the largest power of two dividing every term, is
exact (every computed value stays a multiple of ``g``), so the walk starts at ``g`` with nothing. Terms
on a coarse grid (E4M3 products of large codes) have ``R_U = 0`` and cost nothing: on outlier channels
the bound is a fraction of the plain one (tests/golden/test_intervals.py has both on inputs built to
reach them).

Compensated (Kahan) summation is not a tree, but its error is at most ``(2u + O(n u**2)) sum |y_i|``
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.3); :func:`sum_error_bound` takes
the larger of the two, and never less than half an ulp of the exact sum (the golden rounds once).
"""
from __future__ import annotations

import numpy as np
import torch

from .intervals import U32, float64_array, lowbit_array, ulp32_array

__all__ = ["sum_error_bound", "residue_bound"]


def sum_error_bound(terms: int | torch.Tensor, magnitude: torch.Tensor, abs_sum: torch.Tensor,
                    exact: torch.Tensor | None = None, *, rounding: str = "nearest") -> torch.Tensor:
    """float64: a bound on |computed - exact| of a float32 sum of ``terms`` exact terms in any order or
    tree, or compensated (see the module docstring).

    ``magnitude`` bounds every exact partial sum (``max(positive sum, |negative sum|)``); ``abs_sum``
    is ``sum |y_i|``; ``exact`` (optional) the exact sum, so that the bound covers its single rounding.
    ``rounding="toward-zero"`` doubles the per-addition error (a truncating adder: wider than SPEC §4.1).
    """
    # A count given as a number stays one: the factors are the same float64 values, without the tensor
    # operations that would compute them.
    n = float(terms) if isinstance(terms, int) else torch.as_tensor(terms, dtype=torch.float64)
    # (terms=0, the floors alone: a factor of 1, whose product is the magnitude itself as far as its ulp reads)
    grown = magnitude if isinstance(n, float) and n == 0 else magnitude * (1 + n * 2.0 ** -23)
    # The ulps and their products in numpy (never NaN: IEEE products in either library); the maxima, which
    # may meet a NaN, in torch.
    per_addition = ulp32_array(float64_array(grown))
    per_addition *= 0.5 if rounding == "nearest" else 1.0
    if isinstance(n, float):
        per_addition *= max(n - 1, 0.0)
        bound = torch.from_numpy(per_addition)
    else:
        bound = torch.clamp(n - 1, min=0) * torch.from_numpy(per_addition)
    if rounding == "nearest":
        kahan = abs_sum * (2 * U32 + 16 * n * U32 * U32)
        bound = torch.maximum(bound, kahan)
    if exact is not None:
        half = ulp32_array(float64_array(exact))
        half *= 0.5
        bound = torch.maximum(bound, torch.from_numpy(half))
    return bound


_RESIDUE_BLOCK = 1 << 16      # values per block of residue_bound's scratch (512 KiB)


def residue_bound(products: torch.Tensor, magnitude: torch.Tensor, *, levels: int = 24) -> torch.Tensor:
    """float64 [...]: the sharper any-order bound of the module docstring for the sums of ``products``
    [..., n] (exact float64 terms, float32 values) whose partial sums are bounded by ``magnitude`` [...].

    Round to nearest only. An addition at a spacing no coarser than ``g``, the largest power of two
    dividing every term, is exact (its operands are multiples of ``g``, so of the spacing), so the
    spacings from ``g`` up to ``U_max`` are the ones that count; ``levels`` of them are walked (below,
    the plain ``(n - 1) U / 2`` is used). Costs ``levels`` passes over the terms: use it where the plain
    bound is too wide.
    """
    n = products.shape[-1]
    if n <= 1:
        return torch.zeros(products.shape[:-1], dtype=torch.float64)
    # numpy throughout (torch only for the log2, whose bits are torch's): the calls are small and many.
    terms = products.reshape(-1, n).numpy()
    with np.errstate(over="ignore", invalid="ignore"):             # silent, as torch's: inf, NaN
        grid = lowbit_array(terms.astype(np.float32)).min(axis=-1)        # inf for an all-zero row: exact
    top = np.broadcast_to(ulp32_array(float64_array(magnitude * (1 + n * 2.0 ** -23))), products.shape[:-1]).reshape(-1)   # U_max
    # Only the spacings above the grid can err: each sum walks as many as its own gap needs (at most
    # ``levels``), so its bound depends on its own terms alone, not on which other sums share the call.
    gaps = torch.log2(torch.from_numpy(top / np.minimum(grid, 1e300))).numpy()
    own = np.minimum(np.floor(np.maximum(gaps, 0.0)) + 1, levels).astype(np.int64)
    levels = int(own.max()) if own.size else 0
    # The spacings walked, finest first: [levels, F]. Row f is walked from spacing index ``levels - own[f]``
    # on; at the spacings no coarser than its grid (the first ones: the spacings grow) the walk only resets
    # it to 0 (every addition there is exact), so its residues are read from ``walk_from[f]``, the later of
    # the two, on. The rows are taken in the order of walk_from: those read at each spacing are then a
    # prefix, and the residues are computed for them alone (about half of the [levels, F, n] product on the
    # rule's calls). The bounds are put back in the callers' order at the end.
    spacings = top[None, :] * np.exp2(np.arange(-levels + 1, 1, dtype=np.float64))[:, None]
    walk_from = np.maximum(levels - own, np.count_nonzero(spacings <= grid, axis=0))
    order = np.argsort(walk_from, kind="stable")
    walk_from, terms, spacings = walk_from[order], terms[order], spacings[:, order]
    grid, top, own = grid[order], top[order], own[order]
    reading = np.searchsorted(walk_from, np.arange(levels), side="right")      # rows read at each spacing
    # Each row's residues at the spacings it reads, in blocks of (spacings, rows) whose [.., .., n] scratch
    # stays in cache (2**16 values: a block the size of the whole [levels, F, n] product ran 2.4x slower at
    # F = 1152), each operation in place. (``* at`` is exact: ``at`` is a power of two, at least 2**-149
    # 2**(1 - levels) and at most 2**1000, so its reciprocal is exact too and ``terms * (1 / at)`` is
    # ``terms / at``, the same real number rounded the same way, at a multiplication's cost.)
    residues = np.zeros_like(spacings)
    rows = max(1, min(terms.shape[0], _RESIDUE_BLOCK // n))
    scratch = np.empty(_RESIDUE_BLOCK + rows * n)
    for row in range(0, terms.shape[0], rows):
        block = terms[row:row + rows]
        if not block.shape[0] or walk_from[row] >= levels:        # this row and the ones after it read none
            break
        per_block = max(1, min(levels, _RESIDUE_BLOCK // (block.shape[0] * n)))
        for first in range(int(walk_from[row]), levels, per_block):
            last = min(levels, first + per_block)
            count = min(int(reading[last - 1]) - row, block.shape[0])    # the rows read at the block's coarsest
            at = spacings[first:last, row:row + count, None]
            # Contiguous: numpy sums each row pairwise then, whatever the block. (Into a strided ``out`` it
            # may add along the rows instead, and a sum's bits would depend on F.)
            part = scratch[:at.size * n].reshape(at.shape[0], count, n)
            np.multiply(block[:count], 1 / at, out=part)
            np.rint(part, out=part)
            np.multiply(part, at, out=part)
            np.subtract(block[:count], part, out=part)
            np.abs(part, out=part)
            residues[first:last, row:row + count] = part.sum(axis=-1)
    finest = top * np.exp2(-own.astype(np.float64))
    total = np.where(finest <= grid, 0.0, (n - 1) * finest / 2)                  # every finer addition
    # A row walked through a spacing no coarser than its grid is 0 when it leaves it: it enters its first
    # read spacing with 0 then, and the walk over the spacings it reads is the recurrence alone.
    total[walk_from > levels - own] = 0.0
    caps = (n - 1) * spacings / 2
    for cap, residue, count in zip(caps, residues, reading, strict=True):    # one of each per spacing
        walked = residue[:count] + total[:count]
        np.minimum(cap[:count], walked, out=walked)
        np.add(total[:count], walked, out=walked)
        np.minimum(cap[:count], walked, out=walked)
        total[:count] = walked
    bound = np.empty_like(total)
    bound[order] = total
    return torch.from_numpy(bound.reshape(products.shape[:-1]))
