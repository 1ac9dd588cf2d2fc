"""Why is it stuck: a job hung on purpose, and `client.why()` / `plexus why`
name the root cause, the host and the call chain (server/why/why.h)."""
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH

WAIT_S = 30


def deadline_error(futures, timeout=0.3):
    """The message of the DeadlineExceededError a wait on `futures` with
    `timeout` raises (they are held: the test made sure)."""
    with pytest.raises(plexus.DeadlineExceededError) as e:
        plexus.wait(futures, timeout=timeout)
    return str(e.value)


def issued_here(program, said):
    """Whether `said` names `program`'s call with a line of this file (the
    site may lead with pytest's frame that called the test)."""
    return re.search(rf"\('{program}' issued at [^)]*test_why\.py:\d+", said)


def poll_why(cluster, client, pred, what):
    """The first of client.why()'s entries that satisfies `pred`, once the
    server's status has one (re-read after each round of heartbeats, at
    most WAIT_S)."""
    cluster.wait_until(
        lambda st: any(pred(e) and e["client_id"] == client.id
                       for e in st.get("why", [])),
        timeout=WAIT_S, what=f"a why entry for {what}")
    why = client.why()
    hit = [e for e in why if pred(e)]
    assert hit, why
    return hit[0], why


# A call that outlasts any test: the test reads what waits on it and ends;
# the cluster's exit ends the kernel (a worker leaves a running kernel to
# its process's exit). Not a duration that happens to be long enough.
HELD_MICROS = 600_000_000


def chain_across_two_hosts(cluster, sleep_micros=HELD_MICROS):
    c = cluster.connect(name="stuck")
    a = c.slice(1, hosts=["host0"])
    b = c.slice(1, hosts=["host1"])
    x = a.put(np.arange(4, dtype=np.float32))
    slow = a.program("device_sleep", x, micros=sleep_micros, name="slow_step")
    g = b.program("scale", x, factor=2.0, name="consumer")
    z = g(slow(x))
    return c, z, (a, b)  # the slices stay held while the test reads why


def test_a_consumer_waiting_on_a_long_call_names_it_and_its_host():
    with plexus.local(hosts=2) as cluster:
        c, z, slices = chain_across_two_hosts(cluster)
        e, why = poll_why(cluster, c, lambda e: e["program"] == "consumer",
                          "the consumer")
        assert "for its input from call" in e["reason"], e
        assert "'slow_step'" in e["reason"], e
        # The lines of this file that issued both calls.
        assert "test_why.py:" in e["site"], e
        assert "('slow_step' issued at test_why.py:" in e["reason"], e
        assert "on host host0" in e["reason"], e
        assert e["blame_host"] == "host0", e
        # The CLI says the same, for every client.
        out = subprocess.run(
            [sys.executable, "-m", "plexus", "why", "--address",
             cluster.address], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": PLEXUS_PYTHONPATH})
        assert out.returncode == 0, out.stderr
        assert "(stuck): call" in out.stdout and "'slow_step'" in out.stdout, \
            out.stdout
        # A wait on the consumer's output that reaches its deadline names
        # the cause, its host and the line that issued it.
        said = deadline_error(z)
        assert "The server says: call" in said, said
        assert issued_here("slow_step", said), said
        assert "it is running on host host0" in said, said


def test_a_stopped_host_is_named_before_it_is_declared_lost():
    # A long heartbeat timeout: the host stays stopped, not yet lost, while
    # the consumer waits on it.
    with plexus.local(hosts=2, heartbeat_timeout_ms=20_000) as cluster:
        c, z, slices = chain_across_two_hosts(cluster, 5_000_000)
        pid = next(int(w["pid"]) for w in cluster.status()["workers"]
                   if w["host_name"] == "host0")
        os.kill(pid, signal.SIGSTOP)
        try:
            e, _ = poll_why(cluster, c, lambda e: e["program"] == "consumer" and
                            "no heartbeat" in e["reason"], "the stopped host")
            assert f"host host0 (worker" in e["reason"], e
            assert f"pid {pid})" in e["reason"], e
            assert "stopped (SIGSTOP) or hung" in e["reason"], e
            assert e["blame_host"] == "host0", e
            said = deadline_error(z)
            assert f"host host0 (worker" in said and f"pid {pid})" in said, \
                said
            assert "stopped (SIGSTOP) or hung" in said, said
            assert issued_here("consumer", said), said
        finally:
            os.kill(pid, signal.SIGCONT)
        # Once it runs again, the chain completes.
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(z, timeout=WAIT_S)),
            2 * np.arange(4, dtype=np.float32))


def test_a_call_waiting_for_room_on_a_full_device_names_who_holds_it():
    # One device of 1 MiB: another client's value holds 600 KB of it, and
    # this client's call needs 600 KB more for its output.
    with plexus.local(hosts=1, device_memory_mib=1) as cluster:
        hog = cluster.connect(name="hog")
        held = hog.slice(1).put(np.ones(150_000, np.float32))
        c = cluster.connect(name="needy")
        s = c.slice(1)
        y = s.program("fill", shape=[150_000], value=1.0, name="big_output")()
        e, _ = poll_why(cluster, c, lambda e: e["program"] == "big_output"
                        and "is full" in e["reason"], "the full device")
        assert "device 0 of host host0 is full (" in e["reason"], e
        assert "wait for room" in e["reason"], e
        assert f"held by client {hog.id} (hog) 0.6 MiB in 1 value" \
            in e["reason"], e
        assert e["blame_host"] == "host0", e
        assert "test_why.py:" in e["site"], e
        # The deadline error says the same.
        said = deadline_error(y)
        assert "device 0 of host host0 is full (" in said, said
        assert f"held by client {hog.id} (hog)" in said, said
        assert issued_here("big_output", said), said
        # Released, the hog's value makes room and the call goes on.
        del held
        np.testing.assert_array_equal(np.asarray(plexus.wait(y, timeout=WAIT_S)),
                                      np.ones(150_000, np.float32))


def test_a_slice_request_waiting_for_capacity_is_listed():
    # Two hosts of one device: two devices on one host can come only from a
    # host that joins, so the request waits (up to its timeout).
    with plexus.local(hosts=2) as cluster:
        c = cluster.connect(name="greedy")
        errors = []

        def ask():
            try:
                c.slice(2, placement="one_host", timeout=WAIT_S)
            except plexus.PlexusError as e:
                errors.append(e)

        import threading
        t = threading.Thread(target=ask)
        t.start()
        try:
            cluster.wait_until(
                lambda st: any(p.get("waited_ms", 0) >= 1000
                               for p in st.get("pending_slices", [])),
                timeout=WAIT_S, what="the request waiting for 1 s")
            out = subprocess.run(
                [sys.executable, "-m", "plexus", "why", "--address",
                 cluster.address], capture_output=True, text=True,
                timeout=60, env={**os.environ, "PYTHONPATH": PLEXUS_PYTHONPATH})
            assert out.returncode == 0, out.stderr
            assert "(greedy): a slice request for 2 device(s) has waited" \
                in out.stdout, out.stdout
            assert "on one host" in out.stdout, out.stdout
        finally:
            c.close()  # ends the wait
            t.join(WAIT_S)


def test_a_wait_that_reaches_its_deadline_says_what_it_waits_on():
    with plexus.local(hosts=2) as cluster:
        c, z, slices = chain_across_two_hosts(cluster)
        with pytest.raises(plexus.DeadlineExceededError) as e:
            plexus.wait(z, timeout=1.5)
        assert "The server says: call" in str(e.value), e.value
        assert "('slow_step' issued at test_why.py:" in str(e.value), e.value
        assert "host host0" in str(e.value), e.value
        # Only the entries of the futures waited on: the consumer's (which
        # names the slow call), not the slow call's own (its output is not
        # waited on; before, the client's longest waits were shown).
        said = str(e.value)
        assert re.search(r"'consumer' issued at [^)]*\) has waited", said), said
        assert not re.search(r"'slow_step' issued at [^)]*\) has waited",
                             said), said


def test_a_collective_whose_other_rank_is_held_by_a_long_call_names_it():
    # host0's only device runs a long call of another slice; the all_reduce
    # over both hosts runs on host1 and waits there for host0's rank. Its
    # first call (reduce_sum) ran its part on host1: why blames host0 only,
    # and says host1 finished.
    with plexus.local(hosts=2) as cluster:
        c = cluster.connect(name="collective")
        held = c.slice(1, hosts=["host0"])
        both = c.slice(2, placement="spread")
        x = held.put(np.arange(4, dtype=np.float32))
        held.program("device_sleep", x, micros=HELD_MICROS,
                     name="slow_step")(x)
        parts = both.put(np.ones((4, 2), np.float32), plexus.P("devices", None))
        partial = both.program("reduce_sum", parts, axis=0)(parts)
        total = both.program("all_reduce", partial)(partial)
        e, _ = poll_why(cluster, c, lambda e: e["program"] == "reduce_sum"
                        and "finished its part" in e["reason"],
                        "the collective's first call, done on host1")
        # The rank (index in the slice) that has not joined, and its host.
        rank = next(i for i, d in enumerate(both.devices)
                    if d["host"] == "host0")
        assert f"its rank {rank} (of 2) is queued on host host0 behind call" \
            in e["reason"], e
        # The line of this test that issued the long call (after pytest's
        # frame that called the test).
        assert re.search(r"\('slow_step' issued at [^)]*test_why\.py:\d+ in "
                         r"test_a_collective", e["reason"]), e
        # Its part on host1 ran (the all_reduce waits there for host0's).
        assert "; host host1 has finished its part" in e["reason"], e
        assert e["blame_host"] == "host0", e
        # A wait on the all_reduce's output names the same: the rank, the
        # host and the long call's line.
        poll_why(cluster, c, lambda e: e["program"] == "all_reduce",
                 "the all_reduce")
        said = deadline_error(total, timeout=0.1)  # still held, as why says
        assert f"its rank {rank} (of 2) is queued on host host0" in said, said
        assert issued_here("slow_step", said), said
        assert "'reduce_sum'" in said, said


def slow_to_compile(x):
    """Matrix products XLA does not fuse, one after another: seconds of
    compile on a CPU (about 6 s on two busy cores; a call is explained
    once it has waited 1 s, so the compile must outlast that), and
    microseconds of run."""
    import jax.numpy as jnp
    for i in range(80):
        x = jnp.tanh(x @ x.T * (i + 1.0)) + jnp.roll(x, i % 7, axis=0)
    return x


def test_a_call_waiting_for_its_programs_compile_names_the_compile():
    pytest.importorskip("jax")
    with plexus.local(hosts=1) as cluster:
        c = cluster.connect(name="compiling")
        s = c.slice(1)
        step = plexus.jit(slow_to_compile, s, name="step")
        y = step(np.ones((16, 16), np.float32))
        e, _ = poll_why(cluster, c, lambda e: e["program"] == "step" and
                        "is compiling" in e["reason"], "the compile")
        assert "its program 'step' is compiling on host host0 (" in \
            e["reason"], e
        assert e["blame_host"] == "host0", e
        # The root alone (what the progress line shows).
        assert re.fullmatch(
            r"call \d+ \('step'( issued at [^)]*)?\): its "
            r"program 'step' is compiling on host host0 \([\d.]+ s so far\)",
            e["root_reason"]), e
        # The worker lists the compile in its stats while it lasts, and
        # no longer once the call ran.
        plexus.wait(y, timeout=600)
        cluster.wait_until(
            lambda st: not any(w.get("stats", {}).get("compiling")
                               for w in st["workers"]),
            timeout=WAIT_S, what="no compile listed")


def test_a_tenant_behind_anothers_flood_names_its_calls_and_share():
    # One device and the smallest admission window (1 µs): once the flood's
    # first calls are in flight (a window's worth of calls, every one held on
    # the device by the first, which does not end), the worker is full, and
    # the other tenant's call waits at admission behind them.
    tenants = {"tenants": {"flood": {"weight": 3}, "patient": {"weight": 1}}}
    with plexus.local(hosts=1, tenants=tenants,
                      admission_window_us=1) as cluster:
        flooder = cluster.connect(name="flooder", tenant="flood")
        fs = flooder.slice(1)
        fx = fs.put(np.zeros(4, np.float32))
        hold = fs.program("device_sleep", fx, micros=HELD_MICROS,
                          name="flood_step")
        flood = [hold(fx) for _ in range(16)]
        cluster.wait_until(lambda st: any(
            c["name"] == "flooder" and int(c.get("calls_in_flight", 0)) >= 4
            and int(c.get("calls_pending", 0)) >= 1 for c in st["clients"]),
            timeout=WAIT_S, what="the flood's calls in flight and queued")
        patient = cluster.connect(name="patient", tenant="patient")
        ps = patient.slice(1)
        px = ps.put(np.ones(4, np.float32))
        y = ps.program("scale", px, factor=2.0, name="patient_step")(px)
        e, _ = poll_why(cluster, patient,
                        lambda e: e["program"] == "patient_step" and
                        "waits at admission" in e["reason"],
                        "the patient tenant's call at admission")
        reason = e["reason"]
        assert "its client's share (tenant patient, weight 1)" in reason, e
        assert (f"client {flooder.id} (flooder, tenant flood, weight 3)"
                in reason), e
        assert issued_here("flood_step", reason), e
        assert "test_why.py:" in e["site"], e
        # The wait's deadline error names the same.
        said = deadline_error(y)
        assert "waits at admission" in said, said
        assert f"client {flooder.id} (flooder, tenant flood, weight 3)" \
            in said, said
        assert issued_here("patient_step", said), said
        assert issued_here("flood_step", said), said
        del flood  # the cluster's exit ends the held kernel


def lab_status(address, pred, what):
    """The server's status at `address` once `pred` holds (re-read after
    each round of heartbeats, at most WAIT_S)."""
    import time
    from plexus._status import cluster_status
    deadline = time.monotonic() + WAIT_S
    st = cluster_status(address)
    while not pred(st):
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        st = cluster_status(address, True)
    return st


def test_a_fetch_queued_behind_a_stalled_transfer_names_it_and_its_live_peer(
        tmp_path):
    # host0 and host1 in network namespaces of their own; a call on host1
    # reads host0's output, and the packets from host0 to host1 are lost
    # (the data plane stalls; host0's heartbeats flow): a call queued behind
    # it on host1, fetched, is explained by that transfer.
    from netns import NetnsLab
    lab = NetnsLab.create()
    try:
        # A long heartbeat timeout: a beat late on a loaded machine does not
        # make host0 silent (why's silence is 30% of it) while the test
        # reads why.
        server = lab.start_server(tmp_path / "server.log",
                                  extra=["--heartbeat-timeout-ms", "20000"])
        host0, host1 = lab.add_host(), lab.add_host()
        for h in (host0, host1):
            lab.cap_retransmit_interval(h)  # before any connection is made
            lab.start_worker(server, h, tmp_path / f"{h.name}.log")
        c = lab.connect(server.address, name="stalled")
        a, b = c.slice(1, hosts=["host0"]), c.slice(1, hosts=["host1"])
        x = a.put(np.arange(4, dtype=np.float32))
        xb = b.put(np.ones(4, np.float32))
        make = a.program("scale", x, factor=2.0, name="producer")
        use = b.program("scale", x, factor=3.0, name="consumer")
        after = b.program("scale", xb, factor=5.0, name="behind")
        # host0's data plane to host1 is connected: one transfer went.
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(use(make(x)), timeout=WAIT_S)),
            6 * np.arange(4, dtype=np.float32))
        lab.stall(host0, host1)
        z = use(make(x))
        w = after(xb)  # queued on host1 behind the consumer
        lab_status(server.address, lambda st: any(
            e.get("program") == "behind" and "has not delivered" in
            e.get("reason", "") for e in st.get("why", [])),
            "why entry naming the stalled transfer")
        why = {e["program"]: e for e in c.why()}
        for program in ("consumer", "behind"):
            reason = why[program]["reason"]
            assert re.search(r"waits for its input buffer \d+ \(the output of "
                             r"call \d+ \('producer' issued at [^)]*"
                             r"test_why\.py:\d+", reason), reason
            assert "from host host0 (worker" in reason, reason
            assert "which is alive (last heartbeat" in reason, reason
            assert "host host1 has awaited the transfer for" in reason, reason
            assert "running" not in reason, reason
            assert why[program]["blame_host"] == "host0", why[program]
        assert "it is first in line on host host1" in why["consumer"]["reason"]
        assert "is queued on host host1 behind call" in why["behind"]["reason"]
        assert issued_here("consumer", why["behind"]["reason"]), why
        assert "test_why.py:" in why["behind"]["site"], why
        out = subprocess.run(
            [sys.executable, "-m", "plexus", "why", "--address",
             server.address], capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": PLEXUS_PYTHONPATH})
        assert out.returncode == 0, out.stderr
        assert "(stalled): call" in out.stdout, out.stdout
        assert "from host host0 (worker" in out.stdout, out.stdout
        assert "which is alive" in out.stdout, out.stdout
        said = deadline_error(w)
        assert issued_here("behind", said), said
        assert issued_here("producer", said), said
        assert "from host host0 (worker" in said, said
        assert "which is alive (last heartbeat" in said, said
        assert "has awaited the transfer for" in said, said
        # The way open again, the transfer arrives and the chain completes.
        lab.stall(host0, host1, stalled=False)
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(z, timeout=WAIT_S)),
            6 * np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(w, timeout=WAIT_S)),
            5 * np.ones(4, np.float32))
        c.close()
        assert lab.stop() == []
    finally:
        lab.close()
