"""Where captures live: the user's folder, written and pruned, and the package's shipped captures, replayed only.

The user's folder (:func:`directory`) is ``--regressions DIR``, else ``$PFA_VERIFY_REGRESSIONS``, else
``./pfa-verify-regressions`` of the working directory (created by the first capture). :data:`SHIPPED`
(cases/regressions/) is package data: a clone's checkout or site-packages, which a command must never edit,
so every writer of cases/data/regressions.py calls :func:`refuse_shipped` first.
"""
from __future__ import annotations

import os
from pathlib import Path

from pfa_verify.cases.data import FOLDER, capture_files
from pfa_verify.golden.errors import UsageError

__all__ = ["REGRESSIONS_ENV", "DEFAULT_FOLDER", "SHIPPED", "directory", "is_shipped", "refuse_shipped", "list_ids",
           "shipped_ids", "replayed_ids", "holding"]

REGRESSIONS_ENV = "PFA_VERIFY_REGRESSIONS"   # the user's captures folder, where no --regressions names one
DEFAULT_FOLDER = "pfa-verify-regressions"    # else this folder of the working directory: the user's, not the package's
SHIPPED = FOLDER / "regressions"             # the captures shipped with the package: replayed, never written


def directory(path=None) -> Path:
    """The user's captures folder: ``path``, else ``$PFA_VERIFY_REGRESSIONS``, else ./pfa-verify-regressions
    of the working directory now (absolute, so a later chdir changes nothing)."""
    if path is not None:
        return Path(path)
    env = os.environ.get(REGRESSIONS_ENV)
    return Path(env) if env else Path.cwd() / DEFAULT_FOLDER


def is_shipped(folder) -> bool:
    """Whether ``folder`` is :data:`SHIPPED` (through any link or relative spelling)."""
    return Path(folder).resolve() == SHIPPED.resolve()


def refuse_shipped(folder, *, shown: str | None = None) -> None:
    """A UsageError when ``folder`` (given as ``shown``: an option or variable) is :data:`SHIPPED`: the
    shipped captures are data of the installed package, and a capture, mark or prune there would edit it."""
    if is_shipped(folder):
        raise UsageError(f"{shown or folder}: is the folder of the captures shipped with pfa-verify ({SHIPPED}), "
                         f"read-only data every run replays; captures are written to, and pruned from, your own "
                         f"folder (default ./{DEFAULT_FOLDER}; --regressions DIR or ${REGRESSIONS_ENV} names another)")


def shipped_ids() -> list[str]:
    """The ids of the captures shipped with the package (:data:`SHIPPED`)."""
    return list_ids(directory=SHIPPED)


def replayed_ids(directory=None) -> list[str]:
    """What a run replays: the shipped captures' ids, then the user's folder's that are not among them
    (an id is its content's hash, so one id in both folders is one case)."""
    shipped = shipped_ids()
    return shipped + [rid for rid in list_ids(directory=directory) if rid not in shipped]


def holding(regression_id: str, directory=None) -> Path:
    """The folder cases.data.regressions.load reads ``regression_id`` from: the user's when its record is there (or in
    neither, for the error), else :data:`SHIPPED` when the record is there."""
    folder = globals()["directory"](directory)
    name = f"{regression_id}.json"
    if not os.path.lexists(folder / name) and os.path.lexists(SHIPPED / name):
        return SHIPPED
    return folder


def list_ids(*, directory=None) -> list[str]:
    """The ids of the (user's) folder's records (``<id>.json``, not hidden), from its entries alone: nothing is
    opened, so a record that is a FIFO or a link is listed, and regressions.load says why it is refused."""
    folder = globals()["directory"](directory)
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        names = [e.name for e in entries]
    return sorted(n.removesuffix(".json") for n in names if n.endswith(".json") and capture_files.is_plain_name(n))


