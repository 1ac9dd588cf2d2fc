"""Futures: a value that may not be computed yet, as a jax.Array that is
not ready; waiting for many at once (wait, block_until_ready); and moving
a numpy array onto a slice (_put), which makes one.

A future reaches its slice through its client (Client._wrap_slice): this
module sits below the client and slices of _api.py and imports nothing
above it.
"""
import sys

import numpy as np

from . import _core
from . import _jax_interop
from ._progress import (describe_transfer, describe_wait, transfer_progress,
                        waiting)
from ._progress import enabled as progress_enabled
from ._sharding import _sharding_repr


# Each signature seen, numbered: a future keeps its signature's number, so
# a call's cache key is a tuple of ints (a 100-leaf call hashed and compared
# 100 nested tuples per call). Bounded by the distinct shapes, dtypes,
# shardings, key impls and weak types a process uses.
_SIGNATURES = {}


def signature(future):
    """What a program compiled for `future` depends on, numbered: its core
    shape, dtype and sharding, its key impl and weak type (equal numbers,
    equal signatures). Kept on the future (a program's outputs get theirs
    from the program's first call's: plexus.jit's fast path reads no spec
    per call)."""
    sig = future._sig
    if sig is None:
        f = future._f
        sig = future._sig = numbered(
            (f.shape, f.dtype, f.sharding, future._key, future._weak))
    return sig


def numbered(full):
    """The number of signature `full` (a tuple: shape, dtype, sharding, key
    impl, weak type), the same for equal ones."""
    sig = _SIGNATURES.get(full)
    if sig is None:
        sig = _SIGNATURES.setdefault(full, len(_SIGNATURES))
    return sig


class Future:
    """A value that may not be computed yet, like a jax.Array that is not
    ready: .shape, .dtype, .sharding, block_until_ready(), np.asarray().
    JAX takes it where it takes an array (`jnp.sum(f)`, `jnp.asarray(f)`,
    `jax.device_get(f)`, `jax.random.split(key_future)`): it is fetched
    first. Python's operators and conversions work as on a jax.Array and
    block until the value is there: `float(f)`, `int(f)`, `bool(f)`,
    `f.item()`, `f.tolist()`, `list(f)` fetch it; `f + 1`, `f * g`, `-f`,
    `f[0]`, `f @ g`, `f < g` fetch the futures and compute on the client
    with jax.numpy, returning a jax.Array, as mixing a jax.Array with a
    host value does (numpy arrays where JAX is not installed); `len(f)`
    reads the shape. Like a jax.Array it is unhashable (`==` compares
    elements). To compute on the slice instead, call a program.
    Dropping the last reference frees its shards on the workers. A future
    belongs to its client's session with the server: once that ended (the
    server restarted, and the client reconnected), it raises
    ServerRestartedError naming the buffer and the server.

    A typed PRNG key output of plexus.jit is a future of its key data
    (uint32, with the impl's trailing dimension): .shape and .dtype are the
    key array's, result() is a key array again, np.asarray() the key data.
    A plexus.jit output that jax.jit would return weakly typed (computed
    from Python scalars only) is a weakly typed future (.weak_type), and
    stays weak where it goes into JAX.
    """

    __slots__ = ("_f", "_client", "_key", "_weak", "_sig", "__weakref__")
    __array_priority__ = 100  # numpy defers to its operators, as to jax's
    __hash__ = None  # `==` compares elements, as on a jax.Array

    def __init__(self, core_future, client, sig=None):
        self._f = core_future
        self._client = client
        self._key = None  # the PRNG impl name when it holds typed keys
        self._weak = False  # weakly typed, as JAX types Python scalars
        self._sig = sig  # signature(): set once known
        if not _jax_interop.hooked and "jax" in sys.modules:
            _jax_interop.hook(Future)

    @property
    def shape(self):
        if self._key is not None:
            shape = tuple(self._f.shape)
            return shape[:len(shape) - _jax_interop.key_data_ndim(self._key)]
        return self._f.shape

    @property
    def dtype(self):
        if self._key is not None:
            return _jax_interop.key_dtype(self._key)
        return self._f.dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def weak_type(self):
        return self._weak

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def sharding(self):
        if _jax_interop.hooked and sys._getframe(1).f_globals.get(
                "__name__", "").startswith("jax."):
            # JAX reads `.sharding` as a jax.sharding.Sharding; to JAX a
            # future is a host value like a numpy array, which has none.
            raise AttributeError("sharding")
        return _sharding_repr(self._f.sharding)

    @property
    def slice(self):
        return self._client._wrap_slice(self._f.slice)

    def block_until_ready(self):
        """Waits until every shard is ready (one round trip per worker);
        raises the error that failed it."""
        with waiting(self._client, describe_wait):
            self._client._core.wait_many([self._f])
        return self

    def _fetch(self):
        """The fetched array (key data for keys), with the wait's line on
        a terminal; a large one shows its bytes as they come."""
        f = self._f
        if not progress_enabled():
            # No line to draw, no bytes to count: the fetch alone (a
            # blocking round trip's fetch spent ~4 us sizing its value).
            return self._client._core.fetch(f)
        progress = transfer_progress(
            int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize)
        if progress is None:
            with waiting(self._client, describe_wait):
                return self._client._core.fetch(f)
        with waiting(self._client, describe_transfer(
                "fetch", _spec_text(f.dtype, f.shape), progress)):
            return self._client._core.fetch(f, progress)

    def result(self):
        """The value, fetched: a numpy array (a jax key array for keys)."""
        data = self._fetch()
        if self._key is not None:
            import jax
            return jax.random.wrap_key_data(data, impl=self._key)
        return data

    def __array__(self, dtype=None, copy=None):
        a = self._fetch()  # key data for keys
        return a if dtype is None else a.astype(dtype, copy=False)

    def __jax_array__(self):
        """The value as a jax.Array (fetched), for jax.numpy functions."""
        import jax.numpy as jnp
        return jnp.asarray(self._jax_value())

    def _jax_value(self):
        """What JAX computes with: the fetched array in JAX's canonical
        dtype, or the key array."""
        if self._key is not None:
            return self.result()
        import jax
        a = self._fetch()
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(a.dtype))
        return a if a.dtype == dtype else a.astype(dtype)

    def _operand(self):
        """What an operator computes with: the fetched value as a jax.Array
        (a key array for keys, weakly typed where the future is), or a
        numpy array where JAX is not installed."""
        jnp = _jax_interop.jax_numpy()
        if jnp is None:
            return np.asarray(self)
        if self._key is not None:
            return self.result()
        x = jnp.asarray(self._jax_value())
        return _jax_interop.weakly_typed(x) if self._weak else x

    # Conversions block and fetch, as on a jax.Array.
    def __bool__(self):
        return bool(self._operand())

    def __float__(self):
        return float(self._operand())

    def __int__(self):
        return int(self._operand())

    def __complex__(self):
        return complex(self._operand())

    def __index__(self):
        return self._operand().__index__()

    def __len__(self):
        shape = self.shape
        if not shape:
            raise TypeError("len() of unsized object")  # as jax.Array
        return shape[0]

    def __iter__(self):
        return iter(self._operand())

    def __format__(self, spec):
        return format(self._operand(), spec)

    def item(self, *args):
        return self._operand().item(*args)

    def tolist(self):
        return self._operand().tolist()

    def __getitem__(self, index):
        if isinstance(index, tuple):
            index = tuple(_operand(i) for i in index)
        return self._operand()[_operand(index)]

    def __repr__(self):
        return (f"Future(shape={self.shape}, dtype={self.dtype}, "
                f"sharding={self.sharding}, buffer={self._f.buffer_id})")


def _operand(x):
    return x._operand() if isinstance(x, Future) else x


def _future_operator(name):
    """Future.<name>: jax.Array's operator on the fetched values (a
    NotImplemented from it lets Python try the other operand's)."""
    def operator(self, *others):
        return getattr(self._operand(), name)(*map(_operand, others))
    operator.__name__ = name
    return operator


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "divmod",
              "pow", "matmul", "and", "or", "xor", "lshift", "rshift"):
    setattr(Future, f"__{_name}__", _future_operator(f"__{_name}__"))
    setattr(Future, f"__r{_name}__", _future_operator(f"__r{_name}__"))
for _name in ("neg", "pos", "abs", "invert", "round", "lt", "le", "eq",
              "ne", "gt", "ge"):
    setattr(Future, f"__{_name}__", _future_operator(f"__{_name}__"))
del _name


def _leaves(tree):
    """The futures among the leaves of a pytree (JAX's pytrees when JAX is
    loaded, else lists, tuples and dicts)."""
    if "jax" in sys.modules:
        import jax
        leaves = jax.tree_util.tree_leaves(tree)
    else:
        leaves, stack = [], [tree]
        while stack:
            x = stack.pop()
            if isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
            elif isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            else:
                leaves.append(x)
    return [x for x in leaves if isinstance(x, Future)]


def _spec_text(dtype, shape):
    """'float32[1024, 1024]', as a progress line names an array."""
    return f"{np.dtype(dtype).name}{list(shape)}"


def _put(client, core_slice, a, sharding):
    """Puts the numpy array `a` on `core_slice`; on a terminal, a
    large one shows its bytes as they go (python/plexus/_progress.py)."""
    progress = transfer_progress(a.nbytes)
    if progress is None:
        return client._core.put(core_slice, a, sharding)
    with waiting(client, describe_transfer(
            "put", _spec_text(a.dtype, a.shape), progress)):
        return client._core.put(core_slice, a, sharding, progress)


def wait(futures, timeout=None):
    """Waits until every future in `futures` (a pytree) is ready: one round
    trip per worker, however many futures and shards. With `timeout`
    (seconds) it raises DeadlineExceededError, saying how many were not
    ready, once that passes; a failed future raises its error. Returns
    `futures`."""
    by_client = {}
    for f in _leaves(futures):
        by_client.setdefault(id(f._client._core), (f._client, []))[1].append(
            f._f)
    if timeout is None:
        for client, fs in by_client.values():
            with waiting(client, describe_wait):
                client._core.wait_many(fs)
        return futures
    import time
    deadline = time.monotonic() + timeout
    for client, fs in by_client.values():
        try:
            with waiting(client, describe_wait):
                client._core.wait_many(
                    fs, max(0.0, deadline - time.monotonic()))
        except _core.DeadlineExceededError as e:
            raise _core.DeadlineExceededError(
                f"{e}{_why_suffix(client, fs)}") from None
    return futures


def _why_suffix(client, fs):
    """What the server says holds the futures `fs` (core futures of
    `client`), for the message of a wait that reached its deadline: the
    entries of client.why() that list one of their buffers among the
    outputs they hold (a call's, or a client's calls at admission), or
    that are a slice of theirs waiting for a host; empty if none, or if the
    server cannot be asked."""
    try:
        why = client.why()
    except Exception:  # noqa: BLE001 - the deadline error stands on its own
        return ""
    buffers = {f.buffer_id for f in fs}
    slices = {f.slice.id for f in fs}
    # Each cause once (calls queued behind one call share it), with the
    # longest wait on it; the longest first.
    by_cause = {}
    for e in why:
        if (buffers.intersection(e.get("output_ids", []))
                or (not e.get("call_id") and e.get("slice_id") in slices)):
            by_cause.setdefault(e.get("cause") or e["reason"], []).append(e)
    if not by_cause:
        return ""
    said = []
    for entries in list(by_cause.values())[:3]:
        n = len(entries) - 1
        said.append(entries[0]["reason"] +
                    (f" (and {n} more call(s) waiting on the same)"
                     if n else ""))
    more = (f" (and {len(by_cause) - 3} more: client.why())"
            if len(by_cause) > 3 else "")
    return f". The server says: {'; '.join(said)}{more}"


def block_until_ready(tree):
    """Waits until every future in the pytree is ready, as
    jax.block_until_ready does for arrays; returns the tree."""
    return wait(tree)
