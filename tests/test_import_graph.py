"""The layout's one-way dependencies (every module under the one import name pfa_verify), held by the import-linter contracts in pyproject.toml
([tool.importlinter]; ``lint-imports`` at the project root checks them by hand):

- ``packages``: golden <- kernels <- properties <- cases (tests may use all);
- ``cases-rooms``: cases/ is four rooms under the command line, cli > measuring > reporting > running >
  data; a room imports only the rooms below it, nothing imports cli, and a new module at the top
  of cases/ must take its place in the list;
- ``properties-rooms``: properties/ is three rooms, the search and the diagnosis over the rule and
  independent of each other (a law raises its failure as data; cases/ diagnoses it);
- ``no-cycles``: no import cycle between the modules of a package (a module importing its own package's
  __init__, as kernels.backends.sim takes Backend from kernels.backends, is how a package shares its
  base, not a cycle).

Imports inside functions count, and so do chains through other modules. The contracts are also shown to
break: a copy of the tree with one upward import, one import from a lower room to a higher one, a law
importing the diagnosis and one cycle planted.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("golden", "kernels", "properties", "cases")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the tree at ``root`` (its pyproject.toml), in a fresh process whose import
    path starts there (in this one the packages are already imported from the checkout)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
                           "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_import_contracts_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout, done.stdout


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}  # noqa: F401 - planted by the test\n")


def test_a_planted_upward_import_breaks_the_contracts(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copytree(ROOT / "pfa_verify", tmp_path / "pfa_verify", symlinks=True)     # the links to the four
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    _plant(tmp_path / "golden" / "quant.py", "from pfa_verify.cases.reporting import report")     # golden -> cases
    _plant(tmp_path / "cases" / "data" / "catalog.py", "from pfa_verify.cases.reporting import html_report")
    _plant(tmp_path / "golden" / "paging.py", "from pfa_verify.golden import attention")  # attention imports paging
    _plant(tmp_path / "properties" / "search" / "laws.py", "from pfa_verify.properties.diagnosis import diagnosis")
    done = lint_imports(tmp_path)
    out = done.stdout
    assert done.returncode == 1 and "Contracts: 0 kept, 4 broken." in out, out + done.stderr
    flat = " ".join(out.split())            # import-linter wraps long lines
    assert "pfa_verify.golden is not allowed to import pfa_verify.cases:" in flat, out
    assert "pfa_verify.golden.quant -> pfa_verify.cases.reporting.report" in flat, out
    assert "pfa_verify.cases.data is not allowed to import pfa_verify.cases.reporting:" in flat, out
    assert "pfa_verify.cases.data.catalog -> pfa_verify.cases.reporting.html_report" in flat, out
    assert "pfa_verify.properties.search is not allowed to import pfa_verify.properties.diagnosis:" in flat, out
    assert "pfa_verify.properties.search.laws -> pfa_verify.properties.diagnosis.diagnosis" in flat, out
    cycles = flat.split("no import cycle")[-1]
    assert "No cycles are allowed in pfa_verify.golden." in cycles and "- .paging -> .attention (1 import)" in cycles
