"""Per-thread scratch buffers for the golden and its envelope (golden/attention.py, golden/envelope/builder.py).

A fresh multi-megabyte array costs a page fault per 4 KiB on first touch, which on a small case costs
more than decoding into it, and on the upstream cases doubles the cost of a pass over K or V (a
``v.abs()`` into a fresh array took 1.25 ms per 1M float64 elements, into a reused one 0.76 ms).
"""
from __future__ import annotations

import math
import threading

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["SCRATCH"]


class _Scratch(threading.local):
    """Buffers by name, reused across calls. They grow to the largest chunk seen (about 25 MiB per
    thread with the envelope: K, V and one for |K| then |V|, of ``CHUNK_ELEMENTS`` in float64, plus
    codes) and are never shared between threads or handed out of the call that filled them."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        """A numpy array of ``shape`` and ``dtype``, contiguous, contents undefined."""
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = self.buffers[name] = np.empty(size, dtype)
        return buffer[:size].reshape(shape)

    def abs(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``x.abs()`` written into the buffer ``name`` (float64 ``x``)."""
        return torch.abs(x, out=torch.from_numpy(self.array(name, tuple(x.shape), np.float64)))


SCRATCH = _Scratch()
