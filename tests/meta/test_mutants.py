"""Tests of the suite itself (issue 12): within the ci profile's budget (20 examples per law), every
golden-level mutant is killed by some law, the unmutated reference never fails one, the reference is
the golden bit for bit, and every mutant listed as equivalent is indeed equivalent on the laws' examples.

The known survivors are the ledger's (properties/rule/ledger.py, kind "survivor", each with its reason and
issue): each runs as a strict xfail, so the day a law kills one, this test fails and says to remove its
entry. A survivor spends the whole budget of every law (20 s for one), so the survivors are marked slow
and run in tox -e mutants; the default run keeps every mutant that must be killed."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_marks import survivor_params

from pfa_verify import golden
from pfa_verify.cases.measuring import mutants as matrix
from pfa_verify.golden import PagedAttentionConfig
from pfa_verify.golden.matmul import exact_matmul
from pfa_verify.kernels import KernelRunError
from pfa_verify.kernels.mutants import MUTANTS, get_mutant, kernel_level
from pfa_verify.kernels.mutants.staged import StagedGolden
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import call, split_bundle
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import law_examples

GOLDEN = [m.name for m in MUTANTS.values() if m.level == "golden" and m.equivalent is None]
EQUIVALENT = [m.name for m in MUTANTS.values() if m.level == "golden" and m.equivalent is not None]
EXAMPLES = 20   # the ci profile's max_examples


def _survivors_slow(params: list) -> list:
    """``params`` with the ledger's survivors (the strict xfails) also marked slow."""
    return [pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow]) if p.marks else p for p in params]


def test_the_catalog_has_the_mutants_the_issue_asks_for():
    assert len(GOLDEN) >= 16 and all(MUTANTS[n].bug for n in GOLDEN)
    for name in ("causal_offset_ignored", "wrong_batch_length", "v_scale_per_token", "tail_tile_reads_full_tile",
                 "table_column_off_by_one", "gqa_head_modulo", "missing_o_rescale", "missing_l_rescale",
                 "no_max_subtraction", "e4m3_truncating_cast", "empty_rows_nan", "p_quantized_per_tensor"):
        assert name in MUTANTS
    assert all(MUTANTS[n].equivalent for n in EQUIVALENT) and "p_quantized_per_tensor" in EQUIVALENT


def test_the_reference_never_fails_a_law():
    base = matrix._one(None, level="golden", examples=EXAMPLES, seed=0, laws=law_examples.PAGED_LAWS, catalog=False,
                       shrink_s=0)
    assert not base.killed, [(c.law, c.message) for c in base.cells if c.killed]


@pytest.mark.parametrize("name", _survivors_slow(survivor_params(GOLDEN)))
def test_every_golden_mutant_is_killed_within_the_ci_budget(name):
    result = matrix._one(name, level="golden", examples=EXAMPLES, seed=0, laws=law_examples.PAGED_LAWS, catalog=False,
                         shrink_s=5, first_kill_only=True)
    assert result.killed, f"{name} survived every law with {EXAMPLES} examples each"
    first = result.first_kill
    assert first.examples <= EXAMPLES and first.counterexample is not None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(example=law_examples.examples("acceptance"), name=st.sampled_from(EQUIVALENT + ["none"]))
def test_the_reference_and_the_equivalent_mutants_are_the_golden_bit_for_bit(example, name):
    case, _ = example
    tensors, scalars = split_bundle(case.inputs())
    out = call(get_mutant(name), tensors, **scalars)     # on clones, and the inputs must come back unchanged
    cmp.assert_close(out, golden.paged_attention_fp8(**tensors, **scalars), kind="exact",
                     identifier=f"mutant {name} vs golden")


def test_kernel_mutants_change_one_snippet_of_a_copy_never_the_kernel_file():
    source = kernel_level._SOURCE.read_bytes()
    for name, mutant in kernel_level.KERNEL_MUTANTS.items():
        text = kernel_level.mutated_source(name)
        assert text != source.decode() and text.count(mutant.new) >= 1 and mutant.bug
        compile(text, f"pfa_fp8_{name}.py", "exec")       # the copy is Python: a SyntaxError fails here
    assert kernel_level._SOURCE.read_bytes() == source
    with pytest.raises(ValueError, match="kernel mutant 'nope' is not in the catalog"):
        kernel_level.mutated_source("nope")


class _Raises(StagedGolden):
    """A backend whose every paged-attention call raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def _paged_attention(self, dims, *tensors):
        raise self.error


def test_a_kernel_run_error_is_a_kill_by_error():
    error = KernelRunError("the kernel left 3 of 48 output elements it must compute unwritten")
    for cell in (matrix.search("acceptance", _Raises(error), examples=3, seed=0), matrix.catalog_kill(_Raises(error))):
        assert cell.killed and cell.by == "error" and cell.examples == 1, cell
        assert cell.message.startswith("KernelRunError: the kernel left 3") and matrix._cell_text(cell) == "error@1"


@pytest.mark.parametrize("error", [TypeError("a bug of the suite"), ValueError("the mutated module does not import"),
                                   RuntimeError("function nested is not allowed")], ids=lambda e: type(e).__name__)
def test_any_other_exception_is_not_a_kill(error):
    """Only a law's failure or a KernelRunError kills; anything else propagates, and the row that raised
    it is broken (reported with the error, exit 1), so it can never raise the kill ratio."""
    with pytest.raises(type(error), match=str(error)):
        matrix.search("acceptance", _Raises(error), examples=3, seed=0)
    with pytest.raises(type(error), match=str(error)):
        matrix.catalog_kill(_Raises(error))


def test_a_zero_sum_is_plus_zero_in_every_route():
    """Found by the test above under the dev profile: on `wide` logits a one-token tile's MM2 is a single
    product -0 for some channels; the staged golden's float64 matmul returned -0, the vectorized golden's +0.
    Every route now adds +0 to its exact sums (golden/matmul.py), so the reference and the equivalent
    mutants are the golden bit for bit there too."""
    p8, v = torch.full((4, 1), 448.0), torch.zeros((1, 64))
    v[0, 5] = -0.0
    assert bool(torch.signbit(torch.matmul(p8.double(), v.double()))[0, 5])       # the library gives -0 here
    assert not bool(torch.signbit(exact_matmul(p8, v))[0, 5])                    # the golden's sum is +0
    table = ((-1,) * 10, (-1,) * 10, tuple(range(10)), (10, 11) + (-1,) * 8)
    config = PagedAttentionConfig(batch=4, s1=2, s2=640, nq=4, nkv=1, head_dim=64, block_size=64, s2_tile=64,
                                  kv_act_seqs=(0, 0, 640, 65), max_blocks=10, num_blocks=12, distribution="wide",
                                  block_table=table)
    tensors, scalars = split_bundle(Case(config, 63).inputs())
    expected = golden.paged_attention_fp8(**tensors, **scalars)
    for name in ("none", "p_scale_of_another_row"):
        out = call(get_mutant(name), tensors, **scalars)
        cmp.assert_close(out, expected, kind="exact", identifier=f"mutant {name} vs golden")
