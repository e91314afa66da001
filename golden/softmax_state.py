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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["exp_f32", "local_softmax", "OnlineSoftmaxState"]


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """float32 exp of float32 ``x``, computed in float64 and rounded once (see the module docstring)."""
    return torch.exp(x.double()).float()


def local_softmax(scores: torch.Tensor, valid: torch.Tensor | None = None, *,
                  exp: Callable[[torch.Tensor], torch.Tensor] = exp_f32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m_j [..., 1], P [..., T], l_j [..., 1]) of one tile's float32 scores [..., T].

    ``valid`` (bool, scores' shape) marks the columns that exist; others give P = 0 and never reach
    the max, even when they hold NaN. A row with no valid column gets m_j = -inf, l_j = 0, P = 0.
    ``exp``: the float32 exp of ``S - m_j`` (the golden's, correctly rounded; a fault model passes another).
    """
    if valid is not None:
        scores = torch.where(valid, scores, -torch.inf)
    m_j = scores.amax(dim=-1, keepdim=True)
    shifted = scores - m_j
    if valid is not None:
        # A row without a valid column has -inf - -inf = NaN here; it is zeroed like any invalid column.
        shifted = torch.where(valid, shifted, -torch.inf)
    p = exp(shifted)
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
    def empty(cls, rows: tuple[int, ...], head_dim: int) -> OnlineSoftmaxState:
        """A state for ``rows`` that has seen no tile yet."""
        return cls(
            m=torch.full((*rows, 1), -torch.inf),
            l=torch.zeros((*rows, 1)),
            o=torch.zeros((*rows, head_dim)),
            started=torch.zeros((*rows, 1), dtype=torch.bool),
        )

    def update(self, m_j: torch.Tensor, l_j: torch.Tensor, o_j: torch.Tensor, valid: torch.Tensor | None = None) -> OnlineSoftmaxState:
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

    @classmethod
    def from_tiles(cls, m_t: torch.Tensor, l_t: torch.Tensor, o_t: torch.Tensor,
                   tiles_per_row: torch.Tensor | np.ndarray) -> OnlineSoftmaxState:
        """The state after folding tiles 0..n-1 of each row into an empty state, n = ``tiles_per_row``:
        the same bits as n calls of ``update``.

        The tile axis is dim -2: m_t, l_t [..., T, 1] and o_t [..., T, D]; tiles_per_row is an
        integer tensor or array broadcastable to [...], with values in [0, T]. Tiles past a row's
        count are never used, whatever they hold. The running max and the factors a, c depend on
        the m's alone, so they are computed for all tiles at once (a running maximum is exact);
        only the float32 recurrences ``l = a*l + c*l_j`` and ``O = a*O + c*O_j`` step through the
        tiles, as their rounding requires.
        """
        tiles, rows, head_dim = m_t.shape[-2], tuple(m_t.shape[:-2]), o_t.shape[-1]
        counts, low, high = _tile_counts(tiles_per_row, rows, tiles)
        if high == 0:
            return cls.empty(rows, head_dim)
        # Tile-major [T, ..., X], so that each step of the fold reads contiguous slabs. l and O follow
        # the same recurrence with the same a and c: they are folded as one tensor [..., D + 1].
        m_t = m_t[..., :high, :].movedim(-2, 0)
        lo_t = torch.cat([o_t[..., :high, :].movedim(-2, 0), l_t[..., :high, :].movedim(-2, 0)], dim=-1)
        valid = torch.from_numpy(np.arange(high).reshape((-1,) + (1,) * (len(rows) + 1)) < counts[..., None])  # [T, ..., 1]
        running = m_t if low == high else torch.where(valid, m_t, -torch.inf)
        lo = lo_t[0]  # tile 0 sets the state
        if high > 1:
            running = torch.cummax(running, dim=0).values  # m after each tile
            # The factors of tiles 1..T-1 in one exp: a = exp(m - m') rescales the state, c = exp(m_j - m') the tile.
            factors = exp_f32(torch.cat([running[:-1], m_t[1:]], dim=-1) - running[1:])
            a, c_lo = factors[..., :1], factors[..., 1:] * lo_t[1:]
            for j in range(1, high):
                folded = a[j - 1] * lo + c_lo[j - 1]
                # Rows with fewer tiles keep their state; when every row has tile j, no select is needed.
                lo = folded if j < low else torch.where(valid[j], folded, lo)
        started = torch.from_numpy(counts > 0)[..., None]
        if low == 0:
            lo = torch.where(started, lo, 0.0)  # rows without a tile stay empty
        return cls(m=running[-1], l=lo[..., -1:], o=lo[..., :-1], started=started)

    def fold_tiles(self, m_t: torch.Tensor, l_t: torch.Tensor, o_t: torch.Tensor,
                   tiles_per_row: torch.Tensor | np.ndarray) -> OnlineSoftmaxState:
        """Fold tiles 0..n-1 of each row into this state, in place (n = ``tiles_per_row``, the layout of
        :meth:`from_tiles`); returns self. For the tiles that follow those the state was made from: it
        makes the calls of ``update`` itself, one per tile, with a row mask where the counts differ."""
        counts, _, high = _tile_counts(tiles_per_row, tuple(m_t.shape[:-2]), m_t.shape[-2])
        for j in range(high):
            valid = torch.from_numpy(counts > j)[..., None]
            self.update(m_t[..., j, :], l_t[..., j, :], o_t[..., j, :], valid)
        return self

    def finalize(self) -> torch.Tensor:
        """float32 ``O / l`` [..., D]; rows that never saw a token are 0 (SPEC §2.5)."""
        return torch.where(self.started, self.o / torch.where(self.started, self.l, 1.0), 0.0)


def _tile_counts(tiles_per_row: torch.Tensor | np.ndarray, rows: tuple[int, ...], tiles: int) -> tuple[np.ndarray, int, int]:
    """(counts, min, max): ``tiles_per_row`` as an int64 numpy array of shape ``rows``, checked to
    lie in [0, tiles]."""
    if isinstance(tiles_per_row, torch.Tensor):
        tiles_per_row = tiles_per_row.detach().cpu().numpy()
    if not isinstance(tiles_per_row, np.ndarray) or tiles_per_row.dtype.kind not in "iu":
        raise TypeError(f"tiles_per_row must be an integer tensor, got {getattr(tiles_per_row, 'dtype', type(tiles_per_row).__name__)}")
    counts = np.empty(rows, dtype=np.int64)
    try:
        counts[...] = tiles_per_row  # broadcasts, or raises
    except ValueError:
        raise ValueError(f"tiles_per_row of shape {tiles_per_row.shape} does not broadcast to the rows {rows}") from None
    low, high = (int(counts.min()), int(counts.max())) if counts.size else (0, 0)
    if low < 0 or high > tiles:
        raise ValueError(f"tiles_per_row must lie in [0, {tiles}] (the tiles given), got values in [{low}, {high}]")
    return counts, low, high
