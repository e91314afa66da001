"""Deliberately wrong backends (test doubles): the suite must catch them, capture and replay them.

Each is importable by file path, which is how a captured regression names it, so a fresh process
(``pfa-verify cases replay ID``) rebuilds the same double: ``tests/properties/doubles.py:DropLastS2Tile``.
"""
from __future__ import annotations

import torch

from pfa_verify.kernels.backends.golden_backend import GoldenBackend


class DropLastS2Tile(GoldenBackend):
    """The golden, except that the KV walk stops before the last s2 tile of any length longer
    than one tile (an off-by-one in the tile count)."""
    name = "tests/properties/doubles.py:DropLastS2Tile"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                            *, s2_tile=128, **kwargs):
        lens = kv_act_seqs.clone()
        long = lens > s2_tile
        lens[long] = ((lens[long] - 1) // s2_tile) * s2_tile
        return super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, lens,
                                           s2_tile=s2_tile, **kwargs)


class WritesToInputs(GoldenBackend):
    """The golden, but it scribbles on q_scale (inputs must never be modified)."""
    name = "tests/properties/doubles.py:WritesToInputs"

    def paged_attention_fp8(self, q, q_scale, *args, **kwargs):
        out = super().paged_attention_fp8(q, q_scale, *args, **kwargs)
        q_scale.mul_(2.0)
        return out


class HalveAtWideTiles(GoldenBackend):
    """The golden, except that the output is exactly half the right value whenever s2_tile spans
    more than one block (a kernel whose rescale is wrong only on some tile configurations)."""
    name = "tests/properties/doubles.py:HalveAtWideTiles"

    def paged_attention_fp8(self, q, q_scale, k_cache, *args, s2_tile=128, **kwargs):
        out = super().paged_attention_fp8(q, q_scale, k_cache, *args, s2_tile=s2_tile, **kwargs)
        return (out.float() / 2).bfloat16() if s2_tile > k_cache.shape[1] else out


class ReadsTheNextColumn(GoldenBackend):
    """The golden, except that logical block j is read through column j + 1 of the block table (an
    off-by-one in the table lookup; an entry read this way that is -1, or past the last column, is
    clamped to block 0, as the kernel clamps -1)."""
    name = "tests/properties/doubles.py:ReadsTheNextColumn"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, **kwargs):
        shifted = torch.cat([block_table[:, 1:], torch.full_like(block_table[:, :1], -1)], dim=1).clamp(min=0)
        return super().paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, shifted.contiguous(),
                                           kv_act_seqs, **kwargs)
