"""A case (a golden config plus a seed) and the golden as a backend, shared by laws, tests and replay."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["Case", "GoldenBackend", "resolve_backend", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Case:
    """One reproducible paged-attention input: ``golden.make_inputs(config, seed)``.

    ``name`` is the catalog name when the case comes from cases/catalog.json, else None.
    """
    config: object  # golden.PagedAttentionConfig
    seed: int = 0
    name: str | None = None
    explicit: dict | None = dataclasses.field(default=None, compare=False)  # tensors by SPEC §1 name

    def inputs(self):
        """The golden InputBundle of this case (built afresh on every call); ``explicit`` tensors
        (from a captured regression's .npz) replace the generated ones of the same name."""
        import golden
        bundle = golden.make_inputs(self.config, self.seed)
        if self.explicit:
            bundle = dataclasses.replace(bundle, **{k: v.clone() for k, v in self.explicit.items()})
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


class GoldenBackend:
    """The golden seen through the backend interface (until kernels.get_backend provides one)."""
    name = "golden"

    @property
    def codec(self):
        from golden.codec import SPEC_CODEC
        return SPEC_CODEC

    def paged_attention_fp8(self, *args, **kwargs):
        import golden
        return golden.paged_attention_fp8(*args, **kwargs)

    def qk_matmul_scale(self, *args, **kwargs):
        import golden
        return golden.qk_matmul_scale(*args, **kwargs)


def _load_file_factory(spec: str):
    path, _, factory = spec.rpartition(":")
    file = Path(path)
    if not file.is_absolute():
        file = REPO_ROOT / file
    if not file.is_file():
        raise ValueError(f"backend={spec!r}: no file {file}")
    modname = "_pfa_backend_" + file.stem
    module = sys.modules.get(modname)
    if module is None:
        mspec = importlib.util.spec_from_file_location(modname, file)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[modname] = module
        mspec.loader.exec_module(module)
    obj = getattr(module, factory)
    return obj() if callable(obj) else obj


def resolve_backend(name: str):
    """The backend called ``name``: ``path/to/file.py:factory`` (test doubles), else
    ``kernels.get_backend(name)``, else the golden adapter for ``golden``."""
    if ".py:" in name:
        return _load_file_factory(name)
    try:
        import kernels
        get = getattr(kernels, "get_backend", None)
    except ImportError:
        get = None
    if get is not None:
        return get(name)
    if name == "golden":
        return GoldenBackend()
    raise ValueError(f"backend={name!r} cannot be resolved: kernels.get_backend is not available "
                     f"(only 'golden' and 'path/file.py:factory' work here)")


def default_backend_name() -> str:
    return os.environ.get("PFA_VERIFY_BACKEND", "golden")
