"""Known facts about failures, in one ledger. Every entry cites where its reason is argued.

A :class:`Finding` says what it matches, by its ``kind``:

- ``case``: captured regressions, by id (``ids``; each must name a file in the regressions folder);
- ``domain``: a predicate over a ``golden.PagedAttentionConfig`` (``match``), for a part of the input
  space a backend is known to get wrong, whatever the case's name or source;
- ``survivor``: mutants of the kill matrix (``mutants``, names of ``kernels.mutants.MUTANTS``) that no
  law kills, with why (in ``reason``).

Rules:

- ``reason`` must cite where it is argued: a SPEC section ("SPEC §4.1" or "§4.1", docs/spec.md) or a docs
  file ("docs/envelope.md"); construction fails otherwise.
- ``backends`` scopes a case or domain finding to backends by name (empty: every backend).
- ``case`` and ``domain`` findings are ``tolerated`` (they still run and are expected to fail: a strict
  xfail, so one that starts passing fails the run and the entry is removed once the fix lands) or
  ``quarantined`` (never launched: a crash that would take the device or the run down). Property
  searches (properties/search/law_examples.py) draw no example a domain finding matches.
- A ``survivor`` is held to surviving the same way: tests/meta/test_mutants.py and
  tests/kernels/test_kernel_mutants.py run it as a strict xfail, and ``pfa-verify mutants
  --allow-survivors ledger`` (tox -e mutants) allows exactly the ledger's survivors of its level.
- An id that matches no regression file, or a mutant that is not in the catalog, is an error
  (:func:`check`): ``pfa-verify run`` and the replay tests refuse a ledger that names nothing.
- Nothing outside this file decides that a failure is known. It lives in properties/ so that the
  property searches can read it (golden <- kernels <- properties <- cases); ``cases.ledger`` re-exports it.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

from pfa_verify.golden.errors import UsageError

__all__ = ["KINDS", "Finding", "LEDGER", "lookup", "survivors", "survivor", "check"]

KINDS = ("case", "domain", "survivor")
_ARGUED = re.compile(r"§\d+(?:\.\d+)*|\bdocs/[\w./-]+\.md\b")   # a SPEC section or a docs file


@dataclasses.dataclass(frozen=True)
class Finding:
    """One known fact: what it matches (by ``kind``), why (``reason``, citing where it is argued), and
    how runs treat it (``quarantined`` or tolerated; ``backends`` it applies to)."""
    kind: str
    reason: str
    _: dataclasses.KW_ONLY       # what it matches, by name
    ids: tuple[str, ...] = ()                                   # kind "case": regression ids
    match: Callable[[object], bool] | None = None               # kind "domain": config -> bool
    mutants: tuple[str, ...] = ()                               # kind "survivor": mutant names
    backends: tuple[str, ...] = ()
    quarantined: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {KINDS}")
        if not _ARGUED.search(self.reason):
            raise ValueError(f"reason={self.reason!r} must cite where it is argued: a SPEC section "
                             "(e.g. 'SPEC §4.1') or a docs file (e.g. 'docs/envelope.md')")
        given = {"case": bool(self.ids), "domain": self.match is not None, "survivor": bool(self.mutants)}
        selector = {"case": "ids", "domain": "match", "survivor": "mutants"}
        if not given[self.kind] or sum(given.values()) != 1:
            raise ValueError(f"a {self.kind!r} finding names what it matches by {selector[self.kind]} alone "
                             f"(got ids={self.ids!r}, match={self.match!r}, mutants={self.mutants!r})")
        if self.kind == "survivor" and (self.backends or self.quarantined):
            raise ValueError("a survivor finding takes neither backends nor quarantined: a mutant is its own backend")
        for name in ("ids", "mutants", "backends"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{name}={value!r} must be a tuple of names")

    @property
    def tolerated(self) -> bool:
        return not self.quarantined

    def applies(self, regression_id: str | None, backend: str, config: object = None) -> bool:
        """Whether this case or domain finding covers a case on ``backend``: its regression id is listed,
        or its ``config`` (a golden.PagedAttentionConfig) matches the predicate."""
        if self.kind == "survivor" or (self.backends and backend not in self.backends):
            return False
        if self.kind == "case":
            return regression_id is not None and regression_id in self.ids
        return config is not None and self.match is not None and bool(self.match(config))


#: The ledger. softmax_scale_before_dequant computes ((S * softmax_scale) * q_scale) * k_scale where SPEC
#: §2.3 says ((S * q_scale) * k_scale) * softmax_scale: at most two float32 ulps of S apart, and SPEC §4.1
#: lets a conforming kernel move S at least as much (F2's scale orders, F1's summation orders), so its
#: output lies inside the acceptance envelope of SPEC §4.2 (README: Verification power).
LEDGER: tuple[Finding, ...] = (
    Finding("survivor", "inside the acceptance envelope (SPEC §4.2): the scale order moves S by at most 2 float32 "
                        "ulps, which SPEC §4.1 lets a conforming kernel do too (F1, F2)",
            mutants=("softmax_scale_before_dequant", "sim/softmax_scale_before_dequant")),
)


def _ledger(ledger: Iterable[Finding] | None) -> tuple[Finding, ...]:
    return LEDGER if ledger is None else tuple(ledger)


def lookup(regression_id: str | None, backend: str, ledger: Iterable[Finding] | None = None, *,
           config: object = None) -> Finding | None:
    """The case or domain finding covering a case on ``backend`` (by regression id, or by its config),
    if any; the first one listed wins."""
    for finding in _ledger(ledger):
        if finding.applies(regression_id, backend, config):
            return finding
    return None


def survivors(level: str | None = None, ledger: Iterable[Finding] | None = None) -> tuple[str, ...]:
    """The mutants the ledger holds to surviving (of ``level``, "golden" or "sim", when given; a sim
    mutant's name starts with ``sim/``)."""
    names = [m for f in _ledger(ledger) if f.kind == "survivor" for m in f.mutants]
    if level is not None:
        names = [m for m in names if (level == "sim") == m.startswith("sim/")]
    return tuple(names)


def survivor(mutant: str, ledger: Iterable[Finding] | None = None) -> Finding | None:
    """The survivor finding naming ``mutant``, if any."""
    return next((f for f in _ledger(ledger) if f.kind == "survivor" and mutant in f.mutants), None)


def check(*, regression_ids: Iterable[str] | None = None, mutants: Iterable[str] | None = None,
          ledger: Iterable[Finding] | None = None, where: str = "the regressions folder") -> None:
    """Raise a golden.errors.UsageError (one line, exit 2) naming every ledger entry that matches
    nothing: a case id with no regression file among ``regression_ids`` (the ids present in ``where``), a
    survivor not among ``mutants`` (the catalog's names). Either check is skipped when its names are not
    given."""
    problems: list[str] = []
    for finding in _ledger(ledger):
        if regression_ids is not None and finding.kind == "case":
            present = set(regression_ids)
            problems += [f"regression id {rid!r} matches no file in {where}" for rid in finding.ids if rid not in present]
        if mutants is not None and finding.kind == "survivor":
            known = set(mutants)
            problems += [f"mutant {name!r} is not in the catalog" for name in finding.mutants if name not in known]
    if problems:
        raise UsageError("the ledger (properties/rule/ledger.py) names what does not exist: " + "; ".join(problems))
