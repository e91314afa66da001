"""The npu backends end to end without a 950 (issue 19): kernels/backends/npu.py's NpuBackend and
kernels/backends/upstream.py's UpstreamNpuBackend under the torch_npu stand-in (npu_standin.py beside
this file: tensors stay on the CPU, pypto runs the kernel in SIM mode with the spec's E4M3).

Checked: device resolution (argument, pytest-xdist worker, a Ray task's one visible device), every
transfer and its direction (inputs host to device, the output allocated on the device, copied back
after a synchronize), the output sentinel, the kernel call (run mode NPU, all tensors on one device),
and the one rule on the result. Not checked, and cannot be here: the chip itself.
"""
from __future__ import annotations

import json

import npu_standin
import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases import cli
from pfa_verify.kernels.backends.contract import capabilities_of
from pfa_verify.properties.rule.acceptance import judge
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import laws
from pfa_verify.properties.search.strategies import At12Case

pytestmark = pytest.mark.sim

CASE = Case(golden.PagedAttentionConfig(batch=2, s1=1, s2=300, nq=4, nkv=1, kv_act_seqs=(300, 5), garbage="nan"), 2)
GYM = "pypto-gym-npu:tests/kernels/upstream_convention_kernels.py:paged_attention"


@pytest.fixture
def standin(pypto_module, monkeypatch):
    """The stand-in, undone after the test, in an environment that names no device."""
    for name in ("ASCEND_RT_VISIBLE_DEVICES", "TILE_FWK_DEVICE_ID", "PYTEST_XDIST_WORKER", "PFA_VERIFY_STANDIN_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return npu_standin.install(monkeypatch)


def _kinds(events) -> list:
    return [e[0] for e in events]


def test_the_npu_backend_moves_inputs_runs_the_kernel_and_copies_the_output_back(standin):
    backend = kernels.get_backend("npu")
    assert (backend.device, backend.device_source, backend.codec) == (torch.device("npu:0"), "default",
                                                                      golden.SPEC_CODEC)
    verdict = judge(backend, CASE)
    assert verdict.passed, verdict.message()
    assert [r.reference for r in verdict.references] == ["spec"]            # one codec, the spec's, counts
    assert _kinds(standin) == ["alloc"] + ["h2d"] * 8 + ["kernel", "sync", "d2h"]
    assert {e[1] for e in standin if e[0] != "kernel"} == {0}
    inputs = CASE.inputs()
    assert [e[2:] for e in standin[1:9]] == [(tuple(t.shape), str(t.dtype)) for t in (
        inputs.q, inputs.q_scale, inputs.k_cache, inputs.k_scale, inputs.v_cache, inputs.v_scale, inputs.block_table,
        inputs.kv_act_seqs)]                                                           # every input, host to device
    _, name, mode, places = standin[9]
    assert (name, mode, places) == ("paged_attention_fp8_body", "NPU", (0,) * 9)
    assert standin[0][2:] == (tuple(inputs.q.shape), "torch.int16")       # out, on the device: sentinel bits
    assert standin[-1][2:] == (tuple(inputs.q.shape), "torch.bfloat16")   # and back, after the synchronize


@pytest.mark.parametrize("environ, index, source", [
    ({"PYTEST_XDIST_WORKER": "gw3"}, 3, "PYTEST_XDIST_WORKER"),
    ({"TILE_FWK_DEVICE_ID": "6", "PYTEST_XDIST_WORKER": "gw3"}, 6, "TILE_FWK_DEVICE_ID"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "5", "TILE_FWK_DEVICE_ID": "5"}, 0, ("ASCEND_RT_VISIBLE_DEVICES=5 (the one NPU "
                                                                       "this process sees)")),
], ids=["xdist worker gw3", "TILE_FWK_DEVICE_ID", "a Ray task given NPU 5"])
def test_each_worker_finds_its_device(standin, monkeypatch, environ, index, source):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    backend = kernels.get_backend("npu")
    assert (backend.device_index, backend.device_source) == (index, source)
    assert judge(backend, CASE).passed
    assert {e[1] for e in standin if e[0] in ("h2d", "alloc", "sync", "d2h")} == {index}


@pytest.mark.parametrize("environ, match", [
    ({"PYTEST_XDIST_WORKER": "gw9"}, r"device 9 \(from PYTEST_XDIST_WORKER\) does not exist; this host has 8 NPU"),
    ({"PFA_VERIFY_STANDIN_DEVICES": "0"}, "torch_npu is installed but no NPU is available"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "2,3", "TILE_FWK_DEVICE_ID": "2"}, (r"device 2 \(from TILE_FWK_DEVICE_ID\) does "
                                                                       r"not exist; this host has 2 NPU")),
], ids=["worker past the devices", "no device", "a physical id among two visible"])
def test_a_device_that_is_not_there_is_unavailable_with_the_reason(standin, monkeypatch, environ, match):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(kernels.BackendUnavailable, match=match):
        kernels.get_backend("npu")


def test_a_kernel_that_writes_nothing_is_a_kernel_run_error(standin, monkeypatch):
    monkeypatch.setattr(npu_standin._NpuKernel, "__call__", lambda self, *args: None)
    backend = kernels.get_backend("npu")
    with pytest.raises(kernels.KernelRunError, match=r"left .* output elements it must compute unwritten"):
        backend.paged_attention_fp8(**CASE.inputs().kwargs())


def test_at12_runs_on_the_npu_backend(standin):
    backend = kernels.get_backend("npu")
    laws.run("at12_acceptance", backend, At12Case(4, 40, 128, "uniform", 3), fp8=True)
    assert _kinds(standin) == ["alloc", "h2d", "h2d", "h2d", "h2d", "kernel", "sync", "d2h"]


def test_pypto_gym_s_convention_runs_on_the_npu_backend(standin):
    backend = kernels.get_backend(GYM)
    verdict = judge(backend, CASE)
    assert verdict.passed, verdict.message()
    kernel = next(e for e in standin if e[0] == "kernel")
    assert kernel[1:3] == ("paged_attention", "NPU") and kernel[3] == (0,) * 9
    assert _kinds(standin) == ["alloc"] + ["h2d"] * 8 + ["kernel", "sync", "d2h"]
    assert capabilities_of(backend).operators == ("paged_attention_fp8",)     # no AT-12 entry: its laws not run


def test_a_run_on_the_npu_backend_reports_the_spec_codec_only(standin, tmp_path):
    """pfa-verify run on the stand-in: the one rule, one comparison per case, a pass."""

    report = tmp_path / "r.json"
    # --in-process: the stand-in torch_npu is installed in this process only, not in a worker's
    status = cli.main(["run", "--backend", "npu", "--in-process", "--cases", "edge_lengths_0_1_bs_bs1,edge_constant_rows",
                       "--examples", "0", "--regressions", str(tmp_path / "regs"), "--json", str(report)])
    data = json.loads(report.read_text())
    assert status == 0 and [(r["reference"], r["verdict"]) for r in data["results"]] == [("spec", "pass")] * 2


def test_a_host_tensor_never_reads_as_on_the_device(standin):
    """A device tensor's address is held while it is recorded: a host tensor allocated after the device
    tensor is freed (the allocator reuses addresses) must not read as on the device, or its ``.cpu()``
    is recorded as a copy back (a flake seen under pytest-xdist, where an earlier test's tensor had been
    recorded at the address of a later test's block table)."""
    reused = 0
    for rows in range(1, 200):          # some sizes get the freed address back at once (5 of these did)
        freed = torch.zeros(rows, 3, dtype=torch.int32)     # the premise, shown on a plain host tensor
        address = freed.untyped_storage().data_ptr()
        del freed
        reused += torch.zeros(rows, 3, dtype=torch.int32).untyped_storage().data_ptr() == address
        moved = torch.zeros(rows, 3, dtype=torch.int32).to("npu:0")
        assert npu_standin._where(moved) == 0
        del moved
        host = torch.zeros(rows, 3, dtype=torch.int32)
        assert npu_standin._where(host) is None
        host.cpu()
    assert reused > 0, "the allocator never reused a freed address: this test would check nothing"
    assert [e for e in standin if e[0] == "d2h"] == []
