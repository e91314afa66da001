"""Whether a kernel answered the same question twice differently: the evidence that marks a capture
nondeterministic (cases/data/regressions.py, ``mark_nondeterministic``).

A question is what a kernel call was asked: the op, every input tensor's dtype, shape and bytes, and the
scalars. An answer is what came back: the output's dtype, shape and bytes (a sha256), or the type of what
the kernel raised. A deterministic kernel gives the same bits to the same question; two different answers
are a race on a device, state kept between calls, or uninitialized memory, whatever the verdicts said.
:class:`Recorded` is a backend that tells its :class:`Answers` of every call of the backend it wraps, and
delegates everything else; a call that did not come back (its worker ended or timed out:
``kernels.backends.faults.KernelFault``) is no answer. The digests are taken in this process, from
the tensors as the driver handed them over and the output as it came back.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable
from typing import Any

import torch

from pfa_verify.kernels.backends.faults import KernelFault

__all__ = ["Answers", "Recorded", "question", "answer", "raised"]

OPS = ("paged_attention_fp8", "qk_matmul_scale")


def _feed(digest, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        digest.update(f"tensor {t.dtype} {list(t.shape)};".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy())
    else:
        digest.update(f"{type(value).__name__} {value!r};".encode())


def question(op: str, args: tuple, kwargs: dict) -> str:
    """The sha256 of a call: ``op``, its positional and keyword arguments (tensors by dtype, shape and bytes)."""
    digest = hashlib.sha256(op.encode())
    for k, value in [*enumerate(args), *sorted(kwargs.items())]:
        digest.update(f"|{k}=".encode())
        _feed(digest, value)
    return digest.hexdigest()


def answer(out: Any) -> str:
    """An output in words: ``output <first 12 hex digits of its sha256>`` (dtype, shape and bytes)."""
    digest = hashlib.sha256()
    _feed(digest, out)
    return f"output {digest.hexdigest()[:12]}"


def raised(exc: BaseException) -> str:
    """A call that raised, in words (the kernel's own exception type, where the supervisor carried it)."""
    return f"raised {getattr(exc, 'type_name', None) or type(exc).__name__}"


@dataclasses.dataclass
class Answers:
    """The first answer heard to each question, and each different answer heard since, in words."""
    first: dict[Hashable, tuple[str, str]] = dataclasses.field(default_factory=dict)
    differences: list[str] = dataclasses.field(default_factory=list)

    def heard(self, asked: Hashable, said: str, where: str) -> None:
        """Answer ``said`` (:func:`answer`, :func:`raised`) to question ``asked``, heard ``where`` (words)."""
        before = self.first.setdefault(asked, (said, where))
        if before[0] != said:
            self.differences.append(f"{before[0]} ({before[1]}), then {said} ({where}) on the same inputs")

    def seen(self) -> str | None:
        """The first difference heard, and how many more (None: every question got one answer)."""
        if not self.differences:
            return None
        more = len(self.differences) - 1
        return self.differences[0] + (f"; {more} more" if more else "")


class Recorded:
    """``backend`` with every kernel call's question and answer told to ``answers`` (``where``: words
    for each call, e.g. "replay 2"); everything else is the backend's own."""

    def __init__(self, backend: Any, answers: Answers, where: str = "") -> None:
        self.inner = backend
        self.answers = answers
        self.where = where

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _call(self, op: str, args: tuple, kwargs: dict) -> Any:
        asked = question(op, args, kwargs)        # before the call: a kernel may change what it was handed
        try:
            out = getattr(self.inner, op)(*args, **kwargs)
        except KernelFault:
            raise                                  # no answer: the worker ended or outlived its time
        except Exception as exc:
            self.answers.heard(asked, raised(exc), self.where or op)
            raise
        self.answers.heard(asked, answer(out), self.where or op)
        return out

    def paged_attention_fp8(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("paged_attention_fp8", args, kwargs)

    def qk_matmul_scale(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("qk_matmul_scale", args, kwargs)
