"""No example is vacuous: every example a law test draws can make its law fail (properties.laws.vacuous),
and vacuous() itself recognises the examples it exists for.

The first test runs every paged-attention law test (tests/properties/test_paged_attention_laws.py)
with the law replaced by a recorder, under the profile in force (``ci`` in CI: the same 20 examples
per law as the real run), and holds the share of vacuous examples, and of examples turned away by
``assume``, at zero: the strategies draw from each law's domain, not by luck."""
from __future__ import annotations

import collections

import pytest
from hypothesis import assume as hypothesis_assume

import golden
import test_paged_attention_laws as bindings
from properties import laws
from properties import strategies as ps
from properties.case import Case


def test_the_law_tests_draw_no_vacuous_example(monkeypatch):
    recorded, rejected = [], collections.Counter()

    def record(name, case, **params):
        recorded.append((name, case, params))

    def counting_assume(condition):
        if not condition:
            rejected["assume"] += 1
        return hypothesis_assume(condition)

    monkeypatch.setattr(bindings, "assume", counting_assume)
    for test in (getattr(bindings, n) for n in dir(bindings) if n.startswith("test_")):
        test(check_law=record, cases_for=lambda **narrowing: ps.cases_for(None, **narrowing))
    per_law = collections.Counter(name for name, _, _ in recorded)
    vacuous = [(name, case, why) for name, case, params in recorded if (why := laws.vacuous(name, case, **params))]
    print(f"{len(recorded)} examples over {len(per_law)} laws ({dict(per_law)}); {len(vacuous)} vacuous; "
          f"{rejected['assume']} turned away by assume")
    assert len(per_law) == 8 and not vacuous, vacuous[:3]
    assert rejected["assume"] <= len(recorded) // 20, "the strategies, not assume, should keep examples in domain"


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
