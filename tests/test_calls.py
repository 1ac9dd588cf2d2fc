"""Programs, calls, futures and graphs on a real 2-host cluster."""
import threading
import time

import numpy as np
import pytest

import plexus


def test_calls_return_while_the_kernel_they_follow_still_runs(client):
    # A call returns once queued, not once the kernels before it ran: three
    # calls chained behind a 3 s kernel all return while it still runs (the
    # wait with no time left says it is not done). Asserted on that event,
    # not on how long a call took (it once asserted 50 ms per call, which
    # a loaded CI machine missed by 2 ms); how fast a call returns is
    # measured by bench/.
    s = client.slice(2)
    x = s.put(np.arange(4, dtype=np.float32), plexus.P("devices"))
    nap = s.program("device_sleep", x, micros=3_000_000)
    scale = s.program("scale", x, factor=2.0)
    scale(x).block_until_ready()  # loaded everywhere
    first = nap(x)
    y = first
    for _ in range(3):
        y = scale(y)
    with pytest.raises(plexus.DeadlineExceededError, match="not ready"):
        plexus.wait(first, timeout=0)
    np.testing.assert_array_equal(np.asarray(y),
                                  np.arange(4, dtype=np.float32) * 8)


def test_future_looks_like_a_jax_array(client):
    s = client.slice(4, placement="spread")
    x = s.put(np.ones((8, 3), np.float32), plexus.P("devices", None))
    assert x.shape == (8, 3)
    assert x.dtype == np.float32
    assert x.sharding == "split(0)"
    assert x.block_until_ready() is x
    np.testing.assert_array_equal(np.asarray(x), np.ones((8, 3), np.float32))


def test_put_keeps_scalars_scalars(client):
    s = client.slice(2)
    for value in (np.float32(2.5), np.array(2.5, np.float32)):
        f = s.put(value)
        assert f.shape == () and np.asarray(f) == np.float32(2.5)
    # Non-contiguous arrays are laid out row-major on the way.
    t = np.arange(12, dtype=np.float32).reshape(3, 4).T
    np.testing.assert_array_equal(np.asarray(s.put(t)), t)


def test_graph_of_1000_calls_over_two_hosts_matches_numpy(client):
    rng = np.random.default_rng(0)
    s = client.slice(4, placement="spread")
    assert s.num_hosts == 2
    a0 = rng.standard_normal((16, 8)).astype(np.float32)
    b0 = rng.standard_normal((16, 8)).astype(np.float32)
    c0 = rng.uniform(0.99, 1.01, (16, 8)).astype(np.float32)
    a, b, c = (s.put(v, plexus.P("devices", None)) for v in (a0, b0, c0))
    add = s.program("add", a, b)
    mul = s.program("mul", a, b)
    half = s.program("scale", a, factor=0.5)
    ea, eb = a0.copy(), b0.copy()
    with client.graph() as g:
        for i in range(1002):
            if i % 3 == 0:
                a = add(a, b)
                ea = ea + eb
            elif i % 3 == 1:
                a = half(a)
                ea = ea * np.float32(0.5)
            else:
                b = mul(b, c)
                eb = eb * c0
    assert g.calls == 1002
    np.testing.assert_allclose(np.asarray(a), ea, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(b), eb, rtol=1e-5)


def _within(seconds, fn):
    """fn()'s result, or an AssertionError if it has none within `seconds`
    (a wait that never ends would otherwise hang the suite)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - asserted by the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=seconds)
    assert not t.is_alive(), f"no answer within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_long_graph_runs_its_first_calls_while_it_is_recorded(client):
    # A graph sends a batch each 128 ops recorded: a value made early in a
    # long graph can be read before the graph's block ends (the whole graph
    # used to go at the end: the cluster sat idle while it was recorded,
    # and such a read waited forever).
    s = client.slice(1)
    x = s.put(np.ones(4, np.float32))
    double = s.program("scale", x, factor=2.0)
    same = s.program("scale", x, factor=1.0)
    with client.graph() as g:
        first = double(x)
        y = first
        for _ in range(149):
            y = same(y)
        early = _within(30, lambda: np.asarray(first))
        assert 0 < len(g) < 128  # ops recorded, not sent yet
    np.testing.assert_array_equal(early, np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 2.0, np.float32))


def test_a_graph_whose_block_raises_still_makes_its_calls(client):
    # Every call recorded is made, as outside a graph; the outputs of a
    # graph whose block raised used to wait forever for calls never sent.
    s = client.slice(1)
    x = s.put(np.ones(4, np.float32))
    double = s.program("scale", x, factor=2.0)
    with pytest.raises(KeyError):
        with client.graph():
            y = double(double(x))
            raise KeyError("the block's own error")
    np.testing.assert_array_equal(_within(30, lambda: np.asarray(y)),
                                  np.full(4, 4.0, np.float32))


def test_values_move_between_slices_on_different_hosts(client):
    a = client.slice(1, placement="one_host")
    b = client.slice(1, placement="one_host")
    assert a.devices[0]["host"] != b.devices[0]["host"]
    x = a.put(np.arange(6, dtype=np.int32).reshape(2, 3))
    ident = b.program("identity", plexus.Spec((2, 3), "int32"))
    np.testing.assert_array_equal(np.asarray(ident(x)),
                                  np.arange(6, dtype=np.int32).reshape(2, 3))


def test_resharding_from_four_devices_to_two(client):
    four = client.slice(4, placement="spread")
    two = client.slice(2, placement="spread")
    x0 = np.arange(24, dtype=np.float64).reshape(8, 3)
    x = four.put(x0, plexus.P("devices", None))
    double = two.program("scale", plexus.Spec((8, 3), "float64",
                                              plexus.P("devices", None)),
                         factor=2.0)
    np.testing.assert_array_equal(np.asarray(double(x)), 2 * x0)


def test_all_reduce_of_partial_sums_across_hosts(client):
    s = client.slice(4, placement="spread")
    x0 = np.arange(16, dtype=np.float32).reshape(8, 2)
    x = s.put(x0, plexus.P("devices", None))
    partial = s.program("reduce_sum", x, axis=0)(x)
    assert partial.sharding == "partial"
    total = s.program("all_reduce", partial)(partial)
    assert total.sharding == "replicated"
    np.testing.assert_array_equal(np.asarray(total), x0.sum(axis=0))


def test_two_python_threads_share_one_client(client):
    s = client.slice(2)
    x = s.put(np.zeros(2, np.float32), plexus.P("devices"))
    busy = s.program("busy_wait", x, micros=50_000)
    inc = s.program("scale", x, factor=1.0)
    errors = []

    def slow():
        try:
            busy(x).block_until_ready()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=slow)
    t.start()
    # The other thread blocks in the binding; this one must still run.
    for _ in range(50):
        np.asarray(inc(x))
    t.join(timeout=10)
    assert not t.is_alive() and not errors


def test_a_dropped_future_is_freed_with_no_other_op():
    """A release queued alone lingers for an op to go with
    (ClientOptions::release_linger) and then goes by itself: no flush, no
    other call, and its worker frees the value. (A cluster of its own: the
    module's counts the other tests' values too.)"""
    with plexus.local(hosts=1) as cluster:
        client = cluster.connect(name="lone-release")
        s = client.slice(1)
        x = s.put(np.ones(4, np.float32))
        f = s.program("scale", x, factor=2.0)
        y = f(x)
        np.testing.assert_array_equal(np.asarray(y),
                                      np.full(4, 2, np.float32))

        def live(st):
            return st["workers"][0]["stats"].get("live_buffers", 0)

        cluster.wait_until(lambda st: live(st) == 2,
                           what="x and y live on the worker")
        sent = client.counters()["messages_sent"]
        del y
        cluster.wait_until(lambda st: live(st) == 1,
                           what="y freed with no other op after it")
        assert client.counters()["messages_sent"] > sent
        client.close()


def test_dropping_futures_frees_every_shard(cluster):
    client = cluster.connect(name="dropper")
    s = client.slice(4, placement="spread")
    x = s.put(np.ones((8, 8), np.float32), plexus.P("devices", None))
    f = s.program("scale", x, factor=2.0)
    ys = [f(x) for _ in range(20)]
    ys[-1].block_until_ready()
    cluster.wait_until(lambda st: sum(w["stats"].get("live_buffers", 0)
                                      for w in st["workers"]) > 0,
                       what="workers to report live buffers")
    del x, ys
    client.flush()
    cluster.wait_until(lambda st: all(w["stats"].get("live_buffers", 0) == 0
                                      for w in st["workers"]),
                       what="every worker to report zero live buffers")
    client.close()


def test_data_dependent_control_flow(client):
    """The client reads a value, then decides what to call next."""
    s = client.slice(2, placement="spread")
    x = s.put(np.array([1.0, 3.0], np.float32), plexus.P("devices"))
    double = s.program("scale", x, factor=2.0)
    halve = s.program("scale", x, factor=0.5)
    total = s.program("reduce_sum", x)
    steps = []
    for _ in range(12):
        t = float(np.asarray(total(x)))  # a partial sum, summed on fetch
        if t < 50:
            x = double(x)
            steps.append("double")
        else:
            x = halve(x)
            steps.append("halve")
    expect, v = [], np.array([1.0, 3.0])
    for _ in range(12):
        if v.sum() < 50:
            v, step = v * 2, "double"
        else:
            v, step = v / 2, "halve"
        expect.append(step)
    assert steps == expect
    np.testing.assert_array_equal(np.asarray(x), v.astype(np.float32))


def test_scale_repeat_is_the_fused_chain(client):
    s = client.slice(1)
    x = s.put(np.array([1.0, -2.0], np.float64))
    chained = s.program("scale", x, factor=1.5)
    fused = s.program("scale", x, factor=1.5, repeat=4)
    y = x
    for _ in range(4):
        y = chained(y)
    np.testing.assert_array_equal(np.asarray(fused(x)), np.asarray(y))
    with pytest.raises(plexus.InvalidArgumentError, match="'repeat' must be at least 1"):
        s.program("scale", x, factor=1.5, repeat=0)


def test_device_busy_time_counts_kernel_time(cluster, client):
    s = client.slice(1, placement="one_host")
    dev = s.devices[0]

    def busy_micros(st):
        for w in st["workers"]:
            if w["worker_id"] == dev["worker"]:
                return w["stats"].get("device_busy_micros", [0] * 8)[dev["device"]]

    before = busy_micros(cluster.status(fresh=True))
    x = s.put(np.zeros(4, np.float32))
    nap = s.program("device_sleep", x, micros=50_000)
    y = x
    for _ in range(4):
        y = nap(y)
    y.block_until_ready()
    cluster.wait_until(lambda st: busy_micros(st) - before >= 200_000,
                       what="the device's busy time to grow by the 200 ms it ran")


def test_ring_all_reduce_over_four_hosts(tmp_path):
    # Three workers or more and at least 256 KiB: the runtime's ring
    # (reduce-scatter + all-gather) rather than every partial to everyone.
    with plexus.local(hosts=4, devices_per_host=1,
                      log_file=str(tmp_path / "cluster.log")) as c:
        client = c.connect()
        s = client.slice(4, placement="spread")
        assert len({d["worker"] for d in s.devices}) == 4
        n = 300_001  # 1.2 MB of float32, chunks of uneven length
        rng = np.random.default_rng(3)
        parts = rng.integers(-1000, 1000, size=(4, n)).astype(np.float32)
        x = s.put(parts.reshape(-1), plexus.split(0))
        # Each device's shard as an addend of one [n] vector.
        partial = plexus.jit(lambda v: v, s, in_shardings=plexus.split(0),
                             out_shardings=plexus.partial())
        total = s.program("all_reduce", plexus.Spec((n,), "float32",
                                                    plexus.partial()))
        before = c.status(fresh=True)
        got = np.asarray(total(partial(x)))
        np.testing.assert_array_equal(got, parts.sum(0))
        after = c.status(fresh=True)
        sent = [a["stats"]["bytes_sent"] - b["stats"]["bytes_sent"]
                for a, b in zip(after["workers"], before["workers"])]
        # A ring moves 2 (P-1)/P of the value per worker (1.5x here); every
        # partial to every other worker would be 3x.
        assert all(1.49 * n * 4 < b < 1.51 * n * 4 for b in sent), sent


def test_all_reduce_offers_between_real_workers_choose_the_host_path(
        tmp_path, monkeypatch):
    # Workers that say they run NCCL trade offers over the data plane before
    # every all_reduce (rank 0's with an NCCL unique id). Without a GPU the
    # offers say no value is on one, so every rank takes the host path: the
    # sum is exact on both host algorithms, nothing counts as NCCL, and the
    # offers leave no entry behind.
    monkeypatch.setenv("PLEXUS_NCCL_OFFERS_WITHOUT_GPU", "1")
    with plexus.local(hosts=3, devices_per_host=1,
                      log_file=str(tmp_path / "cluster.log")) as c:
        client = c.connect()
        s = client.slice(3, placement="spread")
        assert len({d["worker"] for d in s.devices}) == 3
        rng = np.random.default_rng(5)
        for n in (10, 300_001):  # every partial to everyone; the ring
            parts = rng.integers(-1000, 1000, size=(3, n)).astype(np.float32)
            x = s.put(parts.reshape(-1), plexus.split(0))
            partial = plexus.jit(lambda v: v, s, in_shardings=plexus.split(0),
                                 out_shardings=plexus.partial())
            total = s.program("all_reduce", plexus.Spec((n,), "float32",
                                                        plexus.partial()))
            addend = partial(x)
            addend.block_until_ready()
            before = c.status(fresh=True)
            got = np.asarray(total(addend))
            np.testing.assert_array_equal(got, parts.sum(0))
            after = c.status(fresh=True)
            sent = [a["stats"]["bytes_sent"] - b["stats"]["bytes_sent"]
                    for a, b in zip(after["workers"], before["workers"])]
            # Each worker's offer (176 bytes) went to both others, beside
            # its partial to each (small) or its ring chunks, 2(P-1)/P of
            # the value (large).
            value = 2 * n * 4 if n < 1000 else (2 * 2 * n * 4) // 3 - 4
            assert all(b >= 2 * 176 + value for b in sent), sent
            got = np.asarray(total(partial(x)))  # and again
            np.testing.assert_array_equal(got, parts.sum(0))
            del x, got, addend
        st = c.status(fresh=True)
        assert sum(w["stats"]["transfers_nccl"] for w in st["workers"]) == 0
        client.flush()
        c.wait_until(lambda st: all(w["stats"].get("live_buffers", 0) == 0
                                    for w in st["workers"]),
                     what="every worker to report zero live buffers")
        client.close()
