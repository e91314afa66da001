"""Our PyPTO kernels and the backends that run them (SPEC §1, §6).

    backend = kernels.get_backend("sim")          # golden | sim | npu | auto | package.module:factory
    out = backend.paged_attention_fp8(**bundle.kwargs())

A backend that cannot run here raises kernels.BackendUnavailable(reason) when it is created; a run
or test session that named it fails with the reason. A case a backend does not run is a
kernels.Skip(kind, reason) from its skip_reason(config). pypto is imported only by the sim and npu
backends, and only when they are created.
"""
from kernels.backends import (SKIP_KINDS, Backend, BackendUnavailable, KernelRunError, Skip, get_backend,
                              resolve_device_index)

__all__ = ["Backend", "BackendUnavailable", "KernelRunError", "Skip", "SKIP_KINDS", "get_backend",
           "resolve_device_index"]
