"""Attack h: on its first call the kernel starts a grandchild in a session of its own (setsid:
subprocess.Popen(start_new_session=True)), a `python -c` script with the marker
"pfa-attack-grandchild-h" in its argv. The grandchild waits until the driver (the worker's parent; the
process itself under --in-process) has exited, waits 3 s more, rewrites the --json report named by
$ATTACK_REPORT to look green (summary failed/errors 0, "rewritten_by_attack_h": true), and then lives
30 s more. The kernel itself has the README's bug (V's dequant scale read from KV head n-1), so the run
exits 1. What it started is noted in $ATTACK_EVIDENCE.

Expected correct verdict: exit 1, and nothing the kernel started alive after the run; the report stays
as the driver wrote it.
"""
import os
import subprocess
import sys

from pfa_verify import golden

MARKER = "pfa-attack-grandchild-h"
_started = []
_SCRIPT = r"""# pfa-attack-grandchild-h: rewrites the report once the driver has exited
import json, os, sys, time
marker, report, driver = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(600):
    if not os.path.exists(f"/proc/{driver}"):
        break
    time.sleep(0.5)
time.sleep(3)
try:
    data = json.load(open(report))
    s = data.get("summary", {})
    for k in ("failed", "errors", "failing_cases", "skipped"):
        if k in s:
            s[k] = 0
    if "checked_cases" in s:
        s["passed_cases"] = s["checked_cases"]
    if "comparisons" in s:
        s["passed"] = s["comparisons"]
    data["rewritten_by_attack_h"] = True
    open(report, "w").write(json.dumps(data, indent=2))
except Exception as exc:
    open(report + ".attack-h-error", "w").write(repr(exc))
time.sleep(30)
"""


def _note(text):
    path = os.environ.get("ATTACK_EVIDENCE")
    if path:
        with open(path, "a") as f:
            f.write(f"h pid {os.getpid()}: {text}\n")


def _start_grandchild():
    if _started:
        return
    in_worker = b"pfa-verify" not in open("/proc/self/cmdline", "rb").read()
    driver = os.getppid() if in_worker else os.getpid()
    report = os.path.abspath(os.environ.get("ATTACK_REPORT", "report.json"))
    p = subprocess.Popen([sys.executable, "-c", _SCRIPT, MARKER, report, str(driver)], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    _started.append(p.pid)
    _note(f"started grandchild pid {p.pid} (setsid) to rewrite {report} after driver {driver} exits")


class Backend:
    name = "attack-h-grandchild"
    codec = None

    def paged_attention_fp8(self, q, q_scale, k_cache, k_scale, v_cache, v_scale, block_table, kv_act_seqs, *,
                            softmax_scale=None, s2_tile=128, g_tile=None):
        _start_grandchild()
        wrong = v_scale.roll(1, dims=1)          # KV head n reads head n - 1's V scales
        return golden.paged_attention_fp8(q, q_scale, k_cache, k_scale, v_cache, wrong, block_table, kv_act_seqs,
                                          softmax_scale=softmax_scale, s2_tile=s2_tile, g_tile=g_tile)

    def qk_matmul_scale(self, q, k, *, scale=None, q_scale=None, k_scale=None, codec=None):
        return golden.qk_matmul_scale(q, k, scale=scale, q_scale=q_scale, k_scale=k_scale, codec=codec)


def make():
    return Backend()
