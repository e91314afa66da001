"""The one acceptance rule with the envelope (SPEC §4.2; properties/rule/acceptance.py, properties/rule/compare.py).

On outlier channels (logits near 180) a correct kernel that sums MM1 in another float32 order fails
SPEC §4's tolerance alone; under the one rule it passes, and the verdict says how many elements needed
the envelope. A kernel with a real defect on the same case still fails, with how far outside the
envelope its worst element lies. An output moved just past the envelope fails; one at its edge passes.
"""
from __future__ import annotations

import torch

from pfa_verify import golden, kernels
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.case import Case as C

CASE = Case(golden.PagedAttentionConfig(batch=4, s1=3, s2=513, nq=4, nkv=1, head_dim=128, block_size=128, s2_tile=256,
                                        g_tile=1, kv_act_seqs=(513, 429, 129, 36), max_blocks=7, num_blocks=15,
                                        distribution="outlier_channels", garbage="plausible"), seed=2147483647)


class Output:
    """A backend that returns a fixed output (the golden's, moved where asked)."""

    def __init__(self, out, name="fixed"):
        self.out, self.name, self.codec = out, name, None

    def paged_attention_fp8(self, **_):
        return self.out.clone()


def test_a_correct_kernel_fails_the_tolerance_alone_and_passes_the_one_rule():
    kwargs = CASE.inputs().kwargs()
    exact = golden.paged_attention_fp8(**kwargs)
    backend = kernels.get_backend("conforming:forward")
    reordered = backend.paged_attention_fp8(**kwargs)
    assert not cmp.compare(reordered, exact, kind="attention", s1=3).passed
    verdict = judge(backend, CASE)
    assert verdict.passed
    spec = verdict.references[0]
    assert spec.comparison.by_envelope > 0
    assert f"{spec.comparison.by_envelope} element" in spec.envelope_note()
    assert "may take either of two E4M3 codes" in spec.envelope_note()


def test_a_defect_on_the_same_case_still_fails_outside_the_envelope():
    verdict = judge(kernels.get_backend("mutant:v_scale_of_next_batch"), CASE)
    assert not verdict.passed
    assert verdict.deciding.category == "kernel logic"
    assert "outside it by" in verdict.message()


def test_the_edge_of_the_envelope_passes_and_one_step_past_fails():
    kwargs = CASE.inputs().kwargs()
    env = golden.paged_attention_envelope(**kwargs)
    g = env.golden.float()
    tol = 1e-4 + g.abs() / 128
    widened = (env.hi.float() - g) > tol
    assert bool(widened.any()), "the case must have an element the envelope widens"
    at = tuple(int(i) for i in widened.nonzero()[0])
    edge = env.golden.clone()
    edge[at] = env.hi[at]
    assert judge(Output(edge), CASE).passed
    past = edge.clone()
    past[at] = torch.nextafter(env.hi[at].float(), torch.tensor(1e9)).bfloat16()
    if past[at] == env.hi[at]:   # bf16 rounding kept it: take the next bf16 value
        past[at] = (env.hi[at].view(torch.int16) + (1 if float(env.hi[at]) > 0 else -1)).view(torch.bfloat16)
    verdict = judge(Output(past), CASE)
    assert not verdict.passed and verdict.deciding.comparison.mismatched == 1


def test_the_envelope_is_built_only_for_the_rows_outside_the_tolerance():
    """SPEC §4.2: an output row's envelope depends on that row's inputs alone, so the rule builds it only
    where an element lies outside the tolerance, and says when none was needed."""
    kwargs = CASE.inputs().kwargs()
    exact = golden.paged_attention_fp8(**kwargs)
    verdict = judge(Output(exact, name="the golden"), CASE)
    assert verdict.passed and verdict.deciding.envelope is None
    assert verdict.deciding.envelope_note() == "Envelope: not needed (every element within SPEC §4's tolerance)"
    backend = kernels.get_backend("conforming:forward")
    reordered = backend.paged_attention_fp8(**kwargs)
    rows = cmp.compare(reordered, exact, kind="attention", s1=3).mismatch_mask.reshape(reordered.shape[0], -1).any(dim=1)
    verdict = judge(backend, CASE)
    env = verdict.deciding.envelope
    assert verdict.passed and env.rows == tuple(int(r) for r in rows.nonzero().reshape(-1))
    assert 0 < len(env.rows) < rows.numel(), "the case must have a row within the tolerance"
    full = golden.paged_attention_envelope(**kwargs)
    for built, whole in ((env.lo, full.lo), (env.hi, full.hi)):
        assert torch.equal(built[rows].view(torch.int16), whole[rows].view(torch.int16))
        assert bool(torch.isnan(built[~rows].float()).all())
    assert f"built for {len(env.rows)} output row" in verdict.deciding.envelope_note()


def test_a_kernel_that_halves_its_output_fails_on_degenerate_rows():
    """Logits near 1e6 (``wide``): the scores are uncertain by more than a logit and the fold's bound
    admits almost any mixture of V rows; step 8 bounds the output as a near-convex combination of the V
    rows that can matter, so a kernel that halves its output fails there under SPEC_MODEL, while the
    conforming variants pass."""
    case = C(golden.PagedAttentionConfig(batch=2, s1=1, s2=300, nq=2, nkv=1, head_dim=128, block_size=128, s2_tile=256,
                                         kv_act_seqs=(300, 140), distribution="wide"), seed=3)
    kwargs = case.inputs().kwargs()
    env = golden.paged_attention_envelope(**kwargs)
    assert env.degenerate_rows > 0
    halved = (golden.paged_attention_fp8(**kwargs).float() / 2).bfloat16()
    verdict = judge(Output(halved, name="halving"), case)
    assert not verdict.passed and verdict.deciding.category == "kernel logic"
    for name in ("vertex-mixed", "edges-up", "edges-down", "shuffled"):
        assert judge(kernels.get_backend(f"conforming:{name}"), case).passed, name
