"""Cheap inputs for compile-only runs: the right shapes and dtypes, arbitrary finite content.

The compile-only tests (tests/kernels/test_sim_kernels.py) name the configs; this module only fills them.
"""
from __future__ import annotations

import torch

from pfa_verify.golden.paging import ceil_div

__all__ = ["compile_inputs"]


def compile_inputs(config, seed: int = 0) -> dict:
    """Arguments of the right shapes and dtypes with arbitrary finite content (compiling reads no
    values): random E4M3 codes below the top binade, positive scales, a permuted block table."""
    g = torch.Generator().manual_seed(seed)
    bs, d = config.block_size, config.head_dim
    max_blocks = ceil_div(config.s2, bs)                 # MAXB = ceil(S2 / BS), SPEC §5
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
