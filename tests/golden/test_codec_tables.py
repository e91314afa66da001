"""golden/codec.py's lookup tables (issue 17) against the float-arithmetic encoder they replaced
(tests/golden/codec_reference.py: 5a86cd3's element-wise evaluation of golden/e4m3.py's grid
arithmetic), both codecs, bit for bit: codes of
``encode`` and the float32 bits of ``round`` on a dense sample of float32 bit patterns (every top
16 bits with low halves that include 0, 1 and the ends; every rounding midpoint and integer-plus-a-
half, one and two ulps around; NaN payloads of both signs, infinities, float32 subnormals, signed
zero), every float16 and bfloat16 pattern, and float64 input; ``decode_array``'s pair table against
the one-code table. The whole 2^32 patterns run under ``slow``. (SPEC §3's own rules are held by
tests/golden/test_codec.py with ml_dtypes, torch and a bit-field formula as oracles.)"""
from __future__ import annotations

import math

import codec_reference as ref
import golden_helpers as gh
import numpy as np
import pytest
import torch

from pfa_verify.golden import PYPTO_CALCULATOR_CODEC, SPEC_CODEC

CODECS = [SPEC_CODEC, PYPTO_CALCULATOR_CODEC]
ids = lambda c: c.name  # noqa: E731


def _patterns(values: np.ndarray) -> torch.Tensor:
    """float32 tensor of uint32 bit patterns."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.uint32).view(np.float32))


def _ulps_around(x: np.ndarray, reach: int = 2) -> np.ndarray:
    """uint32 patterns of ``x`` (float32 >= 0) and of the values ``reach`` ulps either side, both signs."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
    near = (bits[:, None] + np.arange(-reach, reach + 1)).reshape(-1)
    near = near[(near >= 0) & (near < 0x7F800000)]
    return np.concatenate([near, near | 0x80000000]).astype(np.uint32)


def dense_patterns() -> torch.Tensor:
    """float32 [about 1.6 M]: the dense sample of the module docstring."""
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF], dtype=np.uint32)
    rng = np.random.default_rng(17)
    every_top = np.concatenate([(top[:, None] | lows).reshape(-1),
                                top | rng.integers(1, 1 << 16, top.size, dtype=np.uint32),
                                top | rng.integers(1, 1 << 16, top.size, dtype=np.uint32)])
    grid = np.unique(np.abs(SPEC_CODEC.decode_table.double().numpy()[np.isfinite(SPEC_CODEC.decode_table.numpy())]))
    grid = np.concatenate([grid, [480.0, 512.0]])
    midpoints = (grid[:-1] + grid[1:]) / 2          # exact in float32 (5 significant bits)
    half_integers = np.arange(0, 1024) + 0.5        # the calculator rounds to an integer first
    special = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
                        0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FA00000,
                        0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F801234], dtype=np.uint32)
    return _patterns(np.concatenate([every_top, _ulps_around(midpoints), _ulps_around(grid),
                                     _ulps_around(half_integers), _ulps_around(np.arange(0, 1025.0)), special]))


DENSE = dense_patterns()


def assert_same_as_reference(codec, x: torch.Tensor, what: str) -> None:
    __tracebackhide__ = True
    gh.assert_identical(codec.encode(x), ref.encode(codec.name, x), f"{codec.name} encode vs reference on {what}")
    gh.assert_identical(codec.round(x), ref.round_value(codec.name, x, codec.decode_table),
                        f"{codec.name} round vs reference on {what}")


def test_dense_sample_reaches_what_it_claims():
    bits = DENSE.view(torch.int32).numpy().view(np.uint32)
    assert np.unique(bits >> 16).size == 1 << 16
    x = DENSE.numpy()
    assert np.isnan(x).sum() > 1000 and np.isinf(x).sum() >= 2 and ((bits & 0x7F800000) == 0).sum() > 1000
    for value in (464.0, 232.0, 239.5, 2.0 ** -10, 15 * 2.0 ** -10):
        assert value in x and -value in x
    assert (bits == 0x80000000).any()


@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_tables_match_reference_on_dense_patterns(codec):
    assert_same_as_reference(codec, DENSE, "the dense float32 sample")


@pytest.mark.parametrize("codec", CODECS, ids=ids)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).replace("torch.", ""))
def test_tables_match_reference_on_every_half_precision_pattern(codec, dtype):
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    assert_same_as_reference(codec, x, f"every {dtype} pattern")


@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_tables_match_reference_on_float64_input(codec):
    # Converted to float32 first: values just off a midpoint in float64 land on it in float32.
    generator = torch.Generator().manual_seed(3)
    x = (torch.rand(200_000, generator=generator, dtype=torch.float64) * 2 - 1) * 2.0 ** torch.randint(
        -14, 10, (200_000,), generator=generator).double()
    mids = DENSE.double()
    x = torch.cat([x, mids + 2.0 ** -40, mids - 2.0 ** -40, torch.tensor([math.nan, -math.nan, math.inf, -math.inf, 1e300])])
    assert_same_as_reference(codec, x, "float64 input")


@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_encode_keeps_shape_and_reads_strided_input(codec):
    x = DENSE[: 64 * 1024].view(256, 256).t()  # not contiguous
    gh.assert_identical(codec.encode(x), ref.encode(codec.name, x.contiguous()), "encode of a transposed view")
    assert codec.encode(x).shape == (256, 256) and codec.round(x).shape == (256, 256)
    assert codec.encode(torch.tensor(1.0)).shape == () and codec.encode(torch.empty(0, 3)).shape == (0, 3)


# ---------------------------------------------------------------- decode_array's pair table


@pytest.mark.parametrize("codec", CODECS, ids=ids)
@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
def test_decode_pairs_match_one_code_table_on_every_pair(codec, double):
    codes = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)  # every (code, code) pair, in both orders
    table = codec.decode_table.double().numpy() if double else codec.decode_table.numpy()
    got = codec.decode_array(codes, double)
    want = np.take(table, codes)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))  # NaN payloads and signs included


@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_decode_array_any_layout_and_out(codec):
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, (64, 3, 129), dtype=np.uint8)  # 24768 codes: even, contiguous
    table = codec.decode_table.double().numpy()
    for c in (codes, codes[:, :, :128], codes.transpose(2, 0, 1), codes[:1, :1, :5], codes[:0]):
        for double in (False, True):
            want = np.take(table if double else table.astype(np.float32), c)
            out = np.full(c.shape, 7.0, want.dtype)
            got = codec.decode_array(c, double, out=out)
            assert got is out and np.array_equal(got.view(np.uint8), want.view(np.uint8))
            assert np.array_equal(codec.decode_array(c, double).view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------- every pattern


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_tables_match_reference_on_every_float32_pattern(codec):
    """All 2^32 float32 patterns, in 2^22-pattern slices. Slow: the reference encodes about 20 M
    elements/s on an idle core (1024 slices, encode and round, for each codec)."""
    step = 1 << 22
    for start in range(0, 1 << 32, step):
        assert_same_as_reference(codec, _patterns(np.arange(start, start + step, dtype=np.uint64)), f"patterns from {start:#x}")


@pytest.mark.parametrize("codec", CODECS, ids=ids)
def test_round_gives_the_same_bits_in_one_chunk_and_in_many(codec):
    """round returns its one lookup for inputs of one chunk (_ENCODE_CHUNK elements) and fills an output
    chunk by chunk above: the dense sample whole (many chunks) and in pieces of 1000 (one each) read back
    the same bits, NaN payloads and signed zeros included."""
    assert DENSE.numel() > 1 << 16
    joined = torch.cat([codec.round(piece) for piece in DENSE.split(1000)])
    gh.assert_identical(codec.round(DENSE), joined, f"{codec.name} round whole vs in pieces")
