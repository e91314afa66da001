"""The V-scale readout: a case on which the kernel's output *is* the ``v_scale`` entry it applied.

The weights readout (properties/readout.py) holds ``v_scale`` at 1, so a kernel that weighs every token
right and then applies another batch's, head's or channel's V scale reads as right there. This readout
makes SPEC §2.3's MM2 and its V scale the only part of the computation left to matter:

- every K code of the cache is 0, so every score is 0 (SPEC §2.3: ``S = 0`` whatever the scales), every
  tile's max is 0, ``P = exp(0) = 1`` exactly, its E4M3 code is 448 with ``p_scale = 1/448``, and the
  online update's factors are ``exp(0) = 1``: the scores, the softmax, P's quantization and the update
  cannot matter;
- every V code of the cache is 1.0, so whichever tokens a row reads (its own, another batch's, garbage
  cells), ``O = l * 448 * p_scale * v_scale``: the paging and the lengths cannot matter either, except
  for rows SPEC §2.5 leaves empty;
- ``v_scale[b, n, c]`` is a distinct bf16 value for every entry (:func:`entry_values`: a power of two
  times one of 128 mantissas), so a row's output channel ``c``, ``O / l`` rounded to bf16, is exactly the
  entry the kernel applied there, and the entry can be read back from the value.

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

import golden
from golden.paging import visible_lengths
from properties.case import Case
from properties.readout import Location

__all__ = ["ScaleReadout", "ScaleReading", "scale_readout_case", "entry_values", "read_scales", "combine",
           "MAX_ENTRIES"]

#: Mantissas a binade: adjacent entries differ by at least 2^-6 relative, so an entry is still read back
#: when the output carries two bf16 roundings more than the spec codec's (2^-8 relative: a codec whose
#: ``P8 * p_scale`` is not 1, pypto's calculator, where ``P = 1`` encodes to 240, not 448).
MANTISSAS = 32
#: Entries a readout can tell apart: :data:`MANTISSAS` a binade, binades 2^-120 .. 2^120 (bf16 normal
#: numbers whose products with ``P8 * p_scale`` and a division by ``l`` stay normal float32).
MAX_ENTRIES = MANTISSAS * 240
#: How far (relative) a value may lie from an entry and still be read as it: half the entries' spacing.
READ_BACK = 2.0 ** -7


def entry_values(entries: int) -> torch.Tensor:
    """float32 [entries]: distinct bf16-exact positive values, entry ``k`` is ``2^(k // M - e0) * (1 +
    (k % M) / M)`` for M = :data:`MANTISSAS`, ``e0`` centring the binades on 1 (ValueError past
    :data:`MAX_ENTRIES`)."""
    if not 0 < entries <= MAX_ENTRIES:
        raise ValueError(f"entries={entries} must be in 1..{MAX_ENTRIES} (one bf16 value each)")
    k = torch.arange(entries)
    e0 = (entries - 1) // MANTISSAS // 2
    return (torch.pow(2.0, (k // MANTISSAS - e0).double()) * (1 + (k % MANTISSAS).double() / MANTISSAS)).float()


@dataclasses.dataclass(frozen=True)
class ScaleReadout:
    """The readout case (one kernel call) and the v_scale entry values it carries ([B, NKV, D])."""
    case: Case
    values: torch.Tensor


def scale_readout_case(case: Case) -> ScaleReadout | None:
    """The V-scale readout of ``case`` (module docstring): its shapes, lengths, tiles and block table, K's
    codes 0, V's codes 1.0, ``v_scale`` the :func:`entry_values`; None when the entries do not fit."""
    c = case.config
    entries = c.batch * c.nkv * c.head_dim
    if entries > MAX_ENTRIES or not any(c.lengths):
        return None
    t = case.inputs().tensors()
    one = golden.SPEC_CODEC.to_fp8(torch.ones(()))
    values = entry_values(entries).reshape(c.batch, c.nkv, c.head_dim)
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
    rule's mask against the golden's ``expected`` there) holds, on the rows that see tokens and are not 0.
    Values are read relative to the golden's own unit (``expected`` over the entry it carries: 1 under the
    spec codec), to the nearest entry within :data:`READ_BACK`."""
    c = readout.case.config
    t = readout.case.explicit or {}
    group = c.nq // c.nkv
    cur = visible_lengths(t["kv_act_seqs"], c.s1).reshape(-1)                      # [B*S1]
    y = out.float()
    rows_seeing = (cur > 0)[:, None, None].expand_as(y)
    nonzero_row = (y != 0).any(dim=-1, keepdim=True).expand_as(y)
    failing = mismatch & rows_seeing & nonzero_row
    if not bool(failing.any()):
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
    if bool(found.all()):
        entry = order[nearer]
        nkv, d = c.nkv, c.head_dim
        b_read, n_read, c_read = entry // (nkv * d), entry // d % nkv, entry % d
        b_own = positions[:, 0] // c.s1
        n_own, c_own = positions[:, 1] // group, positions[:, 2]
        wrong = {name for name, read, own in (("batch", b_read, b_own), ("head", n_read, n_own),
                                              ("channel", c_read, c_own)) if bool((read != own).any())}
        first = int((b_read != b_own).logical_or(n_read != n_own).logical_or(c_read != c_own).nonzero()[0])
        r, h, ch = positions[first].tolist()
        example = (f"row b={r // c.s1} i={r % c.s1} h={h} channel {ch} carries v_scale[{int(b_read[first])}, "
                   f"{int(n_read[first])}, {int(c_read[first])}], not v_scale[{r // c.s1}, {h // group}, {ch}]")
        heads = sorted(set(n_read[n_read != n_own].tolist()))
        also = f"; the KV heads read in place of the spec's: {heads[:6]}" if "head" in wrong else ""
        return ScaleReading(False, frozenset(wrong), False,
                            f"the V-scale readout: {_elements(int(failing.sum()), 'carries', 'carry')} another entry's v_scale "
                            f"(its {', '.join(sorted(wrong))} index differs): {example}{also}")
    ratio = got / readout.values[positions[:, 0] // c.s1, positions[:, 1] // group, positions[:, 2]]
    row_cur = cur[positions[:, 0]].float()
    if bool(((ratio - row_cur).abs() <= 2.0 ** -7 * row_cur).all()):
        return ScaleReading(False, frozenset(), True, "the V-scale readout: each failing row is its v_scale times its "
                            "visible length cur, which is O not divided by l (SPEC §2.4)", undivided=True)
    spread = f"{float(ratio.min()):.4g}" + ("" if float(ratio.min()) == float(ratio.max()) else f" to {float(ratio.max()):.4g}")
    return ScaleReading(False, frozenset(), True, f"the V-scale readout: {_elements(int((~found).sum()), 'is', 'are')} no v_scale "
                        f"entry: the spec's times {spread} (scaled after MM2)")


def _elements(n: int, one: str, many: str) -> str:
    return f"{n} element {one}" if n == 1 else f"{n} elements {many}"


def combine(weights: Location | None, scales: ScaleReading | None) -> Location | None:
    """One location from both readouts (either may not have run). The V scale is named when its readout
    finds another batch's, head's or channel's entry while the weights readout passed (the weights are the
    spec's: SPEC §2.3's MM2 and its V scale alone are left); a location of the weights readout stands
    unless the V-scale readout says the rows came from another batch while the weights readout says
    paging (an output row written to another row looks the same to both: no stage); an undivided O is
    named (the output, SPEC §2.4) when the weights readout located nothing."""
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
        if "batch" in scales.wrong and weights.stage in ("paging", "lengths and paging"):
            return Location(None, text)
        return Location(weights.stage, text)
    if scales.undivided and weights.stage is None:
        return Location("output", text)
    return Location(weights.stage, text)
