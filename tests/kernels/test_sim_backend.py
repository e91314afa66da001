"""The backends' behaviour around the kernel call: outputs the kernel did not write, the sim's batch
chunks and cost model, our sim kernel named by the content of its source, the threads a sim backend
leaves to the process, the run header, and a failure inside pypto as a KernelRunError.

Split from tests/kernels/test_backends.py (the interface: get_backend, argument checks, device choice,
skip reasons). The tests marked ``sim`` need pypto (tests/kernels/conftest.py); the others do not.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pfa_verify import golden, kernels
from pfa_verify.cases.data.catalog import load_catalog
from pfa_verify.cases.running.run import open_backend
from pfa_verify.kernels import pypto_workarounds as pw
from pfa_verify.kernels.backends import KernelRunError, finish_output, sim_cost, unwritten_output, use_backend_threads
from pfa_verify.kernels.backends.sim import SimBackend, calculator_error
from pfa_verify.kernels.pypto_workarounds import native
from pfa_verify.kernels.pypto_workarounds.session import RunCapture
from pfa_verify.properties.rule import compare as cmp

# --- outputs the kernel did not write ---------------------------------------------------------------

def test_finish_output_turns_untouched_rows_into_zeros_or_an_error():
    """Outputs start as the UNWRITTEN sentinel: rows with cur == 0 that stay untouched are the
    caller's zeros (SPEC §2 item 5); an untouched element anywhere else is a KernelRunError."""

    lengths = torch.tensor([3, 0], dtype=torch.int32)            # B=2, S1=2: rows 0..3, cur = 2, 3, 0, 0
    out = unwritten_output((4, 2, 8))
    out[0:2] = 1.0
    done = finish_output(out.clone(), lengths, 2)
    assert torch.equal(done[2:].float(), torch.zeros(2, 2, 8)) and torch.equal(done[:2].float(), torch.ones(2, 2, 8))
    out[1, 1, 5] = unwritten_output((1,))[0]
    with pytest.raises(KernelRunError, match=r"left 1 of 64 output elements it must compute unwritten \(first at \(1, 1, 5\)\)"):
        finish_output(out.clone(), lengths, 2)
    scores = unwritten_output((2, 3), dtype=torch.float32)
    with pytest.raises(KernelRunError, match="left 6 of 6"):
        finish_output(scores)


def test_an_unwritten_output_shows_pypto_output_only_when_there_is_some():
    """Issue 20: a KernelRunError used to end with an empty "pypto output:" when the run printed nothing."""


    lengths = torch.tensor([1], dtype=torch.int32)
    quiet = SimpleNamespace(last_report=RunCapture(text=" \n"))
    loud = SimpleNamespace(last_report=RunCapture(text="Errcode: FBF00C! dims\n"))
    assert SimBackend._captured_output(quiet) == "" and SimBackend._captured_output(SimpleNamespace(last_report=None)) == ""
    with pytest.raises(KernelRunError) as info:
        finish_output(unwritten_output((1, 1, 4)), lengths, 1, lambda: SimBackend._captured_output(quiet))
    assert str(info.value).endswith("unwritten (first at (0, 0, 0))")
    with pytest.raises(KernelRunError) as info:
        finish_output(unwritten_output((1, 1, 4)), lengths, 1, lambda: SimBackend._captured_output(loud))
    assert str(info.value).endswith("(first at (0, 0, 0)); pypto output:\nErrcode: FBF00C! dims")


def test_calculator_errors_are_found_in_the_captured_output():

    text = ("Unrecognized DataTypeDT_FP8E4M3\n" * 3 + "[ERROR] x:12 Errcode: FBF00C! src and ret dims differ\n")
    assert calculator_error(text) == "[ERROR] x:12 Errcode: FBF00C! src and ret dims differ"
    assert calculator_error("Unrecognized DataTypeDT_FP8E4M3\nAICore End-to-End Time: 30.95\n") is None


# --- sim cost model and batch chunks (no pypto needed) ------------------------------------------------

def test_batch_chunks_give_the_golden_the_same_bits():
    """kernels/backends/sim_cost.chunk_inputs: a correct kernel (the golden) run chunk by chunk on
    compacted caches gives the bits of the whole call, ragged lengths, spare blocks, garbage and all."""


    config = golden.PagedAttentionConfig(batch=5, s1=2, s2=300, nq=4, nkv=2, head_dim=16, block_size=16, s2_tile=32,
                                         kv_act_seqs=(300, 0, 17, 1, 160), num_blocks=40, garbage="nan")
    tensors = golden.make_inputs(config, 3).tensors()
    whole = golden.paged_attention_fp8(**tensors, s2_tile=32)
    for chunks in ([range(0, 2), range(2, 5)], [range(b, b + 1) for b in range(5)]):
        parts = []
        for c in chunks:
            part = sim_cost.chunk_inputs(tensors, c, 2)
            need = sum(math.ceil(n / 16) for n in config.lengths[c.start:c.stop])
            assert part["k_cache"].shape[0] == max(1, need) and part["block_table"].shape[1] == tensors["block_table"].shape[1]
            parts.append(golden.paged_attention_fp8(**part, s2_tile=32))
        cmp.assert_close(torch.cat(parts), whole, kind="exact", identifier=f"{len(chunks)} chunks vs one call")


def test_chunks_are_planned_to_fit_the_memory_cap():

    cat = load_catalog()
    small = sim_cost.estimate(cat["pfa_fp8_b2_s1_1_s2_1k"].config)
    big = sim_cost.estimate(cat["pfa_fp8_b16_s1_1_s2_8195_nkv_2"].config)
    assert small.chunks == 1 and big.chunks > 1 and big.peak_bytes <= sim_cost.MEMORY_CAP_BYTES
    assert big.seconds > small.seconds > 0 and "batch chunks" in big.describe()
    lengths = [100] * 8
    shape = dict(s1=1, nkv=1, g_steps=1, s2_tile=128, block_size=128, head_dim=128, num_blocks=8)
    assert [c.batches for c in sim_cost.plan(lengths, cap=1e12, **shape)] == [range(0, 8)]
    floor = sim_cost.plan(lengths, cap=0, **shape)
    assert [c.batches for c in floor] == [range(b, b + 1) for b in range(8)]                     # the floor
    # a chunk's tile iterations: sum over its rows of ceil(cur / s2_tile), cur of SPEC §2 item 1
    ragged = sim_cost.plan([0, 1, 128, 129, 300], cap=1e12, **dict(shape, s1=3, nkv=2, g_steps=3))[0]
    cur = [[max(0, n - (3 - 1 - i)) for i in range(3)] for n in (0, 1, 128, 129, 300)]
    assert ragged.iterations == 2 * 3 * sum(-(-c // 128) for row in cur for c in row) == 2 * 3 * 17


@pytest.mark.sim
def test_our_sim_kernel_is_named_by_content(sim_backend):

    source = sim_backend.kernel_source
    assert source.source == "kernels/pfa_fp8.py" and source.function == "make_kernel"
    assert source.sha256 == hashlib.sha256(Path(source.path).read_bytes()).hexdigest()
    assert Path(source.path) == Path(kernels.__file__).resolve().parent / "pfa_fp8.py"


@pytest.mark.sim
def test_making_a_sim_backend_leaves_the_threads_to_the_process(pypto_module):
    """Issue 18 item 7: the sim backend asks for one torch thread (``threads``); the owner of the process
    applies it (use_backend_threads: the command line, workers, the test session), never the backend."""

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        backend = kernels.get_backend("sim")
        assert torch.get_num_threads() == 3 and backend.threads == 1
        use_backend_threads(kernels.get_backend("golden"))          # asks for nothing: left alone
        assert torch.get_num_threads() == 3
        use_backend_threads(backend)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.sim
def test_the_run_header_says_when_w9s_fast_path_is_off(pypto_module, monkeypatch):
    """Native.why_not (kernels/pypto_workarounds/native.py) reaches the run's header and report when the
    calculator cannot re-run a kept graph (then every call traces again), and nothing is said otherwise."""

    real = native.native(pypto_module, pw.cache_root())
    _, _, _, note = open_backend("sim", in_process=True)     # in this process: the patch below reaches it
    assert note == "backend sim (as asked)" and real.verify is not None
    monkeypatch.setattr(native, "_NATIVE", [native.Native(real.program, real.program_data, None, None,
                                                          "building the verify shim failed: no compiler")])
    _, _, _, note = open_backend("sim", in_process=True)     # in this process: the patch below reaches it
    assert note == ("backend sim (as asked); W9's re-run of a traced graph is off here (building the verify shim "
                    "failed: no compiler): every call traces the kernel again (the same numbers, a few seconds "
                    "more per call)")


@pytest.mark.sim
@pytest.mark.parametrize("raised,expected", [(RuntimeError("Errcode: trace refused the kernel\nmore"), kernels.KernelRunError),
                                             ("parser", kernels.KernelRunError),
                                             (TypeError("a bug of the suite"), TypeError)],
                         ids=["pypto-RuntimeError", "pypto-ParserError", "TypeError"])
def test_a_kernel_that_fails_inside_pypto_is_a_kernel_run_error(pypto_module, monkeypatch, small_bundle, raised,
                                                                 expected):
    """Issue 18 item 5: pypto refusing the kernel while it runs (a C++ error, RuntimeError in Python) is
    the kernel's failure, a KernelRunError (a kill in the mutant matrix); any other exception is not
    (a broken row there), so it propagates as it is."""

    if raised == "parser":     # what pypto's trace raises for an error inside the kernel (RenderedParserError)
        raised = pypto_module.frontend.parser.error.RenderedParserError(
            None, RuntimeError("Errcode: trace refused the kernel\nmore"))

    def refuse(wrapper, args):
        raise raised

    monkeypatch.setattr(pw, "execute_kernel", refuse)
    backend = kernels.get_backend("sim")
    with pytest.raises(expected) as info:
        backend.paged_attention_fp8(**small_bundle.kwargs())
    assert type(info.value) is expected
    if expected is kernels.KernelRunError:
        assert str(info.value).startswith("the kernel failed inside pypto: ")
        assert str(info.value).endswith("Errcode: trace refused the kernel")
