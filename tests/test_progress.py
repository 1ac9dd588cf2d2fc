"""Progress of long waits in the client's console (python/plexus/_progress.py):
shown on a terminal, saying what the server says the wait is for (or, for
a large put or fetch, its bytes and rate; after a lost host, what the
recovery did), erased when it ends; never written where stderr is not a
terminal."""
import os
import pty
import re
import select
import subprocess
import sys
import time

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH
from plexus import _api, _core
from plexus._progress import describe_transfer

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


# A put of 96 MiB over TCP to a worker stopped (SIGSTOP) until the put's
# line is on the terminal: its bytes stop part of the way; then the same
# value fetched back.
PUT_SCRIPT = r"""
import os, signal, threading
import numpy as np
import plexus
from plexus import _progress
with plexus.local(hosts=1, shared_memory=False,
                  heartbeat_timeout_ms=30_000) as cluster:
    c = cluster.connect(name="progress", shared_memory=False)
    s = c.slice(1)
    np.asarray(s.put(np.zeros(4, np.float32)))  # a connection to the worker
    pid = int(cluster.status()["workers"][0]["pid"])
    big = np.ones(24 << 20, np.float32)

    def resume_once_drawn():
        board = _progress._board
        with board.cond:
            board.cond.wait_for(lambda: board.drawn, timeout=30)
        os.kill(pid, signal.SIGCONT)

    os.kill(pid, signal.SIGSTOP)
    t = threading.Thread(target=resume_once_drawn)
    t.start()
    x = s.put(big)
    t.join()
    print("sum", float(np.asarray(x).sum()), flush=True)
"""

# A 3 s call on two hosts, one of them killed while a fetch waits for it:
# the spare takes its place and the call runs again.
RECOVERY_SCRIPT = r"""
import os, signal
import numpy as np
import plexus
with plexus.local(hosts=2, spare=1) as cluster:
    c = cluster.connect(name="progress")
    s = c.slice(2)
    x = s.put(np.arange(4, dtype=np.float32), plexus.replicated())
    slow = s.program("device_sleep", x, micros=3_000_000, name="slow_step")
    y = slow(x)
    c.flush()
    victim = s.devices[1]["host"]
    os.kill(next(int(w["pid"]) for w in cluster.status()["workers"]
                 if w["alive"] and w["host_name"] == victim), signal.SIGKILL)
    print("victim", victim, flush=True)
    print("fetched", np.asarray(y).tolist(), flush=True)
"""


# A fetch of 64 MiB split over two hosts over TCP, one of them stopped
# (SIGSTOP) until the fetch's line is on the terminal: the other's half
# arrives, the stopped one's waits. On a pipe nothing is drawn: the host
# resumes at once.
FETCH_SCRIPT = r"""
import os, signal, threading
import numpy as np
import plexus
from plexus import _progress
with plexus.local(hosts=2, shared_memory=False,
                  heartbeat_timeout_ms=30_000) as cluster:
    c = cluster.connect(name="progress", shared_memory=False)
    s = c.slice(2)
    big = s.put(np.ones(16 << 20, np.float32), sharding=("split", 0))
    big.block_until_ready()
    pid = next(int(w["pid"]) for w in cluster.status()["workers"]
               if w["host_name"] == s.devices[1]["host"])
    drawn = threading.Event()
    write = _progress._write

    def watch(text):
        write(text)
        if "plexus: fetch" in text:
            drawn.set()

    _progress._write = watch

    def resume_once_drawn():
        drawn.wait(timeout=30 if _progress.enabled() else 0)
        os.kill(pid, signal.SIGCONT)

    os.kill(pid, signal.SIGSTOP)
    t = threading.Thread(target=resume_once_drawn)
    t.start()
    print("sum", float(np.asarray(big).sum()), flush=True)
    t.join()
"""

# A plexus.jit program whose compile takes seconds (test_why's
# slow_to_compile): the fetch of its output waits for it.
COMPILE_SCRIPT = r"""
import numpy as np
import plexus

def slow_to_compile(x):
    import jax.numpy as jnp
    for i in range(80):
        x = jnp.tanh(x @ x.T * (i + 1.0)) + jnp.roll(x, i % 7, axis=0)
    return x

with plexus.local(hosts=1) as cluster:
    c = cluster.connect(name="progress")
    s = c.slice(1)
    step = plexus.jit(slow_to_compile, s, name="step")
    y = np.asarray(step(np.ones((16, 16), np.float32)))
    print("fetched", y.shape, flush=True)
"""


def run(stderr_tty, script=SCRIPT):
    """Runs `script` with stderr on a pseudo-terminal or a pipe; returns
    (stdout, stderr) as text."""
    env = dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH)
    env.pop("PLEXUS_PROGRESS", None)
    if not stderr_tty:
        out = subprocess.run([sys.executable, "-c", script], env=env,
                             capture_output=True, text=True, timeout=WAIT_S)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout, out.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", script], env=env,
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


def lines_of(err, start="plexus: "):
    """The progress lines drawn on the terminal."""
    return [l for l in err.replace("\x1b[K", "").replace("\r", "\n")
            .split("\n") if l.startswith(start)]


def test_a_long_fetch_and_a_slice_wait_show_what_they_wait_for_on_a_terminal():
    stdout, err = run(stderr_tty=True)
    assert "fetched [0.0, 2.0, 4.0, 6.0]" in stdout, stdout
    assert "slice request timed out" in stdout, stdout
    lines = lines_of(err, "plexus: waiting")
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


def test_a_large_put_shows_its_bytes_and_rate_as_they_go():
    stdout, err = run(stderr_tty=True, script=PUT_SCRIPT)
    assert f"sum {float(24 << 20)}" in stdout, stdout
    lines = lines_of(err, "plexus: put")
    # Part of the way (the worker stopped reading), in MiB of the whole.
    assert any(re.fullmatch(r"plexus: put float32\[25165824\] [\d.]+ of "
                            r"96\.0 MiB, \d+ MB/s", l) for l in lines), lines
    assert "\x1b[K" in err


def test_a_large_fetch_shows_its_bytes_and_rate_as_they_come():
    stdout, err = run(stderr_tty=True, script=FETCH_SCRIPT)
    assert f"sum {float(16 << 20)}" in stdout, stdout
    lines = lines_of(err, "plexus: fetch")
    # The running host's half came; the stopped one's waits.
    assert any(re.fullmatch(r"plexus: fetch float32\[16777216\] 32\.0 of "
                            r"64\.0 MiB, \d+ MB/s", l) for l in lines), lines
    assert "\x1b[K" in err


def test_a_wait_for_a_compile_names_the_program_compiling_on_a_terminal():
    pytest.importorskip("jax")
    stdout, err = run(stderr_tty=True, script=COMPILE_SCRIPT)
    assert "fetched (16, 16)" in stdout, stdout
    lines = lines_of(err, "plexus: waiting")
    assert any(re.fullmatch(
        r"plexus: waiting \d+ s: call \d+ \('step'( issued at [^)]*)?\): "
        r"its program 'step' is compiling on host host0 \([\d.]+ s so "
        r"far\)", l) for l in lines), lines


def test_a_fetch_and_a_compile_write_nothing_where_stderr_is_a_pipe():
    pytest.importorskip("jax")
    for script, done in ((FETCH_SCRIPT, f"sum {float(16 << 20)}"),
                         (COMPILE_SCRIPT, "fetched (16, 16)")):
        stdout, err = run(stderr_tty=False, script=script)
        assert done in stdout, stdout
        assert "plexus: waiting" not in err, err[-2000:]
        assert "plexus: fetch" not in err and "\x1b[K" not in err


def test_a_recovery_under_a_wait_says_what_was_lost_and_what_runs_again():
    stdout, err = run(stderr_tty=True, script=RECOVERY_SCRIPT)
    assert "fetched [0.0, 1.0, 2.0, 3.0]" in stdout, stdout
    victim = re.search(r"victim (\S+)", stdout).group(1)
    lines = lines_of(err, "plexus: waiting")
    assert any(l.endswith(f": {victim} lost; remapped onto spare0; "
                          "recomputing 1 call") for l in lines), lines


def test_transfers_count_their_bytes_over_either_carrier():
    """The client's counters (TransferProgress) end at the bytes moved:
    every shard a put sends, each distinct block a fetch reads."""
    for shm in (True, False):
        with plexus.local(hosts=2, shared_memory=shm) as cluster:
            c = cluster.connect(shared_memory=shm)
            s = c.slice(2)
            a = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: 12 chunks
            put = _core.TransferProgress()
            f = c._core.put(s._s, a, _api._sharding(None, s, 1), put)
            assert (put.done_bytes, put.total_bytes) == (2 * a.nbytes,
                                                         2 * a.nbytes), shm
            fetch = _core.TransferProgress()
            np.testing.assert_array_equal(c._core.fetch(f, fetch), a)
            assert (fetch.done_bytes, fetch.total_bytes) == (a.nbytes,
                                                             a.nbytes), shm


def test_a_transfer_line_gives_bytes_of_the_whole_and_the_rate_since_the_last():
    class Counted:
        total_bytes = 4 << 30
        done_bytes = 0

    p = Counted()
    describe = describe_transfer("put", "float32[1073741824]", p)
    p.done_bytes = 1 << 30
    assert describe(None, 2.0) == \
        "plexus: put float32[1073741824] 1.0 of 4.0 GiB, 537 MB/s"
    p.done_bytes = 3 << 29
    assert describe(None, 3.0) == \
        "plexus: put float32[1073741824] 1.5 of 4.0 GiB, 537 MB/s"
