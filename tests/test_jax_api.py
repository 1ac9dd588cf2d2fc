"""plexus.jit takes what jax.jit takes (every whole-byte dtype, typed and
raw PRNG keys, donate_argnums, errors as Plexus errors naming the program
and the argument), and futures are JAX values (jnp functions, jax.jit,
jax.device_get fetch them). Checked against jax.jit in this process, on a
real embedded cluster."""
import warnings

import numpy as np
import pytest

import plexus

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402  (a JAX dependency)

# Every whole-byte dtype JAX has that the x64 switch leaves as it is.
WHOLE_BYTE = ["int8", "int16", "int32", "uint8", "uint16", "uint32",
              "bool", "float16", "bfloat16", "float32", "complex64",
              "float8_e5m2", "float8_e4m3fn", "float8_e4m3b11fnuz",
              "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e4m3",
              "float8_e3m4", "float8_e8m0fnu"]


def np_dtype(name):
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def sample(dtype, shape=(8, 4)):
    """Small values every dtype holds exactly (e8m0: powers of two)."""
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype.name == "float8_e8m0fnu":
        return (2.0 ** (np.arange(n) % 5)).astype(dtype).reshape(shape)
    values = (np.arange(n) % 7) + 1
    if dtype.kind == "c":
        return (values + 1j * (values % 3)).astype(dtype).reshape(shape)
    return values.astype(dtype).reshape(shape)


def affine(x):
    """Arithmetic in the array's own dtype (a float compute for 8-bit
    floats, which have no arithmetic of their own in XLA's CPU backend)."""
    if x.dtype == jnp.bool_:
        return ~x
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize == 1:
        return (x.astype(jnp.float32) * 2).astype(x.dtype)
    return x * 3 + 1


@pytest.mark.parametrize("name", WHOLE_BYTE)
def test_every_whole_byte_dtype_moves_and_computes_like_jax_jit(client, name):
    dtype = np_dtype(name)
    s = client.slice(2, placement="spread")
    x = sample(dtype)
    xf = s.put(x, plexus.split(0))
    assert xf.dtype == dtype
    assert np.asarray(xf).tobytes() == x.tobytes()
    got = plexus.jit(affine, s, in_shardings=plexus.split(0),
                     out_shardings=plexus.split(0))(xf)
    want = jax.jit(affine)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_64_bit_dtypes_with_x64_enabled(client):
    s = client.slice(1)
    with jax.enable_x64(True):
        for name in ("uint64", "int64", "float64", "complex128"):
            x = sample(np.dtype(name), (4,))
            got = plexus.jit(affine, s)(x)
            want = jax.jit(affine)(x)
            assert got.dtype == np.dtype(name)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_partial_sums_of_new_dtypes_are_added_and_8_bit_floats_refused(
        client):
    s = client.slice(2, placement="spread")
    for name in ("uint32", "int16", "complex64"):
        x = sample(np.dtype(name))
        part = plexus.jit(lambda x: x, s, in_shardings=plexus.split(0),
                          out_shardings=plexus.partial())(
            s.put(x, plexus.split(0)))
        total = s.program("all_reduce", part)(part)
        np.testing.assert_array_equal(
            np.asarray(total), x[:4] + x[4:])
    x8 = sample(np_dtype("float8_e4m3fn"))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'same' output 0: a partial "
                             r"float8_e4m3fn\[4, 4\] cannot be summed"):
        plexus.jit(lambda x: x, s, name="same",
                   in_shardings=plexus.split(0),
                   out_shardings=plexus.partial())(x8)


def test_sub_byte_dtypes_are_refused_naming_the_argument(client):
    s = client.slice(1)

    def f(x, params):
        return x + params["q"].astype(jnp.float32)

    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'f' argument params\['q'\]: dtype int4 "
                             r"has elements smaller than a byte"):
        plexus.jit(f, s)(np.ones(3, np.float32),
                         {"q": np.ones(3, ml_dtypes.int4)})
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"int4.*smaller than a byte"):
        s.put(np.ones(4, ml_dtypes.int4))


def test_raw_keys_and_uint32_bits_match_jax_jit(client):
    s = client.slice(1)

    def bits(key):
        key, sub = jax.random.split(key)
        return key, jax.random.bits(sub, (16,), jnp.uint32)

    key = jax.random.PRNGKey(3)  # uint32[2]
    k1, b1 = plexus.jit(bits, s)(key)
    k2, b2 = plexus.jit(bits, s)(k1)  # a raw key future goes back in
    want_k1, want_b1 = jax.jit(bits)(key)
    want_k2, want_b2 = jax.jit(bits)(want_k1)
    assert b1.dtype == np.uint32
    np.testing.assert_array_equal(np.asarray(b1), want_b1)
    np.testing.assert_array_equal(np.asarray(b2), want_b2)
    np.testing.assert_array_equal(np.asarray(k2), want_k2)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_typed_keys_go_in_and_come_out_like_jax_jit(client, impl):
    s = client.slice(2, placement="spread")

    def step(key, x):
        key, sub = jax.random.split(key)
        return key, x + jax.random.normal(sub, x.shape)

    key = jax.random.key(0, impl=impl)
    x = np.zeros((4, 2), np.float32)
    prog = plexus.jit(step, s)
    k, y = prog(key, x)
    assert k.dtype == key.dtype and k.shape == ()
    k, y = prog(k, y)  # the key future, rewrapped inside the function
    want_k, want_y = jax.jit(step)(key, x)
    want_k, want_y = jax.jit(step)(want_k, want_y)
    np.testing.assert_array_equal(np.asarray(y), want_y)
    got_k = k.result()
    assert got_k.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(got_k),
                                  jax.random.key_data(want_k))
    if impl == "rbg":
        return  # rbg's bits depend on how XLA partitions (JAX's docs say so)
    # Split keys, split over the slice like any array.
    keys = jax.random.split(key, 4)
    draws = plexus.jit(jax.vmap(lambda k: jax.random.uniform(k, (3,))), s,
                       in_shardings=plexus.split(0),
                       out_shardings=plexus.split(0))(keys)
    np.testing.assert_array_equal(
        np.asarray(draws),
        jax.jit(jax.vmap(lambda k: jax.random.uniform(k, (3,))))(keys))


def test_donated_arguments_are_consumed_as_jax_deletes_them(client):
    # (tests/test_donation.py: memory reuse, what is never written over.)
    s = client.slice(1)

    def update(params, grads):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    params = {"w": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}
    grads = {"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)}
    prog = plexus.jit(update, s, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every donated leaf has its output
        new = prog(params, grads)
        again = prog(new, grads)
    ref = jax.jit(update, donate_argnums=0)
    want_new = ref(jax.tree.map(jnp.asarray, params), grads)
    want = ref(want_new, grads)
    for k in want:
        np.testing.assert_allclose(np.asarray(again[k]), want[k], rtol=1e-6)
        # As jax.jit deletes a donated array, Plexus refuses a donated
        # future, naming the program that took it.
        assert want_new[k].is_deleted()
        with pytest.raises(plexus.InvalidArgumentError,
                           match="was donated to program 'update'"):
            np.asarray(new[k])
    with pytest.raises(plexus.InvalidArgumentError,
                       match="argument 0 is both static and donated"):
        plexus.jit(update, s, static_argnums=0, donate_argnums=0)


def test_errors_while_tracing_or_lowering_are_plexus_errors(client):
    s = client.slice(1)

    def bad(x, params):
        return x @ params["w"]

    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'bad': JAX could not trace the function "
                             r"for arguments \(x: float32\[4, 4\] replicated, "
                             r"params\['w'\]: float32\[5, 5\] replicated\): "
                             r"TypeError: dot_general"):
        plexus.jit(bad, s)(np.zeros((4, 4), np.float32),
                           {"w": np.zeros((5, 5), np.float32)})

    def unimplemented(x):
        raise NotImplementedError("not yet")

    with pytest.raises(plexus.UnimplementedError,
                       match=r"program 'unimplemented'.*arguments \(x: "
                             r"float32\[2\].*NotImplementedError: not yet"):
        plexus.jit(unimplemented, s)(np.zeros(2, np.float32))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'f' argument x: P\('model'\) names "
                             r"'model', which is not an axis of the slice's "
                             r"mesh"):
        plexus.jit(lambda x: x, s, name="f",
                   in_shardings=plexus.P("model"))(np.zeros(2, np.float32))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'g' argument y: dtype <U5 is not an array "
                             r"dtype JAX and Plexus share"):
        plexus.jit(lambda y: y, s, name="g")("hello")


def test_futures_are_jax_values(client):
    s = client.slice(2, placement="spread")
    x = np.arange(8, dtype=np.float32)
    f = s.put(x, plexus.split(0))
    assert float(jnp.sum(f)) == x.sum()
    np.testing.assert_array_equal(jnp.dot(f, f), x @ x)
    np.testing.assert_array_equal(jnp.asarray(f) + 1, x + 1)
    np.testing.assert_array_equal(jax.jit(lambda a: a * 2)(f), x * 2)
    np.testing.assert_array_equal(
        jax.grad(lambda a: jnp.sum(a * a))(f), 2 * x)
    got = jax.device_get({"a": f, "b": [f]})
    assert isinstance(got["a"], np.ndarray)
    np.testing.assert_array_equal(got["b"][0], x)
    # Still a Plexus future to Plexus: its sharding, a leaf of pytrees.
    assert f.sharding == "split(0)"
    assert jax.tree_util.tree_leaves({"a": f}) == [f]
    # A key future is a key to JAX.
    keys = plexus.jit(lambda: jax.random.split(jax.random.key(1), 2), s)()
    np.testing.assert_array_equal(
        jax.jit(jax.random.key_data)(keys),
        jax.random.key_data(jax.random.split(jax.random.key(1), 2)))


def test_built_in_kernels_refuse_the_new_dtypes_naming_the_argument(client):
    s = client.slice(1)
    u = s.put(np.arange(4, dtype=np.uint32))
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"program 'twice' argument 0: kernel 'scale' "
                             r"computes in float32.*not uint32"):
        s.program("scale", u, name="twice", factor=2.0)
    # Kernels that only move bytes take them.
    same = s.program("busy_wait", u, micros=0)(u)
    np.testing.assert_array_equal(np.asarray(same), np.arange(4))


def test_the_positional_fast_path_tells_pytrees_of_the_same_futures_apart(
        client):
    # A call whose arguments are all futures, positional, is found by their
    # signatures alone (no flattening); a call with the same futures in a
    # list, or by keyword, is another program, and each computes its own.
    s = client.slice(1)

    def f(a, b=None):
        if isinstance(a, list):
            return a[0] * 10 + b
        return a - b

    prog = plexus.jit(f, s)
    x = s.put(np.full(3, 5.0, np.float32))
    y = s.put(np.full(3, 2.0, np.float32))
    for _ in range(2):  # the second call of each takes the fast paths
        np.testing.assert_array_equal(np.asarray(prog(x, y)), [3, 3, 3])
        np.testing.assert_array_equal(np.asarray(prog([x], y)),
                                      [52, 52, 52])
        np.testing.assert_array_equal(np.asarray(prog(x, b=y)), [3, 3, 3])
    assert prog.compiled_signatures == 3
    # A single output is the future itself; a tuple of one stays a tuple.
    assert isinstance(prog(x, y), plexus.Future)
    one = plexus.jit(lambda a: (a + 1,), s)
    for _ in range(2):
        got = one(x)
        assert isinstance(got, tuple) and len(got) == 1
        np.testing.assert_array_equal(np.asarray(got[0]), [6, 6, 6])


def test_a_chained_calls_outputs_carry_the_signature_their_specs_give(client):
    # plexus.jit's fast path keys a call by its futures' signatures; a
    # program's outputs take the first call's (no spec read per call).
    # They must be what each future's own specs, key impl and weak type
    # say, for keys, weak types and both shardings; and a loop of chained
    # calls compiles once for the chained signature.
    from plexus._future import numbered, signature
    s = client.slice(2, placement="spread")

    def step(key, x, n):
        key, _ = jax.random.split(key)
        return key, x * 2 + 1, n + 1

    prog = plexus.jit(step, s, in_shardings=(None, plexus.split(0), None),
                      out_shardings=(None, plexus.split(0), None))
    k, y, n = jax.random.key(0), np.zeros((4, 2), np.float32), 0
    for _ in range(4):
        k, y, n = prog(k, y, n)
        for out in (k, y, n):
            fresh = (out._f.shape, out._f.dtype, out._f.sharding, out._key,
                     out._weak)
            assert signature(out) == numbered(fresh)
        assert k._key is not None and n.weak_type and not y.weak_type
    assert prog.compiled_signatures == 1
    assert int(n) == 4
    np.testing.assert_array_equal(np.asarray(y), np.full((4, 2), 15.0))
    want = jax.random.key(0)
    for _ in range(4):
        want, _ = jax.random.split(want)
    np.testing.assert_array_equal(jax.random.key_data(k.result()),
                                  jax.random.key_data(want))


def test_a_chained_calls_site_is_the_users_line_on_every_path(client):
    # A call's site (the timeline's label, `why`'s "issued at") is the
    # first line outside the package and the one that called it, whether
    # the call went the first call's way (Program._invoke) or plexus.jit's
    # fast path (_invoke_checked, which skips to the frame past
    # Jitted.__call__ without making its frame object).
    s = client.slice(1)
    prog = plexus.jit(lambda a: a + 1.0, s)

    def helper(x):
        return prog(x)

    x = s.put(np.zeros(3, np.float32))
    for _ in range(3):  # the first call, then the fast path twice
        x = helper(x)
    with client.graph():  # the fast path, recorded
        x = helper(x)
    np.testing.assert_array_equal(np.asarray(x), [4.0, 4.0, 4.0])
    sites = {(f.co_name, g.co_name if g else None)
             for _, f, g in client._sites.values()}
    me = "test_a_chained_calls_site_is_the_users_line_on_every_path"
    assert sites == {("helper", me)}, sites
