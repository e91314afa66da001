"""A captured case's tensors in its .npz: written byte for byte the same for the same tensors, and read
back only when every array is the one the case's config implies.

The .npz holds the eight tensors of ``golden.InputBundle`` (``q``, ``q_scale``, ``k_cache``, ``k_scale``,
``v_cache``, ``v_scale``, ``block_table``, ``kv_act_seqs``, in that order) as ``<name>.npy``, then a
dtype marker for each, ``__dtype__<name>.npy`` (a 0-d unicode array holding the torch dtype's name).
fp8 tensors are stored as their uint8 codes and bfloat16 as int16 bits; everything else as itself.
Members are stored uncompressed with a fixed timestamp, so the file's sha256 is a function of the
tensors alone: the file is named by it, and the record carries it (cases/data/capture_files.py).

Reading checks, before any array's data is read (the .npy headers hold dtype and shape): exactly
those sixteen members, each tensor of the storage dtype and shape :func:`expected` derives from the
config (the shapes ``golden.make_inputs`` builds), each marker the dtype's name. Arrays are read with
``allow_pickle=False``. Once read, :func:`check_agreement` holds the values the config states to the
arrays: ``kv_act_seqs`` (the config's lengths) and ``block_table`` (the config's table, or, where the
config leaves it to ``make_inputs``' seed, a table that serves its lengths): a case replays the arrays, so a
config that says otherwise would label the case it did not run.
"""
from __future__ import annotations

import io
import zipfile
import zlib

import numpy as np
import torch

from pfa_verify import golden
from pfa_verify.golden.errors import UsageError
from pfa_verify.golden.validate import check_block_table

__all__ = ["expected", "describe", "npz_bytes", "read_npz", "check_agreement", "MARKER_PREFIX"]

MARKER_PREFIX = "__dtype__"
# Stored as another dtype (numpy has neither): the bits, viewed back on reading.
_STORED_AS = {"float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "bfloat16": "int16"}
_TORCH = {name: getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "bfloat16")}
_EPOCH = (1980, 1, 1, 0, 0, 0)     # the earliest time a zip entry can hold: no clock in the bytes


def _order() -> tuple[str, ...]:
    return golden.InputBundle.TENSORS


def _entry(name: str, dtype: str, shape) -> dict:
    return {"name": name, "dtype": dtype, "stored_as": _STORED_AS.get(dtype, dtype), "shape": [int(n) for n in shape]}


def expected(config) -> list[dict]:
    """``{"name", "dtype", "stored_as", "shape"}`` of each tensor of ``golden.make_inputs(config, seed)``,
    in the bundle's order, from the config alone (nothing is allocated). tests/cases/test_capture_files.py
    holds it to make_inputs' bundle on every catalog case."""
    c = config
    rows, cells = (c.batch * c.s1, c.nq), (c.physical_blocks, c.block_size, c.nkv)
    spec = {"q": ("float8_e4m3fn", (*rows, c.head_dim)), "q_scale": ("float32", (*rows, 1)),
            "k_cache": ("float8_e4m3fn", (*cells, c.head_dim)), "k_scale": ("float32", (*cells, 1)),
            "v_cache": ("float8_e4m3fn", (*cells, c.head_dim)), "v_scale": ("float32", (c.batch, c.nkv, c.head_dim)),
            "block_table": ("int32", (c.batch, c.table_columns)), "kv_act_seqs": ("int32", (c.batch,))}
    return [_entry(name, *spec[name]) for name in _order()]


def describe(tensors: dict[str, torch.Tensor]) -> list[dict]:
    """The same description of actual tensors (what a record lists under ``arrays``), in the bundle's order."""
    return [_entry(name, _dtype_name(tensors[name]), tensors[name].shape) for name in _ordered(tensors)]


def _ordered(tensors: dict) -> list[str]:
    order = _order()
    unknown = sorted(set(tensors) - set(order))
    if unknown:
        raise ValueError(f"tensors {unknown} are not inputs of paged_attention_fp8; expected some of {list(order)}")
    return [name for name in order if name in tensors]


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    stored = _STORED_AS.get(_dtype_name(t))
    t = t.detach().contiguous()
    return np.ascontiguousarray((t.view(getattr(torch, stored)) if stored else t).numpy())


def _member(z: zipfile.ZipFile, filename: str, array: np.ndarray) -> None:
    info = zipfile.ZipInfo(filename, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    body = io.BytesIO()
    np.lib.format.write_array(body, array, allow_pickle=False)
    z.writestr(info, body.getvalue(), compress_type=zipfile.ZIP_STORED)


def npz_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """The .npz of ``tensors`` (the module docstring's layout): the same bytes for the same tensors."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        names = _ordered(tensors)
        for name in names:
            _member(z, f"{name}.npy", _to_numpy(tensors[name]))
        for name in names:
            _member(z, f"{MARKER_PREFIX}{name}.npy", np.array(_dtype_name(tensors[name])))
    return buffer.getvalue()


def _header(z: zipfile.ZipFile, member: str):
    with z.open(member) as f:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f".npy format {version} is not supported")
        return read(f)


def _read(z: zipfile.ZipFile, member: str) -> np.ndarray:
    with z.open(member) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def read_npz(blob: bytes, name: str, want: list[dict]) -> dict[str, torch.Tensor]:
    """The tensors of the .npz ``blob`` (file ``name``), when its members are exactly those of ``want``
    (:func:`expected`) with their dtypes, shapes and markers; a UsageError naming the file and the first
    array that differs otherwise. fp8 and bfloat16 come back as those dtypes, bit for bit."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            _check_members(z, name, [w["name"] for w in want])
            for w in want:
                _check_array(z, name, w)
            out = {}
            for w in want:
                t = torch.from_numpy(np.array(_read(z, f"{w['name']}.npy")))
                out[w["name"]] = t.view(_TORCH[w["dtype"]]) if w["dtype"] in _TORCH else t
            return out
    except UsageError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, NotImplementedError,
            OverflowError) as exc:
        raise UsageError(f"{name}: not a readable .npz ({type(exc).__name__}: {exc})".splitlines()[0]) from None


def _check_members(z: zipfile.ZipFile, name: str, tensors: list[str]) -> None:
    members = [info.filename for info in z.infolist()]
    needed = [f"{n}.npy" for n in tensors] + [f"{MARKER_PREFIX}{n}.npy" for n in tensors]
    duplicated = sorted({m for m in members if members.count(m) > 1})
    missing = [m.removesuffix(".npy") for m in needed if m not in members]
    unexpected = sorted(set(members) - set(needed))
    if missing:
        what = f"missing array(s) {missing}"
    elif unexpected:
        what = f"unexpected member(s) {unexpected}"
    elif duplicated:
        what = f"member(s) {duplicated} stored twice"
    else:
        return
    raise UsageError(f"{name}: {what}; a capture holds {tensors} and their {MARKER_PREFIX} markers")


def _check_array(z: zipfile.ZipFile, name: str, w: dict) -> None:
    """One tensor's storage dtype and shape, from its .npy header, and its marker's value."""
    shape, _, dtype = _header(z, f"{w['name']}.npy")
    if dtype != np.dtype(w["stored_as"]) or dtype.hasobject:
        codes = f" ({w['dtype']} codes)" if w["stored_as"] != w["dtype"] else ""
        raise UsageError(f"{name}: array {w['name']!r} has dtype {dtype}, expected {w['stored_as']}{codes} "
                         "for this case's config")
    if list(shape) != w["shape"]:
        raise UsageError(f"{name}: array {w['name']!r} has shape {list(shape)}, expected {w['shape']} "
                         "for this case's config")
    member = f"{MARKER_PREFIX}{w['name']}.npy"
    shape, _, dtype = _header(z, member)
    marker = str(_read(z, member)) if dtype.kind == "U" and shape == () and dtype.itemsize <= 256 else None
    if marker != w["dtype"]:
        found = repr(marker) if marker is not None else f"an array of dtype {dtype}, shape {list(shape)}"
        raise UsageError(f"{name}: dtype marker of {w['name']!r} is {found}, expected {w['dtype']!r}")


def check_agreement(name: str, config, tensors: dict[str, torch.Tensor]) -> None:
    """A UsageError naming the field unless the stored ``tensors`` hold what ``config`` states: its
    lengths in ``kv_act_seqs``; its ``block_table`` when it names one, else a table that serves its
    lengths (each valid entry a block of its own in range, as make_inputs draws them)."""
    lengths = [int(n) for n in tensors["kv_act_seqs"].tolist()]
    if lengths != list(config.lengths):
        raise UsageError(f"{name}: its config says kv_act_seqs {list(config.lengths)}, but the stored kv_act_seqs "
                         f"is {lengths}: config and arrays disagree")
    table = tensors["block_table"].tolist()
    if config.block_table is not None:
        want = [list(row) for row in config.block_table]
        if table != want:
            row = next(b for b, (got, need) in enumerate(zip(table, want, strict=True)) if got != need)
            raise UsageError(f"{name}: its config says block_table row {row} is {want[row]}, but the stored "
                             f"block_table's is {table[row]}: config and arrays disagree")
        return
    try:
        check_block_table(table, lengths, block_size=config.block_size, num_blocks=config.physical_blocks,
                          shape=(config.batch, config.table_columns), unique=True)
    except ValueError as exc:
        raise UsageError(f"{name}: its stored block_table does not serve its config ({exc})") from None
