"""golden/inputs.py, SPEC §5 recipe: make_inputs is deterministic per (config, seed), seeds differ,
the config round-trips through to_dict / from_dict, defaults follow §5, every distribution builds,
and the garbage fill lands only in cells the kernel never reads. Bad arguments:
tests/golden/test_validate.py."""
from __future__ import annotations

import json

import golden_helpers as gh
import pytest
import torch

import pfa_verify.golden.inputs as gi
from pfa_verify import golden
from pfa_verify.golden import SPEC_CODEC, InputBundle, PagedAttentionConfig, make_inputs, paged_to_contiguous
from pfa_verify.golden.inputs import DISTRIBUTIONS, GARBAGE

C = PagedAttentionConfig
RAGGED = C(batch=3, s1=2, s2=19, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=8,
           kv_act_seqs=(19, 0, 6), max_blocks=7, num_blocks=20, garbage="nan")


def test_same_config_and_seed_give_the_same_bundle():
    a, b = make_inputs(RAGGED, 3), make_inputs(RAGGED, 3)
    assert isinstance(a, InputBundle) and a.config == RAGGED and a.seed == 3
    for name in InputBundle.TENSORS:
        gh.assert_identical(getattr(a, name), getattr(b, name), name)


def test_different_seeds_differ():
    a, b = make_inputs(RAGGED, 3), make_inputs(RAGGED, 4)
    for name in ("q", "k_cache", "v_cache", "q_scale", "block_table"):
        assert not torch.equal(gh.bits(getattr(a, name)), gh.bits(getattr(b, name))), f"{name} same for seeds 3 and 4"


def test_bundle_shapes_and_dtypes_follow_spec_section_1():
    bundle = make_inputs(RAGGED, 0)
    fp8, f32 = torch.float8_e4m3fn, torch.float32
    expected = {
        "q": ((6, 4, 8), fp8), "q_scale": ((6, 4, 1), f32),
        "k_cache": ((20, 4, 2, 8), fp8), "k_scale": ((20, 4, 2, 1), f32),
        "v_cache": ((20, 4, 2, 8), fp8), "v_scale": ((3, 2, 8), f32),
        "block_table": ((3, 7), torch.int32), "kv_act_seqs": ((3,), torch.int32),
    }
    for name, (shape, dtype) in expected.items():
        t = getattr(bundle, name)
        assert (tuple(t.shape), t.dtype, t.is_contiguous()) == (shape, dtype, True), name
    assert bundle.kv_act_seqs.tolist() == [19, 0, 6]


def test_defaults_follow_spec_section_5():
    config = C(batch=2, s1=1, s2=300, nq=4, nkv=1)
    assert (config.head_dim, config.block_size, config.s2_tile, config.g_tile) == (128, 128, 128, None)
    assert config.lengths == (300, 300)
    assert config.table_columns == 3 and config.physical_blocks == 6  # MAXB = ceil(S2 / BS), NB = B * MAXB


@pytest.mark.parametrize("config", [RAGGED, C(batch=1, s1=1, s2=5, nq=1, nkv=1, head_dim=4, block_size=1, s2_tile=2,
                                               softmax_scale=0.25, distribution="wide", g_tile=1)],
                         ids=["ragged", "scalars"])
def test_to_dict_from_dict_round_trip(config):
    data = config.to_dict()
    assert json.loads(json.dumps(data)) == data  # JSON-ready
    assert C.from_dict(data) == config
    assert C.from_dict(json.loads(json.dumps(data))) == config
    assert make_inputs(C.from_dict(data), 1).q.view(torch.uint8).equal(make_inputs(config, 1).q.view(torch.uint8))


def test_kv_act_seqs_list_becomes_a_tuple():
    config = C(batch=2, s1=1, s2=8, nq=2, nkv=1, head_dim=4, block_size=4, s2_tile=4, kv_act_seqs=[3, 8])
    assert config.kv_act_seqs == (3, 8) and hash(config) == hash(config.replace())


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_every_distribution_builds_finite_inputs(distribution):
    bundle = make_inputs(RAGGED.replace(distribution=distribution, garbage=None), 5)
    for name in ("q", "k_cache", "v_cache"):
        assert torch.isfinite(SPEC_CODEC.from_fp8(getattr(bundle, name))).all(), name
    for name in ("q_scale", "k_scale", "v_scale"):
        t = getattr(bundle, name)
        assert torch.isfinite(t).all() and (t >= 0).all(), name


def read_cells(bundle) -> torch.Tensor:
    """bool [NB, BS]: the cache cells some token lives in."""
    bs = bundle.k_cache.shape[1]
    read = torch.zeros(bundle.k_cache.shape[:2], dtype=torch.bool)
    for b, n in enumerate(bundle.kv_act_seqs.tolist()):
        for t in range(n):
            read[int(bundle.block_table[b, t // bs]), t % bs] = True
    return read


@pytest.mark.parametrize("garbage", ["nan", "huge", "plausible"])
def test_garbage_lands_only_in_unread_cells(garbage):
    clean, dirty = make_inputs(RAGGED.replace(garbage=None), 7), make_inputs(RAGGED.replace(garbage=garbage), 7)
    read = read_cells(dirty)
    assert (~read).any() and read.any()
    for name in ("k_cache", "v_cache", "k_scale"):
        gh.assert_identical(getattr(dirty, name)[read], getattr(clean, name)[read], f"{name} in read cells")
        assert not torch.equal(gh.bits(getattr(dirty, name)[~read]), gh.bits(getattr(clean, name)[~read]))
    for name in ("q", "q_scale", "v_scale", "block_table", "kv_act_seqs"):
        gh.assert_identical(getattr(dirty, name), getattr(clean, name), name)
    if garbage == "nan":
        assert (dirty.k_cache.view(torch.uint8)[~read] == 0x7F).all()
        assert (dirty.v_cache.view(torch.uint8)[~read] == 0x7F).all()
        assert torch.isnan(dirty.k_scale[~read]).all()
    else:
        code_value, scale = GARBAGE[garbage]          # the one table of fills (golden/inputs.py)
        assert (SPEC_CODEC.from_fp8(dirty.k_cache)[~read] == code_value).all()
        assert (dirty.k_scale[~read] == torch.tensor(scale)).all()


def test_quantized_inputs_put_each_max_on_448():
    """Q, K per token and V per channel over valid tokens (SPEC §3): each row's max reads back as 448."""
    bundle = make_inputs(RAGGED.replace(garbage=None), 9)
    assert SPEC_CODEC.from_fp8(bundle.q).abs().amax(dim=-1).eq(448).all()
    page = dict(block_table=bundle.block_table, kv_act_seqs=bundle.kv_act_seqs, seq_len=19)
    k = SPEC_CODEC.from_fp8(paged_to_contiguous(bundle.k_cache, **page))
    v = SPEC_CODEC.from_fp8(paged_to_contiguous(bundle.v_cache, **page))
    for b, n in enumerate(bundle.kv_act_seqs.tolist()):
        if n:
            assert k[b, :n].abs().amax(dim=-1).eq(448).all(), f"K rows of batch {b}"
            assert v[b, :n].abs().amax(dim=0).eq(448).all(), f"V channels of batch {b}"
    assert (bundle.v_scale[1] == 1.0).all()  # batch 1 has no token: unit scale, never read


def test_clone_is_deep():
    bundle = make_inputs(RAGGED, 1)
    copy = bundle.clone()
    copy.q_scale.fill_(0)
    assert (bundle.q_scale != 0).all()
    assert set(bundle.kwargs()) == set(InputBundle.TENSORS) | {"softmax_scale", "s2_tile", "g_tile"}


@pytest.mark.parametrize("distribution", ["sinks", "outlier_channels"])
def test_large_logit_distributions_reach_past_exp_range(distribution):
    """Rows with a few very large logits (attention sinks, outlier channels): some |S| is well past 88,
    where exp over- or underflows unless the row max is subtracted (SPEC §2.3)."""
    config = C(batch=2, s1=1, s2=64, nq=4, nkv=2, head_dim=64, block_size=16, s2_tile=32, distribution=distribution)
    b = make_inputs(config, 3)
    q = SPEC_CODEC.from_fp8(b.q) * b.q_scale                                  # [B*S1, NQ, D]
    k = SPEC_CODEC.from_fp8(b.k_cache) * b.k_scale                            # [NB, BS, NKV, D]
    table = b.block_table[0, 0]
    scores = (q[0, 0] @ k[table, :, 0].T) * 64 ** -0.5
    assert float(scores.max()) > 88, float(scores.max())
    assert torch.isfinite(golden.paged_attention_fp8(**b.kwargs()).float()).all()


def test_an_explicit_block_table_moves_tokens_and_changes_no_value():
    """A config's block_table (how a property test's drawn table reaches the inputs) replaces the table
    make_inputs would shuffle from the seed; every value drawn is the same, each token sits where the new
    table says, and garbage fills every cell it leaves unread."""
    seeded = make_inputs(RAGGED, 5)
    # RAGGED: lengths (19, 0, 6), BS 4 -> 5, 0 and 2 valid blocks; 7 columns, 20 physical blocks.
    rows = ((19, 18, 0, 1, 2, -1, -1), (-1,) * 7, (3, 17, 4, -1, 5, 6, 7))   # past-length entries may be anything
    explicit = make_inputs(RAGGED.replace(block_table=rows), 5)
    assert explicit.block_table.tolist() == [list(r) for r in rows] and explicit.block_table.dtype == torch.int32
    assert not torch.equal(explicit.block_table, seeded.block_table)
    for name in ("q", "q_scale", "v_scale", "kv_act_seqs"):
        gh.assert_identical(getattr(explicit, name), getattr(seeded, name), name)
    for name in ("k_cache", "v_cache", "k_scale"):
        page = dict(kv_act_seqs=seeded.kv_act_seqs, seq_len=19)
        gh.assert_identical(paged_to_contiguous(getattr(explicit, name), explicit.block_table, **page),
                            paged_to_contiguous(getattr(seeded, name), seeded.block_table, **page), f"{name}, contiguous")
    unread = ~read_cells(explicit)
    assert torch.isnan(explicit.k_scale[unread]).all() and (explicit.k_cache.view(torch.uint8)[unread] == 0x7F).all()


def test_a_config_with_a_block_table_round_trips_and_one_without_keeps_its_dict():
    config = RAGGED.replace(block_table=[[19, 18, 0, 1, 2, -1, -1], [-1] * 7, [3, 17, -1, -1, -1, -1, -1]])
    assert isinstance(config.block_table, tuple) and all(isinstance(r, tuple) for r in config.block_table)
    data = json.loads(json.dumps(config.to_dict()))
    assert data["block_table"][0] == [19, 18, 0, 1, 2, -1, -1] and C.from_dict(data) == config
    assert "block_table" not in RAGGED.to_dict()     # fingerprints and regression ids of other configs unchanged
    assert hash(config) != hash(RAGGED)


@pytest.mark.parametrize("distribution", golden.DISTRIBUTIONS)
def test_drawn_values_counts_what_make_inputs_draws(distribution, monkeypatch):
    """pfa_verify.golden.inputs.drawn_values, the yardstick of make_inputs' speed (pfa-verify bench --stages), is the
    number of random values its draws of Q, K and V take from the generator."""
    drawn = []
    for name in ("rand", "randn", "randint"):
        real = getattr(torch, name)
        monkeypatch.setattr(gi.torch, name, lambda *a, _real=real, **kw: drawn.append(_real(*a, **kw)) or drawn[-1])
    config = golden.PagedAttentionConfig(batch=2, s1=2, s2=40, nq=4, nkv=2, head_dim=16, block_size=16,
                                         s2_tile=16, distribution=distribution)
    monkeypatch.setattr(gi, "gen_block_table", lambda *a, **kw: torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32))
    golden.make_inputs(config, 0)
    assert sum(x.numel() for x in drawn) == gi.drawn_values(config)
