"""``pfa-verify search``: long law searches (the nightly kind), split into tasks, on any pool.

Each law's search of ``examples`` examples is split into ``tasks`` tasks of about ``examples / tasks``
examples, each under its own seed (:func:`task_seed`: distinct per law and task, the same for the same
``--seed``), and the tasks run through :mod:`cases.running.pool` (here, local processes or a Ray cluster). A
task is one :func:`cases.running.shrink.hunt` over the law's examples (properties/law_examples.py, the same
domains as pytest's law tests and the mutants): it stops at its first failure and does not shrink it.

With ``--database`` the tasks share Hypothesis's example database (a directory every node can reach,
or ``redis://HOST:PORT[/DB]``, Hypothesis's RedisExampleDatabase, which needs the ``redis`` package):
a failure saved by one task is replayed first by every later task of the same law and backend, on any
node, and by tomorrow's search.

The failures come back to the driver, grouped by :func:`failure_signature` (law, kind of failure);
the first of each group, in law and task order, is shrunk here by Hypothesis for ``shrink_s``
seconds (the task's seed replayed, or the database) and captured once through cases/data/regressions.py;
every other member points at it. Exit 1 when anything failed, or a task ended in an error (its worker
died twice, the backend could not start); 0 when every example of every law held.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import Counter

from hypothesis.database import DirectoryBasedExampleDatabase
from rich.markup import escape
from rich.table import Table

from cases.running.capture import capture_case
from cases.running.pool import Pool, task_resources, worker_backend
from cases.running.shrink import hunt
from golden.errors import UsageError, check_known
from kernels import BackendUnavailable
from kernels.backends.contract import shrink_budget
from properties import law_examples, laws
from properties.coverage import Coverage, classify
from properties.law_examples import BACKEND_LAWS, PAGED_LAWS

__all__ = ["TaskReport", "SearchRun", "task_seed", "failure_signature", "open_database", "search", "to_json",
           "summary_line", "render_table", "law_verdicts", "render_law_table"]


@dataclasses.dataclass
class TaskReport:
    """One task: ``law``, its index, its seed, the examples it drew, its seconds, where it ran, and its
    failure (``case``, ``params``, ``kind``, ``message``) or ``error`` (the task itself broke)."""
    law: str
    task: int
    seed: int
    examples: int = 0
    seconds: float = 0.0
    node: str | None = None
    failure: dict | None = None
    error: str | None = None
    replay: str | None = None
    hits: dict = dataclasses.field(default_factory=dict)   # coverage bin -> examples that hit it (properties/coverage.py)
    cut: bool = False               # the law's time budget ended the task before its examples were drawn
    skipped: str | None = None      # why the backend cannot run this law (kernels.BackendUnavailable), or None


@dataclasses.dataclass
class SearchRun:
    backend: str
    laws: tuple
    examples: int
    tasks_per_law: int
    seed: int
    database: str | None
    tasks: list
    captured: list
    seconds: float
    execution: dict | None = None

    def coverage(self) -> Coverage:
        """The coverage (properties.coverage.Coverage) of every example the tasks drew."""

        hits: Counter = Counter()
        for t in self.tasks:
            hits.update(t.hits)
        # AT-12 calls have no coverage bins: the count is of the paged-attention examples alone
        return Coverage.from_hits(hits, sum(t.examples for t in self.tasks if t.error is None and t.law in PAGED_LAWS))

    @property
    def exit_status(self) -> int:
        """1 when a law failed, a task broke, or a law could not run on the backend (nothing checked it)."""
        return 1 if any(t.failure or t.error or t.skipped for t in self.tasks) else 0


def task_seed(seed: int, law: str, task: int) -> int:
    """The seed of task ``task`` of ``law``: a 32-bit hash of (seed, law, task), so tasks never share draws."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{law}:{task}".encode()).digest()[:4], "big")


def failure_signature(law: str, kind: str, message: str) -> tuple:
    """How failures are grouped: the law and the kind (``law``: the law's assertion; ``error``: the
    backend raised, with the exception's type). Coarse on purpose, as cases/running/shrink.py's: one bug, one
    signature, one captured case."""
    return (law, kind) if kind == "law" else (law, kind, message.split(":", 1)[0])


def open_database(spec: str | None):
    """The Hypothesis example database named by ``spec``: None, a directory, or ``redis://...``."""
    if not spec:
        return None
    if spec.startswith(("redis://", "rediss://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase  # noqa: PLC0415 - it imports redis
        except ImportError:
            raise UsageError(f"--database {spec!r}: the redis package is not installed (pip install redis)") from None
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec)


def _key(law: str, backend_name: str) -> str:
    return f"pfa-verify search {law} {backend_name}"


def _search_task(payload) -> TaskReport:
    """One task in a worker (cases/running/pool.py): the worker's backend, then the law's search."""
    law, task, seed, examples, backend_name, database, seconds = payload
    report = TaskReport(law, task, seed)
    backend = worker_backend(backend_name)

    def check(example):
        config = getattr(example[0], "config", None)   # a paged case (an AT-12 call has no coverage bins)
        for name in classify(config) if config is not None else ():    # what the search covered, failing example included
            report.hits[name] = report.hits.get(name, 0) + 1
        laws.run(law, backend, example[0], **example[1])
    found = hunt(law_examples.examples(law, backend), check, seed=seed, examples=examples,
                 database=open_database(database), key=_key(law, backend_name), seconds=seconds)
    report.examples, report.seconds, report.cut = found.examples, found.seconds, found.cut
    if isinstance(found.error, BackendUnavailable):    # e.g. AT-12 on a paged-attention-only kernel: not run
        report.skipped, report.examples = found.error.reason, 0
        return report
    if found.error is not None:
        assert found.example is not None        # hunt sets the failing example with its error
        case, params = found.example
        kind = "law" if isinstance(found.error, AssertionError) else "error"
        text = str(found.error).strip()
        message = f"{type(found.error).__name__}: {text}" if kind == "error" else text
        report.failure = {"case": case, "params": dict(params), "kind": kind, "message": message}
    return report


def _shrunk(law: str, backend, first: TaskReport, signature: tuple, *, examples: int, database, shrink_s: float):
    """``(case, params, message, how)`` of the group's first failure, shrunk by Hypothesis when it
    reproduces (the task's seed, or the database, replayed here on the driver); else as the task found it."""
    if shrink_s > 0:
        def check(example):
            try:
                laws.run(law, backend, example[0], **example[1])
            except Exception as exc:
                kind = "law" if isinstance(exc, AssertionError) else "error"
                if failure_signature(law, kind, f"{type(exc).__name__}: {exc}") == signature:
                    raise
        found = hunt(law_examples.examples(law, backend), check, seed=first.seed, examples=examples,
                     shrink_s=shrink_s, database=database, key=_key(law, backend.name),
                     shrink_calls=shrink_budget(backend))
        if found.error is not None:
            assert found.example is not None    # hunt sets the failing example with its error
            case, params = found.example
            return case, dict(params), str(found.error), "shrunk by Hypothesis on the driver"
    failure = first.failure
    assert failure is not None                  # a group's first member is a task that failed
    return failure["case"], failure["params"], failure["message"], "not shrunk"


def search(backend_name: str, laws: tuple, *, examples: int, tasks: int, seed: int = 0, database: str | None = None,
           workers: int = 1, cluster=None, shrink_s: float = 60.0, capture: bool = True, regressions_dir=None,
           progress=None, seconds: float | None = None) -> SearchRun:
    """Every law's search of ``examples`` examples in ``tasks`` tasks on the pool, each task within
    ``seconds`` (None: no limit); failures grouped, the first of each group shrunk and captured once, here."""
    if not laws:
        raise UsageError(f"--laws: none given; expected some of {', '.join(BACKEND_LAWS)}")
    check_known("--laws", "law", laws, BACKEND_LAWS)
    for option, value in (("--tasks", tasks), ("--examples", examples)):
        if value < 1:
            raise UsageError(f"{option} {value} must be at least 1")
    start = time.perf_counter()
    backend = worker_backend(backend_name)        # the driver shrinks: it needs the backend too (supervised)
    db = open_database(database)
    per_task = math.ceil(examples / tasks)
    payloads = [(law, k, task_seed(seed, law, k), per_task, backend_name, database, seconds)
                for law in laws for k in range(tasks)]
    with Pool(workers=workers, cluster=cluster, resources=task_resources(backend)) as pool:
        results = pool.map(_search_task, payloads, on_done=progress and (lambda n, r: progress(payloads[n], r)))
    reports = []
    for payload, r in zip(payloads, results, strict=True):
        rep = r.value if r.error is None else TaskReport(payload[0], payload[1], payload[2], error=r.error)
        rep.node = r.node
        reports.append(rep)
    groups: dict = {}
    for rep in reports:
        if rep.failure is not None:
            sig = failure_signature(rep.law, rep.failure["kind"], rep.failure["message"])
            groups.setdefault(sig, []).append(rep)
    captured = []
    for sig, members in groups.items():
        first = members[0]
        case, params, message, how = _shrunk(first.law, backend, first, sig, examples=per_task, database=db,
                                             shrink_s=shrink_s)
        names = [f"{m.law}#{m.task}" for m in members]
        note = f"{len(members)} search task(s) failed like this ({', '.join(names)}); {how}"
        kept = capture_case(first.law, backend_name, case, f"{message}\n{note}", params=params, enabled=capture,
                            directory=regressions_dir)
        for m in members:
            m.replay = kept.replay
        label = case.label() if hasattr(case, "label") else repr(case)
        captured.append({"signature": list(sig), "law": first.law, "tasks": names, "replay": kept.replay,
                         "line": kept.line, "how": how, "message": message, "case": label})
    return SearchRun(backend_name, tuple(laws), examples, tasks, seed, database, reports, captured,
                     time.perf_counter() - start, pool.describe())


def _law_totals(run: SearchRun) -> dict:
    out = {}
    for law in run.laws:
        mine = [t for t in run.tasks if t.law == law]
        n, s = sum(t.examples for t in mine), sum(t.seconds for t in mine)
        out[law] = {"examples": n, "task_seconds": round(s, 2), "examples_per_task_second": round(n / s, 3) if s else None,
                    "failures": sum(1 for t in mine if t.failure), "errors": sum(1 for t in mine if t.error),
                    "cut": sum(1 for t in mine if t.cut), "skipped": sum(1 for t in mine if t.skipped)}
    return out


def to_json(run: SearchRun) -> dict:
    """The search report (schema ``pfa-verify-search/1``): tasks, per-law totals, captured cases."""
    def task(t: TaskReport) -> dict:
        failure = None
        if t.failure is not None:
            case = t.failure["case"]
            failure = {"config": case.config.to_dict() if hasattr(case, "config") else dataclasses.asdict(case),
                       "seed": case.seed, "params": t.failure["params"], "kind": t.failure["kind"],
                       "message": t.failure["message"].split("\n")[0]}
        return {"law": t.law, "task": t.task, "seed": t.seed, "examples": t.examples, "seconds": round(t.seconds, 3),
                "node": t.node, "failure": failure, "error": t.error, "replay": t.replay, "cut": t.cut,
                "skipped": t.skipped}
    examples = sum(t.examples for t in run.tasks)
    return {"schema": "pfa-verify-search/1", "backend": run.backend, "laws": list(run.laws), "examples": run.examples,
            "tasks_per_law": run.tasks_per_law, "seed": run.seed, "database": run.database, "execution": run.execution,
            "tasks": [task(t) for t in run.tasks], "laws_summary": _law_totals(run),
            "captured": [{k: v for k, v in c.items() if k != "line"} for c in run.captured],
            "examples_run": examples, "seconds": round(run.seconds, 2),
            "examples_per_second": round(examples / run.seconds, 3) if run.seconds else None,
            "coverage": run.coverage().to_dict(), "exit_status": run.exit_status}


def summary_line(run: SearchRun) -> str:
    data = to_json(run)
    failed = sum(1 for t in run.tasks if t.failure)
    broke = sum(1 for t in run.tasks if t.error)
    skipped = sorted({t.law for t in run.tasks if t.skipped})
    cut = sum(1 for t in run.tasks if t.cut)
    return (f"search on {run.backend}: {len(run.laws)} law(s) x {run.tasks_per_law} task(s), {data['examples_run']} examples "
            f"in {run.seconds:.1f} s ({data['examples_per_second']} per second); {failed} task(s) found a failure, "
            f"{len(run.captured)} captured once per signature" + (f", {broke} task(s) broke" if broke else "")
            + (f", {cut} task(s) cut by the time budget" if cut else "")
            + (f"; not run (the backend cannot run them): {', '.join(skipped)}" if skipped else "")
            + " -> " + ("OK" if run.exit_status == 0 else "FAILED"))


def law_verdicts(run: SearchRun) -> list[dict]:
    """One verdict per law over its tasks: ``law``, ``examples``, ``seconds`` (the tasks' own), ``verdict``
    (``failed``, ``error``, ``not run``, ``held``) and ``detail`` (the first failure's first line, the
    error, why it was not run, or how a held law's search ended)."""
    rows = []
    for law in run.laws:
        mine = [t for t in run.tasks if t.law == law]
        examples, seconds = sum(t.examples for t in mine), sum(t.seconds for t in mine)
        failed = next((t for t in mine if t.failure), None)
        broke = next((t for t in mine if t.error), None)
        skipped = next((t for t in mine if t.skipped), None)
        group = next((c for c in run.captured if c["law"] == law), None)
        if failed is not None:
            assert failed.failure is not None
            # the kernel raised on an example: an error of the law's check, never a verdict of the law
            verdict = "failed" if failed.failure["kind"] == "law" else "error"
            detail = (_failure_detail(group, examples) if group is not None
                      else failed.failure["message"].strip().splitlines()[0])
        elif broke is not None:
            verdict, detail = "error", str(broke.error)
        elif skipped is not None:
            verdict, detail = "not run", f"the backend cannot run it: {skipped.skipped}"
        else:
            cut = sum(1 for t in mine if t.cut)
            verdict = "held"
            detail = (f"{examples} examples, then cut by the time budget" if cut else f"all {examples} examples")
        rows.append({"law": law, "examples": examples, "seconds": round(seconds, 2), "verdict": verdict,
                     "detail": detail, "replay": next((t.replay for t in mine if t.replay), None)})
    return rows


def _failure_detail(group: dict, examples: int) -> str:
    """A law's failure in one line: after how many examples, the shrunk case, the diagnosis' name (or that
    none was identified) and the capture."""
    said = f"at example {examples}; {'shrunk to' if group['how'].startswith('shrunk') else 'on'} {group['case']}"
    diagnosis = next((line for line in group["message"].splitlines() if line.startswith("Diagnosis: ")), None)
    if diagnosis is not None:
        said += "; " + (diagnosis.split(" explains ", 1)[0] if " explains " in diagnosis else diagnosis.split(":")[0]
                        + ": " + diagnosis.split(": ", 2)[1])
    return said + (f"; replay {group['replay'].rsplit(' ', 1)[-1]}" if group["replay"] else "; not captured")


def render_law_table(run: SearchRun, width: int = 100):
    """A rich Table of :func:`law_verdicts`, one row per law, ``width`` columns at most."""
    table = Table(title=f"laws on {run.backend}", title_justify="left", width=width)
    table.add_column("law", no_wrap=True)
    table.add_column("examples", justify="right")
    table.add_column("s", justify="right")
    table.add_column("verdict", ratio=1)
    style = {"failed": "bold red", "error": "bold magenta", "not run": "yellow", "held": "green"}
    for row in law_verdicts(run):
        text = f"[{style[row['verdict']]}]{row['verdict']}[/]: " + escape(row["detail"][:240])
        table.add_row(row["law"], str(row["examples"]), f"{row['seconds']:.1f}", text)
    return table


def render_table(run: SearchRun):
    """A rich Table: one row per task."""
    table = Table(title=f"pfa-verify search: backend {run.backend}", title_justify="left")
    for col in ("law", "task", "seed", "examples", "s", "node", "result"):
        table.add_column(col)
    for t in run.tasks:
        result = ("[bold magenta]error: " + t.error + "[/]") if t.error else (
            f"[bold red]{t.failure['kind']}: {t.failure['message'].splitlines()[0][:80]}[/]" if t.failure else
            f"[yellow]not run: {t.skipped}[/]" if t.skipped else
            "[green]held[/]" + (" (cut by the time budget)" if t.cut else ""))
        table.add_row(t.law, str(t.task), str(t.seed), str(t.examples), f"{t.seconds:.1f}", t.node or "-", result)
    return table
