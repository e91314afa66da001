"""No module of the four packages reads another module's private name (issue 27).

A module boundary is a contract: a name with a leading underscore is its module's own business. Two
ways to cross it are caught: ``from package.module import _name`` and ``module._name`` where ``module``
was imported from one of the packages (``from package import module``, ``import package.module as m``).
A module's own privates, dunder names, and a private sub-module shared by the modules of its own package
(kernels/pypto_workarounds/_common.py, as Hypothesis keeps ``strategies/_internal``) are not crossings. tests/ is not checked: a test may pin a private helper of the module it
tests.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("golden", "kernels", "properties", "cases")


def _module_name(path: Path, root: Path) -> str:
    """The import name of a module file of the four folders: pfa_verify.<folder>...."""
    parts = ["pfa_verify", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _ours(name: str) -> bool:
    return name.split(".")[:2] in [["pfa_verify", p] for p in PACKAGES]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split(".")[1:])       # pfa_verify.golden.x -> golden/x
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _resolved(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The absolute module name of a ``from ... import`` (relative imports resolved against ``here``)."""
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_crossings(root: Path) -> list[str]:
    """'module:line: what' for every private name a module of the packages under ``root`` takes from
    another module."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            here = _module_name(path, root)
            tree = ast.parse(path.read_text(), filename=str(path))
            modules = {}                     # local name -> project module it is bound to
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    source = _resolved(node, here, path.name == "__init__.py")
                    if not _ours(source) or source == here:
                        continue
                    for alias in node.names:
                        own_submodule = here.startswith(source + ".") and _is_module(root, f"{source}.{alias.name}")
                        if _private(alias.name) and not own_submodule:
                            found.append(f"{here}:{node.lineno}: from {source} import {alias.name}")
                        else:
                            modules[alias.asname or alias.name] = f"{source}.{alias.name}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if _ours(alias.name) and alias.asname:
                            modules[alias.asname] = alias.name
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                        and node.value.id in modules and modules[node.value.id] != here):
                    found.append(f"{here}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_reads_another_module_s_private_name():
    assert private_crossings(ROOT) == []


def test_a_planted_private_import_is_found(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "golden" / "quant.py").write_text("from pfa_verify.golden.codec import _planted\n")
    (tmp_path / "cases" / "cli.py").write_text("from pfa_verify.cases.running import pool\n\n\ndef f():\n"
                                               "    return pool._death\n")
    (tmp_path / "cases" / "own.py").write_text("_mine = 1\n\n\ndef f():\n    return _mine\n")
    assert private_crossings(tmp_path) == ["pfa_verify.golden.quant:1: from pfa_verify.golden.codec import _planted",
                                           "pfa_verify.cases.cli:5: pfa_verify.cases.running.pool._death"]
