"""``pfa-verify run``: every captured, catalog and generated case on one backend, held to the golden.

The second stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli): it runs
what :mod:`cases.data.collect` selected and returns results; it prints nothing.

For each paged-attention case the verdict is :func:`properties.acceptance.judge`'s, the one
acceptance rule (the same as pytest's ``acceptance`` law, ``cases replay`` and ``cases prune``): one
outcome per reference codec (spec, and the backend's declared codec when it differs), each with its
attribution and whether it counts. A counted failure is captured (:func:`cases.data.regressions.capture`)
and its message ends with the replay command. A captured regression of another law is replayed
through :func:`cases.data.regressions.replay`.

A case is *checked* when its comparisons ran. A case not checked is skipped (``Skip.kind``: the
kernel is not built for it, it is over a limit, the budget is spent, the ledger quarantines it, the
backend could not run it) or an error (the backend raised, a worker could not start its backend, the
case file would not load). Errors always fail the run; skips fail it unless their kind was allowed
(``--allow-skips``); :mod:`cases.reporting.report` applies the rule.

Cases run in :mod:`cases.running.pool` (here, in local worker processes, or on a Ray cluster); whatever ran
them, a counted failure is captured here, on the driver, as its result comes back (:func:`_captured`),
and every result names the node that ran it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time


from cases.data.collect import Item, collect_items
from properties.attribution import error_picture
from properties.coverage import coverage
from properties.diagnosis import annotate

__all__ = ["Outcome", "CaseResult", "RunResult", "choose_backend", "run_item", "run_items", "schedule", "estimate",
           "execute", "RunOptions"]


@dataclasses.dataclass
class Outcome:
    """One comparison of one case (one JSON result object); the error picture rides along for HTML."""
    reference: str               # "spec" or the backend codec's name
    verdict: str                 # pass | fail | error | skipped
    counts: bool = True
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatched: int | None = None
    total: int | None = None
    worst_index: dict | None = None   # {"row", "b", "i", "head", "d"}
    worst_ratio: float | None = None  # max error over what the one rule allows (1 = its edge); inf: non-finite
    envelope: dict | None = None      # what the acceptance envelope did (SPEC §4.2): see _envelope_record
    message: str = ""
    attribution: str | None = None    # kernel logic | backend codec
    attribution_detail: str | None = None
    replay: str | None = None
    skip_kind: str | None = None      # kernels.backends.SKIP_KINDS, for skipped outcomes
    signature: tuple | None = None    # a generated case's failure group (cases/running/shrink.py), not reported
    error_map: list | None = None     # [B*S1][NQ] worst error / allowed over d (failures only)
    ratio_histogram: list | None = None  # counts per RATIO_BINS interval, then non-finite mismatches
    diagnosis: dict | None = None     # properties.diagnosis.Diagnosis.to_dict() of a counted failure


@dataclasses.dataclass
class CaseResult:
    name: str
    source: str
    config: dict | None
    seed: int | None
    backend: str
    seconds: float
    outcomes: list
    node: str | None = None            # the host (and Ray node) that ran the case
    attempts: int = 1                  # 2: its first worker died (cases/running/pool.py) and it ran again
    to_capture: str | None = None      # a counted catalog failure's message, captured on the driver

    @property
    def checked(self) -> bool:
        """Whether the case's comparisons ran (not skipped, no error)."""
        return all(o.verdict in ("pass", "fail") for o in self.outcomes)


@dataclasses.dataclass
class RunResult:
    backend: str
    backend_note: str
    codec: str | None
    seed: int
    results: list
    seconds: float
    command: str = ""
    fallback: bool = False            # auto fell back to the golden: no kernel checked
    allow_fallback: bool = False
    allowed_skips: tuple = ()         # skip kinds that do not fail the run
    selection: dict | None = None     # cases.data.collect.selection(): what was selected, fingerprinted
    provenance: dict | None = None    # cases.data.provenance.run_provenance(): which kernel, project, inputs
    execution: dict | None = None     # cases.running.pool.Pool.describe(): executor, workers, cluster resources, nodes
    coverage: dict | None = None      # properties.coverage.Coverage.to_dict() of the checked cases
    coverage_required: tuple = ()     # --coverage: bins (or "all") a hole of which fails the run


#: The reference of a skipped or errored case: no comparison with any golden was made.
NO_REFERENCE = "-"


# --- the backend ---------------------------------------------------------------------------------

def choose_backend(name: str, *, device=None, max_seconds: float | None = None):
    """``(backend, name to replay it by, one line saying what was chosen and why)``.

    ``auto`` is :func:`kernels.get_backend`'s: npu, else sim, else the golden (``backend.fallback``).
    Raises kernels.BackendUnavailable when the named backend cannot start here.
    """
    import kernels
    from kernels.backends import limit_time

    backend = limit_time(kernels.get_backend(name, device=device) if device is not None else kernels.get_backend(name),
                         max_seconds)
    note = getattr(backend, "selection", None) or f"backend {backend.name} (as asked)"
    note = "; ".join([note] + (backend.notes() if hasattr(backend, "notes") else []))
    replay_name = backend.name if name == "auto" else name
    return backend, replay_name, note


# --- one case ------------------------------------------------------------------------------------

def _worst_index(res, s1: int) -> dict | None:
    index = res.max_abs_index
    if index is None and res.nonfinite:
        index = res.nonfinite[0].first_index
    if index is None or len(index) != 3:
        return None
    row, h, d = (int(x) for x in index)
    return {"row": row, "b": row // s1, "i": row % s1, "head": h, "d": d}


def _outcome(ref, out, s1: int) -> Outcome:
    """The JSON-shaped outcome of one properties.acceptance.Reference."""
    res = ref.comparison
    o = Outcome(reference=ref.reference, verdict="pass" if res.passed else "fail", counts=ref.counts,
                total=res.total, mismatched=res.mismatched if res.attribute is None else res.total,
                max_abs_err=res.max_abs_err, max_rel_err=res.max_rel_err, worst_index=_worst_index(res, s1),
                worst_ratio=ref.worst_ratio, message=ref.message, attribution_detail=ref.attribution_text,
                envelope=_envelope_record(ref))
    if res.passed:   # compare reports maxima over mismatches only; a pass still shows its float32 noise
        from properties.compare import max_differences
        o.max_abs_err, o.max_rel_err = max_differences(out, ref.expected)
        return o
    o.attribution = ref.category
    if ref.ratio is not None:
        o.error_map, o.ratio_histogram = error_picture(ref.ratio)
    return o


def _envelope_record(ref) -> dict | None:
    """The envelope's part in one comparison: the output rows it was built for (those holding an element
    outside the tolerance), elements that passed only inside it, P elements whose code may flip there,
    degenerate rows, and for a failure how far outside it the worst element lies (in units of its
    tolerance); None when none was needed (every element within the tolerance)."""
    env, res = ref.envelope, ref.comparison
    if env is None or not res.envelope:
        return None
    return {"inside_only": res.by_envelope, "flippable": env.flippable, "p_elements": env.p_elements,
            "degenerate_rows": env.degenerate_rows,
            "rows_built": None if env.rows is None else len(env.rows),
            "outside_by": res.outside_envelope if res.outside_index is not None else None,
            "note": ref.envelope_note()}


def _run_paged(backend, item: Item, regressions_dir) -> tuple[list, str | None]:
    """The outcomes of one paged case, and the message to capture a counted catalog failure with (the
    driver captures it, :func:`_captured`; a generated one is captured once per signature, shrunk)."""
    from cases.data import regressions
    from properties.acceptance import judge
    verdict = judge(backend, item.case, tags={"case": item.name, "backend": backend.name})
    outcomes = [_outcome(ref, verdict.output, item.case.config.s1) for ref in verdict.references]
    counted = [o for o in outcomes if o.verdict == "fail" and o.counts]
    if counted and item.source != "generated":     # a generated failure is diagnosed once shrunk (shrink.py)
        annotate(counted, verdict, item.case)
    if counted and item.source == "generated":
        from cases.running.shrink import signature
        counted[0].signature = signature(verdict)
    elif counted and item.source == "regression":
        command = regressions.replay_command(item.regression, regressions_dir)
        for o in counted:
            o.replay, o.message = command, o.message + f"\nReplay: {command}"
    elif counted:
        return outcomes, verdict.message()
    return outcomes, None


def _captured(backend_name: str, item: Item, result: CaseResult, *, capture: bool, regressions_dir) -> CaseResult:
    """``result`` after capturing its counted catalog failure through the one writer (here, on the driver)."""
    if result.to_capture is None:
        return result
    from cases.data import regressions
    command, line = regressions.capture("acceptance", backend_name, item.case, {}, result.to_capture,
                                        enabled=capture, directory=regressions_dir)
    for o in result.outcomes:
        if o.verdict == "fail" and o.counts:
            o.replay, o.message = command, o.message + f"\n{line}"
    result.to_capture = None
    return result


def _run_regression_law(backend, item: Item, regressions_dir) -> list:
    """Replay a captured case of another law (``item.record``: its file, read by the driver)."""
    from cases.data import regressions
    reg = item.record
    try:
        regressions.replay(reg, backend, directory=regressions_dir)
    except AssertionError as exc:
        return [Outcome(f"law {reg.law}", "fail", message=f"law {reg.law}: {exc}", attribution="kernel logic",
                        replay=regressions.replay_command(item.regression, regressions_dir))]
    return [Outcome(f"law {reg.law}", "pass", message=f"law {reg.law} holds")]


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


def _skipped(skip) -> list:
    return [Outcome(NO_REFERENCE, "skipped", counts=False, message=f"skipped: {skip.reason}", skip_kind=skip.kind)]


def _error(message: str) -> list:
    return [Outcome(NO_REFERENCE, "error", message=message)]


def run_item(backend, backend_name: str, item: Item, *, regressions_dir=None, deadline: float | None = None) -> CaseResult:
    """Run one item and return its result (a counted catalog failure's ``to_capture`` set, captured by
    the driver); never raises for a backend failure (verdict ``error``). ``deadline`` (``time.time()``
    value): past it, the item is skipped with the reason."""
    start = time.perf_counter()
    from properties import ledger
    from kernels import BackendUnavailable, Skip
    from properties.acceptance import InputsModified
    known = ledger.lookup(item.regression, backend_name, config=getattr(item.case, "config", None))
    skip = None
    if item.load_error is not None:
        outcomes = _error(f"the captured case cannot be loaded: {item.load_error}")
    elif deadline is not None and (why_not := _over_budget(backend, item, deadline)):
        skip = Skip("budget", why_not)
    elif known is not None and known.quarantined:
        skip = Skip("quarantined", f"quarantined: {known.reason}")
    elif item.case is not None:
        skip = backend.skip_reason(item.case.config) if hasattr(backend, "skip_reason") else None
    to_capture = None
    if item.load_error is None and skip is not None:
        outcomes = _skipped(skip)
    elif item.load_error is None:
        try:
            if item.case is not None and item.law == "acceptance":
                outcomes, to_capture = _run_paged(backend, item, regressions_dir)
            else:
                outcomes = _run_regression_law(backend, item, regressions_dir)
        except InputsModified as exc:
            outcomes = [Outcome("spec", "fail", message=str(exc), attribution="kernel logic",
                                attribution_detail="the backend modified its inputs")]
        except BackendUnavailable as exc:
            outcomes = _skipped(Skip("unavailable", exc.reason))
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported as an error
            outcomes = _error(f"{type(exc).__name__}: {exc}")
    checked = all(o.verdict in ("pass", "fail") for o in outcomes)
    if known is not None and known.tolerated and checked:
        # A strict xfail under the one rule: the counted comparisons must still fail. Skips and
        # errors are left as they are (a tolerated case that did not run was not checked).
        if any(o.verdict == "fail" and o.counts for o in outcomes):
            for o in outcomes:
                if o.verdict == "fail" and o.counts:
                    o.counts = False
                    o.message += f"\nKnown failure (ledger): {known.reason}"
        else:
            outcomes = [Outcome(outcomes[0].reference, "fail", message=f"ledger entry no longer fails: remove "
                                f"it ({known.reason})", attribution="kernel logic")]
        to_capture = None
    if not any(o.verdict == "fail" and o.counts for o in outcomes):
        to_capture = None
    return CaseResult(item.name, item.source, item.config, item.seed, getattr(backend, "name", backend_name),
                      time.perf_counter() - start, outcomes, to_capture=to_capture)


# --- many cases, through the pool (cases/running/pool.py) ---------------------------------------------------

def _case_task(payload) -> CaseResult:
    """One case in a worker of cases/running/pool.py: the worker's backend (built once), then the item."""
    from cases.running.pool import worker_backend
    name, options, item = payload
    try:
        backend = worker_backend(name, device=options["device"], max_seconds=options["max_seconds"])
    except Exception as exc:  # noqa: BLE001 - reported as an error for each of its cases, never a skip
        return CaseResult(item.name, item.source, item.config, item.seed, name, 0.0, _error(str(exc)))
    return run_item(backend, name, item, regressions_dir=options["regressions_dir"], deadline=options["deadline"])


def schedule(backend, items: list) -> list[int]:
    """The order workers take items in: captured regressions first (as in a serial run), then the rest
    longest first by the backend's estimate (greedy packing onto the workers; ties keep case order)."""
    def key(k: int):
        cost = estimate(backend, items[k])
        return (items[k].source != "regression", -(cost.seconds if cost is not None else 0.0), k)
    return sorted(range(len(items)), key=key)


def run_items(backend, backend_name: str, items: list, *, workers: int = 1, device=None, capture: bool = True,
              regressions_dir=None, progress=None, deadline: float | None = None,
              max_seconds: float | None = None, pool=None) -> list:
    """Results in ``items`` order. ``progress(event, item, result)`` sees ``start`` and ``done``.
    In this process with one worker and no ``pool``; else through ``pool`` (a cases.running.pool.Pool, default
    ``workers`` local processes), whose workers build their own backend by name (one that cannot turns
    each of its cases into an ``error``, never a skip), in :func:`schedule` order. Counted catalog
    failures are captured here as their results arrive."""
    from cases.running.pool import Pool
    note = progress or (lambda *a: None)
    local = pool is None and (workers <= 1 or len(items) <= 1)
    order = list(range(len(items))) if local else schedule(backend, items)
    options = dict(device=device, max_seconds=max_seconds, regressions_dir=regressions_dir, deadline=deadline)
    results: dict = {}

    def done(n, task):
        k = order[n]
        it = items[k]
        r = task.value if task.error is None else CaseResult(it.name, it.source, it.config, it.seed, backend_name,
                                                             0.0, _error(f"worker failed: {task.error}"))
        r.node, r.attempts = task.node, task.attempts
        for o in r.outcomes if task.retry_cause else ():
            o.message += f"\n(ran again: its first run was lost when a worker died ({task.retry_cause}))"
        results[k] = _captured(backend_name, it, r, capture=capture, regressions_dir=regressions_dir)
        note("done", it, results[k])

    started = lambda n: note("start", items[order[n]], None)  # noqa: E731 - a local shorthand
    here = lambda p: run_item(backend, backend_name, p[2], regressions_dir=regressions_dir, deadline=deadline)  # noqa: E731
    with contextlib.nullcontext(pool) if pool is not None else Pool(workers=1 if local else workers) as running:
        running.map(_case_task, [(backend_name, options, items[k]) for k in order], on_start=started, on_done=done,
                    here=here)
    return [results[k] for k in range(len(items))]


@dataclasses.dataclass(frozen=True)
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
    budget: int | None = None
    max_seconds: int | None = None
    allow_skips: tuple[str, ...] = ()
    allow_fallback: bool = False
    regressions: str | None = None
    no_capture: bool = False
    shrink_seconds: int = 60
    coverage: tuple[str, ...] = ()        # bins (or "all") that must be hit, else the run fails
    command: str = "pfa-verify run"       # how the run was asked for, as the report quotes it


def execute(options: RunOptions, *, progress=None, on_items=None) -> RunResult:
    """The run behind ``pfa-verify run`` (no printing): choose, connect, collect, run, capture, as
    ``options`` (:class:`RunOptions`) say. ``on_items(items, note)`` hears what will run, and how the backend
    was chosen, before the first case starts. kernels.BackendUnavailable propagates (a backend that
    cannot start checks nothing), and so does cases.running.pool.ClusterError (a cluster that cannot take the
    cases: both before any case runs)."""
    from cases.data.collect import selection
    from cases.running.pool import Pool, task_resources
    from cases.data.provenance import run_provenance
    from cases.running.shrink import capture_generated
    from kernels.backends import use_backend_threads
    if not isinstance(options, RunOptions):
        raise TypeError(f"options must be a cases.running.run.RunOptions (cases.cli.run_options builds one from the "
                        f"command's arguments), got {type(options).__name__}")
    start = time.perf_counter()
    backend, name, why = choose_backend(options.backend, device=options.device, max_seconds=options.max_seconds)
    use_backend_threads(backend)                 # this process's (workers set their own)
    cluster = options.cluster
    pool = Pool(workers=options.workers, cluster=cluster, resources=task_resources(backend))
    with pool if cluster else contextlib.nullcontext():
        provenance = run_provenance(backend, regressions_dir=options.regressions)   # before anything is captured
        supported = getattr(backend, "supported_shapes", None)
        distributions = options.distribution
        items = collect_items(options.cases, examples=options.examples, seed=options.seed, supported=supported,
                              regressions_dir=options.regressions, distributions=distributions)
        selected = selection(items, cases=options.cases, examples=options.examples, seed=options.seed,
                             supported=supported, distributions=distributions)
        if on_items is not None:
            on_items(items, why + (f"; cases run on the Ray cluster {cluster} ({len(pool.nodes)} node(s), "
                                   f"{pool.describe()['workers']} at a time)" if cluster else ""))
        budget = options.budget if options.budget is not None else getattr(backend, "default_budget_s", 0)
        deadline = time.time() + budget if budget else None
        results = run_items(backend, name, items, workers=options.workers, device=options.device,
                            capture=not options.no_capture, regressions_dir=options.regressions, progress=progress,
                            deadline=deadline, max_seconds=options.max_seconds, pool=pool if cluster else None)
    capture_generated(backend, name, items, results, supported=supported, capture=not options.no_capture,
                      regressions_dir=options.regressions, shrink_s=options.shrink_seconds, distributions=distributions)
    return RunResult(getattr(backend, "name", name), why, getattr(getattr(backend, "codec", None), "name", None),
                     options.seed, results, time.perf_counter() - start,
                     options.command, fallback=bool(getattr(backend, "fallback", False)),
                     allow_fallback=bool(options.allow_fallback), allowed_skips=tuple(options.allow_skips or ()),
                     selection=selected, provenance=provenance, execution=pool.describe(),
                     coverage=coverage([i.case.config for i, r in zip(items, results) if i.case is not None and r.checked]).to_dict(),
                     coverage_required=tuple(options.coverage))
