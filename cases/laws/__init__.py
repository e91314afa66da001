"""The laws of SPEC §2-§6 as pytest tests, shipped in the package:
``pytest -p pfa_verify.cases.plugin --pyargs pfa_verify.cases.laws --backend NAME``.

Each test states its law; the law lives in properties/search/laws.py and its examples in
properties/search/law_examples.py (its domain: every example can make it fail). The fixtures and options are
the plugin's (cases/plugin/, loaded by name with ``-p``: no entry point). ``pfa-verify laws`` runs
the same laws as one search each, with a budget of examples and seconds and a table of verdicts.
"""
from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st

__all__ = ["check"]


def check(check_law: Any, examples_for: Any, data: st.DataObject, law: str) -> None:
    """Draw one of ``law``'s examples for the backend and check it (the plugin's fixtures)."""
    case, params = data.draw(examples_for(law), label=f"{law} example")
    # --hypothesis-show-statistics lists the value distributions each law drew.
    event(f"distribution {getattr(getattr(case, 'config', case), 'distribution', '-')}")
    check_law(law, case, **params)
