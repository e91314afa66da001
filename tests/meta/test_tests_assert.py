"""Every test of the suite asserts something (issue 18: tests that cannot fail are defects).

An AST scan of every tests/**/test_*.py: each test function must reach, in its own body or through a
helper it calls (a function of the same module or of a helper module under tests/, followed to any
depth), one of

- an ``assert`` statement;
- ``pytest.raises``, ``pytest.warns`` or ``pytest.fail``;
- a call of an assertion of the project or the suite: a name starting with ``assert`` (``cmp.assert_close``,
  ``_assert_unchanged``) or ``check`` (the ``check_law`` fixture, ``regressions.check``), or one of
  :data:`RAISING`, functions that raise when what they check fails (a law, a replay, ``hypothesis.find``).

A test that only calls the code under test passes whatever it computes (a compile that returns, inputs
that build): it checks that nothing raised, and says so with an assert of what it got. Known
exceptions go in :data:`EXEMPT` with the reason; there are none.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent

#: Project functions that raise AssertionError when what they check does not hold (by their contract).
RAISING = {"laws.run": "pfa_verify.properties.search.laws.run: a law raises AssertionError when it fails",
           "regressions.replay": "pfa_verify.cases.data.regressions.replay: raises AssertionError when the case still fails",
           "find": "hypothesis.find: raises NoSuchExample when no draw satisfies the condition (reachability)"}
#: test id -> why it asserts nothing (none today).
EXEMPT: dict[str, str] = {}
_PYTEST_ASSERTIONS = {"raises", "warns", "fail"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


class _Module:
    """The functions of one test module and of the helper modules it imports from tests/."""

    def __init__(self, path: Path):
        self.path = path
        self.functions: dict[str, ast.AST] = {}
        self._add(ast.parse(path.read_text()), path)

    def _add(self, tree: ast.Module, path: Path) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
        for node in tree.body:                       # helpers imported from the suite's own modules
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
                helper = TESTS.parent.joinpath(*node.module.split(".")).with_suffix(".py")
                if helper.is_file() and helper != path:
                    self._add(ast.parse(helper.read_text()), helper)

    def asserts(self, function: ast.AST, seen: frozenset = frozenset()) -> bool:
        for node in ast.walk(function):
            if isinstance(node, ast.Assert):
                return True
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            last = name.rpartition(".")[2]
            if name.startswith("pytest.") and last in _PYTEST_ASSERTIONS:
                return True
            if last.lstrip("_").startswith(("assert", "check")) or name in RAISING:
                return True
            helper = self.functions.get(last)
            if helper is not None and helper is not function and last not in seen:
                if self.asserts(helper, seen | {last}):
                    return True
        return False


def _tests() -> list:
    out = []
    for path in sorted(TESTS.rglob("test_*.py")):
        module = _Module(path)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                out.append((f"{path.relative_to(TESTS.parent)}::{node.name}", module, node))
    return out


TEST_FUNCTIONS = _tests()


def test_the_scan_sees_the_suite():
    """The scan reads every test module (not an empty list that passes the next test vacuously)."""
    modules = {name.split("::")[0] for name, _, _ in TEST_FUNCTIONS}
    assert len(TEST_FUNCTIONS) > 300 and len(modules) == len(list(TESTS.rglob("test_*.py")))
    assert "tests/meta/test_tests_assert.py::test_the_scan_sees_the_suite" in {n for n, _, _ in TEST_FUNCTIONS}


def test_every_test_asserts_something():
    silent = [name for name, module, node in TEST_FUNCTIONS if name not in EXEMPT and not module.asserts(node)]
    assert not silent, ("tests that assert nothing (they pass whatever the code does): " + ", ".join(silent)
                        + "; assert what the call must give")
    assert not set(EXEMPT) - {n for n, _, _ in TEST_FUNCTIONS}, "EXEMPT names tests that no longer exist"


@pytest.mark.parametrize("source, asserts", [
    ("def test_x():\n    f()\n", False),
    ("def test_x():\n    assert f()\n", True),
    ("def test_x():\n    with pytest.raises(ValueError):\n        f()\n", True),
    ("def test_x(check_law):\n    check_law('acceptance', case)\n", True),
    ("def helper():\n    assert g()\n\ndef test_x():\n    helper()\n", True),
    ("def helper():\n    g()\n\ndef test_x():\n    helper()\n", False),
    ("def a():\n    b()\n\ndef b():\n    a()\n\ndef test_x():\n    a()\n", False),
    ("def test_x():\n    laws.run('acceptance', backend, case)\n", True),
    ("def test_x():\n    pytest.skip('no')\n", False),
], ids=["bare call", "assert", "raises", "check fixture", "asserting helper", "silent helper", "recursion",
        "law", "skip only"])
def test_the_scan_tells_asserting_tests_from_silent_ones(tmp_path, source, asserts):
    path = tmp_path / "test_sample.py"
    path.write_text(source)
    module = _Module(path)
    assert module.asserts(module.functions["test_x"]) is asserts
