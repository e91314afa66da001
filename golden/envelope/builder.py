"""The envelope's builder (golden/envelope/__init__.py has the derivation, steps 1-8): the per-tile
bounds of one evaluation of golden/attention.py, kept per (batch, tile), then folded per row.

The per-tile arithmetic runs in numpy: a chunk is often a few rows (the acceptance rule builds the
envelope for the rows that failed), where torch's per-call cost is most of the time. Elementwise float64
and float32 operations (+ - * /, min, max, comparisons) give the same bits in both; what would not
stays in torch: every exp (torch's differs from numpy's), every float64 sum (its order), and the maxima
whose zero's sign is kept (torch's amax picks among +0 and -0 its own way)."""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import NamedTuple, TypeAlias

import numpy as np
import torch

from ..codec import Fp8Codec
from ..intervals import TINY32, U32, U64, float64_slack, lowbit, outward_sums, ulp32
from ..model import ConformanceModel
from ..quant import FP8_MAX
from ..scratch import SCRATCH
from ..sum_bounds import sum_error_bound
from ..validate import PagedAttentionDims
from .fold import ARGUMENT_ROUNDING, DEGENERATE_SPREAD, Hull, ToTiles, fold, row_sums, tile_hull
from .stages import (
    boundary_distance,
    column_grids,
    dequant_interval,
    exp_bounds,
    mm2_bounds,
    mm2_scaled_interval,
    quantization_error,
    raw_interval,
    refine_score_bounds,
    score_bounds,
    sum_relative,
    upper_relative_to_max,
)

__all__ = ["AttentionEnvelope", "EnvelopeBuilder", "score_bounds", "refine_score_bounds", "raw_interval",
           "dequant_interval", "exp_bounds", "DEGENERATE_SPREAD"]

#: Rows whose scores are uncertain by more than this on average (in logits; l moves by about as much,
#: relative: 2**-9 is a quarter of SPEC §4's 1/128) get the sharper bound of step 1 even when no code
#: of P flips.
SHARPEN_WIDTH = 2.0 ** -9
#: Scores whose P is at most this in every conforming execution are left at the plain bound of step 1.
NEGLIGIBLE_P = 2.0 ** -30


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionEnvelope:
    """The golden's output and the envelope around it, all bf16 [B*S1, NQ, D], with what widened it.

    ``p_elements``: visible P elements (one per row, tile token); ``flippable``: those whose E4M3 code
    a conforming kernel may choose either way; ``degenerate_rows``: query rows whose scores are
    uncertain by more than :data:`DEGENERATE_SPREAD` (see there), counting only the scores whose P can
    exceed :data:`NEGLIGIBLE_P` (the others move nothing). ``rows``: the output rows it was built for (None:
    all; golden.paged_attention_envelope's ``rows``); the tensors are NaN on the other rows and the
    counts cover the built rows only.
    """
    golden: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    model: ConformanceModel
    codec: str
    p_elements: int
    flippable: int
    degenerate_rows: int
    rows: tuple[int, ...] | None = None

    def inside(self, actual: torch.Tensor) -> torch.Tensor:
        """bool: ``lo <= actual <= hi`` elementwise (False where either is not finite)."""
        a = actual.float()
        return (self.lo.float() <= a) & (a <= self.hi.float())


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileChunk:
    """One chunk of the golden's evaluation, as golden/attention.py hands it over (its own operands and
    results, never recomputed here). Block layout [Q, N, R, BS] for the MM1 operands and results, tile
    layout [P, N, R, T] for the softmax; ``to_tiles``, ``to_blocks`` and ``per_tile_sum`` map between
    them (blocks a tile lacks: 0)."""
    raw64: torch.Tensor          # exact q8 . k8 per block, float64 [Q, N, R, BS]
    q_blocks: torch.Tensor       # q codes' values per block row, float64 [Q, N, R, D]
    k_blocks: torch.Tensor       # K's values transposed, float64 [Q, N, D, BS]
    k_rows: np.ndarray           # the blocks' K codes as the cache holds them, uint8 [Q, BS, N, D]
    q_grid: torch.Tensor         # each query row's grid (intervals.lowbit of its codes), float64 [Q, N, R, 1]
    q_scale: torch.Tensor        # float32 [Q, N, R, 1]
    k_scale: torch.Tensor        # float32 [Q, N, 1, BS]
    visible: torch.Tensor        # bool [P, 1, R, T] (SPEC §2.1)
    p: torch.Tensor              # the golden's P, float32 tiles
    p8: torch.Tensor             # the golden's P8 values, float32 tiles
    mm2: torch.Tensor            # the golden's exact P8 @ v8 per tile, float64 [P, N, R, D]
    v: torch.Tensor              # V's values per block, float64 [Q, N, BS, D]
    v_scale: torch.Tensor        # float32 [P, N, 1, D]
    to_tiles: ToTiles
    to_blocks: Callable[[torch.Tensor], torch.Tensor]
    per_tile_sum: Callable[[torch.Tensor], torch.Tensor]
    index: torch.Tensor          # where each pair's results go: batch * tiles + tile


class TileBounds(NamedTuple):
    """Steps 3-4 of one tile layout (:meth:`EnvelopeBuilder.softmax`): the row max's ends, the ends of
    ``exp(S - m_hi)`` and ``exp(S - m_lo)`` (float64), and the least and greatest E4M3 code value of P
    (float32), as numpy arrays."""
    m_lo: np.ndarray
    m_hi: np.ndarray
    e_lo: np.ndarray
    e_hi: np.ndarray
    p8_lo: np.ndarray
    p8_hi: np.ndarray


#: What the steps that take either accept (numpy between the steps, tensors from the chunk).
Array: TypeAlias = torch.Tensor | np.ndarray


def _array(x: Array) -> np.ndarray:
    """A tensor's numpy view (a numpy array as it is)."""
    return x.numpy() if isinstance(x, torch.Tensor) else x


def _stacked(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """[2, ...]: two arrays of one shape and dtype side by side (np.stack costs several times as much)."""
    both = np.empty((2,) + first.shape, dtype=first.dtype)
    both[0], both[1] = first, second
    return both


@functools.cache
def _p_scale_bounds(exp_ulps: float) -> tuple[float, torch.Tensor, float, float]:
    """(largest P, least scale, least and greatest p_scale) for an exp within ``exp_ulps`` (step 4): every
    x is <= 0 and exp_bounds is monotone in x, so every P is at most exp_bounds of the x just below 0, or 1
    at x = 0; and the row max of P lies in [1, that] (the argmax gives exp(0) = 1).

    The x just below 0: its exact exp t is below 1, in [1/2, 1) where SPEC §4.1's ulp is 2**-24, so F3's
    results are below t + exp_ulps 2**-24 < 1 + exp_ulps 2**-24 (exp_bounds caps them there). The largest
    P is therefore 1 for exp_ulps <= 2 (1 + 2**-23 is out of reach) and 1 + 2**-23 for 2 < exp_ulps <= 4:
    with SPEC's 3 ulp, a P of 1 + 2**-23 > exp(0) is reached (x = -2**-24, t = 1 - 2**-24 + 2**-49, within
    3 * 2**-24 of it), and the P scale RN(448 / max P) may be 448 - 2**-14, one rounding below 448. The
    kernel's scale RN(448 / max P) and p_scale (RN(1 / scale), or RN(max P / 448)) are float32 values
    between the roundings of the ends (RN is monotone): float32 arithmetic, no slack."""
    below_zero = torch.tensor([-(2.0 ** -149)], dtype=torch.float32)
    p_max_hi = torch.maximum(exp_bounds(below_zero, below_zero, exp_ulps)[1], torch.ones(1))
    fp8_max = torch.tensor(FP8_MAX, dtype=torch.float32)
    scale_lo = fp8_max / p_max_hi
    return (float(p_max_hi), scale_lo, float(torch.ones(1) / fp8_max),
            float(torch.maximum(torch.ones(1) / scale_lo, p_max_hi / fp8_max)))


class EnvelopeBuilder:
    """Accumulates the per-tile bounds of one ``golden.attention`` evaluation and folds them (steps 1-8).

    golden/attention.py creates it when an envelope is asked for and hands it each chunk's gathered
    operands; it never recomputes what the golden computed (exact MM1 and MM2 sums, the golden's P8).
    """

    def __init__(self, dims: PagedAttentionDims, codec: Fp8Codec, model: ConformanceModel, tiles: int) -> None:
        self.dims, self.codec, self.model = dims, codec, model
        self.exp_rel = model.exp_ulps * 2.0 ** -23        # ulp(y) <= 2**-23 y for normal y
        self.softmax_scale = torch.tensor(dims.softmax_scale, dtype=torch.float32)
        p_max_hi, scale_lo, self.ps_lo, self.ps_hi = _p_scale_bounds(model.exp_ulps)     # step 4's constants
        self.scale_lo = scale_lo.numpy()
        # Per (batch, tile): m_lo, m_hi, L_lo, L_hi (relative to m_hi), O_lo [D], O_hi [D], tokens.
        rows = dims.s1 * dims.group
        self.states = torch.zeros((dims.batch * tiles, dims.nkv, rows, 2 * dims.head_dim + 5), dtype=torch.float64)
        self.p_elements = 0
        self.flippable = 0
        self.degenerate_rows = 0                                  # set by :meth:`fold`
        self.spread = torch.zeros((dims.batch * tiles, dims.nkv, rows, 1), dtype=torch.float64)
        self._states, self._spread = self.states.numpy(), self.spread.numpy()     # chunk writes through these
        # Step 8: the degenerate (tile, row)s' hulls, and the codec's quantization error of a_t = p_scale P8
        # against the kernel's own P: RN(P scale) (1 rounding), the scale and p_scale (2 more: (1 +- u)**3),
        # the codec's own (relative, and absolute in units of p_scale).
        self.hulls: list[Hull] = []
        rho_lo, rho_hi, alpha = quantization_error(codec, FP8_MAX * p_max_hi * (1 + U32))
        self.code_error = (rho_lo * (1 - U32) ** 3, rho_hi * (1 + U32) ** 3, alpha * self.ps_hi * (1 + U32))

    # -- steps 1-2 (block layout [Q, N, R, BS]) ---------------------------------------------------------
    def scores(self, raw: torch.Tensor, abs_sum: torch.Tensor, grid: torch.Tensor, q_scale: torch.Tensor,
               k_scale: torch.Tensor, magnitude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(S_lo, S_hi, E1) float32 / float64 per block from the exact ``raw`` and ``abs_sum`` sums."""
        e1 = score_bounds(raw, abs_sum, grid, self.dims.head_dim, self.model, magnitude)
        return self._scaled(raw, e1, q_scale, k_scale) + (e1,)

    def _scaled(self, raw: torch.Tensor, e1: torch.Tensor, q_scale: torch.Tensor,
                k_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raw_lo, raw_hi = raw_interval(raw, e1, self.model)
        return dequant_interval(raw_lo, raw_hi, q_scale, k_scale, self.softmax_scale, self.model)

    # -- steps 3-4 (tile layout [P, N, R, T]) -----------------------------------------------------------
    def softmax(self, s_lo: np.ndarray, s_hi: np.ndarray, visible: np.ndarray, distance: np.ndarray,
                p8: np.ndarray) -> TileBounds:
        """Steps 3-4 on one tile layout (:class:`TileBounds`); the P scale's bounds are
        the builder's constants ``ps_lo``, ``ps_hi``. numpy arrays in and out (module note on numpy).

        ``e_lo = exp(S_lo - m_hi)`` and ``e_hi = exp(S_hi - m_lo)`` (float64, 0 off the visible columns)
        are the only exponentials of the envelope: the row widths and the denominator read them. The
        codes start as the golden's ``p8``: a margin test (:meth:`_may_flip`, on ``distance``, how close the
        golden's scaled P lies to a rounding boundary) finds the elements whose code could differ, and only
        those get their exact bounds."""
        # Both ends as one stack [2, ...] (index 0 the lower end): every operation below runs once for both,
        # each element alone (the maxima are exact in any order), so the bits are those of each end alone.
        s = np.where(visible, _stacked(s_lo, s_hi), np.float32(-math.inf))
        # A row with no visible column gets m = 0 (not -inf), so that its d stays -inf and its e 0. (Only
        # such a row: a visible row whose ends all overflowed to -inf keeps m = -inf, and NaN bounds.)
        # (torch's amax: which zero a row of +0 and -0 gives is torch's choice, and the states keep it.)
        seen = visible.any(axis=-1, keepdims=True)
        m = np.where(seen, torch.from_numpy(s).amax(dim=-1, keepdim=True).numpy().astype(np.float64), 0.0)
        # float64 (the bounds that read it carry its rounding): S_lo - m_hi and S_hi - m_lo, 0 off the
        # visible columns (d = -inf there).
        e = torch.exp(torch.from_numpy(s.astype(np.float64) - m[::-1])).numpy()
        eps = self._p_width(s, m, visible)
        p8_lo = p8.copy()
        p8_hi = p8.copy()
        at = np.flatnonzero(self._may_flip(distance, eps, visible))
        if at.size:
            # exp_arguments on the flagged elements: the float32 RN(S_lo - m_hi) and RN(S_hi - m_lo), the
            # upper end clamped at 0. (s is [2, ..., T] and m [2, ..., 1] of the same leading shape.)
            x = s.reshape(2, -1)[:, at] - m.reshape(2, -1)[::-1, at // s.shape[-1]].astype(np.float32)
            p_lo, p_hi = exp_bounds(torch.from_numpy(x[0]), torch.from_numpy(np.minimum(x[1], np.float32(0))),
                                    self.model.exp_ulps)
            # y = RN(P * scale): monotone in P and in the scale, which is at most 448. One pass through
            # the codec for both ends (elementwise; float32 products).
            y = np.empty((2, at.size), dtype=np.float32)
            np.multiply(p_lo.numpy(), self.scale_lo, out=y[0])
            np.multiply(p_hi.numpy(), np.float32(FP8_MAX), out=y[1])
            codes = self.codec.round(torch.from_numpy(y)).numpy()
            p8_lo.reshape(-1)[at] = codes[0]
            p8_hi.reshape(-1)[at] = codes[1]
        return TileBounds(m[0], m[1], e[0], e[1], p8_lo, p8_hi)

    def _p_width(self, s: np.ndarray, m: np.ndarray, visible: np.ndarray) -> np.ndarray:
        """float64 [..., 1]: eps, a bound on the relative distance of any conforming P of the row from the
        golden's: both exponentiate an x in ``[S_lo - m_hi, S_hi - m_lo]`` (rounded: 2 ulp of x) within
        ``exp_ulps`` (the golden's within half an ulp; SPEC's ulp is at most 2**-23 of a normal result), so
        ``P / P_g`` lies in ``exp(+-w) (1 +- a)``, ``a = (exp_ulps + 1/2) 2**-23 (1 + 2**-23)``, with ``w`` the
        row's widest x interval. ``exp(w) (1 + a) - 1 <= 2 w + b`` with ``b = (exp_ulps + 1) 2**-22 = (2 exp_ulps
        + 2) 2**-23 > a`` for ``0 <= w <= 1`` (convex in w: at w = 0 it is a <= b, at w = 1 it is e - 3 + e a
        < 0 <= b), and ``1 - exp(-w) (1 - a) <= w + a`` (wider rows: eps = inf, every element is bounded
        exactly). A subnormal P has no relative bound, but 448 P is then far below every rounding boundary
        of the codec, whose distance :meth:`_may_flip` reads. ``s``, ``m``: (S_lo, S_hi) and (m_lo, m_hi)
        stacked, as :meth:`softmax` holds them."""
        widest = np.where(visible, s[1] - s[0], np.float32(0)).max(axis=-1, keepdims=True)
        width = widest.astype(np.float64) + (m[1] - m[0])
        x_ulps = 2 * ulp32(torch.from_numpy(np.maximum(np.abs(m[0]), np.abs(m[1])) + width)).numpy() * 2   # x's rounding, both ends
        w = width + x_ulps
        eps = 2 * w + (self.model.exp_ulps + 1) * 2.0 ** -22
        bounded: np.ndarray = np.where(w <= 1, eps, math.inf)
        return bounded

    @staticmethod
    def _may_flip(distance: np.ndarray, eps: np.ndarray, visible: np.ndarray) -> np.ndarray:
        """bool: where a code of P could differ from the golden's. The golden's y = RN(448 P) (its P is
        correctly rounded, at most 1: its scale is 448) and a conforming kernel's RN(P' scale) lie within
        ``eps + 5 * 2**-24`` of each other, relative, up to products of those terms: P' / P within eps
        (:meth:`_p_width`), the kernel's scale RN(448 / max P') in ``[448 / (1 + 2**-23) (1 - 2**-24), 448]``
        (its row max of P is in [1, 1 + 2**-23] under SPEC's 3-ulp exp, :func:`_p_scale_bounds`: 3 units of
        2**-24), and the two products' roundings (2 units). The margin ``2 eps + 2**-21 = 2 eps + 8 * 2**-24``
        covers that with room (eps >= 2**-22 holds the cross terms). Unless a rounding boundary lies that
        close to y (``distance``, relative to y: golden.envelope.stages.boundary_distance), no conforming
        kernel flips it. NaN distances and infinite eps count as may-flip."""
        margin = (2 * eps + 2.0 ** -21) * (1 + 2.0 ** -40)      # the float64 distance's own rounding
        may: np.ndarray = visible & ~(distance > margin)
        return may

    @staticmethod
    def _wide_rows(s_lo: np.ndarray, s_hi: np.ndarray, m_lo: np.ndarray, m_hi: np.ndarray, e_hi: np.ndarray,
                   visible: np.ndarray) -> np.ndarray:
        """bool, tile layout: the scores of rows whose l may move by more than :data:`SHARPEN_WIDTH`
        relative (the P-weighted mean width of their scores, ``P ~ exp(S_hi - m_hi)``)."""
        weight = upper_relative_to_max(*(torch.from_numpy(x) for x in (e_hi, s_hi, m_lo, m_hi))).numpy()
        width = np.where(visible, (s_hi - s_lo).astype(np.float64), 0.0)
        mean = row_sums(weight * width) / np.maximum(row_sums(weight), 1e-300)
        wide: np.ndarray = visible & (mean > SHARPEN_WIDTH) & (width > 0)
        return wide

    def denominator(self, s_lo: Array, s_hi: Array, m_lo: Array, m_hi: Array, e_lo: Array, e_hi: Array,
                    visible: Array) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(L_lo, L_hi, n) [..., 1]: bounds on ``sum_t exp((S_t - m_hi)(1 -+ delta))`` and so on the kernel's
        ``l_j``, relative to ``exp(m_hi - m_j)`` (module docstring, step 6; the fold multiplies by the
        weight of ``m_hi``): the terms between ``e_lo = exp(S_lo - m_hi)`` and ``e_hi exp(m_lo - m_hi) =
        exp(S_hi - m_hi)``, moved by the relative rounding ``delta`` of the kernel's exponent arguments
        (golden.envelope.fold.ARGUMENT_ROUNDING: ``e**(-z) >= 1 - z`` below; ``e**z <= 1 / (1 - z) <= 1 + 2 z``
        above for ``z <= 1/2``, and ``exp((S_hi - m_hi)(1 - delta))`` itself beyond), then exp's error
        (relative ``exp_rel`` and ``exp_ulps 2**-149`` absolute, SPEC's ulp) and the row sum's (F1).
        Tensors or numpy arrays in, tensors out."""
        s_lo, s_hi, m_lo, m_hi, e_lo, e_hi, visible = (_array(x) for x in (s_lo, s_hi, m_lo, m_hi, e_lo, e_hi, visible))
        n = visible.sum(axis=-1, keepdims=True, dtype=np.float64)
        delta = ARGUMENT_ROUNDING + 4 * U64                            # + the float64 differences' and products' own
        # delta |S - m_hi| at the lower end of S, and at the upper end (both ends in one stack: elementwise)
        z_lo, z_hi = delta * np.where(visible, m_hi - _stacked(s_lo, s_hi), 0.0)
        low = row_sums(e_lo * np.maximum(1 - z_lo, 0.0))
        high = upper_relative_to_max(*(torch.from_numpy(x) for x in (e_hi, s_hi, m_lo, m_hi))).numpy() * (1 + 2 * z_hi)
        far = visible & (z_hi > 0.5)          # e**z <= 1 + 2 z fails: exp((S_hi - m_hi)(1 - delta)) on its own
        if far.any():
            high = np.where(far, torch.exp(torch.from_numpy((s_hi.astype(np.float64) - m_hi) * (1 - delta))).numpy(), high)
        high = row_sums(high * visible)
        rel = sum_relative(torch.from_numpy(n), self.model).numpy()
        # float64's own roundings, relative: a term of ``high`` has two exps (2 units each of 2**-53), and
        # three products (e_hi exp(.), (1 + 2 z)'s own rounding, the product): 7; the sum of n positive terms
        # n - 1; the products by (1 + exp_rel), (1 + rel) and their own sums: 4. ``low``: one exp, two
        # products and the rounding of 1 - z per term, n - 1 in the sum, 4 after: fewer.
        f64 = float64_slack(n + 10)
        l_lo = np.maximum(low * (1 - self.exp_rel) * (1 - rel) * (1 - f64) - n * self.model.exp_ulps * TINY32, 0.0)
        l_hi = (high * (1 + self.exp_rel) * (1 + rel) + n * self.model.exp_ulps * TINY32) * (1 + f64)
        return torch.from_numpy(l_lo), torch.from_numpy(l_hi), torch.from_numpy(n)

    # -- step 5 -----------------------------------------------------------------------------------------
    def values(self, golden_mm2: torch.Tensor, low_dev: torch.Tensor, high_dev: torch.Tensor, abs_sum: torch.Tensor,
               n: torch.Tensor, v_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(O_lo, O_hi) [..., D] float64 of one tile: the golden's exact ``P8 @ v8`` moved by the flippable
        codes' deviations (``low_dev``, ``high_dev`` >= 0, already multiplied out), within the any-order
        bound of a sum of ``n`` terms with ``abs_sum = P8_hi @ |v8|`` (so every partial sum is at most
        ``(abs_sum + |sum|) / 2``), then ``* p_scale * v_scale`` (F2: golden.envelope.stages.mm2_scaled_interval)."""
        mm2 = golden_mm2.numpy()
        lo, hi = mm2 - low_dev.numpy(), mm2 + high_dev.numpy()
        largest = np.maximum(np.abs(lo), np.abs(hi))
        half_ulp = 0.5 * ulp32(torch.from_numpy(largest)).numpy()
        if self.model.sums == "exact":
            e2 = half_ulp                                                   # one rounding of the exact sum
        else:
            magnitude = (abs_sum.numpy() + largest) / 2
            rounding = "toward-zero" if self.model.sums == "truncating" else "nearest"
            e2 = np.maximum(sum_error_bound(n, torch.from_numpy(magnitude), abs_sum, rounding=rounding).numpy(), half_ulp)
        # the kernel's float32 O_raw
        lo, hi = (x.numpy().astype(np.float64) for x in outward_sums(*(torch.from_numpy(x) for x in (lo, -e2, hi, e2))))
        return mm2_scaled_interval(lo, hi, self.ps_lo, self.ps_hi, v_scale.numpy(), self.model)

    # -- one chunk of the golden's evaluation -------------------------------------------------------------
    def q_grid(self, q_codes: np.ndarray) -> np.ndarray:
        """float64 [..., 1]: each query row's grid (the smallest power of two dividing its codes' values)."""
        return column_grids(self.codec, q_codes)[..., None]

    def chunk(self, c: TileChunk) -> None:
        """Bound one chunk of (batch, tile) pairs (steps 1-5) and keep the per-tile results at ``c.index``."""
        # numpy as torch computes: inf - inf is NaN, overflow inf, without a warning.
        with np.errstate(all="ignore"):
            self._chunk(c)

    def _chunk(self, c: TileChunk) -> None:
        """:meth:`chunk`'s work (tensors from the chunk, numpy arrays between the steps)."""
        abs_sum = torch.matmul(torch.from_numpy(np.abs(c.q_blocks.numpy())), SCRATCH.abs("|K| or |V|", c.k_blocks))
        # The exactness certificate needs M1 <= 2**24 g. A column's grid is at most the lowbit of any of its
        # values, so a few of them bound it: K's grid is read in full only where that bound could give it.
        magnitude = (abs_sum.numpy() + np.abs(c.raw64.numpy())) / 2
        k_bound = lowbit(c.k_blocks[:, :, :4, :]).numpy().min(axis=2, keepdims=True)                  # [Q, N, 1, BS]
        q_grid = c.q_grid.numpy()
        if (magnitude <= 2.0 ** 24 * q_grid * k_bound).any():
            k_grid = column_grids(self.codec, c.k_rows).transpose(0, 2, 1)[:, :, None, :]          # [Q, N, 1, BS]
            grid = torch.from_numpy(q_grid * k_grid)
        else:
            grid = torch.zeros(())
        block_lo, block_hi, e1 = self.scores(c.raw64, abs_sum, grid, c.q_scale, c.k_scale, torch.from_numpy(magnitude))
        s_lo, s_hi = c.to_tiles(block_lo).numpy(), c.to_tiles(block_hi).numpy()
        distance = boundary_distance(self.codec, c.p).numpy()
        visible = c.visible.numpy()
        p8 = c.p8.numpy()
        bounds = self.softmax(s_lo, s_hi, visible, distance, p8)
        if self.model.sums == "any-order":
            s_lo, s_hi, bounds = self._sharpen(c, abs_sum, e1, distance, (block_lo, block_hi), s_lo, s_hi, bounds)
        flip = visible & (bounds.p8_lo != bounds.p8_hi)
        self.p_elements += int(np.count_nonzero(np.broadcast_to(visible, flip.shape)))
        self.flippable += int(np.count_nonzero(flip))
        l_lo, l_hi, n = self.denominator(s_lo, s_hi, bounds.m_lo, bounds.m_hi, bounds.e_lo, bounds.e_hi, visible)
        p8_lo, p8_hi = (c.to_blocks(torch.from_numpy(x)).double() for x in (bounds.p8_lo, bounds.p8_hi))
        low_dev, high_dev, abs_sum = mm2_bounds(c.to_blocks(c.p8).double(), p8_lo, p8_hi, c.v, c.per_tile_sum)
        o_lo, o_hi = self.values(c.mm2, low_dev, high_dev, abs_sum, n, c.v_scale)
        # Negligible scores (NEGLIGIBLE_P) kept their plain intervals and move nothing: not counted.
        # (torch's amax, as for m: a zero's sign is torch's choice.)
        widths = np.where(visible & (bounds.e_hi >= NEGLIGIBLE_P), np.subtract(s_hi, s_lo, dtype=np.float64), 0.0)
        spread = torch.from_numpy(widths).amax(dim=-1, keepdim=True).numpy()
        any_visible = visible.any(axis=-1, keepdims=True)
        degenerate = any_visible & (spread > DEGENERATE_SPREAD)
        if degenerate.any():
            e_hi, s_hi_t, m_lo = (torch.from_numpy(x) for x in (bounds.e_hi, s_hi, bounds.m_lo))
            self.hulls.append(tile_hull(torch.from_numpy(degenerate), c.visible, e_hi, s_hi_t, m_lo, c.v, c.v_scale, c.to_tiles, c.index,
                                        model=self.model, code_error=self.code_error, p_scale_lo=self.ps_lo))
        # The state row (m_lo, m_hi, L_lo, L_hi, O_lo, O_hi, n), 0 on the rows that see no token.
        d = self.dims.head_dim
        state = np.empty(bounds.m_lo.shape[:-1] + (2 * d + 5,))
        for at, part in ((slice(0, 1), bounds.m_lo), (slice(1, 2), bounds.m_hi), (slice(2, 3), l_lo.numpy()),
                         (slice(3, 4), l_hi.numpy()), (slice(4, 4 + d), o_lo.numpy()), (slice(4 + d, 4 + 2 * d), o_hi.numpy()),
                         (slice(4 + 2 * d, None), n.numpy())):
            state[..., at] = part
        index = c.index.numpy()
        self._states[index] = np.where(any_visible, state, 0.0)
        self._spread[index] = np.where(any_visible, spread, 0.0)

    def _sharpen(self, c: TileChunk, abs_sum: torch.Tensor, e1: torch.Tensor, distance: np.ndarray,
                 blocks: tuple[torch.Tensor, torch.Tensor], s_lo: np.ndarray, s_hi: np.ndarray,
                 bounds: TileBounds) -> tuple[np.ndarray, np.ndarray, TileBounds]:
        """Step 1's sharper bound where it matters: for the scores whose code may flip, or whose row is
        uncertain enough to move l by a visible share of the tolerance, and in those rows every score that
        may be the row's max (m_j moves every x of the row); then steps 2-4 again for the rows touched.
        ``blocks``: the plain (S_lo, S_hi) in the block layout (tensors); ``distance``, ``s_lo``, ``s_hi``
        and ``bounds``: numpy, as :meth:`softmax` takes and gives them."""
        visible = c.visible.numpy()
        flip = visible & (bounds.p8_lo != bounds.p8_hi)
        wide = self._wide_rows(s_lo, s_hi, bounds.m_lo, bounds.m_hi, bounds.e_hi, visible)
        either = flip | wide
        rows = either.any(axis=-1, keepdims=True)
        if not rows.any():
            return s_lo, s_hi, bounds
        maybe_max = visible & rows & (s_hi >= bounds.m_lo)          # (float32 against float64: compared exactly)
        # A score whose P is below NEGLIGIBLE_P even at the top of its plain interval moves l by less than
        # n NEGLIGIBLE_P relative and its code cannot leave 0 (448 P is far below E4M3's smallest
        # subnormal): narrowing it changes nothing visible, and on degenerate rows it is most of them.
        plain_e1 = e1.numpy()
        flagged = c.to_blocks(torch.from_numpy((either | maybe_max) & (bounds.e_hi >= NEGLIGIBLE_P))).numpy() & (plain_e1 > 0)
        at = np.nonzero(flagged)
        if not at[0].size:
            return s_lo, s_hi, bounds
        products = c.q_blocks.numpy()[at[0], at[1], at[2], :] * c.k_blocks.numpy()[at[0], at[1], :, at[3]]
        raw = c.raw64.numpy()[at]
        sharp_e1 = np.minimum(plain_e1[at], refine_score_bounds(torch.from_numpy(products), torch.from_numpy(raw),
                                                                torch.from_numpy(abs_sum.numpy()[at])).numpy())
        # Steps 1-2 again for the sharpened scores only (elementwise: the others keep their intervals).
        q_scale, k_scale = c.q_scale.numpy()[at[0], at[1], at[2], 0], c.k_scale.numpy()[at[0], at[1], 0, at[3]]
        lo, hi = self._scaled(*(torch.from_numpy(x) for x in (raw, sharp_e1, q_scale, k_scale)))
        sharp = []
        for plain, new in zip(blocks, (lo, hi), strict=True):
            sharpened = plain.numpy().copy()
            sharpened[at] = new.numpy()
            sharp.append(c.to_tiles(torch.from_numpy(sharpened)).numpy())
        s_lo, s_hi = sharp
        p8 = c.p8.numpy()
        if rows.all():
            return s_lo, s_hi, self.softmax(s_lo, s_hi, visible, distance, p8)
        # Steps 3-4 again for the rows touched only (every step is per row): on the largest upstream
        # cases 15 to 19 rows of a chunk's 48.
        at = np.nonzero(rows[..., 0])                                             # (pair, head, row)
        seen = np.broadcast_to(visible, s_lo.shape)
        again = self.softmax(s_lo[at], s_hi[at], seen[at], distance[at], p8[at])
        merged = []
        for old, touched in zip(bounds, again, strict=True):
            part = np.broadcast_to(old, s_lo.shape[:3] + old.shape[-1:]).copy()
            part[at] = touched
            merged.append(part)
        return s_lo, s_hi, TileBounds(*merged)

    # -- steps 6-8 (golden/envelope/fold.py) ------------------------------------------------------------
    def fold(self, tiles: int, tiles_per_row: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (lo, hi) [B, N, R, D] of ``O / l`` from the stored tiles of each row (``tiles_per_row``
        [B, 1, R]; rows with 0 tiles give [0, 0]); counts the degenerate rows in ``degenerate_rows``."""
        lo, hi, self.degenerate_rows = fold(self.states, self.spread, self.hulls, self.dims, self.model, tiles,
                                            tiles_per_row)
        return lo, hi
