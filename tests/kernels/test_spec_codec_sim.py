"""The sim-spec-codec backend: our kernel in pypto's calculator with the spec's E4M3 (W13, SPEC §3).

Correct kernels must pass under it, and it must see what the plain sim cannot: the kernel mutant
``p_clamped_to_240`` only changes P codes worth 256 to 448, which pypto's own E4M3 reads as 240 anyway.
"""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.model import DETERMINISTIC_MODEL
from pfa_verify.kernels.mutants import get_mutant
from pfa_verify.properties.rule.acceptance import judge

pytestmark = pytest.mark.sim

CASES = ("edge_tail_tile_3_tokens", "edge_ragged_causal_s1_2", "pfa_fp8_b2_s1_1_s2_1k")


@pytest.fixture(scope="module")
def spec_sim(pypto_module):
    return kernels.get_backend("sim-spec-codec")


def _catalog(name):
    return load_catalog()[name]


def test_the_variant_names_its_codec_and_the_plain_sim_says_why_the_spec_comparison_is_not_its(spec_sim, sim_backend):

    assert (spec_sim.name, spec_sim.codec, spec_sim.spec_codec_not_applicable) == ("sim-spec-codec", golden.SPEC_CODEC, None)
    assert sim_backend.codec is golden.PYPTO_CALCULATOR_CODEC
    assert "read as 240" in sim_backend.spec_codec_not_applicable and "sim-spec-codec" in sim_backend.spec_codec_not_applicable
    assert spec_sim.model is DETERMINISTIC_MODEL and sim_backend.model is DETERMINISTIC_MODEL
    with pytest.raises(UsageError, match="sim-spec-codec is the sim with e4m3='spec'"):
        kernels.get_backend("sim-spec-codec", e4m3="pypto")
    with pytest.raises(UsageError, match=r"spec-codec:tests/kernels/upstream_convention_kernels.py is the pypto-gym:\.\.\. with"):
        kernels.get_backend("pypto-gym-spec-codec:tests/kernels/upstream_convention_kernels.py", e4m3="pypto")
    for options, message in (({"level": "nope"}, "level='nope' must be one of"), ({"e4m3": "ocp"}, "e4m3='ocp' must be"),
                             ({"cost_model": True}, "cost_model=True applies to level='compile'")):
        with pytest.raises(UsageError, match=message):
            kernels.get_backend("sim", **options)
    with pytest.raises(UsageError, match="applies to the npu backend only"):
        kernels.get_backend("sim-spec-codec", device=0)


@pytest.mark.parametrize("name", CASES)
def test_our_kernel_passes_under_the_spec_codec(spec_sim, name):

    case = _catalog(name)
    q = case.inputs().q.view(torch.uint8)
    assert bool((((q >> 3) & 0xF) == 0xF).any()), "no code of the top binade: the case would not test W13"
    verdict = judge(spec_sim, case)
    assert verdict.passed and [r.reference for r in verdict.references] == ["spec"], verdict.message()


def test_a_mutant_only_the_spec_codec_sees(spec_sim, sim_backend):
    """p_clamped_to_240: on the plain sim its output is our kernel's, bit for bit (it survives there);
    on sim-spec-codec it fails SPEC §4 (killed)."""

    case = _catalog("pfa_fp8_b2_s1_1_s2_1k")
    on_spec = get_mutant("sim/p_clamped_to_240")
    assert on_spec.codec is golden.SPEC_CODEC
    verdict = judge(on_spec, case)
    assert not verdict.passed and verdict.references[0].category == "kernel logic", verdict.message()
    on_plain = get_mutant("sim/p_clamped_to_240", e4m3="pypto")
    mutated = on_plain.paged_attention_fp8(**case.inputs().kwargs())
    ours = sim_backend.paged_attention_fp8(**case.inputs().kwargs())
    assert torch.equal(mutated.view(torch.int16), ours.view(torch.int16))
    assert judge(on_plain, case).passed
