"""PartitionSpecs over meshes of several axes (issue 12, item 1): every
PartitionSpec of a 3-axis mesh {data: 2, fsdp: 2, tensor: 2} (8 devices on
2 hosts x 4) for a rank-3 array, put, fetched and moved to slices of other
meshes, each checked against numpy; built-in programs that take them and
those that refuse them; slices with DCN axes."""
import itertools

import numpy as np
import pytest

import plexus

MESH = {"data": 2, "fsdp": 2, "tensor": 2}
SHAPE = (8, 8, 8)


def every_spec(axes, rank):
    """Every PartitionSpec of `axes` over `rank` dimensions: each axis
    unused or on one dimension, in every order within a dimension."""
    specs = []
    for place in itertools.product(range(-1, rank), repeat=len(axes)):
        per_dim = [[a for a, d in zip(axes, place) if d == dim]
                   for dim in range(rank)]
        for orders in itertools.product(*(itertools.permutations(p)
                                          for p in per_dim)):
            specs.append(plexus.P(*(None if not o else o[0] if len(o) == 1
                                    else tuple(o) for o in orders)))
    return specs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=4, log_file=str(log)) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    c = cluster.connect(name="mesh")
    yield c
    c.close()


@pytest.fixture(scope="module")
def mesh_slice(client):
    return client.slice(mesh=MESH, dcn_axes=("data",))


def test_every_spec_of_the_3_axis_mesh_is_counted():
    # Rank 3, axes a, b, c: 1 + 3*3 + 3*12 + 60 layouts.
    assert len(every_spec(tuple(MESH), 3)) == 106
    assert len(set(every_spec(tuple(MESH), 3))) == 106


def test_slice_with_a_named_mesh_and_dcn_axes(mesh_slice):
    assert mesh_slice.mesh == MESH
    assert mesh_slice.dcn_axes == ("data",)
    workers = [d["worker"] for d in mesh_slice.devices]
    # data is the island: devices 0-3 on one host, 4-7 on the other.
    assert len(set(workers[:4])) == 1 and len(set(workers[4:])) == 1
    assert workers[0] != workers[4]


def test_dcn_axes_that_do_not_match_the_islands_are_refused(client):
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"dcn_axes \('tensor',\).*island"):
        client.slice(mesh=MESH, dcn_axes=("tensor",))
    with pytest.raises(plexus.InvalidArgumentError, match="'pipeline'"):
        client.slice(mesh=MESH, dcn_axes=("pipeline",))


def test_put_and_fetch_every_spec(mesh_slice):
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    for spec in every_spec(tuple(MESH), 3):
        f = mesh_slice.put(x, spec)
        np.testing.assert_array_equal(np.asarray(f), x, err_msg=repr(spec))


def test_move_every_spec_to_slices_of_other_meshes(client, mesh_slice):
    """Each layout of the 3-axis mesh moves to a layout of a 2-axis mesh
    on 4 devices (cycling through all of them), to another layout of the
    same mesh, and to a 1-D split on another slice; each result is checked
    against numpy, fetched from its own layout."""
    other = client.slice(mesh={"x": 2, "y": 2})
    line = client.slice(2)
    a_specs = every_spec(tuple(MESH), 3)
    b_specs = every_spec(("x", "y"), 3)
    assert len(b_specs) == 19
    rng = np.random.default_rng(0)
    moves = {}

    def mover(s, spec):
        key = (s.id, spec)
        if key not in moves:
            moves[key] = s.program("identity",
                                   plexus.Spec(SHAPE, "float32", spec))
        return moves[key]

    for i, spec in enumerate(a_specs):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        f = mesh_slice.put(x, spec)
        to_b = b_specs[i % len(b_specs)]
        to_a = a_specs[(i * 37 + 11) % len(a_specs)]
        for s, target in ((other, to_b), (mesh_slice, to_a),
                          (line, plexus.P("devices"))):
            moved = mover(s, target)(f)
            np.testing.assert_array_equal(
                np.asarray(moved), x, err_msg=f"{spec!r} -> {target!r}")
        # And back from the other mesh to this one.
        back = mover(mesh_slice, spec)(mover(other, to_b)(f))
        np.testing.assert_array_equal(np.asarray(back), x,
                                      err_msg=f"{to_b!r} -> {spec!r}")


def test_jax_partition_specs_and_elementwise_programs(mesh_slice):
    jax = pytest.importorskip("jax")
    spec = jax.sharding.PartitionSpec(("fsdp", "data"), None, "tensor")
    x = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    f = mesh_slice.put(x, spec)
    assert f.sharding == ("P(('fsdp', 'data'), None, 'tensor') over "
                          "{data: 2, fsdp: 2, tensor: 2}")
    add = mesh_slice.program("add", f, f)
    scale = mesh_slice.program("scale", f, factor=3.0)
    np.testing.assert_array_equal(np.asarray(scale(add(f, f))), 6 * x)


def test_builtins_that_do_not_take_mesh_layouts_refuse_clearly(mesh_slice):
    f = mesh_slice.put(np.ones((8, 8), np.float32), plexus.P("data", "fsdp"))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'reduce_sum' argument 0: kernel "
                             r"'reduce_sum' takes replicated, split or "
                             r"partial inputs, not P\('data', 'fsdp'\).*"
                             r"several axes: add, identity"):
        mesh_slice.program("reduce_sum", f)
    assert plexus.builtins.identity.mesh_shardings
    assert not plexus.builtins.matmul.mesh_shardings


def test_bad_partition_specs_name_the_problem(mesh_slice):
    x = np.zeros((6, 4), np.float32)
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"dimension 0 of float32\[6, 4\] \(length 6\) "
                             r"does not split evenly into 4 blocks"):
        mesh_slice.put(x, plexus.P(("data", "fsdp")))
    with pytest.raises(ValueError, match="names mesh axis 'data' twice"):
        mesh_slice.put(x, plexus.P("data", "data"))
    with pytest.raises(ValueError, match="'model', which is not an axis"):
        mesh_slice.put(x, plexus.P("model"))
