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

__all__ = ["ORDERS", "fsum", "exp_ulps", "fma", "divide"]

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
    value, except ``exp(0) = 1`` exactly (SPEC §4.1 F3 allows |ulps| <= 2)."""
    exact = torch.exp(x.double()).float()
    out = exact
    direction = torch.tensor(math.inf if ulps > 0 else -math.inf)
    for _ in range(abs(ulps)):
        out = torch.nextafter(out, direction)
    out = torch.where(exact > 0, out, exact)       # no step below 0 or off an underflowed 0
    return torch.where(x == 0, torch.ones_like(out), out)


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
    ``up`` / ``down`` (the correctly rounded quotient one float32 step up / down: 1 ulp off).

    ``o * RN(1 / l)`` has two roundings and can land more than 1 ulp from the quotient; SPEC §4.1 F3
    allows reciprocal and multiplication *within 1 ulp*, so where it does not, the variant returns the
    correctly rounded quotient, as a kernel meeting F3 must.
    """
    q = o / l
    if how == "divide":
        return q
    if how in ("up", "down"):
        return torch.nextafter(q, torch.tensor(math.inf if how == "up" else -math.inf))
    if how == "reciprocal":
        r = o * torch.reciprocal(l)
        exact = o.double() / l.double()
        below = torch.nextafter(q, torch.tensor(-math.inf))
        above = torch.nextafter(q, torch.tensor(math.inf))
        within = ((r.double() - exact).abs() <= (above.double() - below.double()) / 2)
        return torch.where(within, r, q)
    raise ValueError(f"how={how!r} must be divide, reciprocal, up or down")
