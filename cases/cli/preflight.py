"""What a ``pfa-verify`` command needs from outside itself, checked before its first case: the PFA_VERIFY_*
variables it reads, the files it will write (--json, --html, tightness --record) and the regressions
folder it reads and writes. A problem is a :class:`golden.errors.UsageError` of one line (the option or
variable, the value, what is wrong, the fix), so the command exits 2 before anything ran instead of
running for an hour, printing ``-> OK`` and then a traceback where its report should be written.

Every command handler of cases/cli/ calls :func:`check_command` first; the checks it makes are public
one by one (:func:`check_environment`, :func:`check_output_file`, :func:`check_regressions_folder`).
A check proves what it can without writing anything that stays: a probe file is created and removed
next to the target, an existing report is opened for append (never truncated).
"""
from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path

from pfa_verify.cases.data.regressions import REGRESSIONS_ENV, directory, refuse_shipped
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.inputs import memory_limit
from pfa_verify.kernels.pypto_workarounds import CACHE_ENV
from pfa_verify.properties.search.strategies import max_len

__all__ = ["check_command", "check_environment", "check_output_file", "check_regressions_folder",
           "PSEUDO_FILESYSTEMS", "MIN_FREE_BYTES"]

# The kernel's and devices' pseudo filesystems: a report or a case written there is lost or an error.
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")
# One captured case's tensors may take up to 16 MiB (cases/data/regressions.py keeps larger inputs as
# config + seed), and a report of run's largest selection (10,000 generated cases, at 36 kB per 22
# cases) about as much: a filesystem with less free is refused rather than filled mid-write.
MIN_FREE_BYTES = 16 * 2**20


def check_command(args: argparse.Namespace) -> None:
    """Everything the parsed command ``args`` needs from outside, checked before it runs anything: the
    environment, the files of its --json and --html, and the regressions folder of ``run``, ``laws`` and
    ``search`` (--regressions, written unless --no-capture) and of ``cases`` (--regressions, written by
    ``prune`` unless --dry-run; ``prune`` never acts on the shipped captures, even dry). A UsageError names
    the first problem."""
    check_environment()
    for option in ("json", "html"):
        check_output_file(f"--{option}", getattr(args, option, None))
    if hasattr(args, "no_capture"):
        check_regressions_folder(args.regressions, writes=not args.no_capture, instead="--no-capture")
    elif hasattr(args, "regressions"):
        prunes = getattr(args, "action", None) == "prune"
        check_regressions_folder(args.regressions, writes=prunes and not args.dry_run, instead="--dry-run",
                                 shipped=not prunes)


def check_environment() -> None:
    """Every PFA_VERIFY_* variable a command reads, parsed by its reader: ``PFA_VERIFY_MAX_BYTES``
    (golden.memory_limit), ``PFA_VERIFY_MAX_LEN`` (properties.search.strategies.max_len), and
    ``PFA_VERIFY_CACHE`` (kernels.pypto_workarounds.cache_root: a folder, or one that can be created).
    ``PFA_VERIFY_REGRESSIONS`` is the regressions folder's, checked by :func:`check_regressions_folder`
    for the commands that use it."""
    memory_limit()
    max_len()
    cache = os.environ.get(CACHE_ENV)         # as cache_root reads it: unset or empty is the default
    if cache:
        # An existing cache may be shared and read-only (built once); a missing one is created at first use.
        _check_folder(f"{CACHE_ENV}={cache}", Path(cache), writes=not Path(cache).is_dir(),
                      fix=f"set {CACHE_ENV} to a folder you can write, or unset it (default ~/.cache/pfa-verify)")


def check_output_file(option: str, path) -> None:
    """``path`` (given as ``option``; None: not asked for) can take a report: not under /proc, /sys or
    /dev, not a folder, its folder exists or can be created, it can be written (a probe file created and
    removed beside it; an existing report is opened for append, not truncated), and its filesystem has
    :data:`MIN_FREE_BYTES` free."""
    if path is None:
        return
    target = Path(path)
    shown = f"{option} {path}"
    fix = f"give {option} a file path in a folder you can write"
    _refuse_pseudo(shown, target, fix)
    kind = _kind(shown, target, fix)
    if kind == "folder":
        raise _refused(f"{shown}: is a folder, not a file; give a file path in it, such as "
                         f"{option} {target / ('report' + ('.html' if 'html' in option else '.json'))}")
    if kind == "other":
        raise _refused(f"{shown}: is not a regular file (a device, a pipe or a socket); {fix}")
    folder = _existing_folder(shown, target.parent, fix)
    if kind == "file":
        try:
            with open(target, "a"):
                pass
        except OSError as exc:
            raise _refused(f"{shown}: cannot be written ({exc.strerror}); {fix}") from None
    else:
        _probe(shown, folder, fix)
    _free_space(shown, folder, fix)


def check_regressions_folder(path=None, *, option: str = "--regressions", writes: bool = True,
                             instead: str = "--no-capture", shipped: bool | None = None) -> None:
    """The regressions folder a command uses: ``path`` given as ``option``, else ``$PFA_VERIFY_REGRESSIONS``,
    else ./pfa-verify-regressions (cases.data.regressions.directory). Not under /proc, /sys or /dev, a folder
    (readable) or not there yet; where the command ``writes`` (captures, prune), writable and with
    :data:`MIN_FREE_BYTES` free, and not the shipped captures' folder unless ``shipped`` (default: where it
    does not write). ``instead`` is the option that spares the writes, named in the fix."""
    folder = directory(path)
    env = os.environ.get(REGRESSIONS_ENV)
    if path is not None:
        shown, fix = f"{option} {path}", f"give {option} another folder"
    elif env:
        shown, fix = f"{REGRESSIONS_ENV}={env}", f"set {REGRESSIONS_ENV} to another folder, or give {option} DIR"
    else:
        shown, fix = f"the default regressions folder {folder}", f"give {option} DIR (or set {REGRESSIONS_ENV})"
    shipped_allowed = not writes if shipped is None else shipped
    if not shipped_allowed:
        refuse_shipped(folder, shown=shown)
    _check_folder(shown, folder, writes=writes, fix=fix, spare=instead)


def _check_folder(shown: str, folder: Path, *, writes: bool, fix: str, spare: str = "") -> None:
    """``folder`` is a real, readable folder or is not there yet (its nearest existing ancestor is a
    folder); where ``writes``, a file can be created in it (or in that ancestor) and it has room. ``spare``
    (an option that spares the writes) joins the fix of a write that cannot be made."""
    _refuse_pseudo(shown, folder, fix)
    kind = _kind(shown, folder, fix)
    if kind not in ("folder", None):
        raise _refused(f"{shown}: is a file, not a folder; {fix}")
    if kind == "folder":
        try:
            os.listdir(folder)
        except OSError as exc:
            raise _refused(f"{shown}: cannot be read ({exc.strerror}); {fix}") from None
    existing = folder if kind == "folder" else _existing_folder(shown, folder.parent, fix)
    if writes:
        _probe(shown, existing, f"{fix}, or {spare}" if spare else fix)
        _free_space(shown, existing, f"{fix}, or {spare}" if spare else fix)


def _refused(message: str) -> Exception:
    """The UsageError of ``message`` (imported here: the golden package brings torch, which
    ``pfa-verify --help`` does not need)."""
    return UsageError(message)


def _refuse_pseudo(shown: str, path: Path, fix: str) -> None:
    real = os.path.realpath(path)
    for root in PSEUDO_FILESYSTEMS:
        if real == root or real.startswith(root + os.sep):
            raise _refused(f"{shown}: {root} is a pseudo filesystem of the kernel, not a place for "
                             f"pfa-verify's files; {fix}")


def _kind(shown: str, path: Path, fix: str) -> str | None:
    """'folder', 'file' (a regular one), 'other', or None where nothing is there (yet)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _refused(f"{shown}: cannot be reached ({exc.strerror}); {fix}") from None
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def _existing_folder(shown: str, folder: Path, fix: str) -> Path:
    """The nearest existing folder at or above ``folder`` (where the missing ones would be created); a
    file on the way is refused."""
    for candidate in (folder.absolute(), *folder.absolute().parents):
        kind = _kind(shown, candidate, fix)
        if kind == "folder":
            return candidate
        if kind is not None:
            raise _refused(f"{shown}: {candidate} is a file, not a folder; {fix}")
    raise _refused(f"{shown}: no folder of it exists; {fix}")


def _probe(shown: str, folder: Path, fix: str) -> None:
    """A file can be created (and is removed) in ``folder``: what permissions, a read-only mount and a
    full inode table decide, whoever runs (root passes a chmod, not a read-only filesystem)."""
    try:
        handle, name = tempfile.mkstemp(prefix=".pfa-verify-probe-", dir=folder)
    except OSError as exc:
        raise _refused(f"{shown}: cannot write in {folder} ({exc.strerror}); {fix}") from None
    os.close(handle)
    try:
        os.unlink(name)
    except OSError as exc:                  # it can create files but not remove them: prune and captures would fail
        raise _refused(f"{shown}: cannot remove files in {folder} ({exc.strerror}); {fix}") from None


def _free_space(shown: str, folder: Path, fix: str) -> None:
    if not hasattr(os, "statvfs"):
        return
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if free < MIN_FREE_BYTES:
        raise _refused(f"{shown}: the filesystem of {folder} has {free:,} bytes free, under the "
                         f"{MIN_FREE_BYTES // 2**20} MiB a report or a captured case may need; free some space, or {fix}")
