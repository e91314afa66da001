"""properties/diagnosis/probes.py: the kernel run on neighbours of a diagnosed case tells apart the fault models that
coincide on it, within a budget of kernel calls, and an error or a refused shape is no evidence."""
from __future__ import annotations

import pytest
import torch
from outside_defects import HandWritten

from pfa_verify import golden
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.kernels.mutants import get_mutant
from pfa_verify.properties.diagnosis import probes
from pfa_verify.properties.diagnosis.diagnosis import diagnose, diagnose_verdict
from pfa_verify.properties.diagnosis.fault_models import models_by_name
from pfa_verify.properties.diagnosis.probes import MAX_CALLS, neighbours, probe
from pfa_verify.properties.diagnosis.scoring import minus_one_reads, model_output, score
from pfa_verify.properties.rule import transforms as tf
from pfa_verify.properties.rule.acceptance import call, judge, split_bundle
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.compare import compare


def _case(lengths, *, s2_tile=16, s1=1, nq=2, nkv=1, seed=1) -> Case:
    config = golden.PagedAttentionConfig(batch=len(lengths), s1=s1, s2=max(16, *lengths), nq=nq, nkv=nkv,
                                         head_dim=16, block_size=16, s2_tile=s2_tile, kv_act_seqs=tuple(lengths))
    return Case(config, seed=seed)


class _Counting:
    """A backend that counts its calls (and raises on each when ``fail``)."""

    def __init__(self, inner, *, fail: bool = False, refuse: bool = False):
        self.inner, self.fail, self.calls, self.name = inner, fail, 0, f"counting {inner.name}"
        if refuse:
            self.skip_reason = lambda config: "not built for this shape"

    def paged_attention_fp8(self, *args, **kwargs):
        self.calls += 1
        if self.fail:
            raise RuntimeError("the device went away")
        return self.inner.paged_attention_fp8(*args, **kwargs)


def _diagnosed(defect: str, case: Case):
    verdict = judge(HandWritten(defect), case)
    assert not verdict.passed
    found = diagnose_verdict(verdict, *split_bundle(case.inputs()))
    assert found is not None
    return found


def test_a_probe_tells_apart_the_models_a_shrunk_case_cannot():
    """Lengths [0, 1] walked as batch 0's: every batch one token short and every batch batch 0's length
    coincide there; one probe with a longer batch 0 refutes the first, and the defect is named."""
    case = _case([0, 1])
    found = _diagnosed("batch_0_lengths", case)
    assert found.identified is None and "lengths_one_short" in [c.model for c in found.leading], found.render()
    probed = probe(found, case, HandWritten("batch_0_lengths"))
    assert probed.identified is not None and probed.identified.model == "lengths_of_batch_0", probed.render()
    assert "lengths_one_short" in probed.refuted and 1 <= len(probed.probes) <= MAX_CALLS
    first = probed.probes[0]
    assert first.change.startswith("kv_act_seqs[0] 0 -> ") and "lengths_one_short" in first.refuted
    assert f"probes: {first.change}: fails" in probed.render() and "lengths_one_short" in probed.render()


def test_a_probe_that_walks_minus_one_columns_does_not_refute_the_model_that_walks_them():
    """Lengths [0, 1, 32, 33] walked as batch 0's (what Hypothesis shrank batch_0_lengths to in a run):
    the probe that reverses them makes every batch walk 33 tokens, through table columns that hold -1.
    Where the kernel reads the block the golden clamps -1 to, it matches the golden there and the model
    reads unspecified data: no evidence against it. It was refuted by those elements (and by the probe
    kv_act_seqs[0] 0 -> 32), and nothing was named; now the neighbours are chosen with the -1 reads known."""
    case = _case([0, 1, 32, 33], s2_tile=32, nkv=2, nq=4)
    probed = probe(_diagnosed("batch_0_lengths", case), case, HandWritten("batch_0_lengths"))
    assert probed.probes and not any("lengths_of_batch_0" in p.refuted for p in probed.probes), probed.render()
    assert probed.identified is not None and probed.identified.model == "lengths_of_batch_0", probed.render()


def test_the_minus_one_entries_pointed_at_a_nan_block_change_only_what_reads_them():
    """pfa_verify.properties.rule.transforms.minus_one_to_garbage: the golden's output is the same bits (it never reads a -1
    column); a model that walks one token past each batch's length reads one there, and only those rows go NaN."""
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=32, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16,
                                         kv_act_seqs=(16, 5))       # batch 0 ends at a block: its next column is -1
    tensors, scalars = split_bundle(Case(config, seed=1).inputs())
    assert bool((tensors["block_table"] < 0).any())
    moved = tf.minus_one_to_garbage(tensors)
    assert torch.equal(golden.paged_attention_fp8(**moved, **scalars).view(torch.int16),
                       golden.paged_attention_fp8(**tensors, **scalars).view(torch.int16))
    longer = models_by_name()["lengths_one_long"]
    before, after = (model_output(longer, t, scalars, None) for t in (tensors, moved))
    assert bool(torch.isfinite(before.output).all())
    nan_rows = (~torch.isfinite(after.output)).flatten(1).any(1)
    assert nan_rows.tolist() == [True, False], "batch 0's row reads the -1 column; batch 1's stays in its block"


def test_a_minus_one_read_where_the_kernel_shows_the_models_value_stays_predicted():
    """The last tile read full walks into -1 columns, where the golden-level mutant clamps as the model does:
    those elements are predicted, not unspecified, and one element of a failing row the kernel got right
    (set to the golden's value) is no reason to drop the name (it was, when a -1 read was unspecified
    wherever it lay: 'not identified', the leader explaining 1 of 63)."""
    config = golden.PagedAttentionConfig(batch=3, s1=1, s2=64, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=32,
                                         kv_act_seqs=(10, 40, 64))
    tensors, scalars = split_bundle(Case(config, seed=1).inputs())
    expected = golden.paged_attention_fp8(**tensors, **scalars)
    out = call(get_mutant("tail_tile_reads_full_tile"), tensors, **scalars)
    mismatch = compare(out, expected, kind="attention").mismatch_mask
    row = int(mismatch.flatten(1).any(1).nonzero()[0, 0])
    at = tuple(mismatch[row].nonzero()[0].tolist())
    out[row][at] = expected[row][at]
    found = diagnose(out, expected, tensors, scalars)
    assert found.identified is not None and found.identified.model == "tail_tile_reads_full_tile", found.render()
    assert found.identified.broken == 0 and found.identified.unspecified_matching == 1


def test_a_kernel_that_reads_nan_through_a_minus_one_entry_is_explained_by_the_model_that_walks_there():
    """Every batch one token long, the kernel reading a block of NaN through batch 0's -1 column: the
    model (clamping to block 0) is finite there; the kernel's NaN is unspecified, not evidence against."""
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=32, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16,
                                         kv_act_seqs=(16, 5))
    tensors, scalars = split_bundle(Case(config, seed=1).inputs())
    walked = {**tensors, "kv_act_seqs": tensors["kv_act_seqs"] + 1}
    out = golden.paged_attention_fp8(**tf.minus_one_to_garbage(walked), **scalars)
    assert bool(torch.isnan(out).any())
    mismatch = compare(out, golden.paged_attention_fp8(**tensors, **scalars), kind="attention").mismatch_mask
    model = models_by_name()["lengths_one_long"]
    candidate = score(out, mismatch, minus_one_reads(model, model_output(model, tensors, scalars, None), tensors,
                                                     scalars, None), model)
    assert candidate.explains and candidate.explained == candidate.mismatched and candidate.unspecified == 32


def test_a_full_last_tile_dropped_is_confirmed_and_the_table_column_refuted():
    case = _case([32], s2_tile=32)
    probed = probe(_diagnosed("last_tile_dropped", case), case, HandWritten("last_tile_dropped"))
    assert probed.identified is not None and probed.identified.model == "last_tile_dropped_when_full", probed.render()
    assert any(p.outcome == "fails" for p in probed.probes)
    assert not {"table_column_minus_one", "partial_last_tile_dropped"} & {c.model for c in probed.standing if c.explains}


@pytest.mark.parametrize("max_calls", [0, 1, 2])
def test_the_kernel_calls_stay_within_the_budget(max_calls):
    case = _case([0, 1])
    backend = _Counting(HandWritten("batch_0_lengths"))
    probed = probe(_diagnosed("batch_0_lengths", case), case, backend, max_calls=max_calls)
    assert backend.calls == len(probed.probes) <= max_calls
    assert f"budget {max_calls} kernel calls" in probed.probe_note or not probed.probes


def test_a_kernel_that_raises_on_the_probes_refutes_nothing():
    case = _case([0, 1])
    found = _diagnosed("batch_0_lengths", case)
    probed = probe(found, case, _Counting(HandWritten("batch_0_lengths"), fail=True))
    assert probed.probes and all(p.outcome == "error" and not p.refuted for p in probed.probes)
    assert "RuntimeError: the device went away" in probed.probes[0].detail
    assert probed.standing == found.standing and probed.identified == found.identified


def test_a_shape_the_backend_refuses_is_not_probed():
    case = _case([0, 1])
    backend = _Counting(HandWritten("batch_0_lengths"), refuse=True)
    probed = probe(_diagnosed("batch_0_lengths", case), case, backend)
    assert backend.calls == 0 and not probed.probes and probed.probe_note.startswith("no probe")


def test_a_kernel_that_agrees_with_the_golden_on_the_probes_refutes_the_models():
    """The probes weigh hypotheses against what the kernel does: a kernel that is right on every neighbour
    (as a conforming one is) agrees with no defect's model there, so no model is left standing confirmed."""
    case = _case([0, 1])
    found = _diagnosed("batch_0_lengths", case)
    probed = probe(found, case, GoldenBackend())
    assert probed.probes and all(p.outcome == "passes" for p in probed.probes)
    assert probed.refuted and probed.identified is None


def test_neighbours_are_valid_cases_that_differ_from_the_case():
    case = _case([40, 7], s2_tile=32, s1=2, nq=4, nkv=2)
    seen = list(neighbours(case))
    assert len(seen) >= 8 and all((n.config, n.seed) != (case.config, case.seed) for _, n in seen)
    assert len({(n.config, n.seed) for _, n in seen}) == len(seen)
    changes = [change for change, _ in seen]
    assert "kv_act_seqs[0] 40 -> 32" in changes and "kv_act_seqs [40, 7] -> [7, 40]" in changes
    assert "nkv 2 -> 3" in changes and "seed 1 -> 2" in changes


@pytest.mark.parametrize("bad", [{"max_calls": -1}, {"max_calls": 1.5}, {"max_calls": True}, {"budget_s": -1.0},
                                 {"budget_s": "3"}])
def test_a_bad_budget_is_refused_by_name(bad):
    case = _case([0, 1])
    with pytest.raises(ValueError, match=next(iter(bad))):
        probe(_diagnosed("batch_0_lengths", case), case, HandWritten("batch_0_lengths"), **bad)


def test_a_case_the_diagnosis_screens_is_probed_on_its_first_batches(monkeypatch):
    """A probe of a large case costs what a screened model does: its neighbours are those of the case of its
    first SCREEN_BATCHES batches (the note says so); a small case is probed as it is."""
    large = Case(golden.PagedAttentionConfig(batch=5, s1=1, s2=64, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=32,
                                             kv_act_seqs=(64, 40, 17, 64, 33)), 2)
    assert probes.probed_case(large) is large                      # under SCREEN_WORK: as it is
    monkeypatch.setattr(probes, "SCREEN_WORK", 0)
    assert probes.probed_case(large).config.lengths == (64, 40, 17) and probes.probed_case(large).seed == 2
    small = Case(golden.PagedAttentionConfig(batch=2, s1=1, s2=64, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=32,
                                             kv_act_seqs=(64, 40)), 2)
    assert probes.probed_case(small) is small
