"""Attack a: BackendUnavailable raised DURING a call, on shapes the kernel "was not built for"
(head_dim != 128), instead of declaring supported_shapes; wrong everywhere else (V's dequant scale read
from KV head n-1, like docs/examples/my_backend.py's make_buggy_backend; AT-12 scores 1.5x too big).

Expected correct verdict: NOT a pass. The raises are skips of kind 'unavailable' at best (which fail a
run unless allowed), and every case with head_dim 128 and >= 2 KV heads fails.
"""
from pfa_verify import golden, kernels


class Backend:
    name = "attack-a-unavailable-midcall"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        if q.shape[-1] != 128:
            raise kernels.BackendUnavailable("this kernel was built for head_dim 128 only")
        wrong = v_scale.roll(1, dims=1)          # KV head n reads head n - 1's V scales
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        if q.shape[-1] != 128:
            raise kernels.BackendUnavailable("this kernel was built for head_dim 128 only")
        return 1.5 * golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
