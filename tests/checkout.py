"""Where the suite's tests find the checkout: ``REPO_ROOT``, the folder holding golden/ kernels/ properties/
cases/ and tests/ (subprocesses run from it, with it on PYTHONPATH)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parent.parent
