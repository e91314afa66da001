"""FP8 E4M3 codecs: how a float becomes one of 256 codes and back (SPEC §3).

The spec codec is OCP E4M3FN: sign bit, 4 exponent bits with bias 7, 3 mantissa bits, no
infinities, NaN only at 0x7F / 0xFF, largest normal 448 (code 0x7E), smallest subnormal 2^-9.

It is implemented here, on purpose, instead of calling ``tensor.to(torch.float8_e4m3fn)``: torch's
own cast gave NaN on overflow before 2.12 and saturates since 2.13, and the golden must not change
with the installed torch. The only torch fp8 facility used is the bit view
(``uint8 <-> float8_e4m3fn``), which copies no value and rounds nothing.

Decisions recorded here (SPEC §3), each with its test in tests/golden/test_codec.py:

- Rounding is to nearest, ties to even, on the E4M3 grid; overflow is checked after rounding, so
  448 < |x| <= 464 rounds to 448 by the grid itself (``test_encode_rounding_midpoints``).
- Overflow saturates: a rounded magnitude above 448 and +-inf encode to +-448 (0x7E / 0xFE), as the
  950's saturating cast does (``test_encode_saturates``).
- NaN stays NaN (code 0x7F, 0xFF when the sign bit is set): garbage that leaks must stay visible.
  The 950's saturating cast writes 0 for NaN instead (``test_encode_keeps_nan``).
- Signed zero keeps its sign (-0.0 -> 0x80), as every IEEE conversion does.

How it runs at memory speed (the budget in docs/performance.md). The rule of each codec is written once, as float arithmetic
on the magnitude (``round_to_e4m3_grid``, ``e4m3_code_of`` in golden/e4m3.py, ``_encode_magnitude``), and ``encode``
and ``round`` read it from a table of 2 x 65536 entries built from that rule on first use. The
index of a float32 x is its top 16 bits (sign, exponent, 7 mantissa bits) and one more bit saying
whether its low 16 bits are nonzero. That is enough: every rounding boundary of the spec codec is a
grid midpoint, a float32 with at most 5 significant bits (tests/golden/test_codec.py), so its low
16 bits are zero, and the code can only change between two patterns of the same top 16 bits at the
first one (the midpoint itself, which ties to even) or the next (just above it): the code of
``top | 1`` stands for every ``top | low`` with ``low != 0``. The calculator's codec rounds to an
integer first; ``np.rint`` does that exactly in float32 (half to even), and an integer below 2^8
has zero low bits, larger ones saturate. tests/golden/test_codec_tables.py holds the tables equal to
the float-arithmetic encoder (tests/golden/codec_reference.py) on every
midpoint, NaN, infinity, subnormal and signed zero, on a dense sample of the 2^32 patterns (all of
them under ``slow``).
``decode_array`` reads two codes at once from a 65536-entry table of value pairs.

A second codec, ``PYPTO_CALCULATOR_CODEC``, models the E4M3 of PyPTO 0.2.0's CPU calculator (the
engine that executes a kernel's tensor graph without an NPU). It is not E4M3FN; the rules were
measured through the calculator itself (tests/kernels/test_calculator_codec.py) and are listed
on the class.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar, cast

import numpy as np
import torch

from .e4m3 import (
    MANTISSA_BITS,
    NAN_CODE,
    SIGN_BIT,
    e4m3_code_of,
    e4m3fn_decode_table,
    round_to_e4m3_grid,
    table_index,
    table_patterns,
)

__all__ = [
    "FP8_MAX",
    "Fp8Codec",
    "E4M3FNSaturating",
    "PyptoCalculatorE4M3",
    "SPEC_CODEC",
    "PYPTO_CALCULATOR_CODEC",
    "CODECS",
    "get_codec",
]

#: The largest finite E4M3FN value (code 0x7E), SPEC §3: the numerator of every quantization scale
#: (``scale = 448 / max|x|``) and the spec codec's saturation value. The one place 448 is written.
FP8_MAX = 448.0

# Elements encoded at once: the index temporaries of one chunk (256 KiB) stay in the core's cache.
_ENCODE_CHUNK = 1 << 16
# Below this many codes decode_array reads one code at a time (the pair table is built on first use).
_PAIR_DECODE_MIN = 1 << 12


def _as_float32(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not (x.dtype.is_floating_point and x.element_size() >= 2):
        raise TypeError(f"{name} must be a float16/bfloat16/float32/float64 tensor to encode, got {x.dtype}")
    return x.float()


_Derived = TypeVar("_Derived")


class Fp8Codec:
    """A float <-> E4M3 code conversion: ``encode`` rounds floats to codes, ``decode`` reads them.

    Subclasses give a 256-entry decode table and the magnitude rounding rule. Everything the golden
    does with FP8 goes through a codec: decoding the kernel's inputs, and the encode/decode round
    trip of P inside the kernel (SPEC §2.3).
    """

    name: str = "abstract"
    max_value: float = math.nan

    def __init__(self) -> None:
        self._decode_table = self._build_decode_table()
        if self._decode_table[0].item() != 0 or math.copysign(1.0, self._decode_table[0].item()) < 0:
            # The golden zeroes unread cache rows through their codes; every E4M3 variant reads 0x00 as +0.
            raise ValueError(f"{type(self).__name__}: code 0x00 must decode to +0.0, got {self._decode_table[0].item()}")
        self._decode_table_np = self._decode_table.numpy()
        self._decode_table_np64 = self._decode_table.double().numpy()
        self._reads_nan = bool(np.isnan(self._decode_table_np).any())
        self._tables: tuple[np.ndarray, np.ndarray] | None = None   # encode codes, round values (lazy)
        self._pairs: dict[bool, np.ndarray] = {}                     # decode pairs by ``double`` (lazy)
        self._boundaries: torch.Tensor | None = None                 # rounding_boundaries (lazy)
        self._derived: dict[str, object] = {}                        # what :meth:`derived` keeps

    def _build_decode_table(self) -> torch.Tensor:
        raise NotImplementedError

    def _encode_magnitude(self, magnitude: torch.Tensor) -> torch.Tensor:
        """int64 codes 0..0x7F for float64 magnitudes >= 0 that are not NaN (inf allowed)."""
        raise NotImplementedError

    def _nan_code(self) -> int:
        return NAN_CODE

    def _table_input(self, x: np.ndarray) -> np.ndarray:
        """float32 values whose table index decides the code: ``x`` itself, or what the codec's rule
        computes first when that moves its rounding boundaries off the table's (the calculator's
        integer rounding)."""
        return x

    @property
    def decode_table(self) -> torch.Tensor:
        """float32[256]: the value this codec reads for each code (a copy)."""
        return self._decode_table.clone()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 codes of ``x`` (any float dtype; converted to float32 first, as the kernel does)."""
        x32 = _as_float32(x, "x").detach().contiguous().reshape(-1).numpy()
        out = torch.empty(x32.shape, dtype=torch.uint8)
        codes = out.numpy()
        table = self._lookup_tables()[0]
        for start in range(0, x32.size, _ENCODE_CHUNK):
            chunk = self._table_input(x32[start:start + _ENCODE_CHUNK])
            np.take(table, table_index(chunk.view(np.uint32)), out=codes[start:start + _ENCODE_CHUNK], mode="clip")
        if x.dtype != torch.float32:
            # The sign of NaN comes from the input itself: torch's float16 -> float32 conversion drops
            # it in its scalar tail (not in its vector body), which would make -NaN encode as 0x7F or
            # 0xFF depending on its position (tests/golden/test_codec.py::test_encode_keeps_nan).
            source = x.detach()
            nan = torch.isnan(source).reshape(-1)
            if bool(nan.any()):
                sign = torch.signbit(source).reshape(-1)[nan].to(torch.uint8) * SIGN_BIT
                out[nan] = (out[nan] & 0x7F) | sign
        return out.reshape(x.shape)

    def _encode_by_rule(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 codes of float32 ``x`` by the codec's rule (float arithmetic on the magnitude,
        elementwise): the definition the lookup tables are built from."""
        sign = torch.signbit(x).to(torch.int64) * SIGN_BIT
        magnitude = x.abs().double()
        nan = torch.isnan(x)
        codes = self._encode_magnitude(torch.where(nan, 0.0, magnitude))
        codes = torch.where(nan, self._nan_code(), codes)
        return (codes | sign).to(torch.uint8)

    def _lookup_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 codes, float32 values read back) [131072] by table index (module docstring), built
        from ``_encode_by_rule`` on first use (a few milliseconds)."""
        if self._tables is None:
            codes = self._encode_by_rule(table_patterns())
            self._tables = (codes.numpy(), self._decode_table_np[codes.numpy()])
        return self._tables

    def decode(self, codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``decode_table[codes]`` as float32 or float64 (every E4M3 value is exact in both).

        ``codes`` is uint8 or a float8_e4m3fn tensor (its bits are read, never its torch value).
        The lookup goes through numpy, whose fancy indexing takes uint8 indices directly: on large
        caches that is about twice as fast as torch's own float8 conversion.
        """
        if not isinstance(codes, torch.Tensor):
            raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
        if codes.dtype == torch.float8_e4m3fn:
            codes = codes.view(torch.uint8)
        if codes.dtype != torch.uint8:
            raise TypeError(f"codes must be uint8 or float8_e4m3fn, got {codes.dtype}")
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        return torch.from_numpy(self.decode_array(codes.numpy(), dtype == torch.float64))

    def decode_array(self, codes: np.ndarray, double: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """``decode`` for a uint8 numpy array: float32 values, or float64 with ``double``, into ``out``
        (codes' shape, that dtype) when given.

        The golden gathers cache rows with numpy and decodes them here, in one lookup per call. An
        array of an even number of codes (made contiguous) is read two codes at a time, as uint16 indices
        into a table of value pairs (about twice as fast as one code at a time); the pairs are moved
        as unsigned integers of the same width, so no float (and no NaN payload) is touched.
        """
        table = self._decode_table_np64 if double else self._decode_table_np
        if codes.size >= _PAIR_DECODE_MIN and codes.size % 2 == 0:
            if out is None:
                out = np.empty(codes.shape, table.dtype)
            if out.flags.c_contiguous and out.dtype == table.dtype and out.shape == codes.shape:
                pairs = self._pair_table(double)
                # A strided view is copied first (one byte a code): a lookup through a strided index
                # costs more than the copy.
                flat = np.ascontiguousarray(codes).reshape(-1)
                np.take(pairs, flat.view(np.uint16), out=out.reshape(-1).view(pairs.dtype), mode="clip")
                return out
        # np.take is about 1.5x faster than fancy indexing (table[codes]) for uint8 codes; with
        # ``out`` it is buffered unless the mode is 'clip' (a uint8 code never leaves the table).
        return np.take(table, codes, out=out, mode="clip")

    def _pair_table(self, double: bool) -> np.ndarray:
        """[65536] pairs of values by uint16 index (two codes, first code in the low byte on a
        little-endian machine, as a uint16 view of the codes reads them), as uint64 (float32 pairs)
        or 16-byte items (float64 pairs)."""
        pairs = self._pairs.get(double)
        if pairs is None:
            table = self._decode_table_np64 if double else self._decode_table_np
            index = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)  # each uint16's bytes in memory order
            values = np.ascontiguousarray(table[index])                                 # [65536, 2]
            pairs = values.view(np.dtype((np.void, 16)) if double else np.uint64).reshape(-1)
            self._pairs[double] = pairs
        return pairs

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``decode(encode(x))``: x as it reads back after one pass through FP8.

        Where the value read back is NaN (the spec codec, for NaN), it is x's own NaN, quieted, as
        IEEE arithmetic would give it; the sign of zero is kept like encode's sign bit.
        """
        x32 = _as_float32(x, "x").detach().contiguous()
        flat = x32.reshape(-1).numpy()
        table = self._lookup_tables()[1]
        if flat.size <= _ENCODE_CHUNK:
            # One chunk (the envelope's calls, a few hundred elements): the lookup's result is the output.
            return torch.from_numpy(self._round_chunk(table, flat)).reshape(x32.shape)
        out = torch.empty(flat.shape, dtype=torch.float32)
        values = out.numpy()
        for start in range(0, flat.size, _ENCODE_CHUNK):
            self._round_chunk(table, flat[start:start + _ENCODE_CHUNK], out=values[start:start + _ENCODE_CHUNK])
        return out.reshape(x32.shape)

    def _round_chunk(self, table: np.ndarray, chunk: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`round` of one chunk of float32 values (into ``out`` when given)."""
        got = np.take(table, table_index(self._table_input(chunk).view(np.uint32)), out=out, mode="clip")
        if self._reads_nan:  # only then can a value read back be NaN
            nan = np.isnan(got)
            if nan.any():
                got.view(np.uint32)[nan] = chunk.view(np.uint32)[nan] | np.uint32(0x00400000)
        return got

    def to_fp8(self, x: torch.Tensor) -> torch.Tensor:
        """``encode(x)`` as a torch.float8_e4m3fn tensor (a bit view: torch rounds nothing)."""
        return self.encode(x).view(torch.float8_e4m3fn)

    def from_fp8(self, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Values of a float8_e4m3fn tensor, read the way this codec reads codes."""
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float8_e4m3fn:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x must be a torch.float8_e4m3fn tensor, got {got}")
        return self.decode(x, dtype)

    def rounding_boundaries(self) -> torch.Tensor:
        """float64, ascending: every non-negative float32 at which ``round`` moves to the next value.

        The points a value one float32 ulp away from may read back differently, whatever the codec's
        rule (the spec codec's grid midpoints; the calculator's integer rounding at k + 0.5 as
        well). Found from ``encode`` and ``decode`` themselves, so they cannot drift from the rule:
        the value read back is monotone in |x|, and float32 bit patterns of non-negative values are
        ordered like the values, so each change is located on a coarse grid of patterns (adjacent
        changes lie at least 2^15 ulps apart for every codec here) and then bisected to the exact
        first pattern of the new value. (Two codes that read the same, like the calculator's 0x77 and
        0x7E, are one value: no boundary between them.)
        """
        if self._boundaries is not None:
            return self._boundaries.clone()
        top = int(torch.tensor(2.0 * max(self.max_value, FP8_MAX), dtype=torch.float32).view(torch.int32))

        def code(bits: torch.Tensor) -> torch.Tensor:   # the value read back, as comparable bits
            return self.decode(self.encode(bits.to(torch.int32).view(torch.float32))).view(torch.int32)

        # The coarse grid (a million patterns) is scanned a slice at a time: at once it held about 30 MiB.
        step, span = 1024, 1024 * _ENCODE_CHUNK
        los, his, belows = [], [], []
        for start in range(0, top, span):
            grid = torch.arange(start, min(top, start + span + step), step, dtype=torch.int64)   # overlaps by one
            codes = code(grid)
            jump = (codes[1:] != codes[:-1]).nonzero().reshape(-1)
            los += grid[jump].tolist()       # as ints: small tensors kept between the slices' buffers
            his += grid[jump + 1].tolist()   # fragment the heap (measured: 0.5 MiB more per slice)
            belows += codes[jump].tolist()
        lo, hi = torch.tensor(los, dtype=torch.int64), torch.tensor(his, dtype=torch.int64)
        below = torch.tensor(belows, dtype=torch.int32)   # code(lo) is below the change, code(hi) at or past it
        while bool((hi - lo > 1).any()):
            mid = (lo + hi) // 2
            moved = code(mid) != below
            hi, lo = torch.where(moved, mid, hi), torch.where(moved, lo, mid)
        self._boundaries = hi.to(torch.int32).view(torch.float32).double()
        return self._boundaries.clone()

    def derived(self, key: str, make: Callable[[], _Derived]) -> _Derived:
        """``make()``, worked out once per codec and ``key`` and kept with the codec: tables that other
        modules derive from its rule (golden/envelope/stages.py: the grids and rounding brackets)."""
        if key not in self._derived:
            self._derived[key] = make()
        return cast(_Derived, self._derived[key])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, max_value={self.max_value})"


class E4M3FNSaturating(Fp8Codec):
    """OCP E4M3FN, round to nearest even, saturating overflow to +-448, NaN kept (SPEC §3)."""

    name = "e4m3fn-sat"
    max_value = FP8_MAX

    def _build_decode_table(self) -> torch.Tensor:
        return e4m3fn_decode_table()

    def _encode_magnitude(self, magnitude: torch.Tensor) -> torch.Tensor:
        return e4m3_code_of(torch.clamp(round_to_e4m3_grid(magnitude), max=self.max_value))


class PyptoCalculatorE4M3(Fp8Codec):
    """E4M3 as PyPTO 0.2.0's CPU calculator computes it (measured; not E4M3FN).

    - decode: E4M3FN for every code except the 16 with exponent field 15 (0x78-0x7F and
      0xF8-0xFF), which read as +-240: the calculator treats the top binade as saturated.
    - encode: the value is first rounded to an integer (half to even; the calculator's cast treats
      FP8 as a non-float target). An integer of 240 or more saturates to code 0x7E / 0xFE, which this
      same codec reads back as 240; a smaller one is rounded to the E4M3 grid (nearest even), so 233
      to 239 give 240 as code 0x77 / 0xF7 (also read back as 240).
    - NaN encodes to 0x7E / 0xFE (+-240, the NaN's sign bit kept), not to a NaN code: measured
      through the calculator by tests/kernels/test_calculator_codec.py::test_encode_every_value_class.

    The codes are the cast's own. The unpatched 0.2.0 calculator also re-encoded every FP8 copy,
    which turned 0x77 into 0x7E on the way to memory; our build copies FP8 bytes
    (kernels/pypto_workarounds/ W10), and the decoded values are the same either way.
    """

    name = "pypto-0.2.0-calculator"
    max_value = 240.0

    def _build_decode_table(self) -> torch.Tensor:
        table = e4m3fn_decode_table()
        codes = torch.arange(256)
        top_binade = ((codes >> MANTISSA_BITS) & 0xF) == 0xF
        table[top_binade] = torch.where(codes[top_binade] & SIGN_BIT != 0, -240.0, 240.0)
        return table

    def _encode_magnitude(self, magnitude: torch.Tensor) -> torch.Tensor:
        integer = torch.round(magnitude)
        saturated = integer >= self.max_value          # checked on the integer, before the grid
        rounded = round_to_e4m3_grid(torch.where(saturated, 0.0, integer))
        return torch.where(saturated, 0x7E, e4m3_code_of(rounded))

    def _nan_code(self) -> int:
        return 0x7E  # the calculator saturates NaN like any value >= 240 (sign bit ORed in by encode)

    def _table_input(self, x: np.ndarray) -> np.ndarray:
        # The rule's first step, exactly (float32 round half to even; NaN and inf pass): its result
        # has zero low 16 bits below 2^8, and saturates above, so the table index decides the code.
        with np.errstate(invalid="ignore"):  # a signalling NaN is quieted, as the rule's NaN is
            rounded: np.ndarray = np.rint(x)
        return rounded


SPEC_CODEC = E4M3FNSaturating()
PYPTO_CALCULATOR_CODEC = PyptoCalculatorE4M3()
CODECS: dict[str, Fp8Codec] = {c.name: c for c in (SPEC_CODEC, PYPTO_CALCULATOR_CODEC)}


def get_codec(codec: Fp8Codec | str | None) -> Fp8Codec:
    """The codec named by ``codec`` (None: the spec codec)."""
    if codec is None:
        return SPEC_CODEC
    if isinstance(codec, Fp8Codec):
        return codec
    if isinstance(codec, str) and codec in CODECS:
        return CODECS[codec]
    raise ValueError(f"codec={codec!r} is not a known codec; expected an Fp8Codec or one of {sorted(CODECS)}")
