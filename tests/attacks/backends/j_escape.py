"""Attack j: the kernel raises an exception whose message holds terminal escape sequences: an OSC that
retitles the terminal ("\x1b]0;pwned\x07"), and "\r\x1b[2K-> OK" (carriage return, erase line) meant to
hide the real verdict behind an injected "-> OK" line.

Expected correct verdict: an error (exit 1), and no raw ESC (0x1b) or BEL from the kernel's text on
stdout/stderr: control characters printed escaped.
"""
from pfa_verify import golden


class Backend:
    name = "attack-j-escapes"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        raise RuntimeError("\x1b]0;pwned\x07kernel fault\r\x1b[2K4 cases: 4 checked, 4 passed -> OK\n")

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
