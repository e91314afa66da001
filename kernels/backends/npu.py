"""pypto on an Ascend 950 (run mode NPU) through torch_npu, imported only when this backend is made.

Device: the explicit argument, else TILE_FWK_DEVICE_ID, else the pytest-xdist worker index
(PYTEST_XDIST_WORKER=gwN -> N), else 0 (kernels.backends.resolve_device_index). Creating the backend
checks everything it needs and raises BackendUnavailable with the missing piece: torch_npu, an NPU,
the device index, pypto, a DAV_3510 chip.

Reads past a block-table row (PyPTO-Gym's kernel makes one on the catalog case
``edge_tail_tile_3_tokens``) are not detected here, and the backend says so
(``out_of_bounds_reads``); the sim backend reports them (kernels/pypto_workarounds/, W12). Poisoning
them on the device (a wider buffer, a narrow view) cannot be done honestly for the table:
- pypto reads ``block_table[b, j]`` as element ``b * MAXB + j`` of the tensor it is given, the row
  width taken from the shape (RUNTIME_GetInputDataInt32Dim2, framework symbolic_scalar_evaluate.cpp,
  tag r0.2.0 of hicann/pypto), and SPEC §1 asks for contiguous tensors. A narrow view with a wider row
  stride would be read as if it were contiguous, that is, wrongly; so a column past row b < B-1 lands
  on row b+1's first entry, a valid block id, whatever lies in memory.
- Giving the kernel a wider table with poison in the extra columns changes the input: MAXB is part of
  the call, and entries past a row's valid blocks are ones a kernel may legally read (SPEC §2.2).
- Only past the last row could a larger allocation hold poison behind the table; what a kernel does
  with a poisoned block id (a view far past the cache, which pypto clips to nothing) cannot be
  measured without a 950.
Run such cases on the sim backend.
"""
from __future__ import annotations

import importlib
import importlib.util

import torch

from pfa_verify.golden.codec import SPEC_CODEC
from pfa_verify.golden.model import DETERMINISTIC_MODEL
from pfa_verify.kernels.backends import BackendUnavailable, finish_output, resolve_device_index, unwritten_output
from pfa_verify.kernels.backends.pypto_backend import PyptoBackend

__all__ = ["NpuBackend"]


class NpuBackend(PyptoBackend):
    name = "npu"
    run_mode = "NPU"
    out_of_bounds_reads = ("not detected: pypto reads block_table[b, j] at b * MAXB + j of a contiguous table, so "
                           "a read past a row lands on the next row and no layout can poison it (kernels/backends/"
                           "npu.py); the sim backend reports such reads")

    def __init__(self, *, device=None, tiles: dict | None = None, pass_options: dict | None = None,
                 environ=None) -> None:
        self.device_index, self.device_source = resolve_device_index(device, environ)
        self.codec = SPEC_CODEC
        self.model = DETERMINISTIC_MODEL   # a fixed tile walk and order: the same bits every call
        self.tiles = dict(tiles or {})
        self.pass_options = pass_options
        self._check_available()
        self._kernels = {}

    def _check_available(self) -> None:
        if importlib.util.find_spec("torch_npu") is None:
            raise BackendUnavailable("npu backend: torch_npu is not installed (it needs an Ascend host "
                                     "with CANN)")
        try:
            importlib.import_module("torch_npu")
        except Exception as exc:  # noqa: BLE001 - any import failure means no NPU here
            raise BackendUnavailable(f"npu backend: importing torch_npu failed: {exc}") from None
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            raise BackendUnavailable("npu backend: torch_npu is installed but no NPU is available")
        count = npu.device_count()
        if self.device_index >= count:
            raise BackendUnavailable(f"npu backend: device {self.device_index} (from {self.device_source}) "
                                     f"does not exist; this host has {count} NPU(s)")
        if importlib.util.find_spec("pypto") is None:
            raise BackendUnavailable("npu backend: pypto is not installed")
        self._pypto = importlib.import_module("pypto")
        arch = str(self._pypto.platform.npuarch)
        if "3510" not in arch:
            raise BackendUnavailable(f"npu backend: the NPU reports {arch}; the FP8 kernel needs an "
                                     "Ascend 950 (DAV_3510)")
        self.device = torch.device(f"npu:{self.device_index}")

    def _to(self, x):
        return x.contiguous().to(self.device) if isinstance(x, torch.Tensor) else x

    def _paged_attention(self, dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                         kv_act_seqs):
        out = unwritten_output(q.shape, device=self.device)
        tensors = [self._to(t) for t in (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                         kv_act_seqs)]
        self._pfa_kernel(False)(*tensors, *self._kernel_arguments(dims, out))
        torch.npu.synchronize(self.device)  # type: ignore[attr-defined]  # torch_npu adds torch.npu
        return finish_output(out.cpu(), kv_act_seqs, dims.s1)

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        kernel, cfg = self._at12_kernel(q, k, scale, pass_verify=False)
        out = unwritten_output((q.shape[0], k.shape[0]), dtype=torch.float32, device=self.device)
        tensors = [q, k] + ([q_scale, k_scale] if cfg.dequant_after else [])
        kernel(*[self._to(t) for t in tensors], out)
        torch.npu.synchronize(self.device)  # type: ignore[attr-defined]  # torch_npu adds torch.npu
        return finish_output(out.cpu())
