"""``pfa-verify run``: every captured, catalog and generated case on one backend, held to the golden.

The second stage of the cases/ pipeline (collect -> run -> report -> html_report -> cli): it runs
what :mod:`cases.collect` selected and returns results; it prints nothing.

For each paged-attention case the verdict is :func:`properties.acceptance.judge`'s, the one
acceptance rule (the same as pytest's ``acceptance`` law, ``cases replay`` and ``cases prune``): one
outcome per reference codec (spec, and the backend's declared codec when it differs), each with its
attribution and whether it counts. A counted failure is captured (:func:`cases.regressions.capture`)
and its message ends with the replay command. A captured regression of another law is replayed
through :func:`cases.regressions.replay`.

A case is *checked* when its comparisons ran. A case not checked is skipped (``Skip.kind``: the
kernel is not built for it, it is over a limit, the budget is spent, the ledger quarantines it, the
backend could not run it) or an error (the backend raised, a worker could not start its backend, the
case file would not load). Errors always fail the run; skips fail it unless their kind was allowed
(``--allow-skips``); :mod:`cases.report` applies the rule.
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from cases.collect import Item, collect_items

__all__ = ["Outcome", "CaseResult", "RunResult", "choose_backend", "run_item", "run_items", "schedule", "estimate",
           "execute", "RATIO_BINS"]

# Bins of |actual - golden| / (atol + rtol * |golden|): 1 is the tolerance (SPEC §4).
RATIO_BINS = (0.0, 1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 10.0, 100.0, 1e3, math.inf)


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
    signature: tuple | None = None    # a generated case's failure group (cases/shrink.py), not reported
    error_map: list | None = None     # [B*S1][NQ] worst error / allowed over d (failures only)
    ratio_histogram: list | None = None  # counts per RATIO_BINS interval, then non-finite mismatches


@dataclasses.dataclass
class CaseResult:
    name: str
    source: str
    config: dict | None
    seed: int | None
    backend: str
    seconds: float
    outcomes: list

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
    selection: dict | None = None     # cases.collect.selection(): what was selected, fingerprinted
    provenance: dict | None = None    # cases.provenance.run_provenance(): which kernel, project, inputs


# --- the backend ---------------------------------------------------------------------------------

def choose_backend(name: str, *, device=None, max_seconds: float | None = None):
    """``(backend, name to replay it by, one line saying what was chosen and why)``.

    ``auto`` is :func:`kernels.get_backend`'s: npu, else sim, else the golden (``backend.fallback``).
    Raises kernels.BackendUnavailable when the named backend cannot start here.
    """
    import kernels

    backend = kernels.get_backend(name, device=device) if device is not None else kernels.get_backend(name)
    if max_seconds is not None and hasattr(backend, "max_seconds"):
        backend.max_seconds = max_seconds or None        # 0: no limit
    note = getattr(backend, "selection", None) or f"backend {backend.name} (as asked)"
    replay_name = backend.name if name == "auto" else name
    return backend, replay_name, note


# --- one case ------------------------------------------------------------------------------------

def _picture(ratio: torch.Tensor) -> tuple[list, list]:
    """(worst ratio per (row, head), histogram of ratios over RATIO_BINS + a non-finite bin)."""
    worst = ratio.amax(dim=-1)
    error_map = [[(float(v) if math.isfinite(v) else None) for v in row] for row in worst.tolist()]
    flat = ratio.reshape(-1)
    fin = flat[torch.isfinite(flat)]
    counts = []
    for lo, hi in zip(RATIO_BINS[:-1], RATIO_BINS[1:]):
        counts.append(int(((fin >= lo) & (fin < hi)).sum()) if lo > 0 else int((fin < hi).sum()))
    counts.append(int((~torch.isfinite(flat)).sum()))
    return error_map, counts


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
        o.error_map, o.ratio_histogram = _picture(ref.ratio)
    return o


def _envelope_record(ref) -> dict | None:
    """The envelope's part in one comparison: elements that passed only inside it, P elements whose code
    may flip, degenerate rows, and for a failure how far outside it the worst element lies (in units of
    its tolerance); None when no envelope was used."""
    env, res = ref.envelope, ref.comparison
    if env is None or not res.envelope:
        return None
    return {"inside_only": res.by_envelope, "flippable": env.flippable, "p_elements": env.p_elements,
            "degenerate_rows": env.degenerate_rows,
            "outside_by": res.outside_envelope if res.outside_index is not None else None,
            "note": ref.envelope_note()}


def _run_paged(backend, backend_name: str, item: Item, *, capture: bool, regressions_dir) -> list:
    from cases import regressions
    from properties.acceptance import judge
    verdict = judge(backend, item.case, tags={"case": item.name, "backend": backend.name})
    outcomes = [_outcome(ref, verdict.output, item.case.config.s1) for ref in verdict.references]
    counted = [o for o in outcomes if o.verdict == "fail" and o.counts]
    if counted and item.source == "generated":
        # Captured after the run, once per signature and shrunk (cases/shrink.py, capture_generated).
        from cases.shrink import signature
        counted[0].signature = signature(verdict)
        return outcomes
    if counted and item.source == "regression":
        command = regressions.replay_command(item.regression, regressions_dir)
        line = f"Replay: {command}"
    elif counted:
        command, line = regressions.capture("acceptance", backend_name, item.case, {}, verdict.message(),
                                            enabled=capture, directory=regressions_dir)
    for o in counted:
        o.replay = command
        o.message += f"\n{line}"
    return outcomes


class _FailsLikeTheGroup(AssertionError):
    """A replayed case failed with the group's signature (carries its verdict, not judged again)."""

    def __init__(self, verdict):
        super().__init__("fails like the group")
        self.verdict = verdict


def capture_generated(backend, backend_name: str, items: list, results: list, *, seed: int, supported,
                      capture: bool, regressions_dir, shrink_s: float, examples: int, distributions=None) -> dict:
    """Capture the generated cases' failures once per signature, each shrunk by Hypothesis from the
    generation that produced it (cases/shrink.py); every failing outcome gets its group's replay line.
    Returns {signature: (captured case, member names)}."""
    from cases import regressions
    from cases.collect import generated_strategy, generation_draws
    from cases.shrink import hunt, signature
    from properties.acceptance import judge
    groups: dict = {}
    for item, result in zip(items, results):
        for o in result.outcomes:
            if o.signature is not None:
                groups.setdefault(o.signature, []).append((item, result))
    captured = {}
    strategy = generated_strategy(supported, distributions)
    for sig, members in groups.items():
        def fails_like(case, sig=sig):
            try:
                verdict = judge(backend, case)
            except Exception:  # noqa: BLE001 - another failure is another bug, not this group's
                return
            if signature(verdict) == sig:
                raise _FailsLikeTheGroup(verdict)
        found = hunt(strategy, fails_like, seed=seed, examples=generation_draws(examples), shrink_s=shrink_s)
        shrunk = shrink_s > 0 and found.error is not None
        case = found.example if shrunk else members[0][0].case
        verdict = found.error.verdict if shrunk else judge(backend, case)
        names = [item.name for item, _ in members]
        how = (f"shrunk by Hypothesis to B={case.config.batch} S1={case.config.s1} NQ={case.config.nq} "
               f"lengths={list(case.config.lengths)}" if shrunk else "not shrunk")
        note = f"{len(names)} generated case(s) fail like this ({', '.join(names)}); {how}"
        command, line = regressions.capture("acceptance", backend_name, case, {}, verdict.message() + "\n" + note,
                                            enabled=capture, directory=regressions_dir)
        short = f"one of {len(names)} generated case(s) that fail like this, captured once; {how}"
        for item, result in members:
            for o in result.outcomes:
                if o.verdict == "fail" and o.counts:
                    o.replay = command
                    o.message += f"\n{short}\n{line}"
        captured[sig] = (case, names)
    return captured


def _run_regression_law(backend, item: Item, regressions_dir) -> list:
    from cases import regressions
    reg = regressions.load(item.regression, directory=regressions_dir)
    try:
        regressions.replay(reg, backend, directory=regressions_dir)
    except AssertionError as exc:
        return [Outcome("spec", "fail", message=f"law {reg.law}: {exc}", attribution="kernel logic",
                        replay=regressions.replay_command(item.regression, regressions_dir))]
    return [Outcome("spec", "pass", message=f"law {reg.law} holds")]


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
    return [Outcome("spec", "skipped", counts=False, message=f"skipped: {skip.reason}", skip_kind=skip.kind)]


def _error(message: str) -> list:
    return [Outcome("spec", "error", message=message)]


def run_item(backend, backend_name: str, item: Item, *, capture: bool = True, regressions_dir=None,
             deadline: float | None = None) -> CaseResult:
    """Run one item and return its result; never raises for a backend failure (verdict ``error``).
    ``deadline`` (``time.time()`` value): past it, the item is skipped with the reason."""
    start = time.perf_counter()
    from cases import ledger
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
    if item.load_error is None and skip is not None:
        outcomes = _skipped(skip)
    elif item.load_error is None:
        try:
            if item.case is not None and item.law == "acceptance":
                outcomes = _run_paged(backend, backend_name, item, capture=capture, regressions_dir=regressions_dir)
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
    return CaseResult(item.name, item.source, item.config, item.seed, getattr(backend, "name", backend_name),
                      time.perf_counter() - start, outcomes)


# --- many cases, in one process or in workers ----------------------------------------------------

_WORKER: dict = {}


def _worker_init(backend_name: str, device, slots, options: dict) -> None:
    torch.set_num_threads(1)
    index = slots.get() if slots is not None else 0
    dev = (device or 0) + index if backend_name == "npu" else None   # one NPU per worker
    try:
        backend, _, _ = choose_backend(backend_name, device=dev, max_seconds=options.get("max_seconds"))
        _WORKER.update(backend=backend, error=None)
    except Exception as exc:  # noqa: BLE001 - reported as an error for each of its cases
        reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        _WORKER.update(backend=None, error=f"worker {index} could not start backend {backend_name!r}: {reason}")
    _WORKER.update(name=backend_name, options=options)


def _worker_run(item: Item) -> CaseResult:
    if _WORKER.get("backend") is None:
        return CaseResult(item.name, item.source, item.config, item.seed, _WORKER["name"], 0.0,
                          _error(_WORKER["error"]))
    opts = _WORKER["options"]
    return run_item(_WORKER["backend"], _WORKER["name"], item, capture=opts["capture"],
                    regressions_dir=opts["regressions_dir"], deadline=opts["deadline"])


def schedule(backend, items: list) -> list[int]:
    """The order workers take items in: captured regressions first (as in a serial run), then the rest
    longest first by the backend's estimate (greedy packing onto the workers; ties keep case order)."""
    def key(k: int):
        cost = estimate(backend, items[k])
        return (items[k].source != "regression", -(cost.seconds if cost is not None else 0.0), k)
    return sorted(range(len(items)), key=key)


def run_items(backend, backend_name: str, items: list, *, workers: int = 1, device=None, capture: bool = True,
              regressions_dir=None, progress=None, deadline: float | None = None,
              max_seconds: float | None = None) -> list:
    """Results in ``items`` order. ``progress(event, item, result)`` sees ``start`` and ``done``.
    With ``workers`` > 1 each spawned worker builds its own backend by name; one that cannot turns
    each of its cases into an ``error`` (never a skip)."""
    note = progress or (lambda *a: None)
    if workers <= 1 or len(items) <= 1:
        results = []
        for item in items:
            note("start", item, None)
            r = run_item(backend, backend_name, item, capture=capture, regressions_dir=regressions_dir,
                         deadline=deadline)
            note("done", item, r)
            results.append(r)
        return results
    ctx = multiprocessing.get_context("spawn")
    slots = ctx.Queue()
    for k in range(workers):
        slots.put(k)
    options = dict(capture=capture, regressions_dir=regressions_dir, deadline=deadline, max_seconds=max_seconds)
    results: dict = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                             initargs=(backend_name, device, slots, options)) as pool:
        futures = {}
        for n, k in enumerate(schedule(backend, items)):
            futures[pool.submit(_worker_run, items[k])] = k
            note("start", items[k], None) if n < workers else None
        for fut in as_completed(futures):
            k = futures[fut]
            try:
                results[k] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died is an error for its case
                it = items[k]
                results[k] = CaseResult(it.name, it.source, it.config, it.seed, backend_name, 0.0,
                                        _error(f"worker failed: {type(exc).__name__}: {exc}"))
            note("done", items[k], results[k])
    return [results[k] for k in range(len(items))]


def execute(options, *, progress=None, on_items=None) -> RunResult:
    """The run behind ``pfa-verify run`` (no printing): choose, collect, run. ``options`` has the
    command's fields (cli.py). ``on_items(items, note)`` hears what will run, and how the backend
    was chosen, before the first case starts. kernels.BackendUnavailable propagates: a backend that
    cannot start checks nothing."""
    from cases.collect import selection
    from cases.provenance import run_provenance
    start = time.perf_counter()
    backend, name, why = choose_backend(options.backend, device=options.device, max_seconds=options.max_seconds)
    provenance = run_provenance(backend, regressions_dir=options.regressions)   # before anything is captured
    supported = getattr(backend, "supported_shapes", None)
    distributions = getattr(options, "distribution", None)
    items = collect_items(options.cases, examples=options.examples, seed=options.seed, supported=supported,
                          regressions_dir=options.regressions, distributions=distributions)
    selected = selection(items, cases=options.cases, examples=options.examples, seed=options.seed,
                         supported=supported, distributions=distributions)
    if on_items is not None:
        on_items(items, why)
    budget = options.budget if options.budget is not None else getattr(backend, "default_budget_s", 0)
    deadline = time.time() + budget if budget else None
    results = run_items(backend, name, items, workers=options.workers, device=options.device,
                        capture=not options.no_capture, regressions_dir=options.regressions, progress=progress,
                        deadline=deadline, max_seconds=options.max_seconds)
    capture_generated(backend, name, items, results, seed=options.seed, supported=supported,
                      capture=not options.no_capture, regressions_dir=options.regressions,
                      shrink_s=getattr(options, "shrink_seconds", 60), examples=options.examples,
                      distributions=distributions)
    return RunResult(getattr(backend, "name", name), why, getattr(getattr(backend, "codec", None), "name", None),
                     options.seed, results, time.perf_counter() - start,
                     "pfa-verify run " + " ".join(sys.argv[2:]), fallback=bool(getattr(backend, "fallback", False)),
                     allow_fallback=bool(options.allow_fallback), allowed_skips=tuple(options.allow_skips or ()),
                     selection=selected, provenance=provenance)
