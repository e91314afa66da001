"""W1 (the 950PR platform overlay), W2 (FP8 dtypes in pypto.converter), W3 (pass verify on the
caller's tensors), and load_pypto, which applies them (and W4's build hook, W11's API bridge, W12's
bounds shim, loaded before pypto and attached after) on import."""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

from pfa_verify.kernels.pypto_workarounds import _common, bounds, bridge, calculator

__all__ = ["build_overlay", "load_pypto"]

_PLATFORM_INI = Path(__file__).resolve().parent.parent / "platform" / "950PR_9579.ini"


# --- W1: platform overlay -------------------------------------------------------------------------

def _merge_ini(base_text: str, overrides_text: str) -> str:
    """Replace `key=value` lines of base_text, section by section, with the ones in overrides_text.

    Line based on purpose: configparser would lower-case keys and drop comments, and pypto's own
    parser reads the file literally. Keys an override adds to a section are appended to that section.
    """
    overrides: dict[str, dict[str, str]] = {}
    section = None
    for raw in overrides_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            overrides.setdefault(section, {})
        elif "=" in line and section is not None:
            key, value = line.split("=", 1)
            overrides[section][key.strip()] = value.strip()
    out: list[str] = []
    pending: dict[str, str] = {}
    section = None

    def flush() -> None:
        for key, value in pending.items():
            out.append(f"{key}={value}")
        pending.clear()

    for raw in base_text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            flush()
            section = line.strip("[]")
            pending.update(overrides.get(section, {}))
            out.append(raw)
            continue
        if section is not None and "=" in line and not line.startswith(("#", ";")):
            key = line.split("=", 1)[0].strip()
            if key in pending:
                out.append(f"{key}={pending.pop(key)}")
                continue
        out.append(raw)
    flush()
    return "\n".join(out) + "\n"


def _overlay_dir(src: Path) -> Path:
    tag = hashlib.sha256((str(src) + _PLATFORM_INI.read_text()).encode()).hexdigest()[:12]
    return _common.cache_root() / f"pypto-overlay-{_common.SUPPORTED_PYPTO_VERSION}-{tag}"


def build_overlay() -> Path:
    """W1. Build (once) the overlay and return the folder to put first on sys.path.

    Every file of the installed package becomes a symbolic link, except lib/configs/A2A3.ini which
    is a real file: the installed 910B description with the 950PR keys of kernels/platform/ merged
    in. pypto's libraries read the ini next to the path they were loaded from, which is the link's
    folder, so `pypto.platform.npuarch` reports DAV_3510.
    """
    src = _common.installed_pypto_dir()
    root = _overlay_dir(src)
    marker = root / ".complete"
    if marker.exists():
        return root
    tmp = Path(tempfile.mkdtemp(prefix=".overlay-", dir=_common.ensure_dir(_common.cache_root())))
    dst_pkg = tmp / "pypto"
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = Path(dirpath).relative_to(src)
        (dst_pkg / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            (dst_pkg / rel / name).symlink_to(Path(dirpath, name))
    ini = dst_pkg / "lib" / "configs" / "A2A3.ini"
    base = (src / "lib" / "configs" / "A2A3.ini").read_text()
    ini.unlink()
    ini.write_text(_merge_ini(base, _PLATFORM_INI.read_text()))
    (tmp / ".complete").write_text(str(src) + "\n")
    try:
        tmp.rename(root)
    except OSError:  # another process won the race; use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def load_pypto() -> ModuleType:
    """Import pypto from the 950PR overlay with W1-W4, W11 and W12 applied; raise PyptoUnavailable
    with a reason.

    Must run before anything else imports pypto in this process: a pypto imported from the installed
    folder has already read the 910B platform and cannot be switched (0.2.0 has no setter).
    """
    with _common.LOCK:
        if "pypto" in _common.STATE:
            return _common.STATE["pypto"]
        if "pypto" in sys.modules:
            loaded = Path(str(sys.modules["pypto"].__file__)).parent      # a pypto without a file: "None", refused
            if not str(loaded).startswith(str(_common.cache_root())):
                raise _common.PyptoUnavailable(
                    f"pypto was already imported from {loaded} before the 950PR overlay; the simulator "
                    "platform cannot be switched in this process (import kernels before pypto)")
        if shutil.which("cmake") is None or (shutil.which("c++") is None and shutil.which("g++") is None):
            raise _common.PyptoUnavailable("cmake and a C++ compiler are needed to build pypto's calculator")
        root = build_overlay()
        bounds.preload()                     # W12: before pypto's libraries bind their calls
        sys.path.insert(0, str(root))
        try:
            pypto = importlib.import_module("pypto")
        except ImportError as exc:
            raise _common.PyptoUnavailable(f"importing pypto failed: {exc}") from exc
        if not str(Path(str(pypto.__file__)).parent).startswith(str(root)):
            raise _common.PyptoUnavailable(f"pypto was imported from {pypto.__file__}, not the overlay {root}")
        arch = str(pypto.platform.npuarch)
        if "3510" not in arch:
            raise _common.PyptoUnavailable(f"the overlay did not switch the simulator to DAV_3510 (npuarch={arch})")
        _patch_fp8_dtypes(pypto)
        _patch_verify_inputs(pypto)
        calculator.patch_calculator_build(pypto)
        bridge.bridge_precision_type(pypto)
        bounds.attach(pypto)
        _common.STATE["pypto"] = pypto
        return pypto


# --- W2: FP8 dtypes in pypto.converter --------------------------------------------------------------

def _patch_fp8_dtypes(pypto: ModuleType) -> None:
    """W2. Teach pypto.converter._torch_dtype_from the FP8 types (0.2.0 raises ValueError for them).

    _gen_pto_tensor (host copies for pass verify and the cost model) looks the function up in the
    converter module at call time; the jit entry module imported it by name, so both are replaced.
    """
    converter = importlib.import_module("pypto.converter")
    original = converter._torch_dtype_from
    if _common.is_patched(original):
        return
    fp8 = {pypto.DT_FP8E4M3: torch.float8_e4m3fn, pypto.DT_FP8E5M2: torch.float8_e5m2}

    def torch_dtype_from(dtype):
        if dtype in fp8:
            return fp8[dtype]
        return original(dtype)

    _common.mark_patched(torch_dtype_from)
    converter._torch_dtype_from = torch_dtype_from  # type: ignore[attr-defined]  # pypto ships no types
    entry = importlib.import_module("pypto.frontend.parser.entry")
    entry._torch_dtype_from = torch_dtype_from  # type: ignore[attr-defined]  # pypto ships no types


# --- W3: register the caller's tensors for pass verify ----------------------------------------------

def _patch_verify_inputs(pypto: ModuleType) -> None:
    """W3. Make pass verify run the calculator on the caller's tensors, not zero-filled copies.

    0.2.0's JitCallableWrapper._setup_verify_data makes zero-filled host tensors, "copies" into them
    and registers those, so the graph runs on zeros and the inputs come back zeroed. On the CPU the
    caller's tensors already are host tensors, so we register them directly: the calculator then
    writes the kernel's result into the caller's `out` and leaves the inputs alone.
    """
    entry = importlib.import_module("pypto.frontend.parser.entry")
    wrapper = entry.JitCallableWrapper
    if _common.is_patched(wrapper._setup_verify_data):
        return
    impl = pypto.pypto_impl
    verify_datas = importlib.import_module("pypto.runtime")._pto_verify_datas

    def setup_verify_data(pto_tensors) -> None:
        if not pypto.get_verify_options().get("enable_pass_verify"):
            return
        calculator.load_calculator()
        datas = [impl.DeviceTensorData(t.dtype, t.data_ptr, list(t.ori_shape)) for t in pto_tensors]
        impl.SetVerifyData(datas, [], verify_datas.get_data())

    _common.mark_patched(setup_verify_data)
    wrapper._setup_verify_data = staticmethod(setup_verify_data)


