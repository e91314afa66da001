"""A kernel written from docs/spec.md alone, with no code of the golden's walk or of kernels/mutants, and
seventeen defects nobody wrote a fault model from: the diagnosis is judged on these. Each is a slip a
kernel engineer makes writing SPEC §2 by hand, with the stage a diagnosis must name (:data:`STAGES`, the
words of properties/diagnosis/fault_models.py's stages):

- ``last_tile_dropped``: the last tile's length is taken as ``cur % s2_tile``, so a full last tile is
  dropped (a row of exactly one full tile sees nothing and is written as 0);
- ``batch_0_lengths``: every batch walks ``kv_act_seqs[0]``;
- ``softmax_folded``: softmax_scale is multiplied into q_scale before the dequant (SPEC F2: it comes last);
- ``table_overrun``: the block table is read a whole tile of columns at a time, past the end of a row
  when its width is not a multiple of the blocks per tile (an IndexError, as an out-of-bounds read is);
- ``causal_reversed``: query row i sees ``kv_act_seqs[b] - i`` tokens (the causal offset counted from
  the wrong end);
- ``heads_interleaved``: query head h reads KV head ``h % NKV`` (an interleaved GQA map);
- ``v_scale_head_0``: V's dequant scale of KV head 0 for every head;
- ``k_scale_per_block``: K's scale of a block's first slot for every token of the block;
- ``rescale_swapped``: the online update multiplies the running O by the new tile's factor
  ``exp(m_j - m')`` and the tile's O by the old one's (the two factors swapped);
- ``l_not_rescaled``: the running sum is not multiplied by ``exp(m - m')`` when the max moves;
- ``empty_row_copies``: a row that sees no token keeps the previous row's output (a stale buffer);
- ``block_tail_read``: the last block is read to its end, garbage past the length included;
- ``p_not_quantized``: MM2 takes P in float32 (no E4M3 round trip, no P scale);
- ``exp2``: the local softmax uses ``2 ** (s - m)`` (an exp2 unit without the log2(e) factor);
- ``not_normalized``: the output is ``O`` without the division by ``l``;
- ``table_of_batch_0``: every batch reads block_table row 0;
- ``q_scale_group_head_0``: the group's first query head's scale for every head of the group.

``make_backend(defect)`` builds it; ``defect=None`` is the conforming kernel (it passes: the control).
"""
from __future__ import annotations

import torch

from pfa_verify import golden
from pfa_verify.golden import SPEC_CODEC

_MM1, _MM2, _TILES, _P = "MM1 scales", "MM2 and the V scale", "the tile walk", "P quantization"
_LENGTHS = ("visible length", "lengths and paging")
#: Each defect and the SPEC §2 stages a diagnosis may name for it (a prefix of a fault model's stage);
#: table_overrun raises: its diagnosis is what the erroring cases share (properties/diagnosis/separation.py) and the
#: kernel on neighbours of the case (properties/diagnosis/error_probes.py), whose widened table locates the tile walk.
STAGES: dict[str, tuple[str, ...]] = {
    "last_tile_dropped": (_TILES,), "batch_0_lengths": _LENGTHS, "softmax_folded": (_MM1,),
    "table_overrun": (_TILES, "paging"), "causal_reversed": ("visible length",), "heads_interleaved": ("GQA head map",),
    "v_scale_head_0": (_MM2,), "k_scale_per_block": (_MM1,), "rescale_swapped": ("online update",),
    "l_not_rescaled": ("online update",), "empty_row_copies": ("empty rows",),
    "block_tail_read": (_TILES, *_LENGTHS), "p_not_quantized": (_P,), "exp2": ("local softmax",),
    "not_normalized": ("output",), "table_of_batch_0": ("paging", "lengths and paging"),
    "q_scale_group_head_0": (_MM1,),
}
DEFECTS = tuple(STAGES)
__all__ = ["DEFECTS", "STAGES", "HandWritten", "make_backend", "conforming"]   # and one factory per defect, below
_E4M3_MAX = 448.0


class HandWritten:
    """SPEC §2 as a kernel engineer writes it: row by row, a KV head's group at once, tile by tile."""
    codec = None

    def __init__(self, defect: str | None = None) -> None:
        if defect not in (None, *DEFECTS):
            raise ValueError(f"defect={defect!r} must be None or one of {DEFECTS}")
        self.defect = defect
        self.name = f"tests/properties/outside_defects.py:{defect or 'conforming'}"

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        decode, bug = SPEC_CODEC.decode, self.defect
        rows, nq, d = q.shape
        batch, bs, nkv = kv_act_seqs.shape[0], k_cache.shape[1], k_cache.shape[2]
        s1, group = rows // batch, nq // nkv
        scale = torch.tensor(d ** -0.5 if softmax_scale is None else softmax_scale, dtype=torch.float32)
        width = block_table.shape[1]
        out = torch.zeros(rows, nq, d)
        for b in range(batch):
            length = int(kv_act_seqs[0 if bug == "batch_0_lengths" else b])
            table_row = 0 if bug == "table_of_batch_0" else b
            for i in range(s1):
                row = b * s1 + i
                cur = max(0, length - (i if bug == "causal_reversed" else s1 - 1 - i))
                if cur == 0 and bug == "empty_row_copies" and row > 0:
                    out[row] = out[row - 1]
                    continue
                for n in range(nkv):
                    heads = torch.arange(n, nq, nkv) if bug == "heads_interleaved" else torch.arange(n * group, (n + 1) * group)
                    qf = decode(q[row, heads])                       # [G, D]
                    qs = q_scale[row, heads]                         # [G, 1]
                    if bug == "q_scale_group_head_0":
                        qs = qs[:1].expand_as(qs)
                    m = torch.full((group, 1), -torch.inf)
                    l_sum = torch.zeros(group, 1)
                    acc = torch.zeros(group, d)
                    walk = -(-cur // bs) * bs if bug == "block_tail_read" else cur
                    for start in range(0, walk, s2_tile):
                        size = min(s2_tile, walk - start)
                        if bug == "last_tile_dropped" and start + s2_tile >= cur:
                            size = cur % s2_tile
                        if size == 0:
                            continue
                        tokens = torch.arange(start, start + size)
                        columns = tokens // bs
                        if bug == "table_overrun":
                            first = start // bs
                            tile_cols = torch.arange(first, first + s2_tile // bs)
                            if int(tile_cols.max()) >= width:
                                raise IndexError(f"block_table column {int(tile_cols.max())} is past the row's "
                                                 f"{width} columns")
                        blocks = block_table[table_row, columns].long()
                        slots = tokens % bs
                        kf = decode(k_cache[blocks, slots, n])       # [T, D]
                        vf = decode(v_cache[blocks, slots, n])
                        ks = k_scale[blocks, torch.zeros_like(slots) if bug == "k_scale_per_block" else slots, n]
                        raw = qf @ kf.T
                        if bug == "softmax_folded":
                            s = raw * (qs * scale) * ks.T
                        else:
                            s = raw * qs * ks.T * scale
                        m_j = s.max(dim=1, keepdim=True).values
                        p = torch.pow(2.0, s - m_j) if bug == "exp2" else torch.exp(s - m_j)
                        amax = p.max(dim=1, keepdim=True).values
                        v_dequant = v_scale[b, 0 if bug == "v_scale_head_0" else n][None, :]
                        if bug == "p_not_quantized":
                            o_j = (p @ vf) * v_dequant
                        else:
                            p8 = decode(SPEC_CODEC.encode(p * (_E4M3_MAX / amax)))
                            o_j = (p8 @ vf) * (amax / _E4M3_MAX) * v_dequant
                        m_new = torch.maximum(m, m_j)
                        alpha, beta = torch.exp(m - m_new), torch.exp(m_j - m_new)
                        l_sum = (l_sum if bug == "l_not_rescaled" else alpha * l_sum) + beta * p.sum(dim=1, keepdim=True)
                        acc = beta * acc + alpha * o_j if bug == "rescale_swapped" else alpha * acc + beta * o_j
                        m = m_new
                    if bug == "not_normalized":
                        out[row, heads] = acc
                    else:
                        out[row, heads] = torch.where(l_sum > 0, acc / l_sum, torch.zeros(()))
        return out.bfloat16()

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        """The AT-12 stage is not under trial here: the golden's."""
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make_backend(defect: str | None = None) -> HandWritten:
    return HandWritten(defect)


# One factory per defect, for the command line (--backend tests/properties/outside_defects.py:NAME).
def conforming() -> HandWritten:
    return HandWritten()


def _factory(defect: str):
    def make() -> HandWritten:
        return HandWritten(defect)
    make.__name__ = make.__qualname__ = defect
    make.__doc__ = f"The hand-written kernel with the defect {defect!r}."
    return make


for _defect in DEFECTS:
    globals()[_defect] = _factory(_defect)
