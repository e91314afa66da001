"""Failures that fail alike: one group, one capture, one report block.

After a run has judged, diagnosed and probed its cases, every counted failure and every error joins a
:class:`FailureGroup` by its key (:func:`alike`), catalog, generated and regression cases alike:

- a failure of the acceptance rule whose diagnosis names a fault model (properties.diagnosis.diagnosis.Diagnosis.
  identified): the rule's category and that model. The name is the evidence that two cases share one bug;
- one no model names: the category and where the mismatches concentrate (cases.running.shrink.signature,
  as generated failures are shrunk), which the attribution decides, not the diagnosis' time budget;
- a changed input: the rule's message about it (which input), numbers and the case's tags aside;
- an error the kernel raised or its worker met: its kind and whole message with every number made N
  (``index 129`` and ``index 7`` are one bug; two different messages are two groups);
- a captured law's replay that fails, a ledger entry that no longer fails, a case file that cannot be
  loaded: a group of its own (each is already one specific finding).

A group's capture is its smallest case (``config.estimated_bytes()``; a generated group shrunk by
Hypothesis offers its shrunk case): written once, with the group named in its message, and given to
every member. A group holding a captured regression writes nothing new: that file is its capture.
The member the reports show for the group is the one its capture came from (its diagnosis is of that
case); errors are grouped, never captured (a raise is replayed by its case), and show their smallest.
"""
from __future__ import annotations

import dataclasses
import re

from pfa_verify.cases.running.capture import capture_case
from pfa_verify.cases.running.shrink import signature
from pfa_verify.cases.running.verdict import Capture, CaseVerdict, Exemplar, FailureGroup

__all__ = ["alike", "group_failures"]


def _normalised(text: str) -> str:
    """``text`` with bracketed tags ("[case x, backend y]") dropped and every number made N."""
    return re.sub(r"\d+", "N", re.sub(r"\s*\[[^\]]*\]", "", text)).strip()


def alike(verdict: CaseVerdict) -> tuple[tuple, str] | None:
    """``(key, the same in words)`` of a counted failure or an error (the module docstring), or None."""
    if verdict.error is not None:
        if verdict.error.kind == "case file":
            return ("case", verdict.name), f"case file {verdict.name} cannot be loaded"
        said = _normalised(verdict.error.message)
        return ("error", verdict.error.kind, said), f"{verdict.error.kind} error: {said.splitlines()[0][:120]}"
    if not verdict.failed:
        return None
    if verdict.ledger_broken is not None or verdict.law is not None:
        return ("case", verdict.name), f"{verdict.name} alone"
    if verdict.inputs_modified is not None:
        said = _normalised(verdict.inputs_modified.splitlines()[0])
        return ("inputs modified", said), f"an input changed: {said}"
    category, where = signature(verdict) or ("kernel logic", "unattributed")
    d = verdict.diagnosis
    if d is not None and d.identified is not None:
        return ("model", category, d.identified.model), f"{category}; the diagnosis names {d.identified.model}"
    # not the closest model or a located stage: they hang on the diagnosis' time budget, the group must not
    return ("signature", category, where), f"{category}, mismatches in {where}; no model named"


def _exemplar(item, verdict: CaseVerdict) -> Exemplar | None:
    """What a member offers as its group's capture: a generated member's shrunk case (set by
    cases.running.shrink.capture_generated), else its own case as it ran."""
    if verdict.exemplar is not None:
        return verdict.exemplar
    if item.case is None or not hasattr(item.case, "config"):
        return None
    message = verdict.judgement.message() if verdict.judgement is not None else verdict.inputs_modified
    return None if message is None else Exemplar(case=item.case, message=message, how=f"{verdict.name} as it ran")


def _size(exemplar: Exemplar) -> int:
    return exemplar.case.config.estimated_bytes()


def group_failures(items: list, results: list, *, backend_name: str, capture: bool, regressions_dir) -> list:
    """``results`` (cases.running.verdict.CaseVerdict, one per item) with every counted failure and error
    in its :class:`FailureGroup` (numbered in run order) and every failure captured once per group (the
    module docstring): new copies, verdicts unchanged."""
    keyed: dict[tuple, list[int]] = {}
    words: dict[tuple, str] = {}
    for k, verdict in enumerate(results):
        found = alike(verdict)
        if found is not None:
            keyed.setdefault(found[0], []).append(k)
            words.setdefault(*found)
    out = list(results)
    for number, (key, members) in enumerate(keyed.items(), start=1):
        names = tuple(out[k].name for k in members)
        captured: Capture | None = None
        how, shown = "", min(members, key=lambda k: (_size_of(items[k]), k))
        if key[0] not in ("error", "case"):
            captured, how, source = _capture(items, out, members, names, words[key], backend_name=backend_name,
                                             capture=capture, regressions_dir=regressions_dir)
            shown = shown if source is None else source
        group = FailureGroup(number=number, alike=words[key], members=names, shown=out[shown].name, how=how,
                             replay=None if captured is None else captured.replay)
        for k in members:
            own = out[k].capture if out[k].source == "regression" else None
            out[k] = dataclasses.replace(out[k], group=group, capture=own or captured or out[k].capture,
                                         exemplar=None)
    return out


def _size_of(item) -> int:
    config = getattr(item.case, "config", None)
    return config.estimated_bytes() if config is not None else 1 << 62


def _capture(items: list, out: list, members: list[int], names: tuple[str, ...], words: str, *, backend_name: str,
             capture: bool, regressions_dir) -> tuple[Capture | None, str, int | None]:
    """The group's one capture, how its case was chosen, and the member it came from (the one the reports
    show, so that its diagnosis and its replay are of the same case): a captured regression's own file
    when the group holds one, else the smallest exemplar, written with the group named in its message."""
    kept = [k for k in members if out[k].source == "regression" and out[k].capture is not None]
    if kept:
        k = min(kept, key=lambda k: (_size_of(items[k]), k))
        return out[k].capture, f"the captured case {items[k].name} is its capture", k
    offered: dict[int, tuple[Exemplar, list[int]]] = {}
    for k in members:
        if (exemplar := _exemplar(items[k], out[k])) is not None:
            offered.setdefault(id(exemplar), (exemplar, []))[1].append(k)
    if not offered:
        return None, "", None
    best, sources = min(offered.values(), key=lambda found: _size(found[0]))
    unsteady = "; ".join(dict.fromkeys(e.nondeterministic for e, _ in offered.values() if e.nondeterministic)) or None
    how = f"the smallest, {best.how}" if len(offered) > 1 else best.how
    note = f"{len(names)} case(s) fail alike ({words}): {', '.join(names)}; captured {how}"
    found = capture_case("acceptance", backend_name, best.case, best.message + "\n" + note, enabled=capture,
                         directory=regressions_dir, group=names, how=how, nondeterministic=unsteady)
    return found, how, min(sources, key=lambda k: (_size_of(items[k]), k))
