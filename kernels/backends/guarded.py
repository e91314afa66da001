"""A backend run in this process (``--in-process``, for a debugger), its failures made a supervised one's.

:class:`GuardedBackend` turns what a call raises, SystemExit, KeyboardInterrupt and a call of
``os._exit`` included, into the KernelRaised a supervised call would give (kernels/backends/faults.py);
what it cannot catch (a signal, a crash) ends this process, which only the supervisor guards against.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from pfa_verify.kernels.backends import KernelRunError, Skip, unsupported_shape
from pfa_verify.kernels.backends.contract import Capabilities, CostEstimate
from pfa_verify.kernels.backends.faults import KernelRaised
from pfa_verify.kernels.backends.text import printable

__all__ = ["GuardedBackend"]


class GuardedBackend:
    """A backend run in this process (``--in-process``, for a debugger): its calls' SystemExit,
    KeyboardInterrupt and other exceptions, BackendUnavailable included, become :class:`KernelRaised`
    (a kernels.KernelRunError stays one), their text printable, and so does a call of ``os._exit`` or ``posix._exit`` (one
    function under two names: both raise while the kernel runs). A kernel that ends the process another
    way (a reference to ``_exit`` it took before the call, a signal, a crash) ends this one: only the
    supervisor guards against that (cases/cli/in_process.py makes such an end a failed command).

    Given the backend's ``capabilities`` (kernels.backends.contract.capabilities_of), its optional
    attributes are theirs, defaults included, as a :class:`SupervisedBackend`'s are: a backend that
    declares none of them runs here as it runs supervised."""

    #: The module os takes ``_exit`` from (``posix`` on Linux): a kernel may call it by that name.
    _os_module: Any = sys.modules[os.name]
    #: The attributes read from the capabilities, when given (those SupervisedBackend sets from them).
    _declared = ("model", "supported_shapes", "spec_codec_not_applicable", "out_of_bounds_reads", "threads",
                 "kernel_errors_spoil_process", "shrink_calls", "default_budget_s", "fallback", "selection",
                 "kernel_source")

    def __init__(self, backend: Any, capabilities: Capabilities | None = None) -> None:
        self.inner = backend
        self.capabilities = capabilities

    def __getattr__(self, name: str) -> Any:
        capabilities = self.__dict__.get("capabilities")
        if capabilities is not None:
            if name in self._declared:
                return getattr(capabilities, name)
            found = {"skip_reason": self._skip_reason, "estimate": self._estimate,
                     "notes": lambda: list(capabilities.notes)}.get(name)
            if found is not None:
                return found
        if "inner" not in self.__dict__:          # not built yet (a copy): no attribute, never a recursion
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def _skip_reason(self, config: Any) -> Skip | None:
        """As SupervisedBackend.skip_reason: the backend's own (its answer made a Skip), or its shape limits."""
        assert self.capabilities is not None
        if not self.capabilities.has_skip_reason:
            return unsupported_shape(config, self.capabilities.supported_shapes)
        answer = self._guarded(self.inner.skip_reason, config)
        return None if answer is None else Skip(str(getattr(answer, "kind", "")), str(getattr(answer, "reason", answer)))

    def _estimate(self, config: Any) -> CostEstimate | None:
        """As SupervisedBackend.estimate: the backend's own cost estimate, or None."""
        assert self.capabilities is not None
        if not self.capabilities.has_estimate:
            return None
        answer = self._guarded(self.inner.estimate, config)
        return None if answer is None else CostEstimate(seconds=float(answer.seconds), text=str(answer.describe()))

    def _guarded(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        posix = self._os_module
        real_exit = posix._exit

        def refused_exit(status: int) -> None:
            raise SystemExit(f"os._exit({status})")
        # _exit cannot be caught; while the kernel runs here its names raise instead.
        os._exit = posix._exit = refused_exit  # type: ignore[assignment]
        try:
            return method(*args, **kwargs)
        except KernelRunError as exc:
            raise KernelRunError(printable(exc)) from exc
        except BaseException as exc:     # BackendUnavailable too: from a call, the kernel's error, never a skip
            text = printable(str(exc).strip())
            if isinstance(exc, SystemExit):
                text = (f"the kernel called {printable(exc.code)}" if str(exc.code).startswith("os._exit(")
                        else f"the kernel called sys.exit({printable(repr(exc.code))})")
            raise KernelRaised(text, type_name=printable(type(exc).__name__, one_line=True)) from exc
        finally:
            os._exit = posix._exit = real_exit

    def paged_attention_fp8(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._guarded(self.inner.paged_attention_fp8, *args, **kwargs)

    def qk_matmul_scale(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._guarded(self.inner.qk_matmul_scale, *args, **kwargs)
