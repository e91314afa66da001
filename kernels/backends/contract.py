"""The backend contract in code: :class:`KernelBackend` (what every backend has) and
:class:`Capabilities` (what a backend may declare, with the defaults the suite assumes otherwise).

A backend is any object that satisfies :class:`KernelBackend`: a ``name``, the ``codec`` its FP8
conversions follow, and the two kernels of SPEC §1 and §6. Everything else the suite reads from a
backend is one field of :class:`Capabilities`; :func:`capabilities_of` reads them all at once, when the
backend is loaded, and refuses a backend whose name, codec, model or supported shapes are wrong, or
whose kernels' signatures cannot take the suite's calls (:func:`signature_problems`), with one
:class:`golden.errors.UsageError` naming every wrong field (the command line prints it as one
line, exit 2). Nothing else reads a backend's attributes: the run, the reports and the supervisor
(kernels/backends/supervisor.py) read its :class:`Capabilities`, which are plain data and travel from
the process that loaded the backend to the one that judges it (:meth:`Capabilities.to_dict`).

The kernels' signatures are SPEC §1's: ``paged_attention_fp8`` returns a bf16 ``[B*S1, NQ, D]`` CPU
tensor and ``qk_matmul_scale`` a float32 ``[q_tile, k_tile]`` one; both leave their inputs unchanged
(the acceptance rule checks, properties/rule/acceptance.py). An exception is an ``error`` verdict, never a
pass; kernels.backends.BackendUnavailable from a call is a skip of kind ``unavailable``.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pfa_verify.golden.codec import CODECS, SPEC_CODEC, Fp8Codec, get_codec
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.model import ConformanceModel
from pfa_verify.kernels.backends import KernelSource, runs_on_npu
from pfa_verify.kernels.backends.text import printable

if TYPE_CHECKING:
    import torch

    from pfa_verify.golden.codec import Fp8Codec
    from pfa_verify.golden.model import ConformanceModel

__all__ = ["KernelBackend", "Capabilities", "CostEstimate", "capabilities_of", "SHAPE_FIELDS", "DEFAULT_SHRINK_CALLS",
           "shrink_budget", "OPERATORS", "implements", "PASSED_ARGUMENTS", "signature_problems"]

#: The kernels a backend may implement (SPEC §1, §6): paged attention is required, AT-12 optional.
OPERATORS = ("paged_attention_fp8", "qk_matmul_scale")

#: The keyword arguments the suite passes each kernel (SPEC §1, §6): (always, sometimes). Every call is by
#: keyword (properties/rule/acceptance.py ``call``, the worker's kernels/backends/sandbox.py), never ``codec``:
#: the golden's own argument, which a kernel may accept and ignore.
PASSED_ARGUMENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "paged_attention_fp8": (("q", "q_scale", "k_cache", "k_scale", "v_cache", "v_scale", "block_table", "kv_act_seqs",
                             "softmax_scale", "s2_tile", "g_tile"), ()),
    "qk_matmul_scale": (("q", "k"), ("scale", "q_scale", "k_scale")),   # the bf16 calls pass q and k alone
}

#: The shape fields a backend may restrict with ``supported_shapes`` (kernels.backends.unsupported_shape).
SHAPE_FIELDS = ("head_dim", "block_size")
#: Law calls after a law's first failure while Hypothesis shrinks it, for a backend that declares no
#: ``shrink_calls``: every search ends its shrinking within a known number of kernel calls (Hypothesis' own
#: limits allow thousands; on a 5-second kernel that is hours). A backend as slow as the sim declares
#: fewer (kernels/backends/pypto_backend.py: 20).
DEFAULT_SHRINK_CALLS = 200


def shrink_budget(backend: object) -> int:
    """The law calls ``backend`` allows after a law's first failure: its ``shrink_calls``, else
    :data:`DEFAULT_SHRINK_CALLS`."""
    declared = getattr(backend, "shrink_calls", None)
    return DEFAULT_SHRINK_CALLS if declared is None else int(declared)


@runtime_checkable
class KernelBackend(Protocol):
    """What every backend has (README, "Check your kernel"; docs/reference.md, "Backends")."""

    name: str
    codec: Fp8Codec | None

    def paged_attention_fp8(self, q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor,
                            k_scale: torch.Tensor, v_cache: torch.Tensor, v_scale: torch.Tensor,
                            block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
                            softmax_scale: float | None = None, s2_tile: int = 128,
                            g_tile: int | None = None) -> torch.Tensor:
        """bf16 [B*S1, NQ, D] on the CPU: SPEC §2 for the arguments of SPEC §1."""
        ...

    def qk_matmul_scale(self, q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                        q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                        codec: object = None) -> torch.Tensor:
        """float32 [q_tile, k_tile] on the CPU: the AT-12 scores of SPEC §6."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostEstimate:
    """A backend's prediction of one case's cost: ``seconds`` and, for people, ``text``."""

    seconds: float
    text: str

    def describe(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """Everything the suite reads from a backend, each optional field with the default it assumes.

    * ``name`` -- how reports name the backend (required: a non-empty string).
    * ``codec`` -- the name of the golden.codec codec its FP8 conversions follow (default: the spec's,
      ``e4m3fn-sat``;
      one of golden.codec.CODECS: the golden must be able to compute with it).
    * ``model`` -- the golden.model.ConformanceModel it declared (None: it declared none and is judged
      by SPEC §4.1 as written); a wider one than SPEC §4.1 is refused, naming the field.
    * ``supported_shapes`` -- None (any shape) or ``{"head_dim": (...), "block_size": (...)}``: what the
      kernel is built for; strategies draw only such cases, others are skips of kind ``unsupported``.
    * ``has_skip_reason`` / ``has_estimate`` -- whether it has ``skip_reason(config) -> Skip | None``
      (its own limits) and ``estimate(config)`` (an object with ``seconds`` and ``describe()``: the
      run's budget and the per-case time limit use it).
    * ``spec_codec_not_applicable`` -- None, or why a comparison under the spec codec says nothing
      about its kernel (its own codec differs and cannot be switched).
    * ``out_of_bounds_reads`` -- in words, what it does about reads outside an input (None: unknown).
    * ``threads`` -- torch threads for the process that runs it (None: torch's default).
    * ``kernel_errors_spoil_process`` -- True where a failed kernel leaves its process unusable (pypto
      0.2.0's trace, W7): the process is replaced before the next call.
    * ``shrink_calls`` -- at most this many law calls after a law's first failure while Hypothesis
      shrinks it (None: :data:`DEFAULT_SHRINK_CALLS`; :func:`shrink_budget` reads it).
    * ``default_budget_s`` -- the run's time budget unless ``--budget`` says otherwise (None: none).
    * ``fallback`` and ``selection`` -- set by ``auto``: whether it fell back to the golden, and how it
      chose.
    * ``notes`` -- what a run's header says once about it here (its ``notes()``).
    * ``kernel_source`` -- where its kernel came from (a KernelSource as a dict), when known.
    * ``runs_on_npu`` -- whether it needs an NPU device (the pool gives one per worker).
    * ``operators`` -- the kernels of :data:`OPERATORS` it implements: the methods it has, or fewer
      where it declares ``operators`` (a kernel whose class inherits a method it does not implement).
      Paged attention is required. The laws of an operator it does not implement are not run (said so,
      never a pass); a call of it is never made.
    """

    name: str
    codec: str = "e4m3fn-sat"
    model: ConformanceModel | None = None
    supported_shapes: Mapping[str, tuple[int, ...]] | None = None
    has_skip_reason: bool = False
    has_estimate: bool = False
    spec_codec_not_applicable: str | None = None
    out_of_bounds_reads: str | None = None
    threads: int | None = None
    kernel_errors_spoil_process: bool = False
    shrink_calls: int | None = None
    default_budget_s: float | None = None
    fallback: bool = False
    selection: str | None = None
    notes: tuple[str, ...] = ()
    kernel_source: Mapping[str, Any] | None = None
    runs_on_npu: bool = False
    operators: tuple[str, ...] = OPERATORS

    @property
    def codec_object(self) -> Fp8Codec:
        """The golden.codec codec named by ``codec``."""
        return get_codec(self.codec)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (what crosses from the process that loaded the backend)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["model"] = None if self.model is None else dataclasses.asdict(self.model)
        data["supported_shapes"] = (None if self.supported_shapes is None
                                    else {k: list(v) for k, v in self.supported_shapes.items()})
        data["notes"] = list(self.notes)
        data["operators"] = list(self.operators)
        data["kernel_source"] = None if self.kernel_source is None else dict(self.kernel_source)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capabilities:
        """The inverse of :meth:`to_dict`, checked as :func:`capabilities_of` checks a backend."""
        if not isinstance(data, Mapping):
            raise UsageError(f"capabilities must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"capabilities: unknown field(s) {unknown}")
        fields = dict(data)
        model = fields.get("model")
        if isinstance(model, Mapping):
            try:
                fields["model"] = ConformanceModel(**model)
            except (TypeError, ValueError) as exc:
                raise UsageError(f"capabilities: model={dict(model)!r}: {exc}") from None
        shapes = fields.get("supported_shapes")
        if isinstance(shapes, Mapping):
            fields["supported_shapes"] = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in shapes.items()}
        for field in ("notes", "operators"):
            if isinstance(fields.get(field), list):
                fields[field] = tuple(fields[field])
        return _checked(str(fields.get("name")), fields)


def capabilities_of(backend: object, *, source: str | None = None) -> Capabilities:
    """The :class:`Capabilities` of ``backend``, every field checked: a UsageError naming each wrong one
    in one line (``source``: how the user named the backend, for that line). The one reader of a
    backend's optional attributes."""
    owner = source or getattr(backend, "name", None) or type(backend).__name__
    if not callable(getattr(backend, "paged_attention_fp8", None)):
        raise UsageError(printable(f"backend {owner!r}: {type(backend).__name__} lacks the method paged_attention_fp8 "
                                   "of kernels.KernelBackend"))
    has = tuple(op for op in OPERATORS if callable(getattr(backend, op, None)))
    declared = getattr(backend, "operators", None)
    if isinstance(declared, (tuple, list)) and not set(declared) <= set(has):
        raise UsageError(printable(f"backend {owner!r}: operators={declared!r} names kernels it has no method for "
                                   f"(it has {list(has)})"))
    codec = getattr(backend, "codec", None)
    notes = getattr(backend, "notes", None)
    source_record = getattr(backend, "kernel_source", None)
    fields: dict[str, Any] = {
        "name": getattr(backend, "name", _MISSING),
        "codec": _codec_name(codec),
        "model": getattr(backend, "model", None),
        "supported_shapes": getattr(backend, "supported_shapes", None),
        "has_skip_reason": callable(getattr(backend, "skip_reason", None)),
        "has_estimate": callable(getattr(backend, "estimate", None)),
        "spec_codec_not_applicable": getattr(backend, "spec_codec_not_applicable", None),
        "out_of_bounds_reads": getattr(backend, "out_of_bounds_reads", None),
        "threads": getattr(backend, "threads", None),
        "kernel_errors_spoil_process": getattr(backend, "kernel_errors_spoil_process", False),
        "shrink_calls": getattr(backend, "shrink_calls", None),
        "default_budget_s": getattr(backend, "default_budget_s", None),
        "fallback": getattr(backend, "fallback", False),
        "selection": getattr(backend, "selection", None),
        "notes": tuple(notes()) if callable(notes) else _MISSING if notes is not None else (),
        "kernel_source": source_record.to_dict() if isinstance(source_record, KernelSource) else source_record,
        "runs_on_npu": runs_on_npu(backend),
        "operators": has if declared is None else tuple(declared) if isinstance(declared, (tuple, list)) else declared,
    }
    calls = fields["operators"] if isinstance(fields["operators"], tuple) else ("paged_attention_fp8",)
    return _checked(owner, fields, [p for op in calls if op in OPERATORS
                                    for p in signature_problems(getattr(backend, op), op)])


def signature_problems(method: Callable[..., Any], op: str) -> list[str]:
    """What keeps ``method`` (a backend's ``op``, one of :data:`OPERATORS`) from taking the suite's calls,
    one phrase each: an argument of :data:`PASSED_ARGUMENTS` it has no parameter for (and no ``**kwargs``),
    one it takes positional-only, a required parameter the suite never passes. Empty when it takes them."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):     # no signature to read (a builtin): its calls say what is wrong
        return []
    always, sometimes = PASSED_ARGUMENTS[op]
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    problems = []
    for arg in (*always, *sometimes):
        param = params.get(arg)
        if param is not None and param.kind is param.POSITIONAL_ONLY:
            problems.append(f"{op}'s parameter {arg!r} is positional-only, but the suite passes it by keyword")
        elif not any_keyword and (param is None or param.kind not in named):
            problems.append(f"{op} has no parameter {arg!r}, which the suite passes by keyword (docs/spec.md "
                            f"{'§1' if op == 'paged_attention_fp8' else '§6'})")
    for param in params.values():
        if (param.default is param.empty and param.name not in always
                and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
                and not (param.kind is param.POSITIONAL_ONLY and param.name in sometimes)):
            problems.append(f"{op}'s parameter {param.name!r} has no default, but the suite "
                            + ("passes it only sometimes" if param.name in sometimes else "never passes it"))
    return problems


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _codec_name(codec: object) -> object:
    """The name of ``codec`` when it is None or one of golden.codec.CODECS (by object or name), else itself
    (refused by :func:`_checked`, which names it)."""
    if codec is None:
        return SPEC_CODEC.name
    if isinstance(codec, Fp8Codec) and CODECS.get(codec.name) is codec:
        return codec.name
    if isinstance(codec, str) and codec in CODECS:
        return codec
    return codec


def _is_count(value: object, *, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _checked(owner: str, fields: dict[str, Any], signatures: list[str] | None = None) -> Capabilities:
    """``Capabilities(**fields)`` once every field is what the contract says and ``signatures`` (what
    :func:`signature_problems` found) is empty; else one UsageError naming each wrong field, its value
    and what is expected, and each signature problem."""
    wrong: list[str] = list(signatures or ())

    def bad(field: str, expected: str) -> None:
        wrong.append(f"{field}={fields.get(field, _MISSING)!r} must be {expected}")

    name = fields.get("name", _MISSING)
    if not (isinstance(name, str) and name.strip()):
        bad("name", "a non-empty string (how reports name the backend)")
    if fields.get("codec") not in CODECS:
        bad("codec", f"None (the spec's E4M3) or one of golden.codec.CODECS {sorted(CODECS)} (by object or name)")
    model = fields.get("model")
    if model is not None:
        if not isinstance(model, ConformanceModel):
            bad("model", "a golden.model.ConformanceModel narrower than SPEC §4.1, or None")
        else:
            try:
                model.check_narrower(f"backend {owner!r}")
            except UsageError as exc:
                wrong.append(str(exc).removeprefix(f"backend {owner!r}").lstrip(" :"))
    shapes = fields.get("supported_shapes")
    if shapes is not None:
        good = isinstance(shapes, Mapping) and shapes and set(shapes) <= set(SHAPE_FIELDS) and all(
            isinstance(v, (tuple, list)) and v and all(_is_count(x, least=1) for x in v) for v in shapes.values())
        if not good:
            bad("supported_shapes", f"None or a dict of some of {SHAPE_FIELDS} to tuples of positive ints, "
                                    "such as {'head_dim': (128,), 'block_size': (128,)}")
        else:
            fields["supported_shapes"] = {k: tuple(v) for k, v in shapes.items()}
    for field in ("spec_codec_not_applicable", "out_of_bounds_reads", "selection"):
        if fields.get(field) is not None and not isinstance(fields[field], str):
            bad(field, "None or a string")
    if fields.get("threads") is not None and not _is_count(fields["threads"], least=1):
        bad("threads", "None or an int >= 1")
    if fields.get("shrink_calls") is not None and not _is_count(fields["shrink_calls"]):
        bad("shrink_calls", "None or an int >= 0")
    budget = fields.get("default_budget_s")
    if budget is not None and not (isinstance(budget, (int, float)) and not isinstance(budget, bool)
                                   and math.isfinite(budget) and budget >= 0):
        bad("default_budget_s", "None or a number of seconds >= 0")
    for field in ("has_skip_reason", "has_estimate", "kernel_errors_spoil_process", "fallback", "runs_on_npu"):
        if not isinstance(fields.get(field, False), bool):
            bad(field, "True or False")
    notes = fields.get("notes", ())
    if not (isinstance(notes, tuple) and all(isinstance(n, str) for n in notes)):
        bad("notes", "a method notes() returning a list of strings")
    operators = fields.get("operators", OPERATORS)
    if not (isinstance(operators, tuple) and "paged_attention_fp8" in operators
            and all(op in OPERATORS for op in operators) and len(set(operators)) == len(operators)):
        bad("operators", f"a tuple of the kernels it implements among {OPERATORS}, paged_attention_fp8 included")
    kernel_source = fields.get("kernel_source")
    if kernel_source is not None and not isinstance(kernel_source, Mapping):
        bad("kernel_source", "None or a kernels.backends.KernelSource")
    if wrong:
        raise UsageError(printable(f"backend {owner!r} breaks the backend contract (kernels.KernelBackend, "
                                   f"kernels.Capabilities): " + "; ".join(wrong)))
    # Text a backend gives is data (kernels/backends/text.py): whatever shows it shows it as it reads.
    for field in ("spec_codec_not_applicable", "out_of_bounds_reads", "selection"):
        if fields.get(field) is not None:
            fields[field] = printable(fields[field])
    fields["name"] = printable(fields["name"], one_line=True)
    fields["notes"] = tuple(printable(n) for n in fields.get("notes", ()))
    if kernel_source is not None:
        fields["kernel_source"] = {printable(k, one_line=True): printable(v, one_line=True) if isinstance(v, str) else v
                                   for k, v in kernel_source.items()}
    return Capabilities(**fields)


def implements(backend: object, operator: str) -> bool:
    """Whether ``backend`` implements ``operator`` (one of :data:`OPERATORS`): its Capabilities say so
    (a supervised backend), else its declared ``operators``, else its having the method."""
    caps = getattr(backend, "capabilities", None)
    if isinstance(caps, Capabilities):
        return operator in caps.operators
    declared = getattr(backend, "operators", None)
    if isinstance(declared, (tuple, list)):
        return operator in declared
    return callable(getattr(backend, operator, None))
