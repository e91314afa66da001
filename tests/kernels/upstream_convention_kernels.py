"""Kernels in PyPTO-Gym's calling convention, written by this project, to test the pypto-gym backend
without PyPTO-Gym's file (it is not on PyPI, and its code stays out of this repository).

``paged_attention`` is our own kernel (kernels/pfa_fp8.py) behind the upstream signature
(q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, atten_out, softmax_scale, tile_config),
decorated as upstream decorates its kernel (no run mode, pass verify off): the backend must take the
undecorated function and wrap it for the sim. The others are the error paths: a kernel that fails
while it is traced for tiles wider than one block, a function of the wrong signature, a name that
is not a function. Loaded by file path (--backend pypto-gym:tests/kernels/upstream_convention_kernels.py:NAME);
import it only after kernels.pypto_workarounds.load_pypto().
"""
# No `from __future__ import annotations`: pypto.frontend.jit reads the tensor annotations as objects.
from types import SimpleNamespace

import pypto

from pfa_verify.kernels.pfa_fp8 import paged_attention_fp8_body

_OPTIONS = dict(runtime_options={"stitch_function_max_num": 512, "device_sched_mode": 0},
                verify_options={"enable_pass_verify": False})


def _config(q, k, block_table, kv_act_seqs, softmax_scale, tile_config):
    """Our kernel's static configuration, from the upstream arguments (static dims are ints here)."""
    nq, (block_size, nkv, head_dim) = q.shape[1], k.shape[1:4]
    return SimpleNamespace(
        s1=q.shape[0] // kv_act_seqs.shape[0], nq=nq, nkv=nkv, head_dim=head_dim, block_size=block_size,
        max_blocks=block_table.shape[1], group=nq // nkv, g_tile=tile_config.g_tile, s2_tile=tile_config.s2_tile,
        blocks_per_tile=tile_config.s2_tile // block_size, softmax_scale=softmax_scale,
        c1_tile=tile_config.c1_tile_shape, c2_tile=tile_config.c2_tile_shape,
        v1_tile=(128, tile_config.s2_tile), v2_tile=tuple(tile_config.v2_tile_shape))


@pypto.frontend.jit(**_OPTIONS)
def paged_attention(
    q: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    q_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    k: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    k_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    v: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    v_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    block_table: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    atten_out: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16),
    softmax_scale, tile_config
):
    cfg = _config(q, k, block_table, kv_act_seqs, softmax_scale, tile_config)
    paged_attention_fp8_body(q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, atten_out, cfg)


@pypto.frontend.jit(**_OPTIONS)
def fails_on_wide_tiles(
    q: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    q_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    k: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    k_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    v: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP8E4M3),
    v_scale: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_FP32),
    block_table: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_INT32),
    kv_act_seqs: pypto.Tensor([pypto.DYNAMIC], pypto.DT_INT32),
    atten_out: pypto.Tensor([pypto.DYNAMIC, ...], pypto.DT_BF16),
    softmax_scale, tile_config
):
    cfg = _config(q, k, block_table, kv_act_seqs, softmax_scale, tile_config)
    # Half-way through the trace, as a real compile failure is: pypto's function stack is open.
    pypto.reshape(q, [q.shape[0] * cfg.nq, cfg.head_dim], inplace=True)
    _refuse_wide_tiles(cfg)
    paged_attention_fp8_body(q, q_scale, k, k_scale, v, v_scale, block_table, kv_act_seqs, atten_out, cfg)


def _refuse_wide_tiles(cfg):
    """Called while the kernel is traced (pypto's parser does not take `raise` in a kernel body)."""
    if cfg.s2_tile > cfg.block_size:
        raise RuntimeError("this kernel does not compile for s2_tile > block_size (test double)")


def wrong_signature(q, k, atten_out):
    return None


not_a_kernel = 42
