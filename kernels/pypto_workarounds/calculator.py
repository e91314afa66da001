"""W4 (the calculator built once per pypto, torch and ABI into the cache), W10 (that build's FP8
copies copy bytes), W12's calculator side (an empty view reads nothing) and W13 (that build's E4M3
can be the spec's, switched per run)."""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import ModuleType

import torch

from pfa_verify.kernels.pypto_workarounds import _common

__all__ = ["build_calculator", "load_calculator", "patch_calculator_build", "E4M3_CODECS", "e4m3_codec",
           "current_e4m3_codec"]


# --- W4: the calculator, built once per (pypto, torch, ABI) and cached on disk ----------------------

def _calculator_dir() -> Path:
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    patches = hashlib.sha256(repr(_CALCULATOR_PATCHES).encode()).hexdigest()[:8]
    return _common.cache_root() / f"calculator-pypto{_common.SUPPORTED_PYPTO_VERSION}-torch{torch.__version__}-abi{abi}-w{patches}"


# --- W10: same-type FP8 copies in the calculator copy bytes -------------------------------------------
# calc_torch.cpp's Copy and Reshape read FP8 operands through Fp8ToFloat32 (about 15 torch ops per
# tensor) and write them back through a scalar re-encode. pypto's interpreter starts every leaf frame
# that reads a global input with a view of the whole input, executed as such a Copy, so each frame
# paid O(NB * BS * NKV * D) on the paged caches (perf: 56% of a 256_nkv_4 execute in the decode's torch
# ops, 12% in the scalar encode). A byte copy gives the same decoded values. What it does not repeat is
# the re-encode's canonicalisation: a code the calculator reads as +-240 keeps its byte, where the
# re-encode made it 0x7E / 0xFE (golden.codec.PyptoCalculatorE4M3 models the cast's own codes).
_W10 = (
    ("calc_torch.cpp", "static void Copy(const TensorData &out, const TensorData &self, bool trans) {\n", "after",
     ("    if (!trans && out.dtype == self.dtype && FromDataType(out.dtype) == torch::kUInt8 &&\n"
      "        !out.isAxisCombine && !self.isAxisCombine) {  // pfa-verify W10: bytes, same decoded values\n"
      "        auto o = torch::from_blob(out.dataPtr, out.rawShape, torch::kUInt8)\n"
      "                     .as_strided(out.shape, out.stride, out.storageOffset);\n"
      "        auto s = torch::from_blob(self.dataPtr, self.rawShape, torch::kUInt8)\n"
      "                     .as_strided(self.shape, self.stride, self.storageOffset);\n"
      "        o.copy_(s);\n"
      "        return;\n"
      "    }\n")),
    ("calc_torch.cpp", "static void Reshape(const TensorData &out, const TensorData &self) {\n", "after",
     ("    if (out.dtype == self.dtype && FromDataType(out.dtype) == torch::kUInt8 &&\n"
      "        !out.isAxisCombine && !self.isAxisCombine) {  // pfa-verify W10: bytes, same decoded values\n"
      "        auto o = torch::from_blob(out.dataPtr, out.rawShape, torch::kUInt8)\n"
      "                     .as_strided(out.shape, out.stride, out.storageOffset);\n"
      "        auto s = torch::from_blob(self.dataPtr, self.rawShape, torch::kUInt8)\n"
      "                     .as_strided(self.shape, self.stride, self.storageOffset);\n"
      "        o.copy_(torch::reshape(s, out.shape));\n"
      "        return;\n"
      "    }\n")),
)

# --- W12 (calculator side): an empty view reads nothing, whatever its offset -----------------------------
# W12's shim (kernels/pypto_workarounds/bounds.py) gives a view that starts outside its input a valid
# shape of 0, as pypto does for one past the end. For one before the start, From() would still build the
# empty view with torch's as_strided at a negative storage offset, which fails ("Tensor: invalid
# storage offset") inside the trace and leaves pypto 0.2.0 unable to trace again in the process. An
# empty tensor instead is exact (no element is read or written) and lets the run finish, so W12
# reports the view by name.
_W12 = (
    ("calc_torch.cpp", "static std::pair<torch::Tensor, torch::Tensor> From(const TensorData &data) {\n", "after",
     ("    if (std::any_of(data.shape.begin(), data.shape.end(), [](int64_t n) { return n == 0; })) {  // pfa-verify W12\n"
      "        auto view = torch::empty(data.shape, torch::TensorOptions().dtype(FromDataType(data.dtype)));\n"
      "        if (data.isAxisCombine)\n"
      "            view = view.transpose_(-1, AXIS_TO_LAST);\n"
      "        return {view, FromDataType(data.dtype) == torch::kUInt8 ? view.to(torch::kFloat32) : view};\n"
      "    }\n")),
)

# --- W13: the spec's E4M3 in the calculator, switched on per run ------------------------------------
# The calculator's E4M3 is not the spec's (golden.codec.PYPTO_CALCULATOR_CODEC, measured by
# tests/kernels/test_calculator_codec.py): codes with exponent field 15 decode to +-240 (E4M3FN: 256 to
# 448, and NaN at 0x7F / 0xFF), the encoder saturates at 240, and Cast rounds to an integer first
# (it treats FP8 as a non-float target). So on the CPU a kernel bug that only touches codes worth 256
# to 448, or saturation, cannot be seen. W13 adds the spec codec (SPEC §3, golden.codec.SPEC_CODEC: OCP
# E4M3FN, round to nearest even, saturating to +-448, NaN kept with its sign, -0 kept) behind a switch,
# pfa_set_spec_e4m3(1): decode by a 256-entry table, encode by scaling to the code's grid (exact:
# a power of two) and one nearbyint (ties to even), and Cast to FP8 without the integer pre-rounding.
# The switch is off unless a run asks for it (e4m3_codec("spec"), used by the sim-spec-codec backend),
# so pypto's own codec is what `--backend sim` runs, bit for bit as before.
_W13 = (
    ("fp8_convert.cpp", "static torch::Tensor Fp8E4M3ToFloat32(const torch::Tensor &self) {\n", "before",
     ("// pfa-verify W13: the spec's E4M3 (OCP E4M3FN, RNE, saturating to 448, NaN kept), on request.\n"
      "static int g_pfaSpecE4M3 = 0;\n"
      "extern \"C\" void pfa_set_spec_e4m3(int on) { g_pfaSpecE4M3 = on ? 1 : 0; }\n"
      "extern \"C\" int pfa_spec_e4m3() { return g_pfaSpecE4M3; }\n"
      "static torch::Tensor PfaSpecE4M3ToFloat32(const torch::Tensor &self) {\n"
      "    static const torch::Tensor table = [] {\n"
      "        auto t = torch::empty({256}, torch::kFloat32);\n"
      "        for (int c = 0; c < 256; c++) {\n"
      "            int e = (c >> 3) & 0xF, m = c & 7;\n"
      "            float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);\n"
      "            if ((c & 0x7F) == 0x7F) v = std::numeric_limits<float>::quiet_NaN();\n"
      "            t[c] = (c & 0x80) ? -v : v;\n"
      "        }\n"
      "        return t;\n"
      "    }();\n"
      "    return table.index_select(0, self.flatten().to(torch::kLong)).reshape(self.sizes());\n"
      "}\n"
      "static uint8_t PfaSpecEncodeE4M3(float v) {\n"
      "    uint8_t sign = std::signbit(v) ? 0x80 : 0x00;\n"
      "    if (std::isnan(v)) return sign | 0x7F;\n"
      "    float a = std::fabs(v);\n"
      "    if (!(a < 1024.0f)) return sign | 0x7E;          // inf and beyond 464: saturate\n"
      "    if (std::fpclassify(a) == FP_ZERO) return sign;\n"
      "    int e = 0;\n"
      "    std::frexp(a, &e);                               // a in [2^(e-1), 2^e)\n"
      "    int q = std::max(e - 4, -9);                     // grid step 2^q: 3 mantissa bits, subnormals 2^-9\n"
      "    int m = int(std::nearbyint(std::ldexp(a, -q)));  // exact scaling, ties to even\n"
      "    int code = (q + 9) * 8 + m;                      // m in [8, 16] (0..16 on the 2^-9 grid)\n"
      "    return sign | uint8_t(code > 0x7E ? 0x7E : code);\n"
      "}\n")),
    ("fp8_convert.cpp", "static torch::Tensor Fp8E4M3ToFloat32(const torch::Tensor &self) {\n", "after",
     "    if (g_pfaSpecE4M3) return PfaSpecE4M3ToFloat32(self);  // pfa-verify W13\n"),
    ("fp8_convert.cpp", "static inline uint8_t EncodeFloatToFp8E4M3(float v)\n{\n", "after",
     "    if (g_pfaSpecE4M3) return PfaSpecEncodeE4M3(v);  // pfa-verify W13\n"),
    ("calc_torch.cpp", "static void Cast(const TensorData &out, const TensorData &self, CastMode mode) {\n", "before",
     "extern \"C\" int pfa_spec_e4m3();  // pfa-verify W13 (fp8_convert.cpp)\n"),
    ("calc_torch.cpp", "static void Cast(const TensorData &out, const TensorData &self, CastMode mode) {\n", "after",
     ("    if (pfa_spec_e4m3() && out.dtype == DT_FP8E4M3 && mode != CastMode::CAST_ROUND &&\n"
      "        mode != CastMode::CAST_FLOOR && mode != CastMode::CAST_CEIL && mode != CastMode::CAST_TRUNC) {\n"
      "        auto tout = From(out);  // pfa-verify W13: E4M3 is a float target, no integer pre-rounding\n"
      "        ToOperand(From(self).second, tout.first, out.dtype);\n"
      "        return;\n"
      "    }\n")),
)

_CALCULATOR_PATCHES = _W10 + _W12 + _W13


def _patched_calculator_sources(src: Path, target: Path) -> Path:
    """W10, W12, W13. A copy of the wheel's calculator sources with _CALCULATOR_PATCHES inserted before or
    after the line each names, next to a link to the wheel's libc_sec.so (the CMake file looks for it
    one folder up). Never edits the installed package."""
    lib = target / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    (lib / "libc_sec.so").symlink_to(src.parent / "libc_sec.so")
    dst = lib / "calculator"
    shutil.copytree(src, dst)
    for name, anchor, where, body in _CALCULATOR_PATCHES:
        path = dst / "src" / name
        text = path.read_text()
        if text.count(anchor) != 1:
            raise _common.PyptoUnavailable(f"the calculator source has changed; {anchor.strip()!r} not found once "
                                           f"in {name}")
        text = text.replace(anchor, anchor + body if where == "after" else body + anchor)
        path.write_text(text)
    return dst


def build_calculator() -> tuple[Path, float]:
    """W4. Return (path of libtile_fwk_calculator.so, seconds spent building: 0.0 when cached).

    Same cmake configuration as 0.2.0's BuildOnlineManager (torch version, root, C++ ABI), but into a
    cache folder shared by processes, with a file lock so pytest-xdist workers build it only once.
    """
    target = _calculator_dir()
    lib = target / "install" / "lib" / "libtile_fwk_calculator.so"
    _common.ensure_dir(target)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib, 0.0
        start = time.perf_counter()
        src = _patched_calculator_sources(_common.installed_pypto_dir() / "lib" / "calculator", target)
        build = target / "build"
        shutil.rmtree(build, ignore_errors=True)
        cmake = shutil.which("cmake")
        if cmake is None:
            raise _common.PyptoUnavailable("cmake is needed to build pypto's calculator")
        configure = [
            cmake, "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_INSTALL_PREFIX={target / 'install'}",
            f"-DPY3_MOD_TORCH_VERSION={torch.__version__}",
            f"-DPY3_MOD_TORCH_ROOT_PATH={Path(torch.__file__).parent}",
            f"-DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        ]
        jobs = str(max(1, min(4, os.cpu_count() or 1)))
        for cmd in (configure, [cmake, "--build", str(build), "-j", jobs],
                    [cmake, "--install", str(build), "--prefix", str(target / "install")]):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)   # the failure named below
            if proc.returncode != 0:
                raise _common.PyptoUnavailable(
                    f"building pypto's calculator failed ({' '.join(cmd[:2])}):\n{proc.stderr[-2000:]}")
        shutil.rmtree(build, ignore_errors=True)
        if not lib.exists():
            raise _common.PyptoUnavailable(f"the calculator build finished without {lib}")
        return lib, time.perf_counter() - start


def load_calculator() -> None:
    """Load the cached calculator (built first if it is not) into this process, once."""
    with _common.LOCK:
        if "calculator" in _common.STATE:
            return
        lib, _ = build_calculator()
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        _common.STATE["calculator"] = lib
        utils = importlib.import_module("pypto._utils")
        utils.BuildOnlineManager().calculator_loaded = True


def patch_calculator_build(pypto: ModuleType) -> None:
    """W4. Route 0.2.0's own build_and_load_calculator (per process, temp folder) to the cache."""
    utils = importlib.import_module("pypto._utils")
    manager = utils.BuildOnlineManager
    if _common.is_patched(manager.build_and_load_calculator):
        return

    def build_and_load_calculator(self) -> None:
        load_calculator()
        self.calculator_loaded = True

    _common.mark_patched(build_and_load_calculator)
    manager.build_and_load_calculator = build_and_load_calculator




# --- W13: which E4M3 the calculator computes with ------------------------------------------------------

#: The calculator's E4M3 modes: pypto 0.2.0's own (golden.codec.PYPTO_CALCULATOR_CODEC) and the spec's
#: (golden.codec.SPEC_CODEC).
E4M3_CODECS = ("pypto", "spec")


def _codec_functions():
    load_calculator()
    lib = ctypes.CDLL(str(_common.STATE["calculator"]))    # loaded already: the same handle
    lib.pfa_set_spec_e4m3.argtypes = [ctypes.c_int]
    return lib.pfa_set_spec_e4m3, lib.pfa_spec_e4m3


def current_e4m3_codec() -> str:
    """The calculator's E4M3 mode now: "pypto" (the default) or "spec"."""
    return E4M3_CODECS[_codec_functions()[1]()]


@contextlib.contextmanager
def e4m3_codec(name: str):
    """W13. Run the block with the calculator's E4M3 set to ``name`` ("pypto" or "spec"), then put
    pypto's own back (the process-wide default, whatever happens inside)."""
    if name not in E4M3_CODECS:
        raise ValueError(f"name={name!r} must be one of {E4M3_CODECS}")
    set_spec, _ = _codec_functions()
    with _common.LOCK:
        set_spec(int(name == "spec"))
        try:
            yield
        finally:
            set_spec(0)
