"""Static configuration of our PyPTO kernels: dims, tiles and pass options (SPEC §1, §5).

Plain data, importable without pypto: backends build a `PagedAttentionKernelConfig` from the golden's
validated dims and hand it to the kernel as its one non-tensor argument (its repr is part of pypto's
compile-cache key, so every field is a plain int, float or tuple).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pfa_verify.golden.paging import positive_int
from pfa_verify.golden.validate import PagedAttentionDims

__all__ = [
    "KERNEL_SHAPES",
    "CubeTile",
    "PagedAttentionKernelConfig",
    "softmax_tile",
    "UPSTREAM_PASS_OPTIONS",
    "UPSTREAM_RUNTIME_OPTIONS",
]

#: What our PyPTO kernel is built for (SPEC §5: D = 128, BS = 128 upstream): its tiles and views are
#: laid out for these, and a backend running it answers Skip("unsupported") for anything else.
KERNEL_SHAPES = {"head_dim": (128,), "block_size": (128,)}

#: The upstream kernel's jit options, as the seed article on the FP8 kernel quotes them
#: (shared/seeds/003_*.txt, "性能优化选项"): Q stays in L1 for 8 matmuls, four-deep vector and cube
#: buffering, at most 512 stitched functions, device scheduling mode 0.
UPSTREAM_PASS_OPTIONS = {
    "cube_l1_reuse_setting": {-1: 8},
    "vec_nbuffer_setting": {-1: 4},
    "cube_nbuffer_setting": {-1: 4},
}
UPSTREAM_RUNTIME_OPTIONS = {"stitch_function_max_num": 512, "device_sched_mode": 0}

#: One cube stage's tiles: ((m_l0, m_l1), (k_l0, k_l1), (n_l0, n_l1)), SPEC §1.
CubeTile = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
_UPSTREAM_CUBE: CubeTile = ((128, 128), (128, 128), (128, 128))


def _check_cube(name: str, tile: Any) -> CubeTile:
    """``tile`` (a user's value: anything) as three int pairs, or the TypeError / ValueError naming it."""
    try:
        pairs = tuple((int(a), int(b)) for a, b in tile)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={tile!r} must be three [L0, L1] pairs") from None
    if len(pairs) != 3:
        raise ValueError(f"{name}={tile!r} must be three [L0, L1] pairs (m, k, n), got {len(pairs)}")
    for l0, l1 in pairs:
        if not (0 < l0 <= l1 and l1 % l0 == 0):
            raise ValueError(f"{name}={tile!r}: each pair needs 0 < L0 <= L1 and L1 % L0 == 0 (SPEC §1)")
    return pairs[0], pairs[1], pairs[2]


@dataclass(frozen=True, kw_only=True)
class PagedAttentionKernelConfig:
    """Everything static about one compiled FP8 paged-attention kernel.

    - s1, nq, nkv, head_dim, block_size, max_blocks: the static dims of SPEC §1 (B and NB are dynamic).
    - g_tile: query heads per inner step (divides group = nq / nkv; upstream uses the whole group).
    - s2_tile: KV tokens per step, a multiple of block_size.
    - softmax_scale: applied after dequantization (SPEC §2.3).
    - c1_tile / c2_tile: cube tiles of MM1 (QK^T) and MM2 (PV); v1_tile / v2_tile: vector tiles of
      the softmax stage and of the output update. Defaults are the upstream ones (SPEC §5).
    """

    s1: int
    nq: int
    nkv: int
    head_dim: int
    block_size: int
    max_blocks: int
    g_tile: int
    s2_tile: int
    softmax_scale: float
    c1_tile: CubeTile = _UPSTREAM_CUBE
    c2_tile: CubeTile = _UPSTREAM_CUBE
    v1_tile: tuple[int, int] | None = None
    v2_tile: tuple[int, int] = (128, 256)

    def __post_init__(self) -> None:
        for name in ("s1", "nq", "nkv", "head_dim", "block_size", "max_blocks", "g_tile", "s2_tile"):
            positive_int(getattr(self, name), name)
        if self.nq % self.nkv:
            raise ValueError(f"nq={self.nq} must be a multiple of nkv={self.nkv}")
        if self.group % self.g_tile:
            raise ValueError(f"g_tile={self.g_tile} must divide group = nq / nkv = {self.group}")
        if self.s2_tile % self.block_size:
            raise ValueError(f"s2_tile={self.s2_tile} must be a multiple of block_size={self.block_size}")
        object.__setattr__(self, "c1_tile", _check_cube("c1_tile", self.c1_tile))
        object.__setattr__(self, "c2_tile", _check_cube("c2_tile", self.c2_tile))
        object.__setattr__(self, "v1_tile", tuple(int(x) for x in softmax_tile(self)))
        object.__setattr__(self, "v2_tile", tuple(int(x) for x in self.v2_tile))
        object.__setattr__(self, "softmax_scale", float(self.softmax_scale))

    @property
    def group(self) -> int:
        return self.nq // self.nkv

    @property
    def blocks_per_tile(self) -> int:
        return self.s2_tile // self.block_size

    @classmethod
    def from_dims(cls, dims: PagedAttentionDims, **overrides: Any) -> PagedAttentionKernelConfig:
        """Build from golden.validate.PagedAttentionDims (or anything with the same attributes)."""
        fields: dict[str, Any] = dict(s1=dims.s1, nq=dims.nq, nkv=dims.nkv, head_dim=dims.head_dim,
                      block_size=dims.block_size, max_blocks=dims.max_blocks, g_tile=dims.g_tile,
                      s2_tile=dims.s2_tile, softmax_scale=dims.softmax_scale)
        fields.update(overrides)
        return cls(**fields)


def softmax_tile(cfg: PagedAttentionKernelConfig) -> tuple[int, int]:
    """The vector tile of the softmax stage (V1): ``cfg.v1_tile``, or [128, s2_tile] where it is None.
    The kernel reads it through here, so a configuration of the same fields walks the same way."""
    return (128, cfg.s2_tile) if cfg.v1_tile is None else cfg.v1_tile
