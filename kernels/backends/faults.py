"""What a kernel call that failed is: the faults a supervisor reports and the exceptions a kernel raised.

A call that does not come back is a :class:`KernelFault` (a kernels.KernelRunError) naming what
happened (``kind``): the worker process ended during the call (with any exit status, ``sys.exit(0)``
and ``os._exit(0)`` included, or by a signal), the call outlived its time limit, or the worker sent
something that is not a reply of the protocol (kernels/backends/supervisor.py decides which).

A kernel that raises is a :class:`KernelRaised` (SystemExit and KeyboardInterrupt included), or the
kernels.KernelRunError / kernels.BackendUnavailable it raised; :func:`describe_failure` puts either
in words, with the kernel's own exception type.
"""
from __future__ import annotations

from pfa_verify.kernels.backends import KernelRunError

__all__ = ["KernelFault", "KernelRaised", "describe_failure"]


class KernelFault(KernelRunError):
    """A kernel call that did not come back: ``kind`` is ``ended`` (the worker process ended, with the
    status or signal in the message), ``timeout`` or ``protocol``."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class KernelRaised(RuntimeError):
    """The kernel raised an exception (``type_name``; SystemExit and KeyboardInterrupt included); its
    text is the exception's, ``traceback_text`` where it was raised."""

    def __init__(self, message: str, *, type_name: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.traceback_text = traceback_text


def describe_failure(exc: BaseException) -> str:
    """One failure of a kernel call in words: ``Type: text`` (the kernel's own exception type for a
    :class:`KernelRaised`)."""
    name = exc.type_name if isinstance(exc, KernelRaised) else type(exc).__name__
    text = str(exc).strip()
    return f"{name}: {text}" if text else name
