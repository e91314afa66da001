"""properties/rule/ledger.py: the one ledger of known facts (kinds case, domain and survivor), its rules,
and that the ledger as committed names only what exists."""
from __future__ import annotations

import pytest
from hypothesis import Phase, find, settings
from hypothesis.errors import NoSuchExample

from pfa_verify import golden, kernels
from pfa_verify.cases.data import regressions
from pfa_verify.kernels.mutants import MUTANTS
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.search import law_examples

CONFIG = golden.PagedAttentionConfig(batch=1, s1=3, s2=5, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16)


def test_the_committed_ledger_names_only_what_exists():
    """Every case id has a file in cases/regressions/, every survivor is a mutant of the catalog."""
    ledger.check(regression_ids=regressions.shipped_ids(), mutants=MUTANTS, where="cases/regressions/")
    assert set(ledger.survivors()) <= set(MUTANTS)


def test_the_known_survivor_is_in_the_ledger_at_both_levels():
    assert ledger.survivors("golden") == ("softmax_scale_before_dequant",)
    assert ledger.survivors("sim") == ("sim/softmax_scale_before_dequant",)
    assert "SPEC §4.1" in ledger.survivor("sim/softmax_scale_before_dequant").reason
    assert ledger.survivor("causal_offset_ignored") is None


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kind="case", reason="flaky on the simulator", ids=("abc",)), ValueError, "must cite where it is argued"),
    (dict(kind="case", reason="flaky on the simulator, issue 7", ids=("abc",)), ValueError, r"a SPEC section \(e.g."),
    (dict(kind="bug", reason="SPEC §4.1", ids=("abc",)), ValueError, r"kind='bug' must be one of"),
    (dict(kind="case", reason="SPEC §4.1"), ValueError, r"a 'case' finding names what it matches by ids alone"),
    (dict(kind="case", reason="SPEC §4.1", ids=("abc",), mutants=("x",)), ValueError, "by ids alone"),
    (dict(kind="domain", reason="SPEC §4.1", ids=("abc",)), ValueError, "by match alone"),
    (dict(kind="survivor", reason="SPEC §4.1", match=lambda c: True), ValueError, "by mutants alone"),
    (dict(kind="survivor", reason="SPEC §4.1", mutants=("x",), quarantined=True), ValueError, "takes neither backends"),
    (dict(kind="case", reason="SPEC §4.1", ids="abc"), TypeError, r"ids='abc' must be a tuple of names"),
], ids=["no citation", "an issue number", "unknown kind", "case without ids", "case with mutants", "domain with ids",
        "survivor with a predicate", "quarantined survivor", "ids as a string"])
def test_a_finding_must_say_what_it_matches_and_why(kwargs, error, match):
    with pytest.raises(error, match=match):
        ledger.Finding(**kwargs)


def test_lookup_by_id_or_by_config_within_the_backends():
    by_id = ledger.Finding("case", "P flip on sim, SPEC §4.2", ids=("abc",), backends=("sim",))
    causal = ledger.Finding("domain", "causal rows, docs/spec.md", match=lambda c: c.s1 > 1, quarantined=True)
    survivor = ledger.Finding("survivor", "§2", mutants=("x",))
    entries = (by_id, causal, survivor)
    assert ledger.lookup("abc", "sim", entries) is by_id and ledger.lookup("abc", "npu", entries) is None
    assert ledger.lookup(None, "npu", entries, config=CONFIG) is causal and causal.quarantined
    assert ledger.lookup("zzz", "sim", entries, config=CONFIG.replace(s1=1)) is None
    assert ledger.survivors(ledger=entries) == ("x",) and ledger.survivor("x", entries) is survivor


def test_an_entry_that_names_nothing_is_an_error():
    entries = (ledger.Finding("case", "SPEC §4.1", ids=("abc", "def")), ledger.Finding("survivor", "§2", mutants=("nope",)))
    ledger.check(regression_ids=["abc", "def"], ledger=entries)                       # mutants not given: not checked
    with pytest.raises(ValueError, match=r"regression id 'def' matches no file in the regressions folder"):
        ledger.check(regression_ids=["abc"], ledger=entries)
    with pytest.raises(ValueError, match=r"mutant 'nope' is not in the catalog"):
        ledger.check(mutants=MUTANTS, ledger=entries)


def test_property_searches_draw_no_example_a_domain_finding_matches(monkeypatch):
    golden_backend = kernels.get_backend("golden")
    in_domain = lambda c: c.s1 > 1        # noqa: E731
    causal = lambda ex: ex[0].config.s1 > 1        # noqa: E731
    search = settings(database=None, max_examples=40, phases=[Phase.generate])     # found, not shrunk
    find(law_examples.examples("acceptance", golden_backend), causal, settings=search)       # reachable
    monkeypatch.setattr(ledger, "LEDGER", (ledger.Finding("domain", "causal rows, SPEC §2", match=in_domain),))
    with pytest.raises(NoSuchExample):
        find(law_examples.examples("acceptance", golden_backend), causal, settings=search)
    scoped = ledger.Finding("domain", "causal rows, SPEC §2", match=in_domain, backends=("sim",))
    monkeypatch.setattr(ledger, "LEDGER", (scoped,))                 # another backend's finding: drawn here
    find(law_examples.examples("acceptance", golden_backend), causal, settings=search)
