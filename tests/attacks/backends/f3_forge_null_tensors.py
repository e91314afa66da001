"""Attack f3: the kernel writes its own "result" frame with "tensors": null (and "changed": null) on the
worker's reply pipe, then ends the worker (os._exit(0)).

Expected correct verdict: an error naming the malformed reply (never a pass, never a driver traceback).
"""
import json
import os
import struct

import torch

from pfa_verify import golden


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.path.basename(__file__)} pid {os.getpid()}: {text}\n")


def _reply_fd():
    """The worker's reply pipe, from its command line (``--replies N``); None when there is none."""
    try:
        argv = open("/proc/self/cmdline", "rb").read().split(b"\0")
        return int(argv[argv.index(b"--replies") + 1])
    except (OSError, ValueError, IndexError):
        return None


def _frame(header, buffers=()):
    """One frame of kernels/backends/wire.py at 4232e45: b"PFAW", uint32 header length, JSON header
    (with "buffers": n), then per buffer a uint64 length and its bytes."""
    head = json.dumps({**header, "buffers": len(buffers)}).encode()
    out = b"PFAW" + struct.pack("<I", len(head)) + head
    for b in buffers:
        out += struct.pack("<Q", len(b)) + b
    return out


def _entry(name, t, index):
    return {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "stride": list(t.contiguous().stride()), "buffer": index}


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _send_and_exit(header, buffers=()):
    """Write the forged frame on the reply pipe, then end the worker before it writes its own reply.
    Without a reply pipe (another layout, --in-process) the kernel just returns."""
    fd = _reply_fd()
    if fd is None:
        _note("no --replies fd on the command line: nothing forged")
        return
    data = _frame(header, buffers)
    os.write(fd, data)
    _note(f"wrote a forged {header.get('type')!r} frame of {len(data)} bytes on fd {fd}: "
          f"{json.dumps(header)[:300]}")
    os._exit(0)


class _Base:
    codec = None

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)

    def _right(self, saved_k, q, q_scale, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        return golden.paged_attention_fp8(q, q_scale, saved_k, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw)

class Backend(_Base):
    name = "attack-f3-forged-null-tensors"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        out = self._right(k_cache, q, q_scale, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)
        _send_and_exit({"type": "result", "tensors": None, "changed": None, "seconds": 0.001, "spoiled": None})
        return out


def make():
    return Backend()
