"""Kernels in PyPTO-Gym's calling convention, checked as they are shipped: ``--backend pypto-gym:SOURCE``.

PyPTO-Gym's FP8 paged-attention kernel (``pfa_func_kernel_v2_bound`` in
src/pypto_gym/ops/pypto_tensor/experimental/ops_transformer/page_attention_quant/page_attention_quant_fp8_impl.py
of hicann/pypto-gym) takes

    (q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, atten_out, softmax_scale, tile_config)

with the tensors of SPEC §1 (k, v: the paged caches; atten_out: the bf16 output) and ``tile_config`` an
object with ``g_tile, s2_tile, c1_tile_shape, v1_tile_shape, c2_tile_shape, v2_tile_shape``. This
backend loads such a kernel from a file or a module without changing it, takes the undecorated
function its ``pypto.frontend.jit`` wrapper keeps, and wraps it again for the sim backend (SIM run
mode, pass verify on the caller's tensors, W9 execution: everything the sim backend does for our own
kernel, batch chunks included) or the npu backend, keeping the file's own runtime and pass options.

Names (kernels.get_backend, --backend):

    pypto-gym:PATH.py[:FUNCTION]       a kernel file, on the sim backend
    pypto-gym:package.module[:FUNCTION] an importable module, on the sim backend
    pypto-gym-spec-codec:...           the same on the sim-spec-codec backend (the spec's E4M3, W13)
    pypto-gym-npu:...                  the same on an Ascend 950 (torch_npu)

FUNCTION defaults to ``pfa_func_kernel_v2_bound``. The tile configuration follows PyPTO-Gym's own
``create_config`` (same file), applied to the call's ``s2_tile`` and ``g_tile``: c1 and c2 tiles
``[[128, 128]] * 3``, v1 tile ``[128, 128]`` whatever s2_tile is (create_config's ``s2_tile`` local is
128), v2 tile ``[128, 256]``; ``tiles={...}`` overrides any field. Built with the file's
``PfaTileShapeConfig`` when it has one. Shapes: head_dim and block_size 128, as upstream tests them
(``supported=`` overrides); anything else is a Skip("unsupported"). ``kernel_source`` names the file
(or module) the kernel was loaded from, its sha256 and the function, for the reports.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

from pfa_verify.golden.errors import UsageError, check_known
from pfa_verify.golden.model import SPEC_MODEL
from pfa_verify.kernels.backends import KernelSource, spec_codec_options
from pfa_verify.kernels.backends.loader import import_named_module, load_file_module
from pfa_verify.kernels.backends.npu import NpuBackend
from pfa_verify.kernels.backends.pypto_backend import PyptoBackend
from pfa_verify.kernels.backends.sim import SimBackend
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.kernels.jit import jit

__all__ = ["UPSTREAM_FUNCTION", "UpstreamTileConfig", "upstream_tile_config", "load_kernel", "UpstreamKernelBackend",
           "UpstreamNpuBackend", "parse_name", "make_backend"]

UPSTREAM_FUNCTION = "pfa_func_kernel_v2_bound"
_PARAMETERS = 11          # 9 tensors, softmax_scale, tile_config
_CUBE = [[128, 128], [128, 128], [128, 128]]


@dataclasses.dataclass(frozen=True)
class UpstreamTileConfig:
    """PyPTO-Gym's PfaTileShapeConfig fields, for kernel files that do not define the class."""
    g_tile: int
    s2_tile: int
    c1_tile_shape: list
    v1_tile_shape: list
    c2_tile_shape: list
    v2_tile_shape: list


def upstream_tile_config(*, g_tile: int, s2_tile: int, factory: Callable[..., Any] | None = None,
                         overrides: dict[str, Any] | None = None) -> Any:
    """PyPTO-Gym's create_config rule for one call (module docstring), built by ``factory`` (the kernel
    file's own PfaTileShapeConfig, or :class:`UpstreamTileConfig`)."""
    fields: dict[str, Any] = dict(g_tile=g_tile, s2_tile=s2_tile, c1_tile_shape=_CUBE, v1_tile_shape=[128, 128], c2_tile_shape=_CUBE,
                  v2_tile_shape=[128, 256])
    check_known(f"tiles={overrides!r}", "field", overrides or {}, sorted(fields))
    fields.update(overrides or {})
    return (factory or UpstreamTileConfig)(**fields)


_MODES = {"pypto-gym": "sim", "pypto-gym-spec-codec": "sim-spec-codec", "pypto-gym-npu": "npu"}
_PREFIXES = {mode: prefix for prefix, mode in _MODES.items()}    # the backend's own name -> the name's prefix


def parse_name(name: str) -> tuple[str, str, str]:
    """(mode, source, function) of ``pypto-gym[-spec-codec|-npu]:SOURCE[:FUNCTION]``; mode is "sim",
    "sim-spec-codec" or "npu"; ValueError otherwise."""
    match = re.fullmatch(r"(pypto-gym|pypto-gym-spec-codec|pypto-gym-npu):(.+?)(?::([A-Za-z_]\w*))?", name)
    if not match:
        raise UsageError(f"name={name!r} must be pypto-gym:PATH.py[:FUNCTION] or pypto-gym:package.module[:FUNCTION] "
                         "(pypto-gym-spec-codec:... for the spec's E4M3 on the sim, pypto-gym-npu:... on a 950)")
    return _MODES[match.group(1)], match.group(2), match.group(3) or UPSTREAM_FUNCTION


def _import(source: str):
    """The module of a kernel file (a path: it ends in .py or holds a /) or an importable module."""
    try:
        if source.endswith(".py") or "/" in source:
            return load_file_module(source, prefix="_pfa_upstream_")
        return import_named_module(source)
    except ValueError as exc:
        raise UsageError(f"kernel source {exc}" if str(exc).startswith("'") else f"kernel source: {exc}") from None


def load_kernel(source: str, function: str = UPSTREAM_FUNCTION):
    """(undecorated kernel function, its jit wrapper or None, the module) of ``function`` in ``source``.

    ValueError naming the source and function when the function is missing, not a function, or not in
    the upstream calling convention (11 parameters: 9 tensors annotated ``pypto.Tensor``, then
    softmax_scale and tile_config)."""
    module = _import(source)
    wrapped = getattr(module, function, None)
    if wrapped is None:
        raise UsageError(f"kernel source {source!r} has no {function!r}")
    fn = getattr(wrapped, "_original_func", wrapped)
    if not inspect.isfunction(fn):
        raise UsageError(f"{source}:{function} is a {type(wrapped).__name__}, not a kernel function")
    params = list(inspect.signature(fn).parameters.values())
    tensors = [p for p in params[:9] if "Tensor" in repr(p.annotation)]
    if len(params) != _PARAMETERS or len(tensors) != 9:
        got = ", ".join(p.name for p in params)
        raise UsageError(f"{source}:{function}({got}) is not in the upstream calling convention: expected 9 "
                         "pypto.Tensor parameters (q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, "
                         "atten_out), then softmax_scale and tile_config")
    return fn, (wrapped if wrapped is not fn else None), module


class _UpstreamKernel(PyptoBackend):
    """A PyPTO-Gym-convention kernel behind a PyptoBackend's hooks (kernels/backends/pypto_backend.py):
    its own jit wrapper (the file's runtime and pass options, the backend's run mode and pass verify),
    its arguments after the tensors (softmax_scale, the create_config tiles), no AT-12 entry. Mixed in
    before SimBackend or NpuBackend (both PyptoBackends, after it in the MRO), which do everything else
    (W9, batch chunks, the device)."""

    #: A paged-attention kernel: it has no AT-12 entry (its AT-12 laws are not run, kernels.Capabilities).
    operators = ("paged_attention_fp8",)

    def __init__(self, source: str, function: str = UPSTREAM_FUNCTION, *, tiles: dict | None = None,
                 supported: dict | None = None, **options) -> None:
        super().__init__(**options)        # the sim's pypto from the overlay (W1-W13), or the npu's checks, first
        self._fn, self._jit, self._module = load_kernel(source, function)
        self.kernel_source = KernelSource.of_module(self._module, function, source)
        prefix = _PREFIXES[self.name.removesuffix("-compile")]
        self.name = f"{prefix}:{source}" + (f":{function}" if function != UPSTREAM_FUNCTION else "")
        if self.spec_codec_not_applicable:   # name the spec-codec form of this backend, not of ours
            self.spec_codec_not_applicable = self.spec_codec_not_applicable.replace(
                "--backend sim-spec-codec", f"--backend pypto-gym-spec-codec:{source}")
        self.tile_overrides = dict(tiles or {})
        self.supported_shapes = dict(supported or KERNEL_SHAPES)
        self._factory = getattr(self._module, "PfaTileShapeConfig", None)
        # A kernel from a file is not ours to vouch for: SPEC §4.1 as written judges it, which lets two calls
        # take their freedoms differently (our kernel on the sim declares DETERMINISTIC_MODEL).
        self.model = SPEC_MODEL

    def tile_config(self, dims):
        return upstream_tile_config(g_tile=dims.g_tile, s2_tile=dims.s2_tile, factory=self._factory,
                                    overrides=self.tile_overrides)

    def _make_pfa_kernel(self, *, run_mode, pass_verify: bool):
        return jit(run_mode=run_mode, pass_verify=pass_verify,
                   runtime_options=getattr(self._jit, "_runtime_options", None),
                   pass_options=getattr(self._jit, "_pass_options", None))(self._fn)

    def _kernel_arguments(self, dims, out) -> list:
        return [out, dims.softmax_scale, self.tile_config(dims)]


class UpstreamKernelBackend(_UpstreamKernel, SimBackend):
    """A PyPTO-Gym-convention kernel on the sim backend (``e4m3="spec"``: the sim-spec-codec backend)."""


class UpstreamNpuBackend(_UpstreamKernel, NpuBackend):
    """A PyPTO-Gym-convention kernel on an Ascend 950 (run mode NPU, the file's own options)."""


def make_backend(name: str, *, device=None, **options):
    """The backend named ``pypto-gym[-npu]:SOURCE[:FUNCTION]`` (kernels.get_backend's entry)."""
    mode, source, function = parse_name(name)
    if mode == "npu":
        return UpstreamNpuBackend(source, function, device=device, **options)
    if device is not None:
        raise UsageError(f"device={device!r} applies to pypto-gym-npu:..., not {name!r}")
    if mode == "sim-spec-codec":
        options = spec_codec_options(options, name, "pypto-gym:...")
    return UpstreamKernelBackend(source, function, **options)
