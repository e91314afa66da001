"""The one driver of a matrix: rows of backends, columns of laws and the catalog.

``pfa-verify mutants`` (kill matrices: a row stops a column at its first failure, and shrinks it) and
``pfa-verify conforming`` (false reds: every example runs, every failure counts) differ in what a cell
records, not in how rows run. Both hand :func:`run_rows` a row function and the names of the rows: it
runs them here or in the worker pool (cases/running/pool.py, one row per task), keeps a row whose worker
died as a broken row (never a result), and gives each row a fresh process where the level's backend says
a kernel error can spoil one (``Backend.kernel_errors_spoil_process``: pypto's sim). The catalog column's
cases are :func:`catalog_cases`, and a failing example is recorded by :func:`example_record`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.running.pool import Pool

__all__ = ["run_rows", "catalog_cases", "example_record", "CATALOG"]

#: The name of the catalog column (the upstream and edge cases of cases/catalog.json, under the one rule).
CATALOG = "catalog"

R = TypeVar("R")


def run_rows(row: Callable[..., R], names: Sequence, *, options: dict, broken: Callable[[object, str], R],
             workers: int = 1, cluster=None, fresh: bool = False) -> list[R]:
    """``row(name, **options)`` for each of ``names``, results in that order: here when ``workers`` is 1,
    no ``cluster`` is given and rows need no ``fresh`` process; otherwise one row per task of a worker
    pool. A task whose worker died twice gives ``broken(name, its one-line error)``. ``row`` must be a
    module-level function (it travels to the workers by name)."""
    if workers <= 1 and cluster is None and not fresh:
        return [row(name, **options) for name in names]
    with Pool(workers=workers, cluster=cluster, fresh=fresh) as pool:
        tasks = pool.map(_row_task, [(row, name, options) for name in names])
    return [task.value if task.error is None else broken(name, task.error.splitlines()[0])
            for name, task in zip(names, tasks, strict=True)]


def _row_task(payload):
    row, name, options = payload
    return row(name, **options)


def catalog_cases(backend) -> list:
    """The catalog's cases ``backend`` runs (its skip_reason says None), smallest first: a kill is found
    on the cheapest case that shows it."""
    cases = [c for c in load_catalog().values() if backend.skip_reason(c.config) is None]
    return sorted(cases, key=lambda c: c.config.batch * c.config.s1 * c.config.nq * c.config.s2)


def example_record(case, params: dict, error: BaseException | None = None) -> dict:
    """A failing example as report data: its config, seed and law parameters (the catalog name where it
    has one), and the error's type and first line."""
    record = {"config": case.config.to_dict(), "seed": case.seed, "params": dict(params)}
    if getattr(case, "name", None):
        record["name"] = case.name
    if error is not None:
        text = str(error)
        record["message"] = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    return record
