"""Attack d (the capture source): the README's buggy kernel, V's dequant scale read from KV head n-1
(docs/examples/my_backend.py's make_buggy_backend). Its captures are then edited by hand (law,
config's kv_act_seqs, tolerance) and replayed; it also makes the captures attack g deletes.

Each call notes the kv_act_seqs it was given in $ATTACK_EVIDENCE (what a replay really ran).

Expected correct verdict: every replay of an edited case file is refused as unreadable (the id no longer
matches the content; config and arrays disagree), never PASS.
"""
import os

from pfa_verify import golden


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"d pid {os.getpid()}: {text}\n")


class Backend:
    name = "attack-d-buggy"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        _note(f"called: nkv={k_cache.shape[2]} head_dim={q.shape[-1]} kv_act_seqs={kv_act_seqs.tolist()}")
        wrong = v_scale.roll(1, dims=1)          # KV head n reads head n - 1's V scales
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
