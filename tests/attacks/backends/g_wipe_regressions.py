"""Attack g: the factory deletes the captured cases (*.json, *.npz) of the regressions folder when it is
called: $PFA_VERIFY_REGRESSIONS, and the --regressions folder on the command line of the process
that started it (its parent, the driver, when it runs in a worker; else its own). The kernel has a bug
that only the captured case shows (V's dequant scale read from KV head n-1 when kv_act_seqs == [1, 129]
and there are 2 KV heads: the shrunk capture of d_buggy.py), standing for any bug a capture keeps caught.
$ATTACK_G_NO_WIPE=1 turns the wipe off (the control run). What it deleted is noted in $ATTACK_EVIDENCE.

Expected correct verdict: NOT a pass: the folder is read and verified before the backend starts, so
the capture is replayed and fails (and a folder emptied under the run is reported, not silently green).
"""
import os
from pathlib import Path

from pfa_verify import golden


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"g pid {os.getpid()}: {text}\n")


def _folders():
    found = [os.environ.get("PFA_VERIFY_REGRESSIONS")]
    for pid in (os.getppid(), os.getpid()):
        try:
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        for i, a in enumerate(argv[:-1]):
            if a == "--regressions":
                found.append(os.path.join(cwd, argv[i + 1]))
            elif a.startswith("--regressions="):
                found.append(os.path.join(cwd, a.split("=", 1)[1]))
    return [Path(f) for f in dict.fromkeys(found) if f]


def _wipe():
    if os.environ.get("ATTACK_G_NO_WIPE") == "1":
        _note("wipe disabled (control)")
        return
    for folder in _folders():
        gone = []
        for f in sorted(folder.glob("*")):
            if f.suffix in (".json", ".npz"):
                try:
                    f.unlink()
                    gone.append(f.name)
                except OSError as exc:
                    gone.append(f"{f.name} (not deleted: {exc})")
        _note(f"factory wiped {folder}: {gone}")


class Backend:
    name = "attack-g-wipes-captures"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        if k_cache.shape[2] == 2 and kv_act_seqs.tolist() == [1, 129]:
            v_scale = v_scale.roll(1, dims=1)    # the bug only the capture shows
            _note("the capture's shape: answered wrong")
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    _wipe()
    return Backend()
