"""The one acceptance rule (SPEC §4, §4.2): a backend's output for a case, held to the golden.

Every place that decides whether a backend computed a case correctly calls :func:`judge`: the
``acceptance`` law (pytest), ``pfa-verify run``, ``pfa-verify cases replay`` and ``prune``, the sim
kernel tests. A case therefore gets the same verdict wherever it runs, on any backend.

The rule. The backend runs on clones of the case's inputs (:func:`call`: the inputs must come back
unchanged). Its output ``k`` is compared (:func:`properties.rule.compare.compare`, kind ``attention``) with
the vectorized golden ``g`` and the acceptance envelope ``[lo, hi]`` (golden.paged_attention_envelope,
for the backend's declared :class:`golden.model.ConformanceModel`, SPEC §4.1 unless it declares a
narrower one; a wider declaration is refused, :func:`backend_model`): an element passes iff

    |k - g| <= 1e-4 + |g| / 128     or     lo <= k <= hi

and rows with ``cur == 0`` are exactly 0. The envelope is paid only where it decides: the tolerance is
applied first, and the envelope is built for the output rows holding an element outside it (an output
row's envelope depends on that row's inputs alone, SPEC §4.2, and is bit-identical there to the full
one); a case whose every element lies within the tolerance builds none. That is done under the spec codec and, when the backend
declares another codec (pypto's CPU calculator), under that codec too. Each comparison gets a category:

==================  =============================================================================
category            meaning
==================  =============================================================================
pass                within SPEC §4, or inside the envelope (a conforming kernel can land there)
kernel logic        outside both: no execution SPEC §4.1 allows gives this output (indexing,
                    scales, softmax, tails, ...)
backend codec       the spec comparison fails but the one under the backend's own codec passes:
                    the platform's FP8 conversions, not the kernel (shown, never counted)
wrong shape,        the output is not what SPEC §1 says it returns (bf16 [B*S1, NQ, D], contiguous,
wrong device,       on the CPU): named as such, with what it is and what was expected; no value is
wrong dtype,        compared
wrong layout
==================  =============================================================================

A backend that says a comparison under the spec codec cannot judge its kernel
(``spec_codec_not_applicable``: pypto 0.2.0's calculator, whose E4M3 is its own) is compared under its
own codec only; the reports say so in one line. A pass says how many elements needed the envelope ("12 elements inside the envelope only: an E4M3
code of P can flip there"); a failure says how far outside the envelope its worst element lies, in
units of the tolerance. Which comparisons count: the one under the backend's declared codec always; the
spec one unless the backend's own comparison passes. A judgement passes when every comparison that
counts passes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, TypeAlias

import numpy as np
import torch

from pfa_verify import golden
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.golden.envelope import AttentionEnvelope
from pfa_verify.golden.model import ConformanceModel, declared_model
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.attribution import Attribution, attribute, error_picture, query_positions
from pfa_verify.properties.rule.case import Case

__all__ = ["CATEGORIES", "InputsModified", "CodecVerdict", "EnvelopeFigures", "Judgement", "call", "check_unchanged",
           "split_bundle", "judge", "hold", "rule", "reference_backend", "attribution_of", "backend_model"]

CATEGORIES = ("pass", "kernel logic", "backend codec", "wrong shape", "wrong device", "wrong dtype", "wrong layout")

#: A call's tensors by SPEC §1 name, and its scalars (softmax_scale, s2_tile, g_tile) by name.
Tensors: TypeAlias = dict[str, torch.Tensor]
Scalars: TypeAlias = dict[str, Any]


class JudgedBackend(Protocol):
    """What the rule reads of a backend: its ``name``; the rest by getattr, with defaults (``codec``,
    ``spec_codec_not_applicable``, the declared ``model``), and the kernel it calls by name (:func:`call`).
    kernels.Backend, kernels.KernelBackend and a supervised backend have it, and so does a double."""

    @property
    def name(self) -> str: ...


class InputsModified(AssertionError):
    """A backend call changed one of its input tensors (SPEC: inputs are never modified)."""


def call(backend: JudgedBackend, tensors: Tensors, *, op: str = "paged_attention_fp8", tags: dict[str, object] | None = None,
         **scalars: Any) -> torch.Tensor:
    """``backend.<op>(**tensors, **scalars)`` on clones; InputsModified unless the clones come back
    bit-identical to the originals. ``tensors`` itself is never handed to the backend."""
    __tracebackhide__ = True
    given = {k: v.clone() for k, v in tensors.items()}
    out: torch.Tensor = getattr(backend, op)(**given, **scalars)
    check_unchanged(given, tensors, backend_name=backend.name, tags=tags)
    return out


def check_unchanged(given: Tensors, tensors: Tensors, *, backend_name: str, tags: dict[str, object] | None = None) -> None:
    """InputsModified, its message made by the comparison core, unless every tensor of ``given`` (what a
    call was handed, after it) has the bits of the same tensor of ``tensors`` (the originals)."""
    __tracebackhide__ = True
    for k in tensors:
        if _same_bits(given[k], tensors[k]):          # the cheap check first; the message only on a change
            continue
        res = cmp.compare(given[k], tensors[k], kind="exact")
        if not res.passed:
            raise InputsModified(cmp.make_mismatch_message(
                res, identifier=f"Input {k} after the {backend_name} call vs before", tags=tags)) from None


def _same_bits(after: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether a call left a tensor as it was: same shape, dtype, strides and bytes (NaN payloads and signed
    zeros included: the elements are compared as integers of their width). False sends the tensor to the
    comparison core, which says what changed."""
    if after.dtype != before.dtype or after.shape != before.shape or after.stride() != before.stride():
        return False
    width = _INTEGER_OF_SIZE.get(after.element_size())
    if width is None:
        return False
    a, b = after.view(width), before.view(width)
    if a.numel() > _TORCH_EQUAL_MOST and a.device.type == "cpu" and a.is_contiguous():
        # Large buffers through numpy: torch.equal reads them at a quarter (int32) to a tenth (uint8) of the
        # speed; on small ones its single call is cheaper (measured: 1.8 us against 7 us for 54 floats).
        # In slices: the boolean mask of a whole 128k-token cache would be one more cache in memory.
        flat_a, flat_b = a.numpy().reshape(-1), b.numpy().reshape(-1)
        return all(np.array_equal(flat_a[i:i + _SLICE_ELEMENTS], flat_b[i:i + _SLICE_ELEMENTS])
                   for i in range(0, flat_a.size, _SLICE_ELEMENTS))
    return bool(torch.equal(a, b))


_INTEGER_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_TORCH_EQUAL_MOST = 4096
_SLICE_ELEMENTS = 1 << 22


def split_bundle(bundle: golden.InputBundle) -> tuple[Tensors, Scalars]:
    """(tensor kwargs, scalar kwargs) of an InputBundle, scalars taken from its config."""
    kw = bundle.kwargs()
    tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}


def reference_backend(backend: JudgedBackend) -> GoldenBackend:
    """The golden every law compares ``backend`` with: vectorized, under the backend's own codec."""
    return GoldenBackend(codec=getattr(backend, "codec", None), loop=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvelopeFigures:
    """What the acceptance envelope (SPEC §4.2) did in one comparison, as reports show it: the output rows
    it was built for (those holding an element outside the tolerance), elements that passed only inside
    it, P elements whose E4M3 code may flip there, degenerate rows, and for a failure how far outside it
    the worst element lies (in units of its tolerance, at ``outside_index``)."""
    inside_only: int
    flippable: int
    p_elements: int
    degenerate_rows: int
    rows_built: int | None
    outside_by: float | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodecVerdict:
    """One comparison of the backend's output with the golden and its envelope under one codec: the
    rule's record of it, immutable. Everything a report shows of the comparison is a field (reports
    render it; nobody edits it); the tensors behind it ride along, not compared and not serialized."""
    reference: str                     # "spec" or the codec's name
    comparison: cmp.Comparison
    counts: bool
    category: str                      # one of CATEGORIES
    attribution: Attribution | None
    attribution_text: str | None       # Attribution.render(), or why it is unavailable
    message: str                       # the rule's failure text ("" on a pass)
    worst_ratio: float                 # max error over what the rule allows (1 = its edge; inf: misplaced non-finite)
    worst_index: dict[str, int] | None = None    # {"row", "b", "i", "head", "d"} of the greatest absolute difference
    max_abs_err: float | None = None   # over the mismatched elements on a failure, over all on a pass
    max_rel_err: float | None = None
    envelope_figures: EnvelopeFigures | None = None    # None: no element needed the envelope
    error_map: list[list[float | None]] | None = None      # [B*S1][NQ] worst error over allowed, over d (failures only)
    ratio_histogram: list[int] | None = None  # counts per properties.rule.attribution.RATIO_BINS interval, then non-finite
    expected: torch.Tensor = dataclasses.field(repr=False, compare=False)
    ratio: torch.Tensor | None = dataclasses.field(default=None, repr=False, compare=False)  # per element
    envelope: AttentionEnvelope | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category={self.category!r} must be one of {CATEGORIES}")

    @property
    def passed(self) -> bool:
        return self.comparison.passed

    @property
    def mismatched(self) -> int:
        """Elements outside the rule (every element when the attributes differ)."""
        res = self.comparison
        return res.mismatched if res.attribute is None else res.total

    def envelope_note(self) -> str:
        """One line on what the envelope did: not needed (every element within the tolerance), or built for
        the batches that held an element outside it, with what it found there."""
        if self.envelope is None:
            return "Envelope: not needed (every element within SPEC §4's tolerance)" if self.passed else ""
        env = self.envelope
        note = cmp.envelope_line(self.comparison)
        if env.rows is not None:
            note += f"; built for {len(env.rows)} output row{'s' if len(env.rows) != 1 else ''} (those outside the tolerance)"
        if env.flippable:
            note += f"; {env.flippable} of {env.p_elements} P elements may take either of two E4M3 codes"
        if env.degenerate_rows:
            note += (f"; degenerate input: {env.degenerate_rows} rows have scores uncertain by more than "
                     "1 logit (logits near 1e6), bounded there by the V rows that can matter (SPEC §4.2, step 8)")
        return note


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The verdict of :func:`judge` on one case: the backend's output and one CodecVerdict per codec."""
    case_label: str
    backend: str
    references: tuple[CodecVerdict, ...]
    output: torch.Tensor = dataclasses.field(repr=False, compare=False)
    spec_not_applicable: str | None = None    # why no spec-codec comparison was made (the backend says)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.references if r.counts)

    @property
    def deciding(self) -> CodecVerdict:
        """The comparison under the backend's own codec (the last one)."""
        return self.references[-1]

    def message(self) -> str:
        """The failure text of every counted failure (empty when the judgement passes)."""
        return "\n\n".join(r.message for r in self.references if r.counts and not r.passed)


def attribution_of(res: cmp.Comparison, tensors: Tensors, scalars: Scalars) -> tuple[Attribution | None, str]:
    """(Attribution, its rendered line) of a failed attention Comparison; on an error inside attribution
    (None, why it is unavailable): attribution never hides the failure."""
    try:
        assert res.mismatch_mask is not None, "the attributes differ: no element to attribute"
        a = attribute(res.mismatch_mask, tensors, s2_tile=scalars["s2_tile"])
        return a, a.render()
    except Exception as exc:  # noqa: BLE001 - attribution must never hide the failure it describes
        return None, f"unavailable ({type(exc).__name__}: {exc})"


def backend_model(backend: JudgedBackend) -> ConformanceModel:
    """The conformance model ``backend`` is judged by: golden.model.declared_model (SPEC §4.1 unless it
    declares a narrower one; a wider declaration is a UsageError naming the field, never used)."""
    return declared_model(backend)


def _worst_index(res: cmp.Comparison, s1: int) -> dict[str, int] | None:
    index = res.max_abs_index
    if index is None and res.nonfinite:
        index = res.nonfinite[0].first_index
    if index is None or len(index) != 3:
        return None
    row, h, d = (int(x) for x in index)
    return {"row": row, "b": row // s1, "i": row % s1, "head": h, "d": d}


def _figures(envelope: AttentionEnvelope | None, res: cmp.Comparison, note: str) -> EnvelopeFigures | None:
    if envelope is None or not res.envelope:
        return None
    return EnvelopeFigures(inside_only=res.by_envelope, flippable=envelope.flippable, p_elements=envelope.p_elements,
                           degenerate_rows=envelope.degenerate_rows,
                           rows_built=None if envelope.rows is None else len(envelope.rows),
                           outside_by=res.outside_envelope if res.outside_index is not None else None, note=note)


def rule(out: torch.Tensor, expected: torch.Tensor, checked: golden.PagedAttentionCall, *, codec: Fp8Codec,
         model: ConformanceModel, s1: int | None = None) -> tuple[cmp.Comparison, AttentionEnvelope | None]:
    """(the comparison, the envelope or None) of the rule (module docstring) on ``out`` against the golden's
    ``expected`` under ``codec``: SPEC §4's tolerance first, then the envelope for ``model`` built for the
    output rows holding an element outside it. ``checked``: the case's arguments as golden.checked_call
    checked them. The diagnosis scores its models and probes by this same rule."""
    res = cmp.compare(out, expected, kind="attention", s1=s1)
    if res.passed or res.attribute is not None:
        return res, None
    assert res.mismatch_mask is not None       # compare sets the mask whenever the attributes agree
    needs = res.mismatch_mask.reshape(out.shape[0], -1).any(dim=1)          # output rows b * S1 + i
    envelope = checked.envelope(codec, model, rows=needs)
    return cmp.compare(out, expected, kind="attention", s1=s1, envelope=(envelope.lo, envelope.hi)), envelope


def _reference(out: torch.Tensor, tensors: Tensors, scalars: Scalars, *, checked: golden.PagedAttentionCall,
               codec: Fp8Codec, model: ConformanceModel, name: str, s1: int,
               tags: dict[str, object] | None) -> CodecVerdict:
    """One comparison under ``codec``: the golden and SPEC §4's tolerance first; the envelope (SPEC §4.2)
    only for the output rows that hold an element outside the tolerance, bit-identical there to the full
    envelope's (golden.paged_attention_envelope's ``rows``), since nothing else can change the verdict.
    ``checked``: the case's arguments as golden.checked_call checked them (once for every codec)."""
    expected = checked.golden(codec)
    res, envelope = rule(out, expected, checked, codec=codec, model=model, s1=s1)
    bounds = None if envelope is None else (envelope.lo, envelope.hi)
    ratio = cmp.error_ratio(out, expected, kind="attention", envelope=bounds) if res.attribute is None else None
    worst = float(ratio.max()) if ratio is not None and ratio.numel() else (0.0 if res.passed else math.inf)
    common: dict[str, Any] = dict(reference=name, comparison=res, counts=True, worst_ratio=worst, worst_index=_worst_index(res, s1),
                  expected=expected, ratio=ratio, envelope=envelope)
    if res.passed:
        # The comparison core reports maxima over mismatches only; a pass still shows its float32 noise.
        noise_abs, noise_rel = cmp.max_differences(out, expected)
        record = CodecVerdict(category="pass", attribution=None, attribution_text=None, message="",
                              max_abs_err=noise_abs, max_rel_err=noise_rel, **common)
        return dataclasses.replace(record, envelope_figures=_figures(envelope, res, record.envelope_note()))
    attribution, text, context = None, None, []
    if res.attribute is None:
        attribution, text = attribution_of(res, tensors, scalars)
        context.append(f"Attribution: {text}")
    ident = "Kernel output vs golden" + ("" if name == "spec" else f" under the {name} codec")
    message = cmp.make_mismatch_message(res, identifier=ident, tags=tags, context=context)
    error_map, histogram = error_picture(ratio) if ratio is not None else (None, None)
    category = "kernel logic" if res.wrong is None else f"wrong {res.wrong}"
    record = CodecVerdict(category=category, attribution=attribution, attribution_text=text, message=message,
                          max_abs_err=res.max_abs_err, max_rel_err=res.max_rel_err, error_map=error_map,
                          ratio_histogram=histogram, **common)
    return dataclasses.replace(record, envelope_figures=_figures(envelope, res, record.envelope_note()))


def judge(backend: JudgedBackend, case: Case, *, tags: dict[str, object] | None = None,
          bundle: golden.InputBundle | None = None) -> Judgement:
    """Run ``backend`` on ``case`` (a :class:`~properties.rule.case.Case`) and hold it to the golden.

    ``bundle``: the case's inputs (``case.inputs()``) when the caller has built them already. Raises
    InputsModified when the call changes its inputs; any exception of the backend propagates (the caller
    decides whether it is an error verdict or a test failure).
    """
    tensors, scalars = split_bundle(case.inputs() if bundle is None else bundle)
    tags = tags or {"case": case.label(), "backend": backend.name}
    out = call(backend, tensors, tags=tags, **scalars)
    return hold(out, tensors, scalars, backend=backend, label=case.label(), tags=tags)


def hold(out: torch.Tensor, tensors: Tensors, scalars: Scalars, *, backend: JudgedBackend, label: str,
         tags: dict[str, object] | None = None) -> Judgement:
    """The one rule on an output ``out`` that ``backend`` already gave for ``tensors`` and ``scalars``
    (:func:`judge` is :func:`call` then this): the laws that compare two calls hold each call to its own
    golden with it, to say which call is wrong."""
    tags = tags or {"case": label, "backend": backend.name}
    s1 = query_positions(tensors)
    spec = golden.SPEC_CODEC
    own = getattr(backend, "codec", None) or spec
    not_applicable = getattr(backend, "spec_codec_not_applicable", None) if own is not spec else None
    # A backend whose codec cannot be the spec's (pypto's calculator) is not compared under the spec codec
    # at all: that comparison would measure the platform, never the kernel (the report says so once).
    codecs = ([] if not_applicable else [("spec", spec)]) + ([(own.name, own)] if own is not spec else [])
    model = backend_model(backend)
    by_name: dict[str, Any] = tensors       # mypy cannot match a dict's keys to the tensor parameters
    checked = golden.checked_call(**by_name, **scalars)
    refs = [_reference(out, tensors, scalars, checked=checked, codec=codec, model=model, name=name, s1=s1, tags=tags)
            for name, codec in codecs]
    if len(refs) == 2 and refs[1].passed and not refs[0].passed:
        note = (f"The comparison under the backend's own codec ({refs[1].reference}) passes: this difference "
                "is the platform's FP8 conversions, not the kernel (shown, not counted)")
        refs[0] = dataclasses.replace(refs[0], counts=False, category="backend codec",
                                      message=refs[0].message + "\n" + note)
    return Judgement(label, backend.name, tuple(refs), out, not_applicable)
