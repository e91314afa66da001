"""Regression capture end to end: a deliberately wrong backend fails a law, hypothesis shrinks the
case, exactly one file lands in cases/regressions (a temporary one here), and a fresh process
replays it and fails the same way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from doubles import WritesToInputs
from hypothesis import HealthCheck, Phase, given, settings

from pfa_verify import golden
from pfa_verify.cases.data import regressions
from pfa_verify.properties.rule.case import Case
from pfa_verify.properties.search import strategies as ps
from tests.checkout import REPO_ROOT


def _replay(rid, folder):
    env = dict(os.environ, PFA_VERIFY_REGRESSIONS=str(folder), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "pfa_verify.cases.cli", "cases", "replay", rid], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_wrong_backend_is_caught_captured_and_replayed(drop_last_tile_backend, regressions_dir):
    @settings(max_examples=300, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(ps.cases(ps.configs(garbage=(None,))))
    def acceptance(case):
        regressions.check("acceptance", drop_last_tile_backend, case)

    with pytest.raises(AssertionError) as info:
        acceptance()
    message = str(info.value).split("\nFalsifying example")[0]
    files = sorted(regressions_dir.glob("*.json"))
    assert len(files) == 1, "exactly one capture: the shrunk example, not every failure met while shrinking"
    rid = files[0].stem
    # The folder is named: PFA_VERIFY_REGRESSIONS (the fixture's) is not set where the line is pasted.
    assert f"Replay: pfa-verify cases --regressions {regressions_dir} replay {rid}" in message
    record = json.loads(files[0].read_text())
    assert record["law"] == "acceptance" and record["backend"] == drop_last_tile_backend.name
    assert record["tolerance"] == {"kind": "attention", "rtol": 1 / 128, "atol": 1e-4}
    assert record["tensors"].startswith(f"{rid}-") and (regressions_dir / record["tensors"]).is_file()
    assert record["versions"]["torch"]
    config = record["case"]["config"]
    # Shrunk: one batch, one query position, one length just past one tile.
    assert config["batch"] == 1 and config["s1"] == 1
    assert config["kv_act_seqs"] == [config["s2_tile"] + 1]

    result = _replay(rid, regressions_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    replayed = result.stdout.split("FAIL\n", 1)[1].strip()
    # The same failure: the same header, counts and worst element, and the same replay line.
    assert replayed.splitlines()[:3] == record["message"].splitlines()[:3]
    assert replayed.splitlines()[-1] == f"Replay: pfa-verify cases --regressions {regressions_dir} replay {rid}"


def test_a_backend_that_writes_to_its_inputs_fails_the_unchanged_check(regressions_dir):
    case = Case(golden.PagedAttentionConfig(batch=1, s1=1, s2=20, nq=2, nkv=1, head_dim=16, block_size=16, s2_tile=16))
    with pytest.raises(AssertionError, match=r"Input q_scale after the .* call vs before not bit-identical"):
        regressions.check("acceptance", WritesToInputs(), case)
    assert len(list(regressions_dir.glob("*.json"))) == 1
