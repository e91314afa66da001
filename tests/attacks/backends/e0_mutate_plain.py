"""Attack e, control: the kernel zeroes k_cache in place (mutates its input) and computes the right
answer from its own saved copy, WITHOUT hiding the mutation. Proves the mutation is real and that the
suite's check sees it when left alone.

Expected correct verdict: NOT a pass (inputs modified, SPEC: inputs are never changed).
"""
import os

from pfa_verify import golden


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"e0 pid {os.getpid()}: {text}\n")


class Backend:
    name = "attack-e0-mutates-k-cache"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        saved = k_cache.clone()
        k_cache.view(__import__("torch").uint8).zero_()
        _note(f"zeroed k_cache {tuple(k_cache.shape)}")
        return golden.paged_attention_fp8(q, q_scale, saved, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
