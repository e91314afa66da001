"""Attack b: a slow kernel (3 s a call) with a real bug (V's dequant scale read from KV head n-1; AT-12
scores 1.5x too big). With `pfa-verify laws --seconds 2` each law gets about one example.

Expected correct verdict: NOT a pass ("held" on one example, where the bug needs >= 2 KV heads, is no
evidence): the command must exit non-zero (too few examples, or the failure found).
"""
import time

from pfa_verify import golden


class Backend:
    name = "attack-b-slow"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        time.sleep(3)
        wrong = v_scale.roll(1, dims=1)          # KV head n reads head n - 1's V scales
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        time.sleep(3)
        return 1.5 * golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
