"""No example is vacuous: every example a law test draws can make its law fail (properties.search.laws.vacuous),
and vacuous() itself recognises the examples it exists for.

The first test draws, under the profile in force (``ci`` in CI: the same 20 examples per law as the
law tests), from each law's domain before the vacuity filter of properties/search/law_examples.py, and holds
the share the filter has to turn away near zero: the domains, not the filter, keep examples useful."""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from pfa_verify import golden
from pfa_verify.properties.rule import transforms as tf
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import law_examples, laws
from pfa_verify.properties.search import strategies as ps


@pytest.mark.parametrize("law", law_examples.PAGED_LAWS)
def test_the_law_examples_are_not_vacuous(law, monkeypatch):
    seen, vacuous = [], []       # every example the filter judged (kept alive: identity below), the vacuous ones
    real = laws.vacuous

    def recording(name, case, **params):
        why = real(name, case, **params)
        seen.append((name, case, why))
        if why:
            vacuous.append(why)
        return why

    monkeypatch.setattr(law_examples.laws, "vacuous", recording)
    drawn = []

    @settings(max_examples=settings.default.max_examples, database=None)
    @given(law_examples.examples(law))
    def draw(example):
        drawn.append(example)

    draw()
    print(f"{law}: {len(drawn)} examples, {len(vacuous)} of {len(seen)} drawn turned away by the filter")
    # Every example a law test gets went through the vacuity filter, for its own law, and was let
    # through: an examples() that stops filtering, or filters for another law, fails here.
    accepted = [case for name, case, why in seen if name == law and why is None]
    assert drawn and all(any(case is c for c in accepted) for case, _ in drawn), \
        "examples() handed out an example the vacuity filter never accepted"
    assert len(vacuous) <= max(1, len(seen) // 20), "the domains, not the filter, should keep examples useful"


C = golden.PagedAttentionConfig
VACUOUS = [
    ("acceptance", C(batch=2, s1=1, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16, kv_act_seqs=(0, 0)), {}),
    ("gqa_repetition", C(batch=1, s1=1, s2=5, nq=2, nkv=2, head_dim=16, block_size=16, s2_tile=16), {}),
    ("causal_prefix", C(batch=1, s1=1, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16), {}),
    ("batch_independence", C(batch=1, s1=1, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16), {}),
    ("batch_independence", C(batch=2, s1=1, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16,
                             kv_act_seqs=(5, 0)), {"batch_index": 1}),
    ("block_permutation", C(batch=1, s1=1, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16), {}),
    ("garbage_unread", C(batch=1, s1=1, s2=16, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16), {}),
    ("tile_invariance", C(batch=1, s1=1, s2=5, nq=4, nkv=1, head_dim=16, block_size=16, s2_tile=16, g_tile=4),
     {"s2_tile": 16, "g_tile": None}),
]


@pytest.mark.parametrize("law, config, params", VACUOUS, ids=[f"{v[0]}-{k}" for k, v in enumerate(VACUOUS)])
def test_vacuous_examples_are_recognised(law, config, params):
    """Each of these cannot make its law fail (one block cannot move; a full block with no spare one
    leaves nothing unread; g_tile=4 is the whole group of 4, as None)."""
    assert laws.vacuous(law, Case(config), **params) is not None
    wider = config.replace(batch=2, s1=2, nq=4, nkv=2, kv_act_seqs=(config.s2, config.s2), num_blocks=3,
                           g_tile=None)
    good = {"batch_independence": {"batch_index": 0}, "tile_invariance": {"s2_tile": 32, "g_tile": None}}
    assert laws.vacuous(law, Case(wider), **good.get(law, params)) is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=ps.cases_for(None))
def test_the_garbage_laws_config_check_says_what_the_tensors_say(case):
    """garbage_unread's vacuity is read from the config (no inputs built on every draw); it must agree with
    transforms.unread_cells on the case's tensors: some cache cell or query row is left unread."""
    cache_rows, query_rows = tf.unread_cells(case.inputs().tensors())
    unread = bool(cache_rows.any() or query_rows.any())
    assert (laws.vacuous("garbage_unread", case, fill="nan") is None) == unread, case
