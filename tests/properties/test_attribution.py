"""properties/attribution.py: grouping of mismatches and the E4M3 rounding-boundary test."""
from __future__ import annotations

import math

import torch

import golden
from properties.attribution import attribute, near_boundary


def _ulp_above(x: float) -> float:
    return float(torch.nextafter(torch.tensor(x, dtype=torch.float32), torch.tensor(math.inf)))


def test_boundaries_of_the_spec_codec_are_its_grid_midpoints():
    b = golden.SPEC_CODEC.rounding_boundaries()
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)          # +0 up to 448
    grid = golden.SPEC_CODEC.decode(codes).double()
    mids = (grid[:-1] + grid[1:]) / 2
    assert len(b) == len(mids) == 126
    # Ties go to the even code: the change is at the midpoint or one float32 ulp above it.
    for got, mid in zip(b.tolist(), mids.tolist()):
        assert got in (mid, _ulp_above(mid)), (got, mid)
    assert float(b[0]) == _ulp_above(2.0 ** -10) and float(b[-1]) == 432.0


def test_boundaries_of_the_calculator_include_its_integer_rounding():
    """The calculator rounds to an integer first (tests/kernels/test_calculator_codec.py), so 0.5,
    1.5, 2.5 ... are where its codes change, and nothing changes below 0.5."""
    b = golden.PYPTO_CALCULATOR_CODEC.rounding_boundaries()
    assert float(b[0]) == _ulp_above(0.5) and float(b[1]) == 1.5
    assert float(b[-1]) == _ulp_above(232.5)                # 232.5 -> 232 (even); above -> 240 (saturated)
    codec = golden.PYPTO_CALCULATOR_CODEC
    below = torch.tensor([float(x) for x in b], dtype=torch.float64)
    steps = codec.encode(below.float()) != codec.encode(torch.nextafter(below.float(), torch.tensor(0.0)))
    assert bool(steps.all()), "each boundary is the first float32 of a new code"


def test_near_boundary_counts_float32_ulps():
    b = golden.SPEC_CODEC.rounding_boundaries()
    m = torch.tensor([1.0625], dtype=torch.float32)   # midpoint of 1.0 and 1.125
    assert bool(near_boundary(m, b))
    assert bool(near_boundary(torch.nextafter(m, torch.tensor(2.0)), b))
    assert not bool(near_boundary(torch.tensor([1.03]), b))


def test_mismatches_are_grouped_by_batch_head_and_tile_walk():
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=40, nq=4, nkv=2, head_dim=16, block_size=16,
                                         s2_tile=16, kv_act_seqs=(0, 35))
    bundle = golden.make_inputs(config, 0)
    mask = torch.zeros(2, 4, 16, dtype=torch.bool)
    mask[1, 2:4, :3] = True      # batch 1, query heads 2 and 3 = kv head 1
    mask[0, 0, 0] = True         # a row with cur == 0
    a = attribute(mask, bundle.kwargs(), s2_tile=16)
    assert a.mismatched == 7 and dict(a.by_batch) == {1: 6, 0: 1} and dict(a.by_kv_head) == {1: 6, 0: 1}
    assert dict(a.by_tile_walk) == {(3, 3): 6, (0, 0): 1} and a.in_cur_zero_rows == 1
    assert a.on_boundary is not None and 0 <= a.on_boundary <= 6
    text = a.render()
    assert text.startswith("7 in batches 1: 6, 0: 1; kv heads 1: 6, 0: 1; rows spanning 3 tiles (last has 3)")
    assert "1 in rows with cur == 0 (must be 0)" in text and "on E4M3 rounding boundaries of P" in text
