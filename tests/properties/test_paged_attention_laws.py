"""Laws of FP8 paged attention on the backend under test (--backend): SPEC §2 (semantics),
§3 (quantization of P inside the kernel) and §4 (acceptance). Each test states its law; the law
itself lives in properties/laws.py, and a failure is captured in cases/regressions before it is
reported (the message ends with the replay command)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from properties import laws


@given(data=st.data())
def test_acceptance(backend, cases_for, data):
    """The backend's output is within rtol 1/128, atol 1e-4 of the golden's (SPEC §4); the search
    climbs towards the worst error over tolerance (hypothesis.target)."""
    laws.check("acceptance", backend, data.draw(cases_for, label="case"))


@given(data=st.data())
def test_outputs_finite(backend, cases_for, data):
    """Finite values in every cell the kernel reads give a finite output, whatever the unread
    cells hold (SPEC §2)."""
    laws.check("outputs_finite", backend, data.draw(cases_for, label="case"))


@given(data=st.data())
def test_block_permutation_invariance(backend, cases_for, data):
    """Moving physical blocks and renumbering the block table to match leaves the output
    bit-identical (SPEC §2 item 2: only the table says where a token lives)."""
    case = data.draw(cases_for, label="case")
    laws.check("block_permutation", backend, case, perm_seed=data.draw(st.integers(0, 2**16), label="perm_seed"))


@given(data=st.data())
def test_padding_never_reaches_output(backend, cases_for, data):
    """NaN or huge values in every cell that must not be read (spare blocks, rows past each
    length, q of rows with cur == 0) leave the output bit-identical (SPEC §2 items 2 and 5)."""
    case = data.draw(cases_for, label="case")
    laws.check("garbage_unread", backend, case, fill=data.draw(st.sampled_from(("nan", "huge")), label="fill"))


@given(data=st.data())
def test_gqa_head_duplication(backend, cases_for, data):
    """Repeating each KV head NQ/NKV times (NKV = NQ) gives the grouped output: query head h
    reads KV head h // (NQ/NKV) (SPEC §2 item 2)."""
    laws.check("gqa_repetition", backend, data.draw(cases_for, label="case"))


@given(data=st.data())
def test_s2_tile_and_g_tile_invariance(backend, cases_for, data):
    """Another g_tile gives the same output within SPEC §4; another s2_tile moves it by no more
    than the E4M3 quantization of P in both tile walks allows (SPEC §2 item 3)."""
    case = data.draw(cases_for, label="case")
    c = case.config
    group = c.nq // c.nkv
    s2_tile = data.draw(st.sampled_from([c.block_size * k for k in (1, 2, 4)]), label="other s2_tile")
    g_tile = data.draw(st.sampled_from([None] + [g for g in range(1, group) if group % g == 0]), label="other g_tile")
    laws.check("tile_invariance", backend, case, s2_tile=s2_tile, g_tile=g_tile)


@given(data=st.data())
def test_batch_row_independence(backend, cases_for, data):
    """One batch alone (its q rows, table row, length, v_scale) equals its rows in the batched call
    (SPEC §2: nothing crosses batches)."""
    case = data.draw(cases_for, label="case")
    laws.check("batch_independence", backend, case,
               batch_index=data.draw(st.integers(0, case.config.batch - 1), label="batch_index"))


@given(data=st.data())
def test_causal_positions_equal_shortened_calls(backend, cases_for, data):
    """Query position i of an S1 > 1 call equals an S1 = 1 call with the length shortened to
    cur = max(0, kv_act_seqs[b] - (S1 - 1 - i)) (SPEC §2 item 1)."""
    laws.check("causal_prefix", backend, data.draw(cases_for, label="case"))
