"""A fault model (properties/diagnosis/diagnosis.py's candidates): one defect as a deviation of the golden, and the
input-level form most models take, the golden on changed inputs. properties/diagnosis/fault_models.py lists them all."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

from pfa_verify import golden
from pfa_verify.golden.codec import Fp8Codec
from pfa_verify.properties.rule.acceptance import Scalars, Tensors

__all__ = ["FaultModel", "ModelOutput", "Change", "golden_on"]

#: A fault model's output: (tensors, scalars, codec) -> the bf16 output of a kernel with the defect.
ModelOutput: TypeAlias = Callable[[Tensors, Scalars, Fp8Codec | str | None], torch.Tensor]
#: An input-level defect: (tensors, scalars) -> the changed (tensors, scalars).
Change: TypeAlias = Callable[[Tensors, Scalars], tuple[Tensors, Scalars]]



@dataclasses.dataclass(frozen=True)
class FaultModel:
    """One defect as a deviation of the golden: ``output(tensors, scalars, codec)`` is the bf16 output a
    kernel with this defect computes on the case (ValueError: the model does not apply to the case)."""
    name: str
    stage: str                      # the SPEC §2 stage it changes, as a reader would look for it
    description: str
    output: ModelOutput = dataclasses.field(repr=False, compare=False)
    cost: int = 1                   # 1: one vectorized golden call; 2: the staged (loop) golden


def golden_on(change: Change) -> ModelOutput:
    """A model output: the golden on inputs changed by ``change(tensors, scalars)`` (copies).

    A change of the lengths may make a row walk past its batch's valid blocks (a length longer than its table
    holds): it reads table entries of -1, which SPEC §2.2 has the kernel clamp to block 0 when it gathers,
    so the golden runs on the table so clamped (what it reads there may be garbage:
    properties.diagnosis.scoring.model_output finds the elements that depend on it). A walk past the table's width
    does not apply (the golden's ValueError)."""
    def output(tensors: Tensors, scalars: Scalars, codec: Fp8Codec | str | None) -> torch.Tensor:
        t, s = change(dict(tensors), dict(scalars))
        if t["kv_act_seqs"] is not tensors["kv_act_seqs"]:
            t["block_table"] = t["block_table"].clamp(min=0)
        by_name: dict[str, Any] = t         # mypy cannot match a dict's keys to the tensor parameters
        return golden.paged_attention_fp8(**by_name, **s, codec=codec)
    return output
