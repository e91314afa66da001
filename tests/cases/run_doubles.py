"""Test-double backends for ``pfa-verify run`` (importable by file path, as captured regressions name them).

- :class:`PerturbOne`: the golden, with one output element moved far out of tolerance (a kernel-logic bug).
- :class:`CalculatorCodec`: the golden computed with pypto's CPU-calculator codec, declaring that codec
  (a kernel whose only difference from the spec is its platform's FP8 conversions).
"""
from __future__ import annotations

import torch

from kernels.backends.golden_backend import GoldenBackend


class PerturbOne(GoldenBackend):
    """Adds 0.5 to output element (row 0, head 1, d 3) whenever the row has visible tokens."""
    name = "tests/cases/run_doubles.py:PerturbOne"
    INDEX = (0, 1, 3)

    def paged_attention_fp8(self, *args, **kwargs):
        out = super().paged_attention_fp8(*args, **kwargs).clone()
        row, h, d = self.INDEX
        if out.shape[1] > h and out.shape[2] > d:
            out[row, h, d] += torch.tensor(0.5, dtype=out.dtype)
        return out


class CalculatorCodec(GoldenBackend):
    """The golden under golden.codec.PYPTO_CALCULATOR_CODEC, declaring that codec."""
    name = "tests/cases/run_doubles.py:CalculatorCodec"

    def __init__(self) -> None:
        from golden.codec import PYPTO_CALCULATOR_CODEC
        super().__init__(codec=PYPTO_CALCULATOR_CODEC)
