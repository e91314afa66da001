"""properties/diagnosis/ablations.py: each ablation makes the parts of SPEC §2 it names unable to matter, and changes
nothing a kernel may not read; properties/diagnosis/probes.py runs them on a failure no model explains."""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden
from pfa_verify.golden.paging import token_slots
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.properties.diagnosis import ablations as abl
from pfa_verify.properties.diagnosis.diagnosis import diagnose_verdict
from pfa_verify.properties.diagnosis.probes import EVIDENCE, probe
from pfa_verify.properties.rule.acceptance import judge, split_bundle
from pfa_verify.properties.rule.case import Case

_CODEC = golden.SPEC_CODEC


def _case(lengths=(40, 7, 0), *, s1=2, nq=4, nkv=2, garbage="nan", seed=3) -> Case:
    config = golden.PagedAttentionConfig(batch=len(lengths), s1=s1, s2=48, nq=nq, nkv=nkv, head_dim=16, block_size=16,
                                         s2_tile=32, kv_act_seqs=tuple(lengths), garbage=garbage)
    return Case(config, seed=seed)


def _ablated(case: Case, name: str) -> Case:
    (_, ablated), = abl.ablations(case, (name,))
    return ablated


def _read(case: Case):
    """(tensors, a bool mask [NB, BS] of the cache cells a kernel reads)."""
    t = case.inputs().tensors()
    _, _, block, row = token_slots(t["block_table"], t["kv_act_seqs"], case.config.block_size)
    read = torch.zeros(t["k_cache"].shape[:2], dtype=torch.bool)
    read[block, row] = True
    return t, read


@pytest.mark.parametrize("name", ["scores 0", "V constant", "unit scales"])
def test_a_tensor_ablation_keeps_shapes_dtypes_table_and_every_unread_cell(name):
    case = _case()
    before, read = _read(case)
    after = _ablated(case, name).inputs().tensors()
    assert after.keys() == before.keys()
    for key in before:
        assert after[key].shape == before[key].shape and after[key].dtype == before[key].dtype, key
    for key in ("block_table", "kv_act_seqs"):
        assert torch.equal(after[key], before[key])
    for key in ("k_cache", "k_scale", "v_cache"):
        old, new = before[key], after[key]
        bits = (lambda x: x.view(torch.uint8)) if old.dtype == torch.float8_e4m3fn else (lambda x: x.view(torch.int32))
        assert torch.equal(bits(new)[~read], bits(old)[~read]), key      # garbage (NaN here) where it was


def test_scores_0_weighs_what_a_row_sees_alike():
    """Every visible K code 0: the golden's output row is the plain mean of the V rows the row sees (P = 1
    everywhere is exact in E4M3), so only which tokens a row sees still matters."""
    case = _ablated(_case(s1=1), "scores 0")
    t, s = split_bundle(case.inputs())
    _, read = _read(case)
    assert not _CODEC.from_fp8(t["k_cache"])[read].any()
    out = golden.paged_attention_fp8(**t, **s).float()          # [B*S1, NQ, D]
    v = _CODEC.from_fp8(t["v_cache"])
    for b, n in enumerate(case.config.lengths):
        if n == 0:
            continue
        seen = torch.stack([v[int(t["block_table"][b, i // 16]), i % 16] for i in range(n)])    # [n, NKV, D]
        mean = seen.mean(0) * t["v_scale"][b]                   # [NKV, D]
        expected = mean.repeat_interleave(case.config.nq // case.config.nkv, dim=0)
        torch.testing.assert_close(out[b], expected, rtol=2 ** -7, atol=1e-6)


def test_v_constant_makes_every_row_that_token_whatever_its_weights():
    """Every visible V token the first one's: a row that sees anything outputs that token times its batch's
    v_scale (the weights sum to one, up to P's E4M3 rounding: SPEC §2.3), so the weights cannot matter."""
    case = _ablated(_case(), "V constant")
    t, s = split_bundle(case.inputs())
    _, read = _read(case)
    v = t["v_cache"].view(torch.uint8)[read]                   # [tokens, NKV, D]
    assert (v == v[0]).all()
    out = golden.paged_attention_fp8(**t, **s).float().view(3, 2, 4, 16)   # [B, S1, NQ, D]
    token = _CODEC.from_fp8(t["v_cache"][read][0])             # [NKV, D]
    for b, n in enumerate(case.config.lengths):
        if n:
            expected = (token * t["v_scale"][b]).repeat_interleave(2, dim=0)
            for i in range(2):
                torch.testing.assert_close(out[b, i], expected, rtol=2 ** -4, atol=1e-6)


def test_unit_scales_fold_each_scale_into_its_codes():
    """Every scale 1, and each value a kernel reads the old code times its scale, rounded to E4M3 (SPEC §3:
    half a step of 3 mantissa bits, or of the subnormal spacing 2^-9)."""
    case = _case()
    before, read = _read(case)
    after = _ablated(case, "unit scales").inputs().tensors()
    assert (after["q_scale"] == 1).all() and (after["v_scale"] == 1).all() and (after["k_scale"][read] == 1).all()
    batch, _, block, row = token_slots(before["block_table"], before["kv_act_seqs"], 16)
    pairs = [(_CODEC.from_fp8(before["q"]) * before["q_scale"], _CODEC.from_fp8(after["q"])),
             (_CODEC.from_fp8(before["k_cache"][block, row]) * before["k_scale"][block, row],
              _CODEC.from_fp8(after["k_cache"][block, row])),
             (_CODEC.from_fp8(before["v_cache"][block, row]) * before["v_scale"][batch],
              _CODEC.from_fp8(after["v_cache"][block, row]))]
    for value, folded in pairs:
        assert ((folded - value).abs() <= value.abs() * 2 ** -4 + 2 ** -10).all()


def test_the_shape_ablations_are_the_cases_they_say():
    case = _case(lengths=(40, 7, 0), garbage="nan")
    made = {name: _ablated(case, name).config for name in
            ("one tile", "full tiles", "one query row", "one head", "one batch", "block of a tile", "no garbage")}
    assert made["one tile"].lengths == (32, 7, 0) and made["full tiles"].lengths == (64, 32, 0)
    assert made["one query row"].s1 == 1 and (made["one head"].nq, made["one head"].nkv) == (1, 1)
    assert made["one batch"].lengths == (40,) and made["block of a tile"].block_size == 32
    assert made["no garbage"].garbage is None
    assert _ablated(case, "one tile").seed == case.seed


def test_an_ablation_that_would_change_nothing_is_not_made():
    case = _case(lengths=(32,), s1=1, garbage=None)
    names = {change.split("'")[1] for change, _ in abl.ablations(case)}
    assert not {"one tile", "full tiles", "one query row", "one batch", "default softmax scale", "no garbage"} & names
    assert {"scores 0", "V constant", "unit scales", "one head", "block of a tile"} <= names


def test_an_unknown_ablation_is_refused_by_name():
    with pytest.raises(ValueError, match=r"names=.*'no such'"):
        list(abl.ablations(_case(), ("scores 0", "no such")))


class _LaterBatchesOff(GoldenBackend):
    """A defect no fault model holds: every output row of a batch after the first is the golden's plus 0.5."""

    name = "later batches off"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        out = super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw)
        s1 = q.shape[0] // kv_act_seqs.shape[0]
        bumped = out.float()
        bumped[s1:] += 0.5
        return bumped.to(out.dtype)


def test_a_failure_no_model_explains_is_run_on_the_ablations_and_nothing_is_refuted():
    """No candidate to split: the probes are the V-scale readout and the weights readout (which locate no
    stage: the output is not a weighted sum of V's rows, nor a v_scale entry) and the ablations in EVIDENCE's
    order, with what the kernel did on each."""
    case = _case(lengths=(40, 7), garbage=None)
    backend = _LaterBatchesOff()
    verdict = judge(backend, case)
    assert not verdict.passed
    found = diagnose_verdict(verdict, *split_bundle(case.inputs()))
    assert found is not None and not found.leading, found.render()
    probed = probe(found, case, backend)
    assert probed.probes[0].change.startswith("V-scale readout") and probed.probes[0].outcome == "fails"
    assert probed.probes[1].change.startswith("weights readout 1/1") and probed.probes[1].outcome == "fails"
    assert [p.change.split("'")[1] for p in probed.probes[2:]] == list(EVIDENCE[:2])
    assert [p.outcome for p in probed.probes[2:]] == ["fails", "fails"]
    assert probed.located is not None and probed.located.stage is None, probed.located
    assert "not a weighted sum of V's rows" in probed.located.evidence
    assert "not another entry" in probed.located.evidence
    assert not probed.refuted and probed.identified is None and probed.stage is None
    assert "to show what the failure needs" in probed.probe_note
    assert len(probe(found, case, backend, max_calls=2).probes) == 2
