"""W9: execute a pass-verify kernel by its traced tensor graph, and re-run the calculator alone on it
for the next call with the same static signature (the native side: kernels/pypto_workarounds/native.py)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pfa_verify.kernels.pypto_workarounds import _common, bounds
from pfa_verify.kernels.pypto_workarounds import native as pypto_native
from pfa_verify.kernels.pypto_workarounds.overlay import load_pypto

__all__ = ["execute_kernel", "forget_traces", "CalculatorFailed", "reverify_unavailable"]


class CalculatorFailed(RuntimeError):
    """W9: pypto's calculator threw while it re-ran a kept graph on new tensors (the message is its own)."""


# --- W9: execute = trace + calculator; the calculator alone on a kept tensor graph --------------------

@dataclass
class _Trace:
    """The traced graph W9b may re-run: valid while it is Program's last function and the wrapper's
    parser (which owns the Tensor objects its start arguments refer to) is the one that traced it."""
    wrapper: object
    key: tuple
    function: int
    parser: object


def _signature(wrapper, args) -> tuple:
    """Everything static about one call: non-tensor values, each tensor's dtype and non-dynamic dims."""
    pypto = _common.STATE["pypto"]
    defs = wrapper._cached_signature[0]
    statics = []
    for t, d in zip(args[:len(defs)], defs, strict=False):   # missing arguments: the wrapper's own call names them
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"W9: argument {d.name} must be a torch.Tensor, got {type(t).__name__}")
        dynamic = {i for i, dim in enumerate(d.shape) if isinstance(dim, pypto.SymbolicScalar)
                   or dim in (pypto.StatusType.DYN, pypto.StatusType.DYNAMIC)}
        statics.append((str(t.dtype), tuple(-1 if i in dynamic else int(n) for i, n in enumerate(t.shape))))
    return tuple(statics), tuple(repr(a) for a in args[len(defs):])


def execute_kernel(wrapper, args) -> str:
    """W9. Run a pass-verify kernel (a pypto.frontend.jit wrapper) on ``args`` and return "trace" (the
    first call of its static signature: trace + calculator, no pass pipeline, no cost model) or
    "reverify" (the calculator alone on the kept graph). Call inside sim_session(). The result is in
    the caller's tensors when it returns; a calculator failure on a kept graph raises CalculatorFailed.

    W12: a read of an input outside its shape during the run raises bounds.OutOfBoundsRead naming the
    kernel's parameter and the index (also when the calculator failed afterwards: the read came first).
    """
    bounds.reset()
    try:
        path = _execute(wrapper, args)
    except Exception as exc:
        _raise_out_of_bounds(wrapper, exc)
        raise
    _raise_out_of_bounds(wrapper, None)
    return path


def _raise_out_of_bounds(wrapper, cause) -> None:
    violation = bounds.first_violation()
    if violation is None:
        return
    signature = getattr(wrapper, "_cached_signature", None)
    names = [d.name for d in signature[0]] if signature else None
    raise bounds.OutOfBoundsRead(violation.describe(names)) from cause


def _execute(wrapper, args) -> str:
    pypto = load_pypto()
    handles = pypto_native.native(pypto, _common.cache_root())
    destinations = [(a.data_ptr(), a.numel() * a.element_size()) for a in args if isinstance(a, torch.Tensor)]
    key = _signature(wrapper, args)
    kept = _common.STATE.get("trace")
    if (handles.verify is not None and kept is not None and kept.wrapper is wrapper and kept.key == key
            and kept.function == pypto_native.last_function(handles) and kept.parser is wrapper._parser):
        defs = wrapper._cached_signature[0]
        tensors = wrapper._convert_tensors_with_metadata(list(args[:len(defs)]), defs)
        with pypto.options("jit_scope"):
            wrapper._set_config_option()
            wrapper._setup_verify_data(tensors)          # W3: ProgramData := copies of these tensors
            error = ctypes.create_string_buffer(4096)
            failed = handles.verify(error, len(error))
        if failed:
            forget_traces()
            raise CalculatorFailed("W9: pypto's calculator failed: " + error.value.decode(errors="replace"))
        pypto_native.copy_back(handles, destinations)
        pypto_native.release(handles)
        return "reverify"
    forget_traces()
    wrapper._host_options = dict(wrapper._host_options or {}, compile_stage=pypto.CompStage.TENSOR_GRAPH)
    # The cost-model hook would return at once at this stage; in its place, the copy back.
    wrapper._run_with_cpu = lambda in_tensors, out_tensors: pypto_native.copy_back(handles, destinations)
    try:
        wrapper(*args)
    finally:
        del wrapper._run_with_cpu
    pypto_native.release(handles)
    if handles.verify is not None:
        _common.STATE["trace"] = _Trace(wrapper, key, pypto_native.last_function(handles), wrapper._parser)
    return "trace"


def forget_traces() -> None:
    """W9. Drop the kept graph (after a failure or a reset, or to let its wrapper go)."""
    _common.STATE.pop("trace", None)


def reverify_unavailable() -> str | None:
    """None when W9b (the calculator alone on a kept graph) works in this process, else why not: then
    every call traces the kernel again (the same numbers, a few seconds more per call)."""
    handles = pypto_native.native(load_pypto(), _common.cache_root())
    return None if handles.verify is not None else (handles.why_not or "the verify shim is not loaded")
