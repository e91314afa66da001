"""golden/intervals.py: outward rounding, ulps, grids, and the any-order sum bounds (SPEC §4.1 F1).

Each bound is held on inputs built to reach it (rounding errors aligned on purpose) and on float32 sums
taken in many orders and trees, which must never exceed it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pfa_verify import golden
from pfa_verify.golden.intervals import down32, down32_add, lowbit, outward_sums, ulp32, up32, up32_add, within_ulps
from pfa_verify.golden.sum_bounds import residue_bound, sum_error_bound


def _tree_sum(terms: np.ndarray, merges: list[int]) -> np.float32:
    """A float32 sum of ``terms`` as a binary tree: ``merges[k]`` picks which neighbouring pair to add next."""
    values = [np.float32(t) for t in terms]
    for pick in merges:
        if len(values) == 1:
            break
        i = pick % (len(values) - 1)
        values[i:i + 2] = [np.float32(values[i] + values[i + 1])]
    while len(values) > 1:
        values[0:2] = [np.float32(values[0] + values[1])]
    return values[0]


def test_outward_rounding_brackets_and_keeps_float32_values():
    x = torch.tensor([1.0, 1 + 2.0 ** -30, -(1 + 2.0 ** -30), 3.0e38, 1e-45, 0.0, -0.0], dtype=torch.float64)
    lo, hi = down32(x), up32(x)
    assert bool((lo.double() <= x).all()) and bool((hi.double() >= x).all())
    assert lo[0] == hi[0] == 1.0
    assert hi[1] == torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)) and lo[1] == 1.0
    assert lo[2] == -torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)) and hi[2] == -1.0


@pytest.mark.parametrize("value", [1.0, 1.5, 2.0 ** -126, 2.0 ** -149, 3.0e38, 448.0, 0.3])
def test_ulp32_is_the_float32_spacing(value):
    x = torch.tensor(value, dtype=torch.float32)
    spacing = torch.nextafter(x, torch.tensor(math.inf)) - x
    assert float(ulp32(x.double())) == float(spacing)


def test_ulp32_of_zero_is_the_smallest_subnormal():
    assert float(ulp32(torch.tensor(0.0, dtype=torch.float64))) == 2.0 ** -149


def test_lowbit_of_every_e4m3_value():
    values = golden.SPEC_CODEC.decode_table[:0x7F]          # the non-negative finite codes
    for v, g in zip(values.tolist(), lowbit(values).tolist(), strict=True):
        if v == 0:
            assert g == math.inf
            continue
        assert (v / g) == int(v / g) and int(v / g) % 2 == 1, (v, g)


def test_plain_bound_is_reached_by_aligned_roundings():
    """1 followed by n - 1 terms of just under half an ulp of 1: sequentially, each addition rounds
    down by almost half an ulp, all the same way: the error reaches (n - 1) / 2 ulp(1), the bound."""
    n = 64
    tiny = np.float32(2.0 ** -24 * (1 - 2.0 ** -10))
    terms = np.array([1.0] + [tiny] * (n - 1), dtype=np.float32)
    exact = float(np.sum(terms.astype(np.float64)))
    computed = _tree_sum(terms, [0] * n)                      # always the leftmost pair: sequential
    error = abs(float(computed) - exact)
    t = torch.tensor(terms, dtype=torch.float64)
    plain = float(sum_error_bound(n, t.abs().sum(), t.abs().sum(), torch.tensor(exact, dtype=torch.float64)))
    sharp = float(residue_bound(t[None, :], t.abs().sum()[None])[0])
    assert error <= sharp <= plain
    assert error >= 0.99 * plain
    # Unit: half an ulp of one addition. With one addition fewer counted, the bound would be exceeded.
    assert error > (n - 2) / 2 * 2.0 ** -23


@settings(max_examples=60, deadline=None)
@given(codes=st.lists(st.integers(0, 0xFE).filter(lambda c: c & 0x7F != 0x7F), min_size=2, max_size=40),
       other=st.lists(st.integers(0, 0xFE).filter(lambda c: c & 0x7F != 0x7F), min_size=40, max_size=40),
       merges=st.lists(st.integers(0, 1000), max_size=40), big=st.booleans())
def test_any_tree_of_e4m3_products_stays_within_both_bounds(codes, other, merges, big):
    """Products of E4M3 values (exact in float32), with or without two outlier terms in front: any
    tree of float32 additions errs by no more than the residue bound, which is no more than the plain one."""
    table = golden.SPEC_CODEC.decode_table.double()
    a = table[codes]
    b = table[other[:len(codes)]]
    products = a * b
    if big:
        products = torch.cat([torch.tensor([448.0 * 448.0, 448.0 * 448.0], dtype=torch.float64), products])
    exact = float(products.sum())
    magnitude = max(float(products.clamp(min=0).sum()), float((-products).clamp(min=0).sum()))
    abs_sum = float(products.abs().sum())
    n = products.numel()
    plain = float(sum_error_bound(n, torch.tensor(magnitude, dtype=torch.float64), torch.tensor(abs_sum, dtype=torch.float64),
                                  torch.tensor(exact, dtype=torch.float64)))
    sharp = float(residue_bound(products[None, :], torch.tensor([magnitude], dtype=torch.float64))[0])
    for order in (np.arange(n), np.arange(n)[::-1], np.argsort(-products.abs().numpy())):
        computed = _tree_sum(products.numpy()[order], merges)
        assert abs(float(computed) - exact) <= sharp <= plain + 1e-300


def test_residue_bound_is_a_fraction_of_the_plain_one_on_outlier_channels():
    """Two outlier products near 2**17.6 and 126 small ones on coarse grids (outlier_channels): every
    addition near 4e5 rounds to 2**-5, but only the small products with finer bits can make it err."""
    cfg = golden.PagedAttentionConfig(batch=1, s1=1, s2=8, nq=1, nkv=1, distribution="outlier_channels")
    bundle = golden.make_inputs(cfg, 0)
    q = golden.SPEC_CODEC.decode(bundle.q.view(torch.uint8), torch.float64)[0, 0]
    k = golden.SPEC_CODEC.decode(bundle.k_cache.view(torch.uint8), torch.float64)[int(bundle.block_table[0, 0]), :8, 0]
    products = q[None, :] * k
    exact, abs_sum = products.sum(-1), products.abs().sum(-1)
    magnitude = (abs_sum + exact.abs()) / 2
    plain = sum_error_bound(128, magnitude, abs_sum, exact)
    sharp = residue_bound(products, magnitude)
    assert bool((sharp <= plain / 4).all()), (sharp, plain)


def test_a_sum_on_one_grid_below_two_to_the_24_is_exact():
    """The exactness certificate: integers below 2**24 add exactly in float32 in any order."""
    terms = torch.tensor([2.0 ** 20, 3.0, -7.0, 1.0, 2.0 ** 21], dtype=torch.float64)
    assert float(residue_bound(terms[None, :], terms.abs().sum()[None])[0]) == 0.0


def test_lowbit_matches_the_integer_definition_on_random_float32_patterns():
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (20000,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    x = x[torch.isfinite(x)]
    got = lowbit(x)
    for value, power in zip(x.double().tolist(), got.tolist(), strict=True):
        if value == 0:
            assert power == math.inf
            continue
        mantissa, exponent = math.frexp(abs(value))
        significand = int(mantissa * 2 ** 53)
        want = math.ldexp(significand & -significand, exponent - 53)
        assert power == want, (value, power, want)
    # inf and NaN read as their bits say (exponent field 255): 2**128 for inf.
    specials = torch.tensor([0x7F800000, 0x7FC00000, 0x7F800001], dtype=torch.int32).view(torch.float32)
    assert lowbit(specials).tolist() == [2.0 ** 128, 2.0 ** 127, 2.0 ** 105]


def test_outward_rounding_is_the_neighbouring_float32_at_every_kind_of_value():
    """down32 / up32 step on the bit patterns; held to numpy's nextafter on float64 values just beside
    float32 values of every kind: zeros of both signs, subnormals, the smallest normal, powers of two,
    the largest finite, past it (inf), negative ones, and random patterns; NaN stays NaN."""
    specials = np.array([0.0, -0.0, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -126, 1.0, -1.0, 2.0, 3.4028234663852886e38,
                         -3.4028234663852886e38], dtype=np.float32)
    rng = np.random.default_rng(4)
    patterns = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f32 = np.concatenate([specials, patterns[np.isfinite(patterns)]]).astype(np.float32)
    base = f32.astype(np.float64)
    with np.errstate(over="ignore"):
        beside = (base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf))
    for x in beside:
        lo, hi = down32(torch.from_numpy(x)).numpy(), up32(torch.from_numpy(x)).numpy()
        with np.errstate(over="ignore"):
            near = x.astype(np.float32)
        with np.errstate(over="ignore"):
            want_lo = np.where(near.astype(np.float64) > x, np.nextafter(near, np.float32(-np.inf)), near)
            want_hi = np.where(near.astype(np.float64) < x, np.nextafter(near, np.float32(np.inf)), near)
        assert np.array_equal(lo.view(np.uint32), want_lo.view(np.uint32))
        assert np.array_equal(hi.view(np.uint32), want_hi.view(np.uint32))
    assert math.isnan(float(down32(torch.tensor([math.nan], dtype=torch.float64))[0]))
    assert float(down32(torch.tensor([3.5e38], dtype=torch.float64))[0]) == 3.4028234663852886e38
    assert float(up32(torch.tensor([-3.5e38], dtype=torch.float64))[0]) == -3.4028234663852886e38
    assert float(up32(torch.tensor([3.5e38], dtype=torch.float64))[0]) == math.inf


def _edge_operands(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 pairs (a, b) where directed rounding of a + b is delicate: a float32 value plus a tiny b
    of either sign (the exact sum's side decides), exact sums, zeros of both signs, subnormals, the float32
    overflow edge, infinities; the rest random."""
    rng = np.random.default_rng(seed)
    f32 = rng.standard_normal(count).astype(np.float32).astype(np.float64)
    tiny = rng.choice([0.0, 2.0 ** -80, -(2.0 ** -80), 2.0 ** -149, -(2.0 ** -149), 1e-300], count)
    a = np.where(rng.random(count) < 0.5, f32, rng.standard_normal(count) * 2.0 ** rng.integers(-140, 120, count))
    b = np.where(rng.random(count) < 0.5, tiny, rng.standard_normal(count))
    specials = [(0.0, -0.0), (-0.0, 0.0), (3.4028234663852886e38, 1e31), (-3.4028234663852886e38, -1e31),
                (math.inf, 1.0), (1.0, -math.inf), (2.0 ** -149, -(2.0 ** -150)), (1.0, 2.0 ** -24)]
    a[:len(specials)], b[:len(specials)] = zip(*specials, strict=True)
    return a, b


@pytest.mark.parametrize("count", [37, 5000])        # one pass for both ends, and two (above _PAIRED_MOST)
def test_outward_sums_are_the_two_directed_sums_bit_for_bit(count):
    """pfa_verify.golden.intervals.outward_sums (both ends in one pass, direction per element) against down32_add and
    up32_add (one end each, direction a constant): the same float32 bits, also with broadcast operands."""
    a_lo, b_lo = _edge_operands(count, 1)
    a_hi, b_hi = _edge_operands(count, 2)
    t = [torch.from_numpy(x) for x in (a_lo, b_lo, a_hi, b_hi)]
    lo, hi = outward_sums(*t)
    assert np.array_equal(lo.numpy().view(np.uint32), down32_add(t[0], t[1]).numpy().view(np.uint32))
    assert np.array_equal(hi.numpy().view(np.uint32), up32_add(t[2], t[3]).numpy().view(np.uint32))
    column = torch.from_numpy(b_lo[:1]).reshape(1)                  # a scalar-like operand, broadcast
    lo, hi = outward_sums(t[0], column, t[2], column)
    assert np.array_equal(lo.numpy().view(np.uint32), down32_add(t[0], column).numpy().view(np.uint32))
    assert np.array_equal(hi.numpy().view(np.uint32), up32_add(t[2], column).numpy().view(np.uint32))


@pytest.mark.parametrize("ulps", [1.0, 2.0, 0.5])
def test_within_ulps_gives_the_same_bits_in_one_pass_and_in_two(ulps):
    """within_ulps pairs both ends in one pass up to _PAIRED_MOST elements and runs them apart above: a
    large array and its small pieces give the same bits, at binade edges and zeros included."""
    rng = np.random.default_rng(3)
    edges = np.concatenate([[0.0, -0.0, 2.0 ** -149, 2.0 ** -126, 1.0, 0.5, -1.0, 2.0 ** 127]] * 10)
    lo = np.concatenate([edges, rng.standard_normal(6000) * 2.0 ** rng.integers(-130, 120, 6000)])
    hi = lo + np.abs(rng.standard_normal(lo.size)) * np.where(rng.random(lo.size) < 0.3, 0.0, 1e-3) * np.abs(lo)
    whole = within_ulps(torch.from_numpy(lo), torch.from_numpy(hi), ulps)
    pieces = [within_ulps(torch.from_numpy(lo[k:k + 100]), torch.from_numpy(hi[k:k + 100]), ulps)
              for k in range(0, lo.size, 100)]
    for end in (0, 1):
        joined = np.concatenate([p[end].numpy() for p in pieces])
        assert np.array_equal(whole[end].numpy().view(np.uint32), joined.view(np.uint32))


def test_float32_steps_give_the_same_bits_below_and_above_the_nextafter_threshold():
    """Small arrays step a float32 by one masked nextafter, large ones on the bit patterns (the threshold
    _NEXTAFTER_MOST): the directed sums, both ends in one pass and apart, and down32/up32, on delicate
    operands (zeros of both signs, subnormals, the overflow edge, infinities) give the same bits whole
    (patterns) and in pieces of 50 (nextafter)."""
    a, b = (torch.from_numpy(x) for x in _edge_operands(3000, 5))     # 50 per end, paired: 100 <= 1024 < 3000
    pieces = range(0, 3000, 50)
    for whole, piece in ((lambda: down32_add(a, b), lambda k: down32_add(a[k:k + 50], b[k:k + 50])),
                         (lambda: up32_add(a, b), lambda k: up32_add(a[k:k + 50], b[k:k + 50])),
                         (lambda: outward_sums(a, -b.abs(), a, b.abs())[0],
                          lambda k: outward_sums(a[k:k + 50], -b[k:k + 50].abs(), a[k:k + 50], b[k:k + 50].abs())[0]),
                         (lambda: outward_sums(a, -b.abs(), a, b.abs())[1],
                          lambda k: outward_sums(a[k:k + 50], -b[k:k + 50].abs(), a[k:k + 50], b[k:k + 50].abs())[1]),
                         (lambda: down32(a + b), lambda k: down32(a[k:k + 50] + b[k:k + 50])),
                         (lambda: up32(a + b), lambda k: up32(a[k:k + 50] + b[k:k + 50]))):
        joined = np.concatenate([piece(k).numpy() for k in pieces])
        assert np.array_equal(whole().numpy().view(np.uint32), joined.view(np.uint32))


def _residue_bound_walking_every_row_at_every_spacing(products: torch.Tensor, magnitude: torch.Tensor, levels: int = 24):
    """residue_bound as golden/sum_bounds.py's docstring states it, every row's residues taken at every spacing and the
    walk's steps selected by where (the implementation reads each row at the spacings its walk uses only)."""
    n = products.shape[-1]
    grid = lowbit(products.float()).amin(dim=-1).numpy()
    top = ulp32(magnitude * (1 + n * 2.0 ** -23)).numpy()
    gaps = torch.log2(torch.from_numpy(top / np.minimum(grid, 1e300))).numpy()
    own = np.minimum(np.floor(np.maximum(gaps, 0.0)) + 1, levels).astype(np.int64)
    levels = int(own.max())
    terms = products.numpy()
    spacings = top[None, :] * np.exp2(np.arange(-levels + 1, 1, dtype=np.float64))[:, None]
    residues = np.empty_like(spacings)
    for j in range(levels):
        at = spacings[j][:, None]
        residues[j] = np.abs(terms - np.rint(terms / at) * at).sum(axis=-1)
    finest = top * np.exp2(-own.astype(np.float64))
    total = np.where(finest <= grid, 0.0, (n - 1) * finest / 2)
    for j in range(levels):
        cap = (n - 1) * spacings[j] / 2
        walked = np.minimum(cap, total + np.minimum(cap, residues[j] + total))
        total = np.where(j >= levels - own, np.where(spacings[j] <= grid, 0.0, walked), total)
    return total


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_residue_bound_reads_each_row_where_its_walk_does_and_no_more(rows):
    """residue_bound orders the rows by the spacing their walk starts reading at and computes the residues
    of those read only, in blocks: the same bits as every row at every spacing, on rows of many grids (E4M3
    products scaled by powers of two), all-zero rows, rows exact on their grid, and rows of one term."""
    rng = np.random.default_rng(11)
    codes = torch.from_numpy(rng.integers(0, 256, (rows, 2, 128), dtype=np.uint8))
    values = golden.SPEC_CODEC.decode(codes, torch.float64)
    values = torch.where(values.isnan(), 0.0, values)
    products = values[:, 0] * values[:, 1] * torch.from_numpy(np.exp2(rng.integers(-12, 12, (rows, 1))).astype(np.float64))
    products[::5] = 0.0
    products[1::6, 1:] = 0.0
    products[2::7] = torch.round(products[2::7])
    magnitude = (products.abs().sum(-1) + products.sum(-1).abs()) / 2 * torch.from_numpy(rng.choice([1.0, 1.5, 64.0], rows))
    got = residue_bound(products, magnitude).numpy()
    want = _residue_bound_walking_every_row_at_every_spacing(products, magnitude)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))
