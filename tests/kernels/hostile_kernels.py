"""Kernels that try to end, hang, flood or fool the process that runs them (kernels/backends/supervisor.py's
tests load them by file path: ``tests/kernels/hostile_kernels.py:FACTORY``). Each is the golden but for the
one thing its docstring says, so that whatever passes is the supervisor's doing, not the kernel's."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import ClassVar

import torch

import pfa_verify.properties.rule.acceptance as acceptance
import pfa_verify.properties.rule.compare as compare
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels.backends import protocol, wire
from pfa_verify.kernels.backends.golden_backend import GoldenBackend


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


class _HidesItsWrites(GoldenBackend):
    """Computes the right output, zeroes k_cache in place, and patches the worker's own code so that
    whatever it compares says nothing changed (what a worker-side check could be told)."""
    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs)
        protocol.changed_inputs = lambda *a, **k: {}      # the driver's check, as this process has it
        kwargs["k_cache"].zero_()
        return out


class _TruncatesItsInputs(GoldenBackend):
    """Computes the right output, then cuts the memory file that holds its inputs (its number is on the
    worker's command line): the driver must refuse, not die of SIGBUS."""
    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs).clone()
        os.ftruncate(int(sys.argv[sys.argv.index("--inputs") + 1]), 0)
        return out


def _request_seq() -> int:
    """The number of the request the worker is answering (a local of kernels.backends.sandbox.serve)."""
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "serve":
        frame = frame.f_back
    return frame.f_locals["header"]["seq"]


class _ForgesItsReply(GoldenBackend):
    """Writes a reply frame of its own on the worker's reply pipe (``frame`` picks which), then returns."""
    frame = "changed_nothing"

    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs)
        fd = int(sys.argv[sys.argv.index("--replies") + 1])
        seq = _request_seq()
        entries, buffers = wire.pack_tensors({"output": out})
        headers = {
            # a well-formed result, the right number and output, after zeroing an input it hides
            "changed_nothing": {"type": "result", "seq": seq, "tensors": entries, "seconds": 0.0},
            "claims_changed_none": {"type": "result", "seq": seq, "tensors": entries, "changed": []},
            "unknown_tensor": {"type": "result", "seq": seq, "tensors": [{**entries[0], "name": "zzz"}]},
            "null_tensors": {"type": "result", "seq": seq, "tensors": None},
            "wrong_seq": {"type": "result", "seq": seq + 7, "tensors": entries},
            "unknown_type": {"type": "zzz", "seq": seq},
        }
        if self.frame == "changed_nothing":
            kwargs["k_cache"].zero_()
        wire.write_message(fd, headers[self.frame], buffers if "tensors" in headers[self.frame]
                           and headers[self.frame]["tensors"] else [])
        if self.frame == "changed_nothing":
            os._exit(0)          # the forged frame is the only reply
        return out


class _StartsASession(GoldenBackend):
    """Starts a process in a session of its own (``setsid``) that sleeps, marked by ``MARKER`` in its
    command line, and one more that also clears its environment and loses its parent; returns the right output."""
    def paged_attention_fp8(self, *args, **kwargs):
        marker = os.environ.get("PFA_VERIFY_TEST_MARKER", "pfa-verify-test-orphan")
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=True)
        orphan = ("import subprocess, sys, os; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
                  "sys.argv[1]], start_new_session=True, env={}); os._exit(0)")
        subprocess.Popen([sys.executable, "-c", orphan, marker], env={})
        return super().paged_attention_fp8(*args, **kwargs)


class _ClaimsAnotherSource(GoldenBackend):
    """Declares a kernel_source of another file and a sha256 of its choosing."""
    kernel_source: ClassVar[dict] = {"source": "elsewhere.py", "path": "/elsewhere.py", "sha256": "0" * 64, "function": "make"}


class _UnavailableInACall(GoldenBackend):
    """Raises kernels.BackendUnavailable from a call on cases of two KV heads or more ("not built for
    them"), and is wrong (V scales of the neighbouring head) everywhere else: never a skip, never a pass."""
    shrink_calls = 2       # what its tests show needs no smallest example
    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        if k_cache.shape[2] >= 2:
            raise BackendUnavailable("this kernel is built for one KV head")
        return super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale * 1.5, block_table,
                                           kv_act_seqs, **kw)


class _PagedOnly(GoldenBackend):
    """The golden, declaring that it implements paged attention only (kernels.Capabilities.operators)."""
    operators = ("paged_attention_fp8",)


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


def hides_its_writes():
    return _named(_HidesItsWrites, "hides-its-writes")


def truncates_its_inputs():
    return _named(_TruncatesItsInputs, "truncates-its-inputs")


def forges_its_reply(frame: str = "changed_nothing"):
    backend = _named(_ForgesItsReply, "forges-its-reply")
    backend.frame = frame
    return backend


def starts_a_session():
    return _named(_StartsASession, "starts-a-session")


def claims_another_source():
    return _named(_ClaimsAnotherSource, "claims-another-source")


def unavailable_in_a_call():
    return _named(_UnavailableInACall, "unavailable-in-a-call")


def paged_only():
    return _named(_PagedOnly, "paged-only")


def deletes_the_captures():
    """A factory that empties the regressions folder ($PFA_VERIFY_REGRESSIONS) when the backend is made,
    before its first call: what the run read before it started must still be replayed, and the loss said."""
    folder = os.environ.get("PFA_VERIFY_REGRESSIONS")
    if folder and os.path.isdir(folder):
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
    return _named(GoldenBackend, "deletes-the-captures")
