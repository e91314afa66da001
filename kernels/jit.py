"""The one place that wraps a kernel function with ``pypto.frontend.jit`` for a backend.

Every kernel of this project (kernels/pfa_fp8.py, kernels/at12.py, the probe kernels) and every kernel
loaded from elsewhere (PyPTO-Gym's, kernels/backends/upstream.py) is wrapped here, so the run mode and
pass verify are spelled once:

- ``run_mode``: ``pypto.RunMode.SIM`` (compile on the CPU) or ``pypto.RunMode.NPU`` (an Ascend 950);
- ``pass_verify``: run the kernel's tensor graph in pypto's CPU calculator (VERIFY_OPTIONS: pass verify
  on, no per-pass comparison, which fails on FP8 tensors in 0.2.0: shared/PYPTO_0.2.0_ON_CPU.md), on
  the caller's tensors (kernels/pypto_workarounds/, W3) and stopped after the trace (W9);
- ``runtime_options`` and ``pass_options``: the kernel's own (kernels/config.py for ours, the jit
  wrapper's for a PyPTO-Gym file); ``run_mode`` overrides the runtime's.

Importable without pypto; :func:`jit` imports it, so call it only after
kernels.pypto_workarounds.load_pypto() (or, on a 950, after torch_npu).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["VERIFY_OPTIONS", "jit_options", "jit"]

#: pypto 0.2.0's pass verify with the calculator's result kept, and no per-pass comparison.
VERIFY_OPTIONS = {"enable_pass_verify": True, "pass_verify_pass_filter": []}


def jit_options(*, run_mode, pass_verify: bool, runtime_options: dict | None = None,
                pass_options: dict | None = None) -> dict[str, Any]:
    """The keyword arguments of ``pypto.frontend.jit`` for one backend (module docstring)."""
    options: dict[str, Any] = {"runtime_options": dict(runtime_options or {}, run_mode=run_mode)}
    if pass_verify:
        options["verify_options"] = dict(VERIFY_OPTIONS, pass_verify_pass_filter=[])
    if pass_options is not None:
        options["pass_options"] = dict(pass_options)
    return options


def jit(*, run_mode, pass_verify: bool, runtime_options: dict | None = None,
        pass_options: dict | None = None) -> Callable[[Callable], Any]:
    """A decorator: ``pypto.frontend.jit`` with :func:`jit_options`. ``jit(...)(fn)`` or ``@jit(...)``."""
    import pypto

    return pypto.frontend.jit(**jit_options(run_mode=run_mode, pass_verify=pass_verify,
                                            runtime_options=runtime_options, pass_options=pass_options))
