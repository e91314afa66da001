"""The derived bounds the laws of :mod:`properties.search.laws` hold outputs to, and the assertions that
apply them: the acceptance width of SPEC §4.2 (two outputs of one backend with one golden), half an
E4M3 spacing (SPEC §3), the AT-12 FP8-vs-BF16 bound (SPEC §4.1, §6). Each bound is derived in its
docstring and reached in tests/properties/test_law_bounds.py. properties.search.laws re-exports the public
names.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeAlias

import torch

from pfa_verify import golden
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.golden.intervals import TINY32, U32, ulp32, up32
from pfa_verify.golden.sum_bounds import sum_error_bound
from pfa_verify.kernels import Backend
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import attribution_of, backend_model, hold
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.failure import Failed, LawFailure
from pfa_verify.properties.search.generation import reported_example

__all__ = ["acceptance_width", "at12_fp8_vs_bf16_bound", "Call", "which_call"]

#: A call's tensors by SPEC §1 name, and its scalars (softmax_scale, s2_tile, g_tile) by name.
Tensors: TypeAlias = dict[str, torch.Tensor]
Scalars: TypeAlias = dict[str, Any]


def case_tags(backend: Backend, case: object) -> dict[str, object]:
    return {"case": case.label() if isinstance(case, Case) else repr(case), "backend": backend.name}


@dataclasses.dataclass(frozen=True)
class Call:
    """One of the two calls a law compares: what it was (``label``), its output and its inputs."""
    label: str
    output: torch.Tensor = dataclasses.field(repr=False)
    tensors: Tensors = dataclasses.field(repr=False)
    scalars: Scalars = dataclasses.field(repr=False)


def which_call(calls: Sequence[Call], backend: Backend) -> tuple[list[str], tuple[Failed, ...]]:
    """When two calls that must agree do not: each held to its own golden by the one rule (SPEC §4.2;
    properties.rule.acceptance.hold), so the message names the wrong call; ``(lines, the calls that fail the
    rule)``, the latter for the boundary's diagnosis (the stage that explains each). Both passing means they
    differ within what the rule allows each (a non-deterministic backend that declares itself deterministic)."""
    lines: list[str] = []
    failed: list[Failed] = []
    for c in calls:
        verdict = hold(c.output, c.tensors, c.scalars, backend=backend, label=c.label)
        if verdict.passed:
            lines.append(f"The call {c.label} passes the one rule against its own golden")
            continue
        ref = next(r for r in verdict.references if r.counts and not r.passed)
        what = (f"{ref.comparison.mismatched} mismatched elements" if ref.comparison.attribute is None
                else f"attributes differ: {ref.comparison.attribute}")
        lines.append(f"The call {c.label} fails the one rule against its own golden ({ref.category}, {what})")
        failed.append(Failed(verdict, tensors=c.tensors, scalars=c.scalars, call=c.label))
    if not failed:
        lines.append("Each call passes the one rule alone: they differ only as far as each may (SPEC §4.1), "
                     "more than the backend's declared model lets two calls differ")
    return lines, tuple(failed)


def _assert_outputs(actual: torch.Tensor, expected: torch.Tensor, *, identifier: str, backend: Backend, case: Case,
                    tensors: Tensors, scalars: Scalars, kind: str = "attention", atol: torch.Tensor | None = None,
                    context: Sequence[str] = (), calls: Sequence[Call] | None = None) -> None:
    """Raise the suite's message (with attribution) as a LawFailure unless ``actual`` matches ``expected`` by
    ``kind`` (``bound``: within the per-element ``atol``); ``calls`` (the two :class:`Call` compared): on the
    example Hypothesis reports, the message also says which call is wrong (:func:`which_call`), and the
    failure lists the calls that fail the rule."""
    __tracebackhide__ = True
    bound: dict[str, Any] = dict(rtol=0.0, atol=atol) if kind == "bound" else {}
    res = cmp.compare(actual, expected, kind=kind, s1=case.config.s1, **bound)
    if res.passed:
        return
    lines = list(context)
    failed: tuple[Failed, ...] = ()
    if res.attribute is None:
        lines.append("Attribution: " + attribution_of(res, tensors, scalars)[1])
    if calls is not None and reported_example():       # not while Hypothesis shrinks: it costs two goldens
        try:
            said, failed = which_call(calls, backend)
            lines.extend(said)
        except Exception as exc:  # noqa: BLE001 - naming the wrong call must never hide the failure itself
            lines.append(f"Which call is wrong: unavailable ({type(exc).__name__}: {exc})")
    raise LawFailure(cmp.make_mismatch_message(res, identifier=identifier, tags=case_tags(backend, case),
                                               context=lines), failed=failed) from None


def acceptance_width(backend: Backend, tensors: Tensors, scalars: Scalars) -> torch.Tensor:
    """float32 per output element: the width of the interval the one rule accepts (SPEC §4.2),
    ``max(hi, g + tol(g)) - min(lo, g - tol(g))``, for ``backend``'s codec and declared model.

    The bound of the laws that compare two outputs of a backend whose goldens are the same (the
    transformed call computes, by SPEC §2, the same exact value): each output passes the one rule iff it
    lies in that interval, so two that both pass differ by at most its width, and two conforming ones
    (SPEC §4.1: each call takes its freedoms independently) may differ by that much. 0 where the golden
    is not finite (non-finite placement is compared on its own)."""
    arguments: dict[str, Any] = {**tensors, **scalars}        # the call's tensors and scalars, by name
    env = golden.paged_attention_envelope(**arguments, codec=getattr(backend, "codec", None),
                                          model=backend_model(backend))
    g = env.golden.double()
    rtol, atol = cmp.get_tolerance("attention")
    # The compare core rounds |k - g| and the tolerance to float32: one float32 ulp of room on each side.
    tol = (atol + rtol * g.abs()).float().double()
    high = torch.maximum(env.hi.double(), g + tol + ulp32(g.abs() + tol))
    low = torch.minimum(env.lo.double(), g - tol - ulp32(g.abs() + tol))
    return torch.nan_to_num(up32(high - low), nan=0.0, posinf=0.0)


_PAIR_NOTE = ("Allowed per element: the width of the acceptance interval of the original call (SPEC §4.2), the most "
              "two outputs that each pass the one rule can differ")


def assert_same_output(actual: torch.Tensor, expected: torch.Tensor, *, identifier: str, backend: Backend, case: Case,
                       tensors: Tensors, scalars: Scalars, calls: Sequence[Call] | None = None) -> None:
    """Two calls of ``backend`` that compute the same logical result: bit-identical for a deterministic
    backend (its model says it takes the same choices on every call); for any other, SPEC §4.1 lets each
    call take its freedoms afresh, so they are held to the width of the acceptance interval. ``calls``:
    the two :class:`Call` (actual's, expected's), to say which is wrong when they differ."""
    __tracebackhide__ = True
    if backend_model(backend).deterministic:
        _assert_outputs(actual, expected, kind="exact", identifier=identifier, backend=backend, case=case,
                        tensors=tensors, scalars=scalars, calls=calls)
    else:
        assert_pair_within(actual, expected, acceptance_width(backend, tensors, scalars), identifier=identifier,
                           backend=backend, case=case, tensors=tensors, scalars=scalars, calls=calls)


def assert_pair_within(actual: torch.Tensor, expected: torch.Tensor, width: torch.Tensor, *, identifier: str,
                       backend: Backend, case: Case, tensors: Tensors, scalars: Scalars,
                       calls: Sequence[Call] | None = None) -> None:
    """``actual`` and ``expected`` (two outputs of ``backend`` with one golden) within ``width``."""
    __tracebackhide__ = True
    _assert_outputs(actual, expected, kind="bound", atol=width, identifier=identifier, backend=backend, case=case,
                    tensors=tensors, scalars=scalars, context=[_PAIR_NOTE], calls=calls)


def e4m3_half_spacing(y: torch.Tensor) -> torch.Tensor:
    """Half the E4M3 spacing at |y| (2**-10 in the subnormal range, below 2**-6)."""
    e = torch.floor(torch.log2(y.abs().clamp(min=2.0 ** -6)))
    return torch.exp2(e - 4)


def at12_fp8_vs_bf16_bound(q8: torch.Tensor, q_scale: torch.Tensor, k8: torch.Tensor, k_scale: torch.Tensor,
                           qd: torch.Tensor, kd: torch.Tensor, *, scale: float, codec: Fp8Codec) -> torch.Tensor:
    """float32 [q_tile, k_tile]: the most a conforming kernel's FP8 scores (dequant after) and its BF16
    scores of the dequantized operands ``qd = bf16(q8 * q_scale)``, ``kd = bf16(k8 * k_scale)`` can differ.

    Derivation (SPEC §4.1, §6). Let ``a_d = q8_d q_scale``, ``b_d = k8_d k_scale`` (real). Each operand
    of the BF16 path is a float32 product rounded to bf16: ``qd_d = a_d (1 + alpha)(1 + beta)`` with
    ``|alpha| <= 2**-24`` and ``|beta| <= 2**-8`` (bf16 keeps 8 significant bits). So the exact BF16
    score ``sum qd_d kd_d`` differs from the exact FP8 one ``sum a_d b_d`` by at most
    ``theta sum |a_d b_d|``, ``theta = (1 + 2**-8)**2 (1 + 2**-24)**2 - 1``. Then each path's kernel
    sums its exact products in float32 in any order (F1: within ``E8``, ``E16``, the any-order bound of
    golden.sum_bounds.sum_error_bound) and scales: the FP8 raw sum by ``q_scale``, ``k_scale`` in any
    order and ``scale`` last (three roundings, F2), the BF16 one by ``scale`` (one rounding). With
    ``u = 2**-24``:

        |fp8 - bf16| <= scale * (theta sum|a b| + (E8 q_scale k_scale + |s8|) ((1 + u)**3 - 1) + E8 q_scale k_scale
                                 + E16 (1 + u) + |s16| u) + 4 * 2**-149

    where ``s8``, ``s16`` are the exact dequantized FP8 and BF16 scores (4 * 2**-149: the roundings near
    zero). Every term is reached by some inputs: tests/properties/test_law_bounds.py aligns the bf16
    roundings of every operand and the kernels' summation errors, and holds conforming kernels under it.
    """
    a8, b8 = codec.from_fp8(q8).double(), codec.from_fp8(k8).double()
    raw8 = a8 @ b8.T
    abs8 = a8.abs() @ b8.abs().T
    scales = q_scale.double() * k_scale.double().T
    q16, k16 = qd.double(), kd.double()
    s16 = q16 @ k16.T
    abs16 = q16.abs() @ k16.abs().T
    d = q8.shape[-1]
    e8 = sum_error_bound(d, (abs8 + raw8.abs()) / 2, abs8, raw8)
    e16 = sum_error_bound(d, (abs16 + s16.abs()) / 2, abs16, s16)
    theta = (1 + 2.0 ** -8) ** 2 * (1 + U32) ** 2 - 1
    three = (1 + U32) ** 3 - 1
    bound: torch.Tensor = scale * (theta * abs8 * scales + (e8 * scales + raw8.abs() * scales) * three + e8 * scales
                     + e16 * (1 + U32) + s16.abs() * U32) * (1 + 2.0 ** -50) + 4 * TINY32
    return bound.float()
