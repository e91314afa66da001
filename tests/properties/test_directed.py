"""properties/search/directed.py: generated cases spent on the coverage holes first (issue 30)."""
from __future__ import annotations

import pytest

from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.data.collect import Item, catalog_coverage, generated_cases
from pfa_verify.kernels.backends import unsupported_shape
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.rule.coverage import CROSSES, bin_names, classify, coverage
from pfa_verify.properties.search.directed import AIM_DRAWS, Aim, directed_cases, narrowing

_CATALOG = [Item(name, "catalog", case) for name, case in load_catalog().items()]
_KERNEL_CATALOG = [i.case.config for i in _CATALOG if unsupported_shape(i.case.config, KERNEL_SHAPES) is None]


def _verify_like(cases):
    """The coverage of tox -e verify's selection on the sim: the catalog cases our kernel runs, plus ``cases``."""
    return coverage(_KERNEL_CATALOG + [c.config for c in cases])


def test_verify_selection_hits_every_bin_and_most_crosses():
    """The goal: the catalog our kernel runs plus 20 directed cases hit every bin and >= 90% of the crosses.
    The same selection drawn as before (plain generation) left holes, so this can fail."""
    covered = catalog_coverage(_CATALOG, KERNEL_SHAPES)
    directed = [case for case, _ in directed_cases(20, 0, supported=KERNEL_SHAPES, covered=covered)]
    after = _verify_like(directed)
    assert after.holes == ()
    assert len(CROSSES) - len(after.cross_holes) >= 0.9 * len(CROSSES)
    before = _verify_like(generated_cases(20, 0, supported=KERNEL_SHAPES))
    assert {"s2_tile_3_blocks", "s2_tile_4_blocks"} <= set(before.holes)


def test_holes_come_first_and_each_aimed_case_hits_its_hole():
    covered = catalog_coverage(_CATALOG, KERNEL_SHAPES)
    pairs = directed_cases(20, 0, supported=KERNEL_SHAPES, covered=covered)
    targets = [aim.kept_for for _, aim in pairs]
    aimed = [t for t in targets if t is not None]
    assert aimed and targets[:len(aimed)] == aimed            # every aimed case before the plain ones
    hit = set(covered)
    for case, aim in pairs[:len(aimed)]:
        assert aim.kept_for not in hit                        # a hole when it was aimed at
        assert aim.kept_for in classify(case.config)
        assert aim.target in (None, aim.kept_for)             # drawn plainly, or by the draws aimed at it
        hit |= classify(case.config)
    assert all(c.config.head_dim == 128 and c.config.block_size == 128 for c, _ in pairs)


@pytest.mark.parametrize("target", bin_names())
def test_every_bin_and_cross_can_be_aimed_at(target):
    """A narrowed strategy reaches its bin for kernel-sized cases, whatever else is already hit."""
    everything_else = set(bin_names()) - {target}
    pairs = directed_cases(1, 7, supported=KERNEL_SHAPES, covered=everything_else)
    assert [aim.kept_for for _, aim in pairs] == [target]
    assert target in classify(pairs[0][0].config)
    assert pairs[0][1].draws == (AIM_DRAWS if pairs[0][1].target else 3)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_no_two_cases_share_their_bins_unless_every_bin_is_hit(seed):
    pairs = directed_cases(30, seed)
    sets = [classify(case.config) for case, _ in pairs]
    assert len(pairs) == 30 and len({(c.config, c.seed) for c, _ in pairs}) == 30
    first_repeat = next((k for k in range(len(sets)) if sets[k] in sets[:k]), None)
    if first_repeat is not None:                              # allowed only once everything is hit
        assert set().union(*sets[:first_repeat]) >= set(bin_names())


def test_the_same_seed_gives_the_same_cases_and_another_seed_others():
    a = directed_cases(12, 3, supported=KERNEL_SHAPES)
    assert a == directed_cases(12, 3, supported=KERNEL_SHAPES)
    assert [c for c, _ in a] != [c for c, _ in directed_cases(12, 4, supported=KERNEL_SHAPES)]


def test_with_nothing_to_aim_at_the_plain_draws_are_kept_in_order():
    everything = set(bin_names())
    directed = [case for case, aim in directed_cases(10, 0, covered=everything)]
    plain = generated_cases(40, 0)
    assert all(aim.target is None and aim.kept_for is None for _, aim in directed_cases(10, 0, covered=everything))
    positions = [plain.index(case) for case in directed]
    assert positions == sorted(positions) and positions[0] == 0


def test_a_distribution_the_run_excluded_is_not_aimed_at_and_the_run_still_gets_its_cases():
    pairs = directed_cases(8, 0, distributions=("uniform", "normal"))
    assert len(pairs) == 8 and {c.config.distribution for c, _ in pairs} <= {"uniform", "normal"}
    assert not Aim("distribution_sinks", 0, 1).reachable(("uniform",))
    assert Aim("distribution_sinks", 0, 1).reachable(None) and Aim("group_3", 0, 1).reachable(("uniform",))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="n=-1 must be >= 0"):
        directed_cases(-1, 0)
    with pytest.raises(TypeError, match="seed"):
        directed_cases(3, "0")


def test_narrowing_names_an_unknown_bin():
    with pytest.raises(ValueError, match="target='s2_tile_5_blocks' is not a coverage bin"):
        narrowing("s2_tile_5_blocks")
    assert narrowing("distribution_sinks x multi_tile_rows") == {"distribution": ("sinks",)}
    assert narrowing("garbage_none") == {"garbage": (None,)}
    assert narrowing("group_3 x split_g_tile")["group"] == 3       # the first side's parameter wins
