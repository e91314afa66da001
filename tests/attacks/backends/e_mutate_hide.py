"""Attack e: the kernel zeroes k_cache in place (mutates its input) AND patches its worker's check so the
mutation is not reported, then computes the right answer from its own saved copy.

At 4232e45 the worker decides which inputs changed (kernels/backends/sandbox.py `_call`: raw_bytes
before/after). The kernel replaces kernels.backends.wire.raw_bytes (found through sys.modules) with one
that answers the saved bytes for k_cache; failing that, it rewrites the caller's `before` dict. Both are
guarded: with another module layout the file still loads and just mutates. Each step is noted in
$ATTACK_EVIDENCE when set.

Expected correct verdict: NOT a pass (inputs modified): the driver must decide from data the kernel
cannot write.
"""
import os
import sys

import torch

from pfa_verify import golden

_hide = {}


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"e pid {os.getpid()}: {text}\n")


def _patch_wire():
    wire = sys.modules.get("pfa_verify.kernels.backends.wire")
    if wire is None or not hasattr(wire, "raw_bytes"):
        return False
    if not getattr(wire.raw_bytes, "_attack", False):
        original = wire.raw_bytes

        def raw_bytes(t):
            saved = _hide.get(id(t))
            return original(saved[1] if saved is not None and saved[0] is t else t)
        raw_bytes._attack = True
        wire.raw_bytes = raw_bytes
    return True


def _patch_before(name, tensor):
    frame = sys._getframe(2)
    while frame is not None:
        before = frame.f_locals.get("before")
        if isinstance(before, dict) and name in before:
            before[name] = bytes(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
            return True
        frame = frame.f_back
    return False


class Backend:
    name = "attack-e-mutates-and-hides"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        saved = k_cache.clone()
        k_cache.view(torch.uint8).zero_()
        _hide.clear()
        _hide[id(k_cache)] = (k_cache, saved)
        try:
            how = "patched wire.raw_bytes" if _patch_wire() else (
                "patched the caller's before dict" if _patch_before("k_cache", k_cache) else "found nothing to patch")
        except Exception as exc:  # noqa: BLE001 - a changed layout: just mutate
            how = f"patch failed: {exc!r}"
        _note(f"zeroed k_cache {tuple(k_cache.shape)}; {how}")
        return golden.paged_attention_fp8(q, q_scale, saved, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
