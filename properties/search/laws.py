"""Laws of FP8 paged attention (SPEC §2-§4) and AT-12 (SPEC §6), as pure functions of (backend, case).

A law raises :class:`properties.rule.failure.LawFailure` (an AssertionError: the message of
:mod:`properties.rule.compare`, and the calls the rule failed, as data) when it does not hold and returns None
otherwise; it never writes files nor diagnoses (the boundary that reports does: cases/data/diagnosed.py).
tests/properties binds the laws to strategies, and ``cases.data.regressions.check`` runs one by name (:data:`LAWS`), capturing a failure for replay. The
``acceptance`` law is :func:`properties.rule.acceptance.judge`, the one acceptance rule.

Every law also says when an example cannot make it fail (:func:`vacuous`): GQA repetition with a
group of 1 is the same call twice. The tests draw only examples that are not vacuous (strategy
design first, ``assume`` as the backstop), so every example checks something.

Every backend call goes through :func:`properties.rule.acceptance.call` (inputs must come back
bit-identical). Comparisons of a backend with itself use ``compare(kind="exact")`` where the spec
makes the output bit-identical and SPEC §4 otherwise; comparisons with the golden use the golden
under the backend's own codec (:func:`properties.rule.acceptance.reference_backend`). The bounds the laws
hold outputs to, and the assertions that apply them, are :mod:`properties.search.law_bounds`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy.typing as npt
import torch
from hypothesis import target
from hypothesis.control import currently_in_test_context

import pfa_verify.golden.at12 as at12
from pfa_verify import golden
from pfa_verify.golden.attention import visible_lengths
from pfa_verify.golden.codec import FP8_MAX
from pfa_verify.golden.validate import default_softmax_scale
from pfa_verify.kernels import Backend
from pfa_verify.properties.rule import compare as cmp
from pfa_verify.properties.rule import transforms as tf
from pfa_verify.properties.rule.acceptance import backend_model, call, judge, reference_backend, split_bundle
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.rule.failure import Failed, LawFailure
from pfa_verify.properties.search.law_bounds import (
    Call,
    acceptance_width,
    assert_pair_within,
    assert_same_output,
    at12_fp8_vs_bf16_bound,
    case_tags,
    e4m3_half_spacing,
)
from pfa_verify.properties.search.strategies import At12Case

__all__ = ["LAWS", "Law", "LawFailure", "law", "run", "vacuous", "same_tiles", "acceptance_width", "at12_fp8_vs_bf16_bound"]

#: A law: (backend, case, **params) -> None, raising AssertionError when it does not hold (a LawFailure, Law). Its case is a
#: Case (paged attention), an array of rows (quantization) or a properties.search.strategies.At12Case.
LawFunction = Callable[..., None]
_Law = TypeVar("_Law", bound=LawFunction)


@dataclasses.dataclass(frozen=True)
class Law:
    name: str
    fn: LawFunction
    tolerance: str                                   # the properties.rule.compare kind it holds outputs to
    vacuous: Callable[..., str | None] | None        # (case, **params) -> why it cannot fail, or None

    def __call__(self, backend: Backend, case: Any, **params: Any) -> None:
        """Run the law; a failure is a LawFailure naming it and its example, whatever assertion raised it."""
        __tracebackhide__ = True
        try:
            self.fn(backend, case, **params)
        except LawFailure as exc:
            raise exc.of(self.name, case, params).with_traceback(exc.__traceback__) from None
        except AssertionError as exc:       # properties.rule.compare's assertions, inputs changed: the message alone
            failure = LawFailure(str(exc), law=self.name, case=case, params=params)
            raise failure.with_traceback(exc.__traceback__) from None


LAWS: dict[str, Law] = {}


def law(name: str, *, tolerance: str = "attention",
        vacuous: Callable[..., str | None] | None = None) -> Callable[[_Law], _Law]:
    """Register a law under ``name`` (the name captured regressions are replayed by)."""
    def register(fn: _Law) -> _Law:
        LAWS[name] = Law(name, fn, tolerance, vacuous)
        return fn
    return register


def run(name: str, backend: Backend, case: Any, **params: Any) -> None:
    """Run law ``name`` (KeyError-free: an unknown name is a ValueError listing the laws)."""
    __tracebackhide__ = True
    if name not in LAWS:
        raise ValueError(f"law={name!r} is not a law; expected one of {sorted(LAWS)}")
    LAWS[name](backend, case, **params)


def vacuous(name: str, case: Any, **params: Any) -> str | None:
    """Why law ``name`` cannot fail on this example whatever the backend does, or None."""
    check = LAWS[name].vacuous
    return check(case, **params) if check is not None else None


# --- when an example cannot fail --------------------------------------------------------------------

def _visible(config: golden.PagedAttentionConfig) -> bool:
    return any(n > 0 for n in config.lengths)


def _nothing_visible(case: Case, **_: object) -> str | None:
    return None if _visible(case.config) else "no query row sees a token (every output row is 0)"


def _needs(predicate: Callable[..., bool], why: str) -> Callable[..., str | None]:
    """A vacuity check: nothing visible, or ``predicate(config, **params)`` false (then ``why``)."""
    def check(case: Case, **params: Any) -> str | None:
        return _nothing_visible(case) or (None if predicate(case.config, **params) else why)
    return check


def same_tiles(config: golden.PagedAttentionConfig, s2_tile: int | None = None, g_tile: int | None = None) -> bool:
    """Whether (s2_tile, g_tile) are the config's own tiles (None: the config's s2_tile, the whole group)."""
    group = config.nq // config.nkv
    other = (config.s2_tile if s2_tile is None else s2_tile, group if g_tile is None else g_tile)
    return other == (config.s2_tile, config.g_tile or group)


def _garbage_vacuous(case: Case, **_: object) -> str | None:
    """From the config alone (the filter runs on every draw; building the inputs here doubled the law's input
    cost): a config's table names each block once (golden.PagedAttentionConfig checks it), so the cache
    cells read are the batches' tokens, and a cell is left unread when the physical blocks hold more, or a
    query row sees no token (its q is unread, SPEC §2.5). transforms.unread_cells says the same on the
    tensors (tests/properties/test_vacuity.py)."""
    c = case.config
    empty_row = bool((visible_lengths(c.lengths, c.s1) == 0).any())
    unread = empty_row or c.physical_blocks * c.block_size > sum(c.lengths)
    return None if unread else "no cell is left unread"


# --- paged attention laws ------------------------------------------------------------------------

@law("acceptance", vacuous=_nothing_visible)
def acceptance(backend: Backend, case: Case) -> None:
    """SPEC §4: the backend's output is within rtol 1/128, atol 1e-4 of the golden's, elementwise
    (the one rule of :mod:`properties.rule.acceptance`; the search climbs the worst error over tolerance)."""
    __tracebackhide__ = True
    verdict = judge(backend, case, tags=case_tags(backend, case))
    if currently_in_test_context():
        ratio = verdict.deciding.worst_ratio
        target(ratio if math.isfinite(ratio) else 1e30, label="worst error / allowed")
    if not verdict.passed:
        raise LawFailure(verdict.message(), failed=(Failed(verdict, case),))


@law("outputs_finite", vacuous=_nothing_visible)
def outputs_finite(backend: Backend, case: Case) -> None:
    """Finite inputs in every cell the kernel reads give a finite output (SPEC §2-§3)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    out = call(backend, tensors, tags=case_tags(backend, case), **scalars).float()
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        res = cmp.compare(out, torch.zeros_like(out), kind="exact", s1=case.config.s1)
        first = res.format_index(tuple(int(x) for x in bad.nonzero()[0]))
        raise AssertionError(
            f"Kernel output not finite [case {case.label()}, backend {backend.name}]\n"
            f"Non-finite elements: {int(bad.sum())} / {out.numel()}, first at {first}")


@law("block_permutation", tolerance="exact",
     vacuous=_needs(lambda c, **_: c.physical_blocks >= 2, "one physical block cannot move"))
def block_permutation(backend: Backend, case: Case, perm_seed: int = 0) -> None:
    """SPEC §2 item 2: moving every physical block elsewhere (and renumbering the table) leaves the
    output bit-identical: only the table says where a token lives (for a deterministic backend; any
    other is held to the acceptance width, :func:`assert_same_output`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    perm = tf.derangement(tensors["k_cache"].shape[0], perm_seed)
    tags = case_tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    permuted = tf.permute_blocks(tensors, perm)
    moved = call(backend, permuted, tags=tags, **scalars)
    assert_same_output(moved, out, backend=backend, case=case, tensors=tensors, scalars=scalars,
                       identifier=f"Output with blocks permuted (perm_seed={perm_seed}) vs original",
                       calls=(Call("with blocks permuted", moved, permuted, scalars), Call("as given", out, tensors, scalars)))


@law("garbage_unread", tolerance="exact", vacuous=_garbage_vacuous)
def garbage_unread(backend: Backend, case: Case, fill: str = "nan") -> None:
    """SPEC §2 items 2 and 5: NaN, huge or plausible-but-wrong values in every cell that must not be
    read (unowned blocks, rows past each length, their K scales, q of rows with cur == 0) give the
    output of zeros there, bit for bit (for a deterministic backend; any other is held to the acceptance
    width, :func:`assert_same_output`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    tags = case_tags(backend, case)
    zeroed, poisoned = tf.poison_unread(tensors, None), tf.poison_unread(tensors, fill)
    clean = call(backend, zeroed, tags=tags, **scalars)
    dirty = call(backend, poisoned, tags=tags, **scalars)
    assert_same_output(dirty, clean, backend=backend, case=case, tensors=tensors, scalars=scalars,
                       identifier=f"Output with {fill} in unread cells vs zeros there",
                       calls=(Call(f"with {fill} in unread cells", dirty, poisoned, scalars),
                              Call("with zeros there", clean, zeroed, scalars)))


@law("gqa_repetition", vacuous=_needs(lambda c, **_: c.nq > c.nkv, "group 1: the repeated call is the same call"))
def gqa_repetition(backend: Backend, case: Case) -> None:
    """SPEC §2 item 2: query head h reads KV head h // group, so repeating each KV head group times
    (NKV = NQ) gives the grouped call's exact result; the two outputs differ by at most the width of
    the acceptance interval (:func:`acceptance_width`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    group = case.config.nq // case.config.nkv
    tags = case_tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    repeated, flat_scalars = tf.repeat_kv_heads(tensors, group), dict(scalars, g_tile=None)
    flat = call(backend, repeated, tags=tags, **flat_scalars)
    assert_pair_within(flat, out, acceptance_width(backend, tensors, scalars),
                       identifier=f"Output with KV heads repeated x{group} vs grouped",
                       backend=backend, case=case, tensors=tensors, scalars=scalars,
                       calls=(Call(f"with KV heads repeated x{group}", flat, repeated, flat_scalars),
                              Call("grouped", out, tensors, scalars)))


@law("tile_invariance", vacuous=_needs(lambda c, **p: not same_tiles(c, **p), "the same tiles as the case"))
def tile_invariance(backend: Backend, case: Case, s2_tile: int | None = None, g_tile: int | None = None) -> None:
    """SPEC §2 item 3: the tiles are the caller's choice, and the output at any other (s2_tile,
    g_tile) is the golden's output at those tiles (g_tile only partitions heads; s2_tile moves the
    result exactly as P's per-tile quantization does), within SPEC §4 under the one acceptance rule."""
    __tracebackhide__ = True
    c = case.config
    other = c.replace(s2_tile=c.s2_tile if s2_tile is None else s2_tile, g_tile=g_tile)
    alt = dataclasses.replace(case, config=other)
    verdict = judge(backend, alt, tags=case_tags(backend, alt))       # the tag shows the tiles compared
    if not verdict.passed:
        message = (f"At s2_tile={other.s2_tile}, g_tile={g_tile} instead of s2_tile={c.s2_tile}, "
                   f"g_tile={c.g_tile}:\n{verdict.message()}")
        raise LawFailure(message, failed=(Failed(verdict, alt),))


@law("batch_independence",
     vacuous=lambda case, batch_index=0: _nothing_visible(case) or (
         "batch 1: the batch alone is the batched call" if case.config.batch == 1 else
         None if case.config.lengths[batch_index % case.config.batch] > 0 else "the chosen batch sees no token"))
def batch_independence(backend: Backend, case: Case, batch_index: int = 0) -> None:
    """SPEC §2: each batch is computed from its own rows, table row, length and V scales, so batch b
    alone has the exact result of its rows of the batched call; the outputs differ by at most the width
    of the acceptance interval (:func:`acceptance_width`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    b, s1 = batch_index % case.config.batch, case.config.s1
    tags = case_tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    alone_inputs = tf.select_batch(tensors, b, s1)
    alone = call(backend, alone_inputs, tags=tags, **scalars)
    rows = slice(b * s1, (b + 1) * s1)
    assert_pair_within(alone, out[rows], acceptance_width(backend, tensors, scalars)[rows],
                       identifier=f"Batch {b} alone vs batched", backend=backend, case=case, tensors=alone_inputs,
                       scalars=scalars, calls=(Call(f"of batch {b} alone", alone, alone_inputs, scalars),
                                               Call("batched", out, tensors, scalars)))


@law("causal_prefix", vacuous=_needs(lambda c, **_: c.s1 > 1, "S1 = 1: the shortened call is the same call"))
def causal_prefix(backend: Backend, case: Case) -> None:
    """SPEC §2 item 1: query position i of an S1 > 1 call has the exact result of an S1 = 1 call with
    the length shortened to ``cur = max(0, kv_act_seqs[b] - (S1 - 1 - i))``; the outputs differ by at most
    the width of the acceptance interval (:func:`acceptance_width`)."""
    __tracebackhide__ = True
    tensors, scalars = split_bundle(case.inputs())
    c = case.config
    tags = case_tags(backend, case)
    out = call(backend, tensors, tags=tags, **scalars)
    width = acceptance_width(backend, tensors, scalars)
    single = dataclasses.replace(case, config=c.replace(s1=1), explicit=None)   # labels the failing call
    cur = visible_lengths(tensors["kv_act_seqs"], c.s1).to(torch.int32)          # [B, S1]
    for i in range(c.s1):
        rows = [b * c.s1 + i for b in range(c.batch)]
        short = dict(tensors, q=tensors["q"][rows].contiguous(), q_scale=tensors["q_scale"][rows].contiguous(),
                     kv_act_seqs=cur[:, i].contiguous())
        got = call(backend, short, tags=tags, **scalars)
        assert_pair_within(got, out[rows], width[rows], identifier=f"Query position {i} as its own call vs causal S1={c.s1}",
                           backend=backend, case=single, tensors=short, scalars=scalars,
                           calls=(Call(f"of query position {i} alone", got, short, scalars),
                                  Call(f"causal S1={c.s1}", out, tensors, scalars)))


# --- quantization laws (SPEC §3; the golden's quantizers, no backend) -----------------------------

@law("quant_round_trip", tolerance="bound")
def quant_round_trip(backend: Backend, x: npt.ArrayLike | torch.Tensor) -> None:
    """SPEC §3: per-token quantization errs by at most half an E4M3 spacing of ``x * scale`` (plus
    2**-22 of it), and the largest |x| of a row maps to 448.

    Derivation: the golden encodes ``z = RN(x * scale)``, so ``|x8 - z| <= h(z)``, half the E4M3 spacing
    at z (round to nearest on the grid; saturation only past 448). The law compares with ``y = RN(x / dq)``,
    ``dq = RN(1 / scale)``: three float32 roundings apart, ``|y - z| <= 3.0001 u |y|`` (u = 2**-24), inside
    the 2**-22 = 4u allowed. Where z and y straddle a power of two 2**e the spacings differ: if z >= 2**e > y,
    x8 = 2**e (z is within 3u of it, far nearer than half a spacing) and ``|x8 - y| <= |z - y|``; if
    y >= 2**e > z, ``h(z) < h(y)``. Either way ``|x8 - y| <= h(y) + 2**-22 |y|``. Reached exactly at the
    E4M3 midpoints (tests/properties/test_law_bounds.py)."""
    __tracebackhide__ = True
    x = torch.as_tensor(x, dtype=torch.float32)
    x8, dq = golden.quantize_per_token(x)
    y = x / dq
    cmp.assert_close(x8.float(), y, kind="bound", rtol=2.0 ** -22, atol=e4m3_half_spacing(y),
                     identifier="Dequantized codes vs x * scale (half an E4M3 spacing allowed, SPEC §3)")
    cmp.assert_close(x8.float().abs().amax(dim=-1), torch.full((x.shape[0],), FP8_MAX), kind="exact",
                     identifier="Largest |code| per row vs 448 (SPEC §3)")


@law("quant_scale_covariance", tolerance="exact")
def quant_scale_covariance(backend: Backend, x: npt.ArrayLike | torch.Tensor, power: int = 1) -> None:
    """SPEC §3: scaling a row by 2**power leaves its codes unchanged and scales the dequant scale by
    exactly 2**power (the scale is 448 / max|x|, a power of two commutes with it)."""
    __tracebackhide__ = True
    x = torch.as_tensor(x, dtype=torch.float32)
    x8, dq = golden.quantize_per_token(x)
    y8, dq2 = golden.quantize_per_token(x * 2.0 ** power)
    cmp.assert_close(y8, x8, kind="exact", identifier=f"Codes of x * 2**{power} vs codes of x")
    cmp.assert_close(dq2, dq * 2.0 ** power, kind="exact", identifier=f"Dequant scale of x * 2**{power} vs scale * 2**{power}")


# --- AT-12 laws (SPEC §6) ------------------------------------------------------------------------

def _at12_fp8(case: At12Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k = case.operands()
    q8, qs = golden.quantize_per_token(q.float())
    k8, ks = golden.quantize_per_token(k.float())
    return q8, qs, k8, ks


@law("at12_acceptance", tolerance="at12")
def at12_acceptance(backend: Backend, case: At12Case, fp8: bool = False) -> None:
    """SPEC §6 under the one rule of SPEC §4.2: each of the backend's AT-12 scores (BF16, or FP8 with
    dequant after) is within rtol 1/128, atol 1e-4 of the golden's (vectorized, under the backend's
    codec; the golden backend's own scores come from the row-by-row route, golden.qk_matmul_scale_loop),
    or inside the envelope holding every conforming result (golden.at12.qk_matmul_scale_envelope: where
    a score cancels, a legal float32 order moves it by more than the tolerance)."""
    __tracebackhide__ = True
    tensors: dict[str, Any]                     # the operands by name (the envelope's other arguments are not)
    if fp8:
        q8, qs, k8, ks = _at12_fp8(case)
        tensors = dict(q=q8, k=k8, q_scale=qs, k_scale=ks)
    else:
        q, k = case.operands()
        tensors = dict(q=q, k=k)
    tags: dict[str, object] = {"case": repr(case), "backend": backend.name}
    out = call(backend, tensors, op="qk_matmul_scale", tags=tags)
    expected, lo, hi = at12.qk_matmul_scale_envelope(**tensors, codec=reference_backend(backend).codec,
                                                     model=backend_model(backend))
    cmp.assert_close(out, expected, kind="at12", identifier=f"AT-12 scores ({'fp8' if fp8 else 'bf16'}) vs golden",
                     tags=tags, envelope=(lo, hi))


@law("at12_fp8_vs_bf16", tolerance="bound")
def at12_fp8_vs_bf16(backend: Backend, case: At12Case) -> None:
    """SPEC §6: FP8 scores dequantized after the matmul equal the BF16 scores of the dequantized
    inputs within the bound :func:`at12_fp8_vs_bf16_bound` derives from SPEC §4.1 (the bf16 rounding of
    each operand, then each path's any-order float32 sums and scale roundings)."""
    __tracebackhide__ = True
    q8, qs, k8, ks = _at12_fp8(case)
    codec = reference_backend(backend).codec
    qd, kd = (codec.from_fp8(q8) * qs).to(torch.bfloat16), (codec.from_fp8(k8) * ks).to(torch.bfloat16)
    tags: dict[str, object] = {"case": repr(case), "backend": backend.name}
    fp8 = call(backend, dict(q=q8, k=k8, q_scale=qs, k_scale=ks), op="qk_matmul_scale", tags=tags)
    bf16 = call(backend, dict(q=qd, k=kd), op="qk_matmul_scale", tags=tags)
    atol = at12_fp8_vs_bf16_bound(q8, qs, k8, ks, qd, kd, scale=default_softmax_scale(q8.shape[-1]), codec=codec)
    cmp.assert_close(fp8, bf16, kind="bound", rtol=0.0, atol=atol, tags=tags,
                     identifier="AT-12 FP8 (dequant after) vs BF16 of dequantized inputs")


@law("at12_default_scale", tolerance="exact")
def at12_default_scale(backend: Backend, case: At12Case) -> None:
    """SPEC §6: ``scale=None`` is 1/sqrt(head_dim), derived at run time: identical to passing it."""
    __tracebackhide__ = True
    q, k = case.operands()
    tags: dict[str, object] = {"case": repr(case), "backend": backend.name}
    a = call(backend, dict(q=q, k=k), op="qk_matmul_scale", tags=tags)
    b = call(backend, dict(q=q, k=k), op="qk_matmul_scale", tags=tags, scale=default_softmax_scale(q.shape[-1]))
    cmp.assert_close(a, b, kind="exact", tags=tags, identifier="AT-12 with scale=None vs scale=1/sqrt(D)")
