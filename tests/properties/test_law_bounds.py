"""The laws' derived bounds (properties/search/laws.py), each on inputs built to reach it.

A bound must hold for every conforming computation (SPEC §4.1) and be tight: on inputs where the
roundings it counts are aligned on purpose, conforming kernels come close to it and never pass it.
"""
from __future__ import annotations

import math

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.kernels.conforming import VARIANTS
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import laws


def _e4m3(value: float, shape) -> torch.Tensor:
    return golden.SPEC_CODEC.to_fp8(torch.full(shape, value))


def _aligned_at12(q_tile: int = 3, k_tile: int = 5, d: int = 64):
    """FP8 operands whose dequantized values all round up to bf16 by almost 2**-8: every code is 1.0 and
    each scale is 1 + 2**-8 + 2**-23, so ``q8 * q_scale`` lies just above a bf16 midpoint and rounds up to
    1 + 2**-7. Every product is positive: nothing cancels, the FP8 and BF16 scores differ by about
    theta = 2 * 2**-8 of their magnitude, the bound's leading term."""
    scale = torch.tensor(1 + 2.0 ** -8 + 2.0 ** -23, dtype=torch.float32)
    q8, k8 = _e4m3(1.0, (q_tile, d)), _e4m3(1.0, (k_tile, d))
    qs, ks = torch.full((q_tile, 1), float(scale)), torch.full((k_tile, 1), float(scale))
    codec = golden.SPEC_CODEC
    qd, kd = (codec.from_fp8(q8) * qs).to(torch.bfloat16), (codec.from_fp8(k8) * ks).to(torch.bfloat16)
    assert float(qd[0, 0]) == 1 + 2.0 ** -7
    return q8, qs, k8, ks, qd, kd


@pytest.mark.parametrize("variant", ["golden"] + sorted(VARIANTS))
def test_at12_fp8_vs_bf16_bound_is_reached_and_never_passed(variant):
    q8, qs, k8, ks, qd, kd = _aligned_at12()
    d = q8.shape[-1]
    bound = laws.at12_fp8_vs_bf16_bound(q8, qs, k8, ks, qd, kd, scale=d ** -0.5, codec=golden.SPEC_CODEC)
    backend = kernels.get_backend("golden" if variant == "golden" else f"conforming:{variant}")
    fp8 = backend.qk_matmul_scale(q8, k8, q_scale=qs, k_scale=ks)
    bf16 = backend.qk_matmul_scale(qd, kd)
    ratio = ((fp8 - bf16).abs() / bound)
    assert float(ratio.max()) <= 1.0
    assert float(ratio.min()) > 0.95, "the inputs are built to reach the bound's leading term"


def test_the_old_at12_bound_is_passed_by_the_same_inputs():
    """The bound before issue 16 (mag * (2**-8 + 2 (d + 2) 2**-24)) took a bf16 rounding as 2**-9: these
    inputs pass it by almost a factor 2, a conforming computation the law wrongly failed."""
    q8, qs, k8, ks, qd, kd = _aligned_at12()
    d = q8.shape[-1]
    fp8 = golden.qk_matmul_scale(q8, k8, q_scale=qs, k_scale=ks)
    bf16 = golden.qk_matmul_scale(qd, kd)
    mag = (qd.float().abs() @ kd.float().abs().T) * d ** -0.5
    old = mag * (2.0 ** -8 + 2 * (d + 2) * 2.0 ** -24)
    assert float(((fp8 - bf16).abs() / old).min()) > 1.9


def test_quant_round_trip_bound_is_reached_at_the_e4m3_midpoints():
    """quant_round_trip allows half an E4M3 spacing of x * scale (plus 2**-22 of it for the float32
    roundings of the scale): a row whose max is 448 (scale 1 exactly) and whose other values sit on the
    midpoints between E4M3 neighbours reaches exactly half a spacing, and passes."""
    midpoints = [1.0625, 17.0, 2.0 ** -7 + 2.0 ** -10, 3.0 * 2.0 ** -10, 232.0, 432.0]
    x = torch.tensor([[448.0] + midpoints], dtype=torch.float32)
    x8, dq = golden.quantize_per_token(x)
    assert float(dq) == 1.0
    error = (x8.float() - x).abs()[0, 1:]
    half = laws.e4m3_half_spacing(x[0, 1:])
    assert torch.equal(error, half), "every value is rounded by exactly half a spacing"
    laws.run("quant_round_trip", kernels.get_backend("golden"), x)


def _bf16_step(x: torch.Tensor, *, up: bool) -> torch.Tensor:
    """The next bf16 value above (``up``) or below each bf16 ``x``, by its bits."""
    bits = x.view(torch.int16)
    away = (x.float() > 0) if up else (x.float() < 0)
    stepped = torch.where(away, bits + 1, bits - 1).view(torch.bfloat16)
    zero = torch.tensor(2.0 ** -133 if up else -2.0 ** -133).bfloat16()
    return torch.where(x.float() == 0, zero, stepped)


class _TwoOutputs:
    """A backend double returning one fixed output on its first call and another on its second."""

    def __init__(self, first, second):
        self.outputs, self.name, self.codec = [first, second], "two outputs", None

    def paged_attention_fp8(self, **_):
        return self.outputs.pop(0).clone()


def test_two_outputs_at_opposite_ends_of_the_acceptance_interval_pass_and_one_step_past_fails():
    """The laws that compare two outputs of one backend (GQA repetition, batch independence, causal
    positions) allow the width of the acceptance interval: both outputs pass the one rule at its two
    ends, so a conforming pair can differ that much; one bf16 step more does not."""
    case = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=40, nq=2, nkv=1, head_dim=16, block_size=16,
                                            s2_tile=16), seed=4)
    bundle = case.inputs()
    tensors, scalars = {k: v for k, v in bundle.kwargs().items() if isinstance(v, torch.Tensor)}, \
        {k: v for k, v in bundle.kwargs().items() if not isinstance(v, torch.Tensor)}
    env = golden.paged_attention_envelope(**tensors, **scalars)
    g = env.golden.float()
    rtol, atol = cmp.get_tolerance("attention")
    tol = atol + rtol * g.abs()
    low = torch.minimum(env.lo.float(), g - tol)
    high = torch.maximum(env.hi.float(), g + tol)
    # The bf16 values inside the interval that lie furthest apart (one bf16 step back where rounding left it).
    low_b, high_b = low.bfloat16(), high.bfloat16()
    low_b = torch.where(low_b.float() < low, _bf16_step(low_b, up=True), low_b)
    high_b = torch.where(high_b.float() > high, _bf16_step(high_b, up=False), high_b)
    assert bool(((low_b.float() >= low) & (high_b.float() <= high)).all())
    width = laws.acceptance_width(_TwoOutputs(None, None), tensors, scalars)
    assert bool(((high_b.float() - low_b.float()) <= width).all())
    laws.assert_pair_within(high_b, low_b, width, identifier="ends", backend=_TwoOutputs(None, None), case=case,
                      tensors=tensors, scalars=scalars)
    past = high_b.clone()
    gap = high_b.float() - low_b.float()
    at = tuple(int(i) for i in torch.unravel_index((width - gap).argmin(), width.shape))
    past[at] = _bf16_step(high_b[at], up=True)
    assert float(past[at]) - float(low_b[at]) > float(width[at])
    with pytest.raises(AssertionError, match="Allowed per element: the width of the acceptance interval"):
        laws.assert_pair_within(past, low_b, width, identifier="ends", backend=_TwoOutputs(None, None), case=case,
                          tensors=tensors, scalars=scalars)
    assert math.isfinite(float(width.max()))
