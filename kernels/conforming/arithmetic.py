"""float32 arithmetic a conforming kernel may use (SPEC §4.1), written out so that nothing is exact by
accident: sums in a chosen order or tree (F1), exp a chosen number of ulps off (F3), division or
reciprocal (F3), and a fused multiply-add rounded once (F1).

Every operation here is a float32 torch operation (round to nearest even), vectorized over the leading
dimensions; the reductions run along the last dimension. Products of E4M3 values (and of bf16 values)
are exact in float32, so a sum of them in any of these orders is one execution SPEC §4.1 F1 allows.
"""
from __future__ import annotations

import math

import torch

from pfa_verify.golden.model import SPEC_MODEL

__all__ = ["ORDERS", "fsum", "exp_ulps", "exp_edge", "fma", "divide", "DIVISIONS"]

ORDERS = ("forward", "reverse", "pairwise", "blocked16", "blocked32", "kahan", "shuffled")


def fsum(x: torch.Tensor, order: str, *, seed: int = 0) -> torch.Tensor:
    """float32 sum of ``x`` [..., n] along the last axis, one float32 addition at a time in ``order``:

    - ``forward`` / ``reverse``: sequential from the first / last term;
    - ``pairwise``: a balanced tree (neighbours first, an odd term carried up);
    - ``blocked16`` / ``blocked32``: sequential within blocks of 16 / 32 terms, then the blocks'
      sums sequentially (a cube unit's reduction);
    - ``kahan``: compensated summation (Kahan; more accurate than any tree);
    - ``shuffled``: sequential in a random permutation of the terms (``seed``), one per call.
    """
    x = x.float()
    n = x.shape[-1]
    if n == 0:
        return torch.zeros(x.shape[:-1])
    if order == "forward":
        return _sequential(x)
    if order == "reverse":
        return _sequential(x.flip(-1))
    if order == "shuffled":
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        return _sequential(x[..., perm])
    if order == "pairwise":
        while x.shape[-1] > 1:
            if x.shape[-1] % 2:
                x = torch.cat([x[..., :-1:2] + x[..., 1::2], x[..., -1:]], dim=-1)
            else:
                x = x[..., ::2] + x[..., 1::2]
        return x[..., 0]
    if order in ("blocked16", "blocked32"):
        size = int(order.removeprefix("blocked"))
        pad = (-n) % size
        if pad:  # exact zeros change no partial sum
            x = torch.cat([x, torch.zeros(x.shape[:-1] + (pad,))], dim=-1)
        blocks = x.reshape(x.shape[:-1] + (-1, size))
        return _sequential(_sequential(blocks))
    if order == "kahan":
        total = torch.zeros(x.shape[:-1])
        carry = torch.zeros(x.shape[:-1])
        for i in range(n):
            y = x[..., i] - carry
            t = total + y
            carry = (t - total) - y
            total = t
        return total
    raise ValueError(f"order={order!r} must be one of {ORDERS}")


def _sequential(x: torch.Tensor) -> torch.Tensor:
    total = x[..., 0].clone()
    for i in range(1, x.shape[-1]):
        total = total + x[..., i]
    return total


def exp_ulps(x: torch.Tensor, ulps: int = 0) -> torch.Tensor:
    """float32 ``exp(x)`` moved ``ulps`` float32 steps (negative: down) from the correctly rounded
    value, but never past the edge of ``|ulps|`` SPEC ulps from the exact value (:func:`exp_edge`), and
    ``exp(0) = 1`` exactly: within ``|ulps|`` ulp, as SPEC §4.1 F3 allows for ``|ulps| <= 3``.

    The steps alone would not be: the correctly rounded value is already up to half an ulp off, on the
    side of the steps half of the time (``n`` steps reach ``n + 1/2`` ulp), and steps up from just below a
    power of two are the upper binade's (``2 n + 1/2`` ulp). Where the steps would pass the edge the result
    is the edge, so away from powers of two it lies between ``n - 1`` and ``n`` ulp from the exact value."""
    exact = torch.exp(x.double()).float()
    out = exact
    direction = torch.tensor(math.inf if ulps > 0 else -math.inf)
    for _ in range(abs(ulps)):
        out = torch.nextafter(out, direction)
    out = torch.where(exact > 0, out, exact)       # no step below 0 or off an underflowed 0
    if ulps:
        edge = exp_edge(x, 1 if ulps > 0 else -1, float(abs(ulps)))
        out = torch.minimum(out, edge) if ulps > 0 else torch.maximum(out, edge)
    return torch.where(x == 0, torch.ones_like(out), out)


def _spec_ulp(t: torch.Tensor) -> torch.Tensor:
    """float64 SPEC §4.1's ulp of the (float64) value t: ``2**(max(floor(log2 |t|), -126) - 23)``."""
    _, exponent = torch.frexp(t.abs())                     # |t| = m 2**e, m in [1/2, 1): floor(log2 |t|) = e - 1
    exponent = torch.where(t == 0, torch.tensor(-126, dtype=exponent.dtype), exponent - 1)
    return torch.ldexp(torch.ones_like(t), exponent.clamp(min=-126) - 23)


def _farthest(t: torch.Tensor, side: int, ulps: float) -> torch.Tensor:
    """float32: starting from RN(t), the float32 farthest on ``side`` (+1 up, -1 down) whose distance from
    the exact value stays within ``ulps`` SPEC ulps. ``t`` is float64, within 2**-52 of the exact value:
    a step must clear the limit by 2**-50 |t| (so a variant never steps past the edge; where a float32 lies
    that close to the edge it stops one short)."""
    limit = t + side * (ulps * _spec_ulp(t) - t.abs() * 2.0 ** -50)
    if side < 0:
        limit = limit.clamp(min=0.0)
    y = t.float()
    toward = torch.tensor(math.inf if side > 0 else -math.inf)
    for _ in range(int(2 * ulps) + 3):
        step = torch.nextafter(y, toward)
        inside = (step.double() <= limit) if side > 0 else (step.double() >= limit)
        y = torch.where(inside, step, y)
    return y


def exp_edge(x: torch.Tensor, side: int, ulps: float = SPEC_MODEL.exp_ulps) -> torch.Tensor:
    """float32 ``exp(x)`` at the very edge SPEC §4.1 F3 allows on ``side`` (+1: the greatest float32 within
    ``ulps`` ulp of the exact value, -1: the least, never below 0), with SPEC's ulp (of the exact result):
    just above a power of two that is ``ulps`` steps of the upper binade below it, twice as many steps of
    the lower one. ``ulps``: F3's 3 unless given (a result between 2 and 3 ulp from the exact value, the
    farthest float32 F3 allows; 1 + 2**-23 for x = -2**-24, above exp(0)). ``exp(0) = 1`` exactly. Written
    independently of the envelope's ``exp_bounds``."""
    t = torch.exp(x.double())
    # For x < 0 the exact value is below 1 even where float64 rounds it to 1 (|x| < 2**-54): its ulp is the
    # lower binade's, and 1 - 2**-53 stands for it.
    t = torch.where((x < 0) & (t >= 1), 1 - 2.0 ** -53, t)
    out = _farthest(t, side, ulps)
    return torch.where(x == 0, torch.ones_like(out), out)


DIVISIONS = ("divide", "reciprocal", "up", "down", "edge-up", "edge-down")


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 ``a * b + c`` rounded once (a fused multiply-add), exactly.

    ``a * b`` is exact in float64; ``s = fl64(a b + c)`` and its exact error ``e`` (TwoSum) give the
    exact sum ``s + e``. Rounding ``s`` to float32 gives the right answer unless ``s`` is exactly a
    float32 midpoint (``e`` is below a float64 ulp of ``s``, and midpoints are float64 numbers), where
    ``e``'s sign decides the side.
    """
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    e = (p - (s - bb)) + (cd - bb)
    r = s.float()
    toward = torch.where(s > r.double(), torch.tensor(math.inf), torch.tensor(-math.inf))
    other = torch.nextafter(r, toward)
    midpoint = (r.double() + other.double()) / 2 == s
    tie = midpoint & (e != 0)
    fixed = torch.where((e > 0) == (other.double() > r.double()), other, r)
    return torch.where(tie, fixed, r)


def divide(o: torch.Tensor, l: torch.Tensor, how: str = "divide") -> torch.Tensor:
    """float32 ``o / l``: ``divide`` (correctly rounded), ``reciprocal`` (``o * RN(1 / l)``),
    ``up`` / ``down`` (the correctly rounded quotient one float32 step up / down), ``edge-up`` /
    ``edge-down`` (the farthest float32 within 1 SPEC ulp of the quotient, :func:`exp_edge`'s rule).

    ``o * RN(1 / l)`` has two roundings and can land more than 1 ulp from the quotient; SPEC §4.1 F3
    allows reciprocal and multiplication *within 1 ulp*, so where it does not, the variant returns the
    correctly rounded quotient, as a kernel meeting F3 must.
    """
    q = o / l
    if how == "divide":
        return q
    if how in ("up", "down"):
        return torch.nextafter(q, torch.tensor(math.inf if how == "up" else -math.inf))
    if how in ("edge-up", "edge-down"):
        return _farthest(o.double() / l.double(), 1 if how == "edge-up" else -1, 1.0)
    if how == "reciprocal":
        r = o * torch.reciprocal(l)
        exact = o.double() / l.double()
        below = torch.nextafter(q, torch.tensor(-math.inf))
        above = torch.nextafter(q, torch.tensor(math.inf))
        within = ((r.double() - exact).abs() <= (above.double() - below.double()) / 2)
        return torch.where(within, r, q)
    raise ValueError(f"how={how!r} must be one of {DIVISIONS}")
