"""What a comparison of properties/rule/compare.py says (SPEC §4): the tolerance table and its overrides
(:func:`get_tolerance`), the structured result (:class:`Comparison`, :class:`NonFinite`) and its
failure text (:func:`make_mismatch_message`, :func:`envelope_line`). properties/rule/compare.py computes
the comparison and re-exports these names; its module docstring states the rule.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

__all__ = ["TOLERANCES", "Tolerance", "NonFinite", "Comparison", "get_tolerance", "make_mismatch_message",
           "envelope_line"]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float | None   # None: the caller derives and passes the bound (kind "bound")
    atol: float | None
    cite: str  # the clause the numbers come from, shown in the header


TOLERANCES: dict[str, Tolerance] = {
    "attention": Tolerance(1 / 128, 1e-4, "SPEC §4"),
    "at12": Tolerance(1 / 128, 1e-4, "SPEC §6"),
    "exact": Tolerance(0.0, 0.0, "bit-identical"),
    "bound": Tolerance(None, None, "derived bound"),
}


def get_tolerance(kind: str = "attention", rtol: float | None = None,
                  atol: float | torch.Tensor | None = None) -> tuple[float, float | torch.Tensor]:
    """Return ``(rtol, atol)`` for ``kind``, or the override when both are given."""
    if kind not in TOLERANCES:
        raise ValueError(f"kind={kind!r} is not a known comparison; expected one of {sorted(TOLERANCES)}")
    if (rtol is None) != (atol is None):
        # Half an override is almost always a mistake: the other half would silently come from
        # the table, and the author would believe they had set the whole rule.
        raise ValueError(f"rtol and atol must both be given or both omitted; got rtol={rtol!r}, "
                         f"atol={'<tensor>' if isinstance(atol, torch.Tensor) else atol!r}")
    if rtol is None or atol is None:       # both None (checked above): the table's rule
        t = TOLERANCES[kind]
        if t.rtol is None or t.atol is None:
            raise ValueError(f"kind={kind!r} takes the bound from the caller: pass both rtol and atol")
        return t.rtol, t.atol
    if kind == "exact":
        # Bit identity has no tolerance to override; a loosened "exact" would read as bit-identical.
        raise ValueError("kind='exact' compares bits and takes no rtol / atol; use kind='bound'")
    if not rtol >= 0:
        raise ValueError(f"rtol={rtol!r} must be >= 0")
    if isinstance(atol, torch.Tensor):
        if bool((atol < 0).any()) or bool(torch.isnan(atol).any()):
            raise ValueError("atol tensor must be >= 0 everywhere")
    elif not atol >= 0:
        raise ValueError(f"atol={atol!r} must be >= 0")
    return float(rtol), atol


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """Elements whose finiteness differs from the expected tensor's, or (``exact``) whose bits
    differ where the values are equal: a zero of the other sign, a NaN with other bits."""
    what: str            # e.g. "NaN where expected is finite"
    count: int
    first_index: tuple[int, ...]
    section: str = "Non-finite"   # or "Bits differ"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The structured outcome of one comparison; :func:`make_mismatch_message` renders it."""
    passed: bool
    kind: str
    rtol: float
    atol: float | None          # None when atol was given per element
    total: int = 0
    mismatched: int = 0
    max_abs_err: float = 0.0
    max_abs_index: tuple[int, ...] | None = None
    max_abs_allowed: float = 0.0
    max_rel_err: float = 0.0
    max_rel_index: tuple[int, ...] | None = None
    max_rel_allowed: float = 0.0
    nonfinite: tuple[NonFinite, ...] = ()
    attribute: str | None = None   # "wrong shape: (2, 3), expected (2, 4)" when attributes differ
    wrong: str | None = None       # which differs then: "shape", "device", "dtype" or "layout" (contiguity)
    index_names: tuple[str, ...] | None = None
    s1: int | None = None
    mismatch_mask: torch.Tensor | None = dataclasses.field(default=None, repr=False, compare=False)
    envelope: bool = False              # whether an envelope widened the rule (SPEC §4.2)
    by_envelope: int = 0                # elements outside the tolerance but inside the envelope
    outside_envelope: float = 0.0       # worst mismatch's distance outside the envelope / its tolerance
    outside_index: tuple[int, ...] | None = None
    outside_abs_err: float = 0.0        # |actual - expected| at outside_index
    beyond_allowed: float = 0.0         # the mismatch farthest beyond the tolerance: |diff| / allowed there
    beyond_index: tuple[int, ...] | None = None
    beyond_abs_err: float = 0.0
    beyond_allowed_there: float = 0.0

    def worst_line(self) -> str | None:
        """The failure's headline: its worst element by the rule's own measure, how far beyond what the rule
        allows there (outside the envelope, in its tolerances, when an envelope widened the rule); None when
        no value mismatched, or for a bit-exact comparison."""
        if self.kind == "exact":    # nothing is allowed anywhere: the sections below say where it differs
            return None
        if self.nonfinite:          # a misplaced NaN or inf is beyond any tolerance
            first = self.nonfinite[0]
            return f"Worst element by the rule: {self.format_index(first.first_index)}, {first.what}"
        if self.envelope and self.outside_index is not None:
            return (f"Worst element by the rule: {self.format_index(self.outside_index)}, off by "
                    f"{self.outside_abs_err:.1e}, outside the envelope by {self.outside_envelope:.2g}x its tolerance")
        if self.beyond_index is None:
            return None
        times = "any difference" if self.beyond_allowed_there == 0 else f"{self.beyond_allowed:.2g}x"
        return (f"Worst element by the rule: {self.format_index(self.beyond_index)}, off by {self.beyond_abs_err:.1e} "
                f"where {self.beyond_allowed_there:.1e} is allowed ({times})")

    def format_index(self, index: tuple[int, ...] | None) -> str:
        """Render an index, as (b, i, h, d) for attention outputs when ``s1`` was given."""
        if index is None:
            return "-"
        if self.s1 is not None and len(index) == 3:
            row, h, d = index
            return f"(b={row // self.s1}, i={row % self.s1}, h={h}, d={d})"
        if self.index_names and len(self.index_names) == len(index):
            return "(" + ", ".join(f"{n}={v}" for n, v in zip(self.index_names, index, strict=True)) + ")"
        return str(tuple(index))


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "-"


def make_mismatch_message(result: Comparison, *, identifier: str | Callable[[], str],
                          tags: dict[str, object] | None = None, context: Sequence[str] = ()) -> str:
    """Render a failed :class:`Comparison` as the suite's failure text.

    ``identifier`` names what was compared ("Kernel output vs golden"); ``tags`` go in brackets on
    the header (case, backend); ``context`` lines (attribution, replay command) come last, in order.
    """
    name = identifier() if callable(identifier) else identifier
    if result.attribute is not None:        # not a numeric failure: the attribute is the headline
        bracket = " [" + ", ".join(f"{k} {v}" for k, v in tags.items()) + "]" if tags else ""
        return "\n".join([f"{name}: {result.attribute}{bracket}", *context])
    tol = TOLERANCES[result.kind]
    exact = result.rtol == 0 and result.atol == 0
    header = f"{name} {'not bit-identical' if result.kind == 'exact' else 'not equal' if exact else 'not close'}"
    if not exact:
        cite = f"{tol.cite}, or inside the envelope of SPEC §4.2" if result.envelope else tol.cite
        header += f" ({cite})" if result.rtol == tol.rtol and result.atol == tol.atol else \
            f" (rtol={result.rtol:.3g}, atol={'per element' if result.atol is None else format(result.atol, '.3g')})"
    if tags:
        header += " [" + ", ".join(f"{k} {v}" for k, v in tags.items()) + "]"
    lines = [header]
    worst = result.worst_line()
    if worst is not None:
        lines.append(worst)
    lines.append(f"Mismatched elements: {result.mismatched} / {result.total} "
                 f"({_pct(result.mismatched, result.total)})")
    for f in result.nonfinite:
        lines.append(f"{f.section}: {f.count} {f.what}, first at {result.format_index(f.first_index)}")
    if result.max_abs_index is not None:
        lines.append(f"Greatest absolute difference: {result.max_abs_err:.1e} at "
                     f"{result.format_index(result.max_abs_index)} "
                     f"({result.max_abs_allowed:.1e} allowed there)")
        lines.append(f"Greatest relative difference: {result.max_rel_err:.1e} at "
                     f"{result.format_index(result.max_rel_index)} "
                     f"({result.max_rel_allowed:.1e} allowed)")
    if result.envelope:
        lines.append(envelope_line(result))
    lines.extend(context)
    return "\n".join(lines)


def envelope_line(result: Comparison) -> str:
    """What the envelope did in a comparison: how many elements it accepted beyond the tolerance, and
    for a failure how far outside it the worst element lies (SPEC §4.2)."""
    inside = (f"{result.by_envelope} element{'s' if result.by_envelope != 1 else ''} inside the envelope "
              "only (an E4M3 code of P can flip there under SPEC §4.1)" if result.by_envelope else
              "no element needed the envelope")
    if result.outside_index is None:
        return f"Envelope: {inside}"
    return (f"Envelope: {inside}; the worst mismatch lies outside it by {result.outside_envelope:.2g}x its "
            f"tolerance at {result.format_index(result.outside_index)}")
