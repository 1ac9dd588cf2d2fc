"""Progress of long waits in the client's console (python/plexus/_progress.py):
shown on a terminal, saying what the server says the wait is for, erased
when it ends; never written where stderr is not a terminal."""
import os
import pty
import select
import subprocess
import sys
import time

from conftest import PLEXUS_PYTHONPATH

WAIT_S = 60

# A fetch of a consumer whose input comes from a 3 s call on the other
# host, then a slice request for more devices than the cluster has.
SCRIPT = r"""
import numpy as np
import plexus
with plexus.local(hosts=2) as cluster:
    c = cluster.connect(name="progress")
    a = c.slice(1, hosts=["host0"])
    b = c.slice(1, hosts=["host1"])
    x = a.put(np.arange(4, dtype=np.float32))
    slow = a.program("device_sleep", x, micros=3_000_000, name="slow_step")
    g = b.program("scale", x, factor=2.0, name="consumer")
    print("fetched", np.asarray(g(slow(x))).tolist(), flush=True)
    try:
        c.slice(3, timeout=2.5)
    except plexus.DeadlineExceededError:
        print("slice request timed out", flush=True)
"""


def run(stderr_tty):
    """Runs SCRIPT with stderr on a pseudo-terminal or a pipe; returns
    (stdout, stderr) as text."""
    env = dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH)
    env.pop("PLEXUS_PROGRESS", None)
    if not stderr_tty:
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env,
                             capture_output=True, text=True, timeout=WAIT_S)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout, out.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    err = b""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    stdout = proc.stdout.read()
    assert proc.wait(timeout=WAIT_S) == 0, err.decode(errors="replace")[-3000:]
    return stdout, err.decode(errors="replace")


def test_a_long_fetch_and_a_slice_wait_show_what_they_wait_for_on_a_terminal():
    stdout, err = run(stderr_tty=True)
    assert "fetched [0.0, 2.0, 4.0, 6.0]" in stdout, stdout
    assert "slice request timed out" in stdout, stdout
    lines = [l for l in err.replace("\x1b[K", "").replace("\r", "\n")
             .split("\n") if l.startswith("plexus: waiting")]
    # The fetch: the consumer waits for the long call on host0.
    assert any("'slow_step'" in l and "host0" in l for l in lines), lines
    # The slice request: what the server says it lacks.
    assert any("for a slice of 3 device(s)" in l for l in lines), lines
    # Each line is erased when its wait ends (clear-to-end-of-line).
    assert "\x1b[K" in err


def test_nothing_is_written_where_stderr_is_not_a_terminal():
    stdout, err = run(stderr_tty=False)
    assert "slice request timed out" in stdout, stdout
    assert "plexus: waiting" not in err, err[-2000:]
    assert "\x1b[K" not in err
