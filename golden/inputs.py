"""Reproducible input bundles for paged attention: a config that validates itself, and ``make_inputs``.

``make_inputs(config, seed)`` follows the upstream recipe (SPEC §5): values drawn in bfloat16, Q and K
quantized per token, V per channel over each batch's valid tokens, a shuffled block table, the
caches paged through it. What upstream never does, the config can ask for: ragged ``kv_act_seqs``,
spare blocks and table columns, other value distributions, and garbage in every cache cell the
kernel must not read.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from .attention import chunk_sizes
from .codec import FP8_MAX, SPEC_CODEC
from .errors import UsageError
from .paging import ceil_div, contiguous_to_paged, gen_block_table, paged_slots, positive_int
from .quant import channel_scales, quantize_per_token
from .validate import check_block_table, check_tile, group_size

__all__ = ["DISTRIBUTIONS", "GARBAGE", "PagedAttentionConfig", "InputBundle", "make_inputs", "memory_limit",
           "parse_byte_count", "check_size", "MAX_BYTES_ENV", "drawn_values", "pieces", "PIECE_VALUES", "SECOND_DRAW"]

#: Environment variable that sets the largest case, in bytes (see :func:`memory_limit`).
MAX_BYTES_ENV = "PFA_VERIFY_MAX_BYTES"

DISTRIBUTIONS = ("uniform", "normal", "outliers", "tiny", "wide", "constant_rows", "sinks", "outlier_channels",
                 "outlier_grid")
# Fill of unread cells: the value of the E4M3 code written in the caches (and in q of rows that see
# nothing, properties.rule.transforms.poison_unread), and the value written as their K (and q) scale. The one
# table of garbage fills: make_inputs and the laws' transformations both read it.
GARBAGE: dict[str | None, tuple[float, float]] = {
    None: (0.0, 0.0),
    "nan": (math.nan, math.nan),
    "huge": (FP8_MAX, 3.0e38),
    # Plausible but wrong: ordinary finite values, so a kernel that reads them is caught by the numbers,
    # not by a NaN (0.5 is an E4M3 value; 0.01 a usual K scale).
    "plausible": (0.5, 0.01),
}


def _table_rows(value: object) -> tuple[tuple[int, ...], ...]:
    """A block table given as rows of ints (tuples or lists), as a tuple of tuples; a TypeError otherwise."""
    if isinstance(value, (tuple, list)) and all(isinstance(row, (tuple, list)) for row in value):
        rows = tuple(tuple(row) for row in value)
        if all(isinstance(v, int) and not isinstance(v, bool) for row in rows for v in row):
            return rows
    raise TypeError(f"block_table must be rows of ints (a tuple of tuples, [B][MAXB]), got {value!r}"[:300])


@dataclass(frozen=True, kw_only=True)
class PagedAttentionConfig:
    """The shape and content of one paged-attention case (SPEC §1 names; validated on creation).

    s2 is the longest sequence the case holds (the contiguous tensors' length); ``kv_act_seqs``
    (default: every batch ``s2``) are the valid lengths. ``max_blocks`` defaults to
    ``ceil(s2 / block_size)`` and ``num_blocks`` to ``batch * max_blocks`` (upstream's NB);
    ``distribution`` is one of DISTRIBUTIONS (``tiny`` applies to Q and K; V stays uniform, see
    ``make_inputs``); ``garbage`` (a key of GARBAGE) fills every cache cell the kernel must not read.
    ``block_table`` (None: drawn by ``make_inputs`` from its seed) is an explicit table
    ``[batch][table_columns]`` of physical blocks in ``[0, physical_blocks)``, -1 for unused entries,
    each valid entry its own block (golden.validate.check_block_table): how a property test's drawn
    table, which Hypothesis can shrink, reaches the inputs.
    """

    batch: int
    s1: int
    s2: int
    nq: int
    nkv: int
    head_dim: int = 128
    block_size: int = 128
    s2_tile: int = 128
    g_tile: int | None = None
    kv_act_seqs: tuple[int, ...] | None = None
    max_blocks: int | None = None
    num_blocks: int | None = None
    softmax_scale: float | None = None
    distribution: str = "uniform"
    garbage: str | None = None
    block_table: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "s1", "s2", "nq", "nkv", "head_dim", "block_size"):
            positive_int(getattr(self, name), name)
        check_tile(self.s2_tile, self.g_tile, block_size=self.block_size, group=group_size(self.nq, self.nkv))
        if self.kv_act_seqs is not None:
            if isinstance(self.kv_act_seqs, list):
                object.__setattr__(self, "kv_act_seqs", tuple(self.kv_act_seqs))
            if not isinstance(self.kv_act_seqs, tuple) or len(self.kv_act_seqs) != self.batch:
                raise ValueError(f"kv_act_seqs must be a tuple of batch={self.batch} ints, got {self.kv_act_seqs!r}")
            for b, length in enumerate(self.kv_act_seqs):
                positive_int(length, f"kv_act_seqs[{b}]", minimum=0)
                if length > self.s2:
                    raise ValueError(f"kv_act_seqs[{b}]={length} must be <= s2={self.s2}")
        needed = ceil_div(self.s2, self.block_size)
        if self.max_blocks is not None and positive_int(self.max_blocks, "max_blocks") < needed:
            raise ValueError(f"max_blocks={self.max_blocks} must be >= ceil(s2 / block_size) = {needed}")
        if self.num_blocks is not None:
            total = sum(ceil_div(n, self.block_size) for n in self.lengths)
            if positive_int(self.num_blocks, "num_blocks") < total:
                raise ValueError(f"num_blocks={self.num_blocks} must be >= the {total} blocks kv_act_seqs needs")
        if self.softmax_scale is not None and (
            isinstance(self.softmax_scale, bool) or not isinstance(self.softmax_scale, (int, float))
            or not math.isfinite(self.softmax_scale) or self.softmax_scale <= 0
        ):  # the same values paged_attention_fp8 accepts
            raise ValueError(f"softmax_scale={self.softmax_scale!r} must be a finite positive float or None")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution={self.distribution!r} must be one of {DISTRIBUTIONS}")
        if self.garbage not in GARBAGE:
            raise ValueError(f"garbage={self.garbage!r} must be one of {tuple(GARBAGE)}")
        if self.block_table is not None:
            object.__setattr__(self, "block_table", _table_rows(self.block_table))
            check_block_table(self.block_table, self.lengths, block_size=self.block_size,
                              num_blocks=self.physical_blocks, shape=(self.batch, self.table_columns), unique=True)

    @property
    def lengths(self) -> tuple[int, ...]:
        """kv_act_seqs with the default (every batch s2) filled in."""
        return self.kv_act_seqs if self.kv_act_seqs is not None else (self.s2,) * self.batch

    @property
    def table_columns(self) -> int:
        return self.max_blocks if self.max_blocks is not None else ceil_div(self.s2, self.block_size)

    @property
    def physical_blocks(self) -> int:
        return self.num_blocks if self.num_blocks is not None else self.batch * self.table_columns

    def estimated_bytes(self) -> int:
        """Upper estimate of the memory one case needs: the largest of ``make_inputs``' peak, the checked
        call's (the bundle and its clones, the backend's working set: the loop golden's here), the
        golden's after it (the bundle, the golden's chunk and tile states) and the envelope's where every
        output row needs it (a kernel wrong everywhere; the rule builds it for the rows outside SPEC §4's
        tolerance only).

        Fitted to the peak resident size over an interpreter with torch and the project imported, of 27
        cases judged in-process, on the golden backend and on a backend whose every output is 0 (torch
        2.13 CPU, one thread; docs/performance.md has the table): every case under it.
        ``make_inputs`` holds three caches' codes at a time (both contiguous while the first is paged)
        and a piece's temporaries (golden.inputs.PIECE_VALUES), and the allocator keeps some of the
        pieces' freed memory while it runs (0.02-0.15 GiB, more or less from one run of a case to the
        next). The call holds the tensors twice. The golden's chunk takes some 80 bytes per score and 40
        per element of K it holds (golden.attention.chunk_sizes caps the K elements, scores and MM2
        products of one), and 20 per float of the tile states it folds at a time. The envelope keeps
        every tile's float64 bounds of every row, some 2.2 times over at its peak, and 400 bytes per
        score of its chunk. A supervised kernel's worker process holds its own copy of the tensors and
        its own working set besides.
        """
        d = self.head_dim
        kv = max(self.batch * self.s2, self.physical_blocks * self.block_size) * self.nkv * d
        cache = self.physical_blocks * self.block_size * self.nkv
        rows = self.batch * self.s1 * self.nq
        tensors = rows * (d + 4) + 2 * cache * d + 4 * cache + 4 * self.batch * (self.nkv * d + self.table_columns + 1)
        inputs = 3 * kv + 64 * min(kv, PIECE_VALUES + 16 * self.nkv * d) + (96 << 20)
        call = 2 * tensors + (48 << 20)
        group_rows = self.s1 * (self.nq // self.nkv)
        tile = self.s2_tile
        tiles = ceil_div(max(self.lengths, default=0), tile) or 1   # as the golden and the envelope count them
        pairs, window = chunk_sizes(batch=self.batch, nkv=self.nkv, rows=group_rows, head_dim=d,
                                    block_size=self.block_size, s2_tile=tile, tiles=tiles)
        pairs = min(pairs, self.batch * tiles)
        k_elements, scores = pairs * self.nkv * tile * d, pairs * self.nkv * group_rows * tile
        states = window * self.batch * self.nkv * group_rows * (d + 2)
        golden = tensors + 40 * k_elements + 80 * scores + 20 * states + (16 << 20)
        # The envelope, where every output row needs it (a kernel wrong everywhere): each row is a batch of
        # its own with S1 = 1, and the builder keeps every tile's float64 bounds, 2D + 6 of them per row
        # and tile (golden.envelope.builder), some 2.2 times over at the fold's peak (fitted).
        picked = self.batch * self.s1
        pairs, _ = chunk_sizes(batch=picked, nkv=self.nkv, rows=self.nq // self.nkv, head_dim=d,
                               block_size=self.block_size, s2_tile=tile, tiles=tiles)
        pairs = min(pairs, picked * tiles)
        bounds = picked * tiles * self.nq * (2 * d + 6) * 8
        envelope = (tensors + 2.2 * bounds + 96 * pairs * self.nkv * tile * d + 400 * pairs * self.nq * tile
                    + (32 << 20))
        return int(max(inputs, call, golden, envelope))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (kv_act_seqs and block_table as lists). ``block_table`` is left out when
        None, so the dict (and every fingerprint and regression id made from it) of a config without an
        explicit table does not depend on the field: captured ids stay valid."""
        data = asdict(self)
        if data["kv_act_seqs"] is not None:
            data["kv_act_seqs"] = list(data["kv_act_seqs"])
        if data["block_table"] is None:
            del data["block_table"]
        else:
            data["block_table"] = [list(row) for row in data["block_table"]]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PagedAttentionConfig:
        """The config of ``to_dict``'s output; unknown keys are a ValueError naming them."""
        if not isinstance(data, dict):
            raise TypeError(f"a config must be a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; expected a subset of {sorted(known)}")
        data = dict(data)
        if isinstance(data.get("kv_act_seqs"), list):
            data["kv_act_seqs"] = tuple(data["kv_act_seqs"])
        return cls(**data)      # __post_init__ turns a block_table of lists into tuples

    def replace(self, **changes: Any) -> PagedAttentionConfig:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class InputBundle:
    """Every argument of one ``paged_attention_fp8`` call, made by ``make_inputs(config, seed)``."""

    config: PagedAttentionConfig
    seed: int
    q: torch.Tensor
    q_scale: torch.Tensor
    k_cache: torch.Tensor
    k_scale: torch.Tensor
    v_cache: torch.Tensor
    v_scale: torch.Tensor
    block_table: torch.Tensor
    kv_act_seqs: torch.Tensor

    TENSORS = ("q", "q_scale", "k_cache", "k_scale", "v_cache", "v_scale", "block_table", "kv_act_seqs")

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.TENSORS}

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``paged_attention_fp8`` (tensors plus the config's scalars)."""
        return {**self.tensors(), "softmax_scale": self.config.softmax_scale,
                "s2_tile": self.config.s2_tile, "g_tile": self.config.g_tile}

    def clone(self) -> InputBundle:
        """A deep copy: the tensors are cloned, so a backend that writes to them cannot reach this one."""
        cloned: dict[str, Any] = {name: t.clone() for name, t in self.tensors().items()}
        return replace(self, **cloned)

    def replace(self, **changes: Any) -> InputBundle:
        return replace(self, **changes)


#: Distributions whose values take a second draw of the same shape besides the uniform one (_draw).
SECOND_DRAW = ("normal", "outliers", "wide")


def drawn_values(config: PagedAttentionConfig) -> int:
    """How many random values one draw of ``config``'s Q, K and V takes (a uniform draw each, and a second
    one of the same size for the distributions that take it): the yardstick of :func:`make_inputs`' speed.
    Made in pieces, it draws more: V's values twice (its maxima, then its codes) and, for the second
    draws, as many uniform values again to find where they start."""
    c = config
    return (c.batch * c.s1 * c.nq + 2 * c.batch * c.s2 * c.nkv) * c.head_dim * (2 if c.distribution in SECOND_DRAW else 1)


def _draw(shape: tuple[int, ...], distribution: str, generator: torch.Generator,
          second: torch.Generator | None = None) -> torch.Tensor:
    """bfloat16 values of ``distribution`` (upstream: uniform(-1, 1) in bf16). The second draw of
    SECOND_DRAW's distributions comes from ``second`` when given (a piece: :func:`_pieces_drawn`), else
    from ``generator`` after the uniform one."""
    uniform = torch.rand(shape, generator=generator).mul_(2).sub_(1)  # in place: the same two roundings
    second = generator if second is None else second
    if distribution == "uniform":
        x = uniform
    elif distribution == "normal":
        x = torch.randn(shape, generator=second)
    elif distribution == "outliers":  # a few values per row 100x the rest
        spikes = torch.rand(shape, generator=second) < 0.02
        x = torch.where(spikes, uniform * 100, uniform)
    elif distribution == "tiny":  # tiny raw magnitudes: quantization scales near 448 * 2^20
        x = uniform * 2.0 ** -20
    elif distribution == "wide":  # each value scaled by 2^U(-12, 12)
        x = uniform * torch.exp2(torch.randint(-12, 13, shape, generator=second).float())
    elif distribution == "constant_rows":  # every row one repeated value
        x = uniform[..., :1].expand(shape).clone()
    elif distribution in ("sinks", "outlier_channels", "outlier_grid"):  # uniform here; make_inputs adds the structure
        x = uniform
    else:  # pragma: no cover - PagedAttentionConfig validates the name
        raise ValueError(f"distribution={distribution!r}")
    # Zero would make a whole constant row unquantizable; nudge exact zeros to a tiny value (rare:
    # the copy is made only when there is one).
    if not x.numpy().all():                  # numpy's all(): one pass, no mask, several times torch's speed
        x = torch.where(x == 0, 2.0 ** -20, x)
    return x.bfloat16()


def _with_outlier_channels(x: torch.Tensor, c: PagedAttentionConfig) -> torch.Tensor:
    """``x`` (Q or a piece of K) with channels 0 and 1 at 32 and, on the grid, the rest rounded to 1/14."""
    x = x.float().clone()
    if c.distribution == "outlier_grid":
        # Nonzero: a zero would make no code and change nothing, but every row keeps its max at 32.
        x = torch.round(x * 14).clamp(-14, 14) / 14
    x[..., :2] = 32.0
    return x.bfloat16()


def _large_logit_queries(q: torch.Tensor, c: PagedAttentionConfig) -> torch.Tensor:
    """Q with the large logits of :func:`_large_logit_keys`' distributions (its outlier channels)."""
    return _with_outlier_channels(q, c) if c.distribution in ("outlier_channels", "outlier_grid") else q


def _large_logit_keys(k: torch.Tensor, q: torch.Tensor, position: torch.Tensor, c: PagedAttentionConfig) -> torch.Tensor:
    """Realistic rows with a few very large logits (|S| well past 88, where exp over- or underflows
    without the row max; SPEC §2.3), for the distributions that ask for them:

    - ``sinks``: the first token of every batch and KV head is an attention sink: its K row is
      ``64 * sign`` of the first query head of the group at the last position, so that head's score
      on it is about ``64 * sum|q| / sqrt(D)`` (about 32 * sqrt(D) for uniform q: 128 at D = 16);
    - ``outlier_channels``: channels 0 and 1 of every Q and K row hold 32, adding 2048 / sqrt(D) to
      every score (outlier features: 181 at D = 128);
    - ``outlier_grid``: the same outlier channels, with every other value a multiple of 1/14, so that
      ``x * 448 / 32`` is an integer of at most 14 and the E4M3 codes are integers: every partial sum of
      MM1 is an integer below 2**24 and exact in float32 in any order (SPEC §4.1 F1 cannot move S), so
      the acceptance envelope (SPEC §4.2) is as tight there as on uniform data.

    ``k`` is a piece of K's tokens [T, NKV, D] (the flat token index b * S2 + s of each in ``position``), ``q``
    the drawn Q (before :func:`_large_logit_queries`): elementwise and per token, so K is made the same
    whether it is made whole or in pieces.
    """
    if c.distribution == "sinks":
        k = k.float().clone()
        group = c.nq // c.nkv
        for u in (position % c.s2 == 0).nonzero().flatten().tolist():
            b = int(position[u]) // c.s2
            last = q[b * c.s1 + c.s1 - 1].float()                         # [NQ, D]
            for n in range(c.nkv):
                k[u, n] = 64.0 * torch.sign(last[n * group])
        return torch.where(k == 0, 64.0, k).bfloat16()
    return _with_outlier_channels(k, c) if c.distribution in ("outlier_channels", "outlier_grid") else k


#: Values of K or V made at a time, about: a piece holds a multiple of 16 tokens, and the last piece at
#: least 16, so that torch's CPU generator draws the pieces' values in the order of one draw of the whole
#: (measured for rand, randint and randn, whose vectorized Box-Muller works on 16 values at a time and
#: takes another path for a tensor of fewer). A piece's temporaries (float32 draws, bf16 values, the
#: scaled copy, the codes) take some 40 bytes a value.
PIECE_VALUES = 1 << 20


def pieces(c: PagedAttentionConfig) -> list[tuple[int, int]]:
    """The [u0, u1) ranges of flat tokens b * S2 + s that :func:`make_inputs` draws and quantizes K and V in."""
    tokens = c.batch * c.s2
    step = max(16, PIECE_VALUES // (c.nkv * c.head_dim) // 16 * 16)
    starts = list(range(0, tokens, step))
    if len(starts) > 1 and tokens - starts[-1] < 16:
        starts.pop()                                    # a short last piece joins the one before
    return [(u, starts[i + 1] if i + 1 < len(starts) else tokens) for i, u in enumerate(starts)]


def _second_start(c: PagedAttentionConfig, distribution: str, generator: torch.Generator) -> torch.Tensor | None:
    """The state a second generator starts the pieces' second draws from, where one draw of the whole
    would start its second draw: found by drawing (and dropping) as many uniform values, a piece at a
    time. None when there is no second draw or a single piece (it then comes from ``generator``)."""
    if distribution not in SECOND_DRAW or len(pieces(c)) == 1:
        return None
    second = torch.Generator()
    second.set_state(generator.get_state())
    scratch = torch.empty(PIECE_VALUES + 16 * c.nkv * c.head_dim)
    left = c.batch * c.s2 * c.nkv * c.head_dim
    while left:
        n = min(left, scratch.numel())
        torch.rand((n,), generator=second, out=scratch[:n])
        left -= n
    return second.get_state()


def _pieces_drawn(c: PagedAttentionConfig, distribution: str, generator: torch.Generator,
                  second_start: torch.Tensor | None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(u0, u1, values [u1 - u0, NKV, D]) for each of :func:`pieces`, the values of one draw of
    ``distribution`` over every token, made a piece at a time; ``generator`` is left where that one
    draw leaves it once the last piece is taken.

    One draw of the whole takes every uniform value, then (SECOND_DRAW) every value of the second draw.
    The pieces' second draws come from a second generator started at ``second_start``
    (:func:`_second_start`): no more memory than a piece, and about the time that one draw in float32
    took (B=1, S2=131072, NQ=96, NKV=8 on normal values: the inputs in 7.5 s, made whole 7.7 s).
    """
    second = None
    if second_start is not None:
        second = torch.Generator()
        second.set_state(second_start)
    for u0, u1 in pieces(c):
        yield u0, u1, _draw((u1 - u0, c.nkv, c.head_dim), distribution, generator, second)
    if second is not None:
        generator.set_state(second.get_state())


def _keys(q: torch.Tensor, c: PagedAttentionConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """K's codes [B*S2, NKV, D] and per-token dequant scales [B*S2, NKV, 1], drawn and quantized in pieces."""
    codes = torch.empty((c.batch * c.s2, c.nkv, c.head_dim), dtype=torch.float8_e4m3fn)
    scales = torch.empty((c.batch * c.s2, c.nkv, 1), dtype=torch.float32)
    for u0, u1, drawn in _pieces_drawn(c, c.distribution, generator, _second_start(c, c.distribution, generator)):
        k = _large_logit_keys(drawn, q, torch.arange(u0, u1), c)
        codes[u0:u1], scales[u0:u1] = quantize_per_token(k, name="k")
    return codes, scales


def _values(c: PagedAttentionConfig, lengths: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """V's codes [B*S2, NKV, D] and per-channel dequant scales [B, NKV, D], the max over each batch's
    valid tokens (SPEC §3). Made in pieces, in two passes over one stream of draws: the first takes the
    maxima, the second (the generator wound back) the codes; one piece is kept, not drawn again."""
    # "tiny" shrinks Q and K (logits vanish, attention is uniform) but not V: outputs of V's tiny
    # magnitude would sit under SPEC §4's atol of 1e-4, where any kernel output near 0 passes.
    distribution = "uniform" if c.distribution == "tiny" else c.distribution
    single = len(pieces(c)) == 1
    start = generator.get_state()
    second_start = _second_start(c, distribution, generator)     # found once, for both passes
    amax = torch.zeros((c.batch, c.nkv, c.head_dim), dtype=torch.float32)
    kept: torch.Tensor | None = None

    def valid_values(u0: int, u1: int, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        position = torch.arange(u0, u1)
        batch = position // c.s2
        valid = position % c.s2 < lengths.long()[batch]
        return v.to(torch.float32, copy=True).masked_fill_(~valid[:, None, None], 0.0), batch

    for u0, u1, v in _pieces_drawn(c, distribution, generator, second_start):
        vf, batch = valid_values(u0, u1, v)
        for b in range(u0 // c.s2, (u1 - 1) // c.s2 + 1):   # the batches of a piece (contiguous in b * S2 + s)
            torch.maximum(amax[b], vf[batch == b].abs().amax(dim=0), out=amax[b])
        kept = vf if single else None
    end = generator.get_state()
    scale, dequant = channel_scales(amax[:, None], dim=1, zero_rows="unit_scale", name="v")
    codes = torch.empty((c.batch * c.s2, c.nkv, c.head_dim), dtype=torch.float8_e4m3fn)
    if kept is not None:
        codes[:] = SPEC_CODEC.to_fp8(kept * scale[torch.arange(c.batch * c.s2) // c.s2, 0])
    else:
        generator.set_state(start)
        for u0, u1, v in _pieces_drawn(c, distribution, generator, second_start):
            vf, batch = valid_values(u0, u1, v)
            codes[u0:u1] = SPEC_CODEC.to_fp8(vf * scale[batch, 0])
    generator.set_state(end)
    return codes, dequant


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where there is none (another OS, another C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _release_freed_memory() -> None:
    """Hand the pieces' freed temporaries back to the system. glibc keeps freed heap memory resident, more
    or less from one case to the next, and the call and the golden that follow would stand on it:
    measured on four cases of 0.12-0.25 GiB of tensors, the checked call then peaks 12-13 MiB above its
    two copies of the tensors instead of 21-125 MiB."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def parse_byte_count(text: str, name: str) -> int:
    """``text`` as a positive number of bytes, an integer or ``8e9``; else a UsageError naming ``name``
    (the variable or option it came from), the value and what is expected."""
    try:
        value = int(float(text))
    except (ValueError, OverflowError):      # int(float("inf")) overflows
        raise UsageError(f"{name}={text!r}: expected a number of bytes such as 8e9") from None
    if value <= 0:
        raise UsageError(f"{name}={text!r}: expected a positive number of bytes such as 8e9")
    return value


def memory_limit() -> int:
    """The largest case in bytes (:meth:`PagedAttentionConfig.estimated_bytes`): ``$PFA_VERIFY_MAX_BYTES``,
    else half of this machine's physical memory (a case file is data and must not exhaust it)."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if text:
        return parse_byte_count(text, MAX_BYTES_ENV)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # not POSIX: a conservative 8 GB
        return 8 << 30


def _gb(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_size(config: PagedAttentionConfig, *, name: str | None = None, limit: int | None = None) -> int:
    """``config.estimated_bytes()`` after checking it against ``limit`` (default :func:`memory_limit`);
    over it, a ValueError naming the case, the estimate and the limit, before anything is allocated."""
    estimate = config.estimated_bytes()
    limit = memory_limit() if limit is None else limit
    if estimate > limit:
        c = config
        label = f"case {name!r}" if name else "the case"
        raise ValueError(
            f"{label} (B={c.batch} S1={c.s1} S2={c.s2} NQ={c.nq} NKV={c.nkv} D={c.head_dim}) needs about "
            f"{_gb(estimate)} to build and check, over the limit of {_gb(limit)}; raise the limit with "
            f"--max-bytes or {MAX_BYTES_ENV} if this machine can hold it")
    return estimate


def make_inputs(config: PagedAttentionConfig, seed: int) -> InputBundle:
    """The input bundle of ``config``: the same (config, seed) gives the same tensors, bit for bit.

    v_scale of a batch with no valid token is 1.0 (it has nothing to quantize; the kernel never
    reads it). Unread cache cells (spare blocks, the tail of each last block) hold the config's
    garbage fill, in the caches and in k_scale. A config over :func:`memory_limit` is a ValueError
    (:func:`check_size`), raised before any tensor is allocated.

    The block table is the config's ``block_table`` when it has one (checked when the config was
    made), else shuffled from the seed (``gen_block_table``, the generator's last draw): an explicit
    table changes the table and where the caches hold each token, never a value drawn.
    """
    if not isinstance(config, PagedAttentionConfig):
        raise TypeError(f"config must be a PagedAttentionConfig, got {type(config).__name__}")
    positive_int(seed, "seed", minimum=0)
    check_size(config)
    bundle = _made_inputs(config, seed)
    if len(pieces(config)) > 1:     # once every temporary of the pieces is freed
        _release_freed_memory()
    return bundle


def _made_inputs(config: PagedAttentionConfig, seed: int) -> InputBundle:
    """:func:`make_inputs` of a checked config and seed."""
    generator = torch.Generator().manual_seed(seed)
    c = config
    lengths = torch.tensor(c.lengths, dtype=torch.int32)
    q = _draw((c.batch * c.s1, c.nq, c.head_dim), c.distribution, generator)
    # K and V in pieces of tokens, in the order of one draw each: the inputs of a 128k-token case peak at
    # about their own size, not at the float32 copies of whole caches
    k8, k_scale = _keys(q, c, generator)
    v8, v_scale = _values(c, lengths, generator)
    q8, q_scale = quantize_per_token(_large_logit_queries(q, c), name="q")
    shape = (c.batch, c.s2, c.nkv)
    k8, k_scale, v8 = k8.view(*shape, c.head_dim), k_scale.view(*shape, 1), v8.view(*shape, c.head_dim)
    if c.block_table is not None:
        block_table = torch.tensor(c.block_table, dtype=torch.int32)
    else:
        block_table = gen_block_table(lengths, c.block_size, c.table_columns, num_blocks=c.physical_blocks,
                                      generator=generator)
    code_fill, scale_fill = GARBAGE[c.garbage]
    # The three caches share one table: its slots are worked out (and the table checked) once.
    slots = paged_slots(block_table, lengths, block_size=c.block_size, num_blocks=c.physical_blocks)

    def paged(x: torch.Tensor, fill: float) -> torch.Tensor:
        return contiguous_to_paged(x, block_table, lengths, block_size=c.block_size, num_blocks=c.physical_blocks,
                                   fill=fill, slots=slots)
    # Each contiguous cache is let go once it is paged: at most three caches' codes at a time
    k_cache = paged(k8, code_fill)
    del k8
    v_cache = paged(v8, code_fill)
    del v8
    return InputBundle(
        config=c, seed=seed, q=q8, q_scale=q_scale, k_cache=k_cache, k_scale=paged(k_scale, scale_fill),
        v_cache=v_cache, v_scale=v_scale.reshape(c.batch, c.nkv, c.head_dim).contiguous(),
        block_table=block_table, kv_act_seqs=lengths,
    )
