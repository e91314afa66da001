"""``pfa-verify mutants --latency``: how many generated cases a run spends before it kills each mutant.

The question directed generation raises: does aiming ``pfa-verify run``'s generated cases at the
coverage holes find bugs sooner, or later? For every mutant of a level, the generated cases of
``pfa-verify run --cases catalog --examples N --seed S`` for the mutant's shapes are judged in run order
under the one acceptance rule until one kills it (a counted failure, inputs that come back changed, or a
kernels.KernelRunError, as in the kill matrix: :func:`kills`); the row records that case's position, for the cases as run draws them (aimed at the holes the
catalog leaves, properties/search/directed.py) and as the plain strategy draws them under the same seed
(cases.data.collect.generated_cases). ``N + 1`` stands for "not killed by the N cases". Each
(mutant, order) runs like a row of the kill matrix (cases/measuring/matrix.py): in a fresh process where
a kernel error can spoil one (the sim).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from rich.table import Table

from pfa_verify.cases.data.collect import collect_items, generated_cases
from pfa_verify.cases.measuring.matrix import run_rows
from pfa_verify.cases.running.pool_worker import worker_backend
from pfa_verify.golden.errors import check_known
from pfa_verify.golden.paging import positive_int
from pfa_verify.kernels import Backend, BackendUnavailable, KernelRunError, mutants
from pfa_verify.properties.rule.acceptance import judge

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Latency", "kills", "latency_cell", "latency_rows", "summary", "render_table", "ORDERS"]

#: The two orders compared: the run's (directed) and the plain draws of before directed generation.
ORDERS = ("directed", "plain")


@dataclasses.dataclass
class Latency:
    """One mutant: the position of its first failing generated case in each order (None: none of the
    ``examples`` failed), and the seconds its cells took; ``error``: a cell broke (not a kill)."""
    name: str
    examples: int
    first: dict = dataclasses.field(default_factory=dict)     # order -> 1-based position or None
    seconds: float = 0.0
    error: str | None = None

    def kills_at(self, order: str) -> int:
        """The position, ``examples + 1`` when none of the cases killed it."""
        at = self.first.get(order)
        return self.examples + 1 if at is None else at


def _cases(backend, order: str, examples: int, seed: int) -> list:
    """The generated cases of ``pfa-verify run --cases catalog`` for ``backend``'s shapes, in run order."""
    supported = getattr(backend, "supported_shapes", None)
    if order == "plain":
        return generated_cases(examples, seed, supported=supported)
    return [i.case for i in collect_items("catalog", examples=examples, seed=seed, supported=supported)
            if i.source == "generated"]


def kills(backend, case) -> bool:
    """Whether ``case`` kills ``backend`` under the one rule, as in the kill matrix: a counted failure, an
    AssertionError (the inputs came back changed: properties.rule.acceptance.InputsModified) or a
    KernelRunError; any other exception is a broken cell and propagates."""
    try:
        return not judge(backend, case).passed
    except (AssertionError, KernelRunError):
        return True


def latency_cell(task: tuple, *, examples: int, seed: int) -> tuple[int | None, float] | str:
    """``(position or None, seconds)`` of one (mutant, order): the cases judged in order to the first kill;
    a one-line error when the cell broke. Each (mutant, order) is its own task, so a kernel error that
    spoils a sim process ends only its cell."""
    name, order = task
    start = time.perf_counter()
    try:
        backend = worker_backend(f"mutant:{name}")        # under a supervisor (kernels/backends/supervisor.py)
        for position, case in enumerate(_cases(backend, order, examples, seed), 1):
            if kills(backend, case):
                return position, time.perf_counter() - start
    except BackendUnavailable:
        raise                                 # the level cannot run here: the command says so, exit 2
    except Exception as exc:  # noqa: BLE001 - a broken cell (not a kill) must not lose the others
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None, time.perf_counter() - start


def latency_rows(level: str = "golden", *, examples: int = 20, seed: int = 0, names=None, workers: int = 1,
                 cluster=None) -> list[Latency]:
    """A :class:`Latency` row for every non-equivalent mutant of ``level`` (or ``names``)."""
    check_known("--level", "level", [level], mutants.LEVELS)
    chosen = names or [m.name for m in mutants.MUTANTS.values() if m.level == level and m.equivalent is None]
    check_known("--mutants", "mutant", chosen, mutants.MUTANTS, hint="`pfa-verify mutants --list` shows the catalog")
    positive_int(examples, "examples", minimum=1)
    mutants.reference(level)        # here, first: a level that cannot run here raises BackendUnavailable
    backend_class = mutants.level_backend_class(level)
    assert issubclass(backend_class, Backend)       # StagedGolden or the sim backend
    fresh = backend_class.kernel_errors_spoil_process
    tasks = [(name, order) for name in chosen for order in ORDERS]
    cells = run_rows(latency_cell, tasks, options={"examples": examples, "seed": seed},
                     broken=lambda task, error: error, workers=workers, cluster=cluster, fresh=fresh)
    rows = {name: Latency(name, examples) for name in chosen}
    for (name, order), cell in zip(tasks, cells, strict=True):
        row = rows[name]
        if isinstance(cell, str):
            row.error = row.error or cell
        else:
            row.first[order], seconds = cell
            row.seconds += seconds
    return list(rows.values())


def summary(rows: list[Latency]) -> dict:
    """Per order, over the rows that did not break: the median and worst position (a survivor counts as
    ``examples + 1``), the worst over the mutants that order killed, and how many it killed."""
    ok = [r for r in rows if r.error is None]
    out = {}
    for order in ORDERS:
        positions = [r.kills_at(order) for r in ok]
        killed = [r.first[order] for r in ok if r.first.get(order) is not None]
        out[order] = {"median": statistics.median(positions) if positions else None,
                      "worst": max(positions) if positions else None,
                      "worst_killed": max(killed) if killed else None, "killed": len(killed), "rows": len(ok)}
    return out


def render_table(rows: list[Latency], *, level: str, examples: int, seed: int) -> Table:
    """A rich table: mutant, position of the first failing case in each order; then the summary rows."""
    table = Table(title=f"Generated cases to the first kill, {level} level, --examples {examples} --seed {seed} "
                        f"({examples + 1} = not killed)")
    table.add_column("mutant", no_wrap=True)
    for order in ORDERS:
        table.add_column(order, justify="right")
    table.add_column("s", justify="right")
    for r in rows:
        cells = [r.error or "", ""] if r.error else [str(r.kills_at(o)) for o in ORDERS]
        table.add_row(r.name, *cells, f"{r.seconds:.1f}")
    s = summary(rows)
    table.add_row("median", *[f"{s[o]['median']}" for o in ORDERS], "", end_section=False)
    table.add_row("worst", *[f"{s[o]['worst']}" for o in ORDERS], "")
    table.add_row("worst of the killed", *[f"{s[o]['worst_killed']}" for o in ORDERS], "")
    table.add_row("killed", *[f"{s[o]['killed']}/{s[o]['rows']}" for o in ORDERS], "")
    return table
