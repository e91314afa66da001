"""Attack m (SIGHUP): the kernel sends SIGHUP to the driver: its worker's parent (os.getppid()), or its own
process under --in-process (os.getpid()). Otherwise it computes the golden. Noted in $ATTACK_EVIDENCE.

Expected correct verdict: the run ends as SIGTERM ends it: a summary marked interrupted, the --json
report written, a non-zero status; never silently with no summary and no report.

The backend has the optional notes(), supported_shapes and skip_reason(), so that --in-process at 4232e45
reaches the kernel (without them that run crashes first: "'Backend' object has no attribute 'notes'",
then 'supported_shapes', then 'skip_reason'; attack l1 shows the first with the shipped example).
"""
import os
import signal

from pfa_verify import golden


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"m pid {os.getpid()}: {text}\n")


class Backend:
    name = "attack-m-sighup"
    codec = None

    supported_shapes = None        # optional; at 4232e45 --in-process reads these three and crashes without them

    def notes(self):
        return []

    def skip_reason(self, config):
        return None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        in_worker = b"pfa-verify" not in open("/proc/self/cmdline", "rb").read()
        driver = os.getppid() if in_worker else os.getpid()
        _note(f"sending SIGHUP to driver {driver} (in_worker={in_worker})")
        os.kill(driver, signal.SIGHUP)
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
