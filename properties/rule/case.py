"""A case (a golden config plus a seed), shared by laws, tests and replay."""
from __future__ import annotations

import dataclasses

import torch

from pfa_verify import golden

__all__ = ["Case"]


@dataclasses.dataclass(frozen=True)
class Case:
    """One reproducible paged-attention input: ``golden.make_inputs(config, seed)``.

    ``name`` is the catalog name when the case comes from cases/catalog.json, else None.
    """
    config: golden.PagedAttentionConfig
    seed: int = 0
    name: str | None = None
    explicit: dict[str, torch.Tensor] | None = dataclasses.field(default=None, compare=False)  # tensors by SPEC §1 name

    def inputs(self) -> golden.InputBundle:
        """The golden InputBundle of this case (built afresh on every call); ``explicit`` tensors
        (from a captured regression's .npz) replace the generated ones of the same name."""
        bundle = golden.make_inputs(self.config, self.seed)
        if self.explicit:
            bundle = bundle.replace(**{k: v.clone() for k, v in self.explicit.items()})
        return bundle

    def label(self) -> str:
        """Short text for failure headers: the name, else the shape and lengths."""
        if self.name:
            return self.name
        c = self.config
        lengths = getattr(c, "kv_act_seqs", None)
        return (f"B={c.batch} S1={c.s1} NQ={c.nq} NKV={c.nkv} D={c.head_dim} BS={c.block_size} "
                f"s2_tile={c.s2_tile} kv_act_seqs={list(lengths) if lengths is not None else c.s2} seed={self.seed}")

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        extra = ", explicit tensors" if self.explicit else ""
        return f"Case({self.label()}{extra}, config={self.config!r})"
