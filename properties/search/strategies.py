"""Hypothesis strategies for FP8 paged attention (SPEC §1-§3) and AT-12 (SPEC §6).

They compose bottom-up, each taking values or strategies for what it builds on:

    dims()  ->  kv_act_seqs(batch, ...)  ->  block_tables(lengths, ...)  ->  configs()  ->  cases()
                                                                   cases_for(backend): the one narrowing

:func:`cases_for` is the one way to draw cases for a backend: its ``supported_shapes`` narrow what is
drawn and its own ``skip_reason`` guards what is left (nothing here knows a kernel's limits).

Every public function validates its arguments when called (not on every draw) and raises a TypeError
(not an int: golden.paging.positive_int) or a ValueError naming the argument, the value and what was
expected. Multi-value draws are frozen dataclasses with readable reprs. One size knob bounds every
example so one stays cheap on a CPU: ``PFA_VERIFY_MAX_LEN`` (default 640 tokens), the largest
``kv_act_seqs`` entry drawn, read by :func:`max_len` when a strategy is built (so a bad value is a
UsageError there, never a crash of ``import properties.search.strategies``).

Shrinking: lengths shrink towards 0 and then towards the special values below, dimensions towards
their smallest allowed value, block tables towards the identity layout (then fewer columns and spare
blocks), the distribution towards ``uniform``, garbage towards none, seeds to 0. The table is drawn
here, not by ``golden.make_inputs`` from its seed, and travels in the config (``block_table``), so a
failure that depends on the layout shrinks to the table that explains it. A case always has at least
one token to attend to (every length 0 is the catalog's ``edge_all_batches_empty``, not something to
draw again and again).
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pfa_verify import golden
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.paging import blocks_needed, positive_int
from pfa_verify.kernels import Skip
from pfa_verify.kernels.backends import unsupported_shape
from pfa_verify.properties.rule.case import Case

__all__ = ["MAX_LEN_ENV", "MAX_LEN_LIMIT", "max_len", "DISTRIBUTIONS", "GARBAGE", "CUSTOM_SOFTMAX_SCALES",
           "SOFTMAX_SCALES", "Dims", "BlockTable", "dims", "kv_act_seqs",
           "special_lengths", "block_tables", "configs", "cases", "cases_for", "seeds", "quant_rows",
           "At12Case", "at12_cases"]

MAX_LEN_ENV = "PFA_VERIFY_MAX_LEN"
# GLM-4.5's context window (128K tokens): no generated row needs to be longer than the model can attend.
MAX_LEN_LIMIT = 131_072


def max_len() -> int:
    """``$PFA_VERIFY_MAX_LEN`` (default 640): the longest ``kv_act_seqs`` entry drawn, an integer in
    [1, MAX_LEN_LIMIT]; anything else is a :class:`golden.errors.UsageError` naming the variable."""
    text = os.environ.get(MAX_LEN_ENV, "").strip()
    if not text:
        return 640
    value = int(text) if text.isdecimal() else 0
    if not 1 <= value <= MAX_LEN_LIMIT:
        raise UsageError(f"{MAX_LEN_ENV}={text!r}: expected a whole number of tokens from 1 to {MAX_LEN_LIMIT} "
                         "(default 640)")
    return value


# Value distributions and garbage fills of golden.make_inputs; the first of each is the shrink target.
DISTRIBUTIONS = golden.DISTRIBUTIONS
GARBAGE = tuple(golden.GARBAGE)  # None first: the shrink target
#: The softmax_scale values a drawn case may carry besides None, the default 1 / sqrt(D) (SPEC §1): none a
#: power of two, so that S * softmax_scale rounds (a kernel that folds it into a dequant factor rounds
#: differently); few, because a compiled kernel (the sim's, a 950's) compiles once per scale.
CUSTOM_SOFTMAX_SCALES = (0.05, 0.1, 0.3)
#: None (the default) first, the shrink target, and on three draws of four.
SOFTMAX_SCALES: tuple[float | None, ...] = (None,) * 9 + CUSTOM_SOFTMAX_SCALES

_T = TypeVar("_T")
#: An argument that is a value or a strategy of values (resolved once: :func:`_strategy`, :func:`_choices`).
IntOrStrategy: TypeAlias = int | st.SearchStrategy[int]
#: A backend's skip_reason: golden.PagedAttentionConfig -> kernels.Skip or None.
SkipReason: TypeAlias = Callable[[golden.PagedAttentionConfig], Skip | None]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _strategy(value: IntOrStrategy, name: str, *, minimum: int | None = None) -> st.SearchStrategy[int]:
    """An int or a strategy, resolved once: a concrete int is checked (golden.paging.positive_int, at least
    ``minimum``; None: any int) and wrapped in just()."""
    if isinstance(value, st.SearchStrategy):
        return value
    return st.just(positive_int(value, name, minimum=-math.inf if minimum is None else minimum))


def _choices(value: _T | Sequence[_T] | st.SearchStrategy[_T], name: str,
             allowed: Sequence[_T] | None = None) -> st.SearchStrategy[_T]:
    """A strategy, or a non-empty sequence to sample from (in order: the first is the shrink target)."""
    if isinstance(value, st.SearchStrategy):
        return value
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    _check(len(values) > 0, f"{name}={value!r} must not be empty")
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        _check(not bad, f"{name}={value!r}: {bad} not in {allowed}")
    return st.sampled_from(values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dims:
    """Static shape and tile choices of one call (SPEC §1)."""
    batch: int
    s1: int
    nq: int
    nkv: int
    head_dim: int
    block_size: int
    s2_tile: int
    g_tile: int | None  # None: the whole group, as upstream

    @property
    def group(self) -> int:
        return self.nq // self.nkv


def dims(*, batch: IntOrStrategy = st.integers(1, 4), s1: IntOrStrategy = st.integers(1, 3),
         nkv: IntOrStrategy = st.integers(1, 2), group: IntOrStrategy = st.sampled_from((1, 2, 4, 3)),
         head_dim: int | Sequence[int] | st.SearchStrategy[int] = (16, 32, 64, 128),
         block_size: int | Sequence[int] | st.SearchStrategy[int] = (16, 32, 64, 128),
         s2_tile_blocks: IntOrStrategy = st.integers(1, 4),
         split_group: bool = True, whole_group: bool = True) -> st.SearchStrategy[Dims]:
    """Shapes and tiles: ``nq = nkv * group``, ``s2_tile = block_size * s2_tile_blocks``,
    ``g_tile`` None (whole group) or, when ``split_group``, a proper divisor of the group (only a
    divisor when ``whole_group`` is False and the group has one: a split group for sure).

    ``head_dim`` and ``block_size`` are a strategy or a sequence of choices (first = shrink target);
    the others are an int or a strategy. Defaults keep one example to a few thousand tokens at most.
    """
    b, s, n, g = (_strategy(v, k, minimum=1) for k, v in
                  (("batch", batch), ("s1", s1), ("nkv", nkv), ("group", group)))
    d = _choices(head_dim, "head_dim")
    bs = _choices(block_size, "block_size")
    tb = _strategy(s2_tile_blocks, "s2_tile_blocks", minimum=1)

    def build(t: tuple[int, int, int, int, int, int, int]) -> st.SearchStrategy[Dims]:
        batch_, s1_, nkv_, group_, d_, bs_, tb_ = t
        divisors: list[int | None] = [x for x in range(1, group_) if group_ % x == 0]
        choices = ([None] if whole_group or not divisors else []) + divisors
        g_tiles = st.sampled_from(choices) if split_group else st.just(None)
        return g_tiles.map(lambda gt: Dims(batch=batch_, s1=s1_, nq=nkv_ * group_, nkv=nkv_, head_dim=d_,
                                           block_size=bs_, s2_tile=bs_ * tb_, g_tile=gt))

    return st.tuples(b, s, n, g, d, bs, tb).flatmap(build)


def special_lengths(*, block_size: int, s2_tile: int, capacity: int) -> tuple[int, ...]:
    """The lengths paged kernels get wrong: 0, 1, block and tile boundaries +-1, the row capacity."""
    points = {0, 1, block_size - 1, block_size, block_size + 1, s2_tile - 1, s2_tile, s2_tile + 1,
              2 * s2_tile, 2 * s2_tile + 1, capacity - 1, capacity}
    return tuple(sorted(p for p in points if 0 <= p <= capacity))


def kv_act_seqs(batch: IntOrStrategy, *, block_size: int, s2_tile: int, capacity: int | None = None,
                allow_all_empty: bool = False) -> st.SearchStrategy[tuple[int, ...]]:
    """Ragged per-batch lengths ``0 <= kv_act_seqs[b] <= capacity`` (a tuple of ``batch`` ints).

    Each length is one of :func:`special_lengths`, a block boundary k * BS - 1, k * BS or k * BS + 1
    anywhere up to the capacity, or uniform in [0, capacity]; capacity
    defaults to :func:`max_len` rounded down to whole blocks (the row capacity of the table). At least
    one length is positive unless ``allow_all_empty`` (an all-empty call only checks zeros).
    """
    positive_int(block_size, "block_size")
    _check(positive_int(s2_tile, "s2_tile") % block_size == 0,
           f"s2_tile={s2_tile!r} must be a positive multiple of block_size={block_size}")
    if capacity is None:
        capacity = max(block_size, max_len() // block_size * block_size)
    positive_int(capacity, "capacity", minimum=0)
    # Every block (and so every tile) boundary, not only the first ones: k * BS - 1, k * BS, k * BS + 1.
    boundaries = st.integers(0, capacity // block_size).flatmap(
        lambda k: st.sampled_from([n for n in (k * block_size, k * block_size - 1, k * block_size + 1) if 0 <= n <= capacity]))
    one = st.one_of(st.integers(0, capacity),
                    st.sampled_from(special_lengths(block_size=block_size, s2_tile=s2_tile, capacity=capacity)),
                    boundaries)
    lists = _strategy(batch, "batch", minimum=1).flatmap(
        lambda n: st.lists(one, min_size=n, max_size=n).map(tuple))
    return lists if allow_all_empty or capacity == 0 else lists.filter(lambda lengths: max(lengths) > 0)


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """A paged layout: ``table[b][j]`` is the physical block of logical block j, -1 when unused."""
    kv_act_seqs: tuple[int, ...]
    block_size: int
    num_blocks: int
    table: tuple[tuple[int, ...], ...]

    @property
    def max_blocks(self) -> int:
        return len(self.table[0]) if self.table else 0


def block_tables(lengths: Sequence[int] | st.SearchStrategy[tuple[int, ...]], *, block_size: int,
                 extra_columns: IntOrStrategy = st.integers(0, 2),
                 spare_blocks: IntOrStrategy = st.integers(0, 3)) -> st.SearchStrategy[BlockTable]:
    """Shuffled block tables for ``lengths`` (a tuple of ints or a strategy of them): unique physical
    blocks for every valid logical block, -1 after each row's valid blocks and in the ``extra_columns``
    past the widest row, and ``spare_blocks`` physical blocks that no row owns.

    The layout is a permutation of the physical blocks dealt out row by row, so it shrinks towards the
    identity layout (row 0 owns blocks 0, 1, ..., row 1 the next ones), then towards fewer columns and
    spare blocks. :func:`configs` draws its tables here."""
    lens = lengths if isinstance(lengths, st.SearchStrategy) else st.just(_lengths(lengths))
    positive_int(block_size, "block_size")
    extra = _strategy(extra_columns, "extra_columns", minimum=0)
    spare = _strategy(spare_blocks, "spare_blocks", minimum=0)

    def build(t: tuple[tuple[int, ...], int, int]) -> st.SearchStrategy[BlockTable]:
        lens_, extra_, spare_ = t
        need: list[int] = blocks_needed(lens_, block_size).tolist()
        width = max(need + [1]) + extra_
        nb = max(1, sum(need) + spare_)

        def lay(perm: list[int]) -> BlockTable:
            rows: list[tuple[int, ...]] = []
            k = 0
            for n in need:
                rows.append(tuple(perm[k:k + n]) + (-1,) * (width - n))
                k += n
            return BlockTable(kv_act_seqs=tuple(lens_), block_size=block_size, num_blocks=nb, table=tuple(rows))
        return st.permutations(range(nb)).map(lay)

    return st.tuples(lens, extra, spare).flatmap(build)


def _lengths(value: object) -> tuple[int, ...]:
    """A tuple of lengths (ints >= 0), checked."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"lengths={value!r} must be a tuple of ints or a strategy")
    return tuple(positive_int(n, f"lengths[{b}]", minimum=0) for b, n in enumerate(value))


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


def configs(*, dims: st.SearchStrategy[Dims] | None = None,
            distribution: str | Sequence[str] | st.SearchStrategy[str] = DISTRIBUTIONS,
            garbage: str | Sequence[str | None] | st.SearchStrategy[str | None] | None = GARBAGE,
            extra_columns: IntOrStrategy = st.integers(0, 2), spare_blocks: IntOrStrategy = st.integers(0, 3),
            capacity: int | None = None,
            softmax_scale: float | Sequence[float | None] | st.SearchStrategy[float | None] | None = SOFTMAX_SCALES,
            ) -> st.SearchStrategy[golden.PagedAttentionConfig]:
    """``golden.PagedAttentionConfig`` drawn from :func:`dims`, :func:`kv_act_seqs` and :func:`block_tables`
    (the drawn table is the config's ``block_table``; ``max_blocks`` = widest row + extra columns,
    ``num_blocks`` = blocks needed + spare blocks), a value ``distribution``, a ``garbage`` fill for
    every unread cell and a ``softmax_scale`` (None: the default, 1 / sqrt(D); by default one of
    :data:`CUSTOM_SOFTMAX_SCALES` on a quarter of the draws). ``distribution`` values must be listed in
    ``golden.inputs.DISTRIBUTIONS``.
    """
    dims_s = globals()["dims"]() if dims is None else dims
    dist = _choices(distribution, "distribution", allowed=DISTRIBUTIONS)
    garb = _choices(garbage, "garbage", allowed=GARBAGE) if not isinstance(garbage, st.SearchStrategy) else garbage
    extra = _strategy(extra_columns, "extra_columns", minimum=0)
    spare = _strategy(spare_blocks, "spare_blocks", minimum=0)
    if not isinstance(softmax_scale, st.SearchStrategy):
        listed = softmax_scale if isinstance(softmax_scale, (tuple, list)) else (softmax_scale,)
        bad = [v for v in listed if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                       or not math.isfinite(v) or v <= 0)]
        _check(not bad, f"softmax_scale={softmax_scale!r}: {bad} are not finite positive floats (or None: the default)")
    scale = _choices(softmax_scale, "softmax_scale")
    if capacity is not None:
        positive_int(capacity, "capacity", minimum=0)

    def build(dm: Dims) -> st.SearchStrategy[golden.PagedAttentionConfig]:
        def make(t: tuple[BlockTable, str, str | None, float | None]) -> golden.PagedAttentionConfig:
            table, dist_, garb_, scale_ = t
            lens = table.kv_act_seqs
            return golden.PagedAttentionConfig(
                batch=dm.batch, s1=dm.s1, s2=max(lens + (1,)), nq=dm.nq, nkv=dm.nkv,
                head_dim=dm.head_dim, block_size=dm.block_size, s2_tile=dm.s2_tile, g_tile=dm.g_tile,
                kv_act_seqs=lens, max_blocks=table.max_blocks, num_blocks=table.num_blocks,
                distribution=dist_, garbage=garb_, block_table=table.table, softmax_scale=scale_)
        lens_s = kv_act_seqs(dm.batch, block_size=dm.block_size, s2_tile=dm.s2_tile, capacity=capacity)
        tables = block_tables(lens_s, block_size=dm.block_size, extra_columns=extra, spare_blocks=spare)
        return st.tuples(tables, dist, garb, scale).map(make)

    return dims_s.flatmap(build)


def _narrowing(backend: object) -> tuple[dict[str, Any] | None, SkipReason | None]:
    """(supported_shapes or None, skip_reason or None) of ``backend``: a backend object, a
    ``supported_shapes`` dict (a kernel built for those shapes: the base backend's rule,
    kernels.backends.unsupported_shape), or None (any shape)."""
    if backend is None:
        return None, None
    if isinstance(backend, dict):
        shapes: dict[str, Any] = backend
        return shapes, lambda config: unsupported_shape(config, shapes)
    supported: dict[str, Any] | None = getattr(backend, "supported_shapes", None)
    skip_reason: SkipReason | None = getattr(backend, "skip_reason", None)
    if skip_reason is None and supported:
        declared = supported
        return supported, lambda config: unsupported_shape(config, declared)
    return supported, skip_reason


def _runs(skip_reason: SkipReason, case: Case) -> bool:
    """Whether the backend runs ``case`` on its kernel: no ``unsupported`` skip (a skip of another kind,
    over a time limit or a budget, is the run's to report, never the strategy's to hide)."""
    skip = skip_reason(case.config)
    return skip is None or getattr(skip, "kind", None) != "unsupported"


def cases_for(backend: object = None, *, distribution: str | Sequence[str] | st.SearchStrategy[str] = DISTRIBUTIONS,
              garbage: str | Sequence[str | None] | st.SearchStrategy[str | None] | None = GARBAGE,
              extra_columns: IntOrStrategy = st.integers(0, 2), spare_blocks: IntOrStrategy = st.integers(0, 3),
              capacity: int | None = None, seed: IntOrStrategy | None = None,
              softmax_scale: float | Sequence[float | None] | st.SearchStrategy[float | None] | None = SOFTMAX_SCALES,
              **dims_kwargs: Any) -> st.SearchStrategy[Case]:
    """:class:`~properties.rule.case.Case` values ``backend`` runs: the one narrowing path.

    * ``backend`` -- a backend (``kernels.get_backend``), a ``supported_shapes`` dict, or None (any shape).
      Its ``supported_shapes`` narrow head_dim and block_size to what its kernel is built for (and s2_tile
      to 1 or 2 blocks: kernel-sized), so nothing is drawn and rejected; its ``skip_reason`` then guards
      what is left (a case it calls ``unsupported`` is never drawn). Nothing here knows a kernel's limits.
    * ``dims_kwargs`` narrow :func:`dims` further, to a law's domain (``group=st.sampled_from((2, 4))``
      for GQA, ``s1=st.integers(2, 3)`` for causal positions).
    * ``distribution``, ``garbage``, ``extra_columns``, ``spare_blocks`` (at least 1 guarantees cells
      nothing reads), ``capacity`` and ``softmax_scale`` as in :func:`configs`; ``seed`` as in :func:`cases`.
    """
    supported, skip_reason = _narrowing(backend)
    if supported:
        dims_kwargs = dict(dims_kwargs)
        for key in ("head_dim", "block_size"):
            if key in supported:
                dims_kwargs.setdefault(key, tuple(supported[key]))
        dims_kwargs.setdefault("s2_tile_blocks", st.integers(1, 2))
    strategy = cases(configs(dims=dims(**dims_kwargs), distribution=distribution, garbage=garbage,
                             extra_columns=extra_columns, spare_blocks=spare_blocks, capacity=capacity,
                             softmax_scale=softmax_scale), seed=seed)
    if skip_reason is None:
        return strategy
    return strategy.filter(lambda case: _runs(skip_reason, case))


def cases(config_strategy: st.SearchStrategy[golden.PagedAttentionConfig] | None = None, *,
          seed: IntOrStrategy | None = None) -> st.SearchStrategy[Case]:
    """:class:`~properties.rule.case.Case` values: a config and a seed for ``golden.make_inputs``."""
    cfg = configs() if config_strategy is None else config_strategy
    sd = seeds() if seed is None else _strategy(seed, "seed", minimum=0)
    return st.tuples(cfg, sd).map(lambda t: Case(*t))  # map, not builds: failures print Case's repr


def quant_rows(*, rows: IntOrStrategy = st.integers(1, 4), cols: IntOrStrategy = st.integers(1, 32),
               magnitude: IntOrStrategy = st.integers(-30, 30)) -> st.SearchStrategy[np.ndarray]:
    """float32 numpy arrays ``[rows, cols]`` with no all-zero row, values ``u * 2**magnitude`` for u
    in [-1, 1] (one magnitude per row, so tiny and huge rows both occur). Rows whose max|x| is below
    2**-110 are left out: 448 / max|x| overflows float32 there, a case SPEC §3 does not decide
    (open question for the golden: it yields a dequant scale of 0)."""
    r = _strategy(rows, "rows", minimum=1)
    c = _strategy(cols, "cols", minimum=1)
    mag = _strategy(magnitude, "magnitude")

    def build(t: tuple[int, int]) -> st.SearchStrategy[np.ndarray]:
        r_, c_ = t
        base = hnp.arrays(np.float32, (r_, c_), elements=st.floats(-1, 1, width=32))
        exps = st.lists(mag, min_size=r_, max_size=r_)
        return st.tuples(base, exps).map(
            lambda be: (be[0] * np.exp2(np.array(be[1], dtype=np.float32))[:, None]).astype(np.float32)
        ).filter(lambda x: bool((np.abs(x).max(axis=1) >= 2.0 ** -110).all()))

    return st.tuples(r, c).flatmap(build)


@dataclasses.dataclass(frozen=True)
class At12Case:
    """An AT-12 call (SPEC §6): tile shapes, head_dim, input distribution and a seed."""
    q_tile: int
    k_tile: int
    head_dim: int
    distribution: str
    seed: int

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, k) as bf16 tensors ``[q_tile, head_dim]``, ``[k_tile, head_dim]``."""
        g = torch.Generator().manual_seed(self.seed)
        shape_q, shape_k = (self.q_tile, self.head_dim), (self.k_tile, self.head_dim)
        if self.distribution == "normal":
            q, k = torch.randn(shape_q, generator=g), torch.randn(shape_k, generator=g)
        else:
            q, k = torch.rand(shape_q, generator=g) * 2 - 1, torch.rand(shape_k, generator=g) * 2 - 1
            if self.distribution == "wide":
                q = q * torch.exp2(torch.randint(-12, 12, (self.q_tile, 1), generator=g).float())
                k = k * torch.exp2(torch.randint(-12, 12, (self.k_tile, 1), generator=g).float())
        return q.to(torch.bfloat16), k.to(torch.bfloat16)


def at12_cases(*, q_tile: IntOrStrategy = st.integers(1, 64), k_tile: IntOrStrategy = st.integers(1, 300),
               head_dim: int | Sequence[int] | st.SearchStrategy[int] = (16, 64, 128),
               distribution: str | Sequence[str] | st.SearchStrategy[str] = ("uniform", "normal", "wide"),
               ) -> st.SearchStrategy[At12Case]:
    """AT-12 calls, including tail tiles whose length is not a multiple of anything (k_tile 1..300)."""
    return st.builds(At12Case, _strategy(q_tile, "q_tile", minimum=1), _strategy(k_tile, "k_tile", minimum=1),
                     _choices(head_dim, "head_dim"), _choices(distribution, "distribution"), seeds())
