"""The E4M3 encoders evaluated element by element on golden/e4m3.py's grid arithmetic, the way
golden/codec.py computed them before the lookup tables (5a86cd3): a test oracle for
tests/golden/test_codec_tables.py, for the tables and their index (not for the grid arithmetic, which
it shares; see the comment below).

Float arithmetic on the magnitude: the binade's power of two from the float bits, the grid quantum
clamped to the subnormal spacing, ``torch.round`` (half to even), then the code from ``frexp``. It
was itself held by the exhaustive and midpoint tests of tests/golden/test_codec.py (ml_dtypes,
torch's cast and a bit-field formula as oracles). Slow (about 20 M elements/s), and independent of
the tables: it never looks at bit patterns beyond the exponent field.
"""
from __future__ import annotations

import torch

from pfa_verify.golden.e4m3 import e4m3_code_of, round_to_e4m3_grid

__all__ = ["encode", "round_value"]

# The grid arithmetic is the golden's own (golden/e4m3.py): this oracle checks the lookup tables and
# their index against that arithmetic evaluated element by element, not the arithmetic itself (the
# exhaustive and midpoint tests of tests/golden/test_codec.py hold it against ml_dtypes and torch).
_NAN_CODE = 0x7F
_SIGN_BIT = 0x80
_SLICE = 1 << 20


def _spec_magnitude(magnitude: torch.Tensor) -> torch.Tensor:
    return e4m3_code_of(torch.clamp(round_to_e4m3_grid(magnitude), max=448.0))


def _calculator_magnitude(magnitude: torch.Tensor) -> torch.Tensor:
    integer = torch.round(magnitude)
    saturated = integer >= 240.0
    rounded = round_to_e4m3_grid(torch.where(saturated, 0.0, integer))
    return torch.where(saturated, 0x7E, e4m3_code_of(rounded))


_RULES = {"e4m3fn-sat": (_spec_magnitude, _NAN_CODE), "pypto-0.2.0-calculator": (_calculator_magnitude, 0x7E)}


def encode(codec_name: str, x: torch.Tensor) -> torch.Tensor:
    """uint8 codes of ``x`` (any float dtype, converted to float32 first) under the named codec."""
    magnitude_rule, nan_code = _RULES[codec_name]
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8)
    for start in range(0, flat.numel(), _SLICE):
        source = flat[start:start + _SLICE]
        xf = source.float()
        sign = torch.signbit(source).to(torch.int64) * _SIGN_BIT
        magnitude = xf.abs().double()
        nan = torch.isnan(xf)
        codes = magnitude_rule(torch.where(nan, 0.0, magnitude))
        codes = torch.where(nan, nan_code, codes)
        out[start:start + _SLICE] = (codes | sign).to(torch.uint8)
    return out.reshape(x.shape)


def round_value(codec_name: str, x: torch.Tensor, decode_table: torch.Tensor) -> torch.Tensor:
    """float32 ``round``: the spec codec's magnitude shortcut (NaN passes through ``copysign``), the
    calculator's ``decode(encode(x))``, both on x converted to float32 first."""
    x = x.float()
    if codec_name == "e4m3fn-sat":
        return torch.copysign(torch.clamp(round_to_e4m3_grid(x.abs()), max=448.0), x)
    return decode_table[encode(codec_name, x).long()]
