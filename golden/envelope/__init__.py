"""The acceptance envelope (SPEC §4.2): per output element, an interval holding every conforming result.

A conforming kernel (SPEC §4.1, :class:`golden.model.ConformanceModel`) may sum in any float32 order
(F1), multiply the dequant scales in any order (F2) and use an ``exp`` within 3 ulp and a division
within 1 ulp (F3). With large logits a few ulps of S move an element of P across an E4M3 rounding
boundary, and the output moves by more than SPEC §4's tolerance. :func:`paged_attention_envelope`
returns ``[lo, hi]`` per output element, sound by construction: every stage of SPEC §2 is carried as
an interval, rounded outward (golden/intervals.py), for one (batch, kv head, row, tile) at a time:

1. MM1. ``raw`` lies within ``E1`` of the exact sum ``s = q8 . k8``: the any-order bound, 0 where the
   exactness certificate holds, the sharper residue bound where the plain one lets a code of P flip
   or moves l visibly (for the scores whose P can exceed NEGLIGIBLE_P: on degenerate rows that is 1%
   of them, and the residue walk costs a pass over the products per spacing).
2. Dequant (F2). ``S = raw * q_scale * k_scale * softmax_scale``, the two dequant scales in either order
   or multiplied together first, ``softmax_scale`` last: the union of the three chains, exactly.
3. Local softmax. ``m_j`` lies between the row maxima of the ends of S; ``x = S - m_j`` in
   ``[S_lo - m_hi, min(0, S_hi - m_lo)]``; ``P = exp(x)`` within ``exp_ulps`` (``exp(0) = 1``).
4. P quantization. The row max of P is at least 1 (the argmax gives ``exp(0)``) and at most the
   largest P F3 allows (1 + 2**-23 with 3 ulp: an x just below 0 may round above 1), so the P scale is
   in ``[448 / max P_hi, 448]``; the codes reachable are those between the codes of the two ends
   (encode and decode are monotone in every codec): an element whose two ends give different codes
   is *flippable*, a proof that a conforming kernel may quantize it either way.
5. MM2. The golden's ``P8 @ v8`` plus the flippable codes' deviations (sparse), within the any-order
   bound of the tile's sum, then ``* p_scale * v_scale`` (F2: either order, or the scales multiplied
   first, whose product's rounding is absolute where it is a float32 subnormal: stages.mm2_scaled_interval).
6. Online update, in closed form. Unrolled, the kernel's state after the last tile is
   ``O = sum_j w_j O_j`` and ``l = sum_j w_j l_j`` with ``w_j = exp(m_j - M)`` up to the roundings of the
   factors ``a``, ``c`` and of the recurrence; a factor common to both cancels in ``O / l``, and
   ``w_j l_j = sum_t exp(S_t - M)``. So ``out = N / L`` with ``N = sum_j exp(m_j - mu) O_j`` and ``L =
   sum_t exp(S_t - mu)`` for any ``mu``: the uncertainty of a tile's max counts once (in N), not three
   times as a step-by-step interval fold would count it (in a, c and l_j).
7. ``O / l`` within ``div_ulps`` (SPEC's ulp); bf16 round to nearest even of each end (monotone). Rows
   with ``cur == 0`` are ``[0, 0]``.
8. Degenerate rows (scores uncertain by more than a logit): also a near-convex combination of the tiles'
   means, and a degenerate tile's mean one of the V rows that can matter; the envelope is the
   intersection.

The golden (exact sums, correctly rounded exp and division) is one conforming execution: it always
lies inside. ``tests/golden/test_envelope.py`` holds containment and runs conforming variants and
vertex kernels (every raw score at an end of its interval) against it; the acceptance rule that uses
it is ``properties.rule.acceptance.judge``. The package in three modules:

- ``stages``: the bounds of single stages (steps 1-5, and the sum of l) and the tables they read, each
  tested alone at its tightest inputs (tests/golden/test_stage_bounds.py);
- ``builder``: :class:`EnvelopeBuilder`, which carries them per tile as golden/attention.py hands it
  each chunk of its own evaluation, and :class:`AttentionEnvelope`, the result;
- ``fold``: the fold of each row's tiles (steps 6-8).

The float32 rounding and any-order sum bounds they all read are golden/intervals.py (shared with AT-12
and the laws).
"""
from .builder import AttentionEnvelope, EnvelopeBuilder, TileBounds, TileChunk

__all__ = ["AttentionEnvelope", "TileChunk", "EnvelopeBuilder", "TileBounds"]
