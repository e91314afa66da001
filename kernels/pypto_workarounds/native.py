"""The C++ side of pypto 0.2.0 that W9 (kernels/pypto_workarounds/) reaches through ctypes.

pypto 0.2.0 exposes no Python call to re-run its calculator on a traced tensor graph, nor to read the
calculator's result back without the cost-model run. Three native facts, read from the r0.2.0 sources
of hicann/pypto (framework: recorder.cpp, program.cpp, flow_verifier.h/.cpp, cost_model_launcher.h)
and checked against the wheel's machine code, make it possible:

- ``ProgramData::GetInstance()`` holds the calculator's copies of a call's tensors as a
  ``std::vector<std::shared_ptr<RawTensorData>>``, each RawTensorData a ``std::vector<uint8_t>`` whose
  first two words are its begin and end. The calculator writes its result there; 0.2.0 copies it
  back into the caller's tensors only in the cost-model run. :func:`copy_back` does that copy itself,
  checking the number of tensors and every byte size.
- ``Program::VerifyTensorGraph()`` (libtile_fwk_interface.so) runs the calculator on
  ``Program::lastFunc_``, the last traced graph (offset 0x60: ``VerifyTensorGraph+0x70`` is
  ``mov 0x60(%r14),%r15`` in the 0.2.0 wheel; :func:`native` checks those bytes and disables W9's
  re-run if they differ). A C++ exception thrown through ctypes would reach pypto's terminate handler
  (``_Exit(1)``), so a two-function shim, built once with the system compiler into the cache like the
  calculator, calls it inside try/catch.
- ``FlowVerifier`` keeps the last run's interpreter and every leaf frame's captured tensors until the
  next run: a whole run's intermediates stay resident between calls (GBs on upstream shapes) and two
  runs' worth exist during the next. The shim's ``pfa_release_verifier`` resets those members through a
  mirror of flow_verifier.h's data members (``shared_ptr<void>`` destroys through the original control
  blocks, so the right destructors run); :func:`release` calls it and then ``malloc_trim``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

__all__ = ["Native", "native", "last_function", "copy_back", "release", "SHIM_SOURCE"]

SHIM_SOURCE = r'''
#include <cstring>
#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>
namespace npu { namespace tile_fwk {
class Program { public: static Program &GetInstance(); void VerifyTensorGraph(); };
class FlowVerifier { public: static FlowVerifier &GetInstance(); };
}}
// FlowVerifier's data members in pypto 0.2.0 (framework flow_verifier.h, tag r0.2.0).
struct FlowVerifierMirror {
    void *entry;
    bool checkResult;
    std::vector<std::shared_ptr<void>> inputs, outputs, goldens;
    std::shared_ptr<void> interpreter;
    std::shared_ptr<void> controlFlowExecution;
    std::unordered_map<void *, std::vector<std::shared_ptr<void>>> lastCaptureExecution;
};
extern "C" void pfa_release_verifier() {
    auto *fv = reinterpret_cast<FlowVerifierMirror *>(&npu::tile_fwk::FlowVerifier::GetInstance());
    fv->controlFlowExecution.reset();
    fv->interpreter.reset();
    fv->lastCaptureExecution.clear();
    fv->inputs.clear(); fv->outputs.clear(); fv->goldens.clear();
}
extern "C" int pfa_verify_tensor_graph(char *err, unsigned long n) {
    try { npu::tile_fwk::Program::GetInstance().VerifyTensorGraph(); return 0; }
    catch (const std::exception &e) { std::strncpy(err, e.what(), n - 1); err[n - 1] = 0; return 1; }
    catch (...) { std::strncpy(err, "unknown C++ exception", n - 1); err[n - 1] = 0; return 2; }
}
'''
_LAST_FUNC_OFFSET = 0x60
_LAST_FUNC_PROBE = (0x70, bytes.fromhex("4d8b7e60"))   # VerifyTensorGraph+0x70: mov 0x60(%r14),%r15
_POINTER = 8
_SHARED_PTR = 16                                        # (pointer, control block)


@dataclasses.dataclass
class Native:
    """Addresses of pypto's singletons and the shim's entry points (None when unavailable)."""
    program: int
    program_data: int
    verify: Callable[[ctypes.Array[ctypes.c_char], int], int] | None   # pfa_verify_tensor_graph(err, n) -> int
    release_verifier: Callable[[], None] | None
    why_not: str = ""              # why the shim (W9's re-run) is unavailable


_NATIVE: list[Native] = []


def native(pypto, cache: Path) -> Native:
    """The native handles for the loaded ``pypto`` (built shim cached under ``cache``), once per process."""
    if _NATIVE:
        return _NATIVE[0]
    libdir = Path(pypto.__file__).parent / "lib"
    iface = ctypes.CDLL(str(libdir / "libtile_fwk_interface.so"))   # already loaded: the same handle
    get_program = iface._ZN3npu8tile_fwk7Program11GetInstanceEv
    get_program.restype = ctypes.c_void_p
    get_data = iface._ZN3npu8tile_fwk11ProgramData11GetInstanceEv
    get_data.restype = ctypes.c_void_p
    verify = release_verifier = None
    why = ""
    code = ctypes.cast(iface._ZN3npu8tile_fwk7Program17VerifyTensorGraphEv, ctypes.c_void_p).value
    offset, expected = _LAST_FUNC_PROBE
    if code is None or ctypes.string_at(code + offset, len(expected)) != expected:
        why = "Program::lastFunc_ is not where pypto 0.2.0 keeps it in this libtile_fwk_interface.so"
    else:
        try:
            verify, release_verifier = _build_shim(libdir, cache)
        except (OSError, subprocess.CalledProcessError) as exc:
            why = f"building the verify shim failed: {exc}"
    _NATIVE.append(Native(get_program(), get_data(), verify, release_verifier, why))
    return _NATIVE[0]


def _build_shim(libdir: Path, cache: Path):
    tag = hashlib.sha256((SHIM_SOURCE + str(libdir.resolve())).encode()).hexdigest()[:12]
    target = cache / f"verify-shim-{tag}"
    target.mkdir(parents=True, exist_ok=True)
    lib = target / "libpfa_verify_shim.so"
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            src = target / "verify_shim.cpp"
            src.write_text(SHIM_SOURCE)
            cxx = shutil.which("c++") or shutil.which("g++")
            if cxx is None:
                raise OSError("no C++ compiler on PATH")
            subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", str(src), "-o", f"{lib}.tmp",
                            f"-L{libdir}", "-ltile_fwk_interface"], check=True, capture_output=True)
            os.replace(f"{lib}.tmp", lib)
    shim = ctypes.CDLL(str(lib))
    verify = shim.pfa_verify_tensor_graph
    verify.argtypes, verify.restype = [ctypes.c_char_p, ctypes.c_ulong], ctypes.c_int
    release_verifier = shim.pfa_release_verifier
    release_verifier.restype = None
    return verify, release_verifier


def last_function(handles: Native) -> int:
    """The address of the graph ``Program::VerifyTensorGraph`` would run now (0 when none)."""
    return ctypes.c_void_p.from_address(handles.program + _LAST_FUNC_OFFSET).value or 0


def copy_back(handles: Native, destinations: list[tuple[int, int]]) -> None:
    """Copy ProgramData's tensors (where the calculator wrote) into ``destinations`` (address, bytes)
    of the caller's contiguous tensors, in call order; RuntimeError on any count or size mismatch."""
    begin = ctypes.c_void_p.from_address(handles.program_data).value or 0
    end = ctypes.c_void_p.from_address(handles.program_data + _POINTER).value or 0
    count = (end - begin) // _SHARED_PTR
    if count != len(destinations):
        raise RuntimeError(f"W9: pypto's ProgramData holds {count} tensors, the call has {len(destinations)}")
    for i, (address, size) in enumerate(destinations):
        raw = _pointer_at(begin + _SHARED_PTR * i, f"tensor {i}")
        data = _pointer_at(raw, f"tensor {i}'s data")
        data_end = _pointer_at(raw + _POINTER, f"tensor {i}'s data end")
        if data_end - data != size:
            raise RuntimeError(f"W9: pypto's copy of tensor {i} has {data_end - data} bytes, the caller's {size}")
        ctypes.memmove(address, data, size)


def _pointer_at(address: int, what: str) -> int:
    """The pointer stored at ``address``; RuntimeError naming ``what`` when it is null."""
    value = ctypes.c_void_p.from_address(address).value
    if value is None:
        raise RuntimeError(f"W9: pypto's ProgramData holds a null pointer for {what}")
    return value


def release(handles: Native) -> None:
    """Free the calculator's kept intermediates, then return freed heap pages to the system."""
    if handles.release_verifier is not None:
        handles.release_verifier()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)
