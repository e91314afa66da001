"""Our PyPTO kernels and the backends that run them (SPEC §1, §6).

    backend = kernels.get_backend("sim")          # kernels.get_backend's docstring lists every name
    out = backend.paged_attention_fp8(**bundle.kwargs())

A backend that cannot run here raises kernels.BackendUnavailable(reason) when it is created; a run
or test session that named it fails with the reason. A case a backend does not run is a
kernels.Skip(kind, reason) from its skip_reason(config). pypto is imported only by the sim and npu
backends, and only when they are created.
"""
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import (
    SKIP_KINDS,
    Backend,
    BackendUnavailable,
    KernelRunError,
    Skip,
    get_backend,
    register_prefix,
    resolve_device_index,
)
from pfa_verify.kernels.conforming import get_variant
from pfa_verify.kernels.mutants import get_mutant

__all__ = ["Backend", "BackendUnavailable", "KernelRunError", "Skip", "SKIP_KINDS", "get_backend",
           "resolve_device_index"]


def _mutant(name: str, *, device=None, **options) -> Backend:
    """``mutant:NAME``: a mutant of the catalog (kernels/mutants)."""
    if device is not None:
        raise UsageError(f"device={device!r}: the mutants run on the CPU (golden level) or the sim; drop --device")
    return get_mutant(name.removeprefix("mutant:"), **options)


def _conforming(name: str, *, device=None, **options) -> Backend:
    """``conforming:NAME``: a correct variant using SPEC §4.1's freedoms (kernels/conforming)."""
    if device is not None:
        raise UsageError(f"device={device!r}: the conforming variants run on the CPU; drop --device")
    return get_variant(name.removeprefix("conforming:"), **options)


# Both build on the backends, so they join the one resolver (kernels.backends.get_backend) from here.
register_prefix("mutant:", _mutant)
register_prefix("conforming:", _conforming)
