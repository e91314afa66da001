"""The golden as a backend: golden.paged_attention_fp8 / golden.qk_matmul_scale with the spec codec.

Useful as the reference run of the suite's own laws (`--backend golden`) and as the example of the
interface; it is never what `auto` picks.
"""
from __future__ import annotations

from kernels.backends import Backend

__all__ = ["GoldenBackend"]


class GoldenBackend(Backend):
    name = "golden"

    def __init__(self, *, codec=None) -> None:
        from golden.codec import get_codec

        self.codec = get_codec(codec)

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                            kv_act_seqs, *, softmax_scale=None, s2_tile=128, g_tile=None, codec=None):
        import golden

        self._check_codec(codec)
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table,
                                          kv_act_seqs, softmax_scale=softmax_scale, s2_tile=s2_tile,
                                          g_tile=g_tile, codec=self.codec)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        import golden

        self._check_codec(codec)
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=self.codec)
