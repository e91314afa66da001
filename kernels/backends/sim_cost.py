"""What a sim execute costs, and how the sim backend keeps it inside a worker's memory.

Measured on pypto 0.2.0's calculator with W9 and W10 (kernels/pypto_workarounds/), one OpenMP
thread (the fitted points are in the table below;
``OMP_NUM_THREADS=1 /usr/bin/time -v pfa-verify run --backend sim --cases NAME --examples 0 --budget 0
--no-capture`` re-measures a row: its first call is most of the case's seconds, its peak the maximum
resident set size).
The interpreter starts each leaf frame of the tile walk with a copy of every cache input, so both time
and memory grow with the product of the tile iterations and the caches' size. Per call:

- ``iterations = NKV * (group / g_tile) * sum over the rows (b, i) of ceil(cur[b, i] / s2_tile)``, with
  ``cur`` the visible length of SPEC §2 item 1 (golden.attention.visible_lengths)
- ``cache_mb = blocks * BS * NKV * (2 * D + 4) / 2**20`` (the two FP8 caches and the float32 K scales;
  blocks = NB for a whole call, the blocks its batches own for a chunk; at least one)
- ``units = iterations * cache_mb``; peak memory ~ ``BASE_BYTES + MEMORY_PER_UNIT * units``
- seconds ~ ``TRACE_S`` once, plus per call ``SECONDS_PER_CALL + SECONDS_PER_ITERATION * iterations +
  SECONDS_PER_UNIT * units`` (within a factor of 2 on the points below)

Both products shrink with the square of the batch: a call whose estimate is over the memory cap is
run in batch chunks (:func:`plan`, the one planner: the estimate and the backend's execute read the
same chunks), each on caches compacted to the blocks its batches own (:func:`chunk_inputs`), with the
table width and every other static dimension unchanged, so every chunk after the first re-runs the
kernel's traced graph (W9). A correct kernel gives the same bits chunked or not (it reads only the
blocks the table gives it); what chunking drops are the cells no batch of the chunk owns, which the
spec says are never read.
"""
from __future__ import annotations

import dataclasses

import torch

from pfa_verify.golden.paging import blocks_needed, ceil_div, visible_lengths

__all__ = ["Estimate", "BatchChunk", "estimate", "plan", "chunk_inputs", "MEMORY_CAP_BYTES"]

# Fitted to the six upstream cases (one process per case, OMP_NUM_THREADS=1; per call,
# chunked as planned below): units = tile iterations x cache MB of one call.
#   case          iterations  units/call  calls  first call s  next call s  peak GiB
#   b2_s2_1k              16         8      1       1.01          0.05        0.38
#   b16_256_nkv_4        128       520      1       1.91          0.99        1.21
#   b1_2048_nkv_8        256      1040      1       1.91          0.94        0.84
#   b16_8k_nkv_1         128      4160      1       4.32          3.04        2.39
#   b16_8k_nkv_2         256      4160      2       7.20          6.01        2.43
#   b16_8195_nkv_2      2080      4836      6      19.98         18.25        2.57
# and, unchunked, b16_8k_nkv_2 at 16640 units peaked at 7.6 GiB (memory follows the units, not the batch).
BASE_BYTES = 0.8e9                 # interpreter, pypto, torch, calculator, the case's inputs
MEMORY_PER_UNIT = 0.45e6           # bytes per (tile iteration x cache MB)
TRACE_S = 1.5                      # the first call of a static configuration traces the kernel (W9)
SECONDS_PER_CALL = 0.05
SECONDS_PER_ITERATION = 2e-3
SECONDS_PER_UNIT = 7e-4            # per (tile iteration x cache MB)
MEMORY_CAP_BYTES = 4.0e9           # per call: a worker with its goldens stays under 6 GB, two fit in 24 GB


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The predicted cost of one sim execute of a case: seconds, peak bytes, and batch chunks."""
    seconds: float
    peak_bytes: float
    chunks: int

    def describe(self) -> str:
        split = f" in {self.chunks} batch chunks" if self.chunks > 1 else ""
        return f"about {self.seconds:.0f} s and {self.peak_bytes / 2**30:.1f} GiB{split}"


@dataclasses.dataclass(frozen=True)
class BatchChunk:
    """One call of an execute: its ``batches``, tile ``iterations`` and ``units`` (module docstring)."""
    batches: range
    iterations: int
    units: float

    @property
    def peak_bytes(self) -> float:
        return BASE_BYTES + MEMORY_PER_UNIT * self.units

    @property
    def seconds(self) -> float:
        return SECONDS_PER_CALL + SECONDS_PER_ITERATION * self.iterations + SECONDS_PER_UNIT * self.units


def plan(lengths, *, s1: int, nkv: int, g_steps: int, s2_tile: int, block_size: int, head_dim: int,
         num_blocks: int, cap: float = MEMORY_CAP_BYTES) -> list[BatchChunk]:
    """The calls of one execute of batches with kv_act_seqs ``lengths``: the whole batch when it fits
    ``cap``, else the fewest equal batch chunks whose largest fits, on compacted caches (a single batch
    each is the floor, taken even when it does not fit). ``g_steps`` is group / g_tile."""
    batch = len(lengths)
    steps = ceil_div(visible_lengths(lengths, s1), s2_tile).sum(dim=1).tolist()
    need = blocks_needed(lengths, block_size).tolist()

    def chunk(batches: range, blocks: int) -> BatchChunk:
        iterations = nkv * g_steps * sum(steps[b] for b in batches)
        cache_mb = max(1, blocks) * block_size * nkv * (2 * head_dim + 4) / 2**20
        return BatchChunk(batches, iterations, iterations * cache_mb)

    for count in range(1, batch + 1):
        size = ceil_div(batch, count)
        chunks = [chunk(range(b, min(batch, b + size)), num_blocks if count == 1 else sum(need[b:b + size]))
                  for b in range(0, batch, size)]
        if count == batch or max(c.peak_bytes for c in chunks) <= cap:
            return chunks
    return []       # batch == 0: nothing to run


def estimate(config, cap: float = MEMORY_CAP_BYTES) -> Estimate:
    """The cost of a golden.PagedAttentionConfig on the sim backend, chunked as the backend would (:func:`plan`)."""
    group = config.nq // config.nkv
    chunks = plan(config.lengths, s1=config.s1, nkv=config.nkv, g_steps=group // (config.g_tile or group),
                  s2_tile=config.s2_tile, block_size=config.block_size, head_dim=config.head_dim,
                  num_blocks=config.physical_blocks, cap=cap)
    seconds = TRACE_S
    for c in chunks:
        seconds += c.seconds
    return Estimate(seconds, max((c.peak_bytes for c in chunks), default=0.0), len(chunks))


def chunk_inputs(tensors: dict, batches: range, s1: int) -> dict:
    """The inputs of ``batches`` alone, on caches compacted to the blocks they own (at least one block:
    the kernel gathers -1 entries from block 0), the table renumbered to match and as wide as before;
    entries past a row's valid blocks become -1 (never read, SPEC §2 item 2)."""
    table, lengths = tensors["block_table"], tensors["kv_act_seqs"]
    bs = tensors["k_cache"].shape[1]
    rows = table[batches.start:batches.stop].clone()
    valid = torch.arange(rows.shape[1])[None, :] < blocks_needed(lengths[batches.start:batches.stop], bs)[:, None]
    owned = rows[valid].long()
    order = owned if owned.numel() else torch.zeros(1, dtype=torch.long)
    renumbered = torch.full_like(rows, -1)
    renumbered[valid] = torch.arange(owned.numel(), dtype=rows.dtype)
    q_rows = slice(batches.start * s1, batches.stop * s1)
    return dict(q=tensors["q"][q_rows].contiguous(), q_scale=tensors["q_scale"][q_rows].contiguous(),
                k_cache=tensors["k_cache"][order].contiguous(), k_scale=tensors["k_scale"][order].contiguous(),
                v_cache=tensors["v_cache"][order].contiguous(),
                v_scale=tensors["v_scale"][batches.start:batches.stop].contiguous(),
                block_table=renumbered.contiguous(), kv_act_seqs=lengths[batches.start:batches.stop].contiguous())
