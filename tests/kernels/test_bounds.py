"""W12 (kernels/pypto_workarounds/bounds.py): reads of an input outside its shape are errors on the sim.

The access patterns are the row gather of tests/kernels/out_of_bounds_kernels.py (a scalar read at a
data-dependent index, a view at a data-dependent row) and a paged-attention kernel in PyPTO-Gym's
convention whose tile walk reads one block-table column past the table, as PyPTO-Gym's does on the
catalog case ``edge_tail_tile_3_tokens`` (issue 20). Our kernel clamps that column and must pass.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from pfa_verify import kernels
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.kernels import pypto_workarounds as pw
from pfa_verify.properties.rule.acceptance import judge

pytestmark = pytest.mark.sim

OOB_FILE = "tests/kernels/out_of_bounds_kernels.py"
ROWS = 32


@pytest.fixture(scope="module")
def row_gather(pypto_module):

    spec = importlib.util.spec_from_file_location("_pfa_test_oob_kernels", OOB_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_row_gather()


def _gather(kernel, starts, pick):
    x = torch.arange(ROWS * 128, dtype=torch.float32).reshape(ROWS, 128)
    out = torch.full((8, 128), -7.0)
    with pw.sim_session(cost_model=False):
        pw.execute_kernel(kernel, [x, torch.tensor(starts, dtype=torch.int32), torch.tensor([pick], dtype=torch.int32),
                                   out])
    return x, out


def test_the_shim_is_attached(pypto_module):
    """load_pypto proved, from libtile_fwk_interface.so's GOT, that pypto calls the shim."""
    assert pw.bounds.attached()


def test_reads_and_views_inside_pass_and_are_checked(row_gather):
    x, out = _gather(row_gather, [0, 8, 16], 1)
    assert torch.equal(out, x[8:16])
    assert pw.bounds.checked_count() >= 2          # starts[1] and the view of x (no false green)


@pytest.mark.parametrize("starts, pick, message", [
    ([0, 8, 16], 3, r"read starts\[3\], outside its shape \[3\]"),
    ([0, 8, 16], -1, r"read starts\[-1\], outside its shape \[3\]"),
    ([0, 8, ROWS], 2, rf"viewed 8 rows of x at row {ROWS} along its dimension 0 \(extent {ROWS} .*at or past its end"),
    ([0, -8], 1, r"viewed 8 rows of x at row -8 .*before its start"),
], ids=["index past the end", "negative index", "view past the end", "view before the start"])
def test_reads_and_views_outside_are_errors_naming_the_tensor_and_index(row_gather, starts, pick, message):
    with pytest.raises(pw.OutOfBoundsRead, match=message):
        _gather(row_gather, starts, pick)


def test_a_view_clipped_at_the_end_is_the_tail_idiom(row_gather):
    """A view that starts inside x and runs past its end gets a valid shape (pypto's tail tiles):
    the rows inside are copied, nothing past the end is read, no error."""
    x, out = _gather(row_gather, [0, ROWS - 4], 1)
    assert torch.equal(out[:4], x[ROWS - 4:]) and bool((out[4:] == -7.0).all())


def _edge_tail_case():

    case = load_catalog()["edge_tail_tile_3_tokens"]
    assert case.config.s2 == 515 and case.config.s2_tile == 256      # a [1, 5] table, walked in 3 tiles of 2
    return case


def test_a_table_column_past_the_row_is_an_error(pypto_module):
    backend = kernels.get_backend(f"pypto-gym:{OOB_FILE}:reads_past_the_table")
    bundle = _edge_tail_case().inputs()
    assert tuple(bundle.block_table.shape) == (1, 5)
    with pytest.raises(kernels.KernelRunError,
                       match=r"out-of-bounds read: the kernel read block_table\[0, 5\], outside its shape \[1, 5\]"):
        backend.paged_attention_fp8(**bundle.kwargs())


def test_our_kernel_passes_edge_tail_tile_3_tokens(sim_backend):

    verdict = judge(sim_backend, _edge_tail_case())
    assert verdict.passed, verdict.message()
    assert pw.bounds.checked_count() > 0 and pw.bounds.first_violation() is None
