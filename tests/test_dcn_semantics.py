"""plexus.jit across islands (issue 23, item 2): a function whose input is
split over an axis that crosses islands either computes what jax.jit
computes over the whole array, or is refused when it is lowered, naming
the program, the output and the axis, and saying what to write instead
(python/plexus/_dcn_check.py). Before the check, the refused cases ran and
gave each island's own answer (a half-sum of 12.0 for jax.jit's 24.0)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import plexus  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

ROWS = plexus.split(0)


@pytest.fixture(scope="module")
def client(cluster):
    c = cluster.connect(name="dcn-semantics")
    yield c
    c.close()


@pytest.fixture(scope="module")
def spread(client):
    """4 devices over the 2 hosts: the slice's one axis crosses islands."""
    s = client.slice(4, placement="spread")
    assert len(s.islands) == 2
    return s


@pytest.fixture(scope="module")
def mesh(client):
    """{data: 2, model: 2}, data across the 2 hosts."""
    return client.slice(mesh={"data": 2, "model": 2}, dcn_axes=("data",))


def rows(n=8, m=3):
    return np.arange(n * m, dtype=np.float32).reshape(n, m) / 7 - 1


def refused(program, *specs, match):
    """The program is refused while it is lowered, before anything runs."""
    with pytest.raises(plexus.InvalidArgumentError, match=match):
        program.lower(*specs)


# ------------------------------------------ what differed, now refused


def test_a_sum_over_the_split_dimension_into_a_replicated_output(spread):
    x = np.arange(8, dtype=np.float32) * 0 + 3  # jax.jit: 24.0
    total = plexus.jit(lambda x: jnp.sum(x), spread, name="total",
                       in_shardings=ROWS)
    refused(total, plexus.Spec(x.shape, "float32", ROWS),
            match=r"program 'total' output: reduce_sum over dimension 0, "
                  r"split across islands over 'devices'.*"
                  r"out_shardings=plexus\.partial\(\).*all_reduce")


def test_random_draws_over_a_split_dimension(spread):
    def noisy(x, key):
        return x + jax.random.normal(key, x.shape)

    program = plexus.jit(noisy, spread, name="noisy",
                         in_shardings=(ROWS, None), out_shardings=ROWS)
    refused(program, plexus.Spec((8, 3), "float32", ROWS),
            jax.ShapeDtypeStruct((2,), jnp.uint32),
            match=r"program 'noisy' output: add combines dimension 0, split "
                  r"across islands over 'devices', with random_bits over "
                  r"the island's shape \(the same numbers on every island\)"
                  r".*Split that value over the same axis")


def test_centring_on_the_mean_of_a_split_dimension(spread):
    centre = plexus.jit(lambda x: x - x.mean(0), spread, name="centre",
                        in_shardings=ROWS, out_shardings=ROWS)
    refused(centre, plexus.Spec((8, 3), "float32", ROWS),
            match=r"program 'centre' output: sub combines a per-island addend "
                  r"\(reduce_sum over dimension 0, split across islands "
                  r"over 'devices'\).*plexus\.partial\(\).*all_reduce.*"
                  r"second program")


def test_a_mesh_names_the_dcn_axis_and_the_output_path(mesh):
    def stats(x):
        return {"scaled": x * 2, "peak": jnp.max(x, axis=0)}

    program = plexus.jit(stats, mesh, name="stats",
                         in_shardings=P("data", "model"),
                         out_shardings={"scaled": P("data", "model"),
                                        "peak": P("model")})
    refused(program, plexus.Spec((8, 4), "float32", P("data", "model")),
            match=r"program 'stats' output \['peak'\]: reduce_max over "
                  r"dimension 0, which is split across islands over 'data'")


def test_a_primitive_the_check_does_not_know_is_named(spread):
    # fft is in none of the check's rule families (cholesky was, until the
    # workers' missing LAPACK kernels were refused before it).
    def spectrum(x):
        return jnp.fft.fft(x).real

    f = plexus.jit(spectrum, spread, name="spectrum", in_shardings=ROWS,
                   out_shardings=ROWS)
    refused(f, plexus.Spec((4, 3, 3), "float32", ROWS),
            match=r"program 'spectrum' output: fft takes a value that "
                  r"differs between islands.*'devices'")
    # Replicated, it reaches no island's part: the island's is jax.jit's.
    plexus.jit(spectrum, spread).lower(plexus.Spec((4, 3, 3), "float32"))


# ------------------------------------------ what equals jax.jit, still runs


def test_elementwise_and_loops_of_a_split_input_equal_jax_jit(spread):
    def f(x):
        y = jnp.tanh(x) * 2 + 1
        return jax.lax.fori_loop(0, 3, lambda i, c: c + y, jnp.zeros_like(y))

    x = rows()
    got = plexus.jit(f, spread, in_shardings=ROWS, out_shardings=ROWS)(x)
    np.testing.assert_allclose(np.asarray(got), jax.jit(f)(x), rtol=1e-5, atol=1e-6)


def test_elementwise_primitives_of_jax_0_12_equal_jax_jit(spread):
    # jax 0.12 writes tanh's derivative as one_minus_square, jnp.log2 as
    # log2 and jnp.polyval as polynomial (older jax: mul and sub, log and
    # div, a scan); the check did not know them and refused every gradient
    # through tanh.
    def f(x):
        dtanh = jax.grad(lambda x: jnp.sum(jnp.tanh(x)))(x)
        poly = jnp.polyval(jnp.array([2., -1, 3]), x)
        return dtanh, jnp.log2(1 + x * x), poly

    x = rows()
    got = plexus.jit(f, spread, in_shardings=ROWS, out_shardings=ROWS)(x)
    for g, want in zip(got, jax.jit(f)(x)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


def test_matmuls_with_the_split_dimension_free_or_batched_equal_jax_jit(
        spread):
    def f(x, w, a, b):
        return x @ w, jnp.einsum("bij,bjk->bik", a, b)

    x, w = rows(), rows(3, 5)
    a = np.arange(8 * 2 * 3, dtype=np.float32).reshape(8, 2, 3) / 10
    b = np.arange(8 * 3 * 2, dtype=np.float32).reshape(8, 3, 2) / 10
    got = plexus.jit(f, spread, in_shardings=(ROWS, None, ROWS, ROWS),
                     out_shardings=ROWS)(x, w, a, b)
    for g, want in zip(got, jax.jit(f)(x, w, a, b)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


def test_a_reduction_over_a_dimension_that_is_not_split(spread):
    x = rows()
    f = lambda x: jnp.max(x, axis=1) + jnp.sum(x, axis=1)  # noqa: E731
    got = plexus.jit(f, spread, in_shardings=ROWS, out_shardings=ROWS)(x)
    np.testing.assert_allclose(np.asarray(got), jax.jit(f)(x), rtol=1e-5, atol=1e-6)


def test_a_partial_sum_and_all_reduce_equal_jax_jits_sum(spread, mesh):
    x = rows()
    part = plexus.jit(lambda x: jnp.sum(x) / 2, spread, in_shardings=ROWS,
                      out_shardings=plexus.partial())(x)
    total = spread.program("all_reduce", part)(part)
    np.testing.assert_allclose(np.asarray(total),
                               jax.jit(lambda x: jnp.sum(x) / 2)(x),
                               rtol=1e-5, atol=1e-6)
    x4 = rows(8, 4)
    part = plexus.jit(lambda x: jnp.sum(x), mesh,
                      in_shardings=P("data", "model"),
                      out_shardings=plexus.partial())(x4)
    total = mesh.program("all_reduce", part)(part)
    np.testing.assert_allclose(np.asarray(total), jnp.sum(x4), rtol=1e-5, atol=1e-6)


def test_a_per_island_sum_padded_with_zeros_stays_a_sum(spread):
    # jnp.pad's fill is an integer 0 converted to the float dtype: the
    # conversion kept no record that it was zero, so padding the partial
    # gradient (the elastic example's island_grad) was refused.
    def f(x):
        return jnp.pad(x.sum(0), (0, 3))

    x = rows()
    part = plexus.jit(f, spread, in_shardings=ROWS,
                      out_shardings=plexus.partial())(x)
    total = spread.program("all_reduce", part)(part)
    np.testing.assert_allclose(np.asarray(total), jax.jit(f)(x), rtol=1e-5)
