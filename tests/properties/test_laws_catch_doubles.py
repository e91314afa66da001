"""Each law catches the wrong backend it exists for, on every example of its domain (a law that
cannot fail on the example it drew is a defect; one that passes a wrong backend is too), and a failure
shrinks to the example that explains it."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from doubles import HalveAtWideTiles, ReadsTheNextColumn
from hypothesis import assume, find, given, settings
from hypothesis import strategies as st

from pfa_verify import golden
from pfa_verify.properties.search import laws
from pfa_verify.properties.search import strategies as ps


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
    # ... and outside the acceptance envelope, which on degenerate rows (logits near 1e6, README: the
    # acceptance envelope, step 8) is the hull of the V rows that can matter, where a half may still lie.
    assume(golden.paged_attention_envelope(**alt.inputs().kwargs()).degenerate_rows == 0)
    laws.run("tile_invariance", HalveAtWideTiles(), case)                         # same tiles: passes
    with pytest.raises(AssertionError, match="At s2_tile="):
        laws.run("tile_invariance", HalveAtWideTiles(), case, s2_tile=wide * c.block_size)


def test_a_block_table_bug_shrinks_to_the_table_that_explains_it():
    """The block table is drawn by Hypothesis and carried in the config, so a table bug shrinks through
    it. Pinned shrink target for a backend that reads logical block j through column j + 1: two batches
    of one token each in the identity layout, one column: batch 0 reads the -1 past its row (clamped to
    block 0, its own block, by luck) and batch 1 reads block 0 instead of block 1. (Before, tables came
    from make_inputs' seed: the shrunk case was B=1, 17 tokens, seed 0, with whatever table that seed
    shuffled, [[1, 0]], shown nowhere in the case.)"""
    def differs(case):       # the cheap form of the acceptance law's failure (checked on the result below)
        kwargs = case.inputs().kwargs()
        expected = golden.paged_attention_fp8(**kwargs)      # first: the double may write into its inputs
        return not torch.equal(ReadsTheNextColumn().paged_attention_fp8(**kwargs).view(torch.int16),
                               expected.view(torch.int16))

    # capacity=64 keeps every example small (the shrink runs the double and the golden ~700 times).
    case = find(ps.cases_for(None, capacity=64), differs, settings=settings(max_examples=500, database=None,
                                                                             derandomize=True))
    c = case.config
    assert (c.batch, c.lengths, c.block_size, c.max_blocks, c.num_blocks) == (2, (1, 1), 16, 1, 2)
    assert c.block_table == ((0,), (1,)) and case.inputs().block_table.tolist() == [[0], [1]]
    with pytest.raises(AssertionError, match=r"Kernel output vs golden not close .*\n.*\n(.*\n)*Attribution: all \d+ in batch 1"):
        laws.run("acceptance", ReadsTheNextColumn(), case)
    # Why two rows: the first row alone owns block 0, where the double's clamped -1 lands, and passes.
    alone = c.replace(batch=1, kv_act_seqs=(1,), num_blocks=1, block_table=((0,),))
    laws.run("acceptance", ReadsTheNextColumn(), dataclasses.replace(case, config=alone))
