"""Ctrl-C and SIGTERM on the command line: a run stops and says what it checked; a second one ends at once.

:class:`Interruption` is installed around a command. The first SIGINT or SIGTERM is remembered (its
name is what :meth:`Interruption.stop` returns from then on) and announced on stderr in one line. A
``cooperative`` command (``pfa-verify run``) asks ``stop()`` between steps and winds down itself: its
workers end, the cases checked so far are summarized and written, the failures found so far captured.
Any other command gets a KeyboardInterrupt at once. The second signal kills every kernel worker of
the process (kernels.backends.supervisor.kill_all) and exits at once with 130 (SIGINT) or 143
(SIGTERM), the statuses of :data:`cases.reporting.report.EXIT_INTERRUPTED`.

The signal's name stays set whatever happens to the KeyboardInterrupt (Python drops an exception raised
inside a garbage-collection callback, "Exception ignored in ..."): the command line exits with the
interrupted status whenever :attr:`Interruption.signal` is set, so an interrupt never ends in OK.
"""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from cases.reporting.report import EXIT_INTERRUPTED
from kernels.backends.supervisor import kill_all

__all__ = ["Interruption"]


class Interruption:
    """See the module docstring. Use as a context manager around the command (main thread only)."""

    def __init__(self, *, cooperative: bool) -> None:
        self.cooperative = cooperative
        self.signal: str | None = None
        self._previous: dict = {}

    def stop(self) -> str | None:
        """The name of the signal that interrupted the command (SIGINT, SIGTERM), or None."""
        return self.signal

    @property
    def exit_status(self) -> int:
        return EXIT_INTERRUPTED.get(self.signal or "", 130)

    def __enter__(self) -> Interruption:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:                       # the second one: end now
            kill_all()
            os.write(2, f"\npfa-verify: {name} again: ending at once\n".encode())
            os._exit(EXIT_INTERRUPTED.get(self.signal, 130))
        self.signal = name
        what = ("stopping: the cases checked so far are summarized and written" if self.cooperative
                else "stopping")
        os.write(2, f"\npfa-verify: {name}: {what} ({name} again ends at once)\n".encode())
        if not self.cooperative:
            raise KeyboardInterrupt
