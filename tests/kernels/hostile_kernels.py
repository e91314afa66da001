"""Kernels that try to end, hang, flood or fool the process that runs them (kernels/backends/supervisor.py's
tests load them by file path: ``tests/kernels/hostile_kernels.py:FACTORY``). Each is the golden but for the
one thing its docstring says, so that whatever passes is the supervisor's doing, not the kernel's."""
from __future__ import annotations

import os
import signal
import sys
import time

import torch

import properties.acceptance as acceptance
import properties.compare as compare
from kernels.backends.golden_backend import GoldenBackend


class _Hostile(GoldenBackend):
    def attack(self) -> None:
        raise NotImplementedError

    def paged_attention_fp8(self, *args, **kwargs):
        self.attack()
        return super().paged_attention_fp8(*args, **kwargs)


def _named(cls, name):
    backend = cls()
    backend.name = f"hostile-{name}"
    return backend


class _SystemExit0(_Hostile):
    def attack(self):
        raise SystemExit(0)


class _OsExit0(_Hostile):
    def attack(self):
        print("the kernel says goodbye", flush=True)
        os._exit(0)


class _Segfault(_Hostile):
    def attack(self):
        os.kill(os.getpid(), signal.SIGSEGV)


class _Sleeps(_Hostile):
    def attack(self):
        time.sleep(600)


class _Interrupts(_Hostile):
    def attack(self):
        raise KeyboardInterrupt


class _GarbageOnThePipe(_Hostile):
    """Writes junk on the pipe the sandbox replies on (its number is on the command line), then computes."""
    def attack(self):
        os.write(int(sys.argv[sys.argv.index("--replies") + 1]), b"not a frame of the protocol")


class _ClosesStdout(_Hostile):
    def attack(self):
        sys.stdout.close()
        os.close(1)


class _ForksAndExits(_Hostile):
    """Forks a child that sleeps, then ends its own process: the child must not outlive the run."""
    def attack(self):
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        os._exit(0)


class _LyingTensor(torch.Tensor):
    """A tensor subclass whose comparisons and copies say the golden's bits."""
    __hash__ = torch.Tensor.__hash__
    def __eq__(self, other):
        return torch.ones_like(torch.Tensor(self), dtype=torch.bool)


class _ReturnsALie(GoldenBackend):
    """Wrong output (every element + 1) in a subclass that says it equals anything."""
    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs)
        return (out.float() + 1).to(out.dtype).as_subclass(_LyingTensor)


class _PatchesTheJudge(GoldenBackend):
    """Wrong output, after patching the suite's comparison core and rule in its own process to say pass."""
    def paged_attention_fp8(self, *args, **kwargs):
        compare.compare = lambda *a, **k: (_ for _ in ()).throw(SystemExit(0))
        acceptance.hold = lambda *a, **k: None
        out = super().paged_attention_fp8(*args, **kwargs)
        return (out.float() + 1).to(out.dtype)


class _ReturnsNone(GoldenBackend):
    def paged_attention_fp8(self, *args, **kwargs):
        return None


def system_exit_0():
    return _named(_SystemExit0, "system-exit-0")


def os_exit_0():
    return _named(_OsExit0, "os-exit-0")


def segfault():
    return _named(_Segfault, "segfault")


def sleeps():
    return _named(_Sleeps, "sleeps")


def interrupts():
    return _named(_Interrupts, "interrupts")


def garbage_on_the_pipe():
    return _named(_GarbageOnThePipe, "garbage-on-the-pipe")


def closes_stdout():
    return _named(_ClosesStdout, "closes-stdout")


def forks_and_exits():
    return _named(_ForksAndExits, "forks-and-exits")


def returns_a_lie():
    return _named(_ReturnsALie, "returns-a-lie")


def patches_the_judge():
    return _named(_PatchesTheJudge, "patches-the-judge")


def returns_none():
    return _named(_ReturnsNone, "returns-none")


def exits_at_import_time():
    raise SystemExit(0)


def factory_raises():
    raise RuntimeError("no device here")


def no_name():
    backend = GoldenBackend()
    backend.name = None
    return backend


def string_codec():
    backend = GoldenBackend()
    backend.codec = "str"
    return backend


def bad_shapes():
    backend = GoldenBackend()
    backend.supported_shapes = {"head_dim": 128}
    return backend
