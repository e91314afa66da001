"""Attack c: a nondeterministic kernel (as a race on a device is): a module-level call counter, and every
second call of a process (the 2nd, 4th, ...) reads V's dequant scale from KV head n-1; the others are
right. Each call is noted in $ATTACK_EVIDENCE (pid, call number, right/wrong) when that is set.

Expected correct verdict: a run that hits a wrong call fails and captures it; `cases prune` must NOT
remove that capture (a single passing replay proves nothing for a kernel that answered the same inputs
differently); `replay` should say the outcome is nondeterministic rather than a plain PASS.
"""
import os

from pfa_verify import golden

_calls = 0


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"c_flaky pid {os.getpid()}: {text}\n")


class Backend:
    name = "attack-c-flaky"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        global _calls
        _calls += 1
        wrong = _calls % 2 == 0
        _note(f"call {_calls} nkv={k_cache.shape[2]} {'WRONG' if wrong else 'right'}")
        scale = v_scale.roll(1, dims=1) if wrong else v_scale
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
