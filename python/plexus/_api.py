"""The Python API: clients, slices, programs, futures and graphs."""
import contextlib
import sys
import threading

import numpy as np

from . import _core
from . import _trace
from ._progress import (describe_slice, describe_transfer, describe_wait,
                        transfer_progress, waiting)
from ._state import current_address, state_secret
from ._status import cluster_status

# ---------------------------------------------------------------- shardings


class P(tuple):
    """A PartitionSpec over a slice's mesh axes, as in jax.sharding
    (jax.sharding.PartitionSpec is taken too).

    One entry per array dimension (missing trailing ones: None): None (not
    split), a mesh axis name, or a tuple of names (the dimension is split
    over them, the first major). Mesh axes no entry names hold replicas.
    """

    def __new__(cls, *entries):
        return super().__new__(cls, entries)

    def __repr__(self):
        return "P(" + ", ".join(repr(e) for e in self) + ")"


def replicated():
    return ("replicated", 0)


def split(axis):
    return ("split", int(axis))


def partial():
    return ("partial", 0)


def _is_partition_spec(spec):
    t = type(spec)
    return isinstance(spec, P) or (
        t.__module__.split(".")[0] == "jax"
        and t.__name__ in ("PartitionSpec", "P"))


def _sharding(spec, slice_, ndim):
    """Normalises None / P(...) / jax PartitionSpec / ("split", a) to the
    core's tuple: ("replicated"|"split"|"partial", axis), or ("mesh", axis
    sizes, axis names, per dimension the indices of its axes) for a
    PartitionSpec that is neither a 1-D split nor replicated."""
    if spec is None:
        return replicated()
    if type(spec).__name__ == "NamedSharding":  # jax's: its spec
        spec = spec.spec
    if _is_partition_spec(spec):
        return _mesh_sharding(tuple(spec), tuple(slice_.axis_names),
                              tuple(slice_.mesh_shape), ndim)
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in (
            "replicated", "split", "partial"):
        return spec
    if isinstance(spec, tuple) and len(spec) == 4 and spec[0] == "mesh":
        return _core.canonical_sharding(spec)
    raise TypeError(f"not a sharding: {spec!r} (use None, plexus.P(...), "
                    "jax.sharding.PartitionSpec(...), plexus.split(axis) or "
                    "plexus.replicated())")


def _mesh_sharding(entries, axes, sizes, ndim):
    """The core sharding of PartitionSpec `entries` over the mesh `axes`
    (of `sizes`) for an array of `ndim` dimensions."""
    mesh = ", ".join(f"{a!r}: {n}" for a, n in zip(axes, sizes))
    spec = "P(" + ", ".join(repr(e) for e in entries) + ")"
    if len(entries) > ndim:
        raise ValueError(f"{spec} has {len(entries)} entries but the array "
                         f"has {ndim} dimensions")
    dims, used = [], set()
    for e in entries + (None,) * (ndim - len(entries)):
        names = () if e is None else (tuple(e) if isinstance(
            e, (tuple, list)) else (e,))
        idx = []
        for name in names:
            if name not in axes:
                raise ValueError(f"{spec} names {name!r}, which is not an "
                                 f"axis of the slice's mesh {{{mesh}}}")
            if name in used:
                raise ValueError(f"{spec} names mesh axis {name!r} twice")
            used.add(name)
            idx.append(axes.index(name))
        dims.append(tuple(idx))
    return _core.canonical_sharding(("mesh", sizes, axes, tuple(dims)))


def _sharding_repr(t):
    if t[0] == "mesh":
        return _core.sharding_str(t)
    kind, axis = t
    return f"split({axis})" if kind == "split" else kind


class Spec:
    """A static input of a program: shape, dtype and sharding."""

    def __init__(self, shape, dtype="float32", sharding=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding

    def __repr__(self):
        return f"Spec({self.shape}, {self.dtype}, {self.sharding!r})"


# ---------------------------------------------------------------- futures


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

    __slots__ = ("_f", "_client", "_key", "_weak", "__weakref__")
    __array_priority__ = 100  # numpy defers to its operators, as to jax's
    __hash__ = None  # `==` compares elements, as on a jax.Array

    def __init__(self, core_future, client):
        self._f = core_future
        self._client = client
        self._key = None  # the PRNG impl name when it holds typed keys
        self._weak = False  # weakly typed, as JAX types Python scalars
        if not _jax_hooked and "jax" in sys.modules:
            _hook_jax()

    @property
    def shape(self):
        if self._key is not None:
            return tuple(self._f.shape)[:len(self._f.shape)
                                        - _key_data_ndim(self._key)]
        return self._f.shape

    @property
    def dtype(self):
        if self._key is not None:
            return _key_dtype(self._key)
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
        if _jax_hooked and sys._getframe(1).f_globals.get(
                "__name__", "").startswith("jax."):
            # JAX reads `.sharding` as a jax.sharding.Sharding; to JAX a
            # future is a host value like a numpy array, which has none.
            raise AttributeError("sharding")
        return _sharding_repr(self._f.sharding)

    @property
    def slice(self):
        return Slice(self._f.slice, self._client)

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
        jnp = _jax_numpy()
        if jnp is None:
            return np.asarray(self)
        if self._key is not None:
            return self.result()
        x = jnp.asarray(self._jax_value())
        return _weakly_typed(x) if self._weak else x

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


_JNP = []  # [jax.numpy or None], once looked up


def _jax_numpy():
    if not _JNP:
        try:
            import jax.numpy as jnp
        except ImportError:
            jnp = None
        _JNP.append(jnp)
    return _JNP[0]


def _weakly_typed(x):
    """x (a jax.Array) weakly typed, as JAX types a Python scalar."""
    from jax._src.lax import lax
    return lax._convert_element_type(x, weak_type=True)


_jax_hooked = False


def _hook_jax():
    """Makes futures JAX values, fetched where JAX reads them (jnp
    functions, jax.jit, jax.device_put), as numpy arrays are.

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
    global _jax_hooked
    _jax_hooked = True
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
        core.pytype_aval_mappings[Future] = aval
        dtypes.canonicalize_value_handlers[Future] = Future._jax_value
        pxla.shard_arg_handlers[Future] = transfer
    except (AttributeError, TypeError):
        pass
    _hook_jax_random()


def _hook_jax_random():
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
            if isinstance(key, Future):
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


def _key_dtype(impl):
    return _key_info(impl)[0]


def _key_data_ndim(impl):
    return _key_info(impl)[1]


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
                f"{e}{_why_suffix(client)}") from None
    return futures


def _why_suffix(client):
    """What the server says this client's longest waits wait on (client.why),
    for the message of a wait that reached its deadline; empty if it says
    nothing or cannot be asked."""
    try:
        why = client.why()
    except Exception:  # noqa: BLE001 - the deadline error stands on its own
        return ""
    if not why:
        return ""
    shown = "; ".join(e["reason"] for e in why[:3])
    more = f" (and {len(why) - 3} more: client.why())" if len(why) > 3 else ""
    return f". The server says: {shown}{more}"


def block_until_ready(tree):
    """Waits until every future in the pytree is ready, as
    jax.block_until_ready does for arrays; returns the tree."""
    return wait(tree)


# ---------------------------------------------------------------- programs

_recording = threading.local()


class Program:
    """A program compiled for a slice; call it like a function."""

    def __init__(self, core_program, client):
        self._p = core_program
        self._client = client

    @property
    def name(self):
        return self._p.name

    @property
    def input_specs(self):
        return [(tuple(s), d, _sharding_repr(sh)) for d, s, sh in self._p.inputs]

    @property
    def output_specs(self):
        return [(tuple(s), d, _sharding_repr(sh)) for d, s, sh in self._p.outputs]

    def __call__(self, *args):
        inputs = self._p.inputs
        if len(args) != len(inputs):
            raise _core.InvalidArgumentError(
                f"program '{self.name}' takes {len(inputs)} arguments, "
                f"got {len(args)}")
        futures = []
        for i, (arg, (dtype, shape, sharding)) in enumerate(zip(args, inputs)):
            if isinstance(arg, Future):
                futures.append(arg._f)
                continue
            a = np.asarray(arg)
            if a.shape != tuple(shape) or a.dtype != dtype:
                raise _core.InvalidArgumentError(
                    f"program '{self.name}' argument {i} has "
                    f"{a.dtype}{list(a.shape)} but the program was compiled "
                    f"for {np.dtype(dtype)}{list(shape)}")
            futures.append(_put(self._client, self._p.slice, a, sharding))
        wrapped = self._invoke(futures)
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def _invoke(self, core_futures):
        """Calls (or records in the current graph) with checked inputs;
        returns the list of output Futures."""
        graph = getattr(_recording, "graph", None)
        site = _trace.call_site(self._client)
        if graph is not None and graph._client is self._client:
            outs = graph._g.call(self._p, core_futures, site)
            graph.calls += 1
        else:
            outs = self._client._core.call(self._p, core_futures, site)
        client = self._client
        return [Future(o, client) for o in outs]

    def __repr__(self):
        return f"Program({self.name!r}, kernel={self._p.kernel!r})"


class Graph:
    """Calls recorded and submitted as one unit.

        with client.graph():
            y = f(x)
            z = g(y)      # both reach the server in one batch, in order
    """

    def __init__(self, client):
        self._client = client
        self._g = client._core.graph()
        self.calls = 0  # calls recorded, including those already submitted

    def __enter__(self):
        if getattr(_recording, "graph", None) is not None:
            raise RuntimeError("graphs do not nest")
        _recording.graph = self
        return self

    def __exit__(self, exc_type, *exc):
        _recording.graph = None
        if exc_type is None:
            self._g.submit()
        return False

    def __len__(self):
        return len(self._g)


# ---------------------------------------------------------------- slices


class Slice:
    """A set of virtual devices with a mesh shape, like a jax Mesh."""

    def __init__(self, core_slice, client):
        self._s = core_slice
        self._client = client

    @property
    def id(self):
        """The server's id for the slice in the client's current session (a
        reconnect asks for the slice again, under a new id)."""
        return self._s.id

    @property
    def num_devices(self):
        return self._s.num_devices

    @property
    def num_hosts(self):
        return self._s.num_hosts

    @property
    def generation(self):
        """The version of the map from the slice's virtual devices to
        physical ones: 0 when granted, +1 each time the server remapped the
        slice onto a spare after losing one of its hosts (`devices` then
        names the spare). The slice, its programs and futures stay valid."""
        return self._s.generation

    epoch = generation  # the name the elastic issue uses for it

    @property
    def islands(self):
        """The islands (hosts) the slice spans, in shard order. The default
        placement keeps a slice inside one island where one can hold it."""
        return list(dict.fromkeys(d["host"] for d in self.devices))

    @property
    def devices(self):
        return self._s.describe()["devices"]

    @property
    def mesh_shape(self):
        return self._s.describe()["mesh_shape"]

    @property
    def axis_names(self):
        return self._s.describe()["axis_names"]

    @property
    def mesh(self):
        """{axis name: size}, in mesh order (the devices row-major)."""
        d = self._s.describe()
        return dict(zip(d["axis_names"], d["mesh_shape"]))

    @property
    def dcn_axes(self):
        """The mesh axes that cross islands (client.slice(dcn_axes=...));
        the others lie inside each island."""
        return self._client._dcn_axes.get(self._s.first_id, ())

    def put(self, array, sharding=None):
        """Copies a numpy array onto this slice's devices."""
        a = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
        return Future(_put(self._client, self._s, a,
                           _sharding(sharding, self, a.ndim)), self._client)

    def program(self, kernel, *inputs, name=None, **attrs):
        """Compiles the built-in program `kernel` (see plexus.builtins) for
        this slice; returns a Program to call with arrays or futures.

        `inputs` describe its arguments: specs (plexus.Spec(shape, dtype,
        sharding), jax.ShapeDtypeStruct: replicated), or example values
        (futures keep their sharding; arrays are replicated). Only their
        shape, dtype and sharding are read (a list or a scalar as numpy
        reads it). Output specs are inferred from the kernel; `attrs` are
        its attributes.
        """
        what = f"program '{name or kernel}'"
        args = []
        for i, x in enumerate(inputs):
            if isinstance(x, Future):
                args.append((x._f.dtype, x._f.shape, x._f.sharding))
                continue
            if isinstance(x, Spec):
                shape, dtype, sh = x.shape, x.dtype, x.sharding
            elif hasattr(x, "shape") and hasattr(x, "dtype"):
                # numpy and jax arrays, jax.ShapeDtypeStruct
                shape, dtype, sh = tuple(x.shape), x.dtype, None
            else:  # a scalar or a list, as numpy reads it
                a = np.asarray(x)
                shape, dtype, sh = a.shape, a.dtype, None
            try:
                dtype = np.dtype(dtype)
                args.append((dtype, tuple(int(d) for d in shape),
                             _sharding(sh, self, len(shape))))
            except (TypeError, ValueError) as e:
                raise _core.InvalidArgumentError(
                    f"{what} argument {i}: {e}") from e
        return Program(self._client._core.compile(
            self._s, name or kernel, kernel, attrs, args), self._client)

    def close(self):
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        islands = self.islands
        return (f"Slice(id={self.id}, devices={self.num_devices}, "
                f"mesh={dict(zip(self.axis_names, self.mesh_shape))}, "
                f"hosts={sorted(islands)}, {len(islands)} island"
                f"{'' if len(islands) == 1 else 's'})")


# ---------------------------------------------------------------- client


class Client:
    """The single controller's connection to a Plexus cluster."""

    def __init__(self, core_client, address=None):
        self._core = core_client
        self._address = address  # the server's, for why()
        self._dcn_axes = {}  # slice's first id -> its DCN axes
        self._sites = {}  # (code, line) -> call site id (_trace.call_site)

    @property
    def id(self):
        """The client id of the current session (a reconnect changes it)."""
        return self._core.client_id

    @property
    def state(self):
        """"open", "reconnecting" (the session ended; the client is opening
        a new one), "gave_up" (it could not within reconnect_timeout) or
        "closed"."""
        return self._core.state

    @property
    def session_ends(self):
        """The sessions with the server that ended under this client, oldest
        first: a dict each, with what was lost ("lost_futures": futures of
        the session alive when it ended, now raising ServerRestartedError),
        why ("reason"), and what the reconnect did ("reconnected",
        "new_client_id", "down_s", "attempts", "slices_restored",
        "slices_lost", "programs_restored", "programs_lost", "gave_up"),
        and a one-line "summary" (the warning the client logged)."""
        return self._core.session_ends()

    def slice(self, n=None, mesh=None, axis_names=None, placement="any",
              hosts=None, avoid=None, timeout=30.0, dcn_axes=()):
        """Asks the server for a slice of `n` virtual devices.

        mesh: the device mesh, as a dict {axis name: size} in order (like
        jax.make_mesh; `n` defaults to its size), or its shape with
        `axis_names` (default: (n,), ("devices",)). The virtual devices are
        the mesh's points in row-major order. dcn_axes: the mesh axes that
        cross islands (JAX's hybrid mesh, MaxText's dcn_* axes): each
        island (the slice's devices on one host) must hold exactly the
        devices of one point of those axes, so that the other axes lie
        inside an island; otherwise the slice is refused, saying so.
        placement: "any", "one_host" or "spread" (over hosts);
        hosts: only devices of these hosts (names as `plexus status` shows
        them; an island is the devices of one host); avoid: slices (or slice
        ids) of this client whose hosts it must not use.

        A request the cluster cannot meet now (too few live devices or hosts
        for the placement, or over the tenant's max_devices) waits at the
        server up to `timeout` seconds for capacity to appear, then fails
        with DEADLINE_EXCEEDED saying what it waited for; timeout=0 raises
        ResourceExhaustedError at once. A bad request (mesh, unknown host)
        raises at once. `plexus status` lists the requests that wait.
        """
        if isinstance(mesh, dict):
            if axis_names is not None:
                raise _core.InvalidArgumentError(
                    "slice: give the mesh as a dict or as a shape with "
                    "axis_names, not both")
            axis_names = list(mesh)
            mesh = [int(v) for v in mesh.values()]
        if n is None:
            if not mesh:
                raise _core.InvalidArgumentError(
                    "slice: give the number of devices or a mesh")
            n = int(np.prod(mesh))
        if isinstance(dcn_axes, str):
            dcn_axes = (dcn_axes,)
        dcn_axes = tuple(dcn_axes)
        if dcn_axes and placement == "any":
            # The default keeps a slice that fits inside one island; one
            # with DCN axes is meant to cross islands.
            placement = "spread"
        if isinstance(hosts, str):
            hosts = [hosts]
        if isinstance(avoid, Slice):
            avoid = [avoid]
        avoid_ids = [a.id if isinstance(a, Slice) else int(a) for a in (avoid or [])]
        with waiting(self, describe_slice):
            core_slice = self._core.slice(
                n, list(mesh or []), list(axis_names or []), placement,
                list(hosts or []), avoid_ids, float(timeout))
        s = Slice(core_slice, self)
        if dcn_axes:
            try:
                _check_dcn_axes(s, dcn_axes)
            except Exception:
                s.close()
                raise
            self._dcn_axes[s._s.first_id] = dcn_axes
        return s

    def graph(self):
        return Graph(self)

    def counters(self):
        return self._core.counters()

    def flush(self):
        self._core.flush()

    def why(self, after=1.0):
        """Why this client's work is stuck: each call routed more than
        `after` seconds ago (at least 1) and not done, the longest wait
        first, as a dict with `reason` (one sentence: the chain of calls it
        waits for and the root cause, naming the host), `blame_host`,
        `waited_ms`, `program`, `call_id` and `root_call_id`. The server
        follows its records (docs/ARCHITECTURE.md, "Why is it stuck");
        `plexus why` shows every client's."""
        if self._address is None:
            raise RuntimeError("this client does not know its server's "
                               "address")
        st = cluster_status(self._address)
        return [e for e in st.get("why", [])
                if int(e.get("client_id", 0)) == self.id
                and int(e.get("waited_ms", 0)) >= after * 1000]

    def snapshot(self, tree):
        """Asks for an in-memory copy of every future in the pytree on
        another host of its slice (for a slice on one host, on another host
        of the cluster), made peer to peer after the calls issued before
        it, never through the client or the server (a future that already
        has a complete snapshot keeps it). It counts once every shard's
        copy has arrived; from then on the future no longer holds the
        inputs it was computed from. Should a host be lost, the shards it
        held are restored from these copies (the server's recovery) rather
        than recomputed or lost. Asynchronous: returns at once. Futures
        replicated over more than one host need none (their other shards
        are copies); a cluster that never had a spare takes none (it
        cannot recover)."""
        self._core.snapshot([f._f for f in _leaves(tree)])
        return tree

    @contextlib.contextmanager
    def trace(self, path, timeout=10.0):
        """Writes a timeline of what this client's calls did on the whole
        cluster while the block ran to `path` (the operator's `plexus
        trace` shows every client's): a Chrome trace-event file that Perfetto
        (ui.perfetto.dev) and TensorBoard open, with one track per host and
        device, each call named by its program and the source line that
        issued it (and its graph, if any), flows from each transfer to the
        task that reads it, and this process's own track: the calls it
        issued and its puts, fetches and waits, on the server's clock
        (docs/ARCHITECTURE.md, "The timeline"). Collected as the block
        ends: wait for the results you want to see inside it. Returns (as
        the `with` target) a dict that holds the trace's summary once the
        block has ended."""
        if self._address is None:
            raise RuntimeError("this client does not know its server's "
                               "address")
        since = _trace.server_now(self._address)
        summary = {}
        try:
            yield summary
        finally:
            summary.update(_trace.write(self._address, path, since, timeout,
                                        client=self._core))

    def close(self):
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _check_dcn_axes(s, dcn_axes):
    """Raises unless each island of `s` holds exactly the devices of one
    point of the DCN axes."""
    axes, sizes = tuple(s.axis_names), tuple(s.mesh_shape)
    mesh = ", ".join(f"{a!r}: {n}" for a, n in zip(axes, sizes))
    for a in dcn_axes:
        if a not in axes:
            raise _core.InvalidArgumentError(
                f"slice: dcn_axes names {a!r}, which is not an axis of the "
                f"mesh {{{mesh}}}")
    coords = np.indices(sizes).reshape(len(sizes), -1).T  # row-major
    idx = [axes.index(a) for a in dcn_axes]
    islands = {}  # DCN point -> workers holding its devices
    workers = {}  # worker -> DCN points it holds
    for c, d in zip(coords, s.devices):
        point = tuple(int(c[i]) for i in idx)
        islands.setdefault(point, set()).add(d["worker"])
        workers.setdefault(d["worker"], set()).add(point)
    if (any(len(w) > 1 for w in islands.values())
            or any(len(p) > 1 for p in workers.values())):
        layout = "; ".join(f"{d['host']} holds devices " + ", ".join(
            str(i) for i, e in enumerate(s.devices) if e["worker"] == w)
            for w, d in {d["worker"]: d for d in s.devices}.items())
        inner = int(np.prod([n for a, n in zip(axes, sizes)
                             if a not in dcn_axes]))
        raise _core.InvalidArgumentError(
            f"slice: dcn_axes {dcn_axes} of the mesh {{{mesh}}} need each "
            f"island (host) to hold the {inner} devices of one point of "
            f"those axes, but {layout} (virtual devices are row-major over "
            "the mesh: put the DCN axes first, and ask for hosts with that "
            "many devices, e.g. placement='spread')")


def connect(address=None, name="python", shared_memory=True,
            sequential_dispatch=False, tenant=None, token=None, tls_ca=None,
            reconnect_timeout=None):
    """Connects to a Plexus server (default: $PLEXUS_ADDRESS, or the cluster
    started by `plexus up`).

    The client outlives a restart of its server. When its session ends
    without close() (the server restarted, or the connection broke), it
    opens a new one at the same address, with back-off, for up to
    `reconnect_timeout` seconds (default 60; 0: never; the cluster `plexus
    up` started, whose workers end with its server: 0). Its slices and
    programs are asked for and registered again there and keep working;
    futures of the old session raise ServerRestartedError (a kind of
    DeviceLostError) naming the server and the buffer; `client.session_ends`
    records what each ended session lost. Calls, puts and slice requests
    made while it reconnects wait for it (at most reconnect_timeout; a
    slice request at most its timeout), then raise UnavailableError naming
    the server and how long they waited.

    The session opens as a tenant, whose share and quotas the operator set:
    `tenant` and `token` (what `plexus token --tenant NAME` prints), else
    $PLEXUS_TENANT and $PLEXUS_TENANT_TOKEN. A process that holds the
    cluster secret ($PLEXUS_CLUSTER_SECRET, or the cluster `plexus up`
    started) derives the token itself. Without either the session is
    anonymous, which only a server on loopback admits (as tenant
    "default"). `tls_ca`: the CA file that the server's TLS certificate is
    checked against (else $PLEXUS_TLS_CA; neither: plain text).
    """
    secret = None
    if address is None:
        address = current_address()
        secret = state_secret(address)
    if reconnect_timeout is None:
        # `plexus up`'s cluster (its state holds the secret) is embedded:
        # its workers end with its server.
        reconnect_timeout = 0.0 if secret is not None else 60.0
    return Client(_core.Client.connect(
        address, name, shared_memory, sequential_dispatch,
        tenant=tenant or "", tenant_token=token or "", secret_hex=secret,
        tls_ca=tls_ca or "", reconnect_timeout=float(reconnect_timeout)),
        address)


def status(address=None):
    """The server's view of the cluster, as a dict."""
    if address is None:
        address = current_address()
    return cluster_status(address)
