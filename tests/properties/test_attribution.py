"""properties/rule/attribution.py: where mismatches concentrate."""
from __future__ import annotations

import torch

from pfa_verify import golden
from pfa_verify.properties.rule.attribution import attribute


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
    text = a.render()
    assert text.startswith("7 in batches 1: 6, 0: 1; kv heads 1: 6, 0: 1; rows spanning 3 tiles (last has 3)")
    assert text.endswith("; 1 in rows with cur == 0 (must be 0)")


def test_rows_are_placed_by_their_causal_visible_length():
    """S1 > 1: row (b, i) sees cur = max(0, kv_act_seqs[b] - (S1 - 1 - i)) tokens (SPEC §2 item 1), so
    the same batch's rows fall in different tile walks and the first ones in cur == 0."""
    config = golden.PagedAttentionConfig(batch=1, s1=3, s2=33, nq=2, nkv=1, head_dim=16, block_size=16,
                                         s2_tile=16, kv_act_seqs=(17,))
    bundle = golden.make_inputs(config, 0)
    mask = torch.zeros(3, 2, 16, dtype=torch.bool)
    mask[0, 0, 0] = True          # i = 0: cur = 15, one tile of 15
    mask[2, 1, :2] = True         # i = 2: cur = 17, two tiles, the last with 1 token
    a = attribute(mask, bundle.kwargs(), s2_tile=16)
    assert dict(a.by_tile_walk) == {(2, 1): 2, (1, 15): 1} and a.in_cur_zero_rows == 0
    late = golden.PagedAttentionConfig(batch=1, s1=3, s2=33, nq=2, nkv=1, head_dim=16, block_size=16,
                                       s2_tile=16, kv_act_seqs=(1,))
    mask = torch.zeros(3, 2, 16, dtype=torch.bool)
    mask[:, 0, 0] = True          # cur = 0, 0, 1
    a = attribute(mask, golden.make_inputs(late, 0).kwargs(), s2_tile=16)
    assert a.in_cur_zero_rows == 2 and dict(a.by_tile_walk) == {(0, 0): 2, (1, 1): 1}
