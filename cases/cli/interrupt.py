"""Ctrl-C, SIGTERM, SIGHUP, SIGUSR1 and the like on the command line: a run stops and says what it
checked; a second Ctrl-C or SIGTERM ends at once.

:class:`Interruption` is installed around a command, for every signal of
:data:`cases.reporting.signals.INTERRUPTING_SIGNALS` (each one whose default would end the process:
SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, the real-time ones...; SIGINT and SIGTERM
always, the others unless something in the process already handles them). The first signal is
remembered (its name is what :meth:`Interruption.stop` returns from then on) and announced on stderr
in one line. A ``cooperative`` command (``pfa-verify run``) asks ``stop()`` between steps and winds down itself: its
workers end, the cases checked so far are summarized and written, the failures found so far captured.
Any other command gets a KeyboardInterrupt at once. A second SIGINT, SIGTERM or SIGQUIT (a person
insisting) kills every kernel worker of the process (kernels.backends.supervisor.kill_all) and exits
at once with 128 + the first signal's
number (130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1: :data:`cases.reporting.signals.EXIT_INTERRUPTED`).
A signal a kernel sends to the process that judges it (its worker's parent) is one of these: the run
ends with its summary and reports, never silently.

The signal's name stays set whatever happens to the KeyboardInterrupt (Python drops an exception raised
inside a garbage-collection callback, "Exception ignored in ..."): the command line exits with the
interrupted status whenever :attr:`Interruption.signal` is set, so an interrupt never ends in OK.
"""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from pfa_verify.cases.reporting.signals import EXIT_INTERRUPTED, INTERRUPTING_SIGNALS, signal_name
from pfa_verify.kernels.backends.supervisor import kill_all

__all__ = ["Interruption", "catch_interrupting_signals", "restore_signals"]

#: The signals whose second coming ends the command at once: what a person sends to insist (Ctrl-C,
#: ``kill``, Ctrl-\\). Another signal once the command is stopping changes nothing.
_INSIST = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


def catch_interrupting_signals(handler) -> dict:
    """Make ``handler`` the handler of every signal of INTERRUPTING_SIGNALS (SIGINT and SIGTERM always, each
    other one unless something in the process already handles it); the handlers it replaced, for
    :func:`restore_signals`. Main thread only."""
    previous = {}
    for signum in INTERRUPTING_SIGNALS:
        if signum in (signal.SIGINT, signal.SIGTERM) or signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    return previous


def restore_signals(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


class Interruption:
    """See the module docstring. Use as a context manager around the command (main thread only)."""

    def __init__(self, *, cooperative: bool) -> None:
        self.cooperative = cooperative
        self.signal: str | None = None
        self._previous: dict = {}

    def stop(self) -> str | None:
        """The name of the signal that interrupted the command (SIGINT, SIGTERM, SIGHUP...), or None."""
        return self.signal

    @property
    def exit_status(self) -> int:
        return EXIT_INTERRUPTED.get(self.signal or "", 130)

    def __enter__(self) -> Interruption:
        if threading.current_thread() is threading.main_thread():
            self._previous = catch_interrupting_signals(self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        restore_signals(self._previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        if self.signal is not None and signum not in _INSIST:
            return                                        # already stopping (a kernel may signal on every call)
        if self.signal is not None:                       # a person insists: end now
            kill_all()
            os.write(2, f"\npfa-verify: {name} again: ending at once\n".encode())
            os._exit(EXIT_INTERRUPTED.get(self.signal, 130))
        self.signal = name
        what = ("stopping: the cases checked so far are summarized and written" if self.cooperative
                else "stopping")
        again = f"{name} again" if signum in _INSIST else "SIGINT or SIGTERM"
        os.write(2, f"\npfa-verify: {name}: {what} ({again} ends at once)\n".encode())
        if not self.cooperative:
            raise KeyboardInterrupt
