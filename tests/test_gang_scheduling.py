"""Gang scheduling: the deadlock the central scheduler prevents.

Two clients each submit a graph of two all_reduce programs over the same two
hosts, in opposite orders (X then Y, and Y' then X'). A collective only
finishes when every island runs it, and each device runs its calls in the
order it receives them. With the gang scheduler, every island gets all calls
in one order and everything completes. With it bypassed (test-only switch:
islands order calls on their own, adversarially), the islands disagree, each
waits on a collective the other has not started, and the run hangs — which a
deadline detects.
"""
import threading

import numpy as np
import pytest

import plexus


def run_opposite_collectives(cluster, deadline_s):
    """Returns the four results, or None if they did not all arrive in time."""
    results = {}
    errors = []

    def client_run(name, first, second):
        try:
            c = cluster.connect(name=name)
            s1 = c.slice(2, placement="spread")
            s2 = c.slice(2, placement="spread")
            assert s1.num_hosts == 2 and s2.num_hosts == 2
            slices = {"a": s1, "b": s2}
            xs = {k: s.put(np.full(2, 1.0 + (k == "b"), np.float32),
                           plexus.P("devices")) for k, s in slices.items()}
            ar = {k: s.program("all_reduce", xs[k]) for k, s in slices.items()}
            with c.graph():
                outs = {k: ar[k](xs[k]) for k in (first, second)}
            for k, f in outs.items():
                results[(name, k)] = np.asarray(f)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client_run, args=("c1", "a", "b"), daemon=True),
               threading.Thread(target=client_run, args=("c2", "b", "a"), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline_s)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        return None
    return results


def test_gang_scheduler_runs_opposite_collectives_to_completion(tmp_path):
    with plexus.local(hosts=2, devices_per_host=1, scheduler="gang",
                      heartbeat_timeout_ms=20_000,
                      log_file=str(tmp_path / "log")) as cluster:
        results = run_opposite_collectives(cluster, deadline_s=30)
        assert results is not None, "collectives hung under the gang scheduler"
        for (client, k), value in results.items():
            # all_reduce of a split [1, 1] (a) or [2, 2] (b): replicated sum.
            np.testing.assert_array_equal(value, [2.0] if k == "a" else [4.0])
        st = cluster.status()
        assert st["scheduler"] == "gang/fair" and st["epoch"] > 0


def test_without_the_scheduler_opposite_collectives_deadlock(tmp_path):
    # A 20 s heartbeat timeout: the test is about the deadlock, and a
    # stall of the loaded machine (both workers once went silent for ~1 s)
    # must not have a host declared lost, whose values now fail their
    # futures at once, within the 5 s the clients are given.
    with plexus.local(hosts=2, devices_per_host=1, scheduler="none",
                      heartbeat_timeout_ms=20_000,
                      log_file=str(tmp_path / "log")) as cluster:
        assert cluster.status()["scheduler"] == "none (test only)"
        results = run_opposite_collectives(cluster, deadline_s=5)
        assert results is None, "expected a deadlock without the scheduler"
    # The cluster was torn down under the hung clients: nothing is left.
