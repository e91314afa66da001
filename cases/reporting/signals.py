"""The signals that interrupt a command, their names as reports give them, and the exit status each leaves.

cases/cli/interrupt.py catches them; cases/reporting/report.py records the name (``summary.interrupted``)
and the status (``summary.exit_status``).
"""
from __future__ import annotations

import signal

__all__ = ["signal_name", "INTERRUPTING_SIGNALS", "EXIT_INTERRUPTED"]


def signal_name(signum: int) -> str:
    """A signal's name as reports give it: ``SIGTERM``, ``SIGRTMIN+3`` for a real-time one."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


#: The signals that interrupt a command (cases/cli/interrupt.py): every one whose default action ends the
#: process and that is not a fault of the process itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS,
#: SIGTRAP keep their defaults: a handler that returns would re-run the faulting instruction), nor SIGPIPE
#: (Python ignores it: a closed pipe is an OSError) or SIGKILL and SIGSTOP (they cannot be caught).
INTERRUPTING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                        signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGXFSZ,
                        signal.SIGIO, signal.SIGPWR, signal.SIGSTKFLT,
                        *range(signal.SIGRTMIN, signal.SIGRTMAX + 1))

#: The exit status of an interrupted run, by the name of the signal that stopped it (128 + its number, as a
#: shell shows it): SIGHUP 129, SIGINT 130, SIGUSR1 138, SIGTERM 143.
EXIT_INTERRUPTED = {signal_name(n): 128 + n for n in INTERRUPTING_SIGNALS}
