"""Conformance of the calculator's two E4M3 modes with their golden codecs (SPEC §3).

pypto 0.2.0's own E4M3 is not E4M3FN: it must equal golden.codec.PYPTO_CALCULATOR_CODEC. Our build's
spec mode (kernels/pypto_workarounds/, W13; the sim-spec-codec backend) must equal
golden.codec.SPEC_CODEC. These tests measure both through the calculator itself (one-cast kernels of
tests/kernels/codec_probe.py run in SIM mode with pass verify) and require each model to agree bit for bit:
  decode  every one of the 256 codes (FP8 -> FP32, the path matmul operands take too)
  encode  every FP32 value class: +-0, the subnormal range, normals, every E4M3 grid value and
          rounding midpoint with their float32 neighbours, integer half-way points, the 240
          saturation edge, huge values, +-inf, +-NaN, and a dense grid over [-300, 300]
"""
from __future__ import annotations

import math

import pytest
import torch

from pfa_verify.golden.codec import SPEC_CODEC, get_codec
from pfa_verify.kernels import pypto_workarounds as pw

pytestmark = pytest.mark.sim

COLS = 256


#: (calculator E4M3 mode, the golden codec it must equal)
MODES = [("pypto", "pypto-0.2.0-calculator"), ("spec", "e4m3fn-sat")]


def _codec(name: str):
    return get_codec(name)


def _run_decode(codes: torch.Tensor, mode: str = "pypto") -> torch.Tensor:
    from tests.kernels.codec_probe import make_decode_probe

    rows = codes.numel() // COLS
    out = torch.zeros(rows, COLS)
    with pw.sim_session(), pw.e4m3_codec(mode):
        make_decode_probe(rows, COLS)(codes.reshape(rows, COLS).contiguous().view(torch.float8_e4m3fn), out)
    return out.reshape(-1)


def _run_encode(x: torch.Tensor, mode: str = "pypto") -> torch.Tensor:
    from tests.kernels.codec_probe import make_encode_probe

    n = x.numel()
    rows = math.ceil(n / COLS)
    padded = torch.zeros(rows * COLS)
    padded[:n] = x
    out = torch.zeros(rows, COLS, dtype=torch.uint8)
    with pw.sim_session(), pw.e4m3_codec(mode):
        make_encode_probe(rows, COLS)(padded.reshape(rows, COLS), out.view(torch.float8_e4m3fn))
    return out.reshape(-1)[:n]


def _encode_inputs() -> dict[str, torch.Tensor]:
    """Named FP32 value classes (each class a 1-D float32 tensor, both signs)."""

    grid = SPEC_CODEC.decode(torch.arange(0, 0x7F, dtype=torch.uint8))  # every finite E4M3FN >= 0
    mids = (grid[1:] + grid[:-1]) / 2
    nudged = torch.cat([torch.nextafter(mids, torch.tensor(0.0)), mids,
                        torch.nextafter(mids, torch.tensor(math.inf))])
    halves = torch.arange(0, 300) + 0.5
    half_nudged = torch.cat([torch.nextafter(halves, torch.tensor(0.0)), halves,
                             torch.nextafter(halves, torch.tensor(math.inf))])
    edge = torch.tensor([224.0, 231.9, 232.0, 232.1, 233.0, 235.9, 236.0, 239.0, 239.5, 239.99, 240.0,
                         240.5, 247.0, 248.0, 255.9, 256.0, 288.0, 447.0, 448.0, 449.0, 464.0, 465.0])
    classes = {
        "zero": torch.tensor([0.0]),
        "subnormal_range": torch.tensor([2.0 ** -149, 2.0 ** -126, 2.0 ** -10, 2.0 ** -9, 2.0 ** -8,
                                         2.0 ** -7, 2.0 ** -6, 0.001, 0.01, 0.1]),
        "below_one": torch.linspace(0.0, 1.0, 257),
        "e4m3_grid": grid,
        "e4m3_midpoints": nudged,
        "integer_half_way": half_nudged,
        "saturation_edge": edge,
        "huge": torch.tensor([1e3, 1e6, 1e30, torch.finfo(torch.float32).max]),
        "inf": torch.tensor([math.inf]),
        "nan": torch.tensor([math.nan]),
        "dense_grid": torch.arange(-300 * 64, 300 * 64 + 1, dtype=torch.float32) / 64,
    }
    return {name: torch.cat([v, -v]).float() for name, v in classes.items()}


@pytest.mark.parametrize("mode, codec", MODES)
def test_decode_all_256_codes(pypto_module, mode, codec):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    measured = _run_decode(codes, mode)
    modelled = _codec(codec).decode(codes)
    same = (measured == modelled) | (measured.isnan() & modelled.isnan())
    assert torch.equal(torch.signbit(measured[same]), torch.signbit(modelled[same]))
    bad = [(hex(int(c)), float(m), float(e)) for c, m, e in zip(codes[~same], measured[~same], modelled[~same], strict=True)]
    assert not bad, f"{len(bad)} of 256 codes decode differently (code, calculator, model): {bad[:16]}"


def test_decode_differs_from_e4m3fn_exactly_in_the_top_binade(pypto_module):

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    measured = _run_decode(codes)
    spec = SPEC_CODEC.decode(codes)
    differs = ~((measured == spec) | (measured.isnan() & spec.isnan()))
    top_binade = ((codes.long() >> 3) & 0xF) == 0xF
    assert torch.equal(differs, top_binade)
    assert set(measured[top_binade].abs().tolist()) == {240.0}


@pytest.mark.parametrize("mode, codec", MODES)
def test_encode_every_value_class(pypto_module, mode, codec):
    classes = _encode_inputs()
    names = [name for name, v in classes.items() for _ in range(v.numel())]
    x = torch.cat(list(classes.values()))
    measured = _run_encode(x, mode)
    modelled = _codec(codec).encode(x)
    bad = (measured != modelled).nonzero().flatten().tolist()
    lines = [f"{names[i]}: x={x[i].item()!r} calculator={int(measured[i]):#04x} model={int(modelled[i]):#04x}"
             for i in bad[:20]]
    assert not bad, f"{len(bad)} of {x.numel()} encodes differ:\n" + "\n".join(lines)


def test_the_spec_mode_is_off_outside_its_block(pypto_module):
    """W13's switch is process-wide: e4m3_codec('spec') puts pypto's own E4M3 back, also after an error,
    so `--backend sim` in the same process still computes with pypto's codec."""

    with pytest.raises(RuntimeError, match="inside"):
        with pw.e4m3_codec("spec"):
            assert pw.current_e4m3_codec() == "spec"
            raise RuntimeError("inside")
    assert pw.current_e4m3_codec() == "pypto"
    top = torch.tensor([0x7E, 0x7F, 0xFE], dtype=torch.uint8).repeat(COLS)
    assert _run_decode(top)[:3].tolist() == [240.0, 240.0, -240.0]
    with pytest.raises(ValueError, match="must be one of"):
        with pw.e4m3_codec("e5m2"):
            pass
