"""Conforming variants: correct kernels that use only SPEC §4.1's freedoms, the counterpart
of the mutant catalog (kernels/mutants). A mutant must fail a law; a conforming variant must never.

Each variant is a backend (``kernels.get_backend("conforming:NAME")``) built on
kernels/conforming/kernel.py; :data:`VARIANTS` lists them with what each one does differently from the
golden. ``pfa-verify conforming`` runs them through every law and the catalog and counts
false reds; tests/golden/test_envelope.py holds the envelope against them.
"""
from __future__ import annotations

from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.conforming.kernel import EITHER_EDGE, ConformingKernel, Variant

__all__ = ["VARIANTS", "Variant", "ConformingKernel", "get_variant"]

_V = Variant
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    _V("forward", "every float32 sum sequential from the first term; SPEC §2.3's scale order"),
    _V("reverse-upstream", "every sum sequential from the last term; upstream's dequant order (S k_scale) q_scale "
       "and (O v_scale) p_scale", mm1="reverse", mm2="reverse", row_sum="reverse", scale_order="upstream"),
    _V("pairwise-fused", "every sum as a balanced tree; the two scales multiplied first", mm1="pairwise",
       mm2="pairwise", row_sum="pairwise", scale_order="fused"),
    _V("blocked16", "sums in blocks of 16 (a cube unit's reduction), then across blocks", mm1="blocked16",
       mm2="blocked16", row_sum="blocked16"),
    _V("blocked32-fma", "sums in blocks of 32; the online update with fused multiply-adds", mm1="blocked32",
       mm2="blocked32", row_sum="blocked32", update="fma"),
    _V("kahan", "compensated (Kahan) sums", mm1="kahan", mm2="kahan", row_sum="kahan"),
    _V("shuffled", "every sum sequential in a random order of its terms", mm1="shuffled", mm2="shuffled",
       row_sum="shuffled"),
    _V("exp-up-div-up", "exp 3 float32 steps above the correctly rounded value, never past 3 ulp of the exact "
       "one (exp(0) = 1); O / l 1 ulp up", exp_ulps=3, division="up"),
    _V("exp-down-div-down", "exp 3 steps below, never past 3 ulp; O / l 1 ulp down; sums reversed", exp_ulps=-3,
       division="down", mm1="reverse", mm2="reverse", row_sum="reverse"),
    _V("reciprocal", "O * (1 / l) (within 1 ulp); exp 1 ulp up; upstream's scale order", division="reciprocal",
       exp_ulps=1, scale_order="upstream"),
    _V("edges-up", "every exp (P, and the update's factors a and c) at the greatest float32 F3 allows (3 ulp), "
       "with SPEC's ulp (up to 6 steps of the lower binade below a power of two; 1 + 2**-23 just below x = 0); "
       "O / l at the greatest within 1 ulp", exp_edge=1, division="edge-up"),
    _V("edges-down", "every exp at the least float32 F3 allows (SPEC's ulp); O / l at the least within 1 ulp; "
       "sums reversed", exp_edge=-1, division="edge-down", mm1="reverse", mm2="reverse", row_sum="reverse"),
    _V("edges-mixed", "exp at the greatest float32 F3 allows, O / l at the least; upstream's scale order",
       exp_edge=1, division="edge-down", scale_order="upstream"),
    _V("edges-either", "every exp at the greatest or the least float32 F3 allows (3 ulp), at random for each "
       "element on every call: P errs both ways within a row (a common factor would cancel in O / l); sums as "
       "a balanced tree", exp_edge=EITHER_EDGE, mm1="pairwise", mm2="pairwise", row_sum="pairwise"),
    _V("vertex-low", "every raw score at the low end of the envelope's interval", mm1="vertex-low"),
    _V("vertex-high", "every raw score at the high end of the envelope's interval", mm1="vertex-high"),
    _V("vertex-mixed", "every raw score at either end of its interval, at random; exp 3 steps down, never past "
       "3 ulp", mm1="vertex-mixed", exp_ulps=-3),
)}


def get_variant(name: str, **options) -> ConformingKernel:
    """The backend of conforming variant ``name`` (options: ``codec``, ``seed``)."""
    if name not in VARIANTS:
        raise UsageError(f"conforming variant {name!r} is not in the catalog; expected one of {sorted(VARIANTS)}")
    return ConformingKernel(VARIANTS[name], **options)
