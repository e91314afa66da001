"""Test-double backends for ``pfa-verify run`` (importable by file path, as captured regressions name them).

- :class:`PerturbOne`: the golden, with one output element moved far out of tolerance (a kernel-logic bug).
- :class:`SmallOnly`: the golden with a cost limit (a backend that skips what it cannot afford).
- :class:`CalculatorCodec`: the golden computed with pypto's CPU-calculator codec, declaring that codec
  (a kernel whose only difference from the spec is its platform's FP8 conversions).
- :class:`DeclaresNoModel`: the golden, declaring no model (judged by SPEC §4.1 as written).
- :func:`loose_exp`: the golden declaring a model wider than SPEC §4.1 (exp within 63 ulp): refused.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import torch

from pfa_verify.golden.codec import PYPTO_CALCULATOR_CODEC
from pfa_verify.golden.model import EXACT_MODEL, SPEC_MODEL
from pfa_verify.kernels import BackendUnavailable, KernelRunError, Skip, get_backend
from pfa_verify.kernels.backends import finish_output, unwritten_output
from pfa_verify.kernels.backends.golden_backend import GoldenBackend
from pfa_verify.kernels.backends.sim_cost import Estimate


class PerturbOne(GoldenBackend):
    """Adds 0.5 to output element (row 0, head 1, d 3) whenever the row has visible tokens."""
    name = "tests/cases/run_doubles.py:PerturbOne"
    INDEX = (0, 1, 3)

    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs).clone()
        row, h, d = self.INDEX
        if out.shape[1] > h and out.shape[2] > d:
            out[row, h, d] += torch.tensor(0.5, dtype=out.dtype)
        return out


class SmallOnly(GoldenBackend):
    """The golden, declaring a cost limit: cases with more than 10,000 scores are Skip("limit")."""
    name = "tests/cases/run_doubles.py:SmallOnly"

    def skip_reason(self, config):
        scores = config.batch * config.s1 * config.nq * config.s2
        return Skip("limit", f"{scores} scores is over this double's limit of 10000") if scores > 10_000 else None


class HeadDim128Only(GoldenBackend):
    """The golden, declaring the shapes our kernel is built for (kernels/config.py KERNEL_SHAPES)."""
    name = "tests/cases/run_doubles.py:HeadDim128Only"
    supported_shapes: ClassVar[dict] = {"head_dim": (128,), "block_size": (128,)}


class CalculatorCodec(GoldenBackend):
    """The golden under golden.codec.PYPTO_CALCULATOR_CODEC, declaring that codec."""
    name = "tests/cases/run_doubles.py:CalculatorCodec"

    def __init__(self) -> None:
        super().__init__(codec=PYPTO_CALCULATOR_CODEC)


def golden_on_worker_0_only(**options):
    """The golden in the supervisor's worker 0; BackendUnavailable in any other (a device only worker 0
    has): the other workers run nothing, worker 0 runs every case, and the report says so.

    Worker 0 loads only once worker 1 has refused (a marker file beside their driver's pid, at most 60 s):
    otherwise a short run can end while worker 1 is still importing, and then it has refused nothing yet."""
    refused = Path(tempfile.gettempdir()) / f"pfa-verify-test-refused-{os.getppid()}"
    if os.environ.get("PFA_VERIFY_WORKER_SLOT", "0") != "0":
        refused.touch()
        raise BackendUnavailable("no device for this worker")
    deadline = time.monotonic() + 60
    while not refused.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    refused.unlink(missing_ok=True)
    return GoldenBackend()


def no_device_anywhere(**options):
    """A backend that cannot start in any worker: the run cannot start (one line, exit 2)."""
    raise BackendUnavailable("no device for this worker")


def calculator_codec_logic_bug(**options):
    """A kernel on the calculator with a real logic bug: tests/properties/doubles.py's DropLastS2Tile
    (the KV walk stops before the last s2 tile) under the calculator's codec. Fails under its own
    codec too."""
    backend = get_backend("tests/properties/doubles.py:DropLastS2Tile", codec=PYPTO_CALCULATOR_CODEC)
    backend.name = "tests/cases/run_doubles.py:calculator_codec_logic_bug"
    return backend


class WritesNothing(GoldenBackend):
    """A kernel whose run returns without writing its output (a simulator that skipped the work)."""
    name = "tests/cases/run_doubles.py:WritesNothing"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        return finish_output(unwritten_output(q.shape), kv_act_seqs, q.shape[0] // kv_act_seqs.shape[0])


class EstimatedSlow(GoldenBackend):
    """The golden, declaring a cost model that puts every case at 1000 s (for budget decisions)."""
    name = "tests/cases/run_doubles.py:EstimatedSlow"

    def estimate(self, config):
        return Estimate(seconds=1000.0, peak_bytes=1e9, chunks=1)


class DeclaresExactModel(GoldenBackend):
    """The golden, declaring the narrowest conformance model (golden.model.EXACT_MODEL) for reports."""
    name = "tests/cases/run_doubles.py:DeclaresExactModel"

    def __init__(self) -> None:
        super().__init__()
        self.model = EXACT_MODEL


class DiesOnTheTailCase(GoldenBackend):
    """The golden, except that a worker process running the catalog's edge_tail_tile_3_tokens (a [1, 5]
    block table, 8 query heads) kills itself with SIGKILL, as the OOM killer or a crash would: once per
    marker file in $PFA_VERIFY_TEST_DEATHS (so the retry passes), or every time when that folder holds a
    file named ``always``. Never in the process named by $PFA_VERIFY_TEST_DRIVER (the driver)."""
    name = "tests/cases/run_doubles.py:DiesOnTheTailCase"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        deaths = Path(os.environ.get("PFA_VERIFY_TEST_DEATHS", "/nonexistent"))
        worker = str(os.getpid()) != os.environ.get("PFA_VERIFY_TEST_DRIVER")
        if worker and deaths.is_dir() and tuple(block_table.shape) == (1, 5) and q.shape[1] == 8:
            marker = deaths / f"died-{os.getpid()}"
            if (deaths / "always").exists() or not any(deaths.glob("died-*")):
                marker.write_text("killed itself on edge_tail_tile_3_tokens\n")
                os.kill(os.getpid(), signal.SIGKILL)
        return super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw)


class Slow(GoldenBackend):
    """The golden, taking a second longer per case and writing its pid to $PFA_VERIFY_TEST_PIDS/<pid>
    while it works (so a test can kill a busy worker from outside)."""
    name = "tests/cases/run_doubles.py:Slow"

    def paged_attention_fp8(self, *args, **kwargs):
        folder = Path(os.environ.get("PFA_VERIFY_TEST_PIDS", "/nonexistent"))
        busy = folder / str(os.getpid())
        if folder.is_dir():
            busy.write_text("busy\n")
        try:
            time.sleep(1.0)
            return super().paged_attention_fp8(*args, **kwargs)
        finally:
            busy.unlink(missing_ok=True)


class DeclaresNoModel(GoldenBackend):
    """The golden, declaring no conformance model: SPEC_MODEL judges it."""
    name = "tests/cases/run_doubles.py:DeclaresNoModel"
    model = None


def loose_exp(**options):
    """A user backend that declares exp within 63 ulp (SPEC §4.1 F3 allows 3): never judged by it."""

    backend = GoldenBackend(**options)
    backend.name = "tests/cases/run_doubles.py:loose_exp"
    backend.model = dataclasses.replace(SPEC_MODEL, name="loose exp", exp_ulps=63)
    return backend


class RaisesKernelRunError(GoldenBackend):
    """A kernel that does not deliver: every call raises KernelRunError (as the sim does on an out-of-bounds
    table read, W12)."""
    name = "tests/cases/run_doubles.py:RaisesKernelRunError"

    def paged_attention_fp8(self, *args, **kwargs):
        raise KernelRunError("scalar read of block_table outside its shape: index (0, 7) of (1, 5)")


class FailsFromTwoBatches(GoldenBackend):
    """A kernel as expensive as the sim to shrink against (``shrink_calls = 3``) that fails every case of
    two or more batches (the golden plus 1 on the first element), and counts its calls in the file
    $PFA_VERIFY_TEST_CALLS."""
    name = "tests/cases/run_doubles.py:FailsFromTwoBatches"
    shrink_calls = 3

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        with open(os.environ["PFA_VERIFY_TEST_CALLS"], "a") as calls:
            calls.write(f"{block_table.shape[0]}\n")
        out = super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw)
        if block_table.shape[0] >= 2:
            out.view(-1)[0] += 1
        return out


class ModifiesInput(GoldenBackend):
    """The golden, flipping one bit of q's first code after computing (an in-place change of an input)."""
    name = "tests/cases/run_doubles.py:ModifiesInput"

    def paged_attention_fp8(self, q, *args, **kwargs):
        out = super().paged_attention_fp8(q, *args, **kwargs)
        q.view(torch.uint8).reshape(-1)[0] ^= 1
        return out
