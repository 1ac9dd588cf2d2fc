"""Device memory on an NVIDIA GPU: two workers sharing one GPU take their
devices from the CUDA plugin (plexus.local(gpus=[0])), each holds only its
budget, a chain of programs stays in device memory, donated updates are
written over their input, a value moves between them by CUDA IPC, and a CUDA
out-of-memory fails the calls that hit it with the plugin's message while
the worker goes on serving. Skipped, with the reason, where there is no GPU
or no plugin (tests/gpu/run.sh installs it)."""
import subprocess

import numpy as np
import pytest

from test_xla_gpu import REASON, cuda_pjrt_plugin, use_nvidia_libraries

import plexus

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

BUDGET_MIB = 8192


@pytest.fixture(scope="module")
def shared_gpu(tmp_path_factory):
    use_nvidia_libraries()
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=2, gpus=[0], device_memory_mib=BUDGET_MIB,
                      pjrt_plugin=cuda_pjrt_plugin(), log_level="info",
                      log_file=str(log)) as c:
        yield c


def gpu_memory_by_pid():
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory",
         "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout
    used = {}
    for line in out.strip().splitlines():
        pid, mib = (p.strip() for p in line.split(","))
        used[int(pid)] = int(mib)
    return used


def test_workers_take_their_devices_from_the_plugin(shared_gpu):
    st = shared_gpu.status()
    workers = [w for w in st["workers"] if w["alive"]]
    assert len(workers) == 2
    for w in workers:
        assert len(w["devices"]) == 1, w["devices"]  # one GPU each
        d = w["devices"][0]
        assert "cpu" not in d["kind"].lower(), d  # e.g. "NVIDIA H200"
        assert int(d["memory_bytes"]) == BUDGET_MIB << 20, d


def test_two_workers_on_one_gpu_each_hold_only_their_budget(shared_gpu):
    import jax.numpy as jnp
    client = shared_gpu.connect()
    n = (2 << 30) // 4  # 2 GiB a value
    held = []
    for host in ("host0", "host1"):
        s = client.slice(1, hosts=[host])
        make = plexus.jit(lambda x: jnp.zeros((n,), jnp.float32) + x, s,
                          platform="cuda")
        held.append(make(np.float32(1.0)))
    plexus.block_until_ready(held)
    used = gpu_memory_by_pid()
    for pid in shared_gpu.worker_pids():
        # The budget, plus the CUDA context and XLA's own (~1 GiB at most).
        assert used.get(pid, 0) <= BUDGET_MIB + 1024, (pid, used)


def test_a_chain_on_the_gpu_copies_nothing_until_fetched(shared_gpu):
    client = shared_gpu.connect()
    s = client.slice(1, hosts=["host0"])
    step = plexus.jit(lambda a: a * 1.0001 + 1.0, s, platform="cuda")
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    xf = s.put(x)
    step(xf).block_until_ready()

    def moved():
        w = [w for w in shared_gpu.status(fresh=True)["workers"]
             if w["host_name"] == "host0"][0]["stats"]
        return (int(w.get("bytes_host_to_device", 0)),
                int(w.get("bytes_device_to_host", 0)),
                int(w.get("transfers_alias", 0)))

    before = moved()
    y = xf
    with client.graph():
        for _ in range(200):
            y = step(y)
    y.block_until_ready()
    during = moved()
    assert during[:2] == before[:2]
    assert during[2] - before[2] == 200
    want = x.astype(np.float64)
    for _ in range(200):
        want = want * np.float32(1.0001) + 1.0
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4)


def test_donated_updates_are_written_over_their_input_on_the_gpu(shared_gpu):
    import jax.numpy as jnp
    client = shared_gpu.connect()
    s = client.slice(1, hosts=["host0"])
    n = (1 << 30) // 4  # 1 GiB a value: ten undonated ones would not fit
    init = plexus.jit(lambda: jnp.ones((n,), jnp.float32), s,
                      platform="cuda", name="init")
    step = plexus.jit(lambda p: p * 0.5 + 1.0, s, platform="cuda",
                      name="step", donate_argnums=0)

    def donations():
        w = [w for w in shared_gpu.status(fresh=True)["workers"]
             if w["host_name"] == "host0"][0]["stats"]
        return int(w.get("donations", 0)), int(w.get("donations_declined", 0))

    before = donations()
    p = init()
    for _ in range(10):
        p = step(p)
    p.block_until_ready()
    assert donations() == (before[0] + 10, before[1])
    got = np.asarray(p)[:4]
    want = np.float32(1.0)
    for _ in range(10):
        want = want * np.float32(0.5) + np.float32(1.0)
    np.testing.assert_array_equal(got, [want] * 4)


def transfer_paths(cluster):
    total = {}
    for w in cluster.status(fresh=True)["workers"]:
        for k in ("transfers_host_staged", "transfers_ipc"):
            total[k] = total.get(k, 0) + int(w["stats"].get(k, 0))
    return total


def test_a_device_value_moves_between_workers_on_one_gpu_by_cuda_ipc(
        shared_gpu):
    # host0 makes a 64 MiB value on the GPU; host1, a worker sharing it,
    # reads it after a long program of its own. The value goes by CUDA IPC
    # (host1 maps host0's memory and copies it into a buffer of its own),
    # so it is still intact when host1 reads it, after host0 has released
    # its value and written other values into the memory it freed.
    import jax
    import jax.numpy as jnp
    client = shared_gpu.connect()
    a = client.slice(1, hosts=["host0"])
    b = client.slice(1, hosts=["host1"])
    n = (64 << 20) // 4
    make = plexus.jit(lambda s: jnp.arange(n, dtype=jnp.float32) * s, a,
                      platform="cuda", name="make")
    busy = plexus.jit(
        lambda m: jax.lax.fori_loop(0, 3000, lambda i, x: jnp.tanh(x @ x), m),
        b, platform="cuda", name="busy")
    read = plexus.jit(lambda x, y: x + 0.0 * y[0, 0], b, platform="cuda",
                      name="read")
    w = b.put(np.eye(2048, dtype=np.float32) * 0.5)
    read(make(np.float32(1.0)), busy(w)).block_until_ready()  # compiled
    before = transfer_paths(shared_gpu)
    v = make(np.float32(1.0))
    got = read(v, busy(w))  # queued behind `busy` on host1
    v.block_until_ready()
    del v  # host0 may free it once host1 has its copy
    scrub = make(np.float32(-3.0))  # host0's freed memory, written over
    scrub.block_until_ready()
    out = np.asarray(got)
    np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32))
    paths = transfer_paths(shared_gpu)
    assert paths["transfers_ipc"] - before["transfers_ipc"] == 1, paths
    assert paths["transfers_host_staged"] == before["transfers_host_staged"]
    # The scrub was host0's own: its value is what it made.
    np.testing.assert_array_equal(np.asarray(scrub)[:4],
                                  [0.0, -3.0, -6.0, -9.0])


def test_a_cuda_out_of_memory_fails_its_calls_and_the_worker_serves_on(
        tmp_path):
    # Budgets larger than the GPU: the runtime lets both workers try, and
    # the second finds the GPU full (the plugin's allocator, not Plexus's
    # budget, refuses).
    import jax.numpy as jnp
    use_nvidia_libraries()
    log = tmp_path / "cluster.log"
    with plexus.local(hosts=2, gpus=[0], device_memory_mib=10 ** 6,
                      pjrt_plugin=cuda_pjrt_plugin(), log_level="info",
                      log_file=str(log)) as c:
        client = c.connect()
        limits = [int(w["devices"][0]["memory_bytes"])
                  for w in c.status()["workers"]]
        n = int(min(limits) * 0.7) // 4  # 70% of what one may take
        first = client.slice(1, hosts=["host0"])
        second = client.slice(1, hosts=["host1"])
        big = lambda s: plexus.jit(  # noqa: E731
            lambda x: jnp.zeros((n,), jnp.float32) + x, s, platform="cuda")
        kept = big(first)(np.float32(1.0))
        kept.block_until_ready()
        failed = big(second)(np.float32(2.0))
        with pytest.raises(plexus.PlexusError) as e:
            failed.block_until_ready()
        msg = str(e.value).lower()
        assert "memory" in msg or "resource" in msg, e.value
        # The worker that failed serves the next call; the value of the
        # other is intact.
        small = plexus.jit(lambda x: x + 1.0, second, platform="cuda")
        np.testing.assert_array_equal(
            np.asarray(small(np.ones(4, np.float32))), 2.0)
        head = plexus.jit(lambda x: x[:4], first, platform="cuda")(kept)
        np.testing.assert_array_equal(np.asarray(head), 1.0)
