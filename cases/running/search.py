"""``pfa-verify search``: long law searches (the nightly kind), split into tasks, on any pool.

Each law's search of ``examples`` examples is split into ``tasks`` tasks of about ``examples / tasks``
examples, each under its own seed (:func:`task_seed`: distinct per law and task, the same for the same
``--seed``), and the tasks run through :mod:`cases.running.pool` (here, local processes or a Ray cluster). A
task is one :func:`cases.running.shrink.hunt` over the law's examples (properties/search/law_examples.py, the same
domains as pytest's law tests and the mutants): it stops at its first failure and does not shrink it.

With ``--database`` the tasks share Hypothesis's example database (a directory every node can reach,
or ``redis://HOST:PORT[/DB]``, Hypothesis's RedisExampleDatabase, which needs the ``redis`` package):
a failure saved by one task is replayed first by every later task of the same law and backend, on any
node, and by tomorrow's search.

The failures come back to the driver, grouped by :func:`failure_signature` (law, kind of failure);
the first of each group, in law and task order, is shrunk here by Hypothesis for ``shrink_s``
seconds (the task's seed replayed, or the database) and captured once through cases/data/regressions.py;
every other member points at it.

Each law gets one verdict over its tasks (:func:`law_verdicts`). It holds only on evidence: every task
ran, none failed, and together they checked at least ``min_examples`` examples (checked: calls of the law,
counted by the task; a search the time budget cut, or one where Hypothesis drew fewer than asked, has
"too few examples"). Exit 0 only when every law held. While it runs, each task's count of examples checked
reaches the driver through cases/running/search_channel.py, which also carries ``--fail-fast``'s stop.
The JSON report, the summary line and the tables are cases/reporting/search_report.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import Counter

from hypothesis.database import DirectoryBasedExampleDatabase

from pfa_verify.cases.data.diagnosed import explain
from pfa_verify.cases.running.answers import Answers, Recorded
from pfa_verify.cases.running.capture import capture_case
from pfa_verify.cases.running.pool import Pool, task_resources, worker_backend
from pfa_verify.cases.running.search_channel import Channel, TaskChannel, watch
from pfa_verify.cases.running.shrink import hunt, nondeterminism
from pfa_verify.golden.errors import UsageError, check_known
from pfa_verify.kernels.backends.contract import implements, shrink_budget
from pfa_verify.kernels.backends.faults import describe_failure
from pfa_verify.properties.rule.coverage import Coverage, classify
from pfa_verify.properties.search import law_examples, laws
from pfa_verify.properties.search.law_examples import AT12_LAWS, BACKEND_LAWS, PAGED_LAWS, operator_of

__all__ = ["TaskReport", "SearchTask", "SearchRun", "LAW_GROUPS", "MIN_EXAMPLES", "VERDICT_STYLES", "law_names",
           "task_seed", "failure_signature", "open_database", "search", "verdict_of", "law_verdicts"]

#: ``--laws`` of ``pfa-verify laws`` and ``search``: a group's name stands for its laws.
LAW_GROUPS = {"all": BACKEND_LAWS, "paged": PAGED_LAWS, "at12": AT12_LAWS}

#: The fewest examples a law must have checked to hold, unless ``--min-examples`` lowers it (and never above
#: ``--examples``): the 20 examples per law of the pytest laws' ``ci`` and ``dev`` profiles (``tox``, a
#: developer's run). A law searched less than the quick test suite searches it has not held.
MIN_EXAMPLES = 20

#: The rich style of each verdict of a law, in the order of the summary line.
VERDICT_STYLES = {"held": "green", "too few examples": "bold yellow", "failed": "bold red", "error": "bold magenta",
                  "not run": "yellow", "stopped": "yellow"}


@dataclasses.dataclass
class TaskReport:
    """One task: ``law``, its index, its seed, the examples it drew, its seconds, where it ran, and its
    failure (``case``, ``params``, ``kind``, ``message``) or ``error`` (the task itself broke)."""
    law: str
    task: int
    seed: int
    examples: int = 0
    seconds: float = 0.0
    node: str | None = None
    failure: dict | None = None
    error: str | None = None
    replay: str | None = None
    hits: dict = dataclasses.field(default_factory=dict)   # coverage bin -> examples that hit it (properties/rule/coverage.py)
    cut: bool = False               # the law's time budget ended the task before its examples were drawn
    skipped: str | None = None      # why the backend cannot run this law (it does not implement its kernel), or None
    stopped: bool = False           # --fail-fast ended the task (or it never started): not a verdict of the law


@dataclasses.dataclass(frozen=True)
class SearchTask:
    """One task as the pool hands it out: the law, its index and seed, the examples it asks for, the backend,
    the example database, its time budget (None: no limit), the folder of cases/running/search_channel.py
    (None: none) and whether a stop written there ends it (--fail-fast)."""
    law: str
    task: int
    seed: int
    examples: int
    backend: str
    database: str | None = None
    seconds: float | None = None
    channel: str | None = None
    fail_fast: bool = False


@dataclasses.dataclass
class SearchRun:
    backend: str
    laws: tuple
    examples: int
    tasks_per_law: int
    seed: int
    database: str | None
    tasks: list
    captured: list
    seconds: float
    execution: dict | None = None
    min_examples: int = 1           # a law that checked fewer has "too few examples" (not held)
    fail_fast: bool = False

    def coverage(self) -> Coverage:
        """The coverage (properties.rule.coverage.Coverage) of every example the tasks drew."""

        hits: Counter = Counter()
        for t in self.tasks:
            hits.update(t.hits)
        # AT-12 calls have no coverage bins: the count is of the paged-attention examples alone
        return Coverage.from_hits(hits, sum(t.examples for t in self.tasks if t.error is None and t.law in PAGED_LAWS))

    @property
    def exit_status(self) -> int:
        """0 when every law held (:func:`law_verdicts`); 1 when one failed, broke, could not run on the backend,
        was stopped by --fail-fast, or checked fewer than ``min_examples``."""
        return 0 if all(row["verdict"] == "held" for row in law_verdicts(self)) else 1


def law_names(text: str | None, option: str = "--laws") -> tuple:
    """The laws ``text`` names (``LAW,...``, each a law of the backend or a group of :data:`LAW_GROUPS`), in
    order and each once; None: every paged law. A UsageError names ``option`` and the unknown names."""
    if text is None:
        return PAGED_LAWS
    given = [n.strip() for n in text.split(",") if n.strip()]
    if not given:
        raise UsageError(f"{option}: none given; expected some of {', '.join(BACKEND_LAWS)}, or "
                         f"{', '.join(LAW_GROUPS)}")
    check_known(option, "law", given, (*BACKEND_LAWS, *LAW_GROUPS),
                hint=f"expected {', '.join(LAW_GROUPS)} or some of {', '.join(BACKEND_LAWS)}")
    return tuple(dict.fromkeys(law for n in given for law in LAW_GROUPS.get(n, (n,))))


def task_seed(seed: int, law: str, task: int) -> int:
    """The seed of task ``task`` of ``law``: a 32-bit hash of (seed, law, task), so tasks never share draws."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{law}:{task}".encode()).digest()[:4], "big")


def failure_signature(law: str, kind: str, message: str) -> tuple:
    """How failures are grouped: the law and the kind (``law``: the law's assertion; ``error``: the
    backend raised, with the exception's type). Coarse on purpose, as cases/running/shrink.py's: one bug, one
    signature, one captured case."""
    return (law, kind) if kind == "law" else (law, kind, message.split(":", 1)[0])


def open_database(spec: str | None):
    """The Hypothesis example database named by ``spec``: None, a directory, or ``redis://...``."""
    if not spec:
        return None
    if spec.startswith(("redis://", "rediss://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase  # noqa: PLC0415 - it imports redis
        except ImportError:
            raise UsageError(f"--database {spec!r}: the redis package is not installed (pip install redis)") from None
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec)


def _key(law: str, backend_name: str) -> str:
    return f"pfa-verify search {law} {backend_name}"


class _Stopped(BaseException):
    """Ends a task the driver told to stop (--fail-fast). A BaseException, as shrink.hunt's own time budget
    is: Hypothesis lets it through at once instead of taking it for a failure of the law."""


def _search_task(task: SearchTask) -> TaskReport:
    """One task in a worker (cases/running/pool.py): the worker's backend, then the law's search; its count
    of examples checked goes to the channel as it grows, and a stop there (--fail-fast) ends it."""
    report = TaskReport(task.law, task.task, task.seed)
    channel = TaskChannel(task.channel, task.law, task.task) if task.channel else None

    def stopped() -> bool:
        return task.fail_fast and channel is not None and channel.stopped()
    if stopped():
        report.stopped = True
        return report
    backend = worker_backend(task.backend)
    start = time.perf_counter()
    operator = operator_of(task.law)
    if operator is not None and not implements(backend, operator):
        # declared when the backend was loaded (kernels.Capabilities.operators), never learnt from a call
        report.skipped = f"the backend does not implement {operator} (kernels.Capabilities.operators)"
        return report

    def check(example):
        if stopped():
            raise _Stopped
        config = getattr(example[0], "config", None)   # a paged case (an AT-12 call has no coverage bins)
        for name in classify(config) if config is not None else ():    # what the search covered, failing example included
            report.hits[name] = report.hits.get(name, 0) + 1
        report.examples += 1            # checked (hunt counts the same calls; a stopped task keeps this count)
        try:
            laws.run(task.law, backend, example[0], **example[1])
        finally:
            if channel is not None:
                channel.checked(report.examples, time.perf_counter() - start)
    try:
        found = hunt(law_examples.examples(task.law, backend), check, seed=task.seed, examples=task.examples,
                     database=open_database(task.database), key=_key(task.law, task.backend), seconds=task.seconds)
    except _Stopped:
        report.stopped, report.seconds = True, time.perf_counter() - start
        return report
    report.seconds, report.cut = found.seconds, found.cut
    if found.error is not None:               # whatever the kernel raised (BackendUnavailable too): an error
        assert found.example is not None        # hunt sets the failing example with its error
        case, params = found.example
        kind = "law" if isinstance(found.error, AssertionError) else "error"
        message = describe_failure(found.error) if kind == "error" else str(found.error).strip()
        report.failure = {"case": case, "params": dict(params), "kind": kind, "message": message}
    return report


def _report(task: SearchTask, result) -> TaskReport:
    """The TaskReport of a pool's TaskResult: the task's own, or an error when the task broke."""
    rep = result.value if result.error is None else TaskReport(task.law, task.task, task.seed, error=result.error)
    rep.node = result.node
    return rep


def _shrunk(law: str, backend, first: TaskReport, signature: tuple, *, examples: int, database, shrink_s: float):
    """``(case, params, message, how, nondeterministic, diagnosis)`` of the group's first failure, shrunk by
    Hypothesis when it reproduces (the task's seed, or the database, replayed here on the driver) and then
    diagnosed (cases/data/diagnosed.py; ``diagnosis``: what it names); else as the task found it (None). ``nondeterministic``:
    how the kernel was seen to answer the same case differently while it was shrunk
    (cases.running.shrink.nondeterminism), or None."""
    answers = Answers()
    backend = Recorded(backend, answers, "while shrinking on the driver")
    if shrink_s > 0:
        def check(example):
            try:
                laws.run(law, backend, example[0], **example[1])
            except Exception as exc:
                kind = "law" if isinstance(exc, AssertionError) else "error"
                if failure_signature(law, kind, f"{type(exc).__name__}: {exc}") == signature:
                    raise
        found = hunt(law_examples.examples(law, backend), check, seed=first.seed, examples=examples,
                     shrink_s=shrink_s, database=database, key=_key(law, backend.name),
                     shrink_calls=shrink_budget(backend))
        if found.error is not None:
            assert found.example is not None    # hunt sets the failing example with its error
            case, params = found.example
            told = explain(found.error, backend)
            return (case, dict(params), told.message, "shrunk by Hypothesis on the driver",
                    nondeterminism(answers, found, lambda: None), told.named)
        seen = nondeterminism(answers, found, lambda: None)
    else:
        seen = None
    failure = first.failure
    assert failure is not None                  # a group's first member is a task that failed
    return failure["case"], failure["params"], failure["message"], "not shrunk", seen, None


def search(backend_name: str, laws: tuple, *, examples: int, tasks: int, seed: int = 0, database: str | None = None,
           workers: int = 1, cluster=None, shrink_s: float = 60.0, capture: bool = True, regressions_dir=None,
           progress=None, seconds: float | None = None, min_examples: int | None = None,
           fail_fast: bool = False) -> SearchRun:
    """Every law's search of ``examples`` examples in ``tasks`` tasks on the pool, each task within
    ``seconds`` (None: no limit); failures grouped, the first of each group shrunk and captured once, here.
    A law whose tasks checked fewer than ``min_examples`` together (default: ``examples`` or
    :data:`MIN_EXAMPLES`, the fewer) has too few examples. ``fail_fast``: after the first task that fails or
    errs, no task starts and those running stop after their current example.

    ``progress(event, task, data)``: ``"start"`` (data None) as a :class:`SearchTask` is handed out,
    ``"checked"`` with ``(examples, seconds)`` while it runs (from another thread; not from a cluster's
    nodes), ``"done"`` with its :class:`TaskReport`."""
    if not laws:
        raise UsageError(f"--laws: none given; expected some of {', '.join(BACKEND_LAWS)}")
    check_known("--laws", "law", laws, BACKEND_LAWS)
    for option, value in (("--tasks", tasks), ("--examples", examples)):
        if value < 1:
            raise UsageError(f"{option} {value} must be at least 1")
    least = min(examples, MIN_EXAMPLES) if min_examples is None else min_examples
    if not 1 <= least <= examples:
        raise UsageError(f"--min-examples {least} must be at least 1 and at most --examples ({examples}): a law "
                         "cannot check more examples than it is given")
    start = time.perf_counter()
    backend = worker_backend(backend_name)        # the driver shrinks: it needs the backend too (supervised)
    db = open_database(database)
    per_task = math.ceil(examples / tasks)
    channel = Channel() if progress is not None or fail_fast else None
    work = [SearchTask(law, k, task_seed(seed, law, k), per_task, backend_name, database, seconds,
                       channel.folder if channel else None, fail_fast) for law in laws for k in range(tasks)]
    running: dict = {}
    tell = progress or (lambda event, task, data: None)

    def started(n: int) -> None:
        running[n] = work[n]
        tell("start", work[n], None)

    def done(n: int, r) -> None:
        running.pop(n, None)
        rep = _report(work[n], r)
        if fail_fast and channel is not None and (rep.failure or rep.error):
            channel.stop()
        tell("done", work[n], rep)
    unwatch = (watch(channel, lambda: [(t.law, t.task) for t in list(running.values())],
                     lambda law, k, n, s: tell("checked", work[laws.index(law) * tasks + k], (n, s)))
               if channel is not None and progress is not None else None)
    try:
        with Pool(workers=workers, cluster=cluster, resources=task_resources(backend)) as pool:
            results = pool.map(_search_task, work, on_start=started, on_done=done)
    finally:
        if unwatch is not None:
            unwatch()
        if channel is not None:
            channel.close()
    reports = [_report(task, r) for task, r in zip(work, results, strict=True)]
    groups: dict = {}
    for rep in reports:
        if rep.failure is not None:
            sig = failure_signature(rep.law, rep.failure["kind"], rep.failure["message"])
            groups.setdefault(sig, []).append(rep)
    captured = []
    for sig, members in groups.items():
        first = members[0]
        case, params, message, how, flaky, diagnosis = _shrunk(first.law, backend, first, sig, examples=per_task,
                                                               database=db, shrink_s=shrink_s)
        names = [f"{m.law}#{m.task}" for m in members]
        note = f"{len(members)} search task(s) failed like this ({', '.join(names)}); {how}"
        kept = capture_case(first.law, backend_name, case, f"{message}\n{note}", params=params, enabled=capture,
                            directory=regressions_dir, nondeterministic=flaky)
        for m in members:
            m.replay = kept.replay
        label = case.label() if hasattr(case, "label") else repr(case)
        captured.append({"signature": list(sig), "law": first.law, "tasks": names, "replay": kept.replay,
                         "line": kept.line, "how": how, "message": message, "case": label,
                         "diagnosis": diagnosis})
    return SearchRun(backend_name, tuple(laws), examples, tasks, seed, database, reports, captured,
                     time.perf_counter() - start, pool.describe(), min_examples=least, fail_fast=fail_fast)


def verdict_of(tasks: list, *, min_examples: int, asked: int) -> tuple[str, str]:
    """``(verdict, detail)`` of one law over its ``tasks`` (TaskReports) that were ``asked`` for that many
    examples together: ``failed`` (the law's assertion) or ``error`` (the kernel raised, or a task broke),
    ``not run`` (the backend cannot run it; or --fail-fast stopped it before it started), ``stopped`` (by
    --fail-fast, partway), ``too few examples`` (fewer than ``min_examples`` checked: cut by the time
    budget, or Hypothesis drew no more), ``held``."""
    examples = sum(t.examples for t in tasks)
    failed = next((t for t in tasks if t.failure), None)
    broke = next((t for t in tasks if t.error), None)
    skipped = next((t for t in tasks if t.skipped), None)
    if failed is not None:
        assert failed.failure is not None
        # the kernel raised on an example: an error of the law's check, never a verdict of the law
        return ("failed" if failed.failure["kind"] == "law" else "error",
                (failed.failure["message"].strip().splitlines() or [""])[0])
    if broke is not None:
        return "error", str(broke.error)
    if skipped is not None:
        return "not run", f"the backend cannot run it: {skipped.skipped}"
    said = f"{examples} example{'' if examples == 1 else 's'}"
    if any(t.stopped for t in tasks):
        return ("stopped", f"by --fail-fast after {said}") if examples else ("not run", "stopped by --fail-fast")
    if any(t.cut for t in tasks):
        why = f"{said}, then cut by the time budget"
    elif examples < asked:
        why = (f"{said} of {asked}: Hypothesis drew no more (the law's domain ran out of distinct examples, or "
               "its filters rejected the draws)")
    else:
        why = f"all {said}"
    if examples < min_examples:
        return "too few examples", f"{why}; fewer than the {min_examples} a law holds on (--min-examples)"
    return "held", why


def law_verdicts(run: SearchRun) -> list[dict]:
    """One verdict per law over its tasks (:func:`verdict_of`): ``law``, ``examples``, ``seconds`` (the tasks'
    own), ``verdict``, ``detail`` (a failure's: after how many examples, the shrunk case, the diagnosis and
    the capture) and ``replay``."""
    rows = []
    for law in run.laws:
        mine = [t for t in run.tasks if t.law == law]
        examples, seconds = sum(t.examples for t in mine), sum(t.seconds for t in mine)
        asked = math.ceil(run.examples / run.tasks_per_law) * run.tasks_per_law
        verdict, detail = verdict_of(mine, min_examples=run.min_examples, asked=asked)
        group = next((c for c in run.captured if c["law"] == law), None)
        if verdict in ("failed", "error") and group is not None:
            detail = _failure_detail(group, examples)
        rows.append({"law": law, "examples": examples, "seconds": round(seconds, 2), "verdict": verdict,
                     "detail": detail, "replay": next((t.replay for t in mine if t.replay), None)})
    return rows


def _failure_detail(group: dict, examples: int) -> str:
    """A law's failure in one line: after how many examples, the shrunk case, the diagnosis' name (or that
    none was identified) and the capture."""
    said = f"at example {examples}; {'shrunk to' if group['how'].startswith('shrunk') else 'on'} {group['case']}"
    if group.get("diagnosis"):
        said += "; " + group["diagnosis"]
    return said + (f"; replay {group['replay'].rsplit(' ', 1)[-1]}" if group["replay"] else "; not captured")

