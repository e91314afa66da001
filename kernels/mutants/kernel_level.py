"""Kernel-level mutants: one textual change of our PyPTO kernel (kernels/pfa_fp8.py), run on the sim.

Each mutant replaces one snippet of the kernel's source (it must occur exactly once); the mutated
module is written to the cache (pypto's parser reads a kernel's source from its file) and imported
from there, and a sim backend runs it. kernels/pfa_fp8.py itself is never edited.

A mutant runs on the plain sim (pypto's own E4M3) unless its ``e4m3`` says "spec": a defect that only
touches E4M3 codes worth 256 to 448, or saturation, is invisible to pypto's calculator, which reads all
of those as 240; such a mutant runs on the sim-spec-codec backend (kernels/pypto_workarounds/, W13).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from pfa_verify.golden.errors import UsageError
from pfa_verify.kernels.backends.loader import load_file_module
from pfa_verify.kernels.backends.sim import SimBackend
from pfa_verify.kernels.pypto_workarounds import cache_root

__all__ = ["KernelMutant", "KERNEL_MUTANTS", "make_kernel_mutant", "mutated_source"]

_SOURCE = Path(__file__).resolve().parent.parent / "pfa_fp8.py"


@dataclasses.dataclass(frozen=True)
class KernelMutant:
    bug: str
    old: str
    new: str
    equivalent: str | None = None
    e4m3: str = "pypto"           # the sim's E4M3 it runs on: "pypto" (sim) or "spec" (sim-spec-codec)


KERNEL_MUTANTS = {
    "causal_offset_ignored": KernelMutant(
        "Every query position sees all kv_act_seqs[b] tokens: the S1 - 1 - i causal offset is dropped.",
        "cur = (kv_act_seqs[b_idx] - (s1 - 1 - s1_idx)).max(0)", "cur = (kv_act_seqs[b_idx] - 0 * s1_idx).max(0)"),
    "tail_tile_reads_full_tile": KernelMutant(
        "The last tile's valid length is not cut: it computes over a full s2_tile.",
        "valid = (cur - s2_idx * s2_tile).min(s2_tile)", "valid = (cur - s2_idx * s2_tile).max(s2_tile).min(s2_tile)"),
    "table_column_off_by_one": KernelMutant(
        "The block-table column of each block in a tile is one too far (s2_idx * blocks_per_tile + i + 1).",
        "column = (s2_idx * cfg.blocks_per_tile + i).min(cfg.max_blocks - 1)",
        "column = (s2_idx * cfg.blocks_per_tile + i + 1).min(cfg.max_blocks - 1)"),
    "minus_one_not_clamped": KernelMutant(
        "-1 table entries are not clamped to block 0 before the gather.",
        "block = block_table[b_idx, column].max(0)", "block = block_table[b_idx, column]"),
    "every_head_reads_kv_head_0": KernelMutant(
        "The K and V gathers read KV head 0 for every group (the n2 offset of the cache view is dropped).",
        "[block * bs, n2_idx * width]", "[block * bs, 0 * n2_idx]"),
    "no_max_subtraction": KernelMutant(
        "The softmax skips the row max: P = exp(S).",
        "p = pypto.exp(pypto.sub(s, m_j))", "p = pypto.exp(s)"),
    "softmax_scale_before_dequant": KernelMutant(
        "softmax_scale is applied to the raw scores before the q and k dequantization.",
        "s = pypto.mul(pypto.mul(s_raw, qscale_i), kscale_row)\n        s = pypto.mul(s, cfg.softmax_scale)",
        "s = pypto.mul(pypto.mul(pypto.mul(s_raw, cfg.softmax_scale), qscale_i), kscale_row)"),
    "p_scale_not_inverted": KernelMutant(
        "P is dequantized with its quantization scale (448 / max P) instead of its reciprocal.",
        "p_scale = pypto.div(pypto.full([g_tile, 1], 1.0, pypto.DT_FP32), p_quant_scale)",
        "p_scale = pypto.mul(p_quant_scale, 1.0)"),
    "v_scale_of_batch_0": KernelMutant(
        "Every batch reads batch 0's V scale (the batch offset of the v_scale view is dropped).",
        "[b_idx * nkv + n2_idx, 0]", "[0 * b_idx + n2_idx, 0]"),
    "missing_o_rescale": KernelMutant(
        "The online update forgets to rescale O by exp(m - m').",
        "o_acc[:] = pypto.add(pypto.mul(o_acc, a), pypto.mul(o_j, c))", "o_acc[:] = pypto.add(o_acc, pypto.mul(o_j, c))"),
    "missing_l_rescale": KernelMutant(
        "The online update forgets to rescale l by exp(m - m').",
        "l_acc[:] = pypto.add(pypto.mul(l_acc, a), pypto.mul(l_j, c))", "l_acc[:] = pypto.add(l_acc, pypto.mul(l_j, c))"),
    "running_max_not_updated": KernelMutant(
        "The running max m keeps the first tile's value (m = m' is never stored).",
        "            m_acc[:] = m_new\n", "            m_acc[:] = m_acc\n"),
    "p_clamped_to_240": KernelMutant(
        "P is clamped to 240 before its E4M3 cast, the largest value of the IEEE-style E4M3 (the one with "
        "infinities) instead of E4M3FN's 448: every row's largest P codes (256 to 448) become 240.",
        "p8 = pypto.cast(pypto.mul(p, p_quant_scale), pypto.DT_FP8E4M3)",
        "p8 = pypto.cast(pypto.minimum(pypto.mul(p, p_quant_scale), 240.0), pypto.DT_FP8E4M3)",
        e4m3="spec"),
}


def mutated_source(name: str) -> str:
    """kernels/pfa_fp8.py with mutant ``name``'s change (ValueError when its snippet is not there once)."""
    if name not in KERNEL_MUTANTS:
        raise UsageError(f"kernel mutant {name!r} is not in the catalog; expected one of {sorted(KERNEL_MUTANTS)}")
    mutant = KERNEL_MUTANTS[name]
    text = _SOURCE.read_text()
    if text.count(mutant.old) != 1:
        raise ValueError(f"kernel mutant {name!r}: its snippet occurs {text.count(mutant.old)} times in "
                         f"{_SOURCE.name}; update the catalog")
    return text.replace(mutant.old, mutant.new)


def _mutated_module(name: str):
    """Mutant ``name``'s copy of kernels/pfa_fp8.py, written to the cache (pypto's parser reads a kernel's
    source from its file) and loaded by the one loader (kernels/backends/loader.py): ValueError when it
    does not import."""
    source = mutated_source(name)
    tag = hashlib.sha256(source.encode()).hexdigest()[:12]
    path = cache_root() / "mutants" / f"pfa_fp8_{name}_{tag}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)      # whole, whatever another process does at the same time
    return load_file_module(path, prefix="_pfa_verify_mutant_")


def make_kernel_mutant(name: str, **options):
    """A sim backend running mutant ``name`` of our kernel (``none``: the kernel itself), on the sim
    variant the mutant names (its ``e4m3``) unless ``options`` give ``e4m3``."""
    if name != "none" and name not in KERNEL_MUTANTS:
        raise UsageError(f"kernel mutant {name!r} is not in the catalog; expected none or one of {sorted(KERNEL_MUTANTS)}")
    if name != "none":
        options = {"e4m3": KERNEL_MUTANTS[name].e4m3, **options}

    class KernelMutantBackend(SimBackend):
        def __init__(self, **sim_options) -> None:
            super().__init__(**sim_options)          # pypto from the overlay first: the copy imports it
            self._mutated = _mutated_module(name)    # a copy that does not import: ValueError, now

        def _make_pfa_kernel(self, *, run_mode, pass_verify: bool):
            return self._mutated.make_kernel(run_mode=run_mode, pass_verify=pass_verify, pass_options=self.pass_options)

    if name == "none":
        backend = SimBackend(**options)
    else:
        backend = KernelMutantBackend(**options)
    backend.name = f"mutant:sim/{name}"
    return backend
