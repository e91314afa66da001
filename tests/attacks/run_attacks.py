"""The attack kit of issue 53: python tests/attacks/run_attacks.py CHECKOUT VENV OUTDIR [ATTACK ...]; see tests/attacks/README.md.

Every step runs `timeout -k 10 T bash -c CMD` from its attack's scratch folder (fresh, empty, under
/tmp, never the repo) with VENV/bin first on PATH, PFA_VERIFY_REGRESSIONS / PFA_VERIFY_BACKEND /
HYPOTHESIS_PROFILE / CI unset, PYTHONUNBUFFERED=1 (so stdout and stderr interleave in the order written),
ATTACK_STEP=<unique token> (every process the step starts inherits it: that is how survivors are found)
and ATTACK_EVIDENCE=<file> (what the hostile kernels note they did). Runs with system python3; the
checkout's code runs only in the commands.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KIT = Path(__file__).resolve().parent
B = KIT / "backends"
#: A small catalog case with 2 KV heads (B=4, lengths 0, 1, 128, 129, head_dim 128): the V-scale bug fails it.
CASE = "edge_lengths_0_1_bs_bs1"
#: The upstream case of the README's example (1 KV head: the V-scale bug passes it).
UP = "pfa_fp8_b2_s1_1_s2_1k"
ESC = b"\x1b"


def _cell(text: str, limit: int = 220) -> str:
    """Text for a markdown table cell: control characters escaped, pipes escaped, cut to ``limit``."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append(" / ")
        elif ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii") if ord(ch) < 0xD800
                       else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    text = "".join(out).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _last_and_verdict(text: str) -> tuple[str, str]:
    """The last non-empty line of the output, and the run/laws verdict line ("N cases: ..." or "laws on ...: ...
    -> OK/FAILED") joined back from the lines rich wrapped it into (empty when there is none near the end)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    verdict = ""
    for i in range(len(lines) - 1, max(-1, len(lines) - 9), -1):
        if re.match(r"^(\d+ cases: |laws on .*: \d+ laws)", lines[i]):
            j = i + 1
            while j < len(lines) and not re.match(r"^(JSON|HTML) report:", lines[j]):
                j += 1
            verdict = " ".join(t.strip() for t in lines[i:j])
            break
    return last, verdict


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _escaped(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace").encode("unicode_escape").decode("ascii")


class Kit:
    def __init__(self, checkout: Path, venv: Path, outdir: Path) -> None:
        self.checkout, self.venv, self.outdir = checkout, venv, outdir
        outdir.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="pfa-attacks-"))
        (self.root / "evidence").mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("PFA_VERIFY_") and k not in ("HYPOTHESIS_PROFILE", "CI", "PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(venv)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        self.results: list[dict] = []
        self.kept: list[dict] = []       # rows of an earlier run of OUTDIR for the attacks not run now (merge)
        self.started = time.time()

    def scratch(self, attack: str) -> Path:
        d = self.root / attack
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        return d

    def show(self, cmd: str, cwd: Path) -> str:
        """The command as the table shows it: $B the kit's backends, $S the attack's scratch folder."""
        return (cmd.replace(str(B), "$B").replace(str(cwd), "$S").replace(str(self.checkout), "$CHECKOUT"))

    # -- one step ------------------------------------------------------------------------------------
    def step(self, attack: str, sid: str, cmd: str, cwd: Path, *, timeout: int = 300, post=None,
             what: str = "", expect: str = "") -> dict:
        token = f"pfa-attack-{secrets.token_hex(4)}-{sid}"
        evidence = self.root / "evidence" / f"{sid}.txt"
        env = {**self.env, "ATTACK_STEP": token, "ATTACK_EVIDENCE": str(evidence)}
        print(f"[{time.time() - self.started:6.0f} s] {sid}: {self.show(cmd, cwd)}", flush=True)
        before_files = self.snapshot(cwd)
        start = time.monotonic()
        proc = subprocess.Popen(["timeout", "-k", "10", str(timeout), "bash", "-c", cmd], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        combined, streams = bytearray(), {"stdout": bytearray(), "stderr": bytearray()}
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        ended_at = None
        while sel.get_map():
            if proc.poll() is not None:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 5:     # something the command started holds the pipes
                    break
            for key, _ in sel.select(timeout=0.5):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                streams[key.data] += chunk
                combined += chunk
        rc = proc.wait()
        seconds = time.monotonic() - start
        text = combined.decode("utf-8", "replace")
        last, verdict = _last_and_verdict(text)
        tb = "Traceback (most recent call last)" in text
        exc_line = ""
        if tb:
            after = text[text.rindex("Traceback (most recent call last)"):].splitlines()
            tops = [ln for ln in after[1:] if ln and not ln.startswith((" ", "\t")) and ":" in ln]
            exc_line = tops[0] if tops else ""
        ctx = {"cwd": cwd, "rc": rc, "text": text, "token": token, "evidence": evidence, "kit": self}
        extra = []
        if post is not None:
            try:
                extra = list(post(ctx) or [])
            except Exception as exc:  # noqa: BLE001 - a kit bug must not lose the step
                extra = [f"(kit: post check failed: {exc!r})"]
        alive = self.alive(token)
        killed = []
        for pid, _argv in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        listing = self.listing(cwd)
        after_files = self.snapshot(cwd)
        changes = {
            "new": [f"{p} ({after_files[p][0]} B, {after_files[p][2]})" for p in sorted(after_files) if p not in before_files],
            "changed": [f"{p} ({after_files[p][0]} B, {after_files[p][2]})" for p in sorted(after_files)
                        if p in before_files and after_files[p] != before_files[p]],
            "removed": [p for p in sorted(before_files) if p not in after_files],
            "unchanged": sum(1 for p in after_files if before_files.get(p) == after_files[p]),
        }
        ev = evidence.read_text(errors="replace") if evidence.exists() else ""
        result = {
            "attack": attack, "step": sid, "command": self.show(cmd, cwd), "exit": rc, "seconds": round(seconds, 1),
            "last_line": last, "verdict_line": verdict, "traceback": tb, "exception": exc_line,
            "esc_stdout": streams["stdout"].count(ESC), "esc_stderr": streams["stderr"].count(ESC),
            "bel_cr_stdout": [streams["stdout"].count(b"\x07"), streams["stdout"].count(b"\r")],
            "files": listing, "file_changes": changes, "scratch": str(cwd), "alive": [f"{pid} {argv}" for pid, argv in alive], "killed_by_kit": killed,
            "post": extra, "evidence": ev.splitlines(), "what": what, "expect": expect,
            "ran_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        self.results.append(result)
        with open(self.outdir / f"{sid}.log", "wb") as log:
            head = [f"step {sid} (attack {attack}): {what}", f"expected correct verdict: {expect}",
                    f"command: {cmd}", f"cwd: {cwd}", f"timeout: {timeout} s", f"exit status: {rc}",
                    f"seconds: {seconds:.1f}", (f"raw ESC bytes: stdout {result['esc_stdout']}, stderr "
                    f"{result['esc_stderr']}"), "=== output (stdout and stderr as they arrived; raw bytes) ==="]
            log.write(("\n".join(head) + "\n").encode())
            log.write(bytes(combined))
            tail = ["", "=== after ===", "files in the scratch folder:"] + [f"  {f}" for f in listing] + \
                   ["processes of this step alive afterwards: " + (", ".join(result["alive"]) or "none")] + \
                   ([f"killed by the kit: {killed}"] if killed else []) + \
                   ["kit checks:"] + [f"  {x}" for x in extra] + ["kernel's evidence notes:"] + [f"  {x}" for x in ev.splitlines()]
            log.write(("\n".join(tail) + "\n").encode("utf-8", "backslashreplace"))
        print(f"         exit {rc} in {seconds:.0f} s; last: {_cell(last, 150)}" + (f"; TRACEBACK {exc_line}" if tb else ""),
              flush=True)
        return result

    def alive(self, token: str) -> list[tuple[int, str]]:
        """Processes (not this one) whose environment carries the step's token: what the step started."""
        found = []
        needle = f"ATTACK_STEP={token}".encode()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                if needle in (p / "environ").read_bytes().split(b"\0"):
                    argv = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append((int(p.name), " ".join(argv.split())[:160]))
            except OSError:
                continue
        return found

    @staticmethod
    def snapshot(cwd: Path) -> dict[str, tuple[int, int, str]]:
        """Every file under ``cwd``: (size, mtime_ns, mode)."""
        out = {}
        for path in cwd.rglob("*"):
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                out[str(path.relative_to(cwd))] = (st.st_size, st.st_mtime_ns, oct(st.st_mode & 0o777))
        return out

    @staticmethod
    def listing(cwd: Path) -> list[str]:
        out = []
        for path in sorted(cwd.rglob("*")):
            rel = path.relative_to(cwd)
            if path.is_dir():
                out.append(f"{rel}/")
            else:
                mode = oct(path.stat().st_mode & 0o777)
                out.append(f"{rel} ({path.stat().st_size} B, {mode})")
        return out

    # -- the table -----------------------------------------------------------------------------------
    def write(self) -> None:
        ran = {r["attack"] for r in self.results}
        rows = [r for r in self.kept if r["attack"] not in ran] + self.results
        order = list(ATTACKS)
        rows.sort(key=lambda r: order.index(r["attack"]) if r["attack"] in order else len(order))   # stable
        (self.outdir / "results.json").write_text(json.dumps(rows, indent=2, ensure_ascii=True) + "\n")
        git = subprocess.run(["git", "-C", str(self.checkout), "status", "--porcelain"], capture_output=True, text=True, check=False)
        head = subprocess.run(["git", "-C", str(self.checkout), "log", "--oneline", "-1"], capture_output=True, text=True, check=False)
        md = [f"# Attack kit results: {self.checkout} at {head.stdout.strip()[:60]}", "",
              (f"venv {self.venv}; scratch folders /tmp/pfa-attacks-*/ATTACK ($S: the attack's, fresh and empty when the attack starts; $B: {B}; "
              f"$CHECKOUT: {self.checkout}). Every command ran as `timeout -k 10 T bash -c CMD` from $S with "
              "PFA_VERIFY_REGRESSIONS unset (captures go to the --regressions folder the command names). "
              "'alive' = processes carrying the step's ATTACK_STEP token after the command returned (the kit "
              "then kills them by pid). 'on disk': the files of $S the step created, changed or removed (the log lists "
              "all). Full output of each step: STEP.log."),
              "", (f"`git status --porcelain` of the checkout after the kit: "
              f"{'clean' if not git.stdout.strip() else '`' + _cell(git.stdout.strip()) + '`'}"), "",
              "| attack | command | exit | last line | traceback? | on disk / alive afterwards |",
              "| --- | --- | --- | --- | --- | --- |"]
        times = sorted({r.get("ran_at", "?")[:16] for r in rows})
        if len(times) > 1 or self.kept:
            md[2] += (f" Steps ran between {times[0]} and {times[-1]} (a later partial run of the kit replaced the "
                      "rows of the attacks it ran; each step's time is in its section below).")
        for r in rows:
            tb = f"yes: {r['exception']}" if r["traceback"] else "no"
            if r["esc_stdout"] or r["esc_stderr"]:
                tb += f"; raw ESC bytes: stdout {r['esc_stdout']}, stderr {r['esc_stderr']}"
                if "bel_cr_stdout" in r:
                    tb += f" (BEL {r['bel_cr_stdout'][0]}, CR {r['bel_cr_stdout'][1]} on stdout)"
            ch = r.get("file_changes")
            if ch is None:
                files = [f for f in r["files"] if not f.endswith("/")]
                disk = "files: " + ", ".join(files) if files else "no files"
            else:
                parts = [f"new: {', '.join(ch['new'])}" if ch["new"] else "",
                         f"changed: {', '.join(ch['changed'])}" if ch["changed"] else "",
                         f"REMOVED: {', '.join(ch['removed'])}" if ch["removed"] else ""]
                disk = "; ".join(p for p in parts if p) or "no file written"
                if ch["unchanged"]:
                    disk += f" ({ch['unchanged']} earlier file(s) of $S unchanged)"
            disk += "; alive: " + ("; ".join(r["alive"]) if r["alive"] else "none")
            if r["post"]:
                disk += "; " + "; ".join(r["post"])
            shown = r["last_line"] if not r["verdict_line"] or r["verdict_line"].endswith(r["last_line"]) else (
                f"{r['last_line']} (verdict line: {r['verdict_line']})")
            if r["verdict_line"].endswith(r["last_line"]) and r["verdict_line"]:
                shown = r["verdict_line"]
            status = str(r["exit"]) if r["exit"] >= 0 else f"killed by {_signame(-r['exit'])}"
            md.append(f"| {r['step']} | `{_cell(r['command'], 400)}` | {status} | {_cell(shown, 400)} | "
                      f"{_cell(tb)} | {_cell(disk, 700)} |")
        md += ["", "## Steps", ""]
        for r in rows:
            md += [f"### {r['step']} ({r['seconds']} s, ran {r.get('ran_at', '?')})", "", f"- what: {r['what']}", f"- expected: {r['expect']}",
                   "- kernel's evidence notes: " + ("; ".join(_cell(x, 300) for x in r["evidence"][:12])
                                                     + (f" (+{len(r['evidence']) - 12} more)" if len(r["evidence"]) > 12 else "")
                                                     if r["evidence"] else "none"), ""]
        (self.outdir / "results.md").write_text("\n".join(md) + "\n")


# -- the attacks -------------------------------------------------------------------------------------------------------

def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ids(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def attack_a(kit: Kit) -> None:
    s = kit.scratch("a")
    be = f"{B}/a_unavailable.py:make"
    what = "a kernel that raises BackendUnavailable mid-call on head_dim != 128 and is wrong elsewhere"
    kit.step("a", "a1-pytest", f"pytest -p pfa_verify.cases.plugin --pyargs pfa_verify.cases.laws --backend {be} -p no:cacheprovider --hypothesis-profile ci "
             f"--regressions {s}/reg -q -rs", s, timeout=300, what=what + " (pytest plugin)",
             expect="non-zero exit: a kernel call's exception is an error, never a skip")
    kit.step("a", "a2-run", f"pfa-verify run --backend {be} --cases {UP} --examples 3 --regressions {s}/reg", s,
             what=what + " (run)", expect="exit 1")
    kit.step("a", "a3-laws", f"pfa-verify laws --backend {be} --laws paged --examples 20 --seconds 5 "
             f"--regressions {s}/reg", s, what=what + " (laws)", expect="exit 1")


def attack_b(kit: Kit) -> None:
    s = kit.scratch("b")
    kit.step("b", "b1-laws-slow", f"pfa-verify laws --backend {B}/b_slow.py:make --laws paged --seconds 2 "
             f"--regressions {s}/reg", s, timeout=400,
             what="a 3 s/call kernel with the V-scale bug, laws cut by a 2 s budget",
             expect="non-zero exit: a law cut before a minimum of examples is not 'held'")


def attack_c(kit: Kit) -> None:
    s = kit.scratch("c")
    reg = s / "reg"
    be = f"{B}/c_flaky.py:make"
    what = "a kernel wrong on every 2nd call of its process"
    kit.step("c", "c1-capture", f"pfa-verify run --backend {be} --cases {CASE} --examples 3 --regressions {reg}", s,
             what=what + ": run, capture its failures", expect="exit 1 and a capture",
             post=lambda ctx: [f"captured ids: {_ids(reg)}"])
    ids = _ids(reg)
    if not ids:
        kit.step("c", "c2-no-capture", "echo 'c1 captured nothing: the rest of c cannot run'; exit 3", s,
                 what="(kit)", expect="-")
        return
    rid = ids[0]
    shutil.copytree(reg, s / "reg-before-prune")
    for n in (1, 2, 3):
        kit.step("c", f"c{1 + n}-replay{n}", f"pfa-verify cases --regressions {reg} replay {rid}", s,
                 what=what + f": replay {n} of the capture {rid}",
                 expect="FAIL, or 'nondeterministic' once both outcomes were seen; never a plain PASS")
    kit.step("c", "c5-prune", f"pfa-verify cases --regressions {reg} prune", s, what=what + ": prune",
             expect="the capture of a real failure is kept",
             post=lambda ctx: [f"ids left in reg after prune: {_ids(reg)} (before: {ids})"])


def _buggy_capture(kit: Kit) -> Path:
    """d's capture (the README's buggy kernel on the README's command), made once; d and g copy it."""
    folder = kit.root / "d" / "reg"
    if not _ids(folder):
        s = kit.scratch("d")
        kit.step("d", "d1-capture", f"pfa-verify run --backend {B}/d_buggy.py:make --cases {UP} --examples 3 "
                 f"--regressions {folder}", s, what="the README's buggy kernel (V scale of KV head n-1): capture",
                 expect="exit 1 and a capture (README: shrunk to lengths [1, 129])",
                 post=lambda ctx: [f"captured ids: {_ids(folder)}"] + [
                     f"{i}: law {d.get('law')} kv_act_seqs {d['case']['config'].get('kv_act_seqs')} nkv "
                     f"{d['case']['config'].get('nkv')} head_dim {d['case']['config'].get('head_dim')}"
                     for i in _ids(folder) if (d := _read_json(folder / f"{i}.json"))])
    return folder


_EDIT = r"""
import json, sys
path, what = sys.argv[1], sys.argv[2]
d = json.load(open(path))
if what == "law":
    d["law"] = "outputs_finite"
elif what == "kv":
    d["case"]["config"]["kv_act_seqs"] = [1, 128]
elif what == "tolerance":
    d["tolerance"]["rtol"] = 10.0
    d["tolerance"]["atol"] = 10.0
json.dump(d, open(path, "w"), indent=2)
print(f"edited {path}: {what}")
"""


def attack_d(kit: Kit) -> None:
    captured = _buggy_capture(kit)
    s = kit.root / "d"
    ids = _ids(captured)
    if not ids:
        kit.step("d", "d2-no-capture", "echo 'd1 captured nothing: the rest of d cannot run'; exit 3", s,
                 what="(kit)", expect="-")
        return
    rid = ids[0]
    (s / "edit.py").write_text(_EDIT)
    kit.step("d", "d2-replay-unedited", f"pfa-verify cases --regressions {captured} replay {rid}", s,
             what=f"control: replay the capture {rid} as written", expect="FAIL, exit 1")
    for sid, what, edit in (("d3-edit-law", "its law field edited to outputs_finite", "law"),
                            ("d4-edit-kv_act_seqs", "its config's kv_act_seqs edited to [1, 128] (arrays keep [1, 129])", "kv"),
                            ("d5-edit-tolerance", "its tolerance edited to rtol=atol=10", "tolerance")):
        folder = s / f"reg-{edit}"
        shutil.copytree(captured, folder)
        kit.step("d", sid, f"python3 {s}/edit.py {folder}/{rid}.json {edit} && pfa-verify cases --regressions {folder} "
                 f"replay {rid}", s, what=f"the capture {rid} with {what}, replayed",
                 expect="refused: 'unreadable' (the id is re-derived from the content), exit != 0; never PASS")


def attack_e(kit: Kit) -> None:
    s = kit.scratch("e")
    kit.step("e", "e0-mutate-control", f"pfa-verify run --backend {B}/e0_mutate_plain.py:make --cases {UP} --examples 0 "
             f"--regressions {s}/reg", s, what="control: the kernel zeroes k_cache in place, hides nothing",
             expect="exit 1, inputs modified")
    kit.step("e", "e1-mutate-hide", f"pfa-verify run --backend {B}/e_mutate_hide.py:make --cases {UP} --examples 3 "
             f"--regressions {s}/reg", s,
             what="the kernel zeroes k_cache in place and patches its worker's check (wire.raw_bytes)",
             expect="exit 1, inputs modified (the driver decides from data the kernel cannot write)")


def attack_f(kit: Kit) -> None:
    s = kit.scratch("f")
    for sid, name, what, expect in (
            ("f1-forge-ok", "f1_forge_ok", ("zeroes k_cache, then writes its own well-formed result frame "
             "(changed: []) on the reply pipe and exits"), "exit 1 (inputs modified, or an error)"),
            ("f2-forge-zzz", "f2_forge_unknown_tensor", ("writes its own result frame with an extra tensor 'zzz' "
             "listed in changed"), "exit 1 with an error verdict naming the malformed reply; no traceback"),
            ("f3-forge-null", "f3_forge_null_tensors", "writes its own result frame with tensors: null",
             "exit 1 with an error verdict naming the malformed reply; no traceback"),
            ("f4-forge-answers", "f4_forge_answers", "answers its call with an 'answers' frame",
             "exit 1 with an error verdict naming the unexpected reply; no traceback")):
        kit.step("f", sid, f"pfa-verify run --backend {B}/{name}.py:make --cases {UP} --examples 0 "
                 f"--regressions {s}/reg-{sid}", s, what=what, expect=expect)


def attack_g(kit: Kit) -> None:
    captured = _buggy_capture(kit)
    s = kit.scratch("g")
    be = f"{B}/g_wipe_regressions.py:make"
    shutil.copytree(captured, s / "reg-control")
    shutil.copytree(captured, s / "reg")
    before = _ids(s / "reg")
    kit.step("g", "g1-control-no-wipe", f"ATTACK_G_NO_WIPE=1 pfa-verify run --backend {be} --regressions {s}/reg-control "
             f"--cases all --examples 3 --no-capture", s,
             what=f"control: the same kernel with the wipe off; the captured case(s) {before} replayed on it",
             expect="exit 1: the capture fails (only the capture shows this bug)",
             post=lambda ctx: [f"reg-control ids after: {_ids(s / 'reg-control')}"])
    kit.step("g", "g2-wipe", f"pfa-verify run --backend {be} --regressions {s}/reg --cases all --examples 3", s,
             what="the factory deletes the regressions folder's files when it is called",
             expect="exit 1: the folder is read and verified before the backend starts, the capture replayed",
             post=lambda ctx: [f"reg ids before: {before}, after: {_ids(s / 'reg')}"])


def attack_h(kit: Kit) -> None:
    s = kit.scratch("h")
    report = s / "report.json"

    def post(ctx):
        out = []
        alive0 = kit.alive(ctx["token"])
        out.append(f"alive right after the driver exited: {[a for a in alive0] or 'none'}")
        time.sleep(12)
        data = _read_json(report)
        if data is None:
            out.append("report.json: missing or not JSON")
        else:
            summary = data.get("summary", {})
            out.append(f"report.json 12 s later: rewritten_by_attack_h={data.get('rewritten_by_attack_h', False)}, "
                       f"summary failed={summary.get('failed')} errors={summary.get('errors')} "
                       f"passed_cases={summary.get('passed_cases')}/{summary.get('checked_cases')}")
        return out
    kit.step("h", "h1-grandchild", f"ATTACK_REPORT={report} pfa-verify run --backend {B}/h_grandchild.py:make "
             f"--cases {CASE} --examples 0 --json {report} --regressions {s}/reg", s, post=post,
             what="the kernel starts a setsid grandchild that rewrites the --json report after the driver exits",
             expect="exit 1; no process of the kernel alive afterwards; the report as the driver wrote it")


def attack_i(kit: Kit) -> None:
    s = kit.scratch("i")
    report = s / "report.json"
    file = B / "i_fake_source.py"

    def post(ctx):
        data = _read_json(report) or {}
        real = hashlib.sha256(file.read_bytes()).hexdigest()
        kernel = data.get("backend", {}).get("kernel")
        found = sorted(set(re.findall(r'"sha256": "([0-9a-f]{64})"', report.read_text()))) if report.exists() else []
        return [f"report backend.kernel: {json.dumps(kernel)}", f"real sha256 of the loaded file: {real}",
                f"64-hex sha256 values anywhere in the report: {found}"]
    kit.step("i", "i1-fake-source", f"pfa-verify run --backend {file}:make --cases {UP} --examples 0 --json {report} "
             f"--regressions {s}/reg", s, post=post, what="the backend declares kernel_source: another file, a fake sha256",
             expect="the report carries the sha256 of the file the driver loaded")


def attack_j(kit: Kit) -> None:
    s = kit.scratch("j")
    kit.step("j", "j1-escapes-run", f"pfa-verify run --backend {B}/j_escape.py:make --cases {UP} --examples 0 "
             f"--regressions {s}/reg", s, what="the kernel's exception message carries OSC/CSI escapes and \\r",
             expect="exit 1; no raw ESC on stdout/stderr")
    kit.step("j", "j2-escapes-laws", f"pfa-verify laws --backend {B}/j_escape.py:make --laws acceptance --examples 3 "
             f"--seconds 5 --regressions {s}/reg", s, what="the same, through pfa-verify laws",
             expect="exit 1; no raw ESC on stdout/stderr")


def _titles(ctx) -> list[str]:
    """How the run/laws table title printed the backend (rich reads markup in a Table title)."""
    found = [ln.strip() for ln in ctx["text"].splitlines() if ln.startswith(("pfa-verify run: backend", "laws on "))]
    return [f"table title printed as: {found[0]!r}"] if found else []


def attack_k(kit: Kit) -> None:
    s = kit.scratch("k")
    k4 = B / "[" / "x]" / "k4_path_markup.py"
    for sid, be, cases, what, expect in (
            ("k1-name-markup", f"{B}/k1_name_markup.py:make", CASE, "backend name '[bold]x[/'",
             "exit 1 with a summary; the name printed literally everywhere; no MarkupError"),
            ("k1b-name-closing-tag", f"{B}/k1b_name_closing_tag.py:make", CASE, "backend name '[/x]'",
             "exit 1 with a summary; no MarkupError"),
            ("k2-skip-markup", f"{B}/k2_skip_markup.py:make", f"{CASE},{UP}", "skip reason with '[/x]'",
             "exit 1 (a skip not allowed); no MarkupError"),
            ("k3-message-markup", f"{B}/k3_message_markup.py:make", UP, "exception message with '[/x]'",
             "exit 1 (error); no MarkupError"),
            ("k4-path-markup", f"{k4}:make", CASE, "backend file path with '[/x]'",
             "exit 1 with a summary; no MarkupError"),
            ("k5-surrogate", f"{B}/k5_surrogate.py:make", UP, "lone surrogate \\udcff in the exception message",
             "exit 1 (error); no UnicodeEncodeError")):
        kit.step("k", sid, f"pfa-verify run --backend '{be}' --cases {cases} --examples 0 --regressions {s}/reg-{sid}",
                 s, what=what + " (run)", expect=expect, post=_titles)
    kit.step("k", "k5b-surrogate-reports", f"pfa-verify run --backend {B}/k5_surrogate.py:make --cases {UP} --examples 0 "
             f"--json {s}/k5b.json --html {s}/k5b.html --regressions {s}/reg-k5b", s,
             what="lone surrogate in the exception message, with --json and --html reports",
             expect="exit 1 (error), both reports written; no UnicodeEncodeError")
    kit.step("k", "k5c-surrogate-strict-stdout", f"PYTHONIOENCODING=utf-8 pfa-verify run --backend {B}/k5_surrogate.py:make "
             f"--cases {UP} --examples 0 --regressions {s}/reg-k5c", s,
             what="lone surrogate in the exception message, stdout encoding strict UTF-8 (as under a UTF-8 locale "
                  "such as en_US.UTF-8; this machine's C.UTF-8 gives Python surrogateescape)",
             expect="exit 1 (error); no UnicodeEncodeError")
    kit.step("k", "k4b-path-markup-laws", f"pfa-verify laws --backend '{k4}:make' --laws acceptance --examples 3 "
             f"--seconds 5 --regressions {s}/reg-k4b", s, what="backend file path with '[/x]' (laws: its table title)",
             expect="exit 1; no MarkupError", post=_titles)
    kit.step("k", "k3b-message-markup-search", f"pfa-verify search --backend {B}/k3_message_markup.py:make "
             f"--laws acceptance --examples 3 --tasks 1 --regressions {s}/reg-k3b", s,
             what="exception message with '[/x]' (search: its task table)", expect="exit 1; no MarkupError")
    kit.step("k", "k6-message-markup-laws", f"pfa-verify laws --backend {B}/k3_message_markup.py:make "
             f"--laws acceptance,at12_acceptance --examples 3 --seconds 5 --regressions {s}/reg-k6", s,
             what="exception message with '[/x]' (laws)", expect="exit 1; no MarkupError")
    kit.step("k", "k7-name-markup-pytest", f"pytest -p pfa_verify.cases.plugin --pyargs pfa_verify.cases.laws --backend {B}/k1_name_markup.py:make "
             f"-p no:cacheprovider --hypothesis-profile ci --regressions {s}/reg-k7 -q -x -k acceptance", s,
             what="backend name '[bold]x[/' (pytest plugin)", expect="exit 1 (a failing law); no MarkupError")


def attack_l(kit: Kit) -> None:
    s = kit.scratch("l")
    kit.step("l", "l1-inprocess-example", f"pfa-verify run --in-process --backend "
             f"{kit.checkout}/docs/examples/my_backend.py:make_backend --cases {UP} --examples 0 --regressions {s}/reg",
             s, what="--in-process with the shipped example", expect="exit 0 (a correct kernel), a summary")
    written = lambda name: (lambda ctx: [f"{name}: {'written' if (s / name).exists() else 'NOT written'}"])  # noqa: E731
    kit.step("l", "l2-inprocess-posix-exit", f"pfa-verify run --in-process --backend {B}/l_posix_exit.py:make "
             f"--cases {UP} --examples 0 --json {s}/report-l2.json --regressions {s}/reg", s, post=written("report-l2.json"),
             what="posix._exit(0) from the kernel under --in-process",
             expect="exit != 0 (no summary was printed)")
    kit.step("l", "l3-supervised-posix-exit", f"pfa-verify run --backend {B}/l_posix_exit.py:make --cases {UP} "
             f"--examples 0 --json {s}/report-l3.json --regressions {s}/reg", s, post=written("report-l3.json"),
             what="control: posix._exit(0) from the kernel, supervised", expect="exit 1, an error verdict")


def attack_m(kit: Kit) -> None:
    s = kit.scratch("m")
    for sid, name, extra in (("m1-sigusr1", "m_sigusr1", ""), ("m2-sighup", "m_sighup", ""),
                             ("m3-sigusr1-inprocess", "m_sigusr1", " --in-process"),
                             ("m4-sighup-inprocess", "m_sighup", " --in-process")):
        report = s / f"report-{sid}.json"
        kit.step("m", sid, f"pfa-verify run{extra} --backend {B}/{name}.py:make --cases {UP} --examples 0 "
                 f"--json {report} --regressions {s}/reg-{sid}", s,
                 post=lambda ctx, report=report: [f"{report.name}: {'written' if report.exists() else 'NOT written'}"],
                 what=f"the kernel sends {name[2:].upper()} to the driver" + (" (in-process)" if extra else ""),
                 expect="a summary marked interrupted, the report written, a non-zero status")


ATTACKS = {"a": attack_a, "b": attack_b, "c": attack_c, "d": attack_d, "e": attack_e, "f": attack_f, "g": attack_g,
           "h": attack_h, "i": attack_i, "j": attack_j, "k": attack_k, "l": attack_l, "m": attack_m}


def main() -> int:
    parser = argparse.ArgumentParser(prog="tests/attacks/run_attacks.py")
    parser.add_argument("checkout", type=Path)
    parser.add_argument("venv", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("attacks", nargs="*", help=f"a subset of {', '.join(ATTACKS)} (default: all)")
    args = parser.parse_args()
    bad = [a for a in args.attacks if a not in ATTACKS]
    if bad:
        parser.error(f"unknown attacks {bad}; known: {list(ATTACKS)}")
    if not (args.venv / "bin" / "pfa-verify").exists():
        parser.error(f"{args.venv}/bin/pfa-verify does not exist")
    kit = Kit(args.checkout.resolve(), args.venv.resolve(), args.outdir.resolve())
    previous = kit.outdir / "results.json"
    if args.attacks and previous.exists():     # a partial run updates its attacks' rows and keeps the others
        kit.kept = json.loads(previous.read_text())
        for r in kit.kept:                     # the verdict line as this version of the kit reads it, from the log
            log = kit.outdir / f"{r['step']}.log"
            if log.exists():
                raw = log.read_bytes().decode("utf-8", "replace")
                out = raw.split("=== output (stdout and stderr as they arrived; raw bytes) ===\n", 1)[-1]
                out = out.rsplit("\n=== after ===\n", 1)[0]
                r["last_line"], r["verdict_line"] = _last_and_verdict(out)
    print(f"scratch root: {kit.root}", flush=True)
    for name in args.attacks or list(ATTACKS):
        ATTACKS[name](kit)
        kit.write()
    kit.write()
    print(f"{len(kit.results)} steps in {time.time() - kit.started:.0f} s; {kit.outdir / 'results.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
