"""The kernel's own process: ``python -m kernels.backends.sandbox --requests FD --replies FD --parent PID``.

kernels/backends/worker_process.py starts it; it loads one backend and runs its calls, one at a time, and
nothing else. It never judges: what a call returns (its output's bits, the inputs it changed, what it
raised) goes back as data (kernels/backends/wire.py) to the supervisor's process, which decides.

Its life is its parent's: it asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) to kill it when the
parent ends, exits when the parent is already gone or its request pipe closes, and runs in a session
of its own (the supervisor kills the whole group, so the terminal's Ctrl-C never reaches a kernel
halfway through a call and a kernel's children end with it).

The messages are kernels/backends/protocol.py's. A call's inputs are tensors on the memory file the
supervisor handed this process when it started (``--inputs FD``), which the supervisor filled and
reads back after the reply: what the kernel writes into its inputs, the supervisor sees for itself.

A kernel that raises SystemExit or KeyboardInterrupt, or writes nothing, is answered ``raised`` like
any other exception; one that ends the process (``os._exit``, a crash, a signal) leaves the pipe
closed, and the supervisor names how the process ended.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import time
import traceback
from typing import Any

import torch

from pfa_verify import kernels
from pfa_verify.golden import PagedAttentionConfig
from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends import BackendUnavailable, KernelRunError, limit_time, protocol, wire
from pfa_verify.kernels.backends.contract import capabilities_of
from pfa_verify.kernels.backends.loader import pin_source
from pfa_verify.kernels.backends.reaping import adopt_orphans
from pfa_verify.kernels.pypto_workarounds import spoiled

__all__ = ["main", "die_with_parent"]

#: An error's text is cut to this many characters (the header limit of kernels/backends/wire.py).
_TEXT = 20_000
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends; exit at once when the
    parent ``parent`` is already gone (it died before the request was made)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):     # not Linux: the closed request pipe still ends this process
        pass
    if os.getppid() != parent:
        os._exit(3)


def _text(exc: BaseException) -> str:
    """``str(exc)``, or why it has none: an exception's own ``__str__`` is the kernel's code too."""
    try:
        return str(exc)
    except BaseException as inner:  # noqa: BLE001 - a __str__ that raises must not take the reply with it
        return f"<its text could not be made: {type(inner).__name__}>"


def _error(exc: BaseException) -> dict[str, Any]:
    """``raised``/``refused`` fields of an exception: kind, its type's name and its text."""
    if isinstance(exc, BackendUnavailable):
        kind, text = "unavailable", exc.reason
    elif isinstance(exc, KernelRunError):
        kind, text = "kernel_run", _text(exc)
    elif isinstance(exc, UsageError):
        kind, text = "usage", _text(exc)
    elif isinstance(exc, SystemExit):
        kind, text = "exit", f"the kernel called sys.exit({exc.code!r})"
    elif isinstance(exc, KeyboardInterrupt):
        kind, text = "interrupt", "the kernel raised KeyboardInterrupt"
    else:
        kind, text = "raised", _text(exc).strip()
    try:
        where = "".join(traceback.format_exception(exc)[-6:])
    except BaseException:  # noqa: BLE001 - the traceback renders the exception's text too
        where = ""
    return {"kind": kind, "type_name": type(exc).__name__, "message": text[:_TEXT], "traceback": where[-_TEXT:]}


def _load(header: dict[str, Any], buffers: list[bytearray]) -> tuple[object, dict[str, Any]]:

    if header.get("pinned") and buffers:       # the bytes the driver hashed run, not what the file holds now
        pin_source(header["pinned"], bytes(buffers[0]))
    name, options = header["backend"], dict(header.get("options") or {})
    device = header.get("device")
    backend = kernels.get_backend(name, device=device, **options) if device is not None else \
        kernels.get_backend(name, **options)
    backend = limit_time(backend, header.get("max_seconds"))
    capabilities = capabilities_of(backend, source=name)
    threads = capabilities.threads or header.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    return backend, capabilities.to_dict()


def _call(backend: object, header: dict[str, Any], inputs: int) -> tuple[dict[str, Any], list]:

    op = header["op"]
    if op not in ("paged_attention_fp8", "qk_matmul_scale"):
        return {"type": "raised", "kind": "usage", "type_name": "ValueError", "message": f"op={op!r} is not a kernel"}, []
    tensors, mapping = protocol.map_inputs(inputs, header.get("inputs"), header.get("inputs_bytes"))
    try:
        start = time.perf_counter()
        out = getattr(backend, op)(**tensors, **header.get("scalars", {}))
        seconds = time.perf_counter() - start
    finally:
        tensors.clear()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:       # the kernel kept a view of its inputs: the mapping goes with the process
                pass
    if not isinstance(out, torch.Tensor):
        return {"type": "raised", "kind": "kernel_run", "type_name": "TypeError",
                "message": f"the kernel returned {type(out).__name__}, not a torch.Tensor", "seconds": seconds}, []
    if out.device.type != "cpu":
        return {"type": "raised", "kind": "kernel_run", "type_name": "ValueError",
                "message": f"wrong device: the kernel returned a tensor on {out.device}, expected cpu (SPEC §1)",
                "seconds": seconds}, []
    # A plain tensor of the same bits: a subclass's methods never run on the judging side.
    plain = {"output": out.as_subclass(torch.Tensor) if type(out) is not torch.Tensor else out}
    entries, buffers_out = wire.pack_tensors(plain)
    return {"type": "result", "tensors": entries, "seconds": seconds}, buffers_out


def _answers(backend: object, header: dict[str, Any]) -> dict[str, Any]:
    method = getattr(backend, header["type"], None)
    answers: list[Any] = []
    for config in header["configs"]:
        result = method(PagedAttentionConfig.from_dict(config)) if callable(method) else None
        if result is None:
            answers.append(None)
        elif header["type"] == "skip_reason":
            answers.append({"kind": str(getattr(result, "kind", "")), "reason": str(getattr(result, "reason", result))})
        else:
            answers.append({"seconds": float(result.seconds), "text": str(result.describe())})
    return {"type": "answers", "answers": answers}


def _spoiled() -> str | None:
    if "pfa_verify.kernels.pypto_workarounds" not in sys.modules:
        return None
    return spoiled()


def serve(requests: int, replies: int, inputs: int) -> None:
    """Answer requests until the pipe closes (or the load fails)."""
    backend: object = None
    while True:
        try:
            header, buffers = wire.read_message(requests, max_bytes=2**40)
        except wire.PeerClosed:
            return
        kind = header.get("type")
        reply: dict[str, Any]
        out: list = []
        try:
            if kind == "load":
                try:
                    backend, capabilities = _load(header, buffers)
                    reply = {"type": "ready", "capabilities": capabilities, "pid": os.getpid()}
                except BaseException as exc:  # noqa: BLE001 - a factory that exits or raises cannot start
                    reply = {"type": "refused", **_error(exc)}
            elif kind == "call":
                try:
                    reply, out = _call(backend, header, inputs)
                except BaseException as exc:  # noqa: BLE001 - whatever the kernel raises is reported, as data
                    reply = {"type": "raised", **_error(exc)}
                reply["spoiled"] = _spoiled()
            elif kind in ("skip_reason", "estimate"):
                reply = _answers(backend, header)
            else:
                reply = {"type": "raised", "kind": "usage", "type_name": "ValueError",
                         "message": f"unknown request {kind!r}"}
        except BaseException as exc:  # noqa: BLE001 - a backend's skip_reason or estimate that fails
            reply = {"type": "raised", **_error(exc)}
        wire.write_message(replies, {**reply, "seq": header.get("seq")}, out)
        if kind == "load" and reply["type"] == "refused":
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.backends.sandbox")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--replies", type=int, required=True)
    parser.add_argument("--inputs", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    adopt_orphans()       # what the kernel forks and abandons stays in this process's tree, where its end finds it
    serve(args.requests, args.replies, args.inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
