"""Installing pfa-verify changes nothing in a user's other pytest sessions and Hypothesis runs (issue 54).

Two ways in are closed and checked here. Hypothesis: no module of the four packages imports
``hypothesis.internal``, reads or sets a private Hypothesis name, or assigns to a Hypothesis object (the
checker is tried on the code it exists to catch first). pytest: the laws' plugin has no ``pytest11``
entry point, so a pytest session started elsewhere, without ``-p pfa_verify.cases.plugin``, has none
of its options.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("golden", "kernels", "properties", "cases")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def hypothesis_touches(source: str) -> list[str]:
    """Lines of ``source`` that import a Hypothesis internal, name a private Hypothesis attribute, or
    assign to or setattr a Hypothesis object, as ``"line N: what"``."""
    tree = ast.parse(source)
    bound: set[str] = set()          # local names bound to Hypothesis modules or objects
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hypothesis":
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if alias.name.startswith("hypothesis.internal"):
                        found.append(f"line {node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hypothesis":
            module = node.module or ""
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                dotted = f"{module}.{alias.name}"
                if dotted.startswith("hypothesis.internal") or _private(alias.name):
                    found.append(f"line {node.lineno}: imports {dotted}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and (
                node.attr.startswith("_hypothesis") or _root_name(node.value) in bound):
            found.append(f"line {node.lineno}: private attribute {node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                "hypothesis.internal" in node.value or "_hypothesis_" in node.value):
            found.append(f"line {node.lineno}: names {node.value!r}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _root_name(target) in bound:
                    found.append(f"line {node.lineno}: assigns {ast.unparse(target)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args and _root_name(node.args[0]) in bound):
            found.append(f"line {node.lineno}: {node.func.id} on {ast.unparse(node.args[0])}")
    return found


# What the checker exists to catch: the ways the suite once reached into Hypothesis, and their kin.
_CAUGHT = {
    "from hypothesis.internal.conjecture import providers": "imports hypothesis.internal",
    "import hypothesis.internal.constants_ast as c": "imports hypothesis.internal",
    "from hypothesis.core import _private_helper": "imports hypothesis.core._private_helper",
    "from hypothesis.internal.conjecture import providers\nproviders._get_local_constants = f":
        "private attribute _get_local_constants",
    "run.hypothesis.inner_test._hypothesis_internal_add_digest = b'k'": "private attribute _hypothesis",
    "import hypothesis\nhypothesis.settings.default = None": "assigns hypothesis.settings.default",
    "from hypothesis import core\nsetattr(core, 'x', 1)": "setattr on core",
    "getattr(test, '_hypothesis_internal_use_settings')": "names '_hypothesis_internal",
    "importlib.import_module('hypothesis.internal.escalation')": "names 'hypothesis.internal",
}


@pytest.mark.parametrize("source", list(_CAUGHT))
def test_the_checker_catches_a_reach_into_hypothesis(source):
    found = hypothesis_touches(source)
    assert any(_CAUGHT[source] in line for line in found), (source, found)


def test_the_checker_lets_public_use_through():
    public = textwrap.dedent("""
        from hypothesis import given, settings, strategies as st
        from hypothesis.control import current_build_context
        from hypothesis.database import ExampleDatabase
        test = settings(database=None)(given(st.integers())(lambda x: None))
        fuzz = test.hypothesis.fuzz_one_input
        is_final = getattr(current_build_context(), "is_final", True)
        class Keyed(ExampleDatabase):
            def save(self, key, value): self._saved = (key, value)
    """)
    assert hypothesis_touches(public) == []


def test_no_module_of_ours_reaches_into_hypothesis():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)} {line}" for line in hypothesis_touches(path.read_text())]
    assert found == [], "\n".join(found)


def test_the_laws_plugin_has_no_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "pytest11" not in project.get("entry-points", {})
    try:
        installed = distribution("pfa-verify").entry_points
    except PackageNotFoundError:       # run from a checkout that was never installed: pyproject alone
        installed = ()
    assert [e for e in installed if e.group == "pytest11"] == []


def _pytest_help(folder: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "--help"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_pytest_session_elsewhere_has_none_of_the_laws_options(tmp_path):
    """pfa_verify importable (the checkout on the path, as an installed wheel would be), pytest started in
    an unrelated folder: no option of ours; with the plugin named, they are there (the premise)."""
    ours = ("pfa-verify:", "--backend", "--device", "--allow-unavailable", "--in-process", "--regressions")
    plain = _pytest_help(tmp_path)
    assert [o for o in ours if o in plain] == []
    named = _pytest_help(tmp_path, "-p", "pfa_verify.cases.plugin")
    assert [o for o in ours if o not in named] == []
