"""jnp.linalg through plexus.jit on CPU workers (issue 23, item 3): JAX
lowers it to custom calls to jaxlib's LAPACK kernels, which the workers
serve with handlers of their own over Debian's LAPACK
(executors/xla/lapack/). Each function is compared with jax.jit in this
process, which runs jaxlib's own kernels, on the same inputs: float32 and
float64 (and complex where JAX has it), batched, sharded over the batch on
a slice of two devices, and on inputs where LAPACK reports a singular or
not positive definite matrix and JAX returns NaNs. A target the workers
have no handler for is still refused while lowering (test_jax_surface.py).

Vectors that LAPACK defines only up to a sign (real) or a phase (complex)
per column (eigenvectors, singular vectors) are compared after fixing it:
two builds of LAPACK (jaxlib's and Debian's OpenBLAS) may pick another
one; everything else is compared as it is."""
import re

import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.lax.linalg import SvdAlgorithm  # noqa: E402

from plexus import _core  # noqa: E402


@pytest.fixture(scope="module")
def client(cluster):
    c = cluster.connect(name="linalg")
    yield c
    c.close()


@pytest.fixture(scope="module")
def s(client):
    return client.slice(1)


@pytest.fixture(scope="module")
def pair(client):
    # Two devices of one host: one island, the batch split across them.
    return client.slice(2, placement="one_host")


RNG = np.random.default_rng(23)
RTOL = {np.float32: 2e-4, np.complex64: 2e-4,
        np.float64: 1e-10, np.complex128: 1e-10}


def general(shape, dtype):
    """Well-conditioned matrices: random plus n on the diagonal."""
    n = shape[-1]
    x = RNG.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * RNG.standard_normal(shape)
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        x = x + n * np.eye(n)
    return x.astype(dtype)


def hermitian_pd(shape, dtype):
    x = general(shape, dtype)
    return (x @ np.conj(np.swapaxes(x, -1, -2)) +
            shape[-1] * np.eye(shape[-1])).astype(dtype)


def fix_phase(v, rows=False):
    """Each column of v (..., n, k) (each row, with `rows`) scaled to make
    its largest entry real and positive: eigenvectors and singular vectors
    as LAPACK leaves them differ at most by that."""
    v = np.asarray(v)
    if rows:
        return np.swapaxes(fix_phase(np.swapaxes(v, -1, -2)), -1, -2)
    idx = np.argmax(np.abs(v), axis=-2)[..., None, :]
    top = np.take_along_axis(v, idx, axis=-2)
    return v * (np.abs(top) / np.where(top == 0, 1, top))


def same(got, want, dtype, *, phase=None):
    """Same shape, dtype and values (NaN where jax.jit has NaN) as
    jax.jit's result; `phase` "cols" / "rows": vectors up to a sign or
    phase."""
    got_a, want_a = np.asarray(got), np.asarray(want)
    assert got_a.dtype == want_a.dtype, (got_a.dtype, want_a.dtype)
    assert got_a.shape == want_a.shape, (got_a.shape, want_a.shape)
    if phase:
        got_a = fix_phase(got_a, rows=phase == "rows")
        want_a = fix_phase(want_a, rows=phase == "rows")
    rtol = RTOL[np.dtype(dtype).type]
    finite = np.abs(want_a[np.isfinite(want_a)])
    scale = finite.max() if finite.size else 1
    np.testing.assert_allclose(got_a, want_a, rtol=rtol,
                               atol=rtol * max(scale, 1), equal_nan=True)


def check(fn, args, dtype, where, phased=None, **jit_kwargs):
    """fn through plexus.jit on `where` and through jax.jit: the same
    outputs (a pytree), the leaves `phased` names ({position: "cols" or
    "rows"}) up to phase."""
    got = plexus.jit(fn, where, **jit_kwargs)(*args)
    want = jax.jit(fn)(*args)
    got_leaves = jax.tree_util.tree_leaves(got)
    want_leaves = jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        same(g, w, dtype, phase=(phased or {}).get(i))


# name -> (function, the inputs for a batch shape, size and dtype, the
# outputs compared up to phase, whether complex inputs are taken)
CASES = {
    "solve": (jnp.linalg.solve,
              lambda b, n, t: (general(b + (n, n), t),
                               general(b + (n, 2), t)), (), True),
    "inv": (jnp.linalg.inv, lambda b, n, t: (general(b + (n, n), t),), (),
            True),
    "det": (jnp.linalg.det, lambda b, n, t: (general(b + (n, n), t),), (),
            True),
    "slogdet": (lambda a: tuple(jnp.linalg.slogdet(a)),
                lambda b, n, t: (general(b + (n, n), t),), (), True),
    "lu": (lambda a: tuple(jax.lax.linalg.lu(a)),
           lambda b, n, t: (general(b + (n, n + 1), t),), (), True),
    "cholesky": (jnp.linalg.cholesky,
                 lambda b, n, t: (hermitian_pd(b + (n, n), t),), (), True),
    "eigh": (lambda a: tuple(jnp.linalg.eigh(a)),
             lambda b, n, t: (hermitian_pd(b + (n, n), t),), {1: "cols"},
             True),
    "svd": (lambda a: tuple(jnp.linalg.svd(a)),
            lambda b, n, t: (general(b + (n + 2, n), t),),
            {0: "cols", 2: "rows"}, True),
    "svd_thin": (lambda a: tuple(jnp.linalg.svd(a, full_matrices=False)),
                 lambda b, n, t: (general(b + (n, n + 2), t),),
                 {0: "cols", 2: "rows"}, True),
    "svdvals": (lambda a: jnp.linalg.svd(a, compute_uv=False),
                lambda b, n, t: (general(b + (n, n + 1), t),), (), True),
    "svd_qr_algorithm": (
        lambda a: tuple(jax.lax.linalg.svd(a, algorithm=SvdAlgorithm.QR)),
        lambda b, n, t: (general(b + (n + 1, n), t),),
        {0: "cols", 2: "rows"}, True),
    "qr": (lambda a: tuple(jnp.linalg.qr(a)),
           lambda b, n, t: (general(b + (n + 2, n), t),), (), True),
    "qr_complete": (lambda a: tuple(jnp.linalg.qr(a, mode="complete")),
                    lambda b, n, t: (general(b + (n, n + 2), t),), (), True),
    "eig": (lambda a: tuple(jnp.linalg.eig(a)),
            lambda b, n, t: (general(b + (n, n), t),), {1: "cols"}, True),
    "eigvals": (jnp.linalg.eigvals,
                lambda b, n, t: (general(b + (n, n), t),), (), True),
    "lstsq": (jnp.vectorize(lambda a, y: jnp.linalg.lstsq(a, y)[0],
                            signature="(m,n),(m)->(n)"),
              lambda b, n, t: (general(b + (n + 2, n), t),
                               general(b + (n + 2,), t)), (), True),
    "pinv": (jnp.linalg.pinv, lambda b, n, t: (general(b + (n, n + 1), t),),
             (), True),
    "solve_triangular": (
        lambda a, y: jax.scipy.linalg.solve_triangular(a, y, lower=True),
        lambda b, n, t: (general(b + (n, n), t), general(b + (n, 3), t)), (),
        True),
    "cho_solve": (
        lambda a, y: jax.scipy.linalg.cho_solve(
            (jnp.linalg.cholesky(a), True), y),
        lambda b, n, t: (hermitian_pd(b + (n, n), t), general(b + (n, 1), t)),
        (), True),
}


def eig_sorted(fn):
    """eig's eigenvalues (and vectors) in one order: LAPACK gives them in
    the order it finds them, which two builds need not share."""
    def sorted_fn(a):
        out = fn(a)
        w = out[0] if isinstance(out, tuple) else out
        order = jnp.lexsort((jnp.round(w.imag, 3), jnp.round(w.real, 3)),
                            axis=-1)
        w = jnp.take_along_axis(w, order, axis=-1)
        if not isinstance(out, tuple):
            return w
        v = jnp.take_along_axis(out[1], order[..., None, :], axis=-1)
        return w, v
    return sorted_fn


def case(name):
    fn, inputs, phased, _ = CASES[name]
    if name in ("eig", "eigvals"):
        fn = eig_sorted(fn)
    return fn, inputs, phased


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_each_function_equals_jax_jit_batched(s, name, dtype):
    fn, inputs, phased = case(name)
    with jax.enable_x64(dtype == np.float64):
        for batch in [(), (3,), (2, 2)]:
            check(fn, inputs(batch, 4, dtype), dtype, s, phased)


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c[3]))
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_inputs_equal_jax_jit(s, name, dtype):
    fn, inputs, phased = case(name)
    with jax.enable_x64(dtype == np.complex128):
        check(fn, inputs((2,), 3, dtype), dtype, s, phased)


@pytest.mark.parametrize("name", ["solve", "cholesky", "eigh", "svd", "qr",
                                  "eig", "inv"])
def test_a_batch_split_over_two_devices_equals_jax_jit(pair, name):
    fn, inputs, phased = case(name)
    args = inputs((4,), 4, np.float32)
    check(fn, args, np.float32, pair, phased,
          in_shardings=plexus.split(0), out_shardings=plexus.split(0))


def test_singular_and_not_positive_definite_matrices_give_what_jax_jit_gives(
        s):
    singular = np.array([[[1, 2], [2, 4]], [[2, 0], [0, 3]]], np.float32)
    not_pd = np.array([[[1, 2], [2, 1]], [[4, 2], [2, 3]]], np.float64)
    with jax.enable_x64(True):
        # LAPACK's info > 0 for the first matrix of each batch: NaNs where
        # JAX puts them (cholesky), an infinite or NaN solution, a zero
        # determinant; the second matrix is computed as usual.
        for fn, a, dtype in [
                (jnp.linalg.cholesky, not_pd, np.float64),
                (jnp.linalg.inv, singular, np.float32),
                (jnp.linalg.det, singular, np.float32),
                (lambda a: jnp.linalg.solve(a, jnp.ones(a.shape[:-1])),
                 singular, np.float32),
                (lambda a: tuple(jax.lax.linalg.lu(a)), singular,
                 np.float32)]:
            got = jax.tree_util.tree_leaves(plexus.jit(fn, s)(a))
            want = jax.tree_util.tree_leaves(jax.jit(fn)(a))
            for g, w in zip(got, want):
                same(g, w, dtype)
        chol = np.asarray(plexus.jit(jnp.linalg.cholesky, s)(not_pd))
        assert np.isnan(chol[0][np.tril_indices(2)]).all()
        assert np.isfinite(chol[1]).all()
        # A matrix of NaNs: eigh's info > 0, NaNs as in jax.jit.
        nan = np.full((1, 3, 3), np.nan)
        check(lambda a: tuple(jnp.linalg.eigh(a)), (nan,), np.float64, s)
        check(lambda a: jnp.linalg.svd(a, compute_uv=False), (nan,),
              np.float64, s)


def test_the_served_targets_are_those_jnp_linalg_lowers_to():
    # Every LAPACK target jax.jit reaches from the cases above, in every
    # dtype, is served; the client's list is the workers'.
    served = set(_core.lapack_targets())
    reached = set()
    for name, (fn, inputs, _, _) in CASES.items():
        for dtype in (np.float32, np.float64, np.complex64, np.complex128):
            with jax.enable_x64(True):
                text = jax.jit(fn).lower(*inputs((2,), 3, dtype)).as_text()
            reached.update(re.findall(r"@(lapack_\w+)", text))
    assert reached <= served, reached - served
    assert len(served) == 36
