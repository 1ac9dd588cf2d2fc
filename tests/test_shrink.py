"""A slice that shrinks on a loss and grows back (client.slice(on_loss=
"shrink", grow=True)) against a real cluster with no spare: hosts are
SIGKILLed under a data-parallel training loop, which goes on with fewer
devices without restarting, and grows back as new workers join. The
parameters after every step match one process applying the same steps
with the same batch sizes. Also: the minimum, and the break policy."""
import json
import os
import signal

import numpy as np
import pytest

import plexus
from chaos import kill_host

WAIT_S = 60


def hosts_of(s):
    return [d["host"] for d in s.devices]


def value(f):
    return np.asarray(plexus.wait(f, timeout=WAIT_S))


def await_resize(cluster, s, resizes, size):
    """Until the client has heard of the slice's next resize, to `size`."""
    cluster.wait_until(lambda _: s.resizes > resizes, timeout=WAIT_S,
                       what=f"slice {s.id} to be resized to {size}")
    assert s.num_devices == size, (s, size)


@pytest.mark.jax_heavy
def test_data_parallel_training_goes_on_through_losses_and_joins(tmp_path):
    """An MLP trained data parallel, 4 rows a device: each island's gradient
    (plexus.jit, partial), summed by all_reduce, applied to replicated
    parameters. Two hosts are SIGKILLed (4 -> 3 -> 2 devices) and two
    workers join (2 -> 4). The loop keeps its last good parameters until a
    step is done; a step a resize cut short raises, and runs again on the
    new size. Each step's parameters match one process's (same rows)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rows, lr, steps, features, hidden = 4, 0.1, 10, 4, 8
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((steps, 4 * rows, features)).astype(np.float32)
    ts = rng.standard_normal((steps, 4 * rows)).astype(np.float32)
    sizes_p = [features * hidden, hidden, hidden, 1]

    def unflat(p):
        out, at = [], 0
        for n in sizes_p:
            out.append(p[at:at + n])
            at += n
        w1, b1, w2, b2 = out
        return w1.reshape(features, hidden), b1, w2, b2[0]

    def loss(p, x, t):  # a sum: the step divides by its batch
        w1, b1, w2, b2 = unflat(p)
        y = jnp.tanh(x @ w1 + b1) @ w2 + b2
        return jnp.sum((y - t) ** 2)

    step_grad = jax.jit(jax.grad(loss))
    want = (rng.standard_normal(sum(sizes_p)) * 0.3).astype(np.float32)
    out = {}

    def train(cluster):
        nonlocal want
        client = cluster.connect(name="shrink")
        s = client.slice(4, placement="spread", on_loss="shrink",
                         min_devices=2, grow=True)
        grad = plexus.jit(jax.grad(loss), s, name="island_grad",
                          in_shardings=(None, plexus.split(0),
                                        plexus.split(0)),
                          out_shardings=plexus.partial())
        update = plexus.jit(lambda p, g, scale: p - scale * g, s,
                            name="update")
        p = s.put(want)
        sizes, retried = [], 0
        with client.trace(str(tmp_path / "trace.json")):
            k, events = 0, set()
            while k < steps:
                if k in (2, 4) and k not in events:
                    events.add(k)  # between steps, not waited for
                    kill_host(cluster, hosts_of(s)[-1])
                if k == 6 and k not in events:
                    events.add(k)
                    before = s.resizes
                    for j in range(2):
                        cluster.add_worker(f"joiner{j}")
                    cluster.wait_until(
                        lambda _: s.num_devices == 4, timeout=WAIT_S,
                        what="the slice to grow back to 4")
                    assert s.resizes > before
                n, resizes = s.num_devices, s.resizes
                all_reduce = s.program(
                    "all_reduce",
                    plexus.Spec((sum(sizes_p),), "float32",
                                plexus.partial()))
                x_k, t_k = xs[k][:rows * n], ts[k][:rows * n]
                try:
                    x = s.put(x_k, plexus.split(0))
                    t = s.put(t_k, plexus.split(0))
                    scale = s.put(np.float32(lr / (rows * n)))
                    new_p = update(p, all_reduce(grad(p, x, t)), scale)
                    got = value(new_p)
                except plexus.PlexusError as e:
                    # A host went under this step: the slice shrinks
                    # (the client hears of it), and the step runs again
                    # on the devices left.
                    try:
                        await_resize(cluster, s, resizes, n - 1)
                    except TimeoutError:
                        raise AssertionError(
                            f"step {k} failed with no resize: {e}")
                    retried += 1
                    continue
                if s.resizes != resizes:
                    # Done on the old size, but a value of it may have
                    # been lost in the move: run it again (the same
                    # step, from the same parameters).
                    retried += 1
                    continue
                want = want - np.float32(lr / (rows * n)) * np.asarray(
                    step_grad(want, x_k, t_k))
                np.testing.assert_allclose(got, want, rtol=1e-5,
                                           atol=1e-6)
                sizes.append(n)
                p = new_p
                k += 1
        out.update(sizes=sizes, retried=retried,
                   trace=json.loads((tmp_path / "trace.json").read_text()))

    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        with plexus.local(hosts=4) as cluster:
            train(cluster)
    sizes, trace = out["sizes"], out["trace"]
    assert sizes[:2] == [4, 4] and sizes[-4:] == [4, 4, 4, 4], sizes
    assert 3 in sizes and 2 in sizes, sizes
    # Each resize is in the trace: two shrinks, then the growth (one or two
    # steps, as the workers registered).
    names = [e["name"] for e in trace["traceEvents"]
             if e.get("cat") == "resize" and e["ph"] == "b"]
    assert sum("shrank to 3" in n for n in names) == 1, names
    assert sum("shrank to 2" in n for n in names) == 1, names
    assert any("grew back to 4" in n for n in names), names
    # What each took at the server and moved (shown with pytest -s).
    begins = {e["id"]: e for e in trace["traceEvents"]
              if e.get("cat") == "resize" and e["ph"] == "b"}
    for e in trace["traceEvents"]:
        if e.get("cat") == "resize" and e["ph"] == "e" and e["id"] in begins:
            print(f"resize: {begins[e['id']]['name']}: "
                  f"{e['ts'] - begins[e['id']]['ts']:.0f} us")
    print(f"sizes by step: {sizes}; steps run again: {out['retried']}")


def test_a_slice_under_its_minimum_breaks_and_says_why():
    # The killed worker stays lost; the cluster says so as it shuts down.
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        under_its_minimum()


def under_its_minimum():
    with plexus.local(hosts=2) as cluster:
        client = cluster.connect(name="minimum")
        s = client.slice(2, placement="spread", on_loss="shrink",
                         min_devices=2)
        x = s.put(np.float32([1, 2, 3]))
        np.testing.assert_array_equal(value(x), [1, 2, 3])
        kill_host(cluster, hosts_of(s)[1])
        st = cluster.wait_until(
            lambda st: any(sl.get("broken") for sl in st["slices"]),
            timeout=WAIT_S, what="the slice to break")
        broken = [sl["broken"] for sl in st["slices"] if sl.get("broken")]
        assert "under its minimum of 2" in broken[0], broken


def test_a_replicated_value_survives_a_shrink_and_a_split_one_is_named():
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        shrink_with_values()


def shrink_with_values():
    with plexus.local(hosts=3) as cluster:
        client = cluster.connect(name="values")
        s = client.slice(3, placement="spread", on_loss="shrink")
        whole = s.put(np.float32([1, 2, 3]))
        rows = s.put(np.arange(6, dtype=np.float32), plexus.split(0))
        np.testing.assert_array_equal(value(rows), np.arange(6))
        resizes = s.resizes
        kill_host(cluster, hosts_of(s)[2])
        await_resize(cluster, s, resizes, 2)
        np.testing.assert_array_equal(value(whole), [1, 2, 3])
        with pytest.raises(plexus.DeviceLostError) as e:
            value(rows)
        assert "shrank from 3 to 2 devices" in str(e.value), e.value
        assert "split over the slice's devices" in str(e.value), e.value
        # The slice computes on its new size.
        double = s.program("scale", plexus.Spec((3,), "float32"), factor=2.0)
        np.testing.assert_array_equal(value(double(whole)), [2, 4, 6])


def test_a_value_waited_for_survives_a_shrink_right_after():
    """A replicated value plexus.wait returned for (every worker said its
    copy was ready) is done: a host killed right after, the slice shrinks
    and the value moves onto the smaller map. Four tries (6 -> 5 -> 4 ->
    3 -> 2); a kill right after the wait is what a training loop does when
    a host dies between two steps."""
    with pytest.raises(plexus.ClusterExitError, match="SIGKILL"):
        with plexus.local(hosts=6) as cluster:
            client = cluster.connect(name="waited")
            s = client.slice(6, placement="spread", on_loss="shrink",
                             min_devices=2)
            x = s.put(np.arange(256, dtype=np.float32))
            lost = []
            for _ in range(4):
                double = s.program("scale", plexus.Spec((256,), "float32"),
                                   factor=2.0)
                value(double(x))  # loaded and compiled on this size
                pid = next(int(w["pid"]) for w in cluster.status()["workers"]
                           if w["alive"] and w["host_name"] == hosts_of(s)[-1])
                resizes, n = s.resizes, s.num_devices
                y = double(x)
                plexus.wait(y, timeout=WAIT_S)
                os.kill(pid, signal.SIGKILL)
                await_resize(cluster, s, resizes, n - 1)
                try:
                    np.testing.assert_array_equal(value(y),
                                                  2 * np.arange(256))
                except plexus.DeviceLostError as e:
                    lost.append(str(e))
            assert not lost, lost


def test_bad_loss_policies_are_refused():
    with plexus.local(hosts=1) as cluster:
        client = cluster.connect(name="policies")
        with pytest.raises(plexus.InvalidArgumentError, match="on_loss"):
            client.slice(1, on_loss="sometimes")
        with pytest.raises(plexus.InvalidArgumentError,
                           match=r"\(on_loss or on_preempt shrink\)"):
            client.slice(1, grow=True)
        with pytest.raises(plexus.InvalidArgumentError,
                           match="elastic_axis 'model'"):
            client.slice(1, on_loss="shrink", elastic_axis="model")
