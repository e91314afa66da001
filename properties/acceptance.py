"""The one acceptance rule (SPEC §4): a backend's output for a case, held to the golden.

Every place that decides whether a backend computed a case correctly calls :func:`judge`: the
``acceptance`` law (pytest), ``pfa-verify run``, ``pfa-verify cases replay`` and ``prune``, the sim
kernel tests. A case therefore gets the same verdict wherever it runs, on any backend.

The rule. The backend runs on clones of the case's inputs (:func:`call`: the inputs must come back
unchanged). Its output is compared (:func:`properties.compare.compare`, kind ``attention``) with the
vectorized golden under the spec codec, and, when the backend declares another codec (pypto's CPU
calculator), with the golden under that codec too. Each comparison is attributed
(:mod:`properties.attribution`) with its own codec, and gets a category:

==================  =============================================================================
category            meaning
==================  =============================================================================
pass                within SPEC §4
kernel logic        outside SPEC §4 in a way no codec explains: indexing, scales, softmax, tails
backend codec       the spec comparison fails but the one under the backend's own codec passes:
                    the platform's FP8 conversions, not the kernel (shown, never counted)
E4M3 boundary flip  every mismatch sits in a row whose P touches a rounding boundary of the codec
                    (one P8 code one step away); reported, counted, never tolerated by widening
==================  =============================================================================

Which comparisons count: the one under the backend's declared codec always; the spec one unless the
backend's own comparison passes. A judgement passes when every comparison that counts passes.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from properties import compare as cmp
from properties.attribution import Attribution, attribute

__all__ = ["CATEGORIES", "InputsModified", "Reference", "Judgement", "call", "split_bundle", "judge",
           "reference_backend", "attribution_of"]

CATEGORIES = ("pass", "kernel logic", "backend codec", "E4M3 boundary flip")


class InputsModified(AssertionError):
    """A backend call changed one of its input tensors (SPEC: inputs are never modified)."""


def call(backend, tensors: dict, *, op: str = "paged_attention_fp8", tags: dict | None = None, **scalars):
    """``backend.<op>(**tensors, **scalars)`` on clones; InputsModified unless the clones come back
    bit-identical to the originals. ``tensors`` itself is never handed to the backend."""
    __tracebackhide__ = True
    given = {k: v.clone() for k, v in tensors.items()}
    out = getattr(backend, op)(**given, **scalars)
    for k in tensors:
        res = cmp.compare(given[k], tensors[k], kind="exact")
        if not res.passed:
            raise InputsModified(cmp.make_mismatch_message(
                res, identifier=f"Input {k} after the {backend.name} call vs before", tags=tags)) from None
    return out


def split_bundle(bundle) -> tuple[dict, dict]:
    """(tensor kwargs, scalar kwargs) of an InputBundle, scalars taken from its config."""
    kw = bundle.kwargs()
    tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}


def reference_backend(backend):
    """The golden every law compares ``backend`` with: vectorized, under the backend's own codec."""
    from kernels.backends.golden_backend import GoldenBackend
    return GoldenBackend(codec=getattr(backend, "codec", None), loop=False)


@dataclasses.dataclass(frozen=True)
class Reference:
    """One comparison of the backend's output with the golden under one codec."""
    reference: str                     # "spec" or the codec's name
    comparison: cmp.Comparison
    counts: bool
    category: str                      # one of CATEGORIES
    attribution: Attribution | None
    attribution_text: str | None       # Attribution.render(), or why it is unavailable
    message: str                       # the failure text ("" on a pass)
    worst_ratio: float                 # max |k - g| / (atol + rtol |g|) over the elements (inf: misplaced non-finite)
    expected: torch.Tensor = dataclasses.field(repr=False, compare=False)
    ratio: torch.Tensor | None = dataclasses.field(default=None, repr=False, compare=False)  # per element

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category={self.category!r} must be one of {CATEGORIES}")

    @property
    def passed(self) -> bool:
        return self.comparison.passed


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The verdict of :func:`judge` on one case: the backend's output and one Reference per codec."""
    case_label: str
    backend: str
    references: tuple[Reference, ...]
    output: torch.Tensor = dataclasses.field(repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.references if r.counts)

    @property
    def deciding(self) -> Reference:
        """The comparison under the backend's own codec (the last one)."""
        return self.references[-1]

    def message(self) -> str:
        """The failure text of every counted failure (empty when the judgement passes)."""
        return "\n\n".join(r.message for r in self.references if r.counts and not r.passed)


def attribution_of(res, tensors, scalars, codec) -> tuple[Attribution | None, str]:
    """(Attribution, its rendered line) of a failed attention Comparison, read with ``codec``; on an
    error inside attribution (None, why it is unavailable): attribution never hides the failure."""
    try:
        a = attribute(res.mismatch_mask, tensors, s2_tile=scalars["s2_tile"],
                      softmax_scale=scalars.get("softmax_scale"), codec=codec)
        return a, a.render()
    except Exception as exc:  # noqa: BLE001 - attribution must never hide the failure it describes
        return None, f"unavailable ({type(exc).__name__}: {exc})"


def _reference(out, expected, *, name: str, codec, s1: int, tensors, scalars, tags) -> Reference:
    res = cmp.compare(out, expected, kind="attention", s1=s1)
    ratio = cmp.error_ratio(out, expected, kind="attention") if res.attribute is None else None
    worst = float(ratio.max()) if ratio is not None and ratio.numel() else (0.0 if res.passed else math.inf)
    if res.passed:
        return Reference(name, res, True, "pass", None, None, "", worst, expected, ratio)
    attribution, text, context = None, None, []
    category = "kernel logic"
    if res.attribute is None:
        attribution, text = attribution_of(res, tensors, scalars, codec)
        context.append(f"Attribution: {text}")
        if attribution is not None and not res.nonfinite and attribution.on_boundary == attribution.mismatched:
            category = "E4M3 boundary flip"
    ident = "Kernel output vs golden" + ("" if name == "spec" else f" under the {name} codec")
    message = cmp.make_mismatch_message(res, identifier=ident, tags=tags, context=context)
    return Reference(name, res, True, category, attribution, text, message, worst, expected, ratio)


def judge(backend, case, *, tags: dict | None = None) -> Judgement:
    """Run ``backend`` on ``case`` (a :class:`~properties.case.Case`) and hold it to the golden.

    Raises InputsModified when the call changes its inputs; any exception of the backend propagates
    (the caller decides whether it is an error verdict or a test failure).
    """
    import golden
    tensors, scalars = split_bundle(case.inputs())
    tags = tags or {"case": case.label(), "backend": backend.name}
    out = call(backend, tensors, tags=tags, **scalars)
    spec = golden.SPEC_CODEC
    own = getattr(backend, "codec", None) or spec
    codecs = [("spec", spec)] + ([(own.name, own)] if own is not spec else [])
    refs = [_reference(out, golden.paged_attention_fp8(**tensors, **scalars, codec=codec), name=name, codec=codec,
                       s1=case.config.s1, tensors=tensors, scalars=scalars, tags=tags)
            for name, codec in codecs]
    if len(refs) == 2 and refs[1].passed and not refs[0].passed:
        note = (f"The comparison under the backend's own codec ({refs[1].reference}) passes: this difference "
                "is the platform's FP8 conversions, not the kernel (shown, not counted)")
        refs[0] = dataclasses.replace(refs[0], counts=False, category="backend codec",
                                      message=refs[0].message + "\n" + note)
    return Judgement(case.label(), backend.name, tuple(refs), out)
