"""``pfa-verify run``: every captured, catalog and generated case on one backend, held to the golden.

The second stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli): it runs
what :mod:`cases.data.collect` selected and returns a :class:`~cases.running.verdict.RunResult`; it
prints nothing.

The kernel runs under a supervisor (kernels/backends/supervisor.py): in ``workers`` processes this one
owns, never in this one, so whatever the kernel does (exit, hang, crash, lie) it cannot decide a
verdict. This process hands each case's inputs to a free worker, and while the workers compute it
judges what came back with :func:`properties.rule.acceptance.hold`, the one acceptance rule (the same as
pytest's ``acceptance`` law, ``cases replay`` and ``prune``). A call that did not come back (the worker
ended, with any status, or outlived the case's time limit) is an ``error`` naming what happened, and the
next case gets a fresh worker. ``in_process`` runs the kernel here instead (for a debugger), with its
SystemExit and KeyboardInterrupt turned into errors; on a Ray cluster (``cluster``) each case is a task
that runs the kernel under a supervisor on its node (cases/running/pool.py).

A case is *checked* when its comparisons ran. A case not checked is skipped (``Skip.kind``: the kernel
is not built for it, it is over a limit, the budget is spent, the ledger quarantines it, the backend
could not run it) or an error (:data:`cases.running.verdict.ERROR_KINDS`). Errors always fail the run;
skips fail it unless their kind was allowed; :mod:`cases.reporting.report` applies the rule.

A catalog failure is diagnosed as its verdict arrives, generated ones are shrunk once per signature
(cases/running/shrink.py); then the failures that fail alike, catalog and generated, form one group each,
captured once, its smallest case (cases/running/groups.py, through the one capture path). ``stop`` (a
callable naming the signal that interrupted the run, or None) is asked between steps: once it names one,
the workers are killed, the failures found so far are grouped and captured as they are, and the result
says which cases were not run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable
from typing import Any

import torch

from pfa_verify import kernels
from pfa_verify.cases.data import regressions
from pfa_verify.cases.data.collect import Item, chosen_items, selection, with_generated
from pfa_verify.cases.data.diagnosed import diagnosis_of
from pfa_verify.cases.data.provenance import SHIPPED_PREFIX, capture_digests, lost_captures, run_provenance
from pfa_verify.cases.running.capture import write_failure
from pfa_verify.cases.running.groups import group_failures
from pfa_verify.cases.running.pool import Pool, task_resources, worker_backend
from pfa_verify.cases.running.shrink import probe_errors, probe_groups, shrink_generated, signature
from pfa_verify.cases.running.verdict import Capture, CaseError, CaseVerdict, LawReplay, RunResult
from pfa_verify.golden import memory_limit
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import BackendUnavailable, Skip
from pfa_verify.kernels.backends import limit_time, use_backend_threads
from pfa_verify.kernels.backends.contract import capabilities_of, implements
from pfa_verify.kernels.backends.faults import KernelFault, describe_failure
from pfa_verify.kernels.backends.guarded import GuardedBackend
from pfa_verify.kernels.backends.loader import pin_source
from pfa_verify.kernels.backends.supervised import SupervisedBackend
from pfa_verify.kernels.backends.supervisor import Reply, Supervisor
from pfa_verify.kernels.backends.worker_process import BackendSpec, driver_kernel_source
from pfa_verify.properties.diagnosis.separation import separate
from pfa_verify.properties.rule import ledger
from pfa_verify.properties.rule.acceptance import InputsModified, check_unchanged, hold, split_bundle
from pfa_verify.properties.rule.coverage import coverage
from pfa_verify.properties.search.law_examples import operator_of

__all__ = ["RunOptions", "execute", "shared_facts", "run_item", "schedule", "case_time_limit", "open_backend",
           "CASE_LIMIT_BASE_S", "CASE_LIMIT_FACTOR"]

#: A case's time limit where the backend has a cost model and ``--case-timeout`` was not given:
#: this many seconds plus CASE_LIMIT_FACTOR times its estimate (the sim's model is within 2x on the
#: upstream cases, kernels/backends/sim_cost.py; the base covers a worker's first trace and calculator build).
CASE_LIMIT_BASE_S = 120.0
CASE_LIMIT_FACTOR = 4.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What ``pfa-verify run`` was asked for, typed (cases.cli.run_options builds it from the command's
    arguments; the option of the same name in ``pfa-verify run --help`` says what each does)."""
    backend: str = "auto"
    cases: str = "all"
    examples: int = 20
    seed: int = 0
    distribution: tuple[str, ...] | None = None
    device: int | None = None
    workers: int = 1
    cluster: str | None = None
    budget: int | None = None             # the whole run's seconds (None: the backend's default_budget_s)
    # A case's seconds: one estimated longer is skipped, one running longer is ended. None: the limit
    # comes from the backend's cost model where it has one, and no case is skipped for it; 0: no limit.
    case_timeout: float | None = None
    in_process: bool = False              # the kernel in this process (a debugger): no supervisor
    allow_skips: tuple[str, ...] = ()
    allow_fallback: bool = False
    regressions: str | None = None
    no_capture: bool = False
    shrink_seconds: int = 60
    coverage: tuple[str, ...] = ()        # bins (or "all") that must be hit, else the run fails
    command: str = "pfa-verify run"       # how the run was asked for, as the report quotes it


def _where(name: str, regressions_dir) -> str:
    """A capture file of :func:`capture_digests` as a run's failure names it: its name and folder."""
    if name.startswith(SHIPPED_PREFIX):
        return f"{name.removeprefix(SHIPPED_PREFIX)} shipped in {regressions.SHIPPED}"
    return f"{name} in {regressions.directory(regressions_dir)}"


# --- the backend ---------------------------------------------------------------------------------

def open_backend(name: str, *, device=None, max_seconds: float | None = None, workers: int = 1,
                 case_timeout: float | None = None, in_process: bool = False):
    """``(backend, supervisor or None, name to replay it by, one line saying what was chosen and why)``.

    ``backend`` is a kernels.backends.supervised.SupervisedBackend on a supervisor of ``workers``
    processes (or, ``in_process``, the backend itself behind a GuardedBackend). ``auto`` is
    kernels.get_backend's: npu, else sim, else the golden (``fallback``). Raises kernels.BackendUnavailable
    or golden.errors.UsageError (one line) when the backend cannot start or breaks the contract."""
    if in_process:
        user_named, source, pinned = driver_kernel_source(name)
        if pinned is not None:                       # what runs is what was hashed, as in a worker
            pin_source(*pinned)
        try:
            raw = kernels.get_backend(name, device=device) if device is not None else kernels.get_backend(name)
        except (UsageError, BackendUnavailable):
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the factory is the kernel's code: one line, as a worker says it
            raise BackendUnavailable(f"backend {name!r} cannot start: loading it raised "
                                     f"{describe_failure(exc)}") from None
        caps = capabilities_of(raw, source=name)     # the one reader of a backend's optional attributes
        if user_named:
            caps = dataclasses.replace(caps, kernel_source=None if source is None else source.to_dict())
        use_backend_threads(raw)
        backend: Any = GuardedBackend(limit_time(raw, max_seconds), caps)
        supervisor = None
    else:
        supervisor = Supervisor(BackendSpec(name=name, device=device, max_seconds=max_seconds), workers=workers,
                                case_timeout=None if not case_timeout else case_timeout)
        try:
            supervisor.start()
            backend = SupervisedBackend(supervisor)
        except BaseException:
            supervisor.close()
            raise
        caps = backend.capabilities
    note = "; ".join([caps.selection or f"backend {backend.name} (as asked)", *caps.notes])
    return backend, supervisor, backend.name if name == "auto" else name, note


def case_time_limit(backend, item: Item, option: float | None) -> float | None:
    """A case's time limit: ``option`` (``--case-timeout``; 0: none), else from the backend's cost
    model (CASE_LIMIT_BASE_S + CASE_LIMIT_FACTOR x its estimate), else none."""
    if option is not None:
        return option or None
    cost = estimate(backend, item)
    return None if cost is None else CASE_LIMIT_BASE_S + CASE_LIMIT_FACTOR * cost.seconds


def estimate(backend, item: Item):
    """The backend's cost estimate of a paged case (``backend.estimate(config)``), or None."""
    cost = getattr(backend, "estimate", None)
    return cost(item.case.config) if callable(cost) and item.case is not None else None


def _over_budget(backend, item: Item, deadline: float) -> str | None:
    """Why ``item`` should not start with ``deadline`` ahead: the budget is spent, or the backend's
    estimate says the case would end after it."""
    left = deadline - time.time()
    if left <= 0:
        return "the run's time budget is spent (--budget; 0 = no limit)"
    cost = estimate(backend, item)
    if cost is not None and cost.seconds > left:
        return f"estimated {cost.describe()}, over the {left:.0f} s left of the run's time budget (--budget)"
    return None


# --- one case: before the call, the call, the verdict -----------------------------------------------

@dataclasses.dataclass
class _Call:
    """A case ready for its kernel call: the originals, the clones the kernel gets, the scalars."""
    item: Item
    tensors: dict
    given: dict
    scalars: dict
    known: Any            # its properties.rule.ledger entry, or None
    prepared_in: float    # seconds to build it (the kernel's own come with its reply)


_HOST = socket.gethostname()


def _verdict(item: Item, backend_name: str, seconds: float = 0.0, **fields) -> CaseVerdict:
    """A case's verdict, run on this host (a Ray task's verdict names its node: _run_cluster)."""
    return CaseVerdict(name=item.name, source=item.source, config=item.config, seed=item.seed, backend=backend_name,
                       seconds=seconds, node=_HOST, **fields)


def _not_run(backend, item: Item, known, *, deadline: float | None) -> CaseVerdict | None:
    """The verdict of a case that does not reach the kernel (cannot load, over budget, quarantined, a
    backend skip), or None: the one check before every kernel call, a paged case's or a law replay's."""
    if item.load_error is not None:
        return _verdict(item, backend.name, error=CaseError(kind="case file", message=f"the captured case cannot be "
                                                                                      f"loaded: {item.load_error}"))
    skip = None
    if deadline is not None and (why_not := _over_budget(backend, item, deadline)):
        skip = Skip("budget", why_not)
    elif known is not None and known.quarantined:
        skip = Skip("quarantined", f"quarantined: {known.reason}")
    elif item.record is not None and (op := operator_of(item.record.law)) and not implements(backend, op):
        skip = Skip("unsupported", f"the backend does not implement {op}, which law {item.record.law} calls "
                                   "(kernels.Capabilities.operators)")
    elif item.case is not None:
        try:
            skip = backend.skip_reason(item.case.config)
        except Exception as exc:  # noqa: BLE001 - the backend's own code: its failure is this case's error
            kind = "worker" if isinstance(exc, KernelFault) else "kernel"
            return _verdict(item, backend.name, error=CaseError(
                kind=kind, message=f"the backend's skip_reason failed: {describe_failure(exc)}"))
    return None if skip is None else _verdict(item, backend.name, skip=skip)


def _prepare(backend, item: Item, *, deadline: float | None) -> CaseVerdict | _Call:
    """The verdict of a case that does not reach the kernel (:func:`_not_run`), or its call."""
    start = time.perf_counter()
    known = ledger.lookup(item.regression, backend.name, config=getattr(item.case, "config", None))
    if (verdict := _not_run(backend, item, known, deadline=deadline)) is not None:
        return verdict
    # what reaches the kernel is a paged case: collect_items gives one to every catalog and generated
    # item and to every acceptance record (another law's record is replayed instead, run_item)
    assert item.case is not None
    tensors, scalars = split_bundle(item.case.inputs())
    return _Call(item, tensors, {k: v.clone() for k, v in tensors.items()}, scalars, known,
                 time.perf_counter() - start)


def _judged(backend, call: _Call, reply) -> CaseVerdict:
    """The verdict of one kernel call's reply (kernels.backends.supervisor.Reply), by the one rule."""
    item = call.item
    # preparing plus the call itself: not the time a prepared call spent queued behind another (_run_supervised)
    seconds = call.prepared_in + reply.seconds
    facts = dict(seconds=seconds, attempts=reply.attempts, retry_cause=reply.retry_cause)
    for k, new in reply.changed.items():          # what the kernel wrote into its inputs, as it would have here
        if call.given[k].shape == new.shape and call.given[k].dtype == new.dtype:
            call.given[k].copy_(new)
    failure = reply.failure
    if failure is not None:           # whatever the kernel raised, BackendUnavailable included: an error, never a skip
        kind = "worker" if isinstance(failure, KernelFault) else "kernel"
        text = str(failure) if isinstance(failure, KernelFault) else describe_failure(failure)
        return _verdict(item, backend.name, error=CaseError(kind=kind, message=text), **facts)
    tags = {"case": item.name, "backend": backend.name}
    try:
        check_unchanged(call.given, call.tensors, backend_name=backend.name, tags=tags)
    except InputsModified as exc:
        return _ledgered(_verdict(item, backend.name, inputs_modified=str(exc), **facts), call.known)
    assert item.case is not None                  # a call is made of a paged case (_prepare)
    judgement = hold(reply.output, call.tensors, call.scalars, backend=backend, label=item.case.label(), tags=tags)
    return _ledgered(_verdict(item, backend.name, judgement=judgement, **facts), call.known)


def _ledgered(verdict: CaseVerdict, known) -> CaseVerdict:
    """A tolerated known failure (the ledger) under the one rule, as a strict xfail: its failures do not
    count while it fails; once it passes, the entry is the failure (it must be removed)."""
    if known is None or not known.tolerated:
        return verdict
    if verdict.failed:
        return dataclasses.replace(verdict, ledger=known.reason)
    return dataclasses.replace(verdict, ledger_broken=known.reason)


def _law_replay(backend, item: Item, regressions_dir, *, deadline: float | None) -> CaseVerdict:
    """A captured case of another law (``item.record``), replayed through the backend (blocking calls),
    after the checks every kernel call passes (:func:`_not_run`: a shape the backend declares it does
    not support is a skip here too, not a replay of a kernel outside its contract)."""
    reg, start = item.record, time.perf_counter()
    assert reg is not None                        # called for the items that carry a record only
    known = ledger.lookup(item.regression, backend.name, config=getattr(item.case, "config", None))
    if (verdict := _not_run(backend, item, known, deadline=deadline)) is not None:
        return verdict
    try:
        regressions.replay(reg, backend, directory=regressions_dir)
    except AssertionError as exc:
        law = LawReplay(law=reg.law, passed=False, message=f"law {reg.law}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the kernel raised, or its worker ended: an error, named
        kind = "worker" if isinstance(exc, KernelFault) else "kernel"
        text = str(exc) if isinstance(exc, KernelFault) else describe_failure(exc)
        return _verdict(item, backend.name, time.perf_counter() - start, error=CaseError(kind=kind, message=text))
    else:
        law = LawReplay(law=reg.law, passed=True, message=f"law {reg.law} holds")
    return _ledgered(_verdict(item, backend.name, time.perf_counter() - start, law=law), known)


def _annotated(backend_name: str, item: Item, verdict: CaseVerdict, call: _Call | None, *,
               regressions_dir) -> CaseVerdict:
    """A counted failure's verdict with what the driver adds as it arrives: a catalog failure diagnosed,
    a regression's failure its own replay line, a generated one its signature (shrunk once per signature,
    cases/running/shrink.py); each group of cases that fail alike is captured after the run (groups.py)."""
    if not verdict.failed or verdict.ledger_broken is not None:
        return verdict
    if item.source == "generated":
        return dataclasses.replace(verdict, signature=signature(verdict))
    if verdict.judgement is not None and call is not None:
        verdict = dataclasses.replace(verdict, diagnosis=diagnosis_of(verdict.judgement, call.tensors, call.scalars))
    if item.source == "regression":
        assert item.regression is not None        # collect_items names every regression item by its id
        command = regressions.replay_command(item.regression, regressions_dir)
        return dataclasses.replace(verdict, capture=Capture(replay=command, line=f"Replay: {command}"))
    return verdict        # captured once its group is known (cases/running/groups.py)


def run_item(backend, backend_name: str, item: Item, *, regressions_dir=None, deadline: float | None = None,
             capture: bool = False) -> CaseVerdict:
    """One item, start to verdict, with blocking calls of ``backend`` (a SupervisedBackend, or a
    GuardedBackend in this process): the path of a Ray task and of an in-process run. Never raises for
    what the kernel does. A catalog failure is diagnosed here only when ``capture`` (a Ray task leaves
    that to the driver; the run captures each group of failures once, after judging)."""
    if item.record is not None:
        return _law_replay(backend, item, regressions_dir, deadline=deadline)
    prepared = _prepare(backend, item, deadline=deadline)
    if isinstance(prepared, CaseVerdict):
        return prepared
    start = time.perf_counter()
    try:
        out = backend.paged_attention_fp8(**prepared.given, **prepared.scalars)
        reply = Reply(output=out, changed={}, failure=None, seconds=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - whatever the call raised is the case's verdict
        reply = Reply(output=None, changed={}, failure=exc, seconds=time.perf_counter() - start)
    verdict = _judged(backend, prepared, reply)
    return _annotated(backend_name, item, verdict, prepared, regressions_dir=regressions_dir) \
        if capture or item.source == "generated" else verdict


# --- many cases ------------------------------------------------------------------------------------

def schedule(backend, items: list) -> list[int]:
    """The order cases start in: captured regressions first (as in a serial run), then the rest
    longest first by the backend's estimate (greedy packing onto the workers; ties keep case order)."""
    def key(k: int):
        cost = estimate(backend, items[k])
        return (items[k].source != "regression", -(cost.seconds if cost is not None else 0.0), k)
    return sorted(range(len(items)), key=key)


def _run_supervised(backend, supervisor, backend_name: str, items: list, *, workers: int, capture: bool,
                    regressions_dir, deadline, case_timeout, progress, stop) -> dict:
    """Every item through ``supervisor``'s workers, judged here as replies come back (the next case is
    handed out before the last is judged, so workers and judge overlap). Returns {index: verdict} of the
    items that ran (all of them unless ``stop()`` named a signal)."""
    note = progress or (lambda *a: None)
    order = schedule(backend, items) if workers > 1 else list(range(len(items)))
    done: dict = {}
    # Captured cases of other laws call the kernel several times with the law's logic between: first, alone.
    for k in [k for k in order if items[k].record is not None]:
        if stop():
            return done
        note("start", items[k], None)
        replayed = _law_replay(backend, items[k], regressions_dir, deadline=deadline)
        done[k] = _annotated(backend_name, items[k], replayed, None, regressions_dir=regressions_dir)
        note("done", items[k], done[k])
    queue = [k for k in order if items[k].record is None]
    flying: dict = {}

    memory = memory_limit()

    def size(k: int) -> int:
        return items[k].case.config.estimated_bytes() if items[k].case is not None else 0

    def room() -> bool:
        # One call queued ahead per worker, so that the next case's inputs are made while the workers
        # compute (on a host with a core to spare, the isolation then costs no wall time), but never two
        # cases held at once that together pass the one-case memory limit (golden.inputs.check_size).
        if supervisor.idle() > 0:
            return True
        return len(flying) < 2 * workers and sum(map(size, flying)) + size(queue[0]) <= memory

    def hand_out() -> None:
        while queue and room() and not stop():
            k = queue.pop(0)
            prepared = _prepare(backend, items[k], deadline=deadline)
            if isinstance(prepared, CaseVerdict):
                note("start", items[k], None)
                done[k] = prepared
                note("done", items[k], prepared)
                continue
            supervisor.submit(k, "paged_attention_fp8", prepared.given, prepared.scalars,
                              timeout=case_time_limit(backend, items[k], case_timeout))
            flying[k] = prepared
            note("start", items[k], None)

    hand_out()
    while (queue or flying) and not stop():
        replies = supervisor.wait(timeout=0.5)
        hand_out()                                # the workers compute while the replies are judged
        for k, reply in replies:
            prepared = flying.pop(k)
            done[k] = _annotated(backend_name, items[k], _judged(backend, prepared, reply), prepared,
                                 regressions_dir=regressions_dir)
            note("done", items[k], done[k])
        hand_out()
    return done


def _rebuilt(item: Item) -> _Call:
    """A case's inputs built again here (for the diagnosis of a verdict judged elsewhere)."""
    assert item.case is not None                  # called for catalog cases only
    tensors, scalars = split_bundle(item.case.inputs())
    return _Call(item, tensors, {}, scalars, None, 0.0)


def _run_here(backend, backend_name: str, items: list, *, capture: bool, regressions_dir, deadline, progress,
              stop) -> dict:
    """Every item in this process, one after another (``--in-process``)."""
    note = progress or (lambda *a: None)
    done: dict = {}
    for k, item in enumerate(items):
        if stop():
            break
        note("start", item, None)
        done[k] = run_item(backend, backend_name, item, regressions_dir=regressions_dir, deadline=deadline,
                           capture=capture)
        note("done", item, done[k])
    return done


def _case_task(payload) -> CaseVerdict:
    """One case in a Ray task (cases/running/pool.py): the task's supervised backend, then the item."""
    name, options, item = payload
    try:
        backend = worker_backend(name, device=options["device"], max_seconds=options["max_seconds"])
    except Exception as exc:  # noqa: BLE001 - reported as an error for each of its cases, never a skip
        return CaseVerdict(name=item.name, source=item.source, config=item.config, seed=item.seed, backend=name,
                           error=CaseError(kind="backend", message=str(exc)))
    return run_item(backend, name, item, regressions_dir=options["regressions_dir"], deadline=options["deadline"])


def _run_cluster(backend, backend_name: str, items: list, pool, *, device, max_seconds, capture: bool,
                 regressions_dir, deadline, progress) -> dict:
    """Every item as a Ray task (each runs its kernel under a supervisor on its node); failures captured
    here as their verdicts arrive."""
    note = progress or (lambda *a: None)
    order = schedule(backend, items)
    options = dict(device=device, max_seconds=max_seconds, regressions_dir=regressions_dir, deadline=deadline)
    done: dict = {}

    def finished(n, task):
        k = order[n]
        it = items[k]
        v = task.value if task.error is None else CaseVerdict(
            name=it.name, source=it.source, config=it.config, seed=it.seed, backend=backend_name,
            error=CaseError(kind="worker", message=f"the task failed: {task.error}"))
        v = dataclasses.replace(v, node=task.node, attempts=max(v.attempts, task.attempts),
                                retry_cause=v.retry_cause or task.retry_cause)
        call = _rebuilt(it) if v.judgement is not None and it.source == "catalog" and v.failed else None
        done[k] = _annotated(backend_name, it, v, call, regressions_dir=regressions_dir) \
            if it.source != "generated" else v
        note("done", it, done[k])

    pool.map(_case_task, [(backend_name, options, items[k]) for k in order],
             on_start=lambda n: note("start", items[order[n]], None), on_done=finished)
    return done


def shared_facts(paged: list) -> tuple[dict, ...]:
    """What the failing cases, and the erroring ones, share against the passing ones (properties.diagnosis.separation),
    from ``(config, verdict)`` pairs of the paged cases that ran."""
    passed = [config for config, v in paged if v.checked and not v.failed]
    found = []
    for kind, bad in (("failures", [c for c, v in paged if v.checked and v.failed]),
                      ("errors", [c for c, v in paged if v.error is not None and v.error.kind != "case file"])):
        if (separation := separate(bad, passed, kind=kind)) is not None:
            found.append(separation.to_dict())
    return tuple(found)


def _never() -> str | None:
    return None


def execute(options: RunOptions, *, progress=None, on_items=None, stop: Callable[[], str | None] | None = None) -> RunResult:
    """The run behind ``pfa-verify run`` (no printing): open the backend under its supervisor, collect,
    run, judge, capture, as ``options`` (:class:`RunOptions`) say. ``on_items(items, note)`` hears what
    will run, and how the backend was chosen, before the first case starts; ``progress(event, item,
    verdict)`` sees ``start`` and ``done``; ``stop()`` names the signal that interrupts the run (None:
    go on). kernels.BackendUnavailable and golden.errors.UsageError propagate (a backend that cannot
    start checks nothing), and so does cases.running.pool.ClusterError, all before any case runs."""
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be a cases.running.run.RunOptions (cases.cli.run_options builds one from the "
                        f"command's arguments), got {type(options).__name__}")
    stop = stop or _never
    start = time.perf_counter()
    cluster = options.cluster
    # The captures are read and verified before any of the backend's code runs (its factory included).
    chosen = chosen_items(options.cases, regressions_dir=options.regressions)
    digests = capture_digests(options.regressions)
    backend, supervisor, name, why = open_backend(
        options.backend, device=options.device, max_seconds=options.case_timeout,
        workers=1 if cluster else max(1, options.workers), case_timeout=options.case_timeout,
        in_process=options.in_process)
    with contextlib.ExitStack() as stack:
        if supervisor is not None:
            stack.callback(supervisor.close)
        torch.set_num_threads(1)     # this process judges while the workers compute: one thread each
        pool = Pool(workers=options.workers, cluster=cluster, resources=task_resources(backend))
        if cluster:
            stack.enter_context(pool)
        provenance = run_provenance(backend, regressions_dir=options.regressions, digests=digests)
        supported = backend.supported_shapes
        distributions = options.distribution
        items = with_generated(chosen, examples=options.examples, seed=options.seed, supported=supported,
                               distributions=distributions)
        selected = selection(items, cases=options.cases, examples=options.examples, seed=options.seed,
                             supported=supported, distributions=distributions)
        if hasattr(backend, "prefetch"):
            backend.prefetch([i.case.config for i in items if i.case is not None])
        if on_items is not None:
            on_items(items, why + (f"; cases run on the Ray cluster {cluster} ({len(pool.nodes)} node(s), "
                                   f"{pool.describe()['workers']} at a time)" if cluster else "")
                     + f"\nJudged by {provenance['backend']['model']['describe']}")
        budget = options.budget if options.budget is not None else (backend.capabilities.default_budget_s or 0)
        deadline = time.time() + budget if budget else None
        capture = not options.no_capture
        common = dict(capture=capture, regressions_dir=options.regressions, deadline=deadline, progress=progress)
        if cluster:
            done = _run_cluster(backend, name, items, pool, device=options.device, max_seconds=options.case_timeout,
                                **common)
        elif supervisor is None:
            done = _run_here(backend, name, items, stop=stop, **common)
        else:
            done = _run_supervised(backend, supervisor, name, items, workers=max(1, options.workers),
                                   case_timeout=options.case_timeout, stop=stop, **common)
        ran = [k for k in range(len(items)) if k in done]
        interrupted = stop()
        if supervisor is not None and interrupted:
            supervisor.close()              # the workers end now; what they were running is not checked
        results = shrink_generated(backend, [items[k] for k in ran], [done[k] for k in ran], supported=supported,
                                   shrink_s=0 if interrupted else options.shrink_seconds, distributions=distributions,
                                   stop=stop, why_not_shrunk="the run was interrupted" if interrupted else None)
        if not interrupted:
            results = probe_groups(backend, [items[k] for k in ran], results, stop=stop)
            results = probe_errors(backend, [items[k] for k in ran], results, stop=stop)
        # after the diagnosis and its probes, which decide what fails alike; interrupted too (nothing lost)
        results = group_failures([items[k] for k in ran], results, backend_name=name, capture=capture,
                                 regressions_dir=options.regressions)
    if cluster:
        execution = pool.describe()
    else:
        execution = {"executor": "in-process" if supervisor is None else "supervised", "workers": options.workers,
                     "cluster": None, "task_resources": task_resources(backend), "resources": None,
                     "nodes": [socket.gethostname()], "processes": None if supervisor is None else supervisor.started,
                     "refused": [] if supervisor is None else [f"worker {slot}: {why}" for slot, why in
                                                              sorted(supervisor.refused.items())]}
    paged = [(items[k].case.config, v) for k, v in zip(ran, results, strict=True)
             if items[k].case is not None and hasattr(items[k].case, "config")]
    checked = [config for config, v in paged if v.checked]
    errored = [config for config, v in paged if v.error is not None and v.error.kind != "case file"]
    failures = tuple(f for v in results if v.capture is not None and (f := write_failure(v.capture)))
    rewritten = {v.capture.regression for v in results if v.capture is not None and v.capture.regression}
    failures += tuple(f"the captured case file {_where(name, options.regressions)} was removed or "
                      "changed while the run ran, by something other than the run (its kernel?)"
                      for name in lost_captures(digests, options.regressions, rewritten=rewritten))
    return RunResult(backend=backend.name, backend_note=why, codec=backend.capabilities.codec,
                     seed=options.seed, results=tuple(results), seconds=time.perf_counter() - start,
                     command=options.command, fallback=backend.capabilities.fallback,
                     allow_fallback=bool(options.allow_fallback), allowed_skips=tuple(options.allow_skips or ()),
                     selection=selected, provenance=provenance, execution=execution,
                     coverage=coverage(checked, errored).to_dict(), coverage_required=tuple(options.coverage),
                     shared=shared_facts(paged),
                     interrupted=interrupted, not_run=tuple(items[k].name for k in range(len(items)) if k not in done),
                     write_failures=tuple(dict.fromkeys(failures)))
