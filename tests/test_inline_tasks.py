"""Quick tasks run on the worker's ops connection thread as their calls
arrive (TaskRunner::TryRunInline, worker/task_runner.h), on a real embedded
cluster: values are jax.jit's, and a slow program's calls stay on the
device thread. The rules' cases one by one: worker/task_inline_test.cc."""
import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def tasks_inline(cluster, worker_id):
    for w in cluster.status(fresh=True)["workers"]:
        if w["worker_id"] == worker_id:
            return int(w["stats"].get("tasks_inline", 0))
    raise AssertionError(f"no worker {worker_id}")


def test_blocking_tiny_calls_run_on_the_workers_reader(cluster, client):
    # Call, fetch, call: each tiny call comes to an idle device with its
    # input ready, and runs on the worker's reader as it arrives rather than
    # waking the device's thread (TaskRunner::TryRunInline). Values are
    # jax.jit's; a program's first call runs on the device thread (it is
    # timed there), and a slow program's calls stay there.
    s = client.slice(1, hosts=["host1"])
    worker = s.devices[0]["worker"]
    inc = plexus.jit(lambda a: a * 2.0 + 1.0, s, name="tiny")
    slow = plexus.jit(lambda a: jnp.tanh(a @ a) * 0.5, s, name="slow")
    in_process = jax.jit(lambda a: a * 2.0 + 1.0)
    x0 = rand(4, 4)
    before = tasks_inline(cluster, worker)
    y, want = s.put(x0), x0
    # Under a loaded machine (the sanitizer build's run, three test
    # processes on two cores) a device thread may not have let go of the
    # last task when the next comes, or a run may take longer than a quick
    # task's bound (then the next call goes to the device thread and is
    # timed again): so rounds of 50 calls, at most 10, until one ran on the
    # reader. On an idle machine the first round has most of them inline.
    calls = 0
    for _ in range(10):
        for _ in range(50):
            y = inc(y)
            want = in_process(want)
            np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
        calls += 50
        grown = tasks_inline(cluster, worker) - before
        if grown >= 1:
            break
    # The program's first call ran on the device thread (it is timed there).
    assert 1 <= grown <= calls - 1, (grown, calls)

    z = s.put(rand(512, 512))
    slow(z).block_until_ready()  # tens of ms on the device thread
    before = tasks_inline(cluster, worker)
    for _ in range(3):
        z = slow(z)
        z.block_until_ready()
    assert tasks_inline(cluster, worker) == before
