"""The argument types and shared options of the ``pfa-verify`` subcommands: each turns a bad value into
argparse's one-line usage error naming the option."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import overload

from pfa_verify.cases.running.pool import parse_cluster
from pfa_verify.golden import DISTRIBUTIONS
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.inputs import parse_byte_count
from pfa_verify.kernels import SKIP_KINDS
from pfa_verify.kernels.backends.text import printable
from pfa_verify.properties.rule.coverage import bin_names

__all__ = ["count", "fraction", "byte_count", "skip_kinds", "distributions", "add_cluster_argument", "cluster_refused",
           "coverage_bins", "RUN_EXAMPLES", "SEARCH_EXAMPLES", "MATRIX_EXAMPLES", "SEARCH_TASKS", "SHRINK_SECONDS",
           "RUN_SECONDS", "REGRESSIONS_HELP", "BENCH_REPEATS", "BENCH_CASES", "TIGHTNESS_CASES", "worker_bound"]

# The upper bounds of the count options. Each lies well above the largest run the project makes (tox,
# the nightly profile, the docs' cluster runs) and within what finishes in about a day; over it is a typo
# (extra zeros, milliseconds for seconds) that would otherwise start a run that prints nothing for hours.
# The sim takes about 2.5 s per kernel-sized case per worker on this 2-core machine (README: 38 cases in
# 48.9 s on 2 workers), the golden a fraction of that.
RUN_EXAMPLES = 10_000       # run's generated cases: about 3.5 h of sim on 2 workers; the docs' cluster run takes 2,000
SEARCH_EXAMPLES = 100_000   # search's examples per law, split over its tasks: 50 x the nightly profile's 2,000
MATRIX_EXAMPLES = 2_000     # mutants/conforming, per law and mutant (times some 20 mutants x 10 laws): the nightly's
SEARCH_TASKS = 1_000        # tasks per law, each a process or Ray task with its own start: more than a cluster's cores
SHRINK_SECONDS = 3_600      # per kind of failure: Hypothesis's shrinks settle in seconds to minutes
RUN_SECONDS = 86_400        # --budget and --case-timeout: a day, longer than any night's run
BENCH_REPEATS = 100         # bench's timed repetitions (the best is kept: 3 is the default)
BENCH_CASES = 100_000       # bench's workloads (200 small, 20 kernel-sized by default)
TIGHTNESS_CASES = 1_000     # kernel-sized cases per distribution, each with a full envelope (20 by default)

# --regressions of every command: the user's folder, read and written; the shipped captures are read beside it.
REGRESSIONS_HELP = ("your captures folder: failures are captured there, and replayed from there beside the captures "
                    "shipped with pfa-verify (default ./pfa-verify-regressions, created by the first capture, or "
                    "$PFA_VERIFY_REGRESSIONS)")


def worker_bound() -> int:
    """The most ``--workers``: 4 per CPU this process may use, and 256 at most. Workers are local
    processes (a cluster's concurrency is its own resources), each with its own torch; past a few per
    CPU they only wait for one, and 256 bounds a large host."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(4 * cpus, 256)


@overload
def count(text: str, *, at_most: int | None = None) -> int: ...


@overload
def count(*, at_most: int) -> Callable[[str], int]: ...


def count(text: str | None = None, *, at_most: int | None = None) -> int | Callable[[str], int]:
    """An argparse type: a count, an integer >= 0 (``type=count``: --seed, --device); ``type=count(at_most=N)``
    also refuses more than N (the bounds above), naming the bound."""
    if text is None:
        if at_most is None:
            raise TypeError("count() takes the option's text, or at_most= for a bounded count")

        def bounded_count(text: str) -> int:
            return count(text, at_most=at_most)
        return bounded_count
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    if at_most is not None and value > at_most:
        raise argparse.ArgumentTypeError(f"{text!r} is over the bound: at most {at_most:,}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1]")
    return value


def byte_count(text: str) -> int:
    """An argparse type: a positive number of bytes, written as an integer or as 8e9 (--max-bytes), parsed
    as $PFA_VERIFY_MAX_BYTES is (golden.inputs.parse_byte_count)."""
    try:
        return parse_byte_count(text, "value")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("value=")) from None


def skip_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in SKIP_KINDS + ("all",)]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(SKIP_KINDS)}, all")
    return kinds


def distributions(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in DISTRIBUTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(DISTRIBUTIONS)}")
    return names


def add_cluster_argument(parser, what: str) -> None:
    """``--cluster ray[=HOST:PORT]`` on an argparse parser (run, mutants, search)."""

    def cluster(text: str) -> str:
        try:
            return parse_cluster(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--cluster {text!r} ")) from None
    parser.add_argument("--cluster", type=cluster, default=None, metavar="ray[=HOST:PORT]",
                        help=f"run {what} as Ray tasks: ray=HOST:PORT joins a running cluster ('ray start --head' prints "
                             "the address), ray alone starts a local Ray for this command; npu tasks ask for one NPU "
                             "each, the others for one CPU (pip install 'pfa-verify[ray]'; README: Running on a cluster)")


def cluster_refused(exc) -> int:
    """A cluster that cannot take the work: one line, exit 2, before any case ran (cases/running/pool.py)."""
    print(f"pfa-verify: error: {printable(exc)}", file=sys.stderr)
    return 2


def coverage_bins(text: str) -> tuple[str, ...]:
    """``--coverage``: ``all``, or bin names of properties.rule.coverage (unknown names: a usage error)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = bin_names()
    bad = [n for n in names if n != "all" and n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among the coverage bins (all, "
                                         f"{', '.join(n for n in known if ' x ' not in n)})")
    return names
