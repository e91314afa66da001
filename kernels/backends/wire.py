"""The messages between the supervisor and a kernel's worker process (kernels/backends/worker_process.py):
data only, never pickle, so nothing a kernel sends can run code in the process that judges it.

A message is one frame on a pipe:

    b"PFAW"  uint32 header length  header (UTF-8 JSON)  then, for each entry of header["buffers"]:
    uint64 length  the buffer's bytes

The header is a JSON object with a ``type`` and its fields; tensors travel as entries of
``header["tensors"]`` (``name``, ``dtype``, ``shape``, ``stride``, and ``buffer``: an index into the
buffers) holding their bytes in memory order of a contiguous copy. Reading is bounded: a header over
:data:`MAX_HEADER_BYTES`, buffers over the reader's ``max_bytes`` in all, an unknown dtype, or a
buffer whose length does not match its tensor's shape is a :class:`WireError`, never an allocation
the peer chose.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["WireError", "PeerClosed", "MAGIC", "MAX_HEADER_BYTES", "DTYPES", "write_message", "read_message",
           "pack_tensors", "unpack_tensors", "raw_bytes"]

MAGIC = b"PFAW"
#: A header holds names, shapes and short texts (an error's message is cut to 20,000 characters).
MAX_HEADER_BYTES = 4 * 2**20

#: The tensor dtypes that cross, by name (torch's own names, ``str(dtype)`` without ``torch.``).
DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in (
    torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)}

_PREFIX = struct.Struct("<4sI")
_LENGTH = struct.Struct("<Q")


class WireError(RuntimeError):
    """A frame that is not a well-formed message of this protocol (or is larger than allowed)."""


class PeerClosed(WireError):
    """The other end closed its pipe (its process ended) before or inside a frame."""


def _read_exactly(fd: int, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise PeerClosed(f"the pipe closed after {got} of {n} bytes")
        got += k
    return buf


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        k = os.write(fd, view)
        view = view[k:]


def write_message(fd: int, header: Mapping[str, Any], buffers: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    """Write one frame: ``header`` (JSON-able) and its ``buffers``, in order."""
    head = json.dumps({**header, "buffers": len(buffers)}, allow_nan=False).encode()
    if len(head) > MAX_HEADER_BYTES:
        raise WireError(f"a header of {len(head)} bytes is over the limit of {MAX_HEADER_BYTES}")
    _write_all(fd, _PREFIX.pack(MAGIC, len(head)) + head)
    for b in buffers:
        view = memoryview(b).cast("B")
        _write_all(fd, _LENGTH.pack(view.nbytes))
        _write_all(fd, view)


def read_message(fd: int, *, max_bytes: int) -> tuple[dict[str, Any], list[bytearray]]:
    """Read one frame: ``(header, buffers)``. WireError for anything malformed or over ``max_bytes``
    (the buffers' total); PeerClosed when the pipe ends."""
    magic, length = _PREFIX.unpack(bytes(_read_exactly(fd, _PREFIX.size)))
    if magic != MAGIC:
        raise WireError(f"a frame starts with {magic!r}, not {MAGIC!r}")
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a header of {length} bytes is over the limit of {MAX_HEADER_BYTES}")
    try:
        header = json.loads(bytes(_read_exactly(fd, length)))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"the header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("buffers"), int) or header["buffers"] < 0:
        raise WireError("the header is not an object with a buffer count")
    buffers: list[bytearray] = []
    total = 0
    for _ in range(header["buffers"]):
        (n,) = _LENGTH.unpack(bytes(_read_exactly(fd, _LENGTH.size)))
        total += n
        if total > max_bytes:
            raise WireError(f"the message's buffers reach {total} bytes, over the limit of {max_bytes}")
        buffers.append(_read_exactly(fd, n))
    return header, buffers


def pack_tensors(tensors: Mapping[str, torch.Tensor]) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """(entries for a header's ``tensors``, their buffers) of CPU tensors; strides are kept so that the
    other side rebuilds the same layout."""
    entries: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise WireError(f"tensor {name!r} has dtype {t.dtype}, which does not cross (expected one of {sorted(DTYPES)})")
        entries.append({"name": name, "dtype": dtype, "shape": list(t.shape), "stride": list(t.stride()),
                        "buffer": len(buffers)})
        buffers.append(raw_bytes(t))
    return entries, buffers


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of ``t``'s elements in memory order of a contiguous copy (no copy when it is one)."""
    flat = t.detach().cpu().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:          # a one-element view keeps its odd stride
        flat = flat.clone(memory_format=torch.contiguous_format).as_strided((flat.numel(),), (1,))
    if not flat.numel():
        return memoryview(b"")
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return flat.view(torch.uint8).numpy().data      # the array's own buffer, as memoryview(array) gives


def unpack_tensors(entries: object, buffers: Sequence[bytearray]) -> dict[str, torch.Tensor]:
    """The tensors a header's ``tensors`` entries describe, each a new writable CPU tensor of its own
    memory (``buffers`` are taken over, not copied). WireError for an entry that does not match its buffer."""
    if not isinstance(entries, list):
        raise WireError("tensors must be a list of entries")
    out: dict[str, torch.Tensor] = {}
    for e in entries:
        try:
            name, dtype, shape, stride, index = e["name"], DTYPES[e["dtype"]], e["shape"], e["stride"], e["buffer"]
            if not (isinstance(name, str) and all(isinstance(n, int) and n >= 0 for n in shape)
                    and len(stride) == len(shape) and all(isinstance(s, int) and s >= 0 for s in stride)):
                raise TypeError
            raw = buffers[index]
        except (KeyError, TypeError, IndexError):
            raise WireError(f"a tensor entry is malformed: {str(e)[:200]}") from None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if len(raw) != math.prod(shape) * itemsize:
            raise WireError(f"tensor {name!r}: {len(raw)} bytes for shape {shape} of {e['dtype']}")
        flat = torch.frombuffer(raw, dtype=torch.uint8) if len(raw) else torch.empty(0, dtype=torch.uint8)
        dense = flat.view(dtype).reshape(shape)
        if list(dense.stride()) == stride or 0 in shape:
            out[name] = dense
            continue
        try:
            strided = torch.empty_strided(shape, stride, dtype=dtype)
            strided.copy_(dense)
            out[name] = strided
        except RuntimeError:     # overlapping strides (an expanded view) cannot be rebuilt: the values are
            out[name] = dense
    return out
