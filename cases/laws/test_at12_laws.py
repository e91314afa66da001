"""Laws of AT-12 QK^T MatMul Scale (SPEC §6) on the backend under test (--backend)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pfa_verify.cases.laws import check


@given(data=st.data())
def test_at12_acceptance(check_law, examples_for, data):
    """AT-12 scores of the backend (BF16, or FP8 with dequant after) are within rtol 1/128, atol 1e-4
    of the golden's, including tail tiles of any length (SPEC §6). Under --backend golden this is
    the row-by-row route against the vectorized one."""
    check(check_law, examples_for, data, "at12_acceptance")


@given(data=st.data())
def test_at12_fp8_matches_bf16_of_dequantized(check_law, examples_for, data):
    """FP8 scores dequantized after the matmul equal BF16 scores of the dequantized inputs within
    the bound of their bf16 rounding and float32 accumulation (SPEC §6, dequant_after=True)."""
    check(check_law, examples_for, data, "at12_fp8_vs_bf16")


@given(data=st.data())
def test_at12_default_scale_is_rsqrt_head_dim(check_law, examples_for, data):
    """scale=None is 1/sqrt(head_dim) derived at run time: identical to passing it (SPEC §6)."""
    check(check_law, examples_for, data, "at12_default_scale")
