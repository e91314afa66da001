"""Where a kernel-vs-golden mismatch concentrates, and whether E4M3 rounding of P explains it.

:func:`attribute` takes the mismatch mask of a failed :class:`~properties.compare.Comparison` of an
attention output ``[B*S1, NQ, D]`` and the inputs of the call, and returns an :class:`Attribution`:
counts per batch, per kv head, per tile walk (how many ``s2_tile`` tiles the row's visible length
``cur`` spans and the size of the last one), in rows with ``cur == 0`` (SPEC §2 item 5: must be 0),
and how many mismatched elements sit in a (b, i, h) row whose P has an element next to an E4M3
rounding boundary.

The boundary test recomputes the golden's P for the row (SPEC §2 item 3: ``P = exp(S - m_j)`` per
tile, quantized with ``scale = 448 / max P``), reading Q and K through the codec of the comparison
being explained, and asks whether ``P * scale`` lies within ``BOUNDARY_ULPS`` float32 ulps of one of
that codec's rounding boundaries (``Fp8Codec.rounding_boundaries``: the grid midpoints of the spec
codec; for pypto's calculator also its integer-rounding points k + 0.5). Such a P element may
legitimately round to the other neighbour in a kernel whose float32 arithmetic differs by an ulp,
which moves one P8 code by one step: the only legitimate reason for a kernel to differ from the
golden beyond float32 noise. It is reported as such, never used to widen tolerances.

This module never decides pass or fail and never prints: :meth:`Attribution.render` returns the
one line that :func:`~properties.compare.make_mismatch_message` shows as context.
"""
from __future__ import annotations

import collections
import dataclasses
import math

import torch

__all__ = ["BOUNDARY_ULPS", "Attribution", "attribute", "near_boundary"]

BOUNDARY_ULPS = 4


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Counts of mismatched output elements, grouped the ways a paged-attention bug shows itself."""
    mismatched: int
    by_batch: tuple[tuple[int, int], ...]            # (batch, count), largest first
    by_kv_head: tuple[tuple[int, int], ...]          # (kv head, count)
    by_tile_walk: tuple[tuple[tuple[int, int], int], ...]  # ((tiles, tokens in last tile), count)
    in_cur_zero_rows: int
    on_boundary: int                                 # in rows whose P touches a rounding boundary

    def render(self) -> str:
        """One line: where the mismatches are, then the boundary count."""
        n = self.mismatched
        parts = []
        for label, plural, groups in (("batch", "batches", self.by_batch),
                                      ("kv head", "kv heads", self.by_kv_head)):
            if len(groups) == 1:
                parts.append(f"{label} {groups[0][0]}")
            elif groups:
                parts.append(f"{plural} " + ", ".join(f"{k}: {c}" for k, c in groups[:4])
                             + (", ..." if len(groups) > 4 else ""))
        walks = [f"{t} tile{'s' if t != 1 else ''} (last has {r})" for (t, r), _ in self.by_tile_walk[:3]]
        if walks:
            parts.append("rows spanning " + " or ".join(walks))
        where = ("all " if len(self.by_batch) == 1 else "") + f"{n} in " + "; ".join(parts) if parts else f"{n}"
        if self.in_cur_zero_rows:
            where += f"; {self.in_cur_zero_rows} in rows with cur == 0 (must be 0)"
        return where + f"; {self.on_boundary} on E4M3 rounding boundaries of P"


def near_boundary(y: torch.Tensor, boundaries: torch.Tensor, ulps: int = BOUNDARY_ULPS) -> torch.Tensor:
    """True where ``|y|`` lies within ``ulps`` float32 ulps of one of ``boundaries``."""
    y32 = y.detach().to(torch.float32).abs()
    y64 = y32.to(torch.float64)
    idx = torch.searchsorted(boundaries, y64).clamp(1, len(boundaries) - 1)
    dist = torch.minimum((y64 - boundaries[idx - 1]).abs(), (y64 - boundaries[idx]).abs())
    ulp = (torch.nextafter(y32, torch.tensor(math.inf)) - y32).to(torch.float64)
    return torch.isfinite(y64) & (y64 > 0) & (dist <= ulps * ulp)


def _groups(counter: collections.Counter) -> tuple:
    return tuple(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _row_p_near_boundary(inputs: dict, b: int, i: int, h: int, s1: int, cur: int, *, s2_tile: int,
                         softmax_scale: float, codec, boundaries: torch.Tensor) -> bool:
    """Recompute P of (b, i, h) per SPEC §2 item 3 (codes read by ``codec``) and test it against
    the codec's rounding boundaries."""
    q, k_cache = inputs["q"], inputs["k_cache"]
    nq, nkv = q.shape[1], k_cache.shape[2]
    n = h // (nq // nkv)
    bs = k_cache.shape[1]
    t = torch.arange(cur)
    blocks = inputs["block_table"][b, t // bs].long()
    k8 = codec.decode(k_cache[blocks, t % bs, n].contiguous())
    ks = inputs["k_scale"][blocks, t % bs, n, 0].float()
    row = b * s1 + i
    s = (k8 @ codec.decode(q[row, h].contiguous())) * inputs["q_scale"][row, h, 0].float() * ks * softmax_scale
    for start in range(0, cur, s2_tile):
        tile = s[start:start + s2_tile]
        p = torch.exp(tile - tile.max())
        y = p * (448.0 / p.max())
        if bool(near_boundary(y, boundaries).any()):
            return True
    return False


def attribute(mismatch_mask: torch.Tensor, inputs: dict, *, s2_tile: int, softmax_scale: float | None = None,
              codec=None, max_rows: int = 256) -> Attribution:
    """Group the mismatched elements of an attention output and count E4M3 boundary rows.

    * ``mismatch_mask`` -- bool ``[B*S1, NQ, D]``, e.g. ``Comparison.mismatch_mask``.
    * ``inputs`` -- the call's tensors by SPEC §1 name (``InputBundle.kwargs()`` works).
    * ``s2_tile`` -- the tile walk of the call; ``softmax_scale`` defaults to D**-0.5.
    * ``codec`` -- the codec of the comparison being explained (default: the spec codec): how Q and
      K codes are read, and whose rounding boundaries count.
    * ``max_rows`` -- recompute P for at most this many distinct rows (the rest count as not on a
      boundary), so a wholesale failure stays cheap to describe.
    """
    q = inputs["q"]
    nq, d = q.shape[1], q.shape[2]
    nkv = inputs["k_cache"].shape[2]
    lengths = [int(v) for v in inputs["kv_act_seqs"]]
    batch = len(lengths)
    s1 = q.shape[0] // batch
    group = nq // nkv
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    idx = mismatch_mask.nonzero()
    by_batch, by_head, by_walk = collections.Counter(), collections.Counter(), collections.Counter()
    per_row: collections.Counter = collections.Counter()
    zero_rows = 0
    for row, h, _ in idx.tolist():
        b, i = divmod(row, s1)
        cur = max(0, lengths[b] - (s1 - 1 - i))
        by_batch[b] += 1
        by_head[h // group] += 1
        tiles = math.ceil(cur / s2_tile)
        by_walk[(tiles, cur - (tiles - 1) * s2_tile if tiles else 0)] += 1
        zero_rows += cur == 0
        per_row[(b, i, h, cur)] += 1
    from golden.codec import get_codec
    codec = get_codec(codec)
    boundaries = codec.rounding_boundaries()
    on_boundary = 0
    for (b, i, h, cur), count in list(per_row.items())[:max_rows]:
        if cur and _row_p_near_boundary(inputs, b, i, h, s1, cur, s2_tile=s2_tile, softmax_scale=scale,
                                        codec=codec, boundaries=boundaries):
            on_boundary += count
    return Attribution(mismatched=len(idx), by_batch=_groups(by_batch), by_kv_head=_groups(by_head),
                       by_tile_walk=_groups(by_walk), in_cur_zero_rows=zero_rows, on_boundary=on_boundary)
