"""The kernel under a supervisor: every kernel call in a worker process this process owns.

The kernel under test is untrusted code: it may exit, hang, crash, or lie. So it never runs in the
process that decides a verdict. A :class:`Supervisor` starts ``workers`` processes
(kernels/backends/worker_process.py), hands each call to a free one, and returns what came back as a
:class:`Reply`: the output's bits, the inputs the call changed, and what it raised; the rule that
judges them runs here. A call that does not come back is a KernelFault (kernels/backends/faults.py),
and the next call gets a fresh process:

- the worker ended during the call, with any exit status (``sys.exit(0)`` and ``os._exit(0)``
  included) or by a signal: the call runs once more in a new process (a worker the machine killed,
  the out-of-memory killer say, is not the kernel's fault), and a second end is the fault;
- the call outlived its time limit (``timeout``): the worker's process group is killed;
- the worker sent something that is not a reply of the protocol.

A worker that says its process is spoiled (pypto after a failure inside its trace, W7) is replaced
before the next call. Workers end with their supervisor: :meth:`Supervisor.close` kills them, and each
asked Linux to kill it when this process ends (``PR_SET_PDEATHSIG``), so a killed run leaves no worker
behind; :func:`kill_all` kills every supervisor's workers at once (a second Ctrl-C).

``run`` talks to the :class:`Supervisor` directly, to keep several workers busy while it judges
(cases/running/run.py); everything else goes through kernels/backends/supervised.py.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import BackendUnavailable, KernelRunError, protocol, wire
from pfa_verify.kernels.backends.contract import Capabilities
from pfa_verify.kernels.backends.faults import KernelFault, KernelRaised
from pfa_verify.kernels.backends.reaping import Tree, adopt_orphans
from pfa_verify.kernels.backends.text import printable
from pfa_verify.kernels.backends.worker_process import (
    LOAD_TIMEOUT_S,
    LOG_DIR_PREFIX,
    BackendSpec,
    Job,
    Worker,
    driver_kernel_source,
    load_job,
    remove_orphaned_logs,
)

__all__ = ["Reply", "Supervisor", "RETRIES", "kill_all"]

#: A call whose worker ended runs this many more times (in new processes) before it is a fault.
RETRIES = 1
#: Seconds between looks at the workers' processes (one that ended while a child it forked keeps its pipe).
_POLL_S = 0.5


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
        self._slots: list[Worker | None] = [None] * workers
        self._queue: list[Job] = []
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
            w.send(load_job(spec, slot, self._pinned))
        while self.capabilities is None:
            self._pump(timeout=None)
        return self.capabilities

    def _spawn(self, slot: int) -> Worker:
        if self._closed:
            raise RuntimeError("the supervisor is closed")
        worker = Worker(self.spec, slot, self._log_dir, self._outbox, self._tree, self._pinned)
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
        self._queue.append(Job(key, header, dict(tensors), self.case_timeout if timeout is None else timeout, limit))
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
        self._queue.append(Job(key, {"type": kind, "configs": configs}, {}, LOAD_TIMEOUT_S, 2**24))
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

    def _lost(self, worker: Worker, job: Job, what: str, *, kind: str, seconds: float) -> None:
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

    def _answered(self, worker: Worker, job: Job, reply: protocol.Reply, changed: dict[str, torch.Tensor], *,
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

    def _load_failed(self, worker: Worker, what: str, *, unavailable: bool = False) -> None:
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

    def _finish(self, job: Job, reply: Reply) -> None:
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
