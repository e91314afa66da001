"""``pfa-verify``: the command line over cases/' four rooms (data, running, reporting, measuring).
Nothing imports it, so ``python -m cases.cli`` and the ``pfa-verify`` script are the same program.

    pfa-verify run [options]              regressions, catalog and generated cases on a backend
    pfa-verify compare A.json B.json [--html PATH]   two reports of the same selection side by side
                                          (cases/reporting/report_compare.py)
    pfa-verify bench [options]            the golden self-check and benchmark (cases/measuring/bench.py)
    pfa-verify mutants [options]          the kill matrix of the mutant catalog (cases/measuring/mutants.py)
    pfa-verify conforming [options]       the false reds of the conforming variants (cases/measuring/conforming.py)
    pfa-verify tightness [--cases N]      the envelope's tightness per distribution (cases/measuring/tightness.py)
    pfa-verify search [options]           law searches split into tasks, on a cluster too (cases/running/search.py)
    pfa-verify cases list                 captured regressions (id, law, backend, first message line;
                                          the cases subcommand is cases/cli_cases.py)
    pfa-verify cases show ID              the whole record of one
    pfa-verify cases replay ID [--backend NAME]   run it again under its rule; exit 1 if it still fails
    pfa-verify cases prune [--backend NAME] [--dry-run]   delete captured cases that now pass on the
                                          backend they were captured on

Exit status: 0 passed, 1 failed (see cases/reporting/report.py for the rule), 2 the command could not run (a
usage error, a backend that cannot start here, a case file that cannot be loaded: golden.errors.UsageError,
one line). Any other exception is a bug of ours and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from cases.running.pool import count_argument as _count

__all__ = ["build_parser", "main"]


class _Progress:
    """A rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, console):
        self.console, self.done, self.total, self.bar, self.task = console, 0, None, None, None

    def __call__(self, event, item, result) -> None:
        if self.total is None:
            return
        if event == "start":
            if self.bar is not None:
                self.bar.update(self.task, description=item.name)
            return
        self.done += 1
        verdicts = ",".join(sorted({o.verdict for o in result.outcomes}))
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=item.name)
        else:
            print(f"[{self.done:>{len(str(self.total))}}/{self.total}] {item.name} ({item.source}): {verdicts} "
                  f"{result.seconds:.1f} s", flush=True)


# --- pfa-verify run ------------------------------------------------------------------------------

def run_options(args: argparse.Namespace, command: str | None = None):
    """The typed :class:`cases.running.run.RunOptions` of parsed ``pfa-verify run`` arguments; ``command``
    (default: this process's own command line) is how the report quotes the run."""
    import dataclasses

    from cases.running.run import RunOptions
    fields = {f.name for f in dataclasses.fields(RunOptions)} - {"command"}
    given = {k: v for k, v in vars(args).items() if k in fields}
    given["allow_skips"] = tuple(given.get("allow_skips") or ())
    if given.get("distribution") is not None:
        given["distribution"] = tuple(given["distribution"])
    return RunOptions(**given, command=command or "pfa-verify run " + " ".join(sys.argv[2:]))


def _cmd_run(args) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from cases.reporting import html_report, report
    from cases.running import run as runner
    from cases.data.collect import SOURCES
    console = Console() if sys.stdout.isatty() else Console(width=200, force_terminal=False)
    progress = _Progress(console)

    def announce(items, note):
        progress.total = len(items)
        console.print(note, highlight=False, markup=False)
        console.print(f"{len(items)} cases: " + ", ".join(
            f"{sum(i.source == s for i in items)} {s}" for s in SOURCES), highlight=False)

    from cases.running.pool import ClusterError
    try:
        if console.is_terminal:
            with Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
                          transient=True) as bar:
                progress.bar, progress.task = bar, bar.add_task("choosing backend", total=None)

                def hook(event, item, result):
                    if progress.total is not None and bar.tasks[0].total is None:
                        bar.update(progress.task, total=progress.total)
                    progress(event, item, result)
                run = runner.execute(run_options(args), progress=hook, on_items=announce)
        else:
            run = runner.execute(run_options(args), progress=progress, on_items=announce)
    except ClusterError as exc:
        return _cluster_refused(exc)
    report.print_report(run, console)
    if args.json:
        console.print(f"JSON report: {report.write_json(run, args.json)}", highlight=False)
    if args.html:
        console.print(f"HTML report: {html_report.write_html(run, args.html)}", highlight=False)
    return report.exit_status(run)


def _cluster_refused(exc) -> int:
    """A cluster that cannot take the work: one line, exit 2, before any case ran (cases/running/pool.py)."""
    print(f"pfa-verify: error: {exc}", file=sys.stderr)
    return 2


def _skip_kinds(text: str) -> tuple[str, ...]:
    from kernels import SKIP_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in SKIP_KINDS + ("all",)]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(SKIP_KINDS)}, all")
    return kinds


def _distributions(text: str) -> tuple[str, ...]:
    from golden import DISTRIBUTIONS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in DISTRIBUTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(DISTRIBUTIONS)}")
    return names


def _add_run(parser: argparse.ArgumentParser) -> None:
    from cases.cli_cases import byte_count
    from cases.running.pool import add_cluster_argument
    from kernels import SKIP_KINDS
    parser.add_argument("--backend", default="auto", help="auto | golden | sim | npu | pypto-gym:FILE.py[:FUNCTION] "
                        "(PyPTO-Gym's kernel file or module, unchanged, on the sim; pypto-gym-npu:... on a 950) | "
                        "mutant:NAME | package.module:factory | path/file.py:factory (default: auto = npu, else sim; "
                        "falling back to the golden fails the run unless --allow-fallback)")
    parser.add_argument("--cases", default="all", help="all | catalog | regressions | NAME,... (default all)")
    parser.add_argument("--examples", type=_count, default=20, help="generated cases (default 20)")
    parser.add_argument("--seed", type=_count, default=0, help="seed of the generated cases (default 0)")
    parser.add_argument("--distribution", type=_distributions, default=None, metavar="NAME,...",
                        help="value distributions of the generated cases (default: all of golden.DISTRIBUTIONS)")
    parser.add_argument("--json", metavar="PATH", help="write the JSON report (cases/report.schema.json)")
    parser.add_argument("--html", metavar="PATH", help="write the self-contained HTML report")
    parser.add_argument("--device", type=_count, default=None, help="NPU index (npu: the first of the workers')")
    parser.add_argument("--workers", type=_count, default=1, help="processes (npu: one device each)")
    add_cluster_argument(parser, "the cases")
    parser.add_argument("--budget", type=_count, default=None, metavar="SECONDS",
                        help="do not start a case that the backend estimates would end after this many seconds "
                             "of the run (0: no limit; default: the backend's, 600 on sim, else no limit)")
    parser.add_argument("--max-seconds", type=_count, default=None, metavar="S",
                        help="sim: skip cases the backend's cost model estimates over S seconds (0: no limit; "
                             "default: no limit)")
    parser.add_argument("--allow-skips", type=_skip_kinds, default=(), metavar="KIND,...",
                        help=f"skips of these kinds do not fail the run: {', '.join(SKIP_KINDS)}, or all "
                             "(default: none; every case asked for must be checked)")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="with --backend auto, a fall back to the golden (no kernel here) does not fail the run")
    parser.add_argument("--max-bytes", type=byte_count, default=None, metavar="BYTES",
                        help="largest case to build (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    parser.add_argument("--regressions", metavar="DIR", default=None,
                        help="regressions folder (default cases/regressions or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--no-capture", action="store_true", help="do not write failures to the regressions folder")
    parser.add_argument("--shrink-seconds", type=_count, default=60, metavar="S",
                        help="time for Hypothesis to shrink each kind of generated failure before it is captured "
                             "(0: capture the first failing case as it is; default 60)")
    parser.set_defaults(func=_cmd_run)


# --- pfa-verify compare --------------------------------------------------------------------------

def _add_compare(parser: argparse.ArgumentParser) -> None:
    from cases.reporting import report_compare
    report_compare.add_arguments(parser)
    parser.set_defaults(func=report_compare.run)


# --- pfa-verify mutants --------------------------------------------------------------------------

def _conforming(args, console, names, laws) -> int:
    """``--level conforming``: the false reds of the correct variants (cases/measuring/conforming.py)."""
    import json as json_module
    from pathlib import Path

    from cases.measuring import conforming
    run = conforming.false_reds(examples=args.examples, seed=args.seed, names=names, laws=laws,
                                catalog=not args.no_catalog, workers=args.workers, cluster=args.cluster)
    console.print(conforming.render_table(run))
    for v in run.variants:
        for c in v.cells:
            if c.first_failure:
                console.print(f"{v.name}: {c.law}: {c.failures} false red(s), first: {c.first_failure['message']}",
                              highlight=False, markup=False)
    console.print(conforming.summary_line(run), highlight=False, markup=False)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json_module.dumps(conforming.to_json(run), indent=2) + "\n")
        console.print(f"JSON report: {args.json}", highlight=False)
    return run.exit_status


def _list_catalog(args, console) -> int:
    """``mutants --list``: the catalog of the level (the conforming variants for --level conforming)."""
    if args.level == "conforming":
        from kernels.conforming import VARIANTS
        for v in VARIANTS.values():
            console.print(f"conforming {v.name:<40} {v.description}", highlight=False, markup=False)
        return 0
    from kernels.mutants import MUTANTS
    for m in MUTANTS.values():
        tag = " (equivalent)" if m.equivalent else ""
        console.print(f"{m.level:<6} {m.name:<40} {m.bug}{tag}", highlight=False, markup=False)
    return 0


def _cmd_mutants(args) -> int:
    import json as json_module

    from rich.console import Console

    from cases.measuring import mutants as matrix
    console = Console() if sys.stdout.isatty() else Console(width=240, force_terminal=False)
    if args.list:
        return _list_catalog(args, console)

    def progress(name, cell):
        verdict = f"killed after {cell.examples}" if cell.killed else f"survived {cell.examples}"
        print(f"  {name or 'baseline'}: {cell.law}: {verdict} ({cell.seconds:.1f} s)", flush=True)

    names = [n.strip() for n in args.mutants.split(",")] if args.mutants else None
    laws = [n.strip() for n in args.laws.split(",")] if args.laws else None
    from cases.running.pool import ClusterError
    if args.level == "conforming":
        if args.command == "mutants":
            print("pfa-verify: note: 'mutants --level conforming' is now 'pfa-verify conforming' (same options)",
                  file=sys.stderr)
        try:
            return _conforming(args, console, names, laws)
        except ClusterError as exc:
            return _cluster_refused(exc)
    from kernels import BackendUnavailable
    try:
        run = matrix.kill_matrix(args.level, examples=args.examples, seed=args.seed, names=names, laws=laws,
                                 catalog=not args.no_catalog, goal=args.goal, workers=args.workers,
                                 shrink_s=args.shrink_seconds, progress=progress if args.verbose else None,
                                 allowed_survivors=[n.strip() for n in args.allow_survivors.split(",") if n.strip()],
                                 cluster=args.cluster)
    except BackendUnavailable as exc:
        print(f"pfa-verify: error: the {args.level} level cannot run here: {exc}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        return _cluster_refused(exc)
    console.print(matrix.render_table(run))
    for m in run.mutants:
        first = m.first_kill
        if first is not None:
            smallest = matrix.counterexample_text(first.law, first.counterexample) if first.counterexample else "-"
            console.print(f"{m.name}: first kill after {first.examples} example(s), {first.seconds:.1f} s; smallest "
                          f"{smallest}", highlight=False, markup=False)
    console.print(matrix.summary_line(run), highlight=False, markup=False)
    if args.json:
        from pathlib import Path
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json_module.dumps(matrix.to_json(run), indent=2) + "\n")
        console.print(f"JSON report: {args.json}", highlight=False)
    if args.html:
        from pathlib import Path
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(matrix.render_html(run), encoding="utf-8")
        console.print(f"HTML report: {args.html}", highlight=False)
    return run.exit_status


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1]")
    return value


def _add_mutants(parser: argparse.ArgumentParser, *, level: str | None = None) -> None:
    """The options of ``pfa-verify mutants`` (``level`` None: with ``--level``) and of ``pfa-verify
    conforming`` (``level="conforming"``: the same matrix for the correct variants)."""
    from cases.running.pool import add_cluster_argument
    if level is None:
        parser.add_argument("--level", choices=("golden", "sim", "conforming"), default="golden",
                            help="golden: stage mutants of the golden (fast); sim: mutants of our PyPTO kernel on the "
                                 "sim; conforming: the old spelling of 'pfa-verify conforming'")
    else:
        parser.set_defaults(level=level)
    parser.add_argument("--examples", type=_count, default=20, help="examples per law and mutant (default 20, "
                        "the ci profile's)")
    parser.add_argument("--seed", type=_count, default=0, help="seed of the searches (default 0)")
    parser.add_argument("--mutants", default=None, metavar="NAME,...", help="only these mutants (default: the level's)")
    parser.add_argument("--laws", default=None, metavar="LAW,...", help="only these laws (default: every paged law)")
    parser.add_argument("--no-catalog", action="store_true", help="leave out the catalog column")
    parser.add_argument("--goal", type=_fraction, default=None, help="the kill ratio under which the command fails "
                        "(default 1.0 golden, 0.9 sim)")
    parser.add_argument("--json", metavar="PATH", help="write the kill matrix as JSON")
    parser.add_argument("--html", metavar="PATH", help="write the kill matrix as one HTML file")
    parser.add_argument("--workers", type=_count, default=1, help="processes, one mutant each at a time (default 1)")
    add_cluster_argument(parser, "the rows (one mutant or variant per task)")
    parser.add_argument("--shrink-seconds", type=_count, default=30, metavar="S",
                        help="time for Hypothesis to shrink each mutant's first kill (default 30; 0: not shrunk)")
    parser.add_argument("--allow-survivors", default="", metavar="NAME,...",
                        help="mutants whose survival does not fail the goal (still reported as survivors and in "
                        "the kill ratio); 'ledger' names the known ones of the level, each with its reason in "
                        "properties/ledger.py")
    parser.add_argument("--list", action="store_true", help="list the catalog of mutants and stop")
    parser.add_argument("--verbose", action="store_true", help="one line per (mutant, law) as it finishes")
    parser.set_defaults(func=_cmd_mutants)


# --- pfa-verify search ---------------------------------------------------------------------------

def _add_search(parser: argparse.ArgumentParser) -> None:
    from cases.running import search
    search.add_arguments(parser)
    parser.set_defaults(func=search.main)


def _add_conforming(parser: argparse.ArgumentParser) -> None:
    _add_mutants(parser, level="conforming")
    parser.set_defaults(func=_cmd_mutants)


# --- pfa-verify bench, tightness ------------------------------------------------------------------

def _add_bench(parser: argparse.ArgumentParser) -> None:
    from cases.measuring import bench
    bench.add_arguments(parser)
    parser.set_defaults(func=bench.run)


def _add_tightness(parser: argparse.ArgumentParser) -> None:
    from cases.measuring import tightness
    tightness.add_arguments(parser)
    parser.set_defaults(func=tightness.main)


# --- pfa-verify cases ... ------------------------------------------------------------------------

def _add_cases(parser: argparse.ArgumentParser) -> None:
    from cases import cli_cases
    cli_cases.add_arguments(parser)


SUBCOMMANDS = {
    "run": ("run regressions, catalog and generated cases on a backend against the golden", _add_run),
    "compare": ("two reports of the same selection side by side: verdicts that differ, worst error over the "
                "tolerance per case (exit 1 when verdicts differ, 2 when the selections differ)", _add_compare),
    "bench": ("the golden self-check: vectorized vs loop golden, times and bit agreement", _add_bench),
    "cases": ("list, show, replay and prune captured regression cases", _add_cases),
    "mutants": ("the kill matrix: every mutant of a level through every law and the catalog", _add_mutants),
    "conforming": ("the false reds of correct kernels: every conforming variant (SPEC §4.1) through every law and "
                   "the catalog; any failure is a false red of the suite (options as mutants)", _add_conforming),
    "tightness": ("how wide the acceptance envelope is, per value distribution, on kernel-sized cases "
                  "(cases/tightness.json holds the recorded figures)", _add_tightness),
    "search": ("long law searches split into tasks with their own seeds, here, in local processes or on a Ray "
               "cluster; failures shrunk and captured once per signature", _add_search),
}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, without line breaks inside names such as pypto-gym:FILE.py."""

    def _split_lines(self, text, width):
        import textwrap
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pfa-verify", description="Verify the FP8 paged-attention kernel "
                                     "against the golden (SPEC.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_, description=help_, formatter_class=_HelpFormatter))
    return parser


def main(argv=None) -> int:
    """Run one subcommand. A :class:`golden.errors.UsageError` (bad names, case files, catalog, sizes,
    arguments) or a backend that cannot start is one line on stderr and exit 2; anything else is a bug
    of ours and propagates with its traceback (never reported as "could not run")."""
    args = build_parser().parse_args(argv)
    from golden.errors import UsageError
    from kernels import BackendUnavailable
    if getattr(args, "max_bytes", None):
        from golden.inputs import MAX_BYTES_ENV
        os.environ[MAX_BYTES_ENV] = str(args.max_bytes)   # spawned workers inherit it
    try:
        return int(args.func(args) or 0)
    except BackendUnavailable as exc:
        print(f"pfa-verify: error: the backend cannot run here: {exc.reason}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"pfa-verify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
