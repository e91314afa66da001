"""Attack i: the backend declares its own `kernel_source`, pointing at another file (the golden's
golden/__init__.py) with a made-up sha256 ("dead" x 16). The kernel computes the golden (it passes);
the point is what the --json report says was checked.

Expected correct verdict: the report's kernel path/sha256 are those of the file the driver loaded (this
file), computed by the driver; the declared values are ignored or reported as the backend's claim.
"""
from typing import ClassVar

from pfa_verify import golden

FAKE_SHA256 = "dead" * 16


class Backend:
    name = "attack-i-fake-kernel-source"
    codec = None
    kernel_source: ClassVar[dict] = {"source": golden.__file__, "path": golden.__file__, "sha256": FAKE_SHA256,
                     "function": "paged_attention_fp8"}

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
