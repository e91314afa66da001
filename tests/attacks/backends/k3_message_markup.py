"""Attack k3: rich markup in the kernel's exception message ("[/x]" and "[bold]...[/]").

Expected correct verdict: an error (exit 1); the message printed literally; no MarkupError traceback.
"""


class Backend:
    name = "attack-k3-message-markup"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        raise RuntimeError("[/x] kernel fault in [bold]tile 3[/]")

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        raise RuntimeError("[/x] kernel fault in [bold]tile 3[/]")


def make():
    return Backend()
