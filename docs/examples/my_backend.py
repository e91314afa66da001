"""Your kernel under pfa-verify: a backend is any object with these four attributes (README, "Check your kernel").

    pfa-verify run --backend docs/examples/my_backend.py:make_backend --cases all --examples 20

Replace the two golden calls with calls into your kernel. ``make_buggy_backend`` is the same kernel with
one bug (V's dequant scale read from the neighbouring KV head), to see what a failure looks like.
"""
from pfa_verify import golden


class MyBackend:
    name = "my-kernel"     # shown in reports; captured cases replay on the --backend name you gave
    codec = None           # the E4M3 your kernel converts with: None is SPEC §3's (golden.SPEC_CODEC)
    # model = ...          # optional: a golden.ConformanceModel narrower than SPEC §4.1 that you promise

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        """bf16 [B*S1, NQ, D] (SPEC §1-§2). Must leave its inputs unchanged (the rule checks)."""
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        """float32 [q_tile, k_tile] (SPEC §6); only the AT-12 laws call it."""
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


class MyBuggyBackend(MyBackend):
    name = "my-kernel-with-a-bug"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kw):
        wrong = v_scale.roll(1, dims=1)          # KV head n reads head n - 1's V scales
        return super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs, **kw)


def make_backend():
    return MyBackend()


def make_buggy_backend():
    return MyBuggyBackend()
