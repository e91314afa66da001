"""``pfa-verify mutants``: how much the suite catches, as a number.

Every mutant of kernels/mutants (and the unmutated reference, the baseline) goes through the same laws,
with the same examples (properties/search/law_examples.py), and the same catalog as every other run, under
the one acceptance rule. For each (mutant, law) a Hypothesis search runs up to ``examples`` examples
and stops at the first failure: the law killed the mutant, after so many examples and seconds. The
mutant's first kill is then shrunk by Hypothesis' own shrinker to the smallest counterexample. The
catalog column runs the catalog's cases the backend supports (small ones first) until one fails the
one rule. A kill is a law's failure (an AssertionError, ``by="law"``) or a kernels.KernelRunError of
the backend (an unwritten output, an out-of-bounds read, pypto refusing the kernel while it runs:
``by="error"``; a run reports it as an ``error`` verdict, so it never passes). Any other exception (the mutated module does
not import or build, a bug of the suite) kills nothing: the row is broken, reported with its error,
and the run fails (exit 1), so a broken mutant can never raise the kill ratio. At the sim level the
rest of a row after a kernel error is not run (pypto 0.2.0 does not recover from a failure inside its
trace), and each mutant gets a fresh worker process.

The kill ratio counts the mutants without an equivalence proof; the run fails (exit 1) when the
baseline fails any law or the ratio is under ``--goal``. The matrix is data (``to_json``) and is
rendered by :func:`render_table` and :func:`render_html`.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from rich.table import Table

from pfa_verify.cases.data.schemas import check_written
from pfa_verify.cases.measuring.matrix import CATALOG, catalog_cases, example_record, run_rows
from pfa_verify.cases.reporting import html_pages
from pfa_verify.cases.running.pool_worker import worker_backend
from pfa_verify.cases.running.shrink import hunt
from pfa_verify.golden.errors import check_known
from pfa_verify.kernels import Backend, KernelRunError, mutants
from pfa_verify.kernels.backends.contract import shrink_budget
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.search import law_examples, laws
from pfa_verify.properties.search.law_examples import PAGED_LAWS

__all__ = ["LawKill", "MutantResult", "MutantsRun", "search", "catalog_kill", "kill_matrix", "to_json",
           "render_table", "render_html", "GOALS"]

GOALS = {"golden": 1.0, "sim": 0.9}


@dataclasses.dataclass
class LawKill:
    """One cell: did ``law`` kill the mutant, after how many examples and seconds, on what."""
    law: str
    killed: bool
    examples: int
    seconds: float
    counterexample: dict | None = None    # {"config", "seed", "params"} of the (shrunk) failing example
    message: str = ""                     # the failure's first line
    by: str | None = None                 # "law": the law failed; "error": a KernelRunError; None: no kill
    ran: bool = True                      # False: not run, after a kernel error in this process (see _one)


@dataclasses.dataclass
class MutantResult:
    name: str
    level: str
    bug: str
    equivalent: str | None
    cells: list                           # LawKill per law, then the catalog
    seconds: float = 0.0
    error: str | None = None              # the matrix itself broke on this mutant: neither killed nor clean

    @property
    def killed(self) -> bool:
        return any(c.killed for c in self.cells)

    @property
    def killing_laws(self) -> list[str]:
        return [c.law for c in self.cells if c.killed]

    @property
    def first_kill(self) -> LawKill | None:
        kills = [c for c in self.cells if c.killed and c.law != CATALOG]
        return min(kills, key=lambda c: (c.examples, c.seconds)) if kills else None


@dataclasses.dataclass
class MutantsRun:
    level: str
    examples: int
    seed: int
    baseline: MutantResult
    mutants: list
    goal: float
    seconds: float
    allowed_survivors: tuple = ()         # named by the user: reported as survivors, not failing the goal

    @property
    def counted(self) -> list:
        return [m for m in self.mutants if m.equivalent is None]

    @property
    def kill_ratio(self) -> float:
        counted = self.counted
        return sum(m.killed for m in counted) / len(counted) if counted else 1.0

    def goal_ratio(self) -> float:
        """The share of counted mutants killed or allowed by name to survive: what ``goal`` is held to."""
        counted = self.counted
        ok = sum(m.killed or m.name in self.allowed_survivors for m in counted)
        return ok / len(counted) if counted else 1.0

    @property
    def exit_status(self) -> int:
        broken = any(m.error for m in [self.baseline] + self.mutants)
        return 1 if self.baseline.killed or broken or self.goal_ratio() < self.goal else 0


def _kill_kind(error: BaseException) -> str:
    """``"law"`` (an AssertionError: the law failed) or ``"error"`` (a kernels.KernelRunError: the kernel
    did not deliver); any other exception is not a kill and is raised again: the row is broken."""
    if isinstance(error, AssertionError):
        return "law"
    if isinstance(error, KernelRunError):
        return "error"
    raise error


def search(law: str, backend, *, examples: int, seed: int, shrink_s: float = 0.0) -> LawKill:
    """Run ``law`` on up to ``examples`` of its examples against ``backend`` (cases/shrink.hunt); stop
    at the first failure, an AssertionError of the law (``by="law"``) or a KernelRunError of the
    backend (``by="error"``), then let Hypothesis shrink it for ``shrink_s`` seconds. Any other
    exception propagates (:func:`_kill_kind`)."""

    def check(example):
        case, params = example
        laws.run(law, backend, case, **params)

    found = hunt(law_examples.examples(law, backend), check, seed=seed, examples=examples, shrink_s=shrink_s,
                 shrink_calls=shrink_budget(backend))
    if found.error is None:
        return LawKill(law, False, found.examples, found.seconds)
    by = _kill_kind(found.error)
    assert found.example is not None        # hunt sets the failing example with its error
    case, params = found.example
    text = str(found.error)
    return LawKill(law, True, found.examples, found.seconds, example_record(case, params),
                   f"{type(found.error).__name__}: {text.splitlines()[0] if text else ''}", by=by)


def catalog_kill(backend) -> LawKill:
    """The catalog's cases the backend runs, smallest first, under the one rule, to the first failure
    (a kill as in :func:`search`: a failed rule, an AssertionError or a KernelRunError)."""
    start = time.perf_counter()
    cases = catalog_cases(backend)
    for count, case in enumerate(cases, 1):
        try:
            verdict = judge(backend, case)
            failed, message, by = not verdict.passed, verdict.message().split("\n")[0], "law"
        except Exception as exc:  # noqa: BLE001 - a kill or, raised again by _kill_kind, a broken row
            by = _kill_kind(exc)
            failed, message = True, f"{type(exc).__name__}: {exc}".split("\n")[0]
        if failed:
            return LawKill(CATALOG, True, count, time.perf_counter() - start, example_record(case, {}), message, by=by)
    return LawKill(CATALOG, False, len(cases), time.perf_counter() - start)


def _one(name: str | None, *, level: str, examples: int, seed: int, laws: tuple, catalog: bool,
         shrink_s: float = 30.0, first_kill_only: bool = False, progress=None) -> MutantResult:
    """One row of the matrix: ``name`` (None: the baseline) through ``laws``, then the catalog; with
    ``first_kill_only``, the laws after the first that kills are not run (tests/meta: killed or not)."""
    if level not in mutants.LEVELS:
        raise ValueError(f"level={level!r} must be one of {mutants.LEVELS}")
    entry = None if name is None else mutants.MUTANTS[name]
    # The mutant's kernel runs under a supervisor, in a worker process of this one (kernels/backends/supervisor.py).
    backend = worker_backend("mutant:" + (name or ("none" if level == "golden" else "sim/none")))
    start = time.perf_counter()
    cells: list[LawKill] = []
    columns = list(laws) + ([CATALOG] if catalog else [])
    spoils = getattr(backend, "kernel_errors_spoil_process", False)
    for column in columns:
        spoiled = next((c for c in cells if c.by == "error"), None) if spoils else None
        if spoiled is not None:
            # pypto 0.2.0 does not recover from a kernel that fails inside its trace: the next trace in
            # the process fails ("function nested is not allowed") or crashes. The kill stands; the
            # rest of the row would only measure that, so it is not run.
            cells.append(LawKill(column, False, 0, 0.0, message=f"not run: {spoiled.law} ended in a kernel error",
                                 ran=False))
            continue
        cells.append(catalog_kill(backend) if column == CATALOG else search(column, backend, examples=examples, seed=seed))
        progress and progress(name, cells[-1])
        if first_kill_only and cells[-1].killed:
            break
    result = MutantResult(name or "none (baseline)", level, entry.bug if entry else "the unmutated reference",
                          entry.equivalent if entry else None, cells)
    first = result.first_kill
    if first is not None and shrink_s > 0 and not (spoils and first.by == "error"):
        # the smallest counterexample of the first kill, by Hypothesis' shrinker
        shrunk = search(first.law, backend, examples=examples, seed=seed, shrink_s=shrink_s)
        if shrunk.killed:
            first.counterexample, first.message = shrunk.counterexample, shrunk.message
    result.seconds = time.perf_counter() - start
    return result


def _one_or_error(name: str | None, **options) -> MutantResult:
    """:func:`_one`, with an exception of the matrix itself (not of a law) kept as the row's error."""
    try:
        return _one(name, **options)
    except Exception as exc:  # noqa: BLE001 - one broken row must not lose the others
        entry = None if name is None else mutants.MUTANTS.get(name)
        return MutantResult(name or "none (baseline)", options["level"], entry.bug if entry else "the unmutated reference",
                            None, [], error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def _broken(level: str):
    def broken(name, error: str) -> MutantResult:
        entry = None if name is None else mutants.MUTANTS.get(name)
        return MutantResult(name or "none (baseline)", level, entry.bug if entry else "the unmutated reference",
                            None, [], error=error)
    return broken


def rows(names: list, *, level: str, workers: int = 1, progress=None, cluster=None, **options) -> list:
    """:func:`_one_or_error` for each of ``names`` (None: the baseline), results in that order, by the one
    matrix driver (cases/measuring/matrix.py): here, in ``workers`` processes or on ``cluster``; a fresh
    process per row where the level's backend says a kernel error can spoil one (the sim). A row whose
    worker died twice is a broken row (its error), never a kill."""
    note = progress or (lambda *a: None)
    backend_class = mutants.level_backend_class(level)
    assert issubclass(backend_class, Backend)       # StagedGolden or the sim backend
    fresh = backend_class.kernel_errors_spoil_process
    in_process = workers <= 1 and cluster is None and not fresh
    results = run_rows(_one_or_error, names, options=dict(options, level=level, progress=note if in_process else None),
                       broken=_broken(level), workers=workers, cluster=cluster, fresh=fresh)
    if not in_process:
        for r in results:
            for cell in r.cells:
                note(r.name, cell)
    return results


def kill_matrix(level: str = "golden", *, examples: int = 20, seed: int = 0, names=None, laws=None,
                catalog: bool = True, goal: float | None = None, workers: int = 1, shrink_s: float = 30.0,
                allowed_survivors=(), progress=None, cluster=None) -> MutantsRun:
    """The baseline and every mutant of ``level`` (or ``names``) through every paged-attention law,
    in ``workers`` processes or on ``cluster`` (cases/running/pool.py; one mutant each at a time); each first
    kill shrunk for ``shrink_s`` s."""
    check_known("--level", "level", [level], mutants.LEVELS)
    chosen = names or [m.name for m in mutants.MUTANTS.values() if m.level == level and m.equivalent is None]
    listing = "`pfa-verify mutants --list` shows the catalog"
    check_known("--mutants", "mutant", chosen, mutants.MUTANTS, hint=listing)
    if "ledger" in allowed_survivors:      # the ledger's survivors of this level (properties/rule/ledger.py)
        ledger.check(mutants=mutants.MUTANTS)
        allowed_survivors = [n for n in allowed_survivors if n != "ledger"] + list(ledger.survivors(level))
    check_known("--allow-survivors", "mutant", allowed_survivors, mutants.MUTANTS, hint=listing)
    laws = tuple(laws or PAGED_LAWS)
    check_known("--laws", "law", laws, PAGED_LAWS)
    start = time.perf_counter()
    base, *results = rows([None] + chosen, level=level, workers=workers, progress=progress, cluster=cluster,
                          examples=examples, seed=seed, laws=laws, catalog=catalog, shrink_s=shrink_s)
    listed = [mutants.MUTANTS[m] for m in mutants.MUTANTS if mutants.MUTANTS[m].level == level
              and mutants.MUTANTS[m].equivalent is not None and (names is None or m in names)]
    results += [MutantResult(m.name, level, m.bug, m.equivalent, []) for m in listed]
    return MutantsRun(level, examples, seed, base, results, GOALS[level] if goal is None else goal,
                      time.perf_counter() - start, tuple(allowed_survivors))


def _cell_json(c: LawKill) -> dict:
    return dataclasses.asdict(c) | {"seconds": round(c.seconds, 3)}


def to_json(run: MutantsRun) -> dict:
    """The report (schema: cases/mutants.schema.json, checked here): ``mutants`` (name, level, killed,
    killing_laws, examples_to_kill, seconds, counterexample, ...), ``baseline`` (examples, failures),
    ``kill_ratio``."""
    def one(m: MutantResult) -> dict:
        first = m.first_kill
        kills = [c for c in m.cells if c.killed]
        return {"name": m.name, "level": m.level, "bug": m.bug, "equivalent": m.equivalent, "error": m.error,
                "killed": m.killed,
                "killing_laws": m.killing_laws,
                "examples_to_kill": first.examples if first else (kills[0].examples if kills else None),
                "seconds": round(first.seconds if first else (kills[0].seconds if kills else m.seconds), 3),
                "counterexample": (first or kills[0]).counterexample if kills else None,
                "cells": [_cell_json(c) for c in m.cells]}
    counted = [m for m in run.mutants if m.equivalent is None]
    to_kill = [one(m)["examples_to_kill"] for m in counted if m.killed]
    data = {"schema": "pfa-verify-mutants/1", "level": run.level, "examples": run.examples, "seed": run.seed,
            "baseline": {"examples": sum(c.examples for c in run.baseline.cells),
                         "failures": [_cell_json(c) for c in run.baseline.cells if c.killed],
                         "error": run.baseline.error},
            "mutants": [one(m) for m in run.mutants], "kill_ratio": round(run.kill_ratio, 4), "goal": run.goal,
            "counted": len(counted), "killed": sum(m.killed for m in counted),
            "median_examples_to_kill": statistics.median(to_kill) if to_kill else None,
            "worst_examples_to_kill": max(to_kill) if to_kill else None,
            "allowed_survivors": list(run.allowed_survivors),
            "seconds": round(run.seconds, 1), "exit_status": run.exit_status}
    check_written(data, "mutants")
    return data


def _cell_text(c: LawKill) -> str:
    if not c.ran:
        return "not run"
    return (f"error@{c.examples}" if c.by == "error" else f"killed@{c.examples}") if c.killed else "-"


def _columns(run: MutantsRun) -> list[str]:
    return [c.law for c in max(([run.baseline] + run.mutants), key=lambda m: len(m.cells)).cells]


def render_table(run: MutantsRun):
    """A rich Table: one row per mutant, one column per law and the catalog."""
    columns = _columns(run)
    table = Table(title=f"pfa-verify mutants: level {run.level}, {run.examples} examples per law", title_justify="left")
    table.add_column("mutant", no_wrap=True)
    for col in columns:
        table.add_column(col.replace("_", " "), justify="center")
    table.add_column("s", justify="right")
    for m in [run.baseline] + run.mutants:
        if m.equivalent is not None:
            table.add_row(f"[dim]{m.name}[/]", *["[dim]equivalent[/]"] + [""] * (len(columns) - 1), "")
            continue
        if m.error:
            table.add_row(f"[red]{m.name}[/]", *[f"[red]error: {m.error}[/]"] + [""] * (len(columns) - 1), "")
            continue
        style = "red" if m is run.baseline and m.killed else ("green" if m.killed else "yellow")
        cells = [(f"[bold]{_cell_text(c)}[/]" if c.killed else f"[dim]{_cell_text(c)}[/]") for c in m.cells]
        table.add_row(f"[{style}]{m.name}[/]", *cells, f"{m.seconds:.1f}")
    return table


def summary_line(run: MutantsRun) -> str:
    data = to_json(run)
    base = "baseline clean" if not run.baseline.killed else f"BASELINE FAILS ({', '.join(run.baseline.killing_laws)})"
    if run.baseline.error:
        base = f"BASELINE BROKE ({run.baseline.error})"
    broken = [m.name for m in run.mutants if m.error]
    if broken:
        base += f"; {len(broken)} mutant(s) broke the matrix ({', '.join(broken)})"
    allowed = [m.name for m in run.counted if not m.killed and m.name in run.allowed_survivors]
    if allowed:
        base += f"; survivors allowed by name: {', '.join(allowed)}"
    by_error = sum(1 for m in run.counted if m.killed and all(c.by == "error" for c in m.cells if c.killed))
    errors = f", {by_error} of them only by a kernel error" if by_error else ""
    return (f"level {run.level}: {data['killed']}/{data['counted']} mutants killed{errors} (kill ratio {run.kill_ratio:.0%}, "
            f"goal {run.goal:.0%}), {len(run.mutants) - data['counted']} equivalent listed; examples to kill: median "
            f"{data['median_examples_to_kill']}, worst {data['worst_examples_to_kill']}; {base}; {run.seconds:.1f} s -> "
            + ("OK" if run.exit_status == 0 else "FAILED"))


def counterexample_text(law: str, example: dict) -> str:
    """One line for a counterexample record: the law, the case's shape and lengths, its params."""
    c = example["config"]
    text = (f"{law}: B={c['batch']} S1={c['s1']} NQ={c['nq']} NKV={c['nkv']} D={c['head_dim']} BS={c['block_size']} "
            f"s2_tile={c['s2_tile']} kv_act_seqs={c['kv_act_seqs']} {c['distribution']}"
            + (f" garbage={c['garbage']}" if c.get("garbage") else "") + f" seed={example['seed']}")
    params = ", ".join(f"{k}={v}" for k, v in example.get("params", {}).items())
    return text + (f" ({params})" if params else "") + (f" [{example['name']}]" if example.get("name") else "")


def _cell_class(baseline: bool, c: LawKill) -> str:
    if baseline and c.killed:
        return "b"
    if not c.ran:
        return "n"
    return ("e" if c.by == "error" else "k") if c.killed else "s"


_CSS = ("body{font:14px system-ui,sans-serif;margin:24px}table{border-collapse:collapse}td,th{border:1px solid #ddd;"
        "padding:3px 8px;font-size:12px}td.k{background:#c8e6c9}td.s{background:#fff3e0}tr.eq td{color:#888}"
        "td.b{background:#ffcdd2}td.e{background:#dcedc8}td.n{background:#eeeeee;color:#777}"
        "td.bug{min-width:360px;max-width:560px}th{vertical-align:bottom}")


def render_html(run: MutantsRun) -> str:
    """The kill matrix as one self-contained HTML page (cases/templates/mutants.html.j2; no scripts, no network)."""
    rows = []
    for m in [run.baseline] + run.mutants:
        first = m.first_kill
        rows.append({"name": m.name, "bug": m.bug, "equivalent": m.equivalent, "error": m.error,
                     "cells": [{"cls": _cell_class(m is run.baseline, c), "message": c.message, "text": _cell_text(c)}
                               for c in m.cells],
                     "smallest": counterexample_text(first.law, first.counterexample)
                     if first and first.counterexample else None})
    return html_pages.render("mutants.html.j2", css=_CSS, level=run.level, summary=summary_line(run),
                             columns=_columns(run), rows=rows)
