"""What the sim and npu backends share: a PyPTO kernel, its static configuration and its jit wrappers.

A backend for PyPTO kernels runs one paged-attention kernel through hooks that a backend for another
kernel overrides, and nothing else (kernels/backends/upstream.py: PyPTO-Gym's kernel on the sim and
the npu; kernels/mutants/kernel_level.py: a mutated copy of ours):

  _make_pfa_kernel(run_mode=, pass_verify=)  the jit wrapper of the kernel (kernels/jit.py); ours is
                                             kernels/pfa_fp8.make_kernel
  _kernel_arguments(dims, out)               what the kernel takes after its eight input tensors;
                                             ours: (out, PagedAttentionKernelConfig)

:meth:`PyptoBackend._pfa_kernel` builds each wrapper once per backend and pass-verify setting.
"""
from __future__ import annotations

from typing import Any

from pfa_verify.kernels.backends import Backend
from pfa_verify.kernels.config import KERNEL_SHAPES, PagedAttentionKernelConfig

__all__ = ["PyptoBackend"]

#: The AT-12 kernel's name of each input dtype (kernels/at12.At12KernelConfig.dtype).
_AT12_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float8_e4m3fn": "fp8"}


class PyptoBackend(Backend):
    """Base of the sim and npu backends. Subclasses set ``_pypto`` (the module), ``run_mode`` (the
    name of a ``pypto.RunMode``), ``tiles`` (overrides of the kernel configuration), ``pass_options``
    (None: the upstream ones) and ``_kernels`` (a dict) before the first call."""

    supported_shapes = KERNEL_SHAPES
    run_mode: str = "SIM"
    # Set by the subclasses (above), declared here for the hooks below.
    _pypto: Any                              # the pypto module (it ships no types)
    tiles: dict[str, Any]
    pass_options: dict[str, Any] | None
    _kernels: dict[tuple[object, ...], Any]  # the jit wrappers built so far
    kernel_errors_spoil_process = True       # W7: a failure inside pypto's trace cannot be reset
    shrink_calls = 20                        # a sim case costs seconds: shrinking is bounded by count

    def kernel_config(self, dims) -> PagedAttentionKernelConfig:
        """The static configuration of our kernel for ``dims`` (golden.validate.PagedAttentionDims)."""
        return PagedAttentionKernelConfig.from_dims(dims, **self.tiles)

    def _kernel_arguments(self, dims, out) -> list:
        """What the kernel takes after its eight input tensors: ours, (out, PagedAttentionKernelConfig)."""
        return [out, self.kernel_config(dims)]

    def _make_pfa_kernel(self, *, run_mode, pass_verify: bool):
        """The jit wrapper of the paged-attention kernel (ours: kernels/pfa_fp8.make_kernel)."""
        from pfa_verify.kernels.pfa_fp8 import make_kernel

        return make_kernel(run_mode=run_mode, pass_verify=pass_verify, pass_options=self.pass_options)

    def _pfa_kernel(self, pass_verify: bool):
        """:meth:`_make_pfa_kernel` in this backend's run mode, built once per ``pass_verify``."""
        key = ("pfa", pass_verify)
        if key not in self._kernels:
            self._kernels[key] = self._make_pfa_kernel(run_mode=getattr(self._pypto.RunMode, self.run_mode),
                                                       pass_verify=pass_verify)
        return self._kernels[key]

    def _at12_kernel(self, q, k, scale: float, pass_verify: bool):
        """(jit kernel, At12KernelConfig) of our AT-12 kernel for these operands (kernels/at12.py)."""
        from pfa_verify.kernels.at12 import At12KernelConfig, make_at12_kernel

        cfg = At12KernelConfig(q_tile=q.shape[0], k_len=k.shape[0], head_dim=q.shape[1],
                               dtype=_AT12_DTYPES[str(q.dtype)], scale=scale)
        return make_at12_kernel(cfg, run_mode=getattr(self._pypto.RunMode, self.run_mode),
                                pass_verify=pass_verify), cfg
