"""FP32 matmul of E4M3 operands, computed exactly and rounded once (SPEC §2.3 MM1 / MM2, §6).

SPEC §2.3 asks for FP32 accumulation of exact E4M3 products. The order of a float32 sum changes its
last bits, and a kernel's order is its own; the golden takes the one result every order approximates:
the exact sum, rounded once to float32.

Why float64 is exact here: an E4M3 value is m * 2^e with a 4-bit significand, e >= -9, and
|value| <= 448 < 2^9 (240 for the calculator's codec). A product has an 8-bit significand and lies
on a grid of 2^-18 below 2^18; a sum of n <= 2^10 such products lies on the same grid below 2^28.
That is 46 bits, inside float64's 53, so every partial sum is exact in any order and the single
float32 rounding at the end is the only one. The loop and vectorized goldens therefore agree bit
for bit on MM1 and MM2 whatever their shapes. A sum that is exactly zero is +0, as in an accumulator that
starts at +0: a library's float64 matmul may return -0 for a single term of -0 on one shape and +0 on
another, so every route adds +0 (which turns -0 into +0 and changes nothing else). (For the BF16 / FP16 inputs of AT-12 the float64
sum is not always exact; it is still at least as accurate as any float32 order.)
"""
from __future__ import annotations

import torch

__all__ = ["exact_matmul"]


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 ``a @ b`` of float32 operands holding E4M3 values, summed in float64 (exact); a zero sum is +0."""
    return (torch.matmul(a.double(), b.double()) + 0.0).float()
