"""``pfa-verify``: the command line over cases/' four rooms (data, running, reporting, measuring).
Nothing imports it, so ``python -m cases.cli`` and the ``pfa-verify`` script are the same program.

    pfa-verify run [options]              regressions, catalog and generated cases on a backend
    pfa-verify compare A.json B.json [--html PATH]   two reports of the same selection side by side
                                          (cases/reporting/report_compare.py)
    pfa-verify bench [options]            the golden self-check and benchmark (cases/measuring/bench.py)
    pfa-verify mutants [options]          the kill matrix of the mutant catalog (cases/measuring/mutants.py)
    pfa-verify conforming [options]       the false reds of the conforming variants (cases/measuring/conforming.py)
    pfa-verify tightness [--cases N]      the envelope's tightness per distribution (cases/measuring/tightness.py)
    pfa-verify laws [options]             every law on a backend within a budget, one verdict each (cases/running/search.py)
    pfa-verify search [options]           law searches split into tasks, on a cluster too (cases/running/search.py)
    pfa-verify cases list                 captured regressions (id, law, backend, first message line;
                                          the cases subcommand is cases/cli/captured.py)
    pfa-verify cases show ID              the whole record of one
    pfa-verify cases replay ID [--backend NAME]   run it again under its rule; exit 1 if it still fails
    pfa-verify cases prune [--backend NAME] [--dry-run]   delete captured cases that now pass on the
                                          backend they were captured on

Exit status: 0 passed, 1 failed (see cases/reporting/report.py for the rule), 2 the command could not run (a
usage error, a backend that cannot start here, a case file that cannot be loaded: golden.errors.UsageError,
one line), 1 also for a write that fails once the command ran (a full disk: one line naming the path), 128 + the
signal's number when a signal interrupted it: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1
(cases/cli/interrupt.py: a run summarizes what it checked first; a second signal ends at once). With
--in-process, never 0 when the command ended before its summary (cases/cli/in_process.py). Any other
exception is a bug of ours and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap

from pfa_verify.cases.cli import captured, in_process
from pfa_verify.cases.cli.interrupt import Interruption
from pfa_verify.cases.cli.law_commands import add_laws, add_search
from pfa_verify.cases.cli.measure_commands import add_bench, add_conforming, add_mutants, add_tightness
from pfa_verify.cases.cli.run_commands import add_compare, add_run, run_options
from pfa_verify.cases.reporting.terminal import guarded_streams
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.inputs import MAX_BYTES_ENV
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels.backends.text import printable

__all__ = ["build_parser", "main", "run_options", "SUBCOMMANDS"]


def add_cases(parser: argparse.ArgumentParser) -> None:
    captured.add_arguments(parser)


SUBCOMMANDS = {
    "run": ("run regressions, catalog and generated cases on a backend against the golden", add_run),
    "compare": (("two reports of the same selection side by side: verdicts that differ, worst error over the "
                "tolerance per case (exit 1 when verdicts differ, 2 when the selections differ)"), add_compare),
    "bench": ("the golden self-check: vectorized vs loop golden, times and bit agreement", add_bench),
    "cases": ("list, show, replay and prune captured regression cases", add_cases),
    "mutants": ("the kill matrix: every mutant of a level through every law and the catalog", add_mutants),
    "conforming": (("the false reds of correct kernels: every conforming variant (SPEC §4.1) through every law and "
                   "the catalog; any failure is a false red of the suite (options as mutants)"), add_conforming),
    "tightness": (("how wide the acceptance envelope is, per value distribution, on kernel-sized cases "
                  "(cases/tightness.json holds the recorded figures)"), add_tightness),
    "laws": (("every law of SPEC §2-§6 on a backend, one search each within a budget of examples and seconds: a "
              "table of verdicts, each failure shrunk, diagnosed and captured"), add_laws),
    "search": (("long law searches split into tasks with their own seeds, here, in local processes or on a Ray "
               "cluster; failures shrunk and captured once per signature"), add_search),
}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, without line breaks inside names such as pypto-gym:FILE.py."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pfa-verify", description="Verify the FP8 paged-attention kernel "
                                     "against the golden (docs/spec.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add) in SUBCOMMANDS.items():
        add(sub.add_parser(name, help=help_, description=help_, formatter_class=_HelpFormatter))
    return parser


def main(argv=None) -> int:
    """Run one subcommand. A :class:`golden.errors.UsageError` (bad names, case files, catalog, sizes,
    arguments) or a backend that cannot start is one line on stderr and exit 2; anything else is a bug
    of ours and propagates with its traceback (never reported as "could not run").

    What it prints never acts on the terminal and never raises for a character the stream cannot encode
    (cases/reporting/terminal.py). ``argv`` None is the command itself (``pfa-verify``, ``python -m
    cases.cli``): with ``--in-process`` it runs again as a child process that this one watches
    (cases/cli/in_process.py); a caller that passes ``argv`` runs the command in its own process."""
    with guarded_streams():
        channel = in_process.open_channel()
        args = build_parser().parse_args(argv)
        if getattr(args, "in_process", False) and argv is None and channel is None:
            return in_process.watch([sys.executable, *sys.orig_argv[1:]])
        status = _command(args)
        in_process.say_finished(channel)
        return status


def _command(args) -> int:
    if getattr(args, "max_bytes", None):
        os.environ[MAX_BYTES_ENV] = str(args.max_bytes)   # spawned workers inherit it
    # pfa-verify run winds down by itself (it asks args.interruption.stop() between steps); the others stop at once.
    args.interruption = Interruption(cooperative=args.command == "run")
    try:
        with args.interruption:
            status = int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"pfa-verify: interrupted by {args.interruption.signal or 'SIGINT'}: the command did not finish",
              file=sys.stderr)
        return args.interruption.exit_status
    except BackendUnavailable as exc:
        print(f"pfa-verify: error: the backend cannot run here: {printable(exc.reason)}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"pfa-verify: error: {printable(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A write that fails after the up-front checks passed (a disk that filled, a folder removed): the
        # machine's doing, not ours: one line naming the path, and the command failed.
        where = f" {printable(exc.filename)}" if exc.filename else ""
        print(f"pfa-verify: error: could not complete the command:{where} {printable(exc.strerror or exc)}",
              file=sys.stderr)
        return args.interruption.exit_status if args.interruption.signal else 1
    # An interrupt whose KeyboardInterrupt was lost (raised inside a garbage-collection callback) still counts.
    return args.interruption.exit_status if args.interruption.signal else status


if __name__ == "__main__":
    sys.exit(main())
