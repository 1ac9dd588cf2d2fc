"""A host lost under a running job (SIGKILL of its worker): with a spare,
the server remaps the slice's virtual devices onto it and recovers what the
lost host held from its records (a replicated value copied from a surviving
shard, a split value recomputed from its inputs, calls in flight run
again), so the client's futures read the values a failure-free run gives;
without one, the values that depended on it raise DeviceLostError."""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import plexus
from chaos import kill_host
import plexus._binaries
from plexus.cli import why_lines
WAIT_S = 30


def status(cluster):
    return cluster.status()


def wait_until(cluster, what, predicate):
    """The status once predicate(status) holds: re-read after each round of
    heartbeats, for at most WAIT_S (LocalCluster.wait_until)."""
    return cluster.wait_until(predicate, timeout=WAIT_S, what=what)


def counters(cluster):
    """The server's recovery counters."""
    return status(cluster).get("recovery", {})


def slice_of(st, s):
    return next(sl for sl in st["slices"] if sl["slice_id"] == s.id)


def remapped(cluster, s):
    """Waits until the server has remapped slice `s` once. (The client's
    own map follows with the server's note; a read that needs it waits for
    that note.)"""
    wait_until(cluster, "the remap",
               lambda st: slice_of(st, s).get("generation", 0) == 1)


def live_bytes(st):
    return sum(w.get("stats", {}).get("live_bytes", 0)
               for w in st["workers"] if w["alive"])


def test_without_a_spare_the_values_of_a_lost_host_raise_device_lost():
    # Without spares the killed worker stays lost, and the cluster says so
    # when it shuts down.
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        lose_a_host_with_no_spare()


def lose_a_host_with_no_spare():
    with plexus.local(hosts=3) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        double = s.program("scale", x, factor=2.0)
        y = double(x)
        np.testing.assert_array_equal(np.asarray(y), 2 * np.arange(6))
        kill_host(cluster, s.devices[1]["host"])
        z = double(y)
        with pytest.raises(plexus.DeviceLostError) as e:
            np.asarray(z)
        # A kind of UnavailableError, as a lost worker always was.
        assert isinstance(e.value, plexus.UnavailableError)
        assert s.generation == 0
        assert "lost its connection" in slice_of(status(cluster), s)["broken"]


def test_a_lost_host_is_remapped_onto_the_spare_and_its_values_recovered():
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        hosts = [d["host"] for d in s.devices]
        assert sorted(hosts) == ["host0", "host1", "host2"]  # never the spare
        w = s.put(np.arange(6, dtype=np.float32), plexus.replicated())
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        add = s.program("add", w, w)
        v = add(w, w)  # replicated: a copy survives on the other hosts
        np.testing.assert_array_equal(np.asarray(v), 2 * np.arange(6))
        victim = hosts[1]
        kill_host(cluster, victim)
        remapped(cluster, s)
        # Replicated values are copied from a surviving shard.
        np.testing.assert_array_equal(np.asarray(w), np.arange(6))
        np.testing.assert_array_equal(np.asarray(v), 2 * np.arange(6))
        # A split put had its only copy of shard 1 there: the client kept
        # the data and puts that shard again on the spare. (Reading shard 1
        # takes the client's new map.)
        np.testing.assert_array_equal(np.asarray(x), np.arange(6))
        assert s.generation == 1
        now = [d["host"] for d in s.devices]
        assert now[0] == hosts[0] and now[2] == hosts[2]
        assert now[1].startswith("spare"), now
        # The slice goes on: new values, new calls, on the new map.
        y = s.put(np.full(6, 3, np.float32), plexus.P("devices"))
        np.testing.assert_array_equal(np.asarray(add(y, y)), np.full(6, 6))
        np.testing.assert_array_equal(np.asarray(add(v, w)), 3 * np.arange(6))
        r = counters(cluster)
        assert r["hosts_lost"] == 1 and r["slices_remapped"] == 1
        # w is copied; v too, or recomputed if its completion had not
        # reached the server yet.
        assert r["buffers_restored"] >= 1 and r["buffers_failed"] == 0
        assert r["buffers_restored"] + r["calls_recomputed"] >= 2
        assert r["shards_reput"] == 1
        # The embedded cluster replaced the killed worker with a new spare.
        wait_until(cluster, "a new spare", lambda st: any(
            wk["alive"] and wk.get("spare") for wk in st["workers"]))


def test_a_split_value_is_recomputed_from_inputs_that_survive():
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        a = c.slice(2, hosts=["host0", "host2"])
        b = c.slice(3)
        x = a.put(np.arange(12, dtype=np.float32).reshape(6, 2), plexus.P("devices"))
        scale = b.program("scale", plexus.Spec((6, 2), "float32", plexus.P("devices")),
                          factor=3.0)
        y = scale(x)  # x moves from a's 2 devices to b's 3
        np.testing.assert_array_equal(np.asarray(y), 3 * np.arange(12).reshape(6, 2))
        before = counters(cluster).get("calls_recomputed", 0)
        kill_host(cluster, "host1")
        remapped(cluster, b)
        np.testing.assert_array_equal(np.asarray(y), 3 * np.arange(12).reshape(6, 2))
        assert b.generation == 1
        r = counters(cluster)
        assert r["calls_recomputed"] == before + 1
        assert a.generation == 0  # it had nothing on host1


def test_calls_in_flight_on_a_lost_host_run_again_and_give_the_same_values():
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        # Replicated: a put's only copy of a split shard would be lost.
        x = s.put(np.arange(6, dtype=np.float32), plexus.replicated())
        nap = s.program("device_sleep", x, micros=20_000)
        add = s.program("add", x, x)
        chain = [x]
        for _ in range(40):  # ~0.8 s of device time on each device
            chain.append(add(nap(chain[-1]), x))
        c.flush()
        np.testing.assert_array_equal(np.asarray(chain[5]), 6 * np.arange(6))
        kill_host(cluster, s.devices[1]["host"])
        # The last value, and one computed before the loss, read as a
        # failure-free run computes them.
        np.testing.assert_array_equal(np.asarray(chain[-1]), 41 * np.arange(6))
        np.testing.assert_array_equal(np.asarray(chain[20]), 21 * np.arange(6))
        assert s.generation == 1
        assert counters(cluster)["calls_recomputed"] > 0


def test_a_snapshotted_value_is_restored_from_its_copy():
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        double = s.program("scale", x, factor=2.0)
        m = double(x)
        del x  # m's input goes: m cannot be recomputed
        c.snapshot(m)
        np.testing.assert_array_equal(np.asarray(m), 2 * np.arange(6))
        # m and its copy (24 bytes each) are all the workers hold.
        wait_until(cluster, "the snapshot's copy",
                   lambda st: live_bytes(st) == 48)
        kill_host(cluster, s.devices[1]["host"])
        remapped(cluster, s)
        np.testing.assert_array_equal(np.asarray(m), 2 * np.arange(6))
        r = counters(cluster)
        assert r["snapshots_taken"] == 1 and r["shards_from_snapshots"] == 1
        assert r["buffers_failed"] == 0 and r["calls_recomputed"] == 0


def test_a_split_value_keeps_its_inputs_until_snapshotted_so_it_can_be_recomputed():
    """Lineage reaches back to the last snapshot, put or replicated value:
    a dropped input of a split value that has no snapshot stays on the
    workers (the server holds its release), so the value is recomputed
    after a loss; a snapshot lets the input go."""
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        y = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        x = s.program("scale", y, factor=1.0)(y)
        del y
        double = s.program("scale", x, factor=2.0)
        m = double(x)
        del x
        np.testing.assert_array_equal(np.asarray(m), 2 * np.arange(6))
        # Neither x nor y went: m's lineage reaches back to the put.
        wait_until(cluster, "x, y and m", lambda st: live_bytes(st) == 72)
        kill_host(cluster, s.devices[1]["host"])
        np.testing.assert_array_equal(np.asarray(m), 2 * np.arange(6))
        r = counters(cluster)
        assert r["buffers_failed"] == 0 and r["calls_recomputed"] >= 1
        # Snapshotted, m no longer needs x, nor x y: both go. What stays:
        # m under its new id (24 bytes), its copy (24), and m's old shards
        # on the two hosts that survived (16), kept until the client
        # releases m (a read of the old id that has not heard of the new
        # one finds them). The records say x and y went; the bytes, that
        # the workers let them go. (Live bytes alone passed this check on
        # a spare's stale stats and failed it on fresh ones.)
        c.snapshot(m)
        wait_until(cluster, "x and y released, m's copy made",
                   lambda st: st["recovery"].get("buffer_records", 0) == 1 and
                   st["recovery"].get("call_records", 0) == 1 and
                   live_bytes(st) == 64)
        del m
        wait_until(cluster, "m, its copy and its old shards released",
                   lambda st: live_bytes(st) == 0)


def test_a_stopped_host_is_declared_down_remapped_and_fenced_when_it_wakes():
    with plexus.local(hosts=3, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(3)
        x = s.put(np.arange(6, dtype=np.float32), plexus.P("devices"))
        y = s.program("scale", x, factor=5.0)(x)
        np.testing.assert_array_equal(np.asarray(y), 5 * np.arange(6))
        victim = s.devices[1]["host"]
        other = s.devices[0]["host"]
        sb = c.slice(1, hosts=[other])
        gather = sb.program("identity", plexus.Spec((6,), "float32"))
        w = next(w for w in status(cluster)["workers"]
                 if w["alive"] and w["host_name"] == victim)
        pid = int(w["pid"])
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            # Routed while the host is stopped: its share (pushing its
            # shard of y to `other`) waits in its stream until it wakes.
            z = gather(y)
            remapped(cluster, s)
            took = time.monotonic() - stopped
            assert took <= 1.0 + 0.5, took  # the deadline, and status reads
            # The job goes on, on the spare: z is computed again.
            np.testing.assert_array_equal(np.asarray(z), 5 * np.arange(6))
        finally:
            os.kill(pid, signal.SIGCONT)
        # It wakes: its late push is refused (fenced) and z stays right.
        wait_until(cluster, "the fenced push", lambda st: any(
            wk.get("stats", {}).get("pushes_fenced", 0) >= 1
            for wk in st["workers"] if wk["alive"]))
        np.testing.assert_array_equal(np.asarray(z), 5 * np.arange(6))
        np.testing.assert_array_equal(np.asarray(y), 5 * np.arange(6))


def spare_of(cluster):
    """The live spare's status entry."""
    return next(w for w in status(cluster)["workers"]
                if w["alive"] and w.get("spare"))


def doubled(cluster, n):
    """A slice of `n` devices with a split put x, a program doubling it and
    y = double(x), read once: (slice, x, double, y)."""
    s = cluster.connect().slice(n)
    x = s.put(np.arange(2 * n, dtype=np.float32), plexus.P("devices"))
    double = s.program("scale", x, factor=2.0)
    y = double(x)
    np.testing.assert_array_equal(np.asarray(y), 2 * np.arange(2 * n))
    return s, x, double, y


def test_a_slice_whose_host_is_lost_while_no_spare_is_free_waits_for_one():
    # A host of the slice dies while the only spare is stopped: the host's
    # loss takes the spare (it still counts as alive), and when the spare
    # is declared lost in turn no spare is free, so the slice waits for a
    # host rather than breaking. One that joins within the wait (started
    # here) takes its place, and the job goes on on the new map with the
    # values a failure-free run gives. The embedded cluster may replace
    # one worker a minute, and has replaced the first spare already: with
    # its replacements free to join, one sometimes joined before the
    # host's loss was handled and took the slice at once (no wait).
    with plexus.local(hosts=2, spare=1,
                      max_restarts_per_minute=1) as cluster:
        s, x, double, y = doubled(cluster, 2)
        first = int(spare_of(cluster)["pid"])
        os.kill(first, signal.SIGKILL)
        spare = wait_until(
            cluster, "the spare's replacement",
            lambda st: any(w["alive"] and w.get("spare") and
                           int(w["pid"]) != first for w in st["workers"]))
        spare_pid = next(int(w["pid"]) for w in spare["workers"]
                         if w["alive"] and w.get("spare"))
        host_pid = next(int(w["pid"]) for w in spare["workers"]
                        if w["alive"] and w["host_name"] == s.devices[1]["host"])
        os.kill(spare_pid, signal.SIGSTOP)
        os.kill(host_pid, signal.SIGKILL)
        worker = None
        try:
            # The server explains the slice's wait once it has lasted 1 s:
            # `plexus why`, the client's why() and a wait's deadline error
            # say what the slice waits for, and for how long.
            waits = f"slice {s.id} has waited "
            st = wait_until(cluster, "the slice's wait explained",
                            lambda st: any(waits in e["reason"]
                                           for e in st.get("why", [])))
            assert slice_of(st, s).get("awaiting"), st
            said = [line for _, line in why_lines(st)]
            assert any(waits in line and " for a host to take a lost one's "
                       "place (" in line and " s left" in line
                       for line in said), said
            assert any(e.get("slice_id") == s.id and not e.get("call_id")
                       for e in s._client.why()), s._client.why()
            # (Not a wait with a deadline here: the client is re-putting
            # x's shard to the stopped spare, and a wait, timeout or not,
            # waits behind that until the handshake's 10 s pass.)
            worker = subprocess.Popen(
                [str(plexus._binaries.bin_dir() / "plexus-worker"),
                 "--server", cluster.address, "--devices", "1",
                 "--host-name", "joiner", "--die-with-parent"],
                env={**os.environ, "PLEXUS_CLUSTER_SECRET": cluster._secret},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            z = double(y)  # its batch waits at the server for the new map
            np.testing.assert_array_equal(np.asarray(z), 4 * np.arange(4))
            np.testing.assert_array_equal(np.asarray(x), np.arange(4))
        finally:
            os.kill(spare_pid, signal.SIGKILL)  # stopped: fenced, then gone
        r = counters(cluster)
        assert r.get("losses_awaited", 0) >= 1, r
        assert r.get("losses_resumed", 0) == r["losses_awaited"], r
        assert r.get("slices_broken", 0) == 0, r
        assert s.generation >= 1
        assert not slice_of(status(cluster), s).get("broken")
        # The slice goes on: a new value, a new call.
        v = s.put(np.full(4, 3, np.float32), plexus.P("devices"))
        np.testing.assert_array_equal(np.asarray(double(v)), np.full(4, 6))
    # The server's shutdown ended the joiner's session.
    assert worker.wait(timeout=WAIT_S) == 0


def test_a_slice_that_waits_in_vain_for_a_host_breaks_at_its_deadline():
    # One replacement a minute: the first killed spare is replaced, the
    # second is not, so when a host of the slice dies no host can come.
    with plexus.local(hosts=2, spare=1, spare_wait_ms=1000,
                      max_restarts_per_minute=1) as cluster:
        s, _, double, y = doubled(cluster, 2)
        first = spare_of(cluster)
        os.kill(int(first["pid"]), signal.SIGKILL)
        second = wait_until(cluster, "the spare's replacement", lambda st: any(
            w["alive"] and w.get("spare") and w["pid"] != first["pid"]
            for w in st["workers"]))
        second = next(w for w in second["workers"]
                      if w["alive"] and w.get("spare"))
        os.kill(int(second["pid"]), signal.SIGKILL)
        wait_until(cluster, "the second spare declared down", lambda st: all(
            not w["alive"] for w in st["workers"]
            if w["worker_id"] == second["worker_id"]))
        kill_host(cluster, s.devices[1]["host"])
        killed = time.monotonic()
        st = wait_until(cluster, "the slice waiting for a host",
                        lambda st: slice_of(st, s).get("awaiting")
                        or slice_of(st, s).get("broken"))
        z = double(y)
        with pytest.raises(plexus.DeviceLostError) as e:
            np.asarray(z)
        waited = time.monotonic() - killed
        assert "no host took its place" in str(e.value), e.value
        assert waited >= 0.9, waited  # it waited for the deadline
        broken = slice_of(status(cluster), s)["broken"]
        assert "no host took its place within 1s" in broken, broken
        r = counters(cluster)
        assert r.get("losses_awaited", 0) == 1 and r.get("slices_broken") == 1
        assert r.get("losses_resumed", 0) == 0
