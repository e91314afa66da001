"""W5 (private output folders), W6 (captured prints), W7 (reset after a failure) and W8 (the cost
model, optional): one SIM run, sim_session()."""
from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pfa_verify.kernels.pypto_workarounds import _common
from pfa_verify.kernels.pypto_workarounds.execute import forget_traces

__all__ = ["RunCapture", "sim_session", "reset_pypto_state", "spoiled"]


# --- W5, W6, W7: one SIM run --------------------------------------------------------------------------

_COST_PATTERNS = {
    # "AICore End-to-End Time" summary printed by the cost model after a SIM run (small FP8 cases).
    "aicore_end_to_end": re.compile(r"AICore End-to-End Time[^0-9\n]*([0-9][0-9.eE+-]*)"),
}


@dataclass
class RunCapture:
    """What one SIM run printed (both file descriptors) and the figures parsed from it."""

    text: str = ""
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)

    def parse(self) -> None:
        for name, pattern in _COST_PATTERNS.items():
            match = pattern.search(self.text)
            if match:
                self.figures[name] = float(match.group(1))
        unknown = self.text.count("Unrecognized DataType")
        if unknown:
            self.figures["unrecognized_dtype_lines"] = unknown


@contextlib.contextmanager
def _captured_fds(path: Path):
    """W6. Send file descriptors 1 and 2 (C++ prints and child scripts included) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def reset_pypto_state() -> None:
    """W7. Drop whatever a failed parse/compile left open (0.2.0: 'function nested is not allowed')."""
    pypto = _common.STATE.get("pypto")
    if pypto is None:
        return
    forget_traces()                    # W9: Reset frees the traced graph
    impl = pypto.pypto_impl
    with contextlib.suppress(Exception):
        impl.Reset()
    with contextlib.suppress(Exception):
        importlib.import_module("pypto.runtime")._pto_verify_datas.reset()


def spoiled() -> str | None:
    """W7's limit: why pypto cannot trace again in this process, or None.

    A failure inside RecordFunc.EndFunction (the calculator refusing a view while it verifies the traced
    graph, e.g. a W12 view before a cache's start) skips the rest of pypto.function(): the class flag
    pypto._controller.Controller.in_function stays set and the C++ function stack is left half closed.
    The next trace fails ("function nested is not allowed"); with the flag cleared by hand it died of
    SIGSEGV instead (seen on the sim mutant minus_one_not_clamped on B=2, S2=512,
    s2_tile=256, lengths (512, 100), then a sim case). No reset recovers the process: cases/running/pool.py
    replaces a worker for which this is not None, and runs the rest of a serial run in a new process."""
    controller = getattr(sys.modules.get("pypto._controller"), "Controller", None)
    if controller is not None and getattr(controller, "in_function", False):
        return "a kernel failed inside pypto's trace, which pypto 0.2.0 cannot close again in this process (W7)"
    return None


@contextlib.contextmanager
def _cost_model_disabled():
    """W8. Make JitCallableWrapper._run_with_cpu (the cost-model run after the compile) a no-op."""
    entry = importlib.import_module("pypto.frontend.parser.entry")
    original = entry.JitCallableWrapper._run_with_cpu
    entry.JitCallableWrapper._run_with_cpu = lambda self, in_tensors, out_tensors: None
    try:
        yield
    finally:
        entry.JitCallableWrapper._run_with_cpu = original


@contextlib.contextmanager
def sim_session(*, keep_output: bool = False, cost_model: bool = True):
    """Run one SIM compile/execute: W5 private working directory, W6 captured output, W7 reset.

    Yields a RunCapture that is filled in when the block ends. On an exception, pypto's state is
    reset and the captured text is attached to the exception as a note, then it propagates.
    """
    with _common.LOCK:
        capture = RunCapture()
        workdir = Path(tempfile.mkdtemp(prefix="pfa-verify-sim-"))
        log = workdir / "captured.txt"
        cwd = os.getcwd()
        start = time.perf_counter()
        failed = None
        try:
            os.chdir(workdir)
            with _captured_fds(log), (contextlib.nullcontext() if cost_model else _cost_model_disabled()):
                try:
                    yield capture
                except BaseException as exc:  # noqa: BLE001 - re-raised below after the reset
                    failed = exc
        finally:
            os.chdir(cwd)
            capture.seconds = time.perf_counter() - start
            capture.text = log.read_text(errors="replace") if log.exists() else ""
            capture.parse()
            if not keep_output:
                shutil.rmtree(workdir, ignore_errors=True)
        if failed is not None:
            reset_pypto_state()
            if hasattr(failed, "add_note") and capture.text.strip():
                failed.add_note("pypto output (last 4000 characters):\n" + capture.text.strip()[-4000:])
            raise failed


