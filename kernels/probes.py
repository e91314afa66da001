"""Platform probes: what SPEC §4.1's conformance model assumes, measured through a backend.

SPEC §4.1 judges a kernel by a model (golden.model.ConformanceModel): float32 sums rounded to nearest
(F1), ``exp`` within 3 ulp with ``exp(0) = 1`` exactly and ``O / l`` within 1 ulp (F3), and the bf16
output rounded to nearest even. These probes run the kernel's own float32 operations on the backend,
one operation per kernel (kernels/probe_kernels.py; the FP8 matmul through our AT-12 kernel with unit
scales), on inputs built to expose each assumption:

  exp_zero         exp(+0) and exp(-0) must be 1.0 exactly (a row max of P is then at least 1: the P
                   scale at most 448)
  exp_ulps         exp over [-87, 0] (the arguments S - m_j and m - m' take) against float64 exp,
                   the error in float32 ulps of the exact value, reported against the declared
                   model's exp_ulps (SPEC_MODEL: F3's 3). What the 950's vector exp achieves is not
                   published: this probe is how it is known, on the sim's calculator or on a 950
  matmul_rounding  FP8 dot products whose exact value lies just above, on and just below a float32
                   midpoint (256 + 1.25 * 2^-16, 256 + 2^-16, 256 + 0.75 * 2^-16, both signs): every
                   order of round-to-nearest additions gives one result, truncation another, so the
                   results name the rounding mode (nearest even, nearest away, toward zero, down, up)
  rowsum_rounding  the same for row sums: 1 + (2^-24 + 2^-47) and friends, the terms at several columns
  div_ulps         x / y with y >= 1 (l >= 1), against float64 division, in float32 ulps
  bf16_rne         the float32 -> bf16 cast on bf16 midpoints (ties to even and odd), their float32
                   neighbours and random patterns, against round-to-nearest-even bit for bit

:func:`measured_model` turns the measurements into the backend's model: it starts from the model the
backend declares (``backend.model``, SPEC_MODEL by default) and changes a parameter only where a probe
measured worse (exp 3.2 ulp off: ``exp_ulps`` 3.5; truncating sums: ``sums="truncating"``). A finite grid
can show that an assumption fails, never prove a narrower one, so the probes never narrow a model; a
failed probe is reported and changes the model (which may then be wider than SPEC §4.1: reported as
not conforming), never a tolerance. Results are cached per process and platform. :func:`calibrate`
also sets ``backend.model``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from pfa_verify.golden.codec import SPEC_CODEC
from pfa_verify.golden.model import SPEC_MODEL
from pfa_verify.kernels import pypto_workarounds as pw
from pfa_verify.kernels.backends import finish_output, unwritten_output
from pfa_verify.kernels.backends.npu import NpuBackend
from pfa_verify.kernels.backends.sim import SimBackend

__all__ = ["PROBES", "ROUNDING_MODES", "measured_model", "calibrate", "probe_runner", "SimProbeRunner",
           "NpuProbeRunner", "clear_cache"]

PROBES = ("exp_zero", "exp_ulps", "matmul_rounding", "rowsum_rounding", "div_ulps", "bf16_rne")
#: The rounding modes the sum probes tell apart, in the order they are reported.
ROUNDING_MODES = ("nearest-even", "nearest-away", "toward-zero", "down", "up")
_NEAREST = ("nearest-even", "nearest-away")
ROWS, COLS = 128, 256
_CACHE: dict = {}


# --- runners: how a probe kernel runs on a backend ------------------------------------------------------

class SimProbeRunner:
    """Probe kernels in pypto's CPU calculator (SIM + pass verify, W9 execution), pypto's own E4M3."""
    key: tuple[object, ...] = ("sim",)

    def __init__(self) -> None:
        self._pw, self._pypto = pw, pw.load_pypto()
        self._kernels: dict[tuple[object, ...], Any] = {}

    def _call(self, key, make, tensors: list) -> None:
        if key not in self._kernels:
            self._kernels[key] = make(self._pypto.RunMode.SIM, True)
        with self._pw.sim_session(cost_model=False):
            self._pw.execute_kernel(self._kernels[key], tensors)

    def run(self, op: str, inputs: list, out: torch.Tensor) -> torch.Tensor:
        from pfa_verify.kernels.probe_kernels import make_probe_kernel  # a pypto program: only once pypto is loaded
        rows, cols = inputs[0].shape
        self._call((op, rows, cols), lambda mode, verify: make_probe_kernel(op, rows, cols, run_mode=mode,
                                                                            pass_verify=verify), [*inputs, out])
        return out

    def matmul_fp8(self, q8, k8, q_scale, k_scale, out) -> torch.Tensor:
        from pfa_verify.kernels.at12 import At12KernelConfig, make_at12_kernel  # a pypto program, as above
        cfg = At12KernelConfig(q_tile=q8.shape[0], k_len=k8.shape[0], head_dim=q8.shape[1], dtype="fp8", scale=1.0)
        self._call(("at12", cfg), lambda mode, verify: make_at12_kernel(cfg, run_mode=mode, pass_verify=verify),
                   [q8, k8, q_scale, k_scale, out])
        return out


class NpuProbeRunner(SimProbeRunner):
    """The same probe kernels on an Ascend 950 (run mode NPU). Written for the npu backend and not run
    by this project yet (no 950 was available): a failure there is an error, never a pass."""

    def __init__(self, backend) -> None:
        self._backend, self._pypto, self._kernels = backend, backend._pypto, {}
        self.key = ("npu", backend.device_index)

    def _call(self, key, make, tensors: list) -> None:
        if key not in self._kernels:
            self._kernels[key] = make(self._pypto.RunMode.NPU, False)
        device = [t.to(self._backend.device) for t in tensors]
        self._kernels[key](*device)
        torch.npu.synchronize(self._backend.device)  # type: ignore[attr-defined]  # torch_npu adds torch.npu
        tensors[-1].copy_(device[-1].cpu())


def probe_runner(backend):
    """The runner for ``backend``'s platform: the sim backends (every E4M3 variant, mutants and
    PyPTO-Gym kernels included: the probes measure the calculator, not the kernel), or the npu one."""
    if isinstance(backend, SimBackend):
        return SimProbeRunner()
    if isinstance(backend, NpuBackend):
        return NpuProbeRunner(backend)
    raise ValueError(f"backend={getattr(backend, 'name', backend)!r}: the platform probes run on the sim and npu "
                     "backends only")


def _written(out: torch.Tensor) -> torch.Tensor:
    return finish_output(out)


def _fresh(shape, dtype=torch.float32) -> torch.Tensor:
    return unwritten_output(shape, dtype=dtype)


# --- measurements ----------------------------------------------------------------------------------------

def _ulps(result: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|result - exact| in float32 ulps of ``exact`` (float64, normal float32 range); NaN counts as inf."""
    _, exponent = torch.frexp(exact)
    ulp = torch.ldexp(torch.ones_like(exact), exponent - 24)
    error = (result.double() - exact).abs() / ulp
    return torch.where(torch.isnan(error), math.inf, error)


def _round_f32(value: torch.Tensor, mode: str) -> torch.Tensor:
    """float64 ``value`` rounded to float32 in ``mode`` (one of ROUNDING_MODES), as float64."""
    near = value.float().double()                              # torch's cast: nearest even
    lo = torch.where(near <= value, near, torch.nextafter(near.float(), torch.tensor(-math.inf)).double())
    hi = torch.where(near >= value, near, torch.nextafter(near.float(), torch.tensor(math.inf)).double())
    if mode == "nearest-even":
        return near
    if mode == "nearest-away":
        tie = (value - lo) == (hi - value)
        return torch.where(tie & (lo != hi), torch.where(value > 0, hi, lo), near)
    if mode == "toward-zero":
        return torch.where(value > 0, lo, hi)
    return lo if mode == "down" else hi


def _sum_patterns(big: float, half_ulp: float):
    """(big term, small term) pairs whose exact sum lies just above, on and just below the float32
    midpoint big + half_ulp, both signs."""
    smalls = (half_ulp * (1 + 2.0 ** -23), half_ulp, half_ulp * (1 - 2.0 ** -24))
    return [(sign * big, sign * s) for s in smalls for sign in (1.0, -1.0)]


def _modes_matching(results: torch.Tensor, exact: torch.Tensor) -> list[str]:
    return [m for m in ROUNDING_MODES if torch.equal(results.double(), _round_f32(exact, m))]


def _probe_rowsum(runner) -> dict:
    x = torch.zeros(ROWS, COLS)
    exact = torch.zeros(ROWS, dtype=torch.float64)
    patterns = _sum_patterns(1.0, 2.0 ** -24)
    placements = [(0, 1), (COLS - 1, 0), (COLS // 2, COLS // 2 + 1), (3, COLS - 2)]
    for r in range(ROWS):
        (big, small), (i, j) = patterns[r % len(patterns)], placements[(r // len(patterns)) % len(placements)]
        x[r, i], x[r, j] = big, small
        exact[r] = big + small                                  # exact in float64
    got = _written(runner.run("rowsum", [x], _fresh((ROWS, 1)))).reshape(-1)
    modes = _modes_matching(got, exact)
    return {"passed": bool(set(modes) & set(_NEAREST)), "modes": modes, "points": ROWS}


def _probe_matmul(runner) -> dict:
    # Products of E4M3 values: 16 * 16 = 256 (float32 ulp 2^-15), and small ones landing on 256's midpoint.
    small = {1.25: (5 * 2.0 ** -9, 2.0 ** -9), 1.0: (2.0 ** -8, 2.0 ** -8), 0.75: (3 * 2.0 ** -9, 2.0 ** -9)}
    n, d = 8, 128
    q, k = torch.zeros(n, d), torch.zeros(n, d)
    exact = torch.zeros(n, dtype=torch.float64)
    for i, (factor, sign) in enumerate([(f, s) for f in (1.25, 1.0, 0.75) for s in (1.0, -1.0)] + [(1.25, 1.0), (1.0, 1.0)]):
        a, b = small[factor]
        big_at, small_at = (0, 1) if i < 6 else (d - 1, d // 2)
        q[i, big_at], k[i, big_at], q[i, small_at], k[i, small_at] = sign * 16.0, 16.0, sign * a, b
        exact[i] = sign * (256.0 + factor * 2.0 ** -16)
    ones = torch.ones(n, 1)
    out = runner.matmul_fp8(SPEC_CODEC.to_fp8(q), SPEC_CODEC.to_fp8(k), ones, ones.clone(), _fresh((n, n)))
    got = torch.diagonal(_written(out))
    modes = _modes_matching(got, exact)
    return {"passed": bool(set(modes) & set(_NEAREST)), "modes": modes, "points": n}


def _probe_exp(runner) -> tuple[dict, dict]:
    zero = torch.zeros(ROWS, COLS)
    zero[ROWS // 2:] = -0.0
    at_zero = _written(runner.run("exp", [zero], _fresh((ROWS, COLS))))
    exp_zero = {"passed": bool((at_zero == 1.0).all()), "measured": sorted({float(v) for v in at_zero.reshape(-1)}),
                "expected": 1.0, "points": zero.numel()}
    g = torch.Generator().manual_seed(0)
    n = ROWS * COLS
    x = torch.cat([torch.linspace(-20.0, 0.0, n // 2), -(2.0 ** torch.linspace(-24.0, math.log2(87.0), n // 4)),
                   -87.0 * torch.rand(n - n // 2 - n // 4, generator=g)]).float().reshape(ROWS, COLS)
    got = _written(runner.run("exp", [x], _fresh((ROWS, COLS))))
    err = _ulps(got, torch.exp(x.double()))
    worst = int(err.argmax())
    return exp_zero, {"measured": float(err.max()), "points": n, "worst_argument": float(x.reshape(-1)[worst])}


def _probe_div(runner) -> dict:
    g = torch.Generator().manual_seed(1)
    sign = torch.where(torch.rand(ROWS, COLS, generator=g) < 0.5, -1.0, 1.0)
    x = (sign * torch.exp2(torch.rand(ROWS, COLS, generator=g) * 40 - 20) * (1 + torch.rand(ROWS, COLS, generator=g))).float()
    y = (torch.exp2(torch.rand(ROWS, 1, generator=g) * 12) * (1 + torch.rand(ROWS, 1, generator=g))).float()
    y[0, 0], y[1, 0] = 1.0, 3.0                                   # l = 1 (one token) and a non-dyadic divisor
    got = _written(runner.run("div", [x, y], _fresh((ROWS, COLS))))
    err = _ulps(got, x.double() / y.double())
    worst = int(err.argmax())
    return {"measured": float(err.max()), "points": x.numel(),
            "worst": [float(x.reshape(-1)[worst]), float(y[worst // COLS, 0])]}


def _probe_bf16(runner) -> dict:
    g = torch.Generator().manual_seed(2)
    n = ROWS * COLS // 4
    bf = torch.randint(0, 0x7F80, (n,), generator=g, dtype=torch.int64)          # finite bf16 magnitudes
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64) << 31
    mid = (bf << 16) | 0x8000                                                     # exact midpoints, even and odd
    rand = torch.randint(0, 0x7F800000, (n,), generator=g, dtype=torch.int64)    # finite float32 patterns
    bits = torch.cat([mid, mid + 1, mid - 1, rand]) | torch.cat([sign] * 4)
    bits[:2] = torch.tensor([0x7F7FFFFF, 0xFF7FFFFF])                           # rounds to +-inf
    x = bits.to(torch.int32).view(torch.float32).reshape(ROWS, COLS)
    got = _written(runner.run("bf16", [x], _fresh((ROWS, COLS), torch.bfloat16)))
    u = bits & 0xFFFFFFFF
    rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    seen = got.reshape(-1).view(torch.int16).to(torch.int64) & 0xFFFF
    bad = (seen != rne).nonzero().reshape(-1)
    truncated = bool(torch.equal(seen, (u >> 16) & 0xFFFF))
    first = None if not bad.numel() else {"x_bits": hex(int(u[bad[0]])), "got": hex(int(seen[bad[0]])),
                                           "rne": hex(int(rne[bad[0]]))}
    return {"passed": not bad.numel(), "mismatches": int(bad.numel()), "points": int(u.numel()),
            "truncating": truncated, "first": first}


# --- the model ---------------------------------------------------------------------------------------------

def _half_ulps_up(value: float) -> float:
    return math.ceil(value * 2) / 2 if math.isfinite(value) else 63.5


def measured_model(backend, *, refresh: bool = False, runner=None):
    """(ConformanceModel, report dict) of ``backend``'s platform, measured by the probes (module
    docstring) against the model it declares (``backend.model``, else golden.model.SPEC_MODEL). The
    probes run once per process and platform (``runner.key``) unless ``refresh``; a different declared
    model reuses them. ``runner`` runs the probe kernels (default: probe_runner(backend)); it has a
    ``key``, ``run(op, inputs, out)`` and ``matmul_fp8(q8, k8, q_scale, k_scale, out)``."""
    declared = getattr(backend, "model", None) or SPEC_MODEL
    runner = probe_runner(backend) if runner is None else runner
    if refresh or runner.key not in _CACHE:
        exp_zero, exp_ulps = _probe_exp(runner)
        _CACHE[runner.key] = {"exp_zero": exp_zero, "exp_ulps": exp_ulps, "matmul_rounding": _probe_matmul(runner),
                              "rowsum_rounding": _probe_rowsum(runner), "div_ulps": _probe_div(runner),
                              "bf16_rne": _probe_bf16(runner)}
    probes = {name: dict(result) for name, result in _CACHE[runner.key].items()}
    changes: dict[str, float | str] = {}
    outside: list[str] = []
    for name, field in (("exp_ulps", "exp_ulps"), ("div_ulps", "div_ulps")):
        probes[name]["assumed"] = getattr(declared, field)
        probes[name]["passed"] = probes[name]["measured"] <= getattr(declared, field)
        if not probes[name]["passed"]:
            changes[field] = _half_ulps_up(probes[name]["measured"])
    if not (probes["matmul_rounding"]["passed"] and probes["rowsum_rounding"]["passed"]):
        changes["sums"] = "truncating"
        modes = set(probes["matmul_rounding"]["modes"] + probes["rowsum_rounding"]["modes"]) - set(_NEAREST)
        if modes != {"toward-zero"}:
            outside.append(f"float32 sums rounded {sorted(modes) or 'inconsistently'}: golden.model has no such "
                           "mode; 'truncating' stands for it")
    if not probes["exp_zero"]["passed"]:
        outside.append("exp(0) != 1: every model assumes it (a row max of P is then at least 1, the P "
                       "scale at most 448)")
    if not probes["bf16_rne"]["passed"]:
        outside.append("the bf16 output cast is not round-to-nearest-even, which every model assumes")
    model = declared
    if changes:
        label = ", ".join(f"{k} {v}" for k, v in changes.items())
        model = dataclasses.replace(declared, name=f"{declared.name}, as measured on {backend.name} ({label})", **changes)
    report = {"backend": backend.name, "platform": list(runner.key), "declared": declared.to_dict(),
              "model": model.to_dict(), "failed": [n for n in PROBES if not probes[n]["passed"]],
              "not_expressible": outside, "conforming": model.conforming and not outside, "probes": probes}
    return model, report


def calibrate(backend, *, refresh: bool = False, runner=None) -> dict:
    """Measure ``backend``'s platform (measured_model), set ``backend.model`` to the result and
    ``backend.probe_report`` to the report; return the report."""
    model, report = measured_model(backend, refresh=refresh, runner=runner)
    backend.model, backend.probe_report = model, report
    return report


def clear_cache() -> None:
    """Forget every platform's probe results (tests)."""
    _CACHE.clear()
