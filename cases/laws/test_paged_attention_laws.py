"""Laws of FP8 paged attention on the backend under test (--backend): SPEC §2 (semantics),
§3 (quantization of P inside the kernel) and §4 (acceptance). Each test states its law; the law
itself lives in properties/search/laws.py and its examples in properties/search/law_examples.py (the law's domain:
every example can make it fail). A failure is captured in the regressions folder before it is
reported (the message ends with the replay command)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pfa_verify.cases.laws import check


@given(data=st.data())
def test_acceptance(check_law, examples_for, data):
    """The backend's output is within rtol 1/128, atol 1e-4 of the golden's (SPEC §4); the search
    climbs towards the worst error over tolerance (hypothesis.target)."""
    check(check_law, examples_for, data, "acceptance")


@given(data=st.data())
def test_outputs_finite(check_law, examples_for, data):
    """Finite values in every cell the kernel reads give a finite output, whatever the unread
    cells hold (SPEC §2)."""
    check(check_law, examples_for, data, "outputs_finite")


@given(data=st.data())
def test_block_permutation_invariance(check_law, examples_for, data):
    """Moving every physical block elsewhere and renumbering the block table to match leaves the
    output bit-identical (SPEC §2 item 2: only the table says where a token lives)."""
    check(check_law, examples_for, data, "block_permutation")


@given(data=st.data())
def test_padding_never_reaches_output(check_law, examples_for, data):
    """NaN or huge values in every cell that must not be read (spare blocks, rows past each
    length, q of rows with cur == 0) give the output of zeros there, bit for bit (SPEC §2 items 2, 5)."""
    check(check_law, examples_for, data, "garbage_unread")


@given(data=st.data())
def test_gqa_head_duplication(check_law, examples_for, data):
    """Repeating each KV head NQ/NKV times (NKV = NQ) gives the grouped output: query head h
    reads KV head h // (NQ/NKV) (SPEC §2 item 2)."""
    check(check_law, examples_for, data, "gqa_repetition")


@given(data=st.data())
def test_s2_tile_and_g_tile_invariance(check_law, examples_for, data):
    """At any other (s2_tile, g_tile) the output is the golden's at those tiles (SPEC §2 item 3:
    g_tile only partitions heads, s2_tile moves the result only through P's per-tile quantization)."""
    check(check_law, examples_for, data, "tile_invariance")


@given(data=st.data())
def test_batch_row_independence(check_law, examples_for, data):
    """One batch alone (its q rows, table row, length, v_scale) equals its rows in the batched call
    (SPEC §2: nothing crosses batches)."""
    check(check_law, examples_for, data, "batch_independence")


@given(data=st.data())
def test_causal_positions_equal_shortened_calls(check_law, examples_for, data):
    """Query position i of an S1 > 1 call equals an S1 = 1 call with the length shortened to
    cur = max(0, kv_act_seqs[b] - (S1 - 1 - i)) (SPEC §2 item 1)."""
    check(check_law, examples_for, data, "causal_prefix")
