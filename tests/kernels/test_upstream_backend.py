"""kernels/backends/upstream.py: kernels in PyPTO-Gym's calling convention, on the sim backend.

The kernel under test is tests/kernels/upstream_convention_kernels.py (ours behind the upstream
signature, and its error paths); PyPTO-Gym's own file is not in this repository."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pfa_verify import golden, kernels
from pfa_verify.cases import cli
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import KernelSource
from pfa_verify.kernels.backends.contract import capabilities_of
from pfa_verify.kernels.backends.upstream import UpstreamTileConfig, parse_name, upstream_tile_config
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.rule.case import Case

FILE = "tests/kernels/upstream_convention_kernels.py"


@pytest.mark.parametrize("name, expected", [
    ("pypto-gym:k.py", ("sim", "k.py", "pfa_func_kernel_v2_bound")),
    ("pypto-gym:dir/k.py:other", ("sim", "dir/k.py", "other")),
    ("pypto-gym:pkg.mod:fn", ("sim", "pkg.mod", "fn")),
    ("pypto-gym-npu:k.py", ("npu", "k.py", "pfa_func_kernel_v2_bound")),
    ("pypto-gym-spec-codec:k.py:fn", ("sim-spec-codec", "k.py", "fn")),
])
def test_names(name, expected):
    assert parse_name(name) == expected


@pytest.mark.parametrize("name", ["pypto-gym:", "pypto-gym", "gym:k.py", "pypto-gym-cpu:k.py"])
def test_bad_names_are_usage_errors(name):
    with pytest.raises(UsageError, match=r"must be pypto-gym:PATH.py"):
        parse_name(name)


def test_a_device_on_the_sim_is_a_usage_error():
    with pytest.raises(UsageError, match=r"device=0 applies to pypto-gym-npu:\.\.\., not 'pypto-gym:k.py'"):
        kernels.get_backend("pypto-gym:k.py", device=0)


def test_tile_configuration_follows_upstream_create_config():
    t = upstream_tile_config(g_tile=6, s2_tile=256)
    assert t == UpstreamTileConfig(6, 256, [[128, 128]] * 3, [128, 128], [[128, 128]] * 3, [128, 256])
    assert upstream_tile_config(g_tile=2, s2_tile=128, overrides={"v1_tile_shape": [128, 256]}).v1_tile_shape == [128, 256]
    with pytest.raises(UsageError, match=r"unknown field\(s\) \['v3'\]"):
        upstream_tile_config(g_tile=2, s2_tile=128, overrides={"v3": 1})


@pytest.mark.sim
@pytest.mark.parametrize("name, match", [
    ("pypto-gym:tests/kernels/nowhere.py", "no such file"),
    (f"pypto-gym:{FILE}:missing", "has no 'missing'"),
    (f"pypto-gym:{FILE}:not_a_kernel", "is a int, not a kernel function"),
    (f"pypto-gym:{FILE}:wrong_signature", r"wrong_signature\(q, k, atten_out\) is not in the upstream calling convention"),
    ("pypto-gym:no_such_package.kernel", "kernel source: cannot import module 'no_such_package.kernel'"),
], ids=["file missing", "function missing", "not a function", "wrong signature", "module missing"])
def test_loading_errors_name_the_source(pypto_module, name, match):
    with pytest.raises(UsageError, match=match):
        kernels.get_backend(name)


@pytest.mark.sim
def test_our_kernel_behind_the_upstream_signature_passes_the_rule(pypto_module):

    backend = kernels.get_backend(f"pypto-gym:{FILE}:paged_attention")
    assert backend.name == f"pypto-gym:{FILE}:paged_attention" and backend.codec is golden.PYPTO_CALCULATOR_CODEC
    config = golden.PagedAttentionConfig(batch=2, s1=2, s2=300, nq=8, nkv=2, kv_act_seqs=(300, 5), garbage="nan")
    verdict = judge(backend, Case(config, 4))
    assert verdict.passed, verdict.message()
    # a paged-attention kernel: it declares no AT-12 entry, so its AT-12 laws are not run (never a call)
    assert capabilities_of(backend).operators == ("paged_attention_fp8",)


@pytest.mark.sim
def test_a_failed_compile_is_an_error_and_the_next_case_passes(pypto_module, tmp_path):
    """Isolation: the kernel fails while traced for s2_tile 256; the run reports that case as an error
    and the next case, in the same process, passes (W7 resets pypto after the failure)."""
    report = tmp_path / "r.json"
    status = cli.main(["run", "--backend", f"pypto-gym:{FILE}:fails_on_wide_tiles", "--cases",
                       "edge_tail_tile_3_tokens,pfa_fp8_b2_s1_1_s2_1k", "--examples", "0", "--regressions",
                       str(tmp_path / "regs"), "--json", str(report)])
    results = json.loads(report.read_text())["results"]
    assert [(r["name"], r["reference"], r["verdict"], r["counts"]) for r in results] == [
        ("edge_tail_tile_3_tokens", "-", "error", True),
        ("pfa_fp8_b2_s1_1_s2_1k", "pypto-0.2.0-calculator", "pass", True)]   # no spec codec on the calculator
    assert "does not compile for s2_tile > block_size" in results[0]["message"] and status == 1


@pytest.mark.sim
def test_the_kernel_file_is_named_by_its_sha256_and_function(pypto_module):

    backend = kernels.get_backend(f"pypto-gym:{FILE}:paged_attention")
    assert backend.kernel_source == KernelSource(FILE, str(Path(FILE).resolve()),
                                                 hashlib.sha256(Path(FILE).read_bytes()).hexdigest(), "paged_attention")


@pytest.mark.sim
def test_the_spec_codec_note_names_this_backends_spec_codec_form(pypto_module):
    """The header's one line on why no spec-codec comparison is made suggests the spec-codec form of the
    backend at hand: pypto-gym-spec-codec:FILE for a PyPTO-Gym kernel, never our sim-spec-codec."""
    backend = kernels.get_backend(f"pypto-gym:{FILE}:paged_attention")
    assert f"--backend pypto-gym-spec-codec:{FILE}" in backend.spec_codec_not_applicable
    assert "sim-spec-codec" not in backend.spec_codec_not_applicable.replace("pypto-gym-spec-codec", "")
    assert "--backend sim-spec-codec" in kernels.get_backend("sim").spec_codec_not_applicable
