"""Donation (jax.jit's donate_argnums) on a real embedded cluster: a donated
input is consumed by its call, and the output XLA aliases to it is written
over its memory on the device where nothing else reads it; a value another
call or fetch still reads is never written over."""
import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

MIB = 1 << 20
SHAPE = (1024, 768)  # 3 MiB of float32


def worker_stats(cluster):
    return cluster.status(fresh=True)["workers"][0]["stats"]


def ones_and_donating_step(s, shape):
    """`init` (ones of `shape`) and `step` (p * 0.5 + 1, donating p) on s."""
    init = plexus.jit(lambda: jnp.ones(shape, jnp.float32), s, name="init")
    step = plexus.jit(lambda p: p * 0.5 + 1.0, s, name="step",
                      donate_argnums=0)
    return init, step


def test_a_donated_value_is_gone_and_its_memory_holds_the_output():
    # A cluster of its own: the device's high-water mark is this test's.
    with plexus.local(hosts=1) as cluster:
        client = cluster.connect()
        s = client.slice(1)
        init, step = ones_and_donating_step(s, SHAPE)
        keep = plexus.jit(lambda p: p * 0.5 + 1.0, s, name="keep")

        # Ten updates queued at once, each donating the last one's output:
        # the device never holds more than one of them.
        first = init()
        p = first
        for _ in range(10):
            p = step(p)
        want = np.ones(SHAPE, np.float32)
        for _ in range(10):
            want = want * np.float32(0.5) + np.float32(1.0)
        np.testing.assert_array_equal(np.asarray(p), want)
        st = worker_stats(cluster)
        assert st["donations"] == 10 and st["donations_declined"] == 0
        assert int(st["device_peak_bytes"][0]) == 3 * MIB

        # The donated futures are gone, as a donated jax.Array is deleted:
        # each use says which program took it.
        with pytest.raises(plexus.InvalidArgumentError,
                           match=r"was donated to program 'step'"):
            np.asarray(first)
        with pytest.raises(plexus.InvalidArgumentError,
                           match=r"program 'step' argument 0: buffer \d+ was "
                                 r"donated to program 'step'"):
            step(first)

        # The same chain without donation holds every queued output at once.
        q = init()
        for _ in range(10):
            q = keep(q)
        np.testing.assert_array_equal(np.asarray(q), want)
        st = worker_stats(cluster)
        assert st["donations"] == 10
        assert int(st["device_peak_bytes"][0]) > 6 * MIB


def test_a_donating_call_made_on_a_ready_input_holds_one_value():
    # Each step made after the last is done finds its input ready and the
    # device idle: a quick task the worker could run on its ops thread,
    # reserving room ahead for its output and input. A donating one must
    # not: the room was counted beside the value written over (the
    # device's peak read three values; the test above caught it only when
    # its 3 MiB steps happened to run that fast).
    small = (128, 128)  # 64 KiB of float32: a step takes microseconds
    with plexus.local(hosts=1) as cluster:
        client = cluster.connect()
        s = client.slice(1)
        init, step = ones_and_donating_step(s, small)
        p = init()
        plexus.wait(p)
        want = np.ones(small, np.float32)
        for _ in range(8):
            p = step(p)
            plexus.wait(p)
            want = want * np.float32(0.5) + np.float32(1.0)
        np.testing.assert_array_equal(np.asarray(p), want)
        st = worker_stats(cluster)
        assert st["donations"] == 8 and st["donations_declined"] == 0
        assert int(st["device_peak_bytes"][0]) == 64 * 1024


def donation_counts(cluster):
    st = cluster.status(fresh=True)["workers"]
    return (sum(int(w["stats"].get("donations", 0)) for w in st),
            sum(int(w["stats"].get("donations_declined", 0)) for w in st))


def test_a_value_something_else_reads_is_never_written_over(cluster, client):
    s = client.slice(1)
    init = plexus.jit(lambda: jnp.arange(12, dtype=jnp.float32), s,
                      name="init")
    step = plexus.jit(lambda p: p + 100.0, s, name="step", donate_argnums=0)
    double = plexus.jit(lambda p: p * 2.0, s, name="double")
    x = init()
    x.block_until_ready()
    before = donation_counts(cluster)
    # Read by a call routed before the donating one: the server keeps the
    # value (the donation is not granted), and both calls see it as it was.
    with client.graph():
        doubled = double(x)
        stepped = step(x)
    np.testing.assert_array_equal(np.asarray(doubled), np.arange(12) * 2.0)
    np.testing.assert_array_equal(np.asarray(stepped), np.arange(12) + 100.0)
    assert donation_counts(cluster) == before
    # A put (host memory the client may still share) is read, never written.
    data = np.arange(12, dtype=np.float32)
    put = s.put(data)
    np.testing.assert_array_equal(np.asarray(step(put)), data + 100.0)
    np.testing.assert_array_equal(data, np.arange(12))
    # The server allowed it (nothing else read the put); the worker found
    # host memory, not a device value of the program's device.
    assert donation_counts(cluster) == (before[0], before[1] + 1)


def test_donated_leaves_with_no_output_like_them_warn_and_stay_valid(client):
    s = client.slice(1)

    def update(params, scale):
        return {"w": params["w"] * scale}, jnp.sum(params["b"])

    params = {"w": s.put(np.ones(3, np.float32)),
              "b": s.put(np.arange(2, dtype=np.float32))}
    prog = plexus.jit(update, s, donate_argnums=0)
    with pytest.warns(UserWarning,
                      match=r"program 'update': some donated buffers were not "
                            r"usable: params\['b'\] \(no output of the same"):
        new, total = prog(params, np.float32(2.0))
    np.testing.assert_array_equal(np.asarray(new["w"]), [2, 2, 2])
    assert float(np.asarray(total)) == 1.0
    # params['w'] was consumed; params['b'] had no output like it.
    with pytest.raises(plexus.InvalidArgumentError, match="was donated"):
        np.asarray(params["w"])
    np.testing.assert_array_equal(np.asarray(params["b"]), [0, 1])
