"""golden/at12.py, SPEC §6: the BF16/FP16 path against a float64 reference, the FP8 dequant_after
order (dequantize, then scale), the default scale 1/sqrt(D), tail shapes, and agreement with the
MM1 stage of the attention golden."""
from __future__ import annotations

import math

import golden_helpers as gh
import ml_dtypes
import numpy as np
import pytest
import torch

from pfa_verify.golden import (
    SPEC_CODEC,
    PagedAttentionConfig,
    make_inputs,
    paged_attention_fp8,
    paged_to_contiguous,
    qk_matmul_scale,
    quantize_per_token,
)
from pfa_verify.golden.attention import tile_values
from pfa_verify.golden.softmax_state import local_softmax
from pfa_verify.properties.rule import compare as cmp


def draw(shape, dtype, seed):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1).to(dtype)


def decode_independently(x8: torch.Tensor) -> torch.Tensor:
    """float64 values of a float8_e4m3fn tensor through ml_dtypes (not the golden's codec)."""
    return torch.from_numpy(x8.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("q_tile, k_tile, d", [(1, 1, 1), (16, 37, 64), (5, 128, 128)], ids=str)
def test_half_precision_equals_float64_reference(dtype, q_tile, k_tile, d):
    q, k = draw((q_tile, d), dtype, 1), draw((k_tile, d), dtype, 2)
    scores = qk_matmul_scale(q, k)
    assert scores.dtype == torch.float32 and scores.shape == (q_tile, k_tile)
    reference = (q.double() @ k.double().T) / math.sqrt(d)
    # Two float32 roundings (the product, the scale) and the float32 scale: about 1.5 ulp.
    cmp.assert_close(scores.double(), reference, rtol=2.0 ** -22, atol=1e-12,
                     identifier=f"qk_matmul_scale({str(dtype)[6:]}) vs float64")


def test_scale_default_is_inverse_sqrt_head_dim():
    q, k = draw((4, 48), torch.bfloat16, 3), draw((6, 48), torch.bfloat16, 4)
    gh.assert_identical(qk_matmul_scale(q, k), qk_matmul_scale(q, k, scale=1 / math.sqrt(48)), "scale=None")
    unscaled = qk_matmul_scale(q, k, scale=1.0)
    gh.assert_identical(qk_matmul_scale(q, k), unscaled * torch.tensor(48 ** -0.5, dtype=torch.float32), "scale")


def test_explicit_scale():
    q = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    k = torch.tensor([[3.0, 4.0], [-1.0, 0.5]], dtype=torch.bfloat16)
    assert qk_matmul_scale(q, k, scale=0.5).tolist() == [[5.5, 0.0]]


def fp8_operands(q_tile=8, k_tile=19, d=32, seed=0):
    q8, q_scale = quantize_per_token(draw((q_tile, d), torch.float32, seed) * 3)
    k8, k_scale = quantize_per_token(draw((k_tile, d), torch.float32, seed + 1) / 7)
    return q8, q_scale.view(q_tile, 1), k8, k_scale.view(k_tile, 1)


def test_fp8_dequantizes_then_scales():
    """FP8: raw = q8 @ k8^T (exact), then raw * q_scale * k_scale^T, then * scale, each in float32."""
    q8, q_scale, k8, k_scale = fp8_operands()
    scale = 1 / math.sqrt(32)
    raw = (decode_independently(q8) @ decode_independently(k8).T).float()  # exact in float64
    expected = raw * q_scale * k_scale.T * torch.tensor(scale, dtype=torch.float32)
    got = qk_matmul_scale(q8, k8, q_scale=q_scale, k_scale=k_scale)
    gh.assert_identical(got, expected, "FP8 AT-12 vs dequantize-then-scale")
    # The order is observable: scaling first (or folding the scales) gives other bits somewhere.
    other_order = raw * torch.tensor(scale, dtype=torch.float32) * q_scale * k_scale.T
    assert not torch.equal(got, other_order), "dequant order unobservable on this data; change the seed"


def test_fp8_tracks_the_unquantized_product():
    q, k = draw((8, 32), torch.float32, 5), draw((12, 32), torch.float32, 6)
    q8, q_scale = quantize_per_token(q)
    k8, k_scale = quantize_per_token(k)
    got = qk_matmul_scale(q8, k8, q_scale=q_scale, k_scale=k_scale)
    reference = (q.double() @ k.double().T) / math.sqrt(32)
    # Each operand is within 2^-4 relative per element: the dot product within 2^-3 * sum |q||k|.
    bound = (q.double().abs() @ k.double().abs().T) / math.sqrt(32) * 2.0 ** -3
    cmp.assert_close(got.double(), reference, rtol=0.0, atol=bound, identifier="FP8 AT-12 vs float64 of the inputs")


def test_fp8_tail_tile_shapes():
    for q_tile, k_tile in ((1, 1), (3, 129), (17, 5)):
        q8, q_scale, k8, k_scale = fp8_operands(q_tile, k_tile, 16, seed=q_tile)
        out = qk_matmul_scale(q8, k8, q_scale=q_scale, k_scale=k_scale)
        assert out.shape == (q_tile, k_tile) and torch.isfinite(out).all()


def test_fp8_codec_argument():
    q8 = SPEC_CODEC.to_fp8(torch.tensor([[448.0, 1.0]]))
    k8 = SPEC_CODEC.to_fp8(torch.tensor([[1.0, 2.0]]))
    ones = torch.ones(1, 1)
    assert qk_matmul_scale(q8, k8, q_scale=ones, k_scale=ones, scale=1.0).item() == 450.0
    calc = qk_matmul_scale(q8, k8, q_scale=ones, k_scale=ones, scale=1.0, codec="pypto-0.2.0-calculator")
    assert calc.item() == 242.0  # 448 reads as 240 there


def test_inputs_not_modified():
    q8, q_scale, k8, k_scale = fp8_operands()
    tensors = {"q": q8, "q_scale": q_scale, "k": k8, "k_scale": k_scale}
    before = gh.clone_tensors(tensors)
    qk_matmul_scale(q8, k8, q_scale=q_scale, k_scale=k_scale)
    gh.assert_unchanged(tensors, before, "qk_matmul_scale")


@pytest.mark.parametrize("length", [1, 13, 32])
def test_agrees_with_the_mm1_stage_of_attention(length):
    """AT-12 is the C1 stage of attention: its FP8 scores, put through the rest of SPEC §2.3 for a
    single tile (local softmax, P quantization and MM2, O / l), give the attention golden's output."""
    config = PagedAttentionConfig(batch=1, s1=1, s2=32, nq=4, nkv=2, head_dim=16, block_size=8, s2_tile=32,
                                  kv_act_seqs=(length,), garbage="nan")
    bundle = make_inputs(config, seed=length)
    out = paged_attention_fp8(**bundle.kwargs())
    page = dict(block_table=bundle.block_table, kv_act_seqs=bundle.kv_act_seqs, seq_len=32)
    k8 = paged_to_contiguous(bundle.k_cache, **page)[0, :length]  # [length, NKV, D]
    k_scale = paged_to_contiguous(bundle.k_scale, **page)[0, :length]
    v = SPEC_CODEC.from_fp8(paged_to_contiguous(bundle.v_cache, **page)[0, :length])
    for n in range(2):
        heads = slice(2 * n, 2 * n + 2)
        scores = qk_matmul_scale(bundle.q[0, heads].contiguous(), k8[:, n].contiguous(),
                                 q_scale=bundle.q_scale[0, heads].contiguous(), k_scale=k_scale[:, n].contiguous(),
                                 scale=16 ** -0.5)
        _m_j, p, l_j = local_softmax(scores)
        o = tile_values(p, v[:, n], bundle.v_scale[0, n][None, :], SPEC_CODEC)
        gh.assert_identical((o / l_j).bfloat16(), out[0, heads], f"kv head {n}: AT-12 + softmax vs attention")
