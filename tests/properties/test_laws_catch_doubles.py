"""Each law catches the wrong backend it exists for, on every example of its domain (a law that
cannot fail on the example it drew is a defect; one that passes a wrong backend is too)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import golden
from doubles import HalveAtWideTiles
from properties import laws
from properties import strategies as ps


@given(case=ps.cases_for(None), wide=st.sampled_from((2, 4)))
def test_tile_invariance_kills_a_backend_that_halves_the_output_at_other_tiles(case, wide):
    """Before: the law bounded |out(alt) - out| by a worst-case P-quantization sum (median 1.8x |out|),
    so a backend whose output at the other s2_tile is exactly half the right value passed on about a
    third of the examples. Now the output at the other tiles is held to the golden's there."""
    c = case.config
    case = dataclasses.replace(case, config=c.replace(s2_tile=c.block_size))      # the double is right here
    assume(laws.vacuous("tile_invariance", case, s2_tile=wide * c.block_size) is None)
    # Halving is visible only where |out| / 2 exceeds SPEC §4's atol: the law must see such an element.
    alt = dataclasses.replace(case, config=case.config.replace(s2_tile=wide * c.block_size))
    assume(float(golden.paged_attention_fp8(**alt.inputs().kwargs()).float().abs().max()) > 1e-3)
    laws.run("tile_invariance", HalveAtWideTiles(), case)                         # same tiles: passes
    with pytest.raises(AssertionError, match="At s2_tile="):
        laws.run("tile_invariance", HalveAtWideTiles(), case, s2_tile=wide * c.block_size)
