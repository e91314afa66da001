"""W12: a read of an input tensor outside its shape is an error on the sim, not a silent garbage value.

pypto 0.2.0's interpreter (the engine that walks a traced tensor graph for the calculator) evaluates a
kernel's scalar reads of its inputs and the valid shapes of its views as symbolic calls, in
``EvaluateSymbol::EvaluateSymbolicCall`` (framework symbolic_scalar_evaluate.cpp, tag r0.2.0 of
hicann/pypto). Neither checks bounds:

- ``RUNTIME_GetInputDataInt32Dim{1..4}(input, i0, i1, ...)`` (``block_table[b, j]``,
  ``kv_act_seqs[b]``) reads element ``i0 * shape[1] + i1`` of the input's data without comparing the
  indices with the shape: a column past a row reads the next row, past the last row heap memory
  (measured: ``block_table[0, 5]`` of a [1, 5] table read 32547, then 0, on two runs of the same case).
- ``RUNTIME_GetViewValidShapeDim(extent, offset, size)`` clips a view to what lies inside its tensor,
  down to nothing: a view of the K cache at block id 32547 silently copies no row, and the tile keeps
  whatever it held.

W12 interposes both entry points. ``libtile_fwk_interface.so`` calls them through its PLT and is
linked with BIND_NOW, so a small library of ours that defines the same two symbols and is loaded
with RTLD_GLOBAL *before* pypto's libraries wins the binding (:func:`preload`, called by load_pypto);
:func:`attach` hands it the originals and proves, by reading the GOT slots through the library's own
relocation table, that the interface library now calls ours. The shim then

- checks every scalar read ``RUNTIME_GetInputDataInt32DimN`` against the input's shape (queried
  through the original ``RUNTIME_GetInputShapeDim``); an index outside is recorded and the read
  returns 0 without touching memory;
- checks every view whose extent is one input's dimension (the shape query made while the extent was
  evaluated, tracked per thread through ``EvaluateSymbolicScalar``): a view that starts before 0 or at
  or past the end of that dimension is recorded and gets a valid shape of 0, so nothing outside is
  read (pypto itself gives a view past the end that shape; one before the start it would give a
  negative storage offset, which fails inside the trace and leaves pypto 0.2.0 unable to trace again
  in that process). A view that starts inside and is clipped at the end
  is pypto's tail idiom (SPEC §6: "tail tiles use a valid shape"), not a read past the end: allowed.
  Views of the kernel's own intermediate tensors are not checked (their extents are no input's shape).

:func:`execute_kernel` (W9) resets the record before each run and raises :class:`OutOfBoundsRead`,
naming the tensor (by the kernel's parameter name) and the index, when a run recorded anything
(kernels.backends.sim makes it a KernelRunError: an ``error`` verdict). Test:
tests/kernels/test_bounds.py.
"""
from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

from pfa_verify.kernels.pypto_workarounds import _common

__all__ = ["OutOfBoundsRead", "Violation", "preload", "attach", "attached", "reset", "first_violation",
           "checked_count", "SHIM_SOURCE"]

#: The two entry points, as the 0.2.0 wheel's libtile_fwk_interface.so exports them (old C++ ABI: Ss).
CALL_SYMBOL = ("_ZN3npu8tile_fwk14EvaluateSymbol20EvaluateSymbolicCallERKSsRKSt6vectorIxSaIxEERKS4_"
               "INS0_14SymbolicScalarESaIS9_EE")
SCALAR_SYMBOL = ("_ZN3npu8tile_fwk14EvaluateSymbol22EvaluateSymbolicScalarERKSt10shared_ptrINS0_17"
                 "RawSymbolicScalarEERKSt6vectorINS0_14SymbolicScalarESaIS8_EE")

SHIM_SOURCE = r'''
// pfa-verify W12 (kernels/pypto_workarounds/bounds.py). Built with _GLIBCXX_USE_CXX11_ABI=0, as pypto 0.2.0.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
namespace npu { namespace tile_fwk {
class SymbolicScalar;
class RawSymbolicScalar;
class EvaluateSymbol {
public:
    long long EvaluateSymbolicCall(const std::string &, const std::vector<long long> &,
                                   const std::vector<SymbolicScalar> &);
    long long EvaluateSymbolicScalar(const std::shared_ptr<RawSymbolicScalar> &,
                                     const std::vector<SymbolicScalar> &);
};
}}
using npu::tile_fwk::EvaluateSymbol;
using npu::tile_fwk::RawSymbolicScalar;
using npu::tile_fwk::SymbolicScalar;
using CallFn = long long (*)(EvaluateSymbol *, const std::string &, const std::vector<long long> &,
                             const std::vector<SymbolicScalar> &);
using ScalarFn = long long (*)(EvaluateSymbol *, const std::shared_ptr<RawSymbolicScalar> &,
                               const std::vector<SymbolicScalar> &);
static CallFn g_call = nullptr;
static ScalarFn g_scalar = nullptr;

// One frame per expression being evaluated: the input dimensions whose shape it queried, and those
// of each operand evaluated so far (the operands of a call are evaluated before the call).
struct Frame { std::vector<long long> dims; std::vector<std::vector<long long>> operands; };
static thread_local std::vector<Frame> t_frames;

static std::mutex g_mutex;
static std::atomic<long long> g_violations{0}, g_checked{0};
static long long g_first[16];   // kind (1 read, 2 view), input, rank, index[4], shape[4], dim, offset, size, extent

static void Record(long long kind, long long input, const std::vector<long long> &index,
                   const std::vector<long long> &shape, long long dim, long long offset, long long size,
                   long long extent) {
    if (g_violations.fetch_add(1) != 0) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto &v : g_first) v = -1;
    g_first[0] = kind; g_first[1] = input; g_first[2] = (long long)index.size();
    for (size_t i = 0; i < index.size() && i < 4; i++) { g_first[3 + i] = index[i]; g_first[7 + i] = shape[i]; }
    g_first[11] = dim; g_first[12] = offset; g_first[13] = size; g_first[14] = extent;
}

long long EvaluateSymbol::EvaluateSymbolicScalar(const std::shared_ptr<RawSymbolicScalar> &ss,
                                                 const std::vector<SymbolicScalar> &linear) {
    t_frames.emplace_back();
    struct Pop {
        ~Pop() {
            Frame done = std::move(t_frames.back());
            t_frames.pop_back();
            if (!t_frames.empty()) {
                Frame &parent = t_frames.back();
                parent.dims.insert(parent.dims.end(), done.dims.begin(), done.dims.end());
                parent.operands.push_back(std::move(done.dims));
            }
        }
    } pop;
    return g_scalar(this, ss, linear);
}

long long EvaluateSymbol::EvaluateSymbolicCall(const std::string &name, const std::vector<long long> &data,
                                               const std::vector<SymbolicScalar> &linear) {
    static const std::string kShape = "RUNTIME_GetInputShapeDim";
    static const std::string kRead = "RUNTIME_GetInputDataInt32Dim";
    static const std::string kView = "RUNTIME_GetViewValidShapeDim";
    if (name == kShape && data.size() == 2 && !t_frames.empty()) {
        t_frames.back().dims.push_back(data[0] * 16 + data[1]);
    } else if (name.compare(0, kRead.size(), kRead) == 0 && data.size() >= 2) {
        g_checked.fetch_add(1);
        std::vector<long long> index(data.begin() + 1, data.end()), shape;
        bool inside = true;
        for (size_t d = 0; d < index.size(); d++) {
            shape.push_back(g_call(this, kShape, std::vector<long long>{data[0], (long long)d}, linear));
            inside = inside && index[d] >= 0 && index[d] < shape[d];
        }
        if (!inside) {
            Record(1, data[0], index, shape, -1, -1, -1, -1);
            return 0;
        }
    } else if (name == kView && data.size() == 3 && !t_frames.empty()) {
        const auto &operands = t_frames.back().operands;
        long long extent = data[0], offset = data[1], size = data[2];
        if (!operands.empty() && !operands[0].empty() && size > 0) {
            long long first = operands[0][0];
            bool one = true;
            for (auto d : operands[0]) one = one && d == first;
            g_checked.fetch_add(1);
            if (one && (offset < 0 || offset >= extent)) {
                Record(2, first / 16, std::vector<long long>{}, std::vector<long long>{}, first % 16, offset, size,
                       extent);
                return 0;   // nothing of it is read; the run goes on and is reported afterwards
            }
        }
    }
    return g_call(this, name, data, linear);
}

extern "C" void pfa_bounds_set_originals(void *call, void *scalar) {
    g_call = reinterpret_cast<CallFn>(call);
    g_scalar = reinterpret_cast<ScalarFn>(scalar);
}
extern "C" void pfa_bounds_reset() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_violations = 0; g_checked = 0;
    for (auto &v : g_first) v = -1;
}
extern "C" long long pfa_bounds_violations() { return g_violations.load(); }
extern "C" long long pfa_bounds_checked() { return g_checked.load(); }
extern "C" void pfa_bounds_first(long long *out) {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (int i = 0; i < 16; i++) out[i] = g_first[i];
}
'''


class OutOfBoundsRead(RuntimeError):
    """A kernel read an input outside its shape (W12); the message names the tensor and the index."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Violation:
    """The first out-of-bounds access of a run and how many there were.

    ``kind`` is "read" (a scalar read: ``index`` and the input's ``shape``) or "view" (a view of
    dimension ``dim`` of the input, of ``size`` elements at ``offset``, the dimension's extent being
    ``extent``; for a reshaped input the dimension and extent are the reshape's)."""
    kind: str
    input: int
    count: int
    index: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    dim: int = -1
    offset: int = 0
    size: int = 0
    extent: int = 0

    def describe(self, names=None) -> str:
        """One line naming the tensor (``names[input]`` when given) and the index."""
        name = names[self.input] if names and 0 <= self.input < len(names) else f"input {self.input}"
        more = f" ({self.count} out-of-bounds accesses in this run)" if self.count > 1 else ""
        if self.kind == "read":
            index = ", ".join(str(i) for i in self.index)
            shape = ", ".join(str(s) for s in self.shape)
            return f"the kernel read {name}[{index}], outside its shape [{shape}]{more}"
        where = "before its start" if self.offset < 0 else "at or past its end"
        return (f"the kernel viewed {self.size} rows of {name} at row {self.offset} along its dimension {self.dim} "
                f"(extent {self.extent} as the kernel views it), {where}{more}")


_SHIM: list = []


def _shim_path(cache: Path) -> Path:
    tag = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:12]
    return cache / f"bounds-shim-{tag}" / "libpfa_bounds_shim.so"


def preload() -> None:
    """W12. Build (once, into the cache) and load the shim with RTLD_GLOBAL. Must run before pypto's
    libraries are loaded: they bind their calls at load time (BIND_NOW). PyptoUnavailable on failure."""
    if _SHIM:
        return
    lib = _shim_path(_common.cache_root())
    _common.ensure_dir(lib.parent)
    with open(lib.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            src = lib.parent / "bounds_shim.cpp"
            src.write_text(SHIM_SOURCE)
            cxx = shutil.which("c++") or shutil.which("g++")
            if cxx is None:
                raise _common.PyptoUnavailable("W12: no C++ compiler on PATH for the bounds shim")
            proc = subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=0",
                                   str(src), "-o", f"{lib}.tmp"], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise _common.PyptoUnavailable(f"W12: building the bounds shim failed:\n{proc.stderr[-2000:]}")
            os.replace(f"{lib}.tmp", lib)
    shim = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    shim.pfa_bounds_violations.restype = ctypes.c_longlong
    shim.pfa_bounds_checked.restype = ctypes.c_longlong
    shim.pfa_bounds_first.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
    shim.pfa_bounds_set_originals.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    _SHIM.append(shim)


def attach(pypto) -> None:
    """W12. Give the shim pypto's two originals, then prove that libtile_fwk_interface.so's GOT slots
    for both point at the shim (else the check would be silently off: PyptoUnavailable)."""
    if not _SHIM:
        raise _common.PyptoUnavailable("W12: the bounds shim was not loaded before pypto")
    shim = _SHIM[0]
    path = Path(pypto.__file__).parent / "lib" / "libtile_fwk_interface.so"
    iface = ctypes.CDLL(str(path))            # already loaded by pypto: the same handle
    originals = [ctypes.cast(getattr(iface, s), ctypes.c_void_p).value for s in (CALL_SYMBOL, SCALAR_SYMBOL)]
    ours = [ctypes.cast(getattr(shim, s), ctypes.c_void_p).value for s in (CALL_SYMBOL, SCALAR_SYMBOL)]
    if originals == ours:
        raise _common.PyptoUnavailable("W12: the interface library resolved its own entry points to the shim")
    shim.pfa_bounds_set_originals(*originals)
    base = _load_base(iface)
    for symbol, mine in zip((CALL_SYMBOL, SCALAR_SYMBOL), ours, strict=True):
        slots = _got_slots(Path(os.path.realpath(path)), symbol)
        bound = [ctypes.c_void_p.from_address(base + s).value for s in slots]
        if not slots or any(b != mine for b in bound):
            raise _common.PyptoUnavailable(
                f"W12: libtile_fwk_interface.so does not call the bounds shim for {symbol[:40]}... "
                "(was pypto loaded before kernels.pypto_workarounds?)")
    _common.STATE["bounds"] = True


def attached() -> bool:
    return bool(_common.STATE.get("bounds"))


def reset() -> None:
    if _SHIM:
        _SHIM[0].pfa_bounds_reset()


def checked_count() -> int:
    """Reads and input views the shim checked since the last reset."""
    return int(_SHIM[0].pfa_bounds_checked()) if _SHIM else 0


def first_violation() -> Violation | None:
    """The first out-of-bounds access since the last reset, or None."""
    if not _SHIM:
        return None
    count = int(_SHIM[0].pfa_bounds_violations())
    if not count:
        return None
    raw = (ctypes.c_longlong * 16)()
    _SHIM[0].pfa_bounds_first(raw)
    kind, inp, rank = ("read" if raw[0] == 1 else "view"), int(raw[1]), int(raw[2])
    if kind == "read":
        return Violation(kind=kind, input=inp, count=count, index=tuple(raw[3:3 + rank]), shape=tuple(raw[7:7 + rank]))
    return Violation(kind=kind, input=inp, count=count, dim=int(raw[11]), offset=int(raw[12]), size=int(raw[13]), extent=int(raw[14]))


# --- proving the interposition: the GOT slots of a symbol, from the ELF file --------------------------

def _load_base(handle: ctypes.CDLL) -> int:
    """The load address (link_map.l_addr) of a loaded library, through dlinfo(RTLD_DI_LINKMAP)."""
    libc = ctypes.CDLL(None)
    dlinfo = libc.dlinfo
    dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    link_map = ctypes.c_void_p()
    if dlinfo(ctypes.c_void_p(handle._handle), 2, ctypes.byref(link_map)) != 0 or link_map.value is None:   # RTLD_DI_LINKMAP
        raise _common.PyptoUnavailable("W12: dlinfo could not find libtile_fwk_interface.so's load address")
    return ctypes.c_size_t.from_address(link_map.value).value


def _got_slots(path: Path, symbol: str) -> list[int]:
    """Offsets (from the load address) of the GOT slots the dynamic linker fills with ``symbol``: the
    r_offset of its JUMP_SLOT and GLOB_DAT relocations (ELF64, little endian)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise _common.PyptoUnavailable(f"W12: {path.name} is not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    slots = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 4 or not entsize:                        # SHT_RELA
            continue
        symtab = sections[link]
        strtab = sections[symtab[6]]
        for at in range(offset, offset + size, entsize):
            r_offset, r_info, _ = struct.unpack_from("<QQq", data, at)
            if r_info & 0xFFFFFFFF not in (6, 7):           # R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT
                continue
            st_name, = struct.unpack_from("<I", data, symtab[4] + (r_info >> 32) * symtab[9])
            start = strtab[4] + st_name
            if data[start:data.index(b"\0", start)].decode() == symbol:
                slots.append(r_offset)
    return slots
