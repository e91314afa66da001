"""Known failures, in one ledger. Every entry cites the issue that tracks it.

Rules:
- An entry names captured regressions by id (``ids``) and may be scoped to backends (``backends``;
  empty means every backend).
- ``reason`` must cite a tracking issue ("issue 7", "#7" or an issues URL); construction fails otherwise.
- ``tolerated`` entries still run and are expected to fail (strict xfail): one that starts passing
  fails the run, so the entry is removed once the fix lands.
- ``quarantined`` entries are never launched (a crash that would take the device or the run down).
- Nothing outside this file decides that a failure is known.
"""
from __future__ import annotations

import dataclasses
import re

__all__ = ["Finding", "LEDGER", "lookup"]

_ISSUE = re.compile(r"(issue\s+\d+|#\d+|/issues/\d+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Finding:
    ids: tuple[str, ...]
    reason: str
    backends: tuple[str, ...] = ()
    quarantined: bool = False

    def __post_init__(self):
        if not self.ids:
            raise ValueError("a ledger Finding needs at least one regression id")
        if not _ISSUE.search(self.reason):
            raise ValueError(f"reason={self.reason!r} must cite a tracking issue (e.g. 'issue 7')")

    @property
    def tolerated(self) -> bool:
        return not self.quarantined

    def applies(self, regression_id: str, backend: str) -> bool:
        return regression_id in self.ids and (not self.backends or backend in self.backends)


LEDGER: tuple[Finding, ...] = ()


def lookup(regression_id: str, backend: str, ledger=None) -> Finding | None:
    """The ledger entry covering this regression on this backend, if any."""
    for finding in LEDGER if ledger is None else ledger:
        if finding.applies(regression_id, backend):
            return finding
    return None
