"""golden/envelope/builder.py and golden.at12.qk_matmul_scale_envelope: the acceptance envelope (SPEC §4.2).

Sound: the golden always lies inside, and so does every conforming variant (kernels/conforming: sums
in other orders and trees, Kahan, fused multiply-adds, other scale orders, exp up to 3 ulp (at F3's edges,
either way, and either way at random within a row) and division 1 ulp off, and vertex kernels putting every
raw score at an end of its interval). Tight: where no E4M3 code of
P can flip, the envelope is within a bf16 step of the golden and the rule is SPEC §4's tolerance.
"""
from __future__ import annotations

import dataclasses
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pfa_verify.golden.envelope.builder as builder_module
import pfa_verify.golden.envelope.fold as fold_module
import pfa_verify.golden.envelope.stages as stages_module
from pfa_verify import golden, kernels
from pfa_verify.golden.at12 import qk_matmul_scale_envelope
from pfa_verify.golden.envelope import EnvelopeBuilder
from pfa_verify.golden.envelope.fold import signed_weighted_sum
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.intervals import float64_sum_slack
from pfa_verify.golden.model import declared_model
from pfa_verify.golden.validate import SCORE_LIMIT
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.kernels.conforming import VARIANTS, ConformingKernel
from pfa_verify.kernels.conforming.arithmetic import exp_edge
from pfa_verify.properties.search import strategies as ps

ALL_DISTRIBUTIONS = golden.DISTRIBUTIONS
_SMALL = dict(max_examples=12, deadline=None)


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values lie from a to b (both bf16), by their ordered bit patterns."""
    def key(x):
        bits = x.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)
    return (key(b) - key(a)).abs()


@settings(**_SMALL)
@given(case=ps.cases(), codec=st.sampled_from([golden.SPEC_CODEC, golden.PYPTO_CALCULATOR_CODEC]))
def test_golden_lies_inside_and_is_the_golden(case, codec):
    kwargs = case.inputs().kwargs()
    env = golden.paged_attention_envelope(**kwargs, codec=codec)
    out = golden.paged_attention_fp8(**kwargs, codec=codec)
    assert torch.equal(env.golden.view(torch.int16), out.view(torch.int16))
    finite = torch.isfinite(out.float())
    assert bool((env.inside(out) | ~finite).all())




@pytest.mark.parametrize("distribution", ALL_DISTRIBUTIONS)
def test_conforming_variants_lie_inside(distribution):
    """Conforming variants (kernels/conforming, vertex kernels included) on kernel-sized cases of every
    distribution: inside, element by element. (tox -e mutants runs the full cross product, more examples
    and a search for escapes: pfa-verify conforming.)"""

    @settings(max_examples=4, deadline=None)
    @given(case=ps.cases_for(KERNEL_SHAPES, distribution=(distribution,), batch=st.integers(1, 2)),
           variant=st.sampled_from(sorted(VARIANTS)))
    def check(case, variant):
        kwargs = case.inputs().kwargs()
        env = golden.paged_attention_envelope(**kwargs)
        out = kernels.get_backend(f"conforming:{variant}").paged_attention_fp8(**kwargs)
        outside = ~env.inside(out) & torch.isfinite(env.golden.float())
        assert not bool(outside.any()), f"{int(outside.sum())} elements of {variant} outside the envelope"

    check()


#: The variants whose exp reaches SPEC §4.1 F3's 3 ulp: at the edges (each way, and either way at random), or
#: 3 steps from the correctly rounded value stopped at the edge.
THREE_ULP_VARIANTS = sorted(n for n, v in VARIANTS.items() if v.exp_edge or abs(v.exp_ulps) == 3)


def test_the_3_ulp_variants_are_the_expected_ones():
    assert THREE_ULP_VARIANTS == ["edges-down", "edges-either", "edges-mixed", "edges-up", "exp-down-div-down",
                                  "exp-up-div-up", "vertex-mixed"]


@pytest.mark.parametrize("distribution", ALL_DISTRIBUTIONS)
def test_the_3_ulp_variants_lie_inside(distribution):
    """Every variant whose exp sits at F3's 3 ulp, on every distribution (kernel-sized cases, one envelope for
    all of them): inside, element by element."""

    @settings(max_examples=3, deadline=None)
    @given(case=ps.cases_for(KERNEL_SHAPES, distribution=(distribution,), batch=st.integers(1, 2)))
    def check(case):
        kwargs = case.inputs().kwargs()
        env = golden.paged_attention_envelope(**kwargs)
        for variant in THREE_ULP_VARIANTS:
            out = kernels.get_backend(f"conforming:{variant}").paged_attention_fp8(**kwargs)
            outside = ~env.inside(out) & torch.isfinite(env.golden.float())
            assert not bool(outside.any()), f"{int(outside.sum())} elements of {variant} outside the envelope"

    check()


def test_no_flip_means_the_tolerance_alone():
    """Uniform data where no code of P can flip: the envelope never reaches past SPEC §4's tolerance (the
    rule is the tolerance alone), and nearly everywhere it is within one bf16 step of the golden: the
    float32 result's own few-ulp width (wider only where MM2's sum cancels to a tiny output)."""
    config = golden.PagedAttentionConfig(batch=2, s1=2, s2=300, nq=4, nkv=2, s2_tile=256, kv_act_seqs=(300, 129))
    kwargs = golden.make_inputs(config, 3).kwargs()
    env = golden.paged_attention_envelope(**kwargs)
    assert env.flippable == 0
    g = env.golden.float()
    tol = 1e-4 + g.abs() / 128
    assert bool(((env.hi.float() - g) <= tol).all() and ((g - env.lo.float()) <= tol).all())
    steps = torch.maximum(_bf16_steps(env.lo, env.golden), _bf16_steps(env.golden, env.hi))
    assert float((steps <= 1).float().mean()) > 0.99


def test_exact_model_is_the_golden_up_to_its_own_rounding():
    config = golden.PagedAttentionConfig(batch=1, s1=1, s2=200, nq=2, nkv=1, distribution="outlier_channels")
    kwargs = golden.make_inputs(config, 1).kwargs()
    env = golden.paged_attention_envelope(**kwargs, model=golden.EXACT_MODEL)
    spec = golden.paged_attention_envelope(**kwargs)
    assert bool((_bf16_steps(env.lo, env.hi) <= 2).all())
    assert bool((env.lo.float() >= spec.lo.float()).all() and (env.hi.float() <= spec.hi.float()).all())


def test_outlier_channels_flip_codes_and_integer_grid_outliers_do_not_move_s():
    """On outlier channels (logits near 180) a legal float32 order moves S by enough to flip codes of P;
    with every Q and K code an integer (outlier_grid) MM1 is exact in any order and only F2's one-ulp
    scale reorderings remain."""
    base = dict(batch=2, s1=1, s2=384, nq=4, nkv=1, s2_tile=256, kv_act_seqs=(384, 300))
    channels = golden.paged_attention_envelope(**golden.make_inputs(
        golden.PagedAttentionConfig(**base, distribution="outlier_channels"), 0).kwargs())
    grid = golden.paged_attention_envelope(**golden.make_inputs(
        golden.PagedAttentionConfig(**base, distribution="outlier_grid"), 0).kwargs())
    assert channels.flippable > 4 * max(grid.flippable, 1)


def test_degenerate_logits_are_reported():
    config = golden.PagedAttentionConfig(batch=1, s1=1, s2=128, nq=2, nkv=1, head_dim=128, distribution="wide")
    found = 0
    for seed in range(20):
        found += golden.paged_attention_envelope(**golden.make_inputs(config, seed).kwargs()).degenerate_rows
    assert found > 0


@pytest.mark.parametrize("codec", [golden.SPEC_CODEC, golden.PYPTO_CALCULATOR_CODEC], ids=lambda c: c.name)
def test_codec_round_is_monotone(codec):
    """The envelope reads the reachable codes of P as those between the codes of its two ends: that
    needs decode(encode(y)) non-decreasing in y >= 0, checked on every float32 pattern step of 2**8
    up to 2 * 448 and around every code's value."""
    bits = torch.arange(0, int(torch.tensor(896.0).view(torch.int32)), 256, dtype=torch.int32)
    values = torch.cat([bits.view(torch.float32), codec.decode_table[:0x7F].abs()]).sort().values
    values = torch.cat([torch.nextafter(values, torch.tensor(0.0)), values, torch.nextafter(values, torch.tensor(1e9))]).sort().values
    read = codec.round(values)
    assert bool((read[1:] >= read[:-1]).all())


def test_bad_model_is_a_type_error():
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16), 0).kwargs()
    with pytest.raises(TypeError, match=r"model must be a golden.model.ConformanceModel"):
        golden.paged_attention_envelope(**kwargs, model="spec")


def _far_apart_tiles(scale: float) -> tuple[dict, float]:
    """A row of two tiles: ordinary positive scores, then one large negative raw score per row times a K
    scale ``scale`` (the second tile's scores are ``raw * scale``, raw about -3e6): tile maxima as far
    apart as the scale makes them. Returns the case and |raw|."""
    d, codec = 16, golden.SPEC_CODEC
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=32, nq=1, nkv=1, head_dim=d,
                                                            block_size=16, s2_tile=16, kv_act_seqs=(32,)), 0).kwargs()
    kwargs.update(softmax_scale=1.0, q_scale=torch.ones_like(kwargs["q_scale"]))
    q = torch.tensor([448.0] * (d - 1) + [2.0 ** -9])
    kwargs["q"] = codec.to_fp8(q.reshape(1, 1, d))
    first, second = kwargs["block_table"][0].tolist()
    k, v = codec.from_fp8(kwargs["k_cache"]), codec.from_fp8(kwargs["v_cache"])
    k[first] = k[first].abs() * 0.01                       # tile 1: ordinary positive scores
    k[second] = -q                                          # tile 2: one large negative raw score per row
    k[second, :, :, 0] = -416.0
    v[second] = v[second].abs() + 1
    kwargs.update(k_cache=codec.to_fp8(k), v_cache=codec.to_fp8(v), v_scale=torch.ones_like(kwargs["v_scale"]))
    raw = float((q.double() * codec.from_fp8(kwargs["k_cache"])[second, 0, 0].double()).sum())
    k_scale = torch.full_like(kwargs["k_scale"], 1e-6)
    k_scale[second] = scale
    return {**kwargs, "k_scale": k_scale}, abs(raw)


@pytest.mark.parametrize("logits", [1e6, 1e9, 1.3e10, 1e12, 1e20, 1e30])
def test_the_envelope_is_finite_however_far_apart_the_tile_maxima(logits):
    """The second tile's scores at -1e6 ... -1e30 (a first version of the fold was NaN from about -1.2e10
    on: its bound on a rounded exponent argument, exp(2**-24 |m_j - mu|), overflowed float64): finite, and
    holding the golden, the vertex kernels and the edge variants."""
    _, raw = _far_apart_tiles(1.0)
    case, _ = _far_apart_tiles(float(np.float32(logits / raw)))
    env = golden.paged_attention_envelope(**case)
    assert bool(torch.isfinite(env.lo.float()).all() & torch.isfinite(env.hi.float()).all())
    assert bool(env.inside(env.golden).all())
    for variant in ("vertex-low", "vertex-high", "edges-up", "edges-down"):
        out = kernels.get_backend(f"conforming:{variant}").paged_attention_fp8(**case)
        assert bool(env.inside(out).all()), variant


def test_scores_that_can_leave_float32_are_refused_naming_the_entries():
    """SPEC §4.1 Domain: D * 448**2 * q_scale * k_scale * softmax_scale >= 2**127 for a cell that is read is
    outside SPEC §2: the golden (both routes) and the envelope refuse it, naming the two scale entries. One
    float32 step below the limit the envelope is finite and holds the vertex kernels (whose raw scores
    reach the ends of their intervals)."""
    limit = SCORE_LIMIT / (16 * 448.0 ** 2)               # D = 16, q_scale = softmax_scale = 1
    at = float(np.float32(limit))
    at = at if at >= limit else float(np.nextafter(np.float32(at), np.float32(np.inf)))
    below = float(np.nextafter(np.float32(at), np.float32(0)))
    case, _ = _far_apart_tiles(at)
    second = int(case["block_table"][0, 1])
    for refuse in (golden.paged_attention_fp8, golden.paged_attention_fp8_loop, golden.paged_attention_envelope):
        with pytest.raises(ValueError, match=rf"q_scale\[0, 0, 0\]=1 with k_scale\[{second}, \d+, 0, 0\]=.* outside float32"):
            refuse(**case)
    case, _ = _far_apart_tiles(below)
    env = golden.paged_attention_envelope(**case)
    assert bool(torch.isfinite(env.lo.float()).all() & torch.isfinite(env.hi.float()).all())
    for variant in ("vertex-low", "vertex-high"):
        out = kernels.get_backend(f"conforming:{variant}").paged_attention_fp8(**case)
        assert bool(env.inside(out).all()), variant
    # A scale past the limit in a cell no kernel reads (the unused rows of the second block) is garbage.
    case["k_scale"] = case["k_scale"].clone()
    case["k_scale"][int(case["block_table"][0, 0]), :, 0, 0] = 1e-6
    unread = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=32, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16, kv_act_seqs=(20,),
                                                            garbage="huge"), 0).kwargs()
    assert float(unread["k_scale"].max()) >= 3e38
    golden.paged_attention_envelope(**unread)


def test_at12_scores_that_can_leave_float32_are_refused():
    q = golden.SPEC_CODEC.to_fp8(torch.ones(2, 16))
    scale = torch.ones(2, 1)
    with pytest.raises(ValueError, match=r"q_scale\[1, 0\]=1e\+30 with k_scale\[0, 0\]=1e\+30"):
        golden.qk_matmul_scale(q, q, q_scale=scale * torch.tensor([[1.0], [1e30]]), k_scale=scale * 1e30, scale=1.0)


@pytest.mark.parametrize("name", ["q_scale", "k_scale", "v_scale"])
def test_a_negative_dequant_scale_is_a_value_error(name):
    """SPEC §3's dequant scales are >= 0 and the envelope's dequant steps rely on it (a negative one turns
    the ends of an interval around): refused, naming the entry; garbage in unread cells is not, NaN or
    negative."""
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=3, s1=2, s2=32, nq=2, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16, kv_act_seqs=(32, 1, 0),
                                                            garbage="nan"), 0).kwargs()
    assert torch.isnan(kwargs["k_scale"]).any()
    golden.paged_attention_envelope(**kwargs)
    # Unread: the K scales make_inputs filled with NaN; q_scale's query rows with cur == 0 (batch 1's
    # first position sees 1 - 1 tokens, batch 2 none: rows 2, 4, 5); batch 2's v_scale (no tokens).
    unread_rows = torch.tensor([False, False, True, False, True, True])[:, None, None]
    unread_batches = torch.tensor([False, False, True])[:, None, None]
    golden.paged_attention_envelope(**{**kwargs, "k_scale": torch.where(torch.isnan(kwargs["k_scale"]), -1.0, kwargs["k_scale"]),
                                       "q_scale": torch.where(unread_rows, -1.0, kwargs["q_scale"]),
                                       "v_scale": torch.where(unread_batches, -1.0, kwargs["v_scale"])})
    kwargs[name] = kwargs[name].clone()
    first = (int(kwargs["block_table"][0, 0]), 0) if name == "k_scale" else (0,)
    kwargs[name][first].view(-1)[0] = -0.25
    with pytest.raises(ValueError, match=rf"{name}\[{first[0]}, .*\]=-0.25 must be >= 0"):
        golden.paged_attention_envelope(**kwargs)
    q = golden.SPEC_CODEC.to_fp8(torch.randn(4, 16))
    scale = torch.full((4, 1), 0.25)
    with pytest.raises(ValueError, match=r"k_scale\[2, 0\]=-0.25 must be >= 0"):
        qk_matmul_scale_envelope(q, q, q_scale=scale, k_scale=scale * torch.tensor([[1.0], [1.0], [-1.0], [1.0]]))


@pytest.mark.parametrize("field, value, named", [("sums", "truncating", "sums='truncating'"),
                                                  ("exp_ulps", 63, r"exp_ulps=63 \(F3 allows 3\)"),
                                                  ("exp_ulps", 3.5, r"exp_ulps=3.5 \(F3 allows 3\)"),
                                                  ("div_ulps", 1.5, r"div_ulps=1.5 \(F3 allows 1\)")])
def test_a_wider_model_is_refused_naming_the_field(field, value, named):
    """SPEC §4.1: a backend may declare a narrower model, never a wider one; a wider one is refused with an
    error naming the field (a UsageError: one line, exit 2 on the command line), wherever it is read."""

    wide = golden.ConformanceModel(name="loose", **{field: value})
    assert not wide.conforming
    with pytest.raises(UsageError, match=named):
        wide.check_narrower()

    class Declares:
        name, model = "my.module:factory", wide
    with pytest.raises(UsageError, match=rf"backend 'my.module:factory' declares a model wider than SPEC §4.1 .*{named}"):
        declared_model(Declares())
    narrower = golden.ConformanceModel(name="tight", exp_ulps=1, div_ulps=0.5, sums="exact", scale_order="spec")
    Declares.model = narrower
    assert declared_model(Declares()) is narrower
    numpy_like = golden.ConformanceModel(name="numpy's float32 exp", exp_ulps=3)      # F3's own bound: conforming
    Declares.model = numpy_like
    assert numpy_like.conforming and declared_model(Declares()) is numpy_like
    Declares.model = "spec"
    with pytest.raises(UsageError, match=r"declares model='spec'; expected a golden.model.ConformanceModel"):
        declared_model(Declares())


# --- AT-12 -------------------------------------------------------------------------------------------

@settings(**_SMALL)
@given(case=ps.at12_cases(), variant=st.sampled_from(sorted(VARIANTS)), fp8=st.booleans())
def test_at12_conforming_variants_lie_inside(case, variant, fp8):
    q, k = case.operands()
    kwargs = dict(q=q, k=k)
    if fp8:
        (q8, qs), (k8, ks) = golden.quantize_per_token(q.float()), golden.quantize_per_token(k.float())
        kwargs = dict(q=q8, k=k8, q_scale=qs, k_scale=ks)
    g, lo, hi = qk_matmul_scale_envelope(**kwargs)
    assert bool(((lo <= g) & (g <= hi)).all())
    out = kernels.get_backend(f"conforming:{variant}").qk_matmul_scale(**kwargs)
    assert bool(((lo <= out) & (out <= hi)).all())


def test_at12_cancellation_is_where_the_tolerance_is_not_sound():
    """A score that cancels (two products of 2**24 of opposite sign, and 30 small ones): summing the small
    ones into the large partial sums (an order F1 allows) moves it by about 1 per addition, far past
    1e-4 + |g| / 128; the envelope holds that result, the tolerance alone would call it wrong."""
    big = 2.0 ** 12
    small = [1.0 + 2.0 ** -7] * 30
    q = torch.tensor([[big, big] + small], dtype=torch.bfloat16)
    k = torch.tensor([[big, -big] + small], dtype=torch.bfloat16)
    g, lo, hi = qk_matmul_scale_envelope(q, k, scale=1.0)
    reverse = kernels.get_backend("conforming:reverse-upstream").qk_matmul_scale(q, k, scale=1.0)
    big_first = kernels.get_backend("conforming:forward").qk_matmul_scale(q[:, [0, 2, 3, 4, 1]], k[:, [0, 2, 3, 4, 1]], scale=1.0)
    assert float(g) == np.float32(float(q.double() @ k.double().T))
    assert bool(((lo <= reverse) & (reverse <= hi)).all())
    g5, lo5, hi5 = qk_matmul_scale_envelope(q[:, [0, 2, 3, 4, 1]], k[:, [0, 2, 3, 4, 1]], scale=1.0)
    assert bool(((lo5 <= big_first) & (big_first <= hi5)).all())
    assert abs(float(big_first) - float(g5)) > 1e-4 + abs(float(g5)) / 128


def test_fold_sum_bound_holds_under_cancellation():
    """The fold's float64 weighted sums over 65 tiles (golden.envelope.fold.signed_weighted_sum) with the slack
    fold adds, ``float64_sum_slack(T)`` times the magnitude: the exact rational sum lies inside, on terms built
    to cancel (pairs of large values of opposite sign with weights one ulp apart) and on random ones.
    What it can catch: a slack far too small (1 * 2**-53 fails). It cannot tell the derived count from a
    few units less: BLAS's sums stay far from the worst case; the derivation is float64_sum_slack's."""

    rng = np.random.default_rng(7)
    tiles = 65
    worst = 0.0
    cancelled = []
    for trial in range(40):
        o = rng.standard_normal((tiles, 3)) * 10.0 ** rng.integers(-3, 30, size=(tiles, 3))
        pw = np.nextafter(np.exp(-rng.random(tiles) * 5), 2.0)
        if trial % 2 == 0:        # cancelling: o at tile 2k, -o at 2k + 1, the two weights one ulp apart
            o[1::2] = -o[0:-1:2]
            o[-1] = 0.0                                 # 65 tiles: the last has no partner
            pw[1::2] = pw[0:-1:2]
        nw = np.nextafter(pw, 0.0) if trial % 2 == 0 else np.exp(-rng.random(tiles) * 5)
        got, magnitude = signed_weighted_sum(torch.from_numpy(pw), torch.from_numpy(nw), torch.from_numpy(o))
        if trial % 2 == 0:
            cancelled.append(float((got.abs() / magnitude).max()))
        slack = float64_sum_slack(tiles) * magnitude
        for d in range(3):
            exact = sum(Fraction(float(pw[t])) * Fraction(float(max(o[t, d], 0.0))) +
                        Fraction(float(nw[t])) * Fraction(float(min(o[t, d], 0.0))) for t in range(tiles))
            error = abs(Fraction(float(got[d])) - exact)
            assert error <= Fraction(float(slack[d])), (trial, d, float(error), float(slack[d]))
            if slack[d] > 0:
                worst = max(worst, float(error / Fraction(float(slack[d]))))
    assert worst > 0                                   # the sums did round: the check can fail
    assert max(cancelled) < 1e-6                       # and the cancelling ones did cancel


@pytest.mark.parametrize("distribution", ALL_DISTRIBUTIONS)
def test_an_envelope_built_for_some_rows_is_the_full_one_there(distribution):
    """pfa_verify.golden.paged_attention_envelope(rows=...): bit-identical to the full envelope on the output rows it
    was built for (the rule builds only those, properties.rule.acceptance; each row as a case of its own with
    S1 = 1 and its visible length), NaN on the others, on every distribution (S1 up to 3: causal rows)."""

    @settings(max_examples=4, deadline=None)
    @given(case=ps.cases_for(KERNEL_SHAPES, distribution=(distribution,), batch=st.integers(2, 4)), data=st.data())
    def check(case, data):
        kwargs = case.inputs().kwargs()
        full = golden.paged_attention_envelope(**kwargs)
        count = kwargs["q"].shape[0]
        mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=count, max_size=count), label="rows"))
        part = golden.paged_attention_envelope(**kwargs, rows=mask)
        assert part.rows == tuple(int(i) for i in mask.nonzero().reshape(-1))
        for mine, whole in ((part.golden, full.golden), (part.lo, full.lo), (part.hi, full.hi)):
            assert torch.equal(mine[mask].view(torch.int16), whole[mask].view(torch.int16))
            assert bool(torch.isnan(mine[~mask].float()).all())
    check()


def test_bad_rows_are_named():
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=2, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16), 0).kwargs()
    with pytest.raises(TypeError, match="rows must be a bool tensor"):
        golden.paged_attention_envelope(**kwargs, rows=[0])
    with pytest.raises(ValueError, match=r"rows has shape \(3,\); expected \(2,\)"):
        golden.paged_attention_envelope(**kwargs, rows=torch.ones(3, dtype=torch.bool))


@pytest.mark.parametrize("k_scale", [1.2345e5, 1.2345e9])
def test_the_envelope_is_finite_where_the_row_max_is_uncertain_by_thousands_of_logits(k_scale):
    """Scores near 2e10 (far inside SPEC §4.1's domain): the row max is uncertain by thousands of logits,
    L's lower bound of step 6 underflows to 0 (a first version then divided 0 by 0: NaN bounds, so the
    tolerance alone judged). Step 8 bounds the row: finite, holding the golden, the vertex kernels and the
    edge variants."""
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16), 0).kwargs()
    kwargs.update(k_scale=torch.full_like(kwargs["k_scale"], k_scale), q_scale=torch.full_like(kwargs["q_scale"], 1.1),
                  softmax_scale=0.3)
    env = golden.paged_attention_envelope(**kwargs)
    assert env.degenerate_rows == 1
    assert bool(torch.isfinite(env.lo.float()).all() & torch.isfinite(env.hi.float()).all())
    assert bool(env.inside(env.golden).all())
    for variant in ("vertex-low", "vertex-high", "vertex-mixed", "edges-up", "edges-down"):
        out = kernels.get_backend(f"conforming:{variant}").paged_attention_fp8(**kwargs)
        assert bool(env.inside(out).all()), variant


def test_the_sum_of_l_holds_a_token_whose_wide_interval_reaches_the_max():
    """Step 6's bound on a tile's l (EnvelopeBuilder.denominator): a token whose score may lie anywhere in
    [m - 2**24, m] may still be the max, with P = 1. A first version dropped such terms (an argument-rounding
    factor past 1/2) from L's upper end and gave 1.0000005 where two tokens at m give 2."""

    builder = types.SimpleNamespace(exp_rel=golden.SPEC_MODEL.exp_ulps * 2.0 ** -23, model=golden.SPEC_MODEL)
    m = 1.0e7
    s_lo = torch.tensor([[m - 2.0 ** 24, m - 1.0]], dtype=torch.float32)
    s_hi = torch.tensor([[m, m]], dtype=torch.float32)
    m_lo, m_hi = s_lo.amax(-1, keepdim=True).double(), s_hi.amax(-1, keepdim=True).double()
    e_lo, e_hi = torch.exp(s_lo.double() - m_hi), torch.exp(s_hi.double() - m_lo)
    l_lo, l_hi, _ = EnvelopeBuilder.denominator(builder, s_lo, s_hi, m_lo, m_hi, e_lo, e_hi, torch.tensor([[True, True]]))
    assert float(l_lo) <= 1.0 and float(l_hi) >= 2.0


class _UpNearZero(ConformingKernel):
    """A conforming kernel (SPEC §4.1 F3, each exp chosen on its own): exp at F3's upper edge for x in
    [-2**-24, 0) (where 3 ulp reach 1 + 2**-23, above exp(0) = 1), at its lower edge elsewhere."""

    def __init__(self) -> None:
        super().__init__(VARIANTS["forward"])

    def _exp(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= -(2.0 ** -24), exp_edge(x, 1), exp_edge(x, -1))


def _p_scale_case() -> dict:
    """One row of three tokens with scores 0.75, 0.75 - 2**-24 (x = -2**-24: a 3-ulp exp may return
    1 + 2**-23, so the kernel's P scale is RN(448 / (1 + 2**-23)) = 448 - 2**-14) and 0.75 - 610145 * 2**-24,
    whose golden 448 P is 432.00006, one float32 above the E4M3 boundary 432 (416 | 448): the 3-ulp exp at
    its lower edge times the lowered scale gives 431.99994, code 416. V reads only the third token."""
    codec = golden.SPEC_CODEC
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16, kv_act_seqs=(3,)), 0).kwargs()
    q, k, v = torch.zeros(1, 1, 16), torch.zeros(1, 16, 1, 16), torch.zeros(1, 16, 1, 16)
    q[..., 0], k[0, :3, 0, 0], v[0, 2, 0, 0] = 1.0, 1.0, 1.0
    k_scale = torch.ones(1, 16, 1, 1)
    k_scale[0, :3, 0, 0] = torch.tensor([0.75, 0.75 - 2.0 ** -24, 0.75 - 610145 * 2.0 ** -24])
    kwargs.update(q=codec.to_fp8(q), k_cache=codec.to_fp8(k), v_cache=codec.to_fp8(v), k_scale=k_scale,
                  q_scale=torch.ones_like(kwargs["q_scale"]), v_scale=torch.ones_like(kwargs["v_scale"]), softmax_scale=1.0)
    return kwargs


def test_a_p_above_one_lowers_the_p_scale_and_flips_a_code(monkeypatch):
    """SPEC §4.1 F3 at 3 ulp: an exp of an x just below 0 may return 1 + 2**-23 > exp(0), so the P scale of a
    conforming kernel may be one rounding below 448 (golden.envelope.builder._p_scale_bounds). Together with
    a 3-ulp exp at its lower edge that flips a code the golden keeps, and moves the output by 7%, far past
    the tolerance: the envelope holds it, exactly at its lower end. Units, each one too tight: the envelope
    of a 2-ulp model (F3 before it admitted numpy's exp), and a 3-ulp envelope whose P scale stays 448 (the
    largest P taken as 1), both leave the kernel out."""
    kwargs = _p_scale_case()
    g = golden.paged_attention_fp8(**kwargs).float()
    out = _UpNearZero().paged_attention_fp8(**kwargs)
    assert float((out.float() - g).abs().max()) > 1e-4 + float(g.abs().max()) / 128
    env = golden.paged_attention_envelope(**kwargs)
    assert env.flippable == 1 and bool(env.inside(out).all())
    assert torch.equal(env.lo.float()[0, 0, 0], out.float()[0, 0, 0])
    narrower = golden.paged_attention_envelope(**kwargs, model=dataclasses.replace(golden.SPEC_MODEL, exp_ulps=2.0))
    assert not bool(narrower.inside(out).all())
    at_448 = builder_module._p_scale_bounds(2.0)
    monkeypatch.setattr(builder_module, "_p_scale_bounds", lambda _ulps: at_448)
    assert not bool(golden.paged_attention_envelope(**kwargs).inside(out).all())


def _subnormal_scale_product_case() -> dict:
    """One row that sees one token, V = 448 on every channel, and a v_scale per channel that puts the kernel's
    p_scale * v_scale (p_scale = RN(1 / 448)) near (j + 1/2) 2**-149: a float32 subnormal whose rounding is
    off by nearly 2**-150, times O_raw = 448**2. The output is a bf16 subnormal a few steps above 0."""
    codec = golden.SPEC_CODEC
    kwargs = golden.make_inputs(golden.PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                            block_size=16, s2_tile=16, kv_act_seqs=(1,)), 0).kwargs()
    q, k, v = torch.zeros(1, 1, 16), torch.zeros(1, 16, 1, 16), torch.zeros(1, 16, 1, 16)
    q[..., 0], k[0, 0, 0, 0], v[0, 0, 0, :] = 1.0, 1.0, 448.0
    p_scale = float(torch.reciprocal(torch.tensor(448.0)))
    v_scale = torch.tensor([float(np.float32((j + 0.5) * 2.0 ** -149 / p_scale)) for j in range(16)]).reshape(1, 1, 16)
    kwargs.update(q=codec.to_fp8(q), k_cache=codec.to_fp8(k), v_cache=codec.to_fp8(v), q_scale=torch.ones_like(kwargs["q_scale"]),
                  k_scale=torch.ones_like(kwargs["k_scale"]), v_scale=v_scale, softmax_scale=1.0)
    return kwargs


def test_the_scales_multiplied_first_are_held_where_their_product_is_subnormal(monkeypatch):
    """docs/spec.md F2: MM2's O_raw * (p_scale * v_scale) conforms. Where that product is a float32 subnormal,
    its rounding moves the output by up to |O_raw| 2**-150: here a bf16 step or more on every channel, the
    only error of the fused variant (kernels.conforming's pairwise-fused). Inside the envelope on every
    channel; without the association's term (golden.envelope.stages.scale_product_error) outside on every
    one: the term is what holds it."""
    kwargs = _subnormal_scale_product_case()
    fused = kernels.get_backend("conforming:pairwise-fused").paged_attention_fp8(**kwargs)
    assert not torch.equal(fused.view(torch.int16), golden.paged_attention_fp8(**kwargs).view(torch.int16))
    assert bool(golden.paged_attention_envelope(**kwargs).inside(fused).all())
    for module in (stages_module, fold_module):
        monkeypatch.setattr(module, "scale_product_error", lambda ps_lo, vs, model: np.zeros_like(np.asarray(vs, dtype=np.float64)))
    assert not bool(golden.paged_attention_envelope(**kwargs).inside(fused).any())


def test_the_scales_multiplied_first_are_held_on_degenerate_rows(monkeypatch):
    """The same freedom on rows whose scores are uncertain by more than a logit (step 8's hulls,
    golden.envelope.fold.tile_hull): "wide" logits, and v_scales that make p_scale * v_scale a float32
    subnormal near a rounding tie. The fused variant lies inside; with the hull's share of the
    association's term taken out (the per-tile bound keeps its own), some elements fall outside."""
    config = golden.PagedAttentionConfig(batch=1, s1=1, s2=128, nq=2, nkv=1, head_dim=128, distribution="wide")
    kwargs = golden.make_inputs(config, 0).kwargs()
    p_scale = float(torch.reciprocal(torch.tensor(448.0)))
    kwargs["v_scale"] = torch.tensor([float(np.float32((j % 16 + 0.5) * 2.0 ** -149 / p_scale))
                                      for j in range(128)]).reshape(1, 1, 128)
    fused = kernels.get_backend("conforming:pairwise-fused").paged_attention_fp8(**kwargs)
    env = golden.paged_attention_envelope(**kwargs)
    assert env.degenerate_rows > 0 and bool(env.inside(fused).all())
    monkeypatch.setattr(fold_module, "scale_product_error", lambda ps_lo, vs, model: np.zeros_like(np.asarray(vs, dtype=np.float64)))
    assert not bool(golden.paged_attention_envelope(**kwargs).inside(fused).all())
