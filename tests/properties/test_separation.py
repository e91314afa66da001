"""properties/diagnosis/separation.py (issue 37): what a run's failing cases share against its passing ones."""
from __future__ import annotations

import pytest

from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.data.collect import generated_cases
from pfa_verify.properties.diagnosis.separation import FACTS, separate
from pfa_verify.properties.rule.coverage import facts_of

_CONFIGS = [c.config for c in load_catalog().values() if hasattr(c, "config")] + \
           [c.config for c in generated_cases(40, 0)]


def _full_last_tile(config) -> bool:
    return any(cur % config.s2_tile == 0 for cur in facts_of(config)["cur"])


def test_failures_that_need_a_full_last_tile_are_said_to_share_it_with_their_counts():
    """A defect that bites exactly when a row's last tile is full: the one fact, counted, said exact."""
    bad = [c for c in _CONFIGS if _full_last_tile(c)]
    good = [c for c in _CONFIGS if not _full_last_tile(c)]
    assert bad and good
    found = separate(bad, good)
    assert found is not None and found.exact and found.facts == ("cur_at_tile",)
    assert (found.bad_hit, found.bad, found.good_hit, found.good) == (len(bad), len(bad), 0, len(good))
    assert found.render().startswith("The failures share: a row's visible length is a multiple of s2_tile: "
                                     f"{len(bad)} of {len(bad)} failing, 0 of {len(good)} passing; they go wrong "
                                     "exactly when it holds")


def test_a_conjunction_is_found_when_no_single_fact_separates():
    """Fails exactly on several batches with a group split by g_tile: two facts, neither enough alone."""
    def bites(c):
        f = facts_of(c)
        return len(f["lengths"]) >= 2 and f["g_tile"] < f["group"]
    bad = [c for c in _CONFIGS if bites(c)]
    good = [c for c in _CONFIGS if not bites(c)]
    assert bad and good
    assert separate(bad, good, max_facts=1).exact is False          # one fact is not enough here
    found = separate(bad, good)
    assert found.exact and len(found.facts) == 2
    every = {f.name: f for fact in FACTS for f in (fact, fact.negated())}
    assert all(all(every[name].holds(facts_of(c)) for name in found.facts) for c in bad)
    assert not any(all(every[name].holds(facts_of(c)) for name in found.facts) for c in good)


def test_failures_with_nothing_in_common_are_said_not_separated_with_the_closest_fact():
    bad = _CONFIGS[::2]
    good = _CONFIGS[1::2]
    found = separate(bad, good, max_facts=1)
    assert not found.exact and found.render().startswith("No case fact separates the failures from the passing "
                                                         "cases; closest: ")


def test_nothing_to_contrast_gives_nothing_and_bad_arguments_are_named():
    assert separate([], _CONFIGS) is None and separate(_CONFIGS, []) is None
    with pytest.raises(ValueError, match="kind='x' must be 'failures' or 'errors'"):
        separate(_CONFIGS[:1], _CONFIGS[1:], kind="x")
    with pytest.raises(ValueError, match="max_facts=0 must be an int >= 1"):
        separate(_CONFIGS[:1], _CONFIGS[1:], max_facts=0)
