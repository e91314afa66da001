"""Block tables and the paged <-> contiguous KV layouts (SPEC §1, §2 item 2).

Token t of batch b is row ``t % BS`` of physical block ``block_table[b, t // BS]``. Entries past a
row's valid blocks are -1; the kernel clamps them to block 0 when it gathers, so whatever block 0
holds there must never reach the result (the golden masks by length, never by table value).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar, overload

import numpy as np
import torch

from .codec import SPEC_CODEC

__all__ = [
    "ceil_div",
    "positive_int",
    "blocks_needed",
    "visible_lengths",
    "gen_block_table",
    "contiguous_to_paged",
    "paged_to_contiguous",
    "token_slots",
    "PagedSlots",
    "paged_slots",
    "TileLayout",
]


def _check_lengths(kv_act_seqs: torch.Tensor | list[int] | tuple[int, ...], name: str = "kv_act_seqs") -> torch.Tensor:
    if isinstance(kv_act_seqs, (list, tuple)):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in kv_act_seqs):
            raise TypeError(f"{name} must hold ints, got {kv_act_seqs!r}")
        kv_act_seqs = torch.tensor(kv_act_seqs, dtype=torch.int64)
    if not isinstance(kv_act_seqs, torch.Tensor):
        raise TypeError(f"{name} must be a 1-D int tensor or a list of ints, got {type(kv_act_seqs).__name__}")
    if kv_act_seqs.dtype not in (torch.int32, torch.int64) or kv_act_seqs.ndim != 1:
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor, got {kv_act_seqs.dtype} of shape {tuple(kv_act_seqs.shape)}")
    if kv_act_seqs.numel() and int(kv_act_seqs.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got {kv_act_seqs.tolist()}")
    return kv_act_seqs.to(torch.int64)


def positive_int(value: object, name: str, *, minimum: float = 1) -> int:
    """``value`` if it is an int of at least ``minimum`` (1: a positive size; 0: a length, a count or a
    seed); a TypeError (not an int; a bool is not one) or a ValueError (below ``minimum``) naming ``name``.

    The one check of integer arguments in the project (sizes, tiles, lengths, seeds), so every entry
    point raises the same exception types with the same wording."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    return value


_Count = TypeVar("_Count", int, np.ndarray, torch.Tensor)


def ceil_div(a: _Count, b: int | _Count) -> _Count:
    """``ceil(a / b)`` for a >= 0, b > 0, exactly: ints, numpy arrays and torch tensors alike (integer
    floor division of ``-a``, so no float rounding; SPEC §2 item 2: ``ceil(kv_act_seqs[b] / BS)`` blocks,
    §2 item 3: ``ceil(cur / s2_tile)`` tiles)."""
    return -(-a // b)


@overload
def blocks_needed(kv_act_seqs: torch.Tensor, block_size: int) -> torch.Tensor: ...
@overload
def blocks_needed(kv_act_seqs: np.ndarray | Sequence[int], block_size: int) -> np.ndarray: ...
def blocks_needed(kv_act_seqs: torch.Tensor | np.ndarray | Sequence[int], block_size: int) -> torch.Tensor | np.ndarray:
    """int64 [B]: ``ceil(kv_act_seqs[b] / block_size)``, the table entries each batch uses (a torch
    tensor for a tensor, a numpy array for an array or a sequence: the golden's hot path counts in numpy)."""
    if isinstance(kv_act_seqs, torch.Tensor):
        return ceil_div(kv_act_seqs.to(torch.int64), block_size)
    return ceil_div(np.asarray(kv_act_seqs, dtype=np.int64), block_size)


def gen_block_table(
    kv_act_seqs: torch.Tensor | list[int], block_size: int, max_blocks_per_query: int, *,
    num_blocks: int | None = None, generator: torch.Generator | None = None,
) -> torch.Tensor:
    """int32 [B, max_blocks_per_query]: a shuffled block table with -1 padding.

    Each batch b gets ``ceil(kv_act_seqs[b] / block_size)`` distinct physical blocks, drawn
    without replacement from a random permutation of ``range(num_blocks)``; the rest of its row is
    -1. ``num_blocks`` defaults to the total needed (at least 1, since the kernel clamps -1 to
    block 0); a larger value leaves spare blocks nobody owns. Same generator state, same table.
    """
    lengths = _check_lengths(kv_act_seqs)
    block_size = positive_int(block_size, "block_size")
    max_blocks_per_query = positive_int(max_blocks_per_query, "max_blocks_per_query")
    needed = blocks_needed(lengths, block_size)
    if needed.numel() and int(needed.max()) > max_blocks_per_query:
        b = int(needed.argmax())
        raise ValueError(
            f"max_blocks_per_query={max_blocks_per_query} is too small: kv_act_seqs[{b}]={int(lengths[b])} "
            f"needs {int(needed[b])} blocks of block_size={block_size}"
        )
    total = int(needed.sum())
    if num_blocks is None:
        num_blocks = max(total, 1)
    num_blocks = positive_int(num_blocks, "num_blocks")
    if num_blocks < total:
        raise ValueError(f"num_blocks={num_blocks} is too small: the lengths {lengths.tolist()} need {total} blocks")
    physical = torch.randperm(num_blocks, generator=generator)[:total]
    table = torch.full((lengths.numel(), max_blocks_per_query), -1, dtype=torch.int32)
    column = torch.arange(max_blocks_per_query)
    table[column < needed[:, None]] = physical.to(torch.int32)
    return table


def token_slots(block_table: torch.Tensor, kv_act_seqs: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch, token, block, row) int64 vectors: where every valid token lives in the paged layout."""
    lengths = kv_act_seqs.to(torch.int64)
    token = torch.arange(int(lengths.max()) if lengths.numel() else 0)
    batch_idx, token_idx = torch.nonzero(token[None, :] < lengths[:, None], as_tuple=True)
    block = block_table.to(torch.int64)[batch_idx, token_idx // block_size]
    return batch_idx, token_idx, block, token_idx % block_size


def _check_table(block_table: torch.Tensor, lengths: torch.Tensor, block_size: int, num_blocks: int) -> None:
    if not isinstance(block_table, torch.Tensor) or block_table.dtype not in (torch.int32, torch.int64) or block_table.ndim != 2:
        raise TypeError("block_table must be a 2-D int32 tensor [B, MAXB]")
    if block_table.shape[0] != lengths.numel():
        raise ValueError(f"block_table has {block_table.shape[0]} rows but kv_act_seqs has {lengths.numel()} entries")
    needed = blocks_needed(lengths, block_size)
    if needed.numel() and int(needed.max()) > block_table.shape[1]:
        raise ValueError(f"block_table has {block_table.shape[1]} columns but kv_act_seqs needs up to {int(needed.max())} blocks")
    used = torch.arange(block_table.shape[1])[None, :] < needed[:, None]
    ids = block_table[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(f"block_table's valid entries must lie in [0, {num_blocks}), got {ids.min().item()}..{ids.max().item()}")


def _fill_value(fill: float, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        return SPEC_CODEC.to_fp8(torch.tensor([fill], dtype=torch.float32))[0]
    return torch.tensor(fill, dtype=dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PagedSlots:
    """Where every valid token of a (checked) block table lives: :func:`token_slots`, kept with what it was
    worked out for, so that several tensors paged through one table compute it once."""
    block_table: torch.Tensor
    lengths: torch.Tensor
    block_size: int
    num_blocks: int
    batch: torch.Tensor
    token: torch.Tensor
    block: torch.Tensor
    row: torch.Tensor


def paged_slots(block_table: torch.Tensor, kv_act_seqs: torch.Tensor | list[int], *, block_size: int,
                num_blocks: int) -> PagedSlots:
    """The checked :class:`PagedSlots` of a block table (the checks of :func:`contiguous_to_paged`)."""
    lengths = _check_lengths(kv_act_seqs)
    block_size = positive_int(block_size, "block_size")
    num_blocks = positive_int(num_blocks, "num_blocks")
    _check_table(block_table, lengths, block_size, num_blocks)
    batch, token, block, row = token_slots(block_table, lengths, block_size)
    return PagedSlots(block_table=block_table, lengths=lengths, block_size=block_size, num_blocks=num_blocks,
                      batch=batch, token=token, block=block, row=row)


#: Tokens :func:`contiguous_to_paged` copies at a time (16 MiB of a K cache with 8 heads of 128).
SCATTER_TOKENS = 1 << 14


def contiguous_to_paged(
    x: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor | list[int], *,
    block_size: int, num_blocks: int, fill: float = 0.0, slots: PagedSlots | None = None,
) -> torch.Tensor:
    """[num_blocks, block_size, N, X]: ``x`` ([B, S, N, X], BSND) scattered through ``block_table``.

    Only each batch's first ``kv_act_seqs[b]`` tokens are written; every other cell (spare
    blocks, the tail of a last block) holds ``fill`` (e.g. NaN, to prove the kernel never reads it).
    Works for any dtype, float8_e4m3fn included (``fill`` is then encoded with the spec codec).
    ``slots``: :func:`paged_slots` of these same arguments, when several tensors share the table.
    """
    if slots is None or slots.block_table is not block_table or slots.block_size != block_size \
            or slots.num_blocks != num_blocks or not torch.equal(slots.lengths, _check_lengths(kv_act_seqs)):
        slots = paged_slots(block_table, kv_act_seqs, block_size=block_size, num_blocks=num_blocks)
    lengths = slots.lengths
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError(f"x must be a 4-D tensor [B, S, N, X], got {getattr(x, 'shape', type(x).__name__)}")
    if x.shape[0] != lengths.numel():
        raise ValueError(f"x has batch {x.shape[0]} but kv_act_seqs has {lengths.numel()} entries")
    if lengths.numel() and int(lengths.max()) > x.shape[1]:
        raise ValueError(f"kv_act_seqs max {int(lengths.max())} exceeds x's sequence length {x.shape[1]}")
    paged = torch.empty((num_blocks, block_size, *x.shape[2:]), dtype=x.dtype)
    paged_bits = paged.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else paged
    paged_bits.fill_(_fill_value(fill, x.dtype).view(torch.uint8) if x.dtype == torch.float8_e4m3fn else fill)
    # A slice of the tokens at a time: the gathered values are a copy, which for a whole 128k-token
    # cache would be a third cache.
    for first in range(0, slots.token.numel(), SCATTER_TOKENS):
        part = slice(first, first + SCATTER_TOKENS)
        paged[slots.block[part], slots.row[part]] = x[slots.batch[part], slots.token[part]]
    return paged


def paged_to_contiguous(
    paged: torch.Tensor, block_table: torch.Tensor, kv_act_seqs: torch.Tensor | list[int], *,
    seq_len: int, fill: float = 0.0,
) -> torch.Tensor:
    """[B, seq_len, N, X]: the inverse of ``contiguous_to_paged``; tokens past each length get ``fill``."""
    lengths = _check_lengths(kv_act_seqs)
    if not isinstance(paged, torch.Tensor) or paged.ndim != 4:
        raise ValueError(f"paged must be a 4-D tensor [NB, BS, N, X], got {getattr(paged, 'shape', type(paged).__name__)}")
    seq_len = positive_int(seq_len, "seq_len")
    if lengths.numel() and int(lengths.max()) > seq_len:
        raise ValueError(f"seq_len={seq_len} is shorter than kv_act_seqs max {int(lengths.max())}")
    num_blocks, block_size = paged.shape[:2]
    _check_table(block_table, lengths, block_size, num_blocks)
    out = torch.empty((lengths.numel(), seq_len, *paged.shape[2:]), dtype=paged.dtype)
    if paged.dtype == torch.float8_e4m3fn:
        out.view(torch.uint8).fill_(_fill_value(fill, paged.dtype).view(torch.uint8))
    else:
        out.fill_(fill)
    b, t, block, row = token_slots(block_table, lengths, block_size)
    out[b, t] = paged[block, row]
    return out


def visible_lengths(kv_act_seqs: torch.Tensor | np.ndarray | Sequence[int], s1: int) -> torch.Tensor:
    """int64 [B, S1]: ``cur[b, i] = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` (SPEC §2.1), the tokens query
    position i of batch b sees. ``kv_act_seqs``: [B] ints (a CPU tensor, an array or a sequence). The one
    place the visible length is computed outside the loop oracle; ``.reshape(-1)`` orders it by output
    row ``b * S1 + i``."""
    lengths = kv_act_seqs.numpy() if isinstance(kv_act_seqs, torch.Tensor) else np.asarray(kv_act_seqs)
    behind_last = np.arange(s1 - 1, -1, -1)
    return torch.from_numpy(np.maximum(lengths.astype(np.int64)[:, None] - behind_last, 0))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TileLayout:
    """The golden's two layouts of one chunk of (batch, tile) pairs (golden/attention.py) and the maps
    between them: blocks [Q, N, R, BS] (block k is block ``in_tile[k]`` of pair ``owner[k]``) and tiles
    [P, N, R, tile] (``per_tile`` blocks each). The envelope's TileChunk takes the maps."""
    pairs: int
    nkv: int
    rows: int
    per_tile: int
    block_size: int
    owner: torch.Tensor
    in_tile: torch.Tensor

    def to_tiles(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """blocks [Q, N, R, BS] -> tiles [P, N, R, tile]; the blocks a tile lacks hold ``fill``."""
        if self.per_tile == 1:
            return x
        tiled = torch.full((self.pairs, self.nkv, x.shape[2], self.per_tile, self.block_size), fill, dtype=x.dtype)
        tiled[self.owner, :, :, self.in_tile] = x
        return tiled.view(self.pairs, self.nkv, x.shape[2], self.per_tile * self.block_size)

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """tiles [P, N, R, tile] -> blocks [Q, N, R, BS]."""
        if self.per_tile == 1:
            return x
        return x.view(self.pairs, self.nkv, self.rows, self.per_tile, self.block_size)[self.owner, :, :, self.in_tile]

    def per_tile_sum(self, x: torch.Tensor) -> torch.Tensor:
        """blocks [Q, ...] -> tiles [P, ...]: float64 sums (exact for MM2)."""
        if self.per_tile == 1:
            return x
        return torch.zeros((self.pairs,) + x.shape[1:], dtype=x.dtype).index_add_(0, self.owner, x)
