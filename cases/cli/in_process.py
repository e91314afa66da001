"""``--in-process``: the kernel in the command's own process (for a debugger), the command watched by a parent.

A kernel run in the process that judges it can end that process: ``os._exit`` and ``posix._exit`` raise
while it runs (kernels.backends.guarded.GuardedBackend), but a name it saved before, a signal or a
crash ends the process with whatever status it chose, 0 included, and no summary. Nothing inside the
process can guard against that, so ``pfa-verify ... --in-process`` runs as two processes:

- the parent (:func:`watch`) runs the same command line again as its child, stdin, stdout and stderr
  inherited (a ``breakpoint()`` in the kernel still talks to the terminal), and waits;
- the child (:func:`open_channel`, :func:`say_finished`) runs the command and writes one byte on a pipe
  to the parent (its descriptor in ``PFA_VERIFY_IN_PROCESS_FD``) once the command has printed what it
  had to say;
- a child that exits without that byte makes the parent print one line (the run ended before its
  summary) and exit non-zero: with the child's status, or 1 where the child exited 0.

Signals: the terminal sends Ctrl-C to both processes, ``timeout`` and a hang-up often send theirs to
the whole group, ``kill PID`` to the parent alone. The child's Python writes each signal it receives
on the same pipe, the moment it arrives (``signal.set_wakeup_fd``); the parent forwards a signal it
received to the child only when the child has not said within :data:`GRACE_S` that it got it too.
The child's own handlers (cases/cli/interrupt.py) then stop the command, and the parent returns the
child's status (128 + the signal's number for a child a signal killed); a signal the child's handlers
never saw (it ended first) is one line, and a status of 0 becomes the signal's (128 + its number), as
it would have been in one process.

What this cannot guard: a kernel that writes the byte itself, or corrupts the process's memory or its
files; that is what the supervised default is for.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType

from pfa_verify.cases.cli.interrupt import catch_interrupting_signals, restore_signals
from pfa_verify.cases.reporting.signals import signal_name

__all__ = ["CHANNEL_ENV", "GRACE_S", "ENDED_EARLY", "open_channel", "say_finished", "watch"]

#: The child's end of the pipe to its parent, as a descriptor number.
CHANNEL_ENV = "PFA_VERIFY_IN_PROCESS_FD"
#: Seconds the parent waits for the child to say it got a signal before it forwards the signal.
GRACE_S = 1.0
#: The byte that says "the command finished": never a signal's number (those are 1-64).
_FINISHED = 0xFF
#: The parent's line for a child that exited 0 without having finished.
ENDED_EARLY = ("pfa-verify: error: the run ended before its summary: the kernel ended the process, which "
               "--in-process cannot guard against (without --in-process the kernel runs in a supervised worker "
               "and such an end is an error verdict)")


def open_channel() -> int | None:
    """In the child: the pipe to the parent (None when this process is not one), taken out of the
    environment so that nothing the command starts inherits it, and made the signal wakeup descriptor
    (each signal's number is written on it as it arrives)."""
    text = os.environ.pop(CHANNEL_ENV, None)
    if not text:
        return None
    try:
        fd = int(text)
        os.set_inheritable(fd, False)
        os.set_blocking(fd, False)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return None
    return fd


def say_finished(fd: int | None) -> None:
    """In the child: tell the parent that the command has printed what it had to say."""
    if fd is None:
        return
    try:
        os.write(fd, bytes([_FINISHED]))
    except OSError:
        pass        # the parent is gone: nobody is left to tell


def _status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + the signal's number for one a signal ended."""
    return 128 - returncode if returncode < 0 else returncode


def _ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    return f"exited with status {returncode}"


class _Signals:
    """The signals the parent received, those it forwarded, and those the child said it received (its
    handlers write each on the pipe as it arrives): paired within GRACE_S."""

    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []
        self.forwarded: list[tuple[int, float]] = []
        self.acknowledged: list[tuple[int, float]] = []

    def note(self, signum: int, frame: FrameType | None) -> None:
        self.received.append((signum, time.monotonic()))

    def _echo(self, signum: int, since: float) -> bool:
        """Take the child's word that it got ``signum`` at or after ``since``, if it gave it."""
        echo = next((a for a in self.acknowledged if a[0] == signum and a[1] >= since), None)
        if echo is not None:
            self.acknowledged.remove(echo)
        return echo is not None

    def forward(self, child: subprocess.Popen) -> None:
        """Forward each signal received over GRACE_S ago that the child has not acknowledged."""
        now = time.monotonic()
        self.forwarded = [(signum, at) for signum, at in self.forwarded if not self._echo(signum, at)]
        pending = []
        for signum, at in self.received:
            if self._echo(signum, at - GRACE_S):
                continue
            if now - at < GRACE_S:
                pending.append((signum, at))
                continue
            try:
                os.kill(child.pid, signum)
                self.forwarded.append((signum, now))
            except ProcessLookupError:
                pending.append((signum, at))
        self.received = pending
        self.acknowledged = [a for a in self.acknowledged if now - a[1] < 2 * GRACE_S]

    def unhandled(self) -> int | None:
        """A signal this process received that the child's handlers never saw (it ended first, or the
        signal came once they were gone), or None."""
        left = self.received + self.forwarded
        return left[0][0] if left else None


def _read(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def watch(command: list[str]) -> int:
    """In the parent: run ``command`` (this command line again) as the child, forward the signals the
    child did not get, and return its status; a child that did not say it finished is one line on
    stderr and a non-zero status."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    signals = _Signals()
    previous = catch_interrupting_signals(signals.note)
    finished = False
    try:
        try:
            child = subprocess.Popen(command, pass_fds=(write_fd,), env=dict(os.environ, **{CHANNEL_ENV: str(write_fd)}))
        finally:
            os.close(write_fd)
        while True:
            ended = child.poll() is not None
            for byte in _read(read_fd):
                if byte == _FINISHED:
                    finished = True
                else:
                    signals.acknowledged.append((byte, time.monotonic()))
            signals.forward(child)
            if ended:
                break
            select.select([read_fd], [], [], 0.1)
    finally:
        restore_signals(previous)
        os.close(read_fd)
    status = _status(child.returncode)
    late = signals.unhandled()
    if late is not None and (finished or status == 0):     # the command ended before its handlers saw it
        print(f"pfa-verify: {signal_name(late)}: received as the command ended; it counts as an interruption",
              file=sys.stderr)
        return status or 128 + late
    if finished:
        return status
    if child.returncode == 0:
        print(ENDED_EARLY, file=sys.stderr)
        return 1
    print(f"pfa-verify: error: the run ended before its summary: its process {_ended(child.returncode)}",
          file=sys.stderr)
    return status
