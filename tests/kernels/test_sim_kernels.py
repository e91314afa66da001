"""Our kernels in pypto's SIM mode on the CPU (DAV_3510 via the overlay).

- compile sweep: the six upstream cases of SPEC §5 (s2_tile 128 and 1024) plus s2_tile 256 (the tile
  that once failed with "different OpCoreType") and 512 (slow), compile only. The default run compiles
  the three small upstream cases (b2_s1_1_s2_1k through the cost-model compile) and s2_tile 1024 at
  S2 = 2048; the three 8k upstream cases (their own static configurations: MAXB 64 and 65, 35 to 41 s
  each on 2 cores) are marked slow and compile in tox -e sim
- execute: small cases run by the calculator, held to the one acceptance rule (properties.rule.acceptance:
  the comparison under the calculator codec decides and must pass; the spec-codec one is reported and
  attributed to the backend codec, a test of its own that documents the gap)
- AT-12 variants through the at12_acceptance law (bf16, fp8 + dequant_after, a tail tile) and fp16
- every call leaves its inputs unchanged (clones taken before the call)
"""
from __future__ import annotations

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases.data.catalog import SPEC_CASE_NAMES as UPSTREAM_CASES
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.kernels.pypto_workarounds import forget_traces
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule.acceptance import call, judge, reference_backend
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import laws
from pfa_verify.properties.search.strategies import At12Case
from tests.kernels.compile_inputs import compile_inputs

pytestmark = pytest.mark.sim


def upstream_config(name: str):
    return load_catalog()[name].config


def _assert_unchanged(before: dict, after: dict, what: str):
    for name, value in before.items():
        if isinstance(value, torch.Tensor):
            cmp.assert_close(after[name], value, kind="exact", identifier=f"Input {name} after {what} vs before")


def test_small_upstream_case_reports_cost_model_figures(pypto_module):
    """The cost model's figures, and the upstream case b2_s1_1_s2_1k compiled for its own static
    configuration with its inputs unchanged (the check test_upstream_case_compiles makes, so that
    case compiles once in the default run)."""
    backend = kernels.get_backend("sim", level="compile", cost_model=True)
    config = upstream_config("pfa_fp8_b2_s1_1_s2_1k")
    kwargs = compile_inputs(config)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    report = backend.compile_paged_attention(**kwargs)
    assert report.figures.get("aicore_end_to_end", 0) > 0, report.text[-2000:]
    _assert_compiled_for(backend, config)
    _assert_unchanged(before, kwargs, "pfa_fp8_b2_s1_1_s2_1k")


def _assert_compiled_for(backend, config) -> None:
    """The compile that just returned built pypto's function of our kernel for exactly ``config``'s
    static configuration (S1, NQ, NKV, D, BS, MAXB, tiles; B and NB dynamic): a compile that returned
    without parsing the kernel, or parsed it for another configuration, fails here."""
    wrapper = backend._pfa_kernel(False)
    function, cfg = getattr(wrapper, "function", None), (getattr(wrapper, "kwargs", None) or {}).get("cfg")
    assert function is not None and "paged_attention_fp8" in repr(function) and "DYNAMIC" in repr(function), function
    g_tile = config.g_tile or config.nq // config.nkv
    assert (cfg.s1, cfg.nq, cfg.nkv, cfg.head_dim, cfg.block_size, cfg.max_blocks, cfg.g_tile, cfg.s2_tile) == (
        config.s1, config.nq, config.nkv, config.head_dim, config.block_size, config.table_columns, g_tile,
        config.s2_tile), cfg


# Compiled in the default run elsewhere (b2_s1_1_s2_1k: the cost-model test; s2_tile 1024: the s2_tile
# sweep at S2 = 2048) or large versions of static configurations the small cases already compile: slow.
SLOW_UPSTREAM = {"pfa_fp8_b16_s1_1_s2_8k_nkv_1", "pfa_fp8_b16_s1_1_s2_8k_nkv_2", "pfa_fp8_b16_s1_1_s2_8195_nkv_2",
                 "pfa_fp8_b2_s1_1_s2_1k"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_UPSTREAM else n
                                  for n in UPSTREAM_CASES])
def test_upstream_case_compiles(sim_compiler, name):
    config = upstream_config(name)
    kwargs = compile_inputs(config)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    report = sim_compiler.compile_paged_attention(**kwargs)
    print(f"{name}: compiled in {report.seconds:.1f} s, figures {report.figures}")
    _assert_compiled_for(sim_compiler, config)
    _assert_unchanged(before, kwargs, name)


# 1024 is the upstream 8k cases' tile, here over two tiles (MAXB 16 where theirs is 64)
@pytest.mark.parametrize("s2_tile, s2", [(256, 1024), pytest.param(512, 1024, marks=pytest.mark.slow), (1024, 2048)])
def test_any_s2_tile_multiple_of_block_size_compiles(sim_compiler, s2_tile, s2):
    config = golden.PagedAttentionConfig(batch=2, s1=1, s2=s2, nq=8, nkv=1, s2_tile=s2_tile)
    sim_compiler.compile_paged_attention(**compile_inputs(config))
    _assert_compiled_for(sim_compiler, config)


EXECUTE_CASES = {
    "b2_s1_1_s2_256_nq12_nkv1": dict(batch=2, s1=1, s2=256, nq=12, nkv=1),
    "ragged_causal_s1_2_tail_and_short": dict(batch=2, s1=2, s2=300, nq=8, nkv=2, kv_act_seqs=(300, 5)),
    "s2_tile_256_two_tiles_and_zero_row": dict(batch=3, s1=1, s2=512, nq=4, nkv=2, s2_tile=256,
                                               kv_act_seqs=(400, 0, 129)),
}


@pytest.fixture(scope="module", params=list(EXECUTE_CASES))
def judged(request, sim_backend):
    """The one acceptance rule (properties.rule.acceptance.judge) on a small case; the call's inputs are
    checked to come back bit-identical inside it."""
    case = Case(golden.PagedAttentionConfig(**EXECUTE_CASES[request.param]), seed=1, name=request.param)
    return judge(sim_backend, case)


def test_execute_passes_the_acceptance_rule(judged):
    """Under the calculator's codec (the backend's declared codec) the kernel is within SPEC §4."""
    assert judged.deciding.reference == "pypto-0.2.0-calculator" and judged.deciding.counts
    assert judged.passed, judged.message()


def test_the_spec_codec_comparison_is_skipped_and_said(judged):
    """The calculator's E4M3 (top binade read as 240, integer rounding) is not E4M3FN, so a spec-codec
    comparison would measure the calculator, not the kernel (SPEC §4; PYPTO_0.2.0_ON_CPU.md): the rule
    makes none, and the verdict says why in one line (--backend sim-spec-codec runs the spec's E4M3)."""
    assert [r.reference for r in judged.references] == ["pypto-0.2.0-calculator"]
    assert judged.spec_not_applicable and "sim-spec-codec" in judged.spec_not_applicable


def test_a_static_configuration_is_traced_once(sim_backend):
    """W9: a second call with the same static configuration (PagedAttentionKernelConfig) but another
    B, other lengths, another block table and another NB re-runs only the calculator, and is right."""
    first = golden.PagedAttentionConfig(batch=2, s1=1, s2=300, nq=8, nkv=2, kv_act_seqs=(300, 5))
    second = golden.PagedAttentionConfig(batch=3, s1=1, s2=384, nq=8, nkv=2, kv_act_seqs=(17, 384, 0),
                                         num_blocks=7, garbage="nan")
    forget_traces()      # whatever this worker ran before: the first call below must trace
    paths = []
    for config, seed in ((first, 1), (second, 2)):
        verdict = judge(sim_backend, Case(config, seed))
        paths.append(sim_backend.last_report.figures["path"])
        assert verdict.passed, verdict.message()
    assert paths == ["trace", "reverify"]


def test_rows_with_nothing_visible_are_zero(sim_backend):
    config = golden.PagedAttentionConfig(batch=2, s1=2, s2=128, nq=4, nkv=1, kv_act_seqs=(1, 0))
    bundle = golden.make_inputs(config, seed=2)
    out = sim_backend.paged_attention_fp8(**bundle.kwargs()).float().reshape(2, 2, 4, 128)
    assert torch.count_nonzero(out[1]) == 0 and torch.count_nonzero(out[0, 0]) == 0  # cur == 0 rows
    assert torch.count_nonzero(out[0, 1]) > 0


@pytest.mark.parametrize("fp8,k_len", [(False, 128), (False, 200), (True, 128), (True, 200)],
                         ids=["bf16-128", "bf16-200-tail", "fp8-128", "fp8-200-tail"])
def test_at12_acceptance(sim_backend, fp8, k_len):
    """The at12_acceptance law (SPEC §6) on the sim kernel: BF16, and FP8 with dequant after; 200 is a
    tail tile."""
    laws.run("at12_acceptance", sim_backend, At12Case(16, k_len, 128, "uniform", 0), fp8=fp8)


def test_at12_fp16(sim_backend):
    """FP16 operands (the law draws BF16 only): the same comparison, against the golden under the
    backend's codec, through the checked call."""
    q, k = (t.to(torch.float16) for t in At12Case(16, 256, 128, "normal", 1).operands())
    out = call(sim_backend, dict(q=q, k=k), op="qk_matmul_scale")
    cmp.assert_close(out, reference_backend(sim_backend).qk_matmul_scale(q=q, k=k), kind="at12",
                     identifier="sim AT-12 fp16 vs golden")
