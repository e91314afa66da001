"""The golden as a backend: the loop golden (the executable spec) and the row-by-row AT-12.

Its paged attention is ``golden.paged_attention_fp8_loop``, the plain five-level loop, and its AT-12
``golden.qk_matmul_scale_loop``, while every law and report compares against the vectorized
``golden.paged_attention_fp8`` / ``golden.qk_matmul_scale``. So `--backend golden` is not the golden
compared with itself: it cross-checks two implementations on every case (they agree bit for bit;
SPEC §4's tolerance is what the laws hold them to). It is also the example of the interface, and
what `auto` falls back to where no kernel can run (a run that then fails unless allowed).
"""
from __future__ import annotations

from pfa_verify import golden
from pfa_verify.golden.codec import get_codec
from pfa_verify.golden.model import EXACT_MODEL
from pfa_verify.kernels.backends import Backend

__all__ = ["GoldenBackend"]


class GoldenBackend(Backend):
    name = "golden"
    #: exact sums, correctly rounded exp and division, the same bits every call: the narrowest model
    model = EXACT_MODEL

    def __init__(self, *, codec=None, loop: bool = True) -> None:
        """``loop=False`` runs the vectorized golden instead: the reference the laws compare with."""
        self.codec = get_codec(codec)
        self.loop = loop

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                            kv_act_seqs, *, softmax_scale=None, s2_tile=128, g_tile=None, codec=None):
        self._check_codec(codec)
        implementation = golden.paged_attention_fp8_loop if self.loop else golden.paged_attention_fp8
        return implementation(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                              softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile, codec=self.codec)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        self._check_codec(codec)
        implementation = golden.qk_matmul_scale_loop if self.loop else golden.qk_matmul_scale
        return implementation(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=self.codec)
