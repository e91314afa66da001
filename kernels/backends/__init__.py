"""The backend interface and `get_backend` (one entry point; configuration in one place).

A backend has
  name      str, as given to get_backend
  codec     the golden.codec.Fp8Codec its FP8 conversions follow (the spec codec on hardware and in
            the golden, golden.codec.PYPTO_CALCULATOR_CODEC in pypto's CPU calculator)
  supported_shapes  None (any shape), or {"head_dim": (...), "block_size": (...)}: what the kernel is
            built for, so that strategies draw only cases it can run
  skip_reason(config) -> Skip | None: whether this backend runs a golden.PagedAttentionConfig here
            (the backend owns its limits; the base class runs everything)
  paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                      softmax_scale=None, s2_tile=128, g_tile=None, codec=None) -> bf16 CPU tensor
  qk_matmul_scale(q, k, *, scale=None, q_scale=None, k_scale=None, codec=None) -> fp32 CPU tensor
  spec_codec_not_applicable  None, or why a comparison under the spec codec says nothing about this
            backend's kernel (its own codec differs from the spec's and cannot be switched: the plain
            sim); reports show that comparison as not applicable
  model     (kernel backends) the golden.model.ConformanceModel it is judged by (SPEC §4.1; SPEC_MODEL
            unless kernels.probes measured otherwise)
  out_of_bounds_reads  None, or in words what the backend does about reads outside an input (the sim:
            errors, W12; the npu backend: not detected, and why)
with exactly the golden's arguments, validated by golden.validate (the same checks, not a copy).
`codec`, if given, must be the backend's own codec: a kernel cannot change how its hardware rounds.
Optional, for reports: `model` (a golden.model.ConformanceModel the backend declares) and
`kernel_source` (a KernelSource: the file its kernel was loaded from, that file's sha256 and the
function; get_backend sets it for our kernel, file and module factories, pypto-gym kernels);
`notes()`, what a run's header says once about the backend here (the sim: W9's fast path when it is
off); `threads`, the torch threads a process running it should use, applied by the owner of the
process (use_backend_threads), never by the backend. Files and modules named by the user are
loaded by kernels/backends/loader.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from pfa_verify import IMPORT_ROOT
from pfa_verify.golden.attention import visible_lengths
from pfa_verify.golden.codec import get_codec
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.model import declared_model
from pfa_verify.golden.validate import check_paged_attention_args, check_qk_matmul_scale_args
from pfa_verify.kernels.backends.loader import import_named_module, load_file_module, locate_module

__all__ = ["Backend", "BackendUnavailable", "KernelRunError", "Skip", "SKIP_KINDS", "spec_codec_options", "unwritten_output",
           "finish_output", "UNWRITTEN", "get_backend", "resolve_device_index",
           "BUILTIN_BACKENDS", "KernelSource", "use_backend_threads", "user_kernel_file"]


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine; `reason` says what is missing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class KernelRunError(RuntimeError):
    """The kernel ran but did not deliver its result (unwritten outputs, a simulator error): an
    ``error`` verdict, never a comparison."""


#: Output elements start as these bits (bf16; float32 for AT-12): NaNs with a payload no arithmetic
#: produces, so an element still holding them afterwards was never written by the kernel.
UNWRITTEN = {"bfloat16": 0x7FAB, "float32": 0x7FABCDEF}


def unwritten_output(shape, *, dtype=None, device=None):
    """A new output tensor of ``shape`` (bf16 unless ``dtype``) filled with the UNWRITTEN sentinel."""

    dtype = torch.bfloat16 if dtype is None else dtype
    name = str(dtype).removeprefix("torch.")
    ints = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
    return torch.full(tuple(shape), UNWRITTEN[name], dtype=ints, device=device).view(dtype)


def finish_output(out, kv_act_seqs=None, s1: int = 1, details: Callable[[], str] | None = None):
    """``out`` (on the CPU) after checking that the kernel wrote it: KernelRunError when an element
    that must be computed still holds UNWRITTEN (``details()``, when given and not empty, is appended). For paged attention (``kv_act_seqs`` given) the rows
    with ``cur == 0`` are the caller's zeros, SPEC §2 item 5: their untouched elements become 0."""


    bits = UNWRITTEN[str(out.dtype).removeprefix("torch.")]
    unwritten = out.view({2: torch.int16, 4: torch.int32}[out.element_size()]) == bits
    if kv_act_seqs is None:
        must = unwritten
    else:
        cur = visible_lengths(kv_act_seqs.cpu(), s1).reshape(-1)          # row b * S1 + i
        must = unwritten & (cur > 0).reshape(-1, *([1] * (out.dim() - 1)))
    missing = int(must.sum())
    if missing:
        first = tuple(int(x) for x in must.nonzero()[0])
        more = details() if details else ""
        raise KernelRunError(f"the kernel left {missing} of {out.numel()} output elements it must compute "
                             f"unwritten (first at {first})" + (f"; {more}" if more else ""))
    return out.masked_fill_(unwritten, 0.0)


#: Why a case was not checked: the kernel is not built for its shape; it is over a cost limit of this
#: backend here; the run's time budget is spent; the ledger quarantines it. (A kernel call that raises,
#: kernels.BackendUnavailable included, is an error, never a skip.)
SKIP_KINDS = ("unsupported", "limit", "budget", "quarantined")


@dataclasses.dataclass(frozen=True)
class Skip:
    """A case a backend does not run here: ``kind`` (one of SKIP_KINDS) and the reason, for people."""
    kind: str
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in SKIP_KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {SKIP_KINDS}")

    def __str__(self) -> str:
        return self.reason


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """Where a backend's kernel came from, so a report says which kernel it checked: ``source`` as the
    user named it (a path or a module), the resolved ``path`` of the file, the ``sha256`` of the file's
    bytes when it was loaded, and the ``function`` (kernel or factory) taken from it."""
    source: str
    path: str
    sha256: str
    function: str | None

    @classmethod
    def of_file(cls, path, function: str | None, source: str | None = None) -> KernelSource:

        file = Path(path).resolve()
        return cls(str(source if source is not None else path), str(file),
                   hashlib.sha256(file.read_bytes()).hexdigest(), function)

    @classmethod
    def of_module(cls, module, function: str | None, source: str | None = None) -> KernelSource | None:
        """The source of an imported module's file; None for a module without one (built in, namespace)."""
        file = getattr(module, "__file__", None)
        return cls.of_file(file, function, source or module.__name__) if file else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Backend:
    """Base class: argument handling shared by every backend. Subclasses implement `_paged_attention`
    and `_qk_matmul_scale`, which receive validated arguments."""

    name: str = "abstract"
    codec: Any = None
    supported_shapes: dict | None = None
    #: True only for what ``auto`` returns when no kernel backend could start (the golden).
    fallback: bool = False
    #: None, or why a comparison under the spec codec cannot judge this backend's kernel.
    spec_codec_not_applicable: str | None = None
    #: What the backend does about a kernel's reads outside its inputs, in words (None: unknown).
    out_of_bounds_reads: str | None = None
    #: torch threads a process running this backend should use (None: torch's default), applied by the
    #: owner of the process (use_backend_threads), never by the backend.
    threads: int | None = None
    #: True where a kernel that fails inside the backend can leave the process unusable (pypto 0.2.0's
    #: trace: kernels/pypto_workarounds, W7): a matrix of such backends gives each row a fresh process
    #: and ends a row at its first kernel error (cases/measuring/matrix.py).
    kernel_errors_spoil_process: bool = False
    #: At most this many law calls after a law's first failure while Hypothesis shrinks it (None: only
    #: Hypothesis' own limits, which include a five-minute clock). A count, not a clock, so that the same
    #: derandomized test shrinks to the same example on every run (tests/conftest.py, check_law).
    shrink_calls: int | None = None

    def notes(self) -> list[str]:
        """What a run should say once about this backend here (its header), e.g. a fast path that is off."""
        return []

    def skip_reason(self, config) -> Skip | None:
        """Why this backend does not run ``config`` (a golden.PagedAttentionConfig) here, or None."""
        return unsupported_shape(config, self.supported_shapes)

    def _check_codec(self, codec) -> None:
        if codec is None:
            return

        if get_codec(codec) is not self.codec:
            raise ValueError(f"codec={codec!r}: the {self.name} backend computes with {self.codec!r}; "
                             "pass codec=None or that codec")

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                            kv_act_seqs, *, softmax_scale=None, s2_tile=128, g_tile=None, codec=None):
        """bf16 [B*S1, NQ, D] on the CPU: the kernel's output for SPEC §2 (arguments as in §1)."""

        self._check_codec(codec)
        dims = check_paged_attention_args(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                          kv_act_seqs, softmax_scale=softmax_scale, s2_tile=s2_tile,
                                          g_tile=g_tile)
        return self._paged_attention(dims, q, q_scale, k_cache, k_scale, v_cache, v_scale,
                                     block_table, kv_act_seqs)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        """fp32 [q_tile, k_tile] on the CPU: AT-12 scores (SPEC §6)."""

        self._check_codec(codec)
        _, scale = check_qk_matmul_scale_args(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)
        return self._qk_matmul_scale(q, k, scale, q_scale, k_scale)

    def _paged_attention(self, dims, *tensors):
        raise NotImplementedError

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} codec={getattr(self.codec, 'name', None)!r}>"


def use_backend_threads(backend) -> None:
    """Set this process's torch threads to ``backend.threads`` (the sim's 1), or leave them. Called once
    by the owner of a process that runs ``backend``: the command line (a run or replay in one process);
    worker processes and test sessions set theirs in their initialisers. A backend never sets them:
    constructing one must not change the process it is made in."""
    threads = getattr(backend, "threads", None)
    if threads:
        torch.set_num_threads(threads)


def unsupported_shape(config, supported: Mapping[str, Collection[object]] | None) -> Skip | None:
    """A Skip("unsupported") when ``config`` has a head_dim or block_size outside ``supported``."""
    if not supported:
        return None
    bad = {k: getattr(config, k) for k, allowed in supported.items() if getattr(config, k) not in allowed}
    if not bad:
        return None
    wanted = " and ".join(f"{k} in {tuple(v)}" for k, v in supported.items())
    got = ", ".join(f"{k}={v}" for k, v in bad.items())
    return Skip("unsupported", f"the kernel is built for {wanted}; this case has {got}")


_WORKER = re.compile(r"^gw(\d+)$")


def runs_on_npu(backend) -> bool:
    """Whether ``backend`` (a backend, or the name it is asked for by) runs on an NPU device: ours (``npu``),
    ``pypto-gym-npu:...`` and anything built on kernels.backends.npu.NpuBackend. The one place that decides
    it: the worker pool gives such a backend a device per worker, and a cluster one NPU per task."""
    if isinstance(backend, str):
        return backend == "npu" or backend.startswith("pypto-gym-npu:")
    from pfa_verify.kernels.backends.npu import NpuBackend  # noqa: PLC0415 - it subclasses Backend, defined here
    return isinstance(backend, NpuBackend)


def limit_time(backend, max_seconds: float | None):
    """``backend`` with its per-call time limit set where it has one (the sim's ``max_seconds``):
    ``max_seconds`` None leaves the backend's own, 0 means no limit."""
    if max_seconds is not None and hasattr(backend, "max_seconds"):
        backend.max_seconds = max_seconds or None
    return backend


def resolve_device_index(device: int | str | None = None, environ=None) -> tuple[int, str]:
    """(device index, where it came from) for the npu backend.

    Order: the explicit `device` argument (an int, "3" or "npu:3"); 0 when ASCEND_RT_VISIBLE_DEVICES
    names exactly one device (what Ray gives a task that asked for one "NPU": the process sees that
    device only, as npu:0, whatever TILE_FWK_DEVICE_ID it inherited); the TILE_FWK_DEVICE_ID environment
    variable; the pytest-xdist worker index (PYTEST_XDIST_WORKER=gwN -> N); else 0. Indices count the
    devices the process sees. A value that is not a non-negative integer is a ValueError naming where it
    came from.
    """
    env = os.environ if environ is None else environ
    visible = [v.strip() for v in env.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if v.strip()]

    def parse(value, source: str) -> int:
        text = str(value).strip()
        if text.startswith("npu:"):
            text = text[4:]
        if isinstance(value, bool) or not text.isdigit():
            raise ValueError(f"{source}={value!r} must be a non-negative device index such as 0 or 'npu:0'")
        return int(text)

    if device is not None:
        return parse(device, "device"), "device argument"
    if len(visible) == 1:
        return 0, f"ASCEND_RT_VISIBLE_DEVICES={visible[0]} (the one NPU this process sees)"
    if env.get("TILE_FWK_DEVICE_ID", "").strip():
        return parse(env["TILE_FWK_DEVICE_ID"], "TILE_FWK_DEVICE_ID"), "TILE_FWK_DEVICE_ID"
    match = _WORKER.match(env.get("PYTEST_XDIST_WORKER", ""))
    if match:
        return int(match.group(1)), "PYTEST_XDIST_WORKER"
    return 0, "default"


def _golden(**options):
    from pfa_verify.kernels.backends.golden_backend import GoldenBackend  # noqa: PLC0415 - it subclasses Backend, defined here
    return GoldenBackend(**options)


def _our_kernel(backend):
    """``backend`` with the KernelSource of our kernel, kernels/pfa_fp8.py (read, not imported)."""
    backend.kernel_source = KernelSource.of_file(Path(__file__).resolve().parents[1] / "pfa_fp8.py", "make_kernel",
                                                 "kernels/pfa_fp8.py")
    return backend


def _sim(**options):
    from pfa_verify.kernels.backends.sim import SimBackend  # noqa: PLC0415 - it subclasses Backend, defined here
    return _our_kernel(SimBackend(**options))


def spec_codec_options(options: dict, name: str, plain: str) -> dict:
    """``options`` with ``e4m3='spec'``, for a backend whose name fixes the spec's codec (``name``, the
    ``plain`` backend with that codec); a contradicting ``e4m3`` is a UsageError (one line on the command
    line)."""
    if options.get("e4m3", "spec") != "spec":
        raise UsageError(f"e4m3={options['e4m3']!r}: {name} is the {plain} with e4m3='spec'; use {plain}")
    return {**options, "e4m3": "spec"}


def _sim_spec_codec(**options):
    """The sim backend with the spec's E4M3 in the calculator (kernels/pypto_workarounds/, W13)."""
    from pfa_verify.kernels.backends.sim import SimBackend  # noqa: PLC0415 - it subclasses Backend, defined here
    return SimBackend(**spec_codec_options(options, "sim-spec-codec", "sim"))


def _npu(device=None, **options):
    from pfa_verify.kernels.backends.npu import NpuBackend  # noqa: PLC0415 - it subclasses Backend, defined here
    return _our_kernel(NpuBackend(device=device, **options))


def _auto(device=None, **options):
    """The NPU when there is one, else the simulator, else the golden; ``selection`` says which and why.

    Falling back to the golden sets ``fallback``: such a run checks no kernel, and ``pfa-verify run``
    fails it unless ``--allow-fallback`` was given (a golden-only run is ``--backend golden``).
    """
    reasons = []
    for label, factory in (("npu", lambda: _npu(device=device, **options)), ("sim", lambda: _sim(**options))):
        try:
            backend = factory()
        except BackendUnavailable as exc:
            reasons.append(f"not {label}: {exc.reason}")
            continue
        backend.selection = f"auto chose {label}" + (f" ({'; '.join(reasons)})" if reasons else "")
        return backend
    backend = _golden()
    backend.fallback = True
    backend.selection = ("auto fell back to the golden: no kernel is checked by this run (" + "; ".join(reasons)
                         + "); name --backend golden to run the golden on purpose")
    return backend


def _load_file_factory(name: str):
    """(module, attribute) named by 'path/to/file.py:factory' (a test double kept outside any package),
    the path relative to the working directory or the project root (kernels/backends/loader.py)."""


    path, _, attr = name.rpartition(":")
    candidates = [Path(path), IMPORT_ROOT / path]
    file = next((c for c in candidates if c.is_file()), None)
    if file is None:
        raise UsageError(f"name={name!r}: no file {path!r} here or in the project root")
    return load_file_module(file, prefix="_pfa_backend_"), attr


BUILTIN_BACKENDS: dict[str, Callable[..., Backend]] = {"golden": _golden, "sim": _sim,
                                                       "sim-spec-codec": _sim_spec_codec, "npu": _npu, "auto": _auto}


def _pypto_gym(name: str, *, device=None, **options):
    from pfa_verify.kernels.backends.upstream import make_backend  # noqa: PLC0415 - it imports this module
    return make_backend(name, device=device, **options)


#: Backends named ``PREFIX:REST``, each factory called with the whole name (and ``device``, options): the
#: one resolver of prefixed names. kernels/__init__.py adds ``mutant:`` and ``conforming:``: those are
#: built on the backends, so they are registered from above them (:func:`register_prefix`).
PREFIXED: dict[str, Callable[..., Backend]] = {"pypto-gym:": _pypto_gym, "pypto-gym-spec-codec:": _pypto_gym,
                                               "pypto-gym-npu:": _pypto_gym}


def register_prefix(prefix: str, factory: Callable[..., Backend]) -> None:
    """Make :func:`get_backend` resolve names ``prefix...`` (``prefix`` ends in ':') with ``factory(name,
    device=..., **options)``."""
    if not (isinstance(prefix, str) and prefix.endswith(":") and prefix.count(":") == 1):
        raise ValueError(f"prefix={prefix!r} must be a word ending in one ':' (such as 'mutant:')")
    PREFIXED[prefix] = factory


def user_kernel_file(name: str) -> tuple[bool, Path | None, str | None]:
    """``(named by the user, file, function)`` of a backend name, found without running any of its code:
    ``path/file.py:factory`` (the file, here or in the project root), ``package.module:factory`` (the
    module's file, as the worker's import finds it), ``pypto-gym[-spec-codec|-npu]:SOURCE[:FUNCTION]``
    (the kernel file or module). The suite's own backends (golden, sim, sim-spec-codec, npu, auto,
    ``mutant:``, ``conforming:``) run only the suite's code: ``(False, None, None)``. A name that finds no
    file is ``(True, None, None)``: loading it fails in the worker, which says why."""
    if not isinstance(name, str) or name in BUILTIN_BACKENDS or ":" not in name:
        return False, None, None
    prefix = name.partition(":")[0] + ":"
    if prefix in PREFIXED and not prefix.startswith("pypto-gym"):
        return False, None, None
    if prefix.startswith("pypto-gym"):
        from pfa_verify.kernels.backends.upstream import parse_name  # noqa: PLC0415 - it imports this module
        try:
            _, source, function = parse_name(name)
        except ValueError:
            return True, None, None
        is_file = source.endswith(".py") or "/" in source
        file = Path(source) if is_file else locate_module(source, _worker_path())
        return True, (file.resolve() if file is not None and file.is_file() else None), function
    path, _, attr = name.rpartition(":")
    if ".py:" in name:
        file = next((c for c in (Path(path), IMPORT_ROOT / path) if c.is_file()), None)
        return True, (file.resolve() if file is not None else None), attr
    return True, locate_module(path, _worker_path()), attr


def _worker_path() -> list[str]:
    """Where a worker process's imports look: its working directory, the project root, then this
    process's own path (kernels/backends/worker_process.py starts workers so)."""
    return [os.getcwd(), str(IMPORT_ROOT), *sys.path[1:]]


def get_backend(name: str, *, device: int | str | None = None, **options) -> Backend:
    """The backend called `name`: golden, sim, sim-spec-codec (the sim with the spec's E4M3 in the
    calculator), npu, auto, an import path 'package.module:factory',
    a file path 'path/to/file.py:factory' (test doubles; relative to the working directory or the
    project root), a kernel in PyPTO-Gym's calling convention, 'pypto-gym:PATH.py[:FUNCTION]'
    (sim), 'pypto-gym-spec-codec:...' (sim-spec-codec) or 'pypto-gym-npu:...' (kernels/backends/upstream.py),
    and the names of :data:`PREFIXED`: 'mutant:NAME', a mutant of the catalog (kernels/mutants), and
    'conforming:NAME', a correct variant using SPEC §4.1's freedoms (kernels/conforming).

    - device: NPU index for npu/auto (see resolve_device_index); rejected for golden and sim.
    - options: passed to the backend (sim: level="execute" or "compile").
    Raises BackendUnavailable(reason) when the backend cannot run here, golden.errors.UsageError (a
    ValueError) for a bad name or a factory that returns no backend.
    """
    if not isinstance(name, str) or not name:
        raise UsageError(f"name={name!r} must be golden, sim, npu, auto or 'package.module:factory'")
    prefix = name.partition(":")[0] + ":"
    if ":" in name and prefix in PREFIXED:
        return PREFIXED[prefix](name, device=device, **options)
    if name in BUILTIN_BACKENDS:
        if device is not None and name in ("golden", "sim", "sim-spec-codec"):
            raise UsageError(f"device={device!r} applies to the npu backend only, not {name!r}")
        factory = BUILTIN_BACKENDS[name]
        return factory(device=device, **options) if name in ("npu", "auto") else factory(**options)
    if ":" not in name:
        raise UsageError(f"name={name!r} is not a backend; expected one of {sorted(BUILTIN_BACKENDS)} "
                         "or an import path 'package.module:factory'")
    try:
        if ".py:" in name:
            module, attr = _load_file_factory(name)
            module_name = module.__file__
            source = name.rpartition(":")[0]
        else:
            module_name, _, attr = name.partition(":")
            module, source = import_named_module(module_name), module_name
    except ValueError as exc:
        raise UsageError(str(exc) if str(exc).startswith("name=") else f"name={name!r}: {exc}") from None
    named = getattr(module, attr, None)     # the user's factory: what it returns is checked below
    if not callable(named):
        raise UsageError(f"name={name!r}: {module_name} has no callable {attr!r}")
    backend = named(device=device, **options) if device is not None else named(**options)
    missing = [a for a in ("name", "codec", "paged_attention_fp8") if not hasattr(backend, a)]   # qk_matmul_scale: optional
    if missing:
        raise UsageError(f"name={name!r}: the factory returned {type(backend).__name__}, which lacks {missing}")
    declared_model(backend)              # a wider model is refused when the backend is loaded, naming the field
    if getattr(backend, "kernel_source", None) is None:
        try:
            backend.kernel_source = KernelSource.of_module(module, attr, source)
        except (AttributeError, OSError):   # a backend that refuses attributes, a file gone since: not named
            pass
    return backend
