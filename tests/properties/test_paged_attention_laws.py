"""Laws of FP8 paged attention on the backend under test (--backend): SPEC §2 (semantics),
§3 (quantization of P inside the kernel) and §4 (acceptance). Each test states its law; the law
itself lives in properties/laws.py, and a failure is captured in cases/regressions before it is
reported (the message ends with the replay command).

Every example can fail: each test draws from its law's domain (GQA with a group of at least 2,
causal positions with S1 >= 2, ...) and ``assume``s away what properties.laws.vacuous still finds
(tests/properties/test_vacuity.py holds the share of such examples at zero)."""
from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from properties import laws

GROUPS = st.sampled_from((2, 4, 3))


def draw_checked(data, strategy, law: str, **params):
    """A case for ``law`` from ``strategy``, assuming the law can fail on it."""
    case = data.draw(strategy, label="case")
    assume(laws.vacuous(law, case, **params) is None)
    return case


@given(data=st.data())
def test_acceptance(check_law, cases_for, data):
    """The backend's output is within rtol 1/128, atol 1e-4 of the golden's (SPEC §4); the search
    climbs towards the worst error over tolerance (hypothesis.target)."""
    check_law("acceptance", draw_checked(data, cases_for(), "acceptance"))


@given(data=st.data())
def test_outputs_finite(check_law, cases_for, data):
    """Finite values in every cell the kernel reads give a finite output, whatever the unread
    cells hold (SPEC §2)."""
    check_law("outputs_finite", draw_checked(data, cases_for(), "outputs_finite"))


@given(data=st.data())
def test_block_permutation_invariance(check_law, cases_for, data):
    """Moving every physical block elsewhere and renumbering the block table to match leaves the
    output bit-identical (SPEC §2 item 2: only the table says where a token lives)."""
    perm_seed = data.draw(st.integers(0, 2**16), label="perm_seed")
    case = draw_checked(data, cases_for(spare_blocks=st.integers(1, 3)), "block_permutation", perm_seed=perm_seed)
    check_law("block_permutation", case, perm_seed=perm_seed)


@given(data=st.data())
def test_padding_never_reaches_output(check_law, cases_for, data):
    """NaN or huge values in every cell that must not be read (spare blocks, rows past each
    length, q of rows with cur == 0) give the output of zeros there, bit for bit (SPEC §2 items 2, 5)."""
    fill = data.draw(st.sampled_from(("nan", "huge")), label="fill")
    case = draw_checked(data, cases_for(spare_blocks=st.integers(1, 3)), "garbage_unread", fill=fill)
    check_law("garbage_unread", case, fill=fill)


@given(data=st.data())
def test_gqa_head_duplication(check_law, cases_for, data):
    """Repeating each KV head NQ/NKV times (NKV = NQ) gives the grouped output: query head h
    reads KV head h // (NQ/NKV) (SPEC §2 item 2)."""
    check_law("gqa_repetition", draw_checked(data, cases_for(group=GROUPS), "gqa_repetition"))


@given(data=st.data())
def test_s2_tile_and_g_tile_invariance(check_law, cases_for, data):
    """At any other (s2_tile, g_tile) the output is the golden's at those tiles (SPEC §2 item 3:
    g_tile only partitions heads, s2_tile moves the result only through P's per-tile quantization)."""
    case = data.draw(cases_for(), label="case")
    c = case.config
    group = c.nq // c.nkv
    choices = [(c.block_size * k, g) for k in (1, 2, 4) for g in [None] + [g for g in range(1, group) if group % g == 0]]
    other = [t for t in choices if laws.vacuous("tile_invariance", case, s2_tile=t[0], g_tile=t[1]) is None]
    assume(other)
    s2_tile, g_tile = data.draw(st.sampled_from(other), label="other (s2_tile, g_tile)")
    check_law("tile_invariance", case, s2_tile=s2_tile, g_tile=g_tile)


@given(data=st.data())
def test_batch_row_independence(check_law, cases_for, data):
    """One batch alone (its q rows, table row, length, v_scale) equals its rows in the batched call
    (SPEC §2: nothing crosses batches)."""
    case = data.draw(cases_for(batch=st.integers(2, 4)), label="case")
    seen = [b for b, n in enumerate(case.config.lengths) if n > 0]
    batch_index = data.draw(st.sampled_from(seen), label="batch_index")
    assume(laws.vacuous("batch_independence", case, batch_index=batch_index) is None)
    check_law("batch_independence", case, batch_index=batch_index)


@given(data=st.data())
def test_causal_positions_equal_shortened_calls(check_law, cases_for, data):
    """Query position i of an S1 > 1 call equals an S1 = 1 call with the length shortened to
    cur = max(0, kv_act_seqs[b] - (S1 - 1 - i)) (SPEC §2 item 1)."""
    check_law("causal_prefix", draw_checked(data, cases_for(s1=st.integers(2, 3)), "causal_prefix"))
