"""``pfa-verify laws`` and ``search``: their options, the progress of ``laws`` while it searches, and what each
prints (cases/running/search.py searches, cases/reporting/search_report.py reports)."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pfa_verify.cases.cli import preflight
from pfa_verify.cases.cli.arguments import (
    REGRESSIONS_HELP,
    SEARCH_EXAMPLES,
    SEARCH_TASKS,
    SHRINK_SECONDS,
    add_cluster_argument,
    count,
    worker_bound,
)
from pfa_verify.cases.reporting.search_report import (
    render_law_table,
    render_table,
    summary_line,
    to_json,
    verdict_counts,
)
from pfa_verify.cases.running.pool import ClusterError
from pfa_verify.cases.running.search import LAW_GROUPS, MIN_EXAMPLES, law_names, law_verdicts, search, verdict_of
from pfa_verify.kernels.backends.text import printable
from pfa_verify.properties.search.law_examples import BACKEND_LAWS

__all__ = ["add_laws", "add_search", "add_min_examples"]


def _cmd_search(args) -> int:
    """``pfa-verify search`` (cases/cli/): run, print, write the JSON report; exit 0, 1, or 2 in one line
    (a usage error: an unknown or empty --laws, a --min-examples outside 1..--examples, a Redis database
    without redis installed; or a cluster that cannot take the tasks)."""
    preflight.check_command(args)
    console = Console() if sys.stdout.isatty() else Console(width=200, force_terminal=False)
    names = law_names(args.laws)

    def progress(event, task, report):
        if event == "done":
            found = report.error or (report.failure and report.failure["kind"]) or (
                "stopped" if report.stopped else "not run" if report.skipped else "held")
            console.print(f"  {task.law} task {task.task}: {printable(found, one_line=True)[:200]} "
                          f"({printable(report.node or '-', one_line=True)})", markup=False, highlight=False)
    try:
        run = search(args.backend, names, examples=args.examples, tasks=args.tasks, seed=args.seed,
                     database=args.database, workers=args.workers, cluster=args.cluster,
                     shrink_s=args.shrink_seconds, capture=not args.no_capture, regressions_dir=args.regressions,
                     progress=progress if args.verbose else None, min_examples=args.min_examples)
    except ClusterError as exc:
        print(f"pfa-verify: error: {printable(exc, one_line=True)}", file=sys.stderr)
        return 2
    console.print(render_table(run))
    for c in run.captured:
        console.print(printable(f"{c['law']}: {len(c['tasks'])} task(s) failed alike, captured once ({c['how']}): "
                                f"{c['line']}"), highlight=False, markup=False)
    console.print(run.coverage().line("law examples"), highlight=False, markup=False)
    console.print(summary_line(run), highlight=False, markup=False, soft_wrap=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(run), indent=2) + "\n")
        console.print(f"JSON report: {printable(args.json, one_line=True)}", highlight=False, markup=False)
    return run.exit_status


def add_search(parser) -> None:
    """The options of ``pfa-verify search``."""
    parser.add_argument("--backend", default="golden", help="the backend whose laws are searched (default golden); "
                        "any name --backend of pfa-verify run takes")
    parser.add_argument("--laws", default=None, metavar="all|paged|at12|LAW,...",
                        help=f"the laws: groups ({', '.join(LAW_GROUPS)}) or names among {', '.join(BACKEND_LAWS)}, "
                             "comma-separated (default: paged)")
    parser.add_argument("--examples", type=count(at_most=SEARCH_EXAMPLES), default=100,
                        help="examples per law, split over its tasks (default 100; the nightly profile's 2000 is a "
                             f"night's search; at most {SEARCH_EXAMPLES:,})")
    add_min_examples(parser, "its tasks together")
    parser.add_argument("--tasks", type=count(at_most=SEARCH_TASKS), default=4,
                        help=f"tasks per law, each with its own seed (default 4, at most {SEARCH_TASKS:,})")
    parser.add_argument("--seed", type=count, default=0, help="seed the tasks' seeds derive from (default 0)")
    parser.add_argument("--database", default=None, metavar="DIR|redis://HOST:PORT[/DB]",
                        help="Hypothesis's example database shared by every task (a directory all nodes reach, or "
                             "Redis): a failure found by one task is replayed first by the others and the next search")
    parser.add_argument("--workers", type=count(at_most=worker_bound()), default=1,
                        help=f"local processes (default 1: here; at most 4 per CPU and 256: {worker_bound()} here)")
    add_cluster_argument(parser, "the tasks")
    parser.add_argument("--shrink-seconds", type=count(at_most=SHRINK_SECONDS), default=60, metavar="S",
                        help="time to shrink the first failure of each signature, on the driver (default 60, at "
                             f"most {SHRINK_SECONDS:,})")
    parser.add_argument("--regressions", metavar="DIR", default=None, help=REGRESSIONS_HELP)
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--json", metavar="PATH", help="write the search report as JSON")
    parser.add_argument("--verbose", action="store_true", help="one line per task as it finishes")
    parser.set_defaults(func=_cmd_search)


def add_min_examples(parser, whose: str) -> None:
    """``--min-examples``: the fewest examples a law must have checked (``whose``: by whom) to hold."""
    parser.add_argument("--min-examples", type=count(at_most=SEARCH_EXAMPLES), default=None, metavar="N",
                        help=f"a law holds only when {whose} checked at least N examples; fewer (the time budget "
                             "cut the search, or Hypothesis drew no more) is 'too few examples' and fails the "
                             f"command (default: --examples or {MIN_EXAMPLES}, the fewer: the examples per law of "
                             "the pytest laws' ci and dev profiles; at most --examples)")


class _LawProgress:
    """``pfa-verify laws`` while it searches: per law, when it started, the examples checked so far, its
    seconds and its verdict when done. On a terminal a rich display, a row per law (gone when the table is
    printed); otherwise a line as each law starts and one as it ends."""

    def __init__(self, console: Console, names: tuple, *, examples: int, min_examples: int) -> None:
        self.console, self.examples, self.min_examples = console, examples, min_examples
        self.bar: Progress | None = None
        self.rows: dict = {}
        if console.is_terminal:
            self.bar = Progress(TextColumn("{task.description:<20}", markup=False), BarColumn(), MofNCompleteColumn(),
                                TextColumn("examples"), TimeElapsedColumn(),
                                TextColumn("{task.fields[verdict]}", markup=False), console=console, transient=True)
            self.rows = {law: self.bar.add_task(law, total=examples, start=False, verdict="waiting") for law in names}

    def __call__(self, event: str, task, data) -> None:
        row = self.rows.get(task.law)
        if event == "checked" and self.bar is not None and row is not None:
            self.bar.update(row, completed=data[0])
        elif event == "start":
            if self.bar is not None and row is not None:
                self.bar.start_task(row)
                self.bar.update(row, verdict="searching")
            else:
                self.console.print(f"{task.law}: started", markup=False, soft_wrap=True)
        elif event == "done":
            verdict, detail = verdict_of([data], min_examples=self.min_examples, asked=task.examples)
            if self.bar is not None and row is not None:
                self.bar.update(row, completed=data.examples, verdict=verdict)
                self.bar.stop_task(row)
            else:
                self.console.print(f"{task.law}: {verdict} after {data.seconds:.1f} s: "
                                   f"{printable(detail, one_line=True)[:200]}", markup=False, soft_wrap=True)


def _cmd_laws(args) -> int:
    """``pfa-verify laws``: every law of the backend, one search each within its budget, its progress as it
    goes; the table, each failure in full (shrunk, diagnosed, captured), the coverage, one verdict line;
    exit 0 only when every law held on at least --min-examples examples."""
    preflight.check_command(args)
    console = Console(width=100, highlight=False)
    names = law_names(args.laws)
    least = min(args.examples, MIN_EXAMPLES) if args.min_examples is None else args.min_examples
    shown = _LawProgress(console, names, examples=args.examples, min_examples=least)
    try:
        with shown.bar or contextlib.nullcontext():
            run = search(args.backend, names, examples=args.examples, tasks=1, seed=args.seed, workers=args.workers,
                         shrink_s=args.shrink_seconds, capture=not args.no_capture, regressions_dir=args.regressions,
                         seconds=args.seconds, min_examples=args.min_examples, fail_fast=args.fail_fast,
                         progress=shown)
    except ClusterError as exc:
        print(f"pfa-verify: error: {printable(exc, one_line=True)}", file=sys.stderr)
        return 2
    console.print(render_law_table(run))
    for c in run.captured:
        ended = "ended in an error (the kernel raised)" if c["signature"][1] == "error" else "failed"
        console.print(f"\n{c['law']} {ended} ({c['how']}):", markup=False)
        console.print(printable(c["message"].strip()), markup=False)
        console.print(printable(c["line"]), markup=False)
    console.print(run.coverage().line("law examples"), markup=False)
    rows = law_verdicts(run)
    hint = "; --laws paged checks the paged-attention laws alone" if any(t.skipped for t in run.tasks) else ""
    if any(r["verdict"] == "too few examples" for r in rows):
        hint += (f"; a law holds on at least {run.min_examples} examples: more --seconds, or a lower --min-examples "
                 "by name")
    if any(r["verdict"] in ("stopped", "not run") for r in rows) and run.fail_fast:
        hint += "; --fail-fast stopped the search at the first law that failed"
    console.print(f"laws on {printable(run.backend, one_line=True)}: {len(rows)} laws, {verdict_counts(run)}; "
                  f"{sum(r['examples'] for r in rows)} examples in {run.seconds:.1f} s{hint} -> "
                  f"{'OK' if run.exit_status == 0 else 'FAILED'}", markup=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(run), indent=2) + "\n")
        console.print(f"JSON report: {printable(args.json, one_line=True)}", markup=False)
    return run.exit_status


def add_laws(parser) -> None:
    """The options of ``pfa-verify laws``."""
    parser.add_argument("--backend", default="golden", help="the backend whose laws are checked (default golden); "
                        "any name --backend of pfa-verify run takes")
    parser.add_argument("--laws", default="all", metavar="all|paged|at12|LAW,...",
                        help=f"the laws: groups ({', '.join(LAW_GROUPS)}) or names among {', '.join(BACKEND_LAWS)}, "
                             "comma-separated (default: all)")
    parser.add_argument("--examples", type=count(at_most=SEARCH_EXAMPLES), default=200,
                        help=f"examples per law (default 200, at most {SEARCH_EXAMPLES:,})")
    add_min_examples(parser, "its search")
    parser.add_argument("--seconds", type=count(at_most=SHRINK_SECONDS), default=60, metavar="S",
                        help="each law's search time (a law, not the command: the laws are searched one after "
                             "another, --workers at a time): the search stops there and says it was cut; a law cut "
                             "before --min-examples has too few examples (default 60)")
    parser.add_argument("-x", "--fail-fast", action="store_true",
                        help="stop after the first law that fails or ends in an error: no other law starts, those "
                             "running stop after their current example ('not run' or 'stopped'); the command fails")
    parser.add_argument("--shrink-seconds", type=count(at_most=SHRINK_SECONDS), default=20, metavar="S",
                        help="time to shrink a law's failure before it is diagnosed and captured (default 20)")
    parser.add_argument("--workers", type=count(at_most=worker_bound()), default=1,
                        help=f"laws searched at once, each in a process (default 1, at most {worker_bound()} here)")
    parser.add_argument("--seed", type=count, default=0, help="seed of the searches (default 0: reproducible)")
    parser.add_argument("--regressions", metavar="DIR", default=None, help=REGRESSIONS_HELP)
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.set_defaults(func=_cmd_laws)
