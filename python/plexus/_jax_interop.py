"""How JAX sees a Plexus future: the per-type tables through which JAX
takes numpy arrays (so jnp functions, jax.jit and jax.device_put fetch a
future as they read a numpy array), the hook that lets jax.random take a
key future, and what typed PRNG keys look like as key data.

Everything here is JAX internals, looked up only once JAX is imported and
a future is made; where a JAX release lacks a table, nothing fails. The
future's class is passed in (hook(Future)): this module imports nothing
from the package.
"""
import numpy as np


_JNP = []  # [jax.numpy or None], once looked up


def jax_numpy():
    """jax.numpy, or None where JAX is not installed."""
    if not _JNP:
        try:
            import jax.numpy as jnp
        except ImportError:
            jnp = None
        _JNP.append(jnp)
    return _JNP[0]


def weakly_typed(x):
    """x (a jax.Array) weakly typed, as JAX types a Python scalar."""
    from jax._src.lax import lax
    return lax._convert_element_type(x, weak_type=True)


hooked = False  # hook() ran (whether or not this JAX has its tables)


def hook(future_type):
    """Makes futures (`future_type`: _future.Future) JAX values, fetched
    where JAX reads them (jnp functions, jax.jit, jax.device_put), as numpy
    arrays are.

    jax.numpy functions are themselves jitted, and since JAX 0.6 the jit
    boundary no longer reads `__jax_array__` (JEP 28661: it wants a pytree,
    but a future must stay a leaf of the pytrees Plexus and its users
    map over). So futures join the per-type tables through which JAX takes
    numpy arrays: an abstract value (shape, dtype, no fetch) and a
    transfer rule that fetches; and `.sharding`, which JAX reads as a
    jax.sharding.Sharding, is absent to JAX's own modules (Plexus's
    "split(0)" names are not JAX shardings until futures carry a mesh).
    These tables are JAX internals: where a
    JAX release lacks one, only jnp.asarray(future) (`__jax_array__`) and
    np.asarray(future) work, and nothing fails at import.
    """
    global hooked
    hooked = True
    try:
        from jax._src import core, dtypes
        from jax._src.interpreters import pxla
    except ImportError:
        return

    def aval(f):
        if f._key is not None:
            return core.typeof(f.result())
        return core.ShapedArray(tuple(f.shape),
                                dtypes.canonicalize_dtype(np.dtype(f.dtype)),
                                weak_type=f._weak)

    def transfer(xs, shardings, layouts, copy_semantics):
        return pxla.shard_args(shardings, layouts, copy_semantics,
                               [x._jax_value() for x in xs])

    try:
        core.pytype_aval_mappings[future_type] = aval
        dtypes.canonicalize_value_handlers[future_type] = (
            future_type._jax_value)
        pxla.shard_arg_handlers[future_type] = transfer
    except (AttributeError, TypeError):
        pass
    _hook_jax_random(future_type)


def _hook_jax_random(future_type):
    """Makes jax.random take a key future as it takes a key array.

    jax.random functions take a typed key only if it is a jax.Array (a
    future, a host value to JAX, would be read as raw uint32 key data), so
    the one function through which they all read their key argument,
    `_check_prng_key`, is given the fetched key array (or raw key data)
    first. A JAX without that function gets no hook: call
    jax.random.split(f.result()) there.
    """
    import importlib
    for module in ("jax._src.random.core", "jax._src.random"):
        try:
            random = importlib.import_module(module)
        except ImportError:
            continue
        check = getattr(random, "_check_prng_key", None)
        if check is None:
            continue
        if getattr(check, "_takes_futures", False):
            return

        def check_prng_key(name, key, *args, **kwargs):
            if isinstance(key, future_type):
                key = key._operand()
            return check(name, key, *args, **kwargs)

        check_prng_key._takes_futures = True
        random._check_prng_key = check_prng_key
        return


_KEY_INFO = {}  # impl name -> (key dtype, key data's trailing ndim)


def _key_info(impl):
    info = _KEY_INFO.get(impl)
    if info is None:
        import jax
        key = jax.eval_shape(lambda: jax.random.key(0, impl=impl))
        data = jax.eval_shape(jax.random.key_data, key)
        info = _KEY_INFO[impl] = (key.dtype, len(data.shape))
    return info


def key_dtype(impl):
    """The dtype of a typed PRNG key array of `impl`."""
    return _key_info(impl)[0]


def key_data_ndim(impl):
    """The trailing dimensions the key data of `impl` adds to the keys'."""
    return _key_info(impl)[1]
