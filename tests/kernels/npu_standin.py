"""A test-only stand-in for torch_npu, so that the npu backends run end to end without a 950 (issue 19).

What it stands in for, and how (nothing in kernels/ knows it exists):

- ``import torch_npu`` finds a module; ``torch.npu`` has ``is_available``, ``device_count`` (the devices
  of this "host", $PFA_VERIFY_STANDIN_DEVICES or 8, narrowed by ASCEND_RT_VISIBLE_DEVICES as CANN does:
  a process that sees one device calls it 0) and ``synchronize``; ``torch.device("npu:N")`` parses (the
  PrivateUse1 backend is named "npu", as torch_npu names it).
- Tensors stay on the CPU. A copy to an npu device (``Tensor.to``) or a tensor created on one
  (``torch.full(..., device=npu)``) is a new CPU tensor whose storage is recorded as "on npu:N"; a
  ``.cpu()`` of such a tensor is a copy back. Every transfer is an event (``EVENTS``), so a test sees
  their direction and device.
- pypto runs in SIM mode: a kernel wrapped by ``pypto.frontend.jit`` for ``RunMode.NPU`` is, when
  called, checked (every tensor argument must be "on" the device of the others) and executed by pypto's
  CPU calculator through the sim backend's workarounds (W1-W13: trace, calculator, bounds), with the
  spec's E4M3 (W13), since the npu backends declare the spec codec.

Only the chip itself stays unverified: its FP8 conversions, its memory, its scheduling.

Use :func:`install` (tests: with pytest's ``monkeypatch``, undone after the test), or name the factory
as a backend, ``--backend tests/kernels/npu_standin.py:npu`` (it installs the stand-in for good in the
process that builds it: a CLI run, a pool worker, a Ray task) or ``:pypto_gym_npu`` (PyPTO-Gym's
calling convention, with tests/kernels/upstream_convention_kernels.py:paged_attention).
"""
from __future__ import annotations

import importlib.machinery
import inspect
import os
import sys
import types

import torch

from pfa_verify import kernels
from pfa_verify.kernels import BackendUnavailable
from pfa_verify.kernels import pypto_workarounds as pw

EVENTS: list = []          # (kind, detail...) in call order: h2d, alloc, kernel, sync, d2h
# storage data_ptr -> (device index, the storage): holding the storage keeps its address from being
# reused by a host tensor, which would then read as on the device (a flake seen under pytest-xdist: a
# block table allocated where an earlier test's device tensor had been recorded a copy back).
_ON_DEVICE: dict = {}
_STATE: dict = {}


def device_count(environ=None) -> int:
    """The devices this process sees: ASCEND_RT_VISIBLE_DEVICES's list when set, else the host's."""
    env = os.environ if environ is None else environ
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    return int(env.get("PFA_VERIFY_STANDIN_DEVICES", "8"))


def _npu_index(device) -> int | None:
    if isinstance(device, torch.device) and device.type == "npu":
        return device.index or 0
    if isinstance(device, str) and device.startswith("npu"):
        return int(device.partition(":")[2] or 0)
    return None


def _where(tensor) -> int | None:
    if not isinstance(tensor, torch.Tensor):
        return None
    entry = _ON_DEVICE.get(tensor.untyped_storage().data_ptr())
    return None if entry is None else entry[0]


def _placed(tensor, index: int):
    storage = tensor.untyped_storage()
    _ON_DEVICE[storage.data_ptr()] = (index, storage)
    return tensor


def _patched_to(original):
    def to(self, *args, **kwargs):
        target = next((i for i in (_npu_index(a) for a in list(args) + [kwargs.get("device")]) if i is not None), None)
        if target is None:
            return original(self, *args, **kwargs)
        if target >= device_count():
            raise RuntimeError(f"npu:{target} is not a device of this process ({device_count()} visible)")
        rest = [a for a in args if _npu_index(a) is None]
        options = {k: v for k, v in kwargs.items() if k != "device"}
        moved = original(self, *rest, **options) if rest or options else self
        EVENTS.append(("h2d", target, tuple(self.shape), str(self.dtype)))
        return _placed(moved.clone(), target)
    return to


def _patched_cpu(original):
    def cpu(self, *args, **kwargs):
        index = _where(self)
        if index is None:
            return original(self, *args, **kwargs)
        EVENTS.append(("d2h", index, tuple(self.shape), str(self.dtype)))
        return self.clone()          # a new storage: not on the device
    return cpu


def _patched_full(original):
    def full(*args, device=None, **kwargs):
        index = _npu_index(device)
        if index is None:
            return original(*args, device=device, **kwargs)
        out = original(*args, **kwargs)
        EVENTS.append(("alloc", index, tuple(out.shape), str(out.dtype)))
        return _placed(out, index)
    return full


class _NpuKernel:
    """A kernel jitted for RunMode.NPU: on call, its tensors must be on one device; it runs on the sim."""

    def __init__(self, real_jit, fn, runtime: dict, pass_options, captured_locals):
        pypto = pw.load_pypto()
        self._fn, self._mode = fn, "NPU" if runtime.get("run_mode") == pypto.RunMode.NPU else str(runtime.get("run_mode"))
        self._sim = real_jit(runtime_options=dict(runtime, run_mode=pypto.RunMode.SIM), pass_options=pass_options,
                             verify_options={"enable_pass_verify": True, "pass_verify_pass_filter": []})(fn)
        # pypto's jit reads the kernel's free names from the frame that applied the decorator
        # (JitCallableWrapper._captured_locals): that frame is the kernel file's, not this one.
        self._sim._captured_locals = captured_locals

    def __call__(self, *args):
        places = [_where(a) for a in args if isinstance(a, torch.Tensor)]
        EVENTS.append(("kernel", getattr(self._fn, "__name__", "?"), self._mode, tuple(places)))
        if None in places or len(set(places)) != 1:
            raise RuntimeError(f"torch_npu stand-in: the kernel's tensors are not all on one NPU: {places}")
        with pw.sim_session(cost_model=False), pw.e4m3_codec("spec"):
            pw.execute_kernel(self._sim, list(args))


def _patched_jit(real_jit, pypto):
    def jit(*args, runtime_options=None, **kwargs):
        if args or (runtime_options or {}).get("run_mode") != pypto.RunMode.NPU:
            return real_jit(*args, runtime_options=runtime_options, **kwargs)

        def wrap(fn):
            frame = inspect.currentframe().f_back
            kernel = _NpuKernel(real_jit, fn, dict(runtime_options), kwargs.get("pass_options"), dict(frame.f_locals))
            kernel._original_func = fn
            return kernel
        return wrap
    return jit


def install(monkeypatch=None) -> list:
    """Put the stand-in in place (through ``monkeypatch`` when given, so a test undoes it); returns EVENTS.
    Needs pypto 0.2.0 (the sim backend's overlay); raises kernels.BackendUnavailable without it."""
    try:
        pypto = pw.load_pypto()
    except pw.PyptoUnavailable as exc:
        raise BackendUnavailable(f"torch_npu stand-in: pypto is needed for its SIM mode: {exc}") from None
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")        # for good: torch allows it once per process
    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    module.__version__ = "stand-in"
    npu = types.SimpleNamespace(is_available=lambda: device_count() > 0, device_count=device_count,
                                synchronize=lambda device=None: EVENTS.append(("sync", _npu_index(device))))
    real_jit = _STATE.setdefault("jit", pypto.frontend.jit)
    patches = [(torch.Tensor, "to", _patched_to(_STATE.setdefault("to", torch.Tensor.to))),
               (torch.Tensor, "cpu", _patched_cpu(_STATE.setdefault("cpu", torch.Tensor.cpu))),
               (torch, "full", _patched_full(_STATE.setdefault("full", torch.full))),
               (torch, "npu", npu), (pypto.frontend, "jit", _patched_jit(real_jit, pypto))]
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, "torch_npu", module)
        for owner, name, value in patches:
            monkeypatch.setattr(owner, name, value, raising=False)
    else:
        sys.modules["torch_npu"] = module
        for owner, name, value in patches:
            setattr(owner, name, value)
    EVENTS.clear()
    _ON_DEVICE.clear()
    return EVENTS


def npu(device=None, **options):
    """``--backend tests/kernels/npu_standin.py:npu``: our kernel's npu backend, under the stand-in."""
    install()
    backend = kernels.get_backend("npu", device=device, **options) if device is not None else \
        kernels.get_backend("npu", **options)
    backend.name = "tests/kernels/npu_standin.py:npu"
    return backend


def pypto_gym_npu(device=None, **options):
    """``--backend tests/kernels/npu_standin.py:pypto_gym_npu``: PyPTO-Gym's convention on the npu
    backend (tests/kernels/upstream_convention_kernels.py:paged_attention), under the stand-in."""
    install()
    name = "pypto-gym-npu:tests/kernels/upstream_convention_kernels.py:paged_attention"
    return kernels.get_backend(name, device=device, **options) if device is not None else kernels.get_backend(name, **options)
