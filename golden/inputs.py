"""Reproducible input bundles for paged attention: a config that validates itself, and ``make_inputs``.

``make_inputs(config, seed)`` follows the upstream recipe (SPEC §5): values drawn in bfloat16, Q and K
quantized per token, V per channel over each batch's valid tokens, a shuffled block table, the
caches paged through it. What upstream never does, the config can ask for: ragged ``kv_act_seqs``,
spare blocks and table columns, other value distributions, and garbage in every cache cell the
kernel must not read.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from .paging import contiguous_to_paged, gen_block_table
from .quant import quantize_per_channel, quantize_per_token
from .validate import check_tile

__all__ = ["DISTRIBUTIONS", "GARBAGE", "PagedAttentionConfig", "InputBundle", "make_inputs"]

DISTRIBUTIONS = ("uniform", "normal", "outliers", "tiny", "wide", "constant_rows")
# Fill of unread cells: fp8 code value for the caches, and the value for k_scale.
GARBAGE: dict[str | None, tuple[float, float]] = {
    None: (0.0, 0.0),
    "nan": (math.nan, math.nan),
    "huge": (448.0, 3.0e38),
}


def _int(value: object, name: str, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class PagedAttentionConfig:
    """The shape and content of one paged-attention case (SPEC §1 names; validated on creation).

    s2 is the longest sequence the case holds (the contiguous tensors' length); ``kv_act_seqs``
    (default: every batch ``s2``) are the valid lengths. ``max_blocks`` defaults to
    ``ceil(s2 / block_size)`` and ``num_blocks`` to ``batch * max_blocks`` (upstream's NB);
    ``distribution`` is one of DISTRIBUTIONS; ``garbage`` (None, "nan", "huge") fills every cache
    cell the kernel must not read.
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

    def __post_init__(self) -> None:
        for name, minimum in (("batch", 1), ("s1", 1), ("s2", 1), ("nq", 1), ("nkv", 1), ("head_dim", 1), ("block_size", 1)):
            _int(getattr(self, name), name, minimum=minimum)
        if self.nq % self.nkv:
            raise ValueError(f"nq={self.nq} must be a multiple of nkv={self.nkv}")
        check_tile(self.s2_tile, self.g_tile, block_size=self.block_size, group=self.nq // self.nkv)
        if self.kv_act_seqs is not None:
            if isinstance(self.kv_act_seqs, list):
                object.__setattr__(self, "kv_act_seqs", tuple(self.kv_act_seqs))
            if not isinstance(self.kv_act_seqs, tuple) or len(self.kv_act_seqs) != self.batch:
                raise ValueError(f"kv_act_seqs must be a tuple of batch={self.batch} ints, got {self.kv_act_seqs!r}")
            for b, length in enumerate(self.kv_act_seqs):
                _int(length, f"kv_act_seqs[{b}]", minimum=0)
                if length > self.s2:
                    raise ValueError(f"kv_act_seqs[{b}]={length} must be <= s2={self.s2}")
        needed = -(-self.s2 // self.block_size)
        if self.max_blocks is not None and _int(self.max_blocks, "max_blocks", minimum=1) < needed:
            raise ValueError(f"max_blocks={self.max_blocks} must be >= ceil(s2 / block_size) = {needed}")
        if self.num_blocks is not None:
            total = sum(-(-n // self.block_size) for n in self.lengths)
            if _int(self.num_blocks, "num_blocks", minimum=1) < total:
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

    @property
    def lengths(self) -> tuple[int, ...]:
        """kv_act_seqs with the default (every batch s2) filled in."""
        return self.kv_act_seqs if self.kv_act_seqs is not None else (self.s2,) * self.batch

    @property
    def table_columns(self) -> int:
        return self.max_blocks if self.max_blocks is not None else -(-self.s2 // self.block_size)

    @property
    def physical_blocks(self) -> int:
        return self.num_blocks if self.num_blocks is not None else self.batch * self.table_columns

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (kv_act_seqs as a list)."""
        data = asdict(self)
        if data["kv_act_seqs"] is not None:
            data["kv_act_seqs"] = list(data["kv_act_seqs"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PagedAttentionConfig":
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
        return cls(**data)

    def replace(self, **changes: Any) -> "PagedAttentionConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
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

    def clone(self) -> "InputBundle":
        """A deep copy: the tensors are cloned, so a backend that writes to them cannot reach this one."""
        return replace(self, **{name: t.clone() for name, t in self.tensors().items()})

    def replace(self, **changes: Any) -> "InputBundle":
        return replace(self, **changes)


def _draw(shape: tuple[int, ...], distribution: str, generator: torch.Generator) -> torch.Tensor:
    """bfloat16 values of ``distribution`` (upstream: uniform(-1, 1) in bf16)."""
    uniform = torch.rand(shape, generator=generator) * 2 - 1
    if distribution == "uniform":
        x = uniform
    elif distribution == "normal":
        x = torch.randn(shape, generator=generator)
    elif distribution == "outliers":  # a few values per row 100x the rest
        spikes = torch.rand(shape, generator=generator) < 0.02
        x = torch.where(spikes, uniform * 100, uniform)
    elif distribution == "tiny":  # near E4M3's subnormal range once scaled? no: tiny raw magnitudes
        x = uniform * 2.0 ** -20
    elif distribution == "wide":  # each value scaled by 2^U(-12, 12)
        x = uniform * torch.exp2(torch.randint(-12, 13, shape, generator=generator).float())
    elif distribution == "constant_rows":  # every row one repeated value
        x = uniform[..., :1].expand(shape).clone()
    else:  # pragma: no cover - PagedAttentionConfig validates the name
        raise ValueError(f"distribution={distribution!r}")
    # Zero would make a whole constant row unquantizable; nudge exact zeros to a tiny value.
    x = torch.where(x == 0, 2.0 ** -20, x)
    return x.bfloat16()


def make_inputs(config: PagedAttentionConfig, seed: int) -> InputBundle:
    """The input bundle of ``config``: the same (config, seed) gives the same tensors, bit for bit.

    v_scale of a batch with no valid token is 1.0 (it has nothing to quantize; the kernel never
    reads it). Unread cache cells (spare blocks, the tail of each last block) hold the config's
    garbage fill, in the caches and in k_scale.
    """
    if not isinstance(config, PagedAttentionConfig):
        raise TypeError(f"config must be a PagedAttentionConfig, got {type(config).__name__}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    generator = torch.Generator().manual_seed(seed)
    c = config
    lengths = torch.tensor(c.lengths, dtype=torch.int32)
    q = _draw((c.batch * c.s1, c.nq, c.head_dim), c.distribution, generator)
    k = _draw((c.batch, c.s2, c.nkv, c.head_dim), c.distribution, generator)
    v = _draw((c.batch, c.s2, c.nkv, c.head_dim), c.distribution, generator)
    q8, q_scale = quantize_per_token(q, name="q")
    k8, k_scale = quantize_per_token(k, name="k")
    valid = (torch.arange(c.s2)[None, :] < lengths[:, None].long())[:, :, None, None]
    v8, v_scale = quantize_per_channel(v, 1, valid=valid, zero_rows="unit_scale", name="v")
    block_table = gen_block_table(lengths, c.block_size, c.table_columns, num_blocks=c.physical_blocks, generator=generator)
    code_fill, scale_fill = GARBAGE[c.garbage]
    page = {"block_table": block_table, "kv_act_seqs": lengths, "block_size": c.block_size, "num_blocks": c.physical_blocks}
    return InputBundle(
        config=c, seed=seed, q=q8, q_scale=q_scale,
        k_cache=contiguous_to_paged(k8, fill=code_fill, **page),
        k_scale=contiguous_to_paged(k_scale, fill=scale_fill, **page),
        v_cache=contiguous_to_paged(v8, fill=code_fill, **page),
        v_scale=v_scale.view(c.batch, c.nkv, c.head_dim).contiguous(),
        block_table=block_table, kv_act_seqs=lengths,
    )
