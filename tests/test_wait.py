"""plexus.wait and plexus.block_until_ready: many futures waited for at
once, in one round trip per worker rather than one per shard (the client
sends every worker all its shards' waits before it reads an answer); a
timeout says how many were not ready; a failed future raises its error."""
import re
import time

import numpy as np
import pytest

import plexus


def test_block_until_ready_takes_a_pytree_and_returns_it(client):
    s = client.slice(4, placement="spread")
    x = s.put(np.arange(8, dtype=np.float32), plexus.split(0))
    scale = s.program("scale", x, factor=2.0)
    tree = {"a": [scale(x), scale(x)], "b": (scale(x), 7), "c": None}
    assert plexus.block_until_ready(tree) is tree
    np.testing.assert_array_equal(np.asarray(tree["b"][0]),
                                  2 * np.arange(8))
    assert plexus.wait([]) == []
    assert x.block_until_ready() is x


def test_a_timeout_says_how_many_were_not_ready(client):
    s = client.slice(2, placement="spread")
    x = s.put(np.ones(4, np.float32), plexus.split(0))
    slow = s.program("device_sleep", x, micros=2_000_000)
    fast = s.program("scale", x, factor=3.0)
    ready = fast(x).block_until_ready()
    late = [slow(x), slow(x)]  # the second queues behind the first
    start = time.monotonic()
    with pytest.raises(plexus.DeadlineExceededError,
                       match=r"wait: 2 of 3 futures not ready by the deadline"
                       ) as e:
        plexus.wait([ready] + late, timeout=0.2)
    # Each host that did not confirm its shards is named, with how many
    # (one shard of each late future per host: the slice spreads over two).
    assert re.search(r"not confirmed ready by host \S+ \(worker \d+\): "
                     r"2 shards; host \S+ \(worker \d+\): 2 shards\)",
                     str(e.value)), e.value
    took = time.monotonic() - start
    assert 0.2 <= took < 1.5, took
    # Connections the timeout left out of step were dropped: waiting again,
    # without a deadline, sees them through.
    plexus.wait(late)
    np.testing.assert_array_equal(np.asarray(late[1]), np.ones(4))


@pytest.mark.parametrize("values", [[1.0, np.nan], [np.nan, 1.0]])
def test_a_failed_future_raises_its_error(client, values):
    s = client.slice(2, placement="spread")
    bad = s.put(np.array(values, np.float32), plexus.split(0))
    check = s.program("assert_finite", bad)
    good = s.put(np.ones(2, np.float32))
    with pytest.raises(plexus.InvalidArgumentError, match="non-finite value"):
        plexus.wait([good, check(bad)], timeout=30)
    # The connections are in step again: the answers still due from the
    # other worker were not left for the next request to read.
    plexus.wait([good])
    again = s.put(np.arange(2, dtype=np.float32), plexus.split(0))
    np.testing.assert_array_equal(np.asarray(again), [0, 1])


def test_one_round_trip_per_worker_not_per_shard(client):
    s = client.slice(4, placement="spread")  # 2 workers x 2 devices
    futures = [s.put(np.full(4, i, np.float32)) for i in range(8)]
    # 8 replicated futures: 32 shards, 16 on each worker.
    trips = lambda: client.counters()["wait_round_trips"]  # noqa: E731
    before = trips()
    for f in futures:
        client._core.wait(f._f)  # a WAIT per shard, one after another
    assert trips() - before == 32
    before = trips()
    plexus.wait(futures, timeout=30)
    assert trips() - before == 2
    before = trips()
    plexus.block_until_ready({"all": futures})
    futures[0].block_until_ready()  # one future: one trip per worker too
    assert trips() - before == 2 + 2


def test_a_worker_killed_during_a_wait_ends_it_naming_the_worker(tmp_path):
    import os
    import signal
    # The SIGKILLed worker is reported again when the cluster goes down.
    with pytest.raises(plexus.ClusterExitError, match=r"host1 .*SIGKILL"), \
            plexus.local(hosts=2, devices_per_host=1, log_level="info",
                         log_file=str(tmp_path / "cluster.log")) as c:
        client = c.connect()
        s = client.slice(2, placement="spread")
        x = s.put(np.ones(2, np.float32), plexus.split(0))
        slow = s.program("device_sleep", x, micros=30_000_000)(x)
        fast = s.put(np.ones(2, np.float32))
        victim = next(v for v in c.status()["workers"]
                      if v["host_name"] == "host1")
        start = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        # No deadline: the worker's death is the way out.
        with pytest.raises(plexus.PlexusError, match="worker"):
            plexus.wait([fast, slow])
        assert time.monotonic() - start < 10
