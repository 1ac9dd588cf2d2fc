"""The single controller with 256 simulated hosts (bench/scale.py's
simulation, at a size CI runs in well under a minute): a real plexus-server,
one plexus-sim-workers process whose hosts register over real worker
sessions and report their calls done, and a client whose slice spans them
all. Every wait is bounded; nothing sleeps."""
import sys
import time
from pathlib import Path

import pytest

import plexus

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import SimRun, chain, slice_generation  # noqa: E402

HOSTS = 256
CALLS = 20
TIMEOUT = 40  # seconds, every wait


@pytest.fixture(scope="module", params=["frames", "grpc"])
def run(request, tmp_path_factory):
    # frames: each host's ops and calls done on a data-plane connection of
    # its own, as a real worker's; grpc: on its worker stream.
    with SimRun(HOSTS, spares=1, log_dir=tmp_path_factory.mktemp("scale"),
                timeout=TIMEOUT, ops_on_grpc=request.param == "grpc") as r:
        r.ops_on = request.param
        yield r


def test_256_simulated_hosts_register_run_calls_and_a_lost_one_is_named(run):
    st = run.status()
    alive = [w for w in st["workers"] if w["alive"]]
    assert len(alive) == HOSTS + 1
    assert {w["host_name"] for w in alive} == {f"sim{i}"
                                               for i in range(HOSTS + 1)}
    assert [w["host_name"] for w in alive if w.get("spare")] == [f"sim{HOSTS}"]

    client = run.connect()
    try:
        s = client.slice(HOSTS, placement="spread", timeout=TIMEOUT)
        assert s.num_hosts == HOSTS and s.num_devices == HOSTS
        fill = s.program("fill", shape=[HOSTS], split_axis=0, value=1.0)
        x = fill()
        prog = s.program("scale", x, factor=2.0)
        outs = []
        for _ in range(CALLS):
            x = prog(x)
            outs.append(x)
        # Every future of the 1 + CALLS calls resolves: each of the 256
        # hosts answered each wait on its shard.
        plexus.wait(outs, timeout=TIMEOUT)
        counters = run.sim_counters()
        assert counters["executes"] == (CALLS + 1) * HOSTS, counters
        assert counters["calls_reported"] == (CALLS + 1) * HOSTS, counters
        # Batched: fewer reports than calls reported.
        assert counters["reports"] < counters["calls_reported"], counters
        if run.ops_on == "frames":
            # Every call's ops came as OPS frames, every report went back
            # as a REPORTS frame.
            assert counters["ops_framed"] >= counters["executes"], counters
            assert counters["reports_framed"] == counters["reports"], counters
            # Each host's ops connection was handed, after its first
            # frame, to the process's one ops thread (as hosts on machines
            # of their own, the server's writes wake no thread per host).
            # The spare's opens with the server's first op for it, which
            # may not have come yet; a host's hand-over follows its first
            # frame's ops, so it may lag the calls they made by moments.
            def handed_over(c):
                return (c["ops_connections"] >= HOSTS and
                        c["ops_connections_polled"] == c["ops_connections"])
            deadline = time.monotonic() + TIMEOUT
            while not handed_over(counters) and time.monotonic() < deadline:
                counters = run.sim_counters()
            assert handed_over(counters), counters
        else:
            assert counters["ops_framed"] == 0, counters
            assert counters["reports_framed"] == 0, counters
            assert counters["ops_connections"] == 0, counters
            assert counters["ops_connections_polled"] == 0, counters
        me = next(c for c in run.status()["clients"]
                  if c["client_id"] == client.id)
        assert me["calls_admitted"] == CALLS + 1, me
        assert me.get("calls_in_flight", 0) == 0, me

        generation = slice_generation(run.status(), s.id)
        name, worker = run.drop_host()
        assert name == "sim0"
        st = run.wait_status(
            lambda st: any(w["worker_id"] == worker and not w["alive"]
                           for w in st["workers"]),
            f"worker {worker} declared down")
        down = next(w for w in st["workers"] if w["worker_id"] == worker)
        assert down["host_name"] == "sim0" and down["down_reason"], down
        assert st["recovery"]["hosts_lost"] == 1, st["recovery"]
        # The spare takes its place; the chain's values, whose shards on
        # sim0 were lost, are computed again on the new map, and the last
        # future resolves again; a new call over the slice runs too.
        st = run.wait_status(
            lambda st: slice_generation(st, s.id) > generation,
            "the slice remapped onto the spare")
        (sl,) = [sl for sl in st["slices"] if sl["slice_id"] == s.id]
        hosts = {d["host_name"] for d in sl["devices"]}
        assert f"sim{HOSTS}" in hosts and "sim0" not in hosts
        assert len(hosts) == HOSTS
        plexus.wait(outs[-1], timeout=TIMEOUT)
        assert run.status()["recovery"]["calls_recomputed"] > 0
        plexus.wait(chain(prog, fill(), 2), timeout=TIMEOUT)
    finally:
        client.close()
