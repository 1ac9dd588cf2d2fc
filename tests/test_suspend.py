"""Suspend and resume against a real cluster (issue 27 item 5): a
plexus.jit trainer suspends its slice, another client takes its hosts, and
the trainer resumes on the two other hosts: its parameters move there bit
for bit and training goes on, every step matching one process. While
suspended, the slice refuses calls and puts, saying why, and its futures
stay readable. Suspended to files, its values are written to the park
directory and leave the workers' memory; every worker may then be killed
and replaced, and the resume reads them back on the new ones, bit for
bit."""
import os

import numpy as np
import pytest

import plexus
from chaos import kill_host

WAIT_S = 60


def hosts_of(s):
    return {d["host"] for d in s.devices}


class Trainer:
    """A small regression trained by gradient steps on a 2-device slice,
    its parameters replicated; checked step by step against jax in this
    process."""

    def __init__(self, jax, s):
        jnp = jax.numpy
        rng = np.random.default_rng(7)
        self.x = rng.standard_normal((16, 4)).astype(np.float32)
        self.t = rng.standard_normal((16,)).astype(np.float32)

        def step(w, x, t):
            def loss(w):
                return jnp.mean((jnp.tanh(x @ w[:4]) * w[4] - t) ** 2)
            return w - 0.1 * jax.grad(loss)(w)

        self.reference = jax.jit(step)
        self.step = plexus.jit(step, s, name="train_step")
        self.want = (rng.standard_normal(5) * 0.5).astype(np.float32)
        self.s = s
        self.w = s.put(self.want)
        self.xs, self.ts = s.put(self.x), s.put(self.t)

    def run(self, steps):
        for _ in range(steps):
            self.w = self.step(self.w, self.xs, self.ts)
            self.want = np.asarray(self.reference(self.want, self.x, self.t))
            got = np.asarray(plexus.wait(self.w, timeout=WAIT_S))
            np.testing.assert_allclose(got, self.want, rtol=1e-6, atol=1e-7)


@pytest.mark.jax_heavy
def test_a_suspended_job_resumes_on_other_hosts_bit_for_bit(tmp_path):
    jax = pytest.importorskip("jax")
    with plexus.local(hosts=4) as cluster:
        client = cluster.connect(name="trainer")
        s = client.slice(2, placement="spread")
        trainer = Trainer(jax, s)
        with client.trace(str(tmp_path / "trace.json")):
            trainer.run(3)
            before = np.asarray(trainer.w)
            own = hosts_of(s)

            s.suspend()
            assert s.suspended
            with pytest.raises(plexus.InvalidArgumentError,
                               match=rf"slice {s.id} is suspended "
                               r"\(slice.suspend\(\)\); resume it first"):
                plexus.wait(trainer.step(trainer.w, trainer.xs, trainer.ts),
                            timeout=WAIT_S)
            with pytest.raises(plexus.InvalidArgumentError,
                               match="is suspended"):
                plexus.wait(s.put(np.zeros(3, np.float32)), timeout=WAIT_S)
            # Its values stay where they were, readable.
            np.testing.assert_array_equal(np.asarray(trainer.w), before)

            # Another job takes its hosts while it is suspended.
            other = cluster.connect(name="other")
            taker = other.slice(2, hosts=sorted(own))
            assert hosts_of(taker) == own

            moved = s.resume()
            assert not s.suspended
            assert not hosts_of(s) & own, (s.devices, own)
            assert len(hosts_of(s)) == 2
            assert moved["values_moved"] == 3, moved  # w, x and t
            np.testing.assert_array_equal(
                np.asarray(plexus.wait(trainer.w, timeout=WAIT_S)), before)
            trainer.run(3)  # plexus.jit compiles again for the new hosts
            other.close()
    names = [e["name"] for e in
             __import__("json").loads((tmp_path / "trace.json").read_text())
             ["traceEvents"] if e.get("cat") == "resize" and e["ph"] == "b"]
    assert any("suspended (2 devices" in n for n in names), names
    assert any("resumed on other devices (its own were taken), 3 values "
               "moved" in n for n in names), names


def test_a_resume_on_its_own_free_devices_moves_nothing():
    with plexus.local(hosts=2) as cluster:
        client = cluster.connect()
        s = client.slice(2, placement="spread")
        x = s.put(np.arange(6, dtype=np.float32), plexus.split(0))
        own = s.devices
        with pytest.raises(plexus.InvalidArgumentError,
                           match=rf"resume: slice {s.id} is not suspended"):
            s.resume()
        s.suspend()
        with pytest.raises(plexus.InvalidArgumentError,
                           match="is already suspended"):
            s.suspend()
        with pytest.raises(plexus.InvalidArgumentError,
                           match="is suspended; resume it first"):
            s.resize(1)
        assert s.resume() == {"values_moved": 0, "bytes_moved": 0}
        assert s.devices == own
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(x * 2, timeout=WAIT_S)),
            np.arange(6, dtype=np.float32) * 2)


def test_a_client_suspends_and_resumes_all_its_slices():
    with plexus.local(hosts=2) as cluster:
        client = cluster.connect()
        a = client.slice(1, hosts=["host0"])
        b = client.slice(1, hosts=["host1"])
        x = a.put(np.ones(4, np.float32))
        twice = a.program("scale", x, factor=2.0)
        closed = client.slice(1)
        closed.close()
        assert client.suspend() == 2
        assert a.suspended and b.suspended
        assert client.suspend() == 0  # nothing left to suspend
        with pytest.raises(plexus.InvalidArgumentError, match="is suspended"):
            plexus.wait(twice(x), timeout=WAIT_S)
        assert client.resume() == {"slices": 2, "values_moved": 0,
                                   "bytes_moved": 0}
        assert not a.suspended and not b.suspended
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(twice(x), timeout=WAIT_S)),
            np.full(4, 2, np.float32))


def test_a_host_lost_while_suspended_is_recovered_and_the_slice_resumes():
    """The server's own recovery routes on a suspended slice: the spare
    takes the lost host's place, the values it held are made again from
    their lineage, readable while suspended and after the resume. Before,
    the recomputation was refused as a call on a suspended slice and the
    value lost."""
    with plexus.local(hosts=2, spare=1) as cluster:
        client = cluster.connect()
        s = client.slice(2, placement="spread")
        x = s.put(np.arange(8, dtype=np.float32), plexus.split(0))
        twice = s.program("scale", x, factor=2.0)
        y = twice(x)
        plexus.wait(y, timeout=WAIT_S)
        s.suspend()
        generation = s.generation
        lost = s.devices[1]["host"]
        kill_host(cluster, lost)
        cluster.wait_until(lambda _: s.generation > generation,
                           timeout=WAIT_S, what="the spare to take its place")
        assert s.suspended
        assert lost not in hosts_of(s)
        want = np.arange(8, dtype=np.float32) * 2
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(y, timeout=WAIT_S)), want)
        s.resume()
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(twice(y), timeout=WAIT_S)), want * 2)


@pytest.mark.jax_heavy
def test_a_job_suspended_to_files_resumes_bit_for_bit_on_restarted_workers():
    jax = pytest.importorskip("jax")
    # The killed workers stay dead in the cluster's records; it says so as
    # it ends.
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        suspend_to_files_and_restart_the_workers(jax)


def suspend_to_files_and_restart_the_workers(jax):
    with plexus.local(hosts=2) as cluster:
        client = cluster.connect(name="trainer")
        s = client.slice(2, placement="spread")
        trainer = Trainer(jax, s)
        trainer.run(3)
        before = np.asarray(trainer.w)
        parked = s.suspend(to_files=True)
        # w, x and t, each a file a device (all replicated).
        assert parked == {"values_parked": 3,
                          "bytes_parked": 2 * (5 + 16 * 4 + 16) * 4}, parked
        files = sorted(os.listdir(cluster.park_dir))
        assert len(files) == 6 and not any(f.endswith(".tmp") for f in files)
        # Out of the workers' memory: a read says where the value is.
        with pytest.raises(plexus.InvalidArgumentError,
                           match=r"is parked in files while slice \d+ is "
                                 r"suspended to files; resume the slice"):
            np.asarray(trainer.w)
        cluster.wait_until(
            lambda st: all(w["stats"].get("live_bytes", 0) == 0
                           for w in st["workers"] if w["alive"]),
            timeout=WAIT_S, what="the workers to hold nothing")
        # Both workers killed, and started again (new processes, new
        # worker ids, as after a reboot).
        old = {w["worker_id"] for w in cluster.status()["workers"]}
        for host in sorted(hosts_of(s)):
            kill_host(cluster, host)
        cluster.wait_until(
            lambda st: not any(w["alive"] for w in st["workers"]),
            timeout=WAIT_S, what="both workers declared lost")
        for host in ("host0", "host1"):
            cluster.add_worker(host)
        assert s.suspended
        moved = s.resume()
        assert moved["values_moved"] == 3, moved
        new = {d["worker"] for d in s.devices}
        assert len(new) == 2 and not new & old, (new, old)
        np.testing.assert_array_equal(
            np.asarray(plexus.wait(trainer.w, timeout=WAIT_S)), before)
        assert os.listdir(cluster.park_dir) == []  # read back, then deleted
        trainer.run(3)  # on the new workers, matching jax step by step
        client.close()
