"""Laws of the quantizers (SPEC §3): the golden's own, whatever the backend (the AT-12 laws on the
backend are cases/laws/test_at12_laws.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from pfa_verify.cases.data import regressions
from pfa_verify.properties.search import strategies as ps


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
