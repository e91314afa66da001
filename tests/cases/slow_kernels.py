"""Slow kernels for ``pfa-verify laws`` and ``search`` (issue 53): a law cut by its time budget after a few
examples must not be "held".

``make``: the issue's kernel, 3 s a call and wrong on every case of two or more KV heads (V's dequant scale
read from the neighbouring head, as docs/examples/my_backend.py's ``make_buggy_backend``). ``make_quick``
is the same bug at 0.3 s a call, ``make_quick_correct`` the golden at 0.3 s a call (the tests' budgets).

    pfa-verify laws --backend tests/cases/slow_kernels.py:make --laws paged --seconds 2
"""
from __future__ import annotations

import time

from pfa_verify import golden


class SlowKernel:
    """The golden, ``seconds`` per call; with ``buggy``, KV head n reads head n - 1's V scales."""
    codec = None

    def __init__(self, seconds: float, buggy: bool) -> None:
        self.seconds, self.buggy = seconds, buggy
        self.name = f"slow-{'buggy' if buggy else 'correct'}-{seconds:g}s"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        time.sleep(self.seconds)
        scales = v_scale.roll(1, dims=1) if self.buggy else v_scale
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, scales, block_table, kv_act_seqs, **kw)

    def qk_matmul_scale(self, q, k, **kw):
        time.sleep(self.seconds)
        return golden.qk_matmul_scale(q, k, **kw)


def make() -> SlowKernel:
    return SlowKernel(3.0, buggy=True)


def make_quick() -> SlowKernel:
    return SlowKernel(0.3, buggy=True)


def make_quick_correct() -> SlowKernel:
    return SlowKernel(0.3, buggy=False)
