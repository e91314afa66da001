"""Shrink and deduplicate the failures of ``pfa-verify run``'s generated cases (issue 12).

A failing generated case is rarely the smallest case that shows its bug, and one bug fails many
generated cases alike. So before anything is captured, the failures of generated cases are grouped by
their signature (law, backend, category of the one acceptance rule, where the mismatches concentrate),
and each group's bug is shrunk by Hypothesis' own shrinker: the generation that produced the cases is
replayed (same strategy, same seed) with "fails with this signature" as the failure, so Hypothesis
meets the group's first failing case and shrinks from it. One case per signature is captured, with the
names of the generated cases that showed it.
"""
from __future__ import annotations

import time

__all__ = ["signature", "shrink"]


def signature(verdict) -> tuple | None:
    """(category, where the mismatches concentrate) of a failing properties.acceptance.Judgement, or
    None when it passes. Coarse on purpose: one bug, one signature."""
    failed = [r for r in verdict.references if r.counts and not r.passed]
    if not failed:
        return None
    ref = failed[0]
    a, res = ref.attribution, ref.comparison
    if res.attribute is not None:
        where = "attributes"
    elif res.nonfinite:
        where = "non-finite values"
    elif a is None:
        where = "unattributed"
    elif a.in_cur_zero_rows == a.mismatched:
        where = "rows with cur == 0"
    elif all(tiles > 1 for (tiles, _), _ in a.by_tile_walk):
        where = "rows of several tiles"
    elif all(tiles == 1 for (tiles, _), _ in a.by_tile_walk):
        where = "rows of one tile"
    else:
        where = "rows of any length"
    return (ref.category, where)


def _size(case) -> tuple:
    c = case.config
    return (c.batch * c.s1 * c.nq * max(c.lengths + (1,)), c.batch, c.s1, c.nq, sum(c.lengths), case.seed)


def shrink(strategy, seed: int, fails_like, *, examples: int, budget_s: float):
    """The smallest case Hypothesis finds for which ``fails_like(case)`` is true, replaying the
    generation of ``strategy`` under ``seed`` (``examples`` draws) and then its shrinker, for at most
    ``budget_s`` seconds of evaluations; None when no draw fails like that."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis.errors import HypothesisException

    found: list = []
    start = time.perf_counter()

    @fixed_seed(seed)
    @settings(max_examples=examples, phases=[Phase.generate, Phase.shrink], database=None, deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(strategy)
    def replay(case):
        if time.perf_counter() - start > budget_s:
            return                      # out of time: the smallest failure so far stands
        if fails_like(case):
            found.append(case)
            raise AssertionError("fails like the group")

    try:
        replay()
    except (AssertionError, HypothesisException):
        pass
    return min(found, key=_size) if found else None
