"""golden/envelope/stages.py's lookups and MM2 bounds, against their definitions.

The flip test's boundary distance (step 4), the K columns' grids (step 1's certificate) and MM2's
deviations (step 5) are computed through tables and stacked products for speed; each is held here to
the plain definition it replaces, under both codecs, on values placed at and around the codecs'
rounding boundaries (where a wrong table entry would show), not only on random draws.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pfa_verify import golden
from pfa_verify.golden.envelope.stages import NO_GRID, boundary_distance, column_grid_exponents, mm2_bounds
from pfa_verify.golden.intervals import down32, lowbit, up32

CODECS = [golden.SPEC_CODEC, golden.PYPTO_CALCULATOR_CODEC]


def _near_boundaries(codec: golden.Fp8Codec) -> torch.Tensor:
    """float32 P values whose 448 P lies on, next to and between the codec's rounding boundaries."""
    boundaries = codec.rounding_boundaries().float()
    steps = torch.arange(-3, 4, dtype=torch.int32)
    around = (boundaries.view(torch.int32)[:, None] + steps[None, :]).reshape(-1).view(torch.float32)
    between = torch.rand(4000, generator=torch.Generator().manual_seed(1)) * 1.02 * float(boundaries.max())
    y = torch.cat([around, between, torch.tensor([0.0, 448.0, 1e-30])])
    return y / 448.0


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_boundary_distance_is_the_distance_to_the_nearest_change(codec):
    p = _near_boundaries(codec)
    y = p * torch.tensor(448.0)                      # what boundary_distance reads: RN(448 P)
    distance = boundary_distance(codec, p)
    gap = distance * y.double()                      # the absolute distance
    assert bool((distance >= 0).all())               # no NaN here, and never a boundary on the wrong side
    read = codec.round(y)
    on = (gap == 0) & (y > 0)                        # y is a boundary: just below it reads another value
    assert bool(on.any())
    assert bool((codec.round(torch.nextafter(y[on], torch.tensor(-math.inf))) != read[on]).all())
    finite = torch.isfinite(gap) & (gap > 0)
    # At the float32 values strictly within the distance the value read back cannot change...
    yf = y.double()[finite]
    up, down = torch.tensor(math.inf), torch.tensor(-math.inf)
    highest = torch.nextafter(up32(yf + gap[finite]), down)
    lowest = torch.nextafter(down32(yf - gap[finite]), up).clamp(min=0)
    assert bool((highest.double() >= yf).all()) and bool((lowest.double() <= yf).all())
    assert torch.equal(codec.round(highest), read[finite])
    assert torch.equal(codec.round(lowest), read[finite])
    # ... and at the distance it does, on one side: the bracket is the nearest boundary, not a looser one.
    below = codec.round(torch.nextafter((yf - gap[finite]).float(), torch.tensor(-math.inf)).clamp(min=0))
    above = codec.round((yf + gap[finite]).float())
    assert bool(((below != read[finite]) | (above != read[finite])).all())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_boundary_distance_of_zero_and_nan(codec):
    distance = boundary_distance(codec, torch.tensor([0.0, math.nan]))
    assert distance[0] == math.inf and math.isnan(float(distance[1]))


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("head_dim", [16, 2, 15, 1])
def test_column_grid_exponents_are_the_minimum_over_each_column(codec, head_dim):
    """Against the values themselves: log2 of the smallest lowbit of a column's decoded values (a zero or
    NaN value lies on no grid; a column of them has none: NO_GRID)."""
    rng = np.random.default_rng(head_dim)
    rows = rng.integers(0, 256, size=(3, 7, 2, head_dim), dtype=np.uint8)
    rows[0, 0, 0] = 0                                 # an all-zero column has no grid
    rows[0, 1, 1] = 0x7F                              # nor has an all-NaN one
    values = torch.from_numpy(codec.decode_array(rows))
    grids = torch.where(torch.isfinite(values), lowbit(values), math.inf).amin(dim=-1)
    want = torch.where(torch.isfinite(grids), torch.log2(grids), float(NO_GRID)).to(torch.int8).numpy()
    assert np.array_equal(column_grid_exponents(codec, rows), want)


def test_mm2_bounds_are_the_signed_deviations_and_the_magnitude():
    codec = golden.SPEC_CODEC
    generator = torch.Generator().manual_seed(5)
    shape = (4, 2, 3, 8)                              # [Q, N, R, BS]
    golden_p8 = codec.round(torch.rand(shape, generator=generator) * 448).double()
    p8_lo = torch.where(torch.rand(shape, generator=generator) < 0.3,
                        codec.round((golden_p8 * 0.9).float()).double(), golden_p8)
    p8_hi = torch.where(torch.rand(shape, generator=generator) < 0.3,
                        codec.round((golden_p8 * 1.1).float()).double(), golden_p8)
    p8_lo[1], p8_hi[1] = golden_p8[1], golden_p8[1]   # a block without a flip
    v = codec.round(torch.randn((4, 2, 8, 5), generator=generator) * 50).double()

    def per_tile_sum(x):                              # two blocks per tile
        return x.view(2, 2, *x.shape[1:]).sum(dim=1)

    low, high, magnitude = mm2_bounds(golden_p8, p8_lo, p8_hi, v, per_tile_sum)
    down, up = golden_p8 - p8_lo, p8_hi - golden_p8
    v_pos, v_neg = v.clamp(min=0), (-v).clamp(min=0)
    assert torch.equal(low, per_tile_sum(down @ v_pos + up @ v_neg))
    assert torch.equal(high, per_tile_sum(up @ v_pos + down @ v_neg))
    assert torch.equal(magnitude, per_tile_sum(p8_hi @ v.abs()))
    # Every choice of codes between the ends moves P8 @ v within [-low, +high] of the golden's.
    pick = p8_lo + (p8_hi - p8_lo) * (torch.rand(shape, generator=generator) < 0.5)
    moved = per_tile_sum(pick @ v) - per_tile_sum(golden_p8 @ v)
    assert bool((moved >= -low).all()) and bool((moved <= high).all())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_rounding_boundaries_are_every_change_of_the_value_read_back(codec):
    """codec.rounding_boundaries(), which the flip test's tables are built from: the value read back
    changes at each boundary, and nowhere between two of them: ``round`` is monotone, so the last
    float32 below each boundary reads what the previous boundary reads (0 below the first), and the
    top of the range what the last one reads; random values, too, read what the boundary at or below
    them reads. (A dropped boundary fails the second assertion.)"""
    boundaries = codec.rounding_boundaries().float()
    below = torch.nextafter(boundaries, torch.tensor(-math.inf))
    assert bool((codec.round(below) != codec.round(boundaries)).all())
    previous = torch.cat([torch.zeros(1), boundaries[:-1]])
    assert torch.equal(codec.round(below), codec.round(previous))
    top = 2 * max(codec.max_value, 448.0)
    assert torch.equal(codec.round(torch.tensor([top])), codec.round(boundaries[-1:]))
    x = torch.cat([torch.rand(20000, generator=torch.Generator().manual_seed(7)) * top,
                   torch.rand(20000, generator=torch.Generator().manual_seed(8)) * 2.0 ** -6])
    at_or_below = torch.searchsorted(boundaries, x, right=True) - 1
    start = torch.where(at_or_below >= 0, boundaries[at_or_below.clamp(min=0)], torch.tensor(0.0))
    assert torch.equal(codec.round(x), codec.round(start))
