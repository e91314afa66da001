"""The kernel under a supervisor: every kernel call in a worker process this process owns.

The kernel under test is untrusted code: it may exit, hang, crash, or lie. So it never runs in the
process that decides a verdict. A :class:`Supervisor` starts ``workers`` processes
(kernels/backends/sandbox.py), each of which loads the backend by name and runs one call at a time;
the calls' inputs and results cross as data (kernels/backends/wire.py, never pickle). What the
supervisor's process learns from a call is the output's bits, the inputs the call changed, and what
it raised; the rule that judges them runs here.

A call that does not come back is a :class:`KernelFault` (a kernels.KernelRunError) naming what
happened, and the next call gets a fresh process:

- the worker ended during the call, with any exit status (``sys.exit(0)`` and ``os._exit(0)``
  included) or by a signal: the call runs once more in a new process (a worker the machine killed,
  the out-of-memory killer say, is not the kernel's fault), and a second end is the fault;
- the call outlived its time limit (``timeout``): the worker's process group is killed;
- the worker sent something that is not a reply of the protocol.

A kernel that raises is a :class:`KernelRaised` (SystemExit and KeyboardInterrupt included), or the
kernels.KernelRunError / kernels.BackendUnavailable it raised. A worker that says its process is
spoiled (pypto after a failure inside its trace, W7) is replaced before the next call.

Workers end with their supervisor: :meth:`Supervisor.close` kills them, and each asked Linux to kill
it when this process ends (``PR_SET_PDEATHSIG``), so a killed run leaves no worker behind. A worker's
output (what the kernel prints) goes to a log file, whose tail the fault messages quote.

:class:`SupervisedBackend` is a backend (kernels.KernelBackend) whose calls go through a supervisor:
the laws, the shrinker, replays and diagnosis use it as they would the backend itself. ``run`` talks to
the :class:`Supervisor` directly, to keep several workers busy while it judges (cases/running/run.py).
"""
from __future__ import annotations

import atexit
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
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from pfa_verify import IMPORT_ROOT
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import (
    BackendUnavailable,
    KernelRunError,
    KernelSource,
    Skip,
    protocol,
    runs_on_npu,
    unsupported_shape,
    user_kernel_file,
    wire,
)
from pfa_verify.kernels.backends.contract import Capabilities, CostEstimate
from pfa_verify.kernels.backends.reaping import Tree, adopt_orphans
from pfa_verify.kernels.backends.text import printable

__all__ = ["BackendSpec", "KernelFault", "KernelRaised", "Reply", "Supervisor", "SupervisedBackend",
           "GuardedBackend", "RETRIES", "LOAD_TIMEOUT_S", "LOG_DIR_PREFIX", "describe_failure", "kill_all",
           "remove_orphaned_logs"]

#: A call whose worker ended runs this many more times (in new processes) before it is a fault.
RETRIES = 1
#: Seconds a worker may take to load its backend (import, factory) before it is killed.
LOAD_TIMEOUT_S = 600.0
#: Seconds between looks at the workers' processes (one that ended while a child it forked keeps its pipe).
_POLL_S = 0.5
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reply:
    """What one call gave: ``output`` (None when it failed), the inputs it ``changed`` (their new bits),
    or ``failure``; ``seconds`` from hand-over to reply, ``attempts`` (2 after its worker ended once,
    ``retry_cause`` says how) and the ``pid`` that answered."""

    output: torch.Tensor | None
    changed: Mapping[str, torch.Tensor]
    failure: BaseException | None
    seconds: float
    attempts: int = 1
    retry_cause: str | None = None
    pid: int | None = None
    answers: list[Any] | None = None    # a skip_reason or estimate query's answers

    def result(self) -> torch.Tensor:
        """The output, or the failure raised."""
        if self.failure is not None:
            raise self.failure
        assert self.output is not None
        return self.output


@dataclasses.dataclass
class _Job:
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


def _load_job(spec: BackendSpec, slot: int, pinned: tuple[Path, bytes] | None) -> _Job:
    """The load request of worker ``slot`` (an npu backend's worker k takes NPU ``device + k``), with the
    bytes of the user's kernel file the driver hashed, which the worker executes instead of the file."""
    device = (int(spec.device or 0) + slot) if runs_on_npu(spec.name) else spec.device
    header = {"type": "load", "backend": spec.name, "device": device, "options": dict(spec.options),
              "threads": spec.threads, "max_seconds": spec.max_seconds,
              "pinned": None if pinned is None else str(pinned[0])}
    return _Job("load", header, {}, LOAD_TIMEOUT_S, 2**24, buffers=() if pinned is None else (pinned[1],))


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


class _Worker:
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
        self.job: _Job | None = None
        self.deadline: float | None = None
        self.ended_seen: float | None = None      # when the process was first seen ended while busy
        self.capabilities: dict[str, Any] | None = None
        self.spoiled = False
        self._inbox: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._talk, name=f"pfa-verify worker {slot}", daemon=True)
        self._thread.start()
        self.send(_load_job(spec, slot, pinned))

    def send(self, job: _Job) -> None:
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

    def _exchange(self, job: _Job) -> tuple[protocol.Reply, dict[str, torch.Tensor]]:
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


#: Every supervisor of this process that is not closed (:func:`kill_all`).
_LIVE: weakref.WeakSet = weakref.WeakSet()


def kill_all() -> None:
    """SIGKILL the workers of every supervisor of this process, at once (safe in a signal handler: no
    waiting, no locks): what a second Ctrl-C does before the process exits."""
    for supervisor in list(_LIVE):
        for w in supervisor._slots:
            if w is not None:
                try:
                    os.killpg(w.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _close_all() -> None:
    for supervisor in list(_LIVE):
        supervisor.close()


atexit.register(_close_all)      # a normal exit closes what was left open (PR_SET_PDEATHSIG covers the rest)


class Supervisor:
    """``workers`` processes running ``spec``'s backend; see the module docstring.

    :meth:`start` loads the backend and returns its :class:`Capabilities` (BackendUnavailable or
    UsageError, one line, when it cannot start). :meth:`submit` hands a call to the next free worker
    (or queues it), :meth:`wait` returns the replies that came back; :meth:`call` does both for one
    call. ``case_timeout``: the default time limit of a call (None: none). Use as a context manager, or
    call :meth:`close`."""

    def __init__(self, spec: BackendSpec, *, workers: int = 1, case_timeout: float | None = None) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise UsageError(f"workers={workers!r} must be an int >= 1")
        self.spec = spec
        self.workers = workers
        self.case_timeout = case_timeout
        self.capabilities: Capabilities | None = None
        remove_orphaned_logs()
        self._log_dir = Path(tempfile.mkdtemp(prefix=f"{LOG_DIR_PREFIX}{os.getpid()}-"))
        self._outbox: queue.Queue = queue.Queue()
        self._slots: list[_Worker | None] = [None] * workers
        self._queue: list[_Job] = []
        self._done: list[tuple[object, Reply]] = []
        self._closed = False
        self.started = 0          # processes started, replacements included
        self.generation = 0       # bumped by reload(): backends made before it are stale
        self.refused: dict[int, str] = {}    # slot -> why its worker could not load the backend
        self._tree = Tree()
        self._recorded_at = 0.0
        self._user_named, self._kernel_source, self._pinned = driver_kernel_source(spec.name)
        adopt_orphans()          # what a kernel starts and abandons comes back to this process, to be ended
        _LIVE.add(self)

    # -- life ------------------------------------------------------------------------------------
    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Kill every worker (and their process groups); remove the logs."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        for w in self._slots:
            if w is not None:
                w.kill()
        for w in self._slots:
            if w is not None:
                try:
                    w.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._tree.sweep()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def start(self) -> Capabilities:
        """Start the workers; wait for the first to load its backend; return its Capabilities."""
        for k in range(self.workers):
            self._spawn(k)
        while self.capabilities is None:
            self._pump(timeout=None)
        return self.capabilities

    def reload(self, spec: BackendSpec) -> Capabilities:
        """Load ``spec``'s backend in the live workers instead (their imports stay warm: a matrix's rows
        reuse them); a worker that cannot is replaced. The supervisor must have no call pending;
        SupervisedBackends made before are stale from now on."""
        if self.pending:
            raise RuntimeError("reload() needs a supervisor with no call pending")
        self.spec, self.capabilities = spec, None
        self._user_named, self._kernel_source, self._pinned = driver_kernel_source(spec.name)
        self.generation += 1
        self.refused = {}
        for slot, w in enumerate(self._slots):
            if w is None or w.process.poll() is not None or w.job is not None:
                if w is not None:
                    w.kill()
                self._spawn(slot)
                continue
            w.capabilities = None
            w.send(_load_job(spec, slot, self._pinned))
        while self.capabilities is None:
            self._pump(timeout=None)
        return self.capabilities

    def _spawn(self, slot: int) -> _Worker:
        if self._closed:
            raise RuntimeError("the supervisor is closed")
        worker = _Worker(self.spec, slot, self._log_dir, self._outbox, self._tree, self._pinned)
        self._slots[slot] = worker
        self.started += 1
        return worker

    # -- calls -----------------------------------------------------------------------------------
    def submit(self, key: object, op: str, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any], *,
               timeout: float | None = None) -> None:
        """Hand ``op(**tensors, **scalars)`` to a worker; its :class:`Reply` comes back from :meth:`wait`
        under ``key``. ``timeout``: this call's limit (default: ``case_timeout``)."""
        protocol.layout(tensors)              # a dtype that does not cross is refused here, not in the thread
        inputs = sum(t.numel() * t.element_size() for t in tensors.values())
        header = {"type": "call", "op": op, "scalars": dict(scalars)}
        # A reply holds the output, no larger than the inputs: anything larger is refused unread.
        limit = inputs + 64 * 2**20
        self._queue.append(_Job(key, header, dict(tensors), self.case_timeout if timeout is None else timeout, limit))
        self._dispatch()

    @property
    def pending(self) -> int:
        """Calls handed over or queued whose replies have not been returned by :meth:`wait`."""
        busy = sum(1 for w in self._slots if w is not None and w.job is not None and w.job.key != "load")
        return busy + len(self._queue) + len(self._done)

    def idle(self) -> int:
        """Workers that would take a call now (or as soon as they have loaded)."""
        return sum(1 for slot, w in enumerate(self._slots) if slot not in self.refused and (
            w is None or w.job is None or w.job.key == "load")) - len(self._queue)

    def wait(self, timeout: float | None = None) -> list[tuple[object, Reply]]:
        """The replies that came back (at least one, unless ``timeout`` seconds passed or nothing is pending)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._done and self.pending:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            self._pump(left)
        done, self._done = self._done, []
        return done

    def call(self, op: str, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, Any], *,
             timeout: float | None = None) -> Reply:
        """One call, waited for (the supervisor must have no other call pending)."""
        if self.pending:
            raise RuntimeError("call() needs a supervisor with no other call pending")
        key = object()
        self.submit(key, op, tensors, scalars, timeout=timeout)
        while True:
            for k, reply in self.wait():
                if k is key:
                    return reply

    def query(self, kind: str, configs: list[dict[str, Any]]) -> list[Any]:
        """The backend's ``skip_reason`` or ``estimate`` answers for ``configs`` (dicts of
        golden.PagedAttentionConfig), from a worker (the backend's own code runs there too)."""
        if kind not in ("skip_reason", "estimate"):
            raise ValueError(f"kind={kind!r} must be 'skip_reason' or 'estimate'")
        if not configs:
            return []
        key = object()
        self._queue.append(_Job(key, {"type": kind, "configs": configs}, {}, LOAD_TIMEOUT_S, 2**24))
        self._dispatch()
        others: list[tuple[object, Reply]] = []
        try:
            while True:
                for k, reply in self.wait():
                    if k is not key:
                        others.append((k, reply))     # not ours: kept for the caller's next wait()
                        continue
                    if reply.failure is not None:
                        raise reply.failure
                    try:
                        return protocol.check_answers(kind, reply.answers or [], len(configs))
                    except protocol.ProtocolError as exc:
                        raise KernelFault(f"the backend's {kind}: {exc}", kind="protocol") from None
        finally:
            self._done[:0] = others

    # -- the machinery ---------------------------------------------------------------------------
    def _dispatch(self) -> None:
        for slot, held in enumerate(self._slots):
            if not self._queue:
                return
            if slot in self.refused:
                continue                          # this slot's worker could not load the backend: not again
            w = held
            if w is None or (w.process.poll() is not None and w.job is None):
                w = self._spawn(slot)
            if w.job is None and w.capabilities is not None:
                w.send(self._queue.pop(0))
        if self._queue and len(self.refused) == self.workers:
            self._fail_queue(f"no worker process could load the backend ({'; '.join(sorted(set(self.refused.values())))})")

    def _pump(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` (and at most until the next deadline) for one message; handle it."""
        now = time.monotonic()
        deadlines = [w.deadline for w in self._slots if w is not None and w.deadline is not None]
        wait_for = min([d - now for d in deadlines] + ([timeout] if timeout is not None else []) + [_POLL_S])
        try:
            worker, job, got = self._outbox.get(timeout=max(0.0, wait_for))
        except queue.Empty:
            self._expire()
            self._reap()
            return
        finally:
            self._record()
        if worker is not self._slots[worker.slot] or job is not worker.job:
            return                               # a killed worker's last words
        worker.job, worker.deadline = None, None
        seconds = time.monotonic() - job.sent_at
        if isinstance(got, BaseException):       # the pipe closed: the process ended (or wrote garbage)
            ended = isinstance(got, wire.PeerClosed) or isinstance(got, OSError)
            worker.kill()
            how = worker.how_it_ended()
            what = (f"the kernel's worker process {how} during the call" if ended else
                    f"the kernel's worker process (worker {worker.slot}, pid {worker.process.pid}) sent a malformed "
                    f"reply ({printable(got)}); it was killed")
            self._lost(worker, job, what + worker.log_tail(), kind="ended" if ended else "protocol", seconds=seconds)
        else:
            self._answered(worker, job, *got, seconds=seconds)
        self._dispatch()

    def _record(self) -> None:
        """Note who the busy workers started (reaping.Tree.record), at most every _POLL_S: should such a
        process lose its parent and its mark, it is still known when its worker is killed."""
        now = time.monotonic()
        if now - self._recorded_at >= _POLL_S and any(w is not None and w.job is not None for w in self._slots):
            self._recorded_at = now
            self._tree.record()

    def _expire(self) -> None:
        now = time.monotonic()
        for w in self._slots:
            if w is not None and w.deadline is not None and w.deadline <= now and w.job is not None:
                job = w.job
                w.job, w.deadline = None, None
                w.kill()
                w.how_it_ended()
                if job.key == "load":
                    self._load_failed(w, f"its worker did not load it within {job.timeout:g} s{w.log_tail()}")
                    continue
                self._finish(job, Reply(output=None, changed={}, failure=KernelFault(
                    f"the kernel did not return within {job.timeout:g} s (the time limit of a case: "
                    f"--case-timeout); its worker process was killed{w.log_tail()}", kind="timeout"),
                    seconds=now - job.sent_at, attempts=job.attempts + 1, retry_cause=job.retry_cause))
        self._dispatch()

    def _reap(self) -> None:
        """A busy worker whose process ended without its pipe closing (a child it forked holds the pipe):
        seen ended on two polls in a row (a reply may still be on its way after one), its group is killed
        and the call is lost as if the pipe had closed."""
        now = time.monotonic()
        for w in self._slots:
            if w is None or w.job is None or w.process.poll() is None:
                continue
            if w.ended_seen is None:
                w.ended_seen = now
                continue
            if now - w.ended_seen < _POLL_S:
                continue
            job = w.job
            w.job, w.deadline = None, None
            w.kill()
            what = f"the kernel's worker process {w.how_it_ended()} during the call (a process it started kept its pipe)"
            if job.key == "load":
                self._load_failed(w, what + w.log_tail())
            else:
                self._lost(w, job, what + w.log_tail(), kind="ended", seconds=now - job.sent_at)
        self._dispatch()

    def _lost(self, worker: _Worker, job: _Job, what: str, *, kind: str, seconds: float) -> None:
        if job.key == "load":
            self._load_failed(worker, what.replace("during the call", "while loading the backend"))
            return
        job.attempts += 1
        if kind == "ended" and job.attempts <= RETRIES and job.header.get("type") == "call":
            job.retry_cause = what
            self._queue.insert(0, job)           # once more, in a new process
            return
        if job.attempts > 1 and kind == "ended":
            what = (f"{what}; so did the {job.attempts - 1} new process(es) it ran again in (a worker that ends is "
                    f"tried once more: {job.attempts} runs in all)")
        self._finish(job, Reply(output=None, changed={}, failure=KernelFault(what, kind=kind), seconds=seconds,
                                attempts=job.attempts, retry_cause=job.retry_cause))

    def _answered(self, worker: _Worker, job: _Job, reply: protocol.Reply, changed: dict[str, torch.Tensor], *,
                  seconds: float) -> None:
        """A checked reply (kernels/backends/protocol.py) and the inputs the driver found changed."""
        fields = reply.fields
        if job.key == "load":
            if reply.type == "ready":
                try:
                    caps = Capabilities.from_dict(fields["capabilities"])
                except UsageError as exc:
                    if self.capabilities is None:
                        self.close()
                        raise
                    self._load_failed(worker, str(exc))
                    return
                if self._user_named:      # the driver's reading of the user's file, never the backend's claim
                    source = None if self._kernel_source is None else self._kernel_source.to_dict()
                    caps = dataclasses.replace(caps, kernel_source=source)
                worker.capabilities = caps.to_dict()
                if self.capabilities is None:
                    self.capabilities = caps
                return
            message = fields["message"]
            if fields["kind"] == "usage" and self.capabilities is None:
                self.close()
                raise UsageError(message)
            if fields["kind"] not in ("unavailable", "usage"):
                message = (f"loading it raised {fields.get('type_name')}: {message}" if fields["kind"] != "exit"
                           else f"loading it called sys.exit: {message}")
            worker.kill()
            worker.how_it_ended()
            self._load_failed(worker, message, unavailable=fields["kind"] == "unavailable")
            return
        job.attempts += 1
        if fields.get("spoiled"):
            worker.kill()
            worker.how_it_ended()
            self._slots[worker.slot] = None
        if reply.type == "answers":
            self._finish(job, Reply(output=None, changed={}, failure=None, seconds=seconds,
                                    answers=list(fields["answers"])))
            return
        if reply.type == "raised":
            self._finish(job, Reply(output=None, changed={}, failure=_raised(fields), seconds=seconds,
                                    attempts=job.attempts, retry_cause=job.retry_cause, pid=worker.process.pid))
            return
        self._finish(job, Reply(output=reply.output, changed=changed, failure=None, seconds=seconds,
                                attempts=job.attempts, retry_cause=job.retry_cause, pid=worker.process.pid))

    def _load_failed(self, worker: _Worker, what: str, *, unavailable: bool = False) -> None:
        """A worker that could not load the backend: its slot takes no more calls (the others go on, and
        the report says so: ``refused``). When no worker loaded it, the backend cannot start
        (BackendUnavailable, one line)."""
        self._slots[worker.slot] = None
        self.refused[worker.slot] = what
        if len(self.refused) == self.workers and self.capabilities is None:
            self.close()
            raise BackendUnavailable(what if unavailable else f"backend {self.spec.name!r} cannot start: {what}")
        self._dispatch()

    def _fail_queue(self, what: str) -> None:
        waiting, self._queue = self._queue, []
        for job in waiting:
            self._finish(job, Reply(output=None, changed={}, failure=KernelFault(what, kind="ended"), seconds=0.0,
                                    attempts=job.attempts, retry_cause=job.retry_cause))

    def _finish(self, job: _Job, reply: Reply) -> None:
        self._done.append((job.key, reply))


def _raised(fields: Mapping[str, Any]) -> BaseException:
    """The exception a ``raised`` reply stands for: a KernelRunError (the kernel did not deliver), or
    the KernelRaised of whatever it raised. kernels.BackendUnavailable from a call is raised too, never
    a skip: only a backend that cannot start is unavailable (item 1 of the contract's docstring)."""
    message = str(fields.get("message", ""))
    if fields.get("kind") == "kernel_run":
        return KernelRunError(message)
    return KernelRaised(message, type_name=str(fields.get("type_name") or "Exception"),
                        traceback_text=str(fields.get("traceback", "")))


class SupervisedBackend:
    """A backend whose kernels run under ``supervisor`` (kernels.KernelBackend; its attributes are the
    supervisor's :class:`Capabilities`). A call that changed its inputs writes their new bits into the
    tensors it was given, as the kernel in this process would have: the acceptance rule sees it."""

    def __init__(self, supervisor: Supervisor, *, timeout_of: Callable[[Mapping[str, torch.Tensor]], float | None] | None = None) -> None:
        caps = supervisor.capabilities or supervisor.start()
        self.supervisor = supervisor
        self._generation = supervisor.generation
        self.capabilities = caps
        self.name = caps.name
        self.codec = caps.codec_object
        self.model = caps.model
        self.supported_shapes = caps.supported_shapes
        self.spec_codec_not_applicable = caps.spec_codec_not_applicable
        self.out_of_bounds_reads = caps.out_of_bounds_reads
        self.threads = caps.threads
        self.kernel_errors_spoil_process = caps.kernel_errors_spoil_process
        self.shrink_calls = caps.shrink_calls
        self.default_budget_s = caps.default_budget_s
        self.fallback = caps.fallback
        self.selection = caps.selection
        self.kernel_source = caps.kernel_source
        self._skips: dict[str, Skip | None] = {}
        self._estimates: dict[str, CostEstimate | None] = {}
        self._timeout_of = timeout_of
        self.calls = 0

    def notes(self) -> list[str]:
        return list(self.capabilities.notes)

    def close(self) -> None:
        self.supervisor.close()

    def __repr__(self) -> str:
        return f"<SupervisedBackend name={self.name!r} codec={self.capabilities.codec!r}>"

    def _run(self, op: str, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> torch.Tensor:
        present = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        scalars = {**scalars, **{k: v for k, v in tensors.items() if v is not None and not isinstance(v, torch.Tensor)}}
        if self.supervisor.generation != self._generation:
            raise RuntimeError(f"the supervisor of {self.name!r} has loaded another backend since (reload)")
        timeout = self._timeout_of(present) if self._timeout_of is not None else None
        self.calls += 1
        reply = self.supervisor.call(op, present, scalars, timeout=timeout)
        for k, new in reply.changed.items():
            target = present[k]
            if target.shape == new.shape and target.dtype == new.dtype:
                target.copy_(new)
        return reply.result()

    def paged_attention_fp8(self, q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor,
                            k_scale: torch.Tensor, v_cache: torch.Tensor, v_scale: torch.Tensor,
                            block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
                            softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
                            codec: object = None) -> torch.Tensor:
        tensors = dict(q=q, q_scale=q_scale, k_cache=k_cache, k_scale=k_scale, v_cache=v_cache, v_scale=v_scale,
                       block_table=block_table, kv_act_seqs=kv_act_seqs)
        scalars: dict[str, Any] = {"softmax_scale": softmax_scale, "s2_tile": s2_tile, "g_tile": g_tile}
        if codec is not None:
            scalars["codec"] = codec if isinstance(codec, str) else getattr(codec, "name", codec)
        return self._run("paged_attention_fp8", tensors, scalars)

    def qk_matmul_scale(self, q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                        q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                        codec: object = None) -> torch.Tensor:
        tensors: dict[str, Any] = dict(q=q, k=k, q_scale=q_scale, k_scale=k_scale)
        scalars: dict[str, Any] = {"scale": scale}
        if codec is not None:
            scalars["codec"] = codec if isinstance(codec, str) else getattr(codec, "name", codec)
        return self._run("qk_matmul_scale", tensors, scalars)

    @staticmethod
    def _key(config: Any) -> str:
        return repr(sorted(config.to_dict().items()))

    def prefetch(self, configs: list[Any]) -> None:
        """Ask a worker once for the skip_reason and estimate of every config not asked yet (the run asks
        before its first case, while every worker is free). A query that fails is asked again per config
        (:meth:`skip_reason` then says why, for that case alone)."""
        for kind, cache, wanted in (("skip_reason", self._skips, self.capabilities.has_skip_reason),
                                    ("estimate", self._estimates, self.capabilities.has_estimate)):
            todo = {self._key(c): c for c in configs if self._key(c) not in cache} if wanted else {}
            if not todo:
                continue
            try:
                answers = self.supervisor.query(kind, [c.to_dict() for c in todo.values()])
            except (KernelRunError, KernelRaised):
                continue
            for key, answer in zip(todo, answers, strict=True):
                cache[key] = _answer(kind, answer)       # type: ignore[assignment]

    def skip_reason(self, config: Any) -> Skip | None:
        """The backend's own skip_reason (asked of a worker once per config), or its shape limits. A
        skip_reason that raises or answers outside the protocol raises (KernelRaised, KernelFault): the
        case is an error, never a skip."""
        if not self.capabilities.has_skip_reason:
            return unsupported_shape(config, self.supported_shapes)
        key = self._key(config)
        if key not in self._skips:
            (answer,) = self.supervisor.query("skip_reason", [config.to_dict()])
            self._skips[key] = _answer("skip_reason", answer)     # type: ignore[assignment]
        return self._skips[key]

    def estimate(self, config: Any) -> CostEstimate | None:
        """The backend's own cost estimate of ``config`` (asked of a worker once per config), or None (none,
        or an estimate that failed: the case then runs without one)."""
        if not self.capabilities.has_estimate:
            return None
        key = self._key(config)
        if key not in self._estimates:
            try:
                (answer,) = self.supervisor.query("estimate", [config.to_dict()])
            except (KernelRunError, KernelRaised):
                answer = None
            self._estimates[key] = _answer("estimate", answer)    # type: ignore[assignment]
        return self._estimates[key]


def _answer(kind: str, answer: Mapping[str, Any] | None) -> Skip | CostEstimate | None:
    """A checked answer (protocol.check_answers) as the Skip or CostEstimate it stands for."""
    if answer is None:
        return None
    if kind == "skip_reason":
        return Skip(answer["kind"], answer["reason"])
    return CostEstimate(seconds=float(answer["seconds"]), text=answer["text"])


class GuardedBackend:
    """A backend run in this process (``--in-process``, for a debugger): its calls' SystemExit,
    KeyboardInterrupt and other exceptions, BackendUnavailable included, become :class:`KernelRaised`
    (a kernels.KernelRunError stays one), their text printable, and so does a call of ``os._exit`` or ``posix._exit`` (one
    function under two names: both raise while the kernel runs). A kernel that ends the process another
    way (a reference to ``_exit`` it took before the call, a signal, a crash) ends this one: only the
    supervisor guards against that (cases/cli/in_process.py makes such an end a failed command).

    Given the backend's ``capabilities`` (kernels.backends.contract.capabilities_of), its optional
    attributes are theirs, defaults included, as a :class:`SupervisedBackend`'s are: a backend that
    declares none of them runs here as it runs supervised."""

    #: The module os takes ``_exit`` from (``posix`` on Linux): a kernel may call it by that name.
    _os_module: Any = sys.modules[os.name]
    #: The attributes read from the capabilities, when given (those SupervisedBackend sets from them).
    _declared = ("model", "supported_shapes", "spec_codec_not_applicable", "out_of_bounds_reads", "threads",
                 "kernel_errors_spoil_process", "shrink_calls", "default_budget_s", "fallback", "selection",
                 "kernel_source")

    def __init__(self, backend: Any, capabilities: Capabilities | None = None) -> None:
        self.inner = backend
        self.capabilities = capabilities

    def __getattr__(self, name: str) -> Any:
        capabilities = self.__dict__.get("capabilities")
        if capabilities is not None:
            if name in self._declared:
                return getattr(capabilities, name)
            found = {"skip_reason": self._skip_reason, "estimate": self._estimate,
                     "notes": lambda: list(capabilities.notes)}.get(name)
            if found is not None:
                return found
        if "inner" not in self.__dict__:          # not built yet (a copy): no attribute, never a recursion
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def _skip_reason(self, config: Any) -> Skip | None:
        """As SupervisedBackend.skip_reason: the backend's own (its answer made a Skip), or its shape limits."""
        assert self.capabilities is not None
        if not self.capabilities.has_skip_reason:
            return unsupported_shape(config, self.capabilities.supported_shapes)
        answer = self._guarded(self.inner.skip_reason, config)
        return None if answer is None else Skip(str(getattr(answer, "kind", "")), str(getattr(answer, "reason", answer)))

    def _estimate(self, config: Any) -> CostEstimate | None:
        """As SupervisedBackend.estimate: the backend's own cost estimate, or None."""
        assert self.capabilities is not None
        if not self.capabilities.has_estimate:
            return None
        answer = self._guarded(self.inner.estimate, config)
        return None if answer is None else CostEstimate(seconds=float(answer.seconds), text=str(answer.describe()))

    def _guarded(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        posix = self._os_module
        real_exit = posix._exit

        def refused_exit(status: int) -> None:
            raise SystemExit(f"os._exit({status})")
        # _exit cannot be caught; while the kernel runs here its names raise instead.
        os._exit = posix._exit = refused_exit  # type: ignore[assignment]
        try:
            return method(*args, **kwargs)
        except KernelRunError as exc:
            raise KernelRunError(printable(exc)) from exc
        except BaseException as exc:     # BackendUnavailable too: from a call, the kernel's error, never a skip
            text = printable(str(exc).strip())
            if isinstance(exc, SystemExit):
                text = (f"the kernel called {printable(exc.code)}" if str(exc.code).startswith("os._exit(")
                        else f"the kernel called sys.exit({printable(repr(exc.code))})")
            raise KernelRaised(text, type_name=printable(type(exc).__name__, one_line=True)) from exc
        finally:
            os._exit = posix._exit = real_exit

    def paged_attention_fp8(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._guarded(self.inner.paged_attention_fp8, *args, **kwargs)

    def qk_matmul_scale(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._guarded(self.inner.qk_matmul_scale, *args, **kwargs)
