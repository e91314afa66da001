"""Print the sim-execute comparison of our kernel against the golden under both codecs.

    python -m kernels.sim_report [--seed N] [NAME ...]

For each case (default: pfa_fp8_b2_s1_1_s2_1k, pfa_fp8_b16_s1_1_s2_256_nkv_4 and a ragged causal
S1=2 case) it runs the kernel in pypto's CPU calculator and prints, against the golden with the
calculator codec and with the spec codec: the greatest absolute and relative differences and the
number of elements outside SPEC §4 (|k - g| <= 1e-4 + |g| / 128). The calculator-codec line checks
the kernel; the spec-codec line shows what the CPU run cannot check (the 950's own E4M3).
"""
from __future__ import annotations

import argparse
import sys
import time

__all__ = ["REPORT_CASES", "main", "compare_both_codecs"]

RAGGED = "ragged_causal_b3_s1_2_s2_640"
REPORT_CASES = ("pfa_fp8_b2_s1_1_s2_1k", "pfa_fp8_b16_s1_1_s2_256_nkv_4", RAGGED)


def _config(name: str):
    import golden
    from kernels.upstream import upstream_config

    if name == RAGGED:
        return golden.PagedAttentionConfig(batch=3, s1=2, s2=640, nq=8, nkv=2, kv_act_seqs=(640, 129, 1))
    return upstream_config(name)


def compare_both_codecs(out, kwargs) -> dict:
    """{codec name: (max abs, max rel, mismatched, total)} of `out` against the golden."""
    import golden

    rows = {}
    for codec in (golden.PYPTO_CALCULATOR_CODEC, golden.SPEC_CODEC):
        expected = golden.paged_attention_fp8(**kwargs, codec=codec).float()
        diff = (out.float() - expected).abs()
        rel = diff / expected.abs().clamp_min(1e-30)
        rel = rel.masked_fill(diff == 0, 0.0)
        rows[codec.name] = (float(diff.max()), float(rel.max()),
                            int((diff > 1e-4 + expected.abs() / 128).sum()), diff.numel())
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.sim_report", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(REPORT_CASES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import golden
    import kernels

    try:
        backend = kernels.get_backend("sim")
    except kernels.BackendUnavailable as exc:
        print(f"sim backend unavailable: {exc.reason}")
        return 2
    print(f"{'case':34s} {'codec':24s} {'max abs':>10s} {'max rel':>10s} {'mismatched':>16s} {'run s':>6s}")
    for name in args.names:
        bundle = golden.make_inputs(_config(name), args.seed)
        before = bundle.clone()
        start = time.perf_counter()
        out = backend.paged_attention_fp8(**bundle.kwargs())
        seconds = time.perf_counter() - start
        for codec_name, (mabs, mrel, bad, total) in compare_both_codecs(out, before.kwargs()).items():
            print(f"{name:34s} {codec_name:24s} {mabs:10.3e} {mrel:10.3e} {bad:>8d}/{total:<7d} {seconds:6.1f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
