"""The timeline (docs/observability.md, "The timeline"): every process
records what it did in a bounded ring; `plexus trace` and `client.trace()`
collect the rings through the server and write a Chrome trace-event file
(Perfetto, TensorBoard). Checked against the server's own records, and
with a skewed clock in every process, which the server's offset estimates
(from heartbeat round trips) must undo to within 1 ms."""
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import plexus
from conftest import PLEXUS_PYTHONPATH

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from mlp_common import init_params, make_dataset  # noqa: E402
from mlp_pipeline import PipelineMLP  # noqa: E402

MS = 1000.0  # trace timestamps are microseconds


def check_valid(trace):
    """The structure Perfetto's and TensorBoard's JSON importers read:
    every event has a phase and a process, complete events a start and a
    duration, async begins their end, flow ends their start."""
    events = trace["traceEvents"]
    assert events, "an empty trace"
    begins, ends, starts, finishes = Counter(), Counter(), {}, {}
    for e in events:
        assert e["ph"] in "XbesfM" and isinstance(e["pid"], int), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float), e
        elif e["ph"] == "b":
            begins[(e["cat"], e["id"])] += 1
        elif e["ph"] == "e":
            ends[(e["cat"], e["id"])] += 1
        elif e["ph"] == "s":
            starts[e["id"]] = e
        elif e["ph"] == "f":
            assert e["bp"] == "e", e
            finishes[e["id"]] = e
    assert begins == ends
    assert set(starts) == set(finishes)
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    return names


def complete(trace, cat):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == cat]


def async_slices(trace, cat):
    """The async slices of category `cat`: (name, args, begin, end), in
    microseconds."""
    out, open_ = [], {}
    for e in trace["traceEvents"]:
        if e.get("cat") != cat:
            continue
        if e["ph"] == "b":
            open_[e["id"]] = e
        elif e["ph"] == "e":
            b = open_.pop(e["id"])
            out.append((b["name"], b["args"], b["ts"], e["ts"]))
    return out


def calls(trace):
    """The server's call slices."""
    return async_slices(trace, "call")


def wait_until_idle(cluster):
    """Every call the workers ran is reported done at the server."""
    return cluster.wait_until(
        lambda st: all(int(c.get("calls_in_flight", 0)) == 0 and
                       int(c.get("calls_pending", 0)) == 0
                       for c in st.get("clients", [])),
        what="every call reported done")


def test_plexus_trace_of_the_pipeline_example_matches_the_servers_records(
        tmp_path):
    with plexus.local(hosts=2, devices_per_host=1) as cluster:
        client = cluster.connect(name="pipeline")
        stage1 = client.slice(1, placement="one_host")
        stage2 = client.slice(1, placement="one_host")
        model = PipelineMLP(client, stage1, stage2, lr=0.5, microbatches=4)
        params = model.put_params(init_params(0))
        x, labels = make_dataset(64)
        xs, ys = model.put_batch(x, labels)
        for _ in range(3):
            loss, _, params = model.graph_step(params, xs, ys)
            assert np.isfinite(np.asarray(loss))
        st = wait_until_idle(cluster)
        out = tmp_path / "job.json"
        # The operator's credential: every client's calls.
        env = dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH,
                   PLEXUS_CLUSTER_SECRET=cluster._secret)
        proc = subprocess.run(
            [sys.executable, "-m", "plexus.cli", "trace", "--address",
             cluster.address, "--last", "--seconds", "600", "-o", str(out)],
            env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "ui.perfetto.dev" in proc.stdout
        client.close()

    trace = json.loads(out.read_text())
    names = check_valid(trace)
    summary = trace["plexus"]
    assert summary["missing"] == []
    procs = summary["processes"]
    assert [p["name"] for p in procs][0] == "server"
    assert sorted(p["host"] for p in procs[1:]) == ["host0", "host1"]
    assert all(p["dropped"] == 0 for p in procs), procs
    # One track per host (process) and device (thread).
    assert {names[(p["pid"], None)] for p in procs} == {p["name"] for p in procs}
    for p in procs[1:]:
        assert names[(p["pid"], 100)] == "device 0"

    # One call event per call the server routed; one task per shard (each
    # slice has one device); one transfer per transfer routed, each with a
    # flow to the task that reads it.
    routed = int(st["calls_routed"])
    transfers = int(st["transfers_routed"])
    assert routed > 100 and transfers > 10
    got = calls(trace)
    assert len(got) == routed
    assert len(complete(trace, "task")) == routed
    moved = complete(trace, "transfer")
    assert len(moved) == transfers
    assert summary["flows"] == transfers
    assert {e["args"]["path"] for e in moved} == {"shared memory"}
    # Each call named by its program and the source lines that issued it.
    # (The first line outside plexus is the examples' kernel wrapper; the
    # line that called it is the step's.)
    assert all(" @ mlp_pipeline.py:" in name and " > mlp_common.py:" in name
               for name, *_ in got), [n for n, *_ in got][:5]
    assert any(" in step > " in name for name, *_ in got)
    assert any(name.startswith("matmul @ ") for name, *_ in got)
    # The puts the workers served, on their client data-plane tracks.
    puts = [e for e in trace["traceEvents"]
            if e["ph"] == "b" and e["cat"] == "data plane"
            and e["name"].startswith("put")]
    assert len(puts) >= 4 + 4 + 4  # parameters, micro-batches, labels


def test_the_servers_offset_estimates_align_skewed_clocks(tmp_path,
                                                          monkeypatch):
    skew = {"server": 120.0, "host0": -350.0, "host1": 275.0}  # ms
    monkeypatch.setenv("PLEXUS_TEST_TIMELINE_SKEW_MS",
                       ",".join(f"{k}={v}" for k, v in skew.items()))
    with plexus.local(hosts=2, devices_per_host=1) as cluster:
        client = cluster.connect(name="skewed")
        a = client.slice(1, placement="one_host")
        b = client.slice(1, placement="one_host")
        assert a.devices[0]["host"] != b.devices[0]["host"]
        # Heartbeat round trips until every worker's estimate is good to
        # 1 ms: the bound is half the quickest round trip seen, which on a
        # loaded machine takes more rounds to come (the test waits for
        # that event, bounded in rounds, not for a time).
        for _ in range(200):
            cluster.status(fresh=True)
            with client.trace(str(tmp_path / "probe.json")) as probe:
                pass
            bounds = [p["offset_error_ns"] for p in probe["processes"]
                      if p["worker_id"] != 0]
            # (Every worker's: -1 is no estimate yet.)
            if len(bounds) == 2 and 0 <= min(bounds) and \
                    max(bounds) < 1_000_000:
                break
        else:
            pytest.fail(f"no estimate within 1 ms after 200 rounds: {probe}")
        spec = plexus.Spec((64, 64), np.float32)
        double = b.program("add", spec, spec)
        halve = a.program("scale", spec, factor=0.5)
        x = a.put(np.ones((64, 64), np.float32))
        with client.trace(str(tmp_path / "skewed.json")) as summary:
            for _ in range(20):  # a chain back and forth between hosts
                x = halve(double(x, x))
            np.testing.assert_allclose(np.asarray(x), 1.0)
            wait_until_idle(cluster)
        client.close()

    trace = json.loads((tmp_path / "skewed.json").read_text())
    check_valid(trace)
    by_host = {p["host"]: p for p in summary["processes"]
               if p["worker_id"] != 0}
    # Each estimate is within the bound it reports (half the least round
    # trip's time in flight), and so within 1 ms of the skew (hundreds of
    # milliseconds).
    for host in ("host0", "host1"):
        p = by_host[host]
        expected_ms = skew["server"] - skew[host]
        assert 0 <= p["offset_error_ns"] < 1_000_000, repr(p)
        error_ms = abs(p["offset_ns"] / 1e6 - expected_ms)
        assert error_ms <= p["offset_error_ns"] / 1e6 + 0.001, (host, repr(p))
        assert error_ms < 1.0, (host, repr(p))
    # Aligned, each call's tasks lie within the call at the server (routed
    # to reported done), and each transfer starts before the task that
    # reads it ends, to within what the alignment may be off by: each
    # host's reported bound, and a transfer and its reader are on two
    # hosts (a flat 1 ms failed once by 47 us under a loaded suite).
    tol = max(MS, sum(by_host[h]["offset_error_ns"] for h in by_host) / 1e3
              + 0.1 * MS)
    got = calls(trace)
    assert len(got) == 40
    span = {args["call"]: (b, e) for _, args, b, e in got}
    tasks = complete(trace, "task")
    assert len(tasks) == 40
    for t in tasks:
        b, e = span[t["args"]["call"]]
        assert b - tol <= t["ts"] and t["ts"] + t["dur"] <= e + tol, (t, b, e)
    events = trace["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(finishes) == 40  # one hop per call
    for f in finishes:
        assert starts[f["id"]]["ts"] <= f["ts"] + tol


def test_a_trace_needs_a_credential_and_a_client_reads_its_own_calls(
        tmp_path):
    with plexus.local(hosts=1) as cluster:
        mine = cluster.connect(name="mine")
        theirs = cluster.connect(name="theirs")
        spec = plexus.Spec((4,), np.float32)
        for client, name in ((mine, "my_step"), (theirs, "their_step")):
            s = client.slice(1)
            f = s.program("scale", spec, factor=2.0, name=name)
            np.asarray(f(s.put(np.ones(4, np.float32))))
        wait_until_idle(cluster)
        # Without the operator's credential, the CLI is refused, saying why.
        env = {k: v for k, v in os.environ.items()
               if k != "PLEXUS_CLUSTER_SECRET"}
        proc = subprocess.run(
            [sys.executable, "-m", "plexus.cli", "trace", "--address",
             cluster.address, "--last", "--seconds", "60", "-o",
             str(tmp_path / "no.json")],
            env=dict(env, PYTHONPATH=PLEXUS_PYTHONPATH,
                     HOME=str(tmp_path)),
            capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        assert "PLEXUS_CLUSTER_SECRET" in proc.stderr, proc.stderr
        # A wrong secret is refused by the server.
        from plexus import _core
        with pytest.raises(plexus.PermissionDeniedError,
                           match="operator's credential"):
            _core.trace(cluster.address, 0, 10.0,
                        _core.new_cluster_secret())
        # A client's trace holds its own calls only.
        path = tmp_path / "mine.json"
        with mine.trace(str(path)):
            s = mine.slice(1)
            f = s.program("scale", spec, factor=3.0, name="my_step")
            np.asarray(f(s.put(np.ones(4, np.float32))))
            wait_until_idle(cluster)
        text = path.read_text()
        assert "my_step" in text and "their_step" not in text
        # The operator's holds both.
        everyone = json.dumps(json.loads(_core.trace(
            cluster.address, 0, 10.0, cluster._secret)))
        assert "my_step" in everyone and "their_step" in everyone
        mine.close()
        theirs.close()


def issued(trace):
    """The client's own call slices (its ring)."""
    return async_slices(trace, "call issued")


def client_requests(trace):
    return Counter(e["name"] for e in trace["traceEvents"]
                   if e["ph"] == "b" and e["cat"] == "client")


def test_a_clients_trace_adds_its_own_ring_and_names_each_graph(
        tmp_path, monkeypatch):
    # The client's clock 400 ms behind the server's: its ring is aligned
    # by the offset its trace measured from its own round trips.
    monkeypatch.setenv("PLEXUS_TEST_TIMELINE_SKEW_MS", "client=-400")
    path = tmp_path / "client.json"
    with plexus.local(hosts=1) as cluster:
        client = cluster.connect(name="trainer")
        s = client.slice(1)
        spec = plexus.Spec((64,), np.float32)
        scale = s.program("scale", spec, factor=2.0)
        x = s.put(np.ones(64, np.float32))
        x.block_until_ready()
        with client.trace(str(path)) as summary:
            puts = [s.put(np.full(64, i, np.float32)) for i in range(3)]
            with client.graph():
                y = x
                for _ in range(5):
                    y = scale(y)
            with client.graph():
                z = x
                for _ in range(4):
                    z = scale(z)
            w = scale(x)  # in no graph
            plexus.block_until_ready(puts)  # one wait on many
            for f in (y, z, w):
                np.asarray(f)  # a fetch each
            wait_until_idle(cluster)
        client.close()

    trace = json.loads(path.read_text())
    names = check_valid(trace)
    procs = summary["processes"]
    mine = [p for p in procs if p["client_id"] != 0]
    assert len(mine) == 1, procs
    me = mine[0]
    assert me["name"].startswith("client trainer (")
    assert names[(me["pid"], None)] == me["name"]
    # The server's calls and the client's, one each per call, with the
    # same graph ids: two graphs of 5 and 4 calls, and a call in none.
    routed = calls(trace)
    sent = issued(trace)
    assert len(routed) == len(sent) == 10
    by_graph = Counter(args.get("graph") for _, args, _, _ in routed)
    assert sorted(by_graph.values()) == [1, 4, 5] and by_graph[None] == 1
    assert Counter(args.get("graph") for _, args, _, _ in sent) == by_graph
    assert {a["call"] for _, a, _, _ in sent} == \
        {a["call"] for _, a, _, _ in routed}
    # Its puts, fetches and waits, one event each.
    assert client_requests(trace) == {"put": 3, "fetch": 3, "wait": 1}
    # The offset undoes the skew to within the bound it states (half the
    # quickest round trip), and so each call was issued before the server
    # routed it, to within that bound.
    bound_ms = me["offset_error_ns"] / 1e6
    assert me["offset_error_ns"] >= 0
    assert abs(me["offset_ns"] / 1e6 - 400.0) <= bound_ms + 0.001, me
    routed_at = {a["call"]: b for _, a, b, _ in routed}
    for _, a, b, _ in sent:
        assert b <= routed_at[a["call"]] + bound_ms * MS + 1, (a, b)


def test_values_read_within_a_worker_are_transfers_with_their_path(tmp_path):
    pytest.importorskip("jax")
    path = tmp_path / "reads.json"
    with plexus.local(hosts=1, devices_per_host=2) as cluster:
        client = cluster.connect(name="reads")
        first = client.slice(1)
        second = client.slice(1)
        assert first.devices[0]["device"] != second.devices[0]["device"]
        step = plexus.jit(lambda a: a + 1.0, first)
        there = plexus.jit(lambda a: a * 2.0, second)
        y = step(np.ones((64, 64), np.float32))
        there(step(y)).block_until_ready()  # compiled
        wait_until_idle(cluster)
        with client.trace(str(path)) as summary:
            for _ in range(5):
                y = step(y)  # XLA's output read in place: alias
            out = there(y)  # from device 0 to device 1: device-to-device
            np.testing.assert_allclose(np.asarray(out), 2.0 * 7.0)
            wait_until_idle(cluster)
        st = cluster.status(fresh=True)
        client.close()

    # A worker whose ring did not come back in time (a loaded machine) is
    # named here, not read as a worker that moved nothing.
    assert summary["missing"] == [], summary["missing"]
    trace = json.loads(path.read_text())
    names = check_valid(trace)
    moved = complete(trace, "transfer")
    assert Counter(e["args"]["path"] for e in moved) == {
        "alias": 5, "device-to-device": 1}
    worker = st["workers"][0]
    # Counted against the worker's own counters (every read since start,
    # the trace's a part of them).
    assert int(worker["stats"]["transfers_alias"]) >= 5
    assert int(worker["stats"]["transfers_device_to_device"]) >= 1
    # And their bytes, one shard's each (plexus_transfer_bytes_total).
    moved_bytes = worker["stats"]["transfer_bytes"]
    assert int(moved_bytes["alias"]) >= 5 * 64 * 64 * 4, moved_bytes
    assert int(moved_bytes["device_to_device"]) >= 64 * 64 * 4, moved_bytes
    assert int(moved_bytes.get("tcp", 0)) == 0, moved_bytes
    for e in moved:
        assert e["args"]["bytes"] == 64 * 64 * 4
        assert names[(e["pid"], e["tid"])] == \
            f"device {e['args']['device']} reads"
    # Each with a flow to the task of the call that read it.
    assert trace["plexus"]["flows"] == 6


def test_a_built_in_all_reduces_partials_are_transfers_of_its_call(tmp_path):
    path = tmp_path / "all_reduce.json"
    with plexus.local(hosts=2, devices_per_host=1) as cluster:
        client = cluster.connect(name="sums")
        s = client.slice(2, placement="spread")
        x = s.put(np.arange(4, dtype=np.float32), plexus.P("devices"))
        partial = s.program("reduce_sum", x)(x)
        total = s.program("all_reduce",
                          plexus.Spec((), "float32", plexus.partial()))
        partial.block_until_ready()
        # Its call done at the server too: the trace holds the next only.
        idle = wait_until_idle(cluster)
        before = int(idle["transfers_routed"])
        sent = {w["worker_id"]: int(w.get("stats", {}).get("bytes_sent", 0))
                for w in idle["workers"]}
        with client.trace(str(path)):
            assert float(np.asarray(total(partial))) == 6.0
            wait_until_idle(cluster)
            # Each worker's push of its partial has ended (its transfer is
            # recorded as the push ends, which may be after the other's
            # task, and so the call, is done).
            cluster.wait_until(
                lambda st: all(
                    int(w.get("stats", {}).get("bytes_sent", 0)) >=
                    sent.get(w["worker_id"], 0) + 4 for w in st["workers"]),
                what="both partials pushed")
        st = cluster.status()
        client.close()

    trace = json.loads(path.read_text())
    check_valid(trace)
    # The server routed no transfer: each worker sent its partial to the
    # other itself, one transfer each, of the all_reduce's call, with a
    # flow to the other's task of that call.
    assert int(st["transfers_routed"]) == before
    (call,) = [args["call"] for _, args, _, _ in calls(trace)]
    moved = complete(trace, "transfer")
    assert len(moved) == 2
    assert {e["args"]["call"] for e in moved} == {call}
    assert {e["args"]["worker"] for e in moved} == \
        {e["args"]["peer_worker"] for e in moved}
    assert all(e["args"]["bytes"] == 4 for e in moved)
    assert trace["plexus"]["flows"] == 2


def trace_cli(cluster, *args, **popen):
    """`plexus trace ARGS` with the operator's credential, as a process."""
    env = dict(os.environ, PYTHONPATH=PLEXUS_PYTHONPATH,
               PLEXUS_CLUSTER_SECRET=cluster._secret)
    return subprocess.Popen(
        [sys.executable, "-m", "plexus.cli", "trace", "--address",
         cluster.address, *args], env=env, text=True, **popen)


def test_a_forward_trace_holds_admission_waits_a_recovery_a_compile_and_tcp(
        tmp_path):
    """`plexus trace --seconds N` records from when it says so until N
    seconds pass or it is interrupted: here a job whose tenant may have one
    call in flight (the second waits at admission), a plexus.jit program
    compiled on host0, a value sent from host0 to host1 over TCP, and
    host1 killed (its slice remapped onto the spare, its work recomputed)."""
    pytest.importorskip("jax")
    out, idle = tmp_path / "forward.json", tmp_path / "idle.json"
    tenants = {"tenants": {"capped": {"weight": 1, "max_calls_in_flight": 1}}}
    with plexus.local(hosts=2, spare=1, shared_memory=False,
                      tenants=tenants) as cluster:
        client = cluster.connect(name="covered", tenant="capped",
                                 shared_memory=False)
        a = client.slice(1, hosts=["host0"])
        b = client.slice(1, hosts=["host1"])
        x = a.put(np.arange(4, dtype=np.float32))
        before = a.program("scale", x, factor=1.0, name="before")(x)
        before.block_until_ready()
        wait_until_idle(cluster)
        # Run out: the calls before it are not in it.
        proc = trace_cli(cluster, "--seconds", "0.2", "-o", str(idle),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout + stderr
        assert "recording the next 0.2 s" in stderr, stderr
        # Interrupted once the job below is done.
        proc = trace_cli(cluster, "--seconds", "600", "-o", str(out),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert "recording the next 600 s" in proc.stderr.readline()
        step = plexus.jit(lambda v: v + 1.0, a)
        slow = a.program("device_sleep", x, micros=200_000, name="slow")
        waits = b.program("scale", x, factor=2.0, name="waits")
        y = waits(step(slow(x)))  # a compile; the last two wait at admission
        np.testing.assert_array_equal(np.asarray(y), 2.0 * np.arange(1, 5))
        victim = next(int(w["pid"]) for w in cluster.status()["workers"]
                      if w["host_name"] == "host1")
        os.kill(victim, signal.SIGKILL)
        cluster.wait_until(
            lambda st: int(st["recovery"].get("slices_remapped", 0)) == 1,
            timeout=60, what="host1's slice remapped onto the spare")
        # y lived on host1: recomputed on the spare.
        np.testing.assert_array_equal(np.asarray(y), 2.0 * np.arange(1, 5))
        wait_until_idle(cluster)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout + stderr
        client.close()

    check_valid(json.loads(idle.read_text()))
    assert not calls(json.loads(idle.read_text()))
    trace = json.loads(out.read_text())
    check_valid(trace)
    programs = Counter(name.split(" @ ")[0] for name, *_ in calls(trace))
    assert programs["before"] == 0 and programs["slow"] == 1, programs
    admission = [name for name, *_ in async_slices(trace, "admission")]
    assert any("waits" in n for n in admission), admission
    recovery = [name for name, *_ in async_slices(trace, "recovery")]
    assert "recovery: host lost, its slices remapped onto a spare" in \
        recovery, recovery
    compiles = [name for name, *_ in async_slices(trace, "compile")]
    assert any(n.startswith("compile ") for n in compiles), compiles
    tcp = [e for e in complete(trace, "transfer")
           if e["args"]["path"] == "tcp"]
    assert tcp and all(e["args"]["bytes"] == 16 for e in tcp), tcp
