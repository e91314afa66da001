"""The tile-by-tile online softmax: local softmax of one tile and the running (m, l, O) state (SPEC §2.3-2.5).

Per tile j, with the dequantized and scaled scores S of the tile's valid columns:

    m_j = rowmax(S)      P = exp(S - m_j)      l_j = rowsum(P)

First tile: ``(m, l, O) = (m_j, l_j, O_j)``. Later tiles:

    m' = max(m, m_j);  a = exp(m - m');  c = exp(m_j - m')
    l  = a*l + c*l_j;  O = a*O + c*O_j;  m = m'

Finally ``out = O / l`` (rows that saw no token give 0, SPEC §2.5). Everything is float32.

Decision: ``exp`` is the float32 rounding of the float64 exp (``exp_f32``). torch's float32 exp
uses a vector routine for full SIMD lanes and the C library for the tail, which can differ by one ulp,
so the same element could come out differently in the loop and vectorized goldens. Through float64
it is the correctly rounded value (but for ties, which float32 inputs essentially never produce).

Decision: ``l_j`` is the float32 rounding of the row sum taken in float64. The kernel adds in float32
in an order of its own; this sum is the one every order approximates, it is the same in the loop and
vectorized goldens, and the difference stays far inside SPEC §4's tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["exp_f32", "local_softmax", "OnlineSoftmaxState"]


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 exp of float32 ``x``, computed in float64 and rounded once (see the module docstring)."""
    return torch.exp(x.double()).float()


def local_softmax(scores: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m_j [..., 1], P [..., T], l_j [..., 1]) of one tile's float32 scores [..., T].

    ``valid`` (bool, scores' shape) marks the columns that exist; others give P = 0 and never reach
    the max, even when they hold NaN. A row with no valid column gets m_j = -inf, l_j = 0, P = 0.
    """
    if valid is not None:
        scores = torch.where(valid, scores, -torch.inf)
    m_j = scores.amax(dim=-1, keepdim=True)
    shifted = scores - m_j
    if valid is not None:
        # A row without a valid column has -inf - -inf = NaN here; it is zeroed like any invalid column.
        shifted = torch.where(valid, shifted, -torch.inf)
    p = exp_f32(shifted)
    l_j = p.double().sum(dim=-1, keepdim=True).float()
    return m_j, p, l_j


@dataclass
class OnlineSoftmaxState:
    """The running float32 state of SPEC §2.3: row max ``m`` [..., 1], row sum ``l`` [..., 1], ``o`` [..., D].

    ``started`` [..., 1] marks rows that have seen a tile with at least one valid token.
    """

    m: torch.Tensor
    l: torch.Tensor
    o: torch.Tensor
    started: torch.Tensor

    @classmethod
    def empty(cls, rows: tuple[int, ...], head_dim: int) -> "OnlineSoftmaxState":
        """A state for ``rows`` that has seen no tile yet."""
        return cls(
            m=torch.full((*rows, 1), -torch.inf),
            l=torch.zeros((*rows, 1)),
            o=torch.zeros((*rows, head_dim)),
            started=torch.zeros((*rows, 1), dtype=torch.bool),
        )

    def update(self, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, valid: torch.Tensor | None = None) -> "OnlineSoftmaxState":
        """Fold one tile's (m_j, l_j, O_j) into the state, in place; returns self.

        ``valid`` [..., 1] marks the rows for which this tile has tokens; other rows keep their
        state untouched (None: every row).
        """
        m_new = torch.maximum(self.m, m_j)
        a = exp_f32(self.m - m_new)
        c = exp_f32(m_j - m_new)
        l_next = torch.where(self.started, a * self.l + c * l_j, l_j)
        o_next = torch.where(self.started, a * self.o + c * o_j, o_j)
        m_next = torch.where(self.started, m_new, m_j)
        if valid is None:
            self.m, self.l, self.o = m_next, l_next, o_next
            self.started = torch.ones_like(self.started)
        else:
            self.m = torch.where(valid, m_next, self.m)
            self.l = torch.where(valid, l_next, self.l)
            self.o = torch.where(valid, o_next, self.o)
            self.started = self.started | valid
        return self

    def update_tiles(self, m_t: torch.Tensor, l_t: torch.Tensor, o_t: torch.Tensor, valid: torch.Tensor | None = None) -> "OnlineSoftmaxState":
        """Fold tiles 0..T-1 in order, in place: the same bits as T calls of ``update``; returns self.

        The tile axis is dim -2: m_t, l_t, valid [..., T, 1] and o_t [..., T, D]. The running max
        and the factors a, c depend on the m's alone, so they are computed for all tiles at once
        (a running maximum is exact); only the two float32 recurrences ``l = a*l + c*l_j`` and
        ``O = a*O + c*O_j`` step through the tiles, as their rounding requires.
        """
        tiles = m_t.shape[-2]
        if valid is None:
            valid = torch.ones(m_t.shape, dtype=torch.bool)
        valid = valid.expand(m_t.shape)
        seen_before = self.started.unsqueeze(-2) | ((torch.cumsum(valid.to(torch.int32), dim=-2) - valid.to(torch.int32)) > 0)
        first = valid & ~seen_before  # this tile sets the state
        carry = valid & seen_before  # this tile is folded in
        # m after each tile: the running max over the state's m and the valid tiles' m_j.
        running = torch.cummax(torch.cat([self.m.unsqueeze(-2), torch.where(valid, m_t, -torch.inf)], dim=-2), dim=-2).values
        a = exp_f32(running[..., :-1, :] - running[..., 1:, :])
        c = exp_f32(m_t - running[..., 1:, :])
        # l and O follow the same recurrence with the same a and c: fold them as one tensor [..., D + 1].
        lo_t = torch.cat([o_t, l_t], dim=-1)
        c_lo = c * lo_t
        lo = torch.cat([self.o, self.l], dim=-1)
        for j in range(tiles):
            folded = a[..., j, :] * lo + c_lo[..., j, :]
            lo = torch.where(carry[..., j, :], folded, torch.where(first[..., j, :], lo_t[..., j, :], lo))
        self.m, self.l, self.o = running[..., -1, :], lo[..., -1:], lo[..., :-1]
        self.started = self.started | valid.any(dim=-2)
        return self

    def finalize(self) -> torch.Tensor:
        """float32 ``O / l`` [..., D]; rows that never saw a token are 0 (SPEC §2.5)."""
        return torch.where(self.started, self.o / torch.where(self.started, self.l, 1.0), 0.0)
