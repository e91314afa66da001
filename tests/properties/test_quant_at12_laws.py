"""Laws of the quantizers (SPEC §3, the golden's) and of AT-12 QK^T MatMul Scale (SPEC §6, the
backend under test)."""
from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from cases.data import regressions
from properties import strategies as ps


@given(x=ps.quant_rows())
def test_quantization_round_trip_within_half_spacing(x):
    """Per-token quantization errs by at most half an E4M3 spacing of x * scale, and each row's
    largest |x| maps to the code 448 (SPEC §3)."""
    regressions.check("quant_round_trip", None, x, backend_name="golden")


@given(x=ps.quant_rows(), power=st.integers(-20, 20))
def test_quantization_scale_covariance(x, power):
    """Scaling a row by 2**power keeps its codes and multiplies its dequant scale by exactly
    2**power (SPEC §3: scale = 448 / max|x|), wherever both rows stay in quant_rows' domain (every
    row's max|x| >= 2**-110, so its dequant scale max|x| / 448 is a normal float32: a subnormal one
    is rounded, and the law does not hold there by IEEE 754)."""
    assume(float(np.abs(x).max(axis=1).min()) * 2.0 ** power >= 2.0 ** -110)
    regressions.check("quant_scale_covariance", None, x, backend_name="golden", power=power)


@given(case=ps.at12_cases(), fp8=st.booleans())
def test_at12_acceptance(check_law, case, fp8):
    """AT-12 scores of the backend (BF16, or FP8 with dequant after) are within rtol 1/128, atol 1e-4
    of the golden's, including tail tiles of any length (SPEC §6). Under --backend golden this is
    the row-by-row route against the vectorized one."""
    check_law("at12_acceptance", case, fp8=fp8)


@given(case=ps.at12_cases())
def test_at12_fp8_matches_bf16_of_dequantized(check_law, case):
    """FP8 scores dequantized after the matmul equal BF16 scores of the dequantized inputs within
    the bound of their bf16 rounding and float32 accumulation (SPEC §6, dequant_after=True)."""
    check_law("at12_fp8_vs_bf16", case)


@given(case=ps.at12_cases())
def test_at12_default_scale_is_rsqrt_head_dim(check_law, case):
    """scale=None is 1/sqrt(head_dim) derived at run time: identical to passing it (SPEC §6)."""
    check_law("at12_default_scale", case)
