"""The weights readout (properties/diagnosis/readout.py): its case reads a row's weights, and it locates the stage of
defects written here as backends, without a fault model, or names none."""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden
from pfa_verify.golden.paging import visible_lengths
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.properties.diagnosis.readout import READOUT_HEAD_DIM, locate, readout_case
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import call, split_bundle
from pfa_verify.properties.rule.case import Case
from tests.properties.doubles import DropLastS2Tile, ReadsTheNextColumn


def _case(lengths=(40, 7, 0), *, s1=2, nq=4, nkv=2, s2_tile=32, seed=3, softmax_scale=None) -> Case:
    config = golden.PagedAttentionConfig(batch=len(lengths), s1=s1, s2=max(*lengths, 1), nq=nq, nkv=nkv, head_dim=16,
                                         block_size=16, s2_tile=s2_tile, kv_act_seqs=tuple(lengths), garbage="nan",
                                         softmax_scale=softmax_scale)
    return Case(config, seed=seed)


def _located(backend, case: Case, batches=None, max_calls: int = 4):
    readout = readout_case(case, batches, max_calls=max_calls)
    assert readout is not None
    outs, expected, masks = [], [], []
    for ablated in readout.cases:
        tensors, scalars = split_bundle(ablated.inputs())
        e = golden.paged_attention_fp8(**tensors, **scalars)
        o = call(backend, tensors, **scalars)
        outs.append(o)
        expected.append(e)
        masks.append(cmp.compare(o, e, kind="attention").mismatch_mask)
    return locate(readout, outs, expected, masks)


def test_the_golden_on_the_readout_case_outputs_its_weights():
    """Channel c of a row is the weight of token c: 0 on other batches' tokens, on the unread cells and on
    the blank channel; the visible tokens' weights sum to 1 within P's E4M3 rounding; K, its scales and the
    table are the case's at every cell a kernel reads, and the garbage of K's unread cells is gone."""
    case = _case()
    readout = readout_case(case)
    assert readout is not None and len(readout.cases) == 1 and readout.cases[0].config.head_dim == READOUT_HEAD_DIM
    tensors, scalars = split_bundle(readout.cases[0].inputs())
    out = golden.paged_attention_fp8(**tensors, **scalars).double()
    batch_of, token_of = torch.tensor(readout.batch_of), torch.tensor(readout.token_of)
    seen = visible_lengths(torch.tensor([40, 7, 0]), 2).reshape(-1)
    for flat in range(out.shape[0]):
        b = flat // 2
        w = out[flat, :, :len(readout.batch_of)]
        visible = (batch_of == b) & (token_of < seen[flat])
        assert bool((w[:, ~visible] == 0).all())
        assert bool((out[flat, :, [readout.rest, readout.unread, readout.blank]] == 0).all())
        if seen[flat]:
            assert bool(((w.sum(-1) - 1).abs() <= 2.0 ** -4).all()), w.sum(-1)
        else:
            assert bool((w == 0).all())
    assert bool(torch.isfinite(golden.SPEC_CODEC.from_fp8(tensors["k_cache"])).all())


def test_windows_split_the_tokens_and_the_rest_channel_holds_the_others():
    """A case of more tokens than one window's channels takes several calls; the failing batch comes first."""
    case = _case((200, 100), s1=1, s2_tile=64)
    readout = readout_case(case, [1], max_calls=3)
    assert readout is not None and len(readout.cases) == 3
    assert readout.batch_of[:100] == (1,) * 100 and sorted(readout.token_of[:100]) == list(range(100))
    assert readout_case(case, [0], max_calls=1) is None             # batch 0 alone needs two windows
    one = readout_case(case, [1], max_calls=1)
    assert one is not None and set(one.batch_of) == {1}             # batch 0 does not fit beside it
    tensors, scalars = split_bundle(one.cases[0].inputs())
    out = golden.paged_attention_fp8(**tensors, **scalars).double()
    assert bool((out[0, :, one.rest] > 0.9).all())                  # batch 0's row weighs only tokens not read


def test_a_conforming_kernel_gets_no_location():
    assert _located(GoldenBackend(), _case()).stage is None


class _LengthsOneShort(GoldenBackend):
    """Every batch walks one token less."""
    name = "lengths one short"

    def paged_attention_fp8(self, *, kv_act_seqs, **kwargs):
        return super().paged_attention_fp8(kv_act_seqs=(kv_act_seqs - 1).clamp(min=0), **kwargs)


class _LengthsHalved(GoldenBackend):
    """Every batch walks half its length."""
    name = "lengths halved"

    def paged_attention_fp8(self, *, kv_act_seqs, **kwargs):
        return super().paged_attention_fp8(kv_act_seqs=kv_act_seqs // 2, **kwargs)


class _ScoresScaledTwice(GoldenBackend):
    """The softmax scale applied twice."""
    name = "softmax scale twice"

    def paged_attention_fp8(self, *, q, softmax_scale=None, **kwargs):
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        return super().paged_attention_fp8(q=q, softmax_scale=scale * scale, **kwargs)


class _CausalOffsetIgnored(GoldenBackend):
    """Every query row sees its batch's whole length (each row its own batch of S1 = 1)."""
    name = "causal offset ignored"

    def paged_attention_fp8(self, *, q, kv_act_seqs, block_table, v_scale, **kwargs):
        s1 = q.shape[0] // kv_act_seqs.shape[0]
        return super().paged_attention_fp8(q=q, kv_act_seqs=kv_act_seqs.repeat_interleave(s1),
                                           block_table=block_table.repeat_interleave(s1, dim=0).contiguous(),
                                           v_scale=v_scale.repeat_interleave(s1, dim=0).contiguous(), **kwargs)


class _OutputAddsHalf(GoldenBackend):
    """A defect that is not a weighting: 0.5 added to every output element."""
    name = "adds a half"

    def paged_attention_fp8(self, *args, **kwargs):
        return (super().paged_attention_fp8(*args, **kwargs).float() + 0.5).bfloat16()


@pytest.mark.parametrize("backend, lengths, stage, words", [
    (_LengthsOneShort(), (40, 7, 20), "visible length", "each off by the same count"),
    (_LengthsHalved(), (40, 7, 20), "lengths and paging", "differ by batch"),
    (ReadsTheNextColumn(), (40, 7, 20), "paging", "another batch or on cells no row may read"),
    (DropLastS2Tile(), (40, 70, 20), "the tile walk", "multiple of s2_tile"),
    (_ScoresScaledTwice(), (40, 7, 20), "MM1 scales", "scores scaled by"),
    (_CausalOffsetIgnored(), (40, 1, 20), "visible length", "each off by the same count"),
    (_OutputAddsHalf(), (40, 7, 20), None, "not a weighted sum of V's rows"),
])
def test_defects_written_here_are_located_in_their_stage(backend, lengths, stage, words):
    """Each backend holds one defect of SPEC §2 and no fault model is consulted: the readout names its stage
    (or, for an output that is no weighting, none) and says what it measured."""
    found = _located(backend, _case(lengths, s1=2, softmax_scale=0.4))
    assert found.stage == stage, found
    assert words in found.evidence, found.evidence


def test_a_readout_that_does_not_fit_is_not_made():
    assert readout_case(_case((400, 200), s1=1), max_calls=1) is None
    assert readout_case(_case((0, 0), s1=1)) is None


class _Attends:
    """A kernel that attends row (b, i) to the tokens ``keep(t, cur, block_size, s2_tile)`` says of its batch
    (cells past its length included when kept): the golden on those tokens, gathered into a cache of their
    own, one row at a time (so a row that keeps its visible tokens has the golden's bits)."""

    def __init__(self, name, keep):
        self.name, self.keep = name, keep

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        rows, nq, d = q.shape
        batch, bs = kv_act_seqs.shape[0], k_cache.shape[1]
        s1 = rows // batch
        out = torch.zeros(rows, nq, d, dtype=torch.bfloat16)
        for b in range(batch):
            for i in range(s1):
                cur = max(0, int(kv_act_seqs[b]) - (s1 - 1 - i))
                tokens = torch.tensor([t for t in range(cur + bs) if self.keep(t, cur, bs, s2_tile)], dtype=torch.long)
                if not tokens.numel():
                    continue
                blocks = -(-tokens.numel() // bs)
                padded = torch.cat([tokens, tokens[-1:].expand(blocks * bs - tokens.numel())])
                cells = block_table[b, padded // bs].long(), padded % bs
                row = slice(b * s1 + i, b * s1 + i + 1)
                out[row] = golden.paged_attention_fp8(
                    q[row], q_scale[row], k_cache[cells].view(blocks, bs, *k_cache.shape[2:]),
                    k_scale[cells].view(blocks, bs, *k_scale.shape[2:]), v_cache[cells].view(blocks, bs, *v_cache.shape[2:]),
                    v_scale[b:b + 1], torch.arange(blocks, dtype=torch.int32)[None, :],
                    torch.tensor([tokens.numel()], dtype=torch.int32), softmax_scale=softmax_scale, s2_tile=s2_tile,
                    g_tile=g_tile)
        return out


@pytest.mark.parametrize("backend, lengths, stage, words", [
    (_Attends("each tile's first block", lambda t, cur, bs, tile: t < cur and t % tile < bs), (70, 40, 20),
     "the tile walk", "first 16"),
    (_Attends("a tile's gather cut to a block", lambda t, cur, bs, tile: t < min(cur, bs)), (30, 7, 12),
     "the tile walk", "whatever their visible length"),
    (_Attends("the last block read to its end", lambda t, cur, bs, tile: t < -(-cur // bs) * bs), (40, 7, 20),
     "visible length", "read on to the end of its last block"),
])
def test_walks_and_gathers_cut_short_are_the_tile_walk_and_reads_past_a_length_a_length(backend, lengths, stage, words):
    """properties/diagnosis/walks.py on kernels written here: each tile's first block only, or every row's first block
    whatever its visible length, is the tile walk (not the causal offset: the rows' counts follow no length);
    a row that reads on to its last block's end (the cells past its length are read as tokens) sees a
    longer prefix, its length not masked."""
    found = _located(backend, _case(lengths, s1=2, s2_tile=32))
    assert found.stage == stage, found
    assert words in found.evidence, found.evidence


class _OneLengthWraps(GoldenBackend):
    """kv_act_seqs read modulo 32 (a narrow integer): only a batch of 32 tokens or more walks a wrong length."""
    name = "lengths modulo 32"

    def paged_attention_fp8(self, *, kv_act_seqs, **kwargs):
        return super().paged_attention_fp8(kv_act_seqs=kv_act_seqs % 32, **kwargs)


def test_one_batch_off_while_the_others_read_right_is_that_batchs_length():
    found = _located(_OneLengthWraps(), _case((40, 7, 20), s1=2))
    assert found.stage == "lengths and paging", found
    assert "batch 0 as if of length 8 (kv_act_seqs 40)" in found.evidence and "read right" in found.evidence
