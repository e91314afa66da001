"""Attack k2: rich markup in a skip reason: skip_reason(config) skips every case with 2 or more KV heads
(kind "unsupported") with the reason "[/x] not built for [bold]this[/bold]"; the kernel is the golden.

Expected correct verdict: exit 1 (a skip not allowed by --allow-skips fails the run); the reason
printed literally; no MarkupError traceback.
"""
import types

from pfa_verify import golden


class Backend:
    name = "attack-k2-skip-markup"
    codec = None

    def skip_reason(self, config):
        if config.nkv >= 2:
            return types.SimpleNamespace(kind="unsupported", reason="[/x] not built for [bold]this[/bold]")
        return None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
