"""The acceptance envelope's fold (SPEC §4.2; steps 6-8 of golden/envelope/builder.py): from the bounds of each
(batch, tile, kv head, row) to the bounds of each output row.

6. The online update in closed form: ``out = N / L`` with ``N = sum_j w_j O_j`` and ``L = sum_j w_j l_j``
   relative to ``exp(mu)``, ``mu`` the largest upper tile max (:func:`tile_weights` bounds each ``w_j``).
7. ``O / l`` within ``div_ulps`` (SPEC's ulp, golden.intervals.within_ulps).
8. Degenerate rows (scores uncertain by more than :data:`DEGENERATE_SPREAD`, where step 6 admits almost
   any mixture of V rows): the output is also a near-convex combination of the tiles' means (:func:`row_hulls`),
   and a degenerate tile's mean one of its V rows that can matter (:func:`tile_hull`); both bounds hold, so
   their intersection does.

golden/envelope/builder.py's EnvelopeBuilder keeps the per-tile states and the hulls, and calls :func:`fold` once.
"""
from __future__ import annotations

import math
from typing import Protocol, TypeAlias

import numpy as np
import torch

from ..intervals import TINY32, U32, U64, float64_slack, float64_sum_slack, widen, within_ulps_arrays
from ..model import ConformanceModel
from ..validate import PagedAttentionDims
from .stages import scale_product_error, sum_relative

__all__ = ["fold", "tile_hull", "Hull", "ToTiles", "row_hulls", "tile_weights", "signed_weighted_sum", "row_sums", "DEGENERATE_SPREAD",
           "HULL_NEGLIGIBLE", "ARGUMENT_ROUNDING"]

#: One chunk's degenerate (tile, row)s (:func:`tile_hull`): states row, kv head, row, low, high.
Hull: TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class ToTiles(Protocol):
    """A chunk's map from blocks [Q, N, R, BS] to tiles [P, N, R, T]; the blocks a tile lacks hold ``fill``."""

    def __call__(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor: ...


#: A row whose scores' intervals are wider than this (in logit units) can move P by a factor e**2 or
#: more: step 6's bound there is close to "any mixture of the V rows" (logits near 1e6, where one float32
#: ulp of S is already 0.06): such rows are counted as degenerate and get step 8.
DEGENERATE_SPREAD = 1.0
#: Step 8: tokens (and tiles) whose share of l is at most this are bounded by their mass, not in the hull.
HULL_NEGLIGIBLE = 2.0 ** -40
#: The two float32 products of F2 after MM2 (O_raw * p_scale * v_scale, any order): relative.
_F2_ROUNDINGS = (1 + 2.0 ** -24) ** 2 - 1


def fold(states: torch.Tensor, spread: torch.Tensor, hulls: list[Hull], dims: PagedAttentionDims, model: ConformanceModel,
         tiles: int, tiles_per_row: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
    """float32 (lo, hi) [B, N, R, D] of ``O / l`` from the stored tiles of each row, and how many rows are
    degenerate (steps 6-8). ``states`` [B * tiles, N, R, 2D + 5] holds per (batch, tile) m_lo, m_hi, L_lo,
    L_hi (relative to m_hi), O_lo [D], O_hi [D] and the visible tokens; ``spread`` [B * tiles, N, R, 1]
    how uncertain each tile's scores are; ``hulls`` the degenerate tiles' (:func:`tile_hull`);
    ``tiles_per_row`` [B, 1, R] (rows with 0 tiles give [0, 0])."""
    # numpy as torch computes: inf - inf is NaN, a quotient by 0 infinite, without a warning.
    with np.errstate(all="ignore"):
        return _fold(states, spread, hulls, dims, model, tiles, tiles_per_row)


def _fold(states: torch.Tensor, spread: torch.Tensor, hulls: list[Hull], dims: PagedAttentionDims,
          model: ConformanceModel, tiles: int, tiles_per_row: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`fold`, in numpy: a few rows, where torch's per-call cost would dominate. Elementwise float64
    arithmetic gives the same bits in both; each exp, float64 sum and matrix product stays torch's."""
    d = dims.head_dim
    st = states.view(dims.batch, tiles, dims.nkv, -1, 2 * d + 5).permute(0, 2, 3, 1, 4)   # [B, N, R, T, .]
    rows_tiles = np.broadcast_to(tiles_per_row[:, 0, :][:, None, :], st.shape[:3])
    used = np.arange(tiles) < rows_tiles[..., None]                                            # [B, N, R, T]
    # m_lo, m_hi, l_lo, l_hi and the token count, each [B, N, R, T] in C order (the sums below read them so).
    m_lo, m_hi, l_lo, l_hi, count = np.ascontiguousarray(st.numpy()[..., [0, 1, 2, 3, -1]].transpose(4, 0, 1, 2, 3))
    o_lo, o_hi = st[..., 4:4 + d], st[..., 4 + d:4 + 2 * d]
    mu = np.where(used, m_hi, -math.inf).max(axis=-1, keepdims=True)                             # [B, N, R, 1]
    mu = np.where(np.isfinite(mu), mu, 0.0)
    # Tiles a row does not have hold zeros: give them the row's mu, so that their (zero) terms stay finite.
    m_lo, m_hi = np.where(used, m_lo, mu), np.where(used, m_hi, mu)
    n_tiles = rows_tiles[..., None].astype(np.float64)
    # Lower weights at m_lo (for N) and at m_hi (for L's terms, relative to m_hi), upper ones at m_hi (both).
    lows, wl_hi, w_abs = _tile_weights(np.stack((m_lo, m_hi)), m_hi, mu, n_tiles, model)
    w_lo, wl_lo, w_hi = lows[0], lows[1], wl_hi
    w_lo = np.where(used, np.maximum(w_lo - w_abs, 0.0), 0.0)
    # A term w_j O_j is smallest at w_lo for a positive O and at w_hi + w_abs for a negative one (and
    # the other way round for the largest). So N_lo and N_hi are weighted sums over the tiles of the
    # positive and negative parts of O_lo and O_hi, one batched matrix product each, with no
    # [B, N, R, T, D] product kept; float64's roundings: float64_sum_slack of the row's own tiles.
    away = torch.from_numpy(np.where(used, w_hi + w_abs, 0.0))
    n_lo, n_lo_abs = (x.numpy() for x in signed_weighted_sum(torch.from_numpy(w_lo), away, o_lo))
    n_hi, n_hi_abs = (x.numpy() for x in signed_weighted_sum(away, torch.from_numpy(w_lo), o_hi))
    sum_slack = float64_sum_slack(n_tiles)
    n_lo = n_lo - sum_slack * n_lo_abs
    n_hi = n_hi + sum_slack * n_hi_abs
    # L = sum_t exp(S_t - mu) up to the roundings: each tile's sum relative to its m_hi (denominator)
    # times the weight of m_hi. Its terms are positive: the same slack, relative to the sum. Below, L is
    # at least the weight of the largest m_lo: the tile holding the kernel's maximum M has its argmax's
    # exp(0) = 1 and a weight of exactly 1 in the kernel (every later factor is exp(0)), so l >= 1, that
    # is L >= exp(M - mu) >= exp(max m_lo - mu).
    absolute = w_abs * used * count                                  # each tile's absolute error, per unit
    big_l_lo = row_sums(np.where(used, wl_lo, 0.0) * l_lo) * (1 - sum_slack)
    big_l_lo = big_l_lo - row_sums(absolute) * 2
    # (m - mu) in float64 may be rounded: taken 4 units further from 0, as tile_weights takes it.
    floor = _exp((np.where(used, m_lo, -math.inf).max(axis=-1, keepdims=True) - mu) * (1 + 4 * U64))
    big_l_lo = np.maximum(big_l_lo, floor * (1 - float64_slack(3)))
    big_l_hi = row_sums(np.where(used, wl_hi, 0.0) * l_hi + absolute * 2)
    big_l_hi = big_l_hi * (1 + sum_slack)
    # The exact quotient N / L, each end rounded once in float64 (1 unit), then O / l within div_ulps
    # (F3, SPEC's ulp: golden.intervals.within_ulps).
    q_lo = np.minimum(n_lo / big_l_lo, n_lo / big_l_hi)
    q_hi = np.maximum(n_hi / big_l_lo, n_hi / big_l_hi)
    q_lo, q_hi = (x.numpy() for x in widen(torch.from_numpy(q_lo), torch.from_numpy(q_hi), float64_slack(1)))
    # L's lower bound underflows where the row max is uncertain by hundreds of logits: the quotient is then
    # unbounded by step 6 (step 8 bounds it: such a row is degenerate).
    unbounded = big_l_lo <= 0
    q_lo, q_hi = np.where(unbounded, -math.inf, q_lo), np.where(unbounded, math.inf, q_hi)
    tile_spread = spread.numpy().reshape(dims.batch, tiles, dims.nkv, -1).transpose(0, 2, 3, 1)    # [B, N, R, T]
    degenerate = ((tile_spread > DEGENERATE_SPREAD) & used).any(axis=-1)
    if hulls:                                             # step 8: both bound the same quotient
        bounded = row_hulls(st, torch.from_numpy(tile_spread), torch.from_numpy(used), torch.from_numpy(rows_tiles.copy()),
                            torch.from_numpy(wl_hi), torch.from_numpy(big_l_lo), torch.from_numpy(w_abs).expand(wl_hi.shape),
                            tiles, hulls)
        if bounded is not None:
            rows, low, high = bounded
            q_lo, q_hi = torch.from_numpy(q_lo), torch.from_numpy(q_hi)
            q_lo[rows] = torch.fmax(q_lo[rows], low)
            q_hi[rows] = torch.fmin(q_hi[rows], high)
            q_lo, q_hi = q_lo.numpy(), q_hi.numpy()
    lo, hi = within_ulps_arrays(q_lo, q_hi, model.div_ulps)
    started = rows_tiles[..., None] > 0
    lo = np.where(started, lo, np.float32(0))
    hi = np.where(started, hi, np.float32(0))
    return torch.from_numpy(lo), torch.from_numpy(hi), int(np.count_nonzero(degenerate))


def row_sums(x: np.ndarray) -> np.ndarray:
    """float64 [..., 1]: torch's sum over the last axis of a C-ordered float64 array (the order, and so the
    bits, of the sums the envelope has always taken; numpy adds in another order). The builder's too."""
    return torch.from_numpy(x).sum(dim=-1, keepdim=True).numpy()


def _exp(x: np.ndarray) -> np.ndarray:
    """torch's float64 exp (numpy's differs in the last bits)."""
    return torch.exp(torch.from_numpy(x)).numpy()


def row_hulls(st: torch.Tensor, spread: torch.Tensor, used: torch.Tensor, counts: torch.Tensor, wl_hi: torch.Tensor,
              big_l_lo: torch.Tensor, w_abs: torch.Tensor, tiles: int,
              hulls: list[Hull]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor] | None:
    """Step 8 at the fold: (rows, lo, hi) for the degenerate rows, the output as a near-convex combination
    of the tiles' means ``mu_j`` (``out = sum_j beta_j (1 + g_j) mu_j / sum_j beta_j (1 + g'_j)`` with
    ``beta_j = w_j l_j >= 0`` and ``|g|, |g'| <= gamma``, the recurrence's roundings): between the least
    and the greatest mean over the tiles that can matter, through ``(1 +- gamma) / (1 -+ gamma)`` by sign,
    plus the other tiles' share (``beta_j <= w_hi l_hi``, at most HULL_NEGLIGIBLE of L) on their largest
    |mean|. A tile's mean is its hull (:func:`tile_hull`) where it is degenerate, else ``O_j / l_j``
    from its intervals (the kernel's own ``l_j`` lies in ``[max(L_lo, 1), L_hi exp(m_hi - m_lo)]``)."""
    d = (st.shape[-1] - 5) // 2
    rows = ((spread > DEGENERATE_SPREAD) & used).any(dim=-1).nonzero(as_tuple=True)      # (b, n, r)
    if not rows[0].numel():
        return None
    f = st[rows]                                                                        # [F, T, 2D + 5]
    m_lo, m_hi, l_lo, l_hi = (f[..., i] for i in range(4))
    o_lo, o_hi = f[..., 4:4 + d], f[..., 4 + d:4 + 2 * d]
    own_lo = torch.maximum(l_lo, torch.ones(())) * (1 - float64_slack(1))
    own_hi = l_hi * torch.exp((m_hi - m_lo) * (1 + 4 * U64)) * (1 + float64_slack(4))     # (m_hi - m_lo): rounded
    mean_lo, mean_hi = widen(torch.minimum(o_lo / own_lo[..., None], o_lo / own_hi[..., None]),
                             torch.maximum(o_hi / own_lo[..., None], o_hi / own_hi[..., None]), float64_slack(2))
    position = torch.full(st.shape[:3], -1, dtype=torch.int64)
    position[rows] = torch.arange(rows[0].numel())
    for state_row, head, row, low, high in hulls:
        b, t = state_row // tiles, state_row % tiles
        at = position[b, head, row]
        keep = at >= 0
        at, t = at[keep], t[keep]
        mean_lo[at, t] = torch.maximum(mean_lo[at, t], low[keep])
        mean_hi[at, t] = torch.minimum(mean_hi[at, t], high[keep])
    use = used[rows]                                                                    # [F, T]
    beta = torch.where(use, wl_hi[rows] * l_hi, 0.0) + torch.where(use, w_abs[rows] * f[..., -1] * 2, 0.0)
    floor = big_l_lo[rows]                                                              # [F, 1]
    matters = use & (beta >= HULL_NEGLIGIBLE * floor)
    top = torch.where(matters[..., None], mean_hi, -math.inf).amax(dim=1)              # [F, D]
    bottom = torch.where(matters[..., None], mean_lo, math.inf).amin(dim=1)
    t_count = counts[rows][..., None].double()
    gamma = torch.where(t_count > 1, (1 + U32) ** (2 * t_count) - 1, 0.0)
    high = torch.where(top >= 0, top * (1 + gamma) / (1 - gamma), top * (1 - gamma) / (1 + gamma))
    low = torch.where(bottom >= 0, bottom * (1 - gamma) / (1 + gamma), bottom * (1 + gamma) / (1 - gamma))
    rest = torch.where(use & ~matters, beta, 0.0)
    largest = torch.where(use[..., None], torch.maximum(mean_lo.abs(), mean_hi.abs()), 0.0)
    shares = (rest[..., None] * largest).sum(dim=1) + rest.sum(dim=1, keepdim=True) * torch.maximum(high.abs(), low.abs())
    # The other tiles' share over L (where L's lower bound underflowed every tile counts: no share), and the
    # recurrence's products where they are float32 subnormals: 2**-150 each, 2 per tile, over l >= 1.
    extra = torch.where(shares > 0, shares / floor, 0.0) + t_count * TINY32
    slack = float64_slack(8 + t_count)
    return rows, low - extra - slack * (low.abs() + extra), high + extra + slack * (high.abs() + extra)


def tile_hull(degenerate: torch.Tensor, visible: torch.Tensor, e_hi: torch.Tensor, s_hi: torch.Tensor,
              m_lo: torch.Tensor, v: torch.Tensor, v_scale: torch.Tensor, to_tiles: ToTiles, index: torch.Tensor, *,
              model: ConformanceModel, code_error: tuple[float, float, float], p_scale_lo: float) -> Hull:
    """Step 8 for the (tile, row)s of this chunk whose scores are uncertain by more than
    :data:`DEGENERATE_SPREAD`: bounds on the tile's own mean ``mu_j = O_j / l_j`` (per channel) that do
    not depend on the scores' spread: ``(states row, kv head, row, low, high)`` [F, D] for the fold, kept
    sparse by the builder (``code_error``: EnvelopeBuilder.code_error; ``p_scale_lo``: the least p_scale,
    EnvelopeBuilder.ps_lo).

    In the kernel's own frame (P relative to its m_j, so the argmax gives P = 1 and ``l_j >= 1``),
    ``O_j = sum_t a_t (V_t + e_t |V_t|)`` with ``V_t = v8_t v_scale`` exact, ``|e_t| <= theta'`` (MM2's
    any-order bound relative to its magnitude, and the two float32 products of F2), and ``a_t =
    p_scale P8_t`` within ``[c_lo P_t - alpha', c_hi P_t + alpha']`` (the codec's quantization error,
    golden.envelope.stages.quantization_error, and the roundings of ``RN(P scale)``, the scale and
    p_scale); ``l_j = (sum_t P_t)(1 +- lambda)`` (F1). So ``mu_j`` is a near-convex combination of the
    V rows: between ``g-(min V - theta'|V|)`` and ``g+(max V + theta'|V|)`` over the tokens that can
    matter (``P <= e_hi < HULL_NEGLIGIBLE`` elsewhere), where ``g+`` applies ``c_hi / (1 - lambda)`` to a
    non-negative value and ``c_lo / (1 + lambda)`` to a negative one (``g-`` the other way round), plus
    an absolute term: the codes' absolute error ``alpha'`` on every token, the negligible tokens' mass
    on their largest |V|, and on the hull's end (they take their share from it)."""
    at = degenerate[..., 0].nonzero(as_tuple=True)                          # (pair, kv head, row)
    pair, head, row = at
    vs = v_scale.expand(-1, v.shape[1], -1, -1)[pair, head, 0]               # [F, D], >= 0 (checked)
    seen = visible[pair, 0, row]                                             # [F, T]
    weight = e_hi[pair, head, row]                                           # the largest P each token can have
    matters = seen & (weight >= HULL_NEGLIGIBLE)
    count = seen.sum(dim=-1).double()                                        # [F] visible tokens
    lam = sum_relative(count, model)
    theta = (sum_relative(count, model) * (1 + _F2_ROUNDINGS) + _F2_ROUNDINGS)[:, None]
    # Which block holds each token of a tile (-1: none), to read the V rows that matter from the blocks.
    blocks = v.shape[0]
    block_of = to_tiles(torch.arange(blocks).reshape(blocks, 1, 1, 1).expand(blocks, 1, 1, v.shape[2]).contiguous(),
                        fill=-1)[:, 0, 0]                                    # [P, T]
    f, t = matters.nonzero(as_tuple=True)
    rows_v = v[block_of[pair[f], t], head[f], t % v.shape[2]]                # [K, D] E4M3 values, exact
    d = v.shape[-1]
    # x + theta |x| and x - theta |x| are increasing in x (theta < 1), and V = v8 * v_scale with v_scale
    # >= 0: their extremes over the tokens that matter are those of v8's.
    where = f[:, None].expand(-1, d)
    highest = torch.full((pair.numel(), d), -math.inf, dtype=torch.float64).scatter_reduce_(0, where, rows_v, "amax") * vs
    lowest = torch.full((pair.numel(), d), math.inf, dtype=torch.float64).scatter_reduce_(0, where, rows_v, "amin") * vs
    top, bottom = highest + theta * highest.abs(), lowest - theta * lowest.abs()
    # |V| over the row's visible tokens, a prefix of the tile's (SPEC §2.1): running maxima and sums along
    # the tile, read at the row's last visible token. The sums are exact (E4M3 magnitudes, multiples of
    # 2**-9 below 448, far fewer than 2**20 of them), so a row's values do not depend on what else the
    # chunk holds: the same bits for the row alone (golden.paged_attention_envelope's ``rows``).
    magnitude = to_tiles(v.abs().transpose(2, 3).contiguous())              # [P, N, D, T]
    last = (count.to(torch.int64) - 1).clamp(min=0)                          # degenerate rows see >= 1 token
    largest_v8 = torch.cummax(magnitude, dim=-1).values[pair, head, :, last]
    total_v8 = torch.cumsum(magnitude, dim=-1)[pair, head, :, last]
    largest, total = largest_v8 * vs * (1 + theta), total_v8 * vs * (1 + theta)
    # A negligible token's P is at most exp(RN(S_hi - m_lo)) within exp_ulps, and RN(d) <= d (1 - u) for d < 0
    # (e_hi < HULL_NEGLIGIBLE there): exp((S_hi - m_lo)(1 - delta)), with the float64 difference's rounding.
    rest = seen & ~matters
    above = torch.where(rest, s_hi[pair, head, row].double() - m_lo[pair, head, row], -math.inf)
    mass = torch.exp(above * (1 - ARGUMENT_ROUNDING - 4 * U64)).sum(dim=-1)
    negligible = (mass * (1 + model.exp_ulps * 2.0 ** -23) * (1 + float64_slack(4)) + count * model.exp_ulps * TINY32)[:, None]
    c_lo, c_hi, alpha = code_error
    lam = lam[:, None]

    def g_up(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= 0, x * c_hi / (1 - lam), x * c_lo / (1 + lam))

    def g_down(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= 0, x * c_lo / (1 + lam), x * c_hi / (1 - lam))
    high, low = g_up(top), g_down(bottom)
    # + the two float32 products after MM2 where subnormal (2**-150 each), over l_j >= 1.
    extra = (alpha * total + negligible * c_hi * largest + negligible * torch.maximum(high.abs(), low.abs())) / (1 - lam) + TINY32
    per_unit = torch.from_numpy(scale_product_error(p_scale_lo, vs.numpy(), model))
    if bool(per_unit.any()):
        # The scales multiplied together first (F2): |O_raw| per_unit, where |O_raw| <= sum_t P8_t |v8_t| and
        # P8_t = a_t / p_scale <= (c_hi P_t + alpha') / p_scale_lo, so |O_raw| <= (c_hi max|v8| sum_t P_t + alpha'
        # sum|v8|) / p_scale_lo over the visible tokens; over l_j >= (sum_t P_t)(1 - lambda), sum_t P_t >= 1:
        # (c_hi max|v8| + alpha' sum|v8|) / (p_scale_lo (1 - lambda)). Float64: its 6 roundings (4 products, the
        # quotient, the sum), relative to the term, inside the slack below (at least 9 units, on |low| + extra).
        extra = extra + per_unit * (c_hi * largest_v8 + alpha * total_v8) / (p_scale_lo * (1 - lam))
    # float64: about 8 roundings on each side (the products above, the quotients, the sums): relative.
    slack = float64_slack(8 + count[:, None])
    return (index[pair], head, row, low - extra - slack * (low.abs() + extra),
            high + extra + slack * (high.abs() + extra))


#: The relative rounding of the kernel's float32 exponent arguments (``x = RN(S - m)`` and the online
#: update's ``RN(m - m')``): ``|RN(z) - z| <= 2**-24 |z|`` for a normal z; a subnormal z moves exp by a factor
#: ``e**(+-2**-150)``, which is 1 in float64 and lies inside every slack below.
ARGUMENT_ROUNDING = U32


def tile_weights(m_lo: torch.Tensor, m_hi: torch.Tensor, mu: torch.Tensor, n_tiles: torch.Tensor,
                 model: ConformanceModel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 ``(w_lo, w_hi, w_abs)`` [..., T]: bounds on a tile's weight in the kernel's ``O = sum_j w_j O_j``
    and ``l = sum_j w_j l_j`` (module docstring, step 6), relative to ``exp(mu)``, for a tile whose max lies
    in ``[m_lo, m_hi]``, of a row of ``n_tiles`` [..., 1] tiles whose max is at most ``mu``:
    ``w_lo - w_abs <= w exp(M - mu) <= w_hi + w_abs``.

    The kernel's weight is ``c_j a_(j+1) ... a_T``: at most ``T - 1`` factors ``exp(RN(z))`` whose exact
    arguments ``z`` are all <= 0 and add up to ``m_j - M``, so their roundings add up to at most
    ``delta |m_j - M|`` (:data:`ARGUMENT_ROUNDING`); each exp within ``exp_ulps`` (relative ``e = exp_ulps
    2**-23``, and ``exp_ulps 2**-149`` absolute where it is subnormal), and the recurrence's float32 products
    and sums, 2 per tile on a weight's path (``(1 + u)**(2T)``, and 2**-150 each where subnormal). With
    ``M <= mu`` the exponent ``(m_j - M)(1 +- delta) + (M - mu)`` lies between ``(m_j - mu)(1 + delta)`` and
    ``(m_j - mu)(1 - delta)``: the bounds are ``exp`` of those (at most 1: no factor overflows, however far
    apart the tile maxima), times ``(1 +- e)**(T - 1) (1 +- u)**(2T)``, taken in the exponent
    (``log(1 + x) <= x``, ``log(1 - x) >= -x (1 + 2x)`` for small x). A row of one tile has no factor.

    float64: the arguments carry 4 roundings (the difference, the product, two additions), covered by
    4 units of relative margin on ``m - mu``; ``exp`` itself 2 units and the product by the slack 1: 3."""
    lo, hi, mid, n = (x.detach().double().numpy() for x in (m_lo, m_hi, mu, n_tiles))
    w_lo, w_hi, w_abs = _tile_weights(lo, hi, mid, n, model)
    return torch.from_numpy(w_lo), torch.from_numpy(w_hi), torch.from_numpy(w_abs).expand(w_hi.shape)


def _tile_weights(m_lo: np.ndarray, m_hi: np.ndarray, mu: np.ndarray, n: np.ndarray,
                  model: ConformanceModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`tile_weights` on float64 numpy arrays (the fold's), ``w_abs`` [..., 1]."""
    many = n > 1
    factors = np.maximum(n - 1, 0.0)
    e = model.exp_ulps * 2.0 ** -23
    delta = many * ARGUMENT_ROUNDING + 4 * U64
    up = factors * e + np.where(many, 2 * n * U32, 0.0)
    down = factors * e * (1 + 2 * e) + np.where(many, 2 * n * U32 * (1 + 2 * U32), 0.0)
    w_hi = _exp((m_hi - mu) * (1 - delta) + up) * (1 + float64_slack(3))
    w_lo = _exp((m_lo - mu) * (1 + delta) - down) * (1 - float64_slack(3))
    w_abs = np.where(many, (factors * model.exp_ulps * TINY32 + 2 * n * TINY32 / 2) * 2, 0.0)
    return w_lo, w_hi, w_abs


def signed_weighted_sum(positive_weight: torch.Tensor, negative_weight: torch.Tensor,
                        o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(sum_t pw_t max(o_t, 0) + nw_t min(o_t, 0), the same with |.|)`` over the tile axis of
    ``o`` [..., T, D], weights [..., T]: the fold's N bounds and the magnitude its rounding bound reads.
    One [..., T, D] temporary at a time (the upstream cases have 65 tiles of 128 channels per row)."""
    plus = torch.matmul(positive_weight[..., None, :], o.clamp(min=0))[..., 0, :]
    minus = torch.matmul(negative_weight[..., None, :], o.clamp(max=0))[..., 0, :]
    return plus + minus, plus - minus
