"""Our kernels in pypto's SIM mode on the CPU (DAV_3510 via the overlay).

- compile sweep: the six upstream cases of SPEC §5 (s2_tile 128 and 1024) plus s2_tile 256 (the tile
  that once failed with "different OpCoreType") and 512 (slow), compile only
- execute: small cases run by the calculator, held to the one acceptance rule (properties.acceptance:
  the comparison under the calculator codec decides and must pass; the spec-codec one is reported and
  attributed to the backend codec, a test of its own that documents the gap)
- AT-12 variants (bf16, fp16, fp8 + dequant_after, a tail tile)
- every call leaves its inputs unchanged (clones taken before the call)
"""
from __future__ import annotations

import pytest
import torch

import golden
from properties import compare as cmp
from properties.acceptance import judge
from properties.case import Case
from cases.catalog import SPEC_CASE_NAMES as UPSTREAM_CASES
from cases.catalog import load_catalog
from kernels.compile_inputs import compile_inputs

pytestmark = pytest.mark.sim


def upstream_config(name: str):
    return load_catalog()[name].config


def _assert_unchanged(before: dict, after: dict, call: str):
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            cmp.assert_close(after[name], value, kind="exact", identifier=f"Input {name} after {call} vs before")


def test_small_upstream_case_reports_cost_model_figures(pypto_module):
    import kernels

    backend = kernels.get_backend("sim", level="compile", cost_model=True)
    report = backend.compile_paged_attention(**compile_inputs(upstream_config("pfa_fp8_b2_s1_1_s2_1k")))
    assert report.figures.get("aicore_end_to_end", 0) > 0, report.text[-2000:]


@pytest.mark.parametrize("name", list(UPSTREAM_CASES))
def test_upstream_case_compiles(sim_compiler, name):
    config = upstream_config(name)
    kwargs = compile_inputs(config)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    report = sim_compiler.compile_paged_attention(**kwargs)
    print(f"{name}: compiled in {report.seconds:.1f} s, figures {report.figures}")
    _assert_unchanged(before, kwargs, name)


@pytest.mark.parametrize("s2_tile", [256, pytest.param(512, marks=pytest.mark.slow)])
def test_any_s2_tile_multiple_of_block_size_compiles(sim_compiler, s2_tile):
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=1024, nq=8, nkv=1, s2_tile=s2_tile)
    sim_compiler.compile_paged_attention(**compile_inputs(config))


EXECUTE_CASES = {
    "b2_s1_1_s2_256_nq12_nkv1": dict(batch=2, s1=1, s2=256, nq=12, nkv=1),
    "ragged_causal_s1_2_tail_and_short": dict(batch=2, s1=2, s2=300, nq=8, nkv=2, kv_act_seqs=(300, 5)),
    "s2_tile_256_two_tiles_and_zero_row": dict(batch=3, s1=1, s2=512, nq=4, nkv=2, s2_tile=256,
                                               kv_act_seqs=(400, 0, 129)),
}


@pytest.fixture(scope="module", params=list(EXECUTE_CASES))
def judged(request, sim_backend):
    """The one acceptance rule (properties.acceptance.judge) on a small case; the call's inputs are
    checked to come back bit-identical inside it."""
    case = Case(golden.PagedAttentionConfig(**EXECUTE_CASES[request.param]), seed=1, name=request.param)
    return judge(sim_backend, case)


def test_execute_passes_the_acceptance_rule(judged):
    """Under the calculator's codec (the backend's declared codec) the kernel is within SPEC §4."""
    assert judged.deciding.reference == "pypto-0.2.0-calculator" and judged.deciding.counts
    assert judged.passed, judged.message()


def test_spec_codec_difference_is_the_backend_codec(judged, record_property):
    """The spec-codec comparison, not hidden: on the calculator it fails SPEC §4 because the
    calculator's E4M3 (top binade read as 240, integer rounding) is not E4M3FN, and the rule says so."""
    spec = judged.references[0]
    record_property("spec_codec_max_abs", spec.comparison.max_abs_err)
    print(f"{judged.case_label}: vs spec codec max abs {spec.comparison.max_abs_err:.3e}, "
          f"{spec.comparison.mismatched}/{spec.comparison.total} mismatched")
    assert not spec.passed, "the calculator now agrees with the spec codec: revisit PYPTO_CALCULATOR_CODEC"
    assert (spec.category, spec.counts) == ("backend codec", False)


def test_rows_with_nothing_visible_are_zero(sim_backend):
    config = golden.PagedAttentionConfig(batch=2, s1=2, s2=128, nq=4, nkv=1, kv_act_seqs=(1, 0))
    bundle = golden.make_inputs(config, seed=2)
    out = sim_backend.paged_attention_fp8(**bundle.kwargs()).float().reshape(2, 2, 4, 128)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(out[0, 0]) == 0  # cur == 0 rows
    assert torch.count_nonzero(out[0, 1]) > 0


def _at12_inputs(kind: str, k_len: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(16, 128, generator=g) * 2 - 1
    k = torch.rand(k_len, 128, generator=g) * 2 - 1
    if kind == "fp8":
        codec = golden.PYPTO_CALCULATOR_CODEC
        q_scale = q.abs().amax(-1, keepdim=True) / 448
        k_scale = k.abs().amax(-1, keepdim=True) / 448
        return dict(q=codec.to_fp8(q / q_scale), k=codec.to_fp8(k / k_scale), q_scale=q_scale, k_scale=k_scale)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[kind]
    return dict(q=q.to(dtype), k=k.to(dtype))


@pytest.mark.parametrize("kind,k_len", [("bf16", 128), ("bf16", 200), ("fp16", 256), ("fp8", 128), ("fp8", 200)],
                         ids=lambda v: str(v))
def test_at12_matches_golden(sim_backend, kind, k_len):
    kwargs = _at12_inputs(kind, k_len)
    before = {k: v.clone() for k, v in kwargs.items()}
    out = sim_backend.qk_matmul_scale(**kwargs)
    expected = golden.qk_matmul_scale(**before, codec=golden.PYPTO_CALCULATOR_CODEC)
    cmp.assert_close(out, expected, identifier=f"sim AT-12 {kind} k_len={k_len}", kind="at12")
    _assert_unchanged(before, kwargs, f"sim qk_matmul_scale {kind}")
