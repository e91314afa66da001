"""Symmetric FP8 quantization along one axis (SPEC §3).

    scale = 448 / max|x|   (over the quantization axis, float32)
    x8    = e4m3(x * scale)
    dequant_scale = 1 / scale

| tensor | axis of the max | function |
| --- | --- | --- |
| Q | D, per (token, head) | ``quantize_per_token`` |
| K | D, per (block row, kv head) | ``quantize_per_token`` |
| V | sequence, per (batch, kv head, channel), valid tokens only | ``quantize_per_channel(valid=...)`` |
| P | tile columns, per row (inside the kernel) | ``quantize_rows`` |

Decision (SPEC §3 leaves it open): a row so small that 448 / max|x| overflows float32 (max|x| below
about 1.3e-36) is rejected with a ValueError naming the tensor and row; it has no finite scale.
Test: tests/golden/test_quant.py::test_scale_overflow_row_raises.

Decision (SPEC §3 leaves it open): an all-zero row would give ``scale = inf``. By default it is
rejected with a ValueError naming the tensor and the row (``zero_rows="raise"``). The opt-in policy
``zero_rows="unit_scale"`` encodes such a row as zeros with dequant scale 1.0, so it dequantizes
to exact zeros. Tests: tests/golden/test_quant.py::test_zero_row_*.
"""
from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
import torch

from .codec import FP8_MAX, SPEC_CODEC

__all__ = [
    "FP8_MAX", "ZeroRowPolicy", "Rounding", "quantize_per_token", "quantize_per_channel", "channel_scales",
    "quantize_rows"]

ZeroRowPolicy = Literal["raise", "unit_scale"]
_ZERO_ROW_POLICIES = ("raise", "unit_scale")


class Rounding(Protocol):
    """What :func:`quantize_rows` reads its codes back through: an Fp8Codec's ``round`` (or a mutant's
    cast of one, kernels/mutants/golden_level.py)."""

    def round(self, x: torch.Tensor, /) -> torch.Tensor: ...


def _check_source(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        raise TypeError(f"{name} must be a float32/bfloat16/float16/float64 tensor, got {x.dtype}")
    if x.ndim < 1 or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty tensor with at least one dimension, got shape {tuple(x.shape)}")


def _fp8_max_over(amax: torch.Tensor) -> torch.Tensor:
    """float32 ``448 / amax``, one IEEE division (the kernel divides a 448-filled tile by the max).

    Not ``FP8_MAX / amax``: for a Python scalar numerator torch computes ``amax.reciprocal() * 448``,
    two roundings (149.33334 instead of 149.33333 for amax = 3).
    """
    return torch.full_like(amax, FP8_MAX).div(amax)


def _scales_from_amax(amax: torch.Tensor, *, dim: int, zero_rows: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, dequant_scale) in float32 from the per-row max |x| (``dim`` kept as size 1).

    Applies the zero-row policy; a bad row is named by its index without the reduced axis.
    """
    axis_desc = f"dim {dim}"

    def first(mask: torch.Tensor) -> tuple[int, ...]:
        index = torch.nonzero(mask)[0].tolist()
        del index[dim]
        return tuple(index)

    if zero_rows not in _ZERO_ROW_POLICIES:
        raise ValueError(f"zero_rows={zero_rows!r} is not a policy; expected one of {_ZERO_ROW_POLICIES}")
    values = amax.detach().numpy()
    if np.isfinite(values).all() and values.all():          # the common case, checked cheaply (numpy)
        scale = _fp8_max_over(amax)
        if not np.isinf(scale.numpy()).any():
            return scale, torch.reciprocal(scale)
    if torch.isnan(amax).any():
        row = first(torch.isnan(amax))
        raise ValueError(f"{name} has NaN in row {row} (max over {axis_desc}); quantization needs finite values")
    if torch.isinf(amax).any():
        row = first(torch.isinf(amax))
        raise ValueError(f"{name} has an infinite value in row {row} (max over {axis_desc}); quantization needs finite values")
    zero = amax == 0
    if zero.any() and zero_rows == "raise":
        row = first(zero)
        raise ValueError(
            f"{name} row {row} is all zeros over {axis_desc}, so scale = 448 / 0 is infinite (SPEC §3); "
            f"pass zero_rows='unit_scale' to encode such rows as zeros with dequant scale 1"
        )
    scale = torch.where(zero, 1.0, _fp8_max_over(torch.where(zero, 1.0, amax)))
    overflow = torch.isinf(scale)
    if overflow.any():
        row = first(overflow)
        raise ValueError(
            f"{name} row {row} has max|x| = {float(amax[overflow].flatten()[0]):.3g} over {axis_desc}, so scale = 448 / max "
            f"overflows float32 (rows need max|x| >= {FP8_MAX / torch.finfo(torch.float32).max:.3g}); "
            f"rescale the input"
        )
    return scale, torch.reciprocal(scale)


def quantize_rows(
    x: torch.Tensor, *, valid: torch.Tensor | None = None, codec: Rounding = SPEC_CODEC,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize-dequantize along the last axis: ``(codec.round(x * scale), dequant_scale)``, float32.

    This is the in-kernel form (the P quantization of SPEC §2.3): the FP8 values come back already
    decoded by ``codec``, so the caller multiplies them by the dequant scale after the next matmul.
    ``valid`` (bool, x's shape) marks the columns that count; others give 0 and do not enter the max.
    Unlike the host-side quantizers this never raises: a row without a valid column gets scale 1
    (it is all zeros), and NaN propagates, so garbage that reaches P stays visible in the output.
    """
    x = x.float()
    if valid is not None:
        x = torch.where(valid, x, 0.0)
    amax = x.abs().amax(dim=-1, keepdim=True)
    # An empty row divides 448 by 448: scale 1, exactly.
    scale = _fp8_max_over(torch.where(amax == 0, FP8_MAX, amax))
    return codec.round(x * scale), torch.reciprocal(scale)


def quantize_per_token(
    x: torch.Tensor, *, zero_rows: ZeroRowPolicy = "raise", name: str = "x",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_fp8, dequant_scale)``: E4M3FN codes scaled per row of the last axis (Q and K, SPEC §3).

    x: [..., D] float. Returns x_fp8 [..., D] torch.float8_e4m3fn (spec codec) and dequant_scale
    [..., 1] float32, so that ``x ~= x_fp8.float() * dequant_scale``.
    """
    _check_source(x, name)
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale, dequant = _scales_from_amax(amax, dim=x.ndim - 1, zero_rows=zero_rows, name=name)
    return SPEC_CODEC.to_fp8(xf * scale), dequant


def quantize_per_channel(
    x: torch.Tensor, dim: int, *, valid: torch.Tensor | None = None,
    zero_rows: ZeroRowPolicy = "raise", name: str = "x",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_fp8, dequant_scale)``: E4M3FN codes scaled per channel, the max taken along ``dim`` (V).

    x: e.g. V as [B, S, NKV, D] with dim=1 (sequence). valid: optional bool tensor broadcastable
    to x marking the tokens that count (SPEC §3: V's max is over each batch's valid tokens);
    invalid entries are encoded as 0 and do not change the max. Returns x_fp8 (x's shape,
    float8_e4m3fn) and dequant_scale float32 with ``dim`` kept as size 1.
    """
    _check_source(x, name)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim={dim!r} must be an int in [{-x.ndim}, {x.ndim}) for {name} of shape {tuple(x.shape)}")
    if valid is None:
        xf = x.float()
    else:
        if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool:
            raise TypeError(f"valid must be a bool tensor, got {type(valid).__name__ if not isinstance(valid, torch.Tensor) else valid.dtype}")
        try:
            valid = valid.expand_as(x)
        except RuntimeError:
            raise ValueError(f"valid of shape {tuple(valid.shape)} does not broadcast to {name} of shape {tuple(x.shape)}") from None
        # A copy of its own (never the caller's tensor), zeroed in place where invalid.
        xf = x.to(torch.float32, copy=True).masked_fill_(~valid, 0.0)
    amax = xf.abs().amax(dim=dim, keepdim=True)
    scale, dequant = channel_scales(amax, dim=dim % x.ndim, zero_rows=zero_rows, name=name)
    return SPEC_CODEC.to_fp8(xf * scale), dequant


def channel_scales(amax: torch.Tensor, *, dim: int, zero_rows: ZeroRowPolicy = "raise",
                   name: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, dequant_scale)`` float32 of per-channel maxima ``amax`` (the reduced axis ``dim`` kept as
    size 1): what :func:`quantize_per_channel` multiplies by and returns, for a caller that takes the max
    over the tensor in pieces (golden.inputs makes long caches so). ``zero_rows`` as there."""
    return _scales_from_amax(amax, dim=dim, zero_rows=zero_rows, name=name)
