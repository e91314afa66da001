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
from .matmul import exact_matmul
from .validate import check_on_cpu, check_qk_matmul_scale_args

__all__ = ["qk_matmul_scale", "qk_matmul_scale_loop"]


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
    is_fp8, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
    if not is_fp8:
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
    is_fp8, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
    if is_fp8:
        codec = get_codec(codec)
        qv, kv = codec.decode(q, torch.float64), codec.decode(k, torch.float64)
    else:
        qv, kv = q.double(), k.double()
    factor = torch.tensor(scale, dtype=torch.float32)
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32)
    for i in range(q.shape[0]):
        row = (qv[i][None, :] * kv).sum(dim=1).float()
        if is_fp8:
            row = row * q_scale[i, 0] * k_scale[:, 0]
        out[i] = row * factor
    return out
