"""Laws of FP8 paged attention (SPEC §2-§4) and AT-12 (SPEC §6), as functions of (backend, case).

Each law raises AssertionError (with the message of :mod:`properties.compare`) when it does not hold
and returns None otherwise. tests/properties binds them to strategies; the replay of a captured
regression calls them by name through :data:`LAWS`. :func:`check` is the front door the tests use:
it runs a law and, on failure, captures the case in cases/regressions before re-raising with the
replay command as the message's last line.

Every backend call goes through :func:`call`, which clones the inputs before and asserts after the
call, with ``compare(kind="exact")``, that the backend did not modify them (SPEC: inputs are never
modified).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from properties import compare as cmp
from properties.attribution import attribute
from kernels.backends.golden_backend import GoldenBackend
from properties.case import Case

__all__ = ["LAWS", "law", "call", "check", "poison_unread", "permute_blocks", "repeat_kv_heads",
           "select_batch", "tile_bound"]

LAWS: dict = {}
_GOLDEN = GoldenBackend(loop=False)  # the reference: the vectorized golden


def law(name: str, *, tolerance: str = "attention"):
    """Register a law under ``name`` (the name captured regressions are replayed by)."""
    def register(fn):
        fn.law_name, fn.tolerance = name, tolerance
        LAWS[name] = fn
        return fn
    return register


def split_bundle(bundle) -> tuple[dict, dict]:
    """(tensor kwargs, scalar kwargs) of a bundle, scalars taken from its config."""
    kw = bundle.kwargs()
    tensors = {k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}


def _tags(backend, case) -> dict:
    return {"case": case.label() if isinstance(case, Case) else repr(case), "backend": backend.name}


def call(backend, tensors: dict, *, op: str = "paged_attention_fp8", tags: dict | None = None, **scalars):
    """``backend.<op>(**tensors, **scalars)`` on clones, asserting the originals' clones unchanged."""
    __tracebackhide__ = True
    before = {k: v.clone() for k, v in tensors.items()}
    given = {k: v.clone() for k, v in tensors.items()}
    out = getattr(backend, op)(**given, **scalars)
    for k in tensors:
        cmp.assert_close(given[k], before[k], kind="exact", tags=tags,
                         identifier=f"Input {k} after the {backend.name} call vs before")
    return out


def _fail_context(result, tensors, scalars, backend):
    def lines(res):
        try:
            a = attribute(res.mismatch_mask, tensors, s2_tile=scalars["s2_tile"],
                          softmax_scale=scalars.get("softmax_scale"),
                          codec=getattr(backend, "codec", None))
            return [f"Attribution: {a.render()}"]
        except Exception as exc:  # attribution must never hide the failure it describes
            return [f"Attribution: unavailable ({type(exc).__name__}: {exc})"]
    return lines


def _assert_outputs(actual, expected, *, identifier, backend, case, tensors, scalars, kind="attention",
                    rtol=None, atol=None, target_label=None):
    __tracebackhide__ = True
    s1 = case.config.s1
    res = cmp.compare(actual, expected, kind=kind, rtol=rtol, atol=atol, s1=s1)
    if target_label is not None and res.attribute is None:
        from hypothesis.control import currently_in_test_context
        if currently_in_test_context():
            from hypothesis import target
            r, a = cmp.get_tolerance(kind, rtol, atol)
            both = torch.isfinite(actual.float()) & torch.isfinite(expected.float())
            ratio = ((actual.float() - expected.float()).abs() / (a + r * expected.float().abs()))[both]
            target(float(ratio.max()) if ratio.numel() else 0.0, label=target_label)
    if not res.passed:
        raise AssertionError(cmp.make_mismatch_message(
            res, identifier=identifier, tags=_tags(backend, case),
            context=_fail_context(res, tensors, scalars, backend)(res) if res.attribute is None else ())) from None


# --- input transformations (each returns new tensors; the originals are untouched) -----------------

def read_mask(tensors: dict) -> torch.Tensor:
    """bool [NB, BS]: the cache rows SPEC §2 item 2 reads (row t % BS of block table[b, t // BS])."""
    nb, bs = tensors["k_cache"].shape[:2]
    mask = torch.zeros(nb, bs, dtype=torch.bool)
    for b, n in enumerate(tensors["kv_act_seqs"].tolist()):
        t = torch.arange(n)
        mask[tensors["block_table"][b, t // bs].long(), t % bs] = True
    return mask


def poison_unread(tensors: dict, fill: str) -> dict:
    """Copies with ``fill`` ("nan" or "huge") in every cell the spec says must not reach the output:
    cache rows no row of the table reads (spare blocks, tails of last blocks) and q / q_scale of
    query rows with ``cur == 0`` (their output is 0 whatever q holds, SPEC §2 item 5)."""
    if fill not in ("nan", "huge"):
        raise ValueError(f"fill={fill!r} must be 'nan' or 'huge'")
    out = {k: v.clone() for k, v in tensors.items()}
    unread = ~read_mask(tensors)
    code = 0x7F if fill == "nan" else 0x7E                 # E4M3 NaN, or 448
    scale = float("nan") if fill == "nan" else 1e30
    for name in ("k_cache", "v_cache"):
        out[name].view(torch.uint8)[unread] = code
    out["k_scale"][unread] = scale
    lens = tensors["kv_act_seqs"].tolist()
    s1 = tensors["q"].shape[0] // len(lens)
    for b, n in enumerate(lens):
        for i in range(s1):
            if n - (s1 - 1 - i) <= 0:
                out["q"].view(torch.uint8)[b * s1 + i] = code
                out["q_scale"][b * s1 + i] = scale
    return out


def permute_blocks(tensors: dict, perm: torch.Tensor) -> dict:
    """Copies with physical block p moved to ``perm[p]`` and the table renumbered to match."""
    out = dict(tensors)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm))
    for name in ("k_cache", "k_scale", "v_cache"):
        out[name] = tensors[name][inv].contiguous()
    table = tensors["block_table"]
    out["block_table"] = torch.where(table >= 0, perm[table.clamp(min=0).long()].to(table.dtype), table)
    return out


def repeat_kv_heads(tensors: dict, group: int) -> dict:
    """Copies with every KV head repeated ``group`` times, so NKV = NQ (no grouping left)."""
    out = dict(tensors)
    for name in ("k_cache", "k_scale", "v_cache"):
        out[name] = tensors[name].repeat_interleave(group, dim=2).contiguous()
    out["v_scale"] = tensors["v_scale"].repeat_interleave(group, dim=1).contiguous()
    return out


def select_batch(tensors: dict, b: int, s1: int, kv_len: int | None = None, rows=None) -> dict:
    """The inputs of batch ``b`` alone (query rows ``rows`` of it, default all S1), optionally with
    its length replaced by ``kv_len``."""
    out = dict(tensors)
    idx = list(range(b * s1, (b + 1) * s1)) if rows is None else [b * s1 + r for r in rows]
    out["q"] = tensors["q"][idx].contiguous()
    out["q_scale"] = tensors["q_scale"][idx].contiguous()
    out["block_table"] = tensors["block_table"][b:b + 1].contiguous()
    out["v_scale"] = tensors["v_scale"][b:b + 1].contiguous()
    n = int(tensors["kv_act_seqs"][b]) if kv_len is None else kv_len
    out["kv_act_seqs"] = torch.tensor([n], dtype=tensors["kv_act_seqs"].dtype)
    return out


def tile_bound(tensors: dict, s2_tiles, *, softmax_scale: float | None = None) -> torch.Tensor:
    """Per-element bound on |out(s2_tile=a) - exact| summed over ``s2_tiles``, from P quantization.

    Each tile quantizes ``P = exp(S - m_j)`` (max 1) with scale 448: an element's error is at most
    half an E4M3 spacing, ``2**-4 * P`` in the normal range plus ``2**-10 / 448`` (subnormal half step).
    Carried to the output through ``exp(m_j - M) / l`` and ``|v|``, computed in float64.
    """
    q, kc = tensors["q"], tensors["k_cache"]
    rows, nq, d = q.shape
    nb, bs, nkv, _ = kc.shape
    lens = tensors["kv_act_seqs"].tolist()
    s1 = rows // len(lens)
    group = nq // nkv
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    bound = torch.zeros(rows, nq, d, dtype=torch.float64)
    for b, n_b in enumerate(lens):
        t_all = torch.arange(n_b)
        blocks = tensors["block_table"][b, t_all // bs].long()
        k = kc[blocks, t_all % bs].double() * tensors["k_scale"][blocks, t_all % bs].double()  # [n, nkv, d]
        v = tensors["v_cache"][blocks, t_all % bs].double() * tensors["v_scale"][b].double()
        for i in range(s1):
            cur = max(0, n_b - (s1 - 1 - i))
            if cur == 0:
                continue
            r = b * s1 + i
            qd = q[r].double() * tensors["q_scale"][r].double()                                # [nq, d]
            kh = k[:cur].repeat_interleave(group, dim=1)                                       # [cur, nq, d]
            vh = v[:cur].repeat_interleave(group, dim=1).abs()
            s = torch.einsum("hd,thd->ht", qd, kh) * scale                                     # [nq, cur]
            big_m = s.max(dim=1, keepdim=True).values
            l = torch.exp(s - big_m).sum(dim=1, keepdim=True)
            for tile in s2_tiles:
                w = torch.zeros_like(s)
                for start in range(0, cur, tile):
                    st_ = s[:, start:start + tile]
                    m_j = st_.max(dim=1, keepdim=True).values
                    w[:, start:start + tile] = 2.0 ** -4 * torch.exp(st_ - big_m) + 2.0 ** -10 / 448 * torch.exp(m_j - big_m)
                bound[r] += torch.einsum("ht,thd->hd", w / l, vh)
    return bound


# --- paged attention laws ------------------------------------------------------------------------

@law("acceptance")
def acceptance(backend, case: Case) -> None:
    """SPEC §4: the backend's output is within rtol 1/128, atol 1e-4 of the golden's, elementwise."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    ref = call(_GOLDEN, tensors, tags=tags, **scalars)
    _assert_outputs(out, ref, identifier="Kernel output vs golden", backend=backend, case=case,
                    tensors=tensors, scalars=scalars, target_label="worst error / allowed")


@law("outputs_finite")
def outputs_finite(backend, case: Case) -> None:
    """Finite inputs in every cell the kernel reads give a finite output (SPEC §2-§3)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    out = call(backend, tensors, tags=_tags(backend, case), **scalars).float()
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        res = cmp.compare(out, torch.zeros_like(out), kind="exact", s1=case.config.s1)
        first = res.format_index(tuple(int(x) for x in bad.nonzero()[0]))
        raise AssertionError(
            f"Kernel output not finite [case {case.label()}, backend {backend.name}]\n"
            f"Non-finite elements: {int(bad.sum())} / {out.numel()}, first at {first}")


@law("block_permutation", tolerance="exact")
def block_permutation(backend, case: Case, perm_seed: int = 0) -> None:
    """SPEC §2 item 2: moving physical blocks (and renumbering the table) leaves the output bit-identical."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    nb = tensors["k_cache"].shape[0]
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(perm_seed))
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    moved = call(backend, permute_blocks(tensors, perm), tags=tags, **scalars)
    _assert_outputs(moved, out, kind="exact", identifier=f"Output with blocks permuted (perm_seed={perm_seed}) "
                    "vs original", backend=backend, case=case, tensors=tensors, scalars=scalars)


@law("garbage_unread", tolerance="exact")
def garbage_unread(backend, case: Case, fill: str = "nan") -> None:
    """SPEC §2 items 2 and 5: NaN or huge values in every cell that must not be read (unowned
    blocks, rows past each length, q of rows with cur == 0) never change the output, bit for bit."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    dirty = call(backend, poison_unread(tensors, fill), tags=tags, **scalars)
    _assert_outputs(dirty, out, kind="exact", identifier=f"Output with {fill} in unread cells vs clean",
                    backend=backend, case=case, tensors=tensors, scalars=scalars)


@law("gqa_repetition")
def gqa_repetition(backend, case: Case) -> None:
    """SPEC §2 item 2: query head h reads KV head h // group, so repeating each KV head group times
    (NKV = NQ) gives the grouped call's output (within SPEC §4)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    group = case.config.nq // case.config.nkv
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    flat = call(backend, repeat_kv_heads(tensors, group), tags=tags, **dict(scalars, g_tile=None))
    _assert_outputs(flat, out, identifier=f"Output with KV heads repeated x{group} vs grouped",
                    backend=backend, case=case, tensors=tensors, scalars=scalars)


@law("tile_invariance")
def tile_invariance(backend, case: Case, s2_tile: int | None = None, g_tile: int | None = None) -> None:
    """SPEC §2 item 3: another g_tile gives the same output (within SPEC §4); another s2_tile moves
    it by no more than the P quantization of both tile walks allows (:func:`tile_bound`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    other = dict(scalars, g_tile=g_tile, s2_tile=scalars["s2_tile"] if s2_tile is None else s2_tile)
    alt = call(backend, tensors, tags=tags, **other)
    if other["s2_tile"] == scalars["s2_tile"]:
        rtol = atol = None
    else:
        rtol = 2.0 ** -7  # bf16 rounding of both outputs
        atol = (tile_bound(tensors, (scalars["s2_tile"], other["s2_tile"]),
                            softmax_scale=scalars.get("softmax_scale")) + 1e-4).float()
    _assert_outputs(alt, out, rtol=rtol, atol=atol, backend=backend, case=case, tensors=tensors, scalars=scalars,
                    identifier=f"Output with s2_tile={other['s2_tile']}, g_tile={g_tile} vs "
                               f"s2_tile={scalars['s2_tile']}, g_tile={scalars['g_tile']}")


@law("batch_independence")
def batch_independence(backend, case: Case, batch_index: int = 0) -> None:
    """SPEC §2: each batch is computed from its own rows, table row and length, so batch b alone
    equals its rows of the batched call (within SPEC §4)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    b, s1 = batch_index % case.config.batch, case.config.s1
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    alone = call(backend, select_batch(tensors, b, s1), tags=tags, **scalars)
    _assert_outputs(alone, out[b * s1:(b + 1) * s1], identifier=f"Batch {b} alone vs batched",
                    backend=backend, case=case,
                    tensors=select_batch(tensors, b, s1), scalars=scalars)


@law("causal_prefix")
def causal_prefix(backend, case: Case) -> None:
    """SPEC §2 item 1: query position i of an S1 > 1 call equals an S1 = 1 call with the length
    shortened to ``cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))`` (within SPEC §4)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    c = case.config
    tags = _tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    single = Case(dataclasses.replace(c, s1=1), case.seed, case.name)
    for i in range(c.s1):
        rows = [b * c.s1 + i for b in range(c.batch)]
        short = dict(tensors, q=tensors["q"][rows].contiguous(), q_scale=tensors["q_scale"][rows].contiguous(),
                     kv_act_seqs=(tensors["kv_act_seqs"] - (c.s1 - 1 - i)).clamp(min=0))
        got = call(backend, short, tags=tags, **scalars)
        _assert_outputs(got, out[rows], identifier=f"Query position {i} as its own call vs causal S1={c.s1}",
                        backend=backend, case=single, tensors=short, scalars=scalars)


# --- quantization laws (SPEC §3; the golden's quantizers, no backend) -----------------------------

def _e4m3_half_spacing(y: torch.Tensor) -> torch.Tensor:
    """Half the E4M3 spacing at |y| (2**-10 in the subnormal range, below 2**-6)."""
    e = torch.floor(torch.log2(y.abs().clamp(min=2.0 ** -6)))
    return torch.exp2(e - 4)


@law("quant_round_trip", tolerance="exact")
def quant_round_trip(backend, x) -> None:
    """SPEC §3: per-token quantization errs by at most half an E4M3 spacing of ``x * scale`` (plus
    a float32 ulp of the scaling), and the largest |x| of a row maps to 448."""
    __tracebackhide__ = True
    import golden
    x = torch.as_tensor(x, dtype=torch.float32)
    x8, dq = golden.quantize_per_token(x)
    y = x / dq
    cmp.assert_close(x8.float(), y, rtol=2.0 ** -22, atol=_e4m3_half_spacing(y), kind="exact",
                     identifier="Dequantized codes vs x * scale (half an E4M3 spacing allowed, SPEC §3)")
    cmp.assert_close(x8.float().abs().amax(dim=-1), torch.full((x.shape[0],), 448.0), kind="exact",
                     identifier="Largest |code| per row vs 448 (SPEC §3)")


@law("quant_scale_covariance", tolerance="exact")
def quant_scale_covariance(backend, x, power: int = 1) -> None:
    """SPEC §3: scaling a row by 2**power leaves its codes unchanged and scales the dequant scale by
    exactly 2**power (the scale is 448 / max|x|, a power of two commutes with it)."""
    __tracebackhide__ = True
    import golden
    x = torch.as_tensor(x, dtype=torch.float32)
    x8, dq = golden.quantize_per_token(x)
    y8, dq2 = golden.quantize_per_token(x * 2.0 ** power)
    cmp.assert_close(y8, x8, kind="exact", identifier=f"Codes of x * 2**{power} vs codes of x")
    cmp.assert_close(dq2, dq * 2.0 ** power, kind="exact", identifier=f"Dequant scale of x * 2**{power} vs scale * 2**{power}")


# --- AT-12 laws (SPEC §6) ------------------------------------------------------------------------

def _at12_fp8(case):
    import golden
    q, k = case.operands()
    q8, qs = golden.quantize_per_token(q.float())
    k8, ks = golden.quantize_per_token(k.float())
    return q8, qs, k8, ks


@law("at12_acceptance", tolerance="at12")
def at12_acceptance(backend, case, fp8: bool = False) -> None:
    """SPEC §6: the backend's AT-12 scores (BF16, or FP8 with dequant after) are within rtol 1/128,
    atol 1e-4 of the golden's."""
    __tracebackhide__ = True
    if fp8:
        q8, qs, k8, ks = _at12_fp8(case)
        tensors = dict(q=q8, k=k8, q_scale=qs, k_scale=ks)
    else:
        q, k = case.operands()
        tensors = dict(q=q, k=k)
    tags = {"case": repr(case), "backend": backend.name}
    out = call(backend, tensors, op="qk_matmul_scale", tags=tags)
    ref = call(_GOLDEN, tensors, op="qk_matmul_scale", tags=tags)
    cmp.assert_close(out, ref, kind="at12", identifier=f"AT-12 scores ({'fp8' if fp8 else 'bf16'}) vs golden", tags=tags)


@law("at12_fp8_vs_bf16", tolerance="at12")
def at12_fp8_vs_bf16(backend, case) -> None:
    """SPEC §6: FP8 scores dequantized after the matmul equal the BF16 scores of the dequantized
    inputs within a derived bound: the bf16 rounding of each dequantized operand (2**-9 relative,
    twice) plus float32 accumulation (head_dim * 2**-24), on |q| @ |k|^T * scale."""
    __tracebackhide__ = True
    q8, qs, k8, ks = _at12_fp8(case)
    qd, kd = (q8.float() * qs).to(torch.bfloat16), (k8.float() * ks).to(torch.bfloat16)
    tags = {"case": repr(case), "backend": backend.name}
    fp8 = call(backend, dict(q=q8, k=k8, q_scale=qs, k_scale=ks), op="qk_matmul_scale", tags=tags)
    bf16 = call(backend, dict(q=qd, k=kd), op="qk_matmul_scale", tags=tags)
    d = q8.shape[-1]
    mag = (qd.float().abs() @ kd.float().abs().T) * d ** -0.5
    atol = mag * (2.0 ** -8 + 2 * (d + 2) * 2.0 ** -24) + 1e-30
    cmp.assert_close(fp8, bf16, rtol=0.0, atol=atol, kind="at12", tags=tags,
                     identifier="AT-12 FP8 (dequant after) vs BF16 of dequantized inputs")


@law("at12_default_scale", tolerance="exact")
def at12_default_scale(backend, case) -> None:
    """SPEC §6: ``scale=None`` is 1/sqrt(head_dim), derived at run time: identical to passing it."""
    __tracebackhide__ = True
    q, k = case.operands()
    tags = {"case": repr(case), "backend": backend.name}
    a = call(backend, dict(q=q, k=k), op="qk_matmul_scale", tags=tags)
    b = call(backend, dict(q=q, k=k), op="qk_matmul_scale", tags=tags, scale=1 / math.sqrt(q.shape[-1]))
    cmp.assert_close(a, b, kind="exact", tags=tags, identifier="AT-12 with scale=None vs scale=1/sqrt(D)")


def check(name: str, backend, case, *, capture: bool = True, regressions_dir=None, **params) -> None:
    """Run law ``name``; on failure capture the case (once hypothesis has shrunk it, or always
    outside hypothesis) and re-raise with ``Replay: pfa-verify cases replay <id>`` as the last line."""
    __tracebackhide__ = True
    try:
        LAWS[name](backend, case, **params)
    except AssertionError as exc:
        from cases import regressions
        message = str(exc)
        reg = regressions.Regression.from_failure(name, getattr(backend, "name", "golden"), case, params, message)
        if capture and regressions.should_capture():
            regressions.save(reg, directory=regressions_dir)
        raise AssertionError(f"{message}\nReplay: pfa-verify cases replay {reg.id}") from None
