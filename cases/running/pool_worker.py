"""The worker side of the pool (cases/running/pool.py): what runs inside a worker process, a local one or a
Ray task. :func:`worker_setup` once per process, :func:`worker_slot` its index, :func:`worker_backend`
its backend built once; ``_call`` / ``ray_call`` run a task and say whether the process must be
replaced before another (pypto after a failure inside its trace, W7). cases/running/pool.py, the driver side,
re-exports the public names.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from multiprocessing.util import Finalize

import torch

from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import runs_on_npu
from pfa_verify.kernels.backends.sandbox import die_with_parent
from pfa_verify.kernels.backends.supervised import SupervisedBackend
from pfa_verify.kernels.backends.supervisor import Supervisor
from pfa_verify.kernels.backends.worker_process import BackendSpec
from pfa_verify.kernels.pypto_workarounds import spoiled

__all__ = ["worker_setup", "worker_slot", "worker_backend"]

_SLOT: dict = {}


def worker_setup() -> None:
    """Once per worker process: one OpenMP thread (parallelism comes from processes)."""
    if not _SLOT.get("setup"):
        torch.set_num_threads(1)
        _SLOT["setup"] = True


def worker_slot() -> int | None:
    """This worker's index in a local pool (0 .. workers-1; 0 in the command's own process), or None in
    a Ray task (the device comes from ASCEND_RT_VISIBLE_DEVICES there)."""
    return _SLOT.get("slot", 0)


_BACKENDS: dict = {}


def worker_backend(name: str, *, device=None, max_seconds: float | None = None):
    """The backend ``name`` of this process under a supervisor of its own (a
    kernels.backends.supervised.SupervisedBackend: the kernel runs in a worker process this one owns),
    built once and kept for its later tasks (the sim's traced graphs and calculator stay loaded in that
    worker). The npu backends get their device here: in a local pool worker k takes NPU ``device + k``;
    a Ray task takes the one device Ray made visible (ASCEND_RT_VISIBLE_DEVICES,
    kernels.backends.resolve_device_index). A backend that cannot start raises the same one-line error on
    every call (RuntimeError naming the worker and the reason); a contract violation is a UsageError."""
    slot = worker_slot()
    dev = ((device or 0) + slot if slot is not None else None) if runs_on_npu(name) else device
    spec = BackendSpec(name=name, device=dev, max_seconds=max_seconds)
    key = (name, dev, max_seconds)
    if key in _BACKENDS:
        known = _BACKENDS[key]
        if isinstance(known, RuntimeError):
            raise known
        if known.supervisor.generation == known._generation and not known.supervisor.closed:
            return known
    # One supervisor per process, its workers reused by every backend asked for here (a matrix's rows).
    supervisor = _SUPERVISOR.get("current")
    try:
        if supervisor is None or supervisor.closed:
            supervisor = _SUPERVISOR["current"] = Supervisor(spec)
            backend = SupervisedBackend(supervisor)
        else:
            supervisor.reload(spec)
            backend = SupervisedBackend(supervisor)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - kept, and raised for each task of this worker
        reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        where = f"worker {slot}" if slot is not None else f"the worker on {_node()}"
        _BACKENDS[key] = RuntimeError(f"{where} could not start backend {name!r}: {reason}")
        raise _BACKENDS[key] from None
    _BACKENDS[key] = backend
    return backend


_SUPERVISOR: dict = {}


def local_init(slots) -> None:
    """A local worker's start: its slot from the pool's queue, given back when the process ends. A pool
    with ``max_tasks_per_child=1`` (``fresh``) starts a new process after every task, and a process that
    kept its slot would leave the next one waiting in ``slots.get()`` for ever (a hung kill matrix).
    multiprocessing runs a Finalize with an exit priority when its child process ends normally; a worker
    that dies breaks the whole pool, which Pool replaces with fresh slots."""

    die_with_parent(os.getppid())          # a killed driver leaves no worker behind
    worker_setup()
    _SLOT["slot"] = slots.get()
    Finalize(None, slots.put, args=(_SLOT["slot"],), exitpriority=10)


def _node() -> str:
    host = socket.gethostname()
    if _SLOT.get("ray"):
        import ray
        return f"{host} ({ray.util.get_node_ip_address()})"
    return host


def retire_if_spoiled() -> str | None:
    """Why this process must not run another task (pypto's state after a failure inside its trace,
    kernels.pypto_workarounds.spoiled), or None."""
    if "pfa_verify.kernels.pypto_workarounds" not in sys.modules:
        return None
    return spoiled()


def call_in_worker(fn: Callable, payload) -> tuple:
    """What a worker runs: ``fn(payload)``, with the node and process that ran it, and why the process
    must be replaced before another task (None: it need not)."""
    worker_setup()
    return fn(payload), _node(), os.getpid(), retire_if_spoiled()


class WorkerSpoiled(RuntimeError):
    """A Ray worker refusing a task because an earlier task left its process unusable (it exits)."""


def ray_call(fn: Callable, payload) -> tuple:
    _SLOT.update(ray=True, slot=None)
    why = retire_if_spoiled()
    if why:
        # Ray cannot retire a task's worker on request: this one refuses the task (the driver hands it
        # out again, uncharged) and exits a moment later, once the refusal has gone back.
        threading.Timer(0.5, os._exit, args=(0,)).start()
        raise WorkerSpoiled(why)
    return call_in_worker(fn, payload)
