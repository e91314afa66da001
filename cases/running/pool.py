"""The one worker pool of the many-case commands: ``pfa-verify run``, ``mutants`` (every level), ``search``.

:meth:`Pool.map` takes a module-level function and payloads (one task each) and gives one
:class:`TaskResult` per payload, in payload order, whatever ran where. Executors:

- ``here``: this process, one task after another (one worker, no cluster);
- ``local``: ``workers`` spawned processes (ProcessPoolExecutor), one OpenMP thread each (the sim's
  calculator runs thousands of tiny libtorch ops between which extra threads only spin:
  kernels/backends/sim_cost.py); ``fresh``: a new process per task (max_tasks_per_child=1, sim mutants);
- ``ray``: Ray tasks (``--cluster ray=HOST:PORT`` joins a cluster; ``--cluster ray`` starts a local Ray
  for the command). Each task asks for what its backend needs (:func:`task_resources`: one ``"NPU"``
  for the npu backends, Ray then sets ASCEND_RT_VISIBLE_DEVICES for it; one CPU otherwise). Ray is
  the optional extra ``pip install 'pfa-verify[ray]'``, imported only here and only for a cluster.

Tasks go out in payload order (the caller's schedule), at most as many at once as there are workers
(Ray: as the cluster has of the scarcest resource a task needs), so ``on_start`` means started.

Faults, with no result lost and none counted twice: a task whose worker dies (killed, out of memory,
a crash, a lost node) runs once more in a new process; if that dies too, its result is an ``error``
naming the cause. An exception of the task itself is not retried: it comes back as ``error``. A worker
that a task left unusable (pypto after a failure inside its trace, W7) is replaced before the next
task. Tasks write nothing the driver owns: captures and shrinking happen on the driver. Entering a
cluster pool connects first: unreachable, or without a resource the tasks need, is a
:class:`ClusterError` (one line, exit 2) before any task.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess
from types import ModuleType
from typing import Any

# The worker side (what runs in a worker process) is cases/running/pool_worker.py; its public names are
# re-exported here, where run, mutants and search import them.
from pfa_verify.cases.running.pool_worker import (
    WorkerSpoiled,
    call_in_worker,
    local_init,
    ray_call,
    retire_if_spoiled,
    worker_backend,
    worker_setup,
    worker_slot,
)
from pfa_verify.kernels.backends import runs_on_npu

__all__ = ["ClusterError", "TaskResult", "Pool", "parse_cluster", "task_resources", "worker_slot",
           "worker_setup", "worker_backend", "RETRIES"]

#: A task whose worker died is run this many more times before it is reported as an error.
RETRIES = 1

# Variables that change what a task computes: a local Ray's workers inherit them, a cluster's get them
# through the job's runtime environment.
_PASSED_ENV = ("PFA_VERIFY_MAX_BYTES", "PFA_VERIFY_MAX_LEN")


class ClusterError(ValueError):
    """The cluster cannot take the tasks: unreachable, the extra not installed, or a resource missing."""


def parse_cluster(text: str) -> str:
    """``text`` when it is ``ray`` (a local Ray for the command) or ``ray=HOST:PORT``; else ValueError."""
    kind, eq, address = text.partition("=")
    if kind != "ray" or (eq and not address):
        raise ValueError(f"--cluster {text!r} must be 'ray' (a local Ray for this command) or 'ray=HOST:PORT' "
                         "(the head of a running cluster; 'ray start --head' prints it)")
    return text


@dataclasses.dataclass
class TaskResult:
    """One task's outcome: its ``value``, or ``error`` (the task raised, or its worker died twice);
    ``node`` that ran it (host name, and Ray's node address), ``pid``, ``attempts`` (2 after a retry)
    and ``retry_cause`` (why the first attempt gave nothing)."""
    index: int
    value: object = None
    error: str | None = None
    node: str | None = None
    pid: int | None = None
    attempts: int = 1
    retry_cause: str | None = None


def task_resources(backend) -> dict:
    """What one task of ``backend`` asks a cluster for: ``{"NPU": 1}`` for the npu backends (ours,
    pypto-gym-npu and anything built on kernels.backends.npu.NpuBackend), else ``{"CPU": 1}``."""
    return {"NPU": 1} if runs_on_npu(backend) else {"CPU": 1}


# --- the pool -----------------------------------------------------------------------------------

class Pool:
    """Run tasks here, in ``workers`` local processes, or on ``cluster``; see the module docstring.

    Use as a context manager: entering connects to the cluster (or starts a local Ray) and checks that
    it has ``resources`` (per task, e.g. ``{"NPU": 1}``); leaving disconnects (and stops a local Ray).
    ``spawn``: worker processes even for one worker."""

    def __init__(self, *, workers: int = 1, cluster: str | None = None, resources: dict | None = None,
                 fresh: bool = False, spawn: bool = False) -> None:
        self.workers = max(1, int(workers or 1))
        self.cluster = cluster
        self.resources = dict(resources or {"CPU": 1})
        self.fresh = fresh
        self.executor = "ray" if cluster else ("local" if self.workers > 1 or fresh or spawn else "here")
        self.cluster_resources: dict | None = None
        self.nodes: list = []
        self._ray: ModuleType | None = None      # the ray module, once connected

    # -- connecting --
    def __enter__(self) -> Pool:
        if self.executor == "ray":
            self._connect()
        return self

    def __exit__(self, *exc) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def _connect(self) -> None:
        where = f"--cluster {self.cluster}"
        try:
            import ray
        except ImportError:
            raise ClusterError(f"{where}: Ray is not installed here (pip install 'pfa-verify[ray]')") from None
        assert self.cluster is not None        # the "ray" executor is the one of a cluster
        address = self.cluster.partition("=")[2] or None
        if address and address != "auto":
            _reachable(address, where)
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        options: dict[str, Any] = dict(log_to_driver=False, include_dashboard=False, configure_logging=False)
        if address:
            options.update(address=address, runtime_env={"env_vars": env} if env else None)
        else:   # a local Ray on loopback for this command: no token (it would replace ~/.ray/auth_token)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # address 'local': a new Ray even where /tmp/ray names another cluster (a stale file left by
            # a stopped head made ray.init() join that address and refuse num_cpus)
            options.update(address="local", num_cpus=self.workers if self.workers > 1 else None)
        try:
            ray.init(**options)
        except Exception as exc:  # noqa: BLE001 - any failure to connect is the one line
            raise ClusterError(f"{where}: cannot connect: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
        self._ray = ray
        have = ray.cluster_resources()
        self.cluster_resources = {k: v for k, v in have.items() if not k.startswith("node:")}
        self.nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive"))
        missing = {k: v for k, v in self.resources.items() if have.get(k, 0) < v}
        if missing:
            self.__exit__()
            shown = ", ".join(f"{k} {v:g}" for k, v in sorted(self.cluster_resources.items())
                              if k in ("CPU", "NPU", "GPU", "memory") or k in self.resources)
            raise ClusterError(f"{where}: the cluster has no {', '.join(missing)} resource, which every task of this "
                               f"command needs ({', '.join(f'{k} {v:g}' for k, v in self.resources.items())} each); "
                               f"it has {shown or 'nothing'}")

    def describe(self) -> dict:
        """What executed the tasks, for reports: executor, workers, cluster address, its resources and nodes."""
        return {"executor": self.executor, "workers": self._slots() if self.executor == "ray" else self.workers,
                "cluster": self.cluster, "task_resources": dict(self.resources),
                "resources": self.cluster_resources, "nodes": list(self.nodes) or [socket.gethostname()]}

    def _slots(self) -> int:
        """Tasks a cluster runs at once: what it has of the scarcest resource a task needs."""
        have = self.cluster_resources or {}
        return max(1, int(min(have.get(k, 0) // v for k, v in self.resources.items() if v > 0)))

    # -- running --
    def map(self, fn: Callable, payloads: list, *, on_start: Callable | None = None,
            on_done: Callable | None = None, here: Callable | None = None) -> list:
        """``fn(payload)`` for each payload (``fn`` a module-level function); TaskResults in payload
        order. ``on_start(k)`` when task k is handed to a worker, ``on_done(k, result)`` as it comes back.
        ``here`` replaces ``fn`` in this process (the ``here`` executor: it may use the caller's objects);
        if a task leaves this process unusable (W7), the rest go to a new worker process, with ``fn``."""
        start = on_start or (lambda k: None)
        done = on_done or (lambda k, r: None)
        if not payloads:
            return []
        if self.executor == "ray":
            return self._ray_tasks(fn, payloads, start, done)
        if self.executor == "local":
            return self._local_tasks(fn, payloads, start, done)
        results = []
        for k, payload in enumerate(payloads):
            start(k)
            try:
                results.append(TaskResult(k, (here or fn)(payload), node=socket.gethostname(), pid=os.getpid()))
            except Exception as exc:  # noqa: BLE001 - a task that raised is reported, never retried
                results.append(TaskResult(k, error=_raised(exc), node=socket.gethostname(), pid=os.getpid()))
            done(k, results[-1])
            if retire_if_spoiled() and k + 1 < len(payloads):
                rest = Pool(workers=1, spawn=True)._local_tasks(
                    fn, payloads[k + 1:], lambda j, at=k + 1: start(at + j), lambda j, r, at=k + 1: done(at + j, _shifted(r, at)))
                return results + [_shifted(r, k + 1) for r in rest]
        return results

    def _local_tasks(self, fn, payloads, start, done) -> list:
        """Spawned processes, at most ``workers`` tasks at a time. A pool whose worker died, or whose
        worker is unusable (W7), takes no more tasks: once its running tasks are back it is replaced. A
        death fails every task then running in that pool (ProcessPoolExecutor ends them all); each runs
        again, alone when several died, so only a task that kills its worker dies twice. One function on
        purpose: the submit loop and the death handling share the retry state (attempts, causes, alone,
        died, retired), which split parts would have to pass back and forth."""

        ctx = multiprocessing.get_context("spawn")
        results: dict = {}
        attempts = [0] * len(payloads)
        causes: dict = {}
        alone: set = set()      # died beside others: the retry runs alone, so only the culprit dies again
        queue = list(range(len(payloads)))
        while queue:
            slots = ctx.Queue()
            for s in range(self.workers):
                slots.put(s)
            died: list[int] = []
            retired = False
            processes: dict[int, BaseProcess] = {}
            with ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=local_init, initargs=(slots,),
                                     max_tasks_per_child=1 if self.fresh else None) as pool:
                running: dict = {}
                while queue or running:
                    while queue and len(running) < self.workers and not (died or retired):
                        if running and (queue[0] in alone or alone & set(running.values())):
                            break
                        k = queue.pop(0)
                        running[pool.submit(call_in_worker, fn, payloads[k])] = k
                        attempts[k] += 1
                        processes.update(getattr(pool, "_processes", None) or {})   # for the exit codes
                        start(k)
                    if not running:
                        break
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        k = running.pop(fut)
                        try:
                            value, node, pid, retire = fut.result()
                            results[k] = TaskResult(k, value, node=node, pid=pid, attempts=attempts[k])
                            retired = retired or bool(retire)
                        except BrokenProcessPool:
                            died.append(k)
                            continue
                        except Exception as exc:  # noqa: BLE001 - the task raised: reported, not retried
                            results[k] = TaskResult(k, error=_raised(exc), node=socket.gethostname(),
                                                    attempts=attempts[k])
                        results[k].retry_cause = causes.get(k)
                        done(k, results[k])
            cause = _death(processes)
            for k in died:
                if attempts[k] <= RETRIES:
                    causes[k] = cause
                    alone.update([k] if len(died) > 1 else [])
                    continue
                results[k] = TaskResult(k, error=f"the worker process died running this task, {attempts[k]} times "
                                        f"(first: {causes.get(k)}; last: {cause})", node=socket.gethostname(),
                                        attempts=attempts[k], retry_cause=causes.get(k))
                done(k, results[k])
            queue = sorted([k for k in died if k not in results] + queue)
        return [results[k] for k in range(len(payloads))]

    def _ray_tasks(self, fn, payloads, start, done) -> list:
        ray = self._ray
        assert ray is not None                 # a cluster pool connects as it is entered (__enter__)
        custom = {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU")}
        remote = ray.remote(num_cpus=self.resources.get("CPU", 0), resources=custom or None, max_retries=0,
                            max_calls=1 if self.fresh else 0)(ray_call)
        results: dict = {}
        attempts = [0] * len(payloads)
        causes: dict = {}
        queue = list(range(len(payloads)))
        running: dict = {}
        slots = self._slots()
        while queue or running:
            while queue and len(running) < slots:
                k = queue.pop(0)
                attempts[k] += 1
                running[remote.remote(fn, payloads[k])] = k
                start(k)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                k = running.pop(ref)
                try:
                    value, node, pid, _ = ray.get(ref)      # an unusable worker retires itself (ray_call)
                    results[k] = TaskResult(k, value, node=node, pid=pid, attempts=attempts[k])
                except ray.exceptions.RayTaskError as exc:   # the task raised: reported, not retried
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, WorkerSpoiled):          # refused by a worker on its way out: again
                        attempts[k] -= 1
                        queue.insert(0, k)
                        continue
                    results[k] = TaskResult(k, error=_raised(cause) if isinstance(cause, BaseException)
                                            else str(exc).splitlines()[0], attempts=attempts[k])
                except ray.exceptions.RayError as exc:       # the worker or its node died
                    why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
                    if attempts[k] <= RETRIES:
                        causes[k] = why
                        queue.insert(0, k)
                        continue
                    results[k] = TaskResult(k, error=f"the worker running this task died, {attempts[k]} times (first: "
                                            f"{causes.get(k)}; last: {why})", attempts=attempts[k])
                results[k].retry_cause = causes.get(k)
                done(k, results[k])
        return [results[k] for k in range(len(payloads))]


def _shifted(result: TaskResult, by: int) -> TaskResult:
    return dataclasses.replace(result, index=result.index + by)


def _raised(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _death(processes: dict) -> str:
    """Why a local pool broke, from its processes' exit codes (those it terminated itself left out).

    A worker killed by a signal is the cause; a sibling that exits with a status after the pool broke
    (its result pipe closed under it) is a consequence, named only when no worker was killed."""
    codes = {p.exitcode for p in processes.values() if getattr(p, "exitcode", None) not in (None, 0, -signal.SIGTERM)}
    codes = {c for c in codes if c < 0} or codes
    return ("a worker process ended: " + ", ".join(sorted(f"killed by {signal.Signals(-c).name}" if c < 0 else
                                                          f"exit status {c}" for c in codes))) if codes else \
        "a worker process terminated abruptly (BrokenProcessPool)"


def _reachable(address: str, where: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address nothing listens on (Ray itself retries a dead address for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{where}: the cluster cannot be reached at {address} ({getattr(exc, 'strerror', None) or exc}); "
                           "'ray start --head --port PORT' starts one, and prints its address") from None
