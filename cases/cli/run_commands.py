"""``pfa-verify run`` and ``compare``: their options, and the typed options each hands its room (``laws`` and
``search``: cases/cli/law_commands.py)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pfa_verify.cases.cli import preflight
from pfa_verify.cases.cli.arguments import (
    REGRESSIONS_HELP,
    RUN_EXAMPLES,
    RUN_SECONDS,
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
from pfa_verify.cases.data.collect import SOURCES, aimed
from pfa_verify.cases.reporting import html_report, report, terminal
from pfa_verify.cases.reporting.report import result_rows
from pfa_verify.cases.reporting.report_compare import compare, load_report, print_comparison, write_html
from pfa_verify.cases.reporting.terminal import shown
from pfa_verify.cases.running import run as runner
from pfa_verify.cases.running.pool import ClusterError
from pfa_verify.cases.running.run import CASE_LIMIT_BASE_S, CASE_LIMIT_FACTOR, RunOptions
from pfa_verify.kernels import SKIP_KINDS
from pfa_verify.kernels.backends.text import printable

__all__ = ["run_options", "add_run", "add_compare"]


class _Progress:
    """A rich progress bar on a terminal, plain lines otherwise (a case's name is text: printable). Off a
    terminal (a log), a case that does not pass gets its line when it ends, the passes a count at each
    quarter of the run: the table after the run lists every case, so a log need not list them twice."""

    def __init__(self, console):
        self.console, self.done, self.total, self.bar, self.task = console, 0, None, None, None
        self.passed = 0

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
            return
        width = len(str(self.total))
        if verdicts == "pass":
            self.passed += 1
        else:
            self.console.print(shown(f"[{self.done:>{width}}/{self.total}] {item.name} ({item.source}): "
                                     f"{verdicts} {result.seconds:.1f} s"))
        marks = {(self.total * k + 3) // 4 for k in (1, 2, 3)} if self.total >= 8 else set()
        if self.done in marks | {self.total}:
            self.console.print(f"[{self.done:>{width}}/{self.total}] done, {self.passed} passed")


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
    """What directed generation aimed at (properties/search/directed.py), for the line that announces the cases."""
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
        console.print(shown(f"{len(items)} cases: " + ", ".join(
            f"{sum(i.source == s for i in items)} {s}" for s in SOURCES) + _aimed(items)))

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
                        help="the whole run's time: a case the backend estimates would end after SECONDS of the run is "
                             "not started (skipped, kind budget; 0: no limit; default: the backend's, 600 on sim, else "
                             f"no limit; at most {RUN_SECONDS:,}, a day)")
    parser.add_argument("--allow-skips", type=skip_kinds, default=(), metavar="KIND,...",
                        help=f"skips of these kinds do not fail the run: {', '.join(SKIP_KINDS)}, or all "
                             "(default: none; every case asked for must be checked)")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="with --backend auto, a fall back to the golden (no kernel here) does not fail the run")
    parser.add_argument("--max-bytes", type=byte_count, default=None, metavar="BYTES",
                        help="largest case to build (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    parser.add_argument("--regressions", metavar="DIR", default=None, help=REGRESSIONS_HELP)
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--coverage", type=coverage_bins, default=(), metavar="all|BIN,...",
                        help="fail the run when one of these coverage bins (properties/rule/coverage.py; 'all': every "
                             "single bin) is hit by no checked case, naming the holes in one line")
    parser.add_argument("--case-timeout", type=count(at_most=RUN_SECONDS), default=None, metavar="SECONDS",
                        help="one case's time: a case the backend estimates over SECONDS is not started (skipped, kind "
                             "limit), and a kernel call that has not returned after SECONDS is ended (its worker process "
                             "is killed; the case is an error); 0: no limit; default: no skip, and a call is ended "
                             f"only where the backend has a cost model, after {runner_limit_text()}")
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
