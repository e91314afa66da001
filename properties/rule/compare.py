"""The one comparison core: what "close" means for pfa-verify (SPEC §4), and the failure text.

Every comparison in the project goes through :func:`compare` (structured result) or its front door
:func:`assert_close` (raises). Checks run in order and stop at the first kind of finding:

1. attributes: shape, then device, then dtype, then contiguity (a contiguous expected needs a
   contiguous actual, SPEC §1: all tensors are contiguous ND), each a finding of its own, named first
   ("wrong dtype: float32, expected bfloat16"), never a numeric one;
2. non-finite placement: NaN or inf in ``actual`` where ``expected`` is finite (garbage that leaked),
   or a finite value where ``expected`` is NaN / inf, is its own finding, counted per kind;
3. values: floating tensors on float32 views, ``|actual - expected| <= atol + rtol * |expected|``
   elementwise; integer (and bool) tensors as integers: an element matches when it is equal, or when
   the exact integer distance is within the tolerance (so int64 values above 2**53, which a float64
   view would merge, still differ).

Tolerances come from one table keyed by *what* is compared, not by dtype:

=============  ==========  ========  ===========================================================
kind           rtol        atol      used for
=============  ==========  ========  ===========================================================
attention      1/128       1e-4      kernel output vs golden (SPEC §4; 1/128 is one bf16 ulp)
at12           1/128       1e-4      AT-12 QK^T scores vs golden (SPEC §6, same rule as §4)
exact          0           0         bit-identical: codec / layout round trips, inputs unchanged by
                                     a call, the laws that say "bit-identical"
bound          (given)     (given)   a bound the caller derives (quantization error, FP8 vs BF16);
                                     both tolerances must be passed
=============  ==========  ========  ===========================================================

``exact`` means the bits: floating tensors are compared through their integer views, so -0.0 is not
+0.0 and a NaN must carry the expected NaN's bits (sign and payload). Its findings say which kind of
bit difference each element has (a value, the sign of a zero, a NaN's bits). Integer tensors compare
their values as integers, which are their bits.

The envelope (SPEC §4.2). For ``attention`` and ``at12`` the caller may pass ``envelope=(lo, hi)``,
tensors of the compared shape holding every conforming result (golden/envelope/builder.py). An element then
passes when ``|actual - expected| <= atol + rtol * |expected|`` *or* ``lo <= actual <= hi``. Both
intervals contain ``expected``, so their union is one interval, and the rule reads per side: the
allowed error above ``expected`` is ``max(tol, hi - expected)``, below it ``max(tol, expected - lo)``.
The rule is never stricter than the tolerance alone; the result counts the elements that passed only
because of the envelope (``by_envelope``) and, for a failure, how far outside the envelope the worst
element lies in units of the tolerance (``outside_envelope``).

Overrides are both-or-neither: giving only ``rtol`` would silently keep the table's ``atol`` for a
comparison whose author believed they had set the whole rule. ``atol`` may be a tensor broadcastable
to the compared shape, for laws whose bound is derived per element (AT-12 FP8 vs BF16).
Closeness with both tolerances zero is numeric equality; ``exact`` adds the bit checks on top of it.

The table, the structured result and the failure text are properties/rule/compare_result.py (re-exported
here); this module computes.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pfa_verify.properties.rule.compare_result import (
    TOLERANCES,
    Comparison,
    NonFinite,
    Tolerance,
    envelope_line,
    get_tolerance,
    make_mismatch_message,
)

__all__ = ["TOLERANCES", "Tolerance", "NonFinite", "Comparison", "get_tolerance", "compare",
           "error_ratio", "max_differences", "make_mismatch_message", "envelope_line", "assert_close"]


def _view(t: torch.Tensor) -> torch.Tensor:
    """float32 values of a floating tensor; float64 of an integer one (for sizes and messages only: the
    match of integers is decided on the integers, :func:`_integer_distance`)."""
    if t.is_floating_point():
        return t.detach().to(torch.float32)
    return t.detach().to(torch.float64)


_INT64_MAX = torch.iinfo(torch.int64).max


def _integer_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """int64 ``|actual - expected|`` of two integer (or bool) tensors of one dtype, exactly, saturated at
    the int64 maximum where it does not fit (uint64 beyond 2**63 compares by equality only: distance
    maximal where the values differ)."""
    if actual.dtype == getattr(torch, "uint64", None):
        return torch.where(actual != expected, _INT64_MAX, 0)
    a, e = actual.detach().to(torch.int64), expected.detach().to(torch.int64)
    distance = torch.where(a >= e, a - e, e - a)
    return torch.where(distance < 0, _INT64_MAX, distance)      # wrapped past int64: the farthest apart


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The integer view of a floating tensor's storage (same width), for bit-identical checks."""
    return t.detach().contiguous().view(_INT_VIEWS[t.element_size()])


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for side in reversed(shape):
        out.append(flat % side if side else 0)
        flat = flat // side if side else 0
    return tuple(reversed(out))


def compare(actual: torch.Tensor, expected: torch.Tensor, *, kind: str = "attention",
            rtol: float | None = None, atol: float | torch.Tensor | None = None,
            s1: int | None = None, index_names: Sequence[str] | None = None,
            envelope: tuple[torch.Tensor, torch.Tensor] | None = None) -> Comparison:
    """Compare ``actual`` with ``expected`` and return a :class:`Comparison` (never raises on mismatch).

    Equivalent to ``(actual.float() - expected.float()).abs() <= atol + rtol * expected.float().abs()``
    on finite elements (integers: the exact integer distance), with shape, device, dtype, contiguity and
    non-finite placement checked first; with an
    ``envelope=(lo, hi)``, ``or lo <= actual <= hi`` (module docstring).
    ``s1`` renders indices of an attention output ``[B*S1, NQ, D]`` as ``(b, i, h, d)``.
    """
    rtol, atol = get_tolerance(kind, rtol, atol)
    if envelope is not None and kind not in ("attention", "at12"):
        raise ValueError(f"envelope applies to kind 'attention' or 'at12' (SPEC §4.2), not {kind!r}")
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        raise TypeError(f"compare takes tensors; got {type(actual).__name__} and {type(expected).__name__}")
    atol_scalar = None if isinstance(atol, torch.Tensor) else atol
    base: dict[str, Any] = dict(kind=kind, rtol=rtol, atol=atol_scalar, s1=s1,          # Comparison fields
                                index_names=tuple(index_names) if index_names else None)
    if tuple(actual.shape) != tuple(expected.shape):
        return Comparison(passed=False, wrong="shape", attribute=f"wrong shape: {tuple(actual.shape)}, expected "
                                                                 f"{tuple(expected.shape)}", **base)
    if actual.device != expected.device:
        return Comparison(passed=False, wrong="device", attribute=f"wrong device: {actual.device}, expected "
                                                                  f"{expected.device}", **base)
    if actual.dtype != expected.dtype:
        return Comparison(passed=False, wrong="dtype", attribute=f"wrong dtype: {_dtype_name(actual.dtype)}, expected "
                                                                 f"{_dtype_name(expected.dtype)}", **base)
    if expected.is_contiguous() and not actual.is_contiguous():
        return Comparison(passed=False, wrong="layout", attribute=f"wrong layout: strides {actual.stride()}, expected "
                                                                  f"{expected.stride()} (contiguous)", **base)
    a, e = _view(actual), _view(expected)
    total = a.numel()
    a_fin, e_fin = torch.isfinite(a), torch.isfinite(e)
    findings, bad_nonfinite = _nonfinite(actual, expected, a, e, a_fin, e_fin, kind)
    both = a_fin & e_fin
    diff = torch.where(both, (a - e).abs(), torch.zeros((), dtype=a.dtype))
    tolerance = atol + rtol * e.abs()
    if isinstance(tolerance, torch.Tensor):
        tolerance = torch.broadcast_to(tolerance.to(a.dtype), a.shape)
    allowed = tolerance
    if envelope is not None:
        if not actual.is_floating_point():
            raise TypeError(f"envelope applies to floating outputs, not {actual.dtype}")
        allowed = _envelope_allowed(a, e, tolerance, envelope)
    if actual.is_floating_point():
        bad_value = both & (diff > allowed)
    else:       # integers as integers: the exact distance, never a float64 view's (2**53 + 1 == 2**53 there)
        distance = _integer_distance(actual, expected)
        # distance > allowed  <=>  distance > floor(allowed), in int64 (floor(allowed) is an exact float64 integer).
        limit = torch.as_tensor(allowed, dtype=torch.float64).floor().clamp(max=2.0 ** 63 - 1024).to(torch.int64)
        bad_value = distance > limit
        diff = distance.to(torch.float64)
    bad = bad_value | bad_nonfinite
    mismatched = int(bad.sum())
    result: dict[str, Any] = dict(total=total, mismatched=mismatched, nonfinite=tuple(findings), mismatch_mask=bad)
    if envelope is not None:
        result.update(_envelope_fields(both, bad_value, diff, a, e, tolerance, envelope))
    if int(bad_value.sum()):
        result.update(_worst(bad_value, diff, a, e, allowed, rtol))
    return Comparison(passed=mismatched == 0, **result, **base)


def _nonfinite(actual: torch.Tensor, expected: torch.Tensor, a: torch.Tensor, e: torch.Tensor, a_fin: torch.Tensor,
               e_fin: torch.Tensor, kind: str) -> tuple[list[NonFinite], torch.Tensor]:
    """Step 2 of :func:`compare` (module docstring): the misplaced non-finite values, and for ``exact``
    floating tensors the bit differences of equal values, one :class:`NonFinite` per kind found, and
    the mask of those elements. ``a``, ``e``: the float views; ``a_fin``, ``e_fin``: where they are finite."""
    findings: list[NonFinite] = []
    bad_nonfinite = torch.zeros_like(a_fin)
    if kind != "exact" and bool(a_fin.all()) and bool(e_fin.all()):
        return findings, bad_nonfinite                # nothing non-finite to place: the common case, cheaply
    checks = [      # (what, where, the message section it is listed under)
        ("NaN where expected is finite", e_fin & torch.isnan(a), "Non-finite"),
        ("inf where expected is finite", e_fin & torch.isinf(a), "Non-finite"),
        ("finite where expected is NaN", torch.isnan(e) & a_fin, "Non-finite"),
        ("inf where expected is NaN", torch.isnan(e) & torch.isinf(a), "Non-finite"),
        ("not the expected inf", torch.isinf(e) & (a != e), "Non-finite"),
    ]
    if kind == "exact" and actual.is_floating_point():
        differ = _bits(actual) != _bits(expected)
        checks += [("zero of the other sign", differ & (a == 0) & (e == 0), "Bits differ"),
                   ("NaN with other bits than the expected NaN", differ & torch.isnan(a) & torch.isnan(e),
                    "Bits differ")]
    for what, mask, section in checks:
        n = int(mask.sum())
        if n:
            first = _unravel(int(mask.reshape(-1).nonzero()[0]), a.shape)
            findings.append(NonFinite(what, n, first, section))
            bad_nonfinite |= mask
    return findings, bad_nonfinite


def _envelope_fields(both: torch.Tensor, bad_value: torch.Tensor, diff: torch.Tensor, a: torch.Tensor, e: torch.Tensor,
                     tolerance: torch.Tensor, envelope: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """What the envelope did (the :class:`Comparison` fields): the elements it accepted beyond the
    tolerance, and for a failure how far outside it the worst value mismatch lies, in tolerances."""
    fields: dict[str, Any] = dict(envelope=True, by_envelope=int((both & ~bad_value & (diff > tolerance)).sum()))
    if int(bad_value.sum()):
        lo, hi = (_view(x) for x in envelope)
        outside = torch.where(a > e, a - hi, lo - a) / tolerance
        outside = torch.where(bad_value, outside, torch.full((), -1.0, dtype=a.dtype))
        i_out = int(outside.reshape(-1).argmax())
        fields.update(outside_envelope=float(outside.reshape(-1)[i_out]), outside_index=_unravel(i_out, a.shape),
                      outside_abs_err=float(diff.reshape(-1)[i_out]))
    return fields


def _worst(bad_value: torch.Tensor, diff: torch.Tensor, a: torch.Tensor, e: torch.Tensor,
           allowed: torch.Tensor | float, rtol: float) -> dict[str, Any]:
    """The greatest absolute and relative differences among the value mismatches ``bad_value`` (at
    least one), with their indices and what was allowed there: the :class:`Comparison` fields."""
    masked_abs = torch.where(bad_value, diff, torch.full((), -1.0, dtype=a.dtype))
    i_abs = int(masked_abs.reshape(-1).argmax())
    with torch.no_grad():
        rel = torch.where(bad_value, diff / e.abs(), torch.full((), -1.0, dtype=a.dtype))
    rel = torch.nan_to_num(rel, nan=-1.0, posinf=math.inf)
    i_rel = int(rel.reshape(-1).argmax())
    # The rule's own measure: how many times what is allowed there each mismatch is off by (0 allowed: inf).
    with torch.no_grad():
        beyond = torch.where(bad_value, diff / allowed, torch.full((), -1.0, dtype=a.dtype))
    beyond = torch.nan_to_num(beyond, nan=math.inf, posinf=math.inf)
    i_beyond = int(beyond.reshape(-1).argmax())
    return dict(
        beyond_allowed=float(beyond.reshape(-1)[i_beyond]), beyond_index=_unravel(i_beyond, a.shape),
        beyond_abs_err=float(diff.reshape(-1)[i_beyond]),
        beyond_allowed_there=float(allowed.reshape(-1)[i_beyond]) if isinstance(allowed, torch.Tensor) else float(allowed),
        max_abs_err=float(diff.reshape(-1)[i_abs]), max_abs_index=_unravel(i_abs, a.shape),
        max_abs_allowed=float(allowed.reshape(-1)[i_abs]) if isinstance(allowed, torch.Tensor) else float(allowed),
        max_rel_err=float(rel.reshape(-1)[i_rel]), max_rel_index=_unravel(i_rel, a.shape),
        max_rel_allowed=rtol)


def _envelope_allowed(a: torch.Tensor, e: torch.Tensor, tolerance: torch.Tensor | float,
                      envelope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Per element, the error the rule allows on the side ``a`` lies: ``max(tol, hi - e)`` above ``e``,
    ``max(tol, e - lo)`` below (the union of ``e +- tol`` and ``[lo, hi]``, one interval around ``e``)."""
    lo, hi = envelope
    if not isinstance(lo, torch.Tensor) or not isinstance(hi, torch.Tensor):
        raise TypeError("envelope must be a pair of tensors (lo, hi)")
    if tuple(lo.shape) != tuple(a.shape) or tuple(hi.shape) != tuple(a.shape):
        raise ValueError(f"envelope shapes {tuple(lo.shape)}, {tuple(hi.shape)} must equal the compared shape {tuple(a.shape)}")
    lo, hi = _view(lo).to(a.dtype), _view(hi).to(a.dtype)
    side = torch.where(a >= e, hi - e, e - lo)
    side = torch.nan_to_num(side, nan=0.0)          # no envelope where the golden is not finite
    return torch.maximum(torch.broadcast_to(torch.as_tensor(tolerance, dtype=a.dtype), a.shape), side)


def error_ratio(actual: torch.Tensor, expected: torch.Tensor, *, kind: str = "attention",
                rtol: float | None = None, atol: float | torch.Tensor | None = None,
                envelope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """float32 per element: ``|actual - expected|`` over what the rule allows there (``atol + rtol *
    |expected|``, widened on each side by the ``envelope`` when given; 1 = the edge of the rule).
    ``inf`` where non-finite values are misplaced, 0 where both hold the same non-finite value. The
    search target of the laws and the reports' error pictures."""
    rtol, atol = get_tolerance(kind, rtol, atol)
    a, e = _view(actual).float(), _view(expected).float()
    both = torch.isfinite(a) & torch.isfinite(e)
    allowed = atol + rtol * e.abs()
    if envelope is not None:
        allowed = _envelope_allowed(a, e, allowed, envelope)
    floating = actual.is_floating_point()
    if floating and isinstance(allowed, torch.Tensor) and bool(both.all()) and bool((allowed > 0).all()):
        return (a - e).abs_().div_(allowed)          # every element finite, every allowance positive: the plain ratio
    distance = (a - e).abs() if floating else _integer_distance(actual, expected).to(torch.float32)
    with torch.no_grad():
        r = torch.where(both, distance / allowed, torch.zeros((), dtype=torch.float32))
    r = torch.nan_to_num(r, nan=math.inf, posinf=math.inf)   # 0 / 0 with a zero tolerance: equal
    equal = (a == e) if floating else (actual == expected)
    r = torch.where(both & equal, torch.zeros((), dtype=torch.float32), r)
    same_nonfinite = ~torch.isfinite(a) & ~torch.isfinite(e) & ((a == e) | (torch.isnan(a) & torch.isnan(e)))
    return torch.where(both | same_nonfinite, r, torch.full((), math.inf))


def max_differences(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(greatest |actual - expected|, greatest relative difference over non-zero ``expected``) over the
    elements where both are finite: the noise a passing comparison still shows (a :class:`Comparison`
    reports maxima over its mismatches only)."""
    a, e = _view(actual), _view(expected)
    both = torch.isfinite(a) & torch.isfinite(e)
    diff = torch.where(both, (a - e).abs(), torch.zeros((), dtype=a.dtype))
    rel = torch.where(both & (e != 0), diff / e.abs(), torch.zeros((), dtype=a.dtype))
    return (float(diff.max()) if diff.numel() else 0.0, float(rel.max()) if rel.numel() else 0.0)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, kind: str = "attention",
                 rtol: float | None = None, atol: float | torch.Tensor | None = None,
                 identifier: str | Callable[[], str] = "Tensors", tags: dict[str, object] | None = None,
                 context: Sequence[str] | Callable[[Comparison], Sequence[str]] = (),
                 s1: int | None = None, envelope: tuple[torch.Tensor, torch.Tensor] | None = None) -> Comparison:
    """Raise AssertionError with the suite's message unless ``actual`` is close to ``expected``.

    The plain assert it stands for::

        assert ((actual.float() - expected.float()).abs()
                <= atol + rtol * expected.float().abs()).all()

    plus the attribute and non-finite checks of :func:`compare`. ``context`` may be a callable
    taking the failed :class:`Comparison`, so attribution is only computed on failure. Returns the
    passing :class:`Comparison` (its maxima are zero).

    >>> assert_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]), kind="exact", identifier="x")
    Traceback (most recent call last):
    ...
    AssertionError: x not bit-identical
    Mismatched elements: 1 / 2 (50.0%)
    Greatest absolute difference: 5.0e-01 at (1,) (0.0e+00 allowed there)
    Greatest relative difference: 2.0e-01 at (1,) (0.0e+00 allowed)
    """
    __tracebackhide__ = True
    result = compare(actual, expected, kind=kind, rtol=rtol, atol=atol, s1=s1, envelope=envelope)
    if not result.passed:
        lines = context(result) if callable(context) else context
        raise AssertionError(make_mismatch_message(result, identifier=identifier, tags=tags,
                                                   context=lines)) from None
    return result
