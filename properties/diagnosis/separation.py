"""What the failures share: the case facts that separate a run's failing (or erroring) cases from its
passing ones.

A diagnosis reads one case; a run holds many. The facts properties/rule/coverage.py reads from each case's
config (its bins: a full last tile, a table width that is not a multiple of the blocks per tile, a group
that g_tile splits, ...) are compared between the cases that went wrong and those that passed, and the
smallest conjunction of facts (each fact or its absence) that holds on every case that went wrong and on
no passing one is the finding: "fails exactly when a row's visible length is a multiple of s2_tile: 9 of
9 failing, 0 of 32 passing". When no conjunction of up to :data:`MAX_FACTS` facts separates them, the
fact that comes closest is reported with its counts, and said to be no separation.

It reads configs only (no inputs, no kernel calls), so a whole run separates in milliseconds; like the
diagnosis it is never a verdict, only a clue rendered beside the failures the rule decided.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pfa_verify import golden
from pfa_verify.properties.rule.coverage import BINS, Facts, facts_of

__all__ = ["Fact", "Separation", "separate", "MAX_FACTS", "FACTS"]

#: The largest conjunction tried (facts and their absence): 3 keeps the search at a few thousand
#: conjunctions of the some 90 literals that hold on every failing case, at most.
MAX_FACTS = 3


@dataclasses.dataclass(frozen=True)
class Fact:
    """A statement about one case, read from its config's facts (properties.rule.coverage)."""
    name: str
    description: str
    holds: Callable[[Facts], bool] = dataclasses.field(repr=False, compare=False)

    def negated(self) -> Fact:
        return Fact(f"not {self.name}", f"not ({self.description})", lambda f: not self.holds(f))


#: The coverage bins, plus the facts that tell batches and tiles apart beyond them.
FACTS: tuple[Fact, ...] = (
    *(Fact(b.name, b.description, b.hit) for b in BINS),
    Fact("several_batches", "B >= 2 (more than one batch)", lambda f: len(f["lengths"]) >= 2),
    Fact("ragged_lengths", "batches of different lengths", lambda f: len(set(f["lengths"])) > 1),
    Fact("every_row_at_tile", "every row's visible length is a multiple of s2_tile (every last tile is full)",
         lambda f: bool(f["cur"]) and all(c % f["tile"] == 0 for c in f["cur"])),
    Fact("multi_tile_rows", "a row of two tiles or more", lambda f: any(t >= 2 for t in f["tiles"])),
    # SPEC §5: upstream never checks a table narrower than the tile walk needs; a walk that gathers a whole
    # tile's columns at once reads past the row there.
    Fact("tile_walk_past_table", "a row's tile walk, in whole tiles, spans block-table columns past the table's "
         "width", lambda f: any(t * f["tile_blocks"] > f["columns"] for t in f["tiles"])),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Separation:
    """The facts (a conjunction) that come closest to holding on exactly the ``bad`` cases."""
    kind: str                        # "failures" or "errors": which cases went wrong
    facts: tuple[str, ...]           # the literals' names ("not NAME" for an absence)
    descriptions: tuple[str, ...]
    bad_hit: int                     # cases that went wrong on which the conjunction holds
    bad: int
    good_hit: int                    # passing cases on which it holds
    good: int
    alternatives: tuple[str, ...] = ()   # other conjunctions of the same size that separate as well

    @property
    def exact(self) -> bool:
        """It holds on every case that went wrong and on no passing one."""
        return self.bad_hit == self.bad and self.good_hit == 0

    def render(self) -> str:
        """One line, the counts beside the words (``exact`` or not said in so many words)."""
        what = " and ".join(self.descriptions)
        went = "failing" if self.kind == "failures" else "erroring"
        counts = f"{self.bad_hit} of {self.bad} {went}, {self.good_hit} of {self.good} passing"
        if self.exact:
            also = f" (as well: {'; '.join(self.alternatives)})" if self.alternatives else ""
            return f"The {self.kind} share: {what}: {counts}; they go wrong exactly when it holds{also}"
        return (f"No case fact separates the {self.kind} from the passing cases; closest: {what}: {counts}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()} | {
            "exact": self.exact, "text": self.render()}


def _literals() -> list[Fact]:
    return [lit for fact in FACTS for lit in (fact, fact.negated())]


def separate(bad: Sequence[golden.PagedAttentionConfig], good: Sequence[golden.PagedAttentionConfig], *,
             kind: str = "failures", max_facts: int = MAX_FACTS) -> Separation | None:
    """The smallest conjunction of facts that holds on every ``bad`` case and on no ``good`` one (the
    first in FACTS order; the next two of the same size as ``alternatives``), else the single fact with
    the best counts (most bad cases, then fewest good ones). None without a bad and a good case: with
    nothing to contrast, every fact of the failing cases is shared."""
    if kind not in ("failures", "errors"):
        raise ValueError(f"kind={kind!r} must be 'failures' or 'errors'")
    if not isinstance(max_facts, int) or max_facts < 1:
        raise ValueError(f"max_facts={max_facts!r} must be an int >= 1")
    if not bad or not good:
        return None
    bad_facts = [facts_of(c) for c in bad]
    good_facts = [facts_of(c) for c in good]
    literals = _literals()
    bad_hits = {lit.name: [lit.holds(f) for f in bad_facts] for lit in literals}
    good_hits = {lit.name: [lit.holds(f) for f in good_facts] for lit in literals}
    # An exact conjunction holds on every bad case, so each of its literals does: only those are tried.
    on_all = [lit for lit in literals if all(bad_hits[lit.name])]
    for size in range(1, max_facts + 1):
        exact = [combo for combo in itertools.combinations(on_all, size)
                 if not any(all(good_hits[lit.name][k] for lit in combo) for k in range(len(good)))
                 and not _redundant(combo)]
        if exact:
            first, rest = exact[0], exact[1:3]
            return _separation(kind, first, len(bad), len(bad), 0, len(good),
                               alternatives=tuple(" and ".join(lit.description for lit in c) for c in rest))
    def score(lit: Fact) -> tuple[float, int]:
        return (-(sum(bad_hits[lit.name]) / len(bad) - sum(good_hits[lit.name]) / len(good)),
                sum(good_hits[lit.name]))
    best = min(literals, key=score)
    return _separation(kind, (best,), sum(bad_hits[best.name]), len(bad), sum(good_hits[best.name]), len(good))


def _redundant(combo: Iterable[Fact]) -> bool:
    """A fact beside its own absence (a conjunction that holds nowhere) is no separation."""
    names = {lit.name for lit in combo}
    return any(f"not {name}" in names for name in names)


def _separation(kind: str, combo: Sequence[Fact], bad_hit: int, bad: int, good_hit: int, good: int, *,
                alternatives: tuple[str, ...] = ()) -> Separation:
    return Separation(kind=kind, facts=tuple(lit.name for lit in combo),
                      descriptions=tuple(lit.description for lit in combo), bad_hit=bad_hit, bad=bad,
                      good_hit=good_hit, good=good, alternatives=alternatives)
