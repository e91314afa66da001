"""golden/codec.py, SPEC §3: E4M3FN decode of all 256 codes, encode on a dense grid and on every
rounding midpoint, saturation, subnormals, the NaN and signed-zero policy, and the PyPTO
calculator's codec. Oracles: a bit-field formula written here, ml_dtypes, torch's own cast where it
is defined the same way."""
from __future__ import annotations

import math

import golden_helpers as gh
import ml_dtypes
import numpy as np
import pytest
import torch

from pfa_verify.golden import PYPTO_CALCULATOR_CODEC, SPEC_CODEC, Fp8Codec, get_codec
from pfa_verify.properties.rule import compare as cmp

ALL_CODES = torch.arange(256, dtype=torch.int64).to(torch.uint8)
CODECS = [SPEC_CODEC, PYPTO_CALCULATOR_CODEC]


def e4m3fn_value(code: int) -> float:
    """The OCP E4M3FN value of ``code``, from its bit fields (sign, 4-bit exponent bias 7, 3-bit mantissa)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.copysign(math.nan, sign)
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def ml_dtypes_encode(x: torch.Tensor) -> torch.Tensor:
    """uint8 codes of float32 ``x`` by ml_dtypes (round to nearest even; NaN on overflow past 464)."""
    return torch.from_numpy(x.numpy().astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def positive_values() -> torch.Tensor:
    """float64 [126]: the finite non-negative E4M3FN values in code order (0x00..0x7E)."""
    return torch.tensor([e4m3fn_value(c) for c in range(0x7F)], dtype=torch.float64)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_decode_every_code_matches_bit_fields(dtype):
    expected = torch.tensor([e4m3fn_value(c) for c in range(256)], dtype=dtype)
    decoded = SPEC_CODEC.decode(ALL_CODES, dtype)
    assert decoded.dtype == dtype
    gh.assert_identical(decoded, expected, "SPEC_CODEC.decode(all 256 codes)")
    assert torch.isnan(decoded).nonzero().flatten().tolist() == [0x7F, 0xFF]


def test_decode_every_code_matches_ml_dtypes():
    expected = torch.from_numpy(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    gh.assert_identical(SPEC_CODEC.decode(ALL_CODES), expected, "SPEC_CODEC.decode vs ml_dtypes")


def test_decode_every_code_matches_torch_bit_view():
    # torch's float8 -> float32 conversion has no rounding to do, so it is a fair oracle for decode.
    # Its NaN keeps another payload: values compare (NaN placement included), plus the sign bits.
    expected = ALL_CODES.view(torch.float8_e4m3fn).float()
    decoded = SPEC_CODEC.decode(ALL_CODES)
    cmp.assert_close(decoded, expected, kind="bound", rtol=0.0, atol=0.0, identifier="SPEC_CODEC.decode vs torch")
    assert torch.equal(torch.signbit(decoded), torch.signbit(expected))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_decode_equals_decode_table(codec, dtype):
    gh.assert_identical(codec.decode(ALL_CODES, dtype), codec.decode_table.to(dtype), f"{codec.name} decode")
    # float8 tensors are read by their bits, the same way.
    gh.assert_identical(codec.from_fp8(ALL_CODES.view(torch.float8_e4m3fn), dtype),
                        codec.decode_table.to(dtype), f"{codec.name} from_fp8")


def test_decode_table_is_a_copy():
    table = SPEC_CODEC.decode_table
    table.fill_(0)
    assert SPEC_CODEC.decode_table[0x7E] == 448.0


def test_decode_keeps_shape():
    codes = ALL_CODES.view(4, 8, 8)
    assert SPEC_CODEC.decode(codes).shape == (4, 8, 8)


# ---------------------------------------------------------------- encode


def test_encode_is_exact_on_every_value():
    codes = ALL_CODES[torch.isfinite(SPEC_CODEC.decode(ALL_CODES))]
    gh.assert_identical(SPEC_CODEC.encode(SPEC_CODEC.decode(codes)), codes, "encode(decode(code))")


def test_encode_rounding_midpoints():
    """Every midpoint between adjacent E4M3 magnitudes ties to the even code; one float32 ulp off
    the midpoint goes to the nearer side. The last midpoint, 464 between 448 and 480 (not a value),
    ties to 448 (0x7E): rounding comes first, the overflow check after (SPEC §3)."""
    values = torch.cat([positive_values(), torch.tensor([480.0], dtype=torch.float64)])
    low, high = values[:-1], values[1:]
    mid = ((low + high) / 2).float()  # 5 significant bits: exact in float32
    assert torch.equal(mid.double(), (low + high) / 2)
    code_low = torch.arange(0x7F)
    code_high = torch.clamp(code_low + 1, max=0x7E)  # above 448 there is only 448
    even = torch.where(code_low % 2 == 0, code_low, code_high)
    below = torch.nextafter(mid, torch.tensor(0.0))
    above = torch.nextafter(mid, torch.tensor(math.inf))
    for x, expected, what in ((mid, even, "midpoint"), (below, code_low, "just below"), (above, code_high, "just above")):
        for sign in (1.0, -1.0):
            codes = SPEC_CODEC.encode(sign * x).long()
            want = expected | (0x80 if sign < 0 else 0)
            gh.assert_identical(codes, want, f"encode({'+' if sign > 0 else '-'}{what})")
    # A few by hand, so the rule is visible in the test itself.
    by_hand = {1.0625: 0x38, 1.1875: 0x3A, 17.0: 0x58, 19.0: 0x5A, 240.0: 0x77, 464.0: 0x7E}
    for x, code in by_hand.items():
        assert int(SPEC_CODEC.encode(torch.tensor([x]))[0]) == code, f"encode({x})"


def dense_grid() -> torch.Tensor:
    """float32: every bfloat16 bit pattern that is finite, plus 20k float32 values spread over 2^-12..2^9."""
    patterns = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    generator = torch.Generator().manual_seed(0)
    spread = torch.exp2(torch.rand(20000, generator=generator, dtype=torch.float64) * 21 - 12).float()
    signs = torch.where(torch.rand(20000, generator=generator) < 0.5, -1.0, 1.0)
    grid = torch.cat([patterns, spread * signs])
    return grid[torch.isfinite(grid)]


def test_encode_dense_grid_matches_ml_dtypes():
    grid = dense_grid()
    grid = grid[grid.abs() <= 464]  # beyond 464 ml_dtypes gives NaN, the spec codec saturates
    gh.assert_identical(SPEC_CODEC.encode(grid), ml_dtypes_encode(grid), "encode vs ml_dtypes on |x| <= 464")


def test_encode_dense_grid_matches_torch_where_representable():
    # torch's cast changed its overflow policy in 2.12/2.13; below 448 every version rounds the same.
    grid = dense_grid()
    grid = grid[grid.abs() <= 448]
    gh.assert_identical(SPEC_CODEC.encode(grid), grid.to(torch.float8_e4m3fn).view(torch.uint8),
                        "encode vs torch's cast on |x| <= 448")


SATURATING = [448.0, 449.0, 463.99997, 464.0, 464.00003, 465.0, 480.0, 1000.0, 3.0e38, math.inf]


@pytest.mark.parametrize("x", SATURATING, ids=lambda x: f"encode({x})")
def test_encode_saturates(x):
    codes = SPEC_CODEC.encode(torch.tensor([x, -x], dtype=torch.float32))
    assert codes.tolist() == [0x7E, 0xFE]
    assert SPEC_CODEC.round(torch.tensor([x, -x])).tolist() == [448.0, -448.0]


def test_encode_saturates_from_every_input_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.tensor([math.inf, -math.inf, 1000.0, -1000.0], dtype=dtype)
        assert SPEC_CODEC.encode(x).tolist() == [0x7E, 0xFE, 0x7E, 0xFE], dtype


SUBNORMALS = [
    (2.0 ** -9, 0x01),            # the smallest subnormal
    (2.0 ** -10, 0x00),           # half of it: ties to even, i.e. to 0
    (2.0 ** -10 * 1.0001, 0x01),  # just above the tie
    (2.0 ** -11, 0x00),
    (3 * 2.0 ** -10, 0x02),       # between 1 and 2 quanta: ties to 2 (even)
    (5 * 2.0 ** -10, 0x02),       # between 2 and 3: ties to 2
    (7 * 2.0 ** -10, 0x04),       # between 3 and 4: ties to 4
    (13 * 2.0 ** -10, 0x06),      # between 6 and 7: ties to 6
    (7 * 2.0 ** -9, 0x07),        # the largest subnormal
    (15 * 2.0 ** -10, 0x08),      # between 7 * 2^-9 and 2^-6 (the smallest normal, code 0x08): even
    (2.0 ** -6, 0x08),
    (1e-30, 0x00),
]


@pytest.mark.parametrize("x, code", SUBNORMALS, ids=[f"encode({x:.6g})" for x, _ in SUBNORMALS])
def test_encode_subnormals(x, code):
    codes = SPEC_CODEC.encode(torch.tensor([x, -x], dtype=torch.float32))
    assert codes.tolist() == [code, code | 0x80]  # underflow keeps the sign: -tiny -> -0.0 (0x80)


NAN_BITS = {  # quiet NaN, then the same NaN with the sign bit set
    torch.float16: torch.tensor([0x7E00, -0x0200], dtype=torch.int16),
    torch.bfloat16: torch.tensor([0x7FC0, -0x0040], dtype=torch.int16),
    torch.float32: torch.tensor([0x7FC00000, -0x00400000], dtype=torch.int32),
    torch.float64: torch.tensor([0x7FF8000000000000, -0x0008000000000000], dtype=torch.int64),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64],
                         ids=lambda d: f"encode({str(d).replace('torch.', '')})")
def test_encode_keeps_nan(dtype):
    # Built from bit patterns (torch's own conversions do not keep the sign of NaN), in several
    # lengths so torch's vectorized paths and their scalar tails are both used: torch's float16 ->
    # float32 conversion drops the sign of NaN in the tail (torch 2.13), the codec must not.
    for pairs in (1, 3, 10, 20):
        x = NAN_BITS[dtype].repeat(pairs).view(dtype)
        assert torch.signbit(x).tolist() == [False, True] * pairs
        assert SPEC_CODEC.encode(x).tolist() == [0x7F, 0xFF] * pairs, f"{2 * pairs} NaNs"
        assert torch.isnan(SPEC_CODEC.round(x)).all()


def test_encode_signed_zero():
    assert SPEC_CODEC.encode(torch.tensor([0.0, -0.0])).tolist() == [0x00, 0x80]
    back = SPEC_CODEC.round(torch.tensor([-0.0]))
    assert back.item() == 0.0 and torch.signbit(back).item()


def test_encode_converts_to_float32_first():
    """float64 input is rounded to float32 before E4M3, as the kernel's cast does: a float64 just
    above a midpoint that becomes the midpoint in float32 ties to even."""
    x = torch.tensor([1.0625 + 2.0 ** -40], dtype=torch.float64)  # midpoint of 1.0 and 1.125, nudged up
    assert SPEC_CODEC.encode(x).item() == 0x38  # 1.0, not 0x39


def test_to_fp8_is_encode_as_float8():
    x = dense_grid()[:1000]
    gh.assert_identical(SPEC_CODEC.to_fp8(x).view(torch.uint8), SPEC_CODEC.encode(x), "to_fp8")
    gh.assert_identical(SPEC_CODEC.round(x), SPEC_CODEC.decode(SPEC_CODEC.encode(x)), "round")


# ---------------------------------------------------------------- the PyPTO calculator's codec


CALCULATOR_ENCODE = [
    (0.3, 0.0),     # rounded to an integer first
    (0.7, 1.0),
    (1.5, 2.0),     # half to even
    (2.5, 2.0),
    (61.5, 64.0),   # 62 (half to even), then the grid of [32, 64) (spacing 4): 60 | 64, ties to 64 (even)
    (107.0, 104.0), # grid of [64, 128), spacing 8
    (232.0, 224.0), # midpoint of 224 and 240: ties to 224 (even)
    (234.0, 240.0), # an integer below 240, on the grid 240 (code 0x77), read back as 240
    (239.5, 240.0), # 240 (half to even): an integer of 240 saturates to code 0x7E, read back as 240
    (448.0, 240.0),
    (math.inf, 240.0),
]


@pytest.mark.parametrize("x, value", CALCULATOR_ENCODE, ids=[f"round({x})" for x, _ in CALCULATOR_ENCODE])
def test_calculator_codec_encode(x, value):
    got = PYPTO_CALCULATOR_CODEC.round(torch.tensor([x, -x], dtype=torch.float32))
    assert got.tolist() == [value, -value]


def test_calculator_codec_saturates_to_code_0x7e_from_an_integer_of_240():
    codes = PYPTO_CALCULATOR_CODEC.encode(torch.tensor([234.0, -239.4, 239.5, -240.0, 448.0, math.nan, -math.nan]))
    assert codes.tolist() == [0x77, 0xF7, 0x7E, 0xFE, 0x7E, 0x7E, 0xFE]


def test_calculator_codec_decode():
    top_binade = ((ALL_CODES.long() >> 3) & 0xF) == 0xF
    decoded = PYPTO_CALCULATOR_CODEC.decode(ALL_CODES)
    signs = torch.where(ALL_CODES.long() & 0x80 != 0, -1.0, 1.0)
    gh.assert_identical(decoded[top_binade], 240.0 * signs[top_binade], "exponent-field-15 codes")
    gh.assert_identical(decoded[~top_binade], SPEC_CODEC.decode(ALL_CODES)[~top_binade], "other codes")
    assert top_binade.sum() == 16


def test_calculator_codec_is_spec_codec_on_small_integers():
    x = torch.arange(-16, 17, dtype=torch.float32)
    gh.assert_identical(PYPTO_CALCULATOR_CODEC.encode(x), SPEC_CODEC.encode(x), "small integers")


# ---------------------------------------------------------------- get_codec


def test_get_codec():
    assert get_codec(None) is SPEC_CODEC
    assert get_codec(SPEC_CODEC) is SPEC_CODEC
    assert get_codec("e4m3fn-sat") is SPEC_CODEC
    assert get_codec("pypto-0.2.0-calculator") is PYPTO_CALCULATOR_CODEC
    assert isinstance(get_codec(PYPTO_CALCULATOR_CODEC), Fp8Codec)
    assert SPEC_CODEC.max_value == 448.0 and PYPTO_CALCULATOR_CODEC.max_value == 240.0


@pytest.mark.parametrize("codec", [SPEC_CODEC, PYPTO_CALCULATOR_CODEC], ids=lambda c: c.name)
def test_round_is_decode_of_encode_on_a_dense_grid(codec):
    """round() takes a shortcut for the spec codec; it must give decode(encode(x)) bit for bit."""
    grid = torch.linspace(-500.0, 500.0, 400_001)
    x = torch.cat([grid, grid * 2.0 ** -8, grid * 2.0 ** -14,
                   torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 3e38, -3e38])])
    rounded, via_codes = codec.round(x), codec.decode(codec.encode(x))
    assert torch.equal(rounded.view(torch.int32)[~rounded.isnan()], via_codes.view(torch.int32)[~via_codes.isnan()])
    assert torch.equal(rounded.isnan(), via_codes.isnan())
