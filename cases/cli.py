"""``pfa-verify``: the command line, the last stage of the cases/ pipeline
(collect -> run -> report -> html_report -> cli). Nothing imports it, so ``python -m cases.cli`` and
the ``pfa-verify`` script are the same program.

    pfa-verify run [options]              regressions, catalog and generated cases on a backend
    pfa-verify compare A.json B.json [--html PATH]   two reports of the same selection side by side
                                          (cases/report_compare.py)
    pfa-verify bench [options]            the golden self-check and benchmark (cases/bench.py)
    pfa-verify mutants [options]          the kill matrix of the mutant catalog (cases/mutants.py)
    pfa-verify search [options]           law searches split into tasks, on a cluster too (cases/search.py)
    pfa-verify cases list                 captured regressions (id, law, backend, first message line)
    pfa-verify cases show ID              the whole record of one
    pfa-verify cases replay ID [--backend NAME]   run it again under its rule; exit 1 if it still fails
    pfa-verify cases prune [--backend NAME] [--dry-run]   delete captured cases that now pass on the
                                          backend they were captured on

Exit status: 0 passed, 1 failed (see cases/report.py for the rule), 2 the command could not run (a
usage error, a backend that cannot start here, a case file that cannot be loaded: golden.errors.UsageError,
one line). Any other exception is a bug of ours and keeps its traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

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

def _cmd_run(args) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from cases import html_report, report
    from cases import run as runner
    from cases.collect import SOURCES
    console = Console() if sys.stdout.isatty() else Console(width=200, force_terminal=False)
    progress = _Progress(console)

    def announce(items, note):
        progress.total = len(items)
        console.print(note, highlight=False, markup=False)
        console.print(f"{len(items)} cases: " + ", ".join(
            f"{sum(i.source == s for i in items)} {s}" for s in SOURCES), highlight=False)

    from cases.pool import ClusterError
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
                run = runner.execute(args, progress=hook, on_items=announce)
        else:
            run = runner.execute(args, progress=progress, on_items=announce)
    except ClusterError as exc:
        return _cluster_refused(exc)
    report.print_report(run, console)
    if args.json:
        console.print(f"JSON report: {report.write_json(run, args.json)}", highlight=False)
    if args.html:
        console.print(f"HTML report: {html_report.write_html(run, args.html)}", highlight=False)
    return report.exit_status(run)


def _cluster_refused(exc) -> int:
    """A cluster that cannot take the work: one line, exit 2, before any case ran (cases/pool.py)."""
    print(f"pfa-verify: error: {exc}", file=sys.stderr)
    return 2


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _bytes(text: str) -> int:
    try:
        value = int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of bytes such as 8e9") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


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
    from cases.pool import add_cluster_argument
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
    parser.add_argument("--max-bytes", type=_bytes, default=None, metavar="BYTES",
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
    from cases import report_compare
    report_compare.add_arguments(parser)
    parser.set_defaults(func=report_compare.run)


# --- pfa-verify mutants --------------------------------------------------------------------------

def _conforming(args, console, names, laws) -> int:
    """``--level conforming``: the false reds of the correct variants (cases/conforming.py)."""
    import json as json_module
    from pathlib import Path

    from cases import conforming
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


def _cmd_mutants(args) -> int:
    import json as json_module

    from rich.console import Console

    from cases import mutants as matrix
    from kernels.mutants import MUTANTS
    console = Console() if sys.stdout.isatty() else Console(width=240, force_terminal=False)
    if args.list and args.level == "conforming":
        from kernels.conforming import VARIANTS
        for v in VARIANTS.values():
            console.print(f"conforming {v.name:<40} {v.description}", highlight=False, markup=False)
        return 0
    if args.list:
        for m in MUTANTS.values():
            tag = " (equivalent)" if m.equivalent else ""
            console.print(f"{m.level:<6} {m.name:<40} {m.bug}{tag}", highlight=False, markup=False)
        return 0

    def progress(name, cell):
        verdict = f"killed after {cell.examples}" if cell.killed else f"survived {cell.examples}"
        print(f"  {name or 'baseline'}: {cell.law}: {verdict} ({cell.seconds:.1f} s)", flush=True)

    names = [n.strip() for n in args.mutants.split(",")] if args.mutants else None
    laws = [n.strip() for n in args.laws.split(",")] if args.laws else None
    from cases.pool import ClusterError
    if args.level == "conforming":
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


def _add_mutants(parser: argparse.ArgumentParser) -> None:
    from cases.pool import add_cluster_argument
    parser.add_argument("--level", choices=("golden", "sim", "conforming"), default="golden",
                        help="golden: stage mutants of the golden (fast); sim: mutants of our PyPTO kernel on the sim; "
                             "conforming: correct variants (SPEC §4.1), whose every failure is a false red")
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
    from cases import search
    search.add_arguments(parser)
    parser.set_defaults(func=search.main)


# --- pfa-verify bench ----------------------------------------------------------------------------

def _add_bench(parser: argparse.ArgumentParser) -> None:
    from cases import bench
    bench.add_arguments(parser)
    parser.set_defaults(func=bench.run)


# --- pfa-verify cases ... ------------------------------------------------------------------------

def _cmd_list(args) -> int:
    from cases import regressions
    from golden.errors import UsageError
    ids = regressions.list_ids(directory=args.dir)
    if not ids:
        print(f"no captured regressions in {regressions.directory(args.dir)}")
        return 0
    for rid in ids:
        try:
            print(regressions.load(rid, directory=args.dir).summary())
        except UsageError as exc:
            print(f"{rid}  unreadable: {exc}")
    return 0


def _cmd_show(args) -> int:
    from cases import regressions
    reg = regressions.load(args.id, directory=args.dir)
    data = reg.to_json()
    message = data.pop("message")
    print(json.dumps(data, indent=2))
    print("\nmessage:\n" + message)
    return 0


def _cmd_replay(args) -> int:
    from cases import regressions
    from kernels import BackendUnavailable, get_backend
    from kernels.backends import use_backend_threads
    reg = regressions.load(args.id, directory=args.dir)
    name = args.backend or reg.backend
    backend = get_backend(name)
    use_backend_threads(backend)
    print(f"replaying {reg.id}: law {reg.law} on backend {name} (captured on {reg.backend})")
    if name != reg.backend:
        print(f"note: this checks {name}, not {reg.backend}, on the captured case")
    try:
        regressions.replay(reg, backend, directory=args.dir)
    except AssertionError as exc:
        print(f"FAIL\n{exc}")
        return 1
    except BackendUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - the backend crashed on the case: an error, reported as one
        print(f"ERROR: the {name} backend raised on this case: {type(exc).__name__}: {exc}")
        return 1
    print("PASS: the captured failure no longer reproduces")
    return 0


def _cmd_prune(args) -> int:
    from cases import ledger, regressions
    from golden.errors import UsageError
    from kernels import BackendUnavailable, get_backend
    from kernels.backends import use_backend_threads
    folder = regressions.directory(args.dir)
    removed = 0
    backends: dict = {}
    for rid in regressions.list_ids(directory=args.dir):
        try:
            reg = regressions.load(rid, directory=args.dir)
        except UsageError as exc:
            print(f"kept {rid}: unreadable ({exc})")
            continue
        if args.backend and args.backend != reg.backend:
            # A case passes or fails on the backend it was captured on; another backend's pass says
            # nothing about it (a sim failure passes on the golden).
            print(f"kept {rid}: captured on {reg.backend}, not {args.backend}")
            continue
        config = reg.to_case().config if reg.case.get("kind") == "paged" else None
        if ledger.lookup(rid, reg.backend, config=config):
            print(f"kept {rid}: in the ledger")
            continue
        try:
            backend = backends.get(reg.backend) or backends.setdefault(reg.backend, get_backend(reg.backend))
            use_backend_threads(backend)
        except BackendUnavailable as exc:
            print(f"kept {rid}: backend {reg.backend} cannot run here ({exc.reason})")
            continue
        try:
            regressions.replay(reg, backend)
        except AssertionError:
            continue
        except Exception as exc:  # noqa: BLE001 - a case the backend crashes on is kept, and said so
            print(f"kept {rid}: the {reg.backend} backend raised ({type(exc).__name__}: {exc})")
            continue
        print(f"{'would remove' if args.dry_run else 'removed'} {rid} (passes on {reg.backend})")
        removed += 1
        if not args.dry_run:
            for suffix in (".json", ".npz"):
                (folder / f"{rid}{suffix}").unlink(missing_ok=True)
    known = set(regressions.list_ids(directory=args.dir))
    for npz in folder.glob("*.npz") if folder.is_dir() else ():
        if npz.stem not in known:
            print(f"{'would remove' if args.dry_run else 'removed'} orphan {npz.name}")
            if not args.dry_run:
                npz.unlink()
    print(f"{removed} passing case(s) {'to remove' if args.dry_run else 'removed'}")
    return 0


def _add_cases(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=None, help="regressions folder (default: cases/regressions, "
                                                    "or $PFA_VERIFY_REGRESSIONS)")
    parser.add_argument("--max-bytes", type=_bytes, default=None, metavar="BYTES",
                        help="largest case to load (default: $PFA_VERIFY_MAX_BYTES, else half the machine's memory)")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="one line per captured case").set_defaults(func=_cmd_list)
    show = sub.add_parser("show", help="the record of one captured case")
    show.add_argument("id")
    show.set_defaults(func=_cmd_show)
    replay = sub.add_parser("replay", help="run a captured case again under its rule (exit 1 if it fails)")
    replay.add_argument("id")
    replay.add_argument("--backend", default=None, help="backend to replay on (default: the captured one)")
    replay.set_defaults(func=_cmd_replay)
    prune = sub.add_parser("prune", help="delete captured cases that pass now on the backend they were captured "
                                         "on (ledger entries are kept)")
    prune.add_argument("--backend", default=None, help="only cases captured on this backend")
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=_cmd_prune)


SUBCOMMANDS = {
    "run": ("run regressions, catalog and generated cases on a backend against the golden", _add_run),
    "compare": ("two reports of the same selection side by side: verdicts that differ, worst error over the "
                "tolerance per case (exit 1 when verdicts differ, 2 when the selections differ)", _add_compare),
    "bench": ("the golden self-check: vectorized vs loop golden, times and bit agreement", _add_bench),
    "cases": ("list, show, replay and prune captured regression cases", _add_cases),
    "mutants": ("the kill matrix: every mutant of a level through every law and the catalog", _add_mutants),
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
