"""The V-scale readout: a case on which the kernel's output *is* the ``v_scale`` entry it applied.

The weights readout (properties/diagnosis/readout.py) holds ``v_scale`` at 1, so a kernel that weighs every token
right and then applies another batch's, head's or channel's V scale reads as right there. This readout
makes SPEC §2.3's MM2 and its V scale the only part of the computation left to matter:

- every K code of the cache is 0, so every score is 0 (SPEC §2.3: ``S = 0`` whatever the scales), every
  tile's max is 0, ``P = exp(0) = 1`` exactly, its E4M3 code is 448 with ``p_scale = 1/448``, and the
  online update's factors are ``exp(0) = 1``: the scores, the softmax, P's quantization and the update
  cannot matter;
- every V code of the cache is 1.0, so whichever tokens a row reads (its own, another batch's, garbage
  cells), ``O = l * 448 * p_scale * v_scale``: the paging and the lengths cannot matter either, except
  for rows SPEC §2.5 leaves empty;
- ``v_scale[b, n, c]`` is a distinct bf16 value for every entry (:func:`entry_values`: a power of two from
  2^-6 up times one of 32 mantissas), so a row's output channel ``c``, ``O / l`` rounded to bf16, is
  exactly the entry the kernel applied there, and the entry can be read back from the value.

So each output element of a row that sees tokens names the ``(b', n', c')`` of the scale it carries: its
own (SPEC §2.3: ``v_scale[b, h // (NQ / NKV), c]``), another entry (which index the kernel got wrong), or
no entry at all (the output is scaled after the division: a factor, read per row; the visible length
``cur`` there is ``O`` left undivided by ``l``, SPEC §2.4). One kernel call. Like the weights readout
it measures and names a stage only where the measurement is unambiguous (:func:`combine`); it never
decides a verdict.
"""
from __future__ import annotations

import dataclasses

import torch

from pfa_verify import golden
from pfa_verify.golden.paging import visible_lengths
from pfa_verify.properties.diagnosis.readout import Location
from pfa_verify.properties.rule.case import Case

__all__ = ["ScaleReadout", "ScaleReading", "scale_readout_case", "entry_values", "max_entries", "read_scales",
           "combine", "MANTISSAS", "LOWEST"]

#: Mantissas a binade: adjacent entries differ by at least 2^-6 relative, so an entry is still read back
#: when the output carries two bf16 roundings more than the spec codec's (2^-8 relative: a codec whose
#: ``P8 * p_scale`` is not 1, pypto's calculator, where ``P = 1`` encodes to 240, not 448).
MANTISSAS = 32
#: The smallest entry's binade: adjacent entries there differ by 2^-6 / 33 (4.7e-4), more than SPEC §4's
#: tolerance at that size (1e-4 + 2^-6 / 128 = 2.2e-4), so the rule sees an entry read in place of another.
LOWEST = -6
#: How far (relative) a value may lie from an entry and still be read as it: half the entries' spacing.
READ_BACK = 2.0 ** -7


def max_entries(longest: int) -> int:
    """How many entries a case whose longest batch holds ``longest`` tokens can tell apart: :data:`MANTISSAS`
    a binade from 2^:data:`LOWEST` up to the binade whose values, times the ``l`` they are summed over
    before the division (up to ``longest``, and ``P8 * p_scale`` up to about 1), stay below 2^125 (float32's
    largest binade is 2^127: a factor of 4 to spare)."""
    top = 125 - max(1, longest).bit_length() - 1
    return MANTISSAS * max(0, top - LOWEST + 1)


def entry_values(entries: int, longest: int) -> torch.Tensor:
    """float32 [entries]: distinct bf16-exact positive values, entry ``k`` is ``2^(LOWEST + k // M) * (1 +
    (k % M) / M)`` for M = :data:`MANTISSAS` (ValueError past :func:`max_entries` of ``longest``)."""
    if not 0 < entries <= max_entries(longest):
        raise ValueError(f"entries={entries} must be in 1..{max_entries(longest)} for batches of up to {longest} "
                         "tokens (one bf16 value each)")
    k = torch.arange(entries)
    return (torch.pow(2.0, (LOWEST + k // MANTISSAS).double()) * (1 + (k % MANTISSAS).double() / MANTISSAS)).float()


@dataclasses.dataclass(frozen=True)
class ScaleReadout:
    """The readout case (one kernel call) and the v_scale entry values it carries ([B, NKV, D])."""
    case: Case
    values: torch.Tensor


def scale_readout_case(case: Case) -> ScaleReadout | None:
    """The V-scale readout of ``case`` (module docstring): its shapes, lengths, tiles and block table, K's
    codes 0, V's codes 1.0, ``v_scale`` the :func:`entry_values`; None when the entries do not fit."""
    c = case.config
    entries, longest = c.batch * c.nkv * c.head_dim, max(c.lengths, default=0)
    if entries > max_entries(longest) or not longest:
        return None
    t = case.inputs().tensors()
    one = golden.SPEC_CODEC.to_fp8(torch.ones(()))
    values = entry_values(entries, longest).reshape(c.batch, c.nkv, c.head_dim)
    explicit = {**t, "k_cache": torch.zeros_like(t["k_cache"].view(torch.uint8)).view(torch.float8_e4m3fn),
                "k_scale": torch.ones_like(t["k_scale"]),
                "v_cache": one.view(torch.uint8).expand(t["v_cache"].shape).contiguous().view(torch.float8_e4m3fn),
                "v_scale": values.clone()}
    return ScaleReadout(dataclasses.replace(case, name=None, explicit=explicit), values)


@dataclasses.dataclass(frozen=True)
class ScaleReading:
    """What the V-scale readout measured on the rows that see tokens (SPEC §2.1): ``wrong`` names the
    indices of the entries read in place of the spec's (a subset of "batch", "head", "channel"; empty when
    every failing element carries a value that is no entry, or none fails), ``factor`` is True when the
    failing elements are no entry at all, ``evidence`` says it in words."""
    passes: bool
    wrong: frozenset[str]
    factor: bool
    evidence: str
    undivided: bool = False         # each failing row is its v_scale times its visible length: O / l not taken


def read_scales(readout: ScaleReadout, out: torch.Tensor, mismatch: torch.Tensor,
                expected: torch.Tensor) -> ScaleReading:
    """Read the entries ``out`` (the kernel's output on the readout case) carries where ``mismatch`` (the
    rule's mask against the golden's ``expected`` there) holds, on the rows that see tokens. Values are read
    relative to the golden's own unit (``expected`` over the entry it carries: 1 under the spec codec), to
    the nearest entry within :data:`READ_BACK`. A row that sees tokens and is 0 carries no entry: it is
    counted, and the readout does not pass."""
    c = readout.case.config
    t = readout.case.explicit or {}
    group = c.nq // c.nkv
    cur = visible_lengths(t["kv_act_seqs"], c.s1).reshape(-1)                      # [B*S1]
    y = out.float()
    rows_seeing = (cur > 0)[:, None, None].expand_as(y)
    zero_row = ~(y != 0).any(dim=-1, keepdim=True).expand_as(y)
    zero_rows = int((mismatch & rows_seeing & zero_row).any(dim=-1).sum())
    zeros = (f"; {zero_rows} row{'s' if zero_rows != 1 else ''} that see tokens {'are' if zero_rows != 1 else 'is'} "
             "0 (no entry to read)") if zero_rows else ""
    failing = mismatch & rows_seeing & ~zero_row
    if not bool(failing.any()):
        if zero_rows:
            return ScaleReading(False, frozenset(), False, "the V-scale readout: " + zeros[2:])
        return ScaleReading(True, frozenset(), False, "the V-scale readout passes: every row that sees tokens "
                            "carries its own v_scale entries")
    own = readout.values[:, torch.arange(c.nq) // group].repeat_interleave(c.s1, dim=0)     # [B*S1, NQ, D]
    seeing = rows_seeing & (expected.float() != 0)
    unit = float((expected.float()[seeing] / own[seeing]).median()) if bool(seeing.any()) else 1.0
    flat = readout.values.reshape(-1)
    ordered, order = flat.sort()
    got = y[failing] / unit
    right = torch.searchsorted(ordered, got).clamp(max=flat.numel() - 1)
    left = (right - 1).clamp(min=0)
    nearer = torch.where((ordered[left] - got).abs() < (ordered[right] - got).abs(), left, right)
    found = ((ordered[nearer] - got).abs() <= READ_BACK * ordered[nearer]) & torch.isfinite(got)
    positions = failing.nonzero()
    b_own, n_own, c_own = positions[:, 0] // c.s1, positions[:, 1] // group, positions[:, 2]
    entry = order[nearer]
    nkv, d = c.nkv, c.head_dim
    b_read, n_read, c_read = entry // (nkv * d), entry // d % nkv, entry % d
    other = (b_read != b_own) | (n_read != n_own) | (c_read != c_own)
    # every failing element read back as an entry, some of them another's (those read as their own are off
    # by rounding only: a codec whose unit is not 1)
    if bool(found.all()) and bool(other.any()):
        wrong = {name for name, read, mine in (("batch", b_read, b_own), ("head", n_read, n_own),
                                               ("channel", c_read, c_own)) if bool((read[other] != mine[other]).any())}
        first = int(other.nonzero()[0])
        r, h, ch = positions[first].tolist()
        example = (f"row b={r // c.s1} i={r % c.s1} h={h} channel {ch} carries v_scale[{int(b_read[first])}, "
                   f"{int(n_read[first])}, {int(c_read[first])}], not v_scale[{r // c.s1}, {h // group}, {ch}]")
        heads = sorted(set(n_read[n_read != n_own].tolist()))
        also = f"; the KV heads read in place of the spec's: {heads[:6]}" if "head" in wrong else ""
        return ScaleReading(False, frozenset(wrong), False,
                            f"the V-scale readout: {_elements(int(other.sum()), 'carries', 'carry')} another entry's "
                            f"v_scale (its {', '.join(sorted(wrong))} index differs): {example}{also}{zeros}")
    ratio = got / readout.values[b_own, n_own, c_own]
    row_cur = cur[positions[:, 0]].float()
    if not zero_rows and bool(((ratio - row_cur).abs() <= 2.0 ** -7 * row_cur).all()):
        return ScaleReading(False, frozenset(), True, "the V-scale readout: each failing row is its v_scale times its "
                            "visible length cur, which is O not divided by l (SPEC §2.4)", undivided=True)
    spread = f"{float(ratio.min()):.4g}" + ("" if float(ratio.min()) == float(ratio.max()) else f" to {float(ratio.max()):.4g}")
    return ScaleReading(False, frozenset(), True, f"the V-scale readout: {_elements(int(failing.sum()), 'is', 'are')} "
                        f"not another entry: the spec's times {spread} (scaled after MM2){zeros}")


def _elements(n: int, one: str, many: str) -> str:
    return f"{n} element {one}" if n == 1 else f"{n} elements {many}"


def combine(weights: Location | None, scales: ScaleReading | None) -> Location | None:
    """One location from both readouts (either may not have run). The V scale is named when its readout
    finds another batch's, head's or channel's entry while the weights readout passed (the weights are the
    spec's: SPEC §2.3's MM2, its V gather and V scale, are left); another KV head's entry beside the weights
    readout's GQA head map keeps that; another entry beside any other stage names none. A location of the
    weights readout stands otherwise. An undivided O names no stage (l is the row's length cur here: O
    left undivided and an l stuck at 1 read alike); it is said."""
    if scales is None:
        return weights
    if weights is None:
        return Location(None, scales.evidence)
    text = f"{weights.evidence}; {scales.evidence}"
    if scales.passes:
        return Location(weights.stage, text)
    if scales.wrong:
        if weights.weights_right:
            return Location("MM2 and the V scale", text)
        if weights.stage == "GQA head map" and scales.wrong == {"head"}:
            return Location(weights.stage, text)
        # any other stage the weights name is one this readout cannot see (it holds every score 0 and every
        # V code 1.0): both at once are two defects, or one the two read differently (an output row or
        # channel written elsewhere reads as paging there and as another entry here): no stage
        return Location(None, text)
    return Location(weights.stage, text)
