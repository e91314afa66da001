"""The backend interface without a device: get_backend, argument checks, device choice, skip reasons.

Nothing here needs pypto or an NPU. Argument checks run through a recording backend whose kernel
part only records that it was reached, so each bad call must be stopped by golden.validate first.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels import backends
from pfa_verify.kernels.backends import Backend, BackendUnavailable, KernelSource, resolve_device_index
from pfa_verify.kernels.config import PagedAttentionKernelConfig
from pfa_verify.properties.rule import compare as cmp


class RecordingBackend(Backend):
    """Validates like every backend, then records the call instead of running a kernel."""

    name = "recording"

    def __init__(self, **options) -> None:
        self.codec = golden.SPEC_CODEC
        self.options = options
        self.calls = []

    def _paged_attention(self, dims, *tensors):
        self.calls.append(("paged_attention_fp8", dims))
        return torch.zeros(tensors[0].shape, dtype=torch.bfloat16)

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        self.calls.append(("qk_matmul_scale", scale))
        return torch.zeros(q.shape[0], k.shape[0])


def make_recording_backend(**options):
    return RecordingBackend(**options)


def e(func_name: str, **kwargs) -> str:
    """A test id that reads as the call: paged_attention_fp8(s2_tile=200)."""
    return f"{func_name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def _replace(kw: dict, **changes) -> dict:
    out = dict(kw)
    for key, fn in changes.items():
        out[key] = fn(out[key]) if callable(fn) else fn
    return out


BAD_PAGED_ATTENTION_CALLS = [
    (dict(s2_tile=200), ValueError),
    (dict(s2_tile=0), ValueError),
    (dict(g_tile=3), ValueError),
    (dict(q=lambda t: t.float()), TypeError),
    (dict(k_cache=lambda t: t.float()), TypeError),
    (dict(v_cache=lambda t: t[:, :, :, :64].contiguous()), ValueError),
    (dict(block_table=lambda t: t.long()), TypeError),
    (dict(kv_act_seqs=lambda t: t.long()), TypeError),
    (dict(kv_act_seqs=lambda t: t - 1000), ValueError),
    (dict(kv_act_seqs=lambda t: t + 1000), ValueError),
    (dict(q_scale=lambda t: t[:, :, :0]), ValueError),
    (dict(v_scale=lambda t: t[:1]), ValueError),
    (dict(block_table=lambda t: t[:1]), ValueError),
]


def _id(case) -> str:
    changes, _ = case
    return e("paged_attention_fp8", **{k: ("<changed>" if callable(v) else v) for k, v in changes.items()}) \
        .replace("'<changed>'", "...")


@pytest.mark.parametrize("changes,error", BAD_PAGED_ATTENTION_CALLS, ids=[_id(c) for c in BAD_PAGED_ATTENTION_CALLS])
def test_paged_attention_rejects_bad_arguments_before_the_kernel(small_bundle, changes, error):
    backend = RecordingBackend()
    kw = _replace(small_bundle.kwargs(), **changes)
    with pytest.raises(error) as info:
        backend.paged_attention_fp8(**kw)
    assert backend.calls == [], "the kernel was reached with arguments the golden rejects"
    assert str(info.value), "the error must say what is wrong"
    # Same inputs, same verdict from the golden itself: one validation, not a copy.
    with pytest.raises(error):
        golden.paged_attention_fp8(**kw)


def test_paged_attention_passes_validated_dims(small_bundle):
    backend = RecordingBackend()
    backend.paged_attention_fp8(**small_bundle.kwargs())
    (name, dims), = backend.calls
    assert name == "paged_attention_fp8"
    assert (dims.batch, dims.s1, dims.nq, dims.nkv, dims.s2_tile, dims.g_tile) == (2, 1, 4, 2, 128, 2)


BAD_QK_CALLS = [
    (dict(q=torch.zeros(4, 64, dtype=torch.bfloat16), k=torch.zeros(8, 32, dtype=torch.bfloat16)), ValueError),
    (dict(q=torch.zeros(4, 64, dtype=torch.bfloat16), k=torch.zeros(8, 64, dtype=torch.float16)), TypeError),
    (dict(q=torch.zeros(4, 64, dtype=torch.float8_e4m3fn), k=torch.zeros(8, 64, dtype=torch.float8_e4m3fn)), ValueError),
    (dict(q=torch.zeros(4, 64, dtype=torch.bfloat16), k=torch.zeros(8, 64, dtype=torch.bfloat16),
          q_scale=torch.ones(4, 1), k_scale=torch.ones(8, 1)), ValueError),
    (dict(q=torch.zeros(4, 64, dtype=torch.bfloat16), k=torch.zeros(8, 64, dtype=torch.bfloat16), scale=float("inf")), ValueError),
]


def _qk_id(case) -> str:
    kw, _ = case
    return e("qk_matmul_scale", **{k: (f"{v.dtype}{list(v.shape)}".replace("torch.", "") if isinstance(v, torch.Tensor) else v)
                                   for k, v in kw.items()}).replace("'", "")


@pytest.mark.parametrize("kw,error", BAD_QK_CALLS, ids=[_qk_id(c) for c in BAD_QK_CALLS])
def test_qk_matmul_scale_rejects_bad_arguments_before_the_kernel(kw, error):
    backend = RecordingBackend()
    with pytest.raises(error):
        backend.qk_matmul_scale(**kw)
    assert backend.calls == []


def test_qk_matmul_scale_default_scale_is_inverse_sqrt_head_dim():
    backend = RecordingBackend()
    backend.qk_matmul_scale(torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16))
    assert backend.calls == [("qk_matmul_scale", 64 ** -0.5)]


def test_codec_argument_must_be_the_backends_own(small_bundle):
    backend = RecordingBackend()
    backend.paged_attention_fp8(**small_bundle.kwargs(), codec=golden.SPEC_CODEC)
    with pytest.raises(ValueError, match="codec="):
        backend.paged_attention_fp8(**small_bundle.kwargs(), codec=golden.PYPTO_CALCULATOR_CODEC)


# --- get_backend --------------------------------------------------------------------------------

def test_golden_backend_is_the_golden_with_the_spec_codec(small_bundle):
    """The golden backend runs the loop golden; it must equal the vectorized golden bit for bit."""

    backend = kernels.get_backend("golden")
    assert backend.name == "golden" and backend.codec is golden.SPEC_CODEC
    before = small_bundle.clone()
    out = backend.paged_attention_fp8(**small_bundle.kwargs())
    cmp.assert_close(out, golden.paged_attention_fp8(**before.kwargs()), kind="exact",
                     identifier="golden backend (loop) vs vectorized golden")


_KERNEL_CONFIG = dict(s1=1, nq=4, nkv=2, head_dim=128, block_size=128, max_blocks=2, g_tile=2, s2_tile=128,
                      softmax_scale=0.088)
BAD_KERNEL_CONFIGS = [
    (dict(s1=0), ValueError, r"^s1=0 must be >= 1"),
    (dict(max_blocks=-1), ValueError, r"^max_blocks=-1 must be >= 1"),
    (dict(g_tile=2.0), TypeError, r"^g_tile must be an int, got float 2.0"),
    (dict(nkv=True), TypeError, r"^nkv must be an int, got bool True"),
    (dict(nkv=3), ValueError, r"^nq=4 must be a multiple of nkv=3"),
    (dict(g_tile=3), ValueError, r"^g_tile=3 must divide group = nq / nkv = 2"),
    (dict(s2_tile=192), ValueError, r"^s2_tile=192 must be a multiple of block_size=128"),
    (dict(c1_tile=((128, 64), (128, 128), (128, 128))), ValueError, r"^c1_tile=.*0 < L0 <= L1"),
]


@pytest.mark.parametrize("changes,error,match", BAD_KERNEL_CONFIGS,
                         ids=[e("PagedAttentionKernelConfig", **c) for c, _, _ in BAD_KERNEL_CONFIGS])
def test_kernel_config_rejects_bad_fields_with_the_goldens_checks(changes, error, match):
    """pfa_verify.kernels.config (issue 18 item 8): the positive-int checks are golden.paging.positive_int's, so the
    kernel's configuration raises what the golden raises (TypeError for a non-int, ValueError for <= 0)."""
    PagedAttentionKernelConfig(**_KERNEL_CONFIG)
    with pytest.raises(error, match=match):
        PagedAttentionKernelConfig(**{**_KERNEL_CONFIG, **changes})


def test_import_path_backend():
    backend = kernels.get_backend("tests.kernels.test_backends:make_recording_backend", flag=1)
    # The module may be imported twice (as a test file and by import path): compare by name.
    assert type(backend).__name__ == "RecordingBackend" and backend.options == {"flag": 1}


@pytest.mark.parametrize("name", ["", "gpu", "tests.kernels.test_backends:nothing_here",
                                  "no_such_module_xyz:factory"],
                         ids=lambda n: e("get_backend", name=n))
def test_get_backend_rejects_unknown_names(name):
    with pytest.raises(UsageError, match="name="):
        kernels.get_backend(name)


def test_get_backend_rejects_a_factory_that_returns_no_backend():
    with pytest.raises(UsageError, match="lacks"):
        kernels.get_backend("builtins:object")


@pytest.mark.parametrize("name", ["golden", "sim"], ids=lambda n: e("get_backend", name=n, device=1))
def test_device_applies_to_npu_only(name):
    with pytest.raises(ValueError, match="device=1"):
        kernels.get_backend(name, device=1)


def test_a_backend_loaded_from_a_file_or_module_names_its_source_by_content():

    by_file = kernels.get_backend("tests/cases/run_doubles.py:PerturbOne")
    digest = hashlib.sha256(Path("tests/cases/run_doubles.py").read_bytes()).hexdigest()
    assert by_file.kernel_source == KernelSource("tests/cases/run_doubles.py",
                                                 str(Path("tests/cases/run_doubles.py").resolve()), digest, "PerturbOne")
    by_module = kernels.get_backend("tests.kernels.test_backends:make_recording_backend")
    assert by_module.kernel_source.source == "tests.kernels.test_backends"
    assert by_module.kernel_source.function == "make_recording_backend"
    assert by_module.kernel_source.sha256 == hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    assert getattr(kernels.get_backend("golden"), "kernel_source", None) is None   # no kernel file


# --- device choice ------------------------------------------------------------------------------

DEVICE_CASES = [
    (3, {}, (3, "device argument")),
    ("npu:2", {"TILE_FWK_DEVICE_ID": "5"}, (2, "device argument")),
    (None, {"TILE_FWK_DEVICE_ID": "5", "PYTEST_XDIST_WORKER": "gw1"}, (5, "TILE_FWK_DEVICE_ID")),
    (None, {"PYTEST_XDIST_WORKER": "gw7"}, (7, "PYTEST_XDIST_WORKER")),
    (None, {"PYTEST_XDIST_WORKER": "master"}, (0, "default")),
    (None, {"TILE_FWK_DEVICE_ID": " "}, (0, "default")),
    (None, {}, (0, "default")),
]


@pytest.mark.parametrize("device,environ,expected", DEVICE_CASES,
                         ids=[f"device={d!r}, env={env}" for d, env, _ in DEVICE_CASES])
def test_device_choice(device, environ, expected):
    assert resolve_device_index(device, environ) == expected


@pytest.mark.parametrize("device,environ", [(-1, {}), ("npu:x", {}), (True, {}), (None, {"TILE_FWK_DEVICE_ID": "one"})],
                         ids=["device=-1", "device='npu:x'", "device=True", "TILE_FWK_DEVICE_ID='one'"])
def test_bad_device_is_a_value_error_naming_its_source(device, environ):
    with pytest.raises(ValueError, match=r"device|TILE_FWK_DEVICE_ID"):
        resolve_device_index(device, environ)


# --- skip reasons -------------------------------------------------------------------------------

def test_npu_unavailable_says_what_is_missing():

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here; this checks the reason given without it")
    with pytest.raises(BackendUnavailable) as info:
        kernels.get_backend("npu", device=0)
    assert "torch_npu is not installed" in info.value.reason


def test_auto_falls_back_to_the_golden_with_every_reason(monkeypatch):

    def no_sim(**options):
        raise BackendUnavailable("pypto is not installed")

    monkeypatch.setitem(backends.BUILTIN_BACKENDS, "sim", no_sim)
    monkeypatch.setattr(backends, "_sim", no_sim)

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    backend = kernels.get_backend("auto")
    assert backend.name == "golden" and backend.fallback is True
    assert "fell back to the golden: no kernel is checked by this run" in backend.selection
    assert "not npu: " in backend.selection and "not sim: pypto is not installed" in backend.selection


def test_auto_says_what_it_chose(monkeypatch):

    chosen = kernels.get_backend("golden")
    monkeypatch.setattr(backends, "_sim", lambda **options: chosen)

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    backend = kernels.get_backend("auto")
    assert backend is chosen and backend.selection.startswith("auto chose sim (not npu: ")


@pytest.mark.parametrize("allow", [False, True], ids=["named", "allow-unavailable"])
def test_backend_fixture_fails_a_session_whose_backend_cannot_run(suite_pytester, allow):
    """tests/conftest.py's `backend` fixture: --backend npu on a machine without one fails the tests
    that need it, with the reason (a property run that checked nothing is not a pass); with
    --allow-unavailable they are skips with the reason, never passes."""
    suite_pytester.makepyfile(test_it="def test_it(backend):\n    pass\n")
    result = suite_pytester.runpytest_subprocess("-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist",
                                                 "--backend", "npu", *(["--allow-unavailable"] if allow else []),
                                                 timeout=120)
    out = result.stdout.str()
    if "torch_npu is not installed" not in out and result.ret == 0:
        pytest.skip("an NPU backend is available here")
    assert "backend 'npu' cannot run here: npu backend: torch_npu is not installed" in out
    result.assert_outcomes(**({"skipped": 1} if allow else {"errors": 1}))
    assert result.ret == (0 if allow else 1)


@pytest.mark.parametrize("allow", [False, True], ids=["fallback", "allow-fallback"])
def test_backend_fixture_fails_a_session_that_fell_back_to_the_golden(suite_pytester, allow):
    """--backend auto that finds no kernel backend gives the golden with `fallback` set: the tests that
    need the backend fail with auto's reasons unless --allow-fallback (then they run on the golden)."""
    suite_pytester.makepyfile(test_it="def test_it(backend):\n    assert backend.name == 'golden'\n")
    suite_pytester.makepyfile(fell_back=(
        "from kernels.backends.golden_backend import GoldenBackend\n"
        "def auto(**options):\n"
        "    backend = GoldenBackend()\n"
        "    backend.fallback, backend.selection = True, 'auto fell back to the golden: no kernel (not sim: test)'\n"
        "    return backend\n"))
    result = suite_pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--backend",
                                                 f"{suite_pytester.path / 'fell_back.py'}:auto",
                                                 *(["--allow-fallback"] if allow else []), "test_it.py", timeout=120)
    result.assert_outcomes(**({"passed": 1} if allow else {"errors": 1}))
    assert result.ret == (0 if allow else 1)
    if not allow:
        assert "auto fell back to the golden: no kernel (not sim: test) (--allow-fallback" in result.stdout.str()
