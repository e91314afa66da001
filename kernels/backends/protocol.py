"""What a supervisor and its worker say to each other, and the inputs' shared memory.

Frames are kernels/backends/wire.py's. This module says what each request carries and what each reply
must be, and it is where the driver's evidence comes from:

- **Inputs in memory the driver reads back.** Each worker gets, when it starts, a memory file
  (``memfd_create``; an unlinked temporary file where there is none) that the driver fills with a
  call's inputs (:func:`write_inputs`). The worker maps it and hands the kernel tensors *on that
  memory* (:func:`map_inputs`), so whatever the kernel writes into its inputs lands there; after the
  reply the driver reads the memory back itself and compares it with its own copy
  (:func:`changed_inputs`). Which inputs a call changed is therefore decided by the driver, from
  bytes it reads, never from what the worker reports: a kernel that patches the worker's code cannot
  hide a write. Reads go through ``pread`` (never a mapping in the driver), so a kernel that shrinks
  the file gets a refusal, not a SIGBUS in the driver.
- **Every reply checked.** :func:`parse_reply` accepts only the reply types a request allows, with
  the request's sequence number, the fields of that type and their types; anything else (a frame the
  kernel wrote on the pipe itself, a field the protocol does not have, a wrong type) is a
  :class:`ProtocolError`, which the supervisor turns into an ``error`` verdict naming the worker. All
  text in a reply passes through kernels.backends.text.printable.

Messages:

=========================  =====================================================================
request                    reply
=========================  =====================================================================
``load`` backend, options  ``ready`` capabilities, or ``refused`` (kind, type_name, message)
``call`` op, scalars,      ``result``: the output tensor; or ``raised`` (kind, type_name, message,
inputs (their slots)       traceback); ``spoiled`` when the process must not run another call (W7)
``skip_reason`` configs    ``answers``: per config None or {kind, reason}
``estimate`` configs       ``answers``: per config None or {seconds, text}
=========================  =====================================================================

Every request carries ``seq``, a number per worker, and its reply echoes it.
"""
from __future__ import annotations

import dataclasses
import math
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pfa_verify.kernels.backends import wire
from pfa_verify.kernels.backends.text import printable

__all__ = ["ProtocolError", "Slot", "Reply", "RAISED_KINDS", "BACKEND_SKIP_KINDS", "open_input_memory", "layout",
           "write_inputs", "changed_inputs", "release_inputs", "map_inputs", "parse_reply", "check_answers", "REPLIES"]

_ALIGN = 64
_CHUNK = 1 << 22
#: The kinds of a ``raised`` or ``refused`` reply (kernels/backends/sandbox.py).
RAISED_KINDS = ("unavailable", "kernel_run", "usage", "exit", "interrupt", "raised")
#: The kinds of skip a backend's own skip_reason may give (the others are the run's: budget, quarantined).
BACKEND_SKIP_KINDS = ("unsupported", "limit")
#: The reply types each request allows.
REPLIES = {"load": ("ready", "refused"), "call": ("result", "raised"), "skip_reason": ("answers", "raised"),
           "estimate": ("answers", "raised")}
_TEXT_FIELDS = {"kind": str, "type_name": str, "message": str, "traceback": str}
# Fields each reply type may carry, with their types (None allowed where a tuple names type(None)).
_FIELDS: dict[str, dict[str, Any]] = {
    "ready": {"capabilities": dict, "pid": int},
    "refused": dict(_TEXT_FIELDS),
    "result": {"tensors": list, "seconds": (int, float), "spoiled": (str, type(None))},
    "raised": {**_TEXT_FIELDS, "seconds": (int, float), "spoiled": (str, type(None))},
    "answers": {"answers": list},
}
_REQUIRED = {"ready": ("capabilities",), "refused": ("kind", "message"), "result": ("tensors",),
             "raised": ("kind", "message"), "answers": ("answers",)}


class ProtocolError(wire.WireError):
    """A reply that is not what the protocol allows for the request it answers."""


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one input tensor lies in the input memory: ``offset`` and ``nbytes``, its dtype and shape."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
                "nbytes": self.nbytes}


@dataclasses.dataclass(frozen=True)
class Reply:
    """A checked reply: its ``type`` and fields (text already printable), the ``output`` of a result."""
    type: str
    fields: Mapping[str, Any]
    output: torch.Tensor | None = None


# -- the input memory (driver side) -------------------------------------------------------------

def open_input_memory() -> int:
    """A new memory file for one worker's inputs (inheritable by it through ``pass_fds``)."""
    create = getattr(os, "memfd_create", None)
    if create is not None:
        try:
            return int(create("pfa-verify-inputs", getattr(os, "MFD_CLOEXEC", 0)))
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix="pfa-verify-inputs-")
    os.unlink(path)
    return fd


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[Slot], int]:
    """The slots of ``tensors`` (each at a 64-byte boundary, in order) and the memory's size."""
    slots, offset = [], 0
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in wire.DTYPES:
            raise wire.WireError(f"input {name!r} has dtype {t.dtype}, which does not cross "
                                 f"(expected one of {sorted(wire.DTYPES)})")
        nbytes = t.numel() * t.element_size()
        slots.append(Slot(name, dtype, tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return slots, offset


def write_inputs(fd: int, tensors: Mapping[str, torch.Tensor], slots: Sequence[Slot], size: int) -> None:
    """Fill the memory file ``fd`` with ``tensors`` (their elements in memory order of a contiguous copy)."""
    os.ftruncate(fd, 0)              # whatever a kernel left there goes: the file is the inputs and nothing else
    os.ftruncate(fd, size)
    for slot in slots:
        view = wire.raw_bytes(tensors[slot.name])
        done = 0
        while done < slot.nbytes:
            done += os.pwrite(fd, view[done:done + _CHUNK], slot.offset + done)


def _read(fd: int, offset: int, nbytes: int) -> bytes:
    data = os.pread(fd, nbytes, offset)
    if len(data) != nbytes:
        raise ProtocolError(f"the memory holding the kernel's inputs was cut short ({len(data)} of {nbytes} bytes "
                            f"at offset {offset}): the kernel's process truncated it")
    return data


def changed_inputs(fd: int, tensors: Mapping[str, torch.Tensor], slots: Sequence[Slot]) -> dict[str, torch.Tensor]:
    """The inputs whose bytes in the memory file differ from ``tensors`` (the driver's own copies), each
    read back as a new tensor: the call's writes into its inputs, as the driver sees them."""
    changed: dict[str, torch.Tensor] = {}
    for slot in slots:
        mine = wire.raw_bytes(tensors[slot.name])
        if all(_read(fd, slot.offset + i, min(_CHUNK, slot.nbytes - i)) == mine[i:i + _CHUNK]
               for i in range(0, slot.nbytes, _CHUNK)):
            continue
        raw = bytearray(_read(fd, slot.offset, slot.nbytes))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        changed[slot.name] = flat.view(wire.DTYPES[slot.dtype]).reshape(slot.shape)
    return changed


def release_inputs(fd: int) -> None:
    """Give the memory of the last call's inputs back."""
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass


# -- the input memory (worker side) -------------------------------------------------------------

def map_inputs(fd: int, slots: object, size: object) -> tuple[dict[str, torch.Tensor], mmap.mmap | None]:
    """The call's input tensors on the shared memory ``fd`` (writes reach the driver's memory file),
    and the mapping (close it once the tensors are gone). WireError for slots that do not fit."""
    if not isinstance(size, int) or size < 0 or not isinstance(slots, list):
        raise wire.WireError("a call's inputs must be a list of slots and a size")
    mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) if size else None
    tensors: dict[str, torch.Tensor] = {}
    for entry in slots:
        try:
            name, dtype, shape = entry["name"], wire.DTYPES[entry["dtype"]], tuple(entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise wire.WireError(f"an input slot is malformed: {str(entry)[:200]}") from None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if nbytes != math.prod(shape) * itemsize or offset < 0 or offset + nbytes > size:
            raise wire.WireError(f"input {name!r}: {nbytes} bytes at {offset} do not fit shape {list(shape)} "
                                 f"in {size} bytes")
        if nbytes == 0 or mapping is None:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        tensors[name] = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)
    return tensors, mapping


# -- replies (driver side) ------------------------------------------------------------------------

def _type_name(expected: Any) -> str:
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def parse_reply(header: Mapping[str, Any], buffers: Sequence[bytearray], *, request: str, seq: int,
                max_output_bytes: int | None = None) -> Reply:
    """The reply ``header`` (and ``buffers``) to request ``request`` number ``seq``, checked: one of the
    types the request allows, the same ``seq``, only that type's fields with their types, no buffer but
    a result's one output tensor. ProtocolError saying what is wrong otherwise."""
    kind = header.get("type")
    allowed = REPLIES.get(request, ())
    if not isinstance(kind, str) or kind not in allowed:
        raise ProtocolError(f"a reply of type {printable(repr(kind), one_line=True)[:80]} to a {request} request "
                            f"(expected {' or '.join(allowed)})")
    if header.get("seq") != seq:
        raise ProtocolError(f"a reply numbered {printable(repr(header.get('seq')), one_line=True)[:40]} to request "
                            f"{seq}: not the answer to this request")
    fields = {k: v for k, v in header.items() if k not in ("type", "seq", "buffers")}
    spec = _FIELDS[kind]
    unknown = sorted(set(fields) - set(spec))
    if unknown:
        raise ProtocolError(f"a {kind} reply with field(s) the protocol does not have: "
                            f"{printable(', '.join(map(str, unknown)), one_line=True)[:200]}")
    missing = [f for f in _REQUIRED[kind] if f not in fields]
    if missing:
        raise ProtocolError(f"a {kind} reply without {', '.join(missing)}")
    for name, value in fields.items():
        expected = spec[name]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ProtocolError(f"a {kind} reply whose {name} is {type(value).__name__}, not {_type_name(expected)}")
    if "kind" in fields and fields["kind"] not in RAISED_KINDS:
        raise ProtocolError(f"a {kind} reply of kind {printable(repr(fields['kind']), one_line=True)[:80]}")
    if "seconds" in fields and not (math.isfinite(fields["seconds"]) and fields["seconds"] >= 0):
        raise ProtocolError(f"a {kind} reply whose seconds is {fields['seconds']!r}")
    clean = {k: printable(v) if isinstance(v, str) else v for k, v in fields.items()}
    output = None
    if kind == "result":
        entries = fields["tensors"]
        if len(entries) != 1 or len(buffers) != 1 or not isinstance(entries[0], dict) \
                or entries[0].get("name") != "output":
            raise ProtocolError("a result must carry exactly one tensor, named output, and its one buffer")
        if max_output_bytes is not None and len(buffers[0]) > max_output_bytes:
            raise ProtocolError(f"an output of {len(buffers[0])} bytes, over the limit of {max_output_bytes}")
        output = wire.unpack_tensors(entries, buffers)["output"]
    elif buffers:
        raise ProtocolError(f"a {kind} reply with {len(buffers)} buffer(s); it carries none")
    return Reply(kind, clean, output)


def check_answers(kind: str, answers: Sequence[Any], count: int) -> list[dict[str, Any] | None]:
    """The ``answers`` of a ``skip_reason`` or ``estimate`` query for ``count`` configs, checked: per
    config None, {kind, reason} (a kind of :data:`BACKEND_SKIP_KINDS`) or {seconds, text}; text printable.
    ProtocolError for anything else."""
    if len(answers) != count:
        raise ProtocolError(f"{len(answers)} {kind} answer(s) for {count} config(s)")
    want: dict[str, Any] = ({"kind": str, "reason": str} if kind == "skip_reason"
                            else {"seconds": (int, float), "text": str})
    checked: list[dict[str, Any] | None] = []
    for answer in answers:
        if answer is None:
            checked.append(None)
            continue
        if not isinstance(answer, dict) or set(answer) != set(want) or any(
                isinstance(answer[k], bool) or not isinstance(answer[k], t) for k, t in want.items()):
            raise ProtocolError(f"a {kind} answer that is not None or {{{', '.join(want)}}}: "
                                f"{printable(repr(answer), one_line=True)[:200]}")
        if kind == "skip_reason" and answer["kind"] not in BACKEND_SKIP_KINDS:
            raise ProtocolError(f"a skip of kind {printable(repr(answer['kind']), one_line=True)[:80]}: a backend "
                                f"skips with one of {BACKEND_SKIP_KINDS}")
        if kind == "estimate" and not (math.isfinite(answer["seconds"]) and answer["seconds"] >= 0):
            raise ProtocolError(f"an estimate of {answer['seconds']!r} seconds")
        checked.append({k: printable(v) if isinstance(v, str) else v for k, v in answer.items()})
    return checked
