"""``pfa-verify mutants``, ``conforming``, ``bench`` and ``tightness``: the suite measuring itself (cases/measuring),
from the command line."""
from __future__ import annotations

import argparse
import dataclasses
import json
import json as json_module
import sys
from pathlib import Path

from pfa_verify import golden
from pfa_verify.cases.cli import preflight
from pfa_verify.cases.cli.arguments import (
    BENCH_CASES,
    BENCH_REPEATS,
    MATRIX_EXAMPLES,
    SHRINK_SECONDS,
    TIGHTNESS_CASES,
    add_cluster_argument,
    cluster_refused,
    count,
    fraction,
    worker_bound,
)
from pfa_verify.cases.measuring import bench, conforming, kill_latency, tightness
from pfa_verify.cases.measuring import mutants as matrix
from pfa_verify.cases.measuring.bench import WORKLOADS
from pfa_verify.cases.measuring.tightness import measure, record, render_table
from pfa_verify.cases.reporting import terminal
from pfa_verify.cases.reporting.terminal import shown
from pfa_verify.cases.running.pool import ClusterError
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels.backends.text import printable
from pfa_verify.kernels.conforming import VARIANTS
from pfa_verify.kernels.mutants import MUTANTS

__all__ = ["add_mutants", "add_conforming", "add_bench", "add_tightness"]


def _conforming(args, console, names, laws) -> int:
    """``--level conforming``: the false reds of the correct variants (cases/measuring/conforming.py)."""

    run = conforming.false_reds(examples=args.examples, seed=args.seed, names=names, laws=laws,
                                catalog=not args.no_catalog, workers=args.workers, cluster=args.cluster)
    console.print(conforming.render_table(run))
    for v in run.variants:
        for c in v.cells:
            if c.first_failure:
                console.print(shown(f"{v.name}: {c.law}: {c.failures} false red(s), first: "
                                    f"{c.first_failure['message']}"))
    for line in conforming.model_lines(run):
        console.print(shown(line))
    console.print(shown(conforming.summary_line(run)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json_module.dumps(conforming.to_json(run), indent=2) + "\n")
        console.print(shown(f"JSON report: {args.json}"))
    return run.exit_status


def _list_catalog(args, console) -> int:
    """``mutants --list``: the catalog of the level (the conforming variants for --level conforming)."""
    if args.level == "conforming":
        for v in VARIANTS.values():
            console.print(shown(f"conforming {v.name:<40} {v.description}"))
        return 0
    for m in MUTANTS.values():
        tag = " (equivalent)" if m.equivalent else ""
        console.print(shown(f"{m.level:<6} {m.name:<40} {m.bug}{tag}"))
    return 0


def _cmd_mutants(args) -> int:
    preflight.check_command(args)


    console = terminal.console(width=None if sys.stdout.isatty() else 240, markup=True)   # the matrices' own markup
    if args.list:
        return _list_catalog(args, console)

    def progress(name, cell):
        verdict = f"killed after {cell.examples}" if cell.killed else f"survived {cell.examples}"
        console.print(shown(f"  {name or 'baseline'}: {cell.law}: {verdict} ({cell.seconds:.1f} s)"))

    names = [n.strip() for n in args.mutants.split(",")] if args.mutants else None
    laws = [n.strip() for n in args.laws.split(",")] if args.laws else None
    if getattr(args, "latency", False):
        try:
            return _latency(args, console, names)
        except ClusterError as exc:
            return cluster_refused(exc)
    if args.level == "conforming":
        if args.command == "mutants":
            print("pfa-verify: note: 'mutants --level conforming' is now 'pfa-verify conforming' (same options)",
                  file=sys.stderr)
        try:
            return _conforming(args, console, names, laws)
        except ClusterError as exc:
            return cluster_refused(exc)
    try:
        run = matrix.kill_matrix(args.level, examples=args.examples, seed=args.seed, names=names, laws=laws,
                                 catalog=not args.no_catalog, goal=args.goal, workers=args.workers,
                                 shrink_s=args.shrink_seconds, progress=progress if args.verbose else None,
                                 allowed_survivors=[n.strip() for n in args.allow_survivors.split(",") if n.strip()],
                                 cluster=args.cluster)
    except BackendUnavailable as exc:
        print(f"pfa-verify: error: the {args.level} level cannot run here: {printable(exc)}", file=sys.stderr)
        return 2
    except ClusterError as exc:
        return cluster_refused(exc)
    console.print(matrix.render_table(run))
    for m in run.mutants:
        first = m.first_kill
        if first is not None:
            smallest = matrix.counterexample_text(first.law, first.counterexample) if first.counterexample else "-"
            console.print(shown(f"{m.name}: first kill after {first.examples} example(s), {first.seconds:.1f} s; "
                                f"smallest {smallest}"))
    console.print(shown(matrix.summary_line(run)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json_module.dumps(matrix.to_json(run), indent=2) + "\n")
        console.print(shown(f"JSON report: {args.json}"))
    if args.html:
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(matrix.render_html(run), encoding="utf-8")
        console.print(shown(f"HTML report: {args.html}"))
    return run.exit_status


def _latency(args, console, names) -> int:
    """``mutants --latency``: generated cases to each mutant's first kill, directed and plain order."""
    ignored = [option for option, given in (("--html", args.html), ("--laws", args.laws), ("--no-catalog", args.no_catalog),
                                            ("--goal", args.goal is not None), ("--allow-survivors", args.allow_survivors),
                                            ("--shrink-seconds", args.shrink_seconds != 30), ("--verbose", args.verbose))
               if given]
    if ignored:
        print(f"pfa-verify: error: --latency does not take {', '.join(ignored)} (they are the kill matrix's; "
              "--latency takes --level, --examples, --seed, --mutants, --workers, --cluster and --json)", file=sys.stderr)
        return 2
    try:
        rows = kill_latency.latency_rows(args.level, examples=args.examples, seed=args.seed, names=names,
                                         workers=args.workers, cluster=args.cluster)
    except BackendUnavailable as exc:
        print(f"pfa-verify: error: the {args.level} level cannot run here: {printable(exc)}", file=sys.stderr)
        return 2
    console.print(kill_latency.render_table(rows, level=args.level, examples=args.examples, seed=args.seed))
    broken = [r for r in rows if r.error]
    for r in broken:
        console.print(shown(f"{r.name}: broken: {r.error}"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        data = {"level": args.level, "examples": args.examples, "seed": args.seed,
                "rows": [dataclasses.asdict(r) for r in rows], "summary": kill_latency.summary(rows)}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        console.print(shown(f"JSON report: {args.json}"))
    return 1 if broken else 0


def add_mutants(parser: argparse.ArgumentParser, *, level: str | None = None) -> None:
    """The options of ``pfa-verify mutants`` (``level`` None: with ``--level``) and of ``pfa-verify
    conforming`` (``level="conforming"``: the same matrix for the correct variants)."""
    if level is None:
        parser.add_argument("--level", choices=("golden", "sim", "conforming"), default="golden",
                            help="golden: stage mutants of the golden (fast); sim: mutants of our PyPTO kernel on the "
                                 "sim; conforming: the old spelling of 'pfa-verify conforming'")
        parser.add_argument("--latency", action="store_true",
                            help="instead of the matrix: how many of `pfa-verify run --cases catalog --examples N`'s "
                                 "generated cases (aimed at the coverage holes, and drawn plainly as before) come "
                                 "before each mutant's first kill")
    else:
        parser.set_defaults(level=level)
    parser.add_argument("--examples", type=count(at_most=MATRIX_EXAMPLES), default=20,
                        help="examples per law and mutant (default 20, the ci profile's; at most "
                             f"{MATRIX_EXAMPLES:,}, the nightly's); with --latency, the generated cases of the run")
    parser.add_argument("--seed", type=count, default=0, help="seed of the searches (default 0)")
    parser.add_argument("--mutants", default=None, metavar="NAME,...", help="only these mutants (default: the level's)")
    parser.add_argument("--laws", default=None, metavar="LAW,...", help="only these laws (default: every paged law)")
    parser.add_argument("--no-catalog", action="store_true", help="leave out the catalog column")
    parser.add_argument("--goal", type=fraction, default=None, help="the kill ratio under which the command fails "
                        "(default 1.0 golden, 0.9 sim)")
    parser.add_argument("--json", metavar="PATH", help="write the kill matrix as JSON")
    parser.add_argument("--html", metavar="PATH", help="write the kill matrix as one HTML file")
    parser.add_argument("--workers", type=count(at_most=worker_bound()), default=1,
                        help="processes, one mutant each at a time (default 1; at most 4 per CPU and 256: "
                             f"{worker_bound()} here)")
    add_cluster_argument(parser, "the rows (one mutant or variant per task)")
    parser.add_argument("--shrink-seconds", type=count(at_most=SHRINK_SECONDS), default=30, metavar="S",
                        help="time for Hypothesis to shrink each mutant's first kill (default 30; 0: not shrunk; "
                             f"at most {SHRINK_SECONDS:,})")
    parser.add_argument("--allow-survivors", default="", metavar="NAME,...",
                        help="mutants whose survival does not fail the goal (still reported as survivors and in "
                        "the kill ratio); 'ledger' names the known ones of the level, each with its reason in "
                        "properties/rule/ledger.py")
    parser.add_argument("--list", action="store_true", help="list the catalog of mutants and stop")
    parser.add_argument("--verbose", action="store_true", help="one line per (mutant, law) as it finishes")
    parser.set_defaults(func=_cmd_mutants)


def add_conforming(parser: argparse.ArgumentParser) -> None:
    add_mutants(parser, level="conforming")
    parser.set_defaults(func=_cmd_mutants)


def add_bench(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=WORKLOADS, default="all")
    parser.add_argument("--repeat", type=count(at_most=BENCH_REPEATS), default=3,
                        help=f"timed repetitions; the best is kept (default 3, at most {BENCH_REPEATS})")
    parser.add_argument("--small-cases", type=count(at_most=BENCH_CASES), default=200,
                        help=f"size of the small ragged workload (default 200, at most {BENCH_CASES:,})")
    parser.add_argument("--kernel-cases", type=count(at_most=BENCH_CASES), default=20,
                        help=f"size of the kernel-sized workload (default 20, at most {BENCH_CASES:,})")
    parser.add_argument("--stages", action="store_true",
                        help="add the suite's cost per example, stage by stage on one core, beside its budget")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    preflight.check_command(args)
    return bench.main(workload=args.workload, repeat=args.repeat, small_cases=args.small_cases,
                      kernel_cases=args.kernel_cases, stages=args.stages, json_path=args.json)


def add_tightness(parser) -> None:
    """The options of ``pfa-verify tightness``."""
    parser.add_argument("--examples", type=count(at_most=TIGHTNESS_CASES), default=20, metavar="N",
                        help=f"generated kernel-sized cases per distribution (default 20, at most {TIGHTNESS_CASES:,})")
    parser.add_argument("--seed", type=count, default=0, help="seed of the derandomized draws (default 0)")
    parser.add_argument("--record", action="store_true",
                        help="measure 4 cases per distribution and rewrite cases/tightness.json (what "
                             "tests/cases/test_tightness.py holds the envelope to)")
    parser.set_defaults(func=_cmd_tightness)


def _cmd_tightness(args) -> int:
    """``pfa-verify tightness``: the table, or with ``--record`` the recorded shares rewritten."""
    preflight.check_command(args)
    preflight.check_output_file("--record", tightness.RECORDED if args.record else None)
    if args.examples < 1:
        raise UsageError(f"--examples {args.examples}: expected at least 1 case per distribution")
    if args.record:
        print(json.dumps(record(seed=args.seed), indent=1))
        return 0

    terminal.console(width=160, markup=True).print(render_table([measure(d, args.examples, args.seed)
                                                                 for d in golden.DISTRIBUTIONS]))
    return 0
