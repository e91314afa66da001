"""W4 (the calculator built once per pypto, torch and ABI into the cache) and W10 (that build's FP8
copies copy bytes)."""
from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

from kernels.pypto_workarounds import _common

__all__ = ["build_calculator", "load_calculator", "patch_calculator_build"]


# --- W4: the calculator, built once per (pypto, torch, ABI) and cached on disk ----------------------

def _calculator_dir() -> Path:
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    patches = hashlib.sha256(repr(_CALCULATOR_PATCHES).encode()).hexdigest()[:8]
    return _common.cache_root() / f"calculator-pypto{_common.SUPPORTED_PYPTO_VERSION}-torch{torch.__version__}-abi{abi}-w10{patches}"


# --- W10: same-type FP8 copies in the calculator copy bytes -------------------------------------------
# calc_torch.cpp's Copy and Reshape read FP8 operands through Fp8ToFloat32 (about 15 torch ops per
# tensor) and write them back through a scalar re-encode. pypto's interpreter starts every leaf frame
# that reads a global input with a view of the whole input, executed as such a Copy, so each frame
# paid O(NB * BS * NKV * D) on the paged caches (perf: 56% of a 256_nkv_4 execute in the decode's torch
# ops, 12% in the scalar encode). A byte copy gives the same decoded values. What it does not repeat is
# the re-encode's canonicalisation: a code the calculator reads as +-240 used to leave every copy as
# 0x7E / 0xFE and now keeps its byte (golden.codec.PyptoCalculatorE4M3 models the cast's own codes).
_CALCULATOR_PATCHES = (
    ("static void Copy(const TensorData &out, const TensorData &self, bool trans) {\n",
     "    if (!trans && out.dtype == self.dtype && FromDataType(out.dtype) == torch::kUInt8 &&\n"
     "        !out.isAxisCombine && !self.isAxisCombine) {  // pfa-verify W10: bytes, same decoded values\n"
     "        auto o = torch::from_blob(out.dataPtr, out.rawShape, torch::kUInt8)\n"
     "                     .as_strided(out.shape, out.stride, out.storageOffset);\n"
     "        auto s = torch::from_blob(self.dataPtr, self.rawShape, torch::kUInt8)\n"
     "                     .as_strided(self.shape, self.stride, self.storageOffset);\n"
     "        o.copy_(s);\n"
     "        return;\n"
     "    }\n"),
    ("static void Reshape(const TensorData &out, const TensorData &self) {\n",
     "    if (out.dtype == self.dtype && FromDataType(out.dtype) == torch::kUInt8 &&\n"
     "        !out.isAxisCombine && !self.isAxisCombine) {  // pfa-verify W10: bytes, same decoded values\n"
     "        auto o = torch::from_blob(out.dataPtr, out.rawShape, torch::kUInt8)\n"
     "                     .as_strided(out.shape, out.stride, out.storageOffset);\n"
     "        auto s = torch::from_blob(self.dataPtr, self.rawShape, torch::kUInt8)\n"
     "                     .as_strided(self.shape, self.stride, self.storageOffset);\n"
     "        o.copy_(torch::reshape(s, out.shape));\n"
     "        return;\n"
     "    }\n"),
)


def _patched_calculator_sources(src: Path, target: Path) -> Path:
    """W10. A copy of the wheel's calculator sources with _CALCULATOR_PATCHES inserted at the top of
    each function they name, next to a link to the wheel's libc_sec.so (the CMake file looks for it
    one folder up). Never edits the installed package."""
    lib = target / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    lib.mkdir(parents=True)
    (lib / "libc_sec.so").symlink_to(src.parent / "libc_sec.so")
    dst = lib / "calculator"
    shutil.copytree(src, dst)
    path = dst / "src" / "calc_torch.cpp"
    text = path.read_text()
    for head, body in _CALCULATOR_PATCHES:
        if text.count(head) != 1:
            raise _common.PyptoUnavailable(f"W10: the calculator source has changed; {head.strip()!r} not found once")
        text = text.replace(head, head + body)
    path.write_text(text)
    return dst


def build_calculator(*, force: bool = False) -> tuple[Path, float]:
    """W4. Return (path of libtile_fwk_calculator.so, seconds spent building: 0.0 when cached).

    Same cmake configuration as 0.2.0's BuildOnlineManager (torch version, root, C++ ABI), but into a
    cache folder shared by processes, with a file lock so pytest-xdist workers build it only once.
    """
    import fcntl
    import time

    import torch

    target = _calculator_dir()
    lib = target / "install" / "lib" / "libtile_fwk_calculator.so"
    _common.ensure_dir(target)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists() and not force:
            return lib, 0.0
        start = time.perf_counter()
        src = _patched_calculator_sources(_common.installed_pypto_dir() / "lib" / "calculator", target)
        build = target / "build"
        shutil.rmtree(build, ignore_errors=True)
        cmake = shutil.which("cmake")
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
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise _common.PyptoUnavailable(
                    f"building pypto's calculator failed ({' '.join(cmd[:2])}):\n{proc.stderr[-2000:]}")
        shutil.rmtree(build, ignore_errors=True)
        if not lib.exists():
            raise _common.PyptoUnavailable(f"the calculator build finished without {lib}")
        return lib, time.perf_counter() - start


def load_calculator() -> float:
    """Load the cached calculator into this process (once); return the build seconds it cost."""
    with _common.LOCK:
        if "calculator" in _common.STATE:
            return 0.0
        lib, seconds = build_calculator()
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        _common.STATE["calculator"] = lib
        _common.STATE["calculator_build_s"] = seconds
        utils = importlib.import_module("pypto._utils")
        utils.BuildOnlineManager().calculator_loaded = True
        return seconds


def patch_calculator_build(pypto: ModuleType) -> None:
    """W4. Route 0.2.0's own build_and_load_calculator (per process, temp folder) to the cache."""
    utils = importlib.import_module("pypto._utils")
    manager = utils.BuildOnlineManager
    if getattr(manager.build_and_load_calculator, "_pfa_verify_patched", False):
        return

    def build_and_load_calculator(self) -> None:
        load_calculator()
        self.calculator_loaded = True

    build_and_load_calculator._pfa_verify_patched = True
    manager.build_and_load_calculator = build_and_load_calculator


