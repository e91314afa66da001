"""The weights readout: a case on which the kernel's output *is* its attention weights.

A fault model can only name a defect someone wrote down; the readout measures what the kernel does. On the
readout case every V token of every batch is a one-hot code (1.0 in its own channel, 0 elsewhere) and
v_scale is 1, so by SPEC §2.3 a row's output is ``sum_t w_t * onehot(t)``: channel ``c`` holds the weight
the row gave token ``c``. One extra channel is 1 in every cell no row may read (SPEC §1: garbage, spare
blocks; K's codes there are set to 0, so the weight is read, not the garbage), so weight put there is seen
too, and one channel is 1 nowhere (a weighted sum of V's rows is 0 there). K, its scales, the softmax scale and every shape are the
case's, so the scores, the mask, the tile walk, the online update and P's quantization all still shape
the weights; the golden on the same case gives the spec's weights. A case of more tokens than one call's
channels is read in windows, one kernel call each (the other tokens' weight summed in a ``rest`` channel).
A batch is read with the cells past its length in its last block (garbage by SPEC §1, K's codes 0 there
too) as tokens of its own, when they fit: a row that reads on to its block's end then reads as a prefix
longer than its visible length, located as below, not as weight gone elsewhere.

Comparing the two row by row says where a failing row's weight went, in SPEC §2's terms:

- to cells of another batch, or to cells no row may read: **paging** (SPEC §2.2);
- to its own batch's first m' tokens where the spec has m (the visible length, SPEC §2.1), in the spec's
  proportions renormalized (properties/diagnosis/walks.py): ends moved to a multiple of s2_tile next to the row's
  (or the batch's) length are **the tile walk**, and so are rows of one batch that all see the same first
  tokens, a multiple of the block size, whatever their position, and rows that see each tile's first
  tokens; rows of one batch that no one length explains otherwise are the causal offset, and every batch
  off by the same count is the visible length (**visible length**); batches off by different counts, or
  one batch off while those read beside it are right, are a batch's length (**lengths and paging**); a
  row empty by SPEC §2.1 that sees its batch's first tokens counts here too;
- to the right tokens, but not in the right proportions: the ratio kernel / spec of each token's weight
  is then a pattern. One factor for the whole row is a normalization (not located: l, the online update's
  l and the output all scale a row alike); one factor per tile is **the online update** (SPEC §2.3's
  rescale); a ratio exponential in the token's score is the scores' scale (**MM1 scales**).
- other rows empty by SPEC §2.5 that are not zero: **empty rows**; a row that holds another head's weights of
  the same query position (told apart from its own): the **GQA head map**.

A row whose weights do not sum to the spec's (within 2^-5) is no weighting of V's rows (its output was
scaled or added to afterwards): where its weight went then names no stage, only its proportions are read.

A pattern fits when its residual is within two E4M3 half-steps and a bf16 half-step in log terms (the
spec's and the kernel's weight each carry one E4M3 rounding of P: |log(1 + 2^-4)| each, SPEC §2.3 and §3;
the output one bf16 rounding, 2^-8): a classifier's tolerance, not an acceptance bound (the rule has
already failed the case). The readout names a stage only when the rows it can read agree on one;
otherwise it says what it measured. It applies when the tokens of one failing batch fit its windows; a
case of smaller head_dim is read at READOUT_HEAD_DIM (made afresh from its config and seed: explicit
tensors of a captured case are kept only when its head_dim is already READOUT_HEAD_DIM).
"""
from __future__ import annotations

import collections
import dataclasses
import math

import torch

from pfa_verify import golden
from pfa_verify.golden.paging import ceil_div, token_slots, visible_lengths
from pfa_verify.properties.diagnosis.ablations import replaced_config
from pfa_verify.properties.diagnosis.walks import prefix_stage, tile_prefix
from pfa_verify.properties.rule.case import Case

__all__ = ["Readout", "Location", "READOUT_HEAD_DIM", "readout_case", "locate"]

#: The head_dim of the readout case (the largest the strategies draw): a channel a token, three kept (blank, rest, unread).
READOUT_HEAD_DIM = 128
#: A log-ratio residual within two E4M3 half-steps and one bf16 half-step (see the module docstring).
FIT = 2 * math.log1p(2.0 ** -4) + 2.0 ** -8
#: Weight below this share of a row's largest is not read (P8's subnormals and flush to 0 live there).
FAINT = 2.0 ** -7


@dataclasses.dataclass(frozen=True)
class Readout:
    """The readout of a case: one kernel call a window (``cases[j]``), window j reading the weights of the
    tokens ``windows[j]`` (indices into ``batch_of`` / ``token_of``, the tokens read: whole batches, the
    failing first). In every window channel ``rest`` is 1 in the other cells a row may read (tokens of
    other windows or batches), channel ``unread`` in the cells no row may read, and channel ``blank`` in
    none: a weighted sum of V's rows is 0 there."""
    cases: tuple[Case, ...]
    windows: tuple[tuple[int, ...], ...]
    batch_of: tuple[int, ...]
    token_of: tuple[int, ...]
    rest: int
    unread: int
    blank: int


@dataclasses.dataclass(frozen=True)
class Location:
    """What the readout measured: ``stage`` (None: no stage is located) and ``evidence`` in words."""
    stage: str | None
    evidence: str
    weights_right: bool = False     # every failing row read holds the spec's weights (the readout passes)

    def to_dict(self) -> dict[str, object]:
        return {"stage": self.stage, "evidence": self.evidence}


def readout_case(case: Case, batches: list[int] | None = None, *, max_calls: int = 4) -> Readout | None:
    """The readout of ``case`` (module docstring) in at most ``max_calls`` windows, reading the tokens of
    ``batches`` (the failing ones, the shortest first; None: every batch) and then of as many other
    batches as fit; None when the first batch's tokens do not fit."""
    c = case.config
    d = max(c.head_dim, READOUT_HEAD_DIM)
    width = d - 3                                # channels d-3 (no V row), d-2 (rest), d-1 (unread)
    if d != c.head_dim:
        config = replaced_config(c, head_dim=d)
        if config is None:
            return None
        case = Case(config, seed=case.seed)
    failing = sorted(batches or [], key=lambda b: c.lengths[b])        # the shortest failing batch fits best
    order = list(dict.fromkeys([*failing, *range(c.batch)]))
    # A batch is read with the cells past its length in its last block (SPEC §1: garbage) when they fit: a
    # row that reads on to its block's end then reads as a longer prefix, not as weight gone elsewhere.
    bs = c.block_size
    for tails in (True, False):
        span = [ceil_div(n, bs) * bs if tails else n for n in c.lengths]
        room, read = max_calls * width, list[int]()
        for b in order:
            if span[b] <= room - sum(span[x] for x in read):
                read.append(b)
            elif not read:
                break
        if read:
            break
    else:
        return None
    t = case.inputs().tensors()
    spans = torch.tensor(span, dtype=torch.int64)
    lengths = t["kv_act_seqs"].to(torch.int64)
    batch, token, block, row = token_slots(t["block_table"], spans.to(torch.int32), bs)
    valid = token < lengths[batch]                       # SPEC §2.2's tokens; the others are tail cells
    in_read = torch.isin(batch, torch.tensor(read, dtype=torch.int64))
    cells = valid | in_read                              # the tokens given a channel or the rest channel
    picked = torch.cat([torch.nonzero(batch == b)[:, 0] for b in read]) if read else torch.zeros(0, dtype=torch.long)
    if not picked.numel():
        return None
    one = golden.SPEC_CODEC.to_fp8(torch.ones(())).view(torch.uint8)
    unread = torch.ones(t["k_cache"].shape[:2], dtype=torch.bool)
    unread[block[valid], row[valid]] = False
    k, k_scale = t["k_cache"].clone(), t["k_scale"].clone()
    k.view(torch.uint8)[unread] = 0             # unread cells score 0: their weight is read, not their garbage
    k_scale[unread] = 1.0
    not_cells = unread.clone()
    not_cells[block[cells], row[cells]] = False
    cases, windows = [], []
    for start in range(0, picked.numel(), width):
        window = picked[start:start + width]
        v = torch.zeros_like(t["v_cache"].view(torch.uint8))
        v[block[cells], row[cells], :, d - 2] = one
        v[block[window], row[window], :, d - 2] = 0
        v[block[window], row[window], :, torch.arange(window.numel())] = one
        v[..., d - 1][not_cells] = one
        cases.append(dataclasses.replace(case, name=None, explicit={
            **t, "k_cache": k, "k_scale": k_scale, "v_cache": v.view(torch.float8_e4m3fn),
            "v_scale": torch.ones_like(t["v_scale"])}))
        windows.append(tuple(range(start, start + window.numel())))
    return Readout(tuple(cases), tuple(windows), tuple(batch[picked].tolist()), tuple(token[picked].tolist()), d - 2, d - 1, d - 3)


def _stitched(readout: Readout, outs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 [B*S1, NQ, n]: each row's weight of each token read, float64 [B*S1, NQ]: its weight on
    cells of no token read, unread cells included), from the windows' outputs."""
    n = len(readout.batch_of)
    w = torch.zeros(*outs[0].shape[:2], n, dtype=torch.float64)
    for window, out in zip(readout.windows, outs, strict=True):
        w[..., list(window)] = out.double()[..., :len(window)]
    first = outs[0].double()
    others = torch.ones(n, dtype=torch.bool)
    others[list(readout.windows[0])] = False
    rest, outside = first[..., readout.rest], w[..., others].sum(-1)
    # Each output carries a bf16 rounding and the kernel's own summation order (a step, 2^-8 relative): the
    # rest channel's and every other window's weight; what the difference holds beyond them is weight on
    # cells not read.
    noise = 2.0 ** -8 * (rest + w[..., others].abs().sum(-1))
    elsewhere = (rest - outside).abs() - noise
    return w, elsewhere.clamp(min=0) + first[..., readout.unread].abs()


def _fits(log_ratio: torch.Tensor, groups: torch.Tensor | None = None) -> bool:
    """Whether ``log_ratio`` is one constant (per group of ``groups``) within FIT."""
    if groups is None:
        return bool((log_ratio - log_ratio.median()).abs().max() <= FIT)
    return all(_fits(log_ratio[groups == g]) for g in set(groups.tolist()))


def _affine_fit(log_ratio: torch.Tensor, scores: torch.Tensor) -> float | None:
    """The slope of ``log_ratio`` against ``scores`` when a line fits within FIT and is not flat, else None."""
    if scores.numel() < 3 or float(scores.max() - scores.min()) <= 0:
        return None
    a = torch.stack([scores, torch.ones_like(scores)], dim=1)
    slope, offset = torch.linalg.lstsq(a, log_ratio[:, None]).solution[:, 0].tolist()
    resid = log_ratio - (slope * scores + offset)
    spread = float(scores.max() - scores.min())
    return slope if bool(resid.abs().max() <= FIT) and abs(slope) * spread > 2 * FIT else None


def locate(readout: Readout, outs: list[torch.Tensor], expected: list[torch.Tensor],
           mismatches: list[torch.Tensor]) -> Location:
    """Where the weight of the failing rows went: ``outs`` are the kernel's outputs on the readout's cases,
    ``expected`` the golden's, ``mismatches`` the rule's mismatch masks of the two (one a window)."""
    c = readout.cases[0].config
    t = readout.cases[0].explicit or readout.cases[0].inputs().tensors()    # every tensor is explicit there
    s1, nq = c.s1, c.nq
    batch_of, token_of = torch.tensor(readout.batch_of), torch.tensor(readout.token_of)
    seen_by = visible_lengths(t["kv_act_seqs"], s1).reshape(-1)              # [B*S1]
    blank = torch.stack([o.double()[..., readout.blank].abs() for o in outs]).amax(dim=0)     # [B*S1, NQ]
    finite = torch.stack([torch.isfinite(o).reshape(o.shape[0], nq, -1).all(dim=-1) for o in outs]).all(dim=0)
    w_k, elsewhere_k = _stitched(readout, outs)
    w_s, _ = _stitched(readout, expected)
    scores = _scores(t, readout, c)                                          # [B*S1, NQ, n]
    rows_read = torch.isin(torch.arange(c.batch).repeat_interleave(s1), torch.tensor(sorted(set(readout.batch_of))))
    failing_mask = torch.stack([m.reshape(m.shape[0], nq, -1).any(dim=-1) for m in mismatches]).any(dim=0)
    failing = (failing_mask & rows_read[:, None]).nonzero().tolist()
    if not failing:
        return Location(None, "the weights readout passes: the kernel weighs the tokens as the spec does",
                        weights_right=True)
    votes: collections.Counter[str] = collections.Counter()
    said: dict[str, str] = {}
    shifts: dict[tuple[int, int], tuple[int, int, int]] = {}   # (batch, query row) -> (seen from, to, visible)
    prefix_rows = 0
    for flat, h in failing:
        b, i = divmod(flat, s1)
        m = int(seen_by[flat])
        own = batch_of == b
        visible = own & (token_of < m)
        kw, sw = w_k[flat, h], w_s[flat, h]
        top = float(kw.abs().max()) if kw.numel() else 0.0
        sees_own = bool((kw[own] != 0).any()) and float(elsewhere_k[flat, h]) + float(kw[~own].abs().sum()) == 0
        if m == 0 and not sees_own:            # (one that sees its batch's first tokens: the visible length, below)
            votes["empty rows"] += 1
            said["empty rows"] = "rows that see no token (SPEC §2.5) are not zero"
            continue
        if float(blank[flat, h]) > 0:
            votes[""] += 1
            said.setdefault("", f"rows hold a value in a channel no V row holds (row b={b} i={i} h={h}): the output "
                                "is not a weighted sum of V's rows (SPEC §2.3)")
            continue
        if not bool(finite[flat, h]):
            votes[""] += 1
            said.setdefault("", f"rows that see tokens are not finite (row b={b} i={i} h={h})")
            continue
        # Another head's weights at the same position, told apart from its own (rows alike say nothing)
        tol = 2.0 ** -7 * max(float(sw.abs().max()), 1e-30)
        alike = (w_s - kw).abs().amax(dim=-1) <= tol                      # [B*S1, NQ]
        alike &= (w_s - sw).abs().amax(dim=-1) > 4 * tol
        same = alike.nonzero().tolist()
        if same and all(f == flat for f, _ in same):
            votes["GQA head map"] += 1
            said["GQA head map"] = f"query head {h}'s row holds query head {same[0][1]}'s weights"
            continue
        # A weighting of V's rows sums to what the spec's does: a conforming kernel's sum differs by each
        # channel's bf16 rounding and its summation order (about 2^-8); 2^-5 only withholds names beyond
        # that. A row that does not is scaled or added to after the weighting, and where its weight went
        # says nothing of a stage.
        mass_k, mass_s = float(kw.sum() + elsewhere_k[flat, h]), float(sw.sum())
        ratio_only = abs(mass_k - mass_s) > 2.0 ** -5 * max(mass_s, 1e-30)
        elsewhere = float(kw[~own].abs().sum()) + float(elsewhere_k[flat, h])
        # Which of its batch's tokens the row sees: the kernel's nonzero weights, against the spec's visible
        # tokens that are not faint (P8 may flush a faint weight to 0, in the kernel as in the spec).
        kw_own, sw_own = kw[own], sw[own]
        solid = sw_own > FAINT * float(sw_own.abs().max()) if bool(own.any()) else sw_own > 0
        seen = kw_own != 0
        if ratio_only and (elsewhere > FAINT * max(top, 1e-30) or bool((solid & ~seen).any())):
            votes[""] += 1
            said.setdefault("", f"row b={b} i={i} h={h}'s weights sum to {mass_k:.3g}, the spec's to {mass_s:.3g}: "
                                "not a weighting of V's rows")
            continue
        if elsewhere > FAINT * max(top, 1e-30):
            both_solid = seen & solid
            if bool(solid.any()) and not bool((solid & ~seen).any()) and _fits((kw_own[both_solid] / sw_own[both_solid]).log()):
                # every token it should see, in proportion, and more past them: a length read too long or a
                # tile read whole; reading the wrong blocks would lose some of its own
                votes[""] += 1
                said.setdefault("", f"row b={b} i={i} h={h} weighs every token it sees by SPEC §2.1 in proportion, and "
                                    f"puts {elsewhere:.2g} of its weight on cells past them (a length or a tile read too far)")
                continue
            votes["paging"] += 1
            said["paging"] = ("rows put weight on tokens of another batch or on cells no row may read, and miss or "
                              f"misweigh some of their own (row b={b} i={i} h={h}: {elsewhere:.2g} of its weight elsewhere)")
            continue
        upto = int(seen.nonzero().max()) + 1 if bool(seen.any()) else 0
        missed = bool((solid & ~seen).any())
        if upto == 0:
            votes[""] += 1
            said.setdefault("", f"rows are 0 where the spec's see tokens (row b={b} i={i} h={h})")
            continue
        if upto > m or missed:
            gaps = bool((~seen[:upto] & solid[:upto]).any())
            both_solid = seen & solid
            renormalized = m == 0 or (bool(both_solid.any()) and _fits((kw_own[both_solid] / sw_own[both_solid]).log()))
            if not gaps and renormalized:
                # the count it sees lies in [upto, the first solid token it misses]: faint ones may be flushed
                after = (solid & ~seen).nonzero()
                shifts[(b, i)] = (upto, int(after.min()) if upto < m and after.numel() else upto, m)
                prefix_rows += 1
                continue
            first = tile_prefix(token_of[own], seen, solid, m, c.s2_tile)
            if gaps and first is not None and renormalized:
                votes["the tile walk"] += 1
                said["the tile walk"] = (f"each s2_tile tile of a row's tokens gives only its first {first} (row b={b} "
                                         f"i={i} h={h}), in the spec's proportions renormalized")
                continue
            votes[""] += 1
            held = token_of[own][seen].tolist()
            if not gaps:
                said.setdefault("", f"row b={b} i={i} h={h} weighs its batch's first {upto} tokens, not in the spec's "
                                    "proportions renormalized (a token read twice, or one read from elsewhere)")
                continue
            said.setdefault("", f"row b={b} i={i} h={h} weighs tokens {held[:8]}{'...' if len(held) > 8 else ''} of its "
                                f"batch, not its first {m} (SPEC §2.1)")
            continue
        both = visible & (kw > FAINT * top) & (sw > FAINT * float(sw.abs().max()))
        if int(both.sum()) < 2:
            continue
        log_ratio = (kw[both] / sw[both]).log()
        if _fits(log_ratio):
            votes[""] += 1
            said.setdefault("", f"row b={b} i={i} h={h} weighs its tokens in the spec's proportions, "
                                f"scaled by {math.exp(float(log_ratio.median())):.3g} (a normalization)")
            continue
        tiles = token_of[both] // c.s2_tile
        if len(set(tiles.tolist())) > 1 and _fits(log_ratio, tiles):
            votes["online update"] += 1
            said["online update"] = "each tile's weights are in the spec's proportions, the tiles' factors are not"
            continue
        slope = _affine_fit(log_ratio, scores[flat, h][both])
        if slope is not None:
            votes["MM1 scales"] += 1
            said["MM1 scales"] = f"the weights are those of scores scaled by {1 + slope:.3g} (row b={b} i={i} h={h})"
            continue
        votes[""] += 1
        said.setdefault("", f"row b={b} i={i} h={h}: the ratio of its weights to the spec's is not one factor, "
                            "one factor a tile, or exponential in the score")
    if shifts:
        failed = {flat // s1 for flat, _ in failing}
        right = {b for b in set(readout.batch_of) if b not in failed and c.lengths[b] > 0}
        stage, words = prefix_stage(shifts, c, list(c.lengths), right)
        votes[stage or ""] += prefix_rows
        said[stage or ""] = words
    return _verdict(votes, said, len(failing))


def _verdict(votes: collections.Counter[str], said: dict[str, str], failing: int) -> Location:
    """A stage when one has every vote that names a stage and at least half the failing rows."""
    named = {s: v for s, v in votes.items() if s}
    unread = votes.get("", 0)
    if len(named) == 1:
        stage, v = next(iter(named.items()))
        if v * 2 >= failing and v > unread:
            return Location(stage, f"the weights readout: {said[stage]} ({v} of {failing} failing rows)")
    parts = [f"{said[s]} ({v} rows)" for s, v in votes.most_common(3)]
    return Location(None, "the weights readout: " + "; ".join(parts) if parts else "the weights readout: nothing read")


def _scores(t: dict[str, torch.Tensor], readout: Readout, c: golden.PagedAttentionConfig) -> torch.Tensor:
    """float64 [B*S1, NQ, n]: each row's score of each channel's token (SPEC §2.3's S, softmax-scaled),
    0 for a token of another batch."""
    decode = golden.SPEC_CODEC.from_fp8
    q = decode(t["q"]).double() * t["q_scale"].double()                     # [B*S1, NQ, D]
    block_table = t["block_table"].long()
    b, tok = torch.tensor(readout.batch_of), torch.tensor(readout.token_of)
    blk, row = block_table[b, tok // c.block_size], tok % c.block_size
    k = decode(t["k_cache"][blk, row]).double() * t["k_scale"][blk, row].double()   # [n, NKV, D]
    group = c.nq // c.nkv
    kh = k[:, torch.arange(c.nq) // group]                                   # [n, NQ, D]
    scale = c.softmax_scale if c.softmax_scale is not None else c.head_dim ** -0.5
    s = torch.einsum("rhd,nhd->rhn", q, kh) * scale
    own = (torch.arange(c.batch).repeat_interleave(c.s1)[:, None] == b[None, :])
    return torch.where(own[:, None, :], s, 0.0)
