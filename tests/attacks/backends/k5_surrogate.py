"""Attack k5: a lone surrogate ("\udcff", what os.fsdecode makes of a stray byte) in the kernel's
exception message.

Expected correct verdict: an error (exit 1); the character replaced or escaped; no UnicodeEncodeError.
"""


class Backend:
    name = "attack-k5-surrogate"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        raise RuntimeError("kernel fault reading /dev/npu\udcff0")

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        raise RuntimeError("kernel fault reading /dev/npu\udcff0")


def make():
    return Backend()
