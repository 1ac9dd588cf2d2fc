"""slice.resize against a real cluster: a slice shrinks and grows while its
values live (split ones re-split over the new size, replicated ones copied),
calls go on with the moved values, refusals name the value and the sizes
that would fit and change nothing, and a data-parallel loop trains through
4 -> 2 -> 4 hosts matching the same steps computed in one process."""
import json

import numpy as np
import pytest

import plexus

WAIT_S = 60


def hosts_of(s):
    return [d["host"] for d in s.devices]


@pytest.fixture(scope="module")
def cluster():
    with plexus.local(hosts=4) as c:
        yield c


@pytest.fixture
def client(cluster):
    c = cluster.connect(name="resize")
    yield c
    c.close()


def value(f):
    return np.asarray(plexus.wait(f, timeout=WAIT_S))


def test_values_move_through_a_shrink_and_a_growth(client):
    s = client.slice(4, placement="spread")
    assert len(set(hosts_of(s))) == 4
    a = np.arange(64, dtype=np.float32).reshape(16, 4)
    x = s.put(a, plexus.split(0))
    r = s.put(np.float32([1, 2, 3]))
    scale = s.program("scale", plexus.Spec((16, 4), "float32", plexus.split(0)),
                      factor=2.0)
    y = scale(x)  # a computed value, maybe not done when the resize comes
    before = hosts_of(s)

    moved = s.resize(2)
    # x and y: 16x4 float32 over 2 devices (256 bytes each); r: 12 bytes on
    # each of the 2.
    assert moved == {"values_moved": 3, "bytes_moved": 256 + 256 + 24}
    assert s.num_devices == 2 and s.resizes == 1
    assert list(s.mesh_shape) == [2]
    # The first two virtual devices stay where they were.
    assert hosts_of(s) == before[:2]
    np.testing.assert_array_equal(value(x), a)
    np.testing.assert_array_equal(value(y), 2 * a)
    np.testing.assert_array_equal(value(r), [1, 2, 3])
    # A built-in program compiled before runs on the new map.
    z = scale(y)
    np.testing.assert_array_equal(value(z), 4 * a)

    moved = s.resize(4)
    assert moved["values_moved"] == 4
    assert s.num_devices == 4 and s.resizes == 2
    assert len(set(hosts_of(s))) == 4 and hosts_of(s)[:2] == before[:2]
    for f, want in ((x, a), (y, 2 * a), (z, 4 * a)):
        np.testing.assert_array_equal(value(f), want)
    np.testing.assert_array_equal(value(scale(z)), 8 * a)
    # Each shard is where the new map says: a fetch of shard 3 alone reads
    # rows 12..15 from the fourth device.
    np.testing.assert_array_equal(value(r), [1, 2, 3])


def test_a_resize_is_in_the_trace(client, tmp_path):
    s = client.slice(2, placement="spread")
    x = s.put(np.arange(8, dtype=np.float32), plexus.split(0))
    path = tmp_path / "resize.json"
    with client.trace(str(path)):
        s.resize(4)
        value(x)
    trace = json.loads(path.read_text())
    names = [e["name"] for e in trace["traceEvents"]
             if e.get("cat") == "resize" and e["ph"] == "b"]
    assert names == [f"resize: slice {s.id} from 2 to 4 devices, 1 values "
                     "moved (32 bytes)"], names


def test_a_resize_that_cannot_be_met_is_refused_and_changes_nothing(client):
    s = client.slice(2, placement="spread")
    six = np.arange(24, dtype=np.float32).reshape(6, 4)
    x = s.put(six, plexus.split(0))
    with pytest.raises(plexus.InvalidArgumentError) as e:
        s.resize(4)
    msg = str(e.value)
    assert f"buffer {x._f.buffer_id}" in msg and "6" in msg, msg
    assert "that would: 1, 2, 3, 6" in msg, msg
    # Not a multiple of a mesh's other axes is checked too; more devices
    # than the cluster has are refused saying what is short.
    with pytest.raises(plexus.ResourceExhaustedError) as e:
        s.resize(6)
    assert "more to grow" in str(e.value), str(e.value)
    assert s.num_devices == 2 and s.resizes == 0
    np.testing.assert_array_equal(value(x), six)
    with pytest.raises(plexus.InvalidArgumentError) as e:
        s.resize(2, axis="model")
    assert "no mesh axis 'model'" in str(e.value)
    # Released, the value no longer holds the resize back.
    del x
    assert s.resize(3)["values_moved"] == 0
    assert s.num_devices == 3


@pytest.mark.jax_heavy
def test_data_parallel_training_goes_on_through_a_shrink_and_a_growth(client):
    """Linear regression, data parallel: each island's gradient of its rows
    (plexus.jit, partial), summed by all_reduce, applied to replicated
    parameters. The slice goes 4 -> 2 after step 3 and back to 4 after
    step 6; the global batch stays 16 rows. The parameters after every step
    match the same full-batch steps in one process."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    batch, lr, steps = 16, 0.05, 9
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((steps, batch, 4)).astype(np.float32)
    ts = rng.standard_normal((steps, batch)).astype(np.float32)

    def loss(p, x, t):
        return jnp.sum((x @ p[:4] + p[4] - t) ** 2) / batch

    s = client.slice(4, placement="spread")
    grad = plexus.jit(jax.grad(loss), s, name="island_grad",
                      in_shardings=(None, plexus.split(0), plexus.split(0)),
                      out_shardings=plexus.partial())
    all_reduce = s.program("all_reduce",
                           plexus.Spec((5,), "float32", plexus.partial()))
    update = plexus.jit(lambda p, g: p - lr * g, s, name="update")

    want = np.zeros(5, np.float32)
    step_grad = jax.jit(jax.grad(loss))
    p = s.put(want)
    sizes = []
    for k in range(steps):
        if k == 3:
            assert s.resize(2)["values_moved"] >= 1
        elif k == 6:
            assert s.resize(4)["values_moved"] >= 1
        sizes.append(s.num_devices)
        x = s.put(xs[k], plexus.split(0))
        t = s.put(ts[k], plexus.split(0))
        p = update(p, all_reduce(grad(p, x, t)))
        want = want - lr * np.asarray(step_grad(want, xs[k], ts[k]))
        np.testing.assert_allclose(value(p), want, rtol=1e-5, atol=1e-6)
    assert sizes == [4, 4, 4, 2, 2, 2, 4, 4, 4]
