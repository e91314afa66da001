"""kernels/pypto_workarounds/: each pypto 0.2.0 workaround, proved on the CPU (W1-W10)."""
# No `from __future__ import annotations`: pypto.frontend.jit reads tensor annotations as objects.

import sys
import types
from pathlib import Path

import pytest
import torch

from pfa_verify.kernels import pypto_workarounds as pw
from pfa_verify.kernels.pypto_workarounds import bridge

pytestmark = pytest.mark.sim


def _axpy_kernel(pypto, n: int, *, fail: bool = False):
    """out = 2 * x + y on [8, n] with pass verify; with fail=True no tile shape is set, which pypto
    only notices deep in the pass pipeline (F21004 "tile shape not set")."""

    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM},
                        verify_options={"enable_pass_verify": True, "pass_verify_pass_filter": []})
    def axpy(x: pypto.Tensor((8, n), pypto.DT_FP32), y: pypto.Tensor((8, n), pypto.DT_FP32),
             out: pypto.Tensor((8, n), pypto.DT_FP32)):
        if not fail:
            pypto.set_vec_tile_shapes(8, n)
        out[:] = pypto.add(pypto.mul(x, 2.0), y)

    return axpy


def test_merge_ini_replaces_and_appends_keys():
    base = "# c\n[version]\nNpuArch=2201\nSoC_version=A\n\n[AICoreSpec]\nub_size=1\nkeep=2\n"
    merged = pw.overlay._merge_ini(base, "[version]\nNpuArch=3510\n[AICoreSpec]\nub_size=9\nnew_key=5\n")
    assert merged.splitlines() == ["# c", "[version]", "NpuArch=3510", "SoC_version=A", "",
                                   "[AICoreSpec]", "ub_size=9", "keep=2", "new_key=5"]


def test_overlay_reports_dav_3510(pypto_module):
    """W1: imported from the overlay, the simulator platform is the 950PR."""
    assert str(pypto_module.platform.npuarch) == "DAV_3510"
    assert str(pw.cache_root()) in pypto_module.__file__
    ini = Path(pypto_module.__file__).parent / "lib" / "configs" / "A2A3.ini"
    assert not ini.is_symlink() and "NpuArch=3510" in ini.read_text()
    assert (Path(pypto_module.__file__).parent / "pypto_impl.cpython-311-x86_64-linux-gnu.so").is_symlink() \
        or any(p.is_symlink() for p in Path(pypto_module.__file__).parent.glob("pypto_impl*.so"))


def test_fp8_dtype_mapping(pypto_module):
    """W2: pass verify's host copies can be made for FP8 tensors."""
    from pypto.converter import _torch_dtype_from

    assert _torch_dtype_from(pypto_module.DT_FP8E4M3) is torch.float8_e4m3fn
    assert _torch_dtype_from(pypto_module.DT_FP8E5M2) is torch.float8_e5m2
    assert _torch_dtype_from(pypto_module.DT_FP32) is torch.float32


def test_execute_uses_real_inputs_and_keeps_them(pypto_module):
    """W3: the calculator computes from the caller's tensors and leaves them intact."""
    x = torch.randn(8, 64)
    y = torch.randn(8, 64)
    x0, y0 = x.clone(), y.clone()
    out = torch.zeros(8, 64)
    with pw.sim_session():
        _axpy_kernel(pypto_module, 64)(x, y, out)
    assert torch.equal(x, x0) and torch.equal(y, y0), "pass verify changed the inputs"
    assert torch.equal(out, 2 * x0 + y0)


def test_calculator_cached_on_disk(pypto_module):
    """W4: the calculator library is built once per (pypto, torch, ABI) and then only loaded."""
    lib, seconds = pw.build_calculator()
    assert lib.exists() and str(pw.cache_root()) in str(lib)
    assert seconds == 0.0, "a second build_calculator() must find the cached library"
    from pypto._utils import BuildOnlineManager

    BuildOnlineManager().build_and_load_calculator()  # 0.2.0's entry point now returns at once
    assert BuildOnlineManager().calculator_loaded


def test_run_leaves_no_output_folder(pypto_module, tmp_path, monkeypatch):
    """W5: a SIM run writes its output/ folder into a private temporary directory."""
    monkeypatch.chdir(tmp_path)
    with pw.sim_session() as run:
        _axpy_kernel(pypto_module, 32)(torch.ones(8, 32), torch.ones(8, 32), torch.zeros(8, 32))
        inside = Path.cwd()
    assert inside != tmp_path and not inside.exists()
    assert Path.cwd() == tmp_path and list(tmp_path.iterdir()) == []
    assert run.seconds > 0


def test_compile_captures_cost_model_text(pypto_module, capfd):
    """W6: pypto's prints go to the capture, not to the terminal; cost figures are parsed."""
    x = torch.ones(8, 32)
    with pw.sim_session(cost_model=True) as run:
        _axpy_kernel(pypto_module, 32)(x, x.clone(), torch.zeros(8, 32))
    printed = capfd.readouterr()
    assert "AICore" not in printed.out + printed.err
    assert "AICore End-to-End Time" in run.text
    assert run.figures["aicore_end_to_end"] > 0


def test_compile_after_failed_compile(pypto_module):
    """W7: a compile that fails leaves pypto usable for the next one."""
    x = torch.ones(8, 16)
    with pytest.raises(Exception, match=r"F21004|tile shape") as info:
        with pw.sim_session():
            _axpy_kernel(pypto_module, 16, fail=True)(x, x.clone(), torch.zeros(8, 16))
    notes = [n for n in getattr(info.value, "__notes__", []) if "pypto output" in n]
    assert all(n.split(":\n", 1)[1].strip() for n in notes), f"an empty pypto-output note: {notes}"
    out = torch.zeros(8, 16)
    with pw.sim_session():
        _axpy_kernel(pypto_module, 16)(x, x.clone(), out)
    assert torch.equal(out, torch.full((8, 16), 3.0))


def test_load_pypto_refuses_a_pypto_imported_elsewhere(monkeypatch):
    """Importing pypto before the overlay would bind the 910B platform: say so instead."""

    fake = types.ModuleType("pypto")
    fake.__file__ = "/somewhere/else/pypto/__init__.py"
    monkeypatch.setitem(sys.modules, "pypto", fake)
    monkeypatch.setattr(pw._common, "STATE", {})
    with pytest.raises(pw.PyptoUnavailable, match="before the 950PR overlay"):
        pw.load_pypto()


def test_cost_model_is_optional(pypto_module):
    """W8: a compile-only run can skip the cost model; it then prints no cost figures and, as
    measured, the calculator's output does not reach `out` (0.2.0 copies it back only there; W9's
    execute_kernel copies it back itself)."""
    x = torch.randn(8, 32)
    out = torch.zeros(8, 32)
    with pw.sim_session(cost_model=False) as run:
        _axpy_kernel(pypto_module, 32)(x, x.clone(), out)
    assert "AICore End-to-End Time" not in run.text
    assert torch.count_nonzero(out) == 0


def test_execute_reuses_the_traced_graph(pypto_module):
    """W9: the first call of a static signature traces (no pass pipeline, no cost model), the next
    ones re-run only the calculator on their own tensors; another kernel in between invalidates the
    kept graph, which is then traced again. Every result is the kernel's, every input intact."""
    first, other = _axpy_kernel(pypto_module, 64), _axpy_kernel(pypto_module, 32)
    paths = []
    for wrapper, n, seed in ((first, 64, 0), (first, 64, 1), (other, 32, 2), (first, 64, 3), (first, 64, 4)):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(8, n, generator=g), torch.randn(8, n, generator=g)
        x0, y0 = x.clone(), y.clone()
        out = torch.full((8, n), float("nan"))
        with pw.sim_session() as run:
            paths.append(pw.execute_kernel(wrapper, [x, y, out]))
        assert torch.equal(out, 2 * x0 + y0) and torch.equal(x, x0) and torch.equal(y, y0)
        assert "AICore End-to-End Time" not in run.text     # no cost model
    assert paths == ["trace", "reverify", "trace", "trace", "reverify"]


def _fp8_copy_kernel(pypto):
    @pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM},
                        verify_options={"enable_pass_verify": True, "pass_verify_pass_filter": []})
    def fp8_copy(x: pypto.Tensor((2, 128), pypto.DT_FP8E4M3), out: pypto.Tensor((2, 128), pypto.DT_FP8E4M3)):
        pypto.set_vec_tile_shapes(2, 128)
        out[:] = pypto.view(x, [2, 128], [0, 0])

    return fp8_copy


def test_fp8_copies_keep_their_bytes(pypto_module):
    """W10: an FP8 copy inside the calculator keeps every one of the 256 codes' bytes (0.2.0 decoded
    and re-encoded them, turning every code it reads as +-240 into 0x7E / 0xFE)."""
    expected = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(2, 128)
    codes = expected.clone()
    out = torch.zeros(2, 128, dtype=torch.uint8)
    with pw.sim_session():
        pw.execute_kernel(_fp8_copy_kernel(pypto_module), [codes.view(torch.float8_e4m3fn), out.view(torch.float8_e4m3fn)])
    assert torch.equal(codes, expected), "the kernel's input changed"
    assert torch.equal(out, expected), (out != expected).nonzero().flatten().tolist()[:8]


def test_precision_type_bridge(pypto_module):
    """W11: pypto.PrecisionType exists and pypto.div takes precision_type= (dropped: 0.2.0 has one
    division); anything but a PrecisionType there is a TypeError. A kernel using it computes as without."""
    assert hasattr(pypto_module, "PrecisionType") and pypto_module.PrecisionType.INTRINSIC

    @pypto_module.frontend.jit(runtime_options={"run_mode": pypto_module.RunMode.SIM},
                               verify_options={"enable_pass_verify": True, "pass_verify_pass_filter": []})
    def ratio(x: pypto_module.Tensor((8, 32), pypto_module.DT_FP32), y: pypto_module.Tensor((8, 32), pypto_module.DT_FP32),
              out: pypto_module.Tensor((8, 32), pypto_module.DT_FP32)):
        pypto_module.set_vec_tile_shapes(8, 32)
        out[:] = pypto_module.div(x, y, precision_type=pypto_module.PrecisionType.INTRINSIC)

    x0, y0 = torch.randn(8, 32), torch.rand(8, 32) + 0.5
    x, y = x0.clone(), y0.clone()
    out = torch.zeros(8, 32)
    with pw.sim_session():
        pw.execute_kernel(ratio, [x, y, out])
    assert torch.equal(x, x0) and torch.equal(y, y0), "the kernel's inputs changed"
    assert torch.equal(out, x0 / y0)
    assert pypto_module.PrecisionType is bridge.PrecisionType
    with pytest.raises(TypeError, match=r"must be a pypto.PrecisionType"):
        pypto_module.div(None, None, precision_type="fast")
