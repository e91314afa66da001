"""The E4M3 arithmetic the codecs of golden/codec.py are built from (SPEC §3): the bit fields of
E4M3FN, its 256 values, rounding a magnitude to the E4M3 grid and the code of a value on it (the
rule, float arithmetic on the magnitude), and the index of the encode lookup tables (the top 16
bits of a float32 and whether its low 16 bits are nonzero; golden/codec.py's module docstring says
why that index is enough).
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["MANTISSA_BITS", "NAN_CODE", "SIGN_BIT", "e4m3fn_decode_table", "round_to_e4m3_grid", "e4m3_code_of",
           "table_index", "table_patterns"]

_EXPONENT_BIAS = 7
MANTISSA_BITS = 3
_MIN_NORMAL_EXPONENT = 1 - _EXPONENT_BIAS  # 2^-6
NAN_CODE = 0x7F
SIGN_BIT = 0x80


def e4m3fn_decode_table() -> torch.Tensor:
    """float32[256]: the E4M3FN value of every code, built from the bit fields."""
    codes = torch.arange(256, dtype=torch.int64)
    sign = torch.where(codes & SIGN_BIT != 0, -1.0, 1.0).double()
    exponent_field = (codes >> MANTISSA_BITS) & 0xF
    mantissa = (codes & 0x7).double()
    subnormal = mantissa * 2.0 ** (_MIN_NORMAL_EXPONENT - MANTISSA_BITS)
    normal = (1.0 + mantissa / 8.0) * torch.pow(2.0, (exponent_field - _EXPONENT_BIAS).double())
    value = sign * torch.where(exponent_field == 0, subnormal, normal)
    nan = (codes & 0x7F) == NAN_CODE
    value[nan] = torch.copysign(torch.tensor(math.nan, dtype=torch.float64), sign[nan])
    return value.float()


# The exponent field of each float dtype: masking everything else off leaves the power of two of x's binade.
_EXPONENT_MASK = {torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000)}
# Above 2^10 the grid is only kept as far as every codec needs: values stay above their saturation point.
_MAX_QUANTUM = 2.0 ** (10 - 1 - MANTISSA_BITS)


def round_to_e4m3_grid(magnitude: torch.Tensor) -> torch.Tensor:
    """Round |x| (float32 or float64, >= 0) to the E4M3 grid, nearest-even, exact up to 2^10.

    The grid spacing in the binade [2^e, 2^(e+1)) is 2^(e-3); below 2^-6 (subnormals) it stays
    2^-9. The binade's 2^e is x's float bits with the significand cleared. Dividing by a power of two
    and rounding to an integer are both exact in either dtype, so the only rounding is the one
    ``torch.round`` (half to even) performs. Above 2^10 the spacing stays 2^6, so large values (and
    inf) stay large: every codec saturates them.
    """
    int_dtype, mask = _EXPONENT_MASK[magnitude.dtype]
    binade = (magnitude.view(int_dtype) & mask).view(magnitude.dtype)
    quantum = torch.clamp(binade * 2.0 ** -MANTISSA_BITS, min=2.0 ** (_MIN_NORMAL_EXPONENT - MANTISSA_BITS), max=_MAX_QUANTUM)
    return torch.round(magnitude / quantum) * quantum


def e4m3_code_of(value: torch.Tensor) -> torch.Tensor:
    """int64 code (0..0x7E) of a float64 magnitude that lies exactly on the E4M3FN grid."""
    mantissa, exponent = torch.frexp(value)
    exponent_field = exponent.to(torch.int64) - 1 + _EXPONENT_BIAS
    normal_code = exponent_field * 8 + ((mantissa * 2.0 - 1.0) * 8.0).to(torch.int64)
    subnormal_code = (value * 2.0 ** (MANTISSA_BITS - _MIN_NORMAL_EXPONENT)).to(torch.int64)
    # frexp(0) has exponent 0, which would land in the normal branch: zero is subnormal code 0.
    return torch.where((exponent_field >= 1) & (value > 0), normal_code, subnormal_code)


def table_index(bits: np.ndarray) -> np.ndarray:
    """uint32 table index of float32 bit patterns: ``(bits >> 16) * 2 + (low 16 bits != 0)``."""
    index = bits >> np.uint32(15)
    index &= np.uint32(0x1FFFE)
    index |= (bits & np.uint32(0xFFFF)) != 0
    return index


def table_patterns() -> torch.Tensor:
    """float32 [131072]: the pattern that stands for each table index (``top << 16`` and ``top << 16 | 1``)."""
    index = torch.arange(1 << 17, dtype=torch.int64)
    return ((index >> 1) << 16 | (index & 1)).to(torch.int32).view(torch.float32)
