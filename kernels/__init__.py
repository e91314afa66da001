"""Our PyPTO kernels and the backends that run them (SPEC §1, §6).

    backend = kernels.get_backend("sim")          # kernels.get_backend's docstring lists every name
    out = backend.paged_attention_fp8(**bundle.kwargs())

A backend that cannot run here raises kernels.BackendUnavailable(reason) when it is created; a run
or test session that named it fails with the reason. A case a backend does not run is a
kernels.Skip(kind, reason) from its skip_reason(config). pypto is imported only by the sim and npu
backends, and only when they are created.
"""
from golden.errors import UsageError
from kernels.backends import SKIP_KINDS, Backend, BackendUnavailable, KernelRunError, Skip, resolve_device_index
from kernels.backends import get_backend as _builtin_backend

__all__ = ["Backend", "BackendUnavailable", "KernelRunError", "Skip", "SKIP_KINDS", "get_backend",
           "resolve_device_index"]


def get_backend(name: str, *, device: int | str | None = None, **options) -> Backend:
    """The backend called ``name`` (kernels.backends.get_backend: golden, sim, sim-spec-codec, npu, auto,
    an import or file path, pypto-gym:...), ``mutant:NAME``, a mutant of the catalog (kernels/mutants;
    issue 12), or ``conforming:NAME``, a correct variant using SPEC §4.1's freedoms (kernels/conforming;
    issue 16). Both build on the backends, so they are resolved here, above them."""
    if isinstance(name, str) and name.startswith("mutant:"):
        if device is not None:
            raise UsageError(f"device={device!r}: the mutants run on the CPU (golden level) or the sim; drop --device")
        from kernels.mutants import get_mutant
        return get_mutant(name.removeprefix("mutant:"), **options)
    if isinstance(name, str) and name.startswith("conforming:"):
        if device is not None:
            raise UsageError(f"device={device!r}: the conforming variants run on the CPU; drop --device")
        from kernels.conforming import get_variant
        return get_variant(name.removeprefix("conforming:"), **options)
    return _builtin_backend(name, device=device, **options)
