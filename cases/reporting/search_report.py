"""The reports of ``pfa-verify search`` and ``laws`` (cases/running/search.py): the JSON report, the summary
line, the task table and the law table. Every string that came from outside the suite (a kernel's message,
a backend's name, a node) is made printable (kernels.backends.text.printable) and handed to rich as Text,
never as markup."""
from __future__ import annotations

import dataclasses

from rich.table import Table
from rich.text import Text

from pfa_verify.cases.running.search import VERDICT_STYLES, SearchRun, TaskReport, law_verdicts
from pfa_verify.kernels.backends.text import printable

__all__ = ["to_json", "verdict_counts", "summary_line", "render_law_table", "render_table"]


def _law_totals(run: SearchRun) -> dict:
    out = {}
    for law in run.laws:
        mine = [t for t in run.tasks if t.law == law]
        n, s = sum(t.examples for t in mine), sum(t.seconds for t in mine)
        out[law] = {"examples": n, "task_seconds": round(s, 2), "examples_per_task_second": round(n / s, 3) if s else None,
                    "failures": sum(1 for t in mine if t.failure), "errors": sum(1 for t in mine if t.error),
                    "cut": sum(1 for t in mine if t.cut), "skipped": sum(1 for t in mine if t.skipped),
                    "stopped": sum(1 for t in mine if t.stopped)}
    return out


def to_json(run: SearchRun) -> dict:
    """The search report (schema ``pfa-verify-search/1``): tasks, per-law totals and verdicts, captured cases."""
    def task(t: TaskReport) -> dict:
        failure = None
        if t.failure is not None:
            case = t.failure["case"]
            failure = {"config": case.config.to_dict() if hasattr(case, "config") else dataclasses.asdict(case),
                       "seed": case.seed, "params": t.failure["params"], "kind": t.failure["kind"],
                       "message": t.failure["message"].split("\n")[0]}
        return {"law": t.law, "task": t.task, "seed": t.seed, "examples": t.examples, "seconds": round(t.seconds, 3),
                "node": t.node, "failure": failure, "error": t.error, "replay": t.replay, "cut": t.cut,
                "skipped": t.skipped, "stopped": t.stopped}
    examples = sum(t.examples for t in run.tasks)
    return {"schema": "pfa-verify-search/1", "backend": run.backend, "laws": list(run.laws), "examples": run.examples,
            "tasks_per_law": run.tasks_per_law, "seed": run.seed, "database": run.database, "execution": run.execution,
            "min_examples": run.min_examples, "fail_fast": run.fail_fast,
            "tasks": [task(t) for t in run.tasks], "laws_summary": _law_totals(run), "law_verdicts": law_verdicts(run),
            "captured": [{k: v for k, v in c.items() if k != "line"} for c in run.captured],
            "examples_run": examples, "seconds": round(run.seconds, 2),
            "examples_per_second": round(examples / run.seconds, 3) if run.seconds else None,
            "coverage": run.coverage().to_dict(), "exit_status": run.exit_status}


def verdict_counts(run: SearchRun) -> str:
    """``"3 held, 1 too few examples"``: how many laws got each verdict, in :data:`VERDICT_STYLES`' order."""
    rows = law_verdicts(run)
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in VERDICT_STYLES}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def summary_line(run: SearchRun) -> str:
    data = to_json(run)
    failed = sum(1 for t in run.tasks if t.failure)
    broke = sum(1 for t in run.tasks if t.error)
    skipped = sorted({t.law for t in run.tasks if t.skipped})
    cut = sum(1 for t in run.tasks if t.cut)
    return (f"search on {printable(run.backend, one_line=True)}: {len(run.laws)} law(s) x {run.tasks_per_law} task(s), "
            f"{data['examples_run']} examples in {run.seconds:.1f} s ({data['examples_per_second']} per second); "
            f"{failed} task(s) found a failure, {len(run.captured)} captured once per signature"
            + (f", {broke} task(s) broke" if broke else "")
            + (f", {cut} task(s) cut by the time budget" if cut else "")
            + (f"; not run (the backend cannot run them): {', '.join(skipped)}" if skipped else "")
            + f"; laws: {verdict_counts(run)} (at least {run.min_examples} examples each)"
            + " -> " + ("OK" if run.exit_status == 0 else "FAILED"))


def _said(style: str, verdict: str, detail: str, limit: int) -> Text:
    """``verdict: detail`` as rich Text (never parsed as markup), the detail made printable and cut to ``limit``."""
    return Text.assemble((verdict, style), ": " + printable(detail, one_line=True)[:limit])


def render_law_table(run: SearchRun, width: int = 100):
    """A rich Table of :func:`law_verdicts`, one row per law, ``width`` columns at most."""
    table = Table(title=Text(f"laws on {printable(run.backend, one_line=True)}"), title_justify="left", width=width)
    table.add_column("law", no_wrap=True)
    table.add_column("examples", justify="right")
    table.add_column("s", justify="right")
    table.add_column("verdict", ratio=1)
    for row in law_verdicts(run):
        table.add_row(Text(row["law"]), str(row["examples"]), f"{row['seconds']:.1f}",
                      _said(VERDICT_STYLES[row["verdict"]], row["verdict"], row["detail"], 240))
    return table


def render_table(run: SearchRun):
    """A rich Table: one row per task."""
    table = Table(title=Text(f"pfa-verify search: backend {printable(run.backend, one_line=True)}"),
                  title_justify="left")
    for col in ("law", "task", "seed", "examples", "s", "node", "result"):
        table.add_column(col)
    for t in run.tasks:
        if t.error:
            result = _said("bold magenta", "error", t.error, 240)
        elif t.failure:
            result = _said("bold red", t.failure["kind"], (t.failure["message"].splitlines() or [""])[0], 80)
        elif t.skipped:
            result = _said("yellow", "not run", t.skipped, 240)
        elif t.stopped:
            result = _said("yellow", "stopped", "by --fail-fast", 80)
        else:
            result = Text.assemble(("held", "green"), " (cut by the time budget)" if t.cut else "")
        table.add_row(Text(t.law), str(t.task), str(t.seed), str(t.examples), f"{t.seconds:.1f}",
                      Text(printable(t.node or "-", one_line=True)), result)
    return table
