"""``pfa-verify run``, ``compare``, ``laws`` and ``search``: their options, and the typed options each hands its room."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cases.cli import preflight
from cases.cli.arguments import (
    RUN_EXAMPLES,
    RUN_SECONDS,
    SEARCH_EXAMPLES,
    SEARCH_TASKS,
    SHRINK_SECONDS,
    add_cluster_argument,
    byte_count,
    cluster_refused,
    count,
    coverage_bins,
    distributions,
    skip_kinds,
    worker_bound,
)
from cases.data.collect import SOURCES, aimed, shipped_left_out
from cases.reporting import html_report, report, terminal
from cases.reporting.report import result_rows
from cases.reporting.report_compare import compare, load_report, print_comparison, write_html
from cases.reporting.terminal import shown
from cases.running import run as runner
from cases.running.pool import ClusterError
from cases.running.run import CASE_LIMIT_BASE_S, CASE_LIMIT_FACTOR, RunOptions
from cases.running.search import law_verdicts, render_law_table, render_table, search, summary_line, to_json
from kernels import SKIP_KINDS
from kernels.backends.text import printable
from properties.law_examples import AT12_LAWS, BACKEND_LAWS, PAGED_LAWS

__all__ = ["run_options", "add_run", "add_compare", "add_search", "add_laws"]


class _Progress:
    """A rich progress bar on a terminal, plain lines otherwise (a case's name is text: printable)."""

    def __init__(self, console):
        self.console, self.done, self.total, self.bar, self.task = console, 0, None, None, None

    def __call__(self, event, item, result) -> None:
        if self.total is None:
            return
        if event == "start":
            if self.bar is not None:
                self.bar.update(self.task, description=printable(item.name, one_line=True))
            return
        self.done += 1
        verdicts = ",".join(sorted({row.verdict for row in result_rows(result)}))
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=printable(item.name, one_line=True))
        else:
            self.console.print(shown(f"[{self.done:>{len(str(self.total))}}/{self.total}] {item.name} ({item.source}): "
                                     f"{verdicts} {result.seconds:.1f} s"))


def run_options(args: argparse.Namespace, command: str | None = None):
    """The typed :class:`cases.running.run.RunOptions` of parsed ``pfa-verify run`` arguments; ``command``
    (default: this process's own command line) is how the report quotes the run."""

    fields = {f.name for f in dataclasses.fields(RunOptions)} - {"command"}
    given = {k: v for k, v in vars(args).items() if k in fields}
    given["allow_skips"] = tuple(given.get("allow_skips") or ())
    given["coverage"] = tuple(given.get("coverage") or ())
    if given.get("distribution") is not None:
        given["distribution"] = tuple(given["distribution"])
    return RunOptions(**given, command=command or "pfa-verify run " + " ".join(sys.argv[2:]))


def _aimed(items) -> str:
    """What directed generation aimed at (properties/directed.py), for the line that announces the cases."""
    holes = list(aimed(items).values())
    if not holes:
        return ""
    return f" ({len(holes)} aimed at coverage holes: {', '.join(holes)}; the rest drawn as usual)"


def _cmd_run(args) -> int:
    preflight.check_command(args)

    console = terminal.console()
    progress = _Progress(console)

    def announce(items, note):
        progress.total = len(items)
        console.print(shown(note))
        left_out = shipped_left_out(args.cases, args.regressions)
        console.print(shown(f"{len(items)} cases: " + ", ".join(
            f"{sum(i.source == s for i in items)} {s}" for s in SOURCES) + _aimed(items)))
        if left_out:
            console.print(shown(f"--regressions {args.regressions}: the {len(left_out)} regressions shipped in "
                                f"cases/regressions are left out ({', '.join(left_out)}); --cases all without "
                                "--regressions runs them"))

    stop = args.interruption.stop
    try:
        if console.is_terminal:
            with Progress(TextColumn("{task.description:<34}", markup=False), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                          transient=True, redirect_stdout=False, redirect_stderr=False) as bar, \
                    terminal.lines_to(console):
                task = bar.add_task("choosing backend", total=None)
                progress.bar, progress.task = bar, task

                def hook(event, item, result):
                    if progress.total is not None and bar.tasks[0].total is None:
                        bar.update(task, total=progress.total)
                    progress(event, item, result)
                run = runner.execute(run_options(args), progress=hook, on_items=announce, stop=stop)
        else:
            run = runner.execute(run_options(args), progress=progress, on_items=announce, stop=stop)
    except ClusterError as exc:
        return cluster_refused(exc)
    run, summary, written = _write_reports(run, args)
    report.print_report(run, console, summary, verbose=args.verbose)
    for line in written:
        console.print(shown(line))
    return summary.exit_status


def _write_reports(run, args):
    """``(run, its summary, lines to print)`` after writing ``--json`` and ``--html``: a report that cannot be
    written is one line naming the path and fails the run (its summary says so, and the report that could
    be written is written again with that summary)."""

    writers = [(label, path, write) for label, path, write in
               (("JSON report", args.json, report.write_json), ("HTML report", args.html, html_report.write_html)) if path]
    failed: list[str] = []
    while True:
        summary = report.summarize(run)
        lines, new = [], []
        for label, path, write in writers:
            if any(f.startswith(f"{label} {path}:") for f in failed):
                continue
            try:
                lines.append(f"{label}: {write(run, path, summary)}")
            except OSError as exc:
                new.append(f"{label} {path}: {exc.strerror or exc}")
        if not new:
            return run, summary, lines + [f"pfa-verify: error: could not write the {f}" for f in failed]
        failed += new
        run = dataclasses.replace(run, write_failures=run.write_failures + tuple(new))


def runner_limit_text() -> str:
    return f"{CASE_LIMIT_BASE_S:g} s plus {CASE_LIMIT_FACTOR:g} times the case's estimate"


def add_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", help="auto | golden | sim | npu | pypto-gym:FILE.py[:FUNCTION] "
                        "(PyPTO-Gym's kernel file or module, unchanged, on the sim; pypto-gym-npu:... on a 950) | "
                        "mutant:NAME | package.module:factory | path/file.py:factory (default: auto = npu, else sim; "
                        "falling back to the golden fails the run unless --allow-fallback)")
    parser.add_argument("--cases", default="all",
                        help="all | catalog | regressions | generated | NAME,... (default all: the regressions and "
                             "the catalog; every choice adds the --examples generated cases)")
    parser.add_argument("--examples", type=count(at_most=RUN_EXAMPLES), default=20,
                        help=f"generated cases (default 20, at most {RUN_EXAMPLES:,})")
    parser.add_argument("--seed", type=count, default=0, help="seed of the generated cases (default 0)")
    parser.add_argument("--distribution", type=distributions, default=None, metavar="NAME,...",
                        help="value distributions of the generated cases (default: all of golden.DISTRIBUTIONS)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="the table lists every case and comparison, with every column (default: the cases that "
                             "did not pass, and one line per group of passing ones, within 100 columns)")
    parser.add_argument("--json", metavar="PATH", help="write the JSON report (cases/report.schema.json)")
    parser.add_argument("--html", metavar="PATH", help="write the self-contained HTML report")
    parser.add_argument("--device", type=count, default=None, help="NPU index (npu: the first of the workers')")
    parser.add_argument("--workers", type=count(at_most=worker_bound()), default=1,
                        help=f"kernel worker processes; this process judges what they return (npu: one device each; "
                             f"at most 4 per CPU and 256: {worker_bound()} here)")
    add_cluster_argument(parser, "the cases")
    parser.add_argument("--budget", type=count(at_most=RUN_SECONDS), default=None, metavar="SECONDS",
                        help="do not start a case that the backend estimates would end after this many seconds "
                             "of the run (0: no limit; default: the backend's, 600 on sim, else no limit; at most "
                             f"{RUN_SECONDS:,}, a day)")
    parser.add_argument("--max-seconds", type=count(at_most=RUN_SECONDS), default=None, metavar="S",
                        help="sim: skip cases the backend's cost model estimates over S seconds (0: no limit; "
                             f"default: no limit; at most {RUN_SECONDS:,}, a day)")
    parser.add_argument("--allow-skips", type=skip_kinds, default=(), metavar="KIND,...",
                        help=f"skips of these kinds do not fail the run: {', '.join(SKIP_KINDS)}, or all "
                             "(default: none; every case asked for must be checked)")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="with --backend auto, a fall back to the golden (no kernel here) does not fail the run")
    parser.add_argument("--max-bytes", type=byte_count, default=None, metavar="BYTES",
                        help="largest case to build (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    parser.add_argument("--regressions", metavar="DIR", default=None,
                        help="regressions folder (default cases/regressions or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--coverage", type=coverage_bins, default=(), metavar="all|BIN,...",
                        help="fail the run when one of these coverage bins (properties/coverage.py; 'all': every "
                             "single bin) is hit by no checked case, naming the holes in one line")
    parser.add_argument("--case-timeout", type=count(at_most=RUN_SECONDS), default=None, metavar="SECONDS",
                        help="end a case whose kernel call has not returned after SECONDS (its worker process is killed; "
                             "the case is an error; 0: no limit; default: none, except where the backend has a cost "
                             f"model: {runner_limit_text()})")
    parser.add_argument("--in-process", action="store_true",
                        help="run the kernel in the command's process, not in supervised worker processes (for a "
                             "debugger). Its exceptions, sys.exit, os._exit and posix._exit are still errors; what it "
                             "cannot guard against is a kernel that ends the process another way (a signal, a crash, an "
                             "_exit saved before the call) or corrupts it: such an end is never exit 0 (the command "
                             "runs as a child of a process that watches it and says \"the run ended before its "
                             "summary\", exit 1)")
    parser.add_argument("--shrink-seconds", type=count(at_most=SHRINK_SECONDS), default=60, metavar="S",
                        help="time for Hypothesis to shrink each kind of generated failure before it is captured "
                             f"(0: capture the first failing case as it is; default 60, at most {SHRINK_SECONDS:,})")
    parser.set_defaults(func=_cmd_run)


def _cmd_compare(args) -> int:
    """``pfa-verify compare``: print the comparison (and write its HTML); the exit status of
    :attr:`ReportDiff.exit_status`. A report that cannot be read, or a selection mismatch, is a
    UsageError, which the command line prints as one line with exit 2."""
    preflight.check_command(args)


    console = terminal.console()
    comparison = compare(load_report(args.a), load_report(args.b), paths=(args.a, args.b))
    print_comparison(comparison, console)
    if args.html:
        console.print(shown(f"HTML comparison: {write_html(comparison, args.html)}"))
    return comparison.exit_status


def add_compare(parser) -> None:
    """``pfa-verify compare``'s arguments (cases/cli/)."""
    parser.add_argument("a", metavar="A.json", help="a report of `pfa-verify run --json`")
    parser.add_argument("b", metavar="B.json", help="a report of the same selection (the same selection fingerprint)")
    parser.add_argument("--html", metavar="PATH", help="write the comparison as one self-contained HTML file")
    parser.set_defaults(func=_cmd_compare)


def _cmd_search(args) -> int:
    """``pfa-verify search`` (cases/cli/): run, print, write the JSON report; exit 0, 1, or 2 in one line
    (a usage error: an unknown or empty --laws, a Redis database without redis installed; or a cluster
    that cannot take the tasks)."""
    preflight.check_command(args)


    console = Console() if sys.stdout.isatty() else Console(width=200, force_terminal=False)
    laws = tuple(n.strip() for n in args.laws.split(",") if n.strip()) if args.laws is not None else PAGED_LAWS

    def progress(payload, result):
        law, task = payload[0], payload[1]
        found = result.error or (result.value.failure and result.value.failure["kind"]) or "held"
        print(f"  {law} task {task}: {found} ({result.node or '-'})", flush=True)
    try:
        run = search(args.backend, laws, examples=args.examples, tasks=args.tasks, seed=args.seed,
                            database=args.database, workers=args.workers, cluster=args.cluster,
                            shrink_s=args.shrink_seconds, capture=not args.no_capture, regressions_dir=args.regressions,
                            progress=progress if args.verbose else None)
    except ClusterError as exc:
        print(f"pfa-verify: error: {exc}", file=sys.stderr)
        return 2
    console.print(render_table(run))
    for c in run.captured:
        console.print(f"{c['law']}: {len(c['tasks'])} task(s) failed alike, captured once ({c['how']}): {c['line']}",
                      highlight=False, markup=False)
    console.print(run.coverage().line("law examples"), highlight=False, markup=False)
    console.print(summary_line(run), highlight=False, markup=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(run), indent=2) + "\n")
        console.print(f"JSON report: {args.json}", highlight=False)
    return run.exit_status


def add_search(parser) -> None:
    """The options of ``pfa-verify search``."""
    parser.add_argument("--backend", default="golden", help="the backend whose laws are searched (default golden); "
                        "any name --backend of pfa-verify run takes")
    parser.add_argument("--laws", default=None, metavar="LAW,...", help="the laws (default: every paged law)")
    parser.add_argument("--examples", type=count(at_most=SEARCH_EXAMPLES), default=100,
                        help="examples per law, split over its tasks (default 100; the nightly profile's 2000 is a "
                             f"night's search; at most {SEARCH_EXAMPLES:,})")
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
    parser.add_argument("--regressions", metavar="DIR", default=None,
                        help="regressions folder (default cases/regressions or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--json", metavar="PATH", help="write the search report as JSON")
    parser.add_argument("--verbose", action="store_true", help="one line per task as it finishes")
    parser.set_defaults(func=_cmd_search)


#: ``--laws`` of ``pfa-verify laws``: a group's name, or laws by name.
_LAW_GROUPS = {"all": BACKEND_LAWS, "paged": PAGED_LAWS, "at12": AT12_LAWS}


def _cmd_laws(args) -> int:
    """``pfa-verify laws``: every law of the backend, one search each within its budget; the table, each
    failure in full (shrunk, diagnosed, captured), the coverage, one verdict line; exit 0 only when every
    law held."""
    preflight.check_command(args)
    console = Console(width=100, highlight=False)
    names = _LAW_GROUPS.get(args.laws) or tuple(n.strip() for n in args.laws.split(",") if n.strip())
    try:
        run = search(args.backend, names, examples=args.examples, tasks=1, seed=args.seed, workers=args.workers,
                     shrink_s=args.shrink_seconds, capture=not args.no_capture, regressions_dir=args.regressions,
                     seconds=args.seconds)
    except ClusterError as exc:
        print(f"pfa-verify: error: {exc}", file=sys.stderr)
        return 2
    console.print(render_law_table(run))
    for c in run.captured:
        ended = "ended in an error (the kernel raised)" if c["signature"][1] == "error" else "failed"
        console.print(f"\n{c['law']} {ended} ({c['how']}):", markup=False)
        console.print(c["message"].strip(), markup=False)
        console.print(c["line"], markup=False)
    console.print(run.coverage().line("law examples"), markup=False)
    rows = law_verdicts(run)
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("held", "failed", "error", "not run")}
    said = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    hint = "; --laws paged checks the paged-attention laws alone" if counts["not run"] else ""
    console.print(f"laws on {run.backend}: {len(rows)} laws, {said}; {sum(r['examples'] for r in rows)} examples in "
                  f"{run.seconds:.1f} s{hint} -> {'OK' if run.exit_status == 0 else 'FAILED'}", markup=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(to_json(run) | {"law_verdicts": rows}, indent=2) + "\n")
        console.print(f"JSON report: {args.json}", markup=False)
    return run.exit_status


def add_laws(parser) -> None:
    """The options of ``pfa-verify laws``."""
    parser.add_argument("--backend", default="golden", help="the backend whose laws are checked (default golden); "
                        "any name --backend of pfa-verify run takes")
    parser.add_argument("--laws", default="all", metavar="all|paged|at12|LAW,...",
                        help=f"the laws: all (default), paged, at12, or names among {', '.join(BACKEND_LAWS)}")
    parser.add_argument("--examples", type=count(at_most=SEARCH_EXAMPLES), default=200,
                        help=f"examples per law (default 200, at most {SEARCH_EXAMPLES:,})")
    parser.add_argument("--seconds", type=count(at_most=SHRINK_SECONDS), default=60, metavar="S",
                        help="time per law for its examples: the search stops there and says it was cut (default 60)")
    parser.add_argument("--shrink-seconds", type=count(at_most=SHRINK_SECONDS), default=20, metavar="S",
                        help="time to shrink a law's failure before it is diagnosed and captured (default 20)")
    parser.add_argument("--workers", type=count(at_most=worker_bound()), default=1,
                        help=f"laws searched at once, each in a process (default 1, at most {worker_bound()} here)")
    parser.add_argument("--seed", type=count, default=0, help="seed of the searches (default 0: reproducible)")
    parser.add_argument("--regressions", metavar="DIR", default=None,
                        help="regressions folder (default cases/regressions or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.set_defaults(func=_cmd_laws)
