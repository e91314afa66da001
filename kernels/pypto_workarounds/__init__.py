"""Every fix this project needs to run pypto 0.2.0 on a CPU, in one place (this package).

pypto 0.2.0 (the PyPI wheel) was built for an Ascend host. On a CPU-only machine its SIM mode parses
and compiles kernels and its pass-verify "calculator" can execute a kernel's tensor graph, but only
after the fixes below. Each fix says what it fixes and names the test that proves it
(tests/kernels/test_pypto_workarounds.py unless stated otherwise). Nothing here edits the installed
package: the platform fix works on a private overlay, the calculator is built from a copy of its
sources into our cache, the others patch objects in this process.

This docstring is the one list of the workarounds and their numbers; the modules cite the numbers.
Modules, in the order of the list: overlay (W1-W3, load_pypto), calculator (W4, W10, W12's calculator
side, W13), session (W5-W8, sim_session), execute (W9), native (W9's C++ side), bridge (W11) and
bounds (W12).

  W1 overlay        a symbolic-link copy of the installed package whose lib/configs/A2A3.ini is a real
                    file describing an Ascend 950PR (DAV_3510), so FP8 matmuls pass the parser's
                    architecture check.             test_overlay_reports_dav_3510
  W2 fp8 dtypes     pypto.converter._torch_dtype_from knows no FP8 type; pass verify raises
                    "Input pypto.DataType is not supported. Got DataType.DT_FP8E4M3".
                                                    test_fp8_dtype_mapping
  W3 verify inputs  JitCallableWrapper._setup_verify_data registers zero-filled copies of the inputs,
                    so the calculator runs on zeros (and the caller's inputs come back zeroed). We
                    register the caller's own tensors.
                                                    test_execute_uses_real_inputs_and_keeps_them
  W4 calculator     the calculator (a libtorch extension) is built with cmake into a temporary
                    folder once per process (about 20 s). We build it once per (pypto, torch, ABI)
                    into a cache folder and load it from there.
                                                    test_calculator_cached_on_disk
  W5 output folders every SIM run writes ./output/<run> (about 5 MB) in the current directory. Runs
                    happen inside a private temporary working directory that is removed afterwards.
                                                    test_run_leaves_no_output_folder
  W6 noise          the C++ side prints cost-model tables, "Unrecognized DataType" lines and the
                    swimlane scripts' tracebacks straight to file descriptors 1 and 2. Runs capture
                    both descriptors into a file; the text is kept (cost figures are parsed from it)
                    and shown only when the run fails.
                                                    test_compile_captures_cost_model_text
  W7 reset          a failed compile leaves pypto's function stack open, and the next compile in the
                    process fails with "function nested is not allowed". After a failure we reset
                    pypto's global state.           test_compile_after_failed_compile
                    A failure inside RecordFunc.EndFunction (the calculator, while it verifies the
                    traced graph) cannot be reset: spoiled() says so, and cases/running/pool.py replaces the
                    process.       tests/cases/test_pool.py::test_a_spoiled_worker_is_replaced
  W8 cost model     the SIM-mode cost model that runs after the compile (CostModelRunOnceDataFromHost)
                    dies with SIGSEGV on large grids (pfa_fp8_b16_s1_1_s2_8195_nkv_2, B=16 x 65
                    tiles x 2 heads), taking the process with it: with upstream's
                    stitch_function_max_num=512 its device task queues overflow
                    (DeviceTaskContext::BuildReadyQueueForFunc writes past a fixed-size ready queue;
                    seen in gdb; 128 completes). Compile-only runs skip it
                    (sim_session(cost_model=False)); execute runs do not need it (W9).
                                                    test_cost_model_is_optional
  W9 execute        pypto 0.2.0's SIM path compiles on every call (parse, trace, pass pipeline,
                    codegen: 4-7 s for our kernel) and then runs the cost model (1.8-2.5 s, memory
                    kept until exit; `kernels.get_backend("sim", level=
                    "compile", cost_model=True).compile_paged_attention(...).seconds` re-measures
                    their sum), though the numbers come from neither: the calculator runs on
                    the traced tensor graph inside the trace (RecordFunc::EndFunction ->
                    Program::VerifyTensorGraph). W9a: execute kernels stop after the trace
                    (host option compile_stage=TENSOR_GRAPH) and the result is copied back from
                    pypto's ProgramData (native.py). W9b: the traced graph stays valid,
                    so a later call with the same static signature (non-tensor arguments, dtypes,
                    static dims; B and NB may change) re-runs only the calculator on the new tensors.
                    After each run the calculator's kept intermediates are freed. Where W9b cannot
                    work (native.py's check fails, no compiler), every call traces again and a run's
                    header says why (SimBackend.notes).
                                                    test_execute_reuses_the_traced_graph
  W10 fp8 copies    the calculator copies every FP8 view (the interpreter starts each leaf frame that
                    reads an input with a view of the whole input) by decoding source and destination
                    to float32 and re-encoding element by element: time grows as tile iterations x
                    cache size (127 s for pfa_fp8_b16_s1_1_s2_8k_nkv_1, 466 s for 8k_nkv_2 without
                    W10, by `OMP_NUM_THREADS=1 pfa-verify run --backend sim --cases
                    NAME --examples 0 --budget 0`; with W10 the same command gives the times of
                    kernels/backends/sim_cost.py). Our build
                    of the calculator (W4) patches a copy of its sources so that a same-type FP8
                    Copy or Reshape copies bytes; decoded values are unchanged (decode(encode(decode(c)))
                    = decode(c) for all 256 codes).
                                                    test_fp8_copies_keep_their_bytes
  W11 API bridge    kernels written for newer pypto call pypto.div(..., precision_type=
                    pypto.PrecisionType.INTRINSIC); 0.2.0 has neither. A PrecisionType is added and
                    div accepts and drops the keyword (0.2.0 has one division); nothing is patched
                    on a pypto that has them.            test_precision_type_bridge
  W12 bounds        the interpreter reads a kernel's scalar reads of its inputs (block_table[b, j])
                    without comparing the index with the shape (a column past a row reads the next
                    row, past the last row heap memory), and clips a view that starts past an input's
                    end to nothing, silently. A shim loaded before pypto interposes both entry points
                    (the GOT slots are checked): such a read or view is recorded, and the run raises
                    OutOfBoundsRead naming the kernel's parameter and the index.
                                                    tests/kernels/test_bounds.py
  W13 spec E4M3     the calculator's E4M3 is not the spec's (exponent field 15 reads 240, encode
                    saturates at 240 after rounding to an integer), so no CPU run can see a kernel bug
                    in codes worth 256..448 or in saturation. Our build (W4) adds the spec codec
                    (OCP E4M3FN, RNE, saturating, NaN kept) behind a per-run switch, e4m3_codec("spec")
                    (the sim-spec-codec backend); off, the calculator is pypto's, bit for bit.
                                                    tests/kernels/test_calculator_codec.py
"""
from __future__ import annotations

from pfa_verify.kernels.pypto_workarounds._common import (
                                                  CACHE_ENV,
                                                  SUPPORTED_PYPTO_VERSION,
                                                  PyptoUnavailable,
                                                  cache_root,
)
from pfa_verify.kernels.pypto_workarounds.bounds import OutOfBoundsRead
from pfa_verify.kernels.pypto_workarounds.calculator import (
                                                  E4M3_CODECS,
                                                  build_calculator,
                                                  current_e4m3_codec,
                                                  e4m3_codec,
                                                  load_calculator,
)
from pfa_verify.kernels.pypto_workarounds.execute import (
                                                  CalculatorFailed,
                                                  execute_kernel,
                                                  forget_traces,
                                                  reverify_unavailable,
)
from pfa_verify.kernels.pypto_workarounds.overlay import build_overlay, load_pypto
from pfa_verify.kernels.pypto_workarounds.session import RunCapture, reset_pypto_state, sim_session, spoiled

__all__ = [
    "SUPPORTED_PYPTO_VERSION",
    "PyptoUnavailable",
    "OutOfBoundsRead",
    "CACHE_ENV",
    "cache_root",
    "load_pypto",
    "build_overlay",
    "sim_session",
    "RunCapture",
    "reset_pypto_state",
    "spoiled",
    "build_calculator",
    "load_calculator",
    "E4M3_CODECS",
    "e4m3_codec",
    "current_e4m3_codec",
    "execute_kernel",
    "forget_traces",
    "reverify_unavailable",
    "CalculatorFailed",
]
