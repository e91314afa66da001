"""``pfa-verify conforming``: false reds of the suite, as a number.

The mutants' counterpart. Every variant of kernels/conforming is a correct kernel that uses only SPEC
§4.1's freedoms (other float32 summation orders and trees, Kahan, fused multiply-adds, other dequant
orders, exp up to F3's 3 ulp and division 1 ulp off, vertex kernels at the ends of the raw scores'
intervals). Each goes through every paged-attention law on the same examples as the mutants
(properties/search/law_examples.py) and through every case of the catalog, under the one acceptance rule. Unlike a mutant's search, a
variant's search does not stop at a failure: every example runs and each failure is a false red, counted
per (variant, law). The acceptance law steers the search towards the edge of the rule
(``hypothesis.target`` on the worst error over what the rule allows), so the search also looks for
escapes from the envelope. The goal is 0; any false red fails the command (exit 1).
"""
from __future__ import annotations

import dataclasses
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from rich.table import Table

from pfa_verify.cases.measuring.matrix import CATALOG, catalog_cases, example_record, run_rows
from pfa_verify.cases.running.pool_worker import worker_backend
from pfa_verify.golden.errors import check_known
from pfa_verify.golden.model import declared_model
from pfa_verify.kernels.conforming import VARIANTS
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.search import law_examples, laws
from pfa_verify.properties.search.law_examples import PAGED_LAWS

__all__ = ["Cell", "VariantResult", "ConformingRun", "false_reds", "to_json", "render_table", "model_lines", "summary_line"]



@dataclasses.dataclass
class Cell:
    """One (variant, law) cell: examples run, failures among them (false reds), the first one."""
    law: str
    examples: int
    failures: int
    seconds: float
    first_failure: dict | None = None     # {"config", "seed", "params", "message"}


@dataclasses.dataclass
class VariantResult:
    name: str
    description: str
    cells: list
    seconds: float = 0.0
    error: str | None = None
    model: str | None = None              # the golden.model.ConformanceModel it was judged by, describe()

    @property
    def false_reds(self) -> int:
        return sum(c.failures for c in self.cells)


@dataclasses.dataclass
class ConformingRun:
    examples: int
    seed: int
    variants: list
    seconds: float

    @property
    def false_reds(self) -> int:
        return sum(v.false_reds for v in self.variants)

    @property
    def exit_status(self) -> int:
        return 1 if self.false_reds or any(v.error for v in self.variants) else 0


def _law_cell(law: str, backend, *, examples: int, seed: int) -> Cell:
    """Every one of ``examples`` examples of ``law`` (generate and target phases), failures counted."""

    cell = Cell(law, 0, 0, 0.0)
    start = time.perf_counter()

    @fixed_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate, Phase.target],
              suppress_health_check=list(HealthCheck))
    @given(law_examples.examples(law, backend))
    def run(example):
        case, params = example
        cell.examples += 1
        try:
            laws.run(law, backend, case, **params)
        except Exception as exc:  # noqa: BLE001 - any failure of a correct kernel is a false red
            cell.failures += 1
            if cell.first_failure is None:
                cell.first_failure = example_record(case, params, exc)

    run()
    cell.seconds = time.perf_counter() - start
    return cell


def _catalog_cell(backend) -> Cell:
    cell = Cell(CATALOG, 0, 0, 0.0)
    start = time.perf_counter()
    error: Exception                    # what failed: the rule's verdict as an AssertionError, or what was raised
    for case in catalog_cases(backend):
        cell.examples += 1
        try:
            verdict = judge(backend, case)
            if verdict.passed:
                continue
            error = AssertionError(verdict.message())
        except Exception as exc:  # noqa: BLE001
            error = exc
        cell.failures += 1
        if cell.first_failure is None:
            cell.first_failure = example_record(case, {}, error)
    cell.seconds = time.perf_counter() - start
    return cell


def _variant(name: str, *, examples: int, seed: int, laws: tuple, catalog: bool) -> VariantResult:
    start = time.perf_counter()
    try:
        backend = worker_backend(f"conforming:{name}")       # under a supervisor (kernels/backends/supervisor.py)
        cells = [_law_cell(law, backend, examples=examples, seed=seed) for law in laws]
        if catalog:
            cells.append(_catalog_cell(backend))
        return VariantResult(name, VARIANTS[name].description, cells, time.perf_counter() - start,
                             model=declared_model(backend).describe())
    except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others
        return VariantResult(name, VARIANTS[name].description, [], time.perf_counter() - start,
                             error=f"{type(exc).__name__}: {exc}")


def _broken(name: object, error: str) -> VariantResult:
    """The row of a variant whose worker died twice (run_rows' ``broken``)."""
    assert isinstance(name, str)        # run_rows gives back one of the variant names it was given
    return VariantResult(name, VARIANTS[name].description, [], error=error)


def false_reds(*, examples: int = 20, seed: int = 0, names=None, laws=None, catalog: bool = True,
               workers: int = 1, cluster=None) -> ConformingRun:
    """Every conforming variant (or ``names``) through every paged-attention law (or ``laws``) and the
    catalog, ``examples`` examples per law; ``workers`` processes or ``cluster`` (cases/running/pool.py), one
    variant each at a time. A variant whose worker died twice is a broken row (exit 1)."""
    chosen = list(names or VARIANTS)
    check_known("--mutants", "conforming variant", chosen, sorted(VARIANTS))
    laws = tuple(laws or PAGED_LAWS)
    check_known("--laws", "law", laws, PAGED_LAWS)
    start = time.perf_counter()
    options = dict(examples=examples, seed=seed, laws=laws, catalog=catalog)
    results = run_rows(_variant, chosen, options=options, workers=workers, cluster=cluster,
                       broken=_broken)
    return ConformingRun(examples, seed, results, time.perf_counter() - start)


def to_json(run: ConformingRun) -> dict:
    """The report: per variant its false reds, per law and the catalog."""
    return {"schema": "pfa-verify-conforming/1", "examples": run.examples, "seed": run.seed,
            "variants": [{"name": v.name, "description": v.description, "model": v.model, "false_reds": v.false_reds,
                          "error": v.error, "seconds": round(v.seconds, 1),
                          "cells": [dataclasses.asdict(c) | {"seconds": round(c.seconds, 2)} for c in v.cells]}
                         for v in run.variants],
            "false_reds": run.false_reds, "goal": 0, "seconds": round(run.seconds, 1), "exit_status": run.exit_status}


def render_table(run: ConformingRun):
    """A rich Table: one row per variant, failures / examples per law and the catalog."""
    columns = [c.law for c in max(run.variants, key=lambda v: len(v.cells)).cells] if run.variants else []
    table = Table(title=f"pfa-verify mutants: level conforming (false reds), {run.examples} examples per law",
                  title_justify="left")
    table.add_column("variant", no_wrap=True)
    for col in columns:
        table.add_column(col.replace("_", " "), justify="center")
    table.add_column("s", justify="right")
    for v in run.variants:
        if v.error:
            table.add_row(f"[red]{v.name}[/]", f"[red]error: {v.error}[/]", *[""] * (len(columns) - 1), "")
            continue
        cells = [(f"[bold red]{c.failures}/{c.examples}[/]" if c.failures else f"[dim]0/{c.examples}[/]") for c in v.cells]
        table.add_row(f"[{'red' if v.false_reds else 'green'}]{v.name}[/]", *cells, f"{v.seconds:.1f}")
    return table


def model_lines(run: ConformingRun) -> list[str]:
    """Which models judged the variants (golden.model: SPEC §4.1's freedoms, the figures of each), one line
    a model with the variants it judged."""
    judged: dict[str, list[str]] = {}
    for v in run.variants:
        if v.model:
            judged.setdefault(v.model, []).append(v.name)
    return [f"Judged by {model}: {len(names)} variant{'s' if len(names) != 1 else ''}"
            + (f" ({', '.join(names)})" if len(judged) > 1 and len(names) <= 6 else "") for model, names in judged.items()]


def summary_line(run: ConformingRun) -> str:
    broken = [v.name for v in run.variants if v.error]
    examples = sum(c.examples for v in run.variants for c in v.cells)
    return (f"level conforming: {run.false_reds} false reds in {examples} examples of {len(run.variants)} correct "
            f"variants (goal 0)" + (f"; {len(broken)} variant(s) broke ({', '.join(broken)})" if broken else "")
            + f"; {run.seconds:.1f} s -> " + ("OK" if run.exit_status == 0 else "FAILED"))
