"""The layout's one-way dependencies, checked from the import lines of every module:

- packages: golden <- kernels <- properties <- cases (tests may use all);
- cases/ is a pipeline: catalog, ledger, versions, regressions, collect, provenance, shrink, tightness, bench_stages,
  bench, pool, mutants, conforming, search -> run -> report -> html_report -> report_compare -> cli, and nothing imports cli;
- no cycle between modules of the project (a module may import its own package's __init__).

``python tests/test_import_graph.py`` prints the package graph and the largest modules.
"""
from __future__ import annotations

import ast
import collections
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("golden", "kernels", "properties", "cases")
CASES_ORDER = ("catalog", "ledger", "versions", "regressions", "collect", "provenance", "shrink", "tightness",
               "bench_stages", "bench", "pool", "mutants", "conforming", "search", "run", "report", "html_report",
               "report_compare", "cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports() -> dict[str, set[str]]:
    """Project modules each project module imports (at any depth of its code)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                found = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in found:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def package_graph() -> dict[str, set[str]]:
    out = collections.defaultdict(set)
    for src, targets in imports().items():
        for t in targets:
            a, b = src.split(".")[0], t.split(".")[0]
            if a != b:
                out[a].add(b)
    return {p: out[p] for p in PACKAGES}


def test_packages_depend_one_way():
    graph = package_graph()
    for pkg, deps in graph.items():
        later = {d for d in deps if PACKAGES.index(d) > PACKAGES.index(pkg)}
        assert not later, f"{pkg} imports {sorted(later)}, against golden <- kernels <- properties <- cases"


def test_cases_is_a_one_way_pipeline():
    graph = imports()
    for src, targets in graph.items():
        if not src.startswith("cases."):
            continue
        for t in targets:
            if t.startswith("cases."):
                a, b = src.split(".")[1], t.split(".")[1]
                assert CASES_ORDER.index(b) < CASES_ORDER.index(a), f"{src} imports {t}: against the pipeline order"


def test_no_module_cycles():
    """No cycle between modules; a module importing its own package's __init__ (kernels.backends.sim
    taking Backend from kernels.backends) is how a package shares its base, not a cycle."""
    graph = {src: {t for t in targets if not src.startswith(t + ".")} for src, targets in imports().items()}
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for t in graph.get(node, ()):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


if __name__ == "__main__":
    for pkg, deps in package_graph().items():
        print(f"{pkg:<11} imports {', '.join(sorted(deps)) or '(nothing of the project)'}")
    sizes = sorted(((len(p.read_text().splitlines()), n) for n, p in modules().items()), reverse=True)
    print("largest modules: " + ", ".join(f"{n} {lines}" for lines, n in itertools.islice(sizes, 6)))
