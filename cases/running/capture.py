"""The one capture path of the runners: a counted failure becomes a regression file (cases/data/regressions.py,
the one writer) and a :class:`cases.running.verdict.Capture` saying where it is.

``pfa-verify run`` captures a catalog failure as its verdict comes back, a generated one once per group
after shrinking (cases/running/shrink.py), and whatever an interruption leaves unshrunk; ``pfa-verify
search`` captures each law's first failure. All of them call :func:`capture_case`. A write that fails (a
full disk, a folder that cannot be written) does not end the run: the Capture says so in one line, and
the run's report lists it (``RunResult.write_failures``) and fails.
"""
from __future__ import annotations

from pfa_verify.cases.data import regressions
from pfa_verify.cases.running.verdict import Capture

__all__ = ["capture_case", "write_failure"]


def write_failure(capture: Capture) -> str | None:
    """The one-line reason a capture was not written because writing failed (None: it was written, or
    not asked for)."""
    return capture.line.removeprefix("Not captured: could not write it: ") \
        if capture.line.startswith("Not captured: could not write it: ") else None


def capture_case(law: str, backend_name: str, case, message: str, *, params: dict | None = None, enabled: bool,
                 directory, group: tuple[str, ...] = (), how: str = "", nondeterministic: str | None = None) -> Capture:
    """Capture ``case``'s failure of ``law`` on ``backend_name`` with ``message`` (its failure text), marked
    nondeterministic when ``nondeterministic`` says how its kernel answered the same inputs differently:
    the Capture of the file written, or of why nothing was."""
    try:
        command, line = regressions.capture(law, backend_name, case, dict(params or {}), message, enabled=enabled,
                                            directory=directory, nondeterministic=nondeterministic)
    except regressions.CaptureWriteError as exc:
        return Capture(replay=None, line=f"Not captured: could not write it: {exc}", group=group, how=how)
    written = command.rsplit(" ", 1)[-1] if command else None      # replay_command ends with the id it names
    return Capture(replay=command, line=line, group=group, how=how, regression=written)
