"""SPEC §2 with one method per stage: the unmutated reference of the golden-level mutants.

The same five-level loop as golden.attention_loop, built from the same golden stages (so it gives
the golden's bits: tests/meta holds it to that), with every decision a kernel makes in a method of
its own, so that a mutant (kernels/mutants/golden_level.py) overrides exactly one of them. It runs
as a backend under any name ``mutant:NAME``; the golden itself is never touched.
"""
from __future__ import annotations

import torch

from pfa_verify import golden
from pfa_verify.golden.attention import dequantize_scores, dequantize_values
from pfa_verify.golden.codec import get_codec
from pfa_verify.golden.matmul import exact_matmul
from pfa_verify.golden.model import DETERMINISTIC_MODEL
from pfa_verify.golden.quant import quantize_rows
from pfa_verify.golden.softmax_state import OnlineSoftmaxState, exp_f32, local_softmax
from pfa_verify.kernels.backends import Backend

__all__ = ["StagedGolden", "WrittenOutUpdate"]


class StagedGolden(Backend):
    """The reference: SPEC §2 stage by stage (no bug)."""

    name = "mutant:none"
    level = "golden"
    #: judged like a kernel with a fixed order: SPEC §4.1, the same choices on every call
    model = DETERMINISTIC_MODEL
    equivalent: str | None = None      # for an equivalent mutant: the proof that it cannot be killed

    def __init__(self, *, codec=None) -> None:
        self.codec = get_codec(codec)

    # -- the walk -----------------------------------------------------------------------------------
    def _paged_attention(self, dims, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs):
        self.dims, self.tables = dims, (q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs)
        codec, lengths = self.codec, kv_act_seqs.tolist()
        out = torch.zeros(q.shape)
        for b in range(dims.batch):
            for i in range(dims.s1):
                row = b * dims.s1 + i
                cur = self.visible_length(lengths, b, i)
                if cur == 0:
                    self.write_empty_row(out, row)
                    continue
                for n in range(dims.nkv):
                    for g0 in range(0, dims.group, dims.g_tile):
                        heads = self.query_heads(n, g0)
                        q_tile = codec.decode(q[row, heads].contiguous())
                        state = OnlineSoftmaxState.empty((len(heads),), dims.head_dim)
                        for start in range(0, cur, dims.s2_tile):
                            tokens, valid = self.tile_tokens(start, cur)
                            blocks, slots = self.token_slots(block_table, b, tokens, start)
                            k = codec.decode(k_cache[blocks, slots, n].contiguous())
                            v = codec.decode(v_cache[blocks, slots, n].contiguous())
                            scores = self.scores(q_tile, k, q_scale[row, heads], self.key_scales(k_scale, blocks, slots, n))
                            m_j, p, l_j = self.local_softmax(scores, valid)
                            o_j = self.tile_values(p, v, self.value_scales(v_scale, b, n, tokens), valid)
                            self.update(state, m_j, l_j, o_j, p=p, valid=valid)
                        out[row, heads] = self.finalize(state)
        return out.bfloat16()

    # -- the stages (SPEC §2 items) --------------------------------------------------------------------
    def visible_length(self, lengths: list, b: int, i: int) -> int:
        """§2.1: cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))."""
        return max(0, lengths[b] - (self.dims.s1 - 1 - i))

    def query_heads(self, n: int, g0: int) -> torch.Tensor:
        """§2.2, GQA: the query heads h with h // group == n, g_tile at a time."""
        start = n * self.dims.group + g0
        return torch.arange(start, start + self.dims.g_tile)

    def tile_tokens(self, start: int, cur: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """§2.3: the tile's tokens (the last tile holds the remainder); a valid mask when it reads more."""
        return torch.arange(start, min(start + self.dims.s2_tile, cur)), None

    def token_slots(self, block_table, b: int, tokens: torch.Tensor, start: int):
        """§2.2: token t is row t % BS of physical block block_table[b, t // BS]."""
        bs = self.dims.block_size
        return block_table[b, tokens // bs].long(), tokens % bs

    def key_scales(self, k_scale, blocks, slots, n: int) -> torch.Tensor:
        """§1: the per-token K scale of each tile token, [T, 1]."""
        return k_scale[blocks, slots, n]

    def scores(self, q_tile, k, q_scale_rows, k_scale_tokens) -> torch.Tensor:
        """§2.3 MM1 and dequant: (q8 @ k8^T) * q_scale * k_scale^T, then * softmax_scale."""
        return dequantize_scores(exact_matmul(q_tile, k.T), q_scale_rows, k_scale_tokens.T, self.dims.softmax_scale)

    def local_softmax(self, scores, valid):
        """§2.3: m_j = rowmax(S), P = exp(S - m_j), l_j = rowsum(P)."""
        return local_softmax(scores, valid)

    def quantize_p(self, p, valid):
        """§2.3 / §3: P quantized per row over the tile's valid columns: (P8 decoded, p_scale)."""
        return quantize_rows(p, valid=valid, codec=self.codec)

    def value_scales(self, v_scale, b: int, n: int, tokens) -> torch.Tensor:
        """§1: the batch's per-channel V scale, [1, D]."""
        return v_scale[b, n][None, :]

    def tile_values(self, p, v, v_scale_channels, valid) -> torch.Tensor:
        """§2.3 MM2: O_j = (P8 @ v8) * p_scale * v_scale."""
        p8, p_scale = self.quantize_p(p, valid)
        return dequantize_values(exact_matmul(p8, v), p_scale, v_scale_channels)

    def update(self, state, m_j, l_j, o_j, *, p=None, valid=None) -> None:
        """§2.3: the online (m, l, O) update; the first tile sets the state."""
        state.update(m_j, l_j, o_j)

    def finalize(self, state) -> torch.Tensor:
        """§2.4: O / l (bf16 when the output is written)."""
        return state.finalize()

    def write_empty_row(self, out, row: int) -> None:
        """§2.5: a row with cur == 0 is 0 (the caller's zeros: nothing to write)."""

    def _qk_matmul_scale(self, q, k, scale, q_scale, k_scale):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=self.codec)


class WrittenOutUpdate(StagedGolden):
    """The online update of SPEC §2.3 written out, so that one of its steps can be left out: rescaling O or
    l by ``a = exp(m - m')``, scaling the tile's l_j and O_j by ``c = exp(m_j - m')``, or storing the new
    running max (the mutants of kernels/mutants/golden_level.py and the stage models of
    properties/diagnosis/diagnosis.py set the flags)."""
    rescale_o = rescale_l = scale_tile = store_max = True

    def update(self, state, m_j, l_j, o_j, *, p=None, valid=None):
        if not bool(state.started.any()):
            state.m, state.l, state.o, state.started = m_j, l_j, o_j, torch.ones_like(state.started)
            return
        m_new = torch.maximum(state.m, m_j)
        a, c = exp_f32(state.m - m_new), exp_f32(m_j - m_new)
        if not self.scale_tile:
            c = torch.ones_like(c)
        state.l = (a * state.l if self.rescale_l else state.l) + c * l_j
        state.o = (a * state.o if self.rescale_o else state.o) + c * o_j
        if self.store_max:
            state.m = m_new
