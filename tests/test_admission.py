"""Admission at the server (src/plexus/server/scheduling/admission.h) against real
processes: a stalled worker holds up only the calls that need it, and the
server and workers account each client's calls and device time."""
import os
import signal
import threading
import time

import json

import numpy as np

import plexus
from plexus import _core


def _worker_pid(cluster, host):
    for w in cluster.status()["workers"]:
        if w["host_name"] == host:
            return int(w["pid"])
    raise AssertionError(f"no worker on {host}: {cluster.status()['workers']}")


def _calls_per_second(program, x, calls):
    """Issues `calls` calls at once and waits for all: device-bound, so the
    rate is the devices' (10 ms each), not this process's."""
    start = time.monotonic()
    outs = [program(x) for _ in range(calls)]
    for y in outs:
        y.block_until_ready()
    return calls / (time.monotonic() - start)


def test_a_stopped_worker_with_a_full_queue_does_not_slow_other_hosts():
    # A long heartbeat deadline: the stopped worker stays "alive" (a slow
    # host, not a dead one) for the whole test, longer than its bounded waits
    # add up to (under ASan on 2 busy cores the flood alone took over 80 s,
    # and a 2-minute deadline declared host0 down before its calls queued).
    with plexus.local(hosts=3, heartbeat_timeout_ms=900_000) as cluster:
        a = cluster.connect(name="a")
        b = cluster.connect(name="b")
        sa = a.slice(1, hosts=["host0"])
        sb = b.slice(2, hosts=["host1", "host2"])
        xa = sa.put(np.zeros(4, np.float32))
        xb = sb.put(np.zeros(4, np.float32), plexus.split(0))
        nap_a = sa.program("device_sleep", xa, micros=1)
        nap_b = sb.program("device_sleep", xb, micros=10_000)
        _calls_per_second(nap_b, xb, 5)  # warm: programs loaded
        before = _calls_per_second(nap_b, xb, 30)

        pid = _worker_pid(cluster, "host0")
        os.kill(pid, signal.SIGSTOP)
        stop = threading.Event()
        try:
            # Client A floods its stopped worker from a thread of its own:
            # its window fills, up to its quota of calls (4096) waits at
            # the server, the server stops reading A's stream, and A's own
            # queue fills until the thread itself waits for room (before
            # admission, one full queue blocked every client's batches).
            # How many calls get issued before that depends on how A's
            # sender batched them; what the test needs is A's quota full
            # at the server. (It waited for all 100,000 to be issued, which
            # under ASan's slower sender did not fit: a hang of the test,
            # not of the runtime.)
            def flood():
                for _ in range(100_000):
                    if stop.is_set():
                        return
                    nap_a(xa)

            t = threading.Thread(target=flood, daemon=True)
            t.start()
            cluster.wait_until(
                lambda st: any(c["name"] == "a" and
                               int(c.get("calls_pending", 0)) >= 4096
                               for c in st["clients"]),
                timeout=300, what="client a's quota of calls to queue at "
                "the server")
            rate = []
            m = threading.Thread(
                target=lambda: rate.append(_calls_per_second(nap_b, xb, 30)),
                daemon=True)
            m.start()
            m.join(60)
            assert rate, "client b's calls stalled behind host0's queue"
            during = rate[0]
            # What this guards against stalls b outright (one full queue
            # blocked every client's batches: caught above) or for the
            # flood's length (a rate near 0). Half the rate before bounds
            # that, not the machine's load: at 0.9 it failed (0.70) on the
            # 2-core VM while other pytest processes ran beside it.
            assert during >= 0.5 * before, (
                f"client b ran {during:.1f} calls/s while host0 was stopped, "
                f"{before:.1f} before")
        finally:
            stop.set()
            os.kill(pid, signal.SIGCONT)
        # A's flood stops once its waiting call goes (host0 runs again).
        t.join(300)
        assert not t.is_alive(), "client a's flood did not end after SIGCONT"
        # A's calls run once host0 resumes; the cluster goes down with them.


def test_status_accounts_each_clients_calls_and_device_time(cluster):
    client = cluster.connect(name="accounted")
    s = client.slice(2, placement="spread")
    x = s.put(np.zeros(4, np.float32), plexus.split(0))
    nap = s.program("device_sleep", x, micros=2000)
    for y in [nap(x) for _ in range(20)]:
        y.block_until_ready()
    # The outputs are ready a moment before the workers count the call
    # (its last task ends after it fulfils them): wait for the counts.

    def mine(st):
        return [c for c in st["clients"] if c["name"] == "accounted"][0]

    def usage(st):
        cid = int(mine(st)["client_id"])
        return [u for w in st["workers"] for u in w["stats"].get("clients", [])
                if int(u["client_id"]) == cid]

    st = cluster.wait_until(
        lambda st: int(mine(st).get("calls_admitted", 0)) >= 20 and
        int(mine(st).get("calls_in_flight", 0)) == 0 and
        len(usage(st)) == 2 and all(int(u["calls"]) >= 20 for u in usage(st)),
        what="the workers and server to account the calls")
    me = mine(st)
    assert float(me["weight"]) == 1.0
    # Each call held two devices (one per host) for >= 2 ms.
    assert int(me["device_micros"]) >= 20 * 2 * 2000
    assert sum(int(u["busy_micros"]) for u in usage(st)) >= 20 * 2 * 2000
    client.close()


WARM_UP = 20


def test_weights_set_the_order_in_which_backlogged_clients_are_served():
    # Two clients keep the cluster backlogged; the operator gave tenant
    # "heavy" three times the weight of "light". When heavy's 300 calls have
    # been admitted, light has had about a third as many (admission's fair
    # order; the window adds a few). A third client's long call holds the
    # device while both queue all their calls, so both are backlogged
    # however slowly this process issues them (it shares the GIL and, on a
    # loaded machine, the cores with the cluster).
    tenants = {"tenants": {"heavy": {"weight": 3}, "light": {"weight": 1}}}
    with plexus.local(hosts=1, tenants=tenants) as cluster:
        heavy = cluster.connect(name="heavy", tenant="heavy")
        light = cluster.connect(name="light", tenant="light")
        holder = cluster.connect(name="holder")
        programs = []
        for c in (heavy, light, holder):
            s = c.slice(1)
            x = s.put(np.zeros(4, np.float32))
            nap = s.program("device_sleep", x, micros=300)
            # Programs loaded and costs learned: each client's estimate of
            # a call (a moving average) from enough calls that both agree,
            # as admission orders by estimated device time per weight.
            plexus.wait([nap(x) for _ in range(WARM_UP)])
            programs.append((nap, x, s))
        hold_s = programs[2][2]
        hold_x = programs[2][1]
        held = hold_s.program("device_sleep", hold_x, micros=3_000_000)(hold_x)
        # Running: admitted, its 3 s on the device begun.
        cluster.wait_until(lambda st: any(
            c["name"] == "holder" and int(c.get("calls_in_flight", 0)) >= 1
            for c in st["clients"]), timeout=30, what="the holder's call")
        since = _core.trace_now(cluster.address)
        outs = {"heavy": [], "light": []}
        go = threading.Barrier(2)

        def issue(name, nap, x):
            go.wait()
            outs[name] = [nap(x) for _ in range(300)]

        threads = [threading.Thread(target=issue, args=(n, p[0], p[1]))
                   for n, p in zip(("heavy", "light"), programs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # The calls reach the server in batches after the threads return:
        # both clients' queues there fill while the holder's call runs.

        def backlogged(st):
            c = {c["name"]: c for c in st["clients"]}
            return (int(c["holder"].get("calls_in_flight", 0)) >= 1 and
                    min(int(c[n].get("calls_pending", 0))
                        for n in ("heavy", "light")) >= 250)

        queued = cluster.wait_until(
            backlogged, timeout=30,
            what="both clients' calls queued while the holder's call runs "
                 "(if it ended first, this machine is too slow for the "
                 "test's premise)")
        waiting = {c["name"]: int(c.get("calls_pending", 0))
                   for c in queued["clients"]}
        plexus.wait(outs["heavy"] + outs["light"] + [held])
        st = cluster.status()
        tenant = {c["name"]: c["tenant"] for c in st["clients"]}
        assert tenant["heavy"] == "heavy" and tenant["light"] == "light", tenant
        # The order, from the server's own record of each admission (its
        # timeline): how many of light's calls went before heavy's last.
        # (A count read from `plexus status` after heavy's calls are done
        # would also hold the calls of light admitted since, alone: on a
        # loaded machine, up to 200 of them.)
        trace = json.loads(_core.trace(cluster.address, since, 10.0,
                                       cluster._secret))
        client_of = {heavy.id: "heavy", light.id: "light"}
        # (when admitted, whose, device time charged in µs)
        admitted = sorted(
            (e["ts"] + e["args"]["duration_us"],
             client_of.get(e["args"].get("client")),
             e["args"].get("charged_us", 0))
            for e in trace["traceEvents"]
            if e.get("cat") == "admission" and e["ph"] == "b")
        heavy_at = [(t, us) for t, n, us in admitted if n == "heavy"]
        assert len(heavy_at) == 300, len(heavy_at)
        last = heavy_at[-1][0]
        light_at = [us for t, n, us in admitted if n == "light" and t <= last]
        assert all(us > 0 for _, us in heavy_at) and all(light_at), \
            "every call's admission names the device time it was charged"
        # Admission's fair order is one of device time, charged per call
        # as its client's estimate of the program (a moving average of
        # the reported device time of its calls): by heavy's last call,
        # light was charged a third of what heavy was. The order is not
        # one of calls: on a loaded machine a 300 µs sleep now and then
        # takes tens of ms, its client's estimate rises for its next
        # calls, and it is charged for that time: one such call of light's
        # cost it ~280 of its 300 calls' turns on one CI run.
        heavy_us = sum(us for _, us in heavy_at)
        light_us = sum(light_at)
        # The slack: the calls admitted into the window beside the holder's
        # and each client's own window of 5 ms admitted ahead of running;
        # and light's call that crossed heavy's last (its whole charge).
        slack = 15_000 + max(light_at)
        expected = heavy_us / 3
        detail = dict(heavy_calls=300, heavy_us=heavy_us,
                      light_calls=len(light_at), light_us=light_us,
                      largest_light_us=max(light_at), waiting=waiting)
        assert expected > 2 * 15_000, detail  # the premise: a long backlog
        assert abs(light_us - expected) <= slack, detail
        print("light's calls admitted before heavy's last:", detail)


def test_a_put_does_not_wait_behind_its_clients_calls_queued_for_a_stalled_host():
    # A client's calls pile up at the server for a stopped host; its put to
    # another host still lands at once: a put's Declare goes to its workers
    # ahead of the calls still waiting (before, its bytes waited at the
    # worker for that Declare and failed after 30 s).
    with plexus.local(hosts=2, heartbeat_timeout_ms=120_000) as cluster:
        client = cluster.connect(name="a")
        stalled = client.slice(1, hosts=["host0"])
        other = client.slice(1, hosts=["host1"])
        x = stalled.put(np.zeros(4, np.float32))
        # 1 ms a call: admission's window (5 ms of estimated device time per
        # client and device) lets a few of the 200 calls go to the stopped
        # host and keeps the rest waiting at the server. (With 1 µs calls,
        # estimated at 2-4 µs from the one call below, all of 2000 fitted
        # in the window now and then: none waited, and the wait below
        # timed out on a loaded machine.)
        nap = stalled.program("device_sleep", x, micros=1000)
        nap(x).block_until_ready()
        pid = _worker_pid(cluster, "host0")
        os.kill(pid, signal.SIGSTOP)
        try:
            outs = [nap(x) for _ in range(200)]
            cluster.wait_until(
                lambda st: any(c["name"] == "a" and
                               int(c.get("calls_pending", 0)) > 0
                               for c in st["clients"]),
                timeout=60, what="client a's calls to wait at the server")
            result = []
            t = threading.Thread(target=lambda: result.append(
                np.asarray(other.put(np.arange(8, dtype=np.float32)))),
                daemon=True)
            t.start()
            t.join(20)
            assert result, "the put waited behind calls queued for host0"
            np.testing.assert_array_equal(result[0], np.arange(8))
        finally:
            os.kill(pid, signal.SIGCONT)
        plexus.wait(outs)


def test_a_put_the_server_refuses_ends_at_once_not_at_the_workers_timeout():
    # The client pushes a put's shards to the workers as it declares it;
    # a refused declaration (here: over the tenant's max_bytes) never
    # reaches them, so each push waited there for 10 minutes. The server
    # now fails the buffer on the workers with the refusal.
    with plexus.local(hosts=2,
                      tenants={"default": {"max_bytes": 1024}}) as cluster:
        client = cluster.connect()
        s = client.slice(2)
        outcome = []

        def put():
            try:
                outcome.append(s.put(np.zeros(4096, np.float32),
                                     plexus.split(0)))
            except plexus.PlexusError as e:
                outcome.append(e)

        t = threading.Thread(target=put, daemon=True)
        t.start()
        t.join(120)  # far under the 10 minutes a push waited
        assert not t.is_alive(), "the put still waits for its refused shards"
        (e,) = outcome
        assert isinstance(e, plexus.ResourceExhaustedError), e
        assert "over its quota of 1024 (max_bytes)" in str(e), e
        # The client and the workers go on: a put within the quota lands.
        np.testing.assert_array_equal(
            s.put(np.arange(8, dtype=np.float32), plexus.split(0)).result(),
            np.arange(8, dtype=np.float32))
