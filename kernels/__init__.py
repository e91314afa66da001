"""Our PyPTO kernels and the backends that run them (SPEC §1, §6).

    backend = kernels.get_backend("sim")          # golden | sim | npu | auto | package.module:factory
    out = backend.paged_attention_fp8(**bundle.kwargs())

A backend that cannot run here raises kernels.BackendUnavailable(reason) when it is created; the
test suite turns that into a skip with the reason. pypto is imported only by the sim and npu
backends, and only when they are created.
"""
from kernels.backends import Backend, BackendUnavailable, get_backend, resolve_device_index

__all__ = ["Backend", "BackendUnavailable", "get_backend", "resolve_device_index"]
