"""Diagnosis: which defect explains a failing case.

A red verdict says where a kernel's output differs from the golden; this module says *what* could make
it differ so. The candidates are the fault models of properties/diagnosis/fault_models.py: deviations of the golden,
functions of the case alone, each named by the SPEC §2 stage it changes.

:func:`diagnose` evaluates the models on the failing case's inputs, cheapest first, within a time budget,
and scores each against the kernel's output (properties/diagnosis/scoring.py: the one comparison core, SPEC §4's
tolerance around the model's output widened by the envelope's reach): how much of the mismatch it
*explains* (mismatched elements where the kernel lies within that of the model) and how much it *breaks*
(elements that matched the golden and do not match the model). Deterministic: the same case, backend output and budget give the same report
(the budget cuts the list at a model boundary).

One case cannot tell apart models that coincide on it (a shrunk case of lengths ``[0, 1]`` is as much
"one token short" as "batch 0's length"), so properties/diagnosis/probes.py runs the kernel on neighbours of the case
built to split the leading candidates, and a :class:`Probe` that a candidate does not explain refutes it.
A candidate is *identified* only when it explains every mismatch on the case and on every probe, and no
model of another stage does as well; otherwise the report says "not identified" and which comes closest.

Never a verdict: a diagnosis is rendered beside a failure the rule already decided.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from pfa_verify import golden
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.golden.envelope import AttentionEnvelope
from pfa_verify.properties.diagnosis.fault_models import FaultModel, fault_models
from pfa_verify.properties.diagnosis.readout import Location
from pfa_verify.properties.diagnosis.scoring import (
    CLOSE,
    EXPLAINS,
    Candidate,
    Slack,
    minus_one_reads,
    model_output,
    score,
    slack_of,
)
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import Judgement, Scalars, Tensors

__all__ = ["FaultModel", "Candidate", "Probe", "Diagnosis", "fault_models", "diagnose", "diagnose_verdict",
           "failing_codec", "EXPLAINS", "CLOSE", "DEFAULT_BUDGET_S"]

#: Seconds of model evaluation per case (the report says how many models ran within it). With the probes'
#: budget (properties/diagnosis/probes.py) a diagnosis stays within about 10 s on the upstream catalog's largest cases.
DEFAULT_BUDGET_S = 7.0
#: A case of more batches than this, and more visible work (tokens x query heads x D summed over the
#: batches) than SCREEN_WORK, is screened first: every model on a few of its batches, the best SCREEN_KEEP
#: on the whole case. The golden's cost grows with the tokens it gathers, so a sub-case of 3 of 16 batches
#: costs about 3/16 of the case (measured, one thread: 51 models on B=16, S2=8192, NKV=2 took 16 s unscreened).
SCREEN_BATCHES = 3
SCREEN_WORK = 50_000_000
SCREEN_KEEP = 8
#: The leading candidates scored again with their reads of -1 table entries known (_with_minus_one_reads).
MINUS_ONE_RESCORED = 3


@dataclasses.dataclass(frozen=True)
class Probe:
    """The kernel run on one neighbour of the diagnosed case (properties/diagnosis/probes.py): what was changed, what
    the kernel did there against the golden, and which candidates its output refutes (it does not lie
    within tolerance of the candidate's output wherever it differs from the golden, or the candidate
    breaks more than 1 - EXPLAINS of what matched)."""
    change: str                     # what differs from the diagnosed case: "kv_act_seqs [128] -> [127]"
    outcome: str                    # "fails", "passes" or "error" (the kernel raised: refutes nothing)
    refuted: tuple[str, ...] = ()
    detail: str = ""                # the mismatch count, or the error's first line

    def render(self) -> str:
        said = f"{self.change}: {self.outcome}" + (f" ({self.detail})" if self.detail else "")
        return said + (f", refutes {', '.join(self.refuted)}" if self.refuted else "")

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "outcome": self.outcome, "refuted": list(self.refuted), "detail": self.detail}


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The best candidates (best first), how many models were evaluated and in how long, the budget, the
    codec the failing comparison used, and the probes run on neighbours of the case (properties/diagnosis/probes.py)."""
    candidates: tuple[Candidate, ...]
    evaluated: int
    available: int
    seconds: float
    budget_s: float
    codec: str = golden.SPEC_CODEC.name     # the failing comparison's codec, by golden.get_codec's name
    probes: tuple[Probe, ...] = ()
    probe_note: str = ""            # the probes' cost and budget, or why none ran
    screened: str = ""              # how the models were screened on a sub-case ("": every one on the case)
    failing_batches: tuple[int, ...] = ()   # the batches with a mismatched element, first first
    located: Location | None = None          # what the readouts measured (properties/diagnosis/readout.py, scale_readout.py)
    error: str = ""                 # the first line of what the kernel raised: the diagnosis of an error is its
                                    # probes alone (properties/diagnosis/error_probes.py)

    @property
    def refuted(self) -> frozenset[str]:
        """The candidates a probe refuted."""
        return frozenset(name for p in self.probes for name in p.refuted)

    @property
    def standing(self) -> tuple[Candidate, ...]:
        """The candidates no probe refuted, best first."""
        return tuple(c for c in self.candidates if c.model not in self.refuted)

    @property
    def leading(self) -> tuple[Candidate, ...]:
        """The candidates that explain the failure on the case (what the probes set out to tell apart)."""
        return tuple(c for c in self.candidates if c.explains)

    @property
    def identified(self) -> Candidate | None:
        """The candidate the evidence names, or None. It explains every mismatched element (and breaks at
        most 1 - EXPLAINS of the matching ones), no probe refuted it, and every rival that is not refuted
        and explains the failure as well changes the same SPEC stage (models alike on this evidence: the
        stage is named, the models listed). A rival of another stage still standing, or a best that leaves
        a mismatch unexplained, is no name."""
        standing = self.standing
        if not standing:
            return None
        best = standing[0]
        if not best.explains_every_mismatch:
            return None
        if any(c.explains and c.stage != best.stage for c in standing[1:]):
            return None
        return best

    @property
    def close(self) -> tuple[Candidate, ...]:
        """The standing candidates that come close: they explain at least CLOSE of the mismatch and break at
        most 1 - CLOSE of the matching elements, at least half of it by predicted values (not by reads of
        unspecified data); the most explained by predicted values net of what they break first. A model
        that explains every mismatch by breaking nearly everything else (a row written as 0 "explains" a
        row that is wrong) is no clue to what the kernel does, and is not shown as one."""
        close = [c for c in self.standing if c.explained_share >= CLOSE and c.broken_share <= 1 - CLOSE
                 and 2 * c.unspecified <= c.explained]
        return tuple(sorted(close, key=lambda c: -(c.definite_share - c.broken_share)))

    @property
    def closest(self) -> Candidate | None:
        """The identified candidate, else the first that comes close (:attr:`close`), else None."""
        return self.identified or next(iter(self.close), None)

    @property
    def explained(self) -> bool:
        return self.identified is not None

    def with_probes(self, probes: tuple[Probe, ...], note: str, located: Location | None = None) -> Diagnosis:
        return dataclasses.replace(self, probes=self.probes + probes, probe_note=note,
                                   located=located if located is not None else self.located)

    @property
    def stage(self) -> str | None:
        """The stage the diagnosis names first: the identified model's, else the one the weights readout
        located, else None (a closest model is a clue, not a name)."""
        if self.identified is not None:
            return self.identified.stage
        return None if self.located is None else self.located.stage

    def render(self, top: int = 3, note: str = "") -> str:
        """One line: the model that explains the failure, or that none is identified and the closest; at most
        ``top`` candidates named, the others counted; the probes and what they refuted; ``note`` ends the
        cost in parentheses (which case the models ran on)."""
        if self.error:
            probes = "; ".join(p.render() for p in self.probes)
            where = f"; located in {self.located.stage} by {self.located.evidence}" if self.located else ""
            return (f"Diagnosis of the error ({self.error}): no output to score models against; "
                    + (f"the kernel on neighbours of the case: {probes}" if probes else "no neighbour ran")
                    + f"{where} ({self.probe_note}{note})")
        if not self.candidates:
            return f"Diagnosis: no fault model applies to this case ({self._cost()}{note})"

        def one(c: Candidate) -> str:
            return (f"{c.model} [{c.stage}] explains {c.explained}/{c.mismatched} mismatches, breaks "
                    f"{c.broken}/{c.matching} matching elements")
        standing = self.standing or self.candidates
        best = standing[0]
        fitting = [c for c in standing[1:] if c.explains]
        if self.identified is not None:
            # Models of the same stage that explain it as well cannot be told apart here: named, not ranked.
            alike = fitting[:top - 1]
            head = f"Diagnosis: {one(best)}: {best.description}"
            head += (f"; alike on this evidence (the same stage): {', '.join(c.model for c in alike)}"
                     if alike else "")
            shown = 1 + len(alike)
        elif fitting and any(c.stage != best.stage for c in fitting):
            rivals = fitting[:top - 1]
            head = ("Diagnosis: not identified: models of different stages explain this failure alike: "
                    + "; ".join(f"{c.model} [{c.stage}] {c.explained_share:.0%} explained, {c.broken_share:.0%} broken"
                                for c in [best, *rivals]))
            shown = 1 + len(rivals)
        else:
            what = ("every model that explains the case is refuted by a probe" if not self.standing
                    else "no fault model explains this failure")
            closest = self.closest
            if closest is None:
                head = (f"Diagnosis: not identified: {what}, and none comes close (none explains half the mismatches "
                        f"while breaking at most half the matching elements)")
                shown = 0
            else:
                rest = [c for c in self.close if c is not closest][:top - 1]
                head = f"Diagnosis: not identified: {what}; closest: {one(closest)}"
                head += ("; next: " + "; ".join(f"{c.model} {c.explained_share:.0%} explained, {c.broken_share:.0%} "
                                                "broken" for c in rest)) if rest else ""
                shown = 1 + len(rest)
        if self.identified is None and self.located is not None:
            head += (f"; located in {self.located.stage} by {self.located.evidence}" if self.located.stage
                     else f"; no stage located by {self.located.evidence}")
        more = len(standing) - shown
        tail = f"; {more} more model{'s' if more != 1 else ''} not shown" if more > 0 else ""
        refuted = [c.model for c in self.candidates if c.model in self.refuted]
        if self.probes:
            tail += "; probes: " + "; ".join(p.render() for p in self.probes)
        if refuted:
            tail += f"; refuted by the probes: {', '.join(refuted[:top])}" + (
                f" and {len(refuted) - top} more" if len(refuted) > top else "")
        return head + tail + f" ({self._cost()}{note})"

    def _cost(self) -> str:
        cut = f", budget {self.budget_s:g} s reached" if self.evaluated < self.available else ""
        screened = f", {self.screened}" if self.screened else ""
        probes = f"; {self.probe_note}" if self.probe_note else ""
        return f"{self.evaluated} of {self.available} models in {self.seconds:.1f} s{screened}{cut}{probes}"

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        """The record of the JSON report: the best ``top`` candidates, and the closest after them when it
        ranks lower (so that its stage can be read)."""
        closest = self.closest
        shown = list(self.candidates[:top])
        if closest is not None and closest not in shown:
            shown.append(closest)
        return {"explained": self.explained, "identified": None if self.identified is None else self.identified.model,
                "closest": None if closest is None else closest.model,
                "candidates": [c.to_dict() | {"refuted": c.model in self.refuted} for c in shown],
                "evaluated": self.evaluated, "available": self.available, "seconds": round(self.seconds, 2),
                "budget_s": self.budget_s, "screened": self.screened, "probes": [p.to_dict() for p in self.probes],
                "probe_note": self.probe_note, "stage": self.stage,
                "located": None if self.located is None else self.located.to_dict(), "error": self.error or None}


def _screen_batches(mismatch: torch.Tensor, tensors: Tensors) -> list[int] | None:
    """The batches a large case is screened on (:data:`SCREEN_BATCHES` of them: batch 0, which the
    batch-0 models read, the first batch holding a mismatch and its successor, else the next ones), or
    None when the case is small enough for every model on it."""
    lengths = tensors["kv_act_seqs"]
    batch = int(lengths.shape[0])
    q = tensors["q"]
    if batch <= SCREEN_BATCHES or int(lengths.clamp(min=0).sum()) * q.shape[1] * q.shape[2] <= SCREEN_WORK:
        return None
    failing = mismatch.reshape(batch, -1).any(dim=1).nonzero().flatten().tolist()
    first = failing[0] if failing else 0
    chosen = [0, first, first + 1, *range(1, batch)]
    return sorted(list(dict.fromkeys(b for b in chosen if b < batch))[:SCREEN_BATCHES])


def _rows_of(tensors: Tensors, batches: list[int]) -> torch.Tensor:
    """The output (and q) rows b * S1 + i of ``batches``."""
    s1 = tensors["q"].shape[0] // int(tensors["kv_act_seqs"].shape[0])
    return torch.tensor([b * s1 + i for b in batches for i in range(s1)])


def _batches_of(tensors: Tensors, batches: list[int]) -> Tensors:
    """The case's tensors restricted to ``batches`` (the caches and K's scale shared: blocks are global)."""
    rows, index = _rows_of(tensors, batches), torch.tensor(batches)
    return {**tensors, "q": tensors["q"][rows], "q_scale": tensors["q_scale"][rows], "v_scale": tensors["v_scale"][index],
            "block_table": tensors["block_table"][index], "kv_act_seqs": tensors["kv_act_seqs"][index]}


def _rank(scored: list[tuple[Candidate, int]]) -> list[tuple[Candidate, int]]:
    return sorted(scored, key=lambda sc: (-sc[0].definite_share, -sc[0].explained_share, sc[0].broken_share, sc[1]))


def _with_minus_one_reads(scored: list[tuple[Candidate, int]], models: list[FaultModel], out: torch.Tensor,
                          mismatch: torch.Tensor, tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None,
                          slack: Slack | None, *, deadline: float) -> list[tuple[Candidate, int]]:
    """``scored`` (ranked, scored on the whole case) with the leading :data:`MINUS_ONE_RESCORED` candidates
    that explain half the mismatch but not all of it, or break a matching element, scored again with their
    reads of -1 table entries known (properties.diagnosis.scoring.minus_one_reads), while the budget lasts: a model
    that walks past a row's valid blocks predicts block 0 there, and a kernel with the defect need not read
    it. Where the kernel differs from the model at such a read, the element is unspecified instead of
    unexplained or broken; where it agrees, it stays predicted: a candidate only gains. Up to three more
    model calls each (its output, and on the table with its -1 entries pointed at a NaN block); a case
    whose table holds no -1 entry costs none."""
    if not bool((tensors["block_table"] < 0).any()):
        return scored
    by_name = {m.name: m for m in models}
    again = list(scored)
    for i, (c, cost) in enumerate(scored[:MINUS_ONE_RESCORED]):
        if time.perf_counter() > deadline:
            break
        if (c.explained == c.mismatched and not c.broken) or c.explained_share < CLOSE:
            continue
        model = by_name[c.model]
        faulty = model_output(model, tensors, scalars, codec)
        if faulty is None:
            continue
        wider = score(out, mismatch, minus_one_reads(model, faulty, tensors, scalars, codec), model, slack)
        if wider is not None:
            again[i] = (wider, cost)
    return again


def diagnose(out: torch.Tensor, expected: torch.Tensor, tensors: Tensors, scalars: Scalars, *,
             codec: Fp8Codec | str | None = None,
             budget_s: float = DEFAULT_BUDGET_S, models: list[FaultModel] | None = None,
             envelope: AttentionEnvelope | None = None) -> Diagnosis:
    """Score every fault model (``models``, default :func:`fault_models`) against the kernel's output ``out``
    on the case's inputs, within ``budget_s`` seconds; ``expected`` is the golden's output under ``codec``
    (the comparison that failed) and ``envelope`` its envelope, when one was built (the mismatch is then the
    rule's, and each model is scored with the envelope's slack, :func:`score`). Candidates come best first:
    most of the mismatch explained by predicted values, then most explained, then fewest matching elements
    broken, then the cheaper model. A large case (:data:`SCREEN_WORK`) is screened: every
    model on a few of its batches, the best :data:`SCREEN_KEEP` scored on the whole case (the report says so)."""
    models = fault_models() if models is None else models
    codec_name = golden.get_codec(codec).name
    bounds = None if envelope is None else (envelope.lo, envelope.hi)
    against_golden = cmp.compare(out, expected, kind="attention", envelope=bounds)
    if against_golden.attribute is not None:
        return Diagnosis((), 0, len(models), 0.0, budget_s, codec=codec_name)
    mismatch = against_golden.mismatch_mask
    assert mismatch is not None       # compare sets the mask whenever the attributes agree
    slack = slack_of(expected, envelope)
    start = time.perf_counter()
    screen = _screen_batches(mismatch, tensors)
    # (tensors, output, mismatch) each model is screened on, by its cost: the whole case, or a sub-case of the
    # screen's batches for a golden call and of the first of them that fails for a staged (loop) golden,
    # which costs some 60 ms per 8k-token batch and model (measured: 43 staged models on three batches of
    # pfa_fp8_b16_s1_1_s2_8195_nkv_2 took 8.5 s, on one 2.6 s, one thread on a loaded machine)
    sub: dict[int, tuple[Tensors, torch.Tensor, torch.Tensor, Slack | None]] = {}
    failing: list[int] = []
    if screen is None:
        sub = {1: (tensors, out, mismatch, slack), 2: (tensors, out, mismatch, slack)}
    else:
        failing = [b for b in screen if bool(mismatch[_rows_of(tensors, [b])].any())] or screen
        # a golden call on two batches (the first failing one and another: a batch mix-up still shows), the
        # staged golden on the first failing one: with 86 models, three batches of 8k tokens a golden call
        # left the staged models no time (33 of 86 scored in the first pass on pfa_fp8_b16_s1_1_s2_8k_nkv_2)
        pair = sorted({failing[0], next(b for b in screen if b != failing[0])})
        for cost, batches in ((1, pair), (2, failing[:1])):
            rows = _rows_of(tensors, batches)
            sub[cost] = (_batches_of(tensors, batches), out[rows], mismatch[rows],
                         None if slack is None else (slack[0][rows], slack[1][rows]))
    scored, evaluated = [], 0
    # Screening spends two thirds of the budget on the sub-cases (every model once), the rest on the whole
    # case (the best few again: a screened case is large).
    first_pass_s = budget_s if screen is None else budget_s * 2 / 3
    for model in models:
        if evaluated and time.perf_counter() - start > first_pass_s:   # at least one model, whatever the budget
            break
        evaluated += 1
        on, out_on, mismatch_on, slack_on = sub[min(model.cost, 2)]
        faulty = model_output(model, on, scalars, codec)
        if faulty is not None and (candidate := score(out_on, mismatch_on, faulty, model, slack_on)) is not None:
            scored.append((candidate, model.cost))
    scored = _rank(scored)
    screened = ""
    if screen is not None:
        by_name = {m.name: m for m in models}
        kept, scored, rescored = scored[:SCREEN_KEEP], [], 0
        for candidate, cost in kept:
            if rescored and time.perf_counter() - start > budget_s:
                break
            rescored += 1
            faulty = model_output(by_name[candidate.model], tensors, scalars, codec)
            if faulty is not None and (whole := score(out, mismatch, faulty, by_name[candidate.model], slack)) is not None:
                scored.append((whole, cost))
        scored = _rank(scored)
        screened = (f"screened on batches {screen} of {int(tensors['kv_act_seqs'].shape[0])} (the staged models on "
                    f"batch {failing[0]}), "
                    f"the best {rescored} scored on the whole case" + (f" (of {len(kept)}: budget reached)" if rescored < len(kept) else ""))
    scored = _rank(_with_minus_one_reads(scored, models, out, mismatch, tensors, scalars, codec, slack,
                                         deadline=start + budget_s))
    rows = mismatch.reshape(mismatch.shape[0], -1).any(dim=-1).nonzero()[:, 0]
    s1 = int(tensors["q"].shape[0]) // max(int(tensors["kv_act_seqs"].shape[0]), 1)
    failing_batches = tuple(dict.fromkeys((rows // max(s1, 1)).tolist()))
    return Diagnosis(tuple(c for c, _ in scored), evaluated, len(models), time.perf_counter() - start, budget_s,
                     codec=codec_name, screened=screened, failing_batches=failing_batches)


def failing_codec(verdict: Judgement) -> Fp8Codec | None:
    """The codec of a failed Judgement's first counted failing comparison; None when nothing counted failed
    or the failure is not one of values (shape, dtype or non-finite placement: the message already says what)."""
    failing = [r for r in verdict.references if r.counts and not r.passed]
    if not failing or failing[0].comparison.attribute is not None:
        return None
    return golden.SPEC_CODEC if failing[0].reference == "spec" else golden.get_codec(failing[0].reference)


def diagnose_verdict(verdict: Judgement, tensors: Tensors, scalars: Scalars, *,
                     budget_s: float = DEFAULT_BUDGET_S) -> Diagnosis | None:
    """:func:`diagnose` of a failed properties.rule.acceptance.Judgement, on its first counted failing comparison
    under that comparison's codec (:func:`failing_codec`); None when that says there is none."""
    codec = failing_codec(verdict)
    if codec is None:
        return None
    ref = next(r for r in verdict.references if r.counts and not r.passed)
    return diagnose(verdict.output, ref.expected, tensors, scalars, codec=codec, budget_s=budget_s,
                    envelope=ref.envelope)
