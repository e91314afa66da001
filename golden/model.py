"""The freedoms of a conforming kernel (SPEC §4.1), as one value: :class:`ConformanceModel`.

SPEC §4.1 lets a kernel differ from the golden's exact arithmetic in three ways, each taken
independently at every operation and on every call:

- F1 accumulation: MM1, MM2 and the row sum ``l_j`` are float32 sums of their terms in any order or
  tree, each addition rounded to nearest (a fused multiply-add, rounded once, allowed);
- F2 scaling order: the dequant multiplications of MM1 (``q_scale``, ``k_scale``; ``softmax_scale``
  last) and of MM2 (``p_scale``, ``v_scale``) in either order or the two scales multiplied together first
  (docs/spec.md), each product rounded to float32;
- F3 ``exp`` within 3 ulp with ``exp(0) = 1`` exactly, ``O / l`` within 1 ulp (3 ulp: OpenCL 1.2's
  full-profile bound for single-precision exp, so that numpy's float32 ``exp``, measured at 2.54 ulp at
  worst, and CUDA's ``expf`` (2 ulp) conform).

:data:`SPEC_MODEL` is that contract. The acceptance envelope (golden/envelope/builder.py) is computed for a
model, so a backend that knows more about itself may declare a *narrower* one (``exp`` within 1 ulp, or
sums rounded once like the golden's) and be judged by it; it may never declare a wider one
(:meth:`ConformanceModel.check_narrower`). A platform probe that measures a wider behaviour (a
truncating accumulator, a 4-ulp ``exp``) makes a model that is not narrower: the backend is then reported
as outside SPEC §4.1, and its envelope is the measured model's, never a larger tolerance.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .errors import UsageError

__all__ = ["ConformanceModel", "SPEC_MODEL", "DETERMINISTIC_MODEL", "EXACT_MODEL", "SUM_MODES", "declared_model"]

#: How a backend's float32 sums (F1) may differ from the exact sum:
#: ``any-order``  any order or tree, each addition rounded to nearest (SPEC §4.1 F1)
#: ``truncating`` any order or tree, each addition rounded toward zero (wider than F1: not conforming)
#: ``exact``      the exact sum rounded once to float32 (the golden's; narrower than F1)
SUM_MODES = ("exact", "any-order", "truncating")


@dataclasses.dataclass(frozen=True)
class ConformanceModel:
    """The arithmetic freedoms a backend's result is judged under (SPEC §4.1).

    * ``sums`` -- one of :data:`SUM_MODES` (F1).
    * ``scale_order`` -- ``"any"``: the dequant multiplications in any order and association (F2);
      ``"spec"``: exactly SPEC §2.3's order.
    * ``exp_ulps`` -- the largest error of ``exp`` in float32 ulps (F3: 3, SPEC's ulp of the exact value);
      ``exp(0) = 1`` exactly is part of every model (the row max of P is then at least 1 and the P scale
      at most 448; below 0 a 3-ulp exp may return 1 + 2**-23, so the scale may be a rounding below 448).
    * ``div_ulps`` -- the largest error of ``O / l`` in float32 ulps (F3: 1).
    * ``deterministic`` -- whether the backend takes the same choices on every call for the same
      logical computation, whatever the physical layout (a fixed summation order, say). SPEC §4.1 lets
      the freedoms differ "on every call", so SPEC_MODEL is not deterministic, and laws that compare two
      calls bit for bit (moving blocks, garbage in unread cells) hold only a deterministic backend to the
      bits; any other to the width of the acceptance interval.
    * ``name`` -- how reports name the model.
    """

    name: str = "SPEC §4.1"
    sums: str = "any-order"
    scale_order: str = "any"
    exp_ulps: float = 3.0
    div_ulps: float = 1.0
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.sums not in SUM_MODES:
            raise ValueError(f"sums={self.sums!r} must be one of {SUM_MODES}")
        if self.scale_order not in ("any", "spec"):
            raise ValueError(f"scale_order={self.scale_order!r} must be 'any' or 'spec'")
        for field in ("exp_ulps", "div_ulps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 64:
                raise ValueError(f"{field}={value!r} must be a number of ulps in [0, 64)")

    @property
    def conforming(self) -> bool:
        """Whether every execution this model allows is one SPEC §4.1 allows."""
        return not self.wider_than_spec()

    def wider_than_spec(self) -> list[str]:
        """The fields in which this model is wider than SPEC §4.1, each as ``field=value (what SPEC allows)``
        (empty for a conforming model)."""
        wider = []
        if self.sums == "truncating":
            wider.append("sums='truncating' (F1: float32 sums rounded to nearest)")
        if self.exp_ulps > SPEC_MODEL.exp_ulps:
            wider.append(f"exp_ulps={self.exp_ulps:g} (F3 allows {SPEC_MODEL.exp_ulps:g})")
        if self.div_ulps > SPEC_MODEL.div_ulps:
            wider.append(f"div_ulps={self.div_ulps:g} (F3 allows {SPEC_MODEL.div_ulps:g})")
        return wider

    def check_narrower(self, what: str = "model") -> ConformanceModel:
        """``self`` when it is no wider than SPEC §4.1; else a golden.errors.UsageError (a ValueError) naming
        the fields (a backend may declare a narrower model and be judged by it, never a wider one)."""
        wider = self.wider_than_spec()
        if wider:
            raise UsageError(f"{what} declares a model wider than SPEC §4.1 ({self.name!r}): " + "; ".join(wider)
                             + ". A backend may declare a narrower model, never a wider one")
        return self

    def describe(self) -> str:
        """One line for reports: the name and the parameters."""
        return (f"{self.name} (sums {self.sums}, scale order {self.scale_order}, exp {self.exp_ulps:g} ulp, "
                f"division {self.div_ulps:g} ulp{', deterministic' if self.deterministic else ''})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def declared_model(backend: object) -> ConformanceModel:
    """The model ``backend`` is judged by: the one it declares (``backend.model``), checked no wider than SPEC
    §4.1 (:meth:`ConformanceModel.check_narrower`), or :data:`SPEC_MODEL` when it declares none. A
    declaration that is not a ConformanceModel, or a wider one, is a golden.errors.UsageError naming the
    backend and the field: never used (SPEC §4.1). Read wherever a backend's model is read: when a backend
    is loaded, in the acceptance rule and the laws, in a report's provenance."""
    model = getattr(backend, "model", None)
    owner = f"backend {getattr(backend, 'name', type(backend).__name__)!r}"
    if model is None:
        return SPEC_MODEL
    if not isinstance(model, ConformanceModel):
        raise UsageError(f"{owner} declares model={model!r}; expected a golden.model.ConformanceModel (or none: SPEC §4.1)")
    return model.check_narrower(owner)


#: SPEC §4.1 as written: the model every backend is judged by unless it declares a narrower one.
SPEC_MODEL = ConformanceModel()
#: SPEC §4.1 for a kernel that takes the same choices on every call (a fixed order): what our kernels
#: on the sim and a 950, and the golden-level mutants, declare.
DETERMINISTIC_MODEL = dataclasses.replace(SPEC_MODEL, name="SPEC §4.1, deterministic", deterministic=True)
#: The golden's own arithmetic (exact sums rounded once, correctly rounded exp and division): the
#: narrowest model, whose envelope is the golden's output itself.
EXACT_MODEL = ConformanceModel(name="exact (the golden's)", sums="exact", scale_order="spec", exp_ulps=0.5,
                               div_ulps=0.5, deterministic=True)
