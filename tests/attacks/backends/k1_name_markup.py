"""Attack k1: rich markup in the backend's name ("[bold]x[/"), with the README's bug (V's dequant scale
read from KV head n-1) so the run has failures to print.

Expected correct verdict: exit 1 with its summary; the name printed literally; no MarkupError traceback.
"""
from pfa_verify import golden


class Backend:
    name = "[bold]x[/"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        wrong = v_scale.roll(1, dims=1)
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
