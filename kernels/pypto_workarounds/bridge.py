"""W11: the API of newer pypto releases that kernels written for them use, bridged on 0.2.0.

PyPTO-Gym's FP8 paged-attention kernel (page_attention_quant_fp8_impl.py) calls
``pypto.div(a, b, precision_type=pypto.PrecisionType.INTRINSIC)``. pypto 0.2.0 has no ``PrecisionType``
and its ``div`` takes no ``precision_type``: the kernel fails to parse. On 0.2.0 there is one division,
and its calculator computes it as libtorch's IEEE float32 division (calc_torch.cpp), so the keyword is
accepted (checked to be a PrecisionType) and dropped; nothing it could select exists to be measured
here. With the bridge, the PyPTO-Gym kernel matches the golden under the calculator codec. On a
pypto that has ``PrecisionType``, nothing is patched.
"""
from __future__ import annotations

import enum
import functools
from types import ModuleType

__all__ = ["bridge_precision_type"]


class PrecisionType(enum.Enum):
    """pypto.PrecisionType on 0.2.0 (W11): accepted by pypto.div, with no effect there."""
    DEFAULT = 0
    INTRINSIC = 1


def bridge_precision_type(pypto: ModuleType) -> bool:
    """W11. Give ``pypto`` a PrecisionType and a ``div`` that accepts ``precision_type=``; True when
    it patched, False when this pypto has them already."""
    if hasattr(pypto, "PrecisionType"):
        return False
    original = pypto.div

    @functools.wraps(original)
    def div(input, other, *, precision_type=None):  # noqa: A002 - pypto's own argument name
        if precision_type is not None and not isinstance(precision_type, PrecisionType):
            raise TypeError(f"precision_type must be a pypto.PrecisionType, got {precision_type!r}")
        return original(input, other)

    pypto.PrecisionType = PrecisionType  # type: ignore[attr-defined]  # pypto ships no types
    pypto.div = div  # type: ignore[attr-defined]  # pypto ships no types
    return True
