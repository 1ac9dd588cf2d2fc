"""XLA programs through PJRT: plexus.jit against jax.jit on the same inputs,
SPMD inside an island, all-reduce between islands, the compile cache,
clear errors for bad programs and a missing plugin (workers keep serving),
and a worker killed under an XLA data-parallel step.

Everything runs on a real embedded cluster whose workers load the CPU PJRT
plugin of the xla-cpu-pjrt wheel."""
import collections
import os
import time

import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def max_rel(a, b):
    """Relative error of `a` against `b` in the array's norm. Elementwise it
    is meaningless for float32 values near zero: the workers' plugin is a
    different XLA build from the client's jaxlib, and its matmul and tanh
    differ in the last bits (2e-7 absolute on 0.08 measured)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def xla_stats(cluster):
    """Sum of the XLA counters over live workers, once every worker has
    reported after this call."""
    st = cluster.status(fresh=True)
    total = {"xla_compiles": 0, "xla_cache_hits": 0}
    for w in st["workers"]:
        for k in total:
            total[k] += int(w["stats"].get(k, 0))
    return total


def layer(x, params):
    """Matmul, nonlinearity and reductions, pytrees in and out."""
    h = jnp.tanh(x @ params["w"] + params["b"])
    return {"h": h, "col_sum": jnp.sum(h, axis=0), "norm": jnp.sqrt(jnp.sum(h * h))}


def test_results_match_jax_jit(client):
    s = client.slice(1)
    x, params = rand(16, 8), {"w": rand(8, 4), "b": rand(4)}
    got = plexus.jit(layer, s)(x, params)
    want = jax.jit(layer)(x, params)
    assert set(got) == set(want)
    for k in want:
        assert isinstance(got[k], plexus.Future)
        assert got[k].shape == want[k].shape
        assert max_rel(got[k], want[k]) <= 1e-6, k


def test_programs_take_futures_from_other_programs_and_join_graphs(client):
    s = client.slice(1)
    x, params = rand(16, 8), {"w": rand(8, 4), "b": rand(4)}
    xf = s.put(x)
    doubled_prog = s.program("scale", xf, factor=2.0)
    first = plexus.jit(layer, s, name="layer")
    second = plexus.jit(lambda h: jnp.mean(h, axis=1), s, name="row_mean")
    with client.graph() as g:
        doubled = doubled_prog(xf)           # built-in kernel
        out = first(doubled, params)         # XLA, takes its future
        rows = second(out["h"])              # XLA, takes an XLA future
    assert g.calls == 3
    ref = jax.jit(layer)(2 * x, params)
    assert max_rel(rows, jnp.mean(ref["h"], axis=1)) <= 1e-6


def test_spmd_inside_an_island_uses_xla_collectives(client):
    s = client.slice(2, placement="one_host")
    assert len({d["worker"] for d in s.devices}) == 1
    x, w = rand(8, 4), rand(4, 3)

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    # The batch is split over the island's two devices: the gradient needs
    # an all-reduce, which XLA's partitioner inserts inside the island.
    grad = plexus.jit(jax.value_and_grad(loss), s,
                      in_shardings=(None, plexus.split(0)))
    value, g = grad(w, x)
    assert value.sharding == "replicated" and g.sharding == "replicated"
    want_value, want_g = jax.value_and_grad(loss)(w, x)
    assert max_rel(value, want_value) <= 1e-6
    assert max_rel(g, want_g) <= 1e-5

    # A split output stays split: each device holds its rows.
    rows = plexus.jit(lambda x: jnp.tanh(x) * 3, s,
                      in_shardings=plexus.split(0),
                      out_shardings=plexus.split(0))(x)
    assert rows.sharding == "split(0)"
    assert max_rel(rows, np.tanh(x) * 3) <= 1e-6


def test_shard_map_collectives_over_the_island_axis(client):
    s = client.slice(2, placement="one_host")
    x = rand(8, 3)

    def f(x):
        def per_device(block):  # [4, 3] on each of the island's 2 devices
            total = jax.lax.psum(jnp.sum(block, axis=0), "devices")
            index = jax.lax.axis_index("devices")
            return total[None], block * (index + 1)
        return jax.shard_map(per_device, in_specs=P("devices"),
                             out_specs=(P(), P("devices")))(x)

    total, scaled = plexus.jit(f, s, in_shardings=plexus.split(0),
                               out_shardings=(None, plexus.split(0)))(x)
    assert max_rel(total, x.sum(0, keepdims=True)) <= 1e-6
    want = np.concatenate([x[:4], 2 * x[4:]])
    assert max_rel(scaled, want) == 0


def test_gradients_all_reduce_between_islands(client):
    s = client.slice(4, placement="spread")
    assert len({d["worker"] for d in s.devices}) == 2
    x, w = rand(16, 4), rand(4, 3)

    def island_loss(w, x):
        # Each island sees half the batch; its addend of the global mean.
        return jnp.sum(jnp.tanh(x @ w) ** 2) / 16

    grad = plexus.jit(jax.grad(island_loss), s,
                      in_shardings=(None, plexus.split(0)),
                      out_shardings=plexus.partial())
    partial_g = grad(w, x)
    assert partial_g.sharding == "partial"
    reduce = s.program("all_reduce", partial_g)
    g = reduce(partial_g)
    want = jax.grad(lambda w, x: jnp.mean(jnp.sum(jnp.tanh(x @ w) ** 2, 1)))(w, x)
    assert max_rel(g, want) <= 1e-5


def test_bfloat16_bool_and_8_bit_arrays_flow_through_programs(client):
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    s = client.slice(4, placement="spread")
    x = rand(8, 16).astype(bf16)
    w = (rand(16, 4) / 4).astype(bf16)
    # Put and fetch keep the bits.
    xf = s.put(x, plexus.split(0))
    assert xf.dtype == bf16
    assert np.asarray(xf).tobytes() == x.tobytes()

    def mixed(x, w, q):
        y = jnp.tanh(x @ w)                       # bfloat16 compute
        return y, y > 0, (q.astype(jnp.int32) * 2).astype(jnp.uint8)

    q = np.arange(8 * 4, dtype=np.int8).reshape(8, 4)
    y, positive, doubled = plexus.jit(
        mixed, s, in_shardings=(plexus.split(0), None, plexus.split(0)),
        out_shardings=plexus.split(0))(xf, w, q)
    want_y, want_pos, want_doubled = jax.jit(mixed)(x, w, q)
    assert y.dtype == bf16 and positive.dtype == np.bool_
    assert doubled.dtype == np.uint8
    assert max_rel(np.asarray(y).astype(np.float32),
                   np.asarray(want_y).astype(np.float32)) <= 1e-2
    np.testing.assert_array_equal(np.asarray(doubled), want_doubled)
    agree = np.asarray(positive) == np.asarray(want_pos)
    assert agree.mean() >= 0.95  # signs of values rounded near zero may flip

    # A bfloat16 gradient summed over islands by the runtime.
    g = plexus.jit(lambda x: jnp.sum(x, axis=0, keepdims=True), s,
                   in_shardings=plexus.split(0),
                   out_shardings=plexus.partial())(xf)
    total = s.program("all_reduce", g)(g)
    assert total.dtype == bf16
    assert max_rel(np.asarray(total).astype(np.float32),
                   x.astype(np.float32).sum(0, keepdims=True)) <= 2e-2
    # Built-in arithmetic kernels say what they compute in.
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"kernel 'add' computes in float32.*not bfloat16"):
        s.program("add", xf, xf)


def test_islands_of_different_sizes(client):
    s = client.slice(3, placement="spread")
    sizes = sorted(collections.Counter(d["worker"] for d in s.devices).values())
    assert sizes == [1, 2], s.devices
    x, w = rand(12, 4), rand(4, 3)

    def island_loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2) / 12

    grad = plexus.jit(jax.grad(island_loss), s,
                      in_shardings=(None, plexus.split(0)),
                      out_shardings=plexus.partial())
    g = grad(w, x)
    total = s.program("all_reduce", g)(g)
    want = jax.grad(lambda w: jnp.mean(jnp.sum(jnp.tanh(x @ w) ** 2, 1)))(w)
    assert max_rel(total, want) <= 1e-5
    rows = plexus.jit(lambda x: jnp.tanh(x) + 1, s,
                      in_shardings=plexus.split(0),
                      out_shardings=plexus.split(0))(x)
    assert rows.shape == (12, 4)
    assert max_rel(rows, np.tanh(x) + 1) <= 1e-6


def test_second_call_compiles_nothing(cluster, client):
    s = client.slice(1)
    x = rand(32, 32)

    def f(a):
        return jnp.sin(a @ a.T) + 17.0  # a module no other test compiles

    prog = plexus.jit(f, s)
    before = xla_stats(cluster)
    np.asarray(prog(x))
    after_first = xla_stats(cluster)
    assert after_first["xla_compiles"] == before["xla_compiles"] + 1
    for _ in range(3):
        out = prog(x)
    assert max_rel(out, jax.jit(f)(x)) <= 1e-6
    after = xla_stats(cluster)
    assert after["xla_compiles"] == after_first["xla_compiles"]
    # The same function jitted again is a new program with the same module
    # and device assignment: the worker's cache serves it.
    np.asarray(plexus.jit(f, s)(x))
    again = xla_stats(cluster)
    assert again["xla_compiles"] == after_first["xla_compiles"]
    assert again["xla_cache_hits"] == after["xla_cache_hits"] + 1
    # `plexus status` shows the counters, per worker.
    from plexus.cli import format_status
    table = format_status(cluster.status())
    assert "XLA PLATFORM" in table and "COMPILES" in table and "CACHE-HITS" in table
    assert "ON-DEVICE" in table and "TO-HOST" in table


TRAFFIC = ("bytes_host_to_device", "bytes_device_to_host",
           "device_memory_shards", "transfers_alias",
           "transfers_device_to_device", "transfers_host_staged",
           "transfers_ipc", "transfers_nccl")


def memory_traffic(cluster):
    """Bytes copied between host and device memory, summed over workers,
    once every worker has reported after this call; the shards they hold in
    device memory; and the shards moved by each transfer path."""
    st = cluster.status(fresh=True)
    total = collections.Counter()
    for w in st["workers"]:
        for k in TRAFFIC:
            total[k] += int(w["stats"].get(k, 0))
    return total


def grew(before, after):
    return {k: after[k] - before[k] for k in TRAFFIC if k != "device_memory_shards"}


def test_a_chain_of_xla_calls_stays_in_device_memory_until_fetched(cluster,
                                                                  client):
    s = client.slice(1)
    x = rand(512, 256)  # 512 KiB: a fetch of it goes through shared memory
    step = plexus.jit(lambda a: a * 1.0001 + 1.0, s)
    xf = s.put(x)
    step(xf).block_until_ready()  # compiled
    before = memory_traffic(cluster)
    y = xf
    with client.graph():
        for _ in range(1000):
            y = step(y)
    y.block_until_ready()
    during = memory_traffic(cluster)
    # Every output stayed where XLA made it; each call after the first
    # (which reads the put's host memory in place) read the last one there,
    # as it is: the alias path, 999 times. Nothing crossed between host and
    # device memory.
    assert grew(before, during) == {
        "bytes_host_to_device": 0, "bytes_device_to_host": 0,
        "transfers_alias": 999, "transfers_device_to_device": 0,
        "transfers_host_staged": 0, "transfers_ipc": 0, "transfers_nccl": 0}
    assert during["device_memory_shards"] >= 1
    want = x.astype(np.float64)
    for _ in range(1000):
        want = want * np.float32(1.0001) + 1.0
    got = np.asarray(y)
    assert max_rel(got, want) <= 1e-5
    # The fetch moved it to host memory, once.
    after = memory_traffic(cluster)
    assert after["bytes_device_to_host"] == \
        during["bytes_device_to_host"] + x.nbytes


def test_device_values_reach_builtin_kernels_and_other_hosts(cluster, client):
    host0 = client.slice(1, hosts=["host0"])
    host1 = client.slice(1, hosts=["host1"])
    x = rand(512, 256)
    on0 = plexus.jit(lambda a: a + 1.0, host0)(x)
    on0.block_until_ready()
    before = memory_traffic(cluster)
    # A built-in kernel on the same device reads it in place (CPU: device
    # memory is host memory).
    scaled = host0.program("scale", on0, factor=2.0)(on0)
    np.testing.assert_allclose(np.asarray(scaled), (x + 1.0) * 2.0, rtol=1e-6)
    mid = memory_traffic(cluster)
    assert mid["bytes_device_to_host"] == before["bytes_device_to_host"]
    # A program on another host gets it through host memory: one copy out.
    there = plexus.jit(lambda a: a - 1.0, host1)(on0)
    np.testing.assert_allclose(np.asarray(there), x, rtol=1e-6, atol=1e-6)
    after = memory_traffic(cluster)
    # The transfer copied it out once; the fetch of `there` once more.
    assert after["bytes_device_to_host"] == \
        mid["bytes_device_to_host"] + 2 * x.nbytes
    # The path: staged through host memory, one shard. The two workers
    # share this host's memory, but CPU device memory is no GPU's: no CUDA
    # IPC (tests/gpu has that path).
    assert grew(mid, after)["transfers_host_staged"] == 1
    assert grew(mid, after)["transfers_device_to_device"] == 0
    assert grew(mid, after)["transfers_ipc"] == 0


def test_device_values_between_workers_of_one_host_go_host_staged_on_cpu(
        cluster, client):
    # Two workers of this machine, reached over the unix socket: where
    # CUDA IPC would be taken on a GPU. On CPU every such transfer is
    # staged through host memory, counted so, and the value arrives intact,
    # however many shards move at once.
    host0 = client.slice(1, hosts=["host0"])
    host1 = client.slice(1, hosts=["host1"])
    xs = [rand(256, 256) + i for i in range(4)]
    make = plexus.jit(lambda a: a * 2.0, host0)
    made = [make(x) for x in xs]
    plexus.block_until_ready(made)
    before = memory_traffic(cluster)
    there = plexus.jit(lambda a: a + 0.5, host1)
    moved = [there(m) for m in made]
    for x, m in zip(xs, moved):
        np.testing.assert_allclose(np.asarray(m), x * 2.0 + 0.5, rtol=1e-6)
    paths = grew(before, memory_traffic(cluster))
    assert paths["transfers_host_staged"] == len(xs), paths
    assert paths["transfers_ipc"] == 0, paths
    assert paths["transfers_nccl"] == 0, paths


def test_all_reduce_of_device_values_sums_on_the_host_without_a_gpu(cluster,
                                                                      client):
    # XLA leaves each island's addend in device memory (CPU plugin); the
    # workers cannot run NCCL (no GPU, no CUDA driver), so they register
    # without it and the all_reduce takes the host path: right sum, no NCCL.
    s = client.slice(2, placement="spread")
    assert len({d["worker"] for d in s.devices}) == 2
    x = rand(2, 4096)
    addend = plexus.jit(lambda a: jnp.sum(a, axis=0) * 2.0, s,
                        in_shardings=plexus.split(0),
                        out_shardings=plexus.partial())(x)
    addend.block_until_ready()
    before = memory_traffic(cluster)
    total = s.program("all_reduce", addend)(addend)
    np.testing.assert_allclose(np.asarray(total), x.sum(0) * 2.0, rtol=1e-6)
    after = memory_traffic(cluster)
    assert grew(before, after)["transfers_nccl"] == 0
    assert after["transfers_nccl"] == 0


def test_a_device_value_read_on_another_device_of_its_worker(cluster, client):
    # Two one-device slices on the same worker: a value XLA left on device
    # 0 is read by a program on device 1 through the plugin's device-to-
    # device copy, never through a transfer or a copy to the host.
    first = client.slice(1, hosts=["host0"])
    second = client.slice(1, hosts=["host0"])
    devices = {(v["worker"], v["device"]) for v in first.devices}
    other = {(v["worker"], v["device"]) for v in second.devices}
    assert len({w for w, _ in devices | other}) == 1 and devices != other, \
        (first.devices, second.devices)
    x = rand(512, 256)
    on_first = plexus.jit(lambda a: a + 1.0, first)(x)
    on_first.block_until_ready()
    there = plexus.jit(lambda a: a * 2.0, second)
    there(on_first).block_until_ready()  # compiled
    before = memory_traffic(cluster)
    y = there(on_first)
    y.block_until_ready()
    after = memory_traffic(cluster)
    assert grew(before, after) == {
        "bytes_host_to_device": 0, "bytes_device_to_host": 0,
        "transfers_alias": 0, "transfers_device_to_device": 1,
        "transfers_host_staged": 0, "transfers_ipc": 0, "transfers_nccl": 0}
    np.testing.assert_allclose(np.asarray(y), (x + 1.0) * 2.0, rtol=1e-6)


def test_an_output_equal_to_its_input_outlives_the_input(client):
    # XLA's output buffers are its own, never its (undonated) inputs' host
    # memory: the input's block is freed and reused (the store recycles
    # memfd blocks of the same size) while the output lives on.
    s = client.slice(1)
    x = rand(512, 256)
    xf = s.put(x)
    y = plexus.jit(lambda a: a, s, name="identity")(xf)
    y.block_until_ready()
    del xf
    reuse = [s.put(np.full((512, 256), 7.0, np.float32)) for _ in range(3)]
    plexus.wait(reuse)
    np.testing.assert_array_equal(np.asarray(y), x)


def cpu_ms_by_thread(pid):
    """CPU time (ms) each thread of process `pid` has run, by thread name
    (threads of one name summed): /proc/<pid>/task/*/schedstat."""
    out = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[name] += int(f.read().split()[0]) / 1e6
        except OSError:  # the thread ended meanwhile
            continue
    return out


def worker_pid(cluster, host):
    return next(int(w["pid"]) for w in cluster.status()["workers"]
                if w["alive"] and w["host_name"] == host)


def plugin_threads(ms):
    """CPU of the PJRT CPU plugin's threads that run programs: its intra-op
    Eigen pool ("tf_XLAEigen") and the threads its client starts unnamed,
    which the worker names "pjrt-plugin"."""
    return sum(v for k, v in ms.items()
               if k.startswith(("tf_", "pjrt-plugin")))


def not_compiling(ms):
    """`ms` without the threads that compile (the worker's compiler thread
    and XLA's own, "pjrt-compile"): a program registered earlier may still
    be compiling, which is work, not a spin."""
    return {k: v for k, v in ms.items()
            if k not in ("plexus-compile", "pjrt-compile")}


@pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                    reason="reads thread names from /proc")
def test_the_plugins_threads_are_named_as_the_plugins(cluster, client):
    # Linux gives a new thread its creator's name: the pools the plugin
    # starts while the worker loads it and compiles would otherwise carry
    # the name of the worker thread that did so, and perf, top -H and the
    # per-thread CPU in bench/xla.py would charge their runs to it.
    s = client.slice(1, hosts=["host0"])
    pid = worker_pid(cluster, "host0")
    prog = plexus.jit(lambda a, b: jnp.tanh(a @ b), s, name="named-threads")
    a = s.put(np.ones((128, 128), np.float32))
    prog(a, a).block_until_ready()
    names = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            names[f.read().strip()] += 1
    for own in ("plexus-reader", "plexus-writer", "plexus-beat",
                "plexus-compile", "plexus-xla-done"):
        assert names[own] == 1, names
    assert names["pjrt-plugin"] >= 1, names


@pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                    reason="reads per-thread CPU time from /proc")
def test_a_worker_with_xla_programs_loaded_does_not_spin(cluster, client):
    # The CPU plugin's thread pools must not spin for work between runs: on
    # a machine of 2 cores a spinning pool takes them from the server, the
    # client and the worker's own threads. The window is a built-in kernel
    # that holds the device for 500 ms without a CPU (device_sleep), right
    # after programs that used the plugin's intra-op pool.
    s = client.slice(1, hosts=["host0"])
    pid = worker_pid(cluster, "host0")
    w = s.put(np.full((256, 256), 1 / 256, np.float32))
    step = plexus.jit(lambda a, b: jnp.tanh(a @ b), s, name="matmul-256")
    y = s.put(np.ones((256, 256), np.float32))
    with client.graph():
        for _ in range(20):
            y = step(y, w)
    hold = s.program("device_sleep", y, micros=500_000)
    y.block_until_ready()
    before = cpu_ms_by_thread(pid)
    hold(y).block_until_ready()
    used = cpu_ms_by_thread(pid) - before
    # Heartbeats, the stream threads and the kernel's own wake-ups cost a
    # few ms; one spinning thread would cost up to the whole 500 ms.
    assert sum(not_compiling(used).values()) < 100, used
    assert plugin_threads(used) < 20, used


@pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                    reason="reads per-thread CPU time from /proc")
def test_tiny_programs_run_on_the_workers_threads_not_the_plugins_pools(
        cluster, client):
    # A program of a few flops runs inline where it is queued (the plugin
    # does so for programs under 1000 flops whose inputs are ready): a
    # chain of them wakes none of the plugin's threads, whose hand-offs
    # would cost more than the program.
    s = client.slice(1, hosts=["host0"])
    pid = worker_pid(cluster, "host0")
    inc = plexus.jit(lambda a: a + 1.0, s, name="increment")
    y = s.put(np.zeros((8, 8), np.float32))
    y = inc(y)
    y.block_until_ready()
    before = cpu_ms_by_thread(pid)
    with client.graph():
        for _ in range(500):
            y = inc(y)
    np.testing.assert_array_equal(np.asarray(y), np.full((8, 8), 501.0))
    used = cpu_ms_by_thread(pid) - before
    # The worker's own threads ran them: its device thread, or the thread
    # that reads its ops, which runs a quick task itself when the device is
    # idle (TaskRunner::TryRunInline; with a graph's calls sent as they
    # are recorded, a chain may run wholly there).
    ran = (used["plexus-worker"] + used["plexus-dp-conn"]
           + used["plexus-reader"])
    assert ran > 0, used
    assert plugin_threads(used) < 5, used


def test_programs_compile_when_registered_before_their_first_call(
        cluster, client):
    s = client.slice(2, placement="spread")
    before = xla_stats(cluster)["xla_compiles"]

    def f(x):
        return jnp.cos(x) * 41.0  # a module no other test compiles

    prog = plexus.jit(f, s, in_shardings=plexus.split(0),
                      out_shardings=plexus.split(0)).lower(
        plexus.Spec((4, 3), "float32", plexus.split(0)))
    client.flush()
    # No call yet: both islands' workers compile it on their own.
    cluster.wait_until(
        lambda st: sum(int(w["stats"]["xla_compiles"]) for w in st["workers"])
        >= before + 2, timeout=60, what="both workers to compile ahead")
    x = rand(4, 3)
    assert max_rel(prog(x), np.cos(x) * 41) <= 1e-6
    assert xla_stats(cluster)["xla_compiles"] == before + 2


def test_function_that_fails_to_lower_is_a_clear_error(client):
    s = client.slice(1)

    def bad(x):
        return x @ jnp.ones((5, 5))  # x is [4, 4]

    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'bad'.*could not trace.*"):
        plexus.jit(bad, s)(rand(4, 4))


def test_unused_arguments_are_still_arguments(client):
    s = client.slice(1)
    out = plexus.jit(lambda x, unused: x + 1, s)(rand(3), rand(5))
    assert out.shape == (3,)


def test_a_shape_the_program_was_not_compiled_for_is_refused(client):
    s = client.slice(1)
    prog = plexus.jit(lambda x: x * 2, s, name="twice").lower(
        plexus.Spec((4, 4), "float32"))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"'twice' argument 0.*float32\[3, 4\].*float32\[4, 4\]"):
        prog(rand(3, 4))
    # Futures of the wrong shape too.
    with pytest.raises(plexus.InvalidArgumentError, match=r"float32\[2\]"):
        prog(s.put(rand(2)))
    assert max_rel(prog(np.ones((4, 4), np.float32)), 2 * np.ones((4, 4))) == 0


def test_unsupported_dtypes_and_partial_inputs_are_refused(client):
    s = client.slice(1)
    with pytest.raises(plexus.InvalidArgumentError,
                       match="output 0: dtype int4 has elements smaller"):
        plexus.jit(lambda x: x.astype(jnp.int4), s)(rand(3))
    with pytest.raises(plexus.InvalidArgumentError,
                       match="float64 future, but JAX computes it in float32"):
        plexus.jit(lambda x: x + 1, s)(s.put(np.ones(3)))
    s2 = client.slice(2)
    part = plexus.jit(lambda x: x, s2, out_shardings=plexus.partial())(rand(3))
    with pytest.raises(plexus.InvalidArgumentError, match="not partial"):
        plexus.jit(lambda x: x, s2)(part)


def test_a_program_lowered_for_another_platform_is_refused(client):
    s = client.slice(1)
    prog = plexus.jit(lambda x: x * 2, s, name="for_gpu", platform="cuda")
    with pytest.raises(plexus.PlexusError,
                       match=r"for_gpu.*lowered for platform 'cuda'.*runs 'cpu'"):
        np.asarray(prog(rand(3)))
    # The worker still runs the same function lowered for its platform.
    assert max_rel(plexus.jit(lambda x: x * 2, s)(np.ones(3, np.float32)),
                   2 * np.ones(3)) == 0


def test_xla_scratch_memory_counts_against_the_device_budget(tmp_path):
    with plexus.local(hosts=1, devices_per_host=1, device_memory_mib=4,
                      log_file=str(tmp_path / "cluster.log")) as c:
        s = c.connect().slice(1)

        def smallest(v):  # sorts the 16 MiB outer product: XLA scratch
            return jnp.sort(jnp.outer(v, v).ravel())[:4]

        prog = plexus.jit(smallest, s, name="big_scratch")
        with pytest.raises(plexus.ResourceExhaustedError,
                           match=r"big_scratch.*XLA scratch memory of "
                                 r"\d+ bytes.*can never fit device 0"):
            np.asarray(prog(np.ones(2048, np.float32)))
        # The same function on a small input fits, on the same worker.
        v = rand(64)
        assert max_rel(prog(v), np.sort(np.outer(v, v).ravel())[:4]) <= 1e-6


def test_a_clients_programs_and_executables_go_with_it(tmp_path):
    with plexus.local(hosts=1, devices_per_host=1,
                      log_file=str(tmp_path / "cluster.log")) as c:
        def loaded():
            st = c.status(fresh=True)["workers"][0]["stats"]
            return int(st.get("programs_loaded", 0)), int(st["xla_compiles"])

        def run_once():
            client = c.connect()
            s = client.slice(1)
            np.asarray(plexus.jit(lambda x: jnp.exp(x) - 3, s)(rand(4)))
            return client

        client = run_once()
        assert loaded() == (1, 1)
        client.close()
        c.wait_until(lambda st: int(st["workers"][0]["stats"].get(
            "programs_loaded", 0)) == 0, what="the worker to unload")
        # The executable went with the last program using it: the same
        # module from a new client compiles again.
        client = run_once()
        assert loaded() == (1, 2)


def test_missing_plugin_fails_calls_and_the_worker_keeps_serving(tmp_path):
    missing = str(tmp_path / "no_such_pjrt_plugin.so")
    with plexus.local(hosts=1, devices_per_host=1, pjrt_plugin=missing,
                      log_file=str(tmp_path / "cluster.log")) as c:
        client = c.connect()
        s = client.slice(1)
        prog = plexus.jit(lambda x: x + 1, s, name="plus_one")
        for _ in range(2):  # every call says why, not just the first
            out = prog(rand(3))
            with pytest.raises(plexus.PlexusError,
                               match=r"plus_one.*no_such_pjrt_plugin\.so.*cannot load"):
                np.asarray(out)
        # Built-in programs still run on the same worker.
        x = s.put(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(s.program("scale", x, factor=3.0)(x),
                                      3 * np.arange(4))
        st = c.status(fresh=True)
        assert all(w["alive"] for w in st["workers"])
        assert "cannot load" in st["workers"][0]["stats"]["xla_platform"]


def test_killed_worker_fails_an_xla_data_parallel_step_and_the_rest_serves(tmp_path):
    import os
    import signal
    import time
    # The SIGKILLed worker is reported again when the cluster goes down.
    with pytest.raises(plexus.ClusterExitError, match=r"host1 .*SIGKILL"), \
            plexus.local(hosts=2, devices_per_host=2, log_level="info",
                         log_file=str(tmp_path / "cluster.log")) as c:
        client = c.connect()
        s = client.slice(4, placement="spread")
        x, w = rand(64, 64), rand(64, 64) / 8

        def heavy(w, x):
            for _ in range(20):
                x = jnp.tanh(x @ w)
            return x

        step = plexus.jit(heavy, s, in_shardings=(None, plexus.split(0)),
                          out_shardings=plexus.split(0))
        grad = plexus.jit(lambda w, x: jax.grad(
            lambda w: jnp.sum(heavy(w, x)) / 64)(w), s,
            in_shardings=(None, plexus.split(0)),
            out_shardings=plexus.partial())
        wf, y = s.put(w), s.put(x, plexus.split(0))
        np.asarray(step(wf, y))             # compiled on both workers
        hold = s.program("device_sleep", y, micros=20_000)
        for _ in range(100):               # ~2 s queued on every device
            y = step(wf, hold(y))
        g = grad(wf, y)
        total = s.program("all_reduce", g)(g)
        victim = next(v for v in c.status()["workers"]
                      if v["host_name"] == "host1")
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(plexus.PlexusError, match="worker"):
            np.asarray(total)
        assert time.monotonic() - t0 < 5
        c.wait_until(lambda st: any(not v["alive"] for v in st["workers"]),
                     what="the server to mark the worker down")
        # The surviving host still compiles and runs XLA programs.
        other = c.connect(name="after")
        s2 = other.slice(2, placement="one_host")
        assert {d["host"] for d in s2.devices} == {"host0"}
        out = plexus.jit(heavy, s2, in_shardings=(None, plexus.split(0)),
                         out_shardings=plexus.split(0))(w, x)
        assert max_rel(out, jax.jit(heavy)(w, x)) <= 1e-5


def test_static_and_keyword_arguments_and_decorator_form(cluster, client):
    s = client.slice(1)

    @plexus.jit(slice=s, static_argnums=1)
    def power(x, n, scale):
        return scale * x ** n

    x = rand(5)
    before = xla_stats(cluster)["xla_compiles"]
    cube = power(x, 3, np.float32(2.0))
    square = power(x, 2, np.float32(2.0))
    assert max_rel(cube, 2 * x ** 3) <= 1e-6
    assert max_rel(square, 2 * x ** 2) <= 1e-6
    assert power.compiled_signatures == 2  # one program per static value
    np.asarray(power(x, 3, np.float32(5.0)))  # same program: a new input
    assert power.compiled_signatures == 2
    assert xla_stats(cluster)["xla_compiles"] == before + 2
    with pytest.raises(plexus.InvalidArgumentError, match="hashable"):
        power(x, [3], np.float32(1.0))
    with pytest.raises(TypeError, match="needs the slice"):
        plexus.jit(lambda x: x)

    # Keyword arguments are arguments too, as in jax.jit.
    @plexus.jit(slice=s)
    def affine(x, *, w, b):
        return x @ w + b

    w, b = rand(5, 2), rand(2)
    assert max_rel(affine(x, w=w, b=b), x @ w + b) <= 1e-6
    lowered = plexus.jit(lambda x, *, w, b: x @ w + b, s).lower(x, w=w, b=b)
    assert max_rel(lowered(x, w=s.put(w), b=b), x @ w + b) <= 1e-6


def test_gpus_that_are_not_gpu_indices_are_refused():
    for bad in ([], [-1], ["x"], [True]):
        with pytest.raises(ValueError, match=r"gpus must be GPU indices"):
            plexus.local(hosts=1, gpus=bad)


def test_device_busy_time_counts_xla_runs_it_did_not_wait_for(cluster, client):
    # The device thread queues each run and goes on; the device's busy time
    # is the runs' own (from each one's start, or the device's previous
    # end, to its end), not the thread's few microseconds per launch.
    s = client.slice(1, hosts=["host1"])
    dev = s.devices[0]

    def busy_micros(st):
        for w in st["workers"]:
            if w["worker_id"] == dev["worker"]:
                return w["stats"].get("device_busy_micros", [0] * 8)[dev["device"]]

    step = plexus.jit(lambda a: jnp.tanh(a @ a) * 0.5, s)
    x = s.put(rand(256, 256))
    step(x).block_until_ready()
    before = busy_micros(cluster.status(fresh=True))
    t0 = time.monotonic()
    y = x
    with client.graph():
        for _ in range(100):
            y = step(y)
    y.block_until_ready()
    wall_us = (time.monotonic() - t0) * 1e6
    grown = busy_micros(cluster.status(fresh=True)) - before
    assert grown >= 0.5 * wall_us, (grown, wall_us)

