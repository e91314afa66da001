"""properties/diagnosis/walks.py: the stage a row's seen prefix points to, on counts built here (no kernel): a walk's end
is named the tile walk only where no length slip gives the same count."""
from __future__ import annotations

from pfa_verify import golden
from pfa_verify.properties.diagnosis.walks import prefix_stage, tile_ends


def _config(lengths, *, s1, block_size=128, s2_tile=128):
    return golden.PagedAttentionConfig(batch=len(lengths), s1=s1, s2=max(*lengths, 1), nq=2, nkv=1, head_dim=16,
                                       block_size=block_size, s2_tile=s2_tile, kv_act_seqs=tuple(lengths))


def _seen(config, counts):
    """shifts for rows (b, i) -> seen count (exact), with their visible length (SPEC §2.1)."""
    s1 = config.s1
    return {(b, i): (n, n, max(0, config.lengths[b] - (s1 - 1 - i))) for (b, i), n in counts.items()}


def test_tile_ends_are_the_multiples_of_s2_tile_beside_a_length_and_one_tile_short_of_a_full_one():
    assert tile_ends(300, 128) == {256, 384} and tile_ends(256, 128) == {128, 256} and tile_ends(5, 128) == {128}


def test_a_full_last_tile_dropped_is_the_tile_walk():
    c = _config((256, 100), s1=1)
    stage, words = prefix_stage(_seen(c, {(0, 0): 128}), c, [256, 100], right={1})
    assert stage == "the tile walk", words


def test_counts_a_length_slip_gives_as_well_are_not_the_tile_walk():
    """Rows that all see their first row's length (the causal position mixed up), a batch walking another
    batch's length, rows that see the batch's whole length: each end is also a multiple of s2_tile (block
    and tile of 128), and none is named the tile walk."""
    c = _config((130,), s1=3)                                # rows see 128, 129, 130; all see row 0's 128
    stage, _ = prefix_stage(_seen(c, {(0, 1): 128, (0, 2): 128}), c, [130], right=set())
    assert stage != "the tile walk"
    c = _config((128, 100), s1=1)                            # batch 1 walks batch 0's 128
    stage, _ = prefix_stage(_seen(c, {(1, 0): 128}), c, [128, 100], right={0})
    assert stage != "the tile walk"
    c = _config((256,), s1=4)                                # every row sees the batch's 256 (no causal mask)
    stage, words = prefix_stage(_seen(c, {(0, i): 256 for i in range(3)}), c, [256], right=set())
    assert stage == "visible length" and "the causal offset dropped" in words, words
    c = _config((256, 128), s1=3)                            # batch 0's rows all see 128: batch 1's length too
    stage, words = prefix_stage(_seen(c, {(0, i): 128 for i in range(3)}), c, [256, 128], right={1})
    assert stage is None and "first 128 tokens whatever their visible length" in words, words


def test_one_batch_one_token_off_is_no_batch_length():
    """(40, 32) with blocks of 16: batch 0 sees 41, batch 1 right: a mask one token off on partial blocks is
    as likely as a length read wrong: no name; 200 tokens off is that batch's length."""
    c = _config((40, 32), s1=1, block_size=16, s2_tile=32)
    assert prefix_stage(_seen(c, {(0, 0): 41}), c, [40, 32], right={1})[0] is None
    c = _config((300, 32), s1=1, block_size=16, s2_tile=32)
    stage, words = prefix_stage(_seen(c, {(0, 0): 44}), c, [300, 32], right={1})
    assert stage == "lengths and paging" and "read right" in words, words
