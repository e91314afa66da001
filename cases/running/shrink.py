"""Hypothesis searches of the suite's own commands: find the first failing example, then shrink it.

:func:`hunt` is the one search: ``pfa-verify mutants`` runs it per (mutant, law), ``pfa-verify laws`` and
``search`` per law, and ``pfa-verify run`` to shrink the failures of its generated cases. A failing generated case is
rarely the smallest case that shows its bug, and one bug fails many generated cases alike, so before
anything is captured the failures are grouped by :func:`signature` (category of the one acceptance
rule, where the mismatches concentrate) and each group is shrunk by Hypothesis' own shrinker (the
shrunk case is what cases/running/groups.py captures for them): the
draws that produced the case are replayed (the same aim's strategy and seed, properties/search/directed.py) with
"fails with this signature" as the failure, so Hypothesis meets the group's first failing case and
shrinks from it. A kernel that answers the same case differently meanwhile (other output bits than in the
run or earlier in the shrink, a raise, or Hypothesis' final replay of the smallest failure passing: Flaky)
has the group's capture marked nondeterministic (cases/running/answers.py), never lost.
"""
from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase
from hypothesis.errors import Flaky, HypothesisException, Unsatisfiable
from hypothesis.strategies import SearchStrategy

from pfa_verify import golden
from pfa_verify.cases.data.diagnosed import diagnosis_of
from pfa_verify.cases.running.answers import Answers, answer, raised
from pfa_verify.cases.running.verdict import Exemplar
from pfa_verify.kernels.backends.contract import shrink_budget
from pfa_verify.kernels.backends.faults import KernelFault
from pfa_verify.properties.diagnosis.diagnosis import Probe
from pfa_verify.properties.diagnosis.error_probes import probe_error
from pfa_verify.properties.diagnosis.probes import probe
from pfa_verify.properties.rule.acceptance import judge, split_bundle
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search.generation import seeded_buffers, seeded_test

__all__ = ["Hunt", "hunt", "signature", "shrink_generated", "nondeterminism", "probe_groups", "probe_errors"]


#: What the searched strategy draws (properties.search.law_examples.Example, properties.rule.case.Case).
T = TypeVar("T")


@dataclasses.dataclass
class Hunt(Generic[T]):
    """What :func:`hunt` found: ``examples`` drawn up to the first failure (all, when none failed),
    ``seconds`` to it, and the smallest failing ``example`` with its ``error`` (None: none failed);
    ``cut``: the search's time budget ended it before its examples were all drawn."""
    examples: int = 0
    seconds: float = 0.0
    example: T | None = None
    error: BaseException | None = None
    cut: bool = False
    shrink_calls: int = 0           # calls of check while shrinking (after the first failure)
    #: Hypothesis' word (Flaky) when its final replay of the smallest failure called check and it passed:
    #: the same example failed, then passed (None: no such replay; one cut by the budget is no evidence).
    unreliable: str | None = None
    last_checked: bool = dataclasses.field(default=False, repr=False)   # the latest attempt called check
    last_failed: bool = dataclasses.field(default=False, repr=False)    # ... and it raised


class _Failed(Exception):
    """Tells Hypothesis that ``check`` failed (its own exception is kept in the Hunt)."""


class _OutOfTime(BaseException):
    """Ends a search whose time budget is spent. A BaseException, as KeyboardInterrupt is: Hypothesis
    lets it through at once instead of taking it for a failure to shrink, replay or save."""


def _kind(exc: BaseException) -> str:
    return "law" if isinstance(exc, AssertionError) else "error"


class _KeyedDatabase(ExampleDatabase):
    """``database`` with every key under ``prefix``: each law's saved failures under its own key, though
    every search's test function (and so Hypothesis' key for it) is the same."""

    def __init__(self, database: ExampleDatabase, prefix: str):
        super().__init__()
        self.database, self.prefix = database, prefix.encode() + b"/"

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(self.prefix + key, value)


def hunt(strategy: SearchStrategy[T], check: Callable[[T], object], *, seed: int, examples: int,
         shrink_s: float = 0.0, database: ExampleDatabase | None = None, key: str | None = None,
         seconds: float | None = None, shrink_calls: int | None = None, seeded: bool = False) -> Hunt[T]:
    """Draw up to ``examples`` from ``strategy`` under ``seed`` and call ``check(example)`` (it raises
    on failure) until one fails, or until ``seconds`` have passed (None: no limit; the Hunt says it was
    cut, and counts only the examples checked; the first is always checked); then let Hypothesis shrink it for ``shrink_s`` seconds (0: not
    shrunk) and at most ``shrink_calls`` calls of ``check`` (None: not counted; kernels.backends.contract.
    shrink_budget gives a backend's). While shrinking, only a failure of the first one's kind (an AssertionError, or another
    exception) counts: a different failure is another bug, not a smaller case of this one. Past the
    budget every attempt passes, so the shrinker stops at the smallest failure it has.

    ``database`` (a Hypothesis ExampleDatabase) is read first (failures saved there by any search
    under the same ``key``, on any node, are replayed before the seed's draws) and receives the
    failure found; without it nothing is saved. ``key`` keeps this search's saved failures apart.

    ``seeded``: draw the examples from seeded bytes instead, as ``pfa-verify run`` drew its generated
    cases (properties/search/generation.py), so the same seed meets the same cases; the first failure is then
    handed to Hypothesis through an in-memory database and shrunk by its reuse and shrink phases."""

    found: Hunt[T] = Hunt()
    start = time.perf_counter()

    if database is not None and key is not None:
        database = _KeyedDatabase(database, key)
    replaying: list[T | None] = []      # seeded: the failure found, handed to Hypothesis (known to fail: not checked again)

    def failed(example) -> bool:
        if found.error is None:
            if seconds is not None and found.examples and time.perf_counter() - start > seconds:
                found.cut = True
                raise _OutOfTime      # ends Hypothesis' run at once: no draw is made past the budget
            found.examples += 1
        elif (time.perf_counter() - start - found.seconds > shrink_s
              or (shrink_calls is not None and found.shrink_calls >= shrink_calls)):
            found.last_checked = False
            return False    # over budget (or Hypothesis' final replay without shrinking): "passes"
        else:
            found.shrink_calls += 1
        found.last_checked, found.last_failed = True, False
        try:
            check(example)
        except Exception as exc:  # noqa: BLE001 - whatever check raises is the failure looked for
            if found.error is None:
                found.seconds = time.perf_counter() - start
            elif _kind(exc) != _kind(found.error):
                return False
            found.example, found.error, found.last_failed = example, exc, True
            return True
        return False

    def body(example):
        if replaying and example == replaying[0]:     # Hypothesis replays it before it shrinks
            found.last_checked, found.last_failed = True, True
        elif not failed(example):
            return
        raise _Failed   # one place: Hypothesis shrinks only failures raised where the first one was

    shrink = [Phase.shrink] if shrink_s > 0 else []
    if seeded:
        database = InMemoryExampleDatabase()
        fuzz = seeded_test(strategy, body, database=database).hypothesis.fuzz_one_input
        try:
            for buffer in seeded_buffers(seed, examples):
                if found.examples >= examples:
                    break
                fuzz(buffer)        # a failure raises _Failed, its draws saved in the database
        except (_OutOfTime, _Failed):
            pass
        if found.error is None or not shrink:
            if found.error is None:
                found.seconds = time.perf_counter() - start
            return found
        replaying.append(found.example)
        phases = [Phase.reuse, *shrink]
    else:
        phases = ([Phase.reuse] if database is not None else []) + [Phase.generate] + shrink

    # settings outside seed: hypothesis.seed() alone would switch the database off.
    run = settings(max_examples=examples, database=database, deadline=None, report_multiple_bugs=False,
                   phases=phases, suppress_health_check=list(HealthCheck))(fixed_seed(seed)(given(strategy)(body)))
    try:
        run()
    except _OutOfTime:
        pass
    except Unsatisfiable:
        pass            # its filters rejected every draw: no example checked, as a domain that ran out
    except (_Failed, HypothesisException) as exc:
        # Flaky (or FlakyFailure) when the final replay "passed": over budget, the failure found still
        # stands; when check ran and passed, the same example failed and then passed (Hunt.unreliable).
        if found.error is None:
            raise
        if isinstance(exc, Flaky) and found.last_checked and not found.last_failed:
            found.unreliable = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if found.error is None:
        found.seconds = time.perf_counter() - start
    return found


def signature(verdict) -> tuple | None:
    """(category, where the mismatches concentrate) of a failing case: a properties.rule.acceptance.Judgement,
    or a cases.running.verdict.CaseVerdict (an input changed: its own group); None when it passes.
    Coarse on purpose: one bug, one signature."""
    if getattr(verdict, "inputs_modified", None) is not None:
        return ("kernel logic", "inputs modified")
    judgement = getattr(verdict, "judgement", verdict)
    if judgement is None:
        return None
    failed = [r for r in judgement.references if r.counts and not r.passed]
    if not failed:
        return None
    ref = failed[0]
    a, res = ref.attribution, ref.comparison
    if res.attribute is not None:
        where = "attributes"
    elif res.nonfinite:
        where = "non-finite values"
    elif a is None:
        where = "unattributed"
    elif a.in_cur_zero_rows == a.mismatched:
        where = "rows with cur == 0"
    elif all(tiles > 1 for (tiles, _), _ in a.by_tile_walk):
        where = "rows of several tiles"
    elif all(tiles == 1 for (tiles, _), _ in a.by_tile_walk):
        where = "rows of one tile"
    else:
        where = "rows of any length"
    return (ref.category, where)


class _FailsLikeTheGroup(AssertionError):
    """A replayed case failed with the group's signature (carries its verdict, not judged again)."""

    def __init__(self, verdict):
        super().__init__("fails like the group")
        self.verdict = verdict


def shrink_generated(backend, items: list, results: list, *, supported, shrink_s: float, distributions=None, stop=None,
                     why_not_shrunk: str | None = None) -> list:
    """``results`` (cases.running.verdict.CaseVerdict, one per item) with ``pfa-verify run``'s generated
    failures shrunk once per signature: each group shrunk by Hypothesis from the draws that produced
    a member (the item's properties.search.directed.Aim, :func:`hunt`), its first counted failure diagnosed on
    the case shrunk, and every member given the group's diagnosis and the shrunk case as its
    :class:`~cases.running.verdict.Exemplar` (new copies), which cases/running/groups.py captures once per
    group of cases that fail alike. With ``shrink_s`` 0 (or ``why_not_shrunk``: the run was interrupted)
    the first member is the exemplar as it is. ``stop()`` naming a signal ends a shrink at once (its best
    case so far stands). The diagnosis carries the probes of properties/diagnosis/probes.py, run on neighbours of
    the case shrunk."""

    stop = stop or (lambda: None)
    groups: dict = {}
    for k, (_item, verdict) in enumerate(zip(items, results, strict=True)):
        if verdict.signature is not None:
            groups.setdefault(verdict.signature, []).append(k)
    out = list(results)
    for sig, members in groups.items():
        # What the kernel answered each case (the run's answers for the members first): a case met again
        # while shrinking is the same question, and another answer is nondeterminism.
        answers = Answers()
        for k in members:
            if out[k].judgement is not None and items[k].case is not None:
                answers.heard(items[k].case, answer(out[k].judgement.output), f"{items[k].name} in the run")

        def fails_like(case, sig=sig, answers=answers):
            if stop():
                return                     # interrupted: every attempt "passes", the shrinker keeps its best
            try:
                verdict = judge(backend, case)
            except KernelFault:            # its worker ended or timed out: another bug, and no answer
                return
            except Exception as exc:  # noqa: BLE001 - another failure (the kernel raised): another bug
                answers.heard(case, raised(exc), "while shrinking")
                return
            answers.heard(case, answer(verdict.output), "while shrinking")
            if signature(verdict) == sig:
                raise _FailsLikeTheGroup(verdict)
        # Replay the draws that produced a member (properties/search/directed.py): Hypothesis meets a failure of
        # this signature again and shrinks it inside those draws' strategy. The plain draws when a member
        # came from them (nothing held fixed); else the first member's aim (its bin's parameter held).
        aims = [items[k].aim for k in members]
        if None in aims:
            raise ValueError(f"generated case(s) {[items[k].name for k in members if items[k].aim is None]} carry no "
                             "Aim: cases.data.collect.Item.aim must say which draws made a generated case")
        first = items[members[0]]
        found: Hunt[Case] = Hunt()
        if shrink_s > 0 and not why_not_shrunk and not stop():
            aim = next((a for a in aims if a.target is None), aims[0])
            found = hunt(aim.strategy(supported, distributions), fails_like, seed=aim.seed, examples=aim.draws,
                         shrink_s=shrink_s, shrink_calls=shrink_budget(backend), seeded=True)
        shrunk = found.error is not None
        if found.error is not None:
            # hunt keeps what its check raised with the example that raised it, and fails_like raises
            # only _FailsLikeTheGroup (any other failure returns)
            assert isinstance(found.error, _FailsLikeTheGroup) and found.example is not None
            case, judgement = found.example, found.error.verdict
        else:
            case, judgement = first.case, out[members[0]].judgement
        how = (f"shrunk by Hypothesis to B={case.config.batch} S1={case.config.s1} NQ={case.config.nq} "
               f"lengths={list(case.config.lengths)}" if shrunk else
               f"{first.name} not shrunk ({why_not_shrunk})" if why_not_shrunk else
               f"{first.name} not shrunk (--shrink-seconds 0)" if shrink_s <= 0 else
               f"{first.name} not shrunk (it did not fail again)")
        unsteady = nondeterminism(answers, found, stop)
        if unsteady:
            how += f"; nondeterministic: {unsteady}"
        message = (judgement.message() if judgement is not None else out[members[0]].inputs_modified or "")
        exemplar = Exemplar(case=case, message=message, how=how, nondeterministic=unsteady)
        diagnosis = None
        if judgement is not None and not why_not_shrunk:
            diagnosis = diagnosis_of(judgement, *split_bundle(case.inputs()), case=case, backend=backend, stop=stop)
        for k in members:
            out[k] = dataclasses.replace(out[k], exemplar=exemplar, diagnosis=diagnosis,
                                         diagnosis_note=", on the shrunk case" if shrunk else "")
    return out


def nondeterminism(answers: Answers, found: Hunt, stop) -> str | None:
    """How a group's kernel was seen to answer the same case differently while it was shrunk (None: it
    was not): another answer to a case it answered before, or Hypothesis' final replay of the smallest
    failure passing (Flaky; not counted once ``stop()`` names a signal, which makes every attempt pass).
    Either only ever keeps a capture (``cases prune`` keeps what is marked), so a doubtful sighting marks."""
    seen = [answers.seen()]
    if found.unreliable and not stop():
        seen.append(f"Hypothesis replayed the smallest failure and it passed ({found.unreliable})")
    return "; ".join(s for s in seen if s) or None


def probe_groups(backend, items: list, results: list, *, stop=None) -> list:
    """``results`` with the probes of properties/diagnosis/probes.py run once per group of diagnosed failures that
    were not generated (catalog cases and regressions, grouped by :func:`signature`: one bug, one group):
    on the member of the smallest case, within the probes' budget of kernel calls, and given to every
    member (each keeps its own candidates; the note names the case the probes ran on). A member's candidate
    that does not explain that smallest case is refuted by it (one bug, one group: a name that fits one
    member and not the smallest is no name). A generated failure already carries its group's probes
    (:func:`capture_generated`)."""
    stop = stop or (lambda: None)
    groups: dict = {}
    for k, (item, verdict) in enumerate(zip(items, results, strict=True)):
        d = verdict.diagnosis
        if d is not None and not d.probe_note and item.source != "generated" and item.case is not None:
            groups.setdefault(signature(verdict), []).append(k)
    out = list(results)
    for members in groups.values():
        if stop():
            break
        first = min(members, key=lambda k: (items[k].case.config.estimated_bytes(), k))
        probed = probe(out[first].diagnosis, items[first].case, backend, stop=stop)
        on_first = {c.model: c for c in probed.candidates}
        for k in members:
            if k == first:
                out[k] = dataclasses.replace(out[k], diagnosis=probed)
                continue
            own = out[k].diagnosis
            # One bug, one group: a candidate that explains this case but was scored on the group's smallest
            # case and does not explain it there is refuted by that case, as by a probe (no kernel call: the
            # run made it). Not scored there (it did not apply, or the budget ended first): no evidence.
            against = tuple(c.model for c in own.leading
                            if (there := on_first.get(c.model)) is not None and not there.explains)
            same = (Probe(f"the same failure on {items[first].name} (this run's case)", "fails", against),) if against else ()
            out[k] = dataclasses.replace(out[k], diagnosis=own.with_probes(
                same + probed.probes, f"{probed.probe_note}, on neighbours of {items[first].name}", probed.located))
    return out


def probe_errors(backend, items: list, results: list, *, stop=None) -> list:
    """``results`` with the diagnosis of each group of kernel errors (properties/diagnosis/error_probes.py: the kernel
    on neighbours of the case, what the error needs), grouped by what was raised (its first line, numbers
    aside: one bug, one group), run once on the member of the smallest case and given to every member (the
    note names it). A captured law's replay that raised is not probed (it raised on the law's own case)."""
    stop = stop or (lambda: None)
    groups: dict = {}
    for k, (item, verdict) in enumerate(zip(items, results, strict=True)):
        error = verdict.error
        # a captured law's replay raised on that law's changed case, not on item.case: not probed here
        if (error is not None and error.kind == "kernel" and verdict.diagnosis is None and item.record is None
                and item.case is not None and hasattr(item.case, "config")):
            first_line = (error.message.strip().splitlines() or [""])[0]
            groups.setdefault(re.sub(r"\d+", "N", first_line), []).append(k)
    out = list(results)
    codec = golden.get_codec(getattr(backend, "codec", None))
    for members in groups.values():
        if stop():
            break
        first = min(members, key=lambda k: (items[k].case.config.estimated_bytes(), k))
        found = probe_error(items[first].case, backend, out[first].error.message, codec=codec, stop=stop)
        for k in members:
            out[k] = dataclasses.replace(out[k], diagnosis=found,
                                         diagnosis_note="" if k == first else f", on neighbours of {items[first].name}")
    return out
