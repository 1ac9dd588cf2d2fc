"""bench/server_kill.py in small: examples/elastic_training.py's loop
against a standalone server on a journal and three standalone workers, the
server SIGKILLed and started again on its journal three times; the run
checks itself (every session resumed, the loss curve and final
parameters equal a run with no kill bit for bit, the same worker
processes, nothing left on the workers or the server once the client
closed) and exits 0 only if all of it held.

Three kills fall at rest; six more fall inside steps, with the step's puts
and calls in flight (before the fixes in docs/RELIABILITY.md, a put on its
way raised "lost worker", and a push of the last server's temporary held
a peer's connection so the next step hung: every seed ended within 5
kills)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PLEXUS_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "server_kill.py"


def run_bench(tmp_path, *args):
    out = tmp_path / "server_kill.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [PLEXUS_PYTHONPATH] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                               else []))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--step-timeout", "30",
         "--no-stacks", "--json", str(out), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"server_kill.py exited with {proc.returncode}:\n{output}")
    return json.loads(out.read_text())["summary"]


@pytest.mark.jax_heavy
def test_three_server_kills_at_rest_lose_nothing(tmp_path):
    """Each kill once the client's calls are done, before a step."""
    summary = run_bench(tmp_path, "--kills", "3", "--rest-share", "1",
                        "--seed", "0")
    assert summary["kills"] == summary["resumed"] == 3, summary
    assert summary["loss_curve_equal"] and summary["final_params_equal"]
    assert summary["failed_checks"] == [], summary
    # Each start compacts the journal into one snapshot of the model.
    assert summary["records_replayed"]["max"] == \
        summary["records_replayed"]["first"], summary


@pytest.mark.jax_heavy
def test_six_server_kills_inside_steps_lose_nothing(tmp_path):
    """Each kill 0 to half a step's time after the step is issued: at
    most half the median step, so that a kill falls inside its step even
    when the machine is loaded (with the whole median step, 5 of 6 fell
    after their steps in one CI run; the keeper also counts the delay from
    when the bench drew it, not from when its request arrived)."""
    summary = run_bench(tmp_path, "--kills", "6", "--rest-share", "0",
                        "--seed", "0", "--window-share", "0.5")
    assert summary["kills"] == summary["resumed"] == 6, summary
    assert summary["loss_curve_equal"] and summary["final_params_equal"]
    assert summary["failed_checks"] == [], summary
    assert summary["when"].get("in step", 0) >= 4, summary["when"]
