"""Attack l2: the kernel ends its process with posix._exit(0) (the os._exit guard of --in-process does
not cover the posix module's own name). Run with --in-process that is the driver itself.

Expected correct verdict: never exit 0 without a summary (supervised: an error verdict, exit 1;
--in-process: a non-zero status, the docs saying it cannot guard this).

The backend has the optional notes(), supported_shapes and skip_reason(), so that --in-process at 4232e45
reaches the kernel (without them that run crashes first: "'Backend' object has no attribute 'notes'",
then 'supported_shapes', then 'skip_reason'; attack l1 shows the first with the shipped example).
"""
import posix


class Backend:
    name = "attack-l-posix-exit"
    codec = None

    supported_shapes = None        # optional; at 4232e45 --in-process reads these three and crashes without them

    def notes(self):
        return []

    def skip_reason(self, config):
        return None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        posix._exit(0)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        posix._exit(0)


def make():
    return Backend()
