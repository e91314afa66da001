"""The six upstream cases of SPEC §5 as golden configs, plus cheap inputs for compile-only runs.

Kept here until cases/catalog.json exists; the names are the interface (SPEC §5), the numbers are
the §5 table (D = BS = 128, g_tile = NQ / NKV, kv_act_seqs = S2, NB = B * ceil(S2 / BS)).
"""
from __future__ import annotations

import math

import torch

__all__ = ["UPSTREAM_CASES", "upstream_config", "compile_inputs"]

#: name -> (B, S1, S2, NQ, NKV, s2_tile), SPEC §5.
UPSTREAM_CASES: dict[str, tuple[int, int, int, int, int, int]] = {
    "pfa_fp8_b1_s1_2_s2_2048_nkv_8": (1, 2, 2048, 48, 8, 128),
    "pfa_fp8_b16_s1_1_s2_8195_nkv_2": (16, 1, 8195, 12, 2, 128),
    "pfa_fp8_b16_s1_1_s2_8k_nkv_1": (16, 1, 8192, 12, 1, 1024),
    "pfa_fp8_b16_s1_1_s2_8k_nkv_2": (16, 1, 8192, 12, 2, 1024),
    "pfa_fp8_b2_s1_1_s2_1k": (2, 1, 1024, 12, 1, 128),
    "pfa_fp8_b16_s1_1_s2_256_nkv_4": (16, 1, 256, 16, 4, 128),
}


def upstream_config(name: str):
    """golden.PagedAttentionConfig of an upstream case (ValueError for an unknown name)."""
    import golden

    if name not in UPSTREAM_CASES:
        raise ValueError(f"name={name!r} is not an upstream case; expected one of {sorted(UPSTREAM_CASES)}")
    b, s1, s2, nq, nkv, s2_tile = UPSTREAM_CASES[name]
    return golden.PagedAttentionConfig(batch=b, s1=s1, s2=s2, nq=nq, nkv=nkv, s2_tile=s2_tile)


def compile_inputs(config, seed: int = 0) -> dict:
    """Arguments of the right shapes and dtypes with arbitrary finite content (compiling reads no
    values): random E4M3 codes below the top binade, positive scales, a permuted block table."""
    g = torch.Generator().manual_seed(seed)
    bs, d = config.block_size, config.head_dim
    max_blocks = math.ceil(config.s2 / bs)
    nb = config.batch * max_blocks

    def fp8(*shape):
        return torch.randint(0, 0x77, shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)

    rows = config.batch * config.s1
    return dict(
        q=fp8(rows, config.nq, d), q_scale=torch.rand(rows, config.nq, 1, generator=g) + 0.5,
        k_cache=fp8(nb, bs, config.nkv, d), k_scale=torch.rand(nb, bs, config.nkv, 1, generator=g) + 0.5,
        v_cache=fp8(nb, bs, config.nkv, d), v_scale=torch.rand(config.batch, config.nkv, d, generator=g) + 0.5,
        block_table=torch.randperm(nb, generator=g).reshape(config.batch, max_blocks).to(torch.int32),
        kv_act_seqs=torch.full((config.batch,), config.s2, dtype=torch.int32),
        s2_tile=config.s2_tile,
    )
