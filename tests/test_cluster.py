"""The embedded cluster as a user drives it: processes, failures, status."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH, ROOT
from plexus._process import wait_for_exit


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_context_manager_leaves_no_process_behind_even_on_error(tmp_path):
    pids = []
    with pytest.raises(RuntimeError, match="boom"):
        with plexus.local(hosts=2, devices_per_host=1,
                          log_file=str(tmp_path / "log")) as cluster:
            pids = cluster.worker_pids() + [cluster.process.pid]
            assert len(pids) == 3 and all(alive(p) for p in pids)
            raise RuntimeError("boom")
    assert wait_for_exit(pids, timeout=10) == [], "server or workers still running"
    assert not any(alive(p) for p in pids)


def test_every_process_exits_cleanly_at_shutdown(tmp_path):
    # Regression: every worker used to segfault at shutdown (its signal
    # thread called into the worker after main had destroyed it), and
    # nothing noticed. down() now raises if the server or any worker exits
    # non-zero or on a signal.
    cluster = plexus.local(hosts=3, devices_per_host=1,
                           log_file=str(tmp_path / "log"))
    try:
        pids = cluster.worker_pids() + [cluster.process.pid]
        client = cluster.connect()
        s = client.slice(3, placement="spread")
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        total = s.program("all_reduce", plexus.Spec((), "float32",
                                                    plexus.partial()))
        assert float(np.asarray(total(s.program("reduce_sum", x)(x)))) == 15
    except BaseException:
        cluster._stop(timeout=10)
        raise
    cluster.down()  # raises ClusterExitError on any unclean exit
    assert not any(alive(p) for p in pids)


def test_a_cluster_shuts_down_cleanly_while_a_kernel_runs(tmp_path):
    # Regression: a worker whose device was in a long kernel waited for it
    # at shutdown (its teardown joins the device's thread); the server
    # killed it after 12 s and down() raised. A kernel cannot be
    # interrupted: the worker now exits without it after its teardown
    # grace, cleanly, and says so.
    log = tmp_path / "log"
    cluster = plexus.local(hosts=2, devices_per_host=1, log_file=str(log))
    try:
        pids = cluster.worker_pids() + [cluster.process.pid]
        client = cluster.connect()
        s = client.slice(1, hosts=["host0"])
        x = s.put(np.arange(4, dtype=np.float32))
        sleep = s.program("device_sleep", x, micros=600_000_000)
        sleep(x)
        cluster.wait_until(
            lambda st: any(w["host_name"] == "host0"
                           and sum(w["stats"].get("device_busy_micros", [])) > 0
                           for w in st["workers"]),
            timeout=30, what="host0's device running the kernel")
    except BaseException:
        cluster._stop(timeout=10)
        raise
    cluster.down()  # raises ClusterExitError on any unclean exit
    assert not any(alive(p) for p in pids)
    assert "exiting with a kernel still running" in log.read_text()


def test_a_worker_crash_before_shutdown_makes_down_raise(tmp_path):
    cluster = plexus.local(hosts=2, devices_per_host=1,
                           log_file=str(tmp_path / "log"))
    victim = next(w for w in cluster.status()["workers"]
                  if w["host_name"] == "host1")
    # A crash as a failed check makes one. Not SIGSEGV: under AddressSanitizer
    # (make test-asan) the worker would report it and exit with code 1.
    os.kill(victim["pid"], signal.SIGABRT)
    assert wait_for_exit([victim["pid"]], timeout=10) == []
    with pytest.raises(plexus.ClusterExitError) as e:
        cluster.down()
    message = str(e.value)
    assert f"worker host1 (pid {victim['pid']})" in message, message
    assert "signal 6 (SIGABRT)" in message, message
    assert "plexus-server" in message and "code 3" in message, message
    assert "host0" not in message, message  # the other worker was fine


def test_killed_worker_fails_dependent_futures_within_5s(tmp_path):
    # The SIGKILLed worker is reported again when the cluster goes down.
    with pytest.raises(plexus.ClusterExitError, match=r"host1 .*SIGKILL"), \
            plexus.local(hosts=2, devices_per_host=1, log_level="info",
                         log_file=str(tmp_path / "log")) as cluster:
        client = cluster.connect()
        s = client.slice(2, placement="spread")
        x = s.put(np.zeros(2, np.float32), plexus.P("devices"))
        busy = s.program("busy_wait", x, micros=20_000)
        reduce = s.program("reduce_sum", x)
        y = x
        for _ in range(200):            # ~4 s of work queued on each host
            y = busy(y)
        total = s.program("all_reduce", plexus.Spec((), "float32",
                                                    plexus.partial()))(reduce(y))
        victim = next(w for w in cluster.status()["workers"]
                      if w["host_name"] == "host1")
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(plexus.PlexusError) as e:
            np.asarray(total)
        elapsed = time.monotonic() - t0
        assert elapsed < 5, f"took {elapsed:.1f} s to fail"
        assert "worker" in str(e.value)
        # The rest of the cluster still serves a new client.
        cluster.wait_until(lambda st: any(not w["alive"] for w in st["workers"]),
                   what="the server to mark the worker down")
        other = cluster.connect(name="after")
        s2 = other.slice(1)
        assert s2.devices[0]["host"] == "host0"
        z = s2.put(np.arange(3, dtype=np.float32))
        np.testing.assert_array_equal(
            np.asarray(s2.program("scale", z, factor=2.0)(z)), [0, 2, 4])
        from plexus.cli import format_status
        assert "DOWN" in format_status(cluster.status())


def test_64mib_moves_worker_to_worker_not_through_client_or_server(tmp_path):
    with plexus.local(hosts=2, devices_per_host=1, device_memory_mib=512,
                      log_file=str(tmp_path / "log")) as cluster:
        client = cluster.connect()
        a = client.slice(1, placement="one_host")
        b = client.slice(1, placement="one_host")
        assert a.devices[0]["host"] != b.devices[0]["host"]
        n = 16 << 20  # float32: 64 MiB
        x = a.program("iota", shape=[n], dtype="float32")()
        total = b.program("reduce_sum", plexus.Spec((n,), "float32"))(x)
        got = float(np.asarray(total))
        assert got == pytest.approx(float(n) * (n - 1) / 2, rel=1e-3)
        counters = client.counters()
        assert counters["bytes_put"] == 0
        assert counters["bytes_fetched"] < 1024

        def moved(st):
            by_host = {w["host_name"]: w["stats"] for w in st["workers"]}
            src = by_host[a.devices[0]["host"]]
            dst = by_host[b.devices[0]["host"]]
            return (src.get("bytes_sent", 0) >= 64 << 20 and
                    dst.get("bytes_received", 0) >= 64 << 20)

        st = cluster.wait_until(moved, what="worker counters to show 64 MiB moved")
        assert st["data_bytes"] == 0
        assert st["control_bytes_in"] < 1 << 20  # control messages only
        from plexus.cli import format_status
        table = format_status(st)
        assert "64.0 MiB" in table


@pytest.mark.parametrize("shared_memory", [True, False],
                         ids=["unix-socket", "tcp"])
def test_ops_go_as_frames_client_to_server_to_workers(tmp_path,
                                                      shared_memory):
    log = tmp_path / "log"
    with plexus.local(hosts=2, shared_memory=shared_memory, log_level="info",
                      log_file=str(log)) as cluster:
        client = cluster.connect(name="frames", shared_memory=shared_memory)
        s = client.slice(2, placement="spread")
        x = s.put(np.arange(8, dtype=np.float32).reshape(2, 4),
                  plexus.P("devices", None))
        f = s.program("scale", x, factor=2.0)
        y = x
        for _ in range(30):
            y = f(y)
        np.testing.assert_array_equal(
            np.asarray(y), np.arange(8, dtype=np.float32).reshape(2, 4) * 2.0**30)
        # Every call's Execute reached both workers as frames, not on the
        # gRPC stream (each write is one frame: at least one per worker).
        cluster.wait_until(
            lambda st: len(st["workers"]) == 2 and all(
                w["stats"].get("ops_frames", 0) >= 1 for w in st["workers"]),
            what="both workers to count ops taken as frames")
        # The client's messages went to the server as frames too (all of
        # them after its session opened), and the server applied them.
        counters = client.counters()
        assert counters["messages_sent"] >= 3, counters
        assert counters["messages_sent_as_frames"] == \
            counters["messages_sent"], counters
        cluster.wait_until(
            lambda st: any(c.get("ops_on_frames") and
                           c.get("ops_frames", 0) >= 3
                           for c in st["clients"]),
            what="the server to count the client's ops frames")
        # `plexus status` says which carrier the session's ops take.
        from plexus.cli import format_status
        table = format_status(cluster.status())
        assert "OPS" in table and "frames" in table, table
        client.close()
    text = log.read_text()
    assert "its ops now come as frames" in text, text
    carrier = "unix socket" if shared_memory else "TCP"
    assert text.count(f"ops now on its data plane ({carrier})") == 2, text
    assert "ops stay on its gRPC stream" not in text


def test_cli_up_status_down(tmp_path):
    env = dict(os.environ, PLEXUS_STATE_DIR=str(tmp_path),
               PYTHONPATH=PLEXUS_PYTHONPATH)
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "plexus", *args], env=env, capture_output=True,
        text=True, timeout=60)
    up = run("up", "--hosts", "2", "--devices-per-host", "2")
    assert up.returncode == 0, up.stderr
    try:
        st = run("status")
        assert st.returncode == 0, st.stderr
        assert "host0" in st.stdout and "host1" in st.stdout
        assert "HOST" in st.stdout and "DEVICES" in st.stdout
        again = run("up")
        assert again.returncode == 1 and "already up" in again.stderr
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    gone = run("status")
    assert gone.returncode == 1 and "no Plexus cluster" in gone.stderr


def test_a_fresh_status_holds_what_the_workers_did_before_it_was_asked():
    # status(fresh=True) asks every worker for its figures, read after the
    # request came, so they count each value made before it was asked. It
    # used to wait for any heartbeat read after the request came, which
    # may have been composed before (a donation test saw 7 of its 8
    # donations), or for none in its 3 s (here, where periodic heartbeats
    # are 6 s apart: a 60 s heartbeat timeout, it saw empty figures).
    with plexus.local(hosts=2, heartbeat_timeout_ms=60000) as cluster:
        client = cluster.connect()
        s = client.slice(2, placement="spread")
        shard = 256 * 4  # bytes of one worker's row of float32
        x = s.put(np.zeros((2, 256), np.float32), plexus.P("devices", None))
        y = s.program("scale", x, factor=2.0)(x)
        y.block_until_ready()
        st = cluster.status(fresh=True)
        assert [w["stats"].get("live_bytes", 0)
                for w in st["workers"]] == [2 * shard] * 2, st["workers"]


def test_a_fresh_status_says_how_old_a_silent_workers_figures_are():
    # A stopped worker cannot answer a fresh status: the status comes at
    # the end of its wait (3 s) anyway, with that worker's figures as old
    # as its last heartbeat, before it stopped; the other answered after
    # the request. `plexus status` and a wait on the status that times out
    # name the silent host. (Heartbeats 1 s apart: silent from 3 s on,
    # declared down after 10 s.)
    with plexus.local(hosts=2, heartbeat_timeout_ms=10000) as cluster:
        pids = {w["host_name"]: int(w["pid"])
                for w in cluster.status()["workers"]}
        os.kill(pids["host1"], signal.SIGSTOP)
        try:
            st = cluster.status(fresh=True)
            assert int(st["heartbeat_interval_ms"]) == 1000
            age = {w["host_name"]: int(w["stats_age_ms"])
                   for w in st["workers"]}
            assert all(w["alive"] for w in st["workers"]), st["workers"]
            assert age["host1"] >= 3000 and age["host0"] < age["host1"], age
            from plexus.cli import format_status
            text = format_status(st)
            assert "up (silent " in text, text
            with pytest.raises(TimeoutError,
                               match=r"host1 alive \(last heard \d+ ms "
                                     r"ago\)"):
                cluster.wait_until(lambda st: False, timeout=0,
                                   what="nothing")
        finally:
            os.kill(pids["host1"], signal.SIGCONT)


def test_a_wait_on_the_status_that_times_out_says_what_it_last_saw():
    # A test (or a user's script) that waits on the status and times out
    # is told what the cluster looked like then: each client's calls
    # waiting, in flight and admitted, and each worker alive or down.
    with plexus.local(hosts=2) as cluster:
        client = cluster.connect(name="waiter")
        s = client.slice(1, hosts=["host1"])
        x = s.put(np.zeros(4, np.float32))
        s.program("scale", x, factor=2.0)(x).block_until_ready()
        with pytest.raises(TimeoutError) as e:
            cluster.wait_until(lambda st: False, timeout=0.2,
                               what="something that never comes")
    text = str(e.value)
    assert "waiting for something that never comes" in text, text
    assert "waiter: 0 waiting, 0 in flight, 1 admitted" in text, text
    assert "host0 alive" in text and "host1 alive" in text, text
