"""Known failures: the one ledger lives in properties/ledger.py (low enough for the property searches
to read it, golden <- kernels <- properties <- cases); this module re-exports it for the cases pipeline.
Its rules (kinds case, domain and survivor; a reason citing an issue; tolerated = strict xfail,
quarantined = never launched; an id that matches no file is an error) are written there."""
from __future__ import annotations

from properties.ledger import KINDS, LEDGER, Finding, check, lookup, survivor, survivors

__all__ = ["KINDS", "Finding", "LEDGER", "lookup", "survivors", "survivor", "check"]
