"""How tight the acceptance envelope is (SPEC §4.2), per value distribution.

For kernel-sized cases drawn by ``properties.search.strategies.cases_for`` for our kernel's shapes (derandomized,
one distribution at a time) the envelope of the golden (golden.paged_attention_envelope, spec codec, SPEC
§4.1's model) is compared with SPEC §4's tolerance around the golden:

- ``flippable``: the share of visible P elements whose E4M3 code a conforming kernel may choose
  either way (the proof behind any widening);
- ``widened``: the share of output elements where the envelope reaches past ``g +- tol(g)``;
- ``p99``, ``max``: the envelope's half-width on the wider side, ``max(hi - g, g - lo) / tol(g)``, at
  the 99th percentile and at most (1 or less: the rule is the tolerance);
- ``cost``: the envelope's time over the golden's (the envelope evaluation includes the golden).

``pfa-verify tightness`` prints the table (``--record`` rewrites cases/tightness.json); tests/cases/test_tightness.py holds the shares of a
fixed set of cases to the recorded ones in cases/tightness.json (a share that grows fails).
"""
from __future__ import annotations

import dataclasses
import json
import time

import torch
from rich.table import Table

from pfa_verify import golden
from pfa_verify.cases.data import FOLDER
from pfa_verify.cases.data.collect import generated_cases
from pfa_verify.kernels.config import KERNEL_SHAPES
from pfa_verify.properties.rule.compare import get_tolerance

__all__ = ["Tightness", "measure", "render_table", "RECORDED"]

RECORDED = FOLDER / "tightness.json"


@dataclasses.dataclass
class Tightness:
    distribution: str
    cases: int
    p_elements: int
    flippable: int
    elements: int
    widened: int
    p99: float
    largest: float
    degenerate_rows: int
    golden_s: float
    envelope_s: float

    @property
    def flippable_share(self) -> float:
        return self.flippable / self.p_elements if self.p_elements else 0.0

    @property
    def widened_share(self) -> float:
        return self.widened / self.elements if self.elements else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"flippable_share": self.flippable_share, "widened_share": self.widened_share}


def _cases(distribution: str, count: int, seed: int) -> list:
    """The cases the table measures: ``pfa-verify run``'s generated cases for our kernel's shapes, of
    ``distribution`` only (cases.data.collect.generated_cases: the same whatever else the process imported)."""

    return generated_cases(count, seed, supported=KERNEL_SHAPES, distributions=(distribution,))


def measure(distribution: str, count: int = 20, seed: int = 0) -> Tightness:
    """The envelope's tightness on ``count`` kernel-sized cases of ``distribution`` (``seed``)."""

    rtol, atol = get_tolerance("attention")
    row = Tightness(distribution, 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0.0, 0.0)
    halves = []
    for case in _cases(distribution, count, seed):
        kwargs = case.inputs().kwargs()
        start = time.perf_counter()
        golden.paged_attention_fp8(**kwargs)
        row.golden_s += time.perf_counter() - start
        start = time.perf_counter()
        env = golden.paged_attention_envelope(**kwargs)
        row.envelope_s += time.perf_counter() - start
        g = env.golden.float()
        finite = torch.isfinite(g)
        tol = atol + rtol * g.abs()
        half = torch.maximum(env.hi.float() - g, g - env.lo.float()) / tol
        half = half[finite]
        row.cases += 1
        row.p_elements += env.p_elements
        row.flippable += env.flippable
        row.elements += int(finite.sum())
        row.widened += int((half > 1).sum())
        row.degenerate_rows += env.degenerate_rows
        halves.append(half.flatten())
    if halves:
        every = torch.cat(halves)
        row.p99 = float(every.quantile(0.99)) if every.numel() else 0.0
        row.largest = float(every.max()) if every.numel() else 0.0
    return row


def render_table(rows: list):
    """A rich Table of :class:`Tightness` rows."""
    table = Table(title="envelope tightness (kernel-sized cases, spec codec, SPEC §4.1 model)", title_justify="left")
    for col in ("distribution", "cases", "flippable P", "widened", "p99 half-width / tol", "max", "degenerate rows",
                "envelope / golden time"):
        table.add_column(col, justify="left" if col == "distribution" else "right")
    for r in rows:
        table.add_row(r.distribution, str(r.cases), f"{r.flippable_share:.3%}", f"{r.widened_share:.2%}",
                      f"{r.p99:.2f}", f"{r.largest:.1f}", str(r.degenerate_rows),
                      f"{r.envelope_s / r.golden_s:.2f}x" if r.golden_s else "-")
    return table


def recorded() -> dict:
    """The recorded shares (cases/tightness.json): {distribution: {"cases", "seed", "flippable_share", ...}}."""
    return json.loads(RECORDED.read_text())


def record(count: int = 4, seed: int = 0) -> dict:
    """Measure every distribution and write cases/tightness.json (what tests/cases/test_tightness.py holds)."""
    rows = {d: measure(d, count, seed) for d in golden.DISTRIBUTIONS}
    data = {"cases": count, "seed": seed,
            "distributions": {d: {k: v for k, v in r.to_dict().items()
                                  if k in ("flippable_share", "widened_share", "p99", "largest")}
                              for d, r in rows.items()}}
    RECORDED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data
