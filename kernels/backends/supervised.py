"""A supervisor that looks like a backend: :class:`SupervisedBackend` (a kernels.KernelBackend).

Its calls go through a kernels/backends/supervisor.py Supervisor, so the kernel runs in a worker
process: the laws, the shrinker, replays and diagnosis use it as they would the backend itself. Its
attributes are the supervisor's Capabilities; inputs a call changed are written back into the tensors
it was given, and the backend's skip_reason and estimate are asked of a worker once per config.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from pfa_verify.kernels.backends import KernelRunError, Skip, unsupported_shape
from pfa_verify.kernels.backends.contract import CostEstimate
from pfa_verify.kernels.backends.faults import KernelRaised
from pfa_verify.kernels.backends.supervisor import Supervisor

__all__ = ["SupervisedBackend"]


class SupervisedBackend:
    """A backend whose kernels run under ``supervisor`` (kernels.KernelBackend; its attributes are the
    supervisor's :class:`Capabilities`). A call that changed its inputs writes their new bits into the
    tensors it was given, as the kernel in this process would have: the acceptance rule sees it."""

    def __init__(self, supervisor: Supervisor, *, timeout_of: Callable[[Mapping[str, torch.Tensor]], float | None] | None = None) -> None:
        caps = supervisor.capabilities or supervisor.start()
        self.supervisor = supervisor
        self._generation = supervisor.generation
        self.capabilities = caps
        self.name = caps.name
        self.codec = caps.codec_object
        self.model = caps.model
        self.supported_shapes = caps.supported_shapes
        self.spec_codec_not_applicable = caps.spec_codec_not_applicable
        self.out_of_bounds_reads = caps.out_of_bounds_reads
        self.threads = caps.threads
        self.kernel_errors_spoil_process = caps.kernel_errors_spoil_process
        self.shrink_calls = caps.shrink_calls
        self.default_budget_s = caps.default_budget_s
        self.fallback = caps.fallback
        self.selection = caps.selection
        self.kernel_source = caps.kernel_source
        self._skips: dict[str, Skip | None] = {}
        self._estimates: dict[str, CostEstimate | None] = {}
        self._timeout_of = timeout_of
        self.calls = 0

    def notes(self) -> list[str]:
        return list(self.capabilities.notes)

    def close(self) -> None:
        self.supervisor.close()

    def __repr__(self) -> str:
        return f"<SupervisedBackend name={self.name!r} codec={self.capabilities.codec!r}>"

    def _run(self, op: str, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> torch.Tensor:
        present = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        scalars = {**scalars, **{k: v for k, v in tensors.items() if v is not None and not isinstance(v, torch.Tensor)}}
        if self.supervisor.generation != self._generation:
            raise RuntimeError(f"the supervisor of {self.name!r} has loaded another backend since (reload)")
        timeout = self._timeout_of(present) if self._timeout_of is not None else None
        self.calls += 1
        reply = self.supervisor.call(op, present, scalars, timeout=timeout)
        for k, new in reply.changed.items():
            target = present[k]
            if target.shape == new.shape and target.dtype == new.dtype:
                target.copy_(new)
        return reply.result()

    def paged_attention_fp8(self, q: torch.Tensor, q_scale: torch.Tensor, k_cache: torch.Tensor,
                            k_scale: torch.Tensor, v_cache: torch.Tensor, v_scale: torch.Tensor,
                            block_table: torch.Tensor, kv_act_seqs: torch.Tensor, *,
                            softmax_scale: float | None = None, s2_tile: int = 128, g_tile: int | None = None,
                            codec: object = None) -> torch.Tensor:
        tensors = dict(q=q, q_scale=q_scale, k_cache=k_cache, k_scale=k_scale, v_cache=v_cache, v_scale=v_scale,
                       block_table=block_table, kv_act_seqs=kv_act_seqs)
        scalars: dict[str, Any] = {"softmax_scale": softmax_scale, "s2_tile": s2_tile, "g_tile": g_tile}
        if codec is not None:
            scalars["codec"] = codec if isinstance(codec, str) else getattr(codec, "name", codec)
        return self._run("paged_attention_fp8", tensors, scalars)

    def qk_matmul_scale(self, q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                        q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                        codec: object = None) -> torch.Tensor:
        tensors: dict[str, Any] = dict(q=q, k=k, q_scale=q_scale, k_scale=k_scale)
        scalars: dict[str, Any] = {"scale": scale}
        if codec is not None:
            scalars["codec"] = codec if isinstance(codec, str) else getattr(codec, "name", codec)
        return self._run("qk_matmul_scale", tensors, scalars)

    @staticmethod
    def _key(config: Any) -> str:
        return repr(sorted(config.to_dict().items()))

    def prefetch(self, configs: list[Any]) -> None:
        """Ask a worker once for the skip_reason and estimate of every config not asked yet (the run asks
        before its first case, while every worker is free). A query that fails is asked again per config
        (:meth:`skip_reason` then says why, for that case alone)."""
        for kind, cache, wanted in (("skip_reason", self._skips, self.capabilities.has_skip_reason),
                                    ("estimate", self._estimates, self.capabilities.has_estimate)):
            todo = {self._key(c): c for c in configs if self._key(c) not in cache} if wanted else {}
            if not todo:
                continue
            try:
                answers = self.supervisor.query(kind, [c.to_dict() for c in todo.values()])
            except (KernelRunError, KernelRaised):
                continue
            for key, answer in zip(todo, answers, strict=True):
                cache[key] = _answer(kind, answer)       # type: ignore[assignment]

    def skip_reason(self, config: Any) -> Skip | None:
        """The backend's own skip_reason (asked of a worker once per config), or its shape limits. A
        skip_reason that raises or answers outside the protocol raises (KernelRaised, KernelFault): the
        case is an error, never a skip."""
        if not self.capabilities.has_skip_reason:
            return unsupported_shape(config, self.supported_shapes)
        key = self._key(config)
        if key not in self._skips:
            (answer,) = self.supervisor.query("skip_reason", [config.to_dict()])
            self._skips[key] = _answer("skip_reason", answer)     # type: ignore[assignment]
        return self._skips[key]

    def estimate(self, config: Any) -> CostEstimate | None:
        """The backend's own cost estimate of ``config`` (asked of a worker once per config), or None (none,
        or an estimate that failed: the case then runs without one)."""
        if not self.capabilities.has_estimate:
            return None
        key = self._key(config)
        if key not in self._estimates:
            try:
                (answer,) = self.supervisor.query("estimate", [config.to_dict()])
            except (KernelRunError, KernelRaised):
                answer = None
            self._estimates[key] = _answer("estimate", answer)    # type: ignore[assignment]
        return self._estimates[key]


def _answer(kind: str, answer: Mapping[str, Any] | None) -> Skip | CostEstimate | None:
    """A checked answer (protocol.check_answers) as the Skip or CostEstimate it stands for."""
    if answer is None:
        return None
    if kind == "skip_reason":
        return Skip(answer["kind"], answer["reason"])
    return CostEstimate(seconds=float(answer["seconds"]), text=answer["text"])
