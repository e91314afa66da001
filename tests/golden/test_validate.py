"""golden/validate.py and every public boundary of golden/ (SPEC §1, issue item 4): one table of bad
arguments per entry point. Each must raise ValueError or TypeError whose message names the
argument; nothing else (IndexError, RuntimeError) may escape. Ids read as calls."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from pfa_verify import golden
from pfa_verify.golden import (
    SPEC_CODEC,
    PagedAttentionConfig,
    contiguous_to_paged,
    gen_block_table,
    get_codec,
    make_inputs,
    paged_to_contiguous,
    qk_matmul_scale,
    quantize_per_channel,
    quantize_per_token,
)
from pfa_verify.golden.validate import default_softmax_scale, group_size

BASE = PagedAttentionConfig(batch=2, s1=2, s2=8, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=4,
                            kv_act_seqs=(8, 3), max_blocks=3, num_blocks=6)
# block_table [2, 3], NB = 6, BS = 4: row 0 uses columns 0-1, row 1 column 0.


def expect(call: str, change, error: type[Exception], match: str):
    """One row of a table: ``change`` maps the base arguments to bad ones."""
    return pytest.param(change, error, match, id=call)


def with_(**changes):
    return lambda kw: {**kw, **changes}


def edit(name, fn):
    """Change one tensor argument through ``fn(clone)`` (which may edit in place or return a new one)."""
    def change(kw):
        t = kw[name].clone()
        out = fn(t)
        return {**kw, name: t if out is None else out}
    return change


def setitem(index, value):
    def fn(t):
        t[index] = value
    return fn


FP8 = torch.float8_e4m3fn

PAGED_ATTENTION_CASES = [
    expect("f(q=list)", lambda kw: {**kw, "q": kw["q"].tolist()}, TypeError, r"^q must be a torch.Tensor"),
    expect("f(q=float32)", edit("q", lambda t: t.float()), TypeError, r"^q must have dtype float8_e4m3fn, got float32"),
    expect("f(q=2-D)", edit("q", lambda t: t.view(4, 32)), ValueError, r"^q must be 3-D"),
    expect("f(q=non-contiguous)", edit("q", lambda t: t.view(torch.uint8).transpose(0, 1).contiguous().transpose(0, 1).view(FP8)),
           ValueError, r"^q must be contiguous"),
    expect("f(q=[0, NQ, D])", lambda kw: {**kw, "q": kw["q"][:0], "q_scale": kw["q_scale"][:0]}, ValueError,
           r"q's B\*S1 must be positive"),
    expect("f(q=D 0)", lambda kw: {**kw, "q": kw["q"][..., :0]}, ValueError, r"q's D must be positive"),
    expect("f(q=B*S1 not a multiple of B)", lambda kw: {**kw, "q": kw["q"][:3], "q_scale": kw["q_scale"][:3]},
           ValueError, r"q's first dim B\*S1=3 must be a multiple of B=2"),
    expect("f(q=NQ 3)", lambda kw: {**kw, "q": kw["q"][:, :3].contiguous(), "q_scale": kw["q_scale"][:, :3].contiguous()},
           ValueError, r"NQ=3 must be a multiple of NKV=2 \(q's heads, k_cache's heads\)"),
    expect("f(q_scale=bfloat16)", edit("q_scale", lambda t: t.bfloat16()), TypeError, r"^q_scale must have dtype float32"),
    expect("f(k_cache=meta device)", edit("k_cache", lambda t: t.to("meta")), ValueError,
           r"^k_cache is on meta; the golden runs on the CPU"),
    expect("f(kv_act_seqs=meta device)", edit("kv_act_seqs", lambda t: t.to("meta")), ValueError,
           r"^kv_act_seqs is on meta; the golden runs on the CPU"),
    expect("f(q_scale=[B*S1, NQ])", edit("q_scale", lambda t: t[..., 0].contiguous()), ValueError, r"^q_scale must be 3-D"),
    expect("f(q_scale=[B*S1, 1, 1])", edit("q_scale", lambda t: t[:, :1].contiguous()), ValueError, r"^q_scale must have shape"),
    expect("f(k_cache=uint8)", edit("k_cache", lambda t: t.view(torch.uint8)), TypeError, r"^k_cache must have dtype"),
    expect("f(k_cache=D 4)", lambda kw: {**kw, "k_cache": kw["k_cache"][..., :4].contiguous(), "v_cache": kw["v_cache"][..., :4].contiguous()},
           ValueError, r"k_cache's last dim D=4 must equal q's D=8"),
    expect("f(k_scale=[NB, BS, NKV])", edit("k_scale", lambda t: t[..., 0].contiguous()), ValueError, r"^k_scale must be 4-D"),
    expect("f(k_scale=BS 2)", edit("k_scale", lambda t: t[:, :2].contiguous()), ValueError, r"^k_scale must have shape"),
    expect("f(v_cache=float32)", edit("v_cache", lambda t: t.float()), TypeError, r"^v_cache must have dtype"),
    expect("f(v_cache=NB 5)", edit("v_cache", lambda t: t[:5].contiguous()), ValueError, r"^v_cache must have shape"),
    expect("f(v_scale=[B, NKV])", edit("v_scale", lambda t: t[..., 0].contiguous()), ValueError, r"^v_scale must be 3-D"),
    expect("f(v_scale=B 1)", edit("v_scale", lambda t: t[:1].contiguous()), ValueError, r"^v_scale must have shape"),
    expect("f(block_table=int64)", edit("block_table", lambda t: t.long()), TypeError, r"^block_table must have dtype int32"),
    expect("f(block_table=1-D)", edit("block_table", lambda t: t.flatten()), ValueError, r"^block_table must be 2-D"),
    expect("f(block_table[0, 0]=NB)", edit("block_table", setitem((0, 0), 6)), ValueError,
           r"block_table\[0, 0\]=6 must be a physical block in \[0, NB=6\)"),
    expect("f(block_table[1, 2]=NB) unused column", edit("block_table", setitem((1, 2), 6)), ValueError,
           r"block_table\[1, 2\]=6 must be a physical block"),
    expect("f(block_table[0, 1]=-2)", edit("block_table", setitem((0, 1), -2)), ValueError, r"block_table\[0, 1\]=-2"),
    expect("f(block_table[0, 1]=-1) inside the valid range", edit("block_table", setitem((0, 1), -1)), ValueError,
           r"kv_act_seqs\[0\]=8 needs 2 blocks, but block_table\[0\] has -1 at column 1"),
    expect("f(kv_act_seqs=int64)", edit("kv_act_seqs", lambda t: t.long()), TypeError, r"^kv_act_seqs must have dtype int32"),
    expect("f(kv_act_seqs=[8])", edit("kv_act_seqs", lambda t: t[:1].contiguous()), ValueError, r"^kv_act_seqs must have shape"),
    expect("f(kv_act_seqs[1]=-1)", edit("kv_act_seqs", setitem(1, -1)), ValueError, r"kv_act_seqs\[1\]=-1 must be >= 0"),
    expect("f(kv_act_seqs[0]=13) over capacity", edit("kv_act_seqs", setitem(0, 13)), ValueError,
           r"kv_act_seqs\[0\]=13 exceeds the table's capacity MAXB\*BS=12"),
    expect("f(kv_act_seqs[1]=5) past its valid entries", edit("kv_act_seqs", setitem(1, 5)), ValueError,
           r"kv_act_seqs\[1\]=5 needs 2 blocks, but block_table\[1\] has -1 at column 1"),
    expect("f(kv_act_seqs[0]=2**31-1)", edit("kv_act_seqs", setitem(0, 2 ** 31 - 1)), ValueError, r"kv_act_seqs\[0\]"),
    expect("f(s2_tile=6)", with_(s2_tile=6), ValueError, r"s2_tile=6 must be a multiple of block_size=4"),
    expect("f(s2_tile=0)", with_(s2_tile=0), ValueError, r"s2_tile=0 must be >= 1"),
    expect("f(s2_tile=4.0)", with_(s2_tile=4.0), TypeError, r"s2_tile must be an int"),
    expect("f(g_tile=3)", with_(g_tile=3), ValueError, r"g_tile=3 must divide the group size NQ/NKV=2"),
    expect("f(g_tile=0)", with_(g_tile=0), ValueError, r"g_tile=0 must be >= 1"),
    expect("f(g_tile=True)", with_(g_tile=True), TypeError, r"g_tile must be an int"),
    expect("f(softmax_scale=-1.0)", with_(softmax_scale=-1.0), ValueError, r"softmax_scale=-1.0 must be a finite positive"),
    expect("f(softmax_scale=nan)", with_(softmax_scale=math.nan), ValueError, r"softmax_scale=nan"),
    expect("f(softmax_scale=inf)", with_(softmax_scale=math.inf), ValueError, r"softmax_scale=inf"),
    expect("f(softmax_scale='0.1')", with_(softmax_scale="0.1"), TypeError, r"softmax_scale must be a float"),
    expect("f(codec='e5m2')", with_(codec="e5m2"), ValueError, r"codec='e5m2' is not a known codec"),
]


@pytest.fixture(scope="module")
def base_kwargs():
    return {**make_inputs(BASE, seed=0).kwargs(), "softmax_scale": None}


@pytest.mark.parametrize("fn", [golden.paged_attention_fp8, golden.paged_attention_fp8_loop],
                         ids=["paged_attention_fp8", "paged_attention_fp8_loop"])
@pytest.mark.parametrize("change, error, match", PAGED_ATTENTION_CASES)
def test_paged_attention_fp8_rejects(fn, base_kwargs, change, error, match):
    kwargs = change(dict(base_kwargs))
    with pytest.raises(error, match=match):
        fn(**kwargs)


def test_paged_attention_base_case_is_valid(base_kwargs):
    assert golden.paged_attention_fp8(**base_kwargs).shape == (4, 4, 8)


def test_no_index_error_for_a_table_narrower_than_the_tile_walk(base_kwargs):
    """MAXB * BS = 12 tokens, s2_tile = 16: the tile walk reads past the table's last column, which
    the golden must clamp like the kernel, not index out of range."""
    out = golden.paged_attention_fp8(**{**base_kwargs, "s2_tile": 16})
    loop = golden.paged_attention_fp8_loop(**{**base_kwargs, "s2_tile": 16})
    assert torch.equal(out.view(torch.int16), loop.view(torch.int16))


# ---------------------------------------------------------------- qk_matmul_scale


def _at12_base():
    q8 = SPEC_CODEC.to_fp8(torch.ones(3, 8))
    k8 = SPEC_CODEC.to_fp8(torch.ones(5, 8))
    return dict(q=q8, k=k8, q_scale=torch.ones(3, 1), k_scale=torch.ones(5, 1))


AT12_CASES = [
    expect("qk_matmul_scale(q=float32)", with_(q=torch.ones(3, 8), k=torch.ones(5, 8), q_scale=None, k_scale=None),
           TypeError, r"^q must have dtype"),
    expect("qk_matmul_scale(q=3-D)", lambda kw: {**kw, "q": kw["q"].view(3, 2, 4)}, ValueError, r"^q must be 2-D"),
    expect("qk_matmul_scale(q=None)", with_(q=None), TypeError, r"^q must be a torch.Tensor"),
    expect("qk_matmul_scale(k=bfloat16)", with_(k=torch.ones(5, 8, dtype=torch.bfloat16)), TypeError,
           r"k must have q's dtype"),
    expect("qk_matmul_scale(k=head_dim 4)", lambda kw: {**kw, "k": kw["k"][:, :4].contiguous()}, ValueError,
           r"q and k must share a positive head_dim"),
    expect("qk_matmul_scale(k=k_tile 0)", lambda kw: {**kw, "k": kw["k"][:0], "k_scale": kw["k_scale"][:0]},
           ValueError, r"k_tile"),
    expect("qk_matmul_scale(q_scale=None)", with_(q_scale=None), ValueError, r"q_scale"),
    expect("qk_matmul_scale(k_scale=None)", with_(k_scale=None), ValueError, r"k_scale"),
    expect("qk_matmul_scale(q_scale=float64)", with_(q_scale=torch.ones(3, 1, dtype=torch.float64)), TypeError,
           r"^q_scale must have dtype float32"),
    expect("qk_matmul_scale(k_scale=[1, 5])", with_(k_scale=torch.ones(1, 5)), ValueError, r"^k_scale must have shape"),
    expect("qk_matmul_scale(q=bfloat16, q_scale=...)",
           with_(q=torch.ones(3, 8, dtype=torch.bfloat16), k=torch.ones(5, 8, dtype=torch.bfloat16)),
           ValueError, r"q_scale and k_scale apply to FP8 inputs only"),
    expect("qk_matmul_scale(scale='1')", with_(scale="1"), TypeError, r"^scale must be a float"),
    expect("qk_matmul_scale(scale=inf)", with_(scale=math.inf), ValueError, r"^scale=inf must be a finite positive"),
    expect("qk_matmul_scale(scale=0.0)", with_(scale=0.0), ValueError, r"^scale=0.0 must be a finite positive"),
    expect("qk_matmul_scale(scale=-1.0)", with_(scale=-1.0), ValueError, r"^scale=-1.0 must be a finite positive"),
    expect("qk_matmul_scale(codec='fp8')", with_(codec="fp8"), ValueError, r"codec='fp8'"),
    expect("qk_matmul_scale(k_scale=meta device)", lambda kw: {**kw, "k_scale": kw["k_scale"].to("meta")}, ValueError,
           r"^k_scale is on meta; the golden runs on the CPU"),
]


@pytest.mark.parametrize("change, error, match", AT12_CASES)
def test_qk_matmul_scale_rejects(change, error, match):
    with pytest.raises(error, match=match):
        qk_matmul_scale(**change(_at12_base()))


# ---------------------------------------------------------------- quantizers and codecs


X = torch.ones(3, 4)
QUANT_CASES = [
    expect("quantize_per_token(x=[[1.0]])", lambda: quantize_per_token([[1.0]]), TypeError, r"^x must be a torch.Tensor"),
    expect("quantize_per_token(x=int32)", lambda: quantize_per_token(X.int()), TypeError, r"^x must be a float"),
    expect("quantize_per_token(x=float8_e4m3fn, name='k')", lambda: quantize_per_token(X.to(FP8), name="k"),
           TypeError, r"^k must be a float"),
    expect("quantize_per_token(x=[0, 4])", lambda: quantize_per_token(X[:0]), ValueError, r"^x must be a non-empty"),
    expect("quantize_per_token(x=scalar)", lambda: quantize_per_token(torch.tensor(1.0)), ValueError, r"^x must be"),
    expect("quantize_per_token(zero_rows='skip')", lambda: quantize_per_token(X, zero_rows="skip"), ValueError,
           r"zero_rows='skip' is not a policy"),
    expect("quantize_per_channel(dim=2)", lambda: quantize_per_channel(X, 2), ValueError, r"^dim=2 must be an int"),
    expect("quantize_per_channel(dim=-3)", lambda: quantize_per_channel(X, -3), ValueError, r"^dim=-3"),
    expect("quantize_per_channel(dim='0')", lambda: quantize_per_channel(X, "0"), TypeError, r"^dim must be an int, got str"),
    expect("quantize_per_channel(dim=True)", lambda: quantize_per_channel(X, True), TypeError, r"^dim must be an int, got bool"),
    expect("quantize_per_channel(valid=int)", lambda: quantize_per_channel(X, 0, valid=X.int()), TypeError, r"^valid must be a bool"),
    expect("quantize_per_channel(valid=[5])", lambda: quantize_per_channel(X, 0, valid=torch.ones(5, dtype=torch.bool)),
           ValueError, r"^valid of shape \(5,\) does not broadcast to x"),
    expect("quantize_per_channel(x=int64, name='v')", lambda: quantize_per_channel(X.long(), 0, name="v"), TypeError, r"^v must be"),
    expect("SPEC_CODEC.encode(x=int32)", lambda: SPEC_CODEC.encode(X.int()), TypeError, r"^x must be a float"),
    expect("SPEC_CODEC.encode(x=float8_e4m3fn)", lambda: SPEC_CODEC.encode(X.to(FP8)), TypeError, r"^x must be a float"),
    expect("SPEC_CODEC.decode(codes=float32)", lambda: SPEC_CODEC.decode(X), TypeError, r"^codes must be uint8"),
    expect("SPEC_CODEC.decode(codes=[1])", lambda: SPEC_CODEC.decode([1]), TypeError, r"^codes must be a torch.Tensor"),
    expect("SPEC_CODEC.decode(dtype=float16)", lambda: SPEC_CODEC.decode(X.byte(), torch.float16), TypeError, r"^dtype must be"),
    expect("SPEC_CODEC.from_fp8(x=uint8)", lambda: SPEC_CODEC.from_fp8(X.byte()), TypeError, r"^x must be a torch.float8"),
    expect("get_codec('e4m3')", lambda: get_codec("e4m3"), ValueError, r"codec='e4m3' is not a known codec"),
    expect("get_codec(448)", lambda: get_codec(448), ValueError, r"codec=448"),
]


@pytest.mark.parametrize("call, error, match", QUANT_CASES)
def test_quantizers_and_codecs_reject(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- paging


def _paging_base():
    table = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)
    return dict(x=torch.zeros(2, 8, 1, 2), block_table=table, kv_act_seqs=[5, 2], block_size=4, num_blocks=3)


def _to_paged(**changes):
    return lambda: contiguous_to_paged(**{**_paging_base(), **changes})


def _to_contiguous(**changes):
    base = _paging_base()
    args = dict(paged=torch.zeros(3, 4, 1, 2), block_table=base["block_table"], kv_act_seqs=[5, 2], seq_len=8)
    return lambda: paged_to_contiguous(**{**args, **changes})


PAGING_CASES = [
    expect("gen_block_table(kv_act_seqs=[3, -1])", lambda: gen_block_table([3, -1], 4, 2), ValueError, r"^kv_act_seqs must be >= 0"),
    expect("gen_block_table(kv_act_seqs=[3.0])", lambda: gen_block_table([3.0], 4, 2), TypeError, r"^kv_act_seqs must hold ints"),
    expect("gen_block_table(kv_act_seqs=float32)", lambda: gen_block_table(torch.ones(2), 4, 2), TypeError, r"^kv_act_seqs must be a 1-D int"),
    expect("gen_block_table(kv_act_seqs=[[3]])", lambda: gen_block_table(torch.ones(1, 1, dtype=torch.int32), 4, 2),
           TypeError, r"^kv_act_seqs must be a 1-D"),
    expect("gen_block_table(kv_act_seqs='3')", lambda: gen_block_table("3", 4, 2), TypeError, r"^kv_act_seqs must be"),
    expect("gen_block_table(block_size=0)", lambda: gen_block_table([3], 0, 2), ValueError, r"^block_size=0 must be >= 1"),
    expect("gen_block_table(block_size=4.0)", lambda: gen_block_table([3], 4.0, 2), TypeError, r"^block_size must be an int, got float"),
    expect("gen_block_table(max_blocks_per_query=0)", lambda: gen_block_table([3], 4, 0), ValueError, r"^max_blocks_per_query=0"),
    expect("gen_block_table(max_blocks_per_query=1, kv_act_seqs=[3, 9])", lambda: gen_block_table([3, 9], 4, 1), ValueError,
           r"^max_blocks_per_query=1 is too small: kv_act_seqs\[1\]=9 needs 3 blocks"),
    expect("gen_block_table(num_blocks=2)", lambda: gen_block_table([3, 9], 4, 3, num_blocks=2), ValueError, r"^num_blocks=2 is too small"),
    expect("gen_block_table(num_blocks=0)", lambda: gen_block_table([0], 4, 3, num_blocks=0), ValueError, r"^num_blocks=0"),
    expect("contiguous_to_paged(x=3-D)", _to_paged(x=torch.zeros(2, 8, 2)), ValueError, r"^x must be a 4-D tensor"),
    expect("contiguous_to_paged(x=batch 3)", _to_paged(x=torch.zeros(3, 8, 1, 2)), ValueError, r"^x has batch 3"),
    expect("contiguous_to_paged(x=S 4)", _to_paged(x=torch.zeros(2, 4, 1, 2)), ValueError, r"^kv_act_seqs max 5 exceeds x's"),
    expect("contiguous_to_paged(block_table=float32)", _to_paged(block_table=torch.zeros(2, 2)), TypeError, r"^block_table must be"),
    expect("contiguous_to_paged(block_table=1 row)", _to_paged(block_table=torch.tensor([[2, 0]], dtype=torch.int32)),
           ValueError, r"^block_table has 1 rows"),
    expect("contiguous_to_paged(block_table=1 column)", _to_paged(block_table=torch.tensor([[2], [1]], dtype=torch.int32)),
           ValueError, r"^block_table has 1 columns"),
    expect("contiguous_to_paged(block_table[0, 0]=3)", _to_paged(block_table=torch.tensor([[3, 0], [1, -1]], dtype=torch.int32)),
           ValueError, r"^block_table's valid entries must lie in \[0, 3\)"),
    expect("contiguous_to_paged(block_table[0, 1]=-1)", _to_paged(block_table=torch.tensor([[2, -1], [1, -1]], dtype=torch.int32)),
           ValueError, r"^block_table's valid entries"),
    expect("contiguous_to_paged(num_blocks=0)", _to_paged(num_blocks=0), ValueError, r"^num_blocks=0"),
    expect("contiguous_to_paged(block_size=-4)", _to_paged(block_size=-4), ValueError, r"^block_size=-4"),
    expect("contiguous_to_paged(kv_act_seqs=[5])", _to_paged(kv_act_seqs=[5]), ValueError, r"kv_act_seqs has 1 entries"),
    expect("paged_to_contiguous(paged=2-D)", _to_contiguous(paged=torch.zeros(3, 4)), ValueError, r"^paged must be a 4-D"),
    expect("paged_to_contiguous(seq_len=0)", _to_contiguous(seq_len=0), ValueError, r"^seq_len=0"),
    expect("paged_to_contiguous(seq_len=4)", _to_contiguous(seq_len=4), ValueError, r"^seq_len=4 is shorter than kv_act_seqs"),
    expect("paged_to_contiguous(paged=NB 2)", _to_contiguous(paged=torch.zeros(2, 4, 1, 2)), ValueError,
           r"^block_table's valid entries must lie in \[0, 2\)"),
    expect("paged_to_contiguous(kv_act_seqs=[-1, 2])", _to_contiguous(kv_act_seqs=[-1, 2]), ValueError, r"^kv_act_seqs must be >= 0"),
]


@pytest.mark.parametrize("call, error, match", PAGING_CASES)
def test_paging_rejects(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---------------------------------------------------------------- PagedAttentionConfig and make_inputs


def _config(**changes):
    base = dict(batch=2, s1=1, s2=8, nq=4, nkv=2, head_dim=8, block_size=4, s2_tile=4)
    return lambda: PagedAttentionConfig(**{**base, **changes})


CONFIG_CASES = [
    expect("PagedAttentionConfig(batch=0)", _config(batch=0), ValueError, r"^batch=0 must be >= 1"),
    expect("PagedAttentionConfig(s1='1')", _config(s1="1"), TypeError, r"^s1 must be an int"),
    expect("PagedAttentionConfig(s2=True)", _config(s2=True), TypeError, r"^s2 must be an int"),
    expect("PagedAttentionConfig(head_dim=0)", _config(head_dim=0), ValueError, r"^head_dim=0"),
    expect("PagedAttentionConfig(nq=3)", _config(nq=3), ValueError, r"^nq=3 must be a multiple of nkv=2"),
    expect("PagedAttentionConfig(s2_tile=6)", _config(s2_tile=6), ValueError, r"^s2_tile=6 must be a multiple of block_size=4"),
    expect("PagedAttentionConfig(g_tile=3)", _config(g_tile=3), ValueError, r"^g_tile=3 must divide"),
    expect("PagedAttentionConfig(kv_act_seqs=(8,))", _config(kv_act_seqs=(8,)), ValueError, r"^kv_act_seqs must be a tuple of batch=2"),
    expect("PagedAttentionConfig(kv_act_seqs=(8, 9))", _config(kv_act_seqs=(8, 9)), ValueError, r"^kv_act_seqs\[1\]=9 must be <= s2=8"),
    expect("PagedAttentionConfig(kv_act_seqs=(-1, 2))", _config(kv_act_seqs=(-1, 2)), ValueError, r"^kv_act_seqs\[0\]=-1 must be >= 0"),
    expect("PagedAttentionConfig(kv_act_seqs=(1.0, 2))", _config(kv_act_seqs=(1.0, 2)), TypeError, r"^kv_act_seqs\[0\] must be an int"),
    expect("PagedAttentionConfig(kv_act_seqs='82')", _config(kv_act_seqs="82"), ValueError, r"^kv_act_seqs must be a tuple"),
    expect("PagedAttentionConfig(max_blocks=1)", _config(max_blocks=1), ValueError, r"^max_blocks=1 must be >= ceil\(s2 / block_size\) = 2"),
    expect("PagedAttentionConfig(num_blocks=3)", _config(num_blocks=3), ValueError, r"^num_blocks=3 must be >= the 4 blocks"),
    expect("PagedAttentionConfig(softmax_scale=0)", _config(softmax_scale=0), ValueError, r"^softmax_scale=0"),
    expect("PagedAttentionConfig(softmax_scale=nan)", _config(softmax_scale=math.nan), ValueError, r"^softmax_scale=nan"),
    expect("PagedAttentionConfig(softmax_scale=inf)", _config(softmax_scale=math.inf), ValueError, r"^softmax_scale=inf"),
    expect("PagedAttentionConfig(softmax_scale=True)", _config(softmax_scale=True), (TypeError, ValueError), r"^softmax_scale=True"),
    expect("PagedAttentionConfig(distribution='cauchy')", _config(distribution="cauchy"), ValueError, r"^distribution='cauchy'"),
    expect("PagedAttentionConfig(garbage='inf')", _config(garbage="inf"), ValueError, r"^garbage='inf'"),
    # An explicit block table (base: B = 2, two blocks of BS = 4 per row, NB = B * MAXB = 4).
    expect("PagedAttentionConfig(block_table=[[0, 1]])", _config(block_table=[[0, 1]]), ValueError,
           r"^block_table must have shape \[B, MAXB\] = \(2, 2\), got \(1, 2\)"),
    expect("PagedAttentionConfig(block_table=[[0, 1], [2]])", _config(block_table=[[0, 1], [2]]), ValueError,
           r"^block_table must be a 2-D table of ints \[B, MAXB\] \(rows of one length\)"),
    expect("PagedAttentionConfig(block_table=[[0, 1], [2, 1.0]])", _config(block_table=[[0, 1], [2, 1.0]]), TypeError,
           r"^block_table must be rows of ints"),
    expect("PagedAttentionConfig(block_table=torch)", _config(block_table=torch.zeros(2, 2, dtype=torch.int32)), TypeError,
           r"^block_table must be rows of ints"),
    expect("PagedAttentionConfig(block_table=[[0, 4], [2, 3]])", _config(block_table=[[0, 4], [2, 3]]), ValueError,
           r"^block_table\[0, 1\]=4 must be a physical block in \[0, NB=4\) or -1"),
    expect("PagedAttentionConfig(block_table=[[0, -1], [2, 3]])", _config(block_table=[[0, -1], [2, 3]]), ValueError,
           r"^kv_act_seqs\[0\]=8 needs 2 blocks, but block_table\[0\] has -1 at column 1"),
    expect("PagedAttentionConfig(block_table=[[0, 1], [3, 1]])", _config(block_table=[[0, 1], [3, 1]]), ValueError,
           r"^block_table\[1, 1\]=1 is also block_table\[0, 1\]: each valid entry must name its own physical block"),
    expect("PagedAttentionConfig.from_dict({'batch': 1, 'seq': 2})",
           lambda: PagedAttentionConfig.from_dict({"batch": 1, "seq": 2}), ValueError, r"unknown config keys \['seq'\]"),
    expect("PagedAttentionConfig.from_dict([])", lambda: PagedAttentionConfig.from_dict([]), TypeError, r"a config must be a dict"),
    expect("make_inputs(config=dict)", lambda: make_inputs({"batch": 1}, 0), TypeError, r"^config must be a PagedAttentionConfig"),
    expect("make_inputs(seed=-1)", lambda: make_inputs(_config()(), -1), ValueError, r"^seed=-1"),
    expect("make_inputs(seed=1.5)", lambda: make_inputs(_config()(), 1.5), TypeError, r"^seed must be an int, got float"),
    expect("make_inputs(seed=True)", lambda: make_inputs(_config()(), True), TypeError, r"^seed must be an int, got bool"),
]


@pytest.mark.parametrize("call, error, match", CONFIG_CASES)
def test_config_and_make_inputs_reject(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_every_table_names_its_argument():
    """Meta: every expected message in the tables mentions an argument name (or its value)."""
    for table in (PAGED_ATTENTION_CASES, AT12_CASES, QUANT_CASES, PAGING_CASES, CONFIG_CASES):
        for param in table:
            match = param.values[2]
            assert re.search(r"[a-z_]{2,}", match), f"{param.id}: {match!r} names nothing"


# ---------------------------------------------------------------- the shared spec facts


def test_default_softmax_scale_is_both_spellings_of_the_spec_in_float32():
    """SPEC §1 writes the default as D^-0.5, SPEC §6 as 1/sqrt(head_dim): golden.validate.default_softmax_scale
    is the one used everywhere, and every use rounds it to float32, where the two spellings agree for every
    head_dim up to 2**20 (in float64 they differ for 218 of the first 1024)."""
    d = np.arange(1, 2 ** 20, dtype=np.float64)
    assert np.array_equal(np.float32(d ** -0.5), np.float32(1.0 / np.sqrt(d)))
    assert all(default_softmax_scale(int(x)) == x ** -0.5 for x in (1, 2, 48, 128, 2 ** 20 - 1))
    float64_differ = [x for x in range(1, 1025) if default_softmax_scale(x) != 1 / math.sqrt(x)]
    assert len(float64_differ) == 218 and 48 in float64_differ       # why the float32 agreement matters
    with pytest.raises(ValueError, match=r"^head_dim=0 must be >= 1"):
        default_softmax_scale(0)


def test_group_size_names_both_head_counts():
    assert group_size(12, 2) == 6 and group_size(4, 4) == 1
    with pytest.raises(ValueError, match=r"^nq=12 must be a multiple of nkv=5$"):
        group_size(12, 5)
    with pytest.raises(ValueError, match=r"^NQ=3 must be a multiple of NKV=2 \(heads\)$"):
        group_size(3, 2, names=("NQ", "NKV"), what=" (heads)")
