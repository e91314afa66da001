"""Each single-stage bound of the acceptance envelope (SPEC §4.2), held alone at the inputs where it is
tightest (binade boundaries, underflow, cancellation, exp(0)), against the freedom it bounds computed
independently (mpmath at 200 bits, float32 arithmetic, exact fractions).

Every checker is also run against its bound made one unit too tight (the unit is named in each test),
and must fail there: a stage test that a tighter, unsound bound would pass could not catch a bound that
is one unit short. The end-to-end containment tests are tests/golden/test_envelope.py.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

import pfa_verify.golden.envelope.fold as fold_module
import pfa_verify.golden.envelope.stages as stages_module
from pfa_verify.golden.envelope.builder import _p_scale_bounds
from pfa_verify.golden.envelope.fold import tile_weights
from pfa_verify.golden.envelope.stages import dequant_interval, exp_arguments, exp_bounds, mm2_scaled_interval
from pfa_verify.golden.intervals import down32_add, float64_slack, float64_sum_slack, ulp32, up32_add, within_ulps
from pfa_verify.golden.model import SPEC_MODEL
from pfa_verify.kernels.conforming.arithmetic import exp_edge, exp_ulps

mpmath.mp.prec = 200
_INF32, _NINF32 = torch.tensor(math.inf), torch.tensor(-math.inf)


# --- exact references ---------------------------------------------------------------------------------

def _spec_ulp(t: mpmath.mpf) -> mpmath.mpf:
    """SPEC §4.1's ulp of the exact value t: 2**(max(floor(log2 |t|), -126) - 23)."""
    if t == 0:
        return mpmath.mpf(2) ** -149
    exponent = int(mpmath.floor(mpmath.log(abs(t), 2)))
    # log2 of a value a hair below a power of two may print as the power: settle it exactly.
    if mpmath.mpf(2) ** exponent > abs(t):
        exponent -= 1
    elif mpmath.mpf(2) ** (exponent + 1) <= abs(t):
        exponent += 1
    return mpmath.mpf(2) ** (max(exponent, -126) - 23)


def _least_float32_at_or_above(v: mpmath.mpf) -> float:
    f = np.float32(float(v))
    while mpmath.mpf(float(f)) < v:
        f = np.nextafter(f, np.float32(np.inf))
    while mpmath.mpf(float(np.nextafter(f, np.float32(-np.inf)))) >= v:
        f = np.nextafter(f, np.float32(-np.inf))
    return float(f)


def _greatest_float32_at_or_below(v: mpmath.mpf) -> float:
    return -_least_float32_at_or_above(-v)


def _within(t: mpmath.mpf, ulps: float, *, floor_zero: bool = False) -> tuple[float, float]:
    """(least, greatest) float32 y with |y - t| <= ulps * ulp(t) (and y >= 0 when ``floor_zero``)."""
    reach = ulps * _spec_ulp(t)
    low = t - reach
    if floor_zero:
        low = max(low, mpmath.mpf(0))
    return _least_float32_at_or_above(low), _greatest_float32_at_or_below(t + reach)


def _exp_reach(x: float, ulps: float) -> tuple[float, float]:
    """What F3 lets a kernel's exp return for the float32 x: every float32 within ``ulps`` SPEC ulps of
    exp(x), never below 0; exactly 1 at x = 0."""
    if x == 0:
        return 1.0, 1.0
    return _within(mpmath.exp(mpmath.mpf(x)), ulps, floor_zero=True)


def _rn32(q: Fraction) -> float:
    """The float32 nearest the exact rational q (ties to even), independently of any float arithmetic."""
    if q == 0:
        return 0.0
    lo = _greatest_float32_at_or_below(mpmath.mpf(q.numerator) / q.denominator)
    while Fraction(lo) > q:                                       # mpmath's division rounded: settle exactly
        lo = float(np.nextafter(np.float32(lo), np.float32(-np.inf)))
    while Fraction(float(np.nextafter(np.float32(lo), np.float32(np.inf)))) <= q:
        lo = float(np.nextafter(np.float32(lo), np.float32(np.inf)))
    hi = lo if Fraction(lo) == q else float(np.nextafter(np.float32(lo), np.float32(np.inf)))
    below, above = q - Fraction(lo), Fraction(hi) - q
    if below != above:
        return lo if below < above else hi
    return lo if int(np.float32(lo).view(np.uint32)) % 2 == 0 else hi


def _steps(x: float, k: int) -> float:
    """The float32 k steps from x (negative: down)."""
    f = np.float32(x)
    for _ in range(abs(k)):
        f = np.nextafter(f, np.float32(np.inf if k > 0 else -np.inf))
    return float(f)


def _inward(bounds, side: str):
    """A bound made one float32 step tighter on one side (``lo`` or ``hi``): what the meta checks feed the
    checkers, each side on its own (a check that failed only on one side would pass the other's)."""
    def tighter(*args, **kwargs):
        lo, hi = bounds(*args, **kwargs)
        if side == "lo":
            return torch.nextafter(lo, _INF32), hi
        return lo, torch.nextafter(hi, _NINF32)
    return tighter


# --- exp (F3) -----------------------------------------------------------------------------------------

def _exp_edges() -> list[float]:
    """float32 x where exp(x) lies just above and below powers of two (x near -k ln 2, where the SPEC ulp
    changes), near 0 (exp(0) = 1 is exact, the first values below 0), where exp's result is subnormal
    (-87.3 > x > -103.3) and where it underflows."""
    xs = [0.0, -(2.0 ** -149), -(2.0 ** -126), -(2.0 ** -30), -(2.0 ** -24), -(2.0 ** -23), -(2.0 ** -20), -1e-3]
    for k in list(range(1, 12)) + [20, 60, 100, 125, 126, 127, 130, 140, 148, 149, 150]:
        centre = float(np.float32(-k * math.log(2)))
        xs += [_steps(centre, s) for s in range(-3, 4)]
    xs += [-87.33654, -87.5, -100.0, -103.27893, -103.9720, -104.0, -110.0, -200.0, -math.inf]
    return [float(np.float32(x)) for x in xs]


def _check_exp(bounds, ulps: float) -> int:
    """Every reachable result lies inside; returns how many cases were exactly tight on both sides."""
    tight = 0
    xs = _exp_edges()
    for x in xs:
        want_lo, want_hi = _exp_reach(x, ulps) if math.isfinite(x) else (0.0, _greatest_float32_at_or_below(ulps * mpmath.mpf(2) ** -149))
        lo, hi = bounds(torch.tensor([x]), torch.tensor([x]), ulps)
        assert float(lo) <= want_lo and float(hi) >= want_hi, (x, ulps, float(lo), want_lo, float(hi), want_hi)
        tight += float(lo) == want_lo and float(hi) >= want_hi and float(hi) == _greatest_float32_at_or_below(
            mpmath.mpf(float(hi))) and float(hi) == want_hi
    # Intervals of x: the union over every float32 between the ends.
    for x in xs[8:60:3]:
        ends = (_steps(x, -2), _steps(x, 1) if x < 0 else 0.0)
        grid = [ends[0]]
        while grid[-1] < ends[1]:
            grid.append(_steps(grid[-1], 1))
        reach = [_exp_reach(v, ulps) for v in grid if v <= 0]
        lo, hi = bounds(torch.tensor([ends[0]]), torch.tensor([min(ends[1], 0.0)]), ulps)
        assert float(lo) <= min(r[0] for r in reach) and float(hi) >= max(r[1] for r in reach), ends
    return tight


#: SPEC §4.1 F3's 3 ulp first; the narrower models a backend may declare (2: CUDA's expf) after it.
EXP_ULPS = [SPEC_MODEL.exp_ulps, 2.0, 1.0, 0.5]


def test_the_spec_model_allows_3_ulp():
    """SPEC §4.1 F3 (OpenCL 1.2's full-profile bound for single-precision exp): the stage tests below run at it."""
    assert SPEC_MODEL.exp_ulps == 3.0


@pytest.mark.parametrize("ulps", EXP_ULPS)
def test_exp_bounds_hold_every_result_f3_allows_at_its_edges(ulps):
    """Unit: one float32 step of the result. The bound is exact on the edge inputs (the least and the
    greatest float32 F3 allows), so one step tighter leaves a reachable result out."""
    tight = _check_exp(exp_bounds, ulps)
    assert tight >= 0.95 * len(_exp_edges()), tight


@pytest.mark.parametrize("ulps", EXP_ULPS)
@pytest.mark.parametrize("side", ["lo", "hi"])
def test_exp_bounds_one_step_tighter_fail(ulps, side):
    with pytest.raises(AssertionError):
        _check_exp(_inward(exp_bounds, side), ulps)


def test_exp_bounds_at_2_ulp_leave_out_what_3_ulp_allow():
    """Unit: one ulp of exp. The bound computed for 2 ulp (F3 before it admitted numpy's float32 exp) fed the
    3-ulp reference: it leaves reachable results out, on both sides."""
    def two_ulps(x_lo, x_hi, _ulps):
        return exp_bounds(x_lo, x_hi, 2.0)
    for side in ("lo", "hi"):
        def one_side(x_lo, x_hi, ulps, side=side):
            lo, hi = exp_bounds(x_lo, x_hi, ulps)
            lo2, hi2 = two_ulps(x_lo, x_hi, ulps)
            return (lo2, hi) if side == "lo" else (lo, hi2)
        with pytest.raises(AssertionError):
            _check_exp(one_side, SPEC_MODEL.exp_ulps)


@pytest.mark.parametrize("ulps, steps", [(3.0, 5), (2.0, 3)])
def test_the_issue_example_reaches_below_one_half_by_the_lower_binades_steps(ulps, steps):
    """exp(float32(-0.6931471)) = 0.5 + 2.9e-8: F3 (SPEC's ulp, 2**-24 there) allows 0.5 - 5 * 2**-25 at 3 ulp
    (0.5 - 3 * 2**-25 at 2): more steps of the lower binade than ulps."""
    x = torch.tensor([-0.6931471])
    lo, _ = exp_bounds(x, x, ulps)
    assert float(lo) == 0.5 - steps * 2.0 ** -25 == _exp_reach(float(x), ulps)[0]
    assert float(exp_edge(x, -1, ulps)) == 0.5 - steps * 2.0 ** -25       # the edge variant reaches it


@pytest.mark.parametrize("ulps", [SPEC_MODEL.exp_ulps, 2.0])
def test_exp_edge_variant_is_the_reference_edge(ulps):
    """pfa_verify.kernels.conforming's edge exp (the variants edges-up / edges-down / edges-either, at SPEC's 3 ulp)
    returns the extreme results of the mpmath reference, never beyond them: the variants put P and the
    update's factors on the bound. (It stops one step short where the edge lies within 2**-50 of a float32,
    as for the x just below 0.)"""
    xs = [x for x in _exp_edges() if math.isfinite(x)]
    down = exp_edge(torch.tensor(xs), -1, ulps).tolist()
    up = exp_edge(torch.tensor(xs), 1, ulps).tolist()
    reach = [_exp_reach(x, ulps) for x in xs]
    assert sum(d == r[0] for d, r in zip(down, reach, strict=True)) >= len(xs) - 2
    assert sum(u == r[1] for u, r in zip(up, reach, strict=True)) >= len(xs) - 2
    assert all(r[0] <= d and u <= r[1] for d, u, r in zip(down, up, reach, strict=True))
    if ulps == SPEC_MODEL.exp_ulps:
        assert exp_edge(torch.tensor(xs), 1).tolist() == up               # the default is F3's


@pytest.mark.parametrize("ulps", [1, 2, 3, -1, -2, -3])
def test_exp_steps_variant_stays_within_its_ulps(ulps):
    """pfa_verify.kernels.conforming's exp_ulps (the variants exp-up-div-up, exp-down-div-down, vertex-mixed): ``n``
    float32 steps from the correctly rounded value, stopped at F3's edge, so within |n| SPEC ulps of the
    mpmath reference on every edge input (n steps alone reach n + 1/2 ulp, and 2 n + 1/2 going up across a
    power of two: the first x below -k ln 2), and on the edge itself for many of them."""
    xs = [x for x in _exp_edges() if math.isfinite(x)]
    got = exp_ulps(torch.tensor(xs), ulps).tolist()
    at_edge = 0
    for x, y in zip(xs, got, strict=True):
        reach = _exp_reach(x, abs(ulps))
        assert reach[0] <= y <= reach[1], (x, ulps, y, reach)
        at_edge += x != 0 and y == reach[1 if ulps > 0 else 0]
    assert at_edge >= len(xs) // 3, at_edge


def test_the_largest_p_and_the_p_scale_at_3_ulp():
    """Step 4's constants (golden.envelope.builder._p_scale_bounds) against the mpmath reference: the largest
    P F3 allows over every x <= 0 is reached just below 0, 1 + 2**-23 at 3 ulp (x = -2**-24; above exp(0) = 1)
    and 1 at 2 ulp; the least P scale is RN(448 / that), exactly. Unit: one float32 step of P (a largest P
    of 1 at 3 ulp leaves the reachable 1 + 2**-23 out)."""
    near_zero = [-(2.0 ** -k) for k in range(20, 150)] + [-1e-3, -0.1]
    for ulps, largest in ((SPEC_MODEL.exp_ulps, 1 + 2.0 ** -23), (2.0, 1.0), (1.0, 1.0)):
        reach = max(_exp_reach(float(np.float32(x)), ulps)[1] for x in near_zero)
        p_max, scale_lo, _, _ = _p_scale_bounds(ulps)
        assert p_max == reach == largest, (ulps, p_max, reach)
        assert float(scale_lo) == _rn32(Fraction(448) / Fraction(largest))
    assert float(exp_edge(torch.tensor([-(2.0 ** -24)]), 1)) == 1 + 2.0 ** -23            # the edge variant reaches it


# --- x = RN(S - m) ------------------------------------------------------------------------------------

def _check_exp_arguments(arguments) -> None:
    """S and m float32 at binade boundaries and far apart (the float64 difference rounds): the kernel's
    x = RN(S - m) (a float32 subtraction) for every S in [s_lo, s_hi] and m in [m_lo, m_hi] lies inside."""
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(300):
        m = np.float32(rng.choice([1.0, 3.0, 1e6, 2.0 ** 24, 1e-30, 7e-38, 1e30]) * rng.uniform(0.5, 2))
        s = np.float32(m - rng.choice([0.0, 1e-7, 0.3, 1.0, 50.0, 1e6, 1e31]) * rng.uniform(0, 2))
        cases.append((float(s), float(m)))
    cases += [(float(np.float32(2.0 ** 24 + 2)), 1.0), (-1e-30, 1e30), (0.1, 100.0), (-50.0, 1e-30)]
    for s, m in cases:
        s_lo, s_hi = _steps(s, -1), s
        m_lo, m_hi = m, max(_steps(m, 1), s_hi)
        x_lo, x_hi = arguments(*(torch.tensor([v]) for v in (s_lo, s_hi, m_lo, m_hi)))
        for sv in (s_lo, s_hi):
            for mv in (m_lo, m_hi):
                if sv > mv:
                    continue
                x = _rn32(Fraction(sv) - Fraction(mv))
                assert float(x_lo) <= x <= float(x_hi), (sv, mv, x, float(x_lo), float(x_hi))


def test_exp_arguments_hold_the_float32_subtraction():
    _check_exp_arguments(exp_arguments)


@pytest.mark.parametrize("side", ["lo", "hi"])
def test_exp_arguments_one_step_tighter_fail(side):
    """Unit: one float32 step of x."""
    with pytest.raises(AssertionError):
        _check_exp_arguments(_inward(exp_arguments, side))


# --- O / l within 1 ulp, and any "within n ulp" -------------------------------------------------------

def _quotients() -> list[Fraction]:
    """Exact quotients just above and below powers of two (where SPEC's ulp changes), negative ones, and
    ones in float32's subnormal range."""
    out = []
    for k in (-140, -127, -126, -125, -3, 0, 1, 20):
        p = Fraction(2) ** k
        for rel in (Fraction(-1, 2 ** 30), Fraction(1, 2 ** 30), Fraction(1, 2 ** 26), Fraction(-1, 2 ** 26), Fraction(1, 3)):
            out += [p * (1 + rel), -p * (1 + rel)]
    return out + [Fraction(0)]


def _check_within(bounds, ulps: float) -> None:
    for q in _quotients():
        t = mpmath.mpf(q.numerator) / q.denominator
        want_lo, want_hi = _within(t, ulps)
        # The bound's argument: a float64 interval around the exact quotient (as the fold hands it over).
        lo64 = torch.tensor([float(q)], dtype=torch.float64)
        lo64 = torch.nextafter(lo64, torch.tensor(-math.inf, dtype=torch.float64)) if Fraction(float(q)) > q else lo64
        hi64 = torch.tensor([float(q)], dtype=torch.float64)
        hi64 = torch.nextafter(hi64, torch.tensor(math.inf, dtype=torch.float64)) if Fraction(float(q)) < q else hi64
        lo, hi = bounds(lo64, hi64, ulps)
        assert float(lo) <= want_lo and float(hi) >= want_hi, (float(q), float(lo), want_lo, float(hi), want_hi)


@pytest.mark.parametrize("ulps", [1.0, 2.0, 0.5])
def test_within_ulps_holds_every_result_at_binade_edges(ulps):
    _check_within(within_ulps, ulps)
    # ... and is exactly the reference on a point just above a power of two (so one step tighter fails):
    t = torch.tensor([1 + 2.0 ** -40], dtype=torch.float64)
    lo, _ = within_ulps(t, t, ulps)
    assert float(lo) == _within(mpmath.mpf(1) + mpmath.mpf(2) ** -40, ulps)[0]


@pytest.mark.parametrize("side", ["lo", "hi"])
def test_within_ulps_one_step_tighter_fail(side):
    """Unit: one float32 step of the result."""
    with pytest.raises(AssertionError):
        _check_within(_inward(within_ulps, side), 1.0)


# --- the dequant chain (F2) ---------------------------------------------------------------------------

def _check_dequant(bounds) -> None:
    """The three orders of F2, each product rounded to float32, for every float32 raw score in a few steps
    around values at binade edges: inside, and ``softmax_scale`` last; q_scale * k_scale subnormal on some."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        raw = float(np.float32(rng.choice([1.0, -1.0]) * 2.0 ** rng.integers(-20, 30) * rng.choice([1.0, 1 + 2 ** -23, 1 - 2 ** -24, 1.5])))
        # a fifth of the scales tiny, so that q_scale * k_scale (the scales multiplied first) is subnormal
        low = -80 if rng.random() < 0.2 else -12
        q = torch.tensor([float(np.float32(rng.uniform(0.5, 2) * 2.0 ** rng.integers(low, low + 15)))])
        k = torch.tensor([float(np.float32(rng.uniform(0.5, 2) * 2.0 ** rng.integers(-12, 3)))]) if low == -12 else \
            torch.tensor([float(np.float32(rng.uniform(0.5, 2) * 2.0 ** rng.integers(low, low + 15)))])
        sm = torch.tensor(float(np.float32(rng.choice([0.08838834764831845, 1.0, 0.3]))))
        raws = [_steps(raw, s) for s in range(-2, 3)]
        lo, hi = bounds(torch.tensor([raws[0]]), torch.tensor([raws[-1]]), q, k, sm, SPEC_MODEL)
        for stepped in raws:
            r = torch.tensor([stepped])
            for value in ((r * q) * k * sm, (r * k) * q * sm, r * (q * k) * sm):
                assert float(lo) <= float(value) <= float(hi), (r, q, k)


def test_dequant_interval_holds_every_order():
    _check_dequant(dequant_interval)


@pytest.mark.parametrize("side", ["lo", "hi"])
def test_dequant_interval_one_step_tighter_fail(side):
    """Unit: one float32 step of S. The bound is the min and max over the orders at the ends, exactly."""
    with pytest.raises(AssertionError):
        _check_dequant(_inward(dequant_interval, side))


def _check_mm2_scaled(bounds, *, ties_only: bool = False) -> None:
    """MM2's two scales (F2) in each order and multiplied together first, every product rounded to float32
    (numpy's float32 arithmetic, subnormals kept), for float32 O_raw at binade edges and p_scale in
    ``[ps_lo, ps_hi]``: inside. The v_scales put ``p_scale * v_scale`` among the normal floats, and among the
    subnormals at exact ties of its rounding (``p_scale`` a power of two and ``v_scale`` an odd multiple of
    2**-141 make the product an odd multiple of 2**-150: its rounding is off by the full 2**-150), where the
    association's term is all that holds ``O_raw RN(p v)``."""
    rng = np.random.default_rng(12)
    f32 = np.float32
    for _ in range(300):
        o_raw = f32(rng.choice([1.0, -1.0]) * 2.0 ** rng.integers(10, 24) * rng.choice([1.0, 1 + 2 ** -23, 1 - 2 ** -24, 1.5]))
        tie = ties_only or rng.random() < 0.5
        if tie:
            ps_lo = ps_hi = ps = f32(2.0 ** -9)
            vs = f32(int(rng.integers(0, 2 ** 12)) * 2 + 1) * f32(2.0 ** -141)
        else:
            ps_lo, ps_hi = f32(1 / 448), f32(1 / 447.99997)
            ps = f32(rng.choice([ps_lo, ps_hi]))
            vs = f32(rng.uniform(0.5, 2) * 2.0 ** rng.integers(-140, 4))
        lo, hi = bounds(np.array([o_raw], dtype=np.float64), np.array([o_raw], dtype=np.float64), float(ps_lo),
                        float(ps_hi), np.array([vs]), SPEC_MODEL)
        for value in ((o_raw * ps) * vs, (o_raw * vs) * ps, o_raw * (ps * vs)):
            assert float(lo) <= float(value) <= float(hi), (float(o_raw), float(ps), float(vs), float(value), float(lo), float(hi))


def _mm2_inward(side: str):
    """mm2_scaled_interval one float32 step (SPEC §4.1's ulp of the end) tighter on one side."""
    def tighter(*args, **kwargs):
        lo, hi = mm2_scaled_interval(*args, **kwargs)
        if side == "lo":
            return lo + ulp32(lo.abs()), hi
        return lo, hi - ulp32(hi.abs())
    return tighter


def test_mm2_scaled_interval_holds_every_order_and_the_scales_multiplied_first():
    _check_mm2_scaled(mm2_scaled_interval)


@pytest.mark.parametrize("side", ["lo", "hi"])
def test_mm2_scaled_interval_one_step_tighter_fail(side):
    """Unit: one float32 step of the bound's end."""
    with pytest.raises(AssertionError):
        _check_mm2_scaled(_mm2_inward(side))


def test_mm2_scaled_interval_without_all_of_the_associations_term_fails(monkeypatch):
    """Unit: 1% of the term for the scales multiplied together first (stages.scale_product_error), at the
    ties where a product's rounding is off by the full 2**-150."""
    full = stages_module.scale_product_error
    monkeypatch.setattr(stages_module, "scale_product_error", lambda *a: full(*a) * 0.99)
    with pytest.raises(AssertionError):
        _check_mm2_scaled(mm2_scaled_interval, ties_only=True)


# --- directed rounding of an exact sum (the raw score's and MM2's interval ends) -----------------------

def test_directed_rounding_of_an_exact_sum_is_exact():
    """down32_add / up32_add of float64 a, b is RD32 / RU32 of the exact a + b: where fl64(a + b) lands on a
    float32 value the exact sum lies a hair beside (where down32 of it would err), and where the exact sum
    is itself a float32 value (where a rounding that always stepped past would be one step loose). The raw
    score's and MM2's interval ends are so taken. Unit: one float32 step (both directions fail)."""
    cases = [(1.0, -2.0 ** -80), (1.0, 2.0 ** -80), (-1.0, 2.0 ** -80), (3.0, 0.0), (2.0 ** 24, -2.0 ** -40),
             (1.5, 2.0 ** -25), (1e30, -1.0), (0.0, -2.0 ** -160), (5.0, -0.5), (448.0 * 448.0, -0.25)]
    for a, b in cases:
        exact = Fraction(a) + Fraction(b)
        lo = down32_add(torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64))
        hi = up32_add(torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64))
        assert Fraction(float(lo)) <= exact <= Fraction(float(hi)), (a, b)
        assert Fraction(float(torch.nextafter(lo, _INF32))) > exact, (a, b)       # the largest below: tight
        assert Fraction(float(torch.nextafter(hi, _NINF32))) < exact, (a, b)


# --- the online update's weights (the fold, step 6) ----------------------------------------------------

def _kernel_weights(maxima: list[float], side: int) -> tuple[list[float], float]:
    """Each tile's weight as a kernel computes it, and its M: the online update of SPEC §2.3 on one-hot
    tile values (so O's entry j is tile j's weight, with every float32 rounding of the recurrence), every
    exp at the edge F3 allows on ``side``."""
    t = len(maxima)
    m = torch.tensor([maxima[0]])
    o = torch.zeros(t)
    o[0] = 1.0
    for j in range(1, t):
        m_j = torch.tensor([maxima[j]])
        m_new = torch.maximum(m, m_j)
        a, c = exp_edge(m - m_new, side), exp_edge(m_j - m_new, side)
        one_hot = torch.zeros(t)
        one_hot[j] = 1.0
        o = a * o + c * one_hot
        m = m_new
    return o.tolist(), float(m)


def _weight_cases() -> list[list[float]]:
    """Tile maxima whose differences round (small maxima with fine bits beside large ones), sit at
    multiples of ln 2 (factors just above powers of two), underflow (gaps past 104), and lie 1e12 apart
    (where an earlier fold overflowed to NaN)."""
    ln2 = math.log(2)
    cases = [
        [0.1, 80.3, 79.7, 0.2999, 80.30001],
        [float(np.float32(1000 - k * ln2 + 1e-4)) for k in range(8)],
        [float(np.float32(1000 + k * ln2 - 1e-4)) for k in range(8)],
        [-200.0, 0.0, -104.5, -3.0],
        [-1e12, 0.0, 1e12, 5.0],
        [3.0e37, -3.0e37, 1.0, 3.0e37],
        [1.0],
        [0.5, 0.5, 0.5],
    ]
    return [[float(np.float32(m)) for m in maxima] for maxima in cases]


def _check_weights(weights) -> None:
    for maxima in _weight_cases():
        n_tiles = torch.tensor([[float(len(maxima))]], dtype=torch.float64)
        m = torch.tensor([maxima], dtype=torch.float64)
        mu = m.amax(dim=-1, keepdim=True)
        w_lo, w_hi, w_abs = weights(m, m, mu, n_tiles, SPEC_MODEL)
        assert bool(torch.isfinite(w_lo).all() & torch.isfinite(w_hi).all()), maxima
        for side in (-1, 1):
            got, big_m = _kernel_weights(maxima, side)
            frame = mpmath.exp(mpmath.mpf(big_m) - mpmath.mpf(float(mu)))
            for j, w in enumerate(got):
                scaled = mpmath.mpf(w) * frame
                assert float(w_lo[0, j] - w_abs[0, j]) <= scaled <= float(w_hi[0, j] + w_abs[0, j]), (maxima, j, side)


def _kernel_sum(maxima: list[float], values: list[float], side: int) -> tuple[float, float]:
    """The kernel's ``l = sum_j w_j l_j`` through the online update (SPEC §2.3: ``l = a l + c l_j``, every
    product and sum rounded to float32), every exp at the edge F3 allows on ``side``, and its M."""
    m, l = torch.tensor([maxima[0]]), torch.tensor([values[0]])
    for m_raw, l_raw in zip(maxima[1:], values[1:], strict=True):
        m_j, l_j = torch.tensor([m_raw]), torch.tensor([l_raw])
        m_new = torch.maximum(m, m_j)
        l = exp_edge(m - m_new, side) * l + exp_edge(m_j - m_new, side) * l_j
        m = m_new
    return float(l), float(m)


def test_tile_weights_hold_the_kernels_sums_with_their_roundings():
    """The recurrence's own roundings (``(1 + u)**(2T)``): l_j with all 24 bits set, so every product and
    sum rounds, and the maxima given as intervals around them (``mu`` above the kernel's M): the kernel's
    ``l exp(M - mu)`` lies within ``sum_j [w_lo - w_abs, w_hi + w_abs] l_j``, exactly summed."""
    rng = np.random.default_rng(9)
    for maxima in _weight_cases():
        values = [float(np.float32(1 + rng.random())) for _ in maxima]
        for widen_by in (0.0, 0.25):
            m = torch.tensor([maxima], dtype=torch.float64)
            m_lo, m_hi = m - widen_by, m + widen_by
            mu = m_hi.amax(dim=-1, keepdim=True)
            w_lo, w_hi, w_abs = tile_weights(m_lo, m_hi, mu, torch.tensor([[float(len(maxima))]], dtype=torch.float64),
                                             SPEC_MODEL)
            low = sum(mpmath.mpf(float(w_lo[0, j] - w_abs[0, j])) * v for j, v in enumerate(values))
            high = sum(mpmath.mpf(float(w_hi[0, j] + w_abs[0, j])) * v for j, v in enumerate(values))
            for side in (-1, 1):
                got, big_m = _kernel_sum(maxima, values, side)
                scaled = mpmath.mpf(got) * mpmath.exp(mpmath.mpf(big_m) - mpmath.mpf(float(mu)))
                assert low <= scaled <= high, (maxima, widen_by, side)


def test_tile_weights_hold_the_kernels_recurrence_at_its_edges():
    """Finite wherever the maxima lie, and the kernel's weights inside, with every exp at either edge."""
    _check_weights(tile_weights)


def test_tile_weights_without_the_argument_rounding_fail(monkeypatch):
    """Unit: the rounding of the exponent arguments (ARGUMENT_ROUNDING, 2**-24 relative): without it, the
    weights of the tiles whose maxima differ by a rounded amount fall outside."""
    monkeypatch.setattr(fold_module, "ARGUMENT_ROUNDING", 0.0)
    with pytest.raises(AssertionError):
        _check_weights(tile_weights)


# --- float64 slack ------------------------------------------------------------------------------------

@pytest.mark.parametrize("roundings", [1, 2, 3, 7, 64, 1000, 10 ** 6])
def test_float64_slack_covers_its_roundings(roundings):
    """(1 + 2**-53)**k - 1, exactly, is at most float64_slack(k), and more than float64_slack(k - 1) could
    hold (unit: one rounding)."""
    u = Fraction(1, 2 ** 53)
    if roundings > 1000:                                # gamma_k = k u / (1 - k u) >= (1 + u)**k - 1 (Higham 3.1)
        assert Fraction(float64_slack(roundings)) >= roundings * u / (1 - roundings * u)
        return
    worst = (1 + u) ** roundings - 1
    assert Fraction(float64_slack(roundings)) >= worst
    assert Fraction(float64_slack(roundings - 1)) < worst


def test_float64_sum_slack_covers_a_cancelling_dot_product():
    """A float64 dot product of T terms whose partial sums cancel (pairs of large values of opposite sign
    next to small ones): the error, exactly, within float64_sum_slack(T) times the sum of magnitudes."""
    rng = np.random.default_rng(5)
    worst = Fraction(0)
    for t in (2, 3, 17, 65):
        for _ in range(20):
            w = rng.random(t) + 0.5
            o = rng.standard_normal(t) * 10.0 ** rng.integers(-20, 20, size=t)
            w[1::2] = w[0:-1:2]                              # pairs that cancel to a few float64 ulps
            o[1::2] = -o[0:-1:2][: o[1::2].size] * (1 + 2.0 ** -52)
            got = float(torch.from_numpy(w)[None, :] @ torch.from_numpy(o)[:, None])
            exact = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(w, o, strict=True))
            magnitude = sum(abs(Fraction(float(a)) * Fraction(float(b))) for a, b in zip(w, o, strict=True))
            assert abs(exact) < magnitude * Fraction(1, 2 ** 40) or t % 2     # they do cancel (even t)
            assert abs(Fraction(got) - exact) <= Fraction(float64_sum_slack(t)) * magnitude
            worst = max(worst, abs(Fraction(got) - exact) / magnitude)
    assert worst > 0                                          # the sums did round: the check can fail


# --- bf16 rounding of the ends -------------------------------------------------------------------------

def test_bf16_rounding_of_the_ends_holds_every_value_between():
    """RNE to bf16 is monotone: every float32 between lo and hi, at and around bf16 midpoints, rounds into
    [bf16(lo), bf16(hi)] (the envelope rounds its float32 ends so, SPEC §2.4)."""
    mids = torch.tensor([1.0 + 2.0 ** -8, -1.0 - 2.0 ** -8, 3.0 + 2.0 ** -7, 2.0 ** -126 + 2.0 ** -134, 2.0 ** 100 * 1.00390625])
    for mid in mids:
        values = torch.stack([torch.nextafter(mid, _NINF32), mid, torch.nextafter(mid, _INF32)])
        lo, hi = values.min(), values.max()
        b = values.bfloat16().float()
        assert bool(((lo.bfloat16().float() <= b) & (b <= hi.bfloat16().float())).all())
