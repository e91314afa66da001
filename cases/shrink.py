"""Hypothesis searches of the suite's own commands: find the first failing example, then shrink it.

:func:`hunt` is the one search: ``pfa-verify mutants`` runs it per (mutant, law), and ``pfa-verify
run`` runs it to shrink the failures of its generated cases (issue 12). A failing generated case is
rarely the smallest case that shows its bug, and one bug fails many generated cases alike, so before
anything is captured the failures are grouped by :func:`signature` (category of the one acceptance
rule, where the mismatches concentrate) and each group is shrunk by Hypothesis' own shrinker: the
generation that produced the cases is replayed (same strategy, same seed, cases/collect.py) with
"fails with this signature" as the failure, so Hypothesis meets the group's first failing case and
shrinks from it.
"""
from __future__ import annotations

import dataclasses
import time

__all__ = ["Hunt", "hunt", "signature"]


@dataclasses.dataclass
class Hunt:
    """What :func:`hunt` found: ``examples`` drawn up to the first failure (all, when none failed),
    ``seconds`` to it, and the smallest failing ``example`` with its ``error`` (None: none failed)."""
    examples: int = 0
    seconds: float = 0.0
    example: object = None
    error: BaseException | None = None


class _Failed(Exception):
    """Tells Hypothesis that ``check`` failed (its own exception is kept in the Hunt)."""


def _kind(exc: BaseException) -> str:
    return "law" if isinstance(exc, AssertionError) else "error"


def hunt(strategy, check, *, seed: int, examples: int, shrink_s: float = 0.0) -> Hunt:
    """Draw up to ``examples`` from ``strategy`` under ``seed`` and call ``check(example)`` (it raises
    on failure) until one fails; then let Hypothesis shrink it for ``shrink_s`` seconds (0: not
    shrunk). While shrinking, only a failure of the first one's kind (an AssertionError, or another
    exception) counts: a different failure is another bug, not a smaller case of this one. Past the
    budget every attempt passes, so the shrinker stops at the smallest failure it has."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis.errors import HypothesisException

    found = Hunt()
    start = time.perf_counter()

    @fixed_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, report_multiple_bugs=False,
              phases=[Phase.generate, Phase.shrink] if shrink_s > 0 else [Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        if found.error is None:
            found.examples += 1
        elif time.perf_counter() - start - found.seconds > shrink_s:
            return      # over budget (or Hypothesis' final replay without shrinking): "passes"
        try:
            check(example)
        except Exception as exc:  # noqa: BLE001 - whatever check raises is the failure looked for
            if found.error is None:
                found.seconds = time.perf_counter() - start
            elif _kind(exc) != _kind(found.error):
                return
            found.example, found.error = example, exc
            raise _Failed from None

    try:
        run()
    except (_Failed, HypothesisException):
        # FlakyFailure when the final replay "passed" (over budget): the failure found still stands.
        if found.error is None:
            raise
    if found.error is None:
        found.seconds = time.perf_counter() - start
    return found


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
