"""Two kernels with one bug, one of them nondeterministic (``tests/kernels/unsteady_kernels.py:FACTORY``):
the tests of ``cases prune`` and ``cases replay --times`` (tests/cases/test_nondeterministic_captures.py).

Each is the golden but for its bug: KV head n reads head n - 1's V scales (``v_scale`` rolled across the
KV heads; a case of one KV head does not show it). :func:`make_racy` has the bug on every second call
of its process (the 2nd, 4th, ...: a module-level counter), as a race on a device is wrong on some calls
and right on others; :func:`make_buggy` on every call.
"""
from __future__ import annotations

from pfa_verify import golden

_calls = 0


class _RolledVScale:
    name = "v-scale-rolled"
    codec = None

    def wrong_now(self) -> bool:
        return True

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        scale = v_scale.roll(1, dims=1) if self.wrong_now() else v_scale
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale)


class _Racy(_RolledVScale):
    name = "v-scale-rolled-on-even-calls"

    def wrong_now(self) -> bool:
        global _calls
        _calls += 1
        return _calls % 2 == 0


def make_buggy():
    return _RolledVScale()


def make_racy():
    return _Racy()
