"""Which tokens a row's weights show it saw, in SPEC §2's stages (the weights readout's reading of rows that
see a prefix of their batch's tokens, or each tile's first tokens; properties/diagnosis/readout.py).

A row that sees the spec's tokens in the spec's proportions, renormalized, but not all of them (or more)
saw a prefix of another length: its end on a multiple of s2_tile next to its own is the tile walk; rows of
one batch that no one length explains are the causal offset (the visible length), unless they all see the
same first tokens, a multiple of the block size, whatever their position (a gather cut short: the tile
walk), or read on to the end of their batch's last block (a length not masked), or all see the batch's
whole length (the causal offset dropped); an end that a length slip gives as well (a batch's length,
batch 0's or a neighbouring batch's, another row's visible length) names no walk; every batch off by the same count is the visible length; batches off by different counts, or one
batch off while the batches read beside it are right, are a batch's length (lengths and paging). A row that
sees each tile's first C tokens, across tiles, is the tile walk too.
"""
from __future__ import annotations

import collections

import torch

from pfa_verify import golden
from pfa_verify.golden.paging import ceil_div, visible_lengths

__all__ = ["tile_prefix", "tile_ends", "prefix_stage"]


def tile_prefix(tokens: torch.Tensor, seen: torch.Tensor, solid: torch.Tensor, m: int, tile: int) -> int | None:
    """C when the tokens a row sees (``seen`` over its batch's ``tokens``) are each tile's first C of its
    first ``m`` (0 < C < ``tile``), across two tiles or more (one tile's prefix is a length, not a walk);
    faint tokens (not ``solid``) may be missing. Else None."""
    held = tokens[seen]
    if not held.numel() or len(set((held // tile).tolist())) < 2:
        return None
    first = int((held % tile).max()) + 1
    expected = (tokens < m) & (tokens % tile < first)
    if first >= tile or bool((seen & ~expected).any()) or bool((expected & solid & ~seen).any()):
        return None
    return first


def tile_ends(m: int, tile: int) -> set[int]:
    """The ends a walk of whole s2_tile tiles gives a row of ``m`` visible tokens: the multiples of s2_tile on
    either side of it, and one tile short when it is one (a full last tile dropped)."""
    ends = {m // tile * tile, ceil_div(m, tile) * tile} | ({m - tile} if m % tile == 0 else set())
    return {n for n in ends if n > 0}


def prefix_stage(shifts: dict[tuple[int, int], tuple[int, int, int]], c: golden.PagedAttentionConfig, lengths: list[int],
                  right: set[int]) -> tuple[str | None, str]:
    """The stage that rows seeing a prefix of the wrong length point to (the module docstring): ``shifts``
    maps (batch, query row) to (the fewest tokens it may see, the most, its visible length); ``right`` are
    the batches read whose every row holds the spec's weights."""
    by_batch: dict[int, dict[int, tuple[int, int]]] = collections.defaultdict(dict)
    for (b, i), (lo, hi, _) in shifts.items():
        by_batch[b][i] = (lo, hi)
    text = "rows see a prefix of their batch's tokens, of another length than SPEC §2.1's visible length"
    tile = c.s2_tile
    # Counts a length slip gives as well as a walk: a batch's length (the causal offset dropped), the length
    # of a batch a slip of the batch index reads (batch 0, the batch before or after), the visible length of
    # another row of the batch (a row's position mixed up). An end there is no evidence of the walk.
    cur = visible_lengths(lengths, c.s1)
    length_like = {b: {lengths[x] for x in (b, 0, b - 1, b + 1) if 0 <= x < len(lengths)} | set(cur[b].tolist())
                   for b in by_batch}

    def tile_end(b: int, lo: int, hi: int, m: int) -> bool:
        return any(lo <= n <= hi and n not in length_like[b] for n in tile_ends(m, tile))
    # A tile boundary one token away is as much "one off" as the tile walk: the walk needs an end moved further.
    if (all(tile_end(b, lo, hi, m) for (b, _), (lo, hi, m) in shifts.items())
            and any(min(abs(lo - m), abs(hi - m)) > 1 for lo, hi, m in shifts.values())):
        return "the tile walk", text + ": each row's ends on a multiple of s2_tile next to its own"
    used = {}                                   # batch -> the one length that gives its rows' counts
    for b, rows in by_batch.items():
        fitting = [n for n in range(0, 2 * max(lengths) + c.s1 + 2)
                   if all(lo <= max(0, n - (c.s1 - 1 - i)) <= hi for i, (lo, hi) in rows.items())]
        block_end = ceil_div(lengths[b], c.block_size) * c.block_size
        if not fitting:
            if (block_end > lengths[b] and block_end not in length_like[b]
                    and all(lo <= block_end <= hi for lo, hi in rows.values())):
                return "visible length", (text + f": batch {b}'s rows read on to the end of its last block "
                                          f"({block_end} tokens), past their visible length (a length not masked)")
            # rows of different visible lengths that all see one count whatever their position: the batch's
            # length is the causal offset dropped; a multiple of the block size short of what they should see
            # (and no length of the case: a length slip gives those as well) is a walk or a gather cut short
            low, high = max(lo for lo, _ in rows.values()), min(hi for _, hi in rows.values())
            visible = {shifts[(b, i)][2] for i in rows}
            if low <= high and len(visible) > 1:
                if low <= lengths[b] <= high:
                    return "visible length", (text + f": batch {b}'s rows all see its {lengths[b]} tokens (the causal "
                                              "offset dropped, SPEC §2.1)")
                cap = next((n for n in range(low, high + 1) if n and n % c.block_size == 0), None)
                if cap is not None and cap < max(visible) and cap not in length_like[b]:
                    return "the tile walk", (text + f": batch {b}'s rows see its first {cap} tokens whatever their "
                                             "visible length (a multiple of the block size)")
                return None, text + f": batch {b}'s rows see its first {low} tokens whatever their visible length"
            return "visible length", text + f": batch {b}'s rows are not those of any one length (the causal offset, SPEC §2.1)"
        used[b] = fitting[0]
    wrong = {b: n - lengths[b] for b, n in used.items() if n != lengths[b]}
    said = ", ".join(f"batch {b} as if of length {used[b]} (kv_act_seqs {lengths[b]})" for b in sorted(wrong))
    if wrong and all(used[b] == ceil_div(lengths[b], c.block_size) * c.block_size and used[b] not in length_like[b]
                     for b in wrong):
        return "visible length", f"{text}: {said}, each read on to the end of its last block (a length not masked)"
    if (wrong and all(used[b] in tile_ends(lengths[b], tile) - length_like[b] for b in wrong)
            and any(abs(d) > 1 for d in wrong.values())):
        return "the tile walk", f"{text}: {said}, each a multiple of s2_tile next to its length"
    if len(wrong) > 1 and len(set(wrong.values())) == 1:
        return "visible length", f"{text}: {said}, each off by the same count"
    if len(set(wrong.values())) > 1:
        return "lengths and paging", f"{text}: {said}, off by counts that differ by batch (a batch's length)"
    # one batch walks another length while batches read beside it are right: that batch's own length is
    # read wrong (a count of the block size is as much a gather cut short, and one token off as much a
    # mask slip that depends on the length: no name then)
    if len(wrong) == 1 and right and all(used[b] % c.block_size and abs(wrong[b]) > 1 for b in wrong):
        return "lengths and paging", (f"{text}: {said}, while batch{'es' if len(right) > 1 else ''} "
                                      f"{sorted(right)} read right (that batch's length)")
    return None, f"{text}: {said}"
