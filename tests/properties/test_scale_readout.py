"""The V-scale readout (properties/diagnosis/scale_readout.py): on its case the output is the v_scale entry applied;
it reads back which entry a kernel used, and, with the weights readout, names the V scale's stage only where
the weights were read right."""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.properties.diagnosis.readout import Location
from pfa_verify.properties.diagnosis.scale_readout import (
    LOWEST,
    combine,
    entry_values,
    max_entries,
    read_scales,
    scale_readout_case,
)
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import call, split_bundle
from pfa_verify.properties.rule.case import Case


def _case(lengths=(40, 7, 0), *, s1=2, nq=4, nkv=2, s2_tile=32, seed=3) -> Case:
    config = golden.PagedAttentionConfig(batch=len(lengths), s1=s1, s2=max(*lengths, 1), nq=nq, nkv=nkv, head_dim=16,
                                         block_size=16, s2_tile=s2_tile, kv_act_seqs=tuple(lengths), garbage="nan")
    return Case(config, seed=seed)


def _read(backend, case: Case):
    readout = scale_readout_case(case)
    assert readout is not None
    tensors, scalars = split_bundle(readout.case.inputs())
    expected = golden.paged_attention_fp8(**tensors, **scalars)
    out = call(backend, tensors, **scalars)
    return readout, expected, read_scales(readout, out, cmp.compare(out, expected, kind="attention").mismatch_mask,
                                          expected)


@pytest.mark.parametrize("longest", [1, 1000, 131072])
def test_entry_values_are_distinct_bf16_numbers_the_rule_tells_apart_and_too_many_are_refused(longest):
    """Distinct and bf16-exact; the smallest far enough from its neighbour for SPEC §4's tolerance to see an
    entry read in place of another; the largest, times the longest batch's l summed before the division,
    far from float32's overflow (2^128)."""
    most = max_entries(longest)
    values = entry_values(most, longest)
    assert values.unique().numel() == most > 3000
    assert torch.equal(values.bfloat16().float(), values) and bool((values > 0).all())
    low, next_up = float(values[0]), float(values[1])
    assert low == 2.0 ** LOWEST and next_up - low > 1e-4 + low / 128
    assert float(values.max()) * longest * 2 < 2.0 ** 127
    with pytest.raises(ValueError, match="entries"):
        entry_values(most + 1, longest)


def test_the_golden_on_the_readout_case_outputs_its_own_entries_bit_for_bit():
    """SPEC §2.3 with every score 0 and every V code 1.0: O / l is v_scale[b, h // group, c], exactly in
    bf16, on every row that sees a token; rows SPEC §2.5 leaves empty are 0."""
    case = _case()
    readout, expected, reading = _read(GoldenBackend(), case)
    group = case.config.nq // case.config.nkv
    s1 = case.config.s1
    for row in range(expected.shape[0]):
        b, i = divmod(row, s1)
        cur = max(0, case.config.lengths[b] - (s1 - 1 - i))
        want = readout.values[b, torch.arange(case.config.nq) // group] if cur else torch.zeros(expected.shape[1:])
        assert torch.equal(expected[row].float(), want), row
    assert reading.passes and not reading.wrong and not reading.factor


class _VScaleOfHeadZero(GoldenBackend):
    """Every KV head's output dequantized with KV head 0's v_scale."""
    name = "v_scale of head 0"

    def paged_attention_fp8(self, *, v_scale, **kwargs):
        return super().paged_attention_fp8(v_scale=v_scale[:, :1].expand_as(v_scale).contiguous(), **kwargs)


class _VScaleOfNextBatch(GoldenBackend):
    """v_scale read from batch b + 1."""
    name = "v_scale of batch b+1"

    def paged_attention_fp8(self, *, v_scale, **kwargs):
        return super().paged_attention_fp8(v_scale=v_scale.roll(-1, dims=0).contiguous(), **kwargs)


class _NotDivided(GoldenBackend):
    """O left undivided by l: the output times the row's visible length (with P = 1, l = cur)."""
    name = "not divided by l"

    def paged_attention_fp8(self, *, q, kv_act_seqs, **kwargs):
        out = super().paged_attention_fp8(q=q, kv_act_seqs=kv_act_seqs, **kwargs).float()
        s1 = q.shape[0] // kv_act_seqs.shape[0]
        cur = (kv_act_seqs[:, None] - (s1 - 1 - torch.arange(s1))[None, :]).clamp(min=0).reshape(-1)
        return (out * cur[:, None, None]).bfloat16()


@pytest.mark.parametrize("backend, wrong", [(_VScaleOfHeadZero(), {"head"}), (_VScaleOfNextBatch(), {"batch"})])
def test_another_entry_is_read_back_with_the_index_that_differs(backend, wrong):
    _, _, reading = _read(backend, _case())
    assert not reading.passes and reading.wrong == wrong and not reading.factor, reading
    assert "carry another entry's v_scale" in reading.evidence


def test_an_undivided_output_is_read_as_its_visible_length():
    _, _, reading = _read(_NotDivided(), _case())
    assert reading.factor and not reading.wrong and "not divided by l" in reading.evidence, reading


_PASSES = Location(None, "the weights readout passes: the kernel weighs the tokens as the spec does", weights_right=True)


def test_the_v_scale_is_named_only_when_the_weights_were_read_right():
    _, _, head = _read(_VScaleOfHeadZero(), _case())
    assert combine(_PASSES, head).stage == "MM2 and the V scale"
    assert combine(Location(None, "the weights readout: rows are 0 ..."), head).stage is None
    assert combine(Location("GQA head map", "the weights readout: query head 1's row ..."), head).stage == "GQA head map"
    assert combine(None, head).stage is None                  # no weights readout: nothing to rule out a head map


def test_another_entry_beside_a_stage_this_readout_cannot_see_names_no_stage():
    """An output row written to another row reads as another batch's weights and another batch's v_scale; any
    stage of the weights readout but the GQA map (with another head's entry) beside another entry is no name."""
    _, _, batch = _read(_VScaleOfNextBatch(), _case())
    assert combine(Location("paging", "the weights readout: rows put weight on tokens of another batch"), batch).stage is None
    assert combine(Location("the tile walk", "the weights readout: ..."), batch).stage is None
    assert combine(_PASSES, batch).stage == "MM2 and the V scale"


def test_an_undivided_output_is_said_and_names_no_stage_of_its_own():
    """With every score 0, l is the row's length: O left undivided and an l stuck at 1 read alike."""
    _, _, undivided = _read(_NotDivided(), _case())
    assert undivided.undivided
    assert combine(Location(None, "the weights readout: ... scaled by 40 (a normalization)"), undivided).stage is None
    assert combine(Location("online update", "the weights readout: ..."), undivided).stage == "online update"


def test_a_conforming_kernel_passes_and_keeps_the_weights_location():
    _, _, reading = _read(GoldenBackend(), _case((33, 16, 1), s2_tile=16))
    assert reading.passes
    walk = Location("the tile walk", "the weights readout: rows see a prefix ...")
    assert combine(walk, reading).stage == "the tile walk" and combine(_PASSES, reading).stage is None


def test_a_readout_that_cannot_be_made_is_not_made():
    assert scale_readout_case(_case((0, 0))) is None            # no row sees a token
    big = golden.PagedAttentionConfig(batch=8, s1=1, s2=16, nq=32, nkv=32, head_dim=128, block_size=16, s2_tile=16)
    assert scale_readout_case(Case(big, seed=0)) is None       # 8 * 32 * 128 entries > max_entries(16)


def test_entries_are_read_back_relative_to_the_codecs_unit():
    """Under pypto's calculator codec P = 1 encodes to 240, not 448, so O / l is v_scale * 240 / 448 rounded:
    the golden's own ratio is the unit, and the nearest entry within READ_BACK is read, so a conforming output
    passes and KV head 0's v_scale on every head is read as such."""
    calculator = golden.PYPTO_CALCULATOR_CODEC
    readout = scale_readout_case(_case())
    tensors, scalars = split_bundle(readout.case.inputs())
    expected = golden.paged_attention_fp8(**tensors, **scalars, codec=calculator)
    assert not torch.equal(expected[0, 0].float(), readout.values[0, 0])      # row 0 sees tokens; the unit is not 1
    head_zero = {**tensors, "v_scale": tensors["v_scale"][:, :1].expand_as(tensors["v_scale"]).contiguous()}
    out = golden.paged_attention_fp8(**head_zero, **scalars, codec=calculator)
    mismatch = cmp.compare(out, expected, kind="attention").mismatch_mask
    reading = read_scales(readout, out, mismatch, expected)
    assert reading.wrong == {"head"} and not reading.factor, reading
    assert read_scales(readout, expected, torch.zeros_like(mismatch), expected).passes


class _WritesZero(GoldenBackend):
    """Every output 0 (V read from a cache of zeros, say): no row carries an entry."""
    name = "writes zero"

    def paged_attention_fp8(self, *args, **kwargs):
        return torch.zeros_like(super().paged_attention_fp8(*args, **kwargs))


def test_rows_that_see_tokens_and_are_zero_do_not_pass():
    _, _, reading = _read(_WritesZero(), _case())
    assert not reading.passes and not reading.wrong and "rows that see tokens are 0" in reading.evidence, reading
    assert combine(_PASSES, reading).stage is None


def test_an_element_read_back_as_its_own_entry_is_rounding_not_another_entry():
    """Under a codec whose unit is not 1, an element two bf16 steps off its own entry is read back as its own:
    no index is wrong (and reading it does not raise)."""
    calculator = golden.PYPTO_CALCULATOR_CODEC
    readout = scale_readout_case(_case())
    tensors, scalars = split_bundle(readout.case.inputs())
    expected = golden.paged_attention_fp8(**tensors, **scalars, codec=calculator)
    out = expected.clone()
    out[0, 0, 0] = (out[0, 0, 0].float() * (1 + 2.0 ** -7)).bfloat16()
    mismatch = torch.zeros(out.shape, dtype=torch.bool)
    mismatch[0, 0, 0] = True
    reading = read_scales(readout, out, mismatch, expected)
    assert not reading.wrong and reading.factor and "not another entry" in reading.evidence, reading
