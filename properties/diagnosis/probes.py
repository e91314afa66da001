"""Probes: the kernel run on neighbours of a diagnosed case, to tell the leading fault models apart.

One case cannot separate models that coincide on it: a case shrunk to ``kv_act_seqs=[0, 1]`` is as much
"every batch walks one token less" as "every batch walks batch 0's length", and a row of exactly one full
tile is as much "the last tile is dropped when full" as "the table column is read one too early". The
probes change the case the way those hypotheses differ (SPEC §2's quantities, one at a time): a length to
or from a multiple of s2_tile, one tile against two, a second batch with another length, the batches'
lengths in the other order, one more KV head, one more query row, other data.

A neighbour is run on the kernel only when it *splits* the hypotheses: the leading candidates and the
golden (the defect need not show on every case) do not all predict outputs that agree with one another
under the diagnosis' rule (:func:`properties.diagnosis.scoring.score`). Neighbours that split the candidates among
themselves come first; one that only tests a candidate against the golden comes after. On a probe, a
candidate the kernel's output does not agree with is refuted (properties.diagnosis.diagnosis.Probe); an error of the
kernel refutes nothing. The probes go on while the budget lasts, also once one candidate is left: models
coincide on more cases than one (a kernel that writes 0 agrees with "every batch walks batch 0's length"
wherever batch 0 is empty), and a model is only as good as the neighbours it survived. Bounded by ``max_calls`` kernel calls and ``budget_s`` seconds (models and kernel),
both stated in the diagnosis.

When no model explains the failure there is nothing to split: the kernel then runs the readouts, which
measure instead of guessing (properties/diagnosis/scale_readout.py: the v_scale entry each output element carries;
properties/diagnosis/readout.py: each row's attention weights), and ablations of the case (properties/diagnosis/ablations.py:
every V token the same, every score 0, unit scales, one batch), to show what the failure needs; each
says fails or passes and refutes nothing. The other ablations join the neighbours above. A failure whose
candidates the neighbours leave unnamed gets the readouts too, in the calls left.

Never a verdict: a probe's outcome only weighs the candidates of a failure the rule already decided.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from pfa_verify import golden
from pfa_verify.properties.diagnosis.ablations import ablations, replaced_config, with_lengths
from pfa_verify.properties.diagnosis.diagnosis import SCREEN_BATCHES, SCREEN_WORK, Diagnosis, Probe
from pfa_verify.properties.diagnosis.fault_models import FaultModel, models_by_name
from pfa_verify.properties.diagnosis.readout import Location, Readout, locate, readout_case
from pfa_verify.properties.diagnosis.scale_readout import ScaleReading, combine, read_scales, scale_readout_case
from pfa_verify.properties.diagnosis.scoring import (
    EXPLAINS,
    Candidate,
    Prediction,
    Slack,
    minus_one_reads,
    model_output,
    score,
    slack_of,
)
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import (
    JudgedBackend,
    Scalars,
    Tensors,
    backend_model,
    call,
    rule,
    split_bundle,
)
from pfa_verify.properties.rule.case import Case

__all__ = ["probe", "neighbours", "probed_case", "kernel_probe", "golden_output", "outcome_probes", "EVIDENCE",
           "MAX_CALLS", "PROBE_BUDGET_S", "MAX_HYPOTHESES", "READOUT_CALLS"]

#: Kernel calls per diagnosed failure group (on the sim a kernel call costs seconds: at most 4 of them).
MAX_CALLS = 4
#: Seconds of probing per diagnosed failure: model evaluations on the neighbours and the kernel calls.
PROBE_BUDGET_S = 3.0
#: Kernel calls the weights readout may take (properties/diagnosis/readout.py: one a window of 125 tokens).
READOUT_CALLS = 4
#: The leading candidates probed (the best that explain the case; the rest are counted, not tested).
MAX_HYPOTHESES = 6


def _agrees(c: Candidate | None) -> bool:
    """A candidate agrees with an output when it explains every mismatch and breaks at most 1 - EXPLAINS
    of the matching elements (by values it predicts: properties.diagnosis.scoring.score). Unlike the identification
    rule it does not ask that half be predicted: a probe refutes only on evidence against, and a read of
    unspecified data there is none, whether the kernel's element there fails the rule or passes it (a
    kernel that walks a -1 column may read the block the golden clamps it to, or another)."""
    return c is not None and c.explained == c.mismatched and c.broken_share <= 1 - EXPLAINS


def neighbours(case: Case) -> Iterator[tuple[str, Case]]:
    """(what changed, the neighbour) of ``case``, SPEC §2's quantities one at a time, each config once
    (the neighbours carry the case's seed and none of its explicit tensors)."""
    c = case.config
    lengths, tile = list(c.lengths), c.s2_tile
    seen = {(c, case.seed)}

    def out(change: str, near: golden.PagedAttentionConfig | None, seed: int = case.seed) -> Iterator[tuple[str, Case]]:
        if near is not None and (near, seed) not in seen:
            seen.add((near, seed))
            yield change, Case(near, seed=seed)

    def length(b: int, new: int) -> Iterator[tuple[str, Case]]:
        if new >= 0 and new != lengths[b]:
            changed = lengths[:b] + [new] + lengths[b + 1:]
            yield from out(f"kv_act_seqs[{b}] {lengths[b]} -> {new}", with_lengths(c, changed))

    for b in range(min(2, len(lengths))):
        n = lengths[b]
        if n and n % tile == 0:                                 # a full last tile, and a partial one
            yield from length(b, n - 1)
            yield from length(b, n + 1)
        else:
            yield from length(b, n - n % tile)
            yield from length(b, n - n % tile + tile)
    if len(lengths) == 1:                                       # a second batch, with another length
        other = lengths[0] // 2 + 1 if lengths[0] > 1 else lengths[0] + tile // 2 + 1
        yield from out(f"a second batch of kv_act_seqs {other}", with_lengths(c, [lengths[0], other]))
    elif len(set(lengths)) > 1:
        yield from out(f"kv_act_seqs {lengths} -> {lengths[::-1]}", with_lengths(c, lengths[::-1]))
    else:
        yield from length(1, lengths[1] // 2 + 1 if lengths[1] > 1 else lengths[1] + tile // 2 + 1)
    for b in range(min(2, len(lengths))):                      # one tile against two
        n = lengths[b]
        yield from length(b, n + tile if n <= tile else (n - 1) % tile + 1)
    yield from length(0, lengths[0] + 1)
    yield from length(0, lengths[0] - 1)
    group = c.nq // c.nkv
    yield from out(f"nkv {c.nkv} -> {c.nkv + 1}", replaced_config(c, nkv=c.nkv + 1, nq=(c.nkv + 1) * group))
    yield from out(f"s1 {c.s1} -> {c.s1 + 1}", replaced_config(c, s1=c.s1 + 1))
    if c.s1 > 1:
        yield from out(f"s1 {c.s1} -> {c.s1 - 1}", replaced_config(c, s1=c.s1 - 1))
    yield from out(f"seed {case.seed} -> {case.seed + 1}", c, seed=case.seed + 1)


def probed_case(case: Case) -> Case:
    """The case whose neighbours are probed: ``case``, or for a case the diagnosis screens (more than
    SCREEN_BATCHES batches and SCREEN_WORK of work) the case of its first SCREEN_BATCHES batches' lengths,
    so that a probe costs what a screened model does, not a whole upstream case (measured: making one
    neighbour of pfa_fp8_b16_s1_1_s2_8k_nkv_2, its inputs, golden and candidates, took over 2 s)."""
    c = case.config
    if c.batch <= SCREEN_BATCHES or sum(c.lengths) * c.nq * c.head_dim <= SCREEN_WORK:
        return case
    smaller = with_lengths(c, list(c.lengths[:SCREEN_BATCHES]))
    return case if smaller is None else Case(smaller, seed=case.seed)


@dataclasses.dataclass
class _Neighbour:
    change: str
    case: Case
    tensors: Tensors
    scalars: Scalars
    expected: torch.Tensor
    predicted: dict[str, Prediction]        # candidate -> its output here (absent: the model does not apply)


def _refuted_by(out: torch.Tensor, n: _Neighbour, names: list[str], models: dict[str, FaultModel], *,
                judged: tuple[cmp.Comparison, Slack | None] | None = None) -> list[str]:
    """The candidates among ``names`` an output ``out`` on the neighbour does not agree with: ``judged`` is
    the rule's comparison of a kernel's ``out`` there and its slack (:func:`_judged`); without it (a model's
    predicted output) the tolerance alone."""
    res, slack = judged if judged is not None else (cmp.compare(out, n.expected, kind="attention"), None)
    mismatch = res.mismatch_mask
    if mismatch is None:            # another shape or non-finite placement: no candidate's values explain it
        return [name for name in names if name in n.predicted]
    return [name for name in names if name in n.predicted
            and not _agrees(score(out, mismatch, n.predicted[name], models[name], slack))]


def _judged(out: torch.Tensor, tensors: Tensors, scalars: Scalars, expected: torch.Tensor, codec: golden.Fp8Codec,
            backend: JudgedBackend) -> tuple[cmp.Comparison, Slack | None]:
    """The rule's comparison of the kernel's ``out`` on a probe (properties.rule.acceptance.rule: the envelope
    built for the rows outside the tolerance) and the slack it gives the candidates there."""
    by_name: dict[str, Any] = tensors    # mypy cannot match a dict's keys to the tensor parameters
    res, envelope = rule(out, expected, golden.checked_call(**by_name, **scalars), codec=codec,
                         model=backend_model(backend))
    return res, slack_of(expected, envelope)


def _splits(n: _Neighbour, names: list[str], models: dict[str, FaultModel], *, with_golden: bool) -> bool:
    """Whether some hypothesis' output on ``n`` would refute another: the candidates among themselves, or
    (``with_golden``) also the golden's output, a kernel whose defect does not show there."""
    outcomes = [n.predicted[name].output for name in names if name in n.predicted]
    if with_golden:
        outcomes.append(n.expected)
    return any(_refuted_by(o, n, names, models) for o in outcomes)


def golden_output(tensors: Tensors, scalars: Scalars, codec: golden.Fp8Codec) -> torch.Tensor:
    """The golden's output on a neighbour, under the failing comparison's codec."""
    by_name: dict[str, Any] = tensors    # mypy cannot match a dict's keys to the tensor parameters
    with torch.inference_mode():
        return golden.paged_attention_fp8(**by_name, **scalars, codec=codec)


def kernel_probe(backend: JudgedBackend, change: str, tensors: Tensors, scalars: Scalars, expected: torch.Tensor,
                 codec: golden.Fp8Codec) -> tuple[torch.Tensor | None, Probe, tuple[cmp.Comparison, Slack | None] | None]:
    """(the kernel's output, the probe with its outcome by the rule against ``expected``, no refutation yet,
    and the rule's comparison with its slack), or (None, the probe of its error, None): the kernel is
    untrusted, and an error on a probe refutes nothing."""
    try:
        out = call(backend, tensors, **scalars)
    except Exception as exc:  # noqa: BLE001 - whatever the kernel raised is what it did there
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, Probe(change, "error", detail=f"{type(exc).__name__}: {first}"[:160]), None
    judged = _judged(out, tensors, scalars, expected, codec, backend)
    res = judged[0]
    return out, Probe(change, "passes" if res.passed else "fails",
                      detail="" if res.passed else f"{res.mismatched}/{res.total} mismatched"), judged


def probe(diagnosis: Diagnosis, case: Case, backend: JudgedBackend, *, max_calls: int = MAX_CALLS,
          budget_s: float = PROBE_BUDGET_S, stop: Callable[[], object] | None = None) -> Diagnosis:
    """``diagnosis`` (made on ``case``) with the probes run on ``backend``, at most ``max_calls`` kernel calls
    and about ``budget_s`` seconds (a neighbour started is finished); ``stop()`` true ends them at once."""
    if max_calls < 0 or isinstance(max_calls, bool) or not isinstance(max_calls, int):
        raise ValueError(f"max_calls={max_calls!r} must be an int >= 0")
    if not (isinstance(budget_s, (int, float)) and budget_s >= 0):
        raise ValueError(f"budget_s={budget_s!r} must be a number >= 0")
    stop = stop or (lambda: None)
    leading = [c.model for c in diagnosis.leading][:MAX_HYPOTHESES]
    if max_calls == 0:
        return diagnosis.with_probes((), "no probes (a budget of 0 kernel calls)")
    if not leading:
        return _what_it_needs(diagnosis, probed_case(case), backend, max_calls=max_calls, budget_s=budget_s, stop=stop)
    models = models_by_name()
    codec = golden.get_codec(diagnosis.codec)
    skip_reason = getattr(backend, "skip_reason", None)
    start, probes, standing = time.perf_counter(), [], list(leading)
    later: list[_Neighbour] = []             # neighbours that test a candidate against the golden only

    def elapsed() -> float:
        return time.perf_counter() - start

    def run(n: _Neighbour) -> None:
        out, seen, judged = kernel_probe(backend, n.change, n.tensors, n.scalars, n.expected, codec)
        refuted = [] if out is None else _refuted_by(out, n, standing, models, judged=judged)
        probes.append(dataclasses.replace(seen, refuted=tuple(refuted)))
        standing[:] = [name for name in standing if name not in refuted]

    def budget_left() -> bool:
        return len(probes) < max_calls and elapsed() < budget_s and not stop() and bool(standing)

    base = probed_case(case)
    for change, near in itertools.chain(neighbours(base), ablations(base)):
        if not budget_left() or (later and elapsed() > budget_s / 2):
            break       # half the time left for the neighbours found that test a candidate against the golden
        if skip_reason is not None and skip_reason(near.config) is not None:
            continue                        # a shape the backend is not built for is no evidence
        tensors, scalars = split_bundle(near.inputs())
        expected = golden_output(tensors, scalars, codec)
        # Each candidate's reads of -1 entries known before the neighbour is chosen: a neighbour that
        # splits the candidates only where one reads a -1 entry splits nothing (scoring.minus_one_reads).
        predicted = {name: minus_one_reads(models[name], o, tensors, scalars, codec) for name in standing
                     if (o := model_output(models[name], tensors, scalars, codec)) is not None}
        n = _Neighbour(change, near, tensors, scalars, expected, predicted)
        if _splits(n, standing, models, with_golden=False):
            run(n)
        elif len(later) < max_calls and _splits(n, standing, models, with_golden=True):
            later.append(n)
    for n in later:
        if not budget_left():
            break
        if _splits(n, standing, models, with_golden=True):
            run(n)
    located = None
    calls_left = min(max_calls - len(probes), READOUT_CALLS)
    if (calls_left > 0 and elapsed() < budget_s and not stop()
            and diagnosis.with_probes(tuple(probes), "").identified is None):
        read, located = _read_both(diagnosis, base, backend, calls=calls_left, stop=stop, deadline=start + budget_s)
        probes.extend(read)
    note = (f"{len(probes)} probe{'s' if len(probes) != 1 else ''} in {elapsed():.1f} s "
            f"(budget {max_calls} kernel calls, {budget_s:g} s)"
            + (f", on neighbours of the case's first {base.config.batch} batches" if base is not case else ""))
    if not probes:
        note = f"no probe: no neighbour tells the candidates apart within the budget ({elapsed():.1f} s)"
    return diagnosis.with_probes(tuple(probes), note, located)


#: The ablations run when no model explains a failure, in this order (properties/diagnosis/ablations.py): whether
#: the failure needs the weights, the scores, the scales, more than one batch.
EVIDENCE = ("V constant", "scores 0", "unit scales", "one batch")


def _what_it_needs(diagnosis: Diagnosis, base: Case, backend: JudgedBackend, *, max_calls: int, budget_s: float,
                   stop: Callable[[], object]) -> Diagnosis:
    """``diagnosis`` (no model explains it) with the kernel run on :data:`EVIDENCE`'s ablations of ``base``:
    which parts of SPEC §2 its failure needs (one that passes when every V token is the same needs the
    weights, not V's scale or the output), within ``max_calls`` kernel calls and ``budget_s`` seconds.
    Nothing is refuted: there is no candidate."""
    codec = golden.get_codec(diagnosis.codec)
    start = time.perf_counter()
    read, located = _read_both(diagnosis, base, backend, calls=min(max_calls, READOUT_CALLS), stop=stop,
                               deadline=start + budget_s)
    probes = read + outcome_probes(backend, ablations(base, EVIDENCE), codec, calls=max_calls - len(read),
                                   deadline=start + budget_s, stop=stop)
    elapsed = time.perf_counter() - start
    if not probes:
        return diagnosis.with_probes((), f"no probes: no model explains the case, and no ablation applies ({elapsed:.1f} s)")
    ablated = len(probes) - len(read)
    return diagnosis.with_probes(tuple(probes), (
        f"no model explains the case: {len(probes)} probe{'s' if len(probes) != 1 else ''} in {elapsed:.1f} s to show "
        f"what the failure needs ({len(read)} readout call{'s' if len(read) != 1 else ''}, {ablated} "
        f"ablation{'s' if ablated != 1 else ''}; budget {max_calls} kernel calls, {budget_s:g} s)"), located)


def outcome_probes(backend: JudgedBackend, cases: Iterable[tuple[str, Case]], codec: golden.Fp8Codec, *, calls: int,
                   deadline: float, stop: Callable[[], object]) -> list[Probe]:
    """The kernel on ``cases`` ((what changed, the case), in order) while ``calls`` kernel calls and the
    ``deadline`` (time.perf_counter) last: each probe says what it did there by the rule (fails, passes or
    error) and refutes nothing; a shape the backend refuses is skipped."""
    skip_reason = getattr(backend, "skip_reason", None)
    probes: list[Probe] = []
    for change, near in cases:
        if len(probes) >= calls or time.perf_counter() > deadline or stop():
            break
        if skip_reason is not None and skip_reason(near.config) is not None:
            continue
        tensors, scalars = split_bundle(near.inputs())
        probes.append(kernel_probe(backend, change, tensors, scalars, golden_output(tensors, scalars, codec), codec)[1])
    return probes


def _read_both(diagnosis: Diagnosis, base: Case, backend: JudgedBackend, *, calls: int,
               stop: Callable[[], object], deadline: float) -> tuple[list[Probe], Location | None]:
    """(the probes, what the readouts located together, properties.diagnosis.scale_readout.combine) in at most
    ``calls`` kernel calls: the V-scale readout (one call) and then the weights readout in the calls left,
    unless the weights readout needs every call to read a failing batch (it then runs alone)."""
    batches = [b for b in diagnosis.failing_batches if b < base.config.batch]
    fewer = readout_case(base, batches, max_calls=calls - 1) if calls >= 2 else None
    every = readout_case(base, batches, max_calls=calls) if calls >= 1 and fewer is None else fewer
    weights_alone = fewer is None and every is not None
    probes, scales = ([], None) if weights_alone else _read_scales(diagnosis, base, backend, stop=stop, deadline=deadline)
    readout = every if weights_alone else fewer
    read, located = ([], None) if readout is None else _read_weights(diagnosis, readout, backend, stop=stop,
                                                                     deadline=deadline)
    return probes + read, combine(located, scales)


def _read_scales(diagnosis: Diagnosis, base: Case, backend: JudgedBackend, *, stop: Callable[[], object],
                 deadline: float) -> tuple[list[Probe], ScaleReading | None]:
    """(the probe, what the V-scale readout read) of ``base`` on ``backend`` in one kernel call
    (properties/diagnosis/scale_readout.py); no reading when it does not apply, is cut or the kernel errs."""
    readout = scale_readout_case(base)
    skip_reason = getattr(backend, "skip_reason", None)
    if (readout is None or stop() or time.perf_counter() > deadline
            or (skip_reason is not None and skip_reason(readout.case.config) is not None)):
        return [], None
    codec = golden.get_codec(diagnosis.codec)
    tensors, scalars = split_bundle(readout.case.inputs())
    golden_out = golden_output(tensors, scalars, codec)
    out, seen, judged = kernel_probe(backend, "V-scale readout: every score 0, every V code 1.0, each v_scale entry its "
                                     "own value", tensors, scalars, golden_out, codec)
    if out is None or judged is None or judged[0].mismatch_mask is None:
        return [seen], None
    return [seen], read_scales(readout, out, judged[0].mismatch_mask, golden_out)


def _read_weights(diagnosis: Diagnosis, readout: Readout, backend: JudgedBackend, *,
                  stop: Callable[[], object], deadline: float) -> tuple[list[Probe], Location | None]:
    """(the probes, what the weights readout located) of ``readout`` (properties/diagnosis/readout.py: one kernel call
    a window) on ``backend``, a window started only before ``deadline`` (time.perf_counter); no location
    when the backend refuses its shape, it is cut or the kernel errs."""
    skip_reason = getattr(backend, "skip_reason", None)
    if skip_reason is not None and skip_reason(readout.cases[0].config) is not None:
        return [], None
    codec = golden.get_codec(diagnosis.codec)
    probes, outs, expected, masks = list[Probe](), [], [], []
    for j, ablated in enumerate(readout.cases):
        if stop() or time.perf_counter() > deadline:
            return probes, None
        tensors, scalars = split_bundle(ablated.inputs())
        golden_out = golden_output(tensors, scalars, codec)
        window = readout.windows[j]
        change = (f"weights readout {j + 1}/{len(readout.cases)}: V one-hot for tokens {window[0]}-{window[-1]} "
                  f"of batches {sorted(set(readout.batch_of))}, v_scale 1")
        out, seen, judged = kernel_probe(backend, change, tensors, scalars, golden_out, codec)
        probes.append(seen)
        if out is None or judged is None:
            return probes, None
        res = judged[0]
        outs.append(out)
        expected.append(golden_out)
        masks.append(res.mismatch_mask if res.mismatch_mask is not None else torch.ones(out.shape, dtype=torch.bool))
    return probes, locate(readout, outs, expected, masks)
