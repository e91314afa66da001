"""Every process a kernel starts ends with its worker: the process tree of kernels/backends/supervisor.py.

A worker runs in a session of its own and the supervisor kills that session's process group, but a
kernel can start a process outside it (``setsid``, ``start_new_session=True``, a double fork), which
would outlive the run and could rewrite its report. Three things close that:

- The driver is a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``, :func:`adopt_orphans`): a
  process whose parent ends is re-parented to the driver, not to init, so it stays in the driver's
  tree, where the next sweep finds it.
- Every worker carries a mark in its environment (:data:`MARK_ENV`, one token per driver), which its
  children inherit, and the supervisor records the descendants of its workers while they run
  (:meth:`Tree.record`), so that a process that cleared its environment and lost its parent is still
  known by (pid, start time).
- :meth:`Tree.kill` SIGKILLs a worker's process group, its descendants, the recorded ones, and the
  driver's adopted children that carry the mark, and looks again until none is left (a process forked
  in between is found on the next look, its parent being dead). Adopted children are reaped.

Without ``/proc`` (not Linux) only the process group is killed: the module degrades to what
``os.killpg`` does, and says so in :data:`COMPLETE`.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MARK_ENV", "COMPLETE", "adopt_orphans", "Tree", "run_token"]

#: The environment variable that marks a worker's processes: ``<driver pid>.<random token>``.
MARK_ENV = "PFA_VERIFY_SANDBOX"
_PROC = Path("/proc")
#: Whether this platform lets the driver find every process a kernel starts (Linux's /proc).
COMPLETE = _PROC.is_dir() and hasattr(os, "getpgid")
_PR_SET_CHILD_SUBREAPER = 36
_SWEEPS = 20       # looks at the tree per kill: each look kills what it finds, so only a fork race needs more than two

_token: str | None = None


def run_token() -> str:
    """This driver's mark (:data:`MARK_ENV`): one per process, so every supervisor of a run shares it.
    A worker that is itself a driver (a pool process running a supervisor) marks its own workers with its own."""
    global _token
    if _token is None:
        _token = f"{os.getpid()}.{secrets.token_hex(8)}"
    return _token


def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux): orphans of its descendants are re-parented to it.
    Returns whether that took effect; harmless to repeat."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) of ``pid`` from /proc, or None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm, field 2, is in parentheses and may hold anything: the fields after its last ')' are plain
    rest = text[text.rfind(")") + 2:].split()
    try:
        return int(rest[1]), rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def _processes() -> dict[int, tuple[int, str, int]]:
    """{pid: (parent pid, state, start time)} of every process /proc shows."""
    found: dict[int, tuple[int, str, int]] = {}
    try:
        names = os.listdir(_PROC)
    except OSError:
        return found
    for name in names:
        if name.isdigit() and (info := _stat(int(name))) is not None:
            found[int(name)] = info
    return found


def _marked(pid: int, mark: bytes) -> bool:
    try:
        return mark in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _descendants(roots: Iterable[int], table: dict[int, tuple[int, str, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


#: The live worker processes of every supervisor of this process: subprocess.Popen waits for these, so
#: no sweep kills or reaps them behind their supervisor's back.
_WORKERS: set[int] = set()


def _wait_reaped(pids: Iterable[int]) -> None:
    """Collect the exit status of those ``pids`` that are this process's children (adopted orphans, never
    a registered worker), waiting briefly for a process just killed to become a zombie."""
    me = os.getpid()
    left = {p for p in pids if p not in _WORKERS}
    deadline = time.monotonic() + 1.0
    while left:
        for pid in list(left):
            info = _stat(pid)
            if info is None or info[0] != me:
                left.discard(pid)
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except (ChildProcessError, OSError):
                done = pid
            if done:
                left.discard(pid)
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _kill_tree(roots: set[int], *, spare: set[int]) -> set[int]:
    """Stop ``roots`` and every descendant (a stopped process cannot fork), looking again until a look
    finds none new, then SIGKILL them all: a fork between two looks is found by the next, its parent
    being alive and stopped. ``spare`` is never touched. Returns the processes killed."""
    stopped: set[int] = set()
    for _ in range(_SWEEPS):
        table = _processes()
        live = {p for p in roots | _descendants(roots | stopped, table) if p in table and table[p][1] not in ("Z", "X")}
        new = live - stopped - spare - {os.getpid()}
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
        if not new:
            break
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped


class Tree:
    """The processes of one supervisor's workers (the module docstring)."""

    def __init__(self) -> None:
        self.mark = f"{MARK_ENV}={run_token()}".encode()
        self.recorded: dict[int, dict[int, int]] = {}     # worker pid -> {descendant pid: its start time}

    @staticmethod
    def environment() -> dict[str, str]:
        """What a worker's environment adds: the mark."""
        return {MARK_ENV: run_token()}

    def started(self, worker: int) -> None:
        """A worker process started: its supervisor waits for it (never reaped or swept here)."""
        _WORKERS.add(worker)
        self.recorded.setdefault(worker, {})

    def record(self) -> None:
        """Remember the descendants of the live workers (one pass over /proc)."""
        if not COMPLETE or not self.recorded:
            return
        table = _processes()
        for worker, seen in self.recorded.items():
            for pid in _descendants([worker], table):
                seen.setdefault(pid, table[pid][2])

    def kill(self, worker: int) -> int:
        """SIGKILL ``worker``, its process group, its descendants and those recorded for it (stopped first,
        so that none forks away meanwhile); returns how many were killed besides the worker. The worker
        itself is its Popen's to wait for; the others are reaped here."""
        seen = self.recorded.pop(worker, {})
        if COMPLETE:
            table = _processes()
            roots = {worker} | {p for p, start in seen.items() if p in table and table[p][2] == start}
            # orphans the driver adopted that no other live worker's tree holds (the worker may have ended first)
            others = {p for w, held in self.recorded.items() for p in held} | _descendants(_WORKERS - {worker}, table)
            me = os.getpid()
            roots |= {p for p, (ppid, _, _) in table.items()
                      if ppid == me and p not in _WORKERS and p not in others and _marked(p, self.mark)}
            killed = _kill_tree(roots, spare=_WORKERS - {worker})
        else:
            killed = set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker, signal.SIGKILL)
        _WORKERS.discard(worker)
        _wait_reaped(killed - {worker})
        return len(killed - {worker})

    def sweep(self) -> int:
        """SIGKILL every process that carries this driver's mark and is not a live worker, with its
        descendants (orphans the driver adopted, whatever their session): what a closed supervisor leaves."""
        if not COMPLETE:
            return 0
        me = os.getpid()
        table = _processes()
        adopted = {p for p, (ppid, _, _) in table.items() if ppid == me and p not in _WORKERS and _marked(p, self.mark)}
        killed = _kill_tree(adopted, spare=set(_WORKERS)) if adopted else set()
        _wait_reaped(killed)
        return len(killed)
