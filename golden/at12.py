"""AT-12, QK^T MatMul Scale: the first stage (C1) of attention on its own (SPEC §6).

    scores = (Q @ K^T) in float32, then scores * scale,     scale = 1/sqrt(head_dim) at run time

FP8 variant (``dequant_after``): Q and K hold E4M3 codes with per-token scales q_scale [q_tile, 1]
and k_scale [k_tile, 1]; the float32 product is dequantized first (``* q_scale * k_scale^T``, the K
scale transposed to [1, k_tile]) and scaled second, exactly as in SPEC §2.3's MM1.
"""
from __future__ import annotations

import torch

from .attention import dequantize_scores
from .codec import Fp8Codec, get_codec
from .envelope.stages import dequant_interval, raw_interval, refine_score_bounds, score_bounds
from .intervals import lowbit
from .matmul import exact_matmul
from .model import SPEC_MODEL, ConformanceModel
from .validate import check_at12_scores_in_float32, check_on_cpu, check_qk_matmul_scale_args, check_scales_not_negative

__all__ = ["qk_matmul_scale", "qk_matmul_scale_loop", "qk_matmul_scale_envelope"]

AT12_TOLERANCE = (1 / 128, 1e-4)   # (rtol, atol) of SPEC §6, the same rule as §4


def qk_matmul_scale(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
    q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
    codec: Fp8Codec | str | None = None,
) -> torch.Tensor:
    """float32 [q_tile, k_tile]: ``Q @ K^T * scale`` (SPEC §6).

    q [q_tile, D], k [k_tile, D]: both bfloat16 or float16, or both float8_e4m3fn with q_scale
    [q_tile, 1] and k_scale [k_tile, 1] float32 (then dequantized before scaling). scale None means
    1/sqrt(D). codec (FP8 only) says how codes are read; None is the spec's E4M3FN.
    """
    check_on_cpu(q=q, k=k, q_scale=q_scale, k_scale=k_scale)
    _, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
    check_at12_scores_in_float32(q_scale, k_scale, q.shape[-1], scale)
    if q_scale is None or k_scale is None:      # not FP8 (checked: FP8 comes with both scales, the rest with none)
        return exact_matmul(q.float(), k.float().T) * torch.tensor(scale, dtype=torch.float32)
    codec = get_codec(codec)
    raw = exact_matmul(codec.from_fp8(q), codec.from_fp8(k).T)
    return dequantize_scores(raw, q_scale, k_scale.T, scale)


def qk_matmul_scale_loop(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
    q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
    codec: Fp8Codec | str | None = None,
) -> torch.Tensor:
    """:func:`qk_matmul_scale` by another route, one score row at a time (the golden backend's AT-12).

    Row i is ``sum_d q[i, d] * k[:, d]`` as an elementwise float64 product summed over d (no matmul),
    rounded once to float32, then for FP8 ``* q_scale[i]`` and ``* k_scale[j]`` one factor at a time in
    float32, then ``* scale``: SPEC §6 read literally, sharing no arithmetic helper with the vectorized
    route, so a law that compares the two checks one against the other rather than itself.
    """
    check_on_cpu(q=q, k=k, q_scale=q_scale, k_scale=k_scale)
    _, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
    check_at12_scores_in_float32(q_scale, k_scale, q.shape[-1], scale)
    # FP8 exactly when the scales are given (checked: FP8 comes with both, the rest with none).
    scales = None if q_scale is None or k_scale is None else (q_scale, k_scale)
    if scales is not None:
        codec = get_codec(codec)
        qv, kv = codec.decode(q, torch.float64), codec.decode(k, torch.float64)
    else:
        qv, kv = q.double(), k.double()
    factor = torch.tensor(scale, dtype=torch.float32)
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32)
    for i in range(q.shape[0]):
        row = (qv[i][None, :] * kv).sum(dim=1).float()
        if scales is not None:
            row = row * scales[0][i, 0] * scales[1][:, 0]
        out[i] = row * factor
    return out


def qk_matmul_scale_envelope(
    q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
    q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
    codec: Fp8Codec | str | None = None, model: ConformanceModel | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 (golden, lo, hi) [q_tile, k_tile]: :func:`qk_matmul_scale` and the envelope holding every
    conforming result (SPEC §4.1-4.2 applied to SPEC §6).

    The products of E4M3 (and of bf16 or fp16) values are exact in float32, so a kernel's raw score is
    a float32 sum of exact terms in any order: within the any-order bound of the exact sum (0 under the
    exactness certificate; the residue bound where the plain one would widen past the tolerance:
    golden/intervals.py). Then ``* q_scale * k_scale`` in any order (F2) and ``* scale`` last, or for
    bf16 ``* scale`` alone, each rounded: monotone, so the ends map to the ends. Where the exact scores
    cancel (a small score from large products) the tolerance is not sound and the envelope is wider.
    """
    check_on_cpu(q=q, k=k, q_scale=q_scale, k_scale=k_scale)
    is_fp8, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
    check_at12_scores_in_float32(q_scale, k_scale, q.shape[-1], scale)
    check_scales_not_negative(q_scale=q_scale, k_scale=k_scale)
    model = SPEC_MODEL if model is None else model
    codec = get_codec(codec)
    qv, kv = (codec.from_fp8(q), codec.from_fp8(k)) if is_fp8 else (q.float(), k.float())
    golden = qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)
    exact = qv.double() @ kv.double().T
    abs_sum = qv.double().abs() @ kv.double().abs().T
    grid = lowbit(qv).amin(dim=-1)[:, None] * lowbit(kv).amin(dim=-1)[None, :]
    e1 = score_bounds(exact, abs_sum, grid, qv.shape[-1], model)
    factor = torch.tensor(scale, dtype=torch.float32)

    def bounds(e1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raw_lo, raw_hi = raw_interval(exact, e1, model)
        if q_scale is not None and k_scale is not None:     # FP8 (checked: then both scales are given)
            return dequant_interval(raw_lo, raw_hi, q_scale, k_scale.T, factor, model)
        return raw_lo * factor, raw_hi * factor

    lo, hi = bounds(e1)
    if model.sums == "any-order":
        rtol, atol = AT12_TOLERANCE
        tol = atol + rtol * golden.abs()
        at = (((hi - golden) > tol) | ((golden - lo) > tol)).nonzero(as_tuple=True)
        if at[0].numel():
            products = qv.double()[at[0]] * kv.double()[at[1]]
            e1 = e1.index_put(at, torch.minimum(e1[at], refine_score_bounds(products, exact[at], abs_sum[at])))
            lo, hi = bounds(e1)
    return golden, torch.minimum(lo, golden), torch.maximum(hi, golden)
