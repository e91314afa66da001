"""Directed generation: a run's generated cases spent on the coverage holes first.

Hardware verification closes functional coverage by steering constrained-random stimulus at the bins no
test has hit. Here: :func:`directed_cases` takes the bins a run's other cases already hit (the catalog's,
for the backend's shapes) and, for each hole in the declared order of :mod:`properties.rule.coverage` (single
bins, then crosses), draws a few candidates from :func:`properties.search.strategies.cases_for` *narrowed* to
that hole (:func:`narrowing`: a distribution, a group size, an ``s2_tile`` of so many blocks, extra
columns, ...). Among those and the plain draws of the run's seed (the cases it drew before directed
generation), it keeps the candidate that hits the hole and closes the most holes (the greedy of set
cover), then hits the most bins at all, then costs least (:func:`_worth`). Holes a candidate closes on
the way are not aimed at again. Then it takes the plain draws in order, keeping only cases whose set of
bins no kept case has (more rounds under derived seeds when that is not enough); only when those rounds
found too few does a case repeat a set of bins (no repeat "unless every bin is hit": every bin these
shapes and distributions can reach is hit by then). Letting the plain draws
compete, and preferring rich cases, matters for finding bugs, not only corners: measured with
``pfa-verify mutants --latency`` (docs/performance.md), aiming with narrowed draws alone, or preferring
cheap cases, put small cases first and found some mutants later than the plain order did.

Reproducible: every draw is Hypothesis' from bytes of a seed derived from the run's seed and the aim's
name (:func:`aim_seed`; properties/search/generation.py), so the same seed, backend shapes and covered bins give
the same cases whatever the process imported.
Shrinking keeps its meaning: each case carries the :class:`Aim` that drew it, and a failure is shrunk by
replaying the plain draws when a case of the same failure came from them (nothing held fixed, as before),
else the aim's draws (cases/running/shrink.py): Hypothesis meets the failure again and shrinks it inside
the aim's narrowing, so a failure seen only on the case drawn for ``distribution_sinks`` shrinks to the
smallest failing ``sinks`` case. Narrowings hold a parameter only where the usual draws rarely reach the
bin (a distribution, a group size, an ``s2_tile``); bins of lengths and layouts are reached by filtering.
"""
from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable
from typing import Any, TypeVar

from hypothesis import strategies as st

from pfa_verify.golden.paging import positive_int
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.coverage import BINS, CROSSES, classify
from pfa_verify.properties.search import strategies as ps
from pfa_verify.properties.search.generation import seeded_examples

_T = TypeVar("_T")

__all__ = ["Aim", "AIM_DRAWS", "narrowing", "aim_seed", "draw", "directed_cases", "plain_draws"]

#: Candidates drawn per hole, in up to _AIM_ROUNDS rounds under their own seeds (a second round only when
#: the first missed: 1 of 8 seeds x 61 bins and crosses, kernel-sized, with 16 draws, before the 62nd): enough that a
#: narrowed strategy hits its bin, few enough that aiming costs well under a second per hole (a
#: kernel-sized draw takes about 12 ms here).
AIM_DRAWS = 16
_AIM_ROUNDS = 3
# Plain rounds (each under its own seed) that look for cases with a new set of bins before giving up.
_PLAIN_ROUNDS = 4


def plain_draws(n: int) -> int:
    """Draws of the plain strategy for ``n`` distinct cases (and as many when a failure is replayed)."""
    return 3 * n


@dataclasses.dataclass(frozen=True)
class Aim:
    """What drew a generated case: the bin or cross it was ``target``-ed at (None: the plain strategy),
    under ``seed``, ``draws`` candidates; and the hole it was ``kept_for`` (None: drawn as usual)."""
    target: str | None
    seed: int
    draws: int
    kept_for: str | None = None     # the hole the case was kept for (its draws may be the plain ones)

    def strategy(self, supported: dict[str, Any] | None = None,
                 distributions: tuple[str, ...] | None = None) -> st.SearchStrategy[Case]:
        """The strategy the aim drew from: :func:`properties.search.strategies.cases_for` for ``supported``
        shapes and ``distributions``, narrowed to the target (:func:`narrowing`)."""
        kwargs = {} if self.target is None else narrowing(self.target)
        if distributions is not None:
            wanted = kwargs.get("distribution", tuple(distributions))
            kwargs["distribution"] = tuple(d for d in wanted if d in distributions)
        return ps.cases_for(supported or None, **kwargs)

    def reachable(self, distributions: tuple[str, ...] | None = None) -> bool:
        """False when the run's ``distributions`` exclude the one the target needs (that hole stays a
        hole, and the run's coverage line says so)."""
        wanted = narrowing(self.target).get("distribution") if self.target else None
        return distributions is None or wanted is None or any(d in distributions for d in wanted)


def _narrowing_of_bin(name: str) -> dict[str, Any] | None:
    """cases_for keywords that make a draw likely to hit bin ``name`` (its filter decides), or None when
    the bin is reached by filtering the usual draws."""
    for prefix, key in (("distribution_", "distribution"), ("garbage_", "garbage")):
        if name.startswith(prefix):
            value = name[len(prefix):]
            return {key: (None if value == "none" else value,)}
    fixed: dict[str, dict[str, Any]] = {
        "s1_1": {"s1": 1}, "s1_2": {"s1": 2}, "s1_3_plus": {"s1": 3},
        "group_1": {"group": 1}, "group_2": {"group": 2}, "group_3": {"group": 3}, "group_4_plus": {"group": 4},
        "split_g_tile": {"group": st.sampled_from((2, 4, 3)), "whole_group": False},
        "nkv_1": {"nkv": 1}, "nkv_2": {"nkv": 2}, "nkv_3_plus": {"nkv": 3},
        # Parameters these bins need anyway: a causal row needs S1 > 1, another batch beside an empty one.
        "empty_by_causality": {"s1": st.integers(2, 3)},
        "empty_batch": {"batch": st.integers(2, 4)}, "ragged_lengths": {"batch": st.integers(2, 4)},
        "extra_columns": {"extra_columns": st.integers(1, 2)},
        "spare_blocks": {"spare_blocks": st.integers(1, 3)},
        "custom_softmax_scale": {"softmax_scale": ps.CUSTOM_SOFTMAX_SCALES},
    }
    if name in fixed:
        return fixed[name]
    if name.startswith("s2_tile_") and name.endswith("_blocks"):
        return {"s2_tile_blocks": int(name[len("s2_tile_"):-len("_blocks")])}
    return None


def narrowing(target: str) -> dict[str, Any]:
    """:func:`properties.search.strategies.cases_for` keywords aimed at ``target``, a bin or a cross of
    :mod:`properties.rule.coverage` (a cross: both sides' keywords); unknown names are a ValueError."""
    known = {b.name for b in BINS + CROSSES} | {"multi_tile_rows", "ragged_lengths"}
    if target not in known:
        raise ValueError(f"target={target!r} is not a coverage bin or cross (properties.rule.coverage.bin_names())")
    kwargs: dict[str, Any] = {}
    for part in target.split(" x "):       # a cross: the first side's parameter wins (group_3 x split_g_tile)
        for key, value in (_narrowing_of_bin(part) or {}).items():
            kwargs.setdefault(key, value)
    return kwargs


def aim_seed(seed: int, target: str | None, round_: int = 0) -> int:
    """The seed of an aim: the run's ``seed`` itself for the first plain round (a run with no holes to aim
    at keeps, in order, the cases it drew before directed generation that bring a new set of bins), else
    derived from the seed, the target and the round (CRC-32: stable across processes and Python versions)."""
    if target is None and round_ == 0:
        return seed
    return zlib.crc32(f"{seed}/{target}/{round_}".encode()) & 0x7FFFFFFF


def draw(strategy: st.SearchStrategy[_T], seed: int, draws: int) -> list[_T]:
    """Up to ``draws`` examples of ``strategy`` under ``seed`` (properties/search/generation.py): the same list
    for the same strategy, seed and Hypothesis version, whatever else the process imported."""
    return seeded_examples(strategy, seed, draws)


def _tokens(case: Case) -> int:
    """What a case costs a kernel, roughly: query rows times the tokens they see."""
    c = case.config
    tokens: int = c.nq * c.s1 * sum(c.lengths)
    return tokens


def _worth(names: frozenset[str], hit: set[str], case: Case) -> tuple[int, int, int]:
    """How a candidate with bins ``names`` ranks while ``hit`` are hit: the most holes closed (the greedy
    of set cover), then the most bins hit at all (a case that exercises more corners at once finds more
    bugs: measured, docs/performance.md), then the cheapest."""
    return len(names - hit), len(names), -_tokens(case)


def directed_cases(n: int, seed: int, *, supported: dict[str, Any] | None = None,
                   distributions: tuple[str, ...] | None = None,
                   covered: Iterable[str] = ()) -> list[tuple[Case, Aim]]:
    """``n`` distinct generated cases, holes first (module docstring), as ``(case, aim)`` pairs in order.

    ``covered``: names of the bins and crosses the run's other cases already hit (not aimed at);
    ``supported``: a backend's ``supported_shapes``; ``distributions``: the value distributions allowed
    (holes of the others are left alone)."""
    positive_int(n, "n", minimum=0)
    positive_int(seed, "seed", minimum=0)
    if n == 0:
        return []
    hit = set(covered)
    everything = [b.name for b in BINS + CROSSES]
    chosen: list[tuple[Case, Aim]] = []
    bin_sets: set[frozenset[str]] = set()

    bins_of: dict[Case, frozenset[str]] = {}   # classify() once per case: the plain draws compete for every hole

    def bins(case: Case) -> frozenset[str]:
        if case not in bins_of:
            bins_of[case] = classify(case.config)
        return bins_of[case]

    def keep(case: Case, aim: Aim) -> None:
        names = bins(case)
        chosen.append((case, aim))
        bin_sets.add(names)
        hit.update(names)

    plain_aim = Aim(None, aim_seed(seed, None), plain_draws(n))
    plain = draw(plain_aim.strategy(supported, distributions), plain_aim.seed, plain_aim.draws)
    for target in everything:
        if len(chosen) >= n:
            break
        if target in hit:
            continue
        for round_ in range(_AIM_ROUNDS):
            aim = Aim(target, aim_seed(seed, target, round_), AIM_DRAWS)
            if not aim.reachable(distributions):
                break
            taken = [case for case, _ in chosen]
            pool = ([(c, dataclasses.replace(plain_aim, kept_for=target)) for c in plain]
                    + [(c, dataclasses.replace(aim, kept_for=target))
                       for c in draw(aim.strategy(supported, distributions), aim.seed, aim.draws)])
            scored = [(_worth(names, hit, c), -i, c, a) for i, (c, a) in enumerate(pool)
                      for names in [bins(c)] if c not in taken and target in names and names not in bin_sets]
            if scored:
                best = max(scored, key=lambda s: s[:2])       # the worth, then the earliest drawn
                keep(best[2], best[3])
                break

    taken = [case for case, _ in chosen]
    round_ = 0
    while len(chosen) < n and round_ < _PLAIN_ROUNDS + 1:
        # Repeating a set of bins only when fresh plain rounds found no new one: a hole these shapes or
        # distributions cannot reach must not leave the run with fewer cases than it asked for.
        aim = Aim(None, aim_seed(seed, None, round_), plain_draws(n if round_ == 0 else n - len(chosen)))
        drawn = plain if round_ == 0 else draw(aim.strategy(supported, distributions), aim.seed, aim.draws)
        for case in drawn:
            if len(chosen) >= n:
                break
            if case not in taken and (round_ == _PLAIN_ROUNDS or bins(case) not in bin_sets):
                keep(case, aim)
                taken.append(case)
        round_ += 1
    return chosen

