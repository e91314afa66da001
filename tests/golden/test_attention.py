"""golden/attention.py and golden/attention_loop.py, SPEC §2: hand-worked examples, the vectorized
golden against the loop (bit-identical over a spread of configs), causal S1 > 1, rows with
cur == 0, garbage never reaching the output, GQA, block permutation, g_tile, inputs never
modified, and the codec argument."""
from __future__ import annotations

import math

import golden_helpers as gh
import pytest
import torch

import pfa_verify.golden.attention as golden_attention
from pfa_verify.golden import (
    PYPTO_CALCULATOR_CODEC,
    PagedAttentionConfig,
    checked_call,
    make_inputs,
    paged_attention_envelope,
    paged_attention_fp8,
    paged_attention_fp8_loop,
)
from pfa_verify.golden.attention import read_cells, visible_lengths

C = PagedAttentionConfig
GOLDENS = [paged_attention_fp8, paged_attention_fp8_loop]
GOLDEN_IDS = ["vectorized", "loop"]


def bf16(x: float) -> float:
    return torch.tensor(x, dtype=torch.float64).bfloat16().item()


# ---------------------------------------------------------------- hand-worked


def two_token_case(block_size: int) -> gh.HandCase:
    """B = 1, S1 = 1, NQ = NKV = 1, D = 2: q = (1, 1); k0 = (1, 0), k1 = (0, 0); v0 = (1, 0),
    v1 = (0, 1); every scale 1. With softmax_scale 1 the scores are S = (1, 0)."""
    blocks = 2 // block_size
    return gh.hand_case(
        q=[[[1.0, 1.0]]], q_scale=[[[1.0]]],
        k=[[[[1.0, 0.0]], [[0.0, 0.0]]]], k_scale=[[[[1.0]], [[1.0]]]],
        v=[[[[1.0, 0.0]], [[0.0, 1.0]]]], v_scale=[[[1.0, 1.0]]],
        block_table=[list(range(blocks))], kv_act_seqs=[2], block_size=block_size,
    )


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_hand_worked_one_tile(golden):
    """One tile of 2 tokens. m = 1, P = (1, e^-1), l = 1 + e^-1 = 1.3679 (from the unquantized P).
    P quant: scale 448 / 1, P * 448 = (448, 164.81) -> E4M3 (448, 160) (spacing 16 in [128, 256)).
    MM2: O = (448 v0 + 160 v1) / 448 = (1, 0.35714). Output O / l = (0.73106, 0.26110)
    -> bf16 (187 * 2^-8, 134 * 2^-9) = (0.73046875, 0.26171875) (8 significant bits)."""
    out = golden(*two_token_case(block_size=2).args(), softmax_scale=1.0, s2_tile=2)
    e = math.exp(-1.0)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 1, 2)
    assert [bf16(1 / (1 + e)), bf16(160 / 448 / (1 + e))] == [0.73046875, 0.26171875]
    assert out.flatten().tolist() == [0.73046875, 0.26171875]


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_hand_worked_two_tiles(golden):
    """The same tokens in two tiles of 1 (BS = 1). Tile 0: m0 = 1, l0 = 1, P8 = 448, O0 = v0.
    Tile 1: m1 = 0, l1 = 1, O1 = v1. Update: m' = 1, a = 1, c = e^-1, l = 1 + e^-1,
    O = v0 + e^-1 v1. Output (0.73106, 0.26894) -> bf16 (0.73046875, 138 * 2^-9 = 0.26953125): P is
    quantized per tile, so s2_tile changes the second component (0.26171875 in one tile)."""
    out = golden(*two_token_case(block_size=1).args(), softmax_scale=1.0, s2_tile=1)
    e = math.exp(-1.0)
    assert [bf16(1 / (1 + e)), bf16(e / (1 + e))] == [0.73046875, 0.26953125]
    assert out.flatten().tolist() == [0.73046875, 0.26953125]


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_hand_worked_scales(golden):
    """Scales enter as SPEC §2.3 says: S = raw * q_scale * k_scale * softmax_scale and
    O = (P8 @ v8) * p_scale * v_scale. Two tokens with equal scores give P = (1, 1), P8 = (448, 448),
    so the output is (v0 + v1) / 2 * v_scale: ((1 + 3) / 2 * 0.5, (2 - 2) / 2 * 4) = (1, 0)."""
    case = gh.hand_case(
        q=[[[2.0, 0.0]]], q_scale=[[[0.25]]],
        k=[[[[1.0, 5.0]], [[4.0, -3.0]]]], k_scale=[[[[2.0]], [[0.5]]]],  # raw (2, 8) -> (1, 1)
        v=[[[[1.0, 2.0]], [[3.0, -2.0]]]], v_scale=[[[0.5, 4.0]]],
        block_table=[[1, 0]], kv_act_seqs=[2], block_size=1,
    )
    out = golden(*case.args(), softmax_scale=0.75, s2_tile=2)
    assert out.flatten().tolist() == [1.0, 0.0]


def test_softmax_scale_default_is_inverse_sqrt_d():
    case = two_token_case(block_size=2)
    gh.assert_identical(paged_attention_fp8(*case.args(), s2_tile=2),
                        paged_attention_fp8(*case.args(), s2_tile=2, softmax_scale=2 ** -0.5), "softmax_scale=None")


# ---------------------------------------------------------------- vectorized vs loop


CONFIGS = {
    "ragged_causal_nan": C(batch=3, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=8, s2_tile=16,
                           kv_act_seqs=(0, 17, 40), garbage="nan"),
    "mqa_long": C(batch=2, s1=1, s2=300, nq=8, nkv=1, head_dim=32, block_size=16, s2_tile=64),
    "spare_blocks_outliers": C(batch=4, s1=3, s2=33, nq=6, nkv=3, head_dim=8, block_size=4, s2_tile=8,
                               kv_act_seqs=(1, 2, 4, 33), max_blocks=12, num_blocks=40, garbage="nan",
                               distribution="outliers"),
    "bs_plus_one_wide": C(batch=1, s1=4, s2=130, nq=2, nkv=1, head_dim=16, block_size=128, s2_tile=128,
                          kv_act_seqs=(129,), distribution="wide"),
    "g_tile_2": C(batch=2, s1=1, s2=64, nq=8, nkv=2, head_dim=16, block_size=16, s2_tile=32, g_tile=2,
                  kv_act_seqs=(16, 17)),
    "big_tile_huge_garbage": C(batch=2, s1=2, s2=100, nq=4, nkv=4, head_dim=16, block_size=4, s2_tile=64,
                               kv_act_seqs=(3, 100), distribution="normal", garbage="huge", softmax_scale=0.3),
    "all_empty": C(batch=2, s1=1, s2=10, nq=2, nkv=1, head_dim=8, block_size=2, s2_tile=4,
                   kv_act_seqs=(0, 0), garbage="nan"),
    "block_size_1_tiny": C(batch=2, s1=2, s2=9, nq=3, nkv=1, head_dim=4, block_size=1, s2_tile=3,
                           kv_act_seqs=(9, 1), distribution="tiny", garbage="nan"),
    "table_narrower_than_tile": C(batch=2, s1=1, s2=6, nq=2, nkv=1, head_dim=8, block_size=4, s2_tile=16,
                                  kv_act_seqs=(6, 5), garbage="nan"),
    "constant_rows": C(batch=2, s1=2, s2=20, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=12,
                       kv_act_seqs=(20, 11), distribution="constant_rows"),
}


@pytest.mark.parametrize("codec", [None, PYPTO_CALCULATOR_CODEC], ids=["spec_codec", "calculator_codec"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_vectorized_matches_loop(name, codec):
    bundle = make_inputs(CONFIGS[name], seed=11)
    fast = paged_attention_fp8(**bundle.kwargs(), codec=codec)
    loop = paged_attention_fp8_loop(**bundle.kwargs(), codec=codec)
    assert fast.dtype == torch.bfloat16 and fast.shape == bundle.q.shape
    gh.assert_identical(fast, loop, f"vectorized vs loop golden [{name}]")
    assert torch.isfinite(fast.float()).all()


@pytest.mark.parametrize("constant", ["STATE_ELEMENTS", "CHUNK_ELEMENTS"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_pair_a_chunk_and_one_tile_a_window_match_the_loop(name, constant, monkeypatch):
    """The vectorized golden evaluates (batch, tile) pairs a chunk at a time and folds a long context's
    tile states a window at a time (golden.attention.chunk_sizes); at one pair a chunk, or one tile a
    window, it gives the loop golden's bits."""
    monkeypatch.setattr(golden_attention, constant, 1)
    assert golden_attention.chunk_sizes(batch=1, nkv=1, rows=1, head_dim=8, block_size=4, s2_tile=8, tiles=5) == (
        (1, 5) if constant == "CHUNK_ELEMENTS" else (golden_attention.CHUNK_ELEMENTS // 64, 1))   # a pair's K: 8 x 8
    bundle = make_inputs(CONFIGS[name], seed=11)
    gh.assert_identical(paged_attention_fp8(**bundle.kwargs()), paged_attention_fp8_loop(**bundle.kwargs()),
                        f"vectorized at {constant} = 1 vs loop golden [{name}]")


def test_a_chunk_holds_at_most_its_elements_of_k_scores_and_mm2_products():
    """chunk_sizes: 32 query rows of 64 heads on one KV head make a pair's scores 16x its K; the chunk
    holds CHUNK_ELEMENTS of the scores, not of K (sized by K alone, it held 0.94 GiB at S2 = 8192)."""
    rows, tile, d = 32 * 64, 128, 128
    pairs, _ = golden_attention.chunk_sizes(batch=1, nkv=1, rows=rows, head_dim=d, block_size=64, s2_tile=tile, tiles=64)
    assert pairs == 2                                                         # K alone would allow 64
    assert pairs * rows * tile <= golden_attention.CHUNK_ELEMENTS
    assert pairs * (tile // 64) * rows * d <= golden_attention.CHUNK_ELEMENTS     # MM2's products per block


# ---------------------------------------------------------------- SPEC §2.1, §2.5


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_causal_s1_equals_shortened_calls(golden):
    """Query position i of S1 sees kv_act_seqs - (S1 - 1 - i) tokens: the same as an S1 = 1 call
    whose kv_act_seqs is shortened by that much."""
    config = C(batch=3, s1=3, s2=21, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=8,
               kv_act_seqs=(21, 9, 1), garbage="nan")
    bundle = make_inputs(config, seed=4)
    out = golden(**bundle.kwargs()).view(3, 3, 4, 8)
    q = bundle.q.view(3, 3, 4, 8)
    q_scale = bundle.q_scale.view(3, 3, 4, 1)
    for i in range(3):
        shorter = torch.clamp(bundle.kv_act_seqs - (3 - 1 - i), min=0).to(torch.int32)
        one = golden(**{**bundle.kwargs(), "q": q[:, i].contiguous(), "q_scale": q_scale[:, i].contiguous(),
                        "kv_act_seqs": shorter})
        gh.assert_identical(out[:, i], one, f"query position {i} vs S1 = 1 with kv_act_seqs {shorter.tolist()}")


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_nan_in_v_past_an_earlier_position_reaches_only_the_rows_that_see_it(golden):
    """A NaN V code at the last valid token of a batch is visible to the last query position only:
    earlier positions of S1 > 1 (shorter causal lengths) stay finite. The vectorized golden shares
    one V block between the positions, where P8 = 0 times NaN would leak (a bug it once had)."""
    config = C(batch=2, s1=3, s2=40, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
               kv_act_seqs=(40, 23), garbage="nan")
    bundle = make_inputs(config, seed=5)
    v_cache = bundle.v_cache.clone()
    for b, length in enumerate((40, 23)):
        last = length - 1
        v_cache.view(torch.uint8)[bundle.block_table[b, last // 16], last % 16, 1, 3] = 0x7F  # kv head 1, channel 3
    out = golden(**{**bundle.kwargs(), "v_cache": v_cache}).float().view(2, 3, 4, 16)
    nan = torch.isnan(out)
    assert nan[:, 2, 2:, 3].all(), "the last position's heads of kv head 1 see the NaN in channel 3"
    assert nan.sum() == 2 * 2, "and nothing else does"
    clean = golden(**bundle.kwargs()).float().view(2, 3, 4, 16)
    gh.assert_identical(out[:, :2], clean[:, :2], "earlier positions, NaN past their causal length")


def test_result_is_an_ordinary_tensor():
    """The vectorized golden runs in inference mode; its result must not be an inference tensor
    (those refuse in-place updates outside inference mode)."""
    bundle = make_inputs(CONFIGS["ragged_causal_nan"], seed=1)
    out = paged_attention_fp8(**bundle.kwargs())
    assert not out.is_inference()
    out.add_(1)


def test_repeated_calls_of_changing_shapes_agree_with_the_loop():
    """The vectorized golden reuses scratch buffers between calls: a small call after a large one
    (and the reverse) must not see the other's data."""
    names = ["mqa_long", "block_size_1_tiny", "big_tile_huge_garbage", "mqa_long", "ragged_causal_nan"]
    for name in names:
        bundle = make_inputs(CONFIGS[name], seed=3)
        gh.assert_identical(paged_attention_fp8(**bundle.kwargs()), paged_attention_fp8_loop(**bundle.kwargs()),
                            f"vectorized vs loop [{name}] in a sequence of calls")


def test_read_cells_by_hand():
    table = torch.tensor([[3, 5], [0, -1], [-1, -1]], dtype=torch.int32)
    slots, rows = read_cells(table, torch.tensor([20, 1, 0]), num_blocks=6, block_size=16, s1=2)
    want = torch.zeros(6, 16, dtype=torch.bool)
    want[3, :] = True          # batch 0: tokens 0-15 in block 3, 16-19 in block 5's first rows
    want[5, :4] = True
    want[0, 0] = True          # batch 1: its one token
    assert torch.equal(slots, want)
    assert rows.tolist() == [True, True, False, True, False, False]     # cur: 19, 20 | 0, 1 | 0, 0


def test_visible_lengths():
    assert visible_lengths(torch.tensor([5, 1, 0]), 3).tolist() == [[3, 4, 5], [0, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_cur_zero_rows_are_exactly_zero(golden):
    config = C(batch=4, s1=3, s2=12, nq=2, nkv=1, head_dim=8, block_size=4, s2_tile=4,
               kv_act_seqs=(0, 1, 2, 12), garbage="nan")
    bundle = make_inputs(config, seed=2)
    out = golden(**bundle.kwargs()).view(4, 3, 2, 8)
    cur = visible_lengths(bundle.kv_act_seqs, 3)
    for b in range(4):
        for i in range(3):
            row = gh.bits(out[b, i])
            if cur[b, i] == 0:
                assert (row == 0).all(), f"(b={b}, i={i}) has cur == 0 but is not +0.0"
            else:
                assert (row != 0).any(), f"(b={b}, i={i}) has cur={int(cur[b, i])} but is all zero"
    assert int((cur == 0).sum()) == 6


# ---------------------------------------------------------------- garbage (SPEC §2.2)


GARBAGE_CONFIG = C(batch=3, s1=2, s2=27, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=8,
                   kv_act_seqs=(27, 5, 0), max_blocks=10, num_blocks=30)


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
@pytest.mark.parametrize("garbage", ["nan", "huge"])
def test_garbage_in_unread_cells_never_reaches_output(golden, garbage):
    """Spare blocks, the tail of each last block and the table's spare columns hold garbage."""
    clean = make_inputs(GARBAGE_CONFIG, seed=8)
    dirty = make_inputs(GARBAGE_CONFIG.replace(garbage=garbage), seed=8)
    expected = golden(**clean.kwargs())
    out = golden(**dirty.kwargs())
    gh.assert_identical(out, expected, f"garbage={garbage!r} vs no garbage")
    assert torch.isfinite(out.float()).all()


def poisoned_block_zero(bundle) -> dict[str, torch.Tensor]:
    """The bundle's arguments with a NaN block prepended as physical block 0 (every valid entry
    shifted by one), so the -1 entries, which the kernel clamps to block 0, point at NaN; NaN also
    in every unread cache cell, and in v_scale of the batches with no token."""
    def prepend(cache, nan_bits):
        block = torch.full_like(cache[:1].view(gh.bits(cache).dtype), nan_bits).view(cache.dtype)
        return torch.cat([block, cache])

    table = bundle.block_table
    lengths = bundle.kv_act_seqs
    v_scale = bundle.v_scale.clone()
    v_scale[lengths == 0] = math.nan
    return {
        **bundle.kwargs(),
        "k_cache": prepend(bundle.k_cache, 0x7F), "v_cache": prepend(bundle.v_cache, 0x7F),
        "k_scale": prepend(bundle.k_scale, 0x7FC00000), "v_scale": v_scale,
        "block_table": torch.where(table >= 0, table + 1, table).to(torch.int32),
    }


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_garbage_in_padded_table_columns_never_reaches_output(golden):
    bundle = make_inputs(GARBAGE_CONFIG.replace(garbage="nan"), seed=8)
    assert (bundle.block_table == -1).any()
    out = golden(**poisoned_block_zero(bundle))
    gh.assert_identical(out, golden(**bundle.kwargs()), "NaN block 0 behind every -1 entry")
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_garbage_in_queries_of_cur_zero_rows_never_reaches_output(golden):
    bundle = make_inputs(GARBAGE_CONFIG, seed=8)
    cur = visible_lengths(bundle.kv_act_seqs, 2).flatten()  # [B*S1]
    q, q_scale = bundle.q.clone(), bundle.q_scale.clone()
    q.view(torch.uint8)[cur == 0] = 0x7F
    q_scale[cur == 0] = math.nan
    out = golden(**{**bundle.kwargs(), "q": q, "q_scale": q_scale})
    gh.assert_identical(out, golden(**bundle.kwargs()), "NaN queries in rows with cur == 0")


# ---------------------------------------------------------------- laws


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_gqa_repeating_kv_heads_gives_the_same_result(golden):
    """Query head h reads kv head h // group: repeating every kv head group times (NKV = NQ) changes nothing."""
    config = C(batch=2, s1=2, s2=24, nq=6, nkv=2, head_dim=8, block_size=4, s2_tile=8, kv_act_seqs=(24, 9))
    bundle = make_inputs(config, seed=5)
    group = 3
    repeated = {
        **bundle.kwargs(),
        "k_cache": bundle.k_cache.view(torch.uint8).repeat_interleave(group, dim=2).view(torch.float8_e4m3fn),
        "v_cache": bundle.v_cache.view(torch.uint8).repeat_interleave(group, dim=2).view(torch.float8_e4m3fn),
        "k_scale": bundle.k_scale.repeat_interleave(group, dim=2),
        "v_scale": bundle.v_scale.repeat_interleave(group, dim=1),
    }
    gh.assert_identical(golden(**repeated), golden(**bundle.kwargs()), "NKV = NQ with repeated heads vs GQA")


@pytest.mark.parametrize("seed", range(3))
def test_block_permutation_invariance(seed):
    bundle = make_inputs(CONFIGS["spare_blocks_outliers"], seed=seed)
    nb = bundle.k_cache.shape[0]
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(100 + seed))

    def permute(cache):
        moved = torch.empty_like(gh.bits(cache))
        moved[perm] = gh.bits(cache)
        return moved.view(cache.dtype)

    table = bundle.block_table.long()
    permuted = {
        **bundle.kwargs(),
        "k_cache": permute(bundle.k_cache), "v_cache": permute(bundle.v_cache), "k_scale": permute(bundle.k_scale),
        "block_table": torch.where(table >= 0, perm[table.clamp(min=0)], -1).to(torch.int32),
    }
    gh.assert_identical(paged_attention_fp8(**permuted), paged_attention_fp8(**bundle.kwargs()), "permuted blocks")


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_g_tile_does_not_change_output(golden):
    config = C(batch=2, s1=2, s2=20, nq=8, nkv=2, head_dim=8, block_size=4, s2_tile=8, kv_act_seqs=(20, 7))
    bundle = make_inputs(config, seed=6)
    expected = golden(**bundle.kwargs())
    for g_tile in (1, 2, 4):
        gh.assert_identical(golden(**{**bundle.kwargs(), "g_tile": g_tile}), expected, f"g_tile={g_tile}")


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_inputs_never_modified(golden):
    bundle = make_inputs(CONFIGS["ragged_causal_nan"], seed=3)
    before = gh.clone_tensors(bundle.tensors())
    golden(**bundle.kwargs())
    golden(**bundle.kwargs(), codec=PYPTO_CALCULATOR_CODEC)
    gh.assert_unchanged(bundle.tensors(), before, golden.__name__)


# ---------------------------------------------------------------- codec


@pytest.mark.parametrize("golden", GOLDENS, ids=GOLDEN_IDS)
def test_codec_argument_hand_worked(golden):
    """One token, v = (448, 1), every scale 1. Spec codec: P8 = 448, O = (448, 1). Calculator codec:
    P * 448 = 448 saturates to 240 and v's 448 (code 0x7E, exponent field 15) reads as 240, so
    O = 240 * (240, 1) / 448 = (128.57, 0.5357) -> bf16 (129.0, 0.53515625)."""
    case = gh.hand_case(q=[[[1.0, 1.0]]], q_scale=[[[1.0]]], k=[[[[1.0, 1.0]]]], k_scale=[[[[1.0]]]],
                        v=[[[[448.0, 1.0]]]], v_scale=[[[1.0, 1.0]]], block_table=[[0]], kv_act_seqs=[1],
                        block_size=1)
    assert golden(*case.args(), s2_tile=1).flatten().tolist() == [448.0, 1.0]
    assert golden(*case.args(), s2_tile=1, codec="e4m3fn-sat").flatten().tolist() == [448.0, 1.0]
    calc = golden(*case.args(), s2_tile=1, codec=PYPTO_CALCULATOR_CODEC).flatten().tolist()
    assert calc == [bf16(240 * 240 / 448), bf16(240 / 448)] == [129.0, 0.53515625]


def test_codec_argument_shrinks_outputs():
    """The calculator reads P's row max (448) and every top-binade input as 240, so its outputs are
    smaller in magnitude on average than the spec codec's."""
    bundle = make_inputs(CONFIGS["mqa_long"], seed=1)
    spec = paged_attention_fp8(**bundle.kwargs()).float()
    calc = paged_attention_fp8(**bundle.kwargs(), codec="pypto-0.2.0-calculator").float()
    assert torch.isfinite(calc).all() and not torch.equal(spec, calc)
    assert calc.abs().mean() < spec.abs().mean()


def test_a_checked_call_gives_what_the_two_functions_give():
    """pfa_verify.golden.checked_call checks the arguments once and is then asked for several results (the one rule asks
    for the golden and the envelope of one case): one checked call, reused for both codecs and for the whole
    envelope and a row subset, gives what fresh calls give, and its golden is the plain loop golden's (an
    independent implementation) bit for bit."""
    kwargs = make_inputs(PagedAttentionConfig(batch=3, s1=2, s2=300, nq=4, nkv=2, head_dim=32, block_size=16,
                                                     s2_tile=32), 5).kwargs()
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    checked = checked_call(**tensors, **scalars)
    rows = torch.tensor([False, True, False, False, True, False])
    for codec in (None, PYPTO_CALCULATOR_CODEC):
        gh.assert_identical(checked.golden(codec), paged_attention_fp8_loop(**kwargs, codec=codec), "golden")
        for mask in (None, rows):
            mine, theirs = checked.envelope(codec, rows=mask), paged_attention_envelope(**kwargs, codec=codec, rows=mask)
            assert (mine.rows, mine.flippable, mine.p_elements) == (theirs.rows, theirs.flippable, theirs.p_elements)
            for name in ("golden", "lo", "hi"):
                gh.assert_identical(getattr(mine, name), getattr(theirs, name), name)


def test_a_checked_call_refuses_what_the_functions_refuse():
    kwargs = make_inputs(PagedAttentionConfig(batch=1, s1=1, s2=16, nq=1, nkv=1, head_dim=16,
                                                     block_size=16, s2_tile=16), 0).kwargs()
    with pytest.raises(ValueError, match="s2_tile"):
        checked_call(**dict(kwargs, s2_tile=24))
    negative = dict(kwargs, q_scale=-kwargs["q_scale"])
    checked = checked_call(**negative)            # the golden takes a negative scale; the envelope refuses it
    with pytest.raises(ValueError, match="q_scale"):
        checked.envelope()
