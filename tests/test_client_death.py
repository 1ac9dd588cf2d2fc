"""A client process that dies without closing (SIGKILL) in the middle of a
graph: its slices, programs and buffers are reclaimed within the failure
deadline, its queued calls are dropped, and another client sees nothing but
the freed capacity."""
import os
import signal
import subprocess
import sys
import time

import numpy as np

import plexus

from conftest import PLEXUS_PYTHONPATH

# The client that dies: a slice over both hosts, a buffer of 2 MiB, and a
# chain of 200 calls of 50 ms of device time each (10 s per device), all
# sent; it says so and waits to be killed.
VICTIM = r"""
import sys
import numpy as np
import plexus
client = plexus.connect(sys.argv[1], name="victim")
s = client.slice(2)
x = s.put(np.ones(1 << 19, np.float32), plexus.P("devices"))
nap = s.program("device_sleep", x, micros=50_000)
y = x
for _ in range(200):
    y = nap(y)
client.flush()
print("sent", client.id, s.id, flush=True)
sys.stdin.read()  # until killed
"""


def live_bytes(st):
    return {w["worker_id"]: w.get("stats", {}).get("live_bytes", 0)
            for w in st["workers"] if w["alive"]}


def programs_loaded(st):
    return {w["worker_id"]: w.get("stats", {}).get("programs_loaded", 0)
            for w in st["workers"] if w["alive"]}


def calls_executed(st):
    return sum(w.get("stats", {}).get("calls_executed", 0)
               for w in st["workers"])


def test_a_killed_client_is_reclaimed_and_its_queued_calls_dropped(tmp_path):
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=1, log_level="info",
                      log_file=str(log)) as cluster:
        survivor = cluster.connect(name="survivor")
        mine = survivor.slice(2)
        a = mine.put(np.arange(8, dtype=np.float32), plexus.P("devices"))
        short_nap = mine.program("device_sleep", a, micros=1_000)
        # Kept: a dropped one's release may still be on its way when the
        # baseline is read.
        first = short_nap(a)
        np.testing.assert_array_equal(np.asarray(first),
                                      np.arange(8, dtype=np.float32))
        before = cluster.status(fresh=True)
        baseline = live_bytes(before)
        programs = programs_loaded(before)

        victim = subprocess.Popen(
            [sys.executable, "-c", VICTIM, cluster.address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH))
        try:
            line = victim.stdout.readline().decode().split()
            assert line and line[0] == "sent", "the victim did not start"
            victim_id, victim_slice = int(line[1]), int(line[2])
            # Its chain runs: the workers have executed some of its calls
            # and hold its buffers.
            busy = cluster.wait_until(
                lambda st: calls_executed(st) >= calls_executed(before) + 4,
                timeout=30, what="the victim's calls to run")
            assert any(s["slice_id"] == victim_slice for s in busy["slices"])
            assert sum(live_bytes(busy).values()) > sum(baseline.values())
            assert programs_loaded(busy) != programs

            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            killed = time.monotonic()

            # The survivor's next call runs now, not after the victim's
            # queued 50 ms calls (seconds of device time were left).
            np.testing.assert_array_equal(np.asarray(short_nap(a)),
                                          np.arange(8, dtype=np.float32))
            took = time.monotonic() - killed
            assert took < 2.0, f"the survivor's call waited {took:.1f} s"
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()

        # Within the failure deadline the server and the workers have let
        # go of everything the victim held: slices, buffers, programs.
        deadline_s = cluster.heartbeat_timeout_ms / 1000 + 2
        st = cluster.wait_until(
            lambda st: live_bytes(st) == baseline and
            programs_loaded(st) == programs and
            not any(c["client_id"] == victim_id for c in st["clients"]),
            timeout=deadline_s,
            what="the victim's buffers to be freed on every worker")
        assert not any(s["client_id"] == victim_id for s in st["slices"])
        assert [s["slice_id"] for s in st["slices"]] == [mine.id]
        assert not st.get("pending_slices")
        assert time.monotonic() - killed < deadline_s + 1
        # Its queued calls were dropped, not run: far fewer than its 200
        # calls on each of the two workers executed.
        assert calls_executed(st) < calls_executed(before) + 2 * 200 - 40

        # The survivor keeps working, on intact values.
        np.testing.assert_array_equal(np.asarray(short_nap(a)),
                                      np.arange(8, dtype=np.float32))
        survivor.close()


# A client whose calls are long: one runs on each device while the next
# waits in the worker's queue.
LONG_VICTIM = r"""
import sys
import numpy as np
import plexus
client = plexus.connect(sys.argv[1], name="victim")
s = client.slice(2)
x = s.put(np.ones(8, np.float32), plexus.P("devices"))
nap = s.program("device_sleep", x, micros=3_000_000)
y = x
for _ in range(5):
    y = nap(y)
client.flush()
print("sent", client.id, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_killed_clients_call_queued_on_a_worker_is_dropped(tmp_path):
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=1, log_level="info",
                      log_file=str(log)) as cluster:
        survivor = cluster.connect(name="survivor")
        mine = survivor.slice(2)
        a = mine.put(np.arange(8, dtype=np.float32), plexus.P("devices"))
        short_nap = mine.program("device_sleep", a, micros=1_000)
        np.asarray(short_nap(a))
        victim = subprocess.Popen(
            [sys.executable, "-c", LONG_VICTIM, cluster.address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH))
        try:
            line = victim.stdout.readline().decode().split()
            assert line and line[0] == "sent", "the victim did not start"
            victim_id = int(line[1])
            # Its first call is running on each device (3 s), the next ones
            # queued behind it.
            cluster.wait_until(
                lambda st: sum(w.get("stats", {}).get("live_buffers", 0)
                               for w in st["workers"]) >= 6,
                timeout=10, what="the victim's calls to reach the workers")
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
        killed = time.monotonic()
        # The call running when it died finishes (a device cannot be
        # interrupted); the four queued behind it are dropped, so the
        # survivor's call runs right after it: within 3 s (and some slack
        # for a loaded machine), not the 15 s of all five.
        np.testing.assert_array_equal(np.asarray(short_nap(a)),
                                      np.arange(8, dtype=np.float32))
        took = time.monotonic() - killed
        assert took < 5.5, f"the survivor's call waited {took:.1f} s"
        st = cluster.wait_until(
            lambda st: not any(c["client_id"] == victim_id
                               for c in st["clients"]),
            timeout=5, what="the victim to be gone")
        # At most the running call of each device completed.
        assert sum(w.get("stats", {}).get("calls_executed", 0)
                   for w in st["workers"]) <= 2 + 2 + 2
        survivor.close()
