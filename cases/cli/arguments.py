"""The argument types and shared options of the ``pfa-verify`` subcommands: each turns a bad value into
argparse's one-line usage error naming the option."""
from __future__ import annotations

import argparse

__all__ = ["count", "fraction", "byte_count", "skip_kinds", "distributions", "add_cluster_argument", "cluster_refused",
           "coverage_bins"]


def count(text: str) -> int:
    """An argparse type: a count, an integer >= 0 (the commands' --examples, --workers, --seed, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1]")
    return value


def byte_count(text: str) -> int:
    """An argparse type: a positive number of bytes, written as an integer or as 8e9 (--max-bytes)."""
    try:
        value = int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of bytes such as 8e9") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def skip_kinds(text: str) -> tuple[str, ...]:
    from kernels import SKIP_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in SKIP_KINDS + ("all",)]
    if bad or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(SKIP_KINDS)}, all")
    return kinds


def distributions(text: str) -> tuple[str, ...]:
    from golden import DISTRIBUTIONS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in DISTRIBUTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among {', '.join(DISTRIBUTIONS)}")
    return names


def add_cluster_argument(parser, what: str) -> None:
    """``--cluster ray[=HOST:PORT]`` on an argparse parser (run, mutants, search)."""
    from cases.running.pool import parse_cluster

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
    import sys
    print(f"pfa-verify: error: {exc}", file=sys.stderr)
    return 2


def coverage_bins(text: str) -> tuple[str, ...]:
    """``--coverage``: ``all``, or bin names of properties.coverage (unknown names: a usage error)."""
    from properties.coverage import bin_names
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = bin_names()
    bad = [n for n in names if n != "all" and n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: {bad or 'nothing'} not among the coverage bins (all, "
                                         f"{', '.join(n for n in known if ' x ' not in n)})")
    return names
