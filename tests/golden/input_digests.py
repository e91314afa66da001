"""Stored digests of ``golden.make_inputs``: the configs and seeds whose inputs must never change.

``make_inputs(config, seed)`` promises the same tensors, bit for bit, for the same config and seed:
captured regressions (cases/regressions/) store only a config and a seed, and replay through it. The
digests in ``data/make_inputs_digests.json`` (sha256 of every tensor's bytes, with its dtype and
shape) were computed from make_inputs as it was before its speed-up (issue 17, at 5a86cd3); the test
(tests/golden/test_input_digests.py) recomputes them with today's code.

The entries cover every value distribution with every garbage fill (on shapes that vary in batch,
S1, heads, head_dim, block size, ragged lengths with 0 and block boundaries, spare blocks and
table columns, seeds up to 2^31 - 1), the catalog's cases (the large upstream ones under ``slow``),
and the captured regressions.

Adding an entry (a new distribution, say) never rewrites a stored one:
``python tests/golden/input_digests.py`` computes the digests of the entries that have none yet
and leaves every existing digest as it is.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from pfa_verify import golden  # noqa: E402
from pfa_verify.cases.data.catalog import load_catalog  # noqa: E402

__all__ = ["DIGESTS_PATH", "tensor_digest", "bundle_digests", "entries", "load", "main"]

DIGESTS_PATH = Path(__file__).resolve().parent / "data" / "make_inputs_digests.json"

# Catalog cases too large for the default suite (tens of millions of elements each): ``slow``.
SLOW_CATALOG = ("pfa_fp8_b1_s1_2_s2_2048_nkv_8", "pfa_fp8_b16_s1_1_s2_8195_nkv_2",
                "pfa_fp8_b16_s1_1_s2_8k_nkv_1", "pfa_fp8_b16_s1_1_s2_8k_nkv_2")

# Shapes the distribution x garbage grid cycles through: (batch, s1, nq, nkv, head_dim, block_size,
# s2_tile, kv_act_seqs, max_blocks extra columns, spare blocks).
_SHAPES = (
    (2, 1, 4, 2, 32, 16, 32, (37, 16), 1, 2),
    (3, 2, 6, 2, 64, 32, 64, (0, 65, 128), 0, 1),
    (1, 3, 4, 1, 128, 128, 256, (300,), 2, 0),
    (4, 1, 8, 2, 16, 16, 16, (1, 17, 0, 48), 0, 3),
)
_SEEDS = (0, 1, 12345, 2**31 - 1)
# Kernel-sized configs (head_dim 128, block_size 128; drawn once from properties.search.strategies.kernel_configs, since
# replaced by cases_for; these configs carry no block_table, so make_inputs shuffles it from the seed;
# plus the profiled shape B=4 S1=2 NQ=4 NKV=1 S2=639 for the two distributions it did not draw).
_KERNEL_SIZED = (
    ({'batch': 3, 's1': 2, 's2': 640, 'nq': 6, 'nkv': 2, 's2_tile': 256, 'g_tile': 1, 'kv_act_seqs': [640, 256, 255], 'max_blocks': 5, 'num_blocks': 9, 'distribution': 'normal', 'garbage': 'nan'}, 36792),
    ({'batch': 1, 's1': 1, 's2': 257, 'nq': 2, 'nkv': 2, 's2_tile': 256, 'kv_act_seqs': [257], 'max_blocks': 3, 'num_blocks': 3, 'distribution': 'uniform'}, 5124),
    ({'batch': 1, 's1': 2, 's2': 394, 'nq': 6, 'nkv': 2, 's2_tile': 128, 'kv_act_seqs': [394], 'max_blocks': 5, 'num_blocks': 5, 'distribution': 'tiny', 'garbage': 'huge'}, 2147483647),
    ({'batch': 4, 's1': 3, 's2': 640, 'nq': 2, 'nkv': 2, 's2_tile': 128, 'kv_act_seqs': [365, 640, 640, 385], 'max_blocks': 5, 'num_blocks': 18, 'distribution': 'wide', 'garbage': 'nan'}, 2882467),
    ({'batch': 4, 's1': 1, 's2': 499, 'nq': 4, 'nkv': 2, 's2_tile': 128, 'g_tile': 1, 'kv_act_seqs': [499, 385, 257, 384], 'max_blocks': 4, 'num_blocks': 16, 'distribution': 'outliers', 'garbage': 'plausible'}, 68),
    ({'batch': 1, 's1': 2, 's2': 640, 'nq': 3, 'nkv': 1, 's2_tile': 128, 'g_tile': 1, 'kv_act_seqs': [640], 'max_blocks': 7, 'num_blocks': 8, 'distribution': 'sinks'}, 818716284),
    ({'batch': 4, 's1': 2, 's2': 639, 'nq': 4, 'nkv': 1, 'kv_act_seqs': [639, 1, 0, 600], 'num_blocks': 25, 'distribution': 'outlier_channels', 'garbage': 'nan'}, 3),
    ({'batch': 4, 's1': 2, 's2': 639, 'nq': 4, 'nkv': 1, 'kv_act_seqs': [639, 128, 129, 257], 'num_blocks': 22, 'distribution': 'constant_rows', 'garbage': 'plausible'}, 4),
)


def tensor_digest(t: torch.Tensor) -> dict:
    """dtype, shape and sha256 of the bytes of ``t`` (contiguous, row-major)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "sha256": hashlib.sha256(raw).hexdigest()}


def bundle_digests(bundle: golden.InputBundle) -> dict:
    """``tensor_digest`` of every tensor of an input bundle, by name."""
    return {name: tensor_digest(t) for name, t in bundle.tensors().items()}


def _grid_entries() -> list[dict]:
    out = []
    i = 0
    for distribution in golden.DISTRIBUTIONS:
        for garbage in golden.GARBAGE:
            batch, s1, nq, nkv, d, bs, tile, lengths, extra, spare = _SHAPES[i % len(_SHAPES)]
            need = [-(-n // bs) for n in lengths]
            s2 = max(*lengths, 1)
            config = golden.PagedAttentionConfig(
                batch=batch, s1=s1, s2=s2, nq=nq, nkv=nkv, head_dim=d, block_size=bs, s2_tile=tile,
                kv_act_seqs=lengths, max_blocks=max(need + [1]) + extra, num_blocks=max(1, sum(need) + spare),
                distribution=distribution, garbage=garbage)
            out.append({"name": f"grid_{distribution}_{garbage}", "config": config.to_dict(),
                        "seed": _SEEDS[i % len(_SEEDS)], "slow": False})
            i += 1
    return out


def _kernel_sized_entries() -> list[dict]:
    return [{"name": f"kernel_{i}_{fields['distribution']}", "seed": seed, "slow": False,
             "config": golden.PagedAttentionConfig.from_dict(fields).to_dict()} for i, (fields, seed) in enumerate(_KERNEL_SIZED)]


def _catalog_entries() -> list[dict]:
    return [{"name": f"catalog_{name}", "config": case.config.to_dict(), "seed": case.seed,
             "slow": name in SLOW_CATALOG} for name, case in load_catalog().items()]


def _regression_entries() -> list[dict]:
    out = []
    for path in sorted((ROOT / "cases" / "regressions").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        case = data.get("case", {})
        if case.get("kind") == "paged":
            out.append({"name": f"regression_{data['id']}", "config": case["config"], "seed": case["seed"], "slow": False})
    return out


def entries() -> list[dict]:
    """Every (name, config dict, seed, slow) the digests cover, in a fixed order."""
    return _grid_entries() + _kernel_sized_entries() + _catalog_entries() + _regression_entries()


def load() -> dict[str, dict]:
    """The stored entries by name: config, seed, slow and the digests."""
    return json.loads(DIGESTS_PATH.read_text(encoding="utf-8"))["entries"]


def main() -> int:
    """Add the digests of entries that have none; stored ones are never rewritten."""
    stored = load() if DIGESTS_PATH.exists() else {}
    added = 0
    for entry in entries():
        if entry["name"] in stored:
            continue
        config = golden.PagedAttentionConfig.from_dict(entry["config"])
        stored[entry["name"]] = {**entry, "digests": bundle_digests(golden.make_inputs(config, entry["seed"]))}
        added += 1
        print(f"added {entry['name']}")
    DIGESTS_PATH.parent.mkdir(exist_ok=True)
    DIGESTS_PATH.write_text(json.dumps({
        "comment": "sha256 of every make_inputs tensor (tests/golden/input_digests.py); never rewrite an entry",
        "torch": torch.__version__, "entries": stored}, indent=1) + "\n", encoding="utf-8")
    print(f"{added} entries added, {len(stored)} stored in {DIGESTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
