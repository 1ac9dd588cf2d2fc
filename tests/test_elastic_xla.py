"""A spare that joins a cluster whose XLA programs are already compiled
takes their executables from a live worker (serialized, over the data
plane) instead of compiling them, and a host lost afterwards recovers onto
it without a compile: the call run again there uses the loaded executable.
So does a spare there when the program is registered (it waits for a host
of the slice to have compiled it), and a host that rejoins after it was
declared down (it stands by, as a spare does).

Real embedded clusters whose workers load the CPU PJRT plugin of the
xla-cpu-pjrt wheel."""
import os
import signal

import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

WAIT_S = 60


def stat(w, key):
    return int(w.get("stats", {}).get(key, 0))


def worker(st, worker_id):
    return next(w for w in st["workers"] if int(w["worker_id"]) == worker_id)


def has_executable(w):
    """Whether worker `w` (a status dict) has compiled or loaded any."""
    return stat(w, "xla_compiles") + stat(w, "xla_serialized_loads") > 0


def deep(x):
    """A program whose compile takes a while (hundreds of ms on the CPU
    plugin), so that a worker that compiled along with the slice's hosts
    would not find it compiled there."""
    for k in range(24):
        x = jnp.tanh(x * (1.0 + k / 100.0)) + jnp.sin(x) * (k % 3)
    return x


def loaded_not_compiled(cluster, worker_id, what):
    """Waits until the worker has an executable, and asserts it loaded it
    from a peer and compiled nothing; its status."""
    st = cluster.wait_until(
        lambda st: has_executable(worker(st, worker_id)), timeout=WAIT_S,
        what=what)
    w = worker(st, worker_id)
    assert stat(w, "xla_serialized_loads") == 1, w["stats"]
    assert stat(w, "xla_compiles") == 0, w["stats"]
    return w


def scaled_tanh(s):
    """A program split over slice `s`, an input for it and its result."""
    f = plexus.jit(lambda x: jnp.tanh(x) * 2 + 1, s,
                   in_shardings=plexus.split(0),
                   out_shardings=plexus.split(0), name="scaled_tanh")
    data = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    return f, data, np.tanh(data) * 2 + 1


def test_a_joining_spare_loads_the_jobs_executables_and_recovers_without_compiling():
    with plexus.local(hosts=2, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(2)
        f, data, want = scaled_tanh(s)
        x = s.put(data, plexus.P("devices"))
        y = f(x)  # the hosts of the slice compiled it
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)

        # The spare there from the start loaded it from them. Lose it:
        # the embedded cluster starts a new spare, which joins a cluster
        # whose program is compiled, and is loaded with it.
        st = cluster.status(fresh=True)
        first = next(w for w in st["workers"] if w["alive"] and w.get("spare"))
        os.kill(int(first["pid"]), signal.SIGKILL)

        def new_spare(st):
            return next((w for w in st["workers"]
                         if w["alive"] and w.get("spare")
                         and w["worker_id"] != first["worker_id"]
                         and stat(w, "programs_loaded") > 0
                         and stat(w, "xla_compiles")
                         + stat(w, "xla_serialized_loads") > 0), None)

        st = cluster.wait_until(lambda st: new_spare(st) is not None,
                                timeout=WAIT_S,
                                what="a new spare with the program's executable")
        spare = new_spare(st)
        spare_id = int(spare["worker_id"])
        assert stat(spare, "xla_serialized_loads") == 1, spare["stats"]
        assert stat(spare, "xla_compiles") == 0, spare["stats"]

        # A host of the slice lost: its island moves onto the new spare, and
        # y's shard that was there is computed again by running f there.
        before = cluster.status().get("recovery", {})
        victim = s.devices[1]["host"]
        victim_pid = next(int(w["pid"]) for w in st["workers"]
                          if w["alive"] and w["host_name"] == victim)
        os.kill(victim_pid, signal.SIGKILL)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
        assert s.generation == 1
        assert s.devices[1]["host"] == spare["host_name"]
        z = f(y)  # and the job goes on on the new map
        np.testing.assert_allclose(np.asarray(z), np.tanh(want) * 2 + 1,
                                   rtol=1e-6)

        st = cluster.status(fresh=True)
        after = st.get("recovery", {})
        assert (int(after.get("calls_recomputed", 0))
                > int(before.get("calls_recomputed", 0)))
        took = worker(st, spare_id)
        assert stat(took, "calls_executed") >= 2, took["stats"]
        assert stat(took, "xla_compiles") == 0, took["stats"]
        assert stat(took, "xla_serialized_loads") == 1, took["stats"]


def test_a_spare_there_when_a_program_is_registered_loads_it_from_a_host():
    with plexus.local(hosts=2, spare=1) as cluster:
        st = cluster.wait_until(
            lambda st: any(w["alive"] and w.get("spare")
                           for w in st["workers"]),
            timeout=WAIT_S, what="the spare")
        spare_id = next(int(w["worker_id"]) for w in st["workers"]
                        if w["alive"] and w.get("spare"))
        c = cluster.connect()
        s = c.slice(2)
        f = plexus.jit(deep, s, in_shardings=plexus.split(0),
                       out_shardings=plexus.split(0), name="deep")
        data = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
        y = f(s.put(data, plexus.P("devices")))
        np.testing.assert_allclose(np.asarray(y), np.asarray(deep(data)),
                                   rtol=1e-5)
        # Registered while the spare was there: it waited for a host of the
        # slice to compile the program, and loaded that executable.
        loaded_not_compiled(cluster, spare_id, "the spare's executable")


def test_a_host_that_rejoins_after_it_was_declared_down_loads_the_jobs_executables():
    with plexus.local(hosts=2, spare=1) as cluster:
        c = cluster.connect()
        s = c.slice(2)
        f, data, want = scaled_tanh(s)
        y = f(s.put(data, plexus.P("devices")))
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)

        # A host of the slice stops: declared down by missed heartbeats,
        # its place taken by the spare. It wakes, is fenced, and rejoins
        # as a fresh host (a new registration, not a spare): in no slice.
        victim = s.devices[1]["host"]
        st = cluster.status()
        old = next(w for w in st["workers"]
                   if w["alive"] and w["host_name"] == victim)
        os.kill(int(old["pid"]), signal.SIGSTOP)
        try:
            cluster.wait_until(
                lambda st: not worker(st, int(old["worker_id"]))["alive"],
                timeout=WAIT_S, what=f"{victim} declared down")
        finally:
            os.kill(int(old["pid"]), signal.SIGCONT)

        def rejoined(st):
            return next((w for w in st["workers"]
                         if w["alive"] and w["host_name"] == victim
                         and w["worker_id"] != old["worker_id"]), None)

        st = cluster.wait_until(lambda st: rejoined(st) is not None,
                                timeout=WAIT_S, what=f"{victim} rejoining")
        back_id = int(rejoined(st)["worker_id"])
        assert not rejoined(st).get("spare")
        # It stands by for the slice's island: loaded with the program and
        # its executable taken from a live worker, nothing compiled.
        back = loaded_not_compiled(cluster, back_id,
                                   "the rejoined host's executable")
        assert stat(back, "programs_loaded") == 1, back["stats"]
        np.testing.assert_allclose(np.asarray(f(y)),
                                   np.tanh(want) * 2 + 1, rtol=1e-6)
