"""The one exception for bad input from whoever drives the suite: :class:`UsageError`.

A usage error is input a person or a file got wrong at a boundary the project owns: a case name, a
case file, the catalog, a mutant or backend name, a size over the limit, an argument of a command. The
command line (cases/cli/) prints its message as one line and exits 2. Everything else a command
raises (a TypeError in the report code, an IndexError in a renderer) is a bug of ours and keeps its
traceback: catching every ValueError at the top would report our own bugs as "could not run".

It is a ValueError, so the public API keeps its promise (bad input gets a ValueError that names the
argument) and callers that catch ValueError keep working. It lives in golden/, the lowest package, so
that every layer (golden <- kernels <- properties <- cases) can raise it where the input enters.
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["UsageError", "check_known"]


class UsageError(ValueError):
    """Bad input at a boundary (names, files, sizes, arguments): one line and exit 2 on the command line."""


def check_known(option: str, noun: str, names: Iterable[str], known: Iterable[str], *, hint: str = "") -> None:
    """Raise :class:`UsageError` when some of ``names`` are not in ``known``.

    * ``option`` -- where the names were given (``"--laws"``); ``noun`` -- what they name (``"law"``).
    * ``hint`` -- where to find the valid names; default: list them.

    ``check_known("--laws", "law", ["nope"], PAGED_LAWS)`` raises ``--laws: unknown law(s) ['nope'];
    expected some of (...)``.
    """
    known = tuple(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"{option}: unknown {noun}(s) {unknown}; " + (hint or f"expected some of {known}"))
