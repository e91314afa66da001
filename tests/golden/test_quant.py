"""golden/quant.py, SPEC §3: the round-trip error bound, the row max landing on 448, per-channel
valid masks, the zero-row policy (raise naming tensor and row, or unit_scale), non-finite inputs,
and the in-kernel quantize_rows."""
from __future__ import annotations

import math
import re

import golden_helpers as gh
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pfa_verify.golden import FP8_MAX, PYPTO_CALCULATOR_CODEC, SPEC_CODEC, quantize_per_channel, quantize_per_token
from pfa_verify.golden.quant import quantize_rows
from pfa_verify.properties.rule import compare as cmp


def f32(x: float) -> float:
    """x rounded to float32, as a Python float."""
    return torch.tensor(x, dtype=torch.float32).item()


def half_spacing(y: torch.Tensor) -> torch.Tensor:
    """Half the E4M3 grid spacing at |y| (y on the scaled, [-448, 448] side): 2^(e-4) in [2^e, 2^(e+1)),
    2^-10 among subnormals."""
    exponent = torch.floor(torch.log2(y.abs().double().clamp(min=2.0 ** -6)))
    return torch.exp2(exponent - 4)


def wide_rows(seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1)
    x = x * torch.exp2(torch.randint(-10, 11, shape, generator=generator).double())
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_per_token_round_trip_error_bound(dtype):
    x = wide_rows(1, (64, 32), dtype)
    x8, dequant = quantize_per_token(x)
    assert x8.dtype == torch.float8_e4m3fn and dequant.dtype == torch.float32 and dequant.shape == (64, 1)
    scaled = x.float() * torch.reciprocal(dequant)  # x * scale, the value the codec rounded
    decoded = SPEC_CODEC.from_fp8(x8, torch.float64)
    # On the scaled side, E4M3 rounding is within half a grid spacing (the scale itself is
    # 448 / amax in float32, so reciprocal(dequant) may differ from it by an ulp: allow 2^-20 more).
    bound = half_spacing(scaled.double()) * (1 + 2.0 ** -20) + scaled.double().abs() * 2.0 ** -22
    cmp.assert_close(decoded, scaled.double(), rtol=0.0, atol=bound, identifier="e4m3(x * scale) vs x * scale")
    # Back on x's side: relative 2^-4 for normals (|x * scale| >= 2^-6), plus float32 noise.
    back = decoded * dequant.double()
    normal = scaled.abs() >= 2.0 ** -6
    rel = torch.where(normal, (back - x.double()).abs() / x.double().abs(), 0.0)
    assert float(rel.max()) <= 2.0 ** -4 * (1 + 2.0 ** -18)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=40).filter(
    lambda xs: any(abs(v) > 1e-30 for v in xs)))
def test_per_token_round_trip_hypothesis(values):
    x = torch.tensor(values, dtype=torch.float32)
    x8, dequant = quantize_per_token(x)
    back = SPEC_CODEC.from_fp8(x8, torch.float64) * dequant.double()
    amax = x.abs().max().double()
    # Everything is within half a spacing at the top binade of the row: 2^-4 * amax at most.
    assert float((back - x.double()).abs().max()) <= amax * 2.0 ** -4 * (1 + 2.0 ** -18)


@pytest.mark.parametrize("seed", range(4))
def test_max_element_maps_to_448(seed):
    """The element of largest magnitude reads back as +-448 exactly: x * scale may land a float32
    ulp above 448 (SPEC §3), which rounds to 448 before the overflow check."""
    x = wide_rows(seed, (200, 48))
    x8, dequant = quantize_per_token(x)
    top = x.abs().argmax(dim=-1, keepdim=True)
    decoded = SPEC_CODEC.from_fp8(x8).gather(-1, top)
    gh.assert_identical(decoded.abs(), torch.full_like(decoded, FP8_MAX), "|decoded row max|")
    assert torch.equal(torch.signbit(decoded), torch.signbit(x.gather(-1, top)))
    # dequant scale * 448 gives the row max back, within the two float32 roundings of 1 / (448 / amax)
    amax = x.abs().amax(dim=-1, keepdim=True)
    cmp.assert_close(dequant * FP8_MAX, amax, rtol=2.0 ** -22, atol=0.0, identifier="dequant_scale * 448 vs row max")


def test_scale_is_the_float32_quotient():
    amax = torch.tensor([3.0, 5.0, 7.0, 0.1, 123.456])
    quotient = (FP8_MAX / amax.double()).float()  # one rounding: float64 division is exact enough here
    _, dequant = quantize_per_token(amax[:, None])
    gh.assert_identical(dequant.flatten(), torch.reciprocal(quotient), "dequant_scale vs 1 / float32(448 / amax)")


def test_scaled_max_one_ulp_above_448_is_harmless():
    # Hunt a row where float32(x * (448 / amax)) overshoots 448, as SPEC §3 says happens often.
    x = wide_rows(7, (2000, 8))
    amax = x.abs().amax(dim=-1, keepdim=True)
    overshoot = ((x.abs() * (FP8_MAX / amax)).amax(dim=-1) > FP8_MAX).nonzero().flatten()
    assert overshoot.numel() > 0, "no overshooting row found; change the seed"
    x8, _ = quantize_per_token(x[overshoot])
    assert SPEC_CODEC.from_fp8(x8).abs().amax(dim=-1).eq(FP8_MAX).all()


def test_per_token_hand_worked():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0], [3.0, 3.0, -3.0, 1.0]])
    x8, dequant = quantize_per_token(x)
    # row 0: scale 224 -> [224, -448, 112, 0]; row 1: scale 448/3 -> [448, 448, -448, 149.33 -> 144]
    assert SPEC_CODEC.from_fp8(x8).tolist() == [[224.0, -448.0, 112.0, 0.0], [448.0, 448.0, -448.0, 144.0]]
    assert dequant[0].item() == f32(1 / 224)
    cmp.assert_close(dequant[1], torch.tensor([3 / 448], dtype=torch.float32), rtol=2.0 ** -22, atol=0.0,
                     identifier="dequant_scale of row 1")


def test_per_channel_max_is_over_the_axis():
    v = wide_rows(3, (2, 9, 3, 4))  # [B, S, NKV, D], max over S
    v8, dequant = quantize_per_channel(v, 1)
    assert dequant.shape == (2, 1, 3, 4)
    expected8, expected_dequant = quantize_per_token(v.permute(0, 2, 3, 1).contiguous())
    gh.assert_identical(v8.view(torch.uint8), expected8.permute(0, 3, 1, 2).view(torch.uint8), "v8 vs per-token of V^T")
    gh.assert_identical(dequant, expected_dequant.permute(0, 3, 1, 2), "dequant_scale")
    # negative dim names the same axis
    gh.assert_identical(quantize_per_channel(v, -3)[0].view(torch.uint8), v8.view(torch.uint8), "dim=-3")


def test_per_channel_valid_mask():
    """V's max is over each batch's valid tokens: padding does not change it, and invalid entries
    are encoded as 0, whatever they held."""
    v = wide_rows(5, (3, 8, 2, 4))
    lengths = torch.tensor([8, 3, 1])
    valid = (torch.arange(8)[None, :] < lengths[:, None])[:, :, None, None]
    padded = torch.where(valid, v, 1.0e4)  # padding far larger than any valid value
    v8, dequant = quantize_per_channel(padded, 1, valid=valid)
    for b, n in enumerate(lengths.tolist()):
        alone8, alone_dequant = quantize_per_channel(v[b:b + 1, :n], 1)
        gh.assert_identical(v8[b:b + 1, :n].view(torch.uint8), alone8.view(torch.uint8), f"batch {b} valid tokens")
        gh.assert_identical(dequant[b:b + 1], alone_dequant, f"batch {b} dequant_scale")
        assert (v8[b, n:].view(torch.uint8) == 0).all(), f"batch {b} padding not encoded as 0"
    # zeros as padding give the same result as no padding at all
    zeros8, zeros_dequant = quantize_per_channel(torch.where(valid, v, 0.0), 1)
    gh.assert_identical(zeros8.view(torch.uint8), v8.view(torch.uint8), "zero padding vs masked padding")
    gh.assert_identical(zeros_dequant, dequant, "zero padding dequant_scale")


def test_per_channel_valid_mask_ignores_nan_padding():
    v = wide_rows(6, (1, 4, 1, 2))
    valid = torch.tensor([True, True, False, False])[None, :, None, None]
    v8, dequant = quantize_per_channel(torch.where(valid, v, math.nan), 1, valid=valid)
    assert torch.isfinite(dequant).all() and (v8.view(torch.uint8)[:, 2:] == 0).all()


@pytest.mark.parametrize("quantize, name, row", [
    # The row is named by its index without the reduced axis.
    (lambda x: quantize_per_token(x, name="q"), "q", "(1, 2)"),
    (lambda x: quantize_per_channel(x, 0, name="v"), "v", "(2, 1)"),
], ids=["quantize_per_token(q)", "quantize_per_channel(v, 0)"])
def test_zero_row_raises_naming_tensor_and_row(quantize, name, row):
    x = wide_rows(2, (3, 4, 5))
    if name == "q":
        x[1, 2] = 0.0  # row (1, 2) of the last axis
    else:
        x[:, 2, 1] = 0.0  # channel (2, 1) over dim 0
    with pytest.raises(ValueError, match=re.escape(f"{name} row {row} is all zeros") + ".*zero_rows='unit_scale'"):
        quantize(x)


def test_zero_row_unit_scale():
    x = wide_rows(2, (3, 5))
    x[1] = 0.0
    x8, dequant = quantize_per_token(x, zero_rows="unit_scale")
    assert (x8[1].view(torch.uint8) == 0).all() and dequant[1].item() == 1.0
    others8, others_dequant = quantize_per_token(x[[0, 2]])
    gh.assert_identical(x8[[0, 2]].view(torch.uint8), others8.view(torch.uint8), "the other rows")
    gh.assert_identical(dequant[[0, 2]], others_dequant, "the other rows' dequant_scale")
    assert (SPEC_CODEC.from_fp8(x8[1]) * dequant[1] == 0).all()


def test_zero_row_unit_scale_per_channel():
    v = wide_rows(4, (2, 3, 1, 2))
    valid = torch.tensor([[True, True, True], [False, False, False]])[:, :, None, None]  # batch 1 empty
    with pytest.raises(ValueError, match=r"v row \(1, 0, 0\) is all zeros"):
        quantize_per_channel(v, 1, valid=valid, name="v")
    v8, dequant = quantize_per_channel(v, 1, valid=valid, zero_rows="unit_scale")
    assert (dequant[1] == 1.0).all() and (v8[1].view(torch.uint8) == 0).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("which", ["per_token", "per_channel"])
def test_nonfinite_input_raises(which, bad):
    x = wide_rows(0, (3, 4))
    x[2, 1] = bad
    word = "NaN" if math.isnan(bad) else "an infinite value"
    with pytest.raises(ValueError, match=rf"k has {word} in row .*finite values"):
        if which == "per_token":
            quantize_per_token(x, name="k")
        else:
            quantize_per_channel(x, 0, name="k", zero_rows="unit_scale")


def test_inputs_are_not_modified():
    x = wide_rows(9, (4, 6))
    valid = torch.ones(4, 6, dtype=torch.bool)
    valid[3] = False
    before = gh.clone_tensors({"x": x, "valid": valid})
    quantize_per_token(x)
    quantize_per_channel(x, 0, valid=valid)
    gh.assert_unchanged({"x": x, "valid": valid}, before, "quantize")


# ---------------------------------------------------------------- quantize_rows (P, inside the kernel)


def test_quantize_rows_hand_worked():
    p = torch.tensor([[1.0, 0.5, 0.25, 2.0 ** -20], [0.0, 0.0, 0.0, 0.0]])
    p8, p_scale = quantize_rows(p)
    assert p8.tolist() == [[448.0, 224.0, 112.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert p_scale.tolist() == [[f32(1 / 448)], [1.0]]  # an empty row gets scale 1, never raises


def test_quantize_rows_valid_columns_and_nan():
    p = torch.tensor([[1.0, math.nan, 0.5], [math.nan, 0.5, 0.25]])
    valid = torch.tensor([[True, False, True], [True, True, True]])
    p8, p_scale = quantize_rows(p, valid=valid)
    assert p8[0].tolist() == [448.0, 0.0, 224.0] and p_scale[0].item() == f32(1 / 448)
    assert torch.isnan(p8[1]).any()  # NaN that reaches P stays visible


def test_quantize_rows_uses_the_codec():

    p8, _ = quantize_rows(torch.tensor([[1.0, 0.5]]), codec=PYPTO_CALCULATOR_CODEC)
    assert p8.tolist() == [[240.0, 224.0]]  # 448 saturates to 240 there


@pytest.mark.parametrize("quantize", [
    lambda x: quantize_per_token(x, name="q"),
    lambda x: quantize_per_channel(x, 1, name="q"),
], ids=["quantize_per_token(q)", "quantize_per_channel(q, 1)"])
def test_scale_overflow_row_raises(quantize):
    """A row whose 448 / max|x| overflows float32 has no finite scale: rejected, row named."""
    x = torch.ones(2, 3)
    x[1] = 1e-37
    with pytest.raises(ValueError, match=r"q row \(1,\).*overflows float32"):
        quantize(x)
