"""Backends whose kernel ends, or signals, the process that judges it (tests/cases/test_in_process_guard.py).

- ``saved_exit``: ``_exit(0)`` through a reference taken when the file was imported (no guard inside the
  process can take that name back);
- ``posix_exit``: ``posix._exit(0)`` by that name, while the kernel runs;
- ``sighup``, ``sigusr1``: the signal to the driver (the worker's parent; the process itself when it
  runs --in-process), then the golden's answer;
- ``sigusr1_to_parent``: SIGUSR1 to its process's parent whatever that is (under --in-process, the
  process that watches the command), then the golden's answer.
"""
import os
import posix
import signal

from pfa_verify import golden

_EXIT = posix._exit


class _Golden:
    codec = None

    def paged_attention_fp8(self, *args, **kwargs):
        return golden.paged_attention_fp8(*args, **kwargs)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


class SavedExit(_Golden):
    name = "ends-with-a-saved-exit"

    def paged_attention_fp8(self, *args, **kwargs):
        _EXIT(0)


class PosixExit(_Golden):
    name = "ends-with-posix-exit"

    def paged_attention_fp8(self, *args, **kwargs):
        posix._exit(0)


class SignalsTheDriver(_Golden):
    def __init__(self, signum, *, to_parent=False):
        self.signum, self.to_parent = signum, to_parent
        self.name = f"sends-{signal.Signals(signum).name}"

    def paged_attention_fp8(self, *args, **kwargs):
        with open("/proc/self/cmdline", "rb") as f:            # a worker runs kernels.backends.sandbox
            in_worker = b"pfa_verify.kernels.backends.sandbox" in f.read() or "PFA_VERIFY_WORKER_SLOT" in os.environ
        os.kill(os.getppid() if in_worker or self.to_parent else os.getpid(), self.signum)
        return super().paged_attention_fp8(*args, **kwargs)


def saved_exit():
    return SavedExit()


def posix_exit():
    return PosixExit()


def sighup():
    return SignalsTheDriver(signal.SIGHUP)


def sigusr1():
    return SignalsTheDriver(signal.SIGUSR1)


def sigusr1_to_parent():
    return SignalsTheDriver(signal.SIGUSR1, to_parent=True)
