"""A kernel's worker process: started, talked to, killed, and its log.

A worker (kernels/backends/sandbox.py, started here with ``-m``) loads the backend a
:class:`BackendSpec` names and runs one call at a time; the calls' inputs and results cross as data
(kernels/backends/wire.py and protocol.py, never pickle). A user's kernel file is read and hashed by
the driver (:func:`driver_kernel_source`) and its bytes are what the worker executes. A worker's
output (what the kernel prints) goes to a log file, whose tail the fault messages quote; the logs of a
driver killed with SIGKILL are removed by the next one (:func:`remove_orphaned_logs`). Which worker
gets which call, and what a lost call becomes, is the supervisor's (kernels/backends/supervisor.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pfa_verify import IMPORT_ROOT
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import KernelSource, protocol, runs_on_npu, user_kernel_file, wire
from pfa_verify.kernels.backends.reaping import Tree
from pfa_verify.kernels.backends.text import printable

__all__ = ["BackendSpec", "Job", "Worker", "LOAD_TIMEOUT_S", "LOG_DIR_PREFIX", "driver_kernel_source", "load_job",
           "remove_orphaned_logs"]

#: Seconds a worker may take to load its backend (import, factory) before it is killed.
LOAD_TIMEOUT_S = 600.0
#: The workers' log folder of a driver: ``<tmp>/pfa-verify-workers-<driver pid>-<random>``.
LOG_DIR_PREFIX = "pfa-verify-workers-"


def remove_orphaned_logs(root: str | None = None) -> list[Path]:
    """Remove the workers' log folders of drivers that are gone, and return them.

    :meth:`Supervisor.close` removes its own folder; a driver killed with SIGKILL cannot, and its workers
    die by ``PR_SET_PDEATHSIG`` (SIGKILL too), so the next driver sweeps: a folder whose name carries a
    pid that no longer runs and that belongs to this user. A live pid (the driver itself, or a reused pid)
    keeps its folder: a leftover kept is harmless, a live run's logs removed are not."""
    removed: list[Path] = []
    base = Path(root or tempfile.gettempdir())
    try:
        entries = list(base.glob(f"{LOG_DIR_PREFIX}*"))
    except OSError:
        return removed
    for folder in entries:
        pid_text = folder.name[len(LOG_DIR_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue    # an older driver's folder (no pid in its name): its owner cannot be told
        try:
            mine = not folder.is_symlink() and folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and not _running(int(pid_text)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


#: The tail of a worker's log quoted in a fault's message.
_LOG_TAIL = 1500


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """How a worker builds the backend: kernels.get_backend(``name``, device=``device``, **``options``),
    with ``threads`` torch threads unless the backend declares its own."""

    name: str
    device: int | str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    threads: int | None = 1
    max_seconds: float | None = None     # kernels.backends.limit_time: the sim's cost limit (None: its own)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise UsageError(f"backend name={self.name!r} must be a non-empty string")


@dataclasses.dataclass
class Job:
    """A request waiting for, or at, a worker: ``tensors`` are a call's inputs (the driver's own copies,
    written into the worker's input memory when it is handed over, and compared with it after the reply)."""
    key: object
    header: dict[str, Any]
    tensors: Mapping[str, torch.Tensor]
    timeout: float | None
    max_reply_bytes: int
    attempts: int = 0
    retry_cause: str | None = None
    sent_at: float = 0.0
    buffers: tuple[bytes, ...] = ()       # a load request's pinned kernel file


def load_job(spec: BackendSpec, slot: int, pinned: tuple[Path, bytes] | None) -> Job:
    """The load request of worker ``slot`` (an npu backend's worker k takes NPU ``device + k``), with the
    bytes of the user's kernel file the driver hashed, which the worker executes instead of the file."""
    device = (int(spec.device or 0) + slot) if runs_on_npu(spec.name) else spec.device
    header = {"type": "load", "backend": spec.name, "device": device, "options": dict(spec.options),
              "threads": spec.threads, "max_seconds": spec.max_seconds,
              "pinned": None if pinned is None else str(pinned[0])}
    return Job("load", header, {}, LOAD_TIMEOUT_S, 2**24, buffers=() if pinned is None else (pinned[1],))


def driver_kernel_source(name: str) -> tuple[bool, KernelSource | None, tuple[Path, bytes] | None]:
    """``(named by the user, its KernelSource, (path, bytes) to pin)`` of backend ``name``, read by this
    process: a report's sha256 of a user's kernel is the driver's, of the bytes its worker executes,
    never what the backend declares. The suite's own backends keep the source they declare."""
    user, file, function = user_kernel_file(name)
    if not user or file is None:
        return user, None, None
    try:
        data = file.read_bytes()
    except OSError:
        return True, None, None
    source = name.split(":", 1)[1].rsplit(":", 1)[0] if name.startswith("pypto-gym") else name.rpartition(":")[0]
    return True, KernelSource(source, str(file), hashlib.sha256(data).hexdigest(), function), (file, data)


class Worker:
    """One worker process and the thread that talks to it (writes a job's request, reads its reply)."""

    def __init__(self, spec: BackendSpec, slot: int, log_dir: Path, outbox: queue.Queue, tree: Tree,
                 pinned: tuple[Path, bytes] | None) -> None:
        self.slot = slot
        self.outbox = outbox
        self.tree = tree
        self.log = log_dir / f"worker-{slot}-{time.monotonic_ns()}.log"
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        self._inputs = protocol.open_input_memory()
        self._seq = 0
        root = str(IMPORT_ROOT)
        env = dict(os.environ, PFA_VERIFY_WORKER_SLOT=str(slot), **tree.environment(),
                   PYTHONPATH=os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        try:
            with open(self.log, "wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "pfa_verify.kernels.backends.sandbox", "--requests", str(req_r), "--replies",
                     str(rep_w), "--inputs", str(self._inputs), "--parent", str(os.getpid())],
                    pass_fds=(req_r, rep_w, self._inputs), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, env=env)
        finally:
            os.close(req_r)
            os.close(rep_w)
        tree.started(self.process.pid)
        self.job: Job | None = None
        self.deadline: float | None = None
        self.ended_seen: float | None = None      # when the process was first seen ended while busy
        self.capabilities: dict[str, Any] | None = None
        self.spoiled = False
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._talk, name=f"pfa-verify worker {slot}", daemon=True)
        self._thread.start()
        self.send(load_job(spec, slot, pinned))

    def send(self, job: Job) -> None:
        self._seq += 1
        job.header = {**job.header, "seq": self._seq}
        self.job = job
        job.sent_at = time.monotonic()
        self.deadline = None if job.timeout is None else job.sent_at + job.timeout
        self._inbox.put(job)

    def _talk(self) -> None:
        """The thread: one job at a time (its inputs into the input memory, the request, the reply checked,
        the inputs read back); it alone closes the pipes and the memory, when it ends (a pipe closed under a
        blocked read would let its number be reused by another worker's pipe)."""
        try:
            while True:
                job = self._inbox.get()
                if job is None:
                    return
                try:
                    self.outbox.put((self, job, self._exchange(job)))
                except (OSError, wire.WireError) as exc:
                    self.outbox.put((self, job, exc))
                    return
        finally:
            for fd in (self._req_w, self._rep_r, self._inputs):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _exchange(self, job: Job) -> tuple[protocol.Reply, dict[str, torch.Tensor]]:
        """One request and its checked reply, with the inputs the call changed as read back here."""
        request = job.header["type"]
        slots: list[protocol.Slot] = []
        if request == "call":
            slots, size = protocol.layout(job.tensors)
            protocol.write_inputs(self._inputs, job.tensors, slots, size)
            job.header = {**job.header, "inputs": [s.to_dict() for s in slots], "inputs_bytes": size}
        try:
            wire.write_message(self._req_w, job.header, job.buffers)
            header, buffers = wire.read_message(self._rep_r, max_bytes=job.max_reply_bytes)
            reply = protocol.parse_reply(header, buffers, request=request, seq=job.header["seq"])
            changed = protocol.changed_inputs(self._inputs, job.tensors, slots) if slots else {}
        finally:
            if slots:
                protocol.release_inputs(self._inputs)
        return reply, changed

    def how_it_ended(self, wait_s: float = 5.0) -> str:
        """How the process ended, in words (it is killed if it has not within ``wait_s``)."""
        try:
            code = self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.wait()
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def log_tail(self) -> str:
        try:
            text = printable(self.log.read_bytes()[-_LOG_TAIL:].decode("utf-8", "replace").strip())
        except OSError:
            return ""
        return f"; its last output: {text}" if text else ""

    def kill(self) -> None:
        """SIGKILL the worker, its process group and every process it started, in its session or not
        (kernels/backends/reaping.py; its leader may have ended already: what it forked may not have);
        its thread then ends and closes the pipes."""
        self.tree.kill(self.process.pid)
        self._inbox.put(None)
