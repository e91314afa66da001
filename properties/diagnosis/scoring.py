"""A fault model's scores on one failure (properties/diagnosis/diagnosis.py's candidates): how much of the mismatch it
explains and how much of what matched it breaks, by the one comparison core (properties.rule.compare) with SPEC
§4's tolerance around the model's output, widened by the rounding reach the failing comparison's envelope
gives a conforming kernel there (SPEC §4.2). A classifier's allowance, not an acceptance bound: the rule has
already decided the failure.
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias

import torch

from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.golden.envelope import AttentionEnvelope
from pfa_verify.properties.diagnosis.fault_model import FaultModel
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule import transforms as tf
from pfa_verify.properties.rule.acceptance import Scalars, Tensors

__all__ = ["Candidate", "Prediction", "Slack", "slack_of", "score", "model_output", "minus_one_reads", "EXPLAINS",
           "CLOSE"]

#: A model *explains* a failure when it accounts for at least this share of the mismatched elements and
#: breaks at most 1 - EXPLAINS of the matching ones.
EXPLAINS = 0.9
#: A model not identified *comes close* (is shown as the closest) when it explains at least this share of
#: the mismatched elements and breaks at most 1 - CLOSE of the matching ones.
CLOSE = 0.5

@dataclasses.dataclass(frozen=True)
class Candidate:
    """A model's scores on one failure."""
    model: str
    stage: str
    description: str
    explained: int                  # mismatched elements (vs the golden) that match the model
    mismatched: int
    broken: int                     # matching elements (vs the golden) that do not match a value the model predicts
    matching: int
    unspecified: int = 0            # of the explained, those the model leaves to data SPEC does not fix
    unspecified_matching: int = 0   # matching elements where the model's value differs, but rests on data SPEC
                                    # does not fix (not broken)

    @property
    def explained_share(self) -> float:
        return self.explained / self.mismatched if self.mismatched else 0.0

    @property
    def definite_share(self) -> float:
        """The share of the mismatch explained by values the model predicts (what ranks candidates)."""
        return (self.explained - self.unspecified) / self.mismatched if self.mismatched else 0.0

    @property
    def broken_share(self) -> float:
        return self.broken / self.matching if self.matching else 0.0

    @property
    def explains(self) -> bool:
        """It explains at least EXPLAINS of the mismatch, at least half of that by values it predicts (not
        by reads of unspecified data), and breaks at most 1 - EXPLAINS of the matching elements."""
        return (self.explained_share >= EXPLAINS and self.broken_share <= 1 - EXPLAINS
                and 2 * self.unspecified <= self.explained)

    @property
    def explains_every_mismatch(self) -> bool:
        """It explains the failure and leaves no mismatched element unexplained (what a name requires)."""
        return self.explains and self.explained == self.mismatched

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"explains": self.explains}


#: Per output element, how far below and above the golden a conforming kernel may land beyond SPEC §4's
#: tolerance: ``(g - lo, hi - g)`` of the failing comparison's envelope (SPEC §4.2), 0 where none was built.
Slack: TypeAlias = tuple[torch.Tensor, torch.Tensor]


def slack_of(expected: torch.Tensor, envelope: AttentionEnvelope | None) -> Slack | None:
    """The :data:`Slack` of an envelope around the golden's ``expected`` (None without an envelope)."""
    if envelope is None:
        return None
    g = expected.float()
    below = torch.nan_to_num(g - envelope.lo.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0.0)
    above = torch.nan_to_num(envelope.hi.float() - g, nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0.0)
    return below, above


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A model's output on a case, and the elements of it that depend on cells SPEC leaves unspecified:
    ``unspecified`` (bool), garbage the model reads (the golden keeps it, NaN garbage as NaN); and
    ``minus_one`` (bool, or None when not looked for), -1 table entries the model reads through SPEC §2
    item 2's clamp (:func:`minus_one_reads`). What a kernel with the defect shows there is not fixed, so
    those elements are no prediction; where the kernel shows the model's value at a -1 read anyway (it
    clamped as the model does), the model predicted it."""
    output: torch.Tensor
    unspecified: torch.Tensor
    minus_one: torch.Tensor | None = None


def score(out: torch.Tensor, mismatch: torch.Tensor, predicted: Prediction, model: FaultModel,
          slack: Slack | None = None) -> Candidate | None:
    """``model``'s :class:`Candidate` on one output: ``mismatch`` is where ``out`` breaks the rule against the
    golden (properties.rule.acceptance.rule's mismatch mask) and ``predicted`` the model's output; None when the
    model's output cannot be compared with the kernel's (another shape: it does not apply).

    The kernel agrees with the model at an element when it lies within SPEC §4's tolerance of the model's
    output, widened by ``slack``: the rounding reach a conforming execution has there around the golden,
    carried over to the model (a classifier's allowance, not an acceptance bound: the rule has decided).
    Where the prediction is unspecified (:class:`Prediction`), a mismatched element counts as explained,
    whatever the kernel shows there, but as ``unspecified``: :attr:`Candidate.explains` wants half of what it
    explains predicted; a matching element there is not broken (the kernel may show the golden's value
    there as well as any other), and is counted as ``unspecified_matching``. A read of a -1 table entry
    (``Prediction.minus_one``) is unspecified only where the kernel differs from the model: where it
    shows the model's clamped value, that is a prediction borne out. A non-finite value the kernel shows
    where the model reads NaN garbage is a prediction borne out too (the kernel read the garbage there),
    only when the kernel shows no non-finite value outside what the model leaves unspecified and the
    model predicts some element from specified data: a kernel that is NaN everywhere agrees with every
    garbage read, and says nothing by it."""
    faulty = predicted.output
    bounds = None if slack is None else (faulty.float() - slack[0], faulty.float() + slack[1])
    res = cmp.compare(out, faulty, kind="attention", envelope=bounds)
    if res.attribute is not None:
        return None
    differs = res.mismatch_mask
    assert differs is not None        # compare sets the mask whenever the attributes agree
    garbage = predicted.unspecified
    minus_one = predicted.minus_one if predicted.minus_one is not None else torch.zeros_like(garbage)
    shown = ~torch.isfinite(out.float())
    if (bool(shown.any()) and not bool((shown & ~(garbage | minus_one)).any())
            and not bool((garbage | minus_one).all())):
        garbage = garbage & ~shown          # NaN garbage the model reads, shown: borne out (compare: NaN == NaN)
    # A -1 read is unspecified only where the kernel differs from the model's (clamped) value there.
    unspecified = garbage | (minus_one & differs)
    return Candidate(model.name, model.stage, model.description, int((mismatch & (~differs | unspecified)).sum()),
                     int(mismatch.sum()), int((~mismatch & differs & ~unspecified).sum()), int((~mismatch).sum()),
                     int((mismatch & unspecified).sum()), int((~mismatch & differs & unspecified).sum()))


def model_output(model: FaultModel, tensors: Tensors, scalars: Scalars,
                 codec: Fp8Codec | str | None) -> Prediction | None:
    """``model``'s :class:`Prediction` on the case, or None when the model does not apply. The models are the
    golden's own code on changed inputs: they replace a tensor, never write into one, so the tensors are
    shared (a copy of K and V per model was an eighth of a diagnosis' time on the largest upstream case).
    An output that is not finite is computed again with the case's unread cells zeroed
    (properties.rule.transforms.poison_unread): the elements that come back finite read garbage, and are
    unspecified; those still not finite are the model's own (a defect that writes NaN)."""
    try:
        with torch.inference_mode():
            out = model.output(dict(tensors), dict(scalars), codec)
            unspecified = torch.zeros(out.shape, dtype=torch.bool)
            if not bool(torch.isfinite(out).all()):
                again = model.output(dict(tf.poison_unread(tensors, None)), dict(scalars), codec)
                unspecified = ~torch.isfinite(out) & torch.isfinite(again)
    except (ValueError, TypeError, IndexError, RuntimeError):    # the model does not apply to this case
        return None
    return Prediction(out, unspecified)


def minus_one_reads(model: FaultModel, predicted: Prediction, tensors: Tensors, scalars: Scalars,
                    codec: Fp8Codec | str | None) -> Prediction:
    """``predicted`` with :attr:`Prediction.minus_one` set: the elements where ``model`` reads a -1 entry of
    the block table. A model that walks past a row's valid blocks reads what SPEC §2 item 2's clamp gives
    (block 0), but a kernel with that defect may read any block there (a wrapped index, another address):
    what it shows is not fixed, as for garbage (the golden-level mutant that does not clamp is listed as
    equivalent: a conforming walk never reads a -1 entry). Found with one more call of the model, on the
    table with its -1 entries pointed at a block of NaN codes and NaN K scales
    (properties.rule.transforms.minus_one_to_garbage); a case without -1 entries costs none. A limit: a codec
    without a NaN code (PyPTO's calculator E4M3 reads the NaN code as 240) leaves a read of V alone there
    finite, so a model that reads V through a -1 entry but not K's scale is not found under it."""
    table = tensors["block_table"]
    if not bool((table < 0).any()):
        return dataclasses.replace(predicted, minus_one=torch.zeros_like(predicted.unspecified))
    try:
        with torch.inference_mode():
            again = model.output(dict(tf.minus_one_to_garbage(tensors)), dict(scalars), codec)
    except (ValueError, TypeError, IndexError, RuntimeError):
        return predicted
    if again.shape != predicted.output.shape:
        return predicted
    return dataclasses.replace(predicted, minus_one=~torch.isfinite(again) & torch.isfinite(predicted.output))
