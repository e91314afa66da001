"""A paged-attention kernel in plain float32 torch that uses only SPEC §4.1's freedoms, each chosen by
a :class:`Variant`: the mutants' counterpart. Every variant is correct; a law or acceptance rule that
fails one is too strict (a false red).

The walk is SPEC §2 as written, vectorized over the rows of one (batch, kv head) and the tokens of one
tile: MM1 as float32 products (exact for E4M3) summed in the variant's order, the dequant
multiplications in the variant's order, the local softmax with the variant's exp, P quantized with
scale ``448 / rowmax(P)``, MM2 summed in the variant's order, the online update (optionally with fused
multiply-adds) and the final division. Nothing is computed in float64 except where a variant says so
(the vertex variants read the envelope's own bound on the raw score).
"""
from __future__ import annotations

import dataclasses

import torch

from pfa_verify.golden.attention import visible_lengths
from pfa_verify.golden.codec import get_codec
from pfa_verify.golden.envelope.stages import refine_score_bounds, score_bounds
from pfa_verify.golden.intervals import down32_add, lowbit, up32_add
from pfa_verify.golden.model import DETERMINISTIC_MODEL, SPEC_MODEL
from pfa_verify.golden.quant import FP8_MAX
from pfa_verify.kernels.backends import Backend
from pfa_verify.kernels.conforming.arithmetic import DIVISIONS, ORDERS, divide, exp_edge, exp_ulps, fma, fsum

__all__ = ["Variant", "ConformingKernel", "VERTICES", "SCALE_ORDERS", "EITHER_EDGE"]

VERTICES = ("vertex-low", "vertex-high", "vertex-mixed")
SCALE_ORDERS = ("spec", "upstream", "fused")
#: Variant.exp_edge: every exp at the upper or the lower edge F3 allows, at random per element and call.
EITHER_EDGE = 2


@dataclasses.dataclass(frozen=True)
class Variant:
    """The arithmetic choices of one conforming kernel (SPEC §4.1; ``description`` says them in words).

    * ``mm1``, ``mm2``, ``row_sum`` -- an order of kernels.conforming.arithmetic.ORDERS (F1); ``mm1`` may
      also be a vertex: every raw score at the low or high end of the envelope's interval, or either at
      random (an adversary for the envelope's later stages, not an execution F1 is known to reach).
    * ``scale_order`` -- ``spec`` ((S q_scale) k_scale, then softmax_scale; (O p_scale) v_scale),
      ``upstream`` ((S k_scale) q_scale; (O v_scale) p_scale) or ``fused`` (S (q_scale k_scale);
      O (p_scale v_scale)) (F2).
    * ``exp_ulps`` -- exp moved this many float32 steps from the correctly rounded value, never past
      ``|exp_ulps|`` SPEC ulps from the exact value (kernels.conforming.arithmetic.exp_ulps), exp(0) = 1
      (F3: ``|exp_ulps| <= 3``).
    * ``exp_edge`` -- 0, or +1 / -1: every exp (P and the update's factors) at the farthest float32 F3
      allows above / below the exact value, with SPEC's ulp (kernels.conforming.arithmetic.exp_edge, at
      SPEC_MODEL.exp_ulps: 3); :data:`EITHER_EDGE`: at one of the two, chosen at random for every element
      on every call (not deterministic); overrides ``exp_ulps``.
    * ``division`` -- one of kernels.conforming.arithmetic.DIVISIONS (``divide``, ``reciprocal``, ``up``,
      ``down``, and ``edge-up`` / ``edge-down``: the farthest float32 within 1 SPEC ulp; F3).
    * ``update`` -- ``plain`` (``a*l + c*l_j``, three roundings) or ``fma`` (``fma(a, l, c*l_j)``).
    """
    name: str
    description: str
    _: dataclasses.KW_ONLY       # the choices by name: VARIANTS lists only what differs from the golden
    mm1: str = "forward"
    mm2: str = "forward"
    row_sum: str = "forward"
    scale_order: str = "spec"
    exp_ulps: int = 0
    exp_edge: int = 0
    division: str = "divide"
    update: str = "plain"

    def __post_init__(self) -> None:
        for field in ("mm2", "row_sum"):
            if getattr(self, field) not in ORDERS:
                raise ValueError(f"{field}={getattr(self, field)!r} must be one of {ORDERS}")
        if self.mm1 not in ORDERS + VERTICES:
            raise ValueError(f"mm1={self.mm1!r} must be one of {ORDERS + VERTICES}")
        if self.scale_order not in SCALE_ORDERS:
            raise ValueError(f"scale_order={self.scale_order!r} must be one of {SCALE_ORDERS}")
        most = SPEC_MODEL.exp_ulps
        if not -most <= self.exp_ulps <= most:
            raise ValueError(f"exp_ulps={self.exp_ulps!r} must lie in [{-most:g}, {most:g}] (SPEC §4.1 F3: exp "
                             f"within {most:g} ulp)")
        if self.exp_edge not in (-1, 0, 1, EITHER_EDGE):
            raise ValueError(f"exp_edge={self.exp_edge!r} must be -1, 0, 1 or {EITHER_EDGE} (either, at random)")
        if self.division not in DIVISIONS:
            raise ValueError(f"division={self.division!r} must be one of {DIVISIONS}")
        if self.update not in ("plain", "fma"):
            raise ValueError(f"update={self.update!r} must be 'plain' or 'fma'")


def _scaled(x: torch.Tensor, first: torch.Tensor, second: torch.Tensor, order: str) -> torch.Tensor:
    """float32 ``x * first * second`` in the variant's order (first = q_scale or p_scale)."""
    if order == "spec":
        return x * first * second
    if order == "upstream":
        return x * second * first
    return x * (first * second)


class ConformingKernel(Backend):
    """A backend computing SPEC §2 with the freedoms of one :class:`Variant` (``conforming:NAME``)."""

    level = "conforming"

    def __init__(self, variant: Variant, *, codec=None, seed: int = 0) -> None:
        self.variant = variant
        # A variant that draws its order, its vertices or its exp's edges afresh on every call is not
        # deterministic.
        random = ("shuffled" in (variant.mm1, variant.mm2, variant.row_sum) or variant.mm1 == "vertex-mixed"
                  or variant.exp_edge == EITHER_EDGE)
        self.model = SPEC_MODEL if random else DETERMINISTIC_MODEL
        self.name = f"conforming:{variant.name}"
        self.codec = get_codec(codec)
        self.seed = seed
        self._calls = 0
        self._exps = 0

    def _exp(self, x: torch.Tensor) -> torch.Tensor:
        """The variant's float32 exp (F3, SPEC_MODEL.exp_ulps): at an edge (or either, at random), or
        ``exp_ulps`` steps from the correctly rounded value."""
        ulps = SPEC_MODEL.exp_ulps
        if self.variant.exp_edge == EITHER_EDGE:
            self._exps += 1
            up = torch.rand(x.shape, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self._exps)) < 0.5
            return torch.where(up, exp_edge(x, 1, ulps), exp_edge(x, -1, ulps))
        if self.variant.exp_edge:
            return exp_edge(x, self.variant.exp_edge, ulps)
        return exp_ulps(x, self.variant.exp_ulps)

    # -- MM1 ----------------------------------------------------------------------------------------------
    def _raw_scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """float32 [..., rows, tokens]: MM1 of decoded float32 operands q [..., rows, D], k [..., tokens, D]."""
        order = self.variant.mm1
        self._calls += 1
        if order not in VERTICES:
            return fsum(q[..., :, None, :] * k[..., None, :, :], order, seed=self.seed + self._calls)
        exact = q.double() @ k.double().transpose(-1, -2)
        abs_sum = q.double().abs() @ k.double().abs().transpose(-1, -2)
        grid = lowbit(q).amin(dim=-1)[..., :, None] * lowbit(k).amin(dim=-1)[..., None, :]
        e1 = score_bounds(exact, abs_sum, grid, q.shape[-1], SPEC_MODEL)
        at = (e1 > 0).nonzero(as_tuple=True)
        if at[0].numel():
            products = (q.double()[..., :, None, :] * k.double()[..., None, :, :])[at]
            e1 = e1.index_put(at, torch.minimum(e1[at], refine_score_bounds(products, exact[at], abs_sum[at])))
        low, high = down32_add(exact, -e1), up32_add(exact, e1)       # the ends exactly, as the envelope takes them
        if order == "vertex-low":
            return low
        if order == "vertex-high":
            return high
        pick = torch.rand(exact.shape, generator=torch.Generator().manual_seed(self.seed + self._calls)) < 0.5
        return torch.where(pick, low, high)

    # -- the walk -----------------------------------------------------------------------------------------
    def _paged_attention(self, dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs):
        """SPEC §2 tile by tile, vectorized over batches, kv heads, rows and tokens (tokens past a batch's
        length are masked, never read into a result)."""
        v_ = self.variant
        codec = self.codec
        b_, s1, nkv, group, d = dims.batch, dims.s1, dims.nkv, dims.group, dims.head_dim
        lengths = kv_act_seqs.long()
        # Rows of one (batch, kv head): [B, N, R = S1 * G, D], as the golden lays them out.
        rows_q = codec.decode(q).view(b_, s1, nkv, group, d).transpose(1, 2).reshape(b_, nkv, s1 * group, d)
        qs = q_scale.view(b_, s1, nkv, group).transpose(1, 2).reshape(b_, nkv, s1 * group, 1)
        cur = visible_lengths(kv_act_seqs, s1)                                              # [B, S1]
        row_cur = cur.repeat_interleave(group, dim=1)[:, None, :, None]                      # [B, 1, R, 1]
        sm = torch.tensor(dims.softmax_scale, dtype=torch.float32)
        state = None
        for start in range(0, int(lengths.max()) if lengths.numel() else 0, dims.s2_tile):
            t = torch.arange(start, start + dims.s2_tile)
            exists = t[None, :] < lengths[:, None]                                            # [B, T]
            column = (t // dims.block_size).clamp(max=block_table.shape[1] - 1)
            blocks = torch.where(exists, block_table[:, column].long(), 0).clamp(min=0)
            slots = (t % dims.block_size)[None, :].expand_as(blocks)
            k8 = torch.where(exists[..., None, None], codec.decode(k_cache[blocks, slots].contiguous()), 0.0)  # [B, T, N, D]
            v8 = torch.where(exists[..., None, None], codec.decode(v_cache[blocks, slots].contiguous()), 0.0)
            ks = torch.where(exists[..., None], k_scale[blocks, slots, :, 0], 1.0)           # [B, T, N]
            visible = t[None, None, None, :] < row_cur                                        # [B, 1, R, T]
            raw = self._raw_scores(rows_q, k8.permute(0, 2, 1, 3))                           # [B, N, R, T]
            s = _scaled(raw, qs, ks.permute(0, 2, 1)[:, :, None, :], v_.scale_order) * sm
            s = torch.where(visible, s, -torch.inf)
            m_j = s.amax(dim=-1, keepdim=True)
            active = visible.any(dim=-1, keepdim=True).expand_as(m_j)
            x = torch.where(visible, s - torch.where(active, m_j, 0.0), -torch.inf)
            p = self._exp(x)
            l_j = fsum(p, v_.row_sum, seed=self.seed + start)[..., None]
            scale = torch.full_like(m_j, FP8_MAX).div(torch.where(active, p.amax(dim=-1, keepdim=True), 1.0))
            p8 = self.codec.round(p * scale)
            ps = torch.reciprocal(scale)
            # MM2: [B, N, R, D] summed over the tile's tokens in the variant's order.
            products = p8[..., :, None] * v8.permute(0, 2, 1, 3)[:, :, None, :, :]           # [B, N, R, T, D]
            o_raw = fsum(products.transpose(-1, -2), v_.mm2, seed=self.seed + start + 1)
            o_j = _scaled(o_raw, ps, v_scale[:, :, None, :], v_.scale_order)
            state = self._update(state, m_j, l_j, o_j, active)
        if state is None:
            return torch.zeros(q.shape).bfloat16()
        _, l, o, started = state
        result = torch.where(started, divide(o, torch.where(started, l, 1.0), v_.division), 0.0)
        out = result.view(b_, nkv, s1, group, d).transpose(1, 2).reshape(q.shape)
        return out.bfloat16().contiguous()

    def _update(self, state, m_j, l_j, o_j, active):
        """The online update of SPEC §2.3 for the rows ``active`` in this tile (others keep their state)."""
        v_ = self.variant
        if state is None:
            return (torch.where(active, m_j, -torch.inf), torch.where(active, l_j, 0.0),
                    torch.where(active, o_j, 0.0), active)
        m, l, o, started = state
        m_new = torch.maximum(m, m_j)
        a = self._exp(torch.where(started & active, m - m_new, 0.0))
        c = self._exp(torch.where(started & active, m_j - m_new, 0.0))
        if v_.update == "fma":
            l_next, o_next = fma(a, l, c * l_j), fma(a, o, c * o_j)
        else:
            l_next, o_next = a * l + c * l_j, a * o + c * o_j
        both = started & active
        l = torch.where(both, l_next, torch.where(active, l_j, l))
        o = torch.where(both, o_next, torch.where(active, o_j, o))
        m = torch.where(active, torch.where(started, m_new, m_j), m)
        return m, l, o, started | active

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        if q.dtype == torch.float8_e4m3fn:
            raw = self._raw_scores(self.codec.from_fp8(q), self.codec.from_fp8(k))
            return _scaled(raw, q_scale, k_scale.T, self.variant.scale_order) * torch.tensor(scale, dtype=torch.float32)
        return self._raw_scores(q.float(), k.float()) * torch.tensor(scale, dtype=torch.float32)
