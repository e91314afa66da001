"""Where a kernel-vs-golden mismatch concentrates.

:func:`attribute` takes the mismatch mask of a failed :class:`~properties.rule.compare.Comparison` of an
attention output ``[B*S1, NQ, D]`` and the inputs of the call, and returns an :class:`Attribution`:
counts per batch, per kv head, per tile walk (how many ``s2_tile`` tiles the row's visible length
``cur`` spans and the size of the last one), and in rows with ``cur == 0`` (SPEC §2 item 5: must be 0).

Whether a difference is one a conforming kernel can make (an E4M3 code of P flipped by a legal float32
reordering) is not attribution's question: the acceptance envelope (SPEC §4.2, golden/envelope/builder.py)
answers it with a proof, and a mismatch is by definition outside it.

:func:`error_picture` summarizes the per-element ratio of error to tolerance where it is computed (a
worker process), so that reports can draw it without the tensor: the worst ratio per (row, head) and
a histogram over :data:`RATIO_BINS`.

This module never decides pass or fail and never prints: :meth:`Attribution.render` returns the
one line that :func:`~properties.rule.compare.make_mismatch_message` shows as context.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import TypeVar

import torch

from pfa_verify.golden.attention import visible_lengths
from pfa_verify.golden.paging import ceil_div


def query_positions(tensors: Mapping[str, torch.Tensor]) -> int:
    """S1 of a call's tensors (SPEC §1): q holds B * S1 rows for the B lengths of ``kv_act_seqs``."""
    rows: int = tensors["q"].shape[0]
    return rows // max(1, len(tensors["kv_act_seqs"]))

__all__ = ["query_positions", "Attribution", "attribute", "RATIO_BINS", "error_picture"]

_Key = TypeVar("_Key", int, tuple[int, int])

#: Bins of ``|actual - golden| / (atol + rtol |golden|)`` (1 is the tolerance, SPEC §4), and the rule's
#: ratio where the envelope decides (properties.rule.compare.error_ratio).
RATIO_BINS = (0.0, 1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 10.0, 100.0, 1e3, math.inf)


def error_picture(ratio: torch.Tensor) -> tuple[list[list[float | None]], list[int]]:
    """(the worst ratio per (row, head), None where not finite; the count of ratios in each
    :data:`RATIO_BINS` interval, then of non-finite ones) of a per-element ratio ``[B*S1, NQ, D]``."""
    worst = ratio.amax(dim=-1)
    error_map = [[(float(v) if math.isfinite(v) else None) for v in row] for row in worst.tolist()]
    flat = ratio.reshape(-1)
    finite = flat[torch.isfinite(flat)]
    counts = []
    for lo, hi in itertools.pairwise(RATIO_BINS):
        counts.append(int(((finite >= lo) & (finite < hi)).sum()) if lo > 0 else int((finite < hi).sum()))
    counts.append(int((~torch.isfinite(flat)).sum()))
    return error_map, counts


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Counts of mismatched output elements, grouped the ways a paged-attention bug shows itself."""
    mismatched: int
    by_batch: tuple[tuple[int, int], ...]            # (batch, count), largest first
    by_kv_head: tuple[tuple[int, int], ...]          # (kv head, count)
    by_tile_walk: tuple[tuple[tuple[int, int], int], ...]  # ((tiles, tokens in last tile), count)
    in_cur_zero_rows: int

    def render(self) -> str:
        """One line: where the mismatches are."""
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
        return where


def _groups(counter: collections.Counter[_Key]) -> tuple[tuple[_Key, int], ...]:
    return tuple(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def attribute(mismatch_mask: torch.Tensor, inputs: Mapping[str, torch.Tensor], *, s2_tile: int) -> Attribution:
    """Group the mismatched elements of an attention output.

    * ``mismatch_mask`` -- bool ``[B*S1, NQ, D]``, e.g. ``Comparison.mismatch_mask``.
    * ``inputs`` -- the call's tensors by SPEC §1 name (``InputBundle.kwargs()`` works).
    * ``s2_tile`` -- the tile walk of the call.
    """
    q = inputs["q"]
    nq = q.shape[1]
    nkv = inputs["k_cache"].shape[2]
    s1 = query_positions(inputs)
    group = nq // nkv
    cur_of_row = visible_lengths(inputs["kv_act_seqs"].cpu(), s1).reshape(-1).tolist()   # by row b * S1 + i
    idx = mismatch_mask.nonzero()
    by_batch: collections.Counter[int] = collections.Counter()
    by_head: collections.Counter[int] = collections.Counter()
    by_walk: collections.Counter[tuple[int, int]] = collections.Counter()
    zero_rows = 0
    for row, h, _ in idx.tolist():
        b = row // s1
        cur = cur_of_row[row]
        by_batch[b] += 1
        by_head[h // group] += 1
        tiles = ceil_div(cur, s2_tile)
        by_walk[(tiles, cur - (tiles - 1) * s2_tile if tiles else 0)] += 1
        zero_rows += cur == 0
    return Attribution(mismatched=len(idx), by_batch=_groups(by_batch), by_kv_head=_groups(by_head),
                       by_tile_walk=_groups(by_walk), in_cur_zero_rows=zero_rows)
